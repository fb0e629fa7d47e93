//! Output bytes do not change under refactoring: a fixed set of producing commands (merges of
//! every convention and kind, layouts, restacks, converts, translations, synth, the runner)
//! is run on the golden fixtures, and every output file except the manifests is compared
//! with the sha256 recorded by wanbake's own binary at commit bb87b0c, before the pipeline
//! work of issue 13 (`tests/digests/self_recorded_outputs_bb87b0c.sha256`). That file is a
//! tripwire, not an oracle: it says the bytes did not move, not that they are right (the
//! references in golden/ say that). Manifests are left out: they record paths and the
//! tool's report, which legitimately grow. A change that moves any output byte fails here,
//! naming the file; if the change is meant (a new rounding, a fixed bug), record the new
//! digests with the reason in the commit.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::*;

fn cases(g: &Path) -> Vec<(&'static str, Vec<String>)> {
    let p = |s: &str| g.join(s).display().to_string();
    let v = |xs: &[&str]| xs.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let merge = |out: &str, args: &[String]| {
        let mut a = v(&["merge", "--base"]);
        a.extend(args.iter().cloned());
        a.extend(v(&["--out", out, "--device", "cpu"]));
        a
    };
    let t2v = p("models/t2v");
    let sa3 = p("sa3/base/model.safetensors");
    let mut out = vec![
        (
            "m_bf16",
            merge(
                "m_bf16",
                &[
                    t2v.clone(),
                    "--adapter".into(),
                    p("adapters/peft_plain"),
                    "--adapter".into(),
                    format!("{}:0.5", p("adapters/kohya_lora/kohya_lora.safetensors")),
                    "--dtype".into(),
                    "bf16".into(),
                ],
            ),
        ),
        (
            "m_f32",
            merge(
                "m_f32",
                &[
                    t2v.clone(),
                    "--adapter".into(),
                    format!("{}:0.7", p("adapters/peft_plain")),
                    "--adapter".into(),
                    p("adapters/comfy_lora/comfy_lora.safetensors"),
                    "--dtype".into(),
                    "f32".into(),
                ],
            ),
        ),
        (
            "m_scan",
            merge(
                "m_scan",
                &[
                    t2v.clone(),
                    "--adapter".into(),
                    p("adapters/diffusers_lora"),
                    "--dtype".into(),
                    "bf16".into(),
                    "--layout".into(),
                    "nnx-scanned".into(),
                ],
            ),
        ),
        (
            "m_wan",
            merge(
                "m_wan",
                &[
                    t2v.clone(),
                    "--adapter".into(),
                    p("adapters/peft_dora"),
                    "--layout".into(),
                    "wan".into(),
                ],
            ),
        ),
        (
            "m_dora",
            merge(
                "m_dora",
                &[
                    t2v.clone(),
                    "--adapter".into(),
                    format!("{}:0.6", p("adapters/peft_dora")),
                    "--adapter".into(),
                    p("adapters/peft_rslora_pattern"),
                    "--dtype".into(),
                    "bf16".into(),
                    "--dora-strength".into(),
                    "peft".into(),
                ],
            ),
        ),
        (
            "m_bias",
            merge(
                "m_bias",
                &[t2v.clone(), "--adapter".into(), p("adapters/peft_bias")],
            ),
        ),
        (
            "m_ref",
            merge(
                "m_ref",
                &[
                    t2v.clone(),
                    "--adapter".into(),
                    p("adapters/peft_plain"),
                    "--dtype".into(),
                    "bf16".into(),
                    "--threads".into(),
                    "1".into(),
                ],
            ),
        ),
        (
            "m_a14b",
            merge(
                "m_a14b",
                &[
                    p("models/a14b"),
                    "--adapter".into(),
                    format!("transformer={}", p("adapters/a14b_pair/high.safetensors")),
                    "--adapter".into(),
                    format!("transformer_2={}", p("adapters/a14b_pair/low.safetensors")),
                    "--dtype".into(),
                    "bf16".into(),
                ],
            ),
        ),
        (
            "m_i2v",
            merge(
                "m_i2v",
                &[
                    p("models/i2v"),
                    "--adapter".into(),
                    p("adapters/comfy_i2v/comfy_i2v.safetensors"),
                    "--adapter".into(),
                    p("adapters/peft_i2v"),
                    "--dtype".into(),
                    "bf16".into(),
                ],
            ),
        ),
        (
            "sa3_peft",
            merge(
                "sa3_peft",
                &[
                    sa3.clone(),
                    "--adapter".into(),
                    p("sa3/peft_dora"),
                    "--adapter".into(),
                    format!("{}:0.3", p("sa3/peft_lora")),
                ],
            ),
        ),
        (
            "rs_scan",
            v(&["restack", &t2v, "--to", "nnx-scanned", "--out", "rs_scan"]),
        ),
        (
            "rs_wan",
            v(&[
                "restack", &t2v, "--to", "wan", "--out", "rs_wan", "--dtype", "bf16",
            ]),
        ),
        (
            "rs_nnx",
            v(&[
                "restack",
                &p("models/t2v_original.safetensors"),
                "--to",
                "nnx",
                "--out",
                "rs_nnx",
            ]),
        ),
        (
            "rs_back",
            v(&[
                "restack",
                "rs_scan",
                "--to",
                "diffusers",
                "--out",
                "rs_back",
            ]),
        ),
        (
            "cv_bf16",
            v(&["convert", &t2v, "--dtype", "bf16", "--out", "cv_bf16"]),
        ),
        (
            "cv_f16",
            v(&[
                "convert",
                &p("models/a14b"),
                "--dtype",
                "f16",
                "--out",
                "cv_f16",
            ]),
        ),
        (
            "tr_comfy",
            v(&[
                "translate",
                &p("adapters/peft_plain"),
                "--to",
                "comfy",
                "--out",
                "tr_comfy",
            ]),
        ),
        (
            "tr_kohya",
            v(&[
                "translate",
                &p("adapters/diffusers_lora"),
                "--to",
                "kohya",
                "--out",
                "tr_kohya",
            ]),
        ),
        (
            "synth",
            v(&[
                "synth",
                "--model",
                "wan2.1-t2v-1.3b",
                "--layers",
                "1",
                "--dtype",
                "bf16",
                "--out",
                "synth",
            ]),
        ),
        (
            "run1",
            v(&[
                "run",
                "--model",
                "m_bf16",
                "--inputs",
                &p("runner/t2v__inputs.safetensors"),
                "--out",
                "run1.safetensors",
            ]),
        ),
    ];
    for k in [
        "lora",
        "lora-xs",
        "dora-rows",
        "dora-cols",
        "dora-rows-xs",
        "dora-cols-xs",
        "bora",
        "bora-xs",
        "dora-legacy-1d",
    ] {
        let name: &'static str = Box::leak(format!("sa3_{k}").into_boxed_str());
        out.push((
            name,
            merge(
                name,
                &[
                    sa3.clone(),
                    "--adapter".into(),
                    p(&format!("sa3/adapters/{k}.safetensors")),
                    "--dtype".into(),
                    "bf16".into(),
                ],
            ),
        ));
    }
    out
}

#[test]
fn outputs_are_byte_identical_to_those_recorded_before_the_pipeline_refactor() {
    use sha2::Digest;
    let g = repo().join("golden");
    let recorded = repo().join("tests/digests/self_recorded_outputs_bb87b0c.sha256");
    let expected: BTreeMap<String, String> = std::fs::read_to_string(recorded)
        .unwrap()
        .lines()
        .filter_map(|l| l.split_once("  "))
        .map(|(h, p)| (p.to_string(), h.to_string()))
        .collect();
    let t = tmp();
    for (name, args) in cases(&g) {
        let mut a: Vec<&str> = vec!["-q"];
        a.extend(args.iter().map(String::as_str));
        let (code, _, err) = parts(&run(t.path(), &a));
        assert_eq!(code, 0, "{name}: {err}");
    }
    let mut got = tree(t.path());
    got.retain(|f| t.path().join(f).is_file() && !f.ends_with("wanbake.manifest.json"));
    let listed: Vec<&String> = expected.keys().collect();
    assert_eq!(
        got.iter().collect::<Vec<_>>(),
        listed,
        "the set of output files changed"
    );
    for f in &got {
        let sha = wanbake::io::digest::hex(&sha2::Sha256::digest(
            std::fs::read(t.path().join(f)).unwrap(),
        ));
        assert_eq!(&sha, &expected[f], "{f}: output bytes changed");
    }
}
