/* softmax.c: nb_softmax and nb_log_softmax over any dim, with their
 * backward rules as dedicated kernels.
 *
 * Both are numerically stable: the slice max m is subtracted before exp, so
 * exp never overflows (softmax(x) = exp(x - m) / sum exp(x - m), and
 * log_softmax(x) = (x - m) - log(sum exp(x - m))).
 *
 * Convention (DESIGN.md section 6): a slice that is entirely -inf (an
 * attention row whose keys are all masked) gives zeros, not NaN, for both
 * softmax and log_softmax, and passes zero gradient. PyTorch gives NaN there.
 * Any slice with at least one finite value is exactly PyTorch's result.
 *
 * The input is read in place with any strides (transposed, expanded); the
 * output is a new contiguous tensor. Row sums accumulate in the tensor's own
 * type (float for f32, as PyTorch's CPU kernels do; double for f64). */
#include "ops_internal.h"

#include <math.h>

/* ------------------------------------------------------ slice iteration */
/* The slices along `dim` of a tensor of shape (ndim, shape): every position
 * of the other dims starts one slice of `len` elements. Operand k's slice
 * starts at the offset the iterator yields and steps by step[k]. */
typedef struct slices {
    nbi_iter it;          /* over the shape with shape[dim] set to 1 */
    int64_t len;          /* shape[dim] (1 for a 0-d tensor) */
    int64_t step[3];      /* stride along dim of each operand */
    int64_t numel;
} slices;

static void slices_init(slices *s, int ndim, const int64_t *shape, int dim, int nops,
                        const int64_t *const *strides) {
    int64_t outer[NB_MAX_DIMS];
    for (int i = 0; i < ndim; i++) outer[i] = shape[i];
    s->len = 1;
    for (int k = 0; k < nops; k++) s->step[k] = 0;
    if (ndim > 0) {
        s->len = shape[dim];
        outer[dim] = 1;
        for (int k = 0; k < nops; k++) s->step[k] = strides[k][dim];
    }
    s->numel = nbi_shape_numel(ndim, shape);
    nbi_iter_init(&s->it, ndim, outer, nops, strides);
}

/* Runs BODY once per slice with o0, o1, o2 = the slice's first element
 * offset in each operand (relative to nbi_ptr of that operand). */
#define FOR_SLICES(s, BODY)                                                      \
    do {                                                                         \
        if ((s)->numel == 0) break;                                              \
        const nbi_iter *it_ = &(s)->it;                                          \
        int64_t in0_ = NBI_INNER(it_, 0), in1_ = NBI_INNER(it_, 1);              \
        int64_t in2_ = it_->nops > 2 ? NBI_INNER(it_, 2) : 0;                    \
        NBI_FOR_ROWS(it_, c_) {                                                  \
            for (int64_t j_ = 0; j_ < it_->n; j_++) {                            \
                int64_t o0 = c_.off[0] + j_ * in0_, o1 = c_.off[1] + j_ * in1_; \
                int64_t o2 = it_->nops > 2 ? c_.off[2] + j_ * in2_ : 0;          \
                (void)o2;                                                        \
                BODY                                                             \
            }                                                                    \
        }                                                                        \
    } while (0)

/* --------------------------------------------------------------- kernels */
/* Forward, one slice: x (len, stride sx) -> y (len, stride sy).
 * log_mode: y = (x - m) - log(sum exp(x - m)); else y = exp(x - m) / sum. */
#define DEFINE_FORWARD(T, EXP, LOG)                                              \
    static void forward_slice_##T(const T *x, int64_t sx, T *y, int64_t sy,     \
                                  int64_t len, bool log_mode) {                  \
        T m = -(T)INFINITY;                                                      \
        for (int64_t k = 0; k < len; k++) {                                      \
            T v = x[k * sx];                                                     \
            if (v > m || v != v) m = v;                                          \
            if (m != m) break; /* NaN propagates to the whole slice */           \
        }                                                                        \
        if (m == -(T)INFINITY) { /* all -inf: zeros by convention */             \
            for (int64_t k = 0; k < len; k++) y[k * sy] = 0;                     \
            return;                                                              \
        }                                                                        \
        T sum = 0;                                                               \
        if (log_mode) {                                                          \
            for (int64_t k = 0; k < len; k++) sum += EXP(x[k * sx] - m);         \
            T lse = LOG(sum);                                                    \
            for (int64_t k = 0; k < len; k++) y[k * sy] = (x[k * sx] - m) - lse; \
        } else {                                                                 \
            for (int64_t k = 0; k < len; k++) {                                  \
                T e = EXP(x[k * sx] - m);                                        \
                y[k * sy] = e;                                                   \
                sum += e;                                                        \
            }                                                                    \
            for (int64_t k = 0; k < len; k++) y[k * sy] /= sum;                  \
        }                                                                        \
    }
DEFINE_FORWARD(float, expf, logf)
DEFINE_FORWARD(double, exp, log)

/* Backward, one slice: y (saved output), g (upstream) -> gi.
 *   softmax:     gi = y * (g - sum(g * y))
 *   log_softmax: gi = g - exp(y) * sum(g)
 * A slice of y that is all zeros comes from an all -inf input slice (a
 * softmax slice sums to 1; a log_softmax slice of len > 1 cannot be all 0,
 * since then sum exp(y) = len != 1, and for len == 1 the rule gives 0
 * anyway): it gets exact zeros, whatever g holds. */
#define DEFINE_BACKWARD(T, EXP)                                                  \
    static void backward_slice_##T(const T *y, int64_t sy, const T *g,          \
                                   int64_t sg, T *gi, int64_t si, int64_t len,   \
                                   bool log_mode) {                              \
        T sum = 0;                                                               \
        bool any = false;                                                        \
        for (int64_t k = 0; k < len; k++) {                                      \
            T yk = y[k * sy];                                                    \
            any |= yk != 0;                                                      \
            sum += log_mode ? g[k * sg] : g[k * sg] * yk;                        \
        }                                                                        \
        if (!any) {                                                              \
            for (int64_t k = 0; k < len; k++) gi[k * si] = 0;                    \
            return;                                                              \
        }                                                                        \
        if (log_mode) {                                                          \
            for (int64_t k = 0; k < len; k++)                                    \
                gi[k * si] = g[k * sg] - EXP(y[k * sy]) * sum;                   \
        } else {                                                                 \
            for (int64_t k = 0; k < len; k++)                                    \
                gi[k * si] = y[k * sy] * (g[k * sg] - sum);                      \
        }                                                                        \
    }
DEFINE_BACKWARD(float, expf)
DEFINE_BACKWARD(double, exp)

/* ------------------------------------------------------------- backward */
/* y (S) saved output, g (S) any strides -> gin (S) contiguous; node->i[0] =
 * dim (normalized), node->i[1] = log_mode. */
static int softmax_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    const nb_tensor *y = n->out;
    int dim = (int)n->i[0];
    bool log_mode = n->i[1] != 0;
    if (!nbi_wants(n, 0)) return 0;
    nb_tensor *gi = nbi_new(n->op, y->dtype, y->ndim, y->shape, false);
    if (!gi) return -1;
    if (g->dtype != y->dtype) {
        nbi_discard(gi);
        return (nbi_error("%s: backward got a %s gradient for a %s output", n->op,
                          nb_dtype_name(g->dtype), nb_dtype_name(y->dtype)), -1);
    }
    const int64_t *st[3] = {y->strides, g->strides, gi->strides};
    slices s;
    slices_init(&s, y->ndim, y->shape, dim, 3, st);
    if (y->dtype == NB_F32) {
        const float *py = nbi_ptr(y), *pg = nbi_ptr(g);
        float *pi = nbi_ptr(gi);
        FOR_SLICES(&s, backward_slice_float(py + o0, s.step[0], pg + o1, s.step[1], pi + o2,
                                            s.step[2], s.len, log_mode););
    } else {
        const double *py = nbi_ptr(y), *pg = nbi_ptr(g);
        double *pi = nbi_ptr(gi);
        FOR_SLICES(&s, backward_slice_double(py + o0, s.step[0], pg + o1, s.step[1], pi + o2,
                                             s.step[2], s.len, log_mode););
    }
    gin[0] = gi;
    return 0;
}

/* -------------------------------------------------------------- forward */
/* t (S) any strides, dim in S -> y (S) contiguous. */
static nb_tensor *softmax_common(const char *fn, nb_tensor *t, int dim, bool log_mode) {
    if (!t) return nbi_null_input(fn);
    if (!nbi_check_float(fn, t)) return NULL;
    int d = nbi_dim(fn, dim, t->ndim);
    if (d < 0) return NULL;
    nb_tensor *y = nbi_new(fn, t->dtype, t->ndim, t->shape, false);
    if (!y) return NULL;
    const int64_t *st[2] = {t->strides, y->strides};
    slices s;
    slices_init(&s, t->ndim, t->shape, d, 2, st);
    if (t->dtype == NB_F32) {
        const float *px = nbi_ptr(t);
        float *py = nbi_ptr(y);
        FOR_SLICES(&s, forward_slice_float(px + o0, s.step[0], py + o1, s.step[1], s.len,
                                           log_mode););
    } else {
        const double *px = nbi_ptr(t);
        double *py = nbi_ptr(y);
        FOR_SLICES(&s, forward_slice_double(px + o0, s.step[0], py + o1, s.step[1], s.len,
                                            log_mode););
    }
    if (nbi_needs_grad(1, &t)) {
        nbi_node *node = nbi_record(y, fn, softmax_backward, 1, &t);
        if (!node) return nbi_discard(y);
        node->saved = NBI_SAVE_OUT; /* backward reads only the output */
        node->i[0] = d;
        node->i[1] = log_mode;
    }
    return y;
}

nb_tensor *nb_softmax(nb_tensor *t, int dim) {
    return softmax_common("nb_softmax", t, dim, false);
}

nb_tensor *nb_log_softmax(nb_tensor *t, int dim) {
    return softmax_common("nb_log_softmax", t, dim, true);
}
