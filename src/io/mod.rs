//! Input and output of safetensors checkpoints.
//!
//! Owns: element types and their conversions (`dtype`), the header parser and canonical
//! header layout (`header`), read-only memory maps (`mmap`, the only `unsafe` of this layer),
//! single files (`file`), multi-file checkpoints and folders (`checkpoint`), and the
//! streaming, atomic writer (`writer`, `staging`). Does not own: what tensors mean (`model`,
//! `adapter`) or how they are computed (`merge`).

pub mod dtype;
pub mod file;
pub mod header;
pub mod mmap;

pub use dtype::DType;
pub use file::{ReadError, SafetensorsFile, TensorView};
pub use header::{FormatError, Header, TensorInfo};
