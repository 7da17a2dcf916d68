/* gemm_bf16_neon.h: the BFMMLA pieces of the bf16 matrix multiply on
 * aarch64 (gemm_bf16_neon.c), called by ops/gemm_bf16.c's driver (its
 * blocking, its operand reading) and by ops/gemv.c's bf16 gemv.
 *
 * BFMMLA multiplies a 2 x 4 block of A (two rows, four k) by a 4 x 2 block
 * of B (four k, two columns) into a 2 x 2 block of f32 sums. Its packed
 * layout, for A (lanes = rows) and B (lanes = columns) alike: a panel of w
 * lanes (w even) holds, for each group g of four k (4g .. 4g+3), w/2 blocks
 * of 8 bf16, lane pair q's block at bf16 element g*4w + 8q:
 *
 *   lane 2q   k = 4g, 4g+1, 4g+2, 4g+3,  lane 2q+1  k = 4g .. 4g+3
 *
 * zero past the operand's lanes and past its last k (K is padded to a
 * multiple of 4 with zeros in both operands). Each c[i][j] is one chain of
 * BFMMLA steps over the groups in increasing order from +0 (each step adds
 * its four products as two BFDOT-like pairs, architecturally: products
 * rounded to odd and summed, subnormals flushed, the default NaN), the same
 * for every (i, j), so the bits depend on row i of A and column j of B only:
 * never on the tile, M, N, the blocking (k blocks are whole groups; the tile
 * is stored and reloaded between them, exactly) or the thread. */
#ifndef NABLA_GEMM_BF16_NEON_H
#define NABLA_GEMM_BF16_NEON_H

#include <stdint.h>

/* Register tile: 8 rows x 12 columns, 4 x 6 BFMMLA blocks. */
#define NBI_MMLA_MR 8
#define NBI_MMLA_NR 12

/* 1 when the library was compiled with the BFMMLA kernels (aarch64 with a
 * compiler that has the bf16 intrinsics), else 0: the callers then take the
 * f32 fallback whatever the CPU has. */
int nbi_mmla_compiled(void);

/* Packs lanes [0, n) and k [0, kc) of an operand, element (j, k) at
 * p[j*sj + k*sk] (bf16 bits, or f32 rounded to bf16 when f32 = 1), into
 * panels of w lanes (w even), panel q at dst + q*ps 32-bit words, each
 * (kc + 3) / 4 groups deep. */
void nbi_mmla_pack(const void *p, int f32, int64_t sj, int64_t sk, int64_t n, int w, int64_t ps,
                   int64_t kc, void *dst);

/* c (mc x nc, strides scm, scn) = (load ? c : 0) + the product of a packed
 * block of A (mc rows, panels of NBI_MMLA_MR every psa words) and one of B
 * (nc columns, panels of NBI_MMLA_NR every psb words), kg groups deep. */
void nbi_mmla_block(int64_t mc, int64_t nc, int64_t kg, const void *pa, int64_t psa,
                    const void *pb, int64_t psb, float *c, int64_t scm, int64_t scn, int load);

/* The bf16 gemv with the bits of nbi_mmla_block: y[j*sy] = sum over k of
 * w[j*ldw + k] x[k] for j < N, x as bf16 pairs (gemm_internal.h's
 * nbi_gemv_bf16), W read in place. */
void nbi_mmla_gemv(int64_t N, int64_t K, const uint16_t *w, int64_t ldw, const uint32_t *xp,
                   float *y, int64_t sy);

#endif
