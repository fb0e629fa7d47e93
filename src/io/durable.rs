//! Durable single-file writes: a file written and fsynced, or replaced atomically (temporary
//! sibling, fsync, rename, folder fsync). A leaf: it knows paths and bytes only.
//!
//! Owns: the temporary-name mark every wanbake temporary carries ([`TMP_MARK`]), and the two
//! writes. Does not own: release folders (`staging`), what is written (its callers: the
//! input-hash cache, the SVD cache, the runner's outputs, signatures).

use std::fs::File;
use std::path::{Path, PathBuf};

/// Marks every temporary wanbake creates next to a destination (`.NAME.wanbake-tmp-…`), so
/// a later run recognises and removes what a killed one left.
pub const TMP_MARK: &str = ".wanbake-tmp-";

/// A durable write that failed: the path and the OS error.
#[derive(Debug, thiserror::Error)]
#[error("{}", path.display())]
pub struct DurableError {
    /// The file or folder.
    pub path: PathBuf,
    /// The OS error.
    #[source]
    pub source: std::io::Error,
}

fn at(path: &Path) -> impl FnOnce(std::io::Error) -> DurableError + '_ {
    move |source| DurableError {
        path: path.to_path_buf(),
        source,
    }
}

/// The folder holding `p` (`.` for a bare name).
pub fn parent_dir(p: &Path) -> PathBuf {
    match p.parent() {
        Some(x) if !x.as_os_str().is_empty() => x.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Creates (or truncates) `path`, writes `bytes` and fsyncs it.
pub fn write_file(path: &Path, bytes: &[u8]) -> Result<(), DurableError> {
    use std::io::Write;
    let mut f = File::create(path).map_err(at(path))?;
    f.write_all(bytes).map_err(at(path))?;
    f.sync_all().map_err(at(path))
}

/// Replaces `path` atomically with `bytes` (temp file + fsync + rename + parent fsync); on
/// failure the temporary is removed and `path` is untouched.
pub fn replace_file(path: &Path, bytes: &[u8]) -> Result<(), DurableError> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    // Unique per process and call, so threads replacing the same file never share a temporary.
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = parent_dir(path).join(format!(".{name}{TMP_MARK}{}-{n}", std::process::id()));
    let result = write_file(&tmp, bytes)
        .and_then(|()| std::fs::rename(&tmp, path).map_err(at(path)))
        .and_then(|()| {
            let parent = parent_dir(path);
            File::open(&parent)
                .and_then(|d| d.sync_all())
                .map_err(at(&parent))
        });
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}
