//! The one home of model facts: what the models wanbake knows are made of, how their
//! checkpoints name and store them, and how to recognise them. Imports only `io`.
//!
//! Owns: the pipeline's first stage, a checkpoint with each component's layout and
//! identity found once (`base_model`); the four WAN layouts and which one a checkpoint is
//! in (`wan_layout`); the one name table of WAN parameters across those layouts, with each parameter's shape in config
//! symbols and the part of the model it belongs to (`wan_names`); WAN configs, the released
//! variants and the parameter list a config implies, derived from the name table (`wan`);
//! where each canonical parameter lives in a checkpoint of any layout, and the config its
//! shapes imply (`read_plan`), with why such a plan fails (`plan_error`); the tensor
//! transforms between PyTorch and Flax layouts and their conversion kernels (`transform`);
//! SA3 sizes and shapes (`sa3`); Wan2.2-Animate's config, module prefixes and blur-kernel constants (`animate`); recognising a released model from tensor names and shapes
//! (`fingerprint`); and which encoding each tensor gets in a quantized output
//! (`quant_rules`). Does not own: writing a checkpoint in another layout (`layout`), or
//! adapter naming (`adapter`).

pub mod animate;
pub mod base_model;
pub mod fingerprint;
pub mod maxdiffusion;
pub mod plan_error;
pub mod read_plan;
pub mod sa3;
pub mod transform;
pub mod wan;
pub mod wan_layout;
pub mod wan_names;
