/* binary.c: nb_add, nb_sub, nb_mul, nb_div, nb_minimum, nb_maximum with
 * broadcasting, their backward rules, and the gradient kernels other ops' rules share. */
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

/* aten's GeluKernel.cpp, tanh form: beta = sqrt(2/pi) */
#define GELU_TANH_BETA 0.79788456080286535588
#define GELU_TANH_KAPPA 0.044715

/* x's share of the gradient of maximum/minimum (PyTorch 1.13's formulas):
 * half at a tie; NaN on either side gives both inputs the whole gradient. */
#define MAX_SHARE(T, x, y) ((x) == (y) ? (T)0.5 : (x) < (y) ? (T)0 : (T)1)
#define MIN_SHARE(T, x, y) ((x) == (y) ? (T)0.5 : (x) > (y) ? (T)0 : (T)1)

#define BINARY_CASES(T, ERF, EXP, TANH)                                       \
    switch (j->op) {                                                          \
    /* NaN propagates. At a tie (-0 against +0) a, as torch's scalar loop  \
     * (std::min/max); its vector loop gives b, so which zero torch returns \
     * depends on where the element falls in its loop: no NB_OP_EXACT. */  \
    case NBI_minimum: ROWS2(T, x != x ? x : y != y ? y : y < x ? y : x); break; \
    case NBI_maximum: ROWS2(T, x != x ? x : y != y ? y : x < y ? y : x); break; \
    case NBI_SIGMOID_GRAD: ROWS2(T, x * (1 - y) * y); break;                  \
    case NBI_SILU_GRAD: {                                                     \
        /* torch's silu_backward: g * s * (1 + x (1 - s)), s = sigmoid(x) */  \
        ROWS2(T, x * (1 / (1 + EXP(-y))) * (1 + y * (1 - 1 / (1 + EXP(-y))))); \
        break;                                                                \
    }                                                                         \
    case NBI_ABS_GRAD: ROWS2(T, x * (T)(y > 0 ? 1 : y < 0 ? -1 : 0)); break; /* g * sgn */ \
    case NBI_GELU_TANH_GRAD: ROWS2(T, x * gelu_tanh_grad_##T(y)); break;      \
    case NBI_MAX_SHARE: ROWS2(T, MAX_SHARE(T, x, y)); break;                  \
    case NBI_MIN_SHARE: ROWS2(T, MIN_SHARE(T, x, y)); break;                  \
    case NBI_SHARE_GRAD: ROWS2(T, y == 0 ? 0 : y == 1 ? x : x * y); break;    \
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
                                   [NBI_TANH_GRAD] = false, [NBI_GELU_GRAD] = false,
                                   [NBI_SIGMOID_GRAD] = true, [NBI_SILU_GRAD] = false,
                                   [NBI_ABS_GRAD] = true, [NBI_GELU_TANH_GRAD] = false,
                                   [NBI_MAX_SHARE] = true, [NBI_MIN_SHARE] = true,
                                   [NBI_SHARE_GRAD] = true};

/* d/dx of 0.5 x (1 + tanh(u)), u = beta (x + kappa x^3), in aten's order:
 * 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) beta (1 + 3 kappa x^2) */
#define GELU_TANH_GRAD_FN(T, TANH)                                                    \
    static inline T gelu_tanh_grad_##T(T x) {                                         \
        T x_sq = x * x, x_cube = x_sq * x;                                            \
        T th = TANH((T)GELU_TANH_BETA * (x + (T)GELU_TANH_KAPPA * x_cube));           \
        T left = (T)0.5 * x, right = 1 + th;                                          \
        T right_d = left * (1 - th * th) * (T)GELU_TANH_BETA *                        \
                    (1 + 3 * (T)GELU_TANH_KAPPA * x_sq);                              \
        return (T)0.5 * right + right_d;                                              \
    }
GELU_TANH_GRAD_FN(float, tanhf)
GELU_TANH_GRAD_FN(double, tanh)

NBI_CLONES static void binary_span(void *ctx, int64_t lo, int64_t hi) {
    const binary_job *j = ctx;
    int64_t so = NBI_INNER(&j->it, 0), sa = NBI_INNER(&j->it, 1), sb = NBI_INNER(&j->it, 2);
    if (j->dt == NB_F32) BINARY_CASES(float, erff, expf, tanhf)
    else BINARY_CASES(double, erf, exp, tanh)
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

/* The fused NBI_SHARE_GRAD, or the same values recorded */
nb_tensor *nbi_weighted(const char *fn, nb_tensor *g, nb_tensor *w) {
    if (!g || !nbi_needs_grad(1, &g)) return nbi_binary(fn, NBI_SHARE_GRAD, g, w);
    nb_tensor *zero = nb_scalar(g->dtype, 0);
    return nb_where(nb_eq(w, zero), zero, nb_mul(g, w));
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

/* Input i's share (MAX_SHARE, MIN_SHARE) of maximum's or minimum's
 * gradient, of the output's shape: a constant (ties and NaN decide it).
 * i[0] = the op (NBI_maximum or NBI_minimum). */
static nb_tensor *share_of(nbi_node *n, int i) {
    nbi_binop share = n->i[0] == NBI_maximum ? NBI_MAX_SHARE : NBI_MIN_SHARE;
    nb_tensor *a = nbi_saved_in(n, 0), *b = nbi_saved_in(n, 1);
    return i == 0 ? nbi_binary(n->op, share, a, b) : nbi_binary(n->op, share, b, a);
}

/* Each input gets g times its share, summed back. */
static int extremum_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    for (int i = 0; i < 2; i++)
        if (nbi_wants(n, i) && !(gin[i] = to_input(n, i, nbi_weighted(n->op, g, share_of(n, i)))))
            return -1;
    return 0;
}

/* ---------------------------------------------------------- tangent rules */
/* Each gets the inputs' tangents ta, tb (NULL: zero, not both) and returns
 * the output's, of the output's shape. */

/* ta + tb, broadcast to the output's shape */
static nb_tensor *tangent_sum(nbi_node *n, nb_tensor *ta, nb_tensor *tb) {
    if (ta && tb) return nb_add(ta, tb);
    return nb_expand(ta ? ta : tb, n->out->ndim, n->out->shape);
}

static nb_tensor *add_jvp(nbi_node *n, nb_tensor *const *t) {
    return tangent_sum(n, t[0], t[1]);
}
static nb_tensor *sub_jvp(nbi_node *n, nb_tensor *const *t) {
    if (t[0] && t[1]) return nb_sub(t[0], t[1]);
    return tangent_sum(n, t[0], t[1] ? nb_neg(t[1]) : NULL);
}
/* ta b + a tb */
static nb_tensor *mul_jvp(nbi_node *n, nb_tensor *const *t) {
    nb_tensor *x = t[0] ? nb_mul(t[0], nbi_saved_in(n, 1)) : NULL;
    nb_tensor *y = t[1] ? nb_mul(nbi_saved_in(n, 0), t[1]) : NULL;
    if ((t[0] && !x) || (t[1] && !y)) return NULL;
    return tangent_sum(n, x, y);
}
/* (ta - tb (a/b)) / b, PyTorch's formula */
static nb_tensor *div_jvp(nbi_node *n, nb_tensor *const *t) {
    nb_tensor *num = t[0];
    if (t[1]) {
        nb_tensor *d = nb_mul(t[1], nbi_saved_out(n));
        num = t[0] ? nb_sub(t[0], d) : nb_neg(d);
    }
    return nb_div(num, nbi_saved_in(n, 1));
}
/* ta share_a + tb share_b: the transpose of extremum_backward */
static nb_tensor *extremum_jvp(nbi_node *n, nb_tensor *const *t) {
    nb_tensor *x[2] = {NULL, NULL};
    for (int i = 0; i < 2; i++)
        if (t[i] && !(x[i] = nbi_weighted(n->op, t[i], share_of(n, i)))) return NULL;
    return tangent_sum(n, x[0], x[1]);
}

static nb_tensor *binary_op(const char *fn, nbi_binop op, nbi_backward_fn bw, nbi_jvp_fn jvp,
                            uint32_t saved, nb_tensor *a, nb_tensor *b) {
    nb_tensor *y = nbi_binary(fn, op, a, b);
    nb_tensor *in[2] = {a, b};
    if (!y || !nbi_needs_grad(2, in)) return y;
    nbi_node *n = nbi_record(y, fn, bw, 2, in);
    if (!n) return nbi_discard(y);
    nbi_save(n, saved);
    n->i[0] = op; /* for the rules minimum and maximum share */
    n->jvp = jvp;
    return y;
}

nb_tensor *nb_add(nb_tensor *a, nb_tensor *b) {
    return binary_op("nb_add", NBI_add, add_backward, add_jvp, 0, a, b);
}
nb_tensor *nb_sub(nb_tensor *a, nb_tensor *b) {
    return binary_op("nb_sub", NBI_sub, sub_backward, sub_jvp, 0, a, b);
}
nb_tensor *nb_mul(nb_tensor *a, nb_tensor *b) {
    return binary_op("nb_mul", NBI_mul, mul_backward, mul_jvp, NBI_SAVE_IN(0) | NBI_SAVE_IN(1), a,
                     b);
}
nb_tensor *nb_div(nb_tensor *a, nb_tensor *b) {
    return binary_op("nb_div", NBI_div, div_backward, div_jvp, NBI_SAVE_IN(1) | NBI_SAVE_OUT, a,
                     b);
}
nb_tensor *nb_minimum(nb_tensor *a, nb_tensor *b) {
    return binary_op("nb_minimum", NBI_minimum, extremum_backward, extremum_jvp,
                     NBI_SAVE_IN(0) | NBI_SAVE_IN(1), a, b);
}
nb_tensor *nb_maximum(nb_tensor *a, nb_tensor *b) {
    return binary_op("nb_maximum", NBI_maximum, extremum_backward, extremum_jvp,
                     NBI_SAVE_IN(0) | NBI_SAVE_IN(1), a, b);
}
