//! The -xs bases of a merged target: U and V of a full, deterministic SVD of its base
//! weight, from the SVD cache when one is given, else computed by the route's engine: faer
//! on the worker (bands) or on a reference lane, cuSOLVER on a CUDA lane (see
//! `merge::device`, "-xs bases").
//!
//! Owns: [`BasesOn`] (where a miss is computed), [`xs_bases`] (cache lookup keyed by the
//! route's engine and the stored bytes when they are the PyTorch-layout matrix, else an f32
//! copy) and the counters of the merge report's SVD line ([`SvdCounters`]). Does not own: the
//! SVDs and sign convention (`linalg`, `gpu::svd`), the cache's file format
//! (`linalg::cache`), which engine a route has (`pipeline::Compute::svd_engine`).

#![allow(non_snake_case)]

use std::sync::atomic::{AtomicUsize, Ordering};

use faer::Par;

use super::error::MergeError;
use super::report::SvdReport;
use crate::backend::{Backend, BackendError, CpuBackend};
use crate::gpu::CudaBackend;
use crate::io::{DType, TensorView};
use crate::linalg::{CacheError, CacheOutcome, SvdCache, SvdEngine, XsBases};
use crate::pipeline::base_rows::BaseRows;
use crate::pipeline::{Lanes, Target};

/// Where the bases of a miss are computed: on the merge's worker thread (the band route), or
/// on a lane of a whole-tensor route with that backend's `xs_bases` (faer on the reference
/// route, the same bits as the worker's; cuSOLVER on CUDA), with the route's label for errors
/// (`pipeline::Compute::label`).
pub(super) enum BasesOn<'l> {
    /// `linalg::xs_bases` on the calling thread.
    Worker,
    /// A CUDA lane.
    Cuda(&'l Lanes<CudaBackend>, &'static str),
    /// A CPU reference lane.
    Reference(&'l Lanes<CpuBackend>, &'static str),
}

impl BasesOn<'_> {
    /// The rank-`rank` bases of target `t`'s (out, in') f32 matrix `W`.
    fn compute(&self, t: &Target, W: &[f32], rank: usize) -> Result<XsBases, MergeError> {
        match self {
            BasesOn::Worker => cpu_xs_bases(t, W, rank),
            BasesOn::Cuda(lanes, device) => on_lane(lanes, device, t, W, rank),
            BasesOn::Reference(lanes, device) => on_lane(lanes, device, t, W, rank),
        }
    }
}

/// -xs bases of target `t`'s (out, in') f32 matrix `W` with faer on the calling thread.
fn cpu_xs_bases(t: &Target, W: &[f32], rank: usize) -> Result<XsBases, MergeError> {
    crate::linalg::xs_bases(W, t.out, t.inp, rank, Par::Seq).map_err(|source| {
        MergeError::from(CacheError::Linalg {
            tensor: t.name.clone(),
            source,
        })
    })
}

/// -xs bases computed on a lane of `lanes`; a refusal of the matrix (a non-finite element, a
/// rank that does not fit) reads as on the worker, a device failure as a device error.
fn on_lane<B: Backend>(
    lanes: &Lanes<B>,
    device: &'static str,
    t: &Target,
    W: &[f32],
    rank: usize,
) -> Result<XsBases, MergeError> {
    let error = |e: BackendError| match e {
        BackendError::Linalg(source) => MergeError::from(CacheError::Linalg {
            tensor: t.name.clone(),
            source,
        }),
        source => MergeError::Device {
            tensor: t.name.clone(),
            device,
            source,
        },
    };
    let bases = lanes.with(|b| b.xs_bases(W, t.out, t.inp, rank));
    bases.map_err(error)?.map_err(error)
}

/// The -xs bases found or computed so far, counted from any worker.
#[derive(Default)]
pub(super) struct SvdCounters {
    hits: AtomicUsize,
    misses: AtomicUsize,
    replaced: AtomicUsize,
    computed: AtomicUsize,
}

impl SvdCounters {
    /// The report's SVD line (`cache`: was a cache given?; `engine`: the route's, named
    /// when any basis was looked up or computed).
    pub(super) fn report(&self, cache: bool, engine: &SvdEngine) -> SvdReport {
        let n = |c: &AtomicUsize| c.load(Ordering::Relaxed);
        let mut r = SvdReport {
            cache,
            hits: n(&self.hits),
            misses: n(&self.misses),
            replaced: n(&self.replaced),
            computed: n(&self.computed),
            engine: None,
        };
        if r.hits + r.misses + r.replaced + r.computed > 0 {
            r.engine = Some(engine.clone());
        }
        r
    }
}

/// LoRA-XS bases of the target's (out, in') view, by `engine` (the route's): from `cache`
/// when one is given (computed on `on` and stored on a miss or a rejected entry), else
/// computed on `on`; counted in `svd`.
pub(super) fn xs_bases(
    cache: Option<&SvdCache>,
    svd: &SvdCounters,
    (engine, on): (&SvdEngine, &BasesOn<'_>),
    t: &Target,
    rows: &BaseRows<'_>,
    rank: usize,
) -> Result<XsBases, MergeError> {
    let mut W = vec![0.0f32; t.out * t.inp];
    let Some(cache) = cache else {
        rows.read(0, t.out, &mut W)?;
        svd.computed.fetch_add(1, Ordering::Relaxed);
        return on.compute(t, &W, rank);
    };
    let compute = |W: &[f32], _out, _inp| on.compute(t, W, rank);
    // The cache keys the stored bytes when they are the PyTorch-layout matrix, else the
    // f32 PyTorch-layout copy (MLX Conv1d, NNX kernels).
    let cached = match rows.direct_view() {
        Some(view) => cache.get_or_compute_with(&view, rank, engine, compute)?,
        None => {
            rows.read(0, t.out, &mut W)?;
            let view = TensorView {
                name: &t.name,
                dtype: DType::F32,
                shape: &t.shape,
                bytes: bytemuck::cast_slice(&W),
            };
            cache.get_or_compute_with(&view, rank, engine, compute)?
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
