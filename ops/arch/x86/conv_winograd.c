/* conv_winograd.c: f32 stride-1 convolutions with 3x3 and 5x5 kernels by
 * Winograd's minimal filtering, F(2x2, r x r) (Lavin and Gray, "Fast
 * Algorithms for Convolutional Neural Networks", 2015).
 *
 * Each 2x2 block of outputs ("tile") reads an a x a patch of the padded input
 * (a = r + 1). With the interpolation points 0, 1, -1, 2, -2 and infinity
 * (the first a - 1 finite ones, then infinity):
 *   y_tile = AT [ sum over c of U_oc (.) V_tc ] A,  U_oc = G w_oc GT,
 *                                                   V_tc = BT d_tc B
 * where (.) is the elementwise product, so the sum over channels is a GEMM
 * per transform position xi (a*a of them): M[xi] (tiles, O) = V[xi] (tiles,
 * C) U[xi] (C, O). For r = 5 that is 36 multiply-adds per tile and channel
 * pair instead of 100: the Fashion network's second conv does 2.8x fewer.
 * The weight gradient is the same algorithm with the roles turned, F(r x r,
 * 2x2): the gradient's 2x2 tile is the filter, the same input patch the data,
 * and the sum over tiles is the GEMM (K = tiles).
 *
 * Numerics: the transforms add and subtract multiples (up to 5) of
 * neighbouring values, so the rounding error grows with them: on N(0,1) data
 * the result's error is a few times that of the direct sum (docs/numerics.md
 * gives the measured figures; test_conv bounds it). When any result is not
 * finite the caller recomputes the conv directly (im2col): an infinity in x
 * reaches outputs whose direct sums it does not touch here, as NaN (inf -
 * inf), so Winograd never decides a non-finite result.
 *
 * Layout: x is copied once into a zero-padded NHWC buffer so that a vector
 * holds 16 channels of a pixel; the transforms work on those vectors, and
 * the per-xi products run on a register-tiled kernel whose U[xi] (C x O)
 * stays in the L1. Threads split tiles (forward) or transform positions
 * (weight gradient), never a sum: bitwise the same for any thread count.
 * AVX-512 only (elsewhere conv.c's im2col path runs). */
#include "../../conv_internal.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include "../../../tensor/cpu_internal.h"
#include "../../gemm_internal.h"
#include "../../ops_internal.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define WINO 1
#define C512 __attribute__((target("avx512f")))
#endif

static _Atomic int forced = -1; /* nbi_wino_force's setting; -1: the environment's */

bool nbi_wino_enabled(void) {
#ifdef WINO
    static _Atomic int env = -1; /* read once */
    int f = atomic_load_explicit(&forced, memory_order_relaxed);
    if (f >= 0) return f && nbi_isa() >= NBI_ISA_AVX512;
    int v = atomic_load_explicit(&env, memory_order_relaxed);
    if (v < 0) {
        const char *e = getenv("NABLA_WINOGRAD");
        v = nbi_isa() >= NBI_ISA_AVX512 && !(e && e[0] == '0' && !e[1]);
        atomic_store(&env, v);
    }
    return v;
#else
    return false;
#endif
}

int nbi_wino_force(int on) {
    return atomic_exchange(&forced, on < 0 ? -1 : on > 0);
}

bool nbi_wino_fits(const nbi_wino_geom *g) {
    if (g->r != 3 && g->r != 5) return false;
    if (g->ph < 0 || g->pw < 0 || g->ph > g->r - 1 || g->pw > g->r - 1) return false;
    if (g->N <= 0 || g->OH <= 0 || g->OW <= 0) return false;
    /* channels come 16 to a vector: fewer would mostly multiply padding
     * (the Fashion network's first conv, C = 1, runs 8x slower here) */
    if (g->C < 16 || g->O < 16) return false;
    if (g->H <= 0 || g->W <= 0) return false;
    /* The buffers it packs, in elements with room for their bytes and for the
     * rounding of channels and blocks: the padded input and gradient (at most
     * N Hp Wp max(Cp, Op)) and the transformed weights (a^2 Cp Op). Near
     * INT64_MAX (tensors read through stride 0) the product would wrap: then
     * conv.c's im2col path runs, whose buffers are checked. */
    const int64_t lim = INT64_MAX / 256, big = g->C > g->O ? g->C : g->O;
    if (big > lim || g->OH > lim || g->OW > lim) return false;
    int64_t n, hp = g->OH / 2 * 2 + 2 * g->r, wp = g->OW / 2 * 2 + 2 * g->r; /* >= Hp, Wp */
    if (__builtin_mul_overflow(g->N, hp, &n) || __builtin_mul_overflow(n, wp, &n) ||
        __builtin_mul_overflow(n, big + 16, &n) || n > lim)
        return false;
    return !__builtin_mul_overflow((g->r + 1) * (g->r + 1) * (g->C + 16), g->O + 64, &n) &&
           n <= lim;
}

#ifdef WINO
/* The points: p_j for the finite ones, then infinity. */
static const double PTS[5] = {0, 1, -1, 2, -2};

/* Of a transform with a points (the last one infinity): s_k = 1 / prod over
 * the other finite points l of (p_k - p_l), 1 for infinity; and p_k^i, for
 * infinity 1 at i = top (the polynomial's top power) and 0 below. */
static double point_scale(int a, int k) {
    double den = 1;
    for (int l = 0; k < a - 1 && l < a - 1; l++)
        if (l != k) den *= PTS[k] - PTS[l];
    return 1 / den;
}
static double point_pow(int a, int k, int i, int top) {
    if (k == a - 1) return i == top;
    double p = 1;
    for (int e = 0; e < i; e++) p *= PTS[k];
    return p;
}

#define INLINE inline __attribute__((always_inline))

static int64_t up16(int64_t n) { return (n + 15) / 16 * 16; }

/* Work buffers from the tensor buffer cache (tensor/alloc.c): these are
 * megabytes a call, and fresh pages would cost more than the arithmetic. */
typedef struct {
    float *p;
    size_t cap;
} buf;
static float *buf_get(buf *b, int64_t n) {
    return b->p = nbi_buf_alloc((size_t)(n > 0 ? n : 1) * sizeof(float), &b->cap);
}
static void buf_put(buf *b) {
    if (b->p) nbi_buf_free(b->p, b->cap);
    b->p = NULL;
}

/* ------------------------------------------------------------- packing */
/* src (N, C, H, W) with strides ss -> dst (N, Hp, Wp, Cp), zeros around and
 * in the padded channels, src's (0, 0) at (ph, pw). */
typedef struct {
    const float *src;
    int64_t ss[4], C, H, W;
    float *dst;
    int64_t Hp, Wp, Cp, ph, pw;
} pack_job;

/* r[i] = row i of a 16 x 16 block -> r[j] = its column j. */
static C512 INLINE void transpose16(__m512 *r) {
    __m512 t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);     /* per 128-bit lane: a0 b0 a1 b1 */
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]); /* a2 b2 a3 b3 */
    }
    for (int i = 0; i < 16; i += 4) {
        __m512d a = _mm512_castps_pd(t[i]), b = _mm512_castps_pd(t[i + 2]);
        __m512d c = _mm512_castps_pd(t[i + 1]), d = _mm512_castps_pd(t[i + 3]);
        r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));     /* a0 b0 c0 d0 */
        r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)); /* a1 b1 c1 d1 */
        r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(c, d));
        r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(c, d));
    }
    /* r[4 g + k]'s 128-bit lane L: column 4 L + k of rows 4 g .. 4 g + 3 */
    for (int k = 0; k < 4; k++) {
        __m512 u0 = _mm512_shuffle_f32x4(r[k], r[4 + k], 0x44);
        __m512 u1 = _mm512_shuffle_f32x4(r[k], r[4 + k], 0xee);
        __m512 u2 = _mm512_shuffle_f32x4(r[8 + k], r[12 + k], 0x44);
        __m512 u3 = _mm512_shuffle_f32x4(r[8 + k], r[12 + k], 0xee);
        t[k] = _mm512_shuffle_f32x4(u0, u2, 0x88);
        t[4 + k] = _mm512_shuffle_f32x4(u0, u2, 0xdd);
        t[8 + k] = _mm512_shuffle_f32x4(u1, u3, 0x88);
        t[12 + k] = _mm512_shuffle_f32x4(u1, u3, 0xdd);
    }
    for (int i = 0; i < 16; i++) r[i] = t[i];
}

/* Per image: the zero border as memsets; inside, 16 channels x 16 pixels
 * of a row at a time, loaded as channel rows and transposed in registers
 * (channels past C: zeros), or element by element when the pixels are not
 * adjacent in src. */
static C512 void pack_tasks(void *ctx, int64_t lo, int64_t hi) {
    const pack_job *j = ctx;
    int64_t Cp = j->Cp, row = j->Wp * Cp;
    int64_t h1 = j->H < j->Hp - j->ph ? j->H : j->Hp - j->ph;
    int64_t w1 = j->W < j->Wp - j->pw ? j->W : j->Wp - j->pw;
    for (int64_t n = lo; n < hi; n++) {
        float *d = j->dst + n * j->Hp * row;
        memset(d, 0, (size_t)(j->ph * row) * sizeof(float));
        memset(d + (j->ph + h1) * row, 0, (size_t)((j->Hp - j->ph - h1) * row) * sizeof(float));
        for (int64_t h = 0; h < h1; h++) {
            float *r = d + (h + j->ph) * row;
            memset(r, 0, (size_t)(j->pw * Cp) * sizeof(float));
            memset(r + (j->pw + w1) * Cp, 0, (size_t)((j->Wp - j->pw - w1) * Cp) * sizeof(float));
            const float *s = j->src + n * j->ss[0] + h * j->ss[2];
            if (j->ss[3] != 1) {
                for (int64_t w = 0; w < w1; w++)
                    for (int64_t c = 0; c < Cp; c++)
                        r[(j->pw + w) * Cp + c] = c < j->C ? s[w * j->ss[3] + c * j->ss[1]] : 0;
                continue;
            }
            for (int64_t w0 = 0; w0 < w1; w0 += 16) {
                int64_t nw = w1 - w0 < 16 ? w1 - w0 : 16;
                __mmask16 m = (__mmask16)((1u << nw) - 1);
                for (int64_t c0 = 0; c0 < Cp; c0 += 16) {
                    __m512 v[16];
                    for (int i = 0; i < 16; i++)
                        v[i] = c0 + i < j->C ? _mm512_maskz_loadu_ps(m, s + (c0 + i) * j->ss[1] + w0)
                                             : _mm512_setzero_ps();
                    transpose16(v);
                    for (int64_t q = 0; q < nw; q++)
                        _mm512_storeu_ps(r + (j->pw + w0 + q) * Cp + c0, v[q]);
                }
            }
        }
    }
}

static float *pack_nhwc(buf *b, const float *src, const int64_t ss[4], int64_t N, int64_t C,
                        int64_t H, int64_t W, int64_t Hp, int64_t Wp, int64_t Cp, int64_t ph,
                        int64_t pw) {
    float *dst = buf_get(b, N * Hp * Wp * Cp);
    if (!dst) return NULL;
    pack_job j = {.src = src, .C = C, .H = H, .W = W, .dst = dst, .Hp = Hp, .Wp = Wp, .Cp = Cp,
                  .ph = ph, .pw = pw};
    memcpy(j.ss, ss, sizeof j.ss);
    nbi_parallel_for(N, 1, pack_tasks, &j);
    return dst;
}

/* ---------------------------------------------------------- transforms */
/* BT applied to a column of a vectors (16 channels each), in place:
 * a = 4 (points 0, 1, -1, inf) or 6 (0, 1, -1, 2, -2, inf). */
static C512 inline void bt4(__m512 *d) {
    __m512 d0 = d[0], d1 = d[1], d2 = d[2], d3 = d[3];
    d[0] = _mm512_sub_ps(d2, d0);
    d[1] = _mm512_add_ps(d1, d2);
    d[2] = _mm512_sub_ps(d2, d1);
    d[3] = _mm512_sub_ps(d3, d1);
}

static C512 inline void bt6(__m512 *d) {
    const __m512 two = _mm512_set1_ps(2), four = _mm512_set1_ps(4), five = _mm512_set1_ps(5);
    __m512 d0 = d[0], d1 = d[1], d2 = d[2], d3 = d[3], d4 = d[4], d5 = d[5];
    __m512 s4 = _mm512_fnmadd_ps(four, d2, d4); /* d4 - 4 d2 */
    __m512 s2 = _mm512_sub_ps(d4, d2);
    __m512 t1 = _mm512_fnmadd_ps(four, d1, d3); /* d3 - 4 d1 */
    __m512 t2 = _mm512_mul_ps(two, _mm512_sub_ps(d3, d1));
    d[0] = _mm512_add_ps(_mm512_fnmadd_ps(five, d2, _mm512_mul_ps(four, d0)), d4);
    d[1] = _mm512_add_ps(s4, t1);
    d[2] = _mm512_sub_ps(s4, t1);
    d[3] = _mm512_add_ps(s2, t2);
    d[4] = _mm512_sub_ps(s2, t2);
    d[5] = _mm512_add_ps(_mm512_fnmadd_ps(five, d3, _mm512_mul_ps(four, d1)), d5);
}

/* V = BT d B of the a x a patch at src (rows rs apart, pixels cs apart, 16
 * channels each), written to dst + xi * ds for xi = k a + l. */
static C512 INLINE void in_transform(int a, const float *src, int64_t rs, int64_t cs, float *dst,
                              int64_t ds) {
    __m512 d[6][6], col[6];
    for (int i = 0; i < a; i++)
        for (int j = 0; j < a; j++) d[i][j] = _mm512_loadu_ps(src + i * rs + j * cs);
    for (int j = 0; j < a; j++) { /* columns: BT d */
        for (int i = 0; i < a; i++) col[i] = d[i][j];
        if (a == 6) bt6(col);
        else bt4(col);
        for (int i = 0; i < a; i++) d[i][j] = col[i];
    }
    for (int k = 0; k < a; k++) { /* rows: (BT d) B */
        if (a == 6) bt6(d[k]);
        else bt4(d[k]);
        for (int l = 0; l < a; l++) _mm512_storeu_ps(dst + (k * a + l) * ds, d[k][l]);
    }
}

/* AT (2 x a) applied to a column: AT[0] = (1 .. 1, 0), AT[1] = (p_j .., 1). */
static C512 inline void at2(int a, const __m512 *m, __m512 *y0, __m512 *y1) {
    __m512 s = _mm512_add_ps(_mm512_add_ps(m[0], m[1]), m[2]);
    __m512 t = _mm512_sub_ps(m[1], m[2]);
    if (a == 6) {
        const __m512 two = _mm512_set1_ps(2);
        s = _mm512_add_ps(s, _mm512_add_ps(m[3], m[4]));
        t = _mm512_fmadd_ps(two, _mm512_sub_ps(m[3], m[4]), t);
    }
    *y0 = s;
    *y1 = _mm512_add_ps(t, m[a - 1]);
}

/* ------------------------------------------------------- the products */
/* m (MR, 16 NV) = v (MR, K) u (K, 16 NV), or m += it when add: v's element
 * (i, k) at v[i vi + k vk], rows of u ldu apart, of m ldm. Each element is
 * one chain of FMAs over k in order, from zero or from m's value, so the
 * weight gradient's sum over all tiles is the same chain however its tiles
 * come in chunks. */
#define DEFINE_KERNEL(NV, MR)                                                             \
    static C512 void kernel_##NV(const float *v, int64_t vi, int64_t vk, const float *u,  \
                                 int64_t ldu, float *m, int64_t ldm, int64_t K, bool add) { \
        __m512 acc[MR][NV];                                                               \
        for (int i = 0; i < MR; i++)                                                      \
            for (int q = 0; q < NV; q++)                                                  \
                acc[i][q] = add ? _mm512_loadu_ps(m + i * ldm + 16 * q) : _mm512_setzero_ps(); \
        for (int64_t k = 0; k < K; k++) {                                                 \
            __m512 b[NV];                                                                 \
            for (int q = 0; q < NV; q++) b[q] = _mm512_loadu_ps(u + k * ldu + 16 * q);    \
            for (int i = 0; i < MR; i++) {                                                \
                __m512 s = _mm512_set1_ps(v[i * vi + k * vk]);                            \
                for (int q = 0; q < NV; q++) acc[i][q] = _mm512_fmadd_ps(s, b[q], acc[i][q]); \
            }                                                                             \
        }                                                                                 \
        for (int i = 0; i < MR; i++)                                                      \
            for (int q = 0; q < NV; q++) _mm512_storeu_ps(m + i * ldm + 16 * q, acc[i][q]); \
    }
DEFINE_KERNEL(4, 6)
DEFINE_KERNEL(2, 12)
DEFINE_KERNEL(1, 12)
#define ROWS 12 /* rows come in multiples of every kernel's MR */

/* m (R, Np) (+)= v (R, K) u (K, Np): v's (i, k) at v[i vi + k vk], rows of
 * u ldu apart, of m ldm; R a multiple of ROWS, Np of 16. */
static C512 void product(const float *v, int64_t vi, int64_t vk, const float *u, int64_t ldu,
                         float *m, int64_t ldm, int64_t R, int64_t K, int64_t Np, bool add) {
    for (int64_t o = 0; o < Np;) {
        if (Np - o >= 64) {
            for (int64_t i = 0; i < R; i += 6)
                kernel_4(v + i * vi, vi, vk, u + o, ldu, m + i * ldm + o, ldm, K, add);
            o += 64;
        } else if (Np - o >= 32) {
            for (int64_t i = 0; i < R; i += 12)
                kernel_2(v + i * vi, vi, vk, u + o, ldu, m + i * ldm + o, ldm, K, add);
            o += 32;
        } else {
            for (int64_t i = 0; i < R; i += 12)
                kernel_1(v + i * vi, vi, vk, u + o, ldu, m + i * ldm + o, ldm, K, add);
            o += 16;
        }
    }
}

/* --------------------------------------------------------------- tiles */
/* A conv's tiles: a = r + 1 points; TH x TW tiles an image, T in all; the
 * padded input Hp x Wp that they read; channels rounded up to 16. Both jobs
 * below hold these fields by name (an anonymous union member). */
#define TILE_FIELDS \
    int a;          \
    int64_t TH, TW, T, Hp, Wp, Cp, Op
typedef struct {
    TILE_FIELDS;
} tiles;
#define TILES_MEMBER   \
    union {            \
        tiles tl;      \
        struct {       \
            TILE_FIELDS; \
        };             \
    }

static tiles tiles_of(const nbi_wino_geom *g) {
    tiles t = {.a = (int)g->r + 1, .TH = (g->OH + 1) / 2, .TW = (g->OW + 1) / 2};
    t.T = g->N * t.TH * t.TW;
    t.Hp = 2 * t.TH + g->r - 1;
    t.Wp = 2 * t.TW + g->r - 1;
    t.Cp = up16(g->C);
    t.Op = up16(g->O);
    return t;
}

/* ------------------------------------------------------------- forward */
typedef struct {
    nbi_wino_geom g;
    TILES_MEMBER;
    int64_t TB;
    const float *xp, *u, *b;
    int64_t bs;
    float *y;
    _Atomic int bad; /* a result not finite, or no work buffer */
} fwd_job;

/* U[xi] (Cp, Op) = G w_oc GT for every (o, c) of w, in double, rounded once. */
typedef struct {
    const nbi_wino_geom *g;
    int a;
    const float *w;
    const int64_t *ws;
    float *u;
    int64_t Cp, Op;
} wt_job;

static void weight_tasks(void *ctx, int64_t lo, int64_t hi) {
    const wt_job *j = ctx;
    int a = j->a, r = (int)j->g->r;
    double G[6][5]; /* G[k][i] = s_k p_k^i */
    for (int k = 0; k < a; k++)
        for (int i = 0; i < r; i++) G[k][i] = point_scale(a, k) * point_pow(a, k, i, r - 1);
    for (int64_t o = lo; o < hi; o++)
        for (int64_t c = 0; c < j->g->C; c++) {
            double t[6][5];
            const float *wo = j->w + o * j->ws[0] + c * j->ws[1];
            for (int k = 0; k < a; k++)
                for (int q = 0; q < r; q++) {
                    double s = 0;
                    for (int i = 0; i < r; i++) s += G[k][i] * (double)wo[i * j->ws[2] + q * j->ws[3]];
                    t[k][q] = s;
                }
            for (int k = 0; k < a; k++)
                for (int l = 0; l < a; l++) {
                    double s = 0;
                    for (int q = 0; q < r; q++) s += t[k][q] * G[l][q];
                    j->u[((int64_t)(k * a + l) * j->Cp + c) * j->Op + o] = (float)s;
                }
        }
}

/* Output transform of tile t's M vectors (16 channels at o) into y. */
static C512 INLINE __mmask16 out_tile(const fwd_job *j, int a, const float *m, int64_t ds,
                                      int64_t t, int64_t o) {
    const nbi_wino_geom *g = &j->g;
    int64_t n = t / (j->TH * j->TW), ty = t / j->TW % j->TH, tx = t % j->TW;
    __m512 col[6], r0[6], r1[6];
    for (int l = 0; l < a; l++) {
        for (int k = 0; k < a; k++) col[k] = _mm512_loadu_ps(m + (k * a + l) * ds);
        at2(a, col, &r0[l], &r1[l]);
    }
    __mmask16 lanes = o + 16 <= g->O ? 0xffff : (__mmask16)((1u << (g->O - o)) - 1);
    __m512 bias = _mm512_setzero_ps();
    if (j->b) {
        float bv[16] = {0};
        for (int q = 0; q < 16 && o + q < g->O; q++) bv[q] = j->b[(o + q) * j->bs];
        bias = _mm512_loadu_ps(bv);
    }
    int64_t ohw = g->OH * g->OW;
    int nl = o + 16 <= g->O ? 16 : (int)(g->O - o);
    float *yb = j->y + (n * g->O + o) * ohw;
    __mmask16 bad = 0;
    for (int i = 0; i < 2; i++) {
        __m512 y0, y1;
        at2(a, i ? r1 : r0, &y0, &y1);
        int64_t oy = 2 * ty + i;
        if (oy >= g->OH) break;
        for (int jx = 0; jx < 2; jx++) {
            int64_t ox = 2 * tx + jx;
            if (ox >= g->OW) break;
            __m512 v = _mm512_add_ps(jx ? y1 : y0, bias);
            bad |= _mm512_mask_cmp_ps_mask(lanes, _mm512_sub_ps(v, v), _mm512_setzero_ps(),
                                           _CMP_NEQ_UQ);
            /* 16 scalar stores: a scatter is microcoded and slower here */
            float lane[16];
            _mm512_storeu_ps(lane, v);
            float *dst = yb + oy * g->OW + ox;
            for (int q = 0; q < nl; q++) dst[q * ohw] = lane[q];
        }
    }
    return bad;
}

static C512 void fwd_tasks(void *ctx, int64_t lo, int64_t hi) {
    fwd_job *j = ctx;
    int a = j->a, aa = a * a;
    int64_t TB = j->TB, Cp = j->Cp, Op = j->Op;
    /* tile-major: a tile's a a transformed vectors are adjacent, so a
     * transform writes one contiguous run (scattered over a a matrices it
     * was a store to a different L2 line each) */
    int64_t vr = aa * Cp, mr = aa * Op;
    buf vb = {0}, mb = {0};
    float *v = buf_get(&vb, TB * vr), *m = buf_get(&mb, TB * mr);
    if (!v || !m) atomic_store(&j->bad, 1);
    for (int64_t blk = lo; blk < hi && !atomic_load(&j->bad); blk++) {
        int64_t t0 = blk * TB, t1 = t0 + TB < j->T ? t0 + TB : j->T;
        for (int64_t t = t0; t < t0 + TB; t++) {
            float *dst = v + (t - t0) * vr;
            if (t >= t1) { /* rows past the last tile: zeros, their results unused */
                memset(dst, 0, (size_t)vr * sizeof(float));
                continue;
            }
            int64_t n = t / (j->TH * j->TW), ty = t / j->TW % j->TH, tx = t % j->TW;
            const float *src = j->xp + ((n * j->Hp + 2 * ty) * j->Wp + 2 * tx) * Cp;
            for (int64_t c = 0; c < Cp; c += 16) {
                if (a == 6) in_transform(6, src + c, j->Wp * Cp, Cp, dst + c, Cp);
                else in_transform(4, src + c, j->Wp * Cp, Cp, dst + c, Cp);
            }
        }
        /* M[xi] (TB, Op) = V[xi] (TB, Cp) U[xi] (Cp, Op) */
        for (int xi = 0; xi < aa; xi++)
            product(v + xi * Cp, vr, 1, j->u + xi * Cp * Op, Op, m + xi * Op, mr, TB, Cp, Op,
                    false);
        __mmask16 bad = 0;
        for (int64_t t = t0; t < t1; t++)
            for (int64_t o = 0; o < j->g.O; o += 16)
                bad |= a == 6 ? out_tile(j, 6, m + (t - t0) * mr + o, Op, t, o)
                              : out_tile(j, 4, m + (t - t0) * mr + o, Op, t, o);
        if (bad) atomic_store(&j->bad, 1);
    }
    buf_put(&vb);
    buf_put(&mb);
}

/* Tiles per block: the block's V and M in the L2, a multiple of ROWS. */
static int64_t block_tiles(int a, int64_t Cp, int64_t Op) {
    const nbi_cpu *cpu = nbi_cpu_info();
    int64_t l2 = cpu && cpu->l2 > 0 ? cpu->l2 : (int64_t)1 << 20;
    int64_t tb = l2 / ((int64_t)a * a * (Cp + Op) * (int64_t)sizeof(float)) / ROWS * ROWS;
    return tb < ROWS ? ROWS : tb > 20 * ROWS ? 20 * ROWS : tb;
}

int nbi_wino_conv(const nbi_wino_geom *g, const float *x, const int64_t xs[4], const float *w,
                  const int64_t ws[4], const float *b, int64_t bs, float *y) {
    if (!nbi_wino_enabled() || !nbi_wino_fits(g)) return 1;
    fwd_job j = {.g = *g, .tl = tiles_of(g), .b = b, .bs = bs, .y = y};
    j.TB = block_tiles(j.a, j.Cp, j.Op);
    int aa = j.a * j.a;
    buf xb = {0}, ub = {0};
    float *xp = pack_nhwc(&xb, x, xs, g->N, g->C, g->H, g->W, j.Hp, j.Wp, j.Cp, g->ph, g->pw);
    float *u = buf_get(&ub, aa * j.Cp * j.Op);
    if (!xp || !u) {
        buf_put(&xb);
        buf_put(&ub);
        return 1;
    }
    memset(u, 0, (size_t)(aa * j.Cp * j.Op) * sizeof(float));
    wt_job wj = {.g = g, .a = j.a, .w = w, .ws = ws, .u = u, .Cp = j.Cp, .Op = j.Op};
    nbi_parallel_for(g->O, 1, weight_tasks, &wj);
    j.xp = xp;
    j.u = u;
    nbi_parallel_for((j.T + j.TB - 1) / j.TB, 1, fwd_tasks, &j);
    buf_put(&xb);
    buf_put(&ub);
    return atomic_load(&j.bad) ? 1 : 0;
}

/* --------------------------------------------------------- weight grad */
/* gW = AT' [sum over tiles of U'_t (.) V'_t] A', F(r x r, 2x2): V'_t the
 * forward's transform of tile t's input patch, U'_t = Gi gy_t GiT of its 2x2
 * gradient tile with Gi's integer rows (1, p_k) (infinity: (0, 1)); the
 * rows' scales s_k (G's 1 / prod (p_k - p_l)) and AT' are applied once, in
 * double, at the end. The sum over tiles is M[xi] (Oq, Cp) += U'[xi]^T V'[xi]
 * for chunks of tiles whose V' and U' stay in the L2. */
typedef struct {
    nbi_wino_geom g;
    TILES_MEMBER;
    int64_t Oq, tc;
    const float *xp, *gp;
    float *acc; /* M: (a a, Oq, Cp) */
    _Atomic int bad;
} wg_job;

/* U' = Gi g GiT of the 2x2 gradient tile at src (rows rs apart, pixels cs
 * apart, 16 channels each) to dst + xi * ds: Gi's rows are (1, p_k), and
 * (0, 1) for infinity. */
static C512 INLINE void gy_transform(int a, const float *src, int64_t rs, int64_t cs, float *dst,
                                     int64_t ds) {
    __m512 g00 = _mm512_loadu_ps(src), g01 = _mm512_loadu_ps(src + cs);
    __m512 g10 = _mm512_loadu_ps(src + rs), g11 = _mm512_loadu_ps(src + rs + cs);
    __m512 c0[6], c1[6]; /* Gi down the columns */
    for (int k = 0; k < a - 1; k++) {
        __m512 p = _mm512_set1_ps((float)PTS[k]);
        c0[k] = _mm512_fmadd_ps(p, g10, g00);
        c1[k] = _mm512_fmadd_ps(p, g11, g01);
    }
    c0[a - 1] = g10;
    c1[a - 1] = g11;
    for (int k = 0; k < a; k++) {
        for (int l = 0; l < a - 1; l++)
            _mm512_storeu_ps(dst + (k * a + l) * ds,
                             _mm512_fmadd_ps(_mm512_set1_ps((float)PTS[l]), c1[k], c0[k]));
        _mm512_storeu_ps(dst + (k * a + a - 1) * ds, c1[k]);
    }
}

/* A task is a range of xi: it transforms every tile, chunk after chunk,
 * and adds its xi's products (so on one thread the transforms run once; on
 * more, each task makes them again rather than wait for the others). */
static C512 void wg_tasks(void *ctx, int64_t lo, int64_t hi) {
    wg_job *j = ctx;
    int a = j->a, aa = a * a;
    int64_t Cp = j->Cp, Op = j->Op, Oq = j->Oq, tc = j->tc;
    int64_t vr = aa * Cp, ur = aa * Oq; /* tile-major, as the forward's */
    buf vb = {0}, ub = {0};
    float *v = buf_get(&vb, tc * vr), *u = buf_get(&ub, tc * ur);
    if (!v || !u) {
        atomic_store(&j->bad, 1);
        buf_put(&vb);
        buf_put(&ub);
        return;
    }
    memset(u, 0, (size_t)(tc * ur) * sizeof(float)); /* columns past Op stay 0 */
    for (int64_t xi = lo; xi < hi; xi++)
        memset(j->acc + xi * Oq * Cp, 0, (size_t)(Oq * Cp) * sizeof(float));
    for (int64_t t0 = 0; t0 < j->T; t0 += tc) {
        int64_t n = j->T - t0 < tc ? j->T - t0 : tc;
        for (int64_t t = t0; t < t0 + n; t++) {
            int64_t img = t / (j->TH * j->TW), ty = t / j->TW % j->TH, tx = t % j->TW;
            const float *src = j->xp + ((img * j->Hp + 2 * ty) * j->Wp + 2 * tx) * Cp;
            float *vd = v + (t - t0) * vr, *ud = u + (t - t0) * ur;
            for (int64_t c = 0; c < Cp; c += 16) {
                if (a == 6) in_transform(6, src + c, j->Wp * Cp, Cp, vd + c, Cp);
                else in_transform(4, src + c, j->Wp * Cp, Cp, vd + c, Cp);
            }
            const float *gt = j->gp + ((img * 2 * j->TH + 2 * ty) * 2 * j->TW + 2 * tx) * Op;
            for (int64_t o = 0; o < Op; o += 16) {
                if (a == 6) gy_transform(6, gt + o, 2 * j->TW * Op, Op, ud + o, Oq);
                else gy_transform(4, gt + o, 2 * j->TW * Op, Op, ud + o, Oq);
            }
        }
        /* M[xi] (Oq, Cp) += U'[xi]^T (Oq, n) V'[xi] (n, Cp) */
        for (int64_t xi = lo; xi < hi; xi++)
            product(u + xi * Oq, 1, ur, v + xi * Cp, vr, j->acc + xi * Oq * Cp, Cp, Oq, n, Cp,
                    true);
    }
    buf_put(&vb);
    buf_put(&ub);
}

typedef struct {
    const nbi_wino_geom *g;
    int a;
    int64_t Cp, Op;
    const float *acc;
    float *gw;
    _Atomic int bad;
} wg_out_job;

/* gw[o][c] = AT' (S M S) A' with S = diag(s): AT' (r x a) rows p_j^i (the
 * infinity column 1 in the last row), in double. */
static void wg_out_tasks(void *ctx, int64_t lo, int64_t hi) {
    wg_out_job *j = ctx;
    int a = j->a, r = (int)j->g->r;
    double s[6], AT[5][6];
    for (int k = 0; k < a; k++) {
        s[k] = point_scale(a, k);
        for (int i = 0; i < r; i++) AT[i][k] = point_pow(a, k, i, r - 1);
    }
    for (int64_t o = lo; o < hi; o++)
        for (int64_t c = 0; c < j->g->C; c++) {
            double m[6][6], t[5][6];
            for (int k = 0; k < a; k++)
                for (int l = 0; l < a; l++)
                    m[k][l] = s[k] * s[l] * (double)j->acc[((int64_t)(k * a + l) * j->Op + o) * j->Cp + c];
            for (int i = 0; i < r; i++)
                for (int l = 0; l < a; l++) {
                    double e = 0;
                    for (int k = 0; k < a; k++) e += AT[i][k] * m[k][l];
                    t[i][l] = e;
                }
            float *dst = j->gw + (o * j->g->C + c) * r * r;
            for (int i = 0; i < r; i++)
                for (int q = 0; q < r; q++) {
                    double e = 0;
                    for (int l = 0; l < a; l++) e += t[i][l] * AT[q][l];
                    float f = (float)e;
                    if (f - f != 0) atomic_store(&j->bad, 1);
                    dst[i * r + q] = f;
                }
        }
}

int nbi_wino_weight_grad(const nbi_wino_geom *g, const float *x, const int64_t xs[4],
                         const float *gy, const int64_t gs[4], float *gw) {
    if (!nbi_wino_enabled() || !nbi_wino_fits(g)) return 1;
    wg_job j = {.g = *g, .tl = tiles_of(g)};
    int a = j.a, aa = a * a;
    j.Oq = (j.Op + ROWS - 1) / ROWS * ROWS;
    const nbi_cpu *cpu = nbi_cpu_info();
    int64_t l2 = cpu && cpu->l2 > 0 ? cpu->l2 : (int64_t)1 << 20;
    j.tc = l2 / 2 / ((int64_t)aa * (j.Cp + j.Oq) * (int64_t)sizeof(float));
    if (j.tc < 8) j.tc = 8;
    buf bufs[3] = {{0}};
    float *xp = pack_nhwc(&bufs[0], x, xs, g->N, g->C, g->H, g->W, j.Hp, j.Wp, j.Cp, g->ph, g->pw);
    float *gp = pack_nhwc(&bufs[1], gy, gs, g->N, g->O, g->OH, g->OW, 2 * j.TH, 2 * j.TW, j.Op, 0,
                          0);
    float *acc = buf_get(&bufs[2], aa * j.Oq * j.Cp);
    int rc = 1;
    if (xp && gp && acc) {
        j.xp = xp;
        j.gp = gp;
        j.acc = acc;
        nbi_parallel_for(aa, 1, wg_tasks, &j);
        if (!atomic_load(&j.bad)) {
            wg_out_job oj = {.g = g, .a = a, .Cp = j.Cp, .Op = j.Oq, .acc = acc, .gw = gw};
            nbi_parallel_for(g->O, 1, wg_out_tasks, &oj);
            rc = atomic_load(&oj.bad) ? 1 : 0;
        }
    }
    for (int i = 0; i < 3; i++) buf_put(&bufs[i]);
    return rc;
}

#else /* no AVX-512 build: conv.c's im2col path runs */
int nbi_wino_conv(const nbi_wino_geom *g, const float *x, const int64_t xs[4], const float *w,
                  const int64_t ws[4], const float *b, int64_t bs, float *y) {
    (void)g, (void)x, (void)xs, (void)w, (void)ws, (void)b, (void)bs, (void)y;
    return 1;
}
int nbi_wino_weight_grad(const nbi_wino_geom *g, const float *x, const int64_t xs[4],
                         const float *gy, const int64_t gs[4], float *gw) {
    (void)g, (void)x, (void)xs, (void)gy, (void)gs, (void)gw;
    return 1;
}
#endif
