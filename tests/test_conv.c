/* test_conv.c: nb_conv1d and nb_conv2d against PyTorch (tests/fixtures/
 * gen_conv.py): stride, padding, "same" with odd and even kernels and
 * dilation 2, groups and depthwise, no bias, 1x1, unbatched, many small
 * images (batched into one product), conv1d; outputs and the gradients of
 * input, weight and bias, in f64 and f32. Then gradcheck (all orders) with a
 * bias and on transposed input and weight, bitwise identity across thread
 * counts, and the error messages. The registry suite does the rest. */
#include "test_util.h"

#define FX "conv.txt"
#define SAME NB_PADDING_SAME

typedef struct {
    const char *name;
    bool d1;
    int64_t s[2], p[2], d[2], g; /* conv1d: index 1 */
} conv_case;

/* gen_conv.py's CASES, in its order */
static const conv_case CASES[] = {
    {"stride2", false, {2, 2}, {0, 0}, {1, 1}, 1},
    {"pad", false, {1, 1}, {2, 1}, {1, 1}, 1},
    {"same_odd", false, {1, 1}, {SAME, 0}, {1, 1}, 1},
    {"same_even", false, {1, 1}, {SAME, 0}, {1, 1}, 1},
    {"same_dil2", false, {1, 1}, {SAME, 0}, {2, 2}, 1},
    {"groups2", false, {1, 2}, {1, 1}, {1, 1}, 2},
    {"depthwise", false, {1, 1}, {1, 1}, {1, 1}, 3},
    {"nobias", false, {1, 1}, {0, 0}, {1, 1}, 1},
    {"one_by_one", false, {1, 1}, {0, 0}, {1, 1}, 1},
    {"unbatched", false, {2, 1}, {1, 1}, {1, 1}, 1},
    {"many", false, {1, 1}, {1, 1}, {1, 1}, 1},
    {"d1_stride2", true, {0, 2}, {0, 1}, {0, 1}, 1},
    {"d1_same_even", true, {0, 1}, {0, SAME}, {0, 2}, 2},
    {"d1_unbatched", true, {0, 1}, {0, 0}, {0, 3}, 1},
};
#define NCASES (int)(sizeof CASES / sizeof CASES[0])

static nb_tensor *run_case(const conv_case *c, nb_tensor *x, nb_tensor *w, nb_tensor *b) {
    if (c->d1) return nb_conv1d(x, w, b, c->s[1], c->p[1], c->d[1], c->g);
    return nb_conv2d(x, w, b, c->s, c->p, c->d, c->g);
}

static nb_tensor *leaf_of(nb_tensor *fixture) {
    return nb_set_requires_grad(nb_contiguous(fixture), true);
}

/* Output and gradients against torch's, for one case and dtype. */
START_TEST(conv_matches_torch) {
    const conv_case *c = &CASES[_i / 2];
    const char *dt = _i % 2 ? "f32" : "f64";
    double tol = _i % 2 ? 2e-5 : 1e-12;
    char k[128];
#define NAME(part) (snprintf(k, sizeof k, "conv.%s.%s.%s", c->name, dt, part), k)
    bool bias = strcmp(c->name, "nobias") && strcmp(c->name, "d1_unbatched");
    /* fixtures load outside scopes */
    nb_tensor *fx_x = fx(FX, NAME("x")), *fx_w = fx(FX, NAME("w")), *fx_gy = fx(FX, NAME("gy"));
    nb_tensor *fx_y = fx(FX, NAME("y")), *fx_gx = fx(FX, NAME("gx")), *fx_gw = fx(FX, NAME("gw"));
    nb_tensor *fx_b = bias ? fx(FX, NAME("b")) : NULL, *fx_gb = bias ? fx(FX, NAME("gb")) : NULL;
    nb_scope_begin();
    nb_tensor *x = leaf_of(fx_x), *w = leaf_of(fx_w), *b = bias ? leaf_of(fx_b) : NULL;
    nb_tensor *y = run_case(c, x, w, b);
    ck_assert_msg(y != NULL, "%s: %s", c->name, nb_last_error());
    expect_close(y, fx_y, tol, tol);
    ck_assert_int_eq(nb_backward(nb_sum_all(nb_mul(y, fx_gy))), 0);
    expect_close(nb_grad(x), fx_gx, tol, tol);
    expect_close(nb_grad(w), fx_gw, tol, tol);
    if (bias) expect_close(nb_grad(b), fx_gb, tol, tol);
#undef NAME
    nb_scope_end();
}
END_TEST

/* ------------------------------------------------------- gradcheck */
static nb_tensor *conv_fn(nb_tensor **in, int n, void *ctx) {
    (void)n;
    const conv_case *c = ctx;
    return run_case(c, in[0], in[1], in[2]);
}

START_TEST(conv_gradcheck_bias_and_transposed) {
    static const conv_case c2s = {"g", false, {2, 1}, {1, 0}, {1, 2}, 2};
    static const conv_case c1 = {"g", true, {0, 1}, {0, SAME}, {0, 2}, 1};
    nb_scope_begin();
    nb_tensor *in[3] = {transposed_leaf(1, NB_SHAPE(2, 4, 5, 6), 2, 3),
                        transposed_leaf(2, NB_SHAPE(4, 2, 3, 2), 2, 3), rand_leaf(3, NB_SHAPE(4))};
    expect_all_orders("nb_conv2d (transposed x, w; bias)", conv_fn, (void *)&c2s, 3, in);
    nb_tensor *in1[3] = {rand_leaf(4, NB_SHAPE(2, 3, 7)), transposed_leaf(5, NB_SHAPE(2, 3, 4), 1, 2),
                         rand_leaf(6, NB_SHAPE(2))};
    expect_all_orders("nb_conv1d (same, even kernel; bias)", conv_fn, (void *)&c1, 3, in1);
    nb_scope_end();
}
END_TEST

/* ---------------------------------------------------- thread identity */
/* x (N,C,H,H), w (O,C,K,K), padding pad: y and the three gradients of
 * sum(y^2) the same bits on 1, 2 and 3 threads. */
static void same_bits_case(int64_t N, int64_t C, int64_t H, int64_t O, int64_t K, int64_t pad) {
    int before = nb_num_threads();
    nb_tensor *ref[4] = {0};
    for (int t = 1; t <= 3; t++) {
        nb_set_num_threads(t);
        nb_scope_begin();
        nb_rng r;
        nb_rng_seed(&r, 9);
        nb_tensor *x = nb_set_requires_grad(nb_randn(NB_F32, NB_SHAPE(N, C, H, H), &r), true);
        nb_tensor *w = nb_set_requires_grad(nb_randn(NB_F32, NB_SHAPE(O, C, K, K), &r), true);
        nb_tensor *b = nb_set_requires_grad(nb_randn(NB_F32, NB_SHAPE(O), &r), true);
        nb_tensor *y = nb_conv2d(x, w, b, NULL, (const int64_t[]){pad, pad}, NULL, 1);
        ck_assert_int_eq(nb_backward(nb_sum_all(nb_mul(y, y))), 0);
        nb_tensor *got[4] = {y, nb_grad(x), nb_grad(w), nb_grad(b)};
        for (int k = 0; k < 4; k++) {
            if (t == 1) {
                ref[k] = nb_keep(nb_contiguous(nb_detach(got[k])));
                continue;
            }
            ck_assert_int_eq(nb_numel(got[k]), nb_numel(ref[k]));
            nb_tensor *gk = nb_contiguous(got[k]);
            ck_assert_msg(!memcmp(nb_data(gk), nb_data(ref[k]), (size_t)nb_numel(gk) * 4),
                          "output %d of x (%lld,%lld,%lld,%lld) differs between 1 and %d "
                          "threads", k, (long long)N, (long long)C, (long long)H, (long long)H, t);
        }
        nb_scope_end();
    }
    for (int k = 0; k < 4; k++) nb_free(ref[k]);
    nb_set_num_threads(before);
}

START_TEST(conv_same_bits_any_thread_count) {
    same_bits_case(37, 6, 9, 70, 3, SAME);
    /* images of more pixels than the L2 holds columns of W's gradient
     * (3,721 x 1,024 rows): they are cut into tiles, which once followed
     * the thread count (the chunks of W a task makes) and changed the sums */
    same_bits_case(1, 64, 64, 16, 4, 0);
}
END_TEST

/* ---------------------------------------------------------- errors */
START_TEST(conv_errors_name_the_sizes) {
    nb_scope_begin();
    nb_tensor *x = nb_zeros(NB_F32, NB_SHAPE(2, 4, 5, 5)), *w = nb_zeros(NB_F32, NB_SHAPE(6, 4, 3, 3));
    expect_error(nb_conv2d(x, nb_zeros(NB_F32, NB_SHAPE(6, 3, 3, 3)), NULL, NULL, NULL, NULL, 1),
                 "nb_conv2d: weight (6,3,3,3) expects 3 input channels (3 per group x 1 groups), "
                 "input (2,4,5,5) has 4");
    expect_error(nb_conv2d(x, nb_zeros(NB_F32, NB_SHAPE(6, 2, 3, 3)), NULL, NULL, NULL, NULL, 3),
                 "nb_conv2d: groups 3 must divide in_channels 4 and out_channels 6");
    expect_error(nb_conv2d(x, nb_zeros(NB_F32, NB_SHAPE(6, 4, 7, 3)), NULL, NULL, NULL, NULL, 1),
                 "nb_conv2d: kernel size 7 (dilated 7) is larger than the padded input size 5");
    expect_error(nb_conv2d(x, w, NULL, NULL, NULL, (const int64_t[]){3, 1}, 1),
                 "kernel size 3 (dilated 7) is larger than the padded input size 5");
    expect_error(nb_conv2d(x, w, NULL, (const int64_t[]){2, 2}, (const int64_t[]){SAME, 0}, NULL, 1),
                 "nb_conv2d: padding \"same\" needs stride 1, got stride 2");
    expect_error(nb_conv2d(nb_zeros(NB_F32, NB_SHAPE(4, 5)), w, NULL, NULL, NULL, NULL, 1),
                 "nb_conv2d: input must be (N, C, H, W) or (C, H, W), got shape (4,5)");
    expect_error(nb_conv2d(x, nb_zeros(NB_F32, NB_SHAPE(6, 4, 3)), NULL, NULL, NULL, NULL, 1),
                 "nb_conv2d: weight must be (out_channels, in_channels/groups, kH, kW), got "
                 "shape (6,4,3)");
    expect_error(nb_conv2d(x, nb_zeros(NB_F64, NB_SHAPE(6, 4, 3, 3)), NULL, NULL, NULL, NULL, 1),
                 "nb_conv2d: dtype mismatch (f32 vs f64)");
    expect_error(nb_conv2d(x, w, nb_zeros(NB_F32, NB_SHAPE(5)), NULL, NULL, NULL, 1),
                 "nb_conv2d: bias must have shape (6) (out_channels), got (5)");
    expect_error(nb_conv2d(x, w, NULL, (const int64_t[]){0, 1}, NULL, NULL, 1),
                 "nb_conv2d: stride must be >= 1, got 0");
    expect_error(nb_conv2d(x, w, NULL, NULL, NULL, NULL, 0), "nb_conv2d: groups must be >= 1, got 0");
    expect_error(nb_conv2d(nb_to(x, NB_BF16), nb_to(w, NB_BF16), NULL, NULL, NULL, NULL, 1),
                 "nb_conv2d", "bf16");
    expect_error(nb_conv2d(nb_zeros(NB_I64, NB_SHAPE(2, 4, 5, 5)), w, NULL, NULL, NULL, NULL, 1),
                 "nb_conv2d: expected a floating tensor (f32 or f64), got i64");
    nb_tensor *x1 = nb_zeros(NB_F64, NB_SHAPE(2, 4, 9));
    expect_error(nb_conv1d(x1, nb_zeros(NB_F64, NB_SHAPE(3, 4, 3)), NULL, 2, SAME, 1, 1),
                 "nb_conv1d: padding \"same\" needs stride 1, got stride 2");
    expect_error(nb_conv1d(nb_zeros(NB_F64, NB_SHAPE(9)), nb_zeros(NB_F64, NB_SHAPE(3, 4, 3)),
                           NULL, 1, 0, 1, 1),
                 "nb_conv1d: input must be (N, C, L) or (C, L), got shape (9)");
    expect_error(nb_conv1d(x1, nb_zeros(NB_F64, NB_SHAPE(3, 4, 3)), NULL, 1, -2, 1, 1),
                 "nb_conv1d: padding must be >= 0 or NB_PADDING_SAME, got -2");
    nb_scope_end();
}
END_TEST

Suite *suite_conv(void) {
    Suite *s = suite_create("conv");
    TCase *tc = tcase_create("conv");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, conv_matches_torch, 0, 2 * NCASES);
    tcase_add_test(tc, conv_gradcheck_bias_and_transposed);
    tcase_add_test(tc, conv_same_bits_any_thread_count);
    tcase_add_test(tc, conv_errors_name_the_sizes);
    suite_add_tcase(s, tc);
    return s;
}
