/* function.c: ops users write themselves (nb_function), as PyTorch's
 * torch.autograd.Function: their forward runs with grad mode off, and their
 * backward becomes the rule of an ordinary graph node, so the engine's
 * guarantees (version checks, anomaly mode, shape checks, release after
 * backward, freeing with the graph) hold for them as for built-in ops.
 *
 * One output: its node has the function's inputs and runs the user's
 * backward. Several outputs: a hidden empty tensor H carries the node that
 * runs the user's backward; each output gets a node with H as its input
 * that hands its gradient to the context, so that H's node, which the walk
 * reaches after all of them, sees every output's gradient at once. */
#include "autograd_internal.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    nb_dtype dtype;
    int ndim;
    int64_t shape[NB_MAX_DIMS];
} out_meta;

enum { SAVED_OTHER = -1, SAVED_OUTPUT = -2 };

struct nb_function_ctx {
    nb_function f; /* a copy: the caller's struct may live on its stack */
    char *name;    /* a copy too, for messages while the node lives */
    void *user;
    int nin;
    bool *needs;         /* needs_input_grad, per input */
    nb_tensor **saved;   /* handles of their own (views with no history), held */
    int *saved_src;      /* what each saved tensor is: input i (>= 0), the output
                          * (SAVED_OUTPUT) or something else (SAVED_OTHER) */
    const nb_tensor **saved_obj; /* in forward: the tensor saved (compared, never read) */
    nb_tensor **fwd_in;  /* in forward: the inputs, to recognise them when saved */
    nbi_node *node;      /* single output: the node, once recorded */
    bool create_graph;   /* in backward: the gradients are being recorded */
    nbi_callback *cb;    /* in backward: its callback frame (raw reads are noted there) */
    uint32_t *saved_ver; /* storage versions when saved */
    int nsaved, capsaved;
    bool in_forward, released;
    nb_tensor **nondiff; /* outputs marked non-differentiable, in forward */
    int nnondiff, capnondiff;
    int nout;            /* 0 for nb_function_apply */
    out_meta *outs;      /* several outputs: shapes, for zero gradients */
    nb_tensor **gout;    /* several outputs: the gradients their nodes handed over */
};

static void ctx_free(nb_function_ctx *c) {
    if (!c) return;
    for (int k = 0; k < c->nsaved; k++) nbi_unref(c->saved[k]);
    for (int k = 0; c->gout && k < c->nout; k++) nbi_unref(c->gout[k]);
    if (c->f.destroy) {
        nbi_callback cb = {.who_fmt = "%s's destroy", .who_s = c->name};
        nbi_callback_enter(&cb, "nb_function", false);
        c->f.destroy(c->user);
        nbi_callback_leave(&cb); /* its message stays, for lack of a caller to fail */
    }
    free(c->name);
    free(c->needs);
    free(c->saved);
    free(c->saved_src);
    free(c->saved_obj);
    free(c->saved_ver);
    free(c->nondiff);
    free(c->outs);
    free(c->gout);
    free(c);
}

/* The node's hook: after a backward that did not retain the graph, the
 * saved tensors go (all = false); with the node, everything (all = true). */
static void node_release(nbi_node *n, bool all) {
    nb_function_ctx *c = n->fn_ctx;
    if (!c) return;
    if (all) {
        ctx_free(c);
        n->fn_ctx = NULL;
        return;
    }
    for (int k = 0; k < c->nsaved; k++) nbi_unref(c->saved[k]);
    c->nsaved = 0;
    c->released = true;
}

static bool grow(void **v, int *cap, int need, size_t elem) {
    if (need <= *cap) return true;
    int cap2 = *cap ? 2 * *cap : 4;
    void *p = realloc(*v, (size_t)cap2 * elem);
    if (!p) return false;
    *v = p;
    *cap = cap2;
    return true;
}

/* --------------------------------------------------------------- the ctx API */
int nb_function_save(nb_function_ctx *c, nb_tensor *t) {
    if (!c) return (nbi_error("nb_function_save: ctx is NULL"), -1);
    char fn[128];
    snprintf(fn, sizeof fn, "nb_function_save: %s", c->name);
    if (!c->in_forward)
        return (nbi_error("%s: tensors can be saved only in forward", fn), -1);
    if (!nbi_arg(fn, t, 0)) return -1;
    int cap = c->capsaved, cap2 = c->capsaved, cap3 = c->capsaved;
    if (!grow((void **)&c->saved, &cap, c->nsaved + 1, sizeof *c->saved) ||
        !grow((void **)&c->saved_src, &cap2, c->nsaved + 1, sizeof *c->saved_src) ||
        !grow((void **)&c->saved_obj, &cap3, c->nsaved + 1, sizeof *c->saved_obj) ||
        !grow((void **)&c->saved_ver, &c->capsaved, c->nsaved + 1, sizeof *c->saved_ver))
        return (nbi_error("%s: out of memory", fn), -1);
    nb_tensor *h = nbi_make_view(t, t->ndim, t->shape, t->strides, t->offset);
    if (!h) return -1;
    c->saved_src[c->nsaved] = SAVED_OTHER;
    for (int i = 0; c->fwd_in && i < c->nin; i++)
        if (c->fwd_in[i] == t) c->saved_src[c->nsaved] = i;
    c->saved_obj[c->nsaved] = t; /* the output is known when forward returns: saved_output */
    c->saved[c->nsaved] = nbi_unscoped(h); /* the ctx holds its one reference */
    c->saved_ver[c->nsaved++] = t->storage->version;
    return 0;
}

nb_tensor *nb_function_saved(nb_function_ctx *c, int i) {
    if (!c) return nbi_error("nb_function_saved: ctx is NULL");
    if (c->released)
        return nbi_error("nb_function_saved: %s: the saved tensors were freed after backward; "
                         "retain the graph (retain_graph) to backpropagate twice", c->name);
    if (i < 0 || i >= c->nsaved)
        return nbi_error("nb_function_saved: %s: index %d is out of range (%d saved)", c->name,
                         i, c->nsaved);
    if (!c->create_graph) return c->saved[i];
    /* the gradients are being recorded: an input or the output comes with
     * its history; anything else made in forward has none, and what the
     * backward computes from it could not be differentiated again */
    nb_tensor *v = c->saved_src[i] >= 0 ? nbi_recorded_view(c->saved[i], c->node->in[c->saved_src[i]])
                   : c->saved_src[i] == SAVED_OUTPUT ? nbi_recorded_view(c->saved[i], c->node->out)
                                                     : NULL;
    if (v) v->borrowed = true; /* as a plain backward's: the context's to free (the rule's scope) */
    if (c->saved_src[i] != SAVED_OTHER) return v;
    if (nbi_is_diff(c->saved[i]->dtype)) c->cb->raw_read = true;
    return c->saved[i];
}

/* After forward: which saved tensor is the output it returned. */
static void saved_output(nb_function_ctx *c, const nb_tensor *returned) {
    for (int k = 0; k < c->nsaved; k++) {
        if (c->saved_src[k] == SAVED_OTHER && c->saved_obj[k] == returned)
            c->saved_src[k] = SAVED_OUTPUT;
        c->saved_obj[k] = NULL;
    }
}

bool nb_function_needs_input_grad(nb_function_ctx *c, int i) {
    if (!c) return nbi_error("nb_function_needs_input_grad: ctx is NULL"), false;
    if (i < 0 || i >= c->nin)
        return nbi_error("nb_function_needs_input_grad: %s: input %d is out of range (%d "
                         "inputs)", c->name, i, c->nin), false;
    return c->needs[i];
}

int nb_function_mark_non_differentiable(nb_function_ctx *c, nb_tensor *t) {
    if (!c) return (nbi_error("nb_function_mark_non_differentiable: ctx is NULL"), -1);
    char fn[128];
    snprintf(fn, sizeof fn, "nb_function_mark_non_differentiable: %s", c->name);
    if (!c->in_forward) return (nbi_error("%s: outputs can be marked only in forward", fn), -1);
    if (!nbi_arg(fn, t, 0)) return -1;
    if (!grow((void **)&c->nondiff, &c->capnondiff, c->nnondiff + 1, sizeof *c->nondiff))
        return (nbi_error("%s: out of memory", fn), -1);
    c->nondiff[c->nnondiff++] = t;
    return 0;
}

static bool marked(const nb_function_ctx *c, const nb_tensor *t) {
    for (int k = 0; k < c->nnondiff; k++)
        if (c->nondiff[k] == t) return true;
    return false;
}

/* ------------------------------------------------------------------ backward */
static bool saved_intact(const nb_function_ctx *c) {
    for (int k = 0; k < c->nsaved; k++)
        if (c->saved[k]->storage->version != c->saved_ver[k])
            return nbi_error("nb_backward: tensor %d saved by %s was modified in place after it "
                             "was saved (version %u, expected %u)", k, c->name,
                             c->saved[k]->storage->version, c->saved_ver[k]), false;
    return true;
}

/* The message a callback reported since the error count was `serial`, or
 * NULL when it reported none (or cleared what it had). */
static const char *reported(uint64_t serial) {
    return nbi_error_serial() != serial ? nb_last_error() : NULL;
}

/* ------------------------------------------------- once differentiable */
/* A backward that read raw values of a tensor that requires grad (nb_data,
 * nb_item, nb_copy_to_f64, or a tensor it saved in forward that is neither
 * an input nor the output) under create_graph gives gradients that are
 * right but not differentiable: each is handed on through a node whose
 * backward and tangent rule are errors naming the function, as PyTorch's
 * once_differentiable, so a second derivative through it fails instead of
 * silently missing terms. */
static int refuse_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    (void)g;
    (void)gin;
    nbi_error("nb_backward: the gradient made by the backward of %s cannot be differentiated "
              "again: that backward computes on raw values (nb_data, nb_item or "
              "nb_copy_to_f64 of a tensor that requires grad, or a tensor saved in forward that "
              "is neither an input nor the output), as PyTorch's once_differentiable; write it "
              "with nabla ops on its inputs, output and grad_output to differentiate it twice",
              (const char *)n->fn_ctx);
    return -1;
}

static nb_tensor *refuse_jvp(nbi_node *n, nb_tensor *const *tin) {
    (void)tin;
    return nbi_error("nb_jvp: the gradient made by the backward of %s has no tangent: that "
                     "backward computes on raw values (once differentiable)",
                     (const char *)n->fn_ctx);
}

static void free_name(nbi_node *n, bool all) {
    if (!all) return;
    free(n->fn_ctx);
    n->fn_ctx = NULL;
}

static int once_differentiable(nb_function_ctx *c, nbi_node *n, nb_tensor **gouts,
                               nb_tensor **gin) {
    int nout = c->nout ? c->nout : 1;
    for (int i = 0; i < n->nin; i++) {
        nb_tensor *g = gin[i];
        if (!g) continue;
        /* its inputs: the gradient, the function's inputs and output gradients */
        int k = 0;
        nb_tensor **from = malloc((size_t)(1 + n->nin + nout) * sizeof *from);
        if (!from) return (nbi_error("nb_backward: out of memory"), -1);
        from[k++] = g;
        for (int j = 0; j < n->nin; j++) from[k++] = n->in[j];
        for (int j = 0; j < nout; j++)
            if (gouts[j]) from[k++] = gouts[j];
        nb_tensor *v = nbi_make_view(g, g->ndim, g->shape, g->strides, g->offset);
        nbi_node *r = v ? nbi_record_unchecked(v, c->name, refuse_backward, k, from) : NULL;
        free(from);
        char *name = r ? malloc(strlen(c->name) + 1) : NULL;
        if (!name) {
            nbi_discard(v);
            return (nbi_error("nb_backward: out of memory"), -1);
        }
        strcpy(name, c->name);
        r->fn_ctx = name;
        r->fn_release = free_name;
        r->jvp = refuse_jvp;
        gin[i] = v;
    }
    return 0;
}

/* Runs the user's backward (untrusted: freed handles are errors there) and
 * checks what it returned against the inputs. */
static int call_backward(nb_function_ctx *c, nbi_node *n, nb_tensor **gouts, nb_tensor **gin) {
    uint64_t serial = nbi_error_serial();
    nbi_callback cb = {.who_fmt = "%s's backward", .who_s = c->name};
    bool cg = nbi_create_graph(); /* grad mode stays on, as PyTorch's create_graph */
    nbi_callback_enter(&cb, "nb_backward", !cg);
    cb.watch_raw = cg;
    c->create_graph = cg;
    c->cb = &cb;
    int rc = c->nout ? c->f.backward_multi(c, gouts, c->nout, gin, c->user)
                     : c->f.backward(c, gouts[0], gin, c->user);
    c->create_graph = false;
    c->cb = NULL;
    if (nbi_callback_leave(&cb) != 0) {
        for (int i = 0; i < n->nin; i++) gin[i] = NULL; /* they may be gone with its scopes */
        return -1;
    }
    if (rc != 0) {
        const char *why = reported(serial);
        if (why) nbi_error("nb_backward: the backward of %s failed: %s", c->name, why);
        else nbi_error("nb_backward: the backward of %s returned %d without reporting an error "
                       "(nb_report_error)", c->name, rc);
        return -1;
    }
    const char *why = reported(serial);
    for (int i = 0; i < n->nin; i++) {
        nb_tensor *g = gin[i], *in = n->in[i];
        if (!g && c->needs[i] && why) { /* most likely a computation that failed, not a zero */
            char first[512];
            snprintf(first, sizeof first, "%s", why);
            return (nbi_error_quoting("nb_backward: the backward of %s returned 0 but no "
                                      "gradient for input %d, after an error: %s", c->name, i,
                                      first), -1);
        }
        if (!g) continue;
        if (!c->needs[i]) {
            gin[i] = NULL; /* not asked for: ignored, as PyTorch does */
            continue;
        }
        if (!nbi_is_tensor(g))
            return (nbi_error("nb_backward: the backward of %s returned a pointer that is not a "
                              "tensor as the gradient of input %d", c->name, i), -1);
        if (g->freed)
            return (nbi_error("nb_backward: the backward of %s returned a freed tensor as the "
                              "gradient of input %d", c->name, i), -1);
        if (!nbi_same_shape(g, in) || g->dtype != in->dtype)
            return (nbi_error("nb_backward: the backward of %s returned a gradient of shape %s "
                              "%s for input %d, which has shape %s %s", c->name, NBI_SHAPE(g),
                              nb_dtype_name(g->dtype), i, NBI_SHAPE(in),
                              nb_dtype_name(in->dtype)), -1);
    }
    return cg && cb.raw_read ? once_differentiable(c, n, gouts, gin) : 0;
}

/* A live handle on an engine tensor, in the node's scope: the engine's own
 * handles may count as freed (they outlive the scope that made them). */
static nb_tensor *handle_on(nb_tensor *g) {
    return nbi_make_view(g, g->ndim, g->shape, g->strides, g->offset);
}

static int single_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    nb_function_ctx *c = n->fn_ctx;
    if (!saved_intact(c)) return -1;
    nb_tensor *go = nbi_create_graph() ? nbi_recorded_alias(g) : handle_on(g);
    return go ? call_backward(c, n, &go, gin) : -1;
}

/* H's node: every output's gradient (zeros where none came), then the user's rule. */
static int multi_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    (void)g; /* H's own gradient is empty */
    nb_function_ctx *c = n->fn_ctx;
    if (!saved_intact(c)) return -1;
    nb_tensor **gouts = calloc((size_t)c->nout, sizeof *gouts);
    int rc = gouts ? 0 : (nbi_error("nb_backward: out of memory"), -1);
    for (int k = 0; rc == 0 && k < c->nout; k++) {
        const out_meta *o = &c->outs[k];
        if (c->gout[k])
            gouts[k] = nbi_create_graph() ? nbi_recorded_alias(c->gout[k]) : handle_on(c->gout[k]);
        else if (nbi_is_diff(o->dtype))
            gouts[k] = nbi_new(c->name, o->dtype, o->ndim, o->shape, true);
        else continue;
        if (!gouts[k]) rc = -1;
    }
    if (rc == 0) rc = call_backward(c, n, gouts, gin);
    for (int k = 0; k < c->nout; k++) { /* taken: a retained graph starts afresh */
        nbi_unref(c->gout[k]);
        c->gout[k] = NULL;
    }
    free(gouts);
    return rc;
}

/* Output k's node: hands its gradient to the context, passes an empty one to H. */
static int output_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    nb_function_ctx *c = n->fn_ctx;
    int64_t k = n->i[0];
    nbi_ref(g);
    nbi_unref(c->gout[k]);
    c->gout[k] = g;
    nb_tensor *h = n->in[0];
    gin[0] = nbi_new(c->name, h->dtype, h->ndim, h->shape, false);
    return gin[0] ? 0 : -1;
}

/* ------------------------------------------------------------ forward mode */
/* The node's tangent rule: the user's jvp, under the callback rule. */
static nb_tensor *fn_jvp(nbi_node *n, nb_tensor *const *tin) {
    nb_function_ctx *c = n->fn_ctx;
    uint64_t serial = nbi_error_serial();
    nb_tensor **t = calloc((size_t)n->nin + 1, sizeof *t);
    if (!t) return nbi_error("nb_jvp: out of memory");
    for (int i = 0; i < n->nin; i++)
        if (tin[i] && !(t[i] = handle_on(tin[i]))) {
            free(t);
            return NULL;
        }
    nbi_callback cb = {.who_fmt = "%s's jvp", .who_s = c->name};
    nbi_callback_enter(&cb, "nb_jvp", true);
    nb_tensor *r = c->f.jvp(c, t, n->nin, c->user);
    int fenced = nbi_callback_leave(&cb);
    free(t);
    if (fenced != 0) return NULL;
    if (!r) {
        const char *why = reported(serial);
        if (why) return nbi_error("nb_jvp: the jvp of %s failed: %s", c->name, why);
        return nbi_error("nb_jvp: the jvp of %s returned NULL without reporting an error "
                         "(nb_report_error)", c->name);
    }
    if (!nbi_is_tensor(r))
        return nbi_error("nb_jvp: the jvp of %s returned a pointer that is not a tensor", c->name);
    if (r->freed) return nbi_error("nb_jvp: the jvp of %s returned a freed tensor", c->name);
    if (!nbi_same_shape(r, n->out) || r->dtype != n->out->dtype)
        return nbi_error("nb_jvp: the jvp of %s returned a tangent of shape %s %s for an output "
                         "of shape %s %s", c->name, NBI_SHAPE(r), nb_dtype_name(r->dtype),
                         NBI_SHAPE(n->out), nb_dtype_name(n->out->dtype));
    return r;
}

/* ------------------------------------------------------------------- apply */
/* Checks f and the inputs; *grad says whether a node will be needed. */
static bool check_call(const char *fn, const nb_function *f, nb_tensor **inputs, int n, bool multi,
                       bool *grad) {
    if (!f->name || !f->name[0])
        return nbi_error("%s: the function has no name (nb_function.name)", fn), false;
    if (multi ? !f->forward_multi : !f->forward)
        return nbi_error("%s: %s has no %s", fn, f->name, multi ? "forward_multi" : "forward"),
               false;
    if (n < 0) return nbi_error("%s: %s: %d inputs", fn, f->name, n), false;
    if (n > 0 && !inputs)
        return nbi_error("%s: %s: %d inputs but inputs is NULL", fn, f->name, n), false;
    bool any = false;
    for (int i = 0; i < n; i++) {
        if (!nbi_arg(f->name, inputs[i], i)) return false;
        any = any || inputs[i]->requires_grad;
    }
    *grad = any && nb_grad_enabled();
    if (*grad && (multi ? !f->backward_multi : !f->backward))
        return nbi_error("%s: an input requires grad, but %s has no %s", fn, f->name,
                         multi ? "backward_multi" : "backward"), false;
    return true;
}

static nb_function_ctx *new_ctx(const char *fn, const nb_function *f, nb_tensor **inputs, int n,
                                int nout, bool grad, void *user) {
    nb_function_ctx *c = calloc(1, sizeof *c);
    if (!c) return nbi_error("%s: out of memory", fn);
    c->f = *f;
    c->f.destroy = NULL; /* set once the ctx is whole: begin calls it on failure */
    c->user = user;
    c->nin = n;
    c->nout = nout;
    c->name = malloc(strlen(f->name) + 1);
    c->needs = calloc((size_t)n + 1, sizeof *c->needs);
    if (nout) {
        c->outs = calloc((size_t)nout, sizeof *c->outs);
        c->gout = calloc((size_t)nout, sizeof *c->gout);
    }
    if (!c->name || !c->needs || (nout && (!c->outs || !c->gout))) {
        ctx_free(c);
        return nbi_error("%s: out of memory", fn);
    }
    strcpy(c->name, f->name);
    for (int i = 0; i < n; i++) c->needs[i] = grad && inputs[i]->requires_grad;
    c->f.destroy = f->destroy;
    return c;
}

/* Checks the call and makes its context (NULL + message on error; then
 * f->destroy has been called, when there is one). */
static nb_function_ctx *begin(const char *fn, const nb_function *f, nb_tensor **inputs, int n,
                              int nout, void *user) {
    if (!f) return nbi_error("%s: the function is NULL", fn);
    bool grad = false;
    nb_function_ctx *c = check_call(fn, f, inputs, n, nout > 0, &grad)
                             ? new_ctx(fn, f, inputs, n, nout, grad, user)
                             : NULL;
    if (!c && f->destroy) f->destroy(user);
    return c;
}

/* The user's forward, with grad mode off, in a scope of its own so that its
 * temporaries go when it returns: ret gets what it returned (for
 * nb_function_mark_non_differentiable's comparisons), ys the op's outputs:
 * a tensor the forward made is handed up to the caller's scope as it is;
 * anything else (an input, a tensor from outside, one returned twice) gets a
 * new handle, a view, so the node never lands on a tensor the user holds.
 * -1 with a message naming f. */
static int run_forward(nb_function_ctx *c, nb_tensor **inputs, int n, nb_tensor **ret,
                       nb_tensor **ys) {
    int nout = c->nout ? c->nout : 1;
    uint64_t serial = nbi_error_serial();
    nbi_scope *outer = nbi_scope_current();
    nb_scope_begin();
    nbi_scope *inner = nbi_scope_current();
    for (int i = 0; i < n; i++) nbi_ref(inputs[i]); /* a forward that frees one: see below */
    nbi_callback cb = {.who_fmt = "%s's forward", .who_s = c->name};
    nbi_callback_enter(&cb, "nb_function_apply", true);
    nbi_grad_off = true;
    c->in_forward = true;
    c->fwd_in = inputs;
    int rc = 0;
    if (c->nout) rc = c->f.forward_multi(c, inputs, n, ret, c->nout, c->user);
    else rc = (ret[0] = c->f.forward(c, inputs, n, c->user)) ? 0 : -1;
    c->in_forward = false;
    c->fwd_in = NULL;
    int fenced = nbi_callback_leave(&cb);
    for (int i = 0; fenced == 0 && i < n; i++)
        if (inputs[i]->freed)
            fenced = (nbi_error("%s: forward freed its input %d (%s), which belongs to the caller; "
                                "a forward must leave its inputs alive", c->name, i,
                                nbi_freed_how(inputs[i])), -1);
    if (fenced != 0) { /* the message is set; what it returned may be gone */
        for (int k = 0; k < nout; k++) ret[k] = NULL;
        rc = -1;
    } else if (rc != 0) {
        const char *why = reported(serial);
        if (why) nbi_error("%s: forward failed: %s", c->name, why);
        else nbi_error("%s: forward failed without reporting an error (nb_report_error)", c->name);
    }
    for (int k = 0; rc == 0 && k < nout; k++) {
        if (!ret[k])
            rc = (nbi_error("%s: forward returned no tensor for output %d", c->name, k), -1);
        else if (!nbi_is_tensor(ret[k]))
            rc = (nbi_error("%s: forward returned a pointer that is not a tensor as output %d",
                            c->name, k), -1);
        else if (ret[k]->freed)
            rc = (nbi_error("%s: forward returned a freed tensor as output %d", c->name, k), -1);
        else if (inner != outer && ret[k]->scope == inner)
            nbi_scope_hand_up(ys[k] = ret[k]);
    }
    nb_scope_end();
    for (int i = 0; i < n; i++) nbi_unref(inputs[i]);
    for (int k = 0; rc == 0 && k < nout; k++) {
        nb_tensor *t = ret[k];
        if (!ys[k] && !(ys[k] = nbi_make_view(t, t->ndim, t->shape, t->strides, t->offset)))
            rc = -1;
    }
    if (rc != 0)
        for (int k = 0; k < nout; k++) ys[k] = nbi_discard(ys[k]);
    return rc;
}

/* returned: what forward returned (only compared); y: the output. */
static bool differentiable(const nb_function_ctx *c, const nb_tensor *returned,
                           const nb_tensor *y) {
    bool any = false;
    for (int i = 0; i < c->nin; i++) any = any || c->needs[i];
    return any && nbi_is_diff(y->dtype) && !marked(c, returned);
}

nb_tensor *nb_function_apply(const nb_function *f, nb_tensor **inputs, int n, void *user) {
    nb_function_ctx *c = begin("nb_function_apply", f, inputs, n, 0, user);
    if (!c) return NULL;
    nb_tensor *out = NULL, *y = NULL;
    if (run_forward(c, inputs, n, &out, &y) != 0) {
        ctx_free(c);
        return NULL;
    }
    saved_output(c, out);
    if (!differentiable(c, out, y)) {
        ctx_free(c); /* no node: nothing will read the ctx again */
        return y;
    }
    nbi_node *node = nbi_record(y, c->name, single_backward, n, inputs);
    if (!node) {
        ctx_free(c);
        return nbi_discard(y);
    }
    node->fn_ctx = c;
    node->fn_release = node_release;
    if (c->f.jvp) node->jvp = fn_jvp;
    c->node = node;
    return y;
}

/* Records H and one node per differentiable output (outputs already made). */
static int record_multi(nb_function_ctx *c, nb_tensor **inputs, int n, nb_tensor **ret,
                        nb_tensor **ys) {
    nb_tensor *h = nbi_new(c->name, NB_F64, 1, (const int64_t[]){0}, false);
    nbi_node *hn = h ? nbi_record_unchecked(h, c->name, multi_backward, n, inputs) : NULL;
    if (!hn) {
        nbi_discard(h);
        ctx_free(c);
        return -1;
    }
    hn->fn_ctx = c; /* from here on, the ctx goes with H's node */
    hn->fn_release = node_release;
    c->node = hn; /* the inputs' history, for nb_function_saved */
    int rc = 0;
    for (int k = 0; rc == 0 && k < c->nout; k++) {
        if (!differentiable(c, ret[k], ys[k])) continue;
        if (!nbi_anomaly_forward(c->name, ys[k], n, inputs)) rc = -1;
        nbi_node *on =
            rc == 0 ? nbi_record_unchecked(ys[k], c->name, output_backward, 1, &h) : NULL;
        if (!on) {
            rc = -1;
            break;
        }
        on->fn_ctx = c;
        on->i[0] = k;
    }
    nbi_discard(h); /* the output nodes hold H (and so the ctx) from now on */
    return rc;
}

int nb_function_apply_multi(const nb_function *f, nb_tensor **inputs, int n, nb_tensor **outputs,
                            int nout, void *user) {
    const char *fn = "nb_function_apply_multi";
    if (!outputs || nout < 1) {
        if (f && f->destroy) f->destroy(user);
        return (nbi_error("%s: needs outputs and nout >= 1 (nout = %d)", fn, nout), -1);
    }
    for (int k = 0; k < nout; k++) outputs[k] = NULL;
    nb_function_ctx *c = begin(fn, f, inputs, n, nout, user);
    if (!c) return -1;
    nb_tensor **ret = calloc((size_t)nout, sizeof *ret), **ys = calloc((size_t)nout, sizeof *ys);
    int rc = (ret && ys) ? run_forward(c, inputs, n, ret, ys)
                         : (nbi_error("%s: out of memory", fn), -1);
    bool any = false;
    for (int k = 0; rc == 0 && k < nout; k++) {
        out_meta *o = &c->outs[k];
        o->dtype = ys[k]->dtype;
        o->ndim = ys[k]->ndim;
        memcpy(o->shape, ys[k]->shape, sizeof o->shape);
        any = any || differentiable(c, ret[k], ys[k]);
    }
    if (rc == 0 && any) rc = record_multi(c, inputs, n, ret, ys); /* frees c on failure */
    else ctx_free(c);
    for (int k = 0; k < nout; k++) {
        if (rc == 0) outputs[k] = ys[k];
        else if (ys) nbi_discard(ys[k]);
    }
    free(ret);
    free(ys);
    return rc;
}
