//! Content hashes of input files, computed once per content.
//!
//! Owns: [`sha256_input`] (size and sha256 of a whole input file, streamed with bounded
//! memory, refused when the file changes while it is read) and the content-hash cache that
//! lets a pipeline baking many adapters onto one base hash that base once. Does not own:
//! hashing outputs (`io::digest`, `release::staging`) or the manifest's input records
//! (`release::manifest`).
//!
//! # The cache
//! An entry maps a file's identity ([`FileStamp`]: device, inode, size, modification and
//! change times) to its sha256. It lives in `$WANBAKE_CACHE_DIR`, else
//! `$XDG_CACHE_HOME/wanbake`, else `~/.cache/wanbake` (sub-folder `input-sha256/`, one small
//! file per entry), and is off with `--no-hash-cache` ([`configure_cache`]). Limits: a
//! file rewritten in place with the same size, modification time *and* change time would
//! be taken for unchanged; the change time cannot be set by a user process (only moved
//! forward by the kernel on every write or attribute change), so this needs root resetting
//! the clock. Entries are written atomically (temp + rename) and an unreadable or malformed
//! entry is ignored, so a damaged cache costs a re-hash, never a wrong hash. `verify` never
//! uses the cache: it re-reads everything.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::digest::sha256_stream;
use super::file::ReadError;
use super::mmap::{FileStamp, describe_change};

/// Where the cache is, or that it is off; set once by the front end.
static CACHE: OnceLock<Option<PathBuf>> = OnceLock::new();

/// Whether inputs' hashes are cached, and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HashCache {
    /// The default folder (module doc).
    Default,
    /// This folder.
    At(PathBuf),
    /// No cache: every input is hashed.
    Off,
}

/// Chooses the cache for this process. Only the first call counts (the CLI makes it
/// before any work); without a call, the default folder is used.
pub fn configure_cache(choice: HashCache) {
    let dir = match choice {
        HashCache::Default => default_cache_dir(),
        HashCache::At(p) => Some(p),
        HashCache::Off => None,
    };
    let _ = CACHE.set(dir);
}

fn cache_dir() -> Option<&'static Path> {
    CACHE.get_or_init(default_cache_dir).as_deref()
}

fn default_cache_dir() -> Option<PathBuf> {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(d) = env("WANBAKE_CACHE_DIR") {
        return Some(d);
    }
    if let Some(d) = env("XDG_CACHE_HOME") {
        return Some(d.join("wanbake"));
    }
    env("HOME").map(|h| h.join(".cache").join("wanbake"))
}

fn entry_path(dir: &Path, s: &FileStamp) -> PathBuf {
    dir.join("input-sha256").join(format!(
        "{}-{}-{}-{}-{}",
        s.dev, s.ino, s.size, s.mtime_ns, s.ctime_ns
    ))
}

fn cached(s: &FileStamp) -> Option<String> {
    let text = std::fs::read_to_string(entry_path(cache_dir()?, s)).ok()?;
    let sha = text.trim();
    (sha.len() == 64 && sha.bytes().all(|b| b.is_ascii_hexdigit())).then(|| sha.to_string())
}

/// Best effort: a cache that cannot be written only costs a later re-hash. Written by the
/// one single-file writer (`durable::replace_file`: temporary, fsync, rename).
fn remember(s: &FileStamp, sha: &str) {
    let Some(dir) = cache_dir() else { return };
    let path = entry_path(dir, s);
    let Some(parent) = path.parent() else { return };
    if std::fs::create_dir_all(parent).is_err() {
        return;
    }
    let _ = super::durable::replace_file(&path, sha.as_bytes());
}

/// Asked before each read of an input being hashed, with the bytes read so far and the
/// file's size; it may block, to hold the hasher near the reader that needs the same pages
/// (`release`). [`NO_PACE`] never blocks.
pub type Pace<'a> = &'a dyn Fn(u64, u64);

/// A [`Pace`] that never waits.
pub const NO_PACE: Pace<'static> = &|_, _| {};

/// Size and sha256 of the input file at `path` (from the cache when its identity is known),
/// read in 4 MiB chunks (`on_bytes` hears of each, `pace` is asked before each). Fails when
/// the file changes while it is read.
pub fn sha256_input(
    path: &Path,
    on_bytes: &dyn Fn(u64),
    pace: Pace<'_>,
) -> Result<(u64, String), ReadError> {
    let file = std::fs::File::open(path).map_err(|e| ReadError::io(path, e))?;
    let before = FileStamp::of(&file.metadata().map_err(|e| ReadError::io(path, e))?);
    if let Some(sha) = cached(&before) {
        on_bytes(before.size);
        return Ok((before.size, sha));
    }
    let mut paced = PacedRead {
        file,
        read: 0,
        size: before.size,
        pace,
    };
    let (total, sha) = sha256_stream(&mut paced, path, on_bytes)?;
    let after = FileStamp::at(path).map_err(|e| ReadError::io(path, e))?;
    let read = FileStamp {
        size: total,
        ..before
    };
    if let Some(what) =
        describe_change(&before, &after, false).or_else(|| describe_change(&before, &read, false))
    {
        return Err(ReadError::Changed {
            path: path.to_path_buf(),
            what,
        });
    }
    remember(&before, &sha);
    Ok((total, sha))
}

/// Records `sha` as the content of the file whose identity is now `stamp` (when the cache is
/// on): a file whose change time moved without its bytes changing, as a hard link moves it
/// (`release::carry`, which checked the bytes stayed), is then not hashed again next time.
pub fn remember_unchanged(stamp: &FileStamp, sha: &str) {
    remember(stamp, sha);
}

/// The input file, with its [`Pace`] asked before every read.
struct PacedRead<'a> {
    file: std::fs::File,
    read: u64,
    size: u64,
    pace: Pace<'a>,
}

impl std::io::Read for PacedRead<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        (self.pace)(self.read, self.size);
        let n = self.file.read(buf)?;
        self.read += n as u64;
        Ok(n)
    }
}
