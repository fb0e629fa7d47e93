//! Reading checkpoints: files, maps and inputs.
//!
//! Owns: read-only memory maps and the guard against inputs changing under them (`mmap`,
//! the only `unsafe` of this layer), single safetensors files (`file`), multi-file
//! checkpoints and folders (`checkpoint`), GGUF files on disk (`gguf`), Orbax checkpoints as
//! inputs (`orbax`), unnamed scratch files an input is decoded into (`scratch`), hashing
//! (`digest`) of files and of inputs, with their cache (`input_hash`), the leaf of durable
//! single-file writes (`durable`) and where a Hugging Face cache reference points (`hub`).
//! Does not own: the containers' bytes (`format`), the numbers (`codec`), writing a release
//! (`release`), what a quantized format's tensors mean and how they decode (`quant`), what
//! tensors mean (`model`, `adapter`) or how they are computed (`merge`).

pub mod checkpoint;
pub mod digest;
pub mod durable;
pub mod file;
pub mod gguf;
pub mod hub;
pub mod input_hash;
pub mod mmap;
pub mod orbax;
pub mod scratch;

pub use crate::codec::dtype::{self, DType};
pub use checkpoint::{Checkpoint, Component, TensorRef, TensorSet};
pub use file::{ReadError, SafetensorsFile, TensorView};
