//! A minimal but exact WAN transformer on CPU: diffusers' `WanTransformer3DModel` forward
//! in f32 for every released config (T2V, Wan2.1 I2V/FLF2V with the CLIP image branch,
//! Wan2.2 TI2V with per-token timesteps, Wan2.2 A14B experts), the single forward of
//! `WanVACETransformer3DModel` (VACE) and of `SkyReelsV2Transformer3DModel` (fps condition,
//! per-frame diffusion-forcing timesteps), and the flow-matching Euler
//! sampler with batched classifier-free guidance. It exists to check baked checkpoints
//! against golden outputs of the reference implementation.
//!
//! Module map: `tensor` (the activation type), `ops` (matmul and elementwise kernels),
//! `rope`, `embed` (patch, time, text and image embeddings), `attention`, `block`,
//! `forward` (the model), `vace` (the VACE context blocks and their hints), `job` (one run: a forward or a sampling loop), `scheduler` (FlowMatchEulerDiscreteScheduler), `sampler` (CFG
//! loop and expert switch), `weights` (the `WeightSource` trait, checkpoints of any layout
//! through `model::read_plan::ReadPlan`, in-memory weights),
//! `quant_weights` (quantized checkpoints of every format `quant::decode` reads, per tensor),
//! `model_dir` (what `--model` may name), `inputs` and `output` (the files of `wanbake
//! run`), `error`.
//!
//! Memory: weights are never copied up front. Each layer asks its `WeightSource` for its
//! tensors when it runs; a checkpoint's tensor is copied or widened (bf16, f16, fp8 with its
//! scale, GGUF blocks) to f32 from the memory map, its mapped pages are dropped at once, and
//! the f32 copy is dropped after the layer, so the resident set is one layer's weights
//! whatever the model's size (a mapped page that stayed resident counted in the RSS too;
//! BENCHMARKS.md, "Checks at real size").
//!
//! Determinism: results do not depend on the number of threads. Every parallel kernel
//! (matmul tiles, attention tasks, row-wise norms) works on a grid fixed by constants, and
//! each piece is computed sequentially (`faer::Par::Seq`), so the same inputs give the same
//! bits on 1 or N threads on one machine. faer's kernels are chosen by CPU features, so
//! bits may differ between machines with different SIMD support.

pub mod attention;
pub mod block;
pub mod embed;
pub mod error;
pub mod forward;
pub mod inputs;
pub mod job;
pub mod model_dir;
pub mod ops;
pub mod output;
pub mod quant_weights;
pub mod rope;
pub mod sampler;
pub mod scheduler;
pub mod tensor;
pub mod vace;
pub mod weights;

pub use error::RunError;
pub use forward::{Context, ForwardInputs, TokenGeometry, WanTransformer};
pub use inputs::RunInputs;
pub use job::{RunOutput, RunSettings, run_models};
pub use model_dir::ModelSet;
pub use sampler::{Experts, SampleInputs, SampleOptions, StepReport, sample};
pub use scheduler::FlowMatchEuler;
pub use tensor::Tensor;
pub use vace::Control;
pub use weights::{CheckpointWeights, ConfigSource, MemoryWeights, WeightSource};
