/* elementwise.c: one-input ops (neg exp log sqrt tanh relu gelu sigmoid silu
 * abs gelu_tanh sin cos, and the ones with scalars: pow, add, mul, clamp), forward
 * kernels and backward rules.
 *
 * In f32, exp, tanh, sigmoid, silu, gelu and gelu_tanh, and the derivatives
 * of silu, gelu and gelu_tanh, are the vectorized functions of ops/vmath.h
 * (within 2 ulp of the correctly rounded result, the same bits for a value
 * wherever it sits in the tensor); f64 calls libm. */
#include "ops_internal.h"
#include "elementwise_internal.h"
#include "registry.h"
#include "vmath.h"
#include "../tensor/cpu_internal.h"

#include <math.h>
#include <stdatomic.h>

/* ------------------------------------------------- vmath's instruction set */
static _Atomic int vmath_path = NBV_AUTO;

static int vmath_detect(void) {
#if NBV_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return NBV_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return NBV_AVX2;
#elif NBV_ARM
    if (nbi_isa() >= NBI_ISA_NEON) return NBV_NEON;
#endif
    return NBV_PORTABLE;
}

int nbi_vmath_path(int force) {
    int best = vmath_detect();
    int p = force == NBV_AUTO || force > best ? best : force < 0 ? NBV_PORTABLE : force;
    atomic_store_explicit(&vmath_path, p, memory_order_relaxed);
    return p;
}

int nbi_vmath_current(void) {
    int p = atomic_load_explicit(&vmath_path, memory_order_relaxed);
    if (p < 0) {
        p = vmath_detect();
        atomic_store_explicit(&vmath_path, p, memory_order_relaxed);
    }
    return p;
}

/* U_neg, U_exp, ...: the ops of NB_OPS_ELEMENTWISE, in its order */
#define UNOP_ENUM(name, inputs, flags, call) U_##name,
typedef enum { NB_OPS_ELEMENTWISE(UNOP_ENUM) } unop;
#define UNOP_FLAGS(name, inputs, flags, call) [U_##name] = (flags),
static const unsigned unop_flags[] = {NB_OPS_ELEMENTWISE(UNOP_FLAGS)};

/* x (...) any strides -> y (...) contiguous; s, s1 are the scalar arguments
 * (clamp's lo and hi, the others' one scalar in s). Element ranges run on the
 * thread pool. */
typedef struct {
    unop op;
    nb_dtype dt;
    double s, s1;
    bool lowp; /* gelu_tanh in a bf16 autocast region: float-evaluated (gelu_tanh_lowp) */
    nbi_iter it;
    char *po;
    const char *px;
} unary_job;

#define ROWS1(T, EXPR)                                             \
    NBI_FOR_SPAN(&j->it, lo, hi, c, jb, je) {                      \
        T *o = (T *)j->po + c.off[0] + jb;                         \
        const T *in = (const T *)j->px + c.off[1] + jb * sx;       \
        int64_t len = je - jb;                                     \
        if (sx == 1) {                                             \
            for (int64_t i = 0; i < len; i++) {                    \
                T x = in[i];                                       \
                o[i] = (EXPR);                                     \
            }                                                      \
        } else {                                                   \
            for (int64_t i = 0; i < len; i++) {                    \
                T x = in[i * sx];                                  \
                o[i] = (EXPR);                                     \
            }                                                      \
        }                                                          \
    }

/* GELU's tanh form (aten's GeluKernel.cpp): beta = sqrt(2/pi) */
#define GELU_TANH_BETA 0.79788456080286535588
#define GELU_TANH_KAPPA 0.044715
/* max(x, lo) as std::max: x when equal (keeps -0 against a +0 bound) and NaN */
#define CLAMP_LO(x, lo) ((x) < (lo) ? (lo) : (x))

#define UNARY_CASES(T, EXP, LOG, SQRT, TANH, ERF, POW, SIN, COS)                  \
    switch (j->op) {                                                          \
    case U_neg: ROWS1(T, -x); break;                                          \
    case U_exp: ROWS1(T, EXP(x)); break;                                      \
    case U_log: ROWS1(T, LOG(x)); break;                                      \
    case U_sqrt: ROWS1(T, SQRT(x)); break;                                    \
    case U_tanh: ROWS1(T, TANH(x)); break;                                    \
    case U_relu: ROWS1(T, x < 0 ? 0 : x); break; /* NaN, -0 stay (as torch) */ \
    case U_gelu: ROWS1(T, (T)0.5 * x * (1 + ERF(x * (T)0.70710678118654752440))); break; \
    case U_pow_scalar: /* PyTorch's paths, see pow_path */                         \
        switch (pow_path(s)) {                                                        \
        case P_SQRT: ROWS1(T, SQRT(x)); break;                                        \
        case P_RSQRT: ROWS1(T, 1 / SQRT(x)); break;                                   \
        case P_RECIP: ROWS1(T, 1 / x); break;                                         \
        case P_SQUARE: ROWS1(T, x * x); break;                                        \
        case P_CUBE: ROWS1(T, x * x * x); break;                                      \
        case P_RECIP_SQUARE: ROWS1(T, 1 / (x * x)); break;                            \
        case P_POW: ROWS1(T, POW(x, (T)s)); break;                                    \
        }                                                                             \
        break;                                                                        \
    case U_add_scalar: ROWS1(T, x + (T)s); break;                                    \
    case U_mul_scalar: ROWS1(T, x * (T)s); break;                                    \
    case U_sigmoid: ROWS1(T, 1 / (1 + EXP(-x))); break; /* torch's formula */         \
    case U_silu: ROWS1(T, x / (1 + EXP(-x))); break;                                 \
    case U_abs: ROWS1(T, x < 0 ? -x : x == 0 ? 0 : x); break; /* |-0| = +0, NaN stays */ \
    case U_clamp: /* min(max(x, lo), hi) as torch: NaN and -0 stay, lo > hi gives hi */ \
        ROWS1(T, CLAMP_LO(x, (T)s) > (T)s1 ? (T)s1 : CLAMP_LO(x, (T)s));                \
        break;                                                                        \
    case U_sin: ROWS1(T, SIN(x)); break;                                             \
    case U_cos: ROWS1(T, COS(x)); break;                                             \
    case U_gelu_tanh: /* aten's order: beta (x + kappa x^3) */                       \
        ROWS1(T, (T)0.5 * x *                                                         \
                     (1 + TANH((T)GELU_TANH_BETA * (x + (T)GELU_TANH_KAPPA * (x * x * x))))); \
        break;                                                                        \
    }

/* PyTorch computes x^p for these p without pow (aten's PowKernel.cpp): the
 * results differ from pow's at -0 and -inf (sqrt(-0) = -0, sqrt(-inf) = NaN,
 * 1/sqrt(-0) = -inf; pow gives +0, +inf, +inf) and in the last bit, so nabla
 * takes the same paths. x^0 = 1 and x^1 = x are pow's results already. */
typedef enum { P_POW, P_SQRT, P_RSQRT, P_RECIP, P_SQUARE, P_CUBE, P_RECIP_SQUARE } pow_kind;
static pow_kind pow_path(double p) {
    return p == 0.5 ? P_SQRT : p == -0.5 ? P_RSQRT : p == -1 ? P_RECIP : p == 2 ? P_SQUARE
         : p == 3 ? P_CUBE : p == -2 ? P_RECIP_SQUARE : P_POW;
}

/* The f32 ops ops/vmath.h computes: y[0..n) = f(x[0], x[sx], ...) */
typedef void vmath_fn(const float *x, int64_t sx, float *y, int64_t n);
static vmath_fn *vmath_unop(unop op) {
    switch (op) {
    case U_exp: return nbv_exp_f32;
    case U_tanh: return nbv_tanh_f32;
    case U_gelu: return nbv_gelu_f32;
    case U_sigmoid: return nbv_sigmoid_f32;
    case U_silu: return nbv_silu_f32;
    case U_gelu_tanh: return nbv_gelu_tanh_f32;
    default: return NULL;
    }
}

static void unary_span(void *ctx, int64_t lo, int64_t hi) {
    const unary_job *j = ctx;
    int64_t sx = NBI_INNER(&j->it, 1);
    double s = j->s, s1 = j->s1;
    vmath_fn *vf = j->lowp ? nbv_gelu_tanh_lowp_f32 : j->dt == NB_F32 ? vmath_unop(j->op) : NULL;
    if (vf) {
        NBI_FOR_SPAN(&j->it, lo, hi, c, jb, je) {
            vf((const float *)j->px + c.off[1] + jb * sx, sx, (float *)j->po + c.off[0] + jb,
               je - jb);
        }
        return;
    }
    /* (f32 exp, tanh, gelu, sigmoid, silu and gelu_tanh went to vmath above) */
    if (j->dt == NB_F32) UNARY_CASES(float, expf, logf, sqrtf, tanhf, erff, powf, sinf, cosf)
    else UNARY_CASES(double, exp, log, sqrt, tanh, erf, pow, sin, cos)
}

/* gelu_tanh of f32 inside a bf16 autocast region (a product's output, most
 * often) runs in float rather than double: within a few ulp of float, where
 * the bf16 products around it carry 2^-8 (ops/vmath.h, gelu_tanh_lowp). Its
 * backward runs in the forward's autocast dtype (autograd/autocast.c), so
 * it takes the same path. */
static bool gelu_tanh_lowp(unop op, const nb_tensor *t) {
    return op == U_gelu_tanh && t->dtype == NB_F32 && nb_autocast_dtype() == NB_BF16;
}

static nb_tensor *unary(const char *fn, unop op, double s, double s1, nb_tensor *t) {
    if (!nbi_arg(fn, t, 0)) return NULL;
    if (!nbi_check_float(fn, t)) return NULL;
    nb_tensor *y = nbi_new_like(fn, t, false);
    if (!y) return NULL;
    const int64_t *st[2] = {y->strides, t->strides};
    unary_job j = {.op = op, .dt = t->dtype, .s = s, .s1 = s1, .lowp = gelu_tanh_lowp(op, t),
                   .po = nbi_ptr(y), .px = nbi_ptr(t)};
    nbi_iter_init(&j.it, t->ndim, t->shape, 2, st);
    bool cheap = unop_flags[op] & NB_OP_CHEAP;
    nbi_parallel_for(t->numel, cheap ? NBI_GRAIN : NBI_GRAIN_HEAVY, unary_span, &j);
    return y;
}

/* An elementwise op's Jacobian is diagonal: its tangent rule is its backward
 * rule applied to the input's tangent (grad mode is off: the fused paths). */
static nb_tensor *unary_jvp(nbi_node *n, nb_tensor *const *tin) {
    nb_tensor *gin[1] = {NULL};
    if (n->backward(n, tin[0], gin) != 0) return NULL;
    return gin[0] == tin[0] ? nbi_recorded_alias(tin[0]) : gin[0];
}

/* Records node for y = op(t) with rule bw; d[0], d[1] are the scalars s, s1. */
static nb_tensor *unary_op(const char *fn, unop op, double s, double s1, nbi_backward_fn bw,
                           uint32_t saved, nb_tensor *t) {
    nb_tensor *y = unary(fn, op, s, s1, t);
    if (!y || !nbi_needs_grad(1, &t)) return y;
    nbi_node *n = nbi_record(y, fn, bw, 1, &t);
    if (!n) return nbi_discard(y);
    nbi_save(n, saved);
    n->d[0] = s;
    n->d[1] = s1;
    n->jvp = unary_jvp;
    return y;
}

/* g * f'(x) for the f32 activations whose derivative ops/vmath.h computes, in
 * one pass over g and x; other dtypes (and g of another shape or dtype, which
 * the binary kernel checks and reports) go through the binary kernel's
 * formula (ops/binary.c). */
typedef void vmath_grad_fn(const float *g, int64_t sg, const float *x, int64_t sx, float *y,
                           int64_t n);
typedef struct {
    vmath_grad_fn *f;
    nbi_iter it; /* operands: out, g, x */
    char *po;
    const char *pg, *px;
} grad_job;

static void grad_span(void *ctx, int64_t lo, int64_t hi) {
    const grad_job *j = ctx;
    int64_t sg = NBI_INNER(&j->it, 1), sx = NBI_INNER(&j->it, 2);
    NBI_FOR_SPAN(&j->it, lo, hi, c, jb, je) {
        j->f((const float *)j->pg + c.off[1] + jb * sg, sg,
             (const float *)j->px + c.off[2] + jb * sx, sx, (float *)j->po + c.off[0] + jb,
             je - jb);
    }
}

static nb_tensor *act_grad(const char *fn, vmath_grad_fn *f, nbi_binop other, nb_tensor *g,
                           nb_tensor *x) {
    bool fused = g && x && g->dtype == NB_F32 && x->dtype == NB_F32 && g->ndim == x->ndim;
    for (int d = 0; fused && d < x->ndim; d++) fused = g->shape[d] == x->shape[d];
    if (!fused) return nbi_binary(fn, other, g, x);
    nb_tensor *y = nbi_new(fn, NB_F32, x->ndim, x->shape, false);
    if (!y) return NULL;
    const int64_t *st[3] = {y->strides, g->strides, x->strides};
    grad_job j = {.f = f, .po = nbi_ptr(y), .pg = nbi_ptr(g), .px = nbi_ptr(x)};
    nbi_iter_init(&j.it, x->ndim, x->shape, 3, st);
    nbi_parallel_for(x->numel, NBI_GRAIN_HEAVY, grad_span, &j);
    return y;
}

/* --------------------------------------------------------- backward rules
 * Under create_graph (nbi_create_graph()) the fused gradient kernels give
 * way to recorded ops, so that the gradient can be differentiated again. */

/* 1 - t */
static nb_tensor *one_minus(nb_tensor *t) { return nb_add_scalar(nb_neg(t), 1); }

/* f'(x) by op's fused gradient kernel at g = 1 (exact: 1 * f'), recording
 * nothing: relu's 0/1 and abs's sign, constants; gelu's, see gelu_slope. */
static nb_tensor *slope_of(const char *fn, nbi_binop op, nb_tensor *x) {
    return x ? nbi_binary(fn, op, nb_scalar(x->dtype, 1), x) : NULL;
}

/* gelu''(x) = phi(x) (2 - x^2), phi(x) = exp(-x^2 / 2) / sqrt(2 pi) */
static nb_tensor *gelu_curvature(nb_tensor *x) {
    nb_tensor *x2 = nb_mul(x, x);
    nb_tensor *phi = nb_mul_scalar(nb_exp(nb_mul_scalar(x2, -0.5)), 0.39894228040143267794);
    return nb_mul(phi, nb_add_scalar(nb_neg(x2), 2));
}
static int gelu_slope_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    return (gin[0] = nb_mul(g, gelu_curvature(nbi_saved_in(n, 0)))) ? 0 : -1;
}
/* gelu'(x) = Phi(x) + x phi(x) as a recorded op (nabla has no public erf to
 * compose Phi from), with gelu'' as its derivative. */
static nb_tensor *gelu_slope(nb_tensor *x) {
    nb_tensor *d = slope_of("nb_gelu", NBI_GELU_GRAD, x);
    if (!d || !nbi_needs_grad(1, &x)) return d;
    nbi_node *n = nbi_record(d, "nb_gelu's backward (gelu')", gelu_slope_backward, 1, &x);
    if (!n) return nbi_discard(d);
    nbi_save(n, NBI_SAVE_IN(0));
    n->jvp = unary_jvp;
    return d;
}

/* gelu_tanh'(x) in aten's order: 0.5 (1 + th) + 0.5 x (1 - th^2) beta (1 + 3 kappa x^2),
 * th = tanh(beta (x + kappa x^3)) */
static nb_tensor *gelu_tanh_slope(nb_tensor *x) {
    nb_tensor *x2 = nb_mul(x, x);
    nb_tensor *u = nb_add(x, nb_mul_scalar(nb_mul(x2, x), GELU_TANH_KAPPA));
    nb_tensor *th = nb_tanh(nb_mul_scalar(u, GELU_TANH_BETA));
    nb_tensor *left = nb_mul_scalar(nb_mul(nb_mul_scalar(x, 0.5), one_minus(nb_mul(th, th))),
                                    GELU_TANH_BETA);
    nb_tensor *right_d = nb_mul(left, nb_add_scalar(nb_mul_scalar(x2, 3 * GELU_TANH_KAPPA), 1));
    return nb_add(nb_mul_scalar(nb_add_scalar(th, 1), 0.5), right_d);
}

static int neg_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    (void)n;
    return (gin[0] = nb_neg(g)) ? 0 : -1;
}
static int exp_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    return (gin[0] = nb_mul(g, nbi_saved_out(n))) ? 0 : -1;
}
static int log_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    return (gin[0] = nb_div(g, nbi_saved_in(n, 0))) ? 0 : -1;
}
static int sqrt_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    return (gin[0] = nb_div(nb_mul_scalar(g, 0.5), nbi_saved_out(n))) ? 0 : -1;
}
/* g (1 - y^2), y = tanh(x) */
static int tanh_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    nb_tensor *y = nbi_saved_out(n);
    gin[0] = nbi_create_graph() ? nb_mul(g, one_minus(nb_mul(y, y)))
                                : nbi_binary("nb_tanh", NBI_TANH_GRAD, g, y);
    return gin[0] ? 0 : -1;
}
/* g where x > 0 or NaN; 0 where x <= 0, even for an infinite g */
static int relu_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    const char *fn = "nb_relu";
    nb_tensor *x = nbi_saved_in(n, 0);
    gin[0] = nbi_create_graph() ? nbi_weighted(fn, g, slope_of(fn, NBI_RELU_GRAD, x))
                                : nbi_binary(fn, NBI_RELU_GRAD, g, x);
    return gin[0] ? 0 : -1;
}
static int gelu_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    nb_tensor *x = nbi_saved_in(n, 0);
    gin[0] = nbi_create_graph() ? nb_mul(g, gelu_slope(x))
                                : act_grad("nb_gelu", nbv_gelu_grad_f32, NBI_GELU_GRAD, g, x);
    return gin[0] ? 0 : -1;
}
/* d(x^p)/dx = p x^(p-1) */
static int pow_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    double p = n->d[0];
    if (p == 0) /* x^0 is constant: 0 * x^-1 would be NaN at x = 0 */
        return (gin[0] = nb_zeros(g->dtype, g->ndim, g->shape)) ? 0 : -1;
    nb_tensor *d = nb_mul_scalar(nb_pow_scalar(nbi_saved_in(n, 0), p - 1), p);
    return (gin[0] = nb_mul(g, d)) ? 0 : -1;
}
/* g (1 - y) y, y = sigmoid(x) */
static int sigmoid_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    nb_tensor *y = nbi_saved_out(n);
    gin[0] = nbi_create_graph() ? nb_mul(nb_mul(g, one_minus(y)), y)
                                : nbi_binary("nb_sigmoid", NBI_SIGMOID_GRAD, g, y);
    return gin[0] ? 0 : -1;
}
/* g s (1 + x (1 - s)), s = sigmoid(x), torch's silu_backward */
static int silu_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    nb_tensor *x = nbi_saved_in(n, 0);
    if (!nbi_create_graph()) {
        gin[0] = act_grad("nb_silu", nbv_silu_grad_f32, NBI_SILU_GRAD, g, x);
        return gin[0] ? 0 : -1;
    }
    nb_tensor *s = nb_sigmoid(x);
    gin[0] = nb_mul(nb_mul(g, s), nb_add_scalar(nb_mul(x, one_minus(s)), 1));
    return gin[0] ? 0 : -1;
}
/* g sgn(x), sgn 0 at 0 and NaN */
static int abs_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    const char *fn = "nb_abs";
    nb_tensor *x = nbi_saved_in(n, 0);
    gin[0] = nbi_create_graph() ? nb_mul(g, slope_of(fn, NBI_ABS_GRAD, x))
                                : nbi_binary(fn, NBI_ABS_GRAD, g, x);
    return gin[0] ? 0 : -1;
}
/* PyTorch's mask: g where lo <= x <= hi, else 0 (NaN included). With lo <= hi
 * (as rounded to x's dtype, as the forward used them) that is where y == x;
 * with lo > hi no x is inside. */
static int clamp_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    nb_tensor *x = nbi_saved_in(n, 0);
    bool empty = x->dtype == NB_F32 ? (float)n->d[0] > (float)n->d[1] : n->d[0] > n->d[1];
    if (empty) return (gin[0] = nb_zeros(g->dtype, g->ndim, g->shape)) ? 0 : -1;
    return (gin[0] = nb_masked_fill(g, nb_ne(x, nbi_saved_out(n)), 0)) ? 0 : -1;
}
static int gelu_tanh_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    nb_tensor *x = nbi_saved_in(n, 0);
    gin[0] = nbi_create_graph()
                 ? nb_mul(g, gelu_tanh_slope(x))
                 : act_grad("nb_gelu_tanh",
                            gelu_tanh_lowp(U_gelu_tanh, x) ? nbv_gelu_tanh_grad_lowp_f32
                                                           : nbv_gelu_tanh_grad_f32,
                            NBI_GELU_TANH_GRAD, g, x);
    return gin[0] ? 0 : -1;
}
/* g cos x and -g sin x: recorded ops in every mode (no fused kernel) */
static int sin_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    return (gin[0] = nb_mul(g, nb_cos(nbi_saved_in(n, 0)))) ? 0 : -1;
}
static int cos_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    return (gin[0] = nb_neg(nb_mul(g, nb_sin(nbi_saved_in(n, 0))))) ? 0 : -1;
}
static int add_scalar_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    (void)n;
    gin[0] = g;
    return 0;
}
static int mul_scalar_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    return (gin[0] = nb_mul_scalar(g, n->d[0])) ? 0 : -1;
}

nb_tensor *nb_neg(nb_tensor *t) { return unary_op("nb_neg", U_neg, 0, 0, neg_backward, 0, t); }
nb_tensor *nb_exp(nb_tensor *t) {
    return unary_op("nb_exp", U_exp, 0, 0, exp_backward, NBI_SAVE_OUT, t);
}
nb_tensor *nb_log(nb_tensor *t) {
    return unary_op("nb_log", U_log, 0, 0, log_backward, NBI_SAVE_IN(0), t);
}
nb_tensor *nb_sqrt(nb_tensor *t) {
    return unary_op("nb_sqrt", U_sqrt, 0, 0, sqrt_backward, NBI_SAVE_OUT, t);
}
nb_tensor *nb_tanh(nb_tensor *t) {
    return unary_op("nb_tanh", U_tanh, 0, 0, tanh_backward, NBI_SAVE_OUT, t);
}
nb_tensor *nb_relu(nb_tensor *t) {
    return unary_op("nb_relu", U_relu, 0, 0, relu_backward, NBI_SAVE_IN(0), t);
}
nb_tensor *nb_gelu(nb_tensor *t) {
    return unary_op("nb_gelu", U_gelu, 0, 0, gelu_backward, NBI_SAVE_IN(0), t);
}
nb_tensor *nb_pow_scalar(nb_tensor *t, double exponent) {
    return unary_op("nb_pow_scalar", U_pow_scalar, exponent, 0, pow_backward, NBI_SAVE_IN(0), t);
}
nb_tensor *nb_add_scalar(nb_tensor *t, double value) {
    return unary_op("nb_add_scalar", U_add_scalar, value, 0, add_scalar_backward, 0, t);
}
nb_tensor *nb_mul_scalar(nb_tensor *t, double value) {
    return unary_op("nb_mul_scalar", U_mul_scalar, value, 0, mul_scalar_backward, 0, t);
}
nb_tensor *nb_sigmoid(nb_tensor *t) {
    return unary_op("nb_sigmoid", U_sigmoid, 0, 0, sigmoid_backward, NBI_SAVE_OUT, t);
}
nb_tensor *nb_silu(nb_tensor *t) {
    return unary_op("nb_silu", U_silu, 0, 0, silu_backward, NBI_SAVE_IN(0), t);
}
nb_tensor *nb_abs(nb_tensor *t) {
    return unary_op("nb_abs", U_abs, 0, 0, abs_backward, NBI_SAVE_IN(0), t);
}
nb_tensor *nb_clamp(nb_tensor *t, double lo, double hi) {
    if (!nbi_arg("nb_clamp", t, 0)) return NULL;
    if (isnan(lo) || isnan(hi)) return nbi_error("nb_clamp: bound is NaN (lo %g, hi %g)", lo, hi);
    return unary_op("nb_clamp", U_clamp, lo, hi, clamp_backward,
                    NBI_SAVE_IN(0) | NBI_SAVE_OUT, t);
}
nb_tensor *nb_gelu_tanh(nb_tensor *t) {
    return unary_op("nb_gelu_tanh", U_gelu_tanh, 0, 0, gelu_tanh_backward, NBI_SAVE_IN(0), t);
}
nb_tensor *nb_sin(nb_tensor *t) {
    return unary_op("nb_sin", U_sin, 0, 0, sin_backward, NBI_SAVE_IN(0), t);
}
nb_tensor *nb_cos(nb_tensor *t) {
    return unary_op("nb_cos", U_cos, 0, 0, cos_backward, NBI_SAVE_IN(0), t);
}
