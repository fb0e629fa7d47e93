//! The job loop of every producing command: one base tensor (or one layer of a stacked
//! one) at a time per worker, rayon across jobs; every job's own arithmetic is sequential,
//! so the bytes never depend on the thread count.
//!
//! Owns: [`Exec`] and its loop ([`Exec::run`]: untouched tensors are copied or converted
//! once here, or encoded for a quantized output; a job that reads a target goes to the
//! [`TargetWriter`] the caller plugs in, `merge::Merger` for a merge, none for `convert` and
//! `restack`), the writes into each job's slot ([`Exec::write`], [`Exec::encode_part`],
//! [`Exec::convert_bands`]; an Orbax output's job writes its chunk's zstd stream instead,
//! `pipeline::orbax::ChunkWriter`), and dropping a base tensor's mapped pages after its last
//! job (a stacked tensor's, layer by layer), and what the written values hold: each band is
//! checked as it is written, and a tensor's values its output cannot hold are refused or,
//! allowed, recorded ([`Exec::found`], `pipeline::nonfinite`). Does not own: computing a
//! target (`merge`), reading
//! base rows (`pipeline::base_rows`), the copy-and-convert kernel
//! (`layout::conversion::convert_piece`, over `model::transform`), the encodings
//! (`quant::encode`), or the atomic output (`release::staging`).
//!
//! Memory: a worker holds a band of at most [`BAND_ELEMS`] f32 values (an encoded tensor) or
//! `ExecOptions::band_bytes` destination bytes (a converted one); what a target holds beyond
//! that is the [`TargetWriter`]'s. A base tensor's mapped pages are dropped once its last job
//! is done, so the resident set does not grow with the model.
//!
//! Quantized outputs (`Job::encoding`): each band of widened f32 rows goes through
//! `encode::encode` into its slot (a band of whole rows is whole ggml blocks), with the
//! dequantized error summed in element order; an untouched scaled-fp8 weight is read twice
//! in bands (its `max|W|`, then its codes).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::base_rows::layer_bytes;
use super::error::PipelineError;
use super::job::{Job, Target};
use super::nonfinite::{Origin, UnheldValues};
use super::orbax::ChunkWriter;
use super::plan::Plan;
use crate::codec::dtype::narrow_from_f32;
use crate::codec::dtype::widen_to_f32;
use crate::codec::dtype::{Unheld, all_held};
use crate::io::{DType, SafetensorsFile, TensorRef};
use crate::layout::conversion::{PIECE_BAND_BYTES, convert_piece};
use crate::model::animate::Constant;
use crate::model::transform::{SrcTensor, Transform};
use crate::quant::encode::{self, AmaxPass, Encoding, ErrorStats, ErrorSum};
use crate::release::staging::Staging;

/// Largest band of a tensor a worker holds in one f32 buffer (1 MiB: a band, the base rows
/// it widens and the bytes it is rounded to stay in a core's L2 cache between the passes
/// over it; BENCHMARKS.md, "After the pipeline left `merge/`", band size). A constant, so
/// the band split (and with it every rounding) never depends on the machine.
pub const BAND_ELEMS: usize = 1 << 18;

/// Rows per band of a (·, inp) matrix.
pub fn band_rows(inp: usize) -> usize {
    (BAND_ELEMS / inp.max(1)).max(1)
}

/// How the jobs that read a target (`Job::target`) are computed and written: the merge
/// engine's routes (`merge::Merger`). The executor runs everything else.
pub trait TargetWriter: Sync {
    /// What a worker thread keeps from one target to the next (buffers).
    type Worker: Send;
    /// Its error; the executor's own errors convert into it.
    type Error: From<PipelineError> + Send;
    /// A new worker's state.
    fn worker(&self) -> Self::Worker;
    /// Computes `target` (read through `job` from `src`, the stored base tensor) and writes
    /// it into `job`'s slot through `exec`.
    fn write_target(
        &self,
        exec: &Exec<'_>,
        worker: &mut Self::Worker,
        job: &Job,
        target: &Target,
        src: &TensorRef<'_>,
    ) -> Result<(), Self::Error>;

    /// What a target computed once holds for every output of a release matrix that writes
    /// it (`pipeline::matrix`).
    type Shared: Send + Sync;

    /// Computes `target` once for several outputs (read through `job`, a job of any of
    /// them); `None` when this writer does not share (each output's job then computes it
    /// through [`TargetWriter::write_target`]).
    fn share(
        &self,
        worker: &mut Self::Worker,
        job: &Job,
        target: &Target,
        src: &TensorRef<'_>,
    ) -> Result<Option<Self::Shared>, Self::Error>;

    /// Writes `target`, computed once (`shared`), into `job`'s slot through `exec`: the
    /// same bytes [`TargetWriter::write_target`] writes.
    fn write_shared(
        &self,
        exec: &Exec<'_>,
        worker: &mut Self::Worker,
        job: &Job,
        target: &Target,
        src: &TensorRef<'_>,
        shared: &Self::Shared,
    ) -> Result<(), Self::Error>;
}

/// The [`TargetWriter`] of a plan that changes no tensor (`convert`, `restack`): a job that
/// reads a target is a bug.
pub struct CopyOnly;

impl TargetWriter for CopyOnly {
    type Worker = ();
    type Error = PipelineError;

    fn worker(&self) {}

    fn write_target(
        &self,
        _: &Exec<'_>,
        _: &mut (),
        job: &Job,
        _: &Target,
        _: &TensorRef<'_>,
    ) -> Result<(), PipelineError> {
        Err(PipelineError::Internal(format!(
            "`{}` reads a target, in a plan that changes no tensor",
            job.stored
        )))
    }

    type Shared = ();

    fn share(
        &self,
        _: &mut (),
        _: &Job,
        _: &Target,
        _: &TensorRef<'_>,
    ) -> Result<Option<()>, PipelineError> {
        Ok(None)
    }

    fn write_shared(
        &self,
        exec: &Exec<'_>,
        worker: &mut (),
        job: &Job,
        target: &Target,
        src: &TensorRef<'_>,
        _: &(),
    ) -> Result<(), PipelineError> {
        self.write_target(exec, worker, job, target, src)
    }
}

/// The f32 values of a target, computed in memory and never written: the tuned tensors an
/// extraction subtracts the base from (`extract --adapter`) and a bake's unmerged reference
/// runs on (`bake::reference`). `merge::Merger` computes them.
pub trait TargetValues: Sync {
    /// Its error.
    type Error: std::error::Error + Send + Sync + 'static;
    /// Target `target`'s values (read through `job`), in the stored layout of the base, as
    /// an f32 output in that layout holds them.
    fn target_values(&self, job: &Job, target: &Target) -> Result<Vec<f32>, Self::Error>;
}

/// Tuning of a run; none of it changes the output bytes.
#[derive(Clone, Debug)]
pub struct ExecOptions {
    /// Largest destination band an untouched tensor is copied or converted in.
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

impl ExecOptions {
    /// Runs `f` on a pool of `threads` workers, or on rayon's global pool.
    pub fn install<T: Send, E: From<PipelineError> + Send>(
        &self,
        f: impl FnOnce() -> Result<T, E> + Send,
    ) -> Result<T, E> {
        match self.threads {
            None => f(),
            Some(threads) => rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .map_err(|e| {
                    PipelineError::Internal(format!("cannot start {threads} worker threads: {e}"))
                })?
                .install(f),
        }
    }
}

/// What a run of the executor reports besides the bytes it wrote.
pub struct ExecOutcome {
    /// Each encoded output tensor's dequantized error (a quantized output).
    pub quant_errors: BTreeMap<String, ErrorStats>,
    /// An Orbax output's chunks' value digests (`pipeline::orbax::ChunkWriter::finish`).
    pub orbax: Option<serde_json::Value>,
    /// The values the output could not hold, written as allowed (`NonFinite::Allow`), in
    /// output tensor order; empty when there were none (or they were refused).
    pub unheld: Vec<UnheldValues>,
    /// Each scaled-fp8 output tensor's saturated values: `|W / scale| > 448`, written as
    /// ±448, the clamp the format applies by design (not an error).
    pub saturated: BTreeMap<String, usize>,
    /// CPU seconds this output's jobs took in a release matrix (`pipeline::matrix`; 0
    /// elsewhere): for a quality table, never a byte of the output.
    pub cpu_seconds: f64,
}

/// The executor of one plan writing into one staged output.
pub struct Exec<'a> {
    /// The plan.
    pub plan: &'a Plan<'a>,
    staging: &'a Staging,
    /// An Orbax output's chunks: every write of a job goes to its chunk's zstd stream.
    chunks: Option<ChunkWriter<'a>>,
    /// A quantized output's dequantized error per output tensor, filled as jobs finish.
    quant_errors: Mutex<BTreeMap<String, ErrorStats>>,
    /// Values the output cannot hold, written because the plan allows them.
    unheld: Mutex<Vec<UnheldValues>>,
    /// Saturated values per scaled-fp8 output tensor.
    saturated: Mutex<BTreeMap<String, usize>>,
    options: ExecOptions,
}

impl<'a> Exec<'a> {
    /// An executor of `plan` into `staging`.
    pub fn new(plan: &'a Plan<'a>, staging: &'a Staging, options: ExecOptions) -> Exec<'a> {
        Exec {
            plan,
            staging,
            chunks: (plan.orbax.as_ref()).map(|o| ChunkWriter::new(o, staging)),
            quant_errors: Mutex::default(),
            unheld: Mutex::default(),
            saturated: Mutex::default(),
            options,
        }
    }

    /// Runs every job, the targets through `targets`. On error the caller discards the
    /// output. Returns what it reports besides the bytes ([`ExecOutcome`]).
    pub fn run<T: TargetWriter>(self, targets: &T) -> Result<ExecOutcome, T::Error> {
        self.options.install(|| self.run_jobs(targets))?;
        Ok(self.finish()?)
    }

    /// Tuning of this run.
    pub fn options(&self) -> &ExecOptions {
        &self.options
    }

    /// The staged output this executor writes.
    pub fn staging(&self) -> &Staging {
        self.staging
    }

    /// What the run reports, once every job has run.
    pub fn finish(self) -> Result<ExecOutcome, PipelineError> {
        let orbax = match self.chunks {
            Some(chunks) => Some(chunks.finish()?),
            None => None,
        };
        let quant_errors = (self.quant_errors.into_inner())
            .map_err(|_| PipelineError::Internal("a worker panicked".into()))?;
        let mut unheld = (self.unheld.into_inner())
            .map_err(|_| PipelineError::Internal("a worker panicked".into()))?;
        // The order jobs finished in depends on the threads; the report's does not.
        unheld.sort_by(|a, b| {
            let key = |u: &UnheldValues| {
                let output = u.output.clone().unwrap_or_else(|| u.tensor.clone());
                (output, u.found.first, u.tensor.clone())
            };
            key(a).cmp(&key(b))
        });
        let saturated = (self.saturated.into_inner())
            .map_err(|_| PipelineError::Internal("a worker panicked".into()))?;
        Ok(ExecOutcome {
            quant_errors,
            orbax,
            unheld,
            saturated,
            cpu_seconds: 0.0,
        })
    }

    /// Values `job`'s output cannot hold: refused (the error of the run) unless the plan
    /// allows them, then recorded for the report and the run goes on.
    pub fn found(&self, unheld: UnheldValues) -> Result<(), PipelineError> {
        if !self.plan.options.nonfinite.allows() {
            return Err(unheld.into());
        }
        match self.unheld.lock() {
            Ok(mut v) => {
                v.push(unheld);
                Ok(())
            }
            Err(_) => Err(PipelineError::Internal("a worker panicked".into())),
        }
    }

    /// What `job` writes its values as, for a finding: the encoding of a quantized output
    /// (`gguf Q8_0`, `scaled F8_E4M3`) or the output dtype, and the plain dtype whose range
    /// the message names.
    pub fn written_as(job: &Job) -> (String, Option<crate::io::DType>) {
        use crate::codec::ggml::GgmlType;
        use crate::io::DType;
        match job.encoding {
            None => (job.dtype.to_string(), Some(job.dtype)),
            Some(Encoding::Plain(d)) => (d.to_string(), Some(d)),
            Some(Encoding::Fp8) => ("scaled F8_E4M3".into(), None),
            Some(Encoding::Layer { codec, .. }) => (codec.name().into(), None),
            Some(Encoding::Ggml { ty, .. }) => match ty {
                GgmlType::F32 => ("GGUF F32".into(), Some(DType::F32)),
                GgmlType::F16 => ("GGUF F16".into(), Some(DType::F16)),
                GgmlType::BF16 => ("GGUF BF16".into(), Some(DType::BF16)),
                _ => (format!("GGUF {} (its F16 block scale)", ty.name()), None),
            },
        }
    }

    /// A finding in a base tensor `job` reads from `src`, written untouched (copied,
    /// converted or encoded); `found.first` counts from the start of the stored data the
    /// job read (its layer of a stacked tensor), and is named in the whole stored tensor.
    fn base_finding(&self, job: &Job, src: &TensorRef<'_>, found: Unheld) -> UnheldValues {
        let (into, dtype) = Exec::written_as(job);
        let before = match job.encoding {
            None => job.layer.unwrap_or(0) * job.stored_shape.iter().product::<usize>(),
            Some(_) => 0, // an encoded tensor is read whole
        };
        UnheldValues {
            file: src.file.path().to_path_buf(),
            tensor: job.stored.clone(),
            output: (job.output != job.stored).then(|| job.output.clone()),
            into,
            dtype,
            found: Unheld {
                first: found.first + before,
                ..found
            },
            at: None,
            origin: Origin::Base,
        }
    }

    /// The job loop: untouched tensors are copied, targets go to `targets`; a base tensor's
    /// pages are dropped after its last job.
    ///
    /// Every worker of the pool takes the next job in output-file order
    /// (`Staging::for_each_in_file_order`) until none is left, so the output is written front
    /// to back through the bounded window of `release::ordered`, which hashes and writes each byte
    /// once. The order never changes a byte (each job writes its own slot range, front to
    /// back, from its own inputs).
    fn run_jobs<T: TargetWriter>(&self, targets: &T) -> Result<(), T::Error> {
        let uses = Uses::new(&self.plan.jobs);
        self.staging.for_each_in_file_order(
            &self.plan.jobs,
            |job| (job.slot, job.dst_offset),
            || targets.worker(),
            |worker, job| {
                let src = self.run_job(targets, worker, job, None)?;
                uses.done(job, src.as_ref());
                Ok(())
            },
        )
    }

    /// Runs one job (its target computed once for a matrix when `shared`); returns the
    /// stored tensor it read, for the caller to release ([`Uses::done`]).
    pub fn run_job<T: TargetWriter>(
        &self,
        targets: &T,
        worker: &mut T::Worker,
        job: &Job,
        shared: Option<&T::Shared>,
    ) -> Result<Option<TensorRef<'a>>, T::Error> {
        if let Some(constant) = job.constant {
            self.write_constant(job, constant)?;
            return Ok(None);
        }
        let src = stored(self.plan, job)?;
        if let Some(c) = &self.chunks {
            c.start(job)?;
        }
        match (job.target, shared) {
            (None, _) => self.copy(job, &src)?,
            (Some(t), None) => {
                targets.write_target(self, worker, job, &self.plan.targets[t], &src)?
            }
            (Some(t), Some(s)) => {
                targets.write_shared(self, worker, job, &self.plan.targets[t], &src, s)?
            }
        }
        if let Some(c) = &self.chunks {
            c.end(job)?;
        }
        Ok(Some(src))
    }

    /// A constant no input tensor carries (`Job::constant`), written in the job's dtype.
    fn write_constant(&self, job: &Job, constant: Constant) -> Result<(), PipelineError> {
        let values = constant.values();
        let mut bytes = vec![0u8; values.len() * job.dtype.element_bytes()];
        narrow_from_f32(job.dtype, &values, &mut bytes).map_err(|e| PipelineError::Convert {
            tensor: job.output.clone(),
            reason: e.to_string(),
        })?;
        if let Some(c) = &self.chunks {
            c.start(job)?;
        }
        self.write(job, 0, &bytes)?;
        if let Some(c) = &self.chunks {
            c.end(job)?;
        }
        Ok(())
    }

    /// Writes `bytes` at byte `offset` of `job`'s slot.
    pub fn write(&self, job: &Job, offset: usize, bytes: &[u8]) -> Result<(), PipelineError> {
        if let Some(c) = &self.chunks {
            return c.write(job, offset, bytes);
        }
        self.staging
            .write(job.slot, job.dst_offset + offset, bytes)
            .map_err(|source| PipelineError::Write {
                tensor: job.output.clone(),
                source: Box::new(source),
            })
    }

    /// An untouched tensor: copied byte for byte (same dtype) or converted once, or
    /// encoded for a quantized output.
    fn copy(&self, job: &Job, src: &TensorRef<'_>) -> Result<(), PipelineError> {
        let view = src.view;
        if let Some(enc) = job.encoding {
            return self.copy_encoded(job, enc, src);
        }
        let stored = SrcTensor {
            dtype: view.dtype,
            shape: &job.stored_shape,
            bytes: layer_bytes(&view, job.layer, &job.stored_shape)?,
        };
        match self.convert_bands(job, job.transform, stored, Some(src.file))? {
            Some(found) => self.found(self.base_finding(job, src, found)),
            None => Ok(()),
        }
    }
    /// An untouched tensor of a quantized output: widened to f32 in bands of whole rows
    /// (innermost dimension; a multiple of the encoding's `row_align` rows) and encoded band
    /// by band; a weight whose encoding has a per-tensor scale (scaled fp8, comfy fp8,
    /// NVFP4) first has its `max|W|` taken over the same bands.
    fn copy_encoded(
        &self,
        job: &Job,
        enc: Encoding,
        src: &TensorRef<'_>,
    ) -> Result<(), PipelineError> {
        let view = src.view;
        let size = view.dtype.size().ok_or_else(|| PipelineError::Convert {
            tensor: job.stored.clone(),
            reason: format!("dtype {} cannot be quantized", view.dtype),
        })?;
        let row = view.shape.last().copied().unwrap_or(1).max(1);
        let band = (BAND_ELEMS / row).max(1).next_multiple_of(enc.row_align()) * row;
        let n = view.numel();
        let read = |at: usize, buf: &mut Vec<f32>| -> Result<(), PipelineError> {
            let k = band.min(n - at);
            buf.resize(k, 0.0);
            let bytes = &view.bytes[at * size..(at + k) * size];
            let widened =
                widen_to_f32(view.dtype, bytes, buf).map_err(|e| PipelineError::Convert {
                    tensor: job.stored.clone(),
                    reason: e.to_string(),
                });
            // Held as f32 now: the band's mapped pages leave the resident set.
            let start = bytes.as_ptr() as usize - src.file.bytes().as_ptr() as usize;
            src.file.release_bytes(start, start + bytes.len());
            widened
        };
        let mut buf = Vec::new();
        let what = format!("{}: {}", src.file.path().display(), job.stored);
        let mut tensor_scale = None;
        if enc.needs_amax() {
            let mut pass = AmaxPass::default();
            for at in (0..n).step_by(band) {
                read(at, &mut buf)?;
                pass.add(&buf);
            }
            // A non-finite weight is found (and named) by the encoding pass below.
            tensor_scale = pass.scale(enc, &what)?;
        }
        let mut sum = ErrorSum::default();
        let mut found = None;
        // `n.max(1)`: an empty tensor is still encoded once (an fp8 scale is written)
        for at in (0..n.max(1)).step_by(band) {
            read(at, &mut buf)?;
            let part = self.encode_part(job, enc, at, &buf, tensor_scale, &what, &mut sum)?;
            Unheld::add(&mut found, part);
        }
        self.record_error(job, &sum);
        match found {
            Some(found) => self.found(self.base_finding(job, src, found)),
            None => Ok(()),
        }
    }

    /// Encodes `w`, the f32 values of elements `first ..` of `job`'s tensor, into its slot
    /// (the fp8 scale, or a per-layer format's side tensors, into theirs), adding the
    /// dequantized error to `sum`. Returns the
    /// values the encoding cannot hold, for the caller to name their origin: a non-finite
    /// `w`, or a finite one whose decoded value is not (an F16 overflow, a block whose F16
    /// scale overflows); they are written as the encoder rounds them.
    #[allow(clippy::too_many_arguments)]
    pub fn encode_part(
        &self,
        job: &Job,
        enc: Encoding,
        first: usize,
        w: &[f32],
        tensor_scale: Option<f32>,
        what: &str,
        sum: &mut ErrorSum,
    ) -> Result<Option<Unheld>, PipelineError> {
        let internal = |m: &str| PipelineError::Internal(format!("`{}`: {m}", job.output));
        let options = self
            .plan
            .quant
            .as_ref()
            .map(|q| q.options)
            .ok_or_else(|| internal("an encoded job in a plan without a quantized output"))?;
        let mut y = vec![0f32; w.len()];
        let e = encode::encode(&options, enc, (w, first), &mut y, tensor_scale, what)?;
        if e.layer.is_empty() {
            let at = enc
                .byte_offset(first)
                .ok_or_else(|| internal("a band that does not start on a block boundary"))?;
            self.write(job, at, &e.bytes)?;
        }
        if let (Some(scale), 0) = (e.scale, first) {
            self.write_side(
                job,
                encode::scale_name(&job.output),
                0,
                &scale.to_le_bytes(),
            )?;
        }
        for p in &e.layer {
            let name = format!("{}{}", encode::layer_name(&job.output), p.suffix);
            self.write_side(job, name, p.offset, &p.bytes)?;
        }
        sum.add(w, &y);
        if let (Encoding::Fp8, Some(scale)) = (enc, e.scale) {
            let limit = crate::codec::fp8::E4M3_MAX;
            let n = crate::codec::dtype::vectorized(
                #[inline(always)]
                || {
                    w.iter()
                        .fold(0, |n, &x| n + ((x / scale).abs() > limit) as usize)
                },
            );
            if let Ok(mut m) = self.saturated.lock() {
                *m.entry(job.output.clone()).or_default() += n;
            }
        }
        let blocks = matches!(enc, Encoding::Ggml { ty, .. } if ty.is_block());
        Ok(unheld_encoded(w, &y, first, blocks))
    }

    /// Writes `bytes` at `offset` of the output tensor `name` of `job`'s component (a scale
    /// or another side tensor the weight's job writes; a per-layer weight too).
    fn write_side(
        &self,
        job: &Job,
        name: String,
        offset: usize,
        bytes: &[u8],
    ) -> Result<(), PipelineError> {
        let staging = self.staging;
        let slot = staging
            .plan()
            .slot(job.component, &name)
            .ok_or_else(|| PipelineError::Internal(format!("no output slot for `{name}`")))?;
        staging
            .write(slot, offset, bytes)
            .map_err(|source| PipelineError::Write {
                tensor: name,
                source: Box::new(source),
            })
    }

    /// Records `sum` as the dequantized error of `job`'s output tensor.
    pub fn record_error(&self, job: &Job, sum: &ErrorSum) {
        if let Ok(mut m) = self.quant_errors.lock() {
            m.insert(job.output.clone(), sum.stats());
        }
    }

    /// Writes `transform(src)` converted to the job's dtype (`layout::conversion::convert_piece`);
    /// returns the values the output holds as NaN or ±inf (non-finite in `src`, or beyond
    /// the job's dtype), counted in the piece's output order, for the caller to name.
    ///
    /// When `src` is mapped from `file` and the transform keeps the element order, the mapped
    /// pages of each band leave the resident set once the band is written, so a copied
    /// tensor costs a band of memory, not its size (a 14B `time_projection` is 629 MB in
    /// f32); a later read faults them back from the page cache.
    pub fn convert_bands(
        &self,
        job: &Job,
        transform: Transform,
        src: SrcTensor<'_>,
        file: Option<&SafetensorsFile>,
    ) -> Result<Option<Unheld>, PipelineError> {
        let err = |e: crate::model::transform::KernelError| PipelineError::Convert {
            tensor: job.stored.clone(),
            reason: e.to_string(),
        };
        let consumed = band_source(file, transform, &src, job.dtype);
        let mut buf = Vec::new();
        let write = |offset: usize, bytes: &[u8]| {
            self.write(job, offset, bytes)?;
            if let Some(release) = &consumed {
                release(offset, bytes.len());
            }
            Ok(())
        };
        convert_piece(
            transform,
            src,
            job.dtype,
            self.options.band_bytes,
            &mut buf,
            write,
            err,
        )
    }
}

/// How many jobs still read each stored base tensor: its mapped pages are dropped after its
/// last job (a stacked tensor's, layer by layer), however many outputs read it.
pub struct Uses<'j> {
    left: HashMap<(usize, &'j str), AtomicUsize>,
}

impl<'j> Uses<'j> {
    /// The count of `jobs` (of one plan, or of every output of a matrix).
    pub fn new(jobs: impl IntoIterator<Item = &'j Job>) -> Uses<'j> {
        let mut left: HashMap<(usize, &str), AtomicUsize> = HashMap::new();
        for j in jobs {
            left.entry((j.component, j.stored.as_str()))
                .or_insert_with(|| AtomicUsize::new(0))
                .fetch_add(1, Ordering::Relaxed);
        }
        Uses { left }
    }

    /// `job` has read `src`: its pages go once no job is left to read them, or its layer's
    /// at once.
    pub fn done(&self, job: &Job, src: Option<&TensorRef<'_>>) {
        let Some(src) = src else { return };
        let key = (job.component, job.stored.as_str());
        if (self.left.get(&key)).is_some_and(|left| left.fetch_sub(1, Ordering::AcqRel) == 1) {
            src.file.release(src.position);
        } else if job.layer.is_some() {
            release_layer(src, job);
        }
    }
}

/// For a `src` mapped from `file` and converted in its own element order: what releases the
/// source bytes behind output bytes `[offset, offset + len)` of the piece (element `i` of the
/// output is element `i` of the source). `None` when nothing can be released band by band.
fn band_source<'s>(
    file: Option<&'s SafetensorsFile>,
    transform: Transform,
    src: &SrcTensor<'s>,
    dtype: DType,
) -> Option<impl Fn(usize, usize) + 's> {
    let file = file?;
    if !transform.keeps_order() {
        return None;
    }
    // Same dtype: byte for byte (packed types included); else whole elements of each.
    let (num, den) = match src.dtype == dtype {
        true => (1, 1),
        false => (src.dtype.size()?, dtype.size()?),
    };
    let base = (src.bytes.as_ptr() as usize).checked_sub(file.bytes().as_ptr() as usize)?;
    let len = src.bytes.len();
    Some(move |offset: usize, n: usize| {
        let begin = (offset / den * num).min(len);
        let end = ((offset + n) / den * num).min(len);
        file.release_bytes(base + begin, base + end);
    })
}

/// The values of `w` (elements `first ..` of a tensor) that are not finite, or else (a
/// finite `w`) those whose encoding `y`, as decoded, is not: an overflow of the encoding.
/// A non-finite value can spoil its neighbours' encoding too (an infinite fp8 scale, a
/// NaN block scale), so only the values themselves are counted then. An overflow of a
/// block type (`blocks`) spoils its whole block, every value of which is counted; the
/// value named is then the largest of the first spoiled run (the one its scale could not
/// hold), not the run's first. `None` on the fast path, two vectorised scans.
fn unheld_encoded(w: &[f32], y: &[f32], first: usize, blocks: bool) -> Option<Unheld> {
    let finite = all_held(w, f32::INFINITY);
    if finite && all_held(y, f32::INFINITY) {
        return None;
    }
    let v = if finite { y } else { w };
    let mut u = Unheld::scan(v, f32::INFINITY, first)?;
    let mut at = u.first - first;
    if finite && blocks {
        let run = y[at..].iter().take_while(|d| !d.is_finite()).count();
        let largest = (at..at + run).fold(at, |m, i| if w[i].abs() > w[m].abs() { i } else { m });
        (u.first, at) = (first + largest, largest);
    }
    u.value = w[at];
    Some(u)
}

/// The stored base tensor `job` reads.
pub fn stored<'p>(plan: &Plan<'p>, job: &Job) -> Result<TensorRef<'p>, PipelineError> {
    let comp = &plan.base.components[job.component];
    comp.tensors
        .get(&job.stored)
        .ok_or_else(|| PipelineError::Convert {
            tensor: job.stored.clone(),
            reason: "planned but missing from the base".into(),
        })
}

/// Drops the mapped pages of the one layer `job` read from a stacked tensor, so the
/// resident set holds a layer at a time, not the whole (L, ...) tensor until its last layer
/// is done (a 14B `nnx-scanned` ffn weight is 5.7 GB in bf16).
fn release_layer(src: &TensorRef<'_>, job: &Job) {
    if let Ok(bytes) = layer_bytes(&src.view, job.layer, &job.stored_shape) {
        let start = bytes.as_ptr() as usize - src.file.bytes().as_ptr() as usize;
        src.file.release_bytes(start, start + bytes.len());
    }
}
