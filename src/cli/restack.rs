//! `wanbake restack IN --to LAYOUT --out DIR [--from LAYOUT] [--dtype bf16|f16|f32|keep]
//! [--keep-f32 POLICY] [--shard-size BYTES] [--device auto|cpu|cuda] [--overwrite] [--json]`:
//! converts a WAN transformer checkpoint between the diffusers, original-Wan, NNX and
//! NNX-scanned layouts.
//! The work is `merge::restack` (planned by `layout::restack`); this file parses, prints
//! and picks the exit code.

use std::path::PathBuf;

use super::{Printer, Status, UsageError, output};
use wanbake::gpu::DeviceChoice;
use wanbake::io::staging::Replace;
use wanbake::layout::restack::RestackOptions;
use wanbake::layout::{KeepF32, OutputDType};
use wanbake::merge::Compute;
use wanbake::merge::exec::ExecOptions;
use wanbake::merge::restack::restack_release;
use wanbake::model::wan_layout::Layout;

/// Arguments of `restack`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Checkpoint: a .safetensors file, a *.safetensors.index.json, a diffusers model folder,
    /// or a pipeline folder (transformer/ and transformer_2/ are both converted).
    pub input: PathBuf,
    /// Output layout.
    #[arg(long, value_parser = output::layouts())]
    pub to: String,
    /// Output directory (written atomically, with wanbake.manifest.json).
    #[arg(long)]
    pub out: PathBuf,
    /// Input layout, when neither config.json's `_wanbake_layout` nor the keys should decide.
    #[arg(long, value_parser = output::layouts())]
    pub from: Option<String>,
    /// Output dtype: bf16, f16, f32, or keep (each tensor keeps its stored dtype).
    #[arg(long, default_value = "keep", value_parser = output::output_dtypes())]
    pub dtype: String,
    /// Which parameters stay f32 under bf16/f16: diffusers, maxdiffusion, none, or
    /// regex:PATTERN (on output names). Default: maxdiffusion for nnx outputs, else diffusers.
    #[arg(long)]
    pub keep_f32: Option<String>,
    /// config.json to use instead of the one next to the weights (a diffusers
    /// WanTransformer3DModel or original WanModel config). A single original-format file
    /// has none, and its head count cannot be read from shapes.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Shard weight files at this size ("5GB", "500MB", bytes).
    #[arg(long, value_name = "SIZE", value_parser = output::size)]
    pub shard_size: Option<u64>,
    /// Replace an existing output directory.
    #[arg(long)]
    pub overwrite: bool,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Accepted so one flag serves a whole pipeline, and checked (cuda fails without a usable
    /// GPU). A restack only moves bytes and rounds dtypes (bit-identical anywhere, bound by
    /// the disk), so it always runs on the CPU; the manifest says so.
    #[arg(long, default_value = "auto", value_name = "auto|cpu|cuda")]
    pub device: DeviceChoice,
}

fn layout_arg(flag: &str, value: &str) -> Result<Layout, UsageError> {
    value
        .parse()
        .map_err(|e| UsageError(format!("--{flag}: {e}")))
}

/// Runs `restack`.
pub fn execute(args: Args, p: &mut Printer) -> anyhow::Result<Status> {
    let options = RestackOptions {
        from: args
            .from
            .as_deref()
            .map(|v| layout_arg("from", v))
            .transpose()?,
        to: layout_arg("to", &args.to)?,
        dtype: args
            .dtype
            .parse::<OutputDType>()
            .map_err(|e| UsageError(format!("--dtype: {e}")))?,
        keep_f32: args
            .keep_f32
            .as_deref()
            .map(KeepF32::parse)
            .transpose()
            .map_err(|e| UsageError(format!("--keep-f32: {e}")))?,
        shard_bytes: args.shard_size,
        config: args.config,
        replace: if args.overwrite {
            Replace::Overwrite
        } else {
            Replace::Never
        },
    };
    let (_, device) = Compute::select(args.device)?;
    if device.used != "cpu" {
        p.line(format!(
            "device: cpu (a restack moves bytes and rounds dtypes, bit-identical on any \
             device and bound by the disk; {} stays idle)",
            device.name.as_deref().unwrap_or(device.used)
        ));
    }
    let outcome = restack_release(&args.input, &args.out, &options, &ExecOptions::default())?;
    let components = outcome.report["components"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for c in &components {
        let name = c["component"].as_str().filter(|s| !s.is_empty());
        p.line(format!(
            "{}{} -> {}: {} tensors in, {} out, {} parameters ({})",
            name.map(|n| format!("{n}: ")).unwrap_or_default(),
            c["from"].as_str().unwrap_or("?"),
            c["to"].as_str().unwrap_or("?"),
            c["tensors_in"],
            c["tensors_out"],
            c["parameters"],
            c["config"].as_str().unwrap_or("?"),
        ));
        for s in c["skipped"].as_array().into_iter().flatten() {
            p.warn(format!(
                "skipped `{}`: {}",
                s["key"].as_str().unwrap_or("?"),
                s["reason"].as_str().unwrap_or("?")
            ));
        }
    }
    for path in outcome.report["not_carried"]
        .as_array()
        .into_iter()
        .flatten()
    {
        p.warn(format!(
            "not carried to the output: {}",
            path.as_str().unwrap_or("?")
        ));
    }
    p.line(format!("wrote {}", outcome.release.dir.display()));
    p.json(&serde_json::json!({
        "dir": outcome.release.dir,
        "report": outcome.report,
    }));
    Ok(Status::Ok)
}
