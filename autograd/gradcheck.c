/* gradcheck.c: the analytic Jacobian (one backward per output element)
 * against central finite differences (two forwards per input element), in
 * f64, like torch.autograd.gradcheck. */
#include "autograd_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *FN = "nb_gradcheck";

static bool check_inputs(int n, nb_tensor **in) {
    bool any = false;
    for (int i = 0; i < n; i++) {
        nb_tensor *t = in[i];
        if (!t) return nbi_null_input(FN), false;
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

/* Evaluates fn in a scope of its own and copies the output out (f64). */
static int eval(nb_fn fn, void *ctx, int n, nb_tensor **in, int64_t m, double *out) {
    nb_scope_begin();
    nb_tensor *y = fn(in, n, ctx);
    int rc = -1;
    if (!y) nbi_null_input(FN);
    else if (y->numel != m) nbi_error("%s: output size changed between calls", FN);
    else rc = nb_copy_to_f64(y, out);
    nb_scope_end();
    return rc;
}

/* Output size and dtype from one forward. */
static int64_t probe(nb_fn fn, void *ctx, int n, nb_tensor **in) {
    nb_scope_begin();
    nb_tensor *y = fn(in, n, ctx);
    int64_t m = -1;
    if (!y) nbi_null_input(FN);
    else if (y->dtype != NB_F64)
        nbi_error("%s: the function returned %s; it must return an f64 tensor", FN,
                  nb_dtype_name(y->dtype));
    else m = y->numel;
    nb_scope_end();
    return m;
}

/* Column block J[i] (numel_i x m) of the numeric Jacobian for input i. */
static int numeric(nb_fn fn, void *ctx, int n, nb_tensor **in, int i, int64_t m, double eps,
                   double *J) {
    nb_tensor *t = in[i];
    double *plus = malloc((size_t)m * sizeof *plus), *minus = malloc((size_t)m * sizeof *minus);
    int rc = (plus && minus) ? 0 : (nbi_error("%s: out of memory", FN), -1);
    for (int64_t e = 0; rc == 0 && e < t->numel; e++) {
        double v = nbi_get_flat(t, e);
        nbi_set_flat(t, e, v + eps);
        rc = eval(fn, ctx, n, in, m, plus);
        nbi_set_flat(t, e, v - eps);
        if (rc == 0) rc = eval(fn, ctx, n, in, m, minus);
        nbi_set_flat(t, e, v);
        for (int64_t j = 0; rc == 0 && j < m; j++)
            J[e * m + j] = (plus[j] - minus[j]) / (2 * eps);
    }
    free(plus);
    free(minus);
    return rc;
}

/* Row j of the analytic Jacobian: backward from a one-hot output gradient. */
static int analytic_row(nb_fn fn, void *ctx, int n, nb_tensor **in, int64_t m, int64_t j,
                        double **A) {
    int rc = -1;
    nb_scope_begin();
    nb_tensor *y = fn(in, n, ctx);
    if (!y) {
        nbi_null_input(FN);
    } else if (!y->requires_grad) {
        /* the output does not depend on any input that requires grad */
        for (int i = 0; i < n; i++)
            if (A[i]) for (int64_t e = 0; e < in[i]->numel; e++) A[i][e * m + j] = 0;
        rc = 0;
    } else {
        nb_tensor *g = nbi_new(FN, NB_F64, y->ndim, y->shape, true);
        if (g) {
            nbi_set_flat(g, j, 1.0);
            rc = nb_backward_with_grad(y, g);
        }
        for (int i = 0; rc == 0 && i < n; i++) {
            if (!A[i]) continue;
            nb_tensor *gr = in[i]->grad;
            for (int64_t e = 0; e < in[i]->numel; e++)
                A[i][e * m + j] = gr ? nbi_get_flat(gr, e) : 0.0;
        }
    }
    nb_scope_end();
    for (int i = 0; i < n; i++) { /* fresh gradients for the next row */
        if (!A[i]) continue;
        nbi_unref(in[i]->grad);
        in[i]->grad = NULL;
    }
    return rc;
}

static void compare(int n, nb_tensor **in, int64_t m, double **A, double **N,
                    const nb_gradcheck_opts *o, nb_gradcheck_result *r) {
    double worst = -1;
    r->ok = true;
    for (int i = 0; i < n; i++) {
        if (!A[i]) continue;
        for (int64_t k = 0; k < in[i]->numel * m; k++) {
            double a = A[i][k], nu = N[i][k], err = fabs(a - nu);
            double tol = o->atol + o->rtol * fabs(nu);
            double ratio = (err == err) ? err / tol : INFINITY;
            if (err > r->max_abs_err || err != err) r->max_abs_err = err;
            if (!(err <= tol)) {
                r->ok = false;
                r->mismatched++;
            }
            if (ratio > worst) {
                worst = ratio;
                r->input = i;
                r->index = k / m;
                r->output_index = k % m;
                r->analytic = a;
                r->numeric = nu;
            }
            r->checked++;
        }
    }
}

bool nb_gradcheck(nb_fn fn, void *ctx, int n, nb_tensor **inputs, const nb_gradcheck_opts *opts,
                  nb_gradcheck_result *out) {
    nb_gradcheck_result r = {0};
    nb_gradcheck_opts o = opts ? *opts : (nb_gradcheck_opts){1e-6, 1e-5, 1e-3};
    if (out) *out = r;
    if (!fn || !inputs || n <= 0)
        return nbi_error("%s: needs a function and at least one input (n = %d)", FN, n), false;
    if (!(o.eps > 0) || !(o.atol >= 0) || !(o.rtol >= 0))
        return nbi_error("%s: eps must be > 0 and atol, rtol >= 0 (got %g, %g, %g)", FN, o.eps,
                         o.atol, o.rtol), false;
    if (!check_inputs(n, inputs)) return false;
    int64_t m = probe(fn, ctx, n, inputs);
    if (m < 0) return false;
    for (int i = 0; i < n; i++)
        if (inputs[i]->requires_grad && inputs[i]->numel > 0 && m > (INT64_C(1) << 26) / inputs[i]->numel)
            return nbi_error("%s: input %d (%lld elements) x output (%lld elements) is too large "
                             "for a full Jacobian; check a smaller case", FN, i,
                             (long long)inputs[i]->numel, (long long)m), false;

    double **A = calloc((size_t)n, sizeof *A), **N = calloc((size_t)n, sizeof *N);
    nb_tensor **saved_grad = calloc((size_t)n, sizeof *saved_grad);
    bool was_enabled = nb_grad_enabled();
    int rc = (A && N && saved_grad) ? 0 : -1;
    for (int i = 0; rc == 0 && i < n; i++) {
        if (!inputs[i]->requires_grad) continue;
        saved_grad[i] = inputs[i]->grad; /* put back afterwards */
        inputs[i]->grad = NULL;
        size_t sz = (size_t)(inputs[i]->numel * m) + 1;
        A[i] = malloc(sz * sizeof **A);
        N[i] = malloc(sz * sizeof **N);
        if (!A[i] || !N[i]) rc = -1;
    }
    if (rc != 0) nbi_error("%s: out of memory", FN);

    nb_set_grad_enabled(false);
    for (int i = 0; rc == 0 && i < n; i++)
        if (A[i]) rc = numeric(fn, ctx, n, inputs, i, m, o.eps, N[i]);
    nb_set_grad_enabled(true);
    for (int64_t j = 0; rc == 0 && j < m; j++) rc = analytic_row(fn, ctx, n, inputs, m, j, A);
    nb_set_grad_enabled(was_enabled);

    if (rc == 0) {
        compare(n, inputs, m, A, N, &o, &r);
        snprintf(r.message, sizeof r.message,
                 "%s: %s: %lld of %lld entries outside tolerance; worst: input %d element %lld, "
                 "output element %lld: analytic %.10g vs numeric %.10g (max |diff| %.3g)", FN,
                 r.ok ? "ok" : "MISMATCH", (long long)r.mismatched, (long long)r.checked,
                 r.input, (long long)r.index,
                 (long long)r.output_index, r.analytic, r.numeric, r.max_abs_err);
        if (!r.ok) nbi_error("%s", r.message);
    }
    for (int i = 0; saved_grad && i < n; i++)
        if (inputs[i]->requires_grad) inputs[i]->grad = saved_grad[i];
    for (int i = 0; i < n; i++) {
        if (A) free(A[i]);
        if (N) free(N[i]);
    }
    free(A);
    free(N);
    free(saved_grad);
    if (out) *out = r;
    return rc == 0 && r.ok;
}
