//! Full thin SVDs with cuSOLVER's `gesvd` in f64, finished on the host exactly as the CPU
//! path: LoRA-XS bases, and the full-SVD step of extraction's truncations.
//!
//! Owns: the plan that maps a row-major (out, in) matrix onto `cusolverDnDgesvd`'s
//! column-major, `m ≥ n` input ([`GesvdPlan`]), the host-side conversion back to row-major
//! `U` (out, k) and `Vᵀ` (k, in) ([`GesvdPlan::vectors`]), the LoRA-XS bases made from them
//! by `linalg::canonicalize_signs` and truncation ([`GesvdPlan::bases`]), the leading
//! triplets for `linalg::truncated` ([`GesvdPlan::top`]), and the device call ([`gesvd`]).
//! Does not own: the sign convention (`linalg::signs`), the basis cache (`linalg::cache`).
//!
//! Why `gesvd`: it is the QR-iteration driver, accurate for any size. `gesvdj` (Jacobi) is
//! documented as less accurate above 2048 and the randomized drivers rotate vectors inside
//! the subspace (spec `anchors.md` §4.4–4.5), which makes a LoRA-XS ΔW wrong.
//!
//! Why f64: `linalg::svd` computes in f64 from the f32 weight (widening is exact) and rounds
//! the vectors once to f32; the same is done here, so the two engines differ only by their
//! f64 round-off (far below one f32 ulp unless singular values nearly coincide).
//!
//! The mapping: cuSOLVER's `gesvd` needs `m ≥ n`. A row-major (out, in) buffer read
//! column-major is `Wᵀ` (in, out). When `in ≥ out` that is the input as is (`Wᵀ = Ua·S·Vaᵀ`
//! gives `U = Va`, `Vᵀ = Uaᵀ`, and both come back already row-major). When `out > in` the
//! host writes `W` column-major first (`W = Ua·S·Vaᵀ`, `U = Ua`, `Vᵀ = Vaᵀ`).

#![allow(non_snake_case)]

use std::sync::Arc;

use cudarc::cusolver::DnHandle;
use cudarc::cusolver::sys as solver_sys;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtrMut};

use faer::Mat;

use crate::backend::BackendError;
use crate::linalg::{TopSingular, XsBases, canonicalize_signs};

/// How one (out, in) weight goes through `gesvd`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GesvdPlan {
    /// Rows of the weight.
    pub out: usize,
    /// Columns of the weight.
    pub inp: usize,
    /// `true`: the input is `W` column-major (out > in); `false`: it is the row-major buffer
    /// itself, i.e. `Wᵀ` column-major.
    pub transpose: bool,
    /// Rows of the column-major input (`m ≥ n`).
    pub m: usize,
    /// Columns of the column-major input.
    pub n: usize,
}

impl GesvdPlan {
    /// The plan for a row-major (out, inp) weight.
    pub fn new(out: usize, inp: usize) -> GesvdPlan {
        if inp >= out {
            GesvdPlan {
                out,
                inp,
                transpose: false,
                m: inp,
                n: out,
            }
        } else {
            GesvdPlan {
                out,
                inp,
                transpose: true,
                m: out,
                n: inp,
            }
        }
    }

    /// `k = min(out, in) = n`: the number of singular triplets.
    pub fn k(&self) -> usize {
        self.n
    }

    /// The column-major (m, n) f64 input built from the row-major weight `W` (f32 or f64).
    pub fn input<T: Copy + Into<f64>>(&self, W: &[T]) -> Vec<f64> {
        if !self.transpose {
            return W.iter().map(|&x| x.into()).collect();
        }
        let (out, inp) = (self.out, self.inp);
        let mut A = vec![0.0f64; out * inp];
        for (i, row) in W.chunks_exact(inp).enumerate() {
            for (j, &x) in row.iter().enumerate() {
                A[i + j * out] = x.into();
            }
        }
        A
    }

    /// The bases from `gesvd`'s outputs (see [`Self::vectors`]): canonicalises the signs with
    /// `linalg::canonicalize_signs` (the CPU path's function), keeps `r` columns and rounds
    /// once to f32, as `linalg::xs_bases` does.
    pub fn bases(&self, Ua: &[f64], S: Vec<f64>, VaT: &[f64], r: usize) -> XsBases {
        let (out, inp, k) = (self.out, self.inp, self.k());
        let (mut U, mut Vt) = self.vectors(Ua, VaT);
        canonicalize_signs(&mut U, out, k, &mut Vt, inp);
        let mut Uf = Vec::with_capacity(out * r);
        for row in U.chunks_exact(k) {
            Uf.extend(row[..r].iter().map(|&x| x as f32));
        }
        let mut Vf = Vec::with_capacity(inp * r);
        for j in 0..inp {
            Vf.extend((0..r).map(|p| Vt[p * inp + j] as f32));
        }
        XsBases {
            out,
            inp,
            rank: r,
            U: Uf,
            V: Vf,
            singular_values: S,
        }
    }

    /// The leading `r` triplets from `gesvd`'s outputs (see [`Self::vectors`]), in f64 and
    /// in `gesvd`'s signs (`linalg::top_singular_on` canonicalises them), as
    /// `linalg::truncated`'s full-SVD step returns them.
    pub fn top(&self, Ua: &[f64], mut S: Vec<f64>, VaT: &[f64], r: usize) -> TopSingular {
        let (out, inp, k) = (self.out, self.inp, self.k());
        let (U, Vt) = self.vectors(Ua, VaT);
        S.truncate(r);
        TopSingular {
            U: Mat::from_fn(out, r, |i, p| U[i * k + p]),
            S,
            V: Mat::from_fn(inp, r, |j, p| Vt[p * inp + j]),
            complete: r == k,
        }
    }

    /// Row-major `U` (out, k) and `Vᵀ` (k, in) of the weight from `gesvd`'s outputs: `Ua`
    /// (m, k) column-major with ld m and `VaT` (k, n) column-major with ld k.
    pub fn vectors(&self, Ua: &[f64], VaT: &[f64]) -> (Vec<f64>, Vec<f64>) {
        let (out, inp, k) = (self.out, self.inp, self.k());
        if self.transpose {
            // W = Ua·S·VaT: U[i, p] = Ua[i + p·out]; Vt[p, j] = VaT[p + j·k].
            let mut U = vec![0.0f64; out * k];
            for (i, row) in U.chunks_exact_mut(k).enumerate() {
                for (p, u) in row.iter_mut().enumerate() {
                    *u = Ua[i + p * out];
                }
            }
            let mut Vt = vec![0.0f64; k * inp];
            for (p, row) in Vt.chunks_exact_mut(inp).enumerate() {
                for (j, v) in row.iter_mut().enumerate() {
                    *v = VaT[p + j * k];
                }
            }
            (U, Vt)
        } else {
            // Wᵀ = Ua·S·VaT: U = Va, so U[i, p] = VaT[p + i·k] — VaT's buffer read row-major;
            // Vt = Uaᵀ, so Vt[p, j] = Ua[j + p·inp] — Ua's buffer read row-major.
            (VaT[..out * k].to_vec(), Ua[..k * inp].to_vec())
        }
    }
}

/// What `gesvd` returned, on the host.
pub(crate) struct GesvdOutput {
    /// (m, k) column-major.
    pub Ua: Vec<f64>,
    /// (k), descending.
    pub S: Vec<f64>,
    /// (k, n) column-major.
    pub VaT: Vec<f64>,
}

/// Runs `cusolverDnDgesvd(jobu = 'S', jobvt = 'S')` on the column-major (m, n) input `A`
/// already on the device, on `solver`'s stream, and downloads U, S and Vᵀ.
pub(crate) fn gesvd(
    stream: &Arc<CudaStream>,
    solver: &DnHandle,
    plan: &GesvdPlan,
    A: &mut CudaSlice<f64>,
) -> Result<GesvdOutput, BackendError> {
    let (m, n, k) = (plan.m, plan.n, plan.k());
    assert!(
        m >= n && A.len() == m * n,
        "gesvd: input must be (m ≥ n) column-major"
    );
    let int = |v: usize| {
        i32::try_from(v).map_err(|_| {
            BackendError::cuda("cusolverDnDgesvd", format!("dimension {v} exceeds 32 bits"))
        })
    };
    let (mi, ni, ki) = (int(m)?, int(n)?, int(k)?);
    let handle = solver.cu();
    let mut lwork = 0i32;
    // SAFETY: `handle` is live; the call only writes the workspace size through `&mut lwork`.
    unsafe { solver_sys::cusolverDnDgesvd_bufferSize(handle, mi, ni, &mut lwork) }
        .result()
        .map_err(|e| BackendError::cuda(format!("cusolverDnDgesvd_bufferSize ({m}×{n})"), e))?;
    // Uninitialised: gesvd writes S, U (k columns), VT (k rows), rwork and info, and uses
    // work as scratch; nothing here reads a value gesvd did not write.
    let alloc = |len: usize, what: &str| {
        // SAFETY: see above; f64 has no invalid bit patterns.
        unsafe { stream.alloc::<f64>(len.max(1)) }
            .map_err(|e| BackendError::cuda(format!("allocating the SVD {what} ({len} f64)"), e))
    };
    let mut S = alloc(k, "singular values")?;
    let mut U = alloc(m * k, "left vectors")?;
    let mut VT = alloc(k * n, "right vectors")?;
    let mut work = alloc(usize::try_from(lwork).unwrap_or(0), "workspace")?;
    let mut rwork = alloc(k.saturating_sub(1), "superdiagonal")?;
    // SAFETY: gesvd always writes info; i32 has no invalid bit patterns.
    let mut info = unsafe { stream.alloc::<i32>(1) }
        .map_err(|e| BackendError::cuda("allocating the SVD status", e))?;
    {
        let (a, _ra) = A.device_ptr_mut(stream);
        let (s, _rs) = S.device_ptr_mut(stream);
        let (u, _ru) = U.device_ptr_mut(stream);
        let (vt, _rv) = VT.device_ptr_mut(stream);
        let (w, _rw) = work.device_ptr_mut(stream);
        let (rw, _rr) = rwork.device_ptr_mut(stream);
        let (inf, _ri) = info.device_ptr_mut(stream);
        // SAFETY: 16 arguments as cusolverDnDgesvd declares them. A: m·n f64, lda = m
        // (overwritten). S: k f64. U: m·k f64, ldu = m (jobu 'S': k columns). VT: k·n f64,
        // ldvt = k (jobvt 'S': k = n rows). work: lwork f64 (from _bufferSize). rwork:
        // max(k−1, 1) f64. info: one i32. All are device buffers of this context, kept alive
        // until the stream is synchronised below (the downloads synchronise it).
        unsafe {
            solver_sys::cusolverDnDgesvd(
                handle,
                b'S' as i8,
                b'S' as i8,
                mi,
                ni,
                a as *mut f64,
                mi,
                s as *mut f64,
                u as *mut f64,
                mi,
                vt as *mut f64,
                ki,
                w as *mut f64,
                lwork,
                rw as *mut f64,
                inf as *mut i32,
            )
        }
        .result()
        .map_err(|e| BackendError::cuda(format!("cusolverDnDgesvd ({m}×{n})"), e))?;
    }
    let download = |what: &str, e| BackendError::cuda(format!("downloading the SVD {what}"), e);
    let status = stream
        .clone_dtoh(&info)
        .map_err(|e| download("status", e))?;
    match status.first().copied().unwrap_or(0) {
        0 => {}
        i if i > 0 => {
            return Err(crate::linalg::LinalgError::NoConvergence {
                out: plan.out,
                inp: plan.inp,
            }
            .into());
        }
        i => {
            return Err(BackendError::cuda(
                "cusolverDnDgesvd",
                format!("parameter {} had an illegal value", -i),
            ));
        }
    }
    let mut S = stream
        .clone_dtoh(&S)
        .map_err(|e| download("singular values", e))?;
    S.truncate(k);
    Ok(GesvdOutput {
        Ua: stream
            .clone_dtoh(&U)
            .map_err(|e| download("left vectors", e))?,
        S,
        VaT: stream
            .clone_dtoh(&VT)
            .map_err(|e| download("right vectors", e))?,
    })
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::linalg::svd::thin_svd;
    use faer::{Mat, Par};

    /// What `gesvd` returns for a column-major (m ≥ n) input, computed with faer in f64:
    /// Ua (m, k) ld m, S, VaT (k, n) ld k. Signs are whatever faer returns.
    pub(crate) fn emulated_gesvd(A: &[f64], m: usize, n: usize) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
        let k = n;
        let A = Mat::<f64>::from_fn(m, n, |i, j| A[i + j * m]);
        let t = thin_svd(A.as_ref(), Par::Seq).unwrap();
        let (U, S, V) = (t.U, t.S, t.V);
        let mut Ua = vec![0.0; m * k];
        let mut VaT = vec![0.0; k * n];
        for p in 0..k {
            for i in 0..m {
                // Flip every other vector pair: the result must not depend on the engine's signs.
                let sign = if p % 2 == 1 { -1.0 } else { 1.0 };
                Ua[i + p * m] = sign * U[(i, p)];
            }
            for j in 0..n {
                let sign = if p % 2 == 1 { -1.0 } else { 1.0 };
                VaT[p + j * k] = sign * V[(j, p)];
            }
        }
        (Ua, S.iter().copied().collect(), VaT)
    }

    /// A Householder reflector I − 2vvᵀ/(vᵀv) of size n (orthogonal, dense).
    fn householder(n: usize, seed: usize) -> Vec<f64> {
        let v: Vec<f64> = (0..n)
            .map(|i| ((i * 7 + seed * 3) % 11) as f64 - 4.5)
            .collect();
        let vv: f64 = v.iter().map(|x| x * x).sum();
        let mut H = vec![0.0; n * n];
        for i in 0..n {
            for j in 0..n {
                H[i * n + j] = f64::from(u8::from(i == j)) - 2.0 * v[i] * v[j] / vv;
            }
        }
        H
    }

    /// W = U0·diag(s)·V0ᵀ with U0, V0 the first k columns of two reflectors, rounded to f32;
    /// returns W and the expected canonical U (out, k) and V (in, k) (f64, row-major).
    fn known_svd(out: usize, inp: usize) -> (Vec<f32>, Vec<f64>, Vec<f64>) {
        let k = out.min(inp);
        let (Hu, Hv) = (householder(out, 1), householder(inp, 2));
        let s: Vec<f64> = (0..k).map(|p| 4.0 * 0.6f64.powi(p as i32)).collect();
        let mut W = vec![0.0f32; out * inp];
        for i in 0..out {
            for j in 0..inp {
                let x: f64 = (0..k)
                    .map(|p| Hu[i * out + p] * s[p] * Hv[j * inp + p])
                    .sum();
                W[i * inp + j] = x as f32;
            }
        }
        // Canonical signs: the largest-magnitude entry of each U column positive.
        let mut U = vec![0.0; out * k];
        let mut V = vec![0.0; inp * k];
        for p in 0..k {
            let col: Vec<f64> = (0..out).map(|i| Hu[i * out + p]).collect();
            let (mut best, mut idx) = (-1.0, 0);
            for (i, x) in col.iter().enumerate() {
                if x.abs() > best {
                    best = x.abs();
                    idx = i;
                }
            }
            let sign = if col[idx] < 0.0 { -1.0 } else { 1.0 };
            for i in 0..out {
                U[i * k + p] = sign * col[i];
            }
            for j in 0..inp {
                V[j * k + p] = sign * Hv[j * inp + p];
            }
        }
        (W, U, V)
    }

    #[test]
    fn host_side_mapping_recovers_a_known_svd_for_tall_wide_and_square() {
        for (out, inp) in [(9, 5), (5, 9), (7, 7), (1, 4), (4, 1)] {
            let plan = GesvdPlan::new(out, inp);
            assert!(plan.m >= plan.n);
            let (W, U_want, V_want) = known_svd(out, inp);
            let (Ua, S, VaT) = emulated_gesvd(&plan.input(&W), plan.m, plan.n);
            let k = plan.k();
            let bases = plan.bases(&Ua, S, &VaT, k);
            assert_eq!((bases.U.len(), bases.V.len()), (out * k, inp * k));
            // W was rounded to f32 (relative 6e-8), the gap ratio is 0.6: vectors move ~1e-6.
            for (got, want) in bases
                .U
                .iter()
                .zip(&U_want)
                .chain(bases.V.iter().zip(&V_want))
            {
                assert!(
                    (f64::from(*got) - want).abs() < 1e-5,
                    "({out}, {inp}): {got} vs {want}"
                );
            }
        }
    }

    #[test]
    fn host_side_mapping_agrees_with_the_cpu_path() {
        // A generic matrix: the emulated gesvd path and linalg::xs_bases see the same f64
        // problem (one through Wᵀ), so their f32 vectors agree to a few f32 ulps.
        for (out, inp, r) in [(12, 8, 3), (8, 12, 8), (10, 10, 4)] {
            let W: Vec<f32> = (0..out * inp)
                .map(|v| ((v * 37 % 101) as f32 - 50.0) / 25.0)
                .collect();
            let plan = GesvdPlan::new(out, inp);
            let (Ua, S, VaT) = emulated_gesvd(&plan.input(&W), plan.m, plan.n);
            let gpu_like = plan.bases(&Ua, S, &VaT, r);
            let cpu = crate::linalg::xs_bases(&W, out, inp, r, Par::Seq).unwrap();
            assert_eq!((gpu_like.out, gpu_like.inp, gpu_like.rank), (out, inp, r));
            for (a, b) in gpu_like
                .U
                .iter()
                .zip(&cpu.U)
                .chain(gpu_like.V.iter().zip(&cpu.V))
            {
                assert!((a - b).abs() < 1e-5, "({out}, {inp}): {a} vs {b}");
            }
            for (a, b) in gpu_like.singular_values.iter().zip(&cpu.singular_values) {
                assert!((a - b).abs() < 1e-12 * cpu.singular_values[0]);
            }
        }
    }
}
