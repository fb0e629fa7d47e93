//! `wanbake restack IN --to LAYOUT --out DIR [--from LAYOUT] [--dtype ..] [--keep-f32 POLICY]
//! [--config FILE] [--shard-size SIZE] [--device ..] [--allow-nonfinite] [--overwrite] [--json]`: converts a WAN
//! transformer checkpoint between the diffusers, original-Wan, NNX and NNX-scanned layouts.
//! The work is `restack` (planned by `layout::restack`); this file builds the
//! `RestackOptions` from clap's typed values (the shared flags of `cli::output` and
//! `cli::device`, `Layout`'s `ValueEnum`), prints and picks the exit code.

use std::path::PathBuf;

use super::device::DeviceArg;
use super::output::{DtypeArgs, NonFiniteArg, OutputDir, ShardArg, print_carried};
use super::{Printer, Status};
use wanbake::layout::restack::RestackOptions;
use wanbake::model::wan_layout::Layout;
use wanbake::pipeline::ExecOptions;
use wanbake::release::Hooks;
use wanbake::restack::restack_release;

/// Arguments of `restack`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Checkpoint: a .safetensors file, a *.safetensors.index.json, a diffusers model folder,
    /// or a pipeline folder (transformer/ and transformer_2/ are both converted).
    pub input: PathBuf,
    /// Output layout.
    #[arg(long, value_enum)]
    pub to: Layout,
    /// `--out`, `--overwrite`.
    #[command(flatten)]
    pub output: OutputDir,
    /// Input layout, when neither config.json's `_wanbake_layout` nor the keys should decide.
    #[arg(long, value_enum)]
    pub from: Option<Layout>,
    /// `--dtype`, `--keep-f32`.
    #[command(flatten)]
    pub dtype: DtypeArgs,
    /// config.json to use instead of the one next to the weights (a diffusers
    /// WanTransformer3DModel or original WanModel config). A single original-format file
    /// has none, and its head count cannot be read from shapes.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// `--shard-size`.
    #[command(flatten)]
    pub shard: ShardArg,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// `--device`: checked (cuda fails without a usable GPU); a restack only moves bytes
    /// and rounds dtypes (bit-identical anywhere, bound by the disk), so it runs on the CPU.
    #[command(flatten)]
    pub device: DeviceArg,
    /// `--allow-nonfinite`.
    #[command(flatten)]
    pub nonfinite: NonFiniteArg,
}

/// Runs `restack`.
pub fn execute(args: Args, p: &mut Printer) -> anyhow::Result<Status> {
    let options = RestackOptions {
        from: args.from,
        to: args.to,
        dtype: args.dtype.dtype,
        keep_f32: args.dtype.keep_f32,
        shard_bytes: args.shard.shard_size,
        config: args.config,
        replace: args.output.replace(),
        nonfinite: args.nonfinite.policy(),
    };
    let (_, device) = args.device.select()?;
    if device.used != "cpu" {
        p.line(format!(
            "device: cpu (a restack moves bytes and rounds dtypes, bit-identical on any \
             device and bound by the disk; {} stays idle)",
            device.name.as_deref().unwrap_or(device.used)
        ));
    }
    let outcome = restack_release(
        &args.input,
        &args.output.out,
        &options,
        &ExecOptions::default(),
        Hooks::default(),
    )?;
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
        let skipped = c["skipped"].as_array().into_iter().flatten().map(|s| {
            (
                s["key"].as_str().unwrap_or("?"),
                s["reason"].as_str().unwrap_or("?"),
            )
        });
        for line in wanbake::model::read_plan::skipped_lines(skipped) {
            p.warn(line);
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
    print_carried(p, &outcome.release, Some(options.to));
    p.json(&serde_json::json!({
        "dir": outcome.release.dir,
        "carried": outcome.release.carried,
        "report": outcome.report,
    }));
    Ok(Status::Ok)
}
