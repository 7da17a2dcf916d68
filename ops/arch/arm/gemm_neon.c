/* gemm_neon.c: Advanced SIMD micro-kernels of the f32 and f64 products
 * (gemm_arm.h has their contract; ops/gemm.c packs and blocks around them).
 *
 * f32: 8 rows x 12 columns (3 q-registers of B per k); A's 8 values of a k
 * in 2 q-registers, each row's multiply-add taking its value by lane
 * (fmla v.4s, vb.4s, va.s[lane]): 24 accumulators, 5 loads per 24 FMAs.
 * f64: 8 rows x 6 columns, the same shape with 2 lanes per register (A in
 * 4 q-registers): 24 accumulators, 7 loads per 24 FMAs. Row-major A read in
 * place (arow) takes each row's value as a scalar (fmla by element [0]).
 * Every FMA is explicit (vfmaq_*): acc + b * a, rounded once. */
#include "gemm_arm.h"

#if defined(__aarch64__)
#include <arm_neon.h>

#include "../mca.h"

#define NK_INLINE static inline __attribute__((always_inline))
#define NK_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)

/* The kernel's body for the element type of the NK_* macros in scope: NK_T
 * (element), NK_V (vector of NK_L elements), NK_LD, NK_ST, NK_ZERO,
 * NK_FMA_LANE(acc, b, a, lane), NK_FMA_N(acc, b, scalar). rows (8 or 4), nv
 * (1..3), arow, guard: constants at each call. */
#define NK_ACC_DECL(r) NK_V x##r##0 = NK_ZERO, x##r##1 = NK_ZERO, x##r##2 = NK_ZERO;
#define NK_ROW_OK(r) ((r) < rows && (!guard || ((r) >= r0 && (r) < r1)))
#define NK_ACC_LOAD(r)                                                                         \
    if (load && NK_ROW_OK(r)) {                                                                \
        x##r##0 = NK_LD(c + (r)*ldc);                                                          \
        if (nv > 1) x##r##1 = NK_LD(c + (r)*ldc + NK_L);                                       \
        if (nv > 2) x##r##2 = NK_LD(c + (r)*ldc + 2 * NK_L);                                   \
    }
#define NK_ACC_STORE(r)                                                                        \
    if (NK_ROW_OK(r)) {                                                                        \
        NK_ST(c + (r)*ldc, x##r##0);                                                           \
        if (nv > 1) NK_ST(c + (r)*ldc + NK_L, x##r##1);                                        \
        if (nv > 2) NK_ST(c + (r)*ldc + 2 * NK_L, x##r##2);                                    \
    }
#define NK_ACC_FMA(r)                                                                          \
    if ((r) < rows) {                                                                          \
        if (arow) {                                                                            \
            const NK_T s_ = a[(r)*ars];                                                        \
            x##r##0 = NK_FMA_N(x##r##0, b0, s_);                                               \
            if (nv > 1) x##r##1 = NK_FMA_N(x##r##1, b1, s_);                                   \
            if (nv > 2) x##r##2 = NK_FMA_N(x##r##2, b2, s_);                                   \
        } else {                                                                               \
            x##r##0 = NK_FMA_LANE(x##r##0, b0, av[(r) / NK_L], (r) % NK_L);                    \
            if (nv > 1) x##r##1 = NK_FMA_LANE(x##r##1, b1, av[(r) / NK_L], (r) % NK_L);        \
            if (nv > 2) x##r##2 = NK_FMA_LANE(x##r##2, b2, av[(r) / NK_L], (r) % NK_L);        \
        }                                                                                      \
    }
/* make mca (NB_MCA) with clang only: the accumulators pinned at the marks,
 * since clang moves register arithmetic across the marks' asm (the region
 * then held a part of the k step); the pins hold the whole step between the
 * marks, its loads after the first. (GCC keeps the order without them, and
 * with them moves registers around the pins: not the code it builds.) */
#if defined(NB_MCA) && defined(__clang__)
#define NK_PIN_ROW(r) "+w"(x##r##0), "+w"(x##r##1), "+w"(x##r##2),
#define NK_PIN(mark)                                                                          \
    if (mark) { /* at most 30 operands an asm: two */                                          \
        __asm__ volatile("" : NK_PIN_ROW(0) NK_PIN_ROW(1) NK_PIN_ROW(2) NK_PIN_ROW(3)       \
                         "+r"(a) : : "memory");                                              \
        __asm__ volatile("" : NK_PIN_ROW(4) NK_PIN_ROW(5) NK_PIN_ROW(6) NK_PIN_ROW(7)       \
                         "+r"(b));                                                           \
    }
#else
#define NK_PIN(mark) ((void)0)
#endif
/* mark: the shape whose inner loop make mca measures (whole tile, 3 vectors:
 * the one nearly all of a large product runs), A packed or A^T (name) or
 * row-major A read in place (name_rowA, as gemm.c's kernels). */
#define NK_BODY(name)                                                                          \
    const int mark = rows == 8 && nv == 3; /* name, or name_rowA when arow */                  \
    NK_ROWS(NK_ACC_DECL)                                                                       \
    NK_ROWS(NK_ACC_LOAD)                                                                       \
    for (int64_t k = 0; k < kc; k++) {                                                         \
        if (mark && !arow) NBI_MCA_BEGIN(name);                                                \
        if (mark && arow) NBI_MCA_BEGIN(name "_rowA");                                         \
        NK_PIN(mark);                                                                          \
        NK_V av[8 / NK_L];                                                                     \
        if (!arow)                                                                             \
            for (int g = 0; g < 8 / NK_L; g++) av[g] = g * NK_L < rows ? NK_LD(a + g * NK_L) : NK_ZERO; \
        const NK_V b0 = NK_LD(b), b1 = nv > 1 ? NK_LD(b + NK_L) : NK_ZERO;                     \
        const NK_V b2 = nv > 2 ? NK_LD(b + 2 * NK_L) : NK_ZERO;                                \
        NK_ROWS(NK_ACC_FMA)                                                                    \
        a += arow ? 1 : aks;                                                                   \
        b += nv * NK_L;                                                                        \
        NK_PIN(mark);                                                                          \
        if (mark && !arow) NBI_MCA_END(name);                                                  \
        if (mark && arow) NBI_MCA_END(name "_rowA");                                           \
    }                                                                                          \
    NK_ROWS(NK_ACC_STORE)

/* The 12 shapes (whole or half tile, 1..3 vectors, A by columns or rows). */
#define NK_DISPATCH(kern)                                                                      \
    if (!half) {                                                                               \
        if (nv == 3) arow ? kern(8, 3, 1, 0, NK_ARGS) : kern(8, 3, 0, 0, NK_ARGS);             \
        else if (nv == 2) arow ? kern(8, 2, 1, 0, NK_ARGS) : kern(8, 2, 0, 0, NK_ARGS);        \
        else arow ? kern(8, 1, 1, 0, NK_ARGS) : kern(8, 1, 0, 0, NK_ARGS);                     \
    } else {                                                                                   \
        if (nv == 3) arow ? kern(4, 3, 1, 1, NK_ARGS) : kern(4, 3, 0, 1, NK_ARGS);             \
        else if (nv == 2) arow ? kern(4, 2, 1, 1, NK_ARGS) : kern(4, 2, 0, 1, NK_ARGS);        \
        else arow ? kern(4, 1, 1, 1, NK_ARGS) : kern(4, 1, 0, 1, NK_ARGS);                     \
    }
#define NK_ARGS kc, a, ars, aks, b, c, ldc, load, r0, r1

/* ------------------------------------------------------------------- f32 */
#define NK_T float
#define NK_V float32x4_t
#define NK_L 4
#define NK_LD vld1q_f32
#define NK_ST vst1q_f32
#define NK_ZERO vdupq_n_f32(0)
#define NK_FMA_LANE(acc, b, a, lane) vfmaq_laneq_f32(acc, b, a, lane)
#define NK_FMA_N(acc, b, s) vfmaq_n_f32(acc, b, s)

NK_INLINE void kern_f32(const int rows, const int nv, const int arow, const int guard, int64_t kc,
                        const float *restrict a, int64_t ars, int64_t aks,
                        const float *restrict b, float *restrict c, int64_t ldc, int load, int r0,
                        int r1) {
    NK_BODY("gemm_f32_neon")
}

void nbi_gemm_f32_neon_kern(int half, int nv, int arow, int64_t kc, const float *a, int64_t ars,
                            int64_t aks, const float *b, float *c, int64_t ldc, int load, int r0,
                            int r1) {
    NK_DISPATCH(kern_f32)
}

#undef NK_T
#undef NK_V
#undef NK_L
#undef NK_LD
#undef NK_ST
#undef NK_ZERO
#undef NK_FMA_LANE
#undef NK_FMA_N

/* ------------------------------------------------------------------- f64 */
#define NK_T double
#define NK_V float64x2_t
#define NK_L 2
#define NK_LD vld1q_f64
#define NK_ST vst1q_f64
#define NK_ZERO vdupq_n_f64(0)
#define NK_FMA_LANE(acc, b, a, lane) vfmaq_laneq_f64(acc, b, a, lane)
#define NK_FMA_N(acc, b, s) vfmaq_n_f64(acc, b, s)

NK_INLINE void kern_f64(const int rows, const int nv, const int arow, const int guard, int64_t kc,
                        const double *restrict a, int64_t ars, int64_t aks,
                        const double *restrict b, double *restrict c, int64_t ldc, int load,
                        int r0, int r1) {
    NK_BODY("gemm_f64_neon")
}

void nbi_gemm_f64_neon_kern(int half, int nv, int arow, int64_t kc, const double *a,
                            int64_t ars, int64_t aks, const double *b, double *c, int64_t ldc,
                            int load, int r0, int r1) {
    NK_DISPATCH(kern_f64)
}

#else
typedef int nbi_gemm_neon_unused; /* ISO C: no empty translation unit */
#endif
