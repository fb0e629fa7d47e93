//! Quantized checkpoints as bases, through the real binary: each file made by the reference
//! tool (torch's fp8 cast and ComfyUI's scale rule, gguf-py; golden/quant_golden.py), decoded
//! by `convert --dtype f32` to exactly what the loader computes (`t2v_*_dequant.safetensors`:
//! `q.to(f32) * scale_weight`, gguf-py's `dequantize`), merged exactly as that decoded base,
//! and every marked input wanbake does not decode refused with nothing written.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use wanbake::io::SafetensorsFile;

fn quant(name: &str) -> PathBuf {
    repo().join("golden/quant").join(name)
}

/// Every tensor of `want` is in `got` with the same dtype, shape and bytes, and nothing else.
#[track_caller]
fn assert_same_tensors(got: &Path, want: &Path) {
    let g = SafetensorsFile::open(got).unwrap();
    let w = SafetensorsFile::open(want).unwrap();
    let mut gn: Vec<&str> = g.infos().iter().map(|t| t.name.as_str()).collect();
    let mut wn: Vec<&str> = w.infos().iter().map(|t| t.name.as_str()).collect();
    gn.sort();
    wn.sort();
    assert_eq!(gn, wn, "{} vs {}", got.display(), want.display());
    for name in wn {
        let (a, b) = (g.view(name).unwrap(), w.view(name).unwrap());
        assert_eq!((a.dtype, a.shape), (b.dtype, b.shape), "{name}");
        if a.bytes != b.bytes {
            let (x, y) = (a.to_f32().unwrap(), b.to_f32().unwrap());
            let i = x
                .iter()
                .zip(&y)
                .position(|(p, q)| p.to_bits() != q.to_bits());
            panic!("{name}: first difference at {i:?} of {}", x.len());
        }
    }
}

/// `merge --base base --adapter adapter --dtype f32 --out out` in `dir`: the weights file and
/// the printed summary.
fn merge_f32(dir: &Path, base: &Path, adapter: &Path, out: &str) -> (PathBuf, String) {
    let stdout = ok(run(
        dir,
        &[
            "merge",
            "--base",
            base.to_str().unwrap(),
            "--adapter",
            adapter.to_str().unwrap(),
            "--dtype",
            "f32",
            "--out",
            out,
            "--device",
            "cpu",
        ],
    ));
    (weights_in(&dir.join(out)), stdout)
}

fn convert_f32(dir: &Path, input: &Path, out: &str) -> PathBuf {
    let o = dir.join(out);
    ok(run(
        dir,
        &[
            "convert",
            input.to_str().unwrap(),
            "--dtype",
            "f32",
            "--out",
            o.to_str().unwrap(),
        ],
    ));
    weights_in(&o)
}

#[test]
fn scaled_fp8_base_converts_to_comfyuis_dequantization() {
    let d = tmp();
    let got = convert_f32(d.path(), &quant("expect_t2v_fp8_scaled.safetensors"), "c");
    assert_same_tensors(&got, &quant("t2v_fp8_scaled_dequant.safetensors"));
}

#[test]
fn gguf_bases_convert_to_gguf_pys_dequantization() {
    for fmt in ["q8_0", "q4_0"] {
        let d = tmp();
        let got = convert_f32(d.path(), &quant(&format!("expect_t2v_{fmt}.gguf")), "c");
        assert_same_tensors(&got, &quant(&format!("t2v_{fmt}_dequant.safetensors")));
    }
}

/// A merge onto a quantized base equals the same merge onto its decoded values (the f32
/// file the loader's arithmetic gives), byte for byte.
#[test]
fn merge_onto_a_quantized_base_is_the_merge_onto_its_decoding() {
    let lora = repo().join("golden/adapters/peft_plain");
    let cases = [
        (
            "expect_t2v_fp8_scaled.safetensors",
            "t2v_fp8_scaled_dequant.safetensors",
        ),
        ("expect_t2v_q8_0.gguf", "t2v_q8_0_dequant.safetensors"),
        ("expect_t2v_q4_0.gguf", "t2v_q4_0_dequant.safetensors"),
    ];
    for (base, decoded) in cases {
        let d = tmp();
        let (got, _) = merge_f32(d.path(), &quant(base), &lora, "q");
        let (want, _) = merge_f32(d.path(), &quant(decoded), &lora, "f");
        assert_same_tensors(&got, &want);
    }
}

/// The new user's path of the issue: a scaled-fp8 file wanbake wrote, converted back to bf16,
/// holds the dequantized weights (within fp8's error of the source), never the raw codes.
#[test]
fn a_scaled_fp8_output_converted_back_holds_weights_not_codes() {
    let d = tmp();
    let t2v = repo().join("golden/models/t2v");
    ok(run(
        d.path(),
        &[
            "convert",
            t2v.to_str().unwrap(),
            "--to",
            "fp8-scaled",
            "--out",
            "fp8",
        ],
    ));
    let fp8 = weights_in(&d.path().join("fp8"));
    let back = convert_f32(d.path(), &fp8, "back");
    let f = SafetensorsFile::open(&back).unwrap();
    assert!(f.infos().iter().all(|t| !t.name.contains("scale")));
    let src =
        SafetensorsFile::open(&repo().join("golden/models/t2v_original.safetensors")).unwrap();
    let name = "blocks.0.self_attn.q.weight";
    let (a, b) = (f.read_f32(name).unwrap(), src.read_f32(name).unwrap());
    let amax = b.iter().fold(0f32, |m, x| m.max(x.abs()));
    for (x, y) in a.iter().zip(&b) {
        // e4m3 keeps 3 mantissa bits: half an ulp is 1/16 of the value, plus subnormals.
        assert!(
            (x - y).abs() <= y.abs() / 16.0 + amax / 448.0 / 512.0,
            "{x} vs {y}"
        );
    }
}

// ---- refusals: a marked input wanbake does not decode is never read as raw codes ---------

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

const W: &str = "blocks.0.self_attn.q.weight";

/// (case, tensors, metadata, the tensor the message must name, a word of the format).
type Bad = (
    &'static str,
    Vec<(&'static str, &'static str, Vec<usize>, Vec<u8>)>,
    Option<&'static str>,
    &'static str,
    &'static str,
);

fn bad_inputs() -> Vec<Bad> {
    let fp8 = vec![0x38u8; 4];
    vec![
        (
            "scale_weight without a scaled_fp8 marker",
            vec![
                (W, "F8_E4M3", vec![2, 2], fp8.clone()),
                (
                    "blocks.0.self_attn.q.scale_weight",
                    "F32",
                    vec![],
                    f32s(&[0.5]),
                ),
            ],
            None,
            "blocks.0.self_attn.q.scale_weight",
            "no `scaled_fp8` marker",
        ),
        (
            "an nvfp4 comfy_quant marker without its scales",
            vec![
                (W, "U8", vec![2, 1], vec![0x12, 0x34]),
                (
                    "blocks.0.self_attn.q.comfy_quant",
                    "U8",
                    vec![19],
                    br#"{"format": "nvfp4"}"#.to_vec(),
                ),
            ],
            None,
            W,
            "weight_scale` is missing",
        ),
        (
            "a _quantization_metadata header naming a layer without its scales",
            vec![(W, "U8", vec![2, 8], vec![0; 16])],
            Some(
                r#"{"_quantization_metadata":"{\"format_version\":\"1.0\",\"layers\":{\"blocks.0.self_attn.q\":{\"format\":\"nvfp4\"}}}"}"#,
            ),
            W,
            "comfyui-mixed-precision",
        ),
        (
            "an int8 weight with no marker",
            vec![(W, "I8", vec![2, 2], vec![1, 2, 3, 4])],
            None,
            W,
            "I8 codes",
        ),
        (
            "a scale_weight of two values",
            vec![
                (W, "F8_E4M3", vec![2, 2], fp8.clone()),
                (
                    "blocks.0.self_attn.q.scale_weight",
                    "F32",
                    vec![2],
                    f32s(&[0.5, 0.5]),
                ),
                ("scaled_fp8", "F8_E4M3", vec![0], vec![]),
            ],
            None,
            "blocks.0.self_attn.q.scale_weight",
            "expected one float value",
        ),
        (
            "a scale_weight on a bf16 weight",
            vec![
                (W, "BF16", vec![2, 2], vec![0; 8]),
                (
                    "blocks.0.self_attn.q.scale_weight",
                    "F32",
                    vec![],
                    f32s(&[0.5]),
                ),
                ("scaled_fp8", "F8_E4M3", vec![0], vec![]),
            ],
            None,
            W,
            "cast it to fp8 unscaled",
        ),
        (
            "a LightX2V scale of the wrong shape",
            vec![
                (W, "I8", vec![2, 2], vec![1, 2, 3, 4]),
                (
                    "blocks.0.self_attn.q.weight_scale",
                    "F32",
                    vec![2],
                    f32s(&[0.5, 0.5]),
                ),
            ],
            None,
            "blocks.0.self_attn.q.weight_scale",
            "per-row scale",
        ),
    ]
}

#[test]
fn marked_inputs_wanbake_cannot_decode_are_refused_with_nothing_written() {
    let lora = repo().join("golden/adapters/peft_plain");
    for (case, tensors, meta, tensor, word) in bad_inputs() {
        let d = tmp();
        write_raw(&d.path().join("bad.safetensors"), &tensors, meta);
        let commands: [Vec<&str>; 3] = [
            vec![
                "convert",
                "bad.safetensors",
                "--dtype",
                "bf16",
                "--out",
                "o",
            ],
            vec![
                "restack",
                "bad.safetensors",
                "--to",
                "diffusers",
                "--out",
                "o",
            ],
            vec![
                "merge",
                "--base",
                "bad.safetensors",
                "--adapter",
                lora.to_str().unwrap(),
                "--out",
                "o",
            ],
        ];
        for args in commands {
            let (code, out, err) = parts(&run(d.path(), &args));
            assert_eq!(code, 1, "{case}: {args:?}\n{out}\n{err}");
            assert!(err.contains("bad.safetensors"), "{case}: {err}");
            assert!(err.contains(tensor), "{case}: names `{tensor}`: {err}");
            assert!(err.contains(word), "{case}: says `{word}`: {err}");
            assert_eq!(tree(d.path()), ["bad.safetensors"], "{case}: {args:?}");
        }
    }
}

/// The sha256 of f32 values as little-endian bytes (what golden/quant/kquant_wan.json records
/// of gguf-py's dequantization).
fn sha256_f32(y: &[f32]) -> String {
    use sha2::{Digest, Sha256};
    let bytes: Vec<u8> = y.iter().flat_map(|v| v.to_le_bytes()).collect();
    wanbake::io::digest::hex(&Sha256::digest(&bytes))
}

/// Every K mix as a base: the file is ggml's own (its sha256 is the one
/// golden/kquant_wan_golden.py recorded of ggml + gguf-py's file, asserted first), and
/// `convert --dtype f32` of it gives, per tensor, the bits of gguf-py's `dequantize`.
#[test]
fn k_quant_gguf_bases_convert_to_gguf_pys_dequantization() {
    use sha2::{Digest, Sha256};
    let text = fs_err::read_to_string(repo().join("golden/quant/kquant_wan.json")).unwrap();
    let golden: serde_json::Value = serde_json::from_str(&text).unwrap();
    let d = tmp();
    let model = d.path().join("small_wan.safetensors");
    write_small_wan(&model, &golden["model"]);
    for mix in ["q2_k", "q3_k_m", "q4_k_m", "q5_k_s", "q6_k"] {
        let want = &golden["cases"][format!("gguf:{mix}")];
        let out = d.path().join(mix);
        let to = format!("gguf:{mix}");
        ok(run(
            d.path(),
            &[
                "convert",
                model.to_str().unwrap(),
                "--to",
                &to,
                "--out",
                out.to_str().unwrap(),
            ],
        ));
        let file = out.join(format!("model-{mix}.gguf"));
        let sha = wanbake::io::digest::hex(&Sha256::digest(fs_err::read(&file).unwrap()));
        assert_eq!(
            sha,
            want["sha256"].as_str().unwrap(),
            "{mix}: not ggml's file"
        );
        let decoded = convert_f32(d.path(), &file, &format!("{mix}_f32"));
        let f = SafetensorsFile::open(&decoded).unwrap();
        let tensors = want["tensors"].as_object().unwrap();
        assert_eq!(f.infos().len(), tensors.len(), "{mix}");
        for (name, t) in tensors {
            let got = f.read_f32(name).unwrap();
            assert_eq!(
                sha256_f32(&got),
                t["f32_sha256"].as_str().unwrap(),
                "{mix}: {name}"
            );
        }
    }
}

/// A 5-D Conv3d weight city96's pipeline stores as written by gguf-py (golden/quant/
/// gguf_written.gguf) comes back with its torch shape.
#[test]
fn gguf_5d_tensors_keep_their_torch_shape() {
    let d = tmp();
    let got = convert_f32(d.path(), &quant("gguf_written.gguf"), "c");
    let f = SafetensorsFile::open(&got).unwrap();
    let src = SafetensorsFile::open(&quant("gguf_written_source.safetensors")).unwrap();
    for t in src.infos() {
        let v = f.view(&t.name).unwrap_or_else(|| panic!("{}", t.name));
        assert_eq!(v.shape, t.shape.as_slice(), "{}", t.name);
    }
    // Stored as F32 by gguf-py: the same bits.
    let name = "patch_embedding.weight";
    assert_eq!(f.view(name).unwrap().shape.len(), 5);
    assert_eq!(f.view(name).unwrap().bytes, src.view(name).unwrap().bytes);
}

// ---- the formats of golden/quant_base (comfy-kitchen, ComfyUI, LightX2V, torch, gguf-py) ----

fn quant_base(name: &str) -> PathBuf {
    repo().join("golden/quant_base").join(name)
}

fn quant_base_index() -> serde_json::Value {
    let text = fs_err::read_to_string(quant_base("index.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// Every input of golden/quant_base, converted to f32, holds per tensor the bits of its
/// runtime's decoding (index.json's `f32_sha256`; for ConvRot the exact un-rotation,
/// `exact_f32_sha256`, which comfy-kitchen's BLAS-dependent f32 GEMM misses by at most
/// 2.4e-7), under the names the file stores them.
#[test]
fn every_quantized_format_converts_to_its_runtimes_decoding() {
    let index = quant_base_index();
    let files = index["files"].as_object().unwrap();
    assert_eq!(files.len(), 17);
    for (file, entry) in files {
        let d = tmp();
        let got = convert_f32(d.path(), &quant_base(file), "c");
        let f = SafetensorsFile::open(&got).unwrap();
        let tensors = entry["expect"]["tensors"].as_object().unwrap();
        assert_eq!(f.infos().len(), tensors.len(), "{file}: tensor count");
        for (name, t) in tensors {
            let key = t["stored"]["key"].as_str().unwrap();
            let v = f
                .view(key)
                .unwrap_or_else(|| panic!("{file}: {key} missing"));
            let shape: Vec<usize> = serde_json::from_value(t["shape"].clone()).unwrap();
            assert_eq!(v.shape, shape.as_slice(), "{file}: {name}");
            let want = t
                .get("exact_f32_sha256")
                .unwrap_or(&t["f32_sha256"])
                .as_str()
                .unwrap();
            assert_eq!(sha256_f32(&v.to_f32().unwrap()), want, "{file}: {name}");
        }
    }
}

/// A merge onto each format equals the same merge onto its decoded f32 values, byte for byte,
/// and the report says what the base was.
#[test]
fn merge_onto_every_quantized_format_is_the_merge_onto_its_decoding() {
    let d = tmp();
    small_lora(
        &d.path().join("lora.safetensors"),
        0x5EED_0040,
        &[("self_attn.q", 64, 64), ("ffn.2", 64, 256)],
    );
    for file in [
        "comfy_nvfp4.safetensors",
        "comfy_mxfp8.safetensors",
        "comfy_int8.safetensors",
        "comfy_fp8_header.safetensors",
        "lightx2v_fp8.safetensors",
        "legacy_bf16_scale.safetensors",
        "gguf_orig_shape.gguf",
    ] {
        let decoded = convert_f32(d.path(), &quant_base(file), &format!("dec_{file}"));
        let lora = d.path().join("lora.safetensors");
        let (got, stdout) = merge_f32(d.path(), &quant_base(file), &lora, &format!("q_{file}"));
        let (want, _) = merge_f32(d.path(), &decoded, &lora, &format!("f_{file}"));
        assert_same_tensors(&got, &want);
        assert!(stdout.contains("base: "), "{file}: {stdout}");
    }
}

/// The malformed inputs of golden/quant_base/bad (ComfyUI loads two of them without a check
/// and fails later at dequantize): refused, naming the file and the format.
#[test]
fn malformed_quantized_inputs_are_refused() {
    let index = quant_base_index();
    for (file, entry) in index["bad"].as_object().unwrap() {
        let d = tmp();
        let input = quant_base(&format!("bad/{file}"));
        let (code, out, err) = parts(&run(
            d.path(),
            &[
                "convert",
                input.to_str().unwrap(),
                "--dtype",
                "f32",
                "--out",
                "o",
            ],
        ));
        assert_eq!(code, 1, "{file} ({}): {out}{err}", entry["problem"]);
        assert!(err.contains(file.as_str()), "{file}: {err}");
        assert!(err.contains("comfyui-mixed-precision"), "{file}: {err}");
        assert!(!d.path().join("o").exists(), "{file}");
    }
}

/// The small model's diffusers config (golden/quant_base_golden.py's `MODELS["small"]`).
fn small_config(path: &Path) {
    let config = serde_json::json!({
        "_class_name": "WanTransformer3DModel",
        "attention_head_dim": 64, "num_attention_heads": 1, "num_layers": 1,
        "ffn_dim": 256, "freq_dim": 16, "text_dim": 16, "in_channels": 4, "out_channels": 4,
        "patch_size": [1, 2, 2], "eps": 1e-6, "qk_norm": "rms_norm_across_heads",
        "cross_attn_norm": true, "rope_max_seq_len": 32, "added_kv_proj_dim": null,
        "image_dim": null, "pos_embed_seq_len": null,
    });
    fs_err::write(path, config.to_string()).unwrap();
}

/// `run --model model` on the small model's inputs: the noise prediction's bytes.
fn small_forward(dir: &Path, model: &Path, out: &str) -> Vec<u8> {
    let (cfg, inputs) = (dir.join("config.json"), dir.join("inputs.safetensors"));
    ok(run(
        dir,
        &[
            "run",
            "--model",
            model.to_str().unwrap(),
            "--config",
            cfg.to_str().unwrap(),
            "--inputs",
            inputs.to_str().unwrap(),
            "--out",
            out,
        ],
    ));
    let f = SafetensorsFile::open(&dir.join(out)).unwrap();
    f.view("noise_pred").unwrap().bytes.to_vec()
}

/// The runner reads every quantized format through the same decoder as the pipeline, tensor
/// by tensor: its forward on each golden file is, bit for bit, its forward on that file's
/// decoding (which the tests above hold to the runtime's).
#[test]
fn runner_forwards_every_quantized_format_as_its_decoding() {
    let d = tmp();
    small_config(&d.path().join("config.json"));
    let mut rng = Rng::new(0x5EED_0041);
    let mut draw = |n: usize| (0..n).map(|_| rng.signed_f32()).collect::<Vec<f32>>();
    write_f32(
        &d.path().join("inputs.safetensors"),
        &[
            ("hidden_states", vec![1, 4, 1, 4, 4], draw(64)),
            ("timestep", vec![1], vec![500.0]),
            ("encoder_hidden_states", vec![1, 8, 16], draw(128)),
        ],
    );
    for file in [
        "comfy_nvfp4.safetensors",
        "comfy_mxfp8_e8m0.safetensors",
        "comfy_int8.safetensors",
        "comfy_fp8_header.safetensors",
        "lightx2v_int8.safetensors",
        "lightx2v_fp8.safetensors",
        "legacy_prefixed.safetensors",
        "plain_e5m2.safetensors",
        "gguf_orig_shape.gguf",
    ] {
        let decoded = convert_f32(d.path(), &quant_base(file), &format!("dec_{file}"));
        let got = small_forward(
            d.path(),
            &quant_base(file),
            &format!("q_{file}.safetensors"),
        );
        let want = small_forward(d.path(), &decoded, &format!("f_{file}.safetensors"));
        assert!(
            got == want,
            "{file}: the forward differs from its decoding's"
        );
    }
}
