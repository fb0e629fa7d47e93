//! Which layout a checkpoint is in: from its config.json, else from its keys.
//!
//! Owns: the config.json field `_wanbake_layout` (written by `wanbake restack`, preferred by
//! every later read), `detect_layout` (the one layout whose name table explains every key),
//! and `resolve_layout`, the order of precedence: an explicit choice, then the config
//! field, then detection. Does not own: checking shapes (`layout::read`).
//!
//! The field name starts with `_`, so diffusers' `ConfigMixin.extract_init_dict` drops it
//! as a private attribute ("remove private attributes") without a warning, and
//! `WanConfig` ignores it like any unknown field. Its value is a layout name:
//! `"diffusers"`, `"wan"`, `"nnx"` or `"nnx-scanned"`.

use serde_json::{Map, Value};

use super::error::PlanError;
use crate::model::wan_layout::Layout;
use crate::model::wan_names::{self, SKIPPED_MARKER};

/// The config.json field that records a checkpoint's layout.
pub const LAYOUT_FIELD: &str = "_wanbake_layout";

/// The layout whose name table explains every key (keys containing `norm_added_q`, which
/// every layout skips, are not counted). Fails when no layout or more than one does.
pub fn detect_layout<S: AsRef<str>>(names: &[S]) -> Result<Layout, PlanError> {
    let keys: Vec<&str> = names
        .iter()
        .map(AsRef::as_ref)
        .filter(|n| !n.contains(SKIPPED_MARKER))
        .collect();
    let explained = |layout: Layout| {
        keys.iter()
            .filter(|k| wan_names::parse_stored(layout, k).is_some())
            .count()
    };
    let counts: Vec<(Layout, usize)> = Layout::ALL.iter().map(|&l| (l, explained(l))).collect();
    let complete: Vec<Layout> = counts
        .iter()
        .filter(|&&(_, n)| n == keys.len())
        .map(|&(l, _)| l)
        .collect();
    match complete.as_slice() {
        [one] => Ok(*one),
        [] => {
            let mut closest = counts[0];
            for &c in &counts[1..] {
                if c.1 > closest.1 {
                    closest = c;
                }
            }
            let closest = (closest.1 > 0).then_some(closest.0);
            let mut unknown: Vec<String> = keys
                .iter()
                .filter(|k| closest.is_none_or(|l| wan_names::parse_stored(l, k).is_none()))
                .map(|k| k.to_string())
                .collect();
            unknown.sort();
            Err(PlanError::Undetectable { closest, unknown })
        }
        many => Err(PlanError::Ambiguous {
            candidates: many.to_vec(),
        }),
    }
}

/// The layout recorded in a parsed config.json, if any.
pub fn layout_from_config(config: &Value) -> Result<Option<Layout>, PlanError> {
    match config.get(LAYOUT_FIELD) {
        None => Ok(None),
        Some(Value::String(s)) => s.parse().map(Some).map_err(|_| PlanError::ConfigField {
            field: LAYOUT_FIELD,
            value: Value::String(s.clone()).to_string(),
        }),
        Some(other) => Err(PlanError::ConfigField {
            field: LAYOUT_FIELD,
            value: other.to_string(),
        }),
    }
}

/// Records `layout` in a config.json object.
pub fn stamp_config(config: &mut Map<String, Value>, layout: Layout) {
    config.insert(
        LAYOUT_FIELD.to_string(),
        Value::String(layout.as_str().into()),
    );
}

/// An explicit choice wins, then the config.json field, then detection from the keys.
pub fn resolve_layout<S: AsRef<str>>(
    explicit: Option<Layout>,
    config: Option<&Value>,
    names: &[S],
) -> Result<Layout, PlanError> {
    if let Some(l) = explicit {
        return Ok(l);
    }
    if let Some(l) = config.map(layout_from_config).transpose()?.flatten() {
        return Ok(l);
    }
    detect_layout(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_each_layout_from_characteristic_keys() {
        let cases: [(&[&str], Layout); 5] = [
            (
                &["patch_embedding.weight", "blocks.0.attn1.to_q.weight"],
                Layout::Diffusers,
            ),
            (
                &[
                    "model.diffusion_model.blocks.0.self_attn.q.weight",
                    "model.diffusion_model.head.head.weight",
                ],
                Layout::Wan,
            ),
            (
                &["blocks.0.self_attn.q.weight", "head.modulation"],
                Layout::Wan,
            ),
            (
                &["patch_embedding.kernel", "blocks.3.attn1.query.kernel"],
                Layout::Nnx,
            ),
            (
                &[
                    "patch_embedding.kernel",
                    "blocks.attn1.query.kernel",
                    "blocks.attn2.norm_added_q.weight",
                ],
                Layout::NnxScanned,
            ),
        ];
        for (keys, want) in cases {
            assert_eq!(detect_layout(keys).unwrap(), want, "{keys:?}");
        }
    }

    #[test]
    fn ambiguous_and_unknown_keys_are_errors() {
        assert!(matches!(
            detect_layout(&["patch_embedding.bias", "scale_shift_table"]),
            Err(PlanError::Ambiguous { .. })
        ));
        match detect_layout(&["blocks.0.attn1.to_q.weight", "lora_unet_x"]) {
            Err(PlanError::Undetectable { closest, unknown }) => {
                assert_eq!(closest, Some(Layout::Diffusers));
                assert_eq!(unknown, vec!["lora_unet_x".to_string()]);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn keys_of_no_layout_say_so() {
        match detect_layout(&["diffusion_model.blocks.0.self_attn.q.lora_down.weight"]) {
            Err(e @ PlanError::Undetectable { closest: None, .. }) => {
                assert!(e.to_string().contains("none of the 1 keys"), "{e}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn config_field_is_preferred_and_validated() {
        let cfg: Value = serde_json::json!({"num_layers": 2, "_wanbake_layout": "nnx"});
        let keys = ["blocks.0.attn1.to_q.weight"];
        assert_eq!(
            resolve_layout(None, Some(&cfg), &keys).unwrap(),
            Layout::Nnx
        );
        assert_eq!(
            resolve_layout(None, None, &keys).unwrap(),
            Layout::Diffusers
        );
        let bad: Value = serde_json::json!({"_wanbake_layout": 3});
        assert!(matches!(
            layout_from_config(&bad),
            Err(PlanError::ConfigField { .. })
        ));
        let mut m = Map::new();
        stamp_config(&mut m, Layout::NnxScanned);
        assert_eq!(
            layout_from_config(&Value::Object(m)).unwrap(),
            Some(Layout::NnxScanned)
        );
    }
}
