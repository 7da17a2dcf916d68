/* test_softmax.c: nb_softmax, nb_log_softmax, nb_masked_fill, nb_dropout.
 *
 * Values and gradients against PyTorch (fixtures/softmax.txt, written by
 * fixtures/gen_softmax.py), the all -inf convention (zeros, zero gradient),
 * gradcheck in f64 on contiguous, transposed and broadcast inputs, dropout's
 * statistics and determinism, and the error messages. */
#include "test_util.h"

#include <float.h>
#include <stdlib.h>

#include "ops/vmath.h" /* nbi_vmath_path: each instruction-set path of the f32 exp */

static const char *FX = "softmax.txt";

/* ------------------------------------------------------------- helpers */
/* A leaf with its own storage and t's values (dtype may change). */
static nb_tensor *copy_as(nb_tensor *t, nb_dtype dt) {
    nb_tensor *x = nb_empty(dt, nb_ndim(t), nb_shape(t));
    ck_assert_msg(x != NULL, "%s", nb_last_error());
    ck_assert_msg(nb_copy_into(x, t) == 0, "%s", nb_last_error());
    return x;
}

static nb_tensor *leaf_of(nb_tensor *t) {
    return nb_set_requires_grad(copy_as(t, nb_dtype_of(t)), true);
}

/* The same values as t in a non-contiguous layout (all dims reversed in
 * memory), as a view with no history. */
static nb_tensor *noncontig_copy(nb_tensor *t) {
    int nd = nb_ndim(t), rev[NB_MAX_DIMS];
    for (int i = 0; i < nd; i++) rev[i] = nd - 1 - i;
    nb_tensor *buf = copy_as(nb_permute(t, nd, rev), nb_dtype_of(t));
    nb_tensor *v = nb_permute(buf, nd, rev);
    ck_assert_msg(v != NULL, "%s", nb_last_error());
    ck_assert(!nb_is_contiguous(v));
    return v;
}

static void expect_identical(const nb_tensor *a, const nb_tensor *b) {
    ck_assert_int_eq(nb_numel(a), nb_numel(b));
    double *x = values(a), *y = values(b);
    int64_t n = nb_numel(a);
    int64_t bad = -1;
    for (int64_t i = 0; i < n && bad < 0; i++)
        if (memcmp(&x[i], &y[i], sizeof x[i]) != 0) bad = i;
    double xb = bad >= 0 ? x[bad] : 0, yb = bad >= 0 ? y[bad] : 0;
    free(x);
    free(y);
    ck_assert_msg(bad < 0, "element %lld differs: %.17g vs %.17g", (long long)bad, xb, yb);
}

typedef nb_tensor *(*dim_op)(nb_tensor *, int);

/* ------------------------------------------------ softmax vs PyTorch */
static void softmax_case(const char *op, dim_op f, const char *in, int dim, const char *dt,
                         double atol, double rtol) {
    char xn[64], wn[64], yn[96], gn[96], tag[8];
    snprintf(tag, sizeof tag, dim >= 0 ? "d%d" : "dm%d", dim >= 0 ? dim : -dim);
    snprintf(xn, sizeof xn, "x_%s_%s", in, dt);
    snprintf(wn, sizeof wn, "w_%s_%s", in, dt);
    snprintf(yn, sizeof yn, "%s_%s_%s_%s", op, in, tag, dt);
    snprintf(gn, sizeof gn, "%s_grad_%s_%s_%s", op, in, tag, dt);
    nb_tensor *x = fx(FX, xn), *w = fx(FX, wn), *want = fx(FX, yn), *gwant = fx(FX, gn);
    int64_t live = nb_live_tensors();
    nb_scope_begin();
    nb_tensor *xl = leaf_of(x);
    nb_tensor *y = f(xl, dim);
    expect_close(y, want, atol, rtol);
    ck_assert(nb_is_contiguous(y));
    ck_assert_msg(nb_backward_with_grad(y, w) == 0, "%s", nb_last_error());
    expect_close(nb_grad(xl), gwant, atol, rtol);
    /* read in place through other strides: bitwise the same result */
    nb_tensor *y2 = f(noncontig_copy(x), dim);
    expect_identical(y2, y);
    nb_scope_end();
    ck_assert_int_eq(nb_live_tensors(), live);
}

static void softmax_all_cases(const char *dt, double atol, double rtol) {
    const char *ins[] = {"base", "big", "ninf"};
    const int dims[] = {0, 1, -1};
    for (int i = 0; i < 3; i++)
        for (int d = 0; d < 3; d++) {
            softmax_case("softmax", nb_softmax, ins[i], dims[d], dt, atol, rtol);
            softmax_case("log_softmax", nb_log_softmax, ins[i], dims[d], dt, atol, rtol);
        }
}

START_TEST(test_softmax_values_f64) { softmax_all_cases("f64", 1e-12, 1e-10); }
END_TEST

START_TEST(test_softmax_values_f32) { softmax_all_cases("f32", 1e-6, 1e-6); }
END_TEST

START_TEST(test_softmax_small_shapes) {
    nb_scope_begin();
    nb_tensor *s = nb_scalar(NB_F64, 3.5);
    ck_assert(nb_item(nb_softmax(s, 0)) == 1.0);
    ck_assert(nb_item(nb_softmax(s, -1)) == 1.0);
    ck_assert(nb_item(nb_log_softmax(s, 0)) == 0.0);
    ck_assert_int_eq(nb_ndim(nb_softmax(s, 0)), 0);
    nb_tensor *e = nb_zeros(NB_F32, NB_SHAPE(0, 3));
    for (int d = -2; d < 2; d++) {
        nb_tensor *y = nb_softmax(e, d);
        ck_assert_msg(y != NULL, "%s", nb_last_error());
        ck_assert_int_eq(nb_numel(y), 0);
        ck_assert_int_eq(nb_shape(y)[0], 0);
        ck_assert_int_eq(nb_shape(y)[1], 3);
        ck_assert(nb_log_softmax(e, d) != NULL);
    }
    /* a 1-element slice: softmax 1, log_softmax 0, zero gradient */
    nb_tensor *x = nb_set_requires_grad(nb_full(NB_F64, NB_SHAPE(3, 1), 7.0), true);
    nb_tensor *y = nb_log_softmax(x, 1);
    ck_assert(nb_backward_with_grad(y, nb_full(NB_F64, NB_SHAPE(3, 1), 2.0)) == 0);
    for (int64_t i = 0; i < 3; i++) ck_assert(nb_item(nb_select(nb_grad(x), 0, i)) == 0.0);
    nb_scope_end();
}
END_TEST

/* ------------------------------------------------ the all -inf convention */
/* Row 1 is all -inf (a dim -1 slice), column 2 is all -inf (a dim 0 slice). */
static void all_ninf_case(dim_op f, const char *name, nb_dtype dt, int dim) {
    const double I = -INFINITY;
    const double v[9] = {1, 2, I, I, I, I, I, 0.5, I};
    const double gv[9] = {0.3, -1.5, 2.0, 1e3, -7.0, 0.25, 4.0, -0.5, 9.0};
    int64_t live = nb_live_tensors();
    nb_scope_begin();
    nb_tensor *x = nb_set_requires_grad(copy_as(nb_from_data(NB_F64, NB_SHAPE(3, 3), v), dt),
                                        true);
    nb_tensor *g = copy_as(nb_from_data(NB_F64, NB_SHAPE(3, 3), gv), dt);
    nb_tensor *y = f(x, dim);
    ck_assert_msg(y != NULL, "%s", nb_last_error());
    ck_assert_msg(nb_backward_with_grad(y, g) == 0, "%s", nb_last_error());
    double *yv = values(y), *gi = values(nb_grad(x));
    for (int r = 0; r < 3; r++)
        for (int c = 0; c < 3; c++) {
            int k = 3 * r + c;
            bool dead = dim == 1 ? r == 1 : c == 2; /* the all -inf slice */
            ck_assert_msg(!isnan(yv[k]) && !isnan(gi[k]), "%s %s dim %d: NaN at (%d,%d)", name,
                          nb_dtype_name(dt), dim, r, c);
            if (dead) {
                ck_assert_msg(yv[k] == 0.0 && !signbit(yv[k]), "%s %s dim %d: y(%d,%d) = %g, "
                              "expected +0", name, nb_dtype_name(dt), dim, r, c, yv[k]);
                ck_assert_msg(gi[k] == 0.0 && !signbit(gi[k]), "%s %s dim %d: grad(%d,%d) = %g,"
                              " expected +0", name, nb_dtype_name(dt), dim, r, c, gi[k]);
            }
        }
    free(yv);
    free(gi);
    nb_scope_end();
    ck_assert_int_eq(nb_live_tensors(), live);
}

START_TEST(test_all_ninf_slice) {
    nb_dtype dts[2] = {NB_F64, NB_F32};
    for (int i = 0; i < 2; i++)
        for (int dim = 0; dim < 2; dim++) {
            all_ninf_case(nb_softmax, "nb_softmax", dts[i], dim);
            all_ninf_case(nb_log_softmax, "nb_log_softmax", dts[i], dim);
        }
    /* the other rows are what PyTorch gives: softmax of (1, 2, -inf) */
    nb_scope_begin();
    nb_tensor *x = nb_from_data(NB_F64, NB_SHAPE(3), (double[]){1, 2, -INFINITY});
    nb_tensor *y = nb_softmax(x, 0), *l = nb_log_softmax(x, 0);
    double e = 1 / (1 + exp(1.0));
    ck_assert(fabs(nb_item(nb_select(y, 0, 0)) - e) < 1e-15);
    ck_assert(nb_item(nb_select(y, 0, 2)) == 0.0);
    ck_assert(nb_item(nb_select(l, 0, 2)) == -INFINITY);
    nb_scope_end();
}
END_TEST

/* A fully padded attention row: masked_fill(-inf) then softmax gives zero
 * weights and zero gradient to every score of that row. */
START_TEST(test_fully_masked_attention_row) {
    nb_scope_begin();
    nb_tensor *s = rand_leaf(5, NB_SHAPE(2, 3));
    bool fill[6] = {false, true, false, true, true, true}; /* row 1 all masked */
    nb_tensor *m = nb_from_data(NB_BOOL, NB_SHAPE(2, 3), fill);
    nb_tensor *y = nb_softmax(nb_masked_fill(s, m, -INFINITY), -1);
    ck_assert_msg(nb_backward_with_grad(y, nb_ones(NB_F64, NB_SHAPE(2, 3))) == 0, "%s",
                  nb_last_error());
    double *yv = values(y), *gv = values(nb_grad(s));
    for (int k = 3; k < 6; k++) ck_assert(yv[k] == 0.0 && gv[k] == 0.0);
    ck_assert(fabs(yv[0] + yv[2] - 1.0) < 1e-15 && yv[1] == 0.0);
    free(yv);
    free(gv);
    nb_scope_end();
}
END_TEST

/* ------------------------------------------------ masked_fill vs PyTorch */
START_TEST(test_masked_fill_values) {
    const char *masks[] = {"pad", "causal", "both"};
    const char *vnames[] = {"ninf", "half"};
    const double vals[] = {-INFINITY, 0.5};
    const char *dts[] = {"f64", "f32"};
    char n1[64], n2[64], n3[64], n4[64], n5[64];
    for (int m = 0; m < 3; m++)
        for (int v = 0; v < 2; v++)
            for (int d = 0; d < 2; d++) {
                snprintf(n1, sizeof n1, "mf_scores_%s", dts[d]);
                snprintf(n2, sizeof n2, "fill_%s", masks[m]);
                snprintf(n3, sizeof n3, "mf_w_%s", dts[d]);
                snprintf(n4, sizeof n4, "mf_%s_%s_%s", masks[m], vnames[v], dts[d]);
                snprintf(n5, sizeof n5, "mf_grad_%s_%s_%s", masks[m], vnames[v], dts[d]);
                nb_tensor *s = fx(FX, n1), *fill = fx(FX, n2), *w = fx(FX, n3);
                nb_tensor *want = fx(FX, n4), *gwant = fx(FX, n5);
                int64_t live = nb_live_tensors();
                nb_scope_begin();
                nb_tensor *sl = leaf_of(s);
                nb_tensor *y = nb_masked_fill(sl, fill, vals[v]);
                expect_close(y, want, 0, 0);
                ck_assert_msg(nb_backward_with_grad(y, w) == 0, "%s", nb_last_error());
                expect_close(nb_grad(sl), gwant, 0, 0);
                /* strided t and strided mask read in place */
                expect_identical(nb_masked_fill(noncontig_copy(s), noncontig_copy(fill), vals[v]),
                                 y);
                nb_scope_end();
                ck_assert_int_eq(nb_live_tensors(), live);
            }
}
END_TEST

START_TEST(test_attention_weights_values) {
    const char *masks[] = {"pad", "causal", "both"};
    char n2[64], n4[64], n5[64];
    nb_tensor *s = fx(FX, "mf_scores_f64"), *w = fx(FX, "mf_w_f64");
    for (int m = 0; m < 3; m++) {
        snprintf(n2, sizeof n2, "fill_%s", masks[m]);
        snprintf(n4, sizeof n4, "attn_%s_f64", masks[m]);
        snprintf(n5, sizeof n5, "attn_grad_%s_f64", masks[m]);
        nb_tensor *fill = fx(FX, n2), *want = fx(FX, n4), *gwant = fx(FX, n5);
        nb_scope_begin();
        nb_tensor *sl = leaf_of(s);
        nb_tensor *y = nb_softmax(nb_masked_fill(sl, fill, -INFINITY), -1);
        expect_close(y, want, 1e-12, 1e-10);
        ck_assert_msg(nb_backward_with_grad(y, w) == 0, "%s", nb_last_error());
        expect_close(nb_grad(sl), gwant, 1e-12, 1e-10);
        /* keep-mask form, as nb_attention uses it: fill where !keep */
        snprintf(n2, sizeof n2, "mask_%s", masks[m]);
        nb_scope_end();
        nb_tensor *keep = fx(FX, n2);
        nb_scope_begin();
        nb_tensor *y2 = nb_softmax(nb_masked_fill(s, nb_logical_not(keep), -INFINITY), -1);
        expect_close(y2, want, 1e-12, 1e-10);
        nb_scope_end();
    }
}
END_TEST

/* A mask with more dims than t: the result has the broadcast shape and the
 * gradient is summed back to t's shape (torch does the same). */
START_TEST(test_masked_fill_mask_bigger_than_t) {
    nb_tensor *t = fx(FX, "mf_small_f64"), *fill = fx(FX, "fill_both");
    nb_tensor *w = fx(FX, "mf_small_w_f64"), *want = fx(FX, "mf_small_out_f64");
    nb_tensor *gwant = fx(FX, "mf_small_grad_f64");
    nb_scope_begin();
    nb_tensor *tl = leaf_of(t);
    nb_tensor *y = nb_masked_fill(tl, fill, 0.5);
    expect_close(y, want, 0, 0);
    ck_assert_int_eq(nb_ndim(y), 4);
    ck_assert_msg(nb_backward_with_grad(y, w) == 0, "%s", nb_last_error());
    expect_close(nb_grad(tl), gwant, 1e-15, 1e-12);
    nb_scope_end();
}
END_TEST

/* ------------------------------------------------------------- gradcheck */
typedef struct {
    dim_op f;
    int dim;
    int nd;              /* > 0: expand the input to (nd, shape) first */
    int64_t shape[NB_MAX_DIMS];
} sm_ctx;

static nb_tensor *sm_fn(nb_tensor **in, int n, void *ctx) {
    (void)n;
    sm_ctx *c = ctx;
    nb_tensor *x = in[0];
    if (c->nd > 0) x = nb_expand(x, c->nd, c->shape);
    return c->f(x, c->dim);
}

static void gradcheck_softmax(const char *name, dim_op f) {
    char label[96];
    int dims[] = {-1, 0, 1};
    nb_scope_begin();
    for (int i = 0; i < 3; i++) {
        sm_ctx c = {f, dims[i], 0, {0}};
        nb_tensor *x = rand_leaf(10 + (uint64_t)i, NB_SHAPE(2, 3, 4));
        snprintf(label, sizeof label, "%s dim %d contiguous", name, dims[i]);
        expect_all_orders(label, sm_fn, &c, 1, &x);
        nb_tensor *xt = transposed_leaf(20 + (uint64_t)i, NB_SHAPE(2, 3, 4), 0, 2);
        snprintf(label, sizeof label, "%s dim %d transposed", name, dims[i]);
        expect_all_orders(label, sm_fn, &c, 1, &xt);
        sm_ctx cb = {f, dims[i], 3, {2, 3, 4}};
        nb_tensor *xb = rand_leaf(30 + (uint64_t)i, NB_SHAPE(2, 1, 4));
        snprintf(label, sizeof label, "%s dim %d broadcast (2,1,4)->(2,3,4)", name, dims[i]);
        expect_all_orders(label, sm_fn, &cb, 1, &xb);
    }
    /* -inf entries, including a whole slice along dim -1 */
    nb_tensor *x = rand_leaf(40, NB_SHAPE(3, 4));
    double *p = nb_data(x);
    p[1] = p[6] = -INFINITY;
    for (int k = 8; k < 12; k++) p[k] = -INFINITY;
    sm_ctx c = {f, -1, 0, {0}};
    snprintf(label, sizeof label, "%s dim -1 with -inf and an all -inf row", name);
    if (f == nb_softmax) {
        expect_all_orders(label, sm_fn, &c, 1, &x);
    } else {
        /* log_softmax is -inf at -inf inputs, so finite differences are
         * NaN there; check the all -inf row alone (output 0, gradient 0) */
        for (int k = 0; k < 8; k++) p[k] = 0.1 * k - 0.3;
        expect_all_orders(label, sm_fn, &c, 1, &x);
    }
    nb_scope_end();
}

START_TEST(test_gradcheck_softmax) { gradcheck_softmax("nb_softmax", nb_softmax); }
END_TEST

START_TEST(test_gradcheck_log_softmax) { gradcheck_softmax("nb_log_softmax", nb_log_softmax); }
END_TEST

/* The all -inf convention holds for the recorded rules too: a create_graph
 * backward gives the plain one's gradient (zeros in the dead slice, whatever
 * g holds there), and the tangent is zero in the dead slice. */
static void all_ninf_orders(dim_op f, const char *name, int dim) {
    const double I = -INFINITY;
    const double v[9] = {1, 2, I, I, I, I, I, 0.5, I};
    const double gv[9] = {0.3, -1.5, 2.0, 1e3, NAN, 0.25, 4.0, -0.5, INFINITY};
    nb_scope_begin();
    nb_tensor *x = nb_set_requires_grad(nb_from_data(NB_F64, NB_SHAPE(3, 3), v), true);
    nb_tensor *g = nb_from_data(NB_F64, NB_SHAPE(3, 3), gv);
    nb_tensor *y = f(x, dim), *plain = NULL, *recorded = NULL;
    ck_assert_int_eq(nb_autograd_grad(&y, 1, &g, &x, 1, &(nb_backward_opts){.retain_graph = true},
                                      &plain), 0);
    ck_assert_msg(nb_autograd_grad(&y, 1, &g, &x, 1, &(nb_backward_opts){.create_graph = true},
                                   &recorded) == 0, "%s", nb_last_error());
    ck_assert(nb_requires_grad(recorded));
    double *pv = values(plain), *rv = values(recorded);
    for (int k = 0; k < 9; k++) {
        bool dead = dim == 1 ? k / 3 == 1 : k % 3 == 2;
        if (dead) ck_assert_msg(rv[k] == 0, "%s dim %d: create_graph gradient %g at %d", name,
                                dim, rv[k], k);
        else if (!isnan(pv[k]) && rv[k] != pv[k])
            ck_assert_msg(fabs(rv[k] - pv[k]) <= 1e-12 * (1 + fabs(pv[k])),
                          "%s dim %d at %d: %g vs %g", name, dim, k, rv[k], pv[k]);
    }
    free(pv);
    free(rv);
    sm_ctx c = {f, dim, 0, {0}};
    nb_tensor *out, *tan, *t = nb_ones(NB_F64, NB_SHAPE(3, 3));
    ck_assert_msg(nb_jvp(sm_fn, &c, 1, &x, &t, &out, &tan) == 0, "%s", nb_last_error());
    double *tv = values(tan);
    for (int k = 0; k < 9; k++)
        if (dim == 1 ? k / 3 == 1 : k % 3 == 2)
            ck_assert_msg(tv[k] == 0, "%s dim %d: tangent %g at %d", name, dim, tv[k], k);
    free(tv);
    nb_scope_end();
}

START_TEST(test_all_ninf_slice_orders) {
    for (int dim = 0; dim < 2; dim++) {
        all_ninf_orders(nb_softmax, "nb_softmax", dim);
        all_ninf_orders(nb_log_softmax, "nb_log_softmax", dim);
    }
}
END_TEST

typedef struct {
    nb_tensor *mask;
    double value;
    bool then_softmax;
} mf_ctx;

static nb_tensor *mf_fn(nb_tensor **in, int n, void *ctx) {
    (void)n;
    mf_ctx *c = ctx;
    nb_tensor *y = nb_masked_fill(in[0], c->mask, c->value);
    return c->then_softmax ? nb_softmax(y, -1) : y;
}

START_TEST(test_gradcheck_masked_fill) {
    nb_tensor *pad = fx(FX, "fill_pad"), *causal = fx(FX, "fill_causal");
    nb_tensor *both = fx(FX, "fill_both");
    nb_scope_begin();
    nb_tensor *s = rand_leaf(50, NB_SHAPE(2, 2, 3, 4));
    mf_ctx c1 = {pad, 0.5, false}, c2 = {causal, 0.5, false}, c3 = {both, 0.5, false};
    expect_gradcheck("nb_masked_fill broadcast (B,1,1,Lk)", mf_fn, &c1, 1, &s);
    expect_gradcheck("nb_masked_fill broadcast (Lq,Lk)", mf_fn, &c2, 1, &s);
    expect_gradcheck("nb_masked_fill broadcast (B,1,Lq,Lk)", mf_fn, &c3, 1, &s);
    nb_tensor *st = transposed_leaf(51, NB_SHAPE(2, 2, 3, 4), 2, 3);
    expect_gradcheck("nb_masked_fill transposed", mf_fn, &c3, 1, &st);
    mf_ctx c4 = {both, -INFINITY, true};
    expect_gradcheck("nb_masked_fill -inf then nb_softmax", mf_fn, &c4, 1, &s);
    mf_ctx c5 = {noncontig_copy(both), -INFINITY, true};
    expect_gradcheck("nb_masked_fill strided mask, then nb_softmax", mf_fn, &c5, 1, &st);
    /* t broadcast up to the mask's shape: gradient summed back */
    nb_tensor *small = rand_leaf(52, NB_SHAPE(3, 4));
    expect_gradcheck("nb_masked_fill t (Lq,Lk), mask (B,1,Lq,Lk)", mf_fn, &c3, 1, &small);
    nb_scope_end();
}
END_TEST

typedef struct {
    double p;
    bool training;
    int nd; /* > 0: expand the input to (nd, shape) first */
    int64_t shape[NB_MAX_DIMS];
} do_ctx;

static nb_tensor *do_fn(nb_tensor **in, int n, void *ctx) {
    (void)n;
    do_ctx *c = ctx;
    nb_rng r;
    nb_rng_seed(&r, 7); /* the same mask in every evaluation */
    nb_tensor *x = in[0];
    if (c->nd > 0) x = nb_expand(x, c->nd, c->shape);
    return nb_dropout(x, c->p, c->training, &r);
}

START_TEST(test_gradcheck_dropout) {
    nb_scope_begin();
    nb_tensor *x = rand_leaf(60, NB_SHAPE(2, 3, 4));
    do_ctx c = {0.3, true, 0, {0}};
    expect_gradcheck("nb_dropout p=0.3 seeded", do_fn, &c, 1, &x);
    nb_tensor *xt = transposed_leaf(61, NB_SHAPE(2, 3, 4), 0, 2);
    expect_gradcheck("nb_dropout p=0.3 seeded transposed", do_fn, &c, 1, &xt);
    do_ctx cb = {0.5, true, 3, {2, 3, 4}};
    nb_tensor *xb = rand_leaf(62, NB_SHAPE(2, 1, 4));
    expect_gradcheck("nb_dropout p=0.5 broadcast (2,1,4)->(2,3,4)", do_fn, &cb, 1, &xb);
    do_ctx ce = {0.3, false, 0, {0}};
    expect_gradcheck("nb_dropout eval (identity)", do_fn, &ce, 1, &x);
    do_ctx c1 = {1.0, true, 0, {0}};
    expect_gradcheck("nb_dropout p=1 (zeros)", do_fn, &c1, 1, &x);
    nb_scope_end();
}
END_TEST

/* --------------------------------------------------------------- dropout */
static void dropout_stats(nb_dtype dt, double p) {
    const int64_t n = 100000;
    nb_scope_begin();
    nb_rng r;
    nb_rng_seed(&r, 42);
    nb_tensor *x = nb_add_scalar(nb_rand(dt, NB_SHAPE(n), &r), 1.0); /* in [1, 2): never 0 */
    uint64_t before = r.offset;
    nb_tensor *y = nb_dropout(x, p, true, &r);
    ck_assert_msg(y != NULL, "%s", nb_last_error());
    ck_assert(r.offset == before + (uint64_t)n); /* one draw per element */
    double *xv = values(x), *yv = values(y);
    int64_t kept = 0;
    for (int64_t i = 0; i < n; i++) {
        if (yv[i] == 0.0) continue;
        kept++;
        /* the scale 1/(1-p) is computed in the tensor's dtype */
        double want = dt == NB_F32 ? (double)((float)xv[i] * (1.0f / (float)(1.0 - p)))
                                   : xv[i] * (1.0 / (1.0 - p));
        ck_assert_msg(yv[i] == want, "p=%g %s: kept value %.17g at %lld, expected %.17g", p,
                      nb_dtype_name(dt), yv[i], (long long)i, want);
        if (p == 0.5) ck_assert(yv[i] == xv[i] / (1.0 - p)); /* exact when 1-p is 2^-k */
    }
    /* within 1% of 1-p where that is a fair bound at n = 1e5 (>= 4.8 standard
     * deviations for p <= 0.5), and within 5 standard deviations always */
    double frac = (double)kept / (double)n, sd = sqrt(p * (1 - p) / (double)n);
    double tol = p <= 0.5 ? 0.01 * (1 - p) : 5 * sd;
    ck_assert_msg(fabs(frac - (1 - p)) <= tol && fabs(frac - (1 - p)) <= 5 * sd,
                  "p=%g: kept fraction %g, expected %g +- %g", p, frac, 1 - p, tol);
    free(xv);
    free(yv);
    nb_scope_end();
}

START_TEST(test_dropout_statistics) {
    dropout_stats(NB_F64, 0.3);
    dropout_stats(NB_F32, 0.3);
    dropout_stats(NB_F64, 0.5);
    dropout_stats(NB_F32, 0.9);
}
END_TEST

START_TEST(test_dropout_determinism) {
    nb_scope_begin();
    nb_tensor *x = nb_add_scalar(nb_rand(NB_F64, NB_SHAPE(16, 32), NULL), 1.0);
    nb_rng a, b, c;
    nb_rng_seed(&a, 123);
    nb_rng_seed(&b, 123);
    nb_rng_seed(&c, 124);
    nb_tensor *ya = nb_dropout(x, 0.4, true, &a), *yb = nb_dropout(x, 0.4, true, &b);
    nb_tensor *yc = nb_dropout(x, 0.4, true, &c);
    expect_identical(ya, yb);
    double *va = values(ya), *vc = values(yc);
    int diff = 0;
    for (int i = 0; i < 512; i++) diff += va[i] != vc[i];
    ck_assert_msg(diff > 0, "different seeds gave the same mask");
    /* a second call on the same generator continues the stream */
    double *va2 = values(nb_dropout(x, 0.4, true, &a));
    diff = 0;
    for (int i = 0; i < 512; i++) diff += va[i] != va2[i];
    ck_assert_msg(diff > 0, "two calls on one generator gave the same mask");
    free(va);
    free(vc);
    free(va2);
    /* NULL = the global generator, reset by nb_manual_seed */
    nb_manual_seed(99);
    nb_tensor *g1 = nb_dropout(x, 0.4, true, NULL);
    nb_manual_seed(99);
    nb_tensor *g2 = nb_dropout(x, 0.4, true, NULL);
    expect_identical(g1, g2);
    nb_rng r99;
    nb_rng_seed(&r99, 99);
    expect_identical(nb_dropout(x, 0.4, true, &r99), g1);
    nb_scope_end();
}
END_TEST

START_TEST(test_dropout_identity_and_zeros) {
    nb_scope_begin();
    nb_rng r;
    nb_rng_seed(&r, 5);
    nb_tensor *x = nb_set_requires_grad(nb_randn(NB_F64, NB_SHAPE(4, 5), &r), true);
    nb_tensor *g = nb_randn(NB_F64, NB_SHAPE(4, 5), &r);
    uint64_t off = r.offset;
    nb_tensor *ye = nb_dropout(x, 0.3, false, &r), *y0 = nb_dropout(x, 0.0, true, &r);
    ck_assert(ye && y0 && ye != x && y0 != x); /* new handles */
    ck_assert(r.offset == off);                /* no draws */
    expect_identical(ye, x);
    expect_identical(y0, x);
    ck_assert(nb_requires_grad(ye));
    ck_assert_msg(nb_backward_with_grad(ye, g) == 0, "%s", nb_last_error());
    expect_identical(nb_grad(x), g);
    nb_zero_grad(x);
    /* p = 1 drops everything: x * 0 as PyTorch (-0 where x < 0); the gradient
     * g * 0 accumulates into x's zeroed .grad: +0 everywhere */
    nb_tensor *y1 = nb_dropout(x, 1.0, true, &r);
    ck_assert(y1 != NULL);
    expect_identical(y1, nb_mul_scalar(nb_detach(x), 0));
    ck_assert_msg(nb_backward_with_grad(y1, g) == 0, "%s", nb_last_error());
    expect_identical(nb_grad(x), nb_zeros(NB_F64, NB_SHAPE(4, 5)));
    nb_tensor *xf = copy_as(x, NB_F32);
    nb_tensor *y1f = nb_dropout(xf, 1.0, true, &r);
    expect_identical(y1f, nb_mul_scalar(nb_detach(xf), 0));
    nb_scope_end();
}
END_TEST

/* The mask is indexed by logical position: a transposed input drops the same
 * elements as its contiguous copy. */
START_TEST(test_dropout_strided_input) {
    nb_scope_begin();
    nb_tensor *x = nb_randn(NB_F64, NB_SHAPE(3, 5, 7), NULL);
    nb_tensor *xt = nb_transpose(x, 0, 2);
    ck_assert(!nb_is_contiguous(xt));
    nb_tensor *xc = nb_contiguous(xt);
    ck_assert(nb_is_contiguous(xc));
    nb_rng r1, r2;
    nb_rng_seed(&r1, 9);
    nb_rng_seed(&r2, 9);
    nb_tensor *a = nb_dropout(xt, 0.5, true, &r1), *b = nb_dropout(xc, 0.5, true, &r2);
    ck_assert(nb_is_contiguous(a));
    expect_identical(a, b);
    /* an expanded (stride 0) input too */
    nb_tensor *e = nb_expand(nb_randn(NB_F32, NB_SHAPE(1, 6), NULL), NB_SHAPE(4, 6));
    nb_rng_seed(&r1, 3);
    nb_rng_seed(&r2, 3);
    expect_identical(nb_dropout(e, 0.25, true, &r1),
                     nb_dropout(copy_as(e, NB_F32), 0.25, true, &r2));
    nb_scope_end();
}
END_TEST

static void dropout_backward_case(nb_dtype dt, bool transposed) {
    int64_t live = nb_live_tensors();
    nb_scope_begin();
    nb_rng r;
    nb_rng_seed(&r, 17);
    nb_tensor *base = nb_add_scalar(nb_rand(dt, NB_SHAPE(6, 5), &r), 1.0);
    nb_tensor *x = transposed ? nb_transpose(base, 0, 1) : base;
    nb_set_requires_grad(x, true);
    nb_tensor *g = nb_randn(dt, nb_ndim(x), nb_shape(x), &r);
    double p = 0.4;
    nb_tensor *y = nb_dropout(x, p, true, &r);
    ck_assert_msg(nb_backward_with_grad(y, g) == 0, "%s", nb_last_error());
    double *yv = values(y), *gv = values(g), *gi = values(nb_grad(x));
    int kept = 0;
    for (int i = 0; i < 30; i++) {
        double want = 0.0;
        if (yv[i] != 0.0) {
            kept++;
            want = dt == NB_F32 ? (double)((float)gv[i] * (1.0f / (float)(1.0 - p)))
                                : gv[i] * (1.0 / (1.0 - p));
        }
        ck_assert_msg(gi[i] == want, "%s%s: grad %d is %.17g, expected %.17g",
                      nb_dtype_name(dt), transposed ? " transposed" : "", i, gi[i], want);
    }
    ck_assert(kept > 0 && kept < 30);
    free(yv);
    free(gv);
    free(gi);
    nb_scope_end();
    ck_assert_int_eq(nb_live_tensors(), live);
}

START_TEST(test_dropout_backward) {
    dropout_backward_case(NB_F64, false);
    dropout_backward_case(NB_F64, true);
    dropout_backward_case(NB_F32, false);
    dropout_backward_case(NB_F32, true);
}
END_TEST

/* ---------------------------------------------------------------- errors */
START_TEST(test_errors) {
    int64_t live = nb_live_tensors();
    nb_scope_begin();
    nb_clear_error();
    nb_tensor *x = nb_zeros(NB_F64, NB_SHAPE(2, 3));
    nb_tensor *x3 = nb_zeros(NB_F32, NB_SHAPE(2, 3, 4));
    nb_tensor *m = nb_zeros(NB_BOOL, NB_SHAPE(2, 3));
    nb_tensor *i64 = nb_arange(NB_I64, 6);

    expect_error(nb_dropout(x, -0.1, true, NULL), "nb_dropout: p must be in [0, 1], got -0.1");
    expect_error(nb_dropout(x, 1.5, true, NULL), "nb_dropout: p must be in [0, 1], got 1.5");
    expect_error(nb_dropout(x, 1.5, false, NULL), "nb_dropout: p must be in [0, 1], got 1.5");
    expect_error(nb_dropout(x, NAN, true, NULL), "nb_dropout: p must be in [0, 1], got");
    expect_error(nb_dropout(x, INFINITY, true, NULL), "nb_dropout: p must be in [0, 1]");
    expect_error(nb_dropout(i64, 0.5, true, NULL), "nb_dropout", "floating", "i64");

    expect_error(nb_masked_fill(x, x, 0.0), "nb_masked_fill: mask must be bool, got f64");
    expect_error(nb_masked_fill(x, copy_as(m, NB_F32), 0.0),
                 "nb_masked_fill: mask must be bool, got f32");
    expect_error(nb_masked_fill(x, i64, 0.0), "nb_masked_fill: mask must be bool, got i64");
    expect_error(nb_masked_fill(x, nb_zeros(NB_BOOL, NB_SHAPE(4)), 0.0), "nb_masked_fill",
                 "(2,3)", "(4)", "cannot be broadcast");
    expect_error(nb_masked_fill(x3, nb_zeros(NB_BOOL, NB_SHAPE(3, 1, 1)), 0.0),
                 "nb_masked_fill", "(2,3,4)", "(3,1,1)", "cannot be broadcast");
    expect_error(nb_masked_fill(i64, nb_zeros(NB_BOOL, NB_SHAPE(6)), 0.0), "nb_masked_fill",
                 "floating", "i64");

    expect_error(nb_softmax(x3, 3), "nb_softmax: dim 3 out of range");
    expect_error(nb_softmax(x3, -4), "nb_softmax: dim -4 out of range");
    expect_error(nb_log_softmax(x3, 3), "nb_log_softmax: dim 3 out of range");
    expect_error(nb_softmax(i64, 0), "nb_softmax", "floating", "i64");
    expect_error(nb_log_softmax(m, 0), "nb_log_softmax", "floating", "bool");

    /* NULL input: its own message when none is set, */
    nb_clear_error();
    expect_error(nb_softmax(NULL, 0), "nb_softmax: input 0 is NULL");
    expect_error(nb_masked_fill(x, NULL, 0.0), "nb_masked_fill: input 1 is NULL");
    expect_error(nb_dropout(NULL, 0.5, true, NULL), "nb_dropout: input 0 is NULL");
    /* else the first error is kept through a whole chain */
    nb_tensor *bad = nb_softmax(x3, 7);
    nb_tensor *y = nb_dropout(nb_masked_fill(nb_log_softmax(bad, 0), m, 0.0), 0.5, true, NULL);
    ck_assert(y == NULL);
    expect_error(nb_masked_fill(x, bad, 1.0), "nb_softmax: dim 7 out of range");
    nb_softmax(x3, 9);
    expect_error(nb_softmax(nb_dropout(bad, 0.1, false, NULL), -1),
                 "nb_softmax: dim 9 out of range");
    nb_scope_end();
    ck_assert_int_eq(nb_live_tensors(), live);
}
END_TEST

/* ------------------------------------------------- f32 exp (ops/vmath.h) */
static bool same_bits(float a, float b) { return (a != a && b != b) || !memcmp(&a, &b, 4); }

static void expect_same_bits(const float *got, const float *want, int64_t n, const char *what) {
    for (int64_t i = 0; i < n; i++)
        ck_assert_msg(same_bits(got[i], want[i]), "%s: element %lld is %a, %a in place", what,
                      (long long)i, got[i], want[i]);
}

/* The error of got in ulps of the exact value (denormal ulp below FLT_MIN). */
static double ulps(float got, long double exact) {
    if (isnan(exact) || isnan(got)) return isnan(exact) && isnan(got) ? 0 : INFINITY;
    if (isinf(got) || isinf((float)exact)) return got == (float)exact ? 0 : INFINITY;
    int e = -125;
    if (exact != 0) frexpl(exact, &e);
    if (e < -125) e = -125;
    return (double)(fabsl((long double)got - exact) / ldexpl(1, e - 24));
}

/* Each f32 slice's results do not depend on where the slice sits: the rows at
 * other offsets in wider rows (lengths and offsets no multiple of 16), rows
 * padded with -inf (the vector / tail split moves), read through a transpose
 * (gathered), along dim 0 (strided output), and on 2 threads give the same
 * bits, for softmax and log_softmax and their gradients. On each
 * instruction-set path of exp. */
static nb_tensor *f32_leaf(int64_t r, int64_t c, const float *v) {
    nb_tensor *t = nb_from_data(NB_F32, 2, (int64_t[]){r, c}, v);
    ck_assert_msg(t != NULL, "%s", nb_last_error());
    return nb_set_requires_grad(t, true);
}

/* y = f(narrow(x, 1, o, l), -1) for x (r, c) holding v, backward with g (r, l);
 * *gx = x's gradient. */
static const float *sm_run(dim_op f, int64_t r, int64_t c, const float *v, int64_t o, int64_t l,
                           const float *g, nb_tensor **gx) {
    nb_tensor *x = f32_leaf(r, c, v);
    nb_tensor *y = f(nb_narrow(x, 1, o, l), -1);
    ck_assert_msg(y != NULL, "%s", nb_last_error());
    nb_tensor *gt = nb_from_data(NB_F32, 2, (int64_t[]){r, l}, g);
    ck_assert_int_eq(nb_backward_with_grad(y, gt), 0);
    *gx = nb_grad(x);
    return nb_data(y);
}

START_TEST(test_softmax_f32_bitwise_any_position) {
    if (nbi_vmath_path(_i) != _i) {
        nbi_vmath_path(NBV_AUTO);
        return;
    }
    enum { R = 5, L = 1237, PAD = 40 };
    static float v[R * L], g[R * L], wide[R * (L + PAD)], t[L * R], gt[L * R];
    uint64_t s = 7;
    for (int i = 0; i < R * L; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        v[i] = -30.0f + 60.0f * (float)(s >> 40) / (float)(1 << 24);
        g[i] = -1.0f + 2.0f * (float)((s >> 20) & 1023) / 1024;
    }
    for (int i = 0; i < R; i++) v[i * L + 100 + i] = -INFINITY;
    for (int i = 0; i < R; i++)
        for (int k = 0; k < L; k++) t[k * R + i] = v[i * L + k], gt[k * R + i] = g[i * L + k];
    for (int m = 0; m < 2; m++) {
        dim_op f = m ? nb_log_softmax : nb_softmax;
        const char *name = m ? "log_softmax" : "softmax";
        nb_scope_begin();
        nb_tensor *gref, *gx;
        const float *ref = sm_run(f, R, L, v, 0, L, g, &gref);
        const float *pgref = nb_data(gref);
        static const int64_t offs[] = {1, 3, 8, 17, 31};
        for (int a = 0; a < 5; a++) {
            int64_t o = offs[a];
            for (int i = 0; i < R * (L + PAD); i++) wide[i] = -1.0f;
            for (int i = 0; i < R; i++) memcpy(wide + i * (L + PAD) + o, v + i * L, L * sizeof *v);
            const float *y = sm_run(f, R, L + PAD, wide, o, L, g, &gx);
            const float *pg = nb_data(gx);
            char what[80];
            snprintf(what, sizeof what, "%s, rows at offset %lld", name, (long long)o);
            expect_same_bits(y, ref, R * L, what);
            for (int i = 0; i < R; i++) expect_same_bits(pg + i * (L + PAD) + o, pgref + i * L, L, what);
        }
        /* rows longer by a few -inf (exp gives 0, adding nothing to the sums; g = 0
         * there): the first L values and gradients are the same bits, computed
         * with the vectors and the tail split elsewhere */
        static const int64_t extra[] = {1, 3, 11};
        for (int a = 0; a < 3; a++) {
            int64_t w = L + extra[a];
            static float gw[R * (L + PAD)];
            for (int i = 0; i < R; i++)
                for (int64_t k = 0; k < w; k++) {
                    wide[i * w + k] = k < L ? v[i * L + k] : -INFINITY;
                    gw[i * w + k] = k < L ? g[i * L + k] : 0;
                }
            const float *y = sm_run(f, R, w, wide, 0, w, gw, &gx);
            const float *pg = nb_data(gx);
            char what[80];
            snprintf(what, sizeof what, "%s, rows padded with %lld -inf", name, (long long)extra[a]);
            for (int i = 0; i < R; i++) {
                expect_same_bits(y + i * w, ref + i * L, L, what);
                expect_same_bits(pg + i * w, pgref + i * L, L, what);
            }
        }
        /* (L, R) storage read as its transpose (R, L): gathered slices */
        nb_tensor *tx = f32_leaf(L, R, t);
        nb_tensor *y = f(nb_transpose(tx, 0, 1), -1);
        ck_assert_int_eq(nb_backward_with_grad(y, nb_from_data(NB_F32, 2, (int64_t[]){R, L}, g)), 0);
        expect_same_bits(nb_data(y), ref, R * L, "transposed input");
        const float *pg = nb_data(nb_grad(tx));
        for (int i = 0; i < R; i++)
            for (int k = 0; k < L; k++)
                ck_assert_msg(same_bits(pg[k * R + i], pgref[i * L + k]), "%s transposed input: grad (%d, %d)",
                              name, i, k);
        /* along dim 0 of (L, R): strided output */
        nb_tensor *tx2 = f32_leaf(L, R, t);
        nb_tensor *y2 = f(tx2, 0);
        ck_assert_int_eq(nb_backward_with_grad(y2, nb_from_data(NB_F32, 2, (int64_t[]){L, R}, gt)), 0);
        const float *py2 = nb_data(y2), *pg2 = nb_data(nb_grad(tx2));
        for (int i = 0; i < R; i++)
            for (int k = 0; k < L; k++) {
                ck_assert_msg(same_bits(py2[k * R + i], ref[i * L + k]), "%s along dim 0: (%d, %d)",
                              name, i, k);
                ck_assert_msg(same_bits(pg2[k * R + i], pgref[i * L + k]),
                              "%s along dim 0: grad (%d, %d)", name, i, k);
            }
        /* 2 threads */
        int threads = nb_num_threads();
        nb_set_num_threads(2);
        const float *y3 = sm_run(f, R, L, v, 0, L, g, &gx);
        nb_set_num_threads(threads);
        expect_same_bits(y3, ref, R * L, "2 threads");
        expect_same_bits(nb_data(gx), pgref, R * L, "2 threads, gradient");
        nb_scope_end();
    }
    nbi_vmath_path(NBV_AUTO);
}
END_TEST

/* The exp inside f32 softmax and log_softmax's backward, within 2 ulp down
 * to denormal results and 0: rows (0, x) with x <= -17, where 1 + e^x rounds
 * to 1, give e^x itself as softmax's second value; log_softmax's gradient
 * with g = (0, -1) is exp(y0) itself for every x (0 - e * -1). */
START_TEST(test_softmax_f32_exp_accuracy) {
    if (nbi_vmath_path(_i) != _i) {
        nbi_vmath_path(NBV_AUTO);
        return;
    }
    enum { N = 2000 };
    static float rows[2 * N], g[2 * N];
    float xs[N];
    for (int i = 0; i < N; i++) {
        xs[i] = i < 1900 ? -17.0f - 87.5f * (float)i / 1900 : -(float)(i - 1900) * 0.17f;
        rows[2 * i] = 0, rows[2 * i + 1] = xs[i];
        g[2 * i] = 0, g[2 * i + 1] = -1;
    }
    xs[N - 1] = -INFINITY, rows[2 * N - 1] = -INFINITY;
    nb_scope_begin();
    nb_tensor *y = nb_softmax(nb_from_data(NB_F32, 2, (int64_t[]){N, 2}, rows), -1);
    const float *py = nb_data(y);
    for (int i = 0; i < 1900; i++) {
        double e = ulps(py[2 * i + 1], expl(xs[i]));
        ck_assert_msg(e <= 2, "softmax exp(%a) = %a, exact %La (%g ulp)", xs[i], py[2 * i + 1],
                      expl(xs[i]), e);
    }
    ck_assert(py[2 * N - 1] == 0 && !signbit(py[2 * N - 1]));
    nb_tensor *x = nb_set_requires_grad(nb_from_data(NB_F32, 2, (int64_t[]){N, 2}, rows), true);
    nb_tensor *ly = nb_log_softmax(x, -1);
    ck_assert_int_eq(nb_backward_with_grad(ly, nb_from_data(NB_F32, 2, (int64_t[]){N, 2}, g)), 0);
    const float *pl = nb_data(ly), *pg = nb_data(nb_grad(x));
    for (int i = 0; i < N; i++) {
        double e = ulps(pg[2 * i], expl(pl[2 * i]));
        ck_assert_msg(e <= 2, "log_softmax backward: exp(%a) = %a, exact %La (%g ulp)", pl[2 * i],
                      pg[2 * i], expl(pl[2 * i]), e);
    }
    nb_scope_end();
    nbi_vmath_path(NBV_AUTO);
}
END_TEST

Suite *suite_softmax(void) {
    Suite *s = suite_create("softmax");
    TCase *tc = tcase_create("softmax");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_softmax_values_f64);
    tcase_add_test(tc, test_softmax_values_f32);
    tcase_add_test(tc, test_softmax_small_shapes);
    tcase_add_test(tc, test_all_ninf_slice);
    tcase_add_test(tc, test_fully_masked_attention_row);
    tcase_add_test(tc, test_masked_fill_values);
    tcase_add_test(tc, test_attention_weights_values);
    tcase_add_test(tc, test_masked_fill_mask_bigger_than_t);
    tcase_add_test(tc, test_gradcheck_softmax);
    tcase_add_test(tc, test_gradcheck_log_softmax);
    tcase_add_test(tc, test_all_ninf_slice_orders);
    tcase_add_test(tc, test_gradcheck_masked_fill);
    tcase_add_test(tc, test_gradcheck_dropout);
    tcase_add_test(tc, test_dropout_statistics);
    tcase_add_test(tc, test_dropout_determinism);
    tcase_add_test(tc, test_dropout_identity_and_zeros);
    tcase_add_test(tc, test_dropout_strided_input);
    tcase_add_test(tc, test_dropout_backward);
    tcase_add_test(tc, test_errors);
    tcase_add_loop_test(tc, test_softmax_f32_bitwise_any_position, NBV_PORTABLE, NBV_COUNT);
    tcase_add_loop_test(tc, test_softmax_f32_exp_accuracy, NBV_PORTABLE, NBV_COUNT);
    suite_add_tcase(s, tc);
    return s;
}
