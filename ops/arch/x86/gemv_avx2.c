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
 * form a block of 8 rows x 8 32-bit words is loaded and transposed in
 * registers (vector t = word t of the 8 rows; a bf16 word is a pair of
 * elements, widened after the transpose: half the shuffles of widening
 * first), 16 rows (f32) or 32 (bf16) at a time, one chain per 8, as many
 * sequential streams through W, the next block of rows warmed as in gemv.c;
 * in the x W form each of up to 8 vectors of columns takes one FMA per row
 * of W, the rows ahead prefetched. */
#include "../../gemv_internal.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define G2 __attribute__((target("avx2,fma")))
#define G2_INLINE inline __attribute__((always_inline))
/* Groups of 8 rows per block, each one chain of FMAs (4-cycle latency on
 * current x86): f32 takes 8 FMAs per 32 bytes of a row, bf16 16, so bf16
 * needs twice the chains in flight to keep the loads coming (here: 16 rows
 * read 20-26 GB/s of bf16, 32 rows 24-31; f32 with 32 rows was slower). */
#define G2_F32_G 2
#define G2_BF16_G 4

/* r[t] = 32-bit word t of rows 0..7 (row i at w + i*ld + off, 32 bytes;
 * rows >= n8 read as zeros, never touched): each register is loaded as two
 * 16-byte halves, rows i and i + 4 side by side, so that a 4 x 4 transpose
 * within each 128-bit lane finishes it (16 shuffles, where whole-row loads
 * need 24: shuffles are what limits this kernel on CPUs with one shuffle
 * port). r[4h + q] = word 4h + q. */
static G2 G2_INLINE void g2_block8(__m256 r[8], const char *w, int64_t ld, int n8, int64_t off) {
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < 4; i++) {
            const char *p = w + off + 16 * h;
            __m128 lo = i < n8 ? _mm_loadu_ps((const float *)(p + i * ld)) : _mm_setzero_ps();
            __m128 hi = i + 4 < n8 ? _mm_loadu_ps((const float *)(p + (i + 4) * ld))
                                   : _mm_setzero_ps();
            r[4 * h + i] = _mm256_insertf128_ps(_mm256_castps128_ps256(lo), hi, 1);
        }
    for (int h = 0; h < 2; h++) {
        __m256 *q = r + 4 * h;
        __m256 t0 = _mm256_unpacklo_ps(q[0], q[1]), t1 = _mm256_unpackhi_ps(q[0], q[1]);
        __m256 t2 = _mm256_unpacklo_ps(q[2], q[3]), t3 = _mm256_unpackhi_ps(q[2], q[3]);
        q[0] = _mm256_shuffle_ps(t0, t2, 0x44); /* word 0 of rows 0-3 | of rows 4-7 */
        q[1] = _mm256_shuffle_ps(t0, t2, 0xee);
        q[2] = _mm256_shuffle_ps(t1, t3, 0x44);
        q[3] = _mm256_shuffle_ps(t1, t3, 0xee);
    }
}

/* acc += words r[0..8) in order, elements [0, m) of them (f32: m <= 8
 * words; bf16: m <= 16 elements, word t the pair (2t, 2t + 1), each half
 * widened to f32 exactly: the low one shifted up, the high one masked). */
static G2 G2_INLINE __m256 g2_fma8(__m256 acc, const __m256 r[8], const float *xk, int m,
                                   int bf16) {
    for (int t = 0; t < 8; t++) {
        if (!bf16) {
            if (t < m) acc = _mm256_fmadd_ps(_mm256_set1_ps(xk[t]), r[t], acc);
            continue;
        }
        __m256i pair = _mm256_castps_si256(r[t]);
        if (2 * t < m)
            acc = _mm256_fmadd_ps(_mm256_set1_ps(xk[2 * t]),
                                  _mm256_castsi256_ps(_mm256_slli_epi32(pair, 16)), acc);
        if (2 * t + 1 < m)
            acc = _mm256_fmadd_ps(
                _mm256_set1_ps(xk[2 * t + 1]),
                _mm256_castsi256_ps(_mm256_and_si256(pair, _mm256_set1_epi32((int)0xffff0000u))),
                acc);
    }
    return acc;
}

/* x[k..k+m) (m <= 16) as f32: f32 x as it is; bf16 x (the pairs read as
 * halves, in order on a little-endian CPU) widened into xs. */
static G2 G2_INLINE const float *g2_x(const void *x, int64_t k, int m, int bf16, float xs[16]) {
    if (!bf16) return (const float *)x + k;
    const uint16_t *h = (const uint16_t *)x + k;
    if (m == 16) {
        for (int q = 0; q < 2; q++) {
            __m128i v = _mm_loadu_si128((const __m128i *)(h + 8 * q));
            __m256i u = _mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16);
            _mm256_storeu_ps(xs + 8 * q, _mm256_castsi256_ps(u));
        }
        return xs;
    }
    for (int t = 0; t < m; t++) {
        uint32_t u = (uint32_t)h[t] << 16;
        __builtin_memcpy(&xs[t], &u, 4);
    }
    return xs;
}

/* One block of n <= 8 G rows (G groups of 8, G independent chains):
 * y[i*sy] for i < n. 32 bytes of each row per step (8 f32 words or 16 bf16
 * elements); pf: warm the next block, one prefetch per row per 64 bytes. */
static G2 G2_INLINE void g2_rows(const int G, int n, int64_t K, const char *w, int64_t ldw_bytes,
                                 const void *x, float *y, int64_t sy, bool pf, int bf16) {
    __m256 acc[4], r[8];
    for (int g = 0; g < G; g++) acc[g] = _mm256_setzero_ps();
    const int es = bf16 ? 2 : 4, per = 32 / es; /* elements per step */
    float xs[16];
    int64_t k = 0;
    for (; k + per <= K; k += per) {
        if (pf && (k * es) % 64 == 0)
            for (int i = 0; i < 8 * G; i++) /* past W's end: no fault, nothing done */
                _mm_prefetch(
                    (const char *)((uintptr_t)w + (uintptr_t)((8 * G + i) * ldw_bytes + k * es)),
                    _MM_HINT_T1);
        const float *xk = g2_x(x, k, per, bf16, xs);
        for (int g = 0; g < G && 8 * g < n; g++) {
            g2_block8(r, w + 8 * g * ldw_bytes, ldw_bytes, n - 8 * g, k * es);
            acc[g] = g2_fma8(acc[g], r, xk, per, bf16);
        }
    }
    if (k < K) { /* the last elements, through a zeroed copy of 32 bytes per row; only
                  * they are multiplied (no 0 x 0 added: a -0 sum would turn +0) */
        int m = (int)(K - k);
        const float *xk = g2_x(x, k, m, bf16, xs);
        for (int g = 0; g < G && 8 * g < n; g++) {
            char tail[8][32] = {{0}};
            for (int i = 0; i < 8 && 8 * g + i < n; i++)
                __builtin_memcpy(tail[i], w + (8 * g + i) * ldw_bytes + k * es, (size_t)(m * es));
            g2_block8(r, tail[0], 32, n - 8 * g, 0);
            acc[g] = g2_fma8(acc[g], r, xk, m, bf16);
        }
    }
    float out[32];
    for (int g = 0; g < G; g++) _mm256_storeu_ps(out + 8 * g, acc[g]);
    for (int i = 0; i < n; i++) y[i * sy] = out[i];
}

static G2 void g2_rows_f32(int n, int64_t K, const char *w, int64_t ldw_bytes, const void *x,
                           float *y, int64_t sy, bool pf) {
    g2_rows(G2_F32_G, n, K, w, ldw_bytes, x, y, sy, pf, 0);
}

static G2 void g2_rows_bf16(int n, int64_t K, const char *w, int64_t ldw_bytes, const void *x,
                            float *y, int64_t sy, bool pf) {
    g2_rows(G2_BF16_G, n, K, w, ldw_bytes, x, y, sy, pf, 1);
}

void nbi_gemv_f32_avx2(int64_t N, int64_t K, const float *w, int64_t ldw, const float *x,
                       float *y, int64_t sy) {
    bool pf = nbi_gemv_prefetching(ldw * 4);
    for (int64_t j = 0; j < N; j += 8 * G2_F32_G)
        g2_rows_f32(N - j < 8 * G2_F32_G ? (int)(N - j) : 8 * G2_F32_G, K,
                    (const char *)(w + j * ldw), ldw * 4, x,
                    y + j * sy, sy, pf);
}

void nbi_gemv_bf16_avx2(int64_t N, int64_t K, const uint16_t *w, int64_t ldw,
                        const uint32_t *xp, float *y, int64_t sy) {
    bool pf = nbi_gemv_prefetching(ldw * 2);
    for (int64_t j = 0; j < N; j += 8 * G2_BF16_G)
        g2_rows_bf16(N - j < 8 * G2_BF16_G ? (int)(N - j) : 8 * G2_BF16_G, K,
                     (const char *)(w + j * ldw), ldw * 2, xp,
                     y + j * sy, sy, pf);
}

/* ------------------------------------------------------------- x W form */
/* lanes [0, m) set */
static G2 G2_INLINE __m256i g2_mask(int m) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(m), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* The lines of NV vectors of a row `ahead` elements below (gemv.c's
 * nbi_vecmat_ahead rows): one prefetch per 64 bytes, no fault past W's end. */
static G2 G2_INLINE void g2_vm_prefetch(const int NV, const float *row, int64_t ahead) {
    for (int v = 0; v < NV; v += 2)
        _mm_prefetch((const char *)((uintptr_t)(row + 8 * v) + (uintptr_t)(ahead * 4)),
                     _MM_HINT_T0);
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
