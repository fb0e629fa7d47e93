//! `--to orbax` (issue 29, the output half): wanbake's cache against the cache MaxDiffusion
//! saves itself from the same diffusers folder (golden/orbax/maxdiffusion/, made by
//! golden/maxdiffusion_orbax_golden.py with MaxDiffusion's own loader and
//! `WanCheckpointer._save_pretrained_checkpoint`), read with `io::orbax`'s reader; the
//! leaves' sha256 as MaxDiffusion restored them; determinism; `verify`; merge vs
//! merge-then-convert.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::{ok, parts, repo, run, tmp};
use serde_json::Value as Json;
use wanbake::format::orbax::Item;

fn golden(p: &str) -> PathBuf {
    repo().join("golden").join(p)
}

/// (dtype, shape, bytes) of every leaf of the item at `dir`, by dot-joined path.
fn read_item(dir: &Path) -> BTreeMap<String, (String, Vec<u64>, Vec<u8>)> {
    let item = Item::open(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    item.leaves()
        .iter()
        .map(|l| {
            let name = l.name();
            let a = item.array(&name).unwrap();
            let bytes = a.read_all(1 << 30).unwrap();
            (
                name,
                (numpy_dtype(a.meta().dtype), a.meta().shape.clone(), bytes),
            )
        })
        .collect()
}

fn numpy_dtype(d: wanbake::io::DType) -> String {
    match d {
        wanbake::io::DType::BF16 => "bfloat16".into(),
        wanbake::io::DType::F32 => "float32".into(),
        wanbake::io::DType::F16 => "float16".into(),
        other => format!("{other:?}"),
    }
}

/// Every item of `case` in `out` equals MaxDiffusion's own cache leaf for leaf (path, dtype,
/// shape, bits), and the sha256 MaxDiffusion's restore recorded; wan_config equals.
fn assert_same_as_maxdiffusion(out: &Path, case: &str) {
    let record: Json = serde_json::from_slice(
        &std::fs::read(golden(&format!("orbax/maxdiffusion/{case}.json"))).unwrap(),
    )
    .unwrap();
    let record = record.as_object().unwrap();
    let mut items = 0;
    for (item, leaves) in record.iter().filter(|(k, _)| *k != "wan_config") {
        items += 1;
        let ours = read_item(&out.join("0").join(item));
        let theirs = read_item(&golden(&format!("orbax/maxdiffusion/{case}/0/{item}")));
        let names = |m: &BTreeMap<String, _>| m.keys().cloned().collect::<Vec<_>>();
        assert_eq!(names(&ours), names(&theirs), "{case}/{item}: leaf paths");
        let leaves = leaves.as_object().unwrap();
        assert_eq!(ours.len(), leaves.len(), "{case}/{item}: leaf count");
        for (name, (dtype, shape, bytes)) in &ours {
            let (d2, s2, b2) = &theirs[name];
            assert_eq!((dtype, shape), (d2, s2), "{case}/{item}: {name}");
            assert!(bytes == b2, "{case}/{item}: bits of {name} differ");
            let want = &leaves[name];
            assert_eq!(want["dtype"], dtype.as_str(), "{case}/{item}: {name}");
            let sha = wanbake::io::digest::sha256_hex(bytes);
            assert_eq!(want["sha256"], sha.as_str(), "{case}/{item}: {name}");
        }
    }
    assert!(items > 0, "{case}: no item in the record");
    let config = |root: &Path| -> Json {
        serde_json::from_slice(&std::fs::read(root.join("0/wan_config/metadata")).unwrap()).unwrap()
    };
    let theirs = config(&golden(&format!("orbax/maxdiffusion/{case}")));
    assert_eq!(config(out), theirs, "{case}: wan_config");
    assert_eq!(
        theirs, record["wan_config"],
        "{case}: the record's wan_config"
    );
}

/// Every file under `dir` (relative path → bytes), `skip` left out.
fn files(dir: &Path, skip: &[&str]) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            let rel = p.strip_prefix(dir).unwrap().to_string_lossy().into_owned();
            if !skip.contains(&rel.as_str()) {
                out.insert(rel, std::fs::read(&p).unwrap());
            }
        }
    }
    out
}

fn convert(cwd: &Path, input: &Path, out: &Path, extra: &[&str]) -> String {
    let mut args = vec![
        "convert".to_string(),
        input.display().to_string(),
        "--to".into(),
        "orbax".into(),
        "--out".into(),
        out.display().to_string(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    ok(run(cwd, &args))
}

#[test]
fn convert_t2v_is_maxdiffusions_scanned_cache() {
    let t = tmp();
    let out = t.path().join("cache");
    convert(t.path(), &golden("models/t2v"), &out, &[]);
    assert_same_as_maxdiffusion(&out, "t2v_scanned");
    // Large chunks live in files of their own, small ones inline.
    let item = Item::open(&out.join("0/wan_state")).unwrap();
    let wanbake::format::orbax::Store::Ocdbt(db) = &item.store else {
        panic!("expected OCDBT")
    };
    assert_eq!(db.manifest.latest().unwrap().root_height, 0);
    // The manifest's report holds every chunk's value digest: a whole array's, a layer's.
    let manifest: Json =
        serde_json::from_slice(&std::fs::read(out.join("wanbake.manifest.json")).unwrap()).unwrap();
    let chunks = manifest["report"]["orbax"]["chunk_sha256"]["0/wan_state"]
        .as_object()
        .unwrap();
    let leaves = read_item(&out.join("0/wan_state"));
    let sha = wanbake::io::digest::sha256_hex;
    assert_eq!(
        chunks["proj_out.kernel/0.0"],
        sha(&leaves["proj_out.kernel"].2).as_str()
    );
    let q = &leaves["blocks.attn1.query.kernel"].2;
    let layer = q.len() / 3;
    assert_eq!(
        chunks["blocks.attn1.query.kernel/1.0.0"],
        sha(&q[layer..2 * layer]).as_str()
    );
    let planned: usize = leaves
        .iter()
        .map(|(n, (_, shape, _))| {
            if n.starts_with("blocks.") {
                shape[0] as usize
            } else {
                1
            }
        })
        .sum();
    assert_eq!(chunks.len(), planned);
    let data = std::fs::read_dir(out.join("0/wan_state/ocdbt.process_0/d"))
        .unwrap()
        .count();
    assert!(data > 10, "{data} data files");
    ok(run(t.path(), &["verify", out.to_str().unwrap()]));
}

#[test]
fn convert_t2v_f32_is_maxdiffusions_f32_cache() {
    let t = tmp();
    let out = t.path().join("cache");
    convert(t.path(), &golden("models/t2v"), &out, &["--dtype", "f32"]);
    assert_same_as_maxdiffusion(&out, "t2v_f32");
}

#[test]
fn orbax_output_is_deterministic_on_1_and_3_threads_and_verifies() {
    let t = tmp();
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    let model = golden("models/t2v");
    let args = |threads: &str, out: &Path| -> Vec<String> {
        vec![
            "--threads".into(),
            threads.into(),
            "convert".into(),
            model.display().to_string(),
            "--to".into(),
            "orbax".into(),
            "--out".into(),
            out.display().to_string(),
        ]
    };
    for (n, out) in [("1", &a), ("3", &b)] {
        let args = args(n, out);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        ok(run(t.path(), &args));
    }
    let (fa, fb) = (files(&a, &[]), files(&b, &[]));
    assert_eq!(fa.keys().collect::<Vec<_>>(), fb.keys().collect::<Vec<_>>());
    for (k, v) in &fa {
        assert!(*v == fb[k], "{k} differs between 1 and 3 threads");
    }
    // The manifest lists every file, and verify passes; a changed byte fails it.
    let manifest: Json =
        serde_json::from_slice(&std::fs::read(a.join("wanbake.manifest.json")).unwrap()).unwrap();
    let listed: Vec<&str> = (manifest["files"].as_array().unwrap().iter())
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    let on_disk: Vec<&String> = fa
        .keys()
        .filter(|k| *k != "wanbake.manifest.json")
        .collect();
    let mut listed_sorted = listed.clone();
    listed_sorted.sort();
    let mut on_disk: Vec<&str> = on_disk.iter().map(|s| s.as_str()).collect();
    on_disk.sort();
    assert_eq!(listed_sorted, on_disk);
    ok(run(t.path(), &["verify", a.to_str().unwrap()]));
    let chunk = (listed.iter())
        .find(|p| p.contains("ocdbt.process_0/d/"))
        .unwrap()
        .to_string();
    let path = a.join(&chunk);
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&path, bytes).unwrap();
    let (code, _, _) = parts(&run(t.path(), &["verify", a.to_str().unwrap()]));
    assert_eq!(code, 3, "verify must fail on a changed chunk file");
}

#[test]
fn merge_to_orbax_equals_merge_f32_then_convert() {
    let t = tmp();
    let lora = golden("adapters/diffusers_lora/pytorch_lora_weights.safetensors");
    let base = golden("models/t2v");
    let (direct, merged, converted) = (
        t.path().join("direct"),
        t.path().join("merged"),
        t.path().join("converted"),
    );
    let s = |p: &Path| p.display().to_string();
    for threads in ["1", "2"] {
        let _ = std::fs::remove_dir_all(&direct);
        ok(run(
            t.path(),
            &[
                "--threads",
                threads,
                "merge",
                "--base",
                &s(&base),
                "--adapter",
                &s(&lora),
                "--to",
                "orbax",
                "--out",
                &s(&direct),
            ],
        ));
    }
    ok(run(
        t.path(),
        &[
            "merge",
            "--base",
            &s(&base),
            "--adapter",
            &s(&lora),
            "--dtype",
            "f32",
            "--out",
            &s(&merged),
        ],
    ));
    convert(t.path(), &merged, &converted, &[]);
    let skip = ["wanbake.manifest.json"];
    let (fd, fc) = (files(&direct, &skip), files(&converted, &skip));
    assert_eq!(fd.keys().collect::<Vec<_>>(), fc.keys().collect::<Vec<_>>());
    for (k, v) in &fd {
        assert!(
            *v == fc[k],
            "{k}: merge --to orbax differs from merge then convert"
        );
    }
    // The merge changed something.
    let plain = t.path().join("plain");
    convert(t.path(), &base, &plain, &[]);
    assert_ne!(
        read_item(&plain.join("0/wan_state")),
        read_item(&direct.join("0/wan_state"))
    );
    ok(run(t.path(), &["verify", &s(&direct)]));
}

/// The merged bake against MaxDiffusion's cache of the reference-merged weights (diffusers'
/// fuse_lora of the same LoRA, loaded and saved by MaxDiffusion): equal bit for bit.
#[test]
fn merge_to_orbax_is_maxdiffusions_cache_of_the_reference_merge() {
    let t = tmp();
    let out = t.path().join("merged");
    let lora = golden("adapters/diffusers_lora/pytorch_lora_weights.safetensors");
    ok(run(
        t.path(),
        &[
            "merge",
            "--base",
            golden("models/t2v").to_str().unwrap(),
            "--adapter",
            lora.to_str().unwrap(),
            "--to",
            "orbax",
            "--out",
            out.to_str().unwrap(),
        ],
    ));
    assert_same_as_maxdiffusion(&out, "t2v_merged_diffusers_lora");
}

#[test]
fn orbax_refuses_options_it_decides() {
    let t = tmp();
    let out = t.path().join("x");
    let model = golden("models/t2v");
    for extra in [
        &["--layout", "diffusers"][..],
        &["--shard-size", "1000"][..],
        &["--city96-rounding"][..],
    ] {
        let mut args = vec![
            "convert",
            model.to_str().unwrap(),
            "--to",
            "orbax",
            "--out",
            out.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let (code, _, err) = parts(&run(t.path(), &args));
        assert_eq!(code, 2, "{extra:?}: {err}");
        assert!(!out.exists());
    }
}

#[test]
fn convert_t2v_nnx_is_maxdiffusions_unscanned_cache() {
    let t = tmp();
    let out = t.path().join("cache");
    convert(t.path(), &golden("models/t2v"), &out, &["--layout", "nnx"]);
    assert_same_as_maxdiffusion(&out, "t2v_unscanned");
}

#[test]
fn convert_a14b_is_maxdiffusions_wan22_cache() {
    let t = tmp();
    let out = t.path().join("cache");
    convert(t.path(), &golden("models/a14b"), &out, &[]);
    assert_same_as_maxdiffusion(&out, "a14b");
    ok(run(t.path(), &["verify", out.to_str().unwrap()]));
}

fn recipe(dir: &Path, out: &Path, checks: bool) -> PathBuf {
    let g = |p: &str| golden(p).display().to_string();
    let mut text = format!(
        "[base]\npath = \"{}\"\n\n[[adapter]]\npath = \"{}\"\nstrength = 1.0\n\n[[adapter]]\npath = \"{}\"\nstrength = 0.5\n\n[output]\ndir = \"{}\"\nto = \"orbax\"\n",
        g("models/t2v"),
        g("adapters/peft_plain"),
        g("adapters/kohya_lora/kohya_lora.safetensors"),
        out.display()
    );
    if checks {
        text.push_str(&format!(
            "\n[[check]]\nname = \"forward\"\ninputs = \"{}\"\nexpected = \"unmerged\"\ntolerance = 0.02\n",
            g("runner/t2v__inputs.safetensors")
        ));
    }
    let path = dir.join(if checks { "checks.toml" } else { "bake.toml" });
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn bake_to_orbax_equals_merge_to_orbax() {
    let t = tmp();
    let (baked, merged) = (t.path().join("baked"), t.path().join("merged"));
    let r = recipe(t.path(), &baked, false);
    let said = ok(run(t.path(), &["bake", r.to_str().unwrap()]));
    // One line per file for the first 8 of the 40, then a count (the manifest has them all).
    let listed = said.lines().filter(|l| l.contains("  0/")).count();
    assert_eq!(listed, 8, "{said}");
    assert!(
        said.contains("... and 32 more files (every sha256 in wanbake.manifest.json)"),
        "{said}"
    );
    let kohya = format!(
        "{}:0.5",
        golden("adapters/kohya_lora/kohya_lora.safetensors").display()
    );
    ok(run(
        t.path(),
        &[
            "merge",
            "--base",
            golden("models/t2v").to_str().unwrap(),
            "--adapter",
            golden("adapters/peft_plain").to_str().unwrap(),
            "--adapter",
            &kohya,
            "--to",
            "orbax",
            "--out",
            merged.to_str().unwrap(),
        ],
    ));
    let skip = ["wanbake.manifest.json"];
    let (fb, fm) = (files(&baked, &skip), files(&merged, &skip));
    assert_eq!(fb.keys().collect::<Vec<_>>(), fm.keys().collect::<Vec<_>>());
    for (k, v) in &fb {
        assert!(*v == fm[k], "{k}: bake differs from merge");
    }
    assert!(
        fb.keys()
            .any(|k| k.starts_with("0/wan_state/ocdbt.process_0/d/"))
    );
    ok(run(t.path(), &["verify", baked.to_str().unwrap()]));
}

#[test]
fn bake_to_orbax_with_checks_is_refused_before_writing() {
    let t = tmp();
    let out = t.path().join("baked");
    let r = recipe(t.path(), &out, true);
    let (code, _, err) = parts(&run(t.path(), &["bake", r.to_str().unwrap()]));
    assert_ne!(code, 0, "{err}");
    assert!(err.contains("output.to") && err.contains("runner"), "{err}");
    assert!(!out.exists());
}

/// wanbake reads back the cache it writes (the input half, `io::orbax`): restacking
/// the cache to diffusers gives the bytes of the same restack from the nnx-scanned
/// safetensors of the same weights, for a single transformer and for the A14B pair (whose
/// items come back as transformer/ and transformer_2/).
#[test]
fn wanbake_reads_back_its_own_cache() {
    let d = tmp();
    for model in ["t2v", "a14b"] {
        let input = golden(&format!("models/{model}"));
        let cache = d.path().join(format!("{model}-cache"));
        convert(d.path(), &input, &cache, &[]);
        let path = |p: &Path| p.to_str().unwrap().to_string();
        let restack = |from: &Path, to: &str, out: &Path| {
            let args = [
                "restack",
                &path(from),
                "--to",
                to,
                "--dtype",
                "bf16",
                "--out",
                &path(out),
            ];
            ok(run(d.path(), &args));
        };
        let back = d.path().join(format!("{model}-back"));
        restack(&cache, "diffusers", &back);
        let nnx = d.path().join(format!("{model}-nnx"));
        restack(&input, "nnx-scanned", &nnx);
        let reference = d.path().join(format!("{model}-ref"));
        restack(&nnx, "diffusers", &reference);
        let weights = |dir: &Path| -> BTreeMap<String, Vec<u8>> {
            let all = files(dir, &[]).into_iter();
            all.filter(|(name, _)| name.ends_with(".safetensors"))
                .collect()
        };
        let (got, want) = (weights(&back), weights(&reference));
        assert!(!got.is_empty(), "{model}: nothing read back");
        assert_eq!(
            got.keys().collect::<Vec<_>>(),
            want.keys().collect::<Vec<_>>(),
            "{model}"
        );
        for (name, bytes) in &got {
            assert!(bytes == &want[name], "{model}: {name} differs");
        }
    }
}
