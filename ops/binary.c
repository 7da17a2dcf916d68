/* binary.c: nb_add, nb_sub, nb_mul, nb_div with broadcasting, their
 * backward rules, and the gradient kernels other ops' rules share. */
#include "ops_internal.h"
#include "elementwise_internal.h"

#include <math.h>

/* a (...), b (...) broadcast -> out (broadcast shape); any strides.
 * One job, cut into element ranges run on the thread pool. */
typedef struct {
    nbi_binop op;
    nb_dtype dt;
    nbi_iter it;
    char *po;
    const char *pa, *pb;
} binary_job;

#define ROWS2(T, EXPR)                                                                   \
    NBI_FOR_SPAN(&j->it, lo, hi, c, jb, je) {                                            \
        T *o = (T *)j->po + c.off[0] + jb * so;                                          \
        const T *xa = (const T *)j->pa + c.off[1] + jb * sa;                             \
        const T *xb = (const T *)j->pb + c.off[2] + jb * sb;                             \
        int64_t len = je - jb;                                                           \
        if (so == 1 && sa == 1 && sb == 1) {                                             \
            for (int64_t i = 0; i < len; i++) {                                          \
                T x = xa[i], y = xb[i];                                                  \
                o[i] = (EXPR);                                                           \
            }                                                                            \
        } else {                                                                         \
            for (int64_t i = 0; i < len; i++) {                                          \
                T x = xa[i * sa], y = xb[i * sb];                                        \
                o[i * so] = (EXPR);                                                      \
            }                                                                            \
        }                                                                                \
    }

#define BINARY_CASES(T, ERF)                                                  \
    switch (j->op) {                                                          \
    case NBI_add: ROWS2(T, x + y); break;                                     \
    case NBI_sub: ROWS2(T, x - y); break;                                     \
    case NBI_mul: ROWS2(T, x * y); break;                                     \
    case NBI_div: ROWS2(T, x / y); break;                                     \
    case NBI_RELU_GRAD: ROWS2(T, y <= 0 ? 0 : x); break;                      \
    case NBI_TANH_GRAD: ROWS2(T, x * (1 - y * y)); break;                     \
    case NBI_GELU_GRAD:                                                       \
        ROWS2(T, x * ((T)0.5 * (1 + ERF(y * (T)0.70710678118654752440)) +    \
                      y * (T)0.39894228040143267794 * (T)exp(-(double)(y * y) / 2))); \
        break;                                                                \
    }

#define BINOP_CHEAP(name, inputs, flags, call) [NBI_##name] = ((flags) & NB_OP_CHEAP) != 0,
static const bool binop_cheap[] = {NB_OPS_BINARY(BINOP_CHEAP)[NBI_RELU_GRAD] = true,
                                   [NBI_TANH_GRAD] = false, [NBI_GELU_GRAD] = false};

static void binary_span(void *ctx, int64_t lo, int64_t hi) {
    const binary_job *j = ctx;
    int64_t so = NBI_INNER(&j->it, 0), sa = NBI_INNER(&j->it, 1), sb = NBI_INNER(&j->it, 2);
    if (j->dt == NB_F32) BINARY_CASES(float, erff)
    else BINARY_CASES(double, erf)
}

/* out = a op b over out's shape; a and b are read broadcast, out may alias a
 * when they have the same geometry. */
void nbi_binary_into(nbi_binop op, nb_tensor *out, const nb_tensor *a, const nb_tensor *b) {
    int64_t sta[NB_MAX_DIMS], stb[NB_MAX_DIMS];
    nbi_broadcast_strides(a, out->ndim, out->shape, sta);
    nbi_broadcast_strides(b, out->ndim, out->shape, stb);
    const int64_t *st[3] = {out->strides, sta, stb};
    binary_job j = {.op = op, .dt = out->dtype, .po = nbi_ptr(out), .pa = nbi_ptr(a),
                    .pb = nbi_ptr(b)};
    nbi_iter_init(&j.it, out->ndim, out->shape, 3, st);
    int64_t grain = binop_cheap[op] ? NBI_GRAIN : NBI_GRAIN_HEAVY;
    nbi_parallel_for(out->numel, grain, binary_span, &j);
}

nb_tensor *nbi_binary(const char *fn, nbi_binop op, nb_tensor *a, nb_tensor *b) {
    if (!nbi_arg(fn, a, 0) || !nbi_arg(fn, b, 1)) return NULL;
    if (!nbi_check_float(fn, a) || !nbi_check_float(fn, b) || !nbi_check_same_dtype(fn, a, b))
        return NULL;
    int nd;
    int64_t sh[NB_MAX_DIMS];
    if (!nbi_broadcast_shape(fn, a->ndim, a->shape, b->ndim, b->shape, &nd, sh)) return NULL;
    nb_tensor *y = nbi_new(fn, a->dtype, nd, sh, false);
    if (y) nbi_binary_into(op, y, a, b);
    return y;
}

/* Each rule reduces its gradients back over broadcast dims. */
static nb_tensor *to_input(nbi_node *n, int i, nb_tensor *g) {
    return nbi_sum_to(g, n->in[i]->ndim, n->in[i]->shape);
}

static int add_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    if (nbi_wants(n, 0) && !(gin[0] = to_input(n, 0, g))) return -1;
    if (nbi_wants(n, 1) && !(gin[1] = to_input(n, 1, g))) return -1;
    return 0;
}

static int sub_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    if (nbi_wants(n, 0) && !(gin[0] = to_input(n, 0, g))) return -1;
    if (nbi_wants(n, 1) && !(gin[1] = to_input(n, 1, nb_neg(g)))) return -1;
    return 0;
}

static int mul_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    if (nbi_wants(n, 0) && !(gin[0] = to_input(n, 0, nb_mul(g, nbi_saved_in(n, 1))))) return -1;
    if (nbi_wants(n, 1) && !(gin[1] = to_input(n, 1, nb_mul(g, nbi_saved_in(n, 0))))) return -1;
    return 0;
}

/* d(a/b)/da = 1/b, d(a/b)/db = -a/b^2 = -g * ((a/b)/b), PyTorch's order:
 * (g/b) * (a/b) would overflow g/b for a tiny b and give inf * 0 = NaN where
 * a = 0, whose true gradient (and PyTorch's) is 0. */
static int div_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    nb_tensor *b = nbi_saved_in(n, 1);
    if (nbi_wants(n, 0) && !(gin[0] = to_input(n, 0, nb_div(g, b)))) return -1;
    if (nbi_wants(n, 1) &&
        !(gin[1] = to_input(n, 1, nb_neg(nb_mul(g, nb_div(nbi_saved_out(n), b))))))
        return -1;
    return 0;
}

static nb_tensor *binary_op(const char *fn, nbi_binop op, nbi_backward_fn bw, uint32_t saved,
                            nb_tensor *a, nb_tensor *b) {
    nb_tensor *y = nbi_binary(fn, op, a, b);
    nb_tensor *in[2] = {a, b};
    if (!y || !nbi_needs_grad(2, in)) return y;
    nbi_node *n = nbi_record(y, fn, bw, 2, in);
    if (!n) return nbi_discard(y);
    nbi_save(n, saved);
    return y;
}

nb_tensor *nb_add(nb_tensor *a, nb_tensor *b) {
    return binary_op("nb_add", NBI_add, add_backward, 0, a, b);
}
nb_tensor *nb_sub(nb_tensor *a, nb_tensor *b) {
    return binary_op("nb_sub", NBI_sub, sub_backward, 0, a, b);
}
nb_tensor *nb_mul(nb_tensor *a, nb_tensor *b) {
    return binary_op("nb_mul", NBI_mul, mul_backward, NBI_SAVE_IN(0) | NBI_SAVE_IN(1), a, b);
}
nb_tensor *nb_div(nb_tensor *a, nb_tensor *b) {
    return binary_op("nb_div", NBI_div, div_backward, NBI_SAVE_IN(1) | NBI_SAVE_OUT, a, b);
}
