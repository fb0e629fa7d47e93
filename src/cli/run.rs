//! `wanbake run --model M --inputs FILE --out FILE [--steps N] [--shift S] [--guidance G]
//! [--guidance-2 G2] [--boundary-ratio R] [--json]`: one conditional forward (`--steps 0`,
//! writes `noise_pred`) or N flow-matching Euler steps with batched CFG (writes
//! `latents`), then a timing summary.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use serde_json::json;

use super::{Printer, Status, UsageError};
use wanbake::runner::output::write_f32_file;
use wanbake::runner::{
    ModelSet, RunInputs, RunOutput, RunSettings, StepReport, Tensor, run_models,
};

/// Arguments of `run`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// A WAN transformer in any layout (diffusers, original Wan / ComfyUI, NNX, NNX-scanned):
    /// a model folder, a .safetensors file or shard index (config.json beside it), or a
    /// pipeline folder with transformer/ [and transformer_2/ + model_index.json].
    #[arg(long)]
    pub model: PathBuf,
    /// config.json to use instead of the one beside the weights (a single original-layout
    /// file has none): a diffusers WanTransformer3DModel config, or an original WanModel
    /// config (its num_heads completes the config read from the shapes).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Safetensors file with hidden_states, timestep, encoder_hidden_states
    /// [, negative_encoder_hidden_states, encoder_hidden_states_image].
    #[arg(long)]
    pub inputs: PathBuf,
    /// Output safetensors file (f32): noise_pred, or latents with --steps N.
    #[arg(long)]
    pub out: PathBuf,
    /// 0: one conditional forward at the inputs' timestep. N: sample N Euler steps from
    /// hidden_states.
    #[arg(long, default_value_t = 0)]
    pub steps: usize,
    /// FlowMatchEulerDiscreteScheduler shift (diffusers' default is 1.0).
    #[arg(long, default_value_t = 1.0)]
    pub shift: f64,
    /// Guidance scale (of `transformer`); CFG runs when > 1 (diffusers' pipeline default 5).
    #[arg(long, default_value_t = 5.0)]
    pub guidance: f64,
    /// Guidance scale of `transformer_2` (Wan2.2 A14B); defaults to --guidance.
    #[arg(long)]
    pub guidance_2: Option<f64>,
    /// Expert switch: `transformer` while t ≥ ratio·1000, else `transformer_2`. Defaults to
    /// model_index.json's boundary_ratio.
    #[arg(long)]
    pub boundary_ratio: Option<f64>,
    /// Print the timing summary as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Runs `run`.
pub fn execute(args: Args, p: &mut Printer) -> anyhow::Result<Status> {
    if args.steps == 0 && args.guidance_2.is_some() {
        return Err(
            UsageError("--guidance-2 only applies when sampling (--steps N > 0)".into()).into(),
        );
    }
    let total = Instant::now();
    let models = ModelSet::open(&args.model, args.config.as_deref())?;
    let inputs = RunInputs::read(&args.inputs)?;
    let load_s = total.elapsed().as_secs_f64();
    let settings = RunSettings {
        steps: args.steps,
        shift: args.shift,
        guidance: args.guidance,
        guidance_2: args.guidance_2,
        boundary_ratio: args.boundary_ratio,
    };
    let out = run_models(&models, &inputs, &args.inputs, &settings)?;
    let metadata = run_metadata(&args, &out);
    write_f32_file(&args.out, &[(out.name, &out.tensor)], &metadata)?;
    report(
        p,
        &args,
        out.name,
        &out.tensor,
        load_s,
        &out.steps,
        total.elapsed().as_secs_f64(),
    );
    Ok(Status::Ok)
}

/// The output file's `__metadata__`: the step count, and the expert (forward) or the
/// sampling settings.
fn run_metadata(args: &Args, out: &RunOutput) -> BTreeMap<String, String> {
    let mut metadata = BTreeMap::new();
    metadata.insert("wanbake.run.steps".to_string(), args.steps.to_string());
    if args.steps == 0 {
        let expert = out.steps.first().map_or("transformer", |s| s.expert);
        metadata.insert("wanbake.run.expert".to_string(), expert.to_string());
        return metadata;
    }
    let none = || "none".to_string();
    for (k, v) in [
        ("shift", args.shift.to_string()),
        ("guidance", args.guidance.to_string()),
        (
            "guidance_2",
            args.guidance_2.map_or_else(none, |g| g.to_string()),
        ),
        (
            "boundary_ratio",
            out.boundary_ratio.map_or_else(none, |r| r.to_string()),
        ),
        ("scheduler", "FlowMatchEulerDiscreteScheduler".into()),
    ] {
        metadata.insert(format!("wanbake.run.{k}"), v);
    }
    metadata
}

fn report(
    p: &mut Printer,
    args: &Args,
    name: &str,
    result: &Tensor,
    load_s: f64,
    steps: &[StepReport],
    total_s: f64,
) {
    let first = steps.first().map_or(0.0, |s| s.seconds);
    let rest: Vec<f64> = steps.iter().skip(1).map(|s| s.seconds).collect();
    let mean_rest = if rest.is_empty() {
        None
    } else {
        Some(rest.iter().sum::<f64>() / rest.len() as f64)
    };
    p.line(format!(
        "wrote {} {:?} to {}",
        name,
        result.shape,
        args.out.display()
    ));
    p.line("TIMING SUMMARY");
    p.line(format!("  load:           {load_s:.3} s"));
    p.line(format!("  first forward:  {first:.3} s"));
    for s in steps {
        p.line(format!(
            "  step {:>3}  t = {:>9.4}  {:<13}  {:.3} s",
            s.index, s.timestep, s.expert, s.seconds
        ));
    }
    if let Some(m) = mean_rest {
        p.line(format!("  per step (after the first): {m:.3} s"));
    }
    p.line(format!("  total:          {total_s:.3} s"));
    p.json(&json!({
        "output": args.out.display().to_string(),
        "tensor": name,
        "shape": result.shape,
        "threads": rayon::current_num_threads(),
        "timing": {
            "load_s": load_s,
            "first_forward_s": first,
            "per_step_s": steps.iter().map(|s| s.seconds).collect::<Vec<_>>(),
            "mean_step_after_first_s": mean_rest,
            "total_s": total_s,
        },
        "steps": steps.iter().map(|s| json!({
            "index": s.index,
            "timestep": s.timestep,
            "expert": s.expert,
            "guidance": s.guidance,
            "seconds": s.seconds,
        })).collect::<Vec<_>>(),
    }));
}
