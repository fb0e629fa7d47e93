//! Stable Audio 3 native adapters: `<module>.parametrizations.weight.0.<param>` with
//! `<param>` ∈ {lora_A, lora_B, M_xs, magnitude, magnitude_r, magnitude_c}, and a
//! `lora_config` header entry `{rank, alpha, adapter_type, …}` (spec sa3_lora.md §1.1, §3).
//!
//! Owns: reading all nine `adapter_type` names (legacy `dora` resolved by the magnitude
//! shape sniff of spec §1.1: 2-D (1, in') → dora-cols, (out, 1) → dora-rows, 1-D →
//! dora-rows; every magnitude of the file must agree), the MLX aliases `dora-xs`/`xs`,
//! σ = alpha/rank, and writing the format (one adapter_type, rank and σ per file; tensors
//! keep their stored dtype, fp16 for files SA3 wrote).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::kinds::{Entry, Kind, ParamRole, ScaleSource};
use super::translate::{RenderCtx, Rendered, alpha_linear};
use super::{AdapterError, Convention, EntryProblem, KeyProblem, KeyRef, ParseInput, Parsed};

/// The header metadata key.
pub const METADATA_KEY: &str = "lora_config";

/// Stored parameter names and the roles they fill.
const PARAMS: [(&str, ParamRole); 6] = [
    ("lora_A", ParamRole::A),
    ("lora_B", ParamRole::B),
    ("M_xs", ParamRole::M),
    ("magnitude", ParamRole::Magnitude),
    ("magnitude_r", ParamRole::MagnitudeR),
    ("magnitude_c", ParamRole::MagnitudeC),
];

fn param_name(role: ParamRole) -> &'static str {
    PARAMS
        .iter()
        .find(|(_, r)| *r == role)
        .map_or("?", |(n, _)| n)
}

/// Splits `<module>.parametrizations.weight.<idx>.<param>`.
fn split(key: &str) -> Result<(String, ParamRole), String> {
    let Some((module, rest)) = key.split_once(".parametrizations.") else {
        return Err("not an SA3 parametrization key".into());
    };
    let parts: Vec<&str> = rest.split('.').collect();
    let [tensor, idx, param] = parts[..] else {
        return Err("expected `<module>.parametrizations.weight.<index>.<param>`".into());
    };
    if tensor != "weight" {
        return Err(format!(
            "parametrizes `{tensor}`; SA3 adapters parametrize `weight` only"
        ));
    }
    if idx != "0" {
        return Err(format!(
            "parametrization index {idx}: saved SA3 files use index 0 (stacked live adapters are not a file format)"
        ));
    }
    let role = PARAMS
        .iter()
        .find(|(n, _)| *n == param)
        .map(|(_, r)| *r)
        .ok_or_else(|| format!("unknown SA3 adapter parameter `{param}`"))?;
    Ok((module.to_string(), role))
}

/// `lora_config` fields.
struct Sa3Config {
    rank: Option<usize>,
    alpha: Option<f64>,
    adapter_type: String,
}

fn read_config(input: &ParseInput<'_>) -> Result<Option<Sa3Config>, AdapterError> {
    let Some(text) = input.metadata.get(METADATA_KEY) else {
        return Ok(None);
    };
    let err = |reason: String| AdapterError::Config {
        path: input.path.to_path_buf(),
        what: format!("`{METADATA_KEY}` header metadata"),
        reason,
    };
    let v: Value = serde_json::from_str(text).map_err(|e| err(format!("not valid JSON: {e}")))?;
    let rank = match v.get("rank") {
        None | Some(Value::Null) => None,
        Some(r) => Some(
            r.as_u64()
                .filter(|&r| r > 0)
                .ok_or_else(|| err(format!("`rank` must be a positive integer, found {r}")))?
                as usize,
        ),
    };
    let alpha = match v.get("alpha") {
        None | Some(Value::Null) => None,
        Some(a) => Some(
            a.as_f64()
                .filter(|a| a.is_finite())
                .ok_or_else(|| err(format!("`alpha` must be a number, found {a}")))?,
        ),
    };
    let adapter_type = match v.get("adapter_type") {
        None | Some(Value::Null) => "lora".to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(o) => return Err(err(format!("`adapter_type` must be a string, found {o}"))),
    };
    Ok(Some(Sa3Config {
        rank,
        alpha,
        adapter_type,
    }))
}

/// The kind of an `adapter_type` (legacy `dora` is resolved separately).
fn kind_of(name: &str) -> Option<(Kind, Option<&'static str>)> {
    if let Some(k) = Kind::ALL.into_iter().find(|k| k.sa3_name() == Some(name)) {
        return Some((k, None));
    }
    match name {
        "dora-xs" => Some((
            Kind::DoraRowsXs,
            Some("MLX alias `dora-xs` read as dora-rows-xs"),
        )),
        "xs" => Some((Kind::LoraXs, Some("MLX alias `xs` read as lora-xs"))),
        _ => None,
    }
}

/// Legacy `dora`: the magnitude shapes decide rows or columns (spec sa3_lora.md §1.1).
fn resolve_legacy(
    input: &ParseInput<'_>,
    groups: &BTreeMap<String, BTreeMap<ParamRole, KeyRef>>,
) -> Result<(Kind, String), AdapterError> {
    let mut seen: BTreeMap<Kind, String> = BTreeMap::new();
    for parts in groups.values() {
        let Some(m) = parts.get(&ParamRole::Magnitude) else {
            continue;
        };
        let in_flat = parts
            .get(&ParamRole::A)
            .and_then(|a| a.shape.get(1).copied());
        let kind = match m.shape[..] {
            [1, n] if Some(n) == in_flat || n != 1 => Kind::DoraCols,
            [_, 1] => Kind::DoraRows,
            _ => Kind::DoraRows,
        };
        seen.entry(kind)
            .or_insert_with(|| format!("`{}` {:?}", m.name, m.shape));
    }
    match seen.len() {
        0 => Ok((
            Kind::DoraRows,
            "legacy adapter_type `dora` without magnitudes read as dora-rows".into(),
        )),
        1 => {
            let (k, ex) = seen
                .into_iter()
                .next()
                .unwrap_or((Kind::DoraRows, String::new()));
            Ok((
                k,
                format!(
                    "legacy adapter_type `dora` resolved to {} from the magnitude shape ({ex})",
                    k.sa3_name().unwrap_or("?")
                ),
            ))
        }
        _ => Err(AdapterError::Refused {
            path: input.path.to_path_buf(),
            reason: format!(
                "legacy adapter_type `dora` with magnitudes of both layouts ({}); cannot tell rows from columns",
                seen.values().cloned().collect::<Vec<_>>().join(" and ")
            ),
        }),
    }
}

/// Reads an SA3-native file.
pub fn parse(input: &ParseInput<'_>) -> Result<Parsed, AdapterError> {
    let mut problems = Vec::new();
    let mut groups: BTreeMap<String, BTreeMap<ParamRole, KeyRef>> = BTreeMap::new();
    for k in &input.keys {
        match split(&k.name) {
            Ok((m, role)) => {
                groups.entry(m).or_default().insert(role, k.clone());
            }
            Err(reason) => problems.push(KeyProblem {
                key: k.name.clone(),
                reason,
            }),
        }
    }
    let cfg = read_config(input)?;
    let mut notes = Vec::new();
    let kind = match &cfg {
        None => {
            let only_ab = groups
                .values()
                .all(|p| p.keys().all(|r| matches!(r, ParamRole::A | ParamRole::B)));
            if !only_ab {
                return Err(AdapterError::Config {
                    path: input.path.to_path_buf(),
                    what: format!("`{METADATA_KEY}` header metadata"),
                    reason: "is missing, and the file holds more than lora_A/lora_B, so its adapter_type cannot be known".into(),
                });
            }
            notes.push("no lora_config: read as adapter_type lora with alpha = rank".into());
            Kind::Lora
        }
        Some(c) if c.adapter_type == "dora" => {
            let (k, note) = resolve_legacy(input, &groups)?;
            notes.push(note);
            k
        }
        Some(c) => match kind_of(&c.adapter_type) {
            Some((k, note)) => {
                notes.extend(note.map(str::to_string));
                k
            }
            None => {
                return Err(AdapterError::Config {
                    path: input.path.to_path_buf(),
                    what: format!("`{METADATA_KEY}` header metadata"),
                    reason: format!(
                        "unknown adapter_type {:?} (expected lora, dora, dora-rows, dora-cols, bora, lora-xs, dora-rows-xs, dora-cols-xs, bora-xs)",
                        c.adapter_type
                    ),
                });
            }
        },
    };
    let mut entries = Vec::new();
    for (module, parts) in groups {
        match module_entry(&module, &parts, kind, cfg.as_ref()) {
            Ok(e) => entries.push(e),
            Err(reason) => problems.extend(parts.values().map(|k| KeyProblem {
                key: k.name.clone(),
                reason: reason.clone(),
            })),
        }
    }
    Ok(Parsed {
        entries,
        unparsed: problems,
        notes,
    })
}

/// A 1-D view of a magnitude stored 1-D or as a legacy 2-D (1, n) / (n, 1).
fn vector_len(k: &KeyRef) -> Result<usize, String> {
    match k.shape[..] {
        [n] | [1, n] | [n, 1] => Ok(n),
        _ => Err(format!(
            "`{}` has shape {:?}; a magnitude is a vector",
            k.name, k.shape
        )),
    }
}

fn module_entry(
    module: &str,
    parts: &BTreeMap<ParamRole, KeyRef>,
    kind: Kind,
    cfg: Option<&Sa3Config>,
) -> Result<Entry, String> {
    let need: BTreeSet<ParamRole> = kind.roles().iter().copied().collect();
    let have: BTreeSet<ParamRole> = parts.keys().copied().collect();
    let type_name = kind.sa3_name().unwrap_or("?");
    if let Some(r) = need.difference(&have).next() {
        return Err(format!(
            "module `{module}` lacks {} required by adapter_type {type_name}",
            param_name(*r)
        ));
    }
    if let Some(r) = have.difference(&need).next() {
        return Err(format!(
            "module `{module}` has {}, which adapter_type {type_name} does not use",
            param_name(*r)
        ));
    }
    let mut e = Entry::new(module, kind);
    let two_d = |k: &KeyRef| -> Result<(usize, usize), String> {
        match k.shape[..] {
            [a, b] => Ok((a, b)),
            _ => Err(format!(
                "`{}` has shape {:?}, expected 2-D",
                k.name, k.shape
            )),
        }
    };
    let rank = if let (Some(a), Some(b)) = (parts.get(&ParamRole::A), parts.get(&ParamRole::B)) {
        let (r, inp) = two_d(a)?;
        let (out, rb) = two_d(b)?;
        if r != rb || r == 0 {
            return Err(format!(
                "rank mismatch: `{}` {:?}, `{}` {:?}",
                a.name, a.shape, b.name, b.shape
            ));
        }
        e.params.insert(ParamRole::A, a.source(vec![r, inp]));
        e.params.insert(ParamRole::B, b.source(vec![out, r]));
        r
    } else {
        let m = parts.get(&ParamRole::M).ok_or("M_xs missing")?;
        let (r, c) = two_d(m)?;
        if r != c || r == 0 {
            return Err(format!(
                "`{}` has shape {:?}, expected (r, r)",
                m.name, m.shape
            ));
        }
        e.params.insert(ParamRole::M, m.source(vec![r, r]));
        r
    };
    for role in [
        ParamRole::Magnitude,
        ParamRole::MagnitudeR,
        ParamRole::MagnitudeC,
    ] {
        if let Some(k) = parts.get(&role) {
            e.params.insert(role, k.source(vec![vector_len(k)?]));
        }
    }
    let cfg_rank = cfg.and_then(|c| c.rank);
    if let Some(cr) = cfg_rank
        && cr != rank
    {
        return Err(format!(
            "lora_config says rank {cr} but module `{module}` has rank {rank}"
        ));
    }
    let alpha = cfg.and_then(|c| c.alpha).unwrap_or(rank as f64);
    e.rank = Some(rank);
    e.alpha = Some(alpha);
    e.scale = alpha / rank as f64;
    e.scale_source = if cfg.is_some() {
        ScaleSource::Sa3Metadata
    } else {
        ScaleSource::DefaultAlphaIsRank
    };
    e.source_keys = parts.values().map(|k| k.name.clone()).collect();
    Ok(e)
}

/// Renders an SA3-native file.
pub fn render(ctx: &RenderCtx<'_>) -> Result<Rendered, Vec<EntryProblem>> {
    let entries = &ctx.set.entries;
    let mut problems = Vec::new();
    let mut notes = BTreeSet::new();
    let kind_for = |e: &Entry| match e.kind {
        Kind::PeftDora => Some(Kind::DoraRows),
        k if k.sa3_name().is_some() => Some(k),
        _ => None,
    };
    let Some(first) = entries.first() else {
        return Err(problems);
    };
    let (kind0, rank0, scale0) = (kind_for(first), first.rank, first.scale);
    let alpha0 = alpha_linear(first);
    let mut tensors = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        let Some(kind) = kind_for(e) else {
            problems.push(ctx.problem(i, "SA3 parametrizations change weights by LoRA, DoRA, BoRA or -xs only (no biases or full diffs)"));
            continue;
        };
        if Some(kind) != kind0 || e.rank != rank0 || e.scale != scale0 {
            problems.push(ctx.problem(i, format!(
                "lora_config holds one adapter_type, rank and alpha for the whole file; this entry is {} rank {} σ {}, the first is {} rank {} σ {scale0}",
                kind.sa3_name().unwrap_or("?"), e.rank.unwrap_or(0), e.scale, kind0.and_then(Kind::sa3_name).unwrap_or("?"), rank0.unwrap_or(0)
            )));
            continue;
        }
        if e.kind == Kind::PeftDora {
            notes.insert("PEFT DoRA written as SA3 dora-rows: SA3 adds ε = 1e-12 to the row norm, PEFT does not (spec sa3_lora.md §5.4)".to_string());
        }
        let name = ctx.ids[i].spell(Convention::Sa3);
        for role in kind.roles() {
            let shape = e.param(*role).map(|s| s.shape.clone()).unwrap_or_default();
            match ctx.param(
                i,
                *role,
                format!("{name}.parametrizations.weight.0.{}", param_name(*role)),
                shape,
                false,
            ) {
                Ok(t) => tensors.push(t),
                Err(p) => problems.push(p),
            }
        }
    }
    let Some(alpha) = alpha0.filter(|_| problems.is_empty()) else {
        if problems.is_empty() {
            problems.push(ctx.problem(
                0,
                format!("no alpha reproduces σ = {scale0} exactly as alpha/rank"),
            ));
        }
        return Err(problems);
    };
    let alpha_json = if alpha.fract() == 0.0 && alpha.abs() < 1e15 {
        Value::from(alpha as i64)
    } else {
        Value::from(alpha)
    };
    let config = format!(
        "{{\"rank\": {}, \"alpha\": {alpha_json}, \"adapter_type\": \"{}\", \"dropout\": 0.0, \"include\": null, \"exclude\": null}}",
        rank0.unwrap_or(0),
        kind0.and_then(Kind::sa3_name).unwrap_or("lora")
    );
    Ok(Rendered {
        stem: ctx.stem.clone(),
        tensors,
        metadata: BTreeMap::from([(METADATA_KEY.to_string(), config)]),
        sidecars: Vec::new(),
        notes: notes.into_iter().collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_split() {
        assert_eq!(
            split(
                "model.transformer.layers.0.self_attn.to_qkv.parametrizations.weight.0.magnitude_r"
            )
            .unwrap(),
            (
                "model.transformer.layers.0.self_attn.to_qkv".into(),
                ParamRole::MagnitudeR
            )
        );
        assert!(
            split("m.parametrizations.weight.1.lora_A")
                .unwrap_err()
                .contains("index 1")
        );
        assert!(split("m.parametrizations.weight.0.U").is_err());
    }
}
