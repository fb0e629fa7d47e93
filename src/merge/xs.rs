//! The -xs bases of a merged target: U and V of a full, deterministic SVD of its base
//! weight, from the SVD cache when one is given, else computed by the CPU SVD on every
//! route (so the cache holds one engine's bases whichever route filled it; see
//! `merge::device`, "-xs bases").
//!
//! Owns: [`cpu_xs_bases`], [`xs_bases`] (cache lookup, keyed by the stored bytes when
//! they are the PyTorch-layout matrix, else by an f32 copy) and the counters of the merge
//! report's SVD line ([`SvdCounters`]). Does not own: the SVD and sign convention
//! (`linalg`), the cache's file format (`linalg::cache`).

#![allow(non_snake_case)]

use std::sync::atomic::{AtomicUsize, Ordering};

use faer::Par;

use super::error::MergeError;
use super::report::SvdReport;
use crate::io::{DType, TensorView};
use crate::linalg::{CacheError, CacheOutcome, SvdCache, XsBases};
use crate::pipeline::Target;
use crate::pipeline::base_rows::BaseRows;

/// -xs bases of target `t`'s (out, in') f32 matrix `W`, when no cache has them: the CPU SVD
/// on every route, so the SVD cache holds one engine's bases whichever route filled it
/// (`merge::device`, "-xs bases").
pub(super) fn cpu_xs_bases(t: &Target, W: &[f32], rank: usize) -> Result<XsBases, MergeError> {
    crate::linalg::xs_bases(W, t.out, t.inp, rank, Par::Seq).map_err(|source| {
        MergeError::from(CacheError::Linalg {
            tensor: t.name.clone(),
            source,
        })
    })
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
    /// The report's SVD line (`cache`: was a cache given?).
    pub(super) fn report(&self, cache: bool) -> SvdReport {
        let n = |c: &AtomicUsize| c.load(Ordering::Relaxed);
        SvdReport {
            cache,
            hits: n(&self.hits),
            misses: n(&self.misses),
            replaced: n(&self.replaced),
            computed: n(&self.computed),
        }
    }
}

/// LoRA-XS bases of the target's (out, in') view: from `cache` when one is given (computed
/// by [`cpu_xs_bases`] and stored on a miss or a rejected entry), else computed; counted in
/// `svd`.
pub(super) fn xs_bases(
    cache: Option<&SvdCache>,
    svd: &SvdCounters,
    t: &Target,
    rows: &BaseRows<'_>,
    rank: usize,
) -> Result<XsBases, MergeError> {
    let mut W = vec![0.0f32; t.out * t.inp];
    let Some(cache) = cache else {
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
