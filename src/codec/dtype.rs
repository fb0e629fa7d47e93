//! Element types of safetensors files and the conversions wanbake performs on them.
//!
//! Owns: the `DType` enum (every dtype the safetensors format defines), the widening of
//! F64/F32/F16/BF16/F8 data to `f32`, the narrowing of `f32` to BF16/F16/F32 with one
//! round-to-nearest-even, and what each dtype holds: the magnitude its rounding takes to
//! infinity ([`held_limit`]), the branch-free checks of values ([`all_held`]) and stored
//! bytes ([`all_finite_bytes`]), and a tensor's values it cannot hold ([`Unheld`]). Does
//! not own: deciding *which* dtype a tensor gets (that is `layout::dtype_policy`), or what
//! a producer does with values refused (`pipeline::nonfinite`).
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

    /// Bytes that hold one element: its size for every whole-byte type, and 1 for the packed
    /// sub-byte types (F4, F6_*), whose storage is [`DType::byte_len`] of the element count.
    /// The one answer to "how many bytes per element" for a stride or a buffer of a type the
    /// caller checked is whole-byte.
    pub fn element_bytes(self) -> usize {
        self.bits().div_ceil(8)
    }

    /// Natural alignment in bytes, used to order tensors in written files.
    pub fn alignment(self) -> usize {
        self.element_bytes()
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
///
/// Mark the closure `#[inline(always)]`: pulp calls it from the function compiled for the
/// wider set, but a closure LLVM does not inline there stays a function of its own,
/// compiled for the baseline (SSE2), and nothing is widened (seen in `perf annotate` of
/// `fp8::amax` and `quant::encode::ErrorSum::add`).
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
        DType::BF16 => vectorized(
            #[inline(always)]
            || {
                for (d, c) in dst.iter_mut().zip(src.as_chunks::<2>().0) {
                    *d = f32::from_bits((u16::from_le_bytes(*c) as u32) << 16);
                }
            },
        ),
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
        DType::BF16 => vectorized(
            #[inline(always)]
            || {
                for (c, &x) in dst.as_chunks_mut::<2>().0.iter_mut().zip(src) {
                    *c = round_to_bf16(x).to_le_bytes();
                }
            },
        ),
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
    let mut out = vec![0u8; src.len() * dtype.element_bytes()];
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

/// The smallest magnitude that `dtype` cannot hold once rounded to it: an `f32` `x` is
/// written as a finite value of `dtype` exactly when `|x| < held_limit(dtype)` (NaN fails
/// every comparison, so it is never held). BF16: `0x7F7F8000` (its largest finite value
/// plus half an ulp, the tie that rounds to even, infinity); F16: 65520 (65504 plus half an
/// ulp); F32, and any dtype wanbake does not narrow to: `+inf` (every finite value).
pub fn held_limit(dtype: DType) -> f32 {
    match dtype {
        DType::BF16 => f32::from_bits(0x7F7F_8000),
        DType::F16 => 65520.0,
        _ => f32::INFINITY,
    }
}

/// The largest finite value of `dtype` (what an error says it holds), for BF16, F16 and
/// F32; `None` for the others.
pub fn largest_finite(dtype: DType) -> Option<f32> {
    match dtype {
        DType::BF16 => Some(bf16::MAX.to_f32()),
        DType::F16 => Some(f16::MAX.to_f32()),
        DType::F32 => Some(f32::MAX),
        _ => None,
    }
}

/// Is `x` held by a dtype whose [`held_limit`] is `limit` (`|x| < limit`; NaN never)?
#[inline(always)]
pub fn held(x: f32, limit: f32) -> bool {
    x.abs() < limit
}

/// True when every value is held by a dtype whose [`held_limit`] is `limit` (`|x| < limit`,
/// NaN never). No branch per element, so the loop vectorises; the check every merged band
/// and every converted tensor goes through before it is written.
#[inline]
pub fn all_held(values: &[f32], limit: f32) -> bool {
    vectorized(
        #[inline(always)]
        || values.iter().fold(true, |ok, &x| ok & held(x, limit)),
    )
}

/// True when no element of the little-endian `bytes` of `dtype` is NaN or infinite (an
/// exponent field of all ones; F8_E4M3: the S.1111.111 NaN). Dtypes without such values
/// (integers, the sub-byte and fnuz float formats, E8M0 scales) are always true. Whole
/// elements only: a trailing partial element is not looked at. No branch per element.
pub fn all_finite_bytes(dtype: DType, bytes: &[u8]) -> bool {
    match dtype {
        DType::BF16 => vectorized(
            #[inline(always)]
            || {
                (bytes.as_chunks::<2>().0.iter()).fold(true, |ok, c| {
                    ok & (u16::from_le_bytes(*c) & 0x7FFF < 0x7F80)
                })
            },
        ),
        DType::F16 => vectorized(
            #[inline(always)]
            || {
                (bytes.as_chunks::<2>().0.iter()).fold(true, |ok, c| {
                    ok & (u16::from_le_bytes(*c) & 0x7FFF < 0x7C00)
                })
            },
        ),
        DType::F32 => vectorized(
            #[inline(always)]
            || {
                (bytes.as_chunks::<4>().0.iter()).fold(true, |ok, c| {
                    ok & (u32::from_le_bytes(*c) & 0x7FFF_FFFF < 0x7F80_0000)
                })
            },
        ),
        DType::F64 => bytes.as_chunks::<8>().0.iter().fold(true, |ok, c| {
            ok & (u64::from_le_bytes(*c) & 0x7FFF_FFFF_FFFF_FFFF < 0x7FF0_0000_0000_0000)
        }),
        DType::F8_E4M3 => vectorized(
            #[inline(always)]
            || bytes.iter().fold(true, |ok, b| ok & (b & 0x7F != 0x7F)),
        ),
        DType::F8_E5M2 => vectorized(
            #[inline(always)]
            || bytes.iter().fold(true, |ok, b| ok & (b & 0x7F < 0x7C)),
        ),
        _ => true,
    }
}

/// Values of one tensor that its output cannot hold (NaN, ±inf, or finite beyond the
/// output's range): the first, where it is, and how many there are. Built band by band
/// ([`Unheld::scan`], [`Unheld::add`]) on the slow path only, once a band failed
/// [`all_held`] or [`all_finite_bytes`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Unheld {
    /// Flat index of the first such value (in the order the caller scans: the output
    /// tensor's, or the (out, in') view of a merged one).
    pub first: usize,
    /// Its value before rounding.
    pub value: f32,
    /// How many there are.
    pub count: usize,
}

impl Unheld {
    /// The values of `values` not below `limit` in magnitude (NaN included), the first at
    /// `offset + i`; `None` when there is none.
    pub fn scan(values: &[f32], limit: f32, offset: usize) -> Option<Unheld> {
        let mut found: Option<Unheld> = None;
        for (i, &x) in values.iter().enumerate() {
            if !held(x, limit) {
                match &mut found {
                    Some(u) => u.count += 1,
                    None => {
                        found = Some(Unheld {
                            first: offset + i,
                            value: x,
                            count: 1,
                        })
                    }
                }
            }
        }
        found
    }

    /// Adds `other`, found later in the same tensor (a later band), or earlier (out of
    /// order, as a stacked tensor's layers may finish): the first stays the lowest index.
    pub fn add(found: &mut Option<Unheld>, other: Option<Unheld>) {
        match (found.as_mut(), other) {
            (_, None) => {}
            (None, Some(o)) => *found = Some(o),
            (Some(f), Some(o)) => {
                if o.first < f.first {
                    f.first = o.first;
                    f.value = o.value;
                }
                f.count += o.count;
            }
        }
    }
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

    /// One answer per dtype: the whole-byte size where there is one; packed types take one
    /// byte for one element and `byte_len` for their storage (two F4 a byte).
    #[test]
    fn element_bytes_is_the_size_and_packed_types_store_by_byte_len() {
        for d in ALL_DTYPES {
            match d.size() {
                Some(n) => assert_eq!((d.element_bytes(), d.byte_len(3)), (n, Some(3 * n)), "{d}"),
                None => assert_eq!(d.element_bytes(), 1, "{d}"),
            }
        }
        assert_eq!(DType::F4.byte_len(4), Some(2));
        assert_eq!(DType::F6_E2M3.byte_len(4), Some(3));
        assert_eq!(DType::F4.byte_len(3), None);
    }

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

    #[test]
    fn held_limit_is_where_rounding_reaches_infinity() {
        let below = |x: f32| f32::from_bits(x.to_bits() - 1);
        for (dt, round, inf) in [
            (DType::BF16, round_to_bf16 as fn(f32) -> u16, 0x7F80u16),
            (DType::F16, round_to_f16 as fn(f32) -> u16, 0x7C00),
        ] {
            let l = held_limit(dt);
            assert_eq!(round(l), inf, "{dt}: the limit rounds to inf");
            assert_eq!(round(-l), inf | 0x8000, "{dt}: and its negative to -inf");
            assert_ne!(
                round(below(l)) & 0x7FFF,
                inf,
                "{dt}: just below it is finite"
            );
            assert!(all_held(&[below(l), -below(l), 0.0], l));
            assert!(!all_held(&[0.0, l], l) && !all_held(&[f32::NAN], l));
            assert_eq!(largest_finite(dt).map(|m| m < l), Some(true));
        }
        assert!(all_held(&[f32::MAX, f32::MIN], held_limit(DType::F32)));
        assert!(!all_held(&[f32::INFINITY], held_limit(DType::F32)));
    }

    #[test]
    fn all_finite_bytes_agrees_with_the_widened_values_for_every_pattern() {
        let all: Vec<u8> = (0..=u16::MAX).flat_map(|v| v.to_le_bytes()).collect();
        for dt in [DType::BF16, DType::F16, DType::F8_E4M3, DType::F8_E5M2] {
            let size = dt.size().unwrap();
            for (i, c) in all.chunks_exact(size).enumerate().take(1 << (8 * size)) {
                let x = to_f32_vec(dt, c).unwrap()[0];
                assert_eq!(all_finite_bytes(dt, c), x.is_finite(), "{dt} {i:#06x}");
            }
        }
        for x in [0.0f32, f32::MAX, f32::INFINITY, f32::NAN, -f32::INFINITY] {
            assert_eq!(
                all_finite_bytes(DType::F32, &x.to_le_bytes()),
                x.is_finite()
            );
            let d = x as f64;
            assert_eq!(
                all_finite_bytes(DType::F64, &d.to_le_bytes()),
                d.is_finite()
            );
        }
        assert!(all_finite_bytes(DType::I32, &f32::NAN.to_le_bytes()));
    }

    #[test]
    fn unheld_counts_and_keeps_the_lowest_first() {
        let v = [1.0, 70000.0, f32::NAN, -65520.0, 65519.0];
        let u = Unheld::scan(&v, held_limit(DType::F16), 10).unwrap();
        assert_eq!((u.first, u.value, u.count), (11, 70000.0, 3));
        assert_eq!(Unheld::scan(&v[4..], held_limit(DType::F16), 0), None);
        let mut found = None;
        Unheld::add(&mut found, Some(u));
        Unheld::add(&mut found, None);
        let earlier = Unheld {
            first: 2,
            value: f32::INFINITY,
            count: 2,
        };
        Unheld::add(&mut found, Some(earlier));
        let f = found.unwrap();
        assert_eq!((f.first, f.value, f.count), (2, f32::INFINITY, 5));
    }
}
