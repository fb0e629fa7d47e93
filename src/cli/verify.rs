//! `wanbake verify DIR [--json] [--public-key KEY [--signature PATH]]`: recomputes every hash
//! of a release and compares it with the manifest; exit 3 and a list of every difference on
//! mismatch. With `--public-key`, the model signature is checked too (`cli::sign`).

use std::path::{Path, PathBuf};

use super::{Printer, Status};
use wanbake::human::plural;
use wanbake::release::manifest::{VerifyReport, verify_dir};
use wanbake::signing::SignatureReport;

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
    check_release_folder(&args.dir, args.public_key.is_some())?;
    if let Some(key) = &args.public_key {
        return super::sign::verify_signed(&args.dir, key, args.signature.as_deref(), p);
    }
    let report = verify_dir(&args.dir)?;
    p.json(&verify_json(&args.dir, Some(&report), None));
    if report.ok() {
        p.line(format!(
            "{}: OK ({})",
            args.dir.display(),
            verified(&report)
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
        "error: {}: verification failed ({})",
        args.dir.display(),
        plural(report.mismatches.len(), "mismatch", "mismatches")
    ));
    Ok(Status::VerifyFailed)
}

/// `verify --json`'s one document, with or without `--public-key`: `result` (`verified` when
/// the exit status is 0, else `failed`) and `reasons` for a script to test, then the
/// manifest's report and the signature's (each `null` when not checked), and `values` when
/// the manifest records saturated or non-finite values ([`recorded_values`]).
pub(super) fn verify_json(
    dir: &Path,
    manifest: Option<&VerifyReport>,
    signature: Option<&SignatureReport>,
) -> serde_json::Value {
    let mut reasons = Vec::new();
    if let Some(m) = manifest {
        if !m.ok() {
            reasons.push(format!(
                "{} with the manifest",
                plural(m.mismatches.len(), "mismatch", "mismatches")
            ));
        } else if m.status != "ok" {
            reasons.push(format!("the manifest records status `{}`", m.status));
        }
    }
    if let Some(s) = signature {
        reasons.extend(s.problems.iter().map(|x| format!("signature: {x}")));
    }
    let result = if reasons.is_empty() {
        "verified"
    } else {
        "failed"
    };
    let mut doc = serde_json::json!({
        "result": result,
        "reasons": reasons,
        "dir": dir.display().to_string(),
        "manifest": manifest,
        "signature": signature,
    });
    if let Some(values) = manifest.and(recorded_values(dir)) {
        doc["values"] = values;
    }
    doc
}

/// What the manifest's report records about the values written, when it records any:
/// `saturated` (each scaled-fp8 tensor's values clamped to ±448, by design) and `nonfinite`
/// (the values written that the output cannot hold, `--allow-nonfinite`). `None` for a
/// release with neither (or a manifest that cannot be read, which verify reports itself).
fn recorded_values(dir: &Path) -> Option<serde_json::Value> {
    let path = dir.join(wanbake::io::checkpoint::MANIFEST_NAME);
    let m: serde_json::Value = serde_json::from_slice(&fs_err::read(path).ok()?).ok()?;
    let report = &m["report"];
    let mut values = serde_json::Map::new();
    let saturated: serde_json::Map<String, serde_json::Value> = (report["quantization"]["tensors"]
        .as_object()
        .into_iter()
        .flatten())
    .filter_map(|(name, t)| Some((name.clone(), t.get("saturated")?.clone())))
    .collect();
    if !saturated.is_empty() {
        values.insert("saturated".into(), saturated.into());
    }
    if let Some(n) = report.get("nonfinite") {
        values.insert("nonfinite".into(), n.clone());
    }
    (!values.is_empty()).then_some(serde_json::Value::Object(values))
}

/// A release is a folder: say so when `dir` is missing, is a file, or (without a key, which
/// can check a folder by its signature alone) holds no manifest.
fn check_release_folder(dir: &Path, with_key: bool) -> anyhow::Result<()> {
    let manifest = wanbake::io::checkpoint::MANIFEST_NAME;
    if !dir.exists() {
        anyhow::bail!("{}: no such folder", dir.display());
    }
    if !dir.is_dir() {
        anyhow::bail!(
            "{} is a file; a release is the folder holding {manifest} and the files it lists: \
             verify that folder",
            dir.display()
        );
    }
    if !with_key && !dir.join(manifest).is_file() {
        anyhow::bail!(
            "{}: no {manifest}, so not a wanbake release (a folder signed without a manifest \
             is checked by its signature: --public-key KEY)",
            dir.display()
        );
    }
    Ok(())
}

/// What a verification that passed checked: `2 files, 42 tensors verified; status ok`.
pub(super) fn verified(report: &VerifyReport) -> String {
    format!(
        "{}, {} verified; status {}",
        plural(report.files_checked, "file", "files"),
        plural(report.tensors_checked, "tensor", "tensors"),
        report.status
    )
}
