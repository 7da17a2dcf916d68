/* gemv_avx2.c: the one-row kernels of gemv.c for CPUs whose best path is
 * AVX2+FMA (and, for bf16 weights, AVX-512F CPUs without AVX512_BF16):
 *
 *   rows form  y (N) = W (N,K) x (K)   y[j] = sum over k of w[j][k] x[k]
 *   x W form   y (N) = x (K) W (K,N)   y[j] = sum over k of x[k] w[k][j]
 *
 * Bits: those of the general kernels on these paths. gemm.c's AVX2 path and
 * gemm_bf16.c's f32 fallbacks (AVX2 and AVX-512F) make each output one chain
 * of fused multiply-adds over k in increasing order from +0 (bf16 operands
 * widened to f32 exactly, the product of two bf16 being exact in f32). So
 * the lanes of a vector are outputs, never parts of one sum: in the rows
 * form a block of 8 rows x 8 words is loaded and transposed in registers
 * (vector t = word t of the 8 rows), 16 rows (two blocks, two independent
 * chains) at a time, 16 sequential streams through W, the next block of
 * rows warmed as in gemv.c; in the x W form each of up to 8 vectors of
 * columns takes one FMA per row of W. */
#include "gemv_internal.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define G2 __attribute__((target("avx2,fma")))
#define G2_INLINE inline __attribute__((always_inline))

/* r[t] = word t of rows 0..7 (r[i] holds row i's 8 words on entry): pairs,
 * then quads within each 128-bit lane, then the lanes. */
static G2 G2_INLINE void g2_transpose8(__m256 r[8]) {
    __m256 t[8], s[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]); /* w0 w0' w1 w1' | w4 w4' w5 w5' */
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]); /* w2 w2' w3 w3' | w6 ... */
    }
    for (int i = 0; i < 8; i += 4) { /* s[i + q]: word q (low lane) and 4 + q (high) of rows i..i+3 */
        s[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        s[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
        s[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        s[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
    for (int q = 0; q < 4; q++) {
        r[q] = _mm256_permute2f128_ps(s[q], s[q + 4], 0x20);
        r[q + 4] = _mm256_permute2f128_ps(s[q], s[q + 4], 0x31);
    }
}

/* lanes [0, m) set */
static G2 G2_INLINE __m256i g2_mask(int m) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(m), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* Words [k, k + m) of a row (m <= 8; the rest zeros, never read) as f32:
 * f32 data, or bf16 widened (exact). */
static G2 G2_INLINE __m256 g2_load(const char *row, int64_t k, int m, int bf16) {
    if (!bf16) {
        const float *p = (const float *)row + k;
        return m == 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, g2_mask(m));
    }
    const uint16_t *p = (const uint16_t *)row + k;
    uint16_t tail[8] = {0};
    if (m < 8)
        for (int i = 0; i < m; i++) tail[i] = p[i];
    __m128i h = _mm_loadu_si128((const __m128i *)(m == 8 ? p : tail));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* acc[g] (rows 8g..8g+7 of the block, n valid) += the words [k, k + m) of
 * those rows times xk[0..m), one FMA per word in order. */
static G2 G2_INLINE void g2_step(__m256 acc[2], int n, const char *w, int64_t ldw_bytes,
                                 int64_t k, int m, const float *xk, int bf16) {
    for (int g = 0; g < 2 && 8 * g < n; g++) {
        __m256 r[8];
        for (int i = 0; i < 8; i++)
            r[i] = 8 * g + i < n ? g2_load(w + (8 * g + i) * ldw_bytes, k, m, bf16)
                                 : _mm256_setzero_ps();
        g2_transpose8(r);
        for (int t = 0; t < m; t++) acc[g] = _mm256_fmadd_ps(_mm256_set1_ps(xk[t]), r[t], acc[g]);
    }
}

/* x[k..k+m) as f32: f32 x as it is; bf16 x (the pairs read as halves, in
 * order on a little-endian CPU) widened into xs. */
static G2 G2_INLINE const float *g2_x(const void *x, int64_t k, int m, int bf16, float xs[16]) {
    if (!bf16) return (const float *)x + k;
    const uint16_t *h = (const uint16_t *)x + k;
    for (int t = 0; t < m; t++) {
        uint32_t u = (uint32_t)h[t] << 16;
        __builtin_memcpy(&xs[t], &u, 4);
    }
    return xs;
}

/* One block of n <= 16 rows: y[i*sy] for i < n. pf: warm the next block,
 * one prefetch per row per 64 bytes read. */
static G2 G2_INLINE void g2_rows(int n, int64_t K, const char *w, int64_t ldw_bytes,
                                 const void *x, float *y, int64_t sy, bool pf, int bf16) {
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    const int es = bf16 ? 2 : 4;
    float xs[16];
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
        if (pf && (!bf16 || k % 32 == 0))
            for (int i = 0; i < 16; i++)
                _mm_prefetch((const char *)((uintptr_t)w + (uintptr_t)((16 + i) * ldw_bytes + k * es)),
                             _MM_HINT_T1); /* past W's end: no fault, nothing done */
        const float *xk = g2_x(x, k, 16, bf16, xs);
        g2_step(acc, n, w, ldw_bytes, k, 8, xk, bf16);
        g2_step(acc, n, w, ldw_bytes, k + 8, 8, xk + 8, bf16);
    }
    for (; k < K; k += 8) { /* the last K % 16 words, only those multiplied (no 0 x 0 added) */
        int m = K - k < 8 ? (int)(K - k) : 8;
        g2_step(acc, n, w, ldw_bytes, k, m, g2_x(x, k, m, bf16, xs), bf16);
    }
    float out[16];
    _mm256_storeu_ps(out, acc[0]);
    _mm256_storeu_ps(out + 8, acc[1]);
    for (int i = 0; i < n; i++) y[i * sy] = out[i];
}

static G2 void g2_rows_f32(int n, int64_t K, const char *w, int64_t ldw_bytes, const void *x,
                           float *y, int64_t sy, bool pf) {
    g2_rows(n, K, w, ldw_bytes, x, y, sy, pf, 0);
}

static G2 void g2_rows_bf16(int n, int64_t K, const char *w, int64_t ldw_bytes, const void *x,
                            float *y, int64_t sy, bool pf) {
    g2_rows(n, K, w, ldw_bytes, x, y, sy, pf, 1);
}

void nbi_gemv_f32_avx2(int64_t N, int64_t K, const float *w, int64_t ldw, const float *x,
                       float *y, int64_t sy) {
    bool pf = nbi_gemv_prefetching(ldw * 4);
    for (int64_t j = 0; j < N; j += 16)
        g2_rows_f32(N - j < 16 ? (int)(N - j) : 16, K, (const char *)(w + j * ldw), ldw * 4, x,
                    y + j * sy, sy, pf);
}

void nbi_gemv_bf16_avx2(int64_t N, int64_t K, const uint16_t *w, int64_t ldw,
                        const uint32_t *xp, float *y, int64_t sy) {
    bool pf = nbi_gemv_prefetching(ldw * 2);
    for (int64_t j = 0; j < N; j += 16)
        g2_rows_bf16(N - j < 16 ? (int)(N - j) : 16, K, (const char *)(w + j * ldw), ldw * 2, xp,
                     y + j * sy, sy, pf);
}

/* ------------------------------------------------------------- x W form */
/* The lines of NV vectors of a row `ahead` elements below (gemv.c's
 * nbi_vecmat_ahead rows): one prefetch per 64 bytes, no fault past W's end. */
static G2 G2_INLINE void g2_vm_prefetch(const int NV, const float *row, int64_t ahead) {
    for (int v = 0; v < NV; v += 2)
        _mm_prefetch((const char *)((uintptr_t)(row + 8 * v) + (uintptr_t)(ahead * 4)), _MM_HINT_T0);
}

/* Columns [0, n) of y, n in (8 (NV - 1), 8 NV]: NV vectors, the last one
 * masked when n is not a multiple of 8. Each vector is NV independent
 * chains' lanes: y[j] = fma over k of (x[k], w[k][j]) from +0. */
static G2 G2_INLINE void g2_vm(const int NV, int n, int64_t K, const float *w, int64_t ldw,
                               const float *x, float *y) {
    __m256 acc[8];
    for (int v = 0; v < NV; v++) acc[v] = _mm256_setzero_ps();
    const int last = n - 8 * (NV - 1);
    const __m256i lm = g2_mask(last);
    const int64_t ahead = nbi_vecmat_ahead(NV * 32);
    if (last == 8)
        for (int64_t k = 0; k < K; k++) {
            const __m256 s = _mm256_set1_ps(x[k]);
            g2_vm_prefetch(NV, w + k * ldw, ahead * ldw);
            for (int v = 0; v < NV; v++)
                acc[v] = _mm256_fmadd_ps(s, _mm256_loadu_ps(w + k * ldw + 8 * v), acc[v]);
        }
    else
        for (int64_t k = 0; k < K; k++) {
            const __m256 s = _mm256_set1_ps(x[k]);
            g2_vm_prefetch(NV, w + k * ldw, ahead * ldw);
            for (int v = 0; v < NV - 1; v++)
                acc[v] = _mm256_fmadd_ps(s, _mm256_loadu_ps(w + k * ldw + 8 * v), acc[v]);
            acc[NV - 1] = _mm256_fmadd_ps(
                s, _mm256_maskload_ps(w + k * ldw + 8 * (NV - 1), lm), acc[NV - 1]);
        }
    for (int v = 0; v < NV - 1; v++) _mm256_storeu_ps(y + 8 * v, acc[v]);
    _mm256_maskstore_ps(y + 8 * (NV - 1), lm, acc[NV - 1]);
}

/* 64 columns (8 vectors of 16 registers) at a time: every row of W in turn */
static G2 void g2_vm_cols(int n, int64_t K, const float *w, int64_t ldw, const float *x,
                          float *y) {
    switch ((n + 7) / 8) {
    case 1: g2_vm(1, n, K, w, ldw, x, y); break;
    case 2: g2_vm(2, n, K, w, ldw, x, y); break;
    case 3: g2_vm(3, n, K, w, ldw, x, y); break;
    case 4: g2_vm(4, n, K, w, ldw, x, y); break;
    case 5: g2_vm(5, n, K, w, ldw, x, y); break;
    case 6: g2_vm(6, n, K, w, ldw, x, y); break;
    case 7: g2_vm(7, n, K, w, ldw, x, y); break;
    default: g2_vm(8, n, K, w, ldw, x, y); break;
    }
}

void nbi_vecmat_f32_avx2(int64_t N, int64_t K, const float *w, int64_t ldw, const float *x,
                         float *y) {
    for (int64_t j = 0; j < N; j += 64)
        g2_vm_cols(N - j < 64 ? (int)(N - j) : 64, K, w + j, ldw, x, y + j);
}
#endif
