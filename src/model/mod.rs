//! Model families wanbake knows: their configs, parameter tables and fingerprints.
//!
//! Owns: WAN configs and parameter lists (`wan`). Naming conventions other than diffusers
//! live in `layout`; adapter naming lives in `adapter`.

pub mod wan;
