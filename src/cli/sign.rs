//! `wanbake sign DIR --key PRIVATE.pem [--signature PATH] [--json]`, and the signature half of
//! `wanbake verify DIR --public-key PUBLIC.pem [--signature PATH]`.
//!
//! Prints and chooses exit codes only; the format and the checks are in `signing`. Exit
//! codes of verify with a key: 0 when the manifest (if present) and the signature hold, 3 on
//! any mismatch, 1 when the signature file is missing or unreadable.

use std::path::{Path, PathBuf};

use super::{Printer, Status};
use wanbake::release::manifest::{Manifest, verify_dir};
use wanbake::signing::{self, SignError, SigningKey, VerifyingKey};

/// Arguments of `sign`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The release folder to sign (every regular file in it is signed, except the top-level
    /// .git, .github, .gitattributes, .gitignore and the signature itself).
    pub dir: PathBuf,
    /// ECDSA private key (P-256, P-384 or P-521), PEM: PKCS#8 or SEC1.
    #[arg(long)]
    pub key: PathBuf,
    /// Where to write the signature bundle (default DIR/model.sig).
    #[arg(long)]
    pub signature: Option<PathBuf>,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Reads a private key; errors name it as `shown`.
pub fn load_private_key(path: &Path, shown: &str) -> anyhow::Result<SigningKey> {
    let text = std::fs::read(path)
        .map_err(|e| anyhow::anyhow!("{shown}: cannot read the key file: {e}"))?;
    Ok(SigningKey::from_pem(shown, &text)?)
}

/// Reads a public key.
pub fn load_public_key(path: &Path) -> anyhow::Result<VerifyingKey> {
    let shown = path.display().to_string();
    let text = std::fs::read(path)
        .map_err(|e| anyhow::anyhow!("{shown}: cannot read the key file: {e}"))?;
    Ok(VerifyingKey::from_pem(&shown, &text)?)
}

/// Runs `sign`.
pub fn execute(args: Args, p: &mut Printer) -> anyhow::Result<Status> {
    let key = load_private_key(&args.key, &args.key.display().to_string())?;
    let signature = args
        .signature
        .clone()
        .unwrap_or_else(|| signing::default_signature(&args.dir));
    let manifest = signing::valid_manifest(&args.dir)?;
    let r = signing::sign(&args.dir, &signature, &key, manifest.as_ref())?;
    p.json(&serde_json::to_value(&r)?);
    p.line(format!(
        "signed {}: {} files (digests from the {}), {} key hint {}, wrote {}",
        args.dir.display(),
        r.files,
        if manifest.is_some() {
            "verified manifest"
        } else {
            "files, hashed"
        },
        r.curve,
        r.key_hint,
        r.signature.display()
    ));
    Ok(Status::Ok)
}

/// `verify DIR --public-key KEY`: the manifest (when the folder has one) and the signature.
pub fn verify_signed(
    dir: &Path,
    public_key: &Path,
    signature: Option<&Path>,
    p: &mut Printer,
) -> anyhow::Result<Status> {
    let key = load_public_key(public_key)?;
    let signature = signature.map_or_else(|| signing::default_signature(dir), Path::to_path_buf);
    let has_manifest = dir.join(wanbake::io::checkpoint::MANIFEST_NAME).is_file();
    let mut manifest: Option<Manifest> = None;
    let mut manifest_report = None;
    if has_manifest {
        let report = verify_dir(dir)?;
        if report.ok() {
            // Just verified: its digests stand in for a second hashing pass.
            let bytes = fs_err::read(dir.join(wanbake::io::checkpoint::MANIFEST_NAME))?;
            manifest = Manifest::from_bytes(&bytes).ok();
        }
        manifest_report = Some(report);
    }
    let report = match signing::verify(dir, &signature, &key, manifest.as_ref()) {
        Ok(r) => r,
        Err(SignError::MissingSignature { path, source })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            p.error_line(format!(
                "error: {}: the release is not signed: there is no {} (sign it with `wanbake \
                 sign {} --key PRIVATE.pem`, or name its signature with --signature)",
                dir.display(),
                path.display(),
                dir.display()
            ));
            return Ok(Status::Failed);
        }
        Err(e @ SignError::MissingSignature { .. }) => {
            p.error_line(format!("error: {}", wanbake::error_text::Chain(&e)));
            return Ok(Status::Failed);
        }
        Err(e) => return Err(e.into()),
    };
    p.json(&super::verify::verify_json(
        dir,
        manifest_report.as_ref(),
        Some(&report),
    ));
    let mut ok = report.ok();
    if let Some(m) = &manifest_report {
        for x in &m.mismatches {
            let t = x
                .tensor
                .as_deref()
                .map(|t| format!(" tensor `{t}`"))
                .unwrap_or_default();
            p.error_line(format!("mismatch: {}{t}: {}", x.path, x.what));
        }
        if m.ok() {
            p.line(format!(
                "{}: manifest OK ({})",
                dir.display(),
                super::verify::verified(m)
            ));
            if m.status != "ok" {
                p.warn(format!("the manifest records status `{}`", m.status));
                ok = false;
            }
        } else {
            ok = false;
        }
    }
    if !report.hint_present {
        p.warn("the signature carries no key hint (older verification material); checked by the signature alone");
    }
    for x in &report.problems {
        p.error_line(format!("mismatch: signature: {x}"));
    }
    if report.ok() {
        p.line(format!(
            "{}: signature OK ({} files, {} key, {})",
            dir.display(),
            report.files_checked,
            report.curve,
            report.signature.display()
        ));
    }
    if ok {
        return Ok(Status::Ok);
    }
    p.error_line(format!("error: {}: verification failed", dir.display()));
    Ok(Status::VerifyFailed)
}
