/* anomaly.c: anomaly detection, as torch.autograd.set_detect_anomaly, plus
 * forward checks.
 *
 * When on, every op that records a node checks its output for NaN or Inf
 * (nbi_record calls nbi_anomaly_forward), and the engine checks every
 * gradient a backward rule returns (run_node calls nbi_anomaly_backward).
 * The first non-finite value fails the op, or nb_backward, with a message
 * naming the op. When the value came in through an input (one made with grad
 * off, or given as data), the message says so instead of blaming the op.
 * The flag is global, as PyTorch's; scanning costs one pass over each
 * output, so it is for debugging. */
#include <math.h>
#include <stdatomic.h>

#include "autograd_internal.h"

static atomic_bool detect_anomaly;

void nb_set_detect_anomaly(bool enabled) { atomic_store(&detect_anomaly, enabled); }
bool nb_detect_anomaly(void) { return atomic_load_explicit(&detect_anomaly, memory_order_relaxed); }

/* The index of the first NaN or Inf among n elements at stride st, or -1.
 * x - x is 0 for finite x and NaN otherwise, so a row is summed without
 * branches and searched only when the sum is not 0. */
#define DEFINE_SCAN(T)                                                            \
    static int64_t scan_##T(const T *p, int64_t st, int64_t n) {                  \
        T acc = 0;                                                                \
        for (int64_t i = 0; i < n; i++) acc += p[i * st] - p[i * st];             \
        if (acc == 0) return -1;                                                  \
        for (int64_t i = 0; i < n; i++)                                           \
            if (!isfinite(p[i * st])) return i;                                   \
        return -1;                                                                \
    }
DEFINE_SCAN(float)
DEFINE_SCAN(double)

/* The row-major index of t's first NaN or Inf, or -1 (any strides). */
static int64_t first_nonfinite(const nb_tensor *t) {
    if (!nbi_is_float(t->dtype) || !t->storage->data || t->numel == 0) return -1;
    const int64_t *st[1] = {t->strides};
    nbi_iter it;
    nbi_iter_init(&it, t->ndim, t->shape, 1, st);
    int64_t inner = NBI_INNER(&it, 0);
    NBI_FOR_ROWS(&it, c) {
        int64_t j = t->dtype == NB_F32
                        ? scan_float((const float *)nbi_ptr(t) + c.off[0], inner, it.n)
                        : scan_double((const double *)nbi_ptr(t) + c.off[0], inner, it.n);
        if (j >= 0) return c.row * it.n + j;
    }
    return -1;
}

static const char *kind(double v) { return isnan(v) ? "NaN" : v > 0 ? "Inf" : "-Inf"; }

bool nbi_anomaly_forward(const char *op, const nb_tensor *out, int n, nb_tensor *const *inputs) {
    if (!nb_detect_anomaly()) return true;
    for (int k = 0; k < n; k++)
        if (inputs[k]->storage == out->storage) return true; /* a view: checked where made */
    int64_t at = first_nonfinite(out);
    if (at < 0) return true;
    for (int k = 0; k < n; k++) {
        int64_t bad = first_nonfinite(inputs[k]);
        if (bad >= 0) {
            nbi_error("%s: anomaly detected: input %d (shape %s) holds %s at element %lld; it "
                      "was made with grad off or given as data, where nothing checks it", op, k,
                      NBI_SHAPE(inputs[k]), kind(nbi_get_flat(inputs[k], bad)), (long long)bad);
            return false;
        }
    }
    nbi_error("%s: anomaly detected: the forward produced %s at element %lld of its output "
              "(shape %s) from finite inputs", op, kind(nbi_get_flat(out, at)), (long long)at,
              NBI_SHAPE(out));
    return false;
}

bool nbi_anomaly_backward(const nbi_node *n, const nb_tensor *g, nb_tensor *const *gin) {
    if (!nb_detect_anomaly()) return true;
    for (int i = 0; i < n->nin; i++) {
        int64_t at = gin[i] ? first_nonfinite(gin[i]) : -1;
        if (at < 0) continue;
        int64_t g_bad = first_nonfinite(g);
        nbi_error("nb_backward: anomaly detected: the backward of %s produced %s at element "
                  "%lld of the gradient of input %d (shape %s); the gradient it received %s",
                  n->op, kind(nbi_get_flat(gin[i], at)), (long long)at, i, NBI_SHAPE(gin[i]),
                  g_bad < 0 ? "was finite" : "already held NaN or Inf");
        return false;
    }
    return true;
}

bool nbi_anomaly_seed(const char *fn, const nb_tensor *grad) {
    if (!nb_detect_anomaly()) return true;
    int64_t at = first_nonfinite(grad);
    if (at < 0) return true;
    nbi_error("%s: anomaly detected: the gradient given holds %s at element %lld", fn,
              kind(nbi_get_flat(grad, at)), (long long)at);
    return false;
}
