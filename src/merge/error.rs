//! Why computing a merged target failed.
//!
//! Owns: `MergeError`: the executor's own errors (`PipelineError`, wrapped: among them a
//! merged value the output cannot hold, `PipelineError::Unheld`) and what only a merge can
//! meet while writing: a LyCORIS module whose delta cannot be computed, an -xs basis that
//! cannot be computed or cached, a failed device. Each names the base tensor (or the
//! adapter file) and what was found; the temporary output is then discarded. Does not own: planning refusals (`pipeline::PipelineError`) and binding
//! refusals (`adapter::AdapterError`), which come before anything is written.

use std::path::PathBuf;

/// A failed merge. Nothing is left at the destination when one is returned.
#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    /// The executor failed (reading, converting, encoding or writing a tensor).
    #[error(transparent)]
    Pipeline(#[from] crate::pipeline::PipelineError),
    /// A LyCORIS module whose effective weight could not be computed (shapes were checked
    /// when binding).
    #[error("{}", adapter.display())]
    Lycoris {
        /// The adapter.
        adapter: PathBuf,
        /// The module and why.
        #[source]
        source: crate::adapter::lycoris::LycorisError,
    },
    /// The SVD bases of an -xs target could not be computed or cached.
    #[error(transparent)]
    Svd(Box<crate::linalg::CacheError>),
    /// The device computing a target failed (`--device cuda`, or `auto` on a GPU).
    #[error("merging `{tensor}` on {device}")]
    Device {
        /// The base tensor.
        tensor: String,
        /// Where it ran (`cuda`, `cpu-reference`).
        device: &'static str,
        /// What failed.
        #[source]
        source: crate::backend::BackendError,
    },
}

impl From<crate::linalg::CacheError> for MergeError {
    fn from(e: crate::linalg::CacheError) -> MergeError {
        MergeError::Svd(Box::new(e))
    }
}

impl From<crate::io::ReadError> for MergeError {
    fn from(e: crate::io::ReadError) -> MergeError {
        MergeError::Pipeline(e.into())
    }
}
