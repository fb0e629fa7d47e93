//! Which convention an adapter file follows, from its keys and sidecars.
//!
//! Owns: `family_of` (the convention one key's spelling belongs to) and `detect` (the one
//! convention every key belongs to, spec conventions.md §11.0). A file whose keys mix
//! conventions is an error naming each with an example, unless the user passes `--from`.
//! Does not own: parsing (the convention modules).

use std::collections::BTreeMap;
use std::path::Path;

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
                .map(|(c, (n, ex))| format!("{n} {c} key(s), e.g. `{ex}`"))
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
}
