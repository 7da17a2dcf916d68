/* test_conv.c: nb_conv1d and nb_conv2d against PyTorch (tests/fixtures/
 * gen_conv.py): stride, padding, "same" with odd and even kernels and
 * dilation 2, groups and depthwise, no bias, 1x1, unbatched, many small
 * images (batched into one product), conv1d; outputs and the gradients of
 * input, weight and bias, in f64 and f32. Then gradcheck (all orders) with a
 * bias and on transposed input and weight, bitwise identity across thread
 * counts, and the error messages. The registry suite does the rest. */
#include "test_util.h"

#include "../ops/conv_internal.h"

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
    /* f32 Winograd (AVX-512 CPUs): 5x5 and 3x3, 180 and 147 tiles (the
     * weight gradient's chunks of tiles are fewer) */
    same_bits_case(5, 20, 11, 33, 5, 2);
    same_bits_case(3, 16, 13, 32, 3, 1);
}
END_TEST

/* ------------------------------------------------------------ Winograd */
/* y and the gradients of x, w, b for loss sum(y * gy) of a conv: with
 * Winograd's kernels (on: 1) or the im2col path (0), in dt. x is read
 * through a transposed view when tx. */
typedef struct {
    nb_tensor *out[4]; /* y, gx, gw, gb */
} conv_run;

static conv_run wino_run(int on, nb_dtype dt, int64_t N, int64_t C, int64_t H, int64_t W,
                         int64_t O, int64_t K, int64_t pad, bool tx, double poison) {
    int before = nbi_wino_force(on);
    nb_rng r;
    nb_rng_seed(&r, 21);
    nb_tensor *x0 = nb_randn(NB_F32, NB_SHAPE(N, C, W, H), &r);
    nb_tensor *w0 = nb_randn(NB_F32, NB_SHAPE(O, C, K, K), &r);
    nb_tensor *b0 = nb_randn(NB_F32, NB_SHAPE(O), &r);
    if (poison != 0) ((float *)nb_data(x0))[5] = (float)poison; /* (0,0,0,5) */
    nb_tensor *x = nb_set_requires_grad(nb_to(tx ? x0 : nb_contiguous(nb_transpose(x0, 2, 3)), dt), true);
    nb_tensor *w = nb_set_requires_grad(nb_to(w0, dt), true);
    nb_tensor *b = nb_set_requires_grad(nb_to(b0, dt), true);
    nb_tensor *xv = tx ? nb_transpose(x, 2, 3) : x;
    nb_tensor *y = nb_conv2d(xv, w, b, NULL, (const int64_t[]){pad, pad}, NULL, 1);
    ck_assert_ptr_nonnull(y);
    nb_tensor *gy = nb_to(nb_randn(NB_F32, 4, nb_shape(y), &r), dt);
    ck_assert_int_eq(nb_backward_with_grad(y, gy), 0);
    conv_run out = {{nb_detach(y), nb_grad(x), nb_grad(w), nb_grad(b)}};
    nbi_wino_force(before);
    return out;
}

/* Whether this CPU runs the Winograd kernels. */
static bool wino_here(void) {
    int prev = nbi_wino_force(1);
    bool have = nbi_wino_enabled();
    nbi_wino_force(prev);
    return have;
}

/* The largest |a - ref| over the largest |ref|. */
static double rel_err(nb_tensor *a, nb_tensor *ref) {
    nb_tensor *d = nb_to(nb_contiguous(a), NB_F64), *e = nb_contiguous(ref);
    const double *p = nb_data(d), *q = nb_data(e);
    double err = 0, scale = 0;
    for (int64_t i = 0; i < nb_numel(d); i++) {
        err = fmax(err, fabs(p[i] - q[i]));
        scale = fmax(scale, fabs(q[i]));
    }
    return err / scale;
}

static bool same_bits(nb_tensor *a, nb_tensor *b) {
    nb_tensor *p = nb_contiguous(a), *q = nb_contiguous(b);
    return nb_numel(p) == nb_numel(q) &&
           !memcmp(nb_data(p), nb_data(q), (size_t)nb_numel(p) * sizeof(float)); /* f32 */
}

/* Winograd's f32 results against the f64 im2col ones for 3x3 and 5x5
 * kernels, every padding Winograd takes (0..K-1), odd sizes, channel counts
 * that are not multiples of 16 and a transposed input: within 4e-5 of the
 * largest value (measured: at most 1.2e-5, the weight gradient of a 5x5
 * conv of 32 channels; im2col's f32 error there is 4e-7), and not the bits
 * of the im2col path (so Winograd did run). */
START_TEST(conv_winograd_matches_direct) {
    if (!wino_here()) return; /* no AVX-512: conv.c's im2col path is all there is */
    static const int64_t cases[][8] = {
        /* N, C, H, W, O, K, pad, transposed x */
        {2, 32, 14, 14, 64, 5, 2, 0}, {3, 17, 9, 7, 18, 5, 0, 1}, {1, 16, 6, 5, 20, 5, 4, 0},
        {2, 20, 11, 13, 33, 3, 1, 1}, {2, 16, 8, 8, 16, 3, 0, 0}, {1, 24, 5, 9, 16, 3, 2, 0},
    };
    const char *names[4] = {"y", "grad x", "grad w", "grad b"};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int64_t *k = cases[c];
        nb_scope_begin();
        conv_run wi = wino_run(1, NB_F32, k[0], k[1], k[2], k[3], k[4], k[5], k[6], k[7], 0);
        conv_run im = wino_run(0, NB_F32, k[0], k[1], k[2], k[3], k[4], k[5], k[6], k[7], 0);
        conv_run ref = wino_run(0, NB_F64, k[0], k[1], k[2], k[3], k[4], k[5], k[6], k[7], 0);
        for (int q = 0; q < 4; q++) {
            double e = rel_err(wi.out[q], ref.out[q]);
            ck_assert_msg(e <= 4e-5, "case %zu (K %lld pad %lld): %s error %.3g", c,
                          (long long)k[5], (long long)k[6], names[q], e);
            ck_assert_msg(rel_err(im.out[q], ref.out[q]) <= 4e-6, "case %zu: im2col %s", c,
                          names[q]);
            if (q < 3) /* the bias gradient is not a conv */
                ck_assert_msg(!same_bits(wi.out[q], im.out[q]), "case %zu: %s took im2col", c,
                              names[q]);
        }
        nb_scope_end();
    }
}
END_TEST

/* Second order through the Winograd kernels: with create_graph, the input
 * gradient's node differentiates again into a conv and a weight gradient,
 * which take Winograd's kernels too. d/dw of sum(gx^2), gx = d sum(y^2)/dx,
 * in f32 against the f64 im2col value, and not the f32 im2col bits. */
static nb_tensor *second_order_grad(int on, nb_dtype dt) {
    int before = nbi_wino_force(on);
    nb_rng r;
    nb_rng_seed(&r, 33);
    nb_tensor *x = nb_set_requires_grad(nb_to(nb_randn(NB_F32, NB_SHAPE(2, 16, 7, 8), &r), dt), true);
    nb_tensor *w = nb_set_requires_grad(nb_to(nb_randn(NB_F32, NB_SHAPE(16, 16, 3, 3), &r), dt), true);
    nb_tensor *y = nb_conv2d(x, w, NULL, NULL, (const int64_t[]){1, 1}, NULL, 1);
    nb_tensor *s = nb_sum_all(nb_mul(y, y)), *gx = NULL;
    const nb_backward_opts create = {.create_graph = true};
    ck_assert_int_eq(nb_autograd_grad(&s, 1, NULL, &x, 1, &create, &gx), 0);
    nb_tensor *gw = NULL, *t = nb_sum_all(nb_mul(gx, gx));
    ck_assert_int_eq(nb_autograd_grad(&t, 1, NULL, &w, 1, NULL, &gw), 0);
    nbi_wino_force(before);
    return gw;
}

START_TEST(conv_winograd_second_order) {
    if (!wino_here()) return;
    nb_scope_begin();
    nb_tensor *wi = second_order_grad(1, NB_F32), *im = second_order_grad(0, NB_F32);
    nb_tensor *ref = second_order_grad(0, NB_F64);
    double e = rel_err(wi, ref);
    ck_assert_msg(e <= 4e-5, "second order through Winograd: error %.3g", e);
    ck_assert_msg(!same_bits(wi, im), "second order took im2col");
    nb_scope_end();
}
END_TEST

/* An infinity in x: direct sums give inf where it reaches and finite
 * values elsewhere, Winograd's transforms would spread it as NaN (inf -
 * inf) over the tiles around it. Every non-finite Winograd result is
 * recomputed by im2col, so the bits are the im2col path's, as PyTorch's. */
START_TEST(conv_winograd_infinity_as_direct) {
    if (!wino_here()) return;
    for (int s = 0; s < 3; s++) {
        double v = s == 0 ? INFINITY : s == 1 ? -INFINITY : NAN;
        nb_scope_begin();
        conv_run wi = wino_run(1, NB_F32, 2, 16, 10, 10, 16, 5, 2, false, v);
        conv_run im = wino_run(0, NB_F32, 2, 16, 10, 10, 16, 5, 2, false, v);
        /* y and grad w read x: the im2col path's bits; grad x does not (gy
         * and w are finite): Winograd's own finite values */
        ck_assert_msg(same_bits(wi.out[0], im.out[0]), "poison %g: y differs", v);
        ck_assert_msg(same_bits(wi.out[2], im.out[2]), "poison %g: grad w differs", v);
        ck_assert_msg(!same_bits(wi.out[1], im.out[1]) && rel_err(wi.out[1], nb_to(im.out[1], NB_F64)) < 4e-5,
                      "poison %g: grad x", v);
        /* and the infinity stays where it reaches: finite values elsewhere */
        const float *y = nb_data(nb_contiguous(wi.out[0]));
        ck_assert(isfinite(y[16 * 100 + 99])); /* image 1 never sees it */
        ck_assert(!isfinite(y[5 * 10])); /* y (0,0,5,0) reads x (0,0,5,0) */
        nb_scope_end();
    }
}
END_TEST

/* No input channels (fuzz_ops found the weight gradient dividing by its
 * zero column blocks): y is the bias, the gradients of x and w are empty,
 * b's is the sum of g. */
START_TEST(conv_no_input_channels) {
    nb_scope_begin();
    nb_tensor *x = nb_set_requires_grad(nb_zeros(NB_F32, NB_SHAPE(2, 0, 4, 4)), true);
    nb_tensor *w = nb_set_requires_grad(nb_zeros(NB_F32, NB_SHAPE(3, 0, 3, 3)), true);
    nb_tensor *b = nb_set_requires_grad(nb_full(NB_F32, NB_SHAPE(3), 1.5), true);
    nb_tensor *y = nb_conv2d(x, w, b, NULL, (const int64_t[]){1, 1}, NULL, 1);
    ck_assert_ptr_nonnull(y);
    ck_assert_double_eq(nb_item(nb_sum_all(y)), 1.5 * 2 * 3 * 16);
    ck_assert_int_eq(nb_backward(nb_sum_all(y)), 0);
    ck_assert_int_eq(nb_numel(nb_grad(x)), 0);
    ck_assert_int_eq(nb_numel(nb_grad(w)), 0);
    ck_assert_double_eq(nb_item(nb_sum_all(nb_grad(b))), 2 * 3 * 16);
    nb_scope_end();
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
    tcase_add_test(tc, conv_winograd_matches_direct);
    tcase_add_test(tc, conv_winograd_second_order);
    tcase_add_test(tc, conv_no_input_channels);
    tcase_add_test(tc, conv_winograd_infinity_as_direct);
    tcase_add_test(tc, conv_errors_name_the_sizes);
    suite_add_tcase(s, tc);
    return s;
}
