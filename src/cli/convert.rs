//! `wanbake convert IN --dtype f32|f16|bf16 --out DIR [--shard-size SIZE] [--allow-nonfinite]
//! [--overwrite]`:
//! converts every float tensor of any checkpoint, mirroring its naming, as a verified
//! release. `wanbake convert IN --to FORMAT --out DIR [--dtype ..] [--city96-rounding]`: a
//! WAN transformer as one quantized file with original-Wan names: the pipeline with no
//! adapters (`wanbake::convert::encoded_release`, options through `OutputOptions::new`).
//! Flags and values are clap's typed ones (`cli::output`, the library types' `ValueEnum`s).

use std::path::PathBuf;

use super::output::{FloatDtypeArg, NonFiniteArg, OutputDir, ShardArg, print_carried};
use super::{Printer, Status, UsageError};
use wanbake::convert::{ConvertSpec, convert_release, encoded_release};
use wanbake::human::{plural, size};
use wanbake::model::wan_layout::Layout;
use wanbake::pipeline::{OutputChoices, OutputFormat, OutputOptions};
use wanbake::release::Hooks;

/// Arguments of `convert`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Input checkpoint (file, index, folder, pipeline).
    pub input: PathBuf,
    /// `--dtype`.
    #[command(flatten)]
    pub dtype: FloatDtypeArg,
    /// A quantized output for ComfyUI: fp8-scaled (one scaled-fp8 .safetensors) or a GGUF
    /// block type (one ComfyUI-GGUF .gguf), original-Wan names; comfy:fp8|nvfp4|mxfp8|int8|int8-convrot
    /// (ComfyUI mixed precision: block Linears quantized with comfy-kitchen's rules, the rest
    /// in --dtype, default bf16) or lightx2v:int8|fp8 (LightX2V's converter's file, the rest
    /// in --dtype, default f32), one .safetensors; or orbax: MaxDiffusion's
    /// pretrained Orbax cache (point `pretrained_orbax_dir` at --out; --dtype is its
    /// weights_dtype, bf16 by default, --layout nnx-scanned (default) or nnx).
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub to: Option<OutputFormat>,
    /// With --to orbax: `nnx-scanned` (MaxDiffusion's `scan_layers: True`, the default) or
    /// `nnx` (`scan_layers: False`).
    #[arg(long, value_enum)]
    pub layout: Option<Layout>,
    /// GGUF block types: quantize the step-1 rounding of each weight (F16 unless --dtype says
    /// otherwise), as city96's two-step pipeline does, for byte-compatible files (default: the
    /// exact f32 weights).
    #[arg(long)]
    pub city96_rounding: bool,
    /// `--out`, `--overwrite`.
    #[command(flatten)]
    pub output: OutputDir,
    /// `--shard-size`.
    #[command(flatten)]
    pub shard: ShardArg,
    /// Print a JSON summary.
    #[arg(long)]
    pub json: bool,
    /// `--allow-nonfinite`.
    #[command(flatten)]
    pub nonfinite: NonFiniteArg,
}

/// Runs `convert`.
pub fn execute(args: Args, p: &mut Printer) -> anyhow::Result<Status> {
    match args.to {
        Some(OutputFormat::Quantized(_)) | None if args.layout.is_some() => {
            return Err(UsageError(
                "--layout goes with --to orbax (use restack for safetensors layouts)".into(),
            )
            .into());
        }
        Some(to) => return execute_encoded(to, &args, p),
        None => {}
    }
    if args.city96_rounding {
        return Err(UsageError("--city96-rounding needs --to gguf:<type>".into()).into());
    }
    let Some(dtype) = args.dtype.dtype else {
        return Err(UsageError("convert needs --dtype f32|f16|bf16 or --to FORMAT".into()).into());
    };
    let spec = ConvertSpec {
        input: args.input,
        dtype: dtype.0,
        shard_bytes: args.shard.shard_size,
        replace: args.output.replace(),
        out: args.output.out,
        nonfinite: args.nonfinite.policy(),
    };
    let r = convert_release(&spec, Hooks::default())?;
    let bytes: u64 = r.manifest.files.iter().map(|f| f.bytes).sum();
    p.line(format!(
        "wrote {} ({}, {})",
        r.dir.display(),
        plural(r.manifest.files.len(), "file", "files"),
        size(bytes)
    ));
    print_carried(p, &r, None);
    p.json(&serde_json::json!({"dir": r.dir, "report": r.manifest.report, "bytes": bytes, "carried": r.carried}));
    Ok(Status::Ok)
}

/// `--to FORMAT` (fp8-scaled, GGUF, or MaxDiffusion's Orbax cache): the pipeline with no
/// adapters, its options checked by the builder `merge` and recipes use
/// (`OutputOptions::new`).
fn execute_encoded(to: OutputFormat, args: &Args, p: &mut Printer) -> anyhow::Result<Status> {
    let options = OutputOptions::new(OutputChoices {
        dtype: args.dtype.dtype.map(|d| d.0).unwrap_or_default(),
        shard_bytes: args.shard.shard_size,
        layout: args.layout,
        to: Some(to),
        city96_rounding: args.city96_rounding,
        nonfinite: args.nonfinite.policy(),
        ..OutputChoices::default()
    })
    .map_err(super::merge::flag_error)?;
    if options.quantize.is_some() {
        super::merge::refuse_gguf_out(&args.output.out)?;
    }
    let r = encoded_release(
        &args.input,
        &options,
        &args.output.out,
        args.output.replace(),
        Hooks::default(),
    )?;
    let bytes: u64 = r.manifest.files.iter().map(|f| f.bytes).sum();
    let what = match options.quantize {
        Some(q) => q.format.to_string(),
        None => format!(
            "MaxDiffusion Orbax cache, {} {}",
            options.layout.map_or("", |l| l.as_str()),
            options.dtype
        ),
    };
    p.line(format!(
        "wrote {} ({what}: {}, {})",
        r.dir.display(),
        plural(r.manifest.files.len(), "file", "files"),
        size(bytes)
    ));
    if options.quantize.is_some() {
        super::merge::print_quantization(p, &r.manifest.report, "  ");
    }
    print_carried(p, &r, None);
    p.json(&serde_json::json!({"dir": r.dir, "report": r.manifest.report, "bytes": bytes, "left_out": r.left_out}));
    Ok(Status::Ok)
}
