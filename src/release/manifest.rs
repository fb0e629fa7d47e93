//! The release manifest (`wanbake.manifest.json`) and `verify`.
//!
//! Owns: the manifest document (tool version, inputs with sha256, options, per-file sha256
//! and size, per-tensor dtype/shape/sha256, the report of the stage that wrote it, check
//! results), its canonical serialisation (sorted keys, fixed indentation, no timestamps, a
//! trailing self-hash over the rest of the document), and the verification of a directory
//! against it. Does not own: computing the hashes (`io::digest`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::io::checkpoint::{MANIFEST_NAME, SIGNATURE_NAME};
use crate::io::digest::{self, TensorDigest};
use crate::io::file::ReadError;
use crate::io::input_hash::{NO_PACE, Pace};
use crate::progress::Progress;
use crate::release::staging::Sealed;
use crate::release::writer::OutputPlan;

/// Identifies the manifest schema.
pub const FORMAT: &str = "wanbake.manifest/1";

/// The manifest document.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Schema identifier.
    pub format: String,
    /// Tool name and version.
    pub tool: Tool,
    /// The subcommand that wrote the output.
    pub command: String,
    /// `ok`, or `check_failed` when a post-write check failed.
    pub status: String,
    /// Every input file read.
    pub inputs: Vec<InputRecord>,
    /// The options (or normalised recipe) that produced the output.
    pub options: serde_json::Value,
    /// Every output file except the manifest itself, sorted by path.
    pub files: Vec<FileRecord>,
    /// What the stage did (merge report, restack report, ...).
    pub report: serde_json::Value,
    /// Post-write checks (bake's golden checks); empty when none ran.
    pub checks: serde_json::Value,
    /// sha256 of the canonical serialisation of this document with this field empty.
    pub manifest_sha256: String,
}

/// Tool identity.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tool {
    /// Always `wanbake`.
    pub name: String,
    /// Crate version.
    pub version: String,
}

impl Default for Tool {
    fn default() -> Self {
        Tool {
            name: "wanbake".into(),
            version: env!("CARGO_PKG_VERSION").into(),
        }
    }
}

/// One input file.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputRecord {
    /// Role: `base`, `adapter`, `recipe`, `inputs`, ...
    pub role: String,
    /// The path as the user gave it (or relative to the recipe).
    pub path: String,
    /// Size.
    pub bytes: u64,
    /// sha256 of the whole file.
    pub sha256: String,
}

/// One output file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileRecord {
    /// Path relative to the output directory, `/`-separated.
    pub path: String,
    /// Size.
    pub bytes: u64,
    /// sha256 of the whole file.
    pub sha256: String,
    /// Per-tensor digests, for safetensors files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensors: Option<BTreeMap<String, TensorDigest>>,
}

impl Manifest {
    /// A manifest for a sealed output.
    pub fn new(
        command: &str,
        inputs: Vec<InputRecord>,
        options: serde_json::Value,
        plan: &OutputPlan,
        sealed: &Sealed,
        report: serde_json::Value,
    ) -> Manifest {
        let mut files: Vec<FileRecord> = plan
            .files
            .iter()
            .zip(&sealed.weights)
            .map(|(p, d)| FileRecord {
                path: slash_path(&p.rel_path),
                bytes: d.bytes,
                sha256: d.sha256.clone(),
                tensors: Some(d.tensors.clone()),
            })
            .collect();
        files.extend(sealed.aux.iter().map(|(p, (bytes, sha))| FileRecord {
            path: slash_path(p),
            bytes: *bytes,
            sha256: sha.clone(),
            tensors: None,
        }));
        files.sort_by(|a, b| a.path.cmp(&b.path));
        let mut inputs = inputs;
        inputs.sort();
        Manifest {
            format: FORMAT.into(),
            tool: Tool::default(),
            command: command.into(),
            status: "ok".into(),
            inputs,
            options,
            files,
            report,
            checks: serde_json::Value::Array(Vec::new()),
            manifest_sha256: String::new(),
        }
    }

    /// The canonical bytes: pretty JSON with sorted keys, a trailing newline, and
    /// `manifest_sha256` filled with the hash of the same document where it is empty.
    pub fn to_canonical_bytes(&self) -> Vec<u8> {
        let mut m = self.clone();
        m.manifest_sha256 = String::new();
        let unsigned = canonical_json(&m);
        m.manifest_sha256 = digest::sha256_hex(&unsigned);
        canonical_json(&m)
    }

    /// Parses manifest bytes and checks they are exactly canonical and self-consistent, so
    /// any change to the manifest file itself is detected.
    pub fn from_bytes(bytes: &[u8]) -> Result<Manifest, String> {
        let m: Manifest =
            serde_json::from_slice(bytes).map_err(|e| format!("not a valid manifest: {e}"))?;
        if m.format != FORMAT {
            return Err(format!(
                "unknown manifest format `{}` (expected `{FORMAT}`)",
                m.format
            ));
        }
        let canonical = m.to_canonical_bytes();
        if canonical != bytes {
            return Err(
                "manifest bytes were modified (not the canonical form wanbake writes)".into(),
            );
        }
        Ok(m)
    }

    /// Inputs recorded for a role.
    pub fn inputs_with_role<'a>(&'a self, role: &'a str) -> impl Iterator<Item = &'a InputRecord> {
        self.inputs.iter().filter(move |i| i.role == role)
    }
}

fn canonical_json<T: Serialize>(v: &T) -> Vec<u8> {
    // Round-trip through Value: serde_json's map is a BTreeMap (no preserve_order feature),
    // so every object's keys come out sorted regardless of struct field order.
    let value = serde_json::to_value(v).expect("manifest values always serialise");
    let mut out = serde_json::to_vec_pretty(&value).expect("JSON values always serialise");
    out.push(b'\n');
    out
}

fn slash_path(p: &Path) -> String {
    p.components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join("/")
}

/// An input to record: role, path to read, path as shown in the manifest.
pub type InputFile = (String, PathBuf, String);

/// Hashes one input file for the manifest (through the input-hash cache, refusing a file
/// that changes while it is read, asking `pace` before each read: `io::input_hash`).
pub fn record_input(
    (role, path, shown): &InputFile,
    phase: &Progress,
    pace: Pace<'_>,
) -> Result<InputRecord, ReadError> {
    let (bytes, sha256) = crate::io::input_hash::sha256_input(path, &|n| phase.add_bytes(n), pace)?;
    phase.add_item();
    Ok(InputRecord {
        role: role.clone(),
        path: shown.clone(),
        bytes,
        sha256,
    })
}

/// Hashes input files for the manifest (in parallel across files).
pub fn record_inputs(files: &[InputFile]) -> Result<Vec<InputRecord>, ReadError> {
    use rayon::prelude::*;
    let phase = hashing_phase(files);
    (files.par_iter())
        .map(|f| record_input(f, &phase, NO_PACE))
        .collect()
}

/// Hashes input files one after another on the calling thread, at `pace` (the release
/// writer runs this beside the producer, which has the worker threads).
pub fn record_inputs_here(
    files: &[InputFile],
    pace: Pace<'_>,
) -> Result<Vec<InputRecord>, ReadError> {
    let phase = hashing_phase(files);
    files
        .iter()
        .map(|f| record_input(f, &phase, pace))
        .collect()
}

fn hashing_phase(files: &[InputFile]) -> crate::progress::PhaseGuard {
    let total = files
        .iter()
        .filter_map(|(_, p, _)| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum();
    crate::progress::begin("hashing inputs", total, files.len() as u64)
}

/// One difference found by `verify`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Mismatch {
    /// File (relative), or the manifest.
    pub path: String,
    /// Tensor, when the difference is inside a tensor.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tensor: Option<String>,
    /// What differs.
    pub what: String,
}

/// Result of verifying a directory.
#[derive(Clone, Debug, Serialize)]
pub struct VerifyReport {
    /// The directory.
    pub dir: String,
    /// Files checked.
    pub files_checked: usize,
    /// Tensors checked.
    pub tensors_checked: usize,
    /// Status recorded in the manifest.
    pub status: String,
    /// Every difference.
    pub mismatches: Vec<Mismatch>,
}

impl VerifyReport {
    /// True when nothing differs.
    pub fn ok(&self) -> bool {
        self.mismatches.is_empty()
    }
}

/// Recomputes every hash of `dir` and compares with its manifest. Files are checked in
/// parallel; every difference is reported, not only the first.
pub fn verify_dir(dir: &Path) -> Result<VerifyReport, ReadError> {
    verify_with(dir, |manifest, report| {
        let total = manifest.files.iter().map(|f| f.bytes).sum();
        let phase = crate::progress::begin("verifying", total, manifest.files.len() as u64);
        for (tensors, m) in verify_files(dir, &manifest.files, &phase) {
            report.files_checked += 1;
            report.tensors_checked += tensors;
            report.mismatches.extend(m);
        }
    })
}

/// Checks a release this process has just committed, without reading its weights again:
/// the manifest was made from the digests of the bytes written (`release::ordered`) and sealed,
/// so here the manifest on disk must be the bytes that were written, and every listed file
/// must exist with its recorded size and nothing else be there. (`verify_dir`, what
/// `wanbake verify` runs, re-reads everything.)
pub fn verify_committed(dir: &Path, written: &[u8]) -> Result<VerifyReport, ReadError> {
    verify_with(dir, |manifest, report| {
        let mpath = dir.join(MANIFEST_NAME);
        match std::fs::read(&mpath) {
            Ok(b) if b == written => {}
            Ok(_) => report.mismatches.push(Mismatch {
                path: MANIFEST_NAME.into(),
                tensor: None,
                what: "differs from the manifest this run wrote".into(),
            }),
            Err(e) => report.mismatches.push(Mismatch {
                path: MANIFEST_NAME.into(),
                tensor: None,
                what: e.to_string(),
            }),
        }
        for f in &manifest.files {
            report.files_checked += 1;
            report.tensors_checked += f.tensors.as_ref().map_or(0, |t| t.len());
            let what = match std::fs::metadata(dir.join(&f.path)) {
                Ok(m) if m.len() == f.bytes => continue,
                Ok(m) => format!("size {}, manifest says {}", m.len(), f.bytes),
                Err(e) => e.to_string(),
            };
            report.mismatches.push(Mismatch {
                path: f.path.clone(),
                tensor: None,
                what,
            });
        }
    })
}

/// Reads and parses the manifest of `dir`, runs `check` on it, then reports files that the
/// manifest does not list.
fn verify_with(
    dir: &Path,
    check: impl FnOnce(&Manifest, &mut VerifyReport),
) -> Result<VerifyReport, ReadError> {
    let mpath = dir.join(MANIFEST_NAME);
    let bytes = std::fs::read(&mpath).map_err(|e| ReadError::io(&mpath, e))?;
    let mut report = VerifyReport {
        dir: dir.display().to_string(),
        files_checked: 0,
        tensors_checked: 0,
        status: String::new(),
        mismatches: Vec::new(),
    };
    let manifest = match Manifest::from_bytes(&bytes) {
        Ok(m) => m,
        Err(what) => {
            report.mismatches.push(Mismatch {
                path: MANIFEST_NAME.into(),
                tensor: None,
                what,
            });
            return Ok(report);
        }
    };
    report.status = manifest.status.clone();
    check(&manifest, &mut report);
    let listed: std::collections::BTreeSet<&str> =
        manifest.files.iter().map(|f| f.path.as_str()).collect();
    for extra in list_files(dir, dir) {
        if extra != MANIFEST_NAME && extra != SIGNATURE_NAME && !listed.contains(extra.as_str()) {
            report.mismatches.push(Mismatch {
                path: extra,
                tensor: None,
                what: "file is not listed in the manifest".into(),
            });
        }
    }
    Ok(report)
}

/// Checks every file in parallel, counting each on `phase` (its bytes as they are read,
/// the file once it is done); (tensors checked, mismatches) per file, in `files`' order.
fn verify_files(dir: &Path, files: &[FileRecord], phase: &Progress) -> Vec<(usize, Vec<Mismatch>)> {
    use rayon::prelude::*;
    files
        .par_iter()
        .map(|f| {
            let checked = verify_file(dir, f, phase);
            phase.add_item();
            checked
        })
        .collect()
}

fn verify_file(dir: &Path, f: &FileRecord, phase: &Progress) -> (usize, Vec<Mismatch>) {
    let path = dir.join(&f.path);
    let mut out = Vec::new();
    let miss = |what: String| Mismatch {
        path: f.path.clone(),
        tensor: None,
        what,
    };
    let Some(expected_tensors) = &f.tensors else {
        phase.add_bytes(f.bytes);
        match digest::sha256_file(&path) {
            Ok((bytes, sha)) => {
                if bytes != f.bytes {
                    out.push(miss(format!("size {bytes}, manifest says {}", f.bytes)));
                }
                if sha != f.sha256 {
                    out.push(miss(format!("sha256 {sha}, manifest says {}", f.sha256)));
                }
            }
            Err(e) => out.push(miss(crate::error_text::chain(&e))),
        }
        return (0, out);
    };
    let d = match crate::io::gguf::digest_weight_file(&path, &|n| phase.add_bytes(n)) {
        Ok(d) => d,
        Err(e) => return (0, vec![miss(crate::error_text::chain(&e))]),
    };
    if d.bytes != f.bytes {
        out.push(miss(format!("size {}, manifest says {}", d.bytes, f.bytes)));
    }
    if d.sha256 != f.sha256 {
        out.push(miss(format!(
            "sha256 {}, manifest says {}",
            d.sha256, f.sha256
        )));
    }
    for (name, exp) in expected_tensors {
        match d.tensors.get(name) {
            None => out.push(Mismatch {
                path: f.path.clone(),
                tensor: Some(name.clone()),
                what: "tensor missing from the file".into(),
            }),
            Some(got) if got != exp => out.push(Mismatch {
                path: f.path.clone(),
                tensor: Some(name.clone()),
                what: describe_tensor_diff(exp, got),
            }),
            Some(_) => {}
        }
    }
    for name in d
        .tensors
        .keys()
        .filter(|n| !expected_tensors.contains_key(*n))
    {
        out.push(Mismatch {
            path: f.path.clone(),
            tensor: Some(name.clone()),
            what: "tensor not listed in the manifest".into(),
        });
    }
    (expected_tensors.len(), out)
}

fn describe_tensor_diff(exp: &TensorDigest, got: &TensorDigest) -> String {
    if exp.dtype != got.dtype || exp.shape != got.shape {
        format!(
            "{} {:?} in the file, manifest says {} {:?}",
            got.dtype, got.shape, exp.dtype, exp.shape
        )
    } else {
        format!("sha256 {}, manifest says {}", got.sha256, exp.sha256)
    }
}

fn list_files(root: &Path, dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(list_files(root, &p));
        } else if let Ok(rel) = p.strip_prefix(root) {
            out.push(slash_path(rel));
        }
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Manifest {
        Manifest {
            format: FORMAT.into(),
            tool: Tool::default(),
            command: "test".into(),
            status: "ok".into(),
            inputs: vec![],
            options: serde_json::json!({"b": 1, "a": [2, 3]}),
            files: vec![],
            report: serde_json::json!({}),
            checks: serde_json::json!([]),
            manifest_sha256: String::new(),
        }
    }

    /// The `verifying` phase counts files as they complete (it stayed at 0/N until the
    /// end), and bytes as they are read.
    #[test]
    fn verifying_counts_each_file_and_its_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let contents: [&[u8]; 3] = [b"one", b"", b"three"];
        let files: Vec<FileRecord> = contents
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let path = format!("f{i}");
                std::fs::write(dir.path().join(&path), c).unwrap();
                FileRecord {
                    path,
                    bytes: c.len() as u64,
                    sha256: "0".repeat(64),
                    tensors: None,
                }
            })
            .collect();
        let phase = Progress::new(8, 3);
        let checked = verify_files(dir.path(), &files, &phase);
        assert_eq!(checked.len(), 3);
        let s = phase.snapshot();
        assert_eq!((s.items, s.bytes), (3, 8));
    }

    /// A pipeline folder that is a release carries neither its manifest nor its signature
    /// into an output made from it (`io::checkpoint` spells the signature's name itself).
    #[test]
    fn a_releases_own_files_are_not_carried() {
        let not = crate::io::checkpoint::NOT_CARRIED_AT_ROOT;
        assert!(not.contains(&SIGNATURE_NAME) && not.contains(&MANIFEST_NAME));
    }

    #[test]
    fn canonical_bytes_are_sorted_stable_and_self_checking() {
        let m = sample();
        let b = m.to_canonical_bytes();
        let text = std::str::from_utf8(&b).unwrap();
        assert!(text.find("\"a\"").unwrap() < text.find("\"b\"").unwrap());
        assert!(text.find("\"checks\"").unwrap() < text.find("\"tool\"").unwrap());
        let back = Manifest::from_bytes(&b).unwrap();
        assert_eq!(back.to_canonical_bytes(), b);
        // Any single-byte change is caught.
        for pos in [0, b.len() / 3, b.len() / 2, b.len() - 2] {
            let mut bad = b.clone();
            bad[pos] ^= 0x01;
            assert!(
                Manifest::from_bytes(&bad).is_err(),
                "flip at {pos} undetected"
            );
        }
    }
}
