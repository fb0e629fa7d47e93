//! I/O core acceptance: hostile inputs, round trips, determinism, verify, crash safety,
//! running out of space, and model fingerprints of real-shaped synthetic checkpoints.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use wanbake::format::header_layout::{HeaderLayout, PlannedTensor};
use wanbake::io::DType;
use wanbake::model::sa3::{Sa3Variant, sa3_params};
use wanbake::model::wan::{ParamSpec, WanConfig, WanVariant};
use wanbake::release::staging::Replace;
use wanbake::synth::{Fill, SynthModel, SynthSpec, synth_release};

const T1: &str = r#""a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}"#;

/// One malformed input: file name, bytes, and a fragment the error must contain.
struct Bad {
    name: &'static str,
    bytes: Vec<u8>,
    expect: &'static str,
}

fn bad(name: &'static str, bytes: Vec<u8>, expect: &'static str) -> Bad {
    Bad {
        name,
        bytes,
        expect,
    }
}

fn malformed_files() -> Vec<Bad> {
    let mut huge = u64::MAX.to_le_bytes().to_vec();
    huge.extend_from_slice(b"{}");
    let mut past = 4096u64.to_le_bytes().to_vec();
    past.extend_from_slice(b"{}");
    let mut utf8 = 4u64.to_le_bytes().to_vec();
    utf8.extend_from_slice(&[b'{', 0xC3, 0x28, b'}']);
    let mut zip = b"PK\x03\x04\x14\x00\x00\x00".to_vec();
    zip.extend_from_slice(&[0u8; 64]);
    let mut pickle = vec![0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20];
    pickle.extend_from_slice(&[0u8; 32]);
    vec![
        bad("empty.safetensors", vec![], "0 bytes long"),
        bad(
            "truncated_header.safetensors",
            vec![1, 0, 0],
            "8-byte header length",
        ),
        bad("past_eof.safetensors", past, "runs past the end"),
        bad("huge_header.safetensors", huge, "limit is 100000000"),
        bad("bad_utf8.safetensors", utf8, "not valid UTF-8"),
        bad(
            "not_json.safetensors",
            st_bytes("{\"a\":", &[]),
            "not a JSON object",
        ),
        bad(
            "json_array.safetensors",
            st_bytes("[1,2,3]", &[]),
            "not a JSON object",
        ),
        bad(
            "duplicate.safetensors",
            st_bytes(
                &format!("{{{T1},{}}}", T1.replace("[0,8]", "[8,16]")),
                &[0; 16],
            ),
            "names `a` twice",
        ),
        bad(
            "bad_dtype.safetensors",
            st_bytes(
                r#"{"a":{"dtype":"Q8","shape":[2],"data_offsets":[0,2]}}"#,
                &[0; 2],
            ),
            "unknown dtype `Q8`",
        ),
        bad(
            "size_mismatch.safetensors",
            st_bytes(
                r#"{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,8]}}"#,
                &[0; 8],
            ),
            "needs 16 bytes",
        ),
        bad(
            "overlap.safetensors",
            st_bytes(
                &format!(
                    "{{{T1},\"b\":{{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}}}"
                ),
                &[0; 8],
            ),
            "overlap",
        ),
        bad(
            "gap.safetensors",
            st_bytes(
                r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#,
                &[0; 8],
            ),
            "belong to no tensor",
        ),
        bad(
            "trailing.safetensors",
            st_bytes(&format!("{{{T1}}}"), &[0; 12]),
            "4 trailing bytes",
        ),
        bad(
            "data_truncated.safetensors",
            st_bytes(&format!("{{{T1}}}"), &[0; 5]),
            "truncated file",
        ),
        bad(
            "metadata_not_strings.safetensors",
            st_bytes(r#"{"__metadata__":{"rank":4}}"#, &[]),
            "must map strings to strings",
        ),
        bad(
            "reversed.safetensors",
            st_bytes(
                r#"{"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}}"#,
                &[0; 8],
            ),
            "end before they begin",
        ),
        bad(
            "overflow.safetensors",
            st_bytes(
                r#"{"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}}"#,
                &[0; 8],
            ),
            "representable byte size",
        ),
        bad(
            "extra_field.safetensors",
            st_bytes(
                r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"crc":1}}"#,
                &[0; 4],
            ),
            "unexpected field `crc`",
        ),
        bad(
            "zip_named.safetensors",
            zip,
            "refusing to read a zip archive",
        ),
        bad(
            "pickle_named.safetensors",
            pickle,
            "refusing to read a pickle stream",
        ),
        bad(
            "weights.bin",
            b"anything".to_vec(),
            "refusing to read a `.bin` file",
        ),
        bad(
            "weights.pt",
            b"anything".to_vec(),
            "refusing to read a `.pt` file",
        ),
        bad(
            "weights.ckpt",
            b"anything".to_vec(),
            "refusing to read a `.ckpt` file",
        ),
        bad(
            "notes.txt",
            b"hello".to_vec(),
            "expected a .safetensors file",
        ),
    ]
}

#[test]
fn malformed_single_files_fail_cleanly_with_a_named_reason() {
    let dir = tmp();
    let cases = malformed_files();
    assert!(cases.len() >= 15);
    for c in &cases {
        std::fs::write(dir.path().join(c.name), &c.bytes).unwrap();
        let (code, out, err) = parts(&run(dir.path(), &["inspect", c.name]));
        assert_eq!(code, 1, "{}: exit {code}\n{out}\n{err}", c.name);
        assert!(!err.contains("panicked"), "{}: panic\n{err}", c.name);
        assert!(
            err.contains(c.name),
            "{}: error does not name the file:\n{err}",
            c.name
        );
        assert!(
            err.contains(c.expect),
            "{}: expected `{}` in:\n{err}",
            c.name,
            c.expect
        );
    }
    // All at once: every path is reported, exit 1.
    let names: Vec<&str> = cases.iter().map(|c| c.name).collect();
    let mut args = vec!["inspect", "--json"];
    args.extend(&names);
    let (code, out, _) = parts(&run(dir.path(), &args));
    assert_eq!(code, 1);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v.as_array().unwrap().len(), names.len());
}

fn shard(dir: &Path, name: &str, tensors: &[(&str, Vec<usize>, Vec<f32>)]) {
    write_f32(&dir.join(name), tensors);
}

fn index(dir: &Path, map: &[(&str, &str)]) {
    let m: serde_json::Map<String, serde_json::Value> = map
        .iter()
        .map(|(k, v)| (k.to_string(), serde_json::Value::String(v.to_string())))
        .collect();
    let doc = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": m});
    std::fs::write(dir.join("model.safetensors.index.json"), doc.to_string()).unwrap();
}

#[test]
fn malformed_sharded_checkpoints_fail_cleanly() {
    type Build = Box<dyn Fn(&Path)>;
    let cases: Vec<(&str, &str, Build)> = vec![
        (
            "missing_shard",
            "does not exist",
            Box::new(|d: &Path| {
                shard(d, "a.safetensors", &[("x", vec![1], vec![1.0])]);
                index(d, &[("x", "a.safetensors"), ("y", "b.safetensors")]);
            }),
        ),
        (
            "duplicate_across_shards",
            "stored in two shards",
            Box::new(|d: &Path| {
                shard(d, "a.safetensors", &[("x", vec![1], vec![1.0])]);
                shard(
                    d,
                    "b.safetensors",
                    &[("x", vec![1], vec![2.0]), ("y", vec![1], vec![2.0])],
                );
                index(d, &[("x", "a.safetensors"), ("y", "b.safetensors")]);
            }),
        ),
        (
            "unlisted_tensor",
            "does not list",
            Box::new(|d: &Path| {
                shard(
                    d,
                    "a.safetensors",
                    &[("x", vec![1], vec![1.0]), ("z", vec![1], vec![1.0])],
                );
                index(d, &[("x", "a.safetensors")]);
            }),
        ),
        (
            "map_entry_not_in_shard",
            "does not contain it",
            Box::new(|d: &Path| {
                shard(d, "a.safetensors", &[("x", vec![1], vec![1.0])]);
                shard(d, "b.safetensors", &[("y", vec![1], vec![1.0])]);
                index(
                    d,
                    &[
                        ("x", "a.safetensors"),
                        ("y", "b.safetensors"),
                        ("w", "b.safetensors"),
                    ],
                );
            }),
        ),
        (
            "escaping_path",
            "must not leave the checkpoint folder",
            Box::new(|d: &Path| {
                shard(d, "a.safetensors", &[("x", vec![1], vec![1.0])]);
                index(d, &[("x", "../a.safetensors")]);
            }),
        ),
        (
            "bad_shard_inside",
            "needs 8 bytes",
            Box::new(|d: &Path| {
                std::fs::write(
                    d.join("a.safetensors"),
                    st_bytes(
                        r#"{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}"#,
                        &[0; 4],
                    ),
                )
                .unwrap();
                index(d, &[("x", "a.safetensors")]);
            }),
        ),
        (
            "two_files_no_index",
            "point at the one you mean",
            Box::new(|d: &Path| {
                shard(d, "a.safetensors", &[("x", vec![1], vec![1.0])]);
                shard(d, "b.safetensors", &[("y", vec![1], vec![1.0])]);
            }),
        ),
    ];
    for (name, expect, build) in cases {
        let root = tmp();
        let d = root.path().join(name);
        std::fs::create_dir(&d).unwrap();
        build(&d);
        let (code, _, err) = parts(&run(root.path(), &["inspect", name]));
        assert_eq!(code, 1, "{name}: {err}");
        assert!(!err.contains("panicked"), "{name}: {err}");
        assert!(
            err.contains(expect),
            "{name}: expected `{expect}` in:\n{err}"
        );
    }
}

#[test]
fn a_valid_sharded_folder_reads_through_its_index() {
    let root = tmp();
    let d = root.path();
    shard(d, "m-1.safetensors", &[("x", vec![2], vec![1.0, 2.0])]);
    shard(d, "m-2.safetensors", &[("y", vec![1], vec![3.0])]);
    shard(d, "stray.safetensors", &[("z", vec![1], vec![3.0])]);
    index(d, &[("x", "m-1.safetensors"), ("y", "m-2.safetensors")]);
    let out = ok(run(d, &["inspect", "--json", "."]));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v[0]["components"][0]["tensor_count"], 2);
    assert!(
        v[0]["ignored"][0]
            .as_str()
            .unwrap()
            .ends_with("stray.safetensors")
    );
}

fn tiny_wan() -> WanConfig {
    WanConfig {
        num_attention_heads: 2,
        attention_head_dim: 8,
        in_channels: 4,
        out_channels: Some(4),
        text_dim: 12,
        freq_dim: 16,
        ffn_dim: 24,
        num_layers: 2,
        rope_max_seq_len: 16,
        ..WanConfig::default()
    }
}

fn synth_tiny(dest: &Path, dtype: DType) {
    let spec = SynthSpec {
        model: SynthModel::WanConfig(Box::new(tiny_wan())),
        dtype,
        fill: Fill::Random { seed: 7 },
        layers: None,
        shard_bytes: Some(6000),
    };
    synth_release(
        &spec,
        dest,
        Replace::Never,
        wanbake::release::Hooks::default(),
    )
    .expect("synth");
}

#[test]
fn round_trip_is_exact_and_output_bytes_do_not_depend_on_thread_count() {
    let root = tmp();
    let one = root.path().join("one");
    let many = root.path().join("many");
    rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap()
        .install(|| synth_tiny(&one, DType::BF16));
    rayon::ThreadPoolBuilder::new()
        .num_threads(8)
        .build()
        .unwrap()
        .install(|| synth_tiny(&many, DType::BF16));
    let files = tree(&one);
    assert_eq!(files, tree(&many));
    assert!(
        files.iter().filter(|f| f.ends_with(".safetensors")).count() > 1,
        "sharded: {files:?}"
    );
    for f in &files {
        let (a, b) = (one.join(f), many.join(f));
        if a.is_file() {
            assert_eq!(
                std::fs::read(&a).unwrap(),
                std::fs::read(&b).unwrap(),
                "{f} differs"
            );
        }
    }
    // Read back through the index: every planned tensor is present with its shape.
    let ck = wanbake::io::Checkpoint::open_stored(&one).unwrap();
    let c = ck.single().unwrap();
    let params = tiny_wan().diffusers_params();
    assert_eq!(c.tensors.len(), params.len());
    for p in &params {
        let t = c.tensors.get(&p.name).unwrap();
        assert_eq!(t.view.shape, &p.shape[..]);
        assert_eq!(t.view.dtype, DType::BF16);
    }
    ok(run(root.path(), &["verify", "one"]));
}

#[test]
fn written_values_read_back_identically() {
    use wanbake::release::writer::{ComponentOutput, OutputPlan};
    use wanbake::release::{Hooks, ReleaseError, ReleaseRequest, write_release};
    let root = tmp();
    let vals: Vec<f32> = (0..30).map(|i| (i as f32 - 15.0) * 0.37).collect();
    let comp = ComponentOutput {
        rel_dir: "".into(),
        stem: "model".into(),
        tensors: vec![
            PlannedTensor {
                name: "w".into(),
                dtype: DType::F32,
                shape: vec![5, 6],
            },
            PlannedTensor {
                name: "h".into(),
                dtype: DType::F16,
                shape: vec![30],
            },
        ],
        metadata: [("k".to_string(), "v".to_string())].into(),
        sidecars: vec![],
        max_shard_bytes: None,
    };
    let plan = OutputPlan::build(&[comp], &[]).unwrap();
    let dest = root.path().join("out");
    let req = ReleaseRequest {
        dest: &dest,
        plan,
        input_paths: &[],
        inputs: vec![],
        hash_while_writing: vec![],
        command: "test",
        options: serde_json::json!({}),
        replace: Replace::Never,
        allocation: wanbake::release::staging::Allocation::Reserve,
    };
    let produce =
        |s: &wanbake::release::staging::Staging| -> Result<serde_json::Value, ReleaseError> {
            let p = s.plan();
            let w: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
            // Written in two pieces, second first, to exercise positional writes.
            let slot = p.slot(0, "w").unwrap();
            assert!(
                s.write(slot, 119, &[0, 0]).is_err(),
                "a write past the slot must be refused"
            );
            s.write(slot, 60, &w[60..])?;
            s.write(slot, 0, &w[..60])?;
            let h = wanbake::codec::dtype::from_f32_vec(DType::F16, &vals).unwrap();
            s.write(p.slot(0, "h").unwrap(), 0, &h)?;
            Ok(serde_json::json!({}))
        };
    write_release(req, produce, Hooks::default()).unwrap();
    let f = wanbake::io::SafetensorsFile::open(&dest.join("model.safetensors")).unwrap();
    assert_eq!(f.read_f32("w").unwrap(), vals);
    let h = f.read_f32("h").unwrap();
    for (a, b) in h.iter().zip(&vals) {
        assert_eq!(*a, half::f16::from_f32(*b).to_f32());
    }
    assert_eq!(f.metadata()["k"], "v");
}

#[test]
fn verify_catches_a_flipped_byte_anywhere() {
    let root = tmp();
    let dest = root.path().join("rel");
    synth_tiny(&dest, DType::F32);
    ok(run(root.path(), &["verify", "rel"]));
    let shard1 = dest.join(
        tree(&dest)
            .into_iter()
            .find(|f| f.starts_with("diffusion_pytorch_model-00001-of-"))
            .expect("a sharded output"),
    );
    let len = std::fs::metadata(&shard1).unwrap().len() as usize;
    let manifest = dest.join("wanbake.manifest.json");
    let mlen = std::fs::metadata(&manifest).unwrap().len() as usize;
    let targets: Vec<(std::path::PathBuf, usize)> = vec![
        (shard1.clone(), 0),       // header length prefix
        (shard1.clone(), 20),      // inside the header JSON
        (shard1.clone(), len / 2), // tensor data
        (shard1.clone(), len - 1), // last byte
        (dest.join("config.json"), 3),
        (
            dest.join("diffusion_pytorch_model.safetensors.index.json"),
            10,
        ),
        (manifest.clone(), mlen / 2),
        (manifest.clone(), mlen - 2),
    ];
    for (path, pos) in targets {
        let orig = std::fs::read(&path).unwrap();
        let mut bad = orig.clone();
        bad[pos] ^= 0x04;
        std::fs::write(&path, &bad).unwrap();
        let (code, _, err) = parts(&run(root.path(), &["verify", "rel"]));
        assert_eq!(
            code,
            3,
            "flip in {} at {pos} not caught: {err}",
            path.display()
        );
        assert!(err.contains("mismatch"), "{err}");
        std::fs::write(&path, &orig).unwrap();
    }
    ok(run(root.path(), &["verify", "rel"]));
    // An extra file is a mismatch too.
    std::fs::write(dest.join("extra.txt"), b"x").unwrap();
    assert_eq!(parts(&run(root.path(), &["verify", "rel"])).0, 3);
}

#[test]
fn kill_during_a_large_write_leaves_no_destination_and_the_next_run_cleans_up() {
    let root = tmp();
    // One block of the 1.3B model: about 290 MB of f32.
    let mut child = std::process::Command::new(bin())
        .args([
            "synth",
            "--model",
            "wan2.1-t2v-1.3b",
            "--layers",
            "1",
            "--out",
            "big",
        ])
        .current_dir(root.path())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    while leftovers(root.path()).is_empty() && t0.elapsed().as_secs() < 30 {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    std::thread::sleep(std::time::Duration::from_millis(150));
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert!(
        !root.path().join("big").exists(),
        "destination exists after kill"
    );
    assert!(
        !leftovers(root.path()).is_empty(),
        "expected the killed run's temporary to remain"
    );
    // A second run to the same destination removes the dead run's temporary.
    ok(run(
        root.path(),
        &[
            "synth",
            "--model",
            "wan2.1-t2v-1.3b",
            "--layers",
            "1",
            "--dtype",
            "bf16",
            "--out",
            "big",
        ],
    ));
    assert!(
        leftovers(root.path()).is_empty(),
        "stale temporaries: {:?}",
        leftovers(root.path())
    );
    ok(run(root.path(), &["verify", "big"]));
}

#[test]
fn running_out_of_space_fails_cleanly() {
    let root = tmp();
    let cmd = format!(
        "ulimit -f 20000; exec {} synth --model wan2.1-t2v-1.3b --layers 1 --out full",
        bin().display()
    );
    let o = std::process::Command::new("bash")
        .args(["-c", &cmd])
        .current_dir(root.path())
        .output()
        .unwrap();
    let (code, out, err) = parts(&o);
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(err.contains("file size limit"), "{err}");
    assert!(!root.path().join("full").exists());
    assert!(
        leftovers(root.path()).is_empty(),
        "{:?}",
        leftovers(root.path())
    );
}

#[test]
fn writing_over_an_input_or_an_existing_output_is_refused() {
    let root = tmp();
    synth_tiny(&root.path().join("rel"), DType::F32);
    let (code, _, err) = parts(&run(
        root.path(),
        &[
            "synth",
            "--model",
            "sa3-small",
            "--fill",
            "zero",
            "--out",
            "rel",
        ],
    ));
    assert_eq!(code, 1);
    assert!(err.contains("already exists"), "{err}");
    let err = wanbake::release::staging::check_not_input(
        &root.path().join("rel/sub"),
        &[root.path().join("rel")],
    )
    .unwrap_err();
    assert!(err.to_string().contains("overlaps the input"), "{err}");
    let err = wanbake::release::staging::check_not_input(
        root.path(),
        &[root.path().join("rel/x.safetensors")],
    )
    .unwrap_err();
    assert!(err.to_string().contains("overlaps the input"), "{err}");
}

/// A sparse safetensors file with the given parameters (all zeros, no disk used).
fn sparse_checkpoint(path: &Path, params: &[ParamSpec], dtype: DType) {
    let planned: Vec<PlannedTensor> = params
        .iter()
        .map(|p| PlannedTensor {
            name: p.name.clone(),
            dtype,
            shape: p.shape.clone(),
        })
        .collect();
    let layout = HeaderLayout::build(&planned, &Default::default()).unwrap();
    let f = std::fs::File::create(path).unwrap();
    f.set_len(layout.file_len() as u64).unwrap();
    use std::os::unix::fs::FileExt;
    f.write_all_at(&layout.prefix, 0).unwrap();
}

#[test]
fn inspect_fingerprints_real_shaped_synthetic_checkpoints() {
    let root = tmp();
    let mut cases: Vec<(String, Vec<ParamSpec>, &str)> = [
        WanVariant::T2V1_3B,
        WanVariant::T2V14B,
        WanVariant::I2V14B,
        WanVariant::FLF2V14B,
        WanVariant::TI2V5B,
    ]
    .iter()
    .map(|v| {
        (
            format!("{}.safetensors", v.id()),
            v.config().diffusers_params(),
            v.id(),
        )
    })
    .collect();
    for v in Sa3Variant::ALL {
        cases.push((format!("{}.safetensors", v.id()), sa3_params(v), v.id()));
    }
    for (file, params, id) in &cases {
        sparse_checkpoint(&root.path().join(file), params, DType::BF16);
        let out = ok(run(root.path(), &["inspect", "--json", file]));
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let fp = &v[0]["components"][0]["fingerprint"];
        assert_eq!(fp["variant"], *id, "{file}: {fp}");
        assert_eq!(
            fp["notes"].as_array().map_or(0, |a| a.len()),
            0,
            "{file}: {fp}"
        );
        let text = ok(run(root.path(), &["inspect", file]));
        assert!(text.contains("model:"), "{text}");
    }
    // A 1.3B LoRA-sized base mistaken for 14B: one changed dim is explained.
    let mut cfg = WanVariant::T2V14B.config();
    cfg.num_layers = 39;
    sparse_checkpoint(
        &root.path().join("odd.safetensors"),
        &cfg.diffusers_params(),
        DType::BF16,
    );
    let out = ok(run(root.path(), &["inspect", "odd.safetensors"]));
    assert!(out.contains("num_layers is 39 (expected 40)"), "{out}");
}

#[test]
fn convert_mirrors_naming_and_rounds_each_value_once() {
    let root = tmp();
    synth_tiny(&root.path().join("src"), DType::F32);
    ok(run(
        root.path(),
        &[
            "convert",
            "src",
            "--dtype",
            "bf16",
            "--shard-size",
            "3000",
            "--out",
            "dst",
        ],
    ));
    ok(run(root.path(), &["verify", "dst"]));
    let names = |d: &str| -> Vec<String> {
        tree(&root.path().join(d))
            .into_iter()
            .filter(|f| !f.ends_with("manifest.json"))
            .collect()
    };
    // Every tensor is exactly half as large, so the same greedy split at half the limit.
    assert_eq!(names("src"), names("dst"));
    let a = wanbake::io::Checkpoint::open_stored(&root.path().join("src")).unwrap();
    let b = wanbake::io::Checkpoint::open_stored(&root.path().join("dst")).unwrap();
    let (a, b) = (a.single().unwrap(), b.single().unwrap());
    for t in a.tensors.tensors() {
        let src = t.view.to_f32().unwrap();
        let u = b.tensors.get(t.view.name).unwrap();
        assert_eq!(u.view.dtype, DType::BF16);
        let expect: Vec<u8> = src
            .iter()
            .flat_map(|x| half::bf16::from_f32(*x).to_bits().to_le_bytes())
            .collect();
        assert_eq!(u.view.bytes, &expect[..], "{}", t.view.name);
    }
    // Converting onto its own input is refused and writes nothing.
    let (code, _, err) = parts(&run(
        root.path(),
        &["convert", "src", "--dtype", "bf16", "--out", "src/x"],
    ));
    assert_eq!(code, 1);
    assert!(err.contains("overlaps the input"), "{err}");
    assert!(!root.path().join("src/x").exists());
}

#[test]
fn inspect_flags_a_config_that_disagrees_with_the_weights() {
    // spec wan.md §1.3: a config with image_dim / added_kv_proj_dim but no image weights.
    let root = tmp();
    let dir = root.path().join("m");
    std::fs::create_dir(&dir).unwrap();
    std::fs::copy(
        repo().join("golden/models/t2v/diffusion_pytorch_model.safetensors"),
        dir.join("diffusion_pytorch_model.safetensors"),
    )
    .unwrap();
    let mut cfg: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("golden/models/t2v/config.json")).unwrap(),
    )
    .unwrap();
    cfg["image_dim"] = 1280.into();
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    let out = ok(run(root.path(), &["inspect", "m"]));
    assert!(
        out.contains("config.json says image_dim = 1280 but the weights imply absent"),
        "{out}"
    );
    let clean = ok(run(&repo(), &["inspect", "golden/models/t2v"]));
    assert!(!clean.contains("config.json says"), "{clean}");
}

/// Starts `merge` of the golden t2v model copied into `root/base` with a PEFT LoRA into
/// `root/out` (the changed-input tests' main command), held at its gate: its inputs are
/// mapped and its temporary output exists.
fn merge_held_at_gate(root: &Path) -> std::process::Child {
    held_at_gate(root, "merge")
}

/// Starts `command` (`merge`, `restack` or `convert`, reading `base`, writing `out`: see
/// [`gated_command`]) with the golden t2v model copied into `root/base`, held at its gate.
fn held_at_gate(root: &Path, command: &str) -> std::process::Child {
    let g = repo().join("golden");
    let base = root.join("base");
    std::fs::create_dir_all(&base).unwrap();
    for f in ["config.json", "diffusion_pytorch_model.safetensors"] {
        std::fs::copy(g.join("models/t2v").join(f), base.join(f)).unwrap();
    }
    let stderr = std::process::Stdio::piped();
    spawn_gated("gated_command", command, root, stderr)
}

/// The command a test started with [`held_at_gate`] runs, in this test binary's child
/// process: what `wanbake merge base --adapter peft_plain --dtype bf16 --out out`, `restack
/// base --to nnx-scanned --out out` and `convert base --dtype bf16 --out out` run.
#[test]
#[ignore = "run by the changed-input tests in a child process"]
fn gated_command() {
    use wanbake::adapter::{AdapterSpec, bind_specs};
    use wanbake::merge::{MergeOptions, Merging, write_merge};
    use wanbake::pipeline::{Compute, OutputChoices, OutputOptions, Plan, Writing};
    use wanbake::release::staging::Replace;
    gated_child(|command, hooks| {
        let (base, out) = (Path::new("base"), Path::new("out"));
        match command {
            "merge" => {
                let output = OutputOptions::new(OutputChoices {
                    dtype: wanbake::layout::OutputDType::BF16,
                    ..OutputChoices::default()
                })
                .expect("valid options");
                let model = wanbake::quant::base::open(base)?;
                let lora = repo().join("golden/adapters/peft_plain");
                let spec = AdapterSpec::parse(lora.to_str().unwrap())?;
                let adapters = bind_specs(&[spec], &model, false)?;
                let plan = Plan::new(&model, &adapters, &output)?.hash_base_while_writing("base");
                let merging = Merging {
                    options: MergeOptions::default(),
                    compute: &Compute::Cpu,
                    svd_cache: None,
                };
                let writing = Writing::new(out, Replace::Never, "merge", serde_json::Value::Null);
                write_merge(&plan, &merging, writing, hooks)?;
            }
            "restack" => {
                let options = wanbake::layout::restack::RestackOptions {
                    from: None,
                    to: wanbake::model::wan_layout::Layout::NnxScanned,
                    dtype: wanbake::layout::OutputDType::Keep,
                    keep_f32: None,
                    shard_bytes: None,
                    replace: Replace::Never,
                    config: None,
                    nonfinite: wanbake::pipeline::NonFinite::Refuse,
                };
                let exec = wanbake::pipeline::ExecOptions::default();
                wanbake::restack::restack_release(base, out, &options, &exec, hooks)?;
            }
            "convert" => {
                let spec = wanbake::convert::ConvertSpec {
                    input: base.to_path_buf(),
                    out: out.to_path_buf(),
                    dtype: wanbake::layout::OutputDType::BF16,
                    shard_bytes: None,
                    replace: Replace::Never,
                    nonfinite: wanbake::pipeline::NonFinite::Refuse,
                };
                wanbake::convert::convert_release(&spec, hooks)?;
            }
            other => panic!("no gated command `{other}`"),
        }
        Ok(())
    });
}

/// Runs `merge` (`merge_held_at_gate`); at the gate `change` alters the base, and the run
/// goes on. Returns (exit code, stderr).
fn merge_while_base_changes(root: &Path, change: impl FnOnce(&Path)) -> (i32, String) {
    command_while_base_changes(root, "merge", change)
}

/// [`merge_while_base_changes`] for `command` (see [`gated_command`]).
fn command_while_base_changes(
    root: &Path,
    command: &str,
    change: impl FnOnce(&Path),
) -> (i32, String) {
    let child = held_at_gate(root, command);
    change(&root.join("base/diffusion_pytorch_model.safetensors"));
    std::fs::write(root.join("gate.go"), b"").unwrap();
    let o = child.wait_with_output().unwrap();
    let (code, _, err) = parts(&o);
    assert!(!root.join("out").exists(), "a release was committed: {err}");
    assert!(
        leftovers(root).is_empty(),
        "temporaries left: {:?}",
        leftovers(root)
    );
    (code, err)
}

#[test]
fn an_interrupt_removes_the_unfinished_output_and_ends_the_run_by_its_signal() {
    use rustix::process::{Pid, Signal, kill_process};
    use std::os::unix::process::ExitStatusExt;
    for (signal, number) in [(Signal::INT, 2), (Signal::TERM, 15)] {
        let root = tmp();
        let child = merge_held_at_gate(root.path());
        assert!(
            !leftovers(root.path()).is_empty(),
            "the run has no temporary output at its gate"
        );
        kill_process(Pid::from_child(&child), signal).unwrap();
        let o = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.signal(), Some(number), "{err}");
        assert!(err.contains("interrupted by SIG"), "{err}");
        assert!(err.contains("out was not written"), "{err}");
        assert!(!root.path().join("out").exists(), "a release was committed");
        assert!(
            leftovers(root.path()).is_empty(),
            "temporaries left: {:?}",
            leftovers(root.path())
        );
    }
}

/// Cuts `f` to a third of its length.
fn shrink(f: &Path) {
    let len = std::fs::metadata(f).unwrap().len();
    let file = std::fs::OpenOptions::new().write(true).open(f).unwrap();
    file.set_len(len / 3).unwrap();
}

/// Rewrites 64 bytes near the end of `f`'s data (inside some tensor), keeping its size.
fn rewrite_in_place(f: &Path) {
    use std::os::unix::fs::FileExt;
    let len = std::fs::metadata(f).unwrap().len();
    let file = std::fs::OpenOptions::new().write(true).open(f).unwrap();
    file.write_all_at(&[0x7f; 64], len - 256).unwrap();
    file.sync_all().unwrap();
}

#[test]
fn restack_and_convert_refuse_an_input_that_changes_while_they_read_it() {
    for (command, change, says) in [
        ("restack", shrink as fn(&Path), "shrank"),
        ("restack", rewrite_in_place, "rewritten"),
        ("convert", shrink, "shrank"),
        ("convert", rewrite_in_place, "rewritten"),
    ] {
        let root = tmp();
        let (code, err) = command_while_base_changes(root.path(), command, change);
        assert_eq!(code, 1, "{command}: {err}");
        assert!(err.contains("diffusion_pytorch_model.safetensors"), "{err}");
        assert!(err.contains(says), "{command}: {says:?} not in {err}");
        assert!(!err.contains("Bus error"), "{err}");
    }
}

#[test]
fn an_input_that_shrinks_while_it_is_read_fails_cleanly_and_commits_nothing() {
    let root = tmp();
    let (code, err) = merge_while_base_changes(root.path(), shrink);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("diffusion_pytorch_model.safetensors"), "{err}");
    assert!(err.contains("shrank"), "{err}");
    assert!(!err.contains("Bus error"), "{err}");
}

#[test]
fn an_input_that_grows_while_it_is_read_fails_cleanly_and_commits_nothing() {
    let root = tmp();
    let len = std::cell::Cell::new(0);
    let (code, err) = merge_while_base_changes(root.path(), |f| {
        use std::io::Write;
        len.set(std::fs::metadata(f).unwrap().len());
        // Appended, as a download or copy still in progress would: the bytes already
        // mapped are unchanged.
        let mut file = std::fs::OpenOptions::new().append(true).open(f).unwrap();
        file.write_all(&[0u8; 4096]).unwrap();
        file.sync_all().unwrap();
    });
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("diffusion_pytorch_model.safetensors"), "{err}");
    let grew = format!("grew from {} to {} bytes", len.get(), len.get() + 4096);
    assert!(err.contains(&grew), "{grew:?} not in {err}");
}

#[test]
fn an_input_rewritten_in_place_with_the_same_size_fails_cleanly() {
    let root = tmp();
    let (code, err) = merge_while_base_changes(root.path(), rewrite_in_place);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("diffusion_pytorch_model.safetensors"), "{err}");
    assert!(err.contains("rewritten"), "{err}");
}

#[test]
fn input_hashes_are_cached_by_file_identity_and_the_cache_can_be_turned_off() {
    let root = tmp();
    let g = repo().join("golden");
    std::fs::copy(
        g.join("models/t2v_original.safetensors"),
        root.path().join("in.safetensors"),
    )
    .unwrap();
    let cache = root.path().join("cache");
    let convert = |out: &str, extra: &[&str]| {
        let mut c = std::process::Command::new(bin());
        c.args(extra)
            .args(["convert", "in.safetensors", "--dtype", "bf16", "--out", out])
            .env("WANBAKE_CACHE_DIR", &cache)
            .current_dir(root.path());
        ok(c.output().unwrap());
    };
    let entries = || -> Vec<PathBuf> {
        match std::fs::read_dir(cache.join("input-sha256")) {
            Ok(rd) => rd.map(|e| e.unwrap().path()).collect(),
            Err(_) => vec![],
        }
    };
    convert("a", &["--no-hash-cache"]);
    assert!(
        entries().is_empty(),
        "--no-hash-cache wrote {:?}",
        entries()
    );
    convert("b", &[]);
    let e = entries();
    assert_eq!(e.len(), 1, "{e:?}");
    // sha256sum of the input, computed independently of wanbake's reader.
    let want = {
        use sha2::Digest;
        let bytes = std::fs::read(root.path().join("in.safetensors")).unwrap();
        wanbake::io::digest::hex(&sha2::Sha256::digest(&bytes))
    };
    assert_eq!(std::fs::read_to_string(&e[0]).unwrap(), want);
    // A poisoned entry for this identity is what a cache hit would record: proof that the
    // cache is consulted (and why the identity includes the change time).
    std::fs::write(&e[0], "ab".repeat(32)).unwrap();
    convert("c", &[]);
    let manifest = std::fs::read_to_string(root.path().join("c/wanbake.manifest.json")).unwrap();
    assert!(manifest.contains(&"ab".repeat(32)), "cache not used");
    // Touching the file changes its identity: a miss, hashed again.
    let f = std::fs::OpenOptions::new()
        .append(true)
        .open(root.path().join("in.safetensors"))
        .unwrap();
    f.set_modified(std::time::SystemTime::now()).unwrap();
    drop(f);
    convert("d", &[]);
    let manifest = std::fs::read_to_string(root.path().join("d/wanbake.manifest.json")).unwrap();
    assert!(manifest.contains(&want), "not re-hashed after a change");
    // verify never trusts the cache.
    ok(run(root.path(), &["verify", "d"]));
}

/// Runs `args` in `dir`, expects exit 1 and one `error:` line that says each of `causes`
/// exactly once, and returns that line.
#[track_caller]
fn fails_saying_each_once(dir: &Path, args: &[&str], causes: &[&str]) -> String {
    let (code, _, err) = parts(&run(dir, args));
    assert_eq!(code, 1, "{args:?}: {err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("{args:?}: no error line: {err}"));
    for cause in causes {
        assert_eq!(line.matches(cause).count(), 1, "{args:?}: `{cause}`: {err}");
    }
    line.to_string()
}

#[test]
fn an_error_prints_each_cause_once() {
    let root = tmp();
    let dir = root.path();
    std::fs::write(dir.join("afile"), b"x").unwrap();
    let g = repo().join("golden");
    let t2v = g.join("models/t2v");
    let t2v = t2v.to_str().unwrap();
    let peft = g.join("adapters/peft_plain");
    let peft = peft.to_str().unwrap();

    // An output below a file: the message says what is wrong with the path, once.
    let line = fails_saying_each_once(
        dir,
        &["convert", t2v, "--dtype", "bf16", "--out", "afile/sub"],
        &["afile"],
    );
    assert!(line.contains("afile: not a directory"), "{line}");
    assert!(!line.contains("File exists"), "{line}");
    let line = fails_saying_each_once(
        dir,
        &[
            "convert",
            t2v,
            "--dtype",
            "bf16",
            "--out",
            "afile/sub/deeper",
        ],
        &["afile"],
    );
    assert!(line.contains("afile: not a directory"), "{line}");
    assert!(!dir.join("afile/sub").exists());

    // A missing input, for every command that reads one.
    let missing = "No such file or directory";
    for args in [
        &[
            "convert",
            "missing.safetensors",
            "--dtype",
            "bf16",
            "--out",
            "o",
        ][..],
        &[
            "restack",
            "missing.safetensors",
            "--to",
            "wan",
            "--out",
            "o",
        ],
        &[
            "merge",
            "--base",
            "missing",
            "--adapter",
            peft,
            "--out",
            "o",
        ],
        &["merge", "--base", t2v, "--adapter", "missing", "--out", "o"],
        &[
            "extract", "--base", "missing", "--tuned", t2v, "--rank", "4", "--out", "o",
        ],
        &[
            "extract", "--base", t2v, "--tuned", "missing", "--rank", "4", "--out", "o",
        ],
        &[
            "extract",
            "--base",
            t2v,
            "--adapter",
            "missing",
            "--rank",
            "4",
            "--out",
            "o",
        ],
        &["translate", "missing", "--to", "comfy", "--out", "o"],
        &["resize", "missing", "--rank", "2", "--out", "o"],
        &["bake", "missing.toml"],
    ] {
        let line = fails_saying_each_once(dir, args, &[missing, "os error 2", "missing"]);
        assert!(line.starts_with("error: missing"), "{args:?}: {line}");
    }
    // A recipe naming a missing base or adapter.
    let recipe = |name: &str, base: &str, adapter: &str| {
        std::fs::write(
            dir.join(name),
            format!(
                "[base]\npath = \"{base}\"\n[[adapter]]\npath = \"{adapter}\"\n\
                 [output]\ndir = \"o\"\n"
            ),
        )
        .unwrap();
    };
    recipe("no_base.toml", "missing_base", peft);
    recipe("no_adapter.toml", t2v, "missing_adapter");
    fails_saying_each_once(dir, &["bake", "no_base.toml"], &[missing, "missing_base"]);
    fails_saying_each_once(
        dir,
        &["bake", "no_adapter.toml"],
        &[missing, "missing_adapter"],
    );

    // Truncated inputs: the header cut (its length runs past the end) and the data cut.
    let original = std::fs::read(g.join("models/t2v_original.safetensors")).unwrap();
    std::fs::write(dir.join("cut_header.safetensors"), &original[..1000]).unwrap();
    std::fs::write(
        dir.join("cut_data.safetensors"),
        &original[..original.len() / 2],
    )
    .unwrap();
    let adapter = std::fs::read(g.join("adapters/peft_plain/adapter_model.safetensors")).unwrap();
    std::fs::write(dir.join("cut_adapter.safetensors"), &adapter[..500]).unwrap();
    for (file, reason) in [
        ("cut_header.safetensors", "runs past the end"),
        ("cut_data.safetensors", "but the data section is only"),
    ] {
        for args in [
            &["convert", file, "--dtype", "bf16", "--out", "o"][..],
            &["restack", file, "--to", "wan", "--out", "o"],
            &["merge", "--base", file, "--adapter", peft, "--out", "o"],
            &[
                "extract", "--base", file, "--tuned", t2v, "--rank", "4", "--out", "o",
            ],
        ] {
            fails_saying_each_once(dir, args, &[file, reason, "truncated"]);
        }
    }
    for args in [
        &[
            "merge",
            "--base",
            t2v,
            "--adapter",
            "cut_adapter.safetensors",
            "--out",
            "o",
        ][..],
        &[
            "translate",
            "cut_adapter.safetensors",
            "--to",
            "comfy",
            "--out",
            "o",
        ],
        &[
            "resize",
            "cut_adapter.safetensors",
            "--rank",
            "2",
            "--out",
            "o",
        ],
    ] {
        fails_saying_each_once(
            dir,
            args,
            &["cut_adapter.safetensors", "runs past the end", "truncated"],
        );
    }
    assert!(!dir.join("o").exists());
}

/// Hand-made safetensors files the mutation test starts from: several dtypes, metadata
/// (with an empty key), empty tensors, a scalar, padding in the header, a header that lists
/// tensors out of data order, no tensors at all. The fuzz target's seed corpus,
/// `fuzz/seeds/differential/`, holds exactly these files.
fn hand_made_seeds() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        (
            "one.safetensors",
            st_bytes(
                r#"{"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}}"#,
                &[0u8; 16],
            ),
        ),
        (
            "meta.safetensors",
            st_bytes(
                r#"{"__metadata__":{"format":"pt","k":"v"},"b":{"dtype":"BF16","shape":[3],"data_offsets":[0,6]},"c":{"dtype":"I64","shape":[],"data_offsets":[6,14]}}   "#,
                &[1u8; 14],
            ),
        ),
        (
            "empty.safetensors",
            st_bytes(
                r#"{"e":{"dtype":"F16","shape":[0,4],"data_offsets":[0,0]},"f":{"dtype":"U8","shape":[5],"data_offsets":[0,5]}}"#,
                &[7u8; 5],
            ),
        ),
        (
            "metadata_only.safetensors",
            st_bytes(
                r#"{"__metadata__":{"wanbake.version":"0","":"empty key"}}"#,
                &[],
            ),
        ),
        (
            "out_of_order.safetensors",
            st_bytes(
                r#"{"z":{"dtype":"I32","shape":[1],"data_offsets":[4,8]},"a":{"dtype":"F8_E4M3","shape":[2,2],"data_offsets":[0,4]}}"#,
                &[0, 1, 2, 3, 4, 5, 6, 7],
            ),
        ),
    ]
}

fn differential_seeds() -> Vec<Vec<u8>> {
    let golden = std::fs::read(repo().join("golden/models/t2v_original.safetensors")).unwrap();
    let mut seeds: Vec<Vec<u8>> = hand_made_seeds().into_iter().map(|(_, b)| b).collect();
    seeds.push(golden);
    seeds
}

#[test]
fn the_fuzz_seed_corpus_is_the_hand_made_seeds() {
    let dir = repo().join("fuzz/seeds/differential");
    let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    on_disk.sort();
    let mut names: Vec<&str> = hand_made_seeds().iter().map(|(n, _)| *n).collect();
    names.sort();
    assert_eq!(on_disk, names);
    for (name, bytes) in hand_made_seeds() {
        assert_eq!(std::fs::read(dir.join(name)).unwrap(), bytes, "{name}");
        // Both readers accept every seed, so mutations start on the accepting side.
        wanbake::format::header::Header::parse(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        safetensors::SafeTensors::deserialize(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

/// One random edit: a byte changed in the header, the length prefix changed, bytes
/// inserted or removed in the header, or the data section cut or grown.
fn mutate(rng: &mut Rng, mut b: Vec<u8>) -> Vec<u8> {
    let header_end = b
        .get(..8)
        .map(|l| 8 + u64::from_le_bytes(l.try_into().unwrap()) as usize)
        .unwrap_or(8)
        .min(b.len());
    const BYTES: &[u8] = b"{}[]\",:0123456789-.eE aZ_F3216UIBOL\\";
    match rng.below(6) {
        0 | 1 if header_end > 8 => {
            let i = 8 + rng.below(header_end - 8);
            b[i] = BYTES[rng.below(BYTES.len())];
        }
        2 if b.len() >= 8 => {
            let len = u64::from_le_bytes(b[..8].try_into().unwrap());
            let delta = rng.below(17) as i64 - 8;
            b[..8].copy_from_slice(&(len as i64 + delta).max(0).to_le_bytes());
        }
        3 if header_end > 8 => {
            let i = 8 + rng.below(header_end - 8);
            b.remove(i);
        }
        4 if header_end > 8 => {
            let i = 8 + rng.below(header_end - 8);
            b.insert(i, BYTES[rng.below(BYTES.len())]);
        }
        _ => {
            if rng.below(2) == 0 && b.len() > header_end {
                b.truncate(b.len() - 1 - rng.below(4).min(b.len() - header_end - 1));
            } else {
                b.extend(std::iter::repeat_n(0u8, 1 + rng.below(8)));
            }
        }
    }
    b
}

/// The hand-written header parser is stricter than the reference reader by design (exact
/// coverage, named errors); it must never be looser: no input it accepts may be rejected
/// by the safetensors crate, and where both accept they must agree on every tensor.
/// (The same property runs unbounded under libFuzzer: `fuzz/fuzz_targets/differential.rs`.)
#[test]
fn the_header_parser_never_accepts_what_the_safetensors_crate_rejects() {
    use wanbake::format::header::Header;
    let mut rng = Rng::new(0x5afe);
    let (mut accepted, mut tried) = (0, 0);
    for seed in differential_seeds() {
        for _ in 0..4000 {
            let mut b = seed.clone();
            for _ in 0..1 + rng.below(3) {
                b = mutate(&mut rng, b);
            }
            tried += 1;
            let Ok(ours) = Header::parse(&b) else {
                continue;
            };
            accepted += 1;
            let theirs = match safetensors::SafeTensors::deserialize(&b) {
                Ok(t) => t,
                Err(e) => panic!(
                    "wanbake accepts what safetensors rejects ({e:?}): {:?}",
                    String::from_utf8_lossy(&b[..b.len().min(400)])
                ),
            };
            // The comparisons of fuzz/fuzz_targets/differential.rs; change both together.
            let (header_len, meta) = safetensors::SafeTensors::read_metadata(&b).unwrap();
            assert_eq!(ours.data_start, 8 + header_len, "data section start");
            let their_map: std::collections::BTreeMap<String, String> = meta
                .metadata()
                .clone()
                .unwrap_or_default()
                .into_iter()
                .collect();
            assert_eq!(ours.metadata, their_map, "__metadata__");
            assert_eq!(ours.tensors.len(), theirs.len());
            assert_eq!(ours.tensors.len(), meta.tensors().len());
            for t in &ours.tensors {
                let v = theirs.tensor(&t.name).unwrap();
                let info = meta.info(&t.name).unwrap();
                assert_eq!(format!("{:?}", v.dtype()), t.dtype.as_str(), "{}", t.name);
                assert_eq!(v.shape(), t.shape.as_slice(), "{}", t.name);
                assert_eq!(info.data_offsets, (t.begin, t.end), "{}", t.name);
                assert_eq!(v.data().len(), t.end - t.begin, "{}", t.name);
                let at = v.data().as_ptr() as usize - b.as_ptr() as usize;
                assert_eq!(at, ours.data_start + t.begin, "{}", t.name);
            }
        }
    }
    // The mutations must reach both sides of the property.
    assert!(
        accepted > 100 && accepted < tried,
        "{accepted} of {tried} accepted"
    );
}
