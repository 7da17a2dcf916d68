/* test_sizes.c: every size argument of the ops at its edges (issue 38):
 * 0, -1, INT64_MAX, INT64_MIN and values whose sums or products pass
 * int64, for conv1d / conv2d (stride, padding, dilation, groups, the
 * weight's kernel and channel sizes), pooling (kernel, stride, padding),
 * nb_narrow, nb_select, nb_expand, nb_view / nb_reshape, nb_arange,
 * nb_empty / nb_full, nb_positional_encoding, nb_tril_mask, nb_topk, nb_multinomial, nb_cat /
 * nb_stack, reductions and nb_print over an empty dim of INT64_MAX, and
 * the conv modules' init.
 *
 * One table: each call either returns PyTorch's result (its shape, and its
 * values against the same computation made with ordinary arguments) or is
 * refused with a message naming the function, the argument and its value.
 * make asan runs it under AddressSanitizer and UndefinedBehaviorSanitizer
 * (which aborts on the first finding there, so a signed overflow fails the
 * case). Calls that would allocate more than a sanitizer allows (a valid
 * conv with a 2^40-element output) are not here: an allocation that fails
 * is an error message, tested in test_errors.c.
 *
 * Then the backward of the conv geometries whose index arithmetic came
 * near INT64_MAX, the gradient of max pooling on NaN ties, and the modules.
 * Where PyTorch's answer is said, it is torch's formula computed exactly
 * (torch's own int64 arithmetic wraps for some of these arguments).
 * Which cases failed before their fix is in the commit messages of
 * issue 38's sweep. */
#include "test_util.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MX INT64_MAX
#define MN INT64_MIN
#define SAME NB_PADDING_SAME
#define P61 ((int64_t)1 << 61)
#define P62 ((int64_t)1 << 62)
#define CK_OK(expr) ck_assert_msg((expr) == 0, "%s", nb_last_error() ? nb_last_error() : "?")

/* ------------------------------------------------------------ inputs */
static nb_tensor *randn(nb_dtype dt, uint64_t seed, int ndim, const int64_t *shape) {
    nb_rng r;
    nb_rng_seed(&r, seed);
    return nb_randn(dt, ndim, shape, &r);
}
/* conv1d / max_pool1d input (2, 4, 10) and weight (6, 4, 3) */
static nb_tensor *x1(void) { return randn(NB_F32, 1, NB_SHAPE(2, 4, 10)); }
static nb_tensor *w1(void) { return randn(NB_F32, 2, NB_SHAPE(6, 4, 3)); }
static nb_tensor *x1d(void) { return randn(NB_F64, 1, NB_SHAPE(2, 4, 10)); }
static nb_tensor *w1d(void) { return randn(NB_F64, 2, NB_SHAPE(6, 4, 3)); }
/* the same values laid out (2, 10, 4) in memory: L read with stride 4 */
static nb_tensor *x1t(void) {
    return nb_transpose(nb_contiguous(nb_transpose(x1(), 1, 2)), 1, 2);
}
/* conv2d / pool2d input (2, 4, 6, 6) and weight (6, 4, 3, 3) */
static nb_tensor *x2(void) { return randn(NB_F32, 3, NB_SHAPE(2, 4, 6, 6)); }
static nb_tensor *w2(void) { return randn(NB_F32, 4, NB_SHAPE(6, 4, 3, 3)); }
static nb_tensor *x2d(void) { return randn(NB_F64, 3, NB_SHAPE(2, 4, 6, 6)); }
static nb_tensor *w2d(void) { return randn(NB_F64, 4, NB_SHAPE(6, 4, 3, 3)); }
static nb_tensor *x2t(void) { /* W read with stride 6 */
    return nb_transpose(nb_contiguous(nb_transpose(x2d(), 2, 3)), 2, 3);
}
static nb_tensor *b6(void) { return nb_arange(NB_F32, 6); }
/* a (3, 4) for the views, probabilities (3, 4) for multinomial */
static nb_tensor *a34(void) { return randn(NB_F32, 5, NB_SHAPE(3, 4)); }
static nb_tensor *probs(void) { return nb_abs(a34()); }
static const int64_t *i2(int64_t a, int64_t b) {
    static _Thread_local int64_t v[4][2];
    static _Thread_local int k;
    int64_t *p = v[k++ % 4];
    p[0] = a;
    p[1] = b;
    return p;
}
/* tap k of w1's kernel as a kernel of size 1 (conv with a dilation that
 * puts every other tap in the padding) */
static nb_tensor *w1_tap(int64_t k) { return nb_narrow(w1(), 2, k, 1); }
static nb_tensor *w1d_tap(int64_t k) { return nb_narrow(w1d(), 2, k, 1); }

/* ------------------------------------------------------------- calls */
#define CALL(name, expr) \
    static nb_tensor *name(void) { return (expr); }

/* conv1d: item 1 of issue 38 (one window, all in the padding) */
CALL(c1_smax_p5, nb_conv1d(x1(), w1(), NULL, MX, 5, 1, 1))
CALL(c1_smax_p5_d, nb_conv1d(x1d(), w1d(), NULL, MX, 5, 1, 1))
CALL(c1_smax_p5_t, nb_conv1d(x1t(), w1(), NULL, MX, 5, 1, 1))
CALL(c1_smax_p5_b, nb_conv1d(x1(), w1(), b6(), MX, 5, 1, 1))
CALL(zeros_2_6_1, nb_zeros(NB_F32, NB_SHAPE(2, 6, 1)))
CALL(zeros_2_6_1_d, nb_zeros(NB_F64, NB_SHAPE(2, 6, 1)))
CALL(bias_2_6_1, nb_expand(nb_view(b6(), NB_SHAPE(1, 6, 1)), NB_SHAPE(2, 6, 1)))
/* one window at the start: the first 3 columns */
CALL(c1_smax_p0, nb_conv1d(x1(), w1(), NULL, MX, 0, 1, 1))
CALL(c1_first3, nb_conv1d(nb_narrow(x1(), 2, 0, 3), w1(), NULL, 1, 0, 1, 1))
CALL(c1_smax_p0_t, nb_conv1d(x1t(), w1(), NULL, MX, 0, 1, 1))
/* a padding whose padded size is INT64_MAX - 1 exactly, one window */
CALL(c1_smax_pbig, nb_conv1d(x1(), w1(), NULL, MX, (MX - 11) / 2, 1, 1))
CALL(c1_smax_p1e15_t, nb_conv1d(x1t(), w1(), NULL, MX, 1000000000000000, 1, 1))
/* a padding and dilation of 2^61: only the middle tap meets the input */
CALL(c1_d61_p61, nb_conv1d(x1(), w1(), NULL, 1, P61, P61, 1))
CALL(c1_tap1, nb_conv1d(x1(), w1_tap(1), NULL, 1, 0, 1, 1))
CALL(c1_d61_p61_d, nb_conv1d(x1d(), w1d(), NULL, 1, P61, P61, 1))
CALL(c1_tap1_d, nb_conv1d(x1d(), w1d_tap(1), NULL, 1, 0, 1, 1))
CALL(c1_d61_p61_t, nb_conv1d(x1t(), w1(), NULL, 1, P61, P61, 1))
/* "same" with dilation 2^61: the total pad is 2^62, the middle tap again */
CALL(c1_same_d61, nb_conv1d(x1(), w1(), NULL, 1, SAME, P61, 1))
/* the value of NB_PADDING_SAME is "same"; -1 is an error (item 13) */
CALL(c1_same, nb_conv1d(x1(), w1(), NULL, 1, SAME, 1, 1))
CALL(c1_p1, nb_conv1d(x1(), w1(), NULL, 1, 1, 1, 1))
CALL(c1_pm1, nb_conv1d(x1(), w1(), NULL, 1, -1, 1, 1))
CALL(c1_pminp1, nb_conv1d(x1(), w1(), NULL, 1, MN + 1, 1, 1))
CALL(c1_pmax, nb_conv1d(x1(), w1(), NULL, 1, MX, 1, 1))
CALL(c1_phalf, nb_conv1d(x1(), w1(), NULL, MX, MX / 2, 1, 1))
CALL(c1_dmax, nb_conv1d(x1(), w1(), NULL, 1, 0, MX, 1))
CALL(c1_dhalf, nb_conv1d(x1(), w1(), NULL, 1, 0, MX / 2, 1))
CALL(c1_same_dhalf, nb_conv1d(x1(), w1(), NULL, 1, SAME, MX / 2, 1))
CALL(c1_same_empty, nb_conv1d(nb_zeros(NB_F32, NB_SHAPE(2, 4, 0)), w1(), NULL, 1, SAME, 1, 1))
CALL(c1_d0, nb_conv1d(x1(), w1(), NULL, 1, 0, 0, 1))
CALL(c1_dmin, nb_conv1d(x1(), w1(), NULL, 1, 0, MN, 1))
CALL(c1_s0, nb_conv1d(x1(), w1(), NULL, 0, 0, 1, 1))
CALL(c1_sm1, nb_conv1d(x1(), w1(), NULL, -1, 0, 1, 1))
CALL(c1_smin, nb_conv1d(x1(), w1(), NULL, MN, 0, 1, 1))
CALL(c1_g0, nb_conv1d(x1(), w1(), NULL, 1, 0, 1, 0))
CALL(c1_gmin, nb_conv1d(x1(), w1(), NULL, 1, 0, 1, MN))
CALL(c1_gmax, nb_conv1d(x1(), w1(), NULL, 1, 0, 1, MX))
/* a kernel of 2^62 taps read through stride 0: its column buffer would
 * need more bytes than size_t holds */
CALL(c1_kernel62,
     nb_conv1d(randn(NB_F32, 6, NB_SHAPE(1, 1, 1)),
               nb_expand(nb_ones(NB_F32, NB_SHAPE(1, 1, 1)), NB_SHAPE(1, 1, P62)), NULL, MX,
               P61, 1, 1))
/* 16 images of 2^55 channels read through stride 0, a 3x3 kernel: a conv
 * Winograd's kernels take (conv_winograd.c) but whose packed input would
 * hold 2^63 elements; the column buffer of im2col needs more bytes than
 * size_t holds */
static nb_tensor *ones_as(int64_t a, int64_t b, int64_t c, int64_t d) {
    return nb_expand(nb_ones(NB_F32, NB_SHAPE(1, 1, 1, 1)), NB_SHAPE(a, b, c, d));
}
CALL(c2_channels55, nb_conv2d(ones_as(16, (int64_t)1 << 55, 1, 1),
                              ones_as(16, (int64_t)1 << 55, 3, 3), NULL, NULL, i2(1, 1), NULL, 1))
/* no input channels, groups 4, a weight of 2^62 channels per group: their
 * product (the channels it expects) passes int64 */
CALL(c2_cg_overflow, nb_conv2d(nb_zeros(NB_F32, NB_SHAPE(1, 0, 5, 5)),
                               nb_empty(NB_F32, NB_SHAPE(0, P62, 1, 1)), NULL, NULL, NULL, NULL,
                               4))
/* no channels at all and groups INT64_MAX: an empty result, as torch */
CALL(c2_groups_max_empty, nb_conv2d(nb_zeros(NB_F32, NB_SHAPE(2, 0, 5, 5)),
                                    nb_zeros(NB_F32, NB_SHAPE(0, 0, 3, 3)), NULL, NULL, NULL,
                                    NULL, MX))
CALL(zeros_2_0_3_3, nb_zeros(NB_F32, NB_SHAPE(2, 0, 3, 3)))

/* conv2d */
CALL(c2_pmax, nb_conv2d(x2(), w2(), NULL, NULL, i2(MX, MX), NULL, 1))
CALL(c2_pmax_w, nb_conv2d(x2(), w2(), NULL, NULL, i2(0, MX), NULL, 1))
CALL(c2_pm1_w, nb_conv2d(x2(), w2(), NULL, NULL, i2(0, -1), NULL, 1))
CALL(c2_same_w_only, nb_conv2d(x2(), w2(), NULL, NULL, i2(0, SAME), NULL, 1))
CALL(c2_same_5, nb_conv2d(x2(), w2(), NULL, NULL, i2(SAME, 5), NULL, 1))
CALL(c2_same_same, nb_conv2d(x2(), w2(), NULL, NULL, i2(SAME, SAME), NULL, 1))
CALL(c2_p11, nb_conv2d(x2(), w2(), NULL, NULL, i2(1, 1), NULL, 1))
CALL(c2_smax_p1e15, nb_conv2d(x2(), w2(), NULL, i2(MX, MX), i2(1000000000000000, 1000000000000000),
                              NULL, 1))
CALL(zeros_2_6_1_1, nb_zeros(NB_F32, NB_SHAPE(2, 6, 1, 1)))
CALL(c2_smax_p1e15_t, nb_conv2d(x2t(), w2d(), NULL, i2(MX, MX), i2(1000000000000000, 5), NULL, 1))
CALL(zeros_2_6_1_1_d, nb_zeros(NB_F64, NB_SHAPE(2, 6, 1, 1)))
/* stride 1e15 + 1 and padding 1e15 along w: of 3 columns the middle one
 * reads input columns 1..3, the others lie in the padding */
CALL(c2_far_stride, nb_conv2d(x2t(), w2d(), NULL, i2(1, 1000000000000001),
                              i2(1, 1000000000000000), NULL, 1))
static nb_tensor *c2_far_stride_want(void) {
    nb_tensor *z = nb_zeros(NB_F64, NB_SHAPE(2, 6, 6, 1));
    nb_tensor *mid = nb_conv2d(nb_narrow(x2t(), 3, 1, 3), w2d(), NULL, NULL, i2(1, 0), NULL, 1);
    return nb_cat((nb_tensor *[]){z, mid, z}, 3, 3);
}
CALL(c2_dmax_w, nb_conv2d(x2(), w2(), NULL, NULL, NULL, i2(1, MX), 1))
CALL(c2_s0_w, nb_conv2d(x2(), w2(), NULL, i2(1, 0), NULL, NULL, 1))
CALL(c2_big_kernel, nb_conv2d(x2(), w2(), NULL, i2(1, 1), NULL, i2(3, 1), 1))

/* pooling: item 2 (a kernel INT64_MAX, a padding INT64_MAX / 2) */
CALL(mp1_kmax, nb_max_pool1d(x1(), MX, 0, MX / 2))
CALL(row_max, nb_max(x1(), -1, true))
CALL(mp1_kmax_s1, nb_max_pool1d(x1(), MX, 1, MX / 2))
CALL(row_max_10, nb_expand(nb_max(x1(), -1, true), NB_SHAPE(2, 4, 10)))
CALL(mp2_kmax, nb_max_pool2d(x2(), i2(MX, MX), NULL, i2(MX / 2, MX / 2)))
CALL(plane_max, nb_max(nb_view(x2(), NB_SHAPE(2, 4, 1, 36)), -1, true))
CALL(ap2_kmax, nb_avg_pool2d(x2d(), i2(MX, MX), NULL, i2(MX / 2, MX / 2), true))
CALL(plane_sum_k2, nb_mul_scalar(nb_sum_dims(x2d(), 2, (const int[]){2, 3}, true),
                                 1.0 / ((double)MX * (double)MX)))
CALL(ap2_kmax_nocip, nb_avg_pool2d(x2d(), i2(MX, MX), NULL, i2(MX / 2, MX / 2), false))
CALL(plane_mean, nb_mean_dims(x2d(), 2, (const int[]){2, 3}, true))
CALL(ap2_kmax_s1, nb_avg_pool2d(x2d(), i2(MX, MX), i2(1, 1), i2(MX / 2, MX / 2), true))
CALL(plane_sum_k2_6x6, nb_expand(plane_sum_k2(), NB_SHAPE(2, 4, 6, 6)))
CALL(mp2_s00, nb_max_pool2d(x2(), i2(2, 3), i2(0, 0), NULL))
CALL(mp2_snull, nb_max_pool2d(x2(), i2(2, 3), NULL, NULL))
CALL(mp2_s10, nb_max_pool2d(x2(), i2(2, 3), i2(1, 0), NULL))
CALL(mp2_s13, nb_max_pool2d(x2(), i2(2, 3), i2(1, 3), NULL))
CALL(ap2_s02, nb_avg_pool2d(x2(), i2(2, 3), i2(0, 2), i2(1, 1), false))
CALL(ap2_s22, nb_avg_pool2d(x2(), i2(2, 3), i2(2, 2), i2(1, 1), false))
CALL(mp1_s0, nb_max_pool1d(x1(), 3, 0, 1))
CALL(mp1_s3, nb_max_pool1d(x1(), 3, 3, 1))
CALL(mp2_smax, nb_max_pool2d(x2(), i2(2, 3), i2(MX, MX), NULL))
CALL(mp2_first_window, nb_max_pool2d(nb_narrow(nb_narrow(x2(), 2, 0, 2), 3, 0, 3), i2(2, 3),
                                     NULL, NULL))
CALL(mp2_sm1, nb_max_pool2d(x2(), i2(2, 3), i2(-1, 1), NULL))
CALL(mp2_smin_w, nb_max_pool2d(x2(), i2(2, 3), i2(1, MN), NULL))
CALL(mp2_k0, nb_max_pool2d(x2(), i2(0, 3), NULL, NULL))
CALL(mp2_kmin_w, nb_max_pool2d(x2(), i2(2, MN), NULL, NULL))
CALL(mp2_kmax_nopad, nb_max_pool2d(x2(), i2(MX, 2), NULL, NULL))
CALL(mp2_pmax, nb_max_pool2d(x2(), i2(2, 3), NULL, i2(MX, 0)))
CALL(mp2_pmin_w, nb_max_pool2d(x2(), i2(2, 3), NULL, i2(0, MN)))
CALL(mp1_km1, nb_max_pool1d(x1(), -1, 0, 0))
CALL(mp1_kmin, nb_max_pool1d(x1(), MN, 0, 0))
CALL(mp1_sm1, nb_max_pool1d(x1(), 2, -1, 0))
CALL(mp1_pmax_half, nb_max_pool1d(x1(), MX, 0, MX / 2 + 1))

/* views and shapes */
CALL(nar_4_0, nb_narrow(a34(), 1, 4, 0))
CALL(empty_3_0, nb_zeros(NB_F32, NB_SHAPE(3, 0)))
CALL(nar_m4_4, nb_narrow(a34(), 1, -4, 4))
CALL(a34_c, a34())
CALL(nar_m1_1, nb_narrow(a34(), 1, -1, 1))
CALL(nar_3_1, nb_narrow(a34(), 1, 3, 1))
CALL(nar_1_max, nb_narrow(a34(), 1, 1, MX))
CALL(nar_max_1, nb_narrow(a34(), 1, MX, 1))
CALL(nar_max_max, nb_narrow(a34(), 1, MX, MX))
CALL(nar_min_0, nb_narrow(a34(), 1, MN, 0))
CALL(nar_min_max, nb_narrow(a34(), 1, MN, MX))
CALL(nar_0_m1, nb_narrow(a34(), 1, 0, -1))
CALL(nar_0_min, nb_narrow(a34(), 1, 0, MN))
CALL(nar_m5_1, nb_narrow(a34(), 1, -5, 1))
CALL(sel_m4, nb_select(a34(), 1, -4))
CALL(sel_0, nb_select(a34(), 1, 0))
CALL(sel_max, nb_select(a34(), 1, MX))
CALL(sel_min, nb_select(a34(), 1, MN))
CALL(sel_4, nb_select(a34(), 1, 4))
CALL(sel_m5, nb_select(a34(), 1, -5))
CALL(exp_max, nb_expand(a34(), NB_SHAPE(MX, 3, 4)))
CALL(exp_min, nb_expand(a34(), NB_SHAPE(MN, 3, 4)))
CALL(exp_keep, nb_expand(a34(), NB_SHAPE(-1, -1)))
CALL(exp_0, nb_expand(nb_ones(NB_F32, NB_SHAPE(1, 1)), NB_SHAPE(0, 5)))
CALL(empty_0_5, nb_zeros(NB_F32, NB_SHAPE(0, 5)))
CALL(exp_62x2, nb_expand(nb_ones(NB_F32, NB_SHAPE(1, 1)), NB_SHAPE(P62, 2)))
CALL(exp_max_max_0, nb_expand(nb_ones(NB_F32, NB_SHAPE(1, 1, 1)), NB_SHAPE(0, MX, MX)))
CALL(view_max_m1, nb_view(a34(), NB_SHAPE(MX, -1)))
CALL(view_max_max, nb_view(a34(), NB_SHAPE(MX, MX)))
CALL(view_m1_m1, nb_view(a34(), NB_SHAPE(-1, -1)))
CALL(view_min_m1, nb_view(a34(), NB_SHAPE(MN, -1)))
CALL(view_0_m1, nb_view(a34(), NB_SHAPE(0, -1)))
CALL(view_2_m1, nb_view(a34(), NB_SHAPE(2, -1)))
CALL(reshape_2_6, nb_reshape(a34(), NB_SHAPE(2, 6)))
CALL(reshape_e_max_max_0, nb_reshape(nb_zeros(NB_F32, NB_SHAPE(0, 4)), NB_SHAPE(MX, MX, 0)))
CALL(reshape_e_max_0, nb_reshape(nb_zeros(NB_F32, NB_SHAPE(0, 4)), NB_SHAPE(MX, 0)))
CALL(empty_max_0, nb_zeros(NB_F32, NB_SHAPE(MX, 0)))
CALL(reshape_e_0_m1, nb_reshape(nb_zeros(NB_F32, NB_SHAPE(0, 4)), NB_SHAPE(0, -1)))
CALL(arange_m1, nb_arange(NB_I64, -1))
CALL(arange_min, nb_arange(NB_I64, MN))
CALL(arange_max, nb_arange(NB_I64, MX))
CALL(arange_0, nb_arange(NB_I64, 0))
CALL(empty_i64_0, nb_zeros(NB_I64, NB_SHAPE(0)))
CALL(empty_max, nb_empty(NB_F32, NB_SHAPE(MX)))
CALL(empty_min, nb_empty(NB_F32, NB_SHAPE(MN)))
CALL(full_max_2, nb_full(NB_F32, NB_SHAPE(MX, 2), 1.0))
CALL(full_m1_2, nb_full(NB_F32, NB_SHAPE(-1, 2), 1.0))
CALL(empty_0_max_max, nb_empty(NB_F32, NB_SHAPE(0, MX, MX)))
CALL(full_max_0, nb_full(NB_F32, NB_SHAPE(MX, 0), 2.0))
CALL(pe_max_4, nb_positional_encoding(MX, 4, NB_F32))
CALL(pe_4_m1, nb_positional_encoding(4, -1, NB_F32))
CALL(pe_4_min, nb_positional_encoding(4, MN, NB_F32))
CALL(tril_max_3, nb_tril_mask(MX, 3))
CALL(tril_3_min, nb_tril_mask(3, MN))
CALL(tril_m1_m1, nb_tril_mask(-1, -1))
CALL(tril_max_0, nb_tril_mask(MX, 0))
CALL(empty_bool_max_0, nb_zeros(NB_BOOL, NB_SHAPE(MX, 0)))
CALL(tril_0_0, nb_tril_mask(0, 0))
CALL(empty_bool_0_0, nb_zeros(NB_BOOL, NB_SHAPE(0, 0)))
CALL(topk_0, nb_topk(a34(), 0, 1, true, true, NULL))
CALL(topk_m1, nb_topk(a34(), -1, 1, true, true, NULL))
CALL(topk_5, nb_topk(a34(), 5, 1, true, true, NULL))
CALL(topk_max, nb_topk(a34(), MX, 1, true, true, NULL))
CALL(topk_min, nb_topk(a34(), MN, 1, true, true, NULL))
CALL(topk_4, nb_topk(a34(), 4, 1, true, true, NULL))
CALL(sort_desc, nb_sort(a34(), 1, true, NULL))
CALL(mn_0, nb_multinomial(probs(), 0, true, NULL))
CALL(mn_m1, nb_multinomial(probs(), -1, false, NULL))
CALL(mn_min, nb_multinomial(probs(), MN, true, NULL))
CALL(mn_max_repl, nb_multinomial(probs(), MX, true, NULL))
CALL(mn_max, nb_multinomial(probs(), MX, false, NULL))
CALL(mn_5, nb_multinomial(probs(), 5, false, NULL))
static nb_tensor *cat62(int n) {
    nb_tensor *t = nb_expand(nb_ones(NB_F32, NB_SHAPE(1, 1)), NB_SHAPE(P62, 1));
    nb_tensor *list[3] = {t, t, t};
    return nb_cat(list, n, 0);
}
CALL(cat_62_twice, cat62(2))
CALL(cat_62_once, cat62(1))
CALL(cat_0, nb_cat((nb_tensor *[]){a34()}, 0, 0))
CALL(cat_m1, nb_cat((nb_tensor *[]){a34()}, -1, 0))
CALL(stack_m1, nb_stack((nb_tensor *[]){a34()}, -1, 0))
static nb_tensor *stack_max_0(void) {
    nb_tensor *t = nb_zeros(NB_F32, NB_SHAPE(MX, 0));
    return nb_stack((nb_tensor *[]){t, t}, 2, 0);
}
CALL(cat_max_0, nb_cat((nb_tensor *[]){nb_zeros(NB_F32, NB_SHAPE(MX, 0)),
                                       nb_zeros(NB_F32, NB_SHAPE(MX, 0))}, 2, 1))

/* ops over an empty (INT64_MAX, 0): a dim of INT64_MAX with nothing in it */
static nb_tensor *emax(void) { return nb_zeros(NB_F32, NB_SHAPE(MX, 0)); }
CALL(sum_emax_0, nb_sum(emax(), 0, false))
CALL(empty_f32_0, nb_zeros(NB_F32, NB_SHAPE(0)))
CALL(mean_emax_0, nb_mean(emax(), 0, true))
CALL(empty_1_0, nb_zeros(NB_F32, NB_SHAPE(1, 0)))
CALL(var_emax_0, nb_var(emax(), 1, (const int[]){0}, 1, false))
CALL(std_emax_0, nb_std(emax(), 1, (const int[]){0}, 1, false))
CALL(cumsum_emax_0, nb_cumsum(emax(), 0))
CALL(sort_emax_0, nb_sort(emax(), 0, false, NULL))
CALL(softmax_emax_0, nb_softmax(emax(), 0))
CALL(max_emax_0, nb_max(emax(), 0, false))
CALL(reshape_0_max_3, nb_reshape(nb_zeros(NB_F32, NB_SHAPE(0, 4)), NB_SHAPE(0, MX, 3)))
CALL(view_max_0_3, nb_view(nb_zeros(NB_F32, NB_SHAPE(0, 4)), NB_SHAPE(MX, 0, 3)))

/* ------------------------------------------------------------- table */
typedef nb_tensor *(*make_fn)(void);
typedef struct {
    const char *name;
    make_fn call;
    make_fn want;       /* the expected result (shape and values), or NULL: refused */
    double rtol;        /* 0: the values bit for bit */
    const char *err[5]; /* a refusal: substrings of nb_last_error() */
} size_case;

static const size_case CASES[] = {
    /* conv1d, stride INT64_MAX: one window, in the padding or at the start */
    {"conv1d stride MAX padding 5", c1_smax_p5, zeros_2_6_1, 0, {0}},
    {"conv1d stride MAX padding 5 f64", c1_smax_p5_d, zeros_2_6_1_d, 0, {0}},
    {"conv1d stride MAX padding 5, strided input", c1_smax_p5_t, zeros_2_6_1, 0, {0}},
    {"conv1d stride MAX padding 5 with bias", c1_smax_p5_b, bias_2_6_1, 0, {0}},
    {"conv1d stride MAX padding 0", c1_smax_p0, c1_first3, 0, {0}},
    {"conv1d stride MAX padding 0, strided input", c1_smax_p0_t, c1_first3, 0, {0}},
    {"conv1d stride MAX, padded size MAX - 1", c1_smax_pbig, zeros_2_6_1, 0, {0}},
    {"conv1d stride MAX padding 1e15, strided input", c1_smax_p1e15_t, zeros_2_6_1, 0, {0}},
    {"conv1d padding and dilation 2^61", c1_d61_p61, c1_tap1, 1e-6, {0}},
    {"conv1d padding and dilation 2^61 f64", c1_d61_p61_d, c1_tap1_d, 1e-14, {0}},
    {"conv1d padding and dilation 2^61, strided input", c1_d61_p61_t, c1_tap1, 1e-6, {0}},
    {"conv1d same, dilation 2^61", c1_same_d61, c1_tap1, 1e-6, {0}},
    /* padding */
    {"conv1d padding NB_PADDING_SAME", c1_same, c1_p1, 0, {0}},
    {"conv1d padding -1", c1_pm1, NULL, 0,
     {"nb_conv1d: padding must be >= 0 or NB_PADDING_SAME, got -1"}},
    {"conv1d padding MIN + 1", c1_pminp1, NULL, 0,
     {"nb_conv1d: padding must be >= 0 or NB_PADDING_SAME, got -9223372036854775807"}},
    {"conv1d padding MAX", c1_pmax, NULL, 0,
     {"nb_conv1d: padding 9223372036854775807 makes the padded input size overflow int64 "
      "(input size 10)"}},
    {"conv1d padding MAX / 2 (10 + 2p passes MAX)", c1_phalf, NULL, 0,
     {"nb_conv1d: padding 4611686018427387903 makes the padded input size overflow int64"}},
    /* dilation */
    {"conv1d dilation MAX", c1_dmax, NULL, 0,
     {"nb_conv1d: dilation 9223372036854775807 makes the dilated kernel size overflow int64 "
      "(kernel size 3)"}},
    {"conv1d dilation MAX / 2 (dilated kernel MAX)", c1_dhalf, NULL, 0,
     {"nb_conv1d: kernel size 3 (dilated 9223372036854775807) is larger than the padded input "
      "size 10 (input size 10, padding 0, dilation 4611686018427387903)"}},
    {"conv1d same, dilation MAX / 2", c1_same_dhalf, NULL, 0,
     {"nb_conv1d: padding \"same\" with dilated kernel size 9223372036854775807 makes the "
      "padded input size overflow int64 (input size 10)"}},
    {"conv1d same on an empty input", c1_same_empty, NULL, 0,
     {"nb_conv1d: kernel size 3 (dilated 3) is larger than the padded input size 2 (input size "
      "0, padding \"same\", dilation 1)"}},
    {"conv1d dilation 0", c1_d0, NULL, 0, {"nb_conv1d: dilation must be >= 1, got 0"}},
    {"conv1d dilation MIN", c1_dmin, NULL, 0,
     {"nb_conv1d: dilation must be >= 1, got -9223372036854775808"}},
    /* stride, groups */
    {"conv1d stride 0", c1_s0, NULL, 0, {"nb_conv1d: stride must be >= 1, got 0"}},
    {"conv1d stride -1", c1_sm1, NULL, 0, {"nb_conv1d: stride must be >= 1, got -1"}},
    {"conv1d stride MIN", c1_smin, NULL, 0,
     {"nb_conv1d: stride must be >= 1, got -9223372036854775808"}},
    {"conv1d groups 0", c1_g0, NULL, 0, {"nb_conv1d: groups must be >= 1, got 0"}},
    {"conv1d groups MIN", c1_gmin, NULL, 0,
     {"nb_conv1d: groups must be >= 1, got -9223372036854775808"}},
    {"conv1d groups MAX", c1_gmax, NULL, 0,
     {"nb_conv1d: groups 9223372036854775807 must divide in_channels 4 and out_channels 6"}},
    /* the weight's sizes */
    {"conv1d kernel of 2^62 taps (stride 0)", c1_kernel62, NULL, 0,
     {"nb_conv1d: out of memory for the column buffers of a conv of 1 x 4611686018427387904 x "
      "1"}},
    {"conv2d of 2^55 channels (stride 0), 3x3", c2_channels55, NULL, 0,
     {"nb_conv2d: out of memory for the column buffers of a conv of 16 x 324259173170675712 x "
      "1"}},
    {"conv2d groups x channels per group past MAX", c2_cg_overflow, NULL, 0,
     {"nb_conv2d: weight (0,4611686018427387904,1,1) expects 4611686018427387904 input "
      "channels per group x 4 groups, more than int64 can count; input (1,0,5,5) has 0"}},
    /* (torch refuses fewer out channels than groups; nabla asks that groups
     * divide both channel counts, and none give an empty result) */
    {"conv2d no channels, groups MAX", c2_groups_max_empty, zeros_2_0_3_3, 0, {0}},
    /* conv2d */
    {"conv2d padding (MAX, MAX)", c2_pmax, NULL, 0,
     {"nb_conv2d: padding 9223372036854775807 for h makes the padded input size overflow "
      "int64 (input size 6)"}},
    {"conv2d padding (0, MAX)", c2_pmax_w, NULL, 0,
     {"nb_conv2d: padding 9223372036854775807 for w makes the padded input size overflow "
      "int64 (input size 6)"}},
    {"conv2d padding (0, -1)", c2_pm1_w, NULL, 0,
     {"nb_conv2d: padding must be >= 0 or NB_PADDING_SAME, got -1 for w"}},
    {"conv2d NB_PADDING_SAME in padding[1] alone", c2_same_w_only, NULL, 0,
     {"nb_conv2d: padding[1] is NB_PADDING_SAME but padding[0] is 0: \"same\" pads both dims "
      "and is set by padding[0] alone"}},
    {"conv2d padding (SAME, 5): same in both dims", c2_same_5, c2_p11, 0, {0}},
    {"conv2d padding (SAME, SAME)", c2_same_same, c2_p11, 0, {0}},
    {"conv2d stride MAX padding 1e15", c2_smax_p1e15, zeros_2_6_1_1, 0, {0}},
    {"conv2d stride MAX padding (1e15, 5), strided f64 input", c2_smax_p1e15_t,
     zeros_2_6_1_1_d, 0, {0}},
    {"conv2d stride (1, 1e15 + 1) padding (1, 1e15), strided f64 input", c2_far_stride,
     c2_far_stride_want, 1e-14, {0}},
    {"conv2d dilation (1, MAX)", c2_dmax_w, NULL, 0,
     {"nb_conv2d: dilation 9223372036854775807 for w makes the dilated kernel size overflow "
      "int64 (kernel size 3)"}},
    {"conv2d stride (1, 0)", c2_s0_w, NULL, 0, {"nb_conv2d: stride must be >= 1, got 0 for w"}},
    {"conv2d dilated kernel past the input", c2_big_kernel, NULL, 0,
     {"nb_conv2d: kernel size 3 (dilated 7) is larger than the padded input size 6 for h "
      "(input size 6, padding 0, dilation 3)"}},
    /* pooling */
    {"max_pool1d kernel MAX padding MAX / 2", mp1_kmax, row_max, 0, {0}},
    {"max_pool1d kernel MAX padding MAX / 2 stride 1", mp1_kmax_s1, row_max_10, 0, {0}},
    {"max_pool2d kernel MAX padding MAX / 2", mp2_kmax, plane_max, 0, {0}},
    {"avg_pool2d kernel MAX padding MAX / 2 (divisor MAX^2)", ap2_kmax, plane_sum_k2, 1e-14,
     {0}},
    {"avg_pool2d kernel MAX padding MAX / 2, count_include_pad false", ap2_kmax_nocip,
     plane_mean, 1e-14, {0}},
    {"avg_pool2d kernel MAX padding MAX / 2 stride 1", ap2_kmax_s1, plane_sum_k2_6x6, 1e-14,
     {0}},
    {"max_pool2d stride (0, 0) = kernel", mp2_s00, mp2_snull, 0, {0}},
    {"max_pool2d stride (1, 0) = (1, kernel)", mp2_s10, mp2_s13, 0, {0}},
    {"avg_pool2d stride (0, 2) = (kernel, 2)", ap2_s02, ap2_s22, 0, {0}},
    {"max_pool1d stride 0 = kernel", mp1_s0, mp1_s3, 0, {0}},
    {"max_pool2d stride MAX", mp2_smax, mp2_first_window, 0, {0}},
    {"max_pool2d stride (-1, 1)", mp2_sm1, NULL, 0,
     {"nb_max_pool2d: stride (h) must be positive, got -1"}},
    {"max_pool2d stride (1, MIN)", mp2_smin_w, NULL, 0,
     {"nb_max_pool2d: stride (w) must be positive, got -9223372036854775808"}},
    {"max_pool2d kernel (0, 3)", mp2_k0, NULL, 0,
     {"nb_max_pool2d: kernel_size (h) must be positive, got 0"}},
    {"max_pool2d kernel (2, MIN)", mp2_kmin_w, NULL, 0,
     {"nb_max_pool2d: kernel_size (w) must be positive, got -9223372036854775808"}},
    {"max_pool2d kernel (MAX, 2) unpadded", mp2_kmax_nopad, NULL, 0,
     {"nb_max_pool2d: input (2,4,6,6) is too small for kernel_size (h) 9223372036854775807 "
      "with padding 0"}},
    {"max_pool2d padding (MAX, 0)", mp2_pmax, NULL, 0,
     {"nb_max_pool2d: padding (h) must be between 0 and half the kernel size, got padding "
      "9223372036854775807 for kernel_size 2"}},
    {"max_pool2d padding (0, MIN)", mp2_pmin_w, NULL, 0,
     {"nb_max_pool2d: padding (w) must be between 0 and half the kernel size, got padding "
      "-9223372036854775808 for kernel_size 3"}},
    {"max_pool1d kernel -1", mp1_km1, NULL, 0,
     {"nb_max_pool1d: kernel_size must be positive, got -1"}},
    {"max_pool1d kernel MIN", mp1_kmin, NULL, 0,
     {"nb_max_pool1d: kernel_size must be positive, got -9223372036854775808"}},
    {"max_pool1d stride -1", mp1_sm1, NULL, 0, {"nb_max_pool1d: stride must be positive, got -1"}},
    {"max_pool1d kernel MAX padding MAX / 2 + 1", mp1_pmax_half, NULL, 0,
     {"nb_max_pool1d: padding must be between 0 and half the kernel size, got padding "
      "4611686018427387904 for kernel_size 9223372036854775807"}},
    /* nb_narrow, nb_select */
    {"narrow start 4 length 0", nar_4_0, empty_3_0, 0, {0}},
    {"narrow start -4 length 4", nar_m4_4, a34_c, 0, {0}},
    {"narrow start -1 length 1", nar_m1_1, nar_3_1, 0, {0}},
    {"narrow start 1 length MAX", nar_1_max, NULL, 0,
     {"nb_narrow: start 1 and length 9223372036854775807 out of range for dim 1 of size 4"}},
    {"narrow start MAX length 1", nar_max_1, NULL, 0,
     {"nb_narrow: start 9223372036854775807 and length 1 out of range for dim 1 of size 4"}},
    {"narrow start MAX length MAX", nar_max_max, NULL, 0,
     {"nb_narrow: start 9223372036854775807 and length 9223372036854775807 out of range"}},
    {"narrow start MIN length 0", nar_min_0, NULL, 0,
     {"nb_narrow: start -9223372036854775808 and length 0 out of range for dim 1 of size 4"}},
    {"narrow start MIN length MAX", nar_min_max, NULL, 0,
     {"nb_narrow: start -9223372036854775808 and length 9223372036854775807 out of range"}},
    {"narrow length -1", nar_0_m1, NULL, 0,
     {"nb_narrow: start 0 and length -1 out of range for dim 1 of size 4"}},
    {"narrow length MIN", nar_0_min, NULL, 0,
     {"nb_narrow: start 0 and length -9223372036854775808 out of range"}},
    {"narrow start -5", nar_m5_1, NULL, 0,
     {"nb_narrow: start -5 and length 1 out of range for dim 1 of size 4"}},
    {"select -4", sel_m4, sel_0, 0, {0}},
    {"select MAX", sel_max, NULL, 0,
     {"nb_select: index 9223372036854775807 out of range for dim 1 of size 4"}},
    {"select MIN", sel_min, NULL, 0,
     {"nb_select: index -9223372036854775808 out of range for dim 1 of size 4"}},
    {"select 4", sel_4, NULL, 0, {"nb_select: index 4 out of range for dim 1 of size 4"}},
    {"select -5", sel_m5, NULL, 0, {"nb_select: index -5 out of range for dim 1 of size 4"}},
    /* nb_expand, nb_view, nb_reshape */
    {"expand to (MAX, 3, 4)", exp_max, NULL, 0,
     {"nb_expand: shape (9223372036854775807,3,4) overflows int64"}},
    {"expand to (MIN, 3, 4)", exp_min, NULL, 0,
     {"nb_expand: invalid size -9223372036854775808 at dim 0 of (-9223372036854775808,3,4)"}},
    {"expand to (-1, -1)", exp_keep, a34_c, 0, {0}},
    {"expand (1, 1) to (0, 5)", exp_0, empty_0_5, 0, {0}},
    {"expand (1, 1) to (2^62, 2)", exp_62x2, NULL, 0,
     {"nb_expand: shape (4611686018427387904,2) overflows int64"}},
    {"expand to (0, MAX, MAX)", exp_max_max_0, NULL, 0,
     {"nb_expand: shape (0,9223372036854775807,9223372036854775807) overflows int64"}},
    {"view (MAX, -1)", view_max_m1, NULL, 0,
     {"nb_view: shape (9223372036854775807,-1) is invalid for input of 12 elements"}},
    {"view (MAX, MAX)", view_max_max, NULL, 0,
     {"nb_view: shape (9223372036854775807,9223372036854775807) overflows int64"}},
    {"view (-1, -1)", view_m1_m1, NULL, 0, {"nb_view: invalid size -1 in shape (-1,-1)"}},
    {"view (MIN, -1)", view_min_m1, NULL, 0,
     {"nb_view: invalid size -9223372036854775808 in shape (-9223372036854775808,-1)"}},
    {"view (0, -1)", view_0_m1, NULL, 0,
     {"nb_view: shape (0,-1) is invalid for input of 12 elements"}},
    {"view (2, -1)", view_2_m1, reshape_2_6, 0, {0}},
    {"reshape (0, 4) to (MAX, MAX, 0)", reshape_e_max_max_0, NULL, 0,
     {"nb_reshape: shape (9223372036854775807,9223372036854775807,0) overflows int64"}},
    {"reshape (0, 4) to (MAX, 0)", reshape_e_max_0, empty_max_0, 0, {0}},
    {"reshape (0, 4) to (0, -1)", reshape_e_0_m1, NULL, 0,
     {"nb_reshape: shape (0,-1) is invalid for input of 0 elements"}},
    /* creation */
    {"arange -1", arange_m1, NULL, 0, {"nb_arange: n must be >= 0, got -1"}},
    {"arange MIN", arange_min, NULL, 0, {"nb_arange: n must be >= 0, got -9223372036854775808"}},
    {"arange MAX", arange_max, NULL, 0,
     {"nb_arange: shape (9223372036854775807) needs more bytes than size_t can hold"}},
    {"arange 0", arange_0, empty_i64_0, 0, {0}},
    {"empty (MAX)", empty_max, NULL, 0,
     {"nb_empty: shape (9223372036854775807) needs more bytes than size_t can hold"}},
    {"empty (MIN)", empty_min, NULL, 0,
     {"nb_empty: negative size -9223372036854775808 in shape (-9223372036854775808)"}},
    {"full (MAX, 2)", full_max_2, NULL, 0,
     {"nb_full: shape (9223372036854775807,2) has more elements than int64 can count"}},
    {"full (-1, 2)", full_m1_2, NULL, 0, {"nb_full: negative size -1 in shape (-1,2)"}},
    {"empty (0, MAX, MAX)", empty_0_max_max, NULL, 0,
     {"nb_empty: shape (0,9223372036854775807,9223372036854775807) has more strides than int64 "
      "can count"}},
    {"full (MAX, 0)", full_max_0, empty_max_0, 0, {0}},
    {"positional_encoding max_len MAX", pe_max_4, NULL, 0,
     {"nb_positional_encoding: max_len 9223372036854775807 x d_model 4 is too large"}},
    {"positional_encoding d_model -1", pe_4_m1, NULL, 0,
     {"nb_positional_encoding: sizes must be positive, got max_len 4, d_model -1"}},
    {"positional_encoding d_model MIN", pe_4_min, NULL, 0,
     {"nb_positional_encoding: sizes must be positive, got max_len 4, d_model "
      "-9223372036854775808"}},
    {"tril_mask (MAX, 3)", tril_max_3, NULL, 0,
     {"nb_tril_mask: shape (9223372036854775807,3) has more elements than int64 can count"}},
    {"tril_mask (3, MIN)", tril_3_min, NULL, 0,
     {"nb_tril_mask: negative size -9223372036854775808 in shape (3,-9223372036854775808)"}},
    {"tril_mask (-1, -1)", tril_m1_m1, NULL, 0,
     {"nb_tril_mask: negative size -1 in shape (-1,-1)"}},
    {"tril_mask (MAX, 0)", tril_max_0, empty_bool_max_0, 0, {0}},
    {"tril_mask (0, 0)", tril_0_0, empty_bool_0_0, 0, {0}},
    /* nb_topk, nb_multinomial */
    {"topk k 0", topk_0, empty_3_0, 0, {0}},
    {"topk k 4 (all)", topk_4, sort_desc, 0, {0}},
    {"topk k -1", topk_m1, NULL, 0, {"nb_topk: k = -1 out of range for dim 1 of size 4"}},
    {"topk k 5", topk_5, NULL, 0, {"nb_topk: k = 5 out of range for dim 1 of size 4"}},
    {"topk k MAX", topk_max, NULL, 0,
     {"nb_topk: k = 9223372036854775807 out of range for dim 1 of size 4"}},
    {"topk k MIN", topk_min, NULL, 0,
     {"nb_topk: k = -9223372036854775808 out of range for dim 1 of size 4"}},
    {"multinomial 0", mn_0, NULL, 0, {"nb_multinomial: num_samples must be positive, got 0"}},
    {"multinomial -1", mn_m1, NULL, 0, {"nb_multinomial: num_samples must be positive, got -1"}},
    {"multinomial MIN", mn_min, NULL, 0,
     {"nb_multinomial: num_samples must be positive, got -9223372036854775808"}},
    {"multinomial MAX with replacement", mn_max_repl, NULL, 0,
     {"nb_multinomial: shape (3,9223372036854775807) has more elements than int64 can count"}},
    {"multinomial MAX without replacement", mn_max, NULL, 0,
     {"nb_multinomial: cannot draw 9223372036854775807 samples without replacement from 4 "
      "categories"}},
    {"multinomial 5 of 4 without replacement", mn_5, NULL, 0,
     {"nb_multinomial: cannot draw 5 samples without replacement from 4 categories"}},
    /* nb_cat, nb_stack */
    {"cat of two (2^62, 1)", cat_62_twice, NULL, 0,
     {"nb_cat: the sizes along dim 0 pass INT64_MAX: tensor 1's 4611686018427387904 after "
      "4611686018427387904"}},
    {"cat of one (2^62, 1)", cat_62_once, NULL, 0,
     {"nb_cat: shape (4611686018427387904,1) needs more bytes than size_t can hold"}},
    {"cat of none", cat_0, NULL, 0, {"nb_cat: needs at least one tensor (n = 0)"}},
    {"cat n -1", cat_m1, NULL, 0, {"nb_cat: needs at least one tensor (n = -1)"}},
    {"stack n -1", stack_m1, NULL, 0, {"nb_stack: needs at least one tensor (n = -1)"}},
    {"stack two (MAX, 0)", stack_max_0, NULL, 0,
     {"nb_stack: shape (2,9223372036854775807,0) has more strides than int64 can count"}},
    {"cat two (MAX, 0) along dim 1", cat_max_0, empty_max_0, 0, {0}},
    /* reductions and scans over a dim of INT64_MAX that holds nothing */
    {"sum (MAX, 0) over dim 0", sum_emax_0, empty_f32_0, 0, {0}},
    {"mean (MAX, 0) over dim 0", mean_emax_0, empty_1_0, 0, {0}},
    {"var (MAX, 0) over dim 0", var_emax_0, empty_f32_0, 0, {0}},
    {"std (MAX, 0) over dim 0", std_emax_0, empty_f32_0, 0, {0}},
    {"max (MAX, 0) over dim 0", max_emax_0, empty_f32_0, 0, {0}},
    {"cumsum (MAX, 0) along dim 0", cumsum_emax_0, empty_max_0, 0, {0}},
    {"sort (MAX, 0) along dim 0", sort_emax_0, empty_max_0, 0, {0}},
    {"softmax (MAX, 0) along dim 0", softmax_emax_0, empty_max_0, 0, {0}},
    /* an empty shape's strides (its nonzero sizes' products) must fit */
    {"reshape (0, 4) to (0, MAX, 3)", reshape_0_max_3, NULL, 0,
     {"nb_reshape: shape (0,9223372036854775807,3) overflows int64"}},
    {"view (0, 4) as (MAX, 0, 3)", view_max_0_3, NULL, 0,
     {"nb_view: shape (9223372036854775807,0,3) overflows int64"}},
};
#define NCASES (int)(sizeof CASES / sizeof CASES[0])

/* got has want's shape, dtype and values: bit for bit (NaN where NaN), or
 * within rtol of want's largest magnitude. */
static void expect_values(const char *name, nb_tensor *got, nb_tensor *want, double rtol) {
    int nd = nb_ndim(want);
    ck_assert_msg(nb_ndim(got) == nd, "%s: result has %d dims, expected %d", name, nb_ndim(got),
                  nd);
    for (int i = 0; i < nd; i++)
        ck_assert_msg(nb_shape(got)[i] == nb_shape(want)[i],
                      "%s: dim %d of the result is %lld, expected %lld", name, i,
                      (long long)nb_shape(got)[i], (long long)nb_shape(want)[i]);
    ck_assert_msg(nb_dtype_of(got) == nb_dtype_of(want), "%s: dtype %s, expected %s", name,
                  nb_dtype_name(nb_dtype_of(got)), nb_dtype_name(nb_dtype_of(want)));
    if (nb_numel(want) == 0) return;
    double *g = values(got), *w = values(want), scale = 0;
    for (int64_t i = 0; i < nb_numel(want); i++) scale = fmax(scale, fabs(w[i]));
    for (int64_t i = 0; i < nb_numel(want); i++) {
        bool ok = rtol == 0 ? memcmp(&g[i], &w[i], sizeof g[i]) == 0 || (isnan(g[i]) && isnan(w[i]))
                            : fabs(g[i] - w[i]) <= rtol * scale;
        ck_assert_msg(ok, "%s: element %lld is %.17g, expected %.17g", name, (long long)i, g[i],
                      w[i]);
    }
    free(g);
    free(w);
}

START_TEST(sizes_table) {
    const size_case *c = &CASES[_i];
    int64_t live = nb_live_tensors();
    nb_scope_begin();
    nb_clear_error();
    nb_tensor *y = c->call();
    if (!c->want) {
        const char *msg = nb_last_error();
        ck_assert_msg(y == NULL, "%s: expected a refusal, got a result", c->name);
        ck_assert_msg(msg != NULL, "%s: refused without a message", c->name);
        for (int k = 0; k < 5 && c->err[k]; k++)
            ck_assert_msg(strstr(msg, c->err[k]) != NULL, "%s: error \"%s\" does not contain \"%s\"",
                          c->name, msg, c->err[k]);
    } else {
        ck_assert_msg(y != NULL, "%s: failed: %s", c->name, nb_last_error());
        nb_tensor *want = c->want();
        ck_assert_msg(want != NULL, "%s: the expected result failed: %s", c->name,
                      nb_last_error());
        expect_values(c->name, y, want, c->rtol);
    }
    nb_clear_error();
    nb_scope_end();
    ck_assert_int_eq(nb_live_tensors(), live);
}
END_TEST

/* ------------------------------------------------------------ backward */
/* conv with stride INT64_MAX and paddings near 1e15: the input and weight
 * gradients of a window that lies in the padding are zeros, the bias's the
 * count of outputs (col2im and the weight gradient walk the same
 * geometry as the forward) */
START_TEST(sizes_conv_backward_in_padding) {
    nb_scope_begin();
    nb_tensor *x = nb_set_requires_grad(x1d(), true), *w = nb_set_requires_grad(w1d(), true);
    nb_tensor *b = nb_set_requires_grad(nb_zeros(NB_F64, NB_SHAPE(6)), true);
    nb_tensor *y = nb_conv1d(x, w, b, MX, 5, 1, 1);
    ck_assert_msg(y != NULL, "%s", nb_last_error());
    ck_assert_int_eq(nb_backward(nb_sum_all(y)), 0);
    expect_values("conv1d grad x", nb_grad(x), nb_zeros(NB_F64, NB_SHAPE(2, 4, 10)), 0);
    expect_values("conv1d grad w", nb_grad(w), nb_zeros(NB_F64, NB_SHAPE(6, 4, 3)), 0);
    expect_values("conv1d grad b", nb_grad(b), nb_full(NB_F64, NB_SHAPE(6), 2.0), 0);
    nb_tensor *x2v = nb_set_requires_grad(x2t(), true), *w2v = nb_set_requires_grad(w2d(), true);
    y = nb_conv2d(x2v, w2v, NULL, i2(MX, MX), i2(1000000000000000, 1000000000000000), NULL, 1);
    ck_assert_msg(y != NULL, "%s", nb_last_error());
    ck_assert_int_eq(nb_backward(nb_sum_all(y)), 0);
    expect_values("conv2d grad x", nb_grad(x2v), nb_zeros(NB_F64, NB_SHAPE(2, 4, 6, 6)), 0);
    expect_values("conv2d grad w", nb_grad(w2v), nb_zeros(NB_F64, NB_SHAPE(6, 4, 3, 3)), 0);
    /* no channels and groups INT64_MAX: empty gradients (the weight
     * gradient's work split counted groups per thread) */
    nb_tensor *xe = nb_set_requires_grad(nb_zeros(NB_F64, NB_SHAPE(2, 0, 5, 5)), true);
    nb_tensor *we = nb_set_requires_grad(nb_zeros(NB_F64, NB_SHAPE(0, 0, 3, 3)), true);
    y = nb_conv2d(xe, we, NULL, NULL, NULL, NULL, MX);
    ck_assert_msg(y != NULL, "%s", nb_last_error());
    ck_assert_int_eq(nb_backward(nb_sum_all(y)), 0);
    expect_values("conv2d groups MAX grad x", nb_grad(xe), nb_zeros(NB_F64, NB_SHAPE(2, 0, 5, 5)), 0);
    expect_values("conv2d groups MAX grad w", nb_grad(we), nb_zeros(NB_F64, NB_SHAPE(0, 0, 3, 3)), 0);
    nb_scope_end();
}
END_TEST

/* conv1d with padding and dilation 2^61 is the conv of the middle tap:
 * gradcheck (all orders) walks col2im, the weight gradient and their own
 * backward through offsets of -2^61 and 2^61; f32 and f64 paths agree */
static nb_tensor *conv_d61(nb_tensor **in, int n, void *ctx) {
    (void)n;
    (void)ctx;
    return nb_conv1d(in[0], in[1], NULL, 1, P61, P61, 1);
}
static nb_tensor *conv2d_stride_max(nb_tensor **in, int n, void *ctx) {
    (void)n;
    (void)ctx;
    return nb_conv2d(in[0], in[1], NULL, i2(1, 1000000000000001), i2(0, 1000000000000000),
                     NULL, 1);
}
START_TEST(sizes_conv_gradcheck_far_offsets) {
    nb_scope_begin();
    nb_tensor *in[2] = {rand_leaf(11, NB_SHAPE(2, 2, 5)), rand_leaf(12, NB_SHAPE(3, 2, 3))};
    expect_all_orders("conv1d padding and dilation 2^61", conv_d61, NULL, 2, in);
    nb_tensor *in2[2] = {transposed_leaf(13, NB_SHAPE(1, 2, 4, 5), 2, 3),
                         rand_leaf(14, NB_SHAPE(2, 2, 2, 3))};
    expect_gradcheck("conv2d stride (1, 1e15 + 1) padding (0, 1e15)", conv2d_stride_max, NULL, 2,
                     in2);
    nb_scope_end();
}
END_TEST

/* max pooling over a window of INT64_MAX: the gradient goes to each row's
 * maximum */
START_TEST(sizes_pool_backward_kernel_max) {
    nb_scope_begin();
    double v[2][5] = {{1, 4, 2, 4, 0}, {-3, -1, -2, -5, -4}};
    nb_tensor *x = nb_set_requires_grad(nb_from_data(NB_F64, NB_SHAPE(1, 2, 5), v), true);
    nb_tensor *y = nb_max_pool1d(x, MX, 0, MX / 2);
    ck_assert_msg(y != NULL, "%s", nb_last_error());
    ck_assert_int_eq(nb_backward(nb_sum_all(y)), 0);
    double g[2][5] = {{0, 1, 0, 0, 0}, {0, 1, 0, 0, 0}}; /* ties: the first maximum */
    expect_values("max_pool1d kernel MAX grad", nb_grad(x),
                  nb_from_data(NB_F64, NB_SHAPE(1, 2, 5), g), 0);
    nb_tensor *x2v = nb_set_requires_grad(x2d(), true);
    y = nb_avg_pool2d(x2v, i2(MX, MX), i2(1, 1), i2(MX / 2, MX / 2), true);
    ck_assert_msg(y != NULL, "%s", nb_last_error());
    ck_assert_int_eq(nb_backward(nb_sum_all(y)), 0);
    /* 36 windows, each spreading 1 / MAX^2 over the whole plane */
    expect_values("avg_pool2d kernel MAX grad", nb_grad(x2v),
                  nb_full(NB_F64, NB_SHAPE(2, 4, 6, 6), 36.0 / ((double)MX * (double)MX)), 1e-14);
    nb_scope_end();
}
END_TEST

/* ---------------------------------------------------- max pool: NaN ties */
/* torch's scan replaces the maximum with a value that is greater or NaN:
 * among several NaNs of a window the last one keeps the gradient; among
 * equal maxima the first (nabla.h says so) */
START_TEST(sizes_max_pool_nan_ties_gradient) {
    nb_scope_begin();
    double v1[6] = {1, NAN, 3, NAN, 2, 2};
    nb_tensor *x = nb_set_requires_grad(nb_from_data(NB_F64, NB_SHAPE(1, 6), v1), true);
    nb_tensor *y = nb_max_pool1d(x, 4, 0, 0); /* windows [0, 4) only */
    ck_assert_msg(y != NULL, "%s", nb_last_error());
    ck_assert(isnan(nb_item(y)));
    ck_assert_int_eq(nb_backward(nb_sum_all(y)), 0);
    double g1[6] = {0, 0, 0, 1, 0, 0};
    expect_values("max_pool1d NaN tie", nb_grad(x), nb_from_data(NB_F64, NB_SHAPE(1, 6), g1), 0);
    /* 2-d: NaNs at (0, 1) and (1, 0) of a 2x2 window: the scan meets (1, 0) last */
    double v2[2][2] = {{5, NAN}, {NAN, 7}};
    nb_tensor *x2v = nb_set_requires_grad(nb_from_data(NB_F64, NB_SHAPE(1, 2, 2), v2), true);
    y = nb_max_pool2d(x2v, i2(2, 2), NULL, NULL);
    ck_assert_msg(y != NULL && isnan(nb_item(y)), "%s", nb_last_error());
    ck_assert_int_eq(nb_backward(nb_sum_all(y)), 0);
    double g2[2][2] = {{0, 0}, {1, 0}};
    expect_values("max_pool2d NaN tie", nb_grad(x2v), nb_from_data(NB_F64, NB_SHAPE(1, 2, 2), g2),
                  0);
    /* equal maxima, no NaN: the first */
    double v3[2][2] = {{7, 7}, {7, 1}};
    nb_tensor *x3 = nb_set_requires_grad(nb_from_data(NB_F64, NB_SHAPE(1, 2, 2), v3), true);
    ck_assert_int_eq(nb_backward(nb_sum_all(nb_max_pool2d(x3, i2(2, 2), NULL, NULL))), 0);
    double g3[2][2] = {{1, 0}, {0, 0}};
    expect_values("max_pool2d tie", nb_grad(x3), nb_from_data(NB_F64, NB_SHAPE(1, 2, 2), g3), 0);
    nb_scope_end();
}
END_TEST

/* --------------------------------------------------------------- modules */
START_TEST(sizes_conv_modules) {
    nb_params *ps = nb_params_new();
    nb_Conv1d c1;
    nb_Conv2d c2;
    /* conv stride and dilation 0: errors, as in nb_conv1d (they meant 1) */
    expect_error_rc(nb_conv1d_init(&c1, ps, "c", 4, 6, 3, 0, 0, 1, 1, true, NULL),
                    "nb_conv1d_init: stride must be positive, got 0");
    expect_error_rc(nb_conv1d_init(&c1, ps, "c", 4, 6, 3, 1, 0, 0, 1, true, NULL),
                    "nb_conv1d_init: dilation must be positive, got 0");
    expect_error_rc(nb_conv2d_init(&c2, ps, "c", 4, 6, i2(3, 3), i2(1, 0), NULL, NULL, 1, true,
                                   NULL),
                    "nb_conv2d_init: stride must be positive, got 0 for w");
    /* padding -1 is not "same" */
    expect_error_rc(nb_conv1d_init(&c1, ps, "c", 4, 6, 3, 1, -1, 1, 1, true, NULL),
                    "nb_conv1d_init: padding must be >= 0 or NB_PADDING_SAME, got -1");
    expect_error_rc(nb_conv2d_init(&c2, ps, "c", 4, 6, i2(3, 3), NULL, i2(2, SAME), NULL, 1, true,
                                   NULL),
                    "nb_conv2d_init: padding[1] is NB_PADDING_SAME but padding[0] is 2: \"same\" "
                    "pads both dims and is set by padding[0] alone");
    expect_error_rc(nb_conv1d_init(&c1, ps, "c", 4, 6, 3, 1, 0, MX, 1, true, NULL),
                    "nb_conv1d_init: dilation 9223372036854775807 makes the dilated kernel size "
                    "overflow int64 (kernel size 3)");
    expect_error_rc(nb_conv2d_init(&c2, ps, "c", 4, 6, i2(3, 3), NULL, NULL, i2(1, MX / 2 + 1), 1,
                                   true, NULL),
                    "nb_conv2d_init: dilation 4611686018427387904 makes the dilated kernel size "
                    "overflow int64 (kernel size 3) for w");
    expect_error_rc(nb_conv2d_init(&c2, ps, "c", 2, 1, i2(MX, MX), NULL, NULL, NULL, 1, true,
                                   NULL),
                    "nb_conv2d_init: kernel_size (9223372036854775807, 9223372036854775807) x "
                    "in/groups 2 weights per output channel pass INT64_MAX");
    expect_error_rc(nb_conv1d_init(&c1, ps, "c", MX, 1, P62, 1, 0, 1, 1, true, NULL),
                    "nb_conv1d_init: kernel_size 4611686018427387904 x in/groups "
                    "9223372036854775807 weights per output channel pass INT64_MAX");
    ck_assert_int_eq(nb_params_count(ps), 0);
    /* a padding of INT64_MAX is the module's to keep (torch's too); its
     * forward refuses it as nb_conv1d does */
    CK_OK(nb_conv1d_init(&c1, ps, "c1", 4, 6, 3, 1, MX, 1, 1, true, NULL));
    nb_scope_begin();
    expect_error(nb_conv1d_forward(&c1, x1()),
                 "nb_conv1d: padding 9223372036854775807 makes the padded input size overflow "
                 "int64");
    nb_scope_end();
    /* padding (SAME, anything): "same" in both dims, stored as (SAME, SAME) */
    CK_OK(nb_conv2d_init(&c2, ps, "c2", 4, 6, i2(3, 3), NULL, i2(SAME, 7), NULL, 1, false,
                                NULL));
    ck_assert(c2.padding[0] == SAME && c2.padding[1] == SAME);
    nb_scope_begin();
    expect_values("conv2d module same", nb_conv2d_forward(&c2, x2()),
                  nb_conv2d(x2(), c2.weight, NULL, NULL, i2(1, 1), NULL, 1), 0);
    nb_scope_end();
    nb_params_free(ps);
}
END_TEST

/* nb_print of an empty tensor with INT64_MAX rows elides them */
START_TEST(sizes_print_empty_rows) {
    nb_scope_begin();
    nb_tensor *t = nb_zeros(NB_F32, NB_SHAPE(MX, 0));
    ck_assert_ptr_nonnull(t);
    test_make_tmp_dir("sizes");
    const char *path = test_tmp_path("print.txt");
    fflush(stdout);
    int saved = dup(1);
    FILE *f = fopen(path, "w");
    ck_assert(saved >= 0 && f != NULL);
    dup2(fileno(f), 1);
    nb_print(t);
    nb_print(nb_zeros(NB_F32, NB_SHAPE(3, 0)));
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    fclose(f);
    char *text = test_read_file(path, NULL);
    ck_assert_str_eq(text, "tensor([[],\n        [],\n        [],\n        ...,\n        [],\n"
                           "        [],\n        []], shape=(9223372036854775807,0), dtype=f32)\n"
                           "tensor([[],\n        [],\n        []], shape=(3,0), dtype=f32)\n");
    free(text);
    test_remove_tmp_dir();
    nb_scope_end();
}
END_TEST

Suite *suite_sizes(void) {
    Suite *s = suite_create("sizes");
    TCase *tc = tcase_create("sizes");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, sizes_table, 0, NCASES);
    tcase_add_test(tc, sizes_conv_backward_in_padding);
    tcase_add_test(tc, sizes_conv_gradcheck_far_offsets);
    tcase_add_test(tc, sizes_pool_backward_kernel_max);
    tcase_add_test(tc, sizes_max_pool_nan_ties_gradient);
    tcase_add_test(tc, sizes_conv_modules);
    suite_add_tcase(s, tc);
    TCase *tp = tcase_create("print"); /* (a loop over INT64_MAX rows fails by its timeout) */
    tcase_set_timeout(tp, 60);
    tcase_add_test(tp, sizes_print_empty_rows);
    suite_add_tcase(s, tp);
    return s;
}
