//! The regular Hadamard transform that ConvRot rotates weights and activations with, computed
//! exactly (a fast transform of ±1 butterflies in integers or f64, then one power-of-two
//! scale).
//!
//! Owns: `H_n = H4^{⊗m} / √n` for `n = 4^m`, `H4 = [[1,1,1,-1],[1,1,-1,1],[1,-1,1,1],[-1,1,1,1]]`,
//! applied group-wise along the rows of a matrix. Does not own: quantization (`int8`).
//!
//! Reference: comfy-kitchen 0.2.40 `tensor/int8_utils.py`:
//! - `_build_hadamard(size)`: refuses a size that is not a power of 4 (≥ 4); builds
//!   `torch.kron(h, h4)` repeatedly from `h4`, divides by `size**0.5`.
//! - `_rotate_weight(weight, h, group)`: `W.reshape(N, K/g, g) @ h.T` (refuses `K % g != 0`).
//! - `_rotate_activation(x, h, group)`: `x.reshape(-1, K/g, g) @ h`.
//!
//! Facts used (checked on `H4` by the tests): `H4` is symmetric and `H4·H4 = 4·I`, so
//! `H = H4^{⊗m}/2^m` is symmetric, orthogonal and its own inverse (`H·H = I`). Hence
//! `_rotate_weight` (`· Hᵀ`) and its inverse (`· H`) are the same map ([`transform`]), and
//! the int8 forward `(x·H)·(W·Hᵀ)ᵀ = x·H·H·Wᵀ = x·Wᵀ`: the weight a ConvRot layer computes with is the
//! un-rotated `W = W_rot·H`, which is what `dequantize_int8_convrot_weight` returns.
//!
//! Exactness: `√n = 2^m` is a power of two, so the only roundings are in the butterfly sums.
//! [`butterflies_i64`] sums integer codes exactly (what the ConvRot decoder uses: `s·(q·H)` is
//! one f64 product of an exact integer sum, rounded once). [`transform`] sums in f64, exact when
//! the inputs are integer multiples of one unit `u` with `n·max|x|/u < 2^53`; for arbitrary f32
//! inputs whose magnitudes in one group span more than about 2^20 the f64 sums may round (the
//! result is then within an f64 ulp of exact before the final f32 rounding).

use super::CodecError;

/// `H4`, the 4x4 regular Hadamard block (unnormalized).
pub const H4: [[i8; 4]; 4] = [[1, 1, 1, -1], [1, 1, -1, 1], [1, -1, 1, 1], [-1, 1, 1, 1]];

/// `Ok(m)` with `n = 4^m` when `n` is a power of 4 of at least 4, as `_build_hadamard` requires.
pub fn log4(n: usize) -> Result<u32, CodecError> {
    if n >= 4 && n.is_power_of_two() && n.trailing_zeros().is_multiple_of(2) {
        Ok(n.trailing_zeros() / 2)
    } else {
        Err(CodecError::GroupSize(n))
    }
}

/// One unnormalized pass over `v` (length `4^m`): `v ← H4^{⊗m} v`, ±1 sums only.
fn butterflies<T>(v: &mut [T])
where
    T: Copy + std::ops::Add<Output = T> + std::ops::Sub<Output = T>,
{
    let n = v.len();
    let mut stride = 1;
    while stride < n {
        for base in (0..n).step_by(4 * stride) {
            for k in base..base + stride {
                let (a, b, c, d) = (v[k], v[k + stride], v[k + 2 * stride], v[k + 3 * stride]);
                v[k] = a + b + c - d;
                v[k + stride] = a + b - c + d;
                v[k + 2 * stride] = a - b + c + d;
                v[k + 3 * stride] = b + c + d - a;
            }
        }
        stride *= 4;
    }
}

/// `v ← H4^{⊗m} v` in integers (unnormalized: divide by `2^m` for `H`). Exact while every
/// `|v| · 4^m < 2^63` (int8 codes: any group below 2^55).
pub fn butterflies_i64(v: &mut [i64]) -> Result<u32, CodecError> {
    let m = log4(v.len())?;
    butterflies(v);
    Ok(m)
}

/// `v ← H v` for one group (`H = H4^{⊗m}/2^m`, `v.len() = 4^m`). Because `H` is symmetric this
/// is also `v ← vᵀ H` and `v ← vᵀ Hᵀ`: the forward rotation and its inverse.
pub fn transform(v: &mut [f64]) -> Result<(), CodecError> {
    let m = log4(v.len())?;
    butterflies(v);
    let scale = 0.5f64.powi(m as i32);
    for x in v.iter_mut() {
        *x *= scale;
    }
    Ok(())
}

/// The f64 row-group transform of a row-major `[rows, cols]` matrix, `out[r, g·n..(g+1)·n] =
/// W[r, g·n..(g+1)·n] · H` (equivalently `· Hᵀ`), written into `out` as f64.
fn rotate_groups(w: &[f32], cols: usize, group: usize, out: &mut [f64]) -> Result<(), CodecError> {
    log4(group)?;
    super::check_multiple("in_features (ConvRot group)", cols, group)?;
    if cols == 0 {
        super::check_len("weight (0 columns)", 0, w.len())?;
    } else {
        super::check_multiple("weight length (whole rows)", w.len(), cols)?;
    }
    super::check_len("rotation output", w.len(), out.len())?;
    for (o, &x) in out.iter_mut().zip(w) {
        *o = f64::from(x);
    }
    for g in out.chunks_exact_mut(group) {
        transform(g)?;
    }
    Ok(())
}

/// `_rotate_weight(W, H, group)` computed exactly and rounded once to f32: the stored-basis
/// `W_rot = W·Hᵀ` per group of `group` columns. `w` is row-major with `cols` columns.
pub fn rotate_rows_f32(w: &[f32], cols: usize, group: usize) -> Result<Vec<f32>, CodecError> {
    let mut tmp = vec![0f64; w.len()];
    rotate_groups(w, cols, group, &mut tmp)?;
    Ok(tmp.into_iter().map(|x| x as f32).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The dense `H4^{⊗m}` (unnormalized) as `torch.kron` builds it.
    fn dense(n: usize) -> Vec<Vec<i64>> {
        let mut h: Vec<Vec<i64>> = H4
            .iter()
            .map(|r| r.iter().map(|&x| x as i64).collect())
            .collect();
        while h.len() < n {
            let s = h.len();
            let mut k = vec![vec![0i64; s * 4]; s * 4];
            for i in 0..s {
                for j in 0..s {
                    for a in 0..4 {
                        for b in 0..4 {
                            k[i * 4 + a][j * 4 + b] = h[i][j] * H4[a][b] as i64;
                        }
                    }
                }
            }
            h = k;
        }
        h
    }

    #[test]
    #[allow(clippy::needless_range_loop)] // matrix indices read as the formula
    fn h4_is_symmetric_orthogonal_and_an_involution_up_to_4() {
        for i in 0..4 {
            for j in 0..4 {
                assert_eq!(H4[i][j], H4[j][i]);
                let dot: i32 = (0..4).map(|k| H4[i][k] as i32 * H4[k][j] as i32).sum();
                assert_eq!(dot, if i == j { 4 } else { 0 });
            }
        }
    }

    #[test]
    #[allow(clippy::needless_range_loop)] // matrix indices read as the formula
    fn fast_transform_equals_the_dense_kronecker_product() {
        for n in [4usize, 16, 64, 256] {
            let h = dense(n);
            // Symmetric and H·H = n·I for the dense matrix too.
            for i in 0..n {
                for j in 0..n {
                    assert_eq!(h[i][j], h[j][i]);
                }
            }
            let x: Vec<f64> = (0..n).map(|i| ((i * 37 + 11) % 17) as f64 - 8.0).collect();
            let mut v = x.clone();
            transform(&mut v).unwrap();
            let scale = (n as f64).sqrt();
            for (i, row) in h.iter().enumerate() {
                let want: f64 =
                    row.iter().zip(&x).map(|(&a, &b)| a as f64 * b).sum::<f64>() / scale;
                assert_eq!(v[i], want, "n={n} i={i}");
            }
            // An involution: applying it twice gives the input back exactly (integers here).
            transform(&mut v).unwrap();
            assert_eq!(v, x);
            // The integer pass is the same sums, unnormalized.
            let mut k: Vec<i64> = x.iter().map(|&a| a as i64).collect();
            let m = butterflies_i64(&mut k).unwrap();
            let mut again = x.clone();
            transform(&mut again).unwrap();
            for (a, b) in k.iter().zip(&again) {
                assert_eq!(*a as f64 / f64::from(1u32 << m), *b);
            }
        }
    }

    #[test]
    fn group_sizes() {
        assert_eq!(log4(256), Ok(4));
        assert_eq!(log4(4), Ok(1));
        for bad in [0usize, 1, 2, 8, 32, 128, 255, 512] {
            assert_eq!(log4(bad), Err(CodecError::GroupSize(bad)));
        }
        let mut v = vec![0f64; 8];
        assert!(transform(&mut v).is_err());
        assert!(rotate_rows_f32(&[0.0; 12], 12, 4).is_ok());
        assert!(matches!(
            rotate_rows_f32(&[0.0; 12], 6, 4),
            Err(CodecError::NotDivisible { .. })
        ));
        assert!(matches!(
            rotate_rows_f32(&[0.0; 12], 12, 8),
            Err(CodecError::GroupSize(8))
        ));
    }

    #[test]
    fn rotating_twice_is_close_to_identity() {
        let cols = 512;
        let w: Vec<f32> = (0..2 * cols)
            .map(|i| ((i as f32) * 0.37).sin() * 0.05)
            .collect();
        let r = rotate_rows_f32(&w, cols, 256).unwrap();
        // The inverse is the same map (H symmetric, H·H = I).
        let back = rotate_rows_f32(&r, cols, 256).unwrap();
        for (a, b) in w.iter().zip(&back) {
            assert!((a - b).abs() <= 1e-8, "{a} {b}");
        }
    }
}
