// kernels/convert.cu -- dtype conversion kernels for wanbake's CUDA backend.
//
// Owns: widening BF16/F16/F32 storage to f32 (`widen_{dtype}`), narrowing f32 to BF16/F16/F32
// with one round-to-nearest-even (`narrow_{dtype}`), and the fused final step of a merge,
// `add_narrow_{dtype}`: out = RNE(base + delta) with wanbake's NaN rule, reporting the first
// element whose f32 sum is not finite (the merge refuses to write those).
//
// Compiled at run time by NVRTC (src/gpu/kernels.rs) with --fmad=false --ftz=false
// --prec-div=true --prec-sqrt=true; the source is embedded in the binary with include_str!.
// No header is included and no bf16/f16 intrinsic is used: every conversion is integer bit
// arithmetic, the same formulas as the host reference in src/gpu/arith.rs, which the tests
// check bit for bit against wanbake::io::dtype (round_to_bf16, round_to_f16, widen_to_f32).
// That works on every architecture NVRTC targets, so no __CUDA_ARCH__ guard is needed.
//
// Every kernel is a grid-stride loop over `n` elements (u64), launched with any grid.

typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#define GRID_STRIDE(i, n)                                                        \
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (n);           \
         i += (u64)blockDim.x * gridDim.x)

// True for every NaN bit pattern (either sign, quiet or signalling).
__device__ __forceinline__ bool is_nan_bits(u32 b) { return (b & 0x7FFFFFFFu) > 0x7F800000u; }

// ---- widening: storage bits -> f32 bits (exact) ------------------------------------------

// bf16 is the top half of an f32: a shift, NaN payloads kept as they are.
__device__ __forceinline__ u32 widen_bits_bf16(u16 h) { return ((u32)h) << 16; }

// IEEE half -> f32, exact; NaN keeps sign and payload and gains the quiet bit
// (half::f16::to_f32 and the F16C instruction do the same).
__device__ __forceinline__ u32 widen_bits_f16(u16 h) {
    u32 sign = ((u32)(h & 0x8000u)) << 16;
    u32 exp = h & 0x7C00u;
    u32 man = h & 0x03FFu;
    if ((h & 0x7FFFu) == 0) return sign;                       // signed zero
    if (exp == 0x7C00u) {
        if (man == 0) return sign | 0x7F800000u;                // infinity
        return sign | 0x7FC00000u | (man << 13);                // NaN, quieted
    }
    if (exp == 0) {                                             // subnormal: normalise
        u32 e = (u32)__clz((int)man) - 16u - 6u;                // leading zeros of man as u16, minus 6
        return sign | ((127u - 15u - e) << 23) | ((man << (14u + e)) & 0x007FFFFFu);
    }
    return sign | (((exp >> 10) + 127u - 15u) << 23) | (man << 13);
}

__device__ __forceinline__ u32 widen_bits_f32(u32 b) { return b; }

// ---- narrowing: f32 bits -> storage bits (one round-to-nearest-even) ----------------------

// wanbake::io::dtype::round_to_bf16: add 0x7FFF plus the lowest kept bit, keep the top half;
// NaN keeps its sign and top payload bits and gains the quiet bit 0x0040.
__device__ __forceinline__ u16 narrow_bits_bf16(u32 b) {
    if (is_nan_bits(b)) return (u16)((b >> 16) | 0x0040u);
    return (u16)((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

// wanbake::io::dtype::round_to_f16 (half::f16::from_f32): IEEE RNE with subnormals, overflow
// to infinity; NaN keeps sign and the top 10 payload bits and gains the quiet bit 0x0200.
__device__ __forceinline__ u16 narrow_bits_f16(u32 x) {
    u32 sign = x & 0x80000000u;
    u32 exp = x & 0x7F800000u;
    u32 man = x & 0x007FFFFFu;
    if (exp == 0x7F800000u) {
        u32 nan_bit = (man == 0) ? 0u : 0x0200u;
        return (u16)((sign >> 16) | 0x7C00u | nan_bit | (man >> 13));
    }
    u32 half_sign = sign >> 16;
    int half_exp = (int)(exp >> 23) - 127 + 15;
    if (half_exp >= 0x1F) return (u16)(half_sign | 0x7C00u);   // overflow -> infinity
    if (half_exp <= 0) {                                       // subnormal or zero result
        if (14 - half_exp > 24) return (u16)half_sign;
        u32 m = man | 0x00800000u;
        u32 half_man = m >> (14 - half_exp);
        u32 round_bit = 1u << (13 - half_exp);
        if ((m & round_bit) != 0u && (m & (3u * round_bit - 1u)) != 0u) half_man += 1u;
        return (u16)(half_sign | half_man);
    }
    u32 bits = half_sign | (((u32)half_exp) << 10) | (man >> 13);
    u32 round_bit = 0x00001000u;
    if ((man & round_bit) != 0u && (man & (3u * round_bit - 1u)) != 0u) bits += 1u;
    return (u16)bits;
}

__device__ __forceinline__ u32 narrow_bits_f32(u32 b) { return b; }

// ---- the merge's final step ---------------------------------------------------------------

// The f32 bits of base + delta under wanbake's NaN rule (src/gpu/arith.rs `sum_bits`):
// a NaN base passes through unchanged (an untouched NaN weight keeps its bits); a NaN sum
// otherwise (NaN delta, or inf + -inf) becomes the canonical quiet NaN 0x7FC00000, because
// the payload of a computed NaN differs between CPUs and GPUs. Otherwise one IEEE add.
__device__ __forceinline__ u32 sum_bits(float base, float delta) {
    u32 b = __float_as_uint(base);
    if (is_nan_bits(b)) return b;
    u32 s = __float_as_uint(__fadd_rn(base, delta));
    return is_nan_bits(s) ? 0x7FC00000u : s;
}

// ---- entry points, one macro per op, one instantiation per dtype --------------------------

// widen_{NAME}(const STORE_T* src, float* dst, u64 n)
#define WIDEN(NAME, STORE_T)                                                                \
    extern "C" __global__ void widen_##NAME(const STORE_T* __restrict__ src,               \
                                            float* __restrict__ dst, u64 n) {              \
        GRID_STRIDE(i, n) { dst[i] = __uint_as_float(widen_bits_##NAME(src[i])); }         \
    }

// narrow_{NAME}(const float* src, STORE_T* dst, u64 n)
#define NARROW(NAME, STORE_T)                                                               \
    extern "C" __global__ void narrow_##NAME(const float* __restrict__ src,                \
                                             STORE_T* __restrict__ dst, u64 n) {           \
        GRID_STRIDE(i, n) { dst[i] = (STORE_T)narrow_bits_##NAME(__float_as_uint(src[i])); } \
    }

// add_narrow_{NAME}(const float* base, const float* delta, STORE_T* dst,
//                   u64* first_non_finite, u64 n)
// *first_non_finite (set to all ones by the caller) ends as the smallest index whose f32 sum
// is infinite or NaN: atomicMin gives the same answer in any execution order.
#define ADD_NARROW(NAME, STORE_T)                                                           \
    extern "C" __global__ void add_narrow_##NAME(const float* __restrict__ base,           \
                                                 const float* __restrict__ delta,          \
                                                 STORE_T* __restrict__ dst,                \
                                                 u64* __restrict__ first_non_finite,       \
                                                 u64 n) {                                  \
        GRID_STRIDE(i, n) {                                                                \
            u32 s = sum_bits(base[i], delta[i]);                                           \
            if ((s & 0x7F800000u) == 0x7F800000u) atomicMin(first_non_finite, i);         \
            dst[i] = (STORE_T)narrow_bits_##NAME(s);                                       \
        }                                                                                  \
    }

WIDEN(bf16, u16)
WIDEN(f16, u16)
WIDEN(f32, u32)

NARROW(bf16, u16)
NARROW(f16, u16)
NARROW(f32, u32)

ADD_NARROW(bf16, u16)
ADD_NARROW(f16, u16)
ADD_NARROW(f32, u32)
