//! GGML's K-quant super-block codecs Q2_K, Q3_K, Q4_K, Q5_K and Q6_K, ported from ggml's
//! reference C so that the bytes are ggml's, bit for bit, on every machine.
//!
//! Owns: the 256-wide block encoders as `ggml_quantize_chunk` runs them without an importance
//! matrix (`quantize_qN_K(…, quant_weights = NULL)` → `quantize_row_qN_K_ref`), their helpers,
//! and the decoders (`dequantize_row_qN_K`). Does not own: which tensor gets which type (the
//! GGUF encoding's rules), type ids and sizes (`ggml`), or the container (`gguf`).
//!
//! The port follows `ggml/src/ggml-quants.c` of ggml 0.25.3 as vendored by llama-cpp-python
//! 0.3.36: llama.cpp b11312, commit `0c1e57098bba43ac29e6e3b677cdceebdd22334f`. Line numbers
//! below are lines of that file:
//!
//! | here | ggml | line |
//! |---|---|---|
//! | `nearest_int` | `nearest_int` | 621 |
//! | `make_qx_quants` | `make_qx_quants` (only `rmse_type = 1`, `qw = NULL`, as Q6_K calls it) | 628 |
//! | `make_q3_quants` | `make_q3_quants` (`do_rmse = true`, as Q3_K calls it) | 697 |
//! | `make_qkx2_quants` | `make_qkx2_quants` | 799 |
//! | `get_scale_min_k4` | `get_scale_min_k4` | 880 |
//! | [`quantize_q2_k`] / [`dequantize_q2_k`] | `quantize_row_q2_K_ref` / `dequantize_row_q2_K` | 891 / 961 |
//! | [`quantize_q3_k`] / [`dequantize_q3_k`] | `quantize_row_q3_K_ref` / `dequantize_row_q3_K` | 1229 / 1305 |
//! | [`quantize_q4_k`] / [`dequantize_q4_k`] | `quantize_row_q4_K_ref` / `dequantize_row_q4_K` | 1457 / 1529 |
//! | [`quantize_q5_k`] / [`dequantize_q5_k`] | `quantize_row_q5_K_ref` / `dequantize_row_q5_K` | 1644 / 1731 |
//! | [`quantize_q6_k`] / [`dequantize_q6_k`] | `quantize_row_q6_K_ref` / `dequantize_row_q6_K` | 1869 / 1939 |
//! | `fp32_to_fp16` / `fp16_to_fp32` | `ggml_compute_fp32_to_fp16` / `ggml_compute_fp16_to_fp32` (`ggml-impl.h`, what `GGML_FP32_TO_FP16` is in `libggml-base`) | 419 / 396 |
//!
//! The arithmetic is ggml's, operation for operation: every `+ − × ÷` is one f32 rounding in
//! C's evaluation order (left to right, `a*b*c` = `(a*b)*c`), no fused multiply-add (no
//! `mul_add` anywhere; Rust never contracts on its own), sums accumulated in ggml's element
//! order, `int → float` conversions where C promotes, and `int → uint8_t/int8_t` stores as
//! wrapping truncations (`as u8`/`as i8`). `libggml-base` is compiled with `-O3` and no
//! `-march`, so ggml itself does not contract either (spec quant_formats.md K.4).
//!
//! Inputs are expected finite (the callers refuse NaN/inf weights); finite inputs of any size
//! are encoded as ggml encodes them, including `nearest_int` arguments beyond its ±4194303 range
//! (where ggml reads the mantissa bits of a sum that no longer has the magic exponent; Q2_K,
//! Q4_K and Q5_K get there when one sub-block's large offset makes `dmin` coarse next to a
//! narrow sub-block's step) and f16 scales that overflow to infinity.
//!
//! Speed without changing a bit: the sub-blocks of a super-block are independent, so each
//! search (`make_qkx2_quants`, `make_qx_quants`, `make_q3_quants`) runs ggml's sequential loop
//! on all of them at once, one sub-block per vector lane (`lanes`: 16 lanes for Q2_K, Q3_K,
//! Q6_K; for Q4_K/Q5_K, whose 8 sub-blocks fill one AVX2 register, two super-blocks at a time,
//! so that each trial's chains of dependent sums have a second chain to overlap with), each
//! lane doing ggml's f32 operations in ggml's order and every `if` a per-lane select. This replaced trial scales in lanes, which had to restart a batch
//! whenever a winner moved Q4_K/Q5_K's `min` (5.2 batches per sub-block where 3 would do);
//! lanes of sub-blocks restart nothing. `ggml::quantize` runs the block loop compiled for the
//! CPU's widest vector set (`pulp`'s run-time dispatch). Everything per block lives on the
//! stack.

#![allow(non_snake_case)] // ggml's names: L, Laux, D

mod lanes;

use lanes::{M, V, to_lanes};

/// Elements per K-quant super-block (`QK_K`).
pub const QK_K: usize = 256;

/// `GROUP_MAX_EPS`: a (sub-)block whose largest |x| is below this counts as all zero.
const GROUP_MAX_EPS: f32 = 1e-15;

/// ggml's `nearest_int`: adds 1.5·2²³ and reads the low 23 bits, i.e. round half to even for
/// |x| ≤ 4194303. Beyond that ggml's `assert` is compiled out and the same bits are read, which
/// this reproduces (and so does NaN: it gives 0).
#[inline(always)]
fn nearest_int(fval: f32) -> i32 {
    let val = fval + 12582912.0;
    let i = val.to_bits() as i32;
    (i & 0x007f_ffff) - 0x0040_0000
}

/// `MAX(lo, MIN(hi, l))`.
#[inline(always)]
fn clampi(l: i32, lo: i32, hi: i32) -> i32 {
    lo.max(hi.min(l))
}

/// `ggml_compute_fp32_to_fp16`: round to nearest even (Maratyszcza's FP16 algorithm), the
/// bit-for-bit routine `GGML_FP32_TO_FP16` is in `libggml-base`.
#[inline(always)]
fn fp32_to_fp16(f: f32) -> u16 {
    let scale_to_inf = f32::from_bits(0x7780_0000); // 0x1.0p+112f
    let scale_to_zero = f32::from_bits(0x0880_0000); // 0x1.0p-110f
    let mut base = (f.abs() * scale_to_inf) * scale_to_zero;
    let w = f.to_bits();
    let shl1_w = w.wrapping_add(w);
    let sign = w & 0x8000_0000;
    let mut bias = shl1_w & 0xFF00_0000;
    if bias < 0x7100_0000 {
        bias = 0x7100_0000;
    }
    #[allow(clippy::assign_op_pattern)] // ggml's operand order
    {
        base = f32::from_bits((bias >> 1) + 0x0780_0000) + base;
    }
    let bits = base.to_bits();
    let exp_bits = (bits >> 13) & 0x0000_7C00;
    let mantissa_bits = bits & 0x0000_0FFF;
    let nonsign = exp_bits + mantissa_bits;
    ((sign >> 16)
        | if shl1_w > 0xFF00_0000 {
            0x7E00
        } else {
            nonsign
        }) as u16
}

/// `ggml_compute_fp16_to_fp32` (exact).
#[inline(always)]
fn fp16_to_fp32(h: u16) -> f32 {
    let w = (h as u32) << 16;
    let sign = w & 0x8000_0000;
    let two_w = w.wrapping_add(w);
    let exp_offset: u32 = 0xE0 << 23;
    let exp_scale = f32::from_bits(0x0780_0000); // 0x1.0p-112f
    let normalized_value = f32::from_bits((two_w >> 4) + exp_offset) * exp_scale;
    let magic_mask: u32 = 126 << 23;
    let magic_bias = 0.5f32;
    let denormalized_value = f32::from_bits((two_w >> 17) | magic_mask) - magic_bias;
    let denormalized_cutoff: u32 = 1 << 27;
    let result = sign
        | if two_w < denormalized_cutoff {
            denormalized_value.to_bits()
        } else {
            normalized_value.to_bits()
        };
    f32::from_bits(result)
}

#[inline(always)]
fn get_f16(b: &[u8]) -> f32 {
    fp16_to_fp32(u16::from_le_bytes([b[0], b[1]]))
}

#[inline(always)]
fn put_f16(b: &mut [u8], h: u16) {
    b[..2].copy_from_slice(&h.to_le_bytes());
}

/// Per lane, ggml's `max` (the element of largest |x|, the first of equals) and whether the
/// sub-block counts as zero (`amax < GROUP_MAX_EPS`).
#[inline(always)]
fn signed_max<const N: usize, const W: usize>(x: &[V<W>; N]) -> (V<W>, M<W>) {
    let mut max = V::splat(0.0);
    let mut amax = V::splat(0.0);
    for &xi in x {
        let ax = xi.abs();
        let more = ax.gt(amax);
        amax = more.select(ax, amax);
        max = more.select(xi, max);
    }
    (max, amax.lt(V::splat(GROUP_MAX_EPS)))
}

/// ggml's `make_qx_quants(n, nmax, x, L, rmse_type = 1, qw = NULL)` on `W` sub-blocks at
/// once, one per lane (`x[i]`: element `i` of every sub-block, see [`to_lanes`]): per
/// sub-block a symmetric scale searched over 19 candidates `−(nmax + 0.1·is)/max`, weights
/// `x²`. Writes `L[N·j + i]` (codes offset by `nmax`) and returns the scales.
///
/// Each lane runs ggml's loop as written (`is = −9 … 9` in order, sums in element order); the
/// winner's codes are recomputed once from its `iscale` (ggml rewrites `L` at every
/// improvement; the last one stands).
#[inline(always)]
fn make_qx_quants<const N: usize, const W: usize>(nmax: i32, x: &[V<W>; N], L: &mut [i8]) -> V<W> {
    let (max, zero_block) = signed_max(x);
    let zero = V::splat(0.0);
    let nmaxf = nmax as f32;
    let (lo, hi) = (-nmaxf, (nmax - 1) as f32);
    let mut w = *x;
    let mut wx = *x;
    for i in 0..N {
        w[i] = x[i] * x[i];
        wx[i] = w[i] * x[i];
    }
    let mut best_is = V::splat(-nmaxf) / max;
    let (sumlx, suml2) = qx_sums(x, &w, &wx, best_is, lo, hi);
    let mut scale = suml2.ne(zero).select(sumlx / suml2, zero);
    let mut best = scale * sumlx;
    for is in (-9i32..=9).filter(|&is| is != 0) {
        let iscale = V::splat(-(nmaxf + 0.1f32 * is as f32)) / max;
        let (slx, sl2) = qx_sums(x, &w, &wx, iscale, lo, hi);
        let win = sl2.gt(zero) & (slx * slx).gt(best * sl2);
        scale = win.select(slx / sl2, scale);
        best = win.select(scale * slx, best);
        best_is = win.select(iscale, best_is);
    }
    for i in 0..N {
        let l = zero_block.select(V::splat(-nmaxf), (best_is * x[i]).code(lo, hi));
        for k in 0..W {
            L[N * k + i] = (l.0[k] as i32 + nmax) as i8;
        }
    }
    zero_block.select(zero, scale)
}

/// One [`make_qx_quants`] trial per lane: `(Σ w·x·l, Σ w·l²)` in element order, `l` the codes
/// of `iscale·x` clamped to `[lo, hi]` (a function, not a closure: a closure
/// may be compiled out of line, without the dispatched instruction set).
#[inline(always)]
fn qx_sums<const N: usize, const W: usize>(
    x: &[V<W>; N],
    w: &[V<W>; N],
    wx: &[V<W>; N],
    iscale: V<W>,
    lo: f32,
    hi: f32,
) -> (V<W>, V<W>) {
    let (mut slx, mut sl2) = (V::splat(0.0), V::splat(0.0));
    for i in 0..N {
        let l = (iscale * x[i]).code(lo, hi);
        slx = slx + wx[i] * l;
        sl2 = sl2 + w[i] * l * l;
    }
    (slx, sl2)
}

/// ggml's `make_q3_quants(n, nmax, x, L, do_rmse = true)` on `W` sub-blocks at once, one per
/// lane (`x[i]`: element `i` of every sub-block): codes `−nmax/max·x` refined by coordinate
/// descent on the weighted (`x²`) least-squares fit. Writes `L[N·j + i]` (codes offset by
/// `nmax`) and returns the scales.
///
/// Each lane runs ggml's passes as written, every `if` a per-lane select. ggml stops a
/// sub-block after a pass that changed nothing; here the passes go on until no lane changed
/// (at most 5), which leaves a finished lane as it was: a pass that changed nothing starts and
/// ends in the same state, so running it again changes nothing either.
#[inline(always)]
fn make_q3_quants<const N: usize, const W: usize>(nmax: i32, x: &[V<W>; N], L: &mut [i8]) -> V<W> {
    let (max, zero_block) = signed_max(x);
    let zero = V::splat(0.0);
    let nmaxf = nmax as f32;
    let (lo, hi) = (-nmaxf, (nmax - 1) as f32);
    let iscale = V::splat(-nmaxf) / max;
    let mut w = *x;
    let mut wx = *x;
    let mut l = *x;
    let (mut sumlx, mut suml2) = (zero, zero);
    for i in 0..N {
        w[i] = x[i] * x[i];
        wx[i] = w[i] * x[i];
        l[i] = (iscale * x[i]).code(lo, hi);
        sumlx = sumlx + wx[i] * l[i];
        suml2 = suml2 + w[i] * l[i] * l[i];
    }
    for _itry in 0..5 {
        let mut changed = M([0; W]);
        for i in 0..N {
            let li = l[i];
            let slx = sumlx - wx[i] * li;
            let sl2 = suml2 - w[i] * li * li;
            let new_l = (x[i] * sl2 / slx).code(lo, hi);
            let slx_new = slx + wx[i] * new_l;
            let sl2_new = sl2 + w[i] * new_l * new_l;
            let better = (slx_new * slx_new * suml2).gt(sumlx * sumlx * sl2_new);
            let take = slx.gt(zero) & new_l.ne(li) & sl2_new.gt(zero) & better;
            l[i] = take.select(new_l, li);
            sumlx = take.select(slx_new, sumlx);
            suml2 = take.select(sl2_new, suml2);
            changed = changed | take;
        }
        if !changed.any() {
            break;
        }
    }
    for i in 0..N {
        let li = zero_block.select(V::splat(-nmaxf), l[i]);
        for k in 0..W {
            L[N * k + i] = (li.0[k] as i32 + nmax) as i8;
        }
    }
    (suml2.gt(zero) & !zero_block).select(sumlx / suml2, zero)
}

/// ggml's `make_qkx2_quants` on `W` sub-blocks at once, one per lane (`x[i]`: element `i` of
/// every sub-block, see [`to_lanes`]): per sub-block an affine fit `x ≈ scale·L − the_min`
/// (`the_min ≥ 0`) with codes in `[0, nmax]`, the step searched over `nstep + 1` candidates
/// `(rmin + rdelta·is + nmax)/(max − min)` against weighted squared (or absolute, `use_mad`)
/// error. Writes `L[N·j + i]` and returns `(scale, the_min)` per lane.
///
/// Each lane runs ggml's loop as written, trial after trial with its own moving `min` and
/// element sums in ggml's order; the sub-blocks of a super-block are independent, so nothing
/// is speculated or re-evaluated (an earlier version put trial scales in lanes and restarted
/// a batch whenever a winner moved `min`). Every `if` is a per-lane select, and the winner's
/// codes are recomputed once at the end from its `iscale` and `min` instead of being copied
/// at every improvement.
#[inline(always)]
fn make_qkx2_quants<const N: usize, const W: usize>(
    p: Qkx2,
    x: &[V<W>; N],
    weights: &[V<W>; N],
    L: &mut [u8],
) -> (V<W>, V<W>) {
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..N {
        min = x[i].lt(min).select(x[i], min);
        max = x[i].gt(max).select(x[i], max);
        sum_w = sum_w + weights[i];
        sum_x = sum_x + weights[i] * x[i];
    }
    let zero = V::splat(0.0);
    min = min.gt(zero).select(zero, min);
    let flat = max.eq(min);
    let min0 = min;
    let nmaxf = p.nmax as f32;
    let mut best_is = V::splat(nmaxf) / (max - min);
    let mut scale = V::splat(1.0) / best_is;
    let mut best_m = min;
    let mut laux = [zero; N];
    for i in 0..N {
        laux[i] = (best_is * (x[i] - min)).code(0.0, nmaxf);
    }
    let mut best_error = qkx2_error(p.use_mad, x, weights, scale, min, &laux);
    let nstep = if p.nstep < 1 { -1 } else { p.nstep }; // ggml returns before the search
    for is in 0..=nstep {
        let iscale = V::splat(p.rmin + p.rdelta * is as f32 + nmaxf) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (zero, zero, zero);
        for i in 0..N {
            let l = (iscale * (x[i] - min)).code(0.0, nmaxf);
            laux[i] = l;
            let wl = weights[i] * l;
            sum_l = sum_l + wl;
            sum_l2 = sum_l2 + wl * l;
            sum_xl = sum_xl + wl * x[i];
        }
        let D = sum_w * sum_l2 - sum_l * sum_l;
        let this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
        let this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
        let pos = this_min.gt(zero);
        let this_min = pos.select(zero, this_min);
        let this_scale = pos.select(sum_xl / sum_l2, this_scale);
        let cur_error = qkx2_error(p.use_mad, x, weights, this_scale, this_min, &laux);
        let win = D.gt(zero) & cur_error.lt(best_error);
        best_error = win.select(cur_error, best_error);
        scale = win.select(this_scale, scale);
        best_is = win.select(iscale, best_is);
        best_m = win.select(min, best_m);
        min = win.select(this_min, min);
    }
    for i in 0..N {
        let l = flat.select(zero, (best_is * (x[i] - best_m)).code(0.0, nmaxf));
        for k in 0..W {
            L[N * k + i] = l.0[k] as u8;
        }
    }
    let scale = flat.select(zero, scale);
    let min = flat.select(min0, min);
    (scale, -min)
}

/// `Σ w·|scale·l + min − x|` (`use_mad`) or `Σ w·(scale·l + min − x)²` over the elements in
/// ggml's order, per lane, `l` the codes.
#[inline(always)]
fn qkx2_error<const N: usize, const W: usize>(
    use_mad: bool,
    x: &[V<W>; N],
    weights: &[V<W>; N],
    scale: V<W>,
    min: V<W>,
    l: &[V<W>; N],
) -> V<W> {
    let mut err = V::splat(0.0);
    for i in 0..N {
        let diff = scale * l[i] + min - x[i];
        let diff = if use_mad { diff.abs() } else { diff * diff };
        err = err + weights[i] * diff;
    }
    err
}

/// The constant arguments of [`make_qkx2_quants`] (ggml's `nmax, rmin, rdelta, nstep,
/// use_mad`).
#[derive(Clone, Copy)]
struct Qkx2 {
    nmax: i32,
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
}

/// ggml's `get_scale_min_k4`: the 6-bit scale and min of sub-block `j` from the 12 packed
/// bytes of Q4_K/Q5_K.
#[inline(always)]
fn get_scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Bytes of one Q2_K block: scales\[16\], qs\[64\], d, dmin.
pub const Q2_K_BYTES: usize = 84;
/// Bytes of one Q3_K block: hmask\[32\], qs\[64\], scales\[12\], d.
pub const Q3_K_BYTES: usize = 110;
/// Bytes of one Q4_K block: d, dmin, scales\[12\], qs\[128\].
pub const Q4_K_BYTES: usize = 144;
/// Bytes of one Q5_K block: d, dmin, scales\[12\], qh\[32\], qs\[128\].
pub const Q5_K_BYTES: usize = 176;
/// Bytes of one Q6_K block: ql\[128\], qh\[64\], scales\[16\], d.
pub const Q6_K_BYTES: usize = 210;

/// `quantize_row_q2_K_ref` on one super-block: 16 sub-blocks of 16, 2-bit codes, 4-bit scales
/// and mins, `|x|`-weighted absolute-error search.
#[track_caller]
#[inline(always)]
pub fn quantize_q2_k(x: &[f32; QK_K], y: &mut [u8]) {
    assert_eq!(y.len(), Q2_K_BYTES, "Q2_K block bytes");
    let mut L = [0u8; QK_K];
    let q4scale = 15f32;
    let mut max_scale = 0f32;
    let mut max_min = 0f32;
    let xt = to_lanes::<16, 16>(x);
    let mut weights = xt;
    for w in &mut weights {
        *w = w.abs();
    }
    let p = Qkx2 {
        nmax: 3,
        rmin: -0.5,
        rdelta: 0.1,
        nstep: 15,
        use_mad: true,
    };
    let (V(scales), V(mins)) = make_qkx2_quants::<16, 16>(p, &xt, &weights, &mut L);
    for (&s, &m) in scales.iter().zip(&mins) {
        if s > max_scale {
            max_scale = s;
        }
        if m > max_min {
            max_min = m;
        }
    }
    let (sc, rest) = y.split_at_mut(QK_K / 16);
    let (qs, dd) = rest.split_at_mut(QK_K / 4);
    if max_scale > 0.0 {
        let iscale = q4scale / max_scale;
        for j in 0..QK_K / 16 {
            sc[j] = nearest_int(iscale * scales[j]) as u8;
        }
        put_f16(&mut dd[..2], fp32_to_fp16(max_scale / q4scale));
    } else {
        sc.fill(0);
        put_f16(&mut dd[..2], fp32_to_fp16(0.0));
    }
    if max_min > 0.0 {
        let iscale = q4scale / max_min;
        for j in 0..QK_K / 16 {
            let l = nearest_int(iscale * mins[j]);
            sc[j] |= (l << 4) as u8;
        }
        put_f16(&mut dd[2..4], fp32_to_fp16(max_min / q4scale));
    } else {
        put_f16(&mut dd[2..4], fp32_to_fp16(0.0));
    }
    let dall = get_f16(&dd[..2]);
    let dmin = get_f16(&dd[2..4]);
    for j in 0..QK_K / 16 {
        let d = dall * (sc[j] & 0xF) as f32;
        if d == 0.0 {
            continue;
        }
        let dm = dmin * (sc[j] >> 4) as f32;
        for ii in 0..16 {
            let l = nearest_int((x[16 * j + ii] + dm) / d);
            L[16 * j + ii] = clampi(l, 0, 3) as u8;
        }
    }
    for j in (0..QK_K).step_by(128) {
        for l in 0..32 {
            qs[j / 4 + l] =
                L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6);
        }
    }
}

/// `dequantize_row_q2_K` on one super-block: `d·sc·q − dmin·m`.
#[track_caller]
#[inline(always)]
pub fn dequantize_q2_k(b: &[u8], y: &mut [f32; QK_K]) {
    assert_eq!(b.len(), Q2_K_BYTES, "Q2_K block bytes");
    let (sc, rest) = b.split_at(QK_K / 16);
    let (q, dd) = rest.split_at(QK_K / 4);
    let d = get_f16(&dd[..2]);
    let min = get_f16(&dd[2..4]);
    let mut is = 0;
    let mut o = 0;
    for n in (0..QK_K).step_by(128) {
        let q = &q[n / 4..];
        for shift in [0u32, 2, 4, 6] {
            for half in 0..2 {
                let s = sc[is];
                is += 1;
                let dl = d * (s & 0xF) as f32;
                let ml = min * (s >> 4) as f32;
                for l in 0..16 {
                    let c = ((q[l + 16 * half] >> shift) & 3) as f32;
                    y[o] = dl * c - ml;
                    o += 1;
                }
            }
        }
    }
}

/// `quantize_row_q3_K_ref` on one super-block: 16 sub-blocks of 16, 3-bit signed codes (high
/// bit in `hmask`), 6-bit signed scales.
#[track_caller]
#[inline(always)]
pub fn quantize_q3_k(x: &[f32; QK_K], y: &mut [u8]) {
    assert_eq!(y.len(), Q3_K_BYTES, "Q3_K block bytes");
    let mut L = [0i8; QK_K];
    let V(scales) = make_q3_quants::<16, 16>(4, &to_lanes(x), &mut L);
    let mut max_scale = 0f32;
    let mut amax = 0f32;
    for &s in &scales {
        if s.abs() > amax {
            amax = s.abs();
            max_scale = s;
        }
    }
    let (hmask, rest) = y.split_at_mut(QK_K / 8);
    let (qs, rest) = rest.split_at_mut(QK_K / 4);
    let (sc, dd) = rest.split_at_mut(12);
    sc.fill(0);
    if max_scale != 0.0 {
        let iscale = -32f32 / max_scale;
        for j in 0..QK_K / 16 {
            let l = nearest_int(iscale * scales[j]) as i8 as i32;
            let l = (clampi(l, -32, 31) + 32) as i8 as i32;
            if j < 8 {
                sc[j] = (l & 0xF) as u8;
            } else {
                sc[j - 8] |= ((l & 0xF) << 4) as u8;
            }
            let l = l >> 4;
            sc[j % 4 + 8] |= (l << (2 * (j / 4))) as u8;
        }
        put_f16(dd, fp32_to_fp16(1.0 / iscale));
    } else {
        put_f16(dd, fp32_to_fp16(0.0));
    }
    let dall = get_f16(dd);
    for j in 0..QK_K / 16 {
        let d = dall * q3_scale(sc, j) as f32;
        if d == 0.0 {
            continue;
        }
        for ii in 0..16 {
            let l = nearest_int(x[16 * j + ii] / d);
            L[16 * j + ii] = (clampi(l, -4, 3) + 4) as i8;
        }
    }
    hmask.fill(0);
    let mut m = 0;
    let mut hm = 1u8;
    for l in L.iter_mut() {
        if *l > 3 {
            hmask[m] |= hm;
            *l -= 4;
        }
        m += 1;
        if m == QK_K / 8 {
            m = 0;
            hm <<= 1;
        }
    }
    for j in (0..QK_K).step_by(128) {
        for l in 0..32 {
            let v = L[j + l] as i32
                | (L[j + l + 32] as i32) << 2
                | (L[j + l + 64] as i32) << 4
                | (L[j + l + 96] as i32) << 6;
            qs[j / 4 + l] = v as u8;
        }
    }
}

/// The signed 6-bit scale of sub-block `j` of a Q3_K block (as both ggml's quantizer and its
/// `kmask` unpacking read it).
#[inline(always)]
fn q3_scale(sc: &[u8], j: usize) -> i32 {
    let lo = if j < 8 { sc[j] & 0xF } else { sc[j - 8] >> 4 } as i32;
    (lo | (((sc[8 + j % 4] >> (2 * (j / 4))) & 3) as i32) << 4) - 32
}

/// `dequantize_row_q3_K` on one super-block: `d·sc·(q − 4·!hbit)`.
#[track_caller]
#[inline(always)]
pub fn dequantize_q3_k(b: &[u8], y: &mut [f32; QK_K]) {
    assert_eq!(b.len(), Q3_K_BYTES, "Q3_K block bytes");
    let (hm, rest) = b.split_at(QK_K / 8);
    let (q, rest) = rest.split_at(QK_K / 4);
    let (sc, dd) = rest.split_at(12);
    let d_all = get_f16(dd);
    let mut m = 1u8;
    let mut is = 0;
    let mut o = 0;
    for n in (0..QK_K).step_by(128) {
        let q = &q[n / 4..];
        for shift in [0u32, 2, 4, 6] {
            for half in 0..2 {
                let dl = d_all * q3_scale(sc, is) as f32;
                is += 1;
                for l in 16 * half..16 * half + 16 {
                    let c = ((q[l] >> shift) & 3) as i32 - if hm[l] & m != 0 { 0 } else { 4 };
                    y[o] = dl * c as f32;
                    o += 1;
                }
            }
            m <<= 1;
        }
    }
}

/// Q4_K (`BITS = 4`) and Q5_K (`BITS = 5`): `quantize_row_q4_K_ref` / `quantize_row_q5_K_ref`
/// on `W / 8` consecutive super-blocks (one or two: `x` holds `32·W` values, `y` their
/// blocks), searched together as `W` lanes of sub-blocks. Per super-block, 8 sub-blocks of 32,
/// weights `sqrt(mean x²) + |x|`, 6-bit scales and mins.
#[inline(always)]
fn quantize_q45_k<const BITS: u32, const W: usize>(x: &[f32], y: &mut [u8]) {
    const { assert!(W == 8 || W == 16, "one or two super-blocks") };
    let nmax = (1i32 << BITS) - 1;
    let (rmin, nstep) = if BITS == 4 {
        (-1.0f32, 20)
    } else {
        (-0.5f32, 15)
    };
    let mut L = [0u8; 2 * QK_K];
    let xt = to_lanes::<32, W>(x);
    let mut sum_x2 = V::splat(0.0);
    for r in xt {
        sum_x2 = sum_x2 + r * r;
    }
    let av_x = (sum_x2 / V::splat(32.0)).sqrt();
    let mut weights = xt;
    for w in &mut weights {
        *w = av_x + w.abs();
    }
    let p = Qkx2 {
        nmax,
        rmin,
        rdelta: 0.1,
        nstep,
        use_mad: false,
    };
    let (V(scales), V(mins)) = make_qkx2_quants::<32, W>(p, &xt, &weights, &mut L);
    let bytes = y.len() / (W / 8);
    let blocks = y.chunks_exact_mut(bytes).zip(x.chunks_exact(QK_K));
    for (b, (y, x)) in blocks.enumerate() {
        let x: &[f32; QK_K] = x.try_into().expect("chunks_exact(QK_K)");
        let sub = 8 * b..8 * b + 8;
        let L = &mut L[QK_K * b..QK_K * (b + 1)];
        finish_q45_k::<BITS>(x, &scales[sub.clone()], &mins[sub], L, y);
    }
}

/// The scales, mins and codes of one Q4_K/Q5_K super-block from its sub-blocks' search.
#[inline(always)]
fn finish_q45_k<const BITS: u32>(
    x: &[f32; QK_K],
    scales: &[f32],
    mins: &[f32],
    L: &mut [u8],
    y: &mut [u8],
) {
    let nmax = (1i32 << BITS) - 1;
    let mut max_scale = 0f32;
    let mut max_min = 0f32;
    for (&s, &m) in scales.iter().zip(mins) {
        if s > max_scale {
            max_scale = s;
        }
        if m > max_min {
            max_min = m;
        }
    }
    let (dd, rest) = y.split_at_mut(4);
    let (sc, q) = rest.split_at_mut(12);
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    for j in 0..QK_K / 32 {
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            sc[j] = ls;
            sc[j + 4] = lm;
        } else {
            sc[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
            sc[j - 4] |= (ls >> 4) << 6;
            sc[j] |= (lm >> 4) << 6;
        }
    }
    put_f16(&mut dd[..2], fp32_to_fp16(max_scale / 63.0));
    put_f16(&mut dd[2..4], fp32_to_fp16(max_min / 63.0));
    let dall = get_f16(&dd[..2]);
    let dmin = get_f16(&dd[2..4]);
    for j in 0..QK_K / 32 {
        let (s, m) = get_scale_min_k4(j, sc);
        let d = dall * s as f32;
        if d == 0.0 {
            continue;
        }
        let dm = dmin * m as f32;
        for ii in 0..32 {
            let l = nearest_int((x[32 * j + ii] + dm) / d);
            L[32 * j + ii] = clampi(l, 0, nmax) as u8;
        }
    }
    if BITS == 4 {
        for (n, qq) in q.chunks_exact_mut(32).enumerate() {
            let j = 64 * n;
            for l in 0..32 {
                qq[l] = L[j + l] | (L[j + l + 32] << 4);
            }
        }
    } else {
        let (qh, ql) = q.split_at_mut(QK_K / 8);
        qh.fill(0);
        let mut m1 = 1u8;
        let mut m2 = 2u8;
        for (k, ql) in ql.chunks_exact_mut(32).enumerate() {
            let n = 64 * k;
            for j in 0..32 {
                let mut l1 = L[n + j];
                if l1 > 15 {
                    l1 -= 16;
                    qh[j] |= m1;
                }
                let mut l2 = L[n + j + 32];
                if l2 > 15 {
                    l2 -= 16;
                    qh[j] |= m2;
                }
                ql[j] = l1 | (l2 << 4);
            }
            m1 <<= 2;
            m2 <<= 2;
        }
    }
}

/// `quantize_row_q4_K_ref` on one super-block.
#[track_caller]
#[inline(always)]
pub fn quantize_q4_k(x: &[f32; QK_K], y: &mut [u8]) {
    assert_eq!(y.len(), Q4_K_BYTES, "Q4_K block bytes");
    quantize_q45_k::<4, 8>(x, y);
}

/// `quantize_row_q5_K_ref` on one super-block.
#[track_caller]
#[inline(always)]
pub fn quantize_q5_k(x: &[f32; QK_K], y: &mut [u8]) {
    assert_eq!(y.len(), Q5_K_BYTES, "Q5_K block bytes");
    quantize_q45_k::<5, 8>(x, y);
}

/// [`quantize_q4_k`] of two consecutive super-blocks, searched together.
#[track_caller]
#[inline(always)]
pub fn quantize_q4_k_pair(x: &[f32; 2 * QK_K], y: &mut [u8]) {
    assert_eq!(y.len(), 2 * Q4_K_BYTES, "Q4_K block bytes");
    quantize_q45_k::<4, 16>(x, y);
}

/// [`quantize_q5_k`] of two consecutive super-blocks, searched together.
#[track_caller]
#[inline(always)]
pub fn quantize_q5_k_pair(x: &[f32; 2 * QK_K], y: &mut [u8]) {
    assert_eq!(y.len(), 2 * Q5_K_BYTES, "Q5_K block bytes");
    quantize_q45_k::<5, 16>(x, y);
}

/// `dequantize_row_q4_K` on one super-block: `d·sc·q − dmin·m`.
#[track_caller]
#[inline(always)]
pub fn dequantize_q4_k(b: &[u8], y: &mut [f32; QK_K]) {
    assert_eq!(b.len(), Q4_K_BYTES, "Q4_K block bytes");
    let d = get_f16(&b[..2]);
    let min = get_f16(&b[2..4]);
    let sc = &b[4..16];
    let q = &b[16..];
    for k in 0..QK_K / 64 {
        let (s1, m1) = get_scale_min_k4(2 * k, sc);
        let (d1, m1) = (d * s1 as f32, min * m1 as f32);
        let (s2, m2) = get_scale_min_k4(2 * k + 1, sc);
        let (d2, m2) = (d * s2 as f32, min * m2 as f32);
        let q = &q[32 * k..32 * k + 32];
        for l in 0..32 {
            y[64 * k + l] = d1 * (q[l] & 0xF) as f32 - m1;
            y[64 * k + 32 + l] = d2 * (q[l] >> 4) as f32 - m2;
        }
    }
}

/// `dequantize_row_q5_K` on one super-block: `d·sc·q − dmin·m`.
#[track_caller]
#[inline(always)]
pub fn dequantize_q5_k(b: &[u8], y: &mut [f32; QK_K]) {
    assert_eq!(b.len(), Q5_K_BYTES, "Q5_K block bytes");
    let d = get_f16(&b[..2]);
    let min = get_f16(&b[2..4]);
    let sc = &b[4..16];
    let qh = &b[16..48];
    let ql = &b[48..];
    let (mut u1, mut u2) = (1u8, 2u8);
    for k in 0..QK_K / 64 {
        let (s1, m1) = get_scale_min_k4(2 * k, sc);
        let (d1, m1) = (d * s1 as f32, min * m1 as f32);
        let (s2, m2) = get_scale_min_k4(2 * k + 1, sc);
        let (d2, m2) = (d * s2 as f32, min * m2 as f32);
        let ql = &ql[32 * k..32 * k + 32];
        for l in 0..32 {
            let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
            let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
            y[64 * k + l] = d1 * ((ql[l] & 0xF) as i32 + h1) as f32 - m1;
            y[64 * k + 32 + l] = d2 * ((ql[l] >> 4) as i32 + h2) as f32 - m2;
        }
        u1 <<= 2;
        u2 <<= 2;
    }
}

/// `quantize_row_q6_K_ref` on one super-block: 16 sub-blocks of 16, 6-bit signed codes, 8-bit
/// signed scales.
#[track_caller]
#[inline(always)]
pub fn quantize_q6_k(x: &[f32; QK_K], y: &mut [u8]) {
    assert_eq!(y.len(), Q6_K_BYTES, "Q6_K block bytes");
    let mut L = [0i8; QK_K];
    let V(scales) = make_qx_quants::<16, 16>(32, &to_lanes(x), &mut L);
    let mut max_scale = 0f32;
    let mut max_abs_scale = 0f32;
    for &scale in &scales {
        let abs_scale = scale.abs();
        if abs_scale > max_abs_scale {
            max_abs_scale = abs_scale;
            max_scale = scale;
        }
    }
    if max_abs_scale < GROUP_MAX_EPS {
        y.fill(0);
        put_f16(&mut y[Q6_K_BYTES - 2..], fp32_to_fp16(0.0));
        return;
    }
    let (ql, rest) = y.split_at_mut(QK_K / 2);
    let (qh, rest) = rest.split_at_mut(QK_K / 4);
    let (sc, dd) = rest.split_at_mut(QK_K / 16);
    let iscale = -128f32 / max_scale;
    put_f16(dd, fp32_to_fp16(1.0 / iscale));
    for ib in 0..QK_K / 16 {
        sc[ib] = nearest_int(iscale * scales[ib]).min(127) as i8 as u8;
    }
    let dall = get_f16(dd);
    for j in 0..QK_K / 16 {
        let d = dall * (sc[j] as i8) as f32;
        if d == 0.0 {
            continue;
        }
        for ii in 0..16 {
            let l = nearest_int(x[16 * j + ii] / d);
            L[16 * j + ii] = (clampi(l, -32, 31) + 32) as i8;
        }
    }
    for (k, (ql, qh)) in ql
        .chunks_exact_mut(64)
        .zip(qh.chunks_exact_mut(32))
        .enumerate()
    {
        let j = 128 * k;
        for l in 0..32 {
            let q1 = (L[j + l] & 0xF) as u8;
            let q2 = (L[j + l + 32] & 0xF) as u8;
            let q3 = (L[j + l + 64] & 0xF) as u8;
            let q4 = (L[j + l + 96] & 0xF) as u8;
            ql[l] = q1 | (q3 << 4);
            ql[l + 32] = q2 | (q4 << 4);
            let v = (L[j + l] as i32 >> 4)
                | ((L[j + l + 32] as i32 >> 4) << 2)
                | ((L[j + l + 64] as i32 >> 4) << 4)
                | ((L[j + l + 96] as i32 >> 4) << 6);
            qh[l] = v as u8;
        }
    }
}

/// `dequantize_row_q6_K` on one super-block: `d·sc·(q − 32)`.
#[track_caller]
#[inline(always)]
pub fn dequantize_q6_k(b: &[u8], y: &mut [f32; QK_K]) {
    assert_eq!(b.len(), Q6_K_BYTES, "Q6_K block bytes");
    let d = get_f16(&b[208..210]);
    for k in 0..QK_K / 128 {
        let ql = &b[64 * k..64 * k + 64];
        let qh = &b[128 + 32 * k..128 + 32 * k + 32];
        let sc = &b[192 + 8 * k..192 + 8 * k + 8];
        let y = &mut y[128 * k..128 * k + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            y[l] = d * (sc[is] as i8) as f32 * q1 as f32;
            y[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
            y[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
            y[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // ---- ggml's helpers transcribed statement for statement, kept as the oracle the faster
    // versions above are held to on random and adversarial sub-blocks.

    /// ggml's `make_qx_quants(n, nmax, x, L, rmse_type = 1, qw = NULL)`: a symmetric scale for
    /// `x` searched over 19 candidates `−(nmax + 0.1·is)/max`, weights `x²`. Writes `L` (codes
    /// offset by `nmax`) and returns the scale.
    fn make_qx_quants_literal<const N: usize>(nmax: i32, x: &[f32; N], L: &mut [i8]) -> f32 {
        let mut max = 0f32;
        let mut amax = 0f32;
        for &xi in x {
            let ax = xi.abs();
            if ax > amax {
                amax = ax;
                max = xi;
            }
        }
        if amax < GROUP_MAX_EPS {
            L[..N].fill(0);
            return 0.0;
        }
        let nmaxf = nmax as f32;
        let mut iscale = -nmaxf / max;
        let mut sumlx = 0f32;
        let mut suml2 = 0f32;
        for i in 0..N {
            let l = clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1);
            L[i] = (l + nmax) as i8;
            let w = x[i] * x[i];
            let lf = l as f32;
            sumlx += w * x[i] * lf;
            suml2 += w * lf * lf;
        }
        let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
        let mut best = scale * sumlx;
        for is in -9i32..=9 {
            if is == 0 {
                continue;
            }
            iscale = -(nmaxf + 0.1f32 * is as f32) / max;
            sumlx = 0.0;
            suml2 = 0.0;
            for &xi in x {
                let l = clampi(nearest_int(iscale * xi), -nmax, nmax - 1);
                let w = xi * xi;
                let lf = l as f32;
                sumlx += w * xi * lf;
                suml2 += w * lf * lf;
            }
            if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
                for i in 0..N {
                    let l = nearest_int(iscale * x[i]);
                    L[i] = (nmax + clampi(l, -nmax, nmax - 1)) as i8;
                }
                scale = sumlx / suml2;
                best = scale * sumlx;
            }
        }
        scale
    }

    /// ggml's `make_q3_quants(n, nmax, x, L, do_rmse = true)`: codes `−nmax/max·x` refined by
    /// coordinate descent on the weighted (`x²`) least-squares fit. Writes `L` (codes offset by
    /// `nmax`) and returns the scale.
    fn make_q3_quants_literal<const N: usize>(nmax: i32, x: &[f32; N], L: &mut [i8]) -> f32 {
        let mut max = 0f32;
        let mut amax = 0f32;
        for &xi in x {
            let ax = xi.abs();
            if ax > amax {
                amax = ax;
                max = xi;
            }
        }
        if amax < GROUP_MAX_EPS {
            L[..N].fill(0);
            return 0.0;
        }
        let iscale = -(nmax as f32) / max;
        let mut sumlx = 0f32;
        let mut suml2 = 0f32;
        for i in 0..N {
            let l = clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1);
            L[i] = l as i8;
            let w = x[i] * x[i];
            let lf = l as f32;
            sumlx += w * x[i] * lf;
            suml2 += w * lf * lf;
        }
        for _itry in 0..5 {
            let mut n_changed = 0;
            for i in 0..N {
                let w = x[i] * x[i];
                let li = L[i] as f32;
                let mut slx = sumlx - w * x[i] * li;
                if slx > 0.0 {
                    let mut sl2 = suml2 - w * li * li;
                    let new_l = clampi(nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1);
                    if new_l != L[i] as i32 {
                        let nl = new_l as f32;
                        slx += w * x[i] * nl;
                        sl2 += w * nl * nl;
                        if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                            L[i] = new_l as i8;
                            sumlx = slx;
                            suml2 = sl2;
                            n_changed += 1;
                        }
                    }
                }
            }
            if n_changed == 0 {
                break;
            }
        }
        for l in &mut L[..N] {
            *l += nmax as i8;
        }
        if suml2 > 0.0 { sumlx / suml2 } else { 0.0 }
    }

    /// ggml's `make_qkx2_quants`: an affine fit `x ≈ scale·L − the_min` (`the_min ≥ 0`) with
    /// codes in `[0, nmax]`, the step searched over `nstep + 1` candidates
    /// `(rmin + rdelta·is + nmax)/(max − min)` against weighted squared (or absolute, `use_mad`)
    /// error. Writes `L` and returns `(scale, the_min)`.
    #[allow(clippy::too_many_arguments)]
    fn make_qkx2_quants_literal<const N: usize>(
        nmax: i32,
        x: &[f32; N],
        weights: &[f32; N],
        L: &mut [u8],
        rmin: f32,
        rdelta: f32,
        nstep: i32,
        use_mad: bool,
    ) -> (f32, f32) {
        let mut min = x[0];
        let mut max = x[0];
        let mut sum_w = weights[0];
        let mut sum_x = sum_w * x[0];
        for i in 1..N {
            if x[i] < min {
                min = x[i];
            }
            if x[i] > max {
                max = x[i];
            }
            let w = weights[i];
            sum_w += w;
            sum_x += w * x[i];
        }
        if min > 0.0 {
            min = 0.0;
        }
        if max == min {
            L[..N].fill(0);
            return (0.0, -min);
        }
        let nmaxf = nmax as f32;
        let mut iscale = nmaxf / (max - min);
        let mut scale = 1.0 / iscale;
        let mut best_error = 0f32;
        for i in 0..N {
            let l = nearest_int(iscale * (x[i] - min));
            L[i] = clampi(l, 0, nmax) as u8;
            let mut diff = scale * L[i] as f32 + min - x[i];
            diff = if use_mad { diff.abs() } else { diff * diff };
            best_error += weights[i] * diff;
        }
        if nstep < 1 {
            return (scale, -min);
        }
        let mut Laux = [0u8; N];
        for is in 0..=nstep {
            iscale = (rmin + rdelta * is as f32 + nmaxf) / (max - min);
            let mut sum_l = 0f32;
            let mut sum_l2 = 0f32;
            let mut sum_xl = 0f32;
            for i in 0..N {
                let l = clampi(nearest_int(iscale * (x[i] - min)), 0, nmax);
                Laux[i] = l as u8;
                let w = weights[i];
                let lf = l as f32;
                sum_l += w * lf;
                sum_l2 += w * lf * lf;
                sum_xl += w * lf * x[i];
            }
            let D = sum_w * sum_l2 - sum_l * sum_l;
            if D > 0.0 {
                let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
                let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
                if this_min > 0.0 {
                    this_min = 0.0;
                    this_scale = sum_xl / sum_l2;
                }
                let mut cur_error = 0f32;
                for i in 0..N {
                    let mut diff = this_scale * Laux[i] as f32 + this_min - x[i];
                    diff = if use_mad { diff.abs() } else { diff * diff };
                    cur_error += weights[i] * diff;
                }
                if cur_error < best_error {
                    L[..N].copy_from_slice(&Laux);
                    best_error = cur_error;
                    scale = this_scale;
                    min = this_min;
                }
            }
        }
        (scale, -min)
    }

    #[test]
    fn nearest_int_is_ggmls_magic_number() {
        // round half to even inside ±4194303
        for (x, n) in [
            (0.5f32, 0),
            (1.5, 2),
            (2.5, 2),
            (-0.5, 0),
            (-1.5, -2),
            (-2.5, -2),
            (0.49999997, 0),
            (4194303.0, 4194303),
            (-4194303.0, -4194303),
        ] {
            assert_eq!(nearest_int(x), n, "{x}");
        }
        // beyond: the mantissa of a sum with a larger exponent, as ggml reads it
        // 4194304 + 12582912 = 2^24: mantissa 0
        assert_eq!(nearest_int(4194304.0), -4194304);
        // 5e6 + 12582912 = 2^24 + 2·402848
        assert_eq!(nearest_int(5e6), 402848 - 4194304);
        // -5e6 + 12582912 = 7582912 = 2^22·(1 + 3388608/2^22); mantissa 3388608·2
        assert_eq!(nearest_int(-5e6), 6777216 - 4194304);
        assert_eq!(nearest_int(1e10), {
            let b = (1e10f32 + 12582912.0).to_bits() as i32;
            (b & 0x7f_ffff) - 0x40_0000
        });
        assert_eq!(nearest_int(f32::NAN), 0);
    }

    #[test]
    fn fp16_conversions_are_round_to_nearest_even() {
        // every f16 decodes exactly (NaNs aside)
        for h in 0..=u16::MAX {
            let r = half::f16::from_bits(h);
            if !r.is_nan() {
                assert_eq!(fp16_to_fp32(h).to_bits(), r.to_f32().to_bits(), "{h:#06x}");
            }
        }
        // f32 → f16 equals RNE on a sweep of bit patterns (every exponent, both signs)
        let mut bits = 0u32;
        loop {
            let f = f32::from_bits(bits);
            if !f.is_nan() {
                assert_eq!(
                    fp32_to_fp16(f),
                    half::f16::from_f32(f).to_bits(),
                    "{f:e} ({bits:#010x})"
                );
            }
            match bits.checked_add(65_521) {
                Some(b) => bits = b,
                None => break,
            }
        }
        // ties and the edges
        for f in [
            65504.0f32,
            65520.0,
            65519.996,
            6.1035156e-5,
            2.9802322e-8,
            2.9802326e-8,
        ] {
            assert_eq!(fp32_to_fp16(f), half::f16::from_f32(f).to_bits(), "{f:e}");
            assert_eq!(fp32_to_fp16(-f), half::f16::from_f32(-f).to_bits(), "{f:e}");
        }
        assert_eq!(fp32_to_fp16(f32::NAN) & 0x7E00, 0x7E00);
    }

    #[test]
    fn scale_min_k4_unpacks_the_packing() {
        // pack as the Q4_K/Q5_K quantizer does, unpack with get_scale_min_k4
        let ls: [u8; 8] = [0, 63, 17, 42, 5, 60, 33, 1];
        let lm: [u8; 8] = [63, 0, 9, 48, 31, 2, 57, 16];
        let mut sc = [0u8; 12];
        for j in 0..8 {
            if j < 4 {
                sc[j] = ls[j];
                sc[j + 4] = lm[j];
            } else {
                sc[j + 4] = (ls[j] & 0xF) | ((lm[j] & 0xF) << 4);
                sc[j - 4] |= (ls[j] >> 4) << 6;
                sc[j] |= (lm[j] >> 4) << 6;
            }
        }
        for j in 0..8 {
            assert_eq!(get_scale_min_k4(j, &sc), (ls[j], lm[j]), "{j}");
        }
    }

    /// The decoders invert the encoders to within a step of each type on ordinary blocks, and
    /// zero blocks stay zero.
    #[test]
    fn round_trip_within_a_step() {
        type Enc = fn(&[f32; QK_K], &mut [u8]);
        type Dec = fn(&[u8], &mut [f32; QK_K]);
        let cases: [(&str, Enc, Dec, usize, f32); 5] = [
            ("Q2_K", quantize_q2_k, dequantize_q2_k, Q2_K_BYTES, 3.0),
            ("Q3_K", quantize_q3_k, dequantize_q3_k, Q3_K_BYTES, 4.0),
            ("Q4_K", quantize_q4_k, dequantize_q4_k, Q4_K_BYTES, 15.0),
            ("Q5_K", quantize_q5_k, dequantize_q5_k, Q5_K_BYTES, 31.0),
            ("Q6_K", quantize_q6_k, dequantize_q6_k, Q6_K_BYTES, 32.0),
        ];
        let mut x = [0f32; QK_K];
        for (i, v) in x.iter_mut().enumerate() {
            *v = ((i * 37 % 101) as f32 - 50.0) / 7.0;
        }
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        for (name, enc, dec, size, levels) in cases {
            let mut b = vec![0u8; size];
            let mut y = [0f32; QK_K];
            enc(&x, &mut b);
            dec(&b, &mut y);
            let step = 2.0 * amax / levels;
            for (a, c) in x.iter().zip(&y) {
                assert!((a - c).abs() <= step, "{name}: {a} vs {c}");
            }
            enc(&[0f32; QK_K], &mut b);
            dec(&b, &mut y);
            assert!(y.iter().all(|&v| v == 0.0), "{name}: zeros");
        }
    }

    /// A small deterministic generator of adversarial sub-blocks: random shapes, magnitudes
    /// 1e-9 … 1e5, offsets, exact ties, repeated values, zeros and a single outlier.
    struct Gen(u64);
    impl Gen {
        fn u(&mut self) -> f32 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 >> 40) as f32 / (1u64 << 24) as f32
        }
        fn block<const N: usize>(&mut self) -> [f32; N] {
            let kind = (self.u() * 8.0) as u32;
            let mag = 10f32.powf(self.u() * 14.0 - 9.0);
            let off = if self.u() < 0.3 {
                (self.u() - 0.5) * 40.0
            } else {
                0.0
            };
            let mut x = [0f32; N];
            for v in x.iter_mut() {
                let u = self.u();
                *v = match kind {
                    0 => (u - 0.5) * mag,
                    1 => u * mag,
                    2 => -u * mag,
                    3 => ((u * 16.0).floor() - 8.0 + 0.5) * mag.max(1.0).round(),
                    4 => ((u * 4.0).floor() - 2.0) * 0.25,
                    5 => {
                        if u < 0.85 {
                            0.0
                        } else {
                            (self.u() - 0.5) * mag
                        }
                    }
                    6 => (u - 0.5) * mag * 1e-3,
                    _ => ((u - 0.5) * mag).powi(3),
                } + off * mag;
            }
            if self.u() < 0.2 {
                let i = (self.u() * N as f32) as usize % N;
                x[i] *= 50.0;
            }
            x
        }
    }

    /// The lane-parallel helpers give ggml's statement-by-statement results, bit for bit.
    /// Called directly, they are compiled for the baseline instruction set; tests/kquant.rs
    /// checks the dispatched (AVX2 where present) path against ggml's bytes.
    #[test]
    fn parallel_search_equals_the_literal_transcription() {
        let mut g = Gen(0x5EED_2030_0001);
        let n = if cfg!(debug_assertions) {
            3_000
        } else {
            30_000
        };
        for _ in 0..n / 8 {
            // Q6_K, Q3_K: 16 sub-blocks of 16 side by side
            let x: Vec<f32> = (0..16).flat_map(|_| g.block::<16>()).collect();
            let xt = to_lanes::<16, 16>(&x);
            let mut a = [0i8; 256];
            let V(sa) = make_qx_quants::<16, 16>(32, &xt, &mut a);
            let mut a3 = [0i8; 256];
            let V(sa3) = make_q3_quants::<16, 16>(4, &xt, &mut a3);
            for j in 0..16 {
                let xs: &[f32; 16] = x[16 * j..16 * j + 16].try_into().unwrap();
                let mut b = [0i8; 16];
                let sb = make_qx_quants_literal::<16>(32, xs, &mut b);
                let r = 16 * j..16 * j + 16;
                assert_eq!(
                    (sa[j].to_bits(), &a[r.clone()]),
                    (sb.to_bits(), &b[..]),
                    "qx {xs:?}"
                );
                let sb = make_q3_quants_literal::<16>(4, xs, &mut b);
                assert_eq!(
                    (sa3[j].to_bits(), &a3[r]),
                    (sb.to_bits(), &b[..]),
                    "q3 {xs:?}"
                );
            }
            // Q2_K: 16 sub-blocks of 16 side by side
            let x: Vec<f32> = (0..16).flat_map(|_| g.block::<16>()).collect();
            let xt = to_lanes::<16, 16>(&x);
            let wt = xt.map(V::abs);
            let p = Qkx2 {
                nmax: 3,
                rmin: -0.5,
                rdelta: 0.1,
                nstep: 15,
                use_mad: true,
            };
            let mut a = [0u8; 256];
            let (V(s), V(m)) = make_qkx2_quants::<16, 16>(p, &xt, &wt, &mut a);
            for j in 0..16 {
                let xs: &[f32; 16] = x[16 * j..16 * j + 16].try_into().unwrap();
                let w16 = xs.map(f32::abs);
                let mut b = [0u8; 16];
                let rb = make_qkx2_quants_literal::<16>(3, xs, &w16, &mut b, -0.5, 0.1, 15, true);
                assert_eq!(
                    (s[j].to_bits(), m[j].to_bits(), &a[16 * j..16 * j + 16]),
                    (rb.0.to_bits(), rb.1.to_bits(), &b[..]),
                    "qkx2/Q2_K {xs:?}"
                );
            }
            // Q4_K, Q5_K: 8 sub-blocks of 32 side by side
            let x: Vec<f32> = (0..8).flat_map(|_| g.block::<32>()).collect();
            let xt = to_lanes::<32, 8>(&x);
            for (nmax, rmin, nstep) in [(15, -1.0f32, 20), (31, -0.5, 15)] {
                let mut w = [0f32; 256];
                for (wj, xj) in w.chunks_exact_mut(32).zip(x.chunks_exact(32)) {
                    let mut sum_x2 = 0f32;
                    for &v in xj {
                        sum_x2 += v * v;
                    }
                    let av_x = (sum_x2 / 32.0).sqrt();
                    for (wi, v) in wj.iter_mut().zip(xj) {
                        *wi = av_x + v.abs();
                    }
                }
                let wt = to_lanes::<32, 8>(&w);
                let p = Qkx2 {
                    nmax,
                    rmin,
                    rdelta: 0.1,
                    nstep,
                    use_mad: false,
                };
                let mut a = [0u8; 256];
                let (V(s), V(m)) = make_qkx2_quants::<32, 8>(p, &xt, &wt, &mut a);
                for j in 0..8 {
                    let xs: &[f32; 32] = x[32 * j..32 * j + 32].try_into().unwrap();
                    let ws: &[f32; 32] = w[32 * j..32 * j + 32].try_into().unwrap();
                    let mut b = [0u8; 32];
                    let rb = make_qkx2_quants_literal::<32>(
                        nmax, xs, ws, &mut b, rmin, 0.1, nstep, false,
                    );
                    assert_eq!(
                        (s[j].to_bits(), m[j].to_bits(), &a[32 * j..32 * j + 32]),
                        (rb.0.to_bits(), rb.1.to_bits(), &b[..]),
                        "qkx2/nmax {nmax} {xs:?}"
                    );
                }
            }
        }
    }
}
