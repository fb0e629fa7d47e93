//! Writing the runner's results: f32 tensors to one safetensors file, atomically.
//!
//! Owns: `write_f32_file`, which lays the header out with `format::header_layout::HeaderLayout`
//! (canonical, sorted, deterministic) and writes the file through the one durable writer
//! (`release::staging::replace_file_durable`: temporary sibling, fsync, rename, folder fsync), so
//! a reader never sees a half-written file and a failure leaves nothing behind.

use std::collections::BTreeMap;
use std::path::Path;

use super::error::RunError;
use super::tensor::Tensor;
use crate::format::header_layout::{HeaderLayout, PlannedTensor};
use crate::io::DType;

/// Writes `tensors` as F32 with `metadata` to `path` (temp sibling, fsync, rename).
pub fn write_f32_file(
    path: &Path,
    tensors: &[(&str, &Tensor)],
    metadata: &BTreeMap<String, String>,
) -> Result<(), RunError> {
    let planned: Vec<PlannedTensor> = tensors
        .iter()
        .map(|(name, t)| PlannedTensor {
            name: name.to_string(),
            dtype: DType::F32,
            shape: t.shape.clone(),
        })
        .collect();
    let layout = HeaderLayout::build(&planned, metadata).map_err(|e| RunError::Write {
        path: path.to_path_buf(),
        source: Box::new(e),
    })?;
    let by_name: BTreeMap<&str, &Tensor> = tensors.iter().copied().collect();
    let mut bytes = layout.prefix.clone();
    bytes.reserve(layout.data_len);
    for info in &layout.tensors {
        let t = by_name[info.name.as_str()];
        for v in &t.data {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
    }
    debug_assert_eq!(bytes.len(), layout.file_len());
    crate::release::staging::replace_file_durable(path, &bytes).map_err(|e| RunError::Write {
        path: path.to_path_buf(),
        source: Box::new(e),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_file_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.safetensors");
        let t = Tensor::new(vec![2, 1], vec![1.5, -2.0]);
        let mut meta = BTreeMap::new();
        meta.insert("k".to_string(), "v".to_string());
        write_f32_file(&path, &[("noise_pred", &t)], &meta).unwrap();
        let f = crate::io::SafetensorsFile::open(&path).unwrap();
        assert_eq!(f.read_f32("noise_pred").unwrap(), vec![1.5, -2.0]);
        assert_eq!(f.metadata().get("k").map(String::as_str), Some("v"));
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "no temp file left"
        );
    }
}
