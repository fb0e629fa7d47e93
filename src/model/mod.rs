//! Model families wanbake knows: their configs, parameter tables and fingerprints.
//!
//! Owns: WAN configs and parameter lists (`wan`), SA3 sizes and shapes (`sa3`),
//! recognising a released model from tensor names and shapes (`fingerprint`), which
//! encoding each tensor gets in a quantized output (`quant_rules`), and the tensor
//! transforms between PyTorch and Flax layouts with their conversion kernels (`transform`),
//! the four WAN layouts (`wan_layout`) and the one name table of WAN parameters across
//! them (`wan_names`). Converting checkpoints between layouts lives in `layout`; adapter
//! naming lives in `adapter`.

pub mod fingerprint;
pub mod quant_rules;
pub mod sa3;
pub mod transform;
pub mod wan;
pub mod wan_layout;
pub mod wan_names;
