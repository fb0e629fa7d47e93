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
//! lora:        b.add_scaled_product(D, w·σ, B, A)        // lora-xs: add_xs_update
//! dora-rows:   V = b.duplicate(W0); b.add_scaled_product(V, σ, B, A)
//!              α = b.row_scales(V, m, ε)
//!              b.accumulate_normalised(D, w, V, W0, Some(α), None)
//! dora-cols:   β = b.col_scales(V, None, m, ε);  accumulate_normalised(…, None, Some(β))
//! bora:        α = b.row_scales(V, m_r, ε); β = b.col_scales(V, Some(α), m_c, ε)
//!              b.accumulate_normalised(D, w, V, W0, Some(α), Some(β))
//! diff:        b.accumulate_scaled(D, w·scale, X)
//! out bytes  = b.add_narrow(W0, D, out dtype)            // RNE(W0 + D), once; reports the
//!                                                        // first non-finite sum
//! ```
//!
//! This is `merge::math`'s arithmetic op for op (f64 norms and scales, the combination in f64
//! rounded once into the f32 accumulator), so on one machine the two backends differ only
//! where a GEMM is involved.
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

/// The length of a backend scale vector.
pub trait ScalesLen {
    /// Number of values.
    fn len(&self) -> usize;
    /// True when empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The first element of a merged tensor whose f32 value `W0 + D` is infinite or NaN.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NonFinite {
    /// Row-major element index.
    pub index: usize,
    /// Its f32 value (NaN payloads follow [`arith::sum_bits`]).
    pub value: f32,
}

/// The op set of a merge, in f32 (f64 where `merge::math` uses f64) with one rounding at the
/// end. Every op gives the same bits on every backend except the two GEMM ops
/// (`add_scaled_product`, `add_xs_update`), which agree to f32 rounding (see the `gpu` module
/// doc), and `xs_bases` (the SVD engine differs).
pub trait Backend {
    /// A row-major f32 matrix held by this backend.
    type Mat: MatShape;

    /// A vector of f64 row or column factors held by this backend.
    type Scales: ScalesLen;

    /// Which backend this is.
    fn kind(&self) -> BackendKind;

    /// Makes this backend usable on the calling thread. A merge hands lanes from worker to
    /// worker, and calls this each time one changes hands (CUDA: makes the lane's context
    /// current; raw cuBLAS and cuSOLVER calls need it).
    fn attach(&mut self) -> Result<(), GpuError> {
        Ok(())
    }

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

    /// The (rows, 1) row norms of `X` rounded to f32 (f64 accumulation in index order,
    /// `linalg::norms`).
    fn row_norms(&mut self, X: &Self::Mat) -> Result<Self::Mat, GpuError>;

    /// The (1, cols) column norms of `X` rounded to f32 (f64 accumulation in index order).
    fn col_norms(&mut self, X: &Self::Mat) -> Result<Self::Mat, GpuError>;

    /// DoRA's row factors `α_i = m_i / (‖V_i‖ + ε)` in f64 (`m` holds `V.rows()` values).
    fn row_scales(
        &mut self,
        V: &Self::Mat,
        m: &Self::Mat,
        eps: f64,
    ) -> Result<Self::Scales, GpuError>;

    /// The column factors `β_j = m_j / (‖(α ⊙ V)_j‖ + ε)` in f64, with `α` the row factors
    /// (BoRA) or 1 (dora-cols); `m` holds `V.cols()` values.
    fn col_scales(
        &mut self,
        V: &Self::Mat,
        alpha: Option<&Self::Scales>,
        m: &Self::Mat,
        eps: f64,
    ) -> Result<Self::Scales, GpuError>;

    /// One DoRA/BoRA contribution: `D_ij ← D_ij + f32(w·(β_j·(α_i·V_ij) − W0_ij))`, the
    /// combination in f64, a missing `α` or `β` being 1.
    #[allow(clippy::too_many_arguments)]
    fn accumulate_normalised(
        &mut self,
        D: &mut Self::Mat,
        w: f64,
        V: &Self::Mat,
        W0: &Self::Mat,
        alpha: Option<&Self::Scales>,
        beta: Option<&Self::Scales>,
    ) -> Result<(), GpuError>;

    /// One full-tensor diff: `D ← D + f32(coef·X)` element-wise.
    fn accumulate_scaled(
        &mut self,
        D: &mut Self::Mat,
        coef: f64,
        X: &Self::Mat,
    ) -> Result<(), GpuError>;

    /// The values of a scale vector.
    fn download_scales(&mut self, s: &Self::Scales) -> Result<Vec<f64>, GpuError>;

    /// Writes `RNE(base + delta)` as `dtype` (BF16, F16 or F32) into `out`
    /// (`base.len() · dtype size` bytes, little-endian), with the NaN rule of
    /// [`arith::sum_bits`], and returns the first element whose f32 sum is not finite (the
    /// merge refuses to write such a tensor).
    fn add_narrow(
        &mut self,
        base: &Self::Mat,
        delta: &Self::Mat,
        dtype: DType,
        out: &mut [u8],
    ) -> Result<Option<NonFinite>, GpuError>;

    /// Writes `src` rounded once to `dtype` (BF16, F16 or F32) into `out`, exactly as
    /// `io::dtype::narrow_from_f32`.
    fn narrow(&mut self, src: &Self::Mat, dtype: DType, out: &mut [u8]) -> Result<(), GpuError>;

    /// The values of `src`, row-major.
    fn download(&mut self, src: &Self::Mat) -> Result<Vec<f32>, GpuError>;

    /// The rank-`r` LoRA-XS bases of `W` ((out, in) row-major f32): a full thin SVD in f64,
    /// `linalg::canonicalize_signs`, truncation, one rounding to f32 (`linalg::xs_bases`).
    /// A merge does not call it: its bases come from `linalg::xs_bases` on every route, so the
    /// SVD cache holds one engine's bases (`merge::device`, "-xs bases").
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

/// A vector of f64 factors in host memory.
#[derive(Clone, Debug, PartialEq)]
pub struct HostScales(pub Vec<f64>);

impl ScalesLen for HostScales {
    fn len(&self) -> usize {
        self.0.len()
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
    type Scales = HostScales;

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
    fn row_scales(&mut self, V: &HostMat, m: &HostMat, eps: f64) -> Result<HostScales, GpuError> {
        check::vector("row_scales: m", m, V.rows);
        if V.cols == 0 {
            return Ok(HostScales(
                m.data.iter().map(|&m| f64::from(m) / eps).collect(),
            ));
        }
        Ok(HostScales(
            V.data
                .chunks_exact(V.cols)
                .zip(&m.data)
                .map(|(row, &m)| arith::row_scale(row, m, eps))
                .collect(),
        ))
    }

    #[track_caller]
    fn col_scales(
        &mut self,
        V: &HostMat,
        alpha: Option<&HostScales>,
        m: &HostMat,
        eps: f64,
    ) -> Result<HostScales, GpuError> {
        check::vector("col_scales: m", m, V.cols);
        let ones = vec![1.0f64; V.rows];
        let alpha = alpha.map_or(&ones[..], |a| &a.0[..]);
        assert_eq!(
            alpha.len(),
            V.rows,
            "col_scales: alpha holds one value per row"
        );
        // Column sums run over rows in order, all columns at once (merge::math's loop order;
        // each column's sum sees the same sequence of additions either way).
        let mut sums = vec![0.0f64; V.cols];
        if V.cols > 0 {
            for (row, &a) in V.data.chunks_exact(V.cols).zip(alpha) {
                for (s, &x) in sums.iter_mut().zip(row) {
                    let h = a * f64::from(x);
                    *s += h * h;
                }
            }
        }
        let beta = sums
            .iter()
            .zip(&m.data)
            .map(|(s, &m)| f64::from(m) / (s.sqrt() + eps))
            .collect();
        Ok(HostScales(beta))
    }

    #[track_caller]
    fn accumulate_normalised(
        &mut self,
        D: &mut HostMat,
        w: f64,
        V: &HostMat,
        W0: &HostMat,
        alpha: Option<&HostScales>,
        beta: Option<&HostScales>,
    ) -> Result<(), GpuError> {
        check::same("accumulate_normalised: D, V", D, V);
        check::same("accumulate_normalised: D, W0", D, W0);
        let (rows, cols) = (D.rows, D.cols);
        let (ones_r, ones_c) = (vec![1.0f64; rows], vec![1.0f64; cols]);
        let alpha = alpha.map_or(&ones_r[..], |a| &a.0[..]);
        let beta = beta.map_or(&ones_c[..], |b| &b.0[..]);
        assert!(
            alpha.len() == rows && beta.len() == cols,
            "accumulate_normalised: {} row and {} column factors for ({rows}, {cols})",
            alpha.len(),
            beta.len()
        );
        if cols == 0 {
            return Ok(());
        }
        let rows_iter = D.data.chunks_exact_mut(cols).zip(V.data.chunks_exact(cols));
        for ((Di, Vi), (W0i, &a)) in rows_iter.zip(W0.data.chunks_exact(cols).zip(alpha)) {
            for (((d, &v), &w0), &b) in Di.iter_mut().zip(Vi).zip(W0i).zip(beta) {
                *d = arith::normalised_contribution(*d, w, v, w0, a, b);
            }
        }
        Ok(())
    }

    #[track_caller]
    fn accumulate_scaled(
        &mut self,
        D: &mut HostMat,
        coef: f64,
        X: &HostMat,
    ) -> Result<(), GpuError> {
        check::same("accumulate_scaled: D, X", D, X);
        for (d, &x) in D.data.iter_mut().zip(&X.data) {
            *d = arith::scaled_contribution(*d, coef, x);
        }
        Ok(())
    }

    fn download_scales(&mut self, s: &HostScales) -> Result<Vec<f64>, GpuError> {
        Ok(s.0.clone())
    }

    #[track_caller]
    fn add_narrow(
        &mut self,
        base: &HostMat,
        delta: &HostMat,
        dtype: DType,
        out: &mut [u8],
    ) -> Result<Option<NonFinite>, GpuError> {
        check::same("add_narrow: base, delta", base, delta);
        let size = output_size(dtype)?;
        assert_eq!(
            out.len(),
            base.len() * size,
            "add_narrow: output byte length"
        );
        let mut first = None;
        let sums = base
            .data
            .iter()
            .zip(&delta.data)
            .map(|(&b, &d)| arith::sum_bits(b, d));
        for (index, (o, s)) in out.chunks_exact_mut(size).zip(sums).enumerate() {
            if first.is_none() && !f32::from_bits(s).is_finite() {
                first = Some(NonFinite {
                    index,
                    value: f32::from_bits(s),
                });
            }
            match dtype {
                DType::BF16 => o.copy_from_slice(&arith::narrow_bits_bf16(s).to_le_bytes()),
                DType::F16 => o.copy_from_slice(&arith::narrow_bits_f16(s).to_le_bytes()),
                _ => o.copy_from_slice(&s.to_le_bytes()),
            }
        }
        Ok(first)
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
