//! What `inspect` says about quantized checkpoints: ComfyUI scaled-fp8 safetensors and GGUF
//! files (spec quant_formats.md §1, §2).
//!
//! Owns: recognising a scaled-fp8 state dict (the `scaled_fp8` marker) and checking it the
//! way ComfyUI loads it (every `scale_weight` belongs to an fp8 weight, shapes 0-d), the
//! shape view that fingerprints it without its scale tensors, and the whole GGUF report
//! (metadata, types, torch shapes, fingerprint, optional sha256) and its `--keys` listing.
//! Does not own: the
//! safetensors report (`inspect`), the GGUF parser (`format::gguf`) or fingerprints
//! (`model::fingerprint`).

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::json;

use crate::format::gguf::{Value, torch_shape};
use crate::human::{grouped, plural, size};
use crate::io::gguf::GgufFile;
use crate::io::{DType, ReadError, TensorSet, digest};
use crate::model::fingerprint::{Fingerprint, ShapeSource, fingerprint};
use crate::quant::convention::{self, Format};
use crate::quant::layers::{self, Decoding};
use crate::quant::rules::QuantFormat;

/// A tensor set seen as it decodes: without side tensors (markers, scales), each quantized
/// weight with its decoded shape (for fingerprints).
pub struct WithoutFp8Extras<'a>(pub &'a TensorSet, pub Option<&'a Decoding>);

impl ShapeSource for WithoutFp8Extras<'_> {
    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        if convention::is_side_tensor(name) {
            return None;
        }
        let stored = self.0.get(name)?.view.shape;
        Some(match self.1.and_then(|d| d.layers.get(name)) {
            Some(codec) => codec.decoded_shape(stored),
            None => stored.to_vec(),
        })
    }
    fn names(&self) -> Vec<String> {
        self.0
            .names()
            .filter(|n| !convention::is_side_tensor(n))
            .map(str::to_string)
            .collect()
    }
}

/// The quantization summary of a state dict, `None` for plain floats: the scaled-fp8 one
/// below, or the format `quant::convention` recognises with its side-tensor count (or, for
/// a marked state dict that no known format explains, the tensor and the reason as its
/// problem), and the fingerprint of the state dict without its side tensors.
pub fn quantization_summary(set: &TensorSet) -> Option<(serde_json::Value, Fingerprint)> {
    if let Some(s) = scaled_fp8_summary(set) {
        return Some(s);
    }
    let metadata = set.metadata();
    let (format, planned) = match convention::recognise(set, &metadata) {
        Ok(Format::Plain) => return None,
        Ok(f @ Format::ComfyMixed) => (f.name(), layers::mixed(set, &metadata).map(Some)),
        Ok(f @ Format::LightX2v) => (f.name(), layers::lightx2v(set).map(Some)),
        Ok(f) => (f.name(), Ok(None)),
        Err(u) => {
            let problem = format!("{}: {}", u.tensor, u.reason);
            let summary = json!({"format": u.format, "problems": [problem]});
            return Some((summary, fingerprint(&WithoutFp8Extras(set, None))));
        }
    };
    let (decoding, problems) = match planned {
        Ok(d) => (d, Vec::new()),
        Err(e) => (None, vec![e.to_string()]),
    };
    let side = set
        .names()
        .filter(|n| convention::is_side_tensor(n))
        .count();
    let summary = json!({
        "format": format,
        "side_tensors": side,
        "layers": decoding.as_ref().map(|d| d.details.clone()),
        "problems": problems,
    });
    Some((
        summary,
        fingerprint(&WithoutFp8Extras(set, decoding.as_ref())),
    ))
}

/// The scaled-fp8 summary of a state dict, `None` without a `scaled_fp8` marker: the
/// marker, the fp8 layers, and every problem a ComfyUI load would hit (a `scale_weight` on
/// a weight that is not fp8, or not 0-d F32; an fp8 weight without one).
fn scaled_fp8_summary(set: &TensorSet) -> Option<(serde_json::Value, Fingerprint)> {
    let marker = convention::scaled_fp8_marker(set)?;
    let m = set.get(marker)?;
    let prefix = marker
        .strip_suffix(convention::SCALED_FP8_MARKER)
        .unwrap_or("");
    let mut problems = Vec::new();
    let mut layers = 0usize;
    let mut scale_input = 0usize;
    for name in set.names() {
        if let Some(layer) = name.strip_suffix(convention::SCALE_WEIGHT) {
            let s = set.get(name)?;
            if s.view.dtype != DType::F32 || !s.view.shape.is_empty() {
                problems.push(format!(
                    "{name}: expected a 0-d F32 scale, found {} {:?}",
                    s.view.dtype, s.view.shape
                ));
            }
            match set.get(&format!("{layer}.weight")) {
                Some(w) if w.view.dtype == DType::F8_E4M3 => layers += 1,
                Some(w) => problems.push(format!(
                    "{name}: its weight is {}, not F8_E4M3 (current ComfyUI would cast it to \
                     fp8 unscaled)",
                    w.view.dtype
                )),
                None => problems.push(format!("{name}: no {layer}.weight")),
            }
        } else if name.ends_with(convention::SCALE_INPUT) {
            scale_input += 1;
        } else if name.ends_with(".weight") {
            let w = set.get(name)?;
            let layer = name.strip_suffix(".weight").unwrap_or(name);
            let scale = format!("{layer}{}", convention::SCALE_WEIGHT);
            if w.view.dtype == DType::F8_E4M3 && !set.contains(&scale) {
                problems.push(format!("{name}: F8_E4M3 weight without a scale_weight"));
            }
        }
    }
    let summary = json!({
        "format": "comfyui-scaled-fp8",
        "prefix": prefix,
        "marker": {"dtype": m.view.dtype.as_str(), "shape": m.view.shape},
        "fp8_layers": layers,
        "scale_input": scale_input,
        "problems": problems,
    });
    Some((summary, fingerprint(&WithoutFp8Extras(set, None))))
}

struct GgufShapes<'a>(&'a GgufFile);

impl ShapeSource for GgufShapes<'_> {
    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.0
            .header()
            .tensors
            .iter()
            .find(|t| t.name == name)
            .map(|t| torch_shape(&t.ne))
    }
    fn names(&self) -> Vec<String> {
        self.0
            .header()
            .tensors
            .iter()
            .map(|t| t.name.clone())
            .collect()
    }
}

/// The report of one GGUF file: metadata, tensor count, per-type histogram, parameter
/// count, fingerprint, and the sha256 with `hash`.
pub fn inspect_gguf(path: &Path, hash: bool) -> Result<serde_json::Value, ReadError> {
    let f = GgufFile::open(path)?;
    let g = f.header();
    let mut types: BTreeMap<&str, (usize, u64, u64)> = BTreeMap::new();
    for (i, t) in g.tensors.iter().enumerate() {
        let e = types.entry(t.ty.name()).or_default();
        e.0 += 1;
        e.1 += t.numel().unwrap_or(0);
        e.2 += g.range(i).len() as u64;
    }
    let metadata: BTreeMap<&str, serde_json::Value> =
        g.kv.iter()
            .map(|(k, v)| {
                let j = match v {
                    Value::Str(s) => json!(s),
                    Value::F32(x) => json!(x),
                    Value::F64(x) => json!(x),
                    Value::Bool(b) => json!(b),
                    Value::I8(_) | Value::I16(_) | Value::I32(_) | Value::I64(_) => {
                        json!(v.to_string().parse::<i64>().ok())
                    }
                    _ => v
                        .as_u64()
                        .map_or_else(|| json!(v.to_string()), |n| json!(n)),
                };
                (k.as_str(), j)
            })
            .collect();
    let fp = fingerprint(&GgufShapes(&f));
    let tensors: Vec<serde_json::Value> = g
        .tensors
        .iter()
        .map(|t| json!({"name": t.name, "type": t.ty.name(), "shape": torch_shape(&t.ne)}))
        .collect();
    let sha256 = if hash {
        Some(digest::sha256_file(path)?.1)
    } else {
        None
    };
    Ok(json!({
        "path": path.display().to_string(),
        "kind": "gguf",
        "version": g.version,
        "alignment": g.alignment,
        "bytes": f.len(),
        "sha256": sha256,
        "metadata": metadata,
        "tensor_count": g.tensors.len(),
        "parameter_count": types.values().map(|v| v.1).sum::<u64>(),
        "types": types.iter().map(|(k, v)| (k.to_string(),
            json!({"tensors": v.0, "parameters": v.1, "bytes": v.2}))).collect::<serde_json::Map<_, _>>(),
        "fingerprint": fp,
        "tensors": tensors,
    }))
}

/// The text form of [`inspect_gguf`]'s report.
pub fn render_gguf(r: &serde_json::Value) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{} (GGUF v{})",
        r["path"].as_str().unwrap_or(""),
        r["version"]
    );
    let _ = writeln!(
        s,
        "    model:      {}",
        r["fingerprint"]["description"].as_str().unwrap_or("")
    );
    for n in r["fingerprint"]["notes"].as_array().into_iter().flatten() {
        let _ = writeln!(s, "                {}", n.as_str().unwrap_or(""));
    }
    if let Some(m) = r["metadata"].as_object() {
        for (k, v) in m {
            let _ = write!(s, "    {k} = {v}");
            let format = v.as_u64().and_then(QuantFormat::of_file_type);
            match format {
                Some(f) if k == "general.file_type" => {
                    let _ = writeln!(s, " (llama.cpp's ftype of --to {f})");
                }
                _ => s.push('\n'),
            }
        }
    }
    let _ = writeln!(
        s,
        "    tensors:    {} ({} parameters, {})",
        grouped(r["tensor_count"].as_u64().unwrap_or(0)),
        grouped(r["parameter_count"].as_u64().unwrap_or(0)),
        size(r["bytes"].as_u64().unwrap_or(0))
    );
    let types: Vec<String> = r["types"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| {
            format!(
                "{k}: {} / {} params",
                plural(
                    v["tensors"].as_u64().unwrap_or(0) as usize,
                    "tensor",
                    "tensors"
                ),
                grouped(v["parameters"].as_u64().unwrap_or(0))
            )
        })
        .collect();
    let _ = writeln!(s, "    types:      {}", types.join(", "));
    if let Some(h) = r["sha256"].as_str() {
        let _ = writeln!(s, "    sha256:     {h}");
    }
    s
}
