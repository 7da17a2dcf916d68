/* test_function.c: custom functions (nb_function, nb_function_apply and
 * nb_function_apply_multi) and nb_gradcheck itself.
 *
 * The ops are written as users write kernels: plain C loops over nb_data of
 * nb_contiguous inputs. SiLU (y = x sigmoid(x)) is the correct one; variants
 * of it drop a term, scale the gradient or jitter it; a two-input product
 * op has switches that make its forward or backward misbehave in each way
 * nabla must report; a two-output op returns (a*b, a+b) and optionally an
 * integer tensor. Expected values are computed here with other formulas.
 *
 * Covered: forward/backward values (f64, f32), gradcheck on contiguous,
 * transposed and broadcast inputs, saved tensors (version checks, range,
 * saving outside forward), errors of forward and backward (exact messages,
 * no leaks), anomaly mode, the destroy callback (once per apply, at the
 * right moment), needs_input_grad, non-differentiable outputs, backward
 * twice (retain_graph), saved tensors released after backward, threads,
 * several outputs, and nb_gradcheck's messages, tolerances, determinism
 * check, no-grad inputs, fast mode and restoring of its inputs.
 *
 * Some tests clean up before asserting, so that a failure leaves nothing
 * behind under CK_FORK=no and valgrind. */
#include "test_util.h"

#include <pthread.h>
#include <stdlib.h>

/* ------------------------------------------------------------ helpers */
/* Asserts a call made a tensor; the failure names the expression and error. */
#define OK(t) ok_at(__LINE__, #t, (t))
static nb_tensor *ok_at(int line, const char *what, nb_tensor *t) {
    ck_assert_msg(t != NULL, "test_function.c:%d: %s failed: %s", line, what,
                  nb_last_error() ? nb_last_error() : "(no error set)");
    return t;
}
#define OK_RC(rc)                                                                        \
    ck_assert_msg((rc) == 0, "test_function.c:%d: %s failed: %s", __LINE__, #rc,        \
                  nb_last_error() ? nb_last_error() : "(no error set)")

/* nb_last_error() is exactly want (then cleared). */
#define expect_message(want) expect_message_at(__LINE__, (want))
static void expect_message_at(int line, const char *want) {
    const char *got = nb_last_error();
    ck_assert_msg(got != NULL, "test_function.c:%d: no error set, expected \"%s\"", line, want);
    ck_assert_msg(strcmp(got, want) == 0,
                  "test_function.c:%d: error\n  \"%s\"\nexpected\n  \"%s\"", line, got, want);
    nb_clear_error();
}

/* s contains part. */
#define expect_has(s, part) expect_has_at(__LINE__, (s), (part))
static void expect_has_at(int line, const char *s, const char *part) {
    ck_assert_msg(s != NULL, "test_function.c:%d: message is NULL, expected \"%s\"", line, part);
    ck_assert_msg(strstr(s, part) != NULL, "test_function.c:%d: \"%s\" does not contain \"%s\"",
                  line, s, part);
}

static nb_tensor *f64_of(int ndim, const int64_t *shape, const double *v) {
    return OK(nb_from_data(NB_F64, ndim, shape, v));
}
static nb_tensor *leaf_of(int ndim, const int64_t *shape, const double *v) {
    return nb_set_requires_grad(f64_of(ndim, shape, v), true);
}

/* t's values against want (n of them): |got - want| <= tol * max(1, |want|). */
#define expect_vals(t, n, want, tol) expect_vals_at(__LINE__, (t), (n), (want), (tol))
static void expect_vals_at(int line, const nb_tensor *t, int64_t n, const double *want,
                           double tol) {
    ck_assert_msg(t != NULL, "test_function.c:%d: tensor is NULL: %s", line,
                  nb_last_error() ? nb_last_error() : "(no error set)");
    ck_assert_msg(nb_numel(t) == n, "test_function.c:%d: %lld elements, expected %lld", line,
                  (long long)nb_numel(t), (long long)n);
    double *got = values(t);
    for (int64_t i = 0; i < n; i++) {
        double g = got[i], w = want[i];
        bool ok = fabs(g - w) <= tol * fmax(1.0, fabs(w));
        if (!ok) free(got);
        ck_assert_msg(ok, "test_function.c:%d: element %lld is %.17g, expected %.17g", line,
                      (long long)i, g, w);
    }
    free(got);
}

/* Bitwise equality of two double arrays. */
static bool same_bits(const double *a, const double *b, int64_t n) {
    return memcmp(a, b, (size_t)n * sizeof *a) == 0;
}

/* Independent references: silu(x) = x / (1 + e^-x), and its derivative
 * (1 + e^-x + x e^-x) / (1 + e^-x)^2 (the ops use s (1 + x (1 - s))). */
static double silu_ref(double x) { return x / (1.0 + exp(-x)); }
static double dsilu_ref(double x) {
    double e = exp(-x);
    return (1.0 + e + x * e) / ((1.0 + e) * (1.0 + e));
}

/* The function nb_gradcheck differentiates: f applied to its inputs. */
typedef struct {
    const nb_function *f;
    void *user;
} applier;
static nb_tensor *apply_fn(nb_tensor **in, int n, void *ctx) {
    const applier *a = ctx;
    return nb_function_apply(a->f, in, n, a->user);
}

/* Tensor objects and storage bytes at one moment. */
typedef struct {
    int64_t live, bytes;
} usage;
static usage usage_now(void) { return (usage){nb_live_tensors(), nb_memory_allocated()}; }
#define expect_usage(u) expect_usage_at(__LINE__, (u))
static void expect_usage_at(int line, usage u) {
    ck_assert_msg(nb_live_tensors() == u.live, "test_function.c:%d: %lld tensors live, expected "
                  "%lld", line, (long long)nb_live_tensors(), (long long)u.live);
    ck_assert_msg(nb_memory_allocated() == u.bytes, "test_function.c:%d: %lld bytes allocated, "
                  "expected %lld", line, (long long)nb_memory_allocated(), (long long)u.bytes);
}

/* -------------------------------------------------- the SiLU custom function */
typedef struct {
    int destroyed, forwards, backwards;
    double scale;        /* multiplies the gradient (0 means 1): a wrong scale */
    bool drop_term;      /* the backward forgets the x s (1 - s) term */
    double jitter;       /* adds jitter x (backward calls so far): not deterministic */
    double bias;         /* adds bias to every element of the gradient */
    int64_t extra_numel; /* forward also saves a tensor of this size that it made */
} silu_user;

static void silu_destroy(void *user) {
    if (user) ((silu_user *)user)->destroyed++;
}

static nb_tensor *silu_forward(nb_function_ctx *ctx, nb_tensor **in, int n, void *user) {
    silu_user *u = user;
    if (u) u->forwards++;
    if (n != 1) {
        nb_report_error("silu: takes one input, got %d", n);
        return NULL;
    }
    nb_tensor *x = nb_contiguous(in[0]);
    if (!x) return NULL;
    nb_dtype dt = nb_dtype_of(x);
    if (dt != NB_F64 && dt != NB_F32) {
        nb_report_error("silu: x must be floating, got %s", nb_dtype_name(dt));
        return NULL;
    }
    nb_tensor *y = nb_empty(dt, nb_ndim(x), nb_shape(x));
    if (!y) return NULL;
    int64_t N = nb_numel(x);
    if (dt == NB_F64) {
        const double *px = nb_data(x);
        double *py = nb_data(y);
        for (int64_t i = 0; i < N; i++) py[i] = px[i] * (1.0 / (1.0 + exp(-px[i])));
    } else {
        const float *px = nb_data(x);
        float *py = nb_data(y);
        for (int64_t i = 0; i < N; i++) py[i] = px[i] * (1.0f / (1.0f + expf(-px[i])));
    }
    if (nb_function_save(ctx, x) != 0) return NULL;
    if (u && u->extra_numel > 0) {
        nb_tensor *big = nb_full(NB_F64, 1, &u->extra_numel, 1.0);
        if (!big || nb_function_save(ctx, big) != 0) return NULL;
        nb_free(big); /* from now on only the ctx holds its storage */
    }
    return y;
}

static int silu_backward(nb_function_ctx *ctx, nb_tensor *gy, nb_tensor **gin, void *user) {
    silu_user *u = user;
    double scale = u && u->scale != 0 ? u->scale : 1.0;
    double jitter = u ? u->jitter * (double)(++u->backwards) + u->bias : 0.0;
    bool drop = u && u->drop_term;
    nb_tensor *x = nb_function_saved(ctx, 0), *g = nb_contiguous(gy);
    if (!x || !g) return -1;
    if (u && u->extra_numel > 0) {
        nb_tensor *big = nb_function_saved(ctx, 1);
        if (!big) return -1;
        if (nb_numel(big) != u->extra_numel) {
            nb_report_error("silu: the extra saved tensor has the wrong size");
            return -1;
        }
    }
    nb_dtype dt = nb_dtype_of(x);
    nb_tensor *gx = nb_empty(dt, nb_ndim(x), nb_shape(x));
    if (!gx) return -1;
    int64_t N = nb_numel(x);
    if (dt == NB_F64) {
        const double *px = nb_data(x), *pg = nb_data(g);
        double *pgx = nb_data(gx);
        for (int64_t i = 0; i < N; i++) {
            double s = 1.0 / (1.0 + exp(-px[i]));
            double d = drop ? s : s * (1.0 + px[i] * (1.0 - s));
            pgx[i] = pg[i] * d * scale + jitter;
        }
    } else {
        const float *px = nb_data(x), *pg = nb_data(g);
        float *pgx = nb_data(gx);
        for (int64_t i = 0; i < N; i++) {
            float s = 1.0f / (1.0f + expf(-px[i]));
            float d = drop ? s : s * (1.0f + px[i] * (1.0f - s));
            pgx[i] = pg[i] * d * (float)scale + (float)jitter;
        }
    }
    gin[0] = gx;
    return 0;
}

static const nb_function SILU = {.name = "silu", .forward = silu_forward,
                                 .backward = silu_backward, .destroy = silu_destroy};

/* y = silu(x) * w: x (..., D), w (D) broadcast over the rows in the op's own loop. */
static nb_tensor *silu_w_forward(nb_function_ctx *ctx, nb_tensor **in, int n, void *user) {
    silu_user *u = user;
    if (u) u->forwards++;
    nb_tensor *x = n == 2 ? nb_contiguous(in[0]) : NULL, *w = x ? nb_contiguous(in[1]) : NULL;
    if (!x || !w) return NULL;
    int64_t D = nb_ndim(x) ? nb_shape(x)[nb_ndim(x) - 1] : 0;
    if (nb_dtype_of(x) != NB_F64 || nb_dtype_of(w) != NB_F64 || nb_ndim(w) != 1 ||
        nb_shape(w)[0] != D || D == 0) {
        nb_report_error("silu_w: expects f64 x (..., D) and w (D)");
        return NULL;
    }
    nb_tensor *y = nb_empty(NB_F64, nb_ndim(x), nb_shape(x));
    if (!y) return NULL;
    const double *px = nb_data(x), *pw = nb_data(w);
    double *py = nb_data(y);
    for (int64_t i = 0; i < nb_numel(x); i++)
        py[i] = px[i] * (1.0 / (1.0 + exp(-px[i]))) * pw[i % D];
    if (nb_function_save(ctx, x) != 0 || nb_function_save(ctx, w) != 0) return NULL;
    return y;
}

static int silu_w_backward(nb_function_ctx *ctx, nb_tensor *gy, nb_tensor **gin, void *user) {
    silu_user *u = user;
    double scale = u && u->scale != 0 ? u->scale : 1.0;
    if (u) u->backwards++;
    nb_tensor *x = nb_function_saved(ctx, 0), *w = nb_function_saved(ctx, 1);
    nb_tensor *g = nb_contiguous(gy);
    if (!x || !w || !g) return -1;
    int64_t D = nb_shape(w)[0];
    nb_tensor *gx = nb_empty(NB_F64, nb_ndim(x), nb_shape(x));
    nb_tensor *gw = nb_zeros(NB_F64, 1, &D);
    if (!gx || !gw) return -1;
    const double *px = nb_data(x), *pw = nb_data(w), *pg = nb_data(g);
    double *pgx = nb_data(gx), *pgw = nb_data(gw);
    for (int64_t i = 0; i < nb_numel(x); i++) {
        double s = 1.0 / (1.0 + exp(-px[i]));
        pgx[i] = pg[i] * pw[i % D] * s * (1.0 + px[i] * (1.0 - s)) * scale;
        pgw[i % D] += pg[i] * px[i] * s;
    }
    if (nb_function_needs_input_grad(ctx, 0)) gin[0] = gx;
    if (nb_function_needs_input_grad(ctx, 1)) gin[1] = gw;
    return 0;
}

static const nb_function SILU_W = {.name = "silu_w", .forward = silu_w_forward,
                                   .backward = silu_w_backward, .destroy = silu_destroy};

/* ------------------------------------------------ A.1 a correct custom op */
static const double X6[6] = {-3.0, -0.5, 0.0, 0.25, 1.5, 4.0};
static const double C6[6] = {1.0, 2.0, 3.0, -1.0, 0.5, 2.0};

START_TEST(silu_values_and_gradients_f64) {
    nb_tensor *x = leaf_of(NB_SHAPE(2, 3), X6);
    silu_user u = {0};
    nb_scope_begin();
    nb_tensor *y = OK(nb_function_apply(&SILU, &x, 1, &u));
    ck_assert_int_eq(nb_ndim(y), 2);
    ck_assert_int_eq(nb_shape(y)[0], 2);
    ck_assert_int_eq(nb_shape(y)[1], 3);
    ck_assert_int_eq(nb_dtype_of(y), NB_F64);
    ck_assert(nb_requires_grad(y));
    ck_assert(!nb_is_leaf(y));
    double want_y[6], want_g[6];
    for (int i = 0; i < 6; i++) {
        want_y[i] = silu_ref(X6[i]);
        want_g[i] = C6[i] * dsilu_ref(X6[i]);
    }
    expect_vals(y, 6, want_y, 1e-15);
    nb_tensor *c = f64_of(NB_SHAPE(2, 3), C6);
    OK_RC(nb_backward(OK(nb_sum_all(nb_mul(y, c)))));
    ck_assert_int_eq(u.forwards, 1);
    ck_assert_int_eq(u.backwards, 1);
    nb_scope_end();
    ck_assert_int_eq(u.destroyed, 1);
    ck_assert_int_eq(nb_dtype_of(nb_grad(x)), NB_F64);
    expect_vals(nb_grad(x), 6, want_g, 1e-14);
    /* with grad mode off: the same values, no graph, the backward never runs */
    nb_set_grad_enabled(false);
    nb_scope_begin();
    y = OK(nb_function_apply(&SILU, &x, 1, &u));
    ck_assert(!nb_requires_grad(y) && nb_is_leaf(y));
    expect_vals(y, 6, want_y, 1e-15);
    nb_scope_end();
    nb_set_grad_enabled(true);
    ck_assert_int_eq(u.backwards, 1);
    ck_assert_int_eq(u.destroyed, 2);
    nb_free(x);
}
END_TEST

START_TEST(silu_values_and_gradients_f32) {
    float xf[6], cf[6];
    for (int i = 0; i < 6; i++) {
        xf[i] = (float)X6[i];
        cf[i] = (float)C6[i];
    }
    nb_tensor *x = nb_set_requires_grad(OK(nb_from_data(NB_F32, NB_SHAPE(6), xf)), true);
    nb_scope_begin();
    nb_tensor *y = OK(nb_function_apply(&SILU, &x, 1, NULL));
    ck_assert_int_eq(nb_dtype_of(y), NB_F32);
    double want_y[6], want_g[6];
    for (int i = 0; i < 6; i++) {
        want_y[i] = silu_ref(X6[i]);
        want_g[i] = C6[i] * dsilu_ref(X6[i]);
    }
    expect_vals(y, 6, want_y, 1e-6);
    nb_tensor *c = OK(nb_from_data(NB_F32, NB_SHAPE(6), cf));
    OK_RC(nb_backward(OK(nb_sum_all(nb_mul(y, c)))));
    nb_scope_end();
    ck_assert_int_eq(nb_dtype_of(nb_grad(x)), NB_F32);
    expect_vals(nb_grad(x), 6, want_g, 1e-6);
    nb_free(x);
}
END_TEST

START_TEST(silu_passes_gradcheck) {
    applier silu = {&SILU, NULL}, silu_w = {&SILU_W, NULL};
    nb_scope_begin(); /* transposed_leaf's base goes with it */
    nb_tensor *x = rand_leaf(1, NB_SHAPE(3, 4));
    expect_gradcheck("silu (custom), contiguous (3,4)", apply_fn, &silu, 1, &x);
    nb_tensor *xt = transposed_leaf(2, NB_SHAPE(3, 4), 0, 1);
    expect_gradcheck("silu (custom), transposed (3,4)", apply_fn, &silu, 1, &xt);
    nb_tensor *in[2] = {rand_leaf(3, NB_SHAPE(3, 4)), rand_leaf(4, NB_SHAPE(4))};
    expect_gradcheck("silu_w (custom), w (4) broadcast in the op", apply_fn, &silu_w, 2, in);
    nb_tensor *in_t[2] = {xt, in[1]};
    expect_gradcheck("silu_w (custom), transposed x", apply_fn, &silu_w, 2, in_t);
    /* the broadcast gradient of w: gw[d] = sum_r silu(x[r, d]) */
    nb_scope_begin();
    OK_RC(nb_backward(OK(nb_sum_all(OK(nb_function_apply(&SILU_W, in, 2, NULL))))));
    nb_scope_end();
    double *xv = values(in[0]), gw[4] = {0};
    for (int i = 0; i < 12; i++) gw[i % 4] += silu_ref(xv[i]);
    free(xv);
    expect_vals(nb_grad(in[1]), 4, gw, 1e-14);
    nb_scope_end();
}
END_TEST

/* ------------------------------------------- A.2 a wrong backward is rejected */
static const nb_function SILU_BAD = {.name = "silu_bad", .forward = silu_forward,
                                     .backward = silu_backward};

START_TEST(wrong_backward_is_rejected) {
    silu_user bad = {.drop_term = true};
    applier a = {&SILU_BAD, &bad};
    nb_tensor *x = rand_leaf(5, NB_SHAPE(2, 3));
    nb_gradcheck_result r;
    nb_clear_error();
    ck_assert(!nb_gradcheck(apply_fn, &a, 1, &x, NULL, &r));
    ck_assert(!r.ok);
    ck_assert_msg(strncmp(r.message, "nb_gradcheck: first-order: MISMATCH", 35) == 0, "%s", r.message);
    ck_assert_str_eq(nb_last_error(), r.message);
    ck_assert(fabs(r.analytic - r.numeric) == r.max_abs_err); /* exactly */
    ck_assert_int_gt(r.mismatched, 0);
    ck_assert_int_le(r.mismatched, 6);
    ck_assert_int_eq(r.checked, 36);
    ck_assert_int_eq(r.input, 0);
    /* elementwise: the worst entry is on the diagonal, where the term is missing */
    ck_assert_int_eq(r.index, r.output_index);
    ck_assert(r.index >= 0 && r.index < 6);
    /* the worst is the largest |x s (1 - s)|, the missing term */
    double *xv = values(x), xe = xv[r.index];
    int64_t worst = 0;
    double term[6];
    for (int i = 0; i < 6; i++) {
        double s = 1.0 / (1.0 + exp(-xv[i]));
        term[i] = fabs(xv[i] * s * (1.0 - s));
        if (term[i] > term[worst]) worst = i;
    }
    free(xv);
    ck_assert_int_eq(r.index, worst);
    ck_assert_double_eq_tol(r.max_abs_err, term[worst], 1e-7);
    ck_assert_double_eq_tol(r.analytic, 1.0 / (1.0 + exp(-xe)), 1e-14); /* s only */
    ck_assert_double_eq_tol(r.numeric, dsilu_ref(xe), 1e-7);
    ck_assert_double_eq_tol(r.max_abs_err, fabs(r.analytic - dsilu_ref(xe)), 1e-7);
    nb_clear_error();
    nb_free(x);
}
END_TEST

/* --------------------------------------------------- A.3 saved tensors */
typedef struct {
    nb_tensor *tmp;                /* the tensor forward made and saved */
    bool fwd_shares, bw_ran;       /* what the callbacks saw */
    bool y_matches, s_matches, many_share, no_history;
    bool oor_null;
    char oor_msg[256], oor_neg_msg[256];
    int save_rc;
    char save_msg[256];
} saves_user;

static void copy_error(char *dst, size_t cap) {
    snprintf(dst, cap, "%s", nb_last_error() ? nb_last_error() : "(none)");
}

/* silu, saving x (an input), y (the output) and s = sigmoid(x) (made here),
 * then x six times more (nine in all, past the first allocation). */
static nb_tensor *saves_forward(nb_function_ctx *ctx, nb_tensor **in, int n, void *user) {
    saves_user *u = user;
    (void)n;
    nb_tensor *x = nb_contiguous(in[0]);
    if (!x) return NULL;
    nb_tensor *y = nb_empty(NB_F64, nb_ndim(x), nb_shape(x));
    nb_tensor *s = nb_empty(NB_F64, nb_ndim(x), nb_shape(x));
    if (!y || !s) return NULL;
    const double *px = nb_data(x);
    double *py = nb_data(y), *ps = nb_data(s);
    for (int64_t i = 0; i < nb_numel(x); i++) {
        ps[i] = 1.0 / (1.0 + exp(-px[i]));
        py[i] = px[i] * ps[i];
    }
    if (nb_function_save(ctx, x) || nb_function_save(ctx, y) || nb_function_save(ctx, s))
        return NULL;
    for (int k = 0; k < 6; k++)
        if (nb_function_save(ctx, x)) return NULL;
    nb_tensor *s0 = nb_function_saved(ctx, 0), *s1 = nb_function_saved(ctx, 1);
    u->fwd_shares = s0 && s1 && nb_data(s0) == nb_data(in[0]) && nb_data(s1) == nb_data(y);
    u->tmp = nb_keep(s); /* forward's own temporaries go when it returns: kept to write into */
    return y;
}

static int saves_backward(nb_function_ctx *ctx, nb_tensor *gy, nb_tensor **gin, void *user) {
    saves_user *u = user;
    u->bw_ran = true;
    nb_tensor *x = nb_function_saved(ctx, 0), *y = nb_function_saved(ctx, 1);
    nb_tensor *s = nb_function_saved(ctx, 2), *x8 = nb_function_saved(ctx, 8);
    nb_tensor *g = nb_contiguous(gy);
    if (!x || !y || !s || !x8 || !g) return -1;
    u->many_share = nb_data(x8) == nb_data(x);
    u->no_history = nb_is_leaf(x) && nb_is_leaf(y) && nb_is_leaf(s);
    const double *px = nb_data(x), *py = nb_data(y), *ps = nb_data(s), *pg = nb_data(g);
    u->y_matches = u->s_matches = true;
    for (int64_t i = 0; i < nb_numel(x); i++) {
        u->s_matches = u->s_matches && ps[i] == 1.0 / (1.0 + exp(-px[i]));
        u->y_matches = u->y_matches && py[i] == px[i] * ps[i];
    }
    /* out of range, and saving outside forward: errors, not crashes */
    nb_clear_error();
    u->oor_null = nb_function_saved(ctx, 9) == NULL;
    copy_error(u->oor_msg, sizeof u->oor_msg);
    u->oor_null = u->oor_null && nb_function_saved(ctx, -1) == NULL;
    copy_error(u->oor_neg_msg, sizeof u->oor_neg_msg);
    u->save_rc = nb_function_save(ctx, g);
    copy_error(u->save_msg, sizeof u->save_msg);
    nb_clear_error();
    nb_tensor *gx = nb_empty(NB_F64, nb_ndim(x), nb_shape(x));
    if (!gx) return -1;
    double *pgx = nb_data(gx);
    for (int64_t i = 0; i < nb_numel(x); i++)
        pgx[i] = pg[i] * (ps[i] + px[i] * ps[i] * (1.0 - ps[i]));
    gin[0] = gx;
    return 0;
}

static const nb_function SAVES = {.name = "silu_saves", .forward = saves_forward,
                                  .backward = saves_backward};

START_TEST(saved_tensors_reach_backward) {
    nb_tensor *x = leaf_of(NB_SHAPE(6), X6);
    saves_user u = {0};
    usage start = usage_now();
    nb_scope_begin();
    nb_tensor *y = OK(nb_function_apply(&SAVES, &x, 1, &u));
    ck_assert(u.fwd_shares); /* the saved handles share the input's and output's storage */
    OK_RC(nb_backward(OK(nb_sum_all(y))));
    ck_assert(u.bw_ran);
    ck_assert(u.y_matches);
    ck_assert(u.s_matches);
    ck_assert(u.many_share);
    ck_assert(u.no_history);
    ck_assert(u.oor_null);
    expect_has(u.oor_msg, "nb_function_saved");
    expect_has(u.oor_msg, "silu_saves");
    expect_has(u.oor_msg, "index 9 is out of range (9 saved)");
    expect_has(u.oor_neg_msg, "index -1 is out of range");
    ck_assert_int_eq(u.save_rc, -1);
    expect_has(u.save_msg, "nb_function_save");
    expect_has(u.save_msg, "silu_saves");
    expect_has(u.save_msg, "can be saved only in forward");
    nb_scope_end();
    double want[6];
    for (int i = 0; i < 6; i++) want[i] = dsilu_ref(X6[i]);
    expect_vals(nb_grad(x), 6, want, 1e-14);
    /* outside the callbacks: a NULL ctx is an error */
    ck_assert_ptr_null(nb_function_saved(NULL, 0));
    expect_has(nb_last_error(), "ctx is NULL");
    ck_assert_int_eq(nb_function_save(NULL, x), -1);
    ck_assert(!nb_function_needs_input_grad(NULL, 0));
    nb_clear_error();
    ck_assert_int_eq(nb_live_tensors(), start.live + 1); /* x's .grad, nothing else */
    nb_free(x);
}
END_TEST

/* Writing a saved tensor after apply makes backward fail, naming the function. */
START_TEST(saved_tensor_modified_in_place_is_caught) {
    static const char *want[3] = {"tensor 0 saved by silu_saves was modified in place",
                                  "tensor 1 saved by silu_saves was modified in place",
                                  "tensor 2 saved by silu_saves was modified in place"};
    usage start = usage_now();
    for (int which = -1; which < 3; which++) {
        saves_user u = {0};
        nb_scope_begin();
        nb_tensor *x = leaf_of(NB_SHAPE(6), X6);
        nb_tensor *y = OK(nb_function_apply(&SAVES, &x, 1, &u));
        nb_tensor *loss = OK(nb_sum_all(y));
        if (which == 0) { /* the input, with nb_copy_into */
            OK_RC(nb_copy_into(x, OK(nb_scalar(NB_F64, 0.5))));
        } else if (which == 1) { /* the output, through nb_data */
            ((double *)nb_data(y))[0] = 7.0;
            nb_mark_modified(y);
        } else if (which == 2) { /* the tensor made in forward */
            ((double *)nb_data(u.tmp))[3] = 0.0;
            nb_mark_modified(u.tmp);
        }
        if (which < 0) {
            OK_RC(nb_backward(loss)); /* untouched: fine */
            ck_assert(u.bw_ran);
        } else {
            ck_assert_int_eq(nb_backward(loss), -1);
            expect_has(nb_last_error(), "nb_backward: ");
            expect_has(nb_last_error(), want[which]);
            nb_clear_error();
            ck_assert(!u.bw_ran); /* refused before the user's backward ran */
            ck_assert_ptr_null(nb_grad(x));
        }
        nb_scope_end();
        expect_usage(start);
    }
}
END_TEST

/* ------------------------------------------ A.4 errors of forward and backward */
enum {
    MUL_OK,
    BW_WRONG_SHAPE,
    BW_WRONG_DTYPE,
    BW_FAIL_MSG,
    BW_FAIL_SILENT,
    BW_FREED,
    BW_NULL_AFTER_ERROR,
    BW_NAN,
    FW_FAIL_MSG,
    FW_FAIL_SILENT,
    FW_FREED,
    FW_NAN,
    FW_MARK_OUTPUT,
    FW_CLEARED_SILENT, /* an error handled (cleared), then NULL without a message */
    BW_CLEARED_SILENT, /* the same in backward, -1 */
};

typedef struct {
    int mode;
    int destroyed, forwards, backwards;
    bool needs_fwd[2], needs_bw[2];
    bool probe_range; /* forward asks needs_input_grad(n) and (-1) */
    bool oor_value;
    char oor_msg[256];
    int mark_rc_bw; /* nb_function_mark_non_differentiable in backward */
    char mark_msg_bw[256];
} mul_user;

static void mul_destroy(void *user) { ((mul_user *)user)->destroyed++; }

/* y = x * w, both of one shape. */
static nb_tensor *mul_forward(nb_function_ctx *ctx, nb_tensor **in, int n, void *user) {
    mul_user *u = user;
    u->forwards++;
    if (u->mode == FW_FAIL_SILENT) return NULL;
    if (u->mode == FW_CLEARED_SILENT) {
        nb_function_needs_input_grad(ctx, 99); /* an error, handled: */
        nb_clear_error();
        return NULL;
    }
    if (u->mode == FW_FAIL_MSG) {
        nb_report_error("boom");
        return NULL;
    }
    for (int i = 0; i < 2 && i < n; i++) u->needs_fwd[i] = nb_function_needs_input_grad(ctx, i);
    if (u->probe_range) {
        nb_clear_error();
        u->oor_value = nb_function_needs_input_grad(ctx, n) ||
                       nb_function_needs_input_grad(ctx, -1);
        copy_error(u->oor_msg, sizeof u->oor_msg);
        nb_clear_error();
    }
    nb_tensor *x = nb_contiguous(in[0]), *w = nb_contiguous(in[1]);
    if (!x || !w) return NULL;
    nb_tensor *y = nb_empty(NB_F64, nb_ndim(x), nb_shape(x));
    if (!y) return NULL;
    const double *px = nb_data(x), *pw = nb_data(w);
    double *py = nb_data(y);
    for (int64_t i = 0; i < nb_numel(x); i++) py[i] = px[i] * pw[i];
    if (u->mode == FW_NAN) py[2] = NAN;
    if (nb_function_save(ctx, x) || nb_function_save(ctx, w)) return NULL;
    if (u->mode == FW_MARK_OUTPUT && nb_function_mark_non_differentiable(ctx, y)) return NULL;
    if (u->mode == FW_FREED) nb_free(y);
    return y;
}

/* Sets both gradients whatever needs_input_grad says (nabla must drop one
 * that was not asked for). */
static int mul_backward(nb_function_ctx *ctx, nb_tensor *gy, nb_tensor **gin, void *user) {
    mul_user *u = user;
    u->backwards++;
    for (int i = 0; i < 2; i++) u->needs_bw[i] = nb_function_needs_input_grad(ctx, i);
    if (u->mode == MUL_OK) {
        nb_clear_error();
        u->mark_rc_bw = nb_function_mark_non_differentiable(ctx, gy);
        copy_error(u->mark_msg_bw, sizeof u->mark_msg_bw);
        nb_clear_error();
    }
    if (u->mode == BW_FAIL_SILENT) return -1;
    if (u->mode == BW_CLEARED_SILENT) {
        nb_function_needs_input_grad(ctx, 99); /* an error, handled: */
        nb_clear_error();
        return -1;
    }
    if (u->mode == BW_FAIL_MSG) {
        nb_report_error("boom");
        return -1;
    }
    nb_tensor *x = nb_function_saved(ctx, 0), *w = nb_function_saved(ctx, 1);
    nb_tensor *gx = nb_mul(gy, w), *gw = nb_mul(gy, x);
    if (!gx || !gw) return -1;
    if (u->mode == BW_NULL_AFTER_ERROR) /* a product that fails, its NULL handed on as 0 */
        gw = nb_matmul(gy, nb_zeros(NB_F64, NB_SHAPE(2, 3)));
    if (u->mode == BW_WRONG_SHAPE) gw = nb_zeros(NB_F64, NB_SHAPE(3, 2));
    if (u->mode == BW_WRONG_DTYPE) gw = nb_to(gw, NB_F32);
    if (u->mode == BW_FREED) nb_free(gw);
    if (u->mode == BW_NAN) {
        gx = nb_contiguous(gx);
        ((double *)nb_data(gx))[1] = NAN;
    }
    gin[0] = gx;
    gin[1] = gw;
    return 0;
}

static const nb_function MUL_OP = {.name = "mul_op", .forward = mul_forward,
                                   .backward = mul_backward, .destroy = mul_destroy};

static const double A6[6] = {1, 2, 3, 4, 5, 6};
static const double B6[6] = {0.5, -1, 2, -0.25, 3, 1.5};

START_TEST(backward_errors_name_the_function) {
    static const struct {
        int mode;
        const char *exact, *part;
    } cases[] = {
        {BW_WRONG_SHAPE, "nb_backward: the backward of mul_op returned a gradient of shape (3,2) "
                         "f64 for input 1, which has shape (2,3) f64", NULL},
        {BW_WRONG_DTYPE, "nb_backward: the backward of mul_op returned a gradient of shape (2,3) "
                         "f32 for input 1, which has shape (2,3) f64", NULL},
        {BW_FAIL_MSG, "nb_backward: the backward of mul_op failed: boom", NULL},
        {BW_FAIL_SILENT, NULL, "without reporting an error"},
        {BW_FREED, NULL, "returned a freed tensor as the gradient of input 1"},
        {BW_NULL_AFTER_ERROR, "nb_backward: the backward of mul_op returned 0 but no gradient "
                              "for input 1, after an error: nb_matmul: shapes (2,3) and (2,3) "
                              "cannot be multiplied (3 != 2)", NULL},
    };
    nb_tensor *x = leaf_of(NB_SHAPE(2, 3), A6), *w = leaf_of(NB_SHAPE(2, 3), B6);
    nb_tensor *in[2] = {x, w};
    usage start = usage_now();
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        mul_user u = {.mode = cases[k].mode};
        nb_scope_begin();
        nb_tensor *loss = OK(nb_sum_all(OK(nb_function_apply(&MUL_OP, in, 2, &u))));
        ck_assert_int_eq(nb_backward(loss), -1);
        ck_assert_int_eq(u.backwards, 1);
        expect_has(nb_last_error(), "mul_op");
        if (cases[k].exact) expect_message(cases[k].exact);
        else expect_has(nb_last_error(), cases[k].part);
        nb_clear_error();
        ck_assert_ptr_null(nb_grad(x)); /* refused before anything reached the leaves */
        ck_assert_ptr_null(nb_grad(w));
        nb_scope_end();
        ck_assert_int_eq(u.destroyed, 1);
        expect_usage(start);
    }
    /* the same op, left alone, is right; a silent failure says which function */
    mul_user u = {.mode = MUL_OK};
    nb_scope_begin();
    OK_RC(nb_backward(OK(nb_sum_all(OK(nb_function_apply(&MUL_OP, in, 2, &u))))));
    nb_scope_end();
    expect_vals(nb_grad(x), 6, B6, 0);
    expect_vals(nb_grad(w), 6, A6, 0);
    ck_assert_int_eq(u.mark_rc_bw, -1);
    expect_has(u.mark_msg_bw, "outputs can be marked only in forward");
    nb_free(x);
    nb_free(w);
}
END_TEST

START_TEST(forward_errors_name_the_function) {
    nb_tensor *x = leaf_of(NB_SHAPE(2, 3), A6), *w = leaf_of(NB_SHAPE(2, 3), B6);
    nb_tensor *in[2] = {x, w};
    usage start = usage_now();
    mul_user u = {.mode = FW_FAIL_MSG};
    nb_scope_begin();
    ck_assert_ptr_null(nb_function_apply(&MUL_OP, in, 2, &u));
    expect_message("mul_op: forward failed: boom");
    ck_assert_int_eq(u.destroyed, 1);
    nb_scope_end();
    expect_usage(start);

    u = (mul_user){.mode = FW_FAIL_SILENT};
    nb_scope_begin();
    nb_report_error("an old error, not this one"); /* forward must report its own */
    ck_assert_ptr_null(nb_function_apply(&MUL_OP, in, 2, &u));
    expect_message("mul_op: forward failed without reporting an error (nb_report_error)");
    ck_assert_int_eq(u.destroyed, 1);
    nb_scope_end();
    expect_usage(start);

    u = (mul_user){.mode = FW_FREED};
    nb_scope_begin();
    ck_assert_ptr_null(nb_function_apply(&MUL_OP, in, 2, &u));
    expect_message("mul_op: forward returned a freed tensor as output 0");
    ck_assert_int_eq(u.destroyed, 1);
    nb_scope_end();
    expect_usage(start);

    /* the same with grad mode off (no node would be recorded) */
    u = (mul_user){.mode = FW_FAIL_MSG};
    nb_set_grad_enabled(false);
    nb_scope_begin();
    ck_assert_ptr_null(nb_function_apply(&MUL_OP, in, 2, &u));
    expect_message("mul_op: forward failed: boom");
    nb_scope_end();
    nb_set_grad_enabled(true);
    ck_assert_int_eq(u.destroyed, 1);
    expect_usage(start);
    ck_assert_ptr_null(nb_grad(x));
    nb_free(x);
    nb_free(w);
}
END_TEST

/* A callback that met an error, handled it (nb_clear_error) and then failed
 * without a message: the "without reporting an error" message, as when
 * nothing was reported (a NULL nb_last_error() must never reach "%s"). */
START_TEST(failure_after_a_cleared_error_says_nothing_was_reported) {
    nb_tensor *x = leaf_of(NB_SHAPE(2, 3), A6), *w = leaf_of(NB_SHAPE(2, 3), B6);
    nb_tensor *in[2] = {x, w};
    char fw[1024], bw[1024]; /* the messages; asserted after cleaning up */
    mul_user u = {.mode = FW_CLEARED_SILENT};
    nb_scope_begin();
    nb_tensor *y = nb_function_apply(&MUL_OP, in, 2, &u);
    copy_error(fw, sizeof fw);
    nb_clear_error();
    u = (mul_user){.mode = BW_CLEARED_SILENT};
    nb_tensor *loss = nb_sum_all(nb_function_apply(&MUL_OP, in, 2, &u));
    int rc = loss ? nb_backward(loss) : 0;
    copy_error(bw, sizeof bw);
    nb_clear_error();
    nb_scope_end();
    nb_free(x);
    nb_free(w);
    ck_assert_ptr_null(y);
    ck_assert_int_eq(rc, -1);
    ck_assert_msg(!strstr(fw, "(null)") && strstr(fw, "without reporting an error"),
                  "forward failed after a cleared error: \"%s\"", fw);
    ck_assert_msg(!strstr(bw, "(null)") && strstr(bw, "without reporting an error"),
                  "backward failed after a cleared error: \"%s\"", bw);
}
END_TEST

/* Every message about a function names it by its whole `name`, however
 * long (the context keeps a copy of it). */
static const char LONG_NAME[] =
    "fused_rmsnorm_residual_dropout_f64_from_the_generated_kernel_library_v2";
START_TEST(long_function_names_are_kept_whole) {
    ck_assert_int_gt((int)strlen(LONG_NAME), 63);
    nb_function f = MUL_OP;
    f.name = LONG_NAME;
    nb_tensor *x = leaf_of(NB_SHAPE(2, 3), A6), *w = leaf_of(NB_SHAPE(2, 3), B6);
    nb_tensor *in[2] = {x, w};
    mul_user u = {.mode = BW_FAIL_MSG};
    char got[1024], want[256];
    nb_scope_begin();
    nb_tensor *loss = nb_sum_all(nb_function_apply(&f, in, 2, &u));
    int rc = loss ? nb_backward(loss) : 0;
    copy_error(got, sizeof got);
    nb_clear_error();
    nb_scope_end();
    nb_free(x);
    nb_free(w);
    ck_assert_int_eq(rc, -1);
    snprintf(want, sizeof want, "nb_backward: the backward of %s failed: boom", LONG_NAME);
    ck_assert_msg(strcmp(got, want) == 0, "\"%s\", expected \"%s\"", got, want);
}
END_TEST

/* ------------------------------------------------------------ A.5 anomaly */
START_TEST(anomaly_mode_names_the_function) {
    nb_tensor *x = leaf_of(NB_SHAPE(2, 3), A6), *w = leaf_of(NB_SHAPE(2, 3), B6);
    nb_tensor *in[2] = {x, w};
    usage start = usage_now();
    /* off: NaNs pass unnoticed */
    mul_user u = {.mode = BW_NAN};
    nb_scope_begin();
    OK_RC(nb_backward(OK(nb_sum_all(OK(nb_function_apply(&MUL_OP, in, 2, &u))))));
    ck_assert(isnan(((double *)nb_data(nb_grad(x)))[1]));
    nb_zero_grad(x);
    nb_zero_grad(w);
    nb_scope_end();
    start = usage_now(); /* the leaves have a .grad now */

    nb_set_detect_anomaly(true);
    u = (mul_user){.mode = BW_NAN};
    nb_scope_begin();
    nb_tensor *loss = OK(nb_sum_all(OK(nb_function_apply(&MUL_OP, in, 2, &u))));
    ck_assert_int_eq(nb_backward(loss), -1);
    expect_has(nb_last_error(), "nb_backward: anomaly detected: ");
    expect_has(nb_last_error(), "the backward of mul_op produced NaN at element 1 of the "
                                "gradient of input 0 (shape (2,3))");
    nb_clear_error();
    nb_scope_end();
    ck_assert_int_eq(u.destroyed, 1);
    expect_usage(start);

    u = (mul_user){.mode = FW_NAN};
    nb_scope_begin();
    ck_assert_ptr_null(nb_function_apply(&MUL_OP, in, 2, &u));
    expect_has(nb_last_error(), "mul_op: anomaly detected: the forward produced NaN at element 2 "
                                "of its output (shape (2,3)) from finite inputs");
    nb_clear_error();
    ck_assert_int_eq(u.destroyed, 1); /* at once: apply failed */
    nb_scope_end();
    nb_set_detect_anomaly(false);
    expect_usage(start);
    double zeros[6] = {0};
    expect_vals(nb_grad(x), 6, zeros, 0); /* nothing reached the leaves */

    u = (mul_user){.mode = FW_NAN}; /* anomaly off again: the NaN goes through */
    nb_scope_begin();
    ck_assert(isnan(((double *)nb_data(OK(nb_function_apply(&MUL_OP, in, 2, &u))))[2]));
    nb_scope_end();
    nb_free(x);
    nb_free(w);
}
END_TEST

/* ------------------------------------------- A.6 scopes and the destroy callback */
static nb_tensor *no_backward_forward(nb_function_ctx *ctx, nb_tensor **in, int n, void *user) {
    (void)ctx, (void)n, (void)user;
    return nb_mul_scalar(in[0], 2.0);
}
static const nb_function NO_BACKWARD = {.name = "no_backward", .forward = no_backward_forward,
                                        .destroy = silu_destroy};

START_TEST(destroy_runs_once_per_apply) {
    nb_tensor *x = leaf_of(NB_SHAPE(6), X6), *c = f64_of(NB_SHAPE(6), X6);
    usage start = usage_now();

    /* a graph: the ctx (and what it saved) goes when the graph's scope ends */
    silu_user u = {0};
    nb_scope_begin();
    nb_tensor *y = OK(nb_function_apply(&SILU, &x, 1, &u));
    ck_assert_int_eq(u.destroyed, 0);
    nb_tensor *z = OK(nb_mul(y, y));
    ck_assert_int_eq(u.destroyed, 0);
    nb_free(y); /* the graph still holds the node */
    ck_assert_int_eq(u.destroyed, 0);
    ck_assert_ptr_nonnull(z);
    nb_scope_end();
    ck_assert_int_eq(u.destroyed, 1);
    expect_usage(start);

    /* with a backward in between: not at backward, at scope end */
    u = (silu_user){0};
    nb_scope_begin();
    OK_RC(nb_backward(OK(nb_sum_all(OK(nb_function_apply(&SILU, &x, 1, &u))))));
    ck_assert_int_eq(u.destroyed, 0);
    nb_scope_end();
    ck_assert_int_eq(u.destroyed, 1);
    start.live++; /* x's .grad */
    start.bytes = nb_memory_allocated();
    expect_usage(start);

    /* grad mode off: no node, destroyed at once */
    u = (silu_user){0};
    nb_scope_begin();
    nb_set_grad_enabled(false);
    y = OK(nb_function_apply(&SILU, &x, 1, &u));
    nb_set_grad_enabled(true);
    ck_assert_int_eq(u.destroyed, 1);
    ck_assert(!nb_requires_grad(y));
    nb_scope_end();
    ck_assert_int_eq(u.destroyed, 1);

    /* no input requires grad: the same */
    u = (silu_user){0};
    nb_scope_begin();
    y = OK(nb_function_apply(&SILU, &c, 1, &u));
    ck_assert_int_eq(u.destroyed, 1);
    ck_assert(!nb_requires_grad(y) && nb_is_leaf(y));
    nb_scope_end();
    ck_assert_int_eq(u.destroyed, 1);

    /* apply fails: forward failed, a NULL or freed input, no backward, no forward */
    mul_user m = {.mode = FW_FAIL_MSG};
    nb_tensor *in[2] = {x, x};
    nb_scope_begin();
    ck_assert_ptr_null(nb_function_apply(&MUL_OP, in, 2, &m));
    ck_assert_int_eq(m.destroyed, 1);
    m = (mul_user){.mode = MUL_OK};
    in[1] = NULL;
    nb_clear_error();
    ck_assert_ptr_null(nb_function_apply(&MUL_OP, in, 2, &m));
    expect_message("mul_op: input 1 is NULL");
    ck_assert_int_eq(m.forwards, 0);
    ck_assert_int_eq(m.destroyed, 1);
    nb_tensor *gone = OK(nb_mul_scalar(c, 1.0));
    nb_free(gone);
    in[1] = gone;
    m = (mul_user){.mode = MUL_OK};
    ck_assert_ptr_null(nb_function_apply(&MUL_OP, in, 2, &m));
    expect_has(nb_last_error(), "mul_op: input 1 was freed");
    nb_clear_error();
    ck_assert_int_eq(m.destroyed, 1);
    u = (silu_user){0};
    ck_assert_ptr_null(nb_function_apply(&NO_BACKWARD, &x, 1, &u));
    expect_has(nb_last_error(), "an input requires grad, but no_backward has no backward");
    nb_clear_error();
    ck_assert_int_eq(u.destroyed, 1);
    nb_function nothing = {.name = "nothing", .destroy = silu_destroy};
    u = (silu_user){0};
    ck_assert_ptr_null(nb_function_apply(&nothing, &x, 1, &u));
    expect_has(nb_last_error(), "nothing has no forward");
    nb_clear_error();
    ck_assert_int_eq(u.destroyed, 1);
    /* without a backward but with nothing requiring grad: fine */
    u = (silu_user){0};
    double twice[6];
    for (int i = 0; i < 6; i++) twice[i] = 2 * X6[i];
    expect_vals(OK(nb_function_apply(&NO_BACKWARD, &c, 1, &u)), 6, twice, 0);
    ck_assert_int_eq(u.destroyed, 1);
    nb_scope_end();
    expect_usage(start);
    ck_assert_int_eq(u.destroyed, 1);
    /* a persistent output (no scope open): when it is freed; see
     * apply_outside_a_scope_leaks_nothing */
    nb_free(x);
    nb_free(c);
}
END_TEST

/* With no scope open, the output of a custom op is persistent, and freeing
 * it frees everything apply made: forward runs in a scope of its own, and
 * the tensor it returns is handed to the caller's scope as the output itself
 * (not kept behind a view the caller cannot free). */
typedef struct {
    nb_tensor *returned; /* what forward returned, to clean up after the leak */
    int destroyed;
} double_user;
static void double_destroy(void *user) { ((double_user *)user)->destroyed++; }
static nb_tensor *double_forward(nb_function_ctx *ctx, nb_tensor **in, int n, void *user) {
    (void)ctx, (void)n;
    return ((double_user *)user)->returned = nb_mul_scalar(in[0], 2.0);
}
static int double_backward(nb_function_ctx *ctx, nb_tensor *gy, nb_tensor **gin, void *user) {
    (void)ctx, (void)user;
    gin[0] = nb_mul_scalar(gy, 2.0);
    return 0;
}
static const nb_function DOUBLE = {.name = "double", .forward = double_forward,
                                   .backward = double_backward, .destroy = double_destroy};

START_TEST(apply_outside_a_scope_leaks_nothing) {
    ck_assert_int_eq(nb_scope_depth(), 0);
    nb_tensor *x = leaf_of(NB_SHAPE(6), X6), *c = f64_of(NB_SHAPE(6), X6);
    usage start = usage_now();
    int64_t left_live[2], left_bytes[2];
    for (int grad = 0; grad < 2; grad++) { /* no node (c), then a node (x) */
        double_user u = {0};
        nb_tensor *y = OK(nb_function_apply(&DOUBLE, grad ? &x : &c, 1, &u));
        ck_assert_int_eq(nb_requires_grad(y), grad);
        ck_assert_int_eq(u.destroyed, !grad); /* no node: at once */
        double want[6];
        for (int i = 0; i < 6; i++) want[i] = 2 * X6[i];
        expect_vals(y, 6, want, 0);
        nb_free(y);
        ck_assert_int_eq(u.destroyed, 1); /* with a node: when the output is freed */
        left_live[grad] = nb_live_tensors() - start.live;
        left_bytes[grad] = nb_memory_allocated() - start.bytes;
        if (left_live[grad] > 0) nb_free(u.returned); /* clean up after a regression */
        expect_usage(start);
    }
    nb_free(x);
    nb_free(c);
    for (int grad = 0; grad < 2; grad++)
        ck_assert_msg(left_live[grad] == 0 && left_bytes[grad] == 0,
                      "after nb_free of a custom op's persistent output (%s), %lld "
                      "tensor(s) and %lld bytes stay allocated, with no handle to free them",
                      grad ? "with a graph" : "no graph", (long long)left_live[grad],
                      (long long)left_bytes[grad]);
}
END_TEST

/* -------------------------------------------------- A.7 needs_input_grad */
START_TEST(needs_input_grad_follows_requires_grad) {
    nb_tensor *x = leaf_of(NB_SHAPE(2, 3), A6), *c = f64_of(NB_SHAPE(2, 3), B6);
    nb_tensor *in[2] = {x, c};
    mul_user u = {.probe_range = true};
    nb_scope_begin();
    OK_RC(nb_backward(OK(nb_sum_all(OK(nb_function_apply(&MUL_OP, in, 2, &u))))));
    nb_scope_end();
    ck_assert(u.needs_fwd[0] && !u.needs_fwd[1]);
    ck_assert(u.needs_bw[0] && !u.needs_bw[1]);
    ck_assert(!u.oor_value);
    expect_has(u.oor_msg, "nb_function_needs_input_grad");
    expect_has(u.oor_msg, "mul_op");
    expect_has(u.oor_msg, "input -1 is out of range (2 inputs)");
    expect_vals(nb_grad(x), 6, B6, 0);
    ck_assert_ptr_null(nb_grad(c)); /* the gradient backward set anyway was ignored */

    /* c starts requiring grad after apply: still not asked for, still ignored */
    nb_zero_grad(x);
    u = (mul_user){0};
    nb_scope_begin();
    nb_tensor *loss = OK(nb_sum_all(OK(nb_function_apply(&MUL_OP, in, 2, &u))));
    nb_set_requires_grad(c, true);
    OK_RC(nb_backward(loss));
    nb_set_requires_grad(c, false);
    nb_scope_end();
    ck_assert(!u.needs_bw[1]);
    ck_assert_ptr_null(nb_grad(c));
    expect_vals(nb_grad(x), 6, B6, 0);

    /* grad mode off: nothing is needed */
    u = (mul_user){.probe_range = true};
    nb_set_grad_enabled(false);
    nb_scope_begin();
    OK(nb_function_apply(&MUL_OP, in, 2, &u));
    nb_scope_end();
    nb_set_grad_enabled(true);
    ck_assert(!u.needs_fwd[0] && !u.needs_fwd[1]);
    expect_has(u.oor_msg, "out of range");

    /* gradcheck agrees: the gradient for c is dropped, not an error */
    applier a = {&MUL_OP, &u};
    u = (mul_user){0};
    expect_gradcheck("mul_op (custom), second input without grad", apply_fn, &a, 2, in);
    ck_assert_ptr_null(nb_grad(c));
    nb_free(x);
    nb_free(c);
}
END_TEST

/* ------------------------------------------- A.8 mark_non_differentiable */
START_TEST(non_differentiable_output_has_no_graph) {
    nb_tensor *x = leaf_of(NB_SHAPE(2, 3), A6), *w = leaf_of(NB_SHAPE(2, 3), B6);
    nb_tensor *in[2] = {x, w};
    mul_user u = {.mode = FW_MARK_OUTPUT};
    usage start = usage_now();
    nb_scope_begin();
    nb_tensor *y = OK(nb_function_apply(&MUL_OP, in, 2, &u));
    ck_assert(!nb_requires_grad(y));
    ck_assert(nb_is_leaf(y));
    ck_assert_int_eq(u.destroyed, 1); /* no node: the ctx went at once */
    double want[6];
    for (int i = 0; i < 6; i++) want[i] = A6[i] * B6[i];
    expect_vals(y, 6, want, 0);
    expect_error_rc(nb_backward(OK(nb_sum_all(y))), "does not require grad");
    nb_scope_end();
    expect_usage(start);
    nb_free(x);
    nb_free(w);
}
END_TEST

/* ------------------------------------ extra: one input twice, many inputs, identity */
/* y = sum_i (i + 1) in[i]: n inputs, more than a node holds inline. */
static nb_tensor *wsum_forward(nb_function_ctx *ctx, nb_tensor **in, int n, void *user) {
    (void)ctx, (void)user;
    nb_tensor *y = nb_zeros(NB_F64, nb_ndim(in[0]), nb_shape(in[0]));
    if (!y) return NULL;
    double *py = nb_data(y);
    for (int k = 0; k < n; k++) {
        nb_tensor *t = nb_contiguous(in[k]);
        if (!t) return NULL;
        const double *pt = nb_data(t);
        for (int64_t i = 0; i < nb_numel(y); i++) py[i] += (k + 1) * pt[i];
    }
    return y;
}
static int wsum_backward(nb_function_ctx *ctx, nb_tensor *gy, nb_tensor **gin, void *user) {
    int n = *(const int *)user; /* the input count */
    for (int k = 0; k < n; k++)
        if (nb_function_needs_input_grad(ctx, k) && !(gin[k] = nb_mul_scalar(gy, k + 1)))
            return -1;
    return 0;
}
static const nb_function WSUM = {.name = "wsum", .forward = wsum_forward,
                                 .backward = wsum_backward};

static nb_tensor *identity_forward(nb_function_ctx *ctx, nb_tensor **in, int n, void *user) {
    (void)ctx, (void)n, (void)user;
    return in[0];
}
static int identity_backward(nb_function_ctx *ctx, nb_tensor *gy, nb_tensor **gin, void *user) {
    (void)ctx, (void)user;
    gin[0] = gy;
    return 0;
}
static const nb_function IDENTITY = {.name = "identity", .forward = identity_forward,
                                     .backward = identity_backward};

START_TEST(repeated_and_many_inputs) {
    nb_tensor *x = leaf_of(NB_SHAPE(2, 3), A6);
    usage start = usage_now();
    /* x * x through one node with x twice: both gradients add up, 2x */
    mul_user u = {0};
    nb_tensor *in[2] = {x, x};
    nb_scope_begin();
    OK_RC(nb_backward(OK(nb_sum_all(OK(nb_function_apply(&MUL_OP, in, 2, &u))))));
    nb_scope_end();
    ck_assert(u.needs_bw[0] && u.needs_bw[1]);
    double want[6];
    for (int i = 0; i < 6; i++) want[i] = 2 * A6[i];
    expect_vals(nb_grad(x), 6, want, 0);
    nb_zero_grad(x);
    start = usage_now();

    /* eight inputs, every other one requiring grad */
    enum { K = 8 };
    nb_tensor *many[K];
    for (int k = 0; k < K; k++) {
        many[k] = f64_of(NB_SHAPE(3), (double[]){k, 2 * k, -k});
        if (k % 2 == 0) nb_set_requires_grad(many[k], true);
    }
    nb_scope_begin();
    int nk = K;
    nb_tensor *y = OK(nb_function_apply(&WSUM, many, K, &nk));
    expect_vals(y, 3, ((double[]){168, 336, -168}), 0); /* sum (k+1) k = 168 */
    nb_tensor *c = f64_of(NB_SHAPE(3), (double[]){1, -2, 0.5});
    OK_RC(nb_backward(OK(nb_sum_all(nb_mul(y, c)))));
    nb_scope_end();
    for (int k = 0; k < K; k++) {
        if (k % 2) {
            ck_assert_ptr_null(nb_grad(many[k]));
        } else {
            double g[3] = {k + 1.0, -2.0 * (k + 1), 0.5 * (k + 1)};
            expect_vals(nb_grad(many[k]), 3, g, 0);
        }
    }
    applier a = {&WSUM, &nk};
    expect_gradcheck("wsum (custom), 8 inputs", apply_fn, &a, K, many);
    for (int k = 0; k < K; k++) nb_free(many[k]);

    /* an input returned as it is: a new handle on its storage, differentiable */
    nb_scope_begin();
    nb_tensor *id = OK(nb_function_apply(&IDENTITY, &x, 1, NULL));
    ck_assert_ptr_ne(id, x);
    ck_assert_ptr_eq(nb_data(id), nb_data(x));
    ck_assert(!nb_is_leaf(id));
    OK_RC(nb_backward(OK(nb_sum_all(nb_mul(id, id)))));
    nb_scope_end();
    expect_vals(nb_grad(x), 6, want, 0);
    expect_usage(start);
    nb_free(x);
}
END_TEST

/* --------------------------------------------------- A.9 backward twice */
START_TEST(backward_twice_needs_retain_graph) {
    for (int builtin = 0; builtin < 2; builtin++) {
        nb_tensor *x = leaf_of(NB_SHAPE(6), X6);
        nb_scope_begin();
        nb_tensor *loss = builtin ? OK(nb_sum_all(nb_mul(x, x)))
                                  : OK(nb_sum_all(OK(nb_function_apply(&SILU, &x, 1, NULL))));
        OK_RC(nb_backward(loss));
        double *g1 = values(nb_grad(x));
        ck_assert_int_eq(nb_backward(loss), -1);
        expect_has(nb_last_error(), "nb_backward: the graph was already backpropagated through ");
        expect_has(nb_last_error(), builtin ? "nb_mul" : "silu");
        expect_has(nb_last_error(), "retain_graph");
        nb_clear_error();
        double *g1b = values(nb_grad(x));
        ck_assert(same_bits(g1, g1b, 6)); /* refused before anything was added */
        free(g1b);
        nb_scope_end();
        nb_free(x);

        /* retained: the second backward adds exactly the same again */
        x = leaf_of(NB_SHAPE(6), X6);
        nb_scope_begin();
        loss = builtin ? OK(nb_sum_all(nb_mul(x, x)))
                       : OK(nb_sum_all(OK(nb_function_apply(&SILU, &x, 1, NULL))));
        OK_RC(nb_backward_with_opts(loss, NULL, &(nb_backward_opts){.retain_graph = true}));
        double *r1 = values(nb_grad(x));
        ck_assert(same_bits(r1, g1, 6));
        OK_RC(nb_backward(loss));
        double *r2 = values(nb_grad(x)), twice[6];
        for (int i = 0; i < 6; i++) twice[i] = 2 * r1[i];
        ck_assert(same_bits(r2, twice, 6));
        /* that one did not retain: a third is refused */
        expect_error_rc(nb_backward(loss), "retain_graph");
        nb_scope_end();
        free(g1);
        free(r1);
        free(r2);
        nb_free(x);
    }
}
END_TEST

/* ------------------------------------ A.10 saved tensors go after backward */
START_TEST(saved_tensors_are_freed_after_backward) {
    const int64_t BIG = INT64_C(1) << 20, bytes = BIG * (int64_t)sizeof(double);
    const int64_t slack = 64 * 1024;
    int64_t initial = nb_memory_allocated();
    nb_tensor *x = leaf_of(NB_SHAPE(6), X6);
    silu_user u = {.extra_numel = BIG};
    nb_scope_begin();
    int64_t m0 = nb_memory_allocated();
    nb_tensor *loss = OK(nb_sum_all(OK(nb_function_apply(&SILU, &x, 1, &u))));
    int64_t m1 = nb_memory_allocated();
    ck_assert_int_ge(m1 - m0, bytes); /* held by the ctx only */
    OK_RC(nb_backward(loss));
    int64_t m2 = nb_memory_allocated();
    ck_assert_msg(m1 - m2 >= bytes - slack, "after backward %lld bytes, before %lld",
                  (long long)m2, (long long)m1);
    ck_assert_int_eq(u.destroyed, 0); /* the ctx itself stays with the graph */
    expect_error_rc(nb_backward(loss), "retain_graph");
    nb_scope_end();
    ck_assert_int_eq(u.destroyed, 1);
    double want[6];
    for (int i = 0; i < 6; i++) want[i] = dsilu_ref(X6[i]);
    expect_vals(nb_grad(x), 6, want, 1e-14);

    /* retained: still held after the first backward, released by the second */
    u = (silu_user){.extra_numel = BIG};
    nb_scope_begin();
    m0 = nb_memory_allocated();
    loss = OK(nb_sum_all(OK(nb_function_apply(&SILU, &x, 1, &u))));
    OK_RC(nb_backward_with_opts(loss, NULL, &(nb_backward_opts){.retain_graph = true}));
    m2 = nb_memory_allocated();
    ck_assert_int_ge(m2 - m0, bytes);
    OK_RC(nb_backward(loss));
    ck_assert_int_le(nb_memory_allocated(), m2 - bytes + slack);
    nb_scope_end();
    ck_assert_int_eq(u.destroyed, 1);
    ck_assert_int_eq(u.backwards, 2);
    for (int i = 0; i < 6; i++) want[i] *= 3;
    expect_vals(nb_grad(x), 6, want, 1e-14);
    nb_free(x);
    ck_assert_int_eq(nb_memory_allocated(), initial);
}
END_TEST

/* nb_exp saves its output; a user who frees that handle gets the memory
 * back after backward, not at scope end. */
START_TEST(builtin_saved_output_is_freed_after_backward) {
    const int64_t N = INT64_C(1) << 20, bytes = N * (int64_t)sizeof(double);
    const int64_t slack = 64 * 1024;
    int64_t initial = nb_memory_allocated();
    nb_tensor *x = leaf_of(NB_SHAPE(1), (double[]){0.25});
    for (int variant = 0; variant < 3; variant++) { /* freed; kept; freed but retained */
        nb_scope_begin();
        int64_t m0 = nb_memory_allocated();
        nb_tensor *y = OK(nb_exp(OK(nb_expand(x, NB_SHAPE(N)))));
        nb_tensor *loss = OK(nb_sum_all(y));
        if (variant != 1) nb_free(y);
        int64_t m1 = nb_memory_allocated();
        ck_assert_int_ge(m1 - m0, bytes); /* the graph keeps what exp's backward reads */
        if (variant == 2)
            OK_RC(nb_backward_with_opts(loss, NULL, &(nb_backward_opts){.retain_graph = true}));
        else
            OK_RC(nb_backward(loss));
        int64_t m2 = nb_memory_allocated();
        if (variant == 0)
            ck_assert_msg(m1 - m2 >= bytes - slack, "exp's output still held after backward: "
                          "%lld bytes before, %lld after", (long long)m1, (long long)m2);
        else
            ck_assert_int_ge(m2 - m0, bytes);
        nb_scope_end();
        ck_assert_int_le(nb_memory_allocated(), m0 + slack);
        ck_assert_double_eq_tol(nb_item(nb_grad(x)), (variant + 1) * (double)N * exp(0.25),
                                1e-9 * (double)N);
    }
    nb_free(x);
    ck_assert_int_eq(nb_memory_allocated(), initial);
}
END_TEST

/* ------------------------------------------------------------ A.11 threads */
enum { TR = 24, TD = 7, TITERS = 10 };
typedef struct {
    uint64_t seed;
    silu_user u;
    double gx[TR * TD], gw[TD], loss;
    bool stable; /* every iteration gave the same bits */
    char err[256];
} tjob;

static void *tjob_run(void *arg) {
    tjob *j = arg;
    j->stable = true;
    for (int it = 0; it < TITERS; it++) {
        nb_scope_begin();
        nb_rng r;
        nb_rng_seed(&r, j->seed);
        nb_tensor *x = nb_set_requires_grad(nb_randn(NB_F64, NB_SHAPE(TR, TD), &r), true);
        nb_tensor *w = nb_set_requires_grad(nb_randn(NB_F64, NB_SHAPE(TD), &r), true);
        nb_tensor *in[2] = {x, w};
        nb_tensor *y = nb_function_apply(&SILU_W, in, 2, &j->u);
        nb_tensor *loss = nb_sum_all(nb_mul(y, y));
        double gx[TR * TD], gw[TD];
        if (!loss || nb_backward(loss) != 0 || nb_copy_to_f64(nb_grad(x), gx) != 0 ||
            nb_copy_to_f64(nb_grad(w), gw) != 0) {
            snprintf(j->err, sizeof j->err, "%s", nb_last_error() ? nb_last_error() : "?");
            nb_scope_end();
            return NULL;
        }
        double l = nb_item(loss);
        if (it == 0) {
            memcpy(j->gx, gx, sizeof gx);
            memcpy(j->gw, gw, sizeof gw);
            j->loss = l;
        } else if (!same_bits(j->gx, gx, TR * TD) || !same_bits(j->gw, gw, TD) ||
                   memcmp(&j->loss, &l, sizeof l) != 0) {
            j->stable = false;
        }
        nb_scope_end();
    }
    return NULL;
}

START_TEST(threads_match_a_single_thread) {
    usage start = usage_now();
    tjob *ref = calloc(2, sizeof *ref), *par = calloc(2, sizeof *par);
    ck_assert(ref && par);
    for (int k = 0; k < 2; k++) {
        ref[k].seed = par[k].seed = 31 + (uint64_t)k;
        tjob_run(&ref[k]);
        ck_assert_msg(!ref[k].err[0], "%s", ref[k].err);
    }
    pthread_t th[2];
    for (int k = 0; k < 2; k++)
        ck_assert_int_eq(pthread_create(&th[k], NULL, tjob_run, &par[k]), 0);
    for (int k = 0; k < 2; k++) ck_assert_int_eq(pthread_join(th[k], NULL), 0);
    for (int k = 0; k < 2; k++) {
        ck_assert_msg(!par[k].err[0], "thread %d: %s", k, par[k].err);
        ck_assert_msg(par[k].stable, "thread %d: iterations differ", k);
        ck_assert_msg(same_bits(par[k].gx, ref[k].gx, TR * TD), "thread %d: x.grad differs", k);
        ck_assert_msg(same_bits(par[k].gw, ref[k].gw, TD), "thread %d: w.grad differs", k);
        ck_assert(memcmp(&par[k].loss, &ref[k].loss, sizeof(double)) == 0);
        ck_assert_int_eq(par[k].u.forwards, TITERS);
        ck_assert_int_eq(par[k].u.backwards, TITERS);
        ck_assert_int_eq(par[k].u.destroyed, TITERS);
    }
    /* the two seeds gave different data: the comparison is not vacuous */
    ck_assert(!same_bits(ref[0].gw, ref[1].gw, TD));
    free(ref);
    free(par);
    expect_usage(start);
}
END_TEST

/* ============================================================ B. several outputs */
typedef struct {
    bool mark_out1, nan_out1;
    int destroyed, backwards;
    bool gnull[3], gzero[3];
} multi_user;

static void multi_destroy(void *user) { ((multi_user *)user)->destroyed++; }

/* (a, b) -> (a * b, a + b[, (a > b) as i64]) */
static int prodsum_forward(nb_function_ctx *ctx, nb_tensor **in, int n, nb_tensor **out,
                           int nout, void *user) {
    multi_user *u = user;
    (void)n;
    nb_tensor *a = nb_contiguous(in[0]), *b = nb_contiguous(in[1]);
    if (!a || !b) return -1;
    int nd = nb_ndim(a);
    const int64_t *sh = nb_shape(a);
    out[0] = nb_empty(NB_F64, nd, sh);
    out[1] = nb_empty(NB_F64, nd, sh);
    if (nout > 2) out[2] = nb_empty(NB_I64, nd, sh);
    if (!out[0] || !out[1] || (nout > 2 && !out[2])) return -1;
    const double *pa = nb_data(a), *pb = nb_data(b);
    double *p0 = nb_data(out[0]), *p1 = nb_data(out[1]);
    for (int64_t i = 0; i < nb_numel(a); i++) {
        p0[i] = pa[i] * pb[i];
        p1[i] = pa[i] + pb[i];
        if (nout > 2) ((int64_t *)nb_data(out[2]))[i] = pa[i] > pb[i];
    }
    if (u->nan_out1) p1[1] = NAN;
    if (nb_function_save(ctx, a) || nb_function_save(ctx, b)) return -1;
    if (u->mark_out1 && nb_function_mark_non_differentiable(ctx, out[1])) return -1;
    return 0;
}

static int prodsum_backward(nb_function_ctx *ctx, nb_tensor **gouts, int nout, nb_tensor **gin,
                            void *user) {
    multi_user *u = user;
    u->backwards++;
    nb_tensor *a = nb_function_saved(ctx, 0), *b = nb_function_saved(ctx, 1);
    if (!a || !b) return -1;
    int64_t N = nb_numel(a);
    nb_tensor *g[2] = {NULL, NULL};
    for (int k = 0; k < nout && k < 3; k++) {
        u->gnull[k] = gouts[k] == NULL;
        u->gzero[k] = false;
        if (!gouts[k]) continue;
        nb_tensor *c = nb_contiguous(gouts[k]);
        if (!c) return -1;
        if (k < 2) g[k] = c;
        bool zero = nb_numel(c) == N && nb_dtype_of(c) == NB_F64;
        for (int64_t i = 0; zero && i < N; i++) zero = ((const double *)nb_data(c))[i] == 0.0;
        u->gzero[k] = zero;
    }
    if (!g[0] || !g[1]) {
        nb_report_error("prodsum: a floating output got no gradient");
        return -1;
    }
    nb_tensor *ga = nb_empty(NB_F64, nb_ndim(a), nb_shape(a));
    nb_tensor *gb = nb_empty(NB_F64, nb_ndim(a), nb_shape(a));
    if (!ga || !gb) return -1;
    const double *pa = nb_data(a), *pb = nb_data(b), *g0 = nb_data(g[0]), *g1 = nb_data(g[1]);
    double *pga = nb_data(ga), *pgb = nb_data(gb);
    for (int64_t i = 0; i < N; i++) {
        pga[i] = g0[i] * pb[i] + g1[i];
        pgb[i] = g0[i] * pa[i] + g1[i];
    }
    gin[0] = ga;
    gin[1] = gb;
    return 0;
}

static const nb_function PRODSUM = {.name = "prodsum", .forward_multi = prodsum_forward,
                                    .backward_multi = prodsum_backward,
                                    .destroy = multi_destroy};

static const double PA[4] = {1.0, -2.0, 3.0, 0.5}, PB[4] = {4.0, 5.0, -6.0, 2.0};

START_TEST(multi_gradients_from_both_outputs) {
    nb_tensor *a = leaf_of(NB_SHAPE(2, 2), PA), *b = leaf_of(NB_SHAPE(2, 2), PB);
    nb_tensor *in[2] = {a, b}, *out[2];
    const double C0[4] = {1, 2, -1, 0.5}, C1[4] = {3, -2, 0.25, 1};
    nb_tensor *c0 = f64_of(NB_SHAPE(2, 2), C0), *c1 = f64_of(NB_SHAPE(2, 2), C1);
    multi_user u = {0};
    usage start = usage_now();
    nb_scope_begin();
    OK_RC(nb_function_apply_multi(&PRODSUM, in, 2, out, 2, &u));
    double p[4], s[4], ga[4], gb[4];
    for (int i = 0; i < 4; i++) {
        p[i] = PA[i] * PB[i];
        s[i] = PA[i] + PB[i];
        ga[i] = C0[i] * PB[i] + C1[i];
        gb[i] = C0[i] * PA[i] + C1[i];
    }
    expect_vals(out[0], 4, p, 0);
    expect_vals(out[1], 4, s, 0);
    ck_assert(nb_requires_grad(out[0]) && nb_requires_grad(out[1]));
    ck_assert(!nb_is_leaf(out[0]) && !nb_is_leaf(out[1]));
    nb_tensor *loss = OK(nb_add(nb_sum_all(nb_mul(out[0], c0)), nb_sum_all(nb_mul(out[1], c1))));
    OK_RC(nb_backward(loss));
    ck_assert_int_eq(u.backwards, 1); /* one call with both gradients */
    ck_assert(!u.gnull[0] && !u.gnull[1] && !u.gzero[0] && !u.gzero[1]);
    expect_vals(nb_grad(a), 4, ga, 0);
    expect_vals(nb_grad(b), 4, gb, 0);
    ck_assert_int_eq(u.destroyed, 0);
    expect_error_rc(nb_backward(loss), "retain_graph", "prodsum");
    nb_scope_end();
    ck_assert_int_eq(u.destroyed, 1);
    start.live += 2;
    start.bytes = nb_memory_allocated();
    expect_usage(start);

    /* retained: twice, exactly double */
    nb_zero_grad(a);
    nb_zero_grad(b);
    u = (multi_user){0};
    nb_scope_begin();
    OK_RC(nb_function_apply_multi(&PRODSUM, in, 2, out, 2, &u));
    loss = OK(nb_add(nb_sum_all(nb_mul(out[0], c0)), nb_sum_all(nb_mul(out[1], c1))));
    OK_RC(nb_backward_with_opts(loss, NULL, &(nb_backward_opts){.retain_graph = true}));
    OK_RC(nb_backward(loss));
    nb_scope_end();
    ck_assert_int_eq(u.backwards, 2);
    ck_assert_int_eq(u.destroyed, 1);
    for (int i = 0; i < 4; i++) {
        ga[i] *= 2;
        gb[i] *= 2;
    }
    expect_vals(nb_grad(a), 4, ga, 0);
    expect_vals(nb_grad(b), 4, gb, 0);
    expect_usage(start);

    /* retained, then another loss on the same graph that uses out0 only:
     * out1's gradient is zeros again, not the one of the first backward */
    nb_zero_grad(a);
    nb_zero_grad(b);
    u = (multi_user){0};
    nb_scope_begin();
    OK_RC(nb_function_apply_multi(&PRODSUM, in, 2, out, 2, &u));
    loss = OK(nb_add(nb_sum_all(nb_mul(out[0], c0)), nb_sum_all(nb_mul(out[1], c1))));
    OK_RC(nb_backward_with_opts(loss, NULL, &(nb_backward_opts){.retain_graph = true}));
    ck_assert(!u.gzero[1]);
    OK_RC(nb_backward(OK(nb_sum_all(out[0]))));
    ck_assert(u.gzero[1]);
    ck_assert_int_eq(u.backwards, 2);
    nb_scope_end();
    for (int i = 0; i < 4; i++) {
        ga[i] = ga[i] / 2 + PB[i];
        gb[i] = gb[i] / 2 + PA[i];
    }
    expect_vals(nb_grad(a), 4, ga, 0);
    expect_vals(nb_grad(b), 4, gb, 0);
    expect_usage(start);
    nb_free(c0);
    nb_free(c1);
    nb_free(a);
    nb_free(b);
}
END_TEST

START_TEST(multi_unused_output_gets_zeros) {
    nb_tensor *a = leaf_of(NB_SHAPE(2, 2), PA), *b = leaf_of(NB_SHAPE(2, 2), PB);
    nb_tensor *in[2] = {a, b}, *out[2];
    for (int used = 0; used < 2; used++) {
        multi_user u = {0};
        nb_scope_begin();
        OK_RC(nb_function_apply_multi(&PRODSUM, in, 2, out, 2, &u));
        OK_RC(nb_backward(OK(nb_sum_all(out[used]))));
        nb_scope_end();
        ck_assert_int_eq(u.backwards, 1);
        ck_assert(!u.gnull[0] && !u.gnull[1]);
        ck_assert(!u.gzero[used]);
        ck_assert_msg(u.gzero[1 - used], "output %d's gradient should be zeros", 1 - used);
        ck_assert_int_eq(u.destroyed, 1);
        double ga[4], gb[4];
        for (int i = 0; i < 4; i++) {
            ga[i] = used ? 1.0 : PB[i];
            gb[i] = used ? 1.0 : PA[i];
        }
        expect_vals(nb_grad(a), 4, ga, 0);
        expect_vals(nb_grad(b), 4, gb, 0);
        nb_zero_grad(a);
        nb_zero_grad(b);
    }
    nb_free(a);
    nb_free(b);
}
END_TEST

static nb_tensor *prodsum_combo(nb_tensor **in, int n, void *user) {
    nb_tensor *o[2];
    if (nb_function_apply_multi(&PRODSUM, in, n, o, 2, user) != 0) return NULL;
    return nb_add(o[0], nb_mul_scalar(o[1], 2.0));
}

START_TEST(multi_passes_gradcheck) {
    nb_scope_begin();
    nb_tensor *in[2] = {rand_leaf(41, NB_SHAPE(2, 3)), rand_leaf(42, NB_SHAPE(2, 3))};
    multi_user u = {0};
    expect_gradcheck("prodsum (custom, 2 outputs): out0 + 2 out1", prodsum_combo, &u, 2, in);
    ck_assert_int_gt(u.backwards, 0);
    ck_assert(!u.gzero[0] && !u.gzero[1]);
    /* a non-contiguous b */
    nb_tensor *bt = transposed_leaf(43, NB_SHAPE(2, 3), 0, 1);
    nb_tensor *in2[2] = {in[0], bt};
    expect_gradcheck("prodsum (custom), transposed b", prodsum_combo, &u, 2, in2);
    nb_scope_end();
}
END_TEST

START_TEST(multi_integer_output_gets_null) {
    nb_tensor *a = leaf_of(NB_SHAPE(2, 2), PA), *b = leaf_of(NB_SHAPE(2, 2), PB);
    nb_tensor *in[2] = {a, b}, *out[3];
    multi_user u = {0};
    nb_scope_begin();
    OK_RC(nb_function_apply_multi(&PRODSUM, in, 2, out, 3, &u));
    ck_assert_int_eq(nb_dtype_of(out[2]), NB_I64);
    ck_assert(!nb_requires_grad(out[2]));
    ck_assert(nb_is_leaf(out[2]));
    expect_vals(out[2], 4, ((double[]){0, 0, 1, 0}), 0);
    OK_RC(nb_backward(OK(nb_add(nb_sum_all(out[0]), nb_sum_all(out[1])))));
    nb_scope_end();
    ck_assert_int_eq(u.backwards, 1);
    ck_assert(!u.gnull[0] && !u.gnull[1]);
    ck_assert(u.gnull[2]);
    double ga[4], gb[4];
    for (int i = 0; i < 4; i++) {
        ga[i] = PB[i] + 1;
        gb[i] = PA[i] + 1;
    }
    expect_vals(nb_grad(a), 4, ga, 0);
    expect_vals(nb_grad(b), 4, gb, 0);
    ck_assert_int_eq(u.destroyed, 1);
    nb_free(a);
    nb_free(b);
}
END_TEST

START_TEST(multi_non_differentiable_output) {
    nb_tensor *a = leaf_of(NB_SHAPE(2, 2), PA), *b = leaf_of(NB_SHAPE(2, 2), PB);
    nb_tensor *in[2] = {a, b}, *out[2];
    multi_user u = {.mark_out1 = true};
    usage start = usage_now();
    nb_scope_begin();
    OK_RC(nb_function_apply_multi(&PRODSUM, in, 2, out, 2, &u));
    ck_assert(nb_requires_grad(out[0]) && !nb_is_leaf(out[0]));
    ck_assert(!nb_requires_grad(out[1]));
    ck_assert(nb_is_leaf(out[1]));
    expect_error_rc(nb_backward(OK(nb_sum_all(out[1]))), "does not require grad");
    OK_RC(nb_backward(OK(nb_sum_all(out[0]))));
    ck_assert(!u.gnull[1] && u.gzero[1]); /* zeros for the marked output */
    nb_scope_end();
    ck_assert_int_eq(u.destroyed, 1);
    expect_vals(nb_grad(a), 4, PB, 0);
    expect_vals(nb_grad(b), 4, PA, 0);
    start = usage_now();

    /* every output marked (or no grad needed): no node, the ctx goes at once */
    nb_tensor *plain[2] = {OK(nb_detach(a)), OK(nb_detach(b))};
    u = (multi_user){0};
    nb_scope_begin();
    OK_RC(nb_function_apply_multi(&PRODSUM, plain, 2, out, 2, &u));
    ck_assert_int_eq(u.destroyed, 1);
    ck_assert(!nb_requires_grad(out[0]) && !nb_requires_grad(out[1]));
    nb_scope_end();
    /* errors: forward failing under anomaly mode, bad arguments: destroy once, outputs NULL */
    nb_set_detect_anomaly(true);
    u = (multi_user){.nan_out1 = true};
    nb_scope_begin();
    out[0] = out[1] = a;
    ck_assert_int_eq(nb_function_apply_multi(&PRODSUM, in, 2, out, 2, &u), -1);
    nb_set_detect_anomaly(false);
    expect_has(nb_last_error(),
               "prodsum: anomaly detected: the forward produced NaN at element 1");
    nb_clear_error();
    ck_assert_ptr_null(out[0]);
    ck_assert_ptr_null(out[1]);
    ck_assert_int_eq(u.destroyed, 1);
    u = (multi_user){0};
    ck_assert_int_eq(nb_function_apply_multi(&PRODSUM, in, 2, out, 0, &u), -1);
    expect_has(nb_last_error(), "nout >= 1");
    nb_clear_error();
    ck_assert_int_eq(u.destroyed, 1);
    nb_scope_end();
    nb_free(plain[0]);
    nb_free(plain[1]);
    expect_usage(start);
    nb_free(a);
    nb_free(b);
}
END_TEST

/* ============================================================ C. nb_gradcheck */
static nb_tensor *null_fn(nb_tensor **in, int n, void *ctx) {
    (void)in, (void)n, (void)ctx;
    nb_report_error("no output here");
    return NULL;
}

/* Fills a result with junk, so that "set" is seen. */
static void junk(nb_gradcheck_result *r) {
    memset(r, 0x5a, sizeof *r);
    r->message[sizeof r->message - 1] = 0;
}

/* An error: not ok, -1 everywhere, and the message is nb_last_error(). */
#define expect_error_result(r, part) expect_error_result_at(__LINE__, (r), (part))
static void expect_error_result_at(int line, const nb_gradcheck_result *r, const char *part) {
    ck_assert_msg(!r->ok, "test_function.c:%d: ok after an error", line);
    ck_assert_msg(r->message[0] != 0, "test_function.c:%d: empty message", line);
    ck_assert_msg(nb_last_error() && strcmp(r->message, nb_last_error()) == 0,
                  "test_function.c:%d: message \"%s\" is not nb_last_error() \"%s\"", line,
                  r->message, nb_last_error() ? nb_last_error() : "(null)");
    expect_has_at(line, r->message, part);
    ck_assert_msg(r->input == -1 && r->index == -1 && r->output_index == -1,
                  "test_function.c:%d: worst entry (%d, %lld, %lld) after an error", line,
                  r->input, (long long)r->index, (long long)r->output_index);
    nb_clear_error();
}

START_TEST(gradcheck_message_is_always_set) {
    applier good = {&SILU, NULL};
    silu_user bad_u = {.drop_term = true};
    applier bad = {&SILU_BAD, &bad_u};
    nb_tensor *x = rand_leaf(51, NB_SHAPE(3));
    nb_gradcheck_result r;

    junk(&r);
    ck_assert(nb_gradcheck(apply_fn, &good, 1, &x, NULL, &r));
    ck_assert(r.ok);
    ck_assert_msg(strncmp(r.message, "nb_gradcheck: first-order: ok", 29) == 0, "%s", r.message);
    ck_assert_int_eq(r.checked, 9);
    ck_assert_int_eq(r.mismatched, 0);
    ck_assert(fabs(r.analytic - r.numeric) == r.max_abs_err);
    ck_assert(r.max_abs_err < 1e-8);

    junk(&r);
    ck_assert(!nb_gradcheck(apply_fn, &bad, 1, &x, NULL, &r));
    ck_assert_msg(strncmp(r.message, "nb_gradcheck: first-order: MISMATCH", 35) == 0, "%s", r.message);
    ck_assert_str_eq(r.message, nb_last_error());
    nb_clear_error();

    junk(&r);
    ck_assert(!nb_gradcheck(apply_fn, &good, 0, &x, NULL, &r));
    expect_error_result(&r, "n = 0");

    nb_tensor *none[1] = {NULL};
    junk(&r);
    ck_assert(!nb_gradcheck(apply_fn, &good, 1, none, NULL, &r));
    expect_error_result(&r, "nb_gradcheck: input 0 is NULL");

    junk(&r);
    ck_assert(!nb_gradcheck(null_fn, NULL, 1, &x, NULL, &r));
    expect_has(r.message, "no output here"); /* the earlier error, quoted */
    expect_error_result(&r, "nb_gradcheck: the function returned NULL");

    nb_tensor *f = nb_set_requires_grad(OK(nb_ones(NB_F32, NB_SHAPE(3))), true);
    junk(&r);
    ck_assert(!nb_gradcheck(apply_fn, &good, 1, &f, NULL, &r));
    expect_error_result(&r, "input 0 is f32; finite differences need f64");

    /* a backward that fails: its own message, in the result too */
    mul_user mu = {.mode = BW_FAIL_MSG};
    applier failing = {&MUL_OP, &mu};
    nb_tensor *x2 = rand_leaf(54, NB_SHAPE(3)), *in[2] = {x, x2};
    junk(&r);
    ck_assert(!nb_gradcheck(apply_fn, &failing, 2, in, NULL, &r));
    expect_error_result(&r, "nb_backward: the backward of mul_op failed: boom");
    nb_free(x2);
    nb_free(f);
    nb_free(x);
}
END_TEST

START_TEST(gradcheck_catches_a_nondeterministic_backward) {
    silu_user u = {.jitter = 1e-9};
    applier a = {&SILU, &u};
    nb_tensor *x = rand_leaf(52, NB_SHAPE(3));
    nb_gradcheck_result r;
    ck_assert(!nb_gradcheck(apply_fn, &a, 1, &x, NULL, &r));
    expect_has(r.message, "nb_gradcheck: first-order: the same output gradient laid out contiguously, then transposed or strided, gave different gradients");
    expect_has(r.message, "or backward is not deterministic");
    expect_has(r.message, "nondet_tol 0");
    ck_assert_str_eq(r.message, nb_last_error());
    nb_clear_error();
    nb_gradcheck_opts o = NB_GRADCHECK_DEFAULTS;
    o.nondet_tol = 1e-6;
    ck_assert_msg(nb_gradcheck(apply_fn, &a, 1, &x, &o, &r), "%s", r.message);
    ck_assert(r.ok);
    ck_assert_int_ge(u.backwards, 6); /* twice per output element */
    nb_free(x);
}
END_TEST

/* |analytic - numeric| <= atol + rtol |numeric|: a gradient 5e-5 off
 * everywhere fails on the 6 off-diagonal entries of a (3) -> (3) Jacobian
 * (numeric 0: atol 1e-5 alone), not on the 3 diagonal ones (rtol 1e-3 of
 * about 0.5); with atol 1e-4 it passes. A gradient 0.4% too large fails on
 * the 3 diagonal entries (rtol 1e-3) and passes with rtol 1e-2. */
START_TEST(gradcheck_tolerance_is_atol_plus_rtol) {
    silu_user u = {.bias = 5e-5};
    applier a = {&SILU, &u};
    nb_tensor *x = leaf_of(NB_SHAPE(3), ((double[]){-0.5, 0.25, 1.0}));
    nb_gradcheck_result r;
    ck_assert(!nb_gradcheck(apply_fn, &a, 1, &x, NULL, &r));
    ck_assert_int_eq(r.checked, 9);
    ck_assert_int_eq(r.mismatched, 6);
    ck_assert_double_eq_tol(r.max_abs_err, 5e-5, 1e-8);
    nb_clear_error();
    nb_gradcheck_opts o = NB_GRADCHECK_DEFAULTS;
    o.atol = 1e-4;
    ck_assert_msg(nb_gradcheck(apply_fn, &a, 1, &x, &o, &r), "%s", r.message);
    ck_assert_int_eq(r.mismatched, 0);
    silu_user scaled = {.scale = 1.004};
    applier b = {&SILU, &scaled};
    ck_assert(!nb_gradcheck(apply_fn, &b, 1, &x, NULL, &r));
    ck_assert_int_eq(r.mismatched, 3);
    ck_assert_int_eq(r.index, r.output_index);
    nb_clear_error();
    o = (nb_gradcheck_opts)NB_GRADCHECK_DEFAULTS;
    o.rtol = 1e-2;
    ck_assert_msg(nb_gradcheck(apply_fn, &b, 1, &x, &o, &r), "%s", r.message);
    nb_free(x);
}
END_TEST

static nb_tensor *flips_fn(nb_tensor **in, int n, void *ctx) {
    (void)n, (void)ctx;
    nb_set_requires_grad(in[1], true);
    return nb_mul(in[0], in[1]);
}
static nb_tensor *mul_fn(nb_tensor **in, int n, void *ctx) {
    (void)n, (void)ctx;
    return nb_mul(in[0], in[1]);
}

START_TEST(gradcheck_no_grad_input_must_get_no_gradient) {
    nb_tensor *x = rand_leaf(53, NB_SHAPE(3)), *c = OK(nb_full(NB_F64, NB_SHAPE(3), 1.5));
    nb_tensor *in[2] = {x, c};
    expect_gradcheck("nb_mul, second input without grad", mul_fn, NULL, 2, in);
    ck_assert_ptr_null(nb_grad(c));
    nb_gradcheck_result r;
    /* a function that turns requires_grad on for an input is caught at once,
     * and the flag is put back */
    ck_assert(!nb_gradcheck(flips_fn, NULL, 2, in, NULL, &r));
    expect_has(r.message, "nb_gradcheck: the function changed requires_grad of input 1 (turned "
                          "it on); it must leave its inputs as they are");
    ck_assert_str_eq(r.message, nb_last_error());
    nb_clear_error();
    ck_assert(!nb_requires_grad(c));
    ck_assert_ptr_null(nb_grad(c));
    ck_assert_ptr_null(nb_grad(x)); /* x's .grad restored (it had none) */
    nb_free(x);
    nb_free(c);
}
END_TEST

START_TEST(gradcheck_fast_mode) {
    applier good = {&SILU, NULL}, good_w = {&SILU_W, NULL};
    nb_tensor *x = rand_leaf(61, NB_SHAPE(100, 100));
    nb_tensor *w = rand_leaf(62, NB_SHAPE(100));
    nb_gradcheck_result r;
    /* full mode refuses a 10,000 x 10,000 Jacobian */
    ck_assert(!nb_gradcheck(apply_fn, &good, 1, &x, NULL, &r));
    expect_has(r.message, "too large for a full Jacobian");
    expect_has(r.message, "fast_mode");
    nb_clear_error();

    nb_gradcheck_opts o = NB_GRADCHECK_DEFAULTS;
    o.fast_mode = true;
    ck_assert_msg(nb_gradcheck(apply_fn, &good, 1, &x, &o, &r), "%s", r.message);
    ck_assert(r.ok);
    ck_assert_msg(strncmp(r.message, "nb_gradcheck: first-order: ok", 29) == 0, "%s", r.message);
    ck_assert_int_eq(r.checked, 1); /* fast_probes 0 means 1 */
    ck_assert_int_eq(r.index, -1);
    ck_assert_int_eq(r.output_index, -1);
    ck_assert_int_eq(r.input, 0);

    o.fast_probes = 3;
    nb_tensor *in[2] = {x, w};
    ck_assert_msg(nb_gradcheck(apply_fn, &good_w, 2, in, &o, &r), "%s", r.message);
    ck_assert_int_eq(r.checked, 3 * 2);
    ck_assert_int_eq(r.index, -1);
    ck_assert_int_eq(r.output_index, -1);
    nb_set_requires_grad(w, false);
    ck_assert_msg(nb_gradcheck(apply_fn, &good_w, 2, in, &o, &r), "%s", r.message);
    ck_assert_int_eq(r.checked, 3 * 1);
    ck_assert_int_eq(r.input, 0);
    nb_set_requires_grad(w, true);

    /* a systematic error: the gradient 10% too large */
    silu_user scaled = {.scale = 1.1};
    applier wrong = {&SILU, &scaled};
    ck_assert(!nb_gradcheck(apply_fn, &wrong, 1, &x, &o, &r));
    ck_assert(!r.ok);
    ck_assert_msg(strncmp(r.message, "nb_gradcheck: first-order: MISMATCH", 35) == 0, "%s", r.message);
    expect_has(r.message, "projection");
    ck_assert_str_eq(r.message, nb_last_error());
    nb_clear_error();
    ck_assert_int_gt(r.mismatched, 0);
    ck_assert_int_eq(r.checked, 3);
    ck_assert_int_eq(r.index, -1);
    ck_assert_int_eq(r.output_index, -1);
    ck_assert(fabs(r.analytic - r.numeric) == r.max_abs_err);
    ck_assert_msg(fabs(r.analytic - 1.1 * r.numeric) <= 1e-6 * fabs(r.numeric),
                  "analytic %.17g is not 1.1 x numeric %.17g", r.analytic, r.numeric);
    silu_user scaled_w = {.scale = 1.1};
    applier wrong_w = {&SILU_W, &scaled_w};
    ck_assert(!nb_gradcheck(apply_fn, &wrong_w, 2, in, &o, &r));
    ck_assert_int_eq(r.input, 0); /* only x's gradient is scaled */
    nb_clear_error();

    /* the same seed gives the same result; another seed other probes */
    nb_gradcheck_result r1, r2, r3;
    o.seed = 1234;
    ck_assert(nb_gradcheck(apply_fn, &good_w, 2, in, &o, &r1));
    ck_assert(nb_gradcheck(apply_fn, &good_w, 2, in, &o, &r2));
    ck_assert_str_eq(r1.message, r2.message);
    ck_assert(memcmp(&r1.analytic, &r2.analytic, sizeof(double)) == 0);
    ck_assert(memcmp(&r1.numeric, &r2.numeric, sizeof(double)) == 0);
    ck_assert(memcmp(&r1.max_abs_err, &r2.max_abs_err, sizeof(double)) == 0);
    ck_assert_int_eq(r1.input, r2.input);
    ck_assert_int_eq(r1.checked, r2.checked);
    o.seed = 1235;
    ck_assert(nb_gradcheck(apply_fn, &good_w, 2, in, &o, &r3));
    ck_assert(r3.analytic != r1.analytic);
    nb_free(x);
    nb_free(w);
}
END_TEST

START_TEST(gradcheck_restores_inputs) {
    nb_scope_begin();
    nb_tensor *x = transposed_leaf(71, NB_SHAPE(3, 4), 0, 1), *w = rand_leaf(72, NB_SHAPE(4));
    nb_tensor *in[2] = {x, w};
    nb_scope_begin(); /* x gets a .grad first, w none */
    OK_RC(nb_backward(OK(nb_sum_all(OK(nb_function_apply(&SILU, &x, 1, NULL))))));
    nb_scope_end();
    nb_tensor *gx = nb_grad(x);
    ck_assert_ptr_nonnull(gx);
    double *xv = values(x), *wv = values(w), *gv = values(gx);
    silu_user bad_u = {.scale = 1.5};
    applier good = {&SILU_W, NULL}, bad = {&SILU_W, &bad_u};
    nb_gradcheck_opts fast = NB_GRADCHECK_DEFAULTS;
    fast.fast_mode = true;
    for (int k = 0; k < 4; k++) {
        bool want = k % 2 == 0;
        bool got = nb_gradcheck(apply_fn, k % 2 ? &bad : &good, 2, in, k < 2 ? NULL : &fast, NULL);
        ck_assert_msg(got == want, "case %d: %s", k, nb_last_error() ? nb_last_error() : "");
        nb_clear_error();
        double *xa = values(x), *wa = values(w), *ga = values(gx);
        bool same = same_bits(xa, xv, 12) && same_bits(wa, wv, 4) && same_bits(ga, gv, 12);
        free(xa);
        free(wa);
        free(ga);
        ck_assert_msg(same, "case %d: values or .grad changed", k);
        ck_assert_ptr_eq(nb_grad(x), gx);
        ck_assert_ptr_null(nb_grad(w));
        ck_assert(nb_requires_grad(x) && nb_requires_grad(w));
    }
    free(xv);
    free(wv);
    free(gv);
    nb_scope_end();
}
END_TEST

/* --------------------------------------------- gradcheck fed NaNs and layouts */
/* y = x^2 elementwise (f64, 1-d), made wrong at entry (x1, y1) in three ways
 * that nb_gradcheck must each fail, as PyTorch's allclose with
 * equal_nan=False does: a NaN in the analytic Jacobian (the backward), in
 * the numeric one (a forward that gives NaN only once x1 has moved off its
 * starting value, i.e. under the finite-difference perturbation), or in both. */
typedef struct {
    bool nan_backward;  /* d y1 / d x1 is NaN */
    bool nan_perturbed; /* y1 is NaN whenever x1 is not x1_at_start */
    double x1_at_start;
} sq_user;

static nb_tensor *sq_forward(nb_function_ctx *ctx, nb_tensor **in, int n, void *user) {
    (void)n;
    const sq_user *u = user;
    nb_tensor *x = nb_contiguous(in[0]);
    nb_tensor *y = x ? nb_empty(NB_F64, nb_ndim(x), nb_shape(x)) : NULL;
    if (!y || nb_function_save(ctx, x) != 0) return NULL;
    const double *px = nb_data(x);
    double *py = nb_data(y);
    for (int64_t i = 0; i < nb_numel(x); i++) py[i] = px[i] * px[i];
    if (u->nan_perturbed && px[1] != u->x1_at_start) py[1] = NAN;
    return y;
}

static int sq_backward(nb_function_ctx *ctx, nb_tensor *gy, nb_tensor **gin, void *user) {
    const sq_user *u = user;
    nb_tensor *x = nb_function_saved(ctx, 0), *g = nb_contiguous(gy);
    nb_tensor *gx = x ? nb_empty(NB_F64, nb_ndim(x), nb_shape(x)) : NULL;
    if (!g || !gx) return -1;
    const double *px = nb_data(x), *pg = nb_data(g);
    double *pgx = nb_data(gx);
    for (int64_t i = 0; i < nb_numel(x); i++) pgx[i] = 2 * px[i] * pg[i];
    if (u->nan_backward && pg[1] != 0) pgx[1] = NAN; /* row 1 of the Jacobian only */
    gin[0] = gx;
    return 0;
}

static const nb_function SQ = {.name = "sq", .forward = sq_forward, .backward = sq_backward};

/* Full mode: exactly entry (x1, y1) mismatched, named in the message. */
static void expect_nan_mismatch(const char *what, sq_user *u, nb_tensor *x, bool nan_a,
                                bool nan_n) {
    applier a = {&SQ, u};
    nb_gradcheck_result r;
    bool ok = nb_gradcheck(apply_fn, &a, 1, &x, NULL, &r);
    ck_assert_msg(!ok && !r.ok, "%s: nb_gradcheck passed: %s", what, r.message);
    expect_has(r.message, "MISMATCH");
    expect_has(r.message, "1 of 9 entries outside tolerance");
    expect_has(r.message, "input 0 at (1) (flat 1), output element 1");
    ck_assert_str_eq(r.message, nb_last_error());
    nb_clear_error();
    ck_assert_int_eq(r.mismatched, 1);
    ck_assert_int_eq(r.input, 0);
    ck_assert_int_eq(r.index, 1);
    ck_assert_int_eq(r.output_index, 1);
    ck_assert_msg(isnan(r.analytic) == nan_a && isnan(r.numeric) == nan_n,
                  "%s: analytic %g, numeric %g", what, r.analytic, r.numeric);
    ck_assert(isnan(r.max_abs_err));
    if (!nan_a) ck_assert_double_eq_tol(r.analytic, -2.5, 1e-12); /* 2 x1 */
    if (!nan_n) ck_assert_double_eq_tol(r.numeric, -2.5, 1e-6);
}

START_TEST(gradcheck_fails_on_nan) {
    nb_tensor *x = leaf_of(NB_SHAPE(3), ((double[]){0.5, -1.25, 2.0}));
    sq_user good = {.x1_at_start = -1.25};
    expect_gradcheck("sq (custom, x^2)", apply_fn, &((applier){&SQ, &good}), 1, &x);
    sq_user analytic = {.nan_backward = true, .x1_at_start = -1.25};
    expect_nan_mismatch("NaN in the backward", &analytic, x, true, false);
    sq_user numeric = {.nan_perturbed = true, .x1_at_start = -1.25};
    expect_nan_mismatch("NaN in the forward under perturbation", &numeric, x, false, true);
    sq_user both = {.nan_backward = true, .nan_perturbed = true, .x1_at_start = -1.25};
    expect_nan_mismatch("NaN on both sides", &both, x, true, true);
    /* fast mode too: a NaN in a projection is a mismatch */
    nb_gradcheck_opts o = NB_GRADCHECK_DEFAULTS;
    o.fast_mode = true;
    o.fast_probes = 2;
    sq_user *modes[3] = {&analytic, &numeric, &both};
    for (int k = 0; k < 3; k++) {
        nb_gradcheck_result r;
        ck_assert_msg(!nb_gradcheck(apply_fn, &((applier){&SQ, modes[k]}), 1, &x, &o, &r),
                      "fast mode, case %d: passed: %s", k, r.message);
        expect_has(r.message, "MISMATCH");
        expect_has(r.message, "projection");
        ck_assert_int_eq(r.mismatched, 2);
        nb_clear_error();
    }
    ck_assert_msg(nb_gradcheck(apply_fn, &((applier){&SQ, &good}), 1, &x, &o, NULL), "%s",
                  nb_last_error());
    nb_free(x);
}
END_TEST

/* y = x * w, w = 1, 2, 3, ... in row-major order, and backwards that read
 * the upstream gradient wrongly through nb_data, as a kernel written for
 * one layout does: RAMP_RAW as if it were contiguous (strides ignored),
 * RAMP_ZERO_AS_ONE through its strides but taking a stride of 0 for 1 (as
 * code that guards a loop step might), right for every layout but an
 * expanded one. Past the elements the gradient's view spans they read
 * zeros, where a real kernel would read past the buffer: the test stays
 * memory safe. */
static nb_tensor *ramp_forward(nb_function_ctx *ctx, nb_tensor **in, int n, void *user) {
    (void)n, (void)user, (void)ctx;
    nb_tensor *x = nb_contiguous(in[0]);
    nb_tensor *y = x ? nb_empty(NB_F64, nb_ndim(x), nb_shape(x)) : NULL;
    if (!y) return NULL;
    const double *px = nb_data(x);
    double *py = nb_data(y);
    for (int64_t i = 0; i < nb_numel(x); i++) py[i] = px[i] * (double)(i + 1);
    return y;
}

static int ramp_backward(nb_function_ctx *ctx, nb_tensor *gy, nb_tensor **gin, void *user) {
    (void)ctx, (void)user;
    nb_tensor *g = nb_contiguous(gy), *gx = g ? nb_empty(NB_F64, nb_ndim(g), nb_shape(g)) : NULL;
    if (!gx) return -1;
    const double *pg = nb_data(g);
    double *pgx = nb_data(gx);
    for (int64_t i = 0; i < nb_numel(g); i++) pgx[i] = pg[i] * (double)(i + 1);
    gin[0] = gx;
    return 0;
}

typedef enum { AS_CONTIGUOUS, ZERO_STRIDE_AS_ONE } misread;

static int ramp_backward_misread(nb_tensor *gy, nb_tensor **gin, misread how) {
    int nd = nb_ndim(gy);
    const int64_t *sh = nb_shape(gy), *st = nb_strides(gy);
    int64_t span = 1; /* elements from the first to the last one the view reaches */
    for (int d = 0; d < nd; d++) span += (sh[d] - 1) * st[d];
    nb_tensor *gx = nb_empty(NB_F64, nd, sh);
    if (!gx) return -1;
    const double *pg = nb_data(gy);
    double *pgx = nb_data(gx);
    for (int64_t i = 0; i < nb_numel(gy); i++) {
        int64_t at = i; /* AS_CONTIGUOUS */
        if (how == ZERO_STRIDE_AS_ONE) {
            at = 0;
            for (int64_t d = nd - 1, rest = i; d >= 0; rest /= sh[d], d--)
                at += rest % sh[d] * (st[d] ? st[d] : 1);
        }
        pgx[i] = (at < span ? pg[at] : 0) * (double)(i + 1);
    }
    gin[0] = gx;
    return 0;
}
static int ramp_backward_raw(nb_function_ctx *ctx, nb_tensor *gy, nb_tensor **gin, void *user) {
    (void)ctx, (void)user;
    return ramp_backward_misread(gy, gin, AS_CONTIGUOUS);
}
static int ramp_backward_zero_as_one(nb_function_ctx *ctx, nb_tensor *gy, nb_tensor **gin,
                                     void *user) {
    (void)ctx, (void)user;
    return ramp_backward_misread(gy, gin, ZERO_STRIDE_AS_ONE);
}

static const nb_function RAMP = {.name = "ramp", .forward = ramp_forward,
                                 .backward = ramp_backward};
static const nb_function RAMP_RAW = {.name = "ramp_raw", .forward = ramp_forward,
                                     .backward = ramp_backward_raw};
static const nb_function RAMP_ZERO_AS_ONE = {.name = "ramp_zero_as_one", .forward = ramp_forward,
                                             .backward = ramp_backward_zero_as_one};

/* The layouts nb_gradcheck hands a rule: the same output gradient laid out
 * contiguously, then transposed (two dims or more of more than one element)
 * or strided (one such dim: (6), (1, 4)), must give the
 * same gradients; a gradient of ones read through stride 0 must give the
 * Jacobian's row sums. Each misreading rule is caught, by the layout that
 * exposes it, and the rule reading through its strides passes. */
START_TEST(gradcheck_catches_a_rule_that_ignores_strides) {
    static const char *const other_layout = "laid out contiguously, then transposed or strided, gave different gradients";
    static const char *const stride0 = "backward from an output gradient of ones read through "
                                       "stride 0 gave";
    const struct {
        const nb_function *f;
        int ndim;
        int64_t shape[2];
        const char *says;
    } cases[] = {
        {&RAMP_RAW, 2, {2, 3}, other_layout},
        {&RAMP_RAW, 1, {6, 0}, other_layout},
        {&RAMP_RAW, 2, {1, 4}, other_layout}, /* a (1, n) gradient reversed reads as contiguous */
        {&RAMP_ZERO_AS_ONE, 2, {2, 3}, stride0},
        {&RAMP_ZERO_AS_ONE, 1, {6, 0}, stride0},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        nb_tensor *x = rand_leaf(80 + k, cases[k].ndim, cases[k].shape);
        nb_gradcheck_result r;
        ck_assert_msg(!nb_gradcheck(apply_fn, &((applier){cases[k].f, NULL}), 1, &x, NULL, &r),
                      "case %zu passed: %s", k, r.message);
        expect_has(r.message, "nb_gradcheck: first-order");
        expect_has(r.message, cases[k].says);
        ck_assert_str_eq(r.message, nb_last_error());
        nb_clear_error();
        nb_tensor *in[1] = {x};
        expect_gradcheck("ramp (custom, strides read)", apply_fn, &((applier){&RAMP, NULL}), 1,
                         in);
        nb_free(x);
    }
}
END_TEST

Suite *suite_function(void) {
    Suite *s = suite_create("function");
    TCase *tc = tcase_create("single");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, silu_values_and_gradients_f64);
    tcase_add_test(tc, silu_values_and_gradients_f32);
    tcase_add_test(tc, silu_passes_gradcheck);
    tcase_add_test(tc, wrong_backward_is_rejected);
    tcase_add_test(tc, saved_tensors_reach_backward);
    tcase_add_test(tc, saved_tensor_modified_in_place_is_caught);
    tcase_add_test(tc, backward_errors_name_the_function);
    tcase_add_test(tc, forward_errors_name_the_function);
    tcase_add_test(tc, failure_after_a_cleared_error_says_nothing_was_reported);
    tcase_add_test(tc, long_function_names_are_kept_whole);
    tcase_add_test(tc, anomaly_mode_names_the_function);
    tcase_add_test(tc, destroy_runs_once_per_apply);
    tcase_add_test(tc, apply_outside_a_scope_leaks_nothing);
    tcase_add_test(tc, needs_input_grad_follows_requires_grad);
    tcase_add_test(tc, non_differentiable_output_has_no_graph);
    tcase_add_test(tc, repeated_and_many_inputs);
    tcase_add_test(tc, backward_twice_needs_retain_graph);
    tcase_add_test(tc, saved_tensors_are_freed_after_backward);
    tcase_add_test(tc, builtin_saved_output_is_freed_after_backward);
    tcase_add_test(tc, threads_match_a_single_thread);
    suite_add_tcase(s, tc);
    TCase *mc = tcase_create("multi");
    tcase_set_timeout(mc, 60);
    tcase_add_test(mc, multi_gradients_from_both_outputs);
    tcase_add_test(mc, multi_unused_output_gets_zeros);
    tcase_add_test(mc, multi_passes_gradcheck);
    tcase_add_test(mc, multi_integer_output_gets_null);
    tcase_add_test(mc, multi_non_differentiable_output);
    suite_add_tcase(s, mc);
    TCase *gc = tcase_create("gradcheck");
    tcase_set_timeout(gc, 60);
    tcase_add_test(gc, gradcheck_message_is_always_set);
    tcase_add_test(gc, gradcheck_catches_a_nondeterministic_backward);
    tcase_add_test(gc, gradcheck_tolerance_is_atol_plus_rtol);
    tcase_add_test(gc, gradcheck_no_grad_input_must_get_no_gradient);
    tcase_add_test(gc, gradcheck_fast_mode);
    tcase_add_test(gc, gradcheck_restores_inputs);
    tcase_add_test(gc, gradcheck_fails_on_nan);
    tcase_add_test(gc, gradcheck_catches_a_rule_that_ignores_strides);
    suite_add_tcase(s, gc);
    return s;
}
