//! Planning a `restack`: a checkpoint on disk in any layout → the output plan of another.
//!
//! Owns: `RestackOptions`, planning every component of a checkpoint (a file, a sharded
//! index, a diffusers model folder, or a pipeline folder whose `transformer/` and
//! `transformer_2/` are converted side by side) before anything is written, the config.json
//! that travels with the weights (the input's, stamped with the output layout; or, without
//! one, the config inferred from the shapes), and the manifest's report. Does not own:
//! running the plan (`restack`: the one executor and release writer every producing
//! command uses), argument parsing and printing (`cli::restack`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::conversion::Conversion;
use super::dtype_policy::{KeepF32, OutputDType};
use crate::io::ReadError;
use crate::io::checkpoint::{Checkpoint, Component, TensorSet};
use crate::model::base_model::{BaseModel, ComponentModel};
use crate::model::plan_error::PlanError;
use crate::model::read_plan::{INFERRED_HEAD_DIM, ReadPlan, StoredTensor};
use crate::model::wan::WanConfig;
use crate::model::wan_layout::Layout;
use crate::model::wan_layout::stamp_config;
use crate::release::ReleaseError;
use crate::release::staging::Replace;
use crate::release::writer::ComponentOutput;

/// What to convert to and how.
#[derive(Clone, Debug)]
pub struct RestackOptions {
    /// The input layout; `None` reads config.json's `_wanbake_layout`, else detects it.
    pub from: Option<Layout>,
    /// The output layout.
    pub to: Layout,
    /// Output dtype.
    pub dtype: OutputDType,
    /// Keep-f32 policy; `None` takes the default for `to`.
    pub keep_f32: Option<KeepF32>,
    /// Shard weight files at this many bytes.
    pub shard_bytes: Option<u64>,
    /// Replace an existing destination.
    pub replace: Replace,
    /// A config.json to use instead of the one next to the weights (needed for a single
    /// original-format file, whose head count the shapes cannot tell).
    pub config: Option<PathBuf>,
    /// What to do with values the output dtype cannot hold (NaN, ±inf, an overflow).
    pub nonfinite: crate::pipeline::NonFinite,
}

/// Why a restack failed. Nothing is left at the destination.
#[derive(Debug, thiserror::Error)]
pub enum RestackError {
    /// The input could not be read.
    #[error(transparent)]
    Read(#[from] ReadError),
    /// A component could not be planned.
    #[error("{}", path.display())]
    Plan {
        /// The component's folder or file.
        path: PathBuf,
        /// Why.
        source: PlanError,
    },
    /// A config.json could not be used.
    #[error("{}: {reason}", path.display())]
    Config {
        /// The config.json.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The input has no WAN transformer to convert.
    #[error("{}: {reason}", path.display())]
    Unsupported {
        /// The input.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The output files cannot be laid out.
    #[error("{}", path.display())]
    Output {
        /// The destination.
        path: PathBuf,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Writing failed.
    #[error(transparent)]
    Release(#[from] ReleaseError),
}

/// One planned component.
#[derive(Debug)]
pub struct ComponentPlan {
    /// `""` for a plain model, `transformer` / `transformer_2` in a pipeline.
    pub name: String,
    /// The conversion.
    pub conversion: Conversion,
    /// The input layout (from `--from`, config.json or detection).
    pub from: Layout,
    /// The keep-f32 policy applied.
    pub keep_f32: String,
    /// Where the config came from, for the report.
    pub config_source: String,
    /// The output component (headers, config.json sidecar).
    pub output: ComponentOutput,
}

/// Plans every component of `checkpoint`. Fails before anything is written.
pub fn plan_restack(
    checkpoint: &BaseModel,
    options: &RestackOptions,
) -> Result<Vec<ComponentPlan>, RestackError> {
    if checkpoint.components.is_empty() {
        return Err(RestackError::Unsupported {
            path: checkpoint.path.clone(),
            reason: "holds no transformer weights".into(),
        });
    }
    checkpoint
        .parts()
        .map(|(c, model)| plan_component(checkpoint, (c, model), options))
        .collect()
}

fn component_path(checkpoint: &Checkpoint, c: &Component) -> PathBuf {
    match c.tensors.files() {
        [one] if checkpoint.components.len() == 1 && c.sidecars.is_empty() => {
            one.path().to_path_buf()
        }
        _ => c.dir(&checkpoint.path),
    }
}

fn plan_component(
    checkpoint: &Checkpoint,
    (c, model): (&Component, &ComponentModel),
    options: &RestackOptions,
) -> Result<ComponentPlan, RestackError> {
    let path = component_path(checkpoint, c);
    let plan_err = |source| RestackError::Plan {
        path: path.clone(),
        source,
    };
    let input = InputConfig::find(c, options)?;
    let stored: Vec<StoredTensor> = c
        .tensors
        .tensors()
        .map(|t| StoredTensor::from(&t.view))
        .collect();
    let from = model
        .stored_layout(options.from, input.json())
        .map_err(plan_err)?;
    let mut read = ReadPlan::new(from, &stored, input.diffusers()).map_err(plan_err)?;
    let config_source = input.finish(&mut read.config);
    let policy = options
        .keep_f32
        .clone()
        .unwrap_or_else(|| KeepF32::default_for(options.to));
    let conversion = Conversion::new(read, options.to, options.dtype, &policy).map_err(plan_err)?;
    let config_bytes = output_config(input.carried(options.to), &conversion, options.to);
    let output = ComponentOutput {
        rel_dir: c.rel_dir.clone(),
        stem: options.to.weights_stem(&c.weights_stem),
        tensors: conversion.planned_tensors(),
        metadata: output_metadata(&c.tensors, options.to),
        sidecars: vec![("config.json".into(), config_bytes)],
        max_shard_bytes: options.shard_bytes,
    };
    Ok(ComponentPlan {
        name: c.name.clone(),
        conversion,
        from,
        keep_f32: policy.to_string(),
        config_source,
        output,
    })
}

/// The input's `__metadata__` with `format` set for the output layout: `pt` for PyTorch
/// layouts, absent for NNX ones.
fn output_metadata(tensors: &TensorSet, to: Layout) -> BTreeMap<String, String> {
    let mut metadata: BTreeMap<String, String> = tensors
        .metadata()
        .into_iter()
        .filter(|(k, _)| k != "format")
        .collect();
    if !to.is_nnx() {
        metadata.insert("format".into(), "pt".into());
    }
    metadata
}

/// The config.json a component is read with: `--config`, else the one next to the weights.
struct InputConfig {
    found: Option<(PathBuf, Value, RestackConfig)>,
}

impl InputConfig {
    fn find(c: &Component, options: &RestackOptions) -> Result<InputConfig, RestackError> {
        let raw = match &options.config {
            Some(path) => Some(load_config(path)?),
            None => c
                .sidecar("config.json")
                .map(|s| (s.path.clone(), s.json.clone())),
        };
        let found = raw
            .map(|(p, j)| classify_config(&p, &j).map(|k| (p, j, k)))
            .transpose()?;
        Ok(InputConfig { found })
    }

    fn json(&self) -> Option<&Value> {
        self.found.as_ref().map(|(_, j, _)| j)
    }

    fn diffusers(&self) -> Option<&WanConfig> {
        match &self.found {
            Some((_, _, RestackConfig::Diffusers(cfg))) => Some(&**cfg),
            _ => None,
        }
    }

    /// Completes an inferred config from an original one; says where the config came from.
    fn finish(&self, config: &mut WanConfig) -> String {
        match &self.found {
            Some((p, _, RestackConfig::Diffusers(_))) => p.display().to_string(),
            Some((p, _, RestackConfig::Original { num_heads })) => {
                adopt_heads(config, *num_heads);
                format!(
                    "inferred from tensor shapes, heads from the original config {}",
                    p.display()
                )
            }
            None => format!(
                "inferred from tensor shapes (attention_head_dim assumed {INFERRED_HEAD_DIM}; pass --config to set it)"
            ),
        }
    }

    /// The input config to carry to an output of layout `to`: a diffusers config always,
    /// an original one only to a `wan` output (others get the diffusers config).
    fn carried(&self, to: Layout) -> Option<&Value> {
        match &self.found {
            Some((_, _, RestackConfig::Original { .. })) if to != Layout::Wan => None,
            Some((_, j, _)) => Some(j),
            None => None,
        }
    }
}

/// What an input config.json is.
enum RestackConfig {
    /// A diffusers `WanTransformer3DModel` config (no `_class_name`, or that one).
    Diffusers(Box<WanConfig>),
    /// An original Wan-AI `WanModel` config (`dim`, `num_heads`, `in_dim`, ...): the
    /// parameter shapes decide the config, the head count comes from `num_heads`.
    Original {
        /// `num_heads`.
        num_heads: Option<usize>,
    },
}

fn load_config(path: &Path) -> Result<(PathBuf, Value), RestackError> {
    let text = std::fs::read_to_string(path).map_err(|e| ReadError::io(path, e))?;
    let json = serde_json::from_str(&text).map_err(|e| RestackError::Config {
        path: path.to_path_buf(),
        reason: format!("not valid JSON: {e}"),
    })?;
    Ok((path.to_path_buf(), json))
}

fn classify_config(path: &Path, json: &Value) -> Result<RestackConfig, RestackError> {
    let bad = |reason: String| RestackError::Config {
        path: path.to_path_buf(),
        reason,
    };
    match json.get("_class_name").and_then(Value::as_str) {
        class if WanConfig::is_class(class) => WanConfig::from_value(json.clone())
            .map(|c| RestackConfig::Diffusers(Box::new(c)))
            .map_err(|e| bad(format!("not a WAN transformer config: {e}"))),
        Some("WanModel") => Ok(RestackConfig::Original {
            num_heads: json
                .get("num_heads")
                .and_then(Value::as_u64)
                .map(|n| n as usize),
        }),
        other => Err(bad(format!(
            "describes a `{}`, not a WAN transformer ({} or WanModel)",
            other.unwrap_or_default(),
            WanConfig::CLASS_NAMES.join(", ")
        ))),
    }
}

/// Takes the head count of an original config when it divides D.
fn adopt_heads(config: &mut WanConfig, num_heads: Option<usize>) {
    let d = config.inner_dim();
    if let Some(h) = num_heads.filter(|&h| h > 0 && d.is_multiple_of(h)) {
        config.num_attention_heads = h;
        config.attention_head_dim = d / h;
    }
}

/// The config.json written next to the output weights: the input's (every field kept),
/// or the inferred config with `_class_name`, stamped with the output layout.
fn output_config(input: Option<&Value>, conversion: &Conversion, to: Layout) -> Vec<u8> {
    let mut object = match input {
        Some(Value::Object(m)) => m.clone(),
        _ => {
            let mut m = match serde_json::to_value(&conversion.read.config) {
                Ok(Value::Object(m)) => m,
                _ => serde_json::Map::new(),
            };
            let class = conversion.read.config.class_name();
            m.insert("_class_name".into(), class.into());
            m
        }
    };
    stamp_config(&mut object, to);
    let mut bytes =
        serde_json::to_vec_pretty(&Value::Object(object)).unwrap_or_else(|_| b"{}".to_vec());
    bytes.push(b'\n');
    bytes
}

impl RestackOptions {
    /// The manifest's `options`.
    pub fn to_json(&self) -> Value {
        let mut options = json!({
            "from": self.from.map(Layout::as_str),
            "to": self.to.as_str(),
            "dtype": self.dtype.as_str(),
            "keep_f32": self.keep_f32.as_ref().map(ToString::to_string),
            "shard_bytes": self.shard_bytes,
        });
        self.nonfinite.record(&mut options);
        options
    }
}

/// The manifest report: per component, layouts, config source, counts, dtypes, and every
/// skipped input key with its reason.
pub fn restack_report(checkpoint: &Checkpoint, plans: &[ComponentPlan]) -> Value {
    let components: Vec<Value> = plans
        .iter()
        .map(|p| {
            let read = &p.conversion.read;
            let mut dtypes: BTreeMap<String, usize> = BTreeMap::new();
            for d in &p.conversion.dtypes {
                *dtypes.entry(d.as_str().to_string()).or_default() += 1;
            }
            let skipped: Vec<Value> = read
                .skipped
                .iter()
                .map(|s| json!({"key": s.name, "shape": s.shape, "reason": s.reason}))
                .collect();
            let parameters: u64 = read
                .params
                .iter()
                .map(|c| c.shape.iter().map(|&d| d as u64).product::<u64>())
                .sum();
            json!({
                "component": p.name,
                "from": p.from.as_str(),
                "to": p.conversion.write.layout.as_str(),
                "config": p.config_source,
                "keep_f32": p.keep_f32,
                "tensors_in": read.params.iter().map(|c| c.stored.as_str()).collect::<std::collections::BTreeSet<_>>().len() + read.skipped.len(),
                "tensors_out": p.conversion.write.tensors.len(),
                "parameters": parameters,
                "output_dtypes": dtypes,
                "skipped": skipped,
            })
        })
        .collect();
    let not_carried: Vec<String> = checkpoint
        .ignored
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    // A restack moves bytes and rounds dtypes, which the CPU does at disk speed and a GPU
    // would only add transfers to; it runs on the CPU whatever `--device` says.
    json!({"components": components, "not_carried": not_carried, "device": {"used": "cpu"}})
}

/// Reads the config.json fields of a release directory written by restack (for tests and
/// later stages): the layout it records and the config.
pub fn read_output_config(dir: &Path) -> Result<(Option<Layout>, WanConfig), RestackError> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|e| ReadError::io(&path, e))?;
    let json: Value = serde_json::from_str(&text).map_err(|e| RestackError::Config {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    let layout = crate::model::wan_layout::layout_from_config(&json).map_err(|source| {
        RestackError::Plan {
            path: path.clone(),
            source,
        }
    })?;
    let config = WanConfig::from_json(&text).map_err(|e| RestackError::Config {
        path,
        reason: e.to_string(),
    })?;
    Ok((layout, config))
}
