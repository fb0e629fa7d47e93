//! Wan2.2-Animate-14B (issue #31) through the real binary, against the oracles of
//! `golden/variants/animate/` (golden/variants_animate_golden.py: diffusers 0.42.1's
//! `WanAnimateTransformer3DModel` saved with save_pretrained, the original and ComfyUI files
//! written by inverting diffusers' convert_wan_to_diffusers.py and checked by running it, and
//! MaxDiffusion 7cfb8801's own NNX tree of the same model): restack between every naming,
//! round trips, fingerprints of the released shapes and LoRA merges.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::*;
use wanbake::io::{Checkpoint, DType};

fn g(rel: &str) -> PathBuf {
    repo().join("golden/variants/animate").join(rel)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// [`common::digests`] by name with any ComfyUI `model.diffusion_model.` prefix removed.
fn digests(path: &Path) -> Digests {
    (common::digests(path).into_iter())
        .map(|(k, v)| match k.strip_prefix("model.diffusion_model.") {
            Some(name) => (name.to_string(), v),
            None => (k, v),
        })
        .collect()
}

/// Asserts two digest maps are equal (more than 200 tensors).
#[track_caller]
fn assert_same(case: &str, got: &Digests, want: &Digests) {
    assert_same_digests(case, got, want, 200);
}

fn restack(dir: &Path, input: &Path, to: &str, out: &str, extra: &[&str]) -> PathBuf {
    let mut args = vec!["restack", s(input), "--to", to, "--out", out];
    args.extend_from_slice(extra);
    ok(run(dir, &args));
    dir.join(out)
}

#[test]
fn diffusers_and_original_namings_convert_into_each_other_bit_for_bit() {
    let t = tmp();
    let dir = t.path();
    let diffusers = digests(&g("models/animate"));
    let original = digests(&g("models/animate_original.safetensors"));
    // diffusers -> original: every parameter in the original names and shapes (the (1, C,
    // 1, 1) activation biases, the fused linear1_kv, conv_out as convs.8), and the 14
    // blur-kernel buffers the diffusers model does not store, written as their constant.
    let w = restack(dir, &g("models/animate"), "wan", "w", &[]);
    assert_same("diffusers -> wan", &digests(&w), &original);
    // original (plain and ComfyUI-prefixed) -> diffusers: the diffusers model exactly; the
    // blur kernels are skipped, saying why.
    for (name, file) in [
        ("original", "models/animate_original.safetensors"),
        ("comfy", "models/animate_comfy.safetensors"),
    ] {
        let out = dir.join(format!("d_{name}"));
        let o = run(
            dir,
            &[
                "restack",
                s(&g(file)),
                "--to",
                "diffusers",
                "--out",
                s(&out),
            ],
        );
        let (code, _, err) = parts(&o);
        assert_eq!(code, 0, "{err}");
        // One line for the 14 blur kernels, with their count.
        assert_eq!(err.matches("blur-kernel buffer").count(), 1, "{err}");
        assert!(err.contains("skipped 14 keys ("), "{err}");
        assert_same(&format!("{name} -> diffusers"), &digests(&out), &diffusers);
        let config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap())
                .unwrap();
        assert_eq!(
            config["_class_name"], "WanAnimateTransformer3DModel",
            "{config}"
        );
        for (key, want) in [
            ("num_attention_heads", 2),
            ("attention_head_dim", 8),
            ("latent_channels", 4),
            ("motion_encoder_size", 512),
            ("motion_style_dim", 6),
            ("motion_dim", 3),
            ("motion_encoder_dim", 7),
            ("face_encoder_hidden_dim", 8),
            ("face_encoder_num_heads", 2),
            ("inject_face_latents_blocks", 2),
        ] {
            assert_eq!(config[key], want, "{key}: {config}");
        }
    }
    // Round trips, in f32 and in bf16: the bytes are only moved.
    let back = restack(dir, &w, "diffusers", "wd", &[]);
    assert_same("wan -> diffusers", &digests(&back), &diffusers);
    let bf16 = restack(
        dir,
        &g("models/animate"),
        "diffusers",
        "b",
        &["--dtype", "bf16"],
    );
    let bf16_digests = digests(&bf16);
    let bf16_count = bf16_digests
        .values()
        .filter(|(d, _, _)| *d == DType::BF16)
        .count();
    assert!(bf16_count > 150, "{bf16_count} bf16 tensors");
    let bw = restack(dir, &bf16, "wan", "bw", &[]);
    let bwd = restack(dir, &bw, "diffusers", "bwd", &[]);
    assert_same(
        "bf16 diffusers -> wan -> diffusers",
        &digests(&bwd),
        &bf16_digests,
    );
    assert_eq!(
        digests(&bw)["face_adapter.fuser_blocks.0.linear1_kv.weight"].1,
        vec![32, 16]
    );
}

/// MaxDiffusion's own tree of the tiny model: leaf path -> (shape, sha256).
fn maxdiffusion_tree(file: &str) -> BTreeMap<String, (Vec<usize>, String)> {
    let text = std::fs::read_to_string(g(&format!("nnx/{file}"))).unwrap();
    let j: serde_json::Value = serde_json::from_str(&text).unwrap();
    (j["leaves"].as_object().unwrap().iter())
        .map(|(path, leaf)| {
            assert_eq!(leaf["dtype"], "float32", "{path}");
            let shape = serde_json::from_value(leaf["shape"].clone()).unwrap();
            let sha = leaf["sha256"].as_str().unwrap().to_string();
            (path.clone(), (shape, sha))
        })
        .collect()
}

#[test]
fn nnx_outputs_equal_maxdiffusion_leaf_by_leaf_and_convert_back() {
    let t = tmp();
    let dir = t.path();
    let diffusers = digests(&g("models/animate"));
    let original = digests(&g("models/animate_original.safetensors"));
    for (layout, tree) in [
        ("nnx", "maxdiffusion_animate_unscanned.json"),
        ("nnx-scanned", "maxdiffusion_animate_scanned.json"),
    ] {
        let want = maxdiffusion_tree(tree);
        let out = restack(dir, &g("models/animate"), layout, layout, &[]);
        let got: BTreeMap<String, (Vec<usize>, String)> = digests(&out)
            .into_iter()
            .map(|(name, (dtype, shape, sha))| {
                assert_eq!(dtype, DType::F32, "{name}");
                (name.replace('.', "/"), (shape, sha))
            })
            .collect();
        let missing: Vec<&String> = want.keys().filter(|k| !got.contains_key(*k)).collect();
        let extra: Vec<&String> = got.keys().filter(|k| !want.contains_key(*k)).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "{layout}: missing {missing:?}, unexpected {extra:?}"
        );
        let differ: Vec<&String> = want.keys().filter(|k| got[*k] != want[*k]).collect();
        assert!(differ.is_empty(), "{layout}: differ {differ:?}");
        assert!(got.contains_key("motion_encoder/res_blocks/6/conv_skip/weight"));
        let back = restack(dir, &out, "diffusers", &format!("{layout}_d"), &[]);
        assert_same(
            &format!("{layout} -> diffusers"),
            &digests(&back),
            &diffusers,
        );
        let back = restack(dir, &out, "wan", &format!("{layout}_w"), &[]);
        assert_same(&format!("{layout} -> wan"), &digests(&back), &original);
    }
}

#[test]
fn synth_writes_the_released_14b_list_and_bake_plans_it_in_every_layout() {
    let t = tmp();
    let dir = t.path();
    let args = [
        "synth",
        "--model",
        "wan2.2-animate-14b",
        "--out",
        "sk",
        "--fill",
        "zero",
        "--skeleton",
    ];
    ok(run(dir, &args));
    // The diffusers list of the released model (WanAnimateTransformer3DModel of the released
    // config on torch's meta device), name for name and shape for shape.
    let shapes: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(g("shapes/animate_14b.json")).unwrap())
            .unwrap();
    let want: BTreeMap<String, Vec<usize>> =
        serde_json::from_value(shapes["diffusers"]["tensors"].clone()).unwrap();
    let c = Checkpoint::open_stored(&dir.join("sk")).unwrap();
    let got: BTreeMap<String, Vec<usize>> = (c.components[0].tensors.tensors())
        .map(|t| (t.view.name.to_string(), t.view.shape.to_vec()))
        .collect();
    assert_eq!(got, want);
    let v: serde_json::Value =
        serde_json::from_str(&ok(run(dir, &["inspect", "sk", "--json"]))).unwrap();
    let comp = &v[0]["components"][0];
    assert_eq!(
        comp["fingerprint"]["variant"], "wan2.2-animate-14b",
        "{comp}"
    );
    assert_eq!(comp["parameter_count"], 17_274_816_884u64, "{comp}");
    // Every layout plans: the original names hold 1441 tensors (the 14 blur kernels
    // included, as DiffSynth's hash of the real file says); MaxDiffusion's scanned tree stacks only the
    // blocks (40 x 32 block tensors -> 32), never the Animate lists.
    for (layout, tensors) in [
        ("diffusers", 1443),
        ("wan", 1441),
        ("nnx", 1443),
        ("nnx-scanned", 1443 - 40 * 32 + 32),
    ] {
        let recipe = dir.join(format!("{layout}.toml"));
        std::fs::write(
            &recipe,
            format!(
                "[base]\npath = \"sk\"\n\n[output]\ndir = \"out\"\ndtype = \"bf16\"\n\
                 layout = \"{layout}\"\n"
            ),
        )
        .unwrap();
        let o = run(dir, &["bake", s(&recipe), "--dry-run", "--json"]);
        let (code, stdout, err) = parts(&o);
        assert_eq!(code, 0, "{layout}: {err}");
        let plan: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        assert_eq!(plan["plan"]["output"]["tensors"], tensors, "{layout}");
        assert!(!dir.join("out").exists());
    }
}

/// The weights of a model folder or file, by name without a ComfyUI prefix.
fn values(path: &Path) -> BTreeMap<String, Vec<f32>> {
    let c = Checkpoint::open_stored(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (c.components[0].tensors.tensors())
        .map(|t| {
            let name = t.view.name.strip_prefix("model.diffusion_model.");
            let name = name.unwrap_or(t.view.name).to_string();
            (name, t.view.to_f32().unwrap())
        })
        .collect()
}

#[test]
fn loras_bind_across_namings_where_one_module_maps_to_one_module() {
    let t = tmp();
    let dir = t.path();
    // (base, adapter, PEFT reference in the base's names, the base's fused names whose
    // LoRA pieces do not bind there and are skipped)
    let fused = |n: usize| format!("face_adapter.fuser_blocks.{n}.linear1_kv.weight");
    let cases = [
        (
            g("models/animate_original.safetensors"),
            g("adapters/peft_animate"),
            g("references/peft_animate__original.safetensors"),
            vec![fused(0), fused(1)],
        ),
        (
            g("models/animate"),
            g("adapters/comfy_animate/comfy_animate.safetensors"),
            g("references/peft_animate.safetensors"),
            ["0.to_k", "0.to_v", "1.to_k", "1.to_v"]
                .map(|m| format!("face_adapter.{m}.weight"))
                .to_vec(),
        ),
    ];
    for (i, (base, adapter, reference, unbound)) in cases.iter().enumerate() {
        let out = dir.join(format!("m{i}"));
        let o = run(
            dir,
            &[
                "merge",
                "--base",
                s(base),
                "--adapter",
                s(adapter),
                "--dtype",
                "f32",
                "--out",
                s(&out),
                "--device",
                "cpu",
                "--allow-unmatched",
            ],
        );
        let (code, _, err) = parts(&o);
        assert_eq!(code, 0, "{err}");
        let (got, before, want) = (values(&out), values(base), values(reference));
        assert_eq!(got.len(), before.len());
        let mut merged = 0;
        for (name, x) in &got {
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            match want.get(name).filter(|_| !unbound.contains(name)) {
                Some(w) => {
                    let m = w.iter().fold(0f32, |m, v| m.max(v.abs()));
                    let worst = x
                        .iter()
                        .zip(w)
                        .map(|(a, b)| (a - b).abs())
                        .fold(0f32, f32::max);
                    assert!(worst <= 1e-5 * m, "{i}: {name}: {worst} > 1e-5 * {m}");
                    assert_ne!(bits(x), bits(&before[name]), "{i}: {name} unchanged");
                    merged += 1;
                }
                None => assert_eq!(bits(x), bits(&before[name]), "{i}: {name} changed"),
            }
        }
        // Every changed tensor of the reference but the unbound fused pieces: the pose
        // embedding, the face encoder's Conv1d and projection, linear1_q/to_q, linear2/
        // to_out and the trunk's blocks.
        let expected = want.keys().filter(|k| !unbound.contains(k)).count();
        assert_eq!(merged, expected, "{i}");
        assert!(merged >= 8, "{i}: {merged}");
    }
}
