//! The numeric kernels of the runner, each written to follow PyTorch's f32 CPU arithmetic:
//! the Linear layer (faer matmul on a fixed tile grid), LayerNorm (two-pass variance),
//! RMSNorm, GELU (tanh and exact erf), SiLU, and an f64 `erf`.
//!
//! Determinism: every parallel kernel splits its work on a grid whose tile sizes are
//! constants ([`ROW_TILE`], [`COL_TILE`], [`NORM_ROWS`]); each tile is computed with
//! `Par::Seq`, so an output value never depends on how many threads ran or which thread
//! took which tile. Does not own: attention (`runner::attention`) or RoPE (`runner::rope`).

use faer::linalg::matmul::matmul;
use faer::{Accum, MatMut, MatRef, Par};
use rayon::prelude::*;

/// Rows of the activation handled by one matmul tile.
pub const ROW_TILE: usize = 256;
/// Output features handled by one matmul tile.
pub const COL_TILE: usize = 64;
/// Rows per parallel task in the row-wise kernels (norms, activations).
pub const NORM_ROWS: usize = 64;

/// `Y = X·Wᵀ + b` for a PyTorch `Linear`: X is (m, k) row-major, W is (n, k) row-major
/// (PyTorch layout), b is (n). Returns Y (m, n) row-major.
#[track_caller]
pub fn linear(
    x: &[f32],
    m: usize,
    k: usize,
    w: &[f32],
    bias: Option<&[f32]>,
    n: usize,
) -> Vec<f32> {
    assert_eq!(x.len(), m * k, "linear: X is not ({m}, {k})");
    assert_eq!(w.len(), n * k, "linear: W is not ({n}, {k})");
    let mut y = vec![0f32; m * n];
    if let Some(b) = bias {
        assert_eq!(b.len(), n, "linear: bias is not ({n})");
        y.par_chunks_mut(n.max(1) * NORM_ROWS)
            .for_each(|rows| rows.chunks_mut(n.max(1)).for_each(|r| r.copy_from_slice(b)));
    }
    if m == 0 || n == 0 {
        return y;
    }
    if k == 0 {
        return y;
    }
    let lhs = MatRef::from_row_major_slice(x, m, k);
    // W (n, k) row-major is Wᵀ (k, n) column-major.
    let rhs = MatRef::from_column_major_slice(w, k, n);
    let dst = MatMut::from_row_major_slice_mut(&mut y, m, n);
    matmul_tiled(dst, lhs, rhs);
    y
}

/// `dst += lhs·rhs` on the fixed [`ROW_TILE`] × [`COL_TILE`] grid, tiles in parallel.
fn matmul_tiled(dst: MatMut<'_, f32>, lhs: MatRef<'_, f32>, rhs: MatRef<'_, f32>) {
    let (m, n) = (dst.nrows(), dst.ncols());
    if n > COL_TILE {
        let mid = grid_split(n, COL_TILE);
        let (left, right) = dst.split_at_col_mut(mid);
        let (rl, rr) = (rhs.subcols(0, mid), rhs.subcols(mid, n - mid));
        rayon::join(
            || matmul_tiled(left, lhs, rl),
            || matmul_tiled(right, lhs, rr),
        );
    } else if m > ROW_TILE {
        let mid = grid_split(m, ROW_TILE);
        let (top, bottom) = dst.split_at_row_mut(mid);
        let (lt, lb) = (lhs.subrows(0, mid), lhs.subrows(mid, m - mid));
        rayon::join(
            || matmul_tiled(top, lt, rhs),
            || matmul_tiled(bottom, lb, rhs),
        );
    } else {
        matmul(dst, Accum::Add, lhs, rhs, 1.0f32, Par::Seq);
    }
}

/// A split point of `len > tile` that is a multiple of `tile`, near the middle, so the
/// recursion always lands on the same grid.
fn grid_split(len: usize, tile: usize) -> usize {
    let tiles = len.div_ceil(tile);
    (tiles / 2) * tile
}

/// Applies `f` to every row of a (rows, width) matrix in parallel (fixed row blocks).
pub fn for_each_row(data: &mut [f32], width: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    if width == 0 {
        return;
    }
    data.par_chunks_mut(width * NORM_ROWS)
        .enumerate()
        .for_each(|(block, rows)| {
            for (i, row) in rows.chunks_mut(width).enumerate() {
                f(block * NORM_ROWS + i, row);
            }
        });
}

/// Applies `f` to every element in parallel.
pub fn map_inplace(data: &mut [f32], f: impl Fn(f32) -> f32 + Sync) {
    data.par_chunks_mut(1 << 14)
        .for_each(|c| c.iter_mut().for_each(|v| *v = f(*v)));
}

/// Sum of a slice in f32, accumulated in 8 interleaved lanes and then combined pairwise
/// (close to PyTorch's vectorised cascade sum, and independent of threads).
pub fn sum_f32(xs: &[f32]) -> f32 {
    sum_map(xs, |v| v)
}

/// `Σ f(x)` with the lane order of [`sum_f32`].
pub fn sum_map(xs: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut lanes = [0f32; 8];
    let chunks = xs.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for (l, &v) in lanes.iter_mut().zip(c) {
            *l += f(v);
        }
    }
    for (l, &v) in lanes.iter_mut().zip(tail) {
        *l += f(v);
    }
    let [a, b, c, d, e, f, g, h] = lanes;
    ((a + b) + (c + d)) + ((e + f) + (g + h))
}

/// LayerNorm of one row in place: mean, then the biased variance of the centred values
/// (two passes), `y = (x − mean) · 1/√(var + eps)`, then `· γ + β` when affine.
pub fn layer_norm_row(row: &mut [f32], eps: f32, affine: Option<(&[f32], &[f32])>) {
    let n = row.len() as f32;
    let mean = sum_f32(row) / n;
    let var = sum_map(row, |x| (x - mean) * (x - mean)) / n;
    let rstd = 1.0 / (var + eps).sqrt();
    match affine {
        Some((gamma, beta)) => {
            for ((x, g), b) in row.iter_mut().zip(gamma).zip(beta) {
                *x = (*x - mean) * rstd * g + b;
            }
        }
        None => {
            for x in row.iter_mut() {
                *x = (*x - mean) * rstd;
            }
        }
    }
}

/// LayerNorm over the last axis of a (rows, width) matrix, in place.
pub fn layer_norm(data: &mut [f32], width: usize, eps: f32, affine: Option<(&[f32], &[f32])>) {
    for_each_row(data, width, |_, row| layer_norm_row(row, eps, affine));
}

/// `torch.nn.RMSNorm` over the last axis, in place: `y = x · 1/√(mean(x²) + eps) · g`.
pub fn rms_norm(data: &mut [f32], width: usize, eps: f32, gain: &[f32]) {
    for_each_row(data, width, |_, row| {
        let r = 1.0 / (sum_map(row, |x| x * x) / width as f32 + eps).sqrt();
        for (x, g) in row.iter_mut().zip(gain) {
            *x = *x * r * g;
        }
    });
}

/// GELU with the tanh approximation, as PyTorch's f32 kernel writes it:
/// `0.5·x·(1 + tanh(β·(x + κ·x³)))`, β = √2·(2/√π)·0.5 rounded to f32, κ = 0.044715.
pub fn gelu_tanh(x: f32) -> f32 {
    const BETA: f32 = (std::f64::consts::SQRT_2 * std::f64::consts::FRAC_2_SQRT_PI * 0.5) as f32;
    const KAPPA: f32 = 0.044715;
    let cube = x * x * x;
    let inner = BETA * (x + KAPPA * cube);
    0.5 * x * (1.0 + (inner as f64).tanh() as f32)
}

/// Exact GELU, as PyTorch's f32 kernel writes it: `x · 0.5 · (1 + erf(x · 1/√2))`.
pub fn gelu_erf(x: f32) -> f32 {
    const ALPHA: f32 = std::f64::consts::FRAC_1_SQRT_2 as f32;
    x * 0.5 * (1.0 + erf((x * ALPHA) as f64) as f32)
}

/// SiLU, `x / (1 + exp(−x))`.
pub fn silu(x: f32) -> f32 {
    x / (1.0 + ((-x) as f64).exp() as f32)
}

/// The error function in f64 (the standard library has none on stable Rust).
///
/// |x| ≤ 2.5: the Maclaurin series `2/√π · Σ (−1)ⁿ x²ⁿ⁺¹ / (n!(2n+1))`, summed until the
/// terms vanish (cancellation costs about 3 digits at x = 2.5, leaving ~1e-13).
/// |x| > 2.5: `1 − erfc(x)` with the continued fraction
/// `erfc(x) = e^{−x²}/√π · 1/(x + (1/2)/(x + 1/(x + (3/2)/(x + …))))`, 80 terms evaluated
/// backwards. |x| ≥ 6 gives ±1 (erfc(6) < 2.2e-17).
pub fn erf(x: f64) -> f64 {
    if x.is_nan() {
        return f64::NAN;
    }
    let a = x.abs();
    let value = if a <= 2.5 {
        let x2 = a * a;
        let mut power = a; // (−1)ⁿ x²ⁿ⁺¹ / n!
        let mut sum = a;
        let mut n = 0u32;
        loop {
            n += 1;
            power *= -x2 / n as f64;
            let term = power / (2 * n + 1) as f64;
            sum += term;
            if term.abs() <= 1e-17 * sum.abs() {
                break;
            }
        }
        sum * std::f64::consts::FRAC_2_SQRT_PI
    } else if a >= 6.0 {
        1.0
    } else {
        let mut tail = 0.0;
        for j in (1..=80).rev() {
            tail = (j as f64 / 2.0) / (a + tail);
        }
        let erfc = (-a * a).exp() / (a + tail) * (std::f64::consts::FRAC_2_SQRT_PI / 2.0);
        1.0 - erfc
    };
    value.copysign(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_matches_tabulated_values() {
        // Abramowitz & Stegun table 7.1 / standard high-precision values.
        let cases = [
            (0.0, 0.0),
            (0.1, 0.1124629160182849),
            (0.5, 0.5204998778130465),
            (1.0, 0.8427007929497149),
            (1.5, 0.9661051464753108),
            (2.0, 0.9953222650189527),
            (2.5, 0.999_593_047_982_555),
            (3.0, 0.9999779095030014),
            (4.0, 0.9999999845827421),
        ];
        for (x, want) in cases {
            assert!(
                (erf(x) - want).abs() < 1e-14,
                "erf({x}) = {} vs {want}",
                erf(x)
            );
            assert!((erf(-x) + want).abs() < 1e-14);
        }
        // Continuity across the branch point.
        assert!((erf(2.5 - 1e-12) - erf(2.5 + 1e-12)).abs() < 1e-12);
        assert_eq!(erf(7.0), 1.0);
    }

    #[test]
    fn linear_matches_naive_on_ragged_tiles() {
        let (m, k, n) = (ROW_TILE + 3, 5, COL_TILE * 2 + 7);
        let x: Vec<f32> = (0..m * k).map(|i| ((i * 7 % 13) as f32) - 6.0).collect();
        let w: Vec<f32> = (0..n * k).map(|i| ((i * 5 % 11) as f32) - 5.0).collect();
        let b: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let y = linear(&x, m, k, &w, Some(&b), n);
        for i in 0..m {
            for j in 0..n {
                let want: f32 = b[j] + (0..k).map(|t| x[i * k + t] * w[j * k + t]).sum::<f32>();
                // Small integers: every product and sum is exact.
                assert_eq!(y[i * n + j], want, "({i},{j})");
            }
        }
    }

    #[test]
    fn layer_norm_of_known_row() {
        // x = [1, 2, 3, 4]: mean 2.5, var 1.25.
        let mut row = [1.0f32, 2.0, 3.0, 4.0];
        layer_norm_row(&mut row, 0.0, None);
        let s = 1.25f32.sqrt();
        for (got, want) in row.iter().zip([-1.5 / s, -0.5 / s, 0.5 / s, 1.5 / s]) {
            assert!((got - want).abs() < 1e-6);
        }
    }

    #[test]
    fn activations_at_known_points() {
        // gelu_erf(1) = 0.5·(1 + erf(1/√2)) = 0.8413447460685429.
        assert!((gelu_erf(1.0) as f64 - 0.841_344_746_068_542_9).abs() < 1e-7);
        // gelu_tanh(1) = 0.5·(1 + tanh(√(2/π)·1.044715)) = 0.8411919906082768.
        assert!((gelu_tanh(1.0) as f64 - 0.841_191_990_608_276_8).abs() < 1e-7);
        // silu(1) = 1/(1 + e⁻¹) = 0.7310585786300049.
        assert!((silu(1.0) as f64 - 0.731_058_578_630_004_9).abs() < 1e-7);
    }
}
