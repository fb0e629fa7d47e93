//! What a merge did, for the manifest's `report` and the command's summary.
//!
//! Owns: `MergeReport` and `SvdReport`. Does not own: the per-adapter facts
//! (`pipeline::AdapterReport`), the device record (`pipeline::DeviceRecord`) or the options
//! (`merge::options`). Everything is built from sorted data (`BTreeMap`, plan-ordered
//! `Vec`s), so the same merge always serialises to the same bytes.

use serde::Serialize;

use super::options::DoraStrength;
use crate::linalg::SvdEngine;
use crate::pipeline::{AdapterReport, DeviceRecord};

/// The SVD bases of the -xs targets.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SvdReport {
    /// True when `--svd-cache` was given.
    pub cache: bool,
    /// Bases read from the cache.
    pub hits: usize,
    /// Bases computed and stored (no entry existed).
    pub misses: usize,
    /// Bases recomputed because the cached entry was rejected (corrupt, stale).
    pub replaced: usize,
    /// Bases computed without a cache.
    pub computed: usize,
    /// The engine every basis of this merge comes from ([`SvdEngine::id`]: faer on the CPU
    /// routes, cuSOLVER with its version, GPU architecture and SM count on CUDA); absent when
    /// the merge has no -xs target.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine: Option<SvdEngine>,
}

/// The whole merge.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MergeReport {
    /// Per adapter, in command-line order.
    pub adapters: Vec<AdapterReport>,
    /// How strength enters DoRA/BoRA.
    pub dora_strength: DoraStrength,
    /// Strength semantics in words.
    pub strength_semantics: String,
    /// Distinct base tensors changed.
    pub targets_merged: usize,
    /// Output tensors written.
    pub tensors: usize,
    /// Output layout (`same` when the base's naming was kept).
    pub layout: String,
    /// Requested output dtype.
    pub dtype: String,
    /// Keep-f32 policy applied.
    pub keep_f32: String,
    /// Base keys the layout conversion leaves out on purpose (with why).
    pub dropped_by_layout: Vec<String>,
    /// -xs SVD bases.
    pub svd: SvdReport,
    /// Where the targets were computed.
    pub device: DeviceRecord,
}

/// The sentence the report carries about strengths (also in `--help`).
pub const STRENGTH_SEMANTICS: &str = "W' = round_once(W0 + sum_i a_i*(f_i(W0) - W0)) in f32 \
with W0 the original weight for every adapter; a = 0 skips the adapter; a scales every \
contribution of the adapter, full-tensor diffs (diff, diff_b, diff_m) included (ComfyUI and \
diffusers fuse_lora do the same; MaxDiffusion adds diffs unscaled)";
