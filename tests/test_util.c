/* test_util.c: fixture loading and shared assertions for the Check suites. */
#include "test_util.h"

#include <stdarg.h>
#include <stdlib.h>

#ifndef NB_FIXTURE_DIR
#define NB_FIXTURE_DIR "tests/fixtures"
#endif

typedef struct fixture {
    char file[64], name[96];
    nb_tensor *t;
    struct fixture *next;
} fixture;
static fixture *cache;
static char loaded[32][64];
static int nloaded;

static nb_dtype parse_dtype(const char *s) {
    if (!strcmp(s, "f32")) return NB_F32;
    if (!strcmp(s, "f64")) return NB_F64;
    if (!strcmp(s, "i64")) return NB_I64;
    return NB_BOOL;
}

/* Format: "tensor <name> <dtype> <ndim> <sizes...>" then numel values. */
static void load_file(const char *file) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", NB_FIXTURE_DIR, file);
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "cannot open fixture file %s", path);
    char word[128];
    while (fscanf(f, "%127s", word) == 1) {
        if (word[0] == '#') {
            int ch;
            while ((ch = fgetc(f)) != EOF && ch != '\n') {}
            continue;
        }
        ck_assert_msg(!strcmp(word, "tensor"), "%s: expected 'tensor', got '%s'", path, word);
        fixture *fx = calloc(1, sizeof *fx);
        char dt[16];
        int ndim;
        ck_assert(fscanf(f, "%95s %15s %d", fx->name, dt, &ndim) == 3);
        int64_t shape[NB_MAX_DIMS];
        for (int i = 0; i < ndim; i++) {
            long long s;
            ck_assert(fscanf(f, "%lld", &s) == 1);
            shape[i] = s;
        }
        fx->t = nb_zeros(parse_dtype(dt), ndim, shape);
        ck_assert_msg(fx->t != NULL, "%s", nb_last_error());
        int64_t n = nb_numel(fx->t);
        double *v = malloc((size_t)(n ? n : 1) * sizeof *v);
        for (int64_t i = 0; i < n; i++) {
            char num[64];
            ck_assert(fscanf(f, "%63s", num) == 1);
            v[i] = !strcmp(num, "inf") ? INFINITY : !strcmp(num, "-inf") ? -INFINITY
                 : !strcmp(num, "nan") ? NAN : strtod(num, NULL);
        }
        nb_tensor *src = nb_from_data(NB_F64, ndim, shape, v);
        ck_assert(nb_copy_into(fx->t, src) == 0);
        nb_free(src);
        free(v);
        snprintf(fx->file, sizeof fx->file, "%s", file);
        fx->next = cache;
        cache = fx;
    }
    fclose(f);
}

nb_tensor *fx(const char *file, const char *name) {
    int seen = 0;
    for (int i = 0; i < nloaded; i++) seen |= !strcmp(loaded[i], file);
    if (!seen) {
        ck_assert(nloaded < 32);
        /* fixtures are cached and persistent: load them outside any scope */
        ck_assert_msg(nb_scope_depth() == 0, "fx(%s) called inside a scope", name);
        load_file(file);
        snprintf(loaded[nloaded++], sizeof loaded[0], "%s", file);
    }
    for (fixture *f = cache; f; f = f->next)
        if (!strcmp(f->file, file) && !strcmp(f->name, name)) return f->t;
    ck_abort_msg("fixture %s not found in %s", name, file);
    return NULL;
}

void expect_close_at(const char *file, int line, const nb_tensor *got, const nb_tensor *want,
                     double atol, double rtol) {
    ck_assert_msg(got != NULL, "%s:%d: result is NULL: %s", file, line,
                  nb_last_error() ? nb_last_error() : "(no error set)");
    ck_assert_msg(want != NULL, "%s:%d: expected tensor is NULL", file, line);
    int nd = nb_ndim(got);
    ck_assert_msg(nd == nb_ndim(want), "%s:%d: ndim %d, expected %d", file, line, nd,
                  nb_ndim(want));
    for (int i = 0; i < nd; i++)
        ck_assert_msg(nb_shape(got)[i] == nb_shape(want)[i], "%s:%d: size %lld at dim %d, "
                      "expected %lld", file, line, (long long)nb_shape(got)[i], i,
                      (long long)nb_shape(want)[i]);
    int64_t n = nb_numel(got);
    double *a = malloc((size_t)(n ? n : 1) * sizeof *a), *b = malloc((size_t)(n ? n : 1) * sizeof *b);
    nb_copy_to_f64(got, a);
    nb_copy_to_f64(want, b);
    for (int64_t i = 0; i < n; i++) {
        bool same_inf = isinf(a[i]) && a[i] == b[i];
        bool ok = same_inf || (isnan(a[i]) && isnan(b[i])) || fabs(a[i] - b[i]) <= atol + rtol * fabs(b[i]);
        if (!ok) {
            double x = a[i], y = b[i];
            free(a);
            free(b);
            ck_abort_msg("%s:%d: element %lld is %.10g, expected %.10g (atol %g, rtol %g)", file,
                         line, (long long)i, x, y, atol, rtol);
        }
    }
    free(a);
    free(b);
}

void expect_gradcheck_at(const char *file, int line, const char *label, nb_fn fn, void *ctx,
                         int n, nb_tensor **inputs) {
    nb_gradcheck_result r;
    bool ok = nb_gradcheck(fn, ctx, n, inputs, NULL, &r);
    ck_assert_msg(ok, "%s:%d: gradcheck %s failed: %s", file, line, label,
                  nb_last_error() ? nb_last_error() : r.message);
    printf("gradcheck ok  %-44s %6lld entries, max |analytic-numeric| %.1e\n", label,
           (long long)r.checked, r.max_abs_err);
    fflush(stdout);
}

/* The check of one kind, asserted and listed. */
static void expect_check(const char *file, int line, const char *kind, const char *label,
                         nb_fn fn, void *ctx, int n, nb_tensor **inputs) {
    nb_gradcheck_result r;
    nb_gradcheck_opts o = NB_GRADCHECK_DEFAULTS;
    o.check_forward_ad = !strcmp(kind, "forward-ad");
    bool ok = !strcmp(kind, "gradgradcheck") ? nb_gradgradcheck(fn, ctx, n, inputs, &o, &r)
                                             : nb_gradcheck(fn, ctx, n, inputs, &o, &r);
    ck_assert_msg(ok, "%s:%d: %s %s failed: %s", file, line, kind, label,
                  nb_last_error() ? nb_last_error() : r.message);
    printf("%s ok  %-*s %6lld entries, max |analytic-numeric| %.1e\n", kind,
           (int)(54 - strlen(kind)), label, (long long)r.checked, r.max_abs_err);
    fflush(stdout);
}

void expect_gradgradcheck_at(const char *file, int line, const char *label, nb_fn fn, void *ctx,
                             int n, nb_tensor **inputs) {
    expect_check(file, line, "gradgradcheck", label, fn, ctx, n, inputs);
}

void expect_forward_ad_at(const char *file, int line, const char *label, nb_fn fn, void *ctx,
                          int n, nb_tensor **inputs) {
    expect_check(file, line, "forward-ad", label, fn, ctx, n, inputs);
}

void expect_error_at(const char *file, int line, const void *result, ...) {
    const char *msg = nb_last_error();
    ck_assert_msg(result == NULL, "%s:%d: expected failure (NULL), got a result", file, line);
    ck_assert_msg(msg != NULL, "%s:%d: failed but nb_last_error() is NULL", file, line);
    va_list ap;
    va_start(ap, result);
    for (const char *s; (s = va_arg(ap, const char *)) != NULL;)
        ck_assert_msg(strstr(msg, s) != NULL, "%s:%d: error \"%s\" does not contain \"%s\"",
                      file, line, msg, s);
    va_end(ap);
    nb_clear_error();
}

void expect_error_after_at(const char *file, int line, const char *head, const char *first) {
    const char *msg = nb_last_error();
    char want[1200];
    snprintf(want, sizeof want, "%s, after an earlier error: %s", head, first);
    ck_assert_msg(msg != NULL, "%s:%d: nb_last_error() is NULL", file, line);
    ck_assert_msg(strcmp(msg, want) == 0, "%s:%d: error \"%s\", expected \"%s\"", file, line,
                  msg, want);
}

nb_tensor *rand_leaf(uint64_t seed, int ndim, const int64_t *shape) {
    nb_rng r;
    nb_rng_seed(&r, seed);
    nb_tensor *t = nb_randn(NB_F64, ndim, shape, &r);
    ck_assert_msg(t != NULL, "%s", nb_last_error());
    return nb_set_requires_grad(t, true);
}

nb_tensor *transposed_leaf(uint64_t seed, int ndim, const int64_t *shape, int d0, int d1) {
    if (d0 < 0) d0 += ndim;
    if (d1 < 0) d1 += ndim;
    int64_t sw[NB_MAX_DIMS];
    for (int i = 0; i < ndim; i++) sw[i] = shape[i];
    sw[d0] = shape[d1];
    sw[d1] = shape[d0];
    nb_tensor *base = nb_set_requires_grad(rand_leaf(seed, ndim, sw), false);
    nb_tensor *v = nb_transpose(base, d0, d1);
    ck_assert_msg(v != NULL && nb_is_leaf(v), "%s", nb_last_error());
    ck_assert(!nb_is_contiguous(v));
    return nb_set_requires_grad(v, true);
}

double *values(const nb_tensor *t) {
    int64_t n = nb_numel(t);
    double *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    ck_assert(v != NULL);
    ck_assert_msg(nb_copy_to_f64(t, v) == 0, "%s", nb_last_error());
    return v;
}

char test_tmp_dir[64];

void test_make_tmp_dir(const char *tag) {
    snprintf(test_tmp_dir, sizeof test_tmp_dir, "/tmp/nabla-%.20s-XXXXXX", tag);
    ck_assert_ptr_nonnull(mkdtemp(test_tmp_dir));
}

void test_remove_tmp_dir(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", test_tmp_dir);
    ck_assert_int_eq(system(cmd), 0);
}

const char *test_tmp_path(const char *name) {
    static char path[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(path[k], sizeof path[k], "%s/%s", test_tmp_dir, name);
    return path[k];
}

char *test_read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    ck_assert_int_eq(fseek(f, 0, SEEK_END), 0);
    long len = ftell(f);
    ck_assert_msg(len >= 0, "cannot size %s", path);
    rewind(f);
    char *b = malloc((size_t)len + 1);
    ck_assert_ptr_nonnull(b);
    ck_assert_msg(fread(b, 1, (size_t)len, f) == (size_t)len, "cannot read %s", path);
    b[len] = 0;
    fclose(f);
    if (n) *n = (size_t)len;
    return b;
}

void test_write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(data, 1, n, f), n);
    ck_assert_int_eq(fclose(f), 0);
}
