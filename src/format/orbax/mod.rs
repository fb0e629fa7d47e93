//! Orbax checkpoints: the container layer (reading what Orbax writes, and pure encoders for
//! a deterministic writer). No pipeline, CLI or manifest integration lives here.
//!
//! Owns: the OCDBT binary format (`ocdbt`: manifest, version-tree and B+tree nodes,
//! data-file tables, crc32c, zstd node compression), key-value access to an item folder in
//! both layouts (`db`: plain files, or an OCDBT database with per-process databases reached
//! through base paths; out-of-line values read by offset/length, bounds-checked against the
//! data file), zarr v2 / v3 arrays and their chunk reassembly, whole or streamed row by row
//! (`zarr`), Orbax's JSON files (`metadata`: `_METADATA`, `_CHECKPOINT_METADATA`), path
//! resolution of a CheckpointManager root, step or item (`checkpoint`), and the encoders
//! (`encode`). Does not own: Orbax checkpoints as inputs (`io::orbax`), what the trees mean
//! (model/adapter code), staging, hashing.
//!
//! Follows tensorstore `google/tensorstore@bc4fbc11` (`kvstore/ocdbt/format/`, `index.rst`;
//! where the two differ the code wins, see `ocdbt`'s doc), orbax `google/orbax@3ff7b24a`,
//! and the files orbax-checkpoint 0.12.8 + tensorstore 0.1.86 write (golden/orbax/, made by
//! golden/orbax_golden.py).
//!
//! Hand-written because no Rust crate reads Orbax or OCDBT: `zarrs` has no OCDBT store and
//! does not know Orbax's zarr v2 `bfloat16` dtype. Only zstd (`zstd` crate, libzstd) and
//! CRC-32C (`crc32c` crate) come from crates. Every parser here takes bytes, uses checked
//! arithmetic, bounds every count and length by what the bytes can hold, verifies every
//! crc32c, and returns one `FormatError` variant per malformation; `OrbaxError` adds the
//! file and the key.

pub mod checkpoint;
pub mod db;
pub mod encode;
pub mod error;
pub mod metadata;
pub mod ocdbt;
pub mod zarr;

pub use checkpoint::{Item, Level, Resolved, read_checkpoint_metadata, resolve};
pub use db::{Ocdbt, Store, Value};
pub use error::{FormatError, OrbaxError};
pub use metadata::{CheckpointMetadata, KeyType, Leaf, PathKey, TreeMetadata};
pub use zarr::{ArrayMeta, ArrayReader, Rows, ZarrVersion};
