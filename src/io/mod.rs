//! Input and output of checkpoints: files, maps, containers and the release writer.
//!
//! Owns: the parser of untrusted safetensors headers (`header`), the canonical header wanbake
//! writes (`header_layout`), read-only memory maps and the guard against inputs changing
//! under them (`mmap`, the only `unsafe` of this layer), single files (`file`), multi-file
//! checkpoints and folders (`checkpoint`), unnamed scratch files an input is decoded into
//! (`scratch`), hashing of outputs (`digest`) and of inputs, with their cache
//! (`input_hash`), what an output will contain (`writer`), the files it carries over
//! unchanged from its input (`carry`), the atomic, durable writing of it (`staging`) through
//! an ordered window that hashes and writes each byte once (`ordered`), the GGUF container
//! (`gguf`), the Orbax container (`orbax`) and where a Hugging Face cache reference points
//! (`hub`). Does not own: the numbers (`codec`), what a quantized format's tensors mean and
//! how they decode (`quant`), what tensors mean (`model`, `adapter`) or how they are
//! computed (`merge`).

pub mod carry;
pub mod checkpoint;
pub mod digest;
pub mod durable;
pub mod file;
pub mod gguf;
pub mod header;
pub mod header_layout;
pub mod hub;
pub mod input_hash;
pub mod mmap;
pub mod orbax;
pub mod ordered;
pub mod scratch;
pub mod staging;
pub mod writer;

pub use crate::codec::dtype::{self, DType};
pub use checkpoint::{Checkpoint, Component, TensorRef, TensorSet};
pub use file::{ReadError, SafetensorsFile, TensorView};
pub use header::{FormatError, Header, TensorInfo};
pub use header_layout::PlannedTensor;
pub use staging::{Staging, WriteError};
pub use writer::{ComponentOutput, OutputPlan, Slot};
