//! sha256 digests of files and of the tensors inside safetensors files.
//!
//! Owns: `sha256_file` (streaming, bounded memory), `digest_safetensors` (one sequential pass
//! that hashes the whole file and every tensor's bytes), and hex encoding. Used by the
//! manifest writer and by `verify`, so both compute hashes the same way.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

use sha2::{Digest, Sha256};

use super::dtype::DType;
use super::file::{ReadError, SafetensorsFile};
use crate::codec::ggml::GgmlType;

/// Lower-case hex of a digest.
pub fn hex(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        s.push(HEX[(b >> 4) as usize] as char);
        s.push(HEX[(b & 15) as usize] as char);
    }
    s
}

/// sha256 of a byte slice, as hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// Size and sha256 of a file, read in 4 MiB chunks (memory does not grow with file size).
pub fn sha256_file(path: &Path) -> Result<(u64, String), ReadError> {
    let mut f = std::fs::File::open(path).map_err(|e| ReadError::io(path, e))?;
    sha256_stream(&mut f, path, &|_| {})
}

/// Length and sha256 of everything `r` yields, read in 4 MiB chunks (`on_bytes` hears of
/// each); `path` names the source in errors.
pub fn sha256_stream(
    r: &mut dyn Read,
    path: &Path,
    on_bytes: &dyn Fn(u64),
) -> Result<(u64, String), ReadError> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 4 << 20];
    let mut total = 0u64;
    loop {
        let n = r.read(&mut buf).map_err(|e| ReadError::io(path, e))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        total += n as u64;
        on_bytes(n as u64);
    }
    Ok((total, hex(&h.finalize())))
}

/// What a manifest says a tensor's elements are: a safetensors dtype, or the ggml block
/// type of a GGUF tensor (`Q8_0`, ...; GGUF's F32/F16/BF16 are the dtypes of those names).
/// Written as the bare name either way.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(untagged)]
pub enum ElementType {
    /// A safetensors dtype.
    Dtype(DType),
    /// A ggml block type.
    Ggml(GgmlType),
}

impl std::fmt::Display for ElementType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ElementType::Dtype(d) => f.write_str(d.as_str()),
            ElementType::Ggml(t) => f.write_str(t.name()),
        }
    }
}

/// Digest of one tensor.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TensorDigest {
    /// Element type.
    pub dtype: ElementType,
    /// Logical shape (the torch shape; for a GGUF tensor, `ne` reversed).
    pub shape: Vec<usize>,
    /// sha256 of the tensor's bytes as stored (a GGUF block tensor: its raw blocks).
    pub sha256: String,
}

/// Digest of a safetensors file: the whole file and each tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SafetensorsDigest {
    /// File length.
    pub bytes: u64,
    /// sha256 of the whole file.
    pub sha256: String,
    /// Per-tensor digests by name.
    pub tensors: BTreeMap<String, TensorDigest>,
}

/// Validates `path` as safetensors and hashes it and each tensor in one read (`on_bytes`
/// hears of every chunk the whole-file hash is past): the whole-file
/// hash (inherently sequential) runs on one worker while the others hash the tensors, so
/// on two or more threads the pass costs one sha256 of the file, not two. Pages are
/// released from this process after hashing, so memory stays bounded.
pub fn digest_safetensors(
    path: &Path,
    on_bytes: &(dyn Fn(u64) + Sync),
) -> Result<SafetensorsDigest, ReadError> {
    use rayon::prelude::*;
    let f = SafetensorsFile::open(path)?;
    let bytes = f.bytes();
    let data_start = f.header().data_start;
    // Large tensors are hashed in chunks whose pages each side releases once it has hashed
    // them (the other side maps them again from the page cache, a minor fault), so peak RSS
    // stays at a few chunks whatever the tensor size.
    const CHUNK: usize = 64 << 20;
    let whole = || {
        let mut whole = Sha256::new();
        for (k, chunk) in bytes.chunks(CHUNK).enumerate() {
            whole.update(chunk);
            f.release_bytes(k * CHUNK, k * CHUNK + chunk.len());
            on_bytes(chunk.len() as u64);
        }
        hex(&whole.finalize())
    };
    let tensors = || {
        f.infos()
            .par_iter()
            .enumerate()
            .map(|(i, t)| {
                let data = f.view_at(i).bytes;
                let base = data_start + t.begin;
                let mut one = Sha256::new();
                for (k, chunk) in data.chunks(CHUNK).enumerate() {
                    one.update(chunk);
                    f.release_bytes(base + k * CHUNK, base + k * CHUNK + chunk.len());
                }
                let d = TensorDigest {
                    dtype: ElementType::Dtype(t.dtype),
                    shape: t.shape.clone(),
                    sha256: hex(&one.finalize()),
                };
                (t.name.clone(), d)
            })
            .collect::<BTreeMap<_, _>>()
    };
    let (sha256, tensors) = rayon::join(whole, tensors);
    Ok(SafetensorsDigest {
        bytes: bytes.len() as u64,
        sha256,
        tensors,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_answer() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            sha256_hex(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }
}
