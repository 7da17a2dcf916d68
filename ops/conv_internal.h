/* conv_internal.h: the Winograd convolutions of conv_winograd.c, which
 * conv.c uses for the f32 convolutions they fit. */
#ifndef NABLA_CONV_INTERNAL_H
#define NABLA_CONV_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

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
