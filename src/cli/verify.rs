//! `wanbake verify DIR [--json] [--public-key KEY [--signature PATH]]`: recomputes every hash
//! of a release and compares it with the manifest; exit 3 and a list of every difference on
//! mismatch. With `--public-key`, the model signature is checked too (`cli::sign`).

use std::path::PathBuf;

use super::{Printer, Status};
use wanbake::manifest::verify_dir;

/// Arguments of `verify`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Output directory written by wanbake (holds wanbake.manifest.json).
    pub dir: PathBuf,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Also check the folder's model signature with this ECDSA public key (PEM); a folder
    /// without a manifest is then checked by its signature alone.
    #[arg(long)]
    pub public_key: Option<PathBuf>,
    /// The signature to check (default DIR/model.sig); needs --public-key.
    #[arg(long, requires = "public_key")]
    pub signature: Option<PathBuf>,
}

/// Runs `verify`.
pub fn execute(args: Args, p: &mut Printer) -> anyhow::Result<Status> {
    if let Some(key) = &args.public_key {
        return super::sign::verify_signed(&args.dir, key, args.signature.as_deref(), p);
    }
    let report = verify_dir(&args.dir)?;
    p.json(&serde_json::to_value(&report)?);
    if report.ok() {
        p.line(format!(
            "{}: OK ({} files, {} tensors verified; status {})",
            args.dir.display(),
            report.files_checked,
            report.tensors_checked,
            report.status
        ));
        if report.status != "ok" {
            p.warn(format!("the manifest records status `{}`", report.status));
            return Ok(Status::VerifyFailed);
        }
        return Ok(Status::Ok);
    }
    for m in &report.mismatches {
        let t = m
            .tensor
            .as_deref()
            .map(|t| format!(" tensor `{t}`"))
            .unwrap_or_default();
        p.error_line(format!("mismatch: {}{t}: {}", m.path, m.what));
    }
    p.error_line(format!(
        "error: {}: verification failed ({} mismatch(es))",
        args.dir.display(),
        report.mismatches.len()
    ));
    Ok(Status::VerifyFailed)
}
