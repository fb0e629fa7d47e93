//! WAN 2.1 / 2.2 transformer configurations and their complete parameter tables.
//!
//! Owns: `WanConfig` (the fields of diffusers' `WanTransformer3DModel` config.json), the
//! released configs of spec wan.md §1.3, the size a config gives each shape symbol and
//! which optional parts it has, and `diffusers_params`, the complete list of parameter
//! names and PyTorch-layout shapes a config implies (spec wan.md §1.2), derived from the
//! name table. Does not own: the names, shapes in symbols and other layouts of the
//! parameters (`model::wan_names`) or the forward pass (`runner`).

use serde::{Deserialize, Serialize};

use super::animate::{AnimateConfig, MOTION_FC_LAYERS};
use super::wan_layout::Layout;
use super::wan_names::{Dim, NameRow, Scope, WanPart, entries};

/// The config fields of `WanTransformer3DModel` that determine parameters and the forward
/// pass. Unknown fields of a real config.json are ignored (diffusers adds `_class_name`,
/// `_diffusers_version`, ...).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct WanConfig {
    /// (pt, ph, pw).
    pub patch_size: [usize; 3],
    /// H.
    pub num_attention_heads: usize,
    /// Dh.
    pub attention_head_dim: usize,
    /// C_in.
    pub in_channels: usize,
    /// C_out (`None` means C_in).
    pub out_channels: Option<usize>,
    /// T, the text encoder width.
    pub text_dim: usize,
    /// Fq, the sinusoidal timestep width.
    pub freq_dim: usize,
    /// F.
    pub ffn_dim: usize,
    /// L.
    pub num_layers: usize,
    /// Affine LayerNorm before cross-attention.
    pub cross_attn_norm: bool,
    /// Ignored by diffusers (always RMSNorm over D); kept for round-tripping.
    pub qk_norm: Option<String>,
    /// Norm epsilon.
    pub eps: f64,
    /// I (CLIP width) for Wan2.1 I2V/FLF2V.
    pub image_dim: Option<usize>,
    /// A (added k/v input width) for Wan2.1 I2V/FLF2V.
    pub added_kv_proj_dim: Option<usize>,
    /// Length of the RoPE table per axis.
    pub rope_max_seq_len: usize,
    /// P for FLF2V.
    pub pos_embed_seq_len: Option<usize>,
    /// The blocks after which a VACE model adds a context hint, one VACE block each
    /// (`WanVACETransformer3DModel`); absent for every other model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vace_layers: Option<Vec<usize>>,
    /// C_vace, the VACE context's input channels (96 in every released VACE model).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vace_in_channels: Option<usize>,
    /// SkyReels-V2's frame-rate conditioning (`SkyReelsV2Transformer3DModel`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub inject_sample_info: bool,
    /// Input channels of Wan Fun's reference-image convolution (`ref_conv`; VideoX-Fun's
    /// config key, 16 in every release).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub in_dim_ref_conv: Option<usize>,
    /// Input channels of Wan Fun's camera adapter before its 8× pixel unshuffle
    /// (`control_adapter`; VideoX-Fun's config key, 24 in every release).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub in_dim_control_adapter: Option<usize>,
    /// Wan2.2-Animate's modules (`WanAnimateTransformer3DModel`); absent for every other
    /// model.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub animate: Option<AnimateConfig>,
}

impl Default for WanConfig {
    fn default() -> Self {
        // diffusers' defaults (spec wan.md §1.1).
        WanConfig {
            patch_size: [1, 2, 2],
            num_attention_heads: 40,
            attention_head_dim: 128,
            in_channels: 16,
            out_channels: Some(16),
            text_dim: 4096,
            freq_dim: 256,
            ffn_dim: 13824,
            num_layers: 40,
            cross_attn_norm: true,
            qk_norm: Some("rms_norm_across_heads".into()),
            eps: 1e-6,
            image_dim: None,
            added_kv_proj_dim: None,
            rope_max_seq_len: 1024,
            pos_embed_seq_len: None,
            vace_layers: None,
            vace_in_channels: None,
            inject_sample_info: false,
            in_dim_ref_conv: None,
            in_dim_control_adapter: None,
            animate: None,
        }
    }
}

/// `c` with the Wan 2.1 CLIP image branch (CLIP ViT-H's 1280-wide features projected to
/// D; spec wan.md §1.3).
fn image_branch(c: WanConfig) -> WanConfig {
    WanConfig {
        image_dim: Some(1280),
        added_kv_proj_dim: Some(c.inner_dim()),
        ..c
    }
}

/// The camera adapter's pixel unshuffle: `downscale_factor_control_adapter` 8, squared
/// (VideoX-Fun wan_camera_adapter.py `SimpleAdapter`).
pub const CONTROL_UNSHUFFLE: usize = 64;

/// A released WAN model (spec wan.md §1.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum WanVariant {
    /// Wan2.1-T2V-1.3B.
    T2V1_3B,
    /// Wan2.1-T2V-14B; also each expert of Wan2.2-T2V-A14B.
    T2V14B,
    /// Wan2.1-I2V-14B (480P and 720P).
    I2V14B,
    /// Wan2.1-FLF2V-14B-720P.
    FLF2V14B,
    /// Wan2.2-I2V-A14B, one expert.
    I2VA14B,
    /// Wan2.2-TI2V-5B.
    TI2V5B,
    /// Wan2.1-VACE-1.3B.
    Vace1_3B,
    /// Wan2.1-VACE-14B; also each expert of Wan2.2-VACE-Fun-A14B.
    Vace14B,
    /// SkyReels-V2-DF-1.3B (diffusion forcing, with frame-rate conditioning).
    SkyReelsDf1_3B,
    /// SkyReels-V2-I2V-1.3B; also Wan2.1-Fun(-V1.1)-1.3B-InP.
    SkyReelsI2V1_3B,
    /// Wan2.1-Fun-1.3B-Control.
    FunControl1_3B,
    /// Wan2.1-Fun-14B-Control.
    FunControl14B,
    /// Wan2.1-Fun-V1.1-1.3B-Control (with the reference-image convolution).
    FunV11Control1_3B,
    /// Wan2.1-Fun-V1.1-14B-Control.
    FunV11Control14B,
    /// Wan2.1-Fun-V1.1-1.3B-Control-Camera.
    FunV11Camera1_3B,
    /// Wan2.1-Fun-V1.1-14B-Control-Camera.
    FunV11Camera14B,
    /// Wan2.2-Fun-A14B-Control, one expert.
    Fun22Control,
    /// Wan2.2-Fun-A14B-Control-Camera, one expert.
    Fun22Camera,
    /// Wan2.2-Animate-14B (a Wan 2.1 I2V-14B trunk with the Animate modules).
    Animate14B,
}

impl WanVariant {
    /// Every released variant.
    pub const ALL: [WanVariant; 19] = [
        WanVariant::T2V1_3B,
        WanVariant::T2V14B,
        WanVariant::I2V14B,
        WanVariant::FLF2V14B,
        WanVariant::I2VA14B,
        WanVariant::TI2V5B,
        WanVariant::Vace1_3B,
        WanVariant::Vace14B,
        WanVariant::SkyReelsDf1_3B,
        WanVariant::SkyReelsI2V1_3B,
        WanVariant::FunControl1_3B,
        WanVariant::FunControl14B,
        WanVariant::FunV11Control1_3B,
        WanVariant::FunV11Control14B,
        WanVariant::FunV11Camera1_3B,
        WanVariant::FunV11Camera14B,
        WanVariant::Fun22Control,
        WanVariant::Fun22Camera,
        WanVariant::Animate14B,
    ];

    /// A human name.
    pub fn name(self) -> &'static str {
        match self {
            WanVariant::T2V1_3B => "Wan2.1-T2V-1.3B",
            WanVariant::T2V14B => {
                "Wan2.1-T2V-14B (or one Wan2.2-T2V-A14B expert, or SkyReels-V2-T2V/DF-14B)"
            }
            WanVariant::I2V14B => {
                "Wan2.1-I2V-14B (or SkyReels-V2-I2V-14B, or Wan2.1-Fun(-V1.1)-14B-InP)"
            }
            WanVariant::FLF2V14B => "Wan2.1-FLF2V-14B",
            WanVariant::I2VA14B => "Wan2.2-I2V-A14B expert (or a Wan2.2-Fun-A14B-InP expert)",
            WanVariant::TI2V5B => "Wan2.2-TI2V-5B",
            WanVariant::Vace1_3B => "Wan2.1-VACE-1.3B",
            WanVariant::Vace14B => "Wan2.1-VACE-14B (or one Wan2.2-VACE-Fun-A14B expert)",
            WanVariant::SkyReelsDf1_3B => "SkyReels-V2-DF-1.3B",
            WanVariant::SkyReelsI2V1_3B => "SkyReels-V2-I2V-1.3B (or Wan2.1-Fun(-V1.1)-1.3B-InP)",
            WanVariant::FunControl1_3B => "Wan2.1-Fun-1.3B-Control",
            WanVariant::FunControl14B => "Wan2.1-Fun-14B-Control",
            WanVariant::FunV11Control1_3B => "Wan2.1-Fun-V1.1-1.3B-Control",
            WanVariant::FunV11Control14B => "Wan2.1-Fun-V1.1-14B-Control",
            WanVariant::FunV11Camera1_3B => "Wan2.1-Fun-V1.1-1.3B-Control-Camera",
            WanVariant::FunV11Camera14B => "Wan2.1-Fun-V1.1-14B-Control-Camera",
            WanVariant::Fun22Control => "Wan2.2-Fun-A14B-Control expert",
            WanVariant::Fun22Camera => "Wan2.2-Fun-A14B-Control-Camera expert",
            WanVariant::Animate14B => "Wan2.2-Animate-14B",
        }
    }

    /// A short identifier for JSON and file names.
    pub fn id(self) -> &'static str {
        match self {
            WanVariant::T2V1_3B => "wan2.1-t2v-1.3b",
            WanVariant::T2V14B => "wan2.1-t2v-14b",
            WanVariant::I2V14B => "wan2.1-i2v-14b",
            WanVariant::FLF2V14B => "wan2.1-flf2v-14b",
            WanVariant::I2VA14B => "wan2.2-i2v-a14b",
            WanVariant::TI2V5B => "wan2.2-ti2v-5b",
            WanVariant::Vace1_3B => "wan2.1-vace-1.3b",
            WanVariant::Vace14B => "wan2.1-vace-14b",
            WanVariant::SkyReelsDf1_3B => "skyreels-v2-df-1.3b",
            WanVariant::SkyReelsI2V1_3B => "skyreels-v2-i2v-1.3b",
            WanVariant::FunControl1_3B => "wan2.1-fun-1.3b-control",
            WanVariant::FunControl14B => "wan2.1-fun-14b-control",
            WanVariant::FunV11Control1_3B => "wan2.1-fun-v1.1-1.3b-control",
            WanVariant::FunV11Control14B => "wan2.1-fun-v1.1-14b-control",
            WanVariant::FunV11Camera1_3B => "wan2.1-fun-v1.1-1.3b-control-camera",
            WanVariant::FunV11Camera14B => "wan2.1-fun-v1.1-14b-control-camera",
            WanVariant::Fun22Control => "wan2.2-fun-a14b-control",
            WanVariant::Fun22Camera => "wan2.2-fun-a14b-control-camera",
            WanVariant::Animate14B => "wan2.2-animate-14b",
        }
    }

    /// The released config (values from `get_transformer_config` of diffusers'
    /// `convert_wan_to_diffusers.py`, spec wan.md §1.3, and of its
    /// `convert_skyreelsv2_to_diffusers.py` for SkyReels-V2).
    pub fn config(self) -> WanConfig {
        let base = WanConfig::default();
        let small = WanConfig {
            num_attention_heads: 12,
            ffn_dim: 8960,
            num_layers: 30,
            ..base.clone()
        };
        match self {
            WanVariant::T2V1_3B => small,
            WanVariant::T2V14B => base,
            WanVariant::I2V14B => WanConfig {
                in_channels: 36,
                ..image_branch(base)
            },
            WanVariant::FLF2V14B => WanConfig {
                in_channels: 36,
                pos_embed_seq_len: Some(514),
                ..image_branch(base)
            },
            WanVariant::I2VA14B => WanConfig {
                in_channels: 36,
                ..base
            },
            WanVariant::TI2V5B => WanConfig {
                num_attention_heads: 24,
                in_channels: 48,
                out_channels: Some(48),
                ffn_dim: 14336,
                num_layers: 30,
                ..base
            },
            WanVariant::Vace1_3B => WanConfig {
                vace_layers: Some((0..30).step_by(2).collect()),
                vace_in_channels: Some(96),
                ..small
            },
            WanVariant::Vace14B => WanConfig {
                vace_layers: Some((0..40).step_by(5).collect()),
                vace_in_channels: Some(96),
                ..base
            },
            WanVariant::SkyReelsDf1_3B => WanConfig {
                inject_sample_info: true,
                ..small
            },
            WanVariant::SkyReelsI2V1_3B => WanConfig {
                in_channels: 36,
                ..image_branch(small)
            },
            // Wan Fun (golden/variants/fun/FACTS.md: VideoX-Fun's code, shapes checked
            // against DiffSynth-Studio's hashes of the released files).
            WanVariant::FunControl1_3B => WanConfig {
                in_channels: 48,
                ..image_branch(small)
            },
            WanVariant::FunControl14B => WanConfig {
                in_channels: 48,
                ..image_branch(base)
            },
            WanVariant::FunV11Control1_3B => WanConfig {
                in_channels: 48,
                in_dim_ref_conv: Some(16),
                ..image_branch(small)
            },
            WanVariant::FunV11Control14B => WanConfig {
                in_channels: 48,
                in_dim_ref_conv: Some(16),
                ..image_branch(base)
            },
            WanVariant::FunV11Camera1_3B => WanConfig {
                in_channels: 32,
                in_dim_control_adapter: Some(24),
                ..image_branch(small)
            },
            WanVariant::FunV11Camera14B => WanConfig {
                in_channels: 32,
                in_dim_control_adapter: Some(24),
                ..image_branch(base)
            },
            WanVariant::Fun22Control => WanConfig {
                in_channels: 52,
                in_dim_ref_conv: Some(16),
                ..base
            },
            WanVariant::Fun22Camera => WanConfig {
                in_channels: 36,
                in_dim_control_adapter: Some(24),
                ..base
            },
            // golden/variants/animate/FACTS.md §2 (diffusers' get_transformer_config).
            WanVariant::Animate14B => WanConfig {
                in_channels: 36,
                animate: Some(AnimateConfig::released()),
                ..image_branch(base)
            },
        }
    }

    /// The diffusers class whose `config.json` this variant's folder carries.
    pub fn class_name(self) -> &'static str {
        self.config().class_name()
    }

    /// Total parameter count of spec wan.md §1.5.
    pub fn expected_params(self) -> u64 {
        match self {
            WanVariant::T2V1_3B => 1_418_996_800,
            WanVariant::T2V14B => 14_288_491_584,
            WanVariant::I2V14B => 16_394_878_784,
            WanVariant::FLF2V14B => 16_395_536_704,
            WanVariant::I2VA14B => 14_288_901_184,
            WanVariant::TI2V5B => 4_999_787_712,
            // diffusers 0.42.1 models of the released configs built on torch's meta device,
            // their parameters counted.
            WanVariant::Vace1_3B => 2_153_972_032,
            WanVariant::Vace14B => 17_337_592_896,
            WanVariant::SkyReelsDf1_3B => 1_435_525_696,
            WanVariant::SkyReelsI2V1_3B => 1_564_428_608,
            // The released Fun files' tensor lists (golden/variants/fun/shapes, each checked
            // against DiffSynth-Studio's md5 of the real file's names and shapes).
            WanVariant::FunControl1_3B => 1_564_502_336,
            WanVariant::FunControl14B => 16_395_124_544,
            WanVariant::FunV11Control1_3B => 1_564_602_176,
            WanVariant::FunV11Control14B => 16_395_457_344,
            WanVariant::FunV11Camera1_3B => 1_616_313_152,
            WanVariant::FunV11Camera14B => 16_898_128_704,
            WanVariant::Fun22Control => 14_289_561_664,
            WanVariant::Fun22Camera => 14_792_233_024,
            // diffusers 0.42.1's WanAnimateTransformer3DModel of the released config on
            // torch's meta device (golden/variants/animate/shapes/animate_14b.json).
            WanVariant::Animate14B => 17_274_816_884,
        }
    }
}

/// One parameter of a model: its name and PyTorch-layout shape.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ParamSpec {
    /// Full parameter name in this naming.
    pub name: String,
    /// Shape.
    pub shape: Vec<usize>,
}

impl ParamSpec {
    /// Number of elements.
    pub fn numel(&self) -> u64 {
        self.shape.iter().map(|&d| d as u64).product()
    }
}

impl WanConfig {
    /// D = H · Dh.
    pub fn inner_dim(&self) -> usize {
        self.num_attention_heads * self.attention_head_dim
    }

    /// C_out.
    pub fn out_channels(&self) -> usize {
        self.out_channels.unwrap_or(self.in_channels)
    }

    /// pt · ph · pw.
    pub fn patch_volume(&self) -> usize {
        self.patch_size.iter().product()
    }

    /// True when the model has the Wan2.1 CLIP image branch (image embedder, add_k/add_v).
    pub fn has_image_branch(&self) -> bool {
        self.image_dim.is_some() || self.added_kv_proj_dim.is_some()
    }

    /// The diffusers classes whose config.json is a `WanConfig`.
    pub const CLASS_NAMES: [&'static str; 4] = [
        "WanTransformer3DModel",
        "WanVACETransformer3DModel",
        "SkyReelsV2Transformer3DModel",
        "WanAnimateTransformer3DModel",
    ];

    /// True when a config.json's `_class_name` (absent: `None`) describes a `WanConfig`.
    pub fn is_class(class_name: Option<&str>) -> bool {
        class_name.is_none_or(|c| Self::CLASS_NAMES.contains(&c))
    }

    /// Parses a diffusers config.json.
    pub fn from_json(text: &str) -> Result<WanConfig, serde_json::Error> {
        Self::from_value(serde_json::from_str(text)?)
    }

    /// Reads a parsed diffusers config.json.
    pub fn from_value(json: serde_json::Value) -> Result<WanConfig, serde_json::Error> {
        let mut c: WanConfig = serde_json::from_value(json)?;
        if c.vace_layers.is_some() && c.vace_in_channels.is_none() {
            // `WanVACETransformer3DModel`'s default.
            c.vace_in_channels = Some(96);
        }
        Ok(c)
    }

    /// Every parameter of the diffusers `WanTransformer3DModel` for this config, with
    /// PyTorch-layout shapes (spec wan.md §1.2), derived from the name table
    /// (`model::wan_names`) in a fixed order: the top-level parameters before the blocks,
    /// then blocks 0..L, then the output head.
    pub fn diffusers_params(&self) -> Vec<ParamSpec> {
        let top = |head: bool| {
            entries()
                .iter()
                .filter(move |e| e.scope == Scope::Top && e.is_head() == head)
                .filter_map(|e| self.param_of_row(e, 0))
        };
        let mut p: Vec<ParamSpec> = top(false).collect();
        for scope in [
            Scope::Block,
            Scope::VaceBlock,
            Scope::MotionRes,
            Scope::MotionFc,
            Scope::FaceAdapter,
        ] {
            for b in 0..self.blocks_of(scope) {
                let block = entries().iter().filter(|e| e.scope == scope);
                p.extend(block.filter_map(|e| self.param_of_row(e, b)));
            }
        }
        let res = self.blocks_of(Scope::MotionRes);
        let out = entries().iter().filter(|e| e.scope == Scope::MotionOut);
        p.extend(out.filter_map(|e| self.param_of_row(e, res)));
        p.extend(top(true));
        p
    }

    /// The number of blocks in `scope`'s stack (L, one VACE block per `vace_layers` entry,
    /// the Animate lists); 1 for the top level.
    pub fn blocks_of(&self, scope: Scope) -> usize {
        let animate = |f: &dyn Fn(&AnimateConfig) -> usize| self.animate.as_ref().map_or(0, f);
        match scope {
            Scope::Top | Scope::MotionOut => 1,
            Scope::Block => self.num_layers,
            Scope::VaceBlock => self.vace_layers.as_ref().map_or(0, Vec::len),
            Scope::FaceAdapter => animate(&|a| a.face_adapters(self.num_layers)),
            Scope::MotionRes => animate(&AnimateConfig::res_blocks),
            Scope::MotionFc => animate(&|_| MOTION_FC_LAYERS),
        }
    }

    /// The diffusers class this config describes.
    pub fn class_name(&self) -> &'static str {
        if self.vace_layers.is_some() {
            "WanVACETransformer3DModel"
        } else if self.animate.is_some() {
            "WanAnimateTransformer3DModel"
        } else if self.inject_sample_info {
            "SkyReelsV2Transformer3DModel"
        } else {
            "WanTransformer3DModel"
        }
    }

    /// The row's parameter in block `block` (ignored for top-level rows), when this config
    /// has it.
    fn param_of_row(&self, e: &NameRow, block: usize) -> Option<ParamSpec> {
        let vace_only = e.scope == Scope::VaceBlock || e.part == WanPart::VaceInput;
        if !self.has_part(e.part)
            || (vace_only && !self.has_part(WanPart::Vace))
            || (e.part == WanPart::VaceInput && block != 0)
        {
            return None;
        }
        let shape = e
            .shape
            .iter()
            .map(|&d| self.dim_at(d, block))
            .collect::<Option<_>>()?;
        Some(ParamSpec {
            name: e.stored_name(Layout::Diffusers, block).0,
            shape,
        })
    }

    /// True when this config has the parameters of `part`.
    pub fn has_part(&self, part: WanPart) -> bool {
        match part {
            WanPart::Core => true,
            WanPart::ImageEmbedder => self.image_dim.is_some(),
            WanPart::PosEmbed => self.image_dim.is_some() && self.pos_embed_seq_len.is_some(),
            WanPart::ImageCrossAttn => self.added_kv_proj_dim.is_some(),
            WanPart::CrossAttnNorm => self.cross_attn_norm,
            WanPart::Vace | WanPart::VaceInput => self.vace_layers.is_some(),
            WanPart::FpsEmbed => self.inject_sample_info,
            WanPart::RefConv => self.in_dim_ref_conv.is_some(),
            WanPart::ControlAdapter => self.in_dim_control_adapter.is_some(),
            WanPart::Animate => self.animate.is_some(),
        }
    }

    /// [`WanConfig::dim`] in block `block` of a row's scope: the Animate motion encoder's
    /// channels differ per residual block and per fully connected layer.
    pub fn dim_at(&self, dim: Dim, block: usize) -> Option<usize> {
        let a = self.animate.as_ref();
        match dim {
            Dim::ResIn => a?.res_in(block),
            Dim::ResOut => a?.res_out(block),
            Dim::MotionFcOut => Some(a?.fc_out(block)),
            _ => self.dim(dim),
        }
    }

    /// The size this config gives a shape symbol, `None` for an optional width it lacks.
    pub fn dim(&self, dim: Dim) -> Option<usize> {
        let [pt, ph, pw] = self.patch_size;
        Some(match dim {
            Dim::One => 1,
            Dim::Two => 2,
            Dim::Six => 6,
            Dim::Inner => self.inner_dim(),
            Dim::SixInner => 6 * self.inner_dim(),
            Dim::InChannels => self.in_channels,
            Dim::PatchT => pt,
            Dim::PatchH => ph,
            Dim::PatchW => pw,
            Dim::Freq => self.freq_dim,
            Dim::Text => self.text_dim,
            Dim::Ffn => self.ffn_dim,
            Dim::Image => self.image_dim?,
            Dim::AddedKv => self.added_kv_proj_dim?,
            Dim::PosEmbed => self.pos_embed_seq_len?,
            Dim::VaceIn => self.vace_in_channels?,
            Dim::Three => 3,
            Dim::RefConvIn => self.in_dim_ref_conv?,
            Dim::ControlIn => self.in_dim_control_adapter? * CONTROL_UNSHUFFLE,
            Dim::OutPatch => self.out_channels() * self.patch_volume(),
            Dim::Four => 4,
            Dim::HeadDim => self.attention_head_dim,
            Dim::Latent => self.animate.as_ref()?.latent_channels,
            Dim::MotionStem => self.animate.as_ref()?.stem()?,
            Dim::ResIn | Dim::ResOut => self.dim_at(dim, 0)?,
            Dim::ResLast => {
                let a = self.animate.as_ref()?;
                a.res_out(a.res_blocks().checked_sub(1)?)?
            }
            Dim::MotionStyle => self.animate.as_ref()?.motion_style_dim,
            Dim::MotionFcOut => self.dim_at(dim, 0)?,
            Dim::MotionDim => self.animate.as_ref()?.motion_dim,
            Dim::MotionEnc => self.animate.as_ref()?.motion_encoder_dim,
            Dim::FaceWide => {
                let a = self.animate.as_ref()?;
                a.face_encoder_hidden_dim * a.face_encoder_num_heads
            }
            Dim::FaceHidden => self.animate.as_ref()?.face_encoder_hidden_dim,
        })
    }

    /// Total parameter count.
    pub fn param_count(&self) -> u64 {
        self.diffusers_params().iter().map(ParamSpec::numel).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn released_configs_have_the_spec_parameter_totals() {
        for v in WanVariant::ALL {
            assert_eq!(
                v.config().param_count(),
                v.expected_params(),
                "{}",
                v.name()
            );
        }
    }

    #[test]
    fn per_block_count_of_1_3b_matches_spec() {
        let cfg = WanVariant::T2V1_3B.config();
        let block: u64 = cfg
            .diffusers_params()
            .iter()
            .filter(|p| p.name.starts_with("blocks.0."))
            .map(ParamSpec::numel)
            .sum();
        assert_eq!(block, 46_440_704);
    }

    #[test]
    fn variant_only_fragments_match_exactly_their_rows_of_the_name_table() {
        for e in entries() {
            let want = match (e.scope, e.part) {
                (Scope::VaceBlock, _) | (_, WanPart::Vace | WanPart::VaceInput) => {
                    Some(WanPart::Vace)
                }
                (_, WanPart::Core | WanPart::CrossAttnNorm) => None,
                (_, p) => Some(p),
            };
            for layout in Layout::ALL.into_iter().filter(|&l| e.fits(l)) {
                let name = e.stored_name(layout, 0).0;
                let found = VariantOnlyPart::of(&name).map(|p| p.rows);
                assert_eq!(found, want, "{name}");
            }
        }
    }

    #[test]
    fn every_released_input_channel_count_is_named_for_its_variants() {
        for v in WanVariant::ALL {
            let named = input_channels_model(v.config().in_channels)
                .unwrap_or_else(|| panic!("{}: in_channels {}", v.name(), v.config().in_channels));
            let kind = match v {
                WanVariant::T2V1_3B | WanVariant::T2V14B => "T2V",
                WanVariant::I2V14B
                | WanVariant::FLF2V14B
                | WanVariant::I2VA14B
                | WanVariant::Animate14B => "I2V/FLF2V",
                WanVariant::TI2V5B => "TI2V-5B",
                WanVariant::Vace1_3B | WanVariant::Vace14B | WanVariant::SkyReelsDf1_3B => "T2V",
                WanVariant::SkyReelsI2V1_3B | WanVariant::Fun22Camera => "I2V/FLF2V",
                WanVariant::FunControl1_3B
                | WanVariant::FunControl14B
                | WanVariant::FunV11Control1_3B
                | WanVariant::FunV11Control14B => "Fun Control",
                WanVariant::FunV11Camera1_3B | WanVariant::FunV11Camera14B => "Control-Camera",
                WanVariant::Fun22Control => "Fun-A14B-Control",
            };
            assert!(named.contains(kind), "{}: {named}", v.name());
        }
        assert_eq!(input_channels_model(4), None);
    }

    #[test]
    fn config_json_with_extra_fields_parses() {
        let cfg = WanConfig::from_json(
            r#"{"_class_name":"WanTransformer3DModel","num_attention_heads":12,"ffn_dim":8960,"num_layers":30,"image_dim":null}"#,
        )
        .unwrap();
        assert_eq!(cfg, WanVariant::T2V1_3B.config());
    }
}

/// Parts of the WAN transformer that only some released variants have, each with fragments
/// of its parameter names in every naming (diffusers, original Wan / ComfyUI, NNX) and the
/// variants that have it (spec/wan.md: `image_dim`, `pos_embed_seq_len`; the Wan 2.2
/// checkpoints have no image branch). Used to explain, in model terms, why an adapter's
/// modules bind to nothing in a base. The fragments are spelling-agnostic substrings (they
/// must also match kohya's underscored names); a test checks them against the rows of the
/// name table that belong to each part, so they cannot drift from it.
pub const VARIANT_ONLY_PARTS: &[VariantOnlyPart] = &[
    VariantOnlyPart {
        rows: WanPart::Vace,
        fragments: &["vace_"],
        part: "the VACE context blocks",
        models: "a Wan VACE model (Wan2.1-VACE, Wan2.2-VACE-Fun)",
    },
    VariantOnlyPart {
        rows: WanPart::RefConv,
        fragments: &["ref_conv"],
        part: "the reference-image convolution",
        models: "a Wan Fun V1.1 Control or Wan2.2-Fun-A14B-Control model",
    },
    VariantOnlyPart {
        rows: WanPart::ControlAdapter,
        fragments: &["control_adapter"],
        part: "the camera control adapter",
        models: "a Wan Fun Control-Camera model",
    },
    VariantOnlyPart {
        rows: WanPart::FpsEmbed,
        fragments: &["fps_embedding", "fps_projection"],
        part: "the frame-rate conditioning",
        models: "a SkyReels-V2 diffusion-forcing 1.3B model",
    },
    VariantOnlyPart {
        rows: WanPart::ImageCrossAttn,
        fragments: &[
            "add_k_proj",
            "add_v_proj",
            "norm_added_k",
            "k_img",
            "v_img",
            "norm_k_img",
        ],
        part: "the image cross-attention",
        models: "a Wan 2.1 I2V/FLF2V model",
    },
    VariantOnlyPart {
        rows: WanPart::PosEmbed,
        fragments: &["pos_embed", "emb_pos"],
        part: "the first-last-frame position embedding",
        models: "a Wan 2.1 FLF2V model",
    },
    VariantOnlyPart {
        rows: WanPart::Animate,
        fragments: &[
            "pose_patch_embedding",
            "motion_encoder",
            "face_encoder",
            "face_adapter",
        ],
        part: "the pose embedding, motion encoder, face encoder and face adapters",
        models: "a Wan2.2-Animate model",
    },
    VariantOnlyPart {
        rows: WanPart::ImageEmbedder,
        fragments: &["image_embedder", "img_emb"],
        part: "the image embedder (CLIP projection)",
        models: "a Wan 2.1 I2V/FLF2V model",
    },
];

/// What a patch embedding's input channel count says about the model it belongs to, in
/// model terms, or `None` for a count no released model has. The counts are the released
/// configs' `in_channels` (spec wan.md §1.3): the 16 channels of the Wan 2.1 VAE's latent
/// for text-to-video; 36 for image-to-video (that latent, 4 channels of frame mask and the
/// 16-channel latent of the image); 48 for TI2V-5B, whose Wan 2.2 VAE has 48 channels.
pub fn input_channels_model(in_channels: usize) -> Option<&'static str> {
    match in_channels {
        16 => Some("a T2V model (16 latent channels)"),
        36 => Some("an I2V/FLF2V model (36 input channels: 16 latent, 4 mask, 16 image latent)"),
        48 => Some(
            "a Wan 2.2 TI2V-5B model (48 latent channels) or a Wan2.1-Fun Control model \
             (16 latent, 16 control, 16 image latent)",
        ),
        32 => Some("a Wan2.1-Fun Control-Camera model (32 input channels)"),
        52 => Some("a Wan2.2-Fun-A14B-Control model (52 input channels)"),
        _ => None,
    }
}

/// A part of the transformer that only some variants have (see [`VARIANT_ONLY_PARTS`]).
#[derive(Debug)]
pub struct VariantOnlyPart {
    /// The name table's rows of this part.
    pub rows: WanPart,
    /// Fragments of its parameter names, in any naming.
    pub fragments: &'static [&'static str],
    /// What it is, in model terms.
    pub part: &'static str,
    /// Which models have it.
    pub models: &'static str,
}

impl VariantOnlyPart {
    /// The part a module name belongs to, when it is one of [`VARIANT_ONLY_PARTS`].
    pub fn of(module: &str) -> Option<&'static VariantOnlyPart> {
        VARIANT_ONLY_PARTS
            .iter()
            .find(|p| p.fragments.iter().any(|f| module.contains(f)))
    }
}
