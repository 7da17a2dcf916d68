/* conv_internal.h: what conv.c shares with the kernels of one architecture
 * (ops/arch/x86/): the conv's geometry, the im2col helpers' AVX-512 forms,
 * and the Winograd convolutions (ops/arch/x86/conv_winograd.c), which conv.c
 * uses for the f32 convolutions they fit. */
#ifndef NABLA_CONV_INTERNAL_H
#define NABLA_CONV_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

/* The geometry of one conv in its 2-d form, kept in nbi_node.i (16 slots). */
typedef struct {
    int64_t N, C, H, W;   /* input (N, C, H, W) */
    int64_t O, KH, KW;    /* weight (O, C/G, KH, KW) */
    int64_t OH, OW;       /* output (N, O, OH, OW) */
    int64_t sh, sw, ph, pw, dh, dw; /* stride, leading pad, dilation */
    int64_t G;            /* groups */
} nbi_conv_geom;

/* The pixels [*a, *b) of an output row (ow = 0..OW-1) whose input column
 * iw = ow * s + off lies inside [0, W) (conv.c). */
void nbi_conv_valid_cols(int64_t OW, int64_t s, int64_t off, int64_t W, int64_t *a, int64_t *b);

/* AVX-512 forms of conv.c's im2col / col2im for rows of unit stride (s == 1
 * and a unit input stride) and of the bias gradient's per-channel sum
 * (ops/arch/x86/conv_avx512.c; x86-64 only, called when the path is AVX-512
 * or better). Arguments as conv.c's generic forms: the same values.
 * nbi_conv_bias_sum_f32_avx512: the sum over n < N and pixels p < P of
 * gy[n*sn + p], as 8 chains of doubles (pixel p in chain p % 8, rows in
 * order), the chains added 0..7: the generic loop's additions. */
void nbi_im2col_f32_avx512(const nbi_conv_geom *g, const float *xn, const int64_t *xs, int64_t k0,
                           int64_t k1, int64_t p0, int64_t p1, float *col, int64_t ld);
void nbi_col2im_f32_avx512(const nbi_conv_geom *g, float *gxn, int64_t p0, int64_t p1,
                           const float *col, int64_t ld);
void nbi_col2im_f32_rows_avx512(const nbi_conv_geom *g, float *gxn, const float *col, int64_t ld);
double nbi_conv_bias_sum_f32_avx512(const float *gy, int64_t N, int64_t sn, int64_t P);

/* A stride-1, undilated, ungrouped conv with an r x r kernel (r = 3 or 5):
 * x (N,C,H,W), w (O,C,r,r) -> y (N,O,OH,OW), ph/pw leading zero pad (the
 * trailing pad is what OH, OW imply). */
typedef struct {
    int64_t N, C, H, W, O, r, OH, OW, ph, pw;
} nbi_wino_geom;

/* Whether the Winograd kernels run here: an AVX-512 CPU, and NABLA_WINOGRAD
 * not set to 0 (read once per process). */
bool nbi_wino_enabled(void);
/* Tests: 1 turns the Winograd kernels on (where the CPU has them), 0 off,
 * -1 back to NABLA_WINOGRAD's choice; returns the previous setting. */
int nbi_wino_force(int on);
/* Whether g is a conv they compute: r 3 or 5, 0 <= ph, pw <= r - 1 (so the
 * input gradient is such a conv too), at least 16 input and 16 output
 * channels (a vector holds 16), non-empty, and buffers whose sizes fit
 * int64 with room to spare (not so for tensors of 2^55 channels read
 * through stride 0, which conv.c's im2col path refuses as out of memory). */
bool nbi_wino_fits(const nbi_wino_geom *g);

/* y (N,O,OH,OW), contiguous = conv of x and w, + b[o * bs] when b; element
 * (i0,i1,i2,i3) of x at x[sum i_d xs[d]], of w at w[sum i_d ws[d]] (any
 * strides, negative too: the input gradient reads w flipped and transposed
 * in place). 0: done; 1: a result was not finite, or the work buffers could
 * not be had: y is unspecified and the caller computes it another way
 * (which also gives torch's infinities where Winograd's sums of
 * differences would give NaN); never an error of its own. */
int nbi_wino_conv(const nbi_wino_geom *g, const float *x, const int64_t xs[4], const float *w,
                  const int64_t ws[4], const float *b, int64_t bs, float *y);

/* gw (O,C,r,r), contiguous = the weight gradient of the conv g for x
 * (N,C,H,W) and gy (N,O,OH,OW) (strides as above). Returns as above. */
int nbi_wino_weight_grad(const nbi_wino_geom *g, const float *x, const int64_t xs[4],
                         const float *gy, const int64_t gs[4], float *gw);

#endif
