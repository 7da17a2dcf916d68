/* gemv_neon.c: the f32 one-row products on aarch64 (NEON, every aarch64
 * CPU), with the bits of the general kernel (ops/gemm.c): on aarch64 each of
 * its paths (portable, NEON, SVE) makes c[i][j] one chain of fused
 * multiply-adds over k = 0..K-1 in order from +0, and so does each output
 * here (gemm_internal.h's nbi_gemv_f32 and nbi_vecmat_f32).
 *
 * Rows form, y[j] = sum over k of w[j][k] x[k]: 16 rows at a time, four
 * vectors of 4 rows; each step reads 4 k of each row (16 bytes), transposes
 * the 4 x 4 blocks in registers (vector t holds k + t of 4 rows) and does 4
 * FMAs by lane of x into each vector: 4 independent chains. The last K % 4
 * k are gathered one by one (no zero padding in k: an added 0 x 0 would turn
 * a -0 sum into +0).
 * x W form, y[j] = sum over k of x[k] w[k][j]: the lanes are W's columns
 * already, 32 columns (8 vectors) a step, one FMA per row of W per vector. */
#include "../../gemv_internal.h"

#if defined(__aarch64__)
#include <arm_neon.h>

#define GN_INLINE inline __attribute__((always_inline))

/* 4 rows x 4 k (row i at p[i]) -> r[t] = k t of the 4 rows */
static GN_INLINE void gn_tr4(float32x4_t r[4], const float *const p[4], int64_t k) {
    const float32x4_t a = vld1q_f32(p[0] + k), b = vld1q_f32(p[1] + k);
    const float32x4_t c = vld1q_f32(p[2] + k), d = vld1q_f32(p[3] + k);
    const float32x4_t ab0 = vtrn1q_f32(a, b), ab1 = vtrn2q_f32(a, b); /* a0 b0 a2 b2, a1 b1 a3 b3 */
    const float32x4_t cd0 = vtrn1q_f32(c, d), cd1 = vtrn2q_f32(c, d);
    r[0] = vreinterpretq_f32_f64(vzip1q_f64(vreinterpretq_f64_f32(ab0), vreinterpretq_f64_f32(cd0)));
    r[1] = vreinterpretq_f32_f64(vzip1q_f64(vreinterpretq_f64_f32(ab1), vreinterpretq_f64_f32(cd1)));
    r[2] = vreinterpretq_f32_f64(vzip2q_f64(vreinterpretq_f64_f32(ab0), vreinterpretq_f64_f32(cd0)));
    r[3] = vreinterpretq_f32_f64(vzip2q_f64(vreinterpretq_f64_f32(ab1), vreinterpretq_f64_f32(cd1)));
}

/* n (<= 16) rows from w (row stride ldw) into y[i*sy]; rows past n read row 0
 * (valid memory) and are not stored. */
static void gn_rows(int n, int64_t K, const float *w, int64_t ldw, const float *x, float *y,
                    int64_t sy) {
    const float *p[16];
    for (int i = 0; i < 16; i++) p[i] = w + (i < n ? i : 0) * ldw;
    float32x4_t acc[4] = {vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0)};
    const int nv = (n + 3) / 4;
    int64_t k = 0;
    for (; k + 4 <= K; k += 4) {
        const float32x4_t xv = vld1q_f32(x + k);
        for (int v = 0; v < nv; v++) {
            float32x4_t r[4];
            gn_tr4(r, p + 4 * v, k);
            acc[v] = vfmaq_laneq_f32(acc[v], r[0], xv, 0);
            acc[v] = vfmaq_laneq_f32(acc[v], r[1], xv, 1);
            acc[v] = vfmaq_laneq_f32(acc[v], r[2], xv, 2);
            acc[v] = vfmaq_laneq_f32(acc[v], r[3], xv, 3);
        }
    }
    for (; k < K; k++) /* the last K % 4, one k at a time */
        for (int v = 0; v < nv; v++) {
            const float t[4] = {p[4 * v][k], p[4 * v + 1][k], p[4 * v + 2][k], p[4 * v + 3][k]};
            acc[v] = vfmaq_n_f32(acc[v], vld1q_f32(t), x[k]);
        }
    float out[16];
    for (int v = 0; v < nv; v++) vst1q_f32(out + 4 * v, acc[v]);
    for (int i = 0; i < n; i++) y[i * sy] = out[i];
}

void nbi_gemv_f32_neon(int64_t N, int64_t K, const float *w, int64_t ldw, const float *x,
                       float *y, int64_t sy) {
    for (int64_t j = 0; j < N; j += 16)
        gn_rows(N - j < 16 ? (int)(N - j) : 16, K, w + j * ldw, ldw, x, y + j * sy, sy);
}

/* Columns [0, n) of y, n <= 32: whole vectors of 4 in registers, the last
 * n % 4 columns through a local copy of each row's piece. */
static void gn_cols(int n, int64_t K, const float *w, int64_t ldw, const float *x, float *y) {
    float32x4_t acc[8];
    const int nv = n / 4, m = n % 4;
    for (int v = 0; v < 8; v++) acc[v] = vdupq_n_f32(0);
    float32x4_t tail = vdupq_n_f32(0);
    for (int64_t k = 0; k < K; k++) {
        const float *row = w + k * ldw;
        for (int v = 0; v < nv; v++) acc[v] = vfmaq_n_f32(acc[v], vld1q_f32(row + 4 * v), x[k]);
        if (m) {
            float t[4] = {0};
            for (int i = 0; i < m; i++) t[i] = row[4 * nv + i];
            tail = vfmaq_n_f32(tail, vld1q_f32(t), x[k]);
        }
    }
    for (int v = 0; v < nv; v++) vst1q_f32(y + 4 * v, acc[v]);
    float t[4];
    vst1q_f32(t, tail);
    for (int i = 0; i < m; i++) y[4 * nv + i] = t[i];
}

void nbi_vecmat_f32_neon(int64_t N, int64_t K, const float *w, int64_t ldw, const float *x,
                         float *y) {
    for (int64_t j = 0; j < N; j += 32)
        gn_cols(N - j < 32 ? (int)(N - j) : 32, K, w + j, ldw, x, y + j);
}
#else
typedef int nbi_gemv_neon_empty; /* ISO C: a translation unit declares something */
#endif
