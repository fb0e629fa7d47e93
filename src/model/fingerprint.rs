//! Which released model a set of tensors is, decided from names and shapes alone.
//!
//! Owns: `fingerprint`, which recognises WAN 2.1/2.2 variants (in diffusers naming, or in
//! original Wan-AI naming with or without the ComfyUI prefixes) and SA3 small/medium, derives
//! the config the shapes imply, compares it with the released configs, and explains an
//! "unknown" answer by naming the closest variant and the first field that differs.

use std::collections::BTreeSet;

use serde::Serialize;

use super::sa3::{DIT_PREFIX, Sa3Variant};
use super::wan::{WanConfig, WanVariant};

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
    if let Some(f) = fingerprint_wan(src, &names) {
        return f;
    }
    if let Some(f) = fingerprint_sa3(src, &names) {
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

/// Where the few tensors the WAN fingerprint needs live, per naming.
struct WanNames {
    naming: &'static str,
    prefix: String,
}

impl WanNames {
    fn get(&self, src: &dyn ShapeSource, canonical: &str) -> Option<Vec<usize>> {
        let name = if self.naming == "diffusers" {
            canonical.to_string()
        } else {
            original_name(canonical)?
        };
        src.shape(&format!("{}{}", self.prefix, name))
    }
}

/// Original Wan-AI spelling of the diffusers names the fingerprint reads (spec wan.md §1.4).
fn original_name(canonical: &str) -> Option<String> {
    let table = [
        ("patch_embedding.weight", "patch_embedding.weight"),
        (
            "condition_embedder.text_embedder.linear_1.weight",
            "text_embedding.0.weight",
        ),
        (
            "condition_embedder.time_embedder.linear_1.weight",
            "time_embedding.0.weight",
        ),
        (
            "condition_embedder.image_embedder.ff.net.0.proj.weight",
            "img_emb.proj.1.weight",
        ),
        (
            "condition_embedder.image_embedder.pos_embed",
            "img_emb.emb_pos",
        ),
        ("blocks.0.ffn.net.0.proj.weight", "blocks.0.ffn.0.weight"),
        (
            "blocks.0.attn2.add_k_proj.weight",
            "blocks.0.cross_attn.k_img.weight",
        ),
        ("proj_out.weight", "head.head.weight"),
    ];
    table
        .iter()
        .find(|(c, _)| *c == canonical)
        .map(|(_, o)| o.to_string())
}

fn detect_wan_naming(names: &[String]) -> Option<WanNames> {
    let has = |n: &str| names.iter().any(|x| x == n);
    if has("patch_embedding.weight") && names.iter().any(|n| n.contains(".attn1.to_q.")) {
        return Some(WanNames {
            naming: "diffusers",
            prefix: String::new(),
        });
    }
    for prefix in ["", "model.diffusion_model.", "diffusion_model."] {
        if has(&format!("{prefix}patch_embedding.weight"))
            && names
                .iter()
                .any(|n| n.starts_with(prefix) && n.contains(".self_attn.q."))
        {
            return Some(WanNames {
                naming: "wan",
                prefix: prefix.to_string(),
            });
        }
    }
    None
}

/// Number of distinct indices N in names of the form `{prefix}N.…`.
fn indexed_count(names: &[String], prefix: &str) -> usize {
    let ids: BTreeSet<usize> = names
        .iter()
        .filter_map(|n| n.strip_prefix(prefix)?.split('.').next()?.parse().ok())
        .collect();
    ids.len()
}

fn fingerprint_wan(src: &dyn ShapeSource, names: &[String]) -> Option<Fingerprint> {
    let n = detect_wan_naming(names)?;
    let mut notes = Vec::new();
    let pe = n.get(src, "patch_embedding.weight")?;
    let [d, c_in, pt, ph, pw] = pe[..] else {
        notes.push(format!(
            "patch_embedding.weight has shape {pe:?}, expected 5 dims"
        ));
        return Some(unknown_wan(&n, serde_json::Value::Null, notes));
    };
    let dim1 = |c: &str| n.get(src, c).and_then(|s| s.get(1).copied());
    let dim0 = |c: &str| n.get(src, c).and_then(|s| s.first().copied());
    let patch = pt * ph * pw;
    let cfg = WanConfig {
        patch_size: [pt, ph, pw],
        // Shapes fix D only; every released WAN has 128-wide heads. Other widths keep D
        // exact with a single head.
        num_attention_heads: if d.is_multiple_of(128) { d / 128 } else { 1 },
        attention_head_dim: if d.is_multiple_of(128) { 128 } else { d },
        in_channels: c_in,
        out_channels: dim0("proj_out.weight").map(|o| o / patch.max(1)),
        text_dim: dim1("condition_embedder.text_embedder.linear_1.weight").unwrap_or(0),
        freq_dim: dim1("condition_embedder.time_embedder.linear_1.weight").unwrap_or(0),
        ffn_dim: dim0("blocks.0.ffn.net.0.proj.weight").unwrap_or(0),
        num_layers: indexed_count(names, &format!("{}blocks.", n.prefix)),
        image_dim: dim1("condition_embedder.image_embedder.ff.net.0.proj.weight"),
        added_kv_proj_dim: dim1("blocks.0.attn2.add_k_proj.weight"),
        pos_embed_seq_len: n
            .get(src, "condition_embedder.image_embedder.pos_embed")
            .and_then(|s| s.get(1).copied()),
        ..WanConfig::default()
    };
    let derived = serde_json::json!({
        "inner_dim": d,
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
    let found = WanVariant::ALL
        .iter()
        .find(|v| same_wan_shapes(&v.config(), &cfg));
    match found {
        Some(v) => Some(Fingerprint {
            family: "wan".into(),
            variant: Some(v.id().into()),
            description: v.name().into(),
            naming: Some(n.naming.into()),
            derived,
            notes,
            wan: Some(cfg),
        }),
        None => {
            notes.push(closest_wan_difference(&cfg));
            let mut f = unknown_wan(&n, derived, notes);
            f.wan = Some(cfg);
            Some(f)
        }
    }
}

fn unknown_wan(n: &WanNames, derived: serde_json::Value, notes: Vec<String>) -> Fingerprint {
    Fingerprint {
        family: "wan".into(),
        variant: None,
        description: "WAN transformer of an unreleased shape".into(),
        naming: Some(n.naming.into()),
        derived,
        notes,
        wan: None,
    }
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

/// The fields shapes can reveal.
fn wan_fields(c: &WanConfig) -> [(&'static str, String); 10] {
    [
        ("inner_dim", c.inner_dim().to_string()),
        ("num_layers", c.num_layers.to_string()),
        ("ffn_dim", c.ffn_dim.to_string()),
        ("in_channels", c.in_channels.to_string()),
        ("out_channels", c.out_channels().to_string()),
        ("text_dim", c.text_dim.to_string()),
        ("freq_dim", c.freq_dim.to_string()),
        ("image_dim", format!("{:?}", c.image_dim)),
        ("added_kv_proj_dim", format!("{:?}", c.added_kv_proj_dim)),
        ("pos_embed_seq_len", format!("{:?}", c.pos_embed_seq_len)),
    ]
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

    struct Shapes(BTreeMap<String, Vec<usize>>);
    impl ShapeSource for Shapes {
        fn shape(&self, n: &str) -> Option<Vec<usize>> {
            self.0.get(n).cloned()
        }
        fn names(&self) -> Vec<String> {
            self.0.keys().cloned().collect()
        }
    }

    #[test]
    fn every_released_wan_config_is_recognised_from_its_parameter_table() {
        for v in WanVariant::ALL {
            let s = Shapes(
                v.config()
                    .diffusers_params()
                    .into_iter()
                    .map(|p| (p.name, p.shape))
                    .collect(),
            );
            let f = fingerprint(&s);
            assert_eq!(f.variant.as_deref(), Some(v.id()), "{:?}", f);
        }
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
