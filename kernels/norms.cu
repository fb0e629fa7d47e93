// kernels/norms.cu -- row and column L2 norms of a row-major (rows, cols) f32 matrix, for the
// DoRA/BoRA magnitudes of wanbake's CUDA backend.
//
// Owns: `row_norms_{dtype}` and `col_norms_{dtype}`. Does not own the `+ eps` of the DoRA
// formulas (kernels/scale.cu `magnitude_ratio_*`).
//
// Arithmetic, bit-identical to wanbake::linalg::norms (the CPU path): each element is widened
// to f64 (exact), squared (exact: a 24-bit significand squared fits in 53 bits), the squares
// are summed in f64 in index order (j ascending for a row, i ascending for a column), the
// root is taken in f64 (IEEE, correctly rounded) and rounded once to f32. One thread owns one
// whole sum, so the order never depends on the launch shape. Explicit _rn intrinsics and
// --fmad=false keep the compiler from contracting or reordering (a contraction would be
// harmless here because the product is exact, but it is not relied on).
//
// Column norms read coalesced (neighbouring threads read neighbouring columns); row norms
// read one row per thread, served from L1/L2 in 32-byte sectors. Both are far below the cost
// of reading the tensor from disk.

typedef unsigned long long u64;

#define GRID_STRIDE(i, n)                                                        \
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (n);           \
         i += (u64)blockDim.x * gridDim.x)

// row_norms_{NAME}(const T* W, float* dst, u64 rows, u64 cols): dst[i] = ||W[i, :]||
#define ROW_NORMS(NAME, T)                                                                  \
    extern "C" __global__ void row_norms_##NAME(const T* __restrict__ W,                   \
                                                float* __restrict__ dst, u64 rows,         \
                                                u64 cols) {                                \
        GRID_STRIDE(i, rows) {                                                             \
            const T* row = W + i * cols;                                                   \
            double acc = 0.0;                                                              \
            for (u64 j = 0; j < cols; ++j) {                                               \
                double x = (double)row[j];                                                 \
                acc = __dadd_rn(acc, __dmul_rn(x, x));                                     \
            }                                                                              \
            dst[i] = __double2float_rn(sqrt(acc));                                         \
        }                                                                                  \
    }

// col_norms_{NAME}(const T* W, float* dst, u64 rows, u64 cols): dst[j] = ||W[:, j]||
#define COL_NORMS(NAME, T)                                                                  \
    extern "C" __global__ void col_norms_##NAME(const T* __restrict__ W,                   \
                                                float* __restrict__ dst, u64 rows,         \
                                                u64 cols) {                                \
        GRID_STRIDE(j, cols) {                                                             \
            double acc = 0.0;                                                              \
            for (u64 i = 0; i < rows; ++i) {                                               \
                double x = (double)W[i * cols + j];                                        \
                acc = __dadd_rn(acc, __dmul_rn(x, x));                                     \
            }                                                                              \
            dst[j] = __double2float_rn(sqrt(acc));                                         \
        }                                                                                  \
    }

ROW_NORMS(f32, float)
COL_NORMS(f32, float)
