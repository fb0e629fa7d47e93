//! Each deployment format of a quantized checkpoint, once: its name and its file convention
//! (markers, side tensors, scale names: `convention`), and reading a quantized checkpoint as
//! a base (`base`: every tensor decoded to f32 exactly as the runtime that loads the format
//! does, or the input refused).
//!
//! Nothing outside this module spells a marker or a scale name. Does not own: the numeric
//! codecs (fp8, ggml blocks, K-quants: `codec`), the containers (safetensors header,
//! GGUF: `io`), what the tensors mean (`model`).

pub mod base;
pub mod convention;
pub mod decode;
pub mod encode;
pub mod inspect;
pub mod layer_format;
pub mod layers;
pub mod rules;
