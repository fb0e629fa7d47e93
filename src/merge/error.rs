//! Why a merge was refused or failed.
//!
//! Owns: `MergeError`. Every variant names the adapter file (or the base tensor), the key,
//! what was expected and what was found, and where the cause is recognisable, what to do.
//! Binding refusals (unmatched keys, nothing bound, missing parameters, shapes) are the
//! adapter module's (`MergeError::Adapter`): they are checked once, when binding.
//! Every variant except `NonFiniteResult`, `Convert`, `Encode`, `Svd`, `Lycoris` and `Write` is
//! raised while planning, before the output directory exists; those six are raised while writing,
//! and the temporary output is then discarded.

use std::path::PathBuf;

/// A refused or failed merge. Nothing is left at the destination when one is returned.
#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    /// A base or adapter could not be read.
    #[error(transparent)]
    Read(#[from] crate::io::ReadError),
    /// The output could not be laid out in the requested layout.
    #[error("base component `{component}`: {source}")]
    Layout {
        /// The component (`""` for a single model).
        component: String,
        /// Why.
        #[source]
        source: crate::model::plan_error::PlanError,
    },
    /// A usage problem found against the base (component names, an output dtype that cannot
    /// hold merged values).
    #[error("{0}")]
    Usage(String),
    /// The base and options cannot give the requested output (a config.json that is not a
    /// WAN config, a target the output layout leaves out, sizes that overflow).
    #[error("{0}")]
    Plan(String),
    /// An adapter could not be opened or bound to the base.
    #[error(transparent)]
    Adapter(Box<crate::adapter::AdapterError>),
    /// A LyCORIS module whose effective weight could not be computed (shapes were checked
    /// when binding; this is raised while writing, and the temporary output is discarded).
    #[error("{}: {source}", adapter.display())]
    Lycoris {
        /// The adapter.
        adapter: PathBuf,
        /// The module and why.
        #[source]
        source: crate::adapter::lycoris::LycorisError,
    },
    /// A bug: an invariant of the plan did not hold.
    #[error("internal error: {0}")]
    Internal(String),
    /// NaN or ±inf in an adapter tensor.
    #[error(
        "{}: tensor `{key}` holds {value} at flat index {index}: refusing to merge non-finite values",
        adapter.display()
    )]
    NonFinite {
        /// The adapter.
        adapter: PathBuf,
        /// The tensor.
        key: String,
        /// Flat index of the first bad value.
        index: usize,
        /// The value.
        value: f32,
    },
    /// A merged weight came out NaN or ±inf (only known while writing).
    #[error(
        "merged tensor `{tensor}` is non-finite ({value}) at row {row}, column {col} of its \
         (out, in') view; nothing was written. Lower the strength or check the adapter{}",
        component_suffix(component)
    )]
    NonFiniteResult {
        /// The base tensor.
        tensor: String,
        /// The component.
        component: String,
        /// Row.
        row: usize,
        /// Column.
        col: usize,
        /// The value.
        value: f32,
    },
    /// A tensor could not be read, converted or laid out for the output.
    #[error("tensor `{tensor}`: {reason}")]
    Convert {
        /// The base tensor.
        tensor: String,
        /// Why.
        reason: String,
    },
    /// A tensor could not be encoded for a quantized output (a non-finite weight); the
    /// message names the file and key.
    #[error("{0}")]
    Encode(String),
    /// The SVD bases of an -xs target could not be computed or cached.
    #[error(transparent)]
    Svd(Box<crate::linalg::CacheError>),
    /// The device computing a target failed (`--device cuda`, or `auto` on a GPU).
    #[error("merging `{tensor}` on {device}: {source}")]
    Device {
        /// The base tensor.
        tensor: String,
        /// Where it ran (`cuda`, `cpu-reference`).
        device: &'static str,
        /// What failed.
        #[source]
        source: crate::backend::BackendError,
    },
    /// Writing the output failed.
    #[error("writing `{tensor}`: {source}")]
    Write {
        /// The output tensor.
        tensor: String,
        /// Why.
        #[source]
        source: Box<crate::io::WriteError>,
    },
}

impl From<crate::adapter::AdapterError> for MergeError {
    fn from(e: crate::adapter::AdapterError) -> MergeError {
        MergeError::Adapter(Box::new(e))
    }
}

impl From<crate::linalg::CacheError> for MergeError {
    fn from(e: crate::linalg::CacheError) -> MergeError {
        MergeError::Svd(Box::new(e))
    }
}

fn component_suffix(component: &str) -> String {
    if component.is_empty() {
        String::new()
    } else {
        format!(" (component `{component}`)")
    }
}
