/* dropout.c: nb_dropout(t, p, training, rng), inverted dropout.
 *
 * Element i (its row-major logical index in t, whatever t's strides) is kept
 * iff u(seed, base + i) >= p, where u is the counter-based uniform stream of
 * tensor/rng.c and base is the first of numel draws reserved on rng (NULL =
 * the global generator); kept values are multiplied by 1/(1-p), computed in
 * t's dtype. So the mask depends only on (seed, base, i): not on the strides
 * of t, not on the thread count.
 *
 * No mask tensor is stored for backward. The node keeps just (seed, base, p)
 * in node->i[] / node->d[] and backward regenerates the very same mask from
 * the stream, which is what a counter-based generator makes free: dropout
 * costs no memory beyond its output, unlike a saved bool/float mask of the
 * input's size per dropout layer.
 *
 * Special cases: !training or p == 0 returns a new handle on t (identity
 * gradient, no draws); p == 1 returns t * 0 (gradient g * 0, no draws). */
#include "ops_internal.h"

#include <math.h>
#include <string.h>

/* uint64 <-> the int64 slots of a node, bit for bit */
static int64_t to_slot(uint64_t u) {
    int64_t s;
    memcpy(&s, &u, sizeof s);
    return s;
}
static uint64_t from_slot(int64_t s) {
    uint64_t u;
    memcpy(&u, &s, sizeof u);
    return u;
}

/* dst (S) contiguous <- src (S) any strides, multiplied by the mask of
 * (seed, base) scaled: 1/(1-p) where kept, 0 where dropped, so a dropped
 * inf or NaN gives NaN and a dropped negative -0, as PyTorch's x * mask.
 * p == 1 drops everything (u < 1) and needs no draws.
 *
 * u = (z >> 11) * 2^-53 >= p is tested as (z >> 11) >= ceil(p * 2^53), the
 * same decision in integers. Element ranges run on the thread pool; each row
 * segment is one loop the compiler vectorizes (the 64-bit multiplies of the
 * hash want AVX-512DQ, so that variant is built too and picked at run time;
 * integer arithmetic gives identical masks on every path). */
typedef struct {
    nbi_iter it;
    nb_dtype dt;
    uint64_t key, base, thr;
    double scale;
    char *pd;
    const char *ps;
} mask_job;

#define MASK_ROW(T)                                                                      \
    do {                                                                                 \
        const T scale = (T)j->scale;                                                     \
        NBI_FOR_SPAN(&j->it, lo, hi, c, jb, je) {                                        \
            T *o = (T *)j->pd + c.off[0] + jb * sd;                                      \
            const T *x = (const T *)j->ps + c.off[1] + jb * ss;                          \
            uint64_t h = j->key + (j->base + (uint64_t)(c.row * j->it.n + jb) + 1) *     \
                                      0x9E3779B97F4A7C15ULL;                             \
            int64_t len = je - jb;                                                       \
            for (int64_t i = 0; i < len; i++) {                                          \
                uint64_t z = nbi_mix64(h + (uint64_t)i * 0x9E3779B97F4A7C15ULL);         \
                o[i * sd] = x[i * ss] * ((z >> 11) >= j->thr ? scale : (T)0);            \
            }                                                                            \
        }                                                                                \
    } while (0)

#define DEFINE_MASK_SPAN(NAME, ATTR)                                                     \
    ATTR static void NAME(void *ctx, int64_t lo, int64_t hi) {                           \
        const mask_job *j = ctx;                                                         \
        int64_t sd = NBI_INNER(&j->it, 0), ss = NBI_INNER(&j->it, 1);                    \
        if (j->dt == NB_F32) MASK_ROW(float);                                            \
        else MASK_ROW(double);                                                           \
    }
DEFINE_MASK_SPAN(mask_span, )
#if defined(__x86_64__) && (defined(__clang__) || defined(__GNUC__))
DEFINE_MASK_SPAN(mask_span_avx512, __attribute__((target("avx512f,avx512dq"))))
#define HAVE_AVX512_MASK 1
#endif

static nbi_range_fn mask_kernel(void) {
#ifdef HAVE_AVX512_MASK
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512dq")) return mask_span_avx512;
#endif
    return mask_span;
}

static void apply_mask(nb_tensor *dst, const nb_tensor *src, uint64_t seed, uint64_t base,
                       double p) {
    mask_job j = {.dt = dst->dtype, .key = nbi_rng_key(seed), .base = base,
                  .thr = (uint64_t)ceil(p * 0x1p53), .scale = 1.0 / (1.0 - p),
                  .pd = nbi_ptr(dst), .ps = nbi_ptr(src)};
    if (dst->dtype == NB_F32) j.scale = 1.0f / (float)(1.0 - p); /* the scale in f32, as before */
    const int64_t *st[2] = {dst->strides, src->strides};
    nbi_iter_init(&j.it, dst->ndim, dst->shape, 2, st);
    nbi_parallel_for(dst->numel, NBI_GRAIN_HEAVY, mask_kernel(), &j);
}

/* t (S) any strides -> t * mask / (1-p) (S) contiguous, the mask of
 * (seed, base); recorded when t requires grad, with (seed, base) in
 * node->i[0], node->i[1] and p in node->d[0]. The op is linear: its backward
 * and its tangent rule apply the same mask again (this op, so that under
 * create_graph the gradient is recorded too). */
static nb_tensor *mask_op(const char *fn, nb_tensor *t, uint64_t seed, uint64_t base, double p);

static int dropout_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    if (!nbi_wants(n, 0)) return 0;
    gin[0] = mask_op(n->op, g, from_slot(n->i[0]), from_slot(n->i[1]), n->d[0]);
    return gin[0] ? 0 : -1;
}
static nb_tensor *dropout_jvp(nbi_node *n, nb_tensor *const *tin) {
    return mask_op(n->op, tin[0], from_slot(n->i[0]), from_slot(n->i[1]), n->d[0]);
}

static nb_tensor *mask_op(const char *fn, nb_tensor *t, uint64_t seed, uint64_t base, double p) {
    nb_tensor *y = nbi_new(fn, t->dtype, t->ndim, t->shape, false);
    if (!y) return NULL;
    apply_mask(y, t, seed, base, p);
    if (!nbi_needs_grad(1, &t)) return y;
    nbi_node *node = nbi_record(y, fn, dropout_backward, 1, &t);
    if (!node) return nbi_discard(y);
    nbi_save(node, 0); /* nothing: the mask is regenerated from the stream */
    node->i[0] = to_slot(seed);
    node->i[1] = to_slot(base);
    node->d[0] = p;
    node->jvp = dropout_jvp;
    return y;
}

/* -------------------------------------------------------------- forward */
/* t (S) any strides -> (S) contiguous (or an alias of t, see above). */
nb_tensor *nb_dropout(nb_tensor *t, double p, bool training, nb_rng *rng) {
    const char *fn = "nb_dropout";
    if (!nbi_arg(fn, t, 0)) return NULL;
    if (!(p >= 0.0 && p <= 1.0)) /* also rejects NaN */
        return nbi_error("%s: p must be in [0, 1], got %g", fn, p);
    if (!nbi_check_float(fn, t)) return NULL;
    if (!training || p == 0.0) return nbi_alias(fn, t);

    uint64_t seed = 0, base = 0;
    if (p < 1.0) {
        base = nbi_rng_take(rng, (uint64_t)t->numel, &seed);
    }
    return mask_op(fn, t, seed, base, p);
}
