//! wanbake: bake WAN / Stable Audio 3 checkpoints with LoRA-family adapters into exact,
//! streaming, hash-verified releases.
//!
//! The binary (`src/main.rs`, `src/cli/`, not part of this library) only parses arguments
//! and prints; everything that does work lives in this library, one module per concept.

#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod adapter;
pub mod backend;
pub mod bake;
pub mod codec;
pub mod convert;
pub mod error_text;
pub mod extract;
pub mod format;
pub mod gpu;
pub mod human;
pub mod inspect;
pub mod io;
pub mod layout;
pub mod linalg;
pub mod merge;
pub mod model;
pub mod names;
pub mod pipeline;
pub mod progress;
pub mod quant;
pub mod recipe;
pub mod release;
pub mod restack;
pub mod rng;
pub mod runner;
pub mod signing;
pub mod synth;
pub mod translation;
