//! Shared helpers for integration tests: run the real binary in a unique temp dir, build
//! safetensors files by hand, and read results back.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use wanbake::io::{Checkpoint, DType};

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

/// A safetensors file of (name, dtype, shape, bytes), with optional `__metadata__`.
pub fn write_raw(path: &Path, tensors: &[(&str, &str, Vec<usize>, Vec<u8>)], meta: Option<&str>) {
    let mut json = String::from("{");
    if let Some(m) = meta {
        json.push_str(&format!("\"__metadata__\":{m},"));
    }
    let mut data = Vec::new();
    for (i, (name, dtype, shape, bytes)) in tensors.iter().enumerate() {
        let begin = data.len();
        data.extend_from_slice(bytes);
        if i > 0 {
            json.push(',');
        }
        json.push_str(&format!(
            "\"{name}\":{{\"dtype\":\"{dtype}\",\"shape\":{shape:?},\"data_offsets\":[{begin},{}]}}",
            data.len()
        ));
    }
    json.push('}');
    std::fs::write(path, st_bytes(&json, &data)).expect("write fixture");
}

/// Writes a well-formed safetensors file of f32 tensors (name, shape, values).
pub fn write_f32(path: &Path, tensors: &[(&str, Vec<usize>, Vec<f32>)]) {
    let raw: Vec<(&str, &str, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(name, shape, vals)| {
            let bytes = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
            (*name, "F32", shape.clone(), bytes)
        })
        .collect();
    write_raw(path, &raw, None);
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

// ---------------------------------------------------------------------------------------
// Runs held at their gate.
//
// A test that changes a run's inputs while it reads them, or interrupts it, needs the run
// held at a known point: its inputs mapped and its temporary output created. The library
// offers that point as `release::Hooks::gate`, which only a caller can set (no production
// run reads a test hook from its environment). These tests start a copy of their own test
// binary that runs one library command with that hook (`gated_child`), as `wanbake` would
// run it: signal and SIGBUS guards installed, the error printed as its chain, exit code 1.

/// The environment variable that tells a test binary started by [`spawn_gated`] which
/// command to run (read by the test code of [`gated_child`] only).
pub const GATE_COMMAND: &str = "WANBAKE_TESTS_GATED_COMMAND";

/// Starts test `child_test` of the current test binary (a `#[test] #[ignore]` function that
/// calls [`gated_child`]) in `cwd`, running `command` held at `cwd/gate`, and waits until it
/// is held there (`gate.ready`). Release it by creating `gate.go`.
pub fn spawn_gated(
    child_test: &str,
    command: &str,
    cwd: &Path,
    stderr: std::process::Stdio,
) -> std::process::Child {
    let exe = std::env::current_exe().expect("the test binary");
    let child = Command::new(exe)
        .args([
            child_test,
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(GATE_COMMAND, command)
        .env("WANBAKE_CACHE_DIR", cwd.join("cache"))
        .current_dir(cwd)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("start the test binary");
    let ready = cwd.join("gate.ready");
    let t0 = std::time::Instant::now();
    while !ready.exists() && t0.elapsed().as_secs() < 60 {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(ready.exists(), "`{command}` never reached its gate");
    child
}

/// The body of a child test started by [`spawn_gated`]: when this process was started for
/// it, runs `run` (the command named by [`GATE_COMMAND`], given the gate hook) in the current
/// directory as `wanbake` runs a command, prints an error as `wanbake` does and exits (1 on
/// an error, 0 otherwise). Started any other way (a plain `--ignored` run), it returns.
pub fn gated_child(
    run: impl FnOnce(&str, wanbake::release::Hooks<'_>) -> Result<(), Box<dyn std::error::Error>>,
) {
    let Ok(command) = std::env::var(GATE_COMMAND) else {
        return;
    };
    wanbake::release::staging::install_signal_guards();
    wanbake::io::mmap::install_sigbus_guard();
    faer::disable_global_parallelism();
    let gate = || {
        std::fs::write("gate.ready", b"").expect("gate.ready");
        let t0 = std::time::Instant::now();
        while !Path::new("gate.go").exists() && t0.elapsed().as_secs() < 60 {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    };
    let hooks = wanbake::release::Hooks {
        gate: Some(Box::new(gate)),
        ..Default::default()
    };
    match run(&command, hooks) {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            use std::io::Write;
            let chain = wanbake::error_text::Chain(e.as_ref());
            let _ = writeln!(std::io::stderr(), "error: {chain}");
            std::process::exit(1);
        }
    }
}

/// (dtype, shape, sha256 of the bytes) of every tensor of a checkpoint, by name.
pub type Digests = BTreeMap<String, (DType, Vec<usize>, String)>;

/// [`Digests`] of a one-component checkpoint (file or folder), by stored name.
pub fn digests(path: &Path) -> Digests {
    let c = Checkpoint::open_stored(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(c.components.len(), 1, "{}", path.display());
    (c.components[0].tensors.tensors())
        .map(|t| {
            let v = t.view;
            let sha = wanbake::io::digest::sha256_hex(v.bytes);
            (v.name.to_string(), (v.dtype, v.shape.to_vec(), sha))
        })
        .collect()
}

/// Asserts two digest maps are equal, naming the differences; `want` has more than
/// `at_least` tensors (a fixture that lost its tensors cannot pass by comparing nothing).
#[track_caller]
pub fn assert_same_digests(case: &str, got: &Digests, want: &Digests, at_least: usize) {
    let missing: Vec<&String> = want.keys().filter(|k| !got.contains_key(*k)).collect();
    let extra: Vec<&String> = got.keys().filter(|k| !want.contains_key(*k)).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "{case}: missing {missing:?}, unexpected {extra:?}"
    );
    let differ: Vec<&String> = want.keys().filter(|k| got[*k] != want[*k]).collect();
    assert!(
        differ.is_empty(),
        "{case}: {} differ: {differ:?}",
        differ.len()
    );
    assert!(want.len() > at_least, "{case}: {} tensors", want.len());
}

/// Writes seeded f32 tensors (name, shape, values) into `path`, after checking the first
/// values of each tensor `first` names (a JSON object: name -> numbers) against the ones the
/// golden script recorded: its generator and the test's must agree.
pub fn write_seeded_f32(
    path: &Path,
    tensors: &[(String, Vec<usize>, Vec<f32>)],
    first: &serde_json::Value,
) {
    for (name, want) in first.as_object().expect("first_tensor is an object") {
        let t = tensors
            .iter()
            .find(|t| &t.0 == name)
            .expect("a recorded tensor");
        for (got, want) in t.2.iter().zip(want.as_array().expect("a list of numbers")) {
            assert_eq!(f64::from(*got), want.as_f64().unwrap(), "{name}");
        }
    }
    let refs: Vec<(&str, Vec<usize>, Vec<f32>)> = (tensors.iter())
        .map(|(n, s, v)| (n.as_str(), s.clone(), v.clone()))
        .collect();
    write_f32(path, &refs);
}

// ---- the small WAN of golden/kquant_wan_golden.py (golden/quant/kquant_wan.json, "model")

/// The small WAN of golden/kquant_wan_golden.py: original-Wan names and shapes.
pub fn small_wan_shapes() -> Vec<(String, Vec<usize>)> {
    let (dim, ffn, freq, text, cin, cout, layers) = (256, 512, 256, 256, 4, 4, 3);
    let mut s: Vec<(String, Vec<usize>)> = vec![
        ("patch_embedding.weight".into(), vec![dim, cin, 1, 2, 2]),
        ("patch_embedding.bias".into(), vec![dim]),
        ("text_embedding.0.weight".into(), vec![dim, text]),
        ("text_embedding.0.bias".into(), vec![dim]),
        ("text_embedding.2.weight".into(), vec![dim, dim]),
        ("text_embedding.2.bias".into(), vec![dim]),
        ("time_embedding.0.weight".into(), vec![dim, freq]),
        ("time_embedding.0.bias".into(), vec![dim]),
        ("time_embedding.2.weight".into(), vec![dim, dim]),
        ("time_embedding.2.bias".into(), vec![dim]),
        ("time_projection.1.weight".into(), vec![6 * dim, dim]),
        ("time_projection.1.bias".into(), vec![6 * dim]),
        ("head.head.weight".into(), vec![cout * 4, dim]),
        ("head.head.bias".into(), vec![cout * 4]),
        ("head.modulation".into(), vec![1, 2, dim]),
    ];
    for b in 0..layers {
        let p = format!("blocks.{b}.");
        for a in ["self_attn", "cross_attn"] {
            for m in ["q", "k", "v", "o"] {
                s.push((format!("{p}{a}.{m}.weight"), vec![dim, dim]));
                s.push((format!("{p}{a}.{m}.bias"), vec![dim]));
            }
            s.push((format!("{p}{a}.norm_q.weight"), vec![dim]));
            s.push((format!("{p}{a}.norm_k.weight"), vec![dim]));
        }
        s.push((format!("{p}ffn.0.weight"), vec![ffn, dim]));
        s.push((format!("{p}ffn.0.bias"), vec![ffn]));
        s.push((format!("{p}ffn.2.weight"), vec![dim, ffn]));
        s.push((format!("{p}ffn.2.bias"), vec![dim]));
        s.push((format!("{p}modulation"), vec![1, 6, dim]));
        s.push((format!("{p}norm3.weight"), vec![dim]));
        s.push((format!("{p}norm3.bias"), vec![dim]));
    }
    s.sort();
    s
}

/// Writes the small WAN (one f32 file, original names) into `path`.
pub fn write_small_wan(path: &std::path::Path, model: &serde_json::Value) {
    let mut rng = Rng::new(model["seed"].as_u64().unwrap());
    let tensors: Vec<(String, Vec<usize>, Vec<f32>)> = (small_wan_shapes().into_iter())
        .map(|(name, shape)| {
            let n = shape.iter().product();
            let v = (0..n).map(|_| rng.signed_f32() * 0.125).collect();
            (name, shape, v)
        })
        .collect();
    write_seeded_f32(path, &tensors, &model["first_tensor"]);
}

/// The one weights file (`.safetensors`) an output folder holds.
pub fn weights_in(dir: &Path) -> PathBuf {
    let mut found: Vec<PathBuf> = fs_err::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    assert_eq!(found.len(), 1, "{}: {found:?}", dir.display());
    found.remove(0)
}

/// A rank-2 ComfyUI-named LoRA (`diffusion_model.blocks.0.<module>.lora_{down,up}`) on
/// `modules` (`(module, out, in)`) of block 0, seeded values in ±0.1.
pub fn small_lora(path: &Path, seed: u64, modules: &[(&str, usize, usize)]) {
    let mut rng = Rng::new(seed);
    let mut t: Vec<(String, Vec<usize>, Vec<f32>)> = Vec::new();
    for &(m, out, inp) in modules {
        let p = format!("diffusion_model.blocks.0.{m}");
        let down = (0..2 * inp).map(|_| rng.signed_f32() * 0.1).collect();
        let up = (0..out * 2).map(|_| rng.signed_f32() * 0.1).collect();
        t.push((format!("{p}.lora_down.weight"), vec![2, inp], down));
        t.push((format!("{p}.lora_up.weight"), vec![out, 2], up));
    }
    let refs: Vec<(&str, Vec<usize>, Vec<f32>)> = t
        .iter()
        .map(|(n, s, v)| (n.as_str(), s.clone(), v.clone()))
        .collect();
    write_f32(path, &refs);
}

/// Temporaries of a run (`.NAME.wanbake-tmp-*`) anywhere under `parent`.
pub fn leftovers(parent: &Path) -> Vec<String> {
    tree(parent)
        .into_iter()
        .filter(|e| e.contains("wanbake-tmp"))
        .collect()
}
