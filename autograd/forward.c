/* forward.c: forward-mode derivatives (nb_jvp), as torch.func.jvp.
 *
 * nb_jvp runs the function once, on primals that carry the tangents, and
 * pushes the tangents through the ops it ran, in the order it ran them:
 * each op's tangent rule (nbi_node.jvp) maps its inputs' tangents to its
 * output's. No backward rule runs. The ops are found through the graph the
 * run records, so an op without a tangent rule is an error naming it, never
 * a tangent silently left at zero. */
#include "autograd_internal.h"

#include <stdlib.h>
#include <string.h>

static const char *FN = "nb_jvp";

/* tensor -> its tangent (NULL: zero), open addressing by address */
typedef struct {
    nb_tensor *t, *tan;
} slot;
typedef struct {
    slot *v;
    size_t n, cap; /* cap: a power of two */
} tangent_map;

static size_t hash(const nb_tensor *t, size_t cap) {
    return (size_t)(((uintptr_t)t >> 4) * 0x9E3779B97F4A7C15ULL) & (cap - 1);
}

static slot *find(tangent_map *m, nb_tensor *t, bool insert) {
    if (insert && 2 * (m->n + 1) > m->cap) {
        size_t cap = m->cap ? 2 * m->cap : 64;
        slot *v = calloc(cap, sizeof *v);
        if (!v) return NULL;
        for (size_t k = 0; k < m->cap; k++) {
            if (!m->v[k].t) continue;
            size_t h = hash(m->v[k].t, cap);
            while (v[h].t) h = (h + 1) & (cap - 1);
            v[h] = m->v[k];
        }
        free(m->v);
        m->v = v;
        m->cap = cap;
    }
    if (!m->cap) return NULL;
    size_t h = hash(t, m->cap);
    while (m->v[h].t && m->v[h].t != t) h = (h + 1) & (m->cap - 1);
    if (m->v[h].t) return &m->v[h];
    if (!insert) return NULL;
    m->v[h].t = t;
    m->n++;
    return &m->v[h];
}

static void map_free(tangent_map *m) {
    for (size_t k = 0; k < m->cap; k++) nbi_unref(m->v[k].tan);
    free(m->v);
}

/* The tangent of t (its node's inputs done first: post-order, iterative). */
typedef struct {
    nb_tensor *t;
    int next;
} frame;

static int tangent_of_node(tangent_map *m, nb_tensor *t) {
    nbi_node *n = t->grad_fn;
    nb_tensor *tin_inline[NBI_NODE_INLINE] = {0}, **tin = tin_inline;
    if (n->nin > NBI_NODE_INLINE && !(tin = calloc((size_t)n->nin, sizeof *tin)))
        return (nbi_error("%s: out of memory", FN), -1);
    bool any = false;
    for (int i = 0; i < n->nin; i++) {
        slot *s = find(m, n->in[i], false);
        tin[i] = s ? s->tan : NULL;
        any = any || tin[i];
    }
    int rc = 0;
    nb_tensor *tan = NULL;
    if (any && !n->jvp) {
        rc = (nbi_error("%s: %s has no forward-mode (tangent) rule; compute this derivative "
                        "with nb_autograd_grad (reverse mode) instead", FN, n->op), -1);
    } else if (any) {
        nbi_autocast_frame ac = nbi_autocast_isolate(n->autocast); /* as its forward ran */
        tan = n->jvp(n, tin);
        nbi_autocast_restore(ac);
        if (!tan) rc = -1;
        else if (!nbi_same_shape(tan, t) || tan->dtype != t->dtype)
            rc = (nbi_error("%s: internal error: the tangent rule of %s gave shape %s %s for an "
                            "output of shape %s %s", FN, n->op, NBI_SHAPE(tan),
                            nb_dtype_name(tan->dtype), NBI_SHAPE(t), nb_dtype_name(t->dtype)), -1);
    }
    slot *s = rc == 0 ? find(m, t, true) : NULL;
    if (rc == 0 && !s) rc = (nbi_error("%s: out of memory", FN), -1);
    if (rc == 0 && tan) {
        nbi_ref(tan);
        s->tan = tan;
    }
    if (tin != tin_inline) free(tin);
    return rc;
}

static int push_tangents(tangent_map *m, nb_tensor *root) {
    size_t cap = 64, n = 0;
    frame *st = malloc(cap * sizeof *st);
    if (!st) return (nbi_error("%s: out of memory", FN), -1);
    int rc = 0;
    if (root->grad_fn && !find(m, root, false)) st[n++] = (frame){root, 0};
    while (rc == 0 && n) {
        frame *f = &st[n - 1];
        nbi_node *node = f->t->grad_fn;
        if (f->next < node->nin) {
            nb_tensor *in = node->in[f->next++];
            if (!in->grad_fn || find(m, in, false)) continue; /* a leaf, or done */
            if (n == cap) {
                frame *p = realloc(st, 2 * cap * sizeof *p);
                if (!p) {
                    rc = (nbi_error("%s: out of memory", FN), -1);
                    break;
                }
                st = p;
                cap *= 2;
            }
            st[n++] = (frame){in, 0};
            continue;
        }
        rc = tangent_of_node(m, f->t);
        n--;
    }
    free(st);
    return rc;
}

static int check_args(int n, nb_tensor **inputs, nb_tensor **tangents, nb_tensor **out,
                      nb_tensor **out_tangent) {
    if (!out || !out_tangent) return (nbi_error("%s: out and out_tangent are needed", FN), -1);
    *out = *out_tangent = NULL;
    if (n < 1 || !inputs || !tangents)
        return (nbi_error("%s: needs inputs and tangents (n = %d)", FN, n), -1);
    for (int i = 0; i < n; i++) {
        if (!nbi_arg(FN, inputs[i], i)) return -1;
        nb_tensor *t = tangents[i], *x = inputs[i];
        if (!t) continue;
        if (!nbi_live(t) && !nbi_bad_arg_named(FN, "tangent", t, i)) return -1;
        if (!nbi_is_diff(x->dtype))
            return (nbi_error("%s: input %d is %s; only floating inputs have tangents", FN, i,
                              nb_dtype_name(x->dtype)), -1);
        if (!nbi_same_shape(t, x) || t->dtype != x->dtype)
            return (nbi_error("%s: tangent %d of shape %s %s does not match input %d's %s %s",
                              FN, i, NBI_SHAPE(t), nb_dtype_name(t->dtype), i, NBI_SHAPE(x),
                              nb_dtype_name(x->dtype)), -1);
    }
    return 0;
}

/* fn on the primals, in the scope open now: its output (held), or NULL. */
static nb_tensor *run_fn(nb_fn fn, void *ctx, int n, nb_tensor **primals) {
    nbi_callback cb = {.who_fmt = "the function"};
    nbi_callback_enter(&cb, FN, false);
    nb_tensor *y = fn(primals, n, ctx);
    if (nbi_callback_leave(&cb) != 0) return NULL;
    if (!nbi_fn_returned(FN, y)) return NULL;
    if (!nbi_is_diff(y->dtype))
        return nbi_error("%s: the function returned a %s tensor; its output must be floating",
                         FN, nb_dtype_name(y->dtype));
    nbi_ref(y);
    return y;
}

int nb_jvp(nb_fn fn, void *ctx, int n, nb_tensor **inputs, nb_tensor **tangents, nb_tensor **out,
           nb_tensor **out_tangent) {
    if (!fn) {
        if (out) *out = NULL;
        if (out_tangent) *out_tangent = NULL;
        return (nbi_error("%s: the function is NULL", FN), -1);
    }
    if (check_args(n, inputs, tangents, out, out_tangent) != 0) return -1;
    nb_tensor **primals = calloc((size_t)n, sizeof *primals);
    tangent_map m = {0};
    if (!primals) return (nbi_error("%s: out of memory", FN), -1);
    bool was_off = nbi_grad_off;
    nbi_grad_off = false; /* the run records, so that every op it ran can be found */
    nb_scope_begin();
    int rc = 0;
    for (int i = 0; rc == 0 && i < n; i++) { /* primals: the inputs, with no history */
        nb_tensor *x = inputs[i];
        if (!(primals[i] = nbi_make_view(x, x->ndim, x->shape, x->strides, x->offset))) rc = -1;
        /* an input that requires grad keeps requiring it (no history): a
         * backward inside fn (forward over reverse) still reaches it */
        if (rc == 0) primals[i]->requires_grad = x->requires_grad;
        if (rc == 0 && tangents[i]) {
            primals[i]->requires_grad = true;
            slot *s = find(&m, primals[i], true);
            if (!s) rc = (nbi_error("%s: out of memory", FN), -1);
            else s->tan = tangents[i], nbi_ref(tangents[i]);
        }
    }
    nb_tensor *y = rc == 0 ? run_fn(fn, ctx, n, primals) : NULL;
    if (!y) rc = -1;
    nbi_grad_off = true; /* tangent rules record nothing */
    nbi_trusted++;       /* and read tensors whose handles fn freed */
    if (rc == 0) rc = push_tangents(&m, y);
    nbi_trusted--;
    slot *s = rc == 0 ? find(&m, y, false) : NULL;
    nb_tensor *tan = s ? s->tan : NULL;
    if (tan) nbi_ref(tan);
    map_free(&m);
    nb_scope_end();
    if (rc == 0) { /* the caller's: a view of y with no history, and a copy of the tangent */
        *out = nbi_make_view(y, y->ndim, y->shape, y->strides, y->offset);
        *out_tangent = tan ? nbi_grad_copy(FN, tan) : nbi_new(FN, y->dtype, y->ndim, y->shape, true);
        if (!*out || !*out_tangent) {
            *out = nbi_discard(*out);
            *out_tangent = nbi_discard(*out_tangent);
            rc = -1;
        }
    }
    nbi_grad_off = was_off;
    nbi_unref(tan);
    nbi_unref(y);
    free(primals);
    return rc;
}

nb_tensor *nbi_zero_tangent(const nbi_node *n) {
    return nbi_new(n->op, n->out->dtype, n->out->ndim, n->out->shape, true);
}
