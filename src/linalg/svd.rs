//! Exact, deterministic thin SVD of a base weight and the LoRA-XS bases `U`, `V` built from
//! it (spec `sa3_lora.md` §1.5).
//!
//! Owns: [`xs_bases`] (full thin SVD → sign canonicalisation → truncation to rank r),
//! [`XsBases`], [`LinalgError`]. Does not own: the sign convention itself
//! ([`super::signs`]) or caching ([`super::cache`]).
//!
//! # Why a full SVD, and why f64
//! LoRA-XS stores only the r×r core `M`; `ΔW = U·M·Vᵀ` is meaningful only in the *individual*
//! singular-vector basis the trainer used. Randomized or truncated SVDs rotate the vectors
//! inside the top-r subspace and give a 67–142 % wrong ΔW (`anchors.md` §4.5), so only a full
//! thin SVD (faer's bidiagonalisation + divide and conquer) is used here.
//!
//! The reference (SA3) runs `torch.linalg.svd` on the f32 weight on the CPU. Its answer is the
//! exact SVD of that f32 matrix plus LAPACK's own f32 round-off (roughly `ε₃₂·‖W‖/gapᵢ` per
//! vector), which nobody else can reproduce. The best reproducible estimate of the reference
//! is therefore the exact SVD of the same f32 matrix: the SVD is computed in f64 from the f32
//! values (widening is exact) and the vectors are rounded once to f32 at the end.
//! Measured on power-law spectra σᵢ = i^-½ at 1536², 1536×8960 and 5120² (BENCHMARKS.md,
//! "SVD (linalg)"), for the top 64 and 256 vectors:
//! - against the exact vectors (torch f64): f64 max |ΔU|, |ΔV| ≤ 3.7e-9 (the final f32
//!   rounding), faer f32 2.1e-5 … 9.7e-5;
//! - against torch's f32 answer (the reference), relative error of ΔW = U·M·Vᵀ for a random
//!   core M: f64 1.3e-5 … 5.5e-5, exactly the distance of the exact answer itself, while
//!   faer f32 is 1.5e-4 … 2.9e-4, 2.8–13× farther (its own round-off adds to torch's);
//! - cost: f64 takes 1.6–2.0× the CPU time of faer f32 (5120²: 116 vs 60 CPU-s;
//!   13824×5120: 195 vs 99 CPU-s on the 2-core development machine) and about 0.8× the wall
//!   time of torch's own f64 SVD; a one-off per base weight that the cache (`super::cache`)
//!   removes.
//!
//! # Determinism
//! faer's SVD does NOT give the same bits for different `Par` values: measured, `Par::Seq`,
//! `Par::rayon(2)`, `Par::rayon(3)`, `Par::rayon(4)` and `Par::rayon(7)` each give their own
//! bits once the matrix is large enough to cross faer's parallel thresholds (|ΔS| ~ 5e-15,
//! f32-rounded vectors differ by one ulp here and there). One cause is faer's matrix-vector
//! kernel, which splits the k reduction into one partial sum per partition. The bits do
//! depend only on the partition *degree* n of `Par::Rayon(n)`, never on how many threads
//! actually run the partitions (measured: `Par::rayon(2)` inside rayon pools of 1, 2 and 4
//! threads gives identical bits, run after run).
//!
//! So the SVD always runs with the fixed degree [`SVD_PARTITION_DEGREE`], and the caller's
//! `par` only chooses how many threads execute those partitions (`Par::Seq` → a private
//! one-thread pool). On the 2-core development machine degree 16 was no slower than
//! degree 2 at 1536² (BENCHMARKS.md). The degree is part of
//! the engine's id that keys a cached basis ([`super::engine::SvdEngine`]).
//! Bits may still differ between CPUs with different SIMD widths (faer's vectorised
//! reductions sum in lane order, AVX2 vs AVX-512); a cached basis (`super::cache`) is the
//! portable artefact.

#![allow(non_snake_case)]

use faer::dyn_stack::{MemBuffer, MemStack};
use faer::linalg::svd::{ComputeSvdVectors, SvdError, svd, svd_scratch};
use faer::{Col, Mat, MatRef, Par};

use super::signs::canonicalize_signs_mat;

/// The partition degree of every parallel step of the SVD: faer runs with
/// `Par::Rayon(SVD_PARTITION_DEGREE)` whatever the caller's `Par`, so the bits never depend
/// on the machine's thread count (see the module doc). Changing it changes the bits.
pub const SVD_PARTITION_DEGREE: usize = 16;

/// Why SVD bases could not be computed. The caller adds the file and tensor name.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LinalgError {
    /// `r > min(out, in')`: there are not that many singular vectors.
    #[error(
        "LoRA-XS rank {rank} exceeds the base weight's smaller dimension min(out = {out}, in = {inp}) = {}",
        (*out).min(*inp)
    )]
    RankTooLarge {
        /// Requested rank.
        rank: usize,
        /// Rows of the base weight.
        out: usize,
        /// Columns of the base weight (in' = in·k for Conv1d).
        inp: usize,
    },
    /// `r == 0`.
    #[error("LoRA-XS rank must be at least 1 (base weight is ({out}, {inp}))")]
    RankZero {
        /// Rows of the base weight.
        out: usize,
        /// Columns of the base weight.
        inp: usize,
    },
    /// The base weight holds NaN or ±inf, so its SVD is undefined.
    #[error(
        "base weight ({out}, {inp}) holds the non-finite value {value} at row {row}, column {col}; its SVD is undefined"
    )]
    NonFinite {
        /// Rows of the base weight.
        out: usize,
        /// Columns of the base weight.
        inp: usize,
        /// Row of the first non-finite entry.
        row: usize,
        /// Column of the first non-finite entry.
        col: usize,
        /// The value.
        value: f32,
    },
    /// faer's iteration limit was reached (not observed on finite input).
    #[error("the SVD of the ({out}, {inp}) base weight did not converge")]
    NoConvergence {
        /// Rows of the base weight.
        out: usize,
        /// Columns of the base weight.
        inp: usize,
    },
}

/// The LoRA-XS bases of one base weight: the top-`rank` canonical singular vectors.
#[derive(Clone, Debug, PartialEq)]
pub struct XsBases {
    /// Rows of the base weight.
    pub out: usize,
    /// Columns of the base weight (in' = in·k for a Conv1d weight viewed as 2-D).
    pub inp: usize,
    /// The rank r.
    pub rank: usize,
    /// Left singular vectors, (out, r) row-major, f32 (rounded once from f64).
    pub U: Vec<f32>,
    /// Right singular vectors, (in', r) row-major, f32 (this is `Vh[:r, :]ᵀ`).
    pub V: Vec<f32>,
    /// All `min(out, in')` singular values in descending order, f64 (diagnostics only: SA3
    /// discards S).
    pub singular_values: Vec<f64>,
}

impl XsBases {
    /// The relative gap `(σ_r − σ_{r+1}) / σ_1` at the truncation point, or `None` when
    /// `r = min(out, in')` or `σ_1 = 0`. A tiny gap means the r-th vector is ill-determined
    /// and any implementation (including the trainer's) may have returned a different one.
    pub fn truncation_gap(&self) -> Option<f64> {
        let s = &self.singular_values;
        let last = s.get(self.rank.checked_sub(1)?)?;
        let (first, next) = (s.first()?, s.get(self.rank)?);
        (*first > 0.0).then(|| (last - next) / first)
    }
}

/// Computes the LoRA-XS bases of the base weight `W` ((out, in') row-major f32): full thin
/// SVD in f64, SA3's sign canonicalisation, truncation to `r` columns, one rounding to f32.
///
/// `par` only says how many threads may run the SVD's fixed [`SVD_PARTITION_DEGREE`]
/// partitions (`Par::Seq`: one); it changes speed, never the bits (see the module doc).
///
/// # Panics
/// If `W.len() != out·inp` (a programmer error: the caller derives the shape from `W`).
#[track_caller]
pub fn xs_bases(
    W: &[f32],
    out: usize,
    inp: usize,
    r: usize,
    par: Par,
) -> Result<XsBases, LinalgError> {
    assert_eq!(
        W.len(),
        out * inp,
        "W has {} elements, expected out·in = {out}·{inp}",
        W.len()
    );
    check_rank(r, out, inp)?;
    check_finite(W, out, inp)?;
    let degree = Par::rayon(SVD_PARTITION_DEGREE);
    let ThinSvd { U, S, V } =
        with_threads(par.degree(), || canonical_thin_svd(W, out, inp, degree))?;
    Ok(XsBases {
        out,
        inp,
        rank: r,
        U: leading_columns_f32(&U, r),
        V: leading_columns_f32(&V, r),
        singular_values: S.iter().copied().collect(),
    })
}

/// `1 ≤ r ≤ min(out, inp)`.
pub(crate) fn check_rank(r: usize, out: usize, inp: usize) -> Result<(), LinalgError> {
    if r == 0 {
        return Err(LinalgError::RankZero { out, inp });
    }
    if r > out.min(inp) {
        return Err(LinalgError::RankTooLarge { rank: r, out, inp });
    }
    Ok(())
}

fn check_finite(W: &[f32], out: usize, inp: usize) -> Result<(), LinalgError> {
    match W.iter().position(|x| !x.is_finite()) {
        None => Ok(()),
        Some(i) => Err(LinalgError::NonFinite {
            out,
            inp,
            row: i / inp,
            col: i % inp,
            value: W[i],
        }),
    }
}

/// Runs `f` on `threads` rayon threads: in the current pool when it has that many, else in
/// a private pool. If no pool can be built, `f` runs in the current pool; only the speed
/// changes, because the partitioning is fixed by the caller's `Par::Rayon(degree)`.
fn with_threads<R: Send>(threads: usize, f: impl FnOnce() -> R + Send) -> R {
    if threads == rayon::current_num_threads() {
        return f();
    }
    match rayon::ThreadPoolBuilder::new()
        .num_threads(threads.max(1))
        .build()
    {
        Ok(pool) => pool.install(f),
        Err(_) => f(),
    }
}

/// Thin SVD of `W` in f64 with canonical signs: `U` (out, k), `S` (k), `V` (inp, k),
/// column-major faer matrices, k = min(out, inp).
fn canonical_thin_svd(W: &[f32], out: usize, inp: usize, par: Par) -> Result<ThinSvd, LinalgError> {
    let A = Mat::<f64>::from_fn(out, inp, |i, j| f64::from(W[i * inp + j]));
    let mut t = thin_svd(A.as_ref(), par)?;
    canonicalize_signs_mat(t.U.as_mut(), t.V.as_mut().transpose_mut());
    Ok(t)
}

/// faer's thin SVD of `A` (m, n) in f64: `U` (m, k), `S` (k, descending), `V` (n, k),
/// k = min(m, n), signs as faer returns them. The one call of faer's SVD in the crate.
pub(crate) fn thin_svd(A: MatRef<'_, f64>, par: Par) -> Result<ThinSvd, LinalgError> {
    let (m, n) = (A.nrows(), A.ncols());
    let k = m.min(n);
    let mut S = Col::<f64>::zeros(k);
    let mut U = Mat::<f64>::zeros(m, k);
    let mut V = Mat::<f64>::zeros(n, k);
    let params = Default::default();
    let thin = ComputeSvdVectors::Thin;
    let mut mem = MemBuffer::new(svd_scratch::<f64>(m, n, thin, thin, par, params));
    svd(
        A,
        S.as_diagonal_mut(),
        Some(U.as_mut()),
        Some(V.as_mut()),
        par,
        MemStack::new(&mut mem),
        params,
    )
    .map_err(|SvdError::NoConvergence| LinalgError::NoConvergence { out: m, inp: n })?;
    Ok(ThinSvd { U, S, V })
}

/// A thin SVD in f64 (column-major faer matrices).
pub(crate) struct ThinSvd {
    /// (m, k).
    pub(crate) U: Mat<f64>,
    /// (k), descending.
    pub(crate) S: Col<f64>,
    /// (n, k).
    pub(crate) V: Mat<f64>,
}

/// The first `r` columns of a column-major f64 matrix as a row-major f32 array.
fn leading_columns_f32(M: &Mat<f64>, r: usize) -> Vec<f32> {
    let mut dst = Vec::with_capacity(M.nrows() * r);
    for i in 0..M.nrows() {
        dst.extend((0..r).map(|j| M[(i, j)] as f32));
    }
    dst
}
