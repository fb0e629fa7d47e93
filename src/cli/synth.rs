//! `wanbake synth --model ID --out DIR [--dtype ..] [--fill zero|random] [--seed N]
//! [--layers L] [--shard-size SIZE] [--skeleton] [--overwrite] [--json]`: synthetic
//! checkpoints with the real shapes of released models (for benchmarks and dry runs of
//! real-world recipes). Flags and values are clap's typed ones (`cli::output`'s shared flags,
//! `SynthModel`'s and `Fill`'s `ValueEnum`s).

use super::output::{FloatDtypeArg, OutputDir, ShardArg};
use super::{Printer, Status, UsageError};
use wanbake::human::{plural, size};
use wanbake::io::DType;
use wanbake::synth::{Fill, SynthModel, SynthSpec, synth_release, write_skeleton};

/// Arguments of `synth`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Model to imitate (the ids `inspect` prints).
    #[arg(long, value_enum, value_name = "ID")]
    pub model: SynthModel,
    /// `--out`, `--overwrite`.
    #[command(flatten)]
    pub output: OutputDir,
    /// `--dtype` (default f32).
    #[command(flatten)]
    pub dtype: FloatDtypeArg,
    /// zero (sparse files, no disk used) or random (seeded by --seed).
    #[arg(long, value_enum, default_value_t = Fill::Random { seed: 0 })]
    pub fill: Fill,
    /// Seed for random values.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Override the number of WAN blocks.
    #[arg(long)]
    pub layers: Option<usize>,
    /// `--shard-size`.
    #[command(flatten)]
    pub shard: ShardArg,
    /// Write headers, config.json and index only, tensor data as sparse zeros, no manifest
    /// and no hashing: a 14B skeleton in seconds, for `bake --dry-run` against real shapes.
    /// Needs --fill zero.
    #[arg(long)]
    pub skeleton: bool,
    /// Print the manifest summary as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Runs `synth`.
pub fn execute(args: Args, p: &mut Printer) -> anyhow::Result<Status> {
    let fill = args.fill.seeded(args.seed);
    let spec = SynthSpec {
        model: args.model,
        dtype: args
            .dtype
            .dtype
            .and_then(|d| d.0.float())
            .unwrap_or(DType::F32),
        fill,
        layers: args.layers,
        shard_bytes: args.shard.shard_size,
    };
    if args.skeleton {
        if fill != Fill::Zero {
            return Err(UsageError("--skeleton writes zeros: add --fill zero".into()).into());
        }
        if args.output.overwrite {
            return Err(UsageError("--skeleton does not replace an existing folder".into()).into());
        }
        let plan = write_skeleton(&spec, &args.output.out)?;
        p.line(format!(
            "wrote the skeleton of {} ({} weight files, {} tensor bytes as sparse zeros, no manifest)",
            args.output.out.display(),
            plan.files.len(),
            plan.total_bytes()
        ));
        p.json(&serde_json::json!({"dir": args.output.out, "files": plan.files.len(), "bytes": plan.total_bytes(), "skeleton": true}));
        return Ok(Status::Ok);
    }
    let r = synth_release(
        &spec,
        &args.output.out,
        args.output.replace(),
        wanbake::release::Hooks::default(),
    )?;
    let bytes: u64 = r.manifest.files.iter().map(|f| f.bytes).sum();
    p.line(format!(
        "wrote {} ({}, {})",
        r.dir.display(),
        plural(r.manifest.files.len(), "file", "files"),
        size(bytes)
    ));
    p.json(&serde_json::json!({"dir": r.dir, "files": r.manifest.files.len(), "bytes": bytes}));
    Ok(Status::Ok)
}
