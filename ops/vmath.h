/* vmath.h: vectorized f32 transcendental functions for the elementwise ops
 * (exp, tanh, sigmoid, silu, gelu_tanh, gelu and the backward rules of the
 * last three) and for softmax / log_softmax.
 *
 * Accuracy: every function is within 2 ulp of the correctly rounded result
 * over the whole float range (measured over all 2^32 inputs), with IEEE
 * special values as libm and PyTorch give them: NaN propagates, exp
 * overflows to +inf above 88.72 and gives denormals down to -103.97 (then
 * 0), tanh is odd (-0 stays -0), saturates to +-1 and is x itself for tiny x.
 * (The exception: gelu_tanh_lowp and its gradient, float-evaluated for bf16
 * autocast regions only, see above NBV_GT_SQ_OVERFLOW.)
 *
 * Two designs, by what the function needs:
 *   - exp and tanh are computed in float (the hot loop of softmax is exp).
 *   - sigmoid, silu, gelu_tanh, gelu and the derivatives are compositions in
 *     which float arithmetic loses too much: 1 + tanh(u) cancels for x < 0,
 *     exp(-2u) amplifies the rounding error of u by |2u| (up to ~100), and the
 *     derivatives have a root. They are evaluated in double (the float input
 *     converted, a double exp below, the formula in double) and rounded to
 *     float once, which makes them nearly correctly rounded everywhere.
 *
 * Determinism: each element goes through the same vector code whatever its
 * position; the tail of an array (fewer elements than a vector) is copied into
 * a zero-padded vector and computed by the same function, strided inputs are
 * gathered into vectors. So a value's result never depends on the array's
 * length, offset, alignment or on how a range was split across threads. It
 * may depend on the instruction-set path (fused multiply-adds on AVX2,
 * AVX-512 and NEON, separate multiplies and adds on the portable path),
 * chosen once per process as for the GEMM (nbi_vmath_path).
 *
 * Like ops/gemm.c, the library is built without -march: each function is
 * written once in a macro (NBV_DEFINE) and instantiated per instruction set
 * with GCC vector extensions: AVX-512 (16 floats, 8 doubles per vector) and
 * AVX2+FMA (8, 4) under target attributes, on aarch64 NEON (4, 2: FMLA
 * is baseline there), and a portable one (4, 2) of whatever the baseline
 * target makes of 16-byte vectors. Multiply-adds that
 * should be fused are written FMAF / FMAD (an intrinsic on the FMA paths, a
 * multiply and an add on the portable one); the build does not contract
 * a*b+c (-std=c11), so every operation is as written, in every copy the
 * compiler makes of it.
 *
 * Polynomial coefficients are minimax fits (weighted Remez exchange, in
 * mpmath) made for these forms and ranges. */
#ifndef NABLA_OPS_VMATH_H
#define NABLA_OPS_VMATH_H

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#define NBV_X86 1
#include <immintrin.h>
#else
#define NBV_X86 0
#endif
#if defined(__aarch64__)
#define NBV_ARM 1
#include <arm_neon.h>
#else
#define NBV_ARM 0
#endif

/* The instruction-set path (as nbi_gemm_path): NBV_AUTO picks the best the CPU
 * supports (the default); tests and benchmarks may force one. Returns the path
 * in use after the call (a forced path the CPU lacks falls back to the
 * portable one). Defined in ops/elementwise.c. The paths are those of the
 * architecture compiled for (tests loop up to NBV_COUNT). */
#if NBV_X86
enum { NBV_AUTO = -1, NBV_PORTABLE = 0, NBV_AVX2 = 1, NBV_AVX512 = 2, NBV_COUNT };
#elif NBV_ARM
enum { NBV_AUTO = -1, NBV_PORTABLE = 0, NBV_NEON = 1, NBV_COUNT };
#else
enum { NBV_AUTO = -1, NBV_PORTABLE = 0, NBV_COUNT };
#endif
int nbi_vmath_path(int force);
int nbi_vmath_current(void); /* the path in use (detected on first call) */

#define NBV_INLINE static inline __attribute__((always_inline))

typedef float nbv_f2 __attribute__((vector_size(8)));
typedef float nbv_f4 __attribute__((vector_size(16)));
typedef int32_t nbv_i4 __attribute__((vector_size(16)));
typedef uint32_t nbv_u4 __attribute__((vector_size(16)));
typedef double nbv_d2 __attribute__((vector_size(16)));
typedef int64_t nbv_l2 __attribute__((vector_size(16)));
typedef uint64_t nbv_q2 __attribute__((vector_size(16)));
#if NBV_X86
typedef float nbv_f8 __attribute__((vector_size(32)));
typedef int32_t nbv_i8 __attribute__((vector_size(32)));
typedef uint32_t nbv_u8 __attribute__((vector_size(32)));
typedef double nbv_d4 __attribute__((vector_size(32)));
typedef int64_t nbv_l4 __attribute__((vector_size(32)));
typedef uint64_t nbv_q4 __attribute__((vector_size(32)));
typedef float nbv_f16 __attribute__((vector_size(64)));
typedef int32_t nbv_i16 __attribute__((vector_size(64)));
typedef uint32_t nbv_u16 __attribute__((vector_size(64)));
typedef double nbv_d8 __attribute__((vector_size(64)));
typedef int64_t nbv_l8 __attribute__((vector_size(64)));
typedef uint64_t nbv_q8 __attribute__((vector_size(64)));
#endif

/* ------------------------------------------------------------ constants */
/* exp, float: x = k ln2 + r, |r| <= ln2/2, with k = round(x log2(e)) by the
 * 1.5 * 2^23 trick. ln2 = L1 + L2 where L1 has 16 significant bits, so that
 * k L1 is exact for |k| < 256 and x - k L1 is exact (Cody and Waite); the
 * error left in r is a rounding of r - k L2, ~2^-25 |r|. */
#define NBV_LOG2E_F 0x1.715476p+0f
#define NBV_MAGIC_F 0x1.8p23f
#define NBV_LN2_HI_F 0x1.62e4p-1f
#define NBV_LN2_LO_F 0x1.7f7d1cp-20f
/* Inputs are clamped to 89 (NaN passes): exp(89) overflows, so the results
 * above are right. Below -104, exp(x) < 2^-150 rounds to 0: those lanes get
 * 0 by a select, computed on x = 0 meanwhile, because a product that
 * underflows costs a microcode assist (3.5x the time of a normal result
 * here), and attention's masked scores make whole rows of -inf. */
#define NBV_EXP_MAX_F 89.0f
#define NBV_EXP_MIN_F -104.0f
/* e^r = 1 + r + r^2 Q(r), Q of degree 4, minimax for the relative error of
 * e^r on |r| <= 0.3473: 3.1e-9 (0.05 ulp). */
#define NBV_EXPF_Q0 0.4999999403953552f
#define NBV_EXPF_Q1 0.1666651964187622f
#define NBV_EXPF_Q2 0.041668400168418884f
#define NBV_EXPF_Q3 0.00836885068565607f
#define NBV_EXPF_Q4 0.0013814320554956794f

/* tanh, float: for |x| < 0.9, tanh(a) = a + a^3 P(a^2), P of degree 6 minimax
 * for the relative error of tanh on [0, 0.9]: 1.1e-9. Above, 1 - 2 / (exp(2a)
 * + 1): there tanh >= 0.716, so the subtraction adds no error to speak of and
 * the error of 2 / (exp(2a) + 1) <= 0.284 counts for a quarter of an ulp of
 * the result or so. (A cut at 0.55 needs a polynomial of degree 4 only, but
 * 1 - 2/(e + 1) ~ 0.5 there reached 1.34 ulp.) exp's argument is clamped to
 * 40 (tanh(20) rounds to 1). */
#define NBV_TANH_CUT 0.9f
#define NBV_TANH_P0 -0.33333322405815125f
#define NBV_TANH_P1 0.13332977890968323f
#define NBV_TANH_P2 -0.05392930284142494f
#define NBV_TANH_P3 0.021663542836904526f
#define NBV_TANH_P4 -0.008264545351266861f
#define NBV_TANH_P5 0.0025826694909483194f
#define NBV_TANH_P6 -0.00045546056935563684f

/* exp, double (inside the double-evaluated functions): the same reduction;
 * L1 has 40 significant bits (k L1 exact for |k| < 2^13). e^r = 1 + r + r^2
 * Q(r), Q of degree 9, minimax relative error 3.7e-18 on |r| <= 0.3473.
 * Arguments below -708 give 0 (as exp underflows; every caller multiplies the
 * result by at most a float, so nothing representable in float is lost) and
 * above 708 are clamped (no caller has one). */
#define NBV_LOG2E_D 0x1.71547652b82fep+0
#define NBV_MAGIC_D 0x1.8p52
#define NBV_LN2_HI_D 0x1.62e42fefa4p-1
#define NBV_LN2_LO_D -0x1.8432a1b0e2634p-43
#define NBV_EXPD_Q0 0.5000000000000011
#define NBV_EXPD_Q1 0.16666666666666408
#define NBV_EXPD_Q2 0.0416666666665281
#define NBV_EXPD_Q3 0.008333333333496928
#define NBV_EXPD_Q4 0.001388888894424927
#define NBV_EXPD_Q5 0.0001984126950273166
#define NBV_EXPD_Q6 2.4801492388243424e-05
#define NBV_EXPD_Q7 2.755758843049505e-06
#define NBV_EXPD_Q8 2.763052347652e-07
#define NBV_EXPD_Q9 2.4999855125964565e-08

/* gelu_tanh: 0.5 x (1 + tanh(u)), u = beta (x + kappa x^3), beta = sqrt(2/pi),
 * kappa = 0.044715, is x sigmoid(z) with z = 2u = x (C1 + C3 x^2); dz/dx =
 * C1 + 3 C3 x^2. */
#define NBV_GT_C1 1.5957691216057308   /* 2 beta */
#define NBV_GT_C3 0.07135481627260025  /* 2 beta kappa */
#define NBV_GT_C3X3 0.21406444881780073 /* 6 beta kappa */
/* Inside a bf16 autocast region gelu_tanh and its derivative are evaluated in
 * float (nbv_gelu_tanh_lowp_f32, nbv_gelu_tanh_grad_lowp_f32): x sigmoid(z)
 * with the float exp, so without the cancellation of 1 + tanh(u), at a
 * third of the double form's cost. Their error comes from exp's argument
 * (z's rounding, ~2 ulp of z, scaled by |z|): gelu_tanh within 12 ulp for
 * |x| <= 3 and 5e-7 absolute everywhere, the derivative within 2.4e-7
 * absolute (measured on [-12, 12]; tests/test_bf16.c checks it): far
 * inside the 2^-9 of the bf16 products around them, and without the
 * cancellation of PyTorch's float formula (whose autocast runs GELU on the
 * bf16 output of the product). */
/* PyTorch's float derivative of gelu_tanh squares x first: where x*x
 * overflows in float (|x| >= ~1.8e19: x^2 >= this, as a double) it is NaN,
 * and tests/test_edges.c expects NaN where torch has it. */
#define NBV_GT_SQ_OVERFLOW 0x1.ffffffp127

/* gelu, erf form: x Phi(x), Phi the normal cdf (0.5 (1 + erf(x / sqrt 2))), and
 * gelu'(x) = Phi(x) + x phi(x), phi(x) = exp(-x^2/2) / sqrt(2 pi). Phi, in
 * double, two ways:
 *   |x| < 1.5: Phi(x) = 1/2 + x A(x^2), A of degree 11, minimax for the
 *     relative error of Phi(-|x|) (the smaller side): 4.5e-17;
 *   |x| >= 1.5: Phi(-|x|) = phi(x) R(|x|), R the Mills ratio, R(u) = w S(w),
 *     w = 1 / (u + 4), S of degree 12, minimax relative error 2.7e-13 for
 *     u in [1.5, 14.6] (and beyond: from u = 14.4 on, phi(u) R(u) u
 *     underflows in float); Phi(|x|) = 1 - Phi(-|x|).
 * So the small tail of Phi for x << 0, which 1 + erf would lose, is computed
 * as itself, and Phi + x phi near the root of gelu' (x = -0.75) adds terms
 * accurate to ~1e-17. */
#define NBV_GELU_CUT 1.5
#define NBV_GELU_SHIFT 4.0
#define NBV_INV_SQRT_2PI 0.3989422804014327
#define NBV_GELU_A0 0.39894228040143237
#define NBV_GELU_A1 -0.0664903800668934
#define NBV_GELU_A2 0.009973557009891734
#define NBV_GELU_A3 -0.001187328214658378
#define NBV_GELU_A4 0.00011543468493616708
#define NBV_GELU_A5 -9.444650773628977e-06
#define NBV_GELU_A6 6.65961918572498e-07
#define NBV_GELU_A7 -4.12198222050074e-08
#define NBV_GELU_A8 2.269197154098137e-09
#define NBV_GELU_A9 -1.1115195290349199e-10
#define NBV_GELU_A10 4.588683298058729e-12
#define NBV_GELU_A11 -1.221609523836856e-13
#define NBV_GELU_S0 1.0000013731892734
#define NBV_GELU_S1 3.9998231839767366
#define NBV_GELU_S2 15.010268534873562
#define NBV_GELU_S3 51.6447626492768
#define NBV_GELU_S4 171.13762796189607
#define NBV_GELU_S5 314.3998337641918
#define NBV_GELU_S6 2423.2086505907187
#define NBV_GELU_S7 -10450.679775947305
#define NBV_GELU_S8 60981.61694035852
#define NBV_GELU_S9 -228077.5049498651
#define NBV_GELU_S10 252107.87454332807
#define NBV_GELU_S11 330024.0081678654
#define NBV_GELU_S12 -682115.1934164843

/* ------------------------------------------------------------ one path */
/* P: name prefix; VF (W floats), VI / VU (W int32 / uint32): float vectors;
 * VD (WD doubles), VL / VQ (WD int64 / uint64), VH (WD floats): the double
 * vectors and the float vectors they convert from; FMAF, FMAD: fused
 * multiply-add of floats / doubles (or a multiply and an add); ATTR: the
 * target attribute. */
#define NBV_DEFINE(P, VF, VI, VU, W, VD, VL, VQ, VH, WD, FMAF, FMAD, ATTR)                    \
    /* lanes of a where m is set, else of b */                                                 \
    NBV_INLINE ATTR VF P##_self(VI m, VF a, VF b) { return (VF)(((VI)a & m) | ((VI)b & ~m)); } \
    NBV_INLINE ATTR VD P##_seld(VL m, VD a, VD b) { return (VD)(((VL)a & m) | ((VL)b & ~m)); } \
                                                                                               \
    /* e^x, float. The scale 2^k is applied as two factors 2^(k>>1), 2^(k - (k>>1)): both    \
     * normal for k in [-150, 128], the first product exact, so results that overflow,      \
     * and denormal ones, are rounded once, like everything else. */                          \
    NBV_INLINE ATTR VF P##_exp(VF x) {                                                         \
        const VF one = (VF){0} + 1.0f;                                                         \
        x = P##_self((VI)(x > NBV_EXP_MAX_F), one * NBV_EXP_MAX_F, x); /* NaN stays */         \
        const VI zero_out = (VI)(x < NBV_EXP_MIN_F);                                           \
        x = P##_self(zero_out, one * 0.0f, x);                                                 \
        VF t = FMAF(x, one * NBV_LOG2E_F, one * NBV_MAGIC_F);                                  \
        VF k = t - NBV_MAGIC_F;                                                                \
        VF r = FMAF(k, one * -NBV_LN2_HI_F, x);                                                \
        r = FMAF(k, one * -NBV_LN2_LO_F, r);                                                   \
        VF q = FMAF(one * NBV_EXPF_Q4, r, one * NBV_EXPF_Q3);                                  \
        q = FMAF(q, r, one * NBV_EXPF_Q2);                                                     \
        q = FMAF(q, r, one * NBV_EXPF_Q1);                                                     \
        q = FMAF(q, r, one * NBV_EXPF_Q0);                                                     \
        VF p = FMAF(q, r * r, r) + 1.0f;                                                       \
        VU ki = (VU)t - (VU)(one * NBV_MAGIC_F); /* k, from the low bits of t */              \
        VU k1 = (VU)((VI)ki >> 1), k2 = ki - k1;                                               \
        VF s1 = (VF)((k1 + 127u) << 23), s2 = (VF)((k2 + 127u) << 23);                         \
        return P##_self(zero_out, one * 0.0f, p * s1 * s2);                                    \
    }                                                                                          \
                                                                                               \
    /* tanh(x), float: on |x|, the sign put back at the end (tanh is odd). */                  \
    NBV_INLINE ATTR VF P##_tanh(VF x) {                                                        \
        const VU sign = (VU)x & 0x80000000u;                                                   \
        const VF a = (VF)((VU)x & 0x7fffffffu), one = (VF){0} + 1.0f;                          \
        VF s = a * a;                                                                          \
        VF p = FMAF(one * NBV_TANH_P6, s, one * NBV_TANH_P5);                                  \
        p = FMAF(p, s, one * NBV_TANH_P4);                                                     \
        p = FMAF(p, s, one * NBV_TANH_P3);                                                     \
        p = FMAF(p, s, one * NBV_TANH_P2);                                                     \
        p = FMAF(p, s, one * NBV_TANH_P1);                                                     \
        p = FMAF(p, s, one * NBV_TANH_P0);                                                     \
        VF small = FMAF(a * s, p, a);                                                          \
        VF a2 = a + a;                                                                         \
        a2 = P##_self((VI)(a2 > 40.0f), one * 40.0f, a2);                                      \
        VF large = 1.0f - 2.0f / (P##_exp(a2) + 1.0f);                                         \
        VF y = P##_self((VI)(a < NBV_TANH_CUT), small, large); /* NaN: large, NaN */           \
        return (VF)((VU)y | sign);                                                             \
    }                                                                                          \
                                                                                               \
    /* e^x, double (see NBV_EXPD_*): one scale factor; 0 below -708, clamped above 708. */     \
    NBV_INLINE ATTR VD P##_expd(VD x) {                                                        \
        const VD one = (VD){0} + 1.0;                                                          \
        const VL under = (VL)(x < -708.0);                                                     \
        x = P##_seld(under, one * -708.0, x);                                                  \
        x = P##_seld((VL)(x > 708.0), one * 708.0, x);                                         \
        VD t = FMAD(x, one * NBV_LOG2E_D, one * NBV_MAGIC_D);                                  \
        VD k = t - NBV_MAGIC_D;                                                                \
        VD r = FMAD(k, one * -NBV_LN2_HI_D, x);                                                \
        r = FMAD(k, one * -NBV_LN2_LO_D, r);                                                   \
        VD q = FMAD(one * NBV_EXPD_Q9, r, one * NBV_EXPD_Q8);                                  \
        q = FMAD(q, r, one * NBV_EXPD_Q7);                                                     \
        q = FMAD(q, r, one * NBV_EXPD_Q6);                                                     \
        q = FMAD(q, r, one * NBV_EXPD_Q5);                                                     \
        q = FMAD(q, r, one * NBV_EXPD_Q4);                                                     \
        q = FMAD(q, r, one * NBV_EXPD_Q3);                                                     \
        q = FMAD(q, r, one * NBV_EXPD_Q2);                                                     \
        q = FMAD(q, r, one * NBV_EXPD_Q1);                                                     \
        q = FMAD(q, r, one * NBV_EXPD_Q0);                                                     \
        VD p = FMAD(q, r * r, r) + 1.0;                                                        \
        VQ ki = (VQ)t - (VQ)(one * NBV_MAGIC_D);                                               \
        VD y = p * (VD)((ki + 1023u) << 52);                                                   \
        return P##_seld(under, one * 0.0, y);                                                  \
    }                                                                                          \
                                                                                               \
    /* The parts of sigmoid(z), double: e = exp(-|z|), d = 1 + e; sigmoid(z) = *num / d    \
     * and 1 - sigmoid(z) = *cnum / d, without cancellation on either side. */               \
    NBV_INLINE ATTR VD P##_sigparts(VD z, VD *num, VD *cnum) {                                 \
        const VD one = (VD){0} + 1.0;                                                          \
        VD neg = (VD)((VQ)z | 0x8000000000000000u); /* -|z| */                                 \
        VD e = P##_expd(neg);                                                                  \
        VL pos = (VL)(z >= 0.0);                                                               \
        *num = P##_seld(pos, one, e);                                                          \
        *cnum = P##_seld(pos, e, one);                                                         \
        return 1.0 + e;                                                                        \
    }                                                                                          \
                                                                                               \
    /* The double-evaluated functions: x in double, the result rounded once. */               \
    NBV_INLINE ATTR VD P##_sigmoidd(VD x) {                                                    \
        VD n, c, d = P##_sigparts(x, &n, &c);                                                  \
        (void)c;                                                                               \
        return n / d;                                                                          \
    }                                                                                          \
    NBV_INLINE ATTR VD P##_silud(VD x) { /* x sigmoid(x) */                                   \
        VD n, c, d = P##_sigparts(x, &n, &c);                                                  \
        (void)c;                                                                               \
        return x * n / d;                                                                      \
    }                                                                                          \
    /* g silu'(x), silu'(x) = s (1 + x (1 - s)), s = sigmoid(x): PyTorch's form (NaN at     \
     * +-inf, as PyTorch's) */                                                                 \
    NBV_INLINE ATTR VD P##_silu_gradd(VD g, VD x) {                                            \
        VD n, c, d = P##_sigparts(x, &n, &c);                                                  \
        return g * ((n / d) * FMAD(x, c / d, (VD){0} + 1.0));                                  \
    }                                                                                          \
    NBV_INLINE ATTR VD P##_gelu_tanhd(VD x) { /* x sigmoid(z) */                              \
        VD z = x * FMAD(x * x, (VD){0} + NBV_GT_C3, (VD){0} + NBV_GT_C1);                      \
        VD n, c, d = P##_sigparts(z, &n, &c);                                                  \
        (void)c;                                                                               \
        return x * n / d;                                                                      \
    }                                                                                          \
    /* g gelu_tanh'(x), gelu_tanh'(x) = s + x s (1 - s) dz/dx, s = sigmoid(z) */              \
    NBV_INLINE ATTR VD P##_gelu_tanh_gradd(VD g, VD x) {                                       \
        const VD one = (VD){0} + 1.0, x2 = x * x;                                              \
        VD z = x * FMAD(x2, one * NBV_GT_C3, one * NBV_GT_C1);                                 \
        VD dz = FMAD(x2, one * NBV_GT_C3X3, one * NBV_GT_C1);                                  \
        VD n, c, d = P##_sigparts(z, &n, &c);                                                  \
        VD y = g * ((n / d) * FMAD(x * dz, c / d, one));                                       \
        return P##_seld((VL)(x2 >= NBV_GT_SQ_OVERFLOW), one * __builtin_nan(""), y);            \
    }                                                                                          \
                                                                                               \
    /* gelu_tanh and g gelu_tanh'(x) evaluated in float, for bf16 autocast regions only   \
     * (see above NBV_GT_SQ_OVERFLOW): the forms above, the float exp, one division. */    \
    NBV_INLINE ATTR VF P##_gelu_tanh_lowp(VF x) {                                              \
        const VF one = (VF){0} + 1.0f;                                                         \
        VF z = x * FMAF(x * x, one * (float)NBV_GT_C3, one * (float)NBV_GT_C1);                \
        VF e = P##_exp((VF)((VU)z | 0x80000000u)); /* exp(-|z|) */                             \
        VF n = P##_self((VI)(z >= 0.0f), one, e);                                              \
        return x * n / (1.0f + e);                                                             \
    }                                                                                          \
    NBV_INLINE ATTR VF P##_gelu_tanh_grad_lowp(VF g, VF x) {                                   \
        const VF one = (VF){0} + 1.0f, x2 = x * x;                                             \
        VF z = x * FMAF(x2, one * (float)NBV_GT_C3, one * (float)NBV_GT_C1);                   \
        VF dz = FMAF(x2, one * (float)NBV_GT_C3X3, one * (float)NBV_GT_C1);                    \
        VF e = P##_exp((VF)((VU)z | 0x80000000u));                                             \
        VI pos = (VI)(z >= 0.0f);                                                              \
        VF r = 1.0f / (1.0f + e);                                                              \
        VF s = P##_self(pos, one, e) * r, c = P##_self(pos, e, one) * r; /* s, 1 - s */        \
        return g * (s * FMAF(x * dz, c, one));                                                 \
    }                                                                                          \
                                                                                               \
    /* Phi(x) (see NBV_GELU_*); *pdf = phi(x) */                                               \
    NBV_INLINE ATTR VD P##_phid(VD x, VD *pdf) {                                               \
        const VD Z = {0};                                                                      \
        const VD s = x * x, u = (VD)((VQ)x & 0x7fffffffffffffffu);                             \
        *pdf = P##_expd(s * -0.5) * NBV_INV_SQRT_2PI;                                          \
        VD a = FMAD(Z + NBV_GELU_A11, s, Z + NBV_GELU_A10);                                    \
        a = FMAD(a, s, Z + NBV_GELU_A9);                                                       \
        a = FMAD(a, s, Z + NBV_GELU_A8);                                                       \
        a = FMAD(a, s, Z + NBV_GELU_A7);                                                       \
        a = FMAD(a, s, Z + NBV_GELU_A6);                                                       \
        a = FMAD(a, s, Z + NBV_GELU_A5);                                                       \
        a = FMAD(a, s, Z + NBV_GELU_A4);                                                       \
        a = FMAD(a, s, Z + NBV_GELU_A3);                                                       \
        a = FMAD(a, s, Z + NBV_GELU_A2);                                                       \
        a = FMAD(a, s, Z + NBV_GELU_A1);                                                       \
        a = FMAD(a, s, Z + NBV_GELU_A0);                                                       \
        VD small = FMAD(x, a, Z + 0.5);                                                        \
        VD w = 1.0 / (u + NBV_GELU_SHIFT);                                                     \
        VD r = FMAD(Z + NBV_GELU_S12, w, Z + NBV_GELU_S11);                                    \
        r = FMAD(r, w, Z + NBV_GELU_S10);                                                      \
        r = FMAD(r, w, Z + NBV_GELU_S9);                                                       \
        r = FMAD(r, w, Z + NBV_GELU_S8);                                                       \
        r = FMAD(r, w, Z + NBV_GELU_S7);                                                       \
        r = FMAD(r, w, Z + NBV_GELU_S6);                                                       \
        r = FMAD(r, w, Z + NBV_GELU_S5);                                                       \
        r = FMAD(r, w, Z + NBV_GELU_S4);                                                       \
        r = FMAD(r, w, Z + NBV_GELU_S3);                                                       \
        r = FMAD(r, w, Z + NBV_GELU_S2);                                                       \
        r = FMAD(r, w, Z + NBV_GELU_S1);                                                       \
        r = FMAD(r, w, Z + NBV_GELU_S0);                                                       \
        VD tail = *pdf * (w * r); /* Phi(-|x|) */                                              \
        VD large = P##_seld((VL)(x < 0.0), tail, 1.0 - tail);                                  \
        return P##_seld((VL)(u < NBV_GELU_CUT), small, large); /* NaN: large, NaN */           \
    }                                                                                          \
    NBV_INLINE ATTR VD P##_gelud(VD x) {                                                       \
        VD pdf;                                                                                \
        return x * P##_phid(x, &pdf);                                                          \
    }                                                                                          \
    NBV_INLINE ATTR VD P##_gelu_gradd(VD g, VD x) {                                            \
        VD pdf, cdf = P##_phid(x, &pdf);                                                       \
        return g * FMAD(x, pdf, cdf);                                                          \
    }                                                                                          \
                                                                                               \
    /* ---- arrays: y[i] = f(x[i * sx]) for i < n, y contiguous. Whole vectors, then the    \
     * tail in a zero-padded vector through the same function. */                            \
    NBV_INLINE ATTR VF P##_loadf(const float *x, int64_t sx, int64_t n) {                     \
        VF v = {0};                                                                            \
        if (sx == 1 && n == (W)) memcpy(&v, x, sizeof v);                                      \
        else for (int64_t l = 0; l < n; l++) v[l] = x[l * sx];                                 \
        return v;                                                                              \
    }                                                                                          \
    NBV_INLINE ATTR VD P##_loadd(const float *x, int64_t sx, int64_t n) {                     \
        VH v = {0};                                                                            \
        if (sx == 1 && n == (WD)) memcpy(&v, x, sizeof v);                                     \
        else for (int64_t l = 0; l < n; l++) v[l] = x[l * sx];                                 \
        return __builtin_convertvector(v, VD);                                                 \
    }                                                                                          \
    NBV_INLINE ATTR void P##_stored(float *y, VD v, int64_t n) {                               \
        VH h = __builtin_convertvector(v, VH);                                                 \
        if (n == (WD)) memcpy(y, &h, sizeof h);                                                \
        else for (int64_t l = 0; l < n; l++) y[l] = h[l];                                      \
    }                                                                                          \
    NBV_MAPF(P, exp, VF, W, ATTR)                                                              \
    NBV_MAPF(P, tanh, VF, W, ATTR)                                                             \
    NBV_MAPD(P, sigmoid, VD, WD, ATTR)                                                             \
    NBV_MAPD(P, silu, VD, WD, ATTR)                                                                \
    NBV_MAPD(P, gelu_tanh, VD, WD, ATTR)                                                           \
    NBV_MAPD(P, gelu, VD, WD, ATTR)                                                                \
    NBV_MAPD2(P, silu_grad, VD, WD, ATTR)                                                          \
    NBV_MAPD2(P, gelu_tanh_grad, VD, WD, ATTR)                                                     \
    NBV_MAPD2(P, gelu_grad, VD, WD, ATTR)                                                          \
    NBV_MAPF(P, gelu_tanh_lowp, VF, W, ATTR)                                                       \
    NBV_MAPF2(P, gelu_tanh_grad_lowp, VF, W, ATTR)

/* float-evaluated f: P##_f##_f32(x, sx, y, n), W elements per step */
#define NBV_MAPF(P, f, VF, W, ATTR)                                                            \
    static inline ATTR void P##_##f##_f32(const float *x, int64_t sx, float *y, int64_t n) {   \
        int64_t i = 0;                                                                         \
        for (; i + (W) <= n; i += (W)) {                                                       \
            VF v = P##_##f(P##_loadf(x + i * sx, sx, (W)));                                    \
            memcpy(y + i, &v, sizeof v);                                                       \
        }                                                                                      \
        if (i < n) {                                                                           \
            VF v = P##_##f(P##_loadf(x + i * sx, sx, n - i));                                  \
            for (int64_t l = 0; l < n - i; l++) y[i + l] = v[l];                               \
        }                                                                                      \
    }
/* float-evaluated gradient: y[i] = g[i * sg] f'(x[i * sx]), W elements per step */
#define NBV_MAPF2(P, f, VF, W, ATTR)                                                           \
    static inline ATTR void P##_##f##_f32(const float *g, int64_t sg, const float *x,          \
                                          int64_t sx, float *y, int64_t n) {                   \
        int64_t i = 0;                                                                         \
        for (; i + (W) <= n; i += (W)) {                                                       \
            VF v = P##_##f(P##_loadf(g + i * sg, sg, (W)), P##_loadf(x + i * sx, sx, (W)));    \
            memcpy(y + i, &v, sizeof v);                                                       \
        }                                                                                      \
        if (i < n) {                                                                           \
            VF v = P##_##f(P##_loadf(g + i * sg, sg, n - i), P##_loadf(x + i * sx, sx, n - i)); \
            for (int64_t l = 0; l < n - i; l++) y[i + l] = v[l];                               \
        }                                                                                      \
    }
/* double-evaluated f: P##_f##_f32(x, sx, y, n), WD elements per step. Four
 * vectors at a time while they last: one f is a long chain of dependent
 * operations (a division last), and alone it left the core waiting for it. */
#define NBV_MAPD(P, f, VD, WD, ATTR)                                                               \
    static inline ATTR void P##_##f##_f32(const float *x, int64_t sx, float *y, int64_t n) {   \
        int64_t i = 0;                                                                         \
        for (; i + 4 * (WD) <= n; i += 4 * (WD)) {                                             \
            VD v0 = P##_##f##d(P##_loadd(x + i * sx, sx, (WD)));                          \
            VD v1 = P##_##f##d(P##_loadd(x + (i + (WD)) * sx, sx, (WD)));                 \
            VD v2 = P##_##f##d(P##_loadd(x + (i + 2 * (WD)) * sx, sx, (WD)));             \
            VD v3 = P##_##f##d(P##_loadd(x + (i + 3 * (WD)) * sx, sx, (WD)));             \
            P##_stored(y + i, v0, (WD));                                                       \
            P##_stored(y + i + (WD), v1, (WD));                                                \
            P##_stored(y + i + 2 * (WD), v2, (WD));                                            \
            P##_stored(y + i + 3 * (WD), v3, (WD));                                            \
        }                                                                                      \
        for (; i < n; i += (WD)) {                                                             \
            int64_t m = n - i < (WD) ? n - i : (WD);                                           \
            P##_stored(y + i, P##_##f##d(P##_loadd(x + i * sx, sx, m)), m);                    \
        }                                                                                      \
    }
/* double-evaluated gradient: y[i] = g[i * sg] f'(x[i * sx]) */
#define NBV_MAPD2(P, f, VD, WD, ATTR)                                                              \
    static inline ATTR void P##_##f##_f32(const float *g, int64_t sg, const float *x,          \
                                          int64_t sx, float *y, int64_t n) {                   \
        int64_t i = 0;                                                                         \
        for (; i + 2 * (WD) <= n; i += 2 * (WD)) { /* two at a time, as NBV_MAPD */            \
            VD v0 = P##_##f##d(P##_loadd(g + i * sg, sg, (WD)),                            \
                                   P##_loadd(x + i * sx, sx, (WD)));                           \
            VD v1 = P##_##f##d(P##_loadd(g + (i + (WD)) * sg, sg, (WD)),                   \
                                   P##_loadd(x + (i + (WD)) * sx, sx, (WD)));                  \
            P##_stored(y + i, v0, (WD));                                                       \
            P##_stored(y + i + (WD), v1, (WD));                                                \
        }                                                                                      \
        for (; i < n; i += (WD)) {                                                             \
            int64_t m = n - i < (WD) ? n - i : (WD);                                           \
            P##_stored(y + i,                                                                  \
                       P##_##f##d(P##_loadd(g + i * sg, sg, m), P##_loadd(x + i * sx, sx, m)), \
                       m);                                                                     \
        }                                                                                      \
    }

#define NBV_MULADD(a, b, c) ((a) * (b) + (c))
NBV_DEFINE(nbv_port, nbv_f4, nbv_i4, nbv_u4, 4, nbv_d2, nbv_l2, nbv_q2, nbv_f2, 2, NBV_MULADD,
           NBV_MULADD, )
#if NBV_X86
#define NBV_AVX2_ATTR __attribute__((target("avx2,fma")))
#define NBV_AVX512_ATTR __attribute__((target("avx512f")))
NBV_DEFINE(nbv_avx2, nbv_f8, nbv_i8, nbv_u8, 8, nbv_d4, nbv_l4, nbv_q4, nbv_f4, 4, _mm256_fmadd_ps,
           _mm256_fmadd_pd, NBV_AVX2_ATTR)
NBV_DEFINE(nbv_avx512, nbv_f16, nbv_i16, nbv_u16, 16, nbv_d8, nbv_l8, nbv_q8, nbv_f8, 8,
           _mm512_fmadd_ps, _mm512_fmadd_pd, NBV_AVX512_ATTR)
#endif
#if NBV_ARM
/* NEON (every aarch64 CPU): the portable path's 128-bit vectors with the
 * multiply-adds fused (FMLA), as on AVX2 and AVX-512: the same operations
 * lane by lane, so the same bits as those paths. */
#define NBV_NEON_FMAF(a, b, c)                                                                 \
    ((nbv_f4)vfmaq_f32((float32x4_t)(c), (float32x4_t)(a), (float32x4_t)(b)))
#define NBV_NEON_FMAD(a, b, c)                                                                 \
    ((nbv_d2)vfmaq_f64((float64x2_t)(c), (float64x2_t)(a), (float64x2_t)(b)))
NBV_DEFINE(nbv_neon, nbv_f4, nbv_i4, nbv_u4, 4, nbv_d2, nbv_l2, nbv_q2, nbv_f2, 2, NBV_NEON_FMAF,
           NBV_NEON_FMAD, )
#endif

/* ------------------------------------------------------------ dispatch */
/* nbv_<f>_f32(x, sx, y, n): y[i] = f(x[i * sx]), i < n, on the path in use;
 * y contiguous, and may be x itself when sx == 1. Gradients:
 * nbv_<f>_grad_f32(g, sg, x, sx, y, n): y[i] = g[i * sg] f'(x[i * sx]). */
#if NBV_X86
#define NBV_DISPATCH(f, args)                                                                  \
    switch (nbi_vmath_current()) {                                                             \
    case NBV_AVX512: nbv_avx512_##f args; break;                                               \
    case NBV_AVX2: nbv_avx2_##f args; break;                                                   \
    default: nbv_port_##f args; break;                                                         \
    }
#elif NBV_ARM
#define NBV_DISPATCH(f, args)                                                                  \
    switch (nbi_vmath_current()) {                                                             \
    case NBV_NEON: nbv_neon_##f args; break;                                                   \
    default: nbv_port_##f args; break;                                                         \
    }
#else
#define NBV_DISPATCH(f, args) nbv_port_##f args;
#endif
#define NBV_ENTRY(f)                                                                           \
    static inline void nbv_##f##_f32(const float *x, int64_t sx, float *y, int64_t n) {        \
        NBV_DISPATCH(f##_f32, (x, sx, y, n))                                                   \
    }
#define NBV_ENTRY2(f)                                                                          \
    static inline void nbv_##f##_f32(const float *g, int64_t sg, const float *x, int64_t sx,   \
                                     float *y, int64_t n) {                                    \
        NBV_DISPATCH(f##_f32, (g, sg, x, sx, y, n))                                            \
    }
NBV_ENTRY(exp)
NBV_ENTRY(tanh)
NBV_ENTRY(sigmoid)
NBV_ENTRY(silu)
NBV_ENTRY(gelu_tanh)
NBV_ENTRY2(silu_grad)
NBV_ENTRY2(gelu_tanh_grad)
NBV_ENTRY(gelu)
NBV_ENTRY2(gelu_grad)
NBV_ENTRY(gelu_tanh_lowp)
NBV_ENTRY2(gelu_tanh_grad_lowp)

#endif
