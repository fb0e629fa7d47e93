//! `wanbake extract --base BASE (--tuned TUNED | --adapter PATH[:S]...) --out DIR
//! (--rank R | --energy F | --budget SIZE) [--to ..] [--linear-only] [--svd ..] [--device ..]
//! [--dtype ..] [--allow-nonfinite] [--overwrite] [--json]` and `wanbake resize ADAPTER
//! (--rank R | --energy F) --out DIR [--base BASE] [--dtype ..] [--allow-nonfinite]
//! [--overwrite] [--json]`: clap's typed values (`cli::output`'s shared flags,
//! `TruncMethod`'s `ValueEnum`, the conventions extract writes) → `extract::ExtractRequest` /
//! `extract::ResizeRequest`, then the per-module table.

use std::path::PathBuf;

use super::device::DeviceArg;
use super::output::{FloatDtypeArg, OutputDir, value_subset};
use super::{Printer, Status, UsageError, output};
use wanbake::adapter::bind_specs;
use wanbake::adapter::{AdapterOptions, Convention};
use wanbake::extract::{
    ExtractError, ExtractOutcome, ExtractReport, ExtractRequest, FromAdapters, RankRule,
    ResizeRequest, extract, extract_from_adapters, resize,
};
use wanbake::human::{plural, size};
use wanbake::linalg::TruncMethod;
use wanbake::merge::{MergeOptions, Merger};
use wanbake::pipeline::{OutputOptions, Plan};

value_subset!(
    /// `extract --to`: the conventions extract writes (`extract::CONVENTIONS`).
    ExtractTo(Convention) = wanbake::extract::CONVENTIONS
);

const EXTRACT_HELP: &str = "\
OUTPUT
  Every 2-D Linear weight that differs becomes a LoRA: the truncated SVD of
  dW = W_tuned - W_base (f64), B = U_r*S_r (lora_up / lora_B), A = V_r^T (lora_down /
  lora_A), f32 (or --dtype bf16/f16, rounded once), alpha = r (scale 1). Every other differing tensor (biases, norms,
  modulation tables, the Conv3d patch embedding) is a full difference: diff / diff_b.
  --to comfy (default): diffusion_model.<original Wan name>.lora_down.weight, .lora_up.weight,
  .alpha, .diff, .diff_b. --to peft: adapter_model.safetensors + adapter_config.json; PEFT
  cannot hold full differences, so they are refused (listed) unless --linear-only.

RANKS
  --rank R: at most R per module. --energy F: the smallest rank keeping >= F of
  ||dW||_F^2 (with --rank R too: the smaller). --budget SIZE (\"200MB\", bytes of tensor
  data): ranks across all modules by largest marginal energy (sigma^2) until the budget is
  spent (--rank R caps each module). The report (--json, and the manifest) lists rank,
  energy and rel_error = ||dW - dW_r||_F / ||dW||_F per module.

TUNED SIDE
  --tuned CHECKPOINT, or --adapter PATH[:STRENGTH] (repeatable): the tuned model is
  base + adapters, merged exactly by the merge engine in f32, one tensor at a time in
  memory (nothing but the adapter is written), so any stack (LyCORIS, DoRA, several
  adapters) becomes one plain LoRA.";

/// Arguments of `extract`.
#[derive(clap::Args, Debug)]
#[command(after_long_help = EXTRACT_HELP)]
pub struct ExtractArgs {
    /// The base checkpoint (any layout and dtype wanbake reads).
    #[arg(long)]
    pub base: PathBuf,
    /// The fine-tuned checkpoint (same parameters and shapes as the base).
    #[arg(
        long,
        conflicts_with = "adapters",
        required_unless_present = "adapters"
    )]
    pub tuned: Option<PathBuf>,
    /// The tuned side as base + this adapter, `PATH[:STRENGTH]` (repeatable).
    #[arg(long = "adapter", value_name = "PATH[:STRENGTH]")]
    pub adapters: Vec<String>,
    /// `--out`, `--overwrite`.
    #[command(flatten)]
    pub output: OutputDir,
    /// Largest rank per module.
    #[arg(long)]
    pub rank: Option<usize>,
    /// Smallest rank per module that keeps this fraction of ‖ΔW‖² (0 < F ≤ 1).
    #[arg(long)]
    pub energy: Option<f64>,
    /// Global size of the tensor data ("200MB", "1GiB", bytes): ranks by marginal energy.
    #[arg(long, value_name = "SIZE", value_parser = output::size)]
    pub budget: Option<u64>,
    /// Output convention (`wanbake translate` converts the result to any other).
    #[arg(long, value_enum, default_value_t = ExtractTo(wanbake::extract::CONVENTIONS[0]))]
    pub to: ExtractTo,
    /// Extract Linear weights only; the other differing tensors are left out (and listed).
    #[arg(long)]
    pub linear_only: bool,
    /// `--dtype` (default f32).
    #[command(flatten)]
    pub dtype: FloatDtypeArg,
    /// SVD: randomized (range finder, exact SVD for small matrices) or exact.
    #[arg(long, value_enum, default_value_t = TruncMethod::RANDOMIZED)]
    pub svd: TruncMethod,
    /// `--device`: where the SVDs run (auto: the GPU when one is usable); the merge of an
    /// --adapter stack runs on the CPU.
    #[command(flatten)]
    pub device: DeviceArg,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// `--allow-nonfinite`.
    #[command(flatten)]
    pub nonfinite: output::NonFiniteArg,
}

/// Arguments of `resize`.
#[derive(clap::Args, Debug)]
pub struct ResizeArgs {
    /// The adapter (any convention wanbake reads; written back in the same one).
    pub adapter: PathBuf,
    /// Largest rank per module (modules at or below it are unchanged).
    #[arg(long)]
    pub rank: Option<usize>,
    /// Smallest rank per module that keeps this fraction of ‖σ·B·A‖² (0 < F ≤ 1).
    #[arg(long)]
    pub energy: Option<f64>,
    /// `--out`, `--overwrite`.
    #[command(flatten)]
    pub output: OutputDir,
    /// Resolve module names (and check shapes) against this base.
    #[arg(long)]
    pub base: Option<PathBuf>,
    /// `--dtype` (default: the new factors f32, the rest as stored).
    #[command(flatten)]
    pub dtype: FloatDtypeArg,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// `--allow-nonfinite`.
    #[command(flatten)]
    pub nonfinite: output::NonFiniteArg,
}

/// Library usage errors become exit code 2.
fn usage_or(e: ExtractError) -> anyhow::Error {
    match e {
        ExtractError::Usage(m) => UsageError(m).into(),
        other => other.into(),
    }
}

/// Runs `extract`.
pub fn execute_extract(args: ExtractArgs, p: &mut Printer) -> anyhow::Result<Status> {
    let rule = (args.rank.is_some() || args.energy.is_some()).then_some(RankRule {
        rank: args.rank,
        energy: args.energy,
    });
    // `--device cuda` fails without a usable GPU; with one (or `auto` finding one) the SVDs
    // run on it, the merge of an --adapter stack on the CPU.
    let (compute, device) = args.device.select()?;
    p.line(format!("device: {}", device.reason));
    let mut req = ExtractRequest {
        base: args.base.clone(),
        tuned: args.tuned.clone().unwrap_or_default(),
        rule,
        budget: args.budget,
        to: args.to.0,
        linear_only: args.linear_only,
        method: args.svd,
        device: compute,
        dtype: args.dtype.given().unwrap_or(wanbake::io::DType::F32),
        out: args.output.out.clone(),
        replace: args.output.replace(),
        provenance: serde_json::Value::Null,
        nonfinite: args.nonfinite.policy(),
    };
    let outcome = if args.adapters.is_empty() {
        extract(&req).map_err(usage_or)?
    } else {
        let specs = super::merge::adapter_specs(&args.adapters)?;
        req.check().map_err(usage_or)?;
        let merge = MergeOptions::default();
        let base = wanbake::quant::base::open(&args.base)?;
        let adapters = bind_specs(&specs, &base, merge.allow_unmatched)?;
        req.provenance = serde_json::json!({ "adapters": args.adapters });
        // The tuned model: the adapters merged in f32 in the base's own layout, each tensor
        // computed in memory when the extraction asks for it.
        let plan =
            Plan::new(&base, &adapters, &OutputOptions::f32_reference())?.hash_base("base")?;
        let values = Merger::values_only(&plan, &merge);
        extract_from_adapters(
            &req,
            FromAdapters {
                base: &base,
                plan: &plan,
                values: &values,
            },
        )
        .map_err(usage_or)?
    };
    show(p, &outcome);
    Ok(Status::Ok)
}

/// Runs `resize`.
pub fn execute_resize(args: ResizeArgs, p: &mut Printer) -> anyhow::Result<Status> {
    let req = ResizeRequest {
        adapter: args.adapter.clone(),
        opts: AdapterOptions::default(),
        base: args.base.clone(),
        rule: RankRule {
            rank: args.rank,
            energy: args.energy,
        },
        dtype: args.dtype.given(),
        out: args.output.out.clone(),
        replace: args.output.replace(),
        nonfinite: args.nonfinite.policy(),
    };
    let outcome = resize(&req).map_err(usage_or)?;
    show(p, &outcome);
    Ok(Status::Ok)
}

fn show(p: &mut Printer, o: &ExtractOutcome) {
    let r: &ExtractReport = &o.report;
    let low_rank = r.modules.iter().filter(|m| m.rank.is_some()).count();
    p.line(format!(
        "wrote {} ({}: {}, {}, {} of tensors)",
        o.dir.display(),
        r.to,
        plural(low_rank, "low-rank module", "low-rank modules"),
        plural(
            r.modules.len() - low_rank,
            "full difference",
            "full differences"
        ),
        size(r.tensor_bytes)
    ));
    for m in &r.modules {
        match (m.rank, m.energy, m.rel_error) {
            (Some(rank), Some(e), Some(err)) => p.line(format!(
                "  {:<40} {:>10} rank {rank:>4}{}  energy {e:.6}  rel_error {err:.3e}",
                m.name,
                m.kind,
                m.rank_in.map(|r| format!(" (was {r})")).unwrap_or_default()
            )),
            _ => p.line(format!("  {:<40} {:>10} {:?}", m.name, m.kind, m.shape)),
        }
    }
    for l in &r.left_out {
        p.warn(format!("left out: {l}"));
    }
    p.json(&serde_json::to_value(r).unwrap_or_default());
}
