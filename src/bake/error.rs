//! Why a bake stopped. Every variant names the file, field or check involved.

use std::path::PathBuf;

use crate::io::ReadError;
use crate::merge::{MergeError, MergeFailure};
use crate::recipe::{Recipe, RecipeError};

/// A bake failure. Plan-phase variants (`Recipe`, `Read`, `Merge`, `HashMismatch`,
/// `NoSpace`, `CheckSetup`) leave nothing on disk; a failed check is not an error (the
/// output is written and marked `check_failed`).
#[derive(Debug, thiserror::Error)]
pub enum BakeError {
    /// The recipe is malformed or a value in it does not fit.
    #[error(transparent)]
    Recipe(#[from] RecipeError),
    /// An input could not be read.
    #[error(transparent)]
    Read(#[from] ReadError),
    /// Binding or planning the merge failed (unmatched keys, shapes, ranks, ...).
    #[error(transparent)]
    Merge(Box<MergeError>),
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
    /// Writing failed; nothing is left at the destination.
    #[error(transparent)]
    Write(Box<MergeFailure>),
    /// The written output does not verify against its manifest.
    #[error("{dir}: the written output does not verify: {what}")]
    Verify {
        /// The output.
        dir: String,
        /// The first differences.
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

impl From<MergeError> for BakeError {
    fn from(e: MergeError) -> BakeError {
        BakeError::Merge(Box::new(e))
    }
}

impl From<MergeFailure> for BakeError {
    fn from(e: MergeFailure) -> BakeError {
        match e {
            MergeFailure::Merge(m) => BakeError::Merge(m),
            other => BakeError::Write(Box::new(other)),
        }
    }
}
