//! Why a bake stopped. Every variant names the file, field or check involved.

use std::path::PathBuf;

use crate::adapter::AdapterError;
use crate::io::ReadError;
use crate::pipeline::PipelineError;
use crate::recipe::{Recipe, RecipeError};
use crate::release::ReleaseError;

/// A bake failure. Plan-phase variants (`Recipe`, `Read`, `Adapter`, `Plan`,
/// `HashMismatch`, `NoSpace`, `CheckSetup`, `CheckInput`) leave nothing on disk; a failed check is not an error (the
/// output is written and marked `check_failed`).
#[derive(Debug, thiserror::Error)]
pub enum BakeError {
    /// The recipe is malformed or a value in it does not fit.
    #[error(transparent)]
    Recipe(#[from] RecipeError),
    /// An input could not be read.
    #[error(transparent)]
    Read(#[from] ReadError),
    /// An adapter could not be opened or bound (unmatched keys, shapes, ranks, ...).
    #[error(transparent)]
    Adapter(Box<AdapterError>),
    /// Planning the output failed (a target the layout leaves out, non-finite adapter
    /// values, ...).
    #[error(transparent)]
    Plan(Box<PipelineError>),
    /// A declared sha256 does not match the file.
    #[error(
        "{what}: {} has sha256 {found}, but the recipe expects {expected} \
         (a different download, or the recipe pins the wrong file)",
        path.display()
    )]
    HashMismatch {
        /// `base` or `adapter[i]`.
        what: String,
        /// The file.
        path: PathBuf,
        /// Declared.
        expected: String,
        /// Found.
        found: String,
    },
    /// The output does not fit.
    #[error(
        "{}: the output needs {needed} bytes but only {available} are free there",
        dir.display()
    )]
    NoSpace {
        /// The directory measured.
        dir: PathBuf,
        /// Needed.
        needed: u64,
        /// Free.
        available: u64,
    },
    /// A check cannot run as written (files, tensors, a base the runner cannot load).
    #[error("check `{check}`: {reason}")]
    CheckSetup {
        /// The check's name.
        check: String,
        /// Why.
        reason: String,
    },
    /// A check cannot run: what it reads could not be opened, read or run.
    #[error("check `{check}`{}", step.map(|s| format!(": {s}")).unwrap_or_default())]
    CheckInput {
        /// The check's name.
        check: String,
        /// What was being read, when the cause does not say it (`expected output`).
        step: Option<&'static str>,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Writing failed; nothing is left at the destination.
    #[error(transparent)]
    Write(Box<ReleaseError>),
    /// Signing the staged release failed; nothing is left at the destination.
    #[error(transparent)]
    Sign(#[from] crate::signing::SignError),
    /// The staged release was not signed (it does not verify against its manifest).
    #[error("the release is not signed: {reason}")]
    NotSigned {
        /// Why.
        reason: String,
    },
    /// The written output does not verify against its manifest.
    #[error("{dir}: the written output does not verify: {what}")]
    Verify {
        /// The output.
        dir: String,
        /// The first differences.
        what: String,
    },
    /// A check of a release matrix's output failed: a matrix commits only when every check
    /// of every output passes, so nothing was written.
    #[error(
        "{output}: {what}; a release matrix commits only when every check passes, so no output was written"
    )]
    MatrixCheckFailed {
        /// The output (its folder, as the recipe spells it).
        output: String,
        /// Each failed check with its difference and tolerance.
        what: String,
    },
    /// A bug: an invariant of the bake did not hold.
    #[error("internal error: {0}")]
    Internal(String),
}

impl BakeError {
    /// An invalid value in `recipe`'s `field`.
    pub fn recipe(recipe: &Recipe, field: impl Into<String>, message: impl Into<String>) -> Self {
        BakeError::Recipe(RecipeError::Invalid {
            path: recipe.file.clone(),
            field: field.into(),
            message: message.into(),
        })
    }
}

impl BakeError {
    /// A check's input that could not be opened, read or run; `step` says what was being
    /// read when the cause does not.
    pub fn check_input(
        check: &Option<String>,
        step: Option<&'static str>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        BakeError::CheckInput {
            check: check.clone().unwrap_or_default(),
            step,
            source: Box::new(source),
        }
    }
}

impl BakeError {
    /// What `recipe`'s `field` names cannot be used, and why.
    pub fn unusable(
        recipe: &Recipe,
        field: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        BakeError::Recipe(RecipeError::Unusable {
            path: recipe.file.clone(),
            field: field.into(),
            source: Box::new(source),
        })
    }
}

impl From<AdapterError> for BakeError {
    fn from(e: AdapterError) -> BakeError {
        BakeError::Adapter(Box::new(e))
    }
}

impl From<PipelineError> for BakeError {
    fn from(e: PipelineError) -> BakeError {
        BakeError::Plan(Box::new(e))
    }
}

impl From<ReleaseError> for BakeError {
    fn from(e: ReleaseError) -> BakeError {
        BakeError::Write(Box::new(e))
    }
}
