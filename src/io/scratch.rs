//! Unnamed scratch safetensors files: where an input that is not plain safetensors (an Orbax
//! item, a quantized checkpoint) is decoded once so the rest of wanbake reads it through the
//! same borrowed `TensorView`s as any base.
//!
//! Owns: writing a canonical `HeaderLayout` and each tensor's bytes, streamed by the caller,
//! into an unnamed file in `$TMPDIR` (`O_TMPFILE`, or created and unlinked at once where that
//! is not available: nothing is left behind even when the process is killed), its whole size
//! reserved before a byte is decoded (a `$TMPDIR` without room is refused at once), checking that
//! every tensor got exactly its bytes, and the per-process cache that maps a second open of
//! the same input onto the same file instead of decoding it again. Does not own: what is
//! decoded (`io::orbax`, `quant::base`).

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::file::ReadError;
use super::mmap::FileStamp;
use crate::format::header::TensorInfo;
use crate::format::header_layout::HeaderLayout;

/// What a scratch file was decoded from: the input's path (absolute), its identity when
/// decoded (a rewritten input is decoded again) and whatever else changes the decoding.
pub type ScratchKey = (PathBuf, FileStamp, String);

/// Scratch files this process decoded. They live, unnamed, until the process exits.
static DECODED: Mutex<Vec<(ScratchKey, std::fs::File)>> = Mutex::new(Vec::new());

/// The key of `input` as it is now, with `extra` (anything else the decoding depends on).
pub fn key_of(input: &Path, extra: &str) -> Result<ScratchKey, ReadError> {
    let stamp = FileStamp::at(input).map_err(|e| ReadError::io(input, e))?;
    let abs = std::path::absolute(input).unwrap_or_else(|_| input.to_path_buf());
    Ok((abs, stamp, extra.to_string()))
}

/// The scratch file of `key`, made by `make` the first time it is asked for in this process.
pub fn decoded_once(
    key: ScratchKey,
    make: impl FnOnce() -> Result<std::fs::File, ReadError>,
) -> Result<std::fs::File, ReadError> {
    let mut cache = DECODED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some((_, file)) = cache.iter().find(|(k, _)| *k == key) {
        return file.try_clone().map_err(|e| ReadError::io(&key.0, e));
    }
    let file = make()?;
    let copy = file.try_clone().map_err(|e| ReadError::io(&key.0, e))?;
    cache.push((key, file));
    Ok(copy)
}

/// Writes `layout`'s header, then each tensor in data order through `fill` (which returns
/// the number of bytes it wrote), into a new unnamed file; `label` names it in messages.
/// A tensor that `fill` writes short or long is an error naming it.
pub fn write(
    layout: &HeaderLayout,
    label: &Path,
    mut fill: impl FnMut(&TensorInfo, &mut dyn Write) -> Result<u64, ReadError>,
) -> Result<std::fs::File, ReadError> {
    let tmp = std::env::temp_dir();
    let io = |e| ReadError::io(label, e);
    let file = tempfile::tempfile_in(&tmp).map_err(|e| ReadError::io(&tmp, e))?;
    reserve(&file, layout, &tmp, label)?;
    let mut w = BufWriter::with_capacity(8 << 20, &file);
    w.write_all(&layout.prefix).map_err(io)?;
    for info in &layout.tensors {
        let written = fill(info, &mut w)?;
        let want = (info.end - info.begin) as u64;
        if written != want {
            return Err(ReadError::Tensor {
                path: label.to_path_buf(),
                tensor: info.name.clone(),
                reason: format!("decoded to {written} bytes, expected {want}"),
            });
        }
    }
    w.flush().map_err(io)?;
    drop(w);
    Ok(file)
}

/// The name a scratch file carries in messages and in the map registry (it has none on
/// disk): outside every input, so the inputs-unchanged check never looks for it, and free
/// of process ids, so nothing derived from it varies between runs.
pub fn label(kind: &str, input: &Path) -> PathBuf {
    let name = input
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    std::env::temp_dir().join(format!("wanbake-{kind}-scratch-{name}.safetensors"))
}

/// Allocates the whole scratch file before a byte is decoded, so a temporary directory too
/// small for the decoded input is refused at once, naming what it needs, instead of failing
/// (or filling the disk) part way.
fn reserve(
    file: &std::fs::File,
    layout: &HeaderLayout,
    tmp: &Path,
    label: &Path,
) -> Result<(), ReadError> {
    // The tensors' offsets are absolute: the last end is the file's length.
    let end = layout.tensors.iter().map(|t| t.end).max().unwrap_or(0);
    let len = end.max(layout.prefix.len()) as u64;
    if len == 0 {
        return Ok(());
    }
    match rustix::fs::fallocate(file, rustix::fs::FallocateFlags::empty(), 0, len) {
        Ok(()) => Ok(()),
        Err(e) if e == rustix::io::Errno::OPNOTSUPP || e == rustix::io::Errno::NOSYS => Ok(()),
        Err(e) if e == rustix::io::Errno::NOSPC || e == rustix::io::Errno::FBIG => {
            let free = rustix::fs::statvfs(tmp)
                .map(|st| st.f_bavail.saturating_mul(st.f_frsize).to_string())
                .unwrap_or_else(|_| "an unknown number of".into());
            Err(ReadError::Unsupported {
                path: tmp.to_path_buf(),
                reason: format!(
                    "decoding {} needs {len} bytes of scratch space here, but {free} bytes \
                     are free (set TMPDIR to a file system with room)",
                    label.file_name().unwrap_or_default().to_string_lossy()
                ),
            })
        }
        Err(e) => Err(ReadError::io(tmp, e.into())),
    }
}
