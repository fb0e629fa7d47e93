// kernels/accumulate.cu -- adding one adapter's contribution w*(f(W0) - W0) into the f32
// accumulator D of a merge (spec sa3_lora.md §1.4, §2.1), for wanbake's CUDA backend.
//
// Owns:
//   accumulate_normalised_{dtype}: D[i,j] += f32(w * (beta[j] * (alpha[i] * V[i,j]) - W0[i,j]))
//       the DoRA/BoRA forms (dora-rows: beta = 1; dora-cols: alpha = 1; BoRA: both), with
//       alpha, beta from kernels/norms.cu;
//   accumulate_scaled_{dtype}:     D[k] += f32(coef * X[k])
//       full-tensor diffs (diff, diff_b, a LoRA bias).
// Low-rank additive updates go straight through cuBLAS.
//
// Arithmetic, bit-identical to merge::math::add_contribution: the combination is evaluated in
// f64 (V, W0 widened exactly; the multiplications by an all-ones alpha or beta are exact, so
// one kernel serves every form), rounded once to f32, then added to D in f32. Explicit _rn
// intrinsics, --fmad=false.
//
// Matrices are row-major (rows, cols); accumulate_normalised takes rows from blockIdx.y
// (grid-stride) and columns from x, so no element index is divided.

typedef unsigned long long u64;

#define GRID_STRIDE(i, n)                                                        \
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (n);           \
         i += (u64)blockDim.x * gridDim.x)

#define ROWS_STRIDE(r, rows) for (u64 r = blockIdx.y; r < (rows); r += gridDim.y)

// accumulate_normalised_{NAME}(T* D, double w, const T* V, const T* W0, const double* alpha,
//                              const double* beta, u64 rows, u64 cols)
#define ACCUMULATE_NORMALISED(NAME, T)                                                      \
    extern "C" __global__ void accumulate_normalised_##NAME(                               \
        T* __restrict__ D, double w, const T* __restrict__ V, const T* __restrict__ W0,    \
        const double* __restrict__ alpha, const double* __restrict__ beta, u64 rows,       \
        u64 cols) {                                                                        \
        ROWS_STRIDE(r, rows) {                                                             \
            double a = alpha[r];                                                           \
            GRID_STRIDE(j, cols) {                                                         \
                u64 k = r * cols + j;                                                      \
                double f = __dmul_rn(beta[j], __dmul_rn(a, (double)V[k]));                 \
                T c = __double2float_rn(__dmul_rn(w, __dsub_rn(f, (double)W0[k])));        \
                D[k] = __fadd_rn(D[k], c);                                                 \
            }                                                                              \
        }                                                                                  \
    }

// accumulate_scaled_{NAME}(T* D, double coef, const T* X, u64 n)
#define ACCUMULATE_SCALED(NAME, T)                                                          \
    extern "C" __global__ void accumulate_scaled_##NAME(T* __restrict__ D, double coef,    \
                                                        const T* __restrict__ X, u64 n) {  \
        GRID_STRIDE(k, n) {                                                                \
            D[k] = __fadd_rn(D[k], __double2float_rn(__dmul_rn(coef, (double)X[k])));      \
        }                                                                                  \
    }

ACCUMULATE_NORMALISED(f32, float)
ACCUMULATE_SCALED(f32, float)
