/* gradcheck.c: the analytic Jacobian (one backward per output element)
 * against central finite differences (two forwards per input element), in
 * f64, like torch.autograd.gradcheck; or, in fast mode, random projections
 * v^T J u of both (one backward and two forwards per probe and input).
 * Backward runs twice for every seed gradient, and must give the same
 * result both times; inputs that do not require grad must get no gradient. */
#include "autograd_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The public function running (nb_gradcheck, or nb_gradgradcheck around
 * it), for messages; set on entry, put back on return (checks may nest). */
static _Thread_local const char *FN = "nb_gradcheck";

/* What a check needs throughout. */
typedef struct {
    nb_fn fn;
    void *ctx;
    int n;
    nb_tensor **in;
    int64_t m; /* output elements */
    nb_gradcheck_opts o;
    nb_gradcheck_result *r;
    const char *order; /* "first-order", "second-order": what the backward checks */
    nb_tensor **want;  /* the inputs that require grad, */
    int *want_at;      /* and where each sits in in[] (-1: none) */
    int n_want;
    /* inputs that did not require grad at the start (fn may flip the flag):
     * their .grad and its version then */
    bool *no_grad;
    nb_tensor **grad_before;
    uint32_t *grad_version;
} check;

static bool check_inputs(int n, nb_tensor **in) {
    bool any = false;
    for (int i = 0; i < n; i++) {
        nb_tensor *t = in[i];
        if (!nbi_arg(FN, t, i)) return false;
        if (!t->requires_grad) continue;
        any = true;
        if (t->dtype != NB_F64)
            return nbi_error("%s: input %d is %s; finite differences need f64 (use nb_to)", FN,
                             i, nb_dtype_name(t->dtype)), false;
        if (t->grad_fn)
            return nbi_error("%s: input %d is not a leaf (made by %s)", FN, i, t->grad_fn->op),
                   false;
        for (int d = 0; d < t->ndim; d++)
            if (t->strides[d] == 0 && t->shape[d] > 1)
                return nbi_error("%s: input %d has overlapping elements (an expanded view); "
                                 "perturbing one would move several", FN, i), false;
    }
    if (!any) return nbi_error("%s: no input requires grad", FN), false;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < i; j++)
            if (in[i]->requires_grad && in[j]->requires_grad && in[i]->storage == in[j]->storage)
                return nbi_error("%s: inputs %d and %d share storage; perturbing one would move "
                                 "the other", FN, j, i), false;
    return true;
}

nb_tensor *nbi_fn_returned(const char *fn, nb_tensor *y) {
    if (!y) {
        const char *earlier = nbi_error_cause();
        if (earlier)
            return nbi_error_quoting("%s: the function returned NULL, after an earlier error: %s",
                                     fn, earlier);
        return nbi_error_quoting("%s: the function returned NULL", fn);
    }
    if (!nbi_is_tensor(y))
        return nbi_error("%s: the function returned a pointer that is not a tensor", fn);
    if (y->freed) return nbi_error("%s: the function returned a freed tensor", fn);
    return y;
}

/* fn's output, checked: NULL + message when fn failed or returned junk. */
static nb_tensor *call(const check *c) {
    nbi_callback cb = {.who_fmt = "the function"};
    nbi_callback_enter(&cb, FN, false);
    nb_tensor *y = c->fn(c->in, c->n, c->ctx);
    if (nbi_callback_leave(&cb) != 0) return NULL;
    for (int i = 0; i < c->n; i++) { /* the check holds them: still readable */
        if (c->in[i]->freed)
            return nbi_error("%s: the function freed input %d (%s); it must leave its inputs "
                             "alive", FN, i, nbi_freed_how(c->in[i]));
        if (c->in[i]->requires_grad == c->no_grad[i]) /* put back at the end */
            return nbi_error("%s: the function changed requires_grad of input %d (turned it "
                             "%s); it must leave its inputs as they are", FN, i,
                             c->no_grad[i] ? "on" : "off");
    }
    if (!nbi_fn_returned(FN, y)) return NULL;
    if (y->dtype != NB_F64)
        return nbi_error("%s: the function returned %s; it must return an f64 tensor", FN,
                         nb_dtype_name(y->dtype));
    if (c->m >= 0 && y->numel != c->m)
        return nbi_error("%s: output size changed between calls (%lld elements, then %lld)", FN,
                         (long long)c->m, (long long)y->numel);
    return y;
}

/* Evaluates fn in a scope of its own and copies the output out (f64). */
static int eval(const check *c, double *out) {
    nb_scope_begin();
    nb_tensor *y = call(c);
    int rc = y ? nb_copy_to_f64(y, out) : -1;
    nb_scope_end();
    return rc;
}

/* fn evaluated `times` times at the same point must give the same values:
 * finite differences of a function that draws anew at each call (dropout in
 * training mode) measure its noise, and a mismatch would blame a rule. The
 * output's size, or -1 with a message. */
static int64_t same_each_time(const check *c, int times) {
    nb_scope_begin();
    nb_tensor *y = call(c), *y0 = y ? nb_detach(y) : NULL;
    int64_t m = y0 ? y0->numel : -1;
    for (int t = 1; t < times && m >= 0; t++) {
        nb_tensor *z = call(c);
        if (!z) {
            m = -1;
        } else if (!nbi_same_shape(z, y0)) {
            m = (nbi_error("%s: the function gave outputs of shapes %s and %s at the same point; "
                           "it must be a function of its inputs alone", FN, NBI_SHAPE(y0),
                           NBI_SHAPE(z)), -1);
        }
        for (int64_t j = 0; m >= 0 && j < m; j++) {
            double a = nbi_get_flat(y0, j), b = nbi_get_flat(z, j);
            if (fabs(a - b) <= c->o.nondet_tol || (a != a && b != b)) continue;
            nbi_error("%s: the function gave different values at the same point (output element "
                      "%lld: %.10g, then %.10g): it is not deterministic (dropout in training "
                      "mode, or a generator that goes on between calls), and finite differences "
                      "cannot check it; evaluate it in eval mode, or reseed its generator "
                      "(nb_rng_seed) at the start of each call", FN, (long long)j, a, b);
            m = -1;
        }
    }
    nb_scope_end();
    return m;
}

/* Output size, from two forwards that agree. */
static int64_t probe(check *c) { return same_each_time(c, 2); }

/* Column block J[i] (numel_i x m) of the numeric Jacobian for input i. */
static int numeric(const check *c, int i, double *J) {
    nb_tensor *t = c->in[i];
    int64_t m = c->m;
    double eps = c->o.eps;
    double *plus = malloc((size_t)m * sizeof *plus + 1);
    double *minus = malloc((size_t)m * sizeof *minus + 1);
    int rc = (plus && minus) ? 0 : (nbi_error("%s: out of memory", FN), -1);
    for (int64_t e = 0; rc == 0 && e < t->numel; e++) {
        double v = nbi_get_flat(t, e);
        nbi_set_flat(t, e, v + eps);
        rc = eval(c, plus);
        nbi_set_flat(t, e, v - eps);
        if (rc == 0) rc = eval(c, minus);
        nbi_set_flat(t, e, v);
        for (int64_t j = 0; rc == 0 && j < m; j++)
            J[e * m + j] = (plus[j] - minus[j]) / (2 * eps);
    }
    free(plus);
    free(minus);
    return rc;
}

/* Inputs that do not require grad must come out of backward as they went in. */
static int check_no_grad_inputs(const check *c) {
    for (int i = 0; i < c->n; i++) {
        nb_tensor *t = c->in[i];
        if (!c->no_grad[i]) continue;
        bool same = t->grad == c->grad_before[i] &&
                    (!t->grad || t->grad->storage->version == c->grad_version[i]);
        if (!same)
            return (nbi_error("%s: input %d does not require grad, yet backward gave it a "
                              "gradient", FN, i), -1);
    }
    return 0;
}

/* The same values as g in another layout: dims reversed (a transposed
 * upstream gradient) when two dims or more have more than one element, else
 * every other element of a buffer twice as long (reversing the dims of a
 * (1, n) gradient would give a layout read exactly as a contiguous one); the
 * rule must read either as it reads g. */
static nb_tensor *relaid(nb_tensor *g) {
    int nd = g->ndim, wide = 0; /* dims of more than one element */
    if (nd == 0 || g->numel < 2) return g;
    for (int d = 0; d < nd; d++) wide += g->shape[d] > 1;
    int64_t shape[NB_MAX_DIMS] = {0}, st[NB_MAX_DIMS], rev[NB_MAX_DIMS];
    nb_tensor *t;
    if (wide < 2) { /* every other element */
        t = nbi_new(FN, NB_F64, 1, (const int64_t[]){2 * g->numel}, true);
        for (int d = 0; d < nd; d++) rev[d] = 2;
    } else { /* dims reversed */
        for (int d = 0; d < nd; d++) shape[d] = g->shape[nd - 1 - d];
        t = nbi_new(FN, NB_F64, nd, shape, true);
        nbi_contiguous_strides(nd, shape, st);
        for (int d = 0; d < nd; d++) rev[d] = st[nd - 1 - d];
    }
    if (!t) return NULL;
    nb_tensor *v = nbi_make_view(t, nd, g->shape, rev, 0);
    if (v) nbi_copy_strided(v, g->strides, g);
    return v;
}

/* d(y)/d(wanted inputs) . g into G[i] at stride `stride` (zeros where none
 * flows); no .grad is touched. */
static int vjp(const check *c, nb_tensor *y, nb_tensor *g, bool retain, double **G,
               int64_t stride, bool compare) {
    nb_tensor *gr_inline[8], **gr = c->n_want <= 8 ? gr_inline : calloc((size_t)c->n_want, sizeof *gr);
    if (!gr) return (nbi_error("%s: out of memory", FN), -1);
    nb_backward_opts o = {.retain_graph = retain};
    int rc = nb_autograd_grad(&y, 1, &g, c->want, c->n_want, &o, gr);
    for (int w = 0; rc == 0 && w < c->n_want; w++) {
        int i = c->want_at[w];
        nb_tensor *t = c->in[i];
        for (int64_t e = 0; rc == 0 && e < t->numel; e++) {
            double v = gr[w] ? nbi_get_flat(gr[w], e) : 0.0;
            if (!compare) {
                G[i][e * stride] = v;
                continue;
            }
            double first = G[i][e * stride];
            if (fabs(v - first) <= c->o.nondet_tol || (v != v && first != first)) continue;
            nbi_error("%s: %s: the same output gradient laid out contiguously, then transposed "
                      "or strided, gave different gradients: %.17g, then %.17g for input %d "
                      "element %lld (nondet_tol %g); a rule reads its upstream gradient's layout "
                      "wrongly, or backward is not deterministic", FN, c->order, first, v, i,
                      (long long)e, c->o.nondet_tol);
            rc = -1;
        }
    }
    for (int w = 0; rc == 0 && w < c->n_want; w++) nb_free(gr[w]);
    if (gr != gr_inline) free(gr);
    return rc;
}

/* Backward from fn's output with gradient seed (filled by make_seed on a
 * zeroed tensor of the output's shape), twice: the gradient of input i goes
 * to G[i] at stride `stride` (NULL rows for inputs that do not require grad,
 * zeros where there is no gradient), and the second pass, from the same
 * values in another layout, must agree. */
typedef void (*seed_fn)(nb_tensor *g, void *arg);
static int backward_twice(const check *c, seed_fn make_seed, void *arg, double **G,
                          int64_t stride) {
    int rc = -1;
    nb_scope_begin();
    nb_tensor *y = call(c);
    nb_tensor *g = y ? nbi_new(FN, NB_F64, y->ndim, y->shape, true) : NULL;
    if (g && !y->requires_grad) { /* the output depends on no input that requires grad */
        for (int i = 0; i < c->n; i++)
            if (G[i]) for (int64_t e = 0; e < c->in[i]->numel; e++) G[i][e * stride] = 0;
        rc = 0;
    } else if (g) {
        make_seed(g, arg);
        rc = vjp(c, y, g, true, G, stride, false);
        nb_tensor *g2 = rc == 0 ? relaid(g) : NULL;
        if (rc == 0) rc = g2 ? vjp(c, y, g2, false, G, stride, true) : -1;
        if (rc == 0) rc = check_no_grad_inputs(c);
    }
    nb_scope_end();
    return rc;
}

static void one_hot(nb_tensor *g, void *arg) { nbi_set_flat(g, *(int64_t *)arg, 1.0); }

/* Row j of the analytic Jacobian: backward from a one-hot output gradient
 * (rows: room for n pointers). */
static int analytic_row(const check *c, int64_t j, double **A, double **rows) {
    for (int i = 0; i < c->n; i++) rows[i] = A[i] ? A[i] + j : NULL;
    return backward_twice(c, one_hot, &j, rows, c->m);
}

static void note_worst(nb_gradcheck_result *r, int i, int64_t e, int64_t j, double a, double nu) {
    r->input = i;
    r->index = e;
    r->output_index = j;
    r->analytic = a;
    r->numeric = nu;
}

/* The worst entry is the one with the largest |analytic - numeric| (a NaN
 * difference counts as the largest); the first one outside the tolerance is
 * kept too, for the message when the two differ. */
typedef struct {
    bool any;
    int input;
    int64_t index, output_index;
    double analytic, numeric;
} entry;

static void compare_one(nb_gradcheck_result *r, const nb_gradcheck_opts *o, entry *first_bad,
                        int i, int64_t e, int64_t j, double a, double nu) {
    double err = fabs(a - nu);
    bool nan = err != err;
    bool worse = r->checked == 0 || nan ||
                 (r->max_abs_err == r->max_abs_err && err > r->max_abs_err);
    if (worse) {
        r->max_abs_err = err;
        note_worst(r, i, e, j, a, nu);
    }
    if (!(err <= o->atol + o->rtol * fabs(nu))) {
        r->ok = false;
        r->mismatched++;
        if (!first_bad->any) *first_bad = (entry){true, i, e, j, a, nu};
    }
    r->checked++;
}

/* "(1, 2) (flat 6)": element e of t, as a position and a flat index. */
static const char *position(const nb_tensor *t, int64_t e, char *buf, size_t len) {
    int64_t idx[NB_MAX_DIMS], rest = e;
    for (int d = t->ndim - 1; d >= 0; d--) {
        idx[d] = t->shape[d] ? rest % t->shape[d] : 0;
        rest = t->shape[d] ? rest / t->shape[d] : 0;
    }
    size_t k = (size_t)snprintf(buf, len, "(");
    for (int d = 0; d < t->ndim && k < len; d++)
        k += (size_t)snprintf(buf + k, len - k, "%s%lld", d ? ", " : "", (long long)idx[d]);
    if (k < len) snprintf(buf + k, len - k, ") (flat %lld)", (long long)e);
    return buf;
}

static void summarize(const check *c, nb_gradcheck_result *r, const entry *first_bad, bool fast,
                      const char *order) {
    char where[200], also[260] = "", p1[96], p2[96];
    if (r->checked == 0 || r->input < 0) /* empty inputs or output: nothing to compare */
        snprintf(where, sizeof where, "no entry");
    else if (fast)
        snprintf(where, sizeof where, "input %d, projection v^T J u", r->input);
    else
        snprintf(where, sizeof where, "input %d at %s, output element %lld", r->input,
                 position(c->in[r->input], r->index, p1, sizeof p1), (long long)r->output_index);
    bool same = first_bad->input == r->input && first_bad->index == r->index &&
                first_bad->output_index == r->output_index;
    if (first_bad->any && !same && !fast && first_bad->input >= 0)
        snprintf(also, sizeof also, "; first outside tolerance: input %d at %s, output element "
                 "%lld: analytic %.10g vs numeric %.10g", first_bad->input,
                 position(c->in[first_bad->input], first_bad->index, p2, sizeof p2),
                 (long long)first_bad->output_index, first_bad->analytic, first_bad->numeric);
    snprintf(r->message, sizeof r->message,
             "%s: %s: %s: %lld of %lld %s outside tolerance; worst: %s: analytic %.10g vs "
             "numeric %.10g (|diff| %.3g)%s", FN, order, r->ok ? "ok" : "MISMATCH",
             (long long)r->mismatched, (long long)r->checked, fast ? "projections" : "entries",
             where, r->analytic, r->numeric, r->max_abs_err, also);
}

/* One backward from an output gradient of ones read through stride 0
 * everywhere (an expanded scalar, as nb_sum's backward hands on) must give
 * the sum of the Jacobian's rows. */
static int stride0_check(const check *c, double **A) {
    int rc = -1;
    nb_scope_begin();
    nb_tensor *y = call(c);
    if (y && !y->requires_grad) rc = 0;
    else if (y) {
        nb_tensor *one = nbi_new(FN, NB_F64, 0, NULL, false);
        int64_t zero[NB_MAX_DIMS] = {0};
        if (one) nbi_set_flat(one, 0, 1.0);
        nb_tensor *g = one ? nbi_make_view(one, y->ndim, y->shape, zero, 0) : NULL;
        double **S = calloc((size_t)c->n, sizeof *S);
        rc = g && S ? 0 : -1;
        for (int i = 0; rc == 0 && i < c->n; i++)
            if (A[i] && !(S[i] = malloc((size_t)c->in[i]->numel * sizeof **S + 1))) rc = -1;
        if (rc == 0) rc = vjp(c, y, g, false, S, 1, false);
        for (int i = 0; rc == 0 && i < c->n; i++) {
            for (int64_t e = 0; A[i] && rc == 0 && e < c->in[i]->numel; e++) {
                double want = 0;
                for (int64_t j = 0; j < c->m; j++) want += A[i][e * c->m + j];
                if (fabs(S[i][e] - want) <= c->o.atol + c->o.rtol * fabs(want) ||
                    (want != want && S[i][e] != S[i][e]))
                    continue;
                char p[96];
                nbi_error("%s: %s backward from an output gradient of ones read through stride "
                          "0 gave %.10g for input %d at %s, where the Jacobian's rows sum to "
                          "%.10g: a rule reads an expanded upstream gradient wrongly", FN,
                          c->order, S[i][e], i, position(c->in[i], e, p, sizeof p), want);
                rc = -1;
            }
        }
        for (int i = 0; S && i < c->n; i++) free(S[i]);
        free(S);
    }
    nb_scope_end();
    return rc;
}

/* ---------------------------------------------------------- forward mode */
/* J_i u as nb_jvp computes it, with u the tangent of input i (others zero):
 * m values into out. */
static int jvp_column(const check *c, int i, const double *u, double *out) {
    int rc = -1;
    nb_scope_begin();
    nb_tensor **tan = calloc((size_t)c->n, sizeof *tan);
    nb_tensor *t = tan ? nbi_new(FN, NB_F64, c->in[i]->ndim, c->in[i]->shape, false) : NULL;
    if (t) {
        for (int64_t e = 0; e < t->numel; e++) nbi_set_flat(t, e, u[e]);
        tan[i] = t;
        nb_tensor *y = NULL, *ty = NULL;
        rc = nb_jvp(c->fn, c->ctx, c->n, c->in, tan, &y, &ty);
        if (rc == 0 && ty->numel != c->m)
            rc = (nbi_error("%s: output size changed between calls", FN), -1);
        if (rc == 0) rc = nb_copy_to_f64(ty, out);
    } else {
        nbi_error("%s: out of memory", FN);
    }
    free(tan);
    nb_scope_end();
    return rc;
}

/* Forward mode against the numeric Jacobian N (full: column by column). */
static int forward_full(const check *c, double **N) {
    entry first_bad = {0};
    nb_gradcheck_result r = {.ok = true, .input = -1, .index = -1, .output_index = -1};
    nb_gradcheck_result *saved = c->r;
    int rc = 0;
    double *col = malloc((size_t)c->m * sizeof *col + 1);
    for (int i = 0; rc == 0 && i < c->n; i++) {
        if (!N[i]) continue;
        double *u = calloc((size_t)c->in[i]->numel + 1, sizeof *u);
        if (!u || !col) rc = (nbi_error("%s: out of memory", FN), -1);
        for (int64_t e = 0; rc == 0 && e < c->in[i]->numel; e++) {
            u[e] = 1;
            rc = jvp_column(c, i, u, col);
            u[e] = 0;
            for (int64_t j = 0; rc == 0 && j < c->m; j++)
                compare_one(&r, &c->o, &first_bad, i, e, j, col[j], N[i][e * c->m + j]);
        }
        free(u);
    }
    free(col);
    if (rc != 0) return rc;
    summarize(c, &r, &first_bad, false, "forward-mode");
    if (!r.ok) *saved = r; /* the forward-mode mismatch is the result */
    return 0;
}

static int full_check(const check *c) {
    int n = c->n;
    int64_t m = c->m;
    for (int i = 0; i < n; i++)
        if (!c->no_grad[i] && c->in[i]->numel > 0 && m > (INT64_C(1) << 26) / c->in[i]->numel)
            return (nbi_error("%s: input %d (%lld elements) x output (%lld elements) is too large "
                              "for a full Jacobian; check a smaller case, or use fast_mode", FN, i,
                              (long long)c->in[i]->numel, (long long)m), -1);
    size_t count = n > 0 ? (size_t)n : 1; /* n >= 1 (nb_gradcheck checked it) */
    double **A = calloc(count, sizeof *A), **N = calloc(count, sizeof *N);
    double **rows = calloc(count, sizeof *rows);
    int rc = (A && N && rows) ? 0 : -1;
    for (int i = 0; rc == 0 && i < n; i++) {
        if (c->no_grad[i]) continue;
        size_t sz = (size_t)(c->in[i]->numel * m) + 1;
        A[i] = malloc(sz * sizeof **A);
        N[i] = malloc(sz * sizeof **N);
        if (!A[i] || !N[i]) rc = -1;
    }
    if (rc != 0) nbi_error("%s: out of memory", FN);
    bool was_off = nbi_grad_off; /* set directly: nabla's own, allowed in any callback */
    nbi_grad_off = true;
    for (int i = 0; rc == 0 && i < n; i++)
        if (A[i]) rc = numeric(c, i, N[i]);
    nbi_grad_off = false;
    for (int64_t j = 0; rc == 0 && j < m; j++) rc = analytic_row(c, j, A, rows);
    if (rc == 0) rc = stride0_check(c, A);
    nbi_grad_off = was_off;
    if (rc == 0) {
        entry first_bad = {0};
        c->r->ok = true;
        for (int i = 0; i < n; i++)
            for (int64_t k = 0; A[i] && k < c->in[i]->numel * m; k++)
                compare_one(c->r, &c->o, &first_bad, i, k / m, k % m, A[i][k], N[i][k]);
        summarize(c, c->r, &first_bad, false, c->order);
    }
    if (rc == 0 && c->r->ok && c->o.check_forward_ad) rc = forward_full(c, N);
    for (int i = 0; i < n; i++) {
        if (A) free(A[i]);
        if (N) free(N[i]);
    }
    free(A);
    free(N);
    free(rows);
    return rc;
}

/* ------------------------------------------------------------ fast mode */
/* Unit-norm vectors with entries drawn uniformly from [-1, 1). */
static void unit_vector(double *x, int64_t len, nb_rng *rng) {
    double norm = 0;
    uint64_t at = rng->offset; /* the check's own stream: never on a checkpoint's tape */
    rng->offset += (uint64_t)len;
    for (int64_t k = 0; k < len; k++) {
        x[k] = 2 * nbi_rng_uniform(rng->seed, at + (uint64_t)k) - 1;
        norm += x[k] * x[k];
    }
    norm = sqrt(norm);
    for (int64_t k = 0; norm > 0 && k < len; k++) x[k] /= norm;
}

static void seed_from(nb_tensor *g, void *arg) {
    const double *v = arg;
    for (int64_t k = 0; k < g->numel; k++) nbi_set_flat(g, k, v[k]);
}

/* v^T (J_i u): the directional derivative of fn along u in input i, dotted with v. */
static int numeric_projection(const check *c, int i, const double *u, const double *v,
                              double *out) {
    nb_tensor *t = c->in[i];
    int64_t m = c->m;
    double eps = c->o.eps;
    double *x = malloc((size_t)t->numel * sizeof *x + 1);
    double *plus = malloc((size_t)m * sizeof *plus + 1);
    double *minus = malloc((size_t)m * sizeof *minus + 1);
    int rc = (x && plus && minus) ? 0 : (nbi_error("%s: out of memory", FN), -1);
    for (int64_t e = 0; rc == 0 && e < t->numel; e++) x[e] = nbi_get_flat(t, e);
    for (int64_t e = 0; rc == 0 && e < t->numel; e++) nbi_set_flat(t, e, x[e] + eps * u[e]);
    if (rc == 0) rc = eval(c, plus);
    for (int64_t e = 0; x && e < t->numel; e++) nbi_set_flat(t, e, x[e] - eps * u[e]);
    if (rc == 0) rc = eval(c, minus);
    for (int64_t e = 0; x && e < t->numel; e++) nbi_set_flat(t, e, x[e]);
    double s = 0;
    for (int64_t j = 0; rc == 0 && j < m; j++) s += v[j] * (plus[j] - minus[j]) / (2 * eps);
    *out = s;
    free(x);
    free(plus);
    free(minus);
    return rc;
}

static int fast_check(const check *c) {
    int n = c->n;
    int64_t m = c->m;
    int probes = c->o.fast_probes > 0 ? c->o.fast_probes : 1;
    nb_rng rng;
    nb_rng_seed(&rng, c->o.seed);
    double *v = malloc((size_t)m * sizeof *v + 1);
    double **u = calloc((size_t)n, sizeof *u), **G = calloc((size_t)n, sizeof *G);
    int rc = (v && u && G) ? 0 : -1;
    for (int i = 0; rc == 0 && i < n; i++) {
        if (c->no_grad[i]) continue;
        u[i] = malloc((size_t)c->in[i]->numel * sizeof **u + 1);
        G[i] = malloc((size_t)c->in[i]->numel * sizeof **G + 1);
        if (!u[i] || !G[i]) rc = -1;
    }
    if (rc != 0) nbi_error("%s: out of memory", FN);
    entry first_bad = {0}, fwd_bad = {0};
    c->r->ok = true;
    nb_gradcheck_result fwd = {.ok = true, .input = -1, .index = -1, .output_index = -1};
    double *fwd_col = NULL;
    bool was_off = nbi_grad_off;
    for (int p = 0; rc == 0 && p < probes; p++) {
        unit_vector(v, m, &rng);
        for (int i = 0; i < n; i++)
            if (u[i]) unit_vector(u[i], c->in[i]->numel, &rng);
        nbi_grad_off = false;
        rc = backward_twice(c, seed_from, v, G, 1); /* G[i] = v^T J_i */
        nbi_grad_off = true;
        for (int i = 0; rc == 0 && i < n; i++) {
            if (!u[i]) continue;
            double a = 0, nu = 0;
            for (int64_t e = 0; e < c->in[i]->numel; e++) a += G[i][e] * u[i][e];
            rc = numeric_projection(c, i, u[i], v, &nu);
            if (rc == 0) compare_one(c->r, &c->o, &first_bad, i, -1, -1, a, nu);
            if (rc != 0 || !c->o.check_forward_ad) continue;
            double f = 0; /* v . (J_i u) in forward mode */
            if (!fwd_col && !(fwd_col = malloc((size_t)m * sizeof *fwd_col + 1)))
                rc = (nbi_error("%s: out of memory", FN), -1);
            if (rc == 0) rc = jvp_column(c, i, u[i], fwd_col);
            for (int64_t j = 0; rc == 0 && j < m; j++) f += v[j] * fwd_col[j];
            if (rc == 0) compare_one(&fwd, &c->o, &fwd_bad, i, -1, -1, f, nu);
        }
    }
    nbi_grad_off = was_off;
    free(fwd_col);
    if (rc == 0) summarize(c, c->r, &first_bad, true, c->order);
    if (rc == 0 && c->r->ok && c->o.check_forward_ad) {
        summarize(c, &fwd, &fwd_bad, true, "forward-mode");
        if (!fwd.ok) *c->r = fwd;
    }
    for (int i = 0; i < n; i++) {
        if (u) free(u[i]);
        if (G) free(G[i]);
    }
    free(u);
    free(G);
    free(v);
    return rc;
}

/* The inputs' values at the start, to find out whether fn wrote them (the
 * numbers would then be void) and to put them back. */
static double **snapshot(int n, nb_tensor **in) {
    double **v = calloc((size_t)n, sizeof *v);
    for (int i = 0; v && i < n; i++) {
        if (!(v[i] = malloc((size_t)in[i]->numel * sizeof **v + 1))) {
            for (int k = 0; k < i; k++) free(v[k]);
            free(v);
            return NULL;
        }
        for (int64_t e = 0; e < in[i]->numel; e++) v[i][e] = nbi_get_flat(in[i], e);
    }
    return v;
}

/* Puts the values back; the first input found changed, or -1. */
static int restore(int n, nb_tensor **in, double **v) {
    int changed = -1;
    for (int i = 0; i < n; i++) {
        for (int64_t e = 0; e < in[i]->numel; e++) {
            double now = nbi_get_flat(in[i], e);
            if (memcmp(&now, &v[i][e], sizeof now) == 0) continue;
            nbi_set_flat(in[i], e, v[i][e]);
            if (changed < 0) changed = i;
        }
        free(v[i]);
    }
    free(v);
    return changed;
}

/* The custom functions (nb_function) in the graph of fn's output, for a
 * mismatch's message: their backwards are the user's code being checked.
 * Appends "; ... rmsnorm" to msg (nothing when there are none). */
static nb_tensor *vjp_fn(nb_tensor **in, int n1, void *vctx);
typedef struct {
    nb_fn fn;
    void *ctx;
    int n; /* fn's inputs; v is input n */
} gg_ctx;

static void name_custom_functions(const check *c, char *msg, size_t cap) {
    enum { MAX_NODES = 4096, MAX_NAMES = 4 };
    check inner = *c; /* nb_gradgradcheck: the graph of the function it was given */
    if (c->fn == vjp_fn) {
        const gg_ctx *g = c->ctx;
        inner.fn = g->fn, inner.ctx = g->ctx, inner.n = g->n;
    }
    nb_scope_begin();
    nb_tensor *y = call(&inner);
    const nbi_node **seen = malloc(MAX_NODES * sizeof *seen);
    const nb_tensor **stack = malloc(MAX_NODES * sizeof *stack);
    const char *names[MAX_NAMES];
    int nseen = 0, top = 0, nnames = 0, more = 0;
    if (y && seen && stack && y->grad_fn) stack[top++] = y;
    while (top > 0) {
        const nbi_node *n = stack[--top]->grad_fn;
        bool dup = false;
        for (int k = 0; k < nseen && !dup; k++) dup = seen[k] == n;
        if (dup || nseen == MAX_NODES) continue;
        seen[nseen++] = n;
        if (n->fn_ctx) {
            bool named = false;
            for (int k = 0; k < nnames && !named; k++) named = !strcmp(names[k], n->op);
            if (!named && nnames < MAX_NAMES) names[nnames++] = n->op;
            else if (!named) more++;
        }
        for (int i = 0; i < n->nin && top < MAX_NODES; i++)
            if (n->in[i]->grad_fn) stack[top++] = n->in[i];
    }
    size_t len = strlen(msg);
    for (int k = 0; k < nnames && len < cap; k++)
        len += (size_t)snprintf(msg + len, cap - len, "%s%s", k ? ", " : "; custom functions "
                                "in the graph checked: ", names[k]);
    if (more && len < cap) snprintf(msg + len, cap - len, " and %d more", more);
    free(seen);
    free(stack);
    nb_scope_end();
}

static bool gradcheck_as(const char *order, nb_fn fn, void *ctx, int n, nb_tensor **inputs,
                         const nb_gradcheck_opts *opts, nb_gradcheck_result *out) {
    nb_gradcheck_result r = {.input = -1, .index = -1, .output_index = -1};
    nb_gradcheck_opts o = opts ? *opts : (nb_gradcheck_opts)NB_GRADCHECK_DEFAULTS;
    check c = {.fn = fn, .ctx = ctx, .n = n, .in = inputs, .m = -1, .o = o, .r = &r,
               .order = order};
    nb_tensor **saved_grad = NULL;
    int rc = -1;
    if (!fn || !inputs || n <= 0)
        nbi_error("%s: needs a function and at least one input (n = %d)", FN, n);
    else if (!(o.eps > 0) || !(o.atol >= 0) || !(o.rtol >= 0) || !(o.nondet_tol >= 0) ||
             o.fast_probes < 0)
        nbi_error("%s: eps must be > 0 and atol, rtol, nondet_tol, fast_probes >= 0 (got %g, "
                  "%g, %g, %g, %d)", FN, o.eps, o.atol, o.rtol, o.nondet_tol, o.fast_probes);
    else if (check_inputs(n, inputs))
        rc = 0;
    if (rc == 0) {
        saved_grad = calloc((size_t)n, sizeof *saved_grad);
        c.grad_before = calloc((size_t)n, sizeof *c.grad_before);
        c.grad_version = calloc((size_t)n, sizeof *c.grad_version);
        c.no_grad = calloc((size_t)n, sizeof *c.no_grad);
        c.want = calloc((size_t)n, sizeof *c.want);
        c.want_at = calloc((size_t)n, sizeof *c.want_at);
        if (!saved_grad || !c.grad_before || !c.grad_version || !c.no_grad || !c.want ||
            !c.want_at)
            rc = (nbi_error("%s: out of memory", FN), -1);
        for (int i = 0; rc == 0 && i < n; i++)
            if (inputs[i]->requires_grad) c.want_at[c.n_want] = i, c.want[c.n_want++] = inputs[i];
    }
    double **before = NULL;
    if (rc == 0 && !(before = snapshot(n, inputs))) rc = (nbi_error("%s: out of memory", FN), -1);
    if (rc == 0) {
        for (int i = 0; i < n; i++) nbi_ref(inputs[i]); /* the function may free one */
        for (int i = 0; i < n; i++) {
            nb_tensor *t = inputs[i];
            if (t->requires_grad) { /* put back afterwards */
                saved_grad[i] = t->grad;
                t->grad = NULL;
            } else {
                c.no_grad[i] = true;
                c.grad_before[i] = t->grad;
                c.grad_version[i] = t->grad ? t->grad->storage->version : 0;
            }
        }
        if ((c.m = probe(&c)) < 0) rc = -1;
        else rc = o.fast_mode ? fast_check(&c) : full_check(&c);
        /* a failure of a function whose outputs vary by chance (two draws may
         * agree on a small output) is that, not a rule's: more draws decide */
        if ((rc != 0 || !r.ok) && c.m >= 0) {
            char first[sizeof r.message];
            snprintf(first, sizeof first, "%s", rc != 0 && nb_last_error() ? nb_last_error() : "");
            if (same_each_time(&c, 16) < 0) rc = -1, r.ok = false;
            else if (rc != 0) nbi_error("%s", first);
        }
        for (int i = 0; i < n; i++) {
            inputs[i]->requires_grad = !c.no_grad[i]; /* as it was, whatever fn did */
            if (!c.no_grad[i]) { /* a .grad the function's own backward left goes */
                if (inputs[i]->grad != saved_grad[i]) nbi_unref(inputs[i]->grad);
                inputs[i]->grad = saved_grad[i];
            } else if (!c.grad_before[i] && inputs[i]->grad) { /* one fn's flip let in */
                nbi_unref(inputs[i]->grad);
                inputs[i]->grad = NULL;
            }
        }
        int changed = restore(n, inputs, before);
        if (changed >= 0)
            rc = (nbi_error("%s: the function changed the values of input %d (wrote it in place); "
                            "they were put back, and the check is void: the function must "
                            "leave its inputs as they are", FN, changed), -1);
        if (rc == 0 && !r.ok) {
            name_custom_functions(&c, r.message, sizeof r.message);
            nbi_error("%s", r.message);
        }
        for (int i = 0; i < n; i++) nbi_unref(inputs[i]);
    }
    if (rc != 0) { /* an error: the message says why, and so does the result */
        r.ok = false;
        const char *e = nb_last_error();
        snprintf(r.message, sizeof r.message, "%s", e ? e : "nb_gradcheck: failed");
    }
    free(saved_grad);
    free(c.grad_before);
    free(c.grad_version);
    free(c.no_grad);
    free(c.want);
    free(c.want_at);
    if (out) *out = r;
    return rc == 0 && r.ok;
}

bool nb_gradcheck(nb_fn fn, void *ctx, int n, nb_tensor **inputs, const nb_gradcheck_opts *opts,
                  nb_gradcheck_result *out) {
    const char *outer = FN;
    FN = "nb_gradcheck";
    bool ok = gradcheck_as("first-order", fn, ctx, n, inputs, opts, out);
    FN = outer;
    return ok;
}

/* ------------------------------------------------------ nb_gradgradcheck */
/* The function gradgradcheck checks (gg_ctx, above): (inputs, v) -> the
 * vector-Jacobian product v^T d fn / d(inputs that require grad), made with
 * create_graph so that its own backward is fn's double backward. */

static nb_tensor *vjp_of(gg_ctx *g, nb_tensor **in, nb_tensor *v);

/* Grad mode on even for the finite differences (which run with it off):
 * the vjp is itself a backward. */
static nb_tensor *vjp_fn(nb_tensor **in, int n1, void *vctx) {
    bool was_off = nbi_grad_off;
    nbi_grad_off = false;
    nb_tensor *r = vjp_of(vctx, in, in[n1 - 1]);
    nbi_grad_off = was_off;
    return r;
}

/* gs[0..k) flattened and laid end to end, as one node (so that the check
 * differentiates through it): its backward hands each its part of g. */
static int concat_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    if (nbi_create_graph()) return nbi_no_double_backward(n);
    int64_t at = 0;
    for (int k = 0; k < n->nin; k++) {
        nb_tensor *x = n->in[k];
        int64_t st[NB_MAX_DIMS];
        nbi_contiguous_strides(x->ndim, x->shape, st);
        for (int d = 0; d < x->ndim; d++) st[d] *= g->strides[0];
        if (!(gin[k] = nbi_make_view(g, x->ndim, x->shape, st, g->offset + at * g->strides[0])))
            return -1;
        at += x->numel;
    }
    return 0;
}

static nb_tensor *concat_flat(int k, nb_tensor **gs);

static nb_tensor *concat_jvp(nbi_node *n, nb_tensor *const *tin) {
    nb_tensor *t[64];
    for (int i = 0; i < n->nin; i++) {
        nb_tensor *x = n->in[i];
        if (!(t[i] = tin[i] ? tin[i] : nbi_new(FN, x->dtype, x->ndim, x->shape, true)))
            return NULL;
    }
    return concat_flat(n->nin, t);
}

static nb_tensor *concat_flat(int k, nb_tensor **gs) {
    int64_t total = 0;
    for (int i = 0; i < k; i++) total += gs[i]->numel;
    nb_tensor *out = nbi_new(FN, NB_F64, 1, &total, false);
    if (!out) return NULL;
    int64_t at = 0;
    for (int i = 0; i < k; i++) {
        int64_t st[NB_MAX_DIMS];
        nbi_contiguous_strides(gs[i]->ndim, gs[i]->shape, st);
        nb_tensor *part = nbi_make_view(out, gs[i]->ndim, gs[i]->shape, st, at);
        if (!part) return NULL;
        nbi_copy_strided(part, gs[i]->strides, gs[i]);
        at += gs[i]->numel;
    }
    if (!nbi_needs_grad(k, gs)) return out;
    nbi_node *n = nbi_record_unchecked(out, "nb_gradgradcheck's concatenation", concat_backward,
                                       k, gs);
    if (!n) return nbi_discard(out);
    n->jvp = concat_jvp;
    return out;
}

static nb_tensor *vjp_of(gg_ctx *g, nb_tensor **in, nb_tensor *v) {
    nb_tensor *y = g->fn(in, g->n, g->ctx);
    if (!y) return NULL;
    if (!nbi_same_shape(y, v) || y->dtype != v->dtype)
        return nbi_error("%s: the function's output changed shape (%s, then %s)", FN,
                         NBI_SHAPE(v), NBI_SHAPE(y));
    nb_tensor *want[64], *got[64];
    int k = 0;
    for (int i = 0; i < g->n; i++)
        if (in[i]->requires_grad) want[k++] = in[i];
    nb_backward_opts o = {.create_graph = true};
    if (y->requires_grad && nb_autograd_grad(&y, 1, &v, want, k, &o, got) != 0) return NULL;
    for (int w = 0; w < k; w++) {
        if (!y->requires_grad || !got[w]) /* no path: its gradient is zero */
            got[w] = nbi_new(FN, NB_F64, want[w]->ndim, want[w]->shape, true);
        if (!got[w]) return NULL;
    }
    return concat_flat(k, got);
}

/* The gradient a create_graph backward makes (the rules' recorded forms)
 * must be the plain backward's (their fused kernels) for the same v: the
 * check below differentiates the recorded gradient, and a recorded form
 * that computes a wrong gradient, consistently, would pass it. 0, or -1
 * with a message naming the first entry that differs. */
static int recorded_is_plain(const check *c, nb_tensor *v) {
    int rc = -1;
    nb_scope_begin();
    bool was_off = nbi_grad_off;
    nbi_grad_off = false;
    nb_tensor *y = call(c), *want[64], *plain[64], *rec[64];
    int k = 0;
    for (int i = 0; i < c->n; i++)
        if (!c->no_grad[i]) want[k++] = c->in[i];
    nb_backward_opts keep = {.retain_graph = true}, cg = {.create_graph = true};
    if (y && !y->requires_grad) rc = 0; /* no input reaches the output */
    else if (y && nb_autograd_grad(&y, 1, &v, want, k, &keep, plain) == 0 &&
             nb_autograd_grad(&y, 1, &v, want, k, &cg, rec) == 0)
        rc = 0;
    for (int w = 0, i = 0; rc == 0 && w < k; w++, i++) {
        while (c->no_grad[i]) i++;
        for (int64_t e = 0; rc == 0 && e < want[w]->numel; e++) {
            double a = plain[w] ? nbi_get_flat(plain[w], e) : 0;
            double b = rec[w] ? nbi_get_flat(rec[w], e) : 0;
            if (fabs(a - b) <= c->o.atol + c->o.rtol * fabs(a) || (a != a && b != b)) continue;
            char p[96];
            nbi_error("%s: second-order: the gradient made with create_graph differs from the "
                      "plain backward's for input %d at %s: %.10g, plain %.10g: a rule's "
                      "recorded form (its create_graph path) is wrong", FN, i,
                      position(c->in[i], e, p, sizeof p), b, a);
            rc = -1;
        }
    }
    nbi_grad_off = was_off;
    nb_scope_end();
    return rc;
}

bool nb_gradgradcheck(nb_fn fn, void *ctx, int n, nb_tensor **inputs,
                      const nb_gradcheck_opts *opts, nb_gradcheck_result *out) {
    const char *outer = FN;
    FN = "nb_gradgradcheck";
    nb_gradcheck_opts o = opts ? *opts : (nb_gradcheck_opts)NB_GRADCHECK_DEFAULTS;
    nb_gradcheck_result r = {.input = -1, .index = -1, .output_index = -1};
    bool ok = false;
    nb_scope_begin();
    nb_tensor **in1 = NULL;
    if (!fn || !inputs || n <= 0 || n > 63) {
        nbi_error("%s: needs a function and 1 to 63 inputs (n = %d)", FN, n);
    } else if (check_inputs(n, inputs)) {
        /* v: the output gradient, uniform in [-1, 1) from the seed */
        nb_tensor *y = NULL;
        check c = {.fn = fn, .ctx = ctx, .n = n, .in = inputs, .m = -1};
        c.no_grad = calloc((size_t)n, sizeof *c.no_grad);
        for (int i = 0; c.no_grad && i < n; i++) c.no_grad[i] = !inputs[i]->requires_grad;
        bool was_off = nbi_grad_off;
        nbi_grad_off = true;
        if (c.no_grad) y = call(&c);
        nbi_grad_off = was_off;
        nb_tensor *v = y ? nbi_new(FN, NB_F64, y->ndim, y->shape, true) : NULL;
        in1 = v ? malloc((size_t)(n + 1) * sizeof *in1) : NULL;
        if (in1) {
            nb_rng rng;
            nb_rng_seed(&rng, o.seed);
            uint64_t at = rng.offset;
            for (int64_t e = 0; e < v->numel; e++)
                nbi_set_flat(v, e, 2 * nbi_rng_uniform(rng.seed, at + (uint64_t)e) - 1);
            c.o = o;
            if (recorded_is_plain(&c, v) == 0) {
                memcpy(in1, inputs, (size_t)n * sizeof *in1);
                in1[n] = nb_set_requires_grad(v, true);
                gg_ctx g = {fn, ctx, n};
                ok = gradcheck_as("second-order", vjp_fn, &g, n + 1, in1, &o, &r);
            } else {
                free(in1);
                in1 = NULL; /* the message says why */
            }
        } else if (y && v) {
            nbi_error("%s: out of memory", FN);
        }
        free(c.no_grad);
    }
    if (!in1) {
        const char *e = nb_last_error();
        snprintf(r.message, sizeof r.message, "%s", e ? e : "nb_gradgradcheck: failed");
    }
    free(in1);
    nb_scope_end();
    FN = outer;
    if (out) *out = r;
    return ok;
}
