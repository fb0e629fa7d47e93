//! How to merge: the options of the merge engine itself, as opposed to how its output is
//! written (`pipeline::OutputOptions`).
//!
//! Owns: [`MergeOptions`] and [`DoraStrength`] (with its one spelling table). Does not own:
//! the formulas they choose between (`merge::math`, `merge::target`).

use serde::Serialize;

/// How to merge: where the strength enters DoRA/BoRA, and whether adapter keys that match
/// nothing are merged around (they are then listed in the report).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MergeOptions {
    /// Where strength enters DoRA/BoRA.
    pub dora_strength: DoraStrength,
    /// Merge around unmatched adapter keys instead of refusing (read when binding).
    pub allow_unmatched: bool,
}

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
