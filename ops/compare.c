/* compare.c: comparisons and logic (bool results, no gradient) and
 * nb_where, which passes gradient to the branch each element came from. */
#include "ops_internal.h"

typedef enum { C_EQ, C_NE, C_LT, C_GT } cmpop;

/* a (...), b (...) broadcast -> bool (broadcast shape) */
#define CMP_ROWS(T, EXPR)                                                         \
    NBI_FOR_ROWS(&it, c) {                                                        \
        bool *o = (bool *)po + c.off[0];                                          \
        const T *xa = (const T *)pa + c.off[1], *xb = (const T *)pb + c.off[2];   \
        for (int64_t j = 0; j < it.n; j++) {                                      \
            T x = xa[j * sa], y = xb[j * sb];                                     \
            o[j * so] = (EXPR);                                                   \
        }                                                                         \
    }
#define CMP_CASES(T)                           \
    switch (op) {                              \
    case C_EQ: CMP_ROWS(T, x == y); break;     \
    case C_NE: CMP_ROWS(T, x != y); break;     \
    case C_LT: CMP_ROWS(T, x < y); break;      \
    case C_GT: CMP_ROWS(T, x > y); break;      \
    }

static nb_tensor *compare(const char *fn, cmpop op, nb_tensor *a, nb_tensor *b) {
    if (!nbi_arg(fn, a, 0) || !nbi_arg(fn, b, 1)) return NULL;
    if (!nbi_check_no_bf16(fn, a) || !nbi_check_same_dtype(fn, a, b)) return NULL;
    int nd;
    int64_t sh[NB_MAX_DIMS], sta[NB_MAX_DIMS], stb[NB_MAX_DIMS];
    if (!nbi_broadcast_shape(fn, a->ndim, a->shape, b->ndim, b->shape, &nd, sh)) return NULL;
    nb_tensor *y = nbi_new(fn, NB_BOOL, nd, sh, false);
    if (!y) return NULL;
    nbi_broadcast_strides(a, nd, sh, sta);
    nbi_broadcast_strides(b, nd, sh, stb);
    const int64_t *st[3] = {y->strides, sta, stb};
    nbi_iter it;
    nbi_iter_init(&it, nd, sh, 3, st);
    void *po = nbi_ptr(y);
    const void *pa = nbi_ptr(a), *pb = nbi_ptr(b);
    int64_t so = NBI_INNER(&it, 0), sa = NBI_INNER(&it, 1), sb = NBI_INNER(&it, 2);
    switch (a->dtype) {
    case NB_F32: CMP_CASES(float) break;
    case NB_F64: CMP_CASES(double) break;
    case NB_I64: CMP_CASES(int64_t) break;
    case NB_BOOL: CMP_CASES(bool) break;
    case NB_BF16: break; /* refused by the checks above */
    }
    return y;
}

nb_tensor *nb_eq(nb_tensor *a, nb_tensor *b) { return compare("nb_eq", C_EQ, a, b); }
nb_tensor *nb_ne(nb_tensor *a, nb_tensor *b) { return compare("nb_ne", C_NE, a, b); }
nb_tensor *nb_lt(nb_tensor *a, nb_tensor *b) { return compare("nb_lt", C_LT, a, b); }
nb_tensor *nb_gt(nb_tensor *a, nb_tensor *b) { return compare("nb_gt", C_GT, a, b); }

static bool check_bool(const char *fn, const char *what, const nb_tensor *t) {
    if (t->dtype == NB_BOOL) return true;
    nbi_error("%s: %s must be bool, got %s", fn, what, nb_dtype_name(t->dtype));
    return false;
}

nb_tensor *nb_logical_not(nb_tensor *mask) {
    const char *fn = "nb_logical_not";
    if (!nbi_arg(fn, mask, 0)) return NULL;
    if (!check_bool(fn, "mask", mask)) return NULL;
    nb_tensor *y = nbi_new_like(fn, mask, false);
    if (!y) return NULL;
    nbi_copy_strided(y, mask->strides, mask);
    bool *p = nbi_ptr(y);
    for (int64_t i = 0; i < y->numel; i++) p[i] = !p[i];
    return y;
}

/* ------------------------------------------------------------------ where */
/* cond (...), a (...), b (...) broadcast -> out (broadcast shape) */
#define WHERE_ROWS(T)                                                             \
    NBI_FOR_ROWS(&it, c) {                                                        \
        T *o = (T *)po + c.off[0];                                                \
        const bool *k = (const bool *)pc + c.off[1];                              \
        const T *xa = (const T *)pa + c.off[2], *xb = (const T *)pb + c.off[3];   \
        for (int64_t j = 0; j < it.n; j++)                                        \
            o[j * so] = k[j * sc] ? xa[j * sa] : xb[j * sb];                      \
    }

static void where_into(nb_tensor *y, const nb_tensor *cond, const nb_tensor *a,
                       const nb_tensor *b) {
    int64_t stc[NB_MAX_DIMS], sta[NB_MAX_DIMS], stb[NB_MAX_DIMS];
    nbi_broadcast_strides(cond, y->ndim, y->shape, stc);
    nbi_broadcast_strides(a, y->ndim, y->shape, sta);
    nbi_broadcast_strides(b, y->ndim, y->shape, stb);
    const int64_t *st[4] = {y->strides, stc, sta, stb};
    nbi_iter it;
    nbi_iter_init(&it, y->ndim, y->shape, 4, st);
    void *po = nbi_ptr(y);
    const void *pc = nbi_ptr(cond), *pa = nbi_ptr(a), *pb = nbi_ptr(b);
    int64_t so = NBI_INNER(&it, 0), sc = NBI_INNER(&it, 1), sa = NBI_INNER(&it, 2),
            sb = NBI_INNER(&it, 3);
    switch (y->dtype) {
    case NB_F32: WHERE_ROWS(float) break;
    case NB_F64: WHERE_ROWS(double) break;
    case NB_I64: WHERE_ROWS(int64_t) break;
    case NB_BOOL: WHERE_ROWS(bool) break;
    case NB_BF16: break; /* refused by the checks above */
    }
}

/* g flows to a where cond holds and to b elsewhere */
static int where_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    nb_tensor *cond = nbi_saved_in(n, 0), *zero = nb_scalar(g->dtype, 0);
    if (nbi_wants(n, 1) &&
        !(gin[1] = nbi_sum_to(nb_where(cond, g, zero), n->in[1]->ndim, n->in[1]->shape)))
        return -1;
    if (nbi_wants(n, 2) &&
        !(gin[2] = nbi_sum_to(nb_where(cond, zero, g), n->in[2]->ndim, n->in[2]->shape)))
        return -1;
    return 0;
}

/* where(cond, ta, tb), a NULL tangent as zeros (cond's is always NULL),
 * expanded to the output's shape (a zero does not broadcast it) */
static nb_tensor *where_jvp(nbi_node *n, nb_tensor *const *tin) {
    if (!tin[1] && !tin[2]) return nbi_zero_tangent(n);
    nb_tensor *zero = nb_scalar(n->out->dtype, 0);
    nb_tensor *t = nb_where(nbi_saved_in(n, 0), tin[1] ? tin[1] : zero, tin[2] ? tin[2] : zero);
    return nb_expand(t, n->out->ndim, n->out->shape);
}

nb_tensor *nb_where(nb_tensor *cond, nb_tensor *a, nb_tensor *b) {
    const char *fn = "nb_where";
    if (!nbi_arg(fn, cond, 0) || !nbi_arg(fn, a, 1) || !nbi_arg(fn, b, 2)) return NULL;
    if (!check_bool(fn, "cond", cond) || !nbi_check_no_bf16(fn, a) ||
        !nbi_check_same_dtype(fn, a, b))
        return NULL;
    int n1, n2;
    int64_t s1[NB_MAX_DIMS], s2[NB_MAX_DIMS];
    if (!nbi_broadcast_shape(fn, cond->ndim, cond->shape, a->ndim, a->shape, &n1, s1) ||
        !nbi_broadcast_shape(fn, n1, s1, b->ndim, b->shape, &n2, s2))
        return NULL;
    nb_tensor *y = nbi_new(fn, a->dtype, n2, s2, false);
    if (!y) return NULL;
    where_into(y, cond, a, b);
    nb_tensor *in[3] = {cond, a, b};
    if (nbi_is_float(a->dtype) && nbi_needs_grad(3, in)) {
        nbi_node *node = nbi_record(y, fn, where_backward, 3, in);
        if (!node) return nbi_discard(y);
        nbi_save(node, NBI_SAVE_IN(0));
        node->jvp = where_jvp;
    }
    return y;
}
