//! The key grammar PEFT, diffusers, ComfyUI/original-Wan and kohya files share:
//! `<module><suffix>`, where the suffix names a LoRA factor, an alpha, a DoRA magnitude or a
//! full delta.
//!
//! Owns: the suffix tables of the two dialects (`PEFT`: `.lora_A.weight`, `.lora_B.weight`,
//! `.lora_B.bias`, `.lora_magnitude_vector`; `COMFY`: every spelling ComfyUI's `load_lora`
//! accepts, spec conventions.md §5.2, plus lightx2v `.diff_m`), the reasons for suffixes that
//! are known but not supported here (Tucker LoCon, LyCORIS DoRA, LyCORIS factors where LoRA
//! keys are expected: `adapter::lycoris` takes LyCORIS modules out first), grouping keys by
//! module, and building canonical entries from a group with a convention's scale rule.
//! Does not own: where σ comes from (each convention passes its rule).

use std::collections::BTreeMap;

use super::kinds::{Entry, Kind, ParamRole, ScaleSource};
use super::{KeyProblem, KeyRef, ParseInput, Parsed};

/// The part of a module one key holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Part {
    /// Down factor.
    A,
    /// Up factor.
    B,
    /// PEFT `lora_B.bias`.
    LoraBias,
    /// `.alpha`.
    Alpha,
    /// PEFT `lora_magnitude_vector`.
    Magnitude,
    /// Full weight delta.
    Diff,
    /// Full bias delta.
    DiffBias,
}

impl Part {
    fn name(self) -> &'static str {
        match self {
            Part::A => "lora_A",
            Part::B => "lora_B",
            Part::LoraBias => "lora_B.bias",
            Part::Alpha => "alpha",
            Part::Magnitude => "lora_magnitude_vector",
            Part::Diff => "diff",
            Part::DiffBias => "diff_b",
        }
    }
}

/// A suffix table: accepted suffixes, and known-but-unsupported ones with the reason.
pub struct Dialect {
    /// (suffix, part), checked in order.
    pub parts: &'static [(&'static str, Part)],
    /// (suffix, reason).
    pub unsupported: &'static [(&'static str, &'static str)],
}

const LYCORIS: &str = "a LyCORIS tensor where this file's convention expects LoRA keys (a PEFT \
     LoHa/LoKr folder says peft_type LOHA/LOKR in adapter_config.json; other files' LyCORIS \
     modules are read by `adapter::lycoris`)";
const TUCKER: &str = "Tucker-decomposed LoCon (lora_mid) is not supported by wanbake";
const LYCORIS_DORA: &str = "LyCORIS/ComfyUI DoRA (dora_scale) is not supported: its norm axis and strength rule differ from PEFT's (spec conventions.md §5.4)";
const SET_WEIGHT: &str =
    "set_weight/reshape_weight replace the base tensor; wanbake only applies deltas";
const PEFT_EMBEDDING: &str =
    "PEFT Embedding LoRA is not supported (WAN and SA3 have no Embedding targets)";

/// PEFT and diffusers keys.
pub const PEFT: Dialect = Dialect {
    parts: &[
        (".lora_A.weight", Part::A),
        (".lora_B.weight", Part::B),
        (".lora_B.bias", Part::LoraBias),
        (".lora_magnitude_vector", Part::Magnitude),
        (".lora_magnitude_vector.weight", Part::Magnitude),
    ],
    unsupported: &[
        (".lora_embedding_A", PEFT_EMBEDDING),
        (".lora_embedding_B", PEFT_EMBEDDING),
        (".lokr_w1", LYCORIS),
        (".lokr_w2", LYCORIS),
        (".lokr_w1_a", LYCORIS),
        (".lokr_w1_b", LYCORIS),
        (".lokr_w2_a", LYCORIS),
        (".lokr_w2_b", LYCORIS),
        (".hada_w1_a", LYCORIS),
        (".hada_w1_b", LYCORIS),
        (".hada_w2_a", LYCORIS),
        (".hada_w2_b", LYCORIS),
        (
            ".lora_A.default.weight",
            "PEFT files store lora_A without the adapter-name infix, so this file is in the comfy convention",
        ),
        (
            ".lora_B.default.weight",
            "PEFT files store lora_B without the adapter-name infix, so this file is in the comfy convention",
        ),
        (
            ".weight",
            "a full replacement tensor (modules_to_save, or bias=\"all\"/\"lora_only\"); an adapter entry cannot express it",
        ),
        (
            ".bias",
            "a full replacement tensor (modules_to_save, or bias=\"all\"/\"lora_only\"); an adapter entry cannot express it",
        ),
    ],
};

/// ComfyUI / original Wan / kohya keys (spec conventions.md §5.2, wan.md §5.2).
pub const COMFY: Dialect = Dialect {
    parts: &[
        (".lora_down.weight", Part::A),
        (".lora_up.weight", Part::B),
        (".lora_A.weight", Part::A),
        (".lora_B.weight", Part::B),
        (".lora_A.default.weight", Part::A),
        (".lora_B.default.weight", Part::B),
        ("_lora.down.weight", Part::A),
        ("_lora.up.weight", Part::B),
        (".lora.down.weight", Part::A),
        (".lora.up.weight", Part::B),
        (".lora_linear_layer.down.weight", Part::A),
        (".lora_linear_layer.up.weight", Part::B),
        (".lora_A", Part::A),
        (".lora_B", Part::B),
        (".alpha", Part::Alpha),
        (".diff", Part::Diff),
        (".diff_b", Part::DiffBias),
        (".w_norm", Part::Diff),
        (".b_norm", Part::DiffBias),
    ],
    unsupported: &[
        (".dora_scale", LYCORIS_DORA),
        (".lora_mid.weight", TUCKER),
        (".hada_w1_a", LYCORIS),
        (".hada_w1_b", LYCORIS),
        (".hada_w2_a", LYCORIS),
        (".hada_w2_b", LYCORIS),
        (".hada_t1", LYCORIS),
        (".hada_t2", LYCORIS),
        (".lokr_w1", LYCORIS),
        (".lokr_w2", LYCORIS),
        (".lokr_w1_a", LYCORIS),
        (".lokr_w1_b", LYCORIS),
        (".lokr_w2_a", LYCORIS),
        (".lokr_w2_b", LYCORIS),
        (".lokr_t2", LYCORIS),
        (".oft_blocks", LYCORIS),
        (".rescale", LYCORIS),
        (".a1.weight", LYCORIS),
        (".a2.weight", LYCORIS),
        (".b1.weight", LYCORIS),
        (".b2.weight", LYCORIS),
        (".set_weight", SET_WEIGHT),
        (".reshape_weight", SET_WEIGHT),
        (
            ".lora_magnitude_vector",
            "a PEFT DoRA magnitude in a non-PEFT file: read the file as the peft or diffusers convention",
        ),
        (
            ".lora_B.bias",
            "a PEFT lora_B.bias in a non-PEFT file: read the file as the peft or diffusers convention",
        ),
    ],
};

/// Splits a key into (module, part) by the dialect's suffixes. lightx2v's `X.diff_m` is the
/// diff of the block's modulation: module `X.modulation` (spec wan.md §5.1, MaxDiffusion's
/// `preprocess_wan_lora_dict`). Errors carry the reason the key is not used.
pub fn split(key: &str, dialect: &Dialect) -> Result<(String, Part), String> {
    if dialect.parts.iter().any(|(_, p)| *p == Part::Diff)
        && let Some(m) = key.strip_suffix(".diff_m")
    {
        return Ok((format!("{m}.modulation"), Part::Diff));
    }
    for (suffix, part) in dialect.parts {
        if let Some(m) = key.strip_suffix(suffix)
            && !m.is_empty()
        {
            return Ok((m.to_string(), *part));
        }
    }
    for (suffix, reason) in dialect.unsupported {
        if key.ends_with(suffix) {
            return Err((*reason).to_string());
        }
    }
    Err(
        "not an adapter key of this convention (no known LoRA, alpha, magnitude or diff suffix)"
            .into(),
    )
}

/// The keys of one module.
#[derive(Clone, Debug, Default)]
pub struct Group {
    parts: BTreeMap<Part, KeyRef>,
}

impl Group {
    fn get(&self, p: Part) -> Option<&KeyRef> {
        self.parts.get(&p)
    }
}

/// Groups keys by module. Keys whose module the convention does not accept
/// (`module_problem` returns a reason) and keys the dialect does not know are problems.
pub fn group(
    keys: &[KeyRef],
    dialect: &Dialect,
    module_problem: impl Fn(&str) -> Option<String>,
) -> (BTreeMap<String, Group>, Vec<KeyProblem>) {
    let mut groups: BTreeMap<String, Group> = BTreeMap::new();
    let mut problems = Vec::new();
    for k in keys {
        let (module, part) = match split(&k.name, dialect) {
            Ok(x) => x,
            Err(reason) => {
                problems.push(KeyProblem {
                    key: k.name.clone(),
                    reason,
                });
                continue;
            }
        };
        if let Some(reason) = module_problem(&module) {
            problems.push(KeyProblem {
                key: k.name.clone(),
                reason,
            });
            continue;
        }
        let g = groups.entry(module.clone()).or_default();
        if let Some(first) = g.parts.get(&part) {
            problems.push(KeyProblem {
                key: k.name.clone(),
                reason: format!(
                    "a second {} for module `{module}` (also `{}`)",
                    part.name(),
                    first.name
                ),
            });
            continue;
        }
        g.parts.insert(part, k.clone());
    }
    (groups, problems)
}

/// σ of one LoRA module: value, α as stored, and where σ came from.
#[derive(Clone, Debug, PartialEq)]
pub struct ScaleInfo {
    /// σ.
    pub scale: f64,
    /// α as stored, if any.
    pub alpha: Option<f64>,
    /// Source.
    pub source: ScaleSource,
}

/// A convention's σ rule: (module, rank, `.alpha` value) → σ.
pub type ScaleRuleFn<'a> = dyn Fn(&str, usize, Option<f64>) -> Result<ScaleInfo, String> + 'a;

/// Factor shapes of a LoRA pair: rank, (out, in'), conv kernel dims.
struct FactorShapes {
    rank: usize,
    out: usize,
    in_flat: usize,
    kernel: Option<Vec<usize>>,
}

fn factor_shapes(a: &KeyRef, b: &KeyRef) -> Result<FactorShapes, String> {
    let (rank, in_dims) = match a.shape.split_first() {
        Some((&r, rest)) if !rest.is_empty() => (r, rest),
        _ => {
            return Err(format!(
                "`{}` has shape {:?}; a down factor is (r, in) or (r, in, *kernel)",
                a.name, a.shape
            ));
        }
    };
    let [out, rb, trailing @ ..] = b.shape.as_slice() else {
        return Err(format!(
            "`{}` has shape {:?}; an up factor is (out, r) or (out, r, 1, …)",
            b.name, b.shape
        ));
    };
    if *rb != rank {
        return Err(format!(
            "rank mismatch: `{}` {:?} has {rank} rows but `{}` {:?} has {rb} columns",
            a.name, a.shape, b.name, b.shape
        ));
    }
    if trailing.iter().any(|&d| d != 1) {
        return Err(format!(
            "`{}` has shape {:?}: an up factor's kernel dims must all be 1",
            b.name, b.shape
        ));
    }
    if rank == 0 {
        return Err(format!("`{}` has rank 0", a.name));
    }
    let kernel = (in_dims.len() > 1).then(|| in_dims[1..].to_vec());
    if let Some(k) = &kernel
        && !trailing.is_empty()
        && trailing.len() != k.len()
    {
        return Err(format!(
            "`{}` {:?} and `{}` {:?} disagree on the number of kernel dims",
            a.name, a.shape, b.name, b.shape
        ));
    }
    Ok(FactorShapes {
        rank,
        out: *out,
        in_flat: in_dims.iter().product(),
        kernel,
    })
}

/// Builds entries from grouped keys. `scale_rule(module, rank, alpha)` gives σ of a LoRA
/// module (`alpha` is the value of its `.alpha` key, if any).
pub fn build(
    input: &ParseInput<'_>,
    groups: BTreeMap<String, Group>,
    mut problems: Vec<KeyProblem>,
    scale_rule: &ScaleRuleFn<'_>,
) -> Parsed {
    let mut entries = Vec::new();
    for (module, g) in groups {
        let mut fail = |keys: Vec<&KeyRef>, reason: String| {
            for k in keys {
                problems.push(KeyProblem {
                    key: k.name.clone(),
                    reason: reason.clone(),
                });
            }
        };
        let lora_keys: Vec<&KeyRef> = [
            Part::A,
            Part::B,
            Part::Alpha,
            Part::Magnitude,
            Part::LoraBias,
        ]
        .iter()
        .filter_map(|p| g.get(*p))
        .collect();
        match (g.get(Part::A), g.get(Part::B)) {
            (Some(a), Some(b)) => match lora_entries(input, &module, &g, a, b, scale_rule) {
                Ok(mut es) => entries.append(&mut es),
                Err(reason) => fail(lora_keys, reason),
            },
            (None, None) => {
                if !lora_keys.is_empty() {
                    fail(
                        lora_keys,
                        format!(
                            "module `{module}` has no lora_A/lora_B pair for this tensor to belong to"
                        ),
                    );
                }
            }
            _ => fail(
                lora_keys,
                format!("module `{module}` has only one of its two LoRA factors"),
            ),
        }
        if let Some(d) = g.get(Part::Diff) {
            let mut e = Entry::new(module.clone(), Kind::Diff);
            e.params.insert(ParamRole::Diff, d.source(d.shape.clone()));
            e.source_keys.push(d.name.clone());
            entries.push(e);
        }
        if let Some(d) = g.get(Part::DiffBias) {
            if d.shape.len() != 1 {
                fail(
                    vec![d],
                    format!("a bias delta must be 1-D, found shape {:?}", d.shape),
                );
            } else {
                let mut e = Entry::new(module.clone(), Kind::DiffBias);
                e.params
                    .insert(ParamRole::DiffBias, d.source(d.shape.clone()));
                e.source_keys.push(d.name.clone());
                entries.push(e);
            }
        }
    }
    Parsed {
        entries,
        unparsed: problems,
        notes: Vec::new(),
    }
}

fn lora_entries(
    input: &ParseInput<'_>,
    module: &str,
    g: &Group,
    a: &KeyRef,
    b: &KeyRef,
    scale_rule: &ScaleRuleFn<'_>,
) -> Result<Vec<Entry>, String> {
    let f = factor_shapes(a, b)?;
    let alpha = match g.get(Part::Alpha) {
        Some(k) => {
            let v = input.scalar(k).map_err(|e| crate::error_text::chain(&e))?;
            if v == 0.0 {
                return Err(format!(
                    "`{}` is 0: musubi reads that as α = r, ComfyUI as scale 0; refusing to guess",
                    k.name
                ));
            }
            Some(v)
        }
        None => None,
    };
    let s = scale_rule(module, f.rank, alpha)?;
    let mut e = Entry::new(module, Kind::Lora);
    e.params
        .insert(ParamRole::A, a.source(vec![f.rank, f.in_flat]));
    e.params.insert(ParamRole::B, b.source(vec![f.out, f.rank]));
    e.source_keys = vec![a.name.clone(), b.name.clone()];
    if let Some(k) = g.get(Part::Alpha) {
        e.source_keys.push(k.name.clone());
    }
    e.rank = Some(f.rank);
    e.alpha = s.alpha;
    e.scale = s.scale;
    e.scale_source = s.source.clone();
    e.conv_kernel = f.kernel.clone();
    if let Some(m) = g.get(Part::Magnitude) {
        if m.numel() != f.out || m.shape.iter().filter(|&&d| d != 1).count() > 1 {
            return Err(format!(
                "`{}` has shape {:?}; a DoRA magnitude of this module has {} entries",
                m.name, m.shape, f.out
            ));
        }
        e.kind = Kind::PeftDora;
        e.params.insert(ParamRole::Magnitude, m.source(vec![f.out]));
        e.source_keys.push(m.name.clone());
    }
    let mut out = vec![e.clone()];
    if let Some(bias) = g.get(Part::LoraBias) {
        if bias.shape != [f.out] {
            return Err(format!(
                "`{}` has shape {:?}, expected [{}]",
                bias.name, bias.shape, f.out
            ));
        }
        let mut eb = Entry::new(module, Kind::LoraBias);
        eb.params
            .insert(ParamRole::LoraBias, bias.source(vec![f.out]));
        eb.source_keys = vec![bias.name.clone()];
        eb.rank = e.rank;
        eb.alpha = e.alpha;
        eb.scale = e.scale;
        eb.scale_source = e.scale_source.clone();
        out.push(eb);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suffixes() {
        let ok = |k: &str, d: &Dialect| split(k, d).unwrap();
        assert_eq!(
            ok("diffusion_model.blocks.2.diff_m", &COMFY),
            ("diffusion_model.blocks.2.modulation".into(), Part::Diff)
        );
        assert_eq!(ok("x.lora_B.default.weight", &COMFY), ("x".into(), Part::B));
        assert_eq!(ok("x.diff_b", &COMFY), ("x".into(), Part::DiffBias));
        assert_eq!(
            ok("base_model.model.p.lora_magnitude_vector", &PEFT),
            ("base_model.model.p".into(), Part::Magnitude)
        );
        assert!(split("x.dora_scale", &COMFY).unwrap_err().contains("DoRA"));
        assert!(split("x.hada_w1_a", &COMFY).unwrap_err().contains("LoHa"));
        assert!(
            split("base_model.model.x.weight", &PEFT)
                .unwrap_err()
                .contains("replacement")
        );
        assert!(split("x.diff", &PEFT).is_err());
    }
}
