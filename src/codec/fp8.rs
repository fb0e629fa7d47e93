//! ComfyUI "scaled fp8": the `float8_e4m3fn` encoding of one `f32` exactly as torch's cast
//! (`Tensor.to(torch.float8_e4m3fn)`, torch 2.15 on the CPU) and the per-tensor scale rule.
//!
//! Owns: `f32 → F8_E4M3` (round to nearest, ties to even, subnormals down to 2⁻⁹, −0 for
//! negatives that round to zero, saturation of every finite |x| > 448 and of ±inf to ±448,
//! NaN → 0x7f with the sign bit kept), its inverse, and the per-tensor scale `max|W| / 448` (one f32
//! division, spec quant_formats.md §1.5) with the codes `W / scale` (one f32 division per
//! element). Does not own: which tensors are quantized (the release encoding) or the file.
//!
//! The one departure from the reference: an all-zero (or empty) weight. torch computes
//! `scale = 0` and `0 / 0 = NaN` codes, which a loader turns into NaN weights; here such a
//! tensor gets `scale = 1.0` and +0 codes, so it dequantizes to exact zeros.

/// The largest finite e4m3fn value.
pub const E4M3_MAX: f32 = 448.0;

/// Rounds one `f32` to `float8_e4m3fn` bits as torch's CPU cast does. Branch-free (every
/// case computed, one selected), so a loop over it vectorises; equal to the case-by-case
/// rule on every one of the 2³² inputs (checked when this form replaced it).
#[inline]
pub fn f32_to_e4m3fn(x: f32) -> u8 {
    // Adding 2¹⁴ puts the f32 ulp at 2⁻⁹ (the fp8 subnormal step), so for |x| < 2⁻⁶ the f32
    // addition itself rounds to nearest even and its low mantissa bits are the code (8 =
    // 2⁻⁶, the smallest normal, comes out right as well).
    const MAGIC: u32 = 141 << 23;
    let bits = x.to_bits();
    let sign = (bits >> 24) & 0x80;
    let abs = bits & 0x7FFF_FFFF;
    let subnormal = (f32::from_bits(abs) + f32::from_bits(MAGIC))
        .to_bits()
        .wrapping_sub(MAGIC);
    // Normal range: rebias the exponent from 127 to 7 and round the 20 dropped mantissa bits
    // to nearest even.
    let odd = (abs >> 20) & 1;
    let normal = (abs.wrapping_sub(120 << 23).wrapping_add(0x7FFFF + odd) >> 20).min(0x7E);
    let code = if abs < (121 << 23) { subnormal } else { normal };
    // 464 = the midpoint of 448 and the NaN code: at or above it RNE would leave the finite
    // range, so every larger finite value and ±inf saturate to ±448 (464 itself ties to 448,
    // which the rounding also gives); NaN keeps its sign.
    let code = if abs >= 0x43E8_0000 { 0x7E } else { code };
    let code = if abs > 0x7F80_0000 { 0x7F } else { code };
    (sign | code) as u8
}

/// The value of `float8_e4m3fn` bits, as torch's cast (`c10` `fp8e4m3fn_to_fp32_value`):
/// 0x7f / 0xff are NaN (with c10's payload, `0x7ff00000` and its sign); there are no
/// infinities. Branch-free, so a loop of decodes compiled for the vector width widens eight
/// codes at a time (a table lookup stays one load per code).
#[inline(always)]
pub fn e4m3fn_to_f32(b: u8) -> f32 {
    // The code's exponent and mantissa bits put where an f32 keeps them read as an f32 with
    // bias 127, times 2^120 (exact, a power of two): (1 + m/8)·2^(e − 7) for e > 0, and the
    // f32 subnormal m·2^−129 becomes m·2^−9 for e = 0.
    let mag = u32::from(b & 0x7F);
    let v = f32::from_bits(mag << 20) * f32::from_bits((120 + 127) << 23);
    let v = if mag == 0x7F {
        f32::from_bits(0x7FF0_0000)
    } else {
        v
    };
    f32::from_bits(v.to_bits() | (u32::from(b & 0x80) << 24))
}

/// `max|W|` over the tensor (a NaN is skipped, as `f32::max` skips it; the callers refuse or
/// name non-finite weights). Taken in 16 lanes, compiled for the CPU's vector width: the
/// maximum is exact, so any grouping gives the sequential fold's value.
pub fn amax(w: &[f32]) -> f32 {
    crate::codec::dtype::vectorized(
        #[inline(always)]
        || amax_in_lanes(w),
    )
}

/// [`amax`] for a caller already compiled for the vector width (a ggml block's encoder):
/// 16 lanes, the sequential fold's value.
#[inline(always)]
pub fn amax_in_lanes(w: &[f32]) -> f32 {
    const LANES: usize = 16;
    let mut lanes = [0f32; LANES];
    let chunks = w.chunks_exact(LANES);
    let tail = chunks.remainder().iter().fold(0f32, |m, &x| m.max(x.abs()));
    for c in chunks {
        for (m, &x) in lanes.iter_mut().zip(c) {
            *m = m.max(x.abs());
        }
    }
    lanes.iter().fold(tail, |m, &x| m.max(x))
}

/// The stored per-tensor scale of a weight whose `max|W|` is `amax`: `amax / 448` as one f32
/// division (not `amax * (1/448)`, which differs by an ulp for many tensors); 1.0 for an
/// all-zero weight (see the module docs).
pub fn scale_for(amax: f32) -> f32 {
    if amax == 0.0 { 1.0 } else { amax / E4M3_MAX }
}

/// Writes the codes of `w / scale` into `out` (one f32 division and one cast per element).
#[track_caller]
pub fn encode_scaled(w: &[f32], scale: f32, out: &mut [u8]) {
    assert_eq!(w.len(), out.len(), "encode_scaled: length mismatch");
    crate::codec::dtype::vectorized(
        #[inline(always)]
        || {
            for (o, &x) in out.iter_mut().zip(w) {
                *o = f32_to_e4m3fn(x / scale);
            }
        },
    )
}

/// comfy-kitchen's `quantize_per_tensor_fp8` (eager, `TensorCoreFP8Layout.quantize` with
/// `scale="recalculate"`): `scale = max|W| / 448` (one f32 division, no zero guard: the caller
/// refuses an all-zero weight, whose codes the reference makes NaN), then the codes of
/// `clamp(W * (1/scale), ±448)`: a product with the f32 reciprocal, not a division (comfy-kitchen
/// 0.2.40 `backends/eager/quantization.py`: `x * (1.0 / scale).to(x.dtype)`).
#[track_caller]
pub fn encode_comfy(w: &[f32], scale: f32, out: &mut [u8]) {
    assert_eq!(w.len(), out.len(), "encode_comfy: length mismatch");
    let recip = 1.0 / scale;
    crate::codec::dtype::vectorized(
        #[inline(always)]
        || {
            for (o, &x) in out.iter_mut().zip(w) {
                *o = f32_to_e4m3fn((x * recip).clamp(-E4M3_MAX, E4M3_MAX));
            }
        },
    )
}

/// qtorch 0.3.0's `float_quantize(x, exp=4, man=3, rounding="nearest")` on the CPU
/// (`quant/quant_cpu/quant_cpu.cpp`, `float_quantize` with `round_bitwise` and
/// `bit_helper.cpp` `clip_exponent`), which LightX2V's fp8 converter rounds with before its
/// exact cast to e4m3fn. Not torch's rounding: `round_bitwise` adds half an ulp of the 3-bit
/// mantissa to the f32 bits and truncates (ties away from zero); below 2^-6 (e4m3's
/// subnormals) the value is first shifted by `±2^-6` with an f32 addition, rounded the same
/// way and shifted back with an f32 subtraction, so a negative value that rounds to zero
/// comes out +0. Values above the largest normal binade clip to `±1.875·2^8`
/// (`clip_exponent`); LightX2V clips to ±448 before, so that never happens there.
///
/// Branch-free (both paths computed, one selected), so the encoder's loop compiled for the
/// vector width rounds eight values at a time.
#[inline(always)]
pub fn round_e4m3_qtorch(x: f32) -> f32 {
    const MAN: u32 = 3;
    let round = |bits: u32| {
        let mask = (1u32 << (23 - MAN)) - 1;
        bits.wrapping_add(1 << (23 - MAN - 1)) & !mask
    };
    let bits = x.to_bits();
    const MIN_EXP: u32 = 121; // 127 - 6: -((1 << (4 - 1)) - 2), biased
    // Below 2^-6: shifted by ±2^-6, rounded, shifted back.
    let shift = f32::from_bits((MIN_EXP << 23) | (bits & 0x8000_0000));
    let small = f32::from_bits(round((x + shift).to_bits())) - shift;
    // Otherwise the bits rounded (a result of 0, from a wrapped NaN, is +0.0), clipped above
    // the largest binade to ±1.875·2^8.
    let q = round(bits);
    let max_exp_store = (1u32 << 3) + 127;
    let max_man = (u32::MAX << 9 >> 9) >> (23 - MAN) << (23 - MAN);
    let clipped = (bits & 0x8000_0000) | (max_exp_store << 23) | max_man;
    let q = if (q << 1) >> 24 > max_exp_store {
        clipped
    } else {
        q
    };
    if (bits << 1) >> 24 < MIN_EXP {
        small
    } else {
        f32::from_bits(q)
    }
}

/// One scaled-fp8 tensor: the per-tensor scale and the codes, row-major like the weight.
#[derive(Clone, Debug, PartialEq)]
pub struct ScaledFp8 {
    /// The per-tensor scale (0-d F32 in the file; its name: `quant::convention`).
    pub scale: f32,
    /// F8_E4M3 codes of `W / scale`.
    pub codes: Vec<u8>,
}

/// Quantizes a whole weight: `scale = max|W| / 448`, codes of `W / scale`.
pub fn quantize_scaled(w: &[f32]) -> ScaledFp8 {
    let scale = scale_for(amax(w));
    let mut codes = vec![0u8; w.len()];
    encode_scaled(w, scale, &mut codes);
    ScaledFp8 { scale, codes }
}

/// Dequantizes as the loaders do: `q.to(f32) * scale` (one f32 product per element).
#[track_caller]
pub fn decode_scaled(codes: &[u8], scale: f32, out: &mut [f32]) {
    assert_eq!(codes.len(), out.len(), "decode_scaled: length mismatch");
    crate::codec::dtype::vectorized(
        #[inline(always)]
        || {
            for (o, &b) in out.iter_mut().zip(codes) {
                *o = e4m3fn_to_f32(b) * scale;
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 16-lane `amax` is the sequential fold, bit for bit, at every length and with the
    /// values a fold treats specially (NaN skipped, ±inf, -0.0) anywhere.
    #[test]
    fn amax_in_lanes_is_the_sequential_fold() {
        let fold = |w: &[f32]| w.iter().fold(0f32, |m, &x| m.max(x.abs()));
        let specials = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0, -7.5, 3.25];
        for len in 0..70 {
            let base: Vec<f32> = (0..len)
                .map(|i| ((i * 37 % 23) as f32 - 11.0) / 8.0)
                .collect();
            assert_eq!(amax(&base).to_bits(), fold(&base).to_bits(), "len {len}");
            for (at, &v) in specials.iter().enumerate().filter(|_| len > 0) {
                let mut w = base.clone();
                w[(at * 13) % len] = v;
                assert_eq!(
                    amax(&w).to_bits(),
                    fold(&w).to_bits(),
                    "len {len}, {v} at {at}"
                );
            }
        }
    }

    /// Every code decodes and re-encodes to itself (NaN codes to NaN codes of the same sign).
    #[test]
    fn every_code_round_trips() {
        for b in 0..=255u8 {
            let x = e4m3fn_to_f32(b);
            assert_eq!(f32_to_e4m3fn(x), b, "code {b:#04x} = {x}");
        }
    }

    /// The decoder gives the format's definition: `m · 2⁻⁹` for e = 0, `(8 + m) · 2^(e − 10)`
    /// otherwise, NaN (c10's payload) for S.1111.111.
    #[test]
    fn every_code_decodes_to_its_definition() {
        for b in 0..=255u8 {
            let (e, m) = (i32::from((b >> 3) & 0x0F), f32::from(b & 0x07));
            let mag = match (e, b & 0x7F) {
                (_, 0x7F) => f32::from_bits(0x7FF0_0000),
                (0, _) => m * 2f32.powi(-9),
                _ => (8.0 + m) * 2f32.powi(e - 10),
            };
            let want = mag.to_bits() | (u32::from(b & 0x80) << 24);
            assert_eq!(e4m3fn_to_f32(b).to_bits(), want, "code {b:#04x}");
        }
    }

    /// Against an exhaustive nearest-even search over the 254 finite codes, on a sweep of
    /// f32 values dense around every code and every midpoint.
    #[test]
    fn matches_exhaustive_nearest_even() {
        let finite: Vec<(u8, f32)> = (0..=0x7Eu8).map(|b| (b, e4m3fn_to_f32(b))).collect();
        let nearest = |a: f32| -> u8 {
            let mut best = (0u8, f32::INFINITY);
            for &(b, v) in &finite {
                let d = (v - a).abs();
                if d < best.1 || (d == best.1 && b & 1 == 0 && best.0 & 1 == 1) {
                    best = (b, d);
                }
            }
            best.0
        };
        let mut probes = Vec::new();
        for w in finite.windows(2) {
            let mid = (w[0].1 + w[1].1) / 2.0;
            for x in [w[0].1, mid, w[1].1] {
                probes.extend([x, f32::from_bits(x.to_bits() + 1), x.next_down_compat()]);
            }
        }
        for a in probes.into_iter().filter(|a| *a >= 0.0 && *a <= 448.0) {
            let want = nearest(a);
            assert_eq!(f32_to_e4m3fn(a), want, "x = {a:e}");
            assert_eq!(f32_to_e4m3fn(-a), want | 0x80, "x = -{a:e}");
        }
    }

    trait NextDown {
        fn next_down_compat(self) -> f32;
    }
    impl NextDown for f32 {
        fn next_down_compat(self) -> f32 {
            if self == 0.0 {
                -f32::from_bits(1)
            } else {
                f32::from_bits(self.to_bits() - 1)
            }
        }
    }

    #[test]
    fn saturates_and_keeps_nan_sign() {
        for (x, b) in [
            (448.0f32, 0x7E),
            (463.99f32, 0x7E),
            (464.0, 0x7E),
            (480.0, 0x7E),
            (1e30, 0x7E),
            (f32::INFINITY, 0x7E),
            (f32::NEG_INFINITY, 0xFE),
            (f32::NAN, 0x7F),
            (-f32::NAN, 0xFF),
            (-0.0, 0x80),
            (-(2f32).powi(-11), 0x80),
        ] {
            assert_eq!(f32_to_e4m3fn(x), b, "x = {x}");
        }
    }

    #[test]
    fn zero_weight_gets_unit_scale() {
        let q = quantize_scaled(&[0.0, -0.0, 0.0]);
        assert_eq!(q.scale, 1.0);
        assert_eq!(q.codes, vec![0, 0x80, 0]);
    }

    #[test]
    fn qtorch_rounds_ties_away_and_negative_zero_to_plus_zero() {
        // golden/quant_base/README.md, row 11: LightX2V's ties
        assert_eq!(round_e4m3_qtorch(1.0625), 1.125);
        assert_eq!(round_e4m3_qtorch(-1.0625), -1.125);
        assert_eq!(round_e4m3_qtorch(2f32.powi(-10)), 2f32.powi(-9));
        assert_eq!(round_e4m3_qtorch(-(2f32.powi(-10))), -(2f32.powi(-9)));
        assert_eq!(round_e4m3_qtorch(-3.8e-4).to_bits(), 0, "+0, not -0");
        assert_eq!(round_e4m3_qtorch(-0.0).to_bits(), 0);
        assert_eq!(round_e4m3_qtorch(447.0), 448.0);
        assert_eq!(round_e4m3_qtorch(1.06), 1.0);
        assert_eq!(round_e4m3_qtorch(3.0 * 2f32.powi(-10)), 2f32.powi(-8));
        // torch's cast rounds the same ties to even
        assert_eq!(e4m3fn_to_f32(f32_to_e4m3fn(1.0625)), 1.0);
    }
}
