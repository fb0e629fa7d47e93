//! The CUDA C kernels under `kernels/`, their names, and their run-time compilation.
//!
//! Owns: [`KernelFile`] (each `.cu` source, embedded with `include_str!`), [`Op`] and
//! [`KernelDType`] (an entry point is named `{op}_{dtype}`, generated in the source by one
//! macro per op), [`compile`] through NVRTC, and [`KernelTable`], the per-device cache of
//! loaded modules: one slot per kernel file, indexed by the enum, filled on first use. Loading
//! a module also resolves every entry point the file should have, so a missing one is
//! reported at once, naming module and kernel. Does not own: launching (`super::cuda`).
//!
//! Compilation options are fixed ([`NVRTC_OPTIONS`]): no fused multiply-add contraction,
//! IEEE denormals, IEEE division and square root, so each operation rounds exactly as the
//! host reference (`crate::backend::arith`). For a device the source is compiled straight to a cubin
//! for its `sm_XY`, which the driver loads without a PTX JIT (a PTX from a newer NVRTC can be
//! rejected by an older driver; a cubin is not subject to that).

use std::ffi::{CString, c_char};
use std::fmt;
use std::sync::{Arc, OnceLock};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::{Ptx, result as nvrtc, sys as nvrtc_sys};

use super::device::Library;
use super::device::require_library;
use crate::backend::BackendError;

/// A kernel source file under `kernels/`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KernelFile {
    /// `kernels/convert.cu`: widen, narrow, add_narrow.
    Convert,
    /// `kernels/norms.cu`: row and column L2 norms.
    Norms,
    /// `kernels/accumulate.cu`: adding a contribution into the accumulator.
    Accumulate,
}

impl KernelFile {
    /// Every kernel file, in slot order.
    pub const ALL: [KernelFile; 3] = [
        KernelFile::Convert,
        KernelFile::Norms,
        KernelFile::Accumulate,
    ];

    /// The path in the repository, used in every message about the file.
    pub fn path(self) -> &'static str {
        match self {
            KernelFile::Convert => "kernels/convert.cu",
            KernelFile::Norms => "kernels/norms.cu",
            KernelFile::Accumulate => "kernels/accumulate.cu",
        }
    }

    /// The CUDA C source, embedded at build time.
    pub fn source(self) -> &'static str {
        match self {
            KernelFile::Convert => include_str!("../../kernels/convert.cu"),
            KernelFile::Norms => include_str!("../../kernels/norms.cu"),
            KernelFile::Accumulate => include_str!("../../kernels/accumulate.cu"),
        }
    }

    /// Every entry point the file defines, in source order.
    pub fn kernels(self) -> Vec<Kernel> {
        Op::ALL
            .iter()
            .filter(|op| op.file() == self)
            .flat_map(|&op| op.dtypes().iter().map(move |&dtype| Kernel { op, dtype }))
            .collect()
    }

    fn slot(self) -> usize {
        self as usize
    }
}

/// An operation; one CUDA macro per op generates its `{op}_{dtype}` entry points.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    /// Storage bits → f32 (exact).
    Widen,
    /// f32 → storage with one round-to-nearest-even.
    Narrow,
    /// `RNE(base + delta)` with wanbake's NaN rule, reporting the first non-finite sum.
    AddNarrow,
    /// Row L2 norms, f64 accumulation in index order, rounded to f32.
    RowNorms,
    /// Column L2 norms, f64 accumulation in index order, rounded to f32.
    ColNorms,
    /// `α_i = m_i / (‖V_i‖ + ε)` in f64.
    RowScales,
    /// `β_j = m_j / (‖(α ⊙ V)_j‖ + ε)` in f64.
    ColScales,
    /// `D += f32(w·(β_j·(α_i·V) − W0))`.
    AccumulateNormalised,
    /// `D += f32(coef·X)`.
    AccumulateScaled,
}

impl Op {
    /// Every op, in source order.
    pub const ALL: [Op; 9] = [
        Op::Widen,
        Op::Narrow,
        Op::AddNarrow,
        Op::RowNorms,
        Op::ColNorms,
        Op::RowScales,
        Op::ColScales,
        Op::AccumulateNormalised,
        Op::AccumulateScaled,
    ];

    /// The op part of the entry point names.
    pub fn name(self) -> &'static str {
        match self {
            Op::Widen => "widen",
            Op::Narrow => "narrow",
            Op::AddNarrow => "add_narrow",
            Op::RowNorms => "row_norms",
            Op::ColNorms => "col_norms",
            Op::RowScales => "row_scales",
            Op::ColScales => "col_scales",
            Op::AccumulateNormalised => "accumulate_normalised",
            Op::AccumulateScaled => "accumulate_scaled",
        }
    }

    /// The file that defines it.
    pub fn file(self) -> KernelFile {
        match self {
            Op::Widen | Op::Narrow | Op::AddNarrow => KernelFile::Convert,
            Op::RowNorms | Op::ColNorms | Op::RowScales | Op::ColScales => KernelFile::Norms,
            Op::AccumulateNormalised | Op::AccumulateScaled => KernelFile::Accumulate,
        }
    }

    /// The dtypes it is instantiated for (the storage dtype for conversions, the compute
    /// dtype otherwise).
    pub fn dtypes(self) -> &'static [KernelDType] {
        match self {
            Op::Widen | Op::Narrow | Op::AddNarrow => {
                &[KernelDType::Bf16, KernelDType::F16, KernelDType::F32]
            }
            _ => &[KernelDType::F32],
        }
    }
}

/// The dtype suffix of an entry point.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KernelDType {
    /// bfloat16 storage.
    Bf16,
    /// IEEE half storage.
    F16,
    /// f32.
    F32,
}

impl KernelDType {
    /// The suffix, e.g. `bf16`.
    pub fn name(self) -> &'static str {
        match self {
            KernelDType::Bf16 => "bf16",
            KernelDType::F16 => "f16",
            KernelDType::F32 => "f32",
        }
    }
}

/// One entry point, `{op}_{dtype}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Kernel {
    /// The op.
    pub op: Op,
    /// The dtype.
    pub dtype: KernelDType,
}

impl Kernel {
    /// The entry point name, e.g. `add_narrow_bf16`.
    pub fn name(self) -> String {
        format!("{}_{}", self.op.name(), self.dtype.name())
    }

    /// The file that defines it.
    pub fn file(self) -> KernelFile {
        self.op.file()
    }
}

impl fmt::Display for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "'{}' ({})", self.name(), self.file().path())
    }
}

/// The NVRTC options of every compilation: no FMA contraction, IEEE denormals, IEEE division
/// and square root (the exactness contract of `crate::backend::arith`).
pub const NVRTC_OPTIONS: [&str; 4] = [
    "--fmad=false",
    "--ftz=false",
    "--prec-div=true",
    "--prec-sqrt=true",
];

/// What to compile a kernel file into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompileTarget {
    /// PTX for NVRTC's default virtual architecture (no device needed).
    Ptx,
    /// A cubin for the real architecture `sm_{major}{minor}` (what a device loads).
    Cubin {
        /// Compute capability major.
        major: i32,
        /// Compute capability minor.
        minor: i32,
    },
}

impl fmt::Display for CompileTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CompileTarget::Ptx => f.write_str("PTX (NVRTC default architecture)"),
            CompileTarget::Cubin { major, minor } => write!(f, "sm_{major}{minor} (cubin)"),
        }
    }
}

/// The output of [`compile`].
#[derive(Clone, Debug)]
pub struct Compiled {
    /// The source file.
    pub file: KernelFile,
    /// What it was compiled for.
    pub target: CompileTarget,
    /// PTX text or cubin (ELF) bytes.
    pub image: Vec<u8>,
}

impl Compiled {
    /// The PTX text (`None` for a cubin).
    pub fn ptx(&self) -> Option<&str> {
        match self.target {
            CompileTarget::Ptx => std::str::from_utf8(&self.image).ok(),
            CompileTarget::Cubin { .. } => None,
        }
    }
}

/// Compiles one kernel file with NVRTC. Needs only libnvrtc (no driver, no device); returns
/// [`BackendError::Unavailable`] when libnvrtc cannot be loaded and [`BackendError::Compile`], with
/// the NVRTC log, when the source is rejected.
pub fn compile(file: KernelFile, target: CompileTarget) -> Result<Compiled, BackendError> {
    require_library(Library::Nvrtc)?;
    let fail = |log: String| BackendError::Compile {
        module: file.path(),
        target: target.to_string(),
        log,
    };
    let src = CString::new(file.source()).map_err(|e| fail(e.to_string()))?;
    let name = CString::new(file.path()).map_err(|e| fail(e.to_string()))?;
    let program =
        Program(nvrtc::create_program(&src, Some(&name)).map_err(|e| fail(e.to_string()))?);
    let mut options: Vec<String> = NVRTC_OPTIONS.iter().map(|s| s.to_string()).collect();
    if let CompileTarget::Cubin { major, minor } = target {
        options.push(format!("--gpu-architecture=sm_{major}{minor}"));
    }
    // SAFETY: `program.0` was created above by nvrtcCreateProgram from `src` and `name`, which
    // outlive it, and is destroyed only by `Program::drop`; the options are NUL-free strings.
    let compiled = unsafe { nvrtc::compile_program(program.0, &options) };
    if let Err(e) = compiled {
        // SAFETY: the same live program; the log exists after a compilation attempt.
        let log = unsafe { nvrtc::get_program_log(program.0) }
            .map(|l| c_chars_to_string(&l))
            .unwrap_or_default();
        return Err(fail(format!("{e}\n{log}")));
    }
    let image = match target {
        // SAFETY: the same live, successfully compiled program.
        CompileTarget::Ptx => unsafe { nvrtc::get_ptx(program.0) }
            .map(|p| c_chars_to_string(&p).into_bytes())
            .map_err(|e| fail(format!("reading the PTX: {e}")))?,
        CompileTarget::Cubin { .. } => program
            .cubin()
            .map_err(|e| fail(format!("reading the cubin: {e}")))?,
    };
    Ok(Compiled {
        file,
        target,
        image,
    })
}

/// An NVRTC program, destroyed on drop.
struct Program(nvrtc_sys::nvrtcProgram);

impl Program {
    /// The cubin of a program compiled for a real architecture.
    fn cubin(&self) -> Result<Vec<u8>, nvrtc::NvrtcError> {
        let mut size = 0usize;
        // SAFETY: `self.0` is a live program compiled for `sm_XY`; `size` is a valid out-pointer.
        unsafe { nvrtc_sys::nvrtcGetCUBINSize(self.0, &mut size) }.result()?;
        let mut bytes = vec![0u8; size];
        // SAFETY: `bytes` holds exactly the `size` bytes NVRTC reported for this program.
        unsafe { nvrtc_sys::nvrtcGetCUBIN(self.0, bytes.as_mut_ptr().cast::<c_char>()) }
            .result()?;
        Ok(bytes)
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: `self.0` came from nvrtcCreateProgram and is destroyed exactly once, here.
        let _ = unsafe { nvrtc::destroy_program(self.0) };
    }
}

/// A NUL-terminated C character buffer as a string (lossy), without the terminator.
fn c_chars_to_string(chars: &[c_char]) -> String {
    let bytes: Vec<u8> = chars
        .iter()
        .map(|&c| c as u8)
        .take_while(|&b| b != 0)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// A loaded kernel file and every one of its entry points.
struct LoadedModule {
    _module: Arc<CudaModule>,
    functions: Vec<(Kernel, CudaFunction)>,
}

/// The per-device table of loaded kernel files: one slot per [`KernelFile`], filled on the
/// first use of any kernel of that file (compile → load → resolve all entry points). A
/// failure is cached too and returned on every later use.
pub struct KernelTable {
    ctx: Arc<CudaContext>,
    target: CompileTarget,
    slots: [OnceLock<Result<LoadedModule, BackendError>>; 3],
}

impl KernelTable {
    /// An empty table for `ctx`, whose device has compute capability `major.minor`; every
    /// file is compiled to a cubin for `sm_{major}{minor}`.
    pub(crate) fn new(ctx: Arc<CudaContext>, major: i32, minor: i32) -> KernelTable {
        KernelTable {
            ctx,
            target: CompileTarget::Cubin { major, minor },
            slots: [OnceLock::new(), OnceLock::new(), OnceLock::new()],
        }
    }

    /// Loads every kernel file now (so a device that cannot run them is refused up front).
    pub(crate) fn load_all(&self) -> Result<(), BackendError> {
        for file in KernelFile::ALL {
            self.module(file)?;
        }
        Ok(())
    }

    /// The loaded function of `kernel`.
    pub(crate) fn function(&self, kernel: Kernel) -> Result<&CudaFunction, BackendError> {
        let module = self.module(kernel.file())?;
        module
            .functions
            .iter()
            .find(|(k, _)| *k == kernel)
            .map(|(_, f)| f)
            .ok_or_else(|| BackendError::MissingKernel {
                module: kernel.file().path(),
                kernel: kernel.name(),
                detail: "not in the table of expected entry points".into(),
            })
    }

    fn module(&self, file: KernelFile) -> Result<&LoadedModule, BackendError> {
        self.slots[file.slot()]
            .get_or_init(|| self.load(file))
            .as_ref()
            .map_err(Clone::clone)
    }

    fn load(&self, file: KernelFile) -> Result<LoadedModule, BackendError> {
        let compiled = compile(file, self.target)?;
        let module = self
            .ctx
            .load_module(Ptx::from_binary(compiled.image))
            .map_err(|e| BackendError::Load {
                module: file.path(),
                detail: e.to_string(),
            })?;
        let functions = file
            .kernels()
            .into_iter()
            .map(|kernel| {
                module
                    .load_function(&kernel.name())
                    .map(|f| (kernel, f))
                    .map_err(|e| BackendError::MissingKernel {
                        module: file.path(),
                        kernel: kernel.name(),
                        detail: e.to_string(),
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(LoadedModule {
            _module: module,
            functions,
        })
    }
}
