//! Why `extract` or `resize` refused or failed. Every variant names the file and the tensor
//! or module; nothing is written in any case.

use std::path::PathBuf;

use crate::adapter::AdapterError;
use crate::io::ReadError;
use crate::linalg::LinalgError;
use crate::release::ReleaseError;

/// An extraction or resize failure.
#[derive(Debug, thiserror::Error)]
pub enum ExtractError {
    /// A checkpoint could not be read.
    #[error(transparent)]
    Read(#[from] ReadError),
    /// The adapter could not be read or rendered.
    #[error(transparent)]
    Adapter(#[from] AdapterError),
    /// Computing the tuned side from base + adapters failed.
    #[error("building the tuned model from --base and --adapter")]
    Tuned {
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Writing failed before the release writer started (the destination exists).
    #[error(transparent)]
    Write(#[from] crate::release::staging::WriteError),
    /// Writing failed.
    #[error(transparent)]
    Release(#[from] ReleaseError),
    /// Base and tuned are not the same model.
    #[error(
        "{} and {} are not the same model ({}); first: {}\nhint: extract compares a fine-tune with the base it was tuned from (same parameters and shapes; layout and dtype may differ)",
        base.display(), tuned.display(), crate::human::plural(*total, "mismatch", "mismatches"), first.join("; ")
    )]
    Mismatch {
        /// The base.
        base: PathBuf,
        /// The tuned model.
        tuned: PathBuf,
        /// The first mismatches (parameter: what differs).
        first: Vec<String>,
        /// How many there are.
        total: usize,
    },
    /// Every parameter is identical.
    #[error(
        "nothing differs between {} and {}: every one of {count} parameters is bit-identical, so there is nothing to extract",
        base.display(), tuned.display()
    )]
    NothingDiffers {
        /// The base.
        base: PathBuf,
        /// The tuned model.
        tuned: PathBuf,
        /// Parameters compared.
        count: usize,
    },
    /// A tensor could not be turned into numbers (dtype, layer slice, non-finite value).
    #[error("{}: tensor `{tensor}`: {reason}", path.display())]
    Tensor {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// What is wrong.
        reason: String,
    },
    /// The SVD of a module failed.
    #[error("{module}")]
    Svd {
        /// The module.
        module: String,
        /// The cause.
        source: LinalgError,
    },
    /// The GPU failed while computing a module's SVD (`--device cuda`, or `auto` with a GPU).
    #[error("{module}: the SVD on the GPU failed")]
    Device {
        /// The module.
        module: String,
        /// The cause.
        source: crate::backend::BackendError,
    },
    /// The target convention cannot express what differs.
    #[error(
        "--to {to} cannot express {} (PEFT stores low-rank factors of Linear weights only): {}\nhint: use the default --to comfy (diff/diff_b keys), or pass --linear-only to extract the Linear weights and leave these out (the report lists them)",
        crate::human::plural(tensors.len(), "full-tensor difference", "full-tensor differences"), tensors.join(", ")
    )]
    Inexpressible {
        /// The target convention.
        to: String,
        /// The tensors (canonical names).
        tensors: Vec<String>,
    },
    /// The adapter holds entries resize does not reduce.
    #[error(
        "{}: resize reduces plain LoRA modules and keeps diffs; {} of other kinds: {}\nhint: `wanbake extract --base BASE --adapter {} --rank R` turns any adapter stack into a plain LoRA",
        path.display(), crate::human::plural(entries.len(), "entry is", "entries are"), entries.join(", "), path.display()
    )]
    ResizeKinds {
        /// The adapter.
        path: PathBuf,
        /// `module (kind)` of each.
        entries: Vec<String>,
    },
    /// The byte budget cannot hold even the full differences.
    #[error(
        "--budget {budget} bytes cannot hold the output: the full differences and alphas alone take {fixed} bytes\nhint: raise --budget, or pass --linear-only"
    )]
    BudgetTooSmall {
        /// The budget.
        budget: u64,
        /// Bytes that do not depend on ranks.
        fixed: u64,
    },
    /// Bad options (also checked by the CLI).
    #[error("{0}")]
    Usage(String),
    /// A tensor to write holds values its dtype cannot hold (NaN, ±inf, an f16 overflow).
    #[error(transparent)]
    Unheld(Box<crate::pipeline::UnheldValues>),
}
