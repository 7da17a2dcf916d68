/* test_pool.c: nb_max_pool2d, nb_avg_pool2d and nb_max_pool1d against
 * PyTorch (tests/fixtures/gen_pool.py, whose CASES this table repeats):
 * outputs and gradients bit for bit, on contiguous inputs and on the same
 * values laid out transposed in memory (the kernels' strided path), f32 and
 * f64; the 2x2 stride-2 fast path the same bits for 1, 2 and 3 threads;
 * gradcheck of every order on transposed inputs; every error by its text.
 * The registry suite runs the generic op checks and test_edges.c the edge
 * values. */
#include "test_util.h"

#include <stdlib.h>

static const char *FX = "pool.txt";

enum { MAX2D, AVG2D, MAX1D };
typedef struct {
    const char *name;
    int op;
    int64_t k[2], s[2], p[2]; /* 1d: [0] only; s[0] == 0: stride NULL (1d: 0) */
    bool cip;
} pool_case;

static const pool_case CASES[] = {
    {"max_k2s2", MAX2D, {2, 2}, {2, 2}, {0, 0}, true},
    {"max_k2s2_odd", MAX2D, {2, 2}, {2, 2}, {0, 0}, true},
    {"max_k2_snull", MAX2D, {2, 2}, {0, 0}, {0, 0}, true},
    {"max_k3s1p1", MAX2D, {3, 3}, {1, 1}, {1, 1}, true},
    {"max_k3s3", MAX2D, {3, 3}, {3, 3}, {0, 0}, true},
    {"max_k3x2s2x1p1", MAX2D, {3, 2}, {2, 1}, {1, 1}, true},
    {"max_k2x3s3x2p1", MAX2D, {2, 3}, {3, 2}, {1, 1}, true},
    {"max_ties", MAX2D, {2, 2}, {1, 1}, {0, 0}, true},
    {"max_ties_k2s2", MAX2D, {2, 2}, {2, 2}, {0, 0}, true},
    {"max_ties_k3p1", MAX2D, {3, 3}, {2, 2}, {1, 1}, true},
    {"max_nan", MAX2D, {3, 3}, {2, 2}, {1, 1}, true},
    {"max_nan_k2s2", MAX2D, {2, 2}, {2, 2}, {0, 0}, true},
    {"max_ninf", MAX2D, {3, 3}, {1, 1}, {1, 1}, true},
    {"max_ninf_k2s2", MAX2D, {2, 2}, {2, 2}, {0, 0}, true},
    {"max_unbatched", MAX2D, {3, 3}, {2, 2}, {1, 1}, true},
    {"max_unbatched_k2s2", MAX2D, {2, 2}, {2, 2}, {0, 0}, true},
    {"avg_k2s2", AVG2D, {2, 2}, {2, 2}, {0, 0}, true},
    {"avg_k3s1p1", AVG2D, {3, 3}, {1, 1}, {1, 1}, true},
    {"avg_k3s1p1_nocip", AVG2D, {3, 3}, {1, 1}, {1, 1}, false},
    {"avg_k3x2s2x1p1", AVG2D, {3, 2}, {2, 1}, {1, 1}, true},
    {"avg_k3x2s2x1p1_nocip", AVG2D, {3, 2}, {2, 1}, {1, 1}, false},
    {"avg_k3s3", AVG2D, {3, 3}, {3, 3}, {0, 0}, true},
    {"avg_k3_snull", AVG2D, {3, 3}, {0, 0}, {1, 1}, false},
    {"avg_unbatched", AVG2D, {3, 3}, {2, 2}, {1, 1}, true},
    {"max1d_k2s2", MAX1D, {2}, {2}, {0}, true},
    {"max1d_k3s1p1", MAX1D, {3}, {1}, {1}, true},
    {"max1d_k3s3", MAX1D, {3}, {3}, {0}, true},
    {"max1d_k3_snull", MAX1D, {3}, {0}, {1}, true},
    {"max1d_ties", MAX1D, {3}, {1}, {1}, true},
    {"max1d_nan", MAX1D, {3}, {2}, {1}, true},
    {"max1d_unbatched", MAX1D, {3}, {2}, {1}, true},
};
#define NCASES (int)(sizeof CASES / sizeof CASES[0])

static nb_tensor *run_case(const pool_case *c, nb_tensor *x) {
    const int64_t *s = c->s[0] ? c->s : NULL;
    switch (c->op) {
    case MAX2D: return nb_max_pool2d(x, c->k, s, c->p);
    case AVG2D: return nb_avg_pool2d(x, c->k, s, c->p, c->cip);
    default: return nb_max_pool1d(x, c->k[0], c->s[0], c->p[0]);
    }
}

/* got == want element by element, bit for bit (sign of zero; NaN as NaN) */
static void expect_same_bits(const char *what, const nb_tensor *got, const nb_tensor *want) {
    ck_assert_msg(got != NULL, "%s: %s", what, nb_last_error());
    ck_assert_int_eq(nb_ndim(got), nb_ndim(want));
    for (int d = 0; d < nb_ndim(got); d++) ck_assert_int_eq(nb_shape(got)[d], nb_shape(want)[d]);
    double *g = values(got), *w = values(want);
    for (int64_t i = 0; i < nb_numel(got); i++)
        ck_assert_msg((isnan(g[i]) && isnan(w[i])) ||
                          (g[i] == w[i] && signbit(g[i]) == signbit(w[i])),
                      "%s: element %lld is %.17g, torch's %.17g", what, (long long)i, g[i], w[i]);
    free(g);
    free(w);
}

/* The fixture's values laid out with the last two dims swapped in memory. */
static nb_tensor *transposed_copy(nb_tensor *v) {
    int nd = nb_ndim(v);
    int64_t sh[NB_MAX_DIMS];
    memcpy(sh, nb_shape(v), sizeof(int64_t) * (size_t)nd);
    sh[nd - 2] = nb_shape(v)[nd - 1];
    sh[nd - 1] = nb_shape(v)[nd - 2];
    nb_tensor *t = nb_transpose(nb_empty(nb_dtype_of(v), nd, sh), -1, -2);
    ck_assert_int_eq(nb_copy_into(t, v), 0);
    ck_assert(!nb_is_contiguous(t));
    return t;
}

START_TEST(pool_matches_torch) {
    const pool_case *c = &CASES[_i];
    for (int d = 0; d < 2; d++)
        for (int layout = 0; layout < 2; layout++) {
            const char *dt = d ? "f32" : "f64";
            char name[128], what[160];
#define FXN(part) (snprintf(name, sizeof name, "%s.%s.%s", c->name, dt, part), fx(FX, name))
            nb_tensor *x0 = FXN("x"), *w = FXN("w"), *out = FXN("out"), *gx = FXN("gx");
            nb_scope_begin();
            nb_tensor *x = layout ? transposed_copy(x0) : nb_contiguous(x0);
            nb_tensor *leaf = nb_set_requires_grad(nb_detach(x), true);
            nb_tensor *y = run_case(c, leaf);
            snprintf(what, sizeof what, "%s %s %s: output", c->name, dt,
                     layout ? "transposed" : "contiguous");
            expect_same_bits(what, y, out);
            ck_assert_int_eq(nb_backward(nb_sum_all(nb_mul(y, w))), 0);
            snprintf(what, sizeof what, "%s %s %s: gradient", c->name, dt,
                     layout ? "transposed" : "contiguous");
            expect_same_bits(what, nb_grad(leaf), gx);
            /* without grad: the kernels that save no positions */
            nb_set_grad_enabled(false);
            expect_same_bits(what, run_case(c, x), out);
            nb_set_grad_enabled(true);
            nb_scope_end();
#undef FXN
        }
}
END_TEST

/* The Fashion-MNIST network's pooling (kernel 2, stride 2 on 28x28 and
 * 14x14 planes): output and gradient the same bits for 1, 2 and 3 threads. */
START_TEST(pool_k2s2_thread_identity) {
    int before = nb_num_threads();
    for (int d = 0; d < 2; d++) {
        nb_dtype dt = d ? NB_F32 : NB_F64;
        unsigned char *first[2] = {0};
        size_t len[2] = {0};
        for (int t = 1; t <= 3; t++) {
            nb_set_num_threads(t);
            nb_scope_begin();
            nb_rng r;
            nb_rng_seed(&r, 28);
            nb_tensor *x = nb_set_requires_grad(nb_randn(dt, NB_SHAPE(16, 32, 28, 28), &r), true);
            nb_tensor *w = nb_randn(dt, NB_SHAPE(16, 32, 14, 14), &r);
            nb_tensor *y = nb_max_pool2d(x, (const int64_t[]){2, 2}, NULL, NULL);
            ck_assert_msg(y != NULL, "%s", nb_last_error());
            ck_assert_int_eq(nb_backward(nb_sum_all(nb_mul(y, w))), 0);
            nb_tensor *out[2] = {y, nb_grad(x)};
            for (int k = 0; k < 2; k++) {
                size_t n = (size_t)nb_numel(out[k]) * (d ? 4 : 8);
                if (t == 1) {
                    first[k] = malloc(n);
                    memcpy(first[k], nb_data(out[k]), n);
                    len[k] = n;
                } else {
                    ck_assert(n == len[k]);
                    ck_assert_msg(memcmp(first[k], nb_data(out[k]), n) == 0,
                                  "max_pool2d %s: %s differs between 1 and %d threads",
                                  nb_dtype_name(dt), k ? "the gradient" : "the output", t);
                }
            }
            nb_scope_end();
        }
        free(first[0]);
        free(first[1]);
    }
    nb_set_num_threads(before);
}
END_TEST

/* gradcheck, gradgradcheck and forward mode on inputs transposed in memory,
 * for the arguments the registry's calls do not take */
static nb_tensor *gc_pool(nb_tensor **in, int n, void *ctx) {
    (void)n;
    return run_case(ctx, in[0]);
}

START_TEST(pool_all_orders_transposed) {
    static const pool_case more[] = {
        {"max k2s2", MAX2D, {2, 2}, {2, 2}, {0, 0}, true},
        {"max k3 stride 1 overlapping", MAX2D, {3, 3}, {1, 1}, {1, 1}, true},
        {"avg count_include_pad false", AVG2D, {3, 2}, {2, 1}, {1, 1}, false},
        {"avg k2 stride NULL", AVG2D, {2, 2}, {0, 0}, {1, 0}, true},
        {"max1d stride 0", MAX1D, {2}, {0}, {1}, true},
    };
    for (int i = 0; i < (int)(sizeof more / sizeof more[0]); i++) {
        nb_scope_begin();
        bool one_d = more[i].op == MAX1D;
        nb_tensor *x = one_d ? transposed_leaf(40 + (uint64_t)i, NB_SHAPE(2, 3, 7), 1, 2)
                             : transposed_leaf(40 + (uint64_t)i, NB_SHAPE(2, 2, 5, 6), 2, 3);
        char label[96];
        snprintf(label, sizeof label, "pool: %s (transposed input)", more[i].name);
        expect_all_orders(label, gc_pool, (void *)&more[i], 1, &x);
        nb_scope_end();
    }
}
END_TEST

START_TEST(pool_errors) {
    nb_scope_begin();
    nb_tensor *x = nb_zeros(NB_F32, NB_SHAPE(2, 3, 6, 6));
    const int64_t k2[2] = {2, 2};
    expect_error(nb_max_pool2d(x, (const int64_t[]){0, 2}, NULL, NULL), "nb_max_pool2d",
                 "kernel_size (h) must be positive, got 0");
    expect_error(nb_avg_pool2d(x, (const int64_t[]){2, -1}, NULL, NULL, true), "nb_avg_pool2d",
                 "kernel_size (w) must be positive, got -1");
    expect_error(nb_max_pool1d(nb_zeros(NB_F32, NB_SHAPE(2, 5)), 0, 0, 0), "nb_max_pool1d",
                 "kernel_size must be positive, got 0");
    expect_error(nb_max_pool2d(x, k2, (const int64_t[]){1, -2}, NULL), "nb_max_pool2d",
                 "stride (w) must be positive, got -2");
    expect_error(nb_max_pool1d(nb_zeros(NB_F32, NB_SHAPE(2, 5)), 2, -1, 0), "nb_max_pool1d",
                 "stride must be positive, got -1");
    expect_error(nb_max_pool2d(x, (const int64_t[]){3, 3}, NULL, (const int64_t[]){1, 2}),
                 "nb_max_pool2d", "padding (w) must be between 0 and half the kernel size",
                 "got padding 2 for kernel_size 3");
    expect_error(nb_avg_pool2d(x, k2, NULL, (const int64_t[]){-1, 0}, true), "nb_avg_pool2d",
                 "padding (h) must be between 0 and half the kernel size, got padding -1");
    expect_error(nb_max_pool1d(nb_zeros(NB_F64, NB_SHAPE(2, 5)), 2, 1, 2), "nb_max_pool1d",
                 "padding must be between 0 and half the kernel size, got padding 2 for "
                 "kernel_size 2");
    expect_error(nb_max_pool2d(x, (const int64_t[]){7, 2}, NULL, NULL), "nb_max_pool2d",
                 "input (2,3,6,6) is too small for kernel_size (h) 7 with padding 0",
                 "(6 + 2 * 0 < 7)");
    expect_error(nb_max_pool1d(nb_zeros(NB_F32, NB_SHAPE(2, 3, 2)), 5, 1, 1), "nb_max_pool1d",
                 "input (2,3,2) is too small for kernel_size 5 with padding 1");
    expect_error(nb_max_pool2d(nb_zeros(NB_F32, NB_SHAPE(6, 6)), k2, NULL, NULL),
                 "nb_max_pool2d: expected a 3-d (C, H, W) or 4-d (N, C, H, W) input, got shape "
                 "(6,6)");
    expect_error(nb_avg_pool2d(nb_zeros(NB_F32, NB_SHAPE(1, 2, 3, 6, 6)), k2, NULL, NULL, true),
                 "nb_avg_pool2d: expected a 3-d (C, H, W) or 4-d (N, C, H, W) input");
    expect_error(nb_max_pool1d(nb_zeros(NB_F32, NB_SHAPE(5)), 2, 0, 0),
                 "nb_max_pool1d: expected a 2-d (C, L) or 3-d (N, C, L) input, got shape (5)");
    expect_error(nb_max_pool2d(nb_zeros(NB_F32, NB_SHAPE(2, 0, 6, 6)), k2, NULL, NULL),
                 "nb_max_pool2d: input (2,0,6,6) has an empty dim 1 (only the batch may be "
                 "empty)");
    expect_error(nb_max_pool2d(nb_zeros(NB_I64, NB_SHAPE(2, 3, 6, 6)), k2, NULL, NULL),
                 "nb_max_pool2d: expected a floating tensor (f32 or f64), got i64");
    expect_error(nb_avg_pool2d(nb_zeros(NB_BOOL, NB_SHAPE(2, 3, 6, 6)), k2, NULL, NULL, true),
                 "nb_avg_pool2d: expected a floating tensor (f32 or f64), got bool");
    expect_error(nb_max_pool2d(nb_to(x, NB_BF16), k2, NULL, NULL), "nb_max_pool2d",
                 "no bf16 kernel", "nb_to(t, NB_F32)");
    expect_error(nb_max_pool1d(nb_zeros(NB_BF16, NB_SHAPE(2, 6)), 2, 0, 0), "nb_max_pool1d",
                 "no bf16 kernel");
    expect_error(nb_max_pool2d(x, NULL, NULL, NULL), "nb_max_pool2d: kernel_size is NULL");
    expect_error(nb_avg_pool2d(x, NULL, NULL, NULL, true), "nb_avg_pool2d: kernel_size is NULL");
    expect_error(nb_max_pool2d(NULL, k2, NULL, NULL), "nb_max_pool2d: input 0 is NULL");
    /* an empty batch is not an error: torch's (0, C, OH, OW) */
    nb_tensor *e = nb_max_pool2d(nb_zeros(NB_F32, NB_SHAPE(0, 3, 6, 6)), k2, NULL, NULL);
    ck_assert_msg(e != NULL, "%s", nb_last_error());
    ck_assert_int_eq(nb_shape(e)[0], 0);
    ck_assert_int_eq(nb_shape(e)[2], 3);
    nb_scope_end();
}
END_TEST

Suite *suite_pool(void) {
    Suite *s = suite_create("pool");
    TCase *tc = tcase_create("pool");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, pool_matches_torch, 0, NCASES);
    tcase_add_test(tc, pool_k2s2_thread_identity);
    tcase_add_test(tc, pool_all_orders_transposed);
    tcase_add_test(tc, pool_errors);
    suite_add_tcase(s, tc);
    return s;
}
