//! What a merge did, for the manifest's `report` and the command's summary.
//!
//! Owns: `MergeReport`, `AdapterReport`, `SvdReport`, `DeviceRecord`, `DoraStrength` (the
//! label of a scale source is `ScaleSource::label`). Everything is built from sorted data
//! (`BTreeMap`, plan-ordered `Vec`s), so the same merge always serialises to the same bytes.

use std::collections::BTreeMap;

use serde::Serialize;

/// Where the strength of an adapter enters the normalised (DoRA/BoRA) formulas.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DoraStrength {
    /// The application weight (default): `W' = W0 + a·(f(W0) − W0)` with `f` at full
    /// strength, linear in `a` for every kind (SA3 `merge_loras_into_base_model`
    /// `application_weight`, MLX `--lora-strength`, ComfyUI's DoRA strength).
    #[default]
    Merge,
    /// PEFT / diffusers `fuse_lora(lora_scale=a)`: the strength scales `σ` inside the norm,
    /// `W' = m ⊙ (W0 + a·σ·B·A) / ‖W0 + a·σ·B·A‖` (also SA3 HEAD's `lora_strength`).
    Peft,
}

impl DoraStrength {
    /// Both.
    pub const ALL: [DoraStrength; 2] = [DoraStrength::Merge, DoraStrength::Peft];

    /// The command-line, recipe and report spelling (serde's too).
    pub fn as_str(self) -> &'static str {
        match self {
            DoraStrength::Merge => "merge",
            DoraStrength::Peft => "peft",
        }
    }
}

impl std::fmt::Display for DoraStrength {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for DoraStrength {
    type Err = String;

    fn from_str(s: &str) -> Result<DoraStrength, String> {
        crate::names::find(&DoraStrength::ALL, DoraStrength::as_str, s).ok_or_else(|| {
            let names = DoraStrength::ALL.map(DoraStrength::as_str);
            format!("`{s}` is not {}", crate::names::either(names))
        })
    }
}

crate::names::value_enum!(DoraStrength);

/// One adapter's part of the merge.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AdapterReport {
    /// The `--adapter` argument as given.
    pub adapter: String,
    /// The adapter path.
    pub path: String,
    /// Its convention.
    pub convention: String,
    /// The base component it was merged into (`""` for a single model).
    pub component: String,
    /// Application weight `a`.
    pub strength: f64,
    /// True when `a = 0`: the adapter was checked and then skipped entirely.
    pub skipped: bool,
    /// Base tensors it changed.
    pub targets_merged: usize,
    /// Its entries bound to the base.
    pub entries: usize,
    /// Adapter keys those entries consumed.
    pub keys_consumed: usize,
    /// Entries per kind.
    pub kinds: BTreeMap<String, usize>,
    /// Entries per scale source.
    pub scale_sources: BTreeMap<String, usize>,
    /// Keys that matched nothing, merged around because `--allow-unmatched` was given.
    pub unmatched_allowed: Vec<String>,
}

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
}

/// Where the targets were computed (`--device`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DeviceRecord {
    /// `cpu` (row bands), `cuda` (whole tensors on the GPU) or `cpu-reference`.
    pub used: String,
    /// The CUDA device (name, ordinal, compute capability, memory, driver), for `cuda`.
    pub name: Option<String>,
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
