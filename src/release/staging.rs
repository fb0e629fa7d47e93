//! Atomic, durable output: a temporary sibling directory that becomes the destination only
//! when everything in it is written, hashed and fsynced.
//!
//! Owns: refusing to write over an input, the free-space check, pre-sized output files
//! (`fallocate`, so running out of space fails before the first tensor), positional writes
//! from any number of threads (`write_at`: the header is known in advance, so tensors and
//! slices of stacked tensors land in place in any order), the check that every planned
//! tensor byte was written, the digests (taken as the bytes pass through `release::ordered`; a
//! GGUF file's header is parsed back at the seal for its tensors' types), the fsync, the rename into place, and the cleanup of
//! temporaries left by killed runs (each run holds an advisory lock on a sibling `.lock`
//! file; a lock nobody holds means its owner is dead). A `Staging` dropped before `commit`
//! removes its temporary directory, and so does an interrupt ([`install_signal_guards`]).
//!
//! Besides the planned files, a staged output may hold *late files* ([`LateFile`]): files
//! whose size is known only once they are written (a compressed Orbax chunk, an OCDBT
//! node file). Each is written front to back into the temporary directory, hashed as its
//! bytes pass, fsynced when finished and then named, by the caller or by its own sha256
//! (so names do not depend on which thread finished first); the seal lists them with the
//! aux files. They are not pre-sized, so the free-space check does not cover them.
//!
//! The plan's carried files (`io::checkpoint::CarriedFile`) are put into the temporary directory by
//! `begin`, hard-linked or copied (`carry`; a copy's bytes are checked against the free space
//! first), and the seal lists them with the aux files too: an interrupted or failed run
//! removes them with the rest, and an input's own link count is restored.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use std::sync::Arc;

use super::carry::{self, Carried};
use super::ordered::{NewFile, OrderedError, OrderedFiles, lock};
use super::writer::{OutputPlan, Slot};
use crate::format::header::Header;
use crate::format::header_layout::HeaderLayout;
use crate::io::digest::{self, SafetensorsDigest};
use crate::io::durable::{self, TMP_MARK, parent_dir};
use crate::io::file::ReadError;
use crate::progress::{self, PhaseGuard};

/// Why an output could not be written. Every variant names the path.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// The destination exists and overwriting was not asked for.
    #[error("{}: already exists", path.display())]
    Exists {
        /// The destination.
        path: PathBuf,
    },
    /// The destination is, contains, or lies inside an input.
    #[error("{}: refusing to write here: it overlaps the input {}", dest.display(), input.display())]
    OverlapsInput {
        /// The destination.
        dest: PathBuf,
        /// The input.
        input: PathBuf,
    },
    /// Not enough free space for the planned output.
    #[error("{}: not enough free space: the output needs {needed} bytes, {available} are available", path.display())]
    NoSpace {
        /// The directory checked.
        path: PathBuf,
        /// Planned bytes.
        needed: u64,
        /// Free bytes.
        available: u64,
    },
    /// An OS error.
    #[error("{}", path.display())]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A file carried over unchanged from the input could not be (`carry`).
    #[error(transparent)]
    Carry(#[from] super::carry::CarryError),
    /// Re-reading a written file failed (disk or filesystem trouble).
    #[error("re-reading the written output failed")]
    Reread(#[from] ReadError),
    /// The producer wrote more or fewer tensor bytes than planned (a bug in the producer).
    #[error(
        "internal error: the output plan has {planned} tensor bytes, the producer wrote {written}"
    )]
    Unwritten {
        /// Planned tensor bytes.
        planned: u64,
        /// Bytes written.
        written: u64,
    },
    /// A folder the output would be created in exists as something else (a file).
    #[error("{}: not a directory, so the output cannot be created inside it", path.display())]
    NotADirectory {
        /// The existing path that is not a folder.
        path: PathBuf,
    },
    /// A byte of a weight file was never written (a bug in the producer).
    #[error("internal error: {}: byte {offset} was never written", path.display())]
    Gap {
        /// The file.
        path: PathBuf,
        /// The first byte not written.
        offset: u64,
    },
    /// A planned header does not parse back as the plan (a bug in the writer).
    #[error("internal error: {}: the planned header is not valid: {reason}", path.display())]
    Header {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A write outside the planned slot (a bug in the producer).
    #[error(
        "internal error: write of {len} bytes at offset {offset} does not fit tensor `{tensor}` ({size} bytes)"
    )]
    OutOfSlot {
        /// The tensor.
        tensor: String,
        /// Offset inside the tensor.
        offset: usize,
        /// Length written.
        len: usize,
        /// Tensor size.
        size: usize,
    },
}

/// The byte ranges of a planned file that neither its header nor any tensor covers (a GGUF
/// file's alignment padding), sorted.
fn unwritten_ranges(layout: &HeaderLayout) -> Vec<(u64, u64)> {
    let mut covered: Vec<(u64, u64)> = layout
        .tensors
        .iter()
        .map(|t| (t.begin as u64, t.end as u64))
        .collect();
    covered.push((0, layout.prefix.len() as u64));
    covered.sort_unstable();
    let mut gaps = Vec::new();
    let mut at = 0;
    for (b, e) in covered {
        if b > at {
            gaps.push((at, b));
        }
        at = at.max(e);
    }
    let len = layout.file_len() as u64;
    if at < len {
        gaps.push((at, len));
    }
    gaps
}

/// Creating the output's parent folders failed. Where one of them exists as a file the OS
/// says EEXIST ("File exists") on that file, or ENOTDIR below it, which misleads: name the
/// file that is not a folder instead.
fn parent_error(parent: &Path, source: std::io::Error) -> WriteError {
    let misleading = matches!(
        source.kind(),
        std::io::ErrorKind::AlreadyExists | std::io::ErrorKind::NotADirectory
    );
    let file = parent
        .ancestors()
        .find(|p| p.symlink_metadata().is_ok())
        .filter(|p| !p.is_dir());
    match file {
        Some(file) if misleading => WriteError::NotADirectory {
            path: file.to_path_buf(),
        },
        _ => WriteError::Io {
            path: parent.to_path_buf(),
            source,
        },
    }
}

fn ordered_error(e: OrderedError) -> WriteError {
    match e {
        OrderedError::Io { path, source } => WriteError::Io { path, source },
        OrderedError::Gap { path, offset } | OrderedError::Late { path, offset } => {
            WriteError::Gap { path, offset }
        }
    }
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> WriteError + '_ {
    move |source| WriteError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Installs the process's signal guards. Called once by the binary at startup.
///
/// * "File size limit exceeded" becomes an error instead of a kill: with the default action
///   a write past `ulimit -f` terminates the process with SIGXFSZ before it can clean up or
///   say why.
/// * An interrupt (SIGINT: Ctrl-C; SIGTERM; SIGHUP: the terminal closed) removes the
///   temporary folder of every output still being written (the list `LIVE`), says so on
///   stderr, and then ends the process as the signal's default action would (so a shell
///   sees "killed by SIGINT"). Without it, the reserved temporary (the whole output's size: 28.6 GB for a
///   14B merge) stayed on disk until the next run to the same destination. The handler runs
///   on a thread of its own (`signal_hook::iterator`), so removing folders there is ordinary
///   code, not async-signal context.
pub fn install_signal_guards() {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM, SIGXFSZ};
    use std::sync::atomic::AtomicBool;
    let _ = signal_hook::flag::register(SIGXFSZ, Arc::new(AtomicBool::new(false)));
    let Ok(mut signals) = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP]) else {
        return;
    };
    let _ = std::thread::Builder::new()
        .name("wanbake-signals".into())
        .spawn(move || {
            if let Some(signal) = signals.forever().next() {
                remove_live_outputs(signal);
                let _ = signal_hook::low_level::emulate_default_handler(signal);
                std::process::exit(128 + signal);
            }
        });
}

/// An output being written now: its destination, temporary folder and lock file.
struct LiveOutput {
    dest: PathBuf,
    tmp: PathBuf,
    lock: PathBuf,
}

/// The outputs being written now. A `Staging` is listed from the moment its temporary
/// folder exists until it is committed or removed; the commit's rename happens under this
/// lock, so an interrupt either removes the temporary before the rename or finds it gone.
static LIVE: std::sync::Mutex<Vec<LiveOutput>> = std::sync::Mutex::new(Vec::new());

fn live() -> std::sync::MutexGuard<'static, Vec<LiveOutput>> {
    // Every update is one push or retain, so a poisoned list is still consistent.
    LIVE.lock().unwrap_or_else(|e| e.into_inner())
}

/// `tensors` in the order their bytes lie in the file (what the tensor hasher walks).
fn by_offset(tensors: &[crate::format::TensorInfo]) -> Vec<crate::format::TensorInfo> {
    let mut v = tensors.to_vec();
    v.sort_by_key(|t| (t.begin, t.end));
    v
}

/// Folders `Staging::begin` created for outputs (a matrix's `DIR` of `DIR/<format>/`):
/// removed, once empty, when their outputs fail or are interrupted, so a failed run leaves
/// no folder it made; forgotten once an output is committed inside them.
static CREATED: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());

fn created() -> std::sync::MutexGuard<'static, Vec<PathBuf>> {
    CREATED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Removes every created folder that is empty now (deepest first), forgetting those gone.
fn remove_created(created: &mut Vec<PathBuf>) {
    created.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    created.retain(|d| match std::fs::remove_dir(d) {
        Ok(()) => false,
        Err(e) => e.kind() != std::io::ErrorKind::NotFound,
    });
}

/// Takes `tmp` off the list (it was committed or removed).
fn forget_live(live: &mut Vec<LiveOutput>, tmp: &Path) {
    live.retain(|o| o.tmp != tmp);
}

/// Removes every listed temporary (the interrupt handler), holding the list's lock for good:
/// the process ends right after, so no commit may start.
fn remove_live_outputs(signal: i32) {
    let live = live();
    let name = signal_hook::low_level::signal_name(signal).unwrap_or("a signal");
    for o in live.iter() {
        let _ = std::fs::remove_dir_all(&o.tmp);
        let _ = std::fs::remove_file(&o.lock);
    }
    remove_created(&mut created());
    for o in live.iter() {
        // Not eprintln!: it panics on a closed stderr, which would end this thread with the
        // signal taken and the process running on.
        let _ = std::io::Write::write_fmt(
            &mut std::io::stderr(),
            format_args!(
                "wanbake: interrupted by {name}: {} was not written (its unfinished temporary is removed)\n",
                o.dest.display()
            ),
        );
    }
    std::mem::forget(live);
}

/// How the destination may be treated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replace {
    /// Fail if the destination exists.
    Never,
    /// Replace an existing destination atomically (the old one is removed afterwards).
    Overwrite,
}

/// How file space is reserved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Allocation {
    /// Reserve every byte up front (`fallocate`): out-of-space fails before writing.
    Reserve,
    /// Sparse files (`set_len` only): for synthetic all-zero checkpoints.
    Sparse,
}

/// An output being written.
pub struct Staging {
    dest: PathBuf,
    tmp: PathBuf,
    lock_path: PathBuf,
    _lock: File,
    files: Vec<Arc<File>>,
    plan: OutputPlan,
    /// The weight files' reorder window, hashers and disk writer (`None` once sealed).
    ordered: Option<OrderedFiles>,
    replace: Replace,
    committed: bool,
    writing: Option<PhaseGuard>,
    /// Tensor bytes handed to `write`, checked against the plan at `seal` (a reserved output
    /// must have every planned byte written; a sparse one may leave zeros unwritten).
    written: std::sync::atomic::AtomicU64,
    allocation: Allocation,
    /// Late files finished so far: relative path → (bytes, sha256).
    late: std::sync::Mutex<BTreeMap<PathBuf, (u64, String)>>,
    /// Late files started (names their temporaries uniquely).
    late_started: std::sync::atomic::AtomicU64,
    /// Bytes written to late files (progress and the input hasher's pace only).
    late_bytes: std::sync::atomic::AtomicU64,
    /// How the plan's carried files reached the output.
    carried: Carried,
}

impl std::fmt::Debug for Staging {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Staging")
            .field("dest", &self.dest)
            .field("tmp", &self.tmp)
            .finish()
    }
}

/// Refuses a destination that equals, contains or lies inside any input path.
pub fn check_not_input(dest: &Path, inputs: &[PathBuf]) -> Result<(), WriteError> {
    let d = absolute_clean(dest);
    for input in inputs {
        let i = absolute_clean(input);
        if d == i || d.starts_with(&i) || i.starts_with(&d) {
            return Err(WriteError::OverlapsInput {
                dest: dest.to_path_buf(),
                input: input.clone(),
            });
        }
    }
    Ok(())
}

/// Absolute, symlink-resolved where the path exists (its existing prefix otherwise).
fn absolute_clean(p: &Path) -> PathBuf {
    if let Ok(c) = std::fs::canonicalize(p) {
        return c;
    }
    let abs = std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    match (abs.parent(), abs.file_name()) {
        (Some(parent), Some(name)) => absolute_clean(parent).join(name),
        _ => abs,
    }
}

impl Staging {
    /// Checks the destination, cleans stale temporaries, reserves space, creates every
    /// planned file with its header and every aux file.
    pub fn begin(
        dest: &Path,
        plan: OutputPlan,
        inputs: &[PathBuf],
        replace: Replace,
        allocation: Allocation,
    ) -> Result<Staging, WriteError> {
        check_not_input(dest, inputs)?;
        if replace == Replace::Never && dest.symlink_metadata().is_ok() {
            return Err(WriteError::Exists {
                path: dest.to_path_buf(),
            });
        }
        let parent = parent_dir(dest);
        let missing: Vec<PathBuf> = (parent.ancestors())
            .take_while(|p| !p.as_os_str().is_empty() && p.symlink_metadata().is_err())
            .map(Path::to_path_buf)
            .collect();
        std::fs::create_dir_all(&parent).map_err(|source| parent_error(&parent, source))?;
        clean_stale(dest);
        if allocation == Allocation::Reserve {
            check_space(&parent, plan.total_bytes())?;
        }
        let (tmp, lock_path, lock) = create_tmp(dest)?;
        // Listed once the temporary is in them (never empty until it goes).
        created().extend(missing);
        live().push(LiveOutput {
            dest: dest.to_path_buf(),
            tmp: tmp.clone(),
            lock: lock_path.clone(),
        });
        let mut staging = Staging {
            dest: dest.to_path_buf(),
            tmp,
            lock_path,
            _lock: lock,
            files: Vec::new(),
            plan,
            ordered: None,
            replace,
            committed: false,
            writing: None,
            written: Default::default(),
            allocation,
            late: Default::default(),
            late_started: Default::default(),
            late_bytes: Default::default(),
            carried: Carried::default(),
        };
        staging.create_files(allocation)?;
        staging.carry()?;
        Ok(staging)
    }

    /// Puts the plan's carried files into the temporary directory (module doc): links first,
    /// then, after checking the free space for them, copies of the files that could not be
    /// linked. Their digests join the late files'.
    fn carry(&mut self) -> Result<(), WriteError> {
        let files = &self.plan.carried;
        if files.is_empty() {
            return Ok(());
        }
        let bytes = files.iter().map(|f| f.bytes).sum();
        let phase = progress::begin("carrying unchanged files", bytes, files.len() as u64);
        let mut digests = carry::CarriedDigests::new();
        let unlinked = carry::link_all(&self.tmp, files, &phase, &mut digests)?;
        if !unlinked.is_empty() {
            check_space(&self.tmp, unlinked.iter().map(|f| f.bytes).sum())?;
        }
        carry::copy_all(&self.tmp, &unlinked, &phase, &mut digests)?;
        self.carried = Carried {
            linked: files.len() - unlinked.len(),
            copied: unlinked.len(),
            bytes,
        };
        lock(&self.late).extend(digests);
        Ok(())
    }

    /// How the plan's carried files reached the output (all zero without any).
    pub fn carried(&self) -> Carried {
        self.carried
    }

    fn create_files(&mut self, allocation: Allocation) -> Result<(), WriteError> {
        let mut new = Vec::with_capacity(self.plan.files.len());
        for f in &self.plan.files {
            let path = self.tmp.join(&f.rel_path);
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).map_err(io_err(dir))?;
            }
            new.push(NewFile {
                path,
                len: f.layout.file_len() as u64,
                // A GGUF file's tensors too, in file order: hashed as written, their types
                // given at the seal (`gguf::digest_as_written`).
                tensors: Some(by_offset(&f.layout.tensors)),
                gaps: unwritten_ranges(&f.layout),
            });
        }
        let sparse = allocation == Allocation::Sparse;
        let (ordered, files) = OrderedFiles::create(new, sparse, |file, len| match allocation {
            Allocation::Reserve => reserve(file, len),
            Allocation::Sparse => file.set_len(len),
        })
        .map_err(ordered_error)?;
        for (i, f) in self.plan.files.iter().enumerate() {
            ordered
                .write(i, 0, &f.layout.prefix)
                .map_err(ordered_error)?;
        }
        self.files = files;
        self.ordered = Some(ordered);
        for a in &self.plan.aux {
            let path = self.tmp.join(&a.rel_path);
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).map_err(io_err(dir))?;
            }
            std::fs::write(&path, &a.bytes).map_err(io_err(&path))?;
        }
        Ok(())
    }

    /// Counts every byte written from now until `seal` into `phase`.
    pub fn report_progress(&mut self, phase: PhaseGuard) {
        self.writing = Some(phase);
    }

    /// Bytes written so far (by every thread): tensor bytes and late files' bytes.
    pub fn written_bytes(&self) -> u64 {
        self.written.load(std::sync::atomic::Ordering::Relaxed)
            + self.late_bytes.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Starts a late file (module doc): its bytes go to a temporary in the output's
    /// temporary directory until [`Staging::finish_late`] names it.
    pub fn late_file(&self) -> Result<LateFile<'_>, WriteError> {
        let n = (self.late_started).fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = self.tmp.join(format!(".late-{n}"));
        let file = File::create(&path).map_err(io_err(&path))?;
        Ok(LateFile {
            staging: self,
            out: std::io::BufWriter::with_capacity(1 << 20, file),
            path,
            hasher: <sha2::Sha256 as sha2::Digest>::new(),
            len: 0,
        })
    }

    /// Finishes `file`: flushes and fsyncs it and gives it its name (`LateName`), returning
    /// its path relative to the output and its size. A content-named file whose name is
    /// already taken holds the same bytes (its name is their sha256), so the new copy is
    /// removed and the name shared; a fixed name given twice is a producer bug.
    pub fn finish_late(
        &self,
        file: LateFile<'_>,
        name: LateName,
    ) -> Result<(PathBuf, u64), WriteError> {
        let LateFile {
            out,
            path,
            hasher,
            len,
            ..
        } = file;
        let f = out.into_inner().map_err(|e| WriteError::Io {
            path: path.clone(),
            source: e.into_error(),
        })?;
        f.sync_all().map_err(io_err(&path))?;
        drop(f);
        let sha = digest::hex(&sha2::Digest::finalize(hasher));
        let rel = match name {
            LateName::Fixed(rel) => rel,
            LateName::ByDigest(dir) => dir.join(&sha[..32]),
        };
        let mut late = lock(&self.late);
        if let Some(&(bytes, ref known)) = late.get(&rel) {
            let _ = std::fs::remove_file(&path);
            if bytes == len && *known == sha {
                return Ok((rel, len));
            }
            return Err(WriteError::Io {
                path: self.tmp.join(&rel),
                source: std::io::Error::other("internal error: a late file written twice"),
            });
        }
        let dest = self.tmp.join(&rel);
        if let Some(dir) = dest.parent() {
            std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        }
        std::fs::rename(&path, &dest).map_err(io_err(&dest))?;
        late.insert(rel.clone(), (len, sha));
        Ok((rel, len))
    }

    /// The plan being written.
    pub fn plan(&self) -> &OutputPlan {
        &self.plan
    }

    /// The temporary directory (for diagnostics and tests).
    pub fn tmp_dir(&self) -> &Path {
        &self.tmp
    }

    /// Runs `work` on every item, on every thread of the current rayon pool, each thread
    /// taking the next item in the order the items' bytes lie in the output (`slot_of`:
    /// where an item starts writing). Every producer with many items runs through here:
    /// with each item writing its own range front to back, the item at the front of a file
    /// is usually running, so the window of `release::ordered` moves steadily; where the layout
    /// puts bytes of later items at the front (scaled fp8's scales), the window's invariant
    /// spills instead of waiting, so any layout completes. Each thread is one of the
    /// window's registered producers while it takes items. `init` makes each thread's
    /// state. The first error stops the others and is returned; it also gives the output up
    /// (`OrderedFiles::abandon`), since the failed item's range will never be complete and a
    /// write of another thread may be waiting for it.
    pub fn for_each_in_file_order<T: Sync, S, E: Send>(
        &self,
        items: &[T],
        slot_of: impl Fn(&T) -> (Slot, usize),
        init: impl Fn() -> S + Sync,
        work: impl Fn(&mut S, &T) -> Result<(), E> + Sync,
    ) -> Result<(), E> {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        // Each item with where its writes start (file, byte), in that order.
        let mut order: Vec<((usize, usize), usize)> = (items.iter().enumerate())
            .map(|(i, item)| {
                let (slot, offset) = slot_of(item);
                let begin = (self.plan.files.get(slot.file))
                    .and_then(|f| f.layout.tensors.get(slot.tensor))
                    .map_or(0, |t| t.begin);
                ((slot.file, begin + offset), i)
            })
            .collect();
        order.sort_unstable();
        let next = AtomicUsize::new(0);
        let failed = AtomicBool::new(false);
        let failure: std::sync::Mutex<Option<E>> = std::sync::Mutex::new(None);
        // A panicking item gives the output up as a failed one does (while unwinding), so
        // the other threads finish and the panic reaches the caller instead of a hang.
        struct AbandonOnPanic<'a>(Option<&'a OrderedFiles>);
        impl Drop for AbandonOnPanic<'_> {
            fn drop(&mut self) {
                if let (true, Some(ordered)) = (std::thread::panicking(), self.0) {
                    ordered.abandon();
                }
            }
        }
        // Every thread is a registered producer until it has no item left (or fails), and
        // says where each item it runs starts: a write of another thread may wait for the
        // front only on a producer whose item can complete it (`release::ordered`'s invariant).
        let producers: Vec<std::sync::Mutex<Option<_>>> = match &self.ordered {
            Some(o) => (o.producers(rayon::current_num_threads()).into_iter())
                .map(|p| std::sync::Mutex::new(Some(p)))
                .collect(),
            None => Vec::new(),
        };
        rayon::broadcast(|ctx| {
            let _guard = AbandonOnPanic(self.ordered.as_ref());
            let producer =
                (producers.get(ctx.index())).and_then(|p| p.lock().ok().and_then(|mut p| p.take()));
            let mut state = init();
            while !failed.load(Ordering::Relaxed) {
                let Some(&((file, at), i)) = order.get(next.fetch_add(1, Ordering::Relaxed)) else {
                    break;
                };
                if let Some(p) = &producer {
                    p.start_item(file, at as u64);
                }
                if let Err(e) = work(&mut state, &items[i]) {
                    failed.store(true, Ordering::Relaxed);
                    // Recorded first: the abandonment below makes writes of other threads
                    // fail ("the output was abandoned"), and the error returned must be this
                    // cause, not one of those consequences.
                    if let Ok(mut f) = failure.lock() {
                        f.get_or_insert(e);
                    }
                    // The failed item's range will never be complete: release the writers
                    // of the other threads that may be waiting for it.
                    if let Some(ordered) = &self.ordered {
                        ordered.abandon();
                    }
                }
            }
        });
        match failure.into_inner().ok().flatten() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Writes `bytes` at `offset` inside the tensor at `slot`. Safe to call from many
    /// threads at once for disjoint ranges.
    pub fn write(&self, slot: Slot, offset: usize, bytes: &[u8]) -> Result<(), WriteError> {
        let f = &self.plan.files[slot.file];
        let t = &f.layout.tensors[slot.tensor];
        if offset
            .checked_add(bytes.len())
            .is_none_or(|end| end > t.nbytes())
        {
            return Err(WriteError::OutOfSlot {
                tensor: t.name.clone(),
                offset,
                len: bytes.len(),
                size: t.nbytes(),
            });
        }
        let ordered = self.ordered.as_ref().ok_or_else(|| WriteError::Io {
            path: self.tmp.join(&f.rel_path),
            source: std::io::Error::other("write after the output was sealed"),
        })?;
        ordered
            .write(slot.file, (t.begin + offset) as u64, bytes)
            .map_err(ordered_error)?;
        self.written
            .fetch_add(bytes.len() as u64, std::sync::atomic::Ordering::Relaxed);
        if let Some(p) = &self.writing {
            p.add_bytes(bytes.len() as u64);
        }
        Ok(())
    }

    /// Finishes writing, flushes every file to disk and returns the digests of the weight
    /// files (plan order) and aux files.
    ///
    /// A safetensors file was hashed from the bytes as they were written (`release::ordered`):
    /// the seal waits for the hashers and the disk writer to pass the end of every file,
    /// then fsyncs; nothing is read again but a GGUF file's header, parsed back with the
    /// reader's own rules and compared with the plan (`gguf::digest_as_written`). No byte
    /// changes once sealing starts (every writer has returned). Every planned safetensors
    /// header is first parsed back with the reader's own rules and compared with the plan.
    pub fn seal(&mut self) -> Result<Sealed, WriteError> {
        self.writing = None;
        self.check_every_byte_written()?;
        self.check_headers()?;
        let ordered = self.ordered.take().ok_or_else(|| WriteError::Io {
            path: self.tmp.clone(),
            source: std::io::Error::other("the output was sealed twice"),
        })?;
        let sealing = Arc::new(progress::begin("sealing", ordered.unpassed_bytes(), 0));
        let sparse = self.allocation == Allocation::Sparse;
        let hashed = ordered
            .finish(sparse, Some(sealing.clone()))
            .map_err(ordered_error)?;
        self.flush()?;
        let weights = hashed
            .into_iter()
            .zip(&self.plan.files)
            .map(|(d, p)| {
                let path = self.tmp.join(&p.rel_path);
                match (d, &p.gguf) {
                    (Some(d), None) => Ok(d),
                    (Some(d), Some(_)) => {
                        let planned = (p.layout.tensors.iter())
                            .map(|t| (t.name.as_str(), t.begin..t.end))
                            .collect();
                        Ok(crate::io::gguf::digest_as_written(&path, d, &planned)?)
                    }
                    (None, _) => Ok(crate::io::gguf::digest_weight_file(&path, &|n| {
                        sealing.add_bytes(n)
                    })?),
                }
            })
            .collect::<Result<Vec<_>, WriteError>>()?;
        let mut aux = BTreeMap::new();
        for a in &self.plan.aux {
            let path = self.tmp.join(&a.rel_path);
            File::open(&path)
                .and_then(|f| f.sync_all())
                .map_err(io_err(&path))?;
            aux.insert(
                a.rel_path.clone(),
                (a.bytes.len() as u64, digest::sha256_hex(&a.bytes)),
            );
        }
        let late = std::mem::take(&mut *lock(&self.late));
        for (rel, digest) in late {
            if aux.insert(rel.clone(), digest).is_some() {
                return Err(WriteError::Io {
                    path: self.tmp.join(rel),
                    source: std::io::Error::other("internal error: a late file has a planned name"),
                });
            }
        }
        Ok(Sealed { weights, aux })
    }

    fn flush(&self) -> Result<(), WriteError> {
        for (f, p) in self.files.iter().zip(&self.plan.files) {
            f.sync_all().map_err(io_err(&self.tmp.join(&p.rel_path)))?;
        }
        Ok(())
    }

    /// Every planned safetensors header parses back, with the reader's own rules, as
    /// exactly the plan's tensor table (the bytes at offset 0 of each file are these).
    fn check_headers(&self) -> Result<(), WriteError> {
        for p in self.plan.files.iter().filter(|f| f.gguf.is_none()) {
            let len = p.layout.file_len();
            let path = self.tmp.join(&p.rel_path);
            let bad = |reason: String| WriteError::Header {
                path: path.clone(),
                reason,
            };
            let h = Header::parse_prefix(&p.layout.prefix, len).map_err(|e| bad(e.to_string()))?;
            let same = h.tensors.len() == p.layout.tensors.len()
                && h.tensors.iter().zip(&p.layout.tensors).all(|(a, b)| {
                    (a.name.as_str(), a.dtype, &a.shape) == (b.name.as_str(), b.dtype, &b.shape)
                        && a.begin + h.data_start == b.begin
                        && a.end + h.data_start == b.end
                });
            if !same {
                return Err(bad("it does not describe the planned tensors".into()));
            }
        }
        Ok(())
    }

    /// A reserved output's producer wrote exactly as many tensor bytes as the plan lays out
    /// (every write lands inside its slot, so fewer means a tensor part was never written
    /// and more means one was written twice): a producer bug, refused before hashing.
    fn check_every_byte_written(&self) -> Result<(), WriteError> {
        let planned = self.plan.tensor_bytes();
        let written = self.written.load(std::sync::atomic::Ordering::Relaxed);
        if self.allocation == Allocation::Reserve && written != planned {
            return Err(WriteError::Unwritten { planned, written });
        }
        Ok(())
    }

    /// Writes the manifest, fsyncs the tree, and renames the temporary directory into place.
    pub fn commit(self, manifest: &[u8]) -> Result<PathBuf, WriteError> {
        let mpath = self.tmp.join(crate::io::checkpoint::MANIFEST_NAME);
        write_durable(&mpath, manifest)?;
        self.commit_as_is()
    }

    /// Renames the temporary directory into place as it is: no seal, no manifest. Only for
    /// outputs that are not releases (`synth --skeleton`: headers and sparse zeros).
    pub fn commit_unsealed(mut self) -> Result<PathBuf, WriteError> {
        if let Some(ordered) = self.ordered.take() {
            ordered.finish(true, None).map_err(ordered_error)?;
        }
        self.flush()?;
        self.commit_as_is()
    }

    fn commit_as_is(self) -> Result<PathBuf, WriteError> {
        let mut dirs = Staging::commit_together(vec![self])?;
        dirs.pop().ok_or_else(|| WriteError::Io {
            path: PathBuf::new(),
            source: std::io::Error::other("internal error: a commit of one output gave none"),
        })
    }

    /// Commits several outputs, each with its manifest, all or none: every temporary is
    /// completed and synced first, then all are renamed into place under the list of live
    /// outputs' lock (an interrupt waits for the last rename, or finds every temporary still
    /// there and removes them all). A rename that fails undoes the ones before it (each
    /// destination gets back what it held), and the temporaries are removed. Only once every
    /// output is in place are the releases they replaced removed. A release matrix commits
    /// this way (`release::write_releases`).
    pub fn commit_all(outputs: Vec<(Staging, Vec<u8>)>) -> Result<Vec<PathBuf>, WriteError> {
        let mut stagings = Vec::with_capacity(outputs.len());
        for (staging, manifest) in outputs {
            let mpath = staging.tmp.join(crate::io::checkpoint::MANIFEST_NAME);
            write_durable(&mpath, &manifest)?;
            stagings.push(staging);
        }
        Staging::commit_together(stagings)
    }

    fn commit_together(mut stagings: Vec<Staging>) -> Result<Vec<PathBuf>, WriteError> {
        for s in &stagings {
            sync_tree(&s.tmp)?;
        }
        // Under the list's lock: an interrupt now waits for every rename (see `LIVE`).
        let mut live = live();
        let mut exchanged = Vec::with_capacity(stagings.len());
        for (i, s) in stagings.iter().enumerate() {
            let exchange = s.replace == Replace::Overwrite && s.dest.symlink_metadata().is_ok();
            if let Err(e) = rename_into_place(&s.tmp, &s.dest, exchange) {
                // Undone newest first: each destination gets back what it held.
                for (done, &was_exchange) in stagings[..i].iter().zip(&exchanged).rev() {
                    let _ = rename_into_place(&done.dest, &done.tmp, was_exchange);
                }
                return Err(e);
            }
            exchanged.push(exchange);
        }
        for (s, &was_exchange) in stagings.iter_mut().zip(&exchanged) {
            if was_exchange {
                // `tmp` now holds the previous release; remove it.
                let _ = std::fs::remove_dir_all(&s.tmp);
            }
            forget_live(&mut live, &s.tmp);
            s.committed = true;
            created().retain(|d| !s.dest.starts_with(d));
        }
        drop(live);
        let mut dirs = Vec::with_capacity(stagings.len());
        for s in &stagings {
            let parent = parent_dir(&s.dest);
            File::open(&parent)
                .and_then(|d| d.sync_all())
                .map_err(io_err(&parent))?;
            let _ = std::fs::remove_file(&s.lock_path);
            dirs.push(s.dest.clone());
        }
        Ok(dirs)
    }
}

/// Renames `from` to `to`: atomically exchanging the two when `exchange` (`to` exists and is
/// replaced), else only where `to` does not exist.
fn rename_into_place(from: &Path, to: &Path, exchange: bool) -> Result<(), WriteError> {
    let flags = match exchange {
        true => rustix::fs::RenameFlags::EXCHANGE,
        false => rustix::fs::RenameFlags::NOREPLACE,
    };
    rustix::fs::renameat_with(rustix::fs::CWD, from, rustix::fs::CWD, to, flags).map_err(|e| {
        WriteError::Io {
            path: to.to_path_buf(),
            source: e.into(),
        }
    })
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_dir_all(&self.tmp);
            let _ = std::fs::remove_file(&self.lock_path);
            forget_live(&mut live(), &self.tmp);
            remove_created(&mut created());
        }
    }
}

/// How a finished late file is named (`Staging::finish_late`), relative to the output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LateName {
    /// This path.
    Fixed(PathBuf),
    /// In this folder, named by the first 32 hex digits of the file's sha256.
    ByDigest(PathBuf),
}

/// A late file being written (module doc): written front to back, hashed as written.
pub struct LateFile<'s> {
    staging: &'s Staging,
    out: std::io::BufWriter<File>,
    path: PathBuf,
    hasher: sha2::Sha256,
    len: u64,
}

impl std::io::Write for LateFile<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let n = std::io::Write::write(&mut self.out, bytes)?;
        sha2::Digest::update(&mut self.hasher, &bytes[..n]);
        self.len += n as u64;
        let s = self.staging;
        s.late_bytes
            .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
        if let Some(p) = &s.writing {
            p.add_bytes(n as u64);
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::Write::flush(&mut self.out)
    }
}

/// Digests of a sealed output.
#[derive(Debug)]
pub struct Sealed {
    /// One per planned weight file, in plan order.
    pub weights: Vec<SafetensorsDigest>,
    /// (bytes, sha256) of each aux file by relative path.
    pub aux: BTreeMap<PathBuf, (u64, String)>,
}

/// Writes a file and fsyncs it.
pub fn write_durable(path: &Path, bytes: &[u8]) -> Result<(), WriteError> {
    durable::write_file(path, bytes).map_err(WriteError::from)
}

/// Replaces `path` atomically with `bytes` (`durable::replace_file`: temp file + fsync +
/// rename + parent fsync); on failure the temporary is removed and `path` is untouched.
/// Every single file wanbake writes outside a release folder (the runner's outputs, SVD
/// cache entries, signatures) goes through here.
pub fn replace_file_durable(path: &Path, bytes: &[u8]) -> Result<(), WriteError> {
    durable::replace_file(path, bytes).map_err(WriteError::from)
}

impl From<durable::DurableError> for WriteError {
    fn from(e: durable::DurableError) -> WriteError {
        WriteError::Io {
            path: e.path,
            source: e.source,
        }
    }
}

fn sync_tree(dir: &Path) -> Result<(), WriteError> {
    for entry in std::fs::read_dir(dir).map_err(io_err(dir))? {
        let entry = entry.map_err(io_err(dir))?;
        let p = entry.path();
        if p.is_dir() {
            sync_tree(&p)?;
        }
    }
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(dir))
}

fn dest_name(dest: &Path) -> String {
    dest.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "out".into())
}

fn create_tmp(dest: &Path) -> Result<(PathBuf, PathBuf, File), WriteError> {
    let parent = parent_dir(dest);
    let name = dest_name(dest);
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let id = format!("{}-{nonce}", std::process::id());
    let lock_path = parent.join(format!(".{name}{TMP_MARK}{id}.lock"));
    let tmp = parent.join(format!(".{name}{TMP_MARK}{id}"));
    let lock = File::create(&lock_path).map_err(io_err(&lock_path))?;
    lock.try_lock().map_err(|e| WriteError::Io {
        path: lock_path.clone(),
        source: std::io::Error::other(e.to_string()),
    })?;
    std::fs::create_dir(&tmp).map_err(io_err(&tmp))?;
    Ok((tmp, lock_path, lock))
}

/// Removes temporaries of `dest` whose owning process is gone (its lock is free).
fn clean_stale(dest: &Path) {
    let parent = parent_dir(dest);
    let prefix = format!(".{}{TMP_MARK}", dest_name(dest));
    let Ok(rd) = std::fs::read_dir(&parent) else {
        return;
    };
    for entry in rd.flatten() {
        let fname = entry.file_name().to_string_lossy().into_owned();
        let Some(id) = fname
            .strip_prefix(&prefix)
            .and_then(|r| r.strip_suffix(".lock"))
        else {
            continue;
        };
        let lock_path = entry.path();
        let Ok(f) = File::open(&lock_path) else {
            continue;
        };
        if f.try_lock().is_ok() {
            let _ = std::fs::remove_dir_all(parent.join(format!("{prefix}{id}")));
            let _ = std::fs::remove_file(&lock_path);
        }
    }
}

/// Is there room for `needed` bytes (plus a 1 MiB margin) in the file system of `dir`?
/// Unknown (statvfs failed) counts as room.
pub fn check_space(dir: &Path, needed: u64) -> Result<(), WriteError> {
    let Ok(st) = rustix::fs::statvfs(dir) else {
        return Ok(());
    };
    let available = st.f_bavail.saturating_mul(st.f_frsize);
    // Leave a small margin for directory entries and the manifest.
    let margin = 1 << 20;
    if needed.saturating_add(margin) > available {
        return Err(WriteError::NoSpace {
            path: dir.to_path_buf(),
            needed,
            available,
        });
    }
    Ok(())
}

fn reserve(file: &File, len: u64) -> std::io::Result<()> {
    if len == 0 {
        return Ok(());
    }
    match rustix::fs::fallocate(file, rustix::fs::FallocateFlags::empty(), 0, len) {
        Ok(()) => Ok(()),
        Err(e) if e == rustix::io::Errno::OPNOTSUPP || e == rustix::io::Errno::NOSYS => {
            file.set_len(len)
        }
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::header_layout::PlannedTensor;
    use crate::io::DType;
    use crate::release::writer::ComponentOutput;

    fn two_tensor_plan() -> OutputPlan {
        let t = |name: &str| PlannedTensor {
            name: name.into(),
            dtype: DType::F32,
            shape: vec![4],
        };
        let c = ComponentOutput {
            rel_dir: PathBuf::new(),
            stem: "model".into(),
            tensors: vec![t("a"), t("b")],
            metadata: BTreeMap::new(),
            sidecars: Vec::new(),
            max_shard_bytes: None,
        };
        OutputPlan::build(&[c], &[]).unwrap()
    }

    /// A new reserved output of `plan` at `dest`, no inputs, not replacing anything.
    fn reserved(dest: &Path, plan: &OutputPlan) -> Staging {
        Staging::begin(dest, plan.clone(), &[], Replace::Never, Allocation::Reserve).unwrap()
    }

    /// Late files: named by content (the same bytes twice share one file), or by a fixed
    /// name (given twice: refused); sealed with their size and sha256; committed in place.
    #[test]
    fn late_files_are_named_hashed_sealed_and_committed() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("out");
        let mut s = reserved(&dest, &OutputPlan::default());
        let late = |s: &Staging, bytes: &[u8], name: LateName| {
            let mut f = s.late_file().unwrap();
            f.write_all(bytes).unwrap();
            s.finish_late(f, name)
        };
        let sha = digest::sha256_hex(b"chunk");
        let by_digest = || LateName::ByDigest(PathBuf::from("d"));
        let (a, len) = late(&s, b"chunk", by_digest()).unwrap();
        assert_eq!(
            (a.clone(), len),
            (PathBuf::from(format!("d/{}", &sha[..32])), 5)
        );
        assert_eq!(late(&s, b"chunk", by_digest()).unwrap().0, a);
        let (b, _) = late(&s, b"other", by_digest()).unwrap();
        assert_ne!(a, b);
        let fixed = || LateName::Fixed(PathBuf::from("m/manifest"));
        late(&s, b"m1", fixed()).unwrap();
        assert!(late(&s, b"m2", fixed()).is_err());
        let sealed = s.seal().unwrap();
        assert_eq!(sealed.aux.len(), 3);
        assert_eq!(sealed.aux[&a], (5, sha));
        let done = s.commit(b"{}").unwrap();
        assert_eq!(std::fs::read(done.join(&a)).unwrap(), b"chunk");
        assert_eq!(std::fs::read(done.join("m/manifest")).unwrap(), b"m1");
        let names: Vec<_> = std::fs::read_dir(&done)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(
            !names
                .iter()
                .any(|n| n.to_string_lossy().starts_with(".late")),
            "{names:?}"
        );
    }

    #[test]
    fn a_reserved_output_with_an_unwritten_tensor_part_is_refused_at_seal() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("out");
        let plan = two_tensor_plan();
        let mut s = reserved(&dest, &plan);
        let a = plan.slot(0, "a").unwrap();
        let b = plan.slot(0, "b").unwrap();
        s.write(a, 0, &[1; 16]).unwrap();
        s.write(b, 0, &[2; 8]).unwrap();
        let err = s.seal().unwrap_err().to_string();
        assert!(
            err.contains("32 tensor bytes") && err.contains("wrote 24"),
            "{err}"
        );
        s.write(b, 8, &[3; 8]).unwrap();
        assert!(s.seal().is_ok(), "every byte written");
        drop(s);
        assert!(!dest.exists(), "nothing committed");
    }

    /// A failed item of a producer gives the output up, so an item of another thread whose
    /// write waits for the failed item's range (more than the reorder window ahead of it)
    /// gets an error instead of waiting forever, and the first error is the one returned;
    /// a panicking item likewise, and its panic reaches the caller.
    #[test]
    fn a_failed_item_releases_writes_waiting_for_its_range() {
        for panics in [false, true] {
            failed_item_releases_waiting_writes(panics);
        }
    }

    fn failed_item_releases_waiting_writes(panics: bool) {
        let window =
            (super::super::ordered::CHUNK as u64 * super::super::ordered::WINDOW_CHUNKS) as usize;
        let tensors = [("a", 1024), ("b", window / 4 + (1 << 20))];
        let c = ComponentOutput {
            rel_dir: PathBuf::new(),
            stem: "model".into(),
            tensors: (tensors.iter())
                .map(|&(name, n)| PlannedTensor {
                    name: name.into(),
                    dtype: DType::F32,
                    shape: vec![n],
                })
                .collect(),
            metadata: BTreeMap::new(),
            sidecars: Vec::new(),
            max_shard_bytes: None,
        };
        let plan = OutputPlan::build(&[c], &[]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("out");
        let s = reserved(&dest, &plan);
        let slots = [plan.slot(0, "a").unwrap(), plan.slot(0, "b").unwrap()];
        let big = vec![7u8; tensors[1].1 * 4];
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let run = || {
            pool.install(|| {
                s.for_each_in_file_order(
                    &[0usize, 1],
                    |&i| (slots[i], 0),
                    || (),
                    |_, &i| match i {
                        // Fails after `b` has started its write (which waits for `a`'s range).
                        0 => {
                            std::thread::sleep(std::time::Duration::from_millis(300));
                            assert!(!panics, "item a panicked");
                            Err("a failed".to_string())
                        }
                        _ => s.write(slots[1], 0, &big).map_err(|e| e.to_string()),
                    },
                )
            })
        };
        if panics {
            let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(run));
            assert!(caught.is_err(), "the panic reaches the caller");
        } else {
            assert_eq!(run(), Err("a failed".to_string()));
        }
        drop(s);
        assert!(!dest.exists(), "nothing committed");
    }

    /// Digests as written equal sha256 of the committed bytes, read back by the reader's
    /// own digest pass and hashed independently here, whatever the order, threads and band
    /// sizes of the writes: tensors written in order by one writer, tensors written in
    /// pieces out of order by several threads (as stacked layers are), an empty tensor,
    /// several shards, and a sparse output with a tensor left as zeros.
    #[test]
    fn digests_as_written_equal_the_committed_bytes() {
        use sha2::Digest;
        for (allocation, skip) in [(Allocation::Reserve, None), (Allocation::Sparse, Some(3))] {
            let shapes = [
                vec![70_000],
                vec![3, 5, 7],
                vec![0],
                vec![1 << 18],
                vec![9],
                vec![40_001],
            ];
            let tensors: Vec<PlannedTensor> = shapes
                .iter()
                .enumerate()
                .map(|(i, shape)| PlannedTensor {
                    name: format!("t{i}"),
                    dtype: if i % 2 == 0 { DType::F32 } else { DType::BF16 },
                    shape: shape.clone(),
                })
                .collect();
            let c = ComponentOutput {
                rel_dir: PathBuf::new(),
                stem: "model".into(),
                tensors: tensors.clone(),
                metadata: BTreeMap::new(),
                sidecars: Vec::new(),
                max_shard_bytes: Some(600_000),
            };
            let plan = OutputPlan::build(&[c], &[]).unwrap();
            assert!(plan.files.len() > 1, "sharded");
            let dir = tempfile::tempdir().unwrap();
            let dest = dir.path().join("out");
            let mut s =
                Staging::begin(&dest, plan.clone(), &[], Replace::Never, allocation).unwrap();
            // Each tensor's bytes, then the writes: (slot, offset, bytes).
            let mut rng = crate::rng::SplitMix64::new(0x9e37_79b9_7f4a_7c15);
            let mut next = move || rng.next_u64();
            let mut writes = Vec::new();
            for (i, t) in tensors.iter().enumerate() {
                let n = t.nbytes().unwrap();
                let bytes: Vec<u8> = (0..n).map(|_| next() as u8).collect();
                if Some(i) == skip {
                    continue;
                }
                let slot = plan.slot(0, &t.name).unwrap();
                let mut at = 0;
                let mut pieces = Vec::new();
                while at < n {
                    let len = (1 + next() as usize % 50_000).min(n - at);
                    pieces.push((slot, at, bytes[at..at + len].to_vec()));
                    at += len;
                }
                if i % 3 == 0 {
                    pieces.reverse(); // out of order
                }
                writes.push(pieces);
            }
            std::thread::scope(|scope| {
                for pieces in &writes {
                    let s = &s;
                    scope.spawn(move || {
                        for (slot, at, bytes) in pieces {
                            s.write(*slot, *at, bytes).unwrap();
                        }
                    });
                }
            });
            let sealed = s.seal().unwrap();
            s.commit(b"{}").unwrap();
            for (p, d) in plan.files.iter().zip(&sealed.weights) {
                let path = dest.join(&p.rel_path);
                let bytes = std::fs::read(&path).unwrap();
                assert_eq!(d.sha256, digest::hex(&sha2::Sha256::digest(&bytes)));
                assert_eq!(d.bytes, bytes.len() as u64);
                let reread = digest::digest_safetensors(&path, &|_| {}).unwrap();
                assert_eq!(d, &reread, "{}", p.rel_path.display());
            }
        }
    }
}
