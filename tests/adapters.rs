//! Adapter conventions against independent oracles: every convention parses into the
//! canonical form whose deltas (computed here in f64 from the canonical entries) match the
//! references the real tools produced (PEFT merge_and_unload, diffusers fuse_lora, float64
//! hand derivations, the SA3 formulas, Qwix deltas); translation round trips through the
//! real binary; bases in every WAN layout bind the same targets; errors name what they
//! must and write nothing.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use common::*;
use wanbake::adapter::bind::{BaseIndex, bound_ids, resolve_names};
use wanbake::adapter::names::ModuleId;
use wanbake::adapter::{
    AdapterError, AdapterOptions, AdapterSet, Convention, Entry, Kind, ParamRole, ScaleSource,
};
use wanbake::io::{Checkpoint, DType, SafetensorsFile};
use wanbake::model::transform::Transform;

// ---------------------------------------------------------------------------------------
// Reading tensors (f64) and small f64 linear algebra, all on the test side.

#[derive(Clone, Debug, PartialEq)]
struct T {
    shape: Vec<usize>,
    data: Vec<f64>,
}

fn read_all(path: &Path) -> BTreeMap<String, T> {
    let f = SafetensorsFile::open(path).unwrap_or_else(|e| panic!("{e}"));
    let mut out = BTreeMap::new();
    for info in f.infos() {
        let v = f.view(&info.name).unwrap();
        let data: Vec<f64> = match v.dtype {
            DType::F64 => v
                .bytes
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
                .collect(),
            _ => v.to_f32().unwrap().into_iter().map(f64::from).collect(),
        };
        out.insert(
            info.name.clone(),
            T {
                shape: info.shape.clone(),
                data,
            },
        );
    }
    out
}

fn golden(p: &str) -> PathBuf {
    repo().join("golden").join(p)
}

fn meta(path: &Path) -> BTreeMap<String, String> {
    SafetensorsFile::open(path).unwrap().metadata().clone()
}

/// (rows, cols) row-major product.
fn matmul(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for p in 0..k {
            let x = a[i * k + p];
            for j in 0..n {
                c[i * n + j] += x * b[p * n + j];
            }
        }
    }
    c
}

fn transpose(a: &[f64], m: usize, n: usize) -> Vec<f64> {
    let mut t = vec![0.0; a.len()];
    for i in 0..m {
        for j in 0..n {
            t[j * m + i] = a[i * n + j];
        }
    }
    t
}

/// Thin SVD by one-sided Jacobi: (U m×k, S, V n×k), S descending, U columns sign-fixed so
/// that their largest-|·| entry is positive (spec sa3_lora.md §1.5).
#[allow(non_snake_case)]
fn svd(W: &[f64], m: usize, n: usize) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    if m < n {
        let (u, s, v) = svd(&transpose(W, m, n), n, m);
        // W = (Wᵀ)ᵀ = V S Uᵀ: swap and re-canonicalise on the new U.
        return canonical(v, s, u, m, n);
    }
    let mut A = W.to_vec(); // m×n, columns rotated in place
    let mut V: Vec<f64> = (0..n * n)
        .map(|i| if i / n == i % n { 1.0 } else { 0.0 })
        .collect();
    for _sweep in 0..100 {
        let mut off = 0.0f64;
        for p in 0..n {
            for q in p + 1..n {
                let (mut a, mut b, mut c) = (0.0, 0.0, 0.0);
                for i in 0..m {
                    a += A[i * n + p] * A[i * n + p];
                    b += A[i * n + q] * A[i * n + q];
                    c += A[i * n + p] * A[i * n + q];
                }
                if c.abs() <= 1e-300 {
                    continue;
                }
                off = off.max(c.abs() / (a * b).sqrt());
                let zeta = (b - a) / (2.0 * c);
                let t = zeta.signum() / (zeta.abs() + (1.0 + zeta * zeta).sqrt());
                let t = if zeta == 0.0 { 1.0 } else { t };
                let cs = 1.0 / (1.0 + t * t).sqrt();
                let sn = cs * t;
                for i in 0..m {
                    let (x, y) = (A[i * n + p], A[i * n + q]);
                    A[i * n + p] = cs * x - sn * y;
                    A[i * n + q] = sn * x + cs * y;
                }
                for i in 0..n {
                    let (x, y) = (V[i * n + p], V[i * n + q]);
                    V[i * n + p] = cs * x - sn * y;
                    V[i * n + q] = sn * x + cs * y;
                }
            }
        }
        if off < 1e-15 {
            break;
        }
    }
    let s: Vec<f64> = (0..n)
        .map(|j| {
            (0..m)
                .map(|i| A[i * n + j] * A[i * n + j])
                .sum::<f64>()
                .sqrt()
        })
        .collect();
    let mut U = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            U[i * n + j] = A[i * n + j] / s[j];
        }
    }
    canonical(U, s, V, m, n)
}

/// Sorts by singular value and fixes signs; U is m×k, V is n×k.
#[allow(non_snake_case)]
fn canonical(
    U: Vec<f64>,
    s: Vec<f64>,
    V: Vec<f64>,
    m: usize,
    n: usize,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let k = s.len();
    let mut order: Vec<usize> = (0..k).collect();
    order.sort_by(|&a, &b| s[b].total_cmp(&s[a]));
    let (mut u2, mut v2, mut s2) = (vec![0.0; m * k], vec![0.0; n * k], vec![0.0; k]);
    for (j, &o) in order.iter().enumerate() {
        s2[j] = s[o];
        let mut best = 0usize;
        for i in 0..m {
            if U[i * k + o].abs() > U[best * k + o].abs() {
                best = i;
            }
        }
        let sign = if U[best * k + o] < 0.0 { -1.0 } else { 1.0 };
        for i in 0..m {
            u2[i * k + j] = sign * U[i * k + o];
        }
        for i in 0..n {
            v2[i * k + j] = sign * V[i * k + o];
        }
    }
    (u2, s2, v2)
}

fn load(set: &AdapterSet, e: &Entry, r: ParamRole) -> Vec<f64> {
    set.load(
        e.param(r)
            .unwrap_or_else(|| panic!("{} lacks {r:?}", e.module)),
    )
    .unwrap()
    .into_iter()
    .map(f64::from)
    .collect()
}

/// Normalises the rows (axis 1) or columns (axis 0) of V (m×n) and scales them by `mag`.
fn renorm(v: &[f64], m: usize, n: usize, mag: &[f64], rows: bool, eps: f64) -> Vec<f64> {
    let mut out = v.to_vec();
    if rows {
        for i in 0..m {
            let norm = (0..n).map(|j| v[i * n + j].powi(2)).sum::<f64>().sqrt() + eps;
            for j in 0..n {
                out[i * n + j] = mag[i] * v[i * n + j] / norm;
            }
        }
    } else {
        for j in 0..n {
            let norm = (0..m).map(|i| v[i * n + j].powi(2)).sum::<f64>().sqrt() + eps;
            for i in 0..m {
                out[i * n + j] = mag[j] * v[i * n + j] / norm;
            }
        }
    }
    out
}

/// The merged value of every bound target at application weight 1, from the canonical
/// entries alone (formulas: spec conventions.md §1, §2.5, §5.3; sa3_lora.md §1.4, §1.5).
#[allow(non_snake_case)]
fn merged(set: &AdapterSet, base: &BTreeMap<String, T>) -> BTreeMap<String, T> {
    let mut by_target: BTreeMap<String, Vec<&Entry>> = BTreeMap::new();
    for e in &set.entries {
        let b = e
            .binding
            .as_ref()
            .unwrap_or_else(|| panic!("{} unbound", e.module));
        by_target.entry(b.canonical.clone()).or_default().push(e);
    }
    let mut out = BTreeMap::new();
    for (name, entries) in by_target {
        let W = base
            .get(&name)
            .unwrap_or_else(|| panic!("base lacks {name}"))
            .clone();
        let out_dim = W.shape[0];
        let inp = W.data.len() / out_dim.max(1);
        let mut acc = W.data.clone();
        for e in &entries {
            let s = e.scale;
            let lowrank = |set: &AdapterSet| -> Vec<f64> {
                if e.kind.is_xs() {
                    let r = e.rank.unwrap();
                    let (u, _, v) = svd(&W.data, out_dim, inp);
                    let k = out_dim.min(inp);
                    let ur: Vec<f64> = (0..out_dim)
                        .flat_map(|i| (0..r).map(move |j| (i, j)))
                        .map(|(i, j)| u[i * k + j])
                        .collect();
                    let vr: Vec<f64> = (0..inp)
                        .flat_map(|i| (0..r).map(move |j| (i, j)))
                        .map(|(i, j)| v[i * k + j])
                        .collect();
                    let M = load(set, e, ParamRole::M);
                    let um = matmul(&ur, &M, out_dim, r, r);
                    matmul(&um, &transpose(&vr, inp, r), out_dim, r, inp)
                } else {
                    let r = e.rank.unwrap();
                    matmul(
                        &load(set, e, ParamRole::B),
                        &load(set, e, ParamRole::A),
                        out_dim,
                        r,
                        inp,
                    )
                }
            };
            match e.kind {
                Kind::Lora => {
                    for (a, d) in acc.iter_mut().zip(lowrank(set)) {
                        *a += s * d;
                    }
                }
                Kind::Diff => {
                    for (a, d) in acc.iter_mut().zip(load(set, e, ParamRole::Diff)) {
                        *a += d;
                    }
                }
                Kind::DiffBias => {
                    for (a, d) in acc.iter_mut().zip(load(set, e, ParamRole::DiffBias)) {
                        *a += d;
                    }
                }
                Kind::LoraBias => {
                    for (a, d) in acc.iter_mut().zip(load(set, e, ParamRole::LoraBias)) {
                        *a += s * d;
                    }
                }
                k => {
                    assert_eq!(
                        entries.len(),
                        1,
                        "{name}: a normalised kind shares its target"
                    );
                    let V: Vec<f64> = W
                        .data
                        .iter()
                        .zip(lowrank(set))
                        .map(|(w, d)| w + s * d)
                        .collect();
                    acc = match k {
                        Kind::PeftDora => renorm(
                            &V,
                            out_dim,
                            inp,
                            &load(set, e, ParamRole::Magnitude),
                            true,
                            0.0,
                        ),
                        Kind::DoraRows | Kind::DoraRowsXs => renorm(
                            &V,
                            out_dim,
                            inp,
                            &load(set, e, ParamRole::Magnitude),
                            true,
                            1e-12,
                        ),
                        Kind::DoraCols | Kind::DoraColsXs => renorm(
                            &V,
                            out_dim,
                            inp,
                            &load(set, e, ParamRole::Magnitude),
                            false,
                            1e-12,
                        ),
                        Kind::Bora | Kind::BoraXs => {
                            let H = renorm(
                                &V,
                                out_dim,
                                inp,
                                &load(set, e, ParamRole::MagnitudeR),
                                true,
                                1e-12,
                            );
                            renorm(
                                &H,
                                out_dim,
                                inp,
                                &load(set, e, ParamRole::MagnitudeC),
                                false,
                                1e-12,
                            )
                        }
                        Kind::LoraXs => V,
                        _ => unreachable!(),
                    };
                }
            }
        }
        out.insert(
            name,
            T {
                shape: W.shape,
                data: acc,
            },
        );
    }
    out
}

fn max_abs(v: &[f64]) -> f64 {
    v.iter().fold(0.0f64, |m, x| m.max(x.abs()))
}

/// Every expected tensor must match to 1e-6 relative to the tensor's magnitude, and the
/// targets must be exactly the expected ones.
#[track_caller]
fn assert_close(case: &str, got: &BTreeMap<String, T>, want: &BTreeMap<String, T>) {
    let gk: BTreeSet<&String> = got.keys().collect();
    let wk: BTreeSet<&String> = want.keys().collect();
    assert_eq!(gk, wk, "{case}: targets differ from the reference's");
    for (k, w) in want {
        let g = &got[k];
        assert_eq!(g.data.len(), w.data.len(), "{case}: {k} size");
        let err = g
            .data
            .iter()
            .zip(&w.data)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        let tol = 1e-6 * max_abs(&w.data).max(1e-30);
        assert!(
            err <= tol,
            "{case}: {k}: max |got - ref| = {err:e} > {tol:e}"
        );
    }
}

fn open(path: &Path, scale: Option<f64>) -> AdapterSet {
    AdapterSet::open(
        path,
        &AdapterOptions {
            scale,
            ..AdapterOptions::default()
        },
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

fn base_index(base: &Path) -> BaseIndex {
    let ck = wanbake::quant::base::open(base).unwrap();
    let (comp, model) = ck.single_part().unwrap();
    BaseIndex::new(base, &comp.tensors, model)
}

fn bound(adapter: &Path, base: &Path, scale: Option<f64>) -> AdapterSet {
    let mut set = open(adapter, scale);
    set.bind(&base_index(base), false)
        .unwrap_or_else(|e| panic!("{e}"));
    set
}

fn diffusers_base(dir: &str) -> BTreeMap<String, T> {
    read_all(&golden(&format!(
        "models/{dir}/diffusion_pytorch_model.safetensors"
    )))
}

// ---------------------------------------------------------------------------------------
// WAN conventions against diffusers / PEFT / hand-derived references.

struct WanCase {
    adapter: &'static str,
    base: &'static str,
    references: &'static [&'static str],
    convention: Convention,
}

const WAN_CASES: &[WanCase] = &[
    WanCase {
        adapter: "adapters/peft_plain",
        base: "t2v",
        references: &["peft_plain"],
        convention: Convention::Peft,
    },
    WanCase {
        adapter: "adapters/peft_rslora_pattern",
        base: "t2v",
        references: &["peft_rslora_pattern"],
        convention: Convention::Peft,
    },
    WanCase {
        adapter: "adapters/peft_dora",
        base: "t2v",
        references: &["peft_dora"],
        convention: Convention::Peft,
    },
    WanCase {
        adapter: "adapters/peft_bias",
        base: "t2v",
        references: &["peft_bias"],
        convention: Convention::Peft,
    },
    WanCase {
        adapter: "adapters/peft_i2v",
        base: "i2v",
        references: &["peft_i2v"],
        convention: Convention::Peft,
    },
    WanCase {
        adapter: "adapters/diffusers_lora",
        base: "t2v",
        references: &["diffusers_lora"],
        convention: Convention::Diffusers,
    },
    WanCase {
        adapter: "adapters/diffusers_lora_nometa",
        base: "t2v",
        references: &["diffusers_lora_nometa"],
        convention: Convention::Diffusers,
    },
    WanCase {
        adapter: "adapters/comfy_lora",
        base: "t2v",
        references: &["comfy_lora", "comfy_lora__handderived"],
        convention: Convention::Comfy,
    },
    WanCase {
        adapter: "adapters/comfy_lora_ab",
        base: "t2v",
        references: &["comfy_lora_ab__handderived"],
        convention: Convention::Comfy,
    },
    WanCase {
        adapter: "adapters/comfy_i2v",
        base: "i2v",
        references: &["comfy_i2v", "comfy_i2v__handderived"],
        convention: Convention::Comfy,
    },
    WanCase {
        adapter: "adapters/kohya_lora",
        base: "t2v",
        references: &["kohya_lora"],
        convention: Convention::Kohya,
    },
    WanCase {
        adapter: "adapters/kohya_wanfun",
        base: "t2v",
        references: &["kohya_wanfun__handderived"],
        convention: Convention::Kohya,
    },
    WanCase {
        adapter: "adapters/a14b_pair/high.safetensors",
        base: "a14b/transformer",
        references: &["a14b_pair__transformer"],
        convention: Convention::Comfy,
    },
    WanCase {
        adapter: "adapters/a14b_pair/low.safetensors",
        base: "a14b/transformer_2",
        references: &["a14b_pair__transformer_2"],
        convention: Convention::Comfy,
    },
];

/// Reference values: later files (hand derivations) override earlier ones key by key.
fn references(names: &[&str]) -> BTreeMap<String, T> {
    let mut want = BTreeMap::new();
    for n in names {
        want.extend(read_all(&golden(&format!("references/{n}.safetensors"))));
    }
    want
}

#[test]
fn wan_conventions_match_the_reference_tools() {
    for c in WAN_CASES {
        let base_dir = golden(&format!("models/{}", c.base));
        let set = bound(&golden(c.adapter), &base_dir, None);
        assert_eq!(set.convention, c.convention, "{}", c.adapter);
        let got = merged(&set, &diffusers_base(c.base));
        assert_close(c.adapter, &got, &references(c.references));
    }
}

#[test]
fn strength_half_of_linear_kinds_matches_the_tools() {
    // The canonical σ and deltas are linear in the strength for LoRA and diffs:
    // W + 0.5·(merged − W) must equal the tools' strength-0.5 results.
    for (adapter, refs) in [
        ("adapters/peft_plain", &["peft_plain__s0.5"][..]),
        (
            "adapters/comfy_lora",
            &["comfy_lora__s0.5", "comfy_lora__handderived__s0.5"][..],
        ),
    ] {
        let base = diffusers_base("t2v");
        let set = bound(&golden(adapter), &golden("models/t2v"), None);
        let half: BTreeMap<String, T> = merged(&set, &base)
            .into_iter()
            .map(|(k, m)| {
                let w = &base[&k].data;
                let data = w
                    .iter()
                    .zip(&m.data)
                    .map(|(w, m)| w + 0.5 * (m - w))
                    .collect();
                (
                    k,
                    T {
                        shape: m.shape,
                        data,
                    },
                )
            })
            .collect();
        assert_close(adapter, &half, &references(refs));
    }
}

#[test]
fn sigma_equals_the_scaling_the_reference_tool_applied() {
    // `__applied` holds PEFT's own `scaling` per module; PEFT-format adapters keep their
    // factors, so σ must be bit-identical (rsLoRA with rank/alpha patterns included).
    for case in [
        "peft_plain",
        "peft_rslora_pattern",
        "peft_dora",
        "peft_bias",
        "peft_i2v",
        "diffusers_lora",
        "diffusers_lora_nometa",
    ] {
        let base = if case == "peft_i2v" { "i2v" } else { "t2v" };
        let set = bound(
            &golden(&format!("adapters/{case}")),
            &golden(&format!("models/{base}")),
            None,
        );
        let scaling: BTreeMap<String, f64> = serde_json::from_str(
            &meta(&golden(&format!("references/{case}__applied.safetensors")))["scaling"],
        )
        .unwrap();
        let mut seen = 0;
        for e in set
            .entries
            .iter()
            .filter(|e| !matches!(e.kind, Kind::LoraBias))
        {
            let module = e
                .binding
                .as_ref()
                .unwrap()
                .canonical
                .trim_end_matches(".weight")
                .to_string();
            assert_eq!(Some(&e.scale), scaling.get(&module), "{case}: {module}");
            seen += 1;
        }
        assert_eq!(
            seen,
            scaling.len(),
            "{case}: every module PEFT scaled is an entry"
        );
    }
    let set = open(&golden("adapters/peft_rslora_pattern"), None);
    let src = |m: &str| {
        set.entries
            .iter()
            .find(|e| e.module == m)
            .unwrap()
            .scale_source
            .clone()
    };
    assert_eq!(
        src("base_model.model.blocks.1.attn1.to_q"),
        ScaleSource::PeftPattern {
            pattern: "blocks.1.attn1.to_q".into(),
            rslora: true
        }
    );
    assert_eq!(
        src("base_model.model.blocks.0.attn1.to_q"),
        ScaleSource::PeftConfig { rslora: true }
    );
    let nometa = open(&golden("adapters/diffusers_lora_nometa"), None);
    assert!(
        nometa
            .entries
            .iter()
            .all(|e| e.scale_source == ScaleSource::Folded)
    );
}

#[test]
fn conv_lora_keeps_its_kernel_and_views_flat() {
    let set = open(&golden("adapters/peft_rslora_pattern"), None);
    let e = set
        .entries
        .iter()
        .find(|e| e.module == "base_model.model.patch_embedding")
        .unwrap();
    assert_eq!(e.conv_kernel.as_deref(), Some(&[1, 2, 2][..]));
    assert_eq!(
        e.param(ParamRole::A).unwrap().shape,
        vec![e.rank.unwrap(), 16]
    );
    assert_eq!(
        e.param(ParamRole::B).unwrap().shape,
        vec![32, e.rank.unwrap()]
    );
}

// ---------------------------------------------------------------------------------------
// SA3 native and PEFT adapters against the float64 SA3-formula references.

const SA3_NATIVE: &[&str] = &[
    "lora",
    "dora-rows",
    "dora-cols",
    "bora",
    "lora-xs",
    "dora-rows-xs",
    "dora-cols-xs",
    "bora-xs",
    "dora-legacy-rows",
    "dora-legacy-cols",
    "dora-legacy-1d",
];

fn sa3_base() -> BTreeMap<String, T> {
    read_all(&golden("sa3/base/model.safetensors"))
}

#[test]
fn sa3_native_types_match_the_formula_references() {
    let base = sa3_base();
    let want_kind = |n: &str| match n {
        "lora" => Kind::Lora,
        "dora-rows" | "dora-legacy-rows" | "dora-legacy-1d" => Kind::DoraRows,
        "dora-cols" | "dora-legacy-cols" => Kind::DoraCols,
        "bora" => Kind::Bora,
        "lora-xs" => Kind::LoraXs,
        "dora-rows-xs" => Kind::DoraRowsXs,
        "dora-cols-xs" => Kind::DoraColsXs,
        _ => Kind::BoraXs,
    };
    for name in SA3_NATIVE {
        let set = bound(
            &golden(&format!("sa3/adapters/{name}.safetensors")),
            &golden("sa3/base/model.safetensors"),
            None,
        );
        assert_eq!(set.convention, Convention::Sa3);
        assert!(
            set.entries
                .iter()
                .all(|e| e.kind == want_kind(name) && e.scale_source == ScaleSource::Sa3Metadata),
            "{name}"
        );
        let got = merged(&set, &base);
        assert_close(
            name,
            &got,
            &read_all(&golden(&format!("sa3/references/{name}.safetensors"))),
        );
    }
}

#[test]
fn sa3_application_weights_and_two_adapters_combine_like_the_reference() {
    let base = sa3_base();
    let m = |n: &str| {
        merged(
            &bound(
                &golden(&format!("sa3/adapters/{n}.safetensors")),
                &golden("sa3/base/model.safetensors"),
                None,
            ),
            &base,
        )
    };
    let blend = |parts: &[(&BTreeMap<String, T>, f64)]| -> BTreeMap<String, T> {
        let mut out: BTreeMap<String, T> = BTreeMap::new();
        for (f, a) in parts {
            for (k, t) in f.iter() {
                let w = &base[k].data;
                let e = out.entry(k.clone()).or_insert_with(|| base[k].clone());
                for ((o, fw), w0) in e.data.iter_mut().zip(&t.data).zip(w) {
                    *o += a * (fw - w0);
                }
            }
        }
        out
    };
    let (lora, dora) = (m("lora"), m("dora-rows"));
    assert_close(
        "strength0.5",
        &blend(&[(&dora, 0.5)]),
        &read_all(&golden("sa3/references/strength0.5_dora-rows.safetensors")),
    );
    assert_close(
        "two_adapter",
        &blend(&[(&lora, 0.25), (&dora, 0.75)]),
        &read_all(&golden("sa3/references/two_adapter.safetensors")),
    );
}

#[test]
fn sa3_peft_adapters_match_real_peft() {
    let base = sa3_base();
    for name in ["peft_lora", "peft_dora"] {
        let set = bound(
            &golden(&format!("sa3/{name}")),
            &golden("sa3/base/model.safetensors"),
            None,
        );
        assert_eq!(set.convention, Convention::Peft);
        assert_close(
            name,
            &merged(&set, &base),
            &read_all(&golden(&format!("sa3/references/{name}.safetensors"))),
        );
    }
}

#[test]
fn legacy_dora_is_resolved_by_magnitude_shape() {
    for (name, kind) in [
        ("dora-legacy-cols", Kind::DoraCols),
        ("dora-legacy-rows", Kind::DoraRows),
        ("dora-legacy-1d", Kind::DoraRows),
    ] {
        let set = open(&golden(&format!("sa3/adapters/{name}.safetensors")), None);
        assert!(set.entries.iter().all(|e| e.kind == kind), "{name}");
        assert!(
            set.notes.iter().any(|n| n.contains("legacy")),
            "{name}: {:?}",
            set.notes
        );
    }
}

// ---------------------------------------------------------------------------------------
// Qwix / NNX.

#[test]
fn qwix_files_match_their_delta_references() {
    let base = diffusers_base("t2v");
    for (file, scale) in [
        ("qwix_per_layer", None),
        ("qwix_stacked", None),
        ("qwix_noscale", Some(2.0)),
    ] {
        let set = bound(
            &golden(&format!("qwix/{file}.safetensors")),
            &golden("models/t2v"),
            scale,
        );
        let want = read_all(&golden(&format!(
            "qwix/references/{file}__delta.safetensors"
        )));
        let got: BTreeMap<String, T> = merged(&set, &base)
            .into_iter()
            .map(|(k, m)| {
                let data = m
                    .data
                    .iter()
                    .zip(&base[&k].data)
                    .map(|(a, b)| a - b)
                    .collect();
                (
                    k,
                    T {
                        shape: m.shape,
                        data,
                    },
                )
            })
            .collect();
        assert_close(file, &got, &want);
        let src = if scale.is_some() {
            ScaleSource::User
        } else {
            ScaleSource::NnxMetadata
        };
        assert!(set.entries.iter().all(|e| e.scale_source == src), "{file}");
    }
}

#[test]
fn qwix_without_metadata_needs_an_explicit_scale() {
    let err = AdapterSet::open(
        &golden("qwix/qwix_noscale.safetensors"),
        &AdapterOptions::default(),
    )
    .unwrap_err();
    // How to give it (`--scale S`, `scale = S`) is the front end's hint.
    assert!(matches!(err, AdapterError::ScaleNeeded { .. }), "{err}");
    assert!(err.to_string().contains("does not guess"), "{err}");
}

// ---------------------------------------------------------------------------------------
// Binding against bases in every WAN layout.

/// An NNX base built from the diffusers t2v weights by the golden NNX layout oracle
/// (golden/nnx/*.json: names, transposes, stacking).
fn write_nnx_base(dir: &Path, scanned: bool) -> PathBuf {
    let spec: Vec<serde_json::Value> = serde_json::from_str(
        &std::fs::read_to_string(golden(&format!(
            "nnx/t2v_{}.json",
            if scanned { "scanned" } else { "unscanned" }
        )))
        .unwrap(),
    )
    .unwrap();
    let src = diffusers_base("t2v");
    let mut tensors: Vec<(String, Vec<usize>, Vec<f32>)> = Vec::new();
    for rec in &spec {
        let key = rec["key"].as_str().unwrap().to_string();
        let shape: Vec<usize> = rec["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as usize)
            .collect();
        let transform = rec["transform"].as_str().unwrap();
        let mut data = Vec::new();
        for sk in rec["source_keys"].as_array().unwrap() {
            let t = &src[sk.as_str().unwrap()];
            let v = if transform.starts_with("transpose(1,0)") {
                transpose(&t.data, t.shape[0], t.shape[1])
            } else if transform.starts_with("transpose(2,3,4,1,0)") {
                let [o, i, d, h, w] = t.shape[..] else {
                    panic!()
                };
                let mut v = vec![0.0; t.data.len()];
                for (oo, ii, dd, hh, ww) in (0..o).flat_map(|a| {
                    (0..i).flat_map(move |b| {
                        (0..d).flat_map(move |c| {
                            (0..h).flat_map(move |e| (0..w).map(move |f| (a, b, c, e, f)))
                        })
                    })
                }) {
                    v[(((dd * h + hh) * w + ww) * i + ii) * o + oo] =
                        t.data[(((oo * i + ii) * d + dd) * h + hh) * w + ww];
                }
                v
            } else {
                assert!(transform.starts_with("none"), "{transform}");
                t.data.clone()
            };
            data.extend(v.into_iter().map(|x| x as f32));
        }
        tensors.push((key, shape, data));
    }
    let path = dir.join(if scanned {
        "nnx_scanned.safetensors"
    } else {
        "nnx.safetensors"
    });
    let refs: Vec<(&str, Vec<usize>, Vec<f32>)> = tensors
        .iter()
        .map(|(k, s, d)| (k.as_str(), s.clone(), d.clone()))
        .collect();
    write_f32(&path, &refs);
    path
}

/// (adapter module, kind) → canonical target of a binding.
fn binding_map(set: &AdapterSet) -> BTreeMap<(String, Kind), String> {
    set.entries
        .iter()
        .map(|e| {
            (
                (e.module.clone(), e.kind),
                e.binding.as_ref().unwrap().canonical.clone(),
            )
        })
        .collect()
}

#[test]
fn every_wan_layout_binds_every_convention_to_the_same_targets() {
    let dir = tmp();
    let bases = [
        golden("models/t2v"),
        golden("models/t2v_original.safetensors"),
        golden("models/t2v_comfy.safetensors"),
        write_nnx_base(dir.path(), false),
        write_nnx_base(dir.path(), true),
    ];
    let diffusers = diffusers_base("t2v");
    let adapters = [
        ("adapters/peft_plain", None),
        ("adapters/peft_rslora_pattern", None),
        ("adapters/peft_bias", None),
        ("adapters/diffusers_lora", None),
        ("adapters/comfy_lora", None),
        ("adapters/comfy_lora_ab", None),
        ("adapters/kohya_lora", None),
        ("adapters/kohya_wanfun", None),
        ("qwix/qwix_stacked.safetensors", None),
        ("qwix/qwix_per_layer.safetensors", None),
    ];
    for (a, scale) in adapters {
        let reference = binding_map(&bound(&golden(a), &bases[0], scale));
        for base in &bases[1..] {
            let set = bound(&golden(a), base, scale);
            assert_eq!(
                binding_map(&set),
                reference,
                "{a} against {}",
                base.display()
            );
            // The stored base tensor, sliced and transformed back, is the diffusers tensor.
            let stored = read_all(
                Checkpoint::open_stored(base)
                    .unwrap()
                    .single()
                    .unwrap()
                    .tensors
                    .files()[0]
                    .path(),
            );
            for e in &set.entries {
                let b = e.binding.as_ref().unwrap();
                let t = &stored[&b.tensor];
                let (mut shape, mut data) = (t.shape.clone(), t.data.clone());
                if let Some(l) = b.layer {
                    let per = data.len() / shape[0];
                    data = data[l * per..(l + 1) * per].to_vec();
                    shape.remove(0);
                }
                let back = match b.to_canonical {
                    Transform::Identity => data,
                    Transform::Transpose => transpose(&data, shape[0], shape[1]),
                    Transform::DhwioToOidhw => {
                        let [d, h, w, i, o] = shape[..] else { panic!() };
                        let mut v = vec![0.0; data.len()];
                        for (dd, hh, ww, ii, oo) in (0..d).flat_map(|a| {
                            (0..h).flat_map(move |b| {
                                (0..w).flat_map(move |c| {
                                    (0..i).flat_map(move |e| (0..o).map(move |f| (a, b, c, e, f)))
                                })
                            })
                        }) {
                            v[(((oo * i + ii) * d + dd) * h + hh) * w + ww] =
                                data[(((dd * h + hh) * w + ww) * i + ii) * o + oo];
                        }
                        v
                    }
                    t => panic!("unexpected transform {t:?}"),
                };
                assert!(
                    back == diffusers[&b.canonical].data,
                    "{a}: {} (layer {:?}, {:?}) in {} is not `{}`",
                    b.tensor,
                    b.layer,
                    b.to_canonical,
                    base.display(),
                    b.canonical
                );
                assert_eq!(b.shape, diffusers[&b.canonical].shape);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Errors: unknown keys, unmatched entries, zero binding, shape mismatch, pickle.

/// Copies a golden adapter file and adds tensors.
fn with_extra(src: &Path, dst: &Path, extra: &[(&str, Vec<usize>)]) {
    let t = read_all(src);
    let mut all: Vec<(String, Vec<usize>, Vec<f32>)> = t
        .into_iter()
        .map(|(k, v)| (k, v.shape, v.data.into_iter().map(|x| x as f32).collect()))
        .collect();
    for (k, s) in extra {
        let n: usize = s.iter().product();
        all.push((k.to_string(), s.clone(), vec![0.5; n]));
    }
    let refs: Vec<(&str, Vec<usize>, Vec<f32>)> = all
        .iter()
        .map(|(k, s, d)| (k.as_str(), s.clone(), d.clone()))
        .collect();
    write_f32(dst, &refs);
}

#[test]
fn unknown_and_unsupported_keys_are_listed_by_name() {
    let dir = tmp();
    let bad = dir.path().join("bad.safetensors");
    with_extra(
        &golden("adapters/comfy_lora/comfy_lora.safetensors"),
        &bad,
        &[
            ("diffusion_model.blocks.0.self_attn.k.hada_w1_a", vec![4, 4]),
            ("diffusion_model.blocks.0.ffn.0.dora_scale", vec![80, 1]),
            (
                "diffusion_model.blocks.1.self_attn.v.lora_up.weight",
                vec![32, 4],
            ),
            ("something_else", vec![2]),
        ],
    );
    let err = wanbake::error_text::chain(
        &AdapterSet::open(&bad, &AdapterOptions::default()).unwrap_err(),
    );
    for k in [
        "diffusion_model.blocks.0.self_attn.k.hada_w1_a",
        "diffusion_model.blocks.0.ffn.0.dora_scale",
        "diffusion_model.blocks.1.self_attn.v.lora_up.weight",
        "something_else",
        // a LoHa tensor on a LoRA module (LyCORIS modules are read since issue 14)
        "one module has one algorithm",
        "DoRA",
        "only one of its two LoRA factors",
        // (the way out, `--allow-unmatched`, is the front end's hint)
        "every key must be consumed",
    ] {
        assert!(err.contains(k), "missing `{k}` in:\n{err}");
    }
    let set = AdapterSet::open(
        &bad,
        &AdapterOptions {
            allow_unmatched: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(set.unparsed.len(), 4);
    // The binary refuses too, and writes nothing.
    let out = dir.path().join("out");
    let o = run(
        dir.path(),
        &[
            "translate",
            bad.to_str().unwrap(),
            "--to",
            "comfy",
            "--out",
            out.to_str().unwrap(),
        ],
    );
    let (code, _, stderr) = parts(&o);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("something_else"), "{stderr}");
    assert_eq!(tree(dir.path()), vec!["bad.safetensors"]);
}

#[test]
fn unmatched_entries_are_errors_unless_allowed() {
    let dir = tmp();
    let bad = dir.path().join("extra_block.safetensors");
    with_extra(
        &golden("adapters/kohya_lora/kohya_lora.safetensors"),
        &bad,
        &[
            (
                "lora_unet_blocks_7_self_attn_q.lora_down.weight",
                vec![4, 32],
            ),
            ("lora_unet_blocks_7_self_attn_q.lora_up.weight", vec![32, 4]),
        ],
    );
    let mut set = AdapterSet::open(&bad, &AdapterOptions::default()).unwrap();
    let err = set
        .bind(&base_index(&golden("models/t2v")), false)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("lora_unet_blocks_7_self_attn_q") && err.contains("no base module"),
        "{err}"
    );
    let mut set = AdapterSet::open(
        &bad,
        &AdapterOptions {
            allow_unmatched: true,
            ..Default::default()
        },
    )
    .unwrap();
    let report = set.bind(&base_index(&golden("models/t2v")), true).unwrap();
    assert_eq!(report.unmatched.len(), 1);
    assert_eq!(report.unmatched[0].module, "lora_unet_blocks_7_self_attn_q");
    assert_eq!(report.bound.len(), 30);
    // inspect --base lists it and exits 1.
    let o = run(
        dir.path(),
        &[
            "inspect",
            bad.to_str().unwrap(),
            "--base",
            golden("models/t2v").to_str().unwrap(),
        ],
    );
    let (code, stdout, stderr) = parts(&o);
    assert_eq!(code, 1);
    assert!(
        stdout.contains("unbound:    lora_unet_blocks_7_self_attn_q"),
        "{stdout}"
    );
    assert!(
        stderr.contains("lora_unet_blocks_7_self_attn_q"),
        "{stderr}"
    );
}

#[test]
fn the_norm_swap_never_binds_the_wrong_norm() {
    // Original `blocks.N.norm2` is the FFN norm (no parameters); diffusers `norm2` is the
    // original `norm3`. A ComfyUI diff on `norm2` must not land on diffusers `norm2`.
    let dir = tmp();
    let bad = dir.path().join("norm2.safetensors");
    with_extra(
        &golden("adapters/comfy_lora/comfy_lora.safetensors"),
        &bad,
        &[("diffusion_model.blocks.1.norm2.diff", vec![32])],
    );
    let mut set = AdapterSet::open(&bad, &AdapterOptions::default()).unwrap();
    let err = set
        .bind(&base_index(&golden("models/t2v")), false)
        .unwrap_err()
        .to_string();
    assert!(err.contains("diffusion_model.blocks.1.norm2"), "{err}");
}

#[test]
fn zero_binding_names_the_variant_the_adapter_targets() {
    let dir = tmp();
    // A Wan2.1-T2V-1.3B LoRA (inner_dim 1536) on block 29, which the tiny base lacks.
    let a = dir.path().join("wan13b.safetensors");
    write_f32(
        &a,
        &[
            (
                "diffusion_model.blocks.29.self_attn.q.lora_down.weight",
                vec![2, 1536],
                vec![0.0; 2 * 1536],
            ),
            (
                "diffusion_model.blocks.29.self_attn.q.lora_up.weight",
                vec![1536, 2],
                vec![0.0; 2 * 1536],
            ),
            (
                "diffusion_model.blocks.29.ffn.0.lora_down.weight",
                vec![2, 1536],
                vec![0.0; 2 * 1536],
            ),
            (
                "diffusion_model.blocks.29.ffn.0.lora_up.weight",
                vec![8960, 2],
                vec![0.0; 2 * 8960],
            ),
        ],
    );
    let mut set = AdapterSet::open(&a, &AdapterOptions::default()).unwrap();
    let err = set
        .bind(&base_index(&golden("models/t2v")), false)
        .unwrap_err();
    assert!(matches!(err, AdapterError::NoBinding { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("Wan2.1-T2V-1.3B") && msg.contains("inner_dim 32"),
        "{msg}"
    );
    // A WAN LoRA against the SA3 base, and an SA3 adapter against a WAN base.
    let mut wan = open(&golden("adapters/peft_plain"), None);
    let msg = wan
        .bind(&base_index(&golden("sa3/base/model.safetensors")), false)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("binds to none") && msg.contains("SA3"),
        "{msg}"
    );
    let mut sa3 = open(&golden("sa3/adapters/lora.safetensors"), None);
    let msg = sa3
        .bind(&base_index(&golden("models/t2v")), false)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("binds to none") && msg.contains("(sa3)"),
        "{msg}"
    );
    // inspect says it in one line.
    let o = run(
        dir.path(),
        &[
            "inspect",
            a.to_str().unwrap(),
            "--base",
            golden("models/t2v").to_str().unwrap(),
        ],
    );
    let (code, stdout, _) = parts(&o);
    assert_eq!(code, 1);
    assert!(stdout.contains("made for:   Wan2.1-T2V-1.3B"), "{stdout}");
    assert!(
        stdout.contains("verdict:    the adapter's names and shapes fit Wan2.1-T2V-1.3B"),
        "{stdout}"
    );
}

#[test]
fn a_mismatched_shape_names_file_key_expected_and_found() {
    let mut set = open(&golden("adapters/mismatch_1p3b_like"), None);
    let msg = set
        .bind(&base_index(&golden("models/t2v")), false)
        .unwrap_err()
        .to_string();
    for k in [
        "mismatch_1p3b_like",
        "diffusion_model.blocks.0.self_attn.q.lora_up.weight",
        "[48, 4]",
        "expected [32, 4]",
        "inner_dim 48",
        "inner_dim 32",
    ] {
        assert!(msg.contains(k), "missing `{k}` in:\n{msg}");
    }
}

#[test]
fn pickle_adapters_are_refused() {
    let dir = tmp();
    for name in ["lora.pt", "lora.ckpt", "adapter_model.bin"] {
        let p = dir.path().join(name);
        std::fs::write(&p, b"\x80\x02}q\x00.").unwrap();
        let err = AdapterSet::open(&p, &AdapterOptions::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains("pickle"), "{name}: {err}");
        let out = dir.path().join(format!("{name}.out"));
        let o = run(
            dir.path(),
            &[
                "translate",
                p.to_str().unwrap(),
                "--to",
                "peft",
                "--out",
                out.to_str().unwrap(),
            ],
        );
        let (code, _, stderr) = parts(&o);
        assert_eq!(code, 1);
        assert!(stderr.contains("pickle"), "{stderr}");
        assert!(!out.exists());
    }
    // A zip (torch.save) disguised as .safetensors.
    let p = dir.path().join("disguised.safetensors");
    std::fs::write(
        &p,
        b"PK\x03\x04 torch zip archive with pickled objects ........",
    )
    .unwrap();
    let err = AdapterSet::open(&p, &AdapterOptions::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("pickle"), "{err}");
}

#[test]
fn peft_configs_that_change_the_merge_are_refused() {
    let dir = tmp();
    let src = golden("adapters/peft_plain");
    for (field, value, expect) in [
        ("fan_in_fan_out", "true", "fan_in_fan_out"),
        (
            "init_lora_weights",
            "\"pissa_niter_16\"",
            "path_initial_model_for_weight_conversion",
        ),
        ("init_lora_weights", "\"olora\"", "modified"),
        // LOHA/LOKR folders are read since issue 14; other types are refused
        ("peft_type", "\"BOFT\"", "LORA"),
        ("use_dora", "true", "lora_magnitude_vector"),
        ("use_qalora", "true", "use_qalora"),
    ] {
        let d = dir.path().join(format!("{field}_{}", value.len()));
        std::fs::create_dir(&d).unwrap();
        std::fs::copy(
            src.join("adapter_model.safetensors"),
            d.join("adapter_model.safetensors"),
        )
        .unwrap();
        let mut cfg: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(src.join("adapter_config.json")).unwrap(),
        )
        .unwrap();
        cfg[field] = serde_json::from_str(value).unwrap();
        std::fs::write(d.join("adapter_config.json"), cfg.to_string()).unwrap();
        let err = AdapterSet::open(&d, &AdapterOptions::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains(expect), "{field}={value}: {err}");
    }
}

// ---------------------------------------------------------------------------------------
// Translation through the binary: lossless round trips, exact refusals.

/// The canonical form, keyed by module identity: kind, rank, σ and every tensor's bits.
/// Spellings that mean the same are identified: PEFT DoRA ≡ SA3 dora-rows (up to SA3's
/// ε, which `translate` reports), a σ = 1 `lora_B.bias` ≡ `diff_b`.
type Canon = BTreeMap<
    (ModuleId, Kind),
    (
        Option<usize>,
        u64,
        BTreeMap<ParamRole, (Vec<usize>, Vec<u32>)>,
    ),
>;

fn canon(path: &Path, scale: Option<f64>, base: Option<&Path>) -> Canon {
    let mut set = open(path, scale);
    let ids: Vec<ModuleId> = match base {
        None => resolve_names(&set).unwrap_or_else(|e| panic!("{e}")),
        Some(b) => {
            let report = set
                .bind(&base_index(b), false)
                .unwrap_or_else(|e| panic!("{e}"));
            bound_ids(&set, &report)
                .into_iter()
                .map(Option::unwrap)
                .collect()
        }
    };
    let mut out = Canon::new();
    for (e, id) in set.entries.iter().zip(ids) {
        let mut params: BTreeMap<ParamRole, (Vec<usize>, Vec<u32>)> = e
            .params
            .iter()
            .map(|(r, s)| {
                (
                    *r,
                    (
                        s.shape.clone(),
                        set.load(s).unwrap().iter().map(|x| x.to_bits()).collect(),
                    ),
                )
            })
            .collect();
        let (kind, rank) = match e.kind {
            Kind::PeftDora => (Kind::DoraRows, e.rank),
            Kind::LoraBias if e.scale == 1.0 => {
                let b = params.remove(&ParamRole::LoraBias).unwrap();
                params.insert(ParamRole::DiffBias, b);
                (Kind::DiffBias, None)
            }
            k => (k, e.rank),
        };
        assert!(
            out.insert((id, kind), (rank, e.scale.to_bits(), params))
                .is_none()
        );
    }
    out
}

/// (source, --scale, base used for every step, conventions it must translate to).
type RoundTrip = (
    &'static str,
    Option<&'static str>,
    Option<&'static str>,
    &'static [&'static str],
);

const ROUND_TRIPS: &[RoundTrip] = &[
    (
        "adapters/peft_plain",
        None,
        None,
        &["peft", "diffusers", "comfy", "kohya", "sa3", "nnx"],
    ),
    (
        "adapters/peft_rslora_pattern",
        None,
        None,
        &["peft", "diffusers", "comfy", "kohya"],
    ),
    (
        "adapters/peft_dora",
        None,
        None,
        &["peft", "diffusers", "sa3"],
    ),
    (
        "adapters/peft_bias",
        None,
        None,
        &["peft", "diffusers", "comfy"],
    ),
    (
        "adapters/peft_i2v",
        None,
        None,
        &["peft", "diffusers", "comfy", "kohya", "sa3", "nnx"],
    ),
    (
        "adapters/diffusers_lora",
        None,
        None,
        &["peft", "diffusers", "comfy", "kohya", "sa3", "nnx"],
    ),
    (
        "adapters/diffusers_lora_nometa",
        None,
        None,
        &["peft", "diffusers", "comfy", "kohya", "sa3", "nnx"],
    ),
    ("adapters/comfy_lora", None, None, &["comfy"]),
    ("adapters/comfy_lora", None, Some("models/t2v"), &["comfy"]),
    (
        "adapters/comfy_lora_ab",
        None,
        None,
        &["peft", "diffusers", "comfy", "kohya"],
    ),
    ("adapters/comfy_i2v", None, None, &["comfy"]),
    (
        "adapters/kohya_lora",
        None,
        None,
        &["peft", "diffusers", "comfy", "kohya"],
    ),
    (
        "adapters/kohya_wanfun",
        None,
        None,
        &["peft", "diffusers", "comfy", "kohya"],
    ),
    (
        "adapters/a14b_pair/high.safetensors",
        None,
        None,
        &["peft", "diffusers", "comfy", "kohya"],
    ),
    (
        "qwix/qwix_per_layer.safetensors",
        None,
        None,
        &["peft", "diffusers", "comfy", "kohya", "sa3", "nnx"],
    ),
    (
        "qwix/qwix_stacked.safetensors",
        None,
        None,
        &["peft", "diffusers", "comfy", "kohya", "sa3", "nnx"],
    ),
    (
        "qwix/qwix_stacked.safetensors",
        None,
        Some("models/t2v_original.safetensors"),
        &["peft", "diffusers", "comfy", "kohya", "sa3", "nnx"],
    ),
    (
        "qwix/qwix_noscale.safetensors",
        Some("2"),
        None,
        &["peft", "diffusers", "comfy", "kohya", "sa3", "nnx"],
    ),
    (
        "sa3/adapters/lora.safetensors",
        None,
        Some(SA3_BASE),
        &["peft", "diffusers", "comfy", "kohya", "sa3"],
    ),
    (
        "sa3/adapters/dora-rows.safetensors",
        None,
        Some(SA3_BASE),
        &["peft", "diffusers", "sa3"],
    ),
    (
        "sa3/adapters/dora-legacy-1d.safetensors",
        None,
        Some(SA3_BASE),
        &["peft", "diffusers", "sa3"],
    ),
    (
        "sa3/adapters/dora-cols.safetensors",
        None,
        Some(SA3_BASE),
        &["sa3"],
    ),
    (
        "sa3/adapters/dora-legacy-cols.safetensors",
        None,
        None,
        &["sa3"],
    ),
    ("sa3/adapters/bora.safetensors", None, None, &["sa3"]),
    ("sa3/adapters/lora-xs.safetensors", None, None, &["sa3"]),
    (
        "sa3/adapters/dora-rows-xs.safetensors",
        None,
        None,
        &["sa3"],
    ),
    (
        "sa3/adapters/dora-cols-xs.safetensors",
        None,
        None,
        &["sa3"],
    ),
    (
        "sa3/adapters/bora-xs.safetensors",
        None,
        Some(SA3_BASE),
        &["sa3"],
    ),
    (
        "sa3/peft_lora",
        None,
        Some(SA3_BASE),
        &["peft", "diffusers", "comfy", "kohya", "sa3", "nnx"],
    ),
    ("sa3/peft_dora", None, None, &["peft", "diffusers", "sa3"]),
];

const SA3_BASE: &str = "sa3/base/model.safetensors";

#[test]
fn translations_round_trip_exactly_or_refuse_with_reasons() {
    let dir = tmp();
    let all = ["peft", "diffusers", "comfy", "kohya", "sa3", "nnx"];
    for (n, (src, scale, base, ok)) in ROUND_TRIPS.iter().enumerate() {
        let src_path = golden(src);
        let base = base.map(golden);
        let sc = scale.map(|s| s.parse::<f64>().unwrap());
        let original = canon(&src_path, sc, base.as_deref());
        let from = open(&src_path, sc).convention;
        let with_base = |mut args: Vec<String>| {
            if let Some(b) = &base {
                args.extend(["--base".to_string(), b.display().to_string()]);
            }
            args
        };
        for to in all {
            let mid = dir.path().join(format!("{n}_{to}"));
            let mut args: Vec<String> = [
                "translate",
                src_path.to_str().unwrap(),
                "--to",
                to,
                "--out",
                mid.to_str().unwrap(),
            ]
            .map(String::from)
            .to_vec();
            if let Some(s) = scale {
                args.extend(["--scale".to_string(), s.to_string()]);
            }
            let args = with_base(args);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let (code, _, stderr) = parts(&run(dir.path(), &args));
            if !ok.contains(&to) {
                assert_eq!(code, 1, "{src} → {to} should be refused");
                assert!(
                    stderr.contains("cannot be expressed in the"),
                    "{src} → {to}: {stderr}"
                );
                assert!(!mid.exists(), "{src} → {to}: output written on refusal");
                continue;
            }
            assert_eq!(code, 0, "{src} → {to}: {stderr}");
            assert!(mid.join("wanbake.manifest.json").is_file());
            assert_eq!(
                canon(&mid, None, base.as_deref()),
                original,
                "{src} → {to}: canonical form changed"
            );
            let back = dir.path().join(format!("{n}_{to}_back"));
            let args = with_base(
                [
                    "translate",
                    mid.to_str().unwrap(),
                    "--to",
                    from.as_str(),
                    "--out",
                    back.to_str().unwrap(),
                ]
                .map(String::from)
                .to_vec(),
            );
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let (code, _, stderr) = parts(&run(dir.path(), &args));
            assert_eq!(code, 0, "{src} → {to} → {from}: {stderr}");
            assert_eq!(
                canon(&back, None, base.as_deref()),
                original,
                "{src} → {to} → {from}: canonical form changed"
            );
        }
    }
}

#[test]
fn refusals_say_which_entries_and_why() {
    let dir = tmp();
    for (src, to, expect) in [
        (
            "adapters/comfy_lora",
            "peft",
            "diffusion_model.blocks.2.modulation (diff; keys diffusion_model.blocks.2.diff_m): a full-tensor diff has no PEFT/diffusers spelling",
        ),
        (
            "sa3/adapters/bora.safetensors",
            "peft",
            "bora has no PEFT spelling",
        ),
        (
            "sa3/adapters/dora-cols-xs.safetensors",
            "peft",
            "dora-cols-xs has no PEFT spelling",
        ),
        ("adapters/peft_bias", "kohya", "lora_B.bias"),
        ("adapters/peft_dora", "comfy", "dora_scale"),
        (
            "adapters/kohya_lora",
            "sa3",
            "one adapter_type, rank and alpha",
        ),
    ] {
        let out = dir.path().join("o");
        let (code, _, stderr) = parts(&run(
            dir.path(),
            &[
                "translate",
                golden(src).to_str().unwrap(),
                "--to",
                to,
                "--out",
                out.to_str().unwrap(),
            ],
        ));
        assert_eq!(code, 1);
        assert!(stderr.contains(expect), "{src} → {to}:\n{stderr}");
        assert!(
            tree(dir.path()).is_empty(),
            "{src} → {to}: {:?}",
            tree(dir.path())
        );
    }
}

#[test]
fn translated_files_carry_scale_metadata_as_each_convention_expects() {
    let dir = tmp();
    let t = |src: &str, to: &str| {
        let out = dir.path().join(format!("{}_{to}", src.replace('/', "_")));
        ok(run(
            dir.path(),
            &[
                "translate",
                golden(src).to_str().unwrap(),
                "--to",
                to,
                "--out",
                out.to_str().unwrap(),
            ],
        ));
        out
    };
    // kohya alphas (1, 2, 4, 8, 3 at r = 4) become a PEFT alpha_pattern; rsLoRA stays rsLoRA.
    let cfg: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(t("adapters/kohya_lora", "peft").join("adapter_config.json"))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(cfg["r"], 4);
    assert!(!cfg["alpha_pattern"].as_object().unwrap().is_empty());
    let cfg: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            t("adapters/peft_rslora_pattern", "peft").join("adapter_config.json"),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(cfg["use_rslora"], true);
    assert_eq!(cfg["rank_pattern"]["blocks\\.1\\.attn1\\.to_q"], 8);
    // rsLoRA σ = 6/√8 written as an α/r `.alpha`: stored in F64 so α/r is σ exactly.
    let comfy =
        read_all(&t("adapters/peft_rslora_pattern", "comfy").join("adapter_model.safetensors"));
    let a = &comfy["diffusion_model.blocks.1.self_attn.q.alpha"];
    assert_eq!(a.data[0] / 8.0, 6.0 / 8f64.sqrt());
    // diffusers metadata, SA3 lora_config and NNX metadata.
    let m = meta(&t("adapters/peft_plain", "diffusers").join("pytorch_lora_weights.safetensors"));
    let md: serde_json::Value = serde_json::from_str(&m["lora_adapter_metadata"]).unwrap();
    assert_eq!(
        (
            md["transformer.r"].clone(),
            md["transformer.lora_alpha"].clone()
        ),
        (4.into(), 8.into())
    );
    let m = meta(&t("adapters/peft_plain", "sa3").join("adapter_model.safetensors"));
    let lc: serde_json::Value = serde_json::from_str(&m["lora_config"]).unwrap();
    assert_eq!(
        (
            lc["rank"].clone(),
            lc["alpha"].clone(),
            lc["adapter_type"].clone()
        ),
        (4.into(), 8.into(), "lora".into())
    );
    let m = meta(&t("adapters/peft_plain", "nnx").join("adapter_model.safetensors"));
    assert_eq!(
        (m["lora_alpha"].as_str(), m["lora_rank"].as_str()),
        ("8.0", "4")
    );
    // NNX factors are the transposes of PEFT's (lora_A = aᵀ): compare with the Qwix PEFT reference.
    let nnx = read_all(&golden("qwix/qwix_per_layer.safetensors"));
    let peft =
        read_all(&t("qwix/qwix_per_layer.safetensors", "peft").join("adapter_model.safetensors"));
    let a = &nnx["blocks.1.ffn.proj_out.kernel_lora_a"];
    assert_eq!(
        peft["base_model.model.blocks.1.ffn.net.2.lora_A.weight"].data,
        transpose(&a.data, a.shape[0], a.shape[1])
    );
    let qref = read_all(&golden("qwix/references/qwix_per_layer__peft.safetensors"));
    for (k, v) in &qref {
        assert_eq!(&peft[k], v, "{k}");
    }
    // SA3 tensors keep fp16.
    let sa3 = SafetensorsFile::open(
        &t("sa3/adapters/dora-rows.safetensors", "peft").join("adapter_model.safetensors"),
    )
    .unwrap();
    assert!(sa3.infos().iter().all(|i| i.dtype == DType::F16));
}

#[test]
fn translate_with_a_base_uses_its_names_and_checks_shapes() {
    let dir = tmp();
    let out = dir.path().join("o");
    // kohya → PEFT through an original-layout base.
    ok(run(
        dir.path(),
        &[
            "translate",
            golden("adapters/kohya_wanfun").to_str().unwrap(),
            "--to",
            "peft",
            "--base",
            golden("models/t2v_comfy.safetensors").to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ],
    ));
    let peft = read_all(&out.join("adapter_model.safetensors"));
    assert!(peft.contains_key("base_model.model.blocks.2.attn1.to_out.0.lora_A.weight"));
    // The wrong base is refused before anything is written.
    let out2 = dir.path().join("o2");
    let (code, _, stderr) = parts(&run(
        dir.path(),
        &[
            "translate",
            golden("adapters/mismatch_1p3b_like").to_str().unwrap(),
            "--to",
            "comfy",
            "--base",
            golden("models/t2v").to_str().unwrap(),
            "--out",
            out2.to_str().unwrap(),
        ],
    ));
    assert_eq!(code, 1);
    assert!(stderr.contains("do not fit the base"), "{stderr}");
    assert!(!out2.exists());
}

// ---------------------------------------------------------------------------------------
// inspect.

#[test]
fn inspect_reports_convention_kinds_ranks_scales_and_bindings() {
    let dir = tmp();
    let o = run(
        dir.path(),
        &[
            "inspect",
            "--json",
            golden("adapters/peft_rslora_pattern").to_str().unwrap(),
            "--base",
            golden("models/t2v").to_str().unwrap(),
        ],
    );
    let (code, stdout, stderr) = parts(&o);
    assert_eq!(code, 0, "{stderr}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let a = &v[0]["components"][0]["adapter"];
    assert_eq!(a["convention"], "peft");
    assert_eq!(a["kinds"]["lora"], 19);
    assert_eq!(a["ranks"]["2"], 3);
    assert_eq!(
        a["rank_by_module"]["base_model.model.blocks.1.attn1.to_q"],
        8
    );
    assert!(
        a["scales"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["source"]["pattern"] == "patch_embedding" && s["scale"] == 5.0)
    );
    let b = &a["bindings"][0];
    assert_eq!(b["naming"], "diffusers");
    assert!(
        b["bound"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["module"] == "base_model.model.patch_embedding"
                && x["target"] == "patch_embedding.weight")
    );
    // Text for people, a stacked NNX file.
    let o = run(
        dir.path(),
        &[
            "inspect",
            golden("qwix/qwix_stacked.safetensors").to_str().unwrap(),
        ],
    );
    let out = ok(o);
    assert!(
        out.contains("nnx convention, 21 entries (lora ×21)"),
        "{out}"
    );
    assert!(
        out.contains("σ 1.5, α 6 (lora_alpha/lora_rank metadata) ×21"),
        "{out}"
    );
    assert!(out.contains("blocks.*.ffn.net.2 ×3"), "{out}");
}

// Issue 28: `inspect` decided "adapter" from its own suffix list, which lacked (IA)³'s
// `on_input` (and every LyCORIS factor but `hada_w1_a`/`lokr_w1`, the rest passing only by
// their `.alpha`), so an (IA)³ file was an "unknown model" that `merge` read fine. Now it
// asks the adapter module, which answers from the suffix tables its parsers read.
#[test]
fn r_issue_28_inspect_describes_every_lycoris_kind_as_an_adapter() {
    let dir = tmp();
    // (IA)³ as text: the adapter section, its kind and the module it scales.
    let ia3 = golden("adapters/lycoris/ia3_in.safetensors");
    let out = ok(run(dir.path(), &["inspect", ia3.to_str().unwrap()]));
    assert!(out.contains("\n  adapter\n"), "{out}");
    assert!(!out.contains("model:"), "{out}");
    assert!(
        out.contains("adapter:    lycoris convention, 1 entries (ia3 ×1)"),
        "{out}"
    );
    assert!(
        out.contains(
            "lycoris:    lycoris_blocks_1_attn2_to_q (ia3, 32 input channels): σ 1 (LyCORIS \
             rule: no scale: (IA)³ has no alpha) → blocks.1.attn2.to_q.weight"
        ),
        "{out}"
    );
    // Every golden LyCORIS kind, in both namings, as JSON.
    let cases: [(&str, &[&str]); 18] = [
        ("loha", &["loha"]),
        ("lokr_w2ab", &["lokr"]),
        ("lokr_both_dec", &["lokr"]),
        ("lokr_full", &["lokr"]),
        ("oft", &["diag-oft"]),
        ("oft_free", &["diag-oft"]),
        ("boft", &["boft"]),
        ("glora", &["glora"]),
        ("ia3_out", &["ia3"]),
        ("ia3_in", &["ia3"]),
        ("full", &["diff", "diff-bias"]),
        ("conv_loha", &["loha"]),
        ("conv_lokr", &["lokr"]),
        ("conv_lokr_full", &["lokr"]),
        ("conv_oft", &["diag-oft"]),
        ("conv_ia3_in", &["ia3"]),
        ("conv_loha_tucker", &["loha"]),
        ("conv_lokr_tucker", &["lokr"]),
    ];
    let mut files = Vec::new();
    for (case, kinds) in cases {
        for (naming, suffix) in [("lycoris", ""), ("kohya", "__kohya")] {
            let f = golden(&format!("adapters/lycoris/{case}{suffix}.safetensors"));
            files.push((f.to_str().unwrap().to_string(), naming, kinds));
        }
    }
    // An OFT module with no stored alpha (no constraint) has no suffix the old list knew.
    let oft = dir.path().join("oft_no_alpha.safetensors");
    let blocks: Vec<f32> = (0..128).map(|i| i as f32 * 0.01).collect();
    write_f32(
        &oft,
        &[(
            "lycoris_blocks_2_attn2_to_q.oft_blocks",
            vec![8, 4, 4],
            blocks,
        )],
    );
    files.push((oft.to_str().unwrap().to_string(), "lycoris", &["diag-oft"]));
    let mut args = vec!["inspect", "--json"];
    args.extend(files.iter().map(|(f, _, _)| f.as_str()));
    let v: serde_json::Value = serde_json::from_str(&ok(run(dir.path(), &args))).unwrap();
    for (i, (file, naming, kinds)) in files.iter().enumerate() {
        let c = &v[i]["components"][0];
        assert_eq!(c["role"], "adapter", "{file}");
        assert!(c.get("fingerprint").is_none(), "{file}");
        let a = &c["adapter"];
        assert_eq!(a["convention"], *naming, "{file}");
        let got: Vec<&str> = a["kinds"]
            .as_object()
            .unwrap_or_else(|| panic!("{file}: no adapter section"))
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(got, *kinds, "{file}");
        if !kinds.contains(&"diff") {
            assert_eq!(a["lycoris"][0]["kind"], kinds[0], "{file}");
        }
    }
}

// ---------------------------------------------------------------------------------------
// Unbound and misfit modules explained in model terms (which other WAN variant they are
// from) before they are listed. Shapes from the released configs (spec wan.md §1.3): inner
// dim 1536 (1.3B), 3072 (TI2V-5B: 24 heads × 128), 5120 (14B); patch embedding input
// channels 16 (T2V), 36 (I2V), 48 (TI2V-5B); the image cross-attention (`k_img`, `v_img`)
// only in Wan 2.1 I2V/FLF2V.

/// A real-shaped base with no weights on disk (`synth --skeleton`).
fn skeleton_base(dir: &Path, model: &str) -> PathBuf {
    let out = dir.join(model);
    ok(run(
        dir,
        &[
            "synth",
            "--model",
            model,
            "--fill",
            "zero",
            "--skeleton",
            "--out",
            out.to_str().unwrap(),
        ],
    ));
    out
}

/// A ComfyUI LoRA of rank 4 (zeros) on each (module, out, in) given, and on each
/// (module, factor shapes) given as raw lora_down/lora_up shapes.
fn comfy_lora_file(
    path: &Path,
    linears: &[(&str, usize, usize)],
    raw: &[(&str, Vec<usize>, Vec<usize>)],
) {
    let mut t: Vec<(String, Vec<usize>, Vec<f32>)> = Vec::new();
    let zeros = |s: &[usize]| vec![0f32; s.iter().product()];
    for (m, out, inp) in linears {
        t.push((
            format!("diffusion_model.{m}.lora_down.weight"),
            vec![4, *inp],
            zeros(&[4, *inp]),
        ));
        t.push((
            format!("diffusion_model.{m}.lora_up.weight"),
            vec![*out, 4],
            zeros(&[*out, 4]),
        ));
    }
    for (m, down, up) in raw {
        t.push((
            format!("diffusion_model.{m}.lora_down.weight"),
            down.clone(),
            zeros(down),
        ));
        t.push((
            format!("diffusion_model.{m}.lora_up.weight"),
            up.clone(),
            zeros(up),
        ));
    }
    let refs: Vec<(&str, Vec<usize>, Vec<f32>)> = t
        .iter()
        .map(|(n, s, v)| (n.as_str(), s.clone(), v.clone()))
        .collect();
    write_f32(path, &refs);
}

/// Merges `adapter` into `base` and expects a refusal with nothing written; returns
/// stderr.
fn refused_merge(dir: &Path, base: &Path, adapter: &Path) -> String {
    let (code, _, err) = parts(&run(
        dir,
        &[
            "merge",
            "--base",
            base.to_str().unwrap(),
            "--adapter",
            adapter.to_str().unwrap(),
            "--out",
            "out",
            "--device",
            "cpu",
        ],
    ));
    assert_eq!(code, 1, "{err}");
    assert!(!dir.join("out").exists(), "{err}");
    err
}

/// The `error:` line: the first line of the message.
fn first_error_line(err: &str) -> &str {
    err.lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("no error line: {err}"))
}

#[test]
fn an_adapter_of_image_cross_attention_alone_on_a_t2v_base_is_explained_in_model_terms() {
    let t = tmp();
    let a = t.path().join("img_only.safetensors");
    comfy_lora_file(
        &a,
        &[
            ("blocks.0.cross_attn.k_img", 5120, 5120),
            ("blocks.0.cross_attn.v_img", 5120, 5120),
        ],
        &[],
    );
    // Not one module binds: this used to fall back to the one-line guess.
    for base in [
        skeleton_base(t.path(), "wan2.1-t2v-14b"),
        golden("models/t2v"),
    ] {
        let err = refused_merge(t.path(), &base, &a);
        let first = first_error_line(&err);
        assert!(
            first.contains(
                "this adapter targets the image cross-attention of a Wan 2.1 I2V/FLF2V model"
            ),
            "{err}"
        );
        // ... then every module, one line each.
        for m in ["cross_attn.k_img", "cross_attn.v_img"] {
            assert!(
                err.lines().skip(1).any(|l| l
                    .trim_start()
                    .starts_with(&format!("diffusion_model.blocks.0.{m} "))),
                "{m}: {err}"
            );
        }
    }
    let base = t.path().join("wan2.1-t2v-14b");
    let err = refused_merge(t.path(), &base, &a);
    assert!(
        first_error_line(&err).contains("the base is Wan2.1-T2V-14B"),
        "{err}"
    );
}

#[test]
fn a_ti2v_5b_patch_embedding_lora_is_explained_by_its_channels_first() {
    let t = tmp();
    let base = skeleton_base(t.path(), "wan2.1-t2v-1.3b");
    // TI2V-5B's patch embedding: Conv3d(48 → 3072, kernel 1×2×2).
    let patch = (
        "patch_embedding",
        vec![4, 48, 1, 2, 2],
        vec![3072, 4, 1, 1, 1],
    );
    let only = t.path().join("ti2v_patch.safetensors");
    comfy_lora_file(&only, &[], std::slice::from_ref(&patch));
    // The same plus one module shaped for the 1.3B base, which binds: the explanation must
    // be about the patch embedding, not the adapter as a whole.
    let plus = t.path().join("ti2v_patch_plus.safetensors");
    comfy_lora_file(&plus, &[("blocks.0.self_attn.q", 1536, 1536)], &[patch]);
    for a in [&only, &plus] {
        let err = refused_merge(t.path(), &base, a);
        let first = first_error_line(&err);
        assert!(
            first.contains(
                "this adapter targets the patch embedding of a Wan 2.2 TI2V-5B model (48 latent channels)"
            ) && first.contains("takes 16")
                && first.contains("the base is Wan2.1-T2V-1.3B"),
            "{err}"
        );
        // Then the module that does not fit.
        let rest: Vec<&str> = err.lines().skip_while(|l| *l != first).skip(1).collect();
        assert!(
            rest.iter()
                .any(|l| l.contains("diffusion_model.patch_embedding (lora")),
            "{err}"
        );
        assert!(!err.contains("self_attn.q"), "{err}");
        assert!(!err.contains("matches no released model"), "{err}");
    }
}

#[test]
fn wan21_i2v_image_cross_attention_on_a_wan22_base_is_explained_in_model_terms() {
    let t = tmp();
    // Wan 2.2 I2V-A14B takes 36 input channels like Wan 2.1 I2V, but has no image
    // cross-attention.
    let base = skeleton_base(t.path(), "wan2.2-i2v-a14b");
    let a = t.path().join("wan21_i2v.safetensors");
    comfy_lora_file(
        &a,
        &[
            ("blocks.0.cross_attn.q", 5120, 5120),
            ("blocks.0.cross_attn.k_img", 5120, 5120),
            ("blocks.0.cross_attn.v_img", 5120, 5120),
        ],
        &[],
    );
    let err = refused_merge(t.path(), &base, &a);
    let first = first_error_line(&err);
    assert!(
        first.contains(
            "this adapter targets the image cross-attention of a Wan 2.1 I2V/FLF2V model"
        ) && first.contains("the base is Wan2.2-I2V-A14B"),
        "{err}"
    );
    assert!(
        err.contains("diffusion_model.blocks.0.cross_attn.k_img (lora"),
        "{err}"
    );
    // The module that binds is not listed.
    assert!(!err.contains("cross_attn.q "), "{err}");
    // The golden pair pipeline (Wan 2.2 T2V-A14B's two experts, tiny): the same keys on
    // either expert.
    let small = t.path().join("wan21_i2v_small.safetensors");
    comfy_lora_file(
        &small,
        &[
            ("blocks.0.cross_attn.k_img", 32, 32),
            ("blocks.0.cross_attn.q", 32, 32),
        ],
        &[],
    );
    for expert in ["transformer", "transformer_2"] {
        let (code, _, err) = parts(&run(
            t.path(),
            &[
                "merge",
                "--base",
                golden("models/a14b").to_str().unwrap(),
                "--adapter",
                &format!("{expert}={}", small.display()),
                "--out",
                "out",
            ],
        ));
        assert_eq!(code, 1, "{err}");
        assert!(
            first_error_line(&err)
                .contains("targets the image cross-attention of a Wan 2.1 I2V/FLF2V model"),
            "{err}"
        );
    }
}

/// The two Wan 2.2 A14B experts have the same shapes, so an adapter binds to either; a file
/// name that says which expert it is for is the one thing that can be checked.
#[test]
fn an_adapter_named_for_the_other_a14b_expert_is_warned_about() {
    let t = tmp();
    let low = t.path().join("pair_low_noise.safetensors");
    std::fs::copy(golden("adapters/a14b_pair/high.safetensors"), &low).unwrap();
    let merge = |expert: &str, out: &str| {
        parts(&run(
            t.path(),
            &[
                "merge",
                "--base",
                golden("models/a14b").to_str().unwrap(),
                "--adapter",
                &format!("{expert}={}", low.display()),
                "--out",
                out,
            ],
        ))
    };
    let (code, _, err) = merge("transformer", "a");
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("pair_low_noise.safetensors: its name says low noise, but it is merged into transformer, the high-noise expert"),
        "{err}"
    );
    let (code, _, err) = merge("transformer_2", "b");
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("warning"), "{err}");
}
