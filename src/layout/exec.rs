//! Running a conversion: stored tensors in, output tensor bytes out, one slice at a time.
//!
//! Owns: `Conversion` (a read plan, a write plan and the output dtypes fused into jobs, one
//! per piece: stored tensor, layer, one composed transform, destination byte offset), the
//! two small traits it runs against (`StoredTensors`: borrowed stored tensors;
//! `TensorSink`: positional writes into pre-laid-out output tensors), `MemorySink`, and the
//! parallel executor. Does not own: files, headers, atomic commit (`io`).
//!
//! Memory: each worker converts a band of at most `ExecOptions::band_bytes` destination
//! bytes into its own buffer and hands it to the sink at its final offset, so a stacked
//! output is filled layer by layer in place (no (L, ...) buffer, no O(L²) copies) and the
//! peak is one band per worker. Output bytes do not depend on the thread count or the
//! order in which jobs run: every byte is written exactly once, by a pure function of the
//! input.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use rayon::prelude::*;

use super::dtype_policy::{KeepF32, OutputDType, decide_dtypes};
use super::write::WritePlan;
use crate::io::header_layout::PlannedTensor;
use crate::io::{DType, SafetensorsFile, TensorView};
use crate::model::plan_error::PlanError;
use crate::model::read_plan::ReadPlan;
use crate::model::transform::{self, KernelError, SrcTensor, Transform};
use crate::model::wan_layout::Layout;

/// Where stored tensors come from.
pub trait StoredTensors: Sync {
    /// The stored tensor `name`, borrowed (no copy), or `None` when absent.
    fn tensor(&self, name: &str) -> Option<TensorView<'_>>;

    /// Called after a job has read `bytes` (a byte range of `name`'s data: the whole
    /// tensor, or one layer of a stacked one), so a mapped file can drop those pages from
    /// the resident set. Dropping more (the whole tensor) is allowed: a later read refaults
    /// the pages from the page cache.
    fn release(&self, _name: &str, _bytes: Range<usize>) {}
}

/// A boxed error from a sink.
pub type SinkError = Box<dyn std::error::Error + Send + Sync>;

/// Where output bytes go: positional writes into output tensors whose names, dtypes and
/// shapes were fixed beforehand (`Conversion::planned_tensors`).
pub trait TensorSink: Sync {
    /// Writes `bytes` at `byte_offset` from the start of output tensor `tensor`'s data.
    fn write_at(&self, tensor: &str, byte_offset: usize, bytes: &[u8]) -> Result<(), SinkError>;
}

impl StoredTensors for SafetensorsFile {
    fn tensor(&self, name: &str) -> Option<TensorView<'_>> {
        self.view(name)
    }

    fn release(&self, name: &str, _bytes: Range<usize>) {
        // SafetensorsFile releases whole tensors only.
        if let Some(i) = self.position(name) {
            SafetensorsFile::release(self, i);
        }
    }
}

/// Tuning of the executor; none of it changes the output bytes.
#[derive(Clone, Debug)]
pub struct ExecOptions {
    /// Largest destination band a worker converts at once.
    pub band_bytes: usize,
    /// Worker threads (`None`: rayon's global pool).
    pub threads: Option<usize>,
}

impl Default for ExecOptions {
    fn default() -> Self {
        ExecOptions {
            band_bytes: PIECE_BAND_BYTES,
            threads: None,
        }
    }
}

/// Destination bytes a copy or conversion handles at once, per worker, unless tuned
/// ([`ExecOptions::band_bytes`]); the output does not depend on it.
pub const PIECE_BAND_BYTES: usize = 8 << 20;

/// Writes `transform(src)` converted to `dtype` (raw byte moves when the dtypes are equal,
/// else widened and rounded once), band by band, through `write(byte offset in the piece,
/// bytes)`: the one copy-or-convert loop of every producing command (`restack`, `convert`,
/// the untouched tensors of `merge`). At most `band_bytes` (at least one destination row)
/// are held in `buf` at a time; an identity transform is treated as one flat run, so a
/// large 1-D tensor is banded too, and an identity copy in the same dtype (any dtype,
/// packed sub-byte ones included) is written straight from `src` without `buf`. The output
/// bytes do not depend on `band_bytes`.
pub fn convert_piece<E>(
    transform: Transform,
    src: SrcTensor<'_>,
    dtype: DType,
    band_bytes: usize,
    buf: &mut Vec<u8>,
    mut write: impl FnMut(usize, &[u8]) -> Result<(), E>,
    kernel_err: impl Fn(KernelError) -> E,
) -> Result<(), E> {
    let band_bytes = band_bytes.max(1);
    if transform == Transform::Identity && src.dtype == dtype {
        for (i, chunk) in src.bytes.chunks(band_bytes).enumerate() {
            write(i * band_bytes, chunk)?;
        }
        return Ok(());
    }
    let numel: usize = src.shape.iter().product();
    let flat = [numel, 1];
    let src = match transform {
        Transform::Identity => SrcTensor {
            shape: &flat,
            ..src
        },
        _ => src,
    };
    let dst_size = dtype
        .size()
        .ok_or_else(|| kernel_err(KernelError::SubByte(dtype)))?;
    let (rows, row_len) = transform
        .dst_rows(src.shape)
        .map_err(|e| kernel_err(e.into()))?;
    let row_bytes = (row_len * dst_size).max(1);
    let band_rows = (band_bytes / row_bytes).max(1);
    let mut r0 = 0;
    while r0 < rows {
        let r1 = (r0 + band_rows).min(rows);
        buf.resize((r1 - r0) * row_len * dst_size, 0);
        transform::convert_rows(transform, src, dtype, r0..r1, buf).map_err(&kernel_err)?;
        write(r0 * row_len * dst_size, buf)?;
        r0 = r1;
    }
    Ok(())
}

/// One piece of work: a stored tensor (or one layer of it) into its place in an output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestackJob {
    /// Index of the output tensor in the write plan.
    pub output: usize,
    /// Canonical parameter moved.
    pub canonical: String,
    /// Stored tensor read.
    pub stored: String,
    /// Layer of the stored tensor, when stacked.
    pub layer: Option<usize>,
    /// Shape of the stored data (the layer's slice when stacked).
    pub stored_shape: Vec<usize>,
    /// Stored dtype.
    pub src_dtype: DType,
    /// Stored layout → output layout, composed.
    pub transform: Transform,
    /// Byte offset of the piece inside the output tensor.
    pub dst_offset: usize,
}

/// A fully planned conversion.
#[derive(Clone, Debug)]
pub struct Conversion {
    /// Where each canonical parameter comes from.
    pub read: ReadPlan,
    /// Where each one goes.
    pub write: WritePlan,
    /// Dtype of each output tensor (same order as `write.tensors`).
    pub dtypes: Vec<DType>,
    /// The jobs, grouped by stored tensor (in the order the read plan first needs each),
    /// layers in order: a stacked input is consumed one tensor at a time.
    pub jobs: Vec<RestackJob>,
}

/// What an execution did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExecReport {
    /// Jobs run.
    pub jobs: usize,
    /// Bytes handed to the sink.
    pub bytes_written: u64,
}

/// Why an execution stopped.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// A planned stored tensor is absent from the source.
    #[error("tensor `{0}` is in the plan but not in the source")]
    Missing(String),
    /// The source's tensor differs from the one planned for.
    #[error("tensor `{name}`: planned as {expected}, source has {found}")]
    Changed {
        /// The stored tensor.
        name: String,
        /// dtype and shape planned.
        expected: String,
        /// dtype and shape found.
        found: String,
    },
    /// The kernel refused the data.
    #[error("tensor `{name}`: {source}")]
    Kernel {
        /// The stored tensor.
        name: String,
        /// Why.
        #[source]
        source: KernelError,
    },
    /// The sink failed.
    #[error("writing `{tensor}`: {source}")]
    Sink {
        /// The output tensor.
        tensor: String,
        /// Why.
        #[source]
        source: SinkError,
    },
    /// The worker pool could not start.
    #[error("cannot start {threads} worker threads: {reason}")]
    Threads {
        /// Threads asked for.
        threads: usize,
        /// Why.
        reason: String,
    },
}

impl Conversion {
    /// Plans converting everything `read` found into `to`, with dtypes from `target` and
    /// `policy`.
    pub fn new(
        read: ReadPlan,
        to: Layout,
        target: OutputDType,
        policy: &KeepF32,
    ) -> Result<Conversion, PlanError> {
        let write = WritePlan::new(to, &read.canonical_params())?;
        let dtypes = decide_dtypes(&write, &read, target, policy)?;
        let mut placed: HashMap<&str, (usize, &super::write::Piece)> = HashMap::new();
        for (i, t) in write.tensors.iter().enumerate() {
            for p in &t.pieces {
                placed.insert(p.canonical.as_str(), (i, p));
            }
        }
        let mut jobs = Vec::with_capacity(read.params.len());
        for src in &read.params {
            let Some(&(output, piece)) = placed.get(src.name.as_str()) else {
                continue; // unreachable: the write plan was built from these parameters
            };
            let transform = src
                .to_canonical
                .then(piece.from_canonical, src.shape.len())
                .map_err(|e| PlanError::Rank {
                    key: src.stored.clone(),
                    reason: e.to_string(),
                })?;
            let size = dtypes[output].size().ok_or_else(|| PlanError::NonFloat {
                key: write.tensors[output].name.clone(),
                dtype: dtypes[output],
            })?;
            jobs.push(RestackJob {
                output,
                canonical: src.name.clone(),
                stored: src.stored.clone(),
                layer: src.layer,
                stored_shape: src.stored_shape.clone(),
                src_dtype: src.dtype,
                transform,
                dst_offset: piece.offset * size,
            });
        }
        let mut first_use: HashMap<String, usize> = HashMap::new();
        for (i, j) in jobs.iter().enumerate() {
            first_use.entry(j.stored.clone()).or_insert(i);
        }
        jobs.sort_by_key(|j| (first_use[&j.stored], j.layer));
        Ok(Conversion {
            read,
            write,
            dtypes,
            jobs,
        })
    }

    /// The output tensors as a writer lays them out (name, dtype, shape).
    pub fn planned_tensors(&self) -> Vec<PlannedTensor> {
        self.write
            .tensors
            .iter()
            .zip(&self.dtypes)
            .map(|(t, &dtype)| PlannedTensor {
                name: t.name.clone(),
                dtype,
                shape: t.shape.clone(),
            })
            .collect()
    }

    /// Runs every job: reads from `source`, writes every output byte exactly once to `sink`.
    pub fn execute(
        &self,
        source: &dyn StoredTensors,
        sink: &dyn TensorSink,
        options: &ExecOptions,
    ) -> Result<ExecReport, ExecError> {
        self.check_source(source)?;
        let written = AtomicUsize::new(0);
        let run = || {
            self.jobs
                .par_iter()
                .try_for_each_init(Vec::new, |buf, job| {
                    let (n, read) = self.run_job(job, source, sink, options.band_bytes, buf)?;
                    written.fetch_add(n, Ordering::Relaxed);
                    source.release(&job.stored, read);
                    Ok(())
                })
        };
        match options.threads {
            None => run()?,
            Some(threads) => rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .map_err(|e| ExecError::Threads {
                    threads,
                    reason: e.to_string(),
                })?
                .install(run)?,
        }
        Ok(ExecReport {
            jobs: self.jobs.len(),
            bytes_written: written.into_inner() as u64,
        })
    }

    /// Every planned stored tensor is present with the planned dtype and shape.
    fn check_source(&self, source: &dyn StoredTensors) -> Result<(), ExecError> {
        for j in &self.jobs {
            let view = source
                .tensor(&j.stored)
                .ok_or_else(|| ExecError::Missing(j.stored.clone()))?;
            let mut want = j.stored_shape.clone();
            if j.layer.is_some() {
                want.insert(0, self.read.config.num_layers);
            }
            if view.dtype != j.src_dtype || view.shape != want.as_slice() {
                return Err(ExecError::Changed {
                    name: j.stored.clone(),
                    expected: format!("{} {want:?}", j.src_dtype),
                    found: format!("{} {:?}", view.dtype, view.shape),
                });
            }
        }
        Ok(())
    }

    fn run_job(
        &self,
        job: &RestackJob,
        source: &dyn StoredTensors,
        sink: &dyn TensorSink,
        band_bytes: usize,
        buf: &mut Vec<u8>,
    ) -> Result<(usize, Range<usize>), ExecError> {
        let kernel_err = |source| ExecError::Kernel {
            name: job.stored.clone(),
            source,
        };
        let view = source
            .tensor(&job.stored)
            .ok_or_else(|| ExecError::Missing(job.stored.clone()))?;
        let src_size = job
            .src_dtype
            .size()
            .ok_or(kernel_err(KernelError::SubByte(job.src_dtype)))?;
        let numel: usize = job.stored_shape.iter().product();
        let slice = numel * src_size;
        let start = job.layer.unwrap_or(0) * slice;
        let src = SrcTensor {
            dtype: job.src_dtype,
            shape: &job.stored_shape,
            bytes: &view.bytes[start..start + slice],
        };
        let out = &self.write.tensors[job.output];
        let dtype = self.dtypes[job.output];
        let dst_size = dtype
            .size()
            .ok_or(kernel_err(KernelError::SubByte(dtype)))?;
        let written = |offset: usize, bytes: &[u8]| {
            sink.write_at(&out.name, job.dst_offset + offset, bytes)
                .map_err(|source| ExecError::Sink {
                    tensor: out.name.clone(),
                    source,
                })
        };
        convert_piece(
            job.transform,
            src,
            dtype,
            band_bytes,
            buf,
            written,
            kernel_err,
        )?;
        Ok((numel * dst_size, start..start + slice))
    }
}

/// A sink that keeps every output tensor in memory (tests, tiny models, in-process use).
#[derive(Debug)]
pub struct MemorySink {
    tensors: Mutex<BTreeMap<String, Vec<u8>>>,
}

impl MemorySink {
    /// Zero-filled buffers for every tensor of `conversion`.
    pub fn for_conversion(conversion: &Conversion) -> MemorySink {
        let tensors = conversion
            .planned_tensors()
            .into_iter()
            .map(|t| {
                let n = t.nbytes().unwrap_or(0);
                (t.name, vec![0u8; n])
            })
            .collect();
        MemorySink {
            tensors: Mutex::new(tensors),
        }
    }

    /// The written tensors, by name.
    pub fn into_tensors(self) -> BTreeMap<String, Vec<u8>> {
        self.tensors.into_inner().unwrap_or_else(|e| e.into_inner())
    }
}

impl TensorSink for MemorySink {
    fn write_at(&self, tensor: &str, byte_offset: usize, bytes: &[u8]) -> Result<(), SinkError> {
        let mut map = self.tensors.lock().unwrap_or_else(|e| e.into_inner());
        let data = map
            .get_mut(tensor)
            .ok_or_else(|| format!("no output tensor `{tensor}`"))?;
        let end = byte_offset
            .checked_add(bytes.len())
            .filter(|&e| e <= data.len())
            .ok_or_else(|| {
                format!(
                    "write of {} bytes at {byte_offset} overruns `{tensor}` ({} bytes)",
                    bytes.len(),
                    data.len()
                )
            })?;
        data[byte_offset..end].copy_from_slice(bytes);
        Ok(())
    }
}
