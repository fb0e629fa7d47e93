//! LyCORIS adapters through the real binary (issue 14): every kind of
//! golden/adapters/lycoris, in LyCORIS's own `lycoris_<diffusers module>` naming and in the
//! kohya `lora_unet_<original module>` naming, merged into the tiny WAN of golden/models/t2v
//! and compared with the references lycoris-lora 4.1.3's rebuild-mode training forward made
//! (golden/lycoris_golden.py): f32 within 1e-5 of max|ref|, bf16 within one ulp of the
//! rounded reference, λ = 0.5 against `W0 + λ·(f(W0) − W0)`, every other tensor untouched.
//! Then the scale traps, mixed files, inspect, translate and the malformed-input refusals
//! (each naming the module and the shapes, with nothing written).

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::{parts, run, tmp, tree, write_f32};
use wanbake::io::{Checkpoint, DType};

/// (case, diffusers target module) of every golden case.
const CASES: [(&str, &str); 18] = [
    ("loha", "blocks.0.attn1.to_q"),
    ("lokr_w2ab", "blocks.0.ffn.net.0.proj"),
    ("lokr_both_dec", "blocks.1.ffn.net.0.proj"),
    ("lokr_full", "blocks.1.attn1.to_v"),
    ("oft", "blocks.2.attn1.to_out.0"),
    ("oft_free", "blocks.2.attn2.to_q"),
    ("boft", "blocks.0.ffn.net.2"),
    ("glora", "blocks.2.ffn.net.0.proj"),
    ("ia3_out", "blocks.1.attn1.to_q"),
    ("ia3_in", "blocks.1.attn2.to_q"),
    ("full", "blocks.0.attn1.to_v"),
    ("conv_loha", "patch_embedding"),
    ("conv_lokr", "patch_embedding"),
    ("conv_lokr_full", "patch_embedding"),
    ("conv_oft", "patch_embedding"),
    ("conv_ia3_in", "patch_embedding"),
    ("conv_loha_tucker", "patch_embedding"),
    ("conv_lokr_tucker", "patch_embedding"),
];

fn golden(rel: &str) -> PathBuf {
    common::repo().join("golden").join(rel)
}

fn base() -> PathBuf {
    golden("models/t2v")
}

/// Every tensor of a checkpoint (file or folder): name → (dtype, shape, bytes).
type Tensors = BTreeMap<String, (DType, Vec<usize>, Vec<u8>)>;

fn tensors(path: &Path) -> Tensors {
    let ck = Checkpoint::open_stored(path).expect("open checkpoint");
    let comp = ck.single().expect("one component");
    comp.tensors
        .tensors()
        .map(|t| {
            let v = t.view;
            (
                v.name.to_string(),
                (v.dtype, v.shape.to_vec(), v.bytes.to_vec()),
            )
        })
        .collect()
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn bf16_ulps(a: u16, b: u16) -> u32 {
    let ordered = |x: u16| -> i32 {
        if x & 0x8000 != 0 {
            -i32::from(x & 0x7fff)
        } else {
            i32::from(x)
        }
    };
    (ordered(a) - ordered(b)).unsigned_abs()
}

/// Merges `adapter` at `strength` into the golden base with `dtype`; returns the output
/// tensors.
fn merge(dir: &Path, adapter: &Path, strength: &str, dtype: &str) -> Tensors {
    let out = dir.join(format!("out-{dtype}-{strength}"));
    let spec = format!("{}:{strength}", adapter.display());
    let o = run(
        dir,
        &[
            "merge",
            "--base",
            base().to_str().unwrap(),
            "--adapter",
            &spec,
            "--dtype",
            dtype,
            "--out",
            out.to_str().unwrap(),
        ],
    );
    common::ok(o);
    tensors(&out)
}

/// Checks one output against a reference file: the targets it names within 1e-5 of
/// max|ref| (f32) or one bf16 ulp of the rounded reference, every other tensor equal to the
/// base (f32) or its rounding (bf16).
fn check(what: &str, got: &Tensors, reference: &Path, dtype: DType) {
    check_named(what, got, reference, dtype, false);
}

/// `check`, or with `named_only` the reference's tensors alone.
fn check_named(what: &str, got: &Tensors, reference: &Path, dtype: DType, named_only: bool) {
    let refs = tensors(reference);
    let base = tensors(&base());
    for (name, (_, shape, bytes)) in &base {
        if named_only && !refs.contains_key(name) {
            continue;
        }
        let (gd, gs, gb) = got.get(name).expect("tensor in output");
        assert_eq!(gs, shape, "{what}: {name} shape");
        let want = match refs.get(name) {
            Some((_, _, r)) => f32s(r),
            None => f32s(bytes),
        };
        match dtype {
            DType::F32 => {
                assert_eq!(*gd, DType::F32);
                let g = f32s(gb);
                let scale = want.iter().fold(0f32, |a, b| a.max(b.abs()));
                let err = g
                    .iter()
                    .zip(&want)
                    .fold(0f32, |a, (x, y)| a.max((x - y).abs()));
                if refs.contains_key(name) {
                    assert!(
                        err <= 1e-5 * scale,
                        "{what}: {name}: max error {err} > 1e-5 × {scale}"
                    );
                    assert!(g != f32s(bytes), "{what}: {name} did not change");
                } else {
                    assert_eq!(g, want, "{what}: untouched {name} changed");
                }
            }
            _ => {
                if *gd != DType::BF16 {
                    assert!(!refs.contains_key(name), "{what}: {name} kept as {gd}");
                    continue;
                }
                let g: Vec<u16> = gb
                    .chunks_exact(2)
                    .map(|c| u16::from_le_bytes([c[0], c[1]]))
                    .collect();
                let worst = g
                    .iter()
                    .zip(&want)
                    .map(|(&x, &y)| bf16_ulps(x, wanbake::codec::dtype::round_to_bf16(y)))
                    .max()
                    .unwrap_or(0);
                let limit = if refs.contains_key(name) { 1 } else { 0 };
                assert!(worst <= limit, "{what}: {name}: {worst} bf16 ulps");
            }
        }
    }
}

#[test]
fn every_kind_in_both_namings_matches_the_lycoris_forward_in_f32() {
    let dir = tmp();
    for (case, _) in CASES {
        for naming in ["", "__kohya"] {
            let a = golden(&format!("adapters/lycoris/{case}{naming}.safetensors"));
            let got = merge(dir.path(), &a, "1", "f32");
            let r = golden(&format!("references/lycoris/{case}.safetensors"));
            check(&format!("{case}{naming}"), &got, &r, DType::F32);
            std::fs::remove_dir_all(dir.path().join("out-f32-1")).unwrap();
        }
    }
}

#[test]
fn strength_half_is_w0_plus_half_the_change_for_every_kind() {
    // OFT/BOFT included: LyCORIS's own multiplier interpolates their rotations instead,
    // wanbake keeps its one rule (README, "LyCORIS").
    let dir = tmp();
    for (case, _) in CASES {
        let a = golden(&format!("adapters/lycoris/{case}.safetensors"));
        let got = merge(dir.path(), &a, "0.5", "f32");
        let r = golden(&format!("references/lycoris/{case}__s0.5.safetensors"));
        check(&format!("{case} λ=0.5"), &got, &r, DType::F32);
        // Where LyCORIS's multiplier means W + λΔW, its own λ = 0.5 forward agrees (it
        // records the weight only).
        let lyco = golden(&format!("references/lycoris/{case}__lyco_s0.5.safetensors"));
        if lyco.exists() {
            check_named(&format!("{case} lyco λ=0.5"), &got, &lyco, DType::F32, true);
        }
        std::fs::remove_dir_all(dir.path().join("out-f32-0.5")).unwrap();
    }
}

#[test]
fn bf16_output_is_within_one_ulp_of_the_rounded_reference() {
    let dir = tmp();
    for (case, _) in CASES {
        let a = golden(&format!("adapters/lycoris/{case}__kohya.safetensors"));
        let got = merge(dir.path(), &a, "1", "bf16");
        let r = golden(&format!("references/lycoris/{case}.safetensors"));
        check(&format!("{case} bf16"), &got, &r, DType::BF16);
        std::fs::remove_dir_all(dir.path().join("out-bf16-1")).unwrap();
    }
}

#[test]
fn strength_zero_is_bit_identical_to_the_base() {
    let dir = tmp();
    let a = golden("adapters/lycoris/boft.safetensors");
    let got = merge(dir.path(), &a, "0", "f32");
    let base = tensors(&base());
    assert_eq!(got, base);
}

/// Every tensor of a golden LyCORIS file as f32 (integer alphas and on_input widened).
fn golden_f32(rel: &str) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let path = golden(rel);
    let file = wanbake::io::SafetensorsFile::open(&path).expect("golden adapter");
    file.infos()
        .iter()
        .map(|t| {
            let v = file.view(&t.name).expect("tensor");
            let data = match v.dtype {
                DType::I64 => v
                    .bytes
                    .chunks_exact(8)
                    .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as f32)
                    .collect(),
                _ => v.to_f32().expect("float"),
            };
            (t.name.clone(), t.shape.clone(), data)
        })
        .collect()
}

fn write(path: &Path, tensors: &[(String, Vec<usize>, Vec<f32>)]) {
    let borrowed: Vec<(&str, Vec<usize>, Vec<f32>)> = tensors
        .iter()
        .map(|(n, s, d)| (n.as_str(), s.clone(), d.clone()))
        .collect();
    write_f32(path, &borrowed);
}

#[test]
fn a_mixed_file_of_lora_and_several_lycoris_algorithms_merges_each_module() {
    // LoHa, LoKr, BOFT, GLoRA and (IA)³ from the goldens on five targets, plus a plain LoRA
    // whose delta is written out by hand: down = e_1 (row), up = v, alpha 2, rank 1.
    let dir = tmp();
    let mut all = Vec::new();
    for case in ["loha", "lokr_w2ab", "boft", "glora", "ia3_in"] {
        all.extend(golden_f32(&format!("adapters/lycoris/{case}.safetensors")));
    }
    let m = "lycoris_blocks_2_attn1_to_q";
    let v: Vec<f32> = (0..32).map(|i| (i as f32 - 16.0) / 64.0).collect();
    let mut down = vec![0f32; 32];
    down[1] = 1.0;
    all.push((format!("{m}.lora_down.weight"), vec![1, 32], down));
    all.push((format!("{m}.lora_up.weight"), vec![32, 1], v.clone()));
    all.push((format!("{m}.alpha"), vec![], vec![2.0]));
    let adapter = dir.path().join("mixed.safetensors");
    write(&adapter, &all);
    let got = merge(dir.path(), &adapter, "1", "f32");
    let base = tensors(&base());
    for (case, target) in [
        ("loha", "blocks.0.attn1.to_q"),
        ("lokr_w2ab", "blocks.0.ffn.net.0.proj"),
        ("boft", "blocks.0.ffn.net.2"),
        ("glora", "blocks.2.ffn.net.0.proj"),
        ("ia3_in", "blocks.1.attn2.to_q"),
    ] {
        let name = format!("{target}.weight");
        let want =
            f32s(&tensors(&golden(&format!("references/lycoris/{case}.safetensors")))[&name].2);
        let g = f32s(&got[&name].2);
        let scale = want.iter().fold(0f32, |a, b| a.max(b.abs()));
        let err = g
            .iter()
            .zip(&want)
            .fold(0f32, |a, (x, y)| a.max((x - y).abs()));
        assert!(err <= 1e-5 * scale, "mixed {case}: {err}");
    }
    let q = "blocks.2.attn1.to_q.weight";
    let w0 = f32s(&base[q].2);
    let g = f32s(&got[q].2);
    for o in 0..32 {
        for i in 0..32 {
            let d = if i == 1 { 2.0 * v[o] } else { 0.0 };
            assert_eq!(g[o * 32 + i], w0[o * 32 + i] + d, "LoRA ({o}, {i})");
        }
    }
}

/// Runs a merge that must be refused: exit 1, the message holds every `needle`, and the
/// folder holds only the adapter afterwards.
#[track_caller]
fn refused(tensors: &[(String, Vec<usize>, Vec<f32>)], needles: &[&str]) {
    let dir = tmp();
    let adapter = dir.path().join("bad.safetensors");
    write(&adapter, tensors);
    let o = run(
        dir.path(),
        &[
            "merge",
            "--base",
            base().to_str().unwrap(),
            "--adapter",
            adapter.to_str().unwrap(),
            "--out",
            "out",
        ],
    );
    let (code, _, err) = parts(&o);
    assert_eq!(code, 1, "{err}");
    for n in needles {
        assert!(err.contains(n), "`{n}` not in:\n{err}");
    }
    assert_eq!(tree(dir.path()), vec!["bad.safetensors".to_string()]);
}

fn t(name: &str, shape: &[usize]) -> (String, Vec<usize>, Vec<f32>) {
    let n: usize = shape.iter().product();
    (name.to_string(), shape.to_vec(), vec![0.01; n])
}

#[test]
fn a_missing_loha_factor_is_refused_naming_the_module() {
    let m = "lycoris_blocks_0_attn1_to_q";
    refused(
        &[
            t(&format!("{m}.hada_w1_a"), &[32, 4]),
            t(&format!("{m}.hada_w1_b"), &[4, 32]),
            t(&format!("{m}.hada_w2_a"), &[32, 4]),
        ],
        &[m, "hada_w2_b is missing"],
    );
}

#[test]
fn a_kronecker_product_of_the_wrong_shape_is_refused_with_the_shapes() {
    let m = "lycoris_blocks_1_attn1_to_v";
    refused(
        &[
            t(&format!("{m}.lokr_w1"), &[4, 4]),
            t(&format!("{m}.lokr_w2"), &[8, 4]),
        ],
        &[
            m,
            "kron of W1 (4, 4) and W2 (8, 4) is (32, 16), expected (32, 32)",
        ],
    );
}

#[test]
fn a_boft_block_count_that_is_not_a_power_of_two_is_refused() {
    // ffn.net.0.proj has 80 rows: 5 blocks of 16
    let m = "lycoris_blocks_0_ffn_net_0_proj";
    refused(
        &[t(&format!("{m}.oft_blocks"), &[2, 5, 16, 16])],
        &[m, "[2, 5, 16, 16]", "power of two"],
    );
}

/// The (IA)³, BOFT and Tucker shape rules against lycoris-lora 4.1.3
/// (golden/lycoris_shape_rules.py, golden/lycoris/rules/outcomes.json): each stored shape the
/// library's rebuild formula computes merges to the library's numbers, and each one it
/// refuses is refused when binding, naming the module and the shape, with nothing written.
/// (IA)³ on the input side takes exactly the target's input channels (a Conv3d's 4 values,
/// each over its 4 kernel columns), not any count dividing in·∏k; BOFT takes 1 to log2(n)+1
/// stages, 65 included in the refusal; a Tucker core needs a convolution (a LoHa's or LoKr's
/// 2-D core on a Linear was bound, then refused by the merge).
#[test]
fn ia3_and_boft_shapes_fit_exactly_where_lycoris_lora_computes_them() {
    let rules = golden("lycoris/rules");
    let text = std::fs::read_to_string(rules.join("outcomes.json")).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    let cases = doc["cases"].as_array().unwrap();
    let accepted: Vec<&str> = cases
        .iter()
        .filter(|c| c["formula"] == "accepts")
        .map(|c| c["case"].as_str().unwrap())
        .collect();
    assert_eq!(
        accepted,
        ["ia3_in_conv_channels", "boft_stages_2", "boft_stages_4"]
    );
    assert_eq!(cases.len(), 10);
    for c in cases {
        let case = c["case"].as_str().unwrap();
        let module = format!(
            "lycoris_{}",
            c["module"].as_str().unwrap().replace('.', "_")
        );
        let stored: Vec<usize> = serde_json::from_value(c["stored_shape"].clone()).unwrap();
        let adapter = rules.join(format!("{case}.safetensors"));
        let dir = tmp();
        if c["formula"] == "accepts" {
            let got = merge(dir.path(), &adapter, "1", "f32");
            let reference = rules.join(format!("{case}__ref.safetensors"));
            check(case, &got, &reference, DType::F32);
            continue;
        }
        let copy = dir.path().join("bad.safetensors");
        std::fs::copy(&adapter, &copy).unwrap();
        let o = run(
            dir.path(),
            &[
                "merge",
                "--base",
                base().to_str().unwrap(),
                "--adapter",
                copy.to_str().unwrap(),
                "--out",
                "out",
            ],
        );
        let (code, _, err) = parts(&o);
        assert_eq!(code, 1, "{case}: {err}");
        for n in [module.as_str(), &format!("{stored:?}"), "not fit the base"] {
            assert!(err.contains(n), "{case}: `{n}` not in:\n{err}");
        }
        assert_eq!(
            tree(dir.path()),
            vec!["bad.safetensors".to_string()],
            "{case}"
        );
    }
}

#[test]
fn a_tucker_core_of_the_wrong_rank_is_refused() {
    let m = "lycoris_patch_embedding";
    refused(
        &[
            t(&format!("{m}.hada_t1"), &[3, 2, 1, 2, 2]),
            t(&format!("{m}.hada_t2"), &[2, 2, 1, 2, 2]),
            t(&format!("{m}.hada_w1_a"), &[2, 32]),
            t(&format!("{m}.hada_w1_b"), &[2, 4]),
            t(&format!("{m}.hada_w2_a"), &[2, 32]),
            t(&format!("{m}.hada_w2_b"), &[2, 4]),
        ],
        &[m, "hada_t1 is [3, 2, 1, 2, 2]", "[32, 4, 1, 2, 2]"],
    );
}

#[test]
fn a_tensor_that_does_not_belong_to_the_module_kind_is_refused() {
    let m = "lycoris_blocks_1_attn1_to_v";
    refused(
        &[
            t(&format!("{m}.lokr_w1"), &[4, 4]),
            t(&format!("{m}.lokr_w2"), &[8, 8]),
            t(&format!("{m}.rescale"), &[32, 1]),
        ],
        &[m, "no `rescale` tensor"],
    );
}

#[test]
fn inspect_lists_each_module_with_its_structure_scale_rule_and_target() {
    let dir = tmp();
    let a = golden("adapters/lycoris/lokr_full.safetensors");
    let out = common::ok(run(dir.path(), &["inspect", a.to_str().unwrap()]));
    assert!(out.contains("LyCORIS's own naming"), "{out}");
    assert!(
        out.contains(
            "lycoris_blocks_1_attn1_to_v (lokr, W1 full [4, 4], W2 full [8, 8]): σ 1 (LyCORIS \
             rule: LoKr, both factors full: scale 1, stored alpha 1 ignored) → \
             blocks.1.attn1.to_v.weight"
        ),
        "{out}"
    );
    let a = golden("adapters/lycoris/boft__kohya.safetensors");
    let b = base();
    let json = common::ok(run(
        dir.path(),
        &[
            "inspect",
            a.to_str().unwrap(),
            "--base",
            b.to_str().unwrap(),
            "--json",
        ],
    ));
    let v: serde_json::Value = serde_json::from_str(&json).expect("json");
    let report = &v[0]["components"][0]["adapter"];
    let line = &report["lycoris"][0];
    assert_eq!(line["kind"], "boft");
    assert_eq!(line["structure"], "4 stages × 8 blocks of 4");
    assert_eq!(line["target"], "blocks.0.ffn.net.2.weight");
    assert!(
        line["rule"]
            .as_str()
            .unwrap()
            .contains("rotation constraint")
    );
    let bound = &report["bindings"][0]["bound"][0];
    assert_eq!(bound["target"], "blocks.0.ffn.net.2.weight");
    assert_eq!(bound["kind"], "boft");
}

#[test]
fn the_manifest_report_lists_lycoris_kinds_and_their_scale_rule() {
    let dir = tmp();
    let a = golden("adapters/lycoris/loha__kohya.safetensors");
    merge(dir.path(), &a, "1", "f32");
    let m: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("out-f32-1/wanbake.manifest.json")).unwrap(),
    )
    .unwrap();
    let text = m["report"].to_string();
    assert!(text.contains("\"loha\":1"), "{text}");
    assert!(text.contains("lycoris_rule"), "{text}");
}

/// PEFT LOHA/LOKR folders (golden/lycoris_peft_golden.py) against PEFT's own
/// `merge_and_unload()`: LoHa with rank and alpha patterns, LoKr with w2 decomposed, with
/// decompose_both, and with both factors full (PEFT scales that one by alpha/r = 0.25 where
/// LyCORIS's rule gives 1).
#[test]
fn peft_loha_and_lokr_folders_match_merge_and_unload() {
    let dir = tmp();
    for case in ["loha", "lokr", "lokr_both_dec", "lokr_full"] {
        let a = golden(&format!("adapters/lycoris/peft_{case}"));
        for (strength, suffix) in [("1", ""), ("0.5", "__s0.5")] {
            let got = merge(dir.path(), &a, strength, "f32");
            let r = golden(&format!(
                "references/lycoris/peft_{case}{suffix}.safetensors"
            ));
            check(&format!("peft_{case} λ={strength}"), &got, &r, DType::F32);
            std::fs::remove_dir_all(dir.path().join(format!("out-f32-{strength}"))).unwrap();
        }
    }
}

#[test]
fn a_peft_lokr_folder_whose_factors_disagree_with_its_config_rank_is_refused() {
    let dir = tmp();
    let src = golden("adapters/lycoris/peft_lokr");
    let folder = dir.path().join("peft_lokr");
    std::fs::create_dir(&folder).unwrap();
    std::fs::copy(
        src.join("adapter_model.safetensors"),
        folder.join("adapter_model.safetensors"),
    )
    .unwrap();
    let cfg = std::fs::read_to_string(src.join("adapter_config.json")).unwrap();
    std::fs::write(
        folder.join("adapter_config.json"),
        cfg.replace("\"r\": 2", "\"r\": 3"),
    )
    .unwrap();
    let o = run(
        dir.path(),
        &[
            "merge",
            "--base",
            base().to_str().unwrap(),
            "--adapter",
            folder.to_str().unwrap(),
            "--out",
            "out",
        ],
    );
    let (code, _, err) = parts(&o);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("rank 3 but its factors have rank 2"), "{err}");
    assert!(!dir.path().join("out").exists());
}

/// name → (shape, values as f64) of a safetensors file (integer scalars widened).
fn values(path: &Path) -> BTreeMap<String, (Vec<usize>, Vec<f64>)> {
    tensors(path)
        .into_iter()
        .map(|(n, (d, s, b))| {
            let v: Vec<f64> = match d {
                DType::I64 => b
                    .chunks_exact(8)
                    .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as f64)
                    .collect(),
                DType::F32 => f32s(&b).into_iter().map(f64::from).collect(),
                other => panic!("{n}: unexpected {other}"),
            };
            (n, (s, v))
        })
        .collect()
}

#[test]
fn translate_lycoris_naming_to_kohya_gives_the_tensors_lycoris_kohya_wrapper_wrote() {
    // The golden script saved every module under both namings; translating the first must
    // give the second (factors byte for byte, alpha and on_input by value). `full` is left
    // out: kohya output holds no diffs (musubi cannot load them).
    let dir = tmp();
    for (case, _) in CASES.iter().filter(|(c, _)| *c != "full") {
        let a = golden(&format!("adapters/lycoris/{case}.safetensors"));
        let out = dir.path().join(format!("k_{case}"));
        common::ok(run(
            dir.path(),
            &[
                "translate",
                a.to_str().unwrap(),
                "--to",
                "kohya",
                "--out",
                out.to_str().unwrap(),
            ],
        ));
        let got = values(&out.join(format!("{case}.safetensors")));
        let want = values(&golden(&format!(
            "adapters/lycoris/{case}__kohya.safetensors"
        )));
        assert_eq!(got, want, "{case}");
    }
}

/// `translate ADAPTER --to TO --out DIR` succeeds; the one weights file it wrote.
fn translated(dir: &Path, adapter: &Path, to: &str, out: &str) -> PathBuf {
    let out = dir.join(out);
    common::ok(run(
        dir,
        &[
            "translate",
            adapter.to_str().unwrap(),
            "--to",
            to,
            "--out",
            out.to_str().unwrap(),
        ],
    ));
    std::fs::read_dir(&out)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .expect("weights")
}

#[test]
fn translate_kohya_naming_to_lycoris_gives_the_file_lycoris_itself_wrote() {
    // The inverse of the test above: the kohya file of every case translated to LyCORIS's
    // own naming (`lycoris_<diffusers module>`) holds exactly the tensors lycoris-lora saved
    // (factors byte for byte, alpha and on_input by value). `full` has no kohya file; its
    // LyCORIS file goes through the lycoris naming unchanged (diff and diff_b).
    let dir = tmp();
    for (case, _) in CASES {
        let source = match case {
            "full" => golden("adapters/lycoris/full.safetensors"),
            _ => golden(&format!("adapters/lycoris/{case}__kohya.safetensors")),
        };
        let file = translated(dir.path(), &source, "lycoris", &format!("l_{case}"));
        let want = values(&golden(&format!("adapters/lycoris/{case}.safetensors")));
        assert_eq!(values(&file), want, "{case}");
    }
}

#[test]
fn lycoris_naming_is_detected_and_named_by_inspect() {
    let dir = tmp();
    let a = golden("adapters/lycoris/loha.safetensors");
    let o = run(dir.path(), &["inspect", a.to_str().unwrap(), "--json"]);
    let text = common::ok(o);
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let found = json.to_string();
    assert!(found.contains("\"lycoris\""), "{found}");
    assert!(!found.contains("\"kohya\""), "{found}");
}

#[test]
fn a_peft_lokr_translated_to_lycoris_naming_merges_to_peft_merge_and_unload() {
    let dir = tmp();
    let file = translated(
        dir.path(),
        &golden("adapters/lycoris/peft_lokr"),
        "lycoris",
        "l",
    );
    let got = merge(dir.path(), &file, "1", "f32");
    check(
        "peft_lokr via lycoris naming",
        &got,
        &golden("references/lycoris/peft_lokr.safetensors"),
        DType::F32,
    );
}

#[test]
fn a_peft_lokr_translated_to_kohya_merges_to_peft_merge_and_unload() {
    let dir = tmp();
    let a = golden("adapters/lycoris/peft_lokr");
    let out = dir.path().join("k");
    common::ok(run(
        dir.path(),
        &[
            "translate",
            a.to_str().unwrap(),
            "--to",
            "kohya",
            "--out",
            out.to_str().unwrap(),
        ],
    ));
    let file = std::fs::read_dir(&out)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .expect("weights");
    let got = merge(dir.path(), &file, "1", "f32");
    check(
        "peft_lokr via kohya",
        &got,
        &golden("references/lycoris/peft_lokr.safetensors"),
        DType::F32,
    );
}

/// A translate that must be refused: exit 1, each needle in the message, nothing written.
#[track_caller]
fn translate_refused(adapter: &str, to: &str, needles: &[&str]) {
    let dir = tmp();
    let a = golden(adapter);
    let o = run(
        dir.path(),
        &["translate", a.to_str().unwrap(), "--to", to, "--out", "out"],
    );
    let (code, _, err) = parts(&o);
    assert_eq!(code, 1, "{err}");
    for n in needles {
        assert!(err.contains(n), "`{n}` not in:\n{err}");
    }
    assert!(tree(dir.path()).is_empty(), "{:?}", tree(dir.path()));
}

#[test]
fn translate_refuses_what_the_target_cannot_express_module_by_module() {
    translate_refused(
        "adapters/lycoris/conv_loha_tucker.safetensors",
        "peft",
        &[
            "lycoris_patch_embedding (loha",
            "PEFT has no Conv3d LoHa/LoKr",
        ],
    );
    translate_refused(
        "adapters/lycoris/oft.safetensors",
        "peft",
        &["diag-oft", "another parametrisation"],
    );
    translate_refused(
        "adapters/lycoris/loha.safetensors",
        "comfy",
        &["not a LoRA", "wanbake extract"],
    );
    translate_refused(
        "adapters/lycoris/peft_lokr_full",
        "kohya",
        &["both factors full by 1", "σ is 0.25"],
    );
    translate_refused(
        "adapters/lycoris/conv_lokr.safetensors",
        "peft",
        &[
            "lycoris_patch_embedding (lokr",
            "PEFT has no Conv3d LoHa/LoKr",
        ],
    );
}

#[test]
fn loha_and_lokr_in_one_file_are_refused_for_one_peft_folder() {
    // A PEFT folder has one peft_type: the LoHa module is listed with the reason, and
    // nothing is written; the same file goes to the lycoris naming whole.
    let dir = tmp();
    let mut all = golden_f32("adapters/lycoris/loha.safetensors");
    all.extend(golden_f32("adapters/lycoris/lokr_w2ab.safetensors"));
    let adapter = dir.path().join("mixed.safetensors");
    write(&adapter, &all);
    let o = run(
        dir.path(),
        &[
            "translate",
            adapter.to_str().unwrap(),
            "--to",
            "peft",
            "--out",
            "p",
        ],
    );
    let (code, _, err) = parts(&o);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("lycoris_blocks_0_attn1_to_q (loha"), "{err}");
    assert!(err.contains("one adapter type"), "{err}");
    assert!(!dir.path().join("p").exists());
    let file = translated(dir.path(), &adapter, "lycoris", "l");
    assert_eq!(values(&file), values(&adapter));
}

/// The adapter_config.json of a translated PEFT folder.
fn peft_config(weights: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(weights.with_file_name("adapter_config.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

#[test]
fn linear_loha_and_lokr_translated_to_peft_folders_merge_to_the_lycoris_reference() {
    // Every Linear LoHa/LoKr factor form (LoHa; LoKr with W2 a product, both products, both
    // full), from LyCORIS's own file and from its kohya file: the PEFT folder wanbake writes
    // must merge to lycoris-lora's training forward (`golden/references/lycoris`), i.e. the
    // r, alpha and decompose_* it chose make PEFT's rule give the module's σ and factors.
    // golden/check_translate_lycoris.py loads the same folders with PEFT itself.
    let dir = tmp();
    for (case, peft_type) in [
        ("loha", "LOHA"),
        ("lokr_w2ab", "LOKR"),
        ("lokr_both_dec", "LOKR"),
        ("lokr_full", "LOKR"),
    ] {
        for naming in ["", "__kohya"] {
            let source = golden(&format!("adapters/lycoris/{case}{naming}.safetensors"));
            let file = translated(dir.path(), &source, "peft", &format!("p_{case}{naming}"));
            assert_eq!(peft_config(&file)["peft_type"], peft_type, "{case}{naming}");
            let got = merge(dir.path(), &file.with_file_name(""), "1", "f32");
            check(
                &format!("{case}{naming} via PEFT"),
                &got,
                &golden(&format!("references/lycoris/{case}.safetensors")),
                DType::F32,
            );
            std::fs::remove_dir_all(dir.path().join("out-f32-1")).unwrap();
        }
    }
}

#[test]
fn peft_lokr_and_loha_folders_round_trip_through_the_lycoris_naming() {
    // PEFT → lycoris → PEFT gives PEFT's own tensors back and a config that lays them out
    // the same (same decompose_factor / decompose_both, same r and α per module). The
    // both-full PEFT LoKr (σ = 0.25, which LyCORIS's rule cannot hold) goes PEFT → PEFT.
    let dir = tmp();
    for case in [
        "peft_lokr",
        "peft_lokr_both_dec",
        "peft_loha",
        "peft_lokr_full",
    ] {
        let original = golden(&format!("adapters/lycoris/{case}"));
        let back = if case == "peft_lokr_full" {
            translated(dir.path(), &original, "peft", &format!("b_{case}"))
        } else {
            let l = translated(dir.path(), &original, "lycoris", &format!("l_{case}"));
            translated(dir.path(), &l, "peft", &format!("b_{case}"))
        };
        assert_eq!(
            values(&back),
            values(&original.join("adapter_model.safetensors")),
            "{case}"
        );
        let (want, got) = (
            peft_config(&original.join("adapter_model.safetensors")),
            peft_config(&back),
        );
        for field in [
            "peft_type",
            "decompose_factor",
            "decompose_both",
            "target_modules",
        ] {
            let w = match (&want[field], field) {
                (serde_json::Value::Null, "decompose_both") if want["peft_type"] == "LOKR" => {
                    serde_json::Value::Bool(false)
                }
                (w, _) => w.clone(),
            };
            assert_eq!(got[field], w, "{case}: {field}");
        }
        // r and α per module, after the patterns, as PEFT resolves them.
        let per_module = |c: &serde_json::Value, module: &str, field: &str, pattern: &str| {
            c[pattern]
                .as_object()
                .unwrap()
                .iter()
                .find(|(k, _)| regex_lite_match(k, module))
                .map_or(c[field].as_f64().unwrap(), |(_, v)| v.as_f64().unwrap())
        };
        for m in want["target_modules"].as_array().unwrap() {
            let m = m.as_str().unwrap();
            for (field, pattern) in [("r", "rank_pattern"), ("alpha", "alpha_pattern")] {
                assert_eq!(
                    per_module(&got, m, field, pattern),
                    per_module(&want, m, field, pattern),
                    "{case}: {m} {field}"
                );
            }
        }
    }
}

/// PEFT's pattern match for the plain and escaped module paths these configs use.
fn regex_lite_match(key: &str, module: &str) -> bool {
    let key = key.replace("\\.", ".");
    module == key || module.ends_with(&format!(".{key}"))
}

#[test]
fn comfyui_names_are_read_too() {
    // The kohya golden's tensors under ComfyUI's `diffusion_model.<original module>` names.
    let dir = tmp();
    let renamed: Vec<_> = golden_f32("adapters/lycoris/loha__kohya.safetensors")
        .into_iter()
        .map(|(n, s, d)| {
            let suffix = n.split_once('.').unwrap().1.to_string();
            (
                format!("diffusion_model.blocks.0.self_attn.q.{suffix}"),
                s,
                d,
            )
        })
        .collect();
    let a = dir.path().join("comfy.safetensors");
    write(&a, &renamed);
    let got = merge(dir.path(), &a, "1", "f32");
    check(
        "loha comfy",
        &got,
        &golden("references/lycoris/loha.safetensors"),
        DType::F32,
    );
}

#[test]
fn a_recipe_bakes_lycoris_and_peft_lokr_adapters_together() {
    let dir = tmp();
    let recipe = format!(
        r#"
[base]
path = "{base}"

[[adapter]]
path = "{loha}"

[[adapter]]
path = "{boft}"
strength = 0.5

[[adapter]]
path = "{lokr}"

[output]
dir = "baked"
dtype = "f32"
"#,
        base = base().display(),
        loha = golden("adapters/lycoris/loha__kohya.safetensors").display(),
        boft = golden("adapters/lycoris/boft.safetensors").display(),
        lokr = golden("adapters/lycoris/peft_lokr").display(),
    );
    std::fs::write(dir.path().join("r.toml"), recipe).unwrap();
    common::ok(run(dir.path(), &["bake", "r.toml"]));
    let got = tensors(&dir.path().join("baked"));
    for (what, reference) in [
        ("loha", "loha"),
        ("boft λ=0.5", "boft__s0.5"),
        ("peft_lokr", "peft_lokr"),
    ] {
        let r = golden(&format!("references/lycoris/{reference}.safetensors"));
        check_named(what, &got, &r, DType::F32, true);
    }
}

#[test]
fn a_recipe_scale_on_a_lycoris_file_is_refused_not_ignored() {
    // `scale` overrides σ of LoRA-family entries only; applied to a file with LyCORIS
    // modules it would leave them at their own σ without a word.
    let dir = tmp();
    let recipe = format!(
        "[base]\npath = \"{}\"\n\n[[adapter]]\npath = \"{}\"\nscale = 0.5\n\n[output]\ndir = \"baked\"\n",
        base().display(),
        golden("adapters/lycoris/loha__kohya.safetensors").display(),
    );
    std::fs::write(dir.path().join("r.toml"), recipe).unwrap();
    let (code, _, err) = parts(&run(dir.path(), &["bake", "r.toml"]));
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("`scale`") && err.contains("LyCORIS loha module"),
        "{err}"
    );
    assert!(!dir.path().join("baked").exists());
}

#[test]
fn row_mixing_kinds_merge_into_a_scanned_nnx_base_and_restack_back_to_the_reference() {
    // BOFT and Diag-OFT mix output rows; an nnx-scanned base stores (L, in, out) kernels, so
    // the merge reads W0 transposed out of a stack and writes it back. Restacked to
    // diffusers, the result must be the f32 reference (restack moves bytes only).
    let dir = tmp();
    let p = |s: &str| dir.path().join(s).to_str().unwrap().to_string();
    let b = base();
    common::ok(run(
        dir.path(),
        &[
            "restack",
            b.to_str().unwrap(),
            "--to",
            "nnx-scanned",
            "--dtype",
            "f32",
            "--out",
            &p("nnx"),
        ],
    ));
    for case in ["boft", "oft", "lokr_w2ab"] {
        let a = golden(&format!("adapters/lycoris/{case}__kohya.safetensors"));
        let merged = p(&format!("m_{case}"));
        let back = p(&format!("d_{case}"));
        common::ok(run(
            dir.path(),
            &[
                "merge",
                "--base",
                &p("nnx"),
                "--adapter",
                a.to_str().unwrap(),
                "--dtype",
                "f32",
                "--out",
                &merged,
            ],
        ));
        common::ok(run(
            dir.path(),
            &[
                "restack",
                &merged,
                "--to",
                "diffusers",
                "--dtype",
                "f32",
                "--out",
                &back,
            ],
        ));
        let got = tensors(Path::new(&back));
        let r = golden(&format!("references/lycoris/{case}.safetensors"));
        check_named(
            &format!("{case} via nnx-scanned"),
            &got,
            &r,
            DType::F32,
            true,
        );
    }
}

#[test]
fn lycoris_merges_are_byte_identical_on_one_and_two_threads() {
    let dir = tmp();
    let a = golden("adapters/lycoris/boft.safetensors");
    let b = golden("adapters/lycoris/conv_lokr_tucker__kohya.safetensors");
    let mut outs = Vec::new();
    for threads in ["1", "2"] {
        let out = dir.path().join(format!("t{threads}"));
        common::ok(run(
            dir.path(),
            &[
                "merge",
                "--threads",
                threads,
                "--base",
                base().to_str().unwrap(),
                "--adapter",
                a.to_str().unwrap(),
                "--adapter",
                &format!("{}:0.7", b.display()),
                "--out",
                out.to_str().unwrap(),
            ],
        ));
        outs.push(tensors(&out));
    }
    assert_eq!(outs[0], outs[1]);
}
