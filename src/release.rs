//! The one write path every producing command shares (synth, convert, merge, restack,
//! translate, bake): plan → stage (temp sibling, reserved space) → produce tensors in
//! parallel while the inputs are hashed on a thread of their own, each output hashed as it is
//! written (`io::ordered`) → seal (every byte written, fsync) → checks → inputs unchanged? →
//! manifest → atomic rename.
//!
//! Owns: `ReleaseRequest` and `write_release`. Producers only fill slots; they never see
//! paths, temp files or manifests, so no command can forget a step. Before committing, every
//! mapped input is checked against its identity at the time it was mapped
//! (`io::mmap::check_maps_unchanged`), so a release is never committed from an input that
//! changed under the run, and its manifest never records a hash of other bytes than the ones
//! read.

use std::path::{Path, PathBuf};

use crate::io::ReadError;
use crate::io::staging::{Allocation, MANIFEST_NAME, Replace, Staging, WriteError, write_durable};
use crate::io::writer::OutputPlan;
use crate::manifest::{InputFile, InputRecord, Manifest, record_inputs_here};

/// Everything needed to write one release directory.
pub struct ReleaseRequest<'a> {
    /// Destination directory.
    pub dest: &'a Path,
    /// What it will contain.
    pub plan: OutputPlan,
    /// Input paths the destination must not overlap.
    pub input_paths: &'a [PathBuf],
    /// Inputs already hashed, for the manifest.
    pub inputs: Vec<InputRecord>,
    /// Inputs to hash for the manifest while the producer runs (on one thread of their own,
    /// so hashing a multi-GB base overlaps the merge instead of preceding it).
    pub hash_while_writing: Vec<InputFile>,
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
    /// An input could not be hashed, or changed while it was read; nothing is left at the
    /// destination.
    #[error(transparent)]
    Input(#[from] ReadError),
    /// The producer failed; nothing is left at the destination. Display and source are the
    /// producer's error's own, so its chain is walked (and each cause said) once.
    #[error(transparent)]
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
    test_gate();
    staging.report_progress(crate::progress::begin(
        "writing",
        staging.plan().total_bytes(),
        0,
    ));
    let (report, hashed) = std::thread::scope(|s| {
        let hashing = s.spawn(|| record_inputs_here(&req.hash_while_writing));
        let report = produce(&staging);
        let hashed: Result<Vec<InputRecord>, ReadError> = hashing.join().unwrap_or_else(|_| {
            Err(ReadError::io(
                req.dest,
                std::io::Error::other("input hashing panicked"),
            ))
        });
        (report, hashed)
    });
    // An input that changed explains any other failure, so it is reported first.
    inputs_unchanged(req.input_paths)?;
    let report = report.map_err(ReleaseError::Produce)?;
    let mut inputs = req.inputs;
    inputs.extend(hashed?);
    inputs.sort();
    inputs.dedup();
    let sealed = staging.seal()?;
    let checked = check(staging.tmp_dir()).map_err(ReleaseError::Produce)?;
    let mut manifest = Manifest::new(
        req.command,
        inputs,
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
    inputs_unchanged(req.input_paths)?;
    // `commit` writes the same bytes again; written here first so the hook sees them.
    write_durable(&staging.tmp_dir().join(MANIFEST_NAME), &bytes)?;
    before_commit(staging.tmp_dir()).map_err(ReleaseError::Produce)?;
    let dir = staging.commit(&bytes)?;
    let manifest =
        Manifest::from_bytes(&bytes).map_err(|e| ReleaseError::Produce(anyhow::anyhow!(e)))?;
    Ok(Release { dir, manifest })
}

/// Fails when a mapped input shrank, grew or was rewritten since it was mapped.
fn inputs_unchanged(inputs: &[PathBuf]) -> Result<(), ReleaseError> {
    crate::io::mmap::check_maps_unchanged(inputs).map_err(|c| {
        ReleaseError::Input(ReadError::Changed {
            path: c.path,
            what: c.what,
        })
    })
}

/// A hook for the tests of inputs that change during a run (tests/io.rs): when
/// `WANBAKE_TEST_GATE` names a path `P`, the run creates `P.ready` once its inputs are
/// mapped and its temporary output exists, then waits (up to a minute) for `P.go` to exist
/// before producing anything. Unset, it does nothing.
fn test_gate() {
    let Some(gate) = std::env::var_os("WANBAKE_TEST_GATE") else {
        return;
    };
    let gate = std::path::PathBuf::from(gate);
    let with = |ext: &str| {
        let mut p = gate.clone().into_os_string();
        p.push(ext);
        PathBuf::from(p)
    };
    let _ = std::fs::write(with(".ready"), b"");
    let go = with(".go");
    let start = std::time::Instant::now();
    while !go.exists() && start.elapsed() < std::time::Duration::from_secs(60) {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}
