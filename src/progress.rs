//! Progress of long work, updated from any worker thread and read by a front end.
//!
//! Owns: `Progress` (bytes and items done against known totals, lock-free) and the board of
//! running phases ([`begin`], [`board`]): every phase of a producing command that can take
//! a while (hashing inputs, writing, sealing, checking, verifying) registers here while it
//! runs, so one watcher in the front end can show all of them, overlapping ones included.
//! Does not own how progress is shown (the CLI draws bars or prints lines); the library
//! only counts. The board is process-wide, like stderr: a library call made without a
//! watcher costs a few atomic adds.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Counters for one phase of work whose totals are known up front.
#[derive(Debug, Default)]
pub struct Progress {
    bytes: AtomicU64,
    items: AtomicU64,
    total_bytes: u64,
    total_items: u64,
}

/// A consistent-enough reading of a `Progress`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// Bytes done.
    pub bytes: u64,
    /// Items (tensors, jobs) done.
    pub items: u64,
    /// Bytes in all.
    pub total_bytes: u64,
    /// Items in all.
    pub total_items: u64,
}

impl Progress {
    /// A phase of `total_items` items making `total_bytes` bytes.
    pub fn new(total_bytes: u64, total_items: u64) -> Progress {
        Progress {
            total_bytes,
            total_items,
            ..Progress::default()
        }
    }

    /// One item of `bytes` bytes is done.
    pub fn item_done(&self, bytes: u64) {
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.items.fetch_add(1, Ordering::Relaxed);
    }

    /// `n` more bytes are done (items counted elsewhere, or not at all).
    pub fn add_bytes(&self, n: u64) {
        self.bytes.fetch_add(n, Ordering::Relaxed);
    }

    /// One more item is done (bytes counted elsewhere).
    pub fn add_item(&self) {
        self.items.fetch_add(1, Ordering::Relaxed);
    }

    /// The counters now.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            bytes: self.bytes.load(Ordering::Relaxed),
            items: self.items.load(Ordering::Relaxed),
            total_bytes: self.total_bytes,
            total_items: self.total_items,
        }
    }
}

/// A running phase on the board.
#[derive(Debug)]
pub struct Phase {
    /// What is being done ("hashing inputs", "writing", "sealing", ...).
    pub name: String,
    /// Its counters.
    pub progress: Progress,
    /// When it began.
    pub started: Instant,
    /// A number unique in this process, so a watcher can tell phases apart.
    pub id: u64,
}

static BOARD: Mutex<Vec<Arc<Phase>>> = Mutex::new(Vec::new());
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// A phase on the board; it leaves the board when this is dropped.
#[derive(Debug)]
pub struct PhaseGuard(Arc<Phase>);

impl std::ops::Deref for PhaseGuard {
    type Target = Progress;
    fn deref(&self) -> &Progress {
        &self.0.progress
    }
}

impl Drop for PhaseGuard {
    fn drop(&mut self) {
        if let Ok(mut b) = BOARD.lock() {
            b.retain(|p| !Arc::ptr_eq(p, &self.0));
        }
    }
}

/// Puts a phase of `total_bytes` bytes (and `total_items` items, 0 when not counted) on the
/// board until the guard is dropped.
pub fn begin(name: &str, total_bytes: u64, total_items: u64) -> PhaseGuard {
    let phase = Arc::new(Phase {
        name: name.to_string(),
        progress: Progress::new(total_bytes, total_items),
        started: Instant::now(),
        id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
    });
    if let Ok(mut b) = BOARD.lock() {
        b.push(phase.clone());
    }
    PhaseGuard(phase)
}

/// The phases running now, oldest first.
pub fn board() -> Vec<Arc<Phase>> {
    BOARD.lock().map(|b| b.clone()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_from_many_threads() {
        let p = Progress::new(4000, 1000);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| (0..250).for_each(|_| p.item_done(4)));
            }
        });
        let s = p.snapshot();
        assert_eq!((s.bytes, s.items), (4000, 1000));
        assert_eq!((s.total_bytes, s.total_items), (4000, 1000));
    }

    #[test]
    fn a_phase_is_on_the_board_while_its_guard_lives() {
        let g = begin("testing the board", 10, 0);
        g.add_bytes(4);
        let id = board()
            .iter()
            .find(|p| p.name == "testing the board")
            .map(|p| (p.id, p.progress.snapshot().bytes));
        assert_eq!(id.map(|x| x.1), Some(4));
        drop(g);
        assert!(board().iter().all(|p| Some(p.id) != id.map(|x| x.0)));
    }
}
