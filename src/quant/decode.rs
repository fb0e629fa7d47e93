//! One tensor of a quantized checkpoint decoded to f32, as the runtime that loads the format
//! does (spec quant_formats.md §1.3, §2.5; quant_formats_2026.md §1.3, §2.1):
//! - ComfyUI legacy scaled fp8 and mixed `float8_*`: `W = q.to(f32) * scale` (one f32
//!   product; the scale widened to f32 first, as `convert_old_quants` and the fp8 layout's
//!   dequantize do); activation scales never touch a weight.
//! - GGUF (city96's ComfyUI-GGUF): F32 / F16 / BF16 as stored, every block type as gguf-py's
//!   `dequantize` (`codec::ggml`), in the torch shape of `comfy.gguf.orig_shape.<name>` when
//!   the file has it, else `ne` reversed.
//! - ComfyUI mixed precision and LightX2V: each layer as `quant::layers` plans it, decoded by
//!   comfy-kitchen's layouts (`codec`: NVFP4, MXFP8, INT8 with ConvRot un-rotated exactly)
//!   or LightX2V's per-row product.
//!
//! Owns: [`QuantSource`], a quantized checkpoint read tensor by tensor (the runner's weights
//! read it a tensor at a time; `quant::base` writes a base's scratch file from it), and
//! [`recognise_set`], what a state dict's convention asks of its reader. Does not own: the
//! names (`convention`), the layer plans (`layers`), the numbers (`codec`), the containers
//! (`format`, `io::file`, `io::gguf`).

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};

use super::convention::{self, Format};
use super::layers::{self, Decoding, LayerCodec};
use crate::codec::dtype::widen_to_f32;
use crate::codec::ggml::{self, GgmlType};
use crate::codec::int8::{self, Scale};
use crate::codec::{CodecError, mxfp8, nvfp4};
use crate::format::gguf::{Value, torch_shape};
use crate::format::header_layout::PlannedTensor;
use crate::io::gguf::GgufFile;
use crate::io::{DType, ReadError, TensorSet, TensorView};

/// Elements decoded per chunk when a tensor is streamed (4 MiB of f32).
const CHUNK: usize = 1 << 20;
/// ComfyUI-GGUF's metadata key prefix for a tensor's true torch shape.
const GGUF_ORIG_SHAPE: &str = "comfy.gguf.orig_shape.";
/// The name GGUF bases are reported under.
pub const GGUF: &str = "gguf";

/// What a safetensors state dict's convention asks of its reader.
#[derive(Debug)]
pub enum Recognised {
    /// Plain float tensors.
    Plain,
    /// fp8 weights without scales (this many): a cast, which the float readers do exactly.
    Cast(usize),
    /// Quantized layers to decode.
    Decode(Decoding),
}

/// Recognises `set`'s format and plans its layers; anything a format marks that no plan
/// accounts for is refused.
pub fn recognise_set(set: &TensorSet) -> Result<Recognised, ReadError> {
    let metadata = merged_metadata(set);
    let format = convention::recognise(set, &metadata).map_err(|u| ReadError::Quantized {
        path: layers::file_of(set, &u.tensor).to_path_buf(),
        tensor: u.tensor,
        format: u.format.to_string(),
        reason: u.reason,
    })?;
    Ok(match format {
        Format::Plain => Recognised::Plain,
        Format::PlainFp8 => Recognised::Cast(
            set.tensors()
                .filter(|t| matches!(t.view.dtype, DType::F8_E4M3 | DType::F8_E5M2))
                .count(),
        ),
        Format::ScaledFp8 => Recognised::Decode(layers::legacy(set)?),
        Format::ComfyMixed => Recognised::Decode(layers::mixed(set, &metadata)?),
        Format::LightX2v => Recognised::Decode(layers::lightx2v(set)?),
    })
}

/// The `__metadata__` of every file of `set`, later files over earlier ones.
pub fn merged_metadata(set: &TensorSet) -> BTreeMap<String, String> {
    let mut metadata = BTreeMap::new();
    for f in set.files() {
        metadata.extend(f.metadata().clone());
    }
    metadata
}

/// A quantized checkpoint whose tensors are read one at a time as f32.
pub struct QuantSource {
    kind: Kind,
}

enum Kind {
    Gguf {
        file: GgufFile,
        /// Each tensor's torch shape, in file order.
        shapes: Vec<Vec<usize>>,
        by_name: HashMap<String, usize>,
    },
    Stored {
        set: TensorSet,
        decoding: Decoding,
    },
}

impl std::fmt::Debug for QuantSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuantSource")
            .field("format", &self.format_name())
            .field("path", &self.path())
            .finish()
    }
}

impl QuantSource {
    /// `path` as a quantized source when it is one: a GGUF file (or a folder holding one),
    /// or a checkpoint of one state dict whose layers a format quantizes; `None` for float
    /// and cast-only fp8 checkpoints and for folders of several transformers.
    pub fn open(path: &Path) -> Result<Option<QuantSource>, ReadError> {
        if let Some(g) = crate::io::gguf::single_gguf_in(path) {
            return QuantSource::gguf(&g).map(Some);
        }
        let ck = crate::io::Checkpoint::open_stored(path)?;
        let Ok([component]) = <[_; 1]>::try_from(ck.components) else {
            return Ok(None);
        };
        Ok(match recognise_set(&component.tensors)? {
            Recognised::Decode(decoding) => Some(QuantSource::stored(component.tensors, decoding)),
            Recognised::Plain | Recognised::Cast(_) => None,
        })
    }

    /// The GGUF file at `path`, every tensor's torch shape checked.
    pub fn gguf(path: &Path) -> Result<QuantSource, ReadError> {
        let file = GgufFile::open(path)?;
        let mut shapes = Vec::with_capacity(file.header().tensors.len());
        let mut by_name = HashMap::new();
        for (i, t) in file.header().tensors.iter().enumerate() {
            shapes.push(gguf_shape(&file, &t.name, &t.ne)?);
            by_name.insert(t.name.clone(), i);
        }
        Ok(QuantSource {
            kind: Kind::Gguf {
                file,
                shapes,
                by_name,
            },
        })
    }

    /// The state dict `set`, decoded as `decoding` plans.
    pub fn stored(set: TensorSet, decoding: Decoding) -> QuantSource {
        QuantSource {
            kind: Kind::Stored { set, decoding },
        }
    }

    /// The format's name in reports.
    pub fn format_name(&self) -> &'static str {
        match &self.kind {
            Kind::Gguf { .. } => GGUF,
            Kind::Stored { decoding, .. } => decoding.format.name(),
        }
    }

    /// The (first) file read.
    pub fn path(&self) -> &Path {
        match &self.kind {
            Kind::Gguf { file, .. } => file.path(),
            Kind::Stored { set, .. } => layers::file_of(set, ""),
        }
    }

    /// Every file read.
    pub fn files(&self) -> Vec<PathBuf> {
        match &self.kind {
            Kind::Gguf { file, .. } => vec![file.path().to_path_buf()],
            Kind::Stored { set, .. } => {
                set.files().iter().map(|f| f.path().to_path_buf()).collect()
            }
        }
    }

    /// The decoded state dict's tensors in file order: quantized ones as F32 in their
    /// decoded shape, float ones as stored; side tensors left out.
    pub fn planned(&self) -> Vec<PlannedTensor> {
        match &self.kind {
            Kind::Gguf { file, shapes, .. } => file
                .header()
                .tensors
                .iter()
                .zip(shapes)
                .map(|(t, shape)| PlannedTensor {
                    name: t.name.clone(),
                    dtype: float_dtype(t.ty).unwrap_or(DType::F32),
                    shape: shape.clone(),
                })
                .collect(),
            Kind::Stored { set, decoding } => set
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
                .collect(),
        }
    }

    /// How many tensors are decoded (not stored as floats).
    pub fn decoded_count(&self) -> usize {
        match &self.kind {
            Kind::Gguf { file, .. } => file
                .header()
                .tensors
                .iter()
                .filter(|t| float_dtype(t.ty).is_none())
                .count(),
            Kind::Stored { decoding, .. } => decoding.layers.len(),
        }
    }

    /// Facts for reports: the GGUF tensor types, or the decoding's details.
    pub fn details(&self) -> Vec<String> {
        match &self.kind {
            Kind::Gguf { file, .. } => {
                let mut count = BTreeMap::new();
                for t in &file.header().tensors {
                    *count.entry(t.ty).or_insert(0usize) += 1;
                }
                let types: Vec<String> = count
                    .iter()
                    .map(|(ty, n)| format!("{} ×{n}", ty.name()))
                    .collect();
                vec![format!("tensor types: {}", types.join(", "))]
            }
            Kind::Stored { decoding, .. } => decoding.details.clone(),
        }
    }

    /// Side tensors the decoding read or dropped.
    pub fn consumed(&self) -> Vec<String> {
        match &self.kind {
            Kind::Gguf { .. } => Vec::new(),
            Kind::Stored { decoding, .. } => decoding.consumed.iter().cloned().collect(),
        }
    }

    /// Tensor `name`'s values as f32 (decoded, or widened when stored as floats); its mapped
    /// pages are dropped once read.
    pub fn decode(&self, name: &str) -> Result<Vec<f32>, ReadError> {
        match &self.kind {
            Kind::Gguf { file, by_name, .. } => {
                let i = gguf_index(file, by_name, name)?;
                let values = file.read_f32(i);
                file.release(i);
                Ok(values)
            }
            Kind::Stored { set, decoding } => {
                let t = stored_tensor(set, decoding, name)?;
                let values = match decoding.layers.get(name) {
                    Some(codec) => decode_layer(set, t.view, codec, decoding.format),
                    None => t
                        .view
                        .to_f32()
                        .map_err(|e| refuse(set, name, decoding.format, e)),
                };
                t.file.release(t.position);
                values
            }
        }
    }

    /// Writes tensor `name` as [`QuantSource::planned`] lays it out (decoded ones as
    /// little-endian f32, float ones byte for byte), chunk by chunk where the format allows;
    /// returns the bytes written. `label` names the destination in messages.
    pub fn write_tensor(
        &self,
        name: &str,
        w: &mut dyn Write,
        label: &Path,
    ) -> Result<u64, ReadError> {
        match &self.kind {
            Kind::Gguf { file, by_name, .. } => {
                let i = gguf_index(file, by_name, name)?;
                let n = write_gguf_tensor(file, i, w, label);
                file.release(i);
                n
            }
            Kind::Stored { set, decoding } => {
                let t = stored_tensor(set, decoding, name)?;
                let n = match decoding.layers.get(name) {
                    Some(LayerCodec::Fp8 { scale }) => write_scaled(t.view, *scale, w, label),
                    Some(codec) => {
                        let values = decode_layer(set, t.view, codec, decoding.format)?;
                        write_f32(&values, w, label)
                    }
                    None => write_bytes(t.view.bytes, w, label),
                };
                t.file.release(t.position);
                n
            }
        }
    }
}

/// The float dtype a GGUF type is stored as, `None` for block types.
fn float_dtype(ty: GgmlType) -> Option<DType> {
    match ty {
        GgmlType::F32 => Some(DType::F32),
        GgmlType::F16 => Some(DType::F16),
        GgmlType::BF16 => Some(DType::BF16),
        _ => None,
    }
}

fn refuse(set: &TensorSet, tensor: &str, format: Format, reason: impl ToString) -> ReadError {
    ReadError::Quantized {
        path: layers::file_of(set, tensor).to_path_buf(),
        tensor: tensor.to_string(),
        format: format.name().to_string(),
        reason: reason.to_string(),
    }
}

fn gguf_index(
    file: &GgufFile,
    by_name: &HashMap<String, usize>,
    name: &str,
) -> Result<usize, ReadError> {
    by_name
        .get(name)
        .copied()
        .ok_or_else(|| ReadError::Quantized {
            path: file.path().to_path_buf(),
            tensor: name.to_string(),
            format: GGUF.into(),
            reason: "not in the file".into(),
        })
}

/// A tensor of the decoded state dict (not a side tensor).
fn stored_tensor<'s>(
    set: &'s TensorSet,
    decoding: &Decoding,
    name: &str,
) -> Result<crate::io::TensorRef<'s>, ReadError> {
    match set.get(name) {
        Some(t) if !decoding.consumed.contains(name) => Ok(t),
        _ => Err(refuse(
            set,
            name,
            decoding.format,
            "not a tensor of the decoded state dict",
        )),
    }
}

/// A side tensor's values widened to f32.
fn side_f32(set: &TensorSet, name: &str, format: Format) -> Result<Vec<f32>, ReadError> {
    let v = set
        .get(name)
        .ok_or_else(|| refuse(set, name, format, "missing"))?
        .view;
    v.to_f32().map_err(|e| refuse(set, name, format, e))
}

/// One quantized weight decoded to f32 by its codec.
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
    decoded.map_err(|e| refuse(set, w.name, format, e))
}

/// `q.to(f32) * scale` of `codes` (a run of `w`'s bytes) into `out`: the widening is exact,
/// then one f32 product, as ComfyUI's fp8 layout dequantizes to f32.
fn scale_codes(
    w: TensorView<'_>,
    codes: &[u8],
    scale: f32,
    out: &mut [f32],
) -> Result<(), CodecError> {
    widen_to_f32(w.dtype, codes, out).map_err(|e| CodecError::Unrepresentable(e.to_string()))?;
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
    write_bytes(bytemuck::cast_slice(values), w, label)
}

fn write_bytes(bytes: &[u8], w: &mut dyn Write, label: &Path) -> Result<u64, ReadError> {
    w.write_all(bytes).map_err(|e| ReadError::io(label, e))?;
    Ok(bytes.len() as u64)
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
    if float_dtype(t.ty).is_some() {
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

/// A GGUF tensor's torch shape: `comfy.gguf.orig_shape.<name>` (an INT32 array, as
/// ComfyUI-GGUF's `get_orig_shape` requires) when present, else `ne` reversed; the element
/// counts must agree.
fn gguf_shape(file: &GgufFile, name: &str, ne: &[u64]) -> Result<Vec<usize>, ReadError> {
    let stored = torch_shape(ne);
    let key = format!("{GGUF_ORIG_SHAPE}{name}");
    let Some(v) = file.header().get(&key) else {
        return Ok(stored);
    };
    let bad = |reason: String| ReadError::Quantized {
        path: file.path().to_path_buf(),
        tensor: name.to_string(),
        format: GGUF.into(),
        reason,
    };
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
