//! File formats as bytes: the containers wanbake reads and writes, parsed from untrusted
//! bytes (every count, length and offset checked) and laid out for writing.
//!
//! Owns: the safetensors header parser (`header`) and the canonical header wanbake writes
//! (`header_layout`), the GGUF container (`gguf`), and the Orbax container layer (`orbax`:
//! OCDBT, zarr, Orbax's JSON, path resolution, the deterministic encoders). Does not own: the
//! numbers inside the tensors (`codec`), mapping and reading files as checkpoints (`io`), or
//! writing releases (`release`).

pub mod gguf;
pub mod header;
pub mod header_layout;
pub mod orbax;

pub use header::{FormatError, Header, TensorInfo};
pub use header_layout::PlannedTensor;
