//! Output dtypes: the requested dtype and the rules that keep some parameters in f32.
//!
//! Owns: `OutputDType` (`keep`, `bf16`, `f16`, `f32`, its one spelling table, with the PyTorch
//! aliases of the float dtypes), `KeepF32` (the keep-f32 policies) and
//! `decide_dtypes`, which gives every output tensor of a write plan its dtype. Does not own:
//! the conversion itself (`codec::dtype`, `model::transform`).
//!
//! Policies (which parameters stay f32 when the output dtype is bf16 or f16):
//! - `diffusers`: `_keep_in_fp32_modules = ["rope", "time_embedder", "scale_shift_table",
//!   "norm1", "norm2", "norm3"]`, matched against the dot-separated tokens of the diffusers
//!   parameter name (spec wan.md §2.6). For a `wan` output it is applied through the
//!   canonical name, so original `blocks.N.norm3.*` (diffusers `norm2`), `blocks.N.modulation`
//!   and `head.modulation` (`scale_shift_table`), `time_embedding.*` (`time_embedder`) and
//!   `img_emb.proj.0/.4` (image embedder `norm1`/`norm2`) stay f32: the same tensors as in a
//!   diffusers output, which is what loading the file into diffusers would do.
//! - `maxdiffusion`: `_CAST_EXCLUSION_KEYWORDS = ("norm", "condition_embedder",
//!   "scale_shift_table")`, a case-insensitive substring match against the dot-joined NNX
//!   path (spec wan.md §4.4). For non-NNX outputs it is applied to the parameter's NNX path.
//! - `none`: nothing is kept.
//! - `regex:PATTERN`: tensors whose *output* name the regex matches (anywhere) stay f32.
//!
//! Defaults: `diffusers` for diffusers and wan outputs, `maxdiffusion` for nnx outputs. With
//! `keep`, each tensor keeps its stored dtype and no policy applies; with `f32` everything
//! is f32.

use std::fmt;
use std::str::FromStr;

use super::write::WritePlan;
use crate::io::DType;
use crate::model::plan_error::PlanError;
use crate::model::read_plan::ReadPlan;
use crate::model::wan_layout::Layout;
use crate::model::wan_names;

/// The output dtype asked for (`--dtype`, recipe `output.dtype`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum OutputDType {
    /// bfloat16 (keep-f32 parameters excepted).
    BF16,
    /// IEEE half (keep-f32 parameters excepted).
    F16,
    /// f32 everywhere.
    F32,
    /// Every tensor keeps its stored dtype.
    #[default]
    Keep,
}

impl OutputDType {
    /// Every output dtype, in the order `--help` lists them.
    pub const ALL: [OutputDType; 4] = [
        OutputDType::Keep,
        OutputDType::BF16,
        OutputDType::F16,
        OutputDType::F32,
    ];

    /// The command-line, recipe and manifest spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            OutputDType::BF16 => "bf16",
            OutputDType::F16 => "f16",
            OutputDType::F32 => "f32",
            OutputDType::Keep => "keep",
        }
    }

    /// Other accepted spellings: PyTorch's names of the float dtypes.
    pub fn aliases(self) -> &'static [&'static str] {
        match self {
            OutputDType::BF16 => &["bfloat16"],
            OutputDType::F16 => &["float16", "fp16"],
            OutputDType::F32 => &["float32"],
            OutputDType::Keep => &[],
        }
    }

    /// The stored dtype every float tensor gets; `None` for `Keep`.
    pub fn float(self) -> Option<DType> {
        match self {
            OutputDType::BF16 => Some(DType::BF16),
            OutputDType::F16 => Some(DType::F16),
            OutputDType::F32 => Some(DType::F32),
            OutputDType::Keep => None,
        }
    }
}

impl fmt::Display for OutputDType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for OutputDType {
    type Err = String;

    fn from_str(s: &str) -> Result<OutputDType, String> {
        OutputDType::ALL
            .into_iter()
            .find(|d| d.as_str() == s || d.aliases().contains(&s))
            .ok_or_else(|| {
                let names = OutputDType::ALL.map(OutputDType::as_str);
                format!(
                    "unknown dtype `{s}` (expected {})",
                    crate::names::either(names)
                )
            })
    }
}

/// Written by hand rather than by `names::value_enum!` for the aliases.
impl clap::ValueEnum for OutputDType {
    fn value_variants<'a>() -> &'a [Self] {
        &OutputDType::ALL
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        Some(
            clap::builder::PossibleValue::new(self.as_str())
                .aliases(self.aliases().iter().copied()),
        )
    }
}

/// Which parameters stay f32 when narrowing.
#[derive(Clone, Debug)]
pub enum KeepF32 {
    /// diffusers' `_keep_in_fp32_modules` token rule.
    Diffusers,
    /// MaxDiffusion's `_CAST_EXCLUSION_KEYWORDS` substring rule.
    MaxDiffusion,
    /// Nothing stays f32.
    None,
    /// Output names matching the regex stay f32.
    Regex(regex::Regex),
}

/// diffusers `WanTransformer3DModel._keep_in_fp32_modules`.
pub const DIFFUSERS_KEEP_IN_FP32: [&str; 6] = [
    "rope",
    "time_embedder",
    "scale_shift_table",
    "norm1",
    "norm2",
    "norm3",
];

/// MaxDiffusion `_CAST_EXCLUSION_KEYWORDS` (pipelines/wan/wan_pipeline.py).
pub const MAXDIFFUSION_CAST_EXCLUSION: [&str; 3] =
    ["norm", "condition_embedder", "scale_shift_table"];

impl KeepF32 {
    /// The default policy for an output layout.
    pub fn default_for(layout: Layout) -> KeepF32 {
        if layout.is_nnx() {
            KeepF32::MaxDiffusion
        } else {
            KeepF32::Diffusers
        }
    }

    /// Parses `diffusers`, `maxdiffusion`, `none` or `regex:PATTERN`.
    pub fn parse(s: &str) -> Result<KeepF32, PlanError> {
        match s {
            "diffusers" => Ok(KeepF32::Diffusers),
            "maxdiffusion" => Ok(KeepF32::MaxDiffusion),
            "none" => Ok(KeepF32::None),
            _ => {
                match s.strip_prefix("regex:") {
                    Some(pattern) => regex::Regex::new(pattern).map(KeepF32::Regex).map_err(|e| {
                        PlanError::Regex {
                            pattern: pattern.to_string(),
                            reason: e.to_string(),
                        }
                    }),
                    None => Err(PlanError::UnknownKeepF32(s.to_string())),
                }
            }
        }
    }

    /// True when the parameter `canonical`, written as `output_name`, stays f32.
    pub fn keeps(&self, output_name: &str, canonical: &str) -> bool {
        match self {
            KeepF32::Diffusers => canonical
                .split('.')
                .any(|token| DIFFUSERS_KEEP_IN_FP32.contains(&token)),
            KeepF32::MaxDiffusion => {
                let path = nnx_path(canonical).to_lowercase();
                MAXDIFFUSION_CAST_EXCLUSION.iter().any(|k| path.contains(k))
            }
            KeepF32::None => false,
            KeepF32::Regex(re) => re.is_match(output_name),
        }
    }
}

impl fmt::Display for KeepF32 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeepF32::Diffusers => f.write_str("diffusers"),
            KeepF32::MaxDiffusion => f.write_str("maxdiffusion"),
            KeepF32::None => f.write_str("none"),
            KeepF32::Regex(re) => write!(f, "regex:{}", re.as_str()),
        }
    }
}

/// The unscanned NNX path of a canonical name (the scanned path differs only by the block
/// index, which no keyword can match).
fn nnx_path(canonical: &str) -> String {
    match wan_names::parse_canonical(canonical) {
        Some((e, block)) => e.scope.full(e.nnx, block),
        None => canonical.to_string(),
    }
}

/// The dtype of every output tensor of `write` (same order), given where its pieces come
/// from (`read`), the requested dtype and the keep-f32 policy.
pub fn decide_dtypes(
    write: &WritePlan,
    read: &ReadPlan,
    target: OutputDType,
    policy: &KeepF32,
) -> Result<Vec<DType>, PlanError> {
    write
        .tensors
        .iter()
        .map(|t| {
            let narrow = match target {
                OutputDType::BF16 => DType::BF16,
                OutputDType::F16 => DType::F16,
                OutputDType::F32 => return Ok(DType::F32),
                // A constant (exact in every float dtype) keeps the input's first dtype.
                OutputDType::Keep if t.constant.is_some() => {
                    return Ok(read.params.first().map_or(DType::F32, |p| p.dtype));
                }
                OutputDType::Keep => return kept_dtype(t, read),
            };
            // Every piece of a stacked tensor is the same parameter kind, so one answers
            // for all.
            let keep = t.pieces.iter().any(|p| policy.keeps(&t.name, &p.canonical));
            Ok(if keep { DType::F32 } else { narrow })
        })
        .collect()
}

fn kept_dtype(t: &super::write::OutputTensor, read: &ReadPlan) -> Result<DType, PlanError> {
    let mut dtypes: Vec<DType> = t
        .pieces
        .iter()
        .filter_map(|p| read.get(&p.canonical).map(|s| s.dtype))
        .collect();
    dtypes.sort();
    dtypes.dedup();
    match dtypes.as_slice() {
        [one] => Ok(*one),
        _ => Err(PlanError::MixedDtypes {
            key: t.name.clone(),
            dtypes,
        }),
    }
}
