//! Planning conversions of a WAN transformer checkpoint between its four layouts.
//!
//! Owns: writing the canonical form out in any layout (`write`), the keep-f32 dtype
//! policies (`dtype_policy`), fusing a read and a write plan into pieces and the loop that
//! copies or converts one piece (`conversion`), and planning a whole-checkpoint restack
//! (`restack`). Does not own: running the pieces (`pipeline::exec`, the one executor, and
//! the `restack` producer), or file formats, folders and the atomic writer (`io`, `release`), or the model
//! facts it plans with (`model`: the `Layout` enum and its detection in `wan_layout`, the
//! name table in `wan_names`, reading a checkpoint of any layout into the canonical form in
//! `read_plan`, the tensor transforms and their kernels in `transform`, configs and the
//! diffusers parameter list in `wan`, and `PlanError`).
//!
//! The canonical form is the diffusers `WanTransformer3DModel` parameter set, with diffusers
//! names and PyTorch layouts. Every conversion goes through it: a read plan says where each
//! canonical parameter lives in the input, a write plan says where each canonical
//! parameter goes in the output, and `conversion` fuses the two (input transform, output
//! transform and dtype conversion become one kernel per tensor slice).

pub mod conversion;
pub mod dtype_policy;
pub mod restack;
pub mod write;

pub use conversion::Conversion;
pub use dtype_policy::{KeepF32, OutputDType, decide_dtypes};
pub use write::{OutputTensor, Piece, WritePlan};
