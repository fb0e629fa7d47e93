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

/// Headroom bits of [`rotate_group_exact`]'s integers: values below `2^(top - EXACT_SPAN)`
/// of a group's largest (`top` its leading bit) cannot share one `i128` with it.
pub const EXACT_SPAN: i32 = 126 - 8 - 1;

/// The exact rotation of one group of 256 (or any `4^m ≤ 256`) f32 values: `out[j] · 2^e =
/// (v·H)[j]` exactly, returned `e`. Every value is written as an integer multiple of the
/// group's smallest set bit, the ±1 butterflies are summed in `i128` and `/2^m` goes into
/// the exponent: no rounding anywhere. Refused (`Unrepresentable`): a group whose nonzero
/// magnitudes span more than [`EXACT_SPAN`] bits (a subnormal beside an O(1) value), which
/// one `i128` cannot hold; an all-zero group gives zeros and `e = 0`.
pub fn rotate_group_exact(v: &[f32], out: &mut [i128]) -> Result<i32, CodecError> {
    let m = log4(v.len())?;
    if m > 4 {
        return Err(CodecError::GroupSize(v.len()));
    }
    super::check_len("exact rotation output", v.len(), out.len())?;
    // (integer mantissa, exponent of its unit) of a finite f32
    let parts = |x: f32| -> (i64, i32) {
        let b = x.to_bits();
        let (exp, man) = ((b >> 23) & 0xFF, i64::from(b & 0x7F_FFFF));
        let (man, e) = if exp == 0 {
            (man, -149)
        } else {
            (man | 0x80_0000, exp as i32 - 150)
        };
        (if b >> 31 == 1 { -man } else { man }, e)
    };
    let (mut low, mut top) = (i32::MAX, i32::MIN);
    for &x in v.iter().filter(|x| **x != 0.0) {
        let (man, e) = parts(x);
        low = low.min(e + man.trailing_zeros() as i32);
        top = top.max(e + 63 - man.unsigned_abs().leading_zeros() as i32);
    }
    if low == i32::MAX {
        out.fill(0);
        return Ok(0);
    }
    if top - low > EXACT_SPAN {
        return Err(CodecError::Unrepresentable(format!(
            "a ConvRot group whose nonzero magnitudes span 2^{low}..2^{top}: more than the \
             2^{EXACT_SPAN} wanbake rotates exactly"
        )));
    }
    for (o, &x) in out.iter_mut().zip(v) {
        let (man, e) = parts(x);
        // e - low < 0 only where the mantissa's low bits are zero: exact either way
        let man = i128::from(man);
        *o = match e - low {
            _ if x == 0.0 => 0,
            sh if sh >= 0 => man << sh,
            sh => man >> -sh,
        };
    }
    butterflies(out);
    Ok(low - m as i32) // H = H4^{⊗m} / 2^m
}

/// `a · 2^e` rounded once to f32 (nearest, ties to even; subnormals and overflow to ±inf as
/// IEEE rounds them).
pub fn exact_to_f32(a: i128, e: i32) -> f32 {
    if a == 0 {
        return 0.0;
    }
    let mag = a.unsigned_abs();
    let bits = 128 - mag.leading_zeros() as i32;
    let lead = bits - 1 + e; // exponent of the leading bit
    let f = if lead > 127 {
        f32::INFINITY
    } else if lead < -150 {
        0.0
    } else {
        let precision = 24 - (-126 - lead).max(0); // 0..=24 significant bits
        let shift = bits - precision;
        let q = if shift <= 0 {
            mag << -shift
        } else {
            // shift ≤ 128 (precision ≥ 0, bits ≤ 128)
            let q = mag.checked_shr(shift as u32).unwrap_or(0);
            let rest = mag - q.checked_shl(shift as u32).unwrap_or(0);
            let half = 1u128 << (shift - 1);
            q + u128::from(rest > half || (rest == half && q & 1 == 1))
        };
        // q ≤ 2^24 and q·2^(e+shift) is an f32 by construction: exact in f64, then in f32
        let k = e + shift;
        (q as f64 * f64::from_bits(((1023 + k) as u64) << 52)) as f32
    };
    if a < 0 { -f } else { f }
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

    #[test]
    fn exact_rotation_and_rounding() {
        // f32 rounding of a·2^e: ties to even, subnormals, zero, overflow
        assert_eq!(exact_to_f32(3, -1), 1.5);
        assert_eq!(exact_to_f32(-(1 << 24) - 1, 0), -16777216.0, "tie to even");
        assert_eq!(
            exact_to_f32((1 << 24) + 3, 0),
            16777220.0,
            "tie to even (up)"
        );
        assert_eq!(exact_to_f32(1, -149), f32::from_bits(1));
        assert_eq!(
            exact_to_f32(1, -150),
            0.0,
            "half the smallest subnormal: even"
        );
        assert_eq!(exact_to_f32(3, -151), f32::from_bits(1), "above half");
        assert_eq!(exact_to_f32(3, -150), f32::from_bits(2), "1.5 ulp: even");
        assert_eq!(exact_to_f32(1, 128), f32::INFINITY);
        assert_eq!(exact_to_f32(0, 9), 0.0);
        // against the f64 transform where f64 is exact
        let mut rng = crate::rng::SplitMix64::new(7);
        let v: Vec<f32> = (0..256).map(|_| rng.signed_f32()).collect();
        let mut a = vec![0i128; 256];
        let e = rotate_group_exact(&v, &mut a).unwrap();
        let mut x: Vec<f64> = v.iter().map(|&y| y.into()).collect();
        transform(&mut x).unwrap();
        for (&ai, &xi) in a.iter().zip(&x) {
            assert_eq!(exact_to_f32(ai, e), xi as f32);
        }
        // a span too wide for one i128 is refused; an all-zero group is zeros
        let mut wide = vec![0f32; 256];
        (wide[0], wide[1]) = (1.0, f32::from_bits(1));
        assert!(rotate_group_exact(&wide, &mut a).is_err());
        assert_eq!(rotate_group_exact(&[0.0; 16], &mut a[..16]), Ok(0));
    }
}
