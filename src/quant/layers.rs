//! Which tensors of a quantized state dict decode how: one [`LayerCodec`] per quantized
//! weight with its side tensors, read from the format's convention, every shape and dtype
//! checked before a byte is decoded.
//!
//! - ComfyUI legacy scaled fp8 (spec quant_formats.md §1.3): `<L>.weight` fp8 and a one-value
//!   `<L>.scale_weight` of any float dtype; `scale_input` consumed, never applied.
//! - ComfyUI mixed precision (quant_formats_2026.md §1.2, golden/quant_base/README.md): the
//!   per-layer `<L>.comfy_quant` JSON (or the `_quantization_metadata` header's `layers`)
//!   names the format: `float8_e4m3fn` / `float8_e5m2` (+ one-value `weight_scale`), `nvfp4`
//!   (U8 `[N, K/2]` + F8_E4M3 swizzled `weight_scale` + one-value `weight_scale_2`), `mxfp8`
//!   (F8_E4M3 `[N, K]` + U8 / F8_E8M0 swizzled `weight_scale`), `int8_tensorwise` (I8 +
//!   one-value or `[N, 1]` `weight_scale`; `convrot` with its group, top level or under
//!   `params`). `input_scale` is an activation scale: consumed, never applied. Formats whose
//!   weights need more than the file (`pre_quant_scale`, the W4 layouts) are refused.
//! - LightX2V (quant_formats_2026.md §2.1): I8 / F8_E4M3 `<k>.weight` + `[out, 1]`
//!   `<k>.weight_scale`.
//!
//! Owns: [`Decoding`] and the three planners. Does not own: the names (`convention`), the
//! numbers (`codec`), the scratch file (`base`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde_json::Value as Json;

use super::convention::{
    self, COMFY_QUANT, Format, INPUT_SCALE, QUANT_METADATA, SCALE_INPUT, SCALE_WEIGHT,
    WEIGHT_SCALE, WEIGHT_SCALE_2,
};
use crate::codec::blocked::blocked_shape;
use crate::io::{DType, ReadError, TensorSet, TensorView};

/// Longest `comfy_quant` JSON read (ComfyUI's are a few dozen bytes).
const MAX_MARKER_BYTES: usize = 4096;
/// ComfyUI's default ConvRot group.
const CONVROT_GROUP: usize = 256;

/// How one quantized weight decodes to f32.
#[derive(Clone, Debug, PartialEq)]
pub enum LayerCodec {
    /// `f32(q) * scale` over fp8 codes (legacy scaled fp8, mixed `float8_*`).
    Fp8 {
        /// The scale, widened to f32.
        scale: f32,
    },
    /// comfy-kitchen's NVFP4 layout.
    Nvfp4 {
        /// The swizzled F8_E4M3 block scales' tensor.
        block_scales: String,
        /// `weight_scale_2`, widened to f32.
        tensor_scale: f32,
    },
    /// comfy-kitchen's MXFP8 layout.
    Mxfp8 {
        /// The swizzled E8M0 block scales' tensor.
        block_scales: String,
    },
    /// `f32(q) * s` over I8 codes, one scale or one per row; un-rotated by the exact
    /// Hadamard transform of `convrot` columns when set.
    Int8 {
        /// One scale (`Some`) or the `[N, 1]` per-row scale tensor's name.
        scale: Result<f32, String>,
        /// The ConvRot group.
        convrot: Option<usize>,
    },
    /// `f32(q) * s[row]` over fp8 codes (LightX2V's per-channel fp8).
    Fp8Rows {
        /// The `[N, 1]` scale tensor.
        scale: String,
    },
}

impl LayerCodec {
    /// The f32 shape a weight stored as `stored` decodes to (NVFP4 packs two codes a byte).
    pub fn decoded_shape(&self, stored: &[usize]) -> Vec<usize> {
        match (self, stored) {
            (LayerCodec::Nvfp4 { .. }, [n, half]) => vec![*n, half * 2],
            _ => stored.to_vec(),
        }
    }
}

/// What decoding a quantized state dict takes.
#[derive(Debug)]
pub struct Decoding {
    /// The format.
    pub format: Format,
    /// Each quantized weight with its codec, by name.
    pub layers: BTreeMap<String, LayerCodec>,
    /// Side tensors read or dropped by the decoding (never passed on).
    pub consumed: BTreeSet<String>,
    /// Facts for reports.
    pub details: Vec<String>,
}

/// Refusal of `tensor` of `set`'s file.
fn refuse(set: &TensorSet, tensor: &str, format: Format, reason: impl Into<String>) -> ReadError {
    let path = match set.get(tensor) {
        Some(t) => t.file.path().to_path_buf(),
        None => set
            .files()
            .first()
            .map(|f| f.path().to_path_buf())
            .unwrap_or_default(),
    };
    ReadError::Quantized {
        path,
        tensor: tensor.to_string(),
        format: format.name().to_string(),
        reason: reason.into(),
    }
}

fn view<'a>(
    set: &'a TensorSet,
    name: &str,
    format: Format,
    owner: &str,
) -> Result<TensorView<'a>, ReadError> {
    set.get(name).map(|t| t.view).ok_or_else(|| {
        refuse(
            set,
            owner,
            format,
            format!("its side tensor `{name}` is missing"),
        )
    })
}

/// A side tensor that must hold one float value (shape `[]` or `[1]`), widened to f32.
fn one_value(set: &TensorSet, name: &str, format: Format, owner: &str) -> Result<f32, ReadError> {
    let v = view(set, name, format, owner)?;
    match (v.dtype.is_float() && v.numel() == 1, v.to_f32()) {
        (true, Ok(x)) => Ok(x[0]),
        _ => Err(refuse(
            set,
            name,
            format,
            format!(
                "expected one float value (shape [] or [1]), found {} {:?}",
                v.dtype, v.shape
            ),
        )),
    }
}

fn expect(
    set: &TensorSet,
    v: TensorView<'_>,
    format: Format,
    dtypes: &[DType],
    shape: &[usize],
) -> Result<(), ReadError> {
    if !dtypes.contains(&v.dtype) || v.shape != shape {
        return Err(refuse(
            set,
            v.name,
            format,
            format!(
                "expected {} {shape:?}, found {} {:?}",
                dtypes
                    .iter()
                    .map(|d| d.as_str())
                    .collect::<Vec<_>>()
                    .join(" or "),
                v.dtype,
                v.shape
            ),
        ));
    }
    Ok(())
}

/// `[N, K]` of a 2-D weight.
fn matrix(set: &TensorSet, v: TensorView<'_>, format: Format) -> Result<[usize; 2], ReadError> {
    match v.shape {
        [n, k] => Ok([*n, *k]),
        other => Err(refuse(
            set,
            v.name,
            format,
            format!("a quantized Linear weight is 2-D, found shape {other:?}"),
        )),
    }
}

impl Decoding {
    fn new(format: Format) -> Decoding {
        Decoding {
            format,
            layers: BTreeMap::new(),
            consumed: BTreeSet::new(),
            details: Vec::new(),
        }
    }

    /// Refuses any side tensor or coded tensor the decoding did not account for.
    fn check_rest(&self, set: &TensorSet) -> Result<(), ReadError> {
        for t in set.tensors() {
            let name = t.view.name;
            if self.layers.contains_key(name) || self.consumed.contains(name) {
                continue;
            }
            if convention::is_side_tensor(name) {
                return Err(refuse(
                    set,
                    name,
                    self.format,
                    "is a quantization side tensor of no quantized layer of this file",
                ));
            }
            if convention::is_coded(t.view.dtype) {
                return Err(refuse(
                    set,
                    name,
                    self.format,
                    format!(
                        "is stored as {} codes but no marker says how they decode",
                        t.view.dtype
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// ComfyUI's legacy scaled fp8 (module doc).
pub fn legacy(set: &TensorSet) -> Result<Decoding, ReadError> {
    let format = Format::ScaledFp8;
    let mut d = Decoding::new(format);
    let marker = convention::scaled_fp8_marker(set)
        .unwrap_or_default()
        .to_string();
    let m = view(set, &marker, format, &marker)?;
    if !matches!(m.dtype, DType::F8_E4M3 | DType::F8_E5M2 | DType::F32) {
        return Err(refuse(
            set,
            &marker,
            format,
            format!("the marker's dtype names the fp8 type; {} is none", m.dtype),
        ));
    }
    d.details
        .push(format!("marker `{marker}` ({} {:?})", m.dtype, m.shape));
    if m.numel() == 2 {
        d.details
            .push("2-element marker: ComfyUI runs these layers with full-precision matmul".into());
    }
    d.consumed.insert(marker);
    for name in set.names() {
        if name.ends_with(SCALE_INPUT) {
            d.consumed.insert(name.to_string());
        }
        let Some(layer) = name.strip_suffix(SCALE_WEIGHT) else {
            continue;
        };
        let wname = format!("{layer}.weight");
        let w = view(set, &wname, format, name)?;
        if !matches!(w.dtype, DType::F8_E4M3 | DType::F8_E5M2) {
            return Err(refuse(
                set,
                &wname,
                format,
                format!(
                    "has a `{SCALE_WEIGHT}` but is stored as {}, not fp8 (ComfyUI would cast it \
                     to fp8 unscaled and mis-load it)",
                    w.dtype
                ),
            ));
        }
        let scale = one_value(set, name, format, &wname)?;
        d.layers.insert(wname, LayerCodec::Fp8 { scale });
        d.consumed.insert(name.to_string());
    }
    d.details
        .push(format!("{} scaled fp8 weights", d.layers.len()));
    d.check_rest(set)?;
    Ok(d)
}

/// LightX2V's per-channel int8 / fp8 (module doc; `convention::recognise` checked the
/// dtypes and shapes).
pub fn lightx2v(set: &TensorSet) -> Result<Decoding, ReadError> {
    let format = Format::LightX2v;
    let mut d = Decoding::new(format);
    for name in set.names().filter(|n| n.ends_with(WEIGHT_SCALE)) {
        let layer = name.strip_suffix(WEIGHT_SCALE).unwrap_or(name);
        let wname = format!("{layer}.weight");
        let w = view(set, &wname, format, name)?;
        let codec = match w.dtype {
            DType::I8 => LayerCodec::Int8 {
                scale: Err(name.to_string()),
                convrot: None,
            },
            _ => LayerCodec::Fp8Rows {
                scale: name.to_string(),
            },
        };
        d.layers.insert(wname, codec);
        d.consumed.insert(name.to_string());
    }
    d.details
        .push(format!("{} per-channel weights", d.layers.len()));
    d.check_rest(set)?;
    Ok(d)
}

/// ComfyUI mixed precision (module doc).
pub fn mixed(set: &TensorSet, metadata: &BTreeMap<String, String>) -> Result<Decoding, ReadError> {
    let format = Format::ComfyMixed;
    let mut d = Decoding::new(format);
    let mut confs = header_layers(set, metadata)?;
    for name in set.names().filter(|n| n.ends_with(COMFY_QUANT)) {
        let layer = name.strip_suffix(COMFY_QUANT).unwrap_or(name).to_string();
        let conf = marker_json(set, name)?;
        if let Some(h) = confs.get(&layer)
            && h.get("format") != conf.get("format")
        {
            return Err(refuse(
                set,
                name,
                format,
                format!("says {conf} but the `{QUANT_METADATA}` header says {h}"),
            ));
        }
        confs.insert(layer, conf);
        d.consumed.insert(name.to_string());
    }
    if let Some(s) = set.names().find(|n| n.ends_with(SCALE_WEIGHT)) {
        return Err(refuse(
            set,
            s,
            format,
            "a mixed-precision file also holds legacy scaled-fp8 scales; ComfyUI never mixes them",
        ));
    }
    let mut count = BTreeMap::<String, usize>::new();
    for (layer, conf) in &confs {
        let wname = format!("{layer}.weight");
        let codec = mixed_layer(set, layer, conf, &mut d.consumed)?;
        *count.entry(format_of(conf).to_string()).or_default() += 1;
        d.layers.insert(wname, codec);
    }
    for name in set.names().filter(|n| n.ends_with(INPUT_SCALE)) {
        d.consumed.insert(name.to_string());
    }
    let types: Vec<String> = count.iter().map(|(f, n)| format!("{f} ×{n}")).collect();
    d.details
        .push(format!("quantized layers: {}", types.join(", ")));
    d.check_rest(set)?;
    Ok(d)
}

fn format_of(conf: &Json) -> &str {
    conf.get("format").and_then(Json::as_str).unwrap_or("")
}

/// The `_quantization_metadata` header's layers, if any.
fn header_layers(
    set: &TensorSet,
    metadata: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, Json>, ReadError> {
    let Some(text) = metadata.get(QUANT_METADATA) else {
        return Ok(BTreeMap::new());
    };
    let bad = |reason: String| refuse(set, QUANT_METADATA, Format::ComfyMixed, reason);
    let doc: Json = serde_json::from_str(text).map_err(|e| bad(format!("not JSON: {e}")))?;
    let Some(layers) = doc.get("layers").and_then(Json::as_object) else {
        return Err(bad("has no `layers` object".into()));
    };
    let mut out = BTreeMap::new();
    for (layer, conf) in layers {
        if !conf.is_object() {
            return Err(bad(format!("layer `{layer}` is {conf}, not an object")));
        }
        out.insert(layer.clone(), conf.clone());
    }
    Ok(out)
}

/// A `<L>.comfy_quant` tensor's JSON object.
fn marker_json(set: &TensorSet, name: &str) -> Result<Json, ReadError> {
    let format = Format::ComfyMixed;
    let v = view(set, name, format, name)?;
    if !matches!(v.dtype, DType::U8 | DType::I8) || v.shape.len() != 1 {
        return Err(refuse(
            set,
            name,
            format,
            format!(
                "expected a 1-D uint8 JSON marker, found {} {:?}",
                v.dtype, v.shape
            ),
        ));
    }
    if v.bytes.len() > MAX_MARKER_BYTES {
        return Err(refuse(
            set,
            name,
            format,
            format!(
                "{} bytes, more than a marker's {MAX_MARKER_BYTES}",
                v.bytes.len()
            ),
        ));
    }
    match serde_json::from_slice::<Json>(v.bytes) {
        Ok(j) if j.is_object() => Ok(j),
        Ok(j) => Err(refuse(
            set,
            name,
            format,
            format!("holds {j}, not an object"),
        )),
        Err(e) => Err(refuse(set, name, format, format!("not JSON: {e}"))),
    }
}

/// A flag or number read where ComfyUI reads it: top level, else under `params`.
fn param<'a>(conf: &'a Json, key: &str) -> Option<&'a Json> {
    conf.get(key)
        .or_else(|| conf.get("params").and_then(|p| p.get(key)))
}

/// One mixed-precision layer's codec, its side tensors checked and consumed.
fn mixed_layer(
    set: &TensorSet,
    layer: &str,
    conf: &Json,
    consumed: &mut BTreeSet<String>,
) -> Result<LayerCodec, ReadError> {
    let f = Format::ComfyMixed;
    let marker = format!("{layer}{COMFY_QUANT}");
    let wname = format!("{layer}.weight");
    let w = view(set, &wname, f, &marker)?;
    let scale = format!("{layer}{WEIGHT_SCALE}");
    let pre = format!("{layer}.pre_quant_scale");
    if set.contains(&pre) {
        return Err(refuse(
            set,
            &pre,
            f,
            "an activation smoothing scale changes the weight the layer computes with; \
             wanbake does not decode it",
        ));
    }
    let codec = match format_of(conf) {
        fmt @ ("float8_e4m3fn" | "float8_e5m2") => {
            let want = match fmt {
                "float8_e4m3fn" => DType::F8_E4M3,
                _ => DType::F8_E5M2,
            };
            expect(set, w, f, &[want], w.shape)?;
            LayerCodec::Fp8 {
                scale: one_value(set, &scale, f, &wname)?,
            }
        }
        "nvfp4" => {
            let [n, half] = matrix(set, w, f)?;
            expect(set, w, f, &[DType::U8], w.shape)?;
            let k = half * 2;
            let bs = view(set, &scale, f, &wname)?;
            let shape = block_shape(set, &wname, n, k, 16)?;
            expect(set, bs, f, &[DType::F8_E4M3], &shape)?;
            let s2 = format!("{layer}{WEIGHT_SCALE_2}");
            let tensor_scale = one_value(set, &s2, f, &wname)?;
            consumed.insert(s2);
            LayerCodec::Nvfp4 {
                block_scales: scale.clone(),
                tensor_scale,
            }
        }
        "mxfp8" => {
            let [n, k] = matrix(set, w, f)?;
            expect(set, w, f, &[DType::F8_E4M3], w.shape)?;
            let bs = view(set, &scale, f, &wname)?;
            let shape = block_shape(set, &wname, n, k, 32)?;
            expect(set, bs, f, &[DType::U8, DType::F8_E8M0], &shape)?;
            LayerCodec::Mxfp8 {
                block_scales: scale.clone(),
            }
        }
        "int8_tensorwise" => int8_layer(set, w, &scale, conf)?,
        other => {
            return Err(refuse(
                set,
                &marker,
                f,
                format!(
                    "names format `{other}`; wanbake decodes float8_e4m3fn, float8_e5m2, nvfp4, \
                     mxfp8 and int8_tensorwise"
                ),
            ));
        }
    };
    consumed.insert(scale);
    Ok(codec)
}

/// The stored swizzled scale shape of an `[n, k]` weight with blocks of `block` columns.
fn block_shape(
    set: &TensorSet,
    wname: &str,
    n: usize,
    k: usize,
    block: usize,
) -> Result<[usize; 2], ReadError> {
    if !k.is_multiple_of(block) {
        return Err(refuse(
            set,
            wname,
            Format::ComfyMixed,
            format!("{k} columns are not whole blocks of {block}"),
        ));
    }
    blocked_shape(n, k / block).map_err(|e| refuse(set, wname, Format::ComfyMixed, e.to_string()))
}

/// An `int8_tensorwise` layer: one-value or `[N, 1]` scale, optional ConvRot.
fn int8_layer(
    set: &TensorSet,
    w: TensorView<'_>,
    scale: &str,
    conf: &Json,
) -> Result<LayerCodec, ReadError> {
    let f = Format::ComfyMixed;
    let [n, k] = matrix(set, w, f)?;
    expect(set, w, f, &[DType::I8], w.shape)?;
    let s = view(set, scale, f, w.name)?;
    let scale = match s.numel() {
        1 => Ok(one_value(set, scale, f, w.name)?),
        _ => {
            expect(set, s, f, &[DType::F32, DType::BF16, DType::F16], &[n, 1])?;
            Err(scale.to_string())
        }
    };
    let convrot = match param(conf, "convrot").and_then(Json::as_bool) {
        Some(true) => {
            let group = param(conf, "convrot_groupsize")
                .map(|g| g.as_u64().and_then(|g| usize::try_from(g).ok()))
                .unwrap_or(Some(CONVROT_GROUP));
            let Some(group) = group.filter(|&g| crate::codec::hadamard::log4(g).is_ok()) else {
                return Err(refuse(
                    set,
                    w.name,
                    f,
                    format!("ConvRot group {conf}: expected a power of 4"),
                ));
            };
            if !k.is_multiple_of(group) {
                return Err(refuse(
                    set,
                    w.name,
                    f,
                    format!("{k} in_features are not whole ConvRot groups of {group}"),
                ));
            }
            Some(group)
        }
        _ => None,
    };
    Ok(LayerCodec::Int8 { scale, convrot })
}

/// The file named in messages about a layer of `set`.
pub fn file_of<'a>(set: &'a TensorSet, name: &str) -> &'a Path {
    match set.get(name) {
        Some(t) => t.file.path(),
        None => set.files().first().map_or(Path::new(""), |f| f.path()),
    }
}
