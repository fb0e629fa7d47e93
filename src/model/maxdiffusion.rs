//! MaxDiffusion's pretrained Orbax cache (`pretrained_orbax_dir`) as a model fact: which
//! item holds which transformer, and the `wan_config` its restore builds `WanModel` from.
//!
//! Owns: the step and item names, the handler of `wan_config`, [`state_item`] (diffusers
//! component → item), and [`wan_config`] (a diffusers transformer config.json → the JSON
//! `WanModel.to_json_string()` saves). Does not own: the tree's names, shapes and dtypes
//! (the `nnx` / `nnx-scanned` layouts, `model::wan_layout`, and MaxDiffusion's keep-f32 rule,
//! `layout`), the Orbax files (`io::orbax`, `pipeline::orbax`).
//!
//! Source: MaxDiffusion `AI-Hypercomputer/maxdiffusion@7cfb8801`:
//! `checkpointing/wan_checkpointer.py` (`_pretrained_save_items`: an item per transformer,
//! `StandardSave(state.to_pure_dict())`, and `wan_config` =
//! `JsonSave(json.loads(config_transformer.to_json_string()))`), `generate_wan.py` (Wan 2.1:
//! `wan_state`; Wan 2.2: `low_noise_transformer_state` ← `transformer_2/`,
//! `high_noise_transformer_state` ← `transformer/`, `wan_config` from the low-noise one),
//! `configuration_utils.py` (`to_json_string`: every registered `__init__` argument, then
//! `_class_name`, `_diffusers_version`; pops `mesh`, `precision`, `weights_dtype`, `quant`,
//! `_use_default_values`, `_ignore_files`), `models/wan/transformers/transformer_wan.py`
//! (`WanModel.__init__`'s arguments and defaults). Held to MaxDiffusion's own save of the
//! same model by golden/maxdiffusion_orbax_golden.py.

use serde_json::{Map, Value, json};

/// The step folder of the cache (MaxDiffusion saves and restores step 0).
pub const STEP: &str = "0";

/// The item holding the transformer config.
pub const CONFIG_ITEM: &str = "wan_config";

/// Orbax's handler name for a `JsonCheckpointHandler` item.
pub const JSON_HANDLER: &str =
    "orbax.checkpoint._src.handlers.json_checkpoint_handler.JsonCheckpointHandler";

/// `_diffusers_version` as MaxDiffusion writes it (`maxdiffusion.__version__`).
pub const MAXDIFFUSION_VERSION: &str = "0.22.0.dev0";

/// The item of each transformer of a base whose components are named `names` (diffusers
/// subfolders; `""` for a model folder): one transformer is `wan_state`; a Wan 2.2 A14B
/// pipeline's `transformer` (high noise) and `transformer_2` (low noise) are
/// `high_noise_transformer_state` and `low_noise_transformer_state`. `None`: no mapping.
pub fn state_items(names: &[&str]) -> Option<Vec<&'static str>> {
    match names {
        [_] => Some(vec!["wan_state"]),
        _ if names.len() == 2
            && names.contains(&"transformer")
            && names.contains(&"transformer_2") =>
        {
            Some(
                (names.iter())
                    .map(|n| match *n {
                        "transformer" => "high_noise_transformer_state",
                        _ => "low_noise_transformer_state",
                    })
                    .collect(),
            )
        }
        _ => None,
    }
}

/// The component whose config MaxDiffusion saves as `wan_config`: the only one, or Wan
/// 2.2's low-noise `transformer_2`.
pub fn config_component(names: &[&str]) -> Option<usize> {
    match names {
        [_] => Some(0),
        _ => names.iter().position(|n| *n == "transformer_2"),
    }
}

/// `WanModel.__init__`'s arguments that `to_json_string` keeps, with their defaults as it
/// writes them (the values a diffusers config.json does not set; the run-time ones, which
/// MaxDiffusion's restore overwrites from its own config, as a save made with WanModel's
/// defaults holds them).
fn wan_model_defaults() -> Map<String, Value> {
    let v = json!({
        "model_type": "t2v",
        "patch_size": [1, 2, 2],
        "num_attention_heads": 40,
        "attention_head_dim": 128,
        "in_channels": 16,
        "out_channels": 16,
        "text_dim": 4096,
        "freq_dim": 256,
        "ffn_dim": 13824,
        "num_layers": 40,
        "dropout": 0.0,
        "cross_attn_norm": true,
        "qk_norm": "rms_norm_across_heads",
        "eps": 1e-6,
        "image_dim": null,
        "added_kv_proj_dim": null,
        "rope_max_seq_len": 1024,
        "pos_embed_seq_len": null,
        "image_seq_len": null,
        "flash_min_seq_length": 4096,
        "flash_block_sizes": null,
        // WanModel's default `jnp.float32` is a scalar type, not a dtype:
        // `CustomEncoder` writes it as null.
        "dtype": null,
        "attention": "dot_product",
        "remat_policy": "None",
        "names_which_can_be_saved": [],
        "names_which_can_be_offloaded": [],
        "mask_padding_tokens": true,
        "scan_layers": true,
        "enable_jax_named_scopes": false,
        "attention_config": null,
    });
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// `wan_config` for a transformer whose diffusers config.json is `config`: WanModel's
/// arguments (the config's values where it sets them, WanModel's defaults elsewhere;
/// `scan_layers` as the cache's tree is stacked or not), `_class_name` `WanModel` and
/// MaxDiffusion's `_diffusers_version`. Keys WanModel does not take are left out (its
/// restore calls `WanModel(**wan_config)`). Returns the keys left out too.
pub fn wan_config(config: &Map<String, Value>, scan_layers: bool) -> (Value, Vec<String>) {
    let mut out = wan_model_defaults();
    let mut dropped = Vec::new();
    for (k, v) in config {
        match out.get_mut(k) {
            Some(slot) => *slot = v.clone(),
            None if k.starts_with('_') => {}
            None => dropped.push(k.clone()),
        }
    }
    out.insert("scan_layers".into(), scan_layers.into());
    out.insert("_class_name".into(), "WanModel".into());
    out.insert("_diffusers_version".into(), MAXDIFFUSION_VERSION.into());
    (Value::Object(out), dropped)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_follow_maxdiffusion_generate_wan() {
        assert_eq!(state_items(&[""]), Some(vec!["wan_state"]));
        assert_eq!(
            state_items(&["transformer", "transformer_2"]),
            Some(vec![
                "high_noise_transformer_state",
                "low_noise_transformer_state"
            ])
        );
        assert_eq!(config_component(&["transformer", "transformer_2"]), Some(1));
        assert_eq!(state_items(&["a", "b"]), None);
    }

    #[test]
    fn unknown_config_keys_are_left_out() {
        let c = json!({"num_layers": 3, "foo": 1, "_class_name": "X"});
        let (v, dropped) = wan_config(c.as_object().unwrap(), true);
        assert_eq!(v["num_layers"], 3);
        assert_eq!(v["_class_name"], "WanModel");
        assert!(v.get("foo").is_none());
        assert_eq!(dropped, ["foo"]);
    }
}
