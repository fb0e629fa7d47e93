//! Shared helpers for integration tests: run the real binary in a unique temp dir, build
//! safetensors files by hand, and read results back.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The built `wanbake` binary.
pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_wanbake"))
}

/// Repository root (for golden/ fixtures).
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A fresh temp directory, removed on drop.
pub fn tmp() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("wanbake-test-")
        .tempdir()
        .expect("temp dir")
}

/// Runs wanbake with `args` in `cwd`.
pub fn run(cwd: &Path, args: &[&str]) -> Output {
    Command::new(bin())
        .args(args)
        .current_dir(cwd)
        .output()
        .expect("spawn wanbake")
}

/// Exit code, stdout, stderr as strings.
pub fn parts(o: &Output) -> (i32, String, String) {
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Asserts success and returns stdout.
#[track_caller]
pub fn ok(o: Output) -> String {
    let (code, out, err) = parts(&o);
    assert_eq!(
        code, 0,
        "expected success\n--- stdout\n{out}\n--- stderr\n{err}"
    );
    out
}

/// Bytes of a safetensors file with the given header JSON and data section.
pub fn st_bytes(json: &str, data: &[u8]) -> Vec<u8> {
    let mut v = (json.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(json.as_bytes());
    v.extend_from_slice(data);
    v
}

/// Writes a well-formed safetensors file of f32 tensors (name, shape, values).
pub fn write_f32(path: &Path, tensors: &[(&str, Vec<usize>, Vec<f32>)]) {
    let mut json = String::from("{");
    let mut data = Vec::new();
    for (i, (name, shape, vals)) in tensors.iter().enumerate() {
        let begin = data.len();
        for v in vals {
            data.extend_from_slice(&v.to_le_bytes());
        }
        if i > 0 {
            json.push(',');
        }
        json.push_str(&format!(
            "\"{name}\":{{\"dtype\":\"F32\",\"shape\":{shape:?},\"data_offsets\":[{begin},{}]}}",
            data.len()
        ));
    }
    json.push('}');
    std::fs::write(path, st_bytes(&json, &data)).expect("write fixture");
}

/// Lists every entry (recursively) under `dir`, relative, sorted.
pub fn tree(dir: &Path) -> Vec<String> {
    fn walk(root: &Path, d: &Path, out: &mut Vec<String>) {
        if let Ok(rd) = std::fs::read_dir(d) {
            for e in rd.flatten() {
                let p = e.path();
                out.push(p.strip_prefix(root).unwrap().display().to_string());
                if p.is_dir() {
                    walk(root, &p, out);
                }
            }
        }
    }
    let mut v = Vec::new();
    walk(dir, dir, &mut v);
    v.sort();
    v
}

/// The tests' seeded generator: the library's SplitMix64 (`wanbake::rng`), the stream the
/// tests have always drawn. (Allowed unused: `dead_code` does not cover imports, and most test
/// crates draw nothing.)
#[allow(unused_imports)]
pub use wanbake::rng::SplitMix64 as Rng;
