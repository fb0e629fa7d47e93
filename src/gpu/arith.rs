//! The element arithmetic of every kernel in `kernels/`, as host functions.
//!
//! Owns: one Rust function per device function or per-element kernel body, written as the
//! same sequence of integer and IEEE operations, in the same order. The CPU backend
//! ([`super::CpuBackend`]) computes with these functions, and the tests check them bit for
//! bit against `io::dtype` (over all 65 536 bf16/f16 patterns and a sweep of f32 patterns:
//! ties, subnormals, NaN, ±inf, max finite), so the kernels, this file and the I/O core agree
//! by construction. Does not own: the reductions (`linalg::norms` is the reference for the
//! norm kernels) or the GEMMs.
//!
//! Rust never contracts `a * b + c` into a fused multiply-add, and the kernels are compiled
//! with `--fmad=false` and use `_rn` intrinsics, so each operation is rounded once on both
//! sides.

/// True for every NaN bit pattern of an f32 (either sign, quiet or signalling).
#[inline(always)]
pub fn is_nan_bits(b: u32) -> bool {
    (b & 0x7FFF_FFFF) > 0x7F80_0000
}

/// bf16 bits → f32 bits: a shift; NaN payloads are kept as they are (`widen_bits_bf16`).
#[inline(always)]
pub fn widen_bits_bf16(h: u16) -> u32 {
    u32::from(h) << 16
}

/// IEEE half bits → f32 bits, exact; NaN keeps sign and payload and gains the quiet bit
/// (`widen_bits_f16`; the same as `half::f16::to_f32` and the F16C instruction).
#[inline]
pub fn widen_bits_f16(h: u16) -> u32 {
    let sign = u32::from(h & 0x8000) << 16;
    let exp = u32::from(h & 0x7C00);
    let man = u32::from(h & 0x03FF);
    if h & 0x7FFF == 0 {
        return sign;
    }
    if exp == 0x7C00 {
        return if man == 0 {
            sign | 0x7F80_0000
        } else {
            sign | 0x7FC0_0000 | (man << 13)
        };
    }
    if exp == 0 {
        // Subnormal: normalise. `man.leading_zeros()` of the u32 is the kernel's __clz.
        let e = man.leading_zeros() - 16 - 6;
        return sign | ((127 - 15 - e) << 23) | ((man << (14 + e)) & 0x007F_FFFF);
    }
    sign | (((exp >> 10) + 127 - 15) << 23) | (man << 13)
}

/// f32 bits → bf16 bits with round-to-nearest-even (`narrow_bits_bf16`): the formula of
/// `io::dtype::round_to_bf16`; NaN keeps sign and top payload bits and gains the quiet bit.
#[inline(always)]
pub fn narrow_bits_bf16(b: u32) -> u16 {
    if is_nan_bits(b) {
        return ((b >> 16) | 0x0040) as u16;
    }
    (b.wrapping_add(0x7FFF + ((b >> 16) & 1)) >> 16) as u16
}

/// f32 bits → IEEE half bits with round-to-nearest-even (`narrow_bits_f16`): subnormal
/// results, overflow to infinity; NaN keeps sign and the top ten payload bits and gains the
/// quiet bit 0x0200 (what `half::f16::from_f32` does in software and with F16C).
#[inline]
pub fn narrow_bits_f16(x: u32) -> u16 {
    let sign = x & 0x8000_0000;
    let exp = x & 0x7F80_0000;
    let man = x & 0x007F_FFFF;
    if exp == 0x7F80_0000 {
        let nan_bit = if man == 0 { 0 } else { 0x0200 };
        return ((sign >> 16) | 0x7C00 | nan_bit | (man >> 13)) as u16;
    }
    let half_sign = sign >> 16;
    let half_exp = (exp >> 23) as i32 - 127 + 15;
    if half_exp >= 0x1F {
        return (half_sign | 0x7C00) as u16;
    }
    if half_exp <= 0 {
        if 14 - half_exp > 24 {
            return half_sign as u16;
        }
        let m = man | 0x0080_0000;
        let mut half_man = m >> (14 - half_exp);
        let round_bit = 1u32 << (13 - half_exp);
        if m & round_bit != 0 && m & (3 * round_bit - 1) != 0 {
            half_man += 1;
        }
        return (half_sign | half_man) as u16;
    }
    let mut bits = half_sign | ((half_exp as u32) << 10) | (man >> 13);
    let round_bit = 0x0000_1000;
    if man & round_bit != 0 && man & (3 * round_bit - 1) != 0 {
        bits += 1;
    }
    bits as u16
}

/// The canonical NaN a computed NaN becomes in [`sum_bits`]: positive, quiet, no payload.
pub const CANONICAL_NAN_BITS: u32 = 0x7FC0_0000;

/// The f32 bits of `base + delta` under wanbake's NaN rule (`sum_bits`), the value the final
/// rounding of a merge sees:
/// * a NaN `base` passes through with its bits (an untouched NaN weight keeps them);
/// * otherwise a NaN sum (a NaN `delta`, or `inf + -inf`) becomes [`CANONICAL_NAN_BITS`],
///   because the payload and sign of a computed NaN differ between x86, ARM and NVIDIA GPUs
///   (and Rust does not specify them), and output bytes must not;
/// * otherwise one IEEE f32 addition.
#[inline(always)]
pub fn sum_bits(base: f32, delta: f32) -> u32 {
    let b = base.to_bits();
    if is_nan_bits(b) {
        return b;
    }
    let s = (base + delta).to_bits();
    if is_nan_bits(s) {
        CANONICAL_NAN_BITS
    } else {
        s
    }
}

/// `RNE_bf16(base + delta)` (`add_narrow_bf16`).
#[inline(always)]
pub fn add_narrow_bf16(base: f32, delta: f32) -> u16 {
    narrow_bits_bf16(sum_bits(base, delta))
}

/// `RNE_f16(base + delta)` (`add_narrow_f16`).
#[inline(always)]
pub fn add_narrow_f16(base: f32, delta: f32) -> u16 {
    narrow_bits_f16(sum_bits(base, delta))
}

/// `base + delta` as f32 bits (`add_narrow_f32`).
#[inline(always)]
pub fn add_narrow_f32(base: f32, delta: f32) -> u32 {
    sum_bits(base, delta)
}

/// DoRA's per-row (or per-column) factor `m / (‖V‖ + ε)` (`magnitude_ratio_f32`).
#[inline(always)]
pub fn magnitude_ratio(m: f32, norm: f32, eps: f32) -> f32 {
    m / (norm + eps)
}

/// One element of a row or column scaling, `c · x` (`scale_rows_f32`, `scale_cols_f32`).
#[inline(always)]
pub fn scaled(c: f32, x: f32) -> f32 {
    c * x
}

/// One element of summing a contribution, `d + a·(x − w0)` (`accumulate_difference_f32`).
#[inline(always)]
pub fn accumulate_difference(d: f32, a: f32, x: f32, w0: f32) -> f32 {
    d + a * (x - w0)
}

/// The L2 norm of `values` as the norm kernels compute it: squares of the f64-widened values
/// summed in f64 in iteration order, root in f64, one rounding to f32 (`row_norms_f32`,
/// `col_norms_f32`; `linalg::norms` does the same).
pub fn norm_in_order(values: impl Iterator<Item = f32>) -> f32 {
    let sum = values.fold(0.0f64, |acc, x| {
        let x = f64::from(x);
        acc + x * x
    });
    sum.sqrt() as f32
}
