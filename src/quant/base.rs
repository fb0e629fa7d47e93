//! A quantized checkpoint as a base: every command that reads a base (`convert`, `merge`,
//! `restack`, `extract --base`, `bake`, `inspect --base`) opens it here, and gets either the
//! tensors decoded to f32 exactly as the runtime that loads the format does, or a refusal
//! naming the file, the tensor and the format. A marked tensor is never passed on as its raw
//! codes.
//!
//! Decoding (spec quant_formats.md §1.3, §2.5):
//! - ComfyUI legacy scaled fp8: `W = q.to(f32) * scale_weight` (one f32 product; a scale of
//!   any float dtype widened to f32 first, 0-d or one element), as `convert_old_quants` and
//!   the fp8 layout's dequantize do; `scale_input` is an activation scale and never touches
//!   a weight; a 2-element marker (full-precision matmul) changes no weight.
//! - fp8 weights without scales: a cast (the float readers widen F8_E4M3 / F8_E5M2 exactly,
//!   so these tensors pass through as stored).
//! - GGUF (city96's ComfyUI-GGUF): F32 / F16 / BF16 as stored, every block type decoded as
//!   gguf-py's `dequantize` (`io::quant::ggml`), the torch shape from
//!   `comfy.gguf.orig_shape.<name>` when the file has it, else `ne` reversed.
//! - ComfyUI mixed precision and LightX2V: each layer as `quant::layers` plans it, decoded by
//!   comfy-kitchen's layouts (`codec`: NVFP4, MXFP8, INT8 with ConvRot un-rotated exactly) or
//!   LightX2V's per-row product.
//!
//! A decoded input becomes an unnamed scratch safetensors file (`io::scratch`), written one
//! chunk at a time: memory stays per chunk, the disk holds the decoded tensors once per
//! process. Anything the formats mark that the plan cannot account for is refused, never
//! guessed.
//!
//! Does not own: the names and the recognition (`quant::convention`), the codecs
//! (`codec`), the containers (`io::file`, `io::gguf`).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use super::convention::{self, Format};
use super::layers::{self, Decoding, LayerCodec};
use crate::codec::dtype::widen_to_f32;
use crate::codec::ggml::{self, GgmlType};
use crate::codec::int8::{self, Scale};
use crate::codec::{mxfp8, nvfp4};
use crate::io::checkpoint::{Checkpoint, Component, QuantizedInput, SourceKind, TensorSet};
use crate::io::gguf::{GgufFile, Value, single_gguf_in, torch_shape};
use crate::io::header_layout::{HeaderLayout, PlannedTensor};
use crate::io::{DType, ReadError, SafetensorsFile, TensorView, scratch};
use crate::model::base_model::BaseModel;

/// Elements decoded per chunk (4 MiB of f32).
const CHUNK: usize = 1 << 20;
/// ComfyUI-GGUF's metadata key prefix for a tensor's true torch shape.
const GGUF_ORIG_SHAPE: &str = "comfy.gguf.orig_shape.";

/// Opens `path` as a base model: decoded when quantized (module doc).
pub fn open(path: &Path) -> Result<BaseModel, ReadError> {
    open_checkpoint(path).map(BaseModel::new)
}

/// Opens `path` as a base checkpoint: decoded when quantized (module doc).
pub fn open_checkpoint(path: &Path) -> Result<Checkpoint, ReadError> {
    if let Some(gguf) = single_gguf_in(path) {
        return open_gguf(path, &gguf);
    }
    let mut ck = Checkpoint::open_stored(path)?;
    let files = ck.input_files();
    let mut found: Option<QuantizedInput> = None;
    for comp in &mut ck.components {
        let Some(q) = decode_component(comp, &files)? else {
            continue;
        };
        match &mut found {
            None => found = Some(q),
            Some(f) => {
                f.decoded += q.decoded;
                f.consumed.extend(q.consumed);
                f.details.extend(q.details);
            }
        }
    }
    ck.quantized = found;
    Ok(ck)
}

/// The refusal of `tensor` of `file` in `format`.
fn refuse(file: &Path, tensor: &str, format: &str, reason: impl Into<String>) -> ReadError {
    ReadError::Quantized {
        path: file.to_path_buf(),
        tensor: tensor.to_string(),
        format: format.to_string(),
        reason: reason.into(),
    }
}

/// Recognises a component's format and decodes it in place; `None` for plain floats.
fn decode_component(
    comp: &mut Component,
    files: &[PathBuf],
) -> Result<Option<QuantizedInput>, ReadError> {
    let set = &comp.tensors;
    let mut metadata = BTreeMap::new();
    for f in set.files() {
        metadata.extend(f.metadata().clone());
    }
    let format = convention::recognise(set, &metadata).map_err(|u| ReadError::Quantized {
        path: layers::file_of(set, &u.tensor).to_path_buf(),
        tensor: u.tensor,
        format: u.format.to_string(),
        reason: u.reason,
    })?;
    let decoding = match format {
        Format::Plain => return Ok(None),
        Format::PlainFp8 => {
            let n = set.tensors().filter(|t| is_fp8(t.view.dtype)).count();
            return Ok(Some(QuantizedInput {
                format: format.name().to_string(),
                details: vec![format!("{n} fp8 tensors without scales, decoded by a cast")],
                decoded: n,
                consumed: Vec::new(),
                files: files.to_vec(),
            }));
        }
        Format::ScaledFp8 => layers::legacy(set)?,
        Format::ComfyMixed => layers::mixed(set, &metadata)?,
        Format::LightX2v => layers::lightx2v(set)?,
    };
    metadata.remove(convention::QUANT_METADATA);
    comp.tensors = decode(set, &metadata, &decoding)?;
    Ok(Some(QuantizedInput {
        format: format.name().to_string(),
        details: decoding.details,
        decoded: decoding.layers.len(),
        consumed: decoding.consumed.into_iter().collect(),
        files: files.to_vec(),
    }))
}

fn is_fp8(d: DType) -> bool {
    matches!(d, DType::F8_E4M3 | DType::F8_E5M2)
}

/// Writes the decoded state dict into a scratch file: quantized weights as F32, side tensors
/// dropped, everything else byte for byte.
fn decode(
    set: &TensorSet,
    metadata: &BTreeMap<String, String>,
    decoding: &Decoding,
) -> Result<TensorSet, ReadError> {
    let first = layers::file_of(set, "").to_path_buf();
    let planned: Vec<PlannedTensor> = set
        .tensors()
        .filter(|t| !decoding.consumed.contains(t.view.name))
        .map(|t| match decoding.layers.get(t.view.name) {
            Some(codec) => PlannedTensor {
                name: t.view.name.to_string(),
                dtype: DType::F32,
                shape: codec.decoded_shape(t.view.shape),
            },
            None => PlannedTensor {
                name: t.view.name.to_string(),
                dtype: t.view.dtype,
                shape: t.view.shape.to_vec(),
            },
        })
        .collect();
    let label = scratch::label("quant", &first);
    let layout = HeaderLayout::build(&planned, metadata).map_err(|e| ReadError::Unsupported {
        path: first.clone(),
        reason: format!("cannot lay the decoded tensors out: {e}"),
    })?;
    let mut extra = decoding.format.name().to_string();
    for f in set.files().iter().skip(1) {
        extra.push_str(&format!("|{}", f.path().display()));
    }
    let key = scratch::key_of(&first, &extra)?;
    let file = scratch::decoded_once(key, || {
        scratch::write(&layout, &label, |info, w| {
            let Some(t) = set.get(&info.name) else {
                return Ok(0);
            };
            let n = match decoding.layers.get(&info.name) {
                Some(LayerCodec::Fp8 { scale }) => write_scaled(t.view, *scale, w, &label),
                Some(codec) => {
                    let values = decode_layer(set, t.view, codec, decoding.format)?;
                    write_f32(&values, w, &label)
                }
                None => write_bytes(t.view.bytes, w, &label),
            };
            t.file.release(t.position);
            n
        })
    })?;
    Ok(TensorSet::from_opened(SafetensorsFile::from_file(
        &file, &label,
    )?))
}

/// A side tensor's values widened to f32.
fn side_f32(set: &TensorSet, name: &str, format: Format) -> Result<Vec<f32>, ReadError> {
    let bad = |reason: String| ReadError::Quantized {
        path: layers::file_of(set, name).to_path_buf(),
        tensor: name.to_string(),
        format: format.name().to_string(),
        reason,
    };
    let v = set.get(name).ok_or_else(|| bad("missing".into()))?.view;
    v.to_f32().map_err(|e| bad(e.to_string()))
}

/// One quantized weight (other than the chunked fp8 case) decoded to f32 by its codec.
fn decode_layer(
    set: &TensorSet,
    w: TensorView<'_>,
    codec: &LayerCodec,
    format: Format,
) -> Result<Vec<f32>, ReadError> {
    let side = |name: &str| set.get(name).map(|t| t.view.bytes).unwrap_or_default();
    let [n, k] = match w.shape {
        [n, k] => [*n, *k],
        other => [other.first().copied().unwrap_or(0), 0],
    };
    let decoded = match codec {
        LayerCodec::Fp8 { scale } => {
            let mut out = vec![0f32; w.numel()];
            scale_codes(w, w.bytes, *scale, &mut out).map(|()| out)
        }
        LayerCodec::Nvfp4 {
            block_scales,
            tensor_scale,
        } => nvfp4::decode(
            w.bytes,
            side(block_scales),
            *tensor_scale,
            [n, k * 2],
            [n, k * 2],
        ),
        LayerCodec::Mxfp8 { block_scales } => {
            mxfp8::decode(w.bytes, side(block_scales), [n, k], [n, k])
        }
        LayerCodec::Int8 { scale, convrot } => {
            let rows;
            let s = match scale {
                Ok(s) => Scale::Tensor(*s),
                Err(name) => {
                    rows = side_f32(set, name, format)?;
                    Scale::Rows(&rows)
                }
            };
            match convrot {
                Some(group) => int8::decode_convrot(w.bytes, s, n, k, *group),
                None => int8::decode(w.bytes, s, n, k),
            }
        }
        LayerCodec::Fp8Rows { scale } => {
            let rows = side_f32(set, scale, format)?;
            let mut out = vec![0f32; w.numel()];
            mxfp8::decode_fp8_rowwise_into(w.bytes, &rows, n, k, &mut out).map(|()| out)
        }
    };
    decoded.map_err(|e| ReadError::Quantized {
        path: layers::file_of(set, w.name).to_path_buf(),
        tensor: w.name.to_string(),
        format: format.name().to_string(),
        reason: e.to_string(),
    })
}

/// `q.to(f32) * scale` of `codes` (a run of `w`'s bytes) into `out`: the widening is exact,
/// then one f32 product, as ComfyUI's fp8 layout dequantizes to f32.
fn scale_codes(
    w: TensorView<'_>,
    codes: &[u8],
    scale: f32,
    out: &mut [f32],
) -> Result<(), crate::codec::CodecError> {
    widen_to_f32(w.dtype, codes, out)
        .map_err(|e| crate::codec::CodecError::Unrepresentable(e.to_string()))?;
    out.iter_mut().for_each(|x| *x *= scale);
    Ok(())
}

/// `q.to(f32) * scale`, chunk by chunk, as little-endian f32.
fn write_scaled(
    v: TensorView<'_>,
    scale: f32,
    w: &mut dyn Write,
    label: &Path,
) -> Result<u64, ReadError> {
    let mut buf = vec![0f32; CHUNK.min(v.numel())];
    let mut n = 0u64;
    for codes in v.bytes.chunks(CHUNK) {
        let out = &mut buf[..codes.len()];
        scale_codes(v, codes, scale, out).map_err(|e| ReadError::Tensor {
            path: label.to_path_buf(),
            tensor: v.name.to_string(),
            reason: e.to_string(),
        })?;
        n += write_f32(out, w, label)?;
    }
    Ok(n)
}

fn write_f32(values: &[f32], w: &mut dyn Write, label: &Path) -> Result<u64, ReadError> {
    let bytes: Vec<u8> = values.iter().flat_map(|x| x.to_le_bytes()).collect();
    write_bytes(&bytes, w, label)
}

fn write_bytes(bytes: &[u8], w: &mut dyn Write, label: &Path) -> Result<u64, ReadError> {
    w.write_all(bytes).map_err(|e| ReadError::io(label, e))?;
    Ok(bytes.len() as u64)
}

/// A GGUF file (or a folder holding one) as a base checkpoint.
fn open_gguf(given: &Path, path: &Path) -> Result<Checkpoint, ReadError> {
    let file = GgufFile::open(path)?;
    let mut planned = Vec::with_capacity(file.header().tensors.len());
    let mut decoded = 0;
    for t in &file.header().tensors {
        let shape = gguf_shape(&file, t.name.as_str(), &t.ne)?;
        let dtype = match t.ty {
            GgmlType::F32 => DType::F32,
            GgmlType::F16 => DType::F16,
            GgmlType::BF16 => DType::BF16,
            _ => {
                decoded += 1;
                DType::F32
            }
        };
        planned.push(PlannedTensor {
            name: t.name.clone(),
            dtype,
            shape,
        });
    }
    let label = scratch::label("gguf", path);
    let layout =
        HeaderLayout::build(&planned, &Default::default()).map_err(|e| ReadError::Unsupported {
            path: path.to_path_buf(),
            reason: format!("cannot lay the GGUF tensors out: {e}"),
        })?;
    let key = scratch::key_of(path, "gguf")?;
    let scratch_file = scratch::decoded_once(key, || {
        scratch::write(&layout, &label, |info, w| {
            let Some(i) = file
                .header()
                .tensors
                .iter()
                .position(|t| t.name == info.name)
            else {
                return Ok(0);
            };
            let n = write_gguf_tensor(&file, i, w, &label);
            file.release(i);
            n
        })
    })?;
    let mapped = SafetensorsFile::from_file(&scratch_file, &label)?;
    let types = gguf_types(&file);
    Ok(Checkpoint {
        path: given.to_path_buf(),
        kind: SourceKind::Gguf,
        components: vec![Component {
            name: String::new(),
            rel_dir: PathBuf::new(),
            weights_stem: path
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or("model")
                .to_string(),
            tensors: TensorSet::from_opened(mapped),
            sidecars: Vec::new(),
        }],
        root_files: Vec::new(),
        ignored: Vec::new(),
        carried: Vec::new(),
        orbax: None,
        quantized: Some(QuantizedInput {
            format: "gguf".into(),
            details: vec![format!("tensor types: {types}")],
            decoded,
            consumed: Vec::new(),
            files: vec![path.to_path_buf()],
        }),
    })
}

/// "Q8_0 ×240, F32 ×101, ..." in type order.
fn gguf_types(file: &GgufFile) -> String {
    let mut count = std::collections::BTreeMap::new();
    for t in &file.header().tensors {
        *count.entry(t.ty).or_insert(0usize) += 1;
    }
    count
        .iter()
        .map(|(ty, n)| format!("{} ×{n}", ty.name()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A GGUF tensor's torch shape: `comfy.gguf.orig_shape.<name>` (an INT32 array, as
/// ComfyUI-GGUF's `get_orig_shape` requires) when present, else `ne` reversed; the element
/// counts must agree.
fn gguf_shape(file: &GgufFile, name: &str, ne: &[u64]) -> Result<Vec<usize>, ReadError> {
    let stored = torch_shape(ne);
    let key = format!("{GGUF_ORIG_SHAPE}{name}");
    let Some(v) = file.header().get(&key) else {
        return Ok(stored);
    };
    let bad = |reason: String| refuse(file.path(), name, "gguf", reason);
    let Value::Array(_, items) = v else {
        return Err(bad(format!("`{key}` is not an array of INT32")));
    };
    let mut shape = Vec::with_capacity(items.len());
    for item in items {
        match item {
            Value::I32(d) if *d >= 0 => shape.push(*d as usize),
            other => return Err(bad(format!("`{key}` holds {other:?}, not a dimension"))),
        }
    }
    let numel = |s: &[usize]| s.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    if numel(&shape) != numel(&stored) {
        return Err(bad(format!(
            "`{key}` = {shape:?} does not hold the {stored:?} stored elements"
        )));
    }
    Ok(shape)
}

/// One GGUF tensor decoded (block types) or copied (float types), chunk by chunk.
fn write_gguf_tensor(
    file: &GgufFile,
    i: usize,
    w: &mut dyn Write,
    label: &Path,
) -> Result<u64, ReadError> {
    let t = &file.header().tensors[i];
    let data = file.data(i);
    if matches!(t.ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) {
        return write_bytes(data, w, label);
    }
    let per_block = t.ty.block_size();
    let blocks_per_chunk = (CHUNK / per_block).max(1);
    let chunk_bytes = blocks_per_chunk * t.ty.type_size();
    let mut buf = vec![0f32; blocks_per_chunk * per_block];
    let mut n = 0u64;
    for src in data.chunks(chunk_bytes) {
        let elems = src.len() / t.ty.type_size() * per_block;
        let out = &mut buf[..elems];
        ggml::dequantize(t.ty, src, out);
        n += write_f32(out, w, label)?;
    }
    Ok(n)
}
