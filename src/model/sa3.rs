//! Stable Audio 3 DiT: the two released sizes, their adapter-relevant parameter shapes,
//! and the checkpoint key prefixes (spec sa3_lora.md §4).
//!
//! Owns: `Sa3Variant`, `Sa3Shapes` and `sa3_params`, the Linear / Conv1d parameters of a
//! full `model.safetensors` in PyTorch layout; the MLX DiT's key remaps (§4.5:
//! [`is_mlx_dit`], [`torch_name_of_mlx`]) and Conv1d layout (§4.4: (out, k, in)). Norms, memory tokens and other tensors the
//! adapters never touch are not listed (the spec does not give them).

use super::wan::ParamSpec;

/// A released SA3 DiT size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Sa3Variant {
    /// small-music / small-sfx: E=1024, depth 20, standard attention.
    Small,
    /// medium: E=1536, depth 24, differential attention.
    Medium,
}

/// Width constants of one size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sa3Shapes {
    /// Embedding width E.
    pub embed: usize,
    /// Number of transformer layers.
    pub depth: usize,
    /// FF inner width (the GLU projection has twice this many rows).
    pub ff_inner: usize,
    /// Rows of the fused self-attention qkv projection, in multiples of E (3 or 5).
    pub qkv_blocks: usize,
    /// Rows of cross_attn.to_q in multiples of E (1 or 2).
    pub q_blocks: usize,
    /// Rows of cross_attn.to_kv in multiples of E (2 or 3).
    pub kv_blocks: usize,
}

impl Sa3Variant {
    /// Both sizes.
    pub const ALL: [Sa3Variant; 2] = [Sa3Variant::Small, Sa3Variant::Medium];

    /// A human name.
    pub fn name(self) -> &'static str {
        match self {
            Sa3Variant::Small => "Stable Audio 3 small (music/sfx)",
            Sa3Variant::Medium => "Stable Audio 3 medium",
        }
    }

    /// A short identifier.
    pub fn id(self) -> &'static str {
        match self {
            Sa3Variant::Small => "sa3-small",
            Sa3Variant::Medium => "sa3-medium",
        }
    }

    /// The constants of spec sa3_lora.md §4.2.
    pub fn shapes(self) -> Sa3Shapes {
        match self {
            Sa3Variant::Small => Sa3Shapes {
                embed: 1024,
                depth: 20,
                ff_inner: 4096,
                qkv_blocks: 3,
                q_blocks: 1,
                kv_blocks: 2,
            },
            Sa3Variant::Medium => Sa3Shapes {
                embed: 1536,
                depth: 24,
                ff_inner: 6144,
                qkv_blocks: 5,
                q_blocks: 2,
                kv_blocks: 3,
            },
        }
    }
}

/// Prefix of DiT weights in a full SA3 `model.safetensors`.
pub const DIT_PREFIX: &str = "model.model.";
/// Prefix of conditioner weights in a full SA3 `model.safetensors`.
pub const CONDITIONER_PREFIX: &str = "conditioner.";

/// Whether tensor names are those of an MLX-converted SA3 DiT (spec sa3_lora.md §4.5): no
/// `model.model.` prefix, and keys only the MLX conversion writes (`cond.*`,
/// `to_local_embed.seq.*`).
pub fn is_mlx_dit<'a>(names: impl IntoIterator<Item = &'a str>) -> bool {
    let mut marker = false;
    for n in names {
        if n.starts_with(DIT_PREFIX) {
            return false;
        }
        marker |= n.starts_with("cond.") || n.contains(".to_local_embed.seq.");
    }
    marker
}

/// The full-checkpoint (PyTorch) name of a tensor of an MLX DiT: §4.5's remaps undone
/// (`cond.seconds_total_weight`/`_bias` → the conditioner's `embedding.1`, `model.model.`
/// restored, `to_local_embed.seq.N` → `to_local_embed.N`).
pub fn torch_name_of_mlx(name: &str) -> String {
    const SECONDS: &str = "conditioner.conditioners.seconds_total.embedder.embedding.1";
    match name {
        "cond.seconds_total_weight" => return format!("{SECONDS}.weight"),
        "cond.seconds_total_bias" => return format!("{SECONDS}.bias"),
        _ => {}
    }
    let n = name
        .replace(".to_local_embed.seq.0", ".to_local_embed.0")
        .replace(".to_local_embed.seq.2", ".to_local_embed.2");
    format!("{DIT_PREFIX}{n}")
}

/// The Linear / Conv1d parameters of spec sa3_lora.md §4.2 with full-checkpoint names.
pub fn sa3_params(v: Sa3Variant) -> Vec<ParamSpec> {
    let s = v.shapes();
    let e = s.embed;
    let mut p = Vec::new();
    let mut push = |name: String, shape: &[usize]| {
        p.push(ParamSpec {
            name,
            shape: shape.to_vec(),
        })
    };
    let dit = |n: &str| format!("{DIT_PREFIX}{n}");
    for (name, out, inp, bias) in [
        ("to_timestep_embed.0", e, 256, true),
        ("to_timestep_embed.2", e, e, true),
        ("to_cond_embed.0", e, 768, false),
        ("to_cond_embed.2", e, e, false),
        ("to_global_embed.0", e, 768, false),
        ("to_global_embed.2", e, e, false),
        ("transformer.project_in", e, 256, false),
        ("transformer.project_out", 256, e, false),
        ("transformer.global_cond_embedder.0", e, e, true),
        ("transformer.global_cond_embedder.2", 6 * e, e, true),
    ] {
        push(dit(&format!("{name}.weight")), &[out, inp]);
        if bias {
            push(dit(&format!("{name}.bias")), &[out]);
        }
    }
    for l in 0..s.depth {
        let t = |n: &str| dit(&format!("transformer.layers.{l}.{n}"));
        push(t("self_attn.to_qkv.weight"), &[s.qkv_blocks * e, e]);
        push(t("self_attn.to_out.weight"), &[e, e]);
        push(t("cross_attn.to_q.weight"), &[s.q_blocks * e, e]);
        push(t("cross_attn.to_kv.weight"), &[s.kv_blocks * e, e]);
        push(t("cross_attn.to_out.weight"), &[e, e]);
        push(t("ff.ff.0.proj.weight"), &[2 * s.ff_inner, e]);
        push(t("ff.ff.0.proj.bias"), &[2 * s.ff_inner]);
        push(t("ff.ff.2.weight"), &[e, s.ff_inner]);
        push(t("ff.ff.2.bias"), &[e]);
        push(t("to_local_embed.0.weight"), &[e, 257]);
        push(t("to_local_embed.0.bias"), &[e]);
        push(t("to_local_embed.2.weight"), &[e, e]);
        push(t("to_local_embed.2.bias"), &[e]);
    }
    push(dit("preprocess_conv.weight"), &[256, 256, 1]);
    push(dit("postprocess_conv.weight"), &[256, 256, 1]);
    let c = "conditioner.conditioners.seconds_total.embedder.embedding.1";
    push(format!("{c}.weight"), &[768, 256]);
    push(format!("{c}.bias"), &[768]);
    p
}
