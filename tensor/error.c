/* error.c: the thread-local error message and the argument checks shared by
 * every public function (check, set the message, return NULL). */
#include "tensor_internal.h"

#include <stdlib.h>
#include <string.h>

/* msg is what nb_last_error() shows; cause is the last message that was not
 * about a NULL argument, which such a message quotes: a NULL is most often
 * the result of that earlier failure. */
static _Thread_local char msg[1024];
static _Thread_local char cause[512];
static _Thread_local bool has_msg, has_cause;
_Thread_local int nbi_trusted;

static bool abort_on_error(void) {
    const char *e = getenv("NABLA_ABORT_ON_ERROR");
    return e && e[0] && strcmp(e, "0") != 0;
}

static _Thread_local uint64_t serial;
uint64_t nbi_error_serial(void) { return serial; }

static void raise_message(void) {
    has_msg = true;
    serial++;
    if (abort_on_error()) {
        fprintf(stderr, "nabla: %s\n", msg);
        abort();
    }
}

void *nbi_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cause, sizeof cause, fmt, ap);
    va_end(ap);
    has_cause = true;
    snprintf(msg, sizeof msg, "%s", cause);
    raise_message();
    return NULL;
}

void *nbi_error_quoting(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    raise_message();
    return NULL;
}

const char *nbi_error_cause(void) { return has_cause ? cause : NULL; }

void nb_report_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char buf[sizeof cause];
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    nbi_error("%s", buf);
}

bool nbi_bad_arg_named(const char *fn, const char *noun, const nb_tensor *t, int i) {
    if (!t) {
        const char *earlier = nbi_error_cause();
        if (earlier)
            nbi_error_quoting("%s: %s %d is NULL, after an earlier error: %s", fn, noun, i, earlier);
        else nbi_error_quoting("%s: %s %d is NULL", fn, noun, i);
        return false;
    }
    if (!nbi_is_tensor(t)) {
        nbi_error("%s: %s %d is not a tensor (a pointer to something else, or to memory long "
                  "freed)", fn, noun, i);
        return false;
    }
    if (!t->freed || nbi_trusted) return true;
    switch ((int)t->freed) {
    case NBI_FREED_BY_FREE:
        nbi_error("%s: %s %d was freed (by nb_free) and cannot be used", fn, noun, i);
        break;
    case NBI_FREED_BY_SCOPE:
        nbi_error("%s: %s %d was freed (by nb_scope_end, as its scope ended; nb_keep hands a "
                  "tensor to the enclosing scope) and cannot be used", fn, noun, i);
        break;
    case NBI_FREED_CLEARED:
        nbi_error("%s: %s %d was freed (a leaf's .grad, dropped by nb_clear_grad or "
                  "nb_optim_clear_grad; take nb_grad again after the next backward) and cannot "
                  "be used", fn, noun, i);
        break;
    default:
        nbi_error("%s: %s %d was freed (with its owner: the leaf whose gradient it was, or "
                  "the registry or optimizer that held it) and cannot be used", fn, noun, i);
    }
    return false;
}

bool nbi_bad_arg(const char *fn, const nb_tensor *t, int i) {
    return nbi_bad_arg_named(fn, "input", t, i);
}

int nb_check_input(const char *fn, const nb_tensor *t, int i) {
    return nbi_arg(fn ? fn : "nb_check_input", t, i) ? 0 : -1;
}

const char *nb_last_error(void) { return has_msg ? msg : NULL; }

void nb_clear_error(void) {
    has_msg = has_cause = false;
    msg[0] = cause[0] = 0;
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
    case NB_BF16: return "bf16";
    }
    return "unknown";
}

bool nbi_check_no_bf16(const char *fn, const nb_tensor *t) {
    if (t->dtype != NB_BF16) return true;
    nbi_error("%s: no bf16 kernel for this op; convert with nb_to(t, NB_F32) first (or keep "
              "the model in f32 and run its products in bf16 under nb_autocast_begin(NB_BF16))",
              fn);
    return false;
}

bool nbi_check_float(const char *fn, const nb_tensor *t) {
    if (nbi_is_float(t->dtype)) return true;
    if (!nbi_check_no_bf16(fn, t)) return false;
    nbi_error("%s: expected a floating tensor (f32 or f64), got %s; convert it with nb_to(t, "
              "NB_F32) (or NB_F64)", fn, nb_dtype_name(t->dtype));
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

/* A variable of the environment nabla could not use: one line on stderr,
 * once (each variable is read once per process), naming the variable, its
 * value and what runs instead. Not an error message: no call failed. */
void nbi_env_warn(const char *fmt, ...) {
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "nabla: %s\n", line);
}
