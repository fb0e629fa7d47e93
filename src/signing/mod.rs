//! Signed releases: OpenSSF model signing (OMS) signatures in the offline key mode of PyPI
//! `model-signing` 1.1.1, so `python -m model_signing verify key` accepts what wanbake signs
//! and wanbake accepts what the reference tool signs (`spec/model_signing.md`).
//!
//! A signature file (`model.sig` by default, inside the release) is a Sigstore bundle v0.3
//! (`bundle`) whose DSSE envelope signs an in-toto statement (`statement`) listing the sha256
//! of every file of the folder (`folder`) with an ECDSA key (`keys`).
//!
//! Owns: `sign` (write a signature for a folder) and `verify` (check one), and the rules on
//! what a verifier refuses even though the reference tool accepts it (`ignore_paths` entries
//! that would hide a release file, `.`/empty/absolute/`..` entries). Does not own: the
//! release manifest or its verification (`release::manifest`), which only provides the per-file
//! digests when the caller found it valid for the folder.

pub mod bundle;
pub mod folder;
pub mod keys;
pub mod statement;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use keys::{Curve, KeyError, SigningKey, VerifyingKey};

use crate::io::checkpoint::MANIFEST_NAME;
use crate::release::manifest::Manifest;

/// The default signature file name inside a release (the name the OMS tools use).
pub use crate::io::checkpoint::SIGNATURE_NAME;

/// Why signing or verifying could not run. A signature that does not hold is not an error:
/// it is a `SignatureReport` with problems.
#[derive(Debug, thiserror::Error)]
pub enum SignError {
    /// An OS error on a file or folder.
    #[error("{}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The signature file is missing or unreadable (verify exits 1).
    #[error("{}: cannot read the signature", path.display())]
    MissingSignature {
        /// The signature path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The folder holds something a signature cannot cover.
    #[error("{}: {problem}", path.display())]
    Folder {
        /// The offending entry.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// A key could not be used.
    #[error(transparent)]
    Key(#[from] KeyError),
    /// Reading or hashing a file failed (the error names the file).
    #[error(transparent)]
    Read(#[from] crate::io::ReadError),
    /// Writing the signature failed (the error names the file).
    #[error(transparent)]
    Write(#[from] crate::release::staging::WriteError),
    /// A manifest records a digest that is not a sha256.
    #[error("{file}: bad sha256 `{hex}`")]
    BadDigest {
        /// The file as the manifest names it.
        file: String,
        /// The recorded digest.
        hex: String,
    },
}

impl SignError {
    fn io(path: &Path) -> impl Fn(std::io::Error) -> SignError + '_ {
        move |source| SignError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// What `sign` wrote.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SignReport {
    /// The signature file.
    pub signature: PathBuf,
    /// The key's curve.
    pub curve: &'static str,
    /// The public key hint recorded in the bundle.
    pub key_hint: String,
    /// Files signed.
    pub files: usize,
    /// The root digest (subject) of the statement.
    pub root_sha256: String,
    /// Where the per-file digests came from: `manifest` or `hashed`.
    pub digests_from: &'static str,
}

/// The result of checking a signature.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SignatureReport {
    /// The signature file.
    pub signature: PathBuf,
    /// The public key's curve.
    pub curve: &'static str,
    /// Did the bundle carry a key hint (when not, the key is only checked by the signature)?
    pub hint_present: bool,
    /// Files compared.
    pub files_checked: usize,
    /// Every reason the signature does not hold; empty when it does.
    pub problems: Vec<String>,
}

impl SignatureReport {
    /// True when the signature holds for the folder.
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// The release manifest of `dir` when it is present and `release::manifest::verify_dir` finds every
/// file as recorded (so its digests can stand in for a second hashing pass); `None` otherwise.
pub fn valid_manifest(dir: &Path) -> Result<Option<Manifest>, SignError> {
    let path = dir.join(MANIFEST_NAME);
    if !path.is_file() {
        return Ok(None);
    }
    let report = crate::release::manifest::verify_dir(dir)?;
    if !report.ok() {
        return Ok(None);
    }
    let bytes = fs_err::read(&path).map_err(SignError::io(&path))?;
    Ok(Manifest::from_bytes(&bytes).ok())
}

/// The default signature path of a folder.
pub fn default_signature(dir: &Path) -> PathBuf {
    dir.join(SIGNATURE_NAME)
}

/// Signs `dir` with `key` and writes the bundle to `signature` (atomically, replacing an old
/// one, which is never listed). `manifest` must be valid for `dir` (see `valid_manifest`).
pub fn sign(
    dir: &Path,
    signature: &Path,
    key: &SigningKey,
    manifest: Option<&Manifest>,
) -> Result<SignReport, SignError> {
    let model_name = fs_err::canonicalize(dir)
        .map_err(SignError::io(dir))?
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("")
        .to_string();
    sign_named(dir, signature, &model_name, key, manifest)
}

/// `sign`, with the statement's subject name given (bake signs a temporary directory that
/// becomes the release folder `model_name`; the name is informative, never compared).
pub fn sign_named(
    dir: &Path,
    signature: &Path,
    model_name: &str,
    key: &SigningKey,
    manifest: Option<&Manifest>,
) -> Result<SignReport, SignError> {
    let (ignored, _) = folder::base_ignores(dir, signature)?;
    let names = folder::walk(dir, &ignored)?;
    let resources = folder::resources(dir, &names, manifest)?;
    let payload = statement::build(model_name, &resources, &ignored);
    let sig = key.sign_der(&bundle::pae(&payload));
    let vk = key.verifying_key();
    let hint = vk.hint();
    let bytes = bundle::write(&hint, &payload, &sig);
    crate::release::staging::replace_file_durable(signature, &bytes)?;
    Ok(SignReport {
        signature: signature.to_path_buf(),
        curve: vk.curve().name(),
        key_hint: hint,
        files: resources.len(),
        root_sha256: crate::io::digest::hex(&statement::root_digest(&resources)),
        digests_from: if manifest.is_some() {
            "manifest"
        } else {
            "hashed"
        },
    })
}

/// Checks the signature `signature` of `dir` with `key` (`spec/model_signing.md` §8): strict
/// bundle, hint, ECDSA over the PAE of the payload bytes as stored, payload type, statement,
/// root digest, and exactly the same set of files with the same digests. `manifest` must be
/// valid for `dir` when given.
pub fn verify(
    dir: &Path,
    signature: &Path,
    key: &VerifyingKey,
    manifest: Option<&Manifest>,
) -> Result<SignatureReport, SignError> {
    let bytes = fs_err::read(signature).map_err(|source| SignError::MissingSignature {
        path: signature.to_path_buf(),
        source,
    })?;
    let mut report = SignatureReport {
        signature: signature.to_path_buf(),
        curve: key.curve().name(),
        hint_present: false,
        files_checked: 0,
        problems: Vec::new(),
    };
    let signed = match check_envelope(&bytes, key, &mut report.hint_present) {
        Ok(s) => s,
        Err(p) => {
            report.problems.push(p);
            return Ok(report);
        }
    };
    let (mut ignored, sig_rel) = folder::base_ignores(dir, signature)?;
    let all = match folder::walk(dir, &ignored) {
        Ok(all) => all,
        Err(e @ SignError::Folder { .. }) => {
            report.problems.push(e.to_string());
            return Ok(report);
        }
        Err(e) => return Err(e),
    };
    for p in &signed.ignore_paths {
        match check_ignore_path(p, &all, sig_rel.as_deref()) {
            Ok(Some(n)) => ignored.push(n),
            Ok(None) => {}
            Err(problem) => report.problems.push(problem),
        }
    }
    if !report.problems.is_empty() {
        return Ok(report);
    }
    let names: Vec<String> = all
        .into_iter()
        .filter(|n| !ignored.iter().any(|i| folder::is_under(n, i)))
        .collect();
    let found = folder::resources(dir, &names, manifest)?;
    report.files_checked = found.len();
    let found: BTreeMap<String, [u8; 32]> = found.into_iter().map(|r| (r.name, r.digest)).collect();
    for (name, d) in &found {
        match signed.resources.get(name) {
            None => report
                .problems
                .push(format!("{name}: file is not covered by the signature")),
            Some(want) if want != d => report.problems.push(format!(
                "{name}: sha256 {}, the signature says {}",
                crate::io::digest::hex(d),
                crate::io::digest::hex(want)
            )),
            Some(_) => {}
        }
    }
    for name in signed.resources.keys().filter(|n| !found.contains_key(*n)) {
        report
            .problems
            .push(format!("{name}: signed file is missing from the folder"));
    }
    Ok(report)
}

/// Steps 1-9 of §8 on the bundle bytes.
fn check_envelope(
    bytes: &[u8],
    key: &VerifyingKey,
    hint_present: &mut bool,
) -> Result<statement::Signed, String> {
    let b = bundle::parse(bytes)?;
    if let Some(h) = &b.hint {
        *hint_present = true;
        let mine = key.hint();
        if *h != mine {
            return Err(format!(
                "key mismatch: the bundle was made with the key whose hint is {h}, the given \
                 public key's hint is {mine}"
            ));
        }
    }
    key.verify_der(&bundle::pae(&b.payload), &b.signature)?;
    if b.payload_type != bundle::PAYLOAD_TYPE {
        return Err(format!(
            "payloadType `{}`, expected `{}`",
            b.payload_type,
            bundle::PAYLOAD_TYPE
        ));
    }
    statement::parse(&b.payload)
}

/// Accepts an `ignore_paths` entry of a signed statement only when it cannot hide a release
/// file: the git paths and the signature file itself, or an entry under which the folder
/// holds no file. Returns the normalised entry to ignore.
fn check_ignore_path(
    raw: &str,
    files: &[String],
    sig_rel: Option<&str>,
) -> Result<Option<String>, String> {
    let n = statement::normalise_name(raw);
    if raw.is_empty() || n == "." || n.starts_with('/') || n.split('/').any(|c| c == "..") {
        return Err(format!(
            "ignore_paths entry `{raw}` is unsafe (empty, `.`, absolute or with `..`): it could \
             hide the whole release from the signature"
        ));
    }
    if folder::GIT_PATHS.contains(&n.as_str()) || Some(n.as_str()) == sig_rel {
        return Ok(Some(n));
    }
    match files.iter().find(|f| folder::is_under(f, &n)) {
        Some(f) => Err(format!(
            "ignore_paths entry `{raw}` would hide the file `{f}` from the signature"
        )),
        None => Ok(None),
    }
}
