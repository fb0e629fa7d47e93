//! The Orbax output of a plan (`--to orbax`): MaxDiffusion's pretrained cache, an Orbax
//! CheckpointManager root with step `0` (spec/orbax.md section 4).
//!
//! Owns: [`OrbaxPlan`] (per item its arrays and chunk grids, and the files known before any
//! tensor: `_METADATA`, `wan_config/metadata`, `_CHECKPOINT_METADATA`), the job → chunk map
//! (each job of the plan fills exactly one zarr chunk: a stacked `nnx-scanned` array is
//! chunked (1, …), a layer per chunk, any other array is one chunk; tensorstore restores any
//! regular chunk grid), [`ChunkWriter`] (each job's bytes, front to back, streamed through
//! one zstd frame (`encode::ChunkEncoder`) into a staged late file of its own, named by its
//! sha256, or kept for the leaf when the frame is at most 1024 bytes, Orbax's inline limit),
//! and [`ChunkWriter::finish`] (each item's OCDBT B+tree and manifest, written last, when
//! every chunk's place is known). So the bytes never depend on the order jobs finish in, and
//! a worker holds one band and one zstd stream, never a whole tensor.
//!
//! Does not own: the tree's names, shapes and dtypes (the `nnx` / `nnx-scanned` layouts and
//! MaxDiffusion's keep-f32 rule, `layout`), MaxDiffusion's item names and `wan_config`
//! (`model::maxdiffusion`), the encodings (`io::orbax::encode`), the staged output
//! (`release::staging`).

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use super::error::PipelineError;
use super::job::Job;
use crate::format::header_layout::PlannedTensor;
use crate::format::orbax::encode::{
    self, ChunkEncoder, EncodeError, ItemDb, Located, MAX_INLINE_VALUE_BYTES, MetadataLeaf,
};
use crate::io::DType;
use crate::model::maxdiffusion;
use crate::release::ordered::lock;
use crate::release::staging::WriteError;
use crate::release::staging::{LateFile, LateName, Staging};
use crate::release::writer::AuxFile;

/// One array of an item.
#[derive(Clone, Debug, PartialEq, Eq)]
struct ArrayPlan {
    /// Dot-joined tree path (the zarr array's name in the database).
    name: String,
    shape: Vec<u64>,
    dtype: DType,
    /// Chunk shape: the whole array, or (1, …) for a layer-stacked one.
    chunk: Vec<u64>,
}

/// One item (`0/wan_state`, …) and its arrays.
#[derive(Clone, Debug, PartialEq, Eq)]
struct ItemPlan {
    /// Item folder relative to the output root.
    dir: String,
    arrays: Vec<ArrayPlan>,
}

/// Where a job's bytes go: item, database key of its chunk, decoded length.
#[derive(Clone, Debug, PartialEq, Eq)]
struct ChunkAt {
    item: usize,
    key: String,
    len: u64,
}

/// (component, output tensor, byte offset): what names a job's chunk.
type JobKey = (usize, String, usize);

fn job_key(job: &Job) -> JobKey {
    (job.component, job.output.clone(), job.dst_offset)
}

/// An Orbax output: the items, their arrays, and each job's chunk.
#[derive(Clone, Debug, Default)]
pub struct OrbaxPlan {
    items: Vec<ItemPlan>,
    chunks: HashMap<JobKey, ChunkAt>,
}

/// One base component as an item: its item name, its output tensors and its jobs.
pub struct ItemInput<'a> {
    /// Item name (`maxdiffusion::state_items`).
    pub item: &'static str,
    /// Every output tensor (MaxDiffusion's tree path, dot-joined; shape; dtype).
    pub tensors: &'a [PlannedTensor],
    /// The component's jobs.
    pub jobs: &'a [Job],
}

impl OrbaxPlan {
    /// Plans the items and every job's chunk, and returns the files known before any
    /// tensor is written (`_METADATA` per item, the step's `_CHECKPOINT_METADATA`, and
    /// `wan_config/metadata` holding `wan_config`).
    pub fn new(
        inputs: &[ItemInput<'_>],
        wan_config: &serde_json::Value,
    ) -> Result<(OrbaxPlan, Vec<AuxFile>), PipelineError> {
        let mut plan = OrbaxPlan::default();
        let mut aux = Vec::new();
        for (i, input) in inputs.iter().enumerate() {
            let dir = format!("{}/{}", maxdiffusion::STEP, input.item);
            let arrays = plan.add_item(i, input)?;
            let leaves: Vec<MetadataLeaf> = (arrays.iter())
                .map(|a| MetadataLeaf {
                    keys: a.name.split('.').map(str::to_string).collect(),
                    shape: a.shape.clone(),
                })
                .collect();
            aux.push(AuxFile {
                rel_path: PathBuf::from(format!("{dir}/_METADATA")),
                bytes: encode::encode_tree_metadata(&leaves),
            });
            plan.items.push(ItemPlan { dir, arrays });
        }
        // JsonCheckpointHandler: `path.write_text(json.dumps(x))`.
        let config = encode::py_json(wan_config).into_bytes();
        aux.push(AuxFile {
            rel_path: PathBuf::from(format!(
                "{}/{}/metadata",
                maxdiffusion::STEP,
                maxdiffusion::CONFIG_ITEM
            )),
            bytes: config,
        });
        let handlers: serde_json::Map<String, serde_json::Value> = (inputs.iter())
            .map(|i| (i.item.to_string(), encode::STANDARD_HANDLER.into()))
            .chain([(
                maxdiffusion::CONFIG_ITEM.to_string(),
                maxdiffusion::JSON_HANDLER.into(),
            )])
            .collect();
        aux.push(AuxFile {
            rel_path: PathBuf::from(format!("{}/_CHECKPOINT_METADATA", maxdiffusion::STEP)),
            bytes: encode::encode_checkpoint_metadata(
                &serde_json::Value::Object(handlers),
                &serde_json::Map::new(),
            ),
        });
        Ok((plan, aux))
    }

    /// The arrays of item `item`, each job's chunk recorded.
    fn add_item(
        &mut self,
        item: usize,
        input: &ItemInput<'_>,
    ) -> Result<Vec<ArrayPlan>, PipelineError> {
        let mut by_output: BTreeMap<&str, Vec<&Job>> = BTreeMap::new();
        for j in input.jobs {
            by_output.entry(j.output.as_str()).or_default().push(j);
        }
        let mut arrays = Vec::new();
        for t in input.tensors {
            let mut jobs = by_output.remove(t.name.as_str()).unwrap_or_default();
            jobs.sort_by_key(|j| j.dst_offset);
            let chunk = chunk_shape(t, &jobs)?;
            let chunk_len = chunk.iter().product::<u64>() * dtype_size(t)?;
            for j in jobs {
                let index = j.dst_offset as u64 / chunk_len.max(1);
                let key = match chunk.len() {
                    0 => "0".to_string(),
                    rank => std::iter::once(index.to_string())
                        .chain(std::iter::repeat_n("0".to_string(), rank - 1))
                        .collect::<Vec<_>>()
                        .join("."),
                };
                let at = ChunkAt {
                    item,
                    key: format!("{}/{key}", t.name),
                    len: chunk_len,
                };
                self.chunks.insert(job_key(j), at);
            }
            arrays.push(ArrayPlan {
                name: t.name.clone(),
                shape: t.shape.iter().map(|&d| d as u64).collect(),
                dtype: t.dtype,
                chunk,
            });
        }
        if let Some(name) = by_output.keys().next() {
            return Err(PipelineError::Internal(format!(
                "a job writes `{name}`, which is not an output tensor"
            )));
        }
        Ok(arrays)
    }

    /// Bytes of every array before compression.
    pub fn array_bytes(&self) -> u64 {
        (self.items.iter().flat_map(|i| &i.arrays))
            .map(|a| a.shape.iter().product::<u64>() * a.dtype.bits() as u64 / 8)
            .sum()
    }

    /// Arrays in every item.
    pub fn array_count(&self) -> usize {
        self.items.iter().map(|i| i.arrays.len()).sum()
    }
}

fn dtype_size(t: &PlannedTensor) -> Result<u64, PipelineError> {
    (t.dtype.size().map(|s| s as u64)).ok_or_else(|| {
        PipelineError::Internal(format!("`{}`: {} has no byte size", t.name, t.dtype))
    })
}

/// The chunk shape of `t` written by `jobs` (sorted by offset): the whole array for one job
/// writing all of it, (1, …) for one job per layer of the leading axis.
fn chunk_shape(t: &PlannedTensor, jobs: &[&Job]) -> Result<Vec<u64>, PipelineError> {
    let shape: Vec<u64> = t.shape.iter().map(|&d| d as u64).collect();
    let size = dtype_size(t)?;
    let job_bytes = |j: &Job| j.stored_shape.iter().product::<usize>() as u64 * size;
    let total = shape.iter().product::<u64>() * size;
    if let [j] = jobs
        && j.dst_offset == 0
        && job_bytes(j) == total
    {
        return Ok(shape);
    }
    let layers = shape.first().copied().unwrap_or(0);
    let layer = total / layers.max(1);
    let per_layer = jobs.len() as u64 == layers
        && (jobs.iter().enumerate())
            .all(|(l, j)| j.dst_offset as u64 == l as u64 * layer && job_bytes(j) == layer);
    if !per_layer {
        return Err(PipelineError::Internal(format!(
            "`{}`: its {} jobs do not fill it whole or a layer each",
            t.name,
            jobs.len()
        )));
    }
    let mut chunk = shape;
    chunk[0] = 1;
    Ok(chunk)
}

/// A compressed chunk being written: in memory while it fits a leaf, then in a late file.
struct Spill<'s> {
    staging: &'s Staging,
    mem: Vec<u8>,
    file: Option<LateFile<'s>>,
}

impl Write for Spill<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        if let Some(f) = &mut self.file {
            return f.write(bytes);
        }
        self.mem.extend_from_slice(bytes);
        if self.mem.len() > MAX_INLINE_VALUE_BYTES {
            let mut f = (self.staging.late_file()).map_err(std::io::Error::other)?;
            f.write_all(&self.mem)?;
            self.mem = Vec::new();
            self.file = Some(f);
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match &mut self.file {
            Some(f) => f.flush(),
            None => Ok(()),
        }
    }
}

/// A job's chunk while it runs.
struct Open<'s> {
    encoder: ChunkEncoder<Spill<'s>>,
    at: ChunkAt,
    /// Bytes fed so far (writes come front to back).
    fed: u64,
    /// sha256 of the bytes fed (the chunk's values, before compression).
    values: sha2::Sha256,
}

/// Streams every job's bytes into its chunk, then writes each item's database.
pub struct ChunkWriter<'s> {
    plan: &'s OrbaxPlan,
    staging: &'s Staging,
    open: Mutex<HashMap<JobKey, Arc<Mutex<Open<'s>>>>>,
    /// Finished chunks: item, key, place, sha256 of the values.
    done: Mutex<Vec<(usize, String, Located, String)>>,
}

impl<'s> ChunkWriter<'s> {
    /// A writer of `plan`'s chunks into `staging`.
    pub fn new(plan: &'s OrbaxPlan, staging: &'s Staging) -> ChunkWriter<'s> {
        ChunkWriter {
            plan,
            staging,
            open: Mutex::default(),
            done: Mutex::default(),
        }
    }

    fn io_error(&self, job: &Job, source: std::io::Error) -> PipelineError {
        PipelineError::Write {
            tensor: job.output.clone(),
            source: Box::new(WriteError::Io {
                path: self.staging.tmp_dir().to_path_buf(),
                source,
            }),
        }
    }

    /// Opens `job`'s chunk (before the job writes).
    pub fn start(&self, job: &Job) -> Result<(), PipelineError> {
        let at = (self.plan.chunks.get(&job_key(job)).cloned()).ok_or_else(|| {
            PipelineError::Internal(format!("`{}`: a job with no chunk", job.output))
        })?;
        let spill = Spill {
            staging: self.staging,
            mem: Vec::new(),
            file: None,
        };
        let encoder = ChunkEncoder::new(spill, at.len).map_err(|e| self.io_error(job, e))?;
        let open = Open {
            encoder,
            at,
            fed: 0,
            values: sha2::Digest::new(),
        };
        lock(&self.open).insert(job_key(job), Arc::new(Mutex::new(open)));
        Ok(())
    }

    /// Feeds `bytes`, at byte `offset` of `job`'s output piece, to its chunk.
    pub fn write(&self, job: &Job, offset: usize, bytes: &[u8]) -> Result<(), PipelineError> {
        let open = (lock(&self.open).get(&job_key(job)).cloned())
            .ok_or_else(|| PipelineError::Internal(format!("`{}`: no open chunk", job.output)))?;
        let mut open = lock(&open);
        if offset as u64 != open.fed || open.fed + bytes.len() as u64 > open.at.len {
            return Err(PipelineError::Internal(format!(
                "`{}`: a write of {} bytes at {offset}, {} of {} fed: a chunk is written front to back",
                job.output,
                bytes.len(),
                open.fed,
                open.at.len
            )));
        }
        (open.encoder.write_all(bytes)).map_err(|e| self.io_error(job, e))?;
        open.fed += bytes.len() as u64;
        sha2::Digest::update(&mut open.values, bytes);
        Ok(())
    }

    /// Ends `job`'s chunk: the frame is finished and its place (inline, or its late file,
    /// named by content) recorded.
    pub fn end(&self, job: &Job) -> Result<(), PipelineError> {
        let open = lock(&self.open).remove(&job_key(job));
        let open = open
            .and_then(Arc::into_inner)
            .and_then(|o| o.into_inner().ok())
            .ok_or_else(|| PipelineError::Internal(format!("`{}`: chunk not open", job.output)))?;
        if open.fed != open.at.len {
            return Err(PipelineError::Internal(format!(
                "`{}`: {} of the chunk's {} bytes written",
                job.output, open.fed, open.at.len
            )));
        }
        let spill = (open.encoder.finish()).map_err(|e| self.io_error(job, e))?;
        let located = match spill.file {
            None => Located::Inline(spill.mem),
            Some(f) => {
                let dir = PathBuf::from(&self.plan.items[open.at.item].dir).join(encode::DATA_DIR);
                let (rel, length) = self
                    .staging
                    .finish_late(f, LateName::ByDigest(dir))
                    .map_err(|e| PipelineError::Write {
                        tensor: job.output.clone(),
                        source: Box::new(e),
                    })?;
                let name = rel.file_name().map(|n| n.to_string_lossy().into_owned());
                Located::InFile {
                    file: format!("{}{}", encode::DATA_DIR, name.unwrap_or_default()),
                    offset: 0,
                    length,
                }
            }
        };
        let values = crate::io::digest::hex(&sha2::Digest::finalize(open.values));
        lock(&self.done).push((open.at.item, open.at.key, located, values));
        Ok(())
    }

    /// Writes each item's database (every chunk must be done): the `.zarray` of every
    /// array and every chunk's place go into one B+tree, whose nodes file and
    /// `manifest.ocdbt` are written last. Returns, for the manifest's report, each item's
    /// chunks by key with the sha256 of their values (C-order bytes before compression).
    pub fn finish(self) -> Result<serde_json::Value, PipelineError> {
        let done = std::mem::take(&mut *lock(&self.done));
        let mut dbs: Vec<ItemDb> = self.plan.items.iter().map(|_| ItemDb::default()).collect();
        let encode_err = |item: &ItemPlan| {
            let item = item.dir.clone();
            move |source: EncodeError| PipelineError::OrbaxEncode { item, source }
        };
        let mut digests: BTreeMap<&str, BTreeMap<String, String>> = BTreeMap::new();
        for (item, key, located, values) in done {
            let plan = &self.plan.items[item];
            dbs[item].put(&key, located).map_err(encode_err(plan))?;
            digests
                .entry(plan.dir.as_str())
                .or_default()
                .insert(key, values);
        }
        for (item, db) in self.plan.items.iter().zip(&mut dbs) {
            for a in &item.arrays {
                let zarray = encode::encode_zarray(&a.shape, a.dtype, &a.chunk);
                let zarray = zarray.map_err(encode_err(item))?;
                let key = format!("{}/.zarray", a.name);
                db.put(&key, Located::Inline(zarray))
                    .map_err(encode_err(item))?;
            }
        }
        let expected: usize = (self.plan.items.iter())
            .flat_map(|i| &i.arrays)
            .map(|a| 1 + grid_len(a))
            .sum();
        let keys: usize = dbs.iter().map(ItemDb::len).sum();
        if keys != expected {
            return Err(PipelineError::Internal(format!(
                "{keys} database keys written, {expected} planned"
            )));
        }
        for (item, db) in self.plan.items.iter().zip(dbs) {
            let tail = db.finish();
            let dir = PathBuf::from(&item.dir);
            self.write_whole(dir.join(&tail.node_file), &tail.nodes)?;
            self.write_whole(dir.join("manifest.ocdbt"), &tail.manifest)?;
        }
        Ok(serde_json::json!({ "chunk_sha256": digests }))
    }

    fn write_whole(&self, rel: PathBuf, bytes: &[u8]) -> Result<(), PipelineError> {
        let err = |e: WriteError| PipelineError::Write {
            tensor: rel.display().to_string(),
            source: Box::new(e),
        };
        let mut f = self.staging.late_file().map_err(err)?;
        f.write_all(bytes).map_err(|source| {
            err(WriteError::Io {
                path: self.staging.tmp_dir().join(&rel),
                source,
            })
        })?;
        self.staging
            .finish_late(f, LateName::Fixed(rel.clone()))
            .map_err(err)?;
        Ok(())
    }
}

/// Chunks in `a`'s grid.
fn grid_len(a: &ArrayPlan) -> usize {
    (a.shape.iter().zip(&a.chunk))
        .map(|(&s, &c)| s.div_ceil(c.max(1)) as usize)
        .product()
}
