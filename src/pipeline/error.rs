//! Why a plan was refused or its executor failed.
//!
//! Owns: [`PipelineError`]. Every variant names the file (or the base tensor), the key, what
//! was expected and what was found. `Convert`, `Encode`, `Unheld` and `Write` are raised while
//! writing
//! (the temporary output is then discarded; `Unheld` also while planning, for an adapter's
//! own tensor); every other variant while planning, before the output directory exists. Does not own: binding refusals (`adapter`), the errors of
//! computing a merged target (`merge::MergeError`, which wraps this one).

use std::path::PathBuf;

/// A refused plan or a failed job. Nothing is left at the destination when one is returned.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// A base or adapter could not be read.
    #[error(transparent)]
    Read(#[from] crate::io::ReadError),
    /// The output could not be laid out in the requested layout.
    #[error("base component `{component}`")]
    Layout {
        /// The component (`""` for a single model).
        component: String,
        /// Why.
        #[source]
        source: crate::model::plan_error::PlanError,
    },
    /// A merged target whose output dtype cannot hold a merged value (an integer tensor
    /// kept as it is stored).
    #[error("`{tensor}` cannot be merged into {dtype} output")]
    IntegerTarget {
        /// The stored tensor.
        tensor: String,
        /// Its output dtype.
        dtype: crate::io::DType,
    },
    /// The base and options cannot give the requested output (a config.json that is not a
    /// WAN config, a target the output layout leaves out, a quantized output of a base that
    /// is not one WAN transformer).
    #[error("{0}")]
    Plan(String),
    /// A bug: an invariant of the plan did not hold.
    #[error("internal error: {0}")]
    Internal(String),
    /// Values the output cannot hold (NaN, ±inf, a finite value beyond the output dtype or
    /// format), in a base tensor, an adapter tensor or a merged one, refused
    /// (`pipeline::NonFinite::Refuse`).
    #[error(transparent)]
    Unheld(Box<super::nonfinite::UnheldValues>),
    /// A tensor could not be read, converted or laid out for the output.
    #[error("tensor `{tensor}`: {reason}")]
    Convert {
        /// The base tensor.
        tensor: String,
        /// Why.
        reason: String,
    },
    /// A quantized output cannot be made of the base (several transformers, a layout or a
    /// key the formats do not read).
    #[error("{}", path.display())]
    Quantize {
        /// The base.
        path: PathBuf,
        /// Why.
        #[source]
        source: Box<crate::quant::encode::QuantError>,
    },
    /// A tensor could not be encoded for a quantized output (a non-finite weight); the
    /// error names the file and key.
    #[error(transparent)]
    Encode(Box<crate::quant::encode::QuantError>),
    /// Writing the output failed.
    #[error("writing `{tensor}`")]
    Write {
        /// The output tensor.
        tensor: String,
        /// Why.
        #[source]
        source: Box<crate::release::staging::WriteError>,
    },
    /// An Orbax item could not be encoded (`--to orbax`).
    #[error("Orbax item `{item}`")]
    OrbaxEncode {
        /// The item folder, relative to the output.
        item: String,
        /// Why.
        #[source]
        source: crate::format::orbax::encode::EncodeError,
    },
}

impl From<super::nonfinite::UnheldValues> for PipelineError {
    fn from(u: super::nonfinite::UnheldValues) -> PipelineError {
        PipelineError::Unheld(Box::new(u))
    }
}

impl From<crate::quant::encode::QuantError> for PipelineError {
    fn from(e: crate::quant::encode::QuantError) -> PipelineError {
        PipelineError::Encode(Box::new(e))
    }
}
