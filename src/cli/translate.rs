//! `wanbake translate ADAPTER --to CONVENTION [--from CONVENTION] [--base BASE] [--scale S]
//! --out DIR [--overwrite] [--json]`: writes the adapter in another convention (any of
//! `Convention::ALL`, clap's typed values), losslessly, or refuses and lists every entry the
//! target cannot express (nothing is written then).

use std::path::PathBuf;

use super::output::OutputDir;
use super::{Printer, Status};
use wanbake::adapter::{AdapterOptions, Convention};
use wanbake::translation::{TranslateRequest, translate};

/// Arguments of `translate`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The adapter: a .safetensors file, a PEFT folder, or a folder with one weights file.
    pub adapter: PathBuf,
    /// Target convention.
    #[arg(long, value_enum)]
    pub to: Convention,
    /// Read the adapter as this convention instead of detecting it.
    #[arg(long, value_enum)]
    pub from: Option<Convention>,
    /// Resolve module names against this base checkpoint's own keys and check shapes
    /// (needed for kohya names of non-WAN models and for conv kernels).
    #[arg(long)]
    pub base: Option<PathBuf>,
    /// σ for every low-rank entry (required for Qwix/NNX files without alpha metadata).
    #[arg(long)]
    pub scale: Option<f64>,
    /// `--out`, `--overwrite`.
    #[command(flatten)]
    pub output: OutputDir,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Runs `translate`.
pub fn execute(args: Args, p: &mut Printer) -> anyhow::Result<Status> {
    let req = TranslateRequest {
        adapter: args.adapter.clone(),
        to: args.to,
        opts: AdapterOptions {
            from: args.from,
            scale: args.scale,
            allow_unmatched: false,
        },
        base: args.base.clone(),
        out: args.output.out.clone(),
        replace: args.output.replace(),
    };
    let outcome = translate(&req)?;
    p.line(format!(
        "wrote {} ({} → {}, {} entries, {} tensors)",
        outcome.dir.display(),
        outcome.from,
        outcome.to,
        outcome.entries,
        outcome.tensors
    ));
    for n in &outcome.notes {
        p.warn(n);
    }
    p.json(&serde_json::to_value(&outcome)?);
    Ok(Status::Ok)
}
