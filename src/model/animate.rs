//! Wan2.2-Animate-14B: which tensors are its Animate modules, and how to tell an Animate
//! checkpoint.
//!
//! Owns: the Animate-only module prefixes (the same in the original Wan names and in
//! diffusers' `WanAnimateTransformer3DModel`; golden/variants/animate/FACTS.md), the keys
//! that mark an Animate checkpoint in each naming, and splitting a checkpoint's names into
//! the WAN trunk (a Wan 2.1 I2V-14B model, read through the name table) and the Animate
//! modules. Does not own: the trunk's names (`model::wan_names`) or converting the Animate
//! modules between namings, which is not done: three of their conversions are not renames
//! (the motion encoder's blur kernels are dropped by diffusers, its activation biases are
//! reshaped, and the face adapter's fused `linear1_kv` is split into `to_k`/`to_v`), so the
//! Animate modules are carried only in the naming they were read in.

use super::wan_names::strip_wan_prefix;

/// Prefixes of the Animate-only modules: the pose patch embedding (nn.Conv3d), the motion
/// encoder, the face encoder and the face adapter (Wan-Video/Wan2.2@42bf4cfa
/// wan/modules/animate/model_animate.py; diffusers 0.42.1 transformer_wan_animate.py).
pub const ANIMATE_PREFIXES: [&str; 4] = [
    "pose_patch_embedding.",
    "motion_encoder.",
    "face_encoder.",
    "face_adapter.",
];

/// Keys that only an Animate checkpoint has: ComfyUI's detection key (original names,
/// comfy/model_detection.py) and diffusers' single-file detection key, and the diffusers
/// name of the same motion direction parameter.
const MARKERS: [&str; 3] = [
    "face_adapter.fuser_blocks.0.k_norm.weight",
    "motion_encoder.dec.direction.weight",
    "motion_encoder.motion_synthesis_weight",
];

/// True when `name` (with or without an original-Wan prefix) belongs to an Animate module.
pub fn is_animate_module(name: &str) -> bool {
    let name = strip_wan_prefix(name);
    ANIMATE_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// True when the keys are an Animate checkpoint's.
pub fn is_animate(names: &[String]) -> bool {
    names.iter().any(|n| MARKERS.contains(&strip_wan_prefix(n)))
}

/// The keys of the WAN trunk and of the Animate modules, in the order given.
pub fn split(names: &[String]) -> (Vec<String>, Vec<String>) {
    names.iter().cloned().partition(|n| !is_animate_module(n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn animate_modules_are_told_in_both_namings() {
        let names: Vec<String> = [
            "model.diffusion_model.face_adapter.fuser_blocks.0.k_norm.weight",
            "model.diffusion_model.blocks.0.self_attn.q.weight",
            "pose_patch_embedding.weight",
            "patch_embedding.weight",
        ]
        .map(String::from)
        .to_vec();
        assert!(is_animate(&names));
        let (trunk, animate) = split(&names);
        assert_eq!(trunk.len(), 2);
        assert_eq!(animate.len(), 2);
        assert!(!is_animate(&trunk));
        assert!(is_animate(&[
            "motion_encoder.motion_synthesis_weight".to_string()
        ]));
    }
}
