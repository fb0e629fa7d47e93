//! The one error type of every backend op and of choosing the CUDA device.
//!
//! Owns: [`BackendError`]. The data errors (an SVD that fails, a dtype no op converts) come
//! from any backend; the others from the CUDA one (`gpu`): every variant names what failed
//! (the library, the kernel file and entry point, or the CUDA call) and carries the library's
//! own message as text, so the error is `Clone` (a failed module load is cached and reported
//! again on the next use).

use crate::codec::dtype::UnsupportedDType;
use crate::linalg::LinalgError;

/// Why a backend operation (or choosing the CUDA device at all) failed.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum BackendError {
    /// No usable CUDA device: a library is missing, the driver is too old, no device exists,
    /// or the context could not be created. `reason` says which, and what to do.
    #[error("CUDA is unavailable: {reason}")]
    Unavailable {
        /// What is missing and what to do about it.
        reason: String,
    },
    /// NVRTC rejected a kernel source (a wanbake bug, or an NVRTC too old for the target).
    #[error("{module}: NVRTC could not compile it for {target}: {log}")]
    Compile {
        /// The kernel file, e.g. `kernels/convert.cu`.
        module: &'static str,
        /// What it was compiled for, e.g. `sm_90 (cubin)` or `PTX (NVRTC default)`.
        target: String,
        /// The NVRTC error and log.
        log: String,
    },
    /// A compiled module lacks an entry point wanbake expects.
    #[error("missing kernel '{kernel}' in {module}: {detail}")]
    MissingKernel {
        /// The kernel file.
        module: &'static str,
        /// The entry point, `{op}_{dtype}`.
        kernel: String,
        /// The driver's answer.
        detail: String,
    },
    /// The driver refused to load a compiled module.
    #[error("{module}: the CUDA driver could not load the compiled module: {detail}")]
    Load {
        /// The kernel file.
        module: &'static str,
        /// The driver's answer.
        detail: String,
    },
    /// A CUDA driver, cuBLAS or cuSOLVER call failed.
    #[error("CUDA: {op}: {detail}")]
    Cuda {
        /// What was being done, e.g. `launching 'widen_bf16' (kernels/convert.cu)`.
        op: String,
        /// The library's error.
        detail: String,
    },
    /// The SVD's preconditions or convergence (shared with the CPU path).
    #[error(transparent)]
    Linalg(#[from] LinalgError),
    /// A dtype the backend cannot convert.
    #[error(transparent)]
    UnsupportedDType(#[from] UnsupportedDType),
}

impl BackendError {
    /// A failed CUDA call, with what was being done.
    pub(crate) fn cuda(op: impl Into<String>, err: impl std::fmt::Display) -> BackendError {
        BackendError::Cuda {
            op: op.into(),
            detail: err.to_string(),
        }
    }

    /// An unavailable device.
    pub(crate) fn unavailable(reason: impl Into<String>) -> BackendError {
        BackendError::Unavailable {
            reason: reason.into(),
        }
    }
}
