//! Quantized encodings against their reference implementations (golden/quant_golden.py):
//! torch's float8_e4m3fn cast and ComfyUI's scale rule, gguf-py 0.19's quantizers, and (for the
//! container) gguf-py's GGUFWriter and GGUFReader.

mod common;

use common::*;
use wanbake::io::SafetensorsFile;
use wanbake::io::quant::fp8;
use wanbake::io::quant::ggml::{self, GgmlType};

fn golden(name: &str) -> SafetensorsFile {
    SafetensorsFile::open(&repo().join("golden/quant").join(name)).expect("golden file")
}

fn bytes<'a>(f: &'a SafetensorsFile, name: &str) -> &'a [u8] {
    f.view(name).unwrap_or_else(|| panic!("golden tensor {name}")).bytes
}

const TYPES: [(&str, GgmlType); 7] = [
    ("q8_0", GgmlType::Q8_0),
    ("q4_0", GgmlType::Q4_0),
    ("q4_1", GgmlType::Q4_1),
    ("q5_0", GgmlType::Q5_0),
    ("q5_1", GgmlType::Q5_1),
    ("bf16", GgmlType::BF16),
    ("f16", GgmlType::F16),
];

#[test]
fn fp8_cast_matches_torch() {
    let f = golden("cast.safetensors");
    let x = f.read_f32("x").unwrap();
    let want = bytes(&f, "codes");
    assert_eq!(x.len(), want.len());
    assert!(x.len() > 1000);
    let mut bad = Vec::new();
    for (&x, &w) in x.iter().zip(want) {
        let got = fp8::f32_to_e4m3fn(x);
        if got != w {
            bad.push(format!("{x:e} ({:#010x}): torch {w:#04x}, ours {got:#04x}", x.to_bits()));
        }
    }
    assert!(bad.is_empty(), "{} mismatches:\n{}", bad.len(), bad.join("\n"));
}

/// Every input `N` of a golden file against `N|<type>` (gguf-py) and `N|fp8` (torch).
fn check_file(name: &str) -> usize {
    let f = golden(name);
    let inputs: Vec<String> = f
        .infos()
        .iter()
        .map(|i| i.name.clone())
        .filter(|n| !n.contains('|'))
        .collect();
    assert!(!inputs.is_empty());
    let mut checked = 0;
    for input in &inputs {
        let w = f.read_f32(input).unwrap();
        for (tname, ty) in TYPES {
            let want = bytes(&f, &format!("{input}|{tname}"));
            let got = ggml::quantize_vec(ty, &w).expect("whole blocks");
            assert_eq!(got.len(), want.len(), "{name}: {input} {tname} length");
            if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
                let blk = i / ty.type_size();
                panic!(
                    "{name}: {input} {tname}: byte {i} (block {blk}): gguf-py {:#04x}, ours {:#04x}\n\
                     block input: {:?}",
                    want[i],
                    got[i],
                    &w[blk * ty.block_size()..(blk + 1) * ty.block_size()]
                );
            }
            checked += 1;
        }
        if let Some(codes) = f.view(&format!("{input}|fp8")) {
            let scale = f.read_f32(&format!("{input}|fp8_scale")).unwrap();
            assert_eq!(scale.len(), 1);
            let q = fp8::quantize_scaled(&w);
            assert_eq!(
                q.scale.to_bits(),
                scale[0].to_bits(),
                "{name}: {input} scale_weight: torch {:e}, ours {:e}",
                scale[0],
                q.scale
            );
            let diff = q.codes.iter().zip(codes.bytes).filter(|(a, b)| a != b).count();
            assert_eq!(diff, 0, "{name}: {input}: {diff} fp8 codes differ from torch");
            checked += 1;
        }
    }
    checked
}

#[test]
fn ggml_and_fp8_match_references_on_crafted_blocks() {
    // ties, clips, argmax ties, zero/constant blocks, f16 scale underflow, fp8 midpoints
    assert!(check_file("crafted.safetensors") >= 30);
}

#[test]
fn ggml_and_fp8_match_references_on_wan_weights() {
    // every 2-D weight of the tiny WAN whose rows are whole 32-blocks
    assert!(check_file("t2v.safetensors") >= 50);
}

/// Dequantizing gguf-py's bytes gives what gguf-py's own dequantizer gives up to f32 rounding
/// of `d·q (+m)`: checked here as "within half a step of the input" on the WAN weights.
#[test]
fn dequantize_inverts_reference_bytes() {
    let f = golden("t2v.safetensors");
    let w = f.read_f32("blocks.0.self_attn.q.weight").unwrap();
    for (tname, ty) in TYPES {
        let want = bytes(&f, &format!("blocks.0.self_attn.q.weight|{tname}"));
        let mut y = vec![0f32; w.len()];
        ggml::dequantize(ty, want, &mut y);
        for (blk, (x, y)) in w.chunks(32).zip(y.chunks(32)).enumerate() {
            let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
            let step = match ty {
                GgmlType::Q8_0 => amax / 127.0,
                GgmlType::Q4_0 | GgmlType::Q4_1 => amax / 7.0,
                GgmlType::Q5_0 | GgmlType::Q5_1 => amax / 15.0,
                _ => amax / 128.0,
            };
            for (a, b) in x.iter().zip(y) {
                assert!((a - b).abs() <= step * 1.0001, "{tname} block {blk}: {a} vs {b}");
            }
        }
    }
}

/// Our reader on a file gguf-py's GGUFWriter wrote, compared with what GGUFReader read from it;
/// then our layout plus our encoders rebuild the same file byte for byte from the source
/// weights, so GGUFReader reads our files exactly as it reads its own.
#[test]
fn gguf_container_matches_gguf_py() {
    use wanbake::io::gguf::{self, GgufLayout, TensorPlan};
    let dir = repo().join("golden/quant");
    let file = fs_err::read(dir.join("gguf_written.gguf")).unwrap();
    let want: serde_json::Value =
        serde_json::from_str(&fs_err::read_to_string(dir.join("gguf_written.json")).unwrap())
            .unwrap();
    let g = gguf::parse(&file).unwrap();
    assert_eq!(g.alignment, 32);
    let kv = want["kv"].as_object().unwrap();
    assert_eq!(g.kv.len(), kv.len());
    for (k, v) in &g.kv {
        let w = &kv[k.as_str()];
        assert_eq!(v.type_id() as u64, w["type"][0].as_u64().unwrap(), "{k} type");
        match v {
            gguf::Value::Str(s) => assert_eq!(s, w["value"].as_str().unwrap(), "{k}"),
            _ => assert_eq!(v.as_u64(), w["value"].as_u64(), "{k}"),
        }
    }
    let tensors = want["tensors"].as_array().unwrap();
    assert_eq!(g.tensors.len(), tensors.len());
    let source = SafetensorsFile::open(&dir.join("gguf_written_source.safetensors")).unwrap();
    let mut plans = Vec::new();
    for (i, (t, w)) in g.tensors.iter().zip(tensors).enumerate() {
        assert_eq!(t.name, w["name"].as_str().unwrap());
        assert_eq!(t.ty.id() as u64, w["type"].as_u64().unwrap(), "{}", t.name);
        let ne: Vec<u64> = w["ne"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap()).collect();
        assert_eq!(t.ne, ne, "{}", t.name);
        // GGUFReader reports the absolute offset of the data
        assert_eq!(g.range(i).start as u64, w["offset"].as_u64().unwrap());
        let data = &file[g.range(i)];
        assert_eq!(data.len() as u64, w["n_bytes"].as_u64().unwrap());
        assert_eq!(wanbake::io::digest::sha256_hex(data), w["sha256"].as_str().unwrap());
        // the torch shape of the source tensor, every dimension kept (3-D, 5-D)
        let src = source.view(&t.name).unwrap();
        assert_eq!(gguf::torch_shape(&t.ne), src.shape, "{}", t.name);
        plans.push(TensorPlan {
            name: t.name.clone(),
            ne: t.ne.clone(),
            ty: t.ty,
        });
    }
    let layout = GgufLayout::new(&g.kv, &plans);
    let mut ours = layout.header.clone();
    ours.resize(layout.len as usize, 0);
    for (p, &(off, len)) in plans.iter().zip(&layout.spans) {
        let w = source.read_f32(&p.name).unwrap();
        let q = ggml::quantize_vec(p.ty, &w).unwrap();
        assert_eq!(q.len() as u64, len);
        ours[off as usize..(off + len) as usize].copy_from_slice(&q);
    }
    assert_eq!(ours.len(), file.len(), "file length");
    let first = ours.iter().zip(&file).position(|(a, b)| a != b);
    assert_eq!(first, None, "first differing byte");
}
