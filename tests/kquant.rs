//! The K-quant codecs (Q2_K … Q6_K) against ggml itself: golden/quant/kquant.safetensors holds
//! the bytes `ggml_quantize_chunk` (llama-cpp-python 0.3.36's libggml-base, no imatrix) wrote
//! for crafted super-blocks, 512 varied random ones and a seeded matrix, from the f32 values
//! and from their f16 rounding, and ggml's dequantization of them (golden/kquant_golden.py).

mod common;

use common::*;
use sha2::{Digest, Sha256};
use wanbake::codec::ggml::{self, GgmlType};
use wanbake::io::SafetensorsFile;

const TYPES: [(&str, GgmlType); 5] = [
    ("q2_k", GgmlType::Q2_K),
    ("q3_k", GgmlType::Q3_K),
    ("q4_k", GgmlType::Q4_K),
    ("q5_k", GgmlType::Q5_K),
    ("q6_k", GgmlType::Q6_K),
];

fn golden() -> SafetensorsFile {
    SafetensorsFile::open(&repo().join("golden/quant/kquant.safetensors")).expect("golden file")
}

fn digests() -> serde_json::Value {
    let text = fs_err::read_to_string(repo().join("golden/quant/kquant.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn bytes<'a>(f: &'a SafetensorsFile, name: &str) -> &'a [u8] {
    f.view(name)
        .unwrap_or_else(|| panic!("golden tensor {name}"))
        .bytes
}

/// The f16 rounding of `x` (RNE, numpy's `astype(float16)`), widened back.
fn f16_round(x: &[f32]) -> Vec<f32> {
    x.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect()
}

/// The golden inputs: (name, values).
fn inputs(f: &SafetensorsFile) -> Vec<(&'static str, Vec<f32>)> {
    let d = f.read_f32("diverse").unwrap();
    let m = f.read_f32("matrix").unwrap();
    vec![
        ("crafted", f.read_f32("crafted").unwrap()),
        ("crafted_f16", f.read_f32("crafted_f16").unwrap()),
        ("diverse_f16", f16_round(&d)),
        ("diverse", d),
        ("matrix_f16", f16_round(&m)),
        ("matrix", m),
    ]
}

fn sha256_f32(y: &[f32]) -> String {
    let mut h = Sha256::new();
    for v in y {
        h.update(v.to_le_bytes());
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Every input and type: our bytes are ggml's, block for block.
#[test]
fn kquant_bytes_are_ggmls() {
    let f = golden();
    let mut blocks = 0;
    for (input, x) in inputs(&f) {
        for (tname, ty) in TYPES {
            let want = bytes(&f, &format!("{input}|{tname}"));
            let got = ggml::quantize_vec(ty, &x).expect("whole super-blocks");
            assert_eq!(got.len(), want.len(), "{input}|{tname}: length");
            let ts = ty.type_size();
            let bad: Vec<usize> = got
                .chunks_exact(ts)
                .zip(want.chunks_exact(ts))
                .enumerate()
                .filter(|(_, (a, b))| a != b)
                .map(|(i, _)| i)
                .collect();
            if let Some(&blk) = bad.first() {
                let (a, b) = (&got[blk * ts..][..ts], &want[blk * ts..][..ts]);
                let at = a.iter().zip(b).position(|(p, q)| p != q).unwrap();
                panic!(
                    "{input}|{tname}: {} of {} blocks differ; first: block {blk}, byte {at}: \
                     ggml {:#04x}, ours {:#04x}\nggml {b:?}\nours {a:?}\ninput {:?}",
                    bad.len(),
                    got.len() / ts,
                    b[at],
                    a[at],
                    &x[blk * 256..(blk + 1) * 256]
                );
            }
            blocks += got.len() / ts;
        }
    }
    // 30 + 28 crafted blocks, 2 × 512 diverse and 2 × 2048 matrix blocks, for each type
    assert_eq!(blocks, 5 * (58 + 1024 + 4096), "blocks checked");
}

/// ggml's bytes decode to ggml's values, bit for bit: every value for the crafted inputs,
/// a sha256 over all of them for every input (gguf-py 0.19's dequantizer agreed with ggml's
/// on all of them when the goldens were made).
#[test]
fn kquant_dequantize_is_ggmls() {
    let f = golden();
    let sums = digests();
    for (input, x) in inputs(&f) {
        for (tname, ty) in TYPES {
            let key = format!("{input}|{tname}");
            let mut y = vec![0f32; x.len()];
            ggml::dequantize(ty, bytes(&f, &key), &mut y);
            if let Some(view) = f.view(&format!("{key}|deq")) {
                let want = f.read_f32(&format!("{key}|deq")).unwrap();
                assert_eq!(view.shape.iter().product::<usize>(), y.len(), "{key}");
                for (i, (a, b)) in y.iter().zip(&want).enumerate() {
                    assert_eq!(
                        a.to_bits(),
                        b.to_bits(),
                        "{key}: element {i} (block {}): ggml {b:e}, ours {a:e}",
                        i / 256
                    );
                }
            }
            assert_eq!(
                sums[format!("{key}|deq_sha256")].as_str(),
                Some(sha256_f32(&y).as_str()),
                "{key}: dequantized values differ from ggml's"
            );
        }
    }
}

/// The crafted inputs cover what they claim: some blocks with all-zero bytes, f16 scales that
/// underflow and overflow, and both signs of the f16 rounding of an input.
#[test]
fn crafted_inputs_reach_the_edge_cases() {
    let f = golden();
    let x = f.read_f32("crafted").unwrap();
    let rows = x.len() / 256;
    assert!(rows >= 30, "{rows} crafted blocks");
    // ggml writes d = +inf for the 1e8 block in Q4_K (max_scale/63 overflows f16)
    let q = bytes(&f, "crafted|q4_k");
    let infs = q
        .chunks_exact(144)
        .filter(|b| u16::from_le_bytes([b[0], b[1]]) == 0x7C00)
        .count();
    assert!(infs >= 1, "no Q4_K block with an infinite d");
    // and d = -0.0 (0x8000) for Q6_K of values near 1e-8
    let q = bytes(&f, "crafted|q6_k");
    let negz = q
        .chunks_exact(210)
        .filter(|b| u16::from_le_bytes([b[208], b[209]]) == 0x8000)
        .count();
    assert!(negz >= 1, "no Q6_K block with d = -0.0");
}

/// Encodes a (5120, 13824) f32 matrix (a 14B WAN FFN weight's shape) to each K-quant on one
/// thread and prints the input rate and a digest of the bytes (bench/kquant_ggml_time.py
/// prints ggml's for the same matrix, written to `$KQUANT_SPEED_DUMP` when set); numbers go to
/// BENCHMARKS.md, nothing is asserted.
#[test]
#[ignore = "timing only: cargo test --release --test kquant -- --ignored --nocapture"]
fn kquant_speed_5120x13824() {
    let (r, c) = (5120usize, 13824usize);
    let mut s = 0x9E37_79B9_7F4A_7C15u64;
    let x: Vec<f32> = (0..r * c)
        .map(|_| {
            // xorshift64*, a sum of two uniforms: cheap, non-degenerate blocks
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            let u = s.wrapping_mul(0x2545_F491_4F6C_DD1D);
            let a = (u >> 40) as f32 / (1u64 << 24) as f32;
            let b = ((u >> 16) & 0xFF_FFFF) as f32 / (1u64 << 24) as f32;
            (a + b - 1.0) * 0.03
        })
        .collect();
    if let Ok(path) = std::env::var("KQUANT_SPEED_DUMP") {
        // the same matrix for bench/kquant_ggml_time.py (ggml's side), f32 little endian
        let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(path, bytes).unwrap();
    }
    let mb = (x.len() * 4) as f64 / 1e6;
    for (tname, ty) in TYPES {
        let mut out = vec![0u8; ty.byte_len(x.len()).unwrap()];
        let (wall, cpu) = (std::time::Instant::now(), thread_cpu_s());
        ggml::quantize(ty, &x, &mut out);
        let (wall, cpu) = (wall.elapsed().as_secs_f64(), thread_cpu_s() - cpu);
        let sha: String = Sha256::digest(&out)[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        println!(
            "{tname}: {cpu:.2} s CPU ({wall:.2} s wall) for {mb:.0} MB of f32: {:.1} MB/s \
             ({:.1} ns/element) of CPU time, one thread; bytes sha256 {sha}",
            mb / cpu,
            cpu * 1e9 / x.len() as f64
        );
        std::hint::black_box(&out);
    }
}

/// CPU time of the calling thread in seconds (utime + stime from /proc, 10 ms ticks), so the
/// figure means something on a shared machine.
fn thread_cpu_s() -> f64 {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|x| x.parse::<i64>().ok()).unwrap_or(0);
    (tick(11) + tick(12)) as f64 / 100.0
}

// ---- `convert --to gguf:<k-mix>` on a small WAN whose Linear rows are whole 256-blocks,
// against the files ggml, gguf-py and city96's rules (re-implemented from lcpp.patch in
// golden/kquant_wan_golden.py) make from the same weights. The weights are not committed: both
// sides draw them from SplitMix64 in sorted name order (golden/quant/kquant_wan.json, "model").

#[test]
fn convert_to_k_mixes_is_byte_identical_to_ggml_and_city96s_rules() {
    let text = fs_err::read_to_string(repo().join("golden/quant/kquant_wan.json")).unwrap();
    let golden: serde_json::Value = serde_json::from_str(&text).unwrap();
    let d = tmp();
    let model = d.path().join("small_wan.safetensors");
    write_small_wan(&model, &golden["model"]);
    let cases = golden["cases"].as_object().unwrap();
    assert_eq!(cases.len(), 12, "every K mix, and two with each option");
    for (i, (case, want)) in cases.iter().enumerate() {
        let mut words = case.split(' ');
        let to = words.next().unwrap();
        let out = d.path().join(format!("out{i}"));
        let mut args = vec!["convert", model.to_str().unwrap(), "--to", to];
        args.extend(words);
        args.extend(["--out", out.to_str().unwrap()]);
        ok(run(d.path(), &args));
        let file = out.join(format!("model-{}.gguf", to.trim_start_matches("gguf:")));
        let bytes = fs_err::read(&file).unwrap();
        let sha = wanbake::io::digest::hex(&Sha256::digest(&bytes));
        if sha == want["sha256"].as_str().unwrap() {
            // The second check: wanbake's dequantization (the runner's, the report's) of
            // every tensor has the bits gguf-py's `dequantize` gives.
            let g = wanbake::io::gguf::GgufFile::open(&file).unwrap();
            for (j, t) in g.header().tensors.iter().enumerate() {
                let w = &want["tensors"][&t.name]["f32_sha256"];
                assert_eq!(
                    sha256_f32(&g.read_f32(j)),
                    w.as_str().unwrap(),
                    "{case}: {}",
                    t.name
                );
            }
            continue;
        }
        // Say which tensor differs first.
        let g = wanbake::io::gguf::GgufFile::open(&file).unwrap();
        for (j, t) in g.header().tensors.iter().enumerate() {
            let w = &want["tensors"][&t.name];
            assert_eq!(
                t.ty.name(),
                w["type"].as_str().unwrap(),
                "{case}: {}",
                t.name
            );
            let got = wanbake::io::digest::hex(&Sha256::digest(g.data(j)));
            assert_eq!(
                got,
                w["sha256"].as_str().unwrap(),
                "{case}: {} bytes",
                t.name
            );
        }
        panic!(
            "{case}: every tensor matches, the file does not ({} bytes, want {})",
            bytes.len(),
            want["bytes"]
        );
    }
}

/// `merge --to gguf:<k-mix>` is one pass and writes exactly the bytes of the reference path:
/// merge in f32 (original-Wan layout, nothing rounded), then `convert --to` that f32 release
/// (whose K-quant bytes `convert_to_k_mixes_is_byte_identical_to_ggml_and_city96s_rules`
/// holds to ggml). The LoRA (ComfyUI names) touches v projections and ffn down, the tensors
/// the mixes treat apart; on 1 and 3 threads, with and without `--dtype f32`.
#[test]
fn merge_to_k_mixes_is_merge_f32_then_convert() {
    let text = fs_err::read_to_string(repo().join("golden/quant/kquant_wan.json")).unwrap();
    let golden: serde_json::Value = serde_json::from_str(&text).unwrap();
    let d = tmp();
    let base = d.path().join("small_wan.safetensors");
    write_small_wan(&base, &golden["model"]);
    let lora = d.path().join("lora.safetensors");
    let mut rng = Rng::new(29);
    let mut t: Vec<(String, Vec<usize>, Vec<f32>)> = Vec::new();
    for b in 0..3 {
        for (m, (out, inp)) in [
            ("self_attn.v", (256, 256)),
            ("cross_attn.q", (256, 256)),
            ("ffn.2", (256, 512)),
        ] {
            let k = format!("diffusion_model.blocks.{b}.{m}");
            let down = (0..4 * inp).map(|_| rng.signed_f32() * 0.05).collect();
            let up = (0..out * 4).map(|_| rng.signed_f32() * 0.05).collect();
            t.push((format!("{k}.lora_down.weight"), vec![4, inp], down));
            t.push((format!("{k}.lora_up.weight"), vec![out, 4], up));
        }
    }
    let refs: Vec<(&str, Vec<usize>, Vec<f32>)> = (t.iter())
        .map(|(n, s, v)| (n.as_str(), s.clone(), v.clone()))
        .collect();
    write_f32(&lora, &refs);
    let (base_s, lora_s) = (base.to_str().unwrap(), lora.to_str().unwrap());
    ok(run(
        d.path(),
        &[
            "merge",
            "--base",
            base_s,
            "--adapter",
            lora_s,
            "--dtype",
            "f32",
            "--layout",
            "wan",
            "--keep-f32",
            "none",
            "--out",
            "f32",
            "--device",
            "cpu",
        ],
    ));
    for (to, extra) in [
        ("gguf:q4_k_m", &[][..]),
        ("gguf:q3_k_m", &["--dtype", "f32"][..]),
        ("gguf:q2_k", &["--city96-rounding"][..]),
    ] {
        let file = format!("model-{}.gguf", to.trim_start_matches("gguf:"));
        let reference = d.path().join(format!("ref_{}", to.replace(':', "_")));
        let mut args = vec!["convert", "f32", "--to", to, "--out"];
        args.push(reference.to_str().unwrap());
        args.extend_from_slice(extra);
        ok(run(d.path(), &args));
        let want = fs_err::read(reference.join(&file)).unwrap();
        for threads in ["1", "3"] {
            let out = d
                .path()
                .join(format!("one_{}_{threads}", to.replace(':', "_")));
            let mut args = vec![
                "--threads",
                threads,
                "merge",
                "--base",
                base_s,
                "--adapter",
                lora_s,
                "--to",
                to,
                "--out",
                out.to_str().unwrap(),
                "--device",
                "cpu",
            ];
            args.extend_from_slice(extra);
            ok(run(d.path(), &args));
            let got = fs_err::read(out.join(&file)).unwrap();
            assert!(
                got == want,
                "{to} {extra:?} on {threads} threads: bytes differ"
            );
        }
    }
}

/// city96/ComfyUI-GGUF's own loader (`gguf_sd_loader` + `dequantize_tensor` at float32, commit
/// 795e451) loaded wanbake's file of one mix per K type (golden/kquant_wan_golden.py
/// `comfy-loader`, golden/quant/kquant_comfy_loader.json): the same file today, every tensor
/// in the loader's shape, and wanbake's dequantization (the bundled runner's) bit-equal to the
/// values ComfyUI computes with.
#[test]
fn comfyui_gguf_loads_each_k_type_as_wanbake_dequantizes_it() {
    let text = fs_err::read_to_string(repo().join("golden/quant/kquant_wan.json")).unwrap();
    let golden: serde_json::Value = serde_json::from_str(&text).unwrap();
    let text = fs_err::read_to_string(repo().join("golden/quant/kquant_comfy_loader.json"));
    let comfy: serde_json::Value = serde_json::from_str(&text.unwrap()).unwrap();
    let d = tmp();
    let model = d.path().join("small_wan.safetensors");
    write_small_wan(&model, &golden["model"]);
    let mut kinds = std::collections::BTreeSet::new();
    for (to, want) in comfy["files"].as_object().unwrap() {
        assert_eq!(want["arch"], "wan", "{to}");
        let out = d.path().join(to.replace(':', "_"));
        let args = [
            "convert",
            model.to_str().unwrap(),
            "--to",
            to,
            "--out",
            out.to_str().unwrap(),
        ];
        ok(run(d.path(), &args));
        let file = out.join(format!("model-{}.gguf", to.trim_start_matches("gguf:")));
        let sha = wanbake::io::digest::hex(&Sha256::digest(fs_err::read(&file).unwrap()));
        assert_eq!(
            sha,
            want["sha256"].as_str().unwrap(),
            "{to}: not the file ComfyUI loaded"
        );
        let shown = ok(run(d.path(), &["inspect", file.to_str().unwrap()]));
        assert!(
            shown.contains(&format!("(llama.cpp's ftype of --to {to})")),
            "{shown}"
        );
        let g = wanbake::io::gguf::GgufFile::open(&file).unwrap();
        let tensors = want["tensors"].as_object().unwrap();
        assert_eq!(tensors.len(), g.header().tensors.len(), "{to}");
        for (j, t) in g.header().tensors.iter().enumerate() {
            let w = &tensors[&t.name];
            let shape = wanbake::format::gguf::torch_shape(&t.ne);
            let want_shape: Vec<usize> = serde_json::from_value(w["shape"].clone()).unwrap();
            assert_eq!(shape, want_shape, "{to}: {}", t.name);
            assert_eq!(t.ty.name(), w["type"].as_str().unwrap(), "{to}: {}", t.name);
            assert_eq!(w["same_as_gguf_py"], true, "{to}: {}", t.name);
            let got = sha256_f32(&g.read_f32(j));
            assert_eq!(got, w["f32_sha256"].as_str().unwrap(), "{to}: {}", t.name);
            kinds.insert(t.ty.name());
        }
    }
    for k in ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"] {
        assert!(kinds.contains(k), "no {k} tensor loaded");
    }
}

/// A `bake` to a K mix with an `unmerged` check runs the bundled runner on the K-quant file
/// (dequantized as gguf-py and ComfyUI-GGUF do, held above) against the f32 weights, so the
/// check measures what each mix costs in activations: nonzero, and Q2_K's cost above Q6_K's
/// and Q8_0's.
#[test]
fn bake_check_measures_what_a_k_mix_costs() {
    let text = fs_err::read_to_string(repo().join("golden/quant/kquant_wan.json")).unwrap();
    let golden: serde_json::Value = serde_json::from_str(&text).unwrap();
    let d = tmp();
    let base = d.path().join("base");
    fs_err::create_dir_all(&base).unwrap();
    write_small_wan(&base.join("small_wan.safetensors"), &golden["model"]);
    let config = r#"{"_class_name": "WanTransformer3DModel", "patch_size": [1, 2, 2],
        "num_attention_heads": 2, "attention_head_dim": 128, "in_channels": 4,
        "out_channels": 4, "text_dim": 256, "freq_dim": 256, "ffn_dim": 512, "num_layers": 3,
        "cross_attn_norm": true, "qk_norm": "rms_norm_across_heads", "eps": 1e-6,
        "image_dim": null, "added_kv_proj_dim": null, "rope_max_seq_len": 1024}"#;
    fs_err::write(base.join("config.json"), config).unwrap();
    let mut rng = Rng::new(31);
    let mut draw = |n: usize| (0..n).map(|_| rng.signed_f32()).collect::<Vec<f32>>();
    let inputs = [
        ("hidden_states", vec![1, 4, 1, 8, 8], draw(256)),
        ("timestep", vec![1], vec![500.0]),
        ("encoder_hidden_states", vec![1, 8, 256], draw(2048)),
    ];
    write_f32(&d.path().join("inputs.safetensors"), &inputs);
    let mut max_diff = std::collections::BTreeMap::new();
    for mix in ["q2_k", "q4_k_m", "q6_k", "q8_0"] {
        let recipe = format!(
            "[base]\npath = \"base\"\n[output]\ndir = \"out-{mix}\"\nto = \"gguf:{mix}\"\n\
             [[check]]\nname = \"cost\"\ninputs = \"inputs.safetensors\"\n\
             expected = \"unmerged\"\ntolerance = 10.0\n"
        );
        fs_err::write(d.path().join(format!("{mix}.toml")), recipe).unwrap();
        let out = ok(run(d.path(), &["bake", &format!("{mix}.toml")]));
        let line = out
            .lines()
            .find(|l| l.contains("check cost: passed"))
            .unwrap();
        let diff: f64 = (line.split("max |diff| ").nth(1).unwrap())
            .split(',')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!(diff > 0.0, "{mix}: {line}");
        max_diff.insert(mix, diff);
    }
    assert!(max_diff["q2_k"] > max_diff["q6_k"], "{max_diff:?}");
    assert!(max_diff["q6_k"] > max_diff["q8_0"], "{max_diff:?}");
    assert!(max_diff["q4_k_m"] > max_diff["q8_0"], "{max_diff:?}");
}
