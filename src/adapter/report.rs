//! What `inspect` says about an adapter, as data and as text.
//!
//! Owns: `AdapterInspection` (convention, entry kinds, ranks — per module when mixed —, σ and
//! where it came from, targets grouped by module type, the base variant the adapter was
//! made for, parser notes, keys no entry consumed) and `BaseBinding` (with `--base`: which
//! base tensor each entry binds to, shape problems, the one-line variant verdict, every
//! entry that binds to nothing), plus their text rendering. Does not own: the generic
//! checkpoint report (`inspect`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::bind::{BaseIndex, wan_ids};
use super::names::{ModuleId, generic_path_of_spelling};
use super::variant::{VariantGuess, base_description, guess, mismatch_line, model_terms};
use super::{AdapterError, AdapterOptions, AdapterSet, EntryProblem, KeyProblem, ScaleSource};
use crate::model::base_model::{BaseModel, ComponentModel};

/// One σ shared by several entries.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScaleGroup {
    /// σ.
    pub scale: f64,
    /// α as stored, if any.
    pub alpha: Option<f64>,
    /// Where σ came from.
    pub source: ScaleSource,
    /// Number of entries.
    pub entries: usize,
}

/// One LyCORIS module, as `inspect` lists it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LycorisLine {
    /// Adapter module.
    pub module: String,
    /// Kind (`loha`, `lokr`, `diag-oft`, `boft`, `glora`, `ia3`).
    pub kind: String,
    /// Rank, LoKr factors, OFT blocks and stages, (IA)³ side.
    pub structure: String,
    /// σ applied once to LoHa/LoKr/GLoRA (1 for the others).
    pub scale: f64,
    /// The rule that gave σ, and why (`LoKr, both factors full: scale 1, stored alpha 4
    /// ignored`; the OFT constraint).
    pub rule: String,
    /// The WAN base weight its name resolves to (diffusers name), when it is a WAN module.
    pub target: Option<String>,
}

/// One bound entry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BoundLine {
    /// Adapter module.
    pub module: String,
    /// Kind.
    pub kind: String,
    /// Base tensor.
    pub target: String,
    /// Layer of a stacked base tensor.
    pub layer: Option<usize>,
    /// Target shape (PyTorch layout).
    pub shape: Vec<usize>,
}

/// The adapter against one base component.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BaseBinding {
    /// The base path.
    pub base: String,
    /// Component name (`transformer_2`), empty for a plain model.
    pub component: String,
    /// What the base is.
    pub base_model: String,
    /// Naming of the adapter's module names.
    pub naming: Option<String>,
    /// Entries bound.
    pub bound: Vec<BoundLine>,
    /// Distinct base tensors changed.
    pub targets: usize,
    /// Entries that bind to nothing.
    pub unmatched: Vec<EntryProblem>,
    /// Why binding failed (shape mismatch, nothing bound).
    pub error: Option<String>,
    /// The variant verdict when the adapter was made for another base.
    pub verdict: Option<String>,
}

/// Everything `inspect` reports about an adapter.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AdapterInspection {
    /// Convention.
    pub convention: String,
    /// Number of entries.
    pub entries: usize,
    /// Entries per kind.
    pub kinds: BTreeMap<String, usize>,
    /// Entries per rank.
    pub ranks: BTreeMap<usize, usize>,
    /// Rank per module, when ranks are mixed.
    pub rank_by_module: Option<BTreeMap<String, usize>>,
    /// Distinct σ.
    pub scales: Vec<ScaleGroup>,
    /// Entries per module type (block index replaced by `*`).
    pub targets: BTreeMap<String, usize>,
    /// Which released base the adapter fits.
    pub made_for: VariantGuess,
    /// Parser notes.
    pub notes: Vec<String>,
    /// Keys no entry consumed.
    pub unparsed: Vec<KeyProblem>,
    /// Every LyCORIS module (empty for LoRA-family adapters).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lycoris: Vec<LycorisLine>,
    /// Against each base component, with `--base`.
    pub bindings: Vec<BaseBinding>,
}

impl AdapterInspection {
    /// Problems that make `inspect` exit non-zero, each a full message naming `path`.
    pub fn problems(&self, path: &Path) -> Vec<String> {
        let p = path.display();
        let mut v: Vec<String> = self
            .unparsed
            .iter()
            .map(|k| format!("{p}: key `{}` is not used: {}", k.key, k.reason))
            .collect();
        for b in &self.bindings {
            if let Some(e) = &b.error {
                v.push(e.clone());
            }
            if let (Some(why), false) = (&b.verdict, b.unmatched.is_empty()) {
                v.push(format!("{p}: {why}"));
            }
            for u in &b.unmatched {
                v.push(format!(
                    "{p}: `{}` ({}) binds to nothing in {}: {}",
                    u.module, u.kind, b.base, u.reason
                ));
            }
        }
        v
    }
}

/// The module type of a module name: the block/layer index replaced by `*`.
pub fn module_type(m: &str) -> String {
    let parts: Vec<&str> = m.split('.').collect();
    let mut out = Vec::with_capacity(parts.len());
    for (i, p) in parts.iter().enumerate() {
        let after_container = i > 0 && matches!(parts[i - 1], "blocks" | "layers");
        if after_container && p.parse::<usize>().is_ok() {
            out.push("*".to_string());
        } else {
            out.push(p.to_string());
        }
    }
    let s = out.join(".");
    // kohya spelling: blocks_N_
    static KOHYA_BLOCK: std::sync::OnceLock<Option<regex::Regex>> = std::sync::OnceLock::new();
    match KOHYA_BLOCK.get_or_init(|| regex::Regex::new(r"blocks_\d+_").ok()) {
        Some(r) => r.replace_all(&s, "blocks_*_").into_owned(),
        None => s,
    }
}

fn scale_groups(set: &AdapterSet) -> Vec<ScaleGroup> {
    let mut groups: Vec<ScaleGroup> = Vec::new();
    for e in &set.entries {
        match groups.iter_mut().find(|g| {
            g.scale.to_bits() == e.scale.to_bits()
                && g.source == e.scale_source
                && g.alpha == e.alpha
        }) {
            Some(g) => g.entries += 1,
            None => groups.push(ScaleGroup {
                scale: e.scale,
                alpha: e.alpha,
                source: e.scale_source.clone(),
                entries: 1,
            }),
        }
    }
    groups.sort_by(|a, b| a.scale.total_cmp(&b.scale));
    groups
}

/// Describes an opened adapter (without a base).
pub fn describe(set: &AdapterSet) -> AdapterInspection {
    let ids = wan_ids(set);
    let mut kinds = BTreeMap::new();
    let mut ranks = BTreeMap::new();
    let mut rank_by_module = BTreeMap::new();
    let mut targets = BTreeMap::new();
    let mut lycoris = Vec::new();
    for (e, id) in set.entries.iter().zip(&ids) {
        *kinds.entry(e.kind.as_str().to_string()).or_insert(0) += 1;
        if e.kind.is_lycoris() {
            lycoris.push(LycorisLine {
                module: e.module.clone(),
                kind: e.kind.as_str().into(),
                structure: super::lycoris::structure(e),
                scale: e.scale,
                rule: scale_source_text(&e.scale_source),
                target: id.as_ref().map(|i| format!("{}.weight", i.display())),
            });
        }
        if let Some(r) = e.rank {
            *ranks.entry(r).or_insert(0) += 1;
            rank_by_module.insert(e.module.clone(), r);
        }
        let name = match id {
            Some(ModuleId::Wan { diffusers, .. }) => diffusers.clone(),
            _ => generic_path_of_spelling(&e.module, set.convention)
                .unwrap_or_else(|| e.module.clone()),
        };
        *targets.entry(module_type(&name)).or_insert(0) += 1;
    }
    AdapterInspection {
        convention: set.convention.as_str().into(),
        entries: set.entries.len(),
        kinds,
        rank_by_module: (ranks.len() > 1).then_some(rank_by_module),
        ranks,
        scales: scale_groups(set),
        targets,
        made_for: guess(set),
        notes: set.notes.clone(),
        unparsed: set.unparsed.clone(),
        lycoris,
        bindings: Vec::new(),
    }
}

/// Binds a fresh copy of the adapter against one base component and describes the result.
fn bind_one(
    path: &Path,
    opts: &AdapterOptions,
    base: &Path,
    comp: &crate::io::Component,
    model: &ComponentModel,
) -> Result<BaseBinding, AdapterError> {
    let mut set = AdapterSet::open(path, opts)?;
    let ix = BaseIndex::new(base, &comp.tensors, model);
    let mut b = BaseBinding {
        base: base.display().to_string(),
        component: comp.name.clone(),
        base_model: base_description(&ix),
        naming: None,
        bound: Vec::new(),
        targets: 0,
        unmatched: Vec::new(),
        error: None,
        verdict: None,
    };
    let g = guess(&set);
    let base_variant = ix.fingerprint.as_ref().and_then(|f| f.variant.clone());
    if !g.fits.is_empty()
        && !g
            .fits
            .iter()
            .any(|(id, _)| Some(id) == base_variant.as_ref())
    {
        b.verdict = Some(mismatch_line(&set, &ix));
    }
    match set.bind(&ix, opts.allow_unmatched) {
        Ok(r) => {
            // Entries left unbound (inspect binds as if with --allow-unmatched) are explained
            // in model terms, as merge's refusal would explain them, when they can be.
            if b.verdict.is_none() && !r.unmatched.is_empty() {
                let unbound: Vec<usize> = (0..set.entries.len())
                    .filter(|&i| set.entries[i].binding.is_none())
                    .collect();
                b.verdict = model_terms(&set, &unbound, &ix).map(|t| t.line);
            }
            b.naming = Some(r.naming.as_str().to_string());
            b.targets = r.targets;
            b.unmatched = r.unmatched;
            b.bound = r
                .bound
                .into_iter()
                .map(|x| BoundLine {
                    module: x.module,
                    kind: x.kind.as_str().into(),
                    target: x.target,
                    layer: x.layer,
                    shape: x.shape,
                })
                .collect();
        }
        Err(e) => {
            // An error that explains its entries in model terms says all there is; a guess
            // over the whole adapter would describe the modules that fit as well.
            if b.verdict.is_none() && e.model_terms().is_none() {
                b.verdict = Some(mismatch_line(&set, &ix));
            }
            b.error = Some(crate::error_text::chain(&e));
        }
    }
    Ok(b)
}

/// Opens and describes the adapter at `path` (unconsumed keys reported, not fatal), and,
/// with a base, binds it against every component of the base.
pub fn describe_path(
    path: &Path,
    base: Option<(&Path, &BaseModel)>,
) -> Result<AdapterInspection, AdapterError> {
    let opts = AdapterOptions {
        allow_unmatched: true,
        ..AdapterOptions::default()
    };
    let set = AdapterSet::open(path, &opts)?;
    let mut report = describe(&set);
    if let Some((base_path, ckpt)) = base {
        for (comp, model) in ckpt.parts() {
            report
                .bindings
                .push(bind_one(path, &opts, base_path, comp, model)?);
        }
    }
    Ok(report)
}

fn fmt_f(x: f64) -> String {
    format!("{x}")
}

fn scale_source_text(s: &ScaleSource) -> String {
    match s {
        ScaleSource::FileAlpha => "file .alpha, σ = α/r".into(),
        ScaleSource::DefaultAlphaIsRank => "no alpha, α = r".into(),
        ScaleSource::PeftConfig { rslora } => {
            format!(
                "adapter_config.json, σ = α/{}",
                if *rslora { "√r" } else { "r" }
            )
        }
        ScaleSource::PeftPattern { pattern, rslora } => format!(
            "adapter_config.json pattern {pattern:?}, σ = α/{}",
            if *rslora { "√r" } else { "r" }
        ),
        ScaleSource::DiffusersMetadata => "lora_adapter_metadata".into(),
        ScaleSource::Folded => "α folded into the factors".into(),
        ScaleSource::Sa3Metadata => "lora_config, σ = alpha/rank".into(),
        ScaleSource::NnxMetadata => "lora_alpha/lora_rank metadata".into(),
        ScaleSource::User => "given with --scale".into(),
        ScaleSource::Unscaled => "unscaled full delta".into(),
        ScaleSource::Lycoris { rule } => format!("LyCORIS rule: {rule}"),
    }
}

fn join_counts(m: &BTreeMap<String, usize>) -> String {
    m.iter()
        .map(|(k, n)| format!("{k} ×{n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Text for people.
pub fn render_text(r: &AdapterInspection) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "    adapter:    {} convention, {} entries ({})",
        r.convention,
        r.entries,
        join_counts(&r.kinds)
    );
    let ranks: Vec<String> = r.ranks.iter().map(|(k, n)| format!("{k} (×{n})")).collect();
    let _ = writeln!(
        s,
        "    ranks:      {}",
        if ranks.is_empty() {
            "—".into()
        } else {
            ranks.join(", ")
        }
    );
    if let Some(by) = &r.rank_by_module {
        let common = r.ranks.iter().max_by_key(|(_, n)| **n).map(|(k, _)| *k);
        for (m, k) in by.iter().filter(|(_, k)| Some(**k) != common) {
            let _ = writeln!(s, "                rank {k}: {m}");
        }
    }
    for g in &r.scales {
        let alpha = g
            .alpha
            .map(|a| format!(", α {}", fmt_f(a)))
            .unwrap_or_default();
        let _ = writeln!(
            s,
            "    scale:      σ {}{alpha} ({}) ×{}",
            fmt_f(g.scale),
            scale_source_text(&g.source),
            g.entries
        );
    }
    let _ = writeln!(s, "    targets:    {}", join_counts(&r.targets));
    let made_for = match (r.made_for.fits_text(), r.made_for.implied.is_empty()) {
        (Some(f), _) => f,
        (None, false) => format!(
            "no released model ({} shapes imply {})",
            r.made_for.family,
            r.made_for.implied.join(", ")
        ),
        (None, true) => format!("unknown ({} module names)", r.made_for.family),
    };
    let _ = writeln!(s, "    made for:   {made_for}");
    for l in &r.lycoris {
        let target = l.target.as_deref().unwrap_or("no WAN module of that name");
        let _ = writeln!(
            s,
            "    lycoris:    {} ({}, {}): σ {} ({}) → {target}",
            l.module,
            l.kind,
            l.structure,
            fmt_f(l.scale),
            l.rule
        );
    }
    for n in &r.notes {
        let _ = writeln!(s, "    note:       {n}");
    }
    for k in &r.unparsed {
        let _ = writeln!(s, "    unused key: {}: {}", k.key, k.reason);
    }
    for b in &r.bindings {
        let comp = if b.component.is_empty() {
            String::new()
        } else {
            format!(" [{}]", b.component)
        };
        let _ = writeln!(s, "    against:    {}{comp} ({})", b.base, b.base_model);
        if let Some(v) = &b.verdict {
            let _ = writeln!(s, "    verdict:    {v}");
        }
        if let Some(e) = &b.error {
            let _ = writeln!(
                s,
                "    error:      {}",
                e.replace('\n', "\n                ")
            );
            continue;
        }
        let _ = writeln!(
            s,
            "    bound:      {} entries → {} base tensors ({} names)",
            b.bound.len(),
            b.targets,
            b.naming.as_deref().unwrap_or("?")
        );
        for x in &b.bound {
            let layer = x.layer.map(|l| format!(" [layer {l}]")).unwrap_or_default();
            let _ = writeln!(
                s,
                "                {} ({}) → {}{layer} {:?}",
                x.module, x.kind, x.target, x.shape
            );
        }
        for u in &b.unmatched {
            let _ = writeln!(s, "    unbound:    {} ({}): {}", u.module, u.kind, u.reason);
        }
    }
    s
}

/// Text for a report stored as JSON (the `adapter` field of `inspect`'s component report).
pub fn render_value(v: &serde_json::Value) -> Option<String> {
    serde_json::from_value::<AdapterInspection>(v.clone())
        .ok()
        .map(|r| render_text(&r))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_types() {
        assert_eq!(
            module_type("blocks.12.attn1.to_out.0"),
            "blocks.*.attn1.to_out.0"
        );
        assert_eq!(
            module_type("model.transformer.layers.3.ff.ff.0.proj"),
            "model.transformer.layers.*.ff.ff.0.proj"
        );
        assert_eq!(
            module_type("lora_unet_blocks_7_ffn_0"),
            "lora_unet_blocks_*_ffn_0"
        );
        assert_eq!(
            module_type("diffusion_model.blocks.2.ffn.0"),
            "diffusion_model.blocks.*.ffn.0"
        );
    }
}
