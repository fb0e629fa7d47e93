//! GGUF files as inputs and outputs on disk: finding the one `.gguf` a path names, mapping and
//! validating it (`GgufFile`), and hashing one in a sequential pass for a manifest.
//!
//! Owns: [`single_gguf_in`], [`GgufFile`], the manifest's view of a GGUF tensor and
//! [`digest_gguf`]. Does not own: the container's bytes (`format::gguf`), what the blocks
//! decode to (`codec::ggml`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::codec::ggml::{self, GgmlType};
use crate::format::gguf::{Gguf, GgufTensor, parse, torch_shape};
use crate::io::DType;
use crate::io::digest::{self, ElementType, SafetensorsDigest, TensorDigest};
use crate::io::file::ReadError;
use crate::io::mmap::{self, ReadOnlyMap};

/// The one GGUF file `path` names: `path` itself when it ends in `.gguf`, or the only
/// `.gguf` in a folder that holds no `.safetensors` (a wanbake release); `None` otherwise.
pub fn single_gguf_in(path: &Path) -> Option<PathBuf> {
    let is = |p: &Path, ext: &str| p.extension().is_some_and(|e| e == ext);
    if is(path, "gguf") {
        return Some(path.to_path_buf());
    }
    if !path.is_dir() {
        return None;
    }
    let files: Vec<PathBuf> = fs_err::read_dir(path)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .collect();
    let mut ggufs: Vec<&PathBuf> = files.iter().filter(|p| is(p, "gguf")).collect();
    if ggufs.len() != 1 || files.iter().any(|p| is(p, "safetensors")) {
        return None;
    }
    ggufs.pop().cloned()
}

/// A validated, memory-mapped GGUF file.
pub struct GgufFile {
    path: PathBuf,
    map: ReadOnlyMap,
    header: Gguf,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .finish()
    }
}

impl GgufFile {
    /// Opens, maps and validates `path` (every tensor's data inside the file).
    pub fn open(path: &Path) -> Result<GgufFile, ReadError> {
        let file = std::fs::File::open(path).map_err(|e| ReadError::io(path, e))?;
        let map = mmap::map_readonly(&file, path).map_err(|e| ReadError::io(path, e))?;
        let header = parse(map.bytes()).map_err(|e| ReadError::Unsupported {
            path: path.to_path_buf(),
            reason: format!("not a valid GGUF file: {e}"),
        })?;
        Ok(GgufFile {
            path: path.to_path_buf(),
            map,
            header,
        })
    }

    /// The parsed header.
    pub fn header(&self) -> &Gguf {
        &self.header
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The raw data of tensor `i`.
    pub fn data(&self, i: usize) -> &[u8] {
        &self.map.bytes()[self.header.range(i)]
    }

    /// Tensor `i` decoded to f32 (dequantized as gguf-py does), in torch row-major order.
    pub fn read_f32(&self, i: usize) -> Vec<f32> {
        let t = &self.header.tensors[i];
        let mut out = vec![0f32; t.numel().unwrap_or(0) as usize];
        ggml::dequantize(t.ty, self.data(i), &mut out);
        out
    }

    /// Drops the mapped pages of tensor `i` from this process's resident set (see
    /// `io::mmap::ReadOnlyMap::release_range`), once its values have been read.
    pub fn release(&self, i: usize) {
        let r = self.header.range(i);
        self.map.release_range(r.start, r.end);
    }

    /// The file length.
    pub fn len(&self) -> usize {
        self.map.bytes().len()
    }

    /// True for an empty file (never, once parsed).
    pub fn is_empty(&self) -> bool {
        self.map.bytes().is_empty()
    }
}

/// The element type and shape a GGUF tensor is recorded with in a manifest: its ggml type
/// (F32/F16/BF16 as the dtypes of those names) and its torch shape (`ne` reversed, as the
/// loaders see it). The sha256 beside them is of the stored bytes.
pub fn manifest_type_shape(t: &GgufTensor) -> (ElementType, Vec<usize>) {
    let ty = match t.ty {
        GgmlType::F32 => ElementType::Dtype(DType::F32),
        GgmlType::F16 => ElementType::Dtype(DType::F16),
        GgmlType::BF16 => ElementType::Dtype(DType::BF16),
        block => ElementType::Ggml(block),
    };
    (ty, torch_shape(&t.ne))
}

/// Digest of a weight file wanbake writes: GGUF when the name ends in `.gguf`
/// ([`digest_gguf`]), safetensors otherwise.
pub fn digest_weight_file(
    path: &Path,
    on_bytes: &(dyn Fn(u64) + Sync),
) -> Result<SafetensorsDigest, ReadError> {
    if path.extension().is_some_and(|e| e == "gguf") {
        let d = digest_gguf(path)?;
        on_bytes(d.bytes);
        Ok(d)
    } else {
        super::digest::digest_safetensors(path, on_bytes)
    }
}

/// Validates and hashes a GGUF file and each tensor's data in one sequential pass, like
/// [`digest::digest_safetensors`]: pages are released once hashed, so memory stays bounded.
pub fn digest_gguf(path: &Path) -> Result<SafetensorsDigest, ReadError> {
    use sha2::{Digest, Sha256};
    const CHUNK: usize = 64 << 20;
    let f = GgufFile::open(path)?;
    let bytes = f.map.bytes();
    let mut whole = Sha256::new();
    let mut order: Vec<usize> = (0..f.header.tensors.len()).collect();
    order.sort_by_key(|&i| f.header.range(i).start);
    let mut hash_span = |from: usize, to: usize, mut one: Option<&mut Sha256>| {
        let mut at = from;
        while at < to {
            let end = (at + CHUNK).min(to);
            whole.update(&bytes[at..end]);
            if let Some(h) = one.as_deref_mut() {
                h.update(&bytes[at..end]);
            }
            f.map.release_range(at, end);
            at = end;
        }
    };
    let mut pos = 0usize;
    let mut tensors = BTreeMap::new();
    for i in order {
        let r = f.header.range(i);
        hash_span(pos, r.start, None);
        let mut one = Sha256::new();
        hash_span(r.start, r.end, Some(&mut one));
        pos = r.end;
        let t = &f.header.tensors[i];
        let (dtype, shape) = manifest_type_shape(t);
        tensors.insert(
            t.name.clone(),
            TensorDigest {
                dtype,
                shape,
                sha256: digest::hex(&one.finalize()),
            },
        );
    }
    hash_span(pos, bytes.len(), None);
    Ok(SafetensorsDigest {
        bytes: bytes.len() as u64,
        sha256: digest::hex(&whole.finalize()),
        tensors,
    })
}
