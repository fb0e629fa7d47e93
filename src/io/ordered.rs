//! Where a staged output's bytes go: a bounded reorder window per weight file, emptied in
//! file order by three threads that hash and write each piece once.
//!
//! Owns: [`OrderedFiles`]. Producers write any byte range of any file from any thread
//! ([`OrderedFiles::write`]); the bytes are copied into fixed, page-aligned [`CHUNK`]s of the
//! file. Once the chunk at the front of a file is complete it leaves the window, and:
//! - the *file hasher* adds it to the whole-file sha256;
//! - the *tensor hasher* adds each tensor's part of it to that tensor's sha256 (tensors lie
//!   one after another in a safetensors file, so both digests are made in order, from the
//!   bytes written, and nothing is read back);
//! - the *disk writer* writes it at its offset, with `O_DIRECT` where the file system takes
//!   it (aligned chunks from aligned buffers: no copy into the page cache, and the disk works
//!   while the CPU merges instead of after the last write), else through the page cache.
//!
//! The window is bounded: a large write more than [`WINDOW_CHUNKS`] chunks ahead of a file's
//! front waits until the front moves (the job loop takes jobs in file order, so the job at
//! the front is always running and never waits), and each thread takes at most a few chunks
//! at a time, so memory stays at a few dozen chunks whatever the output size. Small writes
//! (a scaled-fp8 weight's scale, written ahead of its tensor by the same job) never wait,
//! and neither do the writes of a sparse output (its unwritten ranges hold the front until
//! the seal).
//!
//! Does not own: the plan, fsync, the commit (`staging`), or the digests of a GGUF file
//! (`gguf::digest_gguf`, by re-reading it at the seal; its bytes still go through here). The
//! digests equal those `digest::digest_safetensors` computes from the committed file
//! (tested), and `verify` recomputes them from the disk.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use memmap2::MmapMut;
use sha2::{Digest, Sha256};

use super::digest::{ElementType, SafetensorsDigest, TensorDigest, hex};
use super::header::TensorInfo;
use crate::progress::PhaseGuard;

/// Bytes of a file one chunk holds (a multiple of every block size `O_DIRECT` asks for).
pub const CHUNK: usize = 4 << 20;

/// How many chunks past a file's front a large write may land before it waits.
pub const WINDOW_CHUNKS: u64 = 16;

/// Writes at most this long never wait for the window.
const SMALL_WRITE: usize = 64 << 10;

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
}

impl Default for Geometry {
    fn default() -> Self {
        Geometry {
            chunk: CHUNK,
            window: WINDOW_CHUNKS,
        }
    }
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
    /// `None` once the front thread has taken it.
    buf: Option<MmapMut>,
    filled: usize,
}

/// A chunk on its way through the threads; its buffer returns to the pool when the last
/// thread is done with it.
struct Piece {
    file: usize,
    index: u64,
    len: usize,
    /// `None`: a chunk nothing was written to in a sparse file (zeros; left as a hole).
    buf: Option<PooledBuf>,
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

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
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
    /// Creates every file (`reserve`: with its space allocated) and starts the threads.
    /// Returns the open files too, for the caller's fsync.
    pub fn create(
        files: Vec<NewFile>,
        sparse: bool,
        reserve: impl Fn(&File, u64) -> std::io::Result<()>,
    ) -> Result<(OrderedFiles, Vec<Arc<File>>), OrderedError> {
        OrderedFiles::create_with(files, sparse, reserve, Geometry::default())
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
    /// written exactly once. A large write far ahead of the file's front waits for it.
    pub fn write(&self, file: usize, at: u64, bytes: &[u8]) -> Result<(), OrderedError> {
        let f = &self.shared.files[file];
        let g = self.shared.geometry;
        // A sparse output may leave any range unwritten, so its front may not move until the
        // seal: its writes never wait (only the zero-fill of `synth` writes sparse outputs,
        // and it writes nothing).
        let wait = bytes.len() > SMALL_WRITE && !self.shared.pool.zeroed;
        let mut done = 0usize;
        while done < bytes.len() {
            let pos = at + done as u64;
            let index = pos / g.chunk as u64;
            let within = (pos % g.chunk as u64) as usize;
            let n = (g.chunk - within).min(bytes.len() - done);
            let chunk = self.shared.chunk(f, index, wait)?;
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
            drop(chunk);
            if complete {
                let _w = lock(&f.window);
                f.moved.notify_all();
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
                source: std::io::Error::new(source.kind(), source.to_string()),
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

    /// Chunk `index` of file `fi`, created if new; waits while it is too far ahead of the
    /// front (when `wait`).
    fn chunk(
        &self,
        f: &OutFile,
        index: u64,
        wait: bool,
    ) -> Result<Arc<Mutex<Chunk>>, OrderedError> {
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
            if !wait || index < w.front + self.geometry.window {
                break;
            }
            w = f.moved.wait(w).unwrap_or_else(|p| p.into_inner());
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
        }));
        w.chunks.insert(index, c.clone());
        Ok(c)
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
    /// it out of the window. `None` when stopped or failed.
    fn next_piece(&self, fi: usize, f: &OutFile, index: u64) -> Option<Piece> {
        let len = self.geometry.len_of(f.len, index);
        let mut w = lock(&f.window);
        loop {
            if self.stopped() {
                return None;
            }
            let filled = w.chunks.get(&index).map(|c| lock(c).filled);
            match (filled, w.closed) {
                (Some(n), _) if n >= len => break,
                (_, Some(Closing::Sparse)) => break,
                (_, Some(Closing::Complete)) => {
                    drop(w);
                    self.fail(OrderedError::Gap {
                        path: f.path.clone(),
                        offset: self.geometry.start(index),
                    });
                    return None;
                }
                _ => w = f.moved.wait(w).unwrap_or_else(|p| p.into_inner()),
            }
        }
        let chunk = w.chunks.remove(&index);
        w.front = index + 1;
        f.moved.notify_all();
        drop(w);
        // Taken under the chunk's lock: a writer that has copied its bytes may still hold
        // the chunk, but never writes to it again (its count says it is complete).
        let buf = chunk
            .and_then(|c| lock(&c).buf.take())
            .map(|buf| PooledBuf {
                buf: Some(buf),
                pool: self.pool.clone(),
            });
        Some(Piece {
            file: fi,
            index,
            len,
            buf,
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
            let Some(buf) = &piece.buf else { continue };
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
}

impl OutFile {
    /// The file without `O_DIRECT` (the file itself when it was opened so).
    fn buffered(&self) -> std::io::Result<&File> {
        if !self.opened_direct {
            return Ok(&self.file);
        }
        if let Some(f) = self.fallback.get() {
            return Ok(f);
        }
        let f = std::fs::OpenOptions::new().write(true).open(&self.path)?;
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
}
