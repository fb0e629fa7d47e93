//! Why a merge was refused or failed.
//!
//! Owns: `MergeError`. Every variant names the adapter file (or the base tensor), the key,
//! what was expected and what was found, and where the cause is recognisable, what to do.
//! Every variant except `NonFiniteResult`, `Convert`, `Encode`, `Svd`, `Lycoris` and `Write` is
//! raised while planning, before the output directory exists; those six are raised while writing,
//! and the temporary output is then discarded.

use std::path::PathBuf;

use crate::adapter::{Kind, ParamRole};

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
    /// Adapter keys that match no tensor of the base.
    #[error(
        "{}: {} key(s) match no tensor of the base{}:{}\nhint: check that the adapter is for this \
         base; pass --allow-unmatched to merge the rest and list these keys in the report",
        adapter.display(), keys.len(), component_suffix(component), list(keys)
    )]
    Unmatched {
        /// The adapter.
        adapter: PathBuf,
        /// The base component it was bound to.
        component: String,
        /// The keys.
        keys: Vec<String>,
    },
    /// An adapter none of whose entries bound to a base tensor.
    #[error(
        "{}: none of its {entries} entries binds to a tensor of the base{}: this adapter is for \
         another model{hint}",
        adapter.display(), component_suffix(component)
    )]
    NothingBound {
        /// The adapter.
        adapter: PathBuf,
        /// The component.
        component: String,
        /// How many entries it has.
        entries: usize,
        /// `" (its shapes fit …)"` or empty.
        hint: String,
    },
    /// An entry names a target the base does not hold.
    #[error("{}: entry `{module}` targets `{target}`, which the base{} does not have", adapter.display(), component_suffix(component))]
    UnknownTarget {
        /// The adapter.
        adapter: PathBuf,
        /// The entry's module.
        module: String,
        /// The target name.
        target: String,
        /// The component.
        component: String,
    },
    /// An entry lacks tensors its kind needs.
    #[error(
        "{}: entry `{module}` is {kind:?} but lacks {}: that kind needs {}",
        adapter.display(), roles(missing), roles(kind.roles())
    )]
    MissingParams {
        /// The adapter.
        adapter: PathBuf,
        /// The entry's module.
        module: String,
        /// Its kind.
        kind: Kind,
        /// The roles missing.
        missing: Vec<ParamRole>,
    },
    /// An adapter tensor does not fit its base tensor.
    #[error("{0}")]
    Shape(Box<ShapeMismatch>),
    /// The entry's kind cannot apply to this target (a LoRA on a 1-D tensor, an -xs rank above
    /// the base's smaller dimension, a non-float base tensor).
    #[error("{}: entry `{module}` ({kind:?}) cannot apply to `{target}` {target_shape:?}: {reason}", adapter.display())]
    Unfit {
        /// The adapter.
        adapter: PathBuf,
        /// The entry's module.
        module: String,
        /// Its kind.
        kind: Kind,
        /// The base tensor.
        target: String,
        /// Its shape.
        target_shape: Vec<usize>,
        /// Why.
        reason: String,
    },
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

/// An adapter entry whose tensors do not fit its base tensor.
#[derive(Debug, thiserror::Error)]
#[error(
    "{}: entry `{module}` ({kind}) does not fit the base tensor `{target}` {target_shape:?}: \
     {reason}\nhint: {hint}",
    adapter.display()
)]
pub struct ShapeMismatch {
    /// The adapter.
    pub adapter: PathBuf,
    /// The entry's module.
    pub module: String,
    /// The entry's kind.
    pub kind: String,
    /// The base tensor.
    pub target: String,
    /// Its shape in PyTorch layout.
    pub target_shape: Vec<usize>,
    /// Which tensor does not fit, expected vs found.
    pub reason: String,
    /// Which base the adapter seems made for, and what the base is.
    pub hint: String,
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

fn roles(r: &[ParamRole]) -> String {
    r.iter()
        .map(|r| format!("{r:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// How many keys a message lists before counting the rest.
const LISTED: usize = 20;

fn list(keys: &[String]) -> String {
    let mut s = String::new();
    for k in keys.iter().take(LISTED) {
        s.push_str("\n  ");
        s.push_str(k);
    }
    if keys.len() > LISTED {
        s.push_str(&format!("\n  … and {} more", keys.len() - LISTED));
    }
    s
}
