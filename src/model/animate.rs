//! Wan2.2-Animate-14B: its config, which tensors are its Animate modules, and the original
//! names' blur-kernel constants.
//!
//! Owns: `AnimateConfig` (the Animate keys of diffusers' `WanAnimateTransformer3DModel`
//! config.json) and the sizes it gives the Animate modules (the motion encoder's channel
//! table, its residual block count, the face adapter count), reading that config back from
//! shapes, the Animate-only module prefixes, and the motion encoder's blur-kernel buffers (golden/variants/animate/FACTS.md §3-§4). Does
//! not own: the names of the Animate parameters in each naming, which are rows of the one
//! name table (`model::wan_names`, scopes `FaceAdapter`, `MotionRes`, `MotionFc`,
//! `MotionOut`), or the trunk (a Wan 2.1 I2V-14B model, `model::wan`).
//!
//! Three of the conversions between the diffusers and the original names are not renames,
//! and each is modelled so the bytes are only moved: the FusedLeakyReLU biases are
//! (1, C, 1, 1) in the original and (C) in diffusers (a reshape,
//! `Transform::ChannelTo1C11`); the face adapter's fused `linear1_kv` is the row blocks
//! `to_k`, `to_v` (a fused tensor of two pieces, `NameRow::wan_piece`); and the 14 blur
//! kernels of the original are constant buffers diffusers recomputes (skipped on reading,
//! [`is_blur_kernel`]; written to an original-named output as their [`Constant`] values).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

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

/// The Animate keys of a diffusers `WanAnimateTransformer3DModel` config.json (diffusers
/// 0.42.1 transformer_wan_animate.py; FACTS.md §3 says which axis each one sizes).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnimateConfig {
    /// The pose patch embedding's input channels (`(in_channels - 4) / 2`).
    pub latent_channels: usize,
    /// The motion encoder's input size: log2(size) - 2 residual blocks.
    pub motion_encoder_size: usize,
    /// Output channels per resolution level (`null`: the built-in table).
    #[serde(default)]
    pub motion_encoder_channel_sizes: Option<BTreeMap<String, usize>>,
    /// The motion encoder's style width (conv_out out-channels, motion_network width).
    pub motion_style_dim: usize,
    /// The motion code width (motion_network.4 out, motion_synthesis_weight columns).
    pub motion_dim: usize,
    /// motion_synthesis_weight rows and the face encoder's input channels.
    pub motion_encoder_dim: usize,
    /// The face encoder's hidden width.
    pub face_encoder_hidden_dim: usize,
    /// The face encoder's heads (conv1_local out = hidden · heads).
    pub face_encoder_num_heads: usize,
    /// One face adapter per this many blocks (count = num_layers / it).
    pub inject_face_latents_blocks: usize,
}

/// diffusers' built-in motion encoder channel table
/// (`WAN_ANIMATE_MOTION_ENCODER_CHANNEL_SIZES`, transformer_wan_animate.py), used when
/// `motion_encoder_channel_sizes` is null.
const BUILTIN_CHANNELS: [(usize, usize); 9] = [
    (4, 512),
    (8, 512),
    (16, 512),
    (32, 512),
    (64, 256),
    (128, 128),
    (256, 64),
    (512, 32),
    (1024, 16),
];

/// The motion encoder's fully connected layers: fixed at 5 (`motion_blocks=5`, not in the
/// config); the last one maps to `motion_dim`.
pub const MOTION_FC_LAYERS: usize = 5;

impl AnimateConfig {
    /// Wan2.2-Animate-14B (diffusers `get_transformer_config("Wan2.2-Animate-14B")`, FACTS.md
    /// §2).
    pub fn released() -> AnimateConfig {
        AnimateConfig {
            latent_channels: 16,
            motion_encoder_size: 512,
            motion_encoder_channel_sizes: None,
            motion_style_dim: 512,
            motion_dim: 20,
            motion_encoder_dim: 512,
            face_encoder_hidden_dim: 1024,
            face_encoder_num_heads: 4,
            inject_face_latents_blocks: 5,
        }
    }

    /// The channel table's entry for resolution `level`.
    fn channels(&self, level: usize) -> Option<usize> {
        match &self.motion_encoder_channel_sizes {
            Some(t) => t.get(&level.to_string()).copied(),
            None => BUILTIN_CHANNELS
                .iter()
                .find(|(l, _)| *l == level)
                .map(|(_, c)| *c),
        }
    }

    /// The motion encoder's residual blocks: log2(size) - 2 (7 at 512).
    pub fn res_blocks(&self) -> usize {
        (self.motion_encoder_size.max(4).ilog2() as usize).saturating_sub(2)
    }

    /// conv_in's output channels.
    pub fn stem(&self) -> Option<usize> {
        self.channels(self.motion_encoder_size)
    }

    /// Residual block `i`'s output channels.
    pub fn res_out(&self, i: usize) -> Option<usize> {
        self.channels(self.motion_encoder_size >> (i + 1))
    }

    /// Residual block `i`'s input channels.
    pub fn res_in(&self, i: usize) -> Option<usize> {
        match i {
            0 => self.stem(),
            _ => self.res_out(i - 1),
        }
    }

    /// Output width of motion_network layer `j`.
    pub fn fc_out(&self, j: usize) -> usize {
        if j + 1 < MOTION_FC_LAYERS {
            self.motion_style_dim
        } else {
            self.motion_dim
        }
    }

    /// The face adapters of a model of `num_layers` blocks.
    pub fn face_adapters(&self, num_layers: usize) -> usize {
        num_layers / self.inject_face_latents_blocks.max(1)
    }

    /// The sizes this config gives the Animate parameters, as text (two configs with the
    /// same key shape every Animate parameter alike; the channel table's unused levels do
    /// not count).
    pub fn shape_key(&self, num_layers: usize) -> String {
        let width = |w: Option<usize>| w.map_or_else(|| "unknown".to_string(), |w| w.to_string());
        let res: Vec<String> = (0..self.res_blocks())
            .map(|i| width(self.res_out(i)))
            .collect();
        format!(
            "latent {}, motion stem {}, residual outputs [{}], style {}, motion {}, \
             encoder {}, face {}x{}, {} face adapters",
            self.latent_channels,
            width(self.stem()),
            res.join(", "),
            self.motion_style_dim,
            self.motion_dim,
            self.motion_encoder_dim,
            self.face_encoder_hidden_dim,
            self.face_encoder_num_heads,
            self.face_adapters(num_layers)
        )
    }

    /// Reads the config back from canonical shapes (`shape` of a canonical name), with
    /// `res` residual blocks, `faces` face adapters and `num_layers` blocks. The channel
    /// table keeps only the levels the shapes show, `None` when they are the built-in ones.
    pub fn infer(
        shape: impl Fn(&str) -> Option<Vec<usize>>,
        res: usize,
        faces: usize,
        num_layers: usize,
    ) -> Result<AnimateConfig, String> {
        let axis = |name: &str, k: usize| {
            shape(name)
                .and_then(|s| s.get(k).copied())
                .ok_or_else(|| format!("`{name}` (canonical name) is missing or has too few axes"))
        };
        if faces == 0 || res == 0 {
            return Err(format!(
                "{res} motion encoder residual blocks and {faces} face adapters: not an Animate model"
            ));
        }
        let size = 4usize << res;
        let mut table = BTreeMap::new();
        table.insert(size.to_string(), axis("motion_encoder.conv_in.weight", 0)?);
        for i in 0..res {
            let name = format!("motion_encoder.res_blocks.{i}.conv2.weight");
            table.insert((size >> (i + 1)).to_string(), axis(&name, 0)?);
        }
        let builtin = table.iter().all(|(l, c)| {
            BUILTIN_CHANNELS
                .iter()
                .any(|(bl, bc)| bl.to_string() == *l && bc == c)
        });
        let hidden = axis("face_encoder.conv2.weight", 0)?;
        Ok(AnimateConfig {
            latent_channels: axis("pose_patch_embedding.weight", 1)?,
            motion_encoder_size: size,
            motion_encoder_channel_sizes: (!builtin).then_some(table),
            motion_style_dim: axis("motion_encoder.conv_out.weight", 0)?,
            motion_dim: axis("motion_encoder.motion_synthesis_weight", 1)?,
            motion_encoder_dim: axis("motion_encoder.motion_synthesis_weight", 0)?,
            face_encoder_hidden_dim: hidden,
            face_encoder_num_heads: axis("face_encoder.conv1_local.weight", 0)? / hidden.max(1),
            inject_face_latents_blocks: num_layers / faces,
        })
    }
}

/// The original Wan names' blur-kernel buffers (`motion_encoder.enc.net_app.convs.N.conv2.0.kernel`
/// and `...skip.0.kernel`, persistent in Wan-Video/Wan2.2@42bf4cfa motion_encoder.py and in
/// ComfyUI): constants diffusers and MaxDiffusion recompute (`blur_kernel`, a non-persistent
/// buffer), so reading skips them (FACTS.md §4.1).
pub fn is_blur_kernel(name: &str) -> bool {
    let name = strip_wan_prefix(name);
    let Some(rest) = name.strip_prefix("motion_encoder.enc.net_app.convs.") else {
        return false;
    };
    let Some((index, local)) = rest.split_once('.') else {
        return false;
    };
    index.bytes().all(|b| b.is_ascii_digit()) && matches!(local, "conv2.0.kernel" | "skip.0.kernel")
}

/// A tensor a layout stores that no parameter carries: written from its known values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Constant {
    /// The original motion encoder's 4×4 blur kernel ([`blur_kernel_values`]).
    BlurKernel,
}

impl Constant {
    /// Its values, row-major.
    pub fn values(self) -> Vec<f32> {
        match self {
            Constant::BlurKernel => blur_kernel_values().to_vec(),
        }
    }

    /// Its shape.
    pub fn shape(self) -> Vec<usize> {
        match self {
            Constant::BlurKernel => vec![4, 4],
        }
    }
}

/// The blur kernels of an original-named motion encoder of `res` residual blocks: two per
/// block (`conv2.0` before conv2, `skip.0` before the skip convolution), in block order.
pub fn blur_kernel_names(res: usize) -> Vec<String> {
    (1..=res)
        .flat_map(|c| {
            ["conv2", "skip"].map(|m| format!("motion_encoder.enc.net_app.convs.{c}.{m}.0.kernel"))
        })
        .collect()
}

/// Why reading skips a blur kernel.
pub const BLUR_KERNEL_REASON: &str = "a blur-kernel buffer of the original motion encoder: a \
     constant (outer([1,3,3,1])^2/64) that diffusers and MaxDiffusion recompute";

/// The blur kernel's values, row-major 4×4: outer(k, k) / sum(k)² with k = [1, 3, 3, 1]
/// (Wan `make_kernel`), exact in every float dtype.
pub fn blur_kernel_values() -> [f32; 16] {
    let k = [1.0f32, 3.0, 3.0, 1.0];
    let mut v = [0f32; 16];
    for (i, a) in k.iter().enumerate() {
        for (j, b) in k.iter().enumerate() {
            v[i * 4 + j] = a * b / 64.0;
        }
    }
    v
}

/// True when `name` (with or without an original-Wan prefix) belongs to an Animate module.
pub fn is_animate_module(name: &str) -> bool {
    let name = strip_wan_prefix(name);
    ANIMATE_PREFIXES.iter().any(|p| name.starts_with(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn animate_modules_and_blur_kernels_are_told_in_both_namings() {
        assert!(is_animate_module(
            "model.diffusion_model.face_adapter.fuser_blocks.0.k_norm.weight"
        ));
        assert!(is_animate_module("pose_patch_embedding.weight"));
        assert!(!is_animate_module("patch_embedding.weight"));
        assert!(is_blur_kernel(
            "model.diffusion_model.motion_encoder.enc.net_app.convs.7.skip.0.kernel"
        ));
        assert!(!is_blur_kernel(
            "motion_encoder.enc.net_app.convs.7.skip.1.weight"
        ));
        assert_eq!(blur_kernel_names(7).len(), 14);
        let k = blur_kernel_values();
        assert_eq!(
            (k[0], k[5], k.iter().sum::<f32>()),
            (1.0 / 64.0, 9.0 / 64.0, 1.0)
        );
    }

    #[test]
    fn the_released_config_sizes_the_motion_encoder_like_diffusers() {
        let a = AnimateConfig::released();
        assert_eq!(a.res_blocks(), 7);
        assert_eq!(a.stem(), Some(32));
        let outs: Vec<Option<usize>> = (0..7).map(|i| a.res_out(i)).collect();
        let want = [64, 128, 256, 512, 512, 512, 512].map(Some);
        assert_eq!(outs, want);
        assert_eq!(
            (a.fc_out(3), a.fc_out(4), a.face_adapters(40)),
            (512, 20, 8)
        );
    }
}
