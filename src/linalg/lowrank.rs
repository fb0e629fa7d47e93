//! Low-rank weight updates for the merge engine: `W ← W + s·B·A` and, for the -xs adapters,
//! `W ← W + s·U·M·Vᵀ` (spec `sa3_lora.md` §1.4, §2.4).
//!
//! Owns: the two update kernels, each at two levels: one on faer views of any layout writing
//! into caller-owned buffers (`*_into`, with a `*_scratch_len` for the temporaries), and one
//! on row-major slices. Does not own: the adapter formulas that choose `B`, `A` and `s`.
//!
//! Arithmetic: f32 storage and f32 compute, through faer's matmul with `Accum::Add`, so every
//! element is `W[i,j] + s·(Σ_k B[i,k]·A[k,j])` accumulated in f32 by faer's kernel.
//! Determinism: the bits do not depend on `par`. For a product whose output has at least two
//! rows and two columns, faer 0.24's matmul splits only the output into tiles between
//! threads; the reduction over `k` runs in one thread in a fixed order (blocks of 512 along
//! k, independent of thread count and cache sizes). A product whose output is a single row
//! or column goes to faer's matrix-vector kernel instead, and that kernel (`matvec_colmajor`)
//! splits the reduction over `k` into one partial sum per thread when `par` is `Rayon(n)`,
//! even for n = 1, so those products always run `Par::Seq` here (they are cheap). The tests
//! check `Par::Seq` against `Par::rayon(n)` bit for bit, including 1×n and n×1 updates. Bits
//! may still differ between CPUs whose SIMD kernels differ (AVX2 vs AVX-512 microkernels).

#![allow(non_snake_case)]

use faer::linalg::matmul::matmul;
use faer::{Accum, MatMut, MatRef, Par};

/// `W ← W + s·B·A` with `W` (out, in), `B` (out, r), `A` (r, in), any layout.
///
/// # Panics
/// If the shapes do not chain (a programmer error; user shape errors are caught when binding
/// adapters to the base).
#[track_caller]
pub fn add_scaled_product_into(
    W: MatMut<'_, f32>,
    s: f32,
    B: MatRef<'_, f32>,
    A: MatRef<'_, f32>,
    par: Par,
) {
    assert!(
        B.nrows() == W.nrows() && A.ncols() == W.ncols() && B.ncols() == A.nrows(),
        "W ({}, {}) += B ({}, {}) · A ({}, {}): shapes do not chain",
        W.nrows(),
        W.ncols(),
        B.nrows(),
        B.ncols(),
        A.nrows(),
        A.ncols()
    );
    let par = deterministic_par(W.nrows(), W.ncols(), par);
    matmul(W, Accum::Add, B, A, s, par);
}

/// `par` for a product with a (rows, cols) output: `Par::Seq` for a single row or column,
/// whose faer kernel would split the k reduction between threads (see the module doc).
fn deterministic_par(rows: usize, cols: usize, par: Par) -> Par {
    if rows <= 1 || cols <= 1 {
        Par::Seq
    } else {
        par
    }
}

/// `W ← W + s·B·A` on row-major slices: `W` (out, inp), `B` (out, r), `A` (r, inp).
///
/// # Panics
/// If a slice length does not match its shape.
#[track_caller]
#[allow(clippy::too_many_arguments)]
pub fn add_scaled_product(
    W: &mut [f32],
    out: usize,
    inp: usize,
    s: f32,
    B: &[f32],
    A: &[f32],
    r: usize,
    par: Par,
) {
    check_len("W", W.len(), out, inp);
    check_len("B", B.len(), out, r);
    check_len("A", A.len(), r, inp);
    add_scaled_product_into(
        MatMut::from_row_major_slice_mut(W, out, inp),
        s,
        MatRef::from_row_major_slice(B, out, r),
        MatRef::from_row_major_slice(A, r, inp),
        par,
    );
}

/// Elements of scratch that [`add_xs_update_into`] needs: one (out, r) matrix for `U·M`.
pub fn xs_update_scratch_len(out: usize, r: usize) -> usize {
    out * r
}

/// `W ← W + s·U·M·Vᵀ` with `W` (out, in), `U` (out, r), `M` (r, r), `V` (in, r), computed as
/// `B' = U·M` (into `scratch`, f32) and then `W ← W + s·B'·Vᵀ`, the same order as the
/// reference's `(U @ M) @ V.T`.
///
/// # Panics
/// If the shapes do not chain or `scratch.len() < xs_update_scratch_len(out, r)`.
#[track_caller]
pub fn add_xs_update_into(
    W: MatMut<'_, f32>,
    s: f32,
    U: MatRef<'_, f32>,
    M: MatRef<'_, f32>,
    V: MatRef<'_, f32>,
    scratch: &mut [f32],
    par: Par,
) {
    let (out, r) = (U.nrows(), U.ncols());
    assert!(
        M.nrows() == r && M.ncols() == r && V.ncols() == r,
        "U ({out}, {r}) · M ({}, {}) · Vᵀ with V ({}, {}): shapes do not chain",
        M.nrows(),
        M.ncols(),
        V.nrows(),
        V.ncols()
    );
    let need = xs_update_scratch_len(out, r);
    assert!(
        scratch.len() >= need,
        "scratch has {} elements, need {need}",
        scratch.len()
    );
    let mut Bp = MatMut::from_row_major_slice_mut(&mut scratch[..need], out, r);
    matmul(
        Bp.as_mut(),
        Accum::Replace,
        U,
        M,
        1.0f32,
        deterministic_par(out, r, par),
    );
    add_scaled_product_into(W, s, Bp.as_ref(), V.transpose(), par);
}

/// `W ← W + s·U·M·Vᵀ` on row-major slices: `W` (out, inp), `U` (out, r), `M` (r, r),
/// `V` (inp, r). Allocates the (out, r) temporary.
///
/// # Panics
/// If a slice length does not match its shape.
#[track_caller]
#[allow(clippy::too_many_arguments)]
pub fn add_xs_update(
    W: &mut [f32],
    out: usize,
    inp: usize,
    s: f32,
    U: &[f32],
    M: &[f32],
    V: &[f32],
    r: usize,
    par: Par,
) {
    check_len("W", W.len(), out, inp);
    check_len("U", U.len(), out, r);
    check_len("M", M.len(), r, r);
    check_len("V", V.len(), inp, r);
    let mut scratch = vec![0.0f32; xs_update_scratch_len(out, r)];
    add_xs_update_into(
        MatMut::from_row_major_slice_mut(W, out, inp),
        s,
        MatRef::from_row_major_slice(U, out, r),
        MatRef::from_row_major_slice(M, r, r),
        MatRef::from_row_major_slice(V, inp, r),
        &mut scratch,
        par,
    );
}

#[track_caller]
fn check_len(name: &str, len: usize, rows: usize, cols: usize) {
    assert_eq!(
        len,
        rows * cols,
        "{name} has {len} elements, expected ({rows}, {cols}) row-major"
    );
}
