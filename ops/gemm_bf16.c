/* gemm_bf16.c: the bf16 matrix multiply (f32 accumulation) behind nb_matmul's
 * bf16 path.
 *
 * C (M,N) f32 = A (M,K) B (K,N), each operand bf16 or f32 data rounded to bf16
 * (nbi_bf16_from_f32) as it is packed, in the Goto/BLIS layout of gemm.c:
 *
 *   for jc over N in NC columns
 *     for pc over K in KC steps       pack B[pc.., jc..] into panels of NR columns
 *       for ic over M in MC rows      pack A[ic.., pc..] into panels of MR rows
 *         for jr over NC in NR        micro-kernel: an MR x NR tile of C in
 *           for ir over MC in MR      registers, loaded from C when pc > 0
 *
 * A panel is w lanes (rows of A, w = MR; columns of B, w = NR) by kc steps of k,
 * read through the operand's strides (transposed, expanded and narrowed views
 * alike) and zero-padded past the operand's edge. Two packed layouts, one per
 * kind of path, both of 32-bit elements:
 *
 *   pairs (AVX512_BF16)  word p*w + j holds lane j's k = 2p in its low half and
 *                        k = 2p+1 in its high half (an odd K pads with a zero):
 *                        a row of B's panel is what vdpbf16ps multiplies lane by
 *                        lane, A's words are broadcast to every lane;
 *   f32 (the fallbacks)  element k*w + j is lane j's element k widened to f32
 *                        (exact), as in gemm.c; an f32 FMA micro-kernel.
 *
 * Each c[i][j] is one chain over k in increasing order starting from 0: on the
 * bf16 path one vdpbf16ps per pair (2p, 2p+1) in increasing p (KC is even, so
 * the pairs are the same whatever the blocking; an odd K's last pair is
 * (K-1, zero)), on the fallbacks one multiply-add per k (the product of two
 * bf16 is exact in f32). Padding only ever meets padding, and the tile is
 * stored to C and reloaded between KC blocks, so the bits depend on row i of
 * A, column j of B and the path, never on M, N, the tile, or which part of C a
 * call computes. The paths differ below f32's normal range: vdpbf16ps ignores
 * MXCSR, reads subnormal bf16 as zero and flushes subnormal products and
 * sums, where the fallbacks keep them.
 *
 * Paths (nbi_gemm_bf16_path, from tensor/cpu.c's nbi_isa): AVX512_BF16, then
 * the f32 fallbacks AVX-512F, AVX2+FMA and portable. On aarch64 with FEAT_BF16
 * (the NEON_BF16 and SVE paths) a third layout, BFMMLA's blocks of 2 lanes x
 * 4 k (kstep 4: one chain step per group of 4 k, K zero-padded to a multiple
 * of 4, KC a multiple of 4), packed and multiplied in
 * ops/arch/arm/gemm_bf16_neon.c (see its header for the bits); without it
 * the portable fallback. AMX would plug in above
 * AVX512_BF16: TDPBF16PS takes B in this same pairs layout (a panel row of
 * NR = 32 columns is two tile rows side by side; tileloadd takes the stride),
 * with A packed row-major in tiles of 16 rows x 32 k. It is not written, as
 * no machine at hand has AMX to test it on. The library is built without
 * -march: target attributes enable the wider instructions, and the fallbacks'
 * multiply-adds are explicit FMA intrinsics (this file is compiled without
 * -ffp-contract=fast). */
#include "gemm_internal.h"

#include "../tensor/bf16_internal.h"
#include "../tensor/cpu_internal.h"
#include "arch/arm/gemm_bf16_neon.h"
#include "arch/mca.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#define BF_X86 1
#include <immintrin.h>
#else
#define BF_X86 0
#endif

/* -------------------------------------------------------------- blocking */
/* Register tiles and cache blocks (MC, NC in rows/columns, KC in k, even).
 * bf16 path: 8 rows x 2 zmm of 16 columns (16 accumulators, enough to cover
 * vdpbf16ps's latency at two a cycle; 8 x 3 measured no faster). A KC x NR
 * panel of B (KC*NR*2 bytes, 48 KiB) is reused from L1/L2 across a column of
 * tiles, the MC x KC block of A (384 KiB) stays in L2 and the KC x NC block
 * of B (1.5 MiB) in L3. Measured on Zen 5 (48 KiB L1d, 1 MiB L2): KC 384 to
 * 1024, MC 128 to 256 and NC 512 to 2048 all came within about 3% on the
 * GPT-2 shapes, KC = 768 (GPT-2's width: one K block) best on the 50257-wide
 * product. Fallbacks: as gemm.c's f32 kernels (their blocks hold f32). */
#ifndef BF_MR
#define BF_MR 8
#endif
#ifndef BF_NV
#define BF_NV 2
#endif
#define BF_NR (16 * BF_NV)
#ifndef BF_KC
#define BF_KC 768
#endif
#ifndef BF_MC
#define BF_MC 256
#endif
#ifndef BF_NC
#define BF_NC 1024
#endif
_Static_assert(BF_KC % 2 == 0, "the pairs must not straddle KC blocks");
_Static_assert(BF_MR == 8 || BF_MR % 16 == 0, "A's panels: 8 lanes or whole vectors (bf_store16)");

#define FB512_MR 8
#define FB512_KC 384
#define FB512_MC 96
#define FB512_NC 1024
#define FB2_MR 6
#define FB2_KC 256
#define FB2_MC 120
#define FB2_NC 2048
#define FBP_MR 4
#define FBP_KC 256
#define FBP_MC 128
#define FBP_NC 2048

#define BF_INLINE inline __attribute__((always_inline))
#define BF_UNROLL _Pragma("GCC unroll 32")
#define BF_MIN(x, y) ((x) < (y) ? (x) : (y))

/* ------------------------------------------------------- paths, operands */
/* An operand as lanes by k: element (j, k) at p[j*sj + k*sk], uint16_t (bf16)
 * or float (f32 = 1, rounded to bf16 when read). */
typedef struct {
    const void *p;
    int f32;
    int64_t sj, sk;
} bf_src;

/* Packs lanes [j0, j0+n) and steps [k0, k0+kc) of s into dst in the path's
 * layout: panels of w lanes (MR for A, NR for B; the last one zero-padded),
 * kr packed rows deep, panel q at dst + q*ps (32-bit words). */
typedef void bf_pack_fn(const bf_src *s, int64_t j0, int64_t n, int64_t ps, int64_t k0,
                        int64_t kc, void *dst);
/* c (mc x nc, strides scm, scn) = (load ? c : 0) + the product of a packed
 * block of A (mc rows, panels of MR every psa words) and one of B (nc
 * columns, panels of NR every psb words), each kr packed rows deep. */
typedef void bf_block_fn(int64_t mc, int64_t nc, int64_t kr, const void *pa, int64_t psa,
                         const void *pb, int64_t psb, float *c, int64_t scm, int64_t scn,
                         int load);

typedef struct {
    int mr, nr;         /* register tile */
    int64_t kc, mc, nc; /* cache blocks */
    int kstep;          /* k per packed row: 4 (BFMMLA), 2 (pairs) or 1 (f32) */
    int lw;             /* 32-bit words per lane per packed row: 2 (BFMMLA), else 1 */
    bf_pack_fn *pack_a, *pack_b;
    bf_block_fn *block;
} bf_path;

/* Panels lie this many words (one cache line) past their size apart: sizes
 * are often multiples of 4 KiB, and the packing's stores to every panel in
 * turn would then all fall in one set of the L1 cache. */
#define BF_SKEW 16

/* ---------------------------------------------------------------- driver */
/* The blocked loops of the header, for any path. */
static int bf_run(const bf_path *P, nbi_gemm_ws *ws, int64_t M, int64_t N, int64_t K,
                  const bf_src *A, const bf_src *B, float *c, int64_t scm, int64_t scn) {
    const int64_t kcap = BF_MIN(P->kc, K), krcap = (kcap + P->kstep - 1) / P->kstep;
    const int64_t mpan = (BF_MIN(P->mc, M) + P->mr - 1) / P->mr; /* panels per block */
    const int64_t npan = (BF_MIN(P->nc, N) + P->nr - 1) / P->nr;
    const size_t asz = (size_t)(mpan * (krcap * P->mr * P->lw + BF_SKEW)) * 4;
    if (nbi_gemm_ws_reserve(ws, asz + (size_t)(npan * (krcap * P->nr * P->lw + BF_SKEW)) * 4))
        return -1;
    char *pa = ws->buf, *pb = pa + asz;
    for (int64_t jc = 0; jc < N; jc += P->nc) {
        const int64_t nc = BF_MIN(P->nc, N - jc);
        for (int64_t pc = 0; pc < K; pc += P->kc) {
            const int64_t kc = BF_MIN(P->kc, K - pc), kr = (kc + P->kstep - 1) / P->kstep;
            const int64_t psa = kr * P->mr * P->lw + BF_SKEW, psb = kr * P->nr * P->lw + BF_SKEW;
            P->pack_b(B, jc, nc, psb, pc, kc, pb);
            for (int64_t ic = 0; ic < M; ic += P->mc) {
                const int64_t mc = BF_MIN(P->mc, M - ic);
                P->pack_a(A, ic, mc, psa, pc, kc, pa);
                P->block(mc, nc, kr, pa, psa, pb, psb, c + ic * scm + jc * scn, scm, scn, pc > 0);
            }
        }
    }
    return 0;
}

/* KERN(rows, nv, ...) for the fewest rows compiled that cover mv, of 1, 2,
 * MR/2 and MR (a short product, M = 1, does not pay for MR rows), and nv = 1
 * or NV vectors of columns (wide). */
#define BF_DISPATCH(KERN, MR, NV, mv, wide, ...)                                              \
    do {                                                                                       \
        if ((mv) > (MR) / 2) {                                                                 \
            if (wide) KERN(MR, NV, __VA_ARGS__);                                               \
            else KERN(MR, 1, __VA_ARGS__);                                                     \
        } else if ((mv) > 2) {                                                                 \
            if (wide) KERN((MR) / 2, NV, __VA_ARGS__);                                         \
            else KERN((MR) / 2, 1, __VA_ARGS__);                                               \
        } else if ((mv) == 2) {                                                                \
            if (wide) KERN(2, NV, __VA_ARGS__);                                                \
            else KERN(2, 1, __VA_ARGS__);                                                      \
        } else {                                                                               \
            if (wide) KERN(1, NV, __VA_ARGS__);                                                \
            else KERN(1, 1, __VA_ARGS__);                                                      \
        }                                                                                      \
    } while (0)

/* ------------------------------------------------------------- fallbacks */
/* Operand element off widened to f32 (exact); f32 data is rounded to bf16 first. */
static BF_INLINE float fb_widen(const void *p, const int f32, int64_t off) {
    return nbi_bf16_to_f32(f32 ? nbi_bf16_from_f32(((const float *)p)[off])
                               : ((const uint16_t *)p)[off]);
}

/* The f32 layout: panel q's element k*w + j at dst + q*ps. Lanes contiguous
 * (sj == 1): the source row by row, each one's piece of every panel in turn
 * (a row-major operand is read as it lies); otherwise panel by panel, and
 * when k is contiguous (sk == 1), 8 steps at a time, so that the reads run
 * along k while the writes stay in a few lines. f32: constant at each call. */
static BF_INLINE void fb_pack_as(const bf_src *s, const int f32, int64_t n, const int w,
                                 int64_t ps, int64_t kc, int64_t base, float *restrict dst) {
    const int64_t sj = s->sj, sk = s->sk;
    if (sj == 1) {
        for (int64_t k = 0; k < kc; k++)
            for (int64_t j0 = 0; j0 < n; j0 += w) {
                float *d = dst + j0 / w * ps + k * w;
                const int64_t m = BF_MIN(w, n - j0), off = base + k * sk + j0;
                for (int64_t j = 0; j < m; j++) d[j] = fb_widen(s->p, f32, off + j);
                for (int64_t j = m; j < w; j++) d[j] = 0;
            }
        return;
    }
    for (int64_t j0 = 0; j0 < n; j0 += w) {
        float *d = dst + j0 / w * ps;
        const int64_t m = BF_MIN(w, n - j0), off = base + j0 * sj;
        if (sk == 1)
            for (int64_t k0 = 0; k0 < kc; k0 += 8)
                for (int64_t j = 0; j < w; j++)
                    for (int64_t k = k0; k < BF_MIN(k0 + 8, kc); k++)
                        d[k * w + j] = j < m ? fb_widen(s->p, f32, off + j * sj + k) : 0;
        else
            for (int64_t k = 0; k < kc; k++)
                for (int64_t j = 0; j < w; j++)
                    d[k * w + j] = j < m ? fb_widen(s->p, f32, off + j * sj + k * sk) : 0;
    }
}

/* fb_pack_as with f32 and w (the panel width) constant. */
#define FB_PACK_DEFINE(name, w)                                                                \
    static void name(const bf_src *s, int64_t j0, int64_t n, int64_t ps, int64_t k0,           \
                     int64_t kc, void *dst) {                                                  \
        const int64_t base = j0 * s->sj + k0 * s->sk;                                          \
        if (s->f32) fb_pack_as(s, 1, n, (w), ps, kc, base, dst);                               \
        else fb_pack_as(s, 0, n, (w), ps, kc, base, dst);                                      \
    }

/* One f32 fallback path. P: name prefix; V: vector of W floats; MR x 2W: the
 * register tile; ATTR: its target attribute; FMA(acc, s, b): acc + s*b with s
 * a float broadcast to every lane. */
#define FB_DEFINE(P, V, W, MR, ATTR, FMA)                                                      \
    /* c (rows x nv*W, row stride ldc) = (load ? c : 0) + a b over kc steps, a[k*MR + r],     \
     * b[k*2W + j]; only rows r < mv of c are read and written. rows, nv: constant at each  \
     * call (the accumulators then live in registers). */                                    \
    static ATTR BF_INLINE void P##_kern(const int rows, const int nv, int64_t kc,              \
                                        const float *restrict a, const float *restrict b,      \
                                        float *restrict c, int64_t ldc, int load, int mv) {    \
        V x[MR][2];                                                                            \
        BF_UNROLL for (int r = 0; r < rows; r++) {                                             \
            x[r][0] = x[r][1] = (V){0};                                                        \
            if (load && r < mv) memcpy(&x[r][0], c + r * ldc, sizeof(V));                     \
            if (load && r < mv && nv == 2) memcpy(&x[r][1], c + r * ldc + (W), sizeof(V));     \
        }                                                                                      \
        for (int64_t k = 0; k < kc; k++) {                                                     \
            V b0, b1 = {0};                                                                    \
            memcpy(&b0, b, sizeof(V));                                                         \
            if (nv == 2) memcpy(&b1, b + (W), sizeof(V));                                      \
            BF_UNROLL for (int r = 0; r < rows; r++) {                                         \
                x[r][0] = FMA(x[r][0], a[r], b0);                                              \
                if (nv == 2) x[r][1] = FMA(x[r][1], a[r], b1);                                 \
            }                                                                                  \
            a += (MR);                                                                         \
            b += 2 * (W);                                                                      \
        }                                                                                      \
        BF_UNROLL for (int r = 0; r < rows; r++) {                                             \
            if (r < mv) memcpy(c + r * ldc, &x[r][0], sizeof(V));                              \
            if (r < mv && nv == 2) memcpy(c + r * ldc + (W), &x[r][1], sizeof(V));             \
        }                                                                                      \
    }                                                                                          \
                                                                                               \
    static ATTR void P##_kern_any(int mv, int nv, int64_t kc, const float *a, const float *b,  \
                                  float *c, int64_t ldc, int load) {                           \
        BF_DISPATCH(P##_kern, MR, 2, mv, nv == 2, kc, a, b, c, ldc, load, mv);                 \
    }                                                                                          \
                                                                                               \
    /* Rows [0, mv) and columns [0, nr) of a tile of c: straight into c when the columns are \
     * whole vectors and unit-strided, else through a local tile. */                         \
    static ATTR void P##_tile(int mv, int64_t nr, int64_t kc, const float *a, const float *b,  \
                              float *c, int64_t scm, int64_t scn, int load) {                  \
        const int nv = nr > (W) ? 2 : 1;                                                       \
        if (nr == nv * (W) && scn == 1) {                                                      \
            P##_kern_any(mv, nv, kc, a, b, c, scm, load);                                      \
            return;                                                                            \
        }                                                                                      \
        float t[(MR)*2 * (W)] = {0}; /* the kernel reads whole rows of it */                  \
        for (int r = 0; load && r < mv; r++)                                                   \
            for (int64_t j = 0; j < nr; j++) t[r * 2 * (W) + j] = c[r * scm + j * scn];        \
        P##_kern_any(mv, nv, kc, a, b, t, 2 * (W), load);                                      \
        for (int r = 0; r < mv; r++)                                                           \
            for (int64_t j = 0; j < nr; j++) c[r * scm + j * scn] = t[r * 2 * (W) + j];        \
    }                                                                                          \
                                                                                               \
    static ATTR void P##_block(int64_t mc, int64_t nc, int64_t kr, const void *pa, int64_t psa, \
                               const void *pb, int64_t psb, float *c, int64_t scm, int64_t scn, \
                               int load) {                                                     \
        for (int64_t jr = 0; jr < nc; jr += 2 * (W))                                           \
            for (int64_t ir = 0; ir < mc; ir += (MR))                                          \
                P##_tile((int)BF_MIN((MR), mc - ir), BF_MIN(2 * (W), nc - jr), kr,             \
                         (const float *)pa + ir / (MR)*psa,                                    \
                         (const float *)pb + jr / (2 * (W)) * psb, c + ir * scm + jr * scn,    \
                         scm, scn, load);                                                      \
    }

/* Portable: 128-bit GCC vectors, whatever the baseline target makes of them;
 * a multiply and an add (the bits of an FMA: the product of two bf16 is exact
 * in f32 unless it falls below f32's normal range). */
typedef float fb_v4sf __attribute__((vector_size(16)));
#define FB_MULADD(acc, s, b) ((acc) + (s) * (b))
FB_DEFINE(fbp, fb_v4sf, 4, FBP_MR, , FB_MULADD)
FB_PACK_DEFINE(fbp_pack_a, FBP_MR)
FB_PACK_DEFINE(fbp_pack_b, 8)
static const bf_path path_portable = {FBP_MR, 8, FBP_KC, FBP_MC, FBP_NC, 1, 1, fbp_pack_a, fbp_pack_b, fbp_block};

#if BF_X86
#define FB_AVX2 __attribute__((target("avx2,fma")))
#define FB_AVX512 __attribute__((target("avx512f")))
#define FB_FMA256(acc, s, b) _mm256_fmadd_ps(_mm256_set1_ps(s), (b), (acc))
#define FB_FMA512(acc, s, b) _mm512_fmadd_ps(_mm512_set1_ps(s), (b), (acc))
FB_DEFINE(fb2, __m256, 8, FB2_MR, FB_AVX2, FB_FMA256)
FB_DEFINE(fb512, __m512, 16, FB512_MR, FB_AVX512, FB_FMA512)
FB_PACK_DEFINE(fb2_pack_a, FB2_MR)
FB_PACK_DEFINE(fb2_pack_b, 16)
FB_PACK_DEFINE(fb512_pack_a, FB512_MR)
FB_PACK_DEFINE(fb512_pack_b, 32)
static const bf_path path_avx2 = {FB2_MR, 16, FB2_KC, FB2_MC, FB2_NC, 1, 1, fb2_pack_a, fb2_pack_b, fb2_block};
static const bf_path path_avx512 = {FB512_MR, 32, FB512_KC, FB512_MC, FB512_NC, 1, 1, fb512_pack_a, fb512_pack_b, fb512_block};
#endif

/* ------------------------------------------------------- AVX512_BF16 path */
#if BF_X86
#define BF_ATTR __attribute__((target("avx512f,avx512bf16,avx512bw,avx512vl")))

/* Element off of s as bf16 bits. */
static uint16_t bf_get(const bf_src *s, int64_t off) {
    return s->f32 ? nbi_bf16_from_f32(((const float *)s->p)[off]) : ((const uint16_t *)s->p)[off];
}

/* The first n of 16 lanes (all for n >= 16, none for n <= 0). */
static BF_INLINE __mmask16 bf_mask16(int64_t n) {
    return n >= 16 ? (__mmask16)0xffff : n <= 0 ? 0 : (__mmask16)((1u << n) - 1);
}

/* nbi_bf16_from_f32 on 16 lanes of f32 bits, the result in each lane's low
 * half: ties to even, overflow to infinity (no lane of u that is not a NaN
 * can carry out of 32 bits), every NaN the one bf16_internal.h makes (its
 * value taken from there). Not vcvtneps2bf16: it flushes subnormals to zero
 * and keeps a NaN's sign and payload. */
static BF_ATTR BF_INLINE __m512i bf_round16(__m512i u) {
    const __m512i one = _mm512_set1_epi32(1);
    __m512i bias = _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                                    _mm512_and_si512(_mm512_srli_epi32(u, 16), one));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                            _mm512_set1_epi32(0x7f800000));
    return _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(nbi_bf16_from_f32(NAN)));
}

/* Asks for the line of element off: packing reads DRAM-resident operands
 * ahead of use (4x faster on a 50257-wide B, whose rows no hardware
 * prefetcher follows from one panel to the next). */
static BF_ATTR BF_INLINE void bf_prefetch(const void *p, const int f32, int64_t off) {
    _mm_prefetch((const char *)p + off * (f32 ? 4 : 2), _MM_HINT_T0);
}

/* Elements off.. of lanes m (zeros elsewhere), one per 32-bit lane (low half). */
static BF_ATTR BF_INLINE __m512i bf_lanes(const void *p, const int f32, int64_t off,
                                          __mmask16 m) {
    if (f32)
        return bf_round16(_mm512_castps_si512(_mm512_maskz_loadu_ps(m, (const float *)p + off)));
    return _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, (const uint16_t *)p + off));
}

/* The first n (>= 1) of elements off..off+31 (zeros after) as 16 pairs: word q
 * holds element 2q low, 2q+1 high. */
static BF_ATTR BF_INLINE __m512i bf_pairs(const void *p, const int f32, int64_t off, int64_t n) {
    const __mmask32 m = n >= 32 ? 0xffffffffu : (__mmask32)((1u << n) - 1);
    if (!f32) return _mm512_maskz_loadu_epi16(m, (const uint16_t *)p + off);
    const float *f = (const float *)p + off;
    const __mmask16 mlo = (__mmask16)m, mhi = (__mmask16)(m >> 16);
    __m512i lo = bf_round16(_mm512_castps_si512(_mm512_maskz_loadu_ps(mlo, f)));
    __m512i hi = bf_round16(_mm512_castps_si512(_mm512_maskz_loadu_ps(mhi, f + 16)));
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(lo)),
                              _mm512_cvtepi32_epi16(hi), 1);
}

/* r[i] lane q <- r[q] lane i: a 16 x 16 transpose of 32-bit words. Pairs of
 * rows interleaved by words, then by double words: u[4g+e]'s 128-bit lane L
 * holds rows 4g..4g+3 of column 4L+e; then 128-bit lanes gathered in two
 * rounds of shuffles. */
static BF_ATTR BF_INLINE void bf_tr16(__m512i r[16]) {
    __m512i t[16], u[16];
    BF_UNROLL for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    BF_UNROLL for (int g = 0; g < 16; g += 4) {
        u[g] = _mm512_unpacklo_epi64(t[g], t[g + 2]);
        u[g + 1] = _mm512_unpackhi_epi64(t[g], t[g + 2]);
        u[g + 2] = _mm512_unpacklo_epi64(t[g + 1], t[g + 3]);
        u[g + 3] = _mm512_unpackhi_epi64(t[g + 1], t[g + 3]);
    }
    BF_UNROLL for (int e = 0; e < 4; e++) {
        __m512i v0 = _mm512_shuffle_i32x4(u[e], u[4 + e], 0x88); /* lanes 0, 2 of groups 0, 1 */
        __m512i v1 = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], 0x88); /* of groups 2, 3 */
        __m512i v2 = _mm512_shuffle_i32x4(u[e], u[4 + e], 0xdd); /* lanes 1, 3 */
        __m512i v3 = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], 0xdd);
        r[e] = _mm512_shuffle_i32x4(v0, v1, 0x88);
        r[8 + e] = _mm512_shuffle_i32x4(v0, v1, 0xdd);
        r[4 + e] = _mm512_shuffle_i32x4(v2, v3, 0x88);
        r[12 + e] = _mm512_shuffle_i32x4(v2, v3, 0xdd);
    }
}

/* Lanes j..j+15 (j a multiple of 16) of packed row p into the panels (w
 * wide, every ps words): one store when w is a multiple of 16, else (w == 8)
 * a half into each of two panels, the second when it exists (j + 8 < n). */
static BF_ATTR BF_INLINE void bf_store16(uint32_t *dst, int64_t ps, const int w, int64_t n,
                                         int64_t j, int64_t p, __m512i x) {
    if (w == 8) {
        uint32_t *d = dst + j / 8 * ps + p * 8;
        _mm256_storeu_si256((__m256i *)d, _mm512_castsi512_si256(x));
        if (j + 8 < n) _mm256_storeu_si256((__m256i *)(d + ps), _mm512_extracti64x4_epi64(x, 1));
    } else {
        _mm512_storeu_si512(dst + j / w * ps + p * w + j % w, x);
    }
}

/* The pairs layout: panel q's word p*w + j at dst + q*ps (np pairs), 16
 * lanes at a time. Lanes contiguous (sj == 1): the source two rows at a time
 * (steps 2p, 2p+1) across every panel, interleaved by a shift; k contiguous
 * (sk == 1): the pairs are adjacent in memory already, 16 lanes x 16 pairs
 * transposed at a time; else one element at a time. f32: constant at each
 * call. */
static BF_ATTR BF_INLINE void bf_pack_as(const bf_src *s, const int f32, int64_t n, const int w,
                                         int64_t ps, int64_t kc, int64_t base,
                                         uint32_t *restrict dst) {
    const int64_t np = (kc + 1) / 2, sj = s->sj, sk = s->sk;
    const int64_t nw = (n + w - 1) / w * w; /* lanes with the last panel's padding */
    if (sj == 1)
        for (int64_t p = 0; p < np; p++)
            for (int64_t j = 0; j < nw; j += 16) {
                const __mmask16 lm = bf_mask16(n - j);
                const int64_t off = base + 2 * p * sk + j;
                if (2 * p + 3 < kc) { /* the next two rows */
                    bf_prefetch(s->p, f32, off + 2 * sk);
                    bf_prefetch(s->p, f32, off + 3 * sk);
                }
                __m512i x = bf_lanes(s->p, f32, off, lm);
                if (2 * p + 1 < kc) /* the odd step in the high halves */
                    x = _mm512_or_si512(x, _mm512_slli_epi32(bf_lanes(s->p, f32, off + sk, lm), 16));
                bf_store16(dst, ps, w, n, j, p, x);
            }
    else if (sk == 1)
        for (int64_t j = 0; j < nw; j += 16)
            for (int64_t p0 = 0; p0 < np; p0 += 16) {
                const int64_t off = base + j * sj + 2 * p0;
                for (int q = 0; q < 16 && j + q < n && p0 + 16 < np; q++) { /* the next block */
                    bf_prefetch(s->p, f32, off + q * sj + 32);
                    if (f32) bf_prefetch(s->p, f32, off + q * sj + 48);
                }
                __m512i r[16];
                BF_UNROLL for (int q = 0; q < 16; q++)
                    r[q] = j + q < n ? bf_pairs(s->p, f32, off + q * sj, kc - 2 * p0)
                                     : _mm512_setzero_si512();
                bf_tr16(r);
                for (int q = 0; q < BF_MIN(16, np - p0); q++)
                    bf_store16(dst, ps, w, n, j, p0 + q, r[q]);
            }
    else
        for (int64_t j = 0; j < nw; j++)
            for (int64_t p = 0; p < np; p++) {
                uint32_t lo = 0, hi = 0;
                if (j < n) lo = bf_get(s, base + j * sj + 2 * p * sk);
                if (j < n && 2 * p + 1 < kc) hi = bf_get(s, base + j * sj + (2 * p + 1) * sk);
                dst[j / w * ps + p * w + j % w] = lo | hi << 16;
            }
}

/* bf_pack_as with f32 and w (the panel width) constant. */
#define BF_PACK_DEFINE(name, w)                                                                \
    static BF_ATTR void name(const bf_src *s, int64_t j0, int64_t n, int64_t ps, int64_t k0,   \
                             int64_t kc, void *dst) {                                          \
        const int64_t base = j0 * s->sj + k0 * s->sk;                                          \
        if (s->f32) bf_pack_as(s, 1, n, (w), ps, kc, base, dst);                               \
        else bf_pack_as(s, 0, n, (w), ps, kc, base, dst);                                      \
    }
BF_PACK_DEFINE(bf_pack_a, BF_MR)
BF_PACK_DEFINE(bf_pack_b, BF_NR)

/* The micro-kernel, an MR x NR tile (NR = 16*NV columns):
 *   for p < np:  y[v] = b[p*NR + 16v ..]            (NV rows of B's pairs)
 *                x[r][v] += a[p*MR + r] . y[v]       (vdpbf16ps, a's pair broadcast)
 * c (rows x nv*16, row stride ldc) = (load ? c : 0) + a b; only rows r < mv and
 * lanes m[v] of c are read and written. rows, nv: constant at each call. */
static BF_ATTR BF_INLINE void bf_kern(const int rows, const int nv, int64_t np,
                                      const uint32_t *restrict a, const uint32_t *restrict b,
                                      float *restrict c, int64_t ldc, int load, int mv,
                                      const __mmask16 *m) {
    __m512 x[BF_MR][BF_NV];
    BF_UNROLL for (int r = 0; r < rows; r++) {
        BF_UNROLL for (int v = 0; v < nv; v++) {
            x[r][v] = load && r < mv ? _mm512_maskz_loadu_ps(m[v], c + r * ldc + 16 * v)
                                     : _mm512_setzero_ps();
        }
    }
    for (int64_t p = 0; p < np; p++) {
        if (rows == BF_MR && nv == BF_NV) NBI_MCA_BEGIN("gemm_bf16_avx512bf16"); /* make mca */
        __m512bh y[BF_NV];
        BF_UNROLL for (int v = 0; v < nv; v++) y[v] = (__m512bh)_mm512_loadu_si512(b + 16 * v);
        BF_UNROLL for (int r = 0; r < rows; r++) {
            const __m512bh s = (__m512bh)_mm512_set1_epi32((int)a[r]);
            BF_UNROLL for (int v = 0; v < nv; v++) x[r][v] = _mm512_dpbf16_ps(x[r][v], s, y[v]);
        }
        a += BF_MR;
        b += BF_NR;
        if (rows == BF_MR && nv == BF_NV) NBI_MCA_END("gemm_bf16_avx512bf16");
    }
    BF_UNROLL for (int r = 0; r < rows; r++) {
        BF_UNROLL for (int v = 0; v < nv; v++) {
            if (r < mv) _mm512_mask_storeu_ps(c + r * ldc + 16 * v, m[v], x[r][v]);
        }
    }
}

static BF_ATTR void bf_kern_any(int mv, int64_t nr, int64_t np, const uint32_t *a,
                                const uint32_t *b, float *c, int64_t ldc, int load) {
    __mmask16 m[BF_NV];
    for (int v = 0; v < BF_NV; v++) m[v] = bf_mask16(nr - 16 * v);
    BF_DISPATCH(bf_kern, BF_MR, BF_NV, mv, nr > 16, np, a, b, c, ldc, load, mv, m);
}

/* Rows [0, mv) and columns [0, nr) of a tile of c: straight into c (masked at
 * the N edge) when c's columns are unit-strided, else through a local tile. */
static BF_ATTR void bf_tile(int mv, int64_t nr, int64_t np, const uint32_t *a, const uint32_t *b,
                            float *c, int64_t scm, int64_t scn, int load) {
    if (scn == 1) {
        bf_kern_any(mv, nr, np, a, b, c, scm, load);
        return;
    }
    float t[BF_MR * BF_NR];
    for (int r = 0; load && r < mv; r++)
        for (int64_t j = 0; j < nr; j++) t[r * BF_NR + j] = c[r * scm + j * scn];
    bf_kern_any(mv, nr, np, a, b, t, BF_NR, load);
    for (int r = 0; r < mv; r++)
        for (int64_t j = 0; j < nr; j++) c[r * scm + j * scn] = t[r * BF_NR + j];
}

static BF_ATTR void bf_block(int64_t mc, int64_t nc, int64_t kr, const void *pa, int64_t psa,
                             const void *pb, int64_t psb, float *c, int64_t scm, int64_t scn,
                             int load) {
    for (int64_t jr = 0; jr < nc; jr += BF_NR)
        for (int64_t ir = 0; ir < mc; ir += BF_MR)
            bf_tile((int)BF_MIN(BF_MR, mc - ir), BF_MIN(BF_NR, nc - jr), kr,
                    (const uint32_t *)pa + ir / BF_MR * psa,
                    (const uint32_t *)pb + jr / BF_NR * psb, c + ir * scm + jr * scn, scm, scn,
                    load);
}

static const bf_path path_bf16 = {BF_MR, BF_NR, BF_KC, BF_MC, BF_NC, 2, 1, bf_pack_a, bf_pack_b, bf_block};
#endif

/* ------------------------------------------------------ aarch64 BFMMLA path */
/* ops/arch/arm/gemm_bf16_neon.c: groups of 4 k (kstep 4, two words per lane
 * per group), 8 x 12 tiles. Blocks as the AVX512_BF16 path's (bf16 panels);
 * KC a multiple of 4 so that no group straddles two k blocks. */
#if NBI_ARCH_ARM64
#define MM_KC 768
#define MM_MC 256
#define MM_NC 1020
_Static_assert(MM_KC % 4 == 0, "the groups must not straddle KC blocks");

static void mm_pack_a(const bf_src *s, int64_t j0, int64_t n, int64_t ps, int64_t k0, int64_t kc,
                      void *dst) {
    const int64_t off = j0 * s->sj + k0 * s->sk;
    nbi_mmla_pack((const char *)s->p + off * (s->f32 ? 4 : 2), s->f32, s->sj, s->sk, n,
                  NBI_MMLA_MR, ps, kc, dst);
}
static void mm_pack_b(const bf_src *s, int64_t j0, int64_t n, int64_t ps, int64_t k0, int64_t kc,
                      void *dst) {
    const int64_t off = j0 * s->sj + k0 * s->sk;
    nbi_mmla_pack((const char *)s->p + off * (s->f32 ? 4 : 2), s->f32, s->sj, s->sk, n,
                  NBI_MMLA_NR, ps, kc, dst);
}
static const bf_path path_mmla = {NBI_MMLA_MR, NBI_MMLA_NR, MM_KC,     MM_MC,         MM_NC,
                                  4,           2,           mm_pack_a, mm_pack_b, nbi_mmla_block};
#endif

/* ------------------------------------------------------------- the blocks */
/* A path's kc, mc, nc from the CPU's caches by gemm.c's model (BLIS's), for
 * the bytes a packed k step takes per lane (2 on the bf16 path, 4 widened to
 * f32), once per process and path; the constants above are what a build
 * with BF_CONSTANT_BLOCKS uses. The last k block joins the one before when
 * it is at most half a block: one pass over C fewer, which for a wide
 * product (GPT-2's logits: C is 256 x 50257 f32, 51 MB) costs more than a
 * panel of B spilling from L1. kc stays even (pairs). */
static nbi_gemm_blocks sized[NBI_ISA_COUNT];
static pthread_once_t sized_once = PTHREAD_ONCE_INIT;

static void size_paths(void) {
    const nbi_cpu *cpu = nbi_cpu_info();
    sized[NBI_ISA_PORTABLE] = nbi_gemm_blocking(cpu, path_portable.mr, path_portable.nr, 4);
#if BF_X86
    sized[NBI_ISA_AVX2] = nbi_gemm_blocking(cpu, path_avx2.mr, path_avx2.nr, 4);
    sized[NBI_ISA_AVX512] = nbi_gemm_blocking(cpu, path_avx512.mr, path_avx512.nr, 4);
    sized[NBI_ISA_AVX512BF16] = nbi_gemm_blocking(cpu, path_bf16.mr, path_bf16.nr, 2);
#endif
#if NBI_ARCH_ARM64
    sized[NBI_ISA_NEON_BF16] = nbi_gemm_blocking(cpu, path_mmla.mr, path_mmla.nr, 2);
#endif
}

static void sized_from_cpu(bf_path *p, int64_t K) {
#ifndef BF_CONSTANT_BLOCKS
    pthread_once(&sized_once, size_paths);
    const nbi_gemm_blocks b = sized[nbi_gemm_bf16_path()];
    const int64_t q = p->kstep > 2 ? p->kstep : 2; /* kc: whole pairs or groups */
    p->kc = b.kc / q * q > 0 ? b.kc / q * q : q;
    p->mc = (b.mc + p->mr - 1) / p->mr * p->mr;
    p->nc = (b.nc + p->nr - 1) / p->nr * p->nr;
    if (K > p->kc && K <= p->kc + p->kc / 2) p->kc = (K + q - 1) / q * q;
#else
    (void)p;
    (void)K;
#endif
}

/* ------------------------------------------------------------------ entry */
int nbi_gemm_bf16_path(void) {
#if BF_X86 || NBI_ARCH_ARM64
    const int isa = nbi_isa();
#endif
#if BF_X86
    /* NBI_ISA_AMX: an AMX path would go first here (see the header). */
    if (isa >= NBI_ISA_AVX512BF16) return NBI_ISA_AVX512BF16;
    if (isa >= NBI_ISA_AVX512) return NBI_ISA_AVX512;
    if (isa >= NBI_ISA_AVX2) return NBI_ISA_AVX2;
#elif NBI_ARCH_ARM64
    /* SVE's bf16 products are NEON_BF16's (BFMMLA on 128-bit registers) */
    if (isa >= NBI_ISA_NEON_BF16 && (nbi_cpu_info()->features & NBI_CPU_BF16) &&
        nbi_mmla_compiled())
        return NBI_ISA_NEON_BF16;
#endif
    return NBI_ISA_PORTABLE;
}

int nbi_gemm_bf16(nbi_gemm_ws *ws, int64_t M, int64_t N, int64_t K, const void *a, int a_f32,
                  int64_t sam, int64_t sak, const void *b, int b_f32, int64_t sbk, int64_t sbn,
                  float *c, int64_t scm, int64_t scn) {
    if (M <= 0 || N <= 0) return 0;
    if (K <= 0) {
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) c[i * scm + j * scn] = 0;
        return 0;
    }
    const bf_src A = {a, a_f32, sam, sak}, B = {b, b_f32, sbn, sbk};
    const bf_path *P = &path_portable;
    switch (nbi_gemm_bf16_path()) {
#if BF_X86
    case NBI_ISA_AVX512BF16: P = &path_bf16; break;
    case NBI_ISA_AVX512: P = &path_avx512; break;
    case NBI_ISA_AVX2: P = &path_avx2; break;
#endif
#if NBI_ARCH_ARM64
    case NBI_ISA_NEON_BF16: P = &path_mmla; break;
#endif
    default: break;
    }
    bf_path p = *P;
    sized_from_cpu(&p, K);
    return bf_run(&p, ws, M, N, K, &A, &B, c, scm, scn);
}
