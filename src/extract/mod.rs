//! Weights → adapters: `extract` (a LoRA from a fine-tune: tuned − base) and `resize` (a LoRA
//! reduced to a lower rank), with rank selection by rank, energy or a global byte budget.
//!
//! Owns: pairing a base with its tuned model (`pair`: same parameters and shapes, any layout
//! or dtype), the per-module spectrum, rank choice and factors (`factor`, `rank`, `budget`),
//! where the SVDs run (`route`: the CPU, or CUDA lanes with `--device`), the written adapter (`render`: ComfyUI/original-Wan or PEFT keys for extract), the two
//! requests with their refusals (`run`, `resize`, `error`), and the per-module report both
//! print and record in the manifest (`report`). Does not own: the singular value routines
//! (`linalg::truncated`), reading adapters and their conventions (`adapter`), the merge that
//! builds a tuned model from a base and adapters (`merge`), or writing files
//! (`release::write_release`).
//!
//! Numerical contract: ΔW = f64(W_tuned) − f64(W_base) (exact for f32/bf16/f16 inputs); its
//! leading singular triplets in f64 (exact SVD, or the randomized range finder held to it);
//! factors `B = U_r·Σ_r` (out, r), `A = V_rᵀ` (r, in) rounded once to f32, α = r (σ = 1), so
//! B·A is the best rank-r approximation. Every other differing tensor is a full difference
//! rounded once to f32.

pub mod budget;
pub mod error;
pub mod factor;
pub mod merged;
pub mod pair;
pub mod rank;
pub mod render;
pub mod report;
pub mod resize;
pub mod route;
pub mod run;

pub use error::ExtractError;
pub use rank::RankRule;
pub use report::{ExtractReport, ModuleReport};
pub use resize::{ResizeRequest, resize};
pub use route::SvdRoute;
pub use run::{
    CONVENTIONS, ExtractOutcome, ExtractRequest, FromAdapters, extract, extract_from_adapters,
};
