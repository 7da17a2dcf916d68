/* test_reduce.c: nb_sum, nb_mean, nb_max, nb_argmax, nb_sum_all, nb_mean_all
 * against PyTorch (tests/fixtures/gen_reduce.py): forward values in f64 and
 * f32 over every dim of a (2,3,4) tensor with keepdim true and false and
 * negative dims, result shapes and dtypes, non-contiguous inputs read in
 * place, ties and NaN for argmax; nb_sort and nb_topk: stable order, NaN,
 * ±0, ties of topk, gradient, errors; nb_multinomial: frequencies of 20000
 * draws, support, errors; nb_gradcheck on contiguous, transposed and
 * broadcast inputs; backward values against torch autograd; bad input.
 * Then nb_min's ties and NaN, nb_sum_dims / nb_mean_dims shapes and errors,
 * nb_var's correction at N - correction <= 0, nb_cumsum's f32 accumulation.
 * Higher order: nb_gradgradcheck and forward-mode gradcheck of calls beside
 * the registry's (dims, keepdim, directions, gather / index_select along
 * other dims); a tied embedding's gradient (index_select's in-place path)
 * with transposed, stride-0 and contiguous upstream gradients. */
#include "test_util.h"

#include <stdlib.h>

static const char *FX = "reduce.txt";

#define CHECK_NOT_NULL(t) ck_assert_msg((t) != NULL, "%s", nb_last_error() ? nb_last_error() : "?")

static nb_tensor *F(const char *name) { return fx(FX, name); }

static nb_tensor *Ff(const char *fmt, const char *a, const char *b) {
    char name[96];
    snprintf(name, sizeof name, fmt, a, b);
    return fx(FX, name);
}

static void expect_shape(const nb_tensor *t, int ndim, const int64_t *shape) {
    CHECK_NOT_NULL(t);
    ck_assert_int_eq(nb_ndim(t), ndim);
    for (int i = 0; i < ndim; i++)
        ck_assert_msg(nb_shape(t)[i] == shape[i], "dim %d: %lld, expected %lld", i,
                      (long long)nb_shape(t)[i], (long long)shape[i]);
}

/* The fixture names of a dim: d0 d1 d2 dm1 dm2 dm3 */
static const int dims[] = {0, 1, 2, -1, -2, -3};
#define NDIMS (int)(sizeof dims / sizeof dims[0])
static const char *dname(int d) {
    static const char *pos[] = {"d0", "d1", "d2"}, *neg[] = {"", "dm1", "dm2", "dm3"};
    return d >= 0 ? pos[d] : neg[-d];
}

typedef nb_tensor *(*reduce_fn)(nb_tensor *, int, bool);

/* --------------------------------------------------------- forward values */
/* _i in 0 .. 2*NDIMS-1: dim dims[_i / 2], keepdim _i % 2 */
START_TEST(test_forward_dims) {
    int dim = dims[_i / 2];
    bool keep = _i % 2;
    char sfx[32];
    snprintf(sfx, sizeof sfx, "%s_k%d", dname(dim), (int)keep);
    nb_tensor *x = F("x"), *x32 = F("x32");
    static const char *names[] = {"sum", "mean", "max"};
    static const reduce_fn fns[] = {nb_sum, nb_mean, nb_max};
    nb_tensor *want[3], *want32[3];
    for (int k = 0; k < 3; k++) {
        want[k] = Ff("%s_%s", names[k], sfx);
        want32[k] = Ff("%s_%s_32", names[k], sfx);
    }
    nb_tensor *want_idx = Ff("%s_%s", "argmax", sfx);
    int d = dim < 0 ? dim + 3 : dim;
    int64_t shape[3];
    int on = 0;
    for (int i = 0; i < 3; i++)
        if (i != d) shape[on++] = nb_shape(x)[i];
        else if (keep) shape[on++] = 1;

    nb_scope_begin();
    for (int k = 0; k < 3; k++) {
        nb_tensor *y = fns[k](x, dim, keep);
        expect_shape(y, keep ? 3 : 2, shape);
        expect_close(y, want[k], 1e-12, 1e-12);
        ck_assert_int_eq(nb_dtype_of(y), NB_F64);
        ck_assert(nb_is_contiguous(y));
        ck_assert(!nb_requires_grad(y));
        nb_tensor *y32 = fns[k](x32, dim, keep);
        expect_shape(y32, keep ? 3 : 2, shape);
        expect_close(y32, want32[k], 1e-5, 1e-5);
        ck_assert_int_eq(nb_dtype_of(y32), NB_F32);
    }
    nb_tensor *idx = nb_argmax(x, dim, keep);
    expect_shape(idx, keep ? 3 : 2, shape);
    ck_assert_int_eq(nb_dtype_of(idx), NB_I64);
    expect_close(idx, want_idx, 0, 0);
    nb_tensor *idx32 = nb_argmax(x32, dim, keep);
    ck_assert_int_eq(nb_dtype_of(idx32), NB_I64);
    expect_close(idx32, want_idx, 0, 0);
    nb_scope_end();
}
END_TEST

START_TEST(test_forward_all) {
    nb_tensor *x = F("x"), *x32 = F("x32");
    nb_tensor *s = F("sum_all"), *s32 = F("sum_all_32"), *m = F("mean_all"), *m32 = F("mean_all_32");
    nb_scope_begin();
    nb_tensor *y = nb_sum_all(x);
    expect_shape(y, 0, NULL);
    ck_assert_int_eq(nb_numel(y), 1);
    expect_close(y, s, 1e-12, 1e-12);
    ck_assert_int_eq(nb_dtype_of(y), NB_F64);
    y = nb_mean_all(x);
    expect_shape(y, 0, NULL);
    expect_close(y, m, 1e-12, 1e-12);
    y = nb_sum_all(x32);
    ck_assert_int_eq(nb_dtype_of(y), NB_F32);
    expect_close(y, s32, 1e-5, 1e-5);
    y = nb_mean_all(x32);
    ck_assert_int_eq(nb_dtype_of(y), NB_F32);
    expect_close(y, m32, 1e-5, 1e-5);
    nb_scope_end();
}
END_TEST

/* ------------------------------------------------------ non-contiguous input */
typedef nb_tensor *(*view_fn)(nb_tensor *);
static nb_tensor *v_tr(nb_tensor *t) { return nb_transpose(t, 0, 1); }
static nb_tensor *v_nar(nb_tensor *t) { return nb_narrow(t, 2, 1, 2); }
static nb_tensor *v_perm(nb_tensor *t) { return nb_permute(t, 3, (const int[]){2, 0, 1}); }
static const char *const view_names[] = {"tr", "nar", "perm"};
static const view_fn view_fns[] = {v_tr, v_nar, v_perm};

START_TEST(test_forward_noncontiguous) {
    const char *vn = view_names[_i];
    nb_tensor *x = F("x");
    static const int vdims[] = {0, 1, 2, -1};
    nb_tensor *want[4][4];
    for (int k = 0; k < 4; k++) {
        char op[64];
        snprintf(op, sizeof op, "%s_sum", vn);
        want[k][0] = Ff("%s_%s", op, dname(vdims[k]));
        snprintf(op, sizeof op, "%s_mean", vn);
        want[k][1] = Ff("%s_%s", op, dname(vdims[k]));
        snprintf(op, sizeof op, "%s_max", vn);
        want[k][2] = Ff("%s_%s", op, dname(vdims[k]));
        snprintf(op, sizeof op, "%s_argmax", vn);
        want[k][3] = Ff("%s_%s", op, dname(vdims[k]));
    }
    nb_tensor *ws = Ff("%s_%s", vn, "sum_all"), *wm = Ff("%s_%s", vn, "mean_all");
    nb_scope_begin();
    nb_tensor *v = view_fns[_i](x);
    CHECK_NOT_NULL(v);
    ck_assert(!nb_is_contiguous(v));
    ck_assert((char *)nb_data(v) >= (char *)nb_data(x)); /* a view of x's memory */
    ck_assert((char *)nb_data(v) < (char *)nb_data(x) + 24 * sizeof(double));
    for (int k = 0; k < 4; k++) {
        int d = vdims[k];
        expect_close(nb_sum(v, d, false), want[k][0], 1e-12, 1e-12);
        expect_close(nb_mean(v, d, false), want[k][1], 1e-12, 1e-12);
        expect_close(nb_max(v, d, false), want[k][2], 0, 0);
        expect_close(nb_argmax(v, d, false), want[k][3], 0, 0);
        /* keepdim: the same values with a 1 in dim d */
        nb_tensor *kd = nb_sum(v, d, true);
        CHECK_NOT_NULL(kd);
        ck_assert_int_eq(nb_ndim(kd), 3);
        ck_assert_int_eq(nb_shape(kd)[d < 0 ? d + 3 : d], 1);
        expect_close(nb_squeeze(kd, d), want[k][0], 1e-12, 1e-12);
    }
    expect_close(nb_sum_all(v), ws, 1e-12, 1e-12);
    expect_close(nb_mean_all(v), wm, 1e-12, 1e-12);
    /* f32 views too: the same numbers within f32 precision */
    nb_tensor *v32 = view_fns[_i](nb_to(x, NB_F32));
    expect_close(nb_sum(v32, 1, false), want[1][0], 1e-5, 1e-5);
    expect_close(nb_argmax(v32, -1, false), want[3][3], 0, 0);
    expect_close(nb_sum_all(v32), ws, 1e-5, 1e-5);
    nb_scope_end();
}
END_TEST

/* An expanded (stride-0) input: every copy counts. */
START_TEST(test_forward_expanded) {
    nb_scope_begin();
    nb_tensor *c = nb_from_data(NB_F64, NB_SHAPE(3, 1), (const double[]){1.5, -2.0, 4.0});
    nb_tensor *e = nb_expand(c, NB_SHAPE(2, 3, 4));
    CHECK_NOT_NULL(e);
    ck_assert_int_eq(nb_strides(e)[0], 0);
    nb_tensor *s = nb_sum(e, 0, false); /* 2 * c, (3,4) */
    double v[12];
    ck_assert_int_eq(nb_copy_to_f64(s, v), 0);
    for (int i = 0; i < 12; i++) ck_assert_double_eq(v[i], 2 * (i < 4 ? 1.5 : i < 8 ? -2.0 : 4.0));
    ck_assert_double_eq(nb_item(nb_sum_all(e)), 8 * (1.5 - 2.0 + 4.0));
    ck_assert_double_eq_tol(nb_item(nb_mean_all(e)), (1.5 - 2.0 + 4.0) / 3, 1e-15);
    nb_tensor *am = nb_argmax(e, 2, false); /* all equal: the first index */
    ck_assert_int_eq(nb_copy_to_f64(am, v), 0);
    for (int i = 0; i < 6; i++) ck_assert_double_eq(v[i], 0);
    am = nb_argmax(e, 1, false); /* 4.0 at index 2 */
    ck_assert_int_eq(nb_copy_to_f64(am, v), 0);
    for (int i = 0; i < 8; i++) ck_assert_double_eq(v[i], 2);
    nb_scope_end();
}
END_TEST

/* ------------------------------------------------------------ ties and NaN */
START_TEST(test_argmax_ties) {
    nb_tensor *ties = F("ties"), *ties_i64 = F("ties_i64"), *nan = F("nan");
    nb_tensor *want[3], *want_max[3], *want_i64[3], *want_nan[2], *want_nan_max[2];
    for (int d = 0; d < 3; d++) {
        want[d] = Ff("%s_%s", "ties_argmax", dname(d));
        want_max[d] = Ff("%s_%s", "ties_max", dname(d));
        want_i64[d] = Ff("%s_%s", "ties_i64_argmax", dname(d));
    }
    for (int d = 0; d < 2; d++) {
        want_nan[d] = Ff("%s_%s", "nan_argmax", dname(d));
        want_nan_max[d] = Ff("%s_%s", "nan_max", dname(d));
    }
    nb_scope_begin();
    for (int d = 0; d < 3; d++) {
        expect_close(nb_argmax(ties, d, false), want[d], 0, 0);
        expect_close(nb_max(ties, d, false), want_max[d], 0, 0);
        expect_close(nb_argmax(nb_to(ties, NB_F32), d, false), want[d], 0, 0);
        nb_tensor *a = nb_argmax(ties_i64, d, false);
        CHECK_NOT_NULL(a);
        ck_assert_int_eq(nb_dtype_of(a), NB_I64);
        expect_close(a, want_i64[d], 0, 0);
    }
    for (int d = 0; d < 2; d++) {
        expect_close(nb_argmax(nan, d, false), want_nan[d], 0, 0);
        expect_close(nb_max(nan, d, false), want_nan_max[d], 0, 0);
    }
    /* bool input: the first true, 0 when there is none */
    nb_tensor *b = nb_from_data(NB_BOOL, NB_SHAPE(3, 3),
                                (const bool[]){false, true, true, false, false, false, true, false, true});
    double v[3];
    ck_assert_int_eq(nb_copy_to_f64(nb_argmax(b, 1, false), v), 0);
    ck_assert_double_eq(v[0], 1);
    ck_assert_double_eq(v[1], 0);
    ck_assert_double_eq(v[2], 0);
    nb_scope_end();
}
END_TEST

/* ------------------------------------------------------------ edge shapes */
START_TEST(test_edge_shapes) {
    nb_scope_begin();
    /* 1-D with keepdim false -> 0-d */
    nb_tensor *v = nb_from_data(NB_F64, NB_SHAPE(4), (const double[]){1, -2, 7, 3});
    nb_tensor *s = nb_sum(v, 0, false);
    expect_shape(s, 0, NULL);
    ck_assert_double_eq(nb_item(s), 9);
    expect_shape(nb_sum(v, -1, true), NB_SHAPE(1));
    ck_assert_double_eq(nb_item(nb_mean(v, 0, false)), 2.25);
    ck_assert_double_eq(nb_item(nb_max(v, 0, false)), 7);
    ck_assert_double_eq(nb_item(nb_argmax(v, 0, false)), 2);
    /* 0-d input: dim 0 or -1 is allowed (as in torch) and returns the value */
    nb_tensor *z = nb_scalar(NB_F64, 3.5);
    for (int dim = -1; dim <= 0; dim++) {
        expect_shape(nb_sum(z, dim, false), 0, NULL);
        ck_assert_double_eq(nb_item(nb_sum(z, dim, false)), 3.5);
        ck_assert_double_eq(nb_item(nb_mean(z, dim, true)), 3.5);
        ck_assert_double_eq(nb_item(nb_max(z, dim, false)), 3.5);
        nb_tensor *a = nb_argmax(z, dim, false);
        CHECK_NOT_NULL(a);
        ck_assert_int_eq(nb_dtype_of(a), NB_I64);
        ck_assert_double_eq(nb_item(a), 0);
    }
    ck_assert_double_eq(nb_item(nb_sum_all(z)), 3.5);
    ck_assert_double_eq(nb_item(nb_mean_all(z)), 3.5);
    /* size-0 dims: an empty sum is 0, an empty mean NaN (as in torch) */
    nb_tensor *e = nb_zeros(NB_F64, NB_SHAPE(0, 3));
    expect_shape(nb_sum(e, 1, false), NB_SHAPE(0));
    expect_shape(nb_max(e, 1, true), NB_SHAPE(0, 1));
    nb_tensor *e0 = nb_sum(e, 0, false);
    expect_shape(e0, NB_SHAPE(3));
    double w[3];
    ck_assert_int_eq(nb_copy_to_f64(e0, w), 0);
    for (int i = 0; i < 3; i++) ck_assert_double_eq(w[i], 0);
    ck_assert_int_eq(nb_copy_to_f64(nb_mean(e, 0, true), w), 0);
    for (int i = 0; i < 3; i++) ck_assert(isnan(w[i]));
    ck_assert_double_eq(nb_item(nb_sum_all(e)), 0);
    ck_assert(isnan(nb_item(nb_mean_all(e))));
    /* f32 sums are accumulated in double: 1 + 2^-24 * n is not lost */
    nb_tensor *f = nb_full(NB_F32, NB_SHAPE(1 << 12), 1.0f / (1 << 24));
    nb_tensor *f1 = nb_cat((nb_tensor *[]){nb_ones(NB_F32, NB_SHAPE(1)), f}, 2, 0);
    ck_assert_double_eq_tol(nb_item(nb_sum(f1, 0, false)), 1.0 + 1.0 / (1 << 12), 1e-7);
    nb_scope_end();
}
END_TEST

/* ------------------------------------------------------------------ autograd */
typedef struct {
    int op; /* 0 sum, 1 mean, 2 max, 3 sum_all, 4 mean_all */
    int dim;
    bool keep;
    int pre; /* 0 none, 1 transpose(0,1) first, 2 expand to (2,3,4) first */
} rctx;

static nb_tensor *f_reduce(nb_tensor **in, int n, void *vctx) {
    (void)n;
    const rctx *c = vctx;
    nb_tensor *x = in[0];
    if (c->pre == 1) x = nb_transpose(x, 0, 1);
    if (c->pre == 2) x = nb_expand(x, NB_SHAPE(2, 3, 4));
    switch (c->op) {
    case 0: return nb_sum(x, c->dim, c->keep);
    case 1: return nb_mean(x, c->dim, c->keep);
    case 2: return nb_max(x, c->dim, c->keep);
    case 3: return nb_sum_all(x);
    default: return nb_mean_all(x);
    }
}

/* Distinct values at least 0.37 apart (no near-ties for max), in a scrambled
 * order, shaped as asked; f64, requires grad. */
static nb_tensor *spaced_leaf(int ndim, const int64_t *shape, int shift) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    ck_assert(n <= 24);
    double v[24];
    for (int64_t i = 0; i < n; i++) v[i] = 0.37 * (double)((i * 7 + shift) % 24) - 4.1;
    nb_tensor *t = nb_from_data(NB_F64, ndim, shape, v);
    CHECK_NOT_NULL(t);
    return nb_set_requires_grad(t, true);
}

/* A leaf that is a transposed view of data made without grad. */
static nb_tensor *transposed_leaf3(int64_t a, int64_t b, int64_t c, int shift) {
    nb_tensor *t = spaced_leaf(3, (const int64_t[]){b, a, c}, shift);
    nb_set_requires_grad(t, false);
    nb_tensor *v = nb_transpose(t, 0, 1);
    CHECK_NOT_NULL(v);
    ck_assert(nb_is_leaf(v));
    ck_assert(!nb_is_contiguous(v));
    return nb_set_requires_grad(v, true);
}

static const char *const op_names[] = {"nb_sum", "nb_mean", "nb_max", "nb_sum_all", "nb_mean_all"};

START_TEST(test_gradcheck_contiguous) {
    nb_scope_begin();
    char label[96];
    for (int op = 0; op < 3; op++) {
        for (int k = 0; k < NDIMS; k++) {
            for (int keep = 0; keep < 2; keep++) {
                rctx c = {op, dims[k], keep, 0};
                nb_tensor *in[1] = {spaced_leaf(NB_SHAPE(2, 3, 4), 5)};
                snprintf(label, sizeof label, "%s dim %d %s contiguous", op_names[op], dims[k],
                         keep ? "keepdim" : "no keepdim");
                expect_gradcheck(label, f_reduce, &c, 1, in);
            }
        }
    }
    for (int op = 3; op < 5; op++) {
        rctx c = {op, 0, false, 0};
        nb_tensor *in[1] = {spaced_leaf(NB_SHAPE(2, 3, 4), 1)};
        snprintf(label, sizeof label, "%s", op_names[op]);
        expect_gradcheck(label, f_reduce, &c, 1, in);
        nb_tensor *in1[1] = {spaced_leaf(NB_SHAPE(5), 2)};
        snprintf(label, sizeof label, "%s 1-D", op_names[op]);
        expect_gradcheck(label, f_reduce, &c, 1, in1);
    }
    nb_scope_end();
}
END_TEST

START_TEST(test_gradcheck_transposed) {
    nb_scope_begin();
    char label[96];
    for (int op = 0; op < 5; op++) {
        int ndims = op < 3 ? 4 : 1;
        for (int k = 0; k < ndims; k++) {
            int dim = dims[k];
            /* a transposed leaf (non-contiguous strides in the input itself) */
            rctx c = {op, dim, k % 2 == 0, 0};
            nb_tensor *in[1] = {transposed_leaf3(2, 3, 4, 3)};
            if (op < 3) snprintf(label, sizeof label, "%s dim %d transposed leaf", op_names[op], dim);
            else snprintf(label, sizeof label, "%s transposed leaf", op_names[op]);
            expect_gradcheck(label, f_reduce, &c, 1, in);
            /* transposed inside the function: the graph goes through nb_transpose */
            rctx c2 = {op, dim, k % 2 == 1, 1};
            nb_tensor *in2[1] = {spaced_leaf(NB_SHAPE(3, 2, 4), 11)};
            if (op < 3) snprintf(label, sizeof label, "%s dim %d transposed", op_names[op], dim);
            else snprintf(label, sizeof label, "%s transposed", op_names[op]);
            expect_gradcheck(label, f_reduce, &c2, 1, in2);
        }
    }
    /* a narrowed leaf: offset and a gap in the strides */
    nb_tensor *base = spaced_leaf(NB_SHAPE(3, 6), 4);
    nb_set_requires_grad(base, false);
    nb_tensor *nar = nb_set_requires_grad(nb_narrow(base, 1, 1, 4), true);
    CHECK_NOT_NULL(nar);
    ck_assert(!nb_is_contiguous(nar));
    for (int op = 0; op < 3; op++) {
        rctx c = {op, 1, false, 0};
        snprintf(label, sizeof label, "%s dim 1 narrowed leaf", op_names[op]);
        expect_gradcheck(label, f_reduce, &c, 1, &nar);
    }
    nb_scope_end();
}
END_TEST

START_TEST(test_gradcheck_broadcast) {
    nb_scope_begin();
    char label[96];
    /* a (3,1) leaf expanded to (2,3,4) (stride 0 in dims 0 and 2) before reducing */
    for (int op = 0; op < 5; op++) {
        for (int k = 0; k < (op < 3 ? 3 : 1); k++) {
            rctx c = {op, dims[k], k == 1, 2};
            nb_tensor *in[1] = {spaced_leaf(NB_SHAPE(3, 1), 7)};
            if (op < 3) snprintf(label, sizeof label, "%s broadcast dim %d", op_names[op], dims[k]);
            else snprintf(label, sizeof label, "%s broadcast", op_names[op]);
            expect_gradcheck(label, f_reduce, &c, 1, in);
        }
    }
    /* a (1,3,4) leaf: the expanded dim 0 is not reduced by max over dim -1 */
    rctx c = {2, -1, false, 2};
    nb_tensor *in[1] = {spaced_leaf(NB_SHAPE(1, 3, 4), 9)};
    expect_gradcheck("nb_max dim -1 broadcast (1,3,4)", f_reduce, &c, 1, in);
    rctx cm = {1, 0, true, 2};
    expect_gradcheck("nb_mean broadcast", f_reduce, &cm, 1, in);
    nb_scope_end();
}
END_TEST

/* Chains that feed a reduction's output into another reduction, so that the
 * upstream gradient is itself expanded/strided. */
static nb_tensor *f_chain(nb_tensor **in, int n, void *ctx) {
    (void)n, (void)ctx;
    nb_tensor *m = nb_max(in[0], -1, false);                /* (2,3) */
    nb_tensor *s = nb_mean(nb_transpose(m, 0, 1), 1, true); /* (3,1) */
    nb_tensor *t = nb_transpose(nb_sum(in[0], 2, false), 0, 1); /* (3,2) */
    return nb_sum(nb_mul(s, t), 0, false);                  /* (3,2) -> (2) */
}

START_TEST(test_gradcheck_chain) {
    nb_scope_begin();
    nb_tensor *in[1] = {spaced_leaf(NB_SHAPE(2, 3, 4), 13)};
    expect_gradcheck("nb_max/nb_mean/nb_sum chained", f_chain, NULL, 1, in);
    nb_scope_end();
}
END_TEST

/* loss = sum(op(x, dim, keepdim) * w) against torch autograd, f64 and f32. */
static const struct {
    int dim;
    bool keep;
} grad_cases[] = {{0, false}, {1, false}, {2, false}, {-1, true}, {-2, true}};
#define NGRAD (int)(sizeof grad_cases / sizeof grad_cases[0])

START_TEST(test_backward_vs_torch) {
    int op = _i / NGRAD, dim = grad_cases[_i % NGRAD].dim;
    bool keep = grad_cases[_i % NGRAD].keep;
    char base[64], name[96];
    snprintf(base, sizeof base, "grad_%s_%s_k%d", op_names[op] + 3, dname(dim), (int)keep);
    nb_tensor *fx64 = F("x");
    snprintf(name, sizeof name, "%s_w", base);
    nb_tensor *fw = F(name);
    nb_tensor *want[2];
    want[0] = F(base);
    snprintf(name, sizeof name, "%s_32", base);
    want[1] = F(name);
    static const reduce_fn fns[] = {nb_sum, nb_mean, nb_max};
    for (int p = 0; p < 2; p++) {
        nb_dtype dt = p ? NB_F32 : NB_F64;
        double tol = p ? 1e-5 : 1e-12;
        nb_scope_begin();
        nb_tensor *x = nb_set_requires_grad(nb_to(nb_detach(fx64), dt), true);
        CHECK_NOT_NULL(x);
        nb_tensor *out = fns[op](x, dim, keep);
        CHECK_NOT_NULL(out);
        ck_assert(nb_requires_grad(out));
        ck_assert(!nb_is_leaf(out));
        nb_tensor *loss = nb_sum_all(nb_mul(out, nb_to(fw, dt)));
        ck_assert_msg(nb_backward(loss) == 0, "%s", nb_last_error());
        ck_assert_int_eq(nb_dtype_of(nb_grad(x)), dt);
        expect_close(nb_grad(x), want[p], tol, tol);
        ck_assert(!nb_requires_grad(fx64)); /* the fixture was not touched */
        nb_scope_end();
    }
}
END_TEST

START_TEST(test_backward_all_vs_torch) {
    nb_tensor *fx64 = F("x"), *fw = F("grad_sum_all_w");
    nb_tensor *want[2][2] = {{F("grad_sum_all"), F("grad_sum_all_32")},
                             {F("grad_mean_all"), F("grad_mean_all_32")}};
    for (int op = 0; op < 2; op++) {
        for (int p = 0; p < 2; p++) {
            nb_dtype dt = p ? NB_F32 : NB_F64;
            double tol = p ? 1e-6 : 1e-12;
            nb_scope_begin();
            nb_tensor *x = nb_set_requires_grad(nb_to(nb_detach(fx64), dt), true);
            nb_tensor *out = op ? nb_mean_all(x) : nb_sum_all(x);
            nb_tensor *loss = nb_mul(out, nb_to(fw, dt));
            ck_assert_msg(nb_backward(loss) == 0, "%s", nb_last_error());
            expect_close(nb_grad(x), want[op][p], tol, tol);
            nb_scope_end();
        }
    }
}
END_TEST

/* max sends the gradient to the first maximal element only */
START_TEST(test_max_grad_first_tie) {
    nb_scope_begin();
    nb_tensor *x = nb_from_data(NB_F64, NB_SHAPE(2, 4), (const double[]){1, 5, 5, 2, 3, 3, 3, 3});
    nb_set_requires_grad(x, true);
    ck_assert_int_eq(nb_backward(nb_sum_all(nb_max(x, 1, false))), 0);
    double g[8];
    ck_assert_int_eq(nb_copy_to_f64(nb_grad(x), g), 0);
    const double want[8] = {0, 1, 0, 0, 1, 0, 0, 0};
    for (int i = 0; i < 8; i++) ck_assert_double_eq(g[i], want[i]);
    /* the same through a transposed view: dim 0 of x.t() */
    nb_zero_grad(x);
    nb_tensor *m = nb_max(nb_transpose(x, 0, 1), 0, true);
    expect_shape(m, NB_SHAPE(1, 2));
    ck_assert_int_eq(nb_backward(nb_sum_all(m)), 0);
    ck_assert_int_eq(nb_copy_to_f64(nb_grad(x), g), 0);
    for (int i = 0; i < 8; i++) ck_assert_double_eq(g[i], want[i]);
    nb_scope_end();
}
END_TEST

START_TEST(test_recording) {
    nb_scope_begin();
    nb_tensor *x = rand_leaf(1, NB_SHAPE(2, 3));
    nb_tensor *a = nb_argmax(x, 1, false);
    CHECK_NOT_NULL(a);
    ck_assert(!nb_requires_grad(a)); /* indices are not differentiable */
    ck_assert(nb_is_leaf(a));
    ck_assert(nb_requires_grad(nb_max(x, 1, false)));
    ck_assert(nb_requires_grad(nb_sum(x, 0, true)));
    ck_assert(nb_requires_grad(nb_mean_all(x)));
    nb_set_grad_enabled(false);
    nb_tensor *s = nb_sum(x, 0, false), *m = nb_max(x, 0, false);
    nb_set_grad_enabled(true);
    ck_assert(!nb_requires_grad(s) && nb_is_leaf(s));
    ck_assert(!nb_requires_grad(m) && nb_is_leaf(m));
    nb_scope_end();
}
END_TEST

START_TEST(test_no_leak) {
    int64_t live = nb_live_tensors();
    nb_scope_begin();
    nb_tensor *x = rand_leaf(2, NB_SHAPE(3, 4));
    for (int rep = 0; rep < 2; rep++) {
        nb_tensor *l = nb_add(nb_sum_all(nb_max(x, 0, false)), nb_mean_all(nb_sum(x, 1, true)));
        ck_assert_int_eq(nb_backward(l), 0);
    }
    nb_scope_end();
    ck_assert_int_eq(nb_live_tensors(), live);
}
END_TEST

/* --------------------------------------------------------------------- errors */
START_TEST(test_error_dim) {
    nb_scope_begin();
    nb_tensor *x = nb_zeros(NB_F64, NB_SHAPE(2, 3, 4));
    expect_error(nb_sum(x, 3, false), "nb_sum", "dim 3 out of range");
    expect_error(nb_sum(x, 3, false), "nb_sum: dim 3 out of range for a 3-d tensor (expected -3..2)");
    expect_error(nb_sum(x, -4, true), "nb_sum", "dim -4 out of range");
    expect_error(nb_mean(x, 5, false), "nb_mean", "dim 5 out of range");
    expect_error(nb_max(x, -4, false), "nb_max", "dim -4 out of range");
    expect_error(nb_argmax(x, 3, true), "nb_argmax", "dim 3 out of range");
    nb_tensor *z = nb_scalar(NB_F64, 1);
    expect_error(nb_sum(z, 1, false), "nb_sum", "dim 1 out of range for a 0-d tensor");
    expect_error(nb_max(z, -2, false), "nb_max", "dim -2 out of range");
    expect_error(nb_argmax(z, 1, false), "nb_argmax", "dim 1 out of range");
    nb_scope_end();
}
END_TEST

START_TEST(test_error_dtype) {
    nb_scope_begin();
    nb_tensor *i = nb_zeros(NB_I64, NB_SHAPE(2, 3)), *b = nb_zeros(NB_BOOL, NB_SHAPE(2, 3));
    expect_error(nb_sum(i, 0, false), "nb_sum", "expected a floating tensor", "i64");
    expect_error(nb_sum(i, 0, false), "nb_sum: expected a floating tensor (f32 or f64), got i64");
    expect_error(nb_mean(b, 1, false), "nb_mean", "expected a floating tensor", "bool");
    expect_error(nb_max(i, 1, false), "nb_max", "expected a floating tensor", "i64");
    expect_error(nb_sum_all(i), "nb_sum_all", "expected a floating tensor", "i64");
    expect_error(nb_mean_all(b), "nb_mean_all", "expected a floating tensor", "bool");
    nb_scope_end();
}
END_TEST

START_TEST(test_error_empty_max) {
    nb_scope_begin();
    nb_tensor *e = nb_zeros(NB_F64, NB_SHAPE(2, 0, 3));
    expect_error(nb_max(e, 1, false), "nb_max", "cannot reduce over dim 1 of size 0",
                 "(2,0,3)");
    expect_error(nb_max(e, -2, true), "nb_max", "of size 0");
    expect_error(nb_argmax(e, 1, false), "nb_argmax", "cannot reduce over dim 1 of size 0");
    expect_error(nb_argmax(nb_zeros(NB_I64, NB_SHAPE(0)), 0, false), "nb_argmax", "size 0");
    nb_scope_end();
}
END_TEST

START_TEST(test_error_null) {
    nb_clear_error();
    expect_error(nb_sum(NULL, 0, false), "nb_sum: input 0 is NULL");
    expect_error(nb_mean(NULL, 0, true), "nb_mean: input 0 is NULL");
    expect_error(nb_max(NULL, 0, false), "nb_max: input 0 is NULL");
    expect_error(nb_argmax(NULL, 0, false), "nb_argmax: input 0 is NULL");
    expect_error(nb_sum_all(NULL), "nb_sum_all: input 0 is NULL");
    expect_error(nb_mean_all(NULL), "nb_mean_all: input 0 is NULL");
    /* the first error survives the NULL-propagating calls */
    nb_scope_begin();
    nb_tensor *x = nb_zeros(NB_F64, NB_SHAPE(2, 3));
    nb_tensor *bad = nb_sum(x, 7, false);
    ck_assert_ptr_null(bad);
    char first[512];
    snprintf(first, sizeof first, "%s", nb_last_error());
    ck_assert_ptr_null(nb_mean_all(nb_max(nb_mean(bad, 0, false), 0, false)));
    expect_error_after("nb_mean_all: input 0 is NULL", first);
    ck_assert_ptr_null(nb_argmax(bad, 0, false));
    expect_error_after("nb_argmax: input 0 is NULL", first);
    nb_clear_error();
    nb_scope_end();
}
END_TEST

/* ------------------------------------ min, over several dims, var, cumsum */
/* element i (row-major) of a small tensor */
static double at(const nb_tensor *t, int64_t i) {
    double v[64];
    ck_assert_msg(t && nb_numel(t) <= 64 && nb_copy_to_f64(t, v) == 0, "%s",
                  nb_last_error() ? nb_last_error() : "?");
    return v[i];
}
START_TEST(test_min_ties_nan) {
    nb_scope_begin();
    nb_tensor *x = nb_from_data(NB_F64, NB_SHAPE(2, 4), (double[]){1, 0, 3, 0, 2, NAN, -1, NAN});
    nb_set_requires_grad(x, true);
    nb_tensor *m = nb_min(x, 1, false);
    CHECK_NOT_NULL(m);
    ck_assert(at(m, 0) == 0);
    ck_assert(isnan(at(m, 1))); /* NaN counts as the min */
    ck_assert_int_eq(nb_backward(nb_sum_all(m)), 0);
    const double want[8] = {0, 1, 0, 0, 0, 1, 0, 0}; /* the first minimal element */
    for (int i = 0; i < 8; i++)
        ck_assert(at(nb_grad(x), i) == want[i]);
    expect_error(nb_min(nb_zeros(NB_F64, NB_SHAPE(2, 0)), 1, true), "nb_min",
                 "cannot reduce over dim 1 of size 0");
    expect_error(nb_min(NULL, 0, false), "nb_min: input 0 is NULL");
    nb_scope_end();
}
END_TEST

START_TEST(test_reduce_dims_shapes_errors) {
    nb_scope_begin();
    nb_tensor *x = nb_ones(NB_F32, NB_SHAPE(2, 3, 4));
    expect_shape(nb_sum_dims(x, 2, (const int[]){-1, 0}, false), 1, (int64_t[]){3});
    expect_shape(nb_sum_dims(x, 2, (const int[]){2, 0}, true), 3, (int64_t[]){1, 3, 1});
    expect_shape(nb_mean_dims(x, 0, NULL, true), 3, (int64_t[]){1, 1, 1});
    nb_tensor *all = nb_sum_dims(x, 0, NULL, false);
    expect_shape(all, 0, NULL);
    ck_assert(nb_item(all) == 24);
    /* the mean of an empty reduction is NaN, its sum 0 (torch) */
    nb_tensor *e = nb_zeros(NB_F64, NB_SHAPE(0, 3));
    ck_assert(isnan(at(nb_mean_dims(e, 1, (const int[]){0}, false), 1)));
    ck_assert(at(nb_sum_dims(e, 1, (const int[]){0}, false), 1) == 0);
    expect_error(nb_sum_dims(x, 2, (const int[]){1, -2}, false), "nb_sum_dims",
                 "dim -2 appears more than once");
    expect_error(nb_mean_dims(x, 1, (const int[]){3}, false), "nb_mean_dims", "3");
    expect_error(nb_var(x, 2, NULL, 1, false), "nb_var", "ndims 2", "NULL");
    expect_error(nb_std(x, -1, NULL, 1, false), "nb_std", "ndims -1");
    expect_error(nb_var(x, 0, NULL, NAN, false), "nb_var", "correction", "finite");
    expect_error(nb_cumsum(x, 3), "nb_cumsum", "3");
    expect_error(nb_cumsum(nb_zeros(NB_I64, NB_SHAPE(2)), 0), "nb_cumsum", "floating");
    nb_scope_end();
}
END_TEST

/* x = (1, 2, 4): squared deviations sum to 14/3; torch.var gives 7/3 with
 * correction 1, 14/9 with 0 */
START_TEST(test_var_correction) {
    nb_scope_begin();
    nb_tensor *x = nb_from_data(NB_F64, NB_SHAPE(3), (double[]){1, 2, 4});
    const int d0[] = {0};
    ck_assert(fabs(nb_item(nb_var(x, 1, d0, 1, false)) - 7.0 / 3) < 1e-15);
    ck_assert(fabs(nb_item(nb_var(x, 1, d0, 0, false)) - 14.0 / 9) < 1e-15);
    ck_assert(fabs(nb_item(nb_std(x, 0, NULL, 1, false)) - sqrt(7.0 / 3)) < 1e-15);
    /* N - correction <= 0: inf, or NaN when every deviation is 0 (torch) */
    ck_assert(isinf(nb_item(nb_var(x, 1, d0, 3, false))));
    ck_assert(isinf(nb_item(nb_var(x, 1, d0, 4, false))));
    ck_assert(isnan(nb_item(nb_var(nb_narrow(x, 0, 0, 1), 1, d0, 1, false))));
    ck_assert(isnan(nb_item(nb_var(nb_narrow(x, 0, 0, 0), 1, d0, 0, false))));
    /* backward divides by N - correction unclamped, as torch: correction 4
     * gives (2.6667, 0.6667, -3.3333) */
    nb_set_requires_grad(x, true);
    ck_assert_int_eq(nb_backward(nb_var(x, 1, d0, 4, false)), 0);
    const double want[3] = {8.0 / 3, 2.0 / 3, -10.0 / 3};
    for (int i = 0; i < 3; i++)
        ck_assert(fabs(at(nb_grad(x), i) - want[i]) < 1e-14);
    /* std of constant values: zero gradient, as torch */
    nb_tensor *c = nb_full(NB_F64, NB_SHAPE(3), 2.0);
    nb_set_requires_grad(c, true);
    ck_assert_int_eq(nb_backward(nb_std(c, 0, NULL, 1, false)), 0);
    for (int i = 0; i < 3; i++) ck_assert(at(nb_grad(c), i) == 0);
    nb_free(c);
    nb_scope_end();
}
END_TEST

/* f32 running sums accumulate in double as torch's CPU kernel:
 * torch.cumsum([2^24, 1, 1]) is (16777216, 16777216, 16777218) */
START_TEST(test_cumsum_f32_accumulation) {
    nb_scope_begin();
    nb_tensor *x = nb_from_data(NB_F32, NB_SHAPE(3), (float[]){16777216.0f, 1, 1});
    nb_tensor *y = nb_cumsum(x, -1);
    CHECK_NOT_NULL(y);
    ck_assert(at(y, 1) == 16777216.0);
    ck_assert(at(y, 2) == 16777218.0);
    /* backward: the reverse cumsum of g */
    nb_tensor *v = nb_from_data(NB_F64, NB_SHAPE(2, 3), (double[]){1, 2, 3, 4, 5, 6});
    nb_set_requires_grad(v, true);
    nb_tensor *w = nb_from_data(NB_F64, NB_SHAPE(2, 3), (double[]){1, 10, 100, 2, 20, 200});
    ck_assert_int_eq(nb_backward(nb_sum_all(nb_mul(nb_cumsum(v, 1), w))), 0);
    const double want[6] = {111, 110, 100, 222, 220, 200};
    for (int i = 0; i < 6; i++)
        ck_assert(at(nb_grad(v), i) == want[i]);
    nb_free(v);
    nb_free(w);
    nb_scope_end();
}
END_TEST

/* ------------------------------------------------------------- sort, topk */
static void expect_values(nb_tensor *t, int n, const double *want) {
    CHECK_NOT_NULL(t);
    ck_assert_int_eq(nb_numel(t), n);
    double got[16];
    ck_assert_int_eq(nb_copy_to_f64(t, got), 0);
    for (int i = 0; i < n; i++)
        ck_assert_msg(got[i] == want[i] || (isnan(got[i]) && isnan(want[i])),
                      "element %d: %g, expected %g", i, got[i], want[i]);
}

/* Stable in both directions; NaN the largest; -0 and +0 equal (kept in order). */
START_TEST(test_sort_ties) {
    nb_scope_begin();
    nb_tensor *x = nb_from_data(NB_F64, NB_SHAPE(8),
                                (const double[]){1, NAN, -0.0, 1, 0.0, -INFINITY, NAN, 1});
    nb_tensor *idx = NULL;
    nb_tensor *a = nb_sort(x, 0, false, &idx);
    expect_values(a, 8, (const double[]){-INFINITY, -0.0, 0.0, 1, 1, 1, NAN, NAN});
    ck_assert_int_eq(nb_dtype_of(idx), NB_I64);
    expect_values(idx, 8, (const double[]){5, 2, 4, 0, 3, 7, 1, 6});
    ck_assert(signbit(nb_item(nb_select(a, 0, 1))) && !signbit(nb_item(nb_select(a, 0, 2))));
    nb_tensor *dsc = nb_sort(x, -1, true, &idx);
    expect_values(dsc, 8, (const double[]){NAN, NAN, 1, 1, 1, -0.0, 0.0, -INFINITY});
    expect_values(idx, 8, (const double[]){1, 6, 0, 3, 7, 2, 4, 5});
    /* topk: ties go to the lower index, whichever direction */
    nb_tensor *tk = nb_topk(x, 4, 0, true, true, &idx);
    expect_values(tk, 4, (const double[]){NAN, NAN, 1, 1});
    expect_values(idx, 4, (const double[]){1, 6, 0, 3});
    tk = nb_topk(x, 2, 0, false, false, &idx);
    expect_values(idx, 2, (const double[]){5, 2});
    nb_scope_end();
}
END_TEST

/* topk selects (a heap) when k <= len / 8: the same values and indices as
 * the first k of the stable sort, on slices full of ties (values from a few
 * levels), NaNs and both zeros, along a contiguous and a strided dim, both
 * directions, f32 and f64, k from 1 to past len / 8 (where it sorts). */
START_TEST(test_topk_selection_equals_sort) {
    nb_scope_begin();
    enum { ROWS = 3, LEN = 700 };
    double v[ROWS * LEN];
    uint64_t z = 12345;
    const double levels[] = {-1.5, -0.0, 0.0, 2.0, 3.25, NAN, INFINITY, -INFINITY};
    for (int i = 0; i < ROWS * LEN; i++) {
        z = z * 6364136223846793005ULL + 1442695040888963407ULL;
        int r = (int)(z >> 33) % 64;
        v[i] = r < 8 ? levels[r] : (double)(r % 23) * 0.125 + (double)((z >> 20) % 5);
    }
    for (int dt = 0; dt < 2; dt++) {
        nb_tensor *x = nb_to(nb_from_data(NB_F64, NB_SHAPE(ROWS, LEN), v), dt ? NB_F64 : NB_F32);
        const int64_t ks[] = {1, 2, 40, 87, 88, 89, 200};
        for (int d = 0; d < 2; d++) /* dim 1 contiguous; dim 0 of the transpose */
            for (int desc = 0; desc < 2; desc++)
                for (size_t q = 0; q < sizeof ks / sizeof ks[0]; q++) {
                    nb_tensor *t = d ? nb_transpose(x, 0, 1) : x;
                    int dim = d ? 0 : 1;
                    nb_tensor *si = NULL, *ti = NULL;
                    nb_tensor *s = nb_narrow(nb_sort(t, dim, desc, &si), dim, 0, ks[q]);
                    nb_tensor *tk = nb_topk(t, ks[q], dim, desc, true, &ti);
                    si = nb_narrow(si, dim, 0, ks[q]);
                    double a[ROWS * 200], b[ROWS * 200], ia[ROWS * 200], ib[ROWS * 200];
                    int64_t n = nb_numel(tk);
                    ck_assert_int_eq(n, ROWS * ks[q]);
                    ck_assert_int_eq(nb_copy_to_f64(s, a), 0);
                    ck_assert_int_eq(nb_copy_to_f64(tk, b), 0);
                    ck_assert_int_eq(nb_copy_to_f64(si, ia), 0);
                    ck_assert_int_eq(nb_copy_to_f64(ti, ib), 0);
                    for (int64_t i = 0; i < n; i++)
                        if (memcmp(&a[i], &b[i], 8) != 0 || ia[i] != ib[i])
                            ck_abort_msg("dtype %d dim %d desc %d k %lld: element %lld is %g at "
                                         "%g, the sort's %g at %g", dt, dim, desc,
                                         (long long)ks[q], (long long)i, b[i], ib[i], a[i], ia[i]);
                }
    }
    nb_scope_end();
}
END_TEST

/* The gradient lands on the picked positions; indices along a strided dim. */
START_TEST(test_sort_grad) {
    nb_scope_begin();
    nb_tensor *x = nb_from_data(NB_F64, NB_SHAPE(2, 3), (const double[]){3, 1, 2, 5, 5, 4});
    nb_set_requires_grad(x, true);
    nb_tensor *idx = NULL;
    nb_tensor *w = nb_from_data(NB_F64, NB_SHAPE(1, 3), (const double[]){10, 20, 30});
    nb_tensor *tk = nb_topk(nb_transpose(x, 0, 1), 1, 1, true, true, &idx); /* max of each col */
    expect_values(tk, 3, (const double[]){5, 5, 4});
    expect_values(idx, 3, (const double[]){1, 1, 1});
    ck_assert_int_eq(nb_backward(nb_sum_all(nb_mul(tk, nb_transpose(w, 0, 1)))), 0);
    double g[6];
    ck_assert_int_eq(nb_copy_to_f64(nb_grad(x), g), 0);
    const double want[6] = {0, 0, 0, 10, 20, 30};
    for (int i = 0; i < 6; i++) ck_assert_double_eq(g[i], want[i]);
    /* the indices are the caller's: freeing them leaves backward intact */
    nb_zero_grad(x);
    nb_tensor *s = nb_sort(x, 1, false, &idx);
    nb_free(idx);
    ck_assert_int_eq(nb_backward(nb_sum_all(nb_mul(s, w))), 0);
    ck_assert_int_eq(nb_copy_to_f64(nb_grad(x), g), 0);
    const double want2[6] = {30, 10, 20, 20, 30, 10};
    for (int i = 0; i < 6; i++) ck_assert_double_eq(g[i], want2[i]);
    nb_scope_end();
}
END_TEST

START_TEST(test_sort_errors) {
    nb_scope_begin();
    nb_tensor *x = nb_zeros(NB_F32, NB_SHAPE(3, 4)), *idx = (nb_tensor *)1;
    expect_error(nb_topk(x, 5, 1, true, true, &idx), "nb_topk: k = 5 out of range for dim 1 of size 4");
    ck_assert_ptr_null(idx);
    expect_error(nb_topk(x, -1, 0, true, true, NULL), "nb_topk", "k = -1", "size 3");
    expect_error(nb_sort(x, 2, false, NULL), "nb_sort", "dim 2 out of range");
    expect_error(nb_sort(nb_zeros(NB_I64, NB_SHAPE(3)), 0, false, NULL), "nb_sort",
                 "expected a floating tensor");
    expect_error(nb_topk(nb_scalar(NB_F64, 1), 2, 0, true, true, NULL), "nb_topk", "k = 2");
    /* 0-d: the value and index 0, for k = 0 too (as torch) */
    nb_tensor *z = nb_topk(nb_scalar(NB_F64, 2.5), 0, -1, true, true, &idx);
    expect_values(z, 1, (const double[]){2.5});
    expect_values(idx, 1, (const double[]){0});
    /* empty dim: empty results */
    z = nb_sort(nb_zeros(NB_F64, NB_SHAPE(3, 0)), 1, true, &idx);
    ck_assert_int_eq(nb_numel(z), 0);
    ck_assert_int_eq(nb_numel(idx), 0);
    nb_scope_end();
}
END_TEST

START_TEST(test_sort_no_leak) {
    int64_t live = nb_live_tensors();
    nb_scope_begin();
    nb_tensor *x = rand_leaf(3, NB_SHAPE(3, 4));
    nb_tensor *idx;
    ck_assert_int_eq(nb_backward(nb_sum_all(nb_topk(x, 2, 1, false, true, &idx))), 0);
    ck_assert_int_eq(nb_backward(nb_sum_all(nb_sort(x, 0, true, NULL))), 0);
    nb_scope_end();
    ck_assert_int_eq(nb_live_tensors(), live);
}
END_TEST

/* ------------------------------------------------------- higher order */
/* Calls beside the registry's (other dims, keepdim, directions, all dims,
 * 0-d) through nb_gradgradcheck and forward-mode gradcheck, on a (3,4)
 * leaf, contiguous and transposed. */
static nb_tensor *ho_index(void) { /* (2,4) in [0,3), read through stride 2 */
    nb_tensor *t = nb_from_data(NB_I64, NB_SHAPE(2, 8),
                                (const int64_t[]){2, 7, 0, 7, 1, 7, 1, 7, 0, 7, 2, 7, 2, 7, 0, 7});
    return nb_narrow(nb_view(t, NB_SHAPE(2, 4, 2)), 2, 0, 1);
}

static nb_tensor *f_higher(nb_tensor **in, int n, void *vctx) {
    (void)n;
    nb_tensor *x = in[0];
    switch (*(const int *)vctx) {
    case 0: return nb_max(x, 0, true);
    case 1: return nb_min(x, -1, false);
    case 2: return nb_sum(x, 0, true);
    case 3: return nb_mean(x, 1, false);
    case 4: return nb_sum_dims(x, 0, NULL, false);
    case 5: return nb_mean_dims(x, 2, (const int[]){0, 1}, true);
    case 6: return nb_var(x, 1, (const int[]){0}, 0.0, true);
    case 7: return nb_std(x, 0, NULL, 1.0, false);
    case 8: return nb_cumsum(x, 0);
    case 9: return nb_sort(x, 0, false, NULL);
    case 10: return nb_topk(x, 2, 0, false, true, NULL);
    case 11: return nb_gather(x, 0, nb_view(ho_index(), NB_SHAPE(2, 4)));
    case 12: return nb_index_select(x, 1, nb_select(nb_select(ho_index(), 2, 0), 0, 1));
    default: return nb_sort(nb_sum_all(x), 0, true, NULL); /* 0-d */
    }
}
#define NHIGHER 14

START_TEST(test_higher_order) {
    for (int layout = 0; layout < 2; layout++) {
        nb_scope_begin();
        nb_tensor *x = layout ? transposed_leaf(21, NB_SHAPE(3, 4), 0, 1)
                              : rand_leaf(21, NB_SHAPE(3, 4));
        char label[64];
        snprintf(label, sizeof label, "call %d (%s)", _i, layout ? "transposed" : "contiguous");
        int op = _i;
        expect_gradgradcheck(label, f_higher, &op, 1, &x);
        expect_forward_ad(label, f_higher, &op, 1, &x);
        nb_scope_end();
    }
}
END_TEST

/* An embedding and its tied output projection in one graph: rows of w
 * (5,3) picked by index_select (ids repeat, read through a stride) and w^T
 * used by a product. index_select's backward then finds w's gradient
 * already summed by the product, and in a plain backward adds into it in
 * place (nbi_grad_sink) when its own upstream gradient is contiguous. _i is
 * that gradient's layout: 0 transposed (the rows pass through a transpose
 * and a product), 1 stride 0 (a mean over the tokens), 2 contiguous (the
 * in-place path). w's gradient must be, bit for bit, the sum of those of an
 * untied pair of copies of w. */
static nb_tensor *tied_loss(nb_tensor *we, nb_tensor *wp, nb_tensor *ids, int layout) {
    nb_tensor *h = nb_index_select(we, 0, ids); /* (4,3) */
    if (layout == 0) {
        nb_rng r = {5, 0};
        nb_tensor *s = nb_randn(NB_F64, NB_SHAPE(3, 4), &r);
        h = nb_transpose(nb_mul(nb_transpose(h, 0, 1), s), 0, 1);
    } else if (layout == 1) {
        h = nb_mean(h, 0, true); /* (1,3) */
    }
    nb_tensor *logits = nb_matmul(h, nb_transpose(wp, 0, 1)); /* (4,5) or (1,5) */
    nb_rng r = {6, 0};
    nb_tensor *p = nb_randn(NB_F64, NB_SHAPE(nb_shape(logits)[0], 5), &r);
    return nb_sum_all(nb_mul(logits, p));
}

START_TEST(test_tied_index_select_gradient_layouts) {
    nb_scope_begin();
    nb_tensor *w = rand_leaf(31, NB_SHAPE(5, 3));
    nb_tensor *we = nb_set_requires_grad(nb_detach(nb_mul_scalar(w, 1)), true);
    nb_tensor *wp = nb_set_requires_grad(nb_detach(nb_mul_scalar(w, 1)), true);
    const int64_t cols[] = {2, 1, 0, 1, 2, 1, 4, 1};
    nb_tensor *ids = nb_select(nb_from_data(NB_I64, NB_SHAPE(4, 2), cols), 1, 0); /* 2 0 2 4 */
    CHECK_NOT_NULL(ids);
    ck_assert_int_eq(nb_backward(tied_loss(w, w, ids, _i)), 0);
    ck_assert_int_eq(nb_backward(tied_loss(we, wp, ids, _i)), 0);
    double *got = values(nb_grad(w)), *want = values(nb_add(nb_grad(we), nb_grad(wp)));
    double *part = values(nb_grad(we));
    for (int i = 0; i < 15; i++) {
        ck_assert_msg(memcmp(&got[i], &want[i], sizeof got[i]) == 0,
                      "layout %d, element %d: %.17g, expected %.17g", _i, i, got[i], want[i]);
        ck_assert(i / 3 == 0 || i / 3 == 2 || i / 3 == 4 || part[i] == 0); /* rows never picked */
    }
    free(got);
    free(want);
    free(part);
    nb_scope_end();
}
END_TEST

/* ------------------------------------------------------------ multinomial */
/* 20000 draws of a fixed distribution (a zero weight among them): every
 * frequency within 4 sigma of its probability, the zero never drawn. */
START_TEST(test_multinomial_frequencies) {
    nb_scope_begin();
    const double w[5] = {1, 0, 2, 3, 4}; /* total 10 */
    nb_tensor *p = nb_from_data(NB_F32, NB_SHAPE(2, 5),
                                (const float[]){1, 0, 2, 3, 4, 1, 0, 2, 3, 4});
    nb_rng rng;
    nb_rng_seed(&rng, 7);
    const int64_t N = 10000;
    nb_tensor *d = nb_multinomial(p, N, true, &rng);
    CHECK_NOT_NULL(d);
    ck_assert_int_eq(nb_dtype_of(d), NB_I64);
    expect_shape(d, NB_SHAPE(2, N));
    ck_assert_uint_eq(rng.offset, 2 * N);
    const int64_t *v = nb_data(d);
    int64_t count[5] = {0};
    for (int64_t i = 0; i < 2 * N; i++) {
        ck_assert(v[i] >= 0 && v[i] < 5);
        count[v[i]]++;
    }
    for (int c = 0; c < 5; c++) {
        double q = w[c] / 10, sigma = sqrt(2.0 * N * q * (1 - q));
        ck_assert_msg(fabs((double)count[c] - 2.0 * N * q) <= 4 * sigma + 1e-9,
                      "category %d drawn %lld times, expected %g (sigma %g)", c,
                      (long long)count[c], 2.0 * N * q, sigma);
    }
    /* without replacement: every nonzero category once, in some order */
    nb_tensor *all = nb_multinomial(p, 4, false, NULL);
    CHECK_NOT_NULL(all);
    const int64_t *a = nb_data(all);
    for (int row = 0; row < 2; row++) {
        int seen[5] = {0};
        for (int i = 0; i < 4; i++) seen[a[row * 4 + i]]++;
        ck_assert(seen[0] == 1 && seen[1] == 0 && seen[2] == 1 && seen[3] == 1 && seen[4] == 1);
    }
    /* the same seed, the same draws; 1-d probs give a 1-d result */
    nb_rng_seed(&rng, 7);
    nb_tensor *again = nb_multinomial(p, N, true, &rng);
    ck_assert(!memcmp(nb_data(again), v, (size_t)(2 * N) * sizeof *v));
    expect_shape(nb_multinomial(nb_select(p, 0, 1), 3, true, NULL), NB_SHAPE(3));
    nb_scope_end();
}
END_TEST

START_TEST(test_multinomial_errors) {
    nb_scope_begin();
    nb_tensor *p = nb_from_data(NB_F64, NB_SHAPE(2, 3), (const double[]){1, 2, 3, 0, 1, 0});
    expect_error(nb_multinomial(p, 2, false, NULL),
                 "nb_multinomial: cannot draw 2 samples without replacement from row 1, which "
                 "has 1 nonzero categories");
    expect_error(nb_multinomial(p, 4, false, NULL), "nb_multinomial", "4 samples", "3 categories");
    expect_error(nb_multinomial(p, 0, true, NULL), "nb_multinomial", "num_samples", "got 0");
    nb_tensor *neg = nb_from_data(NB_F64, NB_SHAPE(2, 2), (const double[]){1, 2, 3, -1});
    expect_error(nb_multinomial(neg, 1, true, NULL), "nb_multinomial: row 1 has probability -1 at 1");
    nb_tensor *nan = nb_from_data(NB_F64, NB_SHAPE(2), (const double[]){NAN, 1});
    expect_error(nb_multinomial(nan, 1, true, NULL), "nb_multinomial: row 0 has probability nan");
    nb_tensor *zero = nb_zeros(NB_F32, NB_SHAPE(3, 2));
    expect_error(nb_multinomial(zero, 1, true, NULL), "nb_multinomial: row 0 sums to 0");
    expect_error(nb_multinomial(nb_zeros(NB_F32, NB_SHAPE(1, 1, 2)), 1, true, NULL),
                 "nb_multinomial", "1-d or 2-d");
    expect_error(nb_multinomial(nb_zeros(NB_I64, NB_SHAPE(2)), 1, true, NULL), "nb_multinomial",
                 "floating");
    nb_scope_end();
}
END_TEST


Suite *suite_reduce(void) {
    Suite *s = suite_create("reduce");
    TCase *tc = tcase_create("forward");
    tcase_add_loop_test(tc, test_forward_dims, 0, 2 * NDIMS);
    tcase_add_test(tc, test_forward_all);
    tcase_add_loop_test(tc, test_forward_noncontiguous, 0,
                        (int)(sizeof view_names / sizeof view_names[0]));
    tcase_add_test(tc, test_forward_expanded);
    tcase_add_test(tc, test_argmax_ties);
    tcase_add_test(tc, test_edge_shapes);
    suite_add_tcase(s, tc);

    tc = tcase_create("autograd");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_gradcheck_contiguous);
    tcase_add_test(tc, test_gradcheck_transposed);
    tcase_add_test(tc, test_gradcheck_broadcast);
    tcase_add_test(tc, test_gradcheck_chain);
    tcase_add_loop_test(tc, test_backward_vs_torch, 0, 3 * NGRAD);
    tcase_add_test(tc, test_backward_all_vs_torch);
    tcase_add_test(tc, test_max_grad_first_tie);
    tcase_add_test(tc, test_recording);
    tcase_add_test(tc, test_no_leak);
    suite_add_tcase(s, tc);

    tc = tcase_create("errors");
    tcase_add_test(tc, test_error_dim);
    tcase_add_test(tc, test_error_dtype);
    tcase_add_test(tc, test_error_empty_max);
    tcase_add_test(tc, test_error_null);
    suite_add_tcase(s, tc);

    tc = tcase_create("more");
    tcase_add_test(tc, test_min_ties_nan);
    tcase_add_test(tc, test_reduce_dims_shapes_errors);
    tcase_add_test(tc, test_var_correction);
    tcase_add_test(tc, test_cumsum_f32_accumulation);
    suite_add_tcase(s, tc);

    tc = tcase_create("sort");
    tcase_add_test(tc, test_sort_ties);
    tcase_add_test(tc, test_topk_selection_equals_sort);
    tcase_add_test(tc, test_sort_grad);
    tcase_add_test(tc, test_sort_errors);
    tcase_add_test(tc, test_sort_no_leak);
    suite_add_tcase(s, tc);

    tc = tcase_create("higher order");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_higher_order, 0, NHIGHER);
    tcase_add_loop_test(tc, test_tied_index_select_gradient_layouts, 0, 3);
    suite_add_tcase(s, tc);

    tc = tcase_create("multinomial");
    tcase_add_test(tc, test_multinomial_frequencies);
    tcase_add_test(tc, test_multinomial_errors);
    suite_add_tcase(s, tc);
    return s;
}
