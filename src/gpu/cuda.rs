//! The CUDA implementation of [`Backend`]: one lane = one stream, one cuBLAS handle, one
//! staging pair of pinned buffers.
//!
//! Owns: [`CudaBackend`], [`DeviceMat`], the kernel launches (each with its argument list in a
//! `// SAFETY:` comment), and the wiring of GEMMs (`super::blas`) and the SVD (`super::svd`).
//! Does not own: compiling kernels (`super::kernels`), choosing the device (`super::device`).
//!
//! # The pipeline
//! Every op of a lane is queued on the lane's stream in program order, so within a lane no
//! event or barrier is needed between ops; the host blocks only where it must: when it
//! refills a pinned staging buffer the device is still reading, and when it copies results
//! out (`narrow`, `add_narrow`, `download`, the SVD outputs).
//!
//! * Within a lane, transfers overlap host work chunk by chunk (`super::staging`): while chunk
//!   c of a base tensor crosses PCIe, the CPU reads chunk c+1 from the mmap (the actual disk
//!   read) into the other pinned buffer; downloads do the same in reverse.
//! * Across tensors, a merge's worker threads share a small pool of lanes from
//!   [`super::CudaDevice::backend`] (`pipeline::Lanes`, at most
//!   `pipeline::compute::MAX_LANES`): while one worker's tensor is being computed, another reads
//!   its next tensor from disk and a third writes its previous result (or copies untouched
//!   tensors), so the GPU work (microseconds to milliseconds per tensor) hides behind I/O and
//!   the bake is I/O-bound.
//!   Lanes share the context and the loaded kernels and nothing else, so no cross-stream
//!   synchronisation exists to get wrong. Output order is decided by the writer, as on the
//!   CPU path, not by which lane finishes first.
//!
//! Device memory is allocated per op with cudarc's stream-ordered allocator (`cuMemAllocAsync`
//! from the device's memory pool, freed in stream order when a [`DeviceMat`] drops). The pool
//! keeps what it has reserved across synchronisations (`super::device` sets its release
//! threshold), so a target's allocations reuse the previous target's memory instead of
//! mapping it again. Only buffers that are accumulated into are zero-filled (the
//! [`Backend::zeros`] accumulator); every other buffer is fully written before it is read
//! (uploads, widen and narrow outputs, norms and scales, GEMM outputs with β = 0, the SVD's
//! outputs), so it is allocated uninitialised. [`CudaBackend::zeroed_bytes`] counts the
//! zero-filled bytes.

#![allow(non_snake_case)]

use std::cell::Cell;
use std::sync::Arc;

use cudarc::cublas::CudaBlas;
use cudarc::cusolver::DnHandle;
use cudarc::cusolver::sys::cusolverDeterministicMode_t;
use cudarc::driver::{
    CudaContext, CudaSlice, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg, ValidAsZeroBits,
};

use super::blas::{self, WORKSPACE_BYTES, row_major};
use super::device::CudaDevice;
use super::kernels::{Kernel, KernelDType, KernelTable, Op};
use super::staging::PinnedStaging;
use super::svd::{GesvdPlan, gesvd};
use crate::backend::BackendError;
use crate::backend::arith;
use crate::backend::{Backend, BackendKind, MatShape, NonFinite, ScalesLen, check, output_size};
use crate::codec::dtype::{UnsupportedDType, to_f32_vec};
use crate::io::DType;
use crate::linalg::{LinalgError, XsBases};

/// Threads per block of every launch.
const BLOCK: u32 = 256;

/// A row-major f32 matrix in device memory.
#[derive(Debug)]
pub struct DeviceMat {
    rows: usize,
    cols: usize,
    /// At least `max(rows·cols, 1)` values (never empty, so no zero-byte allocation).
    buf: CudaSlice<f32>,
}

impl MatShape for DeviceMat {
    fn rows(&self) -> usize {
        self.rows
    }
    fn cols(&self) -> usize {
        self.cols
    }
}

/// A vector of f64 factors in device memory.
#[derive(Debug)]
pub struct DeviceScales {
    len: usize,
    /// At least `max(len, 1)` values.
    buf: CudaSlice<f64>,
}

impl ScalesLen for DeviceScales {
    fn len(&self) -> usize {
        self.len
    }
}

/// One lane of the CUDA backend (see the module doc). Not `Sync`: give each worker its own.
pub struct CudaBackend {
    ctx: Arc<CudaContext>,
    pub(super) stream: Arc<CudaStream>,
    kernels: Arc<KernelTable>,
    /// Declared before its workspace, so it is destroyed first.
    pub(super) blas: CudaBlas,
    _blas_workspace: CudaSlice<u8>,
    /// Created and set to deterministic results with the lane (under the guard of
    /// `CudaDevice::backend`: cudarc panics on a missing symbol).
    pub(super) solver: DnHandle,
    pub(super) staging: PinnedStaging,
    /// Bytes zero-filled so far (see the module doc).
    zeroed: Cell<u64>,
}

impl CudaBackend {
    /// A new lane on `device`.
    pub(crate) fn new(device: &CudaDevice) -> Result<CudaBackend, BackendError> {
        let ctx = device.ctx.clone();
        ctx.bind_to_thread()
            .map_err(|e| BackendError::cuda("binding the CUDA context", e))?;
        let stream = ctx
            .new_stream()
            .map_err(|e| BackendError::cuda("creating a stream", e))?;
        let blas =
            CudaBlas::new(stream.clone()).map_err(|e| BackendError::cuda("creating cuBLAS", e))?;
        // SAFETY: cuBLAS uses its workspace as scratch and never reads what it did not write.
        let mut workspace = unsafe { stream.alloc::<u8>(WORKSPACE_BYTES) }
            .map_err(|e| BackendError::cuda("allocating the cuBLAS workspace", e))?;
        blas::configure(&blas, &stream, &mut workspace)?;
        let solver = deterministic_solver(&stream)?;
        let staging = PinnedStaging::new(&ctx)?;
        Ok(CudaBackend {
            ctx,
            stream,
            kernels: device.kernels.clone(),
            blas,
            _blas_workspace: workspace,
            solver,
            staging,
            zeroed: Cell::new(0),
        })
    }

    /// Bytes this lane has zero-filled so far: only [`Backend::zeros`] accumulators.
    pub fn zeroed_bytes(&self) -> u64 {
        self.zeroed.get()
    }

    /// Whether this lane's cuSOLVER handle is in deterministic-results mode.
    pub fn solver_is_deterministic(&self) -> Result<bool, BackendError> {
        let mut mode = cusolverDeterministicMode_t::CUSOLVER_ALLOW_NON_DETERMINISTIC_RESULTS;
        // SAFETY: the handle is live; the call writes one mode through a valid pointer.
        unsafe {
            cudarc::cusolver::sys::cusolverDnGetDeterministicMode(self.solver.cu(), &mut mode)
        }
        .result()
        .map_err(|e| BackendError::cuda("cusolverDnGetDeterministicMode", e))?;
        Ok(mode == cusolverDeterministicMode_t::CUSOLVER_DETERMINISTIC_RESULTS)
    }

    /// Makes this lane's context current on the calling thread (raw library calls need it).
    pub(super) fn bind(&self) -> Result<(), BackendError> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| BackendError::cuda("binding the CUDA context", e))
    }

    /// `max(n, 1)` uninitialised device values of `T`, for a buffer the caller fully writes
    /// (its first `n` values) before anything reads it.
    pub(super) fn alloc<T: DeviceRepr>(
        &self,
        n: usize,
        what: &str,
    ) -> Result<CudaSlice<T>, BackendError> {
        // SAFETY: every caller writes the first n values (an upload of n values, a kernel,
        // GEMM or solver call that writes each output index, a device copy) before they are
        // read, and nothing reads past n; T is plain data with no invalid bit patterns.
        unsafe { self.stream.alloc::<T>(n.max(1)) }.map_err(|e| alloc_error::<T>(n, what, e))
    }

    /// `max(n, 1)` zeroed device values of `T`, for a buffer that is accumulated into.
    fn alloc_zeroed<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        n: usize,
        what: &str,
    ) -> Result<CudaSlice<T>, BackendError> {
        let buf = self
            .stream
            .alloc_zeros::<T>(n.max(1))
            .map_err(|e| alloc_error::<T>(n, what, e))?;
        let bytes = (n.max(1) * std::mem::size_of::<T>()) as u64;
        self.zeroed.set(self.zeroed.get() + bytes);
        Ok(buf)
    }

    /// An uninitialised (rows, cols) matrix the caller fully writes (see [`Self::alloc`]).
    fn mat(&self, rows: usize, cols: usize, what: &str) -> Result<DeviceMat, BackendError> {
        let n = mat_len(rows, cols, what)?;
        Ok(DeviceMat {
            rows,
            cols,
            buf: self.alloc::<f32>(n, what)?,
        })
    }

    /// Names `what` as the last work launched on this lane (see `super::staging`).
    pub(super) fn launched(&mut self, what: impl std::fmt::Display) {
        self.staging.note_launch(what.to_string());
    }

    fn kernel(
        &self,
        op: Op,
        dtype: KernelDType,
    ) -> Result<(Kernel, &cudarc::driver::CudaFunction), BackendError> {
        let kernel = Kernel { op, dtype };
        Ok((kernel, self.kernels.function(kernel)?))
    }
}

/// A cuSOLVER handle on `stream` in deterministic-results mode. Resolves
/// `cusolverDnSetDeterministicMode`, so call it under the guard of `super::device` (cudarc
/// panics on a missing symbol).
pub(crate) fn deterministic_solver(stream: &Arc<CudaStream>) -> Result<DnHandle, BackendError> {
    let solver =
        DnHandle::new(stream.clone()).map_err(|e| BackendError::cuda("creating cuSOLVER", e))?;
    solver
        .set_deterministic_mode(cusolverDeterministicMode_t::CUSOLVER_DETERMINISTIC_RESULTS)
        .map_err(|e| BackendError::cuda("cusolverDnSetDeterministicMode", e))?;
    Ok(solver)
}

fn alloc_error<T>(n: usize, what: &str, e: impl std::fmt::Display) -> BackendError {
    BackendError::cuda(
        format!(
            "allocating {n} × {} bytes for {what}",
            std::mem::size_of::<T>()
        ),
        e,
    )
}

fn mat_len(rows: usize, cols: usize, what: &str) -> Result<usize, BackendError> {
    rows.checked_mul(cols)
        .ok_or_else(|| BackendError::cuda(format!("allocating {what}"), "size overflows"))
}

/// A grid-stride launch over `n` elements.
fn grid_1d(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(BLOCK as usize).clamp(1, 1 << 16) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// A launch with rows on `blockIdx.y` and columns on x (both grid-stride).
fn grid_2d(rows: usize, cols: usize) -> LaunchConfig {
    let x = cols.div_ceil(BLOCK as usize).clamp(1, 1024) as u32;
    let y = rows.clamp(1, 65_535) as u32;
    LaunchConfig {
        grid_dim: (x, y, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn launch_error(kernel: Kernel, e: impl std::fmt::Display) -> BackendError {
    BackendError::cuda(format!("launching {kernel}"), e)
}

fn storage_kernel_dtype(dtype: DType) -> Option<KernelDType> {
    match dtype {
        DType::BF16 => Some(KernelDType::Bf16),
        DType::F16 => Some(KernelDType::F16),
        DType::F32 => Some(KernelDType::F32),
        _ => None,
    }
}

impl CudaBackend {
    /// Runs `narrow_{bf16,f16}` into a device buffer of 16-bit values and copies it to `out`.
    fn narrow16(
        &mut self,
        dtype: KernelDType,
        src: &DeviceMat,
        out: &mut [u8],
    ) -> Result<(), BackendError> {
        let n = src.len();
        let mut dst = self.alloc::<u16>(n, "the narrowed tensor")?;
        let (kernel, f) = self.kernel(Op::Narrow, dtype)?;
        let n64 = n as u64;
        let mut args = self.stream.launch_builder(f);
        args.arg(&src.buf).arg(&mut dst).arg(&n64);
        // SAFETY: narrow_{bf16,f16}(const float* src, u16* dst, u64 n): 3 arguments in this
        // order with these types; src holds ≥ n f32, dst max(n, 1) u16; the kernel touches
        // indices < n only.
        unsafe { args.launch(grid_1d(n)) }.map_err(|e| launch_error(kernel, e))?;
        self.launched(kernel);
        self.staging.download(&self.stream, &dst, out)
    }

    /// Runs `add_narrow_{dtype}` with output elements of type `T` (u16 for bf16/f16, u32 for
    /// f32), copies the result to `out` and returns the first non-finite sum.
    fn add_narrow_as<T: DeviceRepr + ValidAsZeroBits>(
        &mut self,
        dtype: KernelDType,
        base: &DeviceMat,
        delta: &DeviceMat,
        out: &mut [u8],
    ) -> Result<Option<NonFinite>, BackendError> {
        let n = base.len();
        let mut dst = self.alloc::<T>(n, "the merged tensor")?;
        // All ones = "none yet"; uploaded through the pinned staging, so nothing waits.
        let mut first = self.alloc::<u64>(1, "the non-finite marker")?;
        self.staging
            .upload(&self.stream, &u64::MAX.to_le_bytes(), &mut first)?;
        let (kernel, f) = self.kernel(Op::AddNarrow, dtype)?;
        let n64 = n as u64;
        let mut args = self.stream.launch_builder(f);
        args.arg(&base.buf)
            .arg(&delta.buf)
            .arg(&mut dst)
            .arg(&mut first)
            .arg(&n64);
        // SAFETY: add_narrow_{bf16,f16,f32}(const float* base, const float* delta, T* dst, u64*
        // first_non_finite, u64 n): 5 arguments in this order with these types, T = u16 for
        // bf16/f16 and u32 for f32 (the caller pairs them); base and delta hold ≥ n f32 (same
        // shape, checked), dst max(n, 1) T, first_non_finite one u64; the kernel touches
        // indices < n only.
        unsafe { args.launch(grid_1d(n)) }.map_err(|e| launch_error(kernel, e))?;
        self.launched(kernel);
        self.staging.download(&self.stream, &dst, out)?;
        let first = self.stream.clone_dtoh(&first).map_err(|e| {
            self.staging
                .wait_error("downloading the non-finite marker", e)
        })?;
        let index = match first.first() {
            Some(&i) if i != u64::MAX => i as usize,
            _ => return Ok(None),
        };
        let element = |m: &DeviceMat| {
            self.stream
                .clone_dtoh(&m.buf.slice(index..index + 1))
                .map_err(|e| {
                    self.staging
                        .wait_error("downloading a non-finite element", e)
                })
        };
        let (b, d) = (element(base)?, element(delta)?);
        Ok(Some(NonFinite {
            index,
            value: f32::from_bits(arith::sum_bits(b[0], d[0])),
        }))
    }

    /// One of the two f32 norm kernels: `len` norms of `X`.
    fn norms(
        &mut self,
        op: Op,
        X: &DeviceMat,
        shape: (usize, usize),
    ) -> Result<DeviceMat, BackendError> {
        self.bind()?;
        let mut dst = self.mat(shape.0, shape.1, "norms")?;
        let len = dst.len();
        if len == 0 {
            return Ok(dst);
        }
        let (kernel, f) = self.kernel(op, KernelDType::F32)?;
        let (rows, cols) = (X.rows as u64, X.cols as u64);
        let mut args = self.stream.launch_builder(f);
        args.arg(&X.buf).arg(&mut dst.buf).arg(&rows).arg(&cols);
        // SAFETY: row_norms_f32 / col_norms_f32(const float* W, float* dst, u64 rows, u64
        // cols): 4 arguments in this order with these types; W holds rows·cols f32 (a row-major
        // DeviceMat), dst holds `len` f32 = rows (row norms) or cols (column norms); one
        // thread per output index < len.
        unsafe { args.launch(grid_1d(len)) }.map_err(|e| launch_error(kernel, e))?;
        self.launched(kernel);
        Ok(dst)
    }

    /// `len` ones (a missing α or β), uploaded through the pinned staging (no stream sync).
    fn ones(&mut self, len: usize) -> Result<CudaSlice<f64>, BackendError> {
        let mut buf = self.alloc::<f64>(len, "unit factors")?;
        let ones = vec![1.0f64; len];
        self.staging
            .upload(&self.stream, bytemuck::cast_slice(&ones), &mut buf)?;
        Ok(buf)
    }
}

impl Backend for CudaBackend {
    type Mat = DeviceMat;
    type Scales = DeviceScales;

    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }

    fn attach(&mut self) -> Result<(), BackendError> {
        self.bind()
    }

    #[track_caller]
    fn upload(
        &mut self,
        data: &[f32],
        rows: usize,
        cols: usize,
    ) -> Result<DeviceMat, BackendError> {
        check::data("upload", data.len(), rows, cols);
        self.bind()?;
        let mut m = self.mat(rows, cols, "an uploaded matrix")?;
        self.staging
            .upload(&self.stream, bytemuck::cast_slice(data), &mut m.buf)?;
        Ok(m)
    }

    #[track_caller]
    fn widen(
        &mut self,
        dtype: DType,
        bytes: &[u8],
        rows: usize,
        cols: usize,
    ) -> Result<DeviceMat, BackendError> {
        self.bind()?;
        let n = rows * cols;
        let Some(kdtype) = storage_kernel_dtype(dtype) else {
            // F64 and F8 inputs: widened on the host by the definition itself, then uploaded.
            if !dtype.is_float() {
                return Err(UnsupportedDType {
                    dtype,
                    direction: "to",
                }
                .into());
            }
            let values = to_f32_vec(dtype, bytes)?;
            return self.upload(&values, rows, cols);
        };
        let size = dtype.element_bytes();
        assert_eq!(
            bytes.len(),
            n * size,
            "widen: {dtype} bytes for ({rows}, {cols})"
        );
        let mut m = self.mat(rows, cols, "a widened tensor")?;
        if kdtype == KernelDType::F32 {
            // The bits are the values: copy them as they are.
            self.staging.upload(&self.stream, bytes, &mut m.buf)?;
            return Ok(m);
        }
        let mut raw = self.alloc::<u16>(n, "a tensor's raw bytes")?;
        self.staging.upload(&self.stream, bytes, &mut raw)?;
        if n == 0 {
            return Ok(m);
        }
        let (kernel, f) = self.kernel(Op::Widen, kdtype)?;
        let n64 = n as u64;
        let mut args = self.stream.launch_builder(f);
        args.arg(&raw).arg(&mut m.buf).arg(&n64);
        // SAFETY: widen_{bf16,f16}(const u16* src, float* dst, u64 n): 3 arguments in this
        // order with these types; src holds max(n, 1) u16 (n uploaded above), dst max(n, 1)
        // f32; the kernel touches indices < n only.
        unsafe { args.launch(grid_1d(n)) }.map_err(|e| launch_error(kernel, e))?;
        self.launched(kernel);
        Ok(m)
    }

    fn zeros(&mut self, rows: usize, cols: usize) -> Result<DeviceMat, BackendError> {
        self.bind()?;
        let n = mat_len(rows, cols, "a zero matrix")?;
        Ok(DeviceMat {
            rows,
            cols,
            buf: self.alloc_zeroed::<f32>(n, "a zero matrix")?,
        })
    }

    fn duplicate(&mut self, src: &DeviceMat) -> Result<DeviceMat, BackendError> {
        self.bind()?;
        let mut m = self.mat(src.rows, src.cols, "a copy")?;
        self.stream
            .memcpy_dtod(&src.buf, &mut m.buf)
            .map_err(|e| BackendError::cuda("copying a device matrix", e))?;
        Ok(m)
    }

    #[track_caller]
    fn add_scaled_product(
        &mut self,
        W: &mut DeviceMat,
        s: f32,
        B: &DeviceMat,
        A: &DeviceMat,
    ) -> Result<(), BackendError> {
        check::product(W, B, A);
        self.bind()?;
        let (out, inp, r) = (W.rows, W.cols, B.cols);
        if out == 0 || inp == 0 || r == 0 {
            return Ok(());
        }
        // W (out, in) += s · B (out, r) · A (r, in): left = B, right = A.
        let call = row_major(out, inp, r, false, false);
        blas::gemm(&self.blas, call, s, &A.buf, &B.buf, 1.0, &mut W.buf)?;
        self.launched("cublasSgemm");
        Ok(())
    }

    #[track_caller]
    fn add_xs_update(
        &mut self,
        W: &mut DeviceMat,
        s: f32,
        U: &DeviceMat,
        M: &DeviceMat,
        V: &DeviceMat,
    ) -> Result<(), BackendError> {
        check::xs(W, U, M, V);
        self.bind()?;
        let (out, inp, r) = (W.rows, W.cols, U.cols);
        if out == 0 || inp == 0 || r == 0 {
            return Ok(());
        }
        // B' (out, r) = U (out, r) · M (r, r), then W += s · B' · Vᵀ with V stored (in, r).
        // β = 0 for B': cuBLAS then never reads its (uninitialised) contents.
        let mut Bp = self.mat(out, r, "U·M")?;
        blas::gemm(
            &self.blas,
            row_major(out, r, r, false, false),
            1.0,
            &M.buf,
            &U.buf,
            0.0,
            &mut Bp.buf,
        )?;
        let call = row_major(out, inp, r, false, true);
        blas::gemm(&self.blas, call, s, &V.buf, &Bp.buf, 1.0, &mut W.buf)?;
        self.launched("cublasSgemm");
        Ok(())
    }

    fn row_norms(&mut self, X: &DeviceMat) -> Result<DeviceMat, BackendError> {
        self.norms(Op::RowNorms, X, (X.rows, 1))
    }

    fn col_norms(&mut self, X: &DeviceMat) -> Result<DeviceMat, BackendError> {
        self.norms(Op::ColNorms, X, (1, X.cols))
    }

    #[track_caller]
    fn row_scales(
        &mut self,
        V: &DeviceMat,
        m: &DeviceMat,
        eps: f64,
    ) -> Result<DeviceScales, BackendError> {
        check::vector("row_scales: m", m, V.rows);
        self.bind()?;
        let rows = V.rows;
        let mut alpha = DeviceScales {
            len: rows,
            buf: self.alloc::<f64>(rows, "row factors")?,
        };
        if rows == 0 {
            return Ok(alpha);
        }
        let (kernel, f) = self.kernel(Op::RowScales, KernelDType::F32)?;
        let (rows64, cols64) = (rows as u64, V.cols as u64);
        let mut args = self.stream.launch_builder(f);
        args.arg(&V.buf)
            .arg(&m.buf)
            .arg(&eps)
            .arg(&mut alpha.buf)
            .arg(&rows64)
            .arg(&cols64);
        // SAFETY: row_scales_f32(const float* V, const float* m, double eps, double* alpha, u64
        // rows, u64 cols): 6 arguments in this order with these types; V holds rows·cols f32,
        // m and alpha hold rows values (checked / allocated above); one thread per row < rows.
        unsafe { args.launch(grid_1d(rows)) }.map_err(|e| launch_error(kernel, e))?;
        self.launched(kernel);
        Ok(alpha)
    }

    #[track_caller]
    fn col_scales(
        &mut self,
        V: &DeviceMat,
        alpha: Option<&DeviceScales>,
        m: &DeviceMat,
        eps: f64,
    ) -> Result<DeviceScales, BackendError> {
        check::vector("col_scales: m", m, V.cols);
        if let Some(a) = alpha {
            assert_eq!(a.len, V.rows, "col_scales: alpha holds one value per row");
        }
        self.bind()?;
        let cols = V.cols;
        let mut beta = DeviceScales {
            len: cols,
            buf: self.alloc::<f64>(cols, "column factors")?,
        };
        if cols == 0 {
            return Ok(beta);
        }
        let ones;
        let alpha = match alpha {
            Some(a) => &a.buf,
            None => {
                ones = self.ones(V.rows)?;
                &ones
            }
        };
        let (kernel, f) = self.kernel(Op::ColScales, KernelDType::F32)?;
        let (rows64, cols64) = (V.rows as u64, cols as u64);
        let mut args = self.stream.launch_builder(f);
        args.arg(&V.buf)
            .arg(alpha)
            .arg(&m.buf)
            .arg(&eps)
            .arg(&mut beta.buf)
            .arg(&rows64)
            .arg(&cols64);
        // SAFETY: col_scales_f32(const float* V, const double* alpha, const float* m, double
        // eps, double* beta, u64 rows, u64 cols): 7 arguments in this order with these types;
        // V holds rows·cols f32, alpha max(rows, 1) f64, m and beta cols values (checked /
        // allocated above); one thread per column < cols.
        unsafe { args.launch(grid_1d(cols)) }.map_err(|e| launch_error(kernel, e))?;
        self.launched(kernel);
        Ok(beta)
    }

    #[track_caller]
    fn accumulate_normalised(
        &mut self,
        D: &mut DeviceMat,
        w: f64,
        V: &DeviceMat,
        W0: &DeviceMat,
        alpha: Option<&DeviceScales>,
        beta: Option<&DeviceScales>,
    ) -> Result<(), BackendError> {
        check::same("accumulate_normalised: D, V", D, V);
        check::same("accumulate_normalised: D, W0", D, W0);
        let (rows, cols) = (D.rows, D.cols);
        assert!(
            alpha.is_none_or(|a| a.len == rows) && beta.is_none_or(|b| b.len == cols),
            "accumulate_normalised: factor lengths do not match ({rows}, {cols})"
        );
        self.bind()?;
        if D.is_empty() {
            return Ok(());
        }
        let (ones_r, ones_c);
        let alpha = match alpha {
            Some(a) => &a.buf,
            None => {
                ones_r = self.ones(rows)?;
                &ones_r
            }
        };
        let beta = match beta {
            Some(b) => &b.buf,
            None => {
                ones_c = self.ones(cols)?;
                &ones_c
            }
        };
        let (kernel, f) = self.kernel(Op::AccumulateNormalised, KernelDType::F32)?;
        let (rows64, cols64) = (rows as u64, cols as u64);
        let mut args = self.stream.launch_builder(f);
        args.arg(&mut D.buf)
            .arg(&w)
            .arg(&V.buf)
            .arg(&W0.buf)
            .arg(alpha)
            .arg(beta)
            .arg(&rows64)
            .arg(&cols64);
        // SAFETY: accumulate_normalised_f32(float* D, double w, const float* V, const float*
        // W0, const double* alpha, const double* beta, u64 rows, u64 cols): 8 arguments in this
        // order with these types; D, V and W0 hold rows·cols f32 (same shape, checked), alpha
        // rows f64 and beta cols f64 (checked, or unit vectors of those lengths); indices stay
        // below rows and cols.
        unsafe { args.launch(grid_2d(rows, cols)) }.map_err(|e| launch_error(kernel, e))?;
        self.launched(kernel);
        Ok(())
    }

    #[track_caller]
    fn accumulate_scaled(
        &mut self,
        D: &mut DeviceMat,
        coef: f64,
        X: &DeviceMat,
    ) -> Result<(), BackendError> {
        check::same("accumulate_scaled: D, X", D, X);
        self.bind()?;
        let n = D.len();
        if n == 0 {
            return Ok(());
        }
        let (kernel, f) = self.kernel(Op::AccumulateScaled, KernelDType::F32)?;
        let n64 = n as u64;
        let mut args = self.stream.launch_builder(f);
        args.arg(&mut D.buf).arg(&coef).arg(&X.buf).arg(&n64);
        // SAFETY: accumulate_scaled_f32(float* D, double coef, const float* X, u64 n): 4
        // arguments in this order with these types; D and X hold n f32 (same shape, checked);
        // the kernel touches indices < n only.
        unsafe { args.launch(grid_1d(n)) }.map_err(|e| launch_error(kernel, e))?;
        self.launched(kernel);
        Ok(())
    }

    fn download_scales(&mut self, s: &DeviceScales) -> Result<Vec<f64>, BackendError> {
        self.bind()?;
        let mut values = vec![0.0f64; s.len];
        self.staging
            .download(&self.stream, &s.buf, bytemuck::cast_slice_mut(&mut values))?;
        Ok(values)
    }

    #[track_caller]
    fn add_narrow(
        &mut self,
        base: &DeviceMat,
        delta: &DeviceMat,
        dtype: DType,
        out: &mut [u8],
    ) -> Result<Option<NonFinite>, BackendError> {
        check::same("add_narrow: base, delta", base, delta);
        let size = output_size(dtype)?;
        assert_eq!(
            out.len(),
            base.len() * size,
            "add_narrow: output byte length"
        );
        self.bind()?;
        if base.is_empty() {
            return Ok(None);
        }
        match storage_kernel_dtype(dtype) {
            Some(k @ (KernelDType::Bf16 | KernelDType::F16)) => {
                self.add_narrow_as::<u16>(k, base, delta, out)
            }
            _ => self.add_narrow_as::<u32>(KernelDType::F32, base, delta, out),
        }
    }

    #[track_caller]
    fn narrow(
        &mut self,
        src: &DeviceMat,
        dtype: DType,
        out: &mut [u8],
    ) -> Result<(), BackendError> {
        let size = output_size(dtype)?;
        assert_eq!(out.len(), src.len() * size, "narrow: output byte length");
        self.bind()?;
        if src.is_empty() {
            return Ok(());
        }
        match storage_kernel_dtype(dtype) {
            Some(k @ (KernelDType::Bf16 | KernelDType::F16)) => self.narrow16(k, src, out),
            // f32 → f32 is the identity on bits.
            _ => self.staging.download(&self.stream, &src.buf, out),
        }
    }

    fn download(&mut self, src: &DeviceMat) -> Result<Vec<f32>, BackendError> {
        self.bind()?;
        let mut values = vec![0.0f32; src.len()];
        self.staging.download(
            &self.stream,
            &src.buf,
            bytemuck::cast_slice_mut(&mut values),
        )?;
        Ok(values)
    }

    #[track_caller]
    fn xs_bases(
        &mut self,
        W: &[f32],
        out: usize,
        inp: usize,
        r: usize,
    ) -> Result<XsBases, BackendError> {
        check::data("xs_bases: W", W.len(), out, inp);
        crate::linalg::svd::check_rank(r, out, inp)?;
        if let Some(i) = W.iter().position(|x| !x.is_finite()) {
            return Err(LinalgError::NonFinite {
                out,
                inp,
                row: i / inp,
                col: i % inp,
                value: W[i],
            }
            .into());
        }
        self.bind()?;
        let plan = GesvdPlan::new(out, inp);
        let host = plan.input(W);
        let mut A = self.alloc::<f64>(host.len(), "the SVD input")?;
        self.staging
            .upload(&self.stream, bytemuck::cast_slice(&host), &mut A)?;
        self.launched("cusolverDnDgesvd");
        let result = gesvd(&self.stream, &self.solver, &plan, &mut A)?;
        Ok(plan.bases(&result.Ua, result.S, &result.VaT, r))
    }
}
