/* pool.c: nb_max_pool2d, nb_avg_pool2d and nb_max_pool1d, PyTorch's
 * semantics (dilation 1, ceil_mode false) on (N, C, H, W) / (C, H, W) and,
 * for 1d, (N, C, L) / (C, L) read as planes of height 1.
 *
 * Every op works plane by plane: the N * C planes split across the thread
 * pool, each computed whole by one thread in one fixed order, so results are
 * the same bits for any thread count.
 *
 * Max pooling keeps torch's scan: from -inf, a value replaces the running
 * maximum when it is greater or NaN (so a NaN wins, and the last NaN of a
 * window is the one whose position is kept), starting at the window's first
 * position. The forward saves those positions (i64, h * W + w within the
 * plane); the gradient adds g there in output order (torch's order), as a
 * recorded scatter under create_graph (its backward is a gather), and the
 * tangent is a gather of the input's tangent.
 *
 * Average pooling sums its window row-major in the tensor's type and divides
 * by the window's count (padding included when count_include_pad), as torch's
 * CPU kernel does: bit for bit torch's. Its backward spreads g / count over
 * the window in output order (torch's order too); that spreading is an op of
 * its own here, whose backward is average pooling again, so both
 * differentiate any number of times. */
#include <math.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "index_internal.h"

/* ------------------------------------------------------------- geometry */
/* The arguments, as the node keeps them in n->i (see args_put). */
typedef struct {
    int64_t k[2], s[2], p[2];
    bool cip;   /* count_include_pad (avg) */
    bool one_d; /* nb_max_pool1d: the input has no H */
} pool_args;

/* One operand read plane by plane: planes p = n * C + c start at
 * (p / C) * sn + (p % C) * sc; (H, W) the input's plane, (OH, OW) the
 * output's. */
typedef struct {
    int64_t N, C, H, W, OH, OW;
    int64_t sn, sc, sh, sw; /* strides of the operand read */
} geom;

/* The (n, c, h, w) strides of a tensor of the pool's input or output rank. */
static void plane_strides(const nb_tensor *t, bool one_d, geom *g) {
    int nd = t->ndim, lead = nd - (one_d ? 1 : 2); /* 2: batched, 1: not */
    g->sn = lead == 2 ? t->strides[0] : 0;
    g->sc = t->strides[lead - 1];
    g->sh = one_d ? 0 : t->strides[nd - 2];
    g->sw = t->strides[nd - 1];
}

/* floor((n + 2p - k) / s) + 1, or 0 when the window does not fit; n, k, s >= 1,
 * 0 <= p <= k / 2 (checked) */
static int64_t out_size(int64_t n, int64_t k, int64_t s, int64_t p);

/* g's N, C (from like, of the input's shape), OH, OW (from g->H, g->W and
 * the arguments) and strides (of read, the operand the kernel reads). */
static void fill_geom(geom *g, const nb_tensor *like, const nb_tensor *read,
                      const pool_args *a) {
    int lead = like->ndim - (a->one_d ? 1 : 2);
    g->N = lead == 2 ? like->shape[0] : 1;
    g->C = like->shape[lead - 1];
    g->OH = a->one_d ? 1 : out_size(g->H, a->k[0], a->s[0], a->p[0]);
    g->OW = out_size(g->W, a->k[1], a->s[1], a->p[1]);
    plane_strides(read, a->one_d, g);
}

static int64_t plane_base(const geom *g, int64_t p) {
    return (p / g->C) * g->sn + (p % g->C) * g->sc;
}

/* As n - (k - 2p): 2p <= k, so nothing passes INT64_MAX where n + 2p would
 * (kernel INT64_MAX, padding INT64_MAX / 2), and the size is exact. */
static int64_t out_size(int64_t n, int64_t k, int64_t s, int64_t p) {
    int64_t cut = k - 2 * p;
    return n < cut ? 0 : (n - cut) / s + 1;
}

/* The window of output position o < out_size along one dim: [a, a + k)
 * with a = o s - p, clamped to the input [0, n) as [lo, hi). Without
 * ceil_mode no window passes the padded end (a + k <= n + p), so the size
 * torch's avg divides by with padding counted, min(a + k, n + p) - a, is k.
 * a + k is not formed where it could pass INT64_MAX (n + p can): o s <= n
 * - (k - 2p), so a <= n - k / 2 and a + k > n exactly when k > n - a. */
static void window(int64_t o, int64_t k, int64_t s, int64_t p, int64_t n, int64_t *lo,
                   int64_t *hi) {
    int64_t a = o * s - p;
    *lo = a > 0 ? a : 0;
    if (a < 0) *hi = a + k < n ? a + k : n; /* a + k >= k - p >= 0 */
    else *hi = k < n - a ? a + k : n;
}

/* The divisor of an average, in T: the window's size k0 k1 with padding
 * counted (cip), else its h x w elements inside the input (at most H W,
 * which fits int64); the integer converted once, torch's divisor. k0 k1 may
 * pass INT64_MAX (torch's int64 product wraps there): then the product of
 * the two in double. */
#define AVG_DIV(T)                                                                        \
    static T avg_div_##T(bool cip, int64_t k0, int64_t k1, int64_t h, int64_t w) {        \
        int64_t n;                                                                        \
        if (!cip) return (T)(h * w);                                                      \
        if (__builtin_mul_overflow(k0, k1, &n)) return (T)((double)k0 * (double)k1);      \
        return (T)n;                                                                      \
    }
AVG_DIV(float)
AVG_DIV(double)

static void args_put(nbi_node *n, const pool_args *a, const geom *g) {
    int64_t v[10] = {a->k[0], a->k[1], a->s[0], a->s[1], a->p[0], a->p[1], a->cip, a->one_d,
                     g->H, g->W};
    memcpy(n->i, v, sizeof v);
}

static pool_args args_get(const nbi_node *n, geom *g) {
    const int64_t *v = n->i;
    pool_args a = {{v[0], v[1]}, {v[2], v[3]}, {v[4], v[5]}, v[6] != 0, v[7] != 0};
    g->H = v[8];
    g->W = v[9];
    return a;
}

/* Checks input and arguments (fn's messages) and fills g (input strides). */
static bool pool_check(const char *fn, const nb_tensor *x, const pool_args *a, geom *g) {
    if (!nbi_check_float(fn, x)) return false;
    int want = a->one_d ? 2 : 3;
    if (x->ndim != want && x->ndim != want + 1)
        return a->one_d ? nbi_error("%s: expected a 2-d (C, L) or 3-d (N, C, L) input, got "
                                    "shape %s", fn, NBI_SHAPE(x)) != NULL
                        : nbi_error("%s: expected a 3-d (C, H, W) or 4-d (N, C, H, W) input, "
                                    "got shape %s", fn, NBI_SHAPE(x)) != NULL;
    int nd = x->ndim, d0 = a->one_d ? 1 : 0; /* 1d: only (w) is an argument */
    for (int i = nd - want; i < nd; i++)
        if (x->shape[i] == 0)
            return nbi_error("%s: input %s has an empty dim %d (only the batch may be empty)",
                             fn, NBI_SHAPE(x), i) != NULL;
    int64_t in[2] = {a->one_d ? 1 : x->shape[nd - 2], x->shape[nd - 1]};
    for (int d = d0; d < 2; d++) {
        bool one = a->one_d; /* 2-d messages name the dim: "kernel_size (h)" */
        const char *kn = one ? "kernel_size" : d ? "kernel_size (w)" : "kernel_size (h)";
        if (a->k[d] <= 0)
            return nbi_error("%s: %s must be positive, got %lld", fn, kn, (long long)a->k[d]) != NULL;
        if (a->s[d] <= 0)
            return nbi_error("%s: %s must be positive, got %lld", fn,
                             one ? "stride" : d ? "stride (w)" : "stride (h)",
                             (long long)a->s[d]) != NULL;
        if (a->p[d] < 0 || a->p[d] > a->k[d] / 2)
            return nbi_error("%s: %s must be between 0 and half the kernel size, got padding "
                             "%lld for kernel_size %lld", fn,
                             one ? "padding" : d ? "padding (w)" : "padding (h)",
                             (long long)a->p[d], (long long)a->k[d]) != NULL;
        if (out_size(in[d], a->k[d], a->s[d], a->p[d]) <= 0)
            return nbi_error("%s: input %s is too small for %s %lld with padding %lld (%lld + "
                             "2 * %lld < %lld): the output would be empty", fn, NBI_SHAPE(x), kn,
                             (long long)a->k[d], (long long)a->p[d], (long long)in[d],
                             (long long)a->p[d], (long long)a->k[d]) != NULL;
    }
    g->H = in[0];
    g->W = in[1];
    fill_geom(g, x, x, a);
    return true;
}

/* The output's shape: the input's with (H, W) (or L) replaced. */
static void out_shape(const nb_tensor *x, const pool_args *a, const geom *g, int64_t *sh) {
    memcpy(sh, x->shape, (size_t)x->ndim * sizeof *sh);
    sh[x->ndim - 1] = g->OW;
    if (!a->one_d) sh[x->ndim - 2] = g->OH;
}

/* Planes per range: about NBI_GRAIN_HEAVY window reads each (counted in
 * double: OH OW k0 k1 may pass INT64_MAX, the clipped windows' reads not). */
static int64_t plane_grain(const geom *g, const pool_args *a) {
    double work = (double)g->OH * (double)g->OW * (double)a->k[0] * (double)a->k[1];
    if (work > (double)NBI_GRAIN_HEAVY) return 1;
    return NBI_GRAIN_HEAVY / (work >= 1 ? (int64_t)work : 1) + 1;
}

/* ------------------------------------------------------------ max kernels */
typedef struct {
    geom g;
    pool_args a;
    const char *px;
    char *py;
    int64_t *pi; /* positions of the maxima, or NULL when no one needs them */
} pool_job;

/* Any geometry: one output at a time, torch's scan over the window. */
#define MAX_PLANE(T)                                                                      \
    static void max_plane_##T(const pool_job *j, int64_t p) {                            \
        const geom *g = &j->g;                                                           \
        const T *x = (const T *)j->px + plane_base(g, p);                                \
        T *y = (T *)j->py + p * g->OH * g->OW;                                           \
        int64_t *ix = j->pi ? j->pi + p * g->OH * g->OW : NULL;                          \
        for (int64_t oh = 0; oh < g->OH; oh++)                                           \
            for (int64_t ow = 0; ow < g->OW; ow++) {                                     \
                int64_t h0, h1, w0, w1;                                                  \
                window(oh, j->a.k[0], j->a.s[0], j->a.p[0], g->H, &h0, &h1);            \
                window(ow, j->a.k[1], j->a.s[1], j->a.p[1], g->W, &w0, &w1);            \
                T m = -(T)INFINITY;                                                      \
                int64_t best = h0 * g->W + w0;                                           \
                for (int64_t h = h0; h < h1; h++)                                        \
                    for (int64_t w = w0; w < w1; w++) {                                  \
                        T v = x[h * g->sh + w * g->sw];                                  \
                        if (v > m || v != v) {                                           \
                            m = v;                                                       \
                            best = h * g->W + w;                                         \
                        }                                                                \
                    }                                                                    \
                y[oh * g->OW + ow] = m;                                                  \
                if (ix) ix[oh * g->OW + ow] = best;                                      \
            }                                                                            \
    }
MAX_PLANE(float)
MAX_PLANE(double)

/* kernel 2x2, stride 2, no padding, rows of unit stride (the image
 * networks' pooling): the same scan unrolled over the four values, as
 * selects the compiler vectorizes (not !(v <= m): after a NaN, nothing but
 * another NaN replaces it). */
#define MAX_STEP(v, k)                                                                    \
    do {                                                                                  \
        bool up = ((v) > m) | ((v) != (v));                                               \
        m = up ? (v) : m;                                                                 \
        b = up ? (k) : b;                                                                 \
    } while (0)
/* The f32 scan with positions, 8 outputs at a time: rows r0, r1 read as
 * 16 floats each, split into even and odd columns, the four steps of
 * MAX_STEP as lane masks (the same selections, so the same bits and
 * positions), the winner's place in the window as a code 0..3. A last
 * part of fewer than 8 outputs goes through zero-padded copies (no read past
 * the plane). Returns the outputs done (all of them). Branch-free: the scalar
 * scan's branches mispredict on real data. */
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef int64_t v8l __attribute__((vector_size(64)));
#if defined(__clang__) || __GNUC__ >= 12
#define SHUF16(x, y, ...) __builtin_shufflevector(x, y, __VA_ARGS__)
#else
#define SHUF16(x, y, ...) __builtin_shuffle(x, y, (v8i){__VA_ARGS__})
#endif
#define DEFINE_VEC22(SUF, ATTR)                                                           \
    ATTR static inline void max22_blk8_##SUF(const float *r0, const float *r1, v8f *ym,   \
                                              v8i *code) {                                \
        v8f a0, a1, b0, b1;                                                               \
        memcpy(&a0, r0, 32);                                                              \
        memcpy(&a1, r0 + 8, 32);                                                          \
        memcpy(&b0, r1, 32);                                                              \
        memcpy(&b1, r1 + 8, 32);                                                          \
        v8f v[4] = {SHUF16(a0, a1, 0, 2, 4, 6, 8, 10, 12, 14),                            \
                    SHUF16(a0, a1, 1, 3, 5, 7, 9, 11, 13, 15),                            \
                    SHUF16(b0, b1, 0, 2, 4, 6, 8, 10, 12, 14),                            \
                    SHUF16(b0, b1, 1, 3, 5, 7, 9, 11, 13, 15)};                           \
        v8f m = v[0];                                                                     \
        v8i c = {0};                                                                      \
        for (int k = 1; k < 4; k++) {                                                     \
            v8i up = (v[k] > m) | (v[k] != v[k]);                                         \
            m = (v8f)(((v8i)v[k] & up) | ((v8i)m & ~up));                                 \
            c = (k & up) | (c & ~up);                                                     \
        }                                                                                 \
        *ym = m;                                                                          \
        *code = c;                                                                        \
    }                                                                                     \
    ATTR static int64_t vec22_##SUF(const float *r0, const float *r1, float *yo,          \
                                    int64_t *io, int64_t top, int64_t W, int64_t OW) {    \
        const v8l lane = {0, 2, 4, 6, 8, 10, 12, 14};                                     \
        for (int64_t ow = 0; ow < OW; ow += 8) {                                          \
            int64_t n = OW - ow < 8 ? OW - ow : 8;                                        \
            v8f m;                                                                        \
            v8i c;                                                                        \
            if (n == 8) {                                                                 \
                max22_blk8_##SUF(r0 + 2 * ow, r1 + 2 * ow, &m, &c);                       \
            } else {                                                                      \
                float p0[16] = {0}, p1[16] = {0};                                         \
                memcpy(p0, r0 + 2 * ow, (size_t)(2 * n) * sizeof(float));                 \
                memcpy(p1, r1 + 2 * ow, (size_t)(2 * n) * sizeof(float));                 \
                max22_blk8_##SUF(p0, p1, &m, &c);                                         \
            }                                                                             \
            v8l cl = __builtin_convertvector(c, v8l);                                     \
            v8l pos = (top + 2 * ow) + lane + (cl & 1) + (cl >> 1) * W;                   \
            float ms[8];                                                                  \
            int64_t ps[8];                                                                \
            memcpy(ms, &m, 32);                                                           \
            memcpy(ps, &pos, 64);                                                         \
            memcpy(yo + ow, ms, (size_t)n * sizeof(float));                               \
            memcpy(io + ow, ps, (size_t)n * sizeof(int64_t));                             \
        }                                                                                 \
        return OW;                                                                        \
    }
#define DEFINE_MAX22(T, SUF, ATTR)                                                        \
    ATTR static void max22_plane_##SUF(const pool_job *j, int64_t p) {                   \
        const geom *g = &j->g;                                                           \
        const T *x = (const T *)j->px + plane_base(g, p);                                \
        T *restrict y = (T *)j->py + p * g->OH * g->OW;                                  \
        int64_t *restrict ix = j->pi ? j->pi + p * g->OH * g->OW : NULL;                 \
        for (int64_t oh = 0; oh < g->OH; oh++) {                                         \
            const T *restrict r0 = x + 2 * oh * g->sh, *restrict r1 = r0 + g->sh;        \
            T *restrict yo = y + oh * g->OW;                                             \
            if (!ix) {                                                                   \
                for (int64_t ow = 0; ow < g->OW; ow++) {                                 \
                    T m = r0[2 * ow], b = 0;                                             \
                    MAX_STEP(r0[2 * ow + 1], 0);                                         \
                    MAX_STEP(r1[2 * ow], 0);                                             \
                    MAX_STEP(r1[2 * ow + 1], 0);                                         \
                    (void)b;                                                             \
                    yo[ow] = m;                                                          \
                }                                                                        \
                continue;                                                                \
            }                                                                            \
            int64_t *restrict io = ix + oh * g->OW, top = 2 * oh * g->W;                 \
            int64_t ow = VEC22(r0, r1, yo, io, top, g->W, g->OW);                        \
            for (; ow < g->OW; ow++) {                                                   \
                T m = r0[2 * ow];                                                        \
                int64_t b = top + 2 * ow;                                                \
                MAX_STEP(r0[2 * ow + 1], top + 2 * ow + 1);                              \
                MAX_STEP(r1[2 * ow], top + g->W + 2 * ow);                               \
                MAX_STEP(r1[2 * ow + 1], top + g->W + 2 * ow + 1);                       \
                yo[ow] = m;                                                              \
                io[ow] = b;                                                              \
            }                                                                            \
        }                                                                                \
    }                                                                                    \
    ATTR static void max22_span_##SUF(void *ctx, int64_t lo, int64_t hi) {               \
        for (int64_t p = lo; p < hi; p++) max22_plane_##SUF(ctx, p);                     \
    }
/* VEC22: the outputs of a row done ahead of the scalar loop (f32: all) */
#define AVX512_ATTR __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
#define VEC22(...) vec22_f32(__VA_ARGS__)
DEFINE_VEC22(f32, )
DEFINE_MAX22(float, f32, )
#undef VEC22
#define VEC22(...) 0
DEFINE_MAX22(double, f64, )
#if defined(__x86_64__) && (defined(__clang__) || defined(__GNUC__))
DEFINE_MAX22(double, f64_avx2, __attribute__((target("avx2"))))
DEFINE_MAX22(double, f64_avx512, AVX512_ATTR)
#undef VEC22
#define VEC22(...) vec22_f32_avx2(__VA_ARGS__)
DEFINE_VEC22(f32_avx2, __attribute__((target("avx2"))))
DEFINE_MAX22(float, f32_avx2, __attribute__((target("avx2"))))
#undef VEC22
#define VEC22(...) vec22_f32_avx512(__VA_ARGS__)
/* The AVX-512 one: 8 outputs from two masked 16-float loads per row (a
 * last part of fewer than 8 with shorter masks, no copies), the same lane
 * masks as DEFINE_VEC22, masked stores. */
static AVX512_ATTR int64_t vec22_f32_avx512(const float *r0, const float *r1, float *yo,
                                            int64_t *io, int64_t top, int64_t W, int64_t OW) {
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i od = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i lane = _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14);
    const __m512i one = _mm512_set1_epi64(1), wv = _mm512_set1_epi64(W);
    for (int64_t ow = 0; ow < OW; ow += 8) {
        int64_t n = OW - ow < 8 ? OW - ow : 8;
        __mmask16 lm = (__mmask16)((1u << (2 * n)) - 1);
        __m512 a = _mm512_maskz_loadu_ps(lm, r0 + 2 * ow), b = _mm512_maskz_loadu_ps(lm, r1 + 2 * ow);
        __m256 v[4] = {_mm512_castps512_ps256(_mm512_permutexvar_ps(ev, a)),
                       _mm512_castps512_ps256(_mm512_permutexvar_ps(od, a)),
                       _mm512_castps512_ps256(_mm512_permutexvar_ps(ev, b)),
                       _mm512_castps512_ps256(_mm512_permutexvar_ps(od, b))};
        __m256 m = v[0];
        __m256i c = _mm256_setzero_si256();
        for (int k = 1; k < 4; k++) {
            /* greater, or NaN (unordered with itself) */
            __mmask8 up = _mm256_cmp_ps_mask(v[k], m, _CMP_GT_OQ) |
                          _mm256_cmp_ps_mask(v[k], v[k], _CMP_UNORD_Q);
            m = _mm256_mask_mov_ps(m, up, v[k]);
            c = _mm256_mask_mov_epi32(c, up, _mm256_set1_epi32(k));
        }
        __m512i cl = _mm512_cvtepi32_epi64(c);
        __m512i pos = _mm512_add_epi64(_mm512_add_epi64(_mm512_set1_epi64(top + 2 * ow), lane),
                                       _mm512_add_epi64(_mm512_and_si512(cl, one),
                                                        _mm512_mullo_epi64(_mm512_srli_epi64(cl, 1), wv)));
        __mmask8 sm = (__mmask8)((1u << n) - 1);
        _mm256_mask_storeu_ps(yo + ow, sm, m);
        _mm512_mask_storeu_epi64(io + ow, sm, pos);
    }
    return OW;
}
DEFINE_MAX22(float, f32_avx512, AVX512_ATTR)
#define HAVE_AVX_POOL 1
#endif

static void max_span_float(void *ctx, int64_t lo, int64_t hi) {
    for (int64_t p = lo; p < hi; p++) max_plane_float(ctx, p);
}
static void max_span_double(void *ctx, int64_t lo, int64_t hi) {
    for (int64_t p = lo; p < hi; p++) max_plane_double(ctx, p);
}

static nbi_range_fn max_kernel(const pool_job *j, nb_dtype dt) {
    const pool_args *a = &j->a;
    bool k22 = !a->one_d && a->k[0] == 2 && a->k[1] == 2 && a->s[0] == 2 && a->s[1] == 2 &&
               a->p[0] == 0 && a->p[1] == 0 && j->g.sw == 1;
    bool f32 = dt == NB_F32;
    if (!k22) return f32 ? max_span_float : max_span_double;
#ifdef HAVE_AVX_POOL
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq"))
        return f32 ? max22_span_f32_avx512 : max22_span_f64_avx512;
    if (__builtin_cpu_supports("avx2")) return f32 ? max22_span_f32_avx2 : max22_span_f64_avx2;
#endif
    return f32 ? max22_span_f32 : max22_span_f64;
}

/* g (output's shape, any strides) added at the saved positions into gi
 * (input's shape, contiguous, zeroed), in output order per plane. */
typedef struct {
    geom g; /* g's strides */
    const char *pg;
    const int64_t *pi;
    char *pgi;
} unpool_job;

#define MAX_BACK(T)                                                                       \
    static void max_back_##T(void *ctx, int64_t lo, int64_t hi) {                        \
        const unpool_job *j = ctx;                                                       \
        const geom *g = &j->g;                                                           \
        for (int64_t p = lo; p < hi; p++) {                                              \
            const T *gp = (const T *)j->pg + plane_base(g, p);                           \
            const int64_t *ix = j->pi + p * g->OH * g->OW;                               \
            T *gi = (T *)j->pgi + p * g->H * g->W;                                       \
            for (int64_t oh = 0; oh < g->OH; oh++)                                       \
                for (int64_t ow = 0; ow < g->OW; ow++)                                   \
                    gi[ix[oh * g->OW + ow]] += gp[oh * g->sh + ow * g->sw];              \
        }                                                                                \
    }
MAX_BACK(float)
MAX_BACK(double)

/* ---------------------------------------------------------- max, recorded */
/* node: in[0] = input (its shape only); extra = positions (P, OH * OW);
 * i = the arguments (args_put). g (output's shape) -> gin (input's shape). */
static int max_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    nb_tensor *x = n->in[0];
    geom ge;
    pool_args a = args_get(n, &ge);
    if (nbi_create_graph()) { /* a recorded scatter-add, whose backward is a gather */
        nb_tensor *idx = n->extra;
        nb_tensor *g2 = nb_reshape(g, NB_SHAPE(idx->shape[0], idx->shape[1]));
        nb_tensor *gi = g2 ? nbi_scatter(n->op, g2, 1, idx, NBI_SCATTER_ADD, 2,
                                         (const int64_t[]){idx->shape[0], ge.H * ge.W})
                           : NULL;
        gin[0] = gi ? nb_reshape(gi, x->ndim, x->shape) : NULL;
        return gin[0] ? 0 : -1;
    }
    nb_tensor *gi = nbi_new(n->op, x->dtype, x->ndim, x->shape, true);
    if (!gi) return -1;
    if (g->dtype != x->dtype) {
        nbi_discard(gi);
        return (nbi_error("%s: backward got a %s gradient for a %s output", n->op,
                          nb_dtype_name(g->dtype), nb_dtype_name(x->dtype)), -1);
    }
    unpool_job j = {.pg = nbi_ptr(g), .pi = nbi_ptr(n->extra), .pgi = nbi_ptr(gi)};
    j.g = ge;
    fill_geom(&j.g, x, g, &a);
    int64_t planes = j.g.N * j.g.C;
    nbi_parallel_for(planes, NBI_GRAIN / (j.g.OH * j.g.OW) + 1,
                     x->dtype == NB_F32 ? max_back_float : max_back_double, &j);
    gin[0] = gi;
    return 0;
}

/* the tangent at the saved positions: a gather */
static nb_tensor *max_jvp(nbi_node *n, nb_tensor *const *tin) {
    if (!tin[0]) return nbi_zero_tangent(n);
    nb_tensor *idx = n->extra;
    nb_tensor *t2 = nb_reshape(tin[0], NB_SHAPE(idx->shape[0], -1));
    return nb_reshape(nb_gather(t2, 1, idx), n->out->ndim, n->out->shape);
}

static nb_tensor *max_pool(const char *fn, nb_tensor *x, const pool_args *a) {
    if (!nbi_arg(fn, x, 0)) return NULL;
    geom g;
    if (!pool_check(fn, x, a, &g)) return NULL;
    int64_t sh[NB_MAX_DIMS];
    out_shape(x, a, &g, sh);
    nb_tensor *y = nbi_new(fn, x->dtype, x->ndim, sh, false);
    if (!y) return NULL;
    bool grad = nbi_needs_grad(1, &x);
    int64_t planes = g.N * g.C;
    nb_tensor *idx = grad ? nbi_new(fn, NB_I64, 2, (const int64_t[]){planes, g.OH * g.OW}, false)
                          : NULL;
    if (grad && !idx) return nbi_discard(y);
    pool_job j = {.g = g, .a = *a, .px = nbi_ptr(x), .py = nbi_ptr(y),
                  .pi = idx ? nbi_ptr(idx) : NULL};
    nbi_parallel_for(planes, plane_grain(&g, a), max_kernel(&j, x->dtype), &j);
    if (!grad) return y;
    /* -inf in, -inf out: windows of -inf are the input's, not made here */
    nbi_node *n = nbi_record(y, fn, max_backward, 1, &x);
    if (!n) {
        nb_free(idx);
        return nbi_discard(y);
    }
    args_put(n, a, &g);
    n->extra = nbi_unscoped(idx); /* the node holds the positions */
    n->jvp = max_jvp;
    return y;
}

/* Pooling's stride: 0 (or a NULL array) is the kernel's size, torch's
 * stride=None, in 2-d per dim as in 1-d; a negative one is refused later. */
static int64_t stride_or_kernel(const int64_t *stride, const int64_t *kernel_size, int d) {
    return stride && stride[d] != 0 ? stride[d] : kernel_size[d];
}

nb_tensor *nb_max_pool2d(nb_tensor *input, const int64_t kernel_size[2], const int64_t stride[2],
                         const int64_t padding[2]) {
    const char *fn = "nb_max_pool2d";
    if (!nbi_arg(fn, input, 0)) return NULL;
    if (!kernel_size) return nbi_error("%s: kernel_size is NULL", fn);
    pool_args a = {{kernel_size[0], kernel_size[1]},
                   {stride_or_kernel(stride, kernel_size, 0),
                    stride_or_kernel(stride, kernel_size, 1)},
                   {padding ? padding[0] : 0, padding ? padding[1] : 0}, false, false};
    return max_pool(fn, input, &a);
}

nb_tensor *nb_max_pool1d(nb_tensor *input, int64_t kernel_size, int64_t stride, int64_t padding) {
    pool_args a = {{1, kernel_size}, {1, stride ? stride : kernel_size}, {0, padding}, false,
                   true};
    return max_pool("nb_max_pool1d", input, &a);
}

/* ------------------------------------------------------------ avg kernels */
/* x (planes of (H, W)) -> y (planes of (OH, OW)) contiguous: the window's
 * sum, row-major, divided by its count. */
#define AVG_PLANE(T)                                                                      \
    static void avg_span_##T(void *ctx, int64_t lo, int64_t hi) {                        \
        const pool_job *j = ctx;                                                         \
        const geom *g = &j->g;                                                           \
        for (int64_t p = lo; p < hi; p++) {                                              \
            const T *x = (const T *)j->px + plane_base(g, p);                            \
            T *y = (T *)j->py + p * g->OH * g->OW;                                       \
            for (int64_t oh = 0; oh < g->OH; oh++)                                       \
                for (int64_t ow = 0; ow < g->OW; ow++) {                                 \
                    int64_t h0, h1, w0, w1;                                              \
                    window(oh, j->a.k[0], j->a.s[0], j->a.p[0], g->H, &h0, &h1);         \
                    window(ow, j->a.k[1], j->a.s[1], j->a.p[1], g->W, &w0, &w1);         \
                    T sum = 0;                                                           \
                    for (int64_t h = h0; h < h1; h++)                                    \
                        for (int64_t w = w0; w < w1; w++) sum += x[h * g->sh + w * g->sw]; \
                    y[oh * g->OW + ow] =                                                 \
                        sum / avg_div_##T(j->a.cip, j->a.k[0], j->a.k[1], h1 - h0, w1 - w0); \
                }                                                                        \
        }                                                                                \
    }
AVG_PLANE(float)
AVG_PLANE(double)

/* g (planes of (OH, OW), any strides) -> gi (planes of (H, W)) contiguous,
 * zeroed: g / count added over each window, in output order (torch's). */
#define AVG_BACK(T)                                                                       \
    static void avg_back_##T(void *ctx, int64_t lo, int64_t hi) {                        \
        const pool_job *j = ctx;                                                         \
        const geom *g = &j->g;                                                           \
        for (int64_t p = lo; p < hi; p++) {                                              \
            const T *gp = (const T *)j->px + plane_base(g, p);                           \
            T *gi = (T *)j->py + p * g->H * g->W;                                        \
            for (int64_t oh = 0; oh < g->OH; oh++)                                       \
                for (int64_t ow = 0; ow < g->OW; ow++) {                                 \
                    int64_t h0, h1, w0, w1;                                              \
                    window(oh, j->a.k[0], j->a.s[0], j->a.p[0], g->H, &h0, &h1);         \
                    window(ow, j->a.k[1], j->a.s[1], j->a.p[1], g->W, &w0, &w1);         \
                    T d = gp[oh * g->sh + ow * g->sw] /                                  \
                          avg_div_##T(j->a.cip, j->a.k[0], j->a.k[1], h1 - h0, w1 - w0); \
                    for (int64_t h = h0; h < h1; h++)                                    \
                        for (int64_t w = w0; w < w1; w++) gi[h * g->W + w] += d;         \
                }                                                                        \
        }                                                                                \
    }
AVG_BACK(float)
AVG_BACK(double)

/* ---------------------------------------------------------- avg, recorded */
static nb_tensor *avg_apply(const char *fn, nb_tensor *x, const pool_args *a, geom g);
static nb_tensor *avg_spread(const char *fn, nb_tensor *g, const pool_args *a, geom ge,
                             const nb_tensor *like);

/* avg_pool's node: in[0] = input (its shape only). g -> the spread of g. */
static int avg_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    geom ge;
    pool_args a = args_get(n, &ge);
    gin[0] = avg_spread(n->op, g, &a, ge, n->in[0]);
    return gin[0] ? 0 : -1;
}
static nb_tensor *avg_jvp(nbi_node *n, nb_tensor *const *tin) {
    if (!tin[0]) return nbi_zero_tangent(n);
    geom ge;
    pool_args a = args_get(n, &ge);
    return avg_apply(n->op, tin[0], &a, ge);
}

/* the spread's node: in[0] = g. Its transpose is the pooling itself. */
static int spread_backward(nbi_node *n, nb_tensor *gg, nb_tensor **gin) {
    geom ge;
    pool_args a = args_get(n, &ge);
    gin[0] = avg_apply("nb_avg_pool2d", gg, &a, ge);
    return gin[0] ? 0 : -1;
}
static nb_tensor *spread_jvp(nbi_node *n, nb_tensor *const *tin) {
    if (!tin[0]) return nbi_zero_tangent(n);
    geom ge;
    pool_args a = args_get(n, &ge);
    return avg_spread(n->op, tin[0], &a, ge, n->out);
}

/* x (input's shape) -> the pooled output; g.H, g.W set (checked). */
static nb_tensor *avg_apply(const char *fn, nb_tensor *x, const pool_args *a, geom g) {
    fill_geom(&g, x, x, a);
    int64_t sh[NB_MAX_DIMS];
    out_shape(x, a, &g, sh);
    nb_tensor *y = nbi_new(fn, x->dtype, x->ndim, sh, false);
    if (!y) return NULL;
    pool_job j = {.g = g, .a = *a, .px = nbi_ptr(x), .py = nbi_ptr(y)};
    nbi_parallel_for(g.N * g.C, plane_grain(&g, a),
                     x->dtype == NB_F32 ? avg_span_float : avg_span_double, &j);
    if (!nbi_needs_grad(1, &x)) return y;
    nbi_node *n = nbi_record(y, fn, avg_backward, 1, &x);
    if (!n) return nbi_discard(y);
    args_put(n, a, &g);
    n->jvp = avg_jvp;
    return y;
}

/* g (output's shape) -> the input's shape (like's), contiguous. */
static nb_tensor *avg_spread(const char *fn, nb_tensor *g, const pool_args *a, geom ge,
                             const nb_tensor *like) {
    if (g->dtype != like->dtype)
        return nbi_error("%s: backward got a %s gradient for a %s output", fn,
                         nb_dtype_name(g->dtype), nb_dtype_name(like->dtype));
    nb_tensor *gi = nbi_new(fn, like->dtype, like->ndim, like->shape, true);
    if (!gi) return NULL;
    fill_geom(&ge, like, g, a);
    pool_job j = {.g = ge, .a = *a, .px = nbi_ptr(g), .py = nbi_ptr(gi)};
    nbi_parallel_for(ge.N * ge.C, plane_grain(&ge, a),
                     like->dtype == NB_F32 ? avg_back_float : avg_back_double, &j);
    if (!nbi_needs_grad(1, &g)) return gi;
    nbi_node *n = nbi_record(gi, "nb_avg_pool2d's backward", spread_backward, 1, &g);
    if (!n) return nbi_discard(gi);
    args_put(n, a, &ge);
    n->jvp = spread_jvp;
    return gi;
}

nb_tensor *nb_avg_pool2d(nb_tensor *input, const int64_t kernel_size[2], const int64_t stride[2],
                         const int64_t padding[2], bool count_include_pad) {
    const char *fn = "nb_avg_pool2d";
    if (!nbi_arg(fn, input, 0)) return NULL;
    if (!kernel_size) return nbi_error("%s: kernel_size is NULL", fn);
    pool_args a = {{kernel_size[0], kernel_size[1]},
                   {stride_or_kernel(stride, kernel_size, 0),
                    stride_or_kernel(stride, kernel_size, 1)},
                   {padding ? padding[0] : 0, padding ? padding[1] : 0}, count_include_pad,
                   false};
    geom g;
    if (!pool_check(fn, input, &a, &g)) return NULL;
    return avg_apply(fn, input, &a, g);
}
