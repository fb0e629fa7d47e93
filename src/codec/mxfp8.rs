//! The E8M0 (`float8_e8m0fnu`) element code, comfy-kitchen's MXFP8 layout built from it and
//! E4M3 (`codec::fp8`), and LightX2V's per-channel fp8.
//!
//! Owns: E8M0 in both directions (as comfy-kitchen's helpers compute it), the MXFP8 decoder
//! and encoder, their size facts, and LightX2V's per-channel fp8 (decoder and encoder). Does not own: the
//! E4M3 cast (`fp8`, the one copy), the swizzle (`blocked`), or which tensors carry which
//! part (`quant/`).
//!
//! References (comfy-kitchen 0.2.40 wheel):
//! - `backends/eager/quantization.py`, `dequantize_mxfp8`: `qx.to(float32)` per block of 32
//!   along K, times `e8m0_to_f32(from_blocked(scales.view(uint8), rows, cols // 32))`, in that
//!   order, then `.to(output_type)` (a no-op for float32). `rows, cols` are the *stored* shape.
//! - `float_utils.py`, `e8m0_to_f32`: byte `e` → f32 bits `e << 23`, except byte 0 → 0.0.
//!   So 1..=254 decode to `2^(e-127)`, 0 decodes to **zero** (not 2^-127), and 255 decodes to
//!   **+inf** (not NaN as in the OCP MX spec).
//! - `backends/eager/quantization.py`, `quantize_mxfp8` (called by
//!   `tensor/mxfp8.py` `TensorCoreMXFP8Layout.quantize` with `pad_32x` when a dimension is not a
//!   multiple of 32): pad rows and columns to multiples of 32 with zeros; per block
//!   `max_abs / 448`, clamped below at `2^-127`, `exp = clamp(ceil(log2(·)) + 127, 0, 254)`;
//!   divide by `e8m0_to_f32(exp)` (1.0 for an all-zero block, whose codes are forced to 0 and
//!   whose byte is 0), clamp to ±448, cast to e4m3fn; store `to_blocked(exp bytes)`.
//! - `tensor/mxfp8.py`, `get_padded_shape` / `get_logical_shape_from_storage`: storage keeps the
//!   padded `[roundup(N,32), roundup(K,32)]`; the logical shape is not in the file (see
//!   [`decode_into`]).
//! - ComfyUI `comfy/ops.py`, `_load_quantized_module`: the scale is read with
//!   `.view(float8_e8m0fnu)`, so U8 and F8_E8M0 storage are the same bytes.
//!
//! E4M3 facts (torch `c10/util/Float8_e4m3fn.h`): bias 7, no infinities, `0x7f`/`0xff` are NaN
//! (decoded with bits `sign | 0x7ff00000`, as c10's `fp8e4m3fn_to_fp32_value` does), largest
//! finite 448, subnormal step 2^-9. The encoder rounds to nearest even.

use super::blocked::{blocked_len, from_blocked, to_blocked};
use super::fp8::{E4M3_MAX, e4m3fn_to_f32, f32_to_e4m3fn, round_e4m3_qtorch};
use super::{CodecError, check_finite, check_len, check_multiple, mul, round_up};

/// MXFP8 block size along K.
pub const BLOCK: usize = 32;
/// The E8M0 exponent bias.
pub const E8M0_BIAS: i32 = 127;

/// comfy-kitchen's `e8m0_to_f32` of one scale byte: 0 → 0.0, 255 → +inf, else `2^(e-127)`.
#[inline]
pub fn e8m0_to_f32(e: u8) -> f32 {
    if e == 0 {
        0.0
    } else {
        f32::from_bits(u32::from(e) << 23)
    }
}

/// The stored (padded) `[rows, cols]` of a logical `[n, k]` MXFP8 weight.
pub fn stored_shape(n: usize, k: usize) -> Result<[usize; 2], CodecError> {
    Ok([
        round_up(n, BLOCK, "MXFP8 rows")?,
        round_up(k, BLOCK, "MXFP8 columns")?,
    ])
}

/// Bytes of the stored F8_E4M3 weight of a logical `[n, k]` weight (padded, one byte each).
pub fn storage_bytes(n: usize, k: usize) -> Option<usize> {
    let [r, c] = stored_shape(n, k).ok()?;
    r.checked_mul(c)
}

/// Bytes of the swizzled E8M0 block scales of a logical `[n, k]` weight.
pub fn scale_bytes(n: usize, k: usize) -> Option<usize> {
    let [r, c] = stored_shape(n, k).ok()?;
    blocked_len(r, c / BLOCK).ok()
}

fn check_shapes(
    codes: &[u8],
    scales: &[u8],
    stored: [usize; 2],
    logical: [usize; 2],
) -> Result<usize, CodecError> {
    let [rows, cols] = stored;
    check_multiple("MXFP8 stored columns", cols, BLOCK)?;
    check_len(
        "MXFP8 weight",
        mul(rows, cols, "MXFP8 weight size")?,
        codes.len(),
    )?;
    check_len(
        "MXFP8 block scales",
        blocked_len(rows, cols / BLOCK)?,
        scales.len(),
    )?;
    if logical[0] > rows || logical[1] > cols {
        return Err(CodecError::Shape { logical, stored });
    }
    mul(logical[0], logical[1], "MXFP8 logical size")
}

/// Decodes an MXFP8 weight into `out` (row-major `logical`), as comfy-kitchen's
/// `dequantize_mxfp8(qx, scales, float32)` followed by `QuantizedTensor.dequantize`'s crop to
/// `orig_shape`.
///
/// `codes` is the stored F8_E4M3 weight of shape `stored = [rows, cols]` (`cols` a multiple of
/// 32), `scales` the stored swizzled E8M0 bytes (`128·⌈rows/128⌉ · 4·⌈(cols/32)/4⌉` of them).
/// `logical` is the layer's `[out_features, in_features]`: ComfyUI takes it from the model
/// (`Linear._orig_shape`), never from the file, which holds only the padded storage; pass
/// `logical = stored` when the model's shape is not known (for multiples of 32 they agree).
pub fn decode_into(
    codes: &[u8],
    scales: &[u8],
    stored: [usize; 2],
    logical: [usize; 2],
    out: &mut [f32],
) -> Result<(), CodecError> {
    let n = check_shapes(codes, scales, stored, logical)?;
    check_len("MXFP8 output", n, out.len())?;
    let [rows, cols] = stored;
    let s = from_blocked(scales, rows, cols / BLOCK)?;
    let nb = cols / BLOCK;
    let [lr, lc] = logical;
    if lc == 0 {
        return Ok(());
    }
    crate::codec::dtype::vectorized(
        #[inline(always)]
        || {
            let rows = out.chunks_exact_mut(lc).zip(codes.chunks_exact(cols));
            for ((orow, qrow), srow) in rows.take(lr).zip(s.chunks_exact(nb)) {
                let blocks = orow.chunks_mut(BLOCK).zip(qrow.chunks_exact(BLOCK));
                for ((o, q), &e) in blocks.zip(srow) {
                    let scale = e8m0_to_f32(e);
                    for (o, &q) in o.iter_mut().zip(q) {
                        *o = e4m3fn_to_f32(q) * scale;
                    }
                }
            }
        },
    );
    Ok(())
}

/// [`decode_into`] into a new buffer.
pub fn decode(
    codes: &[u8],
    scales: &[u8],
    stored: [usize; 2],
    logical: [usize; 2],
) -> Result<Vec<f32>, CodecError> {
    let n = check_shapes(codes, scales, stored, logical)?;
    let mut out = vec![0f32; n];
    decode_into(codes, scales, stored, logical, &mut out)?;
    Ok(out)
}

/// An encoded MXFP8 weight: what comfy-kitchen stores as the weight and its block scales.
#[derive(Clone, Debug, PartialEq)]
pub struct Mxfp8 {
    /// F8_E4M3 codes, row-major `stored`.
    pub codes: Vec<u8>,
    /// E8M0 block-scale bytes in the swizzled layout.
    pub scales: Vec<u8>,
    /// The stored (padded) `[rows, cols]`.
    pub stored: [usize; 2],
    /// The swizzled scale matrix's `[rows, cols]` (the block scales' tensor shape).
    pub scale_shape: [usize; 2],
}

/// The E8M0 exponent byte `quantize_mxfp8` picks for a block whose `max|x|` is `max_abs`:
/// `clamp(ceil(log2(max(max_abs / 448, 2^-127))) + 127, 0, 254)`, with the division in f32 and
/// `log2` the correctly rounded f32 one (torch's vectorized `log2` is within an ulp of it; the
/// two can differ only when `max_abs / 448` lies within an f32 ulp of `log2` of a power of two).
///
/// Read from the bits where that is exact: `needed = (1 + m/2^23)·2^E` has `log2 = E` when
/// `m = 0`, and when `m ≥ 2^10` its `log2 − E ≥ log2(1 + 2^−13) > 1.7·10^−4` is more than
/// half an f32 ulp of any `|E| < 128` (at most 2^−17), so the rounded log2 lies above `E`
/// and its ceiling is `E + 1`. Only a mantissa just above a power of two (or a subnormal)
/// takes the logarithm ([`exponent_by_log2`]).
#[inline(always)]
pub fn exponent_for(max_abs: f32) -> u8 {
    let needed = (max_abs / E4M3_MAX).max(f32::from_bits(0x0040_0000)); // 2^-127
    let bits = needed.to_bits();
    let (biased, m) = (bits >> 23, bits & 0x7F_FFFF);
    match (biased, m) {
        (1.., 0) => biased.min(254) as u8,
        (1.., 1024..) => (biased + 1).min(254) as u8,
        _ => exponent_by_log2(needed),
    }
}

/// [`exponent_for`] of a clamped `needed = max(max_abs / 448, 2^-127)` through the logarithm.
fn exponent_by_log2(needed: f32) -> u8 {
    let l = (f64::from(needed).log2() as f32).ceil();
    (l as i32 + E8M0_BIAS).clamp(0, 254) as u8
}

/// Quantizes a row-major `[n, k]` f32 weight as comfy-kitchen's `TensorCoreMXFP8Layout.quantize`
/// does (eager `quantize_mxfp8`, padding to 32 when needed).
///
/// Refused, where comfy-kitchen writes unusable codes: non-finite values, and a non-zero block
/// whose `max|x| / 448 <= 2^-127` (its exponent byte is 0, which decodes to a zero scale, so
/// the reference divides by zero and stores ±448 and NaN codes).
pub fn encode(w: &[f32], n: usize, k: usize) -> Result<Mxfp8, CodecError> {
    check_len("MXFP8 input", mul(n, k, "MXFP8 input size")?, w.len())?;
    check_finite(w)?;
    let [rows, cols] = stored_shape(n, k)?;
    let nb = cols / BLOCK;
    let mut codes = vec![0u8; mul(rows, cols, "MXFP8 weight size")?];
    let mut exps = vec![0u8; mul(rows, nb, "MXFP8 scale size")?];
    // Rows past `n` (padding) keep zero codes and bytes, as do all-zero blocks.
    let refused = match k {
        0 => None,
        _ => crate::codec::dtype::vectorized(
            #[inline(always)]
            || {
                let rows = w.chunks_exact(k).zip(codes.chunks_exact_mut(cols));
                for (r, ((row, out), exps)) in rows.zip(exps.chunks_exact_mut(nb)).enumerate() {
                    let blocks = out.chunks_exact_mut(BLOCK).zip(exps.iter_mut());
                    for (b, (out, e)) in blocks.enumerate() {
                        let from = b * BLOCK;
                        let mut padded = [0f32; BLOCK];
                        let block = match row[from..].first_chunk::<BLOCK>() {
                            Some(block) => block,
                            None => {
                                padded[..k - from].copy_from_slice(&row[from..]);
                                &padded
                            }
                        };
                        *e = encode_block(block, out).map_err(|max_abs| (r, b, max_abs))?;
                    }
                }
                Ok(())
            },
        )
        .err(),
    };
    if let Some((r, b, max_abs)) = refused {
        return Err(CodecError::Unrepresentable(format!(
            "MXFP8 block (row {r}, block {b}): max |x| = {max_abs:e} is below 448·2^-127; \
             comfy-kitchen gives it a zero scale and divides by it"
        )));
    }
    let scales = to_blocked(&exps, rows, nb)?;
    let scale_shape = super::blocked::blocked_shape(rows, nb)?;
    Ok(Mxfp8 {
        codes,
        scales,
        stored: [rows, cols],
        scale_shape,
    })
}

/// One block of 32: its codes into `out` and its exponent byte (0 with zero codes for an
/// all-zero block), or the block's `max|x|` when its exponent byte would be 0.
#[inline(always)]
fn encode_block(block: &[f32; BLOCK], out: &mut [u8]) -> Result<u8, f32> {
    let max_abs = super::fp8::amax_in_lanes(block);
    if max_abs == 0.0 {
        return Ok(0);
    }
    let e = exponent_for(max_abs);
    if e == 0 {
        return Err(max_abs);
    }
    // `x / 2^s` and `x · 2^−s` are the same real number rounded once (2^−s is exact down to
    // 2^−127), so the product gives the reference's quotient.
    let inv = 1.0 / e8m0_to_f32(e);
    for (o, &x) in out.iter_mut().zip(block) {
        *o = f32_to_e4m3fn((x * inv).clamp(-E4M3_MAX, E4M3_MAX));
    }
    Ok(e)
}

/// LightX2V's `QuantWeightFP8.load_fp8_weight` (ModelTC/LightX2V @f8aee98
/// `tools/convert/quant/quant.py`) on a row-major `[rows, cols]` f32 weight: per row
/// `scale = max(max|W|, 1e-5) / 448`, then `clip(W / scale, ±448)` rounded by qtorch's
/// `float_quantize` ([`round_e4m3_qtorch`]: ties away from zero, never -0) and cast exactly
/// to e4m3fn. Returns the codes and the `rows` scales (stored `[rows, 1]`).
pub fn encode_fp8_rowwise_lightx2v(
    w: &[f32],
    rows: usize,
    cols: usize,
) -> Result<(Vec<u8>, Vec<f32>), CodecError> {
    check_len("fp8 input", mul(rows, cols, "fp8 input size")?, w.len())?;
    check_finite(w)?;
    let min_amax = super::int8::LIGHTX2V_MIN_AMAX;
    let mut codes = vec![0u8; w.len()];
    let mut scales = vec![min_amax / E4M3_MAX; rows];
    if cols == 0 {
        return Ok((codes, scales));
    }
    crate::codec::dtype::vectorized(
        #[inline(always)]
        || {
            let rows_iter = w.chunks_exact(cols).zip(codes.chunks_exact_mut(cols));
            for ((row, out), s) in rows_iter.zip(&mut scales) {
                *s = super::fp8::amax_in_lanes(row).max(min_amax) / E4M3_MAX;
                for (o, &x) in out.iter_mut().zip(row) {
                    *o = f32_to_e4m3fn(round_e4m3_qtorch((x / *s).clamp(-E4M3_MAX, E4M3_MAX)));
                }
            }
        },
    );
    Ok((codes, scales))
}

/// LightX2V's per-channel fp8 (`dit_quant_scheme` `fp8-*`): `weight` F8_E4M3 `[out, in]` and
/// per-row scale `[out, 1]`, decoded as the loader's torch fallback does
/// (`lightx2v/common/ops/mm/mm_weight.py`, `MMWeightFp8IntelXpu.apply`:
/// `weight.to(dtype) * scale.to(dtype)`, here with dtype float32). `scale` holds the
/// `out` row scales already widened to f32 (the converter writes them in the weight's dtype:
/// f32, or bf16 for a bf16 source; widening is exact).
pub fn decode_fp8_rowwise_into(
    codes: &[u8],
    scale: &[f32],
    rows: usize,
    cols: usize,
    out: &mut [f32],
) -> Result<(), CodecError> {
    let n = mul(rows, cols, "fp8 weight size")?;
    check_len("fp8 weight", n, codes.len())?;
    check_len("fp8 row scales", rows, scale.len())?;
    check_len("fp8 output", n, out.len())?;
    if cols == 0 {
        return Ok(());
    }
    let rows_iter = out.chunks_exact_mut(cols).zip(codes.chunks_exact(cols));
    crate::codec::dtype::vectorized(
        #[inline(always)]
        || {
            for ((orow, qrow), &s) in rows_iter.zip(scale) {
                for (o, &q) in orow.iter_mut().zip(qrow) {
                    *o = e4m3fn_to_f32(q) * s;
                }
            }
        },
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3_hand_values() {
        assert_eq!(e4m3fn_to_f32(0x00), 0.0);
        assert_eq!(e4m3fn_to_f32(0x80).to_bits(), (-0.0f32).to_bits());
        assert_eq!(e4m3fn_to_f32(0x01), 2f32.powi(-9));
        assert_eq!(e4m3fn_to_f32(0x07), 7.0 * 2f32.powi(-9));
        assert_eq!(e4m3fn_to_f32(0x08), 2f32.powi(-6));
        assert_eq!(e4m3fn_to_f32(0x38), 1.0);
        assert_eq!(e4m3fn_to_f32(0x39), 1.125);
        assert_eq!(e4m3fn_to_f32(0x7E), 448.0);
        assert_eq!(e4m3fn_to_f32(0xFE), -448.0);
        assert_eq!(e4m3fn_to_f32(0x7F).to_bits(), 0x7FF0_0000);
        assert_eq!(e4m3fn_to_f32(0xFF).to_bits(), 0xFFF0_0000);
        // Every non-NaN code round-trips through the encoder.
        for b in 0..=255u8 {
            if b & 0x7F != 0x7F {
                assert_eq!(f32_to_e4m3fn(e4m3fn_to_f32(b)), b, "{b:#x}");
            }
        }
        // Ties to even: 1.0625 lies between 1.0 (even) and 1.125.
        assert_eq!(f32_to_e4m3fn(1.0625), 0x38);
        assert_eq!(f32_to_e4m3fn(1.1875), 0x3A);
        assert_eq!(f32_to_e4m3fn(2f32.powi(-10)), 0x00);
        assert_eq!(f32_to_e4m3fn(3.0 * 2f32.powi(-10)), 0x02);
        assert_eq!(f32_to_e4m3fn(464.0), 0x7E);
        assert_eq!(f32_to_e4m3fn(-1e9), 0xFE);
        assert_eq!(f32_to_e4m3fn(f32::NAN), 0x7F);
    }

    #[test]
    fn e8m0_hand_values() {
        assert_eq!(e8m0_to_f32(127), 1.0);
        assert_eq!(e8m0_to_f32(128), 2.0);
        assert_eq!(e8m0_to_f32(120), 2f32.powi(-7));
        assert_eq!(e8m0_to_f32(1), 2f32.powi(-126));
        assert_eq!(e8m0_to_f32(254), 2f32.powi(127));
        assert_eq!(
            e8m0_to_f32(0),
            0.0,
            "comfy-kitchen: byte 0 is zero, not 2^-127"
        );
        assert_eq!(
            e8m0_to_f32(255),
            f32::INFINITY,
            "comfy-kitchen: byte 255 is +inf"
        );
        assert_eq!(exponent_for(448.0), 127);
        assert_eq!(exponent_for(449.0), 128);
        assert_eq!(exponent_for(224.0), 126);
        assert_eq!(exponent_for(1.0), 127 - 8); // 1/448 -> 2^-8.8 -> ceil -8
        assert_eq!(exponent_for(f32::MAX), 247); // 2^128/448 -> 2^119.2
        assert_eq!(exponent_for(1e-40), 0);
    }

    /// The exponent read from the bits is the logarithm's wherever the fast path answers:
    /// every binade's smallest mantissas (the boundary at 2^10) and a sweep of all the
    /// others. (Checked over every positive finite f32 when the fast path was written.)
    #[test]
    fn exponent_from_bits_is_the_logarithms() {
        let by_log2 = |x: f32| exponent_by_log2((x / E4M3_MAX).max(f32::from_bits(0x0040_0000)));
        let near_powers = (0..255u32).flat_map(|e| (0..2048u32).map(move |m| (e << 23) | m));
        let sweep = (0..0x7F80_0000u32).step_by(4093);
        for bits in near_powers.chain(sweep) {
            // `needed` at this bit pattern, and the inputs on either side of it.
            let needed = f32::from_bits(bits);
            for x in [needed * E4M3_MAX, f32::from_bits(bits)] {
                for x in [
                    x,
                    f32::from_bits(x.to_bits().saturating_sub(1)),
                    f32::from_bits(x.to_bits() + 1),
                ] {
                    if x.is_finite() {
                        assert_eq!(
                            exponent_for(x),
                            by_log2(x),
                            "max_abs bits {:#x}",
                            x.to_bits()
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn decode_hand_example() {
        // 1 x 64 stored, two blocks: scale bytes 127 (x1) and 129 (x4).
        let mut codes = vec![0x38u8; 64]; // 1.0
        codes[33] = 0xC0; // -2.0
        let scales = to_blocked(&[127, 129], 1, 2).unwrap();
        assert_eq!(scales.len(), 128 * 4);
        let out = decode(&codes, &scales, [1, 64], [1, 64]).unwrap();
        assert_eq!(out[0], 1.0);
        assert_eq!(out[31], 1.0);
        assert_eq!(out[32], 4.0);
        assert_eq!(out[33], -8.0);
        // A crop to the logical shape.
        assert_eq!(decode(&codes, &scales, [1, 64], [1, 40]).unwrap().len(), 40);
        assert!(matches!(
            decode(&codes, &scales, [1, 64], [2, 64]),
            Err(CodecError::Shape { .. })
        ));
        assert!(matches!(
            decode(&codes[..63], &scales, [1, 63], [1, 63]),
            Err(CodecError::NotDivisible { .. })
        ));
        assert!(matches!(
            decode(&codes, &scales[1..], [1, 64], [1, 64]),
            Err(CodecError::Length { .. })
        ));
        assert!(matches!(
            decode(&codes, &scales, [usize::MAX, 64], [1, 64]),
            Err(CodecError::Overflow { .. })
        ));
    }

    #[test]
    fn encode_round_trip_and_padding() {
        let (n, k) = (33, 70);
        let w: Vec<f32> = (0..n * k)
            .map(|i| ((i as f32) * 0.731).sin() * (1.0 + (i % 13) as f32))
            .collect();
        let e = encode(&w, n, k).unwrap();
        assert_eq!(e.stored, [64, 96]);
        assert_eq!(e.scale_shape, [128, 4]);
        assert_eq!(Some(e.codes.len()), storage_bytes(n, k));
        assert_eq!(Some(e.scales.len()), scale_bytes(n, k));
        let d = decode(&e.codes, &e.scales, e.stored, [n, k]).unwrap();
        for (i, (&a, &b)) in w.iter().zip(&d).enumerate() {
            // e4m3 has 3 mantissa bits: relative error <= 2^-4 of the block's scale range.
            let blk = &w
                [(i / k) * k + (i % k) / 32 * 32..((i / k) * k + ((i % k) / 32 * 32 + 32).min(k))];
            let m = blk.iter().fold(0f32, |m, x| m.max(x.abs()));
            assert!((a - b).abs() <= m / 16.0 + 1e-30, "{i}: {a} vs {b}");
        }
        // Padding: rows >= n and columns >= k decode to zero.
        let full = decode(&e.codes, &e.scales, e.stored, e.stored).unwrap();
        assert!(full[n * 96..].iter().all(|&x| x == 0.0));
        assert!((0..n).all(|r| full[r * 96 + k..r * 96 + 96].iter().all(|&x| x == 0.0)));
        // Re-encoding the decoded values keeps them (a block whose largest code rounded down
        // to 224 may take the next smaller exponent, with doubled codes).
        let again = encode(&d, n, k).unwrap();
        assert_eq!(
            decode(&again.codes, &again.scales, again.stored, [n, k]).unwrap(),
            d
        );
    }

    #[test]
    fn encode_refusals() {
        assert!(matches!(
            encode(&[f32::NAN; 32], 1, 32),
            Err(CodecError::NonFinite { index: 0, .. })
        ));
        let mut tiny = [0f32; 32];
        tiny[3] = 1e-38;
        assert!(matches!(
            encode(&tiny, 1, 32),
            Err(CodecError::Unrepresentable(_))
        ));
        let z = encode(&[0.0; 32], 1, 32).unwrap();
        assert!(z.codes.iter().chain(&z.scales).all(|&b| b == 0));
        assert!(matches!(
            encode(&[0.0; 3], 2, 2),
            Err(CodecError::Length { .. })
        ));
    }

    #[test]
    fn lightx2v_fp8_rows() {
        let codes = [0x38u8, 0xC0, 0x7E, 0x00];
        let mut out = [0f32; 4];
        decode_fp8_rowwise_into(&codes, &[0.5, 2.0], 2, 2, &mut out).unwrap();
        assert_eq!(out, [0.5, -1.0, 896.0, 0.0]);
        assert!(decode_fp8_rowwise_into(&codes, &[0.5], 2, 2, &mut out).is_err());
    }
}
