/* gemv_internal.h: the one-row kernels' paths, shared by gemv.c (AVX-512,
 * and the entry points of gemm_internal.h) and gemv_avx2.c (AVX2+FMA).
 * Arguments as in gemm_internal.h's nbi_gemv_* and nbi_vecmat_f32; the
 * callers have checked the path (these run AVX2+FMA instructions). */
#ifndef NABLA_GEMV_INTERNAL_H
#define NABLA_GEMV_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

/* Whether to warm the next block of 16 rows of row stride ldw_bytes while
 * one is read: a block fits in half the L2 (read at run time). */
bool nbi_gemv_prefetching(int64_t ldw_bytes);
/* Rows of W to prefetch ahead in the x W form, `bytes` read per row. */
int64_t nbi_vecmat_ahead(int64_t bytes);

#if defined(__x86_64__) || defined(__i386__)
void nbi_gemv_f32_avx2(int64_t N, int64_t K, const float *w, int64_t ldw, const float *x,
                       float *y, int64_t sy);
/* bf16 W widened to f32, x the pairs' bf16 values widened: one FMA per k,
 * gemm_bf16.c's f32 fallbacks' chain (AVX-512F without BF16 and AVX2). */
void nbi_gemv_bf16_avx2(int64_t N, int64_t K, const uint16_t *w, int64_t ldw,
                        const uint32_t *xp, float *y, int64_t sy);
void nbi_vecmat_f32_avx2(int64_t N, int64_t K, const float *w, int64_t ldw, const float *x,
                         float *y);
#endif
#if defined(__aarch64__)
/* arch/arm/gemv_neon.c: NEON FMA chains, one per output in k order. */
void nbi_gemv_f32_neon(int64_t N, int64_t K, const float *w, int64_t ldw, const float *x,
                       float *y, int64_t sy);
void nbi_vecmat_f32_neon(int64_t N, int64_t K, const float *w, int64_t ldw, const float *x,
                         float *y);
#endif

#endif
