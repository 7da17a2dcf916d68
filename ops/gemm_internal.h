/* gemm_internal.h: the matrix-multiply kernel behind nb_matmul.
 *
 * C (M,N) = A (M,K) * B (K,N), one matrix, every operand addressed through
 * element strides (transposed, expanded and narrowed views are read in place).
 * Each c[i][j] is the sum over k = 0, 1, ..., K-1 in that order, starting from
 * 0 and accumulated in the dtype (with fused multiply-adds when the path has
 * them), so the result does not depend on blocking, tiling or threads; it may
 * depend on the instruction-set path, which is chosen once per process
 * (x86-64: AVX-512, AVX2+FMA or portable; aarch64: SVE, NEON or portable,
 * all three with the same bits). K == 0 writes zeros. */
#ifndef NABLA_GEMM_INTERNAL_H
#define NABLA_GEMM_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

/* Packing buffers, kept across the calls of one batched product; start it
 * zeroed ({0}) and release it with nbi_gemm_ws_free (which keeps the last
 * released buffer for the next product, see gemm.c). */
typedef struct nbi_gemm_ws {
    void *buf;
    size_t cap; /* bytes */
} nbi_gemm_ws;

void nbi_gemm_ws_free(nbi_gemm_ws *ws);
/* At least n bytes at ws->buf, 64-byte aligned, taken from the kept buffers
 * when one is large enough (gemm.c and gemm_bf16.c share them); 0, or -1 when
 * out of memory. */
int nbi_gemm_ws_reserve(nbi_gemm_ws *ws, size_t n);

/* a: element (i,k) at a[i*sam + k*sak]; b: (k,j) at b[k*sbk + j*sbn];
 * c: (i,j) at c[i*scm + j*scn], fully overwritten. Returns 0, or -1 when the
 * packing buffers cannot be allocated (c is then left unspecified). */
int nbi_gemm_f32(nbi_gemm_ws *ws, int64_t M, int64_t N, int64_t K, const float *a, int64_t sam,
                 int64_t sak, const float *b, int64_t sbk, int64_t sbn, float *c, int64_t scm,
                 int64_t scn);
int nbi_gemm_f64(nbi_gemm_ws *ws, int64_t M, int64_t N, int64_t K, const double *a,
                 int64_t sam, int64_t sak, const double *b, int64_t sbk, int64_t sbn, double *c,
                 int64_t scm, int64_t scn);

/* The instruction-set path: NBI_GEMM_AUTO picks the best the CPU supports
 * (the default); tests and benchmarks may force one. Returns the path in use
 * after the call: a forced path above the CPU's best gives the best, a path
 * of another architecture the portable one. SVE runs where the CPU has SVE
 * with a vector length of 16, 32 or 64 bytes (the calling thread's: another
 * length runs NEON). */
enum {
    NBI_GEMM_AUTO = -1,
    NBI_GEMM_PORTABLE = 0,
    NBI_GEMM_AVX2 = 1,   /* x86-64 */
    NBI_GEMM_AVX512 = 2, /* x86-64 */
    NBI_GEMM_NEON = 3,   /* aarch64 */
    NBI_GEMM_SVE = 4,    /* aarch64 */
};
int nbi_gemm_path(int force);
/* The path in use, unchanged. */
int nbi_gemm_path_now(void);

/* bf16: C (M,N) f32 = A (M,K) * B (K,N) with both operands in bf16 and f32
 * accumulation (gemm_bf16.c). An operand is bf16 (uint16_t) data, or f32 data
 * rounded to bf16 (nbi_bf16_from_f32) as it is packed (a_f32 / b_f32 = 1):
 * what autocast uses, so no cast copy is ever made. Strides in elements, any
 * layout (transposed, expanded with stride 0, narrowed views). c fully
 * overwritten (K == 0: zeros). Each c[i][j] depends only on row i of A, column
 * j of B and the path: never on M, N, the position of (i,j) in a tile, the
 * blocking, or which part of C a call computes. 0, or -1 when the packing
 * buffers cannot be allocated. */
int nbi_gemm_bf16(nbi_gemm_ws *ws, int64_t M, int64_t N, int64_t K,
                  const void *a, int a_f32, int64_t sam, int64_t sak,
                  const void *b, int b_f32, int64_t sbk, int64_t sbn,
                  float *c, int64_t scm, int64_t scn);
/* The path nbi_gemm_bf16 takes now (from nbi_isa, tensor/cpu_internal.h):
 * NBI_ISA_AVX512BF16 (vdpbf16ps), or the f32-FMA path it falls to
 * (NBI_ISA_AVX512, NBI_ISA_AVX2, NBI_ISA_PORTABLE). */
int nbi_gemm_bf16_path(void);

/* Cache blocks (gemm.c): a path's register tile (mr rows x nr columns) and
 * its blocks kc (k steps), mc (rows), nc (columns), derived from a CPU's
 * caches (tensor/cpu_internal.h; fields 0 = not known) for elements of
 * elem_bytes; a pure function. nbi_gemm_blocks_of: the tile and blocks
 * nbi_gemm_f32 (f64 = 0) or nbi_gemm_f64 (f64 = 1) use now. */
typedef struct nbi_gemm_blocks {
    int mr, nr;
    int64_t kc, mc, nc;
} nbi_gemm_blocks;
struct nbi_cpu;
nbi_gemm_blocks nbi_gemm_blocking(const struct nbi_cpu *cpu, int mr, int nr, int elem_bytes);
nbi_gemm_blocks nbi_gemm_blocks_of(int f64);
/* Tests and benchmarks: the current path's blocks for f32 (f64 = 0) or f64
 * set to b's kc, mc, nc (mc, nc rounded up to the tile), or derived again
 * when b is NULL; not thread-safe against running products. 0, or -1 when
 * a block is < 1. */
int nbi_gemm_blocks_force(int f64, const nbi_gemm_blocks *b);
/* The rows of A's block (at most b->mc, a multiple of b->mr) when A is read
 * in place: rows of A a stride apart (at = 0), or rows of A^T (at = 1), so
 * that the stride does not put more of its lines in one L2 set than the
 * block's share of ways; base: the block's first byte's offset within a line;
 * M: the product's rows (b->mc when they fit). A function of the CPU's L2
 * and these, remembered per thread. */
int64_t nbi_gemm_mc_in_place(const struct nbi_cpu *cpu, const nbi_gemm_blocks *b,
                             int elem_bytes, int at, int64_t stride, int64_t base, int64_t M);

/* Matrix-vector products (gemv.c, gemv_avx2.c): y[j*sy] = sum over k of
 * w[j*ldw + k] x[k] for j < N, with the bits of the general kernel's path
 * (nbi_gemm_f32 / nbi_gemm_bf16 on a (1,K) x (K,N) or (N,K) x (K,1)
 * product), W streamed in place instead of packed. x contiguous; for bf16,
 * x as pairs (word p = bf16 x[2p] | x[2p+1] << 16, nbi_gemv_pairs: bf16
 * data, or f32 rounded). nbi_vecmat_f32: the other layout, y[j] = sum over
 * k of x[k] w[k*ldw + j] for j < N (x (1,K) times a W (K,N) with rows
 * contiguous: attention's weights times V), y contiguous. Return 0, or 1
 * when this CPU path has no such kernel (nothing written: use the general
 * one). Paths: AVX-512 and AVX2+FMA for f32 (gemm.c's path in use), and
 * for bf16 AVX512_BF16 or the f32 fallbacks' AVX-512F / AVX2 (gemm_bf16.c's
 * path in use). nbi_gemv_available: whether they would run (bf16 = 1: the
 * bf16 one; nbi_vecmat_f32 runs where the f32 one does). */
int nbi_gemv_f32(int64_t N, int64_t K, const float *w, int64_t ldw, const float *x, float *y,
                 int64_t sy);
int nbi_gemv_bf16(int64_t N, int64_t K, const uint16_t *w, int64_t ldw, const uint32_t *xp,
                  float *y, int64_t sy);
int nbi_vecmat_f32(int64_t N, int64_t K, const float *w, int64_t ldw, const float *x, float *y);
void nbi_gemv_pairs(int64_t K, const void *x, int x_f32, int64_t sx, uint32_t *xp);
int nbi_gemv_available(int bf16);

#endif
