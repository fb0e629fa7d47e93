//! PEFT `LoraConfig` semantics, shared by PEFT folders (adapter_config.json) and diffusers
//! files (`lora_adapter_metadata`, keys prefixed `transformer.`).
//!
//! Owns: `LoraConfig` (the fields that change a merge, read with the order of
//! `rank_pattern` / `alpha_pattern` preserved, because PEFT returns the first pattern that
//! matches), the refusals (non-LORA `peft_type`, `fan_in_fan_out`, un-converted
//! PiSSA/OLoRA/CorDA/LoftQ/LoRA-GA inits, LoRA variants, exotic fields set), PEFT's pattern
//! matching (`peft.utils.other.get_pattern_key`: the first key `K` with
//! `re.match(rf"(.*\.)?({K})$", module)`), σ per module, and the JSON a renderer writes.

use std::collections::BTreeMap;
use std::fmt;

use regex::Regex;
use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde_json::Value;

use super::grammar::ScaleInfo;
use super::kinds::ScaleSource;

/// A JSON value whose objects keep their keys in file order (serde_json's `Value` sorts
/// them, and PEFT's pattern lookup depends on the order).
#[derive(Clone, Debug, PartialEq)]
pub enum OValue {
    /// A scalar or array (order inside arrays is kept by serde_json anyway).
    Plain(Value),
    /// An object, keys in file order.
    Object(OrderedObject),
}

/// A JSON object with its keys in file order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OrderedObject(pub Vec<(String, OValue)>);

impl OValue {
    /// As a plain `serde_json::Value` (objects sorted).
    pub fn to_value(&self) -> Value {
        match self {
            OValue::Plain(v) => v.clone(),
            OValue::Object(o) => {
                Value::Object(o.0.iter().map(|(k, v)| (k.clone(), v.to_value())).collect())
            }
        }
    }
}

impl<'de> Deserialize<'de> for OValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = OValue;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<OValue, E> {
                Ok(OValue::Plain(Value::Bool(v)))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<OValue, E> {
                Ok(OValue::Plain(Value::from(v)))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<OValue, E> {
                Ok(OValue::Plain(Value::from(v)))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<OValue, E> {
                Ok(OValue::Plain(Value::from(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<OValue, E> {
                Ok(OValue::Plain(Value::String(v.to_string())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<OValue, E> {
                Ok(OValue::Plain(Value::String(v)))
            }
            fn visit_unit<E: de::Error>(self) -> Result<OValue, E> {
                Ok(OValue::Plain(Value::Null))
            }
            fn visit_none<E: de::Error>(self) -> Result<OValue, E> {
                Ok(OValue::Plain(Value::Null))
            }
            fn visit_some<D2: Deserializer<'de>>(self, d: D2) -> Result<OValue, D2::Error> {
                OValue::deserialize(d)
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut s: A) -> Result<OValue, A::Error> {
                let mut v = Vec::new();
                while let Some(x) = s.next_element::<OValue>()? {
                    v.push(x.to_value());
                }
                Ok(OValue::Plain(Value::Array(v)))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<OValue, A::Error> {
                let mut v = Vec::new();
                while let Some((k, val)) = m.next_entry::<String, OValue>()? {
                    v.push((k, val));
                }
                Ok(OValue::Object(OrderedObject(v)))
            }
        }
        d.deserialize_any(V)
    }
}

impl OrderedObject {
    /// Parses a JSON object, keeping key order at every depth.
    pub fn parse(text: &str) -> Result<OrderedObject, String> {
        match serde_json::from_str::<OValue>(text) {
            Ok(OValue::Object(o)) => Ok(o),
            Ok(_) => Err("not a JSON object".into()),
            Err(e) => Err(format!("not valid JSON: {e}")),
        }
    }

    fn get_raw(&self, k: &str) -> Option<&OValue> {
        self.0.iter().find(|(n, _)| n == k).map(|(_, v)| v)
    }

    fn get(&self, k: &str) -> Option<Value> {
        self.get_raw(k).map(OValue::to_value)
    }
}

/// Where σ is said to come from, for `ScaleSource`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigOrigin {
    /// adapter_config.json.
    Peft,
    /// diffusers `lora_adapter_metadata`.
    DiffusersMetadata,
}

/// One `rank_pattern` / `alpha_pattern` entry.
#[derive(Clone, Debug)]
pub struct Pattern {
    /// The key as written.
    pub key: String,
    /// `^(?:.*\.)?(?:key)$`.
    pub regex: Regex,
    /// The value.
    pub value: f64,
}

/// The fields of a PEFT `LoraConfig` that change a merge.
#[derive(Clone, Debug)]
pub struct LoraConfig {
    /// Default rank.
    pub r: usize,
    /// Default α.
    pub lora_alpha: f64,
    /// σ = α/√r instead of α/r.
    pub use_rslora: bool,
    /// Per-module ranks, in file order.
    pub rank_pattern: Vec<Pattern>,
    /// Per-module alphas, in file order.
    pub alpha_pattern: Vec<Pattern>,
    /// DoRA magnitudes expected.
    pub use_dora: bool,
    /// `lora_B.bias` expected.
    pub lora_bias: bool,
    /// Which file it came from.
    pub origin: ConfigOrigin,
}

/// Fields that only describe provenance or training, or that only select modules (the
/// tensors decide what exists).
const INFORMATIONAL: &[&str] = &[
    "peft_version",
    "base_model_name_or_path",
    "revision",
    "task_type",
    "inference_mode",
    "auto_mapping",
    "target_modules",
    "exclude_modules",
    "lora_dropout",
    "layers_to_transform",
    "layers_pattern",
    "megatron_core",
    "qalora_group_size",
    "ensure_weight_tying",
    "eva_config",
    "corda_config",
    "loftq_config",
    "lora_ga_config",
    "modules_to_save",
    "bias",
];

/// Fields read by `LoraConfig::from_object`.
const HANDLED: &[&str] = &[
    "peft_type",
    "r",
    "lora_alpha",
    "use_rslora",
    "rank_pattern",
    "alpha_pattern",
    "use_dora",
    "lora_bias",
    "fan_in_fan_out",
    "init_lora_weights",
];

/// `init_lora_weights` values whose adapters were trained against a modified base, or that
/// switch on a LoRA variant wanbake does not implement.
const MUTATED_INITS: &[&str] = &["pissa", "olora", "corda", "loftq", "lora_ga", "mica"];

fn is_empty_value(v: &Value) -> bool {
    match v {
        Value::Null | Value::Bool(false) => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        Value::String(s) => s.is_empty(),
        Value::Number(_) | Value::Bool(true) => false,
    }
}

impl LoraConfig {
    /// Parses adapter_config.json text (or the un-prefixed metadata object).
    pub fn parse(text: &str, origin: ConfigOrigin) -> Result<LoraConfig, String> {
        LoraConfig::from_object(&OrderedObject::parse(text)?, origin)
    }

    /// Reads and checks the fields.
    pub fn from_object(obj: &OrderedObject, origin: ConfigOrigin) -> Result<LoraConfig, String> {
        let peft_type = obj.get("peft_type");
        let peft_type = peft_type.as_ref().and_then(Value::as_str).unwrap_or("LORA");
        if peft_type != "LORA" {
            return Err(format!(
                "peft_type is {peft_type:?}; wanbake reads peft_type \"LORA\" adapters, and \
                 \"LOHA\"/\"LOKR\" (LyCORIS kinds) only"
            ));
        }
        if obj.get("fan_in_fan_out").and_then(|v| v.as_bool()) == Some(true) {
            return Err(
                "fan_in_fan_out is true: the factors are stored for (in, out) Conv1D \
                        weights (GPT-2 style), which WAN and SA3 do not have"
                    .into(),
            );
        }
        if let Some(Value::String(init)) = obj.get("init_lora_weights") {
            let init = init.as_str();
            let lower = init.to_ascii_lowercase();
            if MUTATED_INITS.iter().any(|m| lower.starts_with(m)) {
                return Err(format!(
                    "init_lora_weights is {init:?}: such an adapter was trained against a modified \
                     base (or is a LoRA variant) and cannot be merged into the original weights. \
                     Convert it with PEFT's save_pretrained(path_initial_model_for_weight_conversion=…) \
                     first, which turns it into a plain LoRA"
                ));
            }
        }
        for (k, v) in &obj.0 {
            if HANDLED.contains(&k.as_str()) || INFORMATIONAL.contains(&k.as_str()) {
                continue;
            }
            let v = v.to_value();
            if !is_empty_value(&v) {
                return Err(format!(
                    "field {k:?} is set to {v}: it selects a PEFT feature wanbake does not \
                     implement (or does not know), so merging could be wrong"
                ));
            }
        }
        let r = match obj.get("r") {
            Some(v) => v
                .as_u64()
                .filter(|&r| r > 0)
                .ok_or_else(|| format!("`r` must be a positive integer, found {v}"))?
                as usize,
            None => return Err("`r` is missing".into()),
        };
        let lora_alpha = match obj.get("lora_alpha") {
            Some(v) => v
                .as_f64()
                .filter(|a| a.is_finite())
                .ok_or_else(|| format!("`lora_alpha` must be a number, found {v}"))?,
            None => 8.0,
        };
        let flag = |k: &str| obj.get(k).and_then(|v| v.as_bool()).unwrap_or(false);
        Ok(LoraConfig {
            r,
            lora_alpha,
            use_rslora: flag("use_rslora"),
            rank_pattern: patterns(obj.get_raw("rank_pattern"), "rank_pattern")?,
            alpha_pattern: patterns(obj.get_raw("alpha_pattern"), "alpha_pattern")?,
            use_dora: flag("use_dora"),
            lora_bias: flag("lora_bias"),
            origin,
        })
    }

    /// σ of `module` (its path relative to the wrapped model) whose tensors have rank
    /// `tensor_rank`, by PEFT's rules (`LoraModel._create_and_replace`, `update_layer`).
    pub fn scale_for(&self, module: &str, tensor_rank: usize) -> Result<ScaleInfo, String> {
        let rank_hit = first_match(&self.rank_pattern, module);
        let alpha_hit = first_match(&self.alpha_pattern, module);
        let r = rank_hit.map_or(self.r, |p| p.value as usize);
        let alpha = alpha_hit.map_or(self.lora_alpha, |p| p.value);
        if r != tensor_rank {
            return Err(format!(
                "the config gives module `{module}` rank {r}{} but its lora_A has {tensor_rank} rows \
                 (PEFT would fail to load it)",
                rank_hit
                    .map(|p| format!(" (rank_pattern {:?})", p.key))
                    .unwrap_or_default()
            ));
        }
        let scale = if self.use_rslora {
            alpha / (r as f64).sqrt()
        } else {
            alpha / r as f64
        };
        let source = match (self.origin, alpha_hit.or(rank_hit)) {
            (ConfigOrigin::DiffusersMetadata, _) => ScaleSource::DiffusersMetadata,
            (ConfigOrigin::Peft, Some(p)) => ScaleSource::PeftPattern {
                pattern: p.key.clone(),
                rslora: self.use_rslora,
            },
            (ConfigOrigin::Peft, None) => ScaleSource::PeftConfig {
                rslora: self.use_rslora,
            },
        };
        Ok(ScaleInfo {
            scale,
            alpha: Some(alpha),
            source,
        })
    }
}

/// A PEFT `LoHaConfig` / `LoKrConfig` (peft_type `LOHA` / `LOKR`): the fields that change
/// a merge. PEFT 0.21.2 scales every module by `alpha / r` after the patterns (a LoKr with
/// both factors full included: `tuners/lokr/layer.py`), unlike LyCORIS's own rule.
#[derive(Clone, Debug)]
pub struct LycorisPeftConfig {
    /// `LOHA` or `LOKR`.
    pub peft_type: String,
    /// Default rank.
    pub r: usize,
    /// Default α.
    pub alpha: f64,
    /// `rank_pattern`, in file order.
    pub rank_pattern: Vec<Pattern>,
    /// `alpha_pattern`, in file order.
    pub alpha_pattern: Vec<Pattern>,
}

/// LOHA/LOKR fields read, or that only shape the factors the tensors already show
/// (`decompose_both`, `decompose_factor`), or only matter in training.
const LYCORIS_HANDLED: &[&str] = &[
    "peft_type",
    "r",
    "alpha",
    "rank_pattern",
    "alpha_pattern",
    "decompose_both",
    "decompose_factor",
    "rank_dropout",
    "module_dropout",
    "rank_dropout_scale",
    "init_weights",
    "use_effective_conv2d",
];

impl LycorisPeftConfig {
    /// The config, when `obj` is a LOHA/LOKR one (`None` for any other peft_type).
    pub fn from_object(obj: &OrderedObject) -> Option<Result<LycorisPeftConfig, String>> {
        let peft_type = obj.get("peft_type")?.as_str()?.to_string();
        if peft_type != "LOHA" && peft_type != "LOKR" {
            return None;
        }
        Some(LycorisPeftConfig::read(obj, peft_type))
    }

    fn read(obj: &OrderedObject, peft_type: String) -> Result<LycorisPeftConfig, String> {
        for (k, v) in &obj.0 {
            let v = v.to_value();
            let known = LYCORIS_HANDLED.contains(&k.as_str())
                || (INFORMATIONAL.contains(&k.as_str()) && k != "modules_to_save");
            if !known && !is_empty_value(&v) {
                return Err(format!(
                    "field {k:?} is set to {v}: it selects a PEFT {peft_type} feature wanbake does \
                     not implement (or does not know), so merging could be wrong"
                ));
            }
        }
        let r = obj
            .get("r")
            .and_then(|v| v.as_u64())
            .filter(|&r| r > 0)
            .ok_or("`r` must be a positive integer")? as usize;
        let alpha = obj
            .get("alpha")
            .and_then(|v| v.as_f64())
            .filter(|a| a.is_finite())
            .ok_or("`alpha` must be a number")?;
        Ok(LycorisPeftConfig {
            peft_type,
            r,
            alpha,
            rank_pattern: patterns(obj.get_raw("rank_pattern"), "rank_pattern")?,
            alpha_pattern: patterns(obj.get_raw("alpha_pattern"), "alpha_pattern")?,
        })
    }

    /// σ = α/r of `module` (relative to the wrapped model), with α and r after the patterns,
    /// and the rank r the module's decomposed factors must have.
    pub fn scale_for(&self, module: &str) -> (ScaleInfo, usize) {
        let rank_hit = first_match(&self.rank_pattern, module);
        let alpha_hit = first_match(&self.alpha_pattern, module);
        let r = rank_hit.map_or(self.r, |p| p.value as usize);
        let alpha = alpha_hit.map_or(self.alpha, |p| p.value);
        let source = match alpha_hit.or(rank_hit) {
            Some(p) => ScaleSource::PeftPattern {
                pattern: p.key.clone(),
                rslora: false,
            },
            None => ScaleSource::PeftConfig { rslora: false },
        };
        let info = ScaleInfo {
            scale: alpha / r as f64,
            alpha: Some(alpha),
            source,
        };
        (info, r)
    }
}

fn patterns(v: Option<&OValue>, what: &str) -> Result<Vec<Pattern>, String> {
    let obj = match v {
        None | Some(OValue::Plain(Value::Null)) => return Ok(Vec::new()),
        Some(OValue::Object(o)) => o,
        Some(other) => {
            return Err(format!(
                "`{what}` must be an object, found {}",
                other.to_value()
            ));
        }
    };
    obj.0
        .iter()
        .map(|(key, val)| {
            let key = key.clone();
            let val = val.to_value();
            let value = val
                .as_f64()
                .filter(|x| x.is_finite() && *x > 0.0)
                .ok_or_else(|| {
                    format!("`{what}` entry {key:?} must be a positive number, found {val}")
                })?;
            if what == "rank_pattern" && value.fract() != 0.0 {
                return Err(format!(
                    "`{what}` entry {key:?} must be an integer, found {val}"
                ));
            }
            let regex = Regex::new(&format!("^(?:.*\\.)?(?:{key})$")).map_err(|e| {
                format!(
                    "`{what}` key {key:?} is not a regular expression wanbake can evaluate: {e}"
                )
            })?;
            Ok(Pattern { key, regex, value })
        })
        .collect()
}

fn first_match<'a>(ps: &'a [Pattern], module: &str) -> Option<&'a Pattern> {
    ps.iter().find(|p| p.regex.is_match(module))
}

/// Everything a renderer needs to write a config: per module (relative path) its rank and α.
#[derive(Clone, Debug, PartialEq)]
pub struct ConfigPlan {
    /// Default rank (the most common).
    pub r: usize,
    /// Default α (the most common among modules of rank `r`).
    pub lora_alpha: f64,
    /// σ = α/√r.
    pub use_rslora: bool,
    /// Modules whose rank differs from `r` (escaped full path → rank), sorted.
    pub rank_pattern: BTreeMap<String, usize>,
    /// Modules whose α differs from `lora_alpha`, sorted.
    pub alpha_pattern: BTreeMap<String, f64>,
    /// DoRA.
    pub use_dora: bool,
    /// lora_B.bias.
    pub lora_bias: bool,
    /// Every module path.
    pub target_modules: Vec<String>,
}

/// Escapes a module path for a pattern key (`re.escape` of the dots).
pub fn escape_path(p: &str) -> String {
    regex::escape(p)
}

/// The most common value; ties go to the smallest.
pub fn most_common<T: Ord + Clone>(vals: impl Iterator<Item = T>) -> Option<T> {
    let mut counts: BTreeMap<T, usize> = BTreeMap::new();
    for v in vals {
        *counts.entry(v).or_default() += 1;
    }
    let max = *counts.values().max()?;
    counts.into_iter().find(|(_, c)| *c == max).map(|(v, _)| v)
}

impl ConfigPlan {
    /// Builds a plan from (module path, rank, α) triples.
    pub fn new(
        modules: &[(String, usize, f64)],
        use_rslora: bool,
        use_dora: bool,
        lora_bias: bool,
    ) -> ConfigPlan {
        let r = most_common(modules.iter().map(|m| m.1)).unwrap_or(1);
        let lora_alpha = most_common(modules.iter().filter(|m| m.1 == r).map(|m| OrdF64(m.2)))
            .map_or(r as f64, |a| a.0);
        let mut rank_pattern = BTreeMap::new();
        let mut alpha_pattern = BTreeMap::new();
        for (path, rank, alpha) in modules {
            if *rank != r {
                rank_pattern.insert(escape_path(path), *rank);
            }
            if alpha.to_bits() != lora_alpha.to_bits() {
                alpha_pattern.insert(escape_path(path), *alpha);
            }
        }
        let mut target_modules: Vec<String> = modules.iter().map(|m| m.0.clone()).collect();
        target_modules.sort();
        target_modules.dedup();
        ConfigPlan {
            r,
            lora_alpha,
            use_rslora,
            rank_pattern,
            alpha_pattern,
            use_dora,
            lora_bias,
            target_modules,
        }
    }

    /// The LoraConfig fields as a JSON object (sorted keys; the values PEFT 0.21 writes for
    /// every field a merge does not read).
    pub fn to_json(&self) -> serde_json::Map<String, Value> {
        let num = |x: f64| {
            if x.fract() == 0.0 && x.abs() < 1e15 {
                Value::from(x as i64)
            } else {
                Value::from(x)
            }
        };
        let mut m = serde_json::Map::new();
        m.insert("peft_type".into(), "LORA".into());
        m.insert("r".into(), Value::from(self.r));
        m.insert("lora_alpha".into(), num(self.lora_alpha));
        m.insert("use_rslora".into(), self.use_rslora.into());
        m.insert(
            "rank_pattern".into(),
            Value::Object(
                self.rank_pattern
                    .iter()
                    .map(|(k, v)| (k.clone(), Value::from(*v)))
                    .collect(),
            ),
        );
        m.insert(
            "alpha_pattern".into(),
            Value::Object(
                self.alpha_pattern
                    .iter()
                    .map(|(k, v)| (k.clone(), num(*v)))
                    .collect(),
            ),
        );
        m.insert("use_dora".into(), self.use_dora.into());
        m.insert("lora_bias".into(), self.lora_bias.into());
        m.insert("target_modules".into(), self.target_modules.clone().into());
        m.insert("bias".into(), "none".into());
        m.insert("fan_in_fan_out".into(), false.into());
        m.insert("init_lora_weights".into(), true.into());
        m.insert("lora_dropout".into(), Value::from(0.0));
        m.insert("modules_to_save".into(), Value::Null);
        m.insert("inference_mode".into(), true.into());
        m.insert("task_type".into(), Value::Null);
        m
    }
}

/// An f64 with a total order (by bits of finite values), for counting.
#[derive(Clone, Copy, Debug, PartialEq)]
struct OrdF64(f64);

impl Eq for OrdF64 {}
impl PartialOrd for OrdF64 {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for OrdF64 {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&o.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(extra: &str) -> Result<LoraConfig, String> {
        LoraConfig::parse(
            &format!(r#"{{"peft_type":"LORA","r":4,"lora_alpha":6{extra}}}"#),
            ConfigOrigin::Peft,
        )
    }

    #[test]
    fn patterns_match_like_peft_and_keep_file_order() {
        // PEFT: first key K (in dict order) with re.match(r"(.*\.)?(K)$", name).
        let c = cfg(r#","rank_pattern":{"ffn.net.2":2,"blocks.1.ffn.net.2":8},"alpha_pattern":{"ffn.net.2":4}"#)
            .unwrap();
        let s = c.scale_for("blocks.1.ffn.net.2", 2).unwrap();
        assert_eq!(s.scale, 4.0 / 2.0);
        assert_eq!(
            s.source,
            ScaleSource::PeftPattern {
                pattern: "ffn.net.2".into(),
                rslora: false
            }
        );
        // `(.*\.)?` needs a dot boundary: `xffn.net.2` does not match `ffn.net.2`.
        assert!(c.scale_for("blocks.1.xffn.net.2", 4).is_ok());
        assert!(c.scale_for("blocks.1.ffn.net.2", 4).is_err());
    }

    #[test]
    fn rslora_and_refusals() {
        let c = cfg(r#","use_rslora":true"#).unwrap();
        assert_eq!(c.scale_for("a", 4).unwrap().scale, 3.0);
        assert!(
            cfg(r#","fan_in_fan_out":true"#)
                .unwrap_err()
                .contains("fan_in_fan_out")
        );
        assert!(
            cfg(r#","init_lora_weights":"pissa_niter_4""#)
                .unwrap_err()
                .contains("path_initial_model")
        );
        assert!(cfg(r#","init_lora_weights":"olora""#).is_err());
        assert!(cfg(r#","init_lora_weights":"gaussian""#).is_ok());
        assert!(
            cfg(r#","use_qalora":true"#)
                .unwrap_err()
                .contains("use_qalora")
        );
        assert!(LoraConfig::parse(r#"{"peft_type":"LOHA","r":4}"#, ConfigOrigin::Peft).is_err());
    }
}
