/* test_bf16.c: the bf16 dtype (conversions bit for bit against PyTorch, I/O,
 * gradients through casts), bf16 products against PyTorch, and autocast
 * (regions, products, a forward and backward against PyTorch's autocast).
 * Which ops take bf16 and that the others refuse it is test_registry.c's. */
#include "test_util.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "tensor/bf16_internal.h"
#include "tensor/cpu_internal.h"
#include "ops/vmath.h"

/* The 16 bits of each element of a contiguous bf16 tensor. */
static int64_t bits_at(nb_tensor *t, int64_t i) { return ((const uint16_t *)nb_data(t))[i]; }

/* An f32 tensor (1-D) whose elements have the given 32-bit patterns. */
static nb_tensor *f32_from_bits(const nb_tensor *bits) {
    int64_t n = nb_numel(bits);
    uint32_t *u = malloc((size_t)n * sizeof *u);
    ck_assert_ptr_nonnull(u);
    const int64_t *b = nb_data((nb_tensor *)bits);
    for (int64_t i = 0; i < n; i++) u[i] = (uint32_t)b[i];
    nb_tensor *t = nb_from_data(NB_F32, 1, &n, u);
    free(u);
    return t;
}

static void expect_bits(const char *what, nb_tensor *got, const nb_tensor *want) {
    ck_assert_int_eq(nb_dtype_of(got), NB_BF16);
    ck_assert_int_eq(nb_numel(got), nb_numel(want));
    const int64_t *w = nb_data((nb_tensor *)want);
    for (int64_t i = 0; i < nb_numel(got); i++)
        ck_assert_msg(bits_at(got, i) == w[i], "%s: element %lld is 0x%04llx, PyTorch 0x%04llx",
                      what, (long long)i, (long long)bits_at(got, i), (long long)w[i]);
}

/* ------------------------------------------------------------ conversions */
START_TEST(bf16_from_f32_is_torchs) {
    nb_scope_begin();
    nb_tensor *x = f32_from_bits(fx("bf16.txt", "cv_f32_bits"));
    expect_bits("f32 -> bf16", nb_to(x, NB_BF16), fx("bf16.txt", "cv_f32_out"));
    /* the same bits from a strided (transposed) source */
    int64_t n = nb_numel(x);
    nb_tensor *m = nb_transpose(nb_view(x, NB_SHAPE(2, n / 2)), 0, 1);
    nb_tensor *mt = nb_contiguous(nb_transpose(nb_to(m, NB_BF16), 0, 1));
    expect_bits("f32 -> bf16, transposed", nb_view(mt, NB_SHAPE(-1)), fx("bf16.txt", "cv_f32_out"));
    nb_scope_end();
}
END_TEST

START_TEST(bf16_from_f64_is_torchs) {
    nb_scope_begin();
    nb_tensor *x = fx("bf16.txt", "cv_f64_x");
    expect_bits("f64 -> bf16", nb_to(x, NB_BF16), fx("bf16.txt", "cv_f64_out"));
    nb_scope_end();
}
END_TEST

START_TEST(bf16_to_f32_and_f64_exact) {
    nb_scope_begin();
    const nb_tensor *bits = fx("bf16.txt", "cv_bf16_bits");
    const nb_tensor *want = fx("bf16.txt", "cv_bf16_f32");
    int64_t n = nb_numel(bits);
    uint16_t *h = malloc((size_t)n * sizeof *h);
    const int64_t *b = nb_data((nb_tensor *)bits);
    for (int64_t i = 0; i < n; i++) h[i] = (uint16_t)b[i];
    nb_tensor *t = nb_from_data(NB_BF16, 1, &n, h);
    free(h);
    nb_tensor *f = nb_to(t, NB_F32), *d = nb_to(t, NB_F64);
    double *dv = values(d);
    const int64_t *w = nb_data((nb_tensor *)want);
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, (const float *)nb_data(f) + i, 4);
        ck_assert_msg(u == (uint32_t)w[i], "bf16 0x%04llx -> f32 0x%08x, PyTorch 0x%08llx",
                      (long long)b[i], u, (long long)w[i]);
        float wf;
        uint32_t wu = (uint32_t)w[i];
        memcpy(&wf, &wu, 4);
        ck_assert(isnan(wf) ? isnan(dv[i]) : dv[i] == (double)wf);
        /* and back: every bf16 value (NaN aside) survives f32 and f64 */
        if (!isnan(wf)) ck_assert_int_eq(bits_at(nb_to(nb_to(t, NB_F64), NB_BF16), i), b[i]);
    }
    free(dv);
    nb_scope_end();
}
END_TEST

START_TEST(bf16_creation_item_copy) {
    nb_scope_begin();
    nb_tensor *o = nb_full(NB_BF16, NB_SHAPE(2, 3), 1.0 / 3.0);
    ck_assert_double_eq(nb_item(nb_select(nb_select(o, 0, 1), 0, 2)), 0.333984375);
    ck_assert_int_eq(bits_at(o, 0), 0x3eab);
    nb_tensor *z = nb_zeros(NB_BF16, NB_SHAPE(4));
    ck_assert_int_eq(bits_at(z, 3), 0);
    nb_tensor *a = nb_arange(NB_BF16, 300);
    ck_assert_double_eq(nb_item(nb_select(a, 0, 257)), 256.0); /* 257 is not a bf16 */
    double out[6];
    ck_assert_int_eq(nb_copy_to_f64(nb_transpose(o, 0, 1), out), 0);
    ck_assert_double_eq(out[5], 0.333984375);
    /* nb_copy_into converts f32 into bf16 storage (broadcast) */
    ck_assert_int_eq(nb_copy_into(o, nb_full(NB_F32, NB_SHAPE(3), 2.5f)), 0);
    ck_assert_int_eq(bits_at(o, 4), 0x4020);
    ck_assert_int_eq(nb_dtype_of(nb_empty(NB_BF16, NB_SHAPE(1))), NB_BF16);
    ck_assert_str_eq(nb_dtype_name(NB_BF16), "bf16");
    expect_error(nb_randn(NB_BF16, NB_SHAPE(2), NULL), "nb_randn", "bf16");
    /* a 0-d bf16 is refused too (nb_argmax took a shortcut past the check;
     * the op fuzzer found it) */
    nb_tensor *s = nb_full(NB_BF16, 0, NULL, 1.0);
    expect_error(nb_argmax(s, 0, false), "nb_argmax:", "no bf16 kernel");
    expect_error(nb_max(s, 0, false), "nb_max:", "no bf16 kernel");
    expect_error(nb_exp(s), "nb_exp:", "no bf16 kernel");
    expect_error(nb_to(o, (nb_dtype)9), "nb_to: unknown dtype 9");
    nb_set_default_dtype(NB_BF16);
    ck_assert_int_eq(nb_default_dtype(), NB_F32);
    ck_assert_ptr_nonnull(strstr(nb_last_error(), "got bf16"));
    nb_clear_error();
    nb_scope_end();
}
END_TEST

START_TEST(bf16_print) {
    nb_scope_begin();
    nb_tensor *t = nb_to(nb_from_data(NB_F32, NB_SHAPE(2), (const float[]){1.5f, -0.1f}), NB_BF16);
    /* nb_print writes to stdout: point stdout's descriptor at a file for it */
    test_make_tmp_dir("bf16-print");
    const char *path = test_tmp_path("print.txt");
    fflush(stdout);
    int saved = dup(STDOUT_FILENO), fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ck_assert(saved >= 0 && fd >= 0 && dup2(fd, STDOUT_FILENO) >= 0);
    nb_print(t);
    fflush(stdout);
    ck_assert_int_ge(dup2(saved, STDOUT_FILENO), 0);
    close(saved);
    close(fd);
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    char buf[256];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    test_remove_tmp_dir();
    buf[n] = 0;
    ck_assert_msg(strstr(buf, "1.5000") && strstr(buf, "-0.1001") && strstr(buf, "bf16"),
                  "nb_print of a bf16 tensor printed: %s", buf);
    nb_scope_end();
}
END_TEST

START_TEST(bf16_save_load) {
    test_make_tmp_dir("bf16");
    nb_scope_begin(); /* the registries keep handles of their own */
    nb_params *ps = nb_params_new(), *qs = nb_params_new();
    nb_tensor *w = nb_to(nb_from_data(NB_F32, NB_SHAPE(3), (const float[]){1.f, -2.5f, 1e-3f}),
                         NB_BF16);
    ck_assert_ptr_nonnull(nb_params_add_buffer(ps, "w16", w));
    ck_assert_ptr_nonnull(nb_params_add_buffer(qs, "w16", nb_zeros(NB_BF16, NB_SHAPE(3))));
    const char *path = test_tmp_path("m.safetensors");
    ck_assert_int_eq(nb_save(ps, path), 0);
    /* the header says BF16 and the data are the 2-byte patterns */
    FILE *f = fopen(path, "rb");
    char buf[512] = {0};
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    ck_assert(n > 8 + 6);
    ck_assert_ptr_nonnull(strstr(buf + 8, "\"dtype\":\"BF16\""));
    ck_assert_int_eq(nb_load(qs, path), 0);
    nb_tensor *r = nb_params_get(qs, "w16");
    for (int i = 0; i < 3; i++) ck_assert_int_eq(bits_at(r, i), bits_at(w, i));
    /* a bf16 file into an f32 buffer is refused by name and dtype */
    nb_params *fs = nb_params_new();
    ck_assert_ptr_nonnull(nb_params_add_buffer(fs, "w16", nb_zeros(NB_F32, NB_SHAPE(3))));
    expect_error_rc(nb_load(fs, path), "w16", "BF16", "F32");
    /* parameters stay f32 or f64 (the master weights of mixed precision) */
    expect_error(nb_params_add(fs, "p", nb_zeros(NB_BF16, NB_SHAPE(2))), "must be f32 or f64",
                 "bf16");
    nb_scope_end();
    nb_params_free(ps);
    nb_params_free(qs);
    nb_params_free(fs);
    test_remove_tmp_dir();
}
END_TEST

/* Gradients cross the casts both ways; one used twice adds in bf16. */
START_TEST(bf16_gradients_through_casts) {
    nb_scope_begin();
    nb_tensor *x = nb_set_requires_grad(nb_from_data(NB_F32, NB_SHAPE(3),
                                                     (const float[]){1.f, 2.f, 3.f}), true);
    nb_tensor *h = nb_to(x, NB_BF16);
    nb_tensor *y = nb_to(nb_cat((nb_tensor *[]){h, h}, 2, 0), NB_F32); /* (6) */
    nb_tensor *g = nb_from_data(NB_F32, NB_SHAPE(6), (const float[]){1, 2, 3, 0.5f, 0.25f, 1.f / 3});
    ck_assert_int_eq(nb_backward_with_grad(y, g), 0);
    double gx[3];
    nb_copy_to_f64(nb_grad(x), gx);
    ck_assert_double_eq(gx[0], 1.5);
    ck_assert_double_eq(gx[1], 2.25);
    /* 3 + bf16(1/3) = 3.333984375, rounded to bf16 (steps of 2^-6 there) */
    ck_assert_double_eq(gx[2], 3.328125);
    /* a bf16 leaf gets a bf16 gradient */
    nb_tensor *l = nb_set_requires_grad(nb_zeros(NB_BF16, NB_SHAPE(2)), true);
    ck_assert_int_eq(nb_backward_with_grad(nb_to(l, NB_F64), nb_full(NB_F64, NB_SHAPE(2), 0.1)), 0);
    ck_assert_int_eq(nb_dtype_of(nb_grad(l)), NB_BF16);
    ck_assert_int_eq(bits_at(nb_grad(l), 1), 0x3dcd);
    nb_scope_end();
}
END_TEST

/* ---------------------------------------------------------------- products */
/* The ISA paths this CPU has, and the fallbacks below them. */
static int paths_here(int *paths) {
    int n = 0, best = nbi_isa_force(-1);
    for (int p = NBI_ISA_PORTABLE; p <= best; p++) paths[n++] = p;
    return n;
}

/* Case c of the fixtures against `which` ("out": PyTorch's bf16 product,
 * "exact": the exact product rounded): at most one bf16 step apart (an f32
 * sum in another order), and mostly equal. */
static void check_product(const char *c, bool bt, const char *which) {
    char an[32], bn[32], on[32];
    snprintf(an, sizeof an, "mm_%s_a", c);
    snprintf(bn, sizeof bn, "mm_%s_b", c);
    snprintf(on, sizeof on, "mm_%s_%s", c, which);
    nb_tensor *a = nb_to(fx("bf16.txt", an), NB_BF16), *b = nb_to(fx("bf16.txt", bn), NB_BF16);
    if (bt) b = nb_transpose(b, 0, 1);
    const nb_tensor *want = fx("bf16.txt", on);
    nb_tensor *got = nb_matmul(a, b);
    ck_assert_msg(got != NULL, "%s", nb_last_error());
    ck_assert_int_eq(nb_dtype_of(got), NB_BF16);
    ck_assert_int_eq(nb_numel(got), nb_numel(want));
    /* f32 sums in another order: at most one bf16 step apart */
    const int64_t *w = nb_data((nb_tensor *)want);
    nb_tensor *gc = nb_contiguous(got);
    int64_t off = 0;
    for (int64_t i = 0; i < nb_numel(want); i++) {
        int64_t d = llabs(bits_at(gc, i) - w[i]);
        ck_assert_msg(d <= 1, "%s (%s): element %lld is 0x%04llx, PyTorch 0x%04llx", c,
                      nbi_isa_name(nbi_isa()), (long long)i, (long long)bits_at(gc, i),
                      (long long)w[i]);
        off += d != 0;
    }
    ck_assert_msg(off * 10 <= nb_numel(want), "%s: %lld of %lld elements one step off", c,
                  (long long)off, (long long)nb_numel(want));
}

START_TEST(bf16_matmul_is_torchs_on_every_path) {
    int paths[NBI_ISA_COUNT], np = paths_here(paths);
    for (int i = 0; i < np; i++) {
        nb_scope_begin();
        ck_assert_int_eq(nbi_isa_force(paths[i]), paths[i]);
        check_product("plain", false, "out");
        check_product("bt", true, "out");
        check_product("batch", false, "out");
        check_product("plain", false, "exact");
        /* PyTorch 1.13 sums narrow products in bf16 (docs/numerics.md) */
        check_product("narrow", false, "exact");
        nb_scope_end();
    }
    nbi_isa_force(-1);
}
END_TEST

/* Bitwise the same for 1 and 2 threads and for any cut, on each path. */
START_TEST(bf16_matmul_thread_identity) {
    int paths[NBI_ISA_COUNT], np = paths_here(paths);
    int saved = nb_num_threads();
    for (int i = 0; i < np; i++) {
        nbi_isa_force(paths[i]);
        nb_scope_begin();
        nb_rng r;
        nb_rng_seed(&r, 5);
        nb_tensor *a = nb_to(nb_randn(NB_F32, NB_SHAPE(200, 300), &r), NB_BF16);
        nb_tensor *b = nb_to(nb_randn(NB_F32, NB_SHAPE(300, 500), &r), NB_BF16);
        nb_set_num_threads(1);
        nb_tensor *c1 = nb_matmul(a, b);
        nb_set_num_threads(2);
        nb_tensor *c2 = nb_matmul(a, b);
        ck_assert(c1 && c2);
        ck_assert_msg(!memcmp(nb_data(c1), nb_data(c2), 200 * 500 * 2), "%s: 1 and 2 threads differ",
                      nbi_isa_name(paths[i]));
        nb_scope_end();
    }
    nb_set_num_threads(saved);
    nbi_isa_force(-1);
}
END_TEST

/* ---------------------------------------------------------------- autocast */
START_TEST(autocast_regions) {
    ck_assert_int_eq(nb_autocast_dtype(), NB_F32);
    ck_assert_int_eq(nb_autocast_begin(NB_BF16), 0);
    ck_assert_int_eq(nb_autocast_dtype(), NB_BF16);
    ck_assert_int_eq(nb_autocast_begin(NB_F32), 0);
    ck_assert_int_eq(nb_autocast_dtype(), NB_F32);
    ck_assert_int_eq(nb_autocast_end(), 0);
    ck_assert_int_eq(nb_autocast_dtype(), NB_BF16);
    ck_assert_int_eq(nb_autocast_end(), 0);
    ck_assert_int_eq(nb_autocast_dtype(), NB_F32);
    expect_error_rc(nb_autocast_end(), "nb_autocast_end: no autocast region is open");
    expect_error_rc(nb_autocast_begin(NB_F64), "nb_autocast_begin", "got f64");
    int i = 0;
    while (i < 100 && nb_autocast_begin(NB_BF16) == 0) i++;
    ck_assert_int_eq(i, 64);
    expect_error_rc(-1, "more than 64 nested regions");
    while (i-- > 0) ck_assert_int_eq(nb_autocast_end(), 0);
}
END_TEST

/* Inside a region an f32 product is the bf16 product of the rounded
 * operands, returned in f32 without rounding; f64 is left alone. */
START_TEST(autocast_matmul) {
    nb_scope_begin();
    nb_rng r;
    nb_rng_seed(&r, 9);
    nb_tensor *a = nb_randn(NB_F32, NB_SHAPE(33, 70), &r), *b = nb_randn(NB_F32, NB_SHAPE(70, 19), &r);
    nb_tensor *ab = nb_to(a, NB_BF16), *bb = nb_to(b, NB_BF16);
    nb_tensor *want = nb_matmul(nb_to(ab, NB_F64), nb_to(bb, NB_F64));
    ck_assert_int_eq(nb_autocast_begin(NB_BF16), 0);
    nb_tensor *c = nb_matmul(a, b), *cm = nb_matmul(ab, b), *c64 = nb_matmul(nb_to(a, NB_F64),
                                                                            nb_to(b, NB_F64));
    nb_tensor *cb = nb_matmul(ab, bb);
    ck_assert_int_eq(nb_autocast_end(), 0);
    ck_assert_int_eq(nb_dtype_of(c), NB_F32);
    ck_assert_int_eq(nb_dtype_of(cm), NB_F32);
    ck_assert_int_eq(nb_dtype_of(c64), NB_F64);
    ck_assert_int_eq(nb_dtype_of(cb), NB_BF16);
    ck_assert(!memcmp(nb_data(c), nb_data(cm), 33 * 19 * 4));
    expect_close(nb_to(c, NB_F64), want, 1e-4, 1e-5);
    /* f64 in a region is exact f64 */
    expect_close(c64, nb_matmul(nb_to(a, NB_F64), nb_to(b, NB_F64)), 0, 0);
    /* outside, bf16 with f32 is an error that names the dtypes and the ways
     * out (not "no bf16 kernel": there is one); bf16 with f64 or i64 is one
     * inside a region too */
    expect_error(nb_matmul(ab, b), "nb_matmul: operands are bf16 and f32: a bf16 operand pairs "
                 "with another bf16 one, or with f32 inside an autocast region "
                 "(nb_autocast_begin(NB_BF16)); or convert one with nb_to");
    ck_assert_int_eq(nb_autocast_begin(NB_BF16), 0);
    expect_error(nb_matmul(nb_to(a, NB_F64), bb), "nb_matmul: operands are f64 and bf16: a bf16 "
                 "operand pairs with bf16 (or with f32 inside an autocast region), never with f64; "
                 "convert one with nb_to");
    expect_error(nb_matmul(ab, nb_ones(NB_I64, NB_SHAPE(70, 2))), "nb_matmul: operands are bf16 "
                 "and i64", "never with i64");
    ck_assert_int_eq(nb_autocast_end(), 0);
    /* an index tensor into a floating op: the way out is named */
    expect_error(nb_add(nb_ones(NB_I64, NB_SHAPE(2)), nb_ones(NB_F32, NB_SHAPE(2))),
                 "nb_add: expected a floating tensor (f32 or f64), got i64; convert it with "
                 "nb_to(t, NB_F32) (or NB_F64)");
    nb_scope_end();
}
END_TEST

typedef struct {
    nb_tensor *x, *w1, *b1, *w2, *b2;
} mlp;

static nb_tensor *mlp_loss(const mlp *m) {
    nb_tensor *h = nb_gelu(nb_linear(m->x, m->w1, m->b1));
    nb_tensor *y = nb_linear(h, m->w2, m->b2);
    return nb_mean_all(nb_mul(y, y));
}

/* torch.autocast's forward and backward of a small MLP: the same within
 * bf16's precision (PyTorch rounds each product's result to bf16, nabla
 * returns it in f32: the difference is one bf16 rounding per product). The
 * backward runs in bf16 though it is called outside the region. */
START_TEST(autocast_mlp_is_torchs) {
    nb_scope_begin();
    const char *names[5] = {"ac_x", "ac_w1", "ac_b1", "ac_w2", "ac_b2"};
    nb_tensor *p[5];
    for (int i = 0; i < 5; i++)
        p[i] = nb_set_requires_grad(nb_contiguous(fx("bf16.txt", names[i])), true);
    mlp m = {p[0], p[1], p[2], p[3], p[4]};
    ck_assert_int_eq(nb_autocast_begin(NB_BF16), 0);
    nb_tensor *loss = mlp_loss(&m);
    ck_assert_int_eq(nb_autocast_end(), 0);
    ck_assert_msg(loss != NULL, "%s", nb_last_error());
    ck_assert_int_eq(nb_dtype_of(loss), NB_F32);
    ck_assert_int_eq(nb_backward(loss), 0);
    double want = nb_item(fx("bf16.txt", "ac_loss"));
    ck_assert_msg(fabs(nb_item(loss) - want) <= 1e-2 * fabs(want), "loss %.6f, PyTorch %.6f",
                  nb_item(loss), want);
    const char *gn[5] = {"ac_gx", "ac_gw1", "ac_gb1", "ac_gw2", "ac_gb2"};
    for (int i = 0; i < 5; i++) {
        nb_tensor *g = nb_grad(p[i]);
        ck_assert_int_eq(nb_dtype_of(g), NB_F32);
        expect_close(g, fx("bf16.txt", gn[i]), 2e-3, 4e-2);
    }
    /* and unlike f32: the products really ran in bf16 */
    nb_tensor *l32 = mlp_loss(&m);
    ck_assert(fabs(nb_item(l32) - nb_item(loss)) > 1e-7 * fabs(nb_item(l32)));
    nb_scope_end();
}
END_TEST

/* The gradient of W in loss = sum((x W)^2), W f32, recorded in a region of
 * dtype `rec` (NB_F32: none, or nested f32 inside bf16) and differentiated
 * with a region of dtype `bw` open (NB_F32: none). */
static nb_tensor *grad_recorded_in(nb_dtype rec, bool nested, nb_dtype bw) {
    nb_rng r;
    nb_rng_seed(&r, 4);
    nb_tensor *x = nb_randn(NB_F32, NB_SHAPE(16, 40), &r);
    nb_tensor *w = nb_set_requires_grad(nb_randn(NB_F32, NB_SHAPE(40, 24), &r), true);
    if (nested) ck_assert_int_eq(nb_autocast_begin(NB_BF16), 0);
    if (rec == NB_BF16 || nested) ck_assert_int_eq(nb_autocast_begin(rec), 0);
    nb_tensor *y = nb_matmul(x, w);
    if (rec == NB_BF16 || nested) ck_assert_int_eq(nb_autocast_end(), 0);
    if (nested) ck_assert_int_eq(nb_autocast_end(), 0);
    nb_tensor *loss = nb_sum_all(nb_mul(y, y));
    if (bw == NB_BF16) ck_assert_int_eq(nb_autocast_begin(NB_BF16), 0);
    ck_assert_int_eq(nb_backward(loss), 0);
    if (bw == NB_BF16) ck_assert_int_eq(nb_autocast_end(), 0);
    ck_assert_int_eq(nb_autocast_dtype(), NB_F32);
    return nb_grad(w);
}

static bool same_bits(nb_tensor *a, nb_tensor *b) {
    return nb_numel(a) == nb_numel(b) && nb_dtype_of(a) == nb_dtype_of(b) &&
           !memcmp(nb_data(a), nb_data(b), (size_t)nb_numel(a) * 4);
}

/* Each product's backward runs as its forward did, whatever region is open
 * where nb_backward is called: an f32 product (outside autocast, or inside
 * a nested f32 region) is differentiated in f32 under an open bf16 region
 * (its gradient was 0.0255 away from f32's when the rule took the caller's
 * region), and a bf16 product in bf16 outside any. */
START_TEST(autocast_backward_runs_as_forward) {
    nb_scope_begin();
    nb_tensor *f32 = grad_recorded_in(NB_F32, false, NB_F32);
    nb_tensor *bf = grad_recorded_in(NB_BF16, false, NB_F32);
    ck_assert(!same_bits(f32, bf)); /* the two really differ */
    ck_assert(same_bits(grad_recorded_in(NB_F32, false, NB_BF16), f32));
    ck_assert(same_bits(grad_recorded_in(NB_F32, true, NB_BF16), f32));
    ck_assert(same_bits(grad_recorded_in(NB_F32, true, NB_F32), f32));
    ck_assert(same_bits(grad_recorded_in(NB_BF16, false, NB_BF16), bf));
    nb_scope_end();
}
END_TEST

/* A custom function's backward runs in the autocast dtype of its forward
 * (as torch's custom_bwd), and may close only the regions it opened. */
static nb_dtype seen_in_backward;
static nb_tensor *ident_fwd(nb_function_ctx *ctx, nb_tensor **in, int n, void *user) {
    (void)ctx, (void)n, (void)user;
    return nb_mul_scalar(in[0], 1);
}
static int ident_bwd(nb_function_ctx *ctx, nb_tensor *g, nb_tensor **gin, void *user) {
    (void)ctx, (void)user;
    seen_in_backward = nb_autocast_dtype();
    expect_error_rc(nb_autocast_end(), "nb_autocast_end: no autocast region is open on this "
                    "thread (inside a backward or tangent rule, only the rule's own)");
    ck_assert_int_eq(nb_autocast_begin(NB_F32), 0); /* left open: ends with the rule */
    gin[0] = g;
    return 0;
}

START_TEST(autocast_custom_backward_region) {
    static const nb_function ident = {.name = "ident", .forward = ident_fwd, .backward = ident_bwd};
    for (int rec = 0; rec < 2; rec++) {
        nb_scope_begin();
        nb_tensor *x = nb_set_requires_grad(nb_ones(NB_F32, NB_SHAPE(3)), true);
        if (rec) ck_assert_int_eq(nb_autocast_begin(NB_BF16), 0);
        nb_tensor *y = nb_function_apply(&ident, &x, 1, NULL);
        if (rec) ck_assert_int_eq(nb_autocast_end(), 0);
        if (!rec) ck_assert_int_eq(nb_autocast_begin(NB_BF16), 0);
        seen_in_backward = (nb_dtype)-1;
        ck_assert_int_eq(nb_backward(nb_sum_all(y)), 0);
        ck_assert_int_eq(seen_in_backward, rec ? NB_BF16 : NB_F32);
        ck_assert_int_eq(nb_autocast_dtype(), rec ? NB_F32 : NB_BF16); /* the caller's, intact */
        if (!rec) ck_assert_int_eq(nb_autocast_end(), 0);
        ck_assert_int_eq(nb_autocast_dtype(), NB_F32);
        nb_scope_end();
    }
}
END_TEST

/* ------------------------------------------------- autocast of convolutions */
/* t rounded to bf16 and back, as f64 */
static nb_tensor *rounded64(nb_tensor *t) { return nb_to(nb_to(t, NB_BF16), NB_F64); }

typedef struct {
    nb_tensor *y, *gx, *gw, *gb;
} conv_run;

/* y = conv2d(x, w, b) (stride (2,1), padding (1,2), dilation (1,2), 2 groups)
 * and the gradients of sum(y * G): in a bf16 region (region), or none. */
static conv_run conv_grads(nb_tensor *x, nb_tensor *w, nb_tensor *b, nb_tensor *G, bool region) {
    nb_tensor *xs = nb_set_requires_grad(nb_detach(x), true);
    nb_tensor *ws = nb_set_requires_grad(nb_detach(w), true);
    nb_tensor *bs = nb_set_requires_grad(nb_detach(b), true);
    if (region) ck_assert_int_eq(nb_autocast_begin(NB_BF16), 0);
    nb_tensor *y = nb_conv2d(xs, ws, bs, (const int64_t[]){2, 1}, (const int64_t[]){1, 2},
                             (const int64_t[]){1, 2}, 2);
    if (region) ck_assert_int_eq(nb_autocast_end(), 0);
    ck_assert_msg(y != NULL, "%s", nb_last_error());
    ck_assert_int_eq(nb_backward(nb_sum_all(nb_mul(y, G))), 0); /* outside the region */
    return (conv_run){y, nb_grad(xs), nb_grad(ws), nb_grad(bs)};
}

/* Under autocast an f32 conv is the conv of the bf16-rounded operands summed
 * in f32, returned in f32 (as nb_matmul), forward and backward, on every
 * path; and unlike the f32 conv it really rounds. G is bf16-exact, so the
 * backward's rounding of it changes nothing. */
START_TEST(autocast_conv_is_the_rounded_conv) {
    int paths[NBI_ISA_COUNT], np = paths_here(paths);
    for (int i = 0; i < np; i++) {
        nbi_isa_force(paths[i]);
        nb_scope_begin();
        nb_rng r;
        nb_rng_seed(&r, 12);
        nb_tensor *x = nb_randn(NB_F32, NB_SHAPE(3, 6, 11, 13), &r);
        nb_tensor *w = nb_mul_scalar(nb_randn(NB_F32, NB_SHAPE(8, 3, 3, 4), &r), 0.3);
        nb_tensor *b = nb_randn(NB_F32, NB_SHAPE(8), &r);
        conv_run f32 = conv_grads(x, w, b, nb_ones(NB_F32, NB_SHAPE(1)), false);
        nb_tensor *G = nb_to(nb_to(nb_randn(NB_F32, nb_ndim(f32.y), nb_shape(f32.y), &r),
                                   NB_BF16), NB_F32);
        conv_run ac = conv_grads(x, w, b, G, true);
        conv_run ref = conv_grads(rounded64(x), rounded64(w), nb_to(b, NB_F64), nb_to(G, NB_F64),
                                  false);
        nb_tensor *got[4] = {ac.y, ac.gx, ac.gw, ac.gb}, *want[4] = {ref.y, ref.gx, ref.gw, ref.gb};
        for (int k = 0; k < 4; k++) {
            ck_assert_int_eq(nb_dtype_of(got[k]), NB_F32);
            expect_close(nb_to(got[k], NB_F64), want[k], 1e-4, 1e-5);
        }
        nb_tensor *d = nb_max(nb_reshape(nb_abs(nb_sub(ac.y, f32.y)), NB_SHAPE(-1)), 0, false);
        ck_assert_msg(nb_item(d) > 1e-3, "%s: the autocast conv is the f32 one (%g apart)",
                      nbi_isa_name(paths[i]), nb_item(d));
        nb_scope_end();
    }
    nbi_isa_force(-1);
}
END_TEST

/* The same bits for 1 and 2 threads, forward and backward, on each path. */
START_TEST(autocast_conv_thread_identity) {
    int paths[NBI_ISA_COUNT], np = paths_here(paths), saved = nb_num_threads();
    for (int i = 0; i < np; i++) {
        nbi_isa_force(paths[i]);
        nb_scope_begin();
        nb_rng r;
        nb_rng_seed(&r, 13);
        nb_tensor *x = nb_randn(NB_F32, NB_SHAPE(4, 8, 24, 20), &r);
        nb_tensor *w = nb_randn(NB_F32, NB_SHAPE(16, 4, 3, 3), &r);
        nb_tensor *b = nb_randn(NB_F32, NB_SHAPE(16), &r);
        nb_tensor *G = nb_ones(NB_F32, NB_SHAPE(1));
        nb_set_num_threads(1);
        conv_run one = conv_grads(x, w, b, G, true);
        nb_set_num_threads(2);
        conv_run two = conv_grads(x, w, b, G, true);
        nb_tensor *p[4] = {one.y, one.gx, one.gw, one.gb}, *q[4] = {two.y, two.gx, two.gw, two.gb};
        for (int k = 0; k < 4; k++)
            ck_assert_msg(same_bits(p[k], q[k]), "%s: output %d differs on 1 and 2 threads",
                          nbi_isa_name(paths[i]), k);
        nb_scope_end();
    }
    nb_set_num_threads(saved);
    nbi_isa_force(-1);
}
END_TEST

/* gelu_tanh and its gradient at x (a (n) f32 tensor, g = 1), inside a bf16
 * autocast region or not; *gx gets the gradient. */
static nb_tensor *gelu_tanh_run(nb_tensor *x, bool region, nb_tensor **gx) {
    nb_tensor *xr = nb_set_requires_grad(nb_detach(x), true);
    if (region) ck_assert_int_eq(nb_autocast_begin(NB_BF16), 0);
    nb_tensor *y = nb_gelu_tanh(xr);
    if (region) ck_assert_int_eq(nb_autocast_end(), 0);
    ck_assert_msg(y != NULL, "%s", nb_last_error());
    ck_assert_int_eq(nb_backward_with_grad(y, nb_ones(NB_F32, nb_ndim(y), nb_shape(y))), 0);
    *gx = nb_grad(xr);
    return y;
}

/* Inside a bf16 region gelu_tanh and its derivative run in float
 * (ops/vmath.h, gelu_tanh_lowp): within 5e-7 and 2.4e-7 of the f32 op's
 * double-evaluated results on [-12, 12] (12 ulp for |x| <= 3), the same
 * infinities and NaNs, on every vmath path; and the same bits on 1 and 2
 * threads. */
START_TEST(autocast_gelu_tanh_in_float) {
    const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e20f, -1e20f, 30.0f, -30.0f};
    const int64_t ns = 9, ng = 48001, n = ng + ns;
    int saved = nb_num_threads();
    for (int path = 0; path < NBV_COUNT; path++) {
        if (nbi_vmath_path(path) != path) continue;
        nb_scope_begin();
        nb_tensor *x = nb_empty(NB_F32, 1, &n);
        float *px = nb_data(x);
        for (int64_t i = 0; i < ng; i++) px[i] = -12.0f + 24.0f * (float)i / (float)(ng - 1);
        for (int64_t i = 0; i < ns; i++) px[ng + i] = special[i];
        nb_tensor *g32, *glp;
        nb_tensor *y32 = gelu_tanh_run(x, false, &g32), *ylp = gelu_tanh_run(x, true, &glp);
        const float *a = nb_data(y32), *b = nb_data(ylp), *c = nb_data(g32), *d = nb_data(glp);
        int64_t differ = 0;
        for (int64_t i = 0; i < n; i++) {
            differ += memcmp(&a[i], &b[i], 4) != 0;
            if (i >= ng) { /* special values: the f32 op's infinities and NaNs */
                ck_assert_msg(isnan(a[i]) == isnan(b[i]) && (isinf(a[i]) ? a[i] == b[i] : 1),
                              "path %d: gelu_tanh(%g) = %g, f32 op %g", path, px[i], b[i], a[i]);
                ck_assert_msg(isnan(c[i]) == isnan(d[i]) && (isinf(c[i]) ? c[i] == d[i] : 1),
                              "path %d: gelu_tanh'(%g) = %g, f32 op %g", path, px[i], d[i], c[i]);
                if (!isnan(a[i]) && !isinf(a[i]) && fabsf(px[i]) <= 30)
                    ck_assert_msg(fabs((double)a[i] - b[i]) <= 5e-7, "path %d at %g", path, px[i]);
                continue;
            }
            double ulp = nextafterf(fabsf(a[i]), INFINITY) - fabsf(a[i]);
            ck_assert_msg(fabs((double)a[i] - b[i]) <= 5e-7, "path %d: gelu_tanh(%.9g) = %.9g, "
                          "f32 op %.9g", path, px[i], b[i], a[i]);
            ck_assert_msg(fabsf(px[i]) > 3 || fabs((double)a[i] - b[i]) <= 12 * ulp,
                          "path %d: gelu_tanh(%.9g) = %.9g, f32 op %.9g: over 12 ulp", path,
                          px[i], b[i], a[i]);
            ck_assert_msg(fabs((double)c[i] - d[i]) <= 2.5e-7, "path %d: gelu_tanh'(%.9g) = "
                          "%.9g, f32 op %.9g", path, px[i], d[i], c[i]);
        }
        ck_assert_msg(differ > 0, "path %d: the region's gelu_tanh gave the f32 op's bits", path);
        nb_set_num_threads(1);
        nb_tensor *g1, *y1 = gelu_tanh_run(x, true, &g1);
        nb_set_num_threads(2);
        nb_tensor *g2, *y2 = gelu_tanh_run(x, true, &g2);
        ck_assert_msg(same_bits(y1, y2) && same_bits(g1, g2) && same_bits(y1, ylp),
                      "path %d: gelu_tanh in a region differs on 1 and 2 threads", path);
        nb_set_num_threads(saved);
        nb_scope_end();
    }
    nbi_vmath_path(NBV_AUTO);
}
END_TEST

/* ||a - b|| (2-norm over all elements) */
static double dist(nb_tensor *a, nb_tensor *b) {
    return sqrt(nb_item(nb_sum_all(nb_pow_scalar(nb_sub(nb_to(a, NB_F64), nb_to(b, NB_F64)), 2))));
}

/* PyTorch's CPU autocast of a small CNN (conv2d, relu, max pool, a grouped
 * strided conv2d, a dilated conv1d): the same within bf16's precision.
 * PyTorch rounds each conv's result and gradient to bf16 where nabla keeps
 * them in f32, so the two differ by part of what bf16 moves PyTorch's own
 * results away from f32 (10% on some elements of this net). Each of nabla's
 * results is within 0.8x that distance of PyTorch's (0.47-0.63x here; an f32
 * conv would sit at about 1x: its products are what makes up the distance). */
START_TEST(autocast_cnn_is_torchs) {
    nb_scope_begin();
    const char *names[6] = {"acv_x", "acv_w1", "acv_b1", "acv_w2", "acv_b2", "acv_w3"};
    nb_tensor *p[6];
    for (int i = 0; i < 6; i++)
        p[i] = nb_set_requires_grad(nb_contiguous(fx("bf16.txt", names[i])), true);
    ck_assert_int_eq(nb_autocast_begin(NB_BF16), 0);
    nb_tensor *h = nb_relu(nb_conv2d(p[0], p[1], p[2], NULL, (const int64_t[]){1, 1}, NULL, 1));
    h = nb_max_pool2d(h, (const int64_t[]){2, 2}, NULL, NULL);
    h = nb_conv2d(h, p[3], p[4], (const int64_t[]){2, 1}, NULL, NULL, 2);
    h = nb_reshape(h, NB_SHAPE(2, 6, -1));
    nb_tensor *y = nb_conv1d(h, p[5], NULL, 1, 0, 2, 1);
    nb_tensor *loss = nb_mean_all(nb_mul(y, y));
    ck_assert_int_eq(nb_autocast_end(), 0);
    ck_assert_msg(loss != NULL, "%s", nb_last_error());
    ck_assert_int_eq(nb_backward(loss), 0);
    const char *gn[7] = {"loss", "gx", "gw1", "gb1", "gw2", "gb2", "gw3"};
    for (int i = 0; i < 7; i++) {
        nb_tensor *got = i ? nb_grad(p[i - 1]) : loss;
        char an[32], fn[32];
        snprintf(an, sizeof an, "acv_%s", gn[i]);
        snprintf(fn, sizeof fn, "acv32_%s", gn[i]);
        nb_tensor *ac = fx("bf16.txt", an), *f32 = fx("bf16.txt", fn);
        ck_assert_int_eq(nb_dtype_of(got), NB_F32);
        double moved = dist(ac, f32), off = dist(got, ac), norm = dist(ac, nb_zeros(NB_F32, 0, NULL));
        ck_assert_msg(off <= 0.8 * moved && off <= 0.05 * norm,
                      "%s: %g from PyTorch's autocast result, which is %g from its f32 one (norm %g)",
                      gn[i], off, moved, norm);
        printf("autocast cnn vs PyTorch: %-4s %.3g from its autocast result, which bf16 moved "
               "%.3g from f32 (norm %.3g)\n", gn[i], off, moved, norm);
    }
    nb_scope_end();
}
END_TEST

/* fixtures are loaded outside any scope, once per (forked) test */
static void load_fixtures(void) { fx("bf16.txt", "cv_f32_bits"); }

/* ------------------------------------------------------ the user's code */
/* A custom function over a bf16 input: y = 3 x in f32. Its backward gives
 * the gradient in the input's dtype (bf16), or, when *user is set, wrongly
 * in f32, which must be an error, not a silent conversion. */
static nb_tensor *triple_fwd(nb_function_ctx *ctx, nb_tensor **in, int n, void *user) {
    (void)ctx, (void)n, (void)user;
    return nb_mul_scalar(nb_to(in[0], NB_F32), 3);
}

static int triple_bwd(nb_function_ctx *ctx, nb_tensor *g, nb_tensor **gin, void *user) {
    (void)ctx;
    nb_tensor *gx = nb_mul_scalar(g, 3);
    gin[0] = *(const bool *)user ? gx : nb_to(gx, NB_BF16);
    return gin[0] ? 0 : -1;
}

static nb_tensor *gc_triple(nb_tensor **in, int n, void *ctx) {
    (void)n, (void)ctx;
    return nb_mul_scalar(nb_to(in[0], NB_F64), 3);
}

START_TEST(bf16_custom_function) {
    static const nb_function triple = {.name = "triple", .forward = triple_fwd,
                                       .backward = triple_bwd};
    for (int wrong = 0; wrong < 2; wrong++) {
        nb_scope_begin();
        bool w = wrong;
        nb_tensor *x = nb_set_requires_grad(nb_full(NB_BF16, NB_SHAPE(3), 0.5), true);
        nb_tensor *y = nb_function_apply(&triple, &x, 1, &w);
        ck_assert_msg(y != NULL, "%s", nb_last_error());
        ck_assert_int_eq(nb_dtype_of(y), NB_F32);
        nb_tensor *g = nb_from_data(NB_F32, NB_SHAPE(3), (const float[]){1, 2, 1.0f / 3});
        int rc = nb_backward_with_grad(y, g);
        if (wrong) {
            expect_error_rc(rc, "triple", "bf16", "f32");
            ck_assert_ptr_null(nb_grad(x));
        } else {
            ck_assert_int_eq(rc, 0);
            ck_assert_int_eq(nb_dtype_of(nb_grad(x)), NB_BF16);
            double gx[3];
            nb_copy_to_f64(nb_grad(x), gx);
            ck_assert_double_eq(gx[0], 3.0);
            ck_assert_double_eq(gx[1], 6.0);
            ck_assert_double_eq(gx[2], 1.0); /* bf16(3 * f32(1/3)) */
        }
        nb_scope_end();
    }
    /* gradcheck is f64 only: a bf16 input is refused with its reason */
    nb_scope_begin();
    nb_tensor *x = nb_set_requires_grad(nb_full(NB_BF16, NB_SHAPE(2), 1.0), true);
    nb_gradcheck_result r;
    ck_assert(!nb_gradcheck(gc_triple, NULL, 1, &x, NULL, &r));
    ck_assert_msg(strstr(nb_last_error(), "nb_gradcheck") && strstr(nb_last_error(), "f64"),
                  "%s", nb_last_error());
    nb_clear_error();
    nb_scope_end();
}
END_TEST

/* Autocast is the calling thread's: a region open here does not reach
 * another thread, and one opened there ends there. */
static void *other_thread(void *arg) {
    nb_tensor *const *ab = arg;
    static nb_dtype seen[3];
    seen[0] = nb_autocast_dtype();
    nb_scope_begin();
    nb_tensor *c = nb_matmul(ab[0], ab[1]);
    seen[1] = c ? nb_dtype_of(c) : (nb_dtype)-1;
    nb_autocast_begin(NB_BF16);
    seen[2] = nb_autocast_dtype();
    nb_scope_end();
    return seen; /* the region is left open: it dies with the thread */
}

START_TEST(autocast_is_per_thread) {
    nb_tensor *ab[2] = {nb_ones(NB_F32, NB_SHAPE(2, 3)), nb_ones(NB_F32, NB_SHAPE(3, 2))};
    ck_assert_int_eq(nb_autocast_begin(NB_BF16), 0);
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, other_thread, ab), 0);
    void *ret;
    ck_assert_int_eq(pthread_join(th, &ret), 0);
    const nb_dtype *seen = ret;
    ck_assert_int_eq(seen[0], NB_F32);  /* the main thread's region is not the other's */
    ck_assert_int_eq(seen[1], NB_F32);
    ck_assert_int_eq(seen[2], NB_BF16);
    ck_assert_int_eq(nb_autocast_dtype(), NB_BF16); /* nor the other's ours */
    ck_assert_int_eq(nb_autocast_end(), 0);
    ck_assert_int_eq(nb_autocast_dtype(), NB_F32);
    nb_free(ab[0]);
    nb_free(ab[1]);
}
END_TEST

Suite *suite_bf16(void) {
    Suite *s = suite_create("bf16");
    TCase *tc = tcase_create("bf16");
    tcase_set_timeout(tc, 120);
    tcase_add_checked_fixture(tc, load_fixtures, NULL);
    tcase_add_test(tc, bf16_from_f32_is_torchs);
    tcase_add_test(tc, bf16_from_f64_is_torchs);
    tcase_add_test(tc, bf16_to_f32_and_f64_exact);
    tcase_add_test(tc, bf16_creation_item_copy);
    tcase_add_test(tc, bf16_print);
    tcase_add_test(tc, bf16_save_load);
    tcase_add_test(tc, bf16_gradients_through_casts);
    tcase_add_test(tc, bf16_matmul_is_torchs_on_every_path);
    tcase_add_test(tc, bf16_matmul_thread_identity);
    tcase_add_test(tc, autocast_regions);
    tcase_add_test(tc, autocast_matmul);
    tcase_add_test(tc, autocast_mlp_is_torchs);
    tcase_add_test(tc, autocast_backward_runs_as_forward);
    tcase_add_test(tc, autocast_custom_backward_region);
    tcase_add_test(tc, autocast_conv_is_the_rounded_conv);
    tcase_add_test(tc, autocast_conv_thread_identity);
    tcase_add_test(tc, autocast_cnn_is_torchs);
    tcase_add_test(tc, bf16_custom_function);
    tcase_add_test(tc, autocast_is_per_thread);
    tcase_add_test(tc, autocast_gelu_tanh_in_float);
    suite_add_tcase(s, tc);
    return s;
}
