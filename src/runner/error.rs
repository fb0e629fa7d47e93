//! `RunError`, the error type of everything in `runner`: each variant names the file or
//! tensor concerned, what was expected and what was found.

use std::path::PathBuf;

use crate::io::ReadError;

/// Why a model, an inputs file or a run was refused.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A file could not be read or is not valid safetensors.
    #[error(transparent)]
    Read(#[from] ReadError),
    /// A config.json or model_index.json could not be read or parsed.
    #[error("{}: {reason}", path.display())]
    Config {
        /// The JSON file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The model folder or file does not have a shape the runner knows.
    #[error("{}: {reason}", path.display())]
    ModelLayout {
        /// The path given as the model.
        path: PathBuf,
        /// What is missing or ambiguous.
        reason: String,
    },
    /// A checkpoint tensor has the wrong name, shape or dtype for its config.
    #[error("{source_name}: weight `{tensor}`: {reason}")]
    Weight {
        /// The checkpoint (file or folder).
        source_name: String,
        /// The diffusers parameter name.
        tensor: String,
        /// Expected vs found.
        reason: String,
    },
    /// A checkpoint's keys or shapes do not fit a layout and config.
    #[error("{source_name}")]
    Plan {
        /// The checkpoint (file or folder).
        source_name: String,
        /// What does not fit.
        #[source]
        source: crate::model::plan_error::PlanError,
    },
    /// An input tensor is missing, mis-shaped or inconsistent with the model.
    #[error("{origin}: input `{tensor}`: {reason}")]
    Input {
        /// Where the inputs came from (the inputs file, or "inputs").
        origin: String,
        /// The input tensor's name.
        tensor: String,
        /// Expected vs found.
        reason: String,
    },
    /// Sampling options that contradict each other or the model.
    #[error("{0}")]
    Options(String),
    /// A model with a second expert and no boundary ratio to switch at (the front end
    /// says how to give one).
    #[error("the model has transformer_2 but no boundary ratio (none in model_index.json)")]
    NoBoundaryRatio,
    /// No config.json, and shapes that are not a released WAN model's: the head count is
    /// unknown (the front end says how to give a config).
    #[error(
        "{}: {}, so the head count is unknown",
        path.display(),
        if *quantized {
            "a quantized checkpoint carries no config.json, and these shapes are not a released WAN model's"
        } else {
            "no config.json, and the shapes are not those of a released WAN model"
        }
    )]
    UnknownConfig {
        /// The path given as the model.
        path: PathBuf,
        /// A quantized checkpoint (which never has a config.json beside it).
        quantized: bool,
    },
    /// A weight could not be computed (the merge behind an unmerged reference failed).
    #[error("{source_name}: weight `{tensor}`")]
    Computed {
        /// The weights (file, folder, or reference model).
        source_name: String,
        /// The diffusers parameter name.
        tensor: String,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The output could not be laid out or written.
    #[error("{}", path.display())]
    Write {
        /// The output path.
        path: PathBuf,
        /// Why (the header layout, or the write of the file with its temporary sibling).
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl RunError {
    /// An input error against the generic origin "inputs" (the CLI re-labels it with the
    /// file name).
    pub fn input(tensor: &str, reason: impl Into<String>) -> RunError {
        RunError::Input {
            origin: "inputs".into(),
            tensor: tensor.into(),
            reason: reason.into(),
        }
    }
}
