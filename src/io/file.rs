//! One safetensors file on disk: opened read-only, mapped, validated, and viewed by tensor.
//!
//! Owns: `SafetensorsFile` (path + map + validated header), `TensorView` (a borrowed,
//! never-copied tensor), pickle refusal by name and by magic bytes, and `ReadError`, the
//! error type of everything that reads inputs. Does not own: multi-file checkpoints
//! (`io::checkpoint`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::dtype::{self, DType};
use super::mmap::{self, ReadOnlyMap};
use crate::format::header::{FormatError, Header, TensorInfo};

/// File extensions of pickle-based formats, refused before the file is even opened.
pub const PICKLE_EXTENSIONS: &[&str] = &["bin", "pt", "pth", "ckpt", "pkl", "pickle"];

/// Why an input could not be read. Every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The OS refused (missing file, permissions, ...).
    #[error("{}", path.display())]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The bytes break the safetensors format.
    #[error("{}: not a valid safetensors file", path.display())]
    Format {
        /// The file.
        path: PathBuf,
        /// The rule that failed.
        #[source]
        source: FormatError,
    },
    /// A pickle-based file (by extension or content).
    #[error(
        "{}: refusing to read {what}: loading pickle can run arbitrary code, so wanbake never does.\n\
         hint: convert it to safetensors in a sandbox, e.g. \
         `python -c \"import torch,safetensors.torch as s; s.save_file(torch.load('IN', weights_only=True), 'OUT.safetensors')\"`, \
         then pass the .safetensors file",
        path.display()
    )]
    Pickle {
        /// The file.
        path: PathBuf,
        /// What gave it away.
        what: String,
    },
    /// Not a format wanbake reads.
    #[error("{}: {reason}", path.display())]
    Unsupported {
        /// The file or folder.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A sharded checkpoint's index is inconsistent with its shards.
    #[error("{}: {reason}", path.display())]
    Index {
        /// The index file.
        path: PathBuf,
        /// What does not match.
        reason: String,
    },
    /// The file changed (shrank, grew or was rewritten) while wanbake read it.
    #[error(
        "{}: {what}; nothing was written. Run again once nothing else writes to it",
        path.display()
    )]
    Changed {
        /// The file.
        path: PathBuf,
        /// How it changed.
        what: String,
    },
    /// An Orbax checkpoint could not be read (the error names the file and the key).
    #[error(transparent)]
    Orbax(#[from] crate::format::orbax::OrbaxError),
    /// A tensor a quantized format marks that wanbake does not decode (or that breaks the
    /// format): refused, never read as raw codes.
    #[error("{}: tensor `{tensor}`: {format}: {reason}", path.display())]
    Quantized {
        /// The file.
        path: PathBuf,
        /// The tensor (or header key).
        tensor: String,
        /// The format, as far as it could be told.
        format: String,
        /// What was found.
        reason: String,
    },
    /// A tensor's data could not be converted.
    #[error("{}: tensor `{tensor}`: {reason}", path.display())]
    Tensor {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Why.
        reason: String,
    },
}

impl ReadError {
    /// Wraps an OS error with the path it concerns.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> ReadError {
        ReadError::Io {
            path: path.into(),
            source,
        }
    }
}

/// A tensor borrowed from a mapped file; nothing is copied until asked.
#[derive(Clone, Copy, Debug)]
pub struct TensorView<'a> {
    /// Tensor name.
    pub name: &'a str,
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: &'a [usize],
    /// Raw little-endian bytes.
    pub bytes: &'a [u8],
}

impl TensorView<'_> {
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Widens the data to a fresh `f32` vector (F64/F32/F16/BF16/F8).
    pub fn to_f32(&self) -> Result<Vec<f32>, dtype::UnsupportedDType> {
        dtype::to_f32_vec(self.dtype, self.bytes)
    }

    /// Widens into a caller-owned buffer of exactly `numel` elements.
    pub fn widen_into(&self, out: &mut [f32]) -> Result<(), dtype::UnsupportedDType> {
        dtype::widen_to_f32(self.dtype, self.bytes, out)
    }
}

/// A validated, memory-mapped safetensors file.
pub struct SafetensorsFile {
    path: PathBuf,
    map: ReadOnlyMap,
    header: Header,
    by_name: HashMap<String, usize>,
}

impl std::fmt::Debug for SafetensorsFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SafetensorsFile")
            .field("path", &self.path)
            .field("tensors", &self.header.tensors.len())
            .finish()
    }
}

impl SafetensorsFile {
    /// Opens, maps and fully validates `path`. Pickle files are refused by extension before
    /// opening and by magic bytes when the content is not safetensors.
    pub fn open(path: &Path) -> Result<SafetensorsFile, ReadError> {
        refuse_by_name(path)?;
        let file = std::fs::File::open(path).map_err(|e| ReadError::io(path, e))?;
        SafetensorsFile::from_file(&file, path)
    }

    /// Maps and fully validates an already open file, named `path` in messages (an input
    /// decoded into an unnamed scratch file is opened this way: `io::orbax`).
    pub fn from_file(file: &std::fs::File, path: &Path) -> Result<SafetensorsFile, ReadError> {
        let meta = file.metadata().map_err(|e| ReadError::io(path, e))?;
        if meta.is_dir() {
            return Err(ReadError::Unsupported {
                path: path.to_path_buf(),
                reason: "is a directory, expected a .safetensors file".into(),
            });
        }
        let map = mmap::map_readonly(file, path).map_err(|e| ReadError::io(path, e))?;
        let header = match Header::parse(map.bytes()) {
            Ok(h) => h,
            Err(source) => {
                if let Some(what) = sniff_pickle(map.bytes()) {
                    return Err(ReadError::Pickle {
                        path: path.to_path_buf(),
                        what: what.to_string(),
                    });
                }
                return Err(ReadError::Format {
                    path: path.to_path_buf(),
                    source,
                });
            }
        };
        let by_name = header
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(SafetensorsFile {
            path: path.to_path_buf(),
            map,
            header,
            by_name,
        })
    }

    /// The file's path as given.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The validated header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// `__metadata__`.
    pub fn metadata(&self) -> &std::collections::BTreeMap<String, String> {
        &self.header.metadata
    }

    /// Tensor infos in data order.
    pub fn infos(&self) -> &[TensorInfo] {
        &self.header.tensors
    }

    /// Total file length in bytes.
    pub fn len(&self) -> usize {
        self.map.bytes().len()
    }

    /// True for a file with no bytes (never valid; kept for clippy's sake).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The whole mapped file.
    pub fn bytes(&self) -> &[u8] {
        self.map.bytes()
    }

    /// Index of a tensor in `infos()`.
    pub fn position(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }

    /// A view of the tensor at `infos()[i]`.
    pub fn view_at(&self, i: usize) -> TensorView<'_> {
        let t = &self.header.tensors[i];
        let start = self.header.data_start + t.begin;
        let end = self.header.data_start + t.end;
        TensorView {
            name: &t.name,
            dtype: t.dtype,
            shape: &t.shape,
            bytes: &self.map.bytes()[start..end],
        }
    }

    /// A view of the named tensor.
    pub fn view(&self, name: &str) -> Option<TensorView<'_>> {
        self.position(name).map(|i| self.view_at(i))
    }

    /// Widens the named tensor to f32, with an error naming file and tensor.
    pub fn read_f32(&self, name: &str) -> Result<Vec<f32>, ReadError> {
        let v = self.view(name).ok_or_else(|| ReadError::Tensor {
            path: self.path.clone(),
            tensor: name.to_string(),
            reason: "no such tensor".into(),
        })?;
        v.to_f32().map_err(|e| ReadError::Tensor {
            path: self.path.clone(),
            tensor: name.to_string(),
            reason: e.to_string(),
        })
    }

    /// Drops the pages of tensor `i` from this process's resident set (see
    /// [`ReadOnlyMap::release_range`]).
    pub fn release(&self, i: usize) {
        let t = &self.header.tensors[i];
        self.map.release_range(
            self.header.data_start + t.begin,
            self.header.data_start + t.end,
        );
    }

    /// Drops the pages of the absolute file range `[begin, end)` from this process's
    /// resident set (whole pages inside the range only), for consumers that walk one large
    /// tensor in chunks.
    pub fn release_bytes(&self, begin: usize, end: usize) {
        self.map.release_range(begin, end);
    }

    /// Hints that tensor `i` will be read soon.
    pub fn prefetch(&self, i: usize) {
        let t = &self.header.tensors[i];
        self.map.will_need(
            self.header.data_start + t.begin,
            self.header.data_start + t.end,
        );
    }
}

/// Refuses pickle-based formats by file name.
pub fn refuse_by_name(path: &Path) -> Result<(), ReadError> {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(|e| e.to_ascii_lowercase());
    if let Some(ext) = ext.as_deref()
        && PICKLE_EXTENSIONS.contains(&ext)
    {
        return Err(ReadError::Pickle {
            path: path.to_path_buf(),
            what: format!("a `.{ext}` file (a pickle-based PyTorch format)"),
        });
    }
    Ok(())
}

/// Recognises zip archives (torch.save since 1.6, also .npz) and raw pickle streams.
/// Only consulted once the bytes failed to parse as safetensors, because a valid header
/// length can begin with the same bytes.
pub fn sniff_pickle(bytes: &[u8]) -> Option<&'static str> {
    match bytes {
        [b'P', b'K', 3, 4, ..] | [b'P', b'K', 5, 6, ..] => {
            Some("a zip archive (torch.save / .npz format, which holds pickled objects)")
        }
        [0x80, 2..=5, ..] => Some("a pickle stream (torch.save legacy format)"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pickle_names_are_refused_case_insensitively() {
        for n in ["a.bin", "a.PT", "x/y.pth", "m.ckpt", "m.pkl"] {
            assert!(
                matches!(refuse_by_name(Path::new(n)), Err(ReadError::Pickle { .. })),
                "{n}"
            );
        }
        assert!(refuse_by_name(Path::new("a.safetensors")).is_ok());
    }

    #[test]
    fn magic_bytes() {
        assert!(sniff_pickle(b"PK\x03\x04rest").is_some());
        assert!(sniff_pickle(&[0x80, 0x02, 0x8a, 0x0a]).is_some());
        assert!(sniff_pickle(b"\x10\x00\x00\x00\x00\x00\x00\x00{}").is_none());
    }
}
