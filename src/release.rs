//! The one write path every producing command shares (synth, merge, restack, bake):
//! plan → stage (temp sibling, reserved space) → produce tensors in parallel → seal (fsync,
//! re-read, hash) → manifest → atomic rename.
//!
//! Owns: `ReleaseRequest` and `write_release`. Producers only fill slots; they never see
//! paths, temp files or manifests, so no command can forget a step.

use std::path::{Path, PathBuf};

use crate::io::staging::{Allocation, MANIFEST_NAME, Replace, Staging, WriteError, write_durable};
use crate::io::writer::OutputPlan;
use crate::manifest::{InputRecord, Manifest};

/// Everything needed to write one release directory.
pub struct ReleaseRequest<'a> {
    /// Destination directory.
    pub dest: &'a Path,
    /// What it will contain.
    pub plan: OutputPlan,
    /// Input paths the destination must not overlap.
    pub input_paths: &'a [PathBuf],
    /// Hashed inputs for the manifest.
    pub inputs: Vec<InputRecord>,
    /// Subcommand name for the manifest.
    pub command: &'a str,
    /// Options (or normalised recipe) for the manifest.
    pub options: serde_json::Value,
    /// Replace an existing destination?
    pub replace: Replace,
    /// Reserve space up front (normal) or write sparse files (zero-filled synthetic data).
    pub allocation: Allocation,
}

/// What was written.
#[derive(Debug)]
pub struct Release {
    /// The destination.
    pub dir: PathBuf,
    /// The manifest as written.
    pub manifest: Manifest,
}

/// Why a release could not be written.
#[derive(Debug, thiserror::Error)]
pub enum ReleaseError {
    /// Writing failed; nothing is left at the destination.
    #[error(transparent)]
    Write(#[from] WriteError),
    /// The producer failed; nothing is left at the destination.
    #[error("{0:#}")]
    Produce(anyhow::Error),
}

/// The outcome of post-write checks run on the sealed output before it is committed.
#[derive(Clone, Debug)]
pub struct Checked {
    /// The manifest's `checks` array.
    pub checks: serde_json::Value,
    /// Did every check pass? A failure still commits the output, with the manifest's
    /// status `check_failed`.
    pub passed: bool,
}

/// Writes a release: `produce` fills every slot of the plan (from any number of threads,
/// through `Staging::write`) and returns the report object for the manifest. On any error
/// the temporary directory is removed and the destination is untouched.
pub fn write_release(
    req: ReleaseRequest<'_>,
    produce: impl FnOnce(&Staging) -> anyhow::Result<serde_json::Value>,
) -> Result<Release, ReleaseError> {
    write_release_checked(req, produce, |_| {
        Ok(Checked {
            checks: serde_json::Value::Array(Vec::new()),
            passed: true,
        })
    })
}

/// `write_release`, with `check` run on the sealed temporary directory (complete weights and
/// sidecars, every file fsynced and hashed) before the manifest is written: its result goes
/// into the manifest (`checks`, and status `check_failed` when one failed), so the committed
/// manifest is never rewritten. An error from `check` (as opposed to a failed check) aborts
/// the release like any other.
pub fn write_release_checked(
    req: ReleaseRequest<'_>,
    produce: impl FnOnce(&Staging) -> anyhow::Result<serde_json::Value>,
    check: impl FnOnce(&Path) -> anyhow::Result<Checked>,
) -> Result<Release, ReleaseError> {
    write_release_sealed(req, produce, check, |_| Ok(()))
}

/// `write_release_checked`, with `before_commit` run on the temporary directory once the
/// manifest is in it and before the rename, so whatever it adds (a signature) appears with
/// the release atomically, or the release does not appear at all.
pub fn write_release_sealed(
    req: ReleaseRequest<'_>,
    produce: impl FnOnce(&Staging) -> anyhow::Result<serde_json::Value>,
    check: impl FnOnce(&Path) -> anyhow::Result<Checked>,
    before_commit: impl FnOnce(&Path) -> anyhow::Result<()>,
) -> Result<Release, ReleaseError> {
    let mut staging = Staging::begin(
        req.dest,
        req.plan,
        req.input_paths,
        req.replace,
        req.allocation,
    )?;
    let report = produce(&staging).map_err(ReleaseError::Produce)?;
    let sealed = staging.seal()?;
    let checked = check(staging.tmp_dir()).map_err(ReleaseError::Produce)?;
    let mut manifest = Manifest::new(
        req.command,
        req.inputs,
        req.options,
        staging.plan(),
        &sealed,
        report,
    );
    manifest.checks = checked.checks;
    if !checked.passed {
        manifest.status = "check_failed".into();
    }
    let bytes = manifest.to_canonical_bytes();
    // `commit` writes the same bytes again; written here first so the hook sees them.
    write_durable(&staging.tmp_dir().join(MANIFEST_NAME), &bytes)?;
    before_commit(staging.tmp_dir()).map_err(ReleaseError::Produce)?;
    let dir = staging.commit(&bytes)?;
    let manifest =
        Manifest::from_bytes(&bytes).map_err(|e| ReleaseError::Produce(anyhow::anyhow!(e)))?;
    Ok(Release { dir, manifest })
}
