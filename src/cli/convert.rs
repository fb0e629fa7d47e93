//! `wanbake convert IN --dtype bf16|f16|f32 --out DIR [--shard-size BYTES]`: converts every
//! float tensor of any checkpoint, mirroring its naming, as a verified release.

use std::path::PathBuf;

use super::output;
use super::{Printer, Status};
use wanbake::convert::{ConvertSpec, DtypeChoice, convert_release, keep_none};
use wanbake::io::DType;
use wanbake::io::staging::Replace;

/// Arguments of `convert`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Input checkpoint (file, index, folder, pipeline).
    pub input: PathBuf,
    /// Output dtype for float tensors: f32, f16 or bf16.
    #[arg(long, value_parser = output::float_dtype)]
    pub dtype: DType,
    /// Output directory.
    #[arg(long)]
    pub out: PathBuf,
    /// Shard the weights into files of at most this size ("5GB", "500MB", bytes).
    #[arg(long, value_name = "SIZE", value_parser = output::size)]
    pub shard_size: Option<u64>,
    /// Replace an existing output directory.
    #[arg(long)]
    pub overwrite: bool,
    /// Print a JSON summary.
    #[arg(long)]
    pub json: bool,
}

/// Runs `convert`.
pub fn execute(args: Args, p: &mut Printer) -> anyhow::Result<Status> {
    let spec = ConvertSpec {
        input: args.input,
        out: args.out,
        dtypes: DtypeChoice {
            target: Some(args.dtype),
            keep_f32: keep_none,
        },
        shard_bytes: args.shard_size,
        replace: if args.overwrite {
            Replace::Overwrite
        } else {
            Replace::Never
        },
    };
    let r = convert_release(&spec)?;
    let bytes: u64 = r.manifest.files.iter().map(|f| f.bytes).sum();
    p.line(format!(
        "wrote {} ({} files, {} bytes)",
        r.dir.display(),
        r.manifest.files.len(),
        bytes
    ));
    p.json(&serde_json::json!({"dir": r.dir, "report": r.manifest.report, "bytes": bytes}));
    Ok(Status::Ok)
}
