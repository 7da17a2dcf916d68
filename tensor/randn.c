/* randn.c: nb_randn's normal draws. Element i of a tensor whose draws start
 * at counter `base` of the stream uses draws base + 2i and base + 2i + 1:
 *
 *     u1 = 1 - u(base + 2i)                      in (0, 1]
 *     u2 = u(base + 2i + 1)                      in [0, 1)
 *     v  = sqrt(-2 log u1) cos(6.283185307179586 u2)   in double, libm
 *
 * rounded to the tensor's dtype (normal_exact below: the definition, which
 * fixtures, seeded tests and make run's output depend on).
 *
 * Elements are independent of each other (the generator is counter-based),
 * so a tensor is filled in ranges on the thread pool: the same values on any
 * thread count.
 *
 * f32 has a fast path (the libm calls cost ~20 ns an element; GPT-2's 124M
 * weights took 3 s): v is computed in double by vector code (log by the
 * atanh series, cos by a three-part reduction and Taylor polynomials,
 * sqrt by the IEEE instruction), within 2^-49 of libm's v relatively (16
 * ulp of the double; the test suite measures the largest difference over
 * millions of draws and edge draws), then rounded to f32. That rounding
 * equals the rounding of libm's v unless an f32 rounding boundary (a
 * midpoint between two floats) lies between the two doubles: so where the
 * fast v is within BAND double ulps of a midpoint (BAND = 2^13, i.e. 2^-40
 * relatively: 512 times the error bound), or is zero (a sign to get right),
 * the element is computed again by normal_exact. That happens for about
 * 2^14 / 2^29 = 1 in 32,768 elements. So f32 results are bit for bit those
 * of libm, on every instruction-set path; f64 results are libm's. */
#include "tensor_internal.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#define RN_X86 1
#include <immintrin.h>
#else
#define RN_X86 0
#endif

#define GAMMA 0x9E3779B97F4A7C15ULL
#define BAND 8192 /* double ulps either side of an f32 midpoint sent to libm */

/* The definition: the value of draws u, u2; element c/2's from draws c, c + 1 */
static double normal_of(double u, double u2) {
    double u1 = 1.0 - u;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}
static double normal_exact(uint64_t key, uint64_t c) {
    return normal_of(nbi_rng_uniform_key(key, c), nbi_rng_uniform_key(key, c + 1));
}

/* ------------------------------------------------------------ the vector code
 * Written once as a macro over the vector width, instantiated per
 * instruction set (GCC vector extensions; target attributes, the library is
 * built without -march). Only IEEE-exact operations and roundings appear;
 * no fused multiply-adds are asked for (the build does not contract), so
 * the error bound below holds on every path.
 *
 * log u1, u1 = m 2^e with m in [sqrt(1/2), sqrt(2)), f = m - 1 (exact):
 *   log(1 + f) = 2 atanh(s), s = f / (2 + f), |s| <= 0.1716, z = s^2
 *              = f - s (f - R),   R = sum_{n=1..10} 2 z^n / (2n + 1)
 * (since 2s = f - s f); the series' next term is below 2^-58 relatively.
 * Then + e ln2 in two parts (e ln2_hi exact). Error: a few ulp; the sum
 * with e ln2 loses at most a factor 2 (e = -1).
 *
 * cos x, x in [0, 2 pi): k = nearest integer to x 2/pi, r = x - k pi/2 with
 * pi/2 = P1 + P2 + P3 (P1, P2 of 33 bits: k P1 and k P2 exact, x - k P1
 * exact), so r is within ~1e-36 of the true remainder, whose smallest value
 * for a double x here is ~6e-17 (x next to pi/2): a relative error below
 * 1e-19. |r| <= pi/4 (plus a rounding), z = r^2 <= 0.62:
 *   sin r = r + r z sum_{n=1..8} (-1)^n z^(n-1) / (2n+1)!
 *   cos r = 1 + z sum_{n=1..9} (-1)^n z^(n-1) / (2n)!
 * (next terms below 2^-62 relatively), then the quadrant k mod 4 picks
 * +cos, -sin, -cos, +sin. */
#define LN2_HI 6.93147180369123816490e-01 /* 0x3fe62e42fee00000 */
#define LN2_LO 1.90821492927058770002e-10
#define SQRT2 1.4142135623730951
#define P1 1.57079632673412561417e+00 /* 0x3FF921FB54400000 */
#define P2 6.07710050630396597660e-11 /* 0x3DD0B4611A600000 */
#define P3 2.02226624879595063154e-21 /* pi/2 - P1 - P2, rounded */
#define TWO_OVER_PI 6.36619772367581382433e-01
#define RND 0x1.8p52 /* x + RND - RND rounds x to an integer, |x| < 2^51 */

#define RN_DEFINE(SFX, ATTR, W, VD, VU, VF, SQRT, ANY)                                    \
    /* (z >> 11) 2^-53 exactly: two halves of < 2^52 through the 2^52 bias */             \
    ATTR static inline VD u01_##SFX(VU z) {                                               \
        VU t = z >> 11;                                                                   \
        VD bias = (VD){0} + 0x1p52;                                                       \
        VD hi = (VD)((t >> 26) | 0x4330000000000000ULL) - bias;                           \
        VD lo = (VD)((t & 0x3FFFFFFULL) | 0x4330000000000000ULL) - bias;                  \
        return (hi * 0x1p26 + lo) * 0x1p-53;                                              \
    }                                                                                     \
    ATTR static inline VU mix_##SFX(VU z) { /* nbi_mix64 lanewise */                      \
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;                                      \
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;                                      \
        return z ^ (z >> 31);                                                             \
    }                                                                                     \
    ATTR static inline VD sel_##SFX(VU m, VD a, VD b) { /* m ? a : b, lanewise */         \
        return (VD)(((VU)a & m) | ((VU)b & ~m));                                          \
    }                                                                                     \
    /* log u1, u1 in (0, 1] normal */                                                     \
    ATTR static inline VD log_##SFX(VD u1) {                                              \
        VU b = (VU)u1;                                                                    \
        VD bias = (VD){0} + 0x1p52;                                                       \
        VD e = (VD)((b >> 52) | 0x4330000000000000ULL) - bias - 1023.0;                   \
        VD m = (VD)((b & 0x000FFFFFFFFFFFFFULL) | 0x3FF0000000000000ULL); /* [1, 2) */    \
        VU big = (VU)(m > SQRT2);                                                         \
        m = sel_##SFX(big, m * 0.5, m);                                                   \
        e = sel_##SFX(big, e + 1.0, e);                                                   \
        VD f = m - 1.0;                                                                   \
        VD s = f / (2.0 + f);                                                             \
        VD z = s * s;                                                                     \
        VD r = (VD){0} + 2.0 / 21;                                                        \
        r = r * z + 2.0 / 19;                                                             \
        r = r * z + 2.0 / 17;                                                             \
        r = r * z + 2.0 / 15;                                                             \
        r = r * z + 2.0 / 13;                                                             \
        r = r * z + 2.0 / 11;                                                             \
        r = r * z + 2.0 / 9;                                                              \
        r = r * z + 2.0 / 7;                                                              \
        r = r * z + 2.0 / 5;                                                              \
        r = r * z + 2.0 / 3;                                                              \
        r = r * z;                                                                        \
        VD l1p = f - s * (f - r);                                                         \
        return e * LN2_HI + (l1p + e * LN2_LO);                                           \
    }                                                                                     \
    /* cos x, x in [0, 2 pi) */                                                           \
    ATTR static inline VD cos_##SFX(VD x) {                                               \
        VD y = x * TWO_OVER_PI + RND;                                                     \
        VU q = (VU)y & 3;                                                                 \
        VD k = y - RND;                                                                   \
        VD r = x - k * P1;                                                                \
        r = r - k * P2;                                                                   \
        r = r - k * P3;                                                                   \
        VD z = r * r;                                                                     \
        VD sp = (VD){0} + 1.0 / 355687428096000.0;                                        \
        sp = sp * z - 1.0 / 1307674368000.0;                                              \
        sp = sp * z + 1.0 / 6227020800.0;                                                 \
        sp = sp * z - 1.0 / 39916800.0;                                                   \
        sp = sp * z + 1.0 / 362880.0;                                                     \
        sp = sp * z - 1.0 / 5040.0;                                                       \
        sp = sp * z + 1.0 / 120.0;                                                        \
        sp = sp * z - 1.0 / 6.0;                                                          \
        VD sn = r + r * z * sp;                                                           \
        VD cp = (VD){0} + 1.0 / 6402373705728000.0;                                       \
        cp = cp * z - 1.0 / 20922789888000.0;                                             \
        cp = cp * z + 1.0 / 87178291200.0;                                                \
        cp = cp * z - 1.0 / 479001600.0;                                                  \
        cp = cp * z + 1.0 / 3628800.0;                                                    \
        cp = cp * z - 1.0 / 40320.0;                                                      \
        cp = cp * z + 1.0 / 720.0;                                                        \
        cp = cp * z - 1.0 / 24.0;                                                         \
        cp = cp * z + 0.5;                                                                \
        VD cs = 1.0 - z * cp;                                                             \
        VU odd = (VU)((q & 1) != 0);                                                      \
        VD out = sel_##SFX(odd, sn, cs);                                                  \
        return (VD)((VU)out ^ (((q + 1) & 2) << 62));                                     \
    }                                                                                     \
    ATTR static inline VD normal_##SFX(VD u1, VD u2) {                                    \
        return SQRT(-2.0 * log_##SFX(u1)) * cos_##SFX(6.283185307179586 * u2);            \
    }                                                                                     \
    /* lanes of v that the f32 rounding cannot decide: near a midpoint, or zero */        \
    ATTR static inline VU unsure_##SFX(VD v) {                                            \
        VU b = (VU)v;                                                                     \
        VU near = (VU)(((b & 0x1FFFFFFFULL) - (0x10000000ULL - BAND)) <= 2 * BAND);       \
        return near | (VU)((b << 1) == 0);                                                \
    }                                                                                     \
    /* out[0..W) <- f32 of v; returns the lanes to compute again */                     \
    ATTR static inline VU store_##SFX(VD v, float *out) {                                 \
        VF f = __builtin_convertvector(v, VF);                                            \
        memcpy(out, &f, sizeof f);                                                        \
        return unsure_##SFX(v);                                                           \
    }                                                                                     \
    /* out[0..n) <- the f32 elements from counter c0 on (n a multiple of W) */            \
    ATTR static void fill_##SFX(float *out, int64_t n, uint64_t key, uint64_t c0) {       \
        VU lane;                                                                          \
        for (int l = 0; l < W; l++) lane[l] = 2 * (uint64_t)l;                            \
        for (int64_t i = 0; i < n; i += W) {                                              \
            uint64_t c = c0 + 2 * (uint64_t)i;                                            \
            VU h = key + (c + lane + 1) * GAMMA; /* draws c + 2l; + GAMMA: c + 2l + 1 */   \
            VD u1 = 1.0 - u01_##SFX(mix_##SFX(h));                                        \
            VD u2 = u01_##SFX(mix_##SFX(h + GAMMA));                                      \
            VU bad = store_##SFX(normal_##SFX(u1, u2), out + i);                          \
            if (ANY(bad))                                                                 \
                for (int l = 0; l < W; l++)                                               \
                    if (bad[l]) out[i + l] = (float)normal_exact(key, c + 2 * (uint64_t)l); \
        }                                                                                 \
    }                                                                                     \
    /* tests: the same from given u (u1 = 1 - u) and u2; raw: the unrounded v, moved    \
     * by nudge double ulps (an error that large, to test the band) */                    \
    ATTR static void from_u_##SFX(const double *u, const double *u2, float *out,          \
                                  double *raw, int64_t n, int64_t nudge) {                \
        for (int64_t i = 0; i < n; i += W) {                                              \
            VD a, b;                                                                      \
            memcpy(&a, u + i, sizeof a);                                                  \
            memcpy(&b, u2 + i, sizeof b);                                                 \
            VD v = (VD)((VU)normal_##SFX(1.0 - a, b) + (uint64_t)nudge);                  \
            memcpy(raw + i, &v, sizeof v);                                                \
            VU bad = store_##SFX(v, out + i);                                             \
            for (int l = 0; l < W; l++)                                                   \
                if (bad[l]) out[i + l] = (float)normal_of(u[i + l], u2[i + l]);           \
        }                                                                                 \
    }

typedef double rn_d2 __attribute__((vector_size(16)));
typedef uint64_t rn_u2 __attribute__((vector_size(16)));
typedef float rn_f2 __attribute__((vector_size(8)));
#if RN_X86
#define SQRT_2(v) ((rn_d2)_mm_sqrt_pd((__m128d)(v)))
#define ANY_2(m) (_mm_movemask_epi8((__m128i)(m)) != 0)
#else
static inline rn_d2 sqrt_2(rn_d2 v) { return (rn_d2){sqrt(v[0]), sqrt(v[1])}; }
#define SQRT_2(v) sqrt_2(v)
#define ANY_2(m) (((m)[0] | (m)[1]) != 0)
#endif
RN_DEFINE(p, , 2, rn_d2, rn_u2, rn_f2, SQRT_2, ANY_2)

#if RN_X86 && (defined(__GNUC__) || defined(__clang__))
#define RN_HAVE_AVX 1
typedef double rn_d4 __attribute__((vector_size(32)));
typedef uint64_t rn_u4 __attribute__((vector_size(32)));
typedef float rn_f4 __attribute__((vector_size(16)));
#define SQRT_4(v) ((rn_d4)_mm256_sqrt_pd((__m256d)(v)))
#define ANY_4(m) (!_mm256_testz_si256((__m256i)(m), (__m256i)(m)))
RN_DEFINE(avx2, __attribute__((target("avx2"))), 4, rn_d4, rn_u4, rn_f4, SQRT_4, ANY_4)

typedef double rn_d8 __attribute__((vector_size(64)));
typedef uint64_t rn_u8 __attribute__((vector_size(64)));
typedef float rn_f8 __attribute__((vector_size(32)));
#define SQRT_8(v) ((rn_d8)_mm512_sqrt_pd((__m512d)(v)))
#define ANY_8(m) (_mm512_test_epi64_mask((__m512i)(m), (__m512i)(m)) != 0)
RN_DEFINE(avx512, __attribute__((target("avx512f,avx512dq"))), 8, rn_d8, rn_u8, rn_f8, SQRT_8,
          ANY_8)
#endif

/* ------------------------------------------------------------------ dispatch */
static _Atomic int rn_path = NBI_RANDN_AUTO;

static int rn_detect(void) {
#ifdef RN_HAVE_AVX
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq"))
        return NBI_RANDN_AVX512;
    if (__builtin_cpu_supports("avx2")) return NBI_RANDN_AVX2;
#endif
    return NBI_RANDN_PORTABLE;
}

int nbi_randn_path(int force) {
    int best = rn_detect();
    int p = force == NBI_RANDN_AUTO || force > best ? best : force < 0 ? NBI_RANDN_PORTABLE : force;
    atomic_store_explicit(&rn_path, p, memory_order_relaxed);
    return p;
}

static int rn_current(void) {
    int p = atomic_load_explicit(&rn_path, memory_order_relaxed);
    return p < 0 ? nbi_randn_path(NBI_RANDN_AUTO) : p;
}

static int rn_width(int path) { return path == NBI_RANDN_AVX512 ? 8 : path == NBI_RANDN_AVX2 ? 4 : 2; }

/* out[0..n) <- f32 elements from counter c0 on; the fast path for whole
 * vectors, normal_exact for the tail */
static void fill_f32(int path, float *out, int64_t n, uint64_t key, uint64_t c0) {
    int64_t nv = n / rn_width(path) * rn_width(path);
    switch (path) {
#ifdef RN_HAVE_AVX
    case NBI_RANDN_AVX512: fill_avx512(out, nv, key, c0); break;
    case NBI_RANDN_AVX2: fill_avx2(out, nv, key, c0); break;
#endif
    default: fill_p(out, nv, key, c0); break;
    }
    for (int64_t i = nv; i < n; i++) out[i] = (float)normal_exact(key, c0 + 2 * (uint64_t)i);
}

void nbi_randn_from_u(int path, const double *u, const double *u2, float *out, double *raw,
                      int64_t n, int64_t nudge) {
    int64_t nv = n / rn_width(path) * rn_width(path);
    switch (path) {
#ifdef RN_HAVE_AVX
    case NBI_RANDN_AVX512: from_u_avx512(u, u2, out, raw, nv, nudge); break;
    case NBI_RANDN_AVX2: from_u_avx2(u, u2, out, raw, nv, nudge); break;
#endif
    default: from_u_p(u, u2, out, raw, nv, nudge); break;
    }
    for (int64_t i = nv; i < n; i++) out[i] = (float)(raw[i] = normal_of(u[i], u2[i]));
}

/* ------------------------------------------------------------- the fill */
typedef struct {
    void *dst;
    bool f32;
    int path;
    uint64_t key, base;
} normal_job;

static void normal_range(void *ctx, int64_t lo, int64_t hi) {
    const normal_job *j = ctx;
    uint64_t c0 = j->base + 2 * (uint64_t)lo;
    if (j->f32) {
        fill_f32(j->path, (float *)j->dst + lo, hi - lo, j->key, c0);
        return;
    }
    double *d = (double *)j->dst + lo;
    for (int64_t i = 0; i < hi - lo; i++) d[i] = normal_exact(j->key, c0 + 2 * (uint64_t)i);
}

void nbi_randn_fill(nb_dtype dtype, void *dst, int64_t n, uint64_t seed, uint64_t base) {
    normal_job j = {.dst = dst, .f32 = dtype == NB_F32, .path = rn_current(),
                    .key = nbi_rng_key(seed), .base = base};
    nbi_parallel_for(n, (int64_t)1 << 12, normal_range, &j);
}
