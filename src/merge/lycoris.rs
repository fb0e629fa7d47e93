//! The effective weight change of every LyCORIS module kind (spec lycoris.md §2).
//!
//! Owns: `delta`, the full-tensor delta `f(W0) − W0` of a fitted module on the (out, in')
//! view of its target, which a merge adds as `λ·delta` like a `diff` contribution (strength
//! rule `W0 + λ·(f(W0) − W0)`, one rounding at the end). The formulas only: the module was
//! fitted to its target once, when binding, and its loaded tensors checked against that fit
//! (`adapter::lycoris::Fitted`), so nothing here decides a shape or refuses one.
//! Does not own: the module's tensors, scale rule and shape rules (`adapter::lycoris`),
//! binding, or where the delta goes (`merge::target`).
//!
//! Arithmetic (documented because output bits depend on it): every product and sum is
//! accumulated in f64 in index order and each delta element is rounded once to f32. The
//! Cayley transform of Diag-OFT/BOFT (`R = (I+Q)(I−Q)⁻¹`, an exact solve with partial
//! pivoting) and the Frobenius norm of the constraint are f64 throughout. The reference is
//! lycoris-lora 4.1.3's training forward in rebuild mode, which applies the LoHa/LoKr scale
//! once; its own `merge_to()` applies it twice (spec lycoris.md §3) and is not followed.
//!
//! Strength: LyCORIS's multiplier means `W + λΔW` for LoHa/LoKr/GLoRA/full and `W·(1+λw)`
//! for (IA)³ (both equal to wanbake's rule), but for Diag-OFT and BOFT it interpolates each
//! rotation (`R ← λR + (1−λ)I`), which is not `W0 + λ·(f(W0) − W0)`. wanbake keeps its one
//! documented rule for every kind; the two agree at λ = 1.
//!
//! Not handled yet (refused with `LycorisError::Unsupported` when reading): LyCORIS DoRA
//! (`dora_scale`), GLoRA's `bm.weight`, a Tucker W1 (`lokr_t1`, which LyCORIS never writes).

#![allow(non_snake_case)]

use crate::adapter::lycoris::{FactorFit, FactorRef, Fit, FitDims, Fitted, Ia3Side, Module};

/// `f(W0) − W0` of fitted module `m` on `W0`, the (out, in') view of its target, rounded
/// once to f32 per element. `s` scales LoHa/LoKr/GLoRA (the entry's σ: LyCORIS's own rule,
/// `Module::scale_rule`, or a PEFT LOHA/LOKR folder's config alpha/r); the other kinds have
/// no scale and ignore it.
#[track_caller]
pub fn delta(m: &Fitted, W0: &[f32], s: f64) -> Vec<f32> {
    let Fit { out, inp, dims } = *m.fit();
    assert_eq!(W0.len(), out * inp, "W0 is not the fitted (out, in') view");
    match (dims, m.module()) {
        (
            FitDims::Loha { w1, w2 },
            Module::Loha {
                w1_a,
                w1_b,
                w2_a,
                w2_b,
                t,
                ..
            },
        ) => {
            let (t1, t2) = (t.as_ref().map(|x| &x.0), t.as_ref().map(|x| &x.1));
            let p1 = factor(w1, FactorRef::loha(w1_a, w1_b, t1));
            let p2 = factor(w2, FactorRef::loha(w2_a, w2_b, t2));
            round_all(p1.iter().zip(&p2).map(|(a, b)| s * a * b))
        }
        (FitDims::Lokr { w1, w2 }, Module::Lokr { w1: f1, w2: f2, .. }) => {
            let (a, b, m1) = (w1.rows(), w1.cols(), factor(w1, f1.into()));
            let (c, d, m2) = (w2.rows(), w2.cols(), factor(w2, f2.into()));
            let mut delta = vec![0f32; out * inp];
            for i in 0..a {
                for k in 0..c {
                    let row = &mut delta[(i * c + k) * inp..(i * c + k + 1) * inp];
                    for j in 0..b {
                        let w1ij = s * m1[i * b + j];
                        for l in 0..d {
                            row[j * d + l] = (w1ij * m2[k * d + l]) as f32;
                        }
                    }
                }
            }
            delta
        }
        (
            FitDims::DiagOft { n, b },
            Module::DiagOft {
                blocks,
                alpha,
                rescale,
            },
        ) => {
            let rs = rescale.as_ref().map(|r| widen(&r.data));
            let rots = rotations(&blocks.data, n, b, alpha.unwrap_or(0.0), out);
            let w = widen(W0);
            let mut new = vec![0f64; out * inp];
            for k in 0..n {
                let r = &rots[k * b * b..(k + 1) * b * b];
                for p in 0..b {
                    // row k·b+p of Rᵀ·W: Σ_q R[q][p]·W[k·b+q]
                    let dst = &mut new[(k * b + p) * inp..(k * b + p + 1) * inp];
                    for q in 0..b {
                        let f = r[q * b + p];
                        let src = &w[(k * b + q) * inp..(k * b + q + 1) * inp];
                        dst.iter_mut().zip(src).for_each(|(x, y)| *x += f * y);
                    }
                }
            }
            finish(new, &w, rs.as_deref(), inp)
        }
        (
            FitDims::Boft { stages, n, b },
            Module::Boft {
                blocks,
                alpha,
                rescale,
            },
        ) => {
            let rs = rescale.as_ref().map(|r| widen(&r.data));
            let rots = rotations(&blocks.data, stages * n, b, alpha.unwrap_or(0.0), out);
            let w = widen(W0);
            let mut cur = w.clone();
            for i in 0..stages {
                let k = (1usize << i) * b / 2;
                // permuted row c·2k + 2j + g takes row c·2k + g·k + j
                let perm: Vec<usize> = (0..out)
                    .map(|p| {
                        let (c, rem) = (p / (2 * k), p % (2 * k));
                        c * 2 * k + (rem % 2) * k + rem / 2
                    })
                    .collect();
                let mut next = vec![0f64; out * inp];
                for blk in 0..n {
                    let r = &rots[(i * n + blk) * b * b..(i * n + blk + 1) * b * b];
                    for p in 0..b {
                        // permuted row blk·b+p of R·P·W, written back at its source row
                        let dst_row = perm[blk * b + p];
                        let dst = &mut next[dst_row * inp..(dst_row + 1) * inp];
                        for q in 0..b {
                            let f = r[p * b + q];
                            let src_row = perm[blk * b + q];
                            let src = &cur[src_row * inp..(src_row + 1) * inp];
                            dst.iter_mut().zip(src).for_each(|(x, y)| *x += f * y);
                        }
                    }
                }
                cur = next;
            }
            finish(cur, &w, rs.as_deref(), inp)
        }
        (FitDims::Glora { ra, rb }, Module::Glora { a1, a2, b1, b2, .. }) => {
            let pb = matmul(&widen(&b1.data), &widen(&b2.data), out, rb, inp);
            // W·a1 (out, r), then ·a2 (out, in')
            let wa1 = matmul(&widen(W0), &widen(&a1.data), out, inp, ra);
            let wa = matmul(&wa1, &widen(&a2.data), out, ra, inp);
            round_all(wa.iter().zip(&pb).map(|(x, y)| s * (x + y)))
        }
        (FitDims::Ia3(side), Module::Ia3 { weight, .. }) => {
            let w = &weight.data;
            match side {
                Ia3Side::Out => round_all(
                    W0.iter()
                        .enumerate()
                        .map(|(idx, &x)| f64::from(x) * f64::from(w[idx / inp])),
                ),
                // the `per` kernel columns of an input channel follow each other
                Ia3Side::In { per } => round_all(
                    W0.iter()
                        .enumerate()
                        .map(|(idx, &x)| f64::from(x) * f64::from(w[(idx % inp) / per])),
                ),
            }
        }
        (FitDims::Full, Module::Full { diff }) => diff.data.clone(),
        _ => unreachable!("Fitted::new pairs a fit with a module of its kind"),
    }
}

fn widen(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| f64::from(v)).collect()
}

fn round_all(it: impl Iterator<Item = f64>) -> Vec<f32> {
    it.map(|v| v as f32).collect()
}

/// Row-major f64 product of (m, k) and (k, n), summed in index order.
fn matmul(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut c = vec![0f64; m * n];
    for i in 0..m {
        let row = &mut c[i * n..(i + 1) * n];
        for t in 0..k {
            let f = a[i * k + t];
            row.iter_mut()
                .zip(&b[t * n..(t + 1) * n])
                .for_each(|(x, y)| *x += f * y);
        }
    }
    c
}

/// A factor's values on its (rows, cols) view (a conv W2 flattened to (out_k, in_n·∏k)).
fn factor(f: FactorFit, r: FactorRef<'_>) -> Vec<f64> {
    match (f, r) {
        (FactorFit::Full { .. }, FactorRef::Full(p)) => widen(&p.data),
        (FactorFit::Product { rows, rank, cols }, FactorRef::Product(a, b)) => {
            matmul(&widen(&a.data), &widen(&b.data), rows, rank, cols)
        }
        (
            FactorFit::Tucker {
                rows,
                ra,
                rb,
                ch,
                kernel,
            },
            FactorRef::Tucker(t, a, b),
        ) => tucker((&t.data, &a.data, &b.data), (rows, ra, rb, ch, kernel)),
        _ => unreachable!("Fitted::new pairs a factor's fit with a factor of its form"),
    }
}

/// `W[p,q,…] = Σ_ij t[i,j,…]·a[i,p]·b[j,q]` (LyCORIS `rebuild_tucker`), as (out, in·∏k),
/// from `t (ra, rb, *k)`, `a (ra, out)`, `b (rb, in)` with `k` = ∏k.
fn tucker(
    (t, a, b): (&[f32], &[f32], &[f32]),
    (out, ra, rb, inp, k): (usize, usize, usize, usize, usize),
) -> Vec<f64> {
    let (tv, av, bv) = (widen(t), widen(a), widen(b));
    // tmp[i, q, kk] = Σ_j t[i, j, kk]·b[j, q]
    let mut tmp = vec![0f64; ra * inp * k];
    for i in 0..ra {
        for j in 0..rb {
            for q in 0..inp {
                let f = bv[j * inp + q];
                for kk in 0..k {
                    tmp[(i * inp + q) * k + kk] += tv[(i * rb + j) * k + kk] * f;
                }
            }
        }
    }
    // W[p, q, kk] = Σ_i a[i, p]·tmp[i, q, kk]
    let mut w = vec![0f64; out * inp * k];
    for p in 0..out {
        let row = &mut w[p * inp * k..(p + 1) * inp * k];
        for i in 0..ra {
            let f = av[i * out + p];
            row.iter_mut()
                .zip(&tmp[i * inp * k..(i + 1) * inp * k])
                .for_each(|(x, y)| *x += f * y);
        }
    }
    w
}

/// The Cayley rotations `R = (I+Q)(I−Q)⁻¹` of `count` blocks `b×b`, with `Q = B − Bᵀ`
/// scaled down to the constraint `c = alpha·out` over all blocks (f64).
fn rotations(blocks: &[f32], count: usize, b: usize, alpha: f64, out: usize) -> Vec<f64> {
    let mut q = vec![0f64; count * b * b];
    for k in 0..count {
        let blk = &blocks[k * b * b..(k + 1) * b * b];
        for i in 0..b {
            for j in 0..b {
                q[k * b * b + i * b + j] = f64::from(blk[i * b + j]) - f64::from(blk[j * b + i]);
            }
        }
    }
    let c = alpha * out as f64;
    if c > 0.0 {
        let norm = q.iter().map(|x| x * x).sum::<f64>().sqrt();
        if norm + 1e-8 > c {
            let f = c / (norm + 1e-8);
            q.iter_mut().for_each(|x| *x *= f);
        }
    }
    let mut r = vec![0f64; count * b * b];
    for k in 0..count {
        let qk = &q[k * b * b..(k + 1) * b * b];
        // (I+Q) and (I−Q)⁻¹ commute, so R = (I−Q)⁻¹(I+Q): solve (I−Q)·R = I+Q
        let mut lhs = vec![0f64; b * b];
        let mut rhs = vec![0f64; b * b];
        for i in 0..b {
            for j in 0..b {
                let id = if i == j { 1.0 } else { 0.0 };
                lhs[i * b + j] = id - qk[i * b + j];
                rhs[i * b + j] = id + qk[i * b + j];
            }
        }
        r[k * b * b..(k + 1) * b * b].copy_from_slice(&solve(lhs, rhs, b));
    }
    r
}

/// X with A·X = B (b×b, Gauss-Jordan elimination with partial pivoting, f64). A = I − Q with
/// Q skew-symmetric is never singular (its eigenvalues are 1 + iθ).
fn solve(mut a: Vec<f64>, mut x: Vec<f64>, n: usize) -> Vec<f64> {
    for col in 0..n {
        let piv = (col..n)
            .max_by(|&i, &j| a[i * n + col].abs().total_cmp(&a[j * n + col].abs()))
            .unwrap_or(col);
        if piv != col {
            for t in 0..n {
                a.swap(piv * n + t, col * n + t);
                x.swap(piv * n + t, col * n + t);
            }
        }
        let d = a[col * n + col];
        for row in 0..n {
            if row == col {
                continue;
            }
            let f = a[row * n + col] / d;
            if f == 0.0 {
                continue;
            }
            for t in 0..n {
                a[row * n + t] -= f * a[col * n + t];
                x[row * n + t] -= f * x[col * n + t];
            }
        }
    }
    for row in 0..n {
        let d = a[row * n + row];
        x[row * n..(row + 1) * n].iter_mut().for_each(|v| *v /= d);
    }
    x
}

/// `rescale ⊙ W' − W0`, rounded once.
fn finish(new: Vec<f64>, w: &[f64], rescale: Option<&[f64]>, inp: usize) -> Vec<f32> {
    round_all(new.iter().zip(w).enumerate().map(|(idx, (n, w0))| {
        let r = rescale.map_or(1.0, |r| r[idx / inp]);
        r * n - w0
    }))
}

#[cfg(test)]
mod tests {
    //! Against golden/references/lycoris (lycoris-lora 4.1.3's rebuild-mode training forward,
    //! golden/lycoris_golden.py). The shape refusals are the fit's (`adapter::lycoris`).
    use std::collections::BTreeMap;
    use std::path::PathBuf;

    use super::*;
    use crate::adapter::lycoris::{Factor, Param};
    use crate::codec::dtype::{DType, to_f32_vec};
    use crate::io::checkpoint::TensorSet;

    fn golden(rel: &str) -> TensorSet {
        let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("golden")
            .join(rel);
        TensorSet::from_file(&p).expect("golden file")
    }

    fn param(set: &TensorSet, name: &str) -> Param {
        let v = set.get(name).expect("tensor").view;
        let data = match v.dtype {
            DType::I64 => v
                .bytes
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")) as f32)
                .collect(),
            d => to_f32_vec(d, v.bytes).expect("float"),
        };
        Param::new(v.shape.to_vec(), data)
    }

    /// The one module of a golden adapter file: (its name, its tensors by suffix).
    fn module_of(set: &TensorSet) -> (String, BTreeMap<String, Param>) {
        let mut name = String::new();
        let mut t = BTreeMap::new();
        for n in set.names() {
            let (m, suffix) = n.split_once('.').expect("module.suffix");
            name = m.to_string();
            if suffix != "diff_b" {
                t.insert(suffix.to_string(), param(set, n));
            }
        }
        (name, t)
    }

    /// `delta` of `m` fitted to `w0`'s shape, with LyCORIS's own scale rule.
    fn fitted_delta(m: Module, w0: &Param) -> Vec<f32> {
        let s = m.scale_rule().scale;
        let fit = m.fit("m", &w0.shape).expect("fit");
        delta(&Fitted::new(fit, m, "m").expect("fitted"), &w0.data, s)
    }

    fn check(case: &str, target: &str) {
        let base = golden("models/t2v/diffusion_pytorch_model.safetensors");
        let w0 = param(&base, &format!("{target}.weight"));
        for file in [
            format!("{case}.safetensors"),
            format!("{case}__kohya.safetensors"),
        ] {
            let (name, t) = module_of(&golden(&format!("adapters/lycoris/{file}")));
            let d = fitted_delta(Module::from_tensors(&name, &t).expect("module"), &w0);
            for (suffix, lambda) in [("", 1.0f32), ("__s0.5", 0.5)] {
                let r = golden(&format!("references/lycoris/{case}{suffix}.safetensors"));
                let want = param(&r, &format!("{target}.weight")).data;
                let got: Vec<f32> = w0
                    .data
                    .iter()
                    .zip(&d)
                    .map(|(w, x)| w + lambda * x)
                    .collect();
                let scale = want.iter().fold(0f32, |a, b| a.max(b.abs()));
                let err = got
                    .iter()
                    .zip(&want)
                    .fold(0f32, |a, (g, w)| a.max((g - w).abs()));
                assert!(
                    err <= 1e-5 * scale,
                    "{file} λ={lambda}: max error {err}, max |ref| {scale}"
                );
            }
        }
    }

    #[test]
    fn loha_alpha_ne_rank() {
        check("loha", "blocks.0.attn1.to_q");
    }
    #[test]
    fn lokr_w2_decomposed() {
        check("lokr_w2ab", "blocks.0.ffn.net.0.proj");
    }
    #[test]
    fn lokr_both_decomposed() {
        check("lokr_both_dec", "blocks.1.ffn.net.0.proj");
    }
    #[test]
    fn lokr_both_full_ignores_alpha() {
        check("lokr_full", "blocks.1.attn1.to_v");
    }
    #[test]
    fn diag_oft_active_constraint_rescale() {
        check("oft", "blocks.2.attn1.to_out.0");
    }
    #[test]
    fn diag_oft_free() {
        check("oft_free", "blocks.2.attn2.to_q");
    }
    #[test]
    fn boft_stages() {
        check("boft", "blocks.0.ffn.net.2");
    }
    #[test]
    fn glora_weight_keys() {
        check("glora", "blocks.2.ffn.net.0.proj");
    }
    #[test]
    fn ia3_output_and_input() {
        check("ia3_out", "blocks.1.attn1.to_q");
        check("ia3_in", "blocks.1.attn2.to_q");
    }
    #[test]
    fn conv3d_patch_embedding() {
        for case in [
            "conv_loha",
            "conv_lokr",
            "conv_lokr_full",
            "conv_oft",
            "conv_ia3_in",
        ] {
            check(case, "patch_embedding");
        }
    }
    #[test]
    fn full_diff() {
        check("full", "blocks.0.attn1.to_v");
    }

    /// The library's own multiplier 0.5 for the linear kinds equals wanbake's rule.
    #[test]
    fn linear_kinds_library_multiplier_matches_rule() {
        for (case, target) in [
            ("loha", "blocks.0.attn1.to_q"),
            ("lokr_w2ab", "blocks.0.ffn.net.0.proj"),
            ("glora", "blocks.2.ffn.net.0.proj"),
        ] {
            let a = param(
                &golden(&format!("references/lycoris/{case}__s0.5.safetensors")),
                &format!("{target}.weight"),
            );
            let b = param(
                &golden(&format!("references/lycoris/{case}__lyco_s0.5.safetensors")),
                &format!("{target}.weight"),
            );
            let err = a
                .data
                .iter()
                .zip(&b.data)
                .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
            assert!(err <= 1e-6, "{case}: {err}");
        }
    }

    /// Largest |W0 + d − ref| / max|ref| for a case at strength 1.
    fn rel_err(case: &str, target: &str, d: &[f32]) -> f32 {
        let base = golden("models/t2v/diffusion_pytorch_model.safetensors");
        let w0 = param(&base, &format!("{target}.weight")).data;
        let r = golden(&format!("references/lycoris/{case}.safetensors"));
        let want = param(&r, &format!("{target}.weight")).data;
        let scale = want.iter().fold(0f32, |a, b| a.max(b.abs()));
        let err = w0
            .iter()
            .zip(d)
            .zip(&want)
            .fold(0f32, |a, ((w, x), y)| a.max((w + x - y).abs()));
        err / scale
    }

    /// The goldens tell the traps apart: the wrong reading of each is far outside tolerance.
    #[test]
    fn traps_are_caught_by_the_goldens() {
        let base = golden("models/t2v/diffusion_pytorch_model.safetensors");
        let load = |case: &str| {
            let (name, t) = module_of(&golden(&format!("adapters/lycoris/{case}.safetensors")));
            Module::from_tensors(&name, &t).expect("module")
        };
        // s² (merge_to's error): LoHa with α 2, r 4 scaled twice
        let w0 = param(&base, "blocks.0.attn1.to_q.weight");
        let m = load("loha");
        let s = m.scale_rule().scale as f32;
        let d: Vec<f32> = fitted_delta(m, &w0).iter().map(|x| x * s).collect();
        assert!(rel_err("loha", "blocks.0.attn1.to_q", &d) > 1e-3);
        // BOFT stages applied in reverse order
        let w0 = param(&base, "blocks.0.ffn.net.2.weight");
        let Module::Boft {
            blocks,
            alpha,
            rescale,
        } = load("boft")
        else {
            panic!("boft")
        };
        let [st, n, b, _] = blocks.shape[..] else {
            panic!("shape")
        };
        let per = n * b * b;
        let mut rev = Vec::with_capacity(blocks.data.len());
        for i in (0..st).rev() {
            rev.extend_from_slice(&blocks.data[i * per..(i + 1) * per]);
        }
        let m = Module::Boft {
            blocks: Param::new(blocks.shape.clone(), rev),
            alpha,
            rescale,
        };
        let d = fitted_delta(m, &w0);
        assert!(rel_err("boft", "blocks.0.ffn.net.2", &d) > 1e-3);
        // OFT with its constraint ignored
        let w0 = param(&base, "blocks.2.attn1.to_out.0.weight");
        let Module::DiagOft {
            blocks, rescale, ..
        } = load("oft")
        else {
            panic!("oft")
        };
        let m = Module::DiagOft {
            blocks,
            alpha: None,
            rescale,
        };
        let d = fitted_delta(m, &w0);
        assert!(rel_err("oft", "blocks.2.attn1.to_out.0", &d) > 1e-3);
        // LoKr both full read with α/r-style scaling (stored α 1 over w1's 4 rows)
        let w0 = param(&base, "blocks.1.attn1.to_v.weight");
        let d: Vec<f32> = fitted_delta(load("lokr_full"), &w0)
            .iter()
            .map(|x| x / 4.0)
            .collect();
        assert!(rel_err("lokr_full", "blocks.1.attn1.to_v", &d) > 1e-3);
    }

    fn p(shape: &[usize]) -> Param {
        let n = shape.iter().product::<usize>();
        Param::new(
            shape.to_vec(),
            (0..n).map(|i| (i as f32 * 0.37).sin() * 0.1).collect(),
        )
    }

    #[test]
    fn lokr_scale_rule_both_full_vs_decomposed() {
        let full = Module::Lokr {
            w1: Factor::Full(p(&[4, 4])),
            w2: Factor::Full(p(&[8, 8])),
            alpha: Some(1.0),
        };
        let r = full.scale_rule();
        assert_eq!(r.scale, 1.0);
        assert!(
            r.why.contains("both factors full") && r.why.contains("alpha 1 ignored"),
            "{}",
            r.why
        );
        let dec = Module::Lokr {
            w1: Factor::Full(p(&[4, 4])),
            w2: Factor::Product(p(&[8, 2]), p(&[2, 8])),
            alpha: Some(1.0),
        };
        assert_eq!(dec.scale_rule().scale, 0.5);
    }
}
