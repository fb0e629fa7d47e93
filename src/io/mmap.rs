//! Read-only memory maps: the only place wanbake maps a file.
//!
//! Owns: `map_readonly` and `release_range` (dropping pages this process no longer needs,
//! so peak RSS stays bounded while a large checkpoint streams through). Every `unsafe`
//! block of the I/O layer lives here.

use std::fs::File;
use std::path::Path;

use memmap2::{Advice, Mmap, UncheckedAdvice};

/// A read-only map of a whole file. Empty files get an empty buffer (mapping zero bytes
/// fails on Linux).
pub struct ReadOnlyMap {
    map: Option<Mmap>,
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

fn page_size() -> usize {
    rustix::param::page_size()
}

/// Maps `file` (opened from `path`) read-only.
///
/// # Safety contract (why this is accepted)
/// A memory map is only sound while nobody truncates or rewrites the file. wanbake opens
/// inputs read-only and never writes into a file it has mapped: outputs go to a fresh
/// temporary sibling directory and are renamed into place, so replacing a release never
/// modifies mapped inodes. Another process truncating an input during a run can still raise
/// SIGBUS; that is the documented risk of mmap-based readers (ripgrep, candle, safetensors
/// accept the same) and is worth the zero-copy reads of multi-GB checkpoints.
pub fn map_readonly(file: &File, _path: &Path) -> std::io::Result<ReadOnlyMap> {
    let len = file.metadata()?.len();
    if len == 0 {
        return Ok(ReadOnlyMap { map: None });
    }
    // SAFETY: see the contract above: the file is opened read-only by us and never written
    // by wanbake while mapped.
    let map = unsafe { Mmap::map(file)? };
    Ok(ReadOnlyMap { map: Some(map) })
}
