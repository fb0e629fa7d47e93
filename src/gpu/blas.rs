//! Row-major f32 and f64 GEMMs through column-major cuBLAS, with deterministic settings.
//!
//! Owns: the mapping of a row-major product onto `cublas{S,D}gemm` arguments ([`row_major`],
//! checked on the CPU against a reference column-major GEMM in the tests), the handle set-up
//! ([`configure`]) and the call ([`gemm`]). Does not own: which products a merge computes.
//!
//! A row-major (m, n) buffer is, read column-major, the transpose (n, m). So
//! `C = op(L)·op(R)` in row-major is `Cᵀ = op(R)ᵀ·op(L)ᵀ` in column-major: cuBLAS gets the
//! right factor's buffer first and the left factor's second, with the transposition flags
//! and leading dimensions of the row-major layouts, and never copies or transposes anything.
//!
//! Determinism ([`configure`]): math mode `CUBLAS_PEDANTIC_MATH` (plain FP32 and FP64: no
//! TF32, no tensor-op, emulated or reduced-precision shortcuts), atomics mode `CUBLAS_ATOMICS_NOT_ALLOWED` (no
//! split-K reductions through atomics), and a private workspace of fixed size per handle with
//! one handle per stream (what `CUBLAS_WORKSPACE_CONFIG` arranges for multi-stream programs).
//! cuBLAS documents bit-wise reproducible results under these conditions for a given toolkit
//! version, GPU architecture and SM count.

use std::ffi::c_int;

use cudarc::cublas::sys::{
    cublasAtomicsMode_t, cublasMath_t, cublasOperation_t, cublasSetAtomicsMode, cublasSetMathMode,
    cublasSetWorkspace_v2,
};
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtrMut};

use crate::backend::BackendError;

/// Bytes of the private cuBLAS workspace of each handle (NVIDIA's recommendation for Hopper,
/// `CUBLAS_WORKSPACE_CONFIG=:4096:8`).
pub(crate) const WORKSPACE_BYTES: usize = 32 << 20;

/// `cublas{S,D}gemm` arguments (column-major).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ColMajorGemm {
    /// Transpose the first operand.
    pub transa: bool,
    /// Transpose the second operand.
    pub transb: bool,
    /// Rows of the column-major result.
    pub m: usize,
    /// Columns of the column-major result.
    pub n: usize,
    /// The reduction length.
    pub k: usize,
    /// Leading dimension of the first operand.
    pub lda: usize,
    /// Leading dimension of the second operand.
    pub ldb: usize,
    /// Leading dimension of the result.
    pub ldc: usize,
}

/// The column-major call computing the row-major product `C (m, n) = op(L)·op(R)`, where the
/// left factor `L` is stored row-major as (m, k), or (k, m) when `left_t`, and the right
/// factor `R` as (k, n), or (n, k) when `right_t`. The call's first operand is R's buffer,
/// its second L's. Needs `m, n, k ≥ 1`.
pub(crate) fn row_major(m: usize, n: usize, k: usize, left_t: bool, right_t: bool) -> ColMajorGemm {
    ColMajorGemm {
        transa: right_t,
        transb: left_t,
        m: n,
        n: m,
        k,
        lda: if right_t { k } else { n },
        ldb: if left_t { m } else { k },
        ldc: n,
    }
}

/// Sets the deterministic modes on `blas` and gives it `workspace` (see the module doc).
pub(crate) fn configure(
    blas: &CudaBlas,
    stream: &std::sync::Arc<CudaStream>,
    workspace: &mut CudaSlice<u8>,
) -> Result<(), BackendError> {
    let handle = *blas.handle();
    // SAFETY: `handle` is the live handle of `blas`; the enum values are valid modes.
    unsafe { cublasSetMathMode(handle, cublasMath_t::CUBLAS_PEDANTIC_MATH) }
        .result()
        .map_err(|e| BackendError::cuda("cublasSetMathMode(PEDANTIC)", e))?;
    // SAFETY: as above.
    unsafe { cublasSetAtomicsMode(handle, cublasAtomicsMode_t::CUBLAS_ATOMICS_NOT_ALLOWED) }
        .result()
        .map_err(|e| BackendError::cuda("cublasSetAtomicsMode(NOT_ALLOWED)", e))?;
    let bytes = workspace.len();
    let (ptr, _record) = workspace.device_ptr_mut(stream);
    // SAFETY: `ptr` addresses `bytes` bytes of device memory owned by the backend, which keeps
    // `workspace` alive as long as `blas` and uses it for nothing else; cuBLAS only needs
    // 256-byte alignment, which cuMemAlloc gives.
    unsafe { cublasSetWorkspace_v2(handle, ptr as *mut std::ffi::c_void, bytes) }
        .result()
        .map_err(|e| BackendError::cuda("cublasSetWorkspace", e))
}

/// The element types [`gemm`] multiplies, with the name of their cuBLAS call.
pub(crate) trait GemmFloat: cudarc::driver::DeviceRepr {
    /// `cublasSgemm` or `cublasDgemm`.
    const CALL: &'static str;
}

impl GemmFloat for f32 {
    const CALL: &'static str = "cublasSgemm";
}

impl GemmFloat for f64 {
    const CALL: &'static str = "cublasDgemm";
}

/// `C ← α·op(L)·op(R) + β·C` for row-major device matrices, with `call = row_major(…)`:
/// `first` is R's buffer, `second` L's. Shapes are checked against `call` (programmer error).
#[track_caller]
pub(crate) fn gemm<T: GemmFloat>(
    blas: &CudaBlas,
    call: ColMajorGemm,
    alpha: T,
    first: &CudaSlice<T>,
    second: &CudaSlice<T>,
    beta: T,
    c: &mut CudaSlice<T>,
) -> Result<(), BackendError>
where
    CudaBlas: Gemm<T>,
{
    let ColMajorGemm { m, n, k, .. } = call;
    assert!(
        first.len() >= m * k && second.len() >= k * n && c.len() >= m * n,
        "gemm: buffers ({}, {}, {}) too small for m={m} n={n} k={k}",
        first.len(),
        second.len(),
        c.len()
    );
    let int = |v: usize, what: &str| {
        c_int::try_from(v).map_err(|_| {
            BackendError::cuda(
                T::CALL,
                format!("{what} = {v} exceeds cuBLAS's 32-bit dimension limit"),
            )
        })
    };
    let op = |t: bool| {
        if t {
            cublasOperation_t::CUBLAS_OP_T
        } else {
            cublasOperation_t::CUBLAS_OP_N
        }
    };
    let cfg = GemmConfig {
        transa: op(call.transa),
        transb: op(call.transb),
        m: int(m, "m")?,
        n: int(n, "n")?,
        k: int(k, "k")?,
        alpha,
        lda: int(call.lda.max(1), "lda")?,
        ldb: int(call.ldb.max(1), "ldb")?,
        beta,
        ldc: int(call.ldc.max(1), "ldc")?,
    };
    // SAFETY: cublas{S,D}gemm reads op(first) (m×k, ld lda), op(second) (k×n, ld ldb) and writes
    // c (m×n, ld ldc); `row_major` chose the leading dimensions of the stored layouts, so the
    // last element touched is at most m·k − 1, k·n − 1 and m·n − 1, within the lengths
    // asserted above. All three buffers live on this context; cudarc orders them on the
    // handle's stream.
    unsafe { blas.gemm(cfg, first, second, c) }
        .map_err(|e| BackendError::cuda(format!("{} (m={m}, n={n}, k={k})", T::CALL), e))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// Reference column-major GEMM with BLAS semantics (`C ← α·op(A)·op(B) + β·C`, `a` the
    /// call's first operand), accumulating in f64.
    pub(crate) fn gemm_ref<T: Copy + Into<f64>>(
        g: ColMajorGemm,
        (alpha, beta): (f64, f64),
        a: &[T],
        b: &[T],
        c: &mut [f64],
    ) {
        for j in 0..g.n {
            for i in 0..g.m {
                let mut acc = 0.0f64;
                for p in 0..g.k {
                    let av = if g.transa {
                        a[p + i * g.lda]
                    } else {
                        a[i + p * g.lda]
                    };
                    let bv = if g.transb {
                        b[j + p * g.ldb]
                    } else {
                        b[p + j * g.ldb]
                    };
                    acc += av.into() * bv.into();
                }
                let ci = &mut c[i + j * g.ldc];
                *ci = alpha * acc + beta * *ci;
            }
        }
    }

    /// Row-major element (i, j) of a matrix stored (rows, cols), optionally read transposed.
    fn at(x: &[f32], cols: usize, i: usize, j: usize, t: bool, rows_t: usize) -> f32 {
        if t {
            x[j * rows_t + i]
        } else {
            x[i * cols + j]
        }
    }

    #[test]
    fn row_major_mapping_matches_the_row_major_product() {
        // Small integers: every product and sum is exact in f32 and f64.
        for (m, n, k) in [(1, 1, 1), (3, 5, 2), (5, 3, 4), (4, 4, 7), (2, 6, 1)] {
            for a_t in [false, true] {
                for b_t in [false, true] {
                    // Left factor L (`a`) and right factor R (`b`).
                    let a: Vec<f32> = (0..m * k).map(|v| (v % 7) as f32 - 3.0).collect();
                    let b: Vec<f32> = (0..k * n).map(|v| (v % 5) as f32 - 2.0).collect();
                    let c0: Vec<f32> = (0..m * n).map(|v| v as f32).collect();
                    let mut c: Vec<f64> = c0.iter().map(|&x| f64::from(x)).collect();
                    gemm_ref(row_major(m, n, k, a_t, b_t), (2.0, 1.0), &b, &a, &mut c);
                    for i in 0..m {
                        for j in 0..n {
                            let mut want = 0.0f32;
                            for p in 0..k {
                                // op(L) (m×k): stored (m,k), or (k,m) read transposed.
                                let av = at(&a, k, i, p, a_t, m);
                                let bv = at(&b, n, p, j, b_t, k);
                                want += av * bv;
                            }
                            let want = c0[i * n + j] + 2.0 * want;
                            assert_eq!(
                                c[i * n + j],
                                f64::from(want),
                                "m={m} n={n} k={k} a_t={a_t} b_t={b_t} at ({i}, {j})"
                            );
                        }
                    }
                }
            }
        }
    }
}
