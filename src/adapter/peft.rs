//! HF PEFT adapters: `adapter_model.safetensors` + `adapter_config.json`.
//!
//! Owns: reading a PEFT folder (keys `base_model.model.<P>.lora_A.weight`, `.lora_B.weight`,
//! `.lora_B.bias`, `.lora_magnitude_vector`, spec conventions.md §2) with σ from the config
//! (`peft_config`: r, lora_alpha, use_rslora, rank/alpha patterns), checking the config
//! against the tensors (use_dora ⇔ magnitudes, lora_bias ⇔ biases), reading PEFT LOHA/LOKR
//! folders (`hada_*` / `lokr_*` factors through `lycoris::with_modules`, σ = config α/r for
//! every module, `peft_config::LycorisPeftConfig`), and writing one
//! (`render`, shared with diffusers through `render_peft_like`). Conv LoRA factors keep
//! their conv shapes ((r, in, *k) / (out, r, 1, …)).

use std::collections::{BTreeMap, BTreeSet};

use super::grammar::{self, PEFT};
use super::kinds::Kind;
use super::lycoris::{ScalePolicy, with_modules};
use super::names::{ModuleId, PEFT_PREFIX};
use super::peft_config::{ConfigOrigin, ConfigPlan, LoraConfig, LycorisPeftConfig, OrderedObject};
use super::translate::{
    OutTensor, RenderCtx, Rendered, ScaleRule, alpha_linear, alpha_sqrt, conv_kernel_unknown,
    factor_shapes, kernel_of, scale_rule,
};
use super::{AdapterError, Convention, EntryProblem, KeyProblem, ParamRole, ParseInput, Parsed};

/// Reads a PEFT adapter. The config is adapter_config.json next to the weights, or (for
/// exporters that embed it) the `adapter_config` entry of the header metadata.
pub fn parse(input: &ParseInput<'_>) -> Result<Parsed, AdapterError> {
    let (what, text) = match (&input.config, input.metadata.get("adapter_config")) {
        (Some((p, t)), _) => (p.display().to_string(), t.clone()),
        (None, Some(t)) => ("`adapter_config` header metadata".to_string(), t.clone()),
        (None, None) => {
            return Err(AdapterError::NoScale {
                path: input.path.to_path_buf(),
                reason: "PEFT-format keys (base_model.model.…) but no adapter_config.json: PEFT \
                         keeps r and lora_alpha only there. Point wanbake at the folder holding \
                         adapter_config.json and adapter_model.safetensors"
                    .into(),
            });
        }
    };
    let config_err = |reason: String| AdapterError::Config {
        path: input.path.to_path_buf(),
        what: what.clone(),
        reason,
    };
    if let Some(cfg) = OrderedObject::parse(&text)
        .ok()
        .and_then(|o| LycorisPeftConfig::from_object(&o))
    {
        return parse_lycoris(input, &cfg.map_err(config_err)?, &what);
    }
    let cfg =
        LoraConfig::parse(&text, ConfigOrigin::Peft).map_err(|reason| AdapterError::Config {
            path: input.path.to_path_buf(),
            what: what.clone(),
            reason,
        })?;
    let (groups, problems) = grammar::group(&input.keys, &PEFT, |m| {
        (!m.starts_with(PEFT_PREFIX)).then(|| format!("PEFT keys start with `{PEFT_PREFIX}`"))
    });
    let parsed = grammar::build(input, groups, problems, &|module, rank, _alpha| {
        cfg.scale_for(module.strip_prefix(PEFT_PREFIX).unwrap_or(module), rank)
    });
    check_against_config(input, &cfg, &what, &parsed)?;
    Ok(parsed)
}

/// A PEFT LOHA/LOKR folder: every key is a LoHa (LOHA) or LoKr (LOKR) factor of a module
/// under `base_model.model.`, σ = α/r from the config for every module (PEFT's rule, not
/// LyCORIS's: a LoKr with both factors full is scaled too), and the decomposed factors have
/// the config's rank.
fn parse_lycoris(
    input: &ParseInput<'_>,
    cfg: &LycorisPeftConfig,
    what: &str,
) -> Result<Parsed, AdapterError> {
    let rel = |m: &str| m.strip_prefix(PEFT_PREFIX).unwrap_or(m).to_string();
    let rule = |m: &str| Ok(cfg.scale_for(&rel(m)).0);
    let want = if cfg.peft_type == "LOHA" {
        Kind::Loha
    } else {
        Kind::Lokr
    };
    let mut parsed = with_modules(input, &ScalePolicy::Config(&rule), |keys| Parsed {
        unparsed: keys
            .iter()
            .map(|k| KeyProblem {
                key: k.name.clone(),
                reason: format!(
                    "not a tensor of a PEFT {} adapter (expected `{PEFT_PREFIX}<module>.{}`)",
                    cfg.peft_type,
                    if want == Kind::Loha {
                        "hada_*"
                    } else {
                        "lokr_*"
                    }
                ),
            })
            .collect(),
        ..Parsed::default()
    });
    let mut bad = Vec::new();
    parsed.entries.retain(|e| {
        let (_, r) = cfg.scale_for(&rel(&e.module));
        let reason = if !e.module.starts_with(PEFT_PREFIX) {
            Some(format!("PEFT keys start with `{PEFT_PREFIX}`"))
        } else if e.kind != want {
            Some(format!(
                "a {} module in a PEFT {} folder",
                e.kind.as_str(),
                cfg.peft_type
            ))
        } else {
            e.rank.filter(|&t| t != r).map(|t| {
                format!(
                    "the config gives module `{}` rank {r} but its factors have rank {t} (PEFT \
                     would fail to load it)",
                    rel(&e.module)
                )
            })
        };
        if let Some(reason) = reason {
            bad.extend(e.source_keys.iter().map(|k| KeyProblem {
                key: k.clone(),
                reason: reason.clone(),
            }));
        }
        bad.is_empty()
    });
    if let Some(first) = bad.first() {
        return Err(AdapterError::Config {
            path: input.path.to_path_buf(),
            what: what.to_string(),
            reason: format!("`{}`: {}", first.key, first.reason),
        });
    }
    Ok(parsed)
}

/// use_dora must match the magnitudes present, lora_bias the biases present: otherwise PEFT
/// would initialise or ignore tensors, and the merge would silently differ.
pub fn check_against_config(
    input: &ParseInput<'_>,
    cfg: &LoraConfig,
    what: &str,
    parsed: &Parsed,
) -> Result<(), AdapterError> {
    let err = |reason: String| AdapterError::Config {
        path: input.path.to_path_buf(),
        what: what.to_string(),
        reason,
    };
    let plain: Vec<&str> = parsed
        .entries
        .iter()
        .filter(|e| e.kind == Kind::Lora)
        .map(|e| e.module.as_str())
        .collect();
    let dora = parsed.entries.iter().find(|e| e.kind == Kind::PeftDora);
    if cfg.use_dora && !plain.is_empty() {
        return Err(err(format!(
            "use_dora is true but {} no lora_magnitude_vector (e.g. `{}`); PEFT \
             would initialise their magnitude from the base weight",
            crate::human::plural(plain.len(), "module has", "modules have"),
            plain[0]
        )));
    }
    if let (false, Some(e)) = (cfg.use_dora, dora) {
        return Err(err(format!(
            "use_dora is false but `{}` has a lora_magnitude_vector; PEFT would ignore it",
            e.module
        )));
    }
    if let (false, Some(e)) = (
        cfg.lora_bias,
        parsed.entries.iter().find(|e| e.kind == Kind::LoraBias),
    ) {
        return Err(err(format!(
            "lora_bias is false but `{}` has a lora_B.bias; PEFT would ignore it",
            e.module
        )));
    }
    Ok(())
}

/// The tensors and config plan of a PEFT-style file (PEFT or diffusers): module names
/// spelled for `convention`, config pattern keys relative to the wrapped model.
pub struct PeftLike {
    /// Output tensors.
    pub tensors: Vec<OutTensor>,
    /// The config.
    pub plan: ConfigPlan,
    /// Notes.
    pub notes: Vec<String>,
}

/// The module path PEFT patterns and target_modules use (without the wrapper prefix).
pub(crate) fn config_path(id: &ModuleId) -> String {
    match id {
        ModuleId::Wan { diffusers, .. } => diffusers.clone(),
        ModuleId::Generic { path } => path.clone(),
    }
}

/// Renders entries as PEFT keys: LoRA / DoRA factors, `lora_B.bias` for σ-scaled biases
/// and for unscaled bias deltas of σ = 1 modules (as diffusers does with `diff_b`).
pub fn render_peft_like(
    ctx: &RenderCtx<'_>,
    convention: Convention,
) -> Result<PeftLike, Vec<EntryProblem>> {
    let entries = &ctx.set.entries;
    let mut problems = Vec::new();
    let mut notes = BTreeSet::new();
    let mut lora_of: BTreeMap<&ModuleId, usize> = BTreeMap::new();
    for (i, e) in entries.iter().enumerate() {
        if matches!(e.kind, Kind::Lora | Kind::PeftDora | Kind::DoraRows) {
            lora_of.insert(&ctx.ids[i], i);
        }
    }
    let use_dora = lora_of
        .values()
        .any(|&i| matches!(entries[i].kind, Kind::PeftDora | Kind::DoraRows));
    let rslora = !lora_of.is_empty()
        && lora_of
            .values()
            .all(|&i| matches!(scale_rule(&entries[i]), ScaleRule::Sqrt(_)));
    let mut tensors = Vec::new();
    let mut modules = Vec::new();
    let mut bias_of: BTreeMap<&ModuleId, usize> = BTreeMap::new();
    for (i, e) in entries.iter().enumerate() {
        let id = &ctx.ids[i];
        let name = id.spell(convention);
        match e.kind {
            Kind::Lora | Kind::PeftDora | Kind::DoraRows => {
                if use_dora && e.kind == Kind::Lora {
                    problems.push(ctx.problem(i, "PEFT's use_dora is global, and this adapter mixes DoRA and plain LoRA modules"));
                    continue;
                }
                if e.kind == Kind::DoraRows {
                    notes.insert("SA3 dora-rows written as PEFT DoRA: PEFT's row norm has no ε, SA3 adds 1e-12 (spec sa3_lora.md §5.4)".to_string());
                }
                if matches!(id, ModuleId::Generic { .. })
                    && e.binding.is_none()
                    && kernel_of(e).is_none()
                {
                    notes.insert("without --base the layer types of non-WAN modules are unknown: factors are written in Linear shape (a Conv target needs --base)".to_string());
                }
                if conv_kernel_unknown(e, id) {
                    problems.push(ctx.problem(i, "a Conv3d target: its kernel shape is unknown without --base, and PEFT needs the factors in conv shape"));
                    continue;
                }
                let alpha = if rslora {
                    alpha_sqrt(e)
                } else {
                    alpha_linear(e)
                };
                let (Some(alpha), Some(rank), Some((a_shape, b_shape))) =
                    (alpha, e.rank, factor_shapes(e))
                else {
                    problems.push(ctx.problem(
                        i,
                        format!("no lora_alpha reproduces σ = {} exactly", e.scale),
                    ));
                    continue;
                };
                modules.push((config_path(id), rank, alpha));
                let push = |t: Result<OutTensor, EntryProblem>,
                            tensors: &mut Vec<OutTensor>,
                            problems: &mut Vec<EntryProblem>| match t {
                    Ok(t) => tensors.push(t),
                    Err(p) => problems.push(p),
                };
                push(
                    ctx.param(
                        i,
                        ParamRole::A,
                        format!("{name}.lora_A.weight"),
                        a_shape,
                        false,
                    ),
                    &mut tensors,
                    &mut problems,
                );
                push(
                    ctx.param(
                        i,
                        ParamRole::B,
                        format!("{name}.lora_B.weight"),
                        b_shape,
                        false,
                    ),
                    &mut tensors,
                    &mut problems,
                );
                if e.kind != Kind::Lora {
                    let out = e.param(ParamRole::Magnitude).map_or(0, |m| m.shape[0]);
                    let shape = match kernel_of(e) {
                        Some(k) => [vec![1, out], vec![1; k.len()]].concat(),
                        None => vec![out],
                    };
                    push(
                        ctx.param(
                            i,
                            ParamRole::Magnitude,
                            format!("{name}.lora_magnitude_vector"),
                            shape,
                            false,
                        ),
                        &mut tensors,
                        &mut problems,
                    );
                }
            }
            Kind::LoraBias | Kind::DiffBias => {
                let Some(&li) = lora_of.get(id) else {
                    problems.push(ctx.problem(
                        i,
                        "a bias delta needs a LoRA on the same module to be written as lora_B.bias",
                    ));
                    continue;
                };
                if e.kind == Kind::DiffBias && entries[li].scale != 1.0 {
                    problems.push(ctx.problem(i, format!("an unscaled bias delta can only be written as lora_B.bias (scaled by σ) when σ = 1; this module's σ is {}", entries[li].scale)));
                    continue;
                }
                if let Some(prev) = bias_of.insert(id, i) {
                    problems.push(ctx.problem(i, format!("the module already has a bias delta from `{}`; PEFT has one lora_B.bias", entries[prev].source_keys.join(", "))));
                    continue;
                }
                if e.kind == Kind::DiffBias {
                    notes.insert("diff_b written as lora_B.bias of a σ = 1 module (what diffusers' converter does)".to_string());
                }
                let role = if e.kind == Kind::DiffBias {
                    ParamRole::DiffBias
                } else {
                    ParamRole::LoraBias
                };
                let shape = e.param(role).map(|s| s.shape.clone()).unwrap_or_default();
                match ctx.param(i, role, format!("{name}.lora_B.bias"), shape, false) {
                    Ok(t) => tensors.push(t),
                    Err(p) => problems.push(p),
                }
            }
            Kind::Diff => {
                problems.push(ctx.problem(i, "a full-tensor diff has no PEFT/diffusers spelling"))
            }
            k => problems.push(ctx.problem(
                i,
                format!(
                    "{} has no PEFT spelling (PEFT knows LoRA and row-norm DoRA only)",
                    k.sa3_name().unwrap_or("this kind")
                ),
            )),
        }
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    let lora_bias = !bias_of.is_empty();
    Ok(PeftLike {
        tensors,
        plan: ConfigPlan::new(&modules, rslora, use_dora, lora_bias),
        notes: notes.into_iter().collect(),
    })
}

/// Renders a PEFT folder: adapter_model.safetensors (metadata `format: pt`) and
/// adapter_config.json.
pub fn render(ctx: &RenderCtx<'_>) -> Result<Rendered, Vec<EntryProblem>> {
    let p = render_peft_like(ctx, Convention::Peft)?;
    let mut cfg = p.plan.to_json();
    cfg.insert("base_model_name_or_path".into(), serde_json::Value::Null);
    let mut bytes = serde_json::to_vec_pretty(&serde_json::Value::Object(cfg)).unwrap_or_default();
    bytes.push(b'\n');
    Ok(Rendered {
        stem: "adapter_model".into(),
        tensors: p.tensors,
        metadata: BTreeMap::from([("format".to_string(), "pt".to_string())]),
        sidecars: vec![("adapter_config.json".into(), bytes)],
        notes: p.notes,
    })
}
