/* gemm_bf16_neon.c: the bf16 products on aarch64 with BFMMLA (FEAT_BF16):
 * packing into BFMMLA's blocks, the 8 x 12 micro-kernel and the one-row
 * gemv, with the bits gemm_bf16_neon.h describes.
 *
 * Micro-kernel: 4 row pairs of A x 6 column pairs of B, 24 accumulators of
 * 2 x 2 f32 sums (q-registers), each k group 4 loads of A, 6 of B and 24
 * BFMMLA (12 x 8 x 4 multiply-adds); with A's 4 registers and one or two of
 * B, 30 of the 32 vector registers. The accumulators hold rows 2r, 2r+1 of
 * columns 2c, 2c+1 as [c(2r,2c), c(2r,2c+1), c(2r+1,2c), c(2r+1,2c+1)]: two
 * neighbouring blocks' low halves are 4 columns of row 2r, their high halves
 * of row 2r+1 (a 64-bit zip un-interleaves them on the way to C and back).
 *
 * Built without -march: the kernels carry a target attribute for the bf16
 * instructions and run only where the CPU has them (gemm_bf16.c and gemv.c
 * check NBI_CPU_BF16). Compilers without the bf16 intrinsics (clang before
 * 16 without -march=...+bf16) compile no kernel: nbi_mmla_compiled() = 0. */
#include "gemm_bf16_neon.h"

#include "../../../tensor/bf16_internal.h"
#include "../mca.h"

#include <string.h>

#if defined(__aarch64__) &&                                                                    \
    ((defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 10) ||                          \
     defined(__ARM_FEATURE_BF16_VECTOR_ARITHMETIC))
#define MM_ON 1
#include <arm_neon.h>
#if defined(__ARM_FEATURE_BF16_VECTOR_ARITHMETIC)
#define MM_ATTR
#else
#define MM_ATTR __attribute__((target("arch=armv8.2-a+bf16")))
#endif
#else
#define MM_ON 0
#endif

#define MM_INLINE inline __attribute__((always_inline))
#define MM_UNROLL _Pragma("GCC unroll 32")
#define MM_MIN(x, y) ((x) < (y) ? (x) : (y))

int nbi_mmla_compiled(void) { return MM_ON; }

/* ------------------------------------------------------------- packing */
/* Element off as bf16 bits (f32 rounded). */
static MM_INLINE uint16_t mm_get(const void *p, const int f32, int64_t off) {
    return f32 ? nbi_bf16_from_f32(((const float *)p)[off]) : ((const uint16_t *)p)[off];
}

/* The layout of the header, f32 constant at each call. Reads run along the
 * operand's unit stride: along k within a lane when k is contiguous (a
 * row-major A, a transposed B: whole groups of 4 k are one 8-byte copy, or
 * 4 roundings), across the lanes of one k otherwise; the padding (lanes
 * past n, k past kc) is written as zeros outside the copying loops. */
static MM_INLINE void mm_pack_as(const void *p, const int f32, int64_t sj, int64_t sk,
                                 int64_t n, int w, int64_t ps, int64_t kc, uint16_t *dst) {
    const int64_t kg = (kc + 3) / 4, kf = kc / 4; /* groups, whole groups */
    for (int64_t j0 = 0; j0 < n; j0 += w) {
        uint16_t *d = dst + j0 / w * ps * 2;
        const int64_t m = MM_MIN(w, n - j0), base = j0 * sj;
        if (sk == 1 || sj != 1) {
            for (int64_t l = 0; l < w; l++) {
                uint16_t *dl = d + (l / 2) * 8 + (l % 2) * 4;
                const int64_t off = base + l * sj;
                int64_t g = 0;
                if (l < m && sk == 1)
                    for (; g < kf; g++) {
                        uint16_t *b = dl + g * 4 * w;
                        if (f32)
                            for (int e = 0; e < 4; e++)
                                b[e] = nbi_bf16_from_f32(((const float *)p)[off + 4 * g + e]);
                        else
                            memcpy(b, (const uint16_t *)p + off + 4 * g, 8);
                    }
                for (; g < kg; g++) {
                    uint16_t *b = dl + g * 4 * w;
                    for (int e = 0; e < 4; e++) {
                        const int64_t k = 4 * g + e;
                        b[e] = l < m && k < kc ? mm_get(p, f32, off + k * sk) : 0;
                    }
                }
            }
        } else { /* lanes contiguous */
            for (int64_t g = 0; g < kg; g++)
                for (int e = 0; e < 4; e++) {
                    const int64_t k = 4 * g + e;
                    uint16_t *b = d + g * 4 * w + e;
                    int64_t l = 0;
                    if (k < kc)
                        for (; l < m; l++)
                            b[(l / 2) * 8 + (l % 2) * 4] = mm_get(p, f32, base + l + k * sk);
                    for (; l < w; l++) b[(l / 2) * 8 + (l % 2) * 4] = 0;
                }
        }
    }
}

void nbi_mmla_pack(const void *p, int f32, int64_t sj, int64_t sk, int64_t n, int w, int64_t ps,
                   int64_t kc, void *dst) {
    if (f32) mm_pack_as(p, 1, sj, sk, n, w, ps, kc, dst);
    else mm_pack_as(p, 0, sj, sk, n, w, ps, kc, dst);
}

#if MM_ON
/* ----------------------------------------------------------- the kernel */
/* The 2 x 2 blocks of columns 4h..4h+3 of rows 2r, 2r+1 from two rows of 4
 * (e: row 2r, o: row 2r+1), and back. */
static MM_ATTR MM_INLINE void mm_interleave(float32x4_t e, float32x4_t o, float32x4_t *lo,
                                            float32x4_t *hi) {
    *lo = vreinterpretq_f32_f64(vzip1q_f64(vreinterpretq_f64_f32(e), vreinterpretq_f64_f32(o)));
    *hi = vreinterpretq_f32_f64(vzip2q_f64(vreinterpretq_f64_f32(e), vreinterpretq_f64_f32(o)));
}

/* Keeps the compiler's scheduler from hoisting the next loads of B above
 * this point: with all six of a step's B registers live at once (GCC 12
 * does that), 24 accumulators + 4 of A + 6 of B exceed the 32 registers and
 * two accumulators spill (13.1 cycles per step instead of 12 in llvm-mca on
 * Neoverse N2/V1). An empty asm that says it may touch memory; no code. */
#define MM_LOAD_FENCE() __asm__("" ::: "memory")

/* c (2 rp rows x 2 cp columns, row stride ldc) = (load ? c : 0) + a b over
 * kg groups: a's panel MR rows wide, b's NR columns wide. Only rows < mv of
 * c are read and written. rp (1, 2, 4), cp (2, 4, 6): constant at each call. */
static MM_ATTR MM_INLINE void mm_kern(const int rp, const int cp, int64_t kg,
                                      const uint16_t *restrict a, const uint16_t *restrict b,
                                      float *restrict c, int64_t ldc, int load, int mv) {
    float32x4_t x[NBI_MMLA_MR / 2][NBI_MMLA_NR / 2];
    MM_UNROLL for (int r = 0; r < rp; r++) {
        MM_UNROLL for (int h = 0; h < cp / 2; h++) {
            float32x4_t e = vdupq_n_f32(0), o = vdupq_n_f32(0);
            if (load && 2 * r < mv) e = vld1q_f32(c + 2 * r * ldc + 4 * h);
            if (load && 2 * r + 1 < mv) o = vld1q_f32(c + (2 * r + 1) * ldc + 4 * h);
            mm_interleave(e, o, &x[r][2 * h], &x[r][2 * h + 1]);
        }
    }
    for (int64_t g = 0; g < kg; g++) {
        /* marked in the full tile only (rp, cp constant: the others lose it) */
        if (rp == NBI_MMLA_MR / 2 && cp == NBI_MMLA_NR / 2) NBI_MCA_BEGIN("gemm_bf16_bfmmla");
        bfloat16x8_t av[NBI_MMLA_MR / 2];
        MM_UNROLL for (int r = 0; r < rp; r++) av[r] = vreinterpretq_bf16_u16(vld1q_u16(a + 8 * r));
        MM_UNROLL for (int q = 0; q < cp; q++) {
            const bfloat16x8_t bv = vreinterpretq_bf16_u16(vld1q_u16(b + 8 * q));
            MM_UNROLL for (int r = 0; r < rp; r++) x[r][q] = vbfmmlaq_f32(x[r][q], av[r], bv);
            MM_LOAD_FENCE();
        }
        a += 4 * NBI_MMLA_MR;
        b += 4 * NBI_MMLA_NR;
        if (rp == NBI_MMLA_MR / 2 && cp == NBI_MMLA_NR / 2) NBI_MCA_END("gemm_bf16_bfmmla");
    }
    MM_UNROLL for (int r = 0; r < rp; r++) {
        MM_UNROLL for (int h = 0; h < cp / 2; h++) {
            float32x4_t e, o;
            mm_interleave(x[r][2 * h], x[r][2 * h + 1], &e, &o);
            if (2 * r < mv) vst1q_f32(c + 2 * r * ldc + 4 * h, e);
            if (2 * r + 1 < mv) vst1q_f32(c + (2 * r + 1) * ldc + 4 * h, o);
        }
    }
}

/* mm_kern with the fewest row pairs covering mv rows and column pairs
 * covering nr columns (a short product, M = 1, does not pay for 8 rows). */
static MM_ATTR void mm_kern_any(int mv, int64_t nr, int64_t kg, const uint16_t *a,
                                const uint16_t *b, float *c, int64_t ldc, int load) {
#define MM_COLS(rp)                                                                            \
    do {                                                                                       \
        if (nr > 8) mm_kern(rp, 6, kg, a, b, c, ldc, load, mv);                               \
        else if (nr > 4) mm_kern(rp, 4, kg, a, b, c, ldc, load, mv);                           \
        else mm_kern(rp, 2, kg, a, b, c, ldc, load, mv);                                       \
    } while (0)
    if (mv > 4) MM_COLS(4);
    else if (mv > 2) MM_COLS(2);
    else MM_COLS(1);
#undef MM_COLS
}

/* Rows [0, mv) and columns [0, nr) of a tile of c: straight into c when
 * its columns are unit-strided and the kernel's columns are all there
 * (4, 8 or 12), else through a local tile. */
static MM_ATTR void mm_tile(int mv, int64_t nr, int64_t kg, const uint16_t *a, const uint16_t *b,
                            float *c, int64_t scm, int64_t scn, int load) {
    if (scn == 1 && nr % 4 == 0) {
        mm_kern_any(mv, nr, kg, a, b, c, scm, load);
        return;
    }
    float t[NBI_MMLA_MR * NBI_MMLA_NR] = {0};
    for (int r = 0; load && r < mv; r++)
        for (int64_t j = 0; j < nr; j++) t[r * NBI_MMLA_NR + j] = c[r * scm + j * scn];
    mm_kern_any(mv, nr, kg, a, b, t, NBI_MMLA_NR, load);
    for (int r = 0; r < mv; r++)
        for (int64_t j = 0; j < nr; j++) c[r * scm + j * scn] = t[r * NBI_MMLA_NR + j];
}

MM_ATTR void nbi_mmla_block(int64_t mc, int64_t nc, int64_t kg, const void *pa, int64_t psa,
                            const void *pb, int64_t psb, float *c, int64_t scm, int64_t scn,
                            int load) {
    for (int64_t jr = 0; jr < nc; jr += NBI_MMLA_NR)
        for (int64_t ir = 0; ir < mc; ir += NBI_MMLA_MR)
            mm_tile((int)MM_MIN(NBI_MMLA_MR, mc - ir), MM_MIN(NBI_MMLA_NR, nc - jr), kg,
                    (const uint16_t *)pa + ir / NBI_MMLA_MR * psa * 2,
                    (const uint16_t *)pb + jr / NBI_MMLA_NR * psb * 2, c + ir * scm + jr * scn,
                    scm, scn, load);
}

/* ------------------------------------------------------------- the gemv */
/* Rows j, j+1 of W as B's blocks and x as both rows of A's: the block's
 * low half is [y_j, y_j+1], each element the chain of the GEMM (the high
 * half repeats it). 16 rows at a time: 8 chains in flight, two BFMMLA of
 * latency 5 each per step (with 8 rows, 4 chains, llvm-mca's Neoverse N2
 * model gave 10 cycles per 128 bytes of W: latency-bound), 8 k per load (a
 * 64-bit zip of two rows' 16 bytes gives two groups' blocks). */
static MM_ATTR MM_INLINE void mm_gemv_rows(const int rp, int64_t K, const uint16_t *w,
                                           int64_t ldw, const uint32_t *xp, float *y,
                                           int64_t sy, int n) {
    float32x4_t acc[8];
    MM_UNROLL for (int r = 0; r < rp; r++) acc[r] = vdupq_n_f32(0);
    const uint16_t *row[16];
    MM_UNROLL for (int i = 0; i < 2 * rp; i++) row[i] = w + (i < n ? i : 0) * ldw;
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
        if (rp == 8) NBI_MCA_BEGIN("gemv_bf16_bfmmla"); /* 16 rows: the full step */
        const uint64x2_t xv = vreinterpretq_u64_u32(vld1q_u32(xp + k / 2));
        const bfloat16x8_t x0 = vreinterpretq_bf16_u64(vdupq_laneq_u64(xv, 0));
        const bfloat16x8_t x1 = vreinterpretq_bf16_u64(vdupq_laneq_u64(xv, 1));
        MM_UNROLL for (int r = 0; r < rp; r++) {
            const uint64x2_t e = vreinterpretq_u64_u16(vld1q_u16(row[2 * r] + k));
            const uint64x2_t o = vreinterpretq_u64_u16(vld1q_u16(row[2 * r + 1] + k));
            acc[r] = vbfmmlaq_f32(acc[r], x0, vreinterpretq_bf16_u64(vzip1q_u64(e, o)));
            acc[r] = vbfmmlaq_f32(acc[r], x1, vreinterpretq_bf16_u64(vzip2q_u64(e, o)));
        }
        if (rp == 8) NBI_MCA_END("gemv_bf16_bfmmla");
    }
    for (; k < K; k += 4) { /* the last groups, zero-padded past K */
        uint16_t xs[8] = {0}, ws[16][4] = {{0}};
        const int m = (int)MM_MIN(4, K - k);
        for (int e = 0; e < m; e++) {
            xs[e] = xs[4 + e] = (uint16_t)(xp[(k + e) / 2] >> ((k + e) % 2 * 16));
            MM_UNROLL for (int i = 0; i < 2 * rp; i++) ws[i][e] = row[i][k + e];
        }
        const bfloat16x8_t xv = vreinterpretq_bf16_u16(vld1q_u16(xs));
        MM_UNROLL for (int r = 0; r < rp; r++)
            acc[r] = vbfmmlaq_f32(acc[r], xv, vreinterpretq_bf16_u16(vld1q_u16(ws[2 * r])));
    }
    float out[16];
    MM_UNROLL for (int r = 0; r < rp; r++) vst1_f32(out + 2 * r, vget_low_f32(acc[r]));
    for (int i = 0; i < n; i++) y[i * sy] = out[i];
}

MM_ATTR void nbi_mmla_gemv(int64_t N, int64_t K, const uint16_t *w, int64_t ldw,
                           const uint32_t *xp, float *y, int64_t sy) {
    int64_t j = 0;
    for (; j + 16 <= N; j += 16) mm_gemv_rows(8, K, w + j * ldw, ldw, xp, y + j * sy, sy, 16);
    if (j < N) {
        const int n = (int)(N - j);
        if (n > 8) mm_gemv_rows(8, K, w + j * ldw, ldw, xp, y + j * sy, sy, n);
        else if (n > 4) mm_gemv_rows(4, K, w + j * ldw, ldw, xp, y + j * sy, sy, n);
        else if (n > 2) mm_gemv_rows(2, K, w + j * ldw, ldw, xp, y + j * sy, sy, n);
        else mm_gemv_rows(1, K, w + j * ldw, ldw, xp, y + j * sy, sy, n);
    }
}
#else
void nbi_mmla_block(int64_t mc, int64_t nc, int64_t kg, const void *pa, int64_t psa,
                    const void *pb, int64_t psb, float *c, int64_t scm, int64_t scn, int load) {
    (void)mc, (void)nc, (void)kg, (void)pa, (void)psa, (void)pb, (void)psb, (void)c, (void)scm,
        (void)scn, (void)load;
}
void nbi_mmla_gemv(int64_t N, int64_t K, const uint16_t *w, int64_t ldw, const uint32_t *xp,
                   float *y, int64_t sy) {
    (void)N, (void)K, (void)w, (void)ldw, (void)xp, (void)y, (void)sy;
}
#endif
