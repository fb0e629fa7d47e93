//! `wanbake extract` and `wanbake resize` (issue 15), driven through the real binary against
//! the numpy float64 SVD oracle in `golden/extract/` (golden/extract_golden.py): merge-back at
//! a covering rank, the truncation at lower ranks, the ranks `--energy` and `--budget` pick,
//! resize at strength 1 and 0.5, the adapters route, and every refusal (nothing written).

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::{ok, parts, repo, run, tmp};
use serde_json::Value;

type Tensors = BTreeMap<String, (Vec<usize>, Vec<f64>)>;

fn golden(rel: &str) -> PathBuf {
    repo().join("golden").join(rel)
}

fn base() -> String {
    golden("models/t2v_original.safetensors")
        .display()
        .to_string()
}

fn tuned() -> String {
    golden("extract/tuned.safetensors").display().to_string()
}

fn expect() -> Value {
    let text = std::fs::read_to_string(golden("extract/expect.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// Every tensor of a safetensors file, widened to f64 (the reference reader).
fn read(path: &Path) -> Tensors {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut out = BTreeMap::new();
    for name in st.names() {
        let t = st.tensor(name).unwrap();
        assert_eq!(t.dtype(), safetensors::Dtype::F32, "{name}");
        let v = t
            .data()
            .chunks_exact(4)
            .map(|c| f64::from(f32::from_le_bytes(c.try_into().unwrap())))
            .collect();
        out.insert(name.to_string(), (t.shape().to_vec(), v));
    }
    out
}

/// The one weights file of a release folder.
fn weights(dir: &Path) -> PathBuf {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    assert_eq!(v.len(), 1, "{}: {v:?}", dir.display());
    v.remove(0)
}

fn norm(v: &[f64]) -> f64 {
    v.iter().map(|x| x * x).sum::<f64>().sqrt()
}

/// ‖a − b‖ / ‖b‖ (or ‖a‖ when b is 0).
fn rel(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    let d: Vec<f64> = a.iter().zip(b).map(|(x, y)| x - y).collect();
    norm(&d) / norm(b).max(1e-300)
}

/// B·A of a ComfyUI module, times α/r.
fn product(t: &Tensors, module: &str) -> Vec<f64> {
    let (ds, down) = &t[&format!("diffusion_model.{module}.lora_down.weight")];
    let (us, up) = &t[&format!("diffusion_model.{module}.lora_up.weight")];
    let (r, inp, out) = (ds[0], ds[1], us[0]);
    assert_eq!(us[1], r, "{module}: up {us:?} down {ds:?}");
    let s = t
        .get(&format!("diffusion_model.{module}.alpha"))
        .map_or(1.0, |(_, a)| a[0] / r as f64);
    let mut p = vec![0.0; out * inp];
    for i in 0..out {
        for k in 0..r {
            for j in 0..inp {
                p[i * inp + j] += s * up[i * r + k] * down[k * inp + j];
            }
        }
    }
    p
}

fn extract_json(dir: &Path, out: &str, extra: &[&str]) -> Value {
    let (b, t) = (base(), tuned());
    let mut args = vec![
        "extract", "--base", &b, "--tuned", &t, "--out", out, "--json",
    ];
    args.extend_from_slice(extra);
    serde_json::from_str(&ok(run(dir, &args))).unwrap()
}

fn lora_modules(report: &Value) -> BTreeMap<String, &Value> {
    report["modules"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["kind"] == "lora")
        .map(|m| (m["name"].as_str().unwrap().to_string(), m))
        .collect()
}

/// Merges `adapter` into the golden base at `strength` with f32 output.
fn merged(dir: &Path, adapter: &Path, strength: &str, out: &str) -> Tensors {
    let spec = format!("{}:{strength}", adapter.display());
    let b = base();
    ok(run(
        dir,
        &[
            "merge",
            "--base",
            &b,
            "--adapter",
            &spec,
            "--dtype",
            "f32",
            "--out",
            out,
            "-q",
        ],
    ));
    read(&weights(&dir.join(out)))
}

#[test]
fn covering_rank_merges_back_to_the_tuned_model() {
    let dir = tmp();
    let report = extract_json(dir.path(), "lora", &["--rank", "8"]);
    let exp = expect();
    let modules = lora_modules(&report);
    let expected: Vec<&String> = exp["modules"].as_object().unwrap().keys().collect();
    assert_eq!(modules.keys().collect::<Vec<_>>(), expected);
    let diffs = report["modules"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["kind"] != "lora");
    assert_eq!(
        diffs.clone().count(),
        exp["diffs"].as_object().unwrap().len()
    );
    assert!(
        diffs
            .clone()
            .all(|m| m.get("rank").is_none() && m.get("energy").is_none())
    );
    let m = merged(
        dir.path(),
        &weights(&dir.path().join("lora")),
        "1",
        "merged",
    );
    let t = read(Path::new(&tuned()));
    assert_eq!(m.keys().collect::<Vec<_>>(), t.keys().collect::<Vec<_>>());
    for (name, (_, want)) in &t {
        let e = rel(&m[name].1, want);
        assert!(e < 1e-5, "{name}: merged back {e:e} from the tuned weight");
    }
}

/// The `--device` values that run here: `cpu`, and `cuda` when a device is present (the SVDs
/// then run on cuBLAS and cuSOLVER, `gpu::CudaEngine`).
fn svd_routes() -> Vec<&'static str> {
    match wanbake::gpu::probe() {
        Ok(_) => vec!["cpu", "cuda"],
        Err(e) => {
            eprintln!("no CUDA route in this test: {e}");
            vec!["cpu"]
        }
    }
}

#[test]
fn lower_ranks_reproduce_the_reference_truncation() {
    let dir = tmp();
    let trunc = read(&golden("extract/expect_trunc.safetensors"));
    let exp = expect();
    for (device, r) in svd_routes()
        .into_iter()
        .flat_map(|d| ["1", "2", "4", "8"].map(|r| (d, r)))
    {
        let out = format!("{device}-r{r}");
        let report = extract_json(dir.path(), &out, &["--rank", r, "--device", device]);
        assert_eq!(
            report["device"]["used"], device,
            "the report names the route"
        );
        let lora = read(&weights(&dir.path().join(&out)));
        for (name, m) in lora_modules(&report) {
            let want = &exp["modules"][&name]["ranks"][r];
            assert_eq!(m["rank"], want["rank"], "{name} at --rank {r}");
            for key in ["energy", "rel_error"] {
                let (a, b) = (m[key].as_f64().unwrap(), want[key].as_f64().unwrap());
                assert!(
                    (a - b).abs() < 1e-6,
                    "{name} {key} at --rank {r}: {a} vs {b}"
                );
            }
            let alpha = &lora[&format!("diffusion_model.{name}.alpha")].1;
            assert_eq!(alpha[0], want["rank"].as_f64().unwrap(), "{name}: α = r");
            if let Some((_, p)) = trunc.get(&format!("r{r}.{name}.weight")) {
                let e = rel(&product(&lora, &name), p);
                assert!(
                    e < 1e-6,
                    "{name} rank {r}: B·A is {e:e} from the truncation"
                );
            }
        }
    }
}

#[test]
fn energy_picks_the_reference_ranks() {
    let dir = tmp();
    let exp = expect();
    for f in ["0.9", "0.99", "0.999"] {
        let report = extract_json(dir.path(), &format!("e{f}"), &["--energy", f]);
        for (name, m) in lora_modules(&report) {
            let want = &exp["modules"][&name]["energy_rank"][f];
            assert_eq!(&m["rank"], want, "{name} at --energy {f}");
            assert!(m["energy"].as_f64().unwrap() >= f.parse::<f64>().unwrap());
        }
    }
    // --rank caps --energy.
    let report = extract_json(dir.path(), "capped", &["--energy", "0.999", "--rank", "2"]);
    assert!(
        lora_modules(&report)
            .values()
            .all(|m| m["rank"].as_u64().unwrap() <= 2)
    );
}

/// `budget_ranks` of golden/extract_golden.py, written out the same plain way: at each step,
/// over the modules whose next rank still fits, the largest next σ² (ties: the first name),
/// on numpy's full float64 spectra from golden/extract/expect.json.
fn reference_budget_ranks(exp: &Value, budget: u64) -> BTreeMap<String, u64> {
    reference_budget_ranks_in(exp, budget, 4)
}

/// [`reference_budget_ranks`] with factors of `elem` bytes an element (`--dtype`); the
/// `.alpha` scalar stays 4 bytes.
fn reference_budget_ranks_in(exp: &Value, mut budget: u64, elem: u64) -> BTreeMap<String, u64> {
    let modules = exp["modules"].as_object().unwrap();
    let mut ranks: BTreeMap<String, u64> = modules.keys().map(|n| (n.clone(), 0)).collect();
    let mut stopped = std::collections::BTreeSet::new();
    loop {
        let mut best: Option<(f64, &String)> = None;
        for (n, m) in modules {
            let s = m["singular_values"].as_array().unwrap();
            let r = ranks[n] as usize;
            if stopped.contains(n) || r >= s.len() {
                continue;
            }
            let g = s[r].as_f64().unwrap().powi(2);
            if best.is_none_or(|(b, _)| g > b) {
                best = Some((g, n));
            }
        }
        let Some((_, n)) = best else { return ranks };
        let shape = modules[n]["shape"].as_array().unwrap();
        let (out, inp) = (shape[0].as_u64().unwrap(), shape[1].as_u64().unwrap());
        let cost = (out + inp) * elem + if ranks[n] == 0 { 4 } else { 0 };
        if cost > budget {
            stopped.insert(n.clone());
            continue;
        }
        budget -= cost;
        *ranks.get_mut(n).unwrap() += 1;
    }
}

#[test]
fn large_budgets_allocate_as_over_the_full_spectra() {
    // The first pass computes only a module's top few singular values and asks for more of
    // any module the allocation would give all of them; budgets this large give several
    // modules ranks past that first guess (up to their full rank), and the picks must still
    // be the allocation over the full spectra.
    let dir = tmp();
    let exp = expect();
    let fixed = exp["fixed_bytes"].as_u64().unwrap();
    for bytes in [60_000u64, 400_000] {
        let want = reference_budget_ranks(&exp, bytes - fixed);
        assert!(
            want.values().any(|&r| r > 8),
            "the budget exercises the expansion"
        );
        let report = extract_json(
            dir.path(),
            &format!("big{bytes}"),
            &["--budget", &bytes.to_string()],
        );
        let got = lora_modules(&report);
        for (name, r) in want {
            let found = got.get(&name).map_or(0, |m| m["rank"].as_u64().unwrap());
            assert_eq!(found, r, "{name} at --budget {bytes}");
        }
    }
}

#[test]
fn budget_allocates_by_largest_marginal_energy() {
    let dir = tmp();
    let exp = expect();
    for (bytes, ranks) in exp["budgets"].as_object().unwrap() {
        let report = extract_json(dir.path(), &format!("b{bytes}"), &["--budget", bytes]);
        let got = lora_modules(&report);
        for (name, want) in ranks.as_object().unwrap() {
            match got.get(name) {
                Some(m) => assert_eq!(&m["rank"], want, "{name} at --budget {bytes}"),
                None => assert_eq!(want, 0, "{name} at --budget {bytes}"),
            }
        }
        let left = report["left_out"].as_array().unwrap();
        let zero = ranks
            .as_object()
            .unwrap()
            .values()
            .filter(|v| *v == 0)
            .count();
        assert_eq!(left.len(), zero, "{left:?}");
        assert!(report["tensor_bytes"].as_u64().unwrap() <= bytes.parse::<u64>().unwrap());
    }
}

#[test]
fn a_diffusers_base_pairs_with_an_original_wan_tuned_model() {
    let dir = tmp();
    let b = golden("models/t2v").display().to_string();
    let t = tuned();
    let args = [
        "extract", "--base", &b, "--tuned", &t, "--rank", "4", "--out", "x", "--json",
    ];
    let report: Value = serde_json::from_str(&ok(run(dir.path(), &args))).unwrap();
    let same = extract_json(dir.path(), "y", &["--rank", "4"]);
    assert_eq!(report["modules"], same["modules"]);
    let (x, y) = (
        std::fs::read(weights(&dir.path().join("x"))).unwrap(),
        std::fs::read(weights(&dir.path().join("y"))).unwrap(),
    );
    assert_eq!(x, y, "the same adapter whatever the base's layout");
    // And from MaxDiffusion's scanned NNX layout (stacked (L, ...) kernels, transposed).
    let g = golden("models/t2v").display().to_string();
    ok(run(
        dir.path(),
        &[
            "restack",
            &g,
            "--to",
            "nnx-scanned",
            "--dtype",
            "f32",
            "--out",
            "nnx",
            "-q",
        ],
    ));
    let args = [
        "extract", "--base", "nnx", "--tuned", &t, "--rank", "4", "--out", "z", "-q",
    ];
    ok(run(dir.path(), &args));
    let z = std::fs::read(weights(&dir.path().join("z"))).unwrap();
    assert_eq!(z, y, "the same adapter from an nnx-scanned base");
}

#[test]
fn output_bytes_do_not_depend_on_the_thread_count() {
    let dir = tmp();
    let (b, t) = (base(), tuned());
    for n in ["1", "2"] {
        let out = format!("t{n}");
        ok(run(
            dir.path(),
            &[
                "--threads",
                n,
                "extract",
                "--base",
                &b,
                "--tuned",
                &t,
                "--energy",
                "0.99",
                "--out",
                &out,
                "-q",
            ],
        ));
    }
    let one = std::fs::read(weights(&dir.path().join("t1"))).unwrap();
    let two = std::fs::read(weights(&dir.path().join("t2"))).unwrap();
    assert_eq!(one, two);
}

#[test]
fn peft_linear_only_leaves_the_full_differences_out() {
    let dir = tmp();
    let report = extract_json(
        dir.path(),
        "peft",
        &["--rank", "8", "--to", "peft", "--linear-only"],
    );
    let left = report["left_out"].as_array().unwrap();
    assert_eq!(left.len(), expect()["diffs"].as_object().unwrap().len());
    assert!(dir.path().join("peft/adapter_config.json").is_file());
    // Merged back, the Linear weights are the tuned ones and the rest stay the base's.
    let m = merged(dir.path(), &dir.path().join("peft"), "1", "merged");
    let (t, b) = (read(Path::new(&tuned())), read(Path::new(&base())));
    let exp = expect();
    for (name, (_, got)) in &m {
        let module = name.trim_end_matches(".weight");
        let want = if exp["modules"].get(module).is_some() && name.ends_with(".weight") {
            &t[name].1
        } else {
            &b[name].1
        };
        assert!(rel(got, want) < 1e-5, "{name}");
    }
}

#[test]
fn refusals_write_nothing() {
    let dir = tmp();
    let (b, t) = (base(), tuned());
    let i2v = golden("models/i2v_original.safetensors")
        .display()
        .to_string();
    let cases: [(&[&str], &str); 4] = [
        (
            &[
                "extract", "--base", &b, "--tuned", &b, "--rank", "4", "--out", "o",
            ],
            "nothing differs",
        ),
        (
            &[
                "extract", "--base", &b, "--tuned", &i2v, "--rank", "4", "--out", "o",
            ],
            "are not the same model",
        ),
        (
            &[
                "extract", "--base", &b, "--tuned", &t, "--rank", "4", "--to", "peft", "--out", "o",
            ],
            "patch_embedding.weight",
        ),
        (
            &[
                "extract", "--base", &b, "--tuned", &t, "--energy", "1.5", "--out", "o",
            ],
            "--energy must be in (0, 1]",
        ),
    ];
    for (args, needle) in cases {
        let (code, _, err) = parts(&run(dir.path(), args));
        assert_ne!(code, 0, "{args:?}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(!dir.path().join("o").exists(), "{args:?} wrote output");
        assert_eq!(common::tree(dir.path()), Vec::<String>::new(), "{args:?}");
    }
    // The mismatch names a parameter and which side holds it.
    let (_, _, err) = parts(&run(
        dir.path(),
        &[
            "extract", "--base", &b, "--tuned", &i2v, "--rank", "4", "--out", "o",
        ],
    ));
    assert!(
        err.contains("in the tuned model only") || err.contains("shape"),
        "{err}"
    );
    // `--device cuda` is checked whichever the tuned side is, as every command checks it.
    if wanbake::gpu::CudaDevice::open(0).is_err() {
        let (code, _, err) = parts(&run(
            dir.path(),
            &[
                "extract", "--base", &b, "--tuned", &t, "--rank", "4", "--out", "o", "--device",
                "cuda",
            ],
        ));
        assert_eq!(code, 1, "{err}");
        assert!(err.contains("CUDA is unavailable"), "{err}");
        assert!(!dir.path().join("o").exists());
    }
}

#[test]
fn resize_reproduces_the_truncated_product_at_two_strengths() {
    let dir = tmp();
    let lora = golden("extract/resize_lora.safetensors");
    let l = lora.display().to_string();
    let text = std::fs::read_to_string(golden("extract/expect_resize.json")).unwrap();
    let exp: Value = serde_json::from_str(&text).unwrap();
    let report: Value = serde_json::from_str(&ok(run(
        dir.path(),
        &["resize", &l, "--rank", "3", "--out", "small", "--json"],
    )))
    .unwrap();
    let out = weights(&dir.path().join("small"));
    assert_eq!(
        out.file_name(),
        lora.file_name(),
        "same file name, same convention"
    );
    let got = read(&out);
    let want = read(&golden("extract/expect_resize.safetensors"));
    let input = read(&lora);
    for m in lora_modules(&report).values() {
        let name = m["name"].as_str().unwrap();
        let e = &exp["modules"][name];
        assert_eq!(m["rank"], e["rank"], "{name}");
        assert_eq!(m["rank_in"], e["rank_in"], "{name}");
        for key in ["energy", "rel_error"] {
            let (a, b) = (m[key].as_f64().unwrap(), e[key].as_f64().unwrap());
            assert!((a - b).abs() < 1e-9, "{name} {key}: {a} vs {b}");
        }
        let p = product(&got, name);
        assert!(rel(&p, &want[&format!("trunc.{name}")].1) < 1e-6, "{name}");
        if e["rank_in"].as_u64() <= Some(3) {
            for s in ["lora_down.weight", "lora_up.weight", "alpha"] {
                let k = format!("diffusion_model.{name}.{s}");
                assert_eq!(got[&k], input[&k], "{k} unchanged");
            }
        }
    }
    for key in input
        .keys()
        .filter(|k| k.ends_with(".diff") || k.ends_with(".diff_b"))
    {
        assert_eq!(got[key], input[key], "{key} unchanged");
    }
    for s in ["1", "0.5"] {
        let m = merged(dir.path(), &out, s, &format!("m{s}"));
        for (k, (_, w)) in want
            .iter()
            .filter(|(k, _)| k.starts_with(&format!("s{s}.")))
        {
            let name = &k[s.len() + 2..];
            assert!(rel(&m[name].1, w) < 1e-5, "{name} at strength {s}");
        }
    }
    // --energy picks the reference's ranks (capped by each module's own rank).
    let report: Value = serde_json::from_str(&ok(run(
        dir.path(),
        &[
            "resize", &l, "--energy", "0.95", "--out", "energy", "--json",
        ],
    )))
    .unwrap();
    for m in lora_modules(&report).values() {
        let name = m["name"].as_str().unwrap();
        assert_eq!(m["rank"], exp["modules"][name]["energy_rank"], "{name}");
    }
}

#[test]
fn adapters_become_one_plain_lora() {
    // tuned = base + the resize fixture, merged by the merge engine: its rank-3 extraction
    // is the same truncation resize computes from the factors.
    let dir = tmp();
    let b = base();
    let l = golden("extract/resize_lora.safetensors")
        .display()
        .to_string();
    let args = [
        "extract",
        "--base",
        &b,
        "--adapter",
        &l,
        "--rank",
        "3",
        "--out",
        "x",
        "--json",
    ];
    let report: Value = serde_json::from_str(&ok(run(dir.path(), &args))).unwrap();
    let got = read(&weights(&dir.path().join("x")));
    let want = read(&golden("extract/expect_resize.safetensors"));
    for name in lora_modules(&report).keys() {
        let e = rel(&product(&got, name), &want[&format!("trunc.{name}")].1);
        assert!(e < 1e-5, "{name}: {e:e}");
    }
    let input = read(Path::new(&l));
    for key in input.keys().filter(|k| k.contains(".diff")) {
        assert!(rel(&got[key].1, &input[key].1) < 1e-5, "{key}");
    }
    assert_eq!(
        common::tree(dir.path()),
        vec!["x", "x/lora.safetensors", "x/wanbake.manifest.json"],
        "the intermediate merge is removed"
    );
}

#[test]
fn a_bake_check_sees_the_activation_error_of_an_extracted_adapter() {
    // Issue 15 item 4 with what bake already has: the tuned model's own forward
    // (`wanbake run`) is the expected output of a [[check]] on base + extracted adapter.
    // At a covering rank the forward matches; at rank 1 the check fails and says by how much.
    let dir = tmp();
    let config = golden("models/t2v/config.json").display().to_string();
    let inputs = golden("runner/t2v__inputs.safetensors")
        .display()
        .to_string();
    let t = tuned();
    ok(run(
        dir.path(),
        &[
            "run",
            "--model",
            &t,
            "--config",
            &config,
            "--inputs",
            &inputs,
            "--out",
            "tuned_forward.safetensors",
            "-q",
        ],
    ));
    for (rank, passes) in [("8", true), ("1", false)] {
        let out = format!("r{rank}");
        extract_json(dir.path(), &out, &["--rank", rank]);
        let recipe = format!(
            "[base]\npath = {:?}\n[[adapter]]\npath = \"{out}/lora.safetensors\"\n\
             [output]\ndir = \"baked{rank}\"\ndtype = \"f32\"\n[[check]]\n\
             name = \"extracted-vs-tuned\"\ninputs = {inputs:?}\n\
             expected = \"tuned_forward.safetensors\"\ntolerance = 1e-4\n",
            golden("models/t2v").display().to_string()
        );
        let path = dir.path().join(format!("bake{rank}.toml"));
        std::fs::write(&path, recipe).unwrap();
        let (code, stdout, err) = parts(&run(dir.path(), &["bake", path.to_str().unwrap()]));
        let verdict = if passes { "passed" } else { "FAILED" };
        assert!(
            stdout.contains(&format!("check extracted-vs-tuned: {verdict}")),
            "rank {rank}: {stdout}\n{err}"
        );
        assert_eq!(code == 0, passes, "rank {rank}: exit {code}");
    }
}

#[test]
fn an_adapter_stack_extracts_exactly_as_its_written_f32_merge_does() {
    // `--adapter` computes each merged tensor in memory; the result must be the adapter
    // `--tuned` extracts from the same stack merged to disk in f32 (`wanbake merge --dtype
    // f32`), byte for byte: a DoRA, a LyCORIS LoHa and a LoRA at 0.5 on the golden base.
    let dir = tmp();
    let b = base();
    let stack = [
        golden("adapters/peft_dora").display().to_string(),
        golden("adapters/lycoris/loha.safetensors")
            .display()
            .to_string(),
        format!("{}:0.5", golden("adapters/peft_plain").display()),
    ];
    let mut merge = vec!["merge", "--base", &b, "--dtype", "f32", "--out", "m"];
    let mut direct = vec!["extract", "--base", &b, "--rank", "2", "--out", "a"];
    for a in &stack {
        merge.extend(["--adapter", a.as_str()]);
        direct.extend(["--adapter", a.as_str()]);
    }
    ok(run(dir.path(), &merge));
    ok(run(dir.path(), &direct));
    let m = dir.path().join("m").display().to_string();
    let via_disk = [
        "extract", "--base", &b, "--tuned", &m, "--rank", "2", "--out", "t",
    ];
    ok(run(dir.path(), &via_disk));
    let from_stack = std::fs::read(weights(&dir.path().join("a"))).unwrap();
    let from_merge = std::fs::read(weights(&dir.path().join("t"))).unwrap();
    assert!(from_stack.len() > 1000, "a real adapter");
    assert!(from_stack == from_merge, "the two extractions differ");
    assert!(
        !common::tree(dir.path())
            .iter()
            .any(|p| p.contains("wanbake-tuned"))
    );
}

#[test]
fn resize_refuses_what_it_cannot_reduce_and_writes_nothing() {
    let dir = tmp();
    let dora = golden("adapters/peft_dora").display().to_string();
    let (code, _, err) = parts(&run(
        dir.path(),
        &["resize", &dora, "--rank", "2", "--out", "o"],
    ));
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("resize reduces plain LoRA modules") && err.contains("extract"),
        "{err}"
    );
    let lora = golden("extract/resize_lora.safetensors")
        .display()
        .to_string();
    let (code, _, err) = parts(&run(dir.path(), &["resize", &lora, "--out", "o"]));
    assert_ne!(code, 0, "no rank rule: {err}");
    assert_eq!(common::tree(dir.path()), Vec::<String>::new());
}

/// Every tensor of a safetensors file as stored: dtype, shape, bytes.
fn read_stored(path: &Path) -> BTreeMap<String, (safetensors::Dtype, Vec<usize>, Vec<u8>)> {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    (st.tensors().into_iter())
        .map(|(n, t)| (n, (t.dtype(), t.shape().to_vec(), t.data().to_vec())))
        .collect()
}

/// bf16 of f32 bytes, round to nearest even, by hand (no NaN in these outputs).
fn bf16_rne(f32_bytes: &[u8]) -> Vec<u8> {
    (f32_bytes.chunks_exact(4))
        .flat_map(|c| {
            let b = u32::from_le_bytes(c.try_into().unwrap());
            assert!((b & 0x7FFF_FFFF) <= 0x7F80_0000, "no NaN expected");
            let r = (u64::from(b) + 0x7FFF + u64::from((b >> 16) & 1)) >> 16;
            (r as u16).to_le_bytes()
        })
        .collect()
}

/// `got` holds `f32`'s tensors with every non-scalar rounded once to bf16 and the scalars
/// (`.alpha`) as they were.
fn assert_bf16_of(got: &Path, f32: &Path) {
    let (got, want) = (read_stored(got), read_stored(f32));
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>()
    );
    for (name, (dt, shape, bytes)) in &want {
        let g = &got[name];
        assert_eq!(&g.1, shape, "{name}");
        if shape.is_empty() {
            assert_eq!((&g.0, &g.2), (dt, bytes), "{name}: a scalar stays as it is");
        } else {
            assert_eq!(*dt, safetensors::Dtype::F32, "{name}");
            assert_eq!(g.0, safetensors::Dtype::BF16, "{name}");
            assert!(
                g.2 == bf16_rne(bytes),
                "{name}: not the RNE of the f32 output"
            );
        }
    }
}

#[test]
fn dtype_bf16_rounds_once_and_the_budget_counts_its_bytes() {
    let dir = tmp();
    let d = dir.path();
    let f = extract_json(d, "f32", &["--rank", "4"]);
    let h = extract_json(d, "bf16", &["--rank", "4", "--dtype", "bf16"]);
    assert_bf16_of(&weights(&d.join("bf16")), &weights(&d.join("f32")));
    assert_eq!(
        f["modules"], h["modules"],
        "same ranks and errors (of the f32 factors)"
    );
    let (tf, th) = (&f["tensor_bytes"], &h["tensor_bytes"]);
    assert!(th.as_u64() < tf.as_u64(), "{th} < {tf}");
    // A budget buys ranks at 2 bytes an element (the differences count 2 as well).
    let exp = expect();
    let fixed = exp["fixed_bytes"].as_u64().unwrap() / 2;
    let bytes = 30_000u64;
    let want = reference_budget_ranks_in(&exp, bytes - fixed, 2);
    assert_ne!(want, reference_budget_ranks(&exp, bytes - 2 * fixed));
    let b = bytes.to_string();
    let report = extract_json(d, "budget", &["--budget", &b, "--dtype", "bf16"]);
    assert!(report["tensor_bytes"].as_u64().unwrap() <= bytes);
    let got = lora_modules(&report);
    for (name, r) in want {
        let found = got.get(&name).map_or(0, |m| m["rank"].as_u64().unwrap());
        assert_eq!(found, r, "{name} at --budget {bytes} --dtype bf16");
    }
    // resize: every tensor but the scalars, resized or not.
    let l = golden("extract/resize_lora.safetensors")
        .display()
        .to_string();
    for (out, extra) in [("r32", None), ("r16", Some("bf16"))] {
        let mut args = vec!["resize", &l, "--rank", "3", "--out", out, "-q"];
        args.extend(extra.iter().flat_map(|d| ["--dtype", *d]));
        ok(run(d, &args));
    }
    assert_bf16_of(&weights(&d.join("r16")), &weights(&d.join("r32")));
    let manifest = std::fs::read_to_string(d.join("r16/wanbake.manifest.json")).unwrap();
    assert!(manifest.contains(r#""dtype": "BF16""#), "{manifest}");
}
