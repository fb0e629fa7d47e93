//! `inspect` as a user reads it (issue 33): `--keys[=GLOB]` lists every tensor's name, dtype
//! and shape (checked against the reference readers: the `safetensors` crate for
//! safetensors, gguf-py's `GGUFReader` for GGUF via `golden/quant/gguf_written.json`).

mod common;

use std::path::Path;

use common::*;
use serde_json::Value;

/// (name, dtype, shape) of every tensor of a safetensors file, read by the reference crate.
fn reference_keys(path: &Path) -> Vec<(String, String, Vec<usize>)> {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut v: Vec<_> = st
        .tensors()
        .into_iter()
        .map(|(n, t)| (n, format!("{:?}", t.dtype()), t.shape().to_vec()))
        .collect();
    v.sort();
    v
}

fn keys_json(args: &[&str]) -> Value {
    let mut all = vec!["inspect", "--json"];
    all.extend_from_slice(args);
    serde_json::from_str(&ok(run(&repo(), &all))).unwrap()
}

fn rows(doc: &Value) -> Vec<(String, String, Vec<usize>)> {
    doc["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["name"].as_str().unwrap().to_string(),
                t["dtype"].as_str().unwrap().to_string(),
                serde_json::from_value(t["shape"].clone()).unwrap(),
            )
        })
        .collect()
}

#[test]
fn keys_lists_every_tensor_as_the_reference_reader_sees_it() {
    let file = "golden/models/t2v/diffusion_pytorch_model.safetensors";
    let want = reference_keys(&repo().join(file));
    assert_eq!(want.len(), 96);
    // A file, its folder and an adapter folder.
    for path in [file, "golden/models/t2v"] {
        let doc = keys_json(&["--keys", path]);
        assert_eq!(rows(&doc[0]), want, "{path}");
    }
    let adapter = "golden/adapters/peft_plain";
    let doc = keys_json(&["--keys", adapter]);
    assert_eq!(
        rows(&doc[0]),
        reference_keys(&repo().join(adapter).join("adapter_model.safetensors"))
    );
    // The text: one aligned line per tensor, nothing else.
    let text = ok(run(&repo(), &["inspect", "--keys", file]));
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), want.len(), "{text}");
    for (line, (name, dtype, shape)) in lines.iter().zip(&want) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let shape: Vec<String> = shape.iter().map(usize::to_string).collect();
        assert_eq!(fields[0], name);
        assert_eq!(fields[1], dtype);
        assert_eq!(fields[2..].join(" "), format!("[{}]", shape.join(", ")));
    }
}

#[test]
fn a_glob_keeps_the_names_it_matches() {
    let file = "golden/models/t2v/diffusion_pytorch_model.safetensors";
    let glob_want = |keep: &dyn Fn(&str) -> bool| -> Vec<_> {
        reference_keys(&repo().join(file))
            .into_iter()
            .filter(|(n, _, _)| keep(n))
            .collect()
    };
    let doc = keys_json(&["--keys=blocks.?.attn1.to_*.weight", file]);
    let want = glob_want(&|n| {
        n.starts_with("blocks.")
            && n.ends_with(".weight")
            && n.split('.').nth(2) == Some("attn1")
            && n.split('.').nth(3).is_some_and(|s| s.starts_with("to_"))
            && n.split('.').nth(1).is_some_and(|b| b.len() == 1)
    });
    // 3 blocks x to_q, to_k, to_v, to_out.0
    assert_eq!(want.len(), 12);
    assert_eq!(rows(&doc[0]), want);
    let doc = keys_json(&["--keys=*bias", file]);
    assert_eq!(rows(&doc[0]), glob_want(&|n| n.ends_with("bias")));
    // A pipeline: each component's tensors, named component/name in the text.
    let doc = keys_json(&["--keys=patch_embedding.weight", "golden/models/a14b"]);
    let comps: Vec<&str> = doc[0]["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["component"].as_str().unwrap())
        .collect();
    assert_eq!(comps, ["transformer", "transformer_2"]);
    let text = ok(run(
        &repo(),
        &[
            "inspect",
            "--keys=patch_embedding.weight",
            "golden/models/a14b",
        ],
    ));
    assert!(
        text.starts_with("transformer/patch_embedding.weight "),
        "{text}"
    );
    // Nothing matches: said, exit code 1.
    let (code, _, err) = parts(&run(&repo(), &["inspect", "--keys=nothing*", file]));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("no tensor name matches `nothing*`"), "{err}");
    // A glob written after a space is a path: the message says how to write it.
    let (code, _, err) = parts(&run(&repo(), &["inspect", "--keys", "blocks.*", file]));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("--keys=GLOB"), "{err}");
}

#[test]
fn keys_of_a_gguf_are_what_gguf_py_reads() {
    // gguf-py's GGUFReader on the same file (golden/quant_golden.py).
    let reader: Value = serde_json::from_slice(
        &std::fs::read(repo().join("golden/quant/gguf_written.json")).unwrap(),
    )
    .unwrap();
    // ggml.h's `enum ggml_type` values of the types the file holds.
    let type_name = |id: u64| match id {
        0 => "F32",
        1 => "F16",
        8 => "Q8_0",
        30 => "BF16",
        other => panic!("type {other} not in the fixture"),
    };
    let want: Vec<(String, String, Vec<usize>)> = reader["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let ne: Vec<usize> = serde_json::from_value(t["ne"].clone()).unwrap();
            (
                t["name"].as_str().unwrap().to_string(),
                type_name(t["type"].as_u64().unwrap()).to_string(),
                ne.into_iter().rev().collect(),
            )
        })
        .collect();
    let doc = keys_json(&["--keys", "golden/quant/gguf_written.gguf"]);
    assert_eq!(rows(&doc[0]), want);
    let doc = keys_json(&["--keys=blocks.0.*", "golden/quant/gguf_written.gguf"]);
    let blocks: Vec<_> = want
        .iter()
        .filter(|r| r.0.starts_with("blocks.0."))
        .cloned()
        .collect();
    assert_eq!(blocks.len(), 3);
    assert_eq!(rows(&doc[0]), blocks);
}

/// `inspect`'s text (issue 33): the kind in words (no Rust type name), counts with
/// thousands separators and agreeing nouns, sizes in the one decimal unit style, for
/// safetensors and GGUF alike. The counts are computed here from the files with the
/// reference `safetensors` reader (the GGUF is the same tiny T2V, quantized by gguf-py).
#[test]
fn the_text_reads_as_words_with_grouped_counts_and_decimal_sizes() {
    let file = repo().join("golden/models/t2v/diffusion_pytorch_model.safetensors");
    let bytes = std::fs::read(&file).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let params: usize = st
        .tensors()
        .iter()
        .map(|(_, t)| t.shape().iter().product::<usize>())
        .sum();
    assert_eq!(params, 53_632);
    let text = ok(run(&repo(), &["inspect", "golden/models/t2v"]));
    assert!(
        text.starts_with("golden/models/t2v (model folder: config.json and weights)\n"),
        "{text}"
    );
    // 223,264 bytes on disk: 223.26 kB; 96 F32 tensors of data: 4 × 53,632 = 214.53 kB.
    assert_eq!(bytes.len(), 223_264);
    for line in [
        "    tensors:    96 (53,632 parameters, 214.53 kB)",
        "    dtypes:     F32: 96 tensors / 53,632 params",
        "diffusion_pytorch_model.safetensors (223.26 kB, 96 tensors)",
    ] {
        assert!(text.contains(line), "`{line}` not in\n{text}");
    }
    let kinds = [
        ("golden/models/t2v_original.safetensors", "safetensors file"),
        ("golden/adapters/peft_plain", "PEFT adapter folder"),
        ("golden/models/a14b", "pipeline folder"),
    ];
    for (path, kind) in kinds {
        let text = ok(run(&repo(), &["inspect", path]));
        assert!(text.starts_with(&format!("{path} ({kind})\n")), "{text}");
    }
    let text = ok(run(
        &repo(),
        &["inspect", "golden/quant/expect_t2v_q8_0.gguf"],
    ));
    let gguf_len = std::fs::metadata(repo().join("golden/quant/expect_t2v_q8_0.gguf"))
        .unwrap()
        .len();
    let kb = format!("{:.2} kB", gguf_len as f64 / 1000.0);
    assert!(
        text.contains(&format!("    tensors:    96 (53,632 parameters, {kb})")),
        "{text}"
    );
    assert!(!text.contains("(s)") && !text.contains("bytes"), "{text}");
}
