//! Issue 45: no number passes silently broken. Every producing command checks each tensor
//! as it writes it, for NaN and ±inf in its input and for finite values its output cannot
//! hold (above 65504 in f16, a GGUF block whose f16 scale overflows), and refuses them
//! (exit 1, nothing written) naming the file, the tensor, the first index and value, the
//! count and where they came from (the base, an adapter's own tensor, or the merge and
//! which adapter), with the way out; `--allow-nonfinite` (a recipe's `allow_nonfinite`)
//! writes them and lists them in the manifest's report. The real binary on small inputs
//! built from the tiny WAN 2.1 T2V fixture in temp dirs.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use wanbake::io::SafetensorsFile;

/// The tiny T2V diffusers folder's weights file.
const WEIGHTS: &str = "diffusion_pytorch_model.safetensors";
/// A 2-D weight the adapters below target (`blocks.0.self_attn.q` in ComfyUI's names).
const Q: &str = "blocks.0.attn1.to_q.weight";
/// A 2-D weight no adapter below targets.
const K: &str = "blocks.0.attn1.to_k.weight";
/// A 1-D tensor (kept high precision by every quantized format).
const NORM: &str = "blocks.0.norm2.weight";

/// A copy of the tiny WAN 2.1 T2V diffusers folder (config.json and f32 weights) named
/// `name`, with `(tensor, flat index, value)` set.
fn base_with(dir: &Path, name: &str, edits: &[(&str, usize, f32)]) -> PathBuf {
    let src = repo().join("golden/models/t2v");
    let dst = dir.join(name);
    std::fs::create_dir_all(&dst).unwrap();
    std::fs::copy(src.join("config.json"), dst.join("config.json")).unwrap();
    let f = SafetensorsFile::open(&src.join(WEIGHTS)).unwrap();
    let mut tensors: Vec<(String, Vec<usize>, Vec<f32>)> = (f.infos().iter())
        .map(|i| {
            (
                i.name.clone(),
                i.shape.clone(),
                f.read_f32(&i.name).unwrap(),
            )
        })
        .collect();
    for &(tensor, index, value) in edits {
        let t = tensors.iter_mut().find(|t| t.0 == tensor).unwrap();
        t.2[index] = value;
    }
    let refs: Vec<(&str, Vec<usize>, Vec<f32>)> = (tensors.iter())
        .map(|(n, s, v)| (n.as_str(), s.clone(), v.clone()))
        .collect();
    write_f32(&dst.join(WEIGHTS), &refs);
    dst
}

/// A rank-1 ComfyUI LoRA on `module` (`blocks.0.self_attn.q`, ...) with every `lora_down`
/// value `down` and every `lora_up` value `up` (no alpha: σ = 1), so its delta is
/// `down · up` everywhere.
fn lora(dir: &Path, name: &str, module: &str, down: f32, up: f32) -> PathBuf {
    let p = dir.join(name);
    let key = format!("diffusion_model.{module}");
    write_f32(
        &p,
        &[
            (
                &format!("{key}.lora_down.weight"),
                vec![1, 32],
                vec![down; 32],
            ),
            (&format!("{key}.lora_up.weight"), vec![32, 1], vec![up; 32]),
        ],
    );
    p
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Runs wanbake in `dir`: (exit code, stdout, stderr).
fn wanbake(dir: &Path, args: &[&str]) -> (i32, String, String) {
    parts(&run(dir, args))
}

/// Asserts a refusal: exit code 1, every phrase of `want` in stderr, no output at `out`.
#[track_caller]
fn refused(dir: &Path, args: &[&str], out: &Path, want: &[&str]) -> String {
    let (code, stdout, err) = wanbake(dir, args);
    assert_eq!(code, 1, "{args:?}\n--- stdout\n{stdout}\n--- stderr\n{err}");
    for w in want {
        assert!(err.contains(w), "{args:?}: `{w}` missing from:\n{err}");
    }
    assert!(!out.exists(), "{args:?} left {}", out.display());
    err
}

/// The manifest's report of a release.
fn report(out: &Path) -> serde_json::Value {
    let m = std::fs::read(out.join("wanbake.manifest.json")).unwrap();
    serde_json::from_slice::<serde_json::Value>(&m).unwrap()["report"].clone()
}

/// The values of `tensor` in the one weights file of `out` (written as bf16/f16/f32).
fn values(out: &Path, tensor: &str) -> Vec<f32> {
    let file = std::fs::read_dir(out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .unwrap();
    SafetensorsFile::open(&file)
        .unwrap()
        .read_f32(tensor)
        .unwrap()
}

// r_issue_45: a finite f32 above 65504 became `inf` in an f16 output, exit 0.
#[test]
fn r_issue_45_f16_overflow_is_refused_in_convert_and_merge() {
    let d = tmp();
    let dir = d.path();
    let big = base_with(dir, "big", &[(Q, 5, 70000.0), (Q, 9, -70000.0)]);
    let out = dir.join("o");
    // convert: the base's own value, named where it is
    let err = refused(
        dir,
        &["convert", s(&big), "--dtype", "f16", "--out", s(&out)],
        &out,
        &[
            WEIGHTS,
            Q,
            "element 5 is 70000, which F16 cannot hold (its largest finite value is 65504)",
            "2 values of this tensor",
            "comes from the input, not from an adapter",
            "--dtype bf16",
            "--allow-nonfinite",
        ],
    );
    assert!(err.contains("nothing was written"), "{err}");
    // the way out it names
    ok(run(
        dir,
        &["convert", s(&big), "--dtype", "bf16", "--out", s(&out)],
    ));
    std::fs::remove_dir_all(&out).unwrap();

    // merge, a small adapter on the same tensor: still the base's value
    let small = lora(dir, "small.safetensors", "blocks.0.self_attn.q", 0.01, 0.01);
    let merge = |base: &Path, adapter: &str, dtype: &str| {
        vec![
            "merge".to_string(),
            "--base".into(),
            s(base).into(),
            "--adapter".into(),
            adapter.into(),
            "--dtype".into(),
            dtype.into(),
            "--out".into(),
            s(&out).into(),
            "--device".into(),
            "cpu".into(),
        ]
    };
    let args = merge(&big, s(&small), "f16");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    refused(
        dir,
        &args,
        &out,
        &[
            Q,
            "merged element 5 (row 0, column 5) is 70000",
            "which F16 cannot hold",
            "2 values of this tensor",
            "comes from the input, not from an adapter",
            "--dtype bf16",
        ],
    );
    // an untouched tensor of a merge
    let big_k = base_with(dir, "big_k", &[(K, 3, 1e5)]);
    let args = merge(&big_k, s(&small), "f16");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    refused(dir, &args, &out, &[K, "element 3 is 100000", "1 value of"]);

    // a finite base the merge takes past 65504: the adapter and its strength are named
    let t2v = repo().join("golden/models/t2v");
    let ones = lora(dir, "ones.safetensors", "blocks.0.self_attn.q", 1.0, 1.0);
    let strong = format!("{}:70000", s(&ones));
    let args = merge(&t2v, &strong, "f16");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    refused(
        dir,
        &args,
        &out,
        &[
            Q,
            "merged element 0 (row 0, column 0)",
            "1,024 values of this tensor",
            "comes from the merge: adapter",
            "ones.safetensors at strength 70000, not from the base",
            "lower the strength of --adapter",
            "--dtype bf16",
        ],
    );
    let args = merge(&t2v, &strong, "bf16");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    ok(run(dir, &args));
}

/// Every kind of output refuses a NaN (with ±inf beside it) stored in the base, copied,
/// converted, restacked, encoded or left untouched by a merge alike.
#[test]
fn r_issue_45_nan_and_inf_in_a_base_are_refused_for_every_output_kind() {
    let d = tmp();
    let dir = d.path();
    let nan = base_with(
        dir,
        "nan",
        &[
            (K, 7, f32::NAN),
            (K, 8, f32::INFINITY),
            (K, 40, -f32::INFINITY),
        ],
    );
    let inf = base_with(dir, "inf", &[(NORM, 1, f32::INFINITY)]);
    let other = lora(dir, "other.safetensors", "blocks.0.self_attn.q", 0.01, 0.01);
    let out = dir.join("o");
    let o = s(&out);
    let kinds: Vec<Vec<&str>> = vec![
        vec!["convert", "--dtype", "bf16"],
        vec!["convert", "--dtype", "f16"],
        // f32 into f32: copied byte for byte, checked all the same
        vec!["convert", "--dtype", "f32"],
        vec!["convert", "--to", "fp8-scaled"],
        vec!["convert", "--to", "gguf:q8_0"],
        vec!["convert", "--to", "gguf:q4_k_m"],
        vec!["convert", "--to", "gguf:f16"],
        vec!["convert", "--to", "orbax"],
        // kept f32 and transposed into NNX kernels
        vec!["restack", "--to", "nnx-scanned"],
        vec!["restack", "--to", "wan", "--dtype", "bf16"],
        vec!["merge", "--dtype", "bf16"],
        vec!["merge", "--dtype", "keep"],
        vec!["merge", "--to", "fp8-scaled"],
        vec!["merge", "--to", "gguf:q8_0"],
        vec!["merge", "--to", "orbax"],
    ];
    for kind in &kinds {
        for (base, tensor, first, value, count) in [
            (&nan, K, 7, "NaN", "3 values of this tensor"),
            (&inf, NORM, 1, "inf", "1 value of this tensor"),
        ] {
            let mut args = vec![kind[0]];
            match kind[0] {
                "merge" => args.extend(["--base", s(base), "--adapter", s(&other)]),
                _ => args.push(s(base)),
            }
            args.extend(&kind[1..]);
            args.extend(["--out", o]);
            let err = refused(
                dir,
                &args,
                &out,
                &[
                    WEIGHTS,
                    tensor,
                    &format!("element {first} is {value}, non-finite"),
                    count,
                    "comes from the input, not from an adapter",
                    "itself holds it",
                    "--allow-nonfinite",
                ],
            );
            assert!(!err.contains("Lower the strength"), "{args:?}: {err}");
        }
    }
}

// r_issue_45: a NaN in the base, merged, was blamed on the adapter ("Lower the strength or
// check the adapter").
#[test]
fn r_issue_45_a_nan_in_the_merged_base_tensor_is_blamed_on_the_base() {
    let d = tmp();
    let dir = d.path();
    let nan = base_with(dir, "nan", &[(Q, 33, f32::NAN)]);
    let on_q = lora(dir, "q.safetensors", "blocks.0.self_attn.q", 0.1, 0.1);
    let out = dir.join("o");
    for dtype in ["bf16", "f32"] {
        let err = refused(
            dir,
            &[
                "merge",
                "--base",
                s(&nan),
                "--adapter",
                s(&on_q),
                "--dtype",
                dtype,
                "--out",
                s(&out),
            ],
            &out,
            &[
                Q,
                "merged element 33 (row 1, column 1) is NaN",
                "1 value of this tensor",
                "comes from the input, not from an adapter",
            ],
        );
        assert!(
            !err.contains("Lower the strength") && !err.contains("lower the strength"),
            "{err}"
        );
    }
}

/// A NaN in an adapter's own tensor is refused naming the adapter, its key and the count;
/// finite factors whose product overflows name the adapter as the merge's origin; with
/// --allow-nonfinite the merge writes what the sum gives and the report lists it.
#[test]
fn r_issue_45_a_nan_from_an_adapter() {
    let d = tmp();
    let dir = d.path();
    let t2v = repo().join("golden/models/t2v");
    let nan = lora(
        dir,
        "nan.safetensors",
        "blocks.0.self_attn.q",
        f32::NAN,
        1.0,
    );
    let huge = lora(dir, "huge.safetensors", "blocks.0.self_attn.q", 3e38, 3e38);
    let out = dir.join("o");
    let merge = |adapter: &Path, extra: &[&str]| -> Vec<String> {
        let mut a: Vec<String> = ["merge", "--base", s(&t2v), "--adapter", s(adapter)]
            .iter()
            .map(|x| x.to_string())
            .collect();
        a.extend(["--dtype", "bf16", "--out", s(&out)].map(String::from));
        a.extend(extra.iter().map(|x| x.to_string()));
        a
    };
    let args = merge(&nan, &[]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    refused(
        dir,
        &args,
        &out,
        &[
            "nan.safetensors",
            "diffusion_model.blocks.0.self_attn.q.lora_down.weight",
            "element 0 is NaN",
            "32 values of this tensor are NaN or infinite",
            "in the adapter's own tensor",
            "re-export it, or leave the adapter out",
            "--allow-nonfinite",
        ],
    );
    let args = merge(&huge, &[]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    refused(
        dir,
        &args,
        &out,
        &[
            Q,
            "merged element 0 (row 0, column 0) is inf, non-finite",
            "1,024 values",
            "huge.safetensors at strength 1, not from the base",
            "lower the strength of --adapter",
        ],
    );

    // allowed: written as the sum gives them, listed with their origin
    let args = merge(&nan, &["--allow-nonfinite"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    ok(run(dir, &args));
    let r = report(&out);
    let listed = r["nonfinite"].as_array().expect("a nonfinite list");
    assert_eq!(listed.len(), 1, "{r:#}");
    let e = &listed[0];
    assert_eq!(e["tensor"], Q);
    assert_eq!(
        (e["first"].as_u64(), e["count"].as_u64()),
        (Some(0), Some(1024))
    );
    assert_eq!(e["value"], "NaN");
    assert_eq!(e["into"], "BF16");
    let origin = e["origin"].as_str().unwrap();
    assert!(origin.contains("the merge: adapter") && origin.contains("nan.safetensors"));
    assert!(values(&out, Q).iter().all(|x| x.is_nan()));
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("wanbake.manifest.json")).unwrap()).unwrap();
    assert_eq!(m["options"]["allow_nonfinite"], true);
    ok(run(dir, &["verify", s(&out)]));
}

/// `--allow-nonfinite` (recipe: `allow_nonfinite = true` in [output]) writes the values as
/// the output rounds them and lists each tensor in the manifest's report; a run without
/// them writes the manifest it always wrote (no `nonfinite`, no `allow_nonfinite`).
#[test]
fn r_issue_45_allow_nonfinite_writes_and_lists_them() {
    let d = tmp();
    let dir = d.path();
    let big = base_with(
        dir,
        "big",
        &[(Q, 5, 70000.0), (Q, 9, -70000.0), (K, 2, f32::NAN)],
    );
    let out = dir.join("o");
    ok(run(
        dir,
        &[
            "convert",
            s(&big),
            "--dtype",
            "f16",
            "--out",
            s(&out),
            "--allow-nonfinite",
        ],
    ));
    let v = values(&out, Q);
    assert_eq!((v[5], v[9]), (f32::INFINITY, f32::NEG_INFINITY));
    assert!(values(&out, K)[2].is_nan());
    let r = report(&out);
    let listed = r["nonfinite"].as_array().expect("a nonfinite list");
    // in output tensor order, whatever the thread count
    let names: Vec<&str> = listed
        .iter()
        .map(|e| e["tensor"].as_str().unwrap())
        .collect();
    assert_eq!(names, [K, Q]);
    assert_eq!(listed[1]["first"], 5);
    assert_eq!(listed[1]["count"], 2);
    assert_eq!(listed[1]["value"], "70000");
    assert_eq!(listed[1]["into"], "F16");
    assert_eq!(listed[1]["origin"], "the base");
    assert!(listed[1]["file"].as_str().unwrap().ends_with(WEIGHTS));
    ok(run(dir, &["verify", s(&out)]));

    // without the values, nothing of this is recorded
    let clean = dir.join("clean");
    let t2v = repo().join("golden/models/t2v");
    ok(run(
        dir,
        &["convert", s(&t2v), "--dtype", "f16", "--out", s(&clean)],
    ));
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(clean.join("wanbake.manifest.json")).unwrap())
            .unwrap();
    assert!(m["report"].get("nonfinite").is_none(), "{m:#}");
    assert!(m["options"].get("allow_nonfinite").is_none(), "{m:#}");

    // bake: refused, with the recipe's keys as the ways out; then allowed by one
    let big = base_with(dir, "big_q", &[(Q, 5, 70000.0)]);
    let lora_path = lora(dir, "l.safetensors", "blocks.0.self_attn.v", 0.01, 0.01);
    let recipe = |allow: bool| {
        let p = dir.join("r.toml");
        let text = format!(
            "[base]\npath = \"{}\"\n[[adapter]]\npath = \"{}\"\n[output]\ndir = \"baked\"\n\
             dtype = \"f16\"\n{}",
            s(&big),
            s(&lora_path),
            if allow {
                "allow_nonfinite = true\n"
            } else {
                ""
            }
        );
        std::fs::write(&p, text).unwrap();
        p
    };
    let baked = dir.join("baked");
    refused(
        dir,
        &["bake", s(&recipe(false))],
        &baked,
        &[
            "set `allow_nonfinite = true` in [output]",
            "dtype = \"bf16\"",
        ],
    );
    ok(run(dir, &["bake", s(&recipe(true))]));
    let r = report(&baked);
    assert_eq!(r["nonfinite"].as_array().map(Vec::len), Some(1), "{r:#}");
    assert_eq!(r["nonfinite"][0]["tensor"], Q, "{r:#}");
}

// r_issue_45: a finite value a GGUF block type cannot hold (its f16 scale overflows)
// was written as an infinite scale, exit 0.
#[test]
fn r_issue_45_a_gguf_block_scale_that_overflows_is_refused() {
    let d = tmp();
    let dir = d.path();
    let big = base_with(dir, "big", &[(Q, 5, 1e10)]);
    let out = dir.join("o");
    refused(
        dir,
        &["convert", s(&big), "--to", "gguf:q8_0", "--out", s(&out)],
        &out,
        &[
            Q,
            "element 5 is 10000000000, which GGUF Q8_0 (its F16 block scale) cannot hold",
            "32 values of this tensor",
            "--to fp8-scaled",
            "--allow-nonfinite",
        ],
    );
    // a per-tensor scale holds it
    ok(run(
        dir,
        &["convert", s(&big), "--to", "fp8-scaled", "--out", s(&out)],
    ));
}

/// `resize` and `extract` check the tensors they write as `--dtype` rounds them.
#[test]
fn r_issue_45_resize_and_extract_check_what_they_write() {
    let d = tmp();
    let dir = d.path();
    let big = lora(dir, "big.safetensors", "blocks.0.self_attn.q", 0.5, 70000.0);
    let out = dir.join("o");
    let resize = |dtype: &'static str| {
        vec![
            "resize",
            s(&big),
            "--rank",
            "4",
            "--dtype",
            dtype,
            "--out",
            s(&out),
        ]
    };
    refused(
        dir,
        &resize("f16"),
        &out,
        &[
            "big.safetensors",
            "lora_up.weight",
            "element 0 is 70000, which F16 cannot hold",
            "32 values",
            "--dtype bf16",
        ],
    );
    ok(run(dir, &resize("bf16")));
    std::fs::remove_dir_all(&out).unwrap();

    let t2v = repo().join("golden/models/t2v");
    let tuned = base_with(dir, "tuned", &[(NORM, 0, 70000.0)]);
    let extract = |dtype: &'static str| {
        vec![
            "extract",
            "--base",
            s(&t2v),
            "--tuned",
            s(&tuned),
            "--rank",
            "2",
            "--dtype",
            dtype,
            "--out",
            s(&out),
        ]
    };
    refused(
        dir,
        &extract("f16"),
        &out,
        &[
            "tuned: diffusion_model.blocks.0.norm3.diff: element 0 is 69999",
            "which F16 cannot hold",
            "1 value of this tensor",
        ],
    );
    ok(run(dir, &extract("bf16")));
}

/// The whole-tensor route (the CUDA program, here on the CPU reference backend, and on CUDA
/// itself when a device opens) refuses what the band route refuses, names the same first
/// value, count and origin, and with the values allowed writes the same bytes and report.
#[test]
fn r_issue_45_every_merge_route_finds_the_same_values() {
    use wanbake::adapter::{AdapterSpec, bind_specs};
    use wanbake::layout::OutputDType;
    use wanbake::merge::{MergeOptions, Merging, merge_release};
    use wanbake::pipeline::{Compute, NonFinite, OutputChoices, OutputOptions};
    use wanbake::release::staging::Replace;

    let d = tmp();
    let dir = d.path();
    let nan = base_with(dir, "nan", &[(Q, 33, f32::NAN), (Q, 40, f32::INFINITY)]);
    let t2v = repo().join("golden/models/t2v");
    let ones = lora(dir, "ones.safetensors", "blocks.0.self_attn.q", 1.0, 1.0);
    let mut routes = vec![Compute::Cpu, Compute::Reference];
    match wanbake::gpu::CudaDevice::open(0) {
        Ok(device) => routes.push(Compute::Cuda(device)),
        Err(e) => eprintln!("no CUDA route in this test: {e}"),
    }
    let cases = [
        (
            &nan,
            "0.1",
            OutputDType::BF16,
            "merged element 33 (row 1, column 1) is NaN",
        ),
        (
            &nan,
            "0.1",
            OutputDType::F32,
            "merged element 33 (row 1, column 1) is NaN",
        ),
        (
            &t2v,
            "70000",
            OutputDType::F16,
            "at strength 70000, not from the base",
        ),
    ];
    for (n, (base, strength, dtype, want)) in cases.into_iter().enumerate() {
        let model = wanbake::quant::base::open(base).unwrap();
        let spec = AdapterSpec::parse(&format!("{}:{strength}", s(&ones))).unwrap();
        let adapters = bind_specs(&[spec], &model, false).unwrap();
        for allow in [false, true] {
            let output = OutputOptions::new(OutputChoices {
                dtype,
                nonfinite: NonFinite::allowed(allow),
                ..OutputChoices::default()
            })
            .unwrap();
            let mut written = Vec::new();
            for compute in &routes {
                let case = format!("{} {strength} {dtype:?} {}", compute.label(), allow);
                let merging = Merging {
                    options: MergeOptions::default(),
                    compute,
                    svd_cache: None,
                };
                let dest = dir.join(format!("out-{n}-{}-{allow}", compute.label()));
                let r = merge_release(&model, &adapters, &output, &merging, &dest, Replace::Never);
                match (allow, r) {
                    (false, Err(e)) => {
                        let msg = wanbake::error_text::Chain(&e).to_string();
                        assert!(msg.contains(want), "{case}: {msg}");
                        assert!(!dest.exists(), "{case}");
                    }
                    (true, Ok(_)) => {
                        let bytes = std::fs::read(dest.join(WEIGHTS)).unwrap();
                        written.push((case, bytes, report(&dest)["nonfinite"].clone()));
                    }
                    (_, other) => panic!("{case}: {other:?}"),
                }
            }
            for w in written.windows(2) {
                assert_eq!(
                    w[0].1, w[1].1,
                    "{} and {} wrote different bytes",
                    w[0].0, w[1].0
                );
                assert_eq!(w[0].2, w[1].2, "{} and {}: reports differ", w[0].0, w[1].0);
            }
        }
    }
}

/// The scans' rates on one thread, for BENCHMARKS.md ("Checking what an output holds");
/// nothing is asserted. `all_held` is the merged band's check (it replaced an `is_finite`
/// fold of the same shape, timed beside it), `all_finite_bytes` the check of every band
/// copied or converted.
#[test]
#[ignore = "timing only: cargo test --release --test nonfinite -- --ignored --nocapture"]
fn scan_rates() {
    use std::hint::black_box;
    use std::time::Instant;
    use wanbake::codec::dtype::{all_finite_bytes, all_held, held_limit, vectorized};
    use wanbake::io::DType;
    // 1 MiB bands (a merge band: 2^18 f32) and 8 MiB bands (a copy band), 2 GiB in all
    let f32s: Vec<f32> = (0..1usize << 18).map(|i| (i as f32).sin()).collect();
    let bytes: Vec<u8> = (0..8usize << 20).map(|i| (i % 251) as u8 & 0x3F).collect();
    let rate = |what: &str, band: usize, f: &dyn Fn() -> bool| {
        let reps = (2usize << 30) / band;
        let t = Instant::now();
        let mut ok = true;
        for _ in 0..reps {
            ok &= black_box(f());
        }
        let s = t.elapsed().as_secs_f64();
        println!("{what}: {:.1} GB/s ({ok})", (reps * band) as f64 / s / 1e9);
    };
    let limit = held_limit(DType::BF16);
    rate("all_held f32 band (merge)", 4 << 18, &|| {
        all_held(black_box(&f32s), limit)
    });
    rate("is_finite fold f32 band (before)", 4 << 18, &|| {
        let v = black_box(&f32s);
        vectorized(|| v.iter().fold(true, |ok, x| ok & x.is_finite()))
    });
    for dt in [DType::BF16, DType::F16, DType::F32] {
        let name = format!("all_finite_bytes {dt} 8 MiB band (copy)");
        rate(&name, 8 << 20, &|| all_finite_bytes(dt, black_box(&bytes)));
    }
}

/// Scaled fp8 saturates by design (`|W / scale| > 448` is written as ±448): not an error,
/// counted per tensor in the report and in `verify --json`. With the scale `max|W| / 448`
/// only a `max|W|` whose division rounds up past 448 does; 1.0000057 is one.
#[test]
fn r_issue_45_fp8_saturation_is_counted_not_refused() {
    let d = tmp();
    let dir = d.path();
    let base = base_with(dir, "sat", &[(Q, 3, 1.000_005_7), (Q, 700, -1.000_005_7)]);
    let out = dir.join("o");
    let stdout = ok(run(
        dir,
        &[
            "convert",
            s(&base),
            "--to",
            "fp8-scaled",
            "--out",
            s(&out),
            "--json",
        ],
    ));
    let json: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let q = &json["report"]["quantization"];
    assert_eq!(
        q["tensors"]["blocks.0.self_attn.q.weight"]["saturated"], 2,
        "{q:#}"
    );
    assert_eq!(
        q["tensors"]["blocks.0.self_attn.k.weight"]["saturated"], 0,
        "{q:#}"
    );
    // the fixture's own weights have a few such maxima too (3)
    assert_eq!(q["summary"]["F8_E4M3"]["saturated"], 5, "{q:#}");
    assert!(
        q["tensors"]["blocks.0.norm3.weight"]
            .get("saturated")
            .is_none()
    );
    assert!(json["report"].get("nonfinite").is_none());
    let v: serde_json::Value =
        serde_json::from_str(&ok(run(dir, &["verify", s(&out), "--json"]))).unwrap();
    assert_eq!(v["result"], "verified");
    assert_eq!(v["values"]["saturated"]["blocks.0.self_attn.q.weight"], 2);
    assert!(v["values"].get("nonfinite").is_none());
}
