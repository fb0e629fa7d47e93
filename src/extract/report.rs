//! The per-module table `extract` and `resize` print with `--json` and record in the
//! manifest's report: low-rank modules with rank, energy and rel_error, diff entries without
//! a rank, and what was left out.
//!
//! Owns: [`ModuleReport`], [`ExtractReport`]. Does not own: the numbers (`rank`, `factor`).

use serde::Serialize;

use crate::adapter::Kind;
use crate::pipeline::DeviceRecord;

/// The report's name for an adapter entry kind: `lora`, `diff`, `diff_b`, `lora_bias`, or
/// the adapter module's own name for the others.
pub fn kind_label(k: Kind) -> &'static str {
    match k {
        Kind::DiffBias => "diff_b",
        Kind::LoraBias => "lora_bias",
        other => other.as_str(),
    }
}

/// One output entry.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ModuleReport {
    /// Module name as the output convention spells it, without prefix (original Wan for
    /// ComfyUI, diffusers for PEFT); for a full difference, the module of the tensor.
    pub name: String,
    /// `lora`, `diff` (weight, norm, modulation or conv) or `diff_b` (bias).
    pub kind: &'static str,
    /// The kept rank (low-rank modules).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rank: Option<usize>,
    /// The rank before `resize`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rank_in: Option<usize>,
    /// Retained fraction of ‖ΔW‖_F².
    #[serde(skip_serializing_if = "Option::is_none")]
    pub energy: Option<f64>,
    /// ‖ΔW − ΔW_r‖_F / ‖ΔW‖_F.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rel_error: Option<f64>,
    /// Shape of the target in PyTorch layout.
    pub shape: Vec<usize>,
}

/// The whole report.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ExtractReport {
    /// Every written entry, in output order.
    pub modules: Vec<ModuleReport>,
    /// Differing tensors not written (`--linear-only`), or modules a budget gave rank 0.
    pub left_out: Vec<String>,
    /// Output convention.
    pub to: String,
    /// SVD method (`exact` or `randomized`).
    pub svd: String,
    /// Where the SVDs ran (`extract`: `cpu`, or `cuda` and the device; `resize` runs them on
    /// the CPU and leaves it out).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<DeviceRecord>,
    /// `--budget` in bytes, when given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget: Option<u64>,
    /// Bytes of tensor data written (headers and sidecars not counted).
    pub tensor_bytes: u64,
    /// Tensors written with values their dtype cannot hold (NaN, ±inf, an f16 overflow),
    /// as allowed (`--allow-nonfinite`); absent when there are none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub nonfinite: Vec<serde_json::Value>,
}
