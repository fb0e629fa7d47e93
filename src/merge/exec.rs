//! Running a merge plan: one base tensor at a time per worker, in bands of rows on the CPU,
//! or whole on a backend lane (`--device cuda`, and the reference route).
//!
//! Owns: the job loop of every producing command (rayon across jobs; every job's own
//! arithmetic is sequential, so the bytes never depend on the thread count; `restack` and
//! `convert` run their copy-only plans through it with [`copy_plan`]), the route each target takes ([`Compute`]), the
//! band reader of base rows (dtype widening, the MLX Conv1d row permutation), loading an
//! entry's tensors (for a LyCORIS entry: its whole `f(W0) − W0` from `merge::lycoris`, added
//! like a diff, since OFT/BOFT mix rows across bands), the -xs bases (through the SVD cache when one is given, computed by the
//! CPU SVD on a miss, on every route), and writing each band or whole tensor into its slot. Does
//! not own: the formulas (`merge::math`) or the whole-tensor program (`merge::device`), the
//! kernel that copies and converts untouched tensors (`model::transform`), or the atomic
//! output (`io::staging`).
//!
//! Memory: a worker holds a few bands of at most [`BAND_ELEMS`] f32 values (W0, the
//! accumulator, V), the factors of the target it works on, and, for -xs kinds, the target's
//! SVD bases (the SVD itself needs the whole weight), or for LyCORIS kinds the target's
//! whole W0 and delta (f32). A base tensor's mapped pages are
//! dropped once its last job is done, and an adapter tensor's once it is loaded, so the
//! resident set does not grow with the model. A merged tensor written through a permuting
//! layout (`--layout nnx`) is the exception: it is assembled whole (f32) before it is
//! transposed. So is every target on the whole-tensor route, at most
//! `merge::device::MAX_LANES` at a time (host and device memory: W0, the accumulator, V and
//! the output bytes of one tensor per lane), and a merged target of a scaled-fp8 output
//! (its scale is the whole tensor's `max|W|`).
//!
//! Quantized outputs (`Job::encoding`): each band of merged or widened f32 rows goes through
//! `quantize::encode` into its slot (a band of whole rows is whole ggml blocks), with the
//! dequantized error summed in element order; an untouched scaled-fp8 weight is read twice
//! in bands (its `max|W|`, then its codes), so only merged fp8 targets are held whole.

#![allow(non_snake_case)]

use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use faer::Par;
use rayon::prelude::*;

use super::bind::BoundAdapter;
use super::device::{BaseWeight, Compute, Lanes, MAX_LANES, merge_whole, reference_lanes};
use super::error::MergeError;
use super::lycoris::delta_scaled;
use super::math::{Factors, Form, SA3_EPS, Scratch, Update, add_contribution, column_scales};
use super::plan::{Contribution, Job, MergePlan, RowOrder, Target};
use super::report::SvdReport;
use crate::adapter::lycoris::{LycorisError, module_of};
use crate::adapter::{AdapterSet, Kind, ParamRole, TensorSource};
use crate::backend::Backend;
use crate::io::dtype::{narrow_from_f32, widen_to_f32};
use crate::io::{DType, ReadError, Staging, TensorRef, TensorView};
use crate::layout::conversion::{PIECE_BAND_BYTES, convert_piece};
use crate::linalg::{CacheError, CacheOutcome, SvdCache, XsBases, xs_bases};
use crate::model::transform::{SrcTensor, Transform};
use crate::quantize::{self, Encoding, ErrorStats, ErrorSum};

/// Largest band of a merged tensor a worker holds in one buffer, in f32 values (4 MiB).
/// A constant, so the band split (and with it every rounding) never depends on the machine.
pub const BAND_ELEMS: usize = 1 << 20;

/// Rows per band of a (·, inp) matrix.
pub fn band_rows(inp: usize) -> usize {
    (BAND_ELEMS / inp.max(1)).max(1)
}

/// Loads one adapter tensor as f32 in PyTorch layout and drops its mapped pages.
pub fn load_param(set: &AdapterSet, src: &TensorSource) -> Result<Vec<f32>, ReadError> {
    let v = set.load(src)?;
    if let Some((f, i)) = set
        .files
        .get(src.file)
        .and_then(|f| f.position(&src.key).map(|i| (f, i)))
    {
        f.release(i);
    }
    Ok(v)
}

/// -xs bases of target `t`'s (out, in') f32 matrix `W`, when no cache has them: the CPU SVD
/// on every route, so the SVD cache holds one engine's bases whichever route filled it
/// (`merge::device`, "-xs bases").
fn cpu_xs_bases(t: &Target, W: &[f32], rank: usize) -> Result<XsBases, MergeError> {
    xs_bases(W, t.out, t.inp, rank, Par::Seq).map_err(|source| {
        MergeError::from(CacheError::Linalg {
            tensor: t.name.clone(),
            source,
        })
    })
}

/// What every job needs.
pub struct Exec<'a> {
    /// The base.
    pub base: &'a crate::io::Checkpoint,
    /// The adapters.
    pub adapters: &'a [BoundAdapter],
    /// The plan.
    pub plan: &'a MergePlan,
    /// Where bytes go (`None`: a run that only computes values, [`Exec::merged_values`]).
    pub staging: Option<&'a Staging>,
    /// The SVD basis cache, when given.
    pub svd_cache: Option<&'a SvdCache>,
    /// Where targets are computed (untouched tensors are always copied on the CPU).
    pub compute: &'a Compute,
    /// A quantized output's dequantized error per output tensor, filled as jobs finish.
    pub quant_errors: Mutex<BTreeMap<String, ErrorStats>>,
    /// Largest band of destination bytes an untouched tensor is copied or converted in
    /// ([`PIECE_BAND_BYTES`] unless a test shrinks it); never changes the bytes.
    pub copy_band_bytes: usize,
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
    pub fn install<T: Send>(
        &self,
        f: impl FnOnce() -> Result<T, MergeError> + Send,
    ) -> Result<T, MergeError> {
        match self.threads {
            None => f(),
            Some(threads) => rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .map_err(|e| {
                    MergeError::Internal(format!("cannot start {threads} worker threads: {e}"))
                })?
                .install(f),
        }
    }
}

/// Runs a plan that merges nothing (`restack`, `convert`): every job copies or converts one
/// base tensor (or layer) into its slot, on the CPU, through the same job loop as a merge.
pub fn copy_plan(
    base: &crate::io::Checkpoint,
    plan: &MergePlan,
    staging: &Staging,
    options: &ExecOptions,
) -> Result<(), MergeError> {
    if !plan.targets.is_empty() {
        return Err(MergeError::Internal(
            "copy_plan runs plans without merged targets".into(),
        ));
    }
    let exec = Exec {
        base,
        adapters: &[],
        plan,
        staging: Some(staging),
        svd_cache: None,
        compute: &Compute::Cpu,
        quant_errors: Default::default(),
        copy_band_bytes: options.band_bytes,
    };
    options.install(|| exec.run().map(drop))
}

#[derive(Default)]
struct SvdCounters {
    hits: AtomicUsize,
    misses: AtomicUsize,
    replaced: AtomicUsize,
    computed: AtomicUsize,
}

impl Exec<'_> {
    /// Runs every job on the current rayon pool. On error the caller discards the output.
    pub fn run(&self) -> Result<SvdReport, MergeError> {
        match self.compute {
            Compute::Cpu => self.run_jobs(Scratch::default, |scratch, job, t, src, svd| {
                self.merge(job, t, src, scratch, svd)
            }),
            Compute::Cuda(device) => {
                let device = device.clone();
                let lanes = Lanes::new(MAX_LANES, move || device.backend());
                self.run_jobs(
                    || (),
                    |_, job, t, src, svd| self.merge_whole(&lanes, job, t, src, svd),
                )
            }
            Compute::Reference => {
                let lanes = reference_lanes();
                self.run_jobs(
                    || (),
                    |_, job, t, src, svd| self.merge_whole(&lanes, job, t, src, svd),
                )
            }
        }
    }

    /// The job loop: untouched tensors are copied, targets go to `merge_target` (with the
    /// per-worker state `init` makes); a base tensor's pages are dropped after its last job.
    fn run_jobs<S>(
        &self,
        init: impl Fn() -> S + Send + Sync,
        merge_target: impl Fn(
            &mut S,
            &Job,
            &Target,
            &TensorRef<'_>,
            &SvdCounters,
        ) -> Result<(), MergeError>
        + Send
        + Sync,
    ) -> Result<SvdReport, MergeError> {
        let mut uses: HashMap<(usize, &str), AtomicUsize> = HashMap::new();
        for j in &self.plan.jobs {
            uses.entry((j.component, j.stored.as_str()))
                .or_insert_with(|| AtomicUsize::new(0))
                .fetch_add(1, Ordering::Relaxed);
        }
        let svd = SvdCounters::default();
        self.plan
            .jobs
            .par_iter()
            .try_for_each_init(init, |state, job| {
                let src = self.stored(job)?;
                match job.target {
                    None => self.copy(job, &src)?,
                    Some(t) => merge_target(state, job, &self.plan.targets[t], &src, &svd)?,
                }
                let key = (job.component, job.stored.as_str());
                if uses
                    .get(&key)
                    .is_some_and(|left| left.fetch_sub(1, Ordering::AcqRel) == 1)
                {
                    src.file.release(src.position);
                } else if job.layer.is_some() {
                    release_layer(&src, job);
                }
                Ok::<(), MergeError>(())
            })?;
        Ok(SvdReport {
            cache: self.svd_cache.is_some(),
            hits: svd.hits.into_inner(),
            misses: svd.misses.into_inner(),
            replaced: svd.replaced.into_inner(),
            computed: svd.computed.into_inner(),
        })
    }

    /// NaN/±inf at flat index `i` of the band starting at row `r0` of target `t`.
    fn non_finite(&self, t: &Target, r0: usize, i: usize, value: f32) -> MergeError {
        MergeError::NonFiniteResult {
            tensor: t.name.clone(),
            component: self.base.components[t.component].name.clone(),
            row: r0 + i / t.inp.max(1),
            col: i % t.inp.max(1),
            value,
        }
    }

    fn stored(&self, job: &Job) -> Result<TensorRef<'_>, MergeError> {
        let comp = &self.base.components[job.component];
        comp.tensors
            .get(&job.stored)
            .ok_or_else(|| MergeError::Convert {
                tensor: job.stored.clone(),
                reason: "planned but missing from the base".into(),
            })
    }

    fn staging(&self) -> Result<&Staging, MergeError> {
        self.staging.ok_or_else(|| {
            MergeError::Internal("a run that computes values was asked to write".into())
        })
    }

    fn write(&self, job: &Job, offset: usize, bytes: &[u8]) -> Result<(), MergeError> {
        self.staging()?
            .write(job.slot, job.dst_offset + offset, bytes)
            .map_err(|source| MergeError::Write {
                tensor: job.output.clone(),
                source: Box::new(source),
            })
    }

    /// An untouched tensor: copied byte for byte (same dtype) or converted once, or
    /// encoded for a quantized output.
    fn copy(&self, job: &Job, src: &TensorRef<'_>) -> Result<(), MergeError> {
        let view = src.view;
        if let Some(enc) = job.encoding {
            return self.copy_encoded(job, enc, src);
        }
        let src = SrcTensor {
            dtype: view.dtype,
            shape: &job.stored_shape,
            bytes: layer_bytes(&view, job.layer, &job.stored_shape)?,
        };
        self.convert_bands(job, job.transform, src)
    }

    /// An untouched tensor of a quantized output: widened to f32 in bands of whole rows
    /// (innermost dimension) and encoded band by band; a scaled-fp8 weight first has its
    /// `max|W|` taken over the same bands.
    fn copy_encoded(
        &self,
        job: &Job,
        enc: Encoding,
        src: &TensorRef<'_>,
    ) -> Result<(), MergeError> {
        let view = src.view;
        let size = view.dtype.size().ok_or_else(|| MergeError::Convert {
            tensor: job.stored.clone(),
            reason: format!("dtype {} cannot be quantized", view.dtype),
        })?;
        let row = view.shape.last().copied().unwrap_or(1).max(1);
        let band = (BAND_ELEMS / row).max(1) * row;
        let n = view.numel();
        let read = |at: usize, buf: &mut Vec<f32>| -> Result<(), MergeError> {
            let k = band.min(n - at);
            buf.resize(k, 0.0);
            widen_to_f32(view.dtype, &view.bytes[at * size..(at + k) * size], buf).map_err(|e| {
                MergeError::Convert {
                    tensor: job.stored.clone(),
                    reason: e.to_string(),
                }
            })
        };
        let mut buf = Vec::new();
        let mut fp8_scale = None;
        if enc == Encoding::Fp8 {
            let mut amax = 0f32;
            for at in (0..n).step_by(band) {
                read(at, &mut buf)?;
                amax = amax.max(crate::io::quant::fp8::amax(&buf));
            }
            fp8_scale = Some(crate::io::quant::fp8::scale_for(amax));
        }
        let what = format!("{}: {}", src.file.path().display(), job.stored);
        let mut sum = ErrorSum::default();
        // `n.max(1)`: an empty tensor is still encoded once (an fp8 scale is written)
        for at in (0..n.max(1)).step_by(band) {
            read(at, &mut buf)?;
            self.encode_part(job, enc, at, &buf, fp8_scale, &what, &mut sum)?;
        }
        self.record_error(job, &sum);
        Ok(())
    }

    /// Encodes `w`, the f32 values of elements `first ..` of `job`'s tensor, into its slot
    /// (and the fp8 scale into its own), adding the dequantized error to `sum`.
    #[allow(clippy::too_many_arguments)]
    fn encode_part(
        &self,
        job: &Job,
        enc: Encoding,
        first: usize,
        w: &[f32],
        fp8_scale: Option<f32>,
        what: &str,
        sum: &mut ErrorSum,
    ) -> Result<(), MergeError> {
        let internal = |m: &str| MergeError::Internal(format!("`{}`: {m}", job.output));
        let options = self
            .plan
            .quant
            .as_ref()
            .map(|q| q.options)
            .ok_or_else(|| internal("an encoded job in a plan without a quantized output"))?;
        let mut y = vec![0f32; w.len()];
        let e = quantize::encode(&options, enc, w, &mut y, fp8_scale, what)
            .map_err(|e| MergeError::Encode(format!("{e:#}")))?;
        let at = enc
            .byte_offset(first)
            .ok_or_else(|| internal("a band that does not start on a block boundary"))?;
        self.write(job, at, &e.bytes)?;
        if let (Some(scale), 0) = (e.scale, first) {
            let name = quantize::scale_name(&job.output);
            let staging = self.staging()?;
            let slot = staging
                .plan()
                .slot(job.component, &name)
                .ok_or_else(|| MergeError::Internal(format!("no output slot for `{name}`")))?;
            staging
                .write(slot, 0, &scale.to_le_bytes())
                .map_err(|source| MergeError::Write {
                    tensor: name,
                    source: Box::new(source),
                })?;
        }
        sum.add(w, &y);
        Ok(())
    }

    fn record_error(&self, job: &Job, sum: &ErrorSum) {
        if let Ok(mut m) = self.quant_errors.lock() {
            m.insert(job.output.clone(), sum.stats());
        }
    }

    /// Writes `transform(src)` converted to the job's dtype (`layout::conversion::convert_piece`).
    fn convert_bands(
        &self,
        job: &Job,
        transform: Transform,
        src: SrcTensor<'_>,
    ) -> Result<(), MergeError> {
        let err = |e: crate::model::transform::KernelError| MergeError::Convert {
            tensor: job.stored.clone(),
            reason: e.to_string(),
        };
        let mut buf = Vec::new();
        let write = |offset: usize, bytes: &[u8]| self.write(job, offset, bytes);
        convert_piece(
            transform,
            src,
            job.dtype,
            self.copy_band_bytes,
            &mut buf,
            write,
            err,
        )
    }

    /// A target: `W' = W0 + Σ w·(f(W0) − W0)`, band by band, checked finite, rounded once.
    fn merge(
        &self,
        job: &Job,
        t: &Target,
        src: &TensorRef<'_>,
        scratch: &mut Scratch,
        svd: &SvdCounters,
    ) -> Result<(), MergeError> {
        let mut out = Emit::new(job, t)?;
        self.merge_bands(job, t, src, scratch, svd, |rows, r0, D| {
            out.band(self, rows, r0, D)
        })?;
        out.finish(self)
    }

    /// The merged f32 values of target `t` (read through `job`) in PyTorch layout, band by
    /// band as a merge computes them, checked finite, before any rounding to the output
    /// dtype: what an f32 merge in the stored layout writes. `extract --adapter` reads its
    /// tuned model this way instead of from a written merge.
    pub fn merged_values(&self, job: &Job, t: &Target) -> Result<Vec<f32>, MergeError> {
        let src = self.stored(job)?;
        let to_output = Emit::new(job, t)?.to_output;
        let mut whole = Vec::with_capacity(t.out * t.inp);
        let (mut scratch, svd) = (Scratch::default(), SvdCounters::default());
        self.merge_bands(job, t, &src, &mut scratch, &svd, |rows, _, D| {
            match to_output {
                Transform::Identity => whole.extend_from_slice(&rows.to_stored_order(D)),
                _ => whole.extend_from_slice(D),
            }
            Ok(())
        })?;
        if to_output == Transform::Identity {
            return Ok(whole);
        }
        // A permuted stored layout (NNX kernels): the whole tensor, as Emit::finish writes it.
        let mut raw = vec![0u8; whole.len() * 4];
        let src = SrcTensor {
            dtype: DType::F32,
            shape: &t.shape,
            bytes: bytemuck::cast_slice(&whole),
        };
        crate::model::transform::convert(to_output, src, DType::F32, &mut raw).map_err(|e| {
            MergeError::Convert {
                tensor: t.name.clone(),
                reason: e.to_string(),
            }
        })?;
        Ok(raw
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    /// Runs target `t`'s merge band by band, handing each checked band of merged rows
    /// (first row, values) to `band`.
    fn merge_bands(
        &self,
        job: &Job,
        t: &Target,
        src: &TensorRef<'_>,
        scratch: &mut Scratch,
        svd: &SvdCounters,
        mut band: impl FnMut(&BaseRows<'_>, usize, &[f32]) -> Result<(), MergeError>,
    ) -> Result<(), MergeError> {
        let rows = BaseRows::new(t, src, job)?;
        let loaded = self.load_factors(t, &rows, svd)?;
        let updates: Vec<(Update<'_>, f64)> = loaded
            .iter()
            .map(|l| (l.update(), l.contribution.weight))
            .collect();
        let band_len = band_rows(t.inp);
        let col_scales = updates
            .iter()
            .map(|(u, _)| column_scales(u, t.out, t.inp, band_len, |r0, n, d| rows.read(r0, n, d)))
            .collect::<Result<Vec<_>, MergeError>>()?;
        let mut band_buf = Band::default();
        let mut r0 = 0;
        while r0 < t.out {
            let n = band_len.min(t.out - r0);
            let D = band_buf.merged(&rows, &updates, &col_scales, t, r0, n, scratch)?;
            check_finite(D).map_err(|i| self.non_finite(t, r0, i, D[i]))?;
            band(&rows, r0, D)?;
            r0 += n;
        }
        Ok(())
    }

    /// A target computed whole on a lane of `lanes` (`merge::device`), then written as the
    /// band path writes a band: straight into the output when the output keeps the stored
    /// layout and dtype is BF16/F16/F32, else through [`Emit`] from the f32 sum.
    fn merge_whole<B: Backend>(
        &self,
        lanes: &Lanes<B>,
        job: &Job,
        t: &Target,
        src: &TensorRef<'_>,
        svd: &SvdCounters,
    ) -> Result<(), MergeError> {
        let device = |e| MergeError::Device {
            tensor: t.name.clone(),
            device: self.compute.label(),
            source: e,
        };
        let rows = BaseRows::new(t, src, job)?;
        let loaded = self.load_factors(t, &rows, svd)?;
        let updates: Vec<(Update<'_>, f64)> = loaded
            .iter()
            .map(|l| (l.update(), l.contribution.weight))
            .collect();
        let mut out = Emit::new(job, t)?;
        let keeps_layout = out.direct();
        // The whole tensor is read, merged and (when it needs no layout work) written while
        // the lane is held, so at most one whole tensor per lane is resident.
        let merged = lanes
            .with(|b| {
                let mut host = Vec::new();
                let output = keeps_layout.then_some(job.dtype);
                let (base, final_dtype) = rows.whole(t.out, output, &mut host)?;
                let dtype = final_dtype.unwrap_or(DType::F32);
                let mut bytes = vec![0u8; t.out * t.inp * dtype.size().unwrap_or(4)];
                let non_finite = merge_whole(b, base, (t.out, t.inp), &updates, dtype, &mut bytes)
                    .map_err(device)?;
                if let Some(nf) = non_finite {
                    return Err(self.non_finite(t, 0, nf.index, nf.value));
                }
                if final_dtype.is_some() {
                    self.write(job, 0, &bytes)?;
                    return Ok(None);
                }
                let f32s = bytes.chunks_exact(4);
                Ok(Some(
                    f32s.map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect::<Vec<f32>>(),
                ))
            })
            .map_err(device)??;
        // The f32 sum, for the MLX row order or a transposing output layout.
        if let Some(merged) = merged {
            out.band(self, &rows, 0, &merged)?;
            out.finish(self)?;
        }
        Ok(())
    }

    /// The tensors of every contribution to `t`, and the -xs bases (one SVD per rank,
    /// [`cpu_xs_bases`] on a miss).
    fn load_factors(
        &self,
        t: &Target,
        rows: &BaseRows<'_>,
        svd: &SvdCounters,
    ) -> Result<Vec<Loaded>, MergeError> {
        let mut bases: BTreeMap<usize, Rc<XsBases>> = BTreeMap::new();
        let mut loaded = Vec::with_capacity(t.contributions.len());
        for c in &t.contributions {
            let set = &self.adapters[c.adapter].set;
            let entry = &set.entries[c.entry];
            let mut params = BTreeMap::new();
            for (&role, src) in &entry.params {
                params.insert(role, load_param(set, src)?);
            }
            if c.kind.is_lycoris() {
                let delta = lycoris_delta(t, rows, entry, &params).map_err(|source| {
                    MergeError::Lycoris {
                        adapter: set.path.clone(),
                        source,
                    }
                })?;
                params = BTreeMap::from([(ParamRole::Diff, delta?)]);
            }
            let xs = if c.kind.is_xs() {
                let b = match bases.get(&c.rank) {
                    Some(b) => b.clone(),
                    None => {
                        let b = Rc::new(self.xs_bases(t, rows, c.rank, svd)?);
                        bases.insert(c.rank, b.clone());
                        b
                    }
                };
                Some(b)
            } else {
                None
            };
            loaded.push(Loaded {
                contribution: c.clone(),
                params,
                xs,
            });
        }
        Ok(loaded)
    }

    /// LoRA-XS bases of the target's (out, in') view: from the cache when one is given
    /// (computed by [`cpu_xs_bases`] and stored on a miss or a rejected entry), else computed.
    fn xs_bases(
        &self,
        t: &Target,
        rows: &BaseRows<'_>,
        rank: usize,
        svd: &SvdCounters,
    ) -> Result<XsBases, MergeError> {
        let mut W = vec![0.0f32; t.out * t.inp];
        let Some(cache) = self.svd_cache else {
            rows.read(0, t.out, &mut W)?;
            svd.computed.fetch_add(1, Ordering::Relaxed);
            return cpu_xs_bases(t, &W, rank);
        };
        let compute = |W: &[f32], _out, _inp| cpu_xs_bases(t, W, rank);
        // The cache keys the stored bytes when they are the PyTorch-layout matrix, else the
        // f32 PyTorch-layout copy (MLX Conv1d, NNX kernels).
        let cached = match rows.direct_view() {
            Some(view) => cache.get_or_compute_with(&view, rank, compute)?,
            None => {
                rows.read(0, t.out, &mut W)?;
                let view = TensorView {
                    name: &t.name,
                    dtype: DType::F32,
                    shape: &t.shape,
                    bytes: bytemuck::cast_slice(&W),
                };
                cache.get_or_compute_with(&view, rank, compute)?
            }
        };
        let counter = match cached.outcome {
            CacheOutcome::Hit => &svd.hits,
            CacheOutcome::Miss => &svd.misses,
            CacheOutcome::Replaced { .. } => &svd.replaced,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        Ok(cached.bases)
    }
}

/// The buffers of one band: the merged weight `D` and, for the normalised forms, `W0`.
#[derive(Default)]
struct Band {
    W0: Vec<f32>,
    D: Vec<f32>,
}

impl Band {
    /// Rows `r0 .. r0 + n` of `W0 + Σ w·(f(W0) − W0)`, contributions in the plan's order.
    #[allow(clippy::too_many_arguments)]
    fn merged(
        &mut self,
        rows: &BaseRows<'_>,
        updates: &[(Update<'_>, f64)],
        col_scales: &[Option<Vec<f64>>],
        t: &Target,
        r0: usize,
        n: usize,
        scratch: &mut Scratch,
    ) -> Result<&[f32], MergeError> {
        // Linear and full-tensor contributions only add into the band; the normalised ones
        // also need W0 on its own.
        let keep_w0 = updates.iter().any(
            |(u, _)| matches!(u, Update::LowRank { form, .. } if !matches!(form, Form::Additive)),
        );
        self.D.resize(n * t.inp, 0.0);
        rows.read(r0, n, &mut self.D)?;
        self.W0.clear();
        if keep_w0 {
            self.W0.extend_from_slice(&self.D);
        }
        for ((u, w), cs) in updates.iter().zip(col_scales) {
            let (W0, D) = (&self.W0[..], &mut self.D[..]);
            add_contribution(u, *w, cs.as_deref(), W0, r0, n, t.inp, D, scratch);
        }
        Ok(&self.D)
    }
}

/// Where merged bands go: narrowed (or encoded, for a quantized output) straight into the
/// output when the output layout is the PyTorch layout (or the MLX row order), else
/// assembled whole and converted at the end; a scaled-fp8 weight is assembled whole and
/// encoded at the end (its scale needs the whole tensor's `max|W|`).
struct Emit<'a> {
    job: &'a Job,
    t: &'a Target,
    to_output: Transform,
    bytes: Vec<u8>,
    whole: Vec<f32>,
    error: ErrorSum,
}

impl<'a> Emit<'a> {
    /// Where the merged rows of `t` go for `job`.
    fn new(job: &'a Job, t: &'a Target) -> Result<Emit<'a>, MergeError> {
        // PyTorch layout → output layout; Identity for every base stored in PyTorch layout.
        let to_output = t
            .to_canonical
            .inverse()
            .then(job.transform, t.shape.len())
            .map_err(|e| MergeError::Convert {
                tensor: t.name.clone(),
                reason: e.to_string(),
            })?;
        if job.encoding.is_some() && to_output != Transform::Identity {
            return Err(MergeError::Internal(format!(
                "`{}`: a quantized output of a permuted layout",
                t.name
            )));
        }
        Ok(Emit {
            job,
            t,
            to_output,
            bytes: Vec::new(),
            whole: Vec::new(),
            error: ErrorSum::default(),
        })
    }

    /// Are merged values written as the backend rounds them (a plain dtype, stored layout)?
    fn direct(&self) -> bool {
        self.to_output == Transform::Identity && self.job.encoding.is_none()
    }

    /// Is the merged tensor assembled whole before it is written?
    fn assembles(&self) -> bool {
        self.to_output != Transform::Identity || self.job.encoding.is_some_and(|e| !e.streams())
    }

    fn band(
        &mut self,
        exec: &Exec<'_>,
        rows: &BaseRows<'_>,
        r0: usize,
        D: &[f32],
    ) -> Result<(), MergeError> {
        if self.assembles() {
            self.whole.extend_from_slice(D);
            return Ok(());
        }
        let stored = rows.to_stored_order(D);
        if let Some(enc) = self.job.encoding {
            let first = r0 * self.t.inp;
            let what = self.t.name.clone();
            return exec.encode_part(self.job, enc, first, &stored, None, &what, &mut self.error);
        }
        let size = self.job.dtype.size().unwrap_or(4);
        self.bytes.resize(stored.len() * size, 0);
        narrow_from_f32(self.job.dtype, &stored, &mut self.bytes).map_err(|e| {
            MergeError::Convert {
                tensor: self.t.name.clone(),
                reason: e.to_string(),
            }
        })?;
        exec.write(self.job, r0 * self.t.inp * size, &self.bytes)
    }

    fn finish(mut self, exec: &Exec<'_>) -> Result<(), MergeError> {
        if let Some(enc) = self.job.encoding {
            if self.assembles() {
                let what = self.t.name.clone();
                let whole = std::mem::take(&mut self.whole);
                exec.encode_part(self.job, enc, 0, &whole, None, &what, &mut self.error)?;
            }
            exec.record_error(self.job, &self.error);
            return Ok(());
        }
        if self.to_output == Transform::Identity {
            return Ok(());
        }
        let src = SrcTensor {
            dtype: DType::F32,
            shape: &self.t.shape,
            bytes: bytemuck::cast_slice(&self.whole),
        };
        exec.convert_bands(self.job, self.to_output, src)
    }
}

/// Checks a merged band without a branch per element, so the loop vectorises; `Err(i)`
/// names the first non-finite element.
fn check_finite(merged: &[f32]) -> Result<(), usize> {
    if merged.iter().fold(true, |ok, x| ok & x.is_finite()) {
        return Ok(());
    }
    Err(merged.iter().position(|x| !x.is_finite()).unwrap_or(0))
}

/// One contribution's tensors, loaded.
struct Loaded {
    contribution: Contribution,
    params: BTreeMap<ParamRole, Vec<f32>>,
    xs: Option<Rc<XsBases>>,
}

impl Loaded {
    fn get(&self, role: ParamRole) -> &[f32] {
        // Present and of the right size: checked when the merge was planned.
        self.params.get(&role).map_or(&[][..], Vec::as_slice)
    }

    /// The formula of this contribution's kind (spec sa3_lora.md §1.4, conventions.md §2.4).
    fn update(&self) -> Update<'_> {
        let c = &self.contribution;
        let (sigma, rank) = (c.sigma, c.rank);
        let full = |role| Update::Full {
            diff: self.get(role),
            scale: sigma,
        };
        let form = match c.kind {
            // σ is already inside the LyCORIS delta (`merge::lycoris`).
            Kind::Loha | Kind::Lokr | Kind::DiagOft | Kind::Boft | Kind::Glora | Kind::Ia3 => {
                return Update::Full {
                    diff: self.get(ParamRole::Diff),
                    scale: 1.0,
                };
            }
            Kind::Diff => return full(ParamRole::Diff),
            Kind::DiffBias => return full(ParamRole::DiffBias),
            Kind::LoraBias => return full(ParamRole::LoraBias),
            Kind::Lora | Kind::LoraXs => Form::Additive,
            Kind::PeftDora => Form::Rows {
                m: self.get(ParamRole::Magnitude),
                eps: 0.0,
            },
            Kind::DoraRows | Kind::DoraRowsXs => Form::Rows {
                m: self.get(ParamRole::Magnitude),
                eps: SA3_EPS,
            },
            Kind::DoraCols | Kind::DoraColsXs => Form::Cols {
                m: self.get(ParamRole::Magnitude),
            },
            Kind::Bora | Kind::BoraXs => Form::Bora {
                m_r: self.get(ParamRole::MagnitudeR),
                m_c: self.get(ParamRole::MagnitudeC),
            },
        };
        let factors = match &self.xs {
            Some(b) => Factors::Xs {
                U: &b.U,
                M: self.get(ParamRole::M),
                V: &b.V,
                rank,
            },
            None => Factors::BA {
                B: self.get(ParamRole::B),
                A: self.get(ParamRole::A),
                rank,
            },
        };
        Update::LowRank {
            factors,
            sigma,
            form,
        }
    }
}

/// `f(W0) − W0` of a LyCORIS entry on the whole target (`merge::lycoris`, with the entry's
/// σ), from its loaded tensors. The outer error is the module's, the inner a read of W0.
fn lycoris_delta(
    t: &Target,
    rows: &BaseRows<'_>,
    entry: &crate::adapter::Entry,
    params: &BTreeMap<ParamRole, Vec<f32>>,
) -> Result<Result<Vec<f32>, MergeError>, LycorisError> {
    let m = module_of(entry, params)?;
    let mut W0 = vec![0.0f32; t.out * t.inp];
    if let Err(e) = rows.read(0, t.out, &mut W0) {
        return Ok(Err(e));
    }
    delta_scaled(&m, &entry.module, &W0, &t.shape, entry.scale).map(Ok)
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

/// The bytes of one layer of a stacked tensor (or the whole tensor).
fn layer_bytes<'a>(
    view: &TensorView<'a>,
    layer: Option<usize>,
    slice_shape: &[usize],
) -> Result<&'a [u8], MergeError> {
    let len = slice_shape.iter().product::<usize>() * view.dtype.size().unwrap_or(0);
    let start = layer.unwrap_or(0) * len;
    view.bytes
        .get(start..start + len)
        .ok_or_else(|| MergeError::Convert {
            tensor: view.name.to_string(),
            reason: format!(
                "holds {} bytes; layer {layer:?} of shape {slice_shape:?} needs {}",
                view.bytes.len(),
                start + len
            ),
        })
}

/// Bands of rows of a base tensor as f32 in the (out, in') PyTorch order.
enum BaseRows<'a> {
    /// Stored in PyTorch layout (possibly one layer of a stack, possibly MLX Conv1d rows):
    /// widened band by band.
    Stored {
        view: TensorView<'a>,
        bytes: &'a [u8],
        path: &'a std::path::Path,
        inp: usize,
        order: RowOrder,
        size: usize,
    },
    /// Stored transposed (NNX kernels): brought into PyTorch layout whole, as f32.
    Canonical { data: Vec<f32>, inp: usize },
}

impl<'a> BaseRows<'a> {
    fn new(t: &Target, src: &TensorRef<'a>, job: &Job) -> Result<BaseRows<'a>, MergeError> {
        let view = src.view;
        let size = view.dtype.size().ok_or_else(|| MergeError::Convert {
            tensor: t.name.clone(),
            reason: format!("dtype {} cannot be merged", view.dtype),
        })?;
        let bytes = layer_bytes(&view, t.layer, &job.stored_shape)?;
        if t.to_canonical == Transform::Identity {
            return Ok(BaseRows::Stored {
                view,
                bytes,
                path: src.file.path(),
                inp: t.inp,
                order: t.rows,
                size,
            });
        }
        let mut raw = vec![0u8; t.out * t.inp * 4];
        let stored = SrcTensor {
            dtype: view.dtype,
            shape: &job.stored_shape,
            bytes,
        };
        crate::model::transform::convert(t.to_canonical, stored, DType::F32, &mut raw).map_err(
            |e| MergeError::Convert {
                tensor: t.name.clone(),
                reason: e.to_string(),
            },
        )?;
        Ok(BaseRows::Canonical {
            data: raw
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            inp: t.inp,
        })
    }

    /// The whole (`out` rows) base weight for `merge_whole`, and the dtype of output bytes
    /// the backend can write as they are. `output` is the job's dtype when the output keeps
    /// the stored layout: a BF16/F16/F32 output of BF16/F16/F32 rows stored in PyTorch order
    /// (a whole tensor or one layer of a stack) is widened and rounded on the backend
    /// (`Some(output)`). Anything else (MLX Conv1d rows, NNX kernels, other dtypes, a
    /// permuting output layout) is read into `host` as f32 and merged to F32 for the caller
    /// to lay out and round (`None`).
    fn whole<'s>(
        &'s self,
        out: usize,
        output: Option<DType>,
        host: &'s mut Vec<f32>,
    ) -> Result<(BaseWeight<'s>, Option<DType>), MergeError> {
        let on_backend = |d: DType| matches!(d, DType::BF16 | DType::F16 | DType::F32);
        if let (
            Some(output),
            BaseRows::Stored {
                view,
                bytes,
                order: RowOrder::Torch,
                ..
            },
        ) = (output, self)
            && on_backend(output)
            && on_backend(view.dtype)
        {
            let base = BaseWeight::Stored {
                dtype: view.dtype,
                bytes,
            };
            return Ok((base, Some(output)));
        }
        let inp = match self {
            BaseRows::Stored { inp, .. } | BaseRows::Canonical { inp, .. } => *inp,
        };
        host.resize(out * inp, 0.0);
        self.read(0, out, host)?;
        Ok((BaseWeight::F32(host), None))
    }

    /// The stored tensor itself when its bytes are exactly the PyTorch-layout matrix.
    fn direct_view(&self) -> Option<TensorView<'a>> {
        match self {
            BaseRows::Stored {
                view,
                bytes,
                order: RowOrder::Torch,
                ..
            } if bytes.len() == view.bytes.len() => Some(*view),
            _ => None,
        }
    }

    /// Fills `dst` ((n, inp) f32) with rows `r0 .. r0 + n`.
    fn read(&self, r0: usize, n: usize, dst: &mut [f32]) -> Result<(), MergeError> {
        let (view, bytes, path, inp, order, size) = match self {
            BaseRows::Canonical { data, inp } => {
                dst.copy_from_slice(&data[r0 * inp..(r0 + n) * inp]);
                return Ok(());
            }
            BaseRows::Stored {
                view,
                bytes,
                path,
                inp,
                order,
                size,
            } => (view, bytes, path, *inp, *order, *size),
        };
        let band = &bytes[r0 * inp * size..(r0 + n) * inp * size];
        let widen = |dst: &mut [f32]| {
            widen_to_f32(view.dtype, band, dst).map_err(|e| {
                MergeError::Read(ReadError::Tensor {
                    path: path.to_path_buf(),
                    tensor: view.name.to_string(),
                    reason: e.to_string(),
                })
            })
        };
        match order {
            RowOrder::Torch => widen(dst),
            RowOrder::MlxConv { k, cin } => {
                // Stored row (k, cin) → PyTorch row (cin, k).
                let mut tmp = vec![0.0f32; dst.len()];
                widen(&mut tmp)?;
                for (d, s) in dst.chunks_exact_mut(inp).zip(tmp.chunks_exact(inp)) {
                    for (j, sj) in s.chunks_exact(cin).enumerate() {
                        for (i, &x) in sj.iter().enumerate() {
                            d[i * k + j] = x;
                        }
                    }
                }
                Ok(())
            }
        }
    }

    /// Merged rows in the base's row order (the MLX permutation undone).
    fn to_stored_order<'b>(&self, merged: &'b [f32]) -> std::borrow::Cow<'b, [f32]> {
        let BaseRows::Stored {
            inp,
            order: RowOrder::MlxConv { k, cin },
            ..
        } = *self
        else {
            return std::borrow::Cow::Borrowed(merged);
        };
        let mut out = vec![0.0f32; merged.len()];
        for (o, m) in out.chunks_exact_mut(inp).zip(merged.chunks_exact(inp)) {
            for i in 0..cin {
                for j in 0..k {
                    o[j * cin + i] = m[i * k + j];
                }
            }
        }
        std::borrow::Cow::Owned(out)
    }
}
