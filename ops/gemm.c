/* gemm.c: the blocked, register-tiled matrix multiply behind nb_matmul.
 *
 * C (M,N) = A (M,K) B (K,N) in the layout of the classic Goto/BLIS GEMM:
 *
 *   for jc over N in NC columns
 *     for pc over K in KC steps       pack B[pc.., jc..] (KC x NC) into panels
 *       for ic over M in MC rows      of NR = 2 vectors of columns; pack A
 *         for jr over NC in NR        [ic.., pc..] into panels of MR rows, or
 *           for ir over MC in MR      read it in place; micro-kernel: an MR x NR
 *                                     tile of C in registers, one FMA per
 *                                     (row, vector) per k
 *
 * Packing reads through the operands' strides, so transposed, expanded and
 * narrowed views need no copy to contiguous first; panels at the N edge (and
 * packed ones at the M edge) are zero-padded, and only the valid part of a
 * tile is written back. The micro-kernel loads its tile of C when pc > 0 and
 * keeps accumulating, so every c[i][j] is one chain of multiply-adds over
 * k = 0..K-1 in order, starting from 0: the same bits whatever the blocking,
 * the tile an element falls in, or the thread that would compute it.
 *
 * A is read in place (no packing) when one of its strides is 1: the rows of
 * A^T (sam == 1) are already contiguous per k, and a row-major A (sak == 1) is
 * read row by row. At the M edge, tiles of MR/2 rows take over; in place, a
 * last one of fewer rows is the last MR/2 rows of the product with only the
 * new ones stored (it recomputes a few rows rather than reading past A).
 *
 * Everything is compiled once per instruction-set path from one macro
 * (GEMM_DEFINE): AVX-512 (512-bit GCC vectors under a target attribute),
 * AVX2+FMA (256-bit) and a portable one (128-bit vectors, whatever the
 * baseline target makes of them). The library is built without -march, so the
 * target attributes are what enable the wider instructions; the path is picked
 * once with __builtin_cpu_supports. Multiply-adds are contracted to FMA by
 * -ffp-contract=fast (set for this file in the Makefile: ISO C modes turn
 * contraction off in GCC) on the paths that have FMA.
 *
 * On aarch64 the micro-kernels are hand-written (ops/arch/arm/: NEON, and
 * SVE where the CPU has it) and plugged into the same packing and loops
 * (GEMM_DRIVER, with three vectors per row); the portable path there is
 * FMA too (every aarch64 CPU has it), so all three give the same bits. */
#include "gemm_internal.h"

#include "../tensor/cpu_internal.h"
#include "arch/mca.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#define GEMM_X86 1
#else
#define GEMM_X86 0
#endif
#if defined(__aarch64__)
#define GEMM_ARM 1
#include "arch/arm/gemm_arm.h"
#else
#define GEMM_ARM 0
#endif

#define GEMM_INLINE inline __attribute__((always_inline))
#define GEMM_UNROLL _Pragma("GCC unroll 32")
#define GEMM_MIN(x, y) ((x) < (y) ? (x) : (y))

typedef float v4sf __attribute__((vector_size(16)));
typedef double v2df __attribute__((vector_size(16)));
#if GEMM_X86 || GEMM_ARM
typedef float v8sf __attribute__((vector_size(32)));
typedef double v4df __attribute__((vector_size(32)));
typedef float v16sf __attribute__((vector_size(64)));
typedef double v8df __attribute__((vector_size(64)));
#endif

/* -------------------------------------------------------------- blocking */
/* Each path's cache blocks, derived from the CPU's caches once, at the first
 * product (gemm_blocks, after the paths below). */
#if GEMM_ARM
/* SVE: one packing per vector length it knows (16, 32, 64 bytes) */
enum { GB_F32_PORT, GB_F64_PORT, GB_F32_NEON, GB_F64_NEON, GB_F32_SVE16, GB_F64_SVE16,
       GB_F32_SVE32, GB_F64_SVE32, GB_F32_SVE64, GB_F64_SVE64, GB_N };
#else
enum { GB_F32_PORT, GB_F64_PORT, GB_F32_AVX2, GB_F64_AVX2, GB_F32_AVX512, GB_F64_AVX512, GB_N };
#endif
static const nbi_gemm_blocks *gemm_blocks(void);

/* ------------------------------------------------------------- workspace */
/* Buffers are 64-byte aligned blocks with a 64-byte header holding their size.
 * Released blocks are kept in a few slots (taken and given back with atomic
 * exchanges, so each pool thread can hold one and none is shared) for the
 * next product: products then pay neither for the allocation nor for
 * faulting its pages in. Blocks above ws_keep_max (the largest workspace the
 * blocks can ask for, at least 16 MiB) are freed instead; the slots are
 * emptied at exit. */
#define GEMM_HDR 64
#define GEMM_SLOTS 8
static _Atomic(void *) ws_cache[GEMM_SLOTS];
static size_t ws_keep_max = (size_t)16 << 20; /* set with the blocks */

static size_t blk_cap(void *blk) {
    size_t cap;
    memcpy(&cap, blk, sizeof cap);
    return cap;
}

void nbi_gemm_ws_free(nbi_gemm_ws *ws) {
    if (ws->buf) {
        void *blk = (char *)ws->buf - GEMM_HDR;
        for (int i = 0; blk && ws->cap <= ws_keep_max && i < GEMM_SLOTS; i++) {
            void *empty = NULL;
            if (atomic_compare_exchange_strong(&ws_cache[i], &empty, blk)) blk = NULL;
        }
        free(blk);
    }
    ws->buf = NULL;
    ws->cap = 0;
}

__attribute__((destructor)) static void free_ws_cache(void) {
    for (int i = 0; i < GEMM_SLOTS; i++) free(atomic_exchange(&ws_cache[i], NULL));
}

int nbi_gemm_ws_reserve(nbi_gemm_ws *ws, size_t n) {
    if (n <= ws->cap) return 0;
    nbi_gemm_ws_free(ws);
    void *blk = NULL;
    for (int i = 0; !blk && i < GEMM_SLOTS; i++) blk = atomic_exchange(&ws_cache[i], NULL);
    if (blk && blk_cap(blk) < n) {
        free(blk);
        blk = NULL;
    }
    if (!blk) {
        n = (n + 63) & ~(size_t)63;
        if (n > SIZE_MAX - GEMM_HDR || !(blk = aligned_alloc(64, n + GEMM_HDR))) return -1;
        memcpy(blk, &n, sizeof n);
    }
    ws->buf = (char *)blk + GEMM_HDR;
    ws->cap = blk_cap(blk);
    return 0;
}

/* ------------------------------------------------------------ transposes */
/* dst[j*ds + i] = src[i*ss + j] for a 4x4 (f32) or 2x2 (f64) block: the
 * packing of a k-contiguous operand into k-major panels, four (two) elements
 * per shuffle instead of one load and store each. */
#if defined(__clang__) || __GNUC__ >= 12
#define GEMM_SHUF4(x, y, i, j, k, l) __builtin_shufflevector(x, y, i, j, k, l)
#define GEMM_SHUF2(x, y, i, j) __builtin_shufflevector(x, y, i, j)
#define GEMM_SHUF8(x, y, ...) __builtin_shufflevector(x, y, __VA_ARGS__)
#else
typedef int32_t v8si __attribute__((vector_size(32)));
#define GEMM_SHUF8(x, y, ...) __builtin_shuffle(x, y, (v8si){__VA_ARGS__})
typedef int32_t v4si __attribute__((vector_size(16)));
typedef int64_t v2di __attribute__((vector_size(16)));
#define GEMM_SHUF4(x, y, i, j, k, l) __builtin_shuffle(x, y, (v4si){i, j, k, l})
#define GEMM_SHUF2(x, y, i, j) __builtin_shuffle(x, y, (v2di){i, j})
#endif

/* Source rows q >= n (n in 1..4, resp. 1..2) read as zeros: padding for free. */
static GEMM_INLINE void tr_f32(const float *src, int64_t ss, float *dst, int64_t ds, int n) {
    v4sf x0, x1 = {0}, x2 = {0}, x3 = {0};
    memcpy(&x0, src, 16);
    if (n > 1) memcpy(&x1, src + ss, 16);
    if (n > 2) memcpy(&x2, src + 2 * ss, 16);
    if (n > 3) memcpy(&x3, src + 3 * ss, 16);
    v4sf t0 = GEMM_SHUF4(x0, x1, 0, 4, 1, 5), t1 = GEMM_SHUF4(x0, x1, 2, 6, 3, 7);
    v4sf t2 = GEMM_SHUF4(x2, x3, 0, 4, 1, 5), t3 = GEMM_SHUF4(x2, x3, 2, 6, 3, 7);
    x0 = GEMM_SHUF4(t0, t2, 0, 1, 4, 5);
    x1 = GEMM_SHUF4(t0, t2, 2, 3, 6, 7);
    x2 = GEMM_SHUF4(t1, t3, 0, 1, 4, 5);
    x3 = GEMM_SHUF4(t1, t3, 2, 3, 6, 7);
    memcpy(dst, &x0, 16);
    memcpy(dst + ds, &x1, 16);
    memcpy(dst + 2 * ds, &x2, 16);
    memcpy(dst + 3 * ds, &x3, 16);
}

static GEMM_INLINE void tr_f64(const double *src, int64_t ss, double *dst, int64_t ds, int n) {
    v2df x0, x1 = {0};
    memcpy(&x0, src, 16);
    if (n > 1) memcpy(&x1, src + ss, 16);
    v2df y0 = GEMM_SHUF2(x0, x1, 0, 2), y1 = GEMM_SHUF2(x0, x1, 1, 3);
    memcpy(dst, &y0, 16);
    memcpy(dst + ds, &y1, 16);
}

#if GEMM_X86
/* The same for an 8x8 f32 block (AVX): three rounds of shuffles, pairs of
 * elements, then pairs of pairs, then halves. */
#define GEMM_SH8(x, y, ...) GEMM_SHUF8(x, y, __VA_ARGS__)
static __attribute__((target("avx2"))) GEMM_INLINE void tr8_f32(const float *src, int64_t ss,
                                                                 float *dst, int64_t ds, int n) {
    v8sf x[8] = {{0}};
    for (int i = 0; i < 8; i++)
        if (i < n) memcpy(&x[i], src + i * ss, 32);
    v8sf t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = GEMM_SH8(x[i], x[i + 1], 0, 8, 1, 9, 4, 12, 5, 13);
        t[i + 1] = GEMM_SH8(x[i], x[i + 1], 2, 10, 3, 11, 6, 14, 7, 15);
    }
    for (int i = 0; i < 8; i += 4)
        for (int h = 0; h < 2; h++) {
            u[i + 2 * h] = GEMM_SH8(t[i + h], t[i + h + 2], 0, 1, 8, 9, 4, 5, 12, 13);
            u[i + 2 * h + 1] = GEMM_SH8(t[i + h], t[i + h + 2], 2, 3, 10, 11, 6, 7, 14, 15);
        }
    for (int i = 0; i < 4; i++) {
        v8sf lo = GEMM_SH8(u[i], u[i + 4], 0, 1, 2, 3, 8, 9, 10, 11);
        v8sf hi = GEMM_SH8(u[i], u[i + 4], 4, 5, 6, 7, 12, 13, 14, 15);
        memcpy(dst + i * ds, &lo, 32);
        memcpy(dst + (i + 4) * ds, &hi, 32);
    }
}
#endif

/* dst[k*w + j] = src[j*sj + k] for j < n, k < kc, and 0 for n <= j < w: groups of
 * TB source rows by TR (TB x TB blocks, missing rows as zeros), the ragged
 * ends one element at a time. */
#define GEMM_TRANSPOSE(T, TB, TR, kc, n, w, src, sj, dst)                                     \
    do {                                                                                       \
        for (int64_t j_ = 0; j_ < (w); j_ += (TB)) {                                           \
            const int nj_ = (int)((n) - j_ <= 0 ? 0 : (n) - j_ < (TB) ? (n) - j_ : (TB));       \
            int64_t k_ = 0;                                                                    \
            if (j_ + (TB) <= (w))                                                              \
                for (; k_ + (TB) <= (kc); k_ += (TB)) {                                        \
                    if (nj_ > 0)                                                               \
                        TR((src) + j_ * (sj) + k_, (sj), (dst) + k_ * (w) + j_, (w), nj_);     \
                    else                                                                       \
                        for (int q_ = 0; q_ < (TB); q_++)                                      \
                            memset((dst) + (k_ + q_) * (w) + j_, 0, (TB) * sizeof(T));         \
                }                                                                              \
            for (; k_ < (kc); k_++)                                                            \
                for (int64_t q_ = 0; q_ < (TB) && j_ + q_ < (w); q_++)                         \
                    (dst)[k_ * (w) + j_ + q_] = q_ < nj_ ? (src)[(j_ + q_) * (sj) + k_] : (T)0; \
        }                                                                                      \
    } while (0)

/* The micro-kernel's rows, written out: row r keeps x<r>0 and x<r>1 (its two
 * vectors); rows >= `rows` and the second vector when nv == 1 fold away. Used
 * inside P##_kern (rows, nv, a, b, c, gemm_t, ... in scope); at most 8 rows. */
#define GEMM_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#define GEMM_ACC_DECL(r) x##r##0 = {0}, x##r##1 = {0},
#define GEMM_ACC_ROW_OK(r) ((r) < rows && (!guard || ((r) >= r0 && (r) < r1)))
#define GEMM_ACC_LOAD(r)                                                                       \
    if (load && GEMM_ACC_ROW_OK(r)) {                                                          \
        memcpy(&x##r##0, c + (r) * ldc, sizeof x##r##0);                                       \
        if (nv == 2) memcpy(&x##r##1, c + (r) * ldc + sizeof x##r##0 / sizeof *c, sizeof x##r##1); \
    }
#define GEMM_ACC_FMA(r)                                                                        \
    if ((r) < rows) {                                                                          \
        const gemm_t s_ = arow ? a[(r) * ars] : a[(r)];                                        \
        x##r##0 += s_ * b0;                                                                    \
        if (nv == 2) x##r##1 += s_ * b1;                                                       \
    }
#define GEMM_ACC_STORE(r)                                                                      \
    if (GEMM_ACC_ROW_OK(r)) {                                                                  \
        memcpy(c + (r) * ldc, &x##r##0, sizeof x##r##0);                                       \
        if (nv == 2) memcpy(c + (r) * ldc + sizeof x##r##0 / sizeof *c, &x##r##1, sizeof x##r##1); \
    }

/* make mca's marks (ops/arch/mca.h: nothing in other builds) on the loop of the
 * full tiles (MR rows, two vectors): gemm_<P> where A is packed (or A^T read in
 * place), gemm_<P>_rowA where row-major A is read in place. */
#define GEMM_MCA(MARK, P, MR)                                                                  \
    if (rows == (MR) && nv == 2) {                                                             \
        if (arow) MARK("gemm_" #P "_rowA");                                                    \
        else MARK("gemm_" #P);                                                                 \
    }

/* -------------------------------------------------------- one ISA's gemm */
/* GEMM_KERN_DEFINE: a micro-kernel of MR x 2W (two vectors V of W elements T
 * per row) written with GCC vectors: P##_kern_any, the kernel GEMM_DRIVER
 * calls (a hand-written one, ops/arch/, has the same contract: KERN below).
 * ATTR: the target attribute. */
#define GEMM_KERN_DEFINE(P, T, V, W, MR, ATTR)                                                \
    /* The tile: c (rows x nv*W, row stride ldc) = (load ? c : 0) + a b over kc steps.      \
     * b: packed panel, row k at b + k*nv*W. a: element (r,k) at a[r*ars + k*aks] with       \
     * either ars == 1 (packed, or A^T in place) or aks == 1 (row-major A in place): arow    \
     * picks the second. guard: only rows r0 <= r < r1 of c are read and written (the        \
     * others are computed from readable rows of a, and dropped). rows (MR or MR/2), nv,     \
     * arow, guard: constant at each call; the accumulators are named variables, one per   \
     * (row, vector), so that every compiler keeps them in registers. */                     \
    static ATTR GEMM_INLINE void P##_kern(const int rows, const int nv, const int arow,        \
                                          const int guard, int64_t kc, const T *restrict a,    \
                                          int64_t ars, int64_t aks, const T *restrict b,       \
                                          T *restrict c, int64_t ldc, int load, int r0,        \
                                          int r1) {                                            \
        typedef T gemm_t;                                                                      \
        _Static_assert((MR) <= 8, "GEMM_ROWS writes out 8 rows");                              \
        V GEMM_ROWS(GEMM_ACC_DECL) x_end = {0}; /* x_end closes the list of declarators */     \
        (void)x_end;                                                                           \
        GEMM_ROWS(GEMM_ACC_LOAD)                                                               \
        for (int64_t k = 0; k < kc; k++) {                                                     \
            GEMM_MCA(NBI_MCA_BEGIN, P, MR)                                                     \
            V b0, b1 = {0};                                                                    \
            memcpy(&b0, b, sizeof(V));                                                         \
            if (nv == 2) memcpy(&b1, b + (W), sizeof(V));                                      \
            GEMM_ROWS(GEMM_ACC_FMA)                                                            \
            a += arow ? 1 : aks;                                                               \
            b += nv * (W);                                                                     \
            GEMM_MCA(NBI_MCA_END, P, MR)                                                       \
        }                                                                                      \
        GEMM_ROWS(GEMM_ACC_STORE)                                                              \
    }                                                                                          \
                                                                                               \
    /* Whole tiles (MR rows) unguarded, half tiles (MR/2, at the M edge) guarded. */          \
    static ATTR void P##_kern_any(int half, int nv, int arow, int64_t kc, const T *a,          \
                                  int64_t ars, int64_t aks, const T *b, T *c, int64_t ldc,     \
                                  int load, int r0, int r1) {                                  \
        enum { H = (MR) / 2 };                                                                 \
        if (!half && nv == 2 && arow) P##_kern(MR, 2, 1, 0, kc, a, ars, aks, b, c, ldc, load, 0, 0); \
        else if (!half && nv == 2) P##_kern(MR, 2, 0, 0, kc, a, ars, aks, b, c, ldc, load, 0, 0); \
        else if (!half && arow) P##_kern(MR, 1, 1, 0, kc, a, ars, aks, b, c, ldc, load, 0, 0);  \
        else if (!half) P##_kern(MR, 1, 0, 0, kc, a, ars, aks, b, c, ldc, load, 0, 0);          \
        else if (nv == 2 && arow) P##_kern(H, 2, 1, 1, kc, a, ars, aks, b, c, ldc, load, r0, r1); \
        else if (nv == 2) P##_kern(H, 2, 0, 1, kc, a, ars, aks, b, c, ldc, load, r0, r1);      \
        else if (arow) P##_kern(H, 1, 1, 1, kc, a, ars, aks, b, c, ldc, load, r0, r1);         \
        else P##_kern(H, 1, 0, 1, kc, a, ars, aks, b, c, ldc, load, r0, r1);                   \
    }

/* GEMM_DRIVER: packing, blocking and the loops around a micro-kernel.
 * P: name prefix; T: element type; V: vector of T, W elements wide; MR x NV*W:
 * the register tile (NV vectors per row, NV >= 2); BLK: the path's entry of
 * gemm_blk (its cache blocks KC, MC, NC, derived from the CPU's caches at
 * the first product); TB, TR: the transpose block (above); ATTR: the target
 * attribute; KERN: the micro-kernel, KERN(half, nv, arow, kc, a, ars, aks,
 * b, c, ldc, load, r0, r1): c (MR rows, or MR/2 when half; nv*W columns,
 * row stride ldc) = (load ? c : 0) + sum over k < kc of a[r,k] b[k,:] with
 * one fused multiply-add per element per k, in k order; b: a packed panel,
 * row k at b + k*nv*W (nv = 1..NV); a: element (r,k) at a[r*ars + k*aks]
 * with ars == 1, or at a[r*ars + k] when arow; half tiles touch only rows
 * r0 <= r < r1 of c (the others computed from readable rows of a, and
 * dropped), whole tiles all MR rows. */
#define GEMM_NVEC(nr, W, NV) ((NV) == 2 ? ((nr) > (W) ? 2 : 1) : (int)(((nr) + (W)-1) / (W)))
#define GEMM_DRIVER(P, T, V, W, NV, MR, BLK, TB, TR, ATTR, KERN)                              \
    enum { P##_NR = (NV) * (W), P##_MR = (MR), P##_CH = 16 / (int)sizeof(T) };                 \
                                                                                               \
    /* dst[0..n) = src[0..n) for n <= NR: a few fixed-size pieces, the last one ending at n \
     * (overlapping the one before); never a loop that compilers turn into a memmove call. */ \
    static ATTR GEMM_INLINE void P##_copy(T *restrict dst, const T *restrict src, int64_t n) { \
        const int64_t b = n * (int64_t)sizeof(T);                                              \
        char *d = (char *)dst;                                                                 \
        const char *s = (const char *)src;                                                     \
        if (b >= 64) {                                                                         \
            GEMM_UNROLL for (int q = 0; q < (int)(P##_NR * sizeof(T) / 64); q++)               \
                if ((q + 1) * 64 <= b) memcpy(d + q * 64, s + q * 64, 64);                     \
            memcpy(d + b - 64, s + b - 64, 64);                                                \
        } else if (b >= 32) {                                                                  \
            memcpy(d, s, 32);                                                                  \
            memcpy(d + b - 32, s + b - 32, 32);                                                \
        } else if (b >= 16) {                                                                  \
            memcpy(d, s, 16);                                                                  \
            memcpy(d + b - 16, s + b - 16, 16);                                                \
        } else {                                                                               \
            GEMM_UNROLL for (int q = 0; q < P##_CH; q++) if (q < n) dst[q] = src[q];           \
        }                                                                                      \
    }                                                                                          \
                                                                                               \
    /* Rows r0 <= r < r1, columns j < nr of a tile of c (MR rows, or MR/2 when half;       \
     * strides scm, scn): straight into c when the columns are whole vectors and            \
     * unit-strided, else through a local tile (only the valid part of c is touched). */      \
    static ATTR void P##_tile(int half, int r0, int r1, int64_t nr, int64_t kc, const T *a,    \
                              int64_t ars, int64_t aks, int arow, const T *b, T *c,            \
                              int64_t scm, int64_t scn, int load) {                            \
        const int nv = GEMM_NVEC(nr, W, NV);                                                   \
        if (nr == nv * (W) && scn == 1) {                                                      \
            KERN(half, nv, arow, kc, a, ars, aks, b, c, scm, load, r0, r1);                    \
            return;                                                                            \
        }                                                                                      \
        T tmp[(MR) * P##_NR] __attribute__((aligned(64)));                                     \
        const int64_t ld = nv * (W);                                                           \
        if (load)                                                                              \
            for (int64_t r = r0; r < r1; r++) {                                                \
                if (scn == 1) P##_copy(tmp + r * ld, c + r * scm, nr);                         \
                else for (int64_t j = 0; j < nr; j++) tmp[r * ld + j] = c[r * scm + j * scn];  \
            }                                                                                  \
        KERN(half, nv, arow, kc, a, ars, aks, b, tmp, ld, load, r0, r1);                       \
        for (int64_t r = r0; r < r1; r++) {                                                    \
            if (scn == 1) P##_copy(c + r * scm, tmp + r * ld, nr);                             \
            else for (int64_t j = 0; j < nr; j++) c[r * scm + j * scn] = tmp[r * ld + j];      \
        }                                                                                      \
    }                                                                                          \
                                                                                               \
    /* Packing, one panel per call (each layout its own small function):                 \
     * dst[k*w + j] = src[k*sk + j*sj] for k < kc, j < n, zeros for n <= j < w. A panel of  \
     * A is (rows of A as j, w = MR), a panel of B (columns of B as j, w = W or NR). */       \
    static ATTR __attribute__((noinline)) void P##_pack_rows(int64_t kc, int64_t n, int64_t w, \
                                                             const T *src, int64_t sk,         \
                                                             T *restrict dst) { /* sj == 1 */   \
        const V z = {0};                                                                       \
        if (n == P##_NR && w == P##_NR)                                                        \
            for (int64_t k = 0; k < kc; k++) memcpy(dst + k * P##_NR, src + k * sk, sizeof(T) * P##_NR); \
        else if (n == (W) && w == (W))                                                         \
            for (int64_t k = 0; k < kc; k++) memcpy(dst + k * (W), src + k * sk, sizeof(V));   \
        else if (w == (W))                                                                     \
            for (int64_t k = 0; k < kc; k++) {                                                 \
                memcpy(dst + k * (W), &z, sizeof(V));                                          \
                P##_copy(dst + k * (W), src + k * sk, n);                                      \
            }                                                                                  \
        else if (w == P##_NR)                                                                  \
            for (int64_t k = 0; k < kc; k++) {                                                 \
                memcpy(dst + k * P##_NR, &z, sizeof(V));                                       \
                memcpy(dst + k * P##_NR + (W), &z, sizeof(V));                                 \
                GEMM_UNROLL for (int q = 2; q < (NV); q++)                                     \
                    memcpy(dst + k * P##_NR + q * (W), &z, sizeof(V));                         \
                P##_copy(dst + k * P##_NR, src + k * sk, n);                                   \
            }                                                                                  \
        else if ((NV) > 2 && w % (W) == 0 && w > (W) && w < P##_NR) /* 2..NV-1 vectors */      \
            for (int64_t k = 0; k < kc; k++) {                                                 \
                for (int64_t q = 0; q < w; q += (W)) memcpy(dst + k * w + q, &z, sizeof(V));   \
                P##_copy(dst + k * w, src + k * sk, n);                                        \
            }                                                                                  \
        else /* A panels (w == MR) */                                                          \
            for (int64_t k = 0; k < kc; k++)                                                   \
                for (int64_t j = 0; j < w; j++) dst[k * w + j] = j < n ? src[k * sk + j] : 0;  \
    }                                                                                          \
    static ATTR __attribute__((noinline)) void P##_pack_cols(int64_t kc, int64_t n, int64_t w, \
                                                             const T *src, int64_t sj,         \
                                                             T *restrict dst) { /* sk == 1 */   \
        GEMM_TRANSPOSE(T, TB, TR, kc, n, w, src, sj, dst);                                     \
    }                                                                                          \
    static ATTR __attribute__((noinline)) void P##_pack_any(int64_t kc, int64_t n, int64_t w,  \
                                                            const T *src, int64_t sk,          \
                                                            int64_t sj, T *restrict dst) {     \
        for (int64_t k = 0; k < kc; k++)                                                       \
            for (int64_t j = 0; j < w; j++) dst[k * w + j] = j < n ? src[k * sk + j * sj] : 0; \
    }                                                                                          \
    static ATTR GEMM_INLINE void P##_pack(int64_t kc, int64_t n, int64_t w, const T *src,       \
                                          int64_t sk, int64_t sj, T *dst) {                    \
        if (sj == 1) P##_pack_rows(kc, n, w, src, sk, dst);                                    \
        else if (sk == 1) P##_pack_cols(kc, n, w, src, sj, dst);                               \
        else P##_pack_any(kc, n, w, src, sk, sj, dst);                                         \
    }                                                                                          \
                                                                                               \
    /* One packed block of B (kc x nc at pb) times the rows of A for c's rows [0, mc):       \
     * amode 0: A packed at a (panels of MR rows); 1: A^T in place (a[r + k*sak]); 2:        \
     * row-major A in place (a[r*sam + k]). Whole tiles of MR rows, then at the edge half    \
     * tiles; in place, a last one of fewer rows is the product's last MR/2 rows with only   \
     * the new ones written (rows before the block belong to the same A and C; M >= MR/2). */ \
    static ATTR __attribute__((noinline)) void P##_block(int64_t mc, int64_t nc, int64_t kc,   \
                                                         const T *a, int64_t sam, int64_t sak, \
                                                         int amode, const T *pb, T *c,        \
                                                         int64_t scm, int64_t scn, int load) { \
        enum { H = (MR) / 2 };                                                                 \
        for (int64_t jr = 0; jr < nc; jr += P##_NR) {                                          \
            const int64_t nr = GEMM_MIN(P##_NR, nc - jr);                                      \
            const T *bp = pb + jr * kc;                                                        \
            T *cj = c + jr * scn;                                                              \
            for (int64_t ir = 0; ir < mc;) {                                                   \
                const int64_t rem = mc - ir;                                                   \
                const int half = rem < (MR);                                                   \
                int64_t i0 = ir;      /* first row of the tile */                              \
                int r0 = 0, r1 = half ? H : (MR); /* its rows written */                       \
                if (rem < H) {                                                                 \
                    if (amode) i0 = ir - (H - rem), r0 = (int)(H - rem);                       \
                    else r1 = (int)rem;                                                        \
                }                                                                              \
                if (amode == 0)                                                                \
                    P##_tile(half, r0, r1, nr, kc, a + ir / (MR) * (MR) * kc + ir % (MR), 1,   \
                             (MR), 0, bp, cj + i0 * scm, scm, scn, load);                      \
                else                                                                           \
                    P##_tile(half, r0, r1, nr, kc, a + i0 * sam, sam, sak, amode == 2, bp,     \
                             cj + i0 * scm, scm, scn, load);                                   \
                ir += half ? H : (MR);                                                         \
            }                                                                                  \
        }                                                                                      \
    }                                                                                          \
                                                                                               \
    static ATTR int P##_gemm(nbi_gemm_ws *ws, int64_t M, int64_t N, int64_t K, const T *a,     \
                             int64_t sam, int64_t sak, const T *b, int64_t sbk, int64_t sbn,   \
                             T *c, int64_t scm, int64_t scn) {                                 \
        const nbi_gemm_blocks *bk = gemm_blocks();                                             \
        const int64_t KC = bk[BLK].kc, NC = bk[BLK].nc;                                        \
        /* A in place when A^T is a row-major view (sam == 1) or A is row-major (sak == 1) */ \
        int amode = sam == 1 && sak != 1 ? 1 : sak == 1 ? 2 : 0;                               \
        if (M < (MR) / 2) amode = 0;                                                           \
        const int64_t MC = amode && M > (MR)                                                   \
                               ? nbi_gemm_mc_in_place(nbi_cpu_info(), &bk[BLK], sizeof(T),     \
                                                      amode == 1, amode == 1 ? sak : sam,      \
                                                      (int64_t)((uintptr_t)a % 4096), M)        \
                               : bk[BLK].mc;                                                   \
        const int64_t kcap = GEMM_MIN(KC + KC / 4, K);                                         \
        const int64_t mcap = (GEMM_MIN(MC, M) + (MR)-1) / (MR) * (MR);                         \
        const int64_t ncap = (GEMM_MIN(NC, N) + P##_NR - 1) / P##_NR * P##_NR;                 \
        const int64_t asz = amode ? 0 : (mcap * kcap + 15) & ~(int64_t)15;                     \
        if (nbi_gemm_ws_reserve(ws, sizeof(T) * (size_t)(asz + ncap * kcap))) return -1;                \
        T *pa = ws->buf, *pb = pa + asz;                                                       \
        for (int64_t jc = 0; jc < N; jc += NC) {                                               \
            const int64_t nc = GEMM_MIN(NC, N - jc);                                           \
            for (int64_t pc = 0, kstep = 0; pc < K; pc += kstep) {                             \
                const int64_t kc = K - pc <= KC + KC / 4 ? K - pc : KC; /* BLIS's edge rule */ \
                kstep = kc;                                                                    \
                for (int64_t j = 0; j < nc; j += P##_NR) { /* B: panels of NR (or nv*W) cols */ \
                    const int64_t nr = GEMM_MIN(P##_NR, nc - j);                               \
                    P##_pack(kc, nr, GEMM_NVEC(nr, W, NV) * (W), b + pc * sbk + (jc + j) * sbn, \
                             sbk, sbn, pb + j * kc);                                           \
                }                                                                              \
                for (int64_t ic = 0; ic < M; ic += MC) {                                       \
                    const int64_t mc = GEMM_MIN(MC, M - ic);                                   \
                    const T *ablk = a + ic * sam + pc * sak;                                   \
                    for (int64_t i = 0; amode == 0 && i < mc; i += (MR)) /* A: MR rows */    \
                        P##_pack(kc, GEMM_MIN((MR), mc - i), (MR), ablk + i * sam, sak, sam,   \
                                 pa + i * kc);                                                 \
                    P##_block(mc, nc, kc, amode ? ablk : pa, sam, sak, amode, pb,              \
                              c + ic * scm + jc * scn, scm, scn, pc > 0);                      \
                }                                                                              \
            }                                                                                  \
        }                                                                                      \
        return 0;                                                                              \
    }

/* A path of GCC vectors: the kernel above, two vectors per row. */
#define GEMM_DEFINE(P, T, V, W, MR, BLK, TB, TR, ATTR)                                        \
    GEMM_KERN_DEFINE(P, T, V, W, MR, ATTR)                                                     \
    GEMM_DRIVER(P, T, V, W, 2, MR, BLK, TB, TR, ATTR, P##_kern_any)

/* ----------------------------------------------------------------- paths */
/* Register tiles: AVX-512 8 x 2 zmm (16 accumulators of 32 registers; 8 rows
 * measured as fast as 12 here and wastes less at the M edge), AVX2 6 x 2 ymm
 * (12 of 16), portable 4 x 2 xmm (8 of 16: without FMA the products need
 * registers too). Cache blocks: nbi_gemm_blocking, below. */
GEMM_DEFINE(f32_port, float, v4sf, 4, 4, GB_F32_PORT, 4, tr_f32, )
GEMM_DEFINE(f64_port, double, v2df, 2, 4, GB_F64_PORT, 2, tr_f64, )
#if GEMM_X86
#define GEMM_AVX2 __attribute__((target("avx2,fma")))
#define GEMM_AVX512 __attribute__((target("avx512f")))
GEMM_DEFINE(f32_avx2, float, v8sf, 8, 6, GB_F32_AVX2, 8, tr8_f32, GEMM_AVX2)
GEMM_DEFINE(f64_avx2, double, v4df, 4, 6, GB_F64_AVX2, 2, tr_f64, GEMM_AVX2)
GEMM_DEFINE(f32_avx512, float, v16sf, 16, 8, GB_F32_AVX512, 8, tr8_f32, GEMM_AVX512)
GEMM_DEFINE(f64_avx512, double, v8df, 8, 8, GB_F64_AVX512, 2, tr_f64, GEMM_AVX512)
#endif
/* aarch64: the kernels of ops/arch/arm/ (gemm_arm.h), 8 x 3 vectors (24
 * accumulators of 32 registers). NEON: f32 8 x 12, f64 8 x 6. SVE: the
 * same in SVE vectors, its packing instantiated per vector length (W =
 * bytes / element; a length other than 16, 32 or 64 bytes runs NEON). */
#if GEMM_ARM
GEMM_DRIVER(f32_neon, float, v4sf, 4, 3, 8, GB_F32_NEON, 4, tr_f32, , nbi_gemm_f32_neon_kern)
GEMM_DRIVER(f64_neon, double, v2df, 2, 3, 8, GB_F64_NEON, 2, tr_f64, , nbi_gemm_f64_neon_kern)
GEMM_DRIVER(f32_sve16, float, v4sf, 4, 3, 8, GB_F32_SVE16, 4, tr_f32, , nbi_gemm_f32_sve_kern)
GEMM_DRIVER(f64_sve16, double, v2df, 2, 3, 8, GB_F64_SVE16, 2, tr_f64, , nbi_gemm_f64_sve_kern)
GEMM_DRIVER(f32_sve32, float, v8sf, 8, 3, 8, GB_F32_SVE32, 4, tr_f32, , nbi_gemm_f32_sve_kern)
GEMM_DRIVER(f64_sve32, double, v4df, 4, 3, 8, GB_F64_SVE32, 2, tr_f64, , nbi_gemm_f64_sve_kern)
GEMM_DRIVER(f32_sve64, float, v16sf, 16, 3, 8, GB_F32_SVE64, 4, tr_f32, , nbi_gemm_f32_sve_kern)
GEMM_DRIVER(f64_sve64, double, v8df, 8, 3, 8, GB_F64_SVE64, 2, tr_f64, , nbi_gemm_f64_sve_kern)
#endif

/* The blocks, after the analytical model of BLIS (Low, Igual, Smith and
 * Quintana-Orti, "Analytical modeling is enough for high-performance BLIS",
 * ACM TOMS 43(2), 2016), for a set-associative LRU cache of W ways of
 * `way` = size / W bytes each:
 *
 *   KC  The kc x nr micro-panel of B is reused from L1 by every tile of a
 *       column (the ir loop) while the tiles' mr x kc panels of A stream
 *       through it: each panel in whole ways of its own, one way left to C,
 *       so kc is the largest with ceil(kc mr s / way1) + ceil(kc nr s / way1)
 *       <= W1 - 1 (s: element bytes), a multiple of 8. (The paper's closed
 *       form, CA = floor((W1 - 1) / (1 + nr/mr)) ways for A, is this with
 *       the split rounded down: for 8 x 16 f64 tiles in 12 ways it gives
 *       A 3 ways and kc 192, where A 4 and B 7 give 224.) As in BLIS, a
 *       last k block of up to kc/4 more is done with the one before it,
 *       rather than as a short pass of its own.
 *   MC  The mc x kc block of A stays in L2 while B's micro-panels pass
 *       through it: of its W2 ways, one is left over and two go to B's
 *       panels (the one in use and the next, which the prefetchers bring
 *       in), each ceil(kc nr s / way2) ways; the rest holds A's block and
 *       the mc x nr column of C that each B panel updates:
 *       mc = (W2 - 1 - 2 Bways) way2 / ((kc + nr) s), a multiple of mr.
 *   NC  The kc x nc block of B stays in this core's share of L3 while A's
 *       blocks pass: of its W3 ways, one goes to C and ceil(mc kc s / way3)
 *       to A: nc = (W3 - 1 - Aways) way3 / (kc s), a multiple of nr. The
 *       share is the L3 over the CPUs sharing it, but at most 4 L2s: a VM
 *       counts only its own CPUs as sharing (this 2-vCPU Zen 5 reports 2
 *       where 8 cores share each 32 MiB), and no current x86 part gives a
 *       core more (Zen 4/5: 4 MiB per 1 MiB L2; Sapphire Rapids: 1.9 MiB
 *       per 2 MiB). Measured here, a 14 MiB block of B (the uncapped share)
 *       made the 256 x 50257 x 768 product 11% slower than a 3 MiB one.
 *
 * A cache too small or too little associative for a level's rule gets half
 * its bytes instead; what the CPU does not tell is taken as 32 KiB 8-way,
 * 1 MiB 16-way and 8 MiB 16-way, 64-byte lines. The blocks change how the
 * work is cut, never the order of a sum (see the top of the file). */
static int64_t gb_cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

nbi_gemm_blocks nbi_gemm_blocking(const nbi_cpu *cpu, int mr, int nr, int es) {
    nbi_gemm_blocks r = {.mr = mr, .nr = nr};
    const nbi_cpu none = {0};
    if (!cpu) cpu = &none;
    if (mr < 1) mr = r.mr = 1;
    if (nr < 1) nr = r.nr = 1;
    if (es < 1) es = 1;
    const int64_t l1 = cpu->l1d > 0 ? cpu->l1d : (int64_t)32 << 10;
    const int64_t l2 = cpu->l2 > 0 ? cpu->l2 : (int64_t)1 << 20;
    const int64_t l3 = cpu->l3 > 0 ? cpu->l3 : (int64_t)8 << 20;
    const int64_t w1 = cpu->l1d > 0 && cpu->l1d_ways > 0 ? cpu->l1d_ways : 8;
    const int64_t w2 = cpu->l2 > 0 && cpu->l2_ways > 0 ? cpu->l2_ways : 16;
    const int64_t w3 = cpu->l3 > 0 && cpu->l3_ways > 0 ? cpu->l3_ways : 16;
    int64_t l3s = l3 / (cpu->l3 > 0 && cpu->l3_sharing > 1 ? cpu->l3_sharing : 1);
    if (l3s > 4 * l2) l3s = 4 * l2;

    const int64_t way1 = l1 / w1;
    int64_t kc = 0;
    for (int64_t ca = 1; ca <= w1 - 2; ca++) { /* A's panel in ca ways, B's in the rest but one */
        int64_t k = GEMM_MIN(ca * way1 / ((int64_t)mr * es), (w1 - 1 - ca) * way1 / ((int64_t)nr * es));
        if (k > kc) kc = k;
    }
    if (kc == 0) kc = l1 / 2 / ((int64_t)(mr + nr) * es);
    kc = kc / 8 * 8;
    r.kc = kc < 8 ? 8 : kc;

    const int64_t way2 = l2 / w2, cb = w2 - 1 - 2 * gb_cdiv(r.kc * nr * es, way2);
    int64_t mc = (cb >= 1 ? cb * way2 : l2 / 2) / ((r.kc + nr) * es);
    mc = mc / mr * mr;
    r.mc = mc < mr ? mr : mc;

    const int64_t way3 = l3s / w3, cn = w3 - 1 - gb_cdiv(r.mc * r.kc * es, way3 > 0 ? way3 : 1);
    int64_t nc = (cn >= 1 ? cn * way3 : l3s / 2) / (r.kc * es);
    nc = nc / nr * nr;
    r.nc = nc < nr ? nr : nc;
    return r;
}

/* A read in place (not packed) is not one contiguous block: it is runs of
 * contiguous bytes (rows of A, kc elements each; or rows of A^T, mc each) a
 * stride apart, and a stride that is a multiple of a large power of two puts
 * the runs' lines in a few of L2's sets. mc is then cut so that no set gets
 * more lines of A than the ways the model gives A's block (its share, beside
 * the column of C, of the W2 - 1 - 2 Bways above), counted line by line for
 * the block's first rows (the count is the same for every block of rows of
 * the same product, up to where a run starts within a line). Here a 2048 x
 * 2048 row-major A, 8 KiB a row, puts its rows at 8 places of a 64 KiB way:
 * the model's 736 rows would put 92 lines in each of 128 sets of 16 ways;
 * 88 rows put 11. Measured here, 2048^3 ran 4% faster with the cut, f64
 * 512^3 6%. When the runs alias along k (rows of A^T whose stride repeats
 * within kc), no mc helps and mc stays. A product whose rows (up to mc) fit
 * keeps mc after one count (~1 us for 64 rows); each thread remembers its
 * last 16 answers, so a layout is counted once, not per call. */
static int64_t gb_fullest(uint16_t *count, int64_t sets, int64_t line, int64_t runs,
                          int64_t bytes, int64_t d, int64_t base) {
    memset(count, 0, sizeof *count * (size_t)sets);
    int64_t worst = 0;
    for (int64_t r = 0; r < runs; r++) {
        int64_t first = (base + r * d) / line, last = (base + r * d + bytes - 1) / line;
        if (last - first >= sets) last = first + sets - 1; /* a run wider than a way: once each */
        for (int64_t l = first; l <= last; l++) {
            uint16_t *c = &count[l % sets];
            if (*c < UINT16_MAX) ++*c;
            if (*c > worst) worst = *c;
        }
    }
    return worst;
}

int64_t nbi_gemm_mc_in_place(const nbi_cpu *cpu, const nbi_gemm_blocks *b, int es, int at,
                             int64_t stride, int64_t base, int64_t M) {
    const nbi_cpu none = {0};
    if (!cpu) cpu = &none;
    const int64_t line = cpu->line > 0 ? cpu->line : 64;
    const int64_t l2 = cpu->l2 > 0 ? cpu->l2 : (int64_t)1 << 20;
    const int64_t w2 = cpu->l2 > 0 && cpu->l2_ways > 0 ? cpu->l2_ways : 16;
    const int64_t way = l2 / w2, sets = way / line;
    const int64_t cb = w2 - 1 - 2 * gb_cdiv(b->kc * b->nr * es, way);
    const int64_t a_ways = cb * b->kc / (b->kc + b->nr);
    const int64_t d = (stride < 0 ? -stride : stride) * es;
    base = base < 0 ? 0 : base % line;
    if (a_ways < 1 || sets < 1 || sets > (1 << 20) || b->mc <= b->mr) return b->mc;
    if (d < (at ? b->mc : b->kc) * es) return b->mc; /* runs that overlap: contiguous enough */
    /* the rows one block of this product has: when they fit, nothing to cut */
    const int64_t rows = M < b->mc ? (M + b->mr - 1) / b->mr * b->mr : b->mc;
    enum { MEMO = 16 };
    static _Thread_local struct {
        int64_t stride, kc, mc, mr, nr, base, rows, out;
        int es, at;
    } memo[MEMO];
    static _Thread_local int next;
    for (int i = 0; i < MEMO; i++)
        if (memo[i].out && memo[i].stride == d && memo[i].kc == b->kc && memo[i].mc == b->mc &&
            memo[i].mr == b->mr && memo[i].nr == b->nr && memo[i].base == base &&
            memo[i].rows == rows && memo[i].es == es && memo[i].at == at)
            return memo[i].out;
    uint16_t *count = malloc(sizeof *count * (size_t)sets);
    if (!count) return b->mc;
    int64_t mc;
    if (gb_fullest(count, sets, line, at ? b->kc : rows, (at ? rows : b->kc) * es, d, base) <=
        a_ways) {
        mc = b->mc;
    } else if (!at) { /* rows of A, mc runs of kc elements: the most rows that fit */
        int64_t lo = b->mr, hi = b->mc; /* lo always fits unless nothing does */
        while (lo < hi) {
            int64_t mid = (lo + hi + b->mr) / 2 / b->mr * b->mr;
            if (gb_fullest(count, sets, line, mid, b->kc * es, d, base) <= a_ways) lo = mid;
            else hi = mid - b->mr;
        }
        mc = lo;
    } else { /* rows of A^T, kc runs of mc elements */
        int64_t lo = b->mr, hi = b->mc;
        if (gb_fullest(count, sets, line, b->kc, lo * es, d, base) > a_ways) lo = hi = b->mc;
        while (lo < hi) {
            int64_t mid = (lo + hi + b->mr) / 2 / b->mr * b->mr;
            if (gb_fullest(count, sets, line, b->kc, mid * es, d, base) <= a_ways) lo = mid;
            else hi = mid - b->mr;
        }
        mc = lo;
    }
    free(count);
    memo[next].stride = d, memo[next].kc = b->kc, memo[next].mc = b->mc, memo[next].mr = b->mr;
    memo[next].nr = b->nr, memo[next].base = base, memo[next].es = es, memo[next].at = at;
    memo[next].rows = rows, memo[next].out = mc;
    next = (next + 1) % MEMO;
    return mc;
}

static nbi_gemm_blocks gemm_blk[GB_N];
static pthread_once_t gemm_blk_once = PTHREAD_ONCE_INIT;

static void gemm_blocks_init(void) {
    const nbi_cpu *c = nbi_cpu_info();
    static const int tiles[GB_N][3] = {
        {f32_port_MR, f32_port_NR, 4}, {f64_port_MR, f64_port_NR, 8},
#if GEMM_X86
        {f32_avx2_MR, f32_avx2_NR, 4}, {f64_avx2_MR, f64_avx2_NR, 8},
        {f32_avx512_MR, f32_avx512_NR, 4}, {f64_avx512_MR, f64_avx512_NR, 8},
#elif GEMM_ARM
        {f32_neon_MR, f32_neon_NR, 4}, {f64_neon_MR, f64_neon_NR, 8},
        {f32_sve16_MR, f32_sve16_NR, 4}, {f64_sve16_MR, f64_sve16_NR, 8},
        {f32_sve32_MR, f32_sve32_NR, 4}, {f64_sve32_MR, f64_sve32_NR, 8},
        {f32_sve64_MR, f32_sve64_NR, 4}, {f64_sve64_MR, f64_sve64_NR, 8},
#else
        {4, 8, 4}, {4, 4, 8}, {4, 8, 4}, {4, 4, 8}, /* unused */
#endif
    };
    size_t keep = ws_keep_max;
    for (int i = 0; i < GB_N; i++) {
        gemm_blk[i] = nbi_gemm_blocking(c, tiles[i][0], tiles[i][1], tiles[i][2]);
        const nbi_gemm_blocks *b = &gemm_blk[i];
        size_t ws = (size_t)tiles[i][2] * (size_t)((b->kc + b->kc / 4) * (b->mc + 16 + b->nc)) +
                    2 * GEMM_HDR;
        if (ws > keep) keep = ws;
    }
    ws_keep_max = keep;
}

static const nbi_gemm_blocks *gemm_blocks(void) {
    pthread_once(&gemm_blk_once, gemm_blocks_init);
    return gemm_blk;
}

static _Atomic int gemm_path = NBI_GEMM_AUTO;

/* The best path the CPU has, capped by NABLA_ISA (tensor/cpu.c). SVE needs
 * a vector length its packing was instantiated for. */
static int detect_path(void) {
    int isa = nbi_isa();
#if GEMM_X86
    if (isa >= NBI_ISA_AVX512) return NBI_GEMM_AVX512;
    if (isa >= NBI_ISA_AVX2) return NBI_GEMM_AVX2;
#elif GEMM_ARM
    int vl = nbi_cpu_info()->sve_bytes;
    if (isa >= NBI_ISA_SVE && (vl == 16 || vl == 32 || vl == 64)) return NBI_GEMM_SVE;
    if (isa >= NBI_ISA_NEON) return NBI_GEMM_NEON;
#endif
    (void)isa;
    return NBI_GEMM_PORTABLE;
}

/* A path's place in its architecture's list (each a superset of the one
 * before), -1 for the paths of other architectures. */
static int path_rank(int p) {
    if (p == NBI_GEMM_PORTABLE) return 0;
#if GEMM_X86
    if (p == NBI_GEMM_AVX2 || p == NBI_GEMM_AVX512) return p == NBI_GEMM_AVX2 ? 1 : 2;
#elif GEMM_ARM
    if (p == NBI_GEMM_NEON || p == NBI_GEMM_SVE) return p == NBI_GEMM_NEON ? 1 : 2;
#endif
    return -1;
}

int nbi_gemm_path(int force) {
    int best = detect_path();
    int p = force == NBI_GEMM_AUTO ? best
            : path_rank(force) < 0 ? NBI_GEMM_PORTABLE
            : path_rank(force) > path_rank(best) ? best : force;
    atomic_store_explicit(&gemm_path, p, memory_order_relaxed);
    return p;
}

static int current_path(void) {
    int p = atomic_load_explicit(&gemm_path, memory_order_relaxed);
    if (p < 0) {
        p = detect_path();
        atomic_store_explicit(&gemm_path, p, memory_order_relaxed);
    }
    return p;
}

int nbi_gemm_path_now(void) { return current_path(); }

/* The entry of gemm_blk that a product of this thread takes on path p. */
static int gb_index(int p, int f64) {
    switch (p) {
#if GEMM_X86
    case NBI_GEMM_AVX512: return f64 ? GB_F64_AVX512 : GB_F32_AVX512;
    case NBI_GEMM_AVX2: return f64 ? GB_F64_AVX2 : GB_F32_AVX2;
#elif GEMM_ARM
    case NBI_GEMM_SVE:
        switch (nbi_gemm_sve_bytes()) { /* the vector length is per thread */
        case 16: return f64 ? GB_F64_SVE16 : GB_F32_SVE16;
        case 32: return f64 ? GB_F64_SVE32 : GB_F32_SVE32;
        case 64: return f64 ? GB_F64_SVE64 : GB_F32_SVE64;
        }
        /* fall through - another length runs NEON */
    case NBI_GEMM_NEON: return f64 ? GB_F64_NEON : GB_F32_NEON;
#endif
    default: return f64 ? GB_F64_PORT : GB_F32_PORT;
    }
}

int nbi_gemm_blocks_force(int f64, const nbi_gemm_blocks *b) {
    nbi_gemm_blocks *bk = (nbi_gemm_blocks *)gemm_blocks();
    int i = gb_index(current_path(), f64);
    nbi_gemm_blocks d = nbi_gemm_blocking(nbi_cpu_info(), bk[i].mr, bk[i].nr, f64 ? 8 : 4);
    if (b && (b->kc < 1 || b->mc < 1 || b->nc < 1)) return -1;
    if (b) {
        d.kc = b->kc;
        d.mc = (b->mc + d.mr - 1) / d.mr * d.mr;
        d.nc = (b->nc + d.nr - 1) / d.nr * d.nr;
    }
    bk[i] = d;
    return 0;
}

nbi_gemm_blocks nbi_gemm_blocks_of(int f64) {
    return gemm_blocks()[gb_index(current_path(), f64)];
}

/* Shapes with nothing to sum, and K == 0 (an empty sum is 0). */
#define GEMM_TRIVIAL(T)                                                                        \
    if (M <= 0 || N <= 0) return 0;                                                            \
    if (K <= 0) {                                                                              \
        for (int64_t i = 0; i < M; i++)                                                        \
            for (int64_t j = 0; j < N; j++) c[i * scm + j * scn] = (T)0;                       \
        return 0;                                                                              \
    }

int nbi_gemm_f32(nbi_gemm_ws *ws, int64_t M, int64_t N, int64_t K, const float *a, int64_t sam,
                 int64_t sak, const float *b, int64_t sbk, int64_t sbn, float *c, int64_t scm,
                 int64_t scn) {
    GEMM_TRIVIAL(float)
    switch (current_path()) {
#if GEMM_X86
    case NBI_GEMM_AVX512:
        return f32_avx512_gemm(ws, M, N, K, a, sam, sak, b, sbk, sbn, c, scm, scn);
    case NBI_GEMM_AVX2:
        return f32_avx2_gemm(ws, M, N, K, a, sam, sak, b, sbk, sbn, c, scm, scn);
#elif GEMM_ARM
    case NBI_GEMM_SVE:
        switch (gb_index(NBI_GEMM_SVE, 0)) {
        case GB_F32_SVE16:
            return f32_sve16_gemm(ws, M, N, K, a, sam, sak, b, sbk, sbn, c, scm, scn);
        case GB_F32_SVE32:
            return f32_sve32_gemm(ws, M, N, K, a, sam, sak, b, sbk, sbn, c, scm, scn);
        case GB_F32_SVE64:
            return f32_sve64_gemm(ws, M, N, K, a, sam, sak, b, sbk, sbn, c, scm, scn);
        }
        /* fall through - a vector length without its packing */
    case NBI_GEMM_NEON:
        return f32_neon_gemm(ws, M, N, K, a, sam, sak, b, sbk, sbn, c, scm, scn);
#endif
    default:
        return f32_port_gemm(ws, M, N, K, a, sam, sak, b, sbk, sbn, c, scm, scn);
    }
}

int nbi_gemm_f64(nbi_gemm_ws *ws, int64_t M, int64_t N, int64_t K, const double *a,
                 int64_t sam, int64_t sak, const double *b, int64_t sbk, int64_t sbn, double *c,
                 int64_t scm, int64_t scn) {
    GEMM_TRIVIAL(double)
    switch (current_path()) {
#if GEMM_X86
    case NBI_GEMM_AVX512:
        return f64_avx512_gemm(ws, M, N, K, a, sam, sak, b, sbk, sbn, c, scm, scn);
    case NBI_GEMM_AVX2:
        return f64_avx2_gemm(ws, M, N, K, a, sam, sak, b, sbk, sbn, c, scm, scn);
#elif GEMM_ARM
    case NBI_GEMM_SVE:
        switch (gb_index(NBI_GEMM_SVE, 1)) {
        case GB_F64_SVE16:
            return f64_sve16_gemm(ws, M, N, K, a, sam, sak, b, sbk, sbn, c, scm, scn);
        case GB_F64_SVE32:
            return f64_sve32_gemm(ws, M, N, K, a, sam, sak, b, sbk, sbn, c, scm, scn);
        case GB_F64_SVE64:
            return f64_sve64_gemm(ws, M, N, K, a, sam, sak, b, sbk, sbn, c, scm, scn);
        }
        /* fall through - a vector length without its packing */
    case NBI_GEMM_NEON:
        return f64_neon_gemm(ws, M, N, K, a, sam, sak, b, sbk, sbn, c, scm, scn);
#endif
    default:
        return f64_port_gemm(ws, M, N, K, a, sam, sak, b, sbk, sbn, c, scm, scn);
    }
}
