//! The N-step flow-matching Euler sampling loop of diffusers' Wan pipelines (spec wan.md
//! §3.3, §3.4), with classifier-free guidance batched into one forward and the Wan2.2
//! A14B expert switch.
//!
//! Owns: `Experts` (the high-noise `transformer`, the optional low-noise `transformer_2`
//! and the boundary), `SampleOptions`, `SampleInputs` and `sample`. Semantics follow
//! `WanPipeline.__call__`: guidance is on when `guidance > 1` (the first scale, as
//! `do_classifier_free_guidance` reads it); at step i the expert is `transformer` when
//! `t_i ≥ boundary_ratio·1000` (compared in f32, as torch compares a float tensor with a
//! Python float) with `guidance`, else `transformer_2` with `guidance_2` (default
//! `guidance`); `v = v_u + g·(v_c − v_u)` in f32; then the scheduler's Euler step. For I2V
//! models (C_in > C_out) the channels after the first C_out of `hidden_states` are the
//! fixed condition, concatenated after the latents at every step (as
//! `WanImageToVideoPipeline` does); the result has C_out channels. When the inputs'
//! timestep is per token (B, S), every token gets t_i (Wan2.2 TI2V text-to-video with
//! `expand_timesteps`, whose mask is all ones). VACE and fps-conditioned SkyReels-V2 models
//! are refused here: the runner checks them by a single forward only. Does not own: the forward (`runner::forward`).

use std::time::Instant;

use super::error::RunError;
use super::forward::{Context, WanTransformer};
use super::scheduler::{FlowMatchEuler, NUM_TRAIN_TIMESTEPS};
use super::tensor::Tensor;

/// One or two transformers and the rule that picks between them.
#[derive(Debug)]
pub struct Experts<'w> {
    /// `transformer`: the only model, or the high-noise expert of Wan2.2 A14B.
    pub transformer: WanTransformer<'w>,
    /// `transformer_2`: the low-noise expert.
    pub transformer_2: Option<WanTransformer<'w>>,
    /// `boundary_ratio`; required exactly when `transformer_2` is present.
    pub boundary_ratio: Option<f64>,
}

/// Sampling settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SampleOptions {
    /// Number of Euler steps N ≥ 1.
    pub steps: usize,
    /// Scheduler shift.
    pub shift: f64,
    /// Guidance scale of `transformer`; CFG runs when it is > 1.
    pub guidance: f64,
    /// Guidance scale of `transformer_2` (default: `guidance`).
    pub guidance_2: Option<f64>,
}

/// The tensors sampling starts from.
#[derive(Clone, Copy, Debug)]
pub struct SampleInputs<'a> {
    /// Initial latents (B, C_out, F, H, W), followed for I2V models by the condition
    /// channels: (B, C_in, F, H, W).
    pub hidden_states: &'a Tensor,
    /// Its shape selects per-item (B) or per-token (B, S) timesteps; its values are unused.
    pub timestep: &'a Tensor,
    /// Conditional text embeds (B, L, T).
    pub encoder_hidden_states: &'a Tensor,
    /// Unconditional text embeds (B, L, T), required when guidance > 1.
    pub negative_encoder_hidden_states: Option<&'a Tensor>,
    /// Image embeds for Wan2.1 I2V/FLF2V, shared by both CFG halves.
    pub encoder_hidden_states_image: Option<&'a Tensor>,
}

/// What happened at one step, for timing reports.
#[derive(Clone, Debug, PartialEq)]
pub struct StepReport {
    /// Step index i.
    pub index: usize,
    /// t_i.
    pub timestep: f32,
    /// "transformer" or "transformer_2".
    pub expert: &'static str,
    /// Guidance applied (None when CFG is off).
    pub guidance: Option<f64>,
    /// Wall time of the step in seconds.
    pub seconds: f64,
}

impl Experts<'_> {
    /// Checks that the experts agree and that the boundary fits them.
    pub fn check(&self) -> Result<(), RunError> {
        match (&self.transformer_2, self.boundary_ratio) {
            (Some(low), Some(r)) => {
                let (a, b) = (self.transformer.config(), low.config());
                if a.in_channels != b.in_channels
                    || a.out_channels() != b.out_channels()
                    || a.patch_size != b.patch_size
                {
                    return Err(RunError::Options(format!(
                        "transformer and transformer_2 disagree on in/out channels or patch size \
                         ({} / {} / {:?} vs {} / {} / {:?})",
                        a.in_channels,
                        a.out_channels(),
                        a.patch_size,
                        b.in_channels,
                        b.out_channels(),
                        b.patch_size
                    )));
                }
                if !(0.0..=1.0).contains(&r) {
                    return Err(RunError::Options(format!(
                        "boundary ratio {r} is outside [0, 1]"
                    )));
                }
                Ok(())
            }
            (Some(_), None) => Err(RunError::NoBoundaryRatio),
            (None, Some(r)) => Err(RunError::Options(format!(
                "boundary ratio {r} given, but the model has no transformer_2 to switch to"
            ))),
            (None, None) => Ok(()),
        }
    }

    /// The expert, its slot (0 or 1), its name and its guidance scale at timestep `t`.
    fn pick(
        &self,
        t: f32,
        opts: &SampleOptions,
    ) -> (&WanTransformer<'_>, usize, &'static str, f64) {
        match (&self.transformer_2, self.boundary_ratio) {
            (Some(low), Some(r)) if t < (r * NUM_TRAIN_TIMESTEPS as f64) as f32 => (
                low,
                1,
                "transformer_2",
                opts.guidance_2.unwrap_or(opts.guidance),
            ),
            _ => (&self.transformer, 0, "transformer", opts.guidance),
        }
    }
}

/// Runs N Euler steps from `inputs.hidden_states`; returns the latents (B, C_out, F, H, W).
pub fn sample(
    experts: &Experts<'_>,
    inputs: &SampleInputs<'_>,
    opts: &SampleOptions,
    on_step: &mut dyn FnMut(&StepReport),
) -> Result<Tensor, RunError> {
    let (run, mut latents) = Batched::prepare(experts, inputs, opts)?;
    let schedule = FlowMatchEuler::new(opts.steps, opts.shift);
    // Per expert, the cross-attention context of the (batched) text and image embeds,
    // built on the expert's first step and reused after.
    let mut contexts: [Option<Context>; 2] = [None, None];
    for (i, &t) in schedule.timesteps.iter().enumerate() {
        let start = Instant::now();
        let (model, slot, expert, g) = experts.pick(t, opts);
        if slot == 1 {
            contexts[0] = None; // t only decreases: the high-noise expert is done.
        }
        let context = match &mut contexts[slot] {
            Some(c) => c,
            empty => empty.insert(model.context(&run.text, run.image.as_ref())?),
        };
        let (hidden, timestep) = run.model_inputs(&latents, t);
        let v = model.forward_with(&hidden, &timestep, (None, None), context)?;
        let velocity = run.guide(v.data, g);
        schedule.step(i, &mut latents, &velocity);
        on_step(&StepReport {
            index: i,
            timestep: t,
            expert,
            guidance: run.cfg.then_some(g),
            seconds: start.elapsed().as_secs_f64(),
        });
    }
    let [b, _, f, h, w] = run.shape;
    Ok(Tensor::new(vec![b, run.c_out, f, h, w], latents))
}

/// What stays fixed over a sampling run: sizes, the condition channels, and the text and
/// image embeds batched for CFG (conditional half first).
struct Batched {
    /// (B, C_in, F, H, W) of the inputs.
    shape: [usize; 5],
    c_out: usize,
    /// Classifier-free guidance on (batch 2B).
    cfg: bool,
    condition: Vec<f32>,
    text: Tensor,
    image: Option<Tensor>,
    /// S when the timestep is per token.
    tokens: Option<usize>,
}

impl Batched {
    /// Checks the options and inputs; returns the run and the initial latents.
    fn prepare(
        experts: &Experts<'_>,
        inputs: &SampleInputs<'_>,
        opts: &SampleOptions,
    ) -> Result<(Batched, Vec<f32>), RunError> {
        experts.check()?;
        if opts.steps == 0 {
            return Err(RunError::Options("sampling needs at least one step".into()));
        }
        if opts.guidance_2.is_some() && experts.transformer_2.is_none() {
            return Err(RunError::Options(
                "guidance_2 is only used with a second expert (transformer_2 and a boundary ratio)"
                    .into(),
            ));
        }
        let models = std::iter::once(&experts.transformer).chain(&experts.transformer_2);
        for c in models.map(|t| t.config()) {
            let model = match (&c.vace_layers, c.inject_sample_info) {
                (Some(l), _) => format!("a VACE model (vace_layers {l:?})"),
                (None, true) => "a SkyReels-V2 model with fps conditioning".to_string(),
                (None, false) => continue,
            };
            return Err(RunError::Options(format!(
                "{model} runs a single forward only (--steps 0); the runner does not sample with it"
            )));
        }
        let cfg = experts.transformer.config();
        let (c_in, c_out) = (cfg.in_channels, cfg.out_channels());
        let hs = inputs.hidden_states;
        // Full shape checks happen in the first forward; these make the channel split safe.
        let &[batch, c, fl, hl, wl] = hs.shape.as_slice() else {
            return Err(RunError::input(
                "hidden_states",
                format!("expected (B, {c_in}, F, H, W), found {:?}", hs.shape),
            ));
        };
        if c != c_in || c_in < c_out {
            return Err(RunError::input(
                "hidden_states",
                format!(
                    "expected {c_in} channels ({c_out} latent + {} condition), found {c}",
                    c_in.saturating_sub(c_out)
                ),
            ));
        }
        let negative = negative_embeds(inputs, opts)?;
        let copies = if negative.is_some() { 2 } else { 1 };
        let text = match negative {
            Some(n) => concat(&[inputs.encoder_hidden_states, n]),
            None => inputs.encoder_hidden_states.clone(),
        };
        let image = inputs
            .encoder_hidden_states_image
            .map(|img| concat(&vec![img; copies]));
        let (latents, condition) = split_channels(&hs.data, batch, c_in, c_out, fl * hl * wl);
        let run = Batched {
            shape: [batch, c_in, fl, hl, wl],
            c_out,
            cfg: negative.is_some(),
            condition,
            text,
            image,
            tokens: (inputs.timestep.rank() == 2).then(|| inputs.timestep.shape[1]),
        };
        Ok((run, latents))
    }

    /// The model's hidden_states (latents then condition channels, twice under CFG) and
    /// timestep (t per item, or per token) at timestep `t`.
    fn model_inputs(&self, latents: &[f32], t: f32) -> (Tensor, Tensor) {
        let [batch, c_in, f, h, w] = self.shape;
        let copies = if self.cfg { 2 } else { 1 };
        let frame = f * h * w;
        let one = join_channels(
            latents,
            &self.condition,
            batch,
            self.c_out,
            c_in - self.c_out,
            frame,
        );
        let hidden = Tensor::new(vec![batch * copies, c_in, f, h, w], one.repeat(copies));
        let items = batch * copies;
        let timestep = match self.tokens {
            Some(s) => Tensor::new(vec![items, s], vec![t; items * s]),
            None => Tensor::new(vec![items], vec![t; items]),
        };
        (hidden, timestep)
    }

    /// `v_u + g·(v_c − v_u)` in f32 under CFG (v holds the conditional half first), else v.
    fn guide(&self, v: Vec<f32>, g: f64) -> Vec<f32> {
        if !self.cfg {
            return v;
        }
        let (cond, uncond) = v.split_at(v.len() / 2);
        let g32 = g as f32;
        uncond
            .iter()
            .zip(cond)
            .map(|(u, c)| u + g32 * (c - u))
            .collect()
    }
}

/// The unconditional embeds when guidance is on (`guidance > 1`), checked to batch with
/// the conditional ones.
fn negative_embeds<'a>(
    inputs: &SampleInputs<'a>,
    opts: &SampleOptions,
) -> Result<Option<&'a Tensor>, RunError> {
    const NAME: &str = "negative_encoder_hidden_states";
    if opts.guidance <= 1.0 {
        return Ok(None);
    }
    let Some(n) = inputs.negative_encoder_hidden_states else {
        return Err(RunError::input(
            NAME,
            format!(
                "missing: guidance {} > 1 needs the unconditional text embeds",
                opts.guidance
            ),
        ));
    };
    if n.shape != inputs.encoder_hidden_states.shape {
        return Err(RunError::input(
            NAME,
            format!(
                "expected the shape of encoder_hidden_states {:?} (both halves run as one batch), found {:?}",
                inputs.encoder_hidden_states.shape, n.shape
            ),
        ));
    }
    Ok(Some(n))
}

/// Splits (B, C_in, …) into the first `c_out` channels and the rest, per item.
fn split_channels(
    data: &[f32],
    batch: usize,
    c_in: usize,
    c_out: usize,
    frame: usize,
) -> (Vec<f32>, Vec<f32>) {
    let mut lat = Vec::with_capacity(batch * c_out * frame);
    let mut cond = Vec::with_capacity(batch * (c_in - c_out) * frame);
    for item in data.chunks(c_in * frame) {
        lat.extend_from_slice(&item[..c_out * frame]);
        cond.extend_from_slice(&item[c_out * frame..]);
    }
    (lat, cond)
}

/// Per item, latents channels then condition channels.
fn join_channels(
    lat: &[f32],
    cond: &[f32],
    batch: usize,
    c_lat: usize,
    c_cond: usize,
    frame: usize,
) -> Vec<f32> {
    let mut out = Vec::with_capacity(batch * (c_lat + c_cond) * frame);
    for b in 0..batch {
        out.extend_from_slice(&lat[b * c_lat * frame..(b + 1) * c_lat * frame]);
        out.extend_from_slice(&cond[b * c_cond * frame..(b + 1) * c_cond * frame]);
    }
    out
}

/// Concatenation along the first axis (shapes otherwise equal, checked by the caller or by
/// the forward's shape check).
fn concat(parts: &[&Tensor]) -> Tensor {
    let mut shape = parts[0].shape.clone();
    shape[0] = parts.iter().map(|p| p.shape[0]).sum();
    let data = parts.iter().flat_map(|p| p.data.iter().copied()).collect();
    Tensor::new(shape, data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::wan::WanConfig;
    use crate::runner::weights::MemoryWeights;

    fn zeros(name: &str) -> MemoryWeights {
        let cfg = WanConfig {
            num_attention_heads: 1,
            attention_head_dim: 12,
            in_channels: 4,
            out_channels: Some(4),
            text_dim: 8,
            freq_dim: 8,
            ffn_dim: 8,
            num_layers: 1,
            rope_max_seq_len: 8,
            ..WanConfig::default()
        };
        let tensors = cfg
            .diffusers_params()
            .into_iter()
            .map(|p| (p.name.clone(), vec![0.0; p.numel() as usize]))
            .collect();
        MemoryWeights::new(name, cfg, tensors).unwrap()
    }

    #[test]
    fn expert_switch_is_t_at_least_boundary_in_f32() {
        let (high, low) = (zeros("high"), zeros("low"));
        let experts = Experts {
            transformer: WanTransformer::new(&high).unwrap(),
            transformer_2: Some(WanTransformer::new(&low).unwrap()),
            boundary_ratio: Some(0.875),
        };
        let opts = SampleOptions {
            steps: 1,
            shift: 1.0,
            guidance: 4.0,
            guidance_2: Some(3.0),
        };
        // t = 875 exactly stays on the high-noise expert (pipeline: `t >= boundary_timestep`).
        let (_, slot, name, g) = experts.pick(875.0, &opts);
        assert_eq!((slot, name, g), (0, "transformer", 4.0));
        let below = f32::from_bits(875.0f32.to_bits() - 1);
        let (_, slot, name, g) = experts.pick(below, &opts);
        assert_eq!((slot, name, g), (1, "transformer_2", 3.0));
        // guidance_2 defaults to guidance.
        let (_, _, _, g) = experts.pick(
            below,
            &SampleOptions {
                guidance_2: None,
                ..opts
            },
        );
        assert_eq!(g, 4.0);
    }

    #[test]
    fn contradictory_expert_settings_are_refused() {
        let high = zeros("high");
        let lone = Experts {
            transformer: WanTransformer::new(&high).unwrap(),
            transformer_2: None,
            boundary_ratio: Some(0.9),
        };
        assert!(
            matches!(lone.check(), Err(RunError::Options(m)) if m.contains("no transformer_2"))
        );
    }
}
