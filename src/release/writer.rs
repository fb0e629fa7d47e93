//! What an output directory will contain, decided before any byte is written.
//!
//! Owns: `OutputPlan` (every output file with its complete canonical header, HF-style
//! sharding and `*.safetensors.index.json`, JSON sidecars such as config.json), and the
//! lookup from (component, tensor name) to the file and slot a producer writes into, and the
//! files carried over unchanged from the input (`io::checkpoint::CarriedFile`: a pipeline's VAE, text
//! encoder, tokenizer, scheduler, model card). Does not own: the bytes on disk (`staging`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::io::checkpoint::CarriedFile;

use crate::format::gguf;
use crate::format::header_layout::{HeaderLayout, LayoutError, PlannedTensor};

/// One component (model or pipeline transformer) of an output, as the producer sees it.
#[derive(Clone, Debug)]
pub struct ComponentOutput {
    /// Folder relative to the output root (empty for the root).
    pub rel_dir: PathBuf,
    /// Stem of the weight files (`diffusion_pytorch_model`, `model`, ...).
    pub stem: String,
    /// Every tensor to write, in any order.
    pub tensors: Vec<PlannedTensor>,
    /// `__metadata__` of each weight file.
    pub metadata: BTreeMap<String, String>,
    /// JSON or text files written next to the weights (name, bytes), e.g. config.json.
    pub sidecars: Vec<(String, Vec<u8>)>,
    /// Split into shards of at most this many tensor bytes (a single tensor larger than
    /// the limit gets a shard of its own); `None` writes one file.
    pub max_shard_bytes: Option<u64>,
}

/// A weight file of the plan.
#[derive(Clone, Debug)]
pub struct PlannedFile {
    /// Path relative to the output root.
    pub rel_path: PathBuf,
    /// Its complete header and tensor offsets.
    pub layout: HeaderLayout,
    /// Index of the component it belongs to.
    pub component: usize,
    /// Its `__metadata__` (for a GGUF file: string key-value pairs added after its own).
    pub metadata: BTreeMap<String, String>,
    /// A GGUF file's own key-value pairs and tensor infos (`None` for safetensors), from
    /// which its layout is rebuilt when metadata is stamped.
    pub gguf: Option<GgufParts>,
}

/// What a GGUF file of the plan is made of: its key-value pairs and tensor infos, in file
/// order.
#[derive(Clone, Debug, PartialEq)]
pub struct GgufParts {
    /// Metadata, in file order.
    pub kv: Vec<(String, gguf::Value)>,
    /// Tensor infos, in file order.
    pub tensors: Vec<gguf::TensorPlan>,
}

impl GgufParts {
    /// The file's layout with `extra` appended as string key-value pairs (a key it already
    /// holds is replaced in place).
    fn layout(&self, extra: &BTreeMap<String, String>) -> HeaderLayout {
        let mut kv = self.kv.clone();
        for (k, v) in extra {
            let value = gguf::Value::Str(v.clone());
            match kv.iter_mut().find(|(key, _)| key == k) {
                Some(slot) => slot.1 = value,
                None => kv.push((k.clone(), value)),
            }
        }
        gguf::GgufLayout::new(&kv, &self.tensors).to_header_layout(&self.tensors)
    }
}

/// A non-weight file of the plan (index, config.json, model_index.json).
#[derive(Clone, Debug)]
pub struct AuxFile {
    /// Path relative to the output root.
    pub rel_path: PathBuf,
    /// Its bytes.
    pub bytes: Vec<u8>,
}

/// Where a tensor goes: file index and tensor index inside that file's layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    /// Index into `OutputPlan::files`.
    pub file: usize,
    /// Index into that file's `layout.tensors`.
    pub tensor: usize,
}

/// Everything an output directory will contain.
#[derive(Clone, Debug, Default)]
pub struct OutputPlan {
    /// Weight files.
    pub files: Vec<PlannedFile>,
    /// Other files.
    pub aux: Vec<AuxFile>,
    /// The expected size of the late files (`release::staging`: an Orbax output's chunks, whose
    /// sizes are known only once compressed; their size before compression, which zstd
    /// does not grow by more than a few bytes per block), for the free-space check and
    /// progress.
    pub late_bytes: u64,
    /// Files carried over unchanged from the input (not counted in `total_bytes`: a hard
    /// link takes no space; `release::staging` checks the space a copy needs).
    pub carried: Vec<CarriedFile>,
    /// Files of a pipeline input that this output's format has no place for (a quantized
    /// file, an Orbax cache: transformers only), relative to the input, for the summary.
    pub left_out: Vec<PathBuf>,
    slots: BTreeMap<(usize, String), Slot>,
}

impl OutputPlan {
    /// Lays out every component: shards, headers, index files, sidecars. Deterministic in
    /// its arguments; the tensor order inside `ComponentOutput::tensors` does not matter.
    pub fn build(
        components: &[ComponentOutput],
        root_files: &[AuxFile],
    ) -> Result<OutputPlan, LayoutError> {
        let mut plan = OutputPlan {
            aux: root_files.to_vec(),
            ..OutputPlan::default()
        };
        for (ci, c) in components.iter().enumerate() {
            plan.add_component(ci, c)?;
        }
        Ok(plan)
    }

    fn add_component(&mut self, ci: usize, c: &ComponentOutput) -> Result<(), LayoutError> {
        let mut sorted: Vec<&PlannedTensor> = c.tensors.iter().collect();
        sorted.sort_by(|a, b| a.name.cmp(&b.name));
        let shards = split_shards(&sorted, c.max_shard_bytes)?;
        let n = shards.len();
        let mut weight_map = BTreeMap::new();
        let mut total = 0u64;
        for (si, shard) in shards.iter().enumerate() {
            let name = if n == 1 {
                format!("{}.safetensors", c.stem)
            } else {
                format!("{}-{:05}-of-{:05}.safetensors", c.stem, si + 1, n)
            };
            let owned: Vec<PlannedTensor> = shard.iter().map(|t| (*t).clone()).collect();
            let layout = HeaderLayout::build(&owned, &c.metadata)?;
            let file = self.files.len();
            for (ti, t) in layout.tensors.iter().enumerate() {
                self.slots
                    .insert((ci, t.name.clone()), Slot { file, tensor: ti });
                weight_map.insert(t.name.clone(), serde_json::Value::String(name.clone()));
                total += t.nbytes() as u64;
            }
            self.files.push(PlannedFile {
                rel_path: c.rel_dir.join(&name),
                layout,
                component: ci,
                metadata: c.metadata.clone(),
                gguf: None,
            });
        }
        if n > 1 {
            let index = serde_json::json!({
                "metadata": { "total_size": total },
                "weight_map": serde_json::Value::Object(weight_map.into_iter().collect()),
            });
            let mut bytes =
                serde_json::to_vec_pretty(&index).expect("JSON values always serialise");
            bytes.push(b'\n');
            self.aux.push(AuxFile {
                rel_path: c.rel_dir.join(format!("{}.safetensors.index.json", c.stem)),
                bytes,
            });
        }
        for (name, bytes) in &c.sidecars {
            self.aux.push(AuxFile {
                rel_path: c.rel_dir.join(name),
                bytes: bytes.clone(),
            });
        }
        Ok(())
    }

    /// Adds `extra` to the `__metadata__` of every weight file (an existing key is
    /// replaced; a GGUF file gets them as string key-value pairs) and lays the headers out
    /// again. Tensor order, and so every slot, is unchanged: it depends only on the tensors.
    pub fn stamp_metadata(&mut self, extra: &BTreeMap<String, String>) -> Result<(), LayoutError> {
        for f in &mut self.files {
            f.metadata
                .extend(extra.iter().map(|(k, v)| (k.clone(), v.clone())));
            if let Some(parts) = &f.gguf {
                f.layout = parts.layout(&f.metadata);
                continue;
            }
            let tensors: Vec<PlannedTensor> = f
                .layout
                .tensors
                .iter()
                .map(|t| PlannedTensor {
                    name: t.name.clone(),
                    dtype: t.dtype,
                    shape: t.shape.clone(),
                })
                .collect();
            let layout = HeaderLayout::build(&tensors, &f.metadata)?;
            debug_assert!(
                layout
                    .tensors
                    .iter()
                    .zip(&f.layout.tensors)
                    .all(|(a, b)| a.name == b.name)
            );
            f.layout = layout;
        }
        Ok(())
    }

    /// Adds a GGUF weight file (`format::gguf`, laid out as gguf-py does): its header is
    /// written at offset 0, each tensor's raw byte range becomes a slot of component
    /// `component`, and the bytes between them stay zero. The file is digested by its
    /// extension (`gguf::digest_weight_file`).
    pub fn add_gguf_file(&mut self, component: usize, rel_path: PathBuf, parts: GgufParts) {
        let file = self.files.len();
        let layout = parts.layout(&BTreeMap::new());
        for (ti, t) in layout.tensors.iter().enumerate() {
            self.slots
                .insert((component, t.name.clone()), Slot { file, tensor: ti });
        }
        self.files.push(PlannedFile {
            rel_path,
            layout,
            component,
            metadata: BTreeMap::new(),
            gguf: Some(parts),
        });
    }

    /// The slot of tensor `name` of component `component`.
    pub fn slot(&self, component: usize, name: &str) -> Option<Slot> {
        self.slots.get(&(component, name.to_string())).copied()
    }

    /// Every slot, ordered by (component, name).
    pub fn slots(&self) -> impl Iterator<Item = (usize, &str, Slot)> {
        self.slots.iter().map(|((c, n), s)| (*c, n.as_str(), *s))
    }

    /// Total bytes of all planned files.
    pub fn total_bytes(&self) -> u64 {
        self.files
            .iter()
            .map(|f| f.layout.file_len() as u64)
            .sum::<u64>()
            + self.aux.iter().map(|a| a.bytes.len() as u64).sum::<u64>()
            + self.late_bytes
    }

    /// Bytes of all planned tensors' data (what producers write; no headers or padding).
    pub fn tensor_bytes(&self) -> u64 {
        (self.files.iter())
            .flat_map(|f| &f.layout.tensors)
            .map(|t| t.nbytes() as u64)
            .sum()
    }

    /// Number of tensors planned.
    pub fn tensor_count(&self) -> usize {
        self.slots.len()
    }
}

fn split_shards<'a>(
    sorted: &[&'a PlannedTensor],
    max: Option<u64>,
) -> Result<Vec<Vec<&'a PlannedTensor>>, LayoutError> {
    let Some(max) = max else {
        return Ok(vec![sorted.to_vec()]);
    };
    let mut shards: Vec<Vec<&PlannedTensor>> = vec![Vec::new()];
    let mut size = 0u64;
    for &t in sorted {
        let n = t.nbytes().ok_or_else(|| LayoutError::Overflow {
            name: t.name.clone(),
        })? as u64;
        let current = shards.last_mut().expect("never empty");
        if !current.is_empty() && size + n > max {
            shards.push(Vec::new());
            size = 0;
        }
        shards.last_mut().expect("never empty").push(t);
        size += n;
    }
    Ok(shards)
}

/// The root files of `ck` (a pipeline's `model_index.json`, ...) as an output carries them:
/// the same bytes under the same relative paths.
pub fn root_aux_files(ck: &crate::io::Checkpoint) -> Vec<AuxFile> {
    ck.root_files
        .iter()
        .map(|s| AuxFile {
            rel_path: PathBuf::from(&s.name),
            bytes: s.text.clone().into_bytes(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::DType;

    fn t(name: &str, n: usize) -> PlannedTensor {
        PlannedTensor {
            name: name.into(),
            dtype: DType::F32,
            shape: vec![n],
        }
    }

    #[test]
    fn shards_greedily_in_name_order_and_writes_an_index() {
        let c = ComponentOutput {
            rel_dir: "transformer".into(),
            stem: "diffusion_pytorch_model".into(),
            tensors: vec![t("c", 10), t("a", 10), t("b", 10), t("d", 100)],
            metadata: BTreeMap::new(),
            sidecars: vec![("config.json".into(), b"{}".to_vec())],
            max_shard_bytes: Some(80),
        };
        let plan = OutputPlan::build(&[c], &[]).unwrap();
        let names: Vec<String> = plan
            .files
            .iter()
            .map(|f| f.rel_path.display().to_string())
            .collect();
        assert_eq!(
            names,
            [
                "transformer/diffusion_pytorch_model-00001-of-00003.safetensors",
                "transformer/diffusion_pytorch_model-00002-of-00003.safetensors",
                "transformer/diffusion_pytorch_model-00003-of-00003.safetensors"
            ]
        );
        let idx = &plan.aux[0];
        assert_eq!(
            idx.rel_path.display().to_string(),
            "transformer/diffusion_pytorch_model.safetensors.index.json"
        );
        let v: serde_json::Value = serde_json::from_slice(&idx.bytes).unwrap();
        assert_eq!(v["metadata"]["total_size"], 520);
        assert_eq!(
            v["weight_map"]["d"],
            "diffusion_pytorch_model-00003-of-00003.safetensors"
        );
        assert_eq!(plan.slot(0, "b").unwrap().file, 0);
        assert_eq!(plan.slot(0, "c").unwrap().file, 1);
    }
}
