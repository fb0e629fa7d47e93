//! `wanbake run` against the diffusers goldens of `golden/runner/` (made by
//! `golden/wan_golden.py` from diffusers 0.42.1 `WanTransformer3DModel` forwards and
//! `WanPipeline` sampling, never from wanbake), plus determinism, dtype and error-path
//! checks. Every run drives the real binary in a fresh temp dir.

mod common;

use std::path::{Path, PathBuf};

use common::{parts, repo, run, tmp};
use wanbake::io::SafetensorsFile;
use wanbake::layout::OutputDType;
use wanbake::layout::restack::RestackOptions;
use wanbake::model::wan_layout::Layout;
use wanbake::pipeline::ExecOptions;
use wanbake::release::Hooks;
use wanbake::release::staging::Replace;
use wanbake::restack::restack_release;
use wanbake::runner::output::write_f32_file;
use wanbake::runner::{RunInputs, Tensor};

/// Max abs error allowed on a single f32 forward (outputs are O(1)).
const FORWARD_TOL: f32 = 1e-4;
/// Max abs error allowed after 4 CFG sampling steps.
const SAMPLE_TOL: f32 = 1e-3;

fn golden(rel: &str) -> PathBuf {
    repo().join("golden").join(rel)
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// A tensor of a safetensors file as (shape, f32 values).
fn read(path: &Path, name: &str) -> Tensor {
    let f = SafetensorsFile::open(path).expect("open output");
    let v = f
        .view(name)
        .unwrap_or_else(|| panic!("{}: no `{name}`", path.display()));
    Tensor::new(v.shape.to_vec(), f.read_f32(name).expect("read f32"))
}

fn max_abs_err(got: &Tensor, want: &Tensor) -> f32 {
    assert_eq!(got.shape, want.shape, "output shape");
    got.max_abs_diff(want)
}

/// Runs `wanbake run` with `extra` args; returns the output path and stdout.
fn run_model(dir: &Path, model: &Path, inputs: &Path, extra: &[&str]) -> (PathBuf, String) {
    let out = dir.join("out.safetensors");
    let mut args = vec![
        "run",
        "--model",
        path_str(model),
        "--inputs",
        path_str(inputs),
        "--out",
        path_str(&out),
    ];
    args.extend_from_slice(extra);
    let o = run(dir, &args);
    let (code, stdout, stderr) = parts(&o);
    assert_eq!(
        code, 0,
        "wanbake run failed\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    (out, stdout)
}

fn check_forward(model: &str) {
    let dir = tmp();
    let inputs = golden(&format!("runner/{model}__inputs.safetensors"));
    let (out, _) = run_model(
        dir.path(),
        &golden(&format!("models/{model}")),
        &inputs,
        &[],
    );
    let got = read(&out, "noise_pred");
    let want = read(
        &golden(&format!("runner/{model}__forward.safetensors")),
        "noise_pred",
    );
    let err = max_abs_err(&got, &want);
    eprintln!(
        "{model} forward: max abs error {err:e} (max |ref| {})",
        max_abs(&want)
    );
    assert!(
        err <= FORWARD_TOL,
        "{model}: max abs error {err} > {FORWARD_TOL}"
    );
}

fn max_abs(t: &Tensor) -> f32 {
    t.data.iter().fold(0f32, |m, v| m.max(v.abs()))
}

#[test]
fn t2v_forward_matches_diffusers() {
    check_forward("t2v");
}

#[test]
fn t2v_forward_is_as_close_to_the_f64_reference_as_diffusers_f32() {
    // `noise_pred` of t2v__forward_f64: diffusers run in float64 (its own .float() calls keep
    // the sinusoid, LayerNorms and modulation in f32). diffusers' f32 forward is 1.06e-6 from
    // it; an f32 port with the same definition should be within a few times that.
    let dir = tmp();
    let inputs = golden("runner/t2v__inputs.safetensors");
    let (out, _) = run_model(dir.path(), &golden("models/t2v"), &inputs, &[]);
    let got = read(&out, "noise_pred");
    let want = read(&golden("runner/t2v__forward_f64.safetensors"), "noise_pred");
    let err = max_abs_err(&got, &want);
    eprintln!("t2v forward vs f64 reference: max abs error {err:e}");
    assert!(err <= 4e-6, "max abs error {err} to the f64 reference");
}

#[test]
fn i2v_forward_matches_diffusers() {
    check_forward("i2v");
}

#[test]
fn flf2v_forward_matches_diffusers() {
    check_forward("flf2v");
}

#[test]
fn ti2v_per_token_forward_matches_diffusers() {
    // timestep (1, 18) per token: the golden's metadata-free inputs say so by shape.
    let inputs = RunInputs::read(&golden("runner/ti2v__inputs.safetensors")).unwrap();
    assert_eq!(inputs.timestep.shape, vec![1, 18]);
    check_forward("ti2v");
}

/// The sampler metadata of a golden: (timesteps, per-step experts and guidance).
fn golden_schedule(file: &Path) -> (Vec<f32>, Vec<(String, f64)>) {
    let f = SafetensorsFile::open(file).unwrap();
    let meta = f.metadata();
    let timesteps: Vec<f32> = serde_json::from_str(&meta["timesteps"]).unwrap();
    let per_step: Vec<serde_json::Value> = serde_json::from_str(&meta["per_step"]).unwrap();
    let experts = per_step
        .iter()
        .map(|s| {
            (
                s["expert"].as_str().unwrap().to_string(),
                s["guidance"].as_f64().unwrap(),
            )
        })
        .collect();
    (timesteps, experts)
}

fn check_sample(golden_name: &str, model: &str, inputs: &str, args: &[&str]) {
    let dir = tmp();
    let mut extra = vec!["--steps", "4", "--json"];
    extra.extend_from_slice(args);
    let (out, stdout) = run_model(
        dir.path(),
        &golden(&format!("models/{model}")),
        &golden(&format!("runner/{inputs}__inputs.safetensors")),
        &extra,
    );
    let reference = golden(&format!("runner/{golden_name}__sample4.safetensors"));
    let got = read(&out, "latents");
    let want = read(&reference, "latents");
    let err = max_abs_err(&got, &want);
    eprintln!(
        "{golden_name} 4-step sample: max abs error {err:e} (max |ref| {})",
        max_abs(&want)
    );
    assert!(
        err <= SAMPLE_TOL,
        "{golden_name}: max abs error {err} > {SAMPLE_TOL}"
    );

    // The schedule and the expert at every step are the pipeline's, exactly.
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("--json output");
    let (timesteps, experts) = golden_schedule(&reference);
    let steps = report["steps"].as_array().unwrap();
    assert_eq!(steps.len(), timesteps.len());
    for ((s, t), (expert, g)) in steps.iter().zip(&timesteps).zip(&experts) {
        assert_eq!(
            s["timestep"].as_f64().unwrap() as f32,
            *t,
            "timestep of step {}",
            s["index"]
        );
        assert_eq!(
            s["expert"].as_str().unwrap(),
            expert,
            "expert of step {}",
            s["index"]
        );
        assert_eq!(
            s["guidance"].as_f64().unwrap(),
            *g,
            "guidance of step {}",
            s["index"]
        );
    }
    assert!(report["timing"]["total_s"].as_f64().unwrap() > 0.0);
}

#[test]
fn t2v_four_step_cfg_sample_matches_wan_pipeline() {
    check_sample("t2v", "t2v", "t2v", &["--shift", "3", "--guidance", "5"]);
}

#[test]
fn i2v_four_step_cfg_sample_concatenates_the_condition() {
    check_sample("i2v", "i2v", "i2v", &["--shift", "3", "--guidance", "5"]);
}

#[test]
fn a14b_sample_switches_experts_at_the_boundary() {
    // boundary_ratio 0.875 comes from golden/models/a14b/model_index.json.
    check_sample(
        "a14b",
        "a14b",
        "t2v",
        &["--shift", "5", "--guidance", "4", "--guidance-2", "3"],
    );
}

#[test]
fn outputs_do_not_depend_on_thread_count() {
    let inputs = golden("runner/t2v__inputs.safetensors");
    let model = golden("models/t2v");
    let mut files = Vec::new();
    for threads in ["1", "2", "3"] {
        let dir = tmp();
        let (out, _) = run_model(
            dir.path(),
            &model,
            &inputs,
            &["--threads", threads, "--steps", "2", "--shift", "3"],
        );
        files.push((threads, std::fs::read(&out).unwrap(), dir));
    }
    for (threads, bytes, _) in &files[1..] {
        assert!(
            bytes == &files[0].1,
            "--threads {threads} changed the output bytes"
        );
    }
}

#[test]
fn bf16_checkpoint_runs_like_its_f32_widening() {
    // Same f32 values through two storages give the same bits: t2v → bf16 (convert) and
    // bf16 → f32 (convert) hold identical widened weights.
    let dir = tmp();
    let d = dir.path();
    let bf16 = d.join("bf16");
    let f32_dir = d.join("f32");
    let model = golden("models/t2v");
    for (input, dtype, out) in [(&model, "bf16", &bf16), (&bf16, "f32", &f32_dir)] {
        let o = run(
            d,
            &[
                "convert",
                path_str(input),
                "--dtype",
                dtype,
                "--out",
                path_str(out),
            ],
        );
        let (code, stdout, stderr) = parts(&o);
        assert_eq!(code, 0, "convert failed\n{stdout}\n{stderr}");
    }
    let inputs = golden("runner/t2v__inputs.safetensors");
    let mut outs = Vec::new();
    for m in [&bf16, &f32_dir] {
        let sub = d.join(format!("run-{}", outs.len()));
        std::fs::create_dir(&sub).unwrap();
        let (out, _) = run_model(&sub, m, &inputs, &[]);
        outs.push(std::fs::read(out).unwrap());
    }
    assert!(
        outs[0] == outs[1],
        "bf16 and its exact f32 widening gave different outputs"
    );
    // And bf16 weights stay close to the f32 model (rounding of weights only).
    let got = read(&d.join("run-0/out.safetensors"), "noise_pred");
    let want = read(&golden("runner/t2v__forward.safetensors"), "noise_pred");
    assert!(max_abs_err(&got, &want) < 0.1);
}

/// Writes `tensors` as an inputs file in `dir`.
fn inputs_file(dir: &Path, tensors: &[(&str, &Tensor)]) -> PathBuf {
    let p = dir.join("inputs.safetensors");
    write_f32_file(&p, tensors, &Default::default()).unwrap();
    p
}

/// Runs a failing case: exit 1, stderr mentions every `needle`, no output file.
#[track_caller]
fn expect_failure(dir: &Path, model: &Path, inputs: &Path, extra: &[&str], needles: &[&str]) {
    let out = dir.join("out.safetensors");
    let mut args = vec![
        "run",
        "--model",
        path_str(model),
        "--inputs",
        path_str(inputs),
        "--out",
        path_str(&out),
    ];
    args.extend_from_slice(extra);
    let (code, stdout, stderr) = parts(&run(dir, &args));
    assert_eq!(
        code, 1,
        "expected failure\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    for n in needles {
        assert!(stderr.contains(n), "stderr lacks {n:?}:\n{stderr}");
    }
    assert!(!out.exists(), "a failed run left an output file");
    let leftovers: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("tmp"))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
}

#[test]
fn bad_inputs_are_refused_with_the_tensor_named() {
    let t2v = RunInputs::read(&golden("runner/t2v__inputs.safetensors")).unwrap();
    let model = golden("models/t2v");
    let hs = &t2v.hidden_states;
    let ts = &t2v.timestep;
    let ehs = &t2v.encoder_hidden_states;

    // Missing tensor.
    let dir = tmp();
    let p = inputs_file(dir.path(), &[("hidden_states", hs), ("timestep", ts)]);
    expect_failure(
        dir.path(),
        &model,
        &p,
        &[],
        &["encoder_hidden_states", "missing"],
    );

    // Wrong channel count vs config.
    let dir = tmp();
    let wrong = Tensor::zeros(vec![1, 5, 3, 4, 6]);
    let p = inputs_file(
        dir.path(),
        &[
            ("hidden_states", &wrong),
            ("timestep", ts),
            ("encoder_hidden_states", ehs),
        ],
    );
    expect_failure(
        dir.path(),
        &model,
        &p,
        &[],
        &["hidden_states", "in_channels = 4", "[1, 5, 3, 4, 6]"],
    );

    // Latent width not divisible by the patch.
    let dir = tmp();
    let odd = Tensor::zeros(vec![1, 4, 3, 4, 5]);
    let p = inputs_file(
        dir.path(),
        &[
            ("hidden_states", &odd),
            ("timestep", ts),
            ("encoder_hidden_states", ehs),
        ],
    );
    expect_failure(
        dir.path(),
        &model,
        &p,
        &[],
        &["hidden_states", "W = 5", "patch size 2"],
    );

    // Timestep of the wrong length.
    let dir = tmp();
    let ts3 = Tensor::zeros(vec![3]);
    let p = inputs_file(
        dir.path(),
        &[
            ("hidden_states", hs),
            ("timestep", &ts3),
            ("encoder_hidden_states", ehs),
        ],
    );
    expect_failure(dir.path(), &model, &p, &[], &["timestep", "[3]"]);

    // Unknown tensor name.
    let dir = tmp();
    let p = inputs_file(
        dir.path(),
        &[
            ("hidden_states", hs),
            ("timestep", ts),
            ("encoder_hidden_states", ehs),
            ("prompt_embeds", ehs),
        ],
    );
    expect_failure(
        dir.path(),
        &model,
        &p,
        &[],
        &["prompt_embeds", "not an input"],
    );

    // Sampling with guidance > 1 and no negative embeds.
    let dir = tmp();
    let p = inputs_file(
        dir.path(),
        &[
            ("hidden_states", hs),
            ("timestep", ts),
            ("encoder_hidden_states", ehs),
        ],
    );
    expect_failure(
        dir.path(),
        &model,
        &p,
        &["--steps", "2"],
        &["negative_encoder_hidden_states", "guidance"],
    );
}

#[test]
fn i2v_model_without_image_embeds_is_refused() {
    let i2v = RunInputs::read(&golden("runner/i2v__inputs.safetensors")).unwrap();
    let dir = tmp();
    let p = inputs_file(
        dir.path(),
        &[
            ("hidden_states", &i2v.hidden_states),
            ("timestep", &i2v.timestep),
            ("encoder_hidden_states", &i2v.encoder_hidden_states),
        ],
    );
    expect_failure(
        dir.path(),
        &golden("models/i2v"),
        &p,
        &[],
        &["encoder_hidden_states_image", "missing", "I2V"],
    );
}

#[test]
fn t2v_model_with_image_embeds_is_refused() {
    let i2v = RunInputs::read(&golden("runner/i2v__inputs.safetensors")).unwrap();
    let t2v = RunInputs::read(&golden("runner/t2v__inputs.safetensors")).unwrap();
    let dir = tmp();
    let img = i2v.encoder_hidden_states_image.as_ref().unwrap();
    let p = inputs_file(
        dir.path(),
        &[
            ("hidden_states", &t2v.hidden_states),
            ("timestep", &t2v.timestep),
            ("encoder_hidden_states", &t2v.encoder_hidden_states),
            ("encoder_hidden_states_image", img),
        ],
    );
    expect_failure(
        dir.path(),
        &golden("models/t2v"),
        &p,
        &[],
        &["encoder_hidden_states_image", "image_dim"],
    );
}

#[test]
fn checkpoint_that_disagrees_with_its_config_is_refused() {
    let dir = tmp();
    let model = dir.path().join("model");
    std::fs::create_dir(&model).unwrap();
    let src = golden("models/t2v");
    std::fs::copy(
        src.join("diffusion_pytorch_model.safetensors"),
        model.join("diffusion_pytorch_model.safetensors"),
    )
    .unwrap();
    let cfg = std::fs::read_to_string(src.join("config.json")).unwrap();
    let cfg = cfg.replace("\"num_layers\": 3", "\"num_layers\": 4");
    assert!(
        cfg.contains("\"num_layers\": 4"),
        "config edit did not apply"
    );
    std::fs::write(model.join("config.json"), cfg).unwrap();
    let inputs = golden("runner/t2v__inputs.safetensors");
    expect_failure(dir.path(), &model, &inputs, &[], &["blocks.3.", "missing"]);
}

#[test]
fn boundary_ratio_without_a_second_expert_is_refused() {
    let dir = tmp();
    expect_failure(
        dir.path(),
        &golden("models/t2v"),
        &golden("runner/t2v__inputs.safetensors"),
        &["--steps", "2", "--boundary-ratio", "0.9"],
        &["boundary ratio 0.9", "transformer_2"],
    );
}

/// Writes the diffusers model folder `src` as a model folder `dest` in `layout` (f32 kept)
/// through the library's restack (the one executor and release writer), config.json
/// stamped with the layout.
fn restack(src: &Path, layout: &str, dest: &Path) {
    let to: Layout = layout.parse().unwrap();
    let options = RestackOptions {
        from: Some(Layout::Diffusers),
        to,
        dtype: OutputDType::Keep,
        keep_f32: None,
        shard_bytes: None,
        replace: Replace::Never,
        config: None,
        nonfinite: wanbake::pipeline::NonFinite::Refuse,
    };
    if let Some(parent) = dest.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    restack_release(
        src,
        dest,
        &options,
        &ExecOptions::default(),
        Hooks::default(),
    )
    .unwrap();
    // An nnx output is named as wanbake's own (`Layout::weights_stem`).
    let file = format!("{}.safetensors", to.weights_stem("diffusion_pytorch_model"));
    let out = SafetensorsFile::open(&dest.join(file)).unwrap();
    assert!(
        out.view("proj_out.weight").is_none(),
        "{layout}: the conversion kept diffusers names"
    );
}

/// The output tensor's raw bytes (the values, bit for bit).
fn raw(path: &Path, name: &str) -> Vec<u8> {
    let f = SafetensorsFile::open(path).unwrap();
    f.view(name).unwrap().bytes.to_vec()
}

fn check_layouts(model: &str, original: &str, comfy: Option<&str>) {
    let dir = tmp();
    let d = dir.path();
    let diffusers = golden(&format!("models/{model}"));
    let config = diffusers.join("config.json");
    let inputs = golden(&format!("runner/{model}__inputs.safetensors"));
    let mut cases: Vec<(String, PathBuf, Vec<&str>)> =
        vec![("diffusers".into(), diffusers.clone(), vec![])];
    let config_arg = ["--config", path_str(&config)];
    cases.push((
        "original file".into(),
        golden(&format!("models/{original}")),
        config_arg.to_vec(),
    ));
    if let Some(c) = comfy {
        cases.push((
            "comfy-prefixed file".into(),
            golden(&format!("models/{c}")),
            config_arg.to_vec(),
        ));
    }
    for layout in ["wan", "nnx", "nnx-scanned"] {
        let dest = d.join(layout);
        restack(&diffusers, layout, &dest);
        cases.push((format!("restacked {layout}"), dest, vec![]));
    }
    let mut reference: Option<Vec<u8>> = None;
    for (i, (label, path, extra)) in cases.iter().enumerate() {
        let sub = d.join(format!("run{i}"));
        std::fs::create_dir(&sub).unwrap();
        let (out, _) = run_model(&sub, path, &inputs, extra);
        let bytes = raw(&out, "noise_pred");
        match &reference {
            None => reference = Some(bytes),
            Some(r) => assert!(
                r == &bytes,
                "{model}: {label} gives different bits than diffusers layout"
            ),
        }
    }
}

#[test]
fn every_layout_of_t2v_gives_bit_identical_outputs() {
    check_layouts(
        "t2v",
        "t2v_original.safetensors",
        Some("t2v_comfy.safetensors"),
    );
}

#[test]
fn every_layout_of_i2v_gives_bit_identical_outputs() {
    check_layouts("i2v", "i2v_original.safetensors", None);
}

#[test]
fn restacked_a14b_pipeline_samples_bit_identically() {
    let dir = tmp();
    let d = dir.path();
    let src = golden("models/a14b");
    let dest = d.join("a14b-nnx-scanned");
    for expert in ["transformer", "transformer_2"] {
        restack(&src.join(expert), "nnx-scanned", &dest.join(expert));
    }
    // model_index.json carries the boundary.
    std::fs::copy(src.join("model_index.json"), dest.join("model_index.json")).unwrap();
    let args = [
        "--steps",
        "4",
        "--shift",
        "5",
        "--guidance",
        "4",
        "--guidance-2",
        "3",
    ];
    let inputs = golden("runner/t2v__inputs.safetensors");
    let mut outs = Vec::new();
    for (i, m) in [&src, &dest].into_iter().enumerate() {
        let sub = d.join(format!("run{i}"));
        std::fs::create_dir(&sub).unwrap();
        let (out, _) = run_model(&sub, m, &inputs, &args);
        outs.push(raw(&out, "latents"));
    }
    assert!(
        outs[0] == outs[1],
        "nnx-scanned A14B sampled different bits"
    );
}

#[test]
fn original_file_without_config_is_refused_with_a_hint() {
    let dir = tmp();
    expect_failure(
        dir.path(),
        &golden("models/t2v_original.safetensors"),
        &golden("runner/t2v__inputs.safetensors"),
        &[],
        &["no config.json", "head count", "--config"],
    );
}

// ---- VACE (golden/variants/vace, made by golden/variants_vace_golden.py from diffusers
// 0.42.1 `WanVACETransformer3DModel` forwards) ----

fn vace(rel: &str) -> PathBuf {
    golden(&format!("variants/vace/{rel}"))
}

/// Runs the tiny VACE model (any layout, `extra` args) on `inputs`; returns `noise_pred`.
fn run_vace(dir: &Path, model: &Path, inputs: &Path, extra: &[&str]) -> Tensor {
    let (out, _) = run_model(dir, model, inputs, extra);
    read(&out, "noise_pred")
}

fn check_vace_forward(case: &str) {
    let dir = tmp();
    let inputs = vace(&format!("runner/{case}_inputs.safetensors"));
    let got = run_vace(dir.path(), &vace("models/vace"), &inputs, &[]);
    let want = read(
        &vace(&format!("runner/{case}_forward.safetensors")),
        "noise_pred",
    );
    let err = max_abs_err(&got, &want);
    eprintln!(
        "{case} forward: max abs error {err:e} (max |ref| {})",
        max_abs(&want)
    );
    assert!(
        err <= FORWARD_TOL,
        "{case}: max abs error {err} > {FORWARD_TOL}"
    );
}

#[test]
fn vace_forward_matches_diffusers() {
    // control_hidden_states_scale [0.7, 1.3], hints after blocks 0 and 2 of 4.
    check_vace_forward("vace_");
}

#[test]
fn vace_short_control_is_zero_padded_after_the_patch_embedding() {
    // 12 control tokens for an 18-token video.
    let inputs = RunInputs::read(&vace("runner/vace__short_control_inputs.safetensors")).unwrap();
    assert_eq!(
        inputs.control_hidden_states.as_ref().unwrap().shape,
        vec![1, 6, 2, 4, 6]
    );
    check_vace_forward("vace__short_control");
}

#[test]
fn every_layout_of_vace_gives_bit_identical_outputs() {
    let dir = tmp();
    let d = dir.path();
    let diffusers = vace("models/vace");
    let config = diffusers.join("config.json");
    let config_arg = vec!["--config", path_str(&config)];
    let mut cases: Vec<(String, PathBuf, Vec<&str>)> =
        vec![("diffusers".into(), diffusers.clone(), vec![])];
    for file in [
        "vace_original.safetensors",
        "vace_comfy.safetensors",
        "vace_nnx.safetensors",
    ] {
        cases.push((
            file.into(),
            vace(&format!("models/{file}")),
            config_arg.clone(),
        ));
    }
    // MaxDiffusion's WanVACEModel has no scanned form, so neither has wanbake.
    for layout in ["wan", "nnx"] {
        let dest = d.join(layout);
        restack(&diffusers, layout, &dest);
        cases.push((format!("restacked {layout}"), dest, vec![]));
    }
    let inputs = vace("runner/vace__inputs.safetensors");
    let mut reference: Option<Vec<u8>> = None;
    for (i, (label, path, extra)) in cases.iter().enumerate() {
        let sub = d.join(format!("run{i}"));
        std::fs::create_dir(&sub).unwrap();
        let (out, _) = run_model(&sub, path, &inputs, extra);
        let bytes = raw(&out, "noise_pred");
        match &reference {
            None => reference = Some(bytes),
            Some(r) => assert!(r == &bytes, "vace: {label} gives different bits"),
        }
    }
}

#[test]
fn vace_scale_defaults_to_ones() {
    let v = RunInputs::read(&vace("runner/vace__inputs.safetensors")).unwrap();
    let control = v.control_hidden_states.as_ref().unwrap();
    let ones = Tensor::new(vec![2], vec![1.0, 1.0]);
    let model = vace("models/vace");
    let mut outs = Vec::new();
    for scale in [None, Some(&ones)] {
        let dir = tmp();
        let mut tensors = vec![
            ("hidden_states", &v.hidden_states),
            ("timestep", &v.timestep),
            ("encoder_hidden_states", &v.encoder_hidden_states),
            ("control_hidden_states", control),
        ];
        tensors.extend(scale.map(|s| ("control_hidden_states_scale", s)));
        let p = inputs_file(dir.path(), &tensors);
        outs.push(run_vace(dir.path(), &model, &p, &[]));
    }
    assert_eq!(outs[0], outs[1], "no scale differs from scale ones");
    // And the golden's scale [0.7, 1.3] gives another output: the scale is applied.
    let want = read(&vace("runner/vace__forward.safetensors"), "noise_pred");
    assert!(max_abs_err(&outs[0], &want) > 1e-3);
}

#[test]
fn bad_vace_inputs_are_refused_with_expected_and_found() {
    let v = RunInputs::read(&vace("runner/vace__inputs.safetensors")).unwrap();
    let model = vace("models/vace");
    let (hs, ts, ehs) = (&v.hidden_states, &v.timestep, &v.encoder_hidden_states);
    let control = v.control_hidden_states.as_ref().unwrap();
    let scale = v.control_hidden_states_scale.as_ref().unwrap();
    let base = [
        ("hidden_states", hs),
        ("timestep", ts),
        ("encoder_hidden_states", ehs),
    ];
    let case = |extra: &[(&str, &Tensor)], model: &Path, args: &[&str], needles: &[&str]| {
        let dir = tmp();
        let mut tensors = base.to_vec();
        tensors.extend_from_slice(extra);
        let p = inputs_file(dir.path(), &tensors);
        expect_failure(dir.path(), model, &p, args, needles);
    };
    // A VACE model without control latents.
    case(
        &[],
        &model,
        &[],
        &[
            "control_hidden_states",
            "missing",
            "VACE",
            "(1, vace_in_channels = 6, F, H, W)",
        ],
    );
    // A plain T2V model with control latents (the t2v golden has the same dims).
    let t2v = RunInputs::read(&golden("runner/t2v__inputs.safetensors")).unwrap();
    let dir = tmp();
    let p = inputs_file(
        dir.path(),
        &[
            ("hidden_states", &t2v.hidden_states),
            ("timestep", &t2v.timestep),
            ("encoder_hidden_states", &t2v.encoder_hidden_states),
            ("control_hidden_states", control),
        ],
    );
    expect_failure(
        dir.path(),
        &golden("models/t2v"),
        &p,
        &[],
        &["control_hidden_states", "not a VACE model"],
    );
    // Wrong channel count.
    let wrong = Tensor::zeros(vec![1, 5, 3, 4, 6]);
    case(
        &[("control_hidden_states", &wrong)],
        &model,
        &[],
        &[
            "control_hidden_states",
            "vace_in_channels = 6",
            "[1, 5, 3, 4, 6]",
        ],
    );
    // More control tokens than video tokens (diffusers fails on a negative padding).
    let longer = Tensor::zeros(vec![1, 6, 6, 4, 6]);
    case(
        &[("control_hidden_states", &longer)],
        &model,
        &[],
        &["control_hidden_states", "36 control tokens", "18 tokens"],
    );
    // A scale of the wrong length.
    let three = Tensor::zeros(vec![3]);
    case(
        &[
            ("control_hidden_states", control),
            ("control_hidden_states_scale", &three),
        ],
        &model,
        &[],
        &["control_hidden_states_scale", "expected shape (2)", "[3]"],
    );
    // A scale without control latents.
    case(
        &[("control_hidden_states_scale", scale)],
        &model,
        &[],
        &[
            "control_hidden_states_scale",
            "without control_hidden_states",
        ],
    );
    // Sampling: the runner runs VACE as a single forward only.
    case(
        &[("control_hidden_states", control)],
        &model,
        &["--steps", "2", "--guidance", "1"],
        &["control_hidden_states", "single forward"],
    );
    case(
        &[],
        &model,
        &["--steps", "2", "--guidance", "1"],
        &["VACE", "single forward"],
    );
}

// ---- SkyReels-V2 DF (golden/variants/skyreels, made by golden/variants_vace_golden.py from
// diffusers 0.42.1 `SkyReelsV2Transformer3DModel` forwards, fps index 1) ----

fn sky(rel: &str) -> PathBuf {
    golden(&format!("variants/skyreels/{rel}"))
}

fn check_sky(got: &Tensor, golden_file: &str) {
    let want = read(&sky(&format!("runner/{golden_file}")), "noise_pred");
    let err = max_abs_err(got, &want);
    eprintln!(
        "{golden_file}: max abs error {err:e} (max |ref| {})",
        max_abs(&want)
    );
    assert!(
        err <= FORWARD_TOL,
        "{golden_file}: max abs error {err} > {FORWARD_TOL}"
    );
}

#[test]
fn skyreels_fps_forward_matches_diffusers_in_every_layout() {
    let dir = tmp();
    let d = dir.path();
    let diffusers = sky("models/skyreels_df");
    let config = diffusers.join("config.json");
    let wan = d.join("wan");
    restack(&diffusers, "wan", &wan);
    let cases: [(&Path, Vec<&str>); 3] = [
        (&diffusers, vec![]),
        (
            &sky("models/skyreels_df_original.safetensors"),
            vec!["--config", path_str(&config)],
        ),
        (&wan, vec![]),
    ];
    let inputs = sky("runner/skyreels_df__inputs.safetensors");
    let mut outs = Vec::new();
    for (i, (model, extra)) in cases.iter().enumerate() {
        let sub = d.join(format!("run{i}"));
        std::fs::create_dir(&sub).unwrap();
        let (out, _) = run_model(&sub, model, &inputs, extra);
        outs.push(read(&out, "noise_pred"));
    }
    check_sky(&outs[0], "skyreels_df__forward.safetensors");
    assert!(outs.iter().all(|o| o == &outs[0]), "layouts differ");
}

#[test]
fn skyreels_diffusion_forcing_gives_each_frame_its_timestep() {
    // The golden's per-latent-frame timestep (1, 3) with the fps inputs of the plain forward.
    let s = RunInputs::read(&sky("runner/skyreels_df__inputs.safetensors")).unwrap();
    let df_golden = sky("runner/skyreels_df__forward_df.safetensors");
    let timestep = read(&df_golden, "timestep");
    assert_eq!(timestep.shape, vec![1, 3]);
    let dir = tmp();
    let p = inputs_file(
        dir.path(),
        &[
            ("hidden_states", &s.hidden_states),
            ("timestep", &timestep),
            ("encoder_hidden_states", &s.encoder_hidden_states),
            ("fps", s.fps.as_ref().unwrap()),
        ],
    );
    let (out, _) = run_model(dir.path(), &sky("models/skyreels_df"), &p, &[]);
    check_sky(
        &read(&out, "noise_pred"),
        "skyreels_df__forward_df.safetensors",
    );
}

#[test]
fn bad_skyreels_inputs_are_refused() {
    let s = RunInputs::read(&sky("runner/skyreels_df__inputs.safetensors")).unwrap();
    let base = [
        ("hidden_states", &s.hidden_states),
        ("timestep", &s.timestep),
        ("encoder_hidden_states", &s.encoder_hidden_states),
    ];
    let case = |extra: &[(&str, &Tensor)], model: &Path, args: &[&str], needles: &[&str]| {
        let dir = tmp();
        let mut tensors = base.to_vec();
        tensors.extend_from_slice(extra);
        let p = inputs_file(dir.path(), &tensors);
        expect_failure(dir.path(), model, &p, args, needles);
    };
    let model = sky("models/skyreels_df");
    case(&[], &model, &[], &["fps", "missing", "inject_sample_info"]);
    let two = Tensor::new(vec![1], vec![2.0]);
    case(&[("fps", &two)], &model, &[], &["fps", "0 or 1", "found 2"]);
    let wide = Tensor::new(vec![2], vec![1.0, 1.0]);
    case(
        &[("fps", &wide)],
        &model,
        &[],
        &["fps", "expected shape (1)", "[2]"],
    );
    let fps = s.fps.as_ref().unwrap();
    case(
        &[("fps", fps)],
        &golden("models/t2v"),
        &[],
        &["fps", "no fps embedding"],
    );
    case(
        &[("fps", fps)],
        &model,
        &["--steps", "2", "--guidance", "1"],
        &["fps", "single forward"],
    );
    case(
        &[],
        &model,
        &["--steps", "2", "--guidance", "1"],
        &["SkyReels-V2", "single forward"],
    );
    // Causal block attention is not implemented: such a config is refused.
    let dir = tmp();
    let folder = dir.path().join("model");
    std::fs::create_dir(&folder).unwrap();
    let weights = "diffusion_pytorch_model.safetensors";
    std::fs::copy(model.join(weights), folder.join(weights)).unwrap();
    let cfg = std::fs::read_to_string(model.join("config.json")).unwrap();
    let cfg = cfg.replace("\"num_frame_per_block\": 1", "\"num_frame_per_block\": 3");
    assert!(
        cfg.contains("\"num_frame_per_block\": 3"),
        "config edit did not apply"
    );
    std::fs::write(folder.join("config.json"), cfg).unwrap();
    let p = inputs_file(
        dir.path(),
        &[("fps", fps)]
            .iter()
            .chain(&base)
            .copied()
            .collect::<Vec<_>>(),
    );
    expect_failure(
        dir.path(),
        &folder,
        &p,
        &[],
        &["num_frame_per_block = 3", "causal"],
    );
}
