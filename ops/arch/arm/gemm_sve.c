/* gemm_sve.c: vector-length-agnostic SVE micro-kernels of the f32 and f64
 * products (gemm_arm.h has their contract; ops/gemm.c packs and blocks
 * around them). Built for armv8.2-a+sve (the Makefile's flag for this one
 * object): gemm.c calls into it only when the CPU has SVE.
 *
 * The NEON kernels' shape in SVE vectors of W = svcntw() (svcntd()) elements:
 * 8 rows x 3 vectors, 24 accumulators. A's 8 values of a k come in by
 * 128-bit quadwords replicated to every segment (ld1rqw / ld1rqd), so that
 * each row's multiply-add takes its value by lane (fmla z.s, zb.s, za.s[i]);
 * row-major A read in place (arow) broadcasts each row's value. Every FMA
 * is explicit (svmla): acc + b * a, rounded once. */
#include "gemm_arm.h"

#if defined(__aarch64__) && defined(__ARM_FEATURE_SVE)
#include <arm_sve.h>

#include "../mca.h"

#define SK_INLINE static inline __attribute__((always_inline))
#define SK_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#define SK_CAT_(x, y) x##y
#define SK_CAT(x, y) SK_CAT_(x, y)
#define SK_A(r) SK_CAT(SK_A_, r) /* the register holding row r's value of A */

#define SK_ACC_DECL(r) SK_V x##r##0 = SK_ZERO, x##r##1 = SK_ZERO, x##r##2 = SK_ZERO;
#define SK_ROW_OK(r) ((r) < rows && (!guard || ((r) >= r0 && (r) < r1)))
#define SK_ACC_LOAD(r)                                                                         \
    if (load && SK_ROW_OK(r)) {                                                                \
        x##r##0 = SK_LD(pg, c + (r)*ldc);                                                      \
        if (nv > 1) x##r##1 = SK_LD(pg, c + (r)*ldc + w);                                      \
        if (nv > 2) x##r##2 = SK_LD(pg, c + (r)*ldc + 2 * w);                                  \
    }
#define SK_ACC_STORE(r)                                                                        \
    if (SK_ROW_OK(r)) {                                                                        \
        SK_ST(pg, c + (r)*ldc, x##r##0);                                                       \
        if (nv > 1) SK_ST(pg, c + (r)*ldc + w, x##r##1);                                       \
        if (nv > 2) SK_ST(pg, c + (r)*ldc + 2 * w, x##r##2);                                   \
    }
#define SK_ACC_FMA(r)                                                                          \
    if ((r) < rows) {                                                                          \
        if (arow) {                                                                            \
            const SK_V s_ = SK_DUP(a[(r)*ars]);                                                \
            x##r##0 = SK_FMA(pg, x##r##0, b0, s_);                                             \
            if (nv > 1) x##r##1 = SK_FMA(pg, x##r##1, b1, s_);                                 \
            if (nv > 2) x##r##2 = SK_FMA(pg, x##r##2, b2, s_);                                 \
        } else {                                                                               \
            x##r##0 = SK_FMA_LANE(x##r##0, b0, SK_A(r), (r) % SK_L);                           \
            if (nv > 1) x##r##1 = SK_FMA_LANE(x##r##1, b1, SK_A(r), (r) % SK_L);               \
            if (nv > 2) x##r##2 = SK_FMA_LANE(x##r##2, b2, SK_A(r), (r) % SK_L);               \
        }                                                                                      \
    }
/* make mca (NB_MCA) with clang only: the accumulators pinned at the marks,
 * since clang moves register arithmetic across the marks' asm (the region
 * then held a part of the k step); the pins hold the whole step between the
 * marks, its loads after the first. (GCC keeps the order without them, and
 * with them moves registers around the pins: not the code it builds.) */
#if defined(NB_MCA) && defined(__clang__)
#define SK_PIN_ROW(r) "+w"(x##r##0), "+w"(x##r##1), "+w"(x##r##2),
#define SK_PIN(mark)                                                                          \
    if (mark) { /* at most 30 operands an asm: two */                                          \
        __asm__ volatile("" : SK_PIN_ROW(0) SK_PIN_ROW(1) SK_PIN_ROW(2) SK_PIN_ROW(3)       \
                         "+r"(a) : : "memory");                                              \
        __asm__ volatile("" : SK_PIN_ROW(4) SK_PIN_ROW(5) SK_PIN_ROW(6) SK_PIN_ROW(7)       \
                         "+r"(b));                                                           \
    }
#else
#define SK_PIN(mark) ((void)0)
#endif
/* SK_L: elements per quadword; the kernel reads A's values as 8 / SK_L
 * quadwords (rows beyond `rows` excepted). mark: as in gemm_neon.c. */
#define SK_BODY(name)                                                                          \
    const int mark = rows == 8 && nv == 3; /* name, or name_rowA when arow */                  \
    const int64_t w = (int64_t)SK_CNT();                                                       \
    SK_ROWS(SK_ACC_DECL)                                                                       \
    SK_ROWS(SK_ACC_LOAD)                                                                       \
    for (int64_t k = 0; k < kc; k++) {                                                         \
        if (mark && !arow) NBI_MCA_BEGIN(name);                                                \
        if (mark && arow) NBI_MCA_BEGIN(name "_rowA");                                         \
        SK_PIN(mark);                                                                          \
        SK_V a0 = SK_ZERO, a1 = SK_ZERO, a2 = SK_ZERO, a3 = SK_ZERO;                           \
        if (!arow) {                                                                           \
            a0 = SK_LDQ(pg, a);                                                                \
            if (SK_L < rows) a1 = SK_LDQ(pg, a + SK_L);                                        \
            if (2 * SK_L < rows) a2 = SK_LDQ(pg, a + 2 * SK_L);                                \
            if (3 * SK_L < rows) a3 = SK_LDQ(pg, a + 3 * SK_L);                                \
        }                                                                                      \
        (void)a2, (void)a3;                                                                    \
        const SK_V b0 = SK_LD(pg, b), b1 = nv > 1 ? SK_LD(pg, b + w) : SK_ZERO;                \
        const SK_V b2 = nv > 2 ? SK_LD(pg, b + 2 * w) : SK_ZERO;                               \
        SK_ROWS(SK_ACC_FMA)                                                                    \
        a += arow ? 1 : aks;                                                                   \
        b += nv * w;                                                                           \
        SK_PIN(mark);                                                                          \
        if (mark && !arow) NBI_MCA_END(name);                                                  \
        if (mark && arow) NBI_MCA_END(name "_rowA");                                           \
    }                                                                                          \
    SK_ROWS(SK_ACC_STORE)

#define SK_DISPATCH(kern)                                                                      \
    if (!half) {                                                                               \
        if (nv == 3) arow ? kern(8, 3, 1, 0, SK_ARGS) : kern(8, 3, 0, 0, SK_ARGS);             \
        else if (nv == 2) arow ? kern(8, 2, 1, 0, SK_ARGS) : kern(8, 2, 0, 0, SK_ARGS);        \
        else arow ? kern(8, 1, 1, 0, SK_ARGS) : kern(8, 1, 0, 0, SK_ARGS);                     \
    } else {                                                                                   \
        if (nv == 3) arow ? kern(4, 3, 1, 1, SK_ARGS) : kern(4, 3, 0, 1, SK_ARGS);             \
        else if (nv == 2) arow ? kern(4, 2, 1, 1, SK_ARGS) : kern(4, 2, 0, 1, SK_ARGS);        \
        else arow ? kern(4, 1, 1, 1, SK_ARGS) : kern(4, 1, 0, 1, SK_ARGS);                     \
    }
#define SK_ARGS kc, a, ars, aks, b, c, ldc, load, r0, r1

/* ------------------------------------------------------------------- f32 */
#define SK_V svfloat32_t
#define SK_L 4
#define SK_CNT svcntw
#define SK_LD svld1_f32
#define SK_ST svst1_f32
#define SK_LDQ svld1rq_f32
#define SK_ZERO svdup_n_f32(0)
#define SK_DUP svdup_n_f32
#define SK_FMA svmla_f32_x
#define SK_FMA_LANE svmla_lane_f32
#define SK_A_0 a0
#define SK_A_1 a0
#define SK_A_2 a0
#define SK_A_3 a0
#define SK_A_4 a1
#define SK_A_5 a1
#define SK_A_6 a1
#define SK_A_7 a1

SK_INLINE void kern_f32(const int rows, const int nv, const int arow, const int guard, int64_t kc,
                        const float *restrict a, int64_t ars, int64_t aks,
                        const float *restrict b, float *restrict c, int64_t ldc, int load, int r0,
                        int r1) {
    const svbool_t pg = svptrue_b32();
    SK_BODY("gemm_f32_sve")
}

void nbi_gemm_f32_sve_kern(int half, int nv, int arow, int64_t kc, const float *a, int64_t ars,
                           int64_t aks, const float *b, float *c, int64_t ldc, int load, int r0,
                           int r1) {
    SK_DISPATCH(kern_f32)
}

#undef SK_V
#undef SK_L
#undef SK_CNT
#undef SK_LD
#undef SK_ST
#undef SK_LDQ
#undef SK_ZERO
#undef SK_DUP
#undef SK_FMA
#undef SK_FMA_LANE
#undef SK_A_0
#undef SK_A_1
#undef SK_A_2
#undef SK_A_3
#undef SK_A_4
#undef SK_A_5
#undef SK_A_6
#undef SK_A_7

/* ------------------------------------------------------------------- f64 */
#define SK_V svfloat64_t
#define SK_L 2
#define SK_CNT svcntd
#define SK_LD svld1_f64
#define SK_ST svst1_f64
#define SK_LDQ svld1rq_f64
#define SK_ZERO svdup_n_f64(0)
#define SK_DUP svdup_n_f64
#define SK_FMA svmla_f64_x
#define SK_FMA_LANE svmla_lane_f64
#define SK_A_0 a0
#define SK_A_1 a0
#define SK_A_2 a1
#define SK_A_3 a1
#define SK_A_4 a2
#define SK_A_5 a2
#define SK_A_6 a3
#define SK_A_7 a3

SK_INLINE void kern_f64(const int rows, const int nv, const int arow, const int guard, int64_t kc,
                        const double *restrict a, int64_t ars, int64_t aks,
                        const double *restrict b, double *restrict c, int64_t ldc, int load,
                        int r0, int r1) {
    const svbool_t pg = svptrue_b64();
    SK_BODY("gemm_f64_sve")
}

void nbi_gemm_f64_sve_kern(int half, int nv, int arow, int64_t kc, const double *a,
                           int64_t ars, int64_t aks, const double *b, double *c, int64_t ldc,
                           int load, int r0, int r1) {
    SK_DISPATCH(kern_f64)
}

int nbi_gemm_sve_bytes(void) { return (int)svcntb(); }

#elif defined(__aarch64__)
/* A compiler without SVE: the path never runs (nbi_gemm_sve_bytes says 0,
 * a length gemm.c has no packing for, and it takes NEON). */
void nbi_gemm_f32_sve_kern(int half, int nv, int arow, int64_t kc, const float *a, int64_t ars,
                           int64_t aks, const float *b, float *c, int64_t ldc, int load, int r0,
                           int r1) {
    nbi_gemm_f32_neon_kern(half, nv, arow, kc, a, ars, aks, b, c, ldc, load, r0, r1);
}
void nbi_gemm_f64_sve_kern(int half, int nv, int arow, int64_t kc, const double *a,
                           int64_t ars, int64_t aks, const double *b, double *c, int64_t ldc,
                           int load, int r0, int r1) {
    nbi_gemm_f64_neon_kern(half, nv, arow, kc, a, ars, aks, b, c, ldc, load, r0, r1);
}
int nbi_gemm_sve_bytes(void) { return 0; }
#else
typedef int nbi_gemm_sve_unused; /* ISO C: no empty translation unit */
#endif
