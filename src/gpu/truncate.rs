//! The CUDA engine of `linalg::truncated`, for extraction's truncated SVDs: one f64 matrix in
//! a lane's device memory, its products `A·X` and `Aᵀ·Y` on cuBLAS `dgemm`, its full thin
//! SVD on cuSOLVER `gesvd`.
//!
//! Owns: [`CudaEngine`] and the layout of its two products ([`times_call`],
//! [`times_transposed_call`], [`pack_columns`], [`unpack_columns`]: pure functions, checked
//! on the CPU against a reference GEMM in the tests). Does not own: the algorithm
//! (`linalg::truncated`, which runs the test matrix, the QRs, the projection's SVD and the
//! signs on the host for every engine), the GEMM call and its deterministic settings
//! (`super::blas`), the `gesvd` call and the mapping of its outputs (`super::svd`).
//!
//! # Layout
//! The matrix is uploaded once, as the host holds it: row-major (m, n). The host's operands
//! and results are faer matrices, column-major, and a column-major (n, l) buffer is the
//! row-major (l, n) matrix `Xᵀ`. So each product is computed transposed, without moving `A`:
//! `(A·X)ᵀ = Xᵀ·Aᵀ` (l, m) and `(Aᵀ·Y)ᵀ = Yᵀ·A` (l, n), row-major GEMMs whose results, read
//! column-major, are the products themselves.
//!
//! # Agreement with the CPU engine
//! cuBLAS `dgemm` (pedantic math, no atomics: deterministic run to run for one GPU and
//! toolkit) and faer sum in different orders, and `gesvd` and faer's SVD are different
//! algorithms, so the triplets agree with `linalg::FaerEngine`'s to f64 round-off (amplified
//! where singular values nearly coincide), not bit for bit. Extraction rounds its factors to
//! f32 (or narrower), where the two routes then give the same value except for elements
//! whose f64 value lies within that round-off of a rounding boundary. Each route is
//! deterministic on its own.

#![allow(non_snake_case)]

use cudarc::driver::CudaSlice;
use faer::{Mat, MatRef};

use super::blas::{self, ColMajorGemm, row_major};
use super::cuda::CudaBackend;
use super::svd::{GesvdPlan, gesvd};
use crate::backend::BackendError;
use crate::linalg::{TopSingular, TruncEngine};

/// One row-major (rows, cols) f64 matrix held on a CUDA lane for `linalg::top_singular_on`.
/// The host copy stays borrowed: `gesvd` overwrites its input, so the full-SVD step uploads
/// its own copy.
pub struct CudaEngine<'a> {
    lane: &'a mut CudaBackend,
    host: &'a [f64],
    rows: usize,
    cols: usize,
    /// The matrix on the device, uploaded by the first product.
    device: Option<CudaSlice<f64>>,
}

impl<'a> CudaEngine<'a> {
    /// Holds the row-major (rows, cols) matrix `host` on `lane` (nothing is uploaded yet).
    ///
    /// # Panics
    /// If `host.len() != rows·cols` (a programmer error).
    #[track_caller]
    pub fn new(lane: &'a mut CudaBackend, host: &'a [f64], rows: usize, cols: usize) -> Self {
        assert_eq!(
            Some(host.len()),
            rows.checked_mul(cols),
            "CudaEngine: {} values for ({rows}, {cols})",
            host.len()
        );
        CudaEngine {
            lane,
            host,
            rows,
            cols,
            device: None,
        }
    }

    /// The product of `call` with the device matrix as its first (right) operand and `X`
    /// (column-major, `X.ncols()` columns) as its second, as an (out_rows, X.ncols())
    /// column-major host matrix.
    fn product(
        &mut self,
        call: ColMajorGemm,
        X: MatRef<'_, f64>,
        out_rows: usize,
    ) -> Result<Mat<f64>, BackendError> {
        let l = X.ncols();
        self.lane.bind()?;
        let stream = self.lane.stream.clone();
        let A = match self.device.take() {
            Some(A) => A,
            None => {
                let mut A = self
                    .lane
                    .alloc::<f64>(self.host.len(), "the matrix to truncate")?;
                (self.lane.staging).upload(&stream, bytemuck::cast_slice(self.host), &mut A)?;
                A
            }
        };
        let packed = pack_columns(X);
        let mut x = self
            .lane
            .alloc::<f64>(packed.len(), "a range-finder block")?;
        (self.lane.staging).upload(&stream, bytemuck::cast_slice(&packed), &mut x)?;
        let mut c = self
            .lane
            .alloc::<f64>(out_rows * l, "a range-finder product")?;
        self.lane
            .launched(format!("cublasDgemm ({}×{} by {l})", self.rows, self.cols));
        blas::gemm(&self.lane.blas, call, 1.0, &A, &x, 0.0, &mut c)?;
        self.device = Some(A);
        let mut values = vec![0.0f64; out_rows * l];
        (self.lane.staging).download(&stream, &c, bytemuck::cast_slice_mut(&mut values))?;
        Ok(unpack_columns(&values, out_rows, l))
    }
}

impl TruncEngine for CudaEngine<'_> {
    type Error = BackendError;

    fn dims(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }

    fn times(&mut self, X: MatRef<'_, f64>) -> Result<Mat<f64>, BackendError> {
        assert_eq!(X.nrows(), self.cols, "A·X: X has {} rows", X.nrows());
        let call = times_call(self.rows, self.cols, X.ncols());
        self.product(call, X, self.rows)
    }

    fn times_transposed(&mut self, Y: MatRef<'_, f64>) -> Result<Mat<f64>, BackendError> {
        assert_eq!(Y.nrows(), self.rows, "Aᵀ·Y: Y has {} rows", Y.nrows());
        let call = times_transposed_call(self.rows, self.cols, Y.ncols());
        self.product(call, Y, self.cols)
    }

    fn full_svd(&mut self, k: usize) -> Result<TopSingular, BackendError> {
        self.lane.bind()?;
        let plan = GesvdPlan::new(self.rows, self.cols);
        let input = plan.input(self.host);
        let mut A = self.lane.alloc::<f64>(input.len(), "the SVD input")?;
        let stream = self.lane.stream.clone();
        (self.lane.staging).upload(&stream, bytemuck::cast_slice(&input), &mut A)?;
        drop(input);
        self.lane.launched("cusolverDnDgesvd");
        let result = gesvd(&stream, &self.lane.solver, &plan, &mut A)?;
        Ok(plan.top(&result.Ua, result.S, &result.VaT, k))
    }
}

/// The GEMM of `A·X` for a row-major (m, n) `A` and a column-major (n, l) `X`: the row-major
/// (l, m) product `Xᵀ·Aᵀ` (see the module doc), `A`'s buffer first.
pub(crate) fn times_call(m: usize, n: usize, l: usize) -> ColMajorGemm {
    row_major(l, m, n, false, true)
}

/// The GEMM of `Aᵀ·Y` for a row-major (m, n) `A` and a column-major (m, l) `Y`: the
/// row-major (l, n) product `Yᵀ·A`, `A`'s buffer first.
pub(crate) fn times_transposed_call(m: usize, n: usize, l: usize) -> ColMajorGemm {
    row_major(l, n, m, false, false)
}

/// The values of `X` column after column (faer may pad its columns; the GEMM reads them
/// packed).
pub(crate) fn pack_columns(X: MatRef<'_, f64>) -> Vec<f64> {
    let mut packed = Vec::with_capacity(X.nrows() * X.ncols());
    for j in 0..X.ncols() {
        packed.extend(X.col(j).iter().copied());
    }
    packed
}

/// The (rows, cols) matrix whose columns are `values` packed one after another.
pub(crate) fn unpack_columns(values: &[f64], rows: usize, cols: usize) -> Mat<f64> {
    Mat::from_fn(rows, cols, |i, j| values[j * rows + i])
}

#[cfg(test)]
mod tests {
    use super::super::blas::tests::gemm_ref;
    use super::*;
    use crate::linalg::{FaerEngine, LinalgError, TruncMethod, top_singular, top_singular_on};
    use crate::rng::SplitMix64;

    /// The CUDA engine's host half with the reference GEMM and an emulated `gesvd` in place
    /// of the device: the same calls, packing and mapping as [`CudaEngine`].
    struct Emulated<'a> {
        host: &'a [f64],
        rows: usize,
        cols: usize,
    }

    impl TruncEngine for Emulated<'_> {
        type Error = LinalgError;
        fn dims(&self) -> (usize, usize) {
            (self.rows, self.cols)
        }
        fn times(&mut self, X: MatRef<'_, f64>) -> Result<Mat<f64>, LinalgError> {
            let call = times_call(self.rows, self.cols, X.ncols());
            Ok(unpack_columns(
                &product(call, self.host, X),
                self.rows,
                X.ncols(),
            ))
        }
        fn times_transposed(&mut self, Y: MatRef<'_, f64>) -> Result<Mat<f64>, LinalgError> {
            let call = times_transposed_call(self.rows, self.cols, Y.ncols());
            Ok(unpack_columns(
                &product(call, self.host, Y),
                self.cols,
                Y.ncols(),
            ))
        }
        fn full_svd(&mut self, k: usize) -> Result<TopSingular, LinalgError> {
            let plan = GesvdPlan::new(self.rows, self.cols);
            let (Ua, S, VaT) =
                super::super::svd::tests::emulated_gesvd(&plan.input(self.host), plan.m, plan.n);
            Ok(plan.top(&Ua, S, &VaT, k))
        }
    }

    /// The reference GEMM of `call` with `host` first and `X` packed second (β = 0).
    fn product(call: ColMajorGemm, host: &[f64], X: MatRef<'_, f64>) -> Vec<f64> {
        let mut c = vec![0.0; call.ldc * call.n];
        gemm_ref(call, (1.0, 0.0), host, &pack_columns(X), &mut c);
        c
    }

    /// A row-major (m, n) matrix with singular values decaying about as 0.9^i, plus small noise.
    fn decaying(m: usize, n: usize, seed: u64) -> Vec<f64> {
        let mut rng = SplitMix64::new(seed);
        let k = m.min(n);
        let u: Vec<f64> = (0..m * k).map(|_| rng.signed_f64()).collect();
        let v: Vec<f64> = (0..n * k).map(|_| rng.signed_f64()).collect();
        let mut a: Vec<f64> = (0..m * n).map(|_| 1e-9 * rng.signed_f64()).collect();
        for p in 0..k {
            let s = 0.9f64.powi(p as i32);
            for i in 0..m {
                for j in 0..n {
                    a[i * n + j] += s * u[i * k + p] * v[j * k + p];
                }
            }
        }
        a
    }

    #[test]
    fn products_in_the_device_layout_equal_faers() {
        let mut rng = SplitMix64::new(11);
        for (m, n, l) in [(7, 5, 3), (5, 7, 4), (6, 6, 1), (1, 9, 2), (9, 1, 2)] {
            let a: Vec<f64> = (0..m * n).map(|_| rng.signed_f64()).collect();
            let A = MatRef::from_row_major_slice(&a, m, n);
            // A padded view (a column-major sub-matrix) exercises the packing.
            let big = Mat::from_fn(n + 3, l + 1, |_, _| rng.signed_f64());
            let X = big.as_ref().get(1..n + 1, ..l);
            let mut e = Emulated {
                host: &a,
                rows: m,
                cols: n,
            };
            let got = e.times(X).unwrap();
            let want = FaerEngine(A).times(X).unwrap();
            assert!(
                (&got - &want).norm_l2() <= 1e-14 * want.norm_l2(),
                "A·X {m}×{n}"
            );
            let Y = Mat::from_fn(m, l, |_, _| rng.signed_f64());
            let got = e.times_transposed(Y.as_ref()).unwrap();
            let want = FaerEngine(A).times_transposed(Y.as_ref()).unwrap();
            assert!(
                (&got - &want).norm_l2() <= 1e-14 * want.norm_l2(),
                "Aᵀ·Y {m}×{n}"
            );
        }
    }

    #[test]
    fn both_methods_through_the_device_layout_match_the_host_engine() {
        // Tall, wide and square; randomized (a sketch well under half the smaller side) and
        // the full SVD (through gesvd's mapping, both orientations).
        for (m, n) in [(90, 60), (60, 90), (80, 80)] {
            let a = decaying(m, n, (m * 7 + n) as u64);
            let A = MatRef::from_row_major_slice(&a, m, n);
            for (k, method) in [
                (6, TruncMethod::RANDOMIZED),
                (10, TruncMethod::Exact),
                (60, TruncMethod::Exact),
            ] {
                let mut e = Emulated {
                    host: &a,
                    rows: m,
                    cols: n,
                };
                let got = top_singular_on(&mut e, k, method).unwrap();
                let want = top_singular(A, k, method).unwrap();
                assert_eq!(got.complete, want.complete, "{m}×{n} k={k}");
                for (x, y) in got.S.iter().zip(&want.S) {
                    assert!((x - y).abs() <= 1e-12 * want.S[0], "{m}×{n} k={k}: σ");
                }
                // Gaps of about 10 % between values: the vectors agree to round-off, signs included.
                let dU = (&got.U - &want.U).norm_max();
                let dV = (&got.V - &want.V).norm_max();
                assert!(dU < 1e-9 && dV < 1e-9, "{m}×{n} k={k}: U {dU:e}, V {dV:e}");
            }
        }
    }
}
