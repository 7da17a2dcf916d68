/* test_conv_module.c: the modules nb_Conv1d and nb_Conv2d (nn/conv.c).
 * Against PyTorch (tests/fixtures/gen_conv_module.py): four modules
 * (stride, padding, dilation, "same", groups, no bias) load from a file
 * PyTorch wrote under torch's names and give torch's outputs, batched and
 * unbatched, and the gradients of x, weight and bias. Then torch's init
 * (U(+-1/sqrt(fan_in)), shapes, names), and the init's error messages. The
 * op itself (nb_conv1d / nb_conv2d) is tested with the registry's ops. */
#include "test_util.h"

#include <stdlib.h>

Suite *suite_conv_module(void);

static const char *FX = "conv_module.txt";

#define CK_OK(expr) ck_assert_msg((expr) == 0, "%s", nb_last_error() ? nb_last_error() : "?")
#define CK_NN(t) ck_assert_msg((t) != NULL, "%s", nb_last_error() ? nb_last_error() : "?")

static nb_tensor *fxn(const char *m, const char *suffix) {
    char name[64];
    snprintf(name, sizeof name, "%s.%s", m, suffix);
    return fx(FX, name);
}

typedef struct {
    nb_params *ps;
    nb_Conv2d c2, c2g;
    nb_Conv1d c1, c1g;
} torch_convs;

/* The modules of gen_conv_module.py, in f64, loaded from its file */
static void torch_convs_load(torch_convs *t) {
    nb_dtype saved = nb_default_dtype();
    nb_set_default_dtype(NB_F64);
    t->ps = nb_params_new();
    CK_OK(nb_conv2d_init(&t->c2, t->ps, "c2", 3, 4, (int64_t[]){3, 2}, (int64_t[]){2, 1},
                         (int64_t[]){1, 0}, (int64_t[]){1, 2}, 1, true, NULL));
    CK_OK(nb_conv2d_init(&t->c2g, t->ps, "c2g", 4, 6, (int64_t[]){3, 3}, NULL,
                         (int64_t[]){NB_PADDING_SAME, 0}, NULL, 2, false, NULL));
    CK_OK(nb_conv1d_init(&t->c1, t->ps, "c1", 3, 4, 3, 2, 1, 1, 1, true, NULL));
    CK_OK(nb_conv1d_init(&t->c1g, t->ps, "c1g", 4, 4, 4, 1, NB_PADDING_SAME, 2, 4, true, NULL));
    nb_set_default_dtype(saved);
    char path[512];
    snprintf(path, sizeof path, "%s/conv_module_torch.safetensors", NB_FIXTURE_DIR);
    CK_OK(nb_load(t->ps, path));
}

static nb_tensor *forward(torch_convs *t, int i, nb_tensor *x) {
    switch (i) {
    case 0: return nb_conv2d_forward(&t->c2, x);
    case 1: return nb_conv2d_forward(&t->c2g, x);
    case 2: return nb_conv1d_forward(&t->c1, x);
    default: return nb_conv1d_forward(&t->c1g, x);
    }
}

START_TEST(test_vs_torch) {
    static const char *const names[] = {"c2", "c2g", "c1", "c1g"};
    const char *name = names[_i];
    bool unbatched = _i == 0 || _i == 2;
    const char *sfx[] = {"x", "out", "w", "gx", "g_weight", "g_bias", "xu", "outu"};
    for (int k = 0; k < 8; k++)
        if ((k != 5 || _i != 1) && (k < 6 || unbatched)) fxn(name, sfx[k]);
    int64_t live = nb_live_tensors();
    torch_convs t;
    torch_convs_load(&t);
    nb_tensor *w = _i == 0 ? t.c2.weight : _i == 1 ? t.c2g.weight : _i == 2 ? t.c1.weight
                                                                            : t.c1g.weight;
    nb_tensor *b = _i == 0 ? t.c2.bias : _i == 1 ? t.c2g.bias : _i == 2 ? t.c1.bias : t.c1g.bias;
    nb_scope_begin();
    nb_tensor *x = nb_set_requires_grad(nb_detach(fxn(name, "x")), true);
    nb_tensor *y = forward(&t, _i, x);
    CK_NN(y);
    expect_close(y, fxn(name, "out"), 1e-12, 1e-12);
    CK_OK(nb_backward(nb_sum_all(nb_mul(y, fxn(name, "w")))));
    expect_close(nb_grad(x), fxn(name, "gx"), 1e-12, 1e-12);
    expect_close(nb_grad(w), fxn(name, "g_weight"), 1e-12, 1e-12);
    if (b) expect_close(nb_grad(b), fxn(name, "g_bias"), 1e-12, 1e-12);
    else ck_assert_int_eq(_i, 1); /* c2g has no bias */
    if (unbatched) {
        nb_tensor *yu = forward(&t, _i, fxn(name, "xu"));
        CK_NN(yu);
        expect_close(yu, fxn(name, "outu"), 1e-12, 1e-12);
    }
    nb_scope_end();
    nb_params_free(t.ps);
    ck_assert_int_eq(nb_live_tensors(), live);
}
END_TEST

/* torch's names, shapes and init: U(+-1/sqrt(fan_in)) for weight and bias */
static void expect_uniform(nb_tensor *p, double bound) {
    double *v = values(p), lo = 1, hi = -1;
    for (int64_t i = 0; i < nb_numel(p); i++) lo = fmin(lo, v[i]), hi = fmax(hi, v[i]);
    free(v);
    ck_assert_msg(lo >= -bound && hi <= bound, "values in [%g, %g], bound %g", lo, hi, bound);
    ck_assert_msg(lo < -0.8 * bound && hi > 0.8 * bound, "values in [%g, %g], bound %g", lo, hi,
                  bound);
}

START_TEST(test_init) {
    nb_params *ps = nb_params_new();
    nb_rng rng;
    nb_rng_seed(&rng, 2);
    nb_Conv2d c;
    CK_OK(nb_conv2d_init(&c, ps, "features.0", 4, 32, (int64_t[]){5, 5}, NULL, NULL, NULL, 2,
                         true, &rng));
    const char *name;
    ck_assert_ptr_eq(nb_params_at(ps, 0, &name), c.weight);
    ck_assert_str_eq(name, "features.0.weight");
    ck_assert_ptr_eq(nb_params_at(ps, 1, &name), c.bias);
    ck_assert_str_eq(name, "features.0.bias");
    const int64_t want[4] = {32, 2, 5, 5};
    ck_assert_int_eq(nb_ndim(c.weight), 4);
    for (int i = 0; i < 4; i++) ck_assert_int_eq(nb_shape(c.weight)[i], want[i]);
    ck_assert_int_eq(nb_shape(c.bias)[0], 32);
    /* fan_in = 4 / 2 * 5 * 5 = 50 */
    expect_uniform(c.weight, 1 / sqrt(50.0));
    expect_uniform(c.bias, 1 / sqrt(50.0));
    ck_assert_int_eq(c.stride[0], 1);
    ck_assert_int_eq(c.stride[1], 1);
    ck_assert_int_eq(c.padding[0], 0);
    ck_assert_int_eq(c.dilation[1], 1);
    ck_assert_int_eq(c.groups, 2);
    /* "same" in padding[0] is "same" in both dims */
    nb_Conv2d s;
    CK_OK(nb_conv2d_init(&s, ps, "s", 1, 2, (int64_t[]){3, 4}, NULL,
                         (int64_t[]){NB_PADDING_SAME, 5}, NULL, 1, false, &rng));
    ck_assert_int_eq(s.padding[1], NB_PADDING_SAME);
    ck_assert_ptr_null(s.bias);
    ck_assert_int_eq(nb_params_count(ps), 3);
    nb_Conv1d c1;
    CK_OK(nb_conv1d_init(&c1, ps, "c1", 6, 3, 7, 1, 0, 1, 3, true, &rng));
    ck_assert_int_eq(c1.stride, 1);
    ck_assert_int_eq(c1.dilation, 1);
    ck_assert_int_eq(nb_shape(c1.weight)[1], 2);
    ck_assert_int_eq(nb_shape(c1.weight)[2], 7);
    expect_uniform(c1.weight, 1 / sqrt(14.0));
    nb_params_free(ps);
}
END_TEST

START_TEST(test_errors) {
    nb_params *ps = nb_params_new();
    nb_Conv2d c;
    nb_Conv1d c1;
    const int64_t k3[2] = {3, 3};
    expect_error_rc(nb_conv2d_init(NULL, ps, "c", 1, 1, k3, NULL, NULL, NULL, 1, true, NULL),
                    "nb_conv2d_init: module or registry is NULL");
    expect_error_rc(nb_conv2d_init(&c, ps, "c", 1, 1, NULL, NULL, NULL, NULL, 1, true, NULL),
                    "nb_conv2d_init: kernel_size is NULL");
    expect_error_rc(nb_conv2d_init(&c, ps, "c", 0, 1, k3, NULL, NULL, NULL, 1, true, NULL),
                    "nb_conv2d_init: channels must be positive, got in 0, out 1");
    expect_error_rc(nb_conv2d_init(&c, ps, "c", 4, 6, k3, NULL, NULL, NULL, 4, true, NULL),
                    "nb_conv2d_init: groups 4 must be positive and divide in 4 and out 6");
    expect_error_rc(nb_conv1d_init(&c1, ps, "c", 4, 6, 3, 1, 0, 1, 0, true, NULL),
                    "nb_conv1d_init: groups 0 must be positive and divide in 4 and out 6");
    expect_error_rc(nb_conv2d_init(&c, ps, "c", 1, 1, (int64_t[]){3, 0}, NULL, NULL, NULL, 1,
                                   true, NULL),
                    "nb_conv2d_init: kernel_size must be positive, got 0 for w");
    expect_error_rc(nb_conv1d_init(&c1, ps, "c", 1, 1, -1, 1, 0, 1, 1, true, NULL),
                    "nb_conv1d_init: kernel_size must be positive, got -1");
    expect_error_rc(nb_conv2d_init(&c, ps, "c", 1, 1, k3, (int64_t[]){-1, 1}, NULL, NULL, 1,
                                   true, NULL),
                    "nb_conv2d_init: stride must be positive, got -1 for h");
    expect_error_rc(nb_conv1d_init(&c1, ps, "c", 1, 1, 3, 1, 0, -2, 1, true, NULL),
                    "nb_conv1d_init: dilation must be positive, got -2");
    expect_error_rc(nb_conv2d_init(&c, ps, "c", 1, 1, k3, NULL, (int64_t[]){1, -3}, NULL, 1,
                                   true, NULL),
                    "nb_conv2d_init: padding must be >= 0 or NB_PADDING_SAME, got -3 for w");
    expect_error_rc(nb_conv1d_init(&c1, ps, "c", 1, 1, 3, 2, NB_PADDING_SAME, 1, 1, true, NULL),
                    "nb_conv1d_init: padding \"same\" needs stride 1, got 2 (as torch)");
    ck_assert_int_eq(nb_params_count(ps), 0);
    nb_scope_begin();
    nb_tensor *x = nb_zeros(NB_F32, NB_SHAPE(1, 1, 4, 4));
    expect_error(nb_conv2d_forward(NULL, x), "nb_conv2d_forward: module is NULL");
    nb_Conv1d blank = {0};
    expect_error(nb_conv1d_forward(&blank, x),
                 "nb_conv1d_forward: module is not initialized (use nb_conv1d_init)");
    CK_OK(nb_conv2d_init(&c, ps, "c", 1, 1, k3, NULL, NULL, NULL, 1, true, NULL));
    expect_error(nb_conv2d_forward(&c, NULL), "nb_conv2d_forward: input 0 is NULL");
    /* what the op refuses is named by the module's forward, then the op */
    expect_error(nb_conv2d_forward(&c, nb_zeros(NB_F32, NB_SHAPE(1, 2, 4, 4))),
                 "nb_conv2d_forward: nb_conv2d");
    nb_scope_end();
    nb_params_free(ps);
}
END_TEST

Suite *suite_conv_module(void) {
    Suite *s = suite_create("conv_module");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, test_vs_torch, 0, 4);
    tcase_add_test(tc, test_init);
    tcase_add_test(tc, test_errors);
    suite_add_tcase(s, tc);
    return s;
}
