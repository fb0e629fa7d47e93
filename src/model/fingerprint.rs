//! Which released model a set of tensors is, decided from names and shapes alone.
//!
//! Owns: `fingerprint`, which recognises WAN 2.1/2.2 variants (in diffusers naming, or in
//! original Wan-AI naming with or without the ComfyUI prefixes) and SA3 small/medium, derives
//! the config the shapes imply, compares it with the released configs, and explains an
//! "unknown" answer by naming the closest variant and the first field that differs.

use std::collections::BTreeSet;

use serde::Serialize;

use super::read_plan::{ReadPlan, StoredTensor};
use super::sa3::{DIT_PREFIX, Sa3Variant};
use super::wan::{WanConfig, WanVariant};
use super::wan_layout::{LayoutFinding, find_layout};
use crate::io::DType;

/// The verdict.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Fingerprint {
    /// `wan`, `sa3`, or `unknown`.
    pub family: String,
    /// Variant id (e.g. `wan2.1-t2v-1.3b`), when recognised.
    pub variant: Option<String>,
    /// Human description.
    pub description: String,
    /// Naming the keys use (`diffusers`, `wan`, `sa3`, ...), when recognised.
    pub naming: Option<String>,
    /// The config fields derived from shapes (WAN) or the SA3 widths.
    pub derived: serde_json::Value,
    /// Why the answer is "unknown", or notes about a recognised one.
    pub notes: Vec<String>,
    /// The WAN config the shapes imply (heads assume 128-wide heads).
    #[serde(skip)]
    pub wan: Option<WanConfig>,
}

/// Shape lookup by name over a checkpoint's tensors.
pub trait ShapeSource {
    /// The shape of `name`, if present.
    fn shape(&self, name: &str) -> Option<Vec<usize>>;
    /// Every tensor name.
    fn names(&self) -> Vec<String>;
}

/// Shapes by name, built by hand: the tests' source (here and in `layout::write`).
#[cfg(test)]
pub(crate) struct Shapes(pub(crate) std::collections::BTreeMap<String, Vec<usize>>);

#[cfg(test)]
impl ShapeSource for Shapes {
    fn shape(&self, n: &str) -> Option<Vec<usize>> {
        self.0.get(n).cloned()
    }
    fn names(&self) -> Vec<String> {
        self.0.keys().cloned().collect()
    }
}

impl ShapeSource for crate::io::TensorSet {
    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.get(name).map(|t| t.view.shape.to_vec())
    }
    fn names(&self) -> Vec<String> {
        crate::io::TensorSet::names(self)
            .map(str::to_string)
            .collect()
    }
}

/// Recognises the model `src` holds.
pub fn fingerprint(src: &dyn ShapeSource) -> Fingerprint {
    let names = src.names();
    fingerprint_found(src, &names, &find_layout(&names))
}

/// [`fingerprint`] of `src`, whose keys `names` were already scored against the WAN
/// layouts (`layout`).
pub fn fingerprint_found(
    src: &dyn ShapeSource,
    names: &[String],
    layout: &LayoutFinding,
) -> Fingerprint {
    if let Some(f) = fingerprint_vace_module(src, names) {
        return f;
    }
    if let Some(f) = fingerprint_wan(src, names, layout) {
        return f;
    }
    if let Some(f) = fingerprint_sa3(src, names) {
        return f;
    }
    Fingerprint {
        family: "unknown".into(),
        variant: None,
        description: "unknown model".into(),
        naming: None,
        derived: serde_json::Value::Null,
        wan: None,
        notes: vec![
            "no WAN key (patch_embedding + blocks.N.attn1/self_attn) and no SA3 key \
             (transformer.layers.N.self_attn.to_qkv) found"
                .into(),
        ],
    }
}

/// Number of distinct indices N in names of the form `{prefix}N.…`.
fn indexed_count(names: &[String], prefix: &str) -> usize {
    let ids: BTreeSet<usize> = names
        .iter()
        .filter_map(|n| n.strip_prefix(prefix)?.split('.').next()?.parse().ok())
        .collect();
    ids.len()
}

/// True when the keys look like a WAN transformer in some layout, even if not every key
/// can be explained (so the failure can be reported instead of "unknown model").
fn looks_like_wan(names: &[String]) -> bool {
    names
        .iter()
        .any(|n| n.ends_with("patch_embedding.weight") || n.ends_with("patch_embedding.kernel"))
        && names.iter().any(|n| n.contains("blocks."))
}

fn fingerprint_wan(
    src: &dyn ShapeSource,
    names: &[String],
    layout: &LayoutFinding,
) -> Option<Fingerprint> {
    if !looks_like_wan(names) {
        return None;
    }
    let stored: Vec<StoredTensor> = names
        .iter()
        .filter_map(|n| {
            Some(StoredTensor {
                name: n.clone(),
                dtype: DType::F32,
                shape: src.shape(n)?,
            })
        })
        .collect();
    let plan = layout
        .exact
        .clone()
        .and_then(|layout| ReadPlan::new(layout, &stored, None));
    let plan = match plan {
        Ok(p) => p,
        Err(e) => {
            return Some(Fingerprint {
                family: "wan".into(),
                variant: None,
                description: "WAN-like checkpoint that does not read as any WAN layout".into(),
                naming: None,
                derived: serde_json::Value::Null,
                notes: vec![e.to_string()],
                wan: None,
            });
        }
    };
    let naming = plan.layout.as_str();
    let mut notes =
        super::read_plan::skipped_lines(plan.skipped.iter().map(|k| (k.name.as_str(), k.reason)));
    let cfg = plan.config;
    let mut derived = serde_json::json!({
        "inner_dim": cfg.inner_dim(),
        "in_channels": cfg.in_channels,
        "out_channels": cfg.out_channels,
        "patch_size": cfg.patch_size,
        "text_dim": cfg.text_dim,
        "freq_dim": cfg.freq_dim,
        "ffn_dim": cfg.ffn_dim,
        "num_layers": cfg.num_layers,
        "image_dim": cfg.image_dim,
        "added_kv_proj_dim": cfg.added_kv_proj_dim,
        "pos_embed_seq_len": cfg.pos_embed_seq_len,
    });
    if let Some(layers) = &cfg.vace_layers {
        derived["vace_layers"] = serde_json::json!(layers);
        derived["vace_in_channels"] = serde_json::json!(cfg.vace_in_channels);
    }
    if cfg.inject_sample_info {
        derived["inject_sample_info"] = true.into();
    }
    if let Some(c) = cfg.in_dim_ref_conv {
        derived["in_dim_ref_conv"] = c.into();
    }
    if let Some(c) = cfg.in_dim_control_adapter {
        derived["in_dim_control_adapter"] = c.into();
    }
    if let Some(a) = &cfg.animate {
        derived["animate"] = serde_json::json!(a);
    }
    let found = WanVariant::ALL
        .iter()
        .find(|v| same_wan_shapes(&v.config(), &cfg));
    let (variant, description) = match found {
        Some(v) => (Some(v.id().to_string()), v.name().to_string()),
        None => {
            notes.push(closest_wan_difference(&cfg));
            (None, "WAN transformer of an unreleased shape".to_string())
        }
    };
    Some(Fingerprint {
        family: "wan".into(),
        variant,
        description,
        naming: Some(naming.into()),
        derived,
        notes,
        wan: Some(cfg),
    })
}

/// A VACE "module" file (Kijai's `Wan2_1-VACE_module_*.safetensors`, read by
/// ComfyUI-WanVideoWrapper beside a Wan T2V model): only `vace_patch_embedding` and
/// `vace_blocks.*`, original names. Its width says which released VACE model it is the
/// VACE part of (diffusers' single-file detection reads the same width).
fn fingerprint_vace_module(src: &dyn ShapeSource, names: &[String]) -> Option<Fingerprint> {
    let all_vace = !names.is_empty()
        && names
            .iter()
            .all(|n| super::wan_names::strip_wan_prefix(n).starts_with("vace_"));
    if !all_vace {
        return None;
    }
    let embed = names
        .iter()
        .find(|n| super::wan_names::strip_wan_prefix(n) == "vace_patch_embedding.weight")
        .and_then(|n| src.shape(n));
    let blocks = indexed_count(names, "vace_blocks.");
    let (width, channels) = match embed.as_deref() {
        Some([d, c, ..]) => (*d, *c),
        _ => (0, 0),
    };
    let released = [WanVariant::Vace1_3B, WanVariant::Vace14B]
        .into_iter()
        .find(|v| {
            let c = v.config();
            c.inner_dim() == width
                && c.vace_in_channels == Some(channels)
                && c.blocks_of(super::wan_names::Scope::VaceBlock) == blocks
        });
    let description = match released {
        Some(v) => format!("VACE module of {} (its VACE blocks only)", v.name()),
        None => "VACE module (VACE blocks only) of an unreleased shape".into(),
    };
    Some(Fingerprint {
        family: "wan".into(),
        variant: released.map(|v| format!("{}-module", v.id())),
        description,
        naming: Some("wan".into()),
        derived: serde_json::json!({
            "inner_dim": width,
            "vace_in_channels": channels,
            "vace_blocks": blocks,
        }),
        notes: vec![
            "a VACE module is loaded beside a Wan T2V model of the same width (ComfyUI-\
             WanVideoWrapper's VACE model input); it is not a model on its own, so commands \
             that read a whole model refuse it"
                .into(),
        ],
        wan: None,
    })
}

/// Notes where a diffusers `config.json` disagrees with the weights (spec wan.md §1.3: a
/// Wan2.2 config with `image_dim` set but no image weights would build randomly initialised
/// layers and break inference).
pub fn config_disagreements(config: &WanConfig, from_shapes: &WanConfig) -> Vec<String> {
    wan_fields(config)
        .iter()
        .zip(wan_fields(from_shapes).iter())
        .filter(|(a, b)| a.1 != b.1)
        .map(|(a, b)| {
            format!(
                "config.json says {} = {} but the weights imply {}: a loader trusting the \
                 config builds layers the weights do not fill",
                a.0, a.1, b.1
            )
        })
        .collect()
}

/// The fields shapes can reveal (of `vace_layers`, only how many).
fn wan_fields(c: &WanConfig) -> [(&'static str, String); 16] {
    [
        ("inner_dim", c.inner_dim().to_string()),
        ("num_layers", c.num_layers.to_string()),
        ("ffn_dim", c.ffn_dim.to_string()),
        ("in_channels", c.in_channels.to_string()),
        ("out_channels", c.out_channels().to_string()),
        ("text_dim", c.text_dim.to_string()),
        ("freq_dim", c.freq_dim.to_string()),
        ("image_dim", optional(c.image_dim)),
        ("added_kv_proj_dim", optional(c.added_kv_proj_dim)),
        ("pos_embed_seq_len", optional(c.pos_embed_seq_len)),
        (
            "VACE blocks",
            c.blocks_of(super::wan_names::Scope::VaceBlock).to_string(),
        ),
        ("vace_in_channels", optional(c.vace_in_channels)),
        ("inject_sample_info", c.inject_sample_info.to_string()),
        ("in_dim_ref_conv", optional(c.in_dim_ref_conv)),
        ("in_dim_control_adapter", optional(c.in_dim_control_adapter)),
        (
            "Animate module sizes",
            c.animate
                .as_ref()
                .map_or("none".into(), |a| a.shape_key(c.num_layers)),
        ),
    ]
}

/// An optional width as a note prints it.
fn optional(v: Option<usize>) -> String {
    v.map_or_else(|| "absent".to_string(), |v| v.to_string())
}

fn same_wan_shapes(a: &WanConfig, b: &WanConfig) -> bool {
    a.patch_size == b.patch_size && wan_fields(a) == wan_fields(b)
}

fn closest_wan_difference(cfg: &WanConfig) -> String {
    let mine = wan_fields(cfg);
    let (v, diffs) = WanVariant::ALL
        .iter()
        .map(|v| {
            let theirs = wan_fields(&v.config());
            let diffs: Vec<String> = mine
                .iter()
                .zip(&theirs)
                .filter(|(a, b)| a.1 != b.1)
                .map(|(a, b)| format!("{} is {} (expected {})", a.0, a.1, b.1))
                .collect();
            (v, diffs)
        })
        .min_by_key(|(_, d)| d.len())
        .expect("at least one variant");
    format!(
        "closest released model is {}, but {}",
        v.name(),
        diffs.join(", ")
    )
}

fn fingerprint_sa3(src: &dyn ShapeSource, names: &[String]) -> Option<Fingerprint> {
    let (prefix, naming) = [(DIT_PREFIX, "sa3"), ("", "sa3-mlx")]
        .into_iter()
        .find(|(p, _)| {
            src.shape(&format!("{p}transformer.layers.0.self_attn.to_qkv.weight"))
                .is_some()
        })?;
    let qkv = src.shape(&format!(
        "{prefix}transformer.layers.0.self_attn.to_qkv.weight"
    ))?;
    let (rows, e) = (qkv.first().copied()?, qkv.get(1).copied()?);
    let depth = indexed_count(names, &format!("{prefix}transformer.layers."));
    let derived = serde_json::json!({"embed": e, "qkv_rows": rows, "depth": depth});
    let found = Sa3Variant::ALL.iter().find(|v| {
        let s = v.shapes();
        s.embed == e && s.qkv_blocks * s.embed == rows && s.depth == depth
    });
    let mut notes = Vec::new();
    if found.is_none() {
        notes.push(format!(
            "E={e}, to_qkv rows {rows}, depth {depth} match neither small (E=1024, 3E, 20) nor medium (E=1536, 5E, 24)"
        ));
    }
    Some(Fingerprint {
        family: "sa3".into(),
        variant: found.map(|v| v.id().into()),
        description: found
            .map_or("SA3-like DiT of an unreleased shape", |v| v.name())
            .into(),
        naming: Some(naming.into()),
        derived,
        notes,
        wan: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn every_released_wan_config_is_recognised_from_its_parameter_table() {
        use crate::model::wan_layout::Layout;
        use crate::model::wan_names::parse_canonical;
        for v in WanVariant::ALL {
            for layout in [Layout::Diffusers, Layout::Wan] {
                // Animate's original names fuse and reshape tensors, which this naive
                // renaming does not: tests/variants.rs reads the released original list.
                if v == WanVariant::Animate14B && layout == Layout::Wan {
                    continue;
                }
                let params = v.config().diffusers_params();
                let named = params.into_iter().map(|p| {
                    let (row, block) = parse_canonical(&p.name).expect("a table name");
                    let name = row.stored_name(layout, block.unwrap_or(0)).0;
                    (row.fits(layout), (name, p.shape))
                });
                // A layout that cannot hold a part (diffusers and Fun's extras) is skipped.
                let Some(tensors) = named
                    .map(|(fits, t)| fits.then_some(t))
                    .collect::<Option<_>>()
                else {
                    continue;
                };
                let f = fingerprint(&Shapes(tensors));
                assert_eq!(f.variant.as_deref(), Some(v.id()), "{layout} {f:?}");
            }
        }
    }

    #[test]
    fn a_vace_module_file_is_named_by_the_model_it_belongs_to() {
        use crate::model::wan_layout::Layout;
        use crate::model::wan_names::parse_canonical;
        for (v, id) in [
            (WanVariant::Vace14B, "wan2.1-vace-14b-module"),
            (WanVariant::Vace1_3B, "wan2.1-vace-1.3b-module"),
        ] {
            // Kijai's module files: the VACE tensors only, original names, no prefix.
            let tensors = v
                .config()
                .diffusers_params()
                .into_iter()
                .filter(|p| p.name.starts_with("vace_"))
                .map(|p| {
                    let (row, block) = parse_canonical(&p.name).unwrap();
                    (row.stored_name(Layout::Wan, block.unwrap_or(0)).0, p.shape)
                })
                .collect();
            let f = fingerprint(&Shapes(tensors));
            assert_eq!(f.variant.as_deref(), Some(id), "{f:?}");
        }
    }

    #[test]
    fn a_wan_file_with_a_foreign_key_says_which_key() {
        let mut m: BTreeMap<String, Vec<usize>> = WanVariant::T2V1_3B
            .config()
            .diffusers_params()
            .into_iter()
            .map(|p| (p.name, p.shape))
            .collect();
        m.insert("blocks.0.attn1.mystery.weight".into(), vec![4]);
        let f = fingerprint(&Shapes(m));
        assert_eq!(f.family, "wan");
        assert!(
            f.notes[0].contains("blocks.0.attn1.mystery.weight"),
            "{:?}",
            f.notes
        );
    }

    #[test]
    fn sa3_sizes_are_recognised() {
        for v in Sa3Variant::ALL {
            let s = Shapes(
                super::super::sa3::sa3_params(v)
                    .into_iter()
                    .map(|p| (p.name, p.shape))
                    .collect(),
            );
            assert_eq!(fingerprint(&s).variant.as_deref(), Some(v.id()));
        }
    }

    #[test]
    fn a_modified_shape_is_unknown_and_explained() {
        let mut cfg = WanVariant::T2V1_3B.config();
        cfg.ffn_dim = 9000;
        let s = Shapes(
            cfg.diffusers_params()
                .into_iter()
                .map(|p| (p.name, p.shape))
                .collect(),
        );
        let f = fingerprint(&s);
        assert_eq!(f.variant, None);
        assert!(
            f.notes[0].contains("Wan2.1-T2V-1.3B") && f.notes[0].contains("ffn_dim is 9000"),
            "{:?}",
            f.notes
        );
    }
}
