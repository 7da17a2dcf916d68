/* accumulate.c: the sums the backward engine adds gradients up with.
 *
 * They sit here, in the tensor layer, rather than being ops, because the
 * engine (autograd/) is below ops/: ops record nodes with it, so the engine
 * must not call them back. Gradients meeting at a tensor have its shape and
 * dtype, so these need no broadcasting, no promotion and no argument checks;
 * either operand may be any view (an expanded gradient has stride 0). */
#include "tensor_internal.h"

#include "bf16_internal.h"

/* Elements per range below which splitting across threads does not pay
 * (one add per element; ops/ uses the same grain for its arithmetic). */
#define ADD_GRAIN ((int64_t)1 << 12)

/* out = a + b over one shape, any strides; out may be a itself. */
typedef struct {
    nbi_iter it;
    nb_dtype dt;
    char *po;
    const char *pa, *pb;
} add_job;

/* Each element is one rounding of a + b, so where the ranges fall (which
 * depends on the thread count) never changes a bit of the result. */
#define ADD_ROWS(T)                                                                      \
    NBI_FOR_SPAN(&j->it, lo, hi, c, jb, je) {                                            \
        T *o = (T *)j->po + c.off[0] + jb * so;                                          \
        const T *xa = (const T *)j->pa + c.off[1] + jb * sa;                             \
        const T *xb = (const T *)j->pb + c.off[2] + jb * sb;                             \
        int64_t len = je - jb;                                                           \
        if (so == 1 && sa == 1 && sb == 1) {                                             \
            for (int64_t i = 0; i < len; i++) o[i] = ADD(xa[i], xb[i]);                 \
        } else {                                                                         \
            for (int64_t i = 0; i < len; i++) o[i * so] = ADD(xa[i * sa], xb[i * sb]);   \
        }                                                                                \
    }
/* bf16: the sum of the two exact f32 values, rounded once to bf16 */
#define ADD_BF16(x, y) nbi_bf16_from_f32(nbi_bf16_to_f32(x) + nbi_bf16_to_f32(y))
#define ADD_PLAIN(x, y) ((x) + (y))

NBI_CLONES static void add_span(void *ctx, int64_t lo, int64_t hi) {
    const add_job *j = ctx;
    int64_t so = NBI_INNER(&j->it, 0), sa = NBI_INNER(&j->it, 1), sb = NBI_INNER(&j->it, 2);
#define ADD ADD_PLAIN
    if (j->dt == NB_F64) ADD_ROWS(double)
    else if (j->dt == NB_F32) ADD_ROWS(float)
#undef ADD
#define ADD ADD_BF16
    else ADD_ROWS(uint16_t)
#undef ADD
}

static void add(nb_tensor *out, const nb_tensor *a, const nb_tensor *b) {
    const int64_t *st[3] = {out->strides, a->strides, b->strides};
    add_job j = {.dt = out->dtype, .po = nbi_ptr(out), .pa = nbi_ptr(a),
                 .pb = nbi_ptr(b)};
    nbi_iter_init(&j.it, out->ndim, out->shape, 3, st);
    nbi_parallel_for(out->numel, ADD_GRAIN, add_span, &j);
}

void nbi_add_into(nb_tensor *dst, const nb_tensor *src) { add(dst, dst, src); }

nb_tensor *nbi_add_new(const char *fn, const nb_tensor *a, const nb_tensor *b) {
    nb_tensor *y = nbi_new_like(fn, a, false);
    if (y) add(y, a, b);
    return y;
}
