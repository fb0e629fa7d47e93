//! What `wanbake inspect` reports about a checkpoint or adapter, as data.
//!
//! Owns: `InspectReport` (files, tensor counts, dtype histogram, parameter count, bytes,
//! metadata, model fingerprint, ignored files) built from a `Checkpoint`; a component is an
//! adapter when `adapter::detect::is_adapter` says so (the suffixes the parsers read).
//! Adapter-specific details (convention, kinds, ranks, scales, binding against a base) are
//! added by the `adapter` module through `InspectReport::adapter`. Also owns the key listing
//! of `inspect --keys` (`KeyRow`, `keys`, `render_keys`) and its `*`/`?` glob. Printing is the
//! CLI's job.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::human::{grouped, plural, size};
use crate::io::checkpoint::{Checkpoint, Component, SourceKind};
use crate::io::{DType, ReadError, digest};
use crate::model::fingerprint::{Fingerprint, fingerprint};
use crate::model::wan::WanVariant;

/// Counts per dtype.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DtypeStats {
    /// Number of tensors.
    pub tensors: usize,
    /// Number of elements.
    pub parameters: u64,
    /// Bytes of data.
    pub bytes: u64,
}

/// One file of a component.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FileReport {
    /// Path.
    pub path: String,
    /// Size.
    pub bytes: u64,
    /// Tensors in it.
    pub tensors: usize,
    /// sha256, with `--hash`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

/// One state dict of the checkpoint.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ComponentReport {
    /// `""` for a plain model, `transformer` / `transformer_2` in a pipeline.
    pub name: String,
    /// `model` or `adapter` (from the tensor names).
    pub role: String,
    /// Weight files.
    pub files: Vec<FileReport>,
    /// Shard index, when sharded.
    pub index: Option<String>,
    /// Number of tensors.
    pub tensor_count: usize,
    /// Number of elements over all tensors.
    pub parameter_count: u64,
    /// Bytes of tensor data.
    pub data_bytes: u64,
    /// Histogram by dtype.
    pub dtypes: BTreeMap<DType, DtypeStats>,
    /// `__metadata__` of the (first) file.
    pub metadata: BTreeMap<String, String>,
    /// What model this is (for models).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<Fingerprint>,
    /// Sidecar files read (config.json, adapter_config.json).
    pub sidecars: Vec<String>,
    /// Adapter details, filled by the adapter module.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub adapter: Option<serde_json::Value>,
    /// ComfyUI scaled-fp8 details (`quant::inspect`), when the file carries its marker (`quant::convention`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quantization: Option<serde_json::Value>,
}

/// The whole report for one path.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct InspectReport {
    /// The path inspected.
    pub path: String,
    /// What it is.
    pub kind: SourceKind,
    /// Its state dicts.
    pub components: Vec<ComponentReport>,
    /// Whole-checkpoint verdict for pipelines (e.g. Wan2.2-T2V-A14B).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pipeline: Option<String>,
    /// Present but not read.
    pub ignored: Vec<String>,
    /// For an Orbax checkpoint: the step and items read, and its files.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub orbax: Option<OrbaxReport>,
}

/// What an Orbax input was.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OrbaxReport {
    /// `root` (a CheckpointManager root: its latest step), `step` or `item`.
    pub level: String,
    /// The step read.
    pub step: Option<u64>,
    /// Items read: (item name, component, folder).
    pub items: Vec<OrbaxItemReport>,
    /// Every file of the input (the tensors above are decoded from them).
    pub files: Vec<FileReport>,
}

/// One item of an Orbax input.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OrbaxItemReport {
    /// Item name.
    pub item: String,
    /// The component it is read as (`""` for a single transformer).
    pub component: String,
    /// Its folder.
    pub dir: String,
    /// Leaves not read.
    pub left_out: Vec<String>,
}

/// `adapter` when the adapter module would find something to read (`adapter::detect`).
fn looks_like_adapter(c: &Component) -> bool {
    crate::adapter::detect::is_adapter(
        c.tensors.names(),
        c.sidecar("adapter_config.json").is_some(),
    )
}

/// Builds the report; with `hash`, every weight file is hashed (in parallel).
pub fn inspect(ckpt: &Checkpoint, hash: bool) -> Result<InspectReport, ReadError> {
    let mut components = Vec::new();
    for c in &ckpt.components {
        let mut r = component_report(c, hash && ckpt.orbax.is_none())?;
        if ckpt.orbax.is_some() {
            // Decoded copies, not files of the input (those are listed under `orbax`).
            r.files.clear();
        }
        components.push(r);
    }
    let pipeline = pipeline_verdict(ckpt, &components);
    Ok(InspectReport {
        path: ckpt.path.display().to_string(),
        kind: ckpt.kind,
        components,
        pipeline,
        ignored: ckpt
            .ignored
            .iter()
            .map(|p| p.display().to_string())
            .collect(),
        orbax: ckpt
            .orbax
            .as_ref()
            .map(|o| orbax_report(o, hash))
            .transpose()?,
    })
}

fn component_report(c: &Component, hash: bool) -> Result<ComponentReport, ReadError> {
    use rayon::prelude::*;
    let files: Vec<FileReport> = c
        .tensors
        .files()
        .par_iter()
        .map(|f| {
            let sha256 = if hash {
                Some(digest::sha256_file(f.path())?.1)
            } else {
                None
            };
            Ok(FileReport {
                path: f.path().display().to_string(),
                bytes: f.len() as u64,
                tensors: f.infos().len(),
                sha256,
            })
        })
        .collect::<Result<_, ReadError>>()?;
    let mut dtypes: BTreeMap<DType, DtypeStats> = BTreeMap::new();
    for t in c.tensors.tensors() {
        let s = dtypes.entry(t.view.dtype).or_default();
        s.tensors += 1;
        s.parameters += t.view.numel() as u64;
        s.bytes += t.view.bytes.len() as u64;
    }
    let role = if looks_like_adapter(c) {
        "adapter"
    } else {
        "model"
    };
    let fp8 = match role {
        "model" => crate::quant::inspect::quantization_summary(&c.tensors),
        _ => None,
    };
    let mut fp = (role == "model").then(|| match &fp8 {
        Some((_, f)) => f.clone(),
        None => fingerprint(&c.tensors),
    });
    let parameter_count = dtypes.values().map(|s| s.parameters).sum();
    if let Some(f) = fp.as_mut() {
        check_param_total(f, parameter_count);
        check_config(f, c);
    }
    Ok(ComponentReport {
        name: c.name.clone(),
        role: role.into(),
        files,
        index: c.tensors.index_path().map(|p| p.display().to_string()),
        tensor_count: c.tensors.len(),
        parameter_count,
        data_bytes: dtypes.values().map(|s| s.bytes).sum(),
        dtypes,
        metadata: c.tensors.metadata(),
        fingerprint: fp,
        sidecars: c.sidecars.iter().map(|s| s.name.clone()).collect(),
        adapter: None,
        quantization: fp8.map(|(q, _)| q),
    })
}

/// A recognised WAN variant must also have the spec's parameter total.
fn check_param_total(f: &mut Fingerprint, count: u64) {
    let Some(id) = &f.variant else { return };
    let Some(v) = WanVariant::ALL.iter().find(|v| v.id() == id) else {
        return;
    };
    let expected = v.expected_params();
    if count != expected {
        f.notes.push(format!(
            "shapes match {} but the checkpoint has {count} parameters, expected {expected} \
             (tensors missing or extra; norm_added_q is one known extra)",
            v.name()
        ));
    }
}

/// Compares a diffusers config.json, or an original `WanModel` one (its keys only), with what
/// the weights imply.
fn check_config(f: &mut Fingerprint, c: &Component) {
    let (Some(shapes), Some(side)) = (&f.wan, c.sidecar("config.json")) else {
        return;
    };
    let class = side.json.get("_class_name").and_then(|c| c.as_str());
    if class == Some(crate::model::wan_layout::ORIGINAL_CLASS) {
        let said = original_config_as_said(&side.json, shapes);
        let notes = crate::model::fingerprint::config_disagreements(&said, shapes);
        f.notes.extend(notes);
        return;
    }
    match crate::model::wan::WanConfig::from_json(&side.text) {
        Ok(cfg) => f
            .notes
            .extend(crate::model::fingerprint::config_disagreements(
                &cfg, shapes,
            )),
        Err(e) => f
            .notes
            .push(format!("{}: not a WAN config: {e}", side.path.display())),
    }
}

/// The weights' config with what an original `WanModel` config.json says put in (`dim`,
/// `num_layers`, `ffn_dim`, `in_dim`, `out_dim`, `freq_dim`; it has no other size).
fn original_config_as_said(
    json: &serde_json::Value,
    shapes: &crate::model::wan::WanConfig,
) -> crate::model::wan::WanConfig {
    let get = |k: &str| json.get(k).and_then(|v| v.as_u64()).map(|v| v as usize);
    let mut c = shapes.clone();
    if let Some(dim) = get("dim") {
        // The head count is not a size the weights reveal: keep theirs, scale the head dim.
        c.attention_head_dim = dim / c.num_attention_heads.max(1);
        if c.inner_dim() != dim {
            c.num_attention_heads = 1;
            c.attention_head_dim = dim;
        }
    }
    let fields: [(&str, &mut usize); 4] = [
        ("num_layers", &mut c.num_layers),
        ("ffn_dim", &mut c.ffn_dim),
        ("in_dim", &mut c.in_channels),
        ("freq_dim", &mut c.freq_dim),
    ];
    for (k, slot) in fields {
        if let Some(v) = get(k) {
            *slot = v;
        }
    }
    if let Some(out) = get("out_dim") {
        c.out_channels = Some(out);
    }
    c
}

fn pipeline_verdict(ckpt: &Checkpoint, comps: &[ComponentReport]) -> Option<String> {
    if !ckpt.is_pipeline() {
        return None;
    }
    let ids: Vec<Option<&str>> = comps
        .iter()
        .map(|c| c.fingerprint.as_ref().and_then(|f| f.variant.as_deref()))
        .collect();
    let two = comps.len() == 2;
    Some(match ids.as_slice() {
        [Some("wan2.1-t2v-14b"), Some("wan2.1-t2v-14b")] if two => {
            "Wan2.2-T2V-A14B (high-noise + low-noise experts)".into()
        }
        [Some("wan2.2-i2v-a14b"), Some("wan2.2-i2v-a14b")] if two => {
            "Wan2.2-I2V-A14B (high-noise + low-noise experts)".into()
        }
        _ => format!(
            "pipeline with {}",
            plural(
                comps.len(),
                "transformer component",
                "transformer components"
            )
        ),
    })
}

/// Human-readable rendering of a report.
pub fn render_text(r: &InspectReport) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(s, "{} ({})", r.path, r.kind.describe());
    if let Some(o) = &r.orbax {
        render_orbax(&mut s, o);
    }
    if let Some(p) = &r.pipeline {
        let _ = writeln!(s, "  pipeline: {p}");
    }
    for c in &r.components {
        let title = if c.name.is_empty() {
            c.role.clone()
        } else {
            format!("{} ({})", c.name, c.role)
        };
        let _ = writeln!(s, "  {title}");
        if let Some(f) = &c.fingerprint {
            let naming = f
                .naming
                .as_deref()
                .map(|n| format!(", {n} naming"))
                .unwrap_or_default();
            let _ = writeln!(s, "    model:      {}{naming}", f.description);
            for n in &f.notes {
                let _ = writeln!(s, "                {n}");
            }
        }
        let _ = writeln!(
            s,
            "    tensors:    {} ({} parameters, {})",
            grouped(c.tensor_count as u64),
            grouped(c.parameter_count),
            size(c.data_bytes)
        );
        let hist: Vec<String> = c
            .dtypes
            .iter()
            .map(|(d, st)| {
                format!(
                    "{d}: {} / {} params",
                    plural(st.tensors, "tensor", "tensors"),
                    grouped(st.parameters)
                )
            })
            .collect();
        let _ = writeln!(s, "    dtypes:     {}", hist.join(", "));
        if let Some(q) = &c.quantization {
            let what = match q["fp8_layers"].as_u64() {
                Some(n) => plural(n as usize, "fp8 layer", "fp8 layers"),
                None => plural(
                    q["side_tensors"].as_u64().unwrap_or(0) as usize,
                    "side tensor",
                    "side tensors",
                ),
            };
            let _ = writeln!(
                s,
                "    quantized:  {}, {what}, {}",
                q["format"].as_str().unwrap_or("?"),
                plural(
                    q["problems"].as_array().map_or(0, |a| a.len()),
                    "problem",
                    "problems"
                )
            );
            for l in q["layers"].as_array().into_iter().flatten() {
                let _ = writeln!(s, "                {}", l.as_str().unwrap_or(""));
            }
            for p in q["problems"].as_array().into_iter().flatten() {
                let _ = writeln!(s, "                {}", p.as_str().unwrap_or(""));
            }
        }
        for f in &c.files {
            let sha = f
                .sha256
                .as_deref()
                .map(|h| format!("  sha256 {h}"))
                .unwrap_or_default();
            let _ = writeln!(
                s,
                "    file:       {} ({}, {}){sha}",
                f.path,
                size(f.bytes),
                plural(f.tensors, "tensor", "tensors")
            );
        }
        if let Some(i) = &c.index {
            let _ = writeln!(s, "    index:      {i}");
        }
        for (k, v) in &c.metadata {
            let shown: String = if v.chars().count() > 100 {
                format!("{}…", v.chars().take(100).collect::<String>())
            } else {
                v.clone()
            };
            let _ = writeln!(s, "    metadata:   {k} = {shown}");
        }
        if let Some(a) = &c.adapter {
            match crate::adapter::report::render_value(a) {
                Some(text) => s.push_str(&text),
                None => {
                    let _ = writeln!(
                        s,
                        "    adapter:    {}",
                        serde_json::to_string(a).unwrap_or_default()
                    );
                }
            }
        }
    }
    for i in &r.ignored {
        let _ = writeln!(s, "  ignored:    {i}");
    }
    s
}

fn orbax_report(o: &crate::io::orbax::OrbaxInput, hash: bool) -> Result<OrbaxReport, ReadError> {
    use crate::format::orbax::Level;
    use rayon::prelude::*;
    let files = o
        .files
        .par_iter()
        .map(|p| {
            let bytes = std::fs::metadata(p).map_err(|e| ReadError::io(p, e))?.len();
            let sha256 = match hash {
                true => Some(digest::sha256_file(p)?.1),
                false => None,
            };
            Ok(FileReport {
                path: p.display().to_string(),
                bytes,
                tensors: 0,
                sha256,
            })
        })
        .collect::<Result<_, ReadError>>()?;
    Ok(OrbaxReport {
        level: match o.level {
            Level::Root => "root",
            Level::Step => "step",
            Level::Item => "item",
        }
        .into(),
        step: o.step,
        items: o
            .items
            .iter()
            .map(|i| OrbaxItemReport {
                item: i.name.clone(),
                component: i.component.clone(),
                dir: i.dir.display().to_string(),
                left_out: i.left_out.clone(),
            })
            .collect(),
        files,
    })
}

fn render_orbax(s: &mut String, o: &OrbaxReport) {
    use std::fmt::Write;
    let what = match (o.level.as_str(), o.step) {
        ("root", Some(n)) => format!("CheckpointManager root, latest step {n}"),
        ("step", Some(n)) => format!("step {n}"),
        ("step", None) => "step folder".into(),
        _ => "item folder".into(),
    };
    let _ = writeln!(s, "  orbax:      {what}");
    for i in &o.items {
        let to = match i.component.is_empty() {
            true => String::new(),
            false => format!(" -> {}", i.component),
        };
        let _ = writeln!(s, "    item:     {}{to} ({})", i.item, i.dir);
        if !i.left_out.is_empty() {
            let _ = writeln!(s, "              left out: {}", i.left_out.join(", "));
        }
    }
    let bytes: u64 = o.files.iter().map(|f| f.bytes).sum();
    let _ = writeln!(
        s,
        "    files:    {} ({})",
        grouped(o.files.len() as u64),
        size(bytes)
    );
    for f in o.files.iter().filter(|f| f.sha256.is_some()) {
        let _ = writeln!(
            s,
            "    file:     {}  sha256 {}",
            f.path,
            f.sha256.as_deref().unwrap_or("")
        );
    }
}

/// One tensor as `inspect --keys` lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct KeyRow {
    /// The pipeline component holding it (`transformer`, ...); empty for a single model.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub component: String,
    /// The tensor's name as stored.
    pub name: String,
    /// Its element type (`F32`, `BF16`, ...; a ggml type name such as `Q4_K` in a GGUF).
    pub dtype: String,
    /// Its shape, in PyTorch order (a GGUF's `ne` reversed).
    pub shape: Vec<usize>,
}

/// The tensors of `ckpt` whose name matches `glob` (see [`glob_matches`]), by component,
/// then name.
pub fn keys(ckpt: &Checkpoint, glob: &str) -> Vec<KeyRow> {
    ckpt.components
        .iter()
        .flat_map(|c| {
            c.tensors
                .names()
                .filter(|name| glob_matches(glob, name))
                .filter_map(|name| {
                    let t = c.tensors.get(name)?;
                    Some(KeyRow {
                        component: c.name.clone(),
                        name: name.to_string(),
                        dtype: t.view.dtype.to_string(),
                        shape: t.view.shape.to_vec(),
                    })
                })
        })
        .collect()
}

/// Does `name` match `pattern`, where `*` stands for any run of characters (none included)
/// and `?` for exactly one, and every other character for itself?
pub fn glob_matches(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    // The classic two-pointer match: on a mismatch, let the last `*` swallow one more char.
    let (mut i, mut j) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while j < n.len() {
        match p.get(i) {
            Some('*') => {
                star = Some((i, j));
                i += 1;
            }
            Some(&c) if c == '?' || c == n[j] => {
                i += 1;
                j += 1;
            }
            _ => match star {
                Some((si, sj)) => {
                    star = Some((si, sj + 1));
                    i = si + 1;
                    j = sj + 1;
                }
                None => return false,
            },
        }
    }
    p[i.min(p.len())..].iter().all(|&c| c == '*')
}

/// One line per tensor, `NAME  DTYPE  [SHAPE]` in aligned columns; a pipeline's names are
/// spelled `component/name`.
pub fn render_keys(rows: &[KeyRow]) -> String {
    use std::fmt::Write;
    let full = |r: &KeyRow| match r.component.is_empty() {
        true => r.name.clone(),
        false => format!("{}/{}", r.component, r.name),
    };
    let width = rows
        .iter()
        .map(|r| full(r).chars().count())
        .max()
        .unwrap_or(0);
    let dwidth = rows.iter().map(|r| r.dtype.len()).max().unwrap_or(0);
    let mut s = String::new();
    for r in rows {
        let shape: Vec<String> = r.shape.iter().map(usize::to_string).collect();
        let _ = writeln!(
            s,
            "{:width$}  {:dwidth$}  [{}]",
            full(r),
            r.dtype,
            shape.join(", ")
        );
    }
    s
}

/// The tensors of one GGUF file whose name matches `glob`, in file order, as
/// `inspect --keys` lists them (a ggml type name for the dtype, the PyTorch shape).
pub fn gguf_keys(path: &std::path::Path, glob: &str) -> Result<Vec<KeyRow>, ReadError> {
    let f = crate::io::gguf::GgufFile::open(path)?;
    Ok(f.header()
        .tensors
        .iter()
        .filter(|t| glob_matches(glob, &t.name))
        .map(|t| KeyRow {
            component: String::new(),
            name: t.name.clone(),
            dtype: t.ty.name().to_string(),
            shape: crate::format::gguf::torch_shape(&t.ne),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::glob_matches;

    #[test]
    fn globs_match_like_the_shell() {
        for (p, n, want) in [
            ("*", "", true),
            ("*", "blocks.0.ffn.weight", true),
            ("blocks.*.weight", "blocks.0.ffn.weight", true),
            ("blocks.?.ffn.*", "blocks.0.ffn.bias", true),
            ("blocks.?.ffn.*", "blocks.10.ffn.bias", false),
            ("*.bias", "blocks.0.ffn.weight", false),
            ("*a*b*", "xaxxbx", true),
            ("*a*b", "xaxxbx", false),
            ("exact", "exact", true),
            ("exact", "exactly", false),
            ("", "x", false),
        ] {
            assert_eq!(glob_matches(p, n), want, "{p} on {n}");
        }
    }
}
