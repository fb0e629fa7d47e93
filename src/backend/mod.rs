//! The op set a merge's whole-tensor program is written against, its CPU implementation, and
//! the element arithmetic every implementation shares.
//!
//! Owns: [`Backend`] (the op set), [`MatShape`], [`ScalesLen`], [`NonFinite`],
//! [`BackendKind`], [`BackendError`], the CPU implementation ([`CpuBackend`] with its
//! [`HostMat`], in `cpu`) and the element formulas ([`arith`]: the DoRA/BoRA scales and
//! contributions, diff accumulation, the NaN rule and the roundings), which the band route
//! (`merge::math`), [`CpuBackend`] and the CUDA kernels (`gpu`, mirrored in `kernels/*.cu`)
//! all compute with. Does not own: the CUDA implementation (`gpu`, which is CUDA only), or
//! which ops a merge runs (`merge::device`).
//!
//! A merge of one base tensor on a backend is a short program over these ops
//! (`merge::device::merge_whole`), run on either backend:
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
//! The element steps are [`arith`]'s functions, the same ones `merge::math` computes its
//! bands with (f64 norms and scales, the combination in f64 rounded once into the f32
//! accumulator), so on one machine the routes differ only where a GEMM is involved and in
//! the order contributions are summed (`merge::device`, "The two routes").
//!
//! Matrices are row-major f32; a vector is an (n, 1) or (1, n) matrix. Shape preconditions are
//! programmer errors and panic (`#[track_caller]`); user shape errors are caught when binding
//! adapters, before any op runs.

#![allow(non_snake_case)]

pub mod arith;
mod cpu;
mod error;

pub use cpu::{CpuBackend, HostMat, HostScales};
pub use error::BackendError;

use crate::codec::dtype::UnsupportedDType;
use crate::io::DType;
use crate::linalg::XsBases;

/// Which implementation a backend is (for labels in reports and test names).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BackendKind {
    /// [`CpuBackend`].
    Cpu,
    /// `gpu::CudaBackend`.
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
    fn attach(&mut self) -> Result<(), BackendError> {
        Ok(())
    }

    /// A matrix holding `data` ((rows, cols) row-major).
    fn upload(&mut self, data: &[f32], rows: usize, cols: usize)
    -> Result<Self::Mat, BackendError>;

    /// The f32 values of `bytes` (little-endian `dtype` storage, (rows, cols)), exactly as
    /// `codec::dtype::widen_to_f32`.
    fn widen(
        &mut self,
        dtype: DType,
        bytes: &[u8],
        rows: usize,
        cols: usize,
    ) -> Result<Self::Mat, BackendError>;

    /// A (rows, cols) matrix of +0.0.
    fn zeros(&mut self, rows: usize, cols: usize) -> Result<Self::Mat, BackendError>;

    /// A copy of `src`.
    fn duplicate(&mut self, src: &Self::Mat) -> Result<Self::Mat, BackendError>;

    /// `W ← W + s·B·A` with `W` (out, in), `B` (out, r), `A` (r, in), f32 GEMM.
    fn add_scaled_product(
        &mut self,
        W: &mut Self::Mat,
        s: f32,
        B: &Self::Mat,
        A: &Self::Mat,
    ) -> Result<(), BackendError>;

    /// `W ← W + s·(U·M)·Vᵀ` with `W` (out, in), `U` (out, r), `M` (r, r), `V` (in, r): first
    /// `B' = U·M` in f32, then `W ← W + s·B'·Vᵀ` (the order of `linalg::add_xs_update`).
    fn add_xs_update(
        &mut self,
        W: &mut Self::Mat,
        s: f32,
        U: &Self::Mat,
        M: &Self::Mat,
        V: &Self::Mat,
    ) -> Result<(), BackendError>;

    /// The (rows, 1) row norms of `X` rounded to f32 (f64 accumulation in index order,
    /// `linalg::norms`).
    fn row_norms(&mut self, X: &Self::Mat) -> Result<Self::Mat, BackendError>;

    /// The (1, cols) column norms of `X` rounded to f32 (f64 accumulation in index order).
    fn col_norms(&mut self, X: &Self::Mat) -> Result<Self::Mat, BackendError>;

    /// DoRA's row factors `α_i = m_i / (‖V_i‖ + ε)` in f64 (`m` holds `V.rows()` values).
    fn row_scales(
        &mut self,
        V: &Self::Mat,
        m: &Self::Mat,
        eps: f64,
    ) -> Result<Self::Scales, BackendError>;

    /// The column factors `β_j = m_j / (‖(α ⊙ V)_j‖ + ε)` in f64, with `α` the row factors
    /// (BoRA) or 1 (dora-cols); `m` holds `V.cols()` values.
    fn col_scales(
        &mut self,
        V: &Self::Mat,
        alpha: Option<&Self::Scales>,
        m: &Self::Mat,
        eps: f64,
    ) -> Result<Self::Scales, BackendError>;

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
    ) -> Result<(), BackendError>;

    /// One full-tensor diff: `D ← D + f32(coef·X)` element-wise.
    fn accumulate_scaled(
        &mut self,
        D: &mut Self::Mat,
        coef: f64,
        X: &Self::Mat,
    ) -> Result<(), BackendError>;

    /// The values of a scale vector.
    fn download_scales(&mut self, s: &Self::Scales) -> Result<Vec<f64>, BackendError>;

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
    ) -> Result<Option<NonFinite>, BackendError>;

    /// Writes `src` rounded once to `dtype` (BF16, F16 or F32) into `out`, exactly as
    /// `codec::dtype::narrow_from_f32`.
    fn narrow(&mut self, src: &Self::Mat, dtype: DType, out: &mut [u8])
    -> Result<(), BackendError>;

    /// The values of `src`, row-major.
    fn download(&mut self, src: &Self::Mat) -> Result<Vec<f32>, BackendError>;

    /// The rank-`r` LoRA-XS bases of `W` ((out, in) row-major f32): a full thin SVD in f64,
    /// `linalg::canonicalize_signs`, truncation, one rounding to f32 (`linalg::xs_bases`).
    /// The whole-tensor merge routes compute their bases with it (`merge::xs`), each keyed
    /// in the SVD cache by its engine (`merge::device`, "-xs bases").
    fn xs_bases(
        &mut self,
        W: &[f32],
        out: usize,
        inp: usize,
        r: usize,
    ) -> Result<XsBases, BackendError>;
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
pub(crate) fn output_size(dtype: DType) -> Result<usize, BackendError> {
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
