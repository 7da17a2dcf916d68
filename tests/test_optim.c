/* test_optim.c: nb_sgd, nb_adam, nb_adamw, nb_clip_grad_norm and nb_noam_rate
 * against PyTorch 1.13 (tests/fixtures/gen_optim.py): parameter trajectories
 * after each of 5 steps in f64 (1e-12) and f32 (1e-6), parameters that get
 * their first gradient late (own step count), parameters without a gradient
 * left untouched, nb_optim_set_lr, gradient clipping above and below the
 * limit (and the same bits on any thread count), the Noam schedule; a small
 * regression problem that SGD and Adam solve; bad hyperparameters; state
 * allocation and no leaks. */
#include "test_util.h"

#include <stdlib.h>



static const char *FX = "optim.txt";
#define STEPS 5

#define CHECK_NOT_NULL(t) ck_assert_msg((t) != NULL, "%s", nb_last_error() ? nb_last_error() : "?")

static nb_tensor *F(const char *name) { return fx(FX, name); }

static nb_tensor *Fs(const char *prefix, const char *suffix) {
    char name[96];
    snprintf(name, sizeof name, "%s%s", prefix, suffix);
    return fx(FX, name);
}

/* Registers a copy of init (converted to dtype) as name. */
static nb_tensor *add_param(nb_params *ps, const char *name, nb_tensor *init, nb_dtype dtype) {
    nb_scope_begin();
    nb_tensor *z = nb_zeros(dtype, nb_ndim(init), nb_shape(init));
    CHECK_NOT_NULL(z);
    ck_assert_int_eq(nb_copy_into(z, init), 0);
    nb_tensor *p = nb_params_add(ps, name, z);
    nb_scope_end();
    CHECK_NOT_NULL(p);
    return p;
}

/* Accumulates g (converted to p's dtype) into p's .grad through a backward
 * pass: d/dp sum(p * g) = g exactly. */
static void add_grad(nb_tensor *p, nb_tensor *g) {
    nb_scope_begin();
    nb_tensor *gg = nb_zeros(nb_dtype_of(p), nb_ndim(g), nb_shape(g));
    CHECK_NOT_NULL(gg);
    ck_assert_int_eq(nb_copy_into(gg, g), 0);
    ck_assert_msg(nb_backward(nb_sum_all(nb_mul(p, gg))) == 0, "%s", nb_last_error());
    nb_scope_end();
}

/* max |got - want| over all elements */
static double max_dev(const nb_tensor *got, const nb_tensor *want) {
    int64_t n = nb_numel(got);
    ck_assert_int_eq(n, nb_numel(want));
    double *a = malloc((size_t)n * sizeof *a), *b = malloc((size_t)n * sizeof *b);
    nb_copy_to_f64(got, a);
    nb_copy_to_f64(want, b);
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs(a[i] - b[i]));
    free(a);
    free(b);
    return m;
}

static void expect_values(const nb_tensor *t, const double *want, int64_t n, double tol) {
    ck_assert_int_eq(nb_numel(t), n);
    double got[64];
    ck_assert(n <= 64);
    nb_copy_to_f64(t, got);
    for (int64_t i = 0; i < n; i++)
        ck_assert_msg(fabs(got[i] - want[i]) <= tol, "element %lld is %.17g, expected %.17g",
                      (long long)i, got[i], want[i]);
}

static void expect_msg(const char *a, const char *b) {
    const char *m = nb_last_error();
    ck_assert_msg(m != NULL, "no error set");
    ck_assert_msg(strstr(m, a) && strstr(m, b), "error \"%s\" lacks \"%s\" or \"%s\"", m, a, b);
    nb_clear_error();
}

/* ------------------------------------------------------------ trajectories */
typedef enum { SGD, ADAM, ADAMW } kind;
typedef struct {
    const char *name; /* fixture prefix */
    kind k;
    double lr, momentum, wd;
    bool late; /* b has no gradient in steps 1 and 2 */
    nb_dtype dtype;
} traj_case;

static const traj_case traj[] = {
    {"sgd", SGD, 0.1, 0.9, 0.01, false, NB_F64},
    {"sgd_plain", SGD, 0.1, 0.0, 0.0, false, NB_F64},
    {"adam", ADAM, 1e-2, 0, 0.0, false, NB_F64},
    {"adam_wd", ADAM, 1e-2, 0, 0.1, false, NB_F64},
    {"adamw", ADAMW, 1e-2, 0, 0.1, false, NB_F64},
    {"sgd_late", SGD, 0.1, 0.9, 0.01, true, NB_F64},
    {"adam_late", ADAM, 1e-2, 0, 0.0, true, NB_F64},
    {"adamw_late", ADAMW, 1e-2, 0, 0.1, true, NB_F64},
    {"sgd_f32", SGD, 0.1, 0.9, 0.01, false, NB_F32},
    {"adam_wd_f32", ADAM, 1e-2, 0, 0.1, false, NB_F32},
    {"adamw_f32", ADAMW, 1e-2, 0, 0.1, false, NB_F32},
};
#define NTRAJ (int)(sizeof traj / sizeof traj[0])

static nb_optim *make_opt(const traj_case *c, nb_params *ps) {
    nb_optim *o = c->k == SGD    ? nb_sgd(ps, c->lr, c->momentum, c->wd)
                : c->k == ADAM ? nb_adam(ps, c->lr, 0.9, 0.98, 1e-9, c->wd)
                               : nb_adamw(ps, c->lr, 0.9, 0.98, 1e-9, c->wd);
    CHECK_NOT_NULL(o);
    return o;
}

/* Runs case c for 5 steps, comparing after each; returns the largest deviation. */
static double run_case(const traj_case *c, nb_params *ps, nb_tensor *w, nb_tensor *b,
                       nb_optim *o) {
    (void)ps;
    double tol = c->dtype == NB_F64 ? 1e-12 : 1e-6;
    nb_tensor *gw = F("grads_w"), *gb = F("grads_b");
    nb_tensor *ww = Fs(c->name, "_w"), *wb = Fs(c->name, "_b");
    double dev = 0;
    for (int k = 0; k < STEPS; k++) {
        nb_scope_begin();
        add_grad(w, nb_select(gw, 0, k));
        if (c->late && k < 2) ck_assert_ptr_null(nb_grad(b));
        else add_grad(b, nb_select(gb, 0, k));
        nb_optim_step(o);
        ck_assert_msg(nb_last_error() == NULL, "%s", nb_last_error());
        nb_tensor *want_w = nb_select(ww, 0, k), *want_b = nb_select(wb, 0, k);
        expect_close(w, want_w, tol, tol);
        expect_close(b, want_b, tol, tol);
        dev = fmax(dev, fmax(max_dev(w, want_w), max_dev(b, want_b)));
        nb_optim_zero_grad(o);
        nb_scope_end();
    }
    /* the step records nothing: the parameters are still leaves that require grad */
    ck_assert(nb_is_leaf(w) && nb_requires_grad(w));
    ck_assert_int_eq(nb_dtype_of(w), c->dtype);
    return dev;
}

START_TEST(test_trajectory) {
    const traj_case *c = &traj[_i];
    nb_tensor *iw = F("init_w"), *ib = F("init_b");
    nb_clear_error();
    nb_params *ps = nb_params_new();
    nb_tensor *w = add_param(ps, "weight", iw, c->dtype);
    nb_tensor *b = add_param(ps, "bias", ib, c->dtype);
    nb_optim *o = make_opt(c, ps);
    double dev = run_case(c, ps, w, b, o);
    printf("optim ok  %-12s 5 steps vs torch, max |nabla - torch| %.1e\n", c->name, dev);
    fflush(stdout);
    nb_optim_free(o);
    nb_params_free(ps);
}
END_TEST

/* State made inside an open scope survives the scope (it is persistent). */
START_TEST(test_state_outlives_scope) {
    nb_tensor *iw = F("init_w"), *ib = F("init_b");
    for (int kind_i = 0; kind_i < 3; kind_i++) {
        const traj_case *c = &traj[kind_i == 0 ? 0 : kind_i == 1 ? 3 : 4]; /* sgd adam_wd adamw */
        nb_params *ps = nb_params_new();
        nb_tensor *w = add_param(ps, "w", iw, NB_F64), *b = add_param(ps, "b", ib, NB_F64);
        nb_scope_begin();
        nb_scope_begin();
        nb_optim *o = make_opt(c, ps);
        nb_scope_end();
        nb_scope_end();
        run_case(c, ps, w, b, o);
        nb_optim_free(o);
        nb_params_free(ps);
    }
}
END_TEST

/* A registered parameter that never gets a gradient is skipped entirely:
 * no weight decay, no momentum, no step count; the others follow torch. */
START_TEST(test_param_without_grad_untouched) {
    nb_tensor *iw = F("init_w"), *ib = F("init_b");
    for (int ci = 0; ci < 5; ci++) {
        const traj_case *c = &traj[ci];
        nb_params *ps = nb_params_new();
        nb_tensor *w = add_param(ps, "w", iw, NB_F64);
        nb_tensor *frozen = add_param(ps, "frozen", ib, NB_F64);
        nb_tensor *b = add_param(ps, "b", ib, NB_F64);
        nb_optim *o = make_opt(c, ps);
        run_case(c, ps, w, b, o);
        ck_assert_ptr_null(nb_grad(frozen));
        expect_close(frozen, ib, 0, 0);
        nb_optim_free(o);
        nb_params_free(ps);
    }
}
END_TEST

/* A zeroed gradient is still a gradient (torch's zero_grad(set_to_none=False)):
 * weight decay and momentum keep acting. */
START_TEST(test_zero_grad) {
    nb_params *ps = nb_params_new();
    nb_tensor *p = add_param(ps, "p", F("init_b"), NB_F64);
    nb_optim *o = nb_sgd(ps, 0.5, 0.0, 0.1);
    CHECK_NOT_NULL(o);
    nb_optim_zero_grad(o); /* no gradient yet: nothing to do */
    ck_assert_ptr_null(nb_grad(p));
    nb_optim_step(o);
    expect_close(p, F("init_b"), 0, 0);
    nb_scope_begin();
    add_grad(p, nb_select(F("grads_b"), 0, 0));
    nb_scope_end();
    ck_assert_ptr_nonnull(nb_grad(p));
    nb_optim_zero_grad(o);
    nb_tensor *g = nb_grad(p);
    CHECK_NOT_NULL(g);
    double zeros[4] = {0, 0, 0, 0}, want[4], init[4];
    expect_values(g, zeros, 4, 0);
    nb_optim_step(o); /* p -= 0.5 * (0 + 0.1 p) */
    nb_copy_to_f64(F("init_b"), init);
    for (int i = 0; i < 4; i++) want[i] = init[i] + -0.5 * (0.1 * init[i]);
    expect_values(p, want, 4, 0);
    nb_optim_free(o);
    nb_params_free(ps);
}
END_TEST

START_TEST(test_set_lr) {
    nb_tensor *ib = F("init_b"), *gb = F("grads_b");
    nb_params *ps = nb_params_new();
    nb_tensor *p = add_param(ps, "p", ib, NB_F64);
    nb_optim *o = nb_sgd(ps, 0.1, 0.0, 0.0);
    CHECK_NOT_NULL(o);
    ck_assert_double_eq(nb_optim_lr(o), 0.1);
    nb_optim_set_lr(o, 0.5);
    ck_assert_double_eq(nb_optim_lr(o), 0.5);
    double init[4], g[20], want[4];
    nb_copy_to_f64(ib, init);
    nb_copy_to_f64(gb, g);
    nb_scope_begin();
    add_grad(p, nb_select(gb, 0, 0));
    nb_scope_end();
    nb_optim_step(o);
    for (int i = 0; i < 4; i++) want[i] = init[i] + -0.5 * g[i];
    expect_values(p, want, 4, 0);
    /* lr 0: no change */
    nb_optim_set_lr(o, 0.0);
    ck_assert_double_eq(nb_optim_lr(o), 0.0);
    nb_optim_step(o);
    expect_values(p, want, 4, 0);
    /* bad values are refused and the rate is kept */
    nb_clear_error();
    nb_optim_set_lr(o, -1.0);
    expect_msg("nb_optim_set_lr", "-1");
    nb_optim_set_lr(o, NAN);
    expect_msg("nb_optim_set_lr", "nan");
    ck_assert_double_eq(nb_optim_lr(o), 0.0);
    nb_optim_free(o);

    /* Adam: a rate set after creation acts like the same rate given at creation */
    nb_params *pa = nb_params_new(), *pb = nb_params_new();
    nb_tensor *q = add_param(pa, "q", ib, NB_F64), *r = add_param(pb, "r", ib, NB_F64);
    nb_optim *a = nb_adam(pa, 1e-2, 0.9, 0.98, 1e-9, 0.0);
    nb_optim *b = nb_adam(pb, 3e-2, 0.9, 0.98, 1e-9, 0.0);
    CHECK_NOT_NULL(a);
    CHECK_NOT_NULL(b);
    nb_optim_set_lr(a, 3e-2);
    for (int k = 0; k < 3; k++) {
        nb_scope_begin();
        add_grad(q, nb_select(gb, 0, k));
        add_grad(r, nb_select(gb, 0, k));
        nb_optim_step(a);
        nb_optim_step(b);
        expect_close(q, r, 0, 0);
        nb_optim_zero_grad(a);
        nb_optim_zero_grad(b);
        nb_scope_end();
    }
    nb_optim_free(a);
    nb_optim_free(b);
    nb_params_free(pa);
    nb_params_free(pb);
    nb_params_free(ps);
}
END_TEST

/* ------------------------------------------------------------ clipping */
static void clip_case(const char *prefix, double max_norm, bool with_b, nb_dtype dtype) {
    const char *sfx = dtype == NB_F32 ? "_f32" : "";
    double tol = dtype == NB_F64 ? 1e-12 : 1e-6;
    char name[64];
    nb_params *ps = nb_params_new();
    nb_tensor *w = add_param(ps, "w", F("init_w"), dtype);
    nb_tensor *b = add_param(ps, "b", F("init_b"), dtype);
    nb_scope_begin();
    add_grad(w, nb_select(F("grads_w"), 0, 0));
    if (with_b) add_grad(b, nb_select(F("grads_b"), 0, 0));
    nb_scope_end();
    double norm = nb_clip_grad_norm(ps, max_norm);
    snprintf(name, sizeof name, "%s_norm%s", prefix, sfx);
    double want = nb_item(F(name));
    ck_assert_msg(fabs(norm - want) <= tol * want, "%s: norm %.17g, expected %.17g", prefix, norm,
                  want);
    snprintf(name, sizeof name, "%s_w%s", prefix, sfx);
    expect_close(nb_grad(w), F(name), tol, tol);
    if (with_b) {
        snprintf(name, sizeof name, "%s_b%s", prefix, sfx);
        expect_close(nb_grad(b), F(name), tol, tol);
    } else {
        ck_assert_ptr_null(nb_grad(b));
    }
    /* after clipping, the norm is norm * coef, coef = max_norm / (norm + 1e-6) when < 1 */
    double again = nb_clip_grad_norm(ps, 1e30);
    double coef = max_norm / (norm + 1e-6), expect = coef < 1 ? norm * coef : norm;
    ck_assert_msg(fabs(again - expect) <= tol * expect, "%s: norm after clipping %.17g, "
                  "expected %.17g", prefix, again, expect);
    nb_params_free(ps);
}

START_TEST(test_clip_grad_norm) {
    clip_case("clip_big", 100.0, true, NB_F64);
    clip_case("clip_small", 0.5, true, NB_F64);
    clip_case("clip_one", 0.5, false, NB_F64);
    clip_case("clip_near", 3.0, true, NB_F64);
    clip_case("clip_edge", nb_item(F("clip_edge_norm")), true, NB_F64);
    clip_case("clip_small", 0.5, true, NB_F32);
    /* the unclipped gradients are bit-identical */
    nb_params *ps = nb_params_new();
    nb_tensor *w = add_param(ps, "w", F("init_w"), NB_F64);
    ck_assert_double_eq(nb_clip_grad_norm(ps, 1.0), 0.0); /* no gradients: 0, as torch */
    nb_scope_begin();
    add_grad(w, nb_select(F("grads_w"), 0, 0));
    nb_scope_end();
    ck_assert_double_gt(nb_clip_grad_norm(ps, 100.0), 0.0);
    expect_close(nb_grad(w), F("clip_big_w"), 0, 0);
    /* max_norm 0 zeroes them */
    ck_assert_double_eq_tol(nb_clip_grad_norm(ps, 0.0), nb_item(F("clip_one_norm")), 1e-12);
    double zeros[12] = {0};
    expect_values(nb_grad(w), zeros, 12, 0);
    ck_assert_double_eq(nb_clip_grad_norm(ps, 1.0), 0.0);
    nb_params_free(ps);
}
END_TEST

/* The norm is summed on the thread pool over a fixed partition (chunks of
 * 16,384 elements, see nn/train/optim.c): the norm and the scaled gradients have
 * the same bits on 1, 2 and 3 threads, and the norm is the exact one to
 * double rounding. Sizes around the chunk's, f32 and f64 mixed. */
static nb_params *clip_params(void) {
    static const int64_t sizes[] = {16385, 3, 100003, 16384, 40000, 7};
    nb_params *ps = nb_params_new();
    nb_rng r = {17, 0};
    for (int i = 0; i < 6; i++) {
        char name[16];
        snprintf(name, sizeof name, "p%d", i);
        nb_dtype dt = i == 4 ? NB_F64 : NB_F32;
        nb_scope_begin();
        nb_tensor *p = nb_params_add(ps, name, nb_zeros(dt, NB_SHAPE(sizes[i])));
        CHECK_NOT_NULL(p);
        nb_set_requires_grad(p, true);
        add_grad(p, nb_randn(dt, NB_SHAPE(sizes[i]), &r));
        nb_scope_end();
    }
    return ps;
}

START_TEST(test_clip_same_bits_any_threads) {
    int saved = nb_num_threads();
    double norms[3];
    double *grads[3];
    int64_t total = 0;
    long double exact = 0;
    for (int t = 0; t < 3; t++) {
        nb_set_num_threads(t + 1);
        nb_params *ps = clip_params();
        int n = nb_params_count(ps);
        if (t == 0)
            for (int i = 0; i < n; i++) {
                nb_tensor *g = nb_grad(nb_params_at(ps, i, NULL));
                int64_t k = nb_numel(g);
                double *v = malloc((size_t)k * sizeof *v);
                nb_copy_to_f64(g, v);
                for (int64_t j = 0; j < k; j++) exact += (long double)v[j] * v[j];
                free(v);
                total += k;
            }
        norms[t] = nb_clip_grad_norm(ps, 1.0); /* far below the norm: scaled */
        grads[t] = malloc((size_t)total * sizeof(double));
        int64_t at = 0;
        for (int i = 0; i < n; i++) {
            nb_tensor *g = nb_grad(nb_params_at(ps, i, NULL));
            nb_copy_to_f64(g, grads[t] + at);
            at += nb_numel(g);
        }
        nb_params_free(ps);
    }
    nb_set_num_threads(saved);
    double want = sqrtl(exact);
    ck_assert_msg(fabs(norms[0] - want) <= 1e-13 * want, "norm %.17g, exact %.17g", norms[0], want);
    for (int t = 1; t < 3; t++) {
        ck_assert_msg(!memcmp(&norms[0], &norms[t], sizeof(double)),
                      "norm on %d threads %.17g, on 1 %.17g", t + 1, norms[t], norms[0]);
        ck_assert(!memcmp(grads[0], grads[t], (size_t)total * sizeof(double)));
    }
    for (int t = 0; t < 3; t++) free(grads[t]);
}
END_TEST

/* ------------------------------------------------------------ noam */
START_TEST(test_noam_rate) {
    nb_tensor *steps = F("noam_steps");
    int64_t n = nb_numel(steps);
    double s[32];
    ck_assert(n <= 32);
    nb_copy_to_f64(steps, s);
    static const struct { const char *name; int64_t d_model; double factor; int64_t warmup; }
    cfg[] = {{"noam_512", 512, 1.0, 4000}, {"noam_64", 64, 1.0, 400}, {"noam_64_f2", 64, 2.0, 400}};
    double dev = 0;
    for (int c = 0; c < 3; c++) {
        double want[32];
        nb_copy_to_f64(F(cfg[c].name), want);
        for (int64_t i = 0; i < n; i++) {
            double got = nb_noam_rate((int64_t)s[i], cfg[c].d_model, cfg[c].factor, cfg[c].warmup);
            ck_assert_msg(fabs(got - want[i]) <= 1e-15 * want[i], "%s step %g: %.17g, expected "
                          "%.17g", cfg[c].name, s[i], got, want[i]);
            dev = fmax(dev, fabs(got - want[i]) / want[i]);
        }
    }
    /* the peak is at step == warmup: lr = d^-0.5 warmup^-0.5 */
    ck_assert_double_eq_tol(nb_noam_rate(4000, 512, 1.0, 4000), 1 / sqrt(512.0 * 4000), 1e-18);
    ck_assert(nb_noam_rate(3999, 512, 1, 4000) < nb_noam_rate(4000, 512, 1, 4000));
    ck_assert(nb_noam_rate(4001, 512, 1, 4000) < nb_noam_rate(4000, 512, 1, 4000));
    /* step 0 counts as step 1 */
    ck_assert_double_eq(nb_noam_rate(0, 512, 1, 4000), nb_noam_rate(1, 512, 1, 4000));
    /* warmup 0: no warmup, d^-0.5 step^-0.5 from the start */
    ck_assert_double_eq_tol(nb_noam_rate(1, 64, 1, 0), 0.125, 1e-17);
    ck_assert_double_eq_tol(nb_noam_rate(16, 64, 1, 0), 0.125 / 4, 1e-17);
    printf("optim ok  %-12s %lld steps x 3 schedules, max relative deviation %.1e\n", "noam",
           (long long)n, dev);
    fflush(stdout);
}
END_TEST

/* ------------------------------------------------------------ training */
/* y = x w* + b* for 64 random x in R^3: SGD and Adam drive the mean squared
 * error down by orders of magnitude. */
static double train(int which, int steps) {
    nb_rng rng;
    nb_rng_seed(&rng, 1234);
    nb_params *ps = nb_params_new();
    nb_dtype saved = nb_default_dtype();
    nb_set_default_dtype(NB_F64);
    nb_Linear lin;
    ck_assert_int_eq(nb_linear_init(&lin, ps, "lin", 3, 1, true, &rng), 0);
    nb_set_default_dtype(saved);
    nb_tensor *x = nb_randn(NB_F64, NB_SHAPE(64, 3), &rng);
    nb_tensor *wt = nb_from_data(NB_F64, NB_SHAPE(3, 1), (double[]){1.5, -2.0, 0.7});
    nb_scope_begin();
    nb_tensor *y = nb_persistent(nb_add_scalar(nb_matmul(x, wt), 0.3));
    nb_scope_end();
    nb_optim *o = which == 0 ? nb_sgd(ps, 0.1, 0.9, 0.0) : nb_adam(ps, 0.05, 0.9, 0.999, 1e-8, 0.0);
    CHECK_NOT_NULL(o);
    double first = 0, last = 0;
    for (int s = 0; s < steps; s++) {
        nb_scope_begin();
        nb_tensor *d = nb_sub(nb_linear_forward(&lin, x), y);
        nb_tensor *loss = nb_mean_all(nb_mul(d, d));
        CHECK_NOT_NULL(loss);
        last = nb_item(loss);
        if (s == 0) first = last;
        ck_assert_int_eq(nb_backward(loss), 0);
        nb_optim_step(o);
        nb_optim_zero_grad(o);
        nb_scope_end();
    }
    nb_optim_free(o);
    nb_free(x);
    nb_free(wt);
    nb_free(y);
    nb_params_free(ps);
    ck_assert_msg(first > 0.1, "initial loss %g is suspiciously small", first);
    printf("optim ok  %-12s loss %.3e -> %.3e in %d steps\n", which ? "adam fit" : "sgd fit",
           first, last, steps);
    fflush(stdout);
    return last / first;
}

START_TEST(test_regression) {
    int64_t base = nb_live_tensors();
    double sgd = train(0, 200), adam = train(1, 400);
    ck_assert_msg(sgd < 1e-6, "SGD reduced the loss only by a factor %g", 1 / sgd);
    ck_assert_msg(adam < 1e-4, "Adam reduced the loss only by a factor %g", 1 / adam);
    ck_assert_int_eq(nb_live_tensors(), base);
}
END_TEST

/* ------------------------------------------------------------ errors */
START_TEST(test_errors) {
    nb_clear_error();
    nb_params *ps = nb_params_new();
    add_param(ps, "w", F("init_w"), NB_F64);
    expect_error(nb_sgd(NULL, 0.1, 0, 0), "nb_sgd", "NULL");
    expect_error(nb_adam(NULL, 0.1, 0.9, 0.98, 1e-9, 0), "nb_adam", "NULL");
    expect_error(nb_adamw(NULL, 0.1, 0.9, 0.98, 1e-9, 0), "nb_adamw", "NULL");
    expect_error(nb_sgd(ps, -0.1, 0, 0), "nb_sgd", "learning rate", "-0.1");
    expect_error(nb_sgd(ps, NAN, 0, 0), "nb_sgd", "learning rate", "nan");
    expect_error(nb_sgd(ps, 0.1, -0.5, 0), "nb_sgd", "momentum", "-0.5");
    expect_error(nb_sgd(ps, 0.1, 0.9, -0.01), "nb_sgd", "weight_decay", "-0.01");
    expect_error(nb_adam(ps, -1, 0.9, 0.98, 1e-9, 0), "nb_adam", "learning rate", "-1");
    expect_error(nb_adam(ps, 0.1, 1.0, 0.98, 1e-9, 0), "nb_adam", "beta1", "1", "[0, 1)");
    expect_error(nb_adam(ps, 0.1, -0.1, 0.98, 1e-9, 0), "nb_adam", "beta1", "-0.1");
    expect_error(nb_adam(ps, 0.1, 0.9, 1.5, 1e-9, 0), "nb_adam", "beta2", "1.5");
    expect_error(nb_adam(ps, 0.1, 0.9, 0.98, -1e-9, 0), "nb_adam", "eps", "-1e-09");
    expect_error(nb_adam(ps, 0.1, 0.9, 0.98, 1e-9, -0.1), "nb_adam", "weight_decay", "-0.1");
    expect_error(nb_adamw(ps, 0.1, 0.9, 1.0, 1e-9, 0), "nb_adamw", "beta2", "1");
    expect_error(nb_adamw(ps, 0.1, 0.9, 0.98, 1e-9, -2), "nb_adamw", "weight_decay", "-2");
    expect_error(nb_adamw(ps, 0.1, NAN, 0.98, 1e-9, 0), "nb_adamw", "beta1", "nan");
    /* empty registry, non-contiguous parameter */
    nb_params *empty = nb_params_new();
    expect_error(nb_adam(empty, 0.1, 0.9, 0.98, 1e-9, 0), "nb_adam", "no parameters");
    nb_params *tr = nb_params_new();
    nb_scope_begin();
    nb_tensor *t = nb_transpose(nb_zeros(NB_F64, NB_SHAPE(2, 3)), 0, 1);
    CHECK_NOT_NULL(nb_params_add(tr, "tw", t));
    nb_scope_end();
    expect_error(nb_sgd(tr, 0.1, 0, 0), "nb_sgd", "\"tw\"", "not contiguous");
    nb_params_free(tr);
    /* parameters sharing memory would be updated twice a step: one tensor
     * under two names, or overlapping rows of one buffer; disjoint rows of
     * one buffer are fine */
    nb_params *twice = nb_params_new(), *rows = nb_params_new(), *apart = nb_params_new();
    nb_tensor *buf = nb_zeros(NB_F64, NB_SHAPE(4, 3));
    nb_scope_begin();
    CHECK_NOT_NULL(nb_params_add(twice, "a", buf));
    CHECK_NOT_NULL(nb_params_add(twice, "z", nb_zeros(NB_F64, NB_SHAPE(2))));
    CHECK_NOT_NULL(nb_params_add(twice, "b", buf));
    nb_scope_end();
    expect_error(nb_adam(twice, 0.1, 0.9, 0.98, 1e-9, 0),
                 "nb_adam: parameters \"a\" and \"b\" share memory; a step would update it twice");
    nb_scope_begin();
    CHECK_NOT_NULL(nb_params_add(rows, "top", nb_narrow(buf, 0, 0, 3)));
    CHECK_NOT_NULL(nb_params_add(rows, "bottom", nb_narrow(buf, 0, 2, 2)));
    CHECK_NOT_NULL(nb_params_add(apart, "top", nb_narrow(buf, 0, 0, 2)));
    CHECK_NOT_NULL(nb_params_add(apart, "bottom", nb_narrow(buf, 0, 2, 2)));
    nb_scope_end();
    expect_error(nb_sgd(rows, 0.1, 0, 0), "nb_sgd: parameters \"top\" and \"bottom\" share memory");
    nb_optim *ok = nb_sgd(apart, 0.1, 0, 0);
    CHECK_NOT_NULL(ok);
    nb_optim_free(ok);
    nb_free(buf);
    nb_params_free(twice);
    nb_params_free(rows);
    nb_params_free(apart);
    /* NULL optimizer */
    nb_optim_step(NULL);
    expect_msg("nb_optim_step", "NULL");
    nb_optim_zero_grad(NULL);
    expect_msg("nb_optim_zero_grad", "NULL");
    nb_optim_set_lr(NULL, 0.1);
    expect_msg("nb_optim_set_lr", "NULL");
    ck_assert(isnan(nb_optim_lr(NULL)));
    expect_msg("nb_optim_lr", "NULL");
    nb_optim_free(NULL);
    /* clipping */
    expect_error_rc(nb_clip_grad_norm(NULL, 1.0), "nb_clip_grad_norm", "NULL");
    expect_error_rc(nb_clip_grad_norm(ps, -1.0), "nb_clip_grad_norm", "max_norm", "-1");
    expect_error_rc(nb_clip_grad_norm(ps, NAN), "nb_clip_grad_norm", "max_norm", "nan");
    /* schedule */
    expect_error_rc(nb_noam_rate(-1, 512, 1, 4000), "nb_noam_rate", "step", "-1");
    expect_error_rc(nb_noam_rate(1, 0, 1, 4000), "nb_noam_rate", "d_model", "0");
    expect_error_rc(nb_noam_rate(1, 512, 1, -5), "nb_noam_rate", "warmup", "-5");
    expect_error_rc(nb_noam_rate(1, 512, -1, 4000), "nb_noam_rate", "factor", "-1");
    ck_assert_ptr_null(nb_last_error());
    nb_params_free(empty);
    nb_params_free(ps);
}
END_TEST

/* ------------------------------------------------------------ memory */
START_TEST(test_state_and_leaks) {
    nb_tensor *iw = F("init_w"), *ib = F("init_b"); /* fixtures: cached, load first */
    int64_t base = nb_live_tensors();
    nb_params *ps = nb_params_new();
    nb_tensor *w = add_param(ps, "w", iw, NB_F32), *b = add_param(ps, "b", ib, NB_F32);
    ck_assert_int_eq(nb_live_tensors(), base + 2);
    /* state is allocated at creation: a 0-d step per parameter, plus none for
     * plain SGD, one buffer per parameter with momentum, two for Adam and AdamW */
    nb_optim *o[4];
    o[0] = nb_sgd(ps, 0.1, 0.0, 0.0);
    ck_assert_int_eq(nb_live_tensors(), base + 2 + 2);
    o[1] = nb_sgd(ps, 0.1, 0.9, 0.0);
    ck_assert_int_eq(nb_live_tensors(), base + 4 + 2 + 2);
    o[2] = nb_adam(ps, 0.1, 0.9, 0.98, 1e-9, 0.0);
    ck_assert_int_eq(nb_live_tensors(), base + 8 + 2 + 4);
    o[3] = nb_adamw(ps, 0.1, 0.9, 0.98, 1e-9, 0.1);
    ck_assert_int_eq(nb_live_tensors(), base + 14 + 2 + 4);
    for (int s = 0; s < 10; s++) {
        nb_scope_begin();
        add_grad(w, nb_select(F("grads_w"), 0, s % STEPS));
        add_grad(b, nb_select(F("grads_b"), 0, s % STEPS));
        nb_scope_end();
        int64_t live = nb_live_tensors();
        for (int k = 0; k < 4; k++) nb_optim_step(o[k]); /* no allocation in a step */
        ck_assert_int_eq(nb_live_tensors(), live);
        nb_clip_grad_norm(ps, 0.1);
        ck_assert_int_eq(nb_live_tensors(), live);
        nb_optim_zero_grad(o[s % 4]);
    }
    ck_assert(nb_last_error() == NULL);
    for (int k = 0; k < 4; k++) nb_optim_free(o[k]);
    ck_assert_int_eq(nb_live_tensors(), base + 4); /* w, b and their grads */
    nb_params_free(ps);
    ck_assert_int_eq(nb_live_tensors(), base);
    /* failed constructions leak nothing either */
    nb_params *p2 = nb_params_new();
    add_param(p2, "w", iw, NB_F64);
    int64_t live = nb_live_tensors();
    ck_assert_ptr_null(nb_adam(p2, 0.1, 2.0, 0.98, 1e-9, 0));
    nb_clear_error();
    ck_assert_int_eq(nb_live_tensors(), live);
    nb_params_free(p2);
    ck_assert_int_eq(nb_live_tensors(), base);
}
END_TEST

/* An optimizer leaves one buffer per parameter size in the allocator's
 * cache, and the first backward's gradients take them: the cache grows by
 * the parameters' bytes at creation and shrinks by as much at backward,
 * with nb_memory_allocated back where it was after nb_optim_clear_grad.
 * (Not under ASan, where nothing is cached.) */
START_TEST(test_gradient_buffers_reserved) {
    if (UNDER_ASAN) return;
    nb_params *ps = nb_params_new();
    nb_rng r = {5, 0};
    nb_scope_begin();
    const int64_t rows[3] = {256, 512, 1024}; /* 0.25, 0.5, 1 MiB: distinct size classes */
    int64_t bytes = 0;
    for (int i = 0; i < 3; i++) {
        char name[16];
        snprintf(name, sizeof name, "w%d", i);
        ck_assert_ptr_nonnull(nb_params_add(ps, name, nb_randn(NB_F32, NB_SHAPE(rows[i], 256), &r)));
        bytes += rows[i] * 256 * 4;
    }
    nb_scope_end();
    nb_empty_cache();
    nb_optim *o = nb_adamw(ps, 1e-3, 0.9, 0.999, 1e-8, 0.0);
    ck_assert_ptr_nonnull(o);
    ck_assert_int_eq(nb_memory_cached(), bytes);
    int64_t in_use = nb_memory_allocated();
    nb_scope_begin();
    nb_tensor *loss = NULL;
    for (int i = 0; i < 3; i++) { /* no forward buffer of a parameter's size */
        nb_tensor *l = nb_sum_all(nb_params_at(ps, i, NULL));
        loss = loss ? nb_add(loss, l) : l;
    }
    ck_assert_int_eq(nb_backward(loss), 0);
    ck_assert_int_eq(nb_memory_cached(), 0); /* every gradient found its buffer */
    nb_scope_end();
    ck_assert_int_eq(nb_memory_allocated(), in_use + bytes);
    nb_optim_step(o);
    nb_optim_clear_grad(o);
    ck_assert_int_eq(nb_memory_allocated(), in_use);
    nb_optim_free(o);
    nb_params_free(ps);
}
END_TEST

Suite *suite_optim(void) {
    Suite *s = suite_create("optim");
    TCase *tc = tcase_create("vs_torch");
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, test_trajectory, 0, NTRAJ);
    tcase_add_test(tc, test_state_outlives_scope);
    tcase_add_test(tc, test_param_without_grad_untouched);
    tcase_add_test(tc, test_clip_grad_norm);
    tcase_add_test(tc, test_clip_same_bits_any_threads);
    tcase_add_test(tc, test_noam_rate);
    suite_add_tcase(s, tc);
    tc = tcase_create("behaviour");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_zero_grad);
    tcase_add_test(tc, test_gradient_buffers_reserved);
    tcase_add_test(tc, test_set_lr);
    tcase_add_test(tc, test_regression);
    tcase_add_test(tc, test_errors);
    tcase_add_test(tc, test_state_and_leaks);
    suite_add_tcase(s, tc);
    return s;
}
