//! The four layouts a WAN transformer checkpoint can be stored in, and which one a
//! checkpoint is in: from its config.json, else from its keys.
//!
//! Owns: `Layout` (`diffusers`, `wan`, `nnx`, `nnx-scanned`), its command-line and
//! config.json spelling, and `UnknownLayout`; the config.json field `_wanbake_layout`
//! (written by `wanbake restack`, preferred by every later read), `find_layout` (the one
//! layout whose name table explains every key, and the one that explains most: the
//! `LayoutFinding`), and `resolve_layout`, the order of
//! precedence: an explicit choice, then the config field, then detection. Does not own: the
//! names each layout gives a parameter (`model::wan_names`), checking shapes
//! (`model::read_plan`) or converting a checkpoint between layouts (`layout`).
//!
//! The field name starts with `_`, so diffusers' `ConfigMixin.extract_init_dict` drops it
//! as a private attribute ("remove private attributes") without a warning, and
//! `WanConfig` ignores it like any unknown field. Its value is a layout name:
//! `"diffusers"`, `"wan"`, `"nnx"` or `"nnx-scanned"`.

use std::fmt;
use std::str::FromStr;

use serde_json::{Map, Value};

use super::plan_error::PlanError;
use super::wan_names::{self, SKIPPED_MARKER};

/// A naming and storage convention for the WAN transformer's parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Layout {
    /// diffusers `WanTransformer3DModel` names, PyTorch layouts (the canonical form).
    Diffusers,
    /// Original Wan-AI / ComfyUI names (spec wan.md §1.4), PyTorch layouts. On input the
    /// `model.diffusion_model.` and `diffusion_model.` prefixes are accepted.
    Wan,
    /// MaxDiffusion NNX paths with `scan_layers: False`: `blocks.N.attn1.query.kernel` (in,
    /// out), Conv3d kernel DHWIO, norm `scale`s.
    Nnx,
    /// MaxDiffusion NNX paths with `scan_layers: True`: one tensor per block parameter with
    /// a leading axis of size L (`blocks.attn1.query.kernel` (L, in, out)).
    NnxScanned,
}

impl Layout {
    /// Every layout.
    pub const ALL: [Layout; 4] = [
        Layout::Diffusers,
        Layout::Wan,
        Layout::Nnx,
        Layout::NnxScanned,
    ];

    /// The command-line and config.json spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Layout::Diffusers => "diffusers",
            Layout::Wan => "wan",
            Layout::Nnx => "nnx",
            Layout::NnxScanned => "nnx-scanned",
        }
    }

    /// True for the two MaxDiffusion layouts.
    pub fn is_nnx(self) -> bool {
        matches!(self, Layout::Nnx | Layout::NnxScanned)
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A layout name that is not one of the four.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown layout `{0}` (expected {expected})",
    expected = crate::names::either(Layout::ALL.map(Layout::as_str))
)]
pub struct UnknownLayout(pub String);

impl FromStr for Layout {
    type Err = UnknownLayout;

    fn from_str(s: &str) -> Result<Layout, UnknownLayout> {
        crate::names::find(&Layout::ALL, Layout::as_str, s)
            .ok_or_else(|| UnknownLayout(s.to_string()))
    }
}

crate::names::value_enum!(Layout);

impl Layout {
    /// The stem of an output's weight files in this layout, from the base's `stem`: an nnx
    /// output is wanbake's own (`wanbake_nnx`, `wanbake_nnx_scanned`), so that no loader
    /// takes it for diffusers' `diffusion_pytorch_model*.safetensors`; the others keep the
    /// base's (original Wan's `WanModel` saves `diffusion_pytorch_model*.safetensors` too),
    /// but for an nnx base's, which becomes `diffusion_pytorch_model`.
    pub fn weights_stem(self, stem: &str) -> String {
        let nnx = |l: Layout| format!("wanbake_{}", l.as_str().replace('-', "_"));
        match self {
            Layout::Nnx | Layout::NnxScanned => nnx(self),
            Layout::Diffusers | Layout::Wan => {
                match [Layout::Nnx, Layout::NnxScanned]
                    .iter()
                    .any(|&l| nnx(l) == stem)
                {
                    true => "diffusion_pytorch_model".into(),
                    false => stem.to_string(),
                }
            }
        }
    }
}

/// The config.json field that records a checkpoint's layout.
pub const LAYOUT_FIELD: &str = "_wanbake_layout";

/// What a set of keys says about the WAN layout it is stored in: found once per component
/// (`model::base_model`), read by every later stage.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayoutFinding {
    /// The one layout whose name table explains every key, or why there is none.
    pub exact: Result<Layout, PlanError>,
    /// The layout that explains the most keys (the exact one when there is one, the first of
    /// the candidates when several explain all); `None` when no key is a WAN parameter.
    /// Binding reads a base with stray keys this way.
    pub closest: Option<Layout>,
}

/// Scores every layout against `names` (keys containing `norm_added_q`, which every layout
/// skips, are not counted).
pub fn find_layout<S: AsRef<str>>(names: &[S]) -> LayoutFinding {
    let keys: Vec<&str> = names
        .iter()
        .map(AsRef::as_ref)
        .filter(|n| !n.contains(SKIPPED_MARKER))
        .collect();
    let explained = |layout: Layout| {
        keys.iter()
            .filter(|k| {
                wan_names::parse_stored(layout, k).is_some()
                    || (layout == Layout::Wan && super::animate::is_blur_kernel(k))
            })
            .count()
    };
    let counts: Vec<(Layout, usize)> = Layout::ALL.iter().map(|&l| (l, explained(l))).collect();
    let mut most = counts[0];
    for &c in &counts[1..] {
        if c.1 > most.1 {
            most = c;
        }
    }
    let closest = (most.1 > 0).then_some(most.0);
    let complete: Vec<Layout> = counts
        .iter()
        .filter(|&&(_, n)| n == keys.len())
        .map(|&(l, _)| l)
        .collect();
    let exact = match complete.as_slice() {
        [one] => Ok(*one),
        [] => {
            let mut unknown: Vec<String> = keys
                .iter()
                .filter(|k| {
                    closest.is_none_or(|l| {
                        wan_names::parse_stored(l, k).is_none()
                            && !(l == Layout::Wan && super::animate::is_blur_kernel(k))
                    })
                })
                .map(|k| k.to_string())
                .collect();
            unknown.sort();
            Err(PlanError::Undetectable { closest, unknown })
        }
        many => Err(PlanError::Ambiguous {
            candidates: many.to_vec(),
        }),
    };
    LayoutFinding { exact, closest }
}

/// The layout whose name table explains every key (keys containing `norm_added_q`, which
/// every layout skips, are not counted). Fails when no layout or more than one does.
pub fn detect_layout<S: AsRef<str>>(names: &[S]) -> Result<Layout, PlanError> {
    find_layout(names).exact
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

/// Records `layout` in a config.json object, and makes the object say the layout truthfully
/// (an output must not claim a format it is not in):
/// - `wan`: a diffusers `WanTransformer3DModel` config becomes the config original Wan's
///   `WanModel` saves (Wan-Video/Wan2.1@aa843f59 `wan/modules/model.py`: a diffusers
///   `ModelMixin` + `ConfigMixin` whose `ignore_for_config` leaves out `patch_size`,
///   `cross_attn_norm`, `qk_norm`, `text_dim`, `window_size`; what Wan-AI/Wan2.1-T2V-14B's
///   config.json holds), so `WanModel.from_pretrained` reads the folder and no diffusers
///   loader takes it for its own. An original config stays; a variant's diffusers config
///   (VACE, SkyReels-V2) stays too: its original class takes more keys than these;
/// - `nnx`, `nnx-scanned` (read by wanbake alone): the diffusers class and version move to
///   private fields (`_wanbake_class_name`, `_wanbake_diffusers_version`), so the config names
///   no diffusers class; the model's sizes stay in diffusers' keys, which wanbake reads;
/// - `diffusers`: a class moved away by an nnx output comes back.
pub fn stamp_config(config: &mut Map<String, Value>, layout: Layout) {
    const MOVED: [(&str, &str); 2] = [
        ("_class_name", "_wanbake_class_name"),
        ("_diffusers_version", "_wanbake_diffusers_version"),
    ];
    let moves: Vec<(&str, &str)> = match layout {
        Layout::Diffusers => MOVED.iter().map(|&(a, b)| (b, a)).collect(),
        Layout::Nnx | Layout::NnxScanned => MOVED.to_vec(),
        Layout::Wan => {
            to_original_config(config);
            Vec::new()
        }
    };
    for (from, to) in moves {
        if let Some(v) = config.remove(from) {
            config.entry(to).or_insert(v);
        }
    }
    config.insert(
        LAYOUT_FIELD.to_string(),
        Value::String(layout.as_str().into()),
    );
}

/// The class original Wan's transformer config.json names.
pub const ORIGINAL_CLASS: &str = "WanModel";

/// Replaces a diffusers `WanTransformer3DModel` config (or one without a class) by the
/// `WanModel` config of the same model (`stamp_config`); anything else is left as it is.
fn to_original_config(config: &mut Map<String, Value>) {
    let class = config.get("_class_name").and_then(Value::as_str);
    if class.is_some_and(|c| c != "WanTransformer3DModel") {
        return;
    }
    let Ok(c) = super::wan::WanConfig::from_value(Value::Object(config.clone())) else {
        return;
    };
    // WanModel's `model_type`: Wan 2.1's builds the image branch for i2v and flf2v (flf2v
    // with its position embedding; Wan-Video/Wan2.1@9737cba `wan/modules/model.py`); Wan
    // 2.2's takes t2v, i2v, ti2v, s2v and has no image branch, i2v requiring the conditioning
    // latents (the I2V-A14B's 36 input channels), ti2v the 5B's 48 channels
    // (Wan-Video/Wan2.2@4ef5a99 `wan/modules/model.py`).
    let model_type = match (c.image_dim, c.pos_embed_seq_len, c.in_channels) {
        (Some(_), Some(_), _) => "flf2v",
        (Some(_), None, _) | (None, _, 36) => "i2v",
        (None, _, 48) => "ti2v",
        _ => "t2v",
    };
    let original = serde_json::json!({
        "_class_name": ORIGINAL_CLASS,
        "model_type": model_type,
        "text_len": 512,
        "in_dim": c.in_channels,
        "dim": c.inner_dim(),
        "ffn_dim": c.ffn_dim,
        "freq_dim": c.freq_dim,
        "out_dim": c.out_channels(),
        "num_heads": c.num_attention_heads,
        "num_layers": c.num_layers,
        "eps": c.eps,
    });
    if let Value::Object(m) = original {
        *config = m;
    }
}

/// An explicit choice wins, then the config.json field, then detection from the keys.
pub fn resolve_layout<S: AsRef<str>>(
    explicit: Option<Layout>,
    config: Option<&Value>,
    names: &[S],
) -> Result<Layout, PlanError> {
    resolve_found_layout(explicit, config, || detect_layout(names))
}

/// [`resolve_layout`] with the keys' answer already found (or found only when needed).
pub fn resolve_found_layout(
    explicit: Option<Layout>,
    config: Option<&Value>,
    from_keys: impl FnOnce() -> Result<Layout, PlanError>,
) -> Result<Layout, PlanError> {
    if let Some(l) = explicit {
        return Ok(l);
    }
    if let Some(l) = config.map(layout_from_config).transpose()?.flatten() {
        return Ok(l);
    }
    from_keys()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_round_trip() {
        for l in Layout::ALL {
            assert_eq!(l.as_str().parse::<Layout>().unwrap(), l);
        }
        assert!("nnx_scanned".parse::<Layout>().is_err());
    }

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

    /// A diffusers config stamped `wan` is the `WanModel` config of the same model (the keys
    /// of Wan-AI/Wan2.1-T2V-1.3B's config.json, its values for the 1.3B); stamped `nnx`, it
    /// names no diffusers class, and stamped back `diffusers` it is the config it was.
    #[test]
    fn a_stamped_config_says_its_layout() {
        let diffusers = serde_json::json!({
            "_class_name": "WanTransformer3DModel", "_diffusers_version": "0.33.0",
            "patch_size": [1, 2, 2], "num_attention_heads": 12, "attention_head_dim": 128,
            "in_channels": 16, "out_channels": 16, "text_dim": 4096, "freq_dim": 256,
            "ffn_dim": 8960, "num_layers": 30, "cross_attn_norm": true,
            "qk_norm": "rms_norm_across_heads", "eps": 1e-6, "image_dim": null,
            "added_kv_proj_dim": null, "rope_max_seq_len": 1024
        });
        let Value::Object(d) = diffusers else {
            unreachable!()
        };
        let mut wan = d.clone();
        stamp_config(&mut wan, Layout::Wan);
        let want = serde_json::json!({
            "_class_name": "WanModel", "model_type": "t2v", "text_len": 512, "in_dim": 16,
            "dim": 1536, "ffn_dim": 8960, "freq_dim": 256, "out_dim": 16, "num_heads": 12,
            "num_layers": 30, "eps": 1e-6, "_wanbake_layout": "wan"
        });
        assert_eq!(Value::Object(wan.clone()), want);
        // An original config stays one.
        let mut again = wan.clone();
        stamp_config(&mut again, Layout::Wan);
        assert_eq!(again, wan);
        let mut nnx = d.clone();
        stamp_config(&mut nnx, Layout::Nnx);
        assert!(!nnx.contains_key("_class_name") && !nnx.contains_key("_diffusers_version"));
        assert_eq!(nnx["_wanbake_class_name"], "WanTransformer3DModel");
        let mut back = nnx.clone();
        stamp_config(&mut back, Layout::Diffusers);
        let mut want = d.clone();
        want.insert(LAYOUT_FIELD.into(), "diffusers".into());
        assert_eq!(back, want);
        assert_eq!(
            Layout::NnxScanned.weights_stem("diffusion_pytorch_model"),
            "wanbake_nnx_scanned"
        );
        assert_eq!(
            Layout::Wan.weights_stem("diffusion_pytorch_model"),
            "diffusion_pytorch_model"
        );
        assert_eq!(
            Layout::Diffusers.weights_stem("wanbake_nnx"),
            "diffusion_pytorch_model"
        );
        assert_eq!(Layout::Wan.weights_stem("t2v_original"), "t2v_original");
    }
}
