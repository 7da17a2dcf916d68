/* gemv.c: matrix-vector products for nb_matmul's one-row (or one-column)
 * products, the shape of every product of token-by-token generation:
 *
 *   rows form  y (N) = W (N,K) x (K)   y[j] = sum over k = 0..K-1 of w[j][k] x[k]
 *   x W form   y (N) = x (K) W (K,N)   y[j] = sum over k = 0..K-1 of x[k] w[k][j]
 *
 * with W's rows contiguous (w[j][k] at w[j*ldw + k], resp. w[k][j] at
 * w[k*ldw + j]). The rows form is a linear layer's x (1,K) w^T, a row-major
 * matrix times a vector (lm_head), or attention's q K^T over a KV cache (one
 * per head); the x W form is attention's p V over the cache. The general
 * kernels (gemm.c, gemm_bf16.c) pack W for every call, and for one row of
 * output that copy is most of the work: here W is streamed once, in place.
 *
 * Bits: the same as the general kernel on the same path. Each y[j] is one
 * chain of fused multiply-adds over k in increasing order from 0 (f32), or
 * one vdpbf16ps per pair (2p, 2p+1) in increasing p, an odd K's last pair
 * being (K-1, zero) (bf16): exactly what gemm.c's AVX-512 path and
 * gemm_bf16.c's AVX512_BF16 path compute. In the rows form 16 outputs are
 * made at once, one per lane of a vector: a block of 16 rows x 8 words (f32
 * elements or bf16 pairs, 32 bytes per row) is loaded and transposed in
 * registers, so that vector t holds word t of the 16 rows, then multiplied
 * in order. The rows of a block are 16 sequential streams through W (a
 * contiguous block of 16 rows). In the x W form the lanes are W's columns
 * already: one FMA per row of W per vector of columns. Outputs are
 * independent of each other, so any split of them (over threads, by the
 * caller) gives the same bits.
 *
 * Paths: AVX-512F (f32) and AVX512_BF16 (bf16) here, from tensor/cpu.c's
 * nbi_isa; AVX2+FMA (f32, and bf16 weights widened to f32 where gemm_bf16.c
 * takes its f32 fallback, AVX-512F without BF16 too) in gemv_avx2.c, with
 * that path's bits; on aarch64 NEON f32 (arch/arm/gemv_neon.c: one FMA
 * chain per output, as gemm.c's aarch64 paths) and BFMMLA bf16
 * (arch/arm/gemm_bf16_neon.c: gemm_bf16.c's groups of 4 k); elsewhere the
 * functions return 1 and the caller takes the general kernel, whose bits
 * these are. */
#include "gemm_internal.h"

#include "../tensor/bf16_internal.h"
#include "../tensor/cpu_internal.h"
#include "gemv_internal.h"
#include "arch/arm/gemm_bf16_neon.h"

#include <stdbool.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#define GV_X86 1
#include <immintrin.h>
#else
#define GV_X86 0
#endif

/* A block of 16 rows fits in half the L2 (1 MiB assumed when unknown). */
bool nbi_gemv_prefetching(int64_t ldw_bytes) {
    int64_t l2 = nbi_cpu_info()->l2;
    return 16 * ldw_bytes <= (l2 > 0 ? l2 : (int64_t)1 << 20) / 2;
}

/* Rows to prefetch ahead in the x W form for `bytes` read per row: about
 * 8 KiB ahead, 8 to 32 rows (measured on attention's V, 256 bytes a row:
 * 16 and 32 rows within 8%, 64 rows 20% slower, none 2.8x slower). */
int64_t nbi_vecmat_ahead(int64_t bytes) {
    int64_t rows = 8192 / (bytes > 0 ? bytes : 1);
    return rows < 8 ? 8 : rows > 32 ? 32 : rows;
}

#if GV_X86
#define GV_AVX512 __attribute__((target("avx512f")))
#define GV_BF16 __attribute__((target("avx512f,avx512bw,avx512bf16")))
#define GV_INLINE inline __attribute__((always_inline))

/* Warms the next block of 16 rows (row stride ldw_bytes) at the words about
 * to be read in this one, one line per row: 16 more streams running a block
 * ahead, so that each block's short rows (3 KiB of f32, 1.5 KiB of bf16 at
 * K = 768) do not start cold; GPT-2 124M generation 50 -> 60 tokens/s (f32)
 * and 85 -> 117 (bf16) here on 1 thread. Used when a block fits in half the
 * L2 read at run time (nbi_gemv_prefetching: else the lines would be evicted
 * before their turn). Prefetches do not fault: past W's end they do nothing. */
static GV_AVX512 GV_INLINE void gv_prefetch16(uintptr_t next_block, int64_t ldw_bytes) {
    for (int i = 0; i < 16; i++)
        _mm_prefetch((const char *)(next_block + (uintptr_t)(i * ldw_bytes)), _MM_HINT_T1);
}

/* y[j*sy] for the block's n rows from the lanes of acc */
static GV_AVX512 GV_INLINE void gv_store(float *y, int64_t sy, int n, __m512 acc) {
    if (sy == 1) {
        _mm512_mask_storeu_ps(y, (__mmask16)((1u << n) - 1), acc);
        return;
    }
    float tmp[16];
    _mm512_storeu_ps(tmp, acc);
    for (int i = 0; i < n; i++) y[i * sy] = tmp[i];
}

/* ------------------------------------------------------------------- f32 */
/* r[t] = word t of rows 0..15 (row i at w + i*ld, 8 words; rows >= n
 * zeros): each register is four 16-byte loads, rows i, i+4, i+8, i+12 side
 * by side, so that a 4 x 4 transpose within each 128-bit lane finishes it
 * (16 shuffles and 24 inserts for 512 bytes, where a 16 x 16 transpose of
 * whole-line loads took 64 shuffles for 1 KiB and read 32-34 GB/s on one
 * thread here against 39-41 now, f32 3072 x 768; bf16 37-38 -> 39-40). */
static GV_AVX512 GV_INLINE __m128 gv_quarter(const char *p, int64_t ld_bytes, int row, int n) {
    return row < n ? _mm_loadu_ps((const float *)(p + row * ld_bytes)) : _mm_setzero_ps();
}

static GV_AVX512 GV_INLINE void gv_block16x8(__m512 r[8], const void *w, int64_t ld_bytes, int n) {
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < 4; i++) { /* the lane numbers are immediates: written out; from
                                       * zeros (a cast with an undefined upper part read
                                       * 34 GB/s here against 41) */
            const char *p = (const char *)w + 16 * h;
            __m512 v = _mm512_insertf32x4(_mm512_setzero_ps(), gv_quarter(p, ld_bytes, i, n), 0);
            v = _mm512_insertf32x4(v, gv_quarter(p, ld_bytes, i + 4, n), 1);
            v = _mm512_insertf32x4(v, gv_quarter(p, ld_bytes, i + 8, n), 2);
            r[4 * h + i] = _mm512_insertf32x4(v, gv_quarter(p, ld_bytes, i + 12, n), 3);
        }
    for (int h = 0; h < 2; h++) {
        __m512 *q = r + 4 * h;
        __m512 t0 = _mm512_unpacklo_ps(q[0], q[1]), t1 = _mm512_unpackhi_ps(q[0], q[1]);
        __m512 t2 = _mm512_unpacklo_ps(q[2], q[3]), t3 = _mm512_unpackhi_ps(q[2], q[3]);
        q[0] = _mm512_shuffle_ps(t0, t2, 0x44);
        q[1] = _mm512_shuffle_ps(t0, t2, 0xee);
        q[2] = _mm512_shuffle_ps(t1, t3, 0x44);
        q[3] = _mm512_shuffle_ps(t1, t3, 0xee);
    }
}

/* 16 rows (n of them valid): acc lane i = chain over k of w[i][k] x[k]. One
 * group of 16 rows at a time: 16 sequential streams through W, which the
 * hardware prefetchers follow (measured here: two groups side by side, 32
 * streams, read 17 GB/s against 31, and again 31-32 against 39-41 with
 * gv_block16x8's loads; prefetches ahead in the block's own rows did not
 * help), with the next block's rows warmed (gv_prefetch16). */
static GV_AVX512 void gv_f32_rows(int n, int64_t K, const float *w, int64_t ldw,
                                  const float *x, float *y, int64_t sy, bool pf) {
    __m512 acc = _mm512_setzero_ps(), r[8];
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
        if (pf && k % 16 == 0) /* one line per row per 64 bytes read */
            gv_prefetch16((uintptr_t)(w + k) + (uintptr_t)(16 * ldw * 4), ldw * 4);
        gv_block16x8(r, w + k, ldw * 4, n);
        for (int t = 0; t < 8; t++) acc = _mm512_fmadd_ps(_mm512_set1_ps(x[k + t]), r[t], acc);
    }
    if (k < K) { /* the last m < 8 words, through a zeroed copy; only those are multiplied
                  * (no zero padding in k: an added 0 x 0 would turn a -0 sum into +0) */
        int m = (int)(K - k);
        float tail[16][8] = {{0}};
        for (int i = 0; i < n; i++) memcpy(tail[i], w + i * ldw + k, (size_t)m * sizeof(float));
        gv_block16x8(r, tail[0], 32, n);
        for (int t = 0; t < m; t++) acc = _mm512_fmadd_ps(_mm512_set1_ps(x[k + t]), r[t], acc);
    }
    gv_store(y, sy, n, acc);
}

static GV_AVX512 void gv_f32(int64_t N, int64_t K, const float *w, int64_t ldw, const float *x,
                             float *y, int64_t sy) {
    bool pf = nbi_gemv_prefetching(ldw * 4);
    for (int64_t j = 0; j < N; j += 16)
        gv_f32_rows(N - j < 16 ? (int)(N - j) : 16, K, w + j * ldw, ldw, x, y + j * sy, sy, pf);
}

/* ------------------------------------------------------------------ bf16 */
/* 16 rows of bf16 (n of them valid), x as pairs: word p = x[2p] (low
 * half) | x[2p+1] (high half), an odd K's last high half 0. 8 pairs of
 * each row per step, one vdpbf16ps per pair in order. */
static GV_BF16 void gv_bf16_rows(int n, int64_t K, const uint16_t *w, int64_t ldw,
                                 const uint32_t *xp, float *y, int64_t sy, bool pf) {
    __m512 acc = _mm512_setzero_ps(), r[8];
    const int64_t P = K / 2; /* whole pairs in each row */
    int64_t p = 0;
    for (; p + 8 <= P; p += 8) {
        if (pf && p % 16 == 0) /* one line per row per 64 bytes read */
            gv_prefetch16((uintptr_t)(w + 2 * p) + (uintptr_t)(16 * ldw * 2), ldw * 2);
        gv_block16x8(r, w + 2 * p, ldw * 2, n);
        for (int t = 0; t < 8; t++)
            acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_set1_epi32((int)xp[p + t]),
                                   (__m512bh)_mm512_castps_si512(r[t]));
    }
    if (p < P) { /* the last m < 8 pairs, through a zeroed copy */
        int m = (int)(P - p);
        uint32_t tail[16][8] = {{0}};
        for (int i = 0; i < n; i++) memcpy(tail[i], w + i * ldw + 2 * p, (size_t)m * 4);
        gv_block16x8(r, tail[0], 32, n);
        for (int t = 0; t < m; t++)
            acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_set1_epi32((int)xp[p + t]),
                                   (__m512bh)_mm512_castps_si512(r[t]));
    }
    if (K % 2) { /* the pair (K-1, zero): the rows' last elements, read one by one */
        uint32_t last[16] = {0};
        for (int i = 0; i < n; i++) last[i] = w[i * ldw + K - 1];
        acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_set1_epi32((int)xp[P]),
                               (__m512bh)_mm512_loadu_si512(last));
    }
    gv_store(y, sy, n, acc);
}

static GV_BF16 void gv_bf16(int64_t N, int64_t K, const uint16_t *w, int64_t ldw,
                            const uint32_t *xp, float *y, int64_t sy) {
    bool pf = nbi_gemv_prefetching(ldw * 2);
    for (int64_t j = 0; j < N; j += 16)
        gv_bf16_rows(N - j < 16 ? (int)(N - j) : 16, K, w + j * ldw, ldw, xp, y + j * sy, sy, pf);
}

/* --------------------------------------------------------- x W form, f32 */
/* Columns [0, n) of y, n in (16 (NV - 1), 16 NV]: NV vectors of columns
 * (the edge masked; masked lanes read nothing), each lane one chain
 * y[j] = fma over k of (x[k], w[k][j]) from +0, rows of W in order, with
 * the rows nbi_vecmat_ahead rows below prefetched (without: 17 GB/s
 * against 48-52 on attention's V here: the FMA chains' latency keeps
 * too few loads in flight for the hardware prefetchers). */
static GV_AVX512 GV_INLINE void gv_vm(const int NV, int n, int64_t K, const float *w,
                                      int64_t ldw, const float *x, float *y) {
    __m512 acc[8];
    __mmask16 m[8];
    const int64_t ahead = nbi_vecmat_ahead(NV * 64);
    for (int v = 0; v < NV; v++) {
        int left = n - 16 * v;
        m[v] = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
        acc[v] = _mm512_setzero_ps();
    }
    for (int64_t k = 0; k < K; k++) {
        const __m512 s = _mm512_set1_ps(x[k]);
        for (int v = 0; v < NV; v++) /* no fault past W's end */
            _mm_prefetch(
                (const char *)((uintptr_t)(w + 16 * v) + (uintptr_t)((k + ahead) * ldw * 4)),
                _MM_HINT_T0);
        for (int v = 0; v < NV; v++)
            acc[v] = _mm512_fmadd_ps(s, _mm512_maskz_loadu_ps(m[v], w + k * ldw + 16 * v), acc[v]);
    }
    for (int v = 0; v < NV; v++) _mm512_mask_storeu_ps(y + 16 * v, m[v], acc[v]);
}

/* 128 columns (8 vectors) at a time: every row of W in turn */
static GV_AVX512 void gv_vm_cols(int n, int64_t K, const float *w, int64_t ldw, const float *x,
                                 float *y) {
    switch ((n + 15) / 16) {
    case 1: gv_vm(1, n, K, w, ldw, x, y); break;
    case 2: gv_vm(2, n, K, w, ldw, x, y); break;
    case 3: gv_vm(3, n, K, w, ldw, x, y); break;
    case 4: gv_vm(4, n, K, w, ldw, x, y); break;
    case 5: gv_vm(5, n, K, w, ldw, x, y); break;
    case 6: gv_vm(6, n, K, w, ldw, x, y); break;
    case 7: gv_vm(7, n, K, w, ldw, x, y); break;
    default: gv_vm(8, n, K, w, ldw, x, y); break;
    }
}

static GV_AVX512 void gv_vecmat(int64_t N, int64_t K, const float *w, int64_t ldw,
                                const float *x, float *y) {
    for (int64_t j = 0; j < N; j += 128)
        gv_vm_cols(N - j < 128 ? (int)(N - j) : 128, K, w + j, ldw, x, y + j);
}
#endif /* GV_X86 */

/* The f32 path: 2 AVX-512, 1 AVX2+FMA, else 0 (not here: the caller takes
 * the general kernel). The general f32 kernel's path is gemm.c's, which
 * tests may force lower: this one follows it. */
static int gv_path(void) {
#if GV_X86
    int p = nbi_gemm_path_now();
    return p == NBI_GEMM_AVX512 ? 2 : p == NBI_GEMM_AVX2 ? 1 : 0;
#elif defined(__aarch64__)
    /* 4: NEON (ops/arch/arm/gemv_neon.c), where gemm.c runs a vector path:
     * all of aarch64's give one FMA chain per element, as it does */
    return nbi_gemm_path_now() != NBI_GEMM_PORTABLE ? 4 : 0;
#else
    return 0;
#endif
}

/* The bf16 path: 3 vdpbf16ps (AVX512_BF16), 1 widened to f32 FMA (where
 * gemm_bf16.c falls to its AVX-512F or AVX2 f32 kernel), else 0. */
static int gv_bf16_path(void) {
#if GV_X86
    int p = nbi_gemm_bf16_path();
    return p == NBI_ISA_AVX512BF16 ? 3 : p == NBI_ISA_AVX512 || p == NBI_ISA_AVX2 ? 1 : 0;
#elif defined(__aarch64__)
    /* 5: BFMMLA (ops/arch/arm/gemm_bf16_neon.c), gemm_bf16.c's chains */
    return nbi_gemm_bf16_path() == NBI_ISA_NEON_BF16 ? 5 : 0;
#else
    return 0;
#endif
}

int nbi_gemv_f32(int64_t N, int64_t K, const float *w, int64_t ldw, const float *x, float *y,
                 int64_t sy) {
    int p = gv_path();
    if (!p) return 1;
    if (N <= 0) return 0;
#if GV_X86
    if (p == 2) gv_f32(N, K, w, ldw, x, y, sy);
    else nbi_gemv_f32_avx2(N, K, w, ldw, x, y, sy);
#elif defined(__aarch64__)
    nbi_gemv_f32_neon(N, K, w, ldw, x, y, sy);
#else
    (void)K, (void)w, (void)ldw, (void)x, (void)y, (void)sy;
#endif
    return 0;
}

int nbi_vecmat_f32(int64_t N, int64_t K, const float *w, int64_t ldw, const float *x, float *y) {
    int p = gv_path();
    if (!p) return 1;
    if (N <= 0) return 0;
#if GV_X86
    if (p == 2) gv_vecmat(N, K, w, ldw, x, y);
    else nbi_vecmat_f32_avx2(N, K, w, ldw, x, y);
#elif defined(__aarch64__)
    nbi_vecmat_f32_neon(N, K, w, ldw, x, y);
#else
    (void)K, (void)w, (void)ldw, (void)x, (void)y;
#endif
    return 0;
}

void nbi_gemv_pairs(int64_t K, const void *x, int x_f32, int64_t sx, uint32_t *xp) {
    for (int64_t p = 0; 2 * p < K; p++) {
        uint32_t lo, hi = 0;
        if (x_f32) {
            lo = nbi_bf16_from_f32(((const float *)x)[2 * p * sx]);
            if (2 * p + 1 < K) hi = nbi_bf16_from_f32(((const float *)x)[(2 * p + 1) * sx]);
        } else {
            lo = ((const uint16_t *)x)[2 * p * sx];
            if (2 * p + 1 < K) hi = ((const uint16_t *)x)[(2 * p + 1) * sx];
        }
        xp[p] = lo | hi << 16;
    }
}

int nbi_gemv_bf16(int64_t N, int64_t K, const uint16_t *w, int64_t ldw, const uint32_t *xp,
                  float *y, int64_t sy) {
    int p = gv_bf16_path();
    if (!p) return 1;
    if (N <= 0) return 0;
#if GV_X86
    if (p == 3) gv_bf16(N, K, w, ldw, xp, y, sy);
    else nbi_gemv_bf16_avx2(N, K, w, ldw, xp, y, sy);
#elif defined(__aarch64__)
    nbi_mmla_gemv(N, K, w, ldw, xp, y, sy);
#else
    (void)K, (void)w, (void)ldw, (void)xp, (void)y, (void)sy;
#endif
    return 0;
}

int nbi_gemv_available(int bf16) { return bf16 ? gv_bf16_path() > 0 : gv_path() > 0; }
