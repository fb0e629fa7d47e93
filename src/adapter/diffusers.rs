//! diffusers LoRA files: `transformer.<diffusers path>.lora_A.weight` etc., with an optional
//! `lora_adapter_metadata` header entry (JSON of the PEFT LoraConfig, every key prefixed
//! `transformer.`; spec conventions.md §4.4, §4.6).
//!
//! Owns: reading such a file (σ from the metadata by PEFT's rules, or folded into the
//! factors when there is none: diffusers then uses lora_alpha = r, σ = 1) and writing one
//! (`pytorch_lora_weights.safetensors`, always with metadata so α survives).

use std::collections::BTreeMap;

use super::grammar::{self, PEFT, ScaleInfo};
use super::kinds::ScaleSource;
use super::names::DIFFUSERS_PREFIX;
use super::peft::{check_against_config, render_peft_like};
use super::peft_config::{ConfigOrigin, LoraConfig, OrderedObject};
use super::translate::{RenderCtx, Rendered};
use super::{AdapterError, Convention, EntryProblem, ParseInput, Parsed};

/// The header metadata key diffusers writes.
pub const METADATA_KEY: &str = "lora_adapter_metadata";

fn config(input: &ParseInput<'_>) -> Result<Option<LoraConfig>, AdapterError> {
    let Some(text) = input.metadata.get(METADATA_KEY) else {
        return Ok(None);
    };
    let err = |reason: String| AdapterError::Config {
        path: input.path.to_path_buf(),
        what: format!("`{METADATA_KEY}` header metadata"),
        reason,
    };
    let obj = OrderedObject::parse(text).map_err(err)?;
    let sub = OrderedObject(
        obj.0
            .iter()
            .filter_map(|(k, v)| {
                k.strip_prefix(DIFFUSERS_PREFIX)
                    .map(|s| (s.to_string(), v.clone()))
            })
            .collect(),
    );
    if sub.0.is_empty() {
        return Err(err(format!(
            "has no `{DIFFUSERS_PREFIX}`-prefixed config keys"
        )));
    }
    LoraConfig::from_object(&sub, ConfigOrigin::DiffusersMetadata)
        .map(Some)
        .map_err(err)
}

/// Reads a diffusers-format LoRA.
pub fn parse(input: &ParseInput<'_>) -> Result<Parsed, AdapterError> {
    let cfg = config(input)?;
    let (groups, problems) = grammar::group(&input.keys, &PEFT, |m| {
        (!m.starts_with(DIFFUSERS_PREFIX))
            .then(|| format!("diffusers LoRA keys start with `{DIFFUSERS_PREFIX}`"))
    });
    let parsed = grammar::build(input, groups, problems, &|module, rank, _| match &cfg {
        Some(c) => c.scale_for(
            module.strip_prefix(DIFFUSERS_PREFIX).unwrap_or(module),
            rank,
        ),
        None => Ok(ScaleInfo {
            scale: 1.0,
            alpha: None,
            source: ScaleSource::Folded,
        }),
    });
    if let Some(c) = &cfg {
        check_against_config(input, c, METADATA_KEY, &parsed)?;
    }
    Ok(parsed)
}

/// Renders `pytorch_lora_weights.safetensors` with `lora_adapter_metadata`.
pub fn render(ctx: &RenderCtx<'_>) -> Result<Rendered, Vec<EntryProblem>> {
    let p = render_peft_like(ctx, Convention::Diffusers)?;
    let prefixed: serde_json::Map<String, serde_json::Value> = p
        .plan
        .to_json()
        .into_iter()
        .map(|(k, v)| (format!("{DIFFUSERS_PREFIX}{k}"), v))
        .collect();
    let meta =
        serde_json::to_string_pretty(&serde_json::Value::Object(prefixed)).unwrap_or_default();
    Ok(Rendered {
        stem: "pytorch_lora_weights".into(),
        tensors: p.tensors,
        metadata: BTreeMap::from([
            ("format".to_string(), "pt".to_string()),
            (METADATA_KEY.to_string(), meta),
        ]),
        sidecars: Vec::new(),
        notes: p.notes,
    })
}
