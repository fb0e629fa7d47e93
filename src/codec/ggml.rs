//! GGML tensor encodings as gguf-py 0.19 (`gguf/quants.py`) computes them: the 32-wide block
//! quantizers Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and the plain F32/F16/BF16 element types; and the
//! 256-wide K-quants Q2_K … Q6_K as ggml's reference C computes them (`kquant`, which gguf-py
//! can only decode).
//!
//! Owns: the ggml type ids, block and byte sizes, `f32 → bytes` bit-exact to gguf-py (spec
//! quant_formats.md §2.6) and `bytes → f32` as its dequantizers. Does not own: which type a
//! tensor gets (the GGUF encoding's rules) or the container (`gguf`).
//!
//! The reference's arithmetic, kept operation for operation (every step one f32 rounding, no
//! fused multiply-add):
//! - Q8_0: `d = max|x| / 127`, `id = d == 0 ? 0 : 1/d`, `q = roundf(x·id)` (halves away from
//!   zero), `d` stored as f16 (RNE).
//! - Q4_0 / Q5_0: `m` = the signed element of largest |x| (the first on ties), `d = m / −8`
//!   (`/ −16`), `q = trunc(x·id + 8.5)` (`+ 16.5`) clipped to 15 (31). An all-zero block
//!   stores `d = −0.0` and codes 8 (16).
//! - Q4_1 / Q5_1: `d = (max − min) / 15` (`/ 31`), `q = trunc((x − min)·id + 0.5)`, `d` and
//!   `min` stored as f16.
//!
//! Inputs must be finite (the callers refuse NaN/inf weights before quantizing).

use half::f16;

use crate::codec::dtype::DType;

use super::clamped_byte;
use super::kquant::{self, QK_K};
use crate::codec::dtype::{round_to_bf16, round_to_f16, vectorized};

/// Elements per block of the 32-wide block types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1).
pub const QK: usize = 32;

/// A ggml tensor type wanbake writes or reads.
#[allow(non_camel_case_types)]
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub enum GgmlType {
    /// IEEE single.
    F32,
    /// IEEE half.
    F16,
    /// 4-bit symmetric blocks of 32.
    Q4_0,
    /// 4-bit blocks of 32 with a minimum.
    Q4_1,
    /// 5-bit symmetric blocks of 32.
    Q5_0,
    /// 5-bit blocks of 32 with a minimum.
    Q5_1,
    /// 8-bit symmetric blocks of 32.
    Q8_0,
    /// bfloat16.
    BF16,
    /// 2-bit K-quant: super-blocks of 256, 16 sub-blocks with 4-bit scales and mins.
    Q2_K,
    /// 3-bit K-quant: super-blocks of 256, 16 sub-blocks with 6-bit scales.
    Q3_K,
    /// 4-bit K-quant: super-blocks of 256, 8 sub-blocks with 6-bit scales and mins.
    Q4_K,
    /// 5-bit K-quant: super-blocks of 256, 8 sub-blocks with 6-bit scales and mins.
    Q5_K,
    /// 6-bit K-quant: super-blocks of 256, 16 sub-blocks with 8-bit scales.
    Q6_K,
}

impl GgmlType {
    /// The ggml type of a float dtype a GGUF file can hold unquantized (F32, F16, BF16).
    pub fn of_float(d: DType) -> Option<GgmlType> {
        match d {
            DType::F32 => Some(GgmlType::F32),
            DType::F16 => Some(GgmlType::F16),
            DType::BF16 => Some(GgmlType::BF16),
            _ => None,
        }
    }

    /// The `ggml_type` id stored in a GGUF tensor info.
    pub fn id(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q5_0 => 6,
            GgmlType::Q5_1 => 7,
            GgmlType::Q8_0 => 8,
            GgmlType::BF16 => 30,
            GgmlType::Q2_K => 10,
            GgmlType::Q3_K => 11,
            GgmlType::Q4_K => 12,
            GgmlType::Q5_K => 13,
            GgmlType::Q6_K => 14,
        }
    }

    /// The type of a `ggml_type` id, if wanbake knows it.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        ALL.iter().copied().find(|t| t.id() == id)
    }

    /// ggml's name (`Q8_0`, `F16`, ...).
    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "F32",
            GgmlType::F16 => "F16",
            GgmlType::Q4_0 => "Q4_0",
            GgmlType::Q4_1 => "Q4_1",
            GgmlType::Q5_0 => "Q5_0",
            GgmlType::Q5_1 => "Q5_1",
            GgmlType::Q8_0 => "Q8_0",
            GgmlType::BF16 => "BF16",
            GgmlType::Q2_K => "Q2_K",
            GgmlType::Q3_K => "Q3_K",
            GgmlType::Q4_K => "Q4_K",
            GgmlType::Q5_K => "Q5_K",
            GgmlType::Q6_K => "Q6_K",
        }
    }

    /// Elements per block (1 for the plain types, 256 for the K-quants).
    pub fn block_size(self) -> usize {
        if self.is_k_quant() {
            QK_K
        } else if self.is_block() {
            QK
        } else {
            1
        }
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::BF16 => 2,
            GgmlType::Q4_0 => 18,
            GgmlType::Q4_1 => 20,
            GgmlType::Q5_0 => 22,
            GgmlType::Q5_1 => 24,
            GgmlType::Q8_0 => 34,
            GgmlType::Q2_K => kquant::Q2_K_BYTES,
            GgmlType::Q3_K => kquant::Q3_K_BYTES,
            GgmlType::Q4_K => kquant::Q4_K_BYTES,
            GgmlType::Q5_K => kquant::Q5_K_BYTES,
            GgmlType::Q6_K => kquant::Q6_K_BYTES,
        }
    }

    /// True for the block types (32-wide and the 256-wide K-quants).
    pub fn is_block(self) -> bool {
        !matches!(self, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
    }

    /// True for the 256-wide K-quants Q2_K … Q6_K.
    pub fn is_k_quant(self) -> bool {
        matches!(
            self,
            GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K
        )
    }

    /// Bytes of `numel` elements, or `None` when `numel` is not a whole number of blocks or
    /// the size overflows.
    pub fn byte_len(self, numel: usize) -> Option<usize> {
        let bs = self.block_size();
        if !numel.is_multiple_of(bs) {
            return None;
        }
        (numel / bs).checked_mul(self.type_size())
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Every type of this module.
pub const ALL: [GgmlType; 13] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::BF16,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// Encodes `src` (whole blocks for the block types) into `dst` of exactly
/// `ty.byte_len(src.len())` bytes.
#[track_caller]
pub fn quantize(ty: GgmlType, src: &[f32], dst: &mut [u8]) {
    assert_eq!(
        Some(dst.len()),
        ty.byte_len(src.len()),
        "ggml::quantize: {} bytes for {} elements of {ty}",
        dst.len(),
        src.len()
    );
    match ty {
        GgmlType::F32 => {
            for (c, &x) in dst.chunks_exact_mut(4).zip(src) {
                c.copy_from_slice(&x.to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for (c, &x) in dst.chunks_exact_mut(2).zip(src) {
                c.copy_from_slice(&round_to_f16(x).to_le_bytes());
            }
        }
        GgmlType::BF16 => {
            for (c, &x) in dst.chunks_exact_mut(2).zip(src) {
                c.copy_from_slice(&round_to_bf16(x).to_le_bytes());
            }
        }
        _ if ty.is_k_quant() => quantize_k_blocks(ty, src, dst),
        _ => legacy_blocks(ty, src, dst),
    }
}

/// Every block of [`QK`] values of `src` encoded as the legacy type `ty` into its bytes of
/// `dst`, compiled for the CPU's vector width: `roundf`'s floors become one instruction each
/// instead of a libm call per element (the same values: floor is exact). The block encoders
/// are called directly, not through a function value: LLVM leaves a call through `Fn` out of
/// line, compiled for the baseline.
fn legacy_blocks(ty: GgmlType, src: &[f32], dst: &mut [u8]) {
    let ts = dst.len() / (src.len() / QK).max(1);
    vectorized(
        #[inline(always)]
        || {
            for (out, x) in dst.chunks_exact_mut(ts.max(1)).zip(src.chunks_exact(QK)) {
                let x: &[f32; QK] = x.try_into().expect("chunks_exact(QK)");
                match ty {
                    GgmlType::Q8_0 => q8_0(x, out),
                    GgmlType::Q4_0 => q_sym::<4>(x, out),
                    GgmlType::Q5_0 => q_sym::<5>(x, out),
                    GgmlType::Q4_1 => q_min::<4>(x, out),
                    GgmlType::Q5_1 => q_min::<5>(x, out),
                    _ => unreachable!("ggml::quantize hands on the legacy block types only"),
                }
            }
        },
    )
}

/// Encodes to a fresh vector; `None` when `src` is not a whole number of blocks.
pub fn quantize_vec(ty: GgmlType, src: &[f32]) -> Option<Vec<u8>> {
    let mut out = vec![0u8; ty.byte_len(src.len())?];
    quantize(ty, src, &mut out);
    Some(out)
}

/// `roundf`: halves away from zero (gguf-py's `np_roundf`): `floor|x| + floor(2·(|x| −
/// floor|x|))` with `x`'s sign, every step exact; ±inf and NaN give NaN (`inf − inf`). In
/// [`legacy_blocks`] each floor is one vector instruction (`vroundps`); outside it, a libm
/// call.
#[inline(always)]
fn roundf(x: f32) -> f32 {
    let a = x.abs();
    let fl = a.floor();
    (fl + (2.0 * (a - fl)).floor()).copysign(x)
}

/// `1/d`, or 0 where `d == 0` (either sign).
#[inline]
fn inv(d: f32) -> f32 {
    if d == 0.0 { 0.0 } else { 1.0 / d }
}

fn put_f16(out: &mut [u8], x: f32) {
    out.copy_from_slice(&round_to_f16(x).to_le_bytes());
}

#[inline(always)]
fn q8_0(x: &[f32; QK], out: &mut [u8]) {
    let amax = super::fp8::amax_in_lanes(x);
    let d = amax / 127.0;
    let id = inv(d);
    put_f16(&mut out[..2], d);
    for (o, &v) in out[2..].iter_mut().zip(x) {
        *o = clamped_byte(roundf(v * id), -128.0, 127.0);
    }
}

/// Q4_0 (`BITS = 4`) and Q5_0 (`BITS = 5`).
#[inline(always)]
fn q_sym<const BITS: u32>(x: &[f32; QK], out: &mut [u8]) {
    let half = (1u32 << (BITS - 1)) as f32; // 8 or 16
    let top = (1u32 << BITS) - 1; // 15 or 31
    // argmax of |x|, the first index on ties (ggml's loop keeps the first strictly larger
    // |x|; a NaN never is, and a NaN x[0] stays): the maximum in lanes, then its first index.
    let amax = super::fp8::amax_in_lanes(x);
    // The first index as the lowest bit of a mask of matches (a search with an early exit
    // is a branch per element).
    let mut hits = 0u32;
    for (i, v) in x.iter().enumerate() {
        hits |= u32::from(v.abs() == amax) << i;
    }
    let m = match (x[0].is_nan(), hits.trailing_zeros() as usize) {
        (false, first) if first < QK => x[first],
        _ => x[0],
    };
    let d = m / -half;
    let id = inv(d);
    let mut q = [0u8; QK];
    for (qi, &v) in q.iter_mut().zip(x) {
        // The floor truncates as ggml's `(int8_t)` does for what it keeps (non-negative; a
        // negative or NaN value comes out 0, as its `trunc` and the clamp give).
        *qi = clamped_byte((v * id + (half + 0.5)).floor(), 0.0, top as f32);
    }
    put_f16(&mut out[..2], d);
    pack_nibbles::<BITS>(&q, &mut out[2..]);
}

/// Q4_1 (`BITS = 4`) and Q5_1 (`BITS = 5`).
#[inline(always)]
fn q_min<const BITS: u32>(x: &[f32; QK], out: &mut [u8]) {
    let top = (1u32 << BITS) - 1;
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let min = x.iter().copied().fold(f32::INFINITY, f32::min);
    let d = (max - min) / top as f32;
    let id = inv(d);
    let mut q = [0u8; QK];
    for (qi, &v) in q.iter_mut().zip(x) {
        *qi = clamped_byte(((v - min) * id + 0.5).floor(), 0.0, top as f32);
    }
    put_f16(&mut out[..2], d);
    put_f16(&mut out[2..4], min);
    pack_nibbles::<BITS>(&q, &mut out[4..]);
}

/// Element j in the low nibble and j+16 in the high nibble of byte j; for 5 bits, the fifth
/// bits first as a little-endian 32-bit mask (element i at bit i).
#[inline(always)]
fn pack_nibbles<const BITS: u32>(q: &[u8; QK], out: &mut [u8]) {
    let qs = if BITS == 5 {
        let mut qh = 0u32;
        for (i, &v) in q.iter().enumerate() {
            qh |= ((v as u32 >> 4) & 1) << i;
        }
        out[..4].copy_from_slice(&qh.to_le_bytes());
        &mut out[4..]
    } else {
        out
    };
    for j in 0..QK / 2 {
        qs[j] = (q[j] & 0x0F) | ((q[j + QK / 2] & 0x0F) << 4);
    }
}

/// Decodes `src` (`ty.byte_len(dst.len())` bytes) into `dst` as gguf-py's dequantizers do
/// (`d·q` or `d·q + m`, one f32 product per element), and the K-quants as ggml's
/// `dequantize_row_qN_K` do.
#[track_caller]
pub fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) {
    assert_eq!(
        Some(src.len()),
        ty.byte_len(dst.len()),
        "ggml::dequantize: {} bytes for {} elements of {ty}",
        src.len(),
        dst.len()
    );
    match ty {
        GgmlType::F32 => {
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *d = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        GgmlType::F16 => {
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = f16_at(c);
            }
        }
        GgmlType::BF16 => {
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16);
            }
        }
        _ if ty.is_k_quant() => dequantize_k_blocks(ty, src, dst),
        _ => legacy_dequantize(ty, src, dst),
    }
}

/// The f16 at the start of `b`, widened.
#[inline(always)]
fn f16_at(b: &[u8]) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()
}

/// [`dequantize`] of the legacy block types (gguf-py's `d·q` or `d·q + m`), compiled for the
/// CPU's vector width: each block's codes unpacked whole, then one product per element.
fn legacy_dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) {
    let ts = ty.type_size();
    vectorized(
        #[inline(always)]
        || {
            for (y, b) in dst.chunks_exact_mut(QK).zip(src.chunks_exact(ts)) {
                let d = f16_at(b);
                let (q, m) = match ty {
                    GgmlType::Q8_0 => (q8_codes(&b[2..]), None),
                    GgmlType::Q4_0 => (codes::<4>(&b[2..], -8), None),
                    GgmlType::Q5_0 => (codes::<5>(&b[2..], -16), None),
                    GgmlType::Q4_1 => (codes::<4>(&b[4..], 0), Some(f16_at(&b[2..]))),
                    GgmlType::Q5_1 => (codes::<5>(&b[4..], 0), Some(f16_at(&b[2..]))),
                    _ => unreachable!("ggml::dequantize hands on the legacy block types only"),
                };
                let q: [i32; QK] = q;
                match m {
                    Some(m) => (y.iter_mut().zip(q)).for_each(|(y, q)| *y = d * q as f32 + m),
                    None => (y.iter_mut().zip(q)).for_each(|(y, q)| *y = d * q as f32),
                }
            }
        },
    )
}

/// A Q8_0 block's codes (a plain loop: `array::from_fn` was left a call per element).
#[inline(always)]
fn q8_codes(qs: &[u8]) -> [i32; QK] {
    let mut q = [0i32; QK];
    for (v, &b) in q.iter_mut().zip(qs) {
        *v = i32::from(b as i8);
    }
    q
}

/// A 4- or 5-bit block's codes plus `offset`: element j in the low nibble and j+16 in the
/// high nibble of byte j (after, for 5 bits, the fifth bits as a little-endian 32-bit mask);
/// the inverse of [`pack_nibbles`].
#[inline(always)]
fn codes<const BITS: u32>(rest: &[u8], offset: i32) -> [i32; QK] {
    let (qh, qs) = match BITS {
        5 => (
            u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]),
            &rest[4..],
        ),
        _ => (0, rest),
    };
    // Plain loops over the array (`array::from_fn` was left a call, element by element).
    let mut q = [0i32; QK];
    let (lo, hi) = q.split_at_mut(QK / 2);
    for ((l, h), &b) in lo.iter_mut().zip(hi).zip(qs) {
        (*l, *h) = (i32::from(b & 0x0F), i32::from(b >> 4));
    }
    for (i, v) in q.iter_mut().enumerate() {
        *v = (*v | (((qh >> i) & 1) as i32) << 4) + offset;
    }
    q
}

/// Encodes whole super-blocks of `src` into `dst` (`ty` one of Q2_K … Q6_K; lengths checked by
/// the caller, `quantize`), compiled for the CPU's widest vector set that `pulp`
/// dispatches to (AVX2 on x86-64 when present, detected at run time). The bytes are the scalar
/// code's: only the instruction width changes, every operation stays one IEEE f32 rounding
/// (Rust never contracts a multiply and an add).
fn quantize_k_blocks(ty: GgmlType, src: &[f32], dst: &mut [u8]) {
    struct Op<'a>(GgmlType, &'a [f32], &'a mut [u8]);
    impl pulp::WithSimd for Op<'_> {
        type Output = ();
        #[inline(always)]
        fn with_simd<S: pulp::Simd>(self, _: S) {
            let Op(ty, src, dst) = self;
            let (src, dst) = match ty {
                GgmlType::Q4_K | GgmlType::Q5_K => {
                    let pairs = dst
                        .chunks_exact_mut(2 * ty.type_size())
                        .zip(src.chunks_exact(2 * QK_K));
                    let done = pairs.len();
                    for (out, x) in pairs {
                        let x = x.try_into().expect("chunks_exact(2 * QK_K)");
                        match ty {
                            GgmlType::Q4_K => kquant::quantize_q4_k_pair(x, out),
                            _ => kquant::quantize_q5_k_pair(x, out),
                        }
                    }
                    (
                        &src[done * 2 * QK_K..],
                        &mut dst[done * 2 * ty.type_size()..],
                    )
                }
                _ => (src, dst),
            };
            let blocks = dst
                .chunks_exact_mut(ty.type_size())
                .zip(src.chunks_exact(QK_K));
            for (out, x) in blocks {
                let x = x.try_into().expect("chunks_exact(QK_K)");
                match ty {
                    GgmlType::Q2_K => kquant::quantize_q2_k(x, out),
                    GgmlType::Q3_K => kquant::quantize_q3_k(x, out),
                    GgmlType::Q4_K => kquant::quantize_q4_k(x, out),
                    GgmlType::Q5_K => kquant::quantize_q5_k(x, out),
                    GgmlType::Q6_K => kquant::quantize_q6_k(x, out),
                    _ => unreachable!("{ty} is not a K-quant"),
                }
            }
        }
    }
    pulp::Arch::new().dispatch(Op(ty, src, dst));
}

/// Decodes whole super-blocks of `src` into `dst`, dispatched like [`quantize_k_blocks`].
fn dequantize_k_blocks(ty: GgmlType, src: &[u8], dst: &mut [f32]) {
    struct Op<'a>(GgmlType, &'a [u8], &'a mut [f32]);
    impl pulp::WithSimd for Op<'_> {
        type Output = ();
        #[inline(always)]
        fn with_simd<S: pulp::Simd>(self, _: S) {
            let Op(ty, src, dst) = self;
            let blocks = dst
                .chunks_exact_mut(QK_K)
                .zip(src.chunks_exact(ty.type_size()));
            for (y, b) in blocks {
                let y = y.try_into().expect("chunks_exact_mut(QK_K)");
                match ty {
                    GgmlType::Q2_K => kquant::dequantize_q2_k(b, y),
                    GgmlType::Q3_K => kquant::dequantize_q3_k(b, y),
                    GgmlType::Q4_K => kquant::dequantize_q4_k(b, y),
                    GgmlType::Q5_K => kquant::dequantize_q5_k(b, y),
                    GgmlType::Q6_K => kquant::dequantize_q6_k(b, y),
                    _ => unreachable!("{ty} is not a K-quant"),
                }
            }
        }
    }
    pulp::Arch::new().dispatch(Op(ty, src, dst));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundf_is_half_away() {
        for (x, r) in [
            (0.5f32, 1.0f32),
            (1.5, 2.0),
            (2.5, 3.0),
            (-2.5, -3.0),
            (0.49999997, 0.0),
        ] {
            assert_eq!(roundf(x), r, "{x}");
        }
    }

    /// The bytes the blocks store equal Rust's saturating conversions of the reference
    /// formulas (`roundf(x) as i8` for Q8_0, ggml's truncation `(x as u32).min(top)` for the
    /// 4/5-bit codes) for every value class: halves, the largest codes, beyond i32, ±inf,
    /// NaN, and a sweep of bit patterns.
    #[test]
    fn stored_bytes_are_the_saturating_conversions() {
        let exact = |x: f32| {
            let a = x.abs();
            let fl = a.floor();
            (fl + (2.0 * (a - fl)).floor()).copysign(x)
        };
        let mut xs = vec![
            0.0f32,
            -0.0,
            126.5,
            -127.5,
            127.49999,
            128.0,
            -129.0,
            3e9,
            -3e9,
            2147483648.0,
            f32::MAX,
            f32::MIN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            1e-40,
            -1e-40,
        ];
        let mut bits = 0x1234_5678u32;
        for _ in 0..200_000 {
            bits = bits.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            xs.push(f32::from_bits(bits));
            xs.push(f32::from_bits(bits) % 200.0);
        }
        xs.extend([15.5, 16.0, 31.9, 32.0, -0.5, -1.0, 0.99]);
        for x in xs {
            let q8 = clamped_byte(roundf(x), -128.0, 127.0);
            assert_eq!(q8, exact(x) as i8 as u8, "{x:e}");
            for top in [15u32, 31] {
                let code = clamped_byte(x.floor(), 0.0, top as f32);
                assert_eq!(code, (x as u32).min(top) as u8, "{x:e} top {top}");
            }
        }
    }

    #[test]
    fn zero_blocks() {
        let z = [0f32; QK];
        let q = quantize_vec(GgmlType::Q4_0, &z).unwrap();
        assert_eq!(&q[..2], &0x8000u16.to_le_bytes(), "d = -0.0");
        assert!(q[2..].iter().all(|&b| b == 0x88));
        let q = quantize_vec(GgmlType::Q8_0, &z).unwrap();
        assert!(q.iter().all(|&b| b == 0));
        let q = quantize_vec(GgmlType::Q5_0, &z).unwrap();
        assert_eq!(&q[2..6], &[0xFF; 4], "every fifth bit set (16)");
        assert!(q[6..].iter().all(|&b| b == 0));
    }

    #[test]
    fn ids_round_trip_and_partial_blocks_refused() {
        for t in ALL {
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
        }
        assert_eq!(GgmlType::Q8_0.byte_len(33), None);
        assert_eq!(GgmlType::F16.byte_len(33), Some(66));
    }

    /// Every block type reproduces its input within half a step (one step for the offset
    /// types' trunc-based rounding) after a decode.
    #[test]
    fn decode_inverts_within_a_step() {
        let x: Vec<f32> = (0..QK * 4)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        for t in ALL.into_iter().filter(|t| !t.is_k_quant()) {
            let q = quantize_vec(t, &x).unwrap();
            let mut y = vec![0f32; x.len()];
            dequantize(t, &q, &mut y);
            let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
            let step = match t {
                GgmlType::Q8_0 => amax / 127.0,
                GgmlType::Q4_0 | GgmlType::Q4_1 => amax / 7.0,
                GgmlType::Q5_0 | GgmlType::Q5_1 => amax / 15.0,
                _ => amax / 256.0,
            };
            for (a, b) in x.iter().zip(&y) {
                assert!((a - b).abs() <= step, "{t}: {a} vs {b}");
            }
        }
    }
}
