//! Element types of safetensors files and the conversions wanbake performs on them.
//!
//! Owns: the `DType` enum (every dtype the safetensors format defines), the widening of
//! F64/F32/F16/BF16/F8 data to `f32`, and the narrowing of `f32` to BF16/F16/F32 with one
//! round-to-nearest-even. Does not own: deciding *which* dtype a tensor gets (that is
//! `layout::dtype_policy`).
//!
//! Widening loops have no per-element branch: BF16 is a shift, F16 goes through `half`'s
//! table-free bit arithmetic (F16C when the CPU has it), F8 through a 256-entry table. The
//! BF16 loops, the hottest of a merge, are compiled a second time for the CPU's wider vector
//! units and picked at run time ([`vectorized`]), because the release binary targets
//! baseline x86-64 (SSE2): the same scalar code, so the same bits, in 2-3x less time.

use std::fmt;

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use serde::{Deserialize, Serialize};

/// A safetensors element type, spelled as in the file header.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum DType {
    /// Boolean (one byte).
    BOOL,
    /// 4-bit float (E2M1), two per byte.
    F4,
    /// 6-bit float E2M3.
    F6_E2M3,
    /// 6-bit float E3M2.
    F6_E3M2,
    /// Unsigned byte.
    U8,
    /// Signed byte.
    I8,
    /// 8-bit float E5M2.
    F8_E5M2,
    /// 8-bit float E4M3 (finite, NaN = S.1111.111).
    F8_E4M3,
    /// 8-bit exponent-only scale format.
    F8_E8M0,
    /// 8-bit float E4M3, fnuz variant.
    F8_E4M3FNUZ,
    /// 8-bit float E5M2, fnuz variant.
    F8_E5M2FNUZ,
    /// Signed 16-bit integer.
    I16,
    /// Unsigned 16-bit integer.
    U16,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    BF16,
    /// Signed 32-bit integer.
    I32,
    /// Unsigned 32-bit integer.
    U32,
    /// IEEE single precision.
    F32,
    /// Complex of two f32.
    C64,
    /// IEEE double precision.
    F64,
    /// Signed 64-bit integer.
    I64,
    /// Unsigned 64-bit integer.
    U64,
}

/// Every dtype, in the order the safetensors crate declares them.
pub const ALL_DTYPES: [DType; 22] = [
    DType::BOOL,
    DType::F4,
    DType::F6_E2M3,
    DType::F6_E3M2,
    DType::U8,
    DType::I8,
    DType::F8_E5M2,
    DType::F8_E4M3,
    DType::F8_E8M0,
    DType::F8_E4M3FNUZ,
    DType::F8_E5M2FNUZ,
    DType::I16,
    DType::U16,
    DType::F16,
    DType::BF16,
    DType::I32,
    DType::U32,
    DType::F32,
    DType::C64,
    DType::F64,
    DType::I64,
    DType::U64,
];

impl DType {
    /// The header spelling, e.g. `"BF16"`.
    pub fn as_str(self) -> &'static str {
        match self {
            DType::BOOL => "BOOL",
            DType::F4 => "F4",
            DType::F6_E2M3 => "F6_E2M3",
            DType::F6_E3M2 => "F6_E3M2",
            DType::U8 => "U8",
            DType::I8 => "I8",
            DType::F8_E5M2 => "F8_E5M2",
            DType::F8_E4M3 => "F8_E4M3",
            DType::F8_E8M0 => "F8_E8M0",
            DType::F8_E4M3FNUZ => "F8_E4M3FNUZ",
            DType::F8_E5M2FNUZ => "F8_E5M2FNUZ",
            DType::I16 => "I16",
            DType::U16 => "U16",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            DType::I32 => "I32",
            DType::U32 => "U32",
            DType::F32 => "F32",
            DType::C64 => "C64",
            DType::F64 => "F64",
            DType::I64 => "I64",
            DType::U64 => "U64",
        }
    }

    /// Parses a header spelling; `None` for anything the format does not define.
    pub fn parse(s: &str) -> Option<DType> {
        ALL_DTYPES.iter().copied().find(|d| d.as_str() == s)
    }

    /// Size of one element in bits (4 and 6 for the sub-byte float formats).
    pub fn bits(self) -> usize {
        match self {
            DType::F4 => 4,
            DType::F6_E2M3 | DType::F6_E3M2 => 6,
            DType::BOOL
            | DType::U8
            | DType::I8
            | DType::F8_E5M2
            | DType::F8_E4M3
            | DType::F8_E8M0
            | DType::F8_E4M3FNUZ
            | DType::F8_E5M2FNUZ => 8,
            DType::I16 | DType::U16 | DType::F16 | DType::BF16 => 16,
            DType::I32 | DType::U32 | DType::F32 => 32,
            DType::C64 | DType::F64 | DType::I64 | DType::U64 => 64,
        }
    }

    /// Size of one element in whole bytes, or `None` for sub-byte formats.
    pub fn size(self) -> Option<usize> {
        let b = self.bits();
        b.is_multiple_of(8).then_some(b / 8)
    }

    /// Natural alignment in bytes, used to order tensors in written files.
    pub fn alignment(self) -> usize {
        self.size().unwrap_or(1)
    }

    /// True for the types wanbake can widen to `f32` and compute on.
    pub fn is_float(self) -> bool {
        matches!(
            self,
            DType::F16 | DType::BF16 | DType::F32 | DType::F64 | DType::F8_E4M3 | DType::F8_E5M2
        )
    }

    /// True for the types wanbake can write computed `f32` results into.
    pub fn is_output_float(self) -> bool {
        matches!(self, DType::F16 | DType::BF16 | DType::F32)
    }

    /// Byte length of `numel` elements, overflow-checked; `None` on overflow or when the
    /// bit count is not a whole number of bytes.
    pub fn byte_len(self, numel: usize) -> Option<usize> {
        let bits = numel.checked_mul(self.bits())?;
        bits.is_multiple_of(8).then_some(bits / 8)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A conversion was asked for a dtype wanbake cannot compute on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "cannot convert {dtype} data {direction} f32 (supported: F64, F32, F16, BF16, F8_E4M3, F8_E5M2 in; F32, F16, BF16 out)"
)]
pub struct UnsupportedDType {
    /// The dtype that was asked for.
    pub dtype: DType,
    /// "to" (widening) or "from" (narrowing).
    pub direction: &'static str,
}

/// Runs `f` compiled for the widest vector instruction set `pulp` dispatches to on this CPU
/// (AVX2 on x86-64 when present, detected at run time; AVX-512 would need pulp's `x86-v4`
/// feature, which is off), so that a plain element loop inlined into `f` is auto-vectorised
/// for it. The result is the scalar code's: only the instruction width
/// changes, and every loop run this way is integer or exactly-rounded arithmetic.
#[inline(always)]
pub fn vectorized<R>(f: impl FnOnce() -> R) -> R {
    pulp::Arch::new().dispatch(f)
}

/// Widens little-endian `src` bytes of `dtype` into `dst` (one `f32` per element).
///
/// `src.len()` must be `dst.len() * dtype.size()`; the check is an assertion because the
/// caller derives both from a validated header.
#[track_caller]
pub fn widen_to_f32(dtype: DType, src: &[u8], dst: &mut [f32]) -> Result<(), UnsupportedDType> {
    let size = dtype
        .size()
        .filter(|_| dtype.is_float())
        .ok_or(UnsupportedDType {
            dtype,
            direction: "to",
        })?;
    assert_eq!(
        src.len(),
        dst.len() * size,
        "widen_to_f32: byte length does not match"
    );
    match dtype {
        DType::F32 => {
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *d = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        DType::BF16 => vectorized(|| {
            for (d, c) in dst.iter_mut().zip(src.as_chunks::<2>().0) {
                *d = f32::from_bits((u16::from_le_bytes(*c) as u32) << 16);
            }
        }),
        DType::F16 => widen_f16(src, dst),
        DType::F64 => {
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(8)) {
                let mut b = [0u8; 8];
                b.copy_from_slice(c);
                *d = f64::from_le_bytes(b) as f32;
            }
        }
        DType::F8_E4M3 => {
            let table = f8_table(F8Kind::E4M3);
            for (d, &b) in dst.iter_mut().zip(src) {
                *d = table[b as usize];
            }
        }
        DType::F8_E5M2 => {
            let table = f8_table(F8Kind::E5M2);
            for (d, &b) in dst.iter_mut().zip(src) {
                *d = table[b as usize];
            }
        }
        _ => unreachable!("is_float() covers the arms above"),
    }
    Ok(())
}

/// Widens to a fresh vector; see [`widen_to_f32`].
pub fn to_f32_vec(dtype: DType, src: &[u8]) -> Result<Vec<f32>, UnsupportedDType> {
    let size = dtype
        .size()
        .filter(|_| dtype.is_float())
        .ok_or(UnsupportedDType {
            dtype,
            direction: "to",
        })?;
    let mut out = vec![0f32; src.len() / size];
    widen_to_f32(dtype, &src[..out.len() * size], &mut out)?;
    Ok(out)
}

fn widen_f16(src: &[u8], dst: &mut [f32]) {
    // Reinterpret when aligned (the common case for our own and HF files), else copy.
    match bytemuck::try_cast_slice::<u8, f16>(src) {
        Ok(halfs) if cfg!(target_endian = "little") => halfs.convert_to_f32_slice(dst),
        _ => {
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32();
            }
        }
    }
}

/// Rounds one `f32` to bfloat16 bits, round-to-nearest-even; NaN stays a (quiet) NaN with
/// its sign, infinities stay infinities, overflow rounds to infinity as IEEE requires.
#[inline(always)]
pub fn round_to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    let rounded = (b.wrapping_add(0x7FFF + ((b >> 16) & 1)) >> 16) as u16;
    let nan = ((b >> 16) as u16) | 0x0040;
    if x.is_nan() { nan } else { rounded }
}

/// Rounds one `f32` to IEEE half bits, round-to-nearest-even (subnormals, overflow to
/// infinity and NaN handled as IEEE 754 specifies).
#[inline]
pub fn round_to_f16(x: f32) -> u16 {
    f16::from_f32(x).to_bits()
}

/// Narrows `src` into little-endian `dst` bytes of `dtype` with one round-to-nearest-even.
#[track_caller]
pub fn narrow_from_f32(dtype: DType, src: &[f32], dst: &mut [u8]) -> Result<(), UnsupportedDType> {
    let err = UnsupportedDType {
        dtype,
        direction: "from",
    };
    if !dtype.is_output_float() {
        return Err(err);
    }
    let size = dtype.size().ok_or(err)?;
    assert_eq!(
        dst.len(),
        src.len() * size,
        "narrow_from_f32: byte length does not match"
    );
    match dtype {
        DType::F32 => {
            for (c, &x) in dst.chunks_exact_mut(4).zip(src) {
                c.copy_from_slice(&x.to_le_bytes());
            }
        }
        DType::BF16 => vectorized(|| {
            for (c, &x) in dst.as_chunks_mut::<2>().0.iter_mut().zip(src) {
                *c = round_to_bf16(x).to_le_bytes();
            }
        }),
        DType::F16 => {
            let mut tmp = [f16::ZERO; 1024];
            for (cd, cs) in dst.chunks_mut(2048).zip(src.chunks(1024)) {
                let t = &mut tmp[..cs.len()];
                t.convert_from_f32_slice(cs);
                for (c, h) in cd.chunks_exact_mut(2).zip(t.iter()) {
                    c.copy_from_slice(&h.to_bits().to_le_bytes());
                }
            }
        }
        _ => unreachable!("is_output_float() covers the arms above"),
    }
    Ok(())
}

/// Narrows to a fresh byte vector; see [`narrow_from_f32`].
pub fn from_f32_vec(dtype: DType, src: &[f32]) -> Result<Vec<u8>, UnsupportedDType> {
    let size = dtype.size().unwrap_or(0);
    let mut out = vec![0u8; src.len() * size];
    narrow_from_f32(dtype, src, &mut out)?;
    Ok(out)
}

/// Converts between two float dtypes through `f32` (exact whenever the target is at least
/// as wide as the source, one RNE otherwise). Returns the input unchanged when the dtypes
/// match, so an untouched tensor is copied byte for byte.
pub fn convert_bytes(from: DType, to: DType, src: &[u8]) -> Result<Vec<u8>, UnsupportedDType> {
    if from == to {
        return Ok(src.to_vec());
    }
    let wide = to_f32_vec(from, src)?;
    from_f32_vec(to, &wide)
}

/// Value of a bf16 bit pattern.
pub fn bf16_to_f32(bits: u16) -> f32 {
    bf16::from_bits(bits).to_f32()
}

#[derive(Clone, Copy)]
enum F8Kind {
    E4M3,
    E5M2,
}

fn f8_table(kind: F8Kind) -> &'static [f32; 256] {
    use std::sync::OnceLock;
    static E4M3: OnceLock<[f32; 256]> = OnceLock::new();
    static E5M2: OnceLock<[f32; 256]> = OnceLock::new();
    let cell = match kind {
        F8Kind::E4M3 => &E4M3,
        F8Kind::E5M2 => &E5M2,
    };
    cell.get_or_init(|| {
        let mut t = [0f32; 256];
        for (i, v) in t.iter_mut().enumerate() {
            *v = decode_f8(kind, i as u8);
        }
        t
    })
}

/// Decodes the OCP FP8 formats (E4M3FN: no infinities, S.1111.111 = NaN; E5M2: IEEE-like).
fn decode_f8(kind: F8Kind, b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let (ebits, mbits, bias) = match kind {
        F8Kind::E4M3 => (4u32, 3u32, 7i32),
        F8Kind::E5M2 => (5, 2, 15),
    };
    let e = ((b as u32 >> mbits) & ((1 << ebits) - 1)) as i32;
    let m = (b as u32 & ((1 << mbits) - 1)) as f32;
    let emax = (1 << ebits) - 1;
    match kind {
        F8Kind::E4M3 if e == emax && m == 7.0 => return f32::NAN,
        F8Kind::E5M2 if e == emax => {
            return if m == 0.0 {
                sign * f32::INFINITY
            } else {
                f32::NAN
            };
        }
        _ => {}
    }
    let scale = (1u32 << mbits) as f32;
    if e == 0 {
        sign * (m / scale) * 2f32.powi(1 - bias)
    } else {
        sign * (1.0 + m / scale) * 2f32.powi(e - bias)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bf(x: u32) -> u16 {
        round_to_bf16(f32::from_bits(x))
    }

    #[test]
    fn bf16_exact_values_pass_through() {
        assert_eq!(round_to_bf16(1.0), 0x3F80);
        assert_eq!(round_to_bf16(-2.0), 0xC000);
        assert_eq!(round_to_bf16(0.0), 0x0000);
        assert_eq!(round_to_bf16(-0.0), 0x8000);
    }

    #[test]
    fn bf16_ties_go_to_even() {
        // 1.0 + half an ulp of bf16 (ulp = 2^-7): lower neighbour 0x3F80 is even -> stays.
        assert_eq!(bf(0x3F80_8000), 0x3F80);
        // 0x3F81 is odd; the tie above it rounds up to the even 0x3F82.
        assert_eq!(bf(0x3F81_8000), 0x3F82);
        // Just above / below a tie.
        assert_eq!(bf(0x3F80_8001), 0x3F81);
        assert_eq!(bf(0x3F80_7FFF), 0x3F80);
        // Negative tie.
        assert_eq!(bf(0xBF81_8000), 0xBF82);
    }

    #[test]
    fn bf16_subnormals_round_like_normals() {
        // Smallest f32 subnormal rounds to +0.
        assert_eq!(bf(0x0000_0001), 0x0000);
        // bf16 subnormal 0x0001 is f32 0x0001_0000; a tie above it (odd) rounds to 0x0002.
        assert_eq!(bf(0x0001_8000), 0x0002);
        assert_eq!(bf(0x0000_8000), 0x0000);
        assert_eq!(bf(0x0000_8001), 0x0001);
    }

    #[test]
    fn bf16_infinities_nan_and_max_finite() {
        assert_eq!(round_to_bf16(f32::INFINITY), 0x7F80);
        assert_eq!(round_to_bf16(f32::NEG_INFINITY), 0xFF80);
        // f32::MAX = 0x7F7FFFFF rounds up past the largest bf16 (0x7F7F) to infinity.
        assert_eq!(round_to_bf16(f32::MAX), 0x7F80);
        // Largest value that still rounds down to bf16 max finite.
        assert_eq!(bf(0x7F7F_7FFF), 0x7F7F);
        // Exactly halfway between bf16 max (odd mantissa) and infinity: rounds to inf.
        assert_eq!(bf(0x7F7F_8000), 0x7F80);
        // NaNs stay NaN, including a signalling NaN whose payload sits in the low bits only.
        for bits in [0x7FC0_0000u32, 0x7F80_0001, 0xFF80_0001, 0x7FFF_FFFF] {
            let r = bf(bits);
            assert!(
                f32::from_bits((r as u32) << 16).is_nan(),
                "{bits:#x} -> {r:#x}"
            );
            assert_eq!(r & 0x8000, ((bits >> 16) as u16) & 0x8000, "sign kept");
        }
    }

    #[test]
    fn f16_rounding_hand_picked() {
        assert_eq!(round_to_f16(1.0), 0x3C00);
        // 1 + 2^-11 is a tie between 0x3C00 (even) and 0x3C01.
        assert_eq!(round_to_f16(1.0 + 2f32.powi(-11)), 0x3C00);
        assert_eq!(round_to_f16(1.0 + 3.0 * 2f32.powi(-11)), 0x3C02);
        assert_eq!(round_to_f16(65504.0), 0x7BFF);
        // Halfway between max finite and the next step rounds to infinity.
        assert_eq!(round_to_f16(65520.0), 0x7C00);
        assert_eq!(round_to_f16(65519.996), 0x7BFF);
        // Smallest subnormal 2^-24 and a tie below it (2^-25 rounds to even 0).
        assert_eq!(round_to_f16(2f32.powi(-24)), 0x0001);
        assert_eq!(round_to_f16(2f32.powi(-25)), 0x0000);
        assert_eq!(round_to_f16(3.0 * 2f32.powi(-25)), 0x0002);
        assert_eq!(round_to_f16(f32::NEG_INFINITY), 0xFC00);
        assert!(f16::from_bits(round_to_f16(f32::NAN)).is_nan());
    }

    #[test]
    fn widen_then_narrow_is_identity_for_every_bf16_and_f16_pattern() {
        let all: Vec<u8> = (0..=u16::MAX).flat_map(|v| v.to_le_bytes()).collect();
        for dt in [DType::BF16, DType::F16] {
            let wide = to_f32_vec(dt, &all).unwrap();
            let back = from_f32_vec(dt, &wide).unwrap();
            for (i, (a, b)) in all.chunks(2).zip(back.chunks(2)).enumerate() {
                let x = wide[i];
                if x.is_nan() {
                    assert!(
                        dt == DType::BF16
                            && f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16)
                                .is_nan()
                            || dt == DType::F16
                                && f16::from_bits(u16::from_le_bytes([b[0], b[1]])).is_nan()
                    );
                } else {
                    assert_eq!(a, b, "{dt} pattern {i:#06x}");
                }
            }
        }
    }

    #[test]
    fn f8_decoding() {
        assert_eq!(decode_f8(F8Kind::E4M3, 0x38), 1.0);
        assert_eq!(decode_f8(F8Kind::E4M3, 0x7E), 448.0);
        assert!(decode_f8(F8Kind::E4M3, 0x7F).is_nan());
        assert_eq!(decode_f8(F8Kind::E4M3, 0x01), 2f32.powi(-9));
        assert_eq!(decode_f8(F8Kind::E5M2, 0x3C), 1.0);
        assert_eq!(decode_f8(F8Kind::E5M2, 0x7B), 57344.0);
        assert_eq!(decode_f8(F8Kind::E5M2, 0x7C), f32::INFINITY);
        assert_eq!(decode_f8(F8Kind::E5M2, 0xFC), f32::NEG_INFINITY);
    }

    #[test]
    fn dtype_spellings_round_trip() {
        for d in ALL_DTYPES {
            assert_eq!(DType::parse(d.as_str()), Some(d));
        }
        assert_eq!(DType::parse("bf16"), None);
        assert_eq!(DType::F4.byte_len(3), None);
        assert_eq!(DType::F4.byte_len(4), Some(2));
        assert_eq!(DType::F32.byte_len(usize::MAX), None);
    }
}
