//! `wanbake bake` end to end on real files: the bundled demo (golden check, byte-identical
//! reruns, verify), every plan-phase refusal with nothing written, a failed check, and
//! `--dry-run` of each shipped real-world recipe against synthetic checkpoints with the
//! released models' shapes.

mod common;

use std::path::{Path, PathBuf};

use common::{bin, ok, parts, repo, run, tmp, tree, write_f32};

/// `recipes/demo.toml` with its `../` paths made absolute and its output moved to `out`.
fn demo_recipe(dir: &Path, out: &Path) -> PathBuf {
    let text = std::fs::read_to_string(repo().join("recipes/demo.toml")).unwrap();
    let text = text
        .replace("\"../", &format!("\"{}/", repo().display()))
        .replace(
            &format!("\"{}/out/demo\"", repo().display()),
            &format!("\"{}\"", out.display()),
        );
    let path = dir.join("demo.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn bake(dir: &Path, recipe: &Path, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["bake", recipe.to_str().unwrap()];
    args.extend_from_slice(extra);
    run(dir, &args)
}

fn manifest(dir: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dir.join("wanbake.manifest.json")).unwrap()).unwrap()
}

#[test]
fn demo_bakes_passes_its_checks_verifies_and_is_byte_identical_twice() {
    let t = tmp();
    let out = t.path().join("demo-out");
    let recipe = demo_recipe(t.path(), &out);
    let stdout = ok(bake(t.path(), &recipe, &[]));
    assert!(
        stdout.contains("check forward-vs-diffusers: passed"),
        "{stdout}"
    );
    assert!(
        stdout.contains("check sample4-vs-diffusers: passed"),
        "{stdout}"
    );
    assert!(
        stdout.contains("check forward-vs-unmerged: passed"),
        "{stdout}"
    );
    let first = std::fs::read(out.join("wanbake.manifest.json")).unwrap();
    let weights = std::fs::read(out.join("wanbake_nnx_scanned.safetensors")).unwrap();
    // Nothing but the release: no reference model, no temporaries.
    assert_eq!(
        tree(t.path()),
        [
            "demo-out",
            "demo-out/config.json",
            "demo-out/wanbake.manifest.json",
            "demo-out/wanbake_nnx_scanned.safetensors",
            "demo.toml"
        ]
    );
    let m = manifest(&out);
    assert_eq!(m["status"], "ok");
    assert_eq!(m["command"], "bake");
    assert_eq!(m["options"]["recipe"]["output"]["layout"], "nnx-scanned");
    assert_eq!(m["checks"].as_array().unwrap().len(), 3);
    let roles: Vec<&str> = m["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["role"].as_str().unwrap())
        .collect();
    assert!(
        roles.contains(&"base") && roles.contains(&"adapter"),
        "{roles:?}"
    );
    // The weights carry how they were made.
    let f =
        wanbake::io::SafetensorsFile::open(&out.join("wanbake_nnx_scanned.safetensors")).unwrap();
    let recipe_meta: serde_json::Value =
        serde_json::from_str(&f.metadata()["wanbake.recipe"]).unwrap();
    assert_eq!(recipe_meta, m["options"]["recipe"]);
    assert!(f.metadata()["wanbake.inputs"].contains("peft_plain"));
    // Scanned NNX layout, bf16 where MaxDiffusion keeps no f32.
    let q = f.view("blocks.attn1.query.kernel").expect("stacked kernel");
    assert_eq!(q.dtype, wanbake::io::DType::BF16);
    assert_eq!(q.shape[0], 3, "layer axis first");
    // verify passes; a second bake gives the same bytes.
    ok(run(t.path(), &["verify", out.to_str().unwrap()]));
    ok(bake(t.path(), &recipe, &["--quiet"]));
    assert!(std::fs::read(out.join("wanbake.manifest.json")).unwrap() == first);
    assert!(std::fs::read(out.join("wanbake_nnx_scanned.safetensors")).unwrap() == weights);
}

#[test]
fn demo_is_identical_on_one_thread_and_with_json() {
    let t = tmp();
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    let ra = demo_recipe(t.path(), &a);
    ok(bake(t.path(), &ra, &["--threads", "1", "--quiet"]));
    let rb = t.path().join("b.toml");
    std::fs::write(
        &rb,
        std::fs::read_to_string(&ra).unwrap().replace(
            &format!("\"{}\"", a.display()),
            &format!("\"{}\"", b.display()),
        ),
    )
    .unwrap();
    let j: serde_json::Value = serde_json::from_str(&ok(bake(t.path(), &rb, &["--json"]))).unwrap();
    assert_eq!(j["result"]["status"], "ok");
    assert_eq!(j["plan"]["base_hashed"], true);
    // The output folder is part of the recipe, so manifests differ; the weights do not.
    for f in ["wanbake_nnx_scanned.safetensors", "config.json"] {
        let (x, y) = (
            std::fs::read(a.join(f)).unwrap(),
            std::fs::read(b.join(f)).unwrap(),
        );
        if f == "config.json" {
            assert_eq!(x, y);
        } else {
            let (fa, fb) = (
                wanbake::io::SafetensorsFile::open(&a.join(f)).unwrap(),
                wanbake::io::SafetensorsFile::open(&b.join(f)).unwrap(),
            );
            assert_eq!(fa.infos(), fb.infos());
            for info in fa.infos() {
                let (x, y) = (fa.view(&info.name).unwrap(), fb.view(&info.name).unwrap());
                assert!(x.bytes == y.bytes, "{}", info.name);
            }
        }
    }
}

#[test]
fn device_cuda_without_a_gpu_is_refused_up_front_and_the_manifest_records_the_device() {
    let t = tmp();
    let out = t.path().join("demo-out");
    let recipe = demo_recipe(t.path(), &out);
    if wanbake::gpu::CudaDevice::open(0).is_err() {
        refused(
            bake(t.path(), &recipe, &["--device", "cuda"]),
            &["CUDA is unavailable", "--device cpu"],
            t.path(),
            &["demo.toml"],
        );
    }
    let j: serde_json::Value =
        serde_json::from_str(&ok(bake(t.path(), &recipe, &["--device", "cpu", "--json"]))).unwrap();
    assert_eq!(j["plan"]["device"]["used"], "cpu");
    assert_eq!(j["plan"]["device"]["reason"], "cpu (--device cpu)");
    assert_eq!(manifest(&out)["report"]["device"]["used"], "cpu");
}

#[test]
fn the_bundled_demo_recipe_plans_as_shipped() {
    let before = tree(&repo().join("out"));
    let stdout = ok(run(&repo(), &["bake", "recipes/demo.toml", "--dry-run"]));
    assert!(stdout.contains("sha256   base"), "{stdout}");
    assert!(stdout.contains("dry run: nothing written"), "{stdout}");
    assert_eq!(tree(&repo().join("out")), before);
}

/// Asserts a plan-phase failure: exit 1, the message contains every `needle`, and the
/// folder holds nothing but `keep`.
#[track_caller]
/// The plan prints an absolute recipe path as written, with one leading slash (it
/// printed `//work/...`), and the manifest records it the same way.
#[test]
fn a_plan_prints_absolute_paths_with_one_leading_slash() {
    let t = tmp();
    let out = t.path().join("demo-out");
    let recipe = demo_recipe(t.path(), &out);
    let repo = repo();
    let stdout = ok(bake(t.path(), &recipe, &["--dry-run"]));
    assert!(!stdout.contains("//"), "{stdout}");
    for line in [
        format!("  base     {}/golden/models/t2v ", repo.display()),
        format!(
            "  adapter  adapter[0] {}/golden/adapters/peft_plain: peft",
            repo.display()
        ),
        format!(
            "  adapter  adapter[1] {}/golden/adapters/kohya_lora/kohya_lora.safetensors: kohya",
            repo.display()
        ),
    ] {
        assert!(stdout.contains(&line), "{line:?} not in\n{stdout}");
    }
    ok(bake(t.path(), &recipe, &[]));
    let m = manifest(&out);
    let want = format!("{}/golden/adapters/peft_plain", repo.display());
    assert_eq!(m["options"]["recipe"]["adapters"][0]["path"], want.as_str());
}

fn refused(o: std::process::Output, needles: &[&str], dir: &Path, keep: &[&str]) {
    let (code, out, err) = parts(&o);
    assert_eq!(code, 1, "stdout:\n{out}\nstderr:\n{err}");
    for n in needles {
        assert!(err.contains(n), "missing `{n}` in:\n{err}");
    }
    let mut want: Vec<String> = keep.iter().map(|s| s.to_string()).collect();
    want.sort();
    assert_eq!(tree(dir), want, "something was written");
}

#[test]
fn wrong_sha256_fails_the_plan_with_nothing_written() {
    let t = tmp();
    let recipe = demo_recipe(t.path(), &t.path().join("out"));
    let text = std::fs::read_to_string(&recipe).unwrap();
    let start = text.find("\" = \"").unwrap() + 5;
    let mut bad = text.clone();
    bad.replace_range(start..start + 4, "0000");
    std::fs::write(&recipe, bad).unwrap();
    refused(
        bake(t.path(), &recipe, &[]),
        &[
            "base",
            "diffusion_pytorch_model.safetensors",
            "but the recipe expects 0000",
        ],
        t.path(),
        &["demo.toml"],
    );
    // Also in a dry run: declared hashes are always checked.
    refused(
        bake(t.path(), &recipe, &["--dry-run"]),
        &["but the recipe expects"],
        t.path(),
        &["demo.toml"],
    );
}

#[test]
fn unknown_field_fails_naming_it_with_nothing_written() {
    let t = tmp();
    let recipe = demo_recipe(t.path(), &t.path().join("out"));
    let text = std::fs::read_to_string(&recipe).unwrap();
    std::fs::write(
        &recipe,
        text.replacen("strength = 0.5", "strenght = 0.5", 1),
    )
    .unwrap();
    refused(
        bake(t.path(), &recipe, &[]),
        &["demo.toml", "strenght"],
        t.path(),
        &["demo.toml"],
    );
}

/// A recipe on the golden t2v base with one adapter file of the given tensors.
fn recipe_with_adapter(dir: &Path, tensors: &[(&str, Vec<usize>, Vec<f32>)]) -> PathBuf {
    write_f32(&dir.join("adapter.safetensors"), tensors);
    let text = format!(
        "[base]\npath = \"{}\"\n\n[[adapter]]\npath = \"adapter.safetensors\"\n\n\
         [output]\ndir = \"out\"\n",
        repo().join("golden/models/t2v").display()
    );
    let path = dir.join("r.toml");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn an_adapter_key_that_binds_to_nothing_fails_the_plan() {
    let t = tmp();
    let recipe = recipe_with_adapter(
        t.path(),
        &[
            (
                "diffusion_model.blocks.0.self_attn.q.lora_down.weight",
                vec![2, 32],
                vec![0.0; 64],
            ),
            (
                "diffusion_model.blocks.0.self_attn.q.lora_up.weight",
                vec![32, 2],
                vec![0.0; 64],
            ),
            (
                "diffusion_model.blocks.7.self_attn.q.lora_down.weight",
                vec![2, 32],
                vec![0.0; 64],
            ),
            (
                "diffusion_model.blocks.7.self_attn.q.lora_up.weight",
                vec![32, 2],
                vec![0.0; 64],
            ),
        ],
    );
    refused(
        bake(t.path(), &recipe, &[]),
        &["blocks.7.self_attn.q"],
        t.path(),
        &["adapter.safetensors", "r.toml"],
    );
}

#[test]
fn a_shape_mismatch_fails_the_plan() {
    let t = tmp();
    let recipe = recipe_with_adapter(
        t.path(),
        &[
            (
                "diffusion_model.blocks.0.self_attn.q.lora_down.weight",
                vec![2, 48],
                vec![0.0; 96],
            ),
            (
                "diffusion_model.blocks.0.self_attn.q.lora_up.weight",
                vec![32, 2],
                vec![0.0; 64],
            ),
        ],
    );
    refused(
        bake(t.path(), &recipe, &[]),
        &["blocks.0", "48"],
        t.path(),
        &["adapter.safetensors", "r.toml"],
    );
}

#[test]
fn a_failed_check_keeps_the_output_marked_failed_and_exits_non_zero() {
    let t = tmp();
    let out = t.path().join("out");
    let recipe = demo_recipe(t.path(), &out);
    // The checks were set for strength 0.5; a bake at 0.6 must fail them.
    let text = std::fs::read_to_string(&recipe).unwrap();
    std::fs::write(&recipe, text.replace("strength = 0.5", "strength = 0.6")).unwrap();
    let (code, stdout, stderr) = parts(&bake(t.path(), &recipe, &[]));
    assert_eq!(code, 1, "{stdout}\n{stderr}");
    assert!(
        stdout.contains("check forward-vs-diffusers: FAILED"),
        "{stdout}"
    );
    // Against the unrounded merge of the same recipe it still agrees.
    assert!(
        stdout.contains("check forward-vs-unmerged: passed"),
        "{stdout}"
    );
    let m = manifest(&out);
    assert_eq!(m["status"], "check_failed");
    assert_eq!(m["checks"][0]["passed"], false);
    // The files match the manifest; verify says so and still exits 3 for the status.
    let v = run(t.path(), &["verify", out.to_str().unwrap()]);
    let (code, vout, verr) = parts(&v);
    assert_eq!(code, 3, "{vout}");
    assert!(
        vout.contains("OK (2 files") && vout.contains("status check_failed"),
        "{vout}"
    );
    assert!(verr.contains("check_failed"), "{verr}");
}

#[test]
fn an_existing_output_needs_overwrite() {
    let t = tmp();
    let recipe = demo_recipe(t.path(), &t.path().join("out"));
    let text = std::fs::read_to_string(&recipe).unwrap();
    std::fs::write(
        &recipe,
        text.replace("overwrite = true", "overwrite = false"),
    )
    .unwrap();
    std::fs::create_dir(t.path().join("out")).unwrap();
    refused(
        bake(t.path(), &recipe, &[]),
        &["output.dir", "already exists", "overwrite = true"],
        t.path(),
        &["demo.toml", "out"],
    );
}

// ---------------------------------------------------------------------------------------
// The shipped real-world recipes, dry-run against skeletons with the released shapes.

/// Copies `recipes/NAME` into `dir` (its relative paths then point into `dir`).
fn shipped(dir: &Path, name: &str) -> PathBuf {
    let to = dir.join(name);
    std::fs::copy(repo().join("recipes").join(name), &to).unwrap();
    to
}

fn skeleton(dir: &Path, model: &str, dest: &str, shard: bool) {
    let out = dir.join(dest);
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    let mut args = vec![
        "synth",
        "--model",
        model,
        "--fill",
        "zero",
        "--dtype",
        "bf16",
        "--skeleton",
        "--out",
    ];
    let out = out.to_str().unwrap().to_string();
    args.push(&out);
    if shard {
        args.extend(["--shard-size", "5000000000"]);
    }
    ok(run(dir, &args));
}

/// Rank-2 factors (zeros: a dry run reads shapes, not values) in ComfyUI / original-Wan
/// names for `prefix.module`: lora_down (r, in) and lora_up (out, r).
fn comfy_lora(v: &mut Vec<(String, Vec<usize>)>, module: &str, out: usize, inp: usize) {
    v.push((
        format!("diffusion_model.{module}.lora_down.weight"),
        vec![2, inp],
    ));
    v.push((
        format!("diffusion_model.{module}.lora_up.weight"),
        vec![out, 2],
    ));
}

fn write_zeros(path: &Path, tensors: &[(String, Vec<usize>)]) {
    let owned: Vec<(&str, Vec<usize>, Vec<f32>)> = tensors
        .iter()
        .map(|(n, s)| (n.as_str(), s.clone(), vec![0.0; s.iter().product()]))
        .collect();
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    write_f32(path, &owned);
}

/// A lightx2v-style Wan 14B distill LoRA: factors on every block Linear and the embedding
/// MLPs, `.diff_b` on their biases, `.diff` on the norms and `head.head`, `blocks.N.diff_m`
/// on the modulation tables.
fn lightx2v_14b(with_diffs: bool) -> Vec<(String, Vec<usize>)> {
    let (d, ff) = (5120, 13824);
    let mut v = Vec::new();
    for b in 0..40 {
        for attn in ["self_attn", "cross_attn"] {
            for m in ["q", "k", "v", "o"] {
                let module = format!("blocks.{b}.{attn}.{m}");
                comfy_lora(&mut v, &module, d, d);
                if with_diffs {
                    v.push((format!("diffusion_model.{module}.diff_b"), vec![d]));
                }
            }
            if with_diffs {
                for n in ["norm_q", "norm_k"] {
                    v.push((
                        format!("diffusion_model.blocks.{b}.{attn}.{n}.diff"),
                        vec![d],
                    ));
                }
            }
        }
        comfy_lora(&mut v, &format!("blocks.{b}.ffn.0"), ff, d);
        comfy_lora(&mut v, &format!("blocks.{b}.ffn.2"), d, ff);
        if with_diffs {
            v.push((format!("diffusion_model.blocks.{b}.ffn.0.diff_b"), vec![ff]));
            v.push((format!("diffusion_model.blocks.{b}.ffn.2.diff_b"), vec![d]));
            v.push((format!("diffusion_model.blocks.{b}.norm3.diff"), vec![d]));
            v.push((format!("diffusion_model.blocks.{b}.norm3.diff_b"), vec![d]));
            v.push((format!("diffusion_model.blocks.{b}.diff_m"), vec![1, 6, d]));
        }
    }
    if with_diffs {
        for (m, out, inp) in [
            ("text_embedding.0", d, 4096),
            ("text_embedding.2", d, d),
            ("time_embedding.0", d, 256),
            ("time_embedding.2", d, d),
            ("time_projection.1", 6 * d, d),
        ] {
            comfy_lora(&mut v, m, out, inp);
            v.push((format!("diffusion_model.{m}.diff_b"), vec![out]));
        }
        v.push(("diffusion_model.head.head.diff".into(), vec![64, d]));
        v.push(("diffusion_model.head.head.diff_b".into(), vec![64]));
    }
    v
}

fn dry_run_json(dir: &Path, recipe: &Path) -> serde_json::Value {
    let stdout = ok(bake(dir, recipe, &["--dry-run", "--json"]));
    serde_json::from_str(&stdout).unwrap()
}

#[test]
fn wan21_14b_lightx2v_recipe_plans_on_the_real_shapes() {
    let t = tmp();
    let recipe = shipped(t.path(), "wan2.1-t2v-14b-lightx2v.toml");
    skeleton(
        t.path(),
        "wan2.1-t2v-14b",
        "models/Wan2.1-T2V-14B-Diffusers/transformer",
        true,
    );
    write_zeros(
        &t.path()
            .join("models/loras/wan2.1_t2v_14b_lora_rank64_lightx2v_4step.safetensors"),
        &lightx2v_14b(true),
    );
    let j = dry_run_json(t.path(), &recipe);
    let plan = &j["plan"];
    let a = &plan["adapters"][0];
    assert_eq!(a["convention"], "comfy", "{a}");
    assert!(a["unmatched_allowed"].as_array().unwrap().is_empty());
    // Base tensors changed: per block 10 Linear weights (lora), 11 biases (diff_b of the
    // 10 Linears and norm3), 4 q/k norm scales + norm3 weight + modulation (diff); then 5
    // embedding weights and biases, head weight and bias.
    assert_eq!(a["targets_merged"], 40 * (10 + 11 + 6) + 5 * 2 + 2, "{a}");
    assert_eq!(a["kinds"]["lora"], 405, "{a}");
    assert_eq!(a["scale_sources"]["default_alpha_is_rank"], 405, "{a}");
    // The numbers the recipe's comment promises. Tensors, by hand from spec wan.md §1.2: a
    // diffusers 14B block has 27 parameters (attn1 and attn2: q, k, v, out weight + bias and
    // norm_q, norm_k = 10 each; ffn 2 × 2; norm2 weight + bias; scale_shift_table), each
    // stacked into one (40, ...) tensor, plus 15 outside the blocks. The byte total (files as
    // laid out, headers included) is this program's plan, pinned so the comment stays true.
    assert_eq!(plan["output"]["tensors"], 27 + 15);
    assert_eq!(plan["output"]["bytes"], 29_046_025_019u64);
    assert_eq!(plan["output"]["files"].as_array().unwrap().len(), 8);
    assert_eq!(plan["base_hashed"], false);
    assert!(!t.path().join("out").exists());
}

#[test]
fn wan22_a14b_pair_recipe_plans_on_the_real_shapes() {
    let t = tmp();
    let recipe = shipped(t.path(), "wan2.2-t2v-a14b-lightx2v.toml");
    skeleton(
        t.path(),
        "wan2.2-t2v-a14b",
        "models/Wan2.2-T2V-A14B-Diffusers",
        true,
    );
    for which in ["high", "low"] {
        write_zeros(
            &t.path().join(format!(
                "models/loras/wan2.2_t2v_A14b_{which}_noise_lora_rank64_lightx2v_4step_1217.safetensors"
            )),
            &lightx2v_14b(false),
        );
    }
    let j = dry_run_json(t.path(), &recipe);
    let adapters = j["plan"]["adapters"].as_array().unwrap();
    assert_eq!(adapters.len(), 2);
    assert_eq!(adapters[0]["component"], "transformer");
    assert_eq!(adapters[1]["component"], "transformer_2");
    for a in adapters {
        assert_eq!(a["targets_merged"], 400, "{a}");
    }
    let out = &j["plan"]["output"];
    // Per expert, by hand from spec wan.md: 40 × 27 + 15 = 1095 tensors; 14,288,491,584
    // parameters (§1.5) in bf16, except diffusers' _keep_in_fp32_modules (§2), kept in f32:
    // time_embedder (5120·256 + 5120 + 5120² + 5120 = 27,535,360), 40 block
    // scale_shift_tables (40·6·5120) + the final one (2·5120), 40 norm2 weight + bias
    // (40·2·5120): 29,184,000 parameters, 2 more bytes each.
    let per_expert: u64 = 2 * 14_288_491_584 + 2 * 29_184_000;
    assert_eq!(out["tensor_bytes"], 2 * per_expert);
    assert_eq!(out["tensors"], 2 * (40 * 27 + 15));
    assert_eq!(out["bytes"], 57_271_120_734u64);
    assert_eq!(out["files"].as_array().unwrap().len(), 12);
    // Without `expert` the plan is refused: the base has two transformers.
    let text = std::fs::read_to_string(&recipe).unwrap();
    std::fs::write(&recipe, text.replace("expert = \"transformer_2\"\n", "")).unwrap();
    let (code, _, err) = parts(&bake(t.path(), &recipe, &["--dry-run"]));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("transformer_2"), "{err}");
}

#[test]
fn sa3_medium_peft_recipe_plans_on_the_real_shapes() {
    let t = tmp();
    let recipe = shipped(t.path(), "sa3-medium-peft.toml");
    skeleton(
        t.path(),
        "sa3-medium",
        "models/stable-audio-3-medium",
        false,
    );
    let base = wanbake::io::SafetensorsFile::open(
        &t.path()
            .join("models/stable-audio-3-medium/model.safetensors"),
    )
    .unwrap();
    let mut tensors = Vec::new();
    for l in 0..24 {
        for m in [
            "self_attn.to_qkv",
            "self_attn.to_out",
            "cross_attn.to_q",
            "cross_attn.to_kv",
            "cross_attn.to_out",
            "ff.ff.0.proj",
            "ff.ff.2",
        ] {
            let module = format!("transformer.layers.{l}.{m}");
            let shape = base
                .view(&format!("model.model.{module}.weight"))
                .unwrap()
                .shape
                .to_vec();
            tensors.push((
                format!("base_model.model.{module}.lora_A.weight"),
                vec![2, shape[1]],
            ));
            tensors.push((
                format!("base_model.model.{module}.lora_B.weight"),
                vec![shape[0], 2],
            ));
        }
    }
    let peft = t.path().join("models/stable-audio-3-maqam-lora");
    write_zeros(&peft.join("adapter_model.safetensors"), &tensors);
    std::fs::write(
        peft.join("adapter_config.json"),
        r#"{"peft_type": "LORA", "r": 2, "lora_alpha": 4,
            "target_modules": ["to_qkv", "to_out", "to_q", "to_kv", "proj", "ff.ff.2"]}"#,
    )
    .unwrap();
    let j = dry_run_json(t.path(), &recipe);
    let a = &j["plan"]["adapters"][0];
    assert_eq!(a["convention"], "peft", "{a}");
    assert_eq!(a["targets_merged"], 168, "{a}");
    assert_eq!(a["entries"], 168, "{a}");
}

#[test]
fn skeletons_are_instant_and_refuse_to_replace() {
    let t = tmp();
    skeleton(t.path(), "wan2.1-t2v-1.3b", "s", false);
    let o = run(
        t.path(),
        &[
            "synth",
            "--model",
            "wan2.1-t2v-1.3b",
            "--fill",
            "zero",
            "--skeleton",
            "--out",
            "s",
        ],
    );
    assert_eq!(parts(&o).0, 1);
    ok(run(t.path(), &["inspect", "s"]));
    let _ = bin();
}

/// The bitwise f32 values of every parameter of two weight sources of the same model.
fn params_bits(w: &dyn wanbake::runner::WeightSource) -> Vec<(String, Vec<u32>)> {
    w.config()
        .diffusers_params()
        .into_iter()
        .map(|p| {
            let v = w.tensor(&p.name).unwrap();
            (p.name, v.iter().map(|x| x.to_bits()).collect())
        })
        .collect()
}

/// An `unmerged` check's reference is computed tensor by tensor (`bake::reference`) and never
/// written: its values are bit for bit those of the f32 merge in the base's layout that
/// bakes wrote beside the output before (and ran from there), for a diffusers base, an
/// nnx-scanned one (layer slices, transposed kernels) and an A14B pipeline (two experts,
/// an adapter each); and the space check no longer counts an f32 copy of the model.
#[test]
fn unmerged_reference_is_computed_not_written_and_equals_the_f32_merge() {
    use wanbake::bake::{open_bake, reference::reference_models};
    use wanbake::merge::{Merging, merge_release};
    use wanbake::pipeline::{Compute, OutputOptions, Plan};
    let t = tmp();
    let golden = repo().join("golden");
    let scanned = t.path().join("t2v-scanned");
    ok(run(
        t.path(),
        &[
            "restack",
            "--to",
            "nnx-scanned",
            "--out",
            scanned.to_str().unwrap(),
            golden.join("models/t2v").to_str().unwrap(),
        ],
    ));
    let demo = format!(
        "[[adapter]]\npath = \"{0}/adapters/peft_plain\"\nstrength = 1.0\n\
         [[adapter]]\npath = \"{0}/adapters/kohya_lora/kohya_lora.safetensors\"\nstrength = 0.5\n",
        golden.display()
    );
    let a14b = format!(
        "[[adapter]]\npath = \"{0}/adapters/a14b_pair/high.safetensors\"\nexpert = \"transformer\"\n\
         [[adapter]]\npath = \"{0}/adapters/a14b_pair/low.safetensors\"\nexpert = \"transformer_2\"\nstrength = 0.7\n",
        golden.display()
    );
    let cases = [
        (golden.join("models/t2v"), &demo),
        (scanned, &demo),
        (golden.join("models/a14b"), &a14b),
    ];
    for (i, (base, adapters)) in cases.iter().enumerate() {
        let path = t.path().join(format!("r{i}.toml"));
        let out = t.path().join(format!("out{i}"));
        std::fs::write(
            &path,
            format!(
                "[base]\npath = \"{}\"\n{adapters}[output]\ndir = \"{}\"\n\
                 [[check]]\ninputs = \"{}/runner/t2v__inputs.safetensors\"\nexpected = \"unmerged\"\ntolerance = 0.1\n",
                base.display(),
                out.display(),
                golden.display()
            ),
        )
        .unwrap();
        let recipe = wanbake::recipe::Recipe::load(&path).unwrap();
        let inputs = open_bake(recipe).unwrap();
        let plan = inputs.dry_run().unwrap();
        assert_eq!(plan.space[0].needed, plan.ready[0].output.total_bytes());
        let f32_reference = OutputOptions::f32_reference();
        let written = t.path().join(format!("written{i}"));
        let merging = Merging {
            options: inputs.merge,
            compute: &Compute::Cpu,
            svd_cache: None,
        };
        merge_release(
            &inputs.base,
            &inputs.adapters,
            &f32_reference,
            &merging,
            &written,
            wanbake::release::staging::Replace::Never,
        )
        .unwrap();
        let old = wanbake::runner::ModelSet::open(&written, None).unwrap();
        let reference = Plan::new(&inputs.base, &inputs.adapters, &f32_reference).unwrap();
        let new = reference_models(&reference, &inputs.merge).unwrap();
        let base_set = wanbake::runner::ModelSet::open(base, None).unwrap();
        let pairs = [
            (
                Some(&old.transformer),
                Some(&new.transformer),
                Some(&base_set.transformer),
            ),
            (
                old.transformer_2.as_ref(),
                new.transformer_2.as_ref(),
                base_set.transformer_2.as_ref(),
            ),
        ];
        assert_eq!(old.boundary_ratio, new.boundary_ratio, "{}", base.display());
        for (o, n, b) in pairs {
            let (Some(o), Some(n), Some(b)) = (o, n, b) else {
                assert!(o.is_none() && n.is_none(), "{}", base.display());
                continue;
            };
            let (o, n, b) = (
                params_bits(o.as_ref()),
                params_bits(n.as_ref()),
                params_bits(b.as_ref()),
            );
            assert_eq!(o.len(), n.len());
            for (x, y) in o.iter().zip(&n) {
                assert!(
                    x == y,
                    "{}: `{}` differs from the written f32 merge",
                    base.display(),
                    x.0
                );
            }
            let merged = n.iter().zip(&b).filter(|(x, y)| x.1 != y.1).count();
            assert!(
                merged > 0,
                "{}: no adapter changed anything",
                base.display()
            );
        }
        assert!(!out.exists());
    }
}
