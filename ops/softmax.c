/* softmax.c: nb_softmax and nb_log_softmax over any dim, with their
 * backward rules as dedicated kernels (and, for create_graph and forward
 * mode, the same rules made of recorded ops).
 *
 * Both are numerically stable: the slice max m is subtracted before exp, so
 * exp never overflows (softmax(x) = exp(x - m) / sum exp(x - m), and
 * log_softmax(x) = (x - m) - log(sum exp(x - m))).
 *
 * Convention (docs/numerics.md): a slice that is entirely
 * -inf (an attention row whose keys are all masked) gives zeros, not NaN, for
 * both softmax and log_softmax, and passes zero gradient. PyTorch gives NaN
 * there.
 * Any slice with at least one finite value is exactly PyTorch's result.
 *
 * The input is read in place with any strides (transposed, expanded); the
 * output is a new contiguous tensor. Row sums accumulate in the tensor's own
 * type (float for f32, as PyTorch's CPU kernels do; double for f64), in 8
 * interleaved partial sums added at the end (a fixed order, so the compiler
 * may vectorize it and the result is the same for any thread count). Slices
 * are split across the thread pool. f32 exp is ops/vmath.h's (vectorized,
 * within 1 ulp, the same bits for a value wherever it sits in the slice). */
#include "ops_internal.h"
#include "vmath.h"

#include <math.h>
#include <string.h>

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

/* Runs BODY for slices [lo, hi) (in the iterator's order) with o0, o1, o2 =
 * the slice's first element offset in each operand (relative to nbi_ptr of
 * that operand). */
#define FOR_SLICES(s, lo, hi, BODY)                                              \
    do {                                                                         \
        const nbi_iter *it_ = &(s)->it;                                          \
        int64_t in0_ = NBI_INNER(it_, 0), in1_ = NBI_INNER(it_, 1);              \
        int64_t in2_ = it_->nops > 2 ? NBI_INNER(it_, 2) : 0;                    \
        NBI_FOR_SPAN(it_, lo, hi, c_, jb_, je_) {                                \
            for (int64_t j_ = jb_; j_ < je_; j_++) {                             \
                int64_t o0 = c_.off[0] + j_ * in0_, o1 = c_.off[1] + j_ * in1_; \
                int64_t o2 = it_->nops > 2 ? c_.off[2] + j_ * in2_ : 0;          \
                (void)o2;                                                        \
                BODY                                                             \
            }                                                                    \
        }                                                                        \
    } while (0)

/* One softmax job: slices of x (and g) -> y, split across the pool. */
typedef struct {
    slices s;
    bool log_mode;
    const char *p0, *p1; /* forward: x, -;  backward: y, g */
    char *out;
} slice_job;

/* Slices per range: enough elements to be worth a thread. */
static int64_t slice_grain(const slices *s) {
    return NBI_GRAIN_HEAVY / (s->len > 0 ? s->len : 1) + 1;
}

/* --------------------------------------------------------------- kernels */
/* Sum of v[0..len) in 8 interleaved partial sums, then those in order. */
#define DEFINE_SUM8(T)                                                           \
    static T sum8_##T(const T *v, int64_t len) {                                 \
        T acc[8] = {0};                                                          \
        int64_t k = 0;                                                           \
        for (; k + 8 <= len; k += 8)                                             \
            for (int l = 0; l < 8; l++) acc[l] += v[k + l];                      \
        for (; k < len; k++) acc[k & 7] += v[k];                                 \
        return ((acc[0] + acc[1]) + (acc[2] + acc[3])) +                         \
               ((acc[4] + acc[5]) + (acc[6] + acc[7]));                          \
    }
DEFINE_SUM8(float)
DEFINE_SUM8(double)

/* e[i] = exp(v[i * sv] - m) and e[i] = exp(v[i * sv]), i < n, e contiguous (e
 * may be v itself when sv == 1): f32 through ops/vmath.h, f64 libm. */
static void exp_shifted_float(const float *v, int64_t sv, float m, float *e, int64_t n) {
    for (int64_t i = 0; i < n; i++) e[i] = v[i * sv] - m;
    nbv_exp_f32(e, 1, e, n);
}
static void exp_shifted_double(const double *v, int64_t sv, double m, double *e, int64_t n) {
    for (int64_t i = 0; i < n; i++) e[i] = exp(v[i * sv] - m);
}
static void exp_float(const float *v, int64_t sv, float *e, int64_t n) {
    nbv_exp_f32(v, sv, e, n);
}
static void exp_double(const double *v, int64_t sv, double *e, int64_t n) {
    for (int64_t i = 0; i < n; i++) e[i] = exp(v[i * sv]);
}

/* Strided slices go through a buffer of this many elements. */
#define CHUNK 256

/* Forward, one slice: x (len, stride sx) -> y (len, stride sy).
 * log_mode: y = (x - m) - log(sum exp(x - m)); else y = exp(x - m) / sum.
 * A contiguous y holds exp(x - m) first, so the sum is a second, vector pass;
 * the log_mode sum goes through y too and is overwritten after. */
#define DEFINE_FORWARD(T, LOG)                                                   \
    static void forward_slice_##T(const T *x, int64_t sx, T *y, int64_t sy,     \
                                  int64_t len, bool log_mode) {                  \
        T m = -(T)INFINITY;                                                      \
        bool nan = false;                                                        \
        for (int64_t k = 0; k < len; k++) {                                      \
            T v = x[k * sx];                                                     \
            nan |= v != v;                                                       \
            m = v > m ? v : m;                                                   \
        }                                                                        \
        if (nan) m = (T)NAN; /* NaN propagates to the whole slice */             \
        if (m == -(T)INFINITY) { /* all -inf: zeros by convention */             \
            for (int64_t k = 0; k < len; k++) y[k * sy] = 0;                     \
            return;                                                              \
        }                                                                        \
        T sum;                                                                   \
        if (sy == 1) {                                                           \
            exp_shifted_##T(x, sx, m, y, len);                                   \
            sum = sum8_##T(y, len);                                              \
        } else {                                                                 \
            T acc[8] = {0}, e[CHUNK];                                            \
            for (int64_t k0 = 0; k0 < len; k0 += CHUNK) {                        \
                int64_t n = len - k0 < CHUNK ? len - k0 : CHUNK;                 \
                exp_shifted_##T(x + k0 * sx, sx, m, e, n);                       \
                for (int64_t i = 0; i < n; i++) {                                \
                    y[(k0 + i) * sy] = e[i];                                     \
                    acc[(k0 + i) & 7] += e[i];                                   \
                }                                                                \
            }                                                                    \
            sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) +                      \
                  ((acc[4] + acc[5]) + (acc[6] + acc[7]));                       \
        }                                                                        \
        if (log_mode) {                                                          \
            T lse = LOG(sum);                                                    \
            for (int64_t k = 0; k < len; k++) y[k * sy] = (x[k * sx] - m) - lse; \
        } else {                                                                 \
            for (int64_t k = 0; k < len; k++) y[k * sy] /= sum;                  \
        }                                                                        \
    }
DEFINE_FORWARD(float, logf)
DEFINE_FORWARD(double, log)

/* Backward, one slice: y (saved output), g (upstream) -> gi.
 *   softmax:     gi = y * (g - sum(g * y))
 *   log_softmax: gi = g - exp(y) * sum(g)
 * A slice of y that is all zeros comes from an all -inf input slice (a
 * softmax slice sums to 1; a log_softmax slice of len > 1 cannot be all 0,
 * since then sum exp(y) = len != 1, and for len == 1 the rule gives 0
 * anyway): it gets exact zeros, whatever g holds. */
#define DEFINE_BACKWARD(T)                                                       \
    static void backward_slice_##T(const T *y, int64_t sy, const T *g,          \
                                   int64_t sg, T *gi, int64_t si, int64_t len,   \
                                   bool log_mode) {                              \
        T acc[8] = {0};                                                          \
        bool any = false;                                                        \
        for (int64_t k = 0; k < len; k++) {                                      \
            T yk = y[k * sy];                                                    \
            any |= yk != 0;                                                      \
            acc[k & 7] += log_mode ? g[k * sg] : g[k * sg] * yk;                 \
        }                                                                        \
        T sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) +                        \
                ((acc[4] + acc[5]) + (acc[6] + acc[7]));                         \
        if (!any) {                                                              \
            for (int64_t k = 0; k < len; k++) gi[k * si] = 0;                    \
            return;                                                              \
        }                                                                        \
        if (log_mode) {                                                          \
            T e[CHUNK];                                                          \
            for (int64_t k0 = 0; k0 < len; k0 += CHUNK) {                        \
                int64_t n = len - k0 < CHUNK ? len - k0 : CHUNK;                 \
                exp_##T(y + k0 * sy, sy, e, n);                                  \
                for (int64_t i = 0; i < n; i++)                                  \
                    gi[(k0 + i) * si] = g[(k0 + i) * sg] - e[i] * sum;           \
            }                                                                    \
        } else {                                                                 \
            for (int64_t k = 0; k < len; k++)                                    \
                gi[k * si] = y[k * sy] * (g[k * sg] - sum);                      \
        }                                                                        \
    }
DEFINE_BACKWARD(float)
DEFINE_BACKWARD(double)

/* Slices [lo, hi) of a job, forward and backward. */
#define DEFINE_SPANS(T, SUF)                                                              \
    static void forward_span_##SUF(void *ctx, int64_t lo, int64_t hi) {                   \
        const slice_job *j = ctx;                                                         \
        const T *px = (const T *)j->p0;                                                   \
        T *py = (T *)j->out;                                                              \
        FOR_SLICES(&j->s, lo, hi,                                                         \
                   forward_slice_##T(px + o0, j->s.step[0], py + o1, j->s.step[1],        \
                                     j->s.len, j->log_mode););                            \
    }                                                                                     \
    static void backward_span_##SUF(void *ctx, int64_t lo, int64_t hi) {                  \
        const slice_job *j = ctx;                                                         \
        const T *py = (const T *)j->p0, *pg = (const T *)j->p1;                           \
        T *pi = (T *)j->out;                                                              \
        FOR_SLICES(&j->s, lo, hi,                                                         \
                   backward_slice_##T(py + o0, j->s.step[0], pg + o1, j->s.step[1],       \
                                      pi + o2, j->s.step[2], j->s.len, j->log_mode););    \
    }
DEFINE_SPANS(float, f32)
DEFINE_SPANS(double, f64)

/* f32 slices of unit stride in every operand (softmax over a contiguous
 * last dim: attention's rows). The same arithmetic in the same order as the
 * kernels above, so the same bits, written so that every pass vectorizes:
 * the max in 16 lanes (a max is exact in any order), the sums in sum8's 8.
 * Built for AVX2 and AVX-512 too, and picked at run time. */
/* No a * b + c fused into one rounding here: the AVX2/AVX-512 variants have
 * FMA, and clang fuses within an expression by default (gcc, in ISO C mode,
 * does not), which would change the bits of the backward's sums. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif
typedef float unit_vf __attribute__((vector_size(64)));
typedef int32_t unit_vi __attribute__((vector_size(64)));

#define DEFINE_UNIT(SUF, ATTR)                                                           \
    /* the max of x[0..len), NaN if any element is */                                   \
    ATTR static float max_unit_##SUF(const float *x, int64_t len) {                     \
        unit_vf mv = (unit_vf){0} - INFINITY;                                           \
        unit_vi bad = {0};                                                              \
        int64_t k = 0;                                                                  \
        for (; k + 16 <= len; k += 16) {                                                \
            unit_vf v;                                                                  \
            memcpy(&v, x + k, sizeof v);                                                \
            unit_vi gt = v > mv;                                                        \
            bad |= v != v;                                                              \
            mv = (unit_vf)(((unit_vi)v & gt) | ((unit_vi)mv & ~gt));                    \
        }                                                                               \
        float m = -INFINITY;                                                            \
        bool nan = false;                                                               \
        for (int l = 0; l < 16; l++) {                                                  \
            nan |= bad[l] != 0;                                                         \
            m = mv[l] > m ? mv[l] : m;                                                  \
        }                                                                               \
        for (; k < len; k++) {                                                          \
            nan |= x[k] != x[k];                                                        \
            m = x[k] > m ? x[k] : m;                                                    \
        }                                                                               \
        return nan ? NAN : m;                                                           \
    }                                                                                   \
    ATTR static void forward_unit_##SUF(const float *x, float *y, int64_t len,          \
                                        bool log_mode) {                                \
        float m = max_unit_##SUF(x, len);                                               \
        if (m == -INFINITY) { /* all -inf: zeros by convention */                       \
            memset(y, 0, (size_t)len * sizeof *y);                                      \
            return;                                                                     \
        }                                                                               \
        for (int64_t k = 0; k < len; k++) y[k] = x[k] - m;                              \
        nbv_exp_f32(y, 1, y, len);                                                      \
        float sum = sum8_float(y, len);                                                 \
        if (log_mode) {                                                                 \
            float lse = logf(sum);                                                      \
            for (int64_t k = 0; k < len; k++) y[k] = (x[k] - m) - lse;                  \
        } else {                                                                        \
            for (int64_t k = 0; k < len; k++) y[k] /= sum;                              \
        }                                                                               \
    }                                                                                   \
    ATTR static void backward_unit_##SUF(const float *y, const float *g, float *gi,     \
                                         int64_t len, bool log_mode) {                  \
        int nonzero = 0;                                                                \
        for (int64_t k = 0; k < len; k++) nonzero |= y[k] != 0;                         \
        if (!nonzero) {                                                                 \
            memset(gi, 0, (size_t)len * sizeof *gi);                                    \
            return;                                                                     \
        }                                                                               \
        if (log_mode) {                                                                 \
            float sum = sum8_float(g, len), e[CHUNK];                                   \
            for (int64_t k0 = 0; k0 < len; k0 += CHUNK) {                               \
                int64_t n = len - k0 < CHUNK ? len - k0 : CHUNK;                        \
                nbv_exp_f32(y + k0, 1, e, n);                                           \
                for (int64_t i = 0; i < n; i++) gi[k0 + i] = g[k0 + i] - e[i] * sum;    \
            }                                                                           \
            return;                                                                     \
        }                                                                               \
        float acc[8] = {0};                                                             \
        int64_t k = 0;                                                                  \
        for (; k + 8 <= len; k += 8)                                                    \
            for (int l = 0; l < 8; l++) acc[l] += g[k + l] * y[k + l];                  \
        for (; k < len; k++) acc[k & 7] += g[k] * y[k];                                 \
        float sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) +                           \
                    ((acc[4] + acc[5]) + (acc[6] + acc[7]));                            \
        for (int64_t k2 = 0; k2 < len; k2++) gi[k2] = y[k2] * (g[k2] - sum);            \
    }                                                                                   \
    ATTR static void forward_span_unit_##SUF(void *ctx, int64_t lo, int64_t hi) {       \
        const slice_job *j = ctx;                                                       \
        const float *px = (const float *)j->p0;                                         \
        float *py = (float *)j->out;                                                    \
        FOR_SLICES(&j->s, lo, hi, forward_unit_##SUF(px + o0, py + o1, j->s.len,        \
                                                     j->log_mode););                    \
    }                                                                                   \
    ATTR static void backward_span_unit_##SUF(void *ctx, int64_t lo, int64_t hi) {      \
        const slice_job *j = ctx;                                                       \
        const float *py = (const float *)j->p0, *pg = (const float *)j->p1;             \
        float *pi = (float *)j->out;                                                    \
        FOR_SLICES(&j->s, lo, hi, backward_unit_##SUF(py + o0, pg + o1, pi + o2,        \
                                                      j->s.len, j->log_mode););         \
    }
DEFINE_UNIT(base, )
#if defined(__x86_64__) && (defined(__clang__) || defined(__GNUC__))
DEFINE_UNIT(avx2, __attribute__((target("avx2"))))
DEFINE_UNIT(avx512, __attribute__((target("avx512f"))))
#define HAVE_AVX_UNIT 1
#endif

/* The span function for a job: f32 slices of unit stride in all nops
 * operands take the vectorized kernels. */
static nbi_range_fn span_kernel(const slice_job *j, nb_dtype dt, int nops, bool backward) {
    bool unit = dt == NB_F32;
    for (int k = 0; k < nops; k++) unit = unit && (j->s.step[k] == 1 || j->s.len <= 1);
    if (!unit && dt == NB_F32) return backward ? backward_span_f32 : forward_span_f32;
    if (!unit) return backward ? backward_span_f64 : forward_span_f64;
#ifdef HAVE_AVX_UNIT
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f"))
        return backward ? backward_span_unit_avx512 : forward_span_unit_avx512;
    if (__builtin_cpu_supports("avx2"))
        return backward ? backward_span_unit_avx2 : forward_span_unit_avx2;
#endif
    return backward ? backward_span_unit_base : forward_span_unit_base;
}

/* ------------------------------------------------------ recorded rules */
/* Slices of y (along dim, kept) that are all zero: those of an all -inf
 * input, whose derivatives are zero by the convention above. A constant,
 * computed without recording. */
static nb_tensor *dead_slices(nb_tensor *y, int dim) {
    bool was_off = nbi_grad_off;
    nbi_grad_off = true;
    nb_tensor *dead = nb_eq(nb_max(nb_abs(y), dim, true), nb_scalar(y->dtype, 0));
    nbi_grad_off = was_off;
    return dead;
}

/* The rules as public ops, for create_graph and forward mode, with y the
 * output and u the incoming gradient (backward) or tangent (forward):
 *   softmax:              y * (u - sum(u * y))   (either way)
 *   log_softmax backward: u - exp(y) * sum(u)
 *   log_softmax forward:  u - sum(exp(y) * u)
 * sums over dim, kept; dead slices give zeros, as in the kernels. */
static nb_tensor *composed_rule(nb_tensor *y, nb_tensor *u, int dim, bool log_mode,
                                bool forward) {
    nb_tensor *r;
    if (!log_mode) r = nb_mul(y, nb_sub(u, nb_sum(nb_mul(u, y), dim, true)));
    else if (forward) r = nb_sub(u, nb_sum(nb_mul(nb_exp(y), u), dim, true));
    else r = nb_sub(u, nb_mul(nb_exp(y), nb_sum(u, dim, true)));
    if (!r || y->numel == 0) return r;
    return nb_where(dead_slices(y, dim), nb_scalar(y->dtype, 0), r);
}

static nb_tensor *softmax_jvp(nbi_node *n, nb_tensor *const *tin) {
    nb_tensor *y = nbi_saved_out(n);
    return y ? composed_rule(y, tin[0], (int)n->i[0], n->i[1] != 0, true) : NULL;
}

/* ------------------------------------------------------------- backward */
/* y (S) saved output, g (S) any strides -> gin (S) contiguous; node->i[0] =
 * dim (normalized), node->i[1] = log_mode. Under create_graph, the same rule
 * of recorded ops. */
static int softmax_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    nb_tensor *y = nbi_saved_out(n);
    if (!y) return -1;
    int dim = (int)n->i[0];
    bool log_mode = n->i[1] != 0;
    if (!nbi_wants(n, 0)) return 0;
    if (nbi_create_graph()) {
        gin[0] = composed_rule(y, g, dim, log_mode, false);
        return gin[0] ? 0 : -1;
    }
    nb_tensor *gi = nbi_new(n->op, y->dtype, y->ndim, y->shape, false);
    if (!gi) return -1;
    if (g->dtype != y->dtype) {
        nbi_discard(gi);
        return (nbi_error("%s: backward got a %s gradient for a %s output", n->op,
                          nb_dtype_name(g->dtype), nb_dtype_name(y->dtype)), -1);
    }
    const int64_t *st[3] = {y->strides, g->strides, gi->strides};
    slice_job j = {.log_mode = log_mode, .p0 = nbi_ptr(y), .p1 = nbi_ptr(g), .out = nbi_ptr(gi)};
    slices_init(&j.s, y->ndim, y->shape, dim, 3, st);
    if (j.s.numel > 0)
        nbi_parallel_for(j.s.numel / j.s.len, slice_grain(&j.s),
                         span_kernel(&j, y->dtype, 3, true), &j);
    gin[0] = gi;
    return 0;
}

/* -------------------------------------------------------------- forward */
/* t (S) any strides, dim in S -> y (S) contiguous. */
static nb_tensor *softmax_common(const char *fn, nb_tensor *t, int dim, bool log_mode) {
    if (!nbi_arg(fn, t, 0)) return NULL;
    if (!nbi_check_float(fn, t)) return NULL;
    int d = nbi_dim(fn, dim, t->ndim);
    if (d < 0) return NULL;
    nb_tensor *y = nbi_new(fn, t->dtype, t->ndim, t->shape, false);
    if (!y) return NULL;
    const int64_t *st[2] = {t->strides, y->strides};
    slice_job j = {.log_mode = log_mode, .p0 = nbi_ptr(t), .out = nbi_ptr(y)};
    slices_init(&j.s, t->ndim, t->shape, d, 2, st);
    if (j.s.numel > 0)
        nbi_parallel_for(j.s.numel / j.s.len, slice_grain(&j.s),
                         span_kernel(&j, t->dtype, 2, false), &j);
    if (nbi_needs_grad(1, &t)) {
        nbi_node *node = nbi_record(y, fn, softmax_backward, 1, &t);
        if (!node) return nbi_discard(y);
        nbi_save(node, NBI_SAVE_OUT); /* backward reads only the output */
        node->i[0] = d;
        node->i[1] = log_mode;
        node->jvp = softmax_jvp;
    }
    return y;
}

nb_tensor *nb_softmax(nb_tensor *t, int dim) {
    return softmax_common("nb_softmax", t, dim, false);
}

nb_tensor *nb_log_softmax(nb_tensor *t, int dim) {
    return softmax_common("nb_log_softmax", t, dim, true);
}
