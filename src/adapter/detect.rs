//! Which convention an adapter file follows, from its keys and sidecars.
//!
//! Owns: `family_of` (the convention one key's spelling belongs to) and `detect` (the one
//! convention every key belongs to, spec conventions.md §11.0). A file whose keys mix
//! conventions is an error naming each with an example, unless the user passes `--from`.
//! Also `is_adapter` (whether a file holds adapter keys at all, from the same suffix tables
//! the parsers read, so that `inspect` calls a file an adapter exactly when
//! `AdapterSet::open` has something to read in it).
//! Does not own: parsing (the convention modules).

use std::collections::BTreeMap;
use std::path::Path;

use super::grammar::{self, COMFY, PEFT};
use super::lycoris;
use super::names::{DIFFUSERS_PREFIX, KOHYA_PREFIX, LYCORIS_PREFIX, PEFT_PREFIX};
use super::{AdapterError, Convention, KeyRef};

/// The convention a key's spelling belongs to.
pub fn family_of(key: &str) -> Convention {
    if key.contains(".parametrizations.") {
        Convention::Sa3
    } else if key.ends_with("_lora_a") || key.ends_with("_lora_b") {
        Convention::Nnx
    } else if key.starts_with(PEFT_PREFIX) {
        Convention::Peft
    } else if key.starts_with(KOHYA_PREFIX) {
        Convention::Kohya
    } else if key.starts_with(LYCORIS_PREFIX) {
        Convention::Lycoris
    } else if key.starts_with(DIFFUSERS_PREFIX) {
        Convention::Diffusers
    } else {
        // `diffusion_model.`, `model.diffusion_model.`, or no prefix (DiffSynth).
        Convention::Comfy
    }
}

/// Whether a key is spelled as only adapter files spell keys: a suffix of the shared LoRA
/// grammar (either dialect, including the ones it knows and refuses with a reason), a LyCORIS
/// module's tensor (any LyCORIS suffix but the bare `weight` every model has, so (IA)³'s
/// `on_input` and OFT's `oft_blocks` count), an SA3 parametrization or an NNX factor.
pub fn is_adapter_key(key: &str) -> bool {
    matches!(family_of(key), Convention::Sa3 | Convention::Nnx)
        || grammar::split(key, &COMFY).is_ok()
        || grammar::split(key, &PEFT).is_ok()
        || COMFY.unsupported.iter().any(|(s, _)| key.ends_with(s))
        || lycoris::split_key(key).is_some_and(|(_, s)| s != "weight")
}

/// Whether a file is an adapter: a PEFT folder (adapter_config.json), or any key spelled as
/// only adapters spell them (`is_adapter_key`). A model checkpoint has none.
pub fn is_adapter<'a>(mut keys: impl Iterator<Item = &'a str>, has_peft_config: bool) -> bool {
    has_peft_config || keys.any(is_adapter_key)
}

/// The convention of a file: every key must belong to the same one. A PEFT folder
/// (adapter_config.json) is PEFT.
pub fn detect(
    path: &Path,
    keys: &[KeyRef],
    has_peft_config: bool,
) -> Result<Convention, AdapterError> {
    let mut by: BTreeMap<Convention, (usize, &str)> = BTreeMap::new();
    for k in keys {
        let e = by.entry(family_of(&k.name)).or_insert((0, &k.name));
        e.0 += 1;
    }
    if has_peft_config && by.keys().all(|c| *c == Convention::Peft) {
        return Ok(Convention::Peft);
    }
    match by.len() {
        0 => Err(AdapterError::Refused {
            path: path.to_path_buf(),
            reason: "holds no tensors".into(),
        }),
        1 => Ok(*by.keys().next().unwrap_or(&Convention::Comfy)),
        _ => Err(AdapterError::Mixed {
            path: path.to_path_buf(),
            summary: by
                .iter()
                .map(|(c, (n, ex))| {
                    let keys = crate::human::plural(*n, &format!("{c} key"), &format!("{c} keys"));
                    format!("{keys}, e.g. `{ex}`")
                })
                .collect::<Vec<_>>()
                .join("; "),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families() {
        for (k, c) in [
            (
                "base_model.model.blocks.0.attn1.to_q.lora_A.weight",
                Convention::Peft,
            ),
            (
                "transformer.blocks.0.attn1.to_q.lora_A.weight",
                Convention::Diffusers,
            ),
            (
                "diffusion_model.blocks.0.self_attn.q.lora_down.weight",
                Convention::Comfy,
            ),
            (
                "blocks.0.self_attn.q.lora_A.default.weight",
                Convention::Comfy,
            ),
            ("lora_unet_blocks_0_self_attn_q.alpha", Convention::Kohya),
            ("lora_unet__blocks_0_self_attn_q.alpha", Convention::Kohya),
            (
                "model.transformer.layers.0.self_attn.to_qkv.parametrizations.weight.0.lora_A",
                Convention::Sa3,
            ),
            ("blocks.attn1.query.kernel_lora_a", Convention::Nnx),
        ] {
            assert_eq!(family_of(k), c, "{k}");
        }
    }

    #[test]
    fn adapter_keys_include_every_lycoris_factor_and_no_model_weight() {
        for k in [
            "diffusion_model.blocks.0.self_attn.q.lora_down.weight",
            "base_model.model.blocks.0.attn1.to_q.lora_magnitude_vector",
            "lora_unet_blocks_0_self_attn_q.alpha",
            "diffusion_model.blocks.0.modulation.diff_m",
            "lycoris_blocks_1_attn2_to_q.on_input",
            "lycoris_blocks_0_ffn_net_2.oft_blocks",
            "lycoris_blocks_1_ffn_net_0_proj.lokr_w1_a",
            "lycoris_blocks_2_ffn_net_0_proj.b1.weight",
            "lora_unet_patch_embedding.hada_t1",
            "diffusion_model.blocks.0.self_attn.q.lora_mid.weight",
            "m.parametrizations.weight.0.M_xs",
            "blocks.attn1.query.kernel_lora_a",
        ] {
            assert!(is_adapter_key(k), "{k}");
        }
        for k in [
            "blocks.0.attn1.to_q.weight",
            "blocks.0.attn1.to_q.bias",
            "model.diffusion_model.blocks.0.modulation",
            "patch_embedding.weight",
            "lycoris_blocks_1_attn2_to_q.weight",
            "scale_shift_table",
        ] {
            assert!(!is_adapter_key(k), "{k}");
        }
    }
}
