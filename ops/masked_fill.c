/* masked_fill.c: nb_masked_fill(t, mask, value), PyTorch's out-of-place
 * masked_fill: value where the NB_BOOL mask is true, t elsewhere.
 *
 * t and mask broadcast against each other and the result has the broadcast
 * shape, as torch.Tensor.masked_fill does (a mask with more dims than t makes
 * a bigger result). Attention uses it with a padding mask (B,1,1,Lk), a
 * causal mask (Lq,Lk) or both (B,1,Lq,Lk) on scores (B,H,Lq,Lk), and
 * value = -INFINITY (softmax then gives 0 there). */
#include <math.h>

#include "ops_internal.h"

/* ---------------------------------------------------------------- kernel */
/* x (S) read with xst, mask read with mst -> out (S) contiguous:
 * out = mask ? value : x. Forward fills with the value, backward with 0.
 * Element ranges run on the thread pool. */
typedef struct {
    nbi_iter it;
    nb_dtype dt;
    double value;
    char *po;
    const char *px;
    const bool *pm;
} fill_job;

#define FILL_ROWS(T)                                                              \
    do {                                                                          \
        const T v = (T)j->value;                                                  \
        NBI_FOR_SPAN(&j->it, lo, hi, c, jb, je) {                                 \
            T *o = (T *)j->po + c.off[0] + jb * s0;                               \
            const T *x = (const T *)j->px + c.off[1] + jb * s1;                   \
            const bool *m = j->pm + c.off[2] + jb * s2;                           \
            for (int64_t i = 0; i < je - jb; i++) o[i * s0] = m[i * s2] ? v : x[i * s1]; \
        }                                                                         \
    } while (0)

/* Rows whose three strides are 1 (attention's scores and masks) take a loop
 * the compiler vectorizes; built for AVX2 and AVX-512BW too, picked at run
 * time. A select, so every path gives the same bits. */
#define DEFINE_FILL_SPAN(NAME, ATTR)                                                  \
    ATTR static void NAME(void *ctx, int64_t lo, int64_t hi) {                        \
        const fill_job *j = ctx;                                                      \
        int64_t s0 = NBI_INNER(&j->it, 0), s1 = NBI_INNER(&j->it, 1);                 \
        int64_t s2 = NBI_INNER(&j->it, 2);                                            \
        bool unit = s0 == 1 && s1 == 1 && s2 == 1;                                    \
        if (j->dt == NB_F32 && unit) FILL_ROWS_UNIT(float);                           \
        else if (j->dt == NB_F32) FILL_ROWS(float);                                   \
        else if (unit) FILL_ROWS_UNIT(double);                                        \
        else FILL_ROWS(double);                                                       \
    }
#define FILL_ROWS_UNIT(T)                                                             \
    do {                                                                              \
        const T v = (T)j->value;                                                      \
        NBI_FOR_SPAN(&j->it, lo, hi, c, jb, je) {                                     \
            T *restrict o = (T *)j->po + c.off[0] + jb;                               \
            const T *restrict x = (const T *)j->px + c.off[1] + jb;                   \
            /* bytes, not bool: gcc vectorizes no loads of _Bool */                   \
            const unsigned char *restrict m = (const unsigned char *)j->pm + c.off[2] + jb; \
            for (int64_t i = 0; i < je - jb; i++) { /* both read: a branch-free select */ \
                T xi = x[i];                                                          \
                o[i] = m[i] ? v : xi;                                                 \
            }                                                                         \
        }                                                                             \
    } while (0)
DEFINE_FILL_SPAN(fill_span, )
#if defined(__x86_64__) && (defined(__clang__) || defined(__GNUC__))
DEFINE_FILL_SPAN(fill_span_avx2, __attribute__((target("avx2"))))
DEFINE_FILL_SPAN(fill_span_avx512, __attribute__((target("avx512f,avx512bw"))))
#define HAVE_AVX_FILL 1
#endif

static nbi_range_fn fill_kernel(void) {
#ifdef HAVE_AVX_FILL
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512bw")) return fill_span_avx512;
    if (__builtin_cpu_supports("avx2")) return fill_span_avx2;
#endif
    return fill_span;
}

static void fill_where(nb_tensor *out, const nb_tensor *x, const int64_t *xst,
                       const nb_tensor *mask, double value) {
    int64_t mst[NB_MAX_DIMS];
    nbi_broadcast_strides(mask, out->ndim, out->shape, mst);
    const int64_t *st[3] = {out->strides, xst, mst};
    fill_job j = {.dt = out->dtype, .value = value, .po = nbi_ptr(out), .px = nbi_ptr(x),
                  .pm = nbi_ptr(mask)};
    nbi_iter_init(&j.it, out->ndim, out->shape, 3, st);
    nbi_parallel_for(out->numel, NBI_GRAIN, fill_kernel(), &j);
}

/* ------------------------------------------------------------- backward */
/* g (S) any strides, mask broadcast to S -> g with zeros where mask is true
 * (masked_fill itself: recorded under create_graph), summed back to t's
 * shape. node->in = {t, mask}. */
static int masked_fill_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    const nb_tensor *t = n->in[0]; /* its shape only */
    if (!nbi_wants(n, 0)) return 0;
    gin[0] = nbi_sum_to(nb_masked_fill(g, nbi_saved_in(n, 1), 0), t->ndim, t->shape);
    return gin[0] ? 0 : -1;
}

/* t's tangent (St) -> zeros where mask is true (broadcast(St, Sm)) */
static nb_tensor *masked_fill_jvp(nbi_node *n, nb_tensor *const *tin) {
    if (!tin[0]) return nbi_zero_tangent(n);
    return nb_masked_fill(tin[0], nbi_saved_in(n, 1), 0);
}

/* -------------------------------------------------------------- forward */
/* t (St), mask (Sm) bool -> out (broadcast(St, Sm)) contiguous. */
nb_tensor *nb_masked_fill(nb_tensor *t, nb_tensor *mask, double value) {
    const char *fn = "nb_masked_fill";
    if (!nbi_arg(fn, t, 0) || !nbi_arg(fn, mask, 1)) return NULL;
    if (!nbi_check_float(fn, t)) return NULL;
    if (mask->dtype != NB_BOOL)
        return nbi_error("%s: mask must be bool, got %s", fn, nb_dtype_name(mask->dtype));
    int nd;
    int64_t shape[NB_MAX_DIMS];
    if (!nbi_broadcast_shape(fn, t->ndim, t->shape, mask->ndim, mask->shape, &nd, shape))
        return NULL;
    nb_tensor *out = nbi_new(fn, t->dtype, nd, shape, false);
    if (!out) return NULL;
    int64_t tst[NB_MAX_DIMS];
    nbi_broadcast_strides(t, nd, shape, tst);
    fill_where(out, t, tst, mask, value);
    if (nbi_needs_grad(1, &t)) {
        nb_tensor *ins[2] = {t, mask};
        /* Filling with -inf (attention's masks) makes infinities on purpose,
         * and the rest of out is t's values, already checked where made: no
         * anomaly check then. */
        nbi_node *node = isfinite(value) ? nbi_record(out, fn, masked_fill_backward, 2, ins)
                                         : nbi_record_unchecked(out, fn, masked_fill_backward,
                                                                2, ins);
        if (!node) return nbi_discard(out);
        nbi_save(node, NBI_SAVE_IN(1)); /* backward reads the mask, not t */
        node->d[0] = value;
        node->jvp = masked_fill_jvp;
    }
    return out;
}
