//! One run of a model set on an inputs file, as `wanbake run` and bake checks do it: one
//! conditional forward (`steps == 0`, result `noise_pred`) or N flow-matching Euler steps
//! with CFG (result `latents`).
//!
//! Owns: `RunSettings`, `RunOutput`, `run_models`, and the expert choice for a single
//! forward of a two-expert model. Does not own: the model (`forward`), the sampling loop
//! (`sampler`), files (`inputs`, `output`, the CLI).

use std::path::Path;
use std::time::Instant;

use super::inputs::with_origin;
use super::scheduler::NUM_TRAIN_TIMESTEPS;
use super::{
    Experts, ForwardInputs, ModelSet, RunError, RunInputs, SampleInputs, SampleOptions, StepReport,
    Tensor, WanTransformer, sample,
};

/// How to run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RunSettings {
    /// 0: one conditional forward at the inputs' timestep; N: N Euler steps.
    pub steps: usize,
    /// Scheduler shift.
    pub shift: f64,
    /// Guidance of `transformer`.
    pub guidance: f64,
    /// Guidance of `transformer_2` (default: `guidance`).
    pub guidance_2: Option<f64>,
    /// Expert switch; default: the model set's `boundary_ratio`.
    pub boundary_ratio: Option<f64>,
}

/// What a run produced.
#[derive(Debug)]
pub struct RunOutput {
    /// `noise_pred` (forward) or `latents` (sampling).
    pub name: &'static str,
    /// The result.
    pub tensor: Tensor,
    /// One report per forward step.
    pub steps: Vec<StepReport>,
    /// The expert switch used.
    pub boundary_ratio: Option<f64>,
}

/// Runs `models` on `inputs` (read from `inputs_path`, named in error messages).
pub fn run_models(
    models: &ModelSet<'_>,
    inputs: &RunInputs,
    inputs_path: &Path,
    s: &RunSettings,
) -> Result<RunOutput, RunError> {
    let transformer = WanTransformer::new(models.transformer.as_ref())?;
    let transformer_2 = match &models.transformer_2 {
        Some(t) => Some(WanTransformer::new(t.as_ref())?),
        None => None,
    };
    let experts = Experts {
        transformer,
        transformer_2,
        boundary_ratio: s.boundary_ratio.or(models.boundary_ratio),
    };
    experts.check()?;
    let mut steps = Vec::new();
    let (name, tensor) = if s.steps == 0 {
        let started = Instant::now();
        let (model, expert) = pick_for_forward(&experts, &inputs.timestep)?;
        let out = model
            .forward(&ForwardInputs {
                hidden_states: &inputs.hidden_states,
                timestep: &inputs.timestep,
                encoder_hidden_states: &inputs.encoder_hidden_states,
                encoder_hidden_states_image: inputs.encoder_hidden_states_image.as_ref(),
                control: inputs.control(),
                fps: inputs.fps.as_ref(),
            })
            .map_err(|e| with_origin(e, inputs_path))?;
        steps.push(StepReport {
            index: 0,
            timestep: inputs.timestep.data.first().copied().unwrap_or(0.0),
            expert,
            guidance: None,
            seconds: started.elapsed().as_secs_f64(),
        });
        ("noise_pred", out)
    } else {
        let forward_only = [
            (
                "control_hidden_states",
                inputs.control_hidden_states.is_some(),
            ),
            ("fps", inputs.fps.is_some()),
        ];
        if let Some((name, _)) = forward_only.iter().find(|(_, given)| *given) {
            return Err(with_origin(
                RunError::input(
                    name,
                    "read by a single forward only (--steps 0); the runner does not sample \
                     with VACE control or SkyReels-V2 fps",
                ),
                inputs_path,
            ));
        }
        let opts = SampleOptions {
            steps: s.steps,
            shift: s.shift,
            guidance: s.guidance,
            guidance_2: s.guidance_2,
        };
        let sample_inputs = SampleInputs {
            hidden_states: &inputs.hidden_states,
            timestep: &inputs.timestep,
            encoder_hidden_states: &inputs.encoder_hidden_states,
            negative_encoder_hidden_states: inputs.negative_encoder_hidden_states.as_ref(),
            encoder_hidden_states_image: inputs.encoder_hidden_states_image.as_ref(),
        };
        let mut record = |r: &StepReport| steps.push(r.clone());
        let out = sample(&experts, &sample_inputs, &opts, &mut record)
            .map_err(|e| with_origin(e, inputs_path))?;
        ("latents", out)
    };
    Ok(RunOutput {
        name,
        tensor,
        steps,
        boundary_ratio: experts.boundary_ratio,
    })
}

/// For a single forward of a two-expert model, the pipeline's rule on the inputs' timestep
/// (every value must fall on the same side of the boundary).
fn pick_for_forward<'e, 'w>(
    experts: &'e Experts<'w>,
    timestep: &Tensor,
) -> Result<(&'e WanTransformer<'w>, &'static str), RunError> {
    let (Some(low), Some(ratio)) = (&experts.transformer_2, experts.boundary_ratio) else {
        return Ok((&experts.transformer, "transformer"));
    };
    let boundary = (ratio * NUM_TRAIN_TIMESTEPS as f64) as f32;
    let high = timestep.data.iter().filter(|&&t| t >= boundary).count();
    match high {
        0 => Ok((low, "transformer_2")),
        n if n == timestep.numel() => Ok((&experts.transformer, "transformer")),
        _ => Err(RunError::input(
            "timestep",
            format!(
                "values fall on both sides of the expert boundary {boundary}; run them separately"
            ),
        )),
    }
}
