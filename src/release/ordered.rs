//! Where a staged output's bytes go: a bounded reorder window per weight file, emptied in
//! file order by three threads that hash and write each piece once.
//!
//! Owns: [`OrderedFiles`]. Producers write any byte range of any file from any thread
//! ([`OrderedFiles::write`]); the bytes are copied into fixed, page-aligned [`CHUNK`]s of the
//! file. Once the chunk at the front of a file is complete it leaves the window, and:
//! - the *file hasher* adds it to the whole-file sha256;
//! - the *tensor hasher* adds each tensor's part of it to that tensor's sha256 (tensors lie
//!   one after another in a safetensors file, so both digests are made in order, from the
//!   bytes written; only a spilled chunk, below, is read back);
//! - the *disk writer* writes it at its offset, with `O_DIRECT` where the file system takes
//!   it (aligned chunks from aligned buffers: no copy into the page cache, and the disk works
//!   while the CPU merges instead of after the last write), else through the page cache.
//!
//! The window is bounded: a large write more than [`WINDOW_CHUNKS`] chunks ahead of a file's
//! front may wait until the front moves (writes of at most 64 KiB never wait), and each
//! thread takes at most a few chunks at a time, so memory stays at a few dozen chunks
//! whatever the output size. A chunk completed beyond the window by a write that may not
//! wait (the invariant below) is *spilled*: its writer writes it to the disk at once, and
//! the front thread reads it back when it gets there, for the hashes.
//!
//! ## Progress, for any layout
//!
//! A producer's plan may put any bytes anywhere: a scaled-fp8 file holds every weight's
//! scale near offset 0, written by each weight's job after the weight, so the first chunk
//! completes only when the last job has run; a GGUF file's header-side tensors may depend on
//! the last job; one tensor may be far larger than the window. Whatever the layout, every
//! output completes, because of one invariant:
//!
//! **A write waits for the front only while the front is certain to move without it**:
//! either the front chunk is complete (the front thread takes it: it waits for nothing but
//! complete chunks and its queues, which the tensor hasher and the disk writer drain
//! without waiting for anyone), or another registered producer
//! ([`OrderedFiles::producers`]) is not itself blocked (running an item, or waiting for a
//! chunk the front has since brought into the window; not waiting for anything else, which a
//! producer declares with [`waiting_elsewhere`]) and runs an item that starts in or
//! before the front chunk, so its writes may be what the front lacks. Otherwise the write
//! goes on at once, and a chunk it completes beyond the window is spilled. A write decides and
//! records that it waits in one step under the register's lock, so of any set of producers
//! the last to decide sees the others blocked and goes on: one producer always runs or has
//! a wake-up coming (the front moved into its reach). Each waiter is woken to check again
//! whenever the front moves or a producer starts an item or leaves. Every byte is
//! therefore written, every chunk completes, and the front passes them all. The second
//! condition also keeps waiting useful: a producer whose item lies past a front that needs
//! an item nobody runs yet (scaled fp8's scales) is not waited for, so no thread idles
//! while another runs every job. The cost of such a layout is read-back, not a hang: an
//! output whose front depends on its last job (scaled fp8) is read back once beyond the
//! window. Tests in this file drive each such layout
//! through a one-chunk window.
//!
//! Does not own: the plan, fsync, the commit (`staging`), or the types of a GGUF file's
//! tensors (its tensors are hashed here like a safetensors file's, as byte spans; the seal
//! parses the written header back and names their ggml types, `gguf::digest_as_written`).
//! The digests equal those `digest::digest_safetensors` and `gguf::digest_gguf` compute
//! from the committed file (tested), and `verify` recomputes them from the disk.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;

use memmap2::MmapMut;
use sha2::{Digest, Sha256};

use crate::format::header::TensorInfo;
use crate::io::digest::{ElementType, SafetensorsDigest, TensorDigest, hex};
use crate::progress::PhaseGuard;

/// Bytes of a file one chunk holds (a multiple of every block size `O_DIRECT` asks for).
pub const CHUNK: usize = 4 << 20;

/// How many spilled chunks past the one read back are asked of the disk ahead.
const READ_AHEAD_CHUNKS: usize = 8;

/// How many chunks past a file's front a large write may land before it waits.
pub const WINDOW_CHUNKS: u64 = 16;

/// Writes at most this long never wait for the window.
pub const SMALL_WRITE: usize = 64 << 10;

/// `O_DIRECT` needs offsets and lengths in whole blocks of this size (or a divisor of it).
const DIRECT_ALIGN: usize = 4096;

/// Chunks queued between two of the threads.
const QUEUE: usize = 2;

/// How files are cut into chunks and how far ahead of a file's front a large write may go.
#[derive(Clone, Copy, Debug)]
pub struct Geometry {
    /// Bytes per chunk: a multiple of 4096, at most [`CHUNK`].
    pub chunk: usize,
    /// Chunks past the front before a large write waits.
    pub window: u64,
    /// Writes of at most this many bytes never wait.
    pub small: usize,
}

impl Default for Geometry {
    fn default() -> Self {
        Geometry {
            chunk: CHUNK,
            window: WINDOW_CHUNKS,
            small: SMALL_WRITE,
        }
    }
}

thread_local! {
    /// The geometry of outputs this thread creates, when a test sets one.
    static GEOMETRY: std::cell::Cell<Option<Geometry>> = const { std::cell::Cell::new(None) };
}

/// Runs `f` with every output this thread creates in it ([`OrderedFiles::create`]) cut by
/// `geometry`: a test knob (no command sets it), so that a tiny model meets what a real
/// one does at the default window (a front that depends on the last job, a tensor larger
/// than the window).
pub fn with_geometry<R>(geometry: Geometry, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<Geometry>);
    impl Drop for Restore {
        fn drop(&mut self) {
            GEOMETRY.with(|g| g.set(self.0));
        }
    }
    let _restore = Restore(GEOMETRY.with(|g| g.replace(Some(geometry))));
    f()
}

impl Geometry {
    fn len_of(&self, file_len: u64, index: u64) -> usize {
        let start = index * self.chunk as u64;
        (file_len.saturating_sub(start)).min(self.chunk as u64) as usize
    }

    fn count(&self, file_len: u64) -> u64 {
        file_len.div_ceil(self.chunk as u64)
    }

    fn start(&self, index: u64) -> u64 {
        index * self.chunk as u64
    }
}

/// Why an output's bytes could not be written or hashed.
#[derive(Debug)]
pub enum OrderedError {
    /// Writing a file failed.
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A byte of a file was never written (a producer bug).
    Gap {
        /// The file.
        path: PathBuf,
        /// Offset of the first chunk with bytes missing.
        offset: u64,
    },
    /// A write landed in a part of the file already passed on (a producer bug).
    Late {
        /// The file.
        path: PathBuf,
        /// Where.
        offset: u64,
    },
}

/// One file of the output as the threads see it.
struct OutFile {
    path: PathBuf,
    file: Arc<File>,
    /// Opened with `O_DIRECT`.
    opened_direct: bool,
    /// Writes still go through `O_DIRECT` (cleared if the file system refuses them).
    direct: AtomicBool,
    /// The file opened without `O_DIRECT`, once a refused write asked for it.
    fallback: std::sync::OnceLock<File>,
    len: u64,
    /// The window's front, readable without the window's lock (for other files' writers;
    /// it only grows, so a stale value only makes them wait less).
    front: AtomicU64,
    /// Tensors with absolute byte ranges, when the file's digests are made here.
    tensors: Option<Vec<TensorInfo>>,
    /// Byte ranges no producer writes (padding), sorted: zeros, counted as written.
    gaps: Vec<(u64, u64)>,
    window: Mutex<Window>,
    moved: Condvar,
}

/// The chunks of a file not yet passed on.
#[derive(Default)]
struct Window {
    /// Index of the front chunk: every chunk before it is passed on.
    front: u64,
    chunks: BTreeMap<u64, Arc<Mutex<Chunk>>>,
    /// No more writes; a sparse file's missing bytes are zeros.
    closed: Option<Closing>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Closing {
    /// Every byte must have been written.
    Complete,
    /// Unwritten bytes are zeros (a sparse output).
    Sparse,
}

struct Chunk {
    /// `None` once the front thread has taken it, or once it is spilled.
    buf: Option<MmapMut>,
    filled: usize,
    stage: Stage,
}

/// Where a chunk's bytes are, as the front thread sees them.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Bytes still to come (or the completing writer has not yet said where they go).
    Filling,
    /// Complete, in its buffer.
    InMemory,
    /// Complete, being written to the disk by its last writer.
    Spilling,
    /// Complete, on the disk: the front thread reads it back for the hashes.
    OnDisk,
}

impl Stage {
    fn ready(self) -> bool {
        matches!(self, Stage::InMemory | Stage::OnDisk)
    }
}

/// The producers registered with [`OrderedFiles::producers`]: what a write checks before it
/// waits (the invariant of the module doc).
#[derive(Default)]
struct ProducerRegister {
    slots: Vec<ProducerSlot>,
}

/// One registered producer, as the others see it.
#[derive(Default)]
struct ProducerSlot {
    /// Registered and not yet gone.
    live: bool,
    /// (file, byte offset) where the item it runs starts writing.
    item: Option<(usize, u64)>,
    /// (file, chunk) its write is waiting for, while it waits.
    waiting: Option<(usize, u64)>,
    /// Waits of its thread for something outside this module ([`waiting_elsewhere`]) now
    /// in progress: while any is, it is blocked as far as the writes of others can tell.
    elsewhere: usize,
}

thread_local! {
    /// (output, slot) of the producer this thread is, once it runs an item. The weak
    /// reference names the output (its allocation outlives the reference, so no other output
    /// has its address meanwhile) and reaches it from [`waiting_elsewhere`].
    static PRODUCING: std::cell::RefCell<Option<(Weak<Shared>, usize)>> =
        const { std::cell::RefCell::new(None) };
}

/// This thread's producer slot if it is one of `shared`'s producers.
fn producer_slot(shared: &Shared) -> Option<usize> {
    PRODUCING.with(|p| {
        let p = p.borrow();
        let (weak, slot) = p.as_ref()?;
        std::ptr::eq(weak.as_ptr(), shared).then_some(*slot)
    })
}

/// Runs `wait`, a wait of the calling thread for something this module does not see (an
/// idle device lane, `pipeline::Lanes`), with the thread's producer, if it is one, counted
/// as blocked meanwhile. A write of another thread may wait for the front only on a producer
/// that keeps writing (the module doc's invariant); a producer that waits for a lane held by
/// that very write would break it, and with every lane so held the output would hang (a
/// CUDA -xs merge did, its bases computed on a lane before the target's merge took one).
/// Entering wakes the waiting writes to check again; leaving needs no wake-up (a producer
/// that runs again only lets others wait).
pub fn waiting_elsewhere<R>(wait: impl FnOnce() -> R) -> R {
    struct Leave(Option<(Arc<Shared>, usize)>);
    impl Drop for Leave {
        fn drop(&mut self) {
            if let Some((shared, slot)) = &self.0
                && let Some(s) = lock(&shared.producers).slots.get_mut(*slot)
            {
                s.elsewhere = s.elsewhere.saturating_sub(1);
            }
        }
    }
    let me = PRODUCING.with(|p| {
        let p = p.borrow();
        let (weak, slot) = p.as_ref()?;
        Some((weak.upgrade()?, *slot))
    });
    let _leave = Leave(me.inspect(|(shared, slot)| {
        if let Some(s) = lock(&shared.producers).slots.get_mut(*slot) {
            s.elsewhere += 1;
        }
        shared.wake_all();
    }));
    wait()
}

/// A chunk on its way through the threads; its buffer returns to the pool when the last
/// thread is done with it.
struct Piece {
    file: usize,
    index: u64,
    len: usize,
    /// `None`: a chunk nothing was written to in a sparse file (zeros; left as a hole).
    buf: Option<PooledBuf>,
    /// Read back from the disk (a spilled chunk): the disk writer passes it by.
    on_disk: bool,
}

struct PooledBuf {
    buf: Option<MmapMut>,
    pool: Arc<Pool>,
}

impl Drop for PooledBuf {
    fn drop(&mut self) {
        if let Some(b) = self.buf.take() {
            self.pool.put(b);
        }
    }
}

/// Chunk buffers kept for reuse (their pages stay faulted in).
struct Pool {
    free: Mutex<Vec<MmapMut>>,
    geometry: Geometry,
    /// A sparse output's buffers are zeroed before reuse: its unwritten bytes are zeros.
    zeroed: bool,
}

impl Pool {
    fn take(&self) -> std::io::Result<MmapMut> {
        let reused = lock(&self.free).pop();
        match reused {
            Some(mut b) => {
                if self.zeroed {
                    b.fill(0);
                }
                Ok(b)
            }
            // Fresh anonymous pages are zero.
            None => MmapMut::map_anon(self.geometry.chunk),
        }
    }

    fn put(&self, b: MmapMut) {
        let mut free = lock(&self.free);
        if free.len() < (self.geometry.window as usize) + 4 * QUEUE {
            free.push(b);
        }
    }
}

struct Shared {
    files: Vec<OutFile>,
    pool: Arc<Pool>,
    geometry: Geometry,
    stop: AtomicBool,
    failure: Mutex<Option<OrderedError>>,
    /// Bytes the file hasher has passed, all files together.
    passed: AtomicU64,
    /// Whether the digests are wanted (not for an unsealed skeleton).
    hashing: AtomicBool,
    sealing: Mutex<Option<Arc<PhaseGuard>>>,
    producers: Mutex<ProducerRegister>,
    /// Bytes of spilled chunks (read back by the front thread).
    spilled: AtomicU64,
    /// Times a write waited for the front.
    waits: AtomicU64,
    whole: Mutex<Vec<Option<String>>>,
    per_tensor: Mutex<Vec<Vec<Option<String>>>>,
}

/// The weight files of a staged output, written through the reorder window.
pub struct OrderedFiles {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

/// A file to create: its path, its length, and its tensors with absolute byte ranges when
/// its digests are made as it is written (`None`: a GGUF file, digested at the seal).
pub struct NewFile {
    /// Where.
    pub path: PathBuf,
    /// Its final length.
    pub len: u64,
    /// Its tensors, for the per-tensor digests.
    pub tensors: Option<Vec<TensorInfo>>,
    /// Byte ranges no producer writes (a GGUF file's alignment padding), sorted: zeros.
    pub gaps: Vec<(u64, u64)>,
}

/// Locks `m`, poisoned or not (every update this crate makes under such a lock leaves the
/// value consistent).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Creates `path` for writing, with `O_DIRECT` when the file system takes it.
fn create_for_writing(path: &Path) -> std::io::Result<(File, bool)> {
    let open = |direct: bool| {
        let mut o = std::fs::OpenOptions::new();
        o.read(true).write(true).create_new(true);
        if direct {
            o.custom_flags(libc::O_DIRECT);
        }
        o.open(path)
    };
    match open(true) {
        Ok(f) => Ok((f, true)),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => open(false).map(|f| (f, false)),
        Err(e) => Err(e),
    }
}

impl OrderedFiles {
    /// Creates every file (`reserve`: with its space allocated) and starts the threads, cut
    /// by the default geometry (or [`with_geometry`]'s). Returns the open files too, for
    /// the caller's fsync.
    pub fn create(
        files: Vec<NewFile>,
        sparse: bool,
        reserve: impl Fn(&File, u64) -> std::io::Result<()>,
    ) -> Result<(OrderedFiles, Vec<Arc<File>>), OrderedError> {
        let geometry = GEOMETRY.with(|g| g.get()).unwrap_or_default();
        OrderedFiles::create_with(files, sparse, reserve, geometry)
    }

    /// [`OrderedFiles::create`] with another chunk size and window (tests use small ones).
    pub fn create_with(
        files: Vec<NewFile>,
        sparse: bool,
        reserve: impl Fn(&File, u64) -> std::io::Result<()>,
        geometry: Geometry,
    ) -> Result<(OrderedFiles, Vec<Arc<File>>), OrderedError> {
        let geometry = Geometry {
            chunk: (geometry.chunk.div_ceil(DIRECT_ALIGN) * DIRECT_ALIGN)
                .clamp(DIRECT_ALIGN, CHUNK),
            window: geometry.window.max(1),
            small: geometry.small,
        };
        let mut out = Vec::with_capacity(files.len());
        let mut handles = Vec::with_capacity(files.len());
        for f in files {
            let io = |source| OrderedError::Io {
                path: f.path.clone(),
                source,
            };
            let (file, direct) = create_for_writing(&f.path).map_err(io)?;
            reserve(&file, f.len).map_err(io)?;
            let file = Arc::new(file);
            handles.push(file.clone());
            out.push(OutFile {
                path: f.path,
                file,
                opened_direct: direct,
                direct: AtomicBool::new(direct),
                fallback: std::sync::OnceLock::new(),
                len: f.len,
                front: AtomicU64::new(0),
                tensors: f.tensors,
                gaps: f.gaps,
                window: Mutex::default(),
                moved: Condvar::new(),
            });
        }
        let n = out.len();
        let per_tensor = out
            .iter()
            .map(|f| vec![None; f.tensors.as_ref().map_or(0, Vec::len)])
            .collect();
        let shared = Arc::new(Shared {
            files: out,
            pool: Arc::new(Pool {
                free: Mutex::default(),
                geometry,
                zeroed: sparse,
            }),
            geometry,
            stop: AtomicBool::new(false),
            failure: Mutex::new(None),
            passed: AtomicU64::new(0),
            hashing: AtomicBool::new(true),
            sealing: Mutex::new(None),
            producers: Mutex::default(),
            spilled: AtomicU64::new(0),
            waits: AtomicU64::new(0),
            whole: Mutex::new(vec![None; n]),
            per_tensor: Mutex::new(per_tensor),
        });
        let (to_tensors, tensors_rx) = sync_channel::<Arc<Piece>>(QUEUE);
        let (to_disk, disk_rx) = sync_channel::<Arc<Piece>>(QUEUE);
        let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .name(name.into())
                .spawn(f)
                .map_err(|source| OrderedError::Io {
                    path: PathBuf::from("<thread>"),
                    source,
                })
        };
        let mut files = OrderedFiles {
            shared: shared.clone(),
            threads: Vec::new(),
        };
        // On a failed spawn, dropping `files` stops and joins the threads already started.
        let s = shared.clone();
        let front = move || s.run_front(to_tensors, to_disk);
        files.threads.push(spawn("wanbake-hash", Box::new(front))?);
        let s = shared.clone();
        let tensors = move || s.run_tensors(tensors_rx);
        files
            .threads
            .push(spawn("wanbake-tensors", Box::new(tensors))?);
        let s = shared;
        let disk = move || s.run_disk(disk_rx);
        files.threads.push(spawn("wanbake-disk", Box::new(disk))?);
        Ok((files, handles))
    }

    /// Copies `bytes` to absolute offset `at` of file `file`. Each byte of a file must be
    /// written exactly once. A large write far ahead of the file's front may wait for it
    /// (never forever: the module doc's invariant).
    pub fn write(&self, file: usize, at: u64, bytes: &[u8]) -> Result<(), OrderedError> {
        let f = &self.shared.files[file];
        let g = self.shared.geometry;
        // A sparse output may leave any range unwritten, so its front may not move until the
        // seal: its writes never wait (only the zero-fill of `synth` writes sparse outputs,
        // and it writes nothing).
        let wait = bytes.len() > g.small && !self.shared.pool.zeroed;
        let mut done = 0usize;
        while done < bytes.len() {
            let pos = at + done as u64;
            let index = pos / g.chunk as u64;
            let within = (pos % g.chunk as u64) as usize;
            let n = (g.chunk - within).min(bytes.len() - done);
            let chunk = self.shared.chunk(file, index, wait)?;
            let complete = {
                let mut c = lock(&chunk);
                let Some(buf) = c.buf.as_mut() else {
                    return Err(OrderedError::Late {
                        path: f.path.clone(),
                        offset: pos,
                    });
                };
                buf[within..within + n].copy_from_slice(&bytes[done..done + n]);
                c.filled += n;
                c.filled >= g.len_of(f.len, index)
            };
            if complete {
                self.shared.place(file, index, &chunk)?;
            }
            done += n;
        }
        self.shared.check()
    }

    /// Passes every remaining chunk on and waits for the threads: `sparse` files take their
    /// unwritten bytes as zeros (else a missing byte is an error). With `phase`, returns one
    /// digest per file that has tensors listed (`None` for the others); without, only writes
    /// what was written (an unsealed skeleton).
    pub fn finish(
        mut self,
        sparse: bool,
        phase: Option<Arc<PhaseGuard>>,
    ) -> Result<Vec<Option<SafetensorsDigest>>, OrderedError> {
        let hashing = phase.is_some();
        self.shared.hashing.store(hashing, Ordering::SeqCst);
        *lock(&self.shared.sealing) = phase;
        let closing = if sparse {
            Closing::Sparse
        } else {
            Closing::Complete
        };
        for f in &self.shared.files {
            lock(&f.window).closed = Some(closing);
            f.moved.notify_all();
        }
        for h in self.threads.drain(..) {
            let _ = h.join();
        }
        self.shared.check()?;
        for f in &self.shared.files {
            // Cut back the padding of a last partial block written with O_DIRECT.
            let len = f.file.metadata().map(|m| m.len());
            if len.is_ok_and(|l| l != f.len) {
                f.file.set_len(f.len).map_err(|source| OrderedError::Io {
                    path: f.path.clone(),
                    source,
                })?;
            }
        }
        if !hashing {
            return Ok(vec![None; self.shared.files.len()]);
        }
        let whole = lock(&self.shared.whole).clone();
        let per_tensor = lock(&self.shared.per_tensor).clone();
        Ok(self
            .shared
            .files
            .iter()
            .zip(whole)
            .zip(per_tensor)
            .map(|((f, sha), digests)| {
                let tensors = f.tensors.as_ref()?;
                let tensors = tensors
                    .iter()
                    .zip(digests)
                    .map(|(t, d)| {
                        let d = TensorDigest {
                            dtype: ElementType::Dtype(t.dtype),
                            shape: t.shape.clone(),
                            sha256: d.unwrap_or_default(),
                        };
                        (t.name.clone(), d)
                    })
                    .collect();
                Some(SafetensorsDigest {
                    bytes: f.len,
                    sha256: sha.unwrap_or_default(),
                    tensors,
                })
            })
            .collect())
    }

    /// Registers `n` producers (the threads of a job loop), one guard each: while a guard
    /// lives, writes of other threads may wait for the front on the promise that its thread
    /// keeps writing. The thread that takes a guard says where each item it runs starts
    /// ([`Producer::start_item`]), and drops the guard when it has no item left (or fails).
    pub fn producers(&self, n: usize) -> Vec<Producer<'_>> {
        let mut p = lock(&self.shared.producers);
        let first = p.slots.len();
        p.slots.extend((0..n).map(|_| ProducerSlot {
            live: true,
            ..ProducerSlot::default()
        }));
        (first..first + n)
            .map(|slot| Producer {
                shared: &self.shared,
                weak: Arc::downgrade(&self.shared),
                slot,
            })
            .collect()
    }

    /// Bytes of chunks that were spilled and read back (0 when the window always held).
    pub fn spilled_bytes(&self) -> u64 {
        self.shared.spilled.load(Ordering::Relaxed)
    }

    /// How many times a write waited for the front.
    pub fn waits(&self) -> u64 {
        self.shared.waits.load(Ordering::Relaxed)
    }

    /// Gives the output up: the threads stop and every write, waiting or to come, fails.
    /// For a producer whose job failed: the front of its file will never move, so a write
    /// of another job waiting for it would wait forever.
    pub fn abandon(&self) {
        self.shared.halt();
    }

    /// Bytes the file hasher has not passed yet (for the seal's progress).
    pub fn unpassed_bytes(&self) -> u64 {
        let total: u64 = self.shared.files.iter().map(|f| f.len).sum();
        total.saturating_sub(self.shared.passed.load(Ordering::Relaxed))
    }
}

/// One registered producer thread ([`OrderedFiles::producers`]); dropping it leaves the
/// register and wakes every waiting write to check again whether it may go on waiting.
pub struct Producer<'a> {
    shared: &'a Shared,
    weak: Weak<Shared>,
    slot: usize,
}

impl Producer<'_> {
    /// The calling thread, this producer, starts an item whose writes start at byte `at` of
    /// file `file` (items are taken in file order). Wakes the waiting writes: one that
    /// waited for this producer's previous item may have to go on instead.
    pub fn start_item(&self, file: usize, at: u64) {
        PRODUCING.with(|p| *p.borrow_mut() = Some((self.weak.clone(), self.slot)));
        if let Some(s) = lock(&self.shared.producers).slots.get_mut(self.slot) {
            s.item = Some((file, at));
        }
        self.shared.wake_all();
    }
}

impl Drop for Producer<'_> {
    fn drop(&mut self) {
        if producer_slot(self.shared) == Some(self.slot) {
            PRODUCING.with(|p| *p.borrow_mut() = None);
        }
        if let Some(s) = lock(&self.shared.producers).slots.get_mut(self.slot) {
            *s = ProducerSlot::default();
        }
        self.shared.wake_all();
    }
}

impl Drop for OrderedFiles {
    fn drop(&mut self) {
        if self.threads.is_empty() {
            return;
        }
        self.shared.halt();
        for h in self.threads.drain(..) {
            let _ = h.join();
        }
    }
}

impl Shared {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    fn fail(&self, e: OrderedError) {
        lock(&self.failure).get_or_insert(e);
        self.halt();
    }

    /// Stops the threads and wakes every waiting writer (its write then fails). Notified
    /// under each window's lock: a thread that has just seen `stop` unset under that lock
    /// is then already waiting, so the wake-up cannot fall between its check and its wait.
    fn halt(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.wake_all();
    }

    /// Wakes every waiting writer and the front thread, each under its file's lock (see
    /// `halt`).
    fn wake_all(&self) {
        for f in &self.files {
            let _w = lock(&f.window);
            f.moved.notify_all();
        }
    }

    /// The first failure of any thread, as an error of its own (the original stays for
    /// `finish`).
    fn check(&self) -> Result<(), OrderedError> {
        match &*lock(&self.failure) {
            None => Ok(()),
            Some(OrderedError::Io { path, source }) => Err(OrderedError::Io {
                path: path.clone(),
                // An OS error is copied as itself (a hint reads its code: disk full, file
                // size limit); any other as its whole chain.
                source: match source.raw_os_error() {
                    Some(code) => std::io::Error::from_raw_os_error(code),
                    None => std::io::Error::new(source.kind(), crate::error_text::chain(source)),
                },
            }),
            Some(OrderedError::Gap { path, offset }) => Err(OrderedError::Gap {
                path: path.clone(),
                offset: *offset,
            }),
            Some(OrderedError::Late { path, offset }) => Err(OrderedError::Late {
                path: path.clone(),
                offset: *offset,
            }),
        }
    }

    /// Chunk `index` of file `fi`, created if new; when `wait`, waits while it is too far
    /// ahead of the front and waiting is certain to end (`may_wait`).
    fn chunk(&self, fi: usize, index: u64, wait: bool) -> Result<Arc<Mutex<Chunk>>, OrderedError> {
        let f = &self.files[fi];
        let me = producer_slot(self);
        let mut w = lock(&f.window);
        loop {
            if self.stopped() {
                drop(w);
                self.check()?;
                return Err(OrderedError::Io {
                    path: f.path.clone(),
                    source: std::io::Error::other("the output was abandoned"),
                });
            }
            if index < w.front {
                return Err(OrderedError::Late {
                    path: f.path.clone(),
                    offset: self.geometry.start(index),
                });
            }
            if let Some(c) = w.chunks.get(&index) {
                return Ok(c.clone());
            }
            if !wait || index < w.front + self.geometry.window || !self.wait_for(fi, index, &w, me)
            {
                break;
            }
            w = f.moved.wait(w).unwrap_or_else(|p| p.into_inner());
            self.stop_waiting(me);
        }
        let mut buf = self.pool.take().map_err(|source| OrderedError::Io {
            path: f.path.clone(),
            source,
        })?;
        // Padding is zeros and counts as written.
        let start = self.geometry.start(index);
        let end = start + self.geometry.len_of(f.len, index) as u64;
        let mut filled = 0;
        for &(a, b) in &f.gaps {
            let (lo, hi) = (a.max(start), b.min(end));
            if lo < hi {
                buf[(lo - start) as usize..(hi - start) as usize].fill(0);
                filled += (hi - lo) as usize;
            }
        }
        let c = Arc::new(Mutex::new(Chunk {
            buf: Some(buf),
            filled,
            stage: Stage::Filling,
        }));
        w.chunks.insert(index, c.clone());
        Ok(c)
    }

    /// Whether a write to chunk `index` of file `fi` (whose window `w` is locked), made by
    /// producer `me` (if it is one), may wait for the front, recorded as waiting in the same
    /// step when it may: only while the front is certain to move without it (the module
    /// doc's invariant): the front chunk is complete, or another producer that
    /// is not blocked runs an item that starts in or before the front chunk (an earlier file
    /// counts as before), so it may be the one that completes it. Waiting for a producer
    /// whose item lies past the front would idle this thread while the front waits for
    /// an item nobody runs yet (scaled fp8's scales). Fronts of other files are read without
    /// their locks; they only grow, so a stale one counts a producer as blocked that no
    /// longer is, and the answer errs towards not waiting.
    fn wait_for(&self, fi: usize, index: u64, w: &Window, me: Option<usize>) -> bool {
        let mut p = lock(&self.producers);
        let ready = (w.chunks.get(&w.front)).is_some_and(|c| lock(c).stage.ready());
        let wait = ready || self.covered(fi, w, me, &p);
        if let Some(s) = me.and_then(|m| p.slots.get_mut(m)).filter(|_| wait) {
            s.waiting = Some((fi, index));
        }
        if wait {
            self.waits.fetch_add(1, Ordering::Relaxed);
        }
        wait
    }

    /// Whether a producer other than `me`, not blocked, runs an item that starts in or
    /// before the front chunk of file `fi` (window `w`).
    fn covered(&self, fi: usize, w: &Window, me: Option<usize>, p: &ProducerRegister) -> bool {
        let front_end = self.geometry.start(w.front + 1);
        let blocked = |waiting: Option<(usize, u64)>| {
            waiting.is_some_and(|(file, index)| {
                let front = match file == fi {
                    true => w.front,
                    false => self.files[file].front.load(Ordering::SeqCst),
                };
                index >= front + self.geometry.window
            })
        };
        p.slots.iter().enumerate().any(|(slot, s)| {
            s.live
                && Some(slot) != me
                && !blocked(s.waiting)
                && s.elsewhere == 0
                && s.item
                    .is_some_and(|(file, at)| file < fi || (file == fi && at < front_end))
        })
    }

    /// Records that producer `me` (if it is one) no longer waits.
    fn stop_waiting(&self, me: Option<usize>) {
        let Some(m) = me else { return };
        if let Some(s) = lock(&self.producers).slots.get_mut(m) {
            s.waiting = None;
        }
    }

    /// Says where the bytes of chunk `index` of file `fi`, just completed by this writer,
    /// go: within the window they stay for the front thread; beyond it they are spilled
    /// (written to the disk now, and read back when the front gets there).
    fn place(&self, fi: usize, index: u64, chunk: &Mutex<Chunk>) -> Result<(), OrderedError> {
        let f = &self.files[fi];
        let buf = {
            let w = lock(&f.window);
            let mut c = lock(chunk);
            if index < w.front + self.geometry.window {
                c.stage = Stage::InMemory;
                f.moved.notify_all();
                return Ok(());
            }
            c.stage = Stage::Spilling;
            c.buf.take()
        };
        let len = self.geometry.len_of(f.len, index);
        if let Some(buf) = buf {
            let written = self.write_chunk(f, &buf, len, self.geometry.start(index));
            self.pool.put(buf);
            if let Err(source) = written {
                self.fail(OrderedError::Io {
                    path: f.path.clone(),
                    source,
                });
                return self.check();
            }
        }
        self.spilled.fetch_add(len as u64, Ordering::Relaxed);
        let _w = lock(&f.window);
        lock(chunk).stage = Stage::OnDisk;
        f.moved.notify_all();
        Ok(())
    }

    /// The front thread: takes each file's chunks in order as they complete, adds them to
    /// the whole-file digest and hands them to the tensor hasher and the disk writer.
    fn run_front(&self, to_tensors: SyncSender<Arc<Piece>>, to_disk: SyncSender<Arc<Piece>>) {
        for (fi, f) in self.files.iter().enumerate() {
            let mut h = Sha256::new();
            for index in 0..self.geometry.count(f.len) {
                let Some(piece) = self.next_piece(fi, f, index) else {
                    return;
                };
                if self.hashing.load(Ordering::SeqCst) {
                    match &piece.buf {
                        Some(b) => h.update(&b.bytes()[..piece.len]),
                        None => h.update(&ZEROS[..piece.len]),
                    }
                }
                self.passed.fetch_add(piece.len as u64, Ordering::Relaxed);
                if let Some(p) = lock(&self.sealing).as_ref() {
                    p.add_bytes(piece.len as u64);
                }
                let piece = Arc::new(piece);
                if to_tensors.send(piece.clone()).is_err() || to_disk.send(piece).is_err() {
                    return;
                }
            }
            if self.hashing.load(Ordering::SeqCst) {
                lock(&self.whole)[fi] = Some(hex(&h.finalize()));
            }
        }
    }

    /// Waits for chunk `index` of file `fi` to be complete (or the file closed), and takes
    /// it out of the window (reading it back if it was spilled). `None` when stopped or
    /// failed.
    fn next_piece(&self, fi: usize, f: &OutFile, index: u64) -> Option<Piece> {
        let len = self.geometry.len_of(f.len, index);
        let mut w = lock(&f.window);
        loop {
            if self.stopped() {
                return None;
            }
            let stage = w.chunks.get(&index).map(|c| lock(c).stage);
            match (stage, w.closed) {
                (Some(s), _) if s.ready() => break,
                (Some(Stage::Spilling), _) => {}
                (_, Some(Closing::Sparse)) => break,
                (_, Some(Closing::Complete)) => {
                    drop(w);
                    self.fail(OrderedError::Gap {
                        path: f.path.clone(),
                        offset: self.geometry.start(index),
                    });
                    return None;
                }
                _ => {}
            }
            w = f.moved.wait(w).unwrap_or_else(|p| p.into_inner());
        }
        let chunk = w.chunks.remove(&index);
        w.front = index + 1;
        f.front.store(index + 1, Ordering::SeqCst);
        f.moved.notify_all();
        drop(w);
        // Taken under the chunk's lock: a writer that has copied its bytes may still hold
        // the chunk, but never writes to it again (its count says it is complete).
        let (buf, stage) = match chunk {
            Some(c) => {
                let mut c = lock(&c);
                (c.buf.take(), c.stage)
            }
            None => (None, Stage::Filling),
        };
        let on_disk = stage == Stage::OnDisk;
        let buf = match on_disk {
            true => match self.read_chunk(f, index, len) {
                Ok(b) => Some(b),
                Err(source) => {
                    self.fail(OrderedError::Io {
                        path: f.path.clone(),
                        source,
                    });
                    return None;
                }
            },
            false => buf,
        };
        Some(Piece {
            file: fi,
            index,
            len,
            buf: buf.map(|buf| PooledBuf {
                buf: Some(buf),
                pool: self.pool.clone(),
            }),
            on_disk,
        })
    }

    /// The tensor hasher: each tensor's sha256 from the chunks, in file order.
    fn run_tensors(&self, rx: Receiver<Arc<Piece>>) {
        let mut current: Option<(usize, usize, Sha256)> = None;
        for piece in rx {
            if !self.hashing.load(Ordering::SeqCst) {
                continue;
            }
            let f = &self.files[piece.file];
            let Some(tensors) = &f.tensors else { continue };
            let start = self.geometry.start(piece.index);
            let end = start + piece.len as u64;
            let bytes: &[u8] = match &piece.buf {
                Some(b) => &b.bytes()[..piece.len],
                None => &ZEROS[..piece.len],
            };
            let (mut ti, mut h) = match current.take() {
                Some((fi, ti, h)) if fi == piece.file => (ti, h),
                _ => (0, Sha256::new()),
            };
            while let Some(t) = tensors.get(ti) {
                let (b, e) = (t.begin as u64, t.end as u64);
                if b >= end && !(b == e && b == end && end == f.len) {
                    break;
                }
                let (lo, hi) = (b.max(start), e.min(end));
                if lo < hi {
                    h.update(&bytes[(lo - start) as usize..(hi - start) as usize]);
                }
                if e > end {
                    break;
                }
                lock(&self.per_tensor)[piece.file][ti] = Some(hex(&h.finalize_reset()));
                ti += 1;
            }
            current = Some((piece.file, ti, h));
        }
    }

    /// The disk writer: each chunk at its offset (`O_DIRECT` in whole blocks where the file
    /// takes it; a chunk of a sparse file nothing was written to is left a hole).
    fn run_disk(&self, rx: Receiver<Arc<Piece>>) {
        for piece in rx {
            let f = &self.files[piece.file];
            let Some(buf) = piece.buf.as_ref().filter(|_| !piece.on_disk) else {
                continue;
            };
            let at = self.geometry.start(piece.index);
            if let Err(source) = self.write_chunk(f, buf.bytes(), piece.len, at) {
                return self.fail(OrderedError::Io {
                    path: f.path.clone(),
                    source,
                });
            }
        }
    }

    fn write_chunk(&self, f: &OutFile, buf: &[u8], len: usize, at: u64) -> std::io::Result<()> {
        if f.direct.load(Ordering::Relaxed) {
            // Whole blocks; a last partial block is padded and the file cut back at the end.
            let padded = len.div_ceil(DIRECT_ALIGN) * DIRECT_ALIGN;
            match f.file.write_all_at(&buf[..padded], at) {
                Ok(()) => return Ok(()),
                // Some file systems open with O_DIRECT but refuse the writes: go buffered.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    f.direct.store(false, Ordering::Relaxed);
                }
                Err(e) => return Err(e),
            }
        }
        f.buffered()?.write_all_at(&buf[..len], at)
    }

    /// Reads a spilled chunk back into a buffer of the pool, through the page cache: the
    /// spilled chunks right after it (up to [`READ_AHEAD_CHUNKS`], only ones already on the
    /// disk) are asked of the disk first, so they arrive while this one is hashed (a layout
    /// whose front chunk completes last, such as per-row scales at the file's start, reads
    /// the whole file back after the last job: synchronous reads there left the disk idle
    /// during every hash). What was read is dropped from the cache again (the output is not
    /// read twice).
    fn read_chunk(&self, f: &OutFile, index: u64, len: usize) -> std::io::Result<MmapMut> {
        use rustix::fs::{Advice, fadvise};
        let mut buf = self.pool.take()?;
        let at = self.geometry.start(index);
        let file = f.buffered()?;
        let spilled_after = {
            let w = lock(&f.window);
            let on_disk = |i: &u64| {
                (w.chunks.get(&(index + i))).is_some_and(|c| lock(c).stage == Stage::OnDisk)
            };
            (1..=READ_AHEAD_CHUNKS as u64).take_while(on_disk).count()
        };
        let ahead = std::num::NonZeroU64::new((spilled_after * CHUNK) as u64);
        // Hints: a failure changes only the speed.
        if ahead.is_some() {
            let _ = fadvise(
                file,
                self.geometry.start(index + 1),
                ahead,
                Advice::WillNeed,
            );
        }
        read_full(file, &mut buf[..len], at, len)?;
        let _ = fadvise(
            file,
            at,
            std::num::NonZeroU64::new(len as u64),
            Advice::DontNeed,
        );
        Ok(buf)
    }
}

/// Reads at least `need` bytes of `file` at `at` into `buf`.
fn read_full(file: &File, buf: &mut [u8], at: u64, need: usize) -> std::io::Result<()> {
    let mut got = 0;
    while got < need {
        match file.read_at(&mut buf[got..], at + got as u64) {
            Ok(0) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!(
                        "the file ended at {} reading back a spilled chunk",
                        at + got as u64
                    ),
                ));
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

impl OutFile {
    /// The file without `O_DIRECT` (the file itself when it was opened so), for writing and
    /// reading back.
    fn buffered(&self) -> std::io::Result<&File> {
        if !self.opened_direct {
            return Ok(&self.file);
        }
        if let Some(f) = self.fallback.get() {
            return Ok(f);
        }
        let f = (std::fs::OpenOptions::new().read(true).write(true)).open(&self.path)?;
        Ok(self.fallback.get_or_init(|| f))
    }
}

impl PooledBuf {
    fn bytes(&self) -> &[u8] {
        self.buf.as_deref().unwrap_or(&[])
    }
}

/// A chunk of zeros, for the hashes of a sparse file's unwritten chunks.
static ZEROS: [u8; CHUNK] = [0; CHUNK];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::DType;
    use crate::rng::SplitMix64;

    /// One planned file: its length, tensors (absolute ranges) and padding gaps.
    fn layout(
        rng: &mut SplitMix64,
        prefix: u64,
        padded: bool,
    ) -> (u64, Vec<TensorInfo>, Vec<(u64, u64)>) {
        let mut at = prefix;
        let (mut tensors, mut gaps) = (Vec::new(), Vec::new());
        for i in 0..24 {
            let n = match i % 6 {
                0 => 0,
                1 => 1 + rng.below(300),
                _ => 1 + rng.below(90_000),
            };
            tensors.push(TensorInfo {
                name: format!("t{i:02}"),
                dtype: DType::U8,
                shape: vec![n],
                begin: at as usize,
                end: at as usize + n,
            });
            at += n as u64;
            if padded && i % 3 == 0 {
                let pad = 1 + rng.below(31) as u64;
                gaps.push((at, at + pad));
                at += pad;
            }
        }
        (at, tensors, gaps)
    }

    /// Writes two files through a small window from four threads that take the tensors in
    /// file order, each writing its tensor front to back in pieces of random size (large
    /// ones wait for the window; a small piece at a tensor's end goes first), and checks
    /// the digests against sha256 of the bytes meant, and the files against those bytes.
    fn round(dir: &Path, sparse: bool) {
        let mut rng = SplitMix64::new(7 + sparse as u64);
        let specs = [layout(&mut rng, 136, false), layout(&mut rng, 40, true)];
        let mut meant: Vec<Vec<u8>> = specs.iter().map(|s| vec![0u8; s.0 as usize]).collect();
        let mut jobs = Vec::new(); // (file, pieces)
        for (fi, (len, tensors, _)) in specs.iter().enumerate() {
            let prefix: Vec<u8> = (0..tensors[0].begin)
                .map(|_| rng.next_u64() as u8)
                .collect();
            meant[fi][..prefix.len()].copy_from_slice(&prefix);
            jobs.push((fi, vec![(0u64, prefix)]));
            for (ti, t) in tensors.iter().enumerate() {
                if sparse && ti % 5 == 2 {
                    continue; // left as zeros
                }
                let bytes: Vec<u8> = (t.begin..t.end).map(|_| rng.next_u64() as u8).collect();
                meant[fi][t.begin..t.end].copy_from_slice(&bytes);
                let mut pieces = Vec::new();
                let mut at = 0;
                while at < bytes.len() {
                    let n = (1 + rng.below(150_000)).min(bytes.len() - at);
                    pieces.push(((t.begin + at) as u64, bytes[at..at + n].to_vec()));
                    at += n;
                }
                if let Some(last) = pieces.pop() {
                    if last.1.len() <= SMALL_WRITE {
                        pieces.insert(0, last);
                    } else {
                        pieces.push(last);
                    }
                }
                jobs.push((fi, pieces));
            }
            assert_eq!(*len as usize, meant[fi].len());
        }
        let files = specs
            .iter()
            .enumerate()
            .map(|(i, (len, tensors, gaps))| NewFile {
                path: dir.join(format!("f{i}")),
                len: *len,
                tensors: Some(tensors.clone()),
                gaps: gaps.clone(),
            })
            .collect();
        let geometry = Geometry {
            chunk: 8192,
            window: 3,
            small: SMALL_WRITE,
        };
        let reserve = |f: &File, len: u64| f.set_len(len);
        let (out, _) = OrderedFiles::create_with(files, sparse, reserve, geometry).unwrap();
        let next = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    while let Some((fi, pieces)) = jobs.get(next.fetch_add(1, Ordering::SeqCst)) {
                        for (at, bytes) in pieces {
                            out.write(*fi, *at, bytes).unwrap();
                        }
                    }
                });
            }
        });
        let phase = Arc::new(crate::progress::begin("test", 0, 0));
        let digests = out.finish(sparse, Some(phase)).unwrap();
        for (fi, d) in digests.iter().enumerate() {
            let d = d.as_ref().unwrap();
            let on_disk = std::fs::read(dir.join(format!("f{fi}"))).unwrap();
            assert!(on_disk == meant[fi], "file {fi} holds other bytes");
            assert_eq!(d.sha256, hex(&Sha256::digest(&meant[fi])));
            for t in &specs[fi].1 {
                let want = hex(&Sha256::digest(&meant[fi][t.begin..t.end]));
                assert_eq!(d.tensors[&t.name].sha256, want, "file {fi} {}", t.name);
            }
        }
    }

    #[test]
    fn bytes_and_digests_through_a_small_window_are_the_bytes_meant() {
        let ext = tempfile::tempdir().unwrap();
        round(ext.path(), false);
        let sparse = tempfile::tempdir().unwrap();
        round(sparse.path(), true);
        // tmpfs refuses O_DIRECT: the buffered route.
        if let Ok(shm) = tempfile::tempdir_in("/dev/shm") {
            round(shm.path(), false);
        }
    }

    #[test]
    fn a_byte_never_written_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let files = vec![NewFile {
            path: dir.path().join("f"),
            len: 20_000,
            tensors: None,
            gaps: Vec::new(),
        }];
        let geometry = Geometry {
            chunk: 8192,
            window: 2,
            small: SMALL_WRITE,
        };
        let (out, _) =
            OrderedFiles::create_with(files, false, |f, l| f.set_len(l), geometry).unwrap();
        out.write(0, 0, &[1; 10_000]).unwrap();
        out.write(0, 10_001, &[2; 9_999]).unwrap();
        let phase = Arc::new(crate::progress::begin("test", 0, 0));
        match out.finish(false, Some(phase)) {
            Err(OrderedError::Gap { path, offset }) => {
                assert_eq!((path, offset), (dir.path().join("f"), 8192));
            }
            other => panic!("{other:?}"),
        }
    }

    /// One job of [`drive`]: its writes, in the order it makes them.
    type Job = Vec<(u64, Vec<u8>)>;

    /// The bytes of a file: `len` random bytes, cut into `tensors` (absolute ranges).
    struct Planned {
        bytes: Vec<u8>,
        tensors: Vec<TensorInfo>,
    }

    impl Planned {
        /// Tensors of the given sizes one after another after a prefix of `prefix` bytes.
        fn new(rng: &mut SplitMix64, prefix: usize, sizes: &[usize]) -> Planned {
            let mut at = prefix;
            let tensors = (sizes.iter().enumerate())
                .map(|(i, &n)| {
                    at += n;
                    TensorInfo {
                        name: format!("t{i:02}"),
                        dtype: DType::U8,
                        shape: vec![n],
                        begin: at - n,
                        end: at,
                    }
                })
                .collect();
            let bytes = (0..at).map(|_| rng.next_u64() as u8).collect();
            Planned { bytes, tensors }
        }

        /// Tensor `t`'s bytes as one write.
        fn whole(&self, t: usize) -> (u64, Vec<u8>) {
            let t = &self.tensors[t];
            (t.begin as u64, self.bytes[t.begin..t.end].to_vec())
        }

        /// Tensor `t`'s bytes in writes of `piece` bytes, front to back.
        fn pieces(&self, t: usize, piece: usize) -> Job {
            let t = &self.tensors[t];
            (t.begin..t.end)
                .step_by(piece)
                .map(|a| (a as u64, self.bytes[a..(a + piece).min(t.end)].to_vec()))
                .collect()
        }
    }

    /// Writes `p` through a one-chunk window of 4096 bytes: `header` from this thread (not
    /// a registered producer) first, then `jobs` from `threads` registered threads taking
    /// them in order (jobs must be in the order of their largest write), then `late` from
    /// this thread. Fails instead of hanging (60 s), and
    /// checks the file and its digests against the bytes meant. Returns the bytes spilled
    /// and the number of waits.
    fn drive(p: &Planned, header: Job, jobs: Vec<Job>, late: Job, threads: usize) -> (u64, u64) {
        let (done, result) = std::sync::mpsc::channel();
        let (bytes, tensors) = (p.bytes.clone(), p.tensors.clone());
        std::thread::spawn(move || {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("f");
            let files = vec![NewFile {
                path: path.clone(),
                len: bytes.len() as u64,
                tensors: Some(tensors.clone()),
                gaps: Vec::new(),
            }];
            let geometry = Geometry {
                chunk: 4096,
                window: 1,
                small: SMALL_WRITE,
            };
            let (out, _) =
                OrderedFiles::create_with(files, false, |f, l| f.set_len(l), geometry).unwrap();
            for (at, b) in &header {
                out.write(0, *at, b).unwrap();
            }
            let next = std::sync::atomic::AtomicUsize::new(0);
            let producers: Vec<_> = (out.producers(threads).into_iter())
                .map(|p| Mutex::new(Some(p)))
                .collect();
            std::thread::scope(|s| {
                for slot in &producers {
                    let (out, next, jobs) = (&out, &next, &jobs);
                    s.spawn(move || {
                        let registered = lock(slot).take();
                        while let Some(job) = jobs.get(next.fetch_add(1, Ordering::SeqCst)) {
                            // The item starts where its largest write does (the weight of a
                            // weight-and-scale job), as `Staging`'s items say.
                            let start = (job.iter()).max_by_key(|(_, b)| b.len()).map(|w| w.0);
                            if let (Some(p), Some(at)) = (&registered, start) {
                                p.start_item(0, at);
                            }
                            for (at, b) in job {
                                out.write(0, *at, b).unwrap();
                            }
                        }
                    });
                }
            });
            drop(producers);
            for (at, b) in &late {
                out.write(0, *at, b).unwrap();
            }
            let spilled = (out.spilled_bytes(), out.waits());
            let phase = Arc::new(crate::progress::begin("test", 0, 0));
            let digests = out.finish(false, Some(phase)).unwrap();
            let d = digests[0].clone().unwrap();
            assert!(
                std::fs::read(&path).unwrap() == bytes,
                "the file holds other bytes"
            );
            assert_eq!(d.sha256, hex(&Sha256::digest(&bytes)));
            for t in &tensors {
                let want = hex(&Sha256::digest(&bytes[t.begin..t.end]));
                assert_eq!(d.tensors[&t.name].sha256, want, "{}", t.name);
            }
            let _ = done.send(spilled);
        });
        match result.recv_timeout(std::time::Duration::from_secs(60)) {
            Ok(spilled) => spilled,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!("the writer hung"),
            Err(e) => panic!("the writing thread failed: {e}"),
        }
    }

    /// Scaled fp8's layout: every weight's 4-byte scale near offset 0, each written by its
    /// weight's job after (or before) the weight; the front completes with the last job.
    #[test]
    fn scales_at_the_front_written_by_every_job_complete_through_a_one_chunk_window() {
        let mut rng = SplitMix64::new(11);
        let n = 6;
        let mut sizes = vec![4; n];
        sizes.extend((0..n).map(|i| 150_000 + 4099 * i));
        let p = Planned::new(&mut rng, 104, &sizes);
        for scale_first in [false, true] {
            for threads in [1, 2, 4] {
                let jobs = (0..n)
                    .map(|i| {
                        let mut job = p.pieces(n + i, 70_000);
                        match scale_first {
                            true => job.insert(0, p.whole(i)),
                            false => job.push(p.whole(i)),
                        }
                        job
                    })
                    .collect();
                let header = vec![(0, p.bytes[..104].to_vec())];
                let (spilled, waits) = drive(&p, header, jobs, Vec::new(), threads);
                assert!(spilled > 0, "the weights beyond the window were spilled");
                // Scales written last: until the last job the front needs a scale of a job
                // nobody runs yet, so no producer's item can complete it and waiting would
                // only idle a thread (a rule that let a write wait for any running producer
                // left one thread idle for the whole run). Written first, the front
                // completes with the last job's scale, and that job may wait for it.
                if !scale_first {
                    assert_eq!(waits, 0, "{threads} threads");
                }
            }
        }
    }

    /// A GGUF file whose header-side tensors depend on the last job: the small tensors at
    /// the front are all written by the last job, after its own large one.
    #[test]
    fn front_tensors_of_the_last_job_complete_through_a_one_chunk_window() {
        let mut rng = SplitMix64::new(12);
        let small = [300, 5000, 17, 9000];
        let mut sizes = small.to_vec();
        sizes.extend([200_000, 90_000, 333_333]);
        let p = Planned::new(&mut rng, 64, &sizes);
        for threads in [1, 2, 3] {
            let mut jobs: Vec<Job> = (4..7).map(|t| p.pieces(t, 100_000)).collect();
            let last = jobs.len() - 1;
            jobs[last].extend((0..small.len()).map(|t| p.whole(t)));
            drive(
                &p,
                vec![(0, p.bytes[..64].to_vec())],
                jobs,
                Vec::new(),
                threads,
            );
        }
    }

    /// A header written last, by a thread that is no registered producer, and one tensor
    /// much larger than the window written in a single write.
    #[test]
    fn a_late_header_and_a_tensor_larger_than_the_window_complete() {
        let mut rng = SplitMix64::new(13);
        let p = Planned::new(&mut rng, 4000, &[600_000, 7, 80_000]);
        for threads in [1, 2] {
            let jobs = vec![vec![p.whole(0)], vec![p.whole(1)], p.pieces(2, 66_000)];
            let late = vec![(0, p.bytes[..4000].to_vec())];
            drive(&p, Vec::new(), jobs, late, threads);
        }
        // In file order with the header first, one producer, every write large enough to
        // wait: the front chunk is always complete or being written, so nothing is spilled.
        let jobs = vec![p.pieces(0, 75_000), vec![p.whole(1)], vec![p.whole(2)]];
        let header = vec![(0, p.bytes[..4000].to_vec())];
        let (spilled, waits) = drive(&p, header, jobs, Vec::new(), 1);
        assert_eq!(spilled, 0);
        assert!(waits > 0, "the writer kept within the window by waiting");
    }
}
