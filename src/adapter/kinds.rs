//! The canonical adapter form every convention parses into and renders from.
//!
//! Owns: `Kind` (what an adapter entry does to its target, and its one spelling, `as_str`,
//! which serde, reports, manifests and messages all use), `ParamRole` (the tensors a kind
//! needs, in PyTorch layout), `ScaleSource` (where σ came from, and its report `label`),
//! `TensorSource` (how to produce one parameter as f32 from an adapter file, lazily, so a
//! 1 GB adapter is never held in memory at once) and `Entry` (one kind applied to one
//! target). Conventions (`peft`, `diffusers`, `comfy`, `kohya`, `sa3`, `nnx`) translate
//! their files to and from this form only: N parsers and N renderers, never N² converters.
//!
//! Shapes, all PyTorch layout, on the 2-D view (out, in') of the target (Conv1d/Conv3d
//! weights flattened row-major, spec sa3_lora.md §1.2):
//! `A` (r, in'), `B` (out, r), `M` (r, r), `Magnitude` (out,) for row kinds or (in',) for
//! column kinds, `MagnitudeR` (out,), `MagnitudeC` (in',), `Diff` (target shape),
//! `DiffBias` / `LoraBias` (out,).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::model::transform::Transform;

/// What an entry does to its target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// W' = W + σ·B·A.
    Lora,
    /// PEFT DoRA: W' = m ⊙ (W + σBA) / ‖W + σBA‖_row, no ε (spec conventions.md §2.5).
    PeftDora,
    /// SA3 dora-rows: row norms, ε = 1e-12 added (spec sa3_lora.md §1.4).
    DoraRows,
    /// SA3 dora-cols: column norms, ε added.
    DoraCols,
    /// SA3 BoRA: rows then columns of the row-scaled intermediate.
    Bora,
    /// SA3 lora-xs: W' = W + σ·U·M·Vᵀ with U, V from the base's SVD.
    LoraXs,
    /// SA3 dora-rows-xs.
    DoraRowsXs,
    /// SA3 dora-cols-xs.
    DoraColsXs,
    /// SA3 bora-xs.
    BoraXs,
    /// W' = W + diff (full weight, norm scale or parameter offset; `.diff`, `.diff_m`).
    Diff,
    /// b' = b + diff_b (`.diff_b`).
    DiffBias,
    /// b' = b + σ·lora_B.bias (PEFT `lora_bias=True`).
    LoraBias,
    /// LyCORIS LoHa: ΔW = σ·(w1_a·w1_b) ⊙ (w2_a·w2_b), Tucker cores on convolutions.
    Loha,
    /// LyCORIS LoKr: ΔW = σ·kron(W1, W2), each factor full, a product or (W2) Tucker.
    Lokr,
    /// LyCORIS Diag-OFT: output rows rotated by Cayley blocks, optional rescale.
    DiagOft,
    /// LyCORIS BOFT: butterfly stages of Cayley blocks, optional rescale.
    Boft,
    /// LyCORIS GLoRA: ΔW = σ·(W·a1·a2 + b1·b2).
    Glora,
    /// LyCORIS (IA)³: output rows or input columns scaled by (1 + w).
    Ia3,
}

impl Kind {
    /// Every kind.
    pub const ALL: [Kind; 18] = [
        Kind::Lora,
        Kind::PeftDora,
        Kind::DoraRows,
        Kind::DoraCols,
        Kind::Bora,
        Kind::LoraXs,
        Kind::DoraRowsXs,
        Kind::DoraColsXs,
        Kind::BoraXs,
        Kind::Diff,
        Kind::DiffBias,
        Kind::LoraBias,
        Kind::Loha,
        Kind::Lokr,
        Kind::DiagOft,
        Kind::Boft,
        Kind::Glora,
        Kind::Ia3,
    ];

    /// The kind's name in reports, manifests, `inspect` and messages; serde's spelling
    /// (`rename_all = "kebab-case"`) is the same, which `names`' tests check.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Lora => "lora",
            Kind::PeftDora => "peft-dora",
            Kind::DoraRows => "dora-rows",
            Kind::DoraCols => "dora-cols",
            Kind::Bora => "bora",
            Kind::LoraXs => "lora-xs",
            Kind::DoraRowsXs => "dora-rows-xs",
            Kind::DoraColsXs => "dora-cols-xs",
            Kind::BoraXs => "bora-xs",
            Kind::Diff => "diff",
            Kind::DiffBias => "diff-bias",
            Kind::LoraBias => "lora-bias",
            Kind::Loha => "loha",
            Kind::Lokr => "lokr",
            Kind::DiagOft => "diag-oft",
            Kind::Boft => "boft",
            Kind::Glora => "glora",
            Kind::Ia3 => "ia3",
        }
    }

    /// The tensors this kind needs.
    pub fn roles(self) -> &'static [ParamRole] {
        use ParamRole::*;
        match self {
            Kind::Lora => &[A, B],
            Kind::PeftDora | Kind::DoraRows | Kind::DoraCols => &[A, B, Magnitude],
            Kind::Bora => &[A, B, MagnitudeR, MagnitudeC],
            Kind::LoraXs => &[M],
            Kind::DoraRowsXs | Kind::DoraColsXs => &[M, Magnitude],
            Kind::BoraXs => &[M, MagnitudeR, MagnitudeC],
            Kind::Diff => &[Diff],
            Kind::DiffBias => &[DiffBias],
            Kind::LoraBias => &[LoraBias],
            Kind::Loha => &[HadaW1A, HadaW1B, HadaW2A, HadaW2B],
            Kind::DiagOft | Kind::Boft => &[OftBlocks],
            Kind::Glora => &[GloraA1, GloraA2, GloraB1, GloraB2],
            // Which factors a LoKr stores varies (full, product, Tucker), and (IA)³ holds
            // one of two roles: `adapter::lycoris` checks them when the file is read.
            Kind::Lokr | Kind::Ia3 => &[],
        }
    }

    /// True for the LyCORIS kinds whose effective weight `merge::lycoris` computes whole
    /// (`f(W0) − W0`, added like a full diff).
    pub fn is_lycoris(self) -> bool {
        matches!(
            self,
            Kind::Loha | Kind::Lokr | Kind::DiagOft | Kind::Boft | Kind::Glora | Kind::Ia3
        )
    }

    /// True for the kinds whose U, V come from an SVD of the base weight.
    pub fn is_xs(self) -> bool {
        matches!(
            self,
            Kind::LoraXs | Kind::DoraRowsXs | Kind::DoraColsXs | Kind::BoraXs
        )
    }

    /// True for kinds that are not linear in the adapter (strength semantics matter).
    pub fn is_normalised(self) -> bool {
        matches!(
            self,
            Kind::PeftDora
                | Kind::DoraRows
                | Kind::DoraCols
                | Kind::Bora
                | Kind::DoraRowsXs
                | Kind::DoraColsXs
                | Kind::BoraXs
        )
    }

    /// The SA3 `adapter_type` of an SA3 kind (spec sa3_lora.md §1.1; the ninth name, legacy
    /// `dora`, is read as one of the DoRA kinds and never written), `None` for the others.
    /// SA3's format spells them as wanbake does (`as_str`), which
    /// `tests::sa3_names_are_sa3s_vocabulary` pins against the spec's list.
    pub fn sa3_name(self) -> Option<&'static str> {
        matches!(
            self,
            Kind::Lora
                | Kind::DoraRows
                | Kind::DoraCols
                | Kind::Bora
                | Kind::LoraXs
                | Kind::DoraRowsXs
                | Kind::DoraColsXs
                | Kind::BoraXs
        )
        .then(|| self.as_str())
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One tensor an entry uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ParamRole {
    /// Down projection (r, in').
    A,
    /// Up projection (out, r).
    B,
    /// -xs core (r, r).
    M,
    /// DoRA magnitude (out,) or (in',).
    Magnitude,
    /// BoRA row magnitude (out,).
    MagnitudeR,
    /// BoRA column magnitude (in',).
    MagnitudeC,
    /// Full delta of the target's shape.
    Diff,
    /// Bias delta (out,).
    DiffBias,
    /// PEFT lora_B.bias (out,), scaled by σ.
    LoraBias,
    /// LyCORIS `hada_w1_a`.
    HadaW1A,
    /// LyCORIS `hada_w1_b`.
    HadaW1B,
    /// LyCORIS `hada_w2_a`.
    HadaW2A,
    /// LyCORIS `hada_w2_b`.
    HadaW2B,
    /// LyCORIS `hada_t1` (Tucker core).
    HadaT1,
    /// LyCORIS `hada_t2` (Tucker core).
    HadaT2,
    /// LyCORIS `lokr_w1`.
    LokrW1,
    /// LyCORIS `lokr_w1_a`.
    LokrW1A,
    /// LyCORIS `lokr_w1_b`.
    LokrW1B,
    /// LyCORIS `lokr_w2`.
    LokrW2,
    /// LyCORIS `lokr_w2_a`.
    LokrW2A,
    /// LyCORIS `lokr_w2_b`.
    LokrW2B,
    /// LyCORIS `lokr_t2` (Tucker core).
    LokrT2,
    /// LyCORIS `oft_blocks` (Diag-OFT (n,b,b), BOFT (m,n,b,b)).
    OftBlocks,
    /// LyCORIS OFT/BOFT `rescale` (out, 1, …).
    Rescale,
    /// LyCORIS GLoRA `a1.weight`.
    GloraA1,
    /// LyCORIS GLoRA `a2.weight`.
    GloraA2,
    /// LyCORIS GLoRA `b1.weight`.
    GloraB1,
    /// LyCORIS GLoRA `b2.weight`.
    GloraB2,
    /// LyCORIS (IA)³ `weight` with `on_input` 0: one factor per output row.
    Ia3Out,
    /// LyCORIS (IA)³ `weight` with `on_input` 1: one factor per input channel.
    Ia3In,
}

/// Where the scale σ of an entry came from (reported in the manifest).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "source")]
pub enum ScaleSource {
    /// A `.alpha` tensor in the file: σ = α/r.
    FileAlpha,
    /// No alpha in a convention whose rule is α = r: σ = 1.
    DefaultAlphaIsRank,
    /// PEFT `adapter_config.json`: σ = lora_alpha/r (or /√r with rsLoRA).
    PeftConfig {
        /// use_rslora.
        rslora: bool,
    },
    /// PEFT rank_pattern / alpha_pattern matched this module.
    PeftPattern {
        /// The pattern key that matched.
        pattern: String,
        /// use_rslora.
        rslora: bool,
    },
    /// diffusers `lora_adapter_metadata` in the file header.
    DiffusersMetadata,
    /// α already folded into the factors by the producing tool: σ = 1.
    Folded,
    /// SA3 `lora_config` metadata: σ = alpha/rank.
    Sa3Metadata,
    /// MaxText/Qwix `lora_alpha` / `lora_rank` metadata.
    NnxMetadata,
    /// Given by the user on the command line or in the recipe.
    User,
    /// Full-tensor deltas (`diff`, `diff_b`) have no scale: σ = 1.
    Unscaled,
    /// LyCORIS's own rule (spec lycoris.md §2), with the reason shown by inspect
    /// (`alpha 2 / rank 4`, `LoKr, both factors full: scale 1, stored alpha 4 ignored`).
    Lycoris {
        /// Why this scale.
        rule: String,
    },
}

impl ScaleSource {
    /// A short, stable label (`peft_config`, `peft_pattern:ffn.net.2`, ...): the key of the
    /// merge report's `scale_sources` counts in manifests.
    pub fn label(&self) -> String {
        match self {
            ScaleSource::FileAlpha => "file_alpha".into(),
            ScaleSource::DefaultAlphaIsRank => "default_alpha_is_rank".into(),
            ScaleSource::PeftConfig { rslora } => {
                if *rslora {
                    "peft_config_rslora".into()
                } else {
                    "peft_config".into()
                }
            }
            ScaleSource::PeftPattern { pattern, rslora } => {
                let rs = if *rslora { "_rslora" } else { "" };
                format!("peft_pattern{rs}:{pattern}")
            }
            ScaleSource::DiffusersMetadata => "diffusers_metadata".into(),
            ScaleSource::Folded => "folded".into(),
            ScaleSource::Sa3Metadata => "sa3_metadata".into(),
            ScaleSource::NnxMetadata => "nnx_metadata".into(),
            ScaleSource::User => "user".into(),
            ScaleSource::Unscaled => "unscaled".into(),
            ScaleSource::Lycoris { .. } => "lycoris_rule".into(),
        }
    }
}

/// How to produce one parameter in PyTorch layout from a file of the adapter.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TensorSource {
    /// Index of the file in the adapter set.
    pub file: usize,
    /// Tensor name in that file.
    pub key: String,
    /// For a stacked (L, …) tensor: which layer.
    pub layer: Option<usize>,
    /// Transpose the last two axes after slicing (Flax/Qwix `(in, r)` → PyTorch `(r, in)`).
    pub transpose: bool,
    /// Shape after slicing and transposing, in PyTorch layout.
    pub shape: Vec<usize>,
}

/// One adapter contribution to one base tensor.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// The module (or parameter) name as the adapter spells it, without the tensor suffix.
    pub module: String,
    /// The base checkpoint's own tensor name this entry changes, once bound.
    pub target: Option<String>,
    /// What it does.
    pub kind: Kind,
    /// Its tensors.
    pub params: BTreeMap<ParamRole, TensorSource>,
    /// Rank r (rows of A / size of M), for low-rank kinds.
    pub rank: Option<usize>,
    /// α as stored, when the convention stores one.
    pub alpha: Option<f64>,
    /// σ applied to the low-rank update (α/r, α/√r, 1, ...).
    pub scale: f64,
    /// Where σ came from.
    pub scale_source: ScaleSource,
    /// Every adapter-file key this entry consumed.
    pub source_keys: Vec<String>,
    /// Spatial kernel dims `k` when the file stored conv factors (A as `(r, in, *k)`, B as
    /// `(out, r, 1, …)`); the params are still given on the 2-D view `(r, in·∏k)`. Kept so
    /// a renderer can write the factors back in the same shape.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conv_kernel: Option<Vec<usize>>,
    /// Where the target lives in the base (filled by `AdapterSet::bind` with `target`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binding: Option<Binding>,
}

/// The base tensor an entry changes, as found by binding.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Binding {
    /// The base checkpoint's own tensor name (equal to `Entry::target`).
    pub tensor: String,
    /// For a stacked `(L, …)` base tensor (NNX scanned): the layer this entry changes.
    pub layer: Option<usize>,
    /// Stored layout → PyTorch layout of the target (`Identity` except for NNX bases:
    /// `Transpose` for kernels, `DhwioToOidhw` for the Conv3d kernel).
    #[serde(with = "transform_name")]
    pub to_canonical: Transform,
    /// The target's shape in PyTorch layout (after slicing the layer and `to_canonical`).
    pub shape: Vec<usize>,
    /// The target's canonical name: the diffusers name for WAN bases, the stored name
    /// otherwise.
    pub canonical: String,
    /// A LyCORIS entry's fit to the target (`adapter::lycoris::Module::fit`), made once when
    /// binding, for the merge; `None` for the other kinds. Not serialised.
    #[serde(skip)]
    pub lycoris: Option<super::lycoris::Fit>,
}

/// Serialises a `Transform` by name.
mod transform_name {
    use crate::model::transform::Transform;
    use serde::{Deserialize, Deserializer, Serializer};

    const NAMES: [(Transform, &str); 7] = [
        (Transform::Identity, "identity"),
        (Transform::Transpose, "transpose"),
        (Transform::OidhwToDhwio, "oidhw_to_dhwio"),
        (Transform::DhwioToOidhw, "dhwio_to_oidhw"),
        (Transform::Reverse3, "reverse3"),
        (Transform::ChannelTo1C11, "channel_to_1c11"),
        (Transform::Channel1C11ToC, "channel_1c11_to_c"),
    ];

    pub fn serialize<S: Serializer>(t: &Transform, s: S) -> Result<S::Ok, S::Error> {
        let name = NAMES
            .iter()
            .find(|(x, _)| x == t)
            .map_or("identity", |(_, n)| n);
        s.serialize_str(name)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Transform, D::Error> {
        let name = String::deserialize(d)?;
        NAMES
            .iter()
            .find(|(_, n)| *n == name)
            .map(|(t, _)| *t)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown transform `{name}`")))
    }
}

/// The 2-D view `(out, in')` of a PyTorch-layout weight shape: rows stay, every other axis
/// is flattened row-major (spec sa3_lora.md §1.2). `None` for shapes below 2-D.
pub fn view_2d(shape: &[usize]) -> Option<(usize, usize)> {
    match shape {
        [] | [_] => None,
        [out, rest @ ..] => Some((*out, rest.iter().product())),
    }
}

impl Entry {
    /// An entry with no tensors yet, σ = 1 and no target; parsers fill the rest.
    pub fn new(module: impl Into<String>, kind: Kind) -> Entry {
        Entry {
            module: module.into(),
            target: None,
            kind,
            params: BTreeMap::new(),
            rank: None,
            alpha: None,
            scale: 1.0,
            scale_source: ScaleSource::Unscaled,
            source_keys: Vec::new(),
            conv_kernel: None,
            binding: None,
        }
    }

    /// The 2-D view `(out, in')` the entry's own tensors imply for its target, when they
    /// fix both (A and B, or a full diff); `None` for -xs kinds and bias kinds.
    pub fn implied_view(&self) -> Option<(usize, usize)> {
        if let (Some(a), Some(b)) = (self.param(ParamRole::A), self.param(ParamRole::B)) {
            return Some((*b.shape.first()?, *a.shape.get(1)?));
        }
        self.param(ParamRole::Diff).and_then(|d| view_2d(&d.shape))
    }

    /// True for kinds that change a bias rather than a weight.
    pub fn targets_bias(&self) -> bool {
        matches!(self.kind, Kind::DiffBias | Kind::LoraBias)
    }

    /// The source of one role, if present.
    pub fn param(&self, role: ParamRole) -> Option<&TensorSource> {
        self.params.get(&role)
    }

    /// Roles the kind needs but the entry lacks.
    pub fn missing_roles(&self) -> Vec<ParamRole> {
        self.kind
            .roles()
            .iter()
            .copied()
            .filter(|r| !self.params.contains_key(r))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sa3_names_are_sa3s_vocabulary() {
        // spec sa3_lora.md §1.1: SA3's nine `adapter_type` names (legacy `dora` is resolved
        // to one of the two DoRA kinds when read, never written).
        let sa3: Vec<&str> = Kind::ALL.iter().filter_map(|k| k.sa3_name()).collect();
        assert_eq!(
            sa3,
            [
                "lora",
                "dora-rows",
                "dora-cols",
                "bora",
                "lora-xs",
                "dora-rows-xs",
                "dora-cols-xs",
                "bora-xs"
            ]
        );
    }

    #[test]
    fn every_kind_is_listed_once() {
        let names: std::collections::BTreeSet<&str> =
            Kind::ALL.iter().map(|k| k.as_str()).collect();
        assert_eq!(names.len(), Kind::ALL.len());
    }
}
