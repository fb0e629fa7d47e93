//! Which base model an adapter was made for, from its module names and tensor shapes.
//!
//! Owns: `guess` (every released WAN and SA3 variant whose parameter table has every module
//! the adapter names, with shapes its tensors fit; plus the dimensions the adapter's shapes
//! imply) and `mismatch_line`, the one line that explains a failed binding ("the adapter's
//! shapes fit Wan2.1-T2V-1.3B; the base is Wan2.1-T2V-14B"). Does not own: the parameter
//! tables (`model::wan`, `model::sa3`) or base fingerprints (`model::fingerprint`).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::bind::{BaseIndex, check_fit, wan_ids};
use super::names::{ModuleId, generic_path_of_spelling};
use super::{AdapterSet, Entry};
use crate::model::sa3::{Sa3Variant, sa3_params};
use crate::model::wan::WanVariant;

/// What an adapter appears to target.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct VariantGuess {
    /// `wan`, `sa3`, or `unknown` (by module names).
    pub family: String,
    /// Released variants that fit every entry: (id, name).
    pub fits: Vec<(String, String)>,
    /// Dimensions the shapes imply (`inner_dim 1536`, ...).
    pub implied: Vec<String>,
    /// Entries whose module names resolve in the family's name table.
    pub resolved: usize,
}

impl VariantGuess {
    /// "Wan2.1-T2V-1.3B or …", or `None`.
    pub fn fits_text(&self) -> Option<String> {
        (!self.fits.is_empty()).then(|| {
            self.fits
                .iter()
                .map(|(_, n)| n.as_str())
                .collect::<Vec<_>>()
                .join(" or ")
        })
    }
}

/// The parameter name an entry changes, given its module's canonical name.
fn param_name(module: &str, e: &Entry, table: &HashMap<String, Vec<usize>>) -> Option<String> {
    let cands: &[&str] = if e.targets_bias() {
        &[".bias"]
    } else {
        &[".weight", ""]
    };
    cands
        .iter()
        .map(|s| format!("{module}{s}"))
        .find(|n| table.contains_key(n))
}

/// Counts (fitting, not fitting) entries against one parameter table.
fn score(entries: &[(&Entry, Vec<String>)], table: &HashMap<String, Vec<usize>>) -> (usize, usize) {
    let (mut fit, mut miss) = (0, 0);
    for (e, modules) in entries {
        let hit = modules
            .iter()
            .find_map(|m| param_name(m, e, table))
            .and_then(|p| table.get(&p));
        match hit {
            Some(shape) if check_fit(e, shape).is_ok() => fit += 1,
            _ => miss += 1,
        }
    }
    (fit, miss)
}

/// The variants an adapter fits, by names and shapes.
pub fn guess(set: &AdapterSet) -> VariantGuess {
    let ids = wan_ids(set);
    let wan: Vec<(&Entry, Vec<String>)> = set
        .entries
        .iter()
        .zip(&ids)
        .filter_map(|(e, id)| match id {
            Some(ModuleId::Wan { diffusers, .. }) => Some((e, vec![diffusers.clone()])),
            _ => None,
        })
        .collect();
    if !wan.is_empty() {
        let mut g = VariantGuess {
            family: "wan".into(),
            resolved: wan.len(),
            implied: wan_implied(&wan),
            ..VariantGuess::default()
        };
        for v in WanVariant::ALL {
            let table: HashMap<String, Vec<usize>> = v
                .config()
                .diffusers_params()
                .into_iter()
                .map(|p| (p.name, p.shape))
                .collect();
            if score(&wan, &table).1 == 0 {
                g.fits.push((v.id().into(), v.name().into()));
            }
        }
        return g;
    }
    let sa3: Vec<(&Entry, Vec<String>)> = set
        .entries
        .iter()
        .filter_map(|e| {
            let p = generic_path_of_spelling(&e.module, set.convention)?;
            Some((
                e,
                vec![format!("model.model.{p}"), format!("conditioner.{p}")],
            ))
        })
        .collect();
    let mut g = VariantGuess {
        family: "unknown".into(),
        ..VariantGuess::default()
    };
    for v in Sa3Variant::ALL {
        let table: HashMap<String, Vec<usize>> = sa3_params(v)
            .into_iter()
            .map(|p| (p.name, p.shape))
            .collect();
        let (fit, miss) = score(&sa3, &table);
        let named = sa3
            .iter()
            .filter(|(e, ms)| ms.iter().any(|m| param_name(m, e, &table).is_some()))
            .count();
        if named > 0 {
            g.family = "sa3".into();
            g.resolved = g.resolved.max(named);
        }
        if fit > 0 && miss == 0 {
            g.fits.push((v.id().into(), v.name().into()));
        }
    }
    if g.family == "sa3" {
        g.implied = sa3_implied(&sa3);
    }
    g
}

/// inner_dim / ffn_dim / text_dim as the WAN entries' shapes imply them.
fn wan_implied(entries: &[(&Entry, Vec<String>)]) -> Vec<String> {
    let mut out = Vec::new();
    let mut push = |name: &str, v: Option<usize>| {
        if let Some(v) = v {
            let s = format!("{name} {v}");
            if !out.iter().any(|o: &String| o.starts_with(name)) {
                out.push(s);
            }
        }
    };
    for (e, ms) in entries {
        let local = ms[0]
            .split_once('.')
            .filter(|(b, _)| *b == "blocks")
            .and_then(|(_, rest)| rest.split_once('.').map(|(_, l)| l))
            .unwrap_or(&ms[0]);
        let view = e.implied_view();
        match local {
            "attn1.to_q" | "attn1.to_k" | "attn1.to_v" | "attn1.to_out.0" | "attn2.to_q"
            | "attn2.to_k" | "attn2.to_v" | "attn2.to_out.0" => {
                push("inner_dim", view.map(|v| v.0));
            }
            "ffn.net.0.proj" => push("ffn_dim", view.map(|v| v.0)),
            "ffn.net.2" => push("ffn_dim", view.map(|v| v.1)),
            "condition_embedder.text_embedder.linear_1" => push("text_dim", view.map(|v| v.1)),
            _ => {}
        }
    }
    out.sort();
    out
}

fn sa3_implied(entries: &[(&Entry, Vec<String>)]) -> Vec<String> {
    let mut out = Vec::new();
    for (e, ms) in entries {
        if ms[0].ends_with("self_attn.to_qkv")
            && let Some((rows, e_dim)) = e.implied_view()
        {
            out.push(format!("embed {e_dim}, to_qkv rows {rows}"));
            break;
        }
    }
    out
}

/// One line explaining why an adapter does not fit a base.
pub fn mismatch_line(set: &AdapterSet, base: &BaseIndex) -> String {
    let g = guess(set);
    let base_desc = base_description(base);
    if let Some(fits) = g.fits_text() {
        return format!("the adapter's names and shapes fit {fits}; the base is {base_desc}");
    }
    if !g.implied.is_empty() {
        return format!(
            "the adapter's shapes imply {} ({}), which matches no released model; the base is {base_desc}",
            g.implied.join(", "),
            g.family
        );
    }
    let example = set.entries.first().map(|e| e.module.as_str()).unwrap_or("");
    let family = match g.family.as_str() {
        "unknown" => "not WAN or SA3 module names".to_string(),
        f => format!("{f} module names"),
    };
    format!("its module names (e.g. `{example}`) are {family}; the base is {base_desc}")
}

/// Says in model terms which parts of another WAN variant the unbound modules belong to
/// ("this adapter targets the image cross-attention of a Wan 2.1 I2V/FLF2V model; the base
/// is …"), or `None` when none of them does (`model::wan::VARIANT_ONLY_PARTS`).
pub fn unbound_parts_line(modules: &[&str], base: &BaseIndex) -> Option<String> {
    use crate::model::wan::VariantOnlyPart;
    let mut parts: Vec<&VariantOnlyPart> = Vec::new();
    for m in modules {
        // Only parts the base lacks explain anything (a misspelt module of a part the base
        // has is an ordinary unmatched name).
        if let Some(p) = VariantOnlyPart::of(m)
            && !parts.iter().any(|q| std::ptr::eq(*q, p))
            && !base
                .targets
                .iter()
                .any(|t| p.fragments.iter().any(|f| t.tensor.contains(f)))
        {
            parts.push(p);
        }
    }
    let first = parts.first()?;
    let named: Vec<String> = parts
        .iter()
        .map(|p| {
            if p.models == first.models {
                p.part.to_string()
            } else {
                format!("{} of {}", p.part, p.models)
            }
        })
        .collect();
    Some(format!(
        "this adapter targets {} of {}, which the base does not have; the base is {}",
        named.join(" and "),
        first.models,
        base_description(base)
    ))
}

/// "Wan2.1-T2V-14B (diffusers naming)", or the family with its derived dims.
pub fn base_description(base: &BaseIndex) -> String {
    let Some(f) = &base.fingerprint else {
        return "unknown".into();
    };
    let naming = f
        .naming
        .as_deref()
        .map(|n| format!(", {n} naming"))
        .unwrap_or_default();
    let dims = ["inner_dim", "ffn_dim", "embed"]
        .iter()
        .filter_map(|k| {
            f.derived
                .get(*k)
                .and_then(|v| v.as_u64())
                .map(|v| format!("{k} {v}"))
        })
        .collect::<Vec<_>>()
        .join(", ");
    let dims = if dims.is_empty() {
        String::new()
    } else {
        format!(": {dims}")
    };
    format!("{}{naming}{dims}", f.description)
}
