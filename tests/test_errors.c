/* test_errors.c: bad input across the API, as one table: each case makes one
 * bad call and lists what the message must name (the function and the
 * offending values). Each case must fail (NULL, or -1 for int results), set
 * nb_last_error(), crash nothing and leak nothing. Then the rules around the
 * message itself: the first error is kept through a chain of ops fed NULL,
 * nb_clear_error, messages are per thread, NABLA_ABORT_ON_ERROR=1 aborts. */
#include "test_util.h"

#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHECK_NOT_NULL(t) \
    ck_assert_msg((t) != NULL, "%s", nb_last_error() ? nb_last_error() : "(no error set)")

/* What a case returns: NULL for "failed", anything else for "succeeded". */
static const char succeeded[] = "succeeded";
static const void *int_result(int rc) { return rc == -1 ? NULL : succeeded; }

/* Inputs made fresh by each case (in the scope the runner opened). */
static nb_tensor *f32(int ndim, const int64_t *shape) {
    nb_tensor *t = nb_zeros(NB_F32, ndim, shape);
    CHECK_NOT_NULL(t);
    return t;
}
static nb_tensor *f64(int ndim, const int64_t *shape) {
    nb_tensor *t = nb_ones(NB_F64, ndim, shape);
    CHECK_NOT_NULL(t);
    return t;
}
static nb_tensor *leaf64(int ndim, const int64_t *shape) {
    return nb_set_requires_grad(f64(ndim, shape), true);
}

/* ---------------------------------------------------------------- the cases */
/* wrong shapes */
static const void *add_shapes(void) { return nb_add(f32(NB_SHAPE(2, 3)), f32(NB_SHAPE(4, 5))); }
static const void *matmul_shapes(void) {
    return nb_matmul(f32(NB_SHAPE(2, 3)), f32(NB_SHAPE(4, 5)));
}
static const void *matmul_0d(void) { return nb_matmul(f32(0, NULL), f32(NB_SHAPE(3))); }
static const void *cat_shapes(void) {
    nb_tensor *list[] = {f32(NB_SHAPE(2, 3)), f32(NB_SHAPE(2, 4))};
    return nb_cat(list, 2, 0);
}
static const void *cat_none(void) { return nb_cat(NULL, 0, 0); }
static const void *masked_fill_shapes(void) {
    return nb_masked_fill(f32(NB_SHAPE(2, 3)), nb_tril_mask(4, 4), 0.0);
}
static const void *reshape_numel(void) { return nb_reshape(f32(NB_SHAPE(2, 3)), NB_SHAPE(4, 2)); }
static const void *view_infer(void) { return nb_view(f32(NB_SHAPE(2, 3)), NB_SHAPE(-1, 4)); }
static const void *expand_bad(void) { return nb_expand(f32(NB_SHAPE(2, 3)), NB_SHAPE(4, 3)); }
static const void *backward_with_grad_shape(void) {
    nb_tensor *y = nb_mul_scalar(leaf64(NB_SHAPE(2, 3)), 2.0);
    return int_result(nb_backward_with_grad(y, f64(NB_SHAPE(3, 2))));
}

/* bad dims and indices */
static const void *sum_dim(void) { return nb_sum(f32(NB_SHAPE(2, 3)), 5, false); }
static const void *mean_dim(void) { return nb_mean(f32(NB_SHAPE(2, 3)), -3, true); }
static const void *transpose_dim(void) { return nb_transpose(f32(NB_SHAPE(2, 3)), -3, 0); }
static const void *softmax_dim(void) { return nb_softmax(f32(NB_SHAPE(2, 3)), 2); }
static const void *log_softmax_dim(void) { return nb_log_softmax(f64(NB_SHAPE(2, 3)), -4); }
static const void *argmax_dim(void) { return nb_argmax(f32(NB_SHAPE(2, 3)), 2, false); }
static const void *max_empty_dim(void) { return nb_max(f32(NB_SHAPE(2, 0)), 1, false); }
static const void *permute_repeat(void) {
    return nb_permute(f32(NB_SHAPE(2, 3, 4)), 3, (const int[]){0, 2, 0});
}
static const void *narrow_range(void) { return nb_narrow(f32(NB_SHAPE(2, 3)), 1, 2, 5); }
/* a negative start counts from the end; the message shows the caller's value */
static const void *narrow_negative_start(void) {
    return nb_narrow(f32(NB_SHAPE(2, 3)), 1, -7, 1);
}
static const void *select_range(void) { return nb_select(f32(NB_SHAPE(2, 3)), 0, 2); }
static const void *size_dim(void) { return int_result((int)nb_size(f32(NB_SHAPE(2, 3)), 2)); }
static const void *unsqueeze_max(void) {
    return nb_unsqueeze(f32(NB_SHAPE(1, 1, 1, 1, 1, 1, 1, 1)), 0);
}

/* dtypes */
static const void *add_dtype(void) { return nb_add(f32(NB_SHAPE(2)), f64(NB_SHAPE(2))); }
static const void *exp_i64(void) { return nb_exp(nb_arange(NB_I64, 3)); }
static const void *softmax_bool(void) { return nb_softmax(nb_tril_mask(2, 2), -1); }
static const void *matmul_dtype(void) {
    return nb_matmul(f64(NB_SHAPE(2, 2)), f32(NB_SHAPE(2, 2)));
}
static const void *masked_fill_mask_dtype(void) {
    return nb_masked_fill(f32(NB_SHAPE(2, 3)), nb_zeros(NB_I64, NB_SHAPE(2, 3)), 0.0);
}
static const void *where_cond_dtype(void) {
    return nb_where(f32(NB_SHAPE(2)), f32(NB_SHAPE(2)), f32(NB_SHAPE(2)));
}
static const void *requires_grad_i64(void) {
    return nb_set_requires_grad(nb_arange(NB_I64, 3), true);
}
static const void *requires_grad_nonleaf(void) {
    return nb_set_requires_grad(nb_exp(leaf64(NB_SHAPE(2))), false);
}
static const void *to_unknown(void) { return nb_to(f32(NB_SHAPE(2)), (nb_dtype)9); }
static const void *empty_unknown(void) { return nb_empty((nb_dtype)-1, NB_SHAPE(2)); }
static const void *randn_i64(void) { return nb_randn(NB_I64, NB_SHAPE(2), NULL); }
static const void *arange_negative(void) { return nb_arange(NB_F32, -4); }
static const void *full_i64_range(void) { return nb_full(NB_I64, NB_SHAPE(2), 1e19); }
static const void *default_dtype_i64(void) {
    nb_dtype before = nb_default_dtype();
    nb_set_default_dtype(NB_I64);
    ck_assert_int_eq(nb_default_dtype(), before);
    return NULL; /* void function: only the message tells */
}

/* NULL inputs (the error starts here, so the message is "<fn>: ... NULL") */
static const void *add_null(void) { return nb_add(NULL, f32(NB_SHAPE(2))); }
static const void *view_null(void) { return nb_view(NULL, NB_SHAPE(6)); }
static const void *matmul_null(void) { return nb_matmul(f32(NB_SHAPE(2, 2)), NULL); }
static const void *backward_null(void) { return int_result(nb_backward(NULL)); }
static const void *softmax_null(void) { return nb_softmax(NULL, -1); }
static const void *from_data_null(void) { return nb_from_data(NB_F64, NB_SHAPE(2, 2), NULL); }
static const void *zeros_null_shape(void) { return nb_zeros(NB_F32, 2, NULL); }

/* sizes */
static const void *zeros_negative(void) { return nb_zeros(NB_F32, NB_SHAPE(2, -1)); }
static const void *zeros_ndim9(void) {
    return nb_zeros(NB_F32, NB_SHAPE(1, 1, 1, 1, 1, 1, 1, 1, 1));
}
static const void *zeros_ndim_negative(void) { return nb_zeros(NB_F32, -1, NULL); }
static const void *zeros_overflow(void) {
    return nb_zeros(NB_F32, NB_SHAPE((int64_t)1 << 40, (int64_t)1 << 40));
}
/* 2^60 elements fit int64, 2^63 bytes fit no machine */
static const void *empty_too_big(void) {
    return nb_empty(NB_F64, NB_SHAPE((int64_t)1 << 40, (int64_t)1 << 20));
}
/* 2^62 elements fit int64, but 2^64 bytes do not fit size_t */
static const void *ones_too_big(void) {
    return nb_ones(NB_F32, NB_SHAPE((int64_t)1 << 61, 2));
}
static const void *view_after_transpose(void) {
    return nb_view(nb_transpose(f32(NB_SHAPE(2, 3)), 0, 1), NB_SHAPE(6));
}
static const void *item_many(void) {
    return isnan(nb_item(f32(NB_SHAPE(2, 3)))) ? NULL : succeeded;
}

/* matmul, softmax, masked_fill, dropout, and autograd */
static const void *dropout_p(void) { return nb_dropout(f32(NB_SHAPE(4)), 1.5, true, NULL); }
static const void *dropout_negative(void) {
    return nb_dropout(f32(NB_SHAPE(4)), -0.25, false, NULL);
}
static const void *dropout_nan(void) { return nb_dropout(f32(NB_SHAPE(4)), NAN, true, NULL); }
static const void *backward_nonscalar(void) {
    return int_result(nb_backward(nb_mul_scalar(leaf64(NB_SHAPE(2, 3)), 2.0)));
}
static const void *backward_no_graph(void) {
    return int_result(nb_backward(nb_sum_all(f64(NB_SHAPE(2, 3)))));
}
static nb_tensor *double_it(nb_tensor **in, int n, void *ctx) {
    (void)n;
    (void)ctx;
    return nb_mul_scalar(in[0], 2.0);
}
static const void *gradcheck_f32(void) {
    nb_tensor *x = nb_set_requires_grad(f32(NB_SHAPE(3)), true);
    nb_gradcheck_result r;
    return nb_gradcheck(double_it, NULL, 1, &x, NULL, &r) ? succeeded : NULL;
}
static const void *gradcheck_no_grad(void) {
    nb_tensor *x = f64(NB_SHAPE(3));
    return nb_gradcheck(double_it, NULL, 1, &x, NULL, NULL) ? succeeded : NULL;
}
static const void *gradcheck_bad_eps(void) {
    nb_tensor *x = leaf64(NB_SHAPE(3));
    nb_gradcheck_opts o = {.eps = -1, .atol = 1e-5, .rtol = 1e-3};
    return nb_gradcheck(double_it, NULL, 1, &x, &o, NULL) ? succeeded : NULL;
}
static const void *copy_into_expanded(void) {
    nb_tensor *dst = nb_expand(f32(NB_SHAPE(1, 3)), NB_SHAPE(2, 3));
    return int_result(nb_copy_into(dst, f32(NB_SHAPE(3))));
}
static const void *copy_into_shapes(void) {
    return int_result(nb_copy_into(f32(NB_SHAPE(2, 3)), f32(NB_SHAPE(3, 2))));
}
static const void *num_threads_zero(void) {
    int before = nb_num_threads();
    nb_set_num_threads(0);
    ck_assert_int_eq(nb_num_threads(), before);
    return NULL;
}
/* runs with no scope open (see the runner) */
static const void *scope_end_none(void) {
    ck_assert_int_eq(nb_scope_depth(), 0);
    nb_scope_end();
    ck_assert_int_eq(nb_scope_depth(), 0);
    return NULL;
}

typedef struct bad_case {
    const char *name;
    const void *(*call)(void);
    const char *all[5]; /* every one must be in the message */
    const char *any[3]; /* and, when given, at least one of these */
    bool no_scope;      /* run with no scope open */
} bad_case;

static const bad_case cases[] = {
    /* wrong shapes */
    {"add_shapes", add_shapes, {"nb_add", "(2,3)", "(4,5)", "broadcast"}, {0}, 0},
    {"matmul_shapes", matmul_shapes,
     {"nb_matmul: shapes (2,3) and (4,5) cannot be multiplied (3 != 4)"}, {0}, 0},
    {"matmul_0d", matmul_0d, {"nb_matmul", "1-d", "()", "(3)"}, {0}, 0},
    {"cat_shapes", cat_shapes, {"nb_cat", "tensor 1", "(2,4)", "(2,3)"}, {0}, 0},
    {"cat_none", cat_none, {"nb_cat", "n = 0"}, {0}, 0},
    {"masked_fill_shapes", masked_fill_shapes, {"nb_masked_fill", "(2,3)", "(4,4)"}, {0}, 0},
    {"reshape_numel", reshape_numel, {"nb_reshape", "(4,2)", "(2,3)", "6"}, {0}, 0},
    {"view_infer", view_infer, {"nb_view", "(-1,4)", "6"}, {0}, 0},
    {"expand_bad", expand_bad, {"nb_expand", "(2,3)", "(4,3)"}, {0}, 0},
    {"backward_with_grad_shape", backward_with_grad_shape,
     {"nb_backward_with_grad", "(3,2)", "(2,3)"}, {0}, 0},
    /* bad dims */
    {"sum_dim", sum_dim, {"nb_sum", "dim 5", "2-d"}, {0}, 0},
    {"mean_dim", mean_dim, {"nb_mean", "dim -3", "2-d"}, {0}, 0},
    {"transpose_dim", transpose_dim, {"nb_transpose", "dim -3", "2-d"}, {0}, 0},
    {"softmax_dim", softmax_dim, {"nb_softmax", "dim 2", "2-d"}, {0}, 0},
    {"log_softmax_dim", log_softmax_dim, {"nb_log_softmax", "dim -4"}, {0}, 0},
    {"argmax_dim", argmax_dim, {"nb_argmax", "dim 2"}, {0}, 0},
    {"max_empty_dim", max_empty_dim, {"nb_max", "size 0", "(2,0)"}, {0}, 0},
    {"permute_repeat", permute_repeat, {"nb_permute", "dim 0", "twice"}, {0}, 0},
    {"narrow_range", narrow_range, {"nb_narrow", "start 2", "length 5", "size 3"}, {0}, 0},
    {"narrow_negative_start", narrow_negative_start, {"nb_narrow", "-7", "size 3"}, {0}, 0},
    {"select_range", select_range, {"nb_select", "index 2", "size 2"}, {0}, 0},
    {"size_dim", size_dim, {"nb_size", "dim 2", "2-d"}, {0}, 0},
    {"unsqueeze_max", unsqueeze_max, {"nb_unsqueeze", "8"}, {0}, 0},
    /* dtypes */
    {"add_dtype", add_dtype, {"nb_add", "f32", "f64"}, {0}, 0},
    {"exp_i64", exp_i64, {"nb_exp", "i64", "floating"}, {0}, 0},
    {"softmax_bool", softmax_bool, {"nb_softmax", "bool"}, {0}, 0},
    {"matmul_dtype", matmul_dtype, {"nb_matmul", "f64", "f32"}, {0}, 0},
    {"masked_fill_mask_dtype", masked_fill_mask_dtype, {"nb_masked_fill", "bool", "i64"}, {0}, 0},
    {"where_cond_dtype", where_cond_dtype, {"nb_where", "bool", "f32"}, {0}, 0},
    {"requires_grad_i64", requires_grad_i64, {"nb_set_requires_grad", "i64"}, {0}, 0},
    {"requires_grad_nonleaf", requires_grad_nonleaf,
     {"nb_set_requires_grad", "nb_exp", "leaf", "nb_detach"}, {0}, 0},
    {"to_unknown", to_unknown, {"nb_to", "9"}, {0}, 0},
    {"empty_unknown", empty_unknown, {"nb_empty", "dtype", "-1"}, {0}, 0},
    {"randn_i64", randn_i64, {"nb_randn", "i64"}, {0}, 0},
    {"arange_negative", arange_negative, {"nb_arange", "-4"}, {0}, 0},
    {"full_i64_range", full_i64_range, {"nb_full", "1e+19", "i64"}, {0}, 0},
    {"default_dtype_i64", default_dtype_i64, {"nb_set_default_dtype", "i64"}, {0}, 0},
    /* NULL inputs */
    {"add_null", add_null, {"nb_add", "NULL"}, {0}, 0},
    {"view_null", view_null, {"nb_view", "NULL"}, {0}, 0},
    {"matmul_null", matmul_null, {"nb_matmul", "NULL"}, {0}, 0},
    {"backward_null", backward_null, {"nb_backward", "NULL"}, {0}, 0},
    {"softmax_null", softmax_null, {"nb_softmax", "NULL"}, {0}, 0},
    {"from_data_null", from_data_null, {"nb_from_data", "NULL", "(2,2)"}, {0}, 0},
    {"zeros_null_shape", zeros_null_shape, {"nb_zeros", "NULL", "2"}, {0}, 0},
    /* sizes */
    {"zeros_negative", zeros_negative, {"nb_zeros", "-1", "(2,-1)"}, {0}, 0},
    {"zeros_ndim9", zeros_ndim9, {"nb_zeros", "ndim 9", "8"}, {0}, 0},
    {"zeros_ndim_negative", zeros_ndim_negative, {"nb_zeros", "ndim -1"}, {0}, 0},
    {"zeros_overflow", zeros_overflow, {"nb_zeros", "int64", "(1099511627776,1099511627776)"},
     {0}, 0},
    {"empty_too_big", empty_too_big, {"nb_empty", "(1099511627776,1048576)"},
     {"out of memory", "size_t"}, 0},
    {"ones_too_big", ones_too_big, {"nb_ones", "(2305843009213693952,2)"},
     {"out of memory", "size_t"}, 0},
    {"view_after_transpose", view_after_transpose, {"nb_view", "nb_reshape", "(3,2)", "(6)"},
     {0}, 0},
    {"item_many", item_many, {"nb_item", "(2,3)", "6"}, {0}, 0},
    /* matmul, softmax, masked_fill, dropout; autograd; settings */
    {"dropout_p", dropout_p, {"nb_dropout", "1.5"}, {0}, 0},
    {"dropout_negative", dropout_negative, {"nb_dropout", "-0.25"}, {0}, 0},
    {"dropout_nan", dropout_nan, {"nb_dropout", "nan"}, {0}, 0},
    {"backward_nonscalar", backward_nonscalar, {"nb_backward", "(2,3)", "one element"}, {0}, 0},
    {"backward_no_graph", backward_no_graph, {"nb_backward", "does not require grad"}, {0}, 0},
    {"gradcheck_f32", gradcheck_f32, {"nb_gradcheck", "input 0", "f32", "f64"}, {0}, 0},
    {"gradcheck_no_grad", gradcheck_no_grad, {"nb_gradcheck", "requires grad"}, {0}, 0},
    {"gradcheck_bad_eps", gradcheck_bad_eps, {"nb_gradcheck", "eps", "-1"}, {0}, 0},
    {"copy_into_expanded", copy_into_expanded, {"nb_copy_into", "overlapping", "(2,3)"}, {0}, 0},
    {"copy_into_shapes", copy_into_shapes, {"nb_copy_into", "(3,2)", "(2,3)"}, {0}, 0},
    {"num_threads_zero", num_threads_zero, {"nb_set_num_threads", "0"}, {0}, 0},
    {"scope_end_none", scope_end_none, {"nb_scope_end", "no scope"}, {0}, 1},
};
#define NCASES (int)(sizeof cases / sizeof cases[0])

/* Runs one case (in a scope of its own unless no_scope) and checks it. */
static void run_case(const bad_case *c) {
    nb_clear_error();
    const void *r = c->call();
    const char *msg = nb_last_error();
    ck_assert_msg(r == NULL, "%s: the bad call did not fail", c->name);
    ck_assert_msg(msg != NULL, "%s: failed, but nb_last_error() is NULL", c->name);
    for (int k = 0; k < 5 && c->all[k]; k++)
        ck_assert_msg(strstr(msg, c->all[k]) != NULL, "%s: error \"%s\" does not contain \"%s\"",
                      c->name, msg, c->all[k]);
    if (c->any[0]) {
        bool found = false;
        for (int k = 0; k < 3 && c->any[k]; k++) found |= strstr(msg, c->any[k]) != NULL;
        ck_assert_msg(found, "%s: error \"%s\" contains none of \"%s\", \"%s\"", c->name, msg,
                      c->any[0], c->any[1] ? c->any[1] : "");
    }
    nb_clear_error();
    ck_assert_ptr_null(nb_last_error());
}

/* One case per loop iteration, so that each is reported by name. */
START_TEST(test_bad_input) {
    const bad_case *c = &cases[_i];
    int64_t live0 = nb_live_tensors();
    if (!c->no_scope) nb_scope_begin();
    run_case(c);
    if (!c->no_scope) nb_scope_end();
    ck_assert_int_eq(nb_scope_depth(), 0);
    ck_assert_msg(nb_live_tensors() == live0, "%s: %lld tensors left alive", c->name,
                  (long long)(nb_live_tensors() - live0));
}
END_TEST

/* The whole table in one scope: every call fails, and afterwards no tensor
 * object is left. (The texts are checked case by case above.) */
static void run_case_fails(const bad_case *c) {
    nb_clear_error();
    ck_assert_msg(c->call() == NULL, "%s: the bad call did not fail", c->name);
    ck_assert_msg(nb_last_error() != NULL, "%s: no message", c->name);
    nb_clear_error();
}

START_TEST(test_table_leaks_nothing) {
    int64_t live0 = nb_live_tensors();
    nb_scope_begin();
    for (int i = 0; i < NCASES; i++)
        if (!cases[i].no_scope) run_case_fails(&cases[i]);
    nb_scope_end();
    for (int i = 0; i < NCASES; i++)
        if (cases[i].no_scope) run_case_fails(&cases[i]);
    ck_assert_int_eq(nb_scope_depth(), 0);
    ck_assert_int_eq(nb_live_tensors(), live0);
}
END_TEST

/* Persistent tensors (no scope): a failing op leaves nothing behind either. */
START_TEST(test_failures_outside_scope_leak_nothing) {
    ck_assert_int_eq(nb_scope_depth(), 0);
    nb_tensor *a = nb_zeros(NB_F32, NB_SHAPE(2, 3)), *b = nb_zeros(NB_F32, NB_SHAPE(4, 5));
    int64_t live0 = nb_live_tensors();
    expect_error(nb_add(a, b), "nb_add");
    expect_error(nb_matmul(a, b), "nb_matmul");
    expect_error(nb_empty(NB_F64, NB_SHAPE((int64_t)1 << 40, (int64_t)1 << 20)), "nb_empty");
    expect_error(nb_from_data(NB_F64, NB_SHAPE(2), NULL), "nb_from_data");
    ck_assert_int_eq(nb_live_tensors(), live0);
    nb_free(a);
    nb_free(b);
}
END_TEST

/* ------------------------------------------------------------ propagation */
START_TEST(test_first_error_kept) {
    nb_scope_begin();
    nb_tensor *a = nb_ones(NB_F64, NB_SHAPE(2, 3)), *b_bad = nb_ones(NB_F64, NB_SHAPE(4, 5));
    nb_clear_error();
    ck_assert_ptr_null(nb_add(a, b_bad));
    ck_assert_ptr_nonnull(nb_last_error());
    char first[512];
    snprintf(first, sizeof first, "%s", nb_last_error());
    ck_assert_msg(strncmp(first, "nb_add:", 7) == 0, "message: %s", first);
    nb_clear_error();

    /* the chain fails as a whole: the last op names its NULL input and
     * quotes nb_add's message (not the NULL messages between) */
    nb_tensor *loss = nb_sum_all(nb_exp(nb_add(a, b_bad)));
    ck_assert_ptr_null(loss);
    ck_assert_ptr_nonnull(nb_last_error());
    char want[1024];
    snprintf(want, sizeof want, "nb_sum_all: input 0 is NULL, after an earlier error: %s", first);
    ck_assert_str_eq(nb_last_error(), want);

    /* every op (and inspection) fed that NULL names itself and keeps it */
#define KEEPS_FIRST(fn, i)                                                                    \
    do {                                                                                      \
        snprintf(want, sizeof want, "%s: input %d is NULL, after an earlier error: %s", fn, i, \
                 first);                                                                      \
        ck_assert_str_eq(nb_last_error(), want);                                              \
    } while (0)
    nb_tensor *list[] = {a, NULL};
    ck_assert_ptr_null(nb_matmul(loss, a));
    KEEPS_FIRST("nb_matmul", 0);
    ck_assert_ptr_null(nb_softmax(loss, -1));
    KEEPS_FIRST("nb_softmax", 0);
    ck_assert_ptr_null(nb_log_softmax(loss, -1));
    KEEPS_FIRST("nb_log_softmax", 0);
    ck_assert_ptr_null(nb_masked_fill(loss, nb_tril_mask(2, 3), 0));
    KEEPS_FIRST("nb_masked_fill", 0);
    ck_assert_ptr_null(nb_dropout(loss, 0.5, true, NULL));
    KEEPS_FIRST("nb_dropout", 0);
    ck_assert_ptr_null(nb_view(loss, NB_SHAPE(6)));
    KEEPS_FIRST("nb_view", 0);
    ck_assert_ptr_null(nb_reshape(loss, NB_SHAPE(6)));
    KEEPS_FIRST("nb_reshape", 0);
    ck_assert_ptr_null(nb_transpose(loss, 0, 1));
    KEEPS_FIRST("nb_transpose", 0);
    ck_assert_ptr_null(nb_sum(loss, 0, false));
    KEEPS_FIRST("nb_sum", 0);
    ck_assert_ptr_null(nb_mean_all(loss));
    KEEPS_FIRST("nb_mean_all", 0);
    ck_assert_ptr_null(nb_mul(a, loss));
    KEEPS_FIRST("nb_mul", 1);
    ck_assert_ptr_null(nb_where(nb_tril_mask(2, 3), a, loss));
    KEEPS_FIRST("nb_where", 2);
    ck_assert_ptr_null(nb_cat(list, 2, 0));
    KEEPS_FIRST("nb_cat", 1);
    ck_assert_ptr_null(nb_to(loss, NB_F32));
    KEEPS_FIRST("nb_to", 0);
    ck_assert_ptr_null(nb_detach(loss));
    KEEPS_FIRST("nb_detach", 0);
    ck_assert_ptr_null(nb_keep(loss));
    KEEPS_FIRST("nb_keep", 0);
    ck_assert_ptr_null(nb_set_requires_grad(loss, true));
    KEEPS_FIRST("nb_set_requires_grad", 0);
    ck_assert_int_eq(nb_backward(loss), -1);
    KEEPS_FIRST("nb_backward", 0);
    ck_assert_int_eq(nb_backward_with_grad(loss, a), -1);
    KEEPS_FIRST("nb_backward_with_grad", 0);
    ck_assert_int_eq(nb_copy_into(loss, a), -1);
    KEEPS_FIRST("nb_copy_into", 0);
    ck_assert_int_eq(nb_copy_to_f64(loss, (double[1]){0}), -1);
    KEEPS_FIRST("nb_copy_to_f64", 0);
    ck_assert(isnan(nb_item(loss)));
    KEEPS_FIRST("nb_item", 0);
    ck_assert_int_eq(nb_ndim(loss), -1);
    KEEPS_FIRST("nb_ndim", 0);
    ck_assert_int_eq(nb_numel(loss), -1);
    KEEPS_FIRST("nb_numel", 0);
    ck_assert_int_eq(nb_size(loss, 0), -1);
    KEEPS_FIRST("nb_size", 0);
    ck_assert_ptr_null(nb_shape(loss));
    KEEPS_FIRST("nb_shape", 0);
#undef KEEPS_FIRST

    /* a later, real error replaces it (the message is the most recent failure) */
    ck_assert_ptr_null(nb_softmax(a, 7));
    ck_assert_msg(strstr(nb_last_error(), "nb_softmax") != NULL, "%s", nb_last_error());
    nb_clear_error();
    nb_scope_end();
}
END_TEST

/* nb_gradcheck given a NULL input (an earlier op failed) names it and keeps
 * the first error, like every other function does; so does its result. */
START_TEST(test_gradcheck_null_input_keeps_error) {
    nb_scope_begin();
    nb_clear_error();
    nb_tensor *x = nb_zeros(NB_F64, NB_SHAPE(2, -3)); /* fails */
    ck_assert_ptr_null(x);
    char first[512];
    snprintf(first, sizeof first, "%s", nb_last_error());
    ck_assert(!nb_gradcheck(double_it, NULL, 1, &x, NULL, NULL));
    ck_assert_ptr_nonnull(nb_last_error());
    char want[1024];
    snprintf(want, sizeof want, "nb_gradcheck: input 0 is NULL, after an earlier error: %s", first);
    ck_assert_str_eq(nb_last_error(), want);
    nb_gradcheck_result r;
    ck_assert(!nb_gradcheck(double_it, NULL, 1, &x, NULL, &r));
    ck_assert(!r.ok);
    ck_assert_str_eq(r.message, want);
    nb_clear_error();
    nb_scope_end();
}
END_TEST

START_TEST(test_clear_error) {
    nb_clear_error();
    ck_assert_ptr_null(nb_last_error());
    nb_scope_begin();
    ck_assert_ptr_null(nb_zeros(NB_F32, NB_SHAPE(-2)));
    ck_assert_ptr_nonnull(nb_last_error());
    nb_clear_error();
    ck_assert_ptr_null(nb_last_error());
    nb_clear_error(); /* twice is fine */
    ck_assert_ptr_null(nb_last_error());
    /* success does not set a message, nor clear one */
    nb_tensor *ok = nb_add(nb_ones(NB_F32, NB_SHAPE(2)), nb_ones(NB_F32, NB_SHAPE(2)));
    CHECK_NOT_NULL(ok);
    ck_assert_ptr_null(nb_last_error());
    ck_assert_ptr_null(nb_exp(nb_arange(NB_I64, 2)));
    CHECK_NOT_NULL(nb_add(ok, ok)); /* a success after the failure */
    ck_assert_ptr_nonnull(nb_last_error());
    ck_assert(strstr(nb_last_error(), "nb_exp") != NULL);
    /* NULL input with no message set yet: the function sets its own */
    nb_clear_error();
    ck_assert_ptr_null(nb_exp(NULL));
    ck_assert(strstr(nb_last_error(), "nb_exp") && strstr(nb_last_error(), "NULL"));
    nb_clear_error();
    nb_scope_end();
}
END_TEST

/* ---------------------------------------------------------- thread-local */
typedef struct {
    char seen_at_start[16]; /* "NULL" or "set" */
    char msg[512];
    bool failed;
} thread_report;

static void *thread_body(void *arg) {
    thread_report *r = arg;
    snprintf(r->seen_at_start, sizeof r->seen_at_start, "%s", nb_last_error() ? "set" : "NULL");
    /* fails before allocating anything */
    r->failed = nb_zeros(NB_F64, NB_SHAPE(3, -7)) == NULL;
    snprintf(r->msg, sizeof r->msg, "%s", nb_last_error() ? nb_last_error() : "(none)");
    nb_clear_error();
    return NULL;
}

START_TEST(test_errors_are_thread_local) {
    nb_clear_error();
    ck_assert_ptr_null(nb_arange(NB_F32, -9));
    char mine[512];
    snprintf(mine, sizeof mine, "%s", nb_last_error());
    ck_assert(strstr(mine, "nb_arange") != NULL);

    thread_report r = {{0}, {0}, false};
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, thread_body, &r), 0);
    ck_assert_int_eq(pthread_join(th, NULL), 0);
    ck_assert_str_eq(r.seen_at_start, "NULL"); /* the main thread's message is not visible */
    ck_assert(r.failed);
    ck_assert_msg(strstr(r.msg, "nb_zeros") && strstr(r.msg, "-7"), "thread saw: %s", r.msg);
    /* the thread's failure (and its nb_clear_error) left this thread alone */
    ck_assert_ptr_nonnull(nb_last_error());
    ck_assert_str_eq(nb_last_error(), mine);
    nb_clear_error();
}
END_TEST

/* ------------------------------------------------------ abort on error */
START_TEST(test_abort_on_error_env) {
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        struct rlimit no_core = {0, 0};
        setrlimit(RLIMIT_CORE, &no_core); /* no core file from the abort */
        close(fds[0]);
        dup2(fds[1], STDERR_FILENO);
        close(fds[1]);
        setenv("NABLA_ABORT_ON_ERROR", "1", 1);
        nb_tensor *t = nb_zeros(NB_F32, NB_SHAPE(2, -5));
        (void)t;
        _exit(3); /* only reached when the library did not abort */
    }
    close(fds[1]);
    char buf[4096];
    size_t n = 0;
    ssize_t k;
    while (n < sizeof buf - 1 && (k = read(fds[0], buf + n, sizeof buf - 1 - n)) > 0)
        n += (size_t)k;
    buf[n] = 0;
    close(fds[0]);
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFSIGNALED(status), "child was not killed by a signal (exit status %d)",
                  WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    ck_assert_int_eq(WTERMSIG(status), SIGABRT);
    ck_assert_msg(strstr(buf, "nb_zeros") && strstr(buf, "-5"), "child's stderr: %s", buf);
    /* this process is unaffected */
    ck_assert_ptr_null(getenv("NABLA_ABORT_ON_ERROR"));
}
END_TEST

/* NABLA_ABORT_ON_ERROR=0 (or empty) does not abort. */
START_TEST(test_abort_on_error_zero) {
    const char *old = getenv("NABLA_ABORT_ON_ERROR");
    ck_assert_ptr_null(old);
    setenv("NABLA_ABORT_ON_ERROR", "0", 1);
    expect_error(nb_zeros(NB_F32, NB_SHAPE(-1)), "nb_zeros");
    setenv("NABLA_ABORT_ON_ERROR", "", 1);
    expect_error(nb_zeros(NB_F32, NB_SHAPE(-1)), "nb_zeros");
    unsetenv("NABLA_ABORT_ON_ERROR");
}
END_TEST

/* After each test, even a failed one (CK_FORK=no runs every test in one
 * process): close the scopes it left open and drop its message. */
static void teardown(void) {
    while (nb_scope_depth() > 0) nb_scope_end();
    nb_clear_error();
}

Suite *suite_errors(void) {
    Suite *s = suite_create("errors");
    TCase *tc = tcase_create("table");
    tcase_add_checked_fixture(tc, NULL, teardown);
    tcase_add_loop_test(tc, test_bad_input, 0, NCASES);
    tcase_add_test(tc, test_table_leaks_nothing);
    tcase_add_test(tc, test_failures_outside_scope_leak_nothing);
    suite_add_tcase(s, tc);

    tc = tcase_create("abort");
    tcase_add_checked_fixture(tc, NULL, teardown);
    tcase_add_test(tc, test_abort_on_error_env);
    tcase_add_test(tc, test_abort_on_error_zero);
    suite_add_tcase(s, tc);

    tc = tcase_create("propagation");
    tcase_add_checked_fixture(tc, NULL, teardown);
    tcase_add_test(tc, test_first_error_kept);
    tcase_add_test(tc, test_gradcheck_null_input_keeps_error);
    tcase_add_test(tc, test_clear_error);
    tcase_add_test(tc, test_errors_are_thread_local);
    suite_add_tcase(s, tc);
    return s;
}
