//! Dtype conversion of any safetensors checkpoint, mirroring its naming (single file,
//! shards + index, model folder, pipeline folder), as a release with a manifest.
//!
//! Owns: `ConvertSpec`, `convert_release`, and `stream_convert`, the chunked, bounded-memory
//! copy-or-convert of one tensor into an output slot that every producing command uses for
//! tensors it does not compute on (a tensor whose dtype does not change is copied byte for
//! byte; otherwise it is widened to f32 and rounded once with round-to-nearest-even).

use std::collections::BTreeMap;
use std::path::PathBuf;

use rayon::prelude::*;

use crate::io::checkpoint::Checkpoint;
use crate::io::header_layout::PlannedTensor;
use crate::io::staging::{Allocation, Replace, Staging, WriteError};
use crate::io::writer::{AuxFile, ComponentOutput, OutputPlan, Slot};
use crate::io::{DType, TensorRef, dtype};
use crate::release::{Release, ReleaseError, ReleaseRequest, write_release};

/// Elements converted per chunk: bounds memory per worker to a few MiB.
pub const CHUNK_ELEMS: usize = 1 << 20;

/// Which dtype each float tensor gets.
#[derive(Clone, Debug)]
pub struct DtypeChoice {
    /// Target dtype for float tensors (`None` keeps each tensor's own dtype).
    pub target: Option<DType>,
    /// Tensors (by name) that stay F32 whatever the target.
    pub keep_f32: fn(&str) -> bool,
}

impl DtypeChoice {
    /// The output dtype of a tensor stored as `dtype` under `name`.
    pub fn output_dtype(&self, name: &str, dtype: DType) -> DType {
        match self.target {
            Some(_) if !dtype.is_float() => dtype,
            Some(_) if (self.keep_f32)(name) => DType::F32,
            Some(t) => t,
            None => dtype,
        }
    }
}

/// Copies (same dtype) or converts (widen + one RNE) `src` into `slot`, in chunks.
pub fn stream_convert(
    staging: &Staging,
    slot: Slot,
    src: &TensorRef<'_>,
    out: DType,
) -> Result<(), WriteError> {
    let v = src.view;
    if v.dtype == out {
        for (i, chunk) in v.bytes.chunks(CHUNK_ELEMS * 4).enumerate() {
            staging.write(slot, i * CHUNK_ELEMS * 4, chunk)?;
        }
        src.file.release(src.position);
        return Ok(());
    }
    let (isz, osz) = match (v.dtype.size(), out.size()) {
        (Some(a), Some(b)) if v.dtype.is_float() && out.is_output_float() => (a, b),
        _ => {
            return Err(WriteError::Io {
                path: PathBuf::from(v.name),
                source: std::io::Error::other(format!("cannot convert {} to {out}", v.dtype)),
            });
        }
    };
    let n = v.numel();
    let mut wide = vec![0f32; CHUNK_ELEMS.min(n)];
    let mut narrow = vec![0u8; wide.len() * osz];
    let mut done = 0;
    while done < n {
        let k = CHUNK_ELEMS.min(n - done);
        let bytes = &v.bytes[done * isz..(done + k) * isz];
        // Both conversions are infallible here: dtypes were checked above.
        let _ = dtype::widen_to_f32(v.dtype, bytes, &mut wide[..k]);
        let _ = dtype::narrow_from_f32(out, &wide[..k], &mut narrow[..k * osz]);
        staging.write(slot, done * osz, &narrow[..k * osz])?;
        done += k;
    }
    src.file.release(src.position);
    Ok(())
}

/// A conversion request.
#[derive(Clone, Debug)]
pub struct ConvertSpec {
    /// Input checkpoint.
    pub input: PathBuf,
    /// Output directory.
    pub out: PathBuf,
    /// Dtypes.
    pub dtypes: DtypeChoice,
    /// Shard size (None: mirror nothing, one file per component).
    pub shard_bytes: Option<u64>,
    /// Replace an existing output.
    pub replace: Replace,
}

/// Converts a whole checkpoint into a new release.
pub fn convert_release(spec: &ConvertSpec) -> Result<Release, ReleaseError> {
    let ck = Checkpoint::open(&spec.input).map_err(|e| ReleaseError::Produce(e.into()))?;
    let components: Vec<ComponentOutput> = ck
        .components
        .iter()
        .map(|c| ComponentOutput {
            rel_dir: c.rel_dir.clone(),
            stem: c.weights_stem.clone(),
            tensors: c
                .tensors
                .tensors()
                .map(|t| PlannedTensor {
                    name: t.view.name.to_string(),
                    dtype: spec.dtypes.output_dtype(t.view.name, t.view.dtype),
                    shape: t.view.shape.to_vec(),
                })
                .collect(),
            metadata: c.tensors.metadata(),
            sidecars: c
                .sidecars
                .iter()
                .map(|s| (s.name.clone(), s.text.clone().into_bytes()))
                .collect(),
            max_shard_bytes: spec.shard_bytes,
        })
        .collect();
    let root: Vec<AuxFile> = ck
        .root_files
        .iter()
        .map(|s| AuxFile {
            rel_path: PathBuf::from(&s.name),
            bytes: s.text.clone().into_bytes(),
        })
        .collect();
    let plan =
        OutputPlan::build(&components, &root).map_err(|e| ReleaseError::Produce(e.into()))?;
    let input_files = ck.input_files();
    let hash_while_writing = input_files
        .iter()
        .map(|p| ("input".to_string(), p.clone(), p.display().to_string()))
        .collect();
    let options = serde_json::json!({
        "input": spec.input.display().to_string(),
        "dtype": spec.dtypes.target.map(|d| d.as_str()),
        "shard_bytes": spec.shard_bytes,
    });
    let req = ReleaseRequest {
        dest: &spec.out,
        plan,
        input_paths: std::slice::from_ref(&spec.input),
        inputs: Vec::new(),
        hash_while_writing,
        command: "convert",
        options,
        replace: spec.replace,
        allocation: Allocation::Reserve,
    };
    write_release(req, |staging| {
        let jobs: Vec<(usize, &str, Slot)> = staging.plan().slots().collect();
        let mut converted = BTreeMap::<String, usize>::new();
        jobs.par_iter()
            .try_for_each(|&(ci, name, slot)| -> anyhow::Result<()> {
                let t = ck.components[ci]
                    .tensors
                    .get(name)
                    .ok_or_else(|| anyhow::anyhow!("internal: planned tensor `{name}` vanished"))?;
                let out = staging.plan().files[slot.file].layout.tensors[slot.tensor].dtype;
                stream_convert(staging, slot, &t, out)?;
                Ok(())
            })?;
        for (ci, name, slot) in &jobs {
            let from = ck.components[*ci].tensors.get(name).map(|t| t.view.dtype);
            let to = staging.plan().files[slot.file].layout.tensors[slot.tensor].dtype;
            if from != Some(to) {
                *converted
                    .entry(format!("{}->{}", from.map_or("?", |d| d.as_str()), to))
                    .or_default() += 1;
            }
        }
        Ok(serde_json::json!({ "tensors": jobs.len(), "converted": converted }))
    })
}

/// Keeps nothing in f32 (the default for a generic conversion).
pub fn keep_none(_: &str) -> bool {
    false
}
