/* checkpoint.c: activation checkpointing, nb_checkpoint (PyTorch's
 * torch.utils.checkpoint).
 *
 * Forward: fn runs with grad mode on, on views of its inputs that have no
 * history, so that its graph is its own; every node it records is shown to
 * its region (nbi_checkpoint_saw), which collects the leaves that require
 * grad and that fn reached through its context (a block's parameters). The
 * graph is then dropped with its intermediates, and the output gets one
 * node whose inputs are fn's inputs and those leaves: the outer engine
 * hands their gradients out as for any node (into .grad, nb_autograd_grad,
 * hooks), and holds the inputs' values, version-checked, for backward.
 *
 * Backward: fn runs again, the same way, with every random draw of the
 * forward replayed from its tape (tensor/rng.c), in the autocast dtype the
 * forward ran in (the engine runs every rule so), and an inner backward of
 * that graph from the incoming gradient gives the node's input gradients.
 * The inner graph is the forward's, node for node, walked in the same
 * order: the gradients are those of a plain backward, bit for bit. */
#include "autograd_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FN "nb_checkpoint"

typedef struct nbi_ckpt_region {
    nb_tensor **alias; /* fn's inputs */
    int n;
    uint64_t first;    /* nodes with this serial or later are fn's */
    nb_tensor **leaf;  /* leaves that require grad, reached through ctx */
    int n_leaf, cap_leaf;
    bool oom;
    /* a tensor with history made before fn ran, reached through ctx */
    const char *foreign_op;
    char foreign_shape[64];
    struct nbi_ckpt_region *outer;
} region;

_Thread_local region *nbi_ckpt_top;

static bool is_alias(const region *r, const nb_tensor *t) {
    for (int i = 0; i < r->n; i++)
        if (r->alias[i] == t) return true;
    return false;
}

static void add_leaf(region *r, nb_tensor *t) {
    for (int k = 0; k < r->n_leaf; k++)
        if (r->leaf[k] == t) return;
    if (r->n_leaf == r->cap_leaf) {
        int cap = r->cap_leaf ? 2 * r->cap_leaf : 16;
        nb_tensor **v = realloc(r->leaf, (size_t)cap * sizeof *v);
        if (!v) {
            r->oom = true;
            return;
        }
        r->leaf = v;
        r->cap_leaf = cap;
    }
    r->leaf[r->n_leaf++] = t;
}

/* Only the innermost region looks: a checkpoint inside fn shows its own
 * leaves to this one through the node it records. */
void nbi_checkpoint_saw(const nbi_node *n) {
    region *r = nbi_ckpt_top;
    for (int i = 0; i < n->nin; i++) {
        nb_tensor *t = n->in[i];
        if (!t->requires_grad || is_alias(r, t)) continue;
        if (!t->grad_fn) add_leaf(r, t);
        else if (t->grad_fn->serial < r->first && !r->foreign_op) {
            r->foreign_op = t->grad_fn->op;
            snprintf(r->foreign_shape, sizeof r->foreign_shape, "%s", NBI_SHAPE(t));
        }
    }
}

/* The node's context: what backward needs to run fn again. */
typedef struct {
    nb_fn fn;
    void *ctx;
    int n;             /* fn's inputs: the node's first n inputs; the leaves follow */
    nbi_rng_tape tape; /* the forward's draws */
    int ndim;          /* the output's shape and dtype, to check the recomputation */
    int64_t shape[NB_MAX_DIMS];
    char shape_text[96];
    nb_dtype dtype;
    bool released;     /* the inputs' data no longer held */
} ckpt;

/* Views of the inputs with no history (each requiring grad as its tensor
 * does), in the current scope; NULL after a message. */
static nb_tensor **aliases(const char *fn, nb_tensor *const *in, int n) {
    nb_tensor **a = calloc((size_t)(n > 0 ? n : 1), sizeof *a);
    if (!a) return nbi_error("%s: out of memory", fn);
    for (int i = 0; i < n; i++) {
        nb_tensor *x = in[i];
        if (!(a[i] = nbi_make_view(x, x->ndim, x->shape, x->strides, x->offset))) {
            free(a);
            return NULL;
        }
        a[i]->requires_grad = x->requires_grad;
    }
    return a;
}

/* fn on a, as a callback; its output, checked, or NULL after a message.
 * fn must leave its inputs alive, unwritten and as they were. */
static nb_tensor *call(const char *fn, const char *who, const ckpt *c, nb_tensor **a,
                       nb_tensor *const *in) {
    uint32_t ver[64];
    for (int i = 0; i < c->n && i < 64; i++) ver[i] = in[i]->storage->version;
    nbi_callback cb = {.who_fmt = who};
    nbi_callback_enter(&cb, fn, false);
    nb_tensor *y = c->fn(a, c->n, c->ctx);
    if (nbi_callback_leave(&cb) != 0) return NULL;
    for (int i = 0; i < c->n; i++) {
        if (a[i]->freed)
            return nbi_error("%s: %s freed input %d (%s); it must leave its inputs alive", fn,
                             who, i, nbi_freed_how(a[i]));
        if (a[i]->requires_grad != in[i]->requires_grad)
            return nbi_error("%s: %s changed requires_grad of input %d; it must leave its "
                             "inputs as they are", fn, who, i);
        if (i < 64 && in[i]->storage->version != ver[i])
            return nbi_error("%s: %s wrote into input %d in place; the recomputation in "
                             "backward would read other values (write into a copy)", fn, who, i);
    }
    return nbi_fn_returned(fn, y);
}

/* ------------------------------------------------------------- backward */
static void ckpt_release(nbi_node *n, bool all) {
    ckpt *c = n->fn_ctx;
    if (!c) return;
    if (!c->released) {
        c->released = true;
        for (int i = 0; i < n->nin; i++) {
            n->in[i]->holds--;
            if (!all) nbi_drop_unsaved_data(n->in[i]);
        }
        free(c->tape.draws);
        c->tape.draws = NULL;
    }
    if (all) {
        free(c);
        n->fn_ctx = NULL;
    }
}

/* What backward reads was not changed since the forward: fn's inputs and
 * the leaves it reached (an optimizer step between forward and backward
 * would make the recomputation see other weights). */
static int intact(const nbi_node *n, const ckpt *c) {
    for (int i = 0; i < n->nin; i++) {
        const nb_tensor *t = n->in[i];
        if (t->storage->version == n->ver[i]) continue;
        if (i < c->n)
            return (nbi_error("nb_backward: input %d of nb_checkpoint was modified in place after "
                              "the forward (version %u, expected %u): the recomputation would read "
                              "other values", i, t->storage->version, n->ver[i]), -1);
        return (nbi_error("nb_backward: a tensor of shape %s that nb_checkpoint's function reads "
                          "through its context (a parameter) was modified in place after the "
                          "forward (version %u, expected %u; an optimizer step between forward and "
                          "backward?): the recomputation would read other values",
                          NBI_SHAPE(t), t->storage->version, n->ver[i]), -1);
    }
    return 0;
}

/* fn run again in backward; its output (same shape and dtype as the
 * forward's), or NULL after a message. */
static nb_tensor *rerun(nbi_node *n, ckpt *c, nb_tensor **a) {
    c->tape.replay = true;
    c->tape.next = 0;
    c->tape.broken = false;
    c->tape.outer = nbi_rng_tapes;
    nbi_rng_tapes = &c->tape;
    bool was_off = nbi_grad_off;
    nbi_grad_off = false;
    nb_tensor *y = call("nb_backward", "nb_checkpoint's function (run again in backward)", c, a,
                        n->in);
    nbi_grad_off = was_off;
    nbi_rng_tapes = c->tape.outer;
    if (!y) return NULL;
    if (!c->tape.broken && c->tape.next != c->tape.len)
        snprintf(c->tape.why, sizeof c->tape.why, "it made %zu draws, the forward %zu",
                 c->tape.next, c->tape.len), c->tape.broken = true;
    if (c->tape.broken)
        return nbi_error("nb_backward: nb_checkpoint's function drew random numbers differently "
                         "when run again in backward: %s; it must make the same draws from "
                         "the same streams each time", c->tape.why);
    bool same = y->ndim == c->ndim && y->dtype == c->dtype;
    for (int d = 0; same && d < y->ndim; d++) same = y->shape[d] == c->shape[d];
    if (!same)
        return nbi_error("nb_backward: nb_checkpoint's function returned %s %s when run again "
                         "in backward, %s %s in the forward: it must compute the same thing each "
                         "time", NBI_SHAPE(y), nb_dtype_name(y->dtype), c->shape_text,
                         nb_dtype_name(c->dtype));
    return y;
}

static int ckpt_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    ckpt *c = n->fn_ctx;
    if (nbi_create_graph())
        return (nbi_error("nb_backward: create_graph through nb_checkpoint is not supported: its "
                          "backward runs the function again and backpropagates through that run, "
                          "which is not recorded; call the function without nb_checkpoint where a "
                          "second derivative is needed"), -1);
    if (intact(n, c) != 0) return -1;
    nb_tensor **a = aliases("nb_backward", n->in, c->n);
    nb_tensor **want = malloc((size_t)n->nin * sizeof *want);
    nb_tensor **got = calloc((size_t)n->nin, sizeof *got);
    int *slot = malloc((size_t)n->nin * sizeof *slot);
    int rc = -1;
    if (!a || !want || !got || !slot) {
        nbi_error("nb_backward: out of memory");
        goto done;
    }
    nb_tensor *y = rerun(n, c, a);
    if (!y) goto done;
    int k = 0;
    for (int i = 0; i < n->nin; i++)
        if (nbi_wants(n, i)) want[k] = i < c->n ? a[i] : n->in[i], slot[k++] = i;
    rc = 0;
    if (k > 0 && y->requires_grad)
        rc = nb_autograd_grad(&y, 1, &g, want, k, NULL, got);
    for (int j = 0; rc == 0 && j < k; j++) gin[slot[j]] = got[j];
done:
    free(a);
    free(want);
    free(got);
    free(slot);
    return rc;
}

/* Forward mode (nb_jvp through a checkpointed function): fn run again
 * under nb_jvp, its draws replayed, pushes the inputs' tangents through. */
static nb_tensor *ckpt_jvp(nbi_node *n, nb_tensor *const *tin) {
    ckpt *c = n->fn_ctx;
    for (int i = c->n; i < n->nin; i++)
        if (tin[i])
            return nbi_error("nb_jvp: nb_checkpoint's function reads a tensor of shape %s with a "
                             "tangent through its context; forward mode reaches only its inputs: "
                             "pass it in inputs", NBI_SHAPE(n->in[i]));
    bool any = false;
    for (int i = 0; i < c->n; i++) any = any || tin[i];
    if (!any) return nbi_zero_tangent(n);
    nb_tensor **a = aliases("nb_jvp", n->in, c->n);
    if (!a) return NULL;
    nb_tensor *out = NULL, *out_t = NULL;
    c->tape.replay = true;
    c->tape.next = 0;
    c->tape.broken = false;
    c->tape.outer = nbi_rng_tapes;
    nbi_rng_tapes = &c->tape;
    int rc = nb_jvp(c->fn, c->ctx, c->n, a, (nb_tensor **)tin, &out, &out_t);
    nbi_rng_tapes = c->tape.outer;
    free(a);
    if (rc != 0) return NULL;
    if (c->tape.broken || c->tape.next != c->tape.len)
        return nbi_error("nb_jvp: nb_checkpoint's function drew random numbers differently when "
                         "run again for forward mode; it must make the same draws from the same "
                         "streams each time");
    nb_free(out);
    return out_t;
}

/* ------------------------------------------------------------- forward */
/* y's values as a new tensor of the caller's scope, with no history: fn's
 * graph dies with y's handle. */
static nb_tensor *detached(nb_tensor *y) {
    return nbi_make_view(y, y->ndim, y->shape, y->strides, y->offset);
}

/* Records the node on out; 0, or -1 after a message. */
static int record(nb_tensor *out, ckpt *c, nb_tensor **inputs, const region *r) {
    int nin = c->n + r->n_leaf;
    nb_tensor **in = malloc((size_t)(nin > 0 ? nin : 1) * sizeof *in);
    if (!in) return (nbi_error("%s: out of memory", FN), -1);
    if (c->n) memcpy(in, inputs, (size_t)c->n * sizeof *in);
    if (r->n_leaf) memcpy(in + c->n, r->leaf, (size_t)r->n_leaf * sizeof *in);
    nbi_node *node = nbi_record(out, FN, ckpt_backward, nin, in);
    free(in);
    if (!node) return -1;
    for (int i = 0; i < nin; i++) node->in[i]->holds++; /* their values, for backward */
    node->fn_ctx = c;
    node->fn_release = ckpt_release;
    node->jvp = ckpt_jvp;
    return 0;
}

/* fn run forward under a region; its output (held), or NULL after a
 * message. The region's leaves are set. */
static nb_tensor *forward(ckpt *c, nb_tensor **inputs, region *r) {
    nb_scope_begin();
    nb_tensor *y = NULL;
    r->alias = aliases(FN, inputs, c->n);
    r->n = c->n;
    if (r->alias) {
        r->first = nbi_next_node_serial();
        r->outer = nbi_ckpt_top;
        nbi_ckpt_top = r;
        c->tape.outer = nbi_rng_tapes;
        nbi_rng_tapes = &c->tape;
        y = call(FN, "the function", c, r->alias, inputs);
        nbi_rng_tapes = c->tape.outer;
        nbi_ckpt_top = r->outer;
    }
    if (y && r->oom) y = nbi_error("%s: out of memory", FN);
    if (y && c->tape.broken) y = nbi_error("%s: %s", FN, c->tape.why);
    if (y && r->foreign_op)
        y = nbi_error("%s: the function reads a tensor of shape %s made by %s, which requires "
                      "grad, through its context rather than its inputs: its gradient could "
                      "not reach it; pass it in inputs", FN, r->foreign_shape, r->foreign_op);
    if (y) nbi_ref(y);
    nb_scope_end();
    free(r->alias);
    return y;
}

nb_tensor *nb_checkpoint(nb_fn fn, void *ctx, int n, nb_tensor **inputs) {
    if (!fn) return nbi_error("%s: fn is NULL", FN);
    if (n < 0 || (n > 0 && !inputs))
        return nbi_error("%s: needs n >= 0 and, for n > 0, the inputs (n = %d, inputs %s)", FN,
                         n, inputs ? "given" : "NULL");
    for (int i = 0; i < n; i++)
        if (!nbi_arg(FN, inputs[i], i)) return NULL;
    ckpt *c = calloc(1, sizeof *c);
    if (!c) return nbi_error("%s: out of memory", FN);
    *c = (ckpt){.fn = fn, .ctx = ctx, .n = n};
    if (nbi_grad_off) { /* nothing to save: fn as it is */
        nb_tensor *y = call(FN, "the function", c, inputs, inputs);
        free(c);
        return y;
    }
    region r = {0};
    nb_tensor *y = forward(c, inputs, &r);
    nb_tensor *out = y ? detached(y) : NULL;
    if (out && y->requires_grad) {
        c->ndim = y->ndim;
        c->dtype = y->dtype;
        memcpy(c->shape, y->shape, sizeof c->shape);
        snprintf(c->shape_text, sizeof c->shape_text, "%s", NBI_SHAPE(y));
        if (record(out, c, inputs, &r) == 0) c = NULL; /* the node's now */
        else out = nbi_discard(out);
    }
    nbi_unref(y);
    free(r.leaf);
    if (c) free(c->tape.draws);
    free(c);
    return out;
}
