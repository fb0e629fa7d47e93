//! INT8 weights with a float scale: comfy-kitchen's `int8_tensorwise` (one scale, or one per
//! row), its ConvRot variant (codes of the Hadamard-rotated weight), and LightX2V's per-channel
//! int8, which decodes by the same formula.
//!
//! Owns: the decoders, the encoders (tensorwise, per-row, ConvRot) and the size facts. Does
//! not own: the rotation itself (`hadamard`) or which scale shape a file carries (`quant/`).
//!
//! References (comfy-kitchen 0.2.40 wheel):
//! - `backends/eager/quantization.py`, `dequantize_int8_simple(q, scale)`: `q.float() * scale`
//!   (a scalar scale, or `[N, 1]` broadcasting along rows). A 1-D `[N]` scale would broadcast
//!   along the *columns* there (an error unless `N == K`); this module takes row scales as
//!   `[N]` values and callers must only pass `[N, 1]` (or `[N]` they have checked) files.
//! - `dequantize_int8_convrot_weight(q, scale, group)`: `_rotate_weight(q.float() * scale, H,
//!   group)`, i.e. the dequantized `W_rot` times `Hᵀ` per group of `group` columns, which is
//!   `W_rot·H` (H symmetric, see `hadamard`) = the un-rotated weight. comfy-kitchen rounds
//!   `q·s` to f32 and then multiplies with an f32 `torch.matmul` (not reproducible: the BLAS
//!   order decides the last bits). [`decode_convrot_into`] returns instead the exact
//!   `s · (q·H)` rounded once to f32 — the weight the int8 forward (below) effectively applies,
//!   since it scales only after the integer GEMM — which is golden/quant_base's `|exact`
//!   oracle; it agrees with comfy-kitchen's dequantize to within its matmul rounding (measured
//!   there: ≤ 2.4e-7 absolute, ≤ 1.2e-4 of the row scale).
//! - `tensor/int8.py`, `TensorWiseINT8Layout.dequantize`: the ConvRot branch when
//!   `params.convrot`, else the simple one; `quant::encode`: tensorwise, per-channel (`per_channel`),
//!   or ConvRot (requires `per_channel`), each via the functions below.
//! - `quantize_int8_tensorwise(x)`: `scale = (amax|x| / 127).clamp(min=1e-30)`, `q =
//!   round(x / scale).clamp(-128, 127)` (`_round_int8`: `torch.round`, half to even).
//! - `quantize_int8_rowwise(x)`: the same per row, scale `[N, 1]`.
//! - `quantize_int8_convrot_weight(w, group)`: `_rotate_weight(w, H, group)` then
//!   `quantize_int8_rowwise`. [`encode_convrot`] rotates exactly and rounds each code from
//!   the exact rotated value (issue 41's rule), so its bytes are comfy-kitchen's wherever
//!   that matmul's f32 results round to the same codes (a BLAS kernel may differ in the last
//!   bit, so comfy-kitchen's own bytes are not reproducible across machines).
//! - `backends/eager/quantization.py`, `int8_linear` (the forward): rotates the activation
//!   `x·H` per group, quantizes it per row, multiplies by the stored codes transposed and
//!   scales by the weight's scale times `x_scale`; so the stored codes are the rotated weight and the
//!   weight the layer computes with is `dequant(W_rot)·H`.
//!
//! LightX2V (ModelTC/LightX2V @f8aee98): `tools/convert/quant/quant.py` `QuantWeightINT8`
//! writes the weight I8 `[out, in]` and its scale `[out, 1]` (`clamp(rowabsmax, 1e-5) / 127`
//! in the source weight's dtype); the loader's torch fallback
//! (`lightx2v/common/ops/mm/mm_weight.py`, `MMWeightFp8IntelXpu.apply`, the one dequantizing
//! path: `weight.to(dtype) * scale.to(dtype)`) is [`decode_into`] with
//! [`Scale::Rows`]; the int8 kernels (vllm, q8f, torchao, triton) compute with the same
//! `code · row scale`.

use super::dtype::vectorized;
use super::hadamard;
use super::{CodecError, check_finite, check_len, mul};

/// The INT8 range comfy-kitchen clamps to.
pub const QMIN: f32 = -128.0;
/// See [`QMIN`].
pub const QMAX: f32 = 127.0;
/// The lower clamp of a computed scale (`clamp(min=1e-30)`).
pub const MIN_SCALE: f32 = 1e-30;

/// How an INT8 weight is scaled.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scale<'a> {
    /// One scale for the whole tensor (a scalar scale tensor).
    Tensor(f32),
    /// One scale per row (a `[N, 1]` scale tensor), widened to f32.
    Rows(&'a [f32]),
}

/// Bytes of an INT8 `[n, k]` weight.
pub fn storage_bytes(n: usize, k: usize) -> Option<usize> {
    n.checked_mul(k)
}

fn check(codes: &[u8], scale: Scale<'_>, rows: usize, cols: usize) -> Result<usize, CodecError> {
    let n = mul(rows, cols, "INT8 weight size")?;
    check_len("INT8 weight", n, codes.len())?;
    if let Scale::Rows(s) = scale {
        check_len("INT8 row scales", rows, s.len())?;
    }
    Ok(n)
}

/// Decodes a row-major `[rows, cols]` INT8 weight into `out`: `code as f32 * scale`, one f32
/// product per element (`dequantize_int8_simple`; also LightX2V's per-channel int8).
/// `codes` are the I8 tensor's bytes.
pub fn decode_into(
    codes: &[u8],
    scale: Scale<'_>,
    rows: usize,
    cols: usize,
    out: &mut [f32],
) -> Result<(), CodecError> {
    let n = check(codes, scale, rows, cols)?;
    check_len("INT8 output", n, out.len())?;
    if cols == 0 {
        return Ok(());
    }
    let rows_iter = out.chunks_exact_mut(cols).zip(codes.chunks_exact(cols));
    vectorized(
        #[inline(always)]
        || {
            for (r, (orow, qrow)) in rows_iter.enumerate() {
                let s = match scale {
                    Scale::Tensor(s) => s,
                    Scale::Rows(v) => v[r],
                };
                for (o, &q) in orow.iter_mut().zip(qrow) {
                    *o = f32::from(q as i8) * s;
                }
            }
        },
    );
    Ok(())
}

/// [`decode_into`] into a new buffer.
pub fn decode(
    codes: &[u8],
    scale: Scale<'_>,
    rows: usize,
    cols: usize,
) -> Result<Vec<f32>, CodecError> {
    let n = check(codes, scale, rows, cols)?;
    let mut out = vec![0f32; n];
    decode_into(codes, scale, rows, cols, &mut out)?;
    Ok(out)
}

/// Decodes a ConvRot INT8 weight (a ConvRot layer's marker says `"convrot": true`) into the un-rotated weight
/// the layer computes with: per group of `group` columns, the integer sums `k = q·H4^{⊗m}`
/// (exact), then `f32(s · k / 2^m)` with `s` the row's (or the tensor's) scale, one f64
/// product (exact: 24-bit `s` times `|k| ≤ 128·group`) and one rounding. `cols` must be a
/// multiple of `group`, a power of 4 (comfy-kitchen raises otherwise).
pub fn decode_convrot_into(
    codes: &[u8],
    scale: Scale<'_>,
    rows: usize,
    cols: usize,
    group: usize,
    out: &mut [f32],
) -> Result<(), CodecError> {
    hadamard::log4(group)?;
    super::check_multiple("in_features (ConvRot group)", cols, group)?;
    let n = check(codes, scale, rows, cols)?;
    check_len("INT8 output", n, out.len())?;
    if cols == 0 {
        return Ok(());
    }
    let mut k = vec![0i64; group];
    for (r, (orow, qrow)) in out
        .chunks_exact_mut(cols)
        .zip(codes.chunks_exact(cols))
        .enumerate()
    {
        let s = f64::from(match scale {
            Scale::Tensor(s) => s,
            Scale::Rows(v) => v[r],
        });
        for (og, qg) in orow.chunks_exact_mut(group).zip(qrow.chunks_exact(group)) {
            for (a, &q) in k.iter_mut().zip(qg) {
                *a = i64::from(q as i8);
            }
            let m = hadamard::butterflies_i64(&mut k)?;
            let inv = 0.5f64.powi(m as i32);
            for (o, &a) in og.iter_mut().zip(&k) {
                *o = (s * a as f64 * inv) as f32;
            }
        }
    }
    Ok(())
}

/// [`decode_convrot_into`] into a new buffer.
pub fn decode_convrot(
    codes: &[u8],
    scale: Scale<'_>,
    rows: usize,
    cols: usize,
    group: usize,
) -> Result<Vec<f32>, CodecError> {
    let n = check(codes, scale, rows, cols)?;
    let mut out = vec![0f32; n];
    decode_convrot_into(codes, scale, rows, cols, group, &mut out)?;
    Ok(out)
}

/// `(amax / 127).clamp(min=1e-30)`, one f32 division.
pub fn scale_for(amax: f32) -> f32 {
    (amax / QMAX).max(MIN_SCALE)
}

/// The code of `x` at `scale`: `round_half_even(x / scale)` clamped to `[-128, 127]`, as
/// `as i8 as u8` would store it (without that conversion, which AVX2 has no vector form of:
/// `super::clamped_byte`).
#[inline(always)]
pub fn quantize_one(x: f32, scale: f32) -> u8 {
    super::clamped_byte((x / scale).round_ties_even(), QMIN, QMAX)
}

/// The codes of `w` at `scale` into `out`, compiled for the CPU's vector width
/// (`dtype::vectorized`: `roundps` instead of a call to `rintf` per element). Each code is
/// [`quantize_one`]'s: the division rounds once and the rounding and clamp are exact at any
/// width.
fn quantize_into(w: &[f32], scale: f32, out: &mut [u8]) {
    vectorized(
        #[inline(always)]
        || {
            for (o, &x) in out.iter_mut().zip(w) {
                *o = quantize_one(x, scale);
            }
        },
    )
}

/// `quantize_int8_tensorwise(w)`: the codes and the one scale. Non-finite input is refused.
pub fn encode_tensorwise(w: &[f32]) -> Result<(Vec<u8>, f32), CodecError> {
    check_finite(w)?;
    let s = scale_for(super::fp8::amax(w));
    let mut codes = vec![0u8; w.len()];
    quantize_into(w, s, &mut codes);
    Ok((codes, s))
}

/// `quantize_int8_rowwise(w)` of a row-major `[rows, cols]` weight: codes and `rows` scales
/// (stored as `[rows, 1]`). Non-finite input is refused.
pub fn encode_rowwise(
    w: &[f32],
    rows: usize,
    cols: usize,
) -> Result<(Vec<u8>, Vec<f32>), CodecError> {
    encode_rows_by(w, rows, cols, scale_for)
}

/// LightX2V's lower clamp of a row's `max|W|` (`QuantWeightINT8` / `QuantWeightFP8`:
/// `amax(dim=1).clamp(min=1e-5)`).
pub const LIGHTX2V_MIN_AMAX: f32 = 1e-5;

/// LightX2V's `QuantWeightINT8.load_int8_weight` (ModelTC/LightX2V @f8aee98
/// `tools/convert/quant/quant.py`) on a row-major `[rows, cols]` f32 weight: per row
/// `scale = max(max|W|, 1e-5) / 127`, codes `round_half_even(W / scale)` clamped to
/// `[-128, 127]`. Returns the codes and the `rows` scales (stored `[rows, 1]`).
pub fn encode_rowwise_lightx2v(
    w: &[f32],
    rows: usize,
    cols: usize,
) -> Result<(Vec<u8>, Vec<f32>), CodecError> {
    encode_rows_by(w, rows, cols, |amax| amax.max(LIGHTX2V_MIN_AMAX) / QMAX)
}

/// Per-row int8 of a row-major `[rows, cols]` weight whose row scale is `scale_of(max|row|)`
/// (an empty row's is `scale_of(0)`): the one loop of both row-wise conventions.
fn encode_rows_by(
    w: &[f32],
    rows: usize,
    cols: usize,
    scale_of: impl Fn(f32) -> f32,
) -> Result<(Vec<u8>, Vec<f32>), CodecError> {
    check_len("INT8 input", mul(rows, cols, "INT8 input size")?, w.len())?;
    check_finite(w)?;
    let mut codes = vec![0u8; w.len()];
    let mut scales = vec![scale_of(0.0); rows];
    if cols == 0 {
        return Ok((codes, scales));
    }
    let rows_iter = w.chunks_exact(cols).zip(codes.chunks_exact_mut(cols));
    for ((row, out), s) in rows_iter.zip(&mut scales) {
        *s = scale_of(super::fp8::amax(row));
        quantize_into(row, *s, out);
    }
    Ok((codes, scales))
}

/// `quantize_int8_convrot_weight(w, group)` with the rotation done exactly (issue 41; the
/// reference's f32 `torch.matmul` rounds by its BLAS kernel, so its bytes are not
/// reproducible): per group the exact `W·Hᵀ` ([`hadamard::rotate_group_exact`]), the row
/// scale `clamp(f32(max |exact|) / 127, 1e-30)` (the f32 rounding of the exact maximum, then
/// comfy-kitchen's f32 division), and each code `round_half_even(exact / scale)` of the
/// exact quotient, clamped to `[-128, 127]`. Wherever comfy-kitchen's matmul happens to be
/// correctly rounded this is its result; elsewhere a code may differ where the exact quotient
/// lies within the matmul's rounding of a half-integer. Returns the codes and the `rows`
/// scales. Refused: `cols` not a multiple of `group` (comfy-kitchen raises), a group too wide
/// for exact integers (`rotate_group_exact`), and a rotated maximum beyond f32.
pub fn encode_convrot(
    w: &[f32],
    rows: usize,
    cols: usize,
    group: usize,
) -> Result<(Vec<u8>, Vec<f32>), CodecError> {
    check_len("INT8 input", mul(rows, cols, "INT8 input size")?, w.len())?;
    check_finite(w)?;
    hadamard::log4(group)?;
    super::check_multiple("in_features (ConvRot group)", cols, group)?;
    let mut codes = vec![0u8; w.len()];
    let mut scales = vec![MIN_SCALE; rows];
    if cols == 0 {
        return Ok((codes, scales));
    }
    let mut rot = vec![0i128; cols];
    let mut exps = vec![0i32; cols / group];
    let rows_iter = w.chunks_exact(cols).zip(codes.chunks_exact_mut(cols));
    for ((row, out), s) in rows_iter.zip(&mut scales) {
        let groups = row.chunks_exact(group).zip(rot.chunks_exact_mut(group));
        for ((g, a), e) in groups.zip(&mut exps) {
            *e = hadamard::rotate_group_exact(g, a)?;
        }
        let per_group = || rot.chunks_exact(group).zip(&exps);
        let amax = per_group()
            .flat_map(|(a, &e)| a.iter().map(move |&x| hadamard::exact_to_f32(x.abs(), e)))
            .fold(0f32, f32::max);
        if !amax.is_finite() {
            return Err(CodecError::Unrepresentable(
                "a ConvRot row whose rotated maximum exceeds f32 (comfy-kitchen's scale would \
                 be inf)"
                    .into(),
            ));
        }
        *s = scale_for(amax);
        for ((a, &e), o) in per_group().zip(out.chunks_exact_mut(group)) {
            for (o, &x) in o.iter_mut().zip(a) {
                *o = rne_quotient(x, e, *s) as u8;
            }
        }
    }
    Ok((codes, scales))
}

/// `round_half_even(a · 2^e / s)` clamped to `[-128, 127]`, exactly (`s` a positive normal
/// f32, `|a| < 2^127`).
fn rne_quotient(a: i128, e: i32, s: f32) -> i8 {
    if a == 0 {
        return 0;
    }
    let b = s.to_bits();
    let (sm, se) = (
        u128::from(b & 0x7F_FFFF | 0x80_0000),
        ((b >> 23) & 0xFF) as i32 - 150,
    );
    let t = e - se;
    let mag = a.unsigned_abs();
    // |a|·2^t / sm as num / den; a shift that overflows means a quotient beyond any code
    // (t > 0: clamp) or below one half (t < 0: zero)
    let (num, den) = if t >= 0 {
        match mag.checked_shl(t as u32).filter(|n| n >> t == mag) {
            Some(n) => (n, sm),
            None => return if a < 0 { -128 } else { 127 },
        }
    } else {
        match sm.checked_shl((-t) as u32).filter(|d| d >> -t == sm) {
            Some(d) => (mag, d),
            None => return 0,
        }
    };
    let q = num / den;
    let rest = num - q * den;
    let q = q + u128::from(rest > den - rest || (rest == den - rest && q & 1 == 1));
    let q = i128::try_from(q).unwrap_or(i128::MAX);
    (if a < 0 { -q } else { q }).clamp(-128, 127) as i8
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The code is Rust's saturating conversion of the reference formula, for every class of
    /// quotient (ties, the clamp's edges, beyond them, NaN) and a sweep of bit patterns.
    #[test]
    fn quantize_one_is_the_saturating_conversion() {
        let reference = |x: f32, s: f32| (x / s).round_ties_even().clamp(QMIN, QMAX) as i8 as u8;
        let mut xs = vec![
            0.5, 1.5, 2.5, -0.5, -2.5, 126.5, 127.5, -128.5, -129.0, 1e30, -1e30,
        ];
        xs.extend([f32::INFINITY, f32::NEG_INFINITY, f32::NAN, -0.0, 1e-40]);
        let mut bits = 0x9E37_79B9u32;
        for _ in 0..200_000 {
            bits = bits.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            xs.extend([f32::from_bits(bits), f32::from_bits(bits) % 300.0]);
        }
        for x in xs {
            for s in [1.0, 0.37, 3e-3] {
                assert_eq!(quantize_one(x, s), reference(x, s), "{x:e} / {s}");
            }
        }
    }

    #[test]
    fn decode_hand_values() {
        let codes = [0x00u8, 0x01, 0x7F, 0x80, 0xFF, 0xFE];
        let out = decode(&codes, Scale::Tensor(0.5), 2, 3).unwrap();
        assert_eq!(out, [0.0, 0.5, 63.5, -64.0, -0.5, -1.0]);
        let out = decode(&codes, Scale::Rows(&[1.0, 0.25]), 2, 3).unwrap();
        assert_eq!(out, [0.0, 1.0, 127.0, -32.0, -0.25, -0.5]);
        assert!(matches!(
            decode(&codes, Scale::Rows(&[1.0]), 2, 3),
            Err(CodecError::Length { .. })
        ));
        assert!(matches!(
            decode(&codes[1..], Scale::Tensor(1.0), 2, 3),
            Err(CodecError::Length { .. })
        ));
        assert!(matches!(
            decode(&codes, Scale::Tensor(1.0), usize::MAX, 3),
            Err(CodecError::Overflow { .. })
        ));
        assert!(
            decode(&[], Scale::Rows(&[1.0, 1.0]), 2, 0)
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn encode_hand_values() {
        // amax 127 -> scale 1; half-way values round to even.
        let w = [127.0f32, 0.5, 1.5, 2.5, -0.5, -1.5, -127.0, 3.0];
        let (q, s) = encode_tensorwise(&w).unwrap();
        assert_eq!(s, 1.0);
        let q: Vec<i8> = q.iter().map(|&b| b as i8).collect();
        assert_eq!(q, [127, 0, 2, 2, 0, -2, -127, 3]);
        let (q, s) = encode_tensorwise(&[0.0; 4]).unwrap();
        assert_eq!((q, s), (vec![0; 4], 1e-30));
        let (q, s) = encode_rowwise(&[2.54, -1.27, 0.0, 0.0], 2, 2).unwrap();
        assert_eq!(s, [2.54f32 / 127.0, 1e-30]);
        assert_eq!(q[0] as i8, 127);
        assert_eq!(
            q[1] as i8,
            (-1.27f32 / (2.54f32 / 127.0)).round_ties_even() as i8
        );
        assert!(encode_rowwise(&[f32::NAN], 1, 1).is_err());
    }

    #[test]
    fn rowwise_round_trip() {
        let (rows, cols) = (7, 33);
        let w: Vec<f32> = (0..rows * cols)
            .map(|i| ((i as f32) * 0.61).sin() * (1 + i % 5) as f32)
            .collect();
        let (q, s) = encode_rowwise(&w, rows, cols).unwrap();
        let d = decode(&q, Scale::Rows(&s), rows, cols).unwrap();
        for r in 0..rows {
            for c in 0..cols {
                assert!((w[r * cols + c] - d[r * cols + c]).abs() <= s[r] * 0.5 * (1.0 + 1e-6));
            }
        }
        // Codes of decoded values are a fixed point.
        let (q2, _) = encode_rowwise(&d, rows, cols).unwrap();
        assert_eq!(q2, q);
    }

    /// The dense `H4^{⊗4}` entry `(i, j)` (unnormalized ±1).
    fn h256(i: usize, j: usize) -> f64 {
        let mut v = 1.0;
        for d in 0..4 {
            v *= f64::from(hadamard::H4[(i >> (2 * d)) & 3][(j >> (2 * d)) & 3]);
        }
        v
    }

    #[test]
    fn convrot_decode_is_the_exact_product() {
        let (rows, cols) = (3, 512);
        let codes: Vec<u8> = (0..rows * cols)
            .map(|i| ((i * 97 + 13) % 256) as u8)
            .collect();
        let scales = [0.013f32, 7.7e-5, 1.0];
        let d = decode_convrot(&codes, Scale::Rows(&scales), rows, cols, 256).unwrap();
        for r in 0..rows {
            for g in 0..cols / 256 {
                for j in 0..256 {
                    // W[r, g*256 + j] = s · Σ_i q[r, g*256 + i] · H[i][j], exact in f64 here.
                    let k: f64 = (0..256)
                        .map(|i| f64::from(codes[r * cols + g * 256 + i] as i8) * h256(i, j))
                        .sum();
                    let exact = f64::from(scales[r]) * k / 16.0;
                    assert_eq!(d[r * cols + g * 256 + j], exact as f32, "({r},{j})");
                }
            }
        }
        // A scalar scale is the same as the rows all carrying it.
        let t = decode_convrot(&codes, Scale::Tensor(0.013), rows, cols, 256).unwrap();
        assert_eq!(t[..cols], d[..cols]);
        assert!(matches!(
            decode_convrot(&codes, Scale::Rows(&scales), rows, cols, 128),
            Err(CodecError::GroupSize(128))
        ));
        assert!(matches!(
            decode_convrot(&codes[..3 * 500], Scale::Rows(&scales), rows, 500, 256),
            Err(CodecError::NotDivisible { .. })
        ));
        assert!(matches!(
            decode_convrot(&codes[1..], Scale::Rows(&scales), rows, cols, 256),
            Err(CodecError::Length { .. })
        ));
    }

    #[test]
    fn convrot_round_trip() {
        let (rows, cols) = (4, 512);
        let w: Vec<f32> = (0..rows * cols)
            .map(|i| ((i as f32) * 0.173).sin() * 0.02 + if i % 97 == 0 { 0.3 } else { 0.0 })
            .collect();
        let (q, s) = encode_convrot(&w, rows, cols, 256).unwrap();
        let d = decode_convrot(&q, Scale::Rows(&s), rows, cols, 256).unwrap();
        // Orthogonal rotation: the per-element error of the rotated codes (<= s/2 each)
        // spreads, but the row's 2-norm error stays <= s/2 · √cols.
        for r in 0..rows {
            let err: f64 = (0..cols)
                .map(|c| f64::from(w[r * cols + c] - d[r * cols + c]).powi(2))
                .sum::<f64>()
                .sqrt();
            assert!(
                err <= f64::from(s[r]) * 0.5 * (cols as f64).sqrt(),
                "row {r}: {err}"
            );
        }
        // Wherever no exact quotient is near a tie, the codes are comfy-kitchen's per-row
        // quantization of the (correctly rounded) rotation.
        let rot = hadamard::rotate_rows_f32(&w, cols, 256).unwrap();
        assert_eq!(encode_rowwise(&rot, rows, cols).unwrap(), (q, s));
    }

    /// The exact rule against an independent f64 computation where f64 is exact (values on
    /// a 2^-20 grid: every sum exact), away from ties; and planted exact ties round to even.
    #[test]
    fn convrot_codes_are_the_exact_quotients_rounded_half_even() {
        let (rows, cols) = (6, 512);
        let mut rng = crate::rng::SplitMix64::new(0xC0);
        let mut w: Vec<f32> = (0..rows * cols)
            .map(|_| (rng.signed_f32() * 65536.0).round() / 1048576.0)
            .collect();
        w[5 * cols..].fill(0.0);
        let (q, s) = encode_convrot(&w, rows, cols, 256).unwrap();
        assert_eq!(s[5], MIN_SCALE, "zero row");
        for r in 0..rows {
            let mut x: Vec<f64> = w[r * cols..(r + 1) * cols]
                .iter()
                .map(|&v| v.into())
                .collect();
            for g in x.chunks_exact_mut(256) {
                hadamard::transform(g).unwrap();
            }
            let amax = x.iter().fold(0f64, |m, v| m.max(v.abs())) as f32;
            assert_eq!(s[r], scale_for(amax), "row {r}");
            for (c, &v) in x.iter().enumerate() {
                let t = v / f64::from(s[r]);
                if (t.abs().fract() - 0.5).abs() < 1e-6 {
                    continue;
                }
                let want = t.round_ties_even().clamp(-128.0, 127.0) as i8;
                assert_eq!(q[r * cols + c] as i8, want, "[{r}, {c}]");
            }
        }
        // a row whose rotation is [2.5, 1.5, 0.5, -0.5, ...]·2^-2 after H (group 4) at scale
        // 2^-2·2.5/127 is not a tie; build one that is: amax 127·s, and one value 0.5·s.
        let mut v = [0f32; 4];
        // H4·[a, b, c, d] / 2 with a = 127, others chosen so one output is 2.5:
        // outputs (a+b+c-d)/2, (a+b-c+d)/2, (a-b+c+d)/2, (-a+b+c+d)/2
        let want_out = [127.0f32, 2.5, -0.5, 1.5];
        // inverse = same transform
        let mut x: Vec<f64> = want_out.iter().map(|&v| v.into()).collect();
        hadamard::transform(&mut x).unwrap();
        for (o, &y) in v.iter_mut().zip(&x) {
            *o = y as f32;
        }
        let (q, s) = encode_convrot(&v, 1, 4, 4).unwrap();
        assert_eq!(s[0], 1.0);
        let q: Vec<i8> = q.iter().map(|&b| b as i8).collect();
        assert_eq!(q, [127, 2, 0, 2], "ties to even");
        assert!(
            encode_convrot(&[0.0; 12], 1, 12, 8).is_err(),
            "group not a power of 4"
        );
        assert!(
            encode_convrot(&[0.0; 12], 1, 12, 16).is_err(),
            "in_features % group"
        );
    }
}
