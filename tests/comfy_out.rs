//! `--to comfy:*` and `--to lightx2v:*` through the real binary, against the files the
//! reference tools made from the same f32 weights (golden/quant_base: comfy-kitchen 0.2.40's
//! eager quantizers serialised by ComfyUI's `_quantized_weight_state_dict`, LightX2V's
//! `converter.py`; index.json holds every stored tensor's dtype, shape and sha256): every
//! tensor byte-identical, nothing more, the `_quantization_metadata` header agreeing with the
//! markers; merges equal the f32 merge converted; 1 and 3 threads identical; refusals write
//! nothing.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use serde_json::Value;
use sha2::{Digest, Sha256};
use wanbake::io::SafetensorsFile;

fn quant_base(name: &str) -> PathBuf {
    repo().join("golden/quant_base").join(name)
}

fn source() -> PathBuf {
    quant_base("source_f32_small.safetensors")
}

/// `(--to, golden file, extra flags)`: LightX2V's golden was converted with
/// `--non_linear_dtype torch.bfloat16`, so `--dtype bf16` (its default is f32).
const CASES: [(&str, &str, &[&str]); 6] = [
    ("comfy:fp8", "comfy_fp8.safetensors", &[]),
    ("comfy:nvfp4", "comfy_nvfp4.safetensors", &[]),
    ("comfy:mxfp8", "comfy_mxfp8.safetensors", &[]),
    ("comfy:int8", "comfy_int8.safetensors", &[]),
    (
        "lightx2v:int8",
        "lightx2v_int8.safetensors",
        &["--dtype", "bf16"],
    ),
    (
        "lightx2v:fp8",
        "lightx2v_fp8.safetensors",
        &["--dtype", "bf16"],
    ),
];

fn convert_to(dir: &Path, input: &Path, to: &str, extra: &[&str], threads: &str) -> PathBuf {
    let out = dir.join(format!("{}_{threads}", to.replace(':', "_")));
    let mut args = vec!["--threads", threads, "convert", input.to_str().unwrap()];
    args.extend(["--to", to, "--out", out.to_str().unwrap()]);
    args.extend_from_slice(extra);
    ok(run(dir, &args));
    out
}

fn sha256(b: &[u8]) -> String {
    Sha256::digest(b)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Every tensor of `want` (name → dtype, shape, sha256 of the stored bytes, as the golden
/// index.json files record them) is in `got` with the same dtype, shape and bytes, and `got`
/// holds nothing else.
fn assert_stored(got: &SafetensorsFile, want: &serde_json::Map<String, Value>, what: &str) {
    assert_eq!(got.infos().len(), want.len(), "{what}: tensor count");
    for (name, t) in want {
        let v = (got.view(name)).unwrap_or_else(|| panic!("{what}: {name} missing"));
        assert_eq!(v.dtype.as_str(), t["dtype"], "{what}: {name} dtype");
        let shape: Vec<usize> = serde_json::from_value(t["shape"].clone()).unwrap();
        assert_eq!(v.shape, shape.as_slice(), "{what}: {name} shape");
        assert_eq!(sha256(v.bytes), t["sha256"], "{what}: {name} bytes");
    }
}

/// [`assert_stored`] against a golden/quant_base file (index.json `stored`).
fn assert_stored_as_reference(got: &SafetensorsFile, golden: &str) {
    let index: Value =
        serde_json::from_slice(&fs_err::read(quant_base("index.json")).unwrap()).unwrap();
    let want = index["files"][golden]["stored"]["tensors"].as_object();
    assert_stored(got, want.unwrap(), golden);
}

/// A `comfy:*` file's header names exactly the layers that carry a `comfy_quant`, with the
/// same format, spelled as Python's `json.dumps`.
fn assert_header_agrees_with_markers(f: &SafetensorsFile, format: &str) {
    let header = f.metadata().get("_quantization_metadata").unwrap();
    let v: Value = serde_json::from_str(header).unwrap();
    assert_eq!(v["format_version"], "1.0");
    let layers = v["layers"].as_object().unwrap();
    let markers: Vec<String> = (f.infos().iter())
        .filter_map(|i| i.name.strip_suffix(".comfy_quant").map(String::from))
        .collect();
    assert_eq!(layers.len(), 10);
    assert_eq!(markers.len(), layers.len());
    for l in markers {
        let marker = f.view(&format!("{l}.comfy_quant")).unwrap().bytes;
        assert_eq!(marker, format!(r#"{{"format": "{format}"}}"#).as_bytes());
        assert_eq!(layers[&l]["format"], format, "{l}");
    }
    assert!(header.starts_with(r#"{"format_version": "1.0", "layers": {"blocks.0."#));
}

#[test]
fn every_format_is_byte_identical_to_its_reference_tool_on_1_and_3_threads() {
    let d = tmp();
    for (to, golden, extra) in CASES {
        let one = weights_in(&convert_to(d.path(), &source(), to, extra, "1"));
        let f = SafetensorsFile::open(&one).unwrap();
        assert_stored_as_reference(&f, golden);
        if let Some(format) = to.strip_prefix("comfy:") {
            let format = match format {
                "fp8" => "float8_e4m3fn",
                "int8" => "int8_tensorwise",
                other => other,
            };
            assert_header_agrees_with_markers(&f, format);
        } else {
            assert!(f.metadata().get("_quantization_metadata").is_none(), "{to}");
        }
        let three = weights_in(&convert_to(d.path(), &source(), to, extra, "3"));
        let same = fs_err::read(&one).unwrap() == fs_err::read(&three).unwrap();
        assert!(same, "{to}: 1 and 3 threads differ");
    }
}

/// LightX2V's default `--non_linear_dtype` is f32: without `--dtype` the tensors it does
/// not quantize are the source's f32 values; the quantized ones do not change.
#[test]
fn lightx2v_keeps_the_rest_in_f32_by_default_and_comfy_in_bf16() {
    let d = tmp();
    let src = SafetensorsFile::open(&source()).unwrap();
    for (to, plain) in [("lightx2v:int8", "F32"), ("comfy:int8", "BF16")] {
        let f = SafetensorsFile::open(&weights_in(&convert_to(d.path(), &source(), to, &[], "2")))
            .unwrap();
        let v = f.view("head.head.weight").unwrap();
        assert_eq!(v.dtype.as_str(), plain, "{to}");
        if plain == "F32" {
            assert_eq!(v.bytes, src.view("head.head.weight").unwrap().bytes);
        }
        assert_eq!(
            f.view("blocks.0.ffn.0.weight").unwrap().dtype.as_str(),
            "I8"
        );
    }
}

/// A LoRA merged with `--to` equals the f32 merge converted with `--to`, byte for byte
/// (the per-tensor-scale and swizzled formats assemble the merged tensor; the per-row ones
/// stream it).
#[test]
fn merge_to_is_the_f32_merge_converted() {
    let d = tmp();
    let lora = d.path().join("lora.safetensors");
    small_lora(
        &lora,
        0x5EED_0041,
        &[("self_attn.q", 64, 64), ("ffn.0", 256, 64)],
    );
    let base = source();
    let merge = |out: &str, extra: &[&str]| {
        let mut args = vec!["merge", "--base", base.to_str().unwrap()];
        args.extend([
            "--adapter",
            lora.to_str().unwrap(),
            "--out",
            out,
            "--device",
            "cpu",
        ]);
        args.extend_from_slice(extra);
        ok(run(d.path(), &args));
        d.path().join(out)
    };
    let f32_merge = weights_in(&merge("f32", &["--dtype", "f32"]));
    for (to, _, extra) in CASES {
        let name = to.replace(':', "_");
        let mut args = vec!["--to", to];
        args.extend_from_slice(extra);
        let merged = weights_in(&merge(&format!("m_{name}"), &args));
        let converted = weights_in(&convert_to(d.path(), &f32_merge, to, extra, "2"));
        let (a, b) = (
            fs_err::read(&merged).unwrap(),
            fs_err::read(&converted).unwrap(),
        );
        assert!(
            a == b,
            "{to}: merge --to differs from merge then convert --to"
        );
    }
}

/// The source with `name`'s values replaced by `f(index, value)`.
fn source_with(path: &Path, name: &str, f: impl Fn(usize, f32) -> f32) {
    source_plus(path, name, f, None);
}

/// [`source_with`], and `extra` added (values 0.5).
fn source_plus(
    path: &Path,
    name: &str,
    f: impl Fn(usize, f32) -> f32,
    extra: Option<(&str, Vec<usize>)>,
) {
    let src = SafetensorsFile::open(&source()).unwrap();
    let mut tensors: Vec<(String, Vec<usize>, Vec<f32>)> = (src.infos().iter())
        .map(|i| {
            let v = src.view(&i.name).unwrap();
            let mut x = v.to_f32().unwrap();
            if i.name == name {
                x = x.iter().enumerate().map(|(j, &y)| f(j, y)).collect();
            }
            (i.name.clone(), v.shape.to_vec(), x)
        })
        .collect();
    if let Some((n, shape)) = extra {
        let len = shape.iter().product();
        tensors.push((n.to_string(), shape, vec![0.5; len]));
    }
    let refs: Vec<(&str, Vec<usize>, Vec<f32>)> = (tensors.iter())
        .map(|(n, s, v)| (n.as_str(), s.clone(), v.clone()))
        .collect();
    write_f32(path, &refs);
}

/// One refusal per documented one (`quant::layer_format`): exit 1, the file, the key and the
/// reason named, nothing written.
#[test]
fn weights_the_reference_quantizers_turn_into_nan_are_refused_with_nothing_written() {
    let d = tmp();
    let key = "blocks.0.self_attn.k.weight";
    let zero = d.path().join("zero.safetensors");
    source_with(&zero, key, |_, _| 0.0);
    let tiny = d.path().join("tiny.safetensors");
    // one MXFP8 block (row 0, columns 0..32) whose max is below 448·2^-127
    source_with(&tiny, key, |j, x| if j < 32 { 1e-40 } else { x });
    let nan = d.path().join("nan.safetensors");
    source_with(&nan, key, |j, x| if j == 70 { f32::NAN } else { x });
    // an Animate face-encoder tensor: LightX2V's wan_dit converter deletes keys with "ca"
    let ca = d.path().join("ca.safetensors");
    let conv = "face_encoder.conv1_local.conv.weight";
    source_plus(&ca, key, |_, x| x, Some((conv, vec![64, 16, 3])));
    for (input, to, reason) in [
        (&zero, "comfy:fp8", "max |W| is 0"),
        (&zero, "comfy:nvfp4", "max |W| is 0"),
        (&tiny, "comfy:mxfp8", "is below 448·2^-127"),
        (&nan, "comfy:int8", "value NaN at element 70 is not finite"),
        (
            &nan,
            "lightx2v:fp8",
            "value NaN at element 70 is not finite",
        ),
        (&ca, "lightx2v:int8", "deletes every key containing \"ca\""),
    ] {
        let out = d.path().join("out");
        let args = [
            "convert",
            input.to_str().unwrap(),
            "--to",
            to,
            "--out",
            "out",
        ];
        let (code, _, stderr) = parts(&run(d.path(), &args));
        assert_eq!(code, 1, "{to}: {stderr}");
        let named = if input == &ca { conv } else { key };
        for needle in [input.to_str().unwrap(), named, reason] {
            assert!(stderr.contains(needle), "{to}: `{needle}` not in: {stderr}");
        }
        assert_eq!(
            stderr.matches(reason).count(),
            1,
            "{to}: said once: {stderr}"
        );
        assert!(!out.exists(), "{to}: wrote {}", out.display());
    }
    // the same files under formats that can hold them
    for (input, to) in [
        (&zero, "comfy:int8"),
        (&zero, "comfy:mxfp8"),
        (&tiny, "comfy:fp8"),
    ] {
        convert_to(d.path(), input, to, &[], "1");
    }
}

/// Real WAN shapes (1.3B, 2 blocks; T2V and I2V with `k_img` / `v_img`): `synth` then
/// `convert --to`, every stored tensor against the digests of the files comfy-kitchen and
/// LightX2V made from the same f32 weights (golden/comfy_out_golden.py, index.json).
#[test]
fn real_wan_shapes_are_byte_identical_to_the_reference_tools() {
    let index: Value =
        serde_json::from_slice(&fs_err::read(repo().join("golden/comfy_out/index.json")).unwrap())
            .unwrap();
    let synth: Vec<String> = serde_json::from_value(index["synth"].clone()).unwrap();
    let d = tmp();
    for (key, entry) in index["models"].as_object().unwrap() {
        let model = entry["model"].as_str().unwrap();
        let input = d.path().join(key);
        let mut args = vec!["synth", "--model", model, "--out", input.to_str().unwrap()];
        args.extend(synth.iter().map(String::as_str));
        ok(run(d.path(), &args));
        for (to, want) in entry["outputs"].as_object().unwrap() {
            let extra: &[&str] = if to.starts_with("lightx2v:") {
                &["--dtype", "bf16"]
            } else {
                &[]
            };
            let sub = d.path().join(format!("{key}_out"));
            fs_err::create_dir_all(&sub).unwrap();
            let out = convert_to(&sub, &input, to, extra, "2");
            let f = SafetensorsFile::open(&weights_in(&out)).unwrap();
            assert_stored(&f, want.as_object().unwrap(), &format!("{key} {to}"));
        }
    }
}

/// `comfy:int8-convrot` on real WAN shapes: the first and last rows of every block Linear
/// hold exactly the codes and scales of the exact rotation rule (golden/comfy_out_golden.py
/// computes it in Python integers and fractions, and records how comfy-kitchen's own,
/// BLAS-rounded, bytes compare: within one code of it), every other tensor is `comfy:int8`'s.
#[test]
fn convrot_on_real_wan_shapes_is_the_exact_rotation() {
    let index: Value =
        serde_json::from_slice(&fs_err::read(repo().join("golden/comfy_out/index.json")).unwrap())
            .unwrap();
    let synth: Vec<String> = serde_json::from_value(index["synth"].clone()).unwrap();
    let d = tmp();
    for (key, entry) in index["models"].as_object().unwrap() {
        let input = d.path().join(key);
        let model = entry["model"].as_str().unwrap();
        let mut args = vec!["synth", "--model", model, "--out", input.to_str().unwrap()];
        args.extend(synth.iter().map(String::as_str));
        ok(run(d.path(), &args));
        let sub = d.path().join(format!("{key}_out"));
        fs_err::create_dir_all(&sub).unwrap();
        let out = convert_to(&sub, &input, "comfy:int8-convrot", &[], "1");
        let f = SafetensorsFile::open(&weights_in(&out)).unwrap();
        let convrot = entry["convrot"].as_object().unwrap();
        let int8 = entry["outputs"]["comfy:int8"].as_object().unwrap();
        assert_eq!(f.infos().len(), int8.len(), "{key}: tensor count");
        for (name, t) in int8 {
            let layer = name.rsplit_once('.').map_or("", |p| p.0);
            if convrot.contains_key(&format!("{layer}.weight")) {
                continue; // the layer's own tensors: below
            }
            let v = f.view(name).unwrap();
            assert_eq!(sha256(v.bytes), t["sha256"], "{key}: {name}");
        }
        for (name, t) in convrot {
            let w = f.view(name).unwrap();
            let layer = name.strip_suffix(".weight").unwrap();
            let s = f.view(&format!("{layer}.weight_scale")).unwrap();
            assert_eq!(
                (w.dtype.as_str(), s.dtype.as_str()),
                ("I8", "F32"),
                "{key}: {name}"
            );
            assert_eq!(s.shape, [w.shape[0], 1], "{key}: {name}");
            let rows: Vec<usize> = serde_json::from_value(t["rows"].clone()).unwrap();
            let k = w.shape[1];
            let codes: Vec<u8> = rows
                .iter()
                .flat_map(|&r| w.bytes[r * k..][..k].to_vec())
                .collect();
            let scales: Vec<u8> = rows
                .iter()
                .flat_map(|&r| s.bytes[r * 4..][..4].to_vec())
                .collect();
            assert_eq!(sha256(&codes), t["codes_sha256"], "{key}: {name} codes");
            assert_eq!(sha256(&scales), t["scales_sha256"], "{key}: {name} scales");
            assert!(
                t["comfy_kitchen_max_code_diff"].as_u64().unwrap() <= 1,
                "{name}"
            );
            let marker = f.view(&format!("{layer}.comfy_quant")).unwrap().bytes;
            let want =
                r#"{"format": "int8_tensorwise", "convrot": true, "convrot_groupsize": 256}"#;
            assert_eq!(marker, want.as_bytes(), "{key}: {name}");
        }
        let header = f.metadata().get("_quantization_metadata").unwrap();
        let h: Value = serde_json::from_str(header).unwrap();
        for layer in convrot.keys().filter_map(|n| n.strip_suffix(".weight")) {
            assert_eq!(h["layers"][layer]["convrot"], true, "{key}: {layer}");
        }
        assert_eq!(
            h["layers"].as_object().unwrap().len(),
            convrot.len(),
            "{key}"
        );
    }
    // in_features not a multiple of 256 (the small model's 64): refused as comfy-kitchen
    // raises, nothing written
    let src = source();
    let args = [
        "convert",
        src.to_str().unwrap(),
        "--to",
        "comfy:int8-convrot",
        "--out",
        "o",
    ];
    let (code, _, stderr) = parts(&run(d.path(), &args));
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("is not a multiple of 256"), "{stderr}");
    assert!(!d.path().join("o").exists());
}

/// `bake` with `[output] to = "comfy:..." / "lightx2v:..."`: the tensors of `merge --to`,
/// the recipe in the header beside `_quantization_metadata`, and the runner's check runs on
/// the quantized file (its forward error against the unmerged f32 model is measured).
#[test]
fn bake_to_per_layer_formats_is_the_merge_and_runs_its_checks() {
    let d = tmp();
    let (base, adapter) = (
        repo().join("golden/models/t2v"),
        repo().join("golden/adapters/peft_plain"),
    );
    let inputs = repo().join("golden/runner/t2v__inputs.safetensors");
    // (not comfy:mxfp8: this toy's ffn dim 80 pads to 96, which wanbake's base reader, unlike
    // ComfyUI, takes for the logical shape; WAN's dims are whole MXFP8 blocks)
    for to in ["comfy:nvfp4", "comfy:fp8", "comfy:int8", "lightx2v:fp8"] {
        let name = to.replace(':', "_");
        let text = format!(
            "[base]\npath = \"{}\"\n\n[[adapter]]\npath = \"{}\"\n\n[output]\ndir = \"b_{name}\"\n\
             to = \"{to}\"\n\n[[check]]\nname = \"vs-unmerged\"\ninputs = \"{}\"\n\
             expected = \"unmerged\"\ntolerance = 0.5\n",
            base.display(),
            adapter.display(),
            inputs.display()
        );
        let recipe = d.path().join(format!("{name}.toml"));
        fs_err::write(&recipe, text).unwrap();
        ok(run(d.path(), &["bake", recipe.to_str().unwrap()]));
        let baked =
            SafetensorsFile::open(&weights_in(&d.path().join(format!("b_{name}")))).unwrap();
        let m = format!("m_{name}");
        let args = ["merge", "--base", base.to_str().unwrap(), "--adapter"];
        ok(run(
            d.path(),
            &[
                &args[..],
                &[adapter.to_str().unwrap(), "--to", to, "--out", &m],
            ]
            .concat(),
        ));
        let merged = SafetensorsFile::open(&weights_in(&d.path().join(&m))).unwrap();
        assert_eq!(baked.infos().len(), merged.infos().len(), "{to}");
        for i in merged.infos() {
            let (a, b) = (baked.view(&i.name).unwrap(), merged.view(&i.name).unwrap());
            assert!(a.bytes == b.bytes, "{to}: {}", i.name);
        }
        let meta = baked.metadata();
        assert!(meta.contains_key("wanbake.recipe"), "{to}");
        let header = meta.get("_quantization_metadata");
        assert_eq!(
            header,
            merged.metadata().get("_quantization_metadata"),
            "{to}"
        );
        assert_eq!(header.is_some(), to.starts_with("comfy:"), "{to}");
        let manifest: Value = serde_json::from_slice(
            &fs_err::read(d.path().join(format!("b_{name}/wanbake.manifest.json"))).unwrap(),
        )
        .unwrap();
        for c in manifest["checks"].as_array().unwrap() {
            assert_eq!(c["passed"], true, "{to}: {c}");
            assert!(c["max_abs_diff"].as_f64().unwrap() > 0.0, "{to}: {c}");
        }
        ok(run(d.path(), &["verify", &format!("b_{name}")]));
        ok(run(d.path(), &["inspect", &format!("b_{name}")]));
    }
}

/// The files the runtimes' own loaders read (golden/comfy_out_load.py: ComfyUI's
/// MixedPrecisionOps on comfy-kitchen's layouts, LightX2V's `weight * weight_scale`) to the
/// reference tools' values are the files the binary still writes: their sha256 is recorded
/// in golden/comfy_out/loaded.json with the loader's verdict.
#[test]
fn the_runtimes_loaders_read_these_very_files() {
    let text = fs_err::read_to_string(repo().join("golden/comfy_out/loaded.json")).unwrap();
    let loaded: Value = serde_json::from_str(&text).unwrap();
    let d = tmp();
    for (to, _, extra) in CASES {
        let entry = &loaded[to];
        assert_eq!(
            entry["differ"],
            serde_json::json!([]),
            "{to}: the loader disagreed"
        );
        let out = convert_to(d.path(), &source(), to, extra, "2");
        let bytes = fs_err::read(weights_in(&out)).unwrap();
        assert_eq!(
            sha256(&bytes),
            entry["file_sha256"].as_str().unwrap(),
            "{to}: not the file golden/comfy_out_load.py loaded"
        );
    }
}
