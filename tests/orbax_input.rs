//! Orbax checkpoints as inputs (issue 29, the input half), driving the real binary. The
//! oracle is real Orbax: golden/orbax_input/ holds checkpoints that orbax-checkpoint 0.12.8 +
//! tensorstore 0.1.86 wrote (golden/orbax_input_golden.py) next to the safetensors files
//! holding the same values, and every command run on an Orbax input must give the bytes it
//! gives on those safetensors.

mod common;

use std::path::{Path, PathBuf};

use common::{parts, repo, run, tmp};
use sha2::{Digest, Sha256};

fn golden(p: &str) -> PathBuf {
    repo().join("golden").join(p)
}

fn input(p: &str) -> String {
    golden(&format!("orbax_input/{p}")).display().to_string()
}

fn t2v_config() -> String {
    golden("models/t2v/config.json").display().to_string()
}

/// Every file of an output folder except the manifest: relative path → bytes.
fn outputs(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = common::tree(dir)
        .into_iter()
        .filter(|p| !p.ends_with("wanbake.manifest.json") && dir.join(p).is_file())
        .map(|p| {
            let b = std::fs::read(dir.join(&p)).unwrap_or_else(|e| panic!("{p}: {e}"));
            (p, b)
        })
        .collect();
    v.sort();
    v
}

/// The weight files only (names differ: an Orbax input has no file stem to mirror).
fn weights(dir: &Path) -> Vec<Vec<u8>> {
    outputs(dir)
        .into_iter()
        .filter(|(p, _)| p.ends_with(".safetensors"))
        .map(|(_, b)| b)
        .collect()
}

#[track_caller]
fn ok_in(cwd: &Path, args: &[&str]) -> String {
    let o = run(cwd, args);
    let (code, out, err) = parts(&o);
    assert_eq!(code, 0, "{args:?}\n--- stdout\n{out}\n--- stderr\n{err}");
    out + &err
}

const SCANNED: [&str; 4] = [
    "base_ocdbt_zarr2",
    "base_zarr3_chunks",
    "base_nnx_value",
    "cache",
];

#[test]
fn convert_from_each_orbax_base_equals_convert_from_its_safetensors() {
    let d = tmp();
    let cases = SCANNED
        .iter()
        .map(|c| (*c, "nnx_scanned.safetensors"))
        .chain([("base_plain", "nnx_unscanned.safetensors")]);
    for (case, st) in cases {
        let want = d.path().join(format!("{case}-st"));
        let got = d.path().join(format!("{case}-orbax"));
        let args = |i: &str, o: &Path| {
            let o = o.display().to_string();
            ok_in(
                d.path(),
                &["convert", i, "--dtype", "f32", "--out", o.as_str()],
            )
        };
        args(&input(st), &want);
        args(&input(case), &got);
        let (w, g) = (weights(&want), weights(&got));
        assert_eq!(w.len(), 1, "{case}");
        assert!(
            w == g,
            "{case}: convert output differs from the safetensors one"
        );
    }
}

#[test]
fn restack_from_each_orbax_base_equals_restack_from_its_safetensors() {
    let d = tmp();
    let cases = SCANNED
        .iter()
        .map(|c| (*c, "nnx_scanned.safetensors"))
        .chain([("base_plain", "nnx_unscanned.safetensors")]);
    for (case, st) in cases {
        let want = d.path().join(format!("{case}-st"));
        let got = d.path().join(format!("{case}-orbax"));
        let go = |i: &str, o: &Path| {
            let o = o.display().to_string();
            ok_in(
                d.path(),
                &[
                    "restack",
                    i,
                    "--to",
                    "diffusers",
                    "--config",
                    &t2v_config(),
                    "--out",
                    o.as_str(),
                ],
            )
        };
        go(&input(st), &want);
        go(&input(case), &got);
        // The weights file is named after the input's stem (`nnx_scanned` here; an Orbax
        // input has none and gets diffusers' name): compare the bytes, and config.json.
        let (w, g) = (weights(&want), weights(&got));
        assert_eq!(w.len(), 1, "{case}");
        assert!(
            w == g,
            "{case}: restack output differs from the safetensors one"
        );
        let cfg = |d: &Path| std::fs::read(d.join("config.json")).unwrap();
        assert_eq!(cfg(&want), cfg(&got), "{case}: config.json");
    }
}

#[test]
fn a14b_pair_restacks_like_the_pipeline_folder() {
    let d = tmp();
    let want = d.path().join("st");
    let got = d.path().join("orbax");
    for (i, o) in [(input("a14b_nnx"), &want), (input("a14b_cache"), &got)] {
        let o = o.display().to_string();
        ok_in(
            d.path(),
            &[
                "restack",
                &i,
                "--to",
                "diffusers",
                "--config",
                &t2v_config(),
                "--out",
                o.as_str(),
            ],
        );
    }
    let (w, g) = (outputs(&want), outputs(&got));
    let names: Vec<&str> = g.iter().map(|x| x.0.as_str()).collect();
    assert!(
        names.contains(&"transformer/diffusion_pytorch_model.safetensors")
            && names.contains(&"transformer_2/diffusion_pytorch_model.safetensors"),
        "{names:?}"
    );
    assert!(w == g, "A14B restack differs");
}

#[test]
fn inspect_names_the_orbax_input_and_its_step() {
    let d = tmp();
    let out = ok_in(d.path(), &["inspect", &input("cache")]);
    assert!(
        out.contains("CheckpointManager root, latest step 0"),
        "{out}"
    );
    assert!(out.contains("item:     wan_state"), "{out}");
    assert!(out.contains("Orbax"), "{out}");
    let out = ok_in(d.path(), &["inspect", &input("lora_maxtext")]);
    assert!(out.contains("latest step 10"), "{out}");
    assert!(out.contains("left out: step"), "{out}");
    let out = ok_in(d.path(), &["inspect", &input("a14b_cache")]);
    assert!(
        out.contains("high_noise_transformer_state -> transformer ("),
        "{out}"
    );
    assert!(
        out.contains("low_noise_transformer_state -> transformer_2 ("),
        "{out}"
    );
    let out = ok_in(d.path(), &["inspect", &input("base_plain")]);
    assert!(out.contains("orbax:      item folder"), "{out}");
}

fn merge(d: &Path, adapter: &str, out: &Path) -> String {
    let o = out.display().to_string();
    let base = golden("models/t2v").display().to_string();
    ok_in(
        d,
        &[
            "merge",
            "--base",
            &base,
            "--adapter",
            adapter,
            "--out",
            o.as_str(),
        ],
    )
}

#[test]
fn qwix_lora_from_orbax_merges_like_the_same_lora_from_safetensors() {
    let d = tmp();
    let want = d.path().join("st");
    let got = d.path().join("orbax");
    merge(
        d.path(),
        &golden("qwix/qwix_stacked.safetensors")
            .display()
            .to_string(),
        &want,
    );
    merge(d.path(), &input("lora_maxtext"), &got);
    let w = weights(&want);
    assert!(w == weights(&got), "merged bytes differ");
    // The merge changed something (a test that cannot fail is a defect).
    let base = std::fs::read(golden("models/t2v/diffusion_pytorch_model.safetensors")).unwrap();
    assert!(w[0] != base);
    // Every file of the Orbax input, and none of the decoded copies, is in the manifest,
    // with its sha256.
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(got.join("wanbake.manifest.json")).unwrap()).unwrap();
    let inputs = m["inputs"].as_array().unwrap();
    let step = golden("orbax_input/lora_maxtext/10");
    let files: Vec<String> = common::tree(&step)
        .into_iter()
        .filter(|p| step.join(p).is_file())
        .collect();
    assert!(files.len() >= 5, "{files:?}");
    for f in &files {
        let p = step.join(f);
        let sha = hex(&Sha256::digest(std::fs::read(&p).unwrap()));
        let rec = inputs
            .iter()
            .find(|r| r["path"].as_str() == Some(p.display().to_string().as_str()))
            .unwrap_or_else(|| panic!("{} not in the manifest: {inputs:?}", p.display()));
        assert_eq!(rec["role"], "adapter");
        assert_eq!(rec["sha256"].as_str(), Some(sha.as_str()), "{f}");
    }
    let text = serde_json::to_string(&m).unwrap();
    assert!(!text.contains("wanbake-orbax-scratch"), "{text}");
    assert!(
        !text.contains("lora_maxtext/5/"),
        "an older step was recorded"
    );
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn value_suffixed_lora_without_metadata_is_refused_and_translates_with_a_scale() {
    let d = tmp();
    let out = d.path().join("out");
    let o = out.display().to_string();
    let base = golden("models/t2v").display().to_string();
    let r = run(
        d.path(),
        &[
            "merge",
            "--base",
            &base,
            "--adapter",
            &input("lora_value_nometa"),
            "--out",
            o.as_str(),
        ],
    );
    let (code, _, err) = parts(&r);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("custom_metadata[\"lora\"]") && err.contains("does not guess"),
        "{err}"
    );
    assert!(!out.exists());
    // With the scale given, it reads as the safetensors file with the same values does.
    let mut got = Vec::new();
    for (i, a) in [
        (
            "st",
            golden("qwix/qwix_per_layer.safetensors")
                .display()
                .to_string(),
        ),
        ("orbax", input("lora_value_nometa")),
    ] {
        let o = d.path().join(i).display().to_string();
        ok_in(
            d.path(),
            &[
                "translate",
                &a,
                "--to",
                "peft",
                "--scale",
                "1.5",
                "--out",
                o.as_str(),
            ],
        );
        got.push(weights(&d.path().join(i)));
    }
    assert_eq!(got[0].len(), 1);
    assert!(got[0] == got[1], "translated bytes differ");
}

fn copy_dir(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        let to = dst.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to);
        } else {
            std::fs::copy(e.path(), &to).unwrap();
        }
    }
}

#[track_caller]
fn refused(d: &Path, base: &Path, needles: &[&str]) {
    let out = d.join("out");
    let o = out.display().to_string();
    let b = base.display().to_string();
    let r = run(d, &["convert", &b, "--dtype", "f32", "--out", o.as_str()]);
    let (code, _, err) = parts(&r);
    assert_eq!(code, 1, "{err}");
    for n in needles {
        assert!(err.contains(n), "`{n}` not in: {err}");
    }
    assert_eq!(err.matches("error:").count(), 1, "{err}");
    assert!(!out.exists(), "an output was written");
}

#[test]
fn a_leaf_missing_from_the_store_is_one_clear_error() {
    let d = tmp();
    let item = d.path().join("item");
    copy_dir(&golden("orbax_input/base_plain"), &item);
    std::fs::remove_dir_all(item.join("blocks.1.attn1.query.kernel")).unwrap();
    refused(
        d.path(),
        &item,
        &["blocks.1.attn1.query.kernel/.zarray", "is missing"],
    );
}

#[test]
fn a_step_of_unknown_items_is_one_clear_error() {
    let d = tmp();
    let step = d.path().join("root").join("7");
    copy_dir(&golden("orbax_input/base_plain"), &step.join("encoder"));
    copy_dir(&golden("orbax_input/base_plain"), &step.join("decoder"));
    refused(
        d.path(),
        &d.path().join("root"),
        &["decoder, encoder", "wan_state", "point at the item folder"],
    );
}

#[test]
fn extract_from_an_orbax_base_and_adapter_equals_extract_from_their_safetensors() {
    let d = tmp();
    let cases = [
        (
            "st",
            "nnx_scanned.safetensors",
            golden("qwix/qwix_stacked.safetensors"),
        ),
        (
            "orbax",
            "base_ocdbt_zarr2",
            golden("orbax_input/lora_maxtext"),
        ),
    ];
    let mut got = Vec::new();
    for (name, base, adapter) in cases {
        let out = d.path().join(name);
        let o = out.display().to_string();
        let a = adapter.display().to_string();
        ok_in(
            d.path(),
            &[
                "extract",
                "--base",
                &input(base),
                "--adapter",
                &a,
                "--rank",
                "4",
                "--out",
                o.as_str(),
            ],
        );
        got.push(weights(&out));
    }
    assert_eq!(got[0].len(), 1);
    assert!(got[0] == got[1], "extracted LoRAs differ");
}

/// name → (dtype, shape, bytes) of every tensor (the headers of baked files differ: they
/// record the inputs).
fn tensors(path: &Path) -> Vec<(String, String, Vec<usize>, Vec<u8>)> {
    let f = wanbake::io::SafetensorsFile::open(path).unwrap();
    (0..f.infos().len())
        .map(|i| {
            let v = f.view_at(i);
            let (dtype, shape) = (v.dtype.to_string(), v.shape.to_vec());
            (v.name.to_string(), dtype, shape, v.bytes.to_vec())
        })
        .collect()
}

#[test]
fn bake_from_an_orbax_cache_and_lora_equals_bake_from_their_safetensors() {
    let d = tmp();
    let cases = [
        (
            "st",
            "nnx_scanned.safetensors",
            golden("qwix/qwix_stacked.safetensors"),
        ),
        ("orbax", "cache", golden("orbax_input/lora_maxtext")),
    ];
    let mut got = Vec::new();
    for (name, base, adapter) in cases {
        let recipe = d.path().join(format!("{name}.toml"));
        let out = d.path().join(name);
        std::fs::write(
            &recipe,
            format!(
                "[base]\npath = \"{}\"\n\n[[adapter]]\npath = \"{}\"\n\n[output]\ndir = \"{}\"\n",
                input(base),
                adapter.display(),
                out.display()
            ),
        )
        .unwrap();
        ok_in(d.path(), &["bake", recipe.to_str().unwrap()]);
        let file = common::tree(&out)
            .into_iter()
            .find(|p| p.ends_with(".safetensors"))
            .unwrap();
        got.push((out.clone(), tensors(&out.join(file))));
    }
    assert!(!got[0].1.is_empty());
    assert!(got[0].1 == got[1].1, "baked tensors differ");
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(got[1].0.join("wanbake.manifest.json")).unwrap())
            .unwrap();
    let text = serde_json::to_string(&m["inputs"]).unwrap();
    assert!(
        text.contains("orbax_input/cache/0/wan_state/manifest.ocdbt"),
        "{text}"
    );
    assert!(
        text.contains("orbax_input/cache/0/wan_config/metadata"),
        "{text}"
    );
}

fn names_of(dir: &Path) -> wanbake::io::orbax::TreeNames {
    let item = wanbake::format::orbax::Item::open(dir).unwrap();
    wanbake::io::orbax::tensor_names(&item.tree, dir).unwrap()
}

#[test]
fn tree_paths_become_names_with_value_stripped_last_only_and_params_params_stripped() {
    // golden/orbax/nnx_value has a MODULE named `value` (blocks.value.kernel.value).
    let n = names_of(&golden("orbax/nnx_value"));
    let names: Vec<&str> = n.tensors.iter().map(|(t, _)| t.as_str()).collect();
    assert_eq!(
        names,
        [
            "blocks.attn1.query.bias",
            "blocks.attn1.query.kernel",
            "blocks.value.kernel",
            "norm_out.scale"
        ]
    );
    assert!(n.tensors.iter().all(|(t, a)| format!("{t}.value") == *a));
    // MaxText: only params/params, prefix stripped; `step` left out.
    let n = names_of(&golden("orbax_input/lora_maxtext/10/items"));
    assert_eq!(n.left_out, ["step"]);
    assert!(
        n.tensors
            .iter()
            .all(|(t, a)| format!("params.params.{t}") == *a)
    );
    assert!(
        n.tensors
            .iter()
            .any(|(t, _)| t == "blocks.attn1.query.kernel_lora_a")
    );
}

#[test]
fn a_tree_with_a_leaf_and_its_value_twin_is_refused() {
    let leaf = |keys: &[&str]| {
        let km: Vec<String> = keys
            .iter()
            .map(|k| format!("{{\"key\": \"{k}\", \"key_type\": 2}}"))
            .collect();
        format!(
            "\"{}\": {{\"key_metadata\": [{}], \"value_metadata\": {{\"value_type\": \"np.ndarray\", \"skip_deserialize\": false}}}}",
            keys.join("/"),
            km.join(", ")
        )
    };
    let text = format!(
        "{{\"tree_metadata\": {{{}, {}}}}}",
        leaf(&["norm", "scale"]),
        leaf(&["norm", "scale", "value"])
    );
    let tree = wanbake::format::orbax::metadata::parse_tree_metadata(text.as_bytes()).unwrap();
    let err = wanbake::io::orbax::tensor_names(&tree, Path::new("item"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("item/_METADATA") && err.contains("`norm.scale`"),
        "{err}"
    );
}

#[test]
fn every_orbax_case_reads_back_bit_for_bit_against_numpy() {
    let text = std::fs::read_to_string(golden("orbax_input/expected.json")).unwrap();
    let expected: serde_json::Value = serde_json::from_str(&text).unwrap();
    let cases = expected["cases"].as_object().unwrap();
    assert_eq!(cases.len(), 9);
    for (case, leaves) in cases {
        let (dir, component) = match case.split_once('/') {
            Some((d, "high")) => (d, "transformer"),
            Some((d, _)) => (d, "transformer_2"),
            None => (case.as_str(), ""),
        };
        let ck =
            wanbake::io::Checkpoint::open_stored(&golden(&format!("orbax_input/{dir}"))).unwrap();
        let comp = ck.component(component).unwrap();
        let leaves = leaves.as_object().unwrap();
        assert_eq!(comp.tensors.len(), leaves.len() - 1, "{case}");
        for (name, want) in leaves.iter().filter(|(n, _)| *n != "_case") {
            let t = comp
                .tensors
                .get(name)
                .unwrap_or_else(|| panic!("{case}: {name}"));
            let numpy = match t.view.dtype.to_string().as_str() {
                "BF16" => "bfloat16",
                "F32" => "float32",
                other => panic!("{case}: {name}: {other}"),
            };
            assert_eq!(want["dtype"], numpy, "{case}: {name}");
            assert_eq!(
                want["shape"],
                serde_json::json!(t.view.shape),
                "{case}: {name}"
            );
            let sha = hex(&Sha256::digest(t.view.bytes));
            assert_eq!(
                want["sha256"].as_str(),
                Some(sha.as_str()),
                "{case}: {name}"
            );
        }
    }
}
