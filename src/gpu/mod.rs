//! The optional CUDA backend, chosen at run time, with the same semantics as the CPU path.
//!
//! Owns: device selection (`--device auto|cpu|cuda`, [`DeviceChoice`], [`select`], the cheap
//! [`probe`]), the CUDA implementation of `backend::Backend` ([`CudaBackend`]), the CUDA C
//! kernels under `kernels/` and their run-time compilation through NVRTC ([`kernels`]),
//! cuBLAS GEMMs, the cuSOLVER `gesvd` route to LoRA-XS bases, and the engine of
//! extraction's truncated SVDs ([`CudaEngine`]: `dgemm` products, `gesvd`). Does not own: the op set,
//! its CPU reference implementation and the element arithmetic every kernel mirrors
//! (`backend`), which ops a merge runs (`merge`), the SVD basis cache or the sign convention
//! (`linalg`), tensor I/O (`io`).
//!
//! # Optional at build time and at run time
//! cudarc loads every CUDA library with `dlopen` when it is first used, so the crate builds
//! and runs without CUDA. cudarc panics when a library is missing, so nothing here calls into
//! a library before [`probe`] has checked that it loads (`sys::is_culib_present`) and that
//! the driver is new enough for the CUDA 13 bindings; a missing piece becomes
//! [`BackendError::Unavailable`](crate::backend::BackendError::Unavailable), never a panic.
//!
//! # Same semantics as the CPU path
//! * Conversions (`widen`, `narrow`, `add_narrow`) and the DoRA/BoRA and diff accumulation
//!   steps are bit-identical on both backends: the kernels are integer bit arithmetic or fixed
//!   sequences of single IEEE operations (f64 where `merge::math` computes in f64), written
//!   once in `backend::arith` (used by the CPU backend and checked against `codec::dtype` by the tests)
//!   and mirrored in `kernels/*.cu`.
//! * Row/column norms and DoRA/BoRA scales are bit-identical: f64 accumulation in index order,
//!   one thread per sum, exactly `linalg::norms` and `merge::math`.
//! * Low-rank products are f32 GEMMs: cuBLAS (pedantic math, no TF32, no atomics, one handle
//!   per stream) versus faer. Both are deterministic run to run, but they sum in different
//!   orders, so products agree to f32 rounding, not bit for bit; after the final rounding to
//!   bf16 an element can differ by one ulp where the exact value sits next to a rounding
//!   boundary.
//! * LoRA-XS bases: cuSOLVER `gesvd` in f64 versus faer's SVD in f64, then the same host-side
//!   `linalg::canonicalize_signs` and the same single rounding to f32. They agree to about one
//!   f32 ulp, not bit for bit, so the SVD cache keys an entry by engine (`linalg::engine`)
//!   and a CUDA merge's bases are its own (`merge::device`, "-xs bases").

pub mod cuda;
pub mod device;
pub mod kernels;

mod blas;
mod staging;
mod svd;
mod truncate;

pub use cuda::{CudaBackend, DeviceMat, DeviceScales};
pub use device::{CudaDevice, DeviceChoice, DeviceInfo, Selected, Selection, probe, select};
pub use kernels::{Kernel, KernelDType, KernelFile, Op};
pub use truncate::CudaEngine;
