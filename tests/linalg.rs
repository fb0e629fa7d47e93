//! Tests of `wanbake::linalg`: SVD bases against matrices whose SVD is known by construction
//! and against the spec's reference vectors, determinism across thread counts, the basis
//! cache, and the low-rank/norm kernels against naive f64 loops.
//!
//! The `#[ignore]`d tests at the end are the real-shaped checks and the measurements quoted
//! in BENCHMARKS.md ("SVD (linalg)"); run them by hand with the commands given there.

#![allow(non_snake_case)]

mod common;

use std::time::Instant;

use common::Rng;

use faer::dyn_stack::{MemBuffer, MemStack};
use faer::linalg::matmul::matmul;
use faer::{Accum, Mat, MatRef, Par};
use wanbake::io::DType;
use wanbake::io::TensorView;
use wanbake::linalg::{
    CacheOutcome, CacheProblem, LinalgError, SvdCache, SvdEngine, add_scaled_product,
    add_xs_update, basis_key, canonicalize_signs, col_norms, row_norms, xs_bases,
};

const EPS32: f64 = f32::EPSILON as f64;

// ---------------------------------------------------------------------------------------------
// Fixtures: seeded random numbers and matrices with a known SVD.
// ---------------------------------------------------------------------------------------------

/// The tests' seeded generator, with one helper for test matrices.
trait NormalF32s {
    fn normal_f32s(&mut self, n: usize, scale: f64) -> Vec<f32>;
}

impl NormalF32s for Rng {
    fn normal_f32s(&mut self, n: usize, scale: f64) -> Vec<f32> {
        (0..n).map(|_| (self.normal() * scale) as f32).collect()
    }
}

/// An n×k matrix with orthonormal columns: the thin Q of a QR of a seeded Gaussian matrix
/// (faer's low-level QR with explicit `Par`: the tests run with faer's global parallelism
/// disabled).
fn orthonormal(n: usize, k: usize, rng: &mut Rng) -> Mat<f64> {
    use faer::linalg::householder as hh;
    use faer::linalg::qr::no_pivoting::factor as qr;
    let mut G = Mat::<f64>::from_fn(n, k, |_, _| rng.normal());
    let bs = qr::recommended_block_size::<f64>(n, k);
    let mut H = Mat::<f64>::zeros(bs, k);
    let par = Par::rayon(0);
    let scratch = qr::qr_in_place_scratch::<f64>(n, k, bs, par, Default::default());
    let mut mem = MemBuffer::new(scratch);
    qr::qr_in_place(
        G.as_mut(),
        H.as_mut(),
        par,
        MemStack::new(&mut mem),
        Default::default(),
    );
    let mut Q = Mat::<f64>::identity(n, k);
    let scratch =
        hh::apply_block_householder_sequence_on_the_left_in_place_scratch::<f64>(n, bs, k);
    let mut mem = MemBuffer::new(scratch);
    hh::apply_block_householder_sequence_on_the_left_in_place_with_conj(
        G.as_ref(),
        H.as_ref(),
        faer::Conj::No,
        Q.as_mut(),
        par,
        MemStack::new(&mut mem),
    );
    Q
}

/// A·B in f64 with explicit `Par`.
fn mul(A: MatRef<'_, f64>, B: MatRef<'_, f64>) -> Mat<f64> {
    let mut C = Mat::<f64>::zeros(A.nrows(), B.ncols());
    matmul(C.as_mut(), Accum::Replace, A, B, 1.0, Par::rayon(0));
    C
}

/// Every test starts here: faer's global parallelism is disabled, so any faer call inside
/// `wanbake::linalg` (or these tests) that reads it instead of an explicit `Par` panics.
fn no_global_parallelism() {
    faer::disable_global_parallelism();
}

/// W = U0·diag(s)·V0ᵀ computed in f64 and rounded to f32, with its exact factors.
struct Known {
    out: usize,
    inp: usize,
    W: Vec<f32>,
    U0: Mat<f64>,
    s: Vec<f64>,
    V0: Mat<f64>,
    /// ‖W_f32 − U0·diag(s)·V0ᵀ‖_F: the perturbation the f32 rounding of W adds.
    rounding: f64,
}

fn known(out: usize, inp: usize, s: Vec<f64>, seed: u64) -> Known {
    let k = out.min(inp);
    assert_eq!(s.len(), k);
    let mut rng = Rng::new(seed);
    let U0 = orthonormal(out, k, &mut rng);
    let V0 = orthonormal(inp, k, &mut rng);
    let US = Mat::<f64>::from_fn(out, k, |i, j| U0[(i, j)] * s[j]);
    let mut W64 = Mat::<f64>::zeros(out, inp);
    matmul(
        W64.as_mut(),
        Accum::Replace,
        US.as_ref(),
        V0.transpose(),
        1.0,
        Par::Seq,
    );
    let mut W = Vec::with_capacity(out * inp);
    let mut rounding = 0.0f64;
    for i in 0..out {
        for j in 0..inp {
            let x = W64[(i, j)] as f32;
            rounding += (f64::from(x) - W64[(i, j)]).powi(2);
            W.push(x);
        }
    }
    Known {
        out,
        inp,
        W,
        U0,
        s,
        V0,
        rounding: rounding.sqrt(),
    }
}

/// The power-law spectrum s_i = i^-0.5, i = 1..k (distinct values).
fn power_law(k: usize) -> Vec<f64> {
    (1..=k).map(|i| (i as f64).powf(-0.5)).collect()
}

/// SA3's convention written independently of the library: for each column j of U, the first
/// row of largest |U[i,j]|; if that entry is negative, negate column j of U and of V.
fn sa3_signs(U: &mut Mat<f64>, V: &mut Mat<f64>) {
    for j in 0..U.ncols() {
        let mut idx = 0;
        for i in 1..U.nrows() {
            if U[(i, j)].abs() > U[(idx, j)].abs() {
                idx = i;
            }
        }
        if U[(idx, j)] < 0.0 {
            for i in 0..U.nrows() {
                U[(i, j)] = -U[(i, j)];
            }
            for i in 0..V.nrows() {
                V[(i, j)] = -V[(i, j)];
            }
        }
    }
}

/// Allowed |error| of singular vector i (Wedin: ‖Δu_i‖ ≤ √2·‖E‖₂/gap_i; we allow 4·‖E‖_F/gap)
/// plus the final f32 rounding of the output and f64 round-off of the solver.
fn vector_tolerance(s: &[f64], i: usize, rectangular: bool, rounding: f64, n: usize) -> f64 {
    let mut gap = f64::INFINITY;
    for (j, sj) in s.iter().enumerate() {
        if j != i {
            gap = gap.min((s[i] - sj).abs());
        }
    }
    if rectangular {
        gap = gap.min(s[i]); // the complement's zero singular values
    }
    4.0 * rounding / gap + EPS32 + 64.0 * f64::EPSILON * (n as f64).sqrt() / gap.min(1.0)
}

/// Checks `xs_bases` of a constructed matrix against its known canonical factors.
fn check_against_known(K: &Known, r: usize) {
    let (out, inp) = (K.out, K.inp);
    let b = xs_bases(&K.W, out, inp, r, Par::Seq).unwrap();
    assert_eq!((b.out, b.inp, b.rank), (out, inp, r));
    assert_eq!((b.U.len(), b.V.len()), (out * r, inp * r));
    let (mut U0, mut V0) = (K.U0.clone(), K.V0.clone());
    sa3_signs(&mut U0, &mut V0);
    let n = out.max(inp);
    for j in 0..r {
        let tol = vector_tolerance(&K.s, j, out != inp, K.rounding, n);
        let du = (0..out).map(|i| (f64::from(b.U[i * r + j]) - U0[(i, j)]).abs());
        let dv = (0..inp).map(|i| (f64::from(b.V[i * r + j]) - V0[(i, j)]).abs());
        let err = du.chain(dv).fold(0.0, f64::max);
        assert!(
            err <= tol,
            "({out}x{inp}) r={r} vector {j}: max error {err:e} > {tol:e}"
        );
    }
    for (j, (got, want)) in b.singular_values.iter().zip(&K.s).enumerate() {
        let tol = K.rounding + 64.0 * f64::EPSILON * (n as f64).sqrt();
        assert!((got - want).abs() <= tol, "σ_{j}: {got} vs {want}");
    }
    check_orthonormal(&b.U, out, r);
    check_orthonormal(&b.V, inp, r);
    check_canonical(&b.U, out, r);
}

/// max |XᵀX − I| for X (n, r) row-major f32 within c·ε₃₂·√n.
fn check_orthonormal(X: &[f32], n: usize, r: usize) {
    let tol = 4.0 * EPS32 * (n as f64).sqrt();
    for a in 0..r {
        for b in 0..r {
            let dot: f64 = (0..n)
                .map(|i| f64::from(X[i * r + a]) * f64::from(X[i * r + b]))
                .sum();
            let want = if a == b { 1.0 } else { 0.0 };
            assert!(
                (dot - want).abs() <= tol,
                "(XᵀX)[{a},{b}] = {dot}, tolerance {tol:e}"
            );
        }
    }
}

/// Every column's first largest-magnitude entry is ≥ 0.
fn check_canonical(U: &[f32], n: usize, r: usize) {
    for j in 0..r {
        let mut idx = 0;
        for i in 1..n {
            if U[i * r + j].abs() > U[idx * r + j].abs() {
                idx = i;
            }
        }
        assert!(
            U[idx * r + j] >= 0.0,
            "column {j}: pivot U[{idx}] = {}",
            U[idx * r + j]
        );
    }
}

// ---------------------------------------------------------------------------------------------
// SVD bases: oracle by construction.
// ---------------------------------------------------------------------------------------------

#[test]
fn bases_match_known_factors_across_shapes() {
    no_global_parallelism();
    let shapes = [
        (1, 1),
        (1, 5),
        (5, 1),
        (6, 6),
        (9, 4),
        (4, 9),
        (40, 25),
        (25, 40),
        (70, 30),
    ];
    for (seed, &(out, inp)) in shapes.iter().enumerate() {
        let k = out.min(inp);
        let K = known(out, inp, power_law(k), 1000 + seed as u64);
        for r in [1, k.div_ceil(2), k] {
            check_against_known(&K, r);
        }
    }
}

#[test]
fn rank_above_min_dim_is_an_error_naming_both_numbers() {
    no_global_parallelism();
    let W = vec![1.0f32; 6 * 8];
    let err = xs_bases(&W, 6, 8, 7, Par::Seq).unwrap_err();
    assert_eq!(
        err,
        LinalgError::RankTooLarge {
            rank: 7,
            out: 6,
            inp: 8
        }
    );
    let msg = err.to_string();
    assert!(msg.contains("rank 7") && msg.contains("= 6"), "{msg}");
    assert!(matches!(
        xs_bases(&W, 6, 8, 0, Par::Seq),
        Err(LinalgError::RankZero { .. })
    ));
    assert!(matches!(
        xs_bases(&[], 0, 3, 1, Par::Seq),
        Err(LinalgError::RankTooLarge { .. })
    ));
}

#[test]
fn non_finite_weight_is_an_error_naming_the_entry() {
    no_global_parallelism();
    let mut W = vec![0.5f32; 3 * 4];
    W[2 * 4 + 1] = f32::NAN;
    match xs_bases(&W, 3, 4, 2, Par::Seq) {
        Err(LinalgError::NonFinite { row: 2, col: 1, .. }) => {}
        other => panic!("expected NonFinite at (2, 1), got {other:?}"),
    }
}

/// Spec sa3_lora §7.3: W = [[1,−2,0.5],[−0.5,1.5,2]].
#[test]
fn spec_reference_vectors() {
    no_global_parallelism();
    let W = [1.0f32, -2.0, 0.5, -0.5, 1.5, 2.0];
    let b = xs_bases(&W, 2, 3, 2, Par::Seq).unwrap();
    let U1 = [b.U[0], b.U[2]];
    let V1 = [b.V[0], b.V[2], b.V[4]];
    let close = |got: &[f32], want: &[f64]| {
        got.iter()
            .zip(want)
            .all(|(g, w)| (f64::from(*g) - w).abs() <= 1e-7)
    };
    assert!(close(&U1, &[-0.61541221, 0.78820544]), "U1 = {U1:?}");
    assert!(
        close(&V1, &[-0.34724381, 0.83004751, 0.43639759]),
        "V1 = {V1:?}"
    );
    let S = &b.singular_values;
    assert!(
        (S[0] - 2.90722222).abs() <= 1e-7 && (S[1] - 1.81605589).abs() <= 1e-7,
        "{S:?}"
    );
}

/// Spec §7.2 inputs (r = 1, α = 1, M = 0.5) and §7.3's lora and lora-xs results.
#[test]
fn spec_lora_and_lora_xs_merges() {
    no_global_parallelism();
    let W0 = [1.0f32, -2.0, 0.5, -0.5, 1.5, 2.0];
    let mut W = W0;
    add_scaled_product(
        &mut W,
        2,
        3,
        1.0,
        &[0.5, -0.25],
        &[0.25, -0.5, 1.0],
        1,
        Par::Seq,
    );
    let want = [1.125, -2.25, 1.0, -0.5625, 1.625, 1.75];
    assert_eq!(W, want, "lora: these values are exact in f32");

    let b = xs_bases(&W0, 2, 3, 1, Par::Seq).unwrap();
    let mut W = W0;
    add_xs_update(&mut W, 2, 3, 1.0, &b.U, &[0.5], &b.V, 1, Par::Seq);
    let want = [
        1.10684904,
        -2.25541069,
        0.36571780,
        -0.63684973,
        1.82712398,
        2.17198548,
    ];
    for (g, w) in W.iter().zip(want) {
        assert!(
            (f64::from(*g) - w).abs() <= 4.0 * EPS32 * 2.0,
            "lora-xs: {W:?} vs {want:?}"
        );
    }
}

/// Degenerate matrices: what is unique is checked; what is not is documented.
#[test]
fn degenerate_matrices() {
    no_global_parallelism();
    // Zeros: S = 0; U, V are any orthonormal bases (not unique), but must be orthonormal,
    // canonical and finite.
    let b = xs_bases(&[0.0; 12], 3, 4, 3, Par::Seq).unwrap();
    assert!(b.singular_values.iter().all(|&s| s == 0.0));
    check_orthonormal(&b.U, 3, 3);
    check_orthonormal(&b.V, 4, 3);
    check_canonical(&b.U, 3, 3);

    // All ones (m×n): rank 1, σ₁ = √(mn), u₁ = 1/√m, v₁ = 1/√n (unique, positive after the
    // convention); the rest span the complement and are not unique.
    let (m, n) = (5, 7);
    let b = xs_bases(&vec![1.0; m * n], m, n, 5, Par::Seq).unwrap();
    let tol = 8.0 * EPS32;
    assert!((b.singular_values[0] - ((m * n) as f64).sqrt()).abs() <= 1e-12 * 8.0);
    assert!(b.singular_values[1..].iter().all(|&s| s.abs() <= 1e-13));
    assert!((0..m).all(|i| (f64::from(b.U[i * 5]) - 1.0 / (m as f64).sqrt()).abs() <= tol));
    assert!((0..n).all(|i| (f64::from(b.V[i * 5]) - 1.0 / (n as f64).sqrt()).abs() <= tol));
    check_orthonormal(&b.U, m, 5);
    check_orthonormal(&b.V, n, 5);

    // Identity: all σ = 1, so U is any orthogonal Q and V = Q; only U·Vᵀ = I is unique.
    let n = 6;
    let I: Vec<f32> = (0..n * n)
        .map(|x| if x % (n + 1) == 0 { 1.0 } else { 0.0 })
        .collect();
    let b = xs_bases(&I, n, n, n, Par::Seq).unwrap();
    assert!(b.singular_values.iter().all(|&s| (s - 1.0).abs() <= 1e-14));
    let UVt = product_UVt(&b.U, &b.V, n, n, n, n);
    for (x, e) in UVt.iter().zip(&I) {
        assert!((x - f64::from(*e)).abs() <= 4.0 * EPS32);
    }
    check_canonical(&b.U, n, n);
}

/// A repeated singular value σ₂ = σ₃: u₂, u₃ are unique only up to a rotation inside their
/// plane, so only the plane and U₂₃·V₂₃ᵀ are checked; u₁ and u₄ stay unique. Truncating
/// between σ₂ and σ₃ (r = 2) picks an arbitrary vector of the plane: `truncation_gap` is 0.
#[test]
fn repeated_singular_value() {
    no_global_parallelism();
    let (out, inp) = (8, 6);
    let K = known(out, inp, vec![1.0, 0.5, 0.5, 0.25, 0.125, 0.0625], 77);
    let k = 6;
    let b = xs_bases(&K.W, out, inp, k, Par::Seq).unwrap();
    let (mut U0, mut V0) = (K.U0.clone(), K.V0.clone());
    sa3_signs(&mut U0, &mut V0);
    for j in [0, 3] {
        let tol = vector_tolerance(&K.s, j, true, K.rounding, out);
        for i in 0..out {
            assert!((f64::from(b.U[i * k + j]) - U0[(i, j)]).abs() <= tol);
        }
    }
    // U₂₃·V₂₃ᵀ is rotation invariant: (UQ)(VQ)ᵀ = UVᵀ.
    let pick = |X: &[f32], n: usize| -> Vec<f32> {
        (0..n).flat_map(|i| [X[i * k + 1], X[i * k + 2]]).collect()
    };
    let got = product_UVt(&pick(&b.U, out), &pick(&b.V, inp), out, inp, 2, 2);
    for i in 0..out {
        for j in 0..inp {
            let want = U0[(i, 1)] * V0[(j, 1)] + U0[(i, 2)] * V0[(j, 2)];
            assert!(
                (got[i * inp + j] - want).abs() <= 1e-5,
                "plane product ({i},{j})"
            );
        }
    }
    let b2 = xs_bases(&K.W, out, inp, 2, Par::Seq).unwrap();
    assert!(b2.truncation_gap().unwrap() < 1e-6);
    assert!(b.truncation_gap().is_none());
    assert!(
        xs_bases(&K.W, out, inp, 1, Par::Seq)
            .unwrap()
            .truncation_gap()
            .unwrap()
            > 0.4
    );
}

/// (U·Vᵀ) for U (m, r) and V (n, r) given with row strides `su`, `sv`, in f64.
fn product_UVt(U: &[f32], V: &[f32], m: usize, n: usize, r: usize, s: usize) -> Vec<f64> {
    let mut P = vec![0.0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            P[i * n + j] = (0..r)
                .map(|l| f64::from(U[i * s + l]) * f64::from(V[j * s + l]))
                .sum();
        }
    }
    P
}

#[test]
fn canonicalize_signs_public_entry_matches_independent_version() {
    no_global_parallelism();
    let mut rng = Rng::new(5);
    let (out, k, inp) = (7, 4, 5);
    let mut U0 = Mat::<f64>::from_fn(out, k, |_, _| rng.normal());
    let mut V0 = Mat::<f64>::from_fn(inp, k, |_, _| rng.normal());
    let mut U: Vec<f64> = (0..out)
        .flat_map(|i| (0..k).map(move |j| (i, j)))
        .map(|(i, j)| U0[(i, j)])
        .collect();
    let mut Vt: Vec<f64> = (0..k)
        .flat_map(|j| (0..inp).map(move |i| (i, j)))
        .map(|(i, j)| V0[(i, j)])
        .collect();
    canonicalize_signs(&mut U, out, k, &mut Vt, inp);
    sa3_signs(&mut U0, &mut V0);
    for i in 0..out {
        for j in 0..k {
            assert_eq!(U[i * k + j].to_bits(), U0[(i, j)].to_bits());
        }
    }
    for j in 0..k {
        for i in 0..inp {
            assert_eq!(Vt[j * inp + i].to_bits(), V0[(i, j)].to_bits());
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Determinism.
// ---------------------------------------------------------------------------------------------

/// Bit pattern of everything `xs_bases` returns.
fn bits(b: &wanbake::linalg::XsBases) -> (Vec<u32>, Vec<u32>, Vec<u64>) {
    (
        b.U.iter().map(|x| x.to_bits()).collect(),
        b.V.iter().map(|x| x.to_bits()).collect(),
        b.singular_values.iter().map(|x| x.to_bits()).collect(),
    )
}

/// Same bits for `Par::Seq`, 1, 2 and 7 rayon threads, and for `Par::rayon(0)` inside pools
/// of 1 and 4 threads, on shapes that cross faer's parallel thresholds (square path, tall
/// QR-first path, wide/transposed path), and run to run. (faer alone gives different bits
/// for each of these `Par` values on these shapes; see `linalg::svd`'s module doc.)
#[test]
fn svd_bits_do_not_depend_on_threads() {
    no_global_parallelism();
    for (seed, &(out, inp)) in [(320, 300), (700, 260), (260, 700)].iter().enumerate() {
        let W = Rng::new(40 + seed as u64).normal_f32s(out * inp, 0.02);
        let r = 64;
        let reference = bits(&xs_bases(&W, out, inp, r, Par::Seq).unwrap());
        for par in [Par::Seq, Par::rayon(1), Par::rayon(2), Par::rayon(7)] {
            let got = bits(&xs_bases(&W, out, inp, r, par).unwrap());
            assert!(
                got == reference,
                "({out}x{inp}) {par:?} differs from Par::Seq"
            );
        }
        for threads in [1, 4] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let got = pool.install(|| bits(&xs_bases(&W, out, inp, r, Par::rayon(0)).unwrap()));
            assert!(got == reference, "({out}x{inp}) pool of {threads} differs");
        }
    }
}

#[test]
fn kernels_bits_do_not_depend_on_threads() {
    no_global_parallelism();
    let mut rng = Rng::new(9);
    for &(out, inp, r) in &[
        (512, 384, 64),
        (300, 520, 600),
        (37, 1200, 16),
        (1, 5000, 64),
        (4000, 1, 300),
        (1, 300, 300),
        (3000, 40, 1),
    ] {
        let W0 = rng.normal_f32s(out * inp, 0.02);
        let B = rng.normal_f32s(out * r, 0.1);
        let A = rng.normal_f32s(r * inp, 0.1);
        let M = rng.normal_f32s(r * r, 0.1);
        let run = |par: Par| {
            let mut W = W0.clone();
            add_scaled_product(&mut W, out, inp, 0.75, &B, &A, r, par);
            let mut X = W0.clone();
            let V: Vec<f32> = A.clone(); // any (inp, r) matrix
            add_xs_update(&mut X, out, inp, 0.5, &B, &M, &V, r, par);
            let rn = row_norms(&W, out, inp, par);
            let cn = col_norms(&W, out, inp, par);
            let b = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            (b(&W), b(&X), b(&rn), b(&cn))
        };
        let reference = run(Par::Seq);
        for par in [Par::rayon(1), Par::rayon(2), Par::rayon(3), Par::rayon(8)] {
            assert!(
                run(par) == reference,
                "({out},{inp},{r}) {par:?} differs from Par::Seq"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Low-rank kernels and norms against naive f64 loops.
// ---------------------------------------------------------------------------------------------

#[test]
fn scaled_product_matches_f64_loop() {
    no_global_parallelism();
    let mut rng = Rng::new(11);
    for &(out, inp, r) in &[
        (1, 1, 1),
        (7, 5, 3),
        (64, 48, 16),
        (300, 200, 32),
        (33, 900, 8),
        (40, 30, 700),
    ] {
        let W0 = rng.normal_f32s(out * inp, 1.0);
        let B = rng.normal_f32s(out * r, 1.0);
        let A = rng.normal_f32s(r * inp, 1.0);
        let s = -1.25f32;
        let mut W = W0.clone();
        add_scaled_product(&mut W, out, inp, s, &B, &A, r, Par::rayon(2));
        for i in 0..out {
            for j in 0..inp {
                let (mut exact, mut mag) = (0.0f64, 0.0f64);
                for l in 0..r {
                    let p = f64::from(B[i * r + l]) * f64::from(A[l * inp + j]);
                    exact += p;
                    mag += p.abs();
                }
                let w0 = f64::from(W0[i * inp + j]);
                let want = w0 + f64::from(s) * exact;
                let tol = (r as f64 + 2.0) * EPS32 * (w0.abs() + f64::from(s).abs() * mag);
                let got = f64::from(W[i * inp + j]);
                assert!(
                    (got - want).abs() <= tol,
                    "({out},{inp},{r}) [{i},{j}] {got} vs {want}"
                );
            }
        }
    }
    // r = 0: nothing to add, W unchanged.
    let mut W = vec![1.5f32; 6];
    add_scaled_product(&mut W, 2, 3, 1.0, &[], &[], 0, Par::Seq);
    assert_eq!(W, [1.5; 6]);
}

#[test]
fn xs_update_matches_f64_loop() {
    no_global_parallelism();
    let mut rng = Rng::new(12);
    for &(out, inp, r) in &[(1, 1, 1), (9, 6, 4), (120, 80, 32), (50, 400, 50)] {
        let W0 = rng.normal_f32s(out * inp, 1.0);
        let U = rng.normal_f32s(out * r, 1.0);
        let M = rng.normal_f32s(r * r, 1.0);
        let V = rng.normal_f32s(inp * r, 1.0);
        let s = 0.5f32;
        let mut W = W0.clone();
        add_xs_update(&mut W, out, inp, s, &U, &M, &V, r, Par::rayon(2));
        for i in 0..out {
            for j in 0..inp {
                let (mut exact, mut mag) = (0.0f64, 0.0f64);
                for a in 0..r {
                    for c in 0..r {
                        let p = f64::from(U[i * r + a])
                            * f64::from(M[a * r + c])
                            * f64::from(V[j * r + c]);
                        exact += p;
                        mag += p.abs();
                    }
                }
                let w0 = f64::from(W0[i * inp + j]);
                let want = w0 + f64::from(s) * exact;
                let tol = (2.0 * r as f64 + 3.0) * EPS32 * (w0.abs() + f64::from(s) * mag);
                let got = f64::from(W[i * inp + j]);
                assert!(
                    (got - want).abs() <= tol,
                    "({out},{inp},{r}) [{i},{j}] {got} vs {want}"
                );
            }
        }
    }
}

/// The norms' arithmetic is specified (f64 squares summed in index order, sqrt in f64, one
/// rounding), so an independent loop must give the same bits.
#[test]
fn norms_match_specified_arithmetic_and_spec_values() {
    no_global_parallelism();
    let W = [1.0f32, -2.0, 0.5, -0.5, 1.5, 2.0];
    let close = |got: &[f32], want: &[f64]| {
        got.iter()
            .zip(want)
            .all(|(g, w)| (f64::from(*g) - w).abs() <= 1e-7)
    };
    assert!(close(
        &row_norms(&W, 2, 3, Par::Seq),
        &[2.29128785, 2.54950976]
    ));
    assert!(close(
        &col_norms(&W, 2, 3, Par::Seq),
        &[1.11803399, 2.5, 2.06155281]
    ));

    let mut rng = Rng::new(13);
    for &(out, inp) in &[(1, 1), (3, 1), (1, 3), (257, 129), (64, 3000)] {
        let W = rng.normal_f32s(out * inp, 3.0);
        let rows: Vec<f32> = (0..out)
            .map(|i| {
                let mut acc = 0.0f64;
                for j in 0..inp {
                    acc += f64::from(W[i * inp + j]) * f64::from(W[i * inp + j]);
                }
                acc.sqrt() as f32
            })
            .collect();
        let cols: Vec<f32> = (0..inp)
            .map(|j| {
                let mut acc = 0.0f64;
                for i in 0..out {
                    acc += f64::from(W[i * inp + j]) * f64::from(W[i * inp + j]);
                }
                acc.sqrt() as f32
            })
            .collect();
        assert_eq!(row_norms(&W, out, inp, Par::rayon(2)), rows);
        assert_eq!(col_norms(&W, out, inp, Par::rayon(2)), cols);
    }
    assert_eq!(row_norms(&[], 3, 0, Par::Seq), [0.0; 3]);
    assert_eq!(col_norms(&[], 0, 2, Par::Seq), [0.0; 2]);
}

// ---------------------------------------------------------------------------------------------
// The basis cache.
// ---------------------------------------------------------------------------------------------

/// A bf16 base tensor (as real checkpoints hold them).
struct Base {
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

impl Base {
    fn new(out: usize, inp: usize, seed: u64) -> Base {
        let W = Rng::new(seed).normal_f32s(out * inp, 0.02);
        let bytes = wanbake::codec::dtype::from_f32_vec(DType::BF16, &W).unwrap();
        Base {
            shape: vec![out, inp],
            bytes,
        }
    }
    fn view(&self) -> TensorView<'_> {
        TensorView {
            name: "blocks.0.attn1.to_q.weight",
            dtype: DType::BF16,
            shape: &self.shape,
            bytes: &self.bytes,
        }
    }
}

#[test]
fn cache_miss_then_hit_returns_the_computed_bits() {
    no_global_parallelism();
    let dir = tempfile::tempdir().unwrap();
    let cache = SvdCache::open(dir.path()).unwrap();
    let base = Base::new(384, 256, 21);
    let W = base.view().to_f32().unwrap();
    let direct = xs_bases(&W, 384, 256, 32, Par::Seq).unwrap();

    let t = Instant::now();
    let miss = cache.get_or_compute(&base.view(), 32, Par::Seq).unwrap();
    let miss_time = t.elapsed();
    assert_eq!(miss.outcome, CacheOutcome::Miss);
    assert_eq!(bits(&miss.bases), bits(&direct));
    assert!(cache.entry_path(&miss.key).exists());

    let t = Instant::now();
    let hit = cache.get_or_compute(&base.view(), 32, Par::Seq).unwrap();
    let hit_time = t.elapsed();
    assert_eq!(hit.outcome, CacheOutcome::Hit);
    assert_eq!(bits(&hit.bases), bits(&direct));
    eprintln!("svd cache 384x256 bf16 r=32: miss {miss_time:?}, hit {hit_time:?}");
    assert!(
        hit_time < miss_time,
        "hit {hit_time:?} not faster than miss {miss_time:?}"
    );
    // No temporary files are left behind.
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 1, "{names:?}");
}

/// Runs `damage` on a fresh entry, then expects the next lookup to report `is_expected`,
/// recompute the same bits, and leave a valid entry behind.
fn check_damage_is_repaired(
    damage: impl Fn(&std::path::Path),
    is_expected: impl Fn(&CacheProblem) -> bool,
) {
    let dir = tempfile::tempdir().unwrap();
    let cache = SvdCache::open(dir.path()).unwrap();
    let base = Base::new(40, 24, 22);
    let first = cache.get_or_compute(&base.view(), 8, Par::Seq).unwrap();
    let path = cache.entry_path(&first.key);
    damage(&path);
    let again = cache.get_or_compute(&base.view(), 8, Par::Seq).unwrap();
    match &again.outcome {
        CacheOutcome::Replaced { problem } => {
            assert!(is_expected(problem), "unexpected problem: {problem}")
        }
        other => panic!("damage not detected: {other:?}"),
    }
    assert_eq!(bits(&again.bases), bits(&first.bases));
    let third = cache.get_or_compute(&base.view(), 8, Par::Seq).unwrap();
    assert_eq!(
        third.outcome,
        CacheOutcome::Hit,
        "the entry was not rewritten"
    );
}

#[test]
fn cache_detects_a_flipped_data_byte() {
    no_global_parallelism();
    check_damage_is_repaired(
        |p| {
            let mut b = std::fs::read(p).unwrap();
            let n = b.len();
            b[n - 3] ^= 0x10;
            std::fs::write(p, b).unwrap();
        },
        |e| matches!(e, CacheProblem::Checksum { .. }),
    );
}

#[test]
fn cache_detects_a_flipped_header_byte() {
    no_global_parallelism();
    check_damage_is_repaired(
        |p| {
            let mut b = std::fs::read(p).unwrap();
            let at = b.windows(4).position(|w| w == b"rank").unwrap();
            b[at] = b'R';
            std::fs::write(p, b).unwrap();
        },
        |e| matches!(e, CacheProblem::Metadata { field, .. } if field == "rank"),
    );
}

#[test]
fn cache_detects_a_truncated_entry() {
    no_global_parallelism();
    check_damage_is_repaired(
        |p| {
            let b = std::fs::read(p).unwrap();
            std::fs::write(p, &b[..b.len() - 10]).unwrap();
        },
        |e| matches!(e, CacheProblem::Unreadable { .. }),
    );
    check_damage_is_repaired(
        |p| std::fs::write(p, b"").unwrap(),
        |e| matches!(e, CacheProblem::Unreadable { .. }),
    );
}

/// An entry whose metadata is right but whose U has the wrong shape (self-consistent
/// checksum), as a buggy or foreign writer could produce.
#[test]
fn cache_detects_a_wrong_shape_entry() {
    no_global_parallelism();
    use std::collections::BTreeMap;
    use wanbake::format::header_layout::{HeaderLayout, PlannedTensor};
    check_damage_is_repaired(
        |p| {
            let file = wanbake::io::SafetensorsFile::open(p).unwrap();
            let mut meta: BTreeMap<String, String> = file.metadata().clone();
            let planned = vec![
                PlannedTensor {
                    name: "S".into(),
                    dtype: DType::F64,
                    shape: vec![24],
                },
                PlannedTensor {
                    name: "U".into(),
                    dtype: DType::F32,
                    shape: vec![40, 7],
                },
                PlannedTensor {
                    name: "V".into(),
                    dtype: DType::F32,
                    shape: vec![24, 8],
                },
            ];
            let layout = HeaderLayout::build(&planned, &meta).unwrap();
            let data = vec![0u8; layout.data_len];
            meta.insert("data_sha256".into(), sha256_hex(&data));
            let layout = HeaderLayout::build(&planned, &meta).unwrap();
            drop(file);
            std::fs::write(p, [layout.prefix, data].concat()).unwrap();
        },
        |e| matches!(e, CacheProblem::Tensor { tensor, .. } if tensor == "U"),
    );
}

fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn cache_keys_cover_content_rank_dtype_and_shape() {
    no_global_parallelism();
    let base = Base::new(16, 12, 23);
    let v = base.view();
    let faer = SvdEngine::Faer;
    let key =
        |dtype, shape: &[usize], bytes: &[u8], rank| basis_key(&faer, dtype, shape, bytes, rank);
    let k = key(v.dtype, v.shape, v.bytes, 4);
    assert_eq!(k, key(v.dtype, v.shape, v.bytes, 4), "pure function");
    assert_ne!(k, key(v.dtype, v.shape, v.bytes, 5), "rank");
    let mut other = base.bytes.clone();
    other[7] ^= 1;
    assert_ne!(k, key(v.dtype, v.shape, &other, 4), "bytes");
    assert_ne!(k, key(DType::F16, v.shape, v.bytes, 4), "dtype");
    assert_ne!(k, key(v.dtype, &[12, 16], v.bytes, 4), "shape");
    assert_ne!(k, key(v.dtype, &[16, 3, 4], v.bytes, 4), "conv shape");
    let gpu = |version, sms| SvdEngine::Cusolver {
        version,
        arch: (9, 0),
        sms,
    };
    let on = |e: &SvdEngine| basis_key(e, v.dtype, v.shape, v.bytes, 4);
    assert_ne!(k, on(&gpu(12_004, 132)), "engine");
    assert_ne!(
        on(&gpu(12_004, 132)),
        on(&gpu(12_005, 132)),
        "cuSOLVER version"
    );
    assert_ne!(on(&gpu(12_004, 132)), on(&gpu(12_004, 114)), "SM count");
    assert_eq!(k.hex().len(), 64);
    // A different tensor name with the same content shares the entry.
    let dir = tempfile::tempdir().unwrap();
    let cache = SvdCache::open(dir.path()).unwrap();
    cache.get_or_compute(&v, 4, Par::Seq).unwrap();
    let renamed = TensorView {
        name: "another.weight",
        ..v
    };
    assert_eq!(
        cache.get_or_compute(&renamed, 4, Par::Seq).unwrap().outcome,
        CacheOutcome::Hit
    );
}

#[test]
fn cache_errors_name_the_problem() {
    no_global_parallelism();
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope");
    let e = SvdCache::open(&missing).unwrap_err().to_string();
    assert!(e.contains("nope"), "{e}");

    let cache = SvdCache::open(dir.path()).unwrap();
    // Conv1d (out, in, k) = (4, 2, 3) is viewed as (4, 6): rank 5 > 4.
    let W = vec![0u8; 4 * 2 * 3 * 2];
    let conv = TensorView {
        name: "conv.weight",
        dtype: DType::BF16,
        shape: &[4, 2, 3],
        bytes: &W,
    };
    let e = wanbake::error_text::chain(&cache.get_or_compute(&conv, 5, Par::Seq).unwrap_err());
    assert!(
        e.contains("conv.weight") && e.contains("rank 5") && e.contains("= 4"),
        "{e}"
    );
    assert!(cache.get_or_compute(&conv, 4, Par::Seq).is_ok());
    let bias = TensorView {
        name: "x.bias",
        dtype: DType::BF16,
        shape: &[4],
        bytes: &W[..8],
    };
    let e = cache
        .get_or_compute(&bias, 1, Par::Seq)
        .unwrap_err()
        .to_string();
    assert!(e.contains("x.bias") && e.contains("2-D"), "{e}");
    let ints = TensorView {
        name: "i.weight",
        dtype: DType::I32,
        shape: &[2, 2],
        bytes: &[0; 16],
    };
    assert!(cache.get_or_compute(&ints, 1, Par::Seq).is_err());
}

// ---------------------------------------------------------------------------------------------
// Real-shaped checks and measurements (ignored: minutes on 2 cores). Commands and results in
// BENCHMARKS.md, section "SVD (linalg)".
// ---------------------------------------------------------------------------------------------

/// CPU seconds used so far by this process, all threads (utime + stime of /proc/self/stat).
/// On a shared machine this, not wall time, is what the computation itself costs.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after_name = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // Fields 14 and 15 of stat(5); `after_name` starts at field 3.
    let ticks: f64 = fields.get(11..13).map_or(0.0, |f| {
        f.iter().filter_map(|x| x.parse::<f64>().ok()).sum()
    });
    ticks / rustix::param::clock_ticks_per_second() as f64
}

/// Runs `f`, returning its result, wall seconds and CPU seconds.
fn timed<R>(f: impl FnOnce() -> R) -> (R, f64, f64) {
    let (t, c) = (Instant::now(), cpu_seconds());
    let r = f();
    (r, t.elapsed().as_secs_f64(), cpu_seconds() - c)
}

/// Top-r error of `xs_bases` against the known factors, with the Wedin tolerance per vector.
fn real_shape_check(out: usize, inp: usize, seed: u64) {
    let t = Instant::now();
    let K = known(out, inp, power_law(out.min(inp)), seed);
    let build = t.elapsed();
    let r = 256;
    let (b, wall, cpu) = timed(|| xs_bases(&K.W, out, inp, r, Par::rayon(0)).unwrap());
    let (mut U0, mut V0) = (K.U0.clone(), K.V0.clone());
    sa3_signs(&mut U0, &mut V0);
    let (mut worst64, mut worst256, mut worst_ratio) = (0.0f64, 0.0f64, 0.0f64);
    for j in 0..r {
        let tol = vector_tolerance(&K.s, j, out != inp, K.rounding, out.max(inp));
        let du = (0..out).map(|i| (f64::from(b.U[i * r + j]) - U0[(i, j)]).abs());
        let dv = (0..inp).map(|i| (f64::from(b.V[i * r + j]) - V0[(i, j)]).abs());
        let err = du.chain(dv).fold(0.0, f64::max);
        assert!(err <= tol, "vector {j}: {err:e} > {tol:e}");
        if j < 64 {
            worst64 = worst64.max(err);
        }
        worst256 = worst256.max(err);
        worst_ratio = worst_ratio.max(err / tol);
    }
    check_orthonormal(&b.U, out, r);
    check_orthonormal(&b.V, inp, r);
    eprintln!(
        "{out}x{inp} power-law: build {build:.1?}, xs_bases(r=256, f64, {} threads) wall {wall:.1}s cpu {cpu:.1}s; \
         ‖W_f32−W‖_F = {:.2e}; max |U,V − exact| top-64 {worst64:.2e}, top-256 {worst256:.2e} \
         (worst error/tolerance {worst_ratio:.3})",
        rayon::current_num_threads(),
        K.rounding
    );
}

#[test]
#[ignore = "real shape, ~1 min on 2 cores"]
fn real_shape_1536x1536_power_law() {
    no_global_parallelism();
    real_shape_check(1536, 1536, 1536);
}

#[test]
#[ignore = "real shape, ~2 min on 2 cores"]
fn real_shape_1536x8960_power_law() {
    no_global_parallelism();
    real_shape_check(1536, 8960, 8960);
}

/// faer f32 thin SVD with the same canonicalisation, top `r` columns as row-major f32.
fn faer_f32_bases(W: &[f32], out: usize, inp: usize, r: usize, par: Par) -> (Vec<f32>, Vec<f32>) {
    use faer::linalg::svd::{ComputeSvdVectors, svd, svd_scratch};
    let k = out.min(inp);
    let A = Mat::<f32>::from_fn(out, inp, |i, j| W[i * inp + j]);
    let (mut S, mut U, mut V) = (
        faer::Col::<f32>::zeros(k),
        Mat::<f32>::zeros(out, k),
        Mat::<f32>::zeros(inp, k),
    );
    let params = Default::default();
    let thin = ComputeSvdVectors::Thin;
    let mut mem = MemBuffer::new(svd_scratch::<f32>(out, inp, thin, thin, par, params));
    svd(
        A.as_ref(),
        S.as_diagonal_mut(),
        Some(U.as_mut()),
        Some(V.as_mut()),
        par,
        MemStack::new(&mut mem),
        params,
    )
    .unwrap();
    wanbake::linalg::canonicalize_signs_mat(U.as_mut(), V.as_mut().transpose_mut());
    let take = |X: &Mat<f32>| {
        (0..X.nrows())
            .flat_map(|i| (0..r).map(move |j| (i, j)))
            .map(|(i, j)| X[(i, j)])
            .collect()
    };
    (take(&U), take(&V))
}

/// ‖U₁MV₁ᵀ − U₂MV₂ᵀ‖_F / ‖U₂MV₂ᵀ‖_F for the leading `r` of the `ld` stored columns
/// (explicit out×in products in f64).
#[allow(clippy::too_many_arguments)]
fn delta_rel_error(
    (U1, V1): (&[f32], &[f32]),
    (U2, V2): (&[f32], &[f32]),
    out: usize,
    inp: usize,
    ld: usize,
    M: &Mat<f64>,
) -> f64 {
    let r = M.nrows();
    let to_mat = |X: &[f32], n: usize| Mat::<f64>::from_fn(n, r, |i, j| f64::from(X[i * ld + j]));
    let delta = |U: &[f32], V: &[f32]| {
        let UM = mul(to_mat(U, out).as_ref(), M.as_ref());
        let mut D = Mat::<f64>::zeros(out, inp);
        matmul(
            D.as_mut(),
            Accum::Replace,
            UM.as_ref(),
            to_mat(V, inp).transpose(),
            1.0,
            Par::rayon(0),
        );
        D
    };
    let (D1, D2) = (delta(U1, V1), delta(U2, V2));
    (&D1 - &D2).norm_l2() / D2.norm_l2()
}

/// Max |X₁ − X₂| over the leading `r` of `ld` stored columns of two (n, ld) arrays.
fn max_diff(X1: &[f32], X2: &[f32], ld: usize, r: usize) -> f64 {
    X1.chunks(ld)
        .zip(X2.chunks(ld))
        .flat_map(|(a, b)| {
            a[..r]
                .iter()
                .zip(&b[..r])
                .map(|(x, y)| (f64::from(*x) - f64::from(*y)).abs())
        })
        .fold(0.0, f64::max)
}

/// Writes named f32 tensors to a safetensors file (for the torch comparison script).
fn dump(path: &std::path::Path, tensors: &[(&str, Vec<usize>, &[f32])]) {
    use wanbake::format::header_layout::{HeaderLayout, PlannedTensor};
    let planned: Vec<PlannedTensor> = tensors
        .iter()
        .map(|(n, s, _)| PlannedTensor {
            name: n.to_string(),
            dtype: DType::F32,
            shape: s.clone(),
        })
        .collect();
    let layout = HeaderLayout::build(&planned, &Default::default()).unwrap();
    let mut bytes = layout.prefix.clone();
    for t in &layout.tensors {
        let (_, _, data) = tensors.iter().find(|(n, _, _)| *n == t.name).unwrap();
        bytes.extend(data.iter().flat_map(|x| x.to_le_bytes()));
    }
    std::fs::write(path, bytes).unwrap();
}

/// f32 vs f64 faer SVD on power-law spectra: distance of each from the exact vectors, ΔW
/// error for a random core M, and timings. Shapes from `WANBAKE_SVD_SHAPES` (e.g.
/// `1536x1536,1536x8960,5120x5120,13824x5120`); with `WANBAKE_SVD_DUMP=DIR`, writes W and
/// both answers to DIR/<out>x<in>.safetensors for the torch comparison in BENCHMARKS.md.
#[test]
#[ignore = "measurement for BENCHMARKS.md, tens of minutes on 2 cores"]
fn svd_precision_and_timing_report() {
    no_global_parallelism();
    let shapes = std::env::var("WANBAKE_SVD_SHAPES").unwrap_or_else(|_| "1536x1536".into());
    let dump_dir = std::env::var_os("WANBAKE_SVD_DUMP").map(std::path::PathBuf::from);
    for shape in shapes.split(',') {
        let (out, inp) = shape.split_once('x').unwrap();
        let (out, inp): (usize, usize) = (out.parse().unwrap(), inp.parse().unwrap());
        let t = Instant::now();
        let K = known(
            out,
            inp,
            power_law(out.min(inp)),
            7 + out as u64 * 31 + inp as u64,
        );
        eprintln!("{out}x{inp}: built in {:.1?}", t.elapsed());
        let ld = 256;
        let (b, t64, c64) = timed(|| xs_bases(&K.W, out, inp, ld, Par::rayon(0)).unwrap());
        let degree = Par::rayon(wanbake::linalg::SVD_PARTITION_DEGREE);
        let ((U32, V32), t32, c32) = timed(|| faer_f32_bases(&K.W, out, inp, ld, degree));
        let (mut U0, mut V0) = (K.U0.clone(), K.V0.clone());
        sa3_signs(&mut U0, &mut V0);
        let exact = |X: &Mat<f64>| -> Vec<f32> {
            (0..X.nrows())
                .flat_map(|i| (0..ld).map(move |j| (i, j)))
                .map(|(i, j)| X[(i, j)] as f32)
                .collect()
        };
        let (Ue, Ve) = (exact(&U0), exact(&V0));
        eprintln!(
            "{out}x{inp}: f64 wall {t64:.1}s cpu {c64:.1}s, f32 wall {t32:.1}s cpu {c32:.1}s ({} threads, degree {})",
            rayon::current_num_threads(),
            wanbake::linalg::SVD_PARTITION_DEGREE
        );
        let mut rng = Rng::new(99);
        for r in [64, 256] {
            let M = Mat::<f64>::from_fn(r, r, |_, _| rng.normal());
            let diff_f32 = max_diff(&b.U, &U32, ld, r).max(max_diff(&b.V, &V32, ld, r));
            let diff_f64_exact = max_diff(&b.U, &Ue, ld, r).max(max_diff(&b.V, &Ve, ld, r));
            let diff_f32_exact = max_diff(&U32, &Ue, ld, r).max(max_diff(&V32, &Ve, ld, r));
            let dw_f32 = delta_rel_error((&U32, &V32), (&b.U, &b.V), out, inp, ld, &M);
            let dw_f64 = delta_rel_error((&b.U, &b.V), (&Ue, &Ve), out, inp, ld, &M);
            eprintln!(
                "  r={r}: max|U,V| diff: f64-f32 {diff_f32:.2e}, f64-construction {diff_f64_exact:.2e}, \
                 f32-construction {diff_f32_exact:.2e}; dW rel err: f32 vs f64 {dw_f32:.2e}, \
                 f64 vs construction {dw_f64:.2e}"
            );
        }
        if let Some(dir) = &dump_dir {
            let path = dir.join(format!("{out}x{inp}.safetensors"));
            let s: Vec<f32> = K.s.iter().map(|&x| x as f32).collect();
            dump(
                &path,
                &[
                    ("W", vec![out, inp], &K.W),
                    ("s_exact", vec![s.len()], &s),
                    ("U_f64", vec![out, ld], &b.U),
                    ("V_f64", vec![inp, ld], &b.V),
                    ("U_f32", vec![out, ld], &U32),
                    ("V_f32", vec![inp, ld], &V32),
                ],
            );
            eprintln!("  wrote {}", path.display());
        }
    }
}

/// Wall and CPU time of `xs_bases` (f64, the shipped path) and of faer's f32 SVD on a
/// Gaussian matrix (timing only; the spectrum barely matters for the cost). Shapes from
/// `WANBAKE_SVD_TIMING_SHAPES` (default `5120x5120,13824x5120`).
#[test]
#[ignore = "measurement for BENCHMARKS.md, tens of minutes on 2 cores"]
fn svd_timing_report() {
    no_global_parallelism();
    let shapes = std::env::var("WANBAKE_SVD_TIMING_SHAPES")
        .unwrap_or_else(|_| "5120x5120,13824x5120".into());
    for shape in shapes.split(',') {
        let (out, inp) = shape.split_once('x').unwrap();
        let (out, inp): (usize, usize) = (out.parse().unwrap(), inp.parse().unwrap());
        let W = Rng::new(out as u64 ^ inp as u64).normal_f32s(out * inp, 0.02);
        let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        let (_, w64, c64) = timed(|| xs_bases(&W, out, inp, 64, Par::rayon(0)).unwrap());
        let degree = Par::rayon(wanbake::linalg::SVD_PARTITION_DEGREE);
        let (_, w32, c32) = timed(|| faer_f32_bases(&W, out, inp, 64, degree));
        eprintln!(
            "{out}x{inp} gaussian: xs_bases f64 wall {w64:.1}s cpu {c64:.1}s; faer f32 wall {w32:.1}s cpu {c32:.1}s \
             ({} threads; loadavg before: {})",
            rayon::current_num_threads(),
            load.trim()
        );
    }
}

/// Cost of a cache lookup's key: sha256 over the base tensor's bytes (bf16 5120×5120 and
/// 13824×5120), the part of a hit that grows with the base.
#[test]
#[ignore = "measurement for BENCHMARKS.md"]
fn cache_key_hash_throughput() {
    no_global_parallelism();
    for (out, inp) in [(5120usize, 5120usize), (13824, 5120)] {
        let bytes = vec![0x3cu8; out * inp * 2];
        let (_, wall, cpu) =
            timed(|| basis_key(&SvdEngine::Faer, DType::BF16, &[out, inp], &bytes, 64));
        eprintln!(
            "basis_key {out}x{inp} bf16 ({:.1} MB): wall {:.1} ms, cpu {:.1} ms, {:.2} GB/s of CPU time",
            bytes.len() as f64 / 1e6,
            wall * 1e3,
            cpu * 1e3,
            bytes.len() as f64 / cpu.max(1e-9) / 1e9
        );
    }
}

/// Issue 32: the cache is keyed by engine. Bases stored by one engine (here a stand-in for
/// cuSOLVER whose bases differ from faer's) are never read by a run of another: faer misses,
/// computes its own bits and stores them beside the other entry, and each engine then hits
/// its own entry, whichever filled the cache first. Each entry names its engine.
#[test]
fn cache_entries_of_one_engine_are_never_read_by_another() {
    no_global_parallelism();
    let base = Base::new(96, 64, 29);
    let v = base.view();
    let W = v.to_f32().unwrap();
    let own = xs_bases(&W, 96, 64, 8, Par::Seq).unwrap();
    let mut other = own.clone();
    other.U[0] = f32::from_bits(other.U[0].to_bits() ^ 1); // one ulp: cuSOLVER's kind of difference
    let gpu = SvdEngine::Cusolver {
        version: 12_004,
        arch: (9, 0),
        sms: 132,
    };
    for gpu_first in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let cache = SvdCache::open(dir.path()).unwrap();
        let on_gpu = || {
            cache.get_or_compute_with(&v, 8, &gpu, |_, _, _| {
                Ok::<_, wanbake::linalg::CacheError>(other.clone())
            })
        };
        let on_faer = || cache.get_or_compute(&v, 8, Par::Seq);
        let (first, second) = if gpu_first {
            (on_gpu().unwrap(), on_faer().unwrap())
        } else {
            (on_faer().unwrap(), on_gpu().unwrap())
        };
        assert_eq!(
            (&first.outcome, &second.outcome),
            (&CacheOutcome::Miss, &CacheOutcome::Miss)
        );
        assert_ne!(first.key, second.key);
        let (g, f) = (on_gpu().unwrap(), on_faer().unwrap());
        assert_eq!(
            (&g.outcome, &f.outcome),
            (&CacheOutcome::Hit, &CacheOutcome::Hit)
        );
        assert_eq!(bits(&f.bases), bits(&own), "faer reads its own bits");
        assert_eq!(
            bits(&g.bases),
            bits(&other),
            "the other engine reads its own"
        );
        for (entry, engine) in [(&g, &gpu), (&f, &SvdEngine::Faer)] {
            let file = wanbake::io::SafetensorsFile::open(&cache.entry_path(&entry.key)).unwrap();
            assert_eq!(file.metadata().get("engine"), Some(&engine.id()));
        }
    }
}

/// `linalg::engine::FAER_VERSION`, which names faer in cache keys and manifests, is the
/// version Cargo.lock builds.
#[test]
fn the_faer_version_named_in_keys_is_the_one_built() {
    let lock = std::fs::read_to_string(common::repo().join("Cargo.lock")).unwrap();
    let at = lock
        .find("name = \"faer\"\nversion = \"")
        .expect("faer in Cargo.lock");
    let rest = &lock[at + "name = \"faer\"\nversion = \"".len()..];
    let version = &rest[..rest.find('"').unwrap()];
    assert_eq!(version, wanbake::linalg::engine::FAER_VERSION);
}
