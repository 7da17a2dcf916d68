/* loss.c: nb_mse_loss and nb_binary_cross_entropy_with_logits, as
 * torch.nn.functional's, with torch's reductions (nb_reduction).
 *
 * mse_loss is (input - target)^2 of recorded ops, reduced. The logits'
 * binary cross-entropy has one fused elementwise kernel, in the stable form
 * torch uses (aten's binary_cross_entropy_with_logits):
 *   sp(x) = log1p(exp(-|x|)) + max(-x, 0)     (= -log sigmoid(x), no overflow)
 *   l  = (1 - y) x + (1 + (pw - 1) y) sp
 * then weight and the reduction are recorded ops. Its backward and tangent
 * are recorded ops too (sigmoid, and the kernel's sp as a recorded op):
 *   dl/dx = (pw y + 1 - y) sigmoid(x) - pw y
 *   dl/dy = pw sp(x) - sp(-x),  dl/dpw = y sp(x) */
#include "ops_internal.h"

#include <math.h>

/* -------------------------------------------------------------- checks */
static const char *reduction_ok(const char *fn, nb_reduction r) {
    if (r == NB_REDUCTION_MEAN || r == NB_REDUCTION_SUM || r == NB_REDUCTION_NONE) return fn;
    return nbi_error("%s: reduction %d is not NB_REDUCTION_MEAN, _SUM or _NONE", fn, (int)r);
}

/* target: floating, input's dtype and shape */
static bool check_target(const char *fn, const nb_tensor *input, const nb_tensor *target) {
    if (!nbi_check_float(fn, input) || !nbi_check_float(fn, target)) return false;
    if (!nbi_check_same_dtype(fn, input, target)) return false;
    if (!nbi_same_shape(input, target)) {
        nbi_error("%s: target shape %s differs from input shape %s", fn, NBI_SHAPE(target),
                  NBI_SHAPE(input));
        return false;
    }
    return true;
}

/* v NULL, or of input's dtype and broadcasting to input's shape (as torch's
 * weight and pos_weight; the result keeps input's shape) */
static bool check_broadcasts(const char *fn, const char *what, const nb_tensor *v, int i,
                             const nb_tensor *input) {
    if (!v) return true;
    if (!nbi_arg(fn, v, i) || !nbi_check_same_dtype(fn, input, v)) return false;
    bool ok = v->ndim <= input->ndim;
    for (int k = 1; ok && k <= v->ndim; k++) {
        int64_t a = v->shape[v->ndim - k], b = input->shape[input->ndim - k];
        ok = a == b || a == 1;
    }
    if (!ok) {
        nbi_error("%s: %s shape %s does not broadcast to input shape %s", fn, what, NBI_SHAPE(v),
                  NBI_SHAPE(input));
        return false;
    }
    return true;
}

static nb_tensor *reduce(nb_tensor *l, nb_reduction r) {
    return r == NB_REDUCTION_MEAN ? nb_mean_all(l) : r == NB_REDUCTION_SUM ? nb_sum_all(l) : l;
}

/* ---------------------------------------------------------------- mse */
nb_tensor *nb_mse_loss(nb_tensor *input, nb_tensor *target, nb_reduction reduction) {
    const char *fn = "nb_mse_loss";
    if (!nbi_arg(fn, input, 0) || !nbi_arg(fn, target, 1) || !reduction_ok(fn, reduction))
        return NULL;
    if (!check_target(fn, input, target)) return NULL;
    nb_tensor *d = nb_sub(input, target);
    return reduce(nb_mul(d, d), reduction);
}

/* ---------------------------------------------- the elementwise kernel */
/* x, y (S) any strides, pw broadcast to S -> l (S) contiguous; sp_only:
 * x (S) -> sp (S) */
typedef struct {
    nbi_iter it; /* operands: l, x, y, pw */
    nb_dtype dt;
    bool sp_only;
    char *pl;
    const char *px, *py, *pp;
} bce_job;

/* In double for f32 too, rounded once: the two terms of a large |x| and y
 * can overflow f32 with opposite signs (inf - inf = NaN) where the loss
 * itself is only too large for f32 (+inf), e.g. x -1e38, y 1e38. */
#define SOFTPLUS_NEG(x) (log1p(exp(-((x) < 0 ? -(x) : (x)))) + ((x) < 0 ? -(x) : 0.0))
#define BCE_ROWS(T)                                                               \
    NBI_FOR_SPAN(&j->it, lo, hi, c, jb, je) {                                     \
        T *l = (T *)j->pl + c.off[0] + jb;                                        \
        const T *x = (const T *)j->px + c.off[1] + jb * sx;                       \
        if (j->sp_only) {                                                         \
            for (int64_t i = 0; i < je - jb; i++) l[i] = (T)SOFTPLUS_NEG((double)x[i * sx]); \
            continue;                                                             \
        }                                                                         \
        const T *y = (const T *)j->py + c.off[2] + jb * sy;                       \
        const T *pw = (const T *)j->pp + c.off[3] + jb * sp;                      \
        for (int64_t i = 0; i < je - jb; i++) {                                   \
            double xi = x[i * sx], yi = y[i * sy], pi = pw[i * sp];               \
            l[i] = (T)((1 - yi) * xi + (1 + (pi - 1) * yi) * SOFTPLUS_NEG(xi));   \
        }                                                                         \
    }

static void bce_span(void *ctx, int64_t lo, int64_t hi) {
    const bce_job *j = ctx;
    int64_t sx = NBI_INNER(&j->it, 1), sy = NBI_INNER(&j->it, 2), sp = NBI_INNER(&j->it, 3);
    if (j->dt == NB_F32) BCE_ROWS(float)
    else BCE_ROWS(double)
}

/* y, pw NULL: sp of x */
static nb_tensor *bce_kernel(const char *fn, nb_tensor *x, nb_tensor *y, nb_tensor *pw) {
    nb_tensor *l = nbi_new(fn, x->dtype, x->ndim, x->shape, false);
    if (!l) return NULL;
    int64_t pst[NB_MAX_DIMS];
    bool sp_only = !y;
    if (sp_only) y = pw = x; /* read nowhere */
    nbi_broadcast_strides(pw, x->ndim, x->shape, pst);
    const int64_t *st[4] = {l->strides, x->strides, y->strides, pst};
    bce_job j = {.dt = x->dtype, .sp_only = sp_only, .pl = nbi_ptr(l), .px = nbi_ptr(x),
                 .py = nbi_ptr(y), .pp = nbi_ptr(pw)};
    nbi_iter_init(&j.it, x->ndim, x->shape, 4, st);
    nbi_parallel_for(x->numel, NBI_GRAIN_HEAVY, bce_span, &j);
    return l;
}

static nb_tensor *bce_elem(nb_tensor *x, nb_tensor *y, nb_tensor *pw);

/* sp(x) = -log sigmoid(x) = softplus(-x), recorded: sp' = sigmoid(x) - 1 */
static nb_tensor *sp_slope(nb_tensor *x) { return nb_add_scalar(nb_sigmoid(x), -1); }
static int sp_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    return (gin[0] = nb_mul(g, sp_slope(nbi_saved_in(n, 0)))) ? 0 : -1;
}
static nb_tensor *sp_jvp(nbi_node *n, nb_tensor *const *tin) {
    return tin[0] ? nb_mul(tin[0], sp_slope(nbi_saved_in(n, 0))) : nbi_zero_tangent(n);
}
static nb_tensor *softplus_neg(nb_tensor *x) {
    const char *fn = "nb_binary_cross_entropy_with_logits";
    nb_tensor *l = x ? bce_kernel(fn, x, NULL, NULL) : NULL;
    if (!l || !nbi_needs_grad(1, &x)) return l;
    nbi_node *n = nbi_record(l, fn, sp_backward, 1, &x);
    if (!n) return nbi_discard(l);
    nbi_save(n, NBI_SAVE_IN(0));
    n->jvp = sp_jvp;
    return l;
}

/* the partial derivatives of l in x, y, pw (recorded ops; NULL: not wanted),
 * in torch's order: dl/dx = (pw y + 1 - y) sigmoid(x) - pw y */
static int bce_partials(nbi_node *n, bool want[3], nb_tensor *p[3]) {
    nb_tensor *x = nbi_saved_in(n, 0), *y = nbi_saved_in(n, 1), *pw = nbi_saved_in(n, 2);
    if (!x || !y || !pw) return -1;
    nb_tensor *sp = want[1] || want[2] ? softplus_neg(x) : NULL;
    if (want[0]) {
        nb_tensor *t = nb_mul(pw, y);
        p[0] = nb_sub(nb_mul(nb_sub(nb_add_scalar(t, 1), y), nb_sigmoid(x)), t);
        if (!p[0]) return -1;
    }
    /* (pw - 1) sp(x) - x = pw sp(x) - sp(-x): no cancellation of large terms */
    if (want[1] && !(p[1] = nb_sub(nb_mul(pw, sp), softplus_neg(nb_neg(x))))) return -1;
    if (want[2] && !(p[2] = nb_mul(y, sp))) return -1;
    return 0;
}

/* gin[i] = g dl/di, pw's summed back to its shape */
static int bce_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    bool want[3] = {nbi_wants(n, 0), nbi_wants(n, 1), nbi_wants(n, 2)};
    nb_tensor *p[3] = {0};
    if (bce_partials(n, want, p) != 0) return -1;
    for (int k = 0; k < 3; k++) {
        if (!want[k]) continue;
        nb_tensor *gk = nb_mul(g, p[k]);
        if (k == 2) gk = nbi_sum_to(gk, n->in[2]->ndim, n->in[2]->shape);
        if (!(gin[k] = gk)) return -1;
    }
    return 0;
}

static nb_tensor *bce_jvp(nbi_node *n, nb_tensor *const *tin) {
    bool want[3] = {tin[0] != NULL, tin[1] != NULL, tin[2] != NULL};
    nb_tensor *p[3] = {0};
    if (bce_partials(n, want, p) != 0) return NULL;
    nb_tensor *t = nbi_zero_tangent(n);
    for (int k = 0; k < 3; k++)
        if (want[k]) t = nb_add(t, nb_mul(tin[k], p[k]));
    return t;
}

/* x, y (S), pw broadcasting to S -> l (S), recorded */
static nb_tensor *bce_elem(nb_tensor *x, nb_tensor *y, nb_tensor *pw) {
    const char *fn = "nb_binary_cross_entropy_with_logits";
    if (!x || !y || !pw) return NULL;
    nb_tensor *l = bce_kernel(fn, x, y, pw);
    nb_tensor *ins[3] = {x, y, pw};
    if (!l || !nbi_needs_grad(3, ins)) return l;
    nbi_node *n = nbi_record(l, fn, bce_backward, 3, ins);
    if (!n) return nbi_discard(l);
    nbi_save(n, NBI_SAVE_IN(0) | NBI_SAVE_IN(1) | NBI_SAVE_IN(2));
    n->jvp = bce_jvp;
    return l;
}

nb_tensor *nb_binary_cross_entropy_with_logits(nb_tensor *input, nb_tensor *target,
                                               nb_tensor *weight, nb_tensor *pos_weight,
                                               nb_reduction reduction) {
    const char *fn = "nb_binary_cross_entropy_with_logits";
    if (!nbi_arg(fn, input, 0) || !nbi_arg(fn, target, 1) || !nbi_opt_arg(fn, weight, 2) ||
        !nbi_opt_arg(fn, pos_weight, 3) || !reduction_ok(fn, reduction))
        return NULL;
    if (!check_target(fn, input, target) || !check_broadcasts(fn, "weight", weight, 2, input) ||
        !check_broadcasts(fn, "pos_weight", pos_weight, 3, input))
        return NULL;
    nb_tensor *l = bce_elem(input, target, pos_weight ? pos_weight : nb_scalar(input->dtype, 1));
    if (weight) l = nb_mul(l, weight);
    return reduce(l, reduction);
}
