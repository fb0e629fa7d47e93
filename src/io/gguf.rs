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

/// The digest of a GGUF file wanbake has just written, from the digests made as it was
/// written (`written`: the whole file's, and each tensor's bytes under its name, with
/// placeholder types: `release::ordered`): the header is parsed back from the file (every
/// tensor inside it, aligned, not overlapping) and must describe exactly the tensors at the
/// byte ranges `planned` names; each tensor then gets the manifest's type and torch shape
/// ([`manifest_type_shape`]), as [`digest_gguf`] gives them from a re-read of the whole file.
pub fn digest_as_written(
    path: &Path,
    mut written: SafetensorsDigest,
    planned: &BTreeMap<&str, std::ops::Range<usize>>,
) -> Result<SafetensorsDigest, ReadError> {
    let f = GgufFile::open(path)?;
    let bad = |reason: String| ReadError::Unsupported {
        path: path.to_path_buf(),
        reason: format!("the GGUF header written does not describe the planned tensors: {reason}"),
    };
    let header = &f.header;
    if header.tensors.len() != planned.len() || written.bytes != f.map.bytes().len() as u64 {
        return Err(bad(format!(
            "{} tensors in {} bytes, {} planned in {}",
            header.tensors.len(),
            f.map.bytes().len(),
            planned.len(),
            written.bytes
        )));
    }
    for (i, t) in header.tensors.iter().enumerate() {
        if planned.get(t.name.as_str()) != Some(&header.range(i)) {
            return Err(bad(format!("`{}` at {:?}", t.name, header.range(i))));
        }
        let d = (written.tensors.get_mut(&t.name))
            .ok_or_else(|| bad(format!("`{}` was not hashed", t.name)))?;
        (d.dtype, d.shape) = manifest_type_shape(t);
    }
    Ok(written)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::gguf::GgufLayout;

    /// A GGUF file of two tensors (a Q8_0 block pair and three F32s) with seeded bytes in
    /// `dir`, and its layout.
    fn written(dir: &Path) -> (PathBuf, GgufLayout) {
        let (kv, t) = crate::format::gguf::tests::tiny();
        let l = GgufLayout::new(&kv, &t);
        let mut f = l.header.clone();
        f.resize(l.len as usize, 0);
        for (i, &(at, len)) in l.spans.iter().enumerate() {
            for (k, b) in f[at as usize..(at + len) as usize].iter_mut().enumerate() {
                *b = (k * 7 + i) as u8;
            }
        }
        let path = dir.join("m.gguf");
        std::fs::write(&path, f).unwrap();
        (path, l)
    }

    /// What `release::ordered` hands the seal: the right hashes, placeholder types.
    fn as_hashed(d: &SafetensorsDigest) -> SafetensorsDigest {
        let mut d = d.clone();
        for t in d.tensors.values_mut() {
            (t.dtype, t.shape) = (ElementType::Dtype(DType::U8), vec![1]);
        }
        d
    }

    #[test]
    fn a_digest_made_as_written_equals_the_re_read_and_a_wrong_plan_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (path, l) = written(dir.path());
        let want = digest_gguf(&path).unwrap();
        let names = ["a", "b"];
        let ranges: Vec<std::ops::Range<usize>> = (l.spans.iter())
            .map(|&(at, len)| at as usize..(at + len) as usize)
            .collect();
        let planned: BTreeMap<&str, _> = names.into_iter().zip(ranges.clone()).collect();
        let got = digest_as_written(&path, as_hashed(&want), &planned).unwrap();
        assert_eq!(got, want);
        // A tensor the header puts elsewhere, a tensor it lacks, a file of another length.
        let mut moved = planned.clone();
        moved.insert("b", ranges[1].start + 32..ranges[1].end + 32);
        let mut missing = planned.clone();
        missing.remove("b");
        let mut longer = as_hashed(&want);
        longer.bytes += 1;
        for (digest, plan) in [
            (as_hashed(&want), moved),
            (as_hashed(&want), missing),
            (longer, planned),
        ] {
            let e = digest_as_written(&path, digest, &plan)
                .unwrap_err()
                .to_string();
            assert!(e.contains("does not describe the planned tensors"), "{e}");
        }
    }
}
