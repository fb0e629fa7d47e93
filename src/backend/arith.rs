//! The element arithmetic of every kernel in `kernels/`, as host functions.
//!
//! Owns: one Rust function per device function or per-element kernel body, written as the
//! same sequence of integer and IEEE operations, in the same order, and [`ColumnSums`], the
//! column-sum loop of the column factors. The CPU backend ([`super::CpuBackend`]) and the
//! band route (`merge::math`) compute with these, and the tests check the conversions bit
//! for bit against `codec::dtype` (over all 65 536 bf16/f16 patterns and a sweep of f32
//! patterns: ties, subnormals, NaN, ±inf, max finite), so the kernels, this file and the I/O
//! core agree by construction. Does not own: the reductions (`linalg::norms` is the
//! reference for the norm kernels), the GEMMs, or which factors a form applies
//! (`merge::math::Step`).
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

/// f32 bits → bf16 bits with round-to-nearest-even (`narrow_bits_bf16`): the kernel's
/// integer sequence is `codec::dtype::round_to_bf16`'s, so this is that function (NaN keeps sign
/// and top payload bits and gains the quiet bit).
#[inline(always)]
pub fn narrow_bits_bf16(b: u32) -> u16 {
    crate::codec::dtype::round_to_bf16(f32::from_bits(b))
}

/// f32 bits → IEEE half bits with round-to-nearest-even (`narrow_bits_f16`): subnormal
/// results, overflow to infinity; NaN keeps sign and the top ten payload bits and gains the
/// quiet bit 0x0200 (what `half::f16::from_f32` does in software and with F16C).
///
/// The kernel's own integer algorithm (CUDA C has no `half` crate), mirrored here so the
/// tests can hold it to `codec::dtype::round_to_f16` for every f32; the host computes with
/// `codec::dtype::round_to_f16` itself ([`add_narrow_f16`], the CPU backend).
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
    crate::codec::dtype::round_to_f16(f32::from_bits(sum_bits(base, delta)))
}

/// `base + delta` as f32 bits (`add_narrow_f32`).
#[inline(always)]
pub fn add_narrow_f32(base: f32, delta: f32) -> u32 {
    sum_bits(base, delta)
}

/// `sqrt(Σ x²)` with the squares summed in f64 in iteration order (the `row_root` of
/// `kernels/norms.cu`).
pub fn root_sum_squares(values: impl Iterator<Item = f32>) -> f64 {
    values
        .fold(0.0f64, |acc, x| {
            let x = f64::from(x);
            acc + x * x
        })
        .sqrt()
}

/// The L2 norm as `row_norms_f32` / `col_norms_f32` compute it: [`root_sum_squares`] rounded
/// once to f32 (what `linalg::norms` does).
pub fn norm_in_order(values: impl Iterator<Item = f32>) -> f32 {
    root_sum_squares(values) as f32
}

/// A DoRA/BoRA factor from its norm, `m / (norm + ε)` in f64: a row factor α (`row_scale`)
/// or a column factor β (`col_scale`).
#[inline(always)]
pub fn magnitude_scale(norm: f64, m: f32, eps: f64) -> f64 {
    f64::from(m) / (norm + eps)
}

/// One row factor of DoRA/BoRA, `α = m / (‖row‖ + ε)` in f64 (`row_scales_f32`).
pub fn row_scale(row: &[f32], m: f32, eps: f64) -> f64 {
    magnitude_scale(root_sum_squares(row.iter().copied()), m, eps)
}

/// One term of a column factor's sum, `(α·x)²` with `h = α·x` rounded in f64 before
/// squaring. dora-cols passes α = 1 (exact).
#[inline(always)]
pub fn scaled_square(alpha: f64, x: f32) -> f64 {
    let h = alpha * f64::from(x);
    h * h
}

/// One column factor, `β = m / (sqrt(Σ_i (α_i·x_i)²) + ε)` in f64, the terms
/// [`scaled_square`] summed over rows in order (`col_scales_f32`), for one column on its own;
/// the merge routes sum all columns at once with [`ColumnSums`], the same additions.
pub fn col_scale(column: impl Iterator<Item = (f64, f32)>, m: f32, eps: f64) -> f64 {
    let sum = column.fold(0.0f64, |acc, (alpha, x)| acc + scaled_square(alpha, x));
    magnitude_scale(sum.sqrt(), m, eps)
}

/// The column sums of column factors, `Σ_i (α_i·x_ij)²` for every column j ([`scaled_square`]
/// terms), fed whole rows in row order, then turned into `β_j = m_j / (sqrt(sum_j) + ε)`
/// ([`magnitude_scale`]): the loop of `col_scales_f32` with rows outside and columns inside,
/// so each column's sum sees the same additions in the same order whether the rows come all
/// at once ([`super::CpuBackend`]'s `col_scales`) or band by band (`merge::math::column_scales`).
#[derive(Clone, Debug)]
pub struct ColumnSums(Vec<f64>);

impl ColumnSums {
    /// Empty sums for `cols` columns.
    pub fn new(cols: usize) -> ColumnSums {
        ColumnSums(vec![0.0; cols])
    }

    /// Adds the terms of `rows` (whole rows, row-major), row `i` of them scaled by
    /// `alpha(i, row)` (1 for dora-cols, the row factor for BoRA).
    ///
    /// # Panics
    /// If `rows` does not hold whole rows.
    #[track_caller]
    pub fn add_rows(&mut self, rows: &[f32], mut alpha: impl FnMut(usize, &[f32]) -> f64) {
        let cols = self.0.len();
        if cols == 0 {
            return;
        }
        assert_eq!(rows.len() % cols, 0, "column sums: a partial row");
        for (i, row) in rows.chunks_exact(cols).enumerate() {
            let a = alpha(i, row);
            for (s, &x) in self.0.iter_mut().zip(row) {
                *s += scaled_square(a, x);
            }
        }
    }

    /// The column factors `β_j = m_j / (sqrt(sum_j) + ε)` of the rows added so far.
    pub fn scales(&self, m: &[f32], eps: f64) -> Vec<f64> {
        self.0
            .iter()
            .zip(m)
            .map(|(s, &m)| magnitude_scale(s.sqrt(), m, eps))
            .collect()
    }
}

/// One element of a DoRA/BoRA contribution, `d + f32(w·(β·(α·v) − w0))`: the combination in
/// f64, rounded once, added in f32 (`accumulate_normalised_f32`;
/// `merge::math::add_contribution`). A missing α or β is 1 (exact).
#[inline(always)]
pub fn normalised_contribution(d: f32, w: f64, v: f32, w0: f32, alpha: f64, beta: f64) -> f32 {
    let f = beta * (alpha * f64::from(v));
    d + (w * (f - f64::from(w0))) as f32
}

/// One element of a full-tensor diff, `d + f32(coef·x)` (`accumulate_scaled_f32`).
#[inline(always)]
pub fn scaled_contribution(d: f32, coef: f64, x: f32) -> f32 {
    d + (coef * f64::from(x)) as f32
}
