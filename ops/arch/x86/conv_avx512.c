/* conv_avx512.c: the AVX-512 forms of conv.c's im2col, col2im and bias
 * gradient sum (declared in ops/conv_internal.h, which says what each
 * computes). Each gives the generic loop's values: copies are copies, and
 * sums add the same terms in the same order. x86-64 only. */
#include "../../conv_internal.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#include <stdbool.h>
#include <stdint.h>

#define C512 __attribute__((target("avx512f")))

/* im2col_float for rows of unit stride (sw * xs[2] == 1) with AVX-512: a
 * run of an output row is at most a few 16-lane masked loads and stores
 * (lanes outside the input read nothing, masked loads do not fault), where
 * the generic loop pays a short copy and two zero fills per run of OW
 * (14 in the Fashion network's second conv). The same values. */
C512 void nbi_im2col_f32_avx512(const nbi_conv_geom *g, const float *xn, const int64_t *xs,
                                   int64_t k0, int64_t k1, int64_t p0, int64_t p1, float *col,
                                   int64_t ld) {
    int64_t kk = g->KH * g->KW;
    for (int64_t r = k0; r < k1; r++) {
        int64_t c = r / kk, kh = r % kk / g->KW, kw = r % g->KW;
        int64_t off = kw * g->dw - g->pw, a, b;
        nbi_conv_valid_cols(g->OW, 1, off, g->W, &a, &b);
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
C512 void nbi_col2im_f32_avx512(const nbi_conv_geom *g, float *gxn, int64_t p0, int64_t p1,
                                   const float *col, int64_t ld) {
    int64_t kk = g->KH * g->KW, Kc = g->C / g->G * kk;
    for (int64_t r = 0; r < Kc; r++) {
        int64_t c = r / kk, kh = r % kk / g->KW, kw = r % g->KW;
        int64_t off = kw * g->dw - g->pw, a, b;
        nbi_conv_valid_cols(g->OW, 1, off, g->W, &a, &b);
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
C512 void nbi_col2im_f32_rows_avx512(const nbi_conv_geom *g, float *gxn, const float *col,
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

/* The bias gradient's generic sum (conv.c, bgrad_sum_float) with its 8
 * chains as the lanes of one register: the same additions in the same
 * order (gcc keeps the scalar loop scalar: 1 ms of the Fashion step). */
C512 double nbi_conv_bias_sum_f32_avx512(const float *gy, int64_t N, int64_t sn, int64_t P) {
    __m512d acc = _mm512_setzero_pd();
    double tail[8] = {0};
    for (int64_t n = 0; n < N; n++) {
        const float *r = gy + n * sn;
        int64_t q = 0;
        for (; q + 8 <= P; q += 8) acc = _mm512_add_pd(acc, _mm512_cvtps_pd(_mm256_loadu_ps(r + q)));
        if (q < P) { /* pixels q.. go to chains 0.. as in the scalar loop, since 8 | q */
            _mm512_storeu_pd(tail, acc);
            for (; q < P; q++) tail[q % 8] += (double)r[q];
            acc = _mm512_loadu_pd(tail);
        }
    }
    _mm512_storeu_pd(tail, acc);
    double v = 0;
    for (int l = 0; l < 8; l++) v += tail[l];
    return v;
}
#endif
