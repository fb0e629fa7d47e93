//! `wanbake synth --model ID --out DIR [--dtype ..] [--fill zero|random] [--seed N]
//! [--layers L] [--shard-size BYTES]`: synthetic checkpoints with the real shapes of
//! released models (for benchmarks and dry runs of real-world recipes).

use std::path::PathBuf;

use super::{Printer, Status, UsageError, output};
use wanbake::io::DType;
use wanbake::io::staging::Replace;
use wanbake::synth::{Fill, SynthModel, SynthSpec, synth_release, write_skeleton};

/// Arguments of `synth`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Model to imitate: wan2.1-t2v-1.3b, wan2.1-t2v-14b, wan2.1-i2v-14b, wan2.1-flf2v-14b,
    /// wan2.2-i2v-a14b, wan2.2-ti2v-5b, wan2.2-t2v-a14b, sa3-small, sa3-medium.
    #[arg(long)]
    pub model: String,
    /// Output directory.
    #[arg(long)]
    pub out: PathBuf,
    /// Storage dtype: f32, f16 or bf16.
    #[arg(long, default_value = "f32", value_parser = output::float_dtype)]
    pub dtype: DType,
    /// zero (sparse files, no disk used) or random.
    #[arg(long, default_value = "random")]
    pub fill: String,
    /// Seed for random values.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Override the number of WAN blocks.
    #[arg(long)]
    pub layers: Option<usize>,
    /// Shard the weights into files of at most this size ("5GB", "500MB", bytes).
    #[arg(long, value_name = "SIZE", value_parser = output::size)]
    pub shard_size: Option<u64>,
    /// Write headers, config.json and index only, tensor data as sparse zeros, no manifest
    /// and no hashing: a 14B skeleton in seconds, for `bake --dry-run` against real shapes.
    /// Needs --fill zero.
    #[arg(long)]
    pub skeleton: bool,
    /// Replace an existing output directory.
    #[arg(long)]
    pub overwrite: bool,
    /// Print the manifest summary as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Runs `synth`.
pub fn execute(args: Args, p: &mut Printer) -> anyhow::Result<Status> {
    let model = SynthModel::parse(&args.model).ok_or_else(|| {
        UsageError(format!(
            "unknown model `{}` (one of: {})",
            args.model,
            wanbake::names::either(SynthModel::named().iter().filter_map(|m| m.id()))
        ))
    })?;
    let fill = match args.fill.as_str() {
        "zero" => Fill::Zero,
        "random" => Fill::Random { seed: args.seed },
        other => return Err(UsageError(format!("unknown fill `{other}` (zero or random)")).into()),
    };
    let spec = SynthSpec {
        model,
        dtype: args.dtype,
        fill,
        layers: args.layers,
        shard_bytes: args.shard_size,
    };
    if args.skeleton {
        if fill != Fill::Zero {
            return Err(UsageError("--skeleton writes zeros: add --fill zero".into()).into());
        }
        if args.overwrite {
            return Err(UsageError("--skeleton does not replace an existing folder".into()).into());
        }
        let plan = write_skeleton(&spec, &args.out)?;
        p.line(format!(
            "wrote the skeleton of {} ({} weight files, {} tensor bytes as sparse zeros, no manifest)",
            args.out.display(),
            plan.files.len(),
            plan.total_bytes()
        ));
        p.json(&serde_json::json!({"dir": args.out, "files": plan.files.len(), "bytes": plan.total_bytes(), "skeleton": true}));
        return Ok(Status::Ok);
    }
    let replace = if args.overwrite {
        Replace::Overwrite
    } else {
        Replace::Never
    };
    let r = synth_release(&spec, &args.out, replace)?;
    let bytes: u64 = r.manifest.files.iter().map(|f| f.bytes).sum();
    p.line(format!(
        "wrote {} ({} files, {} bytes)",
        r.dir.display(),
        r.manifest.files.len(),
        bytes
    ));
    p.json(&serde_json::json!({"dir": r.dir, "files": r.manifest.files.len(), "bytes": bytes}));
    Ok(Status::Ok)
}
