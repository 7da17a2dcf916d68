/* test_batchnorm.c: nb_BatchNorm1d/2d against torch.nn.BatchNorm1d/2d over
 * three training steps and eval (outputs, gradients, running statistics and
 * num_batches_tracked after each step), its file (nb_save under torch's
 * state_dict names), its errors; nb_batch_norm's running statistics (updated
 * once per forward, never by backward); and the losses nb_mse_loss and
 * nb_binary_cross_entropy_with_logits with each reduction, weight and
 * pos_weight. Fixtures: tests/fixtures/gen_batchnorm.py, gen_losses.py. */
#include "test_util.h"

#include <stdlib.h>

static const char *FX = "batchnorm.txt", *FXL = "losses.txt";

/* fixtures load outside any scope: the first call of a test is made before */
static void preload(void) {
    (void)fx(FX, "bn1d_nc.w");
    (void)fx(FXL, "mse.x");
}

static nb_tensor *fxf(const char *file, const char *a, const char *b) {
    char name[160];
    snprintf(name, sizeof name, "%s.%s", a, b);
    return fx(file, name);
}

/* the f64 fixture in the run's dtype */
static nb_tensor *in_dt(nb_tensor *t, nb_dtype dt) {
    nb_tensor *c = nb_to(t, dt);
    ck_assert_msg(c != NULL, "%s", nb_last_error());
    return c;
}

static double tol_of(nb_dtype dt) { return dt == NB_F64 ? 1e-10 : 2e-4; }

/* got (any dtype) against an f64 fixture */
static void near(nb_tensor *got, nb_tensor *want, nb_dtype dt) {
    ck_assert_msg(got != NULL, "%s", nb_last_error());
    expect_close(nb_to(got, NB_F64), want, tol_of(dt), tol_of(dt));
}

/* --------------------------------------------------------- the module */
typedef struct {
    const char *name;
    int dims;
    double eps, momentum;
} bn_case;

static const bn_case CASES[] = {
    {"bn1d_nc", 1, 1e-5, 0.1},  {"bn1d_ncl", 1, 1e-5, 0.1}, {"bn2d", 2, 1e-5, 0.1},
    {"bn2d_eps", 2, 1e-2, 0.3}, {"bn1d_m0", 1, 1e-5, 0.0},  {"bn1d_m1", 1, 1e-5, 1.0},
};
#define NCASES (int)(sizeof CASES / sizeof CASES[0])

static const char *STATE_NAMES[] = {"weight", "bias", "running_mean", "running_var",
                                    "num_batches_tracked"};

/* A module of case c in dtype dt, its weight and bias the fixture's. */
static void make_module(const bn_case *c, nb_dtype dt, nb_params *ps, nb_BatchNorm *m) {
    nb_dtype before = nb_default_dtype();
    nb_set_default_dtype(dt);
    int64_t C = nb_shape(fxf(FX, c->name, "w"))[0];
    int rc = c->dims == 1 ? nb_batchnorm1d_init(m, ps, "bn", C, c->eps, c->momentum)
                          : nb_batchnorm2d_init(m, ps, "bn", C, c->eps, c->momentum);
    nb_set_default_dtype(before);
    ck_assert_msg(rc == 0, "%s", nb_last_error());
    ck_assert(m->training);
    nb_scope_begin();
    ck_assert_int_eq(nb_copy_into(m->weight, in_dt(fxf(FX, c->name, "w"), dt)), 0);
    ck_assert_int_eq(nb_copy_into(m->bias, in_dt(fxf(FX, c->name, "b"), dt)), 0);
    nb_scope_end();
}

/* One forward and backward of (out * gout).sum() at prefix p ("<c>.s1",
 * "<c>.eval"), compared with torch's output and gradients. */
static void step(nb_BatchNorm *m, const char *p, nb_dtype dt) {
    nb_scope_begin();
    nb_clear_grad(m->weight);
    nb_clear_grad(m->bias);
    nb_tensor *x = nb_set_requires_grad(in_dt(fxf(FX, p, "x"), dt), true);
    nb_tensor *out = nb_batchnorm_forward(m, x);
    near(out, fxf(FX, p, "out"), dt);
    nb_tensor *loss = nb_sum_all(nb_mul(out, in_dt(fxf(FX, p, "gout"), dt)));
    ck_assert_msg(loss && nb_backward(loss) == 0, "%s", nb_last_error());
    near(nb_grad(x), fxf(FX, p, "gx"), dt);
    near(nb_grad(m->weight), fxf(FX, p, "gw"), dt);
    near(nb_grad(m->bias), fxf(FX, p, "gb"), dt);
    nb_scope_end();
}

static void expect_state(nb_BatchNorm *m, const char *p, nb_dtype dt) {
    nb_scope_begin();
    near(m->running_mean, fxf(FX, p, "running_mean"), dt);
    near(m->running_var, fxf(FX, p, "running_var"), dt);
    nb_scope_end();
    ck_assert_int_eq(nb_dtype_of(m->num_batches_tracked), NB_I64);
    ck_assert_int_eq(nb_ndim(m->num_batches_tracked), 0);
    ck_assert_int_eq(*(int64_t *)nb_data(m->num_batches_tracked),
                     *(int64_t *)nb_data(fxf(FX, p, "num_batches_tracked")));
}

/* _i: case * 2 + (f32) */
START_TEST(test_module_steps_and_eval) {
    const bn_case *c = &CASES[_i / 2];
    nb_dtype dt = _i % 2 ? NB_F32 : NB_F64;
    nb_params *ps = nb_params_new();
    nb_BatchNorm m;
    make_module(c, dt, ps, &m);
    ck_assert_int_eq(*(int64_t *)nb_data(m.num_batches_tracked), 0);
    for (int s = 0; s < 3; s++) {
        char p[64];
        snprintf(p, sizeof p, "%s.s%d", c->name, s);
        step(&m, p, dt);
        expect_state(&m, p, dt);
    }
    m.training = false;
    char p[64];
    snprintf(p, sizeof p, "%s.eval", c->name);
    step(&m, p, dt);
    snprintf(p, sizeof p, "%s.s2", c->name); /* eval leaves the state alone */
    expect_state(&m, p, dt);
    printf("batchnorm ok  %-9s %s: 3 training steps and eval match torch\n", c->name,
           nb_dtype_name(dt));
    nb_params_free(ps);
}
END_TEST

/* Backward (with create_graph, then the gradient's own backward) and forward
 * mode run no second update of the running statistics. */
START_TEST(test_running_stats_update_once) {
    const bn_case *c = &CASES[0];
    nb_params *ps = nb_params_new();
    nb_BatchNorm m;
    make_module(c, NB_F64, ps, &m);
    nb_scope_begin();
    nb_tensor *x = nb_set_requires_grad(nb_contiguous(fxf(FX, "bn1d_nc.s0", "x")), true);
    nb_tensor *out = nb_batchnorm_forward(&m, x);
    nb_tensor *loss = nb_sum_all(nb_mul(nb_mul(out, out), fxf(FX, "bn1d_nc.s0", "gout")));
    nb_backward_opts o = {.create_graph = true};
    ck_assert_msg(nb_backward_with_opts(loss, NULL, &o) == 0, "%s", nb_last_error());
    nb_tensor *gg = nb_sum_all(nb_mul(nb_grad(x), nb_grad(x)));
    ck_assert_msg(gg && nb_backward(gg) == 0, "%s", nb_last_error());
    expect_state(&m, "bn1d_nc.s0", NB_F64);
    nb_scope_end();
    nb_params_free(ps);
}
END_TEST

/* nb_save writes torch's state_dict names, and nb_load brings the running
 * statistics and num_batches_tracked back into a fresh module. */
START_TEST(test_save_names_and_load) {
    const bn_case *c = &CASES[2]; /* bn2d */
    nb_params *ps = nb_params_new();
    nb_BatchNorm m;
    make_module(c, NB_F32, ps, &m);
    for (int s = 0; s < 3; s++) {
        char p[64];
        snprintf(p, sizeof p, "%s.s%d", c->name, s);
        step(&m, p, NB_F32);
    }
    test_make_tmp_dir("batchnorm");
    const char *path = test_tmp_path("bn.safetensors");
    ck_assert_msg(nb_save(ps, path) == 0, "%s", nb_last_error());
    size_t n;
    char *bytes = test_read_file(path, &n);
    ck_assert(n > 8);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | (unsigned char)bytes[i];
    ck_assert(hlen + 8 <= n);
    char *header = calloc(hlen + 1, 1);
    memcpy(header, bytes + 8, hlen);
    int entries = 0;
    for (const char *q = header; (q = strstr(q, "\"dtype\"")); q++) entries++;
    ck_assert_int_eq(entries, 5); /* the five of torch's state_dict, nothing else */
    for (int k = 0; k < 5; k++) {
        char key[64];
        snprintf(key, sizeof key, "\"bn.%s\"", STATE_NAMES[k]);
        ck_assert_msg(strstr(header, key) != NULL, "%s not in the header: %s", key, header);
    }
    ck_assert_msg(strstr(header, "\"bn.num_batches_tracked\":{\"dtype\":\"I64\",\"shape\":[]") ||
                      strstr(header, "\"bn.num_batches_tracked\": {\"dtype\": \"I64\", \"shape\": []"),
                  "num_batches_tracked is not a 0-d I64: %s", header);
    free(header);
    free(bytes);

    nb_params *ps2 = nb_params_new();
    nb_BatchNorm m2;
    make_module(c, NB_F32, ps2, &m2);
    ck_assert_msg(nb_load(ps2, path) == 0, "%s", nb_last_error());
    expect_state(&m2, "bn2d.s2", NB_F32);
    test_remove_tmp_dir();
    nb_params_free(ps2);
    nb_params_free(ps);
}
END_TEST

START_TEST(test_module_errors) {
    nb_params *ps = nb_params_new();
    nb_BatchNorm b1, b2;
    ck_assert_int_eq(nb_batchnorm1d_init(&b1, ps, "b1", 3, 1e-5, 0.1), 0);
    ck_assert_int_eq(nb_batchnorm2d_init(&b2, ps, "b2", 3, 1e-5, 0.1), 0);
    nb_scope_begin();
    nb_tensor *x3 = nb_zeros(NB_F32, NB_SHAPE(2, 3, 4)), *x4 = nb_zeros(NB_F32, NB_SHAPE(2, 3, 2, 2));
    expect_error(nb_batchnorm_forward(&b2, x3), "nb_batchnorm_forward: BatchNorm2d expects a 4-d "
                 "(N, C, H, W) input, got 3-d (2,3,4)");
    expect_error(nb_batchnorm_forward(&b1, x4), "nb_batchnorm_forward: BatchNorm1d expects a 2-d "
                 "(N, C) or 3-d (N, C, L) input, got 4-d (2,3,2,2)");
    expect_error(nb_batchnorm_forward(&b1, nb_zeros(NB_F32, NB_SHAPE(2, 4))),
                 "nb_batchnorm_forward: input (2,4) has 4 channels (dim 1), the module 3 num_features");
    expect_error(nb_batchnorm_forward(&b1, NULL), "nb_batchnorm_forward: input 0 is NULL");
    expect_error(nb_batchnorm_forward(NULL, x3), "nb_batchnorm_forward: module is NULL");
    /* one value per channel in training (torch: ValueError); fine in eval */
    nb_tensor *one = nb_zeros(NB_F32, NB_SHAPE(1, 3));
    expect_error(nb_batchnorm_forward(&b1, one), "nb_batch_norm: training needs more than 1 "
                 "value per channel, got input shape (1,3)");
    ck_assert_int_eq(*(int64_t *)nb_data(b1.num_batches_tracked), 0); /* a failed step counts not */
    b1.training = false;
    ck_assert_ptr_nonnull(nb_batchnorm_forward(&b1, one));
    nb_scope_end();

    nb_BatchNorm bad;
    expect_error_rc(nb_batchnorm1d_init(&bad, ps, "x", 0, 1e-5, 0.1),
                    "nb_batchnorm1d_init: num_features must be positive, got 0");
    expect_error_rc(nb_batchnorm2d_init(&bad, ps, "x", 3, 0, 0.1),
                    "nb_batchnorm2d_init: eps must be finite and > 0, got 0");
    expect_error_rc(nb_batchnorm2d_init(&bad, ps, "x", 3, 1e-5, 1.5),
                    "nb_batchnorm2d_init: momentum must be in [0, 1], got 1.5");
    expect_error_rc(nb_batchnorm1d_init(&bad, ps, "b1", 3, 1e-5, 0.1),
                    "an entry named \"b1.weight\" exists already");
    nb_params_free(ps);
}
END_TEST

/* nb_batch_norm itself: its errors, and eval on the fixture's (1, C) input */
START_TEST(test_functional_errors) {
    preload();
    nb_scope_begin();
    nb_tensor *x = nb_zeros(NB_F64, NB_SHAPE(4, 3)), *w = nb_ones(NB_F64, NB_SHAPE(3));
    nb_tensor *rm = nb_zeros(NB_F64, NB_SHAPE(3)), *rv = nb_ones(NB_F64, NB_SHAPE(3));
    expect_error(nb_batch_norm(x, NULL, NULL, w, w, false, 0.1, 1e-5),
                 "nb_batch_norm: eval mode (training false) needs running_mean and running_var");
    expect_error(nb_batch_norm(x, rm, NULL, w, w, true, 0.1, 1e-5),
                 "nb_batch_norm: running_mean and running_var go together");
    expect_error(nb_batch_norm(x, rm, rv, nb_ones(NB_F64, NB_SHAPE(4)), NULL, true, 0.1, 1e-5),
                 "nb_batch_norm: weight must have shape (3) (input's channels), got (4)");
    expect_error(nb_batch_norm(x, rm, rv, nb_ones(NB_F32, NB_SHAPE(3)), NULL, true, 0.1, 1e-5),
                 "nb_batch_norm: weight is f32, input f64");
    expect_error(nb_batch_norm(nb_zeros(NB_F64, NB_SHAPE(4)), NULL, NULL, NULL, NULL, true, 0.1,
                               1e-5),
                 "nb_batch_norm: input must be (N, C, ...) with at least 2 dims, got shape (4)");
    expect_error(nb_batch_norm(x, NULL, NULL, NULL, NULL, true, 0.1, -1),
                 "nb_batch_norm: eps must be finite and >= 0, got -1");
    expect_error(nb_batch_norm(x, rm, rv, NULL, NULL, true, NAN, 1e-5),
                 "nb_batch_norm: momentum must be finite, got nan");
    /* eval with one sample: torch's output from the state after three steps */
    nb_tensor *y = nb_batch_norm(fxf(FX, "bn1d_nc.n1", "x"), fxf(FX, "bn1d_nc.s2", "running_mean"),
                                 fxf(FX, "bn1d_nc.s2", "running_var"), fxf(FX, "bn1d_nc", "w"),
                                 fxf(FX, "bn1d_nc", "b"), false, 0.1, 1e-5);
    near(y, fxf(FX, "bn1d_nc.n1", "out"), NB_F64);
    nb_scope_end();
}
END_TEST

/* Training writes the running statistics in place: an expanded view (one
 * element for C channels) and statistics sharing memory with each other or
 * with what the call reads are refused, before anything is written. */
START_TEST(test_running_stats_destinations) {
    nb_scope_begin();
    nb_tensor *x = nb_randn(NB_F64, NB_SHAPE(4, 3, 2), NULL);
    nb_tensor *one = nb_zeros(NB_F64, NB_SHAPE(1)), *ex = nb_expand(one, NB_SHAPE(3));
    nb_tensor *rm = nb_zeros(NB_F64, NB_SHAPE(3)), *rv = nb_ones(NB_F64, NB_SHAPE(3));
    expect_error(nb_batch_norm(x, ex, rv, NULL, NULL, true, 0.1, 1e-5),
                 "nb_batch_norm: running_mean of shape (3) has overlapping elements (an expanded "
                 "view, stride 0) and cannot be written in place");
    expect_error(nb_batch_norm(x, rm, ex, NULL, NULL, true, 0.1, 1e-5),
                 "nb_batch_norm: running_var of shape (3) has overlapping elements");
    ck_assert_double_eq(nb_item(one), 0); /* nothing written */
    expect_error(nb_batch_norm(x, rm, rm, NULL, NULL, true, 0.1, 1e-5),
                 "nb_batch_norm: running_mean and running_var share memory; training writes both");
    /* rows of one (2, 3) buffer are distinct memory: accepted, both written */
    nb_tensor *st = nb_zeros(NB_F64, NB_SHAPE(2, 3));
    ck_assert_ptr_nonnull(nb_batch_norm(x, nb_select(st, 0, 0), nb_select(st, 0, 1), NULL, NULL,
                                        true, 0.1, 1e-5));
    /* columns of a (3, 2) buffer interleave without meeting: accepted too */
    nb_tensor *cols = nb_zeros(NB_F64, NB_SHAPE(3, 2));
    ck_assert_ptr_nonnull(nb_batch_norm(x, nb_select(cols, 1, 0), nb_select(cols, 1, 1), NULL,
                                        NULL, true, 0.1, 1e-5));
    nb_tensor *w = nb_ones(NB_F64, NB_SHAPE(3)), *flat = nb_reshape(x, NB_SHAPE(-1));
    expect_error(nb_batch_norm(x, rm, w, w, NULL, true, 0.1, 1e-5),
                 "nb_batch_norm: running_var shares memory with weight; training writes it");
    expect_error(nb_batch_norm(x, nb_narrow(flat, 0, 3, 3), rv, NULL, NULL, true, 0.1, 1e-5),
                 "nb_batch_norm: running_mean shares memory with input; training writes it");
    /* eval writes nothing: an expanded running_var is read as it is */
    ck_assert_ptr_nonnull(nb_batch_norm(x, rm, nb_expand(nb_ones(NB_F64, NB_SHAPE(1)),
                                                         NB_SHAPE(3)), NULL, NULL, false, 0.1, 1e-5));
    nb_scope_end();
}
END_TEST

/* torch: an empty batch in training gives an empty output, zero gradients
 * for weight and bias (even with eps 0) and keeps the running statistics;
 * only exactly one value per channel is refused. */
START_TEST(test_empty_batch) {
    nb_scope_begin();
    nb_tensor *shapes[2] = {nb_zeros(NB_F64, NB_SHAPE(0, 3, 2, 2)), nb_zeros(NB_F64, NB_SHAPE(2, 3, 0))};
    for (int k = 0; k < 2; k++) {
        nb_tensor *x = nb_set_requires_grad(shapes[k], true);
        nb_tensor *w = nb_set_requires_grad(nb_ones(NB_F64, NB_SHAPE(3)), true);
        nb_tensor *b = nb_set_requires_grad(nb_zeros(NB_F64, NB_SHAPE(3)), true);
        nb_tensor *rm = nb_full(NB_F64, NB_SHAPE(3), 0.5), *rv = nb_full(NB_F64, NB_SHAPE(3), 2);
        nb_tensor *y = nb_batch_norm(x, rm, rv, w, b, true, 0.1, 0.0);
        ck_assert_ptr_nonnull(y);
        ck_assert_int_eq(nb_ndim(y), nb_ndim(x));
        for (int d = 0; d < nb_ndim(x); d++) ck_assert_int_eq(nb_shape(y)[d], nb_shape(x)[d]);
        ck_assert_int_eq(nb_backward_with_grad(y, nb_zeros(NB_F64, nb_ndim(y), nb_shape(y))), 0);
        double gw[3], gb[3], m[3], v[3];
        ck_assert_int_eq(nb_copy_to_f64(nb_grad(w), gw) | nb_copy_to_f64(nb_grad(b), gb), 0);
        ck_assert_int_eq(nb_copy_to_f64(rm, m) | nb_copy_to_f64(rv, v), 0);
        for (int c = 0; c < 3; c++) {
            ck_assert_double_eq(gw[c], 0);
            ck_assert_double_eq(gb[c], 0);
            ck_assert_double_eq(m[c], 0.5);
            ck_assert_double_eq(v[c], 2);
        }
        ck_assert_int_eq(nb_numel(nb_grad(x)), 0);
        /* eval of an empty input (a division by its zero row length once) */
        y = nb_batch_norm(nb_detach(x), rm, rv, w, b, false, 0.1, 1e-5);
        ck_assert_ptr_nonnull(y);
        ck_assert_int_eq(nb_numel(y), 0);
    }
    nb_scope_end();
}
END_TEST

/* ------------------------------------------------------------- losses */
typedef struct {
    const char *name;
    bool bce, w, pw;
} loss_case;

static const loss_case LOSSES[] = {
    {"mse", false, false, false},  {"mse3", false, false, false}, {"bce", true, false, false},
    {"bce_pw", true, false, true}, {"bce_w", true, true, false},  {"bce_both", true, true, true},
    {"bce_big", true, false, true},
};
#define NLOSSES (int)(sizeof LOSSES / sizeof LOSSES[0])

/* _i: (case * 3 + reduction) * 2 + (f32) */
START_TEST(test_losses_vs_torch) {
    const loss_case *c = &LOSSES[_i / 6];
    nb_reduction r = (nb_reduction)(_i / 2 % 3);
    nb_dtype dt = _i % 2 ? NB_F32 : NB_F64;
    static const char *RN[] = {"mean", "sum", "none"};
    char p[64];
    snprintf(p, sizeof p, "%s.%s", c->name, RN[r]);
    preload();
    nb_scope_begin();
    nb_tensor *x = nb_set_requires_grad(in_dt(fxf(FXL, c->name, "x"), dt), true);
    nb_tensor *y = nb_set_requires_grad(in_dt(fxf(FXL, c->name, "y"), dt), true);
    nb_tensor *w = c->w ? in_dt(fxf(FXL, c->name, "w"), dt) : NULL;
    nb_tensor *pw = c->pw ? in_dt(fxf(FXL, c->name, "pw"), dt) : NULL;
    nb_tensor *out = c->bce ? nb_binary_cross_entropy_with_logits(x, y, w, pw, r)
                            : nb_mse_loss(x, y, r);
    near(out, fxf(FXL, p, "out"), dt);
    nb_tensor *loss = nb_sum_all(nb_mul(out, in_dt(fxf(FXL, p, "gout"), dt)));
    ck_assert_msg(loss && nb_backward(loss) == 0, "%s", nb_last_error());
    near(nb_grad(x), fxf(FXL, p, "gx"), dt);
    near(nb_grad(y), fxf(FXL, p, "gy"), dt);
    nb_scope_end();
}
END_TEST

START_TEST(test_loss_errors) {
    nb_scope_begin();
    nb_tensor *a = nb_zeros(NB_F32, NB_SHAPE(3, 4)), *b = nb_zeros(NB_F32, NB_SHAPE(1, 4));
    /* torch broadcasts with a warning; here a different shape is an error */
    expect_error(nb_mse_loss(a, b, NB_REDUCTION_MEAN),
                 "nb_mse_loss: target shape (1,4) differs from input shape (3,4)");
    expect_error(nb_mse_loss(a, nb_zeros(NB_F64, NB_SHAPE(3, 4)), NB_REDUCTION_SUM), "nb_mse_loss",
                 "f64");
    expect_error(nb_mse_loss(a, a, (nb_reduction)7),
                 "nb_mse_loss: reduction 7 is not NB_REDUCTION_MEAN, _SUM or _NONE");
    expect_error(nb_binary_cross_entropy_with_logits(a, a, nb_zeros(NB_F32, NB_SHAPE(2, 4)), NULL,
                                                     NB_REDUCTION_MEAN),
                 "nb_binary_cross_entropy_with_logits: weight shape (2,4) does not broadcast to "
                 "input shape (3,4)");
    expect_error(nb_binary_cross_entropy_with_logits(a, a, NULL, nb_zeros(NB_F32, NB_SHAPE(3)),
                                                     NB_REDUCTION_MEAN),
                 "nb_binary_cross_entropy_with_logits: pos_weight shape (3) does not broadcast "
                 "to input shape (3,4)");
    expect_error(nb_binary_cross_entropy_with_logits(a, b, NULL, NULL, NB_REDUCTION_MEAN),
                 "nb_binary_cross_entropy_with_logits: target shape (1,4) differs from input "
                 "shape (3,4)");
    nb_scope_end();
}
END_TEST

Suite *suite_batchnorm(void) {
    Suite *s = suite_create("batchnorm");
    TCase *tc = tcase_create("module");
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, test_module_steps_and_eval, 0, 2 * NCASES);
    tcase_add_test(tc, test_running_stats_update_once);
    tcase_add_test(tc, test_save_names_and_load);
    tcase_add_test(tc, test_module_errors);
    tcase_add_test(tc, test_functional_errors);
    tcase_add_test(tc, test_running_stats_destinations);
    tcase_add_test(tc, test_empty_batch);
    suite_add_tcase(s, tc);
    TCase *tl = tcase_create("losses");
    tcase_add_loop_test(tl, test_losses_vs_torch, 0, NLOSSES * 6);
    tcase_add_test(tl, test_loss_errors);
    suite_add_tcase(s, tl);
    return s;
}
