/* error.c: the thread-local error message and the argument checks shared by
 * every public function (check, set the message, return NULL). */
#include "tensor_internal.h"

#include <stdlib.h>
#include <string.h>

static _Thread_local char msg[512];
static _Thread_local bool has_msg;

static bool abort_on_error(void) {
    const char *e = getenv("NABLA_ABORT_ON_ERROR");
    return e && e[0] && strcmp(e, "0") != 0;
}

void *nbi_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    has_msg = true;
    if (abort_on_error()) {
        fprintf(stderr, "nabla: %s\n", msg);
        abort();
    }
    return NULL;
}

void nb_report_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char buf[512];
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    nbi_error("%s", buf);
}

void *nbi_null_input(const char *fn) {
    if (!has_msg) nbi_error("%s: input is NULL", fn);
    return NULL;
}

const char *nb_last_error(void) { return has_msg ? msg : NULL; }

void nb_clear_error(void) {
    has_msg = false;
    msg[0] = 0;
}

const char *nbi_shape_str(int ndim, const int64_t *shape) {
    static _Thread_local char ring[4][8 * 24 + 4];
    static _Thread_local int k;
    char *b = ring[k];
    k = (k + 1) % 4;
    size_t n = 0, cap = sizeof ring[0];
    n += (size_t)snprintf(b + n, cap - n, "(");
    for (int i = 0; i < ndim && i < NB_MAX_DIMS && n < cap; i++)
        n += (size_t)snprintf(b + n, cap - n, i ? ",%lld" : "%lld", (long long)shape[i]);
    if (n < cap) snprintf(b + n, cap - n, ")");
    return b;
}

const char *nb_dtype_name(nb_dtype d) {
    switch (d) {
    case NB_F32: return "f32";
    case NB_F64: return "f64";
    case NB_I64: return "i64";
    case NB_BOOL: return "bool";
    }
    return "unknown";
}

bool nbi_check_float(const char *fn, const nb_tensor *t) {
    if (nbi_is_float(t->dtype)) return true;
    nbi_error("%s: expected a floating tensor (f32 or f64), got %s", fn, nb_dtype_name(t->dtype));
    return false;
}

bool nbi_check_same_dtype(const char *fn, const nb_tensor *a, const nb_tensor *b) {
    if (a->dtype == b->dtype) return true;
    nbi_error("%s: dtype mismatch (%s vs %s); convert one with nb_to", fn,
              nb_dtype_name(a->dtype), nb_dtype_name(b->dtype));
    return false;
}

int nbi_dim(const char *fn, int dim, int ndim) {
    int lo = ndim ? -ndim : -1, hi = ndim ? ndim - 1 : 0;
    if (dim < lo || dim > hi) {
        nbi_error("%s: dim %d out of range for a %d-d tensor (expected %d..%d)", fn, dim, ndim,
                  lo, hi);
        return -1;
    }
    return dim < 0 ? dim + (ndim ? ndim : 1) : dim;
}

bool nbi_broadcast_shape(const char *fn, int na, const int64_t *sa, int nb, const int64_t *sb,
                         int *nout, int64_t *out) {
    int n = na > nb ? na : nb;
    for (int i = 0; i < n; i++) {
        int ia = i - (n - na), ib = i - (n - nb);
        int64_t a = ia >= 0 ? sa[ia] : 1, b = ib >= 0 ? sb[ib] : 1;
        if (a != b && a != 1 && b != 1) {
            if (!fn) return false; /* a quiet probe */
            nbi_error("%s: shapes %s and %s cannot be broadcast (dim %d: %lld vs %lld)", fn,
                      nbi_shape_str(na, sa), nbi_shape_str(nb, sb), i - n, (long long)a,
                      (long long)b);
            return false;
        }
        out[i] = a == 1 ? b : a;
    }
    *nout = n;
    return true;
}

void nbi_broadcast_strides(const nb_tensor *t, int ndim, const int64_t *shape, int64_t *strides) {
    int lead = ndim - t->ndim;
    for (int i = 0; i < ndim; i++) {
        int j = i - lead;
        strides[i] = (j < 0 || (t->shape[j] == 1 && shape[i] != 1)) ? 0 : t->strides[j];
    }
}
