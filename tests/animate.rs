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

/// (dtype, shape, sha256 of the bytes) of every tensor of a checkpoint (file or folder, one
/// component), by name with any ComfyUI prefix removed.
type Digests = BTreeMap<String, (DType, Vec<usize>, String)>;

fn digests(path: &Path) -> Digests {
    let c = Checkpoint::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(c.components.len(), 1, "{}", path.display());
    (c.components[0].tensors.tensors())
        .map(|t| {
            let v = t.view;
            let name = v
                .name
                .strip_prefix("model.diffusion_model.")
                .unwrap_or(v.name);
            let sha = wanbake::io::digest::sha256_hex(v.bytes);
            (name.to_string(), (v.dtype, v.shape.to_vec(), sha))
        })
        .collect()
}

/// Asserts two digest maps are equal, naming the first differences.
#[track_caller]
fn assert_same(case: &str, got: &Digests, want: &Digests) {
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
    assert!(want.len() > 200, "{case}: {} tensors", want.len());
}

fn restack(dir: &Path, input: &Path, to: &str, out: &str, extra: &[&str]) -> PathBuf {
    let mut args = vec!["restack", s(input), "--to", to, "--out", out];
    args.extend_from_slice(extra);
    ok(run(dir, &args));
    dir.join(out)
}

fn is_blur_kernel(name: &str) -> bool {
    name.ends_with(".0.kernel") && name.starts_with("motion_encoder.enc.net_app.convs.")
}

/// The original file's tensors without its 14 blur-kernel buffers (constants the diffusers
/// model does not store).
fn original_without_kernels() -> Digests {
    let mut d = digests(&g("models/animate_original.safetensors"));
    let before = d.len();
    d.retain(|k, _| !is_blur_kernel(k));
    assert_eq!(before - d.len(), 14);
    d
}

#[test]
fn diffusers_and_original_namings_convert_into_each_other_bit_for_bit() {
    let t = tmp();
    let dir = t.path();
    let diffusers = digests(&g("models/animate"));
    let original = original_without_kernels();
    // diffusers -> original: every parameter in the original names and shapes (the (1, C,
    // 1, 1) activation biases, the fused linear1_kv, conv_out as convs.8).
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
        assert_eq!(err.matches("blur-kernel buffer").count(), 14, "{err}");
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
    let original = original_without_kernels();
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
