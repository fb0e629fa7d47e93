//! The one write path every producing command shares (synth, convert, merge, restack,
//! translate, bake): plan → stage (temp sibling, reserved space) → produce tensors in
//! parallel while the inputs are hashed on a thread of their own (paced to the producer:
//! `HASH_LEAD`), each output hashed as it is written (`ordered`) → seal (every byte
//! written, fsync) → checks → inputs unchanged? → manifest → atomic rename.
//!
//! Owns: `ReleaseRequest`, `write_release` and its `Hooks`, `write_releases` (several
//! outputs of one production, committed all or none); what an output will contain
//! (`writer`), the files it carries over unchanged from its input (`carry`), the atomic,
//! durable writing of it (`staging`) through an ordered window that hashes and writes each
//! byte once (`ordered`), and the manifest (`release::manifest`). Producers only fill slots; they never see
//! paths, temp files or manifests, so no command can forget a step. Before committing, every
//! mapped input is checked against its identity at the time it was mapped
//! (`io::mmap::check_maps_unchanged`), so a release is never committed from an input that
//! changed under the run, and its manifest never records a hash of other bytes than the ones
//! read.

pub mod carry;
pub mod manifest;
pub mod ordered;
pub mod staging;
pub mod writer;

use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crate::io::ReadError;
use crate::io::checkpoint::MANIFEST_NAME;
use crate::release::carry::Carried;
use crate::release::manifest::{InputFile, InputRecord, Manifest, record_inputs_here};
use crate::release::staging::{Allocation, Replace, Staging, WriteError, write_durable};
use crate::release::writer::OutputPlan;

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
    /// How the files carried over unchanged from the input reached it (hard links or
    /// copies; `release::carry`).
    pub carried: Carried,
    /// Files of a pipeline input this output's format has no place for (`OutputPlan::left_out`).
    pub left_out: Vec<PathBuf>,
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
    /// The producer, a check or a step before the commit failed; nothing is left at the
    /// destination. Display and source are that error's own, so its chain is walked (and
    /// each cause said) once.
    #[error(transparent)]
    Produce(Box<dyn std::error::Error + Send + Sync>),
}

impl ReleaseError {
    /// A producer's (or a hook's) error.
    pub fn produce(e: impl std::error::Error + Send + Sync + 'static) -> ReleaseError {
        ReleaseError::Produce(Box::new(e))
    }
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

/// An error of a hook, boxed (each hook's caller has its own error type).
pub type HookError = Box<dyn std::error::Error + Send + Sync>;

/// A step run on a directory of the release being written (`Hooks::check`,
/// `Hooks::before_commit`).
pub type DirHook<'a, T> = Box<dyn FnOnce(&Path) -> Result<T, HookError> + 'a>;

/// What a release runs besides writing: steps on the sealed output, and a pause for tests.
/// `Hooks::default()` runs none.
#[derive(Default)]
pub struct Hooks<'a> {
    /// Runs on the sealed temporary directory (complete weights and sidecars, every file
    /// fsynced and hashed) before the manifest is written: its result goes into the manifest
    /// (`checks`, and status `check_failed` when one failed), so the committed manifest is
    /// never rewritten. An error (as opposed to a failed check) aborts the release.
    pub check: Option<DirHook<'a, Checked>>,
    /// Runs on the temporary directory once the manifest is in it and before the rename, so
    /// whatever it adds (a signature) appears with the release atomically, or the release
    /// does not appear at all.
    pub before_commit: Option<DirHook<'a, ()>>,
    /// Runs once the inputs are mapped and the temporary output exists, before anything is
    /// produced: tests pause a run here to change its inputs or interrupt it.
    pub gate: Option<Box<dyn FnOnce() + 'a>>,
}

/// Writes a release: `produce` fills every slot of the plan (from any number of threads,
/// through `Staging::write`) and returns the report object for the manifest; `hooks` run
/// on the sealed output. On any error the temporary directory is removed and the
/// destination is untouched.
pub fn write_release<E: std::error::Error + Send + Sync + 'static>(
    req: ReleaseRequest<'_>,
    produce: impl FnOnce(&Staging) -> Result<serde_json::Value, E>,
    hooks: Hooks<'_>,
) -> Result<Release, ReleaseError> {
    let mut releases = write_releases(
        vec![req],
        |stagings| produce(&stagings[0]).map(|report| vec![report]),
        vec![hooks],
    )?;
    releases
        .pop()
        .ok_or_else(|| ReleaseError::Produce("internal error: a release of one output".into()))
}

/// Writes several releases from one production, all or none (a release matrix): every
/// output is staged, `produce` fills them all at once (the inputs are hashed once, on one
/// thread, paced to the first output) and returns each one's report, then each is sealed,
/// checked (its own `hooks`) and given its manifest, and only when every one has got this
/// far are they committed together (`Staging::commit_all`). On any error, or an interrupt,
/// no output is left and no temporary. Every request names the same inputs: the first's
/// `inputs` and `hash_while_writing` are recorded in every manifest.
pub fn write_releases<E: std::error::Error + Send + Sync + 'static>(
    reqs: Vec<ReleaseRequest<'_>>,
    produce: impl FnOnce(&[Staging]) -> Result<Vec<serde_json::Value>, E>,
    hooks: Vec<Hooks<'_>>,
) -> Result<Vec<Release>, ReleaseError> {
    let internal = |m: &str| ReleaseError::Produce(format!("internal error: {m}").into());
    let lead = reqs
        .first()
        .ok_or_else(|| internal("a release of no output"))?;
    if hooks.len() != reqs.len() {
        return Err(internal("one set of hooks per output"));
    }
    let (inputs, hash_while_writing) = (lead.inputs.clone(), lead.hash_while_writing.clone());
    let input_paths: Vec<PathBuf> = reqs.iter().flat_map(|r| r.input_paths.to_vec()).collect();
    let mut stagings = Vec::with_capacity(reqs.len());
    for r in &reqs {
        stagings.push(Staging::begin(
            r.dest,
            r.plan.clone(),
            r.input_paths,
            r.replace,
            r.allocation,
        )?);
    }
    let mut hooks = hooks;
    for h in &mut hooks {
        if let Some(gate) = h.gate.take() {
            gate();
        }
    }
    let total = stagings[0].plan().total_bytes();
    stagings[0].report_progress(crate::progress::begin("writing", total, 0));
    let produced = AtomicBool::new(false);
    let (reports, hashed) = std::thread::scope(|s| {
        let hashing = s.spawn(|| {
            let inputs = hash_while_writing.iter().map(|(_, p, _)| p);
            let pacer = HashPacer::new(&stagings[0], inputs, &produced, PRODUCER_STALL);
            record_inputs_here(&hash_while_writing, &|read, size| pacer.wait(read, size))
        });
        let reports = {
            let _done = SetOnDrop(&produced);
            produce(&stagings)
        };
        let hashed: Result<Vec<InputRecord>, ReadError> = hashing.join().unwrap_or_else(|_| {
            Err(ReadError::io(
                lead.dest,
                std::io::Error::other("input hashing panicked"),
            ))
        });
        (reports, hashed)
    });
    // An input that changed explains any other failure, so it is reported first.
    inputs_unchanged(&input_paths)?;
    let reports = reports.map_err(ReleaseError::produce)?;
    if reports.len() != reqs.len() {
        return Err(internal("one report per output"));
    }
    let mut inputs = inputs;
    inputs.extend(hashed?);
    inputs.sort();
    inputs.dedup();
    let mut staged = Vec::with_capacity(reqs.len());
    let mut kept = Vec::with_capacity(reqs.len());
    let each = reqs.into_iter().zip(stagings).zip(reports).zip(hooks);
    for (((req, mut staging), report), hooks) in each {
        let bytes = record(&mut staging, req, inputs.clone(), report, hooks)?;
        kept.push((staging.carried(), staging.plan().left_out.clone()));
        staged.push((staging, bytes));
    }
    inputs_unchanged(&input_paths)?;
    let manifests: Vec<Vec<u8>> = staged.iter().map(|(_, b)| b.clone()).collect();
    let dirs = Staging::commit_all(staged)?;
    let mut releases = Vec::with_capacity(dirs.len());
    for ((dir, bytes), (carried, left_out)) in dirs.into_iter().zip(manifests).zip(kept) {
        let manifest = Manifest::from_bytes(&bytes).map_err(|e| {
            ReleaseError::Produce(format!("the manifest just written does not parse: {e}").into())
        })?;
        releases.push(Release {
            dir,
            manifest,
            carried,
            left_out,
        });
    }
    Ok(releases)
}

/// Seals a produced output, runs its check hook, writes its manifest into the temporary
/// directory and runs its `before_commit` hook: what it commits with (the manifest's bytes).
fn record(
    staging: &mut Staging,
    req: ReleaseRequest<'_>,
    inputs: Vec<InputRecord>,
    report: serde_json::Value,
    hooks: Hooks<'_>,
) -> Result<Vec<u8>, ReleaseError> {
    let sealed = staging.seal()?;
    let checked = match hooks.check {
        Some(check) => check(staging.tmp_dir()).map_err(ReleaseError::Produce)?,
        None => Checked {
            checks: serde_json::Value::Array(Vec::new()),
            passed: true,
        },
    };
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
    if let Some(before_commit) = hooks.before_commit {
        before_commit(staging.tmp_dir()).map_err(ReleaseError::Produce)?;
    }
    Ok(bytes)
}

/// How far the input hasher may read ahead of the producer's progress through the inputs
/// (its share of the output written, scaled to the inputs' total size). Unpaced, the hasher,
/// faster than any merge, finishes a 14B base long before the merge reaches its end
/// (BENCHMARKS.md, "After vectorised rounding and the paced input hasher"); on a machine
/// whose free memory is smaller than the base, the page cache has evicted the pages the
/// merge reads next by then (the oldest go first), so the base is read from disk twice.
/// Kept within this distance, the merge finds in memory what the hasher just read.
const HASH_LEAD: u64 = 1 << 30;

/// How long the producer may write nothing before the hasher stops waiting for it (a
/// producer computing before it writes, such as the SVDs of -xs bases, leaves the core
/// to the hasher).
const PRODUCER_STALL: std::time::Duration = std::time::Duration::from_millis(500);

/// Holds the input hasher within [`HASH_LEAD`] of the producer (an `io::input_hash::Pace`).
/// The hasher's position is what it has read of all inputs, in the order it reads them (a
/// sharded base shard by shard, as the producer reads it; a file found in the hash cache is
/// not read and counts nothing, which only lets the hasher further ahead). Lives on the
/// hashing thread; stops holding once the producer has finished or stalls.
struct HashPacer<'a> {
    staging: &'a Staging,
    produced: &'a AtomicBool,
    /// [`PRODUCER_STALL`] (shorter or longer in tests).
    stall: std::time::Duration,
    /// Bytes of all the inputs to hash.
    inputs_total: u64,
    /// Bytes of the files read before the current one, and the current one's size.
    files_before: Cell<(u64, u64)>,
    /// Written bytes when last seen to change, and when.
    last_change: Cell<(u64, Instant)>,
}

impl<'a> HashPacer<'a> {
    fn new<'p>(
        staging: &'a Staging,
        inputs: impl Iterator<Item = &'p PathBuf>,
        produced: &'a AtomicBool,
        stall: std::time::Duration,
    ) -> HashPacer<'a> {
        let inputs_total = inputs
            .filter_map(|p| std::fs::metadata(p).ok())
            .map(|m| m.len())
            .sum();
        HashPacer {
            staging,
            produced,
            stall,
            inputs_total,
            files_before: Cell::new((0, 0)),
            last_change: Cell::new((staging.written_bytes(), Instant::now())),
        }
    }

    /// Waits while the hasher, `read` bytes into a file of `size`, is more than
    /// [`HASH_LEAD`] ahead of the producer's share of the inputs.
    fn wait(&self, read: u64, size: u64) {
        if read == 0 {
            let (before, previous) = self.files_before.get();
            self.files_before.set((before + previous, size));
        }
        let position = u128::from(self.files_before.get().0 + read);
        let total = u128::from(self.staging.plan().tensor_bytes().max(1));
        while !self.produced.load(Ordering::Acquire) {
            let written = self.staging.written_bytes();
            let share = u128::from(self.inputs_total) * u128::from(written) / total;
            if position <= share + u128::from(HASH_LEAD) {
                return;
            }
            let (seen, since) = self.last_change.get();
            if written != seen {
                self.last_change.set((written, Instant::now()));
            } else if since.elapsed() >= self.stall {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }
}

/// Sets its flag when dropped, also while unwinding (so a panicking producer releases the
/// hasher waiting for it).
struct SetOnDrop<'a>(&'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use super::*;
    use crate::format::header_layout::PlannedTensor;
    use crate::io::DType;
    use crate::release::writer::ComponentOutput;

    /// A staged output of one 4096-byte tensor, in `dir`.
    fn staged(dir: &Path) -> Staging {
        let c = ComponentOutput {
            rel_dir: PathBuf::new(),
            stem: "model".into(),
            tensors: vec![PlannedTensor {
                name: "w".into(),
                dtype: DType::F32,
                shape: vec![1024],
            }],
            metadata: BTreeMap::new(),
            sidecars: Vec::new(),
            max_shard_bytes: None,
        };
        let plan = OutputPlan::build(&[c], &[]).unwrap();
        let dest = dir.join("out");
        Staging::begin(&dest, plan, &[], Replace::Never, Allocation::Reserve).unwrap()
    }

    const GIB: u64 = 1 << 30;
    const NEVER: Duration = Duration::from_secs(3600);

    /// Two 2 GiB input shards (sparse: no disk) in `dir`.
    fn two_shards(dir: &Path) -> Vec<PathBuf> {
        (0..2)
            .map(|i| {
                let p = dir.join(format!("shard{i}"));
                std::fs::File::create(&p).unwrap().set_len(2 * GIB).unwrap();
                p
            })
            .collect()
    }

    #[test]
    fn the_hasher_waits_for_the_producer_only_when_more_than_the_lead_ahead() {
        let dir = tempfile::tempdir().unwrap();
        let staging = staged(dir.path());
        let shards = two_shards(dir.path());
        let produced = AtomicBool::new(false);
        let pacer = HashPacer::new(&staging, shards.iter(), &produced, NEVER);
        // Nothing written yet: the first shard may be read up to the lead.
        let start = Instant::now();
        pacer.wait(0, 2 * GIB);
        pacer.wait(HASH_LEAD, 2 * GIB);
        assert!(start.elapsed() < Duration::from_secs(1));
        // The second shard starts 2 GiB into the inputs (needs a quarter of the output
        // written), and 1 GiB into it needs half: a producer writing the half 64 bytes at a
        // time (and then nothing) releases both, in turn.
        let slot = staging.plan().slot(0, "w").unwrap();
        std::thread::scope(|s| {
            s.spawn(|| {
                for part in 0..32 {
                    std::thread::sleep(Duration::from_millis(2));
                    staging.write(slot, part * 64, &[0; 64]).unwrap();
                }
            });
            pacer.wait(0, 2 * GIB);
            assert!(staging.written_bytes() >= 1024, "released before a quarter");
            pacer.wait(GIB, 2 * GIB);
            assert_eq!(staging.written_bytes(), 2048, "released before the half");
        });
    }

    #[test]
    fn the_hasher_stops_waiting_when_the_producer_finishes_or_stalls() {
        let dir = tempfile::tempdir().unwrap();
        let staging = staged(dir.path());
        let shards = two_shards(dir.path());
        let produced = AtomicBool::new(false);
        // Finished (or panicked: `SetOnDrop` runs while unwinding) from another thread.
        let pacer = HashPacer::new(&staging, shards.iter(), &produced, NEVER);
        std::thread::scope(|s| {
            let producer = s.spawn(|| {
                std::thread::sleep(Duration::from_millis(20));
                let _done = SetOnDrop(&produced);
                panic!("a producer that panics");
            });
            pacer.wait(0, 2 * GIB);
            pacer.wait(0, 2 * GIB);
            assert!(produced.load(Ordering::Acquire));
            assert!(producer.join().is_err());
        });
        // A producer that writes nothing for the stall time lets the hasher go on.
        let produced = AtomicBool::new(false);
        let stall = Duration::from_millis(50);
        let pacer = HashPacer::new(&staging, shards.iter(), &produced, stall);
        let start = Instant::now();
        pacer.wait(0, 2 * GIB);
        pacer.wait(0, 2 * GIB);
        assert!(start.elapsed() >= stall);
    }
}
