//! A quantized checkpoint as a base: every command that reads a base (`convert`, `merge`,
//! `restack`, `extract --base`, `bake`, `inspect --base`) opens it here, and gets either the
//! tensors decoded to f32 exactly as the runtime that loads the format does, or a refusal
//! naming the file, the tensor and the format. A marked tensor is never passed on as its raw
//! codes.
//!
//! How each format decodes: `quant::decode`.
//!
//! A decoded input becomes an unnamed scratch safetensors file (`io::scratch`), written one
//! chunk at a time: memory stays per chunk, the disk holds the decoded tensors once per
//! process. Anything the formats mark that the plan cannot account for is refused, never
//! guessed.
//!
//! Does not own: the names and the recognition (`quant::convention`), the decoding of a
//! tensor (`quant::decode`), the codecs (`codec`), the containers (`io::file`, `io::gguf`).

use std::path::{Path, PathBuf};

use super::convention::QUANT_METADATA;
use super::decode::{self, QuantSource, Recognised};
use crate::format::header_layout::HeaderLayout;
use crate::io::checkpoint::{Checkpoint, Component, QuantizedInput, SourceKind, TensorSet};
use crate::io::gguf::single_gguf_in;
use crate::io::{ReadError, SafetensorsFile, scratch};
use crate::model::base_model::BaseModel;

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
        let Some(q) = decode_component(comp)? else {
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
    ck.quantized = found.map(|q| QuantizedInput { files, ..q });
    Ok(ck)
}

/// Recognises a component's format and decodes it in place; `None` for plain floats. The
/// caller fills in the input's files.
fn decode_component(comp: &mut Component) -> Result<Option<QuantizedInput>, ReadError> {
    let decoding = match decode::recognise_set(&comp.tensors)? {
        Recognised::Plain => return Ok(None),
        Recognised::Cast(n) => {
            return Ok(Some(QuantizedInput {
                format: super::convention::Format::PlainFp8.name().to_string(),
                details: vec![format!("{n} fp8 tensors without scales, decoded by a cast")],
                decoded: n,
                consumed: Vec::new(),
                files: Vec::new(),
            }));
        }
        Recognised::Decode(d) => d,
    };
    let mut metadata = decode::merged_metadata(&comp.tensors);
    metadata.remove(QUANT_METADATA);
    let set = std::mem::take(&mut comp.tensors);
    let source = QuantSource::stored(set, decoding);
    comp.tensors = to_scratch(&source, &metadata)?;
    Ok(Some(input_of(&source)))
}

/// What the report says of a decoded source.
fn input_of(source: &QuantSource) -> QuantizedInput {
    QuantizedInput {
        format: source.format_name().to_string(),
        details: source.details(),
        decoded: source.decoded_count(),
        consumed: source.consumed(),
        files: source.files(),
    }
}

/// Writes the decoded state dict into a scratch file (decoded once per process): quantized
/// weights as F32, side tensors dropped, everything else byte for byte.
fn to_scratch(
    source: &QuantSource,
    metadata: &std::collections::BTreeMap<String, String>,
) -> Result<TensorSet, ReadError> {
    let first = source.path().to_path_buf();
    let label = scratch::label(source.format_name(), &first);
    let layout =
        HeaderLayout::build(&source.planned(), metadata).map_err(|e| ReadError::Unsupported {
            path: first.clone(),
            reason: format!("cannot lay the decoded tensors out: {e}"),
        })?;
    let mut extra = source.format_name().to_string();
    for f in source.files().iter().skip(1) {
        extra.push_str(&format!("|{}", f.display()));
    }
    let key = scratch::key_of(&first, &extra)?;
    let file = scratch::decoded_once(key, || {
        scratch::write(&layout, &label, |info, w| {
            source.write_tensor(&info.name, w, &label)
        })
    })?;
    Ok(TensorSet::from_opened(SafetensorsFile::from_file(
        &file, &label,
    )?))
}

/// A GGUF file (or a folder holding one) as a base checkpoint.
fn open_gguf(given: &Path, path: &Path) -> Result<Checkpoint, ReadError> {
    let source = QuantSource::gguf(path)?;
    let tensors = to_scratch(&source, &Default::default())?;
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
            tensors,
            sidecars: Vec::new(),
        }],
        root_files: Vec::new(),
        ignored: Vec::new(),
        carried: Vec::new(),
        orbax: None,
        quantized: Some(input_of(&source)),
    })
}
