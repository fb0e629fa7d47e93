//! The K-quant codecs (Q2_K … Q6_K) against ggml itself: golden/quant/kquant.safetensors holds
//! the bytes `ggml_quantize_chunk` (llama-cpp-python 0.3.36's libggml-base, no imatrix) wrote
//! for crafted super-blocks, 512 varied random ones and a seeded matrix, from the f32 values
//! and from their f16 rounding, and ggml's dequantization of them (golden/kquant_golden.py).

mod common;

use common::*;
use sha2::{Digest, Sha256};
use wanbake::io::SafetensorsFile;
use wanbake::io::quant::ggml::{self, GgmlType};

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
/// thread and prints the input rate; numbers go to BENCHMARKS.md, nothing is asserted.
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
    let mb = (x.len() * 4) as f64 / 1e6;
    for (tname, ty) in TYPES {
        let mut out = vec![0u8; ty.byte_len(x.len()).unwrap()];
        let (wall, cpu) = (std::time::Instant::now(), thread_cpu_s());
        ggml::quantize(ty, &x, &mut out);
        let (wall, cpu) = (wall.elapsed().as_secs_f64(), thread_cpu_s() - cpu);
        println!(
            "{tname}: {cpu:.2} s CPU ({wall:.2} s wall) for {mb:.0} MB of f32: {:.1} MB/s \
             ({:.1} ns/element) of CPU time, one thread",
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
