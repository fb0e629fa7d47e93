//! `wanbake merge --base BASE --adapter [COMPONENT=]PATH[:STRENGTH]... --out DIR [--dtype ..]
//! [--keep-f32 ..] [--layout ..] [--dora-strength ..] [--allow-unmatched] [--svd-cache DIR]
//! [--shard-size SIZE] [--to FORMAT [--city96-rounding]] [--device ..] [--allow-nonfinite]
//! [--overwrite] [--json]`: merge adapters into a base in one streaming pass and write a verified release.
//!
//! This file only turns arguments into library values (clap hands it typed values: the
//! shared flags of `cli::output`, the library types' `ValueEnum`s; `adapter::AdapterSpec`;
//! `pipeline::OutputOptions` through the builder recipes use, `OutputOptions::new`;
//! `merge::MergeOptions`), opens and binds the adapters (`adapter::bind_specs`), calls
//! `merge::merge_release` (plan, then write) and prints the summary.

use std::path::{Path, PathBuf};

use super::device::{DeviceArg, device_json};
use super::output::{DtypeArgs, NonFiniteArg, OutputDir, ShardArg, print_carried};
use super::{Printer, Status, UsageError};
use wanbake::adapter::{AdapterSpec, bind_specs};
use wanbake::human::{plural, size};
use wanbake::io::Checkpoint;
use wanbake::linalg::SvdCache;
use wanbake::merge::{
    DoraStrength, MergeOptions, MergeOutcome, MergeReport, Merging, merge_releases,
};
use wanbake::model::wan_layout::Layout;
use wanbake::pipeline::{BadOption, OutputChoices, OutputFormat, OutputOptions};

const AFTER_HELP: &str = "\
ADAPTERS
  --adapter [COMPONENT=]PATH[:STRENGTH], repeatable. PATH is a .safetensors file, a PEFT
  folder (adapter_config.json + adapter_model.safetensors) or a folder with one weights
  file, in any convention (PEFT, diffusers, ComfyUI/original Wan, kohya/musubi, SA3 native,
  Qwix/NNX). STRENGTH (default 1) is a finite number. A path containing ':' must end with
  an explicit strength (my:lora.safetensors:1); a path containing '=' is written ./a=b.

  A base with several transformers (Wan 2.2 A14B: transformer/ = high-noise expert,
  transformer_2/ = low-noise expert) needs COMPONENT on every adapter: a component folder
  name, or all for every transformer:
    wanbake merge --base Wan2.2-T2V-A14B-Diffusers \\
      --adapter transformer=high_noise.safetensors:1.0 \\
      --adapter transformer_2=low_noise.safetensors:1.0 --out baked --dtype bf16

STRENGTH
  W' = round_once(W0 + sum_i a_i*(f_i(W0) - W0)), in f32, with W0 the original weight for
  every adapter and f_i its effective weight at full strength; one round-to-nearest-even to
  the output dtype. a = 0 skips the adapter (output bit-identical to the input). a also
  scales full-tensor diffs (diff, diff_b, diff_m), as ComfyUI and diffusers fuse_lora do
  (MaxDiffusion adds diffs unscaled).
  --dora-strength merge (default): the same linear rule for DoRA/BoRA (SA3 application
  weight, ComfyUI). --dora-strength peft: the strength sits inside the norm,
  W' = m*(W + a*s*B*A)/||W + a*s*B*A|| (PEFT, diffusers fuse_lora(lora_scale=a), SA3
  lora_strength). The two agree at a = 1 and for every non-DoRA kind.
  LyCORIS kinds follow the same rule. LyCORIS's own multiplier agrees for LoHa, LoKr,
  GLoRA, (IA)3 and full, but interpolates each rotation for Diag-OFT/BOFT (R <- aR+(1-a)I),
  which differs from the rule at a != 1 (README, section LyCORIS).

DTYPES
  --dtype keep (default) keeps every tensor's stored dtype; bf16/f16 narrow except what the
  keep-f32 policy keeps: diffusers (default for diffusers/wan layouts:
  _keep_in_fp32_modules), maxdiffusion (default for nnx layouts), none (default for bases
  that are not WAN transformers), or regex:PATTERN on output names.";

/// Arguments of `merge`.
#[derive(clap::Args, Debug)]
#[command(after_long_help = AFTER_HELP)]
pub struct Args {
    /// Base checkpoint: a .safetensors file, a *.safetensors.index.json, a diffusers model
    /// folder, or a pipeline folder with transformer/ and transformer_2/.
    #[arg(long)]
    pub base: PathBuf,
    /// Adapter to merge, `[COMPONENT=]PATH[:STRENGTH]` (repeatable; see below).
    #[arg(
        long = "adapter",
        required = true,
        value_name = "[COMPONENT=]PATH[:STRENGTH]"
    )]
    pub adapters: Vec<String>,
    /// `--out`, `--overwrite`.
    #[command(flatten)]
    pub output: OutputDir,
    /// `--dtype`, `--keep-f32`.
    #[command(flatten)]
    pub dtype: DtypeArgs,
    /// Write the result in this WAN layout (default: the base's own).
    #[arg(long, value_enum)]
    pub layout: Option<Layout>,
    /// `--device`.
    #[command(flatten)]
    pub device: DeviceArg,
    /// Where the strength enters DoRA/BoRA: merge (application weight) or peft (inside the
    /// norm).
    #[arg(long, value_enum, default_value_t = DoraStrength::Merge)]
    pub dora_strength: DoraStrength,
    /// Merge around adapter keys that match nothing (they are listed in the report).
    #[arg(long)]
    pub allow_unmatched: bool,
    /// Directory of cached LoRA-XS SVD bases (created when missing); a second bake reads
    /// them.
    #[arg(long, value_name = "DIR")]
    pub svd_cache: Option<PathBuf>,
    /// `--shard-size`.
    #[command(flatten)]
    pub shard: ShardArg,
    /// Print the merge report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Quantize the merged f32 weights for ComfyUI: one scaled-fp8 .safetensors, one
    /// ComfyUI-GGUF .gguf, one ComfyUI mixed-precision (comfy:fp8|nvfp4|mxfp8|int8|int8-convrot) or one
    /// LightX2V (lightx2v:int8|fp8) .safetensors, original-Wan names (`wanbake convert --help`). One pass: each
    /// merged tensor is quantized as it is written. --dtype is then the high-precision
    /// type: fp8-scaled's (default f16), comfy:*'s (default bf16), lightx2v:*'s (default
    /// f32); a GGUF block mix's step-1 type of the 2-D tensors
    /// (default f16, bf16 from a bf16 base; f32 as city96's published Wan 2.1 files hold
    /// them); refused for gguf:bf16|f16.
    /// `orbax`: MaxDiffusion's pretrained Orbax cache of the merged weights (point
    /// `pretrained_orbax_dir` at --out; --layout nnx-scanned (default) or nnx, --dtype its
    /// weights_dtype, bf16 by default).
    ///
    /// Repeated (`--to fp8-scaled --to gguf:q4_k_m …`): a release matrix, every format from
    /// one read of the base with each tensor merged once, each in `--out DIR/<format>/`
    /// (`:` written `-`: `DIR/gguf-q4_k_m/`), a release of its own, byte-identical to the
    /// same merge with that `--to` alone; all are committed together or none is.
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub to: Vec<wanbake::pipeline::OutputFormat>,
    /// With --to gguf:<block type>: quantize the step-1 rounding (F16 unless --dtype says
    /// otherwise), as city96's two-step pipeline does.
    #[arg(long)]
    pub city96_rounding: bool,
    /// `--allow-nonfinite`.
    #[command(flatten)]
    pub nonfinite: NonFiniteArg,
}

/// The output options with `to`, checked by the builder recipes use too
/// (`OutputOptions::new`).
fn output_options(args: &Args, to: Option<OutputFormat>) -> Result<OutputOptions, UsageError> {
    OutputOptions::new(OutputChoices {
        dtype: args.dtype.dtype,
        keep_f32: args.dtype.keep_f32.clone(),
        layout: args.layout,
        shard_bytes: args.shard.shard_size,
        to,
        city96_rounding: args.city96_rounding,
        nonfinite: args.nonfinite.policy(),
    })
    .map_err(flag_error)
}

/// Every output of the command: one at `--out` (no `--to`, or one), or with `--to` repeated
/// one per format in `--out DIR/<format>/`; a format's refusal names it.
fn outputs(args: &Args) -> Result<Vec<(OutputOptions, PathBuf)>, UsageError> {
    let out = &args.output.out;
    if args.to.len() <= 1 {
        return Ok(vec![(
            output_options(args, args.to.first().copied())?,
            out.clone(),
        )]);
    }
    let mut outputs: Vec<(OutputOptions, PathBuf)> = Vec::with_capacity(args.to.len());
    for &to in &args.to {
        let options = output_options(args, Some(to))
            .map_err(|e| UsageError(format!("--to {}: {}", to.as_str(), e.0)))?;
        let dest = out.join(to.as_str().replace(':', "-"));
        if outputs.iter().any(|(_, d)| d == &dest) {
            return Err(UsageError(format!("--to {} is given twice", to.as_str())));
        }
        outputs.push((options, dest));
    }
    Ok(outputs)
}

/// A builder refusal, named as the flag (`--keep-f32: ...`).
pub(super) fn flag_error(b: BadOption) -> UsageError {
    UsageError(format!("--{}: {}", b.field.replace('_', "-"), b.message))
}

/// The `--adapter` arguments parsed, each path resolved (`io::hub`: a Hugging Face cache
/// reference or cache repo folder becomes its snapshot).
pub(super) fn adapter_specs(args: &[String]) -> anyhow::Result<Vec<AdapterSpec>> {
    args.iter()
        .map(|a| {
            let mut spec = AdapterSpec::parse(a).map_err(|e| UsageError(e.to_string()))?;
            spec.path = wanbake::io::hub::resolve(&spec.path)?;
            Ok(spec)
        })
        .collect()
}

/// Runs `merge`.
pub fn execute(args: Args, p: &mut Printer) -> anyhow::Result<Status> {
    let outputs = outputs(&args)?;
    let quantizes = outputs.iter().any(|(o, _)| o.quantize.is_some());
    let options = MergeOptions {
        dora_strength: args.dora_strength,
        allow_unmatched: args.allow_unmatched,
    };
    let specs = adapter_specs(&args.adapters)?;
    let cache = args
        .svd_cache
        .as_deref()
        .map(SvdCache::create)
        .transpose()
        .map_err(|e| super::hint::FlagError::new("svd-cache", e))?;
    let (compute, device) = args.device.select()?;
    p.line(format!("device: {}", device.reason));
    if quantizes {
        refuse_gguf_out(&args.output.out)?;
    }
    let base = wanbake::quant::base::open(&args.base)?;
    print_base_format(p, &base, quantizes);
    let adapters = bind_specs(&specs, &base, options.allow_unmatched)?;
    if base.components.len() > 1 {
        for a in adapters.iter() {
            let component = &base.components[a.component].name;
            if let Some(w) = wanbake::adapter::variant::expert_warning(&a.set.path, component) {
                p.warn(w);
            }
        }
    }
    let merging = Merging {
        options,
        compute: &compute,
        svd_cache: cache.as_ref(),
    };
    let planned: Vec<(&OutputOptions, &Path)> =
        outputs.iter().map(|(o, d)| (o, d.as_path())).collect();
    let replace = args.output.replace();
    let outcomes = merge_releases(&base, &adapters, &planned, &merging, replace)?;
    let mut json = Vec::with_capacity(outcomes.len());
    for (outcome, (output, _)) in outcomes.iter().zip(&outputs) {
        json.push(describe(p, outcome, output));
    }
    let json = match json.len() {
        1 => json.swap_remove(0),
        _ => serde_json::json!({ "outputs": json }),
    };
    let mut json = json;
    json["device"] = device_json(&device);
    p.json(&json);
    Ok(Status::Ok)
}

/// Prints one written release's summary and returns it as JSON.
fn describe(p: &mut Printer, outcome: &MergeOutcome, output: &OutputOptions) -> serde_json::Value {
    let files = &outcome.release.manifest.files;
    let bytes: u64 = files.iter().map(|f| f.bytes).sum();
    let quantized = output.quantize.is_some();
    print_summary(
        p,
        &outcome.report,
        &outcome.release.dir,
        (files.len(), bytes),
        quantized,
    );
    print_carried(p, &outcome.release, output.layout);
    let report = match &output.quantize {
        None => serde_json::to_value(&outcome.report).unwrap_or_default(),
        Some(q) => {
            p.line(format!("  quantized: {}", q.format));
            print_quantization(p, &outcome.release.manifest.report, "    ");
            outcome.release.manifest.report.clone()
        }
    };
    serde_json::json!({
        "dir": outcome.release.dir,
        "files": files.len(),
        "bytes": bytes,
        "carried": outcome.release.carried,
        "report": report,
    })
}

/// What a quantized base was, and a warning when the output quantizes it again; nothing for
/// a float base.
pub(super) fn print_base_format(p: &mut Printer, base: &Checkpoint, requantized: bool) {
    let Some(q) = &base.quantized else {
        return;
    };
    p.line(format!(
        "base: {} ({} decoded to f32 as its loader does)",
        q.format,
        plural(q.decoded, "tensor", "tensors")
    ));
    for d in &q.details {
        p.line(format!("  {d}"));
    }
    if requantized {
        p.warn(format!(
            "the base was already quantized ({}); the output quantizes its decoded values \
             again, so both errors add up",
            q.format
        ));
    }
}

/// The summary lines; `quantized`: the quantization report follows and decides every
/// tensor's encoding, so the dtype, layout and keep-f32 options are not printed.
fn print_summary(
    p: &mut Printer,
    r: &MergeReport,
    dir: &Path,
    (files, bytes): (usize, u64),
    quantized: bool,
) {
    p.line(format!(
        "merged {} into {}; wrote {} ({}, {}, {})",
        plural(r.adapters.len(), "adapter", "adapters"),
        plural(r.targets_merged, "tensor", "tensors"),
        dir.display(),
        plural(files, "file", "files"),
        size(bytes),
        plural(r.tensors, "tensor", "tensors")
    ));
    for a in &r.adapters {
        let component = if a.component.is_empty() {
            String::new()
        } else {
            format!(" -> {}", a.component)
        };
        let state = if a.skipped {
            "skipped (strength 0)".to_string()
        } else {
            plural(a.targets_merged, "target", "targets")
        };
        p.line(format!(
            "  {}{component}: {}, strength {}, {}, {state}",
            a.adapter,
            a.convention,
            a.strength,
            plural(a.entries, "entry", "entries")
        ));
        if !a.unmatched_allowed.is_empty() {
            p.warn(format!(
                "{}: {} left out (--allow-unmatched), listed in the manifest",
                a.adapter,
                plural(a.unmatched_allowed.len(), "unmatched key", "unmatched keys")
            ));
        }
    }
    let s = &r.svd;
    if let Some(engine) = &s.engine {
        p.line(format!(
            "  LoRA-XS SVD bases: {} computed, {} cache hits, {} cache misses, {} replaced ({engine})",
            s.computed, s.hits, s.misses, s.replaced
        ));
    }
    if quantized {
        p.line(format!("  DoRA strength {}", r.dora_strength.as_str()));
    } else {
        p.line(format!(
            "  dtype {}, layout {}, keep-f32 {}, DoRA strength {}",
            r.dtype,
            r.layout,
            r.keep_f32,
            r.dora_strength.as_str()
        ));
    }
}

/// `--out x.gguf` is refused: a quantized output is a release directory.
pub(super) fn refuse_gguf_out(out: &Path) -> Result<(), UsageError> {
    if out.extension().is_some_and(|e| e == "gguf") {
        return Err(UsageError(format!(
            "{}: wanbake writes a release directory (the .gguf plus wanbake.manifest.json); \
             pass --out DIR",
            out.display()
        )));
    }
    Ok(())
}

/// The quantization summary of a quantized release's report, one line per encoding.
pub(super) fn print_quantization(p: &mut Printer, report: &serde_json::Value, indent: &str) {
    if let Some(s) = report["quantization"]["summary"].as_object() {
        for (enc, v) in s {
            p.line(format!(
                "{indent}{enc}: {} tensors, worst relative error max {:.3e} rms {:.3e}",
                v["tensors"],
                v["worst_rel_max_err"].as_f64().unwrap_or(0.0),
                v["worst_rel_rms_err"].as_f64().unwrap_or(0.0)
            ));
        }
    }
}
