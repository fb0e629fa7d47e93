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
//!
//! A decoded input becomes an unnamed scratch safetensors file (`io::scratch`), written one
//! chunk at a time: memory stays per chunk, the disk holds the decoded tensors once per
//! process. Formats recognised but not decoded yet are refused, never guessed.
//!
//! Does not own: the names and the recognition (`quant::convention`), the codecs
//! (`io::quant`), the containers (`io::file`, `io::gguf`).

use std::io::Write;
use std::path::{Path, PathBuf};

use super::convention::{self, Format, SCALE_INPUT, SCALE_WEIGHT};
use crate::io::checkpoint::{Checkpoint, Component, QuantizedInput, SourceKind, TensorSet};
use crate::io::dtype::widen_to_f32;
use crate::io::gguf::{GgufFile, Value, single_gguf_in, torch_shape};
use crate::io::header_layout::{HeaderLayout, PlannedTensor};
use crate::io::quant::ggml::{self, GgmlType};
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

/// The file of a component that holds `name` (for messages); its first file for a header
/// key.
fn file_of(set: &TensorSet, name: &str) -> PathBuf {
    match set.get(name) {
        Some(t) => t.file.path().to_path_buf(),
        None => set
            .files()
            .first()
            .map(|f| f.path().to_path_buf())
            .unwrap_or_default(),
    }
}

/// Recognises a component's format and decodes it in place; `None` for plain floats.
fn decode_component(
    comp: &mut Component,
    files: &[PathBuf],
) -> Result<Option<QuantizedInput>, ReadError> {
    let set = &comp.tensors;
    let mut metadata = std::collections::BTreeMap::new();
    for f in set.files() {
        metadata.extend(f.metadata().clone());
    }
    let format = convention::recognise(set, &metadata)
        .map_err(|u| refuse(&file_of(set, &u.tensor), &u.tensor, u.format, u.reason))?;
    let input = |details, decoded, consumed| QuantizedInput {
        format: format.name().to_string(),
        details,
        decoded,
        consumed,
        files: files.to_vec(),
    };
    match format {
        Format::Plain => Ok(None),
        Format::PlainFp8 => {
            let n = set.tensors().filter(|t| is_fp8(t.view.dtype)).count();
            let details = vec![format!("{n} fp8 tensors without scales, decoded by a cast")];
            Ok(Some(input(details, n, Vec::new())))
        }
        Format::ScaledFp8 => {
            let plan = ScaledFp8Plan::new(set)?;
            let details = plan.details();
            let (decoded, consumed) = (plan.scales.len(), plan.consumed.clone());
            comp.tensors = plan.decode(set, &metadata)?;
            Ok(Some(input(details, decoded, consumed)))
        }
        Format::ComfyMixed | Format::LightX2v => {
            let tensor = set
                .names()
                .find(|n| convention::is_side_tensor(n))
                .unwrap_or(convention::QUANT_METADATA)
                .to_string();
            let file = file_of(set, &tensor);
            Err(refuse(
                &file,
                &tensor,
                format.name(),
                "this format is recognised but wanbake does not decode it yet; nothing was \
                 written",
            ))
        }
    }
}

fn is_fp8(d: DType) -> bool {
    matches!(d, DType::F8_E4M3 | DType::F8_E5M2)
}

/// What decoding a legacy scaled-fp8 state dict takes: the fp8 type its marker names, each
/// scaled weight with its f32 scale, and the side tensors consumed.
struct ScaledFp8Plan {
    marker: String,
    fp8: DType,
    full_precision_mm: bool,
    /// (weight name, scale as f32).
    scales: Vec<(String, f32)>,
    consumed: Vec<String>,
}

impl ScaledFp8Plan {
    /// Checks the state dict the way ComfyUI loads it and refuses what it would mis-load.
    fn new(set: &TensorSet) -> Result<ScaledFp8Plan, ReadError> {
        let format = Format::ScaledFp8.name();
        let marker = convention::scaled_fp8_marker(set)
            .unwrap_or_default()
            .to_string();
        let m = set.get(&marker).map(|t| t.view);
        let Some(m) = m else {
            return Err(refuse(Path::new(""), &marker, format, "marker vanished"));
        };
        let fp8 = match m.dtype {
            DType::F8_E4M3 | DType::F32 => DType::F8_E4M3,
            DType::F8_E5M2 => DType::F8_E5M2,
            other => {
                return Err(refuse(
                    &file_of(set, &marker),
                    &marker,
                    format,
                    format!("the marker's dtype names the fp8 type; {other} is none"),
                ));
            }
        };
        let mut plan = ScaledFp8Plan {
            full_precision_mm: m.numel() == 2,
            marker: marker.clone(),
            fp8,
            scales: Vec::new(),
            consumed: vec![marker],
        };
        for t in set.tensors() {
            plan.check(set, t.view)?;
        }
        Ok(plan)
    }

    /// One tensor of the state dict: a scale is read, an activation scale consumed, any other
    /// side tensor or coded weight refused.
    fn check(&mut self, set: &TensorSet, v: TensorView<'_>) -> Result<(), ReadError> {
        let format = Format::ScaledFp8.name();
        let file = file_of(set, v.name);
        let name = v.name;
        if name == self.marker {
            return Ok(());
        }
        if name.ends_with(SCALE_INPUT) {
            self.consumed.push(name.to_string());
            return Ok(());
        }
        if let Some(layer) = name.strip_suffix(SCALE_WEIGHT) {
            let wname = format!("{layer}.weight");
            let Some(w) = set.get(&wname).map(|t| t.view) else {
                return Err(refuse(
                    &file,
                    name,
                    format,
                    format!("no `{wname}` beside it"),
                ));
            };
            if w.dtype != self.fp8 {
                return Err(refuse(
                    &file,
                    &wname,
                    format,
                    format!(
                        "has a `{SCALE_WEIGHT}` but is stored as {}, not the marker's {} \
                         (ComfyUI would cast it to fp8 unscaled and mis-load it)",
                        w.dtype, self.fp8
                    ),
                ));
            }
            let values = match (v.dtype.is_float() && v.numel() == 1, v.to_f32()) {
                (true, Ok(values)) => values,
                _ => {
                    return Err(refuse(
                        &file,
                        name,
                        format,
                        format!(
                            "expected one float value (shape [] or [1]), found {} {:?}",
                            v.dtype, v.shape
                        ),
                    ));
                }
            };
            self.scales.push((wname, values[0]));
            self.consumed.push(name.to_string());
            return Ok(());
        }
        if convention::is_side_tensor(name) {
            return Err(refuse(
                &file,
                name,
                format,
                "is a side tensor of another quantized format; a scaled-fp8 file holds only \
                 `scale_weight` and `scale_input`",
            ));
        }
        if convention::is_coded(v.dtype) {
            return Err(refuse(
                &file,
                name,
                format,
                format!(
                    "is stored as {} codes, which scaled fp8 does not define",
                    v.dtype
                ),
            ));
        }
        Ok(())
    }

    fn details(&self) -> Vec<String> {
        let mut d = vec![format!(
            "marker `{}` ({}), {} scaled fp8 weights",
            self.marker,
            self.fp8,
            self.scales.len()
        )];
        if self.full_precision_mm {
            d.push("2-element marker: ComfyUI runs these layers with full-precision matmul".into());
        }
        d
    }

    /// Writes the decoded state dict into a scratch file: scaled weights as F32, side
    /// tensors dropped, everything else byte for byte.
    fn decode(
        &self,
        set: &TensorSet,
        metadata: &std::collections::BTreeMap<String, String>,
    ) -> Result<TensorSet, ReadError> {
        let first = file_of(set, "");
        let scale_of = |name: &str| self.scales.iter().find(|(n, _)| n == name).map(|s| s.1);
        let planned: Vec<PlannedTensor> = set
            .tensors()
            .filter(|t| !self.consumed.iter().any(|c| c == t.view.name))
            .map(|t| PlannedTensor {
                name: t.view.name.to_string(),
                dtype: match scale_of(t.view.name) {
                    Some(_) => DType::F32,
                    None => t.view.dtype,
                },
                shape: t.view.shape.to_vec(),
            })
            .collect();
        let label = scratch::label("fp8", &first);
        let layout =
            HeaderLayout::build(&planned, metadata).map_err(|e| ReadError::Unsupported {
                path: first.clone(),
                reason: format!("cannot lay the decoded tensors out: {e}"),
            })?;
        let key = scratch::key_of(&first, "scaled-fp8")?;
        let file = scratch::decoded_once(key, || {
            scratch::write(&layout, &label, |info, w| {
                let Some(t) = set.get(&info.name) else {
                    return Ok(0);
                };
                match scale_of(&info.name) {
                    Some(s) => write_scaled(t.view, s, w, &label),
                    None => write_bytes(t.view.bytes, w, &label),
                }
            })
        })?;
        Ok(TensorSet::from_opened(SafetensorsFile::from_file(
            &file, &label,
        )?))
    }
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
        widen_to_f32(v.dtype, codes, out).map_err(|e| ReadError::Tensor {
            path: label.to_path_buf(),
            tensor: v.name.to_string(),
            reason: e.to_string(),
        })?;
        for x in out.iter_mut() {
            *x *= scale;
        }
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
