//! Input and output of safetensors checkpoints.
//!
//! Owns: element types and their conversions (`dtype`), the header parser and canonical
//! header layout (`header`), read-only memory maps (`mmap`, the only `unsafe` of this layer),
//! single files (`file`), multi-file checkpoints and folders (`checkpoint`), hashing
//! (`digest`), what an output will contain (`writer`) and the atomic, durable writing of it
//! (`staging`), the GGUF container (`gguf`) and the quantized encodings (`quant`: scaled fp8,
//! ggml block types). Does not own: what tensors mean (`model`, `adapter`) or how they are
//! computed (`merge`).

pub mod checkpoint;
pub mod digest;
pub mod dtype;
pub mod file;
pub mod gguf;
pub mod header;
pub mod mmap;
pub mod quant;
pub mod staging;
pub mod writer;

pub use checkpoint::{Checkpoint, Component, TensorRef, TensorSet};
pub use dtype::DType;
pub use file::{ReadError, SafetensorsFile, TensorView};
pub use header::{FormatError, Header, PlannedTensor, TensorInfo};
pub use staging::{Staging, WriteError};
pub use writer::{ComponentOutput, OutputPlan, Slot};
