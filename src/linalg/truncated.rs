//! The leading singular triplets of a matrix, exactly or by a randomized range finder, for
//! extraction and rank reduction (issue 15).
//!
//! Owns: [`top_singular`] with its two methods ([`TruncMethod`]): the exact thin SVD (faer,
//! f64, the reference), and a randomized block range finder (Halko–Martinsson–Tropp
//! algorithm 4.4: a seeded test matrix with oversampling, power iterations re-orthonormalised
//! by Householder QR after every product, then the exact SVD of the small projected matrix).
//! Also [`factored_top_singular`], the exact SVD of a product `B·A` given as its factors.
//! Does not own: how many triplets to keep (`extract::rank`), the LoRA-XS bases (`svd`), which
//! need the full SVD and its sign convention for a different reason.
//!
//! # Where the big steps run
//! Both methods are written once ([`top_singular_on`]) against a [`TruncEngine`]: the holder
//! of the (m, n) matrix, which computes its two products `A·X` and `Aᵀ·Y` and its full thin
//! SVD. [`FaerEngine`] does that with faer on the calling thread ([`top_singular`]); the CUDA
//! engine (`gpu::CudaEngine`) with cuBLAS `dgemm` and cuSOLVER `gesvd`. Everything else,
//! the test matrix, the QRs, the SVD of the projection and the signs, runs here, on the host,
//! for every engine, so two engines differ only by the round-off of those three operations.
//!
//! # Why a randomized method is allowed here
//! `svd`'s module doc forbids truncated SVDs for the -xs kinds: there the individual vectors
//! matter. Extraction keeps the *product* `U_r·Σ_r·V_rᵀ`, the best rank-r approximation, which
//! depends on the retained subspace only; the range finder recovers that subspace to working
//! precision when the spectrum decays past the oversampled rank, and the tests hold it to the
//! exact SVD (subspace, σ and energies to 1e-6 relative on planted spectra, tests/extract.rs
//! and the unit tests below). Signs are canonicalised ([`super::signs`]) on both routes, so
//! a non-degenerate spectrum gives the same factors either way.
//!
//! # Determinism
//! Every step runs `Par::Seq` (callers parallelise across matrices), the test matrix comes
//! from a fixed SplitMix64 seed, so the bits depend on the input only.

#![allow(non_snake_case)]

use faer::dyn_stack::{MemBuffer, MemStack};
use faer::linalg::householder::{
    apply_block_householder_sequence_on_the_left_in_place_scratch,
    apply_block_householder_sequence_on_the_left_in_place_with_conj,
};
use faer::linalg::matmul::matmul;
use faer::linalg::qr::no_pivoting::factor::{
    qr_in_place, qr_in_place_scratch, recommended_block_size,
};
use faer::{Accum, Conj, Mat, MatRef, Par};

use super::signs::canonicalize_signs_mat;
use super::svd::{LinalgError, thin_svd};
use crate::rng::SplitMix64;

/// How to compute the leading singular triplets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TruncMethod {
    /// The full thin SVD, then truncation (cost O(m·n·min(m, n))).
    Exact,
    /// Randomized range finder: max(`oversample`, k) extra columns, `power_iters` power
    /// iterations.
    Randomized {
        /// Extra test vectors beyond the requested rank.
        oversample: usize,
        /// Power iterations (each multiplies by A·Aᵀ once).
        power_iters: usize,
    },
}

impl TruncMethod {
    /// The randomized defaults: max(16, k) extra vectors and 10 power iterations. Measured on
    /// a 1536² ΔW with σ_i ∝ 1/i at rank 64 (BENCHMARKS.md, Extract), where the cut falls
    /// between σ_64 and σ_65 (1.5 % apart): 4 iterations with k/2 extra vectors missed the
    /// exact energy by 2.9e-7; 6 with k extra vectors matched it to 6e-12 but left the rank-64
    /// product 3.2e-6 from the exact truncation (the k-th vector converges as
    /// (σ_{l+1}/σ_k)^(2q+1)); 10 iterations bring that factor below 1e-6 for any spectrum
    /// decaying at least as 1/i, at a quarter of the exact SVD's cost there.
    pub const RANDOMIZED: TruncMethod = TruncMethod::Randomized {
        oversample: 16,
        power_iters: 10,
    };

    /// The methods `extract --svd` offers: the randomized defaults (the default) and exact.
    pub const ALL: [TruncMethod; 2] = [TruncMethod::RANDOMIZED, TruncMethod::Exact];

    /// The name of the method (its parameters are not part of it), as `--svd` and the
    /// extract report spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            TruncMethod::Exact => "exact",
            TruncMethod::Randomized { .. } => "randomized",
        }
    }
}

crate::names::value_enum!(TruncMethod);

/// The leading `k` singular triplets of an (m, n) matrix: `U` (m, k), `S` (k, descending),
/// `V` (n, k), column-major, with SA3's sign convention; `complete` when `S` holds every
/// singular value (then `S.len() == min(m, n)`).
#[derive(Clone, Debug)]
pub struct TopSingular {
    /// Left singular vectors.
    pub U: Mat<f64>,
    /// Singular values, descending.
    pub S: Vec<f64>,
    /// Right singular vectors.
    pub V: Mat<f64>,
    /// `S` holds all `min(m, n)` values.
    pub complete: bool,
}

/// The leading `k ≤ min(m, n)` singular triplets of `A` (f64), by `method`. A randomized
/// request whose sketch would cover half the smaller dimension runs the exact SVD instead
/// (it is then both cheaper and exact).
///
/// # Panics
/// If `k > min(m, n)` (a programmer error).
#[track_caller]
pub fn top_singular(
    A: MatRef<'_, f64>,
    k: usize,
    method: TruncMethod,
) -> Result<TopSingular, LinalgError> {
    top_singular_on(&mut FaerEngine(A), k, method)
}

/// The holder of one (m, n) f64 matrix `A` for [`top_singular_on`]: where its products and
/// its full SVD run (see the module doc).
pub trait TruncEngine {
    /// The engine's error; it carries the SVD's own ([`LinalgError`]).
    type Error: From<LinalgError>;

    /// `(m, n)`.
    fn dims(&self) -> (usize, usize);

    /// `A·X` for `X` (n, l): (m, l).
    fn times(&mut self, X: MatRef<'_, f64>) -> Result<Mat<f64>, Self::Error>;

    /// `Aᵀ·Y` for `Y` (m, l): (n, l).
    fn times_transposed(&mut self, Y: MatRef<'_, f64>) -> Result<Mat<f64>, Self::Error>;

    /// The leading `k` triplets of the full thin SVD of `A` in any sign convention
    /// ([`top_singular_on`] canonicalises them).
    fn full_svd(&mut self, k: usize) -> Result<TopSingular, Self::Error>;
}

/// A matrix in host memory: faer, `Par::Seq`, on the calling thread.
#[derive(Clone, Copy, Debug)]
pub struct FaerEngine<'a>(pub MatRef<'a, f64>);

impl TruncEngine for FaerEngine<'_> {
    type Error = LinalgError;

    fn dims(&self) -> (usize, usize) {
        (self.0.nrows(), self.0.ncols())
    }

    fn times(&mut self, X: MatRef<'_, f64>) -> Result<Mat<f64>, LinalgError> {
        Ok(product(self.0, X))
    }

    fn times_transposed(&mut self, Y: MatRef<'_, f64>) -> Result<Mat<f64>, LinalgError> {
        Ok(product(self.0.transpose(), Y))
    }

    fn full_svd(&mut self, k: usize) -> Result<TopSingular, LinalgError> {
        exact(self.0, k)
    }
}

/// [`top_singular`] of the matrix `engine` holds, its products and full SVD run by the
/// engine.
///
/// # Panics
/// If `k > min(m, n)` (a programmer error).
#[track_caller]
pub fn top_singular_on<E: TruncEngine>(
    engine: &mut E,
    k: usize,
    method: TruncMethod,
) -> Result<TopSingular, E::Error> {
    let (m, n) = engine.dims();
    let small = m.min(n);
    assert!(k <= small, "k = {k} > min({m}, {n})");
    let sketch = match method {
        TruncMethod::Exact => None,
        TruncMethod::Randomized {
            oversample,
            power_iters,
        } => {
            let l = k + oversample.max(k);
            (2 * l < small).then_some((l, power_iters))
        }
    };
    let mut out = match sketch {
        None => engine.full_svd(k)?,
        Some((l, q)) => randomized(engine, k, l, q)?,
    };
    canonicalize_signs_mat(out.U.as_mut(), out.V.as_mut().transpose_mut());
    Ok(out)
}

/// The exact SVD of the product `B·A` ((m, r)·(r, n), f64) from its factors: thin QR of `B`
/// and `Aᵀ`, the SVD of the r×r core `R_B·R_Aᵀ`, and the vectors mapped back. `S` holds the
/// r singular values of the product, the others are zero, so the result counts as
/// `complete` (every non-zero value present).
pub fn factored_top_singular(
    B: MatRef<'_, f64>,
    A: MatRef<'_, f64>,
) -> Result<TopSingular, LinalgError> {
    let (m, r, n) = (B.nrows(), B.ncols(), A.ncols());
    assert_eq!(A.nrows(), r, "B·A: shapes do not chain");
    if r > m.min(n) {
        // More factor columns than the product has room for: the product is small.
        let mut P = Mat::<f64>::zeros(m, n);
        matmul(P.as_mut(), Accum::Replace, B, A, 1.0, Par::Seq);
        let k = m.min(n);
        return top_singular(P.as_ref(), k, TruncMethod::Exact);
    }
    let (Qb, Rb) = thin_qr(B.to_owned());
    let (Qa, Ra) = thin_qr(A.transpose().to_owned());
    let mut C = Mat::<f64>::zeros(r, r);
    matmul(
        C.as_mut(),
        Accum::Replace,
        Rb.as_ref(),
        Ra.as_ref().transpose(),
        1.0,
        Par::Seq,
    );
    let core = exact(C.as_ref(), r)?;
    let mut U = Mat::<f64>::zeros(m, r);
    matmul(
        U.as_mut(),
        Accum::Replace,
        Qb.as_ref(),
        core.U.as_ref(),
        1.0,
        Par::Seq,
    );
    let mut V = Mat::<f64>::zeros(n, r);
    matmul(
        V.as_mut(),
        Accum::Replace,
        Qa.as_ref(),
        core.V.as_ref(),
        1.0,
        Par::Seq,
    );
    canonicalize_signs_mat(U.as_mut(), V.as_mut().transpose_mut());
    Ok(TopSingular {
        U,
        S: core.S,
        V,
        complete: true,
    })
}

/// Full thin SVD, truncated to `k`.
fn exact(A: MatRef<'_, f64>, k: usize) -> Result<TopSingular, LinalgError> {
    let small = A.nrows().min(A.ncols());
    let t = thin_svd(A, Par::Seq)?;
    Ok(TopSingular {
        U: t.U.get(.., ..k).to_owned(),
        S: t.S.iter().take(k).copied().collect(),
        V: t.V.get(.., ..k).to_owned(),
        complete: k == small,
    })
}

/// Randomized range finder with `l` test vectors and `q` power iterations, then the exact SVD
/// of the projection `Qᵀ·A`, truncated to `k`.
fn randomized<E: TruncEngine>(
    A: &mut E,
    k: usize,
    l: usize,
    q: usize,
) -> Result<TopSingular, E::Error> {
    let (m, n) = A.dims();
    let omega = test_matrix(n, l);
    let mut Q = orthonormal(A.times(omega.as_ref())?);
    for _ in 0..q {
        let Z = orthonormal(A.times_transposed(Q.as_ref())?);
        Q = orthonormal(A.times(Z.as_ref())?);
    }
    // Bᵀ = Aᵀ·Q (n, l); Bᵀ = Ũ·Σ·W̃ᵀ ⇒ A ≈ Q·B = (Q·W̃)·Σ·Ũᵀ.
    let Bt = A.times_transposed(Q.as_ref())?;
    let small = exact(Bt.as_ref(), k)?;
    let mut U = Mat::<f64>::zeros(m, k);
    matmul(
        U.as_mut(),
        Accum::Replace,
        Q.as_ref(),
        small.V.as_ref(),
        1.0,
        Par::Seq,
    );
    Ok(TopSingular {
        U,
        S: small.S,
        V: small.U,
        complete: false,
    })
}

fn product(A: MatRef<'_, f64>, B: MatRef<'_, f64>) -> Mat<f64> {
    let mut C = Mat::<f64>::zeros(A.nrows(), B.ncols());
    matmul(C.as_mut(), Accum::Replace, A, B, 1.0, Par::Seq);
    C
}

/// The thin `Q` (m, l) of a Householder QR of `Y` (m ≥ l).
fn orthonormal(Y: Mat<f64>) -> Mat<f64> {
    thin_qr(Y).0
}

/// Thin Householder QR: `Q` (m, l) and upper-triangular `R` (l, l), for m ≥ l.
fn thin_qr(mut Y: Mat<f64>) -> (Mat<f64>, Mat<f64>) {
    let (m, l) = (Y.nrows(), Y.ncols());
    let size = m.min(l);
    let bs = recommended_block_size::<f64>(m, l);
    let mut coeff = Mat::<f64>::zeros(bs, size);
    let params = Default::default();
    let mut mem = MemBuffer::new(
        qr_in_place_scratch::<f64>(m, l, bs, Par::Seq, params)
            .or(apply_block_householder_sequence_on_the_left_in_place_scratch::<f64>(m, bs, size)),
    );
    qr_in_place(
        Y.as_mut(),
        coeff.as_mut(),
        Par::Seq,
        MemStack::new(&mut mem),
        params,
    );
    let R = Mat::<f64>::from_fn(size, l, |i, j| if i <= j { Y[(i, j)] } else { 0.0 });
    let mut Q = Mat::<f64>::identity(m, size);
    apply_block_householder_sequence_on_the_left_in_place_with_conj(
        Y.as_ref(),
        coeff.as_ref(),
        Conj::No,
        Q.as_mut(),
        Par::Seq,
        MemStack::new(&mut mem),
    );
    (Q, R)
}

/// A seeded (n, l) test matrix with entries uniform in [-1, 1) (`rng::SplitMix64`, 53 bits;
/// fixed seed, so the result is a pure function of the input).
fn test_matrix(n: usize, l: usize) -> Mat<f64> {
    let mut rng = SplitMix64::new(0x15EC_7A11_D1FF_5EED);
    let mut M = Mat::<f64>::zeros(n, l);
    for j in 0..l {
        for i in 0..n {
            M[(i, j)] = rng.signed_f64();
        }
    }
    M
}

#[cfg(test)]
mod tests {
    use super::*;

    /// U·diag(s)·Vᵀ + noise with seeded orthonormal U, V.
    fn planted(m: usize, n: usize, s: &[f64], noise: f64, seed: u64) -> Mat<f64> {
        let mut rng = SplitMix64::new(seed);
        let mut rnd = move || rng.signed_f64();
        let k = s.len();
        let U = orthonormal(Mat::from_fn(m, k, |_, _| rnd()));
        let V = orthonormal(Mat::from_fn(n, k, |_, _| rnd()));
        let mut A = Mat::from_fn(m, n, |_, _| noise * rnd());
        let Us = Mat::from_fn(m, k, |i, j| U[(i, j)] * s[j]);
        matmul(
            A.as_mut(),
            Accum::Add,
            Us.as_ref(),
            V.as_ref().transpose(),
            1.0,
            Par::Seq,
        );
        A
    }

    /// ‖P_exact − P_rand‖_F / ‖P_exact‖_F for the rank-k products, and the largest relative
    /// σ difference.
    fn compare(A: &Mat<f64>, k: usize) -> (f64, f64) {
        let e = top_singular(A.as_ref(), k, TruncMethod::Exact).unwrap();
        let r = top_singular(A.as_ref(), k, TruncMethod::RANDOMIZED).unwrap();
        assert!(!r.complete, "the randomized route ran");
        let prod = |t: &TopSingular| {
            let Us = Mat::from_fn(t.U.nrows(), k, |i, j| t.U[(i, j)] * t.S[j]);
            product(Us.as_ref(), t.V.as_ref().transpose())
        };
        let (pe, pr) = (prod(&e), prod(&r));
        let diff = (&pe - &pr).norm_l2() / pe.norm_l2();
        let ds =
            e.S.iter()
                .zip(&r.S)
                .map(|(a, b)| (a - b).abs() / a)
                .fold(0.0, f64::max);
        (diff, ds)
    }

    #[test]
    fn randomized_matches_exact_on_decaying_spectra() {
        // Power-law, geometric and planted-plus-noise spectra; tall, wide and square.
        let cases: Vec<(usize, usize, Vec<f64>, f64)> = vec![
            (
                200,
                120,
                (1..=60).map(|i| (i as f64).powf(-1.5)).collect(),
                0.0,
            ),
            (96, 240, (0..40).map(|i| 0.7f64.powi(i)).collect(), 0.0),
            (
                180,
                180,
                vec![3.0, 2.0, 1.5, 1.0, 0.5, 0.25, 0.1, 0.05],
                1e-6,
            ),
        ];
        for (m, n, s, noise) in cases {
            let A = planted(m, n, &s, noise, (m * 31 + n) as u64);
            for k in [1usize, 4, 8] {
                let (dp, ds) = compare(&A, k);
                assert!(
                    dp < 1e-6 && ds < 1e-6,
                    "{m}×{n} k={k}: product {dp:e}, σ {ds:e}"
                );
            }
        }
    }

    #[test]
    fn exact_route_is_complete_and_reconstructs() {
        let A = planted(30, 20, &[2.0, 1.0, 0.5], 1e-3, 7);
        let t = top_singular(A.as_ref(), 20, TruncMethod::Exact).unwrap();
        assert!(t.complete);
        let Us = Mat::from_fn(30, 20, |i, j| t.U[(i, j)] * t.S[j]);
        let back = product(Us.as_ref(), t.V.as_ref().transpose());
        assert!((&back - &A).norm_l2() < 1e-12 * A.norm_l2() * 30.0);
        // A small matrix asked for by the randomized route runs the exact one.
        let r = top_singular(A.as_ref(), 3, TruncMethod::RANDOMIZED).unwrap();
        assert_eq!(r.S, t.S[..3].to_vec());
    }

    #[test]
    fn factored_svd_matches_the_svd_of_the_product() {
        let B = planted(40, 6, &[1.0, 0.8, 0.3], 0.1, 3);
        let A = planted(6, 50, &[1.2, 0.6, 0.2, 0.1], 0.05, 4);
        let f = factored_top_singular(B.as_ref(), A.as_ref()).unwrap();
        let P = product(B.as_ref(), A.as_ref());
        let e = top_singular(P.as_ref(), 6, TruncMethod::Exact).unwrap();
        for (a, b) in f.S.iter().zip(&e.S) {
            assert!((a - b).abs() < 1e-12 * e.S[0], "{a} vs {b}");
        }
        for j in 0..6 {
            for i in 0..40 {
                assert!((f.U[(i, j)] - e.U[(i, j)]).abs() < 1e-9, "U[{i},{j}]");
            }
        }
    }
}
