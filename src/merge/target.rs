//! Computing one merged target: `W' = W0 + Σ w·(f(W0) − W0)`, in bands of rows on the CPU
//! or whole on a backend lane (`--device cuda`, and the reference route), checked against
//! what the output holds (NaN, ±inf, beyond its dtype: where the first such value came from
//! is found, `Merger::attribute`) and rounded once into the job's slot.
//!
//! Owns: [`Merger`], the merge engine the executor plugs in (`pipeline::TargetWriter`: a
//! target computed on the route `pipeline::Compute` names; `pipeline::TargetValues`: the
//! merged f32 values `extract --adapter` and bake's unmerged reference read), loading an
//! entry's tensors (for a LyCORIS entry: its whole `f(W0) − W0` from `merge::lycoris`, added
//! like a diff, since OFT/BOFT mix rows across bands), `w` and σ of a contribution, the band
//! buffers, and where merged bands go (`Emit`: narrowed or encoded straight into the output,
//! or assembled whole for a permuting layout). Does not own: the
//! formulas (`merge::math`) or the whole-tensor program (`merge::device`), the job loop and
//! the writes (`pipeline::exec`), reading base rows (`pipeline::base_rows`), the -xs bases
//! (`merge::xs`).
//!
//! Memory: beyond a worker's bands, the factors of the target it works on, and for -xs
//! kinds the target's SVD bases (the SVD itself needs the whole weight), or for LyCORIS
//! kinds the target's whole W0 and delta (f32). A merged tensor written through a permuting
//! layout (`--layout nnx`) is assembled whole (f32) before it is transposed. So is every
//! target on the whole-tensor route, at most `pipeline::compute::MAX_LANES` at a time (host and
//! device memory: W0, the accumulator, V and the output bytes of one tensor per lane). A
//! merged target whose encoding needs the whole tensor's `max|W|` first (scaled fp8, comfy
//! fp8, NVFP4) is not assembled: its bands are computed twice, once for the `max|W|` and once
//! to encode (the same bits each time), and an encoding whose bands start on 128-row tiles
//! (NVFP4, MXFP8) holds back at most a tile of merged rows.

#![allow(non_snake_case)]

use std::collections::BTreeMap;
use std::rc::Rc;

use super::device::merge_whole;
use super::error::MergeError;
use super::math::{Factors, Form, SA3_EPS, Scratch, Update, add_contribution, column_scales};
use super::options::{DoraStrength, MergeOptions};
use super::report::SvdReport;
use super::xs::{BasesOn, SvdCounters, xs_bases};
use crate::adapter::lycoris::{LycorisError, fitted};
use crate::adapter::{Kind, ParamRole};
use crate::backend::Backend;
use crate::backend::CpuBackend;
use crate::codec::dtype::{Unheld, all_finite_bytes, all_held, held, held_limit, narrow_from_f32};
use crate::gpu::CudaBackend;
use crate::io::{DType, TensorRef};
use crate::linalg::XsBases;
use crate::linalg::{SvdCache, SvdEngine};
use crate::model::transform::{SrcTensor, Transform};
use crate::pipeline::base_rows::BaseRows;
use crate::pipeline::compute::{MAX_LANES, reference_lanes};
use crate::pipeline::exec::{Exec, band_rows, stored};
use crate::pipeline::{Compute, TargetValues, TargetWriter};
use crate::pipeline::{Contribution, Job, Lanes, PipelineError, Plan, Target};
use crate::pipeline::{Origin, UnheldValues};
use crate::quant::encode::{AmaxPass, Encoding, ErrorSum};

/// The merge engine of one plan: computes each target on the route `compute` names, its
/// -xs bases through the SVD cache when one is given.
pub struct Merger<'a> {
    plan: &'a Plan<'a>,
    dora_strength: DoraStrength,
    compute: &'a Compute,
    svd_cache: Option<&'a SvdCache>,
    route: Route,
    /// The engine of the -xs bases on this route (`Compute::svd_engine`).
    svd_engine: SvdEngine,
    /// Shared by the mergers of a release matrix on the band route (`Merger::alongside`):
    /// a basis computed once counts once in every output's report.
    svd: std::sync::Arc<SvdCounters>,
}

/// Where a [`Merger`] computes: row bands on the worker, or whole tensors on lanes.
enum Route {
    Bands,
    Cuda(Lanes<CudaBackend>),
    Reference(Lanes<CpuBackend>),
}

impl<'a> Merger<'a> {
    /// The merge of `plan`, its targets computed where `compute` says.
    pub fn new(
        plan: &'a Plan<'a>,
        options: &MergeOptions,
        compute: &'a Compute,
        svd_cache: Option<&'a SvdCache>,
    ) -> Merger<'a> {
        let route = match compute {
            Compute::Cpu => Route::Bands,
            Compute::Cuda(device) => {
                let device = device.clone();
                Route::Cuda(Lanes::new(MAX_LANES, move || device.backend()))
            }
            Compute::Reference => Route::Reference(reference_lanes()),
        };
        Merger {
            plan,
            dora_strength: options.dora_strength,
            compute,
            svd_cache,
            route,
            svd_engine: compute.svd_engine(),
            svd: Default::default(),
        }
    }

    /// The merge of `plan`, another output of the same base and adapters as `self`'s in a
    /// release matrix: on the band route its -xs bases are counted with `self`'s, since a
    /// target is computed once for all of them (`pipeline::matrix`).
    pub fn alongside(&self, plan: &'a Plan<'a>, options: &MergeOptions) -> Merger<'a> {
        let mut m = Merger::new(plan, options, self.compute, self.svd_cache);
        if matches!(self.route, Route::Bands) {
            m.svd = self.svd.clone();
        }
        m
    }

    /// The merge of `plan` on the CPU band path with no SVD cache, for callers that use its
    /// values in memory ([`TargetValues`]: `extract --adapter`, bake's unmerged reference).
    pub fn values_only(plan: &'a Plan<'a>, options: &MergeOptions) -> Merger<'a> {
        Merger::new(plan, options, &Compute::Cpu, None)
    }

    /// The SVD line of the report: what the -xs bases cost so far, and their engine.
    pub fn svd_report(&self) -> SvdReport {
        self.svd.report(self.svd_cache.is_some(), &self.svd_engine)
    }

    /// Where this route computes -xs bases.
    fn bases_on(&self) -> BasesOn<'_> {
        match &self.route {
            Route::Bands => BasesOn::Worker,
            Route::Cuda(lanes) => BasesOn::Cuda(lanes, self.compute.label()),
            Route::Reference(lanes) => BasesOn::Reference(lanes, self.compute.label()),
        }
    }

    /// Values of target `t` (read through `job` from `src`) that its output cannot hold:
    /// `merged`, found in the merged values, with the origin of the first; `encoded`, found
    /// by a quantized output's encoder (a superset of `merged`'s: it sees the same values,
    /// and also the blocks whose scale overflows). Refused unless the plan allows them.
    fn found(
        &self,
        exec: &Exec<'_>,
        job: &Job,
        t: &Target,
        src: &TensorRef<'_>,
        merged: Option<(Unheld, Origin)>,
        encoded: Option<Unheld>,
    ) -> Result<(), MergeError> {
        let (found, origin) = match (merged, encoded) {
            (None, None) => return Ok(()),
            (Some((_, origin)), Some(e)) => (e, origin),
            (Some((m, origin)), None) => (m, origin),
            (None, Some(e)) => (e, self.contributors(t)),
        };
        exec.found(self.finding(job, t, src, found, origin))?;
        Ok(())
    }

    /// The finding of `found` in target `t`, with its origin.
    fn finding(
        &self,
        job: &Job,
        t: &Target,
        src: &TensorRef<'_>,
        found: Unheld,
        origin: Origin,
    ) -> UnheldValues {
        let (into, dtype) = Exec::written_as(job);
        let inp = t.inp.max(1);
        UnheldValues {
            file: src.file.path().to_path_buf(),
            tensor: t.name.clone(),
            output: (job.output != t.name).then(|| job.output.clone()),
            into,
            dtype,
            found,
            at: Some((found.first / inp, found.first % inp)),
            origin,
        }
    }

    /// Every adapter contributing to `t`, as an origin (when no single one can be named).
    fn contributors(&self, t: &Target) -> Origin {
        Origin::Merged {
            adapters: (t.contributions.iter())
                .map(|c| (self.plan.adapters[c.adapter].set.path.clone(), c.strength))
                .collect(),
        }
    }

    /// Where element `i` of the merged band of rows `r0 .. r0 + n` of `t` that `limit`
    /// refuses comes from: the base, when its own value already is one; else the first
    /// contribution whose addition (in the plan's order, the order the band was summed in)
    /// takes it there. The slow path of a refusal: the band is read and summed again.
    #[allow(clippy::too_many_arguments)]
    fn attribute(
        &self,
        t: &Target,
        rows: &BaseRows<'_>,
        updates: &[(Update<'_>, f64)],
        col_scales: &[Option<Vec<f64>>],
        (r0, n, i): (usize, usize, usize),
        limit: f32,
        scratch: &mut Scratch,
    ) -> Result<Origin, MergeError> {
        let mut D = vec![0f32; n * t.inp];
        rows.read(r0, n, &mut D)?;
        if !held(D[i], limit) {
            return Ok(Origin::Base);
        }
        let W0 = D.clone();
        for (c, ((u, w), cs)) in (t.contributions.iter()).zip(updates.iter().zip(col_scales)) {
            add_contribution(u, *w, cs.as_deref(), &W0, r0, n, t.inp, &mut D, scratch);
            if !held(D[i], limit) {
                return Ok(Origin::Merge {
                    adapter: self.plan.adapters[c.adapter].set.path.clone(),
                    strength: c.strength,
                });
            }
        }
        // Not reached: the same steps summed the band that was refused.
        Ok(self.contributors(t))
    }
}

/// The magnitude the merged values of `job` must stay below (`codec::dtype::held_limit`): the
/// output dtype's, or for an encoded output its plain dtype's; `+inf` (finite values) for
/// fp8 and the ggml block types, whose encoder checks what it cannot hold.
fn merged_limit(job: &Job) -> f32 {
    match job.encoding {
        None => held_limit(job.dtype),
        Some(crate::quant::encode::Encoding::Plain(d)) => held_limit(d),
        Some(_) => f32::INFINITY,
    }
}

impl TargetWriter for Merger<'_> {
    type Worker = TargetScratch;
    type Error = MergeError;

    fn worker(&self) -> TargetScratch {
        TargetScratch::default()
    }

    fn write_target(
        &self,
        exec: &Exec<'_>,
        scratch: &mut TargetScratch,
        job: &Job,
        target: &Target,
        src: &TensorRef<'_>,
    ) -> Result<(), MergeError> {
        match &self.route {
            Route::Bands => self.merge(exec, job, target, src, scratch),
            Route::Cuda(lanes) => self.merge_whole(exec, lanes, job, target, src),
            Route::Reference(lanes) => self.merge_whole(exec, lanes, job, target, src),
        }
    }

    type Shared = MergedTarget;

    /// On the band route: the whole merged tensor, computed band by band as a single run
    /// computes it (the same bits). The whole-tensor routes do not share.
    fn share(
        &self,
        scratch: &mut TargetScratch,
        job: &Job,
        t: &Target,
        src: &TensorRef<'_>,
    ) -> Result<Option<MergedTarget>, MergeError> {
        if !matches!(self.route, Route::Bands) {
            return Ok(None);
        }
        let p = self.prepare(job, t, src, &self.svd)?;
        let mut whole = vec![0f32; t.out * t.inp];
        let (into, limit) = (Some(&mut whole[..]), f32::INFINITY);
        let found = self.run_bands(&p, t, &mut scratch.math, into, limit, |_, _, _| Ok(()))?;
        Ok(Some(MergedTarget {
            whole,
            non_finite: found.is_some(),
        }))
    }

    /// Writes a target merged once (`shared`) into `job`'s output as [`Merger::merge`]
    /// writes it: the same bands handed to the same [`Emit`], its `max|W|` taken from the
    /// merged values first where the encoding needs it. Values the output cannot hold take
    /// the single run's path, which names where the first came from.
    fn write_shared(
        &self,
        exec: &Exec<'_>,
        scratch: &mut TargetScratch,
        job: &Job,
        t: &Target,
        src: &TensorRef<'_>,
        shared: &MergedTarget,
    ) -> Result<(), MergeError> {
        let limit = merged_limit(job);
        if shared.non_finite || !all_held(&shared.whole, limit) {
            return self.merge(exec, job, t, src, scratch);
        }
        let rows = BaseRows::new(t, src, job)?;
        let mut out = Emit::new(job, t)?;
        out.bytes = std::mem::take(&mut scratch.bytes);
        let bands = || held_bands(&shared.whole, t);
        if let Some(enc) = out.banded_encoding()
            && t.out > 0
            && t.inp > 0
        {
            out.assemble = false;
            if enc.needs_amax() {
                let mut pass = AmaxPass::default();
                for (_, d) in bands() {
                    pass.add(&rows.to_stored_order(d));
                }
                out.tensor_scale = pass.scale(enc, &t.name).map_err(PipelineError::from)?;
            }
        }
        let encoded;
        if out.assemble {
            (scratch.bytes, encoded) = out.finish_from(exec, &shared.whole)?;
        } else {
            for (r0, d) in bands() {
                out.band(exec, &rows, r0, d)?;
            }
            (scratch.whole, scratch.bytes, encoded) = out.finish(exec)?;
        }
        self.found(exec, job, t, src, None, encoded)
    }
}

/// What the workers together may hold of merged tensors kept between the two passes of an
/// encoding that needs the tensor's `max|W|` (`Merger::plan_encoding`): one tensor per
/// worker, a 14B attention projection (105 MB of f32) on two workers; above it (a 14B ffn
/// weight, or many workers) the second pass computes the merge again instead.
const HELD_MERGES_BYTES: usize = 512 << 20;

/// The bands of a merged (out, in') tensor held whole, as `Merger::run_bands` computes and
/// hands them on: (first row, values).
fn held_bands<'w>(whole: &'w [f32], t: &Target) -> impl Iterator<Item = (usize, &'w [f32])> {
    let rows = band_rows(t.inp);
    let n = rows * t.inp.max(1);
    (whole.chunks(n.max(1)).enumerate()).map(move |(b, d)| (b * rows, d))
}

/// A merged target computed once for every output of a release matrix
/// (`pipeline::matrix`): its (out, in') values in the order the bands compute them.
pub struct MergedTarget {
    whole: Vec<f32>,
    /// Did any value come out NaN or ±inf?
    non_finite: bool,
}

impl TargetValues for Merger<'_> {
    type Error = MergeError;

    fn target_values(&self, job: &Job, target: &Target) -> Result<Vec<f32>, MergeError> {
        self.merged_values(job, target)
    }
}

impl Merger<'_> {
    /// A target: `W' = W0 + Σ w·(f(W0) − W0)`, band by band, checked finite, rounded once.
    pub(super) fn merge(
        &self,
        exec: &Exec<'_>,
        job: &Job,
        t: &Target,
        src: &TensorRef<'_>,
        scratch: &mut TargetScratch,
    ) -> Result<(), MergeError> {
        let mut out = Emit::new(job, t)?;
        out.bytes = std::mem::take(&mut scratch.bytes);
        let math = &mut scratch.math;
        let limit = merged_limit(job);
        let p = self.prepare(job, t, src, &self.svd)?;
        let held = self.plan_encoding(&p, t, math, limit, &mut out, &mut scratch.whole)?;
        let was_held = held.is_some();
        let merged = match held {
            // The first pass kept the merged tensor: the encoding pass reads it.
            Some(found) if out.assemble => {
                out.whole = std::mem::take(&mut scratch.whole);
                found
            }
            Some(found) => {
                for (r0, d) in held_bands(&scratch.whole, t) {
                    out.band(exec, &p.rows, r0, d)?;
                }
                found
            }
            None if out.assemble => {
                // Merged in place, band by band, into the whole tensor the output needs (the
                // worker's buffer of the last one, so its pages are not faulted in again;
                // every element is overwritten).
                let mut whole = std::mem::take(&mut scratch.whole);
                whole.resize(t.out * t.inp, 0.0);
                let into = Some(&mut whole[..]);
                let found = self.run_bands(&p, t, math, into, limit, |_, _, _| Ok(()))?;
                out.whole = whole;
                found
            }
            None => self.run_bands(&p, t, math, None, limit, |rows, r0, D| {
                Ok(out.band(exec, rows, r0, D)?)
            })?,
        };
        let (whole, bytes, encoded) = out.finish(exec)?;
        scratch.bytes = bytes;
        // A tensor kept between the passes and not assembled stays in the worker's buffer.
        if !was_held || !whole.is_empty() {
            scratch.whole = whole;
        }
        self.found(exec, job, t, src, merged, encoded)
    }

    /// Lets `out` encode a non-streaming encoding band by band instead of assembling the
    /// merged tensor: for one that needs the tensor's `max|W|`, a first pass over the merged
    /// bands takes it. The encoding pass then reads the merged tensor the first pass kept in
    /// `keep` (returned: `Some` with the values the bands refused) when the workers can
    /// hold one each within [`HELD_MERGES_BYTES`], or computes the same bits again (`None`).
    /// A merge with values the output cannot hold (NaN, ±inf) is assembled whole, so the
    /// encoder sees and names them as it always has.
    #[allow(clippy::type_complexity)]
    fn plan_encoding(
        &self,
        p: &Prepared<'_>,
        t: &Target,
        math: &mut Scratch,
        limit: f32,
        out: &mut Emit<'_>,
        keep: &mut Vec<f32>,
    ) -> Result<Option<Option<(Unheld, Origin)>>, MergeError> {
        let Some(enc) = out.banded_encoding() else {
            return Ok(None);
        };
        if t.out == 0 || t.inp == 0 {
            return Ok(None); // no band: encoded once, whole, as an empty tensor always was
        }
        out.assemble = false;
        if !enc.needs_amax() {
            return Ok(None);
        }
        let bytes = (t.out * t.inp).saturating_mul(4);
        let hold = bytes.saturating_mul(rayon::current_num_threads()) <= HELD_MERGES_BYTES;
        let into = match hold {
            true => {
                keep.resize(t.out * t.inp, 0.0);
                Some(&mut keep[..])
            }
            false => None,
        };
        let mut pass = AmaxPass::default();
        let unheld = self.run_bands(p, t, math, into, limit, |rows, _, D| {
            pass.add(&rows.to_stored_order(D));
            Ok(())
        })?;
        match unheld {
            None => out.tensor_scale = pass.scale(enc, &t.name).map_err(PipelineError::from)?,
            Some(_) => out.assemble = true,
        }
        Ok(hold.then_some(unheld))
    }

    /// The merged f32 values of target `t` (read through `job`) in PyTorch layout, band by
    /// band as a merge computes them, checked finite, before any rounding to the output
    /// dtype: what an f32 merge in the stored layout writes. `extract --adapter` reads its
    /// tuned model this way instead of from a written merge.
    pub(super) fn merged_values(&self, job: &Job, t: &Target) -> Result<Vec<f32>, MergeError> {
        let src = stored(self.plan, job)?;
        let to_output = Emit::new(job, t)?.to_output;
        let mut whole = Vec::with_capacity(t.out * t.inp);
        let mut scratch = Scratch::default();
        let limit = f32::INFINITY;
        let found = self.merge_bands(
            job,
            t,
            &src,
            &mut scratch,
            &self.svd,
            None,
            limit,
            |rows, _, D| {
                match to_output {
                    Transform::Identity => whole.extend_from_slice(&rows.to_stored_order(D)),
                    _ => whole.extend_from_slice(D),
                }
                Ok(())
            },
        )?;
        // Values computed on are never allowed to be non-finite (nothing rounds them).
        if let Some((found, origin)) = found {
            let u = self.finding(job, t, &src, found, origin);
            return Err(PipelineError::from(u).into());
        }
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
            PipelineError::Convert {
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
    /// (first row, values) to `band`; with `whole` (the (out, in') tensor), each band is
    /// computed in its place there instead of in a buffer of its own. Each band is checked
    /// against `limit` (`codec::dtype::all_held`, one vectorised pass over the band just
    /// computed); returns the values it refuses, numbered in the (out, in') view, with the
    /// origin of the first (`Merger::attribute`). They are handed on as they are.
    #[allow(clippy::too_many_arguments)]
    fn merge_bands(
        &self,
        job: &Job,
        t: &Target,
        src: &TensorRef<'_>,
        scratch: &mut Scratch,
        svd: &SvdCounters,
        whole: Option<&mut [f32]>,
        limit: f32,
        band: impl FnMut(&BaseRows<'_>, usize, &[f32]) -> Result<(), MergeError>,
    ) -> Result<Option<(Unheld, Origin)>, MergeError> {
        let prepared = self.prepare(job, t, src, svd)?;
        self.run_bands(&prepared, t, scratch, whole, limit, band)
    }

    /// What every band of target `t` is computed from: its base rows, its contributions'
    /// factors and their column scales (a pass over the base for DoRA).
    fn prepare<'s>(
        &self,
        job: &Job,
        t: &Target,
        src: &TensorRef<'s>,
        svd: &SvdCounters,
    ) -> Result<Prepared<'s>, MergeError> {
        let rows = BaseRows::new(t, src, job)?;
        let loaded = self.load_factors(t, &rows, svd)?;
        let band_len = band_rows(t.inp);
        let col_scales = weighted_updates(&loaded)
            .iter()
            .map(|(u, _)| column_scales(u, t.out, t.inp, band_len, |r0, n, d| rows.read(r0, n, d)))
            .collect::<Result<Vec<_>, PipelineError>>()?;
        Ok(Prepared {
            rows,
            loaded,
            col_scales,
        })
    }

    /// The band loop of [`Merger::merge_bands`] over what [`Merger::prepare`] loaded; run
    /// twice for an encoding that needs the merged tensor's `max|W|` first (`Merger::merge`),
    /// each run computing the same bits.
    fn run_bands(
        &self,
        p: &Prepared<'_>,
        t: &Target,
        scratch: &mut Scratch,
        mut whole: Option<&mut [f32]>,
        limit: f32,
        mut band: impl FnMut(&BaseRows<'_>, usize, &[f32]) -> Result<(), MergeError>,
    ) -> Result<Option<(Unheld, Origin)>, MergeError> {
        let (rows, col_scales) = (&p.rows, &p.col_scales);
        let updates = weighted_updates(&p.loaded);
        let band_len = band_rows(t.inp);
        let mut band_buf = Band::default();
        let mut own = Vec::new();
        let (mut found, mut origin) = (None, None);
        let mut r0 = 0;
        while r0 < t.out {
            let n = band_len.min(t.out - r0);
            let D: &mut [f32] = match whole.as_deref_mut() {
                Some(w) => &mut w[r0 * t.inp..(r0 + n) * t.inp],
                None => {
                    own.resize(n * t.inp, 0.0);
                    &mut own
                }
            };
            band_buf.merged(D, rows, &updates, col_scales, t, r0, scratch)?;
            if !all_held(D, limit) {
                let part = Unheld::scan(D, limit, r0 * t.inp);
                if let (None, Some(p)) = (&origin, part) {
                    let at = (r0, n, p.first - r0 * t.inp);
                    let o = self.attribute(t, rows, &updates, col_scales, at, limit, scratch)?;
                    origin = Some(o);
                }
                Unheld::add(&mut found, part);
            }
            band(rows, r0, D)?;
            r0 += n;
        }
        Ok(found.zip(origin))
    }

    /// A target computed whole on a lane of `lanes` (`merge::device`), then written as the
    /// band path writes a band: straight into the output when the output keeps the stored
    /// layout and dtype is BF16/F16/F32, else through [`Emit`] from the f32 sum.
    pub(super) fn merge_whole<B: Backend>(
        &self,
        exec: &Exec<'_>,
        lanes: &Lanes<B>,
        job: &Job,
        t: &Target,
        src: &TensorRef<'_>,
    ) -> Result<(), MergeError> {
        let svd = &self.svd;
        let device = |e| MergeError::Device {
            tensor: t.name.clone(),
            device: self.compute.label(),
            source: e,
        };
        let rows = BaseRows::new(t, src, job)?;
        let loaded = self.load_factors(t, &rows, svd)?;
        let updates = weighted_updates(&loaded);
        let mut out = Emit::new(job, t)?;
        let keeps_layout = out.direct();
        let limit = merged_limit(job);
        // The whole tensor is read, merged and (when it needs no layout work) written while
        // the lane is held, so at most one whole tensor per lane is resident. Its values are
        // checked as the band route checks them: the sum's on the device, the bytes written
        // (or the f32 sum against the output's limit) here.
        let (merged, refused) = lanes
            .with(|b| {
                let mut host = Vec::new();
                let output = keeps_layout.then_some(job.dtype);
                let (base, final_dtype) = rows.whole(t.out, output, &mut host)?;
                let dtype = final_dtype.unwrap_or(DType::F32);
                let mut bytes = vec![0u8; t.out * t.inp * dtype.element_bytes()];
                let non_finite = merge_whole(b, base, (t.out, t.inp), &updates, dtype, &mut bytes)
                    .map_err(device)?;
                if final_dtype.is_some() {
                    let refused = non_finite.is_some() || !all_finite_bytes(dtype, &bytes);
                    exec.write(job, 0, &bytes)?;
                    return Ok::<_, MergeError>((None, refused));
                }
                let f32s = bytes.chunks_exact(4);
                let merged = (f32s.map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
                    .collect::<Vec<f32>>();
                let refused = non_finite.is_some() || !all_held(&merged, limit);
                Ok((Some(merged), refused))
            })
            .map_err(device)??;
        // The f32 sum, for the MLX row order or a transposing output layout.
        let mut encoded = None;
        if let Some(merged) = merged {
            out.band(exec, &rows, 0, &merged)?;
            (_, _, encoded) = out.finish(exec)?;
        }
        // The slow path of a refusal: the band route finds the same values (the routes give
        // the same bits) and names where the first came from.
        let found = match refused {
            true => {
                let mut scratch = Scratch::default();
                let none = None;
                self.merge_bands(
                    job,
                    t,
                    src,
                    &mut scratch,
                    svd,
                    none,
                    limit,
                    |_, _, _| Ok(()),
                )?
            }
            false => None,
        };
        self.found(exec, job, t, src, found, encoded)
    }

    /// The tensors of every contribution to `t`, and the -xs bases (one SVD per rank, on the
    /// route's engine on a miss).
    fn load_factors(
        &self,
        t: &Target,
        rows: &BaseRows<'_>,
        svd: &SvdCounters,
    ) -> Result<Vec<Loaded>, MergeError> {
        let mut bases: BTreeMap<usize, Rc<XsBases>> = BTreeMap::new();
        let mut loaded = Vec::with_capacity(t.contributions.len());
        for c in &t.contributions {
            let set = &self.plan.adapters[c.adapter].set;
            let entry = &set.entries[c.entry];
            let mut params = BTreeMap::new();
            for (&role, src) in &entry.params {
                params.insert(role, set.load_released(src).map_err(PipelineError::from)?);
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
                        let by = (&self.svd_engine, &self.bases_on());
                        let b = Rc::new(xs_bases(self.svd_cache, svd, by, t, rows, c.rank)?);
                        bases.insert(c.rank, b.clone());
                        b
                    }
                };
                Some(b)
            } else {
                None
            };
            let (weight, sigma) = weight_and_sigma(c, self.dora_strength);
            loaded.push(Loaded {
                contribution: c.clone(),
                weight,
                sigma,
                params,
                xs,
            });
        }
        Ok(loaded)
    }
}

/// What a worker of the band route keeps between targets: the GEMM scratch, the buffer a
/// target written through a permuting layout is assembled in, and the bytes it is rounded
/// to (or a band is).
#[derive(Default)]
pub struct TargetScratch {
    math: Scratch,
    whole: Vec<f32>,
    bytes: Vec<u8>,
}

/// The buffer of one band besides the merged weight itself: `W0`, for the normalised forms.
#[derive(Default)]
struct Band {
    W0: Vec<f32>,
}

impl Band {
    /// Fills `D` ((n, in'), `n = D.len() / in'`) with rows `r0 .. r0 + n` of
    /// `W0 + Σ w·(f(W0) − W0)`, contributions in the plan's order.
    #[allow(clippy::too_many_arguments)]
    fn merged(
        &mut self,
        D: &mut [f32],
        rows: &BaseRows<'_>,
        updates: &[(Update<'_>, f64)],
        col_scales: &[Option<Vec<f64>>],
        t: &Target,
        r0: usize,
        scratch: &mut Scratch,
    ) -> Result<(), MergeError> {
        // Linear and full-tensor contributions only add into the band; the normalised ones
        // also need W0 on its own.
        let keep_w0 = updates.iter().any(|(u, _)| u.normalisation().is_some());
        let n = D.len() / t.inp.max(1);
        rows.read(r0, n, D)?;
        self.W0.clear();
        if keep_w0 {
            self.W0.extend_from_slice(D);
        }
        for ((u, w), cs) in updates.iter().zip(col_scales) {
            add_contribution(u, *w, cs.as_deref(), &self.W0, r0, n, t.inp, D, scratch);
        }
        Ok(())
    }
}

/// Where merged bands go: narrowed (or encoded, for a quantized output) straight into the
/// output when the output layout is the PyTorch layout (or the MLX row order), else
/// assembled whole and converted at the end. An encoding that needs the tensor's `max|W|`
/// gets it from a first pass (`Merger::merge`); on the whole-tensor route, or when that
/// `max|W|` is not finite, the tensor is assembled and encoded at the end.
struct Emit<'a> {
    job: &'a Job,
    t: &'a Target,
    to_output: Transform,
    bytes: Vec<u8>,
    whole: Vec<f32>,
    error: ErrorSum,
    /// Values a quantized output's encoder could not hold.
    found: Option<Unheld>,
    /// The merged tensor is assembled whole before it is written: a permuting layout, or an
    /// encoding that does not stream (unless `Merger::merge` streams it in two passes).
    assemble: bool,
    /// The per-tensor scale every band is encoded with (`Encoding::needs_amax`).
    tensor_scale: Option<f32>,
    /// Merged rows not encoded yet, from row `pending_r0`: an encoding whose bands start on
    /// a multiple of `Encoding::row_align` rows.
    pending: Vec<f32>,
    pending_r0: usize,
}

impl<'a> Emit<'a> {
    /// Where the merged rows of `t` go for `job`.
    fn new(job: &'a Job, t: &'a Target) -> Result<Emit<'a>, PipelineError> {
        // PyTorch layout → output layout; Identity for every base stored in PyTorch layout.
        let to_output = t
            .to_canonical
            .inverse()
            .then(job.transform, t.shape.len())
            .map_err(|e| PipelineError::Convert {
                tensor: t.name.clone(),
                reason: e.to_string(),
            })?;
        if job.encoding.is_some() && to_output != Transform::Identity {
            return Err(PipelineError::Internal(format!(
                "`{}`: a quantized output of a permuted layout",
                t.name
            )));
        }
        let streams = job.encoding.is_none_or(|e| e.streams());
        Ok(Emit {
            job,
            t,
            to_output,
            bytes: Vec::new(),
            whole: Vec::new(),
            error: ErrorSum::default(),
            found: None,
            assemble: to_output != Transform::Identity || !streams,
            tensor_scale: None,
            pending: Vec::new(),
            pending_r0: 0,
        })
    }

    /// The encoding, when it does not stream but can be encoded in bands of the stored
    /// layout (its scale taken first, its bands aligned).
    fn banded_encoding(&self) -> Option<Encoding> {
        let enc = self.job.encoding?;
        (self.to_output == Transform::Identity && !enc.streams()).then_some(enc)
    }

    /// Encodes merged rows `r0 ..` (stored order) into the output, holding back the rows
    /// past the last whole multiple of the encoding's `row_align` until more come or
    /// `last`.
    fn encode_rows(
        &mut self,
        exec: &Exec<'_>,
        enc: Encoding,
        r0: usize,
        stored: &[f32],
        last: bool,
    ) -> Result<(), PipelineError> {
        let inp = self.t.inp.max(1);
        let align = enc.row_align();
        if align == 1 && self.pending.is_empty() {
            let (first, what) = (r0 * inp, &self.t.name);
            let ts = self.tensor_scale;
            let part = exec.encode_part(self.job, enc, first, stored, ts, what, &mut self.error)?;
            Unheld::add(&mut self.found, part);
            return Ok(());
        }
        let mut pending = std::mem::take(&mut self.pending);
        if pending.is_empty() {
            self.pending_r0 = r0;
        }
        pending.extend_from_slice(stored);
        let rows = pending.len() / inp;
        let ready = if last { rows } else { rows / align * align };
        if ready > 0 || (last && !pending.is_empty()) {
            let n = if last { pending.len() } else { ready * inp };
            let (first, what) = (self.pending_r0 * inp, &self.t.name);
            let part = exec.encode_part(
                self.job,
                enc,
                first,
                &pending[..n],
                self.tensor_scale,
                what,
                &mut self.error,
            )?;
            Unheld::add(&mut self.found, part);
            pending.drain(..n);
            self.pending_r0 += ready;
        }
        self.pending = pending;
        Ok(())
    }

    /// Are merged values written as the backend rounds them (a plain dtype, stored layout)?
    fn direct(&self) -> bool {
        self.to_output == Transform::Identity && self.job.encoding.is_none()
    }

    fn band(
        &mut self,
        exec: &Exec<'_>,
        rows: &BaseRows<'_>,
        r0: usize,
        D: &[f32],
    ) -> Result<(), PipelineError> {
        if self.assemble {
            self.whole.extend_from_slice(D);
            return Ok(());
        }
        let stored = rows.to_stored_order(D);
        if let Some(enc) = self.job.encoding {
            return self.encode_rows(exec, enc, r0, &stored, false);
        }
        self.bytes
            .resize(stored.len() * self.job.dtype.element_bytes(), 0);
        narrow_from_f32(self.job.dtype, &stored, &mut self.bytes).map_err(|e| {
            PipelineError::Convert {
                tensor: self.t.name.clone(),
                reason: e.to_string(),
            }
        })?;
        exec.write(
            self.job,
            r0 * self.t.inp * self.job.dtype.element_bytes(),
            &self.bytes,
        )
    }

    /// Writes what was assembled, if anything; hands the assembly and byte buffers back for
    /// reuse, with the values a quantized output's encoder could not hold.
    #[allow(clippy::type_complexity)]
    fn finish(
        mut self,
        exec: &Exec<'_>,
    ) -> Result<(Vec<f32>, Vec<u8>, Option<Unheld>), PipelineError> {
        let whole = std::mem::take(&mut self.whole);
        let (bytes, found) = self.finish_from(exec, &whole)?;
        Ok((whole, bytes, found))
    }

    /// [`Emit::finish`] with `whole` as what was assembled (a release matrix's target,
    /// merged once and borrowed by every output: not copied); hands the byte buffer back,
    /// with the values a quantized output's encoder could not hold.
    fn finish_from(
        mut self,
        exec: &Exec<'_>,
        whole: &[f32],
    ) -> Result<(Vec<u8>, Option<Unheld>), PipelineError> {
        if let Some(enc) = self.job.encoding {
            if !self.assemble && !self.pending.is_empty() {
                self.encode_rows(exec, enc, self.pending_r0, &[], true)?;
            }
            if self.assemble {
                let what = self.t.name.clone();
                let part =
                    exec.encode_part(self.job, enc, 0, whole, None, &what, &mut self.error)?;
                Unheld::add(&mut self.found, part);
            }
            exec.record_error(self.job, &self.error);
            return Ok((std::mem::take(&mut self.bytes), self.found));
        }
        if self.to_output == Transform::Identity {
            return Ok((std::mem::take(&mut self.bytes), None));
        }
        // Rounded once to the output dtype first (contiguous, so it vectorises), then only
        // permuted: rounding each element commutes with moving it, and the permutation moves
        // half the bytes of the f32 tensor for a 16-bit output.
        let mut narrowed = std::mem::take(&mut self.bytes);
        narrowed.resize(whole.len() * self.job.dtype.element_bytes(), 0);
        narrow_from_f32(self.job.dtype, whole, &mut narrowed).map_err(|e| {
            PipelineError::Convert {
                tensor: self.t.name.clone(),
                reason: e.to_string(),
            }
        })?;
        let src = SrcTensor {
            dtype: self.job.dtype,
            shape: &self.t.shape,
            bytes: &narrowed,
        };
        // What the output cannot hold was found in the merged values, against the same
        // dtype's limit (`merged_limit`): the rounding and the permutation add nothing.
        let _ = exec.convert_bands(self.job, self.to_output, src, None)?;
        Ok((narrowed, None))
    }
}

/// What every band of one target is computed from (`Merger::prepare`).
struct Prepared<'a> {
    rows: BaseRows<'a>,
    loaded: Vec<Loaded>,
    /// Per contribution, DoRA's column scales.
    col_scales: Vec<Option<Vec<f64>>>,
}

/// Each loaded contribution's formula with its weight, in contribution order.
fn weighted_updates(loaded: &[Loaded]) -> Vec<(Update<'_>, f64)> {
    (loaded.iter()).map(|l| (l.update(), l.weight)).collect()
}

/// One contribution's tensors, loaded, with its `w` and σ.
struct Loaded {
    contribution: Contribution,
    /// `w` in `w·(f(W0) − W0)`.
    weight: f64,
    /// σ used inside `f` (times the strength in the PEFT DoRA mode).
    sigma: f64,
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
        let (sigma, rank) = (self.sigma, c.rank);
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

/// `w` and σ of a contribution: the strength is `w`, except that with
/// [`DoraStrength::Peft`] it moves inside the norm of the normalised kinds (`w = 1`,
/// σ = a·scale); for every other kind the two modes are the same formula.
fn weight_and_sigma(c: &Contribution, dora_strength: DoraStrength) -> (f64, f64) {
    if dora_strength == DoraStrength::Peft && c.kind.is_normalised() {
        (1.0, c.strength * c.scale)
    } else {
        (c.strength, c.scale)
    }
}

/// `f(W0) − W0` of a LyCORIS entry on the whole target (`merge::lycoris`, with the entry's
/// σ), from the fit binding made (`Binding::lycoris`) and its loaded tensors. The outer
/// error is the module's (its tensors are not what was fitted), the inner a read of W0 or a
/// binding without a fit to this target.
fn lycoris_delta(
    t: &Target,
    rows: &BaseRows<'_>,
    entry: &crate::adapter::Entry,
    params: &BTreeMap<ParamRole, Vec<f32>>,
) -> Result<Result<Vec<f32>, PipelineError>, LycorisError> {
    let fit = match entry.binding.as_ref().and_then(|b| b.lycoris) {
        Some(fit) if (fit.out, fit.inp) == (t.out, t.inp) => fit,
        _ => {
            return Ok(Err(PipelineError::Internal(format!(
                "LyCORIS entry `{}` has no fit to `{}` ({} × {}) from binding",
                entry.module, t.name, t.out, t.inp
            ))));
        }
    };
    let m = fitted(entry, fit, params)?;
    let mut W0 = vec![0.0f32; t.out * t.inp];
    if let Err(e) = rows.read(0, t.out, &mut W0) {
        return Ok(Err(e));
    }
    Ok(Ok(super::lycoris::delta(&m, &W0, entry.scale)))
}
