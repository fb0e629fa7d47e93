//! `wanbake translate ADAPTER --to peft|diffusers|comfy|kohya|lycoris|sa3|nnx [--from C] [--base BASE]
//! [--scale S] --out DIR [--overwrite] [--json]`: writes the adapter in another convention,
//! losslessly, or refuses and lists every entry the target cannot express (nothing is
//! written then).

use std::path::PathBuf;

use super::{Printer, Status, UsageError};
use wanbake::adapter::{AdapterOptions, Convention};
use wanbake::io::staging::Replace;
use wanbake::translation::{TranslateRequest, translate};

/// Arguments of `translate`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The adapter: a .safetensors file, a PEFT folder, or a folder with one weights file.
    pub adapter: PathBuf,
    /// Target convention: peft, diffusers, comfy, kohya, lycoris, sa3 or nnx.
    #[arg(long)]
    pub to: String,
    /// Read the adapter as this convention instead of detecting it.
    #[arg(long)]
    pub from: Option<String>,
    /// Resolve module names against this base checkpoint's own keys and check shapes
    /// (needed for kohya names of non-WAN models and for conv kernels).
    #[arg(long)]
    pub base: Option<PathBuf>,
    /// σ for every low-rank entry (required for Qwix/NNX files without alpha metadata).
    #[arg(long)]
    pub scale: Option<f64>,
    /// Output directory (written atomically, with a manifest).
    #[arg(long)]
    pub out: PathBuf,
    /// Replace an existing output directory.
    #[arg(long)]
    pub overwrite: bool,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

fn convention(s: &str, flag: &str) -> Result<Convention, UsageError> {
    s.parse().map_err(|e| UsageError(format!("{flag}: {e}")))
}

/// Runs `translate`.
pub fn execute(args: Args, p: &mut Printer) -> anyhow::Result<Status> {
    let to = convention(&args.to, "--to")?;
    let from = args
        .from
        .as_deref()
        .map(|s| convention(s, "--from"))
        .transpose()?;
    let req = TranslateRequest {
        adapter: args.adapter.clone(),
        to,
        opts: AdapterOptions {
            from,
            scale: args.scale,
            allow_unmatched: false,
        },
        base: args.base.clone(),
        out: args.out.clone(),
        replace: if args.overwrite {
            Replace::Overwrite
        } else {
            Replace::Never
        },
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
