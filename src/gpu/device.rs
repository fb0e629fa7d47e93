//! Choosing where a run computes: `--device auto|cpu|cuda`.
//!
//! Owns: [`DeviceChoice`] (parsed from the flag), [`probe`] (cheap: libraries, driver version,
//! device count and name; no context, no compilation), [`CudaDevice::open`] (context, kernels
//! compiled and loaded, cuBLAS and cuSOLVER handles created and configured once to prove they
//! work, the memory pool's release threshold) and [`select`], which turns a choice into a
//! [`Selection`] saying what will run and why.
//!
//! Nothing calls into a CUDA library before its presence is checked with cudarc's
//! `is_culib_present` (cudarc panics on a missing library); absence, an old driver or no
//! device is [`BackendError::Unavailable`]. As a last guard, probing and opening run under
//! `catch_unwind`, so even an unexpected panic inside cudarc (a symbol missing from a broken
//! installation) becomes an error value.

use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::str::FromStr;
use std::sync::Arc;

use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaContext, result as driver, sys as driver_sys};

use super::cuda::{CudaBackend, deterministic_solver};
use super::kernels::KernelTable;
use crate::backend::BackendError;
use crate::linalg::SvdEngine;

/// What the device's memory pool keeps reserved across synchronisations: everything. With
/// the default (0) the pool unmaps its free memory at every synchronisation, and each target
/// (several synchronise per target) maps it again. The pool holds at most what `MAX_LANES`
/// whole targets use at once (`pipeline::Lanes`), and the context gives it back at exit.
pub const POOL_RELEASE_THRESHOLD: u64 = u64::MAX;

/// The oldest driver the CUDA 13.0 bindings (cudarc feature `cuda-13000`) can use,
/// as `cuDriverGetVersion` reports it (1000·major + 10·minor).
pub const MIN_DRIVER_VERSION: i32 = 13000;

/// The value of `--device`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum DeviceChoice {
    /// CUDA when a device and every library it needs load, else the CPU (and say why).
    #[default]
    Auto,
    /// The CPU, always.
    Cpu,
    /// CUDA, or fail with the reason it is unavailable.
    Cuda,
}

impl DeviceChoice {
    /// Every choice.
    pub const ALL: [DeviceChoice; 3] = [DeviceChoice::Auto, DeviceChoice::Cpu, DeviceChoice::Cuda];

    /// The command-line spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceChoice::Auto => "auto",
            DeviceChoice::Cpu => "cpu",
            DeviceChoice::Cuda => "cuda",
        }
    }
}

/// An unknown `--device` value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown device '{0}': expected {expected}",
    expected = crate::names::either(DeviceChoice::ALL.map(DeviceChoice::as_str))
)]
pub struct UnknownDevice(pub String);

impl FromStr for DeviceChoice {
    type Err = UnknownDevice;

    fn from_str(s: &str) -> Result<DeviceChoice, UnknownDevice> {
        crate::names::find(&DeviceChoice::ALL, DeviceChoice::as_str, s)
            .ok_or_else(|| UnknownDevice(s.to_string()))
    }
}

impl fmt::Display for DeviceChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

crate::names::value_enum!(DeviceChoice);

/// A CUDA library wanbake loads at run time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Library {
    /// The driver API, `libcuda`.
    Driver,
    /// The run-time compiler, `libnvrtc`.
    Nvrtc,
    /// `libcublas` (GEMM).
    Cublas,
    /// `libcusolver` (SVD).
    Cusolver,
}

impl Library {
    /// Every library a CUDA run needs.
    pub const ALL: [Library; 4] = [
        Library::Driver,
        Library::Nvrtc,
        Library::Cublas,
        Library::Cusolver,
    ];

    /// The name cudarc derives the file names from.
    fn stem(self) -> &'static str {
        match self {
            Library::Driver => "cuda",
            Library::Nvrtc => "nvrtc",
            Library::Cublas => "cublas",
            Library::Cusolver => "cusolver",
        }
    }

    /// Whether one of cudarc's candidate file names loads.
    pub fn is_present(self) -> bool {
        // SAFETY: each `is_culib_present` only tries `dlopen` on cudarc's candidate names for
        // that library and closes what it opened; it calls no function of the library.
        unsafe {
            match self {
                Library::Driver => driver_sys::is_culib_present(),
                Library::Nvrtc => cudarc::nvrtc::sys::is_culib_present(),
                Library::Cublas => cudarc::cublas::sys::is_culib_present(),
                Library::Cusolver => cudarc::cusolver::sys::is_culib_present(),
            }
        }
    }
}

impl fmt::Display for Library {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Library::Driver => "the NVIDIA driver library (libcuda)",
            Library::Nvrtc => "NVRTC (libnvrtc)",
            Library::Cublas => "cuBLAS (libcublas)",
            Library::Cusolver => "cuSOLVER (libcusolver)",
        })
    }
}

/// `Ok` when `lib` loads, else [`BackendError::Unavailable`] naming the file names searched.
pub fn require_library(lib: Library) -> Result<(), BackendError> {
    if lib.is_present() {
        return Ok(());
    }
    let mut names = cudarc::get_lib_name_candidates(lib.stem());
    let mut seen = std::collections::BTreeSet::new();
    names.retain(|n| seen.insert(n.clone()));
    let hint = match lib {
        Library::Driver => "is an NVIDIA driver installed? Use --device cpu to run without one",
        _ => {
            "install the CUDA 13 libraries and add their directory to LD_LIBRARY_PATH, \
             or use --device cpu"
        }
    };
    Err(BackendError::unavailable(format!(
        "{lib} could not be loaded (searched {}); {hint}",
        names.join(", ")
    )))
}

/// What [`probe`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The device ordinal.
    pub ordinal: usize,
    /// The device name, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// Compute capability (major, minor).
    pub compute_capability: (i32, i32),
    /// Device memory in bytes.
    pub total_memory: usize,
    /// `cuDriverGetVersion`: 1000·major + 10·minor.
    pub driver_version: i32,
    /// Streaming multiprocessors.
    pub sms: i32,
    /// `cusolverGetVersion` of the loaded libcusolver: 1000·major + 100·minor + patch.
    pub cusolver_version: i32,
}

impl DeviceInfo {
    /// The engine of the -xs bases this device's lanes compute (`CudaBackend::xs_bases`):
    /// cuSOLVER's results are reproducible for one library version, architecture and SM
    /// count, so all three name it.
    pub fn svd_engine(&self) -> SvdEngine {
        SvdEngine::Cusolver {
            version: self.cusolver_version,
            arch: self.compute_capability,
            sms: self.sms,
        }
    }
}

impl fmt::Display for DeviceInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (major, minor) = self.compute_capability;
        write!(
            f,
            "{} (device {}, sm_{major}{minor}, {:.1} GiB, CUDA driver {}.{})",
            self.name,
            self.ordinal,
            self.total_memory as f64 / (1u64 << 30) as f64,
            self.driver_version / 1000,
            self.driver_version % 1000 / 10
        )
    }
}

/// The cheap check behind `--device`: every library loads, the driver is new enough, device 0
/// exists. Creates no context and compiles nothing.
pub fn probe() -> Result<DeviceInfo, BackendError> {
    guarded("probing", || probe_device(0))
}

/// Runs `f`, turning a panic inside a CUDA library binding into [`BackendError::Unavailable`].
fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T, BackendError>) -> Result<T, BackendError> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        let msg = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or("(no message)");
        Err(BackendError::unavailable(format!(
            "a CUDA library failed while {what}: {msg}"
        )))
    })
}

fn probe_device(ordinal: usize) -> Result<DeviceInfo, BackendError> {
    require_library(Library::Driver)?;
    let mut driver_version = 0;
    // SAFETY: libcuda is loadable (checked above); cuDriverGetVersion writes one int through a
    // valid pointer and may be called before cuInit.
    unsafe { driver_sys::cuDriverGetVersion(&mut driver_version) }
        .result()
        .map_err(|e| BackendError::unavailable(format!("cuDriverGetVersion failed: {e}")))?;
    if driver_version < MIN_DRIVER_VERSION {
        return Err(BackendError::unavailable(format!(
            "the NVIDIA driver supports CUDA {}.{}, but wanbake's CUDA backend needs a driver \
             for CUDA 13.0 or newer; update the driver or use --device cpu",
            driver_version / 1000,
            driver_version % 1000 / 10
        )));
    }
    driver::init().map_err(|e| BackendError::unavailable(format!("cuInit failed: {e}")))?;
    let count = driver::device::get_count()
        .map_err(|e| BackendError::unavailable(format!("counting CUDA devices: {e}")))?;
    let index = i32::try_from(ordinal).unwrap_or(i32::MAX);
    if count <= index {
        return Err(BackendError::unavailable(format!(
            "no CUDA device {ordinal} (the driver reports {})",
            crate::human::plural(usize::try_from(count).unwrap_or(0), "device", "devices")
        )));
    }
    let dev = driver::device::get(index)
        .map_err(|e| BackendError::unavailable(format!("opening CUDA device {ordinal}: {e}")))?;
    let attr = |a| {
        // SAFETY: `dev` is a valid device handle from cuDeviceGet after cuInit.
        unsafe { driver::device::get_attribute(dev, a) }
            .map_err(|e| BackendError::unavailable(format!("querying CUDA device {ordinal}: {e}")))
    };
    use driver_sys::CUdevice_attribute::*;
    let compute_capability = (
        attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
        attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
    );
    let name = driver::device::get_name(dev)
        .map_err(|e| BackendError::unavailable(format!("querying CUDA device {ordinal}: {e}")))?;
    // SAFETY: as above.
    let total_memory = unsafe { driver::device::total_mem(dev) }
        .map_err(|e| BackendError::unavailable(format!("querying CUDA device {ordinal}: {e}")))?;
    let sms = attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
    for lib in [Library::Nvrtc, Library::Cublas, Library::Cusolver] {
        require_library(lib)?;
    }
    let mut cusolver_version = 0;
    // SAFETY: libcusolver is loadable (checked above; a missing symbol panics inside
    // `guarded`); cusolverGetVersion writes one int through a valid pointer.
    unsafe { cudarc::cusolver::sys::cusolverGetVersion(&mut cusolver_version) }
        .result()
        .map_err(|e| BackendError::unavailable(format!("cusolverGetVersion failed: {e:?}")))?;
    Ok(DeviceInfo {
        ordinal,
        name,
        compute_capability,
        total_memory,
        driver_version,
        sms,
        cusolver_version,
    })
}

/// An opened CUDA device: its context and its table of loaded kernels. Cheap to share
/// (`Clone` shares both); [`CudaDevice::backend`] makes one independent lane per worker.
#[derive(Clone)]
pub struct CudaDevice {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) kernels: Arc<KernelTable>,
    info: DeviceInfo,
}

impl fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaDevice")
            .field("info", &self.info)
            .finish()
    }
}

impl CudaDevice {
    /// Opens device `ordinal`: probes it, creates its context, compiles and loads every kernel
    /// file, creates a cuBLAS and a cuSOLVER handle once and puts the latter in
    /// deterministic mode (every library symbol a lane uses is resolved here, under the guard:
    /// cudarc panics on a missing one), and sets the release threshold of the device's memory
    /// pool ([`POOL_RELEASE_THRESHOLD`]), so that everything a run needs is known to work
    /// before any output is planned.
    pub fn open(ordinal: usize) -> Result<CudaDevice, BackendError> {
        guarded("opening the device", || {
            let info = probe_device(ordinal)?;
            let ctx = CudaContext::new(ordinal).map_err(|e| {
                BackendError::unavailable(format!("creating a CUDA context on {}: {e}", info.name))
            })?;
            let (major, minor) = info.compute_capability;
            let kernels = Arc::new(KernelTable::new(ctx.clone(), major, minor));
            kernels.load_all()?;
            let stream = ctx.default_stream();
            CudaBlas::new(stream.clone())
                .map_err(|e| BackendError::unavailable(format!("creating a cuBLAS handle: {e}")))?;
            deterministic_solver(&stream).map_err(|e| BackendError::unavailable(e.to_string()))?;
            let device = CudaDevice { ctx, kernels, info };
            device.set_pool_release_threshold(POOL_RELEASE_THRESHOLD)?;
            Ok(device)
        })
    }

    /// The device's default memory pool (the one `cuMemAllocAsync` draws from).
    fn pool(&self) -> Result<driver_sys::CUmemoryPool, BackendError> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| BackendError::cuda("binding the CUDA context", e))?;
        let mut pool = std::ptr::null_mut();
        // SAFETY: writes one pool handle through a valid pointer; the device handle comes
        // from the live context.
        unsafe { driver_sys::cuDeviceGetDefaultMemPool(&mut pool, self.ctx.cu_device()) }
            .result()
            .map_err(|e| BackendError::cuda("cuDeviceGetDefaultMemPool", e))?;
        Ok(pool)
    }

    fn set_pool_release_threshold(&self, bytes: u64) -> Result<(), BackendError> {
        let pool = self.pool()?;
        let mut value = bytes;
        // SAFETY: CU_MEMPOOL_ATTR_RELEASE_THRESHOLD takes a cuuint64_t, read through the
        // pointer, which points at a live u64; `pool` is the device's default pool.
        unsafe {
            driver_sys::cuMemPoolSetAttribute(
                pool,
                driver_sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut value as *mut u64).cast(),
            )
        }
        .result()
        .map_err(|e| BackendError::cuda("setting the memory pool's release threshold", e))
    }

    /// The release threshold of the device's default memory pool, in bytes: what the pool
    /// keeps reserved across synchronisations ([`POOL_RELEASE_THRESHOLD`] once opened).
    pub fn pool_release_threshold(&self) -> Result<u64, BackendError> {
        let pool = self.pool()?;
        let mut value = 0u64;
        // SAFETY: CU_MEMPOOL_ATTR_RELEASE_THRESHOLD writes one cuuint64_t through the pointer,
        // which points at a live u64.
        unsafe {
            driver_sys::cuMemPoolGetAttribute(
                pool,
                driver_sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut value as *mut u64).cast(),
            )
        }
        .result()
        .map_err(|e| BackendError::cuda("reading the memory pool's release threshold", e))?;
        Ok(value)
    }

    /// What was opened.
    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// A new, independent backend lane on this device: its own stream, cuBLAS handle and
    /// pinned staging buffers. Give each worker thread its own lane (see `super::cuda`).
    pub fn backend(&self) -> Result<CudaBackend, BackendError> {
        guarded("creating a backend lane", || CudaBackend::new(self))
    }
}

/// Where a run computes.
#[derive(Clone, Debug)]
pub enum Selected {
    /// On the CPU ([`crate::backend::CpuBackend`]).
    Cpu,
    /// On this CUDA device ([`super::CudaBackend`] lanes from [`CudaDevice::backend`]).
    Cuda(CudaDevice),
}

/// The outcome of [`select`]: what runs, and a one-line reason to print.
#[derive(Clone, Debug)]
pub struct Selection {
    /// What runs.
    pub selected: Selected,
    /// Why, e.g. `cuda: NVIDIA H100 … (--device auto)` or
    /// `cpu (--device auto: CUDA is unavailable: the NVIDIA driver library … could not be loaded …)`.
    pub reason: String,
}

impl Selection {
    /// `"cpu"` or `"cuda"`.
    pub fn label(&self) -> &'static str {
        match self.selected {
            Selected::Cpu => "cpu",
            Selected::Cuda(_) => "cuda",
        }
    }
}

/// Resolves `--device`: `cpu` always succeeds; `cuda` opens device 0 or returns why it cannot;
/// `auto` opens device 0 and otherwise falls back to the CPU, with the reason in
/// [`Selection::reason`].
pub fn select(choice: DeviceChoice) -> Result<Selection, BackendError> {
    match choice {
        DeviceChoice::Cpu => Ok(Selection {
            selected: Selected::Cpu,
            reason: "cpu (--device cpu)".into(),
        }),
        DeviceChoice::Cuda => {
            let device = CudaDevice::open(0)?;
            Ok(Selection {
                reason: format!("cuda: {} (--device cuda)", device.info()),
                selected: Selected::Cuda(device),
            })
        }
        DeviceChoice::Auto => Ok(match CudaDevice::open(0) {
            // One short line for the common case; `--device cuda` names every path searched.
            Err(_) if !Library::Driver.is_present() => Selection {
                selected: Selected::Cpu,
                reason: "cpu (no NVIDIA driver found)".into(),
            },
            Err(_)
                if let Some(lib) = [Library::Nvrtc, Library::Cublas, Library::Cusolver]
                    .into_iter()
                    .find(|l| !l.is_present()) =>
            {
                Selection {
                    selected: Selected::Cpu,
                    reason: format!("cpu ({lib} not found; --device cuda says where it looked)"),
                }
            }
            Ok(device) => Selection {
                reason: format!("cuda: {} (--device auto)", device.info()),
                selected: Selected::Cuda(device),
            },
            Err(e) => Selection {
                selected: Selected::Cpu,
                reason: format!("cpu (--device auto: {e})"),
            },
        }),
    }
}
