/* test_edges.c: every op of ops/registry.h against PyTorch on edge values
 * (+-0, +-inf, NaN, denormals, huge values), empty and size-1 dims and
 * non-contiguous inputs: forward values and the gradients of
 * loss = (out * w).sum(), fixtures from tests/fixtures/gen_edges.py (whose
 * docstring gives the names). An op the registry has and edges.txt lacks
 * fails. NB_OP_EXACT ops must match bit for bit (sign of zero included; NaN
 * where torch has NaN); the others within TOL, with NaN and inf at the same
 * places (infs of the same sign). Where torch raised, nabla must fail too,
 * with a message naming the op. The differences docs/numerics.md ("Numerics
 * conventions") documents are written into the expected values here (see
 * apply_conventions), not skipped. nb_multinomial's draws are not torch's:
 * where torch drew, its support is checked (check_draws). */
#include "test_util.h"

#include <float.h>
#include <stdarg.h>
#include <stdlib.h>

#include "ops/registry.h"

static const char *FX = "edges.txt";

/* The registry's calls draw dropout masks from op_rng(): reseeded on every
 * call, so a call on a tensor of ones shows the mask the call on x drew.
 * Seed 14 drops 8 of the first 12 elements, among them inf, -inf, NaN, -0
 * and huge values of the fixtures' edge-value cases, and keeps others. */
static nb_rng rng_state;
static nb_rng *op_rng(void) {
    nb_rng_seed(&rng_state, 14);
    return &rng_state;
}

typedef nb_tensor *(*call_fn)(nb_tensor **x);
typedef struct {
    const char *name; /* fixture name of the op */
    const char *fn;   /* the nabla function whose name errors start with */
    unsigned flags;
    call_fn call;
} op_entry;

#define CALL_FN(name, inputs, flags, call) \
    static nb_tensor *call_##name(nb_tensor **x) { return call; }
NB_OPS(CALL_FN)

/* pow_scalar at exponents other than the registry's 1.5 (gen_edges.py's
 * POW_EXTRA), and nb_linear (nn, not in the registry) */
#define POW_FN(tag, e) \
    static nb_tensor *call_pow_##tag(nb_tensor **x) { return nb_pow_scalar(x[0], e); }
POW_FN(p0_5, 0.5)
POW_FN(m0_5, -0.5)
POW_FN(m1_5, -1.5)
POW_FN(p2, 2.0)
POW_FN(p3, 3.0)
POW_FN(p0, 0.0)
POW_FN(m1, -1.0)
POW_FN(m2, -2.0)
static nb_tensor *call_linear(nb_tensor **x) { return nb_linear(x[0], x[1], x[2]); }
static nb_tensor *call_multinomial_norep(nb_tensor **x) {
    return nb_multinomial(x[0], 3, false, op_rng());
}

#define OP_ENTRY(name, inputs, flags, call) {#name, "nb_" #name, flags, call_##name},
#define POW_ENTRY(tag) {"pow_scalar@" #tag, "nb_pow_scalar", NB_OP_DIFF, call_pow_##tag},
static const op_entry OPS[] = {
    NB_OPS(OP_ENTRY)
    POW_ENTRY(p0_5) POW_ENTRY(m0_5) POW_ENTRY(m1_5) POW_ENTRY(p2) POW_ENTRY(p3)
    POW_ENTRY(p0) POW_ENTRY(m1) POW_ENTRY(m2)
    {"linear", "nb_linear", NB_OP_DIFF, call_linear},
    {"multinomial@norep", "nb_multinomial", 0, call_multinomial_norep},
};
#define NOPS ((int)(sizeof OPS / sizeof OPS[0]))

/* ------------------------------------------------- the names edges.txt has */
static char **names;
static int nnames;

static int cmp_name(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Reads the names only (fx() loads the values); sorted for has(). The order
 * of the cases is taken from the file, so names_in_order keeps it too. */
static char **order;
static void load_names(void) {
    if (names) return;
    char path[512];
    snprintf(path, sizeof path, "%s/%s", NB_FIXTURE_DIR, FX);
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "cannot open %s (run tests/fixtures/gen_edges.py)", path);
    char line[256];
    int cap = 0;
    while (fgets(line, sizeof line, f)) {
        char name[128];
        if (strncmp(line, "tensor ", 7) || sscanf(line + 7, "%127s", name) != 1) continue;
        if (nnames == cap) {
            cap = cap ? 2 * cap : 1024;
            names = realloc(names, (size_t)cap * sizeof *names);
            order = realloc(order, (size_t)cap * sizeof *order);
        }
        names[nnames] = order[nnames] = strdup(name);
        nnames++;
    }
    fclose(f);
    qsort(names, (size_t)nnames, sizeof *names, cmp_name);
}

static bool has(const char *name) {
    return bsearch(&name, names, (size_t)nnames, sizeof *names, cmp_name) != NULL;
}

/* ------------------------------------------------------------ comparison */
typedef struct {
    const op_entry *op;
    char where[160]; /* "case spec f32 layout t" */
    int bad;         /* mismatches so far */
    char first[600]; /* the first one */
    int64_t values;  /* values compared */
} report;

static void mismatch(report *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void mismatch(report *r, const char *fmt, ...) {
    char msg[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (r->bad < 8) printf("edges DIFF  %s %s: %s\n", r->op->name, r->where, msg);
    if (r->bad++ == 0) snprintf(r->first, sizeof r->first, "%s: %s", r->where, msg);
}

/* Tolerance of the non-exact ops: relative, plus a few hundred ulps of the
 * denormal range (a denormal result carries fewer significant bits). */
static double rtol_of(nb_dtype dt) { return dt == NB_F32 ? 1e-5 : 1e-12; }
static double atol_of(nb_dtype dt) { return dt == NB_F32 ? 1e-42 : 1e-320; }

static bool same_value(double got, double want, bool exact, nb_dtype dt) {
    if (isnan(want) || isnan(got)) return isnan(want) && isnan(got);
    if (exact) return got == want && signbit(got) == signbit(want);
    if (isinf(want) || isinf(got)) return got == want;
    return fabs(got - want) <= atol_of(dt) + rtol_of(dt) * fabs(want);
}

/* got against want (values as f64, row-major); what names the tensor. An
 * element may match alt instead (when not NULL: a documented alternative). */
static void compare(report *r, const char *what, nb_tensor *got, const double *want,
                    const double *alt, int ndim, const int64_t *shape, bool exact) {
    if (!got) {
        mismatch(r, "%s is NULL: %s", what, nb_last_error() ? nb_last_error() : "(no error)");
        nb_clear_error();
        return;
    }
    bool same_shape = nb_ndim(got) == ndim;
    for (int i = 0; same_shape && i < ndim; i++) same_shape = nb_shape(got)[i] == shape[i];
    if (!same_shape) {
        mismatch(r, "%s has %d dims (first %lld), torch %d (first %lld)", what, nb_ndim(got),
                 nb_ndim(got) ? (long long)nb_shape(got)[0] : 0LL, ndim,
                 ndim ? (long long)shape[0] : 0LL);
        return;
    }
    double *g = values(got);
    int64_t n = nb_numel(got);
    for (int64_t i = 0; i < n; i++)
        if (!same_value(g[i], want[i], exact, nb_dtype_of(got)) &&
            !(alt && same_value(g[i], alt[i], exact, nb_dtype_of(got)))) {
            mismatch(r, "%s[%lld] = %.17g, torch %.17g (%s)", what, (long long)i, g[i], want[i],
                     exact ? "bit for bit" : "tolerance");
            break;
        }
    r->values += n;
    free(g);
}

/* --------------------------------------------------------- the conventions */
/* docs/numerics.md: a softmax / log_softmax slice that is
 * all -inf gives zeros and zero gradient (PyTorch: NaN). dim is the
 * registry call's (softmax over 1, log_softmax over 0). */
static void all_neg_inf_slices(const double *x, int ndim, const int64_t *shape, int dim,
                               double *out, double *grad) {
    if (dim >= ndim) return;
    /* row-major: element (o, k, i) of (outer, len, inner) */
    int64_t outer = 1, inner = 1, len = shape[dim];
    for (int d = 0; d < dim; d++) outer *= shape[d];
    for (int d = dim + 1; d < ndim; d++) inner *= shape[d];
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < inner; i++) {
            bool all = len > 0;
            for (int64_t k = 0; k < len && all; k++) all = x[(o * len + k) * inner + i] == -INFINITY;
            for (int64_t k = 0; all && k < len; k++) {
                if (out) out[(o * len + k) * inner + i] = 0;
                if (grad) grad[(o * len + k) * inner + i] = 0;
            }
        }
}

/* docs/numerics.md: gradients that sum over broadcast dims add in nabla's order, so
 * an exact op's gradient of an input it broadcast (fewer elements than the
 * output) is compared within tolerance, for every op. */
static bool sums_over_broadcast(const op_entry *op, nb_tensor *in, nb_tensor *out) {
    (void)op;
    return nb_numel(in) < nb_numel(out);
}

static void apply_conventions(const op_entry *op, const double *x0, int ndim,
                              const int64_t *shape, double *out, double *grad) {
    if (!strcmp(op->name, "softmax")) all_neg_inf_slices(x0, ndim, shape, 1, out, grad);
    if (!strcmp(op->name, "log_softmax")) all_neg_inf_slices(x0, ndim, shape, 0, out, grad);
}

/* -------------------------------------------------------------- one case */
/* A leaf with fixture t's values, contiguous or (transposed, ndim >= 2)
 * laid out with dims 0 and -1 swapped in memory. */
static nb_tensor *input_leaf(nb_tensor *t, bool transposed, bool grad) {
    int nd = nb_ndim(t);
    nb_tensor *x;
    if (transposed && nd >= 2) {
        int64_t sw[NB_MAX_DIMS];
        memcpy(sw, nb_shape(t), (size_t)nd * sizeof *sw);
        sw[0] = nb_shape(t)[nd - 1];
        sw[nd - 1] = nb_shape(t)[0];
        nb_tensor *base = nb_zeros(nb_dtype_of(t), nd, sw);
        x = nb_transpose(base, 0, nd - 1);
    } else {
        x = nb_zeros(nb_dtype_of(t), nd, nb_shape(t));
    }
    ck_assert_msg(x && nb_copy_into(x, t) == 0, "%s", nb_last_error());
    return grad ? nb_set_requires_grad(x, true) : x;
}

static bool is_float(nb_tensor *t) {
    return nb_dtype_of(t) == NB_F32 || nb_dtype_of(t) == NB_F64;
}

/* "edge.<op>.<case>.<dt>.<layout>.<field>", fx() or NULL when absent */
static nb_tensor *field(const char *base, const char *fld) {
    char name[512];
    snprintf(name, sizeof name, "%s.%s", base, fld);
    return has(name) ? fx(FX, name) : NULL;
}

/* Expected values of a dropout output or gradient: per element, torch's
 * kept value where nabla's mask (ones through the same call) kept it, torch's
 * dropped value elsewhere. */
static double *dropout_expect(nb_tensor *mask, nb_tensor *kept, nb_tensor *dropped) {
    double *m = values(mask), *k = values(kept), *d = values(dropped);
    for (int64_t i = 0; i < nb_numel(kept); i++) k[i] = m[i] != 0 ? k[i] : d[i];
    free(m);
    free(d);
    return k;
}

/* A multinomial's draws cannot be torch's: the support is checked instead.
 * out has torch's shape (samples'), every index is in range, drawn only
 * where the row's weight is positive, and (norep) not repeated in its row. */
static void check_draws(report *r, nb_tensor *out, nb_tensor *samples, nb_tensor *probs,
                        bool norep) {
    int nd = nb_ndim(samples);
    if (nb_dtype_of(out) != NB_I64 || nb_ndim(out) != nd ||
        memcmp(nb_shape(out), nb_shape(samples), (size_t)nd * sizeof(int64_t))) {
        mismatch(r, "draws: dtype or shape differ from torch's");
        return;
    }
    double *o = values(out), *p = values(probs);
    int64_t n = nb_shape(probs)[nb_ndim(probs) - 1], k = nb_shape(out)[nd - 1];
    for (int64_t i = 0; i < nb_numel(out); i++) {
        int64_t row = i / k, c = (int64_t)o[i];
        if (c < 0 || c >= n) mismatch(r, "draw %lld: category %lld of %lld", (long long)i,
                                      (long long)c, (long long)n);
        else if (!(p[row * n + c] > 0)) mismatch(r, "draw %lld: category %lld has weight %g",
                                                (long long)i, (long long)c, p[row * n + c]);
        for (int64_t j = row * k; norep && j < i; j++)
            if (o[j] == o[i]) mismatch(r, "draw %lld: category %lld repeated", (long long)i,
                                       (long long)c);
        r->values++;
    }
    free(o);
    free(p);
}

/* base = "edge.<op>.<case>.<dt>", layout "c" or "t" */
static void run_case(report *r, const char *base, const char *layout) {
    const op_entry *op = r->op;
    char lb[240];
    snprintf(lb, sizeof lb, "%s.%s", base, layout);
    nb_tensor *fin[4] = {0};
    int n = 0;
    for (; n < 4; n++) {
        char k[8];
        snprintf(k, sizeof k, "x%d", n);
        if (!(fin[n] = field(base, k))) break;
    }
    nb_tensor *want = field(lb, "out"), *f64acc = field(lb, "out_f64acc");
    nb_tensor *fused = field(lb, "out_fused"), *err = field(lb, "error"), *w = field(base, "w");
    nb_tensor *kept = field(lb, "kept"), *dropped = field(lb, "dropped");
    nb_tensor *wantg[4] = {0};
    bool none[4] = {0};
    for (int k = 0; k < n; k++) {
        char g[16];
        snprintf(g, sizeof g, "g%d", k);
        wantg[k] = field(lb, g);
        snprintf(g, sizeof g, "g%dnone", k);
        none[k] = field(lb, g) != NULL;
    }
    nb_tensor *gkept = field(lb, "gkept"), *gdropped = field(lb, "gdropped");
    bool exact = op->flags & NB_OP_EXACT;
    bool diff = (op->flags & NB_OP_DIFF) && w;

    nb_scope_begin();
    nb_tensor *x[4] = {0};
    for (int k = 0; k < n; k++)
        x[k] = input_leaf(fin[k], layout[0] == 't', diff && is_float(fin[k]));
    nb_tensor *out = op->call(x);
    if (err) {
        const char *msg = nb_last_error();
        if (out) mismatch(r, "torch raised, nabla returned a result");
        else if (!msg || strncmp(msg, op->fn, strlen(op->fn)))
            mismatch(r, "failed without a message naming %s: %s", op->fn, msg ? msg : "(none)");
        nb_clear_error();
        nb_scope_end();
        return;
    }
    if (!out) {
        mismatch(r, "nabla failed where torch did not: %s", nb_last_error());
        nb_clear_error();
        nb_scope_end();
        return;
    }
    nb_tensor *samples = field(lb, "samples");
    if (samples) { /* multinomial */
        check_draws(r, out, samples, fin[0], strstr(op->name, "norep") != NULL);
        nb_scope_end();
        return;
    }
    double *x0 = values(fin[0]);
    nb_tensor *mask = NULL;
    if (kept) { /* dropout */
        nb_tensor *ones = nb_ones(nb_dtype_of(fin[0]), nb_ndim(fin[0]), nb_shape(fin[0]));
        mask = op->call(&ones);
        ck_assert_msg(mask != NULL, "%s", nb_last_error());
        double *e = dropout_expect(mask, kept, dropped);
        compare(r, "out", out, e, NULL, nb_ndim(kept), nb_shape(kept), exact);
        free(e);
    } else {
        ck_assert_msg(want != NULL, "%s: no out and no error", lb);
        /* docs/numerics.md: f32 sums and means accumulate in double */
        double *e = values(f64acc ? f64acc : want), *alt = fused ? values(fused) : NULL;
        apply_conventions(op, x0, nb_ndim(fin[0]), nb_shape(fin[0]), e, NULL);
        compare(r, "out", out, e, alt, nb_ndim(want), nb_shape(want), exact);
        free(e);
        free(alt);
    }
    if (diff) {
        nb_tensor *loss = nb_sum_all(nb_mul(out, input_leaf(w, false, false)));
        if (!loss || nb_backward(loss) != 0) {
            mismatch(r, "backward failed: %s", nb_last_error());
            nb_clear_error();
        } else {
            for (int k = 0; k < n; k++) {
                if (!is_float(fin[k])) continue;
                char what[32];
                snprintf(what, sizeof what, "grad x%d", k);
                nb_tensor *g = nb_grad(x[k]);
                if (none[k]) {
                    if (g) mismatch(r, "%s: torch has none, nabla has one", what);
                    continue;
                }
                nb_tensor *wg = gkept ? gkept : wantg[k];
                ck_assert_msg(wg != NULL, "%s: no %s", lb, what);
                double *e = gkept ? dropout_expect(mask, gkept, gdropped) : values(wg);
                snprintf(what, sizeof what, "g%d_fused", k);
                nb_tensor *gf = field(lb, what);
                double *alt = gf ? values(gf) : NULL;
                snprintf(what, sizeof what, "grad x%d", k);
                apply_conventions(op, x0, nb_ndim(fin[0]), nb_shape(fin[0]), NULL, e);
                compare(r, what, g, e, alt, nb_ndim(wg), nb_shape(wg),
                        exact && !sums_over_broadcast(op, x[k], out));
                free(e);
                free(alt);
            }
        }
    }
    free(x0);
    nb_scope_end();
}

/* Every case of OPS[_i] in edges.txt, in the file's order. */
START_TEST(test_op_edges) {
    const op_entry *op = &OPS[_i];
    load_names();
    char prefix[128];
    snprintf(prefix, sizeof prefix, "edge.%s.", op->name);
    size_t pl = strlen(prefix);
    report r = {.op = op};
    int cases = 0;
    for (int i = 0; i < nnames; i++) {
        const char *nm = order[i];
        size_t len = strlen(nm);
        /* one case per ".x0" input: "edge.<op>.<case>.<dt>.x0" */
        if (strncmp(nm, prefix, pl) || len < 3 || strcmp(nm + len - 3, ".x0")) continue;
        char base[200];
        if (len - 3 >= sizeof base) continue;
        snprintf(base, sizeof base, "%.*s", (int)(len - 3), nm);
        const char *layouts[2] = {"c", "t"};
        for (int l = 0; l < 2; l++) {
            char probe[220];
            snprintf(probe, sizeof probe, "%s.%s.", base, layouts[l]);
            bool present = false;
            for (int j = 0; j < nnames && !present; j++)
                present = !strncmp(names[j], probe, strlen(probe));
            if (!present) continue;
            snprintf(r.where, sizeof r.where, "%s layout %s", base + pl, layouts[l]);
            run_case(&r, base, layouts[l]);
            cases++;
        }
    }
    ck_assert_msg(cases > 0, "op %s: edges.txt has no fixture for it (run "
                  "tests/fixtures/gen_edges.py)", op->name);
    printf("edges %-4s %-16s %4d cases %6lld values (%s)\n", r.bad ? "FAIL" : "ok", op->name,
           cases, (long long)r.values, op->flags & NB_OP_EXACT ? "bit for bit" : "tolerance");
    fflush(stdout);
    ck_assert_msg(r.bad == 0, "op %s: %d mismatches against PyTorch; first: %s", op->name, r.bad,
                  r.first);
}
END_TEST

Suite *suite_edges(void) {
    Suite *s = suite_create("edges");
    TCase *tc = tcase_create("ops");
    tcase_set_timeout(tc, 120); /* a hang guard (tests/run_tests.c) */
    tcase_add_loop_test(tc, test_op_edges, 0, NOPS);
    suite_add_tcase(s, tc);
    return s;
}
