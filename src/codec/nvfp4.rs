//! The 4-bit element code E2M1 and comfy-kitchen's NVFP4 layout (block size 16, E4M3 block
//! scales in the cuBLAS swizzle, one f32 per-tensor scale).
//!
//! Owns: E2M1 in both directions, the NVFP4 decoder and encoder, and their size facts. Does not
//! own: the swizzle (`blocked`), the E4M3 code (`mxfp8`), which tensors carry which part or
//! where the logical shape comes from (`quant/`).
//!
//! References (comfy-kitchen 0.2.40 wheel):
//! - `backends/eager/quantization.py`, `dequantize_nvfp4(qx, per_tensor_scale, block_scales,
//!   output_type, hi_first=True)`: splits every byte into `hi = qx >> 4`, `lo = qx & 0x0F` and
//!   stacks `[hi, lo]`, so the **even** element is the **high** nibble; looks the codes up in
//!   `E2M1_LUT = [0, .5, 1, 1.5, 2, 3, 4, 6, -0, -.5, -1, -1.5, -2, -3, -4, -6]`; unswizzles
//!   with `from_blocked(block_scales, rows, cols // 16)` where `rows, cols` are the *stored*
//!   (unpacked) shape; computes `total = per_tensor.to(out) * block.to(out)` first and then
//!   `value * total` (with float32 as the output type: two f32 products in that order).
//! - `tensor/nvfp4.py`, `TensorCoreNVFP4Layout`: `Params._validate_tensor_fields` widens the
//!   per-tensor scale to float32; `state_dict_tensors` writes `weight` (the packed codes),
//!   the swizzled block scales and the per-tensor scale (their names: `quant::convention`);
//!   `quant::encode` computes `scale = amax(|W|) / (448·6)` and calls `quantize_nvfp4` with
//!   `pad_16x` when a dimension is not a multiple of 16; `get_padded_shape` is
//!   `(roundup(N,16), roundup(K,16))`, `get_storage_shape` `(roundup(N,16), roundup(K,16)/2)`.
//!   The **padded** codes are stored; the logical shape is not in the file.
//! - `tensor/base.py`, `QuantizedTensor.dequantize`: dequantizes the whole padded storage,
//!   then slices it to `params.orig_shape`; ComfyUI `comfy/ops.py` `_load_quantized_module`
//!   passes `orig_shape=module._orig_shape`, the Linear's `(out_features, in_features)` from the
//!   model definition.
//! - `backends/eager/quantization.py`, `quantize_nvfp4`: per block of 16, `max_abs / 6`, then
//!   `/ per_tensor`, `clamp(max=448)`, rounded through float8_e4m3fn (`_float8_round`), `total =
//!   per_tensor * that`; a block whose total is 0 gets codes 0; otherwise `x / total`, clamped to
//!   ±6, rounded by `float_utils.py` `_f32_to_floatx_unpacked(x, 2, 1)` (round to nearest even,
//!   saturating), packed by `pack_uint4(hi_first=True)`; block scales `to_blocked(fp8)`.

use super::blocked::{blocked_len, blocked_shape, from_blocked, to_blocked};
use super::fp8::{e4m3fn_to_f32, f32_to_e4m3fn};
use super::{CodecError, check_finite, check_len, check_multiple, mul, round_up};

/// NVFP4 block size along K.
pub const BLOCK: usize = 16;
/// The largest E2M1 magnitude.
pub const E2M1_MAX: f32 = 6.0;
/// `448 · 6`: the per-tensor scale is `amax / E4M3_E2M1_MAX`.
pub const E4M3_E2M1_MAX: f32 = 2688.0;

/// comfy-kitchen's `E2M1_LUT`: the value of each 4-bit code (bit 3 is the sign; code 8 is -0).
pub const E2M1: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// The value of a 4-bit E2M1 code (the low nibble of `code`).
#[inline]
pub fn e2m1_to_f32(code: u8) -> f32 {
    E2M1[usize::from(code & 0x0F)]
}

/// The E2M1 code of `x` as comfy-kitchen's `_f32_to_floatx_unpacked(x, 2, 1)` computes it:
/// round to nearest even, magnitudes `>= 6` saturate to 6, the sign kept (so `-0.0` → 8).
/// (NaN input is not meaningful there and is never passed here: encoders refuse it.)
#[inline]
pub fn f32_to_e2m1(x: f32) -> u8 {
    let bits = x.to_bits();
    let sign = bits & 0x8000_0000;
    let abs = bits ^ sign;
    let xa = f32::from_bits(abs);
    // Both roundings are computed and one is selected, so a loop over codes has no branch.
    // Below 1: adding 2^22 puts the f32 ulp at 0.5, the subnormal step; the addition rounds
    // to nearest even (denorm_exp = 149 in the reference).
    const DENORM: u32 = 149 << 23;
    let sub = (xa + f32::from_bits(DENORM)).to_bits().wrapping_sub(DENORM) as u8;
    // From 1: rebias 127 -> 1, round the 22 dropped mantissa bits to nearest even.
    let odd = (abs >> 22) & 1;
    let v = abs
        .wrapping_add(1u32.wrapping_sub(127) << 23)
        .wrapping_add((1 << 21) - 1)
        .wrapping_add(odd);
    let normal = (v >> 22) as u8;
    let code = match (xa >= E2M1_MAX, xa < 1.0) {
        (true, _) => 7,
        (false, true) => sub,
        (false, false) => normal,
    };
    code | ((sign >> 28) as u8 & 0x08)
}

/// The stored (padded) `[rows, cols]` in elements of a logical `[n, k]` NVFP4 weight; the
/// `weight` tensor is U8 `[rows, cols / 2]`.
pub fn stored_shape(n: usize, k: usize) -> Result<[usize; 2], CodecError> {
    Ok([
        round_up(n, BLOCK, "NVFP4 rows")?,
        round_up(k, BLOCK, "NVFP4 columns")?,
    ])
}

/// Bytes of the stored packed weight of a logical `[n, k]` weight (padded, two codes a byte).
pub fn storage_bytes(n: usize, k: usize) -> Option<usize> {
    let [r, c] = stored_shape(n, k).ok()?;
    r.checked_mul(c / 2)
}

/// Bytes of the swizzled F8_E4M3 block scales of a logical `[n, k]` weight.
pub fn scale_bytes(n: usize, k: usize) -> Option<usize> {
    let [r, c] = stored_shape(n, k).ok()?;
    blocked_len(r, c / BLOCK).ok()
}

fn check_shapes(
    weight: &[u8],
    block_scales: &[u8],
    stored: [usize; 2],
    logical: [usize; 2],
) -> Result<usize, CodecError> {
    let [rows, cols] = stored;
    check_multiple("NVFP4 stored columns", cols, BLOCK)?;
    check_len(
        "NVFP4 weight (bytes)",
        mul(rows, cols / 2, "NVFP4 weight size")?,
        weight.len(),
    )?;
    check_len(
        "NVFP4 block scales",
        blocked_len(rows, cols / BLOCK)?,
        block_scales.len(),
    )?;
    if logical[0] > rows || logical[1] > cols {
        return Err(CodecError::Shape { logical, stored });
    }
    mul(logical[0], logical[1], "NVFP4 logical size")
}

/// Decodes an NVFP4 weight into `out` (row-major `logical`), as comfy-kitchen's
/// `dequantize_nvfp4(qx, tensor_scale, block_scales, float32)` followed by
/// `QuantizedTensor.dequantize`'s crop to `orig_shape`: element `(r, c)` is
/// `E2M1[code] * (tensor_scale * e4m3(scale[r, c / 16]))`.
///
/// `weight` is the stored U8 tensor `[rows, cols / 2]` with `stored = [rows, cols]` in elements
/// (`cols` a multiple of 16); `block_scales` the stored swizzled F8_E4M3 bytes
/// (`128·⌈rows/128⌉ · 4·⌈(cols/16)/4⌉` of them); `tensor_scale` is the stored per-tensor scale widened to
/// f32. `logical` is the layer's `[out_features, in_features]`: the file does not hold it
/// (ComfyUI takes it from the model's Linear); pass `logical = stored` when it is not known
/// (for multiples of 16 they agree).
pub fn decode_into(
    weight: &[u8],
    block_scales: &[u8],
    tensor_scale: f32,
    stored: [usize; 2],
    logical: [usize; 2],
    out: &mut [f32],
) -> Result<(), CodecError> {
    let n = check_shapes(weight, block_scales, stored, logical)?;
    check_len("NVFP4 output", n, out.len())?;
    let [rows, cols] = stored;
    let nb = cols / BLOCK;
    let scales = from_blocked(block_scales, rows, nb)?;
    let totals: Vec<f32> = scales
        .iter()
        .map(|&s| tensor_scale * e4m3fn_to_f32(s))
        .collect();
    let [lr, lc] = logical;
    let half = cols / 2;
    // Compiled for the CPU's vector width: every operation is the scalar one, element-wise.
    super::dtype::vectorized(
        #[inline(always)]
        || {
            for r in 0..lr {
                let bytes = &weight[r * half..(r + 1) * half];
                let t = &totals[r * nb..(r + 1) * nb];
                let row = &mut out[r * lc..(r + 1) * lc];
                // Block by block (the last one may be cut by the logical width); the even
                // element is the high nibble.
                let blocks = row.chunks_mut(BLOCK).zip(bytes.chunks(BLOCK / 2)).zip(t);
                for ((blk, codes), &total) in blocks {
                    let block = |v: &mut [f32; BLOCK]| {
                        for (pair, &c) in v.chunks_exact_mut(2).zip(codes) {
                            pair[0] = e2m1_to_f32(c >> 4) * total;
                            pair[1] = e2m1_to_f32(c) * total;
                        }
                    };
                    // Whole blocks in place (a copy of a run-time length is a call).
                    match blk.first_chunk_mut::<BLOCK>() {
                        Some(whole) => block(whole),
                        None => {
                            let mut v = [0f32; BLOCK];
                            block(&mut v);
                            blk.copy_from_slice(&v[..blk.len()]);
                        }
                    }
                }
            }
        },
    );
    Ok(())
}

/// [`decode_into`] into a new buffer.
pub fn decode(
    weight: &[u8],
    block_scales: &[u8],
    tensor_scale: f32,
    stored: [usize; 2],
    logical: [usize; 2],
) -> Result<Vec<f32>, CodecError> {
    let n = check_shapes(weight, block_scales, stored, logical)?;
    let mut out = vec![0f32; n];
    decode_into(
        weight,
        block_scales,
        tensor_scale,
        stored,
        logical,
        &mut out,
    )?;
    Ok(out)
}

/// An encoded NVFP4 weight: what comfy-kitchen stores as the weight, its block scales and
/// its per-tensor scale.
#[derive(Clone, Debug, PartialEq)]
pub struct Nvfp4 {
    /// Packed codes (even element in the high nibble), row-major `[stored[0], stored[1] / 2]`.
    pub weight: Vec<u8>,
    /// F8_E4M3 block scales in the swizzled layout.
    pub block_scales: Vec<u8>,
    /// The per-tensor scale.
    pub tensor_scale: f32,
    /// The stored (padded) `[rows, cols]` in elements.
    pub stored: [usize; 2],
    /// The swizzled scale matrix's `[rows, cols]` (the block scales' tensor shape).
    pub scale_shape: [usize; 2],
}

/// `amax(|W|) / (448·6)` as one f32 division (`TensorCoreNVFP4Layout.quantize` on a float32
/// tensor; a bf16 tensor there rounds this quotient to bf16 before widening it).
pub fn tensor_scale_for(amax: f32) -> f32 {
    amax / E4M3_E2M1_MAX
}

/// Quantizes a row-major `[n, k]` f32 weight as `TensorCoreNVFP4Layout.quantize` does for a
/// float32 tensor (per-tensor scale from [`tensor_scale_for`]).
///
/// Refused: non-finite values, and an all-zero weight (the reference's per-tensor scale is 0,
/// its block scales `0/0` = NaN, so it writes NaN scales and garbage codes).
pub fn encode(w: &[f32], n: usize, k: usize) -> Result<Nvfp4, CodecError> {
    check_len("NVFP4 input", mul(n, k, "NVFP4 input size")?, w.len())?;
    check_finite(w)?;
    let amax = super::fp8::amax(w);
    if amax == 0.0 {
        return Err(CodecError::Unrepresentable(
            "NVFP4 of an all-zero weight: comfy-kitchen's per-tensor scale is 0 and its block \
             scales NaN"
                .into(),
        ));
    }
    encode_with_scale(w, n, k, tensor_scale_for(amax))
}

/// [`encode`] with a given per-tensor scale (comfy-kitchen's `quantize(tensor, scale=...)`).
/// The scale must be finite and positive.
pub fn encode_with_scale(
    w: &[f32],
    n: usize,
    k: usize,
    tensor_scale: f32,
) -> Result<Nvfp4, CodecError> {
    check_len("NVFP4 input", mul(n, k, "NVFP4 input size")?, w.len())?;
    check_finite(w)?;
    if !(tensor_scale.is_finite() && tensor_scale > 0.0) {
        return Err(CodecError::Unrepresentable(format!(
            "NVFP4 per-tensor scale {tensor_scale}: expected a finite positive value"
        )));
    }
    let [rows, cols] = stored_shape(n, k)?;
    let nb = cols / BLOCK;
    let mut weight = vec![0u8; mul(rows, cols / 2, "NVFP4 weight size")?];
    let mut scales = vec![0u8; mul(rows, nb, "NVFP4 scale size")?];
    // Compiled for the CPU's vector width: every operation is the scalar one, element-wise.
    super::dtype::vectorized(
        #[inline(always)]
        || {
            for r in 0..rows {
                for b in 0..nb {
                    let out = &mut weight[r * cols / 2 + b * BLOCK / 2..][..BLOCK / 2];
                    scales[r * nb + b] = encode_block(w, (n, k), (r, b), tensor_scale, out);
                }
            }
        },
    );
    Ok(Nvfp4 {
        weight,
        block_scales: to_blocked(&scales, rows, nb)?,
        tensor_scale,
        stored: [rows, cols],
        scale_shape: blocked_shape(rows, nb)?,
    })
}

/// Block `b` of row `r` of the logical `[n, k]` weight `w` (zeros past its edges, as the
/// reference pads): its packed codes into `out`, and its e4m3 block scale returned.
#[inline(always)]
fn encode_block(
    w: &[f32],
    (n, k): (usize, usize),
    (r, b): (usize, usize),
    tensor_scale: f32,
    out: &mut [u8],
) -> u8 {
    let mut block = [0f32; BLOCK];
    let c0 = b * BLOCK;
    if r < n && c0 + BLOCK <= k {
        // A constant length: moved inline, not by a call.
        block.copy_from_slice(&w[r * k + c0..][..BLOCK]);
    } else if r < n && c0 < k {
        let m = k - c0;
        block[..m].copy_from_slice(&w[r * k + c0..][..m]);
    }
    let max_abs = super::fp8::amax_in_lanes(&block);
    let scaled = (max_abs / E2M1_MAX / tensor_scale).min(448.0);
    let fp8 = f32_to_e4m3fn(scaled);
    let total = tensor_scale * e4m3fn_to_f32(fp8);
    if total == 0.0 {
        out.fill(0); // the reference forces +0 there
        return fp8;
    }
    let mut codes = [0u8; BLOCK];
    for (q, &x) in codes.iter_mut().zip(&block) {
        *q = f32_to_e2m1((x / total).clamp(-E2M1_MAX, E2M1_MAX));
    }
    for (o, pair) in out.iter_mut().zip(codes.chunks_exact(2)) {
        *o = (pair[0] << 4) | pair[1];
    }
    fp8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e2m1_table() {
        let want = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
        for (c, &v) in want.iter().enumerate() {
            assert_eq!(e2m1_to_f32(c as u8), v);
            assert_eq!(e2m1_to_f32(c as u8 | 8), -v);
            assert_eq!(f32_to_e2m1(v), c as u8);
            assert_eq!(f32_to_e2m1(-v), c as u8 | 8);
        }
        assert_eq!(e2m1_to_f32(8).to_bits(), (-0.0f32).to_bits());
        assert_eq!(e2m1_to_f32(0xF7), 6.0, "only the low nibble counts");
        // Ties to even: 0.25 -> 0, 0.75 -> 1.0, 1.25 -> 1.0, 1.75 -> 2.0, 2.5 -> 2, 3.5 -> 4,
        // 5 -> 4; beyond 6 saturates.
        for (x, c) in [
            (0.25, 0),
            (0.75, 2),
            (1.25, 2),
            (1.75, 4),
            (2.5, 4),
            (3.5, 6),
            (5.0, 6),
            (5.01, 7),
            (100.0, 7),
            (0.2, 0),
            (0.3, 1),
            (2.6, 5),
        ] {
            assert_eq!(f32_to_e2m1(x), c, "{x}");
            assert_eq!(f32_to_e2m1(-x), c | 8, "-{x}");
        }
    }

    #[test]
    fn nibble_order_and_hand_decode() {
        // 1 row of 16: byte 0x27 -> element 0 = code 2 (1.0, high nibble), element 1 = code 7 (6.0).
        let mut weight = vec![0u8; 8];
        weight[0] = 0x27;
        weight[7] = 0x9F; // elements 14 = -0.5, 15 = -6
        let scales = to_blocked(&[0x40], 1, 1).unwrap(); // e4m3 0x40 = 2.0
        let out = decode(&weight, &scales, 0.25, [1, 16], [1, 16]).unwrap();
        assert_eq!(out[0], 1.0 * (0.25 * 2.0));
        assert_eq!(out[1], 6.0 * 0.5);
        assert_eq!(out[14], -0.25);
        assert_eq!(out[15], -3.0);
        assert_eq!(out[2..14], [0.0; 12]);
    }

    #[test]
    fn multiplication_order_is_the_references() {
        // total = ts * block first, then value * total. Find a per-tensor scale where the
        // other order, (value * ts) * block, rounds differently, and check decode follows the
        // reference's order there.
        let bs = 0x3Bu8; // 1.375
        let scales = to_blocked(&[bs], 1, 1).unwrap();
        let weight = [0x50u8, 0, 0, 0, 0, 0, 0, 0]; // element 0 = code 5 (3.0)
        let ts = (1..10_000)
            .map(|i| 1.0f32 + i as f32 * 1.37e-4)
            .find(|&t| 3.0 * (t * 1.375) != (3.0 * t) * 1.375)
            .expect("some scale distinguishes the orders");
        let out = decode(&weight, &scales, ts, [1, 16], [1, 16]).unwrap();
        assert_eq!(out[0].to_bits(), (3.0f32 * (ts * 1.375f32)).to_bits());
        assert_ne!(out[0].to_bits(), ((3.0f32 * ts) * 1.375f32).to_bits());
    }

    #[test]
    fn errors_not_panics() {
        let w = vec![0u8; 8];
        let s = vec![0u8; 512];
        assert!(decode(&w, &s, 1.0, [1, 16], [1, 16]).is_ok());
        assert!(matches!(
            decode(&w, &s, 1.0, [1, 15], [1, 15]),
            Err(CodecError::NotDivisible { .. })
        ));
        assert!(matches!(
            decode(&w[1..], &s, 1.0, [1, 16], [1, 16]),
            Err(CodecError::Length { .. })
        ));
        assert!(matches!(
            decode(&w, &s[1..], 1.0, [1, 16], [1, 16]),
            Err(CodecError::Length { .. })
        ));
        assert!(matches!(
            decode(&w, &s, 1.0, [1, 16], [1, 17]),
            Err(CodecError::Shape { .. })
        ));
        assert!(matches!(
            decode(&w, &s, 1.0, [usize::MAX, 16], [1, 16]),
            Err(CodecError::Overflow { .. })
        ));
        assert!(matches!(
            decode(&w, &s, 1.0, [1, usize::MAX - 14], [1, 16]),
            Err(CodecError::Length { .. }) | Err(CodecError::NotDivisible { .. })
        ));
        assert!(matches!(
            encode(&[0.0; 16], 1, 16),
            Err(CodecError::Unrepresentable(_))
        ));
        assert!(matches!(
            encode(&[f32::INFINITY; 16], 1, 16),
            Err(CodecError::NonFinite { .. })
        ));
        assert!(encode_with_scale(&[1.0; 16], 1, 16, 0.0).is_err());
        assert!(encode(&[1.0; 15], 1, 16).is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(stored_shape(5120, 13824).unwrap(), [5120, 13824]);
        assert_eq!(storage_bytes(5120, 13824), Some(5120 * 6912));
        assert_eq!(scale_bytes(5120, 13824), Some(5120 * 864));
        assert_eq!(stored_shape(33, 70).unwrap(), [48, 80]);
        assert_eq!(storage_bytes(33, 70), Some(48 * 40));
        assert_eq!(scale_bytes(33, 70), Some(128 * 8));
        assert_eq!(storage_bytes(usize::MAX, 16), None);
    }

    #[test]
    fn encode_round_trip() {
        let (n, k) = (20, 40);
        let w: Vec<f32> = (0..n * k)
            .map(|i| ((i as f32) * 0.917).cos() * (0.01 + (i % 7) as f32 * 0.3))
            .collect();
        let e = encode(&w, n, k).unwrap();
        assert_eq!(e.stored, [32, 48]);
        assert_eq!(e.scale_shape, [128, 4]);
        assert_eq!(Some(e.weight.len()), storage_bytes(n, k));
        assert_eq!(Some(e.block_scales.len()), scale_bytes(n, k));
        let amax = w.iter().fold(0f32, |m, x| m.max(x.abs()));
        assert_eq!(e.tensor_scale, amax / 2688.0);
        let d = decode(&e.weight, &e.block_scales, e.tensor_scale, e.stored, [n, k]).unwrap();
        for r in 0..n {
            for b in 0..k.div_ceil(16) {
                let cols = b * 16..((b + 1) * 16).min(k);
                let m = w[r * k + cols.start..r * k + cols.end]
                    .iter()
                    .fold(0f32, |m, x| m.max(x.abs()));
                for c in cols {
                    let (a, x) = (w[r * k + c], d[r * k + c]);
                    // Half an E2M1 step at the top (1.0 of 6) plus the fp8 block-scale error.
                    assert!(
                        (a - x).abs() <= m / 6.0 * 1.07 + 1e-6,
                        "({r},{c}): {a} vs {x}"
                    );
                }
            }
        }
        // The padded region decodes to zero.
        let full = decode(
            &e.weight,
            &e.block_scales,
            e.tensor_scale,
            e.stored,
            e.stored,
        )
        .unwrap();
        assert!(full[n * 48..].iter().all(|&x| x == 0.0));
        assert!((0..n).all(|r| full[r * 48 + k..(r + 1) * 48].iter().all(|&x| x == 0.0)));
    }
}
