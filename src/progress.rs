//! Progress of a long job, updated from any worker thread and read by a front end.
//!
//! Owns: `Progress` (bytes and items done against known totals, lock-free). Does not own
//! how progress is shown (the CLI draws bars or prints lines); the library only counts.

use std::sync::atomic::{AtomicU64, Ordering};

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
}
