//! Which base model an adapter was made for, from its module names and tensor shapes.
//!
//! Owns: `guess` (every released WAN and SA3 variant whose parameter table has every module
//! the adapter names, with shapes its tensors fit; plus the dimensions the adapter's shapes
//! imply), `mismatch_line`, the one line that explains a failed binding ("the adapter's
//! shapes fit Wan2.1-T2V-1.3B; the base is Wan2.1-T2V-14B"), and `model_terms`, which
//! explains the entries that bind to nothing or do not fit in terms of the other WAN
//! variant they were made for: a part only some variants have (the image cross-attention
//! or image embedder of Wan 2.1 I2V/FLF2V, FLF2V's position embedding), or a patch
//! embedding whose input channels are another variant's (TI2V-5B's 48, I2V's 36). Both are
//! computed over the entries in question only, never over the whole adapter, so one
//! misfit module is not explained by the shapes of the modules that fit.
//!
//! What cannot be told: which expert of Wan 2.2 A14B an adapter was trained for. The two
//! experts (`transformer/` high-noise, `transformer_2/` low-noise) have the same names and
//! shapes, so an adapter for one binds to the other without a complaint, and no released
//! adapter format records the expert in its tensors or metadata. Only a file name can say
//! it (lightx2v's `…_high_noise_…`, kijai's `…_HIGH_…`): `expert_named_by` reads that, and
//! `merge`/`bake` warn when it names the other expert; nothing else is checked.
//!
//! Does not own: the parameter tables (`model::wan`, `model::sa3`) or base fingerprints
//! (`model::fingerprint`).

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
    guess_of(set, &all(set))
}

/// Every entry index of `set`.
fn all(set: &AdapterSet) -> Vec<usize> {
    (0..set.entries.len()).collect()
}

/// The variants the entries `which` of `set` fit, by names and shapes (names resolved with
/// the naming the whole adapter uses).
fn guess_of(set: &AdapterSet, which: &[usize]) -> VariantGuess {
    let ids = wan_ids(set);
    let wan: Vec<(&Entry, Vec<String>)> = which
        .iter()
        .filter_map(|&i| match &ids[i] {
            Some(ModuleId::Wan { diffusers, .. }) => {
                Some((&set.entries[i], vec![diffusers.clone()]))
            }
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
    let sa3: Vec<(&Entry, Vec<String>)> = which
        .iter()
        .map(|&i| &set.entries[i])
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
    mismatch_line_of(set, &all(set), base)
}

/// One line explaining why the entries `which` of `set` do not fit a base, from their
/// names and shapes alone.
pub fn mismatch_line_of(set: &AdapterSet, which: &[usize], base: &BaseIndex) -> String {
    let g = guess_of(set, which);
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
    let example = which
        .first()
        .map(|&i| set.entries[i].module.as_str())
        .unwrap_or("");
    let family = match g.family.as_str() {
        "unknown" => "not WAN or SA3 module names".to_string(),
        f => format!("{f} module names"),
    };
    format!("its module names (e.g. `{example}`) are {family}; the base is {base_desc}")
}

/// Entries explained in model terms (`model_terms`).
#[derive(Clone, Debug, PartialEq)]
pub struct ModelTerms {
    /// "this adapter targets the image cross-attention of a Wan 2.1 I2V/FLF2V model, which
    /// the base does not have; the base is …".
    pub line: String,
    /// The entries (indexes into `AdapterSet::entries`) the line accounts for.
    pub explained: Vec<usize>,
}

/// Says in model terms which other WAN variant the entries `which` of `set` (those that
/// bind to nothing, or do not fit) were made for, when their names or shapes say it:
/// modules of a part only some variants have that the base lacks
/// (`model::wan::VARIANT_ONLY_PARTS`), or a patch embedding whose input channels are those
/// of another variant (`model::wan::input_channels_model`). `None` when none of them does.
pub fn model_terms(set: &AdapterSet, which: &[usize], base: &BaseIndex) -> Option<ModelTerms> {
    use crate::model::wan::VariantOnlyPart;
    let mut parts: Vec<&VariantOnlyPart> = Vec::new();
    let mut explained = Vec::new();
    for &i in which {
        // Only parts the base lacks explain anything (a misspelt module of a part the base
        // has is an ordinary unmatched name).
        if let Some(p) = VariantOnlyPart::of(&set.entries[i].module)
            && !base
                .targets
                .iter()
                .any(|t| p.fragments.iter().any(|f| t.tensor.contains(f)))
        {
            explained.push(i);
            if !parts.iter().any(|q| std::ptr::eq(*q, p)) {
                parts.push(p);
            }
        }
    }
    let mut clauses = Vec::new();
    if let Some(first) = parts.first() {
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
        clauses.push(format!(
            "{} of {}, which the base does not have",
            named.join(" and "),
            first.models
        ));
    }
    if let Some((clause, entries)) = patch_embedding_of_another_variant(set, which, base) {
        clauses.push(clause);
        explained.extend(entries);
    }
    if clauses.is_empty() {
        return None;
    }
    explained.sort_unstable();
    explained.dedup();
    Some(ModelTerms {
        line: format!(
            "this adapter targets {}; the base is {}",
            clauses.join(", and "),
            base_description(base)
        ),
        explained,
    })
}

/// "the patch embedding of a Wan 2.2 TI2V-5B model (48 latent channels), while the base's
/// patch embedding takes 16", with the entries it accounts for: entries among `which` on the patch
/// embedding whose own shapes imply an input channel count that a released variant has and
/// the base's patch embedding does not.
fn patch_embedding_of_another_variant(
    set: &AdapterSet,
    which: &[usize],
    base: &BaseIndex,
) -> Option<(String, Vec<usize>)> {
    const PATCH_EMBEDDING: &str = "patch_embedding";
    let target = base
        .targets
        .iter()
        .find(|t| t.canonical == format!("{PATCH_EMBEDDING}.weight"))?;
    let base_in = *target.shape.get(1)?;
    // The kernel (the patch, 1×2×2 in every released model) the 2-D view flattens.
    let kernel: usize = target.shape.get(2..)?.iter().product();
    let ids = wan_ids(set);
    let mut found: Option<(usize, Vec<usize>)> = None;
    for &i in which {
        let on_patch = matches!(&ids[i], Some(ModuleId::Wan { diffusers, .. }) if diffusers == PATCH_EMBEDDING);
        let Some((_, cols)) = set.entries[i].implied_view().filter(|_| on_patch) else {
            continue;
        };
        if kernel == 0 || cols % kernel != 0 || cols / kernel == base_in {
            continue;
        }
        let channels = cols / kernel;
        if crate::model::wan::input_channels_model(channels).is_none() {
            continue;
        }
        match &mut found {
            Some((c, entries)) if *c == channels => entries.push(i),
            Some(_) => {}
            None => found = Some((channels, vec![i])),
        }
    }
    let (channels, entries) = found?;
    let model = crate::model::wan::input_channels_model(channels)?;
    Some((
        format!("the patch embedding of {model}, while the base's patch embedding takes {base_in}"),
        entries,
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

/// A Wan 2.2 A14B expert, by the noise levels it denoises.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expert {
    /// `transformer/` (`high_noise_model/` in the original release): the steps above the
    /// boundary.
    HighNoise,
    /// `transformer_2/` (`low_noise_model/`): the steps below it.
    LowNoise,
}

impl Expert {
    fn words(self) -> &'static str {
        match self {
            Expert::HighNoise => "high noise",
            Expert::LowNoise => "low noise",
        }
    }

    fn adjective(self) -> &'static str {
        match self {
            Expert::HighNoise => "high-noise",
            Expert::LowNoise => "low-noise",
        }
    }

    /// The expert a base component is: `transformer`/`transformer_2` as diffusers names
    /// them, or a folder whose name says it (`high_noise_model`).
    pub fn of_component(name: &str) -> Option<Expert> {
        match name {
            "transformer" => Some(Expert::HighNoise),
            "transformer_2" => Some(Expert::LowNoise),
            other => expert_in_name(other),
        }
    }
}

/// The expert a name says: the words "high noise" or "low noise" in any spelling
/// (`high_noise`, `High-Noise`, `highnoise`), or the upper-case tokens `HIGH` or `LOW`
/// (kijai's `…-lora_HIGH_fp16`). `None` when it says neither, or both.
fn expert_in_name(name: &str) -> Option<Expert> {
    let tokens: Vec<&str> = name
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|t| !t.is_empty())
        .collect();
    let lower: Vec<String> = tokens.iter().map(|t| t.to_ascii_lowercase()).collect();
    let says = |level: &str, upper: &str| {
        lower.windows(2).any(|w| w[0] == level && w[1] == "noise")
            || lower.iter().any(|t| *t == format!("{level}noise"))
            || tokens.contains(&upper)
    };
    match (says("high", "HIGH"), says("low", "LOW")) {
        (true, false) => Some(Expert::HighNoise),
        (false, true) => Some(Expert::LowNoise),
        _ => None,
    }
}

/// The expert an adapter's file name, or the name of the folder it is in (or is), says it
/// was trained for. The only evidence there is: the two experts have the same names and
/// shapes, so binding accepts an adapter on either.
pub fn expert_named_by(adapter: &std::path::Path) -> Option<Expert> {
    let own = if adapter.is_dir() {
        adapter.file_name()
    } else {
        adapter.file_stem()
    };
    let folder = adapter
        .parent()
        .filter(|_| !adapter.is_dir())
        .and_then(|p| p.file_name());
    [own, folder]
        .into_iter()
        .flatten()
        .find_map(|n| expert_in_name(&n.to_string_lossy()))
}

/// A warning when the adapter's name says one Wan 2.2 A14B expert and it is merged into
/// base component `component`, the other one.
pub fn expert_warning(adapter: &std::path::Path, component: &str) -> Option<String> {
    let named = expert_named_by(adapter)?;
    let into = Expert::of_component(component)?;
    (named != into).then(|| {
        format!(
            "{}: its name says {}, but it is merged into {component}, the {} expert (the two \
             experts have the same shapes, so the name is all that tells them apart)",
            adapter.display(),
            named.words(),
            into.adjective()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expert_names_in_released_adapter_file_names() {
        for (name, want) in [
            (
                "wan2.2_t2v_A14b_high_noise_lora_rank64_lightx2v_4step_1217",
                Some(Expert::HighNoise),
            ),
            (
                "wan2.2_t2v_A14b_low_noise_lora_rank64_lightx2v_4step_1217",
                Some(Expert::LowNoise),
            ),
            (
                "Wan2.2-Lightning_T2V-v1.1-A14B-4steps-lora_HIGH_fp16",
                Some(Expert::HighNoise),
            ),
            (
                "Wan2.2-Lightning_T2V-v1.1-A14B-4steps-lora_LOW_fp16",
                Some(Expert::LowNoise),
            ),
            ("high_noise_model", Some(Expert::HighNoise)),
            ("Wan22_LowNoise", Some(Expert::LowNoise)),
            // Not a noise level: lower-case "high"/"low" alone, and both at once.
            ("high_detail_lora", None),
            ("low_rank_style", None),
            ("high_noise_and_low_noise", None),
            ("wan2.1_t2v_14b_lora", None),
        ] {
            assert_eq!(expert_in_name(name), want, "{name}");
        }
        assert_eq!(Expert::of_component("transformer"), Some(Expert::HighNoise));
        assert_eq!(
            Expert::of_component("transformer_2"),
            Some(Expert::LowNoise)
        );
        assert_eq!(
            Expert::of_component("low_noise_model"),
            Some(Expert::LowNoise)
        );
        assert_eq!(Expert::of_component(""), None);
    }
}
