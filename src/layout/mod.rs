//! The restack executor: converting a WAN transformer checkpoint between its four layouts.
//!
//! Owns: writing the canonical form out in any layout (`write`), the keep-f32 dtype
//! policies (`dtype_policy`), the executor that runs a conversion against a source
//! and a sink (`exec`), and whole-checkpoint restacking into a release (`restack`). Does
//! not own: file formats, folders and the atomic writer (`io`, `release`), or the model
//! facts it plans with (`model`: the `Layout` enum and its detection in `wan_layout`, the
//! name table in `wan_names`, reading a checkpoint of any layout into the canonical form in
//! `read_plan`, the tensor transforms and their kernels in `transform`, configs and the
//! diffusers parameter list in `wan`, and `PlanError`).
//!
//! The canonical form is the diffusers `WanTransformer3DModel` parameter set, with diffusers
//! names and PyTorch layouts. Every conversion goes through it: a read plan says where each
//! canonical parameter lives in the input, a write plan says where each canonical
//! parameter goes in the output, and the executor fuses the two (input transform, output
//! transform and dtype conversion become one kernel per tensor slice).

pub mod dtype_policy;
pub mod exec;
pub mod restack;
pub mod write;

pub use dtype_policy::{KeepF32, OutputDType, decide_dtypes};
pub use exec::{
    Conversion, ExecError, ExecOptions, ExecReport, MemorySink, StoredTensors, TensorSink,
};
pub use write::{OutputTensor, Piece, WritePlan};
