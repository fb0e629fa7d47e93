//! Quantized tensor encodings for deployment outputs: ComfyUI scaled fp8 (`fp8`) and the ggml
//! types of GGUF files (`ggml`), as pure functions from `f32` to bytes and back.
//!
//! Owns: the exact rounding of each encoding, bit-exact to the reference implementations
//! named in spec quant_formats.md (torch's `float8_e4m3fn` cast, gguf-py 0.19's quantizers),
//! and the inverse decodings the loaders apply. Does not own: which tensor gets which
//! encoding, file containers, or where the bytes go.

pub mod fp8;
pub mod ggml;
pub mod kquant;
