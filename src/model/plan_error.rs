//! Why a layout conversion could not be planned.
//!
//! Owns: `PlanError`, the one error type of reading (`model::read_plan`), layout detection
//! (`model::wan_layout`), writing and dtype planning (`layout::write`,
//! `layout::dtype_policy`, `layout::conversion`); it lives in `model` because imports go one way
//! and the lowest of its users is here. Every variant carries the keys it concerns and, for shapes, expected versus found; the
//! file name is attached by the caller that knows it (`io` or the CLI), and the way out
//! that needs a flag or a recipe key by the front end. Long key lists are shown in full up
//! to a limit, then counted.

use std::fmt::{self, Write as _};

use super::animate::is_animate_module;
use super::wan_layout::Layout;
use crate::io::DType;

/// Why keys of Wan2.2-Animate's own modules fit no layout: the name table has every
/// Animate parameter of diffusers' `WanAnimateTransformer3DModel`, the original Wan-Animate
/// model, ComfyUI and MaxDiffusion (`model::wan_names`), so such keys are of another build.
pub const ANIMATE_UNKNOWN: &str = "\nhint: these are Wan2.2-Animate module names (pose_patch_embedding, \
    motion_encoder, face_encoder, face_adapter), but not ones of the released architecture in \
    the diffusers, original-Wan/ComfyUI or MaxDiffusion naming";

/// Why quantized outputs refuse Wan2.2-Animate's own modules in the diffusers layout.
pub const ANIMATE_NOT_QUANTIZED: &str = "\nhint: these are Wan2.2-Animate's own modules; a \
    quantized output names them as ComfyUI does (original names), where `linear1_kv` fuses \
    diffusers' `to_k`/`to_v` and the motion encoder's biases are (1,C,1,1): run `wanbake restack --to wan` \
    first, then quantize its output";

/// How many keys an error message lists before it counts the rest.
pub const LISTED_KEYS: usize = 40;

/// One stored tensor whose shape differs from what the config implies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredShapeMismatch {
    /// The stored tensor name.
    pub key: String,
    /// The shape the config implies for it.
    pub expected: Vec<usize>,
    /// The shape stored.
    pub found: Vec<usize>,
}

/// Why a plan could not be made. Nothing has been written when one is returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// Keys that are not WAN transformer parameters in this layout.
    #[error("{} key(s) are not WAN transformer parameters in the `{layout}` layout:{}{}", keys.len(), list(keys), hint_unknown(*layout, keys))]
    UnknownKeys {
        /// The layout the keys were read as.
        layout: Layout,
        /// The keys.
        keys: Vec<String>,
    },
    /// Parameters the config needs that the checkpoint lacks.
    #[error("{} parameter(s) the config needs are missing (named as the `{layout}` layout stores them):{}", keys.len(), list(keys))]
    MissingKeys {
        /// The layout.
        layout: Layout,
        /// The names they would have in that layout.
        keys: Vec<String>,
    },
    /// Valid parameter names that this config does not have (an image branch in a T2V
    /// config, a block index ≥ L).
    #[error("{} key(s) are WAN parameters but not of this config (check num_layers, image_dim, added_kv_proj_dim, pos_embed_seq_len, cross_attn_norm in config.json):{}", keys.len(), list(keys))]
    UnexpectedKeys {
        /// The layout.
        layout: Layout,
        /// The stored keys.
        keys: Vec<String>,
    },
    /// Stored shapes that differ from the config's.
    #[error("{} tensor(s) have the wrong shape for this config ({layout} layout):{}", mismatches.len(), list_shapes(mismatches))]
    Shapes {
        /// The layout.
        layout: Layout,
        /// Each mismatch.
        mismatches: Vec<StoredShapeMismatch>,
    },
    /// Two stored keys are the same parameter (e.g. with and without a `diffusion_model.`
    /// prefix).
    #[error("`{first}` and `{second}` are both the parameter `{canonical}`")]
    Duplicate {
        /// The canonical name.
        canonical: String,
        /// One stored key.
        first: String,
        /// The other.
        second: String,
    },
    /// Stacked tensors disagree on L, or a stacked key has no leading axis.
    #[error(
        "stacked tensor `{key}` has shape {shape:?}, expected a leading layer axis of {expected}"
    )]
    Stack {
        /// The stored key.
        key: String,
        /// Its shape.
        shape: Vec<usize>,
        /// The L every stacked tensor must have.
        expected: usize,
    },
    /// Parameters the output layout cannot hold: no runtime reading that layout has them.
    #[error("the `{layout}` layout cannot hold {} parameter(s) of this model: {why}:{}", keys.len(), list(keys))]
    NotInLayout {
        /// The output layout.
        layout: Layout,
        /// The canonical names.
        keys: Vec<String>,
        /// Why, in model terms.
        why: &'static str,
    },
    /// A tensor's rank does not fit its transform.
    #[error("tensor `{key}`: {reason}")]
    Rank {
        /// The stored key.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// A tensor whose dtype is not floating point.
    #[error("tensor `{key}` has dtype {dtype}; WAN parameters are floating point (F32, F16, BF16)")]
    NonFloat {
        /// The stored key.
        key: String,
        /// Its dtype.
        dtype: DType,
    },
    /// No layout explains the keys (the front end says how to name one).
    #[error("cannot tell the layout from the keys: {}{}{}", closest_text(*closest, unknown.len()), list(unknown), animate_note(unknown))]
    Undetectable {
        /// The layout that explained the most keys (`None`: no key is a WAN parameter in
        /// any layout).
        closest: Option<Layout>,
        /// Keys it did not explain.
        unknown: Vec<String>,
    },
    /// More than one layout explains every key (the front end says how to name one).
    #[error("the keys fit more than one layout ({})", join_layouts(candidates))]
    Ambiguous {
        /// The layouts that fit.
        candidates: Vec<Layout>,
    },
    /// The config.json layout field is not a layout name.
    #[error(
        "config.json field `{field}` is {value}; expected one of \"diffusers\", \"wan\", \"nnx\", \"nnx-scanned\""
    )]
    ConfigField {
        /// The field name.
        field: &'static str,
        /// The value found (JSON).
        value: String,
    },
    /// Only the VACE part of a VACE model (a Kijai "VACE module" file): no transformer.
    #[error(
        "only the VACE part of a VACE model ({blocks} VACE blocks and vace_patch_embedding, no \
         transformer blocks): a VACE module file is loaded beside a Wan T2V model of its width, \
         not on its own; wanbake reads it only with `inspect`"
    )]
    VaceModuleOnly {
        /// How many VACE blocks it holds.
        blocks: usize,
    },
    /// The config cannot be inferred from the shapes.
    #[error(
        "cannot infer the config from the tensor shapes: {0}\nhint: put the model's config.json next to the weights"
    )]
    Infer(String),
    /// A block parameter is missing in some blocks, so it cannot be stacked.
    #[error("cannot stack `{key}`: {reason}")]
    Unstackable {
        /// The output key.
        key: String,
        /// Why.
        reason: String,
    },
    /// A canonical parameter name the write plan does not know.
    #[error("{} canonical parameter(s) are not WAN transformer parameters:{}", keys.len(), list(keys))]
    UnknownCanonical {
        /// The names.
        keys: Vec<String>,
    },
    /// A keep-f32 policy that is not one of the named ones or `regex:PATTERN`. (Messages of
    /// option values name no flag: the command line and recipes each prefix their own.)
    #[error("`{0}` is not diffusers, maxdiffusion, none or regex:PATTERN")]
    UnknownKeepF32(String),
    /// The keep-f32 regex does not compile.
    #[error("regex `{pattern}`: {reason}")]
    Regex {
        /// The pattern.
        pattern: String,
        /// The regex error.
        reason: String,
    },
    /// The pieces of one output tensor come in dtypes that `keep` cannot keep (the front end
    /// says how to choose an output dtype).
    #[error(
        "output `{key}` is stacked from pieces of dtypes {dtypes:?}; keeping the stored dtype needs one dtype"
    )]
    MixedDtypes {
        /// The output key.
        key: String,
        /// The dtypes found.
        dtypes: Vec<DType>,
    },
}

fn list(keys: &[String]) -> String {
    let mut s = String::new();
    for k in keys.iter().take(LISTED_KEYS) {
        let _ = write!(s, "\n  {k}");
    }
    if keys.len() > LISTED_KEYS {
        let _ = write!(s, "\n  ... and {} more", keys.len() - LISTED_KEYS);
    }
    s
}

fn list_shapes(m: &[StoredShapeMismatch]) -> String {
    let mut s = String::new();
    for x in m.iter().take(LISTED_KEYS) {
        let _ = write!(
            s,
            "\n  {}: expected {:?}, found {:?}",
            x.key, x.expected, x.found
        );
    }
    if m.len() > LISTED_KEYS {
        let _ = write!(s, "\n  ... and {} more", m.len() - LISTED_KEYS);
    }
    s
}

fn closest_text(closest: Option<Layout>, n: usize) -> String {
    match closest {
        Some(l) => format!("the closest is `{l}`, which does not know {n} of them:"),
        None => format!(
            "none of the {n} keys is a WAN transformer parameter in any layout (an adapter, or another model?):"
        ),
    }
}

fn join_layouts(l: &[Layout]) -> String {
    l.iter().map(|l| l.as_str()).collect::<Vec<_>>().join(", ")
}

/// [`ANIMATE_UNKNOWN`] when `keys` hold an Animate module, else nothing.
pub fn animate_note(keys: &[String]) -> &'static str {
    if keys.iter().any(|k| is_animate_module(k)) {
        ANIMATE_UNKNOWN
    } else {
        ""
    }
}

fn hint_unknown(layout: Layout, keys: &[String]) -> impl fmt::Display {
    if !animate_note(keys).is_empty() {
        return ANIMATE_UNKNOWN.to_string();
    }
    let other = match layout {
        Layout::Diffusers => "wan, nnx or nnx-scanned",
        Layout::Wan => "diffusers, nnx or nnx-scanned",
        Layout::Nnx => "nnx-scanned, diffusers or wan",
        Layout::NnxScanned => "nnx, diffusers or wan",
    };
    format!("\nhint: is this another model, or a checkpoint in the {other} layout?")
}
