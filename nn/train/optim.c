/* optim.c: SGD, Adam and AdamW with PyTorch 1.13's exact update rules
 * (torch/optim/sgd.py, adam.py, adamw.py, single-tensor path), gradient norm
 * clipping as torch.nn.utils.clip_grad_norm_ (learning-rate schedules are
 * in schedule.c).
 *
 * The optimizer remembers the parameters registered when it was made, in
 * registration order, and owns one state tensor per parameter and buffer
 * (same shape and dtype, persistent). A step reads each parameter's .grad and
 * updates values in place through nb_data: plain loops, arithmetic in double,
 * results stored in the parameter's dtype, no allocation and nothing recorded
 * by autograd. Parameters without a .grad are skipped and their step count
 * does not advance, as in torch. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../nn_internal.h"

typedef enum { OPT_SGD, OPT_ADAM, OPT_ADAMW } opt_kind;

struct nb_optim {
    opt_kind kind;
    double lr, momentum, beta1, beta2, eps, wd;
    int n;
    nb_tensor **params; /* borrowed from the registry */
    /* The state, borrowed from the buffers of `state` (what nb_optim_state
     * returns, so nb_load writes straight into it): */
    nb_tensor **m;      /* SGD: momentum buffer (NULL without momentum); Adam: exp_avg */
    nb_tensor **v;      /* Adam: exp_avg_sq */
    int64_t **steps;    /* per parameter: steps that found a gradient (0-d i64 data; at
                         * most NN_MAX_STEP from nb_load, so ++ cannot overflow) */
    double *wd_of;      /* per parameter: its weight decay (nb_optim_set_weight_decay) */
    char **names;       /* per parameter: its registry name (a copy: the registry may go first) */
    nn_index index;     /* name -> parameter */
    nb_params *state;
};

static const char *kind_name(opt_kind k) {
    return k == OPT_SGD ? "nb_sgd" : k == OPT_ADAM ? "nb_adam" : "nb_adamw";
}

void nb_optim_free(nb_optim *o) {
    if (!o) return;
    nb_params_free(o->state);
    free(o->params);
    free(o->m);
    free(o->v);
    free(o->steps);
    free(o->wd_of);
    for (int i = 0; o->names && i < o->n; i++) free(o->names[i]);
    free(o->names);
    nn_index_free(&o->index);
    free(o);
}

/* Registers a zero buffer "<param name>.<what>" shaped like p (0-d i64 for
 * the step) in o->state, whatever scope is open; nb_load refuses a file whose
 * values for it break `check`. */
static nb_tensor *state_buffer(nb_optim *o, const char *pname, const char *what, nb_tensor *p,
                               nn_values check) {
    char name[1024];
    int len = snprintf(name, sizeof name, "%s.%s", pname, what);
    if (len >= (int)sizeof name)
        return nn_error("%s: state name \"%.40s...\" is too long (%d bytes, at most %zu)",
                        kind_name(o->kind), name, len, sizeof name - 1);
    nb_scope_begin();
    nb_tensor *z = p ? nb_zeros(nb_dtype_of(p), nb_ndim(p), nb_shape(p)) : nb_scalar(NB_I64, 0);
    nb_tensor *s = nn_params_add_checked(o->state, name, z, check);
    nb_scope_end();
    return s;
}

/* The state of parameter i, in PyTorch's order: step, then the moments. */
static int make_state(nb_optim *o, int i, const char *pname) {
    nb_tensor *p = o->params[i], *step = state_buffer(o, pname, "step", NULL, NN_VALUES_STEP);
    if (!step) return -1;
    o->steps[i] = nb_data(step);
    const char *m_name = o->kind == OPT_SGD ? "momentum_buffer" : "exp_avg";
    if (o->m && !(o->m[i] = state_buffer(o, pname, m_name, p, NN_VALUES_FINITE))) return -1;
    if (o->v && !(o->v[i] = state_buffer(o, pname, "exp_avg_sq", p, NN_VALUES_FINITE_NONNEG)))
        return -1;
    return 0;
}

nb_params *nb_optim_state(nb_optim *o) {
    return o ? o->state : nn_error("nb_optim_state: optimizer is NULL");
}

/* Touches a buffer of each parameter's size and hands them all to the
 * allocator's cache (tensor/alloc.c), where the first backward finds its
 * gradients' buffers: their pages are faulted in now, with the state's,
 * not in the first training step (0.5 GB for GPT-2, a second or more of
 * page faults). Skipped when the cache could not keep them all. */
static void reserve_gradients(nb_params *ps, int n) {
    int64_t bytes = 0, limit = nb_memory_cache_limit();
    for (int i = 0; i < n; i++) {
        nb_tensor *p = nb_params_at(ps, i, NULL);
        bytes += nb_grad(p) ? 0 : nb_numel(p) * (nb_dtype_of(p) == NB_F64 ? 8 : 4);
    }
    if (limit >= 0 && nb_memory_cached() + bytes > limit) return; /* it would not be kept */
    nb_scope_begin();
    for (int i = 0; i < n; i++) {
        nb_tensor *p = nb_params_at(ps, i, NULL);
        if (!nb_grad(p)) nb_zeros(nb_dtype_of(p), nb_ndim(p), nb_shape(p));
    }
    nb_scope_end(); /* all freed at once, so each keeps its own buffer */
    nb_clear_error(); /* out of memory here only means no reserve */
}

/* A step writes every parameter in place: two that share memory (one tensor
 * registered twice, overlapping views of one buffer) would take two updates
 * each step. */
static int check_distinct(const char *fn, nb_params *ps, int n) {
    nb_tensor **ts = malloc((size_t)(n > 0 ? n : 1) * sizeof *ts);
    if (!ts) return nn_error("%s: out of memory", fn), -1;
    for (int i = 0; i < n; i++) ts[i] = nb_params_at(ps, i, NULL);
    int a, b, found = nn_shared_pair(ts, n, NULL, NULL, &a, &b);
    free(ts);
    if (found < 0) return nn_error("%s: out of memory", fn), -1;
    if (!found) return 0;
    const char *na = "", *nbn = "";
    nb_params_at(ps, a, &na);
    nb_params_at(ps, b, &nbn);
    nn_error("%s: parameters \"%s\" and \"%s\" share memory; a step would update it twice "
             "(register each tensor once)", fn, na, nbn);
    return -1;
}

static nb_optim *make(opt_kind kind, nb_params *ps, double lr, double momentum, double beta1,
                      double beta2, double eps, double wd) {
    const char *fn = kind_name(kind);
    if (!ps) return nn_error("%s: parameter registry is NULL", fn);
    /* !(x >= 0) also rejects NaN */
    if (!(lr >= 0)) return nn_error("%s: invalid learning rate %g (must be >= 0)", fn, lr);
    if (!(momentum >= 0)) return nn_error("%s: invalid momentum %g (must be >= 0)", fn, momentum);
    if (!(beta1 >= 0 && beta1 < 1))
        return nn_error("%s: invalid beta1 %g (must be in [0, 1))", fn, beta1);
    if (!(beta2 >= 0 && beta2 < 1))
        return nn_error("%s: invalid beta2 %g (must be in [0, 1))", fn, beta2);
    if (!(eps >= 0)) return nn_error("%s: invalid eps %g (must be >= 0)", fn, eps);
    if (!(wd >= 0)) return nn_error("%s: invalid weight_decay %g (must be >= 0)", fn, wd);
    int n = nb_params_count(ps);
    if (n == 0) return nn_error("%s: the registry has no parameters", fn);
    for (int i = 0; i < n; i++) {
        const char *name = "";
        nb_tensor *p = nb_params_at(ps, i, &name);
        if (!p) return NULL;
        nb_dtype d = nb_dtype_of(p);
        if (d != NB_F32 && d != NB_F64)
            return nn_error("%s: parameter \"%s\" must be f32 or f64, got %s", fn, name,
                            nb_dtype_name(d));
        if (!nb_is_contiguous(p))
            return nn_error("%s: parameter \"%s\" is not contiguous (register a contiguous "
                            "tensor, e.g. through nb_contiguous)", fn, name);
    }
    if (check_distinct(fn, ps, n) != 0) return NULL;

    nb_optim *o = calloc(1, sizeof *o);
    if (!o) return nn_error("%s: out of memory", fn);
    *o = (nb_optim){.kind = kind, .lr = lr, .momentum = momentum, .beta1 = beta1,
                    .beta2 = beta2, .eps = eps, .wd = wd, .n = n};
    bool need_m = kind != OPT_SGD || momentum != 0, need_v = kind != OPT_SGD;
    o->params = calloc((size_t)n, sizeof *o->params);
    o->steps = calloc((size_t)n, sizeof *o->steps);
    o->wd_of = calloc((size_t)n, sizeof *o->wd_of);
    o->names = calloc((size_t)n, sizeof *o->names);
    if (need_m) o->m = calloc((size_t)n, sizeof *o->m);
    if (need_v) o->v = calloc((size_t)n, sizeof *o->v);
    o->state = nb_params_new();
    if (!o->params || !o->steps || !o->wd_of || !o->names || (need_m && !o->m) ||
        (need_v && !o->v) || !o->state || nn_index_reserve(&o->index, (size_t)n)) {
        nb_optim_free(o);
        return nn_error("%s: out of memory", fn);
    }
    for (int i = 0; i < n; i++) {
        const char *name = "";
        o->params[i] = nb_params_at(ps, i, &name);
        if (!(o->names[i] = malloc(strlen(name) + 1))) {
            nb_optim_free(o);
            return nn_error("%s: out of memory", fn);
        }
        strcpy(o->names[i], name);
        o->wd_of[i] = wd;
        nn_index_put(&o->index, o->names[i], i);
        if (make_state(o, i, name) != 0) {
            nb_optim_free(o);
            return NULL;
        }
    }
    reserve_gradients(ps, n); /* after the state, which would take these buffers */
    return o;
}

nb_optim *nb_sgd(nb_params *ps, double lr, double momentum, double weight_decay) {
    return make(OPT_SGD, ps, lr, momentum, 0, 0, 0, weight_decay);
}

nb_optim *nb_adam(nb_params *ps, double lr, double beta1, double beta2, double eps,
                  double weight_decay) {
    return make(OPT_ADAM, ps, lr, 0, beta1, beta2, eps, weight_decay);
}

nb_optim *nb_adamw(nb_params *ps, double lr, double beta1, double beta2, double eps,
                   double weight_decay) {
    return make(OPT_ADAMW, ps, lr, 0, beta1, beta2, eps, weight_decay);
}

/* ------------------------------------------------------------ update kernels
 * One copy per element type T, computing in C (double for f64; float for
 * f32, as torch's f32 tensor ops do: every step rounds to float, and the
 * loop vectorizes). The order of operations follows torch's kernels:
 * add(a, b, alpha) = a + alpha*b, addcmul(a, b, c, value) = a + value*b*c,
 * addcdiv(a, b, c, value) = a + value*b/c; scalars are rounded to C first. */
#define DEFINE_KERNELS(T, C, SQRT)                                                                  \
    /* torch.optim.SGD: d = g + wd p; buf = d (first step) or momentum buf + d; p -= lr buf */  \
    static void sgd_##T(const nb_optim *o, double wd_, T *restrict p, const T *restrict g,     \
                        T *restrict buf, bool first, int64_t n) {                              \
        const C lr = (C)-o->lr, wd = (C)wd_, mom = (C)o->momentum;                              \
        for (int64_t i = 0; i < n; i++) {                                                      \
            C pi = p[i], d = g[i];                                                             \
            if (wd != 0) d = d + wd * pi;                                                      \
            if (buf) {                                                                         \
                if (!first) d = (C)buf[i] * mom + d;                                           \
                buf[i] = (T)d;                                                                 \
            }                                                                                  \
            p[i] = (T)(pi + lr * d);                                                           \
        }                                                                                      \
    }                                                                                          \
    /* torch.optim.Adam (wd: g += wd p) and AdamW (wd: p *= 1 - lr wd):                        \
     * m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; step_size = lr / (1 - b1^t);                \
     * p += -step_size * m / (sqrt(v) / sqrt(1 - b2^t) + eps) */                               \
    static void adam_##T(const nb_optim *o, double wd_, T *restrict p, const T *restrict g,    \
                         T *restrict m, T *restrict v, int64_t t, int64_t n) {                 \
        const C b1 = (C)o->beta1, b2 = (C)o->beta2, c1 = (C)(1 - o->beta1),                    \
                c2 = (C)(1 - o->beta2), eps = (C)o->eps, wd = (C)wd_;                          \
        const C step = (C)(-(o->lr / (1 - pow(o->beta1, (double)t))));                         \
        const C bc2_sqrt = (C)sqrt(1 - pow(o->beta2, (double)t));                              \
        const C decay = (C)(1 - o->lr * wd_);                                                  \
        if (o->kind == OPT_ADAMW) {                                                            \
            for (int64_t i = 0; i < n; i++) {                                                  \
                C gi = g[i], mi = m[i] * b1 + c1 * gi, vi = v[i] * b2 + c2 * gi * gi;          \
                m[i] = (T)mi;                                                                  \
                v[i] = (T)vi;                                                                  \
                p[i] = (T)((C)p[i] * decay + step * mi / (SQRT(vi) / bc2_sqrt + eps));         \
            }                                                                                  \
            return;                                                                            \
        }                                                                                      \
        for (int64_t i = 0; i < n; i++) {                                                      \
            C pi = p[i], gi = g[i];                                                            \
            if (wd != 0) gi = gi + wd * pi;                                                    \
            C mi = m[i] * b1 + c1 * gi, vi = v[i] * b2 + c2 * gi * gi;                         \
            m[i] = (T)mi;                                                                      \
            v[i] = (T)vi;                                                                      \
            p[i] = (T)(pi + step * mi / (SQRT(vi) / bc2_sqrt + eps));                          \
        }                                                                                      \
    }

DEFINE_KERNELS(float, float, sqrtf)
DEFINE_KERNELS(double, double, sqrt)

/* One parameter's update, elements [lo, hi) of it. */
typedef struct {
    const nb_optim *o;
    double wd;
    int64_t t;
    bool f64;
    void *p, *g, *m, *v;
} update_job;

#define AT(T, ptr, lo) ((ptr) ? (T *)(ptr) + (lo) : NULL)
static void update_span(void *ctx, int64_t lo, int64_t hi) {
    const update_job *j = ctx;
    int64_t n = hi - lo;
    if (j->o->kind == OPT_SGD) {
        if (j->f64) sgd_double(j->o, j->wd, AT(double, j->p, lo), AT(double, j->g, lo),
                               AT(double, j->m, lo), j->t == 1, n);
        else sgd_float(j->o, j->wd, AT(float, j->p, lo), AT(float, j->g, lo),
                       AT(float, j->m, lo), j->t == 1, n);
    } else {
        if (j->f64) adam_double(j->o, j->wd, AT(double, j->p, lo), AT(double, j->g, lo),
                                AT(double, j->m, lo), AT(double, j->v, lo), j->t, n);
        else adam_float(j->o, j->wd, AT(float, j->p, lo), AT(float, j->g, lo),
                        AT(float, j->m, lo), AT(float, j->v, lo), j->t, n);
    }
}

void nb_optim_step(nb_optim *o) {
    if (!o) {
        nn_null("nb_optim_step");
        return;
    }
    for (int i = 0; i < o->n; i++) {
        nb_tensor *p = o->params[i], *g = nb_grad(p);
        if (!g) continue;
        if (nb_dtype_of(g) != nb_dtype_of(p) || nb_numel(g) != nb_numel(p) ||
            !nb_is_contiguous(g) || !nb_is_contiguous(p)) {
            nn_error("nb_optim_step: parameter %d (%lld elements, %s) has a gradient of %lld "
                     "elements, %s%s; skipped", i, (long long)nb_numel(p),
                     nb_dtype_name(nb_dtype_of(p)), (long long)nb_numel(g),
                     nb_dtype_name(nb_dtype_of(g)),
                     nb_is_contiguous(g) ? "" : ", not contiguous");
            continue;
        }
        update_job j = {.o = o, .wd = o->wd_of[i], .t = ++*o->steps[i], .f64 = nb_dtype_of(p) == NB_F64,
                        .p = nb_data(p), .g = nb_data(g),
                        .m = o->m ? nb_data(o->m[i]) : NULL, .v = o->v ? nb_data(o->v[i]) : NULL};
        /* elementwise, so the same result for any split across threads */
        nb_parallel_for(nb_numel(p), 1 << 14, update_span, &j);
        nb_mark_modified(p); /* a graph that saved p can no longer backpropagate */
    }
}

void nb_optim_zero_grad(nb_optim *o) {
    if (!o) {
        nn_null("nb_optim_zero_grad");
        return;
    }
    for (int i = 0; i < o->n; i++) nb_zero_grad(o->params[i]);
}

void nb_optim_clear_grad(nb_optim *o) {
    if (!o) {
        nn_null("nb_optim_clear_grad");
        return;
    }
    for (int i = 0; i < o->n; i++) nb_clear_grad(o->params[i]);
}

void nb_optim_set_lr(nb_optim *o, double lr) {
    if (!o) {
        nn_null("nb_optim_set_lr");
        return;
    }
    if (!(lr >= 0)) {
        nn_error("nb_optim_set_lr: invalid learning rate %g (must be >= 0); keeping %g", lr,
                 o->lr);
        return;
    }
    o->lr = lr;
}

int nb_optim_set_weight_decay(nb_optim *o, const char *name, double weight_decay) {
    const char *fn = "nb_optim_set_weight_decay";
    if (!o) return (nn_null(fn), -1);
    if (!(weight_decay >= 0) || isinf(weight_decay))
        return (nn_error("%s: invalid weight_decay %g (must be >= 0 and finite)", fn,
                         weight_decay), -1);
    if (!name) {
        o->wd = weight_decay;
        for (int i = 0; i < o->n; i++) o->wd_of[i] = weight_decay;
        return 0;
    }
    int i = nn_index_get(&o->index, name);
    if (i < 0)
        return (nn_error("%s: the optimizer has no parameter \"%.200s\"", fn, name), -1);
    o->wd_of[i] = weight_decay;
    return 0;
}

double nb_optim_weight_decay(const nb_optim *o, const char *name) {
    const char *fn = "nb_optim_weight_decay";
    if (!o) return (nn_null(fn), NAN);
    if (!name) return o->wd;
    int i = nn_index_get(&o->index, name);
    if (i < 0) return (nn_error("%s: the optimizer has no parameter \"%.200s\"", fn, name), NAN);
    return o->wd_of[i];
}

double nb_optim_lr(const nb_optim *o) {
    if (!o) {
        nn_null("nb_optim_lr");
        return NAN;
    }
    return o->lr;
}

/* ------------------------------------------------------------ grad clipping */
/* torch.nn.utils.clip_grad_norm_ (norm_type 2): total = sqrt(sum of g^2 over
 * every gradient), coef = max_norm / (total + 1e-6), gradients are scaled by
 * coef when coef < 1. Returns total (0 when no parameter has a gradient), or
 * -1 on error.
 *
 * The sum runs on the thread pool (GPT-2's 124M gradients take ~85 ms as
 * one serial chain of double adds, ~15 ms this way on one thread) and gives
 * the same bits for any thread count: each gradient is cut into chunks of
 * CLIP_CHUNK elements, a fixed partition that does not depend on the thread
 * count; a chunk's sum of squares (in double) is kept in 8 lanes (element i
 * into lane i % 8, which compilers turn into vector adds) added up in a
 * fixed order at its end, and the chunks' sums are added in order, gradient
 * after gradient. */
#define CLIP_CHUNK 16384
#define CLIP_LANES 8

typedef struct {
    void *data;
    int64_t n, first; /* elements; its first chunk's index */
    bool f64;
} clip_grad;

typedef struct {
    clip_grad *g;
    int ng;
    double *partial; /* one per chunk */
    float scale_f;   /* the scaling pass: coef */
    double scale;
} clip_job;

#define DEFINE_SUMSQ(T)                                                                        \
    static double sumsq_##T(const T *x, int64_t n) {                                           \
        double acc[CLIP_LANES] = {0};                                                          \
        int64_t i = 0;                                                                         \
        for (; i + CLIP_LANES <= n; i += CLIP_LANES)                                           \
            for (int l = 0; l < CLIP_LANES; l++) acc[l] += (double)x[i + l] * (double)x[i + l]; \
        for (int l = 0; i < n; i++, l++) acc[l] += (double)x[i] * (double)x[i];                \
        return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])); \
    }
DEFINE_SUMSQ(float)
DEFINE_SUMSQ(double)

/* The gradient holding chunk c (binary search over the first chunks). */
static const clip_grad *clip_find(const clip_job *j, int64_t c) {
    int lo = 0, hi = j->ng - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (j->g[mid].first <= c) lo = mid;
        else hi = mid - 1;
    }
    return &j->g[lo];
}

/* Chunk c: its gradient, and its first element and length there. */
static const clip_grad *clip_chunk(const clip_job *j, int64_t c, int64_t *at, int64_t *n) {
    const clip_grad *g = clip_find(j, c);
    *at = (c - g->first) * CLIP_CHUNK;
    *n = g->n - *at < CLIP_CHUNK ? g->n - *at : CLIP_CHUNK;
    return g;
}

static void clip_sum_span(void *ctx, int64_t lo, int64_t hi) {
    clip_job *j = ctx;
    for (int64_t c = lo; c < hi; c++) {
        int64_t at, n;
        const clip_grad *g = clip_chunk(j, c, &at, &n);
        j->partial[c] = g->f64 ? sumsq_double((const double *)g->data + at, n)
                               : sumsq_float((const float *)g->data + at, n);
    }
}

static void clip_scale_span(void *ctx, int64_t lo, int64_t hi) {
    clip_job *j = ctx;
    for (int64_t c = lo; c < hi; c++) {
        int64_t at, n;
        const clip_grad *g = clip_chunk(j, c, &at, &n);
        if (g->f64) {
            double *d = (double *)g->data + at, k = j->scale;
            for (int64_t i = 0; i < n; i++) d[i] *= k;
        } else {
            float *d = (float *)g->data + at, k = j->scale_f;
            for (int64_t i = 0; i < n; i++) d[i] *= k;
        }
    }
}

double nb_clip_grad_norm(nb_params *ps, double max_norm) {
    const char *fn = "nb_clip_grad_norm";
    if (!ps) return (nn_error("%s: parameter registry is NULL", fn), -1.0);
    if (!(max_norm >= 0)) return (nn_error("%s: invalid max_norm %g (must be >= 0)", fn, max_norm), -1.0);
    int n = nb_params_count(ps);
    for (int i = 0; i < n; i++) {
        nb_tensor *g = nb_grad(nb_params_at(ps, i, NULL));
        if (g && !nb_is_contiguous(g))
            return (nn_error("%s: the gradient of parameter %d is not contiguous", fn, i), -1.0);
    }
    clip_job j = {.g = malloc(sizeof(clip_grad) * (size_t)(n > 0 ? n : 1))};
    if (!j.g) return (nn_error("%s: out of memory", fn), -1.0);
    int64_t chunks = 0;
    for (int i = 0; i < n; i++) {
        nb_tensor *g = nb_grad(nb_params_at(ps, i, NULL));
        if (!g || nb_numel(g) == 0) continue;
        j.g[j.ng++] = (clip_grad){.data = nb_data(g), .n = nb_numel(g), .first = chunks,
                                  .f64 = nb_dtype_of(g) == NB_F64};
        chunks += (nb_numel(g) + CLIP_CHUNK - 1) / CLIP_CHUNK;
    }
    if (chunks == 0) {
        free(j.g);
        return 0;
    }
    j.partial = malloc(sizeof(double) * (size_t)chunks);
    if (!j.partial) {
        free(j.g);
        return (nn_error("%s: out of memory", fn), -1.0);
    }
    nb_parallel_for(chunks, 4, clip_sum_span, &j);
    double sum = 0;
    for (int64_t c = 0; c < chunks; c++) sum += j.partial[c];
    double total = sqrt(sum);
    double coef = max_norm / (total + 1e-6);
    if (coef < 1) { /* torch multiplies by min(coef, 1): 1 changes nothing */
        j.scale = coef;
        j.scale_f = (float)coef;
        nb_parallel_for(chunks, 4, clip_scale_span, &j);
    }
    free(j.partial);
    free(j.g);
    return total;
}
