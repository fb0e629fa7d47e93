//! The one name table of the WAN transformer across its four layouts.
//!
//! Owns: `entries`, one row per parameter kind (a top-level parameter, or a parameter every
//! block has), giving its diffusers name, its original Wan-AI name (spec wan.md §1.4), its
//! MaxDiffusion NNX path (spec wan.md §4.2, after the renames of §4.3), the transform from
//! the PyTorch layout to the NNX layout, its PyTorch shape in config symbols (`Dim`, spec
//! wan.md §1.2) and the part of the model it belongs to (`WanPart`: every config has the
//! core, the rest only when the config says so); and the codecs that turn a (row, block)
//! into a stored tensor name of a layout and back. Does not own: the sizes a config gives
//! the symbols and the parameter list it implies (`model::wan`), plans
//! (`model::read_plan`, `layout::write`).
//!
//! The table is the final 1:1 mapping, not a re-implementation of the `str.replace` chains
//! of the converters (spec wan.md §1.4 says to use the final table).

use std::collections::HashMap;
use std::sync::OnceLock;

use super::transform::Transform;
use super::wan_layout::Layout;

/// Whether a parameter sits outside the blocks, inside every block, or inside every VACE
/// context block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scope {
    /// Once per model.
    Top,
    /// Once per block (`blocks.N.` in unscanned layouts, stacked in `nnx-scanned`).
    Block,
    /// Once per VACE context block (`vace_blocks.N.`, one per entry of the config's
    /// `vace_layers`; never stacked: MaxDiffusion's `WanVACEModel` has no scanned layout).
    VaceBlock,
    /// Once per Wan-Animate face adapter (diffusers `face_adapter.N.`, original
    /// `face_adapter.fuser_blocks.N.`; an nnx.List in MaxDiffusion, never stacked).
    FaceAdapter,
    /// Once per residual block of the Wan-Animate motion encoder (diffusers
    /// `motion_encoder.res_blocks.i.`, original `motion_encoder.enc.net_app.convs.(i+1).`).
    MotionRes,
    /// Once per fully connected layer of the motion encoder (diffusers
    /// `motion_encoder.motion_network.j.`, original `motion_encoder.enc.fc.j.`).
    MotionFc,
    /// The motion encoder's last convolution: top level in diffusers and NNX
    /// (`motion_encoder.conv_out`), the entry after the residual blocks in the original
    /// `convs` list (`convs.8` at size 512), so its original index is the residual block
    /// count plus one, never a constant.
    MotionOut,
}

impl Scope {
    /// The stored name prefix of this scope's indexed stack in `layout` (`blocks`,
    /// `vace_blocks`, ...); `None` for top-level parameters.
    pub fn stack_in(self, layout: Layout) -> Option<&'static str> {
        let wan = layout == Layout::Wan;
        match self {
            Scope::Top => None,
            Scope::Block => Some("blocks"),
            Scope::VaceBlock => Some("vace_blocks"),
            Scope::FaceAdapter if wan => Some("face_adapter.fuser_blocks"),
            Scope::FaceAdapter => Some("face_adapter"),
            Scope::MotionRes | Scope::MotionOut if wan => Some("motion_encoder.enc.net_app.convs"),
            Scope::MotionRes => Some("motion_encoder.res_blocks"),
            Scope::MotionOut => None,
            Scope::MotionFc if wan => Some("motion_encoder.enc.fc"),
            Scope::MotionFc => Some("motion_encoder.motion_network"),
        }
    }

    /// Stored index minus block index: 1 for the original motion encoder's `convs`, whose
    /// entry 0 is conv_in.
    fn index_offset(self, layout: Layout) -> usize {
        match self {
            Scope::MotionRes | Scope::MotionOut if layout == Layout::Wan => 1,
            _ => 0,
        }
    }

    /// The canonical (diffusers) stack prefix.
    pub fn stack(self) -> Option<&'static str> {
        self.stack_in(Layout::Diffusers)
    }

    /// The full canonical name of `local` in block `block` of this scope (`local` itself
    /// for a top-level parameter or without a block).
    pub fn full(self, local: &str, block: Option<usize>) -> String {
        self.full_in(Layout::Diffusers, local, block)
    }

    /// [`Scope::full`] in the names of `layout` (unscanned).
    pub fn full_in(self, layout: Layout, local: &str, block: Option<usize>) -> String {
        match (self.stack_in(layout), block) {
            (Some(stack), Some(b)) => format!("{stack}.{}.{local}", b + self.index_offset(layout)),
            _ => local.to_string(),
        }
    }
}

/// One axis of a parameter's PyTorch-layout shape, named after the config symbol that
/// sizes it (spec wan.md §1.2); `WanConfig::dim` gives its size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dim {
    /// 1.
    One,
    /// 2.
    Two,
    /// 6.
    Six,
    /// D = H · Dh.
    Inner,
    /// 6 · D.
    SixInner,
    /// C_in.
    InChannels,
    /// pt.
    PatchT,
    /// ph.
    PatchH,
    /// pw.
    PatchW,
    /// Fq, the sinusoidal timestep width.
    Freq,
    /// T, the text encoder width.
    Text,
    /// F, the feed-forward width.
    Ffn,
    /// I, the CLIP image width.
    Image,
    /// A, the added k/v input width.
    AddedKv,
    /// P, the first-last-frame position embedding length.
    PosEmbed,
    /// C_vace, the VACE context's input channels (`vace_in_channels`).
    VaceIn,
    /// 3 (a 3×3 convolution kernel).
    Three,
    /// The Fun reference-image convolution's input channels (`in_dim_ref_conv`).
    RefConvIn,
    /// The Fun camera adapter's input channels after its pixel unshuffle
    /// (`in_dim_control_adapter` · 8²).
    ControlIn,
    /// C_out · pt · ph · pw.
    OutPatch,
    /// 4 (the motion encoder's conv_out kernel).
    Four,
    /// Dh, the attention head width.
    HeadDim,
    /// Wan-Animate `latent_channels` (the pose patch embedding's input channels).
    Latent,
    /// The motion encoder's conv_in output channels.
    MotionStem,
    /// Input channels of the residual block (per block).
    ResIn,
    /// Output channels of the residual block (per block).
    ResOut,
    /// Output channels of the last residual block (conv_out's input).
    ResLast,
    /// `motion_style_dim`.
    MotionStyle,
    /// Output width of the motion_network layer (per layer).
    MotionFcOut,
    /// `motion_dim`.
    MotionDim,
    /// `motion_encoder_dim`.
    MotionEnc,
    /// The face encoder's hidden width · heads.
    FaceWide,
    /// The face encoder's hidden width.
    FaceHidden,
}

/// The part of the model a parameter belongs to, which decides whether a config has it
/// (`WanConfig::has_part`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WanPart {
    /// Every WAN transformer.
    Core,
    /// The CLIP image embedder (`image_dim`, Wan 2.1 I2V/FLF2V).
    ImageEmbedder,
    /// The first-last-frame position embedding (`pos_embed_seq_len`, FLF2V).
    PosEmbed,
    /// The image cross-attention (`added_kv_proj_dim`, Wan 2.1 I2V/FLF2V).
    ImageCrossAttn,
    /// The affine norm before cross-attention (`cross_attn_norm`).
    CrossAttnNorm,
    /// The VACE context branch (`vace_layers`): its patch embedding, and every parameter
    /// of a VACE block (`Scope::VaceBlock` rows of the other parts belong to it too).
    Vace,
    /// The input projection of VACE block 0 only (diffusers `proj_in`, original
    /// `before_proj`).
    VaceInput,
    /// SkyReels-V2's frame-rate conditioning (`inject_sample_info`): `fps_embedding` and
    /// `fps_projection`.
    FpsEmbed,
    /// The reference-image convolution of Wan Fun V1.1 Control and Wan2.2-Fun Control
    /// (`ref_conv`, VideoX-Fun's `add_ref_conv`).
    RefConv,
    /// The camera control adapter of Wan Fun Control-Camera (`control_adapter`,
    /// VideoX-Fun's `SimpleAdapter`).
    ControlAdapter,
    /// Wan2.2-Animate's pose embedding, motion encoder, face encoder and face adapters
    /// (`model::animate`).
    Animate,
}

/// One parameter kind in every layout. Block names are relative to `blocks.N.`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NameRow {
    /// Top-level or per block.
    pub scope: Scope,
    /// diffusers `WanTransformer3DModel` name (the canonical name).
    pub diffusers: &'static str,
    /// Original Wan-AI / ComfyUI name, without any prefix.
    pub wan: &'static str,
    /// MaxDiffusion NNX path; empty for a parameter of a model MaxDiffusion does not have
    /// (SkyReels-V2's frame-rate conditioning), which no NNX layout can hold.
    pub nnx: &'static str,
    /// PyTorch layout → NNX layout.
    pub to_nnx: Transform,
    /// PyTorch-layout shape, one symbol per axis.
    pub shape: &'static [Dim],
    /// The part of the model it belongs to.
    pub part: WanPart,
    /// PyTorch layout → original Wan layout (`Identity` except the Animate FusedLeakyReLU
    /// biases, (C) → (1, C, 1, 1)).
    pub to_wan: Transform,
    /// In the original names, this parameter is piece `index` of `count` equal row blocks
    /// of one fused tensor (Wan-Animate's `linear1_kv` = [to_k; to_v]); `None` otherwise.
    pub wan_piece: Option<(usize, usize)>,
}

macro_rules! row {
    ($scope:ident, $d:expr, $w:expr, $n:expr, $t:ident, [$($dim:ident),+]) => {
        NameRow {
            scope: Scope::$scope,
            diffusers: $d,
            wan: $w,
            nnx: $n,
            to_nnx: Transform::$t,
            shape: &[$(Dim::$dim),+],
            part: WanPart::Core,
            to_wan: Transform::Identity,
            wan_piece: None,
        }
    };
}

/// A Linear layer of shape (out, in): `.weight` (transposed for NNX, renamed `kernel`) and
/// `.bias` (out).
macro_rules! linear {
    ($scope:ident, $d:literal, $w:literal, $n:literal, $out:ident, $in:ident) => {
        [
            row!(
                $scope,
                concat!($d, ".weight"),
                concat!($w, ".weight"),
                concat!($n, ".kernel"),
                Transpose,
                [$out, $in]
            ),
            row!(
                $scope,
                concat!($d, ".bias"),
                concat!($w, ".bias"),
                concat!($n, ".bias"),
                Identity,
                [$out]
            ),
        ]
    };
}

/// An affine norm over `dim`: `.weight` → NNX `.scale`, and `.bias`.
macro_rules! affine_norm {
    ($scope:ident, $d:literal, $w:literal, $n:literal, $dim:ident) => {
        [
            row!(
                $scope,
                concat!($d, ".weight"),
                concat!($w, ".weight"),
                concat!($n, ".scale"),
                Identity,
                [$dim]
            ),
            row!(
                $scope,
                concat!($d, ".bias"),
                concat!($w, ".bias"),
                concat!($n, ".bias"),
                Identity,
                [$dim]
            ),
        ]
    };
}

/// An RMSNorm over D: `.weight` → NNX `.scale`.
macro_rules! rms_norm {
    ($scope:ident, $d:literal, $w:literal, $n:literal) => {
        [row!(
            $scope,
            concat!($d, ".weight"),
            concat!($w, ".weight"),
            concat!($n, ".scale"),
            Identity,
            [Inner]
        )]
    };
}

/// `rows`, marked as belonging to `part`.
fn only_in<const N: usize>(part: WanPart, rows: [NameRow; N]) -> [NameRow; N] {
    rows.map(|e| NameRow { part, ..e })
}

/// `rows` of a model MaxDiffusion does not have: no NNX name.
fn without_nnx<const N: usize>(rows: [NameRow; N]) -> [NameRow; N] {
    rows.map(|e| NameRow { nnx: "", ..e })
}

fn build_entries() -> Vec<NameRow> {
    let mut e: Vec<NameRow> = Vec::with_capacity(56);
    // Top level (spec wan.md §1.2, §1.4, §4.2).
    e.push(row!(
        Top,
        "patch_embedding.weight",
        "patch_embedding.weight",
        "patch_embedding.kernel",
        OidhwToDhwio,
        [Inner, InChannels, PatchT, PatchH, PatchW]
    ));
    e.push(row!(
        Top,
        "patch_embedding.bias",
        "patch_embedding.bias",
        "patch_embedding.bias",
        Identity,
        [Inner]
    ));
    e.extend(only_in(
        WanPart::Vace,
        [
            row!(
                Top,
                "vace_patch_embedding.weight",
                "vace_patch_embedding.weight",
                "vace_patch_embedding.kernel",
                OidhwToDhwio,
                [Inner, VaceIn, PatchT, PatchH, PatchW]
            ),
            row!(
                Top,
                "vace_patch_embedding.bias",
                "vace_patch_embedding.bias",
                "vace_patch_embedding.bias",
                Identity,
                [Inner]
            ),
        ],
    ));
    e.extend(linear!(
        Top,
        "condition_embedder.time_embedder.linear_1",
        "time_embedding.0",
        "condition_embedder.time_embedder.linear_1",
        Inner,
        Freq
    ));
    e.extend(linear!(
        Top,
        "condition_embedder.time_embedder.linear_2",
        "time_embedding.2",
        "condition_embedder.time_embedder.linear_2",
        Inner,
        Inner
    ));
    e.extend(linear!(
        Top,
        "condition_embedder.time_proj",
        "time_projection.1",
        "condition_embedder.time_proj",
        SixInner,
        Inner
    ));
    e.extend(linear!(
        Top,
        "condition_embedder.text_embedder.linear_1",
        "text_embedding.0",
        "condition_embedder.text_embedder.linear_1",
        Inner,
        Text
    ));
    e.extend(linear!(
        Top,
        "condition_embedder.text_embedder.linear_2",
        "text_embedding.2",
        "condition_embedder.text_embedder.linear_2",
        Inner,
        Inner
    ));
    e.extend(only_in(
        WanPart::ImageEmbedder,
        affine_norm!(
            Top,
            "condition_embedder.image_embedder.norm1",
            "img_emb.proj.0",
            "condition_embedder.image_embedder.norm1.layer_norm",
            Image
        ),
    ));
    e.extend(only_in(
        WanPart::ImageEmbedder,
        linear!(
            Top,
            "condition_embedder.image_embedder.ff.net.0.proj",
            "img_emb.proj.1",
            "condition_embedder.image_embedder.ff.net_0",
            Image,
            Image
        ),
    ));
    e.extend(only_in(
        WanPart::ImageEmbedder,
        linear!(
            Top,
            "condition_embedder.image_embedder.ff.net.2",
            "img_emb.proj.3",
            "condition_embedder.image_embedder.ff.net_2",
            Inner,
            Image
        ),
    ));
    e.extend(only_in(
        WanPart::ImageEmbedder,
        affine_norm!(
            Top,
            "condition_embedder.image_embedder.norm2",
            "img_emb.proj.4",
            "condition_embedder.image_embedder.norm2.layer_norm",
            Inner
        ),
    ));
    e.extend(only_in(
        WanPart::PosEmbed,
        [row!(
            Top,
            "condition_embedder.image_embedder.pos_embed",
            "img_emb.emb_pos",
            "condition_embedder.image_embedder.pos_embed",
            Identity,
            [One, PosEmbed, Image]
        )],
    ));
    // SkyReels-V2 (diffusers transformer_skyreels_v2.py: nn.Embedding(2, D) and a
    // FeedForward D -> D -> 6D; original names from convert_skyreelsv2_to_diffusers.py).
    // MaxDiffusion has no SkyReels-V2 model, so no NNX name.
    e.extend(only_in(
        WanPart::FpsEmbed,
        without_nnx([row!(
            Top,
            "fps_embedding.weight",
            "fps_embedding.weight",
            "",
            Identity,
            [Two, Inner]
        )]),
    ));
    e.extend(only_in(
        WanPart::FpsEmbed,
        without_nnx(linear!(
            Top,
            "fps_projection.net.0.proj",
            "fps_projection.0",
            "",
            Inner,
            Inner
        )),
    ));
    e.extend(only_in(
        WanPart::FpsEmbed,
        without_nnx(linear!(
            Top,
            "fps_projection.net.2",
            "fps_projection.2",
            "",
            SixInner,
            Inner
        )),
    ));
    e.push(row!(
        Top,
        "scale_shift_table",
        "head.modulation",
        "scale_shift_table",
        Identity,
        [One, Two, Inner]
    ));
    e.extend(linear!(
        Top,
        "proj_out",
        "head.head",
        "proj_out",
        OutPatch,
        Inner
    ));
    // Per block. Note the norm2/norm3 swap between diffusers and the original.
    e.push(row!(
        Block,
        "scale_shift_table",
        "modulation",
        "adaln_scale_shift_table",
        Identity,
        [One, Six, Inner]
    ));
    e.extend(linear!(
        Block,
        "attn1.to_q",
        "self_attn.q",
        "attn1.query",
        Inner,
        Inner
    ));
    e.extend(linear!(
        Block,
        "attn1.to_k",
        "self_attn.k",
        "attn1.key",
        Inner,
        Inner
    ));
    e.extend(linear!(
        Block,
        "attn1.to_v",
        "self_attn.v",
        "attn1.value",
        Inner,
        Inner
    ));
    e.extend(linear!(
        Block,
        "attn1.to_out.0",
        "self_attn.o",
        "attn1.proj_attn",
        Inner,
        Inner
    ));
    e.extend(rms_norm!(
        Block,
        "attn1.norm_q",
        "self_attn.norm_q",
        "attn1.norm_q"
    ));
    e.extend(rms_norm!(
        Block,
        "attn1.norm_k",
        "self_attn.norm_k",
        "attn1.norm_k"
    ));
    e.extend(linear!(
        Block,
        "attn2.to_q",
        "cross_attn.q",
        "attn2.query",
        Inner,
        Inner
    ));
    e.extend(linear!(
        Block,
        "attn2.to_k",
        "cross_attn.k",
        "attn2.key",
        Inner,
        Inner
    ));
    e.extend(linear!(
        Block,
        "attn2.to_v",
        "cross_attn.v",
        "attn2.value",
        Inner,
        Inner
    ));
    e.extend(linear!(
        Block,
        "attn2.to_out.0",
        "cross_attn.o",
        "attn2.proj_attn",
        Inner,
        Inner
    ));
    e.extend(rms_norm!(
        Block,
        "attn2.norm_q",
        "cross_attn.norm_q",
        "attn2.norm_q"
    ));
    e.extend(rms_norm!(
        Block,
        "attn2.norm_k",
        "cross_attn.norm_k",
        "attn2.norm_k"
    ));
    e.extend(only_in(
        WanPart::ImageCrossAttn,
        linear!(
            Block,
            "attn2.add_k_proj",
            "cross_attn.k_img",
            "attn2.add_k_proj",
            Inner,
            AddedKv
        ),
    ));
    e.extend(only_in(
        WanPart::ImageCrossAttn,
        linear!(
            Block,
            "attn2.add_v_proj",
            "cross_attn.v_img",
            "attn2.add_v_proj",
            Inner,
            AddedKv
        ),
    ));
    e.extend(only_in(
        WanPart::ImageCrossAttn,
        rms_norm!(
            Block,
            "attn2.norm_added_k",
            "cross_attn.norm_k_img",
            "attn2.norm_added_k"
        ),
    ));
    e.extend(only_in(
        WanPart::CrossAttnNorm,
        affine_norm!(Block, "norm2", "norm3", "norm2.layer_norm", Inner),
    ));
    e.extend(linear!(
        Block,
        "ffn.net.0.proj",
        "ffn.0",
        "ffn.act_fn.proj",
        Ffn,
        Inner
    ));
    e.extend(linear!(
        Block,
        "ffn.net.2",
        "ffn.2",
        "ffn.proj_out",
        Inner,
        Ffn
    ));
    fun_rows(&mut e);
    vace_block_rows(&mut e);
    animate_rows(&mut e);
    e
}

/// Wan2.2-Animate's own modules (golden/variants/animate/FACTS.md §3: diffusers 0.42.1
/// transformer_wan_animate.py, Wan-Video/Wan2.2@42bf4cfa wan/modules/animate, diffusers'
/// convert_wan_to_diffusers.py; NNX paths from MaxDiffusion@7cfb8801 wan_utils.py, checked
/// leaf by leaf against its own tree in golden/variants/animate/nnx/). MaxDiffusion keeps the
/// motion encoder's tensors in the PyTorch layout under their diffusers names (`weight`).
fn animate_rows(e: &mut Vec<NameRow>) {
    let bias_4d = |r: NameRow| NameRow {
        to_wan: Transform::ChannelTo1C11,
        ..r
    };
    let mut rows = vec![
        row!(
            Top,
            "pose_patch_embedding.weight",
            "pose_patch_embedding.weight",
            "pose_patch_embedding.kernel",
            OidhwToDhwio,
            [Inner, Latent, PatchT, PatchH, PatchW]
        ),
        row!(
            Top,
            "pose_patch_embedding.bias",
            "pose_patch_embedding.bias",
            "pose_patch_embedding.bias",
            Identity,
            [Inner]
        ),
        row!(
            Top,
            "motion_encoder.conv_in.weight",
            "motion_encoder.enc.net_app.convs.0.0.weight",
            "motion_encoder.conv_in.weight",
            Identity,
            [MotionStem, Three, One, One]
        ),
        bias_4d(row!(
            Top,
            "motion_encoder.conv_in.act_fn.bias",
            "motion_encoder.enc.net_app.convs.0.1.bias",
            "motion_encoder.conv_in.act_fn.bias",
            Identity,
            [MotionStem]
        )),
        row!(
            MotionOut,
            "motion_encoder.conv_out.weight",
            "weight",
            "motion_encoder.conv_out.weight",
            Identity,
            [MotionStyle, ResLast, Four, Four]
        ),
        row!(
            Top,
            "motion_encoder.motion_synthesis_weight",
            "motion_encoder.dec.direction.weight",
            "motion_encoder.motion_synthesis_weight",
            Identity,
            [MotionEnc, MotionDim]
        ),
        row!(
            MotionRes,
            "conv1.weight",
            "conv1.0.weight",
            "conv1.weight",
            Identity,
            [ResIn, ResIn, Three, Three]
        ),
        bias_4d(row!(
            MotionRes,
            "conv1.act_fn.bias",
            "conv1.1.bias",
            "conv1.act_fn.bias",
            Identity,
            [ResIn]
        )),
        row!(
            MotionRes,
            "conv2.weight",
            "conv2.1.weight",
            "conv2.weight",
            Identity,
            [ResOut, ResIn, Three, Three]
        ),
        bias_4d(row!(
            MotionRes,
            "conv2.act_fn.bias",
            "conv2.2.bias",
            "conv2.act_fn.bias",
            Identity,
            [ResOut]
        )),
        row!(
            MotionRes,
            "conv_skip.weight",
            "skip.1.weight",
            "conv_skip.weight",
            Identity,
            [ResOut, ResIn, One, One]
        ),
        row!(
            MotionFc,
            "weight",
            "weight",
            "weight",
            Identity,
            [MotionFcOut, MotionStyle]
        ),
        row!(MotionFc, "bias", "bias", "bias", Identity, [MotionFcOut]),
    ];
    // The face encoder's Conv1d layers: original names wrap each in `.conv`; NNX kernels
    // are (K, in, out).
    macro_rules! face_conv {
        ($d:literal, $wide:ident, $input:ident) => {
            [
                row!(
                    Top,
                    concat!("face_encoder.", $d, ".weight"),
                    concat!("face_encoder.", $d, ".conv.weight"),
                    concat!("face_encoder.", $d, ".kernel"),
                    Reverse3,
                    [$wide, $input, Three]
                ),
                row!(
                    Top,
                    concat!("face_encoder.", $d, ".bias"),
                    concat!("face_encoder.", $d, ".conv.bias"),
                    concat!("face_encoder.", $d, ".bias"),
                    Identity,
                    [$wide]
                ),
            ]
        };
    }
    rows.extend(face_conv!("conv1_local", FaceWide, MotionEnc));
    rows.extend(face_conv!("conv2", FaceHidden, FaceHidden));
    rows.extend(face_conv!("conv3", FaceHidden, FaceHidden));
    rows.extend(linear!(
        Top,
        "face_encoder.out_proj",
        "face_encoder.out_proj",
        "face_encoder.out_proj",
        Inner,
        FaceHidden
    ));
    rows.push(row!(
        Top,
        "face_encoder.padding_tokens",
        "face_encoder.padding_tokens",
        "face_encoder.padding_tokens",
        Identity,
        [One, One, One, Inner]
    ));
    rows.extend(linear!(
        FaceAdapter,
        "to_q",
        "linear1_q",
        "to_q",
        Inner,
        Inner
    ));
    // diffusers' to_k / to_v are the two row halves of the original fused `linear1_kv`.
    let halves = [
        linear!(FaceAdapter, "to_k", "linear1_kv", "to_k", Inner, Inner),
        linear!(FaceAdapter, "to_v", "linear1_kv", "to_v", Inner, Inner),
    ];
    for (k, pair) in halves.into_iter().enumerate() {
        rows.extend(pair.map(|r| NameRow {
            wan_piece: Some((k, 2)),
            ..r
        }));
    }
    rows.extend(linear!(
        FaceAdapter,
        "to_out",
        "linear2",
        "to_out",
        Inner,
        Inner
    ));
    rows.push(row!(
        FaceAdapter,
        "norm_q.weight",
        "q_norm.weight",
        "norm_q.scale",
        Identity,
        [HeadDim]
    ));
    rows.push(row!(
        FaceAdapter,
        "norm_k.weight",
        "k_norm.weight",
        "norm_k.scale",
        Identity,
        [HeadDim]
    ));
    e.extend(rows.into_iter().map(|r| NameRow {
        part: WanPart::Animate,
        ..r
    }));
}

/// Wan Fun's extra convolutions (aigc-apps/VideoX-Fun@804a4258 wan_transformer3d.py and
/// wan_camera_adapter.py; shapes checked against DiffSynth-Studio's hashes of the released
/// files, golden/variants/fun/FACTS.md). Fun checkpoints use the original names; diffusers and
/// MaxDiffusion have no Fun class, so these names are the same in every naming and no NNX
/// or diffusers layout holds them ([`NameRow::unfit`]).
fn fun_rows(e: &mut Vec<NameRow>) {
    // A Conv2d: the weight of `shape` (O, I, kH, kW) and its bias (O).
    let conv2d = |weight: &'static str, bias: &'static str, shape: &'static [Dim]| {
        let row = |name, shape| NameRow {
            scope: Scope::Top,
            diffusers: name,
            wan: name,
            nnx: "",
            to_nnx: Transform::Identity,
            shape,
            part: WanPart::Core,
            to_wan: Transform::Identity,
            wan_piece: None,
        };
        [row(weight, shape), row(bias, &[Dim::Inner])]
    };
    use Dim::{ControlIn, Inner, PatchH, PatchW, RefConvIn, Three};
    e.extend(only_in(
        WanPart::RefConv,
        conv2d(
            "ref_conv.weight",
            "ref_conv.bias",
            &[Inner, RefConvIn, PatchH, PatchW],
        ),
    ));
    let adapter: [(&str, &str, &[Dim]); 3] = [
        (
            "control_adapter.conv.weight",
            "control_adapter.conv.bias",
            &[Inner, ControlIn, PatchH, PatchW],
        ),
        (
            "control_adapter.residual_blocks.0.conv1.weight",
            "control_adapter.residual_blocks.0.conv1.bias",
            &[Inner, Inner, Three, Three],
        ),
        (
            "control_adapter.residual_blocks.0.conv2.weight",
            "control_adapter.residual_blocks.0.conv2.bias",
            &[Inner, Inner, Three, Three],
        ),
    ];
    for (weight, bias, shape) in adapter {
        e.extend(only_in(
            WanPart::ControlAdapter,
            conv2d(weight, bias, shape),
        ));
    }
}

/// The VACE context block (diffusers `WanVACETransformerBlock`, original `VaceWanAttentionBlock`,
/// MaxDiffusion `WanVACETransformerBlock`): every parameter of a block, plus the output
/// projection every VACE block has and the input projection only block 0 has (original
/// `before_proj`/`after_proj`, VACE_TRANSFORMER_KEYS_RENAME_DICT of diffusers'
/// convert_wan_to_diffusers.py).
fn vace_block_rows(e: &mut Vec<NameRow>) {
    let twins: Vec<NameRow> = e
        .iter()
        .filter(|r| r.scope == Scope::Block)
        .map(|r| NameRow {
            scope: Scope::VaceBlock,
            ..*r
        })
        .collect();
    e.extend(twins);
    e.extend(only_in(
        WanPart::VaceInput,
        linear!(VaceBlock, "proj_in", "before_proj", "proj_in", Inner, Inner),
    ));
    e.extend(only_in(
        WanPart::Vace,
        linear!(
            VaceBlock,
            "proj_out",
            "after_proj",
            "proj_out",
            Inner,
            Inner
        ),
    ));
}

/// Every parameter kind of the WAN transformer (T2V, I2V/FLF2V image branch, TI2V), each
/// once. Rows exist for optional parameters too; a config decides which are present.
pub fn entries() -> &'static [NameRow] {
    static ENTRIES: OnceLock<Vec<NameRow>> = OnceLock::new();
    ENTRIES.get_or_init(build_entries)
}

/// Where a stored tensor sits relative to the blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Position {
    /// A top-level parameter.
    Top,
    /// Block `N` of an unscanned layout, in the stack of the row's scope (`blocks` or
    /// `vace_blocks`).
    Block(usize),
    /// All blocks, stacked along a leading axis (`nnx-scanned`).
    Stacked,
}

/// Prefixes the `wan` layout accepts on input (spec wan.md §1.4): single-file checkpoints
/// carry `model.diffusion_model.`, ComfyUI files `diffusion_model.`.
pub const WAN_PREFIXES: [&str; 2] = ["model.diffusion_model.", "diffusion_model."];

/// The substring that marks keys every reference skips on load (diffusers
/// `_keys_to_ignore_on_load_unexpected = ["norm_added_q"]`, MaxDiffusion `if "norm_added_q"
/// in key`): `blocks.N.attn2.norm_added_q.weight`, which no forward pass uses.
pub const SKIPPED_MARKER: &str = "norm_added_q";

impl NameRow {
    /// True for the output head (original names `head.*`: the final modulation and
    /// projection), which the diffusers parameter order puts after the blocks.
    pub fn is_head(&self) -> bool {
        self.scope == Scope::Top && self.wan.starts_with("head.")
    }

    /// This entry's local name in `layout`.
    pub fn local(&self, layout: Layout) -> &'static str {
        match layout {
            Layout::Diffusers => self.diffusers,
            Layout::Wan => self.wan,
            Layout::Nnx | Layout::NnxScanned => self.nnx,
        }
    }

    /// Transform from the PyTorch layout to `layout`.
    pub fn from_canonical(&self, layout: Layout) -> Transform {
        match layout {
            Layout::Diffusers => Transform::Identity,
            Layout::Wan => self.to_wan,
            Layout::Nnx | Layout::NnxScanned => self.to_nnx,
        }
    }

    /// The stored tensor name in `layout` for block `block` (ignored for top-level rows;
    /// for `MotionOut`, the residual block count), and the layer index when the layout
    /// stacks blocks.
    pub fn stored_name(&self, layout: Layout, block: usize) -> (String, Option<usize>) {
        let local = self.local(layout);
        match (self.scope, layout) {
            (Scope::Top, _) => (local.to_string(), None),
            (Scope::Block, Layout::NnxScanned) => (format!("blocks.{local}"), Some(block)),
            (scope, _) => (scope.full_in(layout, local, Some(block)), None),
        }
    }

    /// The rows stored as the pieces of this row's fused tensor in `layout`, in piece
    /// order (this row alone when it is not fused there).
    pub fn pieces(&'static self, layout: Layout) -> Vec<&'static NameRow> {
        match (layout, self.wan_piece) {
            (Layout::Wan, Some(_)) => {
                let mut v: Vec<&'static NameRow> = entries()
                    .iter()
                    .filter(|e| e.scope == self.scope && e.wan == self.wan)
                    .collect();
                v.sort_by_key(|e| e.wan_piece);
                v
            }
            _ => vec![self],
        }
    }

    /// The canonical (diffusers) name of this row in block `block` (ignored for top-level
    /// rows).
    pub fn canonical(&self, block: Option<usize>) -> String {
        self.scope.full(self.diffusers, block)
    }

    /// True when `layout` can hold this parameter (see [`NameRow::unfit`]).
    pub fn fits(&self, layout: Layout) -> bool {
        self.unfit(layout).is_none()
    }

    /// Why `layout` cannot hold this parameter, in model terms: no runtime reading that
    /// layout has it. `None` when it can.
    pub fn unfit(&self, layout: Layout) -> Option<&'static str> {
        let fun = matches!(self.part, WanPart::RefConv | WanPart::ControlAdapter);
        match layout {
            Layout::Wan => None,
            _ if fun => Some(
                "diffusers and MaxDiffusion have no Wan Fun class (ref_conv, control_adapter); \
                 Fun checkpoints are read in original Wan names (`wan` layout)",
            ),
            Layout::Diffusers => None,
            _ if self.nnx.is_empty() => {
                Some("MaxDiffusion has no SkyReels-V2 model (its frame-rate conditioning)")
            }
            Layout::NnxScanned if self.scope == Scope::VaceBlock => Some(
                "MaxDiffusion's WanVACEModel has no scanned form (scan_layers raises \
                 NotImplementedError); write `nnx` instead",
            ),
            Layout::Nnx | Layout::NnxScanned => None,
        }
    }
}

type LocalMaps = HashMap<(Layout, Scope, &'static str), usize>;

fn local_maps() -> &'static LocalMaps {
    static MAPS: OnceLock<LocalMaps> = OnceLock::new();
    MAPS.get_or_init(|| {
        let mut m = HashMap::new();
        for layout in Layout::ALL {
            for (i, e) in entries().iter().enumerate() {
                // A fused tensor is parsed as its first piece (`NameRow::pieces`).
                let later_piece = layout == Layout::Wan && e.wan_piece.is_some_and(|p| p.0 > 0);
                if !later_piece {
                    m.insert((layout, e.scope, e.local(layout)), i);
                }
            }
        }
        m
    })
}

/// Parses a stored tensor name of `layout` into (row of [`entries`], position). `None`
/// when the name is not a WAN parameter of that layout. Block indices must be written in
/// canonical decimal (no sign, no leading zero).
pub fn parse_stored(layout: Layout, name: &str) -> Option<(&'static NameRow, Position)> {
    parse_any(layout, name).filter(|(e, _)| e.fits(layout))
}

/// [`parse_stored`] without asking whether `layout` can hold the row: a canonical name
/// names every row, including those no diffusers file holds.
fn parse_any(layout: Layout, name: &str) -> Option<(&'static NameRow, Position)> {
    let name = match layout {
        Layout::Wan => strip_wan_prefix(name),
        _ => name,
    };
    let maps = local_maps();
    let lookup = |scope, local: &str| maps.get(&(layout, scope, local)).map(|&i| &entries()[i]);
    for scope in STACKED_SCOPES {
        let offset = scope.index_offset(layout);
        let Some(rest) = scope
            .stack_in(layout)
            .and_then(|s| name.strip_prefix(s)?.strip_prefix('.'))
        else {
            continue;
        };
        if layout == Layout::NnxScanned && scope == Scope::Block {
            return lookup(scope, rest).map(|e| (e, Position::Stacked));
        }
        let Some((index, local)) = rest.split_once('.') else {
            continue;
        };
        let block = parse_index(index).and_then(|b| b.checked_sub(offset));
        if let (Some(block), Some(e)) = (block, lookup(scope, local)) {
            return Some((e, Position::Block(block)));
        }
    }
    let unindexed = |scope: Scope| scope.stack_in(layout).is_none();
    [Scope::Top, Scope::MotionOut]
        .into_iter()
        .filter(|&s| unindexed(s))
        .find_map(|s| lookup(s, name))
        .map(|e| (e, Position::Top))
}

/// The scopes whose names carry an index (`MotionOut` only in the original names).
const STACKED_SCOPES: [Scope; 6] = [
    Scope::Block,
    Scope::VaceBlock,
    Scope::FaceAdapter,
    Scope::MotionRes,
    Scope::MotionOut,
    Scope::MotionFc,
];

/// Removes one accepted `wan` prefix, if present.
pub fn strip_wan_prefix(name: &str) -> &str {
    WAN_PREFIXES
        .iter()
        .find_map(|p| name.strip_prefix(p))
        .unwrap_or(name)
}

fn parse_index(s: &str) -> Option<usize> {
    let canonical =
        !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'));
    if canonical { s.parse().ok() } else { None }
}

/// The first row, in table order, whose shape has `dim`, and the axis it is on: where a
/// config's size for `dim` can be read back from shapes.
pub fn first_axis_of(dim: Dim) -> Option<(&'static NameRow, usize)> {
    entries()
        .iter()
        .find_map(|e| Some((e, e.shape.iter().position(|&d| d == dim)?)))
}

/// The first row, in table order, of `part`: the parameter whose presence says a
/// checkpoint has that part.
pub fn first_of(part: WanPart) -> Option<&'static NameRow> {
    entries().iter().find(|e| e.part == part)
}

/// Splits a canonical (diffusers) parameter name into its row and block index.
pub fn parse_canonical(name: &str) -> Option<(&'static NameRow, Option<usize>)> {
    match parse_any(Layout::Diffusers, name)? {
        (e, Position::Top) => Some((e, None)),
        (e, Position::Block(b)) => Some((e, Some(b))),
        (_, Position::Stacked) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_local_name_is_unique_per_layout_and_scope() {
        for layout in Layout::ALL {
            let mut seen = std::collections::HashSet::new();
            for e in entries().iter().filter(|e| e.fits(layout)) {
                // The pieces of a fused tensor share its name (`NameRow::pieces`).
                if !std::ptr::eq(e, e.pieces(layout)[0]) {
                    continue;
                }
                assert!(
                    seen.insert((e.scope, e.local(layout))),
                    "{layout}: duplicate {}",
                    e.local(layout)
                );
            }
        }
    }

    #[test]
    fn names_round_trip_through_every_layout() {
        for layout in Layout::ALL {
            for e in entries().iter().filter(|e| e.fits(layout)) {
                let (name, layer) = e.stored_name(layout, 7);
                let (back, pos) = parse_stored(layout, &name).unwrap();
                assert_eq!(back, e.pieces(layout)[0]);
                let expect = match (e.scope, layer) {
                    (Scope::Top, _) => Position::Top,
                    (Scope::MotionOut, _) if layout != Layout::Wan => Position::Top,
                    (_, Some(_)) => Position::Stacked,
                    (_, None) => Position::Block(7),
                };
                assert_eq!(pos, expect, "{name}");
            }
        }
    }

    #[test]
    fn wan_prefixes_are_stripped_and_odd_indices_refused() {
        let (e, pos) =
            parse_stored(Layout::Wan, "model.diffusion_model.blocks.3.norm3.weight").unwrap();
        assert_eq!((e.diffusers, pos), ("norm2.weight", Position::Block(3)));
        let (e, _) = parse_stored(Layout::Wan, "diffusion_model.head.head.weight").unwrap();
        assert_eq!(e.diffusers, "proj_out.weight");
        assert!(parse_stored(Layout::Diffusers, "blocks.03.attn1.to_q.weight").is_none());
        assert!(parse_stored(Layout::Diffusers, "blocks.+3.attn1.to_q.weight").is_none());
        assert!(parse_stored(Layout::Diffusers, "blocks.3.attn2.norm_added_q.weight").is_none());
    }

    #[test]
    fn animate_lists_have_their_own_stacks_and_offsets() {
        let (e, pos) = parse_stored(
            Layout::Wan,
            "model.diffusion_model.motion_encoder.enc.net_app.convs.8.weight",
        )
        .unwrap();
        assert_eq!(
            (e.canonical(Some(7)).as_str(), pos),
            ("motion_encoder.conv_out.weight", Position::Block(7))
        );
        assert_eq!(
            e.stored_name(Layout::Wan, 3).0,
            "motion_encoder.enc.net_app.convs.4.weight"
        );
        let (e, pos) = parse_stored(
            Layout::Wan,
            "motion_encoder.enc.net_app.convs.1.conv2.2.bias",
        )
        .unwrap();
        assert_eq!(
            e.canonical(Some(0)),
            "motion_encoder.res_blocks.0.conv2.act_fn.bias"
        );
        assert_eq!(
            (e.from_canonical(Layout::Wan), pos),
            (Transform::ChannelTo1C11, Position::Block(0))
        );
        let (e, _) =
            parse_stored(Layout::Wan, "face_adapter.fuser_blocks.1.linear1_kv.bias").unwrap();
        let pieces: Vec<String> = e
            .pieces(Layout::Wan)
            .iter()
            .map(|p| p.canonical(Some(1)))
            .collect();
        assert_eq!(
            pieces,
            ["face_adapter.1.to_k.bias", "face_adapter.1.to_v.bias"]
        );
        assert_eq!(e.pieces(Layout::Diffusers).len(), 1);
        let (e, pos) = parse_stored(Layout::NnxScanned, "face_adapter.0.to_v.kernel").unwrap();
        assert_eq!((e.diffusers, pos), ("to_v.weight", Position::Block(0)));
        assert!(parse_stored(Layout::Wan, "motion_encoder.enc.net_app.convs.0.weight").is_none());
    }

    #[test]
    fn vace_blocks_have_their_own_stack_and_projections() {
        let (e, pos) = parse_stored(
            Layout::Wan,
            "diffusion_model.vace_blocks.2.after_proj.weight",
        )
        .unwrap();
        assert_eq!(
            (e.canonical(Some(2)), pos),
            (
                "vace_blocks.2.proj_out.weight".to_string(),
                Position::Block(2)
            )
        );
        let (e, _) = parse_stored(Layout::Wan, "vace_blocks.0.cross_attn.o.weight").unwrap();
        assert_eq!(e.scope, Scope::VaceBlock);
        assert_eq!(
            e.stored_name(Layout::Nnx, 0).0,
            "vace_blocks.0.attn2.proj_attn.kernel"
        );
        // MaxDiffusion never stacks VACE blocks, and has no SkyReels-V2 model.
        assert!(parse_stored(Layout::NnxScanned, "vace_blocks.attn1.query.kernel").is_none());
        let (fps, _) = parse_stored(Layout::Wan, "fps_projection.2.weight").unwrap();
        assert!(!fps.fits(Layout::Nnx) && fps.fits(Layout::Diffusers));
    }
}
