//! Numeric kernels for the merge engine and the -xs adapters.
//!
//! Owns: the exact, deterministic thin SVD and the LoRA-XS bases built from it (`svd`), SA3's
//! sign convention for singular vectors (`signs`), the content-addressed basis cache
//! (`cache`) and the engine its entries are keyed by (`engine`), the low-rank update kernels `W ← W + s·B·A` and `W ← W + s·U·M·Vᵀ` (`lowrank`),
//! row/column norms (`norms`), and the leading singular triplets, exact or randomized, for
//! extraction and rank reduction (`truncated`). Does not own: adapter formulas (`adapter`), tensor I/O
//! (`io`) or the GPU backend (`gpu`).
//!
//! Every function takes its parallelism as an explicit [`faer::Par`] and never reads faer's
//! global setting; every result is bit-identical for any `Par` (each module doc says how:
//! faer itself does not guarantee it).

pub mod cache;
pub mod engine;
pub mod lowrank;
pub mod norms;
pub mod signs;
pub mod svd;
pub mod truncated;

pub use cache::{
    BasisKey, CacheError, CacheOutcome, CacheProblem, CachedBases, SvdCache, basis_key,
};
pub use engine::SvdEngine;
pub use lowrank::{
    add_scaled_product, add_scaled_product_into, add_xs_update, add_xs_update_into,
    xs_update_scratch_len,
};
pub use norms::{col_norms, col_norms_into, row_norms, row_norms_into};
pub use signs::{SignFloat, canonicalize_signs, canonicalize_signs_mat};
pub use svd::{LinalgError, SVD_PARTITION_DEGREE, XsBases, xs_bases};
pub use truncated::{
    FaerEngine, TopSingular, TruncEngine, TruncMethod, factored_top_singular, top_singular,
    top_singular_on,
};
