//! Model families wanbake knows: their configs, parameter tables and fingerprints.
//!
//! Owns: WAN configs and parameter lists (`wan`), SA3 sizes and shapes (`sa3`),
//! recognising a released model from tensor names and shapes (`fingerprint`), which
//! encoding each tensor gets in a quantized output (`quant_rules`), and the tensor
//! transforms between PyTorch and Flax layouts with their conversion kernels (`transform`),
//! the four WAN layouts and which one a checkpoint is in (`wan_layout`), the one name table
//! of WAN parameters across them (`wan_names`), where each canonical parameter lives in a
//! checkpoint of any layout (`read_plan`), and why such a plan fails (`plan_error`).
//! Writing a checkpoint in another layout lives in `layout`; adapter naming lives in
//! `adapter`.

pub mod fingerprint;
pub mod plan_error;
pub mod quant_rules;
pub mod read_plan;
pub mod sa3;
pub mod transform;
pub mod wan;
pub mod wan_layout;
pub mod wan_names;
