//! Read-only memory maps: the only place wanbake maps a file, and the guard that turns an
//! input changing underneath a map into an error instead of a crash.
//!
//! Owns: `map_readonly`, `release_range` (dropping pages this process no longer needs, so
//! peak RSS stays bounded while a large checkpoint streams through), the SIGBUS guard, and
//! [`check_maps_unchanged`]. Every `unsafe` block of the I/O layer lives here. Does not own:
//! what is read from a map (`io::file`).
//!
//! # Inputs that change while mapped
//! A map stays valid only while nobody truncates or rewrites its file. wanbake never writes
//! a file it has mapped (outputs go to a fresh temporary sibling and are renamed into
//! place), but another process can. Two things make that an error and not a crash or a
//! wrong release:
//! * **Shrinking**: touching a page past the new end of file raises SIGBUS. The guard
//!   ([`install_sigbus_guard`]) maps anonymous zero pages over the rest of that map, marks
//!   it faulted and lets the read continue; the run goes on to a harmless end and
//!   [`check_maps_unchanged`] then fails naming the file, so nothing is committed.
//! * **Rewriting** (same size or not): every map records the file's identity when it is
//!   made ([`FileStamp`]: device, inode, size, modification and change times);
//!   [`check_maps_unchanged`] compares it with the file's identity now. The release writer
//!   calls it after producing and hashing, just before committing, so a manifest never
//!   records an input hash for bytes other than the ones merged.
//!
//! The guard handles only faults inside live maps registered here; any other SIGBUS goes to
//! the handler that was installed before (the default: the process dies as it would have).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use memmap2::{Advice, Mmap, UncheckedAdvice};

/// What identifies a file's contents without reading them: if none of these changed, the
/// file was not rewritten (short of a deliberate reset of both times, which needs root).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileStamp {
    /// Device id.
    pub dev: u64,
    /// Inode number.
    pub ino: u64,
    /// Size in bytes.
    pub size: u64,
    /// Modification time, ns since the epoch.
    pub mtime_ns: i128,
    /// Status change time, ns since the epoch.
    pub ctime_ns: i128,
}

impl FileStamp {
    /// The stamp of an open file.
    pub fn of(meta: &std::fs::Metadata) -> FileStamp {
        use std::os::unix::fs::MetadataExt;
        FileStamp {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime_ns: meta.mtime() as i128 * 1_000_000_000 + meta.mtime_nsec() as i128,
            ctime_ns: meta.ctime() as i128 * 1_000_000_000 + meta.ctime_nsec() as i128,
        }
    }

    /// The stamp of the file at `path` now (following symlinks).
    pub fn at(path: &Path) -> std::io::Result<FileStamp> {
        Ok(FileStamp::of(&std::fs::metadata(path)?))
    }
}

/// A map whose file changed while it was mapped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChangedInput {
    /// The file.
    pub path: PathBuf,
    /// What changed, in words.
    pub what: String,
}

/// One registered map, as the signal handler sees it (plain atomics only).
struct Region {
    start: AtomicUsize,
    len: AtomicUsize,
    faulted: AtomicBool,
}

const REGIONS: usize = 4096;

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY_REGION: Region = Region {
    start: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    faulted: AtomicBool::new(false),
};

static TABLE: [Region; REGIONS] = [EMPTY_REGION; REGIONS];
static PAGE: AtomicUsize = AtomicUsize::new(4096);

/// Path and stamp of each registered slot (not touched by the signal handler).
static IDENTITY: Mutex<Vec<Option<(PathBuf, FileStamp)>>> = Mutex::new(Vec::new());

/// A read-only map of a whole file. Empty files get an empty buffer (mapping zero bytes
/// fails on Linux).
pub struct ReadOnlyMap {
    map: Option<Mmap>,
    slot: Option<usize>,
}

impl ReadOnlyMap {
    /// The mapped bytes.
    pub fn bytes(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }

    /// Tells the kernel this process is done with `[begin, end)` for now: the pages leave
    /// this process's resident set (they stay in the page cache, so a later read is cheap).
    /// Used after a tensor has been consumed, so a streaming pass over a 30 GB checkpoint
    /// does not accumulate 30 GB of RSS. Out-of-range or empty requests are ignored.
    pub fn release_range(&self, begin: usize, end: usize) {
        let Some(map) = &self.map else { return };
        let page = page_size();
        // Only whole pages strictly inside the range, so neighbours are never affected.
        let start = begin.div_ceil(page) * page;
        let stop = (end.min(map.len()) / page) * page;
        if stop > start {
            // SAFETY: the map is a shared, read-only file mapping. MADV_DONTNEED on such a
            // mapping only drops this process's page-table entries; a later access re-reads
            // the (unchanged) file contents, so no slice handed out by `bytes()` can observe
            // different data or dangle. The range is checked to lie inside the map.
            let _ = unsafe {
                map.unchecked_advise_range(UncheckedAdvice::DontNeed, start, stop - start)
            };
        }
    }

    /// Hints that `[begin, end)` will be read soon, sequentially.
    pub fn will_need(&self, begin: usize, end: usize) {
        let Some(map) = &self.map else { return };
        let end = end.min(map.len());
        if end > begin {
            let _ = map.advise_range(Advice::WillNeed, begin, end - begin);
        }
    }
}

impl Drop for ReadOnlyMap {
    fn drop(&mut self) {
        // Unregister before the map itself is dropped (fields drop after this body), so the
        // handler never claims a fault in an address range that is being unmapped.
        if let Some(slot) = self.slot.take() {
            let r = &TABLE[slot];
            r.len.store(0, Ordering::Release);
            r.faulted.store(false, Ordering::Release);
            if let Ok(mut ids) = IDENTITY.lock()
                && let Some(id) = ids.get_mut(slot)
            {
                *id = None;
            }
            r.start.store(0, Ordering::Release);
        }
    }
}

fn page_size() -> usize {
    rustix::param::page_size()
}

/// Maps `file` (opened from `path`) read-only and registers it with the SIGBUS guard.
///
/// # Safety contract (why this is accepted)
/// A memory map is only sound while nobody truncates or rewrites the file. wanbake opens
/// inputs read-only and never writes into a file it has mapped: outputs go to a fresh
/// temporary sibling directory and are renamed into place, so replacing a release never
/// modifies mapped inodes. Another process truncating or rewriting an input during a run is
/// caught by the guard and by [`check_maps_unchanged`] (module doc); the bytes read from
/// such a map are never committed.
pub fn map_readonly(file: &File, path: &Path) -> std::io::Result<ReadOnlyMap> {
    let meta = file.metadata()?;
    let len = meta.len();
    if len == 0 {
        return Ok(ReadOnlyMap {
            map: None,
            slot: None,
        });
    }
    // SAFETY: see the contract above: the file is opened read-only by us and never written
    // by wanbake while mapped; a change by another process is caught, not committed.
    let map = unsafe { Mmap::map(file)? };
    let slot = register(map.as_ptr() as usize, map.len(), path, FileStamp::of(&meta));
    Ok(ReadOnlyMap {
        map: Some(map),
        slot,
    })
}

/// Claims a free slot for a map (none when the table is full: the map then works unguarded
/// except for the stamp check, which needs a slot too; 4096 live maps never happen).
fn register(start: usize, len: usize, path: &Path, stamp: FileStamp) -> Option<usize> {
    for (i, r) in TABLE.iter().enumerate() {
        if r.start
            .compare_exchange(0, start, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            r.faulted.store(false, Ordering::Release);
            r.len.store(len, Ordering::Release);
            if let Ok(mut ids) = IDENTITY.lock() {
                if ids.len() <= i {
                    ids.resize(i + 1, None);
                }
                ids[i] = Some((path.to_path_buf(), stamp));
            }
            return Some(i);
        }
    }
    None
}

/// Every live map of a file at or under one of `inputs` (files or folders) whose file shrank
/// under it (a fault was caught) or whose identity changed since it was mapped. Empty when
/// every such input is as it was. Maps of other files (another job of the same process)
/// are not this run's business.
pub fn changed_maps(inputs: &[PathBuf]) -> Vec<ChangedInput> {
    let absolute = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    let roots: Vec<PathBuf> = inputs.iter().map(|p| absolute(p)).collect();
    let ids: Vec<(usize, PathBuf, FileStamp)> = match IDENTITY.lock() {
        Ok(ids) => ids
            .iter()
            .enumerate()
            .filter_map(|(i, id)| id.as_ref().map(|(p, s)| (i, p.clone(), *s)))
            .collect(),
        Err(_) => return Vec::new(),
    };
    let mut out = Vec::new();
    for (slot, path, then) in ids {
        let abs = absolute(&path);
        if !roots.iter().any(|r| abs.starts_with(r)) {
            continue;
        }
        let faulted = TABLE[slot].faulted.load(Ordering::Acquire);
        let what = match FileStamp::at(&path) {
            Err(e) => Some(format!("it can no longer be read ({e})")),
            Ok(now) => describe_change(&then, &now, faulted),
        };
        if let Some(what) = what {
            out.push(ChangedInput { path, what });
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out.dedup();
    out
}

/// Fails with the first changed map of `inputs` (see [`changed_maps`]).
pub fn check_maps_unchanged(inputs: &[PathBuf]) -> Result<(), ChangedInput> {
    match changed_maps(inputs).into_iter().next() {
        Some(c) => Err(c),
        None => Ok(()),
    }
}

/// Words for how a file changed between two stamps, or `None` when it did not.
pub fn describe_change(then: &FileStamp, now: &FileStamp, faulted: bool) -> Option<String> {
    if now.size < then.size || faulted {
        return Some(format!(
            "it shrank from {} to {} bytes while wanbake was reading it",
            then.size, now.size
        ));
    }
    if now.size > then.size {
        return Some(format!(
            "it grew from {} to {} bytes while wanbake was reading it",
            then.size, now.size
        ));
    }
    if (now.dev, now.ino) != (then.dev, then.ino) {
        return Some("it was replaced by another file while wanbake was reading it".into());
    }
    if (now.mtime_ns, now.ctime_ns) != (then.mtime_ns, then.ctime_ns) {
        return Some("it was rewritten while wanbake was reading it".into());
    }
    None
}

/// Installs the SIGBUS guard (module doc). Called once by the binary at startup, before any
/// other thread exists; later calls do nothing.
pub fn install_sigbus_guard() {
    static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();
    static INSTALLED: AtomicBool = AtomicBool::new(false);
    if INSTALLED.swap(true, Ordering::AcqRel) {
        return;
    }
    PAGE.store(page_size(), Ordering::Release);

    extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
        // SAFETY: the kernel passes a valid siginfo_t for a SA_SIGINFO handler.
        let addr = unsafe { (*info).si_addr() } as usize;
        let page = PAGE.load(Ordering::Acquire);
        for r in TABLE.iter() {
            let start = r.start.load(Ordering::Acquire);
            let len = r.len.load(Ordering::Acquire);
            if start == 0 || addr < start || addr >= start + len {
                continue;
            }
            let from = addr & !(page - 1);
            let to = (start + len).div_ceil(page) * page;
            // SAFETY: [from, to) lies inside a live read-only file map registered by this
            // module (pages from the faulting one to the map's end). Replacing it with
            // anonymous zero pages (MAP_FIXED) keeps the address range valid for every slice
            // borrowed from the map; the bytes read from it are never committed, because the
            // fault is recorded and `check_maps_unchanged` fails the run. mmap is a plain
            // system call with no user-space locks, so it is safe in a signal handler.
            let p = unsafe {
                libc::mmap(
                    from as *mut libc::c_void,
                    to - from,
                    libc::PROT_READ,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                )
            };
            if p != libc::MAP_FAILED {
                r.faulted.store(true, Ordering::Release);
                return;
            }
            break;
        }
        // Not a map of ours (or the zero pages could not be mapped): give the fault back to
        // the handler that was there before; the faulting access runs again and meets it.
        if let Some(prev) = PREVIOUS.get() {
            // SAFETY: restoring a sigaction read from the kernel at installation.
            unsafe { libc::sigaction(sig, prev, std::ptr::null_mut()) };
        }
    }

    // SAFETY: a zeroed sigaction is a valid "no handler" value; the fields are then set to a
    // SA_SIGINFO handler with an empty mask; sigaction only reads `new` and writes `old`.
    unsafe {
        let mut new: libc::sigaction = std::mem::zeroed();
        new.sa_sigaction = on_sigbus as *const () as usize;
        new.sa_flags = libc::SA_SIGINFO | libc::SA_NODEFER;
        libc::sigemptyset(&mut new.sa_mask);
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGBUS, &new, &mut old) == 0 {
            let _ = PREVIOUS.set(old);
        }
    }
}
