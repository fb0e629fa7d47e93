// kernels/scale.cu -- the element-wise steps of DoRA/BoRA (spec sa3_lora.md §1.4) and of
// summing adapter contributions (§2.1), for wanbake's CUDA backend.
//
// Owns:
//   magnitude_ratio_{dtype}:       c[i] = m[i] / (norm[i] + eps)
//   scale_rows_{dtype}:            X[i, j] = c[i] * X[i, j]
//   scale_cols_{dtype}:            X[i, j] = c[j] * X[i, j]
//   accumulate_difference_{dtype}: D[k] = D[k] + a * (X[k] - W0[k])
// Does not own the norms (kernels/norms.cu) or the low-rank products (cuBLAS).
//
// Each output element is a fixed sequence of single IEEE f32 operations written with _rn
// intrinsics, compiled with --fmad=false --ftz=false --prec-div=true, so it gives the same
// bits as the same sequence in Rust (src/gpu/arith.rs, used by the CPU backend) for every
// non-NaN result. NaN results are NaN on both; their payloads are not specified (they are
// not on the CPU either) and the final add_narrow step canonicalises them.
//
// Matrices are row-major (rows, cols). The 2-D kernels take rows from blockIdx.y (grid-stride)
// and columns from x, so no element index is ever divided.

typedef unsigned long long u64;

#define GRID_STRIDE(i, n)                                                        \
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (n);           \
         i += (u64)blockDim.x * gridDim.x)

#define ROWS_STRIDE(r, rows) for (u64 r = blockIdx.y; r < (rows); r += gridDim.y)

// magnitude_ratio_{NAME}(const T* m, const T* norm, T eps, T* c, u64 n)
#define MAGNITUDE_RATIO(NAME, T)                                                            \
    extern "C" __global__ void magnitude_ratio_##NAME(const T* __restrict__ m,             \
                                                      const T* __restrict__ norm, T eps,   \
                                                      T* __restrict__ c, u64 n) {          \
        GRID_STRIDE(i, n) { c[i] = __fdiv_rn(m[i], __fadd_rn(norm[i], eps)); }             \
    }

// scale_rows_{NAME}(T* X, const T* c, u64 rows, u64 cols)
#define SCALE_ROWS(NAME, T)                                                                 \
    extern "C" __global__ void scale_rows_##NAME(T* __restrict__ X, const T* __restrict__ c, \
                                                 u64 rows, u64 cols) {                     \
        ROWS_STRIDE(r, rows) {                                                             \
            T ci = c[r];                                                                   \
            GRID_STRIDE(j, cols) { X[r * cols + j] = __fmul_rn(ci, X[r * cols + j]); }    \
        }                                                                                  \
    }

// scale_cols_{NAME}(T* X, const T* c, u64 rows, u64 cols)
#define SCALE_COLS(NAME, T)                                                                 \
    extern "C" __global__ void scale_cols_##NAME(T* __restrict__ X, const T* __restrict__ c, \
                                                 u64 rows, u64 cols) {                     \
        ROWS_STRIDE(r, rows) {                                                             \
            GRID_STRIDE(j, cols) { X[r * cols + j] = __fmul_rn(c[j], X[r * cols + j]); }   \
        }                                                                                  \
    }

// accumulate_difference_{NAME}(T* D, T a, const T* X, const T* W0, u64 n)
#define ACCUMULATE_DIFFERENCE(NAME, T)                                                      \
    extern "C" __global__ void accumulate_difference_##NAME(T* __restrict__ D, T a,        \
                                                            const T* __restrict__ X,       \
                                                            const T* __restrict__ W0, u64 n) { \
        GRID_STRIDE(k, n) { D[k] = __fadd_rn(D[k], __fmul_rn(a, __fsub_rn(X[k], W0[k]))); } \
    }

MAGNITUDE_RATIO(f32, float)
SCALE_ROWS(f32, float)
SCALE_COLS(f32, float)
ACCUMULATE_DIFFERENCE(f32, float)
