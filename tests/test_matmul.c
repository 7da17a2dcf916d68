/* test_matmul.c: nb_matmul against torch.matmul (tests/fixtures/gen_matmul.py):
 * forward values in f64 and f32 for every rank combination, broadcast batch
 * dims, zero sizes and non-contiguous operands read in place; backward values
 * against torch autograd; nb_gradcheck, nb_gradgradcheck and forward-mode
 * gradcheck on contiguous, transposed and broadcast inputs; the tangent and
 * double backward of bf16 and autocast products; and the error messages of
 * bad input. */
#include <stdlib.h>
#include <string.h>

#include "ops/gemm_internal.h" /* to force each kernel path */
#include "test_util.h"

static const char *FX = "matmul.txt";

static nb_tensor *fxc(const char *cs, const char *suffix) {
    char name[96];
    snprintf(name, sizeof name, "%s_%s", cs, suffix);
    return fx(FX, name);
}

#define CHECK_NOT_NULL(t) ck_assert_msg((t) != NULL, "%s", nb_last_error() ? nb_last_error() : "?")

/* ------------------------------------------------------------ forward values */
/* Cases whose operands are the stored inputs themselves. */
static const char *const plain_cases[] = {
    "dot", "vm", "mv", "mm", "mm_big", "bmm", "bcast", "b3m2", "m2b3", "vb3", "b3v",
    "zero_m", "zero_k", "zero_b",
};
#define NPLAIN (int)(sizeof plain_cases / sizeof plain_cases[0])

START_TEST(test_forward_fixtures) {
    const char *cs = plain_cases[_i];
    nb_tensor *a = fxc(cs, "a"), *b = fxc(cs, "b"), *out = fxc(cs, "out");
    nb_tensor *a32 = fxc(cs, "a32"), *b32 = fxc(cs, "b32"), *out32 = fxc(cs, "out32");
    nb_scope_begin();
    nb_tensor *c = nb_matmul(a, b);
    expect_close(c, out, 1e-12, 1e-12);
    ck_assert_int_eq(nb_dtype_of(c), NB_F64);
    ck_assert(nb_is_contiguous(c));
    ck_assert(!nb_requires_grad(c));
    nb_tensor *c32 = nb_matmul(a32, b32);
    expect_close(c32, out32, 1e-5, 1e-5);
    ck_assert_int_eq(nb_dtype_of(c32), NB_F32);
    nb_scope_end();
}
END_TEST

/* (2,0)x(0,3): an empty sum is 0, even in memory that held garbage. */
START_TEST(test_zero_inner_is_zeros) {
    nb_scope_begin();
    for (int dt = NB_F32; dt <= NB_F64; dt++) {
        nb_tensor *a = nb_empty((nb_dtype)dt, NB_SHAPE(2, 0)), *b = nb_empty((nb_dtype)dt, NB_SHAPE(0, 3));
        nb_tensor *c = nb_matmul(a, b);
        CHECK_NOT_NULL(c);
        ck_assert_int_eq(nb_ndim(c), 2);
        ck_assert_int_eq(nb_shape(c)[0], 2);
        ck_assert_int_eq(nb_shape(c)[1], 3);
        double v[6];
        ck_assert_int_eq(nb_copy_to_f64(c, v), 0);
        for (int i = 0; i < 6; i++) ck_assert(v[i] == 0.0);
    }
    nb_scope_end();
}
END_TEST

static void expect_shape(nb_tensor *t, int ndim, const int64_t *shape) {
    CHECK_NOT_NULL(t);
    ck_assert_int_eq(nb_ndim(t), ndim);
    for (int i = 0; i < ndim; i++)
        ck_assert_msg(nb_shape(t)[i] == shape[i], "dim %d: %lld, expected %lld", i,
                      (long long)nb_shape(t)[i], (long long)shape[i]);
}

START_TEST(test_output_shapes) {
    nb_scope_begin();
#define MM(sa, sb) nb_matmul(nb_zeros(NB_F64, NB_SHAPE sa), nb_zeros(NB_F64, NB_SHAPE sb))
    nb_tensor *c = MM((7), (7));
    CHECK_NOT_NULL(c);
    ck_assert_int_eq(nb_ndim(c), 0);
    ck_assert_int_eq(nb_numel(c), 1);
    expect_shape(MM((3), (3, 4)), NB_SHAPE(4));
    expect_shape(MM((2, 3), (3)), NB_SHAPE(2));
    expect_shape(MM((2, 3), (3, 4)), NB_SHAPE(2, 4));
    expect_shape(MM((2, 3, 4), (4)), NB_SHAPE(2, 3));
    expect_shape(MM((4), (2, 4, 3)), NB_SHAPE(2, 3));
    expect_shape(MM((1, 5, 2, 3), (4, 1, 3, 6)), NB_SHAPE(4, 5, 2, 6));
    expect_shape(MM((2, 1, 3, 4), (5, 4, 2)), NB_SHAPE(2, 5, 3, 2));
    expect_shape(MM((6, 2, 3), (3, 4)), NB_SHAPE(6, 2, 4));
    expect_shape(MM((2, 3), (6, 3, 4)), NB_SHAPE(6, 2, 4));
    expect_shape(MM((2, 3), (3, 0)), NB_SHAPE(2, 0));
    expect_shape(MM((0, 2, 3), (1, 3, 4)), NB_SHAPE(0, 2, 4));
    expect_shape(MM((1, 1, 1, 1, 1, 1, 2, 3), (3, 4)), NB_SHAPE(1, 1, 1, 1, 1, 1, 2, 4));
    expect_shape(MM((2, 1, 1, 1, 1, 1, 2, 3), (3, 1, 1, 1, 1, 3, 4)),
                 NB_SHAPE(2, 3, 1, 1, 1, 1, 2, 4));
#undef MM
    nb_scope_end();
}
END_TEST

/* ---------------------------------------------------- non-contiguous operands */
/* Each view is made from the stored (contiguous) data, and matmul must not
 * copy it: only the output is a new tensor object. */
typedef nb_tensor *(*view_fn)(nb_tensor *);
static nb_tensor *v_same(nb_tensor *t) { return t; }
static nb_tensor *v_t(nb_tensor *t) { return nb_transpose(t, 0, 1); }
static nb_tensor *v_exp(nb_tensor *t) { return nb_expand(t, NB_SHAPE(3, 4, 2)); }
static nb_tensor *v_nar(nb_tensor *t) { return nb_narrow(t, 1, 1, 4); }

static void check_view_case(const char *cs, view_fn fa, view_fn fb) {
    const char *sfx[2][3] = {{"a", "b", "out"}, {"a32", "b32", "out32"}};
    for (int p = 0; p < 2; p++) {
        nb_tensor *a = fxc(cs, sfx[p][0]), *b = fxc(cs, sfx[p][1]), *out = fxc(cs, sfx[p][2]);
        nb_scope_begin();
        nb_tensor *va = fa(a), *vb = fb(b);
        CHECK_NOT_NULL(va);
        CHECK_NOT_NULL(vb);
        ck_assert_msg(!(nb_is_contiguous(va) && nb_is_contiguous(vb)),
                      "%s: expected a non-contiguous operand", cs);
        int64_t live = nb_live_tensors();
        nb_tensor *c = nb_matmul(va, vb);
        ck_assert_msg(nb_live_tensors() == live + 1,
                      "%s: nb_matmul made %lld tensor objects (expected only its output): "
                      "an operand was copied", cs, (long long)(nb_live_tensors() - live));
        if (p == 0) expect_close(c, out, 1e-12, 1e-12);
        else expect_close(c, out, 1e-5, 1e-5);
        nb_scope_end();
    }
}

START_TEST(test_transposed_b_in_place) {
    nb_tensor *b = fxc("tr_b", "b");
    nb_scope_begin();
    nb_tensor *bt = nb_transpose(b, 0, 1);
    CHECK_NOT_NULL(bt);
    ck_assert(!nb_is_contiguous(bt));
    ck_assert(nb_data(bt) == nb_data(b)); /* a view of the same memory */
    nb_scope_end();
    check_view_case("tr_b", v_same, v_t);
}
END_TEST

START_TEST(test_transposed_a_in_place) { check_view_case("tr_a", v_t, v_same); }
END_TEST

START_TEST(test_transposed_both_in_place) { check_view_case("tr_ab", v_t, v_t); }
END_TEST

START_TEST(test_expanded_b_in_place) { check_view_case("exp_b", v_same, v_exp); }
END_TEST

START_TEST(test_narrowed_a_in_place) { check_view_case("nar_a", v_nar, v_same); }
END_TEST

/* ------------------------------------------------------------------- autograd */
static nb_tensor *f_mm(nb_tensor **in, int n, void *ctx) {
    (void)n, (void)ctx;
    return nb_matmul(in[0], in[1]);
}
static nb_tensor *f_mm_tb(nb_tensor **in, int n, void *ctx) { /* a @ b.t() */
    (void)n, (void)ctx;
    return nb_matmul(in[0], nb_transpose(in[1], 0, 1));
}
static nb_tensor *f_mm_ta(nb_tensor **in, int n, void *ctx) { /* a.t() @ b */
    (void)n, (void)ctx;
    return nb_matmul(nb_transpose(in[0], 0, 1), in[1]);
}
static nb_tensor *f_mm_exp(nb_tensor **in, int n, void *ctx) { /* a @ b.expand(2,K,N) */
    (void)n, (void)ctx;
    nb_tensor *b = in[1];
    return nb_matmul(in[0], nb_expand(b, NB_SHAPE(2, nb_shape(b)[0], nb_shape(b)[1])));
}

/* A leaf that is itself a non-contiguous view: randn data, transposed. */
static nb_tensor *transposed_matrix_leaf(uint64_t seed, int64_t rows, int64_t cols) {
    nb_rng r;
    nb_rng_seed(&r, seed);
    nb_tensor *t = nb_transpose(nb_randn(NB_F64, NB_SHAPE(cols, rows), &r), 0, 1);
    CHECK_NOT_NULL(t);
    ck_assert(nb_is_leaf(t));
    ck_assert(!nb_is_contiguous(t));
    return nb_set_requires_grad(t, true);
}

START_TEST(test_gradcheck_contiguous) {
    nb_scope_begin();
    nb_tensor *in[2];
    in[0] = rand_leaf(1, NB_SHAPE(2, 3));
    in[1] = rand_leaf(2, NB_SHAPE(3, 4));
    expect_all_orders("nb_matmul 2-D contiguous", f_mm, NULL, 2, in);
    in[0] = rand_leaf(3, NB_SHAPE(2, 3, 4));
    in[1] = rand_leaf(4, NB_SHAPE(2, 4, 2));
    expect_all_orders("nb_matmul batched 3-D", f_mm, NULL, 2, in);
    nb_scope_end();
}
END_TEST

START_TEST(test_gradcheck_transposed) {
    nb_scope_begin();
    nb_tensor *in[2];
    /* transposed inside the function: the graph goes through nb_transpose */
    in[0] = rand_leaf(5, NB_SHAPE(2, 3));
    in[1] = rand_leaf(6, NB_SHAPE(4, 3));
    expect_all_orders("nb_matmul 2-D transposed", f_mm_tb, NULL, 2, in);
    in[0] = rand_leaf(7, NB_SHAPE(3, 2));
    in[1] = rand_leaf(8, NB_SHAPE(3, 4));
    expect_all_orders("nb_matmul 2-D transposed a", f_mm_ta, NULL, 2, in);
    /* leaves that are themselves transposed views */
    in[0] = transposed_matrix_leaf(9, 2, 3);
    in[1] = transposed_matrix_leaf(10, 3, 4);
    expect_all_orders("nb_matmul 2-D transposed leaves", f_mm, NULL, 2, in);
    in[0] = transposed_matrix_leaf(11, 3, 2);
    in[1] = rand_leaf(12, NB_SHAPE(3, 3));
    expect_all_orders("nb_matmul transposed leaf, transposed again", f_mm_ta, NULL, 2, in);
    nb_scope_end();
}
END_TEST

START_TEST(test_gradcheck_broadcast) {
    nb_scope_begin();
    nb_tensor *in[2];
    in[0] = rand_leaf(13, NB_SHAPE(2, 1, 2, 3));
    in[1] = rand_leaf(14, NB_SHAPE(3, 3, 2));
    expect_all_orders("nb_matmul batched broadcast", f_mm, NULL, 2, in);
    in[0] = rand_leaf(15, NB_SHAPE(2, 3, 4));
    in[1] = rand_leaf(16, NB_SHAPE(4, 2));
    expect_all_orders("nb_matmul 3-D x 2-D", f_mm, NULL, 2, in);
    in[0] = rand_leaf(17, NB_SHAPE(2, 3));
    in[1] = rand_leaf(18, NB_SHAPE(2, 3, 2));
    expect_all_orders("nb_matmul 2-D x 3-D", f_mm, NULL, 2, in);
    in[0] = rand_leaf(19, NB_SHAPE(2, 3));
    in[1] = rand_leaf(20, NB_SHAPE(3, 2));
    expect_all_orders("nb_matmul expanded (stride-0) operand", f_mm_exp, NULL, 2, in);
    nb_scope_end();
}
END_TEST

START_TEST(test_gradcheck_1d) {
    nb_scope_begin();
    nb_tensor *in[2];
    in[0] = rand_leaf(21, NB_SHAPE(3));
    in[1] = rand_leaf(22, NB_SHAPE(3, 2));
    expect_all_orders("nb_matmul 1-D x 2-D", f_mm, NULL, 2, in);
    in[0] = rand_leaf(23, NB_SHAPE(2, 3));
    in[1] = rand_leaf(24, NB_SHAPE(3));
    expect_all_orders("nb_matmul 2-D x 1-D", f_mm, NULL, 2, in);
    in[0] = rand_leaf(25, NB_SHAPE(4));
    in[1] = rand_leaf(26, NB_SHAPE(4));
    expect_all_orders("nb_matmul 1-D dot", f_mm, NULL, 2, in);
    in[0] = rand_leaf(27, NB_SHAPE(3));
    in[1] = rand_leaf(28, NB_SHAPE(2, 3, 2));
    expect_all_orders("nb_matmul 1-D x 3-D", f_mm, NULL, 2, in);
    in[0] = rand_leaf(29, NB_SHAPE(2, 2, 3));
    in[1] = rand_leaf(30, NB_SHAPE(3));
    expect_all_orders("nb_matmul 3-D x 1-D", f_mm, NULL, 2, in);
    nb_scope_end();
}
END_TEST

START_TEST(test_gradcheck_one_input) {
    nb_scope_begin();
    nb_tensor *in[2];
    nb_rng r;
    nb_rng_seed(&r, 31);
    in[0] = rand_leaf(32, NB_SHAPE(2, 3));
    in[1] = nb_randn(NB_F64, NB_SHAPE(3, 2), &r); /* constant: no gradient wanted */
    expect_all_orders("nb_matmul only a requires grad", f_mm, NULL, 2, in);
    in[0] = nb_randn(NB_F64, NB_SHAPE(2, 1, 3), &r);
    in[1] = rand_leaf(33, NB_SHAPE(2, 3, 2));
    expect_all_orders("nb_matmul only b requires grad", f_mm, NULL, 2, in);
    ck_assert(nb_grad(in[0]) == NULL);
    nb_scope_end();
}
END_TEST

/* loss = sum(matmul(a, b) * w); a.grad and b.grad against torch autograd. */
static const char *const grad_cases[] = {"grad_bcast", "grad_vb3", "grad_b3v"};

START_TEST(test_backward_vs_torch) {
    const char *cs = grad_cases[_i];
    nb_tensor *fa = fxc(cs, "a"), *fb = fxc(cs, "b"), *fw = fxc(cs, "w");
    nb_tensor *want[2][2] = {{fxc(cs, "ga"), fxc(cs, "gb")}, {fxc(cs, "ga32"), fxc(cs, "gb32")}};
    for (int p = 0; p < 2; p++) {
        nb_dtype dt = p ? NB_F32 : NB_F64;
        double tol = p ? 1e-5 : 1e-12;
        nb_scope_begin();
        nb_tensor *a = nb_set_requires_grad(nb_to(nb_detach(fa), dt), true);
        nb_tensor *b = nb_set_requires_grad(nb_to(nb_detach(fb), dt), true);
        nb_tensor *w = nb_to(fw, dt);
        CHECK_NOT_NULL(a);
        CHECK_NOT_NULL(b);
        nb_tensor *out = nb_matmul(a, b);
        CHECK_NOT_NULL(out);
        ck_assert(nb_requires_grad(out));
        ck_assert(!nb_is_leaf(out));
        nb_tensor *loss = nb_sum_all(nb_mul(out, w));
        ck_assert_msg(nb_backward(loss) == 0, "%s", nb_last_error());
        expect_close(nb_grad(a), want[p][0], tol, tol);
        expect_close(nb_grad(b), want[p][1], tol, tol);
        ck_assert(!nb_requires_grad(fa)); /* the fixtures were not touched */
        nb_scope_end();
    }
}
END_TEST

/* Forward mode with both tangents at once (gradcheck moves one input at a
 * time): ta b + a tb, broadcast batch dims and a transposed tangent. */
START_TEST(test_jvp_both_tangents) {
    nb_scope_begin();
    nb_tensor *in[2] = {rand_leaf(45, NB_SHAPE(2, 3, 4)), rand_leaf(46, NB_SHAPE(4, 2))};
    nb_tensor *tan[2] = {rand_leaf(47, NB_SHAPE(2, 3, 4)), transposed_matrix_leaf(48, 4, 2)};
    nb_tensor *out, *t;
    ck_assert_msg(nb_jvp(f_mm, NULL, 2, in, tan, &out, &t) == 0, "%s", nb_last_error());
    nb_tensor *want = nb_add(nb_matmul(tan[0], in[1]), nb_matmul(in[0], tan[1]));
    expect_close(t, want, 1e-14, 1e-14);
    expect_close(out, nb_matmul(in[0], in[1]), 0, 0);
    nb_scope_end();
}
END_TEST

/* bf16 products, plain (bf16 result) and under autocast (f32 result from f32
 * operands): the tangent ta b + a tb and a second derivative through a
 * create_graph backward come out in the product's dtype, near the same sums
 * in f64 of the bf16-rounded values. */
static nb_tensor *f_mm_autocast(nb_tensor **in, int n, void *ctx) {
    (void)n, (void)ctx;
    if (nb_autocast_begin(NB_BF16)) return NULL;
    nb_tensor *y = nb_matmul(in[0], in[1]);
    nb_autocast_end();
    return y;
}

static nb_tensor *rounded_f64(nb_tensor *t) { return nb_to(nb_to(t, NB_BF16), NB_F64); }

START_TEST(test_bf16_orders) {
    for (int ac = 0; ac < 2; ac++) {
        nb_scope_begin();
        nb_rng r;
        nb_rng_seed(&r, 50);
        nb_tensor *a64 = rounded_f64(nb_randn(NB_F64, NB_SHAPE(3, 4), &r));
        nb_tensor *b64 = rounded_f64(nb_randn(NB_F64, NB_SHAPE(4, 2), &r));
        nb_tensor *ta64 = rounded_f64(nb_randn(NB_F64, NB_SHAPE(3, 4), &r));
        nb_tensor *tb64 = rounded_f64(nb_randn(NB_F64, NB_SHAPE(4, 2), &r));
        nb_tensor *w64 = rounded_f64(nb_randn(NB_F64, NB_SHAPE(3, 2), &r));
        nb_tensor *u64 = rounded_f64(nb_randn(NB_F64, NB_SHAPE(3, 4), &r));
        nb_dtype in_dt = ac ? NB_F32 : NB_BF16, out_dt = ac ? NB_F32 : NB_BF16;
        nb_fn fn = ac ? f_mm_autocast : f_mm;
        nb_tensor *in[2] = {nb_to(a64, in_dt), nb_to(b64, in_dt)};
        nb_tensor *tan[2] = {nb_to(ta64, in_dt), nb_to(tb64, in_dt)}, *out, *t;
        ck_assert_msg(nb_jvp(fn, NULL, 2, in, tan, &out, &t) == 0, "%s", nb_last_error());
        ck_assert_int_eq(nb_dtype_of(t), out_dt);
        nb_tensor *want = nb_add(nb_matmul(ta64, b64), nb_matmul(a64, tb64));
        expect_close(nb_to(t, NB_F64), want, 0.05, 0.02);
        /* d<u, dA>/dB with dA = w Bᵀ the create_graph gradient of <w, A B>: uᵀ w */
        nb_set_requires_grad(in[0], true);
        nb_set_requires_grad(in[1], true);
        nb_tensor *y = fn(in, 2, NULL), *da = NULL, *db = NULL, *w = nb_to(w64, out_dt);
        CHECK_NOT_NULL(y);
        ck_assert_msg(nb_autograd_grad(&y, 1, &w, &in[0], 1,
                                       &(nb_backward_opts){.create_graph = true}, &da) == 0,
                      "%s", nb_last_error());
        ck_assert(nb_requires_grad(da));
        ck_assert_int_eq(nb_dtype_of(da), in_dt);
        nb_tensor *u = nb_to(u64, in_dt);
        ck_assert_msg(nb_autograd_grad(&da, 1, &u, &in[1], 1, NULL, &db) == 0, "%s",
                      nb_last_error());
        ck_assert_int_eq(nb_dtype_of(db), in_dt);
        expect_close(nb_to(db, NB_F64), nb_matmul(nb_transpose(u64, 0, 1), w64), 0.05, 0.02);
        nb_scope_end();
    }
}
END_TEST

START_TEST(test_no_grad_records_nothing) {
    nb_scope_begin();
    nb_tensor *a = rand_leaf(40, NB_SHAPE(2, 3)), *b = rand_leaf(41, NB_SHAPE(3, 2));
    nb_set_grad_enabled(false);
    nb_tensor *c = nb_matmul(a, b);
    nb_set_grad_enabled(true);
    CHECK_NOT_NULL(c);
    ck_assert(!nb_requires_grad(c));
    ck_assert(nb_is_leaf(c));
    nb_tensor *d = nb_matmul(a, b);
    ck_assert(nb_requires_grad(d));
    ck_assert(!nb_is_leaf(d));
    nb_scope_end();
}
END_TEST

START_TEST(test_in_place_write_after_use) {
    /* backward reads both inputs: writing one after the forward is caught */
    nb_scope_begin();
    nb_tensor *a = rand_leaf(42, NB_SHAPE(2, 3)), *b = nb_ones(NB_F64, NB_SHAPE(3, 2));
    nb_tensor *loss = nb_sum_all(nb_matmul(a, b));
    CHECK_NOT_NULL(loss);
    ck_assert_int_eq(nb_copy_into(b, nb_scalar(NB_F64, 2.0)), 0);
    ck_assert_int_eq(nb_backward(loss), -1);
    ck_assert_ptr_nonnull(strstr(nb_last_error(), "nb_matmul"));
    ck_assert_ptr_nonnull(strstr(nb_last_error(), "modified in place"));
    nb_clear_error();
    nb_scope_end();
}
END_TEST

START_TEST(test_no_leak) {
    int64_t live = nb_live_tensors();
    nb_scope_begin();
    nb_tensor *a = rand_leaf(43, NB_SHAPE(1, 1, 3)), *b = rand_leaf(44, NB_SHAPE(2, 3, 2));
    ck_assert_int_eq(nb_backward(nb_sum_all(nb_matmul(a, b))), 0);
    ck_assert_int_eq(nb_backward(nb_sum_all(nb_matmul(a, b))), 0); /* accumulates */
    double g[3], b0[12];
    nb_copy_to_f64(nb_grad(a), g);
    nb_copy_to_f64(b, b0);
    for (int k = 0; k < 3; k++) /* a is broadcast over b's 2 batches; two backward calls add up */
        ck_assert_double_eq_tol(g[k], 2 * (b0[k * 2] + b0[k * 2 + 1] + b0[6 + k * 2] +
                                           b0[6 + k * 2 + 1]), 1e-12);
    nb_scope_end();
    ck_assert_int_eq(nb_live_tensors(), live);
}
END_TEST

/* --------------------------------------------------------------------- errors */
START_TEST(test_error_inner_mismatch) {
    nb_scope_begin();
    nb_tensor *a = nb_zeros(NB_F64, NB_SHAPE(2, 3)), *b = nb_zeros(NB_F64, NB_SHAPE(4, 5));
    expect_error(nb_matmul(a, b), "nb_matmul: shapes (2,3) and (4,5) cannot be multiplied (3 != 4)");
    expect_error(nb_matmul(nb_zeros(NB_F32, NB_SHAPE(3)), nb_zeros(NB_F32, NB_SHAPE(4))),
                 "nb_matmul: shapes (3) and (4) cannot be multiplied (3 != 4)");
    expect_error(nb_matmul(nb_zeros(NB_F64, NB_SHAPE(2, 3)), nb_zeros(NB_F64, NB_SHAPE(2))),
                 "nb_matmul", "(2,3) and (2)", "(3 != 2)");
    expect_error(nb_matmul(nb_zeros(NB_F64, NB_SHAPE(5)), nb_zeros(NB_F64, NB_SHAPE(2, 4, 3))),
                 "nb_matmul", "(5) and (2,4,3)", "(5 != 4)");
    expect_error(nb_matmul(nb_zeros(NB_F64, NB_SHAPE(3, 4)), nb_transpose(b, 0, 1)),
                 "nb_matmul", "(3,4) and (5,4)", "(4 != 5)");
    nb_scope_end();
}
END_TEST

START_TEST(test_error_batch_broadcast) {
    nb_scope_begin();
    nb_tensor *a = nb_zeros(NB_F64, NB_SHAPE(2, 3, 4)), *b = nb_zeros(NB_F64, NB_SHAPE(3, 4, 5));
    expect_error(nb_matmul(a, b), "nb_matmul", "cannot be broadcast", "2", "3");
    a = nb_zeros(NB_F64, NB_SHAPE(2, 2, 3, 4));
    b = nb_zeros(NB_F64, NB_SHAPE(3, 1, 4, 5));
    expect_error(nb_matmul(a, b), "nb_matmul", "cannot be broadcast");
    nb_scope_end();
}
END_TEST

START_TEST(test_error_dtypes) {
    nb_scope_begin();
    nb_tensor *f32 = nb_zeros(NB_F32, NB_SHAPE(2, 3)), *f64 = nb_zeros(NB_F64, NB_SHAPE(3, 2));
    expect_error(nb_matmul(f32, f64), "nb_matmul", "dtype mismatch", "f32", "f64");
    expect_error(nb_matmul(f64, f32), "nb_matmul", "dtype mismatch", "f64", "f32");
    nb_tensor *i64 = nb_zeros(NB_I64, NB_SHAPE(3, 2)), *bl = nb_zeros(NB_BOOL, NB_SHAPE(3, 2));
    expect_error(nb_matmul(nb_zeros(NB_I64, NB_SHAPE(2, 3)), i64), "nb_matmul", "floating",
                 "i64");
    expect_error(nb_matmul(f64, i64), "nb_matmul", "floating", "i64");
    expect_error(nb_matmul(nb_zeros(NB_F64, NB_SHAPE(2, 3)), bl), "nb_matmul", "floating",
                 "bool");
    nb_scope_end();
}
END_TEST

START_TEST(test_error_0d) {
    nb_scope_begin();
    nb_tensor *s = nb_scalar(NB_F64, 2.0), *v = nb_zeros(NB_F64, NB_SHAPE(3));
    expect_error(nb_matmul(s, v),
                 "nb_matmul: both arguments must be at least 1-d, got shapes () and (3)");
    expect_error(nb_matmul(v, s),
                 "nb_matmul: both arguments must be at least 1-d, got shapes (3) and ()");
    expect_error(nb_matmul(s, s), "nb_matmul", "at least 1-d", "() and ()");
    nb_scope_end();
}
END_TEST

START_TEST(test_error_overflow) {
    /* (2^32,1) x (1,2^32) -> 2^64 elements: too many to count, nothing allocated */
    nb_scope_begin();
    int64_t big = (int64_t)1 << 32;
    nb_tensor *one = nb_zeros(NB_F64, NB_SHAPE(1, 1));
    nb_tensor *a = nb_expand(one, NB_SHAPE(big, 1)), *b = nb_expand(one, NB_SHAPE(1, big));
    CHECK_NOT_NULL(a);
    CHECK_NOT_NULL(b);
    expect_error(nb_matmul(a, b), "nb_matmul", "int64");
    nb_scope_end();
}
END_TEST

START_TEST(test_error_null_keeps_first) {
    nb_scope_begin();
    nb_clear_error();
    nb_tensor *x = nb_zeros(NB_F64, NB_SHAPE(2, 2));
    expect_error(nb_matmul(NULL, x), "nb_matmul: input 0 is NULL");
    expect_error(nb_matmul(x, NULL), "nb_matmul: input 1 is NULL");
    expect_error(nb_matmul(NULL, NULL), "nb_matmul");
    /* a chain: the first failure's message survives the NULL-propagating calls */
    nb_tensor *bad = nb_matmul(x, nb_zeros(NB_F64, NB_SHAPE(3, 2)));
    ck_assert_ptr_null(bad);
    char first[512];
    snprintf(first, sizeof first, "%s", nb_last_error());
    ck_assert_ptr_nonnull(strstr(first, "(2 != 3)"));
    ck_assert_ptr_null(nb_matmul(bad, x));
    expect_error_after("nb_matmul: input 0 is NULL", first);
    ck_assert_ptr_null(nb_matmul(x, nb_matmul(bad, x)));
    expect_error_after("nb_matmul: input 1 is NULL", first);
    nb_clear_error();
    nb_scope_end();
}
END_TEST


/* Every instruction-set path of the kernel (forced in turn; a path the CPU
 * lacks falls back to the portable one) against a plain double-precision
 * reference, on sizes that leave edge tiles and K beyond one cache block,
 * with B read through a transposed view. */

static void reference(const nb_tensor *a, const nb_tensor *b, double *out) {
    int64_t M = nb_shape(a)[0], K = nb_shape(a)[1], N = nb_shape(b)[1];
    double *x = values(a), *y = values(b);
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double acc = 0;
            for (int64_t k = 0; k < K; k++) acc += x[i * K + k] * y[k * N + j];
            out[i * N + j] = acc;
        }
    free(x);
    free(y);
}

START_TEST(test_every_kernel_path) {
    static const int64_t shapes[][3] = {{37, 70, 45}, {5, 400, 3}, {1, 1, 1}, {17, 9, 33}, {96, 800, 40}};
#if defined(__aarch64__)
    int paths[3] = {NBI_GEMM_PORTABLE, NBI_GEMM_NEON, NBI_GEMM_SVE};
#else
    int paths[3] = {NBI_GEMM_PORTABLE, NBI_GEMM_AVX2, NBI_GEMM_AVX512};
#endif
    for (int p = 0; p < 3; p++) {
        int used = nbi_gemm_path(paths[p]);
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
            int64_t M = shapes[s][0], K = shapes[s][1], N = shapes[s][2];
            for (int f64 = 0; f64 < 2; f64++) {
                nb_scope_begin();
                nb_rng r;
                nb_rng_seed(&r, 100 + s);
                nb_dtype dt = f64 ? NB_F64 : NB_F32;
                nb_tensor *a = nb_randn(dt, NB_SHAPE(M, K), &r);
                nb_tensor *bt = nb_randn(dt, NB_SHAPE(N, K), &r);
                nb_tensor *b = nb_transpose(bt, 0, 1); /* (K, N), strided */
                nb_tensor *c = nb_matmul(a, b), *c2 = nb_matmul(a, b);
                ck_assert_msg(c != NULL, "%s", nb_last_error());
                double *want = malloc((size_t)(M * N) * sizeof *want), *got = values(c), *got2 = values(c2);
                reference(a, nb_contiguous(b), want);
                for (int64_t i = 0; i < M * N; i++) {
                    double tol = (f64 ? 1e-12 : 1e-4) * (1 + sqrt((double)K));
                    ck_assert_msg(fabs(got[i] - want[i]) <= tol,
                                  "path %d, %s (%lld,%lld)x(%lld,%lld), element %lld: %.9g vs %.9g",
                                  used, f64 ? "f64" : "f32", (long long)M, (long long)K,
                                  (long long)K, (long long)N, (long long)i, got[i], want[i]);
                    ck_assert(got[i] == got2[i]); /* same path, same bits */
                }
                free(want);
                free(got);
                free(got2);
                nb_scope_end();
            }
        }
    }
    nbi_gemm_path(NBI_GEMM_AUTO);
}
END_TEST

/* One-row and one-column products (x W^T, W x: generation's shapes) take
 * gemv.c where the CPU has its path: the bits must be those of the general
 * kernel (here: row 0 of a 3-row product, which packs), for f32, bf16 x bf16
 * and autocast (f32 x with bf16 W); x strided (a column of a matrix) too;
 * the same on 1 and 2 threads; and the values near a double reference. */
static bool same_bits(nb_tensor *a, nb_tensor *b) {
    nb_tensor *x = nb_contiguous(nb_to(a, NB_F32)), *y = nb_contiguous(nb_to(b, NB_F32));
    return x && y && nb_numel(x) == nb_numel(y) &&
           !memcmp(nb_data(x), nb_data(y), (size_t)nb_numel(x) * sizeof(float));
}

START_TEST(test_gemv_bits_of_gemm) {
    static const int64_t Ks[] = {1, 2, 15, 16, 17, 33, 300, 1001};
    static const int64_t Ns[] = {1, 5, 16, 17, 33, 100};
    for (int mode = 0; mode < 3; mode++) /* f32; bf16 x bf16; autocast, bf16 W */
        for (size_t a = 0; a < sizeof Ks / sizeof *Ks; a++)
            for (size_t b = 0; b < sizeof Ns / sizeof *Ns; b++) {
                int64_t K = Ks[a], N = Ns[b];
                nb_scope_begin();
                nb_rng r;
                nb_rng_seed(&r, (uint64_t)(K * 1000 + N));
                nb_tensor *w = nb_randn(NB_F32, NB_SHAPE(N, K), &r);
                nb_tensor *x3 = nb_randn(NB_F32, NB_SHAPE(3, K), &r);
                nb_tensor *xs = nb_transpose(nb_randn(NB_F32, NB_SHAPE(K, 2), &r), 0, 1);
                if (mode >= 1) w = nb_to(w, NB_BF16);
                if (mode == 1) x3 = nb_to(x3, NB_BF16), xs = nb_to(xs, NB_BF16);
                if (mode == 2) ck_assert_int_eq(nb_autocast_begin(NB_BF16), 0);
                nb_tensor *wt = nb_transpose(w, 0, 1);
                nb_tensor *gemm = nb_narrow(nb_matmul(x3, wt), 0, 0, 1);  /* (1,N) packed */
                nb_tensor *row = nb_matmul(nb_narrow(x3, 0, 0, 1), wt);    /* (1,N) gemv */
                nb_tensor *col = nb_matmul(w, nb_select(x3, 0, 0));        /* (N) gemv */
                nb_tensor *gs = nb_narrow(nb_matmul(xs, wt), 0, 0, 1);
                nb_tensor *rs = nb_matmul(nb_narrow(xs, 0, 0, 1), wt);     /* x strided */
                nb_tensor *cs = nb_matmul(w, nb_select(xs, 0, 0));
                /* x W with W's rows contiguous (the x W form: f32 only, bf16 packs) */
                nb_tensor *w2 = nb_contiguous(wt);
                nb_tensor *gv = nb_narrow(nb_matmul(x3, w2), 0, 0, 1);
                nb_tensor *vm = nb_matmul(nb_narrow(x3, 0, 0, 1), w2);
                nb_tensor *vs = nb_matmul(nb_narrow(xs, 0, 0, 1), w2);
                nb_tensor *gvs = nb_narrow(nb_matmul(xs, w2), 0, 0, 1);
                if (mode == 2) ck_assert_int_eq(nb_autocast_end(), 0);
                ck_assert_msg(gemm && row && col && gs && rs && cs, "%s", nb_last_error());
                ck_assert_msg(same_bits(row, gemm) && same_bits(nb_unsqueeze(col, 0), gemm),
                              "mode %d K %lld N %lld: gemv differs from gemm", mode, (long long)K,
                              (long long)N);
                ck_assert_msg(same_bits(rs, gs) && same_bits(nb_unsqueeze(cs, 0), gs),
                              "mode %d K %lld N %lld: strided x", mode, (long long)K, (long long)N);
                ck_assert_msg(gv && vm && vs && gvs && same_bits(vm, gv) && same_bits(vs, gvs),
                              "mode %d K %lld N %lld: x W differs from gemm", mode, (long long)K,
                              (long long)N);
                /* values: against a double sum of the (rounded) operands */
                nb_tensor *wd = nb_contiguous(nb_to(w, NB_F64));
                nb_tensor *xd = nb_contiguous(nb_to(mode == 2 ? nb_to(x3, NB_BF16) : x3, NB_F64));
                nb_tensor *rowf = nb_contiguous(nb_to(row, NB_F64));
                const double *W = nb_data(wd), *X = nb_data(xd), *Y = nb_data(rowf);
                for (int64_t j = 0; j < N; j++) {
                    double want = 0, mag = 0;
                    for (int64_t k = 0; k < K; k++)
                        want += W[j * K + k] * X[k], mag += fabs(W[j * K + k] * X[k]);
                    double tol = (mode == 1 ? 1e-2 : 1e-5) * (mag + 1e-30);
                    ck_assert_msg(fabs(Y[j] - want) <= tol, "mode %d K %lld N %lld j %lld: %.9g vs %.9g",
                                  mode, (long long)K, (long long)N, (long long)j, Y[j], want);
                }
                nb_scope_end();
            }
}
END_TEST

START_TEST(test_gemv_threads_and_paths) {
    nb_rng r;
    nb_rng_seed(&r, 7);
    int before = nb_num_threads();
    nb_scope_begin();
    nb_tensor *w = nb_randn(NB_F32, NB_SHAPE(1003, 515), &r);
    nb_tensor *x = nb_randn(NB_F32, NB_SHAPE(1, 515), &r);
    nb_tensor *wb = nb_to(w, NB_BF16);
    nb_tensor *w2 = nb_randn(NB_F32, NB_SHAPE(515, 1003), &r);
    nb_tensor *y[2][3];
    for (int t = 0; t < 2; t++) {
        nb_set_num_threads(t + 1);
        y[t][0] = nb_matmul(x, nb_transpose(w, 0, 1));
        y[t][2] = nb_matmul(x, w2);
        ck_assert_int_eq(nb_autocast_begin(NB_BF16), 0);
        y[t][1] = nb_matmul(x, nb_transpose(wb, 0, 1));
        ck_assert_int_eq(nb_autocast_end(), 0);
    }
    nb_set_num_threads(before);
    for (int i = 0; i < 3; i++) ck_assert(same_bits(y[0][i], y[1][i]));
    /* a forced AVX2 path: its one-row kernels, with that path's bits (on an
     * AVX2-only CPU this is the default path, tested above and in test-isa) */
    nb_tensor *x2 = nb_cat((nb_tensor *[]){x, x}, 2, 0);
    if (nbi_gemm_path(NBI_GEMM_AVX2) == NBI_GEMM_AVX2) {
        ck_assert(nbi_gemv_available(0));
        nb_tensor *a = nb_matmul(x, nb_transpose(w, 0, 1));
        nb_tensor *b = nb_narrow(nb_matmul(x2, nb_transpose(w, 0, 1)), 0, 0, 1);
        nb_tensor *c = nb_matmul(x, w2), *d = nb_narrow(nb_matmul(x2, w2), 0, 0, 1);
        ck_assert(a && b && c && d && same_bits(a, b) && same_bits(c, d));
    }
    /* portable: no one-row kernel, the general one */
    if (nbi_gemm_path(NBI_GEMM_PORTABLE) == NBI_GEMM_PORTABLE) {
        ck_assert(!nbi_gemv_available(0));
        float out[4];
        ck_assert_int_eq(nbi_gemv_f32(4, 515, nb_data(w), 515, nb_data(x), out, 1), 1);
        ck_assert_int_eq(nbi_vecmat_f32(4, 515, nb_data(w2), 1003, nb_data(x), out), 1);
        nb_tensor *a = nb_matmul(x, nb_transpose(w, 0, 1));
        nb_tensor *b = nb_narrow(nb_matmul(x2, nb_transpose(w, 0, 1)), 0, 0, 1);
        ck_assert(a && b && same_bits(a, b));
    }
    nbi_gemm_path(NBI_GEMM_AUTO);
    nb_scope_end();
}
END_TEST

/* Batched one-row products, attention over a KV cache per head: q (B,H,1,D)
 * K^T and p (B,H,1,L) V with K and V narrowed views of a longer cache (the
 * batches a stride apart that no folding joins), q as a strided view too,
 * and a batched one-column product (K (B,H,L,D) times a column): each is
 * row 0 (column 0) of the general kernel's 3-row (3-column) product, bit for
 * bit, on 1 and 2 threads; f32, and autocast with a bf16 cache for the rows
 * forms. Values near a double sum once. */
static void batched_case(int64_t H, int64_t L, int64_t D, int bf16, nb_rng *r) {
    nb_scope_begin();
    const int64_t cap = L + 3; /* the cache's length: K, V are narrowed views */
    nb_tensor *kc = nb_narrow(nb_randn(NB_F32, NB_SHAPE(2, H, cap, D), r), 2, 0, L);
    nb_tensor *vc = nb_narrow(nb_randn(NB_F32, NB_SHAPE(2, H, cap, D), r), 2, 1, L);
    if (bf16) kc = nb_to(kc, NB_BF16); /* contiguous again: narrow the copy */
    if (bf16) kc = nb_narrow(nb_cat((nb_tensor *[]){kc, kc}, 2, 2), 2, 0, L);
    nb_tensor *q3 = nb_randn(NB_F32, NB_SHAPE(2, H, 3, D), r);
    nb_tensor *qt = nb_transpose(nb_randn(NB_F32, NB_SHAPE(2, H, D, 3), r), -1, -2); /* sak 3 */
    nb_tensor *p3 = nb_randn(NB_F32, NB_SHAPE(2, H, 3, L), r);
    nb_tensor *c3 = nb_randn(NB_F32, NB_SHAPE(2, H, D, 3), r);
    nb_tensor *kt = nb_transpose(kc, -1, -2);
    nb_tensor *got[2][4], *want[4];
    if (bf16) ck_assert_int_eq(nb_autocast_begin(NB_BF16), 0);
    want[0] = nb_narrow(nb_matmul(q3, kt), 2, 0, 1);
    want[1] = nb_narrow(nb_matmul(qt, kt), 2, 0, 1);
    want[2] = nb_narrow(nb_matmul(p3, vc), 2, 0, 1);
    want[3] = nb_narrow(nb_matmul(kc, c3), 3, 0, 1);
    int before = nb_num_threads();
    for (int t = 0; t < 2; t++) {
        nb_set_num_threads(t + 1);
        got[t][0] = nb_matmul(nb_narrow(q3, 2, 0, 1), kt);
        got[t][1] = nb_matmul(nb_narrow(qt, 2, 0, 1), kt);
        got[t][2] = nb_matmul(nb_narrow(p3, 2, 0, 1), vc);
        got[t][3] = nb_matmul(kc, nb_narrow(c3, 3, 0, 1));
    }
    nb_set_num_threads(before);
    if (bf16) ck_assert_int_eq(nb_autocast_end(), 0);
    for (int i = 0; i < 4; i++)
        for (int t = 0; t < 2; t++)
            ck_assert_msg(got[t][i] && want[i] && same_bits(got[t][i], want[i]),
                          "bf16 %d H %lld L %lld D %lld product %d threads %d: %s", bf16,
                          (long long)H, (long long)L, (long long)D, i, t + 1,
                          got[t][i] ? "differs from gemm" : nb_last_error());
    if (H == 3 && L == 17 && D == 65 && !bf16) { /* scores of batch 1, head 2 vs double */
        nb_tensor *q = nb_contiguous(nb_to(nb_select(nb_select(q3, 0, 1), 0, 2), NB_F64));
        nb_tensor *k = nb_contiguous(nb_to(nb_select(nb_select(kc, 0, 1), 0, 2), NB_F64));
        nb_tensor *s = nb_contiguous(nb_to(nb_select(nb_select(got[0][0], 0, 1), 0, 2), NB_F64));
        const double *Q = nb_data(q), *K = nb_data(k), *S = nb_data(s);
        for (int64_t j = 0; j < L; j++) {
            double want_j = 0, mag = 0;
            for (int64_t d = 0; d < D; d++) want_j += Q[d] * K[j * D + d], mag += fabs(Q[d] * K[j * D + d]);
            ck_assert_msg(fabs(S[j] - want_j) <= 1e-5 * mag, "j %lld: %.9g vs %.9g", (long long)j,
                          S[j], want_j);
        }
    }
    nb_scope_end();
}

START_TEST(test_gemv_batched_bits_of_gemm) {
    static const int64_t Hs[] = {1, 3, 12}, Ls[] = {1, 5, 16, 17, 33, 100},
                         Ds[] = {1, 7, 16, 17, 64, 65, 130};
    nb_rng r;
    nb_rng_seed(&r, 27);
    for (int bf16 = 0; bf16 < 2; bf16++)
        for (size_t h = 0; h < 3; h++)
            for (size_t l = 0; l < 6; l++)
                for (size_t d = 0; d < 7; d++) batched_case(Hs[h], Ls[l], Ds[d], bf16, &r);
}
END_TEST

Suite *suite_matmul(void) {
    Suite *s = suite_create("matmul");
    TCase *tc = tcase_create("forward");
    tcase_add_loop_test(tc, test_forward_fixtures, 0, NPLAIN);
    tcase_add_test(tc, test_zero_inner_is_zeros);
    tcase_add_test(tc, test_every_kernel_path);
    tcase_add_test(tc, test_gemv_bits_of_gemm);
    tcase_add_test(tc, test_gemv_threads_and_paths);
    tcase_add_test(tc, test_gemv_batched_bits_of_gemm);
    tcase_add_test(tc, test_output_shapes);
    suite_add_tcase(s, tc);

    tc = tcase_create("strided");
    tcase_add_test(tc, test_transposed_b_in_place);
    tcase_add_test(tc, test_transposed_a_in_place);
    tcase_add_test(tc, test_transposed_both_in_place);
    tcase_add_test(tc, test_expanded_b_in_place);
    tcase_add_test(tc, test_narrowed_a_in_place);
    suite_add_tcase(s, tc);

    tc = tcase_create("autograd");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_gradcheck_contiguous);
    tcase_add_test(tc, test_gradcheck_transposed);
    tcase_add_test(tc, test_gradcheck_broadcast);
    tcase_add_test(tc, test_gradcheck_1d);
    tcase_add_test(tc, test_gradcheck_one_input);
    tcase_add_loop_test(tc, test_backward_vs_torch, 0,
                        (int)(sizeof grad_cases / sizeof grad_cases[0]));
    tcase_add_test(tc, test_jvp_both_tangents);
    tcase_add_test(tc, test_bf16_orders);
    tcase_add_test(tc, test_no_grad_records_nothing);
    tcase_add_test(tc, test_in_place_write_after_use);
    tcase_add_test(tc, test_no_leak);
    suite_add_tcase(s, tc);

    tc = tcase_create("errors");
    tcase_add_test(tc, test_error_inner_mismatch);
    tcase_add_test(tc, test_error_batch_broadcast);
    tcase_add_test(tc, test_error_dtypes);
    tcase_add_test(tc, test_error_0d);
    tcase_add_test(tc, test_error_overflow);
    tcase_add_test(tc, test_error_null_keeps_first);
    suite_add_tcase(s, tc);
    return s;
}
