//! Row and column L2 norms of a row-major (out, in) f32 matrix, for DoRA/BoRA magnitudes
//! (spec `sa3_lora.md` §1.2: `‖V‖_row[i] = sqrt(Σ_j V[i,j]²)`, `‖V‖_col[j] = sqrt(Σ_i V[i,j]²)`).
//!
//! Owns: `row_norms`, `col_norms` and their `*_into` forms writing into caller-owned buffers.
//! Does not own: the `+ ε` of the DoRA formulas (that is adapter math).
//!
//! Arithmetic, the same on every backend: each square `x·x` of an f32 is exact in f64, the
//! squares are summed in f64 in index order (j ascending for a row, i ascending for a
//! column), the root is taken in f64 and rounded once to f32. Because the products are
//! exact, a fused multiply-add gives the same bits as a multiply then add, so a GPU kernel
//! that keeps the same order reproduces these bits. Parallelism splits rows (row norms) or
//! columns (column norms) into contiguous chunks; no sum is ever split, so the bits do not
//! depend on `par`.

#![allow(non_snake_case)]

use faer::Par;
use rayon::prelude::*;

/// Per-row L2 norms of `W` (out, inp), row-major. See the module doc for the arithmetic.
#[track_caller]
pub fn row_norms(W: &[f32], out: usize, inp: usize, par: Par) -> Vec<f32> {
    let mut dst = vec![0.0f32; out];
    row_norms_into(W, out, inp, &mut dst, par);
    dst
}

/// Per-row L2 norms of `W` (out, inp) into `dst` (out).
///
/// # Panics
/// If `W.len() != out·inp` or `dst.len() != out`.
#[track_caller]
pub fn row_norms_into(W: &[f32], out: usize, inp: usize, dst: &mut [f32], par: Par) {
    assert_eq!(W.len(), out * inp, "W must be (out={out}, inp={inp})");
    assert_eq!(dst.len(), out, "dst must hold {out} row norms");
    if inp == 0 {
        dst.fill(0.0);
        return;
    }
    let rows = |dst: &mut [f32], W: &[f32]| {
        for (d, row) in dst.iter_mut().zip(W.chunks_exact(inp)) {
            let sum = row.iter().fold(0.0f64, |acc, &x| {
                let x = f64::from(x);
                acc + x * x
            });
            *d = sum.sqrt() as f32;
        }
    };
    let chunk = chunk_len(out, par);
    if chunk >= out {
        rows(dst, W);
    } else {
        dst.par_chunks_mut(chunk)
            .zip(W.par_chunks(chunk * inp))
            .for_each(|(d, w)| rows(d, w));
    }
}

/// Per-column L2 norms of `W` (out, inp), row-major. See the module doc for the arithmetic.
#[track_caller]
pub fn col_norms(W: &[f32], out: usize, inp: usize, par: Par) -> Vec<f32> {
    let mut dst = vec![0.0f32; inp];
    col_norms_into(W, out, inp, &mut dst, par);
    dst
}

/// Per-column L2 norms of `W` (out, inp) into `dst` (inp). Allocates an f64 accumulator of
/// `inp` elements.
///
/// # Panics
/// If `W.len() != out·inp` or `dst.len() != inp`.
#[track_caller]
pub fn col_norms_into(W: &[f32], out: usize, inp: usize, dst: &mut [f32], par: Par) {
    assert_eq!(W.len(), out * inp, "W must be (out={out}, inp={inp})");
    assert_eq!(dst.len(), inp, "dst must hold {inp} column norms");
    let mut acc = vec![0.0f64; inp];
    // Columns [j0, j0 + acc.len()) summed over rows i = 0, 1, ... in order.
    let cols = |j0: usize, acc: &mut [f64], dst: &mut [f32]| {
        let n = acc.len();
        for row in W.chunks_exact(inp.max(1)).take(out) {
            for (a, &x) in acc.iter_mut().zip(&row[j0..j0 + n]) {
                let x = f64::from(x);
                *a += x * x;
            }
        }
        for (d, a) in dst.iter_mut().zip(acc.iter()) {
            *d = a.sqrt() as f32;
        }
    };
    let chunk = chunk_len(inp, par);
    if chunk >= inp {
        cols(0, &mut acc, dst);
    } else {
        acc.par_chunks_mut(chunk)
            .zip(dst.par_chunks_mut(chunk))
            .enumerate()
            .for_each(|(c, (a, d))| cols(c * chunk, a, d));
    }
}

/// Contiguous chunk length giving `par.degree()` chunks of `n` items (at least 1).
fn chunk_len(n: usize, par: Par) -> usize {
    n.div_ceil(par.degree().max(1)).max(1)
}
