//! The streaming plans that convert a WAN transformer between its four layouts.
//!
//! Owns: reading a checkpoint of any layout into the canonical form (`read`), writing the
//! canonical form out in any layout (`write`), layout detection and the config.json layout field (`detect`), the keep-f32
//! dtype policies (`dtype_policy`), the executor that runs a conversion against a source
//! and a sink (`exec`), and whole-checkpoint restacking into a release (`restack`). Does
//! not own: file formats, folders and the atomic writer (`io`, `release`), the model facts
//! it plans with (`model`: the `Layout` enum in `wan_layout`, the name table in
//! `wan_names`, the tensor transforms and their kernels in `transform`, configs and the
//! diffusers parameter list in `wan`).
//!
//! The canonical form is the diffusers `WanTransformer3DModel` parameter set, with diffusers
//! names and PyTorch layouts. Every conversion goes through it: a read plan says where each
//! canonical parameter lives in the input, a write plan says where each canonical
//! parameter goes in the output, and the executor fuses the two (input transform, output
//! transform and dtype conversion become one kernel per tensor slice).

pub mod detect;
pub mod dtype_policy;
pub mod error;
pub mod exec;
pub mod read;
pub mod restack;
pub mod write;

pub use detect::{LAYOUT_FIELD, detect_layout, layout_from_config, resolve_layout, stamp_config};
pub use dtype_policy::{KeepF32, OutputDType, decide_dtypes};
pub use error::PlanError;
pub use exec::{
    Conversion, ExecError, ExecOptions, ExecReport, MemorySink, TensorSink, TensorSource,
};
pub use read::{CanonicalSource, ReadPlan, SkippedKey, StoredTensor, infer_config};
pub use write::{OutputTensor, Piece, WritePlan};
