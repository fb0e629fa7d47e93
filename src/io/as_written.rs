//! The digests of an output, computed from its bytes as they are written, so a release is
//! hashed once and never re-read before it is committed.
//!
//! Owns: [`AsWritten`], which follows every safetensors weight file of a staged output:
//! - the byte ranges written so far, and the *frontier*, the end of the contiguous run
//!   written from offset 0;
//! - the whole-file sha256, computed in order by a follower thread that reads behind the
//!   frontier (from the page cache, `pread`) and, once it has hashed a range, asks the kernel
//!   to start writing it back (`posix_fadvise(DONTNEED)` starts write-back of dirty pages
//!   without waiting), so the disk works while the CPU merges instead of after it;
//! - each tensor's sha256: on the writing thread, from the very bytes it hands to the file,
//!   while a tensor's bytes arrive in order (a tensor written by one job, band after band);
//!   by a second follower, from the written file once the tensor is complete, when they do
//!   not (the layers of a stacked tensor written by several workers at once), or at the
//!   seal (a sparse output's tensors left as zeros).
//!
//! Does not own: the files, the plan, the fsync and the commit (`staging`), or the digests
//! of a GGUF file (`gguf::digest_gguf`, by re-reading it at the seal). The digests equal
//! those of `digest::digest_safetensors` on the committed file (tested), and `verify`
//! recomputes them from the disk.

use std::collections::{BTreeMap, VecDeque};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use sha2::{Digest, Sha256};

use super::digest::{ElementType, SafetensorsDigest, TensorDigest, hex};
use super::header::TensorInfo;
use crate::progress::PhaseGuard;

/// Bytes a follower reads and hashes at a time.
const CHUNK: u64 = 16 << 20;

/// Why digests as written could not be completed.
#[derive(Debug)]
pub enum AsWrittenError {
    /// Reading the written file back failed.
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
        /// The first byte not written.
        offset: u64,
    },
}

/// One weight file followed as it is written.
struct FileTrack {
    path: PathBuf,
    file: Arc<File>,
    len: u64,
    tensors: Vec<TensorInfo>,
    written: Mutex<Written>,
    advanced: Condvar,
    per_tensor: Vec<Mutex<TensorHash>>,
    whole: Mutex<Option<String>>,
}

/// The ranges of a file written so far.
#[derive(Default)]
struct Written {
    /// Written bytes `[0, frontier)`.
    frontier: u64,
    /// Written ranges past the frontier (start → end).
    ahead: BTreeMap<u64, u64>,
    /// Sealed: no more writes (a sparse file's holes count as written).
    closed: bool,
}

/// A tensor's digest as its bytes arrive.
#[derive(Default)]
struct TensorHash {
    /// The next byte an in-order write would start at.
    next: usize,
    hasher: Sha256,
    /// A write arrived out of order: the follower hashes the tensor from the file.
    out_of_order: bool,
    written: usize,
    /// Queued for the tensor follower.
    queued: bool,
    digest: Option<String>,
}

/// Work for the tensor follower.
#[derive(Default)]
struct TensorQueue {
    pending: VecDeque<(usize, usize)>,
    closed: bool,
}

struct Shared {
    files: Vec<Option<FileTrack>>,
    queue: Mutex<TensorQueue>,
    queued: Condvar,
    stop: AtomicBool,
    /// Bytes the file follower has hashed, all files together.
    hashed: AtomicU64,
    failure: Mutex<Option<AsWrittenError>>,
    /// The seal's progress phase, while it runs.
    sealing: Mutex<Option<Arc<PhaseGuard>>>,
}

/// Digests of a staged output's safetensors files, computed as they are written.
pub struct AsWritten {
    shared: Arc<Shared>,
    followers: Vec<JoinHandle<()>>,
}

/// A file to follow: its path (for messages), the open file, its length and its tensors
/// with absolute byte ranges. `None` for a file digested another way (GGUF).
pub type Followed = Option<(PathBuf, Arc<File>, u64, Vec<TensorInfo>)>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl AsWritten {
    /// Starts following `files` (one entry per planned weight file).
    pub fn start(files: Vec<Followed>) -> AsWritten {
        let files = files
            .into_iter()
            .map(|f| {
                f.map(|(path, file, len, tensors)| FileTrack {
                    per_tensor: tensors.iter().map(|_| Mutex::default()).collect(),
                    path,
                    file,
                    len,
                    tensors,
                    written: Mutex::default(),
                    advanced: Condvar::new(),
                    whole: Mutex::new(None),
                })
            })
            .collect();
        let shared = Arc::new(Shared {
            files,
            queue: Mutex::default(),
            queued: Condvar::new(),
            stop: AtomicBool::new(false),
            hashed: AtomicU64::new(0),
            failure: Mutex::new(None),
            sealing: Mutex::new(None),
        });
        let whole = {
            let s = shared.clone();
            std::thread::spawn(move || s.follow_files())
        };
        let tensors = {
            let s = shared.clone();
            std::thread::spawn(move || s.follow_tensors())
        };
        AsWritten {
            shared,
            followers: vec![whole, tensors],
        }
    }

    /// `bytes` were written at absolute offset `at` of file `file`; when `tensor` is given
    /// they are that tensor's bytes from `offset_in_tensor` on.
    pub fn wrote(&self, file: usize, tensor: Option<(usize, usize)>, at: u64, bytes: &[u8]) {
        let Some(f) = self.shared.files.get(file).and_then(Option::as_ref) else {
            return;
        };
        if let Some((ti, offset)) = tensor {
            self.shared.tensor_bytes(file, f, ti, offset, bytes);
        }
        f.extend(at, bytes.len() as u64);
    }

    /// Waits for every digest: `sparse` files count their unwritten bytes as written
    /// (zeros). `phase` hears of the bytes still hashed. Returns one digest per followed
    /// file (`None` for the others).
    pub fn finish(
        mut self,
        sparse: bool,
        phase: Arc<PhaseGuard>,
    ) -> Result<Vec<Option<SafetensorsDigest>>, AsWrittenError> {
        *lock(&self.shared.sealing) = Some(phase);
        for f in self.shared.files.iter().flatten() {
            let mut w = lock(&f.written);
            w.closed = true;
            if sparse {
                w.frontier = f.len;
                w.ahead.clear();
            }
            f.advanced.notify_all();
        }
        self.shared.queue_unfinished();
        for h in self.followers.drain(..) {
            let _ = h.join();
        }
        if let Some(e) = lock(&self.shared.failure).take() {
            return Err(e);
        }
        Ok(self
            .shared
            .files
            .iter()
            .map(|f| f.as_ref().map(FileTrack::digest))
            .collect())
    }

    /// Bytes of followed files the file follower has not hashed yet (for progress).
    pub fn unhashed_bytes(&self) -> u64 {
        let total: u64 = self.shared.files.iter().flatten().map(|f| f.len).sum();
        total.saturating_sub(self.shared.hashed.load(Ordering::Relaxed))
    }
}

impl Drop for AsWritten {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        for f in self.shared.files.iter().flatten() {
            let _guard = lock(&f.written);
            f.advanced.notify_all();
        }
        {
            let _guard = lock(&self.shared.queue);
            self.shared.queued.notify_all();
        }
        for h in self.followers.drain(..) {
            let _ = h.join();
        }
    }
}

impl FileTrack {
    /// Records `[at, at + len)` as written and wakes the file follower if the frontier moved.
    fn extend(&self, at: u64, len: u64) {
        if len == 0 {
            return;
        }
        let mut w = lock(&self.written);
        let end = at + len;
        if at > w.frontier {
            let e = w.ahead.entry(at).or_insert(end);
            *e = (*e).max(end);
            return;
        }
        w.frontier = w.frontier.max(end);
        while let Some((&start, &end)) = w.ahead.first_key_value() {
            if start > w.frontier {
                break;
            }
            w.ahead.remove(&start);
            w.frontier = w.frontier.max(end);
        }
        self.advanced.notify_all();
    }

    fn digest(&self) -> SafetensorsDigest {
        let tensors = self
            .tensors
            .iter()
            .zip(&self.per_tensor)
            .map(|(t, h)| {
                let d = TensorDigest {
                    dtype: ElementType::Dtype(t.dtype),
                    shape: t.shape.clone(),
                    sha256: lock(h).digest.clone().unwrap_or_default(),
                };
                (t.name.clone(), d)
            })
            .collect();
        SafetensorsDigest {
            bytes: self.len,
            sha256: lock(&self.whole).clone().unwrap_or_default(),
            tensors,
        }
    }

    /// sha256 of `[begin, end)` of the file, read back in chunks.
    fn hash_range(&self, begin: u64, end: u64, buf: &mut Vec<u8>) -> std::io::Result<String> {
        let mut h = Sha256::new();
        let mut at = begin;
        while at < end {
            let n = CHUNK.min(end - at) as usize;
            buf.resize(n, 0);
            self.file.read_exact_at(buf, at)?;
            h.update(&buf[..]);
            at += n as u64;
        }
        Ok(hex(&h.finalize()))
    }
}

impl Shared {
    fn fail(&self, e: AsWrittenError) {
        let mut f = lock(&self.failure);
        if f.is_none() {
            *f = Some(e);
        }
        self.stop.store(true, Ordering::SeqCst);
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    fn progress(&self, n: u64) {
        if let Some(p) = lock(&self.sealing).as_ref() {
            p.add_bytes(n);
        }
    }

    /// A write of tensor `ti`'s bytes from `offset` on: hashed here when it continues the
    /// tensor in order, else the tensor goes to the tensor follower once complete.
    fn tensor_bytes(&self, file: usize, f: &FileTrack, ti: usize, offset: usize, bytes: &[u8]) {
        let Some((slot, info)) = f.per_tensor.get(ti).zip(f.tensors.get(ti)) else {
            return;
        };
        let mut s = lock(slot);
        if !s.out_of_order && offset == s.next {
            s.hasher.update(bytes);
            s.next += bytes.len();
        } else {
            s.out_of_order = true;
        }
        s.written += bytes.len();
        if s.written == info.nbytes() {
            if s.out_of_order {
                s.queued = true;
                drop(s);
                self.enqueue(file, ti);
            } else {
                let h = std::mem::take(&mut s.hasher);
                s.digest = Some(hex(&h.finalize()));
            }
        }
    }

    fn enqueue(&self, file: usize, tensor: usize) {
        let mut q = lock(&self.queue);
        q.pending.push_back((file, tensor));
        self.queued.notify_all();
    }

    /// At the seal: every tensor without a digest that is not queued yet (written out of
    /// order but incomplete, partly or never written: a sparse output's zeros, an empty
    /// tensor) goes to the tensor follower, which then stops once its queue is empty.
    fn queue_unfinished(&self) {
        let mut q = lock(&self.queue);
        for (fi, f) in self.files.iter().enumerate() {
            let Some(f) = f else { continue };
            for (ti, slot) in f.per_tensor.iter().enumerate() {
                let mut s = lock(slot);
                if s.digest.is_none() && !s.queued {
                    s.queued = true;
                    q.pending.push_back((fi, ti));
                }
            }
        }
        q.closed = true;
        self.queued.notify_all();
    }

    /// The file follower: each followed file's whole-file sha256, in order, behind its
    /// frontier.
    fn follow_files(&self) {
        let mut buf = Vec::new();
        for f in self.files.iter().flatten() {
            match self.follow_file(f, &mut buf) {
                Ok(Some(sha)) => *lock(&f.whole) = Some(sha),
                Ok(None) => return,
                Err(e) => return self.fail(e),
            }
        }
    }

    fn follow_file(
        &self,
        f: &FileTrack,
        buf: &mut Vec<u8>,
    ) -> Result<Option<String>, AsWrittenError> {
        let mut h = Sha256::new();
        let mut at = 0u64;
        while at < f.len {
            let upto = {
                let mut w = lock(&f.written);
                while w.frontier <= at && !w.closed && !self.stopped() {
                    w = f.advanced.wait(w).unwrap_or_else(|p| p.into_inner());
                }
                if self.stopped() {
                    return Ok(None);
                }
                if w.frontier <= at {
                    return Err(AsWrittenError::Gap {
                        path: f.path.clone(),
                        offset: at,
                    });
                }
                w.frontier
            };
            let n = CHUNK.min(upto - at);
            buf.resize(n as usize, 0);
            f.file
                .read_exact_at(buf, at)
                .map_err(|source| AsWrittenError::Io {
                    path: f.path.clone(),
                    source,
                })?;
            h.update(&buf[..]);
            // Starts write-back of the hashed range now (dirty pages are not dropped); a
            // failure only loses the overlap, never a byte.
            let _ = rustix::fs::fadvise(
                &*f.file,
                at,
                std::num::NonZeroU64::new(n),
                rustix::fs::Advice::DontNeed,
            );
            at += n;
            self.hashed.fetch_add(n, Ordering::Relaxed);
            self.progress(n);
        }
        Ok(Some(hex(&h.finalize())))
    }

    /// The tensor follower: tensors written out of order, hashed from the file once
    /// complete (and, at the seal, every tensor still without a digest).
    fn follow_tensors(&self) {
        let mut buf = Vec::new();
        loop {
            let (fi, ti) = {
                let mut q = lock(&self.queue);
                loop {
                    if self.stopped() {
                        return;
                    }
                    if let Some(job) = q.pending.pop_front() {
                        break job;
                    }
                    if q.closed {
                        return;
                    }
                    q = self.queued.wait(q).unwrap_or_else(|p| p.into_inner());
                }
            };
            let Some(f) = self.files.get(fi).and_then(Option::as_ref) else {
                continue;
            };
            let Some(t) = f.tensors.get(ti) else { continue };
            match f.hash_range(t.begin as u64, t.end as u64, &mut buf) {
                Ok(sha) => lock(&f.per_tensor[ti]).digest = Some(sha),
                Err(source) => {
                    return self.fail(AsWrittenError::Io {
                        path: f.path.clone(),
                        source,
                    });
                }
            }
        }
    }
}
