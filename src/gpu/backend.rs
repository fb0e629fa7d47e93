//! The operations a merge's per-tensor work is written against, and the CPU implementation.
//!
//! Owns: [`Backend`] (the op set), [`MatShape`], [`BackendKind`], [`CpuBackend`] and its
//! matrix [`HostMat`]. Does not own: the CUDA implementation (`super::cuda`) or which ops a
//! merge runs (`merge`).
//!
//! A merge of one base tensor is a short program over these ops, written once as a generic
//! function `fn merge_tensor<B: Backend>(b: &mut B, …)` and run on either backend:
//!
//! ```text
//! W0 = b.widen(base dtype, base bytes, out, in)          // f32, exact
//! D  = b.zeros(out, in)                                  // Σ of contributions
//! lora / lora-xs:      b.add_scaled_product(D, a·σ, B, A) / b.add_xs_update(D, a·σ, U, M, V)
//! dora-rows:           V = b.duplicate(W0); b.add_scaled_product(V, σ, B, A)
//!                      c = b.magnitude_ratio(m, b.row_norms(V), ε); b.scale_rows(V, c)
//!                      b.accumulate_difference(D, a, V, W0)
//! dora-cols:           … col_norms / scale_cols …
//! bora:                … scale_rows with α, then col_norms of the result, scale_cols with β …
//! out bytes          = b.add_narrow(W0, D, out dtype)    // RNE(W0 + D), once
//! ```
//!
//! Matrices are row-major f32; a vector is an (n, 1) or (1, n) matrix. Shape preconditions are
//! programmer errors and panic (`#[track_caller]`); user shape errors are caught when binding
//! adapters, before any op runs.

#![allow(non_snake_case)]

use faer::Par;

use super::arith;
use super::error::GpuError;
use crate::io::DType;
use crate::io::dtype::{UnsupportedDType, narrow_from_f32, widen_to_f32};
use crate::linalg::{self, XsBases};

/// Which implementation a backend is (for labels in reports and test names).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BackendKind {
    /// [`CpuBackend`].
    Cpu,
    /// [`super::CudaBackend`].
    Cuda,
}

/// The shape of a backend matrix.
pub trait MatShape {
    /// Rows.
    fn rows(&self) -> usize;
    /// Columns.
    fn cols(&self) -> usize;
    /// `rows · cols`.
    fn len(&self) -> usize {
        self.rows() * self.cols()
    }
    /// True when it holds no element.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The op set of a merge, in f32 with one rounding at the end. Every op gives the same bits
/// on every backend except the two GEMM ops (`add_scaled_product`, `add_xs_update`), which
/// agree to f32 rounding (see the `gpu` module doc), and `xs_bases` (the SVD engine differs).
pub trait Backend {
    /// A row-major f32 matrix held by this backend.
    type Mat: MatShape;

    /// Which backend this is.
    fn kind(&self) -> BackendKind;

    /// A matrix holding `data` ((rows, cols) row-major).
    fn upload(&mut self, data: &[f32], rows: usize, cols: usize) -> Result<Self::Mat, GpuError>;

    /// The f32 values of `bytes` (little-endian `dtype` storage, (rows, cols)), exactly as
    /// `io::dtype::widen_to_f32`.
    fn widen(
        &mut self,
        dtype: DType,
        bytes: &[u8],
        rows: usize,
        cols: usize,
    ) -> Result<Self::Mat, GpuError>;

    /// A (rows, cols) matrix of +0.0.
    fn zeros(&mut self, rows: usize, cols: usize) -> Result<Self::Mat, GpuError>;

    /// A copy of `src`.
    fn duplicate(&mut self, src: &Self::Mat) -> Result<Self::Mat, GpuError>;

    /// `W ← W + s·B·A` with `W` (out, in), `B` (out, r), `A` (r, in), f32 GEMM.
    fn add_scaled_product(
        &mut self,
        W: &mut Self::Mat,
        s: f32,
        B: &Self::Mat,
        A: &Self::Mat,
    ) -> Result<(), GpuError>;

    /// `W ← W + s·(U·M)·Vᵀ` with `W` (out, in), `U` (out, r), `M` (r, r), `V` (in, r): first
    /// `B' = U·M` in f32, then `W ← W + s·B'·Vᵀ` (the order of `linalg::add_xs_update`).
    fn add_xs_update(
        &mut self,
        W: &mut Self::Mat,
        s: f32,
        U: &Self::Mat,
        M: &Self::Mat,
        V: &Self::Mat,
    ) -> Result<(), GpuError>;

    /// The (rows, 1) row norms of `X` (f64 accumulation in index order, `linalg::norms`).
    fn row_norms(&mut self, X: &Self::Mat) -> Result<Self::Mat, GpuError>;

    /// The (1, cols) column norms of `X` (f64 accumulation in index order).
    fn col_norms(&mut self, X: &Self::Mat) -> Result<Self::Mat, GpuError>;

    /// `c = m / (norms + ε)` element-wise; `c` has the shape of `norms`.
    fn magnitude_ratio(
        &mut self,
        m: &Self::Mat,
        norms: &Self::Mat,
        eps: f32,
    ) -> Result<Self::Mat, GpuError>;

    /// `X[i, j] ← c[i]·X[i, j]` (`c` holds `X.rows()` values).
    fn scale_rows(&mut self, X: &mut Self::Mat, c: &Self::Mat) -> Result<(), GpuError>;

    /// `X[i, j] ← c[j]·X[i, j]` (`c` holds `X.cols()` values).
    fn scale_cols(&mut self, X: &mut Self::Mat, c: &Self::Mat) -> Result<(), GpuError>;

    /// `D ← D + a·(X − W0)` element-wise (one adapter's contribution `a·(f(W0) − W0)`).
    fn accumulate_difference(
        &mut self,
        D: &mut Self::Mat,
        a: f32,
        X: &Self::Mat,
        W0: &Self::Mat,
    ) -> Result<(), GpuError>;

    /// Writes `RNE(base + delta)` as `dtype` (BF16, F16 or F32) into `out`
    /// (`base.len() · dtype size` bytes, little-endian), with the NaN rule of
    /// [`arith::sum_bits`].
    fn add_narrow(
        &mut self,
        base: &Self::Mat,
        delta: &Self::Mat,
        dtype: DType,
        out: &mut [u8],
    ) -> Result<(), GpuError>;

    /// Writes `src` rounded once to `dtype` (BF16, F16 or F32) into `out`, exactly as
    /// `io::dtype::narrow_from_f32`.
    fn narrow(&mut self, src: &Self::Mat, dtype: DType, out: &mut [u8]) -> Result<(), GpuError>;

    /// The values of `src`, row-major.
    fn download(&mut self, src: &Self::Mat) -> Result<Vec<f32>, GpuError>;

    /// The rank-`r` LoRA-XS bases of `W` ((out, in) row-major f32): a full thin SVD in f64,
    /// `linalg::canonicalize_signs`, truncation, one rounding to f32 (`linalg::xs_bases`).
    fn xs_bases(
        &mut self,
        W: &[f32],
        out: usize,
        inp: usize,
        r: usize,
    ) -> Result<XsBases, GpuError>;
}

/// The shape checks shared by both backends (programmer errors).
pub(crate) mod check {
    use super::MatShape;

    #[track_caller]
    pub fn product<M: MatShape>(W: &M, B: &M, A: &M) {
        assert!(
            B.rows() == W.rows() && A.cols() == W.cols() && B.cols() == A.rows(),
            "W ({}, {}) += B ({}, {}) · A ({}, {}): shapes do not chain",
            W.rows(),
            W.cols(),
            B.rows(),
            B.cols(),
            A.rows(),
            A.cols()
        );
    }

    #[track_caller]
    pub fn xs<M: MatShape>(W: &M, U: &M, M: &M, V: &M) {
        let r = U.cols();
        assert!(
            U.rows() == W.rows()
                && V.rows() == W.cols()
                && M.rows() == r
                && M.cols() == r
                && V.cols() == r,
            "W ({}, {}) += U ({}, {}) · M ({}, {}) · Vᵀ with V ({}, {}): shapes do not chain",
            W.rows(),
            W.cols(),
            U.rows(),
            U.cols(),
            M.rows(),
            M.cols(),
            V.rows(),
            V.cols()
        );
    }

    #[track_caller]
    pub fn same<M: MatShape>(what: &str, a: &M, b: &M) {
        assert!(
            a.rows() == b.rows() && a.cols() == b.cols(),
            "{what}: ({}, {}) and ({}, {}) differ",
            a.rows(),
            a.cols(),
            b.rows(),
            b.cols()
        );
    }

    #[track_caller]
    pub fn vector<M: MatShape>(what: &str, v: &M, len: usize) {
        assert!(
            v.len() == len && (v.rows() == 1 || v.cols() == 1),
            "{what}: expected a vector of {len}, found ({}, {})",
            v.rows(),
            v.cols()
        );
    }

    #[track_caller]
    pub fn data(what: &str, len: usize, rows: usize, cols: usize) {
        assert_eq!(
            Some(len),
            rows.checked_mul(cols),
            "{what}: {len} elements for a ({rows}, {cols}) matrix"
        );
    }
}

/// The output size of `dtype` for [`Backend::narrow`] and [`Backend::add_narrow`].
pub(crate) fn output_size(dtype: DType) -> Result<usize, GpuError> {
    match dtype {
        DType::BF16 | DType::F16 => Ok(2),
        DType::F32 => Ok(4),
        _ => Err(UnsupportedDType {
            dtype,
            direction: "from",
        }
        .into()),
    }
}

/// A row-major f32 matrix in host memory.
#[derive(Clone, Debug, PartialEq)]
pub struct HostMat {
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
    /// `rows · cols` values, row-major.
    pub data: Vec<f32>,
}

impl MatShape for HostMat {
    fn rows(&self) -> usize {
        self.rows
    }
    fn cols(&self) -> usize {
        self.cols
    }
}

/// The CPU backend: `io::dtype` for conversions, `linalg` for GEMMs, norms and SVD, and
/// [`arith`] for the element-wise steps. It is the reference the CUDA backend is compared to.
#[derive(Clone, Copy, Debug)]
pub struct CpuBackend {
    /// Parallelism of the GEMMs, norms and SVD (never changes the bits; see `linalg`).
    pub par: Par,
}

impl CpuBackend {
    /// A CPU backend with parallelism `par`.
    pub fn new(par: Par) -> CpuBackend {
        CpuBackend { par }
    }
}

impl Backend for CpuBackend {
    type Mat = HostMat;

    fn kind(&self) -> BackendKind {
        BackendKind::Cpu
    }

    #[track_caller]
    fn upload(&mut self, data: &[f32], rows: usize, cols: usize) -> Result<HostMat, GpuError> {
        check::data("upload", data.len(), rows, cols);
        Ok(HostMat {
            rows,
            cols,
            data: data.to_vec(),
        })
    }

    #[track_caller]
    fn widen(
        &mut self,
        dtype: DType,
        bytes: &[u8],
        rows: usize,
        cols: usize,
    ) -> Result<HostMat, GpuError> {
        let mut data = vec![0.0f32; rows * cols];
        widen_to_f32(dtype, bytes, &mut data)?;
        Ok(HostMat { rows, cols, data })
    }

    fn zeros(&mut self, rows: usize, cols: usize) -> Result<HostMat, GpuError> {
        Ok(HostMat {
            rows,
            cols,
            data: vec![0.0; rows * cols],
        })
    }

    fn duplicate(&mut self, src: &HostMat) -> Result<HostMat, GpuError> {
        Ok(src.clone())
    }

    #[track_caller]
    fn add_scaled_product(
        &mut self,
        W: &mut HostMat,
        s: f32,
        B: &HostMat,
        A: &HostMat,
    ) -> Result<(), GpuError> {
        check::product(W, B, A);
        let (out, inp, r) = (W.rows, W.cols, B.cols);
        linalg::add_scaled_product(&mut W.data, out, inp, s, &B.data, &A.data, r, self.par);
        Ok(())
    }

    #[track_caller]
    fn add_xs_update(
        &mut self,
        W: &mut HostMat,
        s: f32,
        U: &HostMat,
        M: &HostMat,
        V: &HostMat,
    ) -> Result<(), GpuError> {
        check::xs(W, U, M, V);
        let (out, inp, r) = (W.rows, W.cols, U.cols);
        let par = self.par;
        linalg::add_xs_update(&mut W.data, out, inp, s, &U.data, &M.data, &V.data, r, par);
        Ok(())
    }

    fn row_norms(&mut self, X: &HostMat) -> Result<HostMat, GpuError> {
        Ok(HostMat {
            rows: X.rows,
            cols: 1,
            data: linalg::row_norms(&X.data, X.rows, X.cols, self.par),
        })
    }

    fn col_norms(&mut self, X: &HostMat) -> Result<HostMat, GpuError> {
        Ok(HostMat {
            rows: 1,
            cols: X.cols,
            data: linalg::col_norms(&X.data, X.rows, X.cols, self.par),
        })
    }

    #[track_caller]
    fn magnitude_ratio(
        &mut self,
        m: &HostMat,
        norms: &HostMat,
        eps: f32,
    ) -> Result<HostMat, GpuError> {
        check::vector("magnitude_ratio: m", m, norms.len());
        let data = m
            .data
            .iter()
            .zip(&norms.data)
            .map(|(&m, &n)| arith::magnitude_ratio(m, n, eps))
            .collect();
        Ok(HostMat {
            rows: norms.rows,
            cols: norms.cols,
            data,
        })
    }

    #[track_caller]
    fn scale_rows(&mut self, X: &mut HostMat, c: &HostMat) -> Result<(), GpuError> {
        check::vector("scale_rows: c", c, X.rows);
        if X.cols > 0 {
            for (row, &ci) in X.data.chunks_exact_mut(X.cols).zip(&c.data) {
                row.iter_mut().for_each(|x| *x = arith::scaled(ci, *x));
            }
        }
        Ok(())
    }

    #[track_caller]
    fn scale_cols(&mut self, X: &mut HostMat, c: &HostMat) -> Result<(), GpuError> {
        check::vector("scale_cols: c", c, X.cols);
        if X.cols > 0 {
            for row in X.data.chunks_exact_mut(X.cols) {
                for (x, &cj) in row.iter_mut().zip(&c.data) {
                    *x = arith::scaled(cj, *x);
                }
            }
        }
        Ok(())
    }

    #[track_caller]
    fn accumulate_difference(
        &mut self,
        D: &mut HostMat,
        a: f32,
        X: &HostMat,
        W0: &HostMat,
    ) -> Result<(), GpuError> {
        check::same("accumulate_difference: D, X", D, X);
        check::same("accumulate_difference: D, W0", D, W0);
        for ((d, &x), &w) in D.data.iter_mut().zip(&X.data).zip(&W0.data) {
            *d = arith::accumulate_difference(*d, a, x, w);
        }
        Ok(())
    }

    #[track_caller]
    fn add_narrow(
        &mut self,
        base: &HostMat,
        delta: &HostMat,
        dtype: DType,
        out: &mut [u8],
    ) -> Result<(), GpuError> {
        check::same("add_narrow: base, delta", base, delta);
        let size = output_size(dtype)?;
        assert_eq!(
            out.len(),
            base.len() * size,
            "add_narrow: output byte length"
        );
        let pairs = base.data.iter().zip(&delta.data);
        match dtype {
            DType::BF16 => out
                .chunks_exact_mut(2)
                .zip(pairs)
                .for_each(|(o, (&b, &d))| {
                    o.copy_from_slice(&arith::add_narrow_bf16(b, d).to_le_bytes())
                }),
            DType::F16 => out
                .chunks_exact_mut(2)
                .zip(pairs)
                .for_each(|(o, (&b, &d))| {
                    o.copy_from_slice(&arith::add_narrow_f16(b, d).to_le_bytes())
                }),
            _ => out
                .chunks_exact_mut(4)
                .zip(pairs)
                .for_each(|(o, (&b, &d))| {
                    o.copy_from_slice(&arith::add_narrow_f32(b, d).to_le_bytes())
                }),
        }
        Ok(())
    }

    #[track_caller]
    fn narrow(&mut self, src: &HostMat, dtype: DType, out: &mut [u8]) -> Result<(), GpuError> {
        output_size(dtype)?;
        narrow_from_f32(dtype, &src.data, out)?;
        Ok(())
    }

    fn download(&mut self, src: &HostMat) -> Result<Vec<f32>, GpuError> {
        Ok(src.data.clone())
    }

    fn xs_bases(
        &mut self,
        W: &[f32],
        out: usize,
        inp: usize,
        r: usize,
    ) -> Result<XsBases, GpuError> {
        Ok(linalg::xs_bases(W, out, inp, r, self.par)?)
    }
}
