/* conv.c: nb_conv1d and nb_conv2d with torch.nn.functional.conv1d/conv2d's
 * semantics, their kernels, and their backward and tangent rules.
 *
 * Everything runs in the 2-d form: a conv1d is a conv2d with H = KH = 1, an
 * unbatched input gets N = 1 (recorded unsqueeze/squeeze views around it).
 *
 * Algorithm (im2col onto the GEMM of gemm.c), per group g of G:
 *   forward       y_n[g] (Og, OHW)  = W[g] (Og, Kc) col(x_n[g]) (Kc, OHW) + b[g]
 *   input grad    col(gx_n[g])      = W[g]^T (Kc, Og) G_n[g] (Og, OHW), then
 *                 col2im adds the columns back onto gx_n[g]
 *   weight grad   gW[g] (Og, Kc)    = sum over n of G_n[g] col(x_n[g])^T
 * with Kc = Cg KH KW (row r of col = (c, kh, kw), column = output pixel).
 * The column buffer holds at most a tile of pixels (an image, or a part of
 * one) sized from the CPU's L2 (tensor/cpu.c), never the batch's columns;
 * images whose columns are few are batched into one product up to that
 * bound (their outputs go through a small buffer). A 1x1, stride-1,
 * unpadded conv reads x in place as its column matrix (no im2col).
 *
 * Threads split outputs, never a sum: forward and input grad over (image
 * chunk, group), weight grad over (group, rows of W, columns of W), each
 * task summing over every image and tile in one fixed order. gemm.c's
 * element sums do not depend on the cut, so results are bitwise the same
 * for any thread count.
 *
 * f32 convs of stride and dilation 1, one group, a 3x3 or 5x5 kernel and
 * >= 16 channels each way take Winograd's F(2x2, r x r) instead, on AVX-512
 * CPUs (conv_winograd.c), in all three passes; a non-finite Winograd result
 * is recomputed here.
 *
 * Inside an NB_BF16 autocast region, f32 convs take the bf16 GEMM (bf16
 * products, f32 sums and results, as nb_matmul), in all three passes: the
 * engine runs a conv's backward in the region its forward ran in.
 *
 * The backward is two internal recorded ops, conv_input_grad (a transposed
 * conv of g with w) and conv_weight_grad (of x and g), plus a sum for the
 * bias: all three are bilinear, so their own backward and tangent rules are
 * again conv, conv_input_grad and conv_weight_grad (create_graph and forward
 * mode come for free). */
#include "conv_internal.h"
#include "gemm_internal.h"

#include <stdatomic.h>
#include <stdlib.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <string.h>
#include "../tensor/cpu_internal.h"
#include "ops_internal.h"

/* The geometry of one conv in its 2-d form, kept in nbi_node.i (16 slots). */
typedef struct {
    int64_t N, C, H, W;   /* input (N, C, H, W) */
    int64_t O, KH, KW;    /* weight (O, C/G, KH, KW) */
    int64_t OH, OW;       /* output (N, O, OH, OW) */
    int64_t sh, sw, ph, pw, dh, dw; /* stride, leading pad, dilation */
    int64_t G;            /* groups */
} conv_geom;
_Static_assert(sizeof(conv_geom) <= sizeof(((nbi_node *)0)->i), "conv_geom fits nbi_node.i");

static void geom_put(nbi_node *n, const conv_geom *g) {
    memcpy(n->i, g, sizeof *g);
}
static conv_geom geom_get(const nbi_node *n) {
    conv_geom g;
    memcpy(&g, n->i, sizeof g);
    return g;
}

static nb_tensor *conv_fwd(const char *fn, nb_tensor *x, nb_tensor *w, nb_tensor *b,
                           const conv_geom *g);

/* g as conv_winograd.c's geometry when it is one it computes in f32 (stride
 * and dilation 1, one group, a square 3x3 or 5x5 kernel). */
static bool autocast_bf16(nb_dtype dt);
static bool wino_geom(const conv_geom *g, nb_dtype dt, nbi_wino_geom *w) {
    if (dt != NB_F32 || autocast_bf16(dt) || !nbi_wino_enabled() || g->G != 1 || g->sh != 1 ||
        g->sw != 1 ||
        g->dh != 1 || g->dw != 1 || g->KH != g->KW)
        return false;
    *w = (nbi_wino_geom){g->N, g->C, g->H, g->W, g->O, g->KH, g->OH, g->OW, g->ph, g->pw};
    return nbi_wino_fits(w);
}
static nb_tensor *conv_input_grad(nb_tensor *gy, nb_tensor *w, const conv_geom *g);
static nb_tensor *conv_weight_grad(nb_tensor *x, nb_tensor *gy, const conv_geom *g);

/* ------------------------------------------------------------- helpers */
/* The one stride that walks dims [d0, 4) of t as a flat index, or -1 when
 * they are not laid out so (size-1 dims do not count). */
static int64_t flat_stride(const nb_tensor *t, int d0) {
    int64_t st = -1, span = 1;
    for (int d = 3; d >= d0; d--) {
        if (t->shape[d] == 1) continue;
        if (st < 0) st = t->strides[d];
        else if (t->strides[d] != st * span) return -1;
        span *= t->shape[d];
    }
    return st < 0 ? 1 : st;
}

/* t itself when dims [d0, 4) walk as one flat index, else a contiguous copy
 * (*copy set: the caller discards it). NULL when out of memory. */
static nb_tensor *flat_from(const char *fn, nb_tensor *t, int d0, nb_tensor **copy) {
    *copy = NULL;
    if (flat_stride(t, d0) >= 0) return t;
    nb_tensor *c = nbi_new(fn, t->dtype, t->ndim, t->shape, false);
    if (!c) return NULL;
    nbi_copy_strided(c, t->strides, t);
    return *copy = c;
}

/* A work buffer of rows x cols elements of es bytes (one more, so never 0),
 * or NULL when out of memory or when that many bytes pass SIZE_MAX (a
 * kernel of 2^62 elements read through stride 0 asks for that much). */
static char *buf_alloc(int64_t rows, int64_t cols, size_t es) {
    int64_t n;
    size_t bytes;
    if (__builtin_mul_overflow(rows, cols, &n) || __builtin_add_overflow(n, 1, &n) ||
        __builtin_mul_overflow((size_t)n, es, &bytes))
        return NULL;
    return malloc(bytes);
}

/* Under an NB_BF16 autocast region (in force for the forward, and for the
 * backward and tangent rules of a conv made in one: the engine runs them in
 * their forward's region) f32 convs run their products in bf16 with f32
 * sums, as nb_matmul does: the columns and weights are rounded to bf16 as
 * the bf16 GEMM packs them, and results stay f32. Winograd is f32 only. */
static bool autocast_bf16(nb_dtype dt) { return dt == NB_F32 && nb_autocast_dtype() == NB_BF16; }

static int gemm(nbi_gemm_ws *ws, bool f64, bool bf16, int64_t M, int64_t N, int64_t K,
                const void *a, int64_t sam, int64_t sak, const void *b, int64_t sbk, int64_t sbn,
                void *c, int64_t scm, int64_t scn) {
    if (f64) return nbi_gemm_f64(ws, M, N, K, a, sam, sak, b, sbk, sbn, c, scm, scn);
    if (bf16) return nbi_gemm_bf16(ws, M, N, K, a, 1, sam, sak, b, 1, sbk, sbn, c, scm, scn);
    return nbi_gemm_f32(ws, M, N, K, a, sam, sak, b, sbk, sbn, c, scm, scn);
}

/* The pixels [lo, hi) of the output row ow = 0.. that read input column
 * iw = ow * s + off inside [0, W): ow in [*a, *b). lo = ceil(-off / s)
 * without forming -off + s - 1, which passes INT64_MAX for a large stride;
 * W - 1 - off <= W - 1 + pw fits (conv_check). */
static void valid_cols(int64_t OW, int64_t s, int64_t off, int64_t W, int64_t *a, int64_t *b) {
    int64_t lo = off >= 0 ? 0 : (-off - 1) / s + 1;
    int64_t hi = W - 1 - off < 0 ? 0 : (W - 1 - off) / s + 1;
    *a = lo < OW ? lo : OW;
    *b = hi < OW ? hi : OW;
    if (*b < *a) *b = *a;
}

/* im2col and col2im over rows [k0, k1) of col (r = (c, kh, kw)) and output
 * pixels [p0, p1) of one image: xn is the image's first channel of the
 * group, xs its strides (c, h, w); col rows ld apart. col2im adds. Pointers
 * are formed for input pixels inside the image only (a padding or stride
 * near INT64_MAX puts off * xs[2] and the stride's step past int64), so the
 * run's reads start at its first valid column va, input column
 * va sw + off, and step sw xs[2] only between valid ones (< W xs[2]). */
#define DEFINE_COL(T)                                                                     \
    static void im2col_##T(const conv_geom *g, const T *xn, const int64_t *xs, int64_t k0, \
                           int64_t k1, int64_t p0, int64_t p1, T *col, int64_t ld) {       \
        int64_t kk = g->KH * g->KW;                                                        \
        for (int64_t r = k0; r < k1; r++) {                                                \
            int64_t c = r / kk, kh = r % kk / g->KW, kw = r % g->KW;                       \
            int64_t off = kw * g->dw - g->pw, a, b;                                        \
            valid_cols(g->OW, g->sw, off, g->W, &a, &b);                                   \
            T *dst = col + (r - k0) * ld; /* dst[j - ow]: output column j of this run */   \
            int64_t oh = p0 / g->OW, ow = p0 % g->OW;                                      \
            for (int64_t p = p0; p < p1; oh++, ow = 0) {                                   \
                int64_t run = g->OW - ow < p1 - p ? g->OW - ow : p1 - p, e = ow + run;     \
                int64_t ih = oh * g->sh - g->ph + kh * g->dh;                              \
                int64_t va = a > ow ? a : ow, vb = b < e ? b : e;                          \
                if (ih < 0 || ih >= g->H || vb <= va) {                                    \
                    for (int64_t j = 0; j < run; j++) dst[j] = 0;                          \
                } else {                                                                   \
                    const T *src = xn + c * xs[0] + ih * xs[1] + (va * g->sw + off) * xs[2]; \
                    for (int64_t j = ow; j < va; j++) dst[j - ow] = 0;                     \
                    if (vb - va == 1 || g->sw * xs[2] == 1) {                              \
                        for (int64_t j = va; j < vb; j++) dst[j - ow] = src[j - va];       \
                    } else {                                                               \
                        int64_t step = g->sw * xs[2];                                      \
                        for (int64_t j = va; j < vb; j++) dst[j - ow] = src[(j - va) * step]; \
                    }                                                                      \
                    for (int64_t j = vb; j < e; j++) dst[j - ow] = 0;                      \
                }                                                                          \
                dst += run;                                                                \
                p += run;                                                                  \
            }                                                                              \
        }                                                                                  \
    }                                                                                      \
    /* gxn contiguous (Cg, H, W) */                                                        \
    static void col2im_##T(const conv_geom *g, T *gxn, int64_t p0, int64_t p1,             \
                           const T *col, int64_t ld) {                                     \
        int64_t kk = g->KH * g->KW, Kc = g->C / g->G * kk;                                 \
        for (int64_t r = 0; r < Kc; r++) {                                                 \
            int64_t c = r / kk, kh = r % kk / g->KW, kw = r % g->KW;                       \
            int64_t off = kw * g->dw - g->pw, a, b;                                        \
            valid_cols(g->OW, g->sw, off, g->W, &a, &b);                                   \
            const T *src = col + r * ld;                                                   \
            for (int64_t p = p0; p < p1;) {                                                \
                int64_t oh = p / g->OW, ow = p % g->OW;                                    \
                int64_t run = g->OW - ow < p1 - p ? g->OW - ow : p1 - p, e = ow + run;     \
                int64_t ih = oh * g->sh - g->ph + kh * g->dh;                              \
                if (ih >= 0 && ih < g->H) {                                                \
                    T *row = gxn + (c * g->H + ih) * g->W; /* row[iw], iw = j sw + off */  \
                    int64_t va = a > ow ? a : ow, vb = b < e ? b : e;                      \
                    for (int64_t j = va; j < vb; j++) row[j * g->sw + off] += src[j - ow]; \
                }                                                                          \
                src += run;                                                                \
                p += run;                                                                  \
            }                                                                              \
        }                                                                                  \
    }
DEFINE_COL(float)
DEFINE_COL(double)

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define CONV_AVX512 1
#define C512 __attribute__((target("avx512f")))
/* im2col_float for rows of unit stride (sw * xs[2] == 1) with AVX-512: a
 * run of an output row is at most a few 16-lane masked loads and stores
 * (lanes outside the input read nothing, masked loads do not fault), where
 * the generic loop pays a short copy and two zero fills per run of OW
 * (14 in the Fashion network's second conv). The same values. */
static C512 void im2col_f32_avx512(const conv_geom *g, const float *xn, const int64_t *xs,
                                   int64_t k0, int64_t k1, int64_t p0, int64_t p1, float *col,
                                   int64_t ld) {
    int64_t kk = g->KH * g->KW;
    for (int64_t r = k0; r < k1; r++) {
        int64_t c = r / kk, kh = r % kk / g->KW, kw = r % g->KW;
        int64_t off = kw * g->dw - g->pw, a, b;
        valid_cols(g->OW, 1, off, g->W, &a, &b);
        float *dst = col + (r - k0) * ld;
        int64_t oh = p0 / g->OW, ow = p0 % g->OW, p = p0;
        if (ow == 0 && g->OW <= 64) { /* whole output rows: a load and store per 16 */
            int nv = (int)((g->OW + 15) / 16);
            __mmask16 st[4], ldm[4];
            for (int v = 0; v < nv; v++) {
                int64_t n = g->OW - 16 * v < 16 ? g->OW - 16 * v : 16;
                int64_t lo = a - 16 * v < 0 ? 0 : a - 16 * v, hi = b - 16 * v > n ? n : b - 16 * v;
                st[v] = (__mmask16)((1u << n) - 1);
                ldm[v] = hi > lo ? (__mmask16)(((1u << hi) - 1) & ~((1u << lo) - 1)) : 0;
            }
            /* addresses in uintptr_t: input column off may lie far outside x
             * (a large padding), where only masked-off lanes point */
            uintptr_t s = (uintptr_t)(xn + c * xs[0]) + 4 * (uintptr_t)off;
            for (; p + g->OW <= p1; oh++, p += g->OW, dst += g->OW) {
                int64_t ih = oh * g->sh - g->ph + kh * g->dh;
                bool in = ih >= 0 && ih < g->H;
                uintptr_t src = s + 4 * (uintptr_t)(in ? ih * xs[1] : 0);
                for (int v = 0; v < nv; v++)
                    _mm512_mask_storeu_ps(dst + 16 * v, st[v],
                                          _mm512_maskz_loadu_ps(in ? ldm[v] : 0,
                                                                (const void *)(src + 64 * v)));
            }
        }
        for (; p < p1; oh++, ow = 0) {
            int64_t run = g->OW - ow < p1 - p ? g->OW - ow : p1 - p, e = ow + run;
            int64_t ih = oh * g->sh - g->ph + kh * g->dh;
            bool in = ih >= 0 && ih < g->H;
            /* dst[j - ow], s + 4 j: output column j of this run and its input */
            uintptr_t s = in ? (uintptr_t)(xn + c * xs[0] + ih * xs[1]) + 4 * (uintptr_t)off : 0;
            for (int64_t j = ow; j < e; j += 16) {
                int64_t n = e - j < 16 ? e - j : 16;
                int64_t lo = a - j < 0 ? 0 : a - j, hi = b - j > n ? n : b - j;
                __mmask16 st = (__mmask16)((1u << n) - 1), ldm = 0;
                if (in && hi > lo) ldm = (__mmask16)(((1u << hi) - 1) & ~((1u << lo) - 1));
                __m512 v = _mm512_maskz_loadu_ps(ldm, (const void *)(s + 4 * (uintptr_t)j));
                _mm512_mask_storeu_ps(dst + (j - ow), st, v);
            }
            dst += run;
            p += run;
        }
    }
}

/* col2im_float for sw == 1 with AVX-512: each run added with a masked
 * load, add and store (one add per element, the same order: the same bits). */
static C512 void col2im_f32_avx512(const conv_geom *g, float *gxn, int64_t p0, int64_t p1,
                                   const float *col, int64_t ld) {
    int64_t kk = g->KH * g->KW, Kc = g->C / g->G * kk;
    for (int64_t r = 0; r < Kc; r++) {
        int64_t c = r / kk, kh = r % kk / g->KW, kw = r % g->KW;
        int64_t off = kw * g->dw - g->pw, a, b;
        valid_cols(g->OW, 1, off, g->W, &a, &b);
        const float *src = col + r * ld;
        int64_t oh = p0 / g->OW, ow = p0 % g->OW;
        for (int64_t p = p0; p < p1; oh++, ow = 0) {
            int64_t run = g->OW - ow < p1 - p ? g->OW - ow : p1 - p, e = ow + run;
            int64_t ih = oh * g->sh - g->ph + kh * g->dh;
            int64_t va = a > ow ? a : ow, vb = b < e ? b : e;
            if (ih >= 0 && ih < g->H && vb > va) {
                /* d + 4 j, src[j - ow]: output column j of this run (d in
                 * uintptr_t: off may lie far left of the row, j >= va not) */
                uintptr_t d = (uintptr_t)(gxn + (c * g->H + ih) * g->W) + 4 * (uintptr_t)off;
                for (int64_t j = va; j < vb; j += 16) {
                    int64_t n = vb - j < 16 ? vb - j : 16;
                    __mmask16 m = (__mmask16)((1u << n) - 1);
                    float *dj = (float *)(d + 4 * (uintptr_t)j);
                    __m512 v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, dj),
                                             _mm512_maskz_loadu_ps(m, src + (j - ow)));
                    _mm512_mask_storeu_ps(dj, m, v);
                }
            }
            src += run;
            p += run;
        }
    }
}

/* col2im_f32_avx512 for a whole image (p0 = 0, p1 = OH OW), stride 1 and
 * input rows of at most 16 pixels: each input row of gx summed in a
 * register over (kh, kw), the order of r in which col2im adds them (one
 * pixel per (kh, kw) at stride 1), and stored once: the same sums, without
 * the load after a store one pixel over that stalls the generic order. */
static C512 void col2im_f32_rows_avx512(const conv_geom *g, float *gxn, const float *col,
                                        int64_t ld) {
    int64_t Cg = g->C / g->G;
    __mmask16 wm = (__mmask16)((1u << g->W) - 1);
    for (int64_t c = 0; c < Cg; c++)
        for (int64_t ih = 0; ih < g->H; ih++) {
            __m512 acc = _mm512_setzero_ps();
            for (int64_t kh = 0; kh < g->KH; kh++) {
                int64_t oh = ih + g->ph - kh * g->dh;
                if (oh < 0 || oh >= g->OH) continue;
                for (int64_t kw = 0; kw < g->KW; kw++) {
                    int64_t off = kw * g->dw - g->pw, r = (c * g->KH + kh) * g->KW + kw;
                    int64_t lo = off > 0 ? off : 0, hi = g->OW + off < g->W ? g->OW + off : g->W;
                    if (hi <= lo) continue;
                    __mmask16 m = (__mmask16)(((1u << hi) - 1) & ~((1u << lo) - 1));
                    /* lane iw reads col row r at pixel (oh, iw - off) */
                    uintptr_t src = (uintptr_t)(col + r * ld + oh * g->OW) - 4 * (uintptr_t)off;
                    acc = _mm512_mask_add_ps(acc, m, acc, _mm512_maskz_loadu_ps(m, (void *)src));
                }
            }
            _mm512_mask_storeu_ps(gxn + (c * g->H + ih) * g->W, wm, acc);
        }
}
#endif

#ifdef CONV_AVX512
static bool use_avx512(void) {
    static _Atomic int avx512 = -1; /* the path, read once */
    int use = atomic_load_explicit(&avx512, memory_order_relaxed);
    if (use < 0) atomic_store(&avx512, use = nbi_isa() >= NBI_ISA_AVX512);
    return use;
}
#endif

static void im2col(bool f64, const conv_geom *g, const char *xn, const int64_t *xs, int64_t k0,
                   int64_t k1, int64_t p0, int64_t p1, void *col, int64_t ld) {
#ifdef CONV_AVX512
    if (!f64 && g->sw == 1 && xs[2] == 1 && use_avx512()) { /* (sw xs[2] may pass int64) */
        im2col_f32_avx512(g, (const float *)xn, xs, k0, k1, p0, p1, col, ld);
        return;
    }
#endif
    if (f64) im2col_double(g, (const double *)xn, xs, k0, k1, p0, p1, col, ld);
    else im2col_float(g, (const float *)xn, xs, k0, k1, p0, p1, col, ld);
}

/* Pixel tiles: an image's OHW columns in tiles of at most `tile`; images
 * with fewer columns than that are batched `per` to a product. Both from
 * the rows of col (rows) and the L2's size, so from the shapes and the CPU,
 * never from the thread count. */
typedef struct {
    int64_t tile; /* pixels per tile within an image (OHW when per >= 1) */
    int64_t per;  /* whole images per chunk (1 when an image is tiled) */
} tiling;

/* Enough columns for the kernel's register tiles to run long (below this,
 * small images are batched): a few of its column panels. */
#define MIN_COLS 256

static tiling tiles_for(const conv_geom *g, int64_t rows, size_t es) {
    const nbi_cpu *cpu = nbi_cpu_info();
    int64_t l2 = cpu && cpu->l2 > 0 ? cpu->l2 : (int64_t)1 << 20;
    int64_t ohw = g->OH * g->OW;
    int64_t cap = l2 / (int64_t)es / (rows > 0 ? rows : 1); /* columns the L2 holds */
    if (cap < 16) cap = 16;
    tiling t = {ohw > 0 ? ohw : 1, 1};
    if (ohw > cap) { /* equal tiles of one image */
        int64_t parts = (ohw + cap - 1) / cap;
        t.tile = (ohw + parts - 1) / parts;
    } else if (ohw < MIN_COLS && ohw > 0) {
        int64_t want = (MIN_COLS + ohw - 1) / ohw, fit = cap / ohw;
        t.per = want < fit ? want : fit;
        if (t.per > g->N) t.per = g->N > 0 ? g->N : 1;
        if (t.per < 1) t.per = 1;
    }
    return t;
}

/* ------------------------------------------------------------- forward */
typedef struct {
    conv_geom g;
    bool f64, bf16, direct;
    size_t es;
    const char *x, *w, *b;
    int64_t xs[4], ws0, wk, bs, xflat;
    char *y; /* contiguous (N, O, OH, OW) */
    tiling t;
    int64_t chunks;
    _Atomic int failed;
} fwd_job;

/* Adds bias b[o] to rows of y (n rows ld apart, cols each). */
static void add_bias(const fwd_job *j, char *y, int64_t o0, int64_t rows, int64_t ld,
                     int64_t cols) {
    if (!j->b) return;
    for (int64_t o = 0; o < rows; o++) {
        if (j->f64) {
            double bv = ((const double *)j->b)[(o0 + o) * j->bs], *r = (double *)y + o * ld;
            for (int64_t q = 0; q < cols; q++) r[q] += bv;
        } else {
            float bv = ((const float *)j->b)[(o0 + o) * j->bs], *r = (float *)y + o * ld;
            for (int64_t q = 0; q < cols; q++) r[q] += bv;
        }
    }
}

/* One chunk of images, one group. */
static int fwd_chunk(const fwd_job *j, nbi_gemm_ws *ws, int64_t chunk, int64_t grp, char *col,
                     char *tmp) {
    const conv_geom *g = &j->g;
    int64_t Cg = g->C / g->G, Og = g->O / g->G, Kc = Cg * g->KH * g->KW, ohw = g->OH * g->OW;
    const char *wg = j->w + (size_t)(grp * Og * j->ws0) * j->es;
    int64_t n0 = chunk * j->t.per, n1 = n0 + j->t.per < g->N ? n0 + j->t.per : g->N;
    if (n1 - n0 > 1) { /* several images: one product into tmp, then scattered */
        int64_t cols = (n1 - n0) * ohw;
        for (int64_t n = n0; n < n1; n++)
            im2col(j->f64, g, j->x + (size_t)(n * j->xs[0] + grp * Cg * j->xs[1]) * j->es,
                   j->xs + 1, 0, Kc, 0, ohw, col + (size_t)((n - n0) * ohw) * j->es, cols);
        if (gemm(ws, j->f64, j->bf16, Og, cols, Kc, wg, j->ws0, j->wk, col, cols, 1, tmp, cols, 1))
            return -1;
        for (int64_t n = n0; n < n1; n++) {
            char *yn = j->y + (size_t)((n * g->O + grp * Og) * ohw) * j->es;
            for (int64_t o = 0; o < Og; o++)
                memcpy(yn + (size_t)(o * ohw) * j->es,
                       tmp + (size_t)(o * cols + (n - n0) * ohw) * j->es, (size_t)ohw * j->es);
            add_bias(j, yn, grp * Og, Og, ohw, ohw);
        }
        return 0;
    }
    char *yn = j->y + (size_t)((n0 * g->O + grp * Og) * ohw) * j->es;
    const char *xn = j->x + (size_t)(n0 * j->xs[0] + grp * Cg * j->xs[1]) * j->es;
    if (j->direct) { /* 1x1, stride 1, no padding: x is the column matrix */
        if (gemm(ws, j->f64, j->bf16, Og, ohw, Kc, wg, j->ws0, j->wk, xn, j->xs[1], j->xflat, yn,
                 ohw, 1))
            return -1;
    } else {
        for (int64_t p0 = 0; p0 < ohw; p0 += j->t.tile) {
            int64_t p1 = p0 + j->t.tile < ohw ? p0 + j->t.tile : ohw, cols = p1 - p0;
            im2col(j->f64, g, xn, j->xs + 1, 0, Kc, p0, p1, col, cols);
            if (gemm(ws, j->f64, j->bf16, Og, cols, Kc, wg, j->ws0, j->wk, col, cols, 1,
                     yn + (size_t)p0 * j->es, ohw, 1))
                return -1;
        }
    }
    add_bias(j, yn, grp * Og, Og, ohw, ohw);
    return 0;
}

static void fwd_tasks(void *ctx, int64_t lo, int64_t hi) {
    fwd_job *j = ctx;
    const conv_geom *g = &j->g;
    int64_t Kc = g->C / g->G * g->KH * g->KW, Og = g->O / g->G;
    int64_t cols = j->t.per > 1 ? j->t.per * g->OH * g->OW : j->t.tile;
    char *col = j->direct ? NULL : buf_alloc(Kc, cols, j->es);
    char *tmp = j->t.per > 1 ? buf_alloc(Og, cols, j->es) : NULL;
    nbi_gemm_ws ws = {0};
    if ((!j->direct && !col) || (j->t.per > 1 && !tmp)) atomic_store(&j->failed, 1);
    for (int64_t t = lo; t < hi && !atomic_load(&j->failed); t++)
        if (fwd_chunk(j, &ws, t / g->G, t % g->G, col, tmp)) atomic_store(&j->failed, 1);
    nbi_gemm_ws_free(&ws);
    free(col);
    free(tmp);
}

/* Tasks per range: enough work (~2 MFLOP) to be worth a thread's wake-up. */
static int64_t grain_for(double flops_per_task) {
    return (int64_t)(2e6 / (flops_per_task + 1.0)) + 1;
}

static int run_forward(const char *fn, const conv_geom *g, const nb_tensor *x, nb_tensor *w,
                       const nb_tensor *b, nb_tensor *y) {
    nbi_wino_geom wg;
    if (wino_geom(g, x->dtype, &wg) &&
        nbi_wino_conv(&wg, nbi_ptr(x), x->strides, nbi_ptr(w), w->strides,
                      b ? nbi_ptr(b) : NULL, b ? b->strides[0] : 0, nbi_ptr(y)) == 0)
        return 0;
    nb_tensor *wcopy;
    nb_tensor *wf = flat_from(fn, w, 1, &wcopy);
    if (!wf) return -1;
    fwd_job j = {.g = *g, .f64 = x->dtype == NB_F64, .bf16 = autocast_bf16(x->dtype),
                 .es = nbi_dtype_size(x->dtype),
                 .x = nbi_ptr(x), .w = nbi_ptr(wf), .b = b ? nbi_ptr(b) : NULL,
                 .ws0 = wf->strides[0], .wk = flat_stride(wf, 1), .bs = b ? b->strides[0] : 0,
                 .y = nbi_ptr(y)};
    for (int d = 0; d < 4; d++) j.xs[d] = x->strides[d];
    int64_t Kc = g->C / g->G * g->KH * g->KW;
    j.t = tiles_for(g, Kc, j.es);
    j.xflat = flat_stride(x, 2);
    j.direct = g->KH == 1 && g->KW == 1 && g->sh == 1 && g->sw == 1 && g->ph == 0 &&
               g->pw == 0 && j.xflat >= 0 && j.t.per == 1;
    j.chunks = (g->N + j.t.per - 1) / j.t.per;
    double flops = 2.0 * (double)(g->O / g->G) * (double)Kc * (double)(g->OH * g->OW) *
                   (double)j.t.per;
    if (g->N * g->O * g->OH * g->OW > 0)
        nbi_parallel_for(j.chunks * g->G, grain_for(flops), fwd_tasks, &j);
    if (wcopy) nbi_discard(wcopy);
    if (atomic_load(&j.failed)) {
        nbi_error("%s: out of memory for the column buffers of a conv of %lld x %lld x %lld", fn,
                  (long long)(g->O / g->G), (long long)Kc, (long long)(g->OH * g->OW));
        return -1;
    }
    return 0;
}

/* --------------------------------------------------------- input grad */
typedef struct {
    conv_geom g;
    bool f64, bf16;
    size_t es;
    const char *gy, *w;
    int64_t gs0, gs1, gflat, ws0, wk;
    char *gx; /* contiguous (N, C, H, W) */
    tiling t;
    _Atomic int failed;
} igrad_job;

static int igrad_image(const igrad_job *j, nbi_gemm_ws *ws, int64_t n, int64_t grp, char *col) {
    const conv_geom *g = &j->g;
    int64_t Cg = g->C / g->G, Og = g->O / g->G, Kc = Cg * g->KH * g->KW, ohw = g->OH * g->OW;
    char *gxn = j->gx + (size_t)((n * g->C + grp * Cg) * g->H * g->W) * j->es;
    memset(gxn, 0, (size_t)(Cg * g->H * g->W) * j->es);
    const char *wg = j->w + (size_t)(grp * Og * j->ws0) * j->es;
    const char *gn = j->gy + (size_t)(n * j->gs0 + grp * Og * j->gs1) * j->es;
    for (int64_t p0 = 0; p0 < ohw; p0 += j->t.tile) {
        int64_t p1 = p0 + j->t.tile < ohw ? p0 + j->t.tile : ohw, cols = p1 - p0;
        /* col (Kc, cols) = W[g]^T (Kc, Og) G (Og, cols) */
        if (gemm(ws, j->f64, j->bf16, Kc, cols, Og, wg, j->wk, j->ws0,
                 gn + (size_t)(p0 * j->gflat) * j->es, j->gs1, j->gflat, col, cols, 1))
            return -1;
        if (j->f64) col2im_double(g, (double *)gxn, p0, p1, (const double *)col, cols);
#ifdef CONV_AVX512
        else if (g->sh == 1 && g->sw == 1 && g->W <= 16 && p0 == 0 && p1 == ohw && use_avx512())
            col2im_f32_rows_avx512(g, (float *)gxn, (const float *)col, cols);
        else if (g->sw == 1 && use_avx512())
            col2im_f32_avx512(g, (float *)gxn, p0, p1, (const float *)col, cols);
#endif
        else col2im_float(g, (float *)gxn, p0, p1, (const float *)col, cols);
    }
    return 0;
}

static void igrad_tasks(void *ctx, int64_t lo, int64_t hi) {
    igrad_job *j = ctx;
    const conv_geom *g = &j->g;
    int64_t Kc = g->C / g->G * g->KH * g->KW;
    char *col = buf_alloc(Kc, j->t.tile, j->es);
    nbi_gemm_ws ws = {0};
    if (!col) atomic_store(&j->failed, 1);
    for (int64_t t = lo; t < hi && !atomic_load(&j->failed); t++)
        if (igrad_image(j, &ws, t / g->G, t % g->G, col)) atomic_store(&j->failed, 1);
    nbi_gemm_ws_free(&ws);
    free(col);
}

/* -------------------------------------------------------- weight grad */
typedef struct {
    conv_geom g;
    bool f64, bf16;
    size_t es;
    const char *x, *gy;
    int64_t xs[4], gs0, gs1, gflat;
    char *gw; /* contiguous (O, Cg, KH, KW) */
    int64_t ochunk, ochunks, kchunk, kchunks;
    int64_t tile; /* pixels per tile */
    _Atomic int failed;
} wgrad_job;

/* gW[g] rows [o0, o1), columns [k0, k1): the sum over images and tiles in
 * order, each tile's product added to the running one. */
static int wgrad_block(const wgrad_job *j, nbi_gemm_ws *ws, int64_t grp, int64_t o0, int64_t o1,
                       int64_t k0, int64_t k1, char *col, char *tmp) {
    const conv_geom *g = &j->g;
    int64_t Cg = g->C / g->G, Og = g->O / g->G, Kc = Cg * g->KH * g->KW, ohw = g->OH * g->OW;
    int64_t rows = o1 - o0, kr = k1 - k0;
    char *acc = j->gw + (size_t)((grp * Og + o0) * Kc + k0) * j->es;
    bool first = true;
    for (int64_t n = 0; n < g->N; n++) {
        const char *xn = j->x + (size_t)(n * j->xs[0] + grp * Cg * j->xs[1]) * j->es;
        const char *gn = j->gy + (size_t)(n * j->gs0 + (grp * Og + o0) * j->gs1) * j->es;
        for (int64_t p0 = 0; p0 < ohw; p0 += j->tile) {
            int64_t p1 = p0 + j->tile < ohw ? p0 + j->tile : ohw, cols = p1 - p0;
            im2col(j->f64, g, xn, j->xs + 1, k0, k1, p0, p1, col, cols);
            /* (rows, kr) = G (rows, cols) col^T (cols, kr) */
            char *c = first ? acc : tmp;
            int64_t ldc = first ? Kc : kr;
            if (gemm(ws, j->f64, j->bf16, rows, kr, cols, gn + (size_t)(p0 * j->gflat) * j->es,
                     j->gs1, j->gflat, col, 1, cols, c, ldc, 1))
                return -1;
            if (!first) {
                for (int64_t o = 0; o < rows; o++) {
                    if (j->f64) {
                        double *d = (double *)acc + o * Kc;
                        const double *s = (const double *)tmp + o * kr;
                        for (int64_t q = 0; q < kr; q++) d[q] += s[q];
                    } else {
                        float *d = (float *)acc + o * Kc;
                        const float *s = (const float *)tmp + o * kr;
                        for (int64_t q = 0; q < kr; q++) d[q] += s[q];
                    }
                }
            }
            first = false;
        }
    }
    if (first) /* no pixels: zeros */
        for (int64_t o = 0; o < rows; o++)
            memset(acc + (size_t)(o * Kc) * j->es, 0, (size_t)kr * j->es);
    return 0;
}

static void wgrad_tasks(void *ctx, int64_t lo, int64_t hi) {
    wgrad_job *j = ctx;
    const conv_geom *g = &j->g;
    int64_t Og = g->O / g->G, Kc = g->C / g->G * g->KH * g->KW;
    char *col = buf_alloc(j->kchunk, j->tile, j->es);
    char *tmp = buf_alloc(j->ochunk, j->kchunk, j->es);
    nbi_gemm_ws ws = {0};
    if (!col || !tmp) atomic_store(&j->failed, 1);
    for (int64_t t = lo; t < hi && !atomic_load(&j->failed); t++) {
        int64_t kc = t % j->kchunks, oc = t / j->kchunks % j->ochunks;
        int64_t grp = t / j->kchunks / j->ochunks;
        int64_t o0 = oc * j->ochunk, k0 = kc * j->kchunk;
        int64_t o1 = o0 + j->ochunk < Og ? o0 + j->ochunk : Og;
        int64_t k1 = k0 + j->kchunk < Kc ? k0 + j->kchunk : Kc;
        if (wgrad_block(j, &ws, grp, o0, o1, k0, k1, col, tmp)) atomic_store(&j->failed, 1);
    }
    nbi_gemm_ws_free(&ws);
    free(col);
    free(tmp);
}

/* --------------------------------------------------------- bias grad */
/* gb[o] = the sum of gy[n, o, :, :] over n and the pixels, accumulated in
 * double in 8 chains (pixel q into chain q % 8, image after image) that are
 * added in order at the end: what nb_sum_dims computes up to the rounding
 * of its one chain, but not latency-bound (nb_sum_dims was ~1.2 ms of the
 * Fashion step). Threads split o, so any thread count gives the same bits.
 * Used when gy needs no gradient (else the recorded nb_sum_dims). */
typedef struct {
    bool f64;
    const char *gy;
    int64_t N, O, P, s0, s1, sp; /* gy's image, channel and (flat) pixel strides */
    char *gb;
} bgrad_job;

#define DEFINE_BGRAD(T)                                                                   \
    static double bgrad_sum_##T(const bgrad_job *j, int64_t o) {                          \
        double acc[8] = {0};                                                              \
        for (int64_t n = 0; n < j->N; n++) {                                              \
            const T *r = (const T *)j->gy + n * j->s0 + o * j->s1;                        \
            int64_t q = 0;                                                                \
            if (j->sp == 1)                                                               \
                for (; q + 8 <= j->P; q += 8)                                             \
                    for (int l = 0; l < 8; l++) acc[l] += (double)r[q + l];               \
            for (; q < j->P; q++) acc[q % 8] += (double)r[q * j->sp];                     \
        }                                                                                 \
        double v = 0;                                                                     \
        for (int l = 0; l < 8; l++) v += acc[l];                                          \
        return v;                                                                         \
    }
DEFINE_BGRAD(float)
DEFINE_BGRAD(double)

#ifdef CONV_AVX512
/* bgrad_sum_float with the 8 chains as the lanes of one register: the same
 * additions in the same order (gcc keeps the scalar loop scalar: 1 ms of the
 * Fashion step). */
static C512 double bgrad_sum_f32_avx512(const bgrad_job *j, int64_t o) {
    __m512d acc = _mm512_setzero_pd();
    double tail[8] = {0};
    for (int64_t n = 0; n < j->N; n++) {
        const float *r = (const float *)j->gy + n * j->s0 + o * j->s1;
        int64_t q = 0;
        for (; q + 8 <= j->P; q += 8) acc = _mm512_add_pd(acc, _mm512_cvtps_pd(_mm256_loadu_ps(r + q)));
        if (q < j->P) { /* pixels q.. go to chains 0.. as in the scalar loop, since 8 | q */
            _mm512_storeu_pd(tail, acc);
            for (; q < j->P; q++) tail[q % 8] += (double)r[q];
            acc = _mm512_loadu_pd(tail);
        }
    }
    _mm512_storeu_pd(tail, acc);
    double v = 0;
    for (int l = 0; l < 8; l++) v += tail[l];
    return v;
}
#endif

static void bgrad_tasks(void *ctx, int64_t lo, int64_t hi) {
    const bgrad_job *j = ctx;
    for (int64_t o = lo; o < hi; o++) {
        if (j->f64) ((double *)j->gb)[o] = bgrad_sum_double(j, o);
#ifdef CONV_AVX512
        else if (j->sp == 1 && use_avx512()) ((float *)j->gb)[o] = (float)bgrad_sum_f32_avx512(j, o);
#endif
        else ((float *)j->gb)[o] = (float)bgrad_sum_float(j, o);
    }
}

/* gy (N,O,OH,OW) -> gb (O) */
static nb_tensor *conv_bias_grad(nb_tensor *gy) {
    static const char *fn = "conv_bias_grad";
    if (nbi_needs_grad(1, &gy)) return nb_sum_dims(gy, 3, (const int[]){0, 2, 3}, false);
    nb_tensor *gcopy;
    nb_tensor *gf = flat_from(fn, gy, 2, &gcopy);
    nb_tensor *gb = gf ? nbi_new(fn, gy->dtype, 1, &gy->shape[1], false) : NULL;
    if (gb) {
        bgrad_job j = {.f64 = gy->dtype == NB_F64, .gy = nbi_ptr(gf), .N = gy->shape[0],
                       .O = gy->shape[1], .P = gy->shape[2] * gy->shape[3],
                       .s0 = gf->strides[0], .s1 = gf->strides[1], .sp = flat_stride(gf, 2),
                       .gb = nbi_ptr(gb)};
        nbi_parallel_for(j.O, NBI_GRAIN / (j.N * j.P + 1) + 1, bgrad_tasks, &j);
    }
    if (gcopy) nbi_discard(gcopy);
    return gb;
}

/* ------------------------------------------------------ recorded ops */
static int conv_backward(nbi_node *n, nb_tensor *gy, nb_tensor **gin) {
    conv_geom g = geom_get(n);
    nb_tensor *x = nbi_saved_in(n, 0), *w = nbi_saved_in(n, 1);
    if (!x || !w) return -1;
    if (nbi_wants(n, 0) && !(gin[0] = conv_input_grad(gy, w, &g))) return -1;
    if (nbi_wants(n, 1) && !(gin[1] = conv_weight_grad(x, gy, &g))) return -1;
    if (n->nin > 2 && nbi_wants(n, 2) &&
        !(gin[2] = conv_bias_grad(gy)))
        return -1;
    return 0;
}

/* d conv(x, w, b) = conv(dx, w) + conv(x, dw) + db */
static nb_tensor *conv_jvp(nbi_node *n, nb_tensor *const *tin) {
    conv_geom g = geom_get(n);
    nb_tensor *x = nbi_saved_in(n, 0), *w = nbi_saved_in(n, 1);
    if (!x || !w) return NULL;
    nb_tensor *r = tin[0] ? conv_fwd(n->op, tin[0], w, NULL, &g) : NULL;
    if (tin[0] && !r) return NULL;
    if (tin[1]) {
        nb_tensor *q = conv_fwd(n->op, x, tin[1], NULL, &g);
        if (!q || !(r = r ? nb_add(r, q) : q)) return NULL;
    }
    if (n->nin > 2 && tin[2]) {
        nb_tensor *db = nb_reshape(tin[2], 4, (const int64_t[]){1, g.O, 1, 1});
        r = nb_add(r ? r : nbi_zero_tangent(n), db);
    }
    return r ? r : nbi_zero_tangent(n);
}

/* u = T(gy, w) (conv_input_grad): du/dgy . v = conv(v, w); du/dw . v = W(v, gy) */
static int igrad_backward(nbi_node *n, nb_tensor *v, nb_tensor **gin) {
    conv_geom g = geom_get(n);
    nb_tensor *gy = nbi_saved_in(n, 0), *w = nbi_saved_in(n, 1);
    if (!gy || !w) return -1;
    if (nbi_wants(n, 0) && !(gin[0] = conv_fwd(n->op, v, w, NULL, &g))) return -1;
    if (nbi_wants(n, 1) && !(gin[1] = conv_weight_grad(v, gy, &g))) return -1;
    return 0;
}

static nb_tensor *igrad_jvp(nbi_node *n, nb_tensor *const *tin) {
    conv_geom g = geom_get(n);
    nb_tensor *gy = nbi_saved_in(n, 0), *w = nbi_saved_in(n, 1);
    if (!gy || !w) return NULL;
    nb_tensor *r = tin[0] ? conv_input_grad(tin[0], w, &g) : NULL;
    if (tin[0] && !r) return NULL;
    if (tin[1]) {
        nb_tensor *q = conv_input_grad(gy, tin[1], &g);
        if (!q || !(r = r ? nb_add(r, q) : q)) return NULL;
    }
    return r ? r : nbi_zero_tangent(n);
}

/* u = W(x, gy) (conv_weight_grad): du/dx . v = T(gy, v); du/dgy . v = conv(x, v) */
static int wgrad_backward(nbi_node *n, nb_tensor *v, nb_tensor **gin) {
    conv_geom g = geom_get(n);
    nb_tensor *x = nbi_saved_in(n, 0), *gy = nbi_saved_in(n, 1);
    if (!x || !gy) return -1;
    if (nbi_wants(n, 0) && !(gin[0] = conv_input_grad(gy, v, &g))) return -1;
    if (nbi_wants(n, 1) && !(gin[1] = conv_fwd(n->op, x, v, NULL, &g))) return -1;
    return 0;
}

static nb_tensor *wgrad_jvp(nbi_node *n, nb_tensor *const *tin) {
    conv_geom g = geom_get(n);
    nb_tensor *x = nbi_saved_in(n, 0), *gy = nbi_saved_in(n, 1);
    if (!x || !gy) return NULL;
    nb_tensor *r = tin[0] ? conv_weight_grad(tin[0], gy, &g) : NULL;
    if (tin[0] && !r) return NULL;
    if (tin[1]) {
        nb_tensor *q = conv_weight_grad(x, tin[1], &g);
        if (!q || !(r = r ? nb_add(r, q) : q)) return NULL;
    }
    return r ? r : nbi_zero_tangent(n);
}

/* x (N,C,H,W), w (O,C/G,KH,KW), b (O) or NULL -> y (N,O,OH,OW); checked. */
static nb_tensor *conv_fwd(const char *fn, nb_tensor *x, nb_tensor *w, nb_tensor *b,
                           const conv_geom *g) {
    nb_tensor *y = nbi_new(fn, x->dtype, 4, (const int64_t[]){g->N, g->O, g->OH, g->OW}, false);
    if (!y) return NULL;
    if (run_forward(fn, g, x, w, b, y)) return nbi_discard(y);
    nb_tensor *in[3] = {x, w, b};
    int nin = b ? 3 : 2;
    if (nbi_needs_grad(nin, in)) {
        nbi_node *node = nbi_record(y, fn, conv_backward, nin, in);
        if (!node) return nbi_discard(y);
        nbi_save(node, NBI_SAVE_IN(0) | NBI_SAVE_IN(1));
        geom_put(node, g);
        node->jvp = conv_jvp;
    }
    return y;
}

/* gy (N,O,OH,OW), w (O,C/G,KH,KW) -> gx (N,C,H,W) */
static nb_tensor *conv_input_grad(nb_tensor *gy, nb_tensor *w, const conv_geom *g) {
    static const char *fn = "conv_input_grad";
    nb_tensor *gx = nbi_new(fn, gy->dtype, 4, (const int64_t[]){g->N, g->C, g->H, g->W}, false);
    if (!gx) return NULL;
    nbi_wino_geom wg;
    if (wino_geom(g, gy->dtype, &wg)) { /* a conv of gy with w flipped and transposed */
        nbi_wino_geom t = {g->N, g->O, g->OH, g->OW, g->C, g->KH, g->H, g->W,
                           g->KH - 1 - g->ph, g->KW - 1 - g->pw};
        const int64_t *s = w->strides;
        int64_t ts[4] = {s[1], s[0], -s[2], -s[3]};
        const float *wf = (const float *)nbi_ptr(w) + (g->KH - 1) * (s[2] + s[3]);
        if (nbi_wino_fits(&t) &&
            nbi_wino_conv(&t, nbi_ptr(gy), gy->strides, wf, ts, NULL, 0, nbi_ptr(gx)) == 0)
            goto record;
    }
    nb_tensor *gcopy, *wcopy = NULL;
    nb_tensor *gf = flat_from(fn, gy, 2, &gcopy), *wf = gf ? flat_from(fn, w, 1, &wcopy) : NULL;
    int64_t Kc = g->C / g->G * g->KH * g->KW;
    igrad_job j = {.g = *g, .f64 = gy->dtype == NB_F64, .bf16 = autocast_bf16(gy->dtype),
                   .es = nbi_dtype_size(gy->dtype),
                   .gx = nbi_ptr(gx)};
    if (wf) {
        j.gy = nbi_ptr(gf);
        j.w = nbi_ptr(wf);
        j.gs0 = gf->strides[0];
        j.gs1 = gf->strides[1];
        j.gflat = flat_stride(gf, 2);
        j.ws0 = wf->strides[0];
        j.wk = flat_stride(wf, 1);
        j.t = tiles_for(g, Kc, j.es);
        j.t.per = 1;
        double flops = 2.0 * (double)(g->O / g->G) * (double)Kc * (double)(g->OH * g->OW);
        if (gx->numel > 0) nbi_parallel_for(g->N * g->G, grain_for(flops), igrad_tasks, &j);
    }
    if (gcopy) nbi_discard(gcopy);
    if (wcopy) nbi_discard(wcopy);
    if (!wf || atomic_load(&j.failed)) {
        if (wf) nbi_error("%s: out of memory for the column buffers", fn);
        return nbi_discard(gx);
    }
record:;
    nb_tensor *in[2] = {gy, w};
    if (nbi_needs_grad(2, in)) {
        nbi_node *node = nbi_record(gx, fn, igrad_backward, 2, in);
        if (!node) return nbi_discard(gx);
        nbi_save(node, NBI_SAVE_IN(0) | NBI_SAVE_IN(1));
        geom_put(node, g);
        node->jvp = igrad_jvp;
    }
    return gx;
}

/* x (N,C,H,W), gy (N,O,OH,OW) -> gw (O,C/G,KH,KW) */
static nb_tensor *conv_weight_grad(nb_tensor *x, nb_tensor *gy, const conv_geom *g) {
    static const char *fn = "conv_weight_grad";
    int64_t Cg = g->C / g->G, Og = g->O / g->G, Kc = Cg * g->KH * g->KW;
    nb_tensor *gw = nbi_new(fn, x->dtype, 4, (const int64_t[]){g->O, Cg, g->KH, g->KW}, false);
    if (!gw) return NULL;
    nbi_wino_geom wg;
    if (wino_geom(g, x->dtype, &wg) &&
        nbi_wino_weight_grad(&wg, nbi_ptr(x), x->strides, nbi_ptr(gy), gy->strides,
                             nbi_ptr(gw)) == 0)
        goto record;
    nb_tensor *gcopy;
    nb_tensor *gf = flat_from(fn, gy, 2, &gcopy);
    if (!gf) return nbi_discard(gw);
    wgrad_job j = {.g = *g, .f64 = x->dtype == NB_F64, .bf16 = autocast_bf16(x->dtype),
                   .es = nbi_dtype_size(x->dtype),
                   .x = nbi_ptr(x), .gy = nbi_ptr(gf), .gs0 = gf->strides[0],
                   .gs1 = gf->strides[1], .gflat = flat_stride(gf, 2), .gw = nbi_ptr(gw)};
    for (int d = 0; d < 4; d++) j.xs[d] = x->strides[d];
    /* blocks of gW: columns in chunks of >= 64 (the im2col rows a task
     * makes), rows in whole register tiles, enough blocks for the threads */
    const nbi_gemm_blocks bk = nbi_gemm_blocks_of(j.f64);
    int threads = nb_num_threads();
    j.kchunks = Kc / 64 > 0 ? Kc / 64 : 1;
    /* (groups may be near INT64_MAX when there are no channels, and gw is empty) */
    int64_t per_group = g->G > 2 * threads ? 1 : (2 * threads + g->G - 1) / g->G;
    if (j.kchunks > per_group) j.kchunks = per_group;
    j.kchunk = (Kc + j.kchunks - 1) / j.kchunks;
    if (j.kchunk < 1) j.kchunk = 1;
    j.kchunks = (Kc + j.kchunk - 1) / j.kchunk;
    if (j.kchunks < 1) j.kchunks = 1; /* Kc 0 (no input channels): gw is empty */
    j.ochunks = (per_group + j.kchunks - 1) / j.kchunks;
    int64_t max_o = (Og + bk.mr - 1) / bk.mr;
    if (j.ochunks > max_o) j.ochunks = max_o;
    if (j.ochunks < 1) j.ochunks = 1;
    j.ochunk = (Og + j.ochunks - 1) / j.ochunks;
    j.ochunk = (j.ochunk + bk.mr - 1) / bk.mr * bk.mr;
    if (j.ochunk < 1) j.ochunk = 1;
    j.ochunks = Og > 0 ? (Og + j.ochunk - 1) / j.ochunk : 1;
    /* pixel tiles from all of Kc, not from the chunk: the chunks follow the
     * thread count and the tiles cut the sums (at most the chunk's tile, so
     * the column buffer below still holds one) */
    j.tile = tiles_for(g, Kc, j.es).tile;
    if (gw->numel > 0) nbi_parallel_for(g->G * j.ochunks * j.kchunks, 1, wgrad_tasks, &j);
    if (gcopy) nbi_discard(gcopy);
    if (atomic_load(&j.failed)) {
        nbi_error("%s: out of memory for the column buffers", fn);
        return nbi_discard(gw);
    }
record:;
    nb_tensor *in[2] = {x, gy};
    if (nbi_needs_grad(2, in)) {
        nbi_node *node = nbi_record(gw, fn, wgrad_backward, 2, in);
        if (!node) return nbi_discard(gw);
        nbi_save(node, NBI_SAVE_IN(0) | NBI_SAVE_IN(1));
        geom_put(node, g);
        node->jvp = wgrad_jvp;
    }
    return gw;
}

/* ------------------------------------------------------------- public */
/* Checks x (N,C,H,W), w (O,C/G,KH,KW), b and the arguments (2-d form;
 * one_d: conv1d, whose H is 1 and whose messages name no dim) and fills g.
 * same: torch's padding="same" (total pad d (K - 1), the extra one at the
 * end). Every size is computed exactly: a padded input or a dilated kernel
 * past INT64_MAX is refused, naming the argument that made it. What the
 * kernels compute from g then fits int64 too: input rows ih in [-ph, H + ph],
 * columns in [-pw, W + pw], oh * sh <= H + 2 ph - span (and the sizes
 * products of a tensor's shape, which the library keeps below INT64_MAX). */
static bool conv_check(const char *fn, bool one_d, const nb_tensor *x, const nb_tensor *w,
                       const nb_tensor *b, const int64_t *s, const int64_t *p, bool same,
                       const int64_t *d, int64_t groups, conv_geom *g) {
    if (!nbi_check_float(fn, x) || !nbi_check_same_dtype(fn, x, w)) return false;
    if (b && !nbi_check_same_dtype(fn, x, b)) return false;
    if (groups < 1) return nbi_error("%s: groups must be >= 1, got %lld", fn, (long long)groups);
    static const char *const dims[2] = {" for h", " for w"};
    for (int k = one_d; k < 2; k++) {
        const char *dim = one_d ? "" : dims[k];
        if (s[k] < 1)
            return nbi_error("%s: stride must be >= 1, got %lld%s", fn, (long long)s[k], dim);
        if (d[k] < 1)
            return nbi_error("%s: dilation must be >= 1, got %lld%s", fn, (long long)d[k], dim);
        if (!same && p[k] < 0)
            return nbi_error("%s: padding must be >= 0 or NB_PADDING_SAME, got %lld%s", fn,
                             (long long)p[k], dim);
    }
    if (w->shape[2] < 1 || w->shape[3] < 1)
        return nbi_error("%s: kernel size must be >= 1, got weight %s", fn, NBI_SHAPE(w));
    *g = (conv_geom){.N = x->shape[0], .C = x->shape[1], .H = x->shape[2], .W = x->shape[3],
                     .O = w->shape[0], .KH = w->shape[2], .KW = w->shape[3], .sh = s[0],
                     .sw = s[1], .dh = d[0], .dw = d[1], .G = groups};
    if (g->C % groups || g->O % groups)
        return nbi_error("%s: groups %lld must divide in_channels %lld and out_channels %lld", fn,
                         (long long)groups, (long long)g->C, (long long)g->O);
    if (w->shape[1] != g->C / groups) { /* (groups divides C: no product to overflow) */
        int64_t want;
        if (__builtin_mul_overflow(w->shape[1], groups, &want))
            return nbi_error("%s: weight %s expects %lld input channels per group x %lld "
                             "groups, more than int64 can count; input %s has %lld",
                             fn, NBI_SHAPE(w), (long long)w->shape[1], (long long)groups,
                             NBI_SHAPE(x), (long long)g->C);
        return nbi_error("%s: weight %s expects %lld input channels (%lld per group x %lld "
                         "groups), input %s has %lld",
                         fn, NBI_SHAPE(w), (long long)want, (long long)w->shape[1],
                         (long long)groups, NBI_SHAPE(x), (long long)g->C);
    }
    if (b && (b->ndim != 1 || b->shape[0] != g->O))
        return nbi_error("%s: bias must have shape (%lld) (out_channels), got %s", fn,
                         (long long)g->O, NBI_SHAPE(b));
    if (same && (s[0] != 1 || s[1] != 1))
        return nbi_error("%s: padding \"same\" needs stride 1, got stride %lld", fn,
                         (long long)(s[0] != 1 ? s[0] : s[1]));
    int64_t in[2] = {g->H, g->W}, ks[2] = {g->KH, g->KW}, out[2], lead[2];
    for (int k = 0; k < 2; k++) {
        const char *dim = one_d ? "" : dims[k];
        int64_t span, total, padded; /* d (K - 1) + 1, the pad on both sides, in + total */
        if (__builtin_mul_overflow(d[k], ks[k] - 1, &span) ||
            __builtin_add_overflow(span, 1, &span))
            return nbi_error("%s: dilation %lld%s makes the dilated kernel size overflow int64 "
                             "(kernel size %lld)",
                             fn, (long long)d[k], dim, (long long)ks[k]);
        if (same) {
            total = span - 1;
            if (__builtin_add_overflow(in[k], total, &padded))
                return nbi_error("%s: padding \"same\"%s with dilated kernel size %lld makes the "
                                 "padded input size overflow int64 (input size %lld)",
                                 fn, dim, (long long)span, (long long)in[k]);
        } else if (__builtin_mul_overflow(p[k], 2, &total) ||
                   __builtin_add_overflow(in[k], total, &padded)) {
            return nbi_error("%s: padding %lld%s makes the padded input size overflow int64 "
                             "(input size %lld)",
                             fn, (long long)p[k], dim, (long long)in[k]);
        }
        lead[k] = same ? total / 2 : p[k];
        if (padded < span && same)
            return nbi_error("%s: kernel size %lld (dilated %lld) is larger than the padded "
                             "input size %lld%s (input size %lld, padding \"same\", dilation "
                             "%lld)",
                             fn, (long long)ks[k], (long long)span, (long long)padded, dim,
                             (long long)in[k], (long long)d[k]);
        if (padded < span)
            return nbi_error("%s: kernel size %lld (dilated %lld) is larger than the padded "
                             "input size %lld%s (input size %lld, padding %lld, dilation %lld)",
                             fn, (long long)ks[k], (long long)span, (long long)padded, dim,
                             (long long)in[k], (long long)p[k], (long long)d[k]);
        out[k] = (padded - span) / s[k] + 1;
    }
    g->OH = out[0];
    g->OW = out[1];
    g->ph = lead[0];
    g->pw = lead[1];
    return true;
}

/* The shared path of conv1d and conv2d: x, w already in the 2-d form
 * (batched), checked ranks. */
static nb_tensor *conv_common(const char *fn, bool one_d, nb_tensor *x, nb_tensor *w,
                              nb_tensor *b, const int64_t *s, const int64_t *p, bool same,
                              const int64_t *d, int64_t groups) {
    conv_geom g;
    if (!conv_check(fn, one_d, x, w, b, s, p, same, d, groups, &g)) return NULL;
    return conv_fwd(fn, x, w, b, &g);
}

nb_tensor *nb_conv2d(nb_tensor *input, nb_tensor *weight, nb_tensor *bias,
                     const int64_t stride[2], const int64_t padding[2], const int64_t dilation[2],
                     int64_t groups) {
    static const char *fn = "nb_conv2d";
    if (!nbi_arg(fn, input, 0) || !nbi_arg(fn, weight, 1) || (bias && !nbi_arg(fn, bias, 2)))
        return NULL;
    if (input->ndim != 3 && input->ndim != 4)
        return nbi_error("%s: input must be (N, C, H, W) or (C, H, W), got shape %s", fn,
                         NBI_SHAPE(input));
    if (weight->ndim != 4)
        return nbi_error("%s: weight must be (out_channels, in_channels/groups, kH, kW), got "
                         "shape %s", fn, NBI_SHAPE(weight));
    const int64_t one[2] = {1, 1}, zero[2] = {0, 0};
    /* "same" is one setting for both dims (torch's padding="same"), given in
     * padding[0]; padding[1] is then not read */
    bool same = padding && padding[0] == NB_PADDING_SAME;
    if (padding && !same && padding[1] == NB_PADDING_SAME)
        return nbi_error("%s: padding[1] is NB_PADDING_SAME but padding[0] is %lld: \"same\" "
                         "pads both dims and is set by padding[0] alone",
                         fn, (long long)padding[0]);
    const int64_t *s = stride ? stride : one, *p = padding && !same ? padding : zero;
    const int64_t *d = dilation ? dilation : one;
    if (input->ndim == 4)
        return conv_common(fn, false, input, weight, bias, s, p, same, d, groups);
    nb_tensor *y =
        conv_common(fn, false, nb_unsqueeze(input, 0), weight, bias, s, p, same, d, groups);
    return y ? nb_squeeze(y, 0) : NULL;
}

nb_tensor *nb_conv1d(nb_tensor *input, nb_tensor *weight, nb_tensor *bias, int64_t stride,
                     int64_t padding, int64_t dilation, int64_t groups) {
    static const char *fn = "nb_conv1d";
    if (!nbi_arg(fn, input, 0) || !nbi_arg(fn, weight, 1) || (bias && !nbi_arg(fn, bias, 2)))
        return NULL;
    if (input->ndim != 2 && input->ndim != 3)
        return nbi_error("%s: input must be (N, C, L) or (C, L), got shape %s", fn,
                         NBI_SHAPE(input));
    if (weight->ndim != 3)
        return nbi_error("%s: weight must be (out_channels, in_channels/groups, kL), got shape "
                         "%s", fn, NBI_SHAPE(weight));
    bool same = padding == NB_PADDING_SAME;
    const int64_t s[2] = {1, stride}, p[2] = {0, same ? 0 : padding}, d[2] = {1, dilation};
    bool batched = input->ndim == 3;
    nb_tensor *x = nb_unsqueeze(batched ? input : nb_unsqueeze(input, 0), 2); /* (N,C,1,L) */
    nb_tensor *w = nb_unsqueeze(weight, 2);                                      /* (O,Cg,1,K) */
    if (!x || !w) return NULL;
    nb_tensor *y = conv_common(fn, true, x, w, bias, s, p, same, d, groups);
    if (y) y = nb_squeeze(y, 2);
    return y && !batched ? nb_squeeze(y, 0) : y;
}
