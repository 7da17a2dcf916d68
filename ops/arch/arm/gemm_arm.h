/* gemm_arm.h: the aarch64 micro-kernels of ops/gemm.c's f32 and f64 paths
 * (gemm_neon.c: Advanced SIMD; gemm_sve.c: SVE, built for armv8.2-a+sve and
 * called only where the CPU has SVE).
 *
 * Each is a KERN of gemm.c's GEMM_DRIVER: c (MR = 8 rows, or 4 when half;
 * nv vectors of columns, nv = 1..3, row stride ldc) = (load ? c : 0) + the
 * sum over k < kc of a[r,k] b[k,:], one fused multiply-add per element per
 * k, in k order, so the bits are those of every other tile shape and of
 * the portable path's contracted multiply-adds. b: a packed panel, row k at
 * b + k*nv*W; a: element (r,k) at a[r*ars + k*aks] with ars == 1, or at
 * a[r*ars + k] when arow; a half tile reads and writes only rows r0 <= r < r1
 * of c. W: 4 (f32) or 2 (f64) for NEON; svcntw() or svcntd() for SVE, whose
 * kernels are vector-length agnostic (gemm.c instantiates its packing for
 * the vector lengths it knows and asks nbi_gemm_sve_bytes which runs). */
#ifndef NABLA_OPS_ARCH_ARM_GEMM_ARM_H
#define NABLA_OPS_ARCH_ARM_GEMM_ARM_H

#include <stdint.h>

#if defined(__aarch64__)
void nbi_gemm_f32_neon_kern(int half, int nv, int arow, int64_t kc, const float *a, int64_t ars,
                            int64_t aks, const float *b, float *c, int64_t ldc, int load, int r0,
                            int r1);
void nbi_gemm_f64_neon_kern(int half, int nv, int arow, int64_t kc, const double *a,
                            int64_t ars, int64_t aks, const double *b, double *c, int64_t ldc,
                            int load, int r0, int r1);
void nbi_gemm_f32_sve_kern(int half, int nv, int arow, int64_t kc, const float *a, int64_t ars,
                           int64_t aks, const float *b, float *c, int64_t ldc, int load, int r0,
                           int r1);
void nbi_gemm_f64_sve_kern(int half, int nv, int arow, int64_t kc, const double *a,
                           int64_t ars, int64_t aks, const double *b, double *c, int64_t ldc,
                           int load, int r0, int r1);
/* The SVE vector length of the calling thread, in bytes (SVE CPUs only). */
int nbi_gemm_sve_bytes(void);
#endif

#endif
