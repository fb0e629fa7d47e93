// kernels/norms.cu -- row and column L2 norms of a row-major (rows, cols) f32 matrix, and the
// DoRA/BoRA scale vectors built from them, for wanbake's CUDA backend.
//
// Owns:
//   row_norms_{dtype}:  dst[i] = f32(||W[i, :]||)            (wanbake::linalg::norms)
//   col_norms_{dtype}:  dst[j] = f32(||W[:, j]||)
//   row_scales_{dtype}: alpha[i] = m[i] / (||V[i, :]|| + eps), f64   (merge::math, dora-rows
//                       and the row step of BoRA)
//   col_scales_{dtype}: beta[j] = m[j] / (||(alpha (.) V)[:, j]|| + eps), f64   (dora-cols with
//                       alpha = 1, the column step of BoRA)
// Does not own the element-wise combination (kernels/accumulate.cu).
//
// Arithmetic, bit-identical to the CPU path: each element is widened to f64 (exact); a row
// norm sums x*x in f64 with j ascending, a column sum runs i ascending; the root is taken in
// f64 (IEEE, correctly rounded). row/col_norms round the root once to f32 (linalg::norms);
// the scales keep it in f64 and divide in f64 (merge::math). For col_scales the summed value
// is h = alpha[i]*x rounded in f64, then h*h, exactly as merge::math::column_scales. One
// thread owns one whole sum, so the order never depends on the launch shape; explicit _rn
// intrinsics and --fmad=false keep the compiler from contracting or reordering.
//
// Column kernels read coalesced (neighbouring threads, neighbouring columns); row kernels read
// one row per thread, served from L1/L2 in 32-byte sectors. Both cost far less than reading the
// tensor from disk.

typedef unsigned long long u64;

#define GRID_STRIDE(i, n)                                                        \
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (n);           \
         i += (u64)blockDim.x * gridDim.x)

// sqrt(sum_j W[i, j]^2) in f64, j ascending.
template <typename T>
__device__ __forceinline__ double row_root(const T* __restrict__ W, u64 i, u64 cols) {
    const T* row = W + i * cols;
    double acc = 0.0;
    for (u64 j = 0; j < cols; ++j) {
        double x = (double)row[j];
        acc = __dadd_rn(acc, __dmul_rn(x, x));
    }
    return sqrt(acc);
}

// row_norms_{NAME}(const T* W, float* dst, u64 rows, u64 cols)
#define ROW_NORMS(NAME, T)                                                                  \
    extern "C" __global__ void row_norms_##NAME(const T* __restrict__ W,                   \
                                                float* __restrict__ dst, u64 rows,         \
                                                u64 cols) {                                \
        GRID_STRIDE(i, rows) { dst[i] = __double2float_rn(row_root(W, i, cols)); }  \
    }

// col_norms_{NAME}(const T* W, float* dst, u64 rows, u64 cols)
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

// row_scales_{NAME}(const T* V, const float* m, double eps, double* alpha, u64 rows, u64 cols)
#define ROW_SCALES(NAME, T)                                                                 \
    extern "C" __global__ void row_scales_##NAME(const T* __restrict__ V,                  \
                                                 const float* __restrict__ m, double eps,  \
                                                 double* __restrict__ alpha, u64 rows,     \
                                                 u64 cols) {                               \
        GRID_STRIDE(i, rows) {                                                             \
            double norm = row_root(V, i, cols);                                     \
            alpha[i] = __ddiv_rn((double)m[i], __dadd_rn(norm, eps));                      \
        }                                                                                  \
    }

// col_scales_{NAME}(const T* V, const double* alpha, const float* m, double eps,
//                   double* beta, u64 rows, u64 cols)
#define COL_SCALES(NAME, T)                                                                 \
    extern "C" __global__ void col_scales_##NAME(const T* __restrict__ V,                  \
                                                 const double* __restrict__ alpha,         \
                                                 const float* __restrict__ m, double eps,  \
                                                 double* __restrict__ beta, u64 rows,      \
                                                 u64 cols) {                               \
        GRID_STRIDE(j, cols) {                                                             \
            double acc = 0.0;                                                              \
            for (u64 i = 0; i < rows; ++i) {                                               \
                double h = __dmul_rn(alpha[i], (double)V[i * cols + j]);                   \
                acc = __dadd_rn(acc, __dmul_rn(h, h));                                     \
            }                                                                              \
            beta[j] = __ddiv_rn((double)m[j], __dadd_rn(sqrt(acc), eps));                  \
        }                                                                                  \
    }

ROW_NORMS(f32, float)
COL_NORMS(f32, float)
ROW_SCALES(f32, float)
COL_SCALES(f32, float)
