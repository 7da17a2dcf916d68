/* engine.c: recording graph nodes and walking them backward.
 *
 * Each op whose inputs require grad gives its output a node that holds the
 * inputs (referenced, so they outlive an early nb_free) and a backward rule.
 * nb_backward orders the graph topologically from the loss, then calls each
 * rule once with the summed gradient of its output. Leaves that require grad
 * accumulate into .grad, which they own. */
#include "autograd_internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* Every leaf's .grad is written under it (the walk, nb_zero_grad). Held
 * across fork, so that a child never inherits it locked. */
static pthread_mutex_t grad_mu = PTHREAD_MUTEX_INITIALIZER;
static void grad_lock(void) { pthread_mutex_lock(&grad_mu); }
static void grad_unlock(void) { pthread_mutex_unlock(&grad_mu); }
__attribute__((constructor)) static void grad_lock_atfork(void) {
    pthread_atfork(grad_lock, grad_unlock, grad_unlock);
}

void nb_set_grad_enabled(bool enabled) {
    if (enabled && nbi_callback_refuses_grad_on()) return;
    nbi_grad_off = !enabled;
}
bool nb_grad_enabled(void) { return !nbi_grad_off; }

bool nbi_needs_grad(int n, nb_tensor *const *inputs) {
    if (nbi_grad_off) return false;
    for (int i = 0; i < n; i++)
        if (inputs[i] && inputs[i]->requires_grad) return true;
    return false;
}

nbi_node *nbi_record(nb_tensor *out, const char *op, nbi_backward_fn bw, int n,
                     nb_tensor *const *inputs) {
    if (!nbi_anomaly_forward(op, out, n, inputs)) return NULL;
    return nbi_record_unchecked(out, op, bw, n, inputs);
}

/* Frees n, which holds no references yet (its recording failed) or whose
 * references release lets go of (tensor/ destroying n's output). The counts
 * go down before the references: releasing an input may destroy it at once. */
static void node_free(nbi_node *n, void (*release)(nb_tensor *t)) {
    if (n->fn_release) n->fn_release(n, true);
    for (int i = 0; i < n->nin; i++) {
        n->in[i]->edges--;
        if (i < 31 && (n->saved & NBI_SAVE_IN(i))) n->in[i]->holds--;
    }
    if (n->saved & NBI_SAVE_OUT) n->out->holds--;
    if (release) {
        for (int i = 0; i < n->nin; i++) release(n->in[i]);
        release(n->extra);
    }
    if (n->in != n->in_inline) free(n->in);
    if (n->ver != n->ver_inline) free(n->ver);
    nbi_obj_free(NBI_OBJ_NODE, n);
}

static _Atomic uint64_t next_serial = 1;
uint64_t nbi_next_node_serial(void) { return atomic_load(&next_serial); }

nbi_node *nbi_record_unchecked(nb_tensor *out, const char *op, nbi_backward_fn bw, int n,
                               nb_tensor *const *inputs) {
    /* tensor/ frees out's node when out goes, through node_free */
    nbi_set_node_free(node_free);
    nbi_node *node = nbi_obj_alloc(NBI_OBJ_NODE, sizeof *node);
    if (!node) return nbi_error("%s: out of memory recording the graph", op);
    node->in = node->in_inline;
    node->ver = node->ver_inline;
    if (n > NBI_NODE_INLINE) {
        node->in = malloc((size_t)n * sizeof *node->in);
        node->ver = malloc((size_t)n * sizeof *node->ver);
        if (!node->in || !node->ver) {
            node_free(node, NULL);
            return nbi_error("%s: out of memory recording the graph", op);
        }
    }
    node->op = op;
    node->backward = bw;
    node->out = out;
    node->autocast = nb_autocast_dtype();
    node->nin = n;
    for (int i = 0; i < n; i++) {
        node->in[i] = inputs[i];
        node->ver[i] = inputs[i]->storage->version;
        nbi_ref(inputs[i]);
        inputs[i]->edges++;
    }
    node->ver_out = out->storage->version;
    node->serial = atomic_fetch_add_explicit(&next_serial, 1, memory_order_relaxed);
    out->grad_fn = node;
    out->requires_grad = true;
    if (nbi_ckpt_top) nbi_checkpoint_saw(node);
    return node;
}

void nbi_save(nbi_node *n, uint32_t bits) {
    n->saved = bits;
    for (int i = 0; i < n->nin && i < 31; i++)
        if (bits & NBI_SAVE_IN(i)) n->in[i]->holds++;
    if (bits & NBI_SAVE_OUT) n->out->holds++;
}

static nb_tensor *unsaved(const nbi_node *n, const char *what) {
    return nbi_error("%s: backward reads %s, which the op did not declare saved (nbi_save); "
                     "its data may be gone", n->op, what);
}

nb_tensor *nbi_saved_in(const nbi_node *n, int i) {
    if (i >= 0 && i < n->nin && i < 31 && (n->saved & NBI_SAVE_IN(i))) return n->in[i];
    char what[32];
    snprintf(what, sizeof what, "input %d", i);
    return unsaved(n, what);
}

nb_tensor *nbi_saved_out(const nbi_node *n) {
    return (n->saved & NBI_SAVE_OUT) ? n->out : unsaved(n, "its output");
}

nb_tensor *nb_set_requires_grad(nb_tensor *t, bool requires_grad) {
    const char *fn = "nb_set_requires_grad";
    if (!nbi_arg(fn, t, 0)) return NULL;
    if (t->grad_fn) {
        if (requires_grad) return t;
        return nbi_error("%s: this tensor was made by %s and is not a leaf; use nb_detach to "
                         "stop gradients", fn, t->grad_fn->op);
    }
    if (requires_grad && !nbi_is_diff(t->dtype))
        return nbi_error("%s: only floating tensors (f32, f64, bf16) can require grad, got %s", fn,
                         nb_dtype_name(t->dtype));
    t->requires_grad = requires_grad;
    return t;
}

/* These accept NULL quietly (false, NULL, nothing), but not a freed handle. */
bool nb_requires_grad(const nb_tensor *t) {
    return t && nbi_arg("nb_requires_grad", t, 0) && t->requires_grad;
}
/* The checks of both hook setters: a leaf that requires grad (to set one). */
static int hook_target(const char *fn_name, const nb_tensor *leaf, bool setting) {
    if (!nbi_arg(fn_name, leaf, 0)) return -1;
    if (leaf->grad_fn)
        return (nbi_error("%s: this tensor of shape %s was made by %s and is not a leaf; hooks "
                          "go on leaves (parameters)", fn_name, NBI_SHAPE(leaf), leaf->grad_fn->op),
                -1);
    if (setting && !leaf->requires_grad) /* its hook would never run: say so */
        return (nbi_error("%s: this tensor of shape %s does not require grad, so backward never "
                          "reaches it and its hook would never run (nb_set_requires_grad first)",
                          fn_name, NBI_SHAPE(leaf)), -1);
    return 0;
}

int nb_set_grad_hook(nb_tensor *leaf, nb_grad_hook fn, void *ctx) {
    if (hook_target("nb_set_grad_hook", leaf, fn != NULL) != 0) return -1;
    leaf->grad_hook = fn;
    leaf->grad_hook_ctx = fn ? ctx : NULL;
    return 0;
}

int nb_set_grad_contribution_hook(nb_tensor *leaf, nb_grad_hook fn, void *ctx) {
    if (hook_target("nb_set_grad_contribution_hook", leaf, fn != NULL) != 0) return -1;
    leaf->contrib_hook = fn;
    leaf->contrib_hook_ctx = fn ? ctx : NULL;
    return 0;
}

/* While a contribution hook runs: its leaf and the sum so far (borrowed). */
static _Thread_local const nb_tensor *contrib_leaf;
static _Thread_local nb_tensor *contrib_sum;

nb_tensor *nb_grad_so_far(const nb_tensor *leaf) {
    if (!leaf || !nbi_arg("nb_grad_so_far", leaf, 0)) return NULL;
    return leaf == contrib_leaf ? contrib_sum : NULL;
}

bool nb_is_leaf(const nb_tensor *t) { return t && nbi_arg("nb_is_leaf", t, 0) && !t->grad_fn; }
nb_tensor *nb_grad(const nb_tensor *t) {
    return t && nbi_arg("nb_grad", t, 0) ? t->grad : NULL;
}

void nb_zero_grad(nb_tensor *t) {
    if (!t || !nbi_arg("nb_zero_grad", t, 0)) return;
    pthread_mutex_lock(&grad_mu);
    if (t->grad) {
        memset(t->grad->storage->data, 0, t->grad->storage->nbytes);
        t->grad->storage->version++;
    }
    pthread_mutex_unlock(&grad_mu);
}

void nb_clear_grad(nb_tensor *t) {
    if (!t || !nbi_arg("nb_clear_grad", t, 0)) return;
    pthread_mutex_lock(&grad_mu);
    nb_tensor *g = t->grad;
    t->grad = NULL;
    pthread_mutex_unlock(&grad_mu);
    if (!g) return;
    atomic_store_explicit(&g->freed, NBI_FREED_CLEARED, memory_order_relaxed);
    nbi_unref(g);
}

nb_tensor *nb_detach(nb_tensor *t) {
    if (!nbi_arg("nb_detach", t, 0)) return NULL;
    return nbi_make_view(t, t->ndim, t->shape, t->strides, t->offset);
}

/* ------------------------------------------------------------ the walk */
/* One backward is a walk. Its state never lives where another thread's walk
 * could meet it: a non-leaf tensor is claimed by the walk (t->walker, set by
 * compare-and-swap) and keeps its incoming gradient in t->gacc only while
 * claimed; leaves, which many walks may share (the parameters of models run
 * on several threads), get their incoming gradient in the walk's own table,
 * and their .grad is added to under a lock. A walk that meets a non-leaf
 * another walk holds stops with an error before anything is accumulated. */
typedef struct {
    nb_tensor **v;
    size_t n, cap;
} tensor_list;

static bool list_push(tensor_list *l, nb_tensor *t) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 64;
        nb_tensor **p = realloc(l->v, cap * sizeof *p);
        if (!p) return false;
        l->v = p;
        l->cap = cap;
    }
    l->v[l->n++] = t;
    return true;
}

/* The leaves a walk reaches, by address (open addressing), with the
 * gradient flowing into each. */
typedef struct {
    nb_tensor *t, *g;
} leaf_slot;
typedef struct {
    leaf_slot *v;
    size_t n, cap; /* cap: a power of two, or 0 */
} leaf_table;

static size_t leaf_hash(const nb_tensor *t, size_t cap) {
    return (size_t)(((uintptr_t)t >> 4) * 0x9E3779B97F4A7C15ULL) & (cap - 1);
}

/* t's slot; inserted when absent (*added says so). NULL when out of memory. */
static leaf_slot *leaf_slot_of(leaf_table *lt, nb_tensor *t, bool *added) {
    *added = false;
    if (2 * (lt->n + 1) > lt->cap) {
        size_t cap = lt->cap ? 2 * lt->cap : 16;
        leaf_slot *v = calloc(cap, sizeof *v);
        if (!v) return NULL;
        for (size_t k = 0; k < lt->cap; k++) {
            if (!lt->v[k].t) continue;
            size_t h = leaf_hash(lt->v[k].t, cap);
            while (v[h].t) h = (h + 1) & (cap - 1);
            v[h] = lt->v[k];
        }
        free(lt->v);
        lt->v = v;
        lt->cap = cap;
    }
    size_t h = leaf_hash(t, lt->cap);
    while (lt->v[h].t && lt->v[h].t != t) h = (h + 1) & (lt->cap - 1);
    if (!lt->v[h].t) {
        lt->v[h].t = t;
        lt->n++;
        *added = true;
    }
    return &lt->v[h];
}

typedef struct walk {
    uint64_t id;         /* this walk's claim on the non-leaves it visits */
    tensor_list order;   /* post-order: inputs before the tensors made from them */
    leaf_table leaves;
    struct walk *outer;  /* the walk this thread was in when this one began (a callback's) */
    bool create_graph;   /* rules run with grad mode on; sums are recorded */
    bool retain;         /* keep what the rules read */
    /* nb_autograd_grad: the gradients of want[0..n_want) go to got[], no
     * leaf's .grad is touched, and only rules on a path to a wanted tensor
     * run (reach: the tensors that lead to one) */
    int n_want;
    nb_tensor *const *want;
    nb_tensor **got;
    leaf_table reach;
} walk;

static _Atomic uint64_t next_walk_id = 1;
/* The walks running on this thread, innermost first: a callback of one may
 * start another backward. */
static _Thread_local walk *walks_here;

static bool walking_here(uint64_t id) {
    for (const walk *w = walks_here; w; w = w->outer)
        if (w->id == id) return true;
    return false;
}

/* The walk's hold on t: 1 newly claimed, 0 visited already, -1 held by
 * another walk (message set). */
static int claim(walk *w, nb_tensor *t) {
    uint64_t free_ = 0;
    if (atomic_compare_exchange_strong(&t->walker, &free_, w->id)) return 1;
    if (free_ == w->id) return 0;
    const nbi_callback *cb = nbi_callback_current();
    if (walking_here(free_))
        return (nbi_error("nb_backward: %s started a backward through the graph that the backward "
                          "running on this thread is walking (it met %s); a callback may "
                          "backpropagate through other graphs only",
                          cb ? nbi_callback_who(cb) : "a callback", t->grad_fn->op), -1);
    nbi_error("nb_backward: another thread is backpropagating through this graph (at %s) at "
              "the same time; a graph can be backpropagated by one thread at a time (leaves, "
              "such as parameters, may be shared)", t->grad_fn->op);
    return -1;
}

/* Visits input t of a node: a leaf goes into the table (and the order,
 * once); a non-leaf is claimed. 1: descend into t; 0: skip; -1: error. */
static int visit(walk *w, nb_tensor *t) {
    if (!t->requires_grad) return 0;
    if (t->grad_fn) return claim(w, t);
    bool added;
    if (!leaf_slot_of(&w->leaves, t, &added) || (added && !list_push(&w->order, t)))
        return (nbi_error("nb_backward: out of memory ordering the graph"), -1);
    return 0;
}

/* Post-order DFS from the root over tensors that require grad. */
typedef struct {
    nb_tensor *t;
    int next; /* next input of t's node to visit */
} frame;

static int topo_order(walk *w, nb_tensor *root) {
    if (!root->grad_fn) return visit(w, root) < 0 ? -1 : 0; /* backward of a leaf */
    int c = claim(w, root);
    if (c <= 0) return c; /* visited already (one of several roots), or an error */
    frame *stack = malloc(64 * sizeof *stack);
    size_t n = 0, cap = 64;
    int rc = stack ? 0 : -1;
    if (stack) stack[n++] = (frame){root, 0};
    while (rc == 0 && n) {
        frame *f = &stack[n - 1];
        nbi_node *node = f->t->grad_fn;
        if (f->next < node->nin) {
            nb_tensor *in = node->in[f->next++];
            int v = visit(w, in);
            if (v <= 0) {
                rc = v;
                continue;
            }
            if (n == cap) {
                frame *p = realloc(stack, 2 * cap * sizeof *p);
                if (!p) {
                    atomic_store(&in->walker, 0);
                    rc = -1;
                    break;
                }
                stack = p;
                cap *= 2;
            }
            stack[n++] = (frame){in, 0};
            continue;
        }
        if (!list_push(&w->order, f->t)) rc = -1;
        n--;
    }
    /* a non-leaf claimed but not yet in the order (stopped midway) */
    for (size_t k = 0; k < n; k++) atomic_store(&stack[k].t->walker, 0);
    free(stack);
    if (rc != 0 && !nb_last_error()) nbi_error("nb_backward: out of memory ordering the graph");
    return rc;
}

/* Where the gradient flowing into t is kept during the walk. */
static nb_tensor **incoming(walk *w, nb_tensor *t) {
    if (t->grad_fn) return &t->gacc;
    bool added;
    return &leaf_slot_of(&w->leaves, t, &added)->g; /* present: the DFS put it there */
}

/* Ends the walk: drops the gradients still pending and the claims. */
static void end_walk(walk *w) {
    for (size_t k = 0; k < w->order.n; k++) {
        nb_tensor *t = w->order.v[k];
        if (!t->grad_fn) continue;
        nbi_unref(t->gacc);
        t->gacc = NULL;
        atomic_store(&t->walker, 0);
    }
    for (size_t k = 0; k < w->leaves.cap; k++) nbi_unref(w->leaves.v[k].g);
    free(w->leaves.v);
    free(w->reach.v);
    free(w->order.v);
}

/* Adds g into *acc, which the walk holds by one reference. Under
 * create_graph a sum involving a recorded gradient is recorded too. */
static int accumulate(nb_tensor **acc_p, nb_tensor *g) {
    nb_tensor *acc = *acc_p;
    if (!acc) {
        nbi_ref(g);
        *acc_p = g;
        return 0;
    }
    if (nbi_create_graph() && (acc->requires_grad || g->requires_grad)) {
        nb_tensor *sum = nbi_sum_recorded("nb_backward", acc, g);
        if (!sum) return -1;
        *acc_p = nbi_unscoped(sum);
        nbi_unref(acc);
        return 0;
    }
    if (acc->refs == 1 && acc->storage->refs == 1 && nb_is_contiguous(acc)) {
        nbi_add_into(acc, g);
        return 0;
    }
    /* acc is shared (a gradient a rule passed on as it came, or a view of
     * one): the sum goes to a new tensor */
    nb_tensor *sum = nbi_add_new("nb_backward", acc, g);
    if (!sum) return -1;
    *acc_p = nbi_unscoped(sum);
    nbi_unref(acc);
    return 0;
}

/* A gradient only the walk holds (not a tensor of the caller's, as the seed
 * of nb_backward_with_grad is), whose storage is its own alone and exactly
 * its elements in row-major order: a leaf's first .grad can take that buffer
 * over instead of copying it (a GPT-2 step hands 0.5 GB of weight gradients
 * to their leaves). */
static bool adoptable(const nb_tensor *g) {
    return g->refs == 1 && g->storage->refs == 1 && g->offset == 0 && nb_is_contiguous(g) &&
           g->storage->nbytes == (size_t)g->numel * nbi_dtype_size(g->dtype);
}

/* Leaves' .grad: under grad_mu, so that walks on several threads sharing a
 * leaf add up (PyTorch's rule), and nb_zero_grad does not tear a sum. No
 * allocation happens under the lock, so it never nests in the allocator's. */
/* A leaf's .grad that has a graph (a create_graph backward made it), or
 * one that becomes one, is replaced by the sum, never added to in place:
 * its graph's saved values must stay as they were. */
static int replace_leaf_grad(nb_tensor *leaf, nb_tensor *g) {
    pthread_mutex_lock(&grad_mu);
    nb_tensor *old = leaf->grad;
    if (old) nbi_ref(old);
    pthread_mutex_unlock(&grad_mu);
    nb_tensor *sum = old ? nbi_sum_recorded("nb_backward", old, g) : nbi_grad_copy("nb_backward", g);
    nbi_unref(old);
    if (!sum) return -1;
    nbi_unscoped(sum);
    pthread_mutex_lock(&grad_mu);
    old = leaf->grad;
    leaf->grad = sum;
    pthread_mutex_unlock(&grad_mu);
    if (old) {
        atomic_store_explicit(&old->freed, NBI_FREED_CLEARED, memory_order_relaxed);
        nbi_unref(old);
    }
    return 0;
}

static int accumulate_leaf(nb_tensor *leaf, nb_tensor *g) {
    if (g->requires_grad || (leaf->grad && leaf->grad->requires_grad))
        return replace_leaf_grad(leaf, g);
    pthread_mutex_lock(&grad_mu);
    bool has = leaf->grad != NULL;
    if (has) {
        nbi_add_into(leaf->grad, g);
        leaf->grad->storage->version++;
    }
    pthread_mutex_unlock(&grad_mu);
    if (has) return 0;
    nb_tensor *copy;
    if (adoptable(g)) { /* the new .grad takes g's buffer, which nobody else holds */
        int64_t st[NB_MAX_DIMS];
        nbi_contiguous_strides(g->ndim, g->shape, st);
        if (!(copy = nbi_make_view(g, g->ndim, g->shape, st, 0))) return -1;
    } else {
        if (!(copy = nbi_new("nb_backward", leaf->dtype, leaf->ndim, leaf->shape, false)))
            return -1;
        nbi_copy_strided(copy, g->strides, g);
    }
    copy->from_backward = true;
    nbi_unscoped(copy);
    pthread_mutex_lock(&grad_mu);
    if (!leaf->grad) { /* another walk may have made it meanwhile */
        leaf->grad = copy;
        copy = NULL;
    } else {
        nbi_add_into(leaf->grad, g);
        leaf->grad->storage->version++;
    }
    pthread_mutex_unlock(&grad_mu);
    nbi_unref(copy);
    return 0;
}

static bool saved_intact(const nbi_node *n) {
    for (int i = 0; i < n->nin && i < 31; i++) {
        if ((n->saved & NBI_SAVE_IN(i)) && n->in[i]->storage->version != n->ver[i]) {
            nbi_error("nb_backward: input %d of %s was modified in place after it was used "
                      "(version %u, expected %u)", i, n->op, n->in[i]->storage->version,
                      n->ver[i]);
            return false;
        }
    }
    if ((n->saved & NBI_SAVE_OUT) && n->out->storage->version != n->ver_out) {
        nbi_error("nb_backward: the output of %s was modified in place after it was made "
                  "(version %u, expected %u)", n->op, n->out->storage->version, n->ver_out);
        return false;
    }
    return true;
}

/* After a backward that does not retain the graph, a node gives up what its
 * rule reads, as PyTorch frees saved tensors: an input or output nobody
 * else holds loses its data now, not when the graph goes. */
static void release_node(nbi_node *n) {
    if (n->released) return;
    n->released = true;
    uint32_t saved = n->saved;
    n->saved = 0;
    for (int i = 0; i < n->nin && i < 31; i++) {
        if (!(saved & NBI_SAVE_IN(i))) continue;
        n->in[i]->holds--;
        nbi_drop_unsaved_data(n->in[i]);
    }
    if (saved & NBI_SAVE_OUT) {
        n->out->holds--;
        nbi_drop_unsaved_data(n->out);
    }
    nbi_unref(n->extra);
    n->extra = NULL;
    if (n->fn_release) n->fn_release(n, false);
}

/* The walk whose rule is running on this thread (for nbi_grad_sink). */
static _Thread_local walk *running;
/* the inputs (< 64) whose gradient the running rule added in place, through
 * nbi_grad_sink: contributions too, for the contribution hooks */
static _Thread_local uint64_t sunk;

nb_tensor *nbi_grad_sink(const nbi_node *n, int i) {
    nb_tensor *in = n->in[i];
    if (!running || !in->requires_grad) return NULL;
    nb_tensor *acc = *incoming(running, in);
    if (!acc || acc->refs != 1 || acc->storage->refs != 1 || acc->offset != 0 ||
        !nb_is_contiguous(acc))
        return NULL;
    if (i < 64) sunk |= (uint64_t)1 << i;
    return acc;
}

static int run_grad_hook(nb_tensor *leaf, nb_tensor *sum);

/* One node: its rule runs in a scope of its own so temporaries die with it;
 * the gradients it passes on survive through the engine's references. */
static int run_node(walk *w, nb_tensor *t, nb_tensor *g) {
    nbi_node *n = t->grad_fn;
    if (!saved_intact(n)) return -1;
    /* an op's tangent rule comes with a recorded backward (registry flags
     * NB_OP_JVP and NB_OP_GRAD2 go together): one without would give a
     * gradient with no graph, silently; custom functions answer for theirs */
    if (w->create_graph && !n->jvp && !n->fn_ctx) return nbi_no_double_backward(n);
    nb_tensor *gin_inline[NBI_NODE_INLINE] = {0};
    nb_tensor **gin = gin_inline;
    if (n->nin > NBI_NODE_INLINE && !(gin = calloc((size_t)n->nin, sizeof *gin)))
        return (nbi_error("nb_backward: out of memory"), -1);
    int rc = 0;
    nb_scope_begin();
    walk *outer = running;
    uint64_t outer_sunk = sunk;
    running = w;
    sunk = 0;
    nbi_autocast_frame ac = nbi_autocast_isolate(n->autocast); /* as its forward ran */
    if (n->backward(n, g, gin) != 0 || !nbi_anomaly_backward(n, g, gin)) rc = -1;
    nbi_autocast_restore(ac);
    uint64_t added_in_place = sunk;
    running = outer;
    sunk = outer_sunk;
    for (int i = 0; rc == 0 && i < n->nin; i++) {
        nb_tensor *in = n->in[i];
        if (i < 64 && (added_in_place >> i & 1) && !gin[i] && !in->grad_fn && in->contrib_hook &&
            !w->want)
            rc = run_grad_hook(in, *incoming(w, in));
        if (!gin[i] || !in->requires_grad) continue;
        if (!nbi_same_shape(gin[i], in) || gin[i]->dtype != in->dtype) {
            nbi_error("nb_backward: internal error: %s gave a gradient of shape %s %s for input "
                      "%d of shape %s %s", n->op, NBI_SHAPE(gin[i]),
                      nb_dtype_name(gin[i]->dtype), i, NBI_SHAPE(in), nb_dtype_name(in->dtype));
            rc = -1;
        } else if (accumulate(incoming(w, in), gin[i]) != 0) {
            rc = -1;
        } else if (!in->grad_fn && in->contrib_hook && !w->want) {
            rc = run_grad_hook(in, *incoming(w, in));
        }
    }
    nb_scope_end();
    if (gin != gin_inline) free(gin);
    return rc;
}

/* A second backward through a released node would read freed tensors (or,
 * for rules that read none, add the same gradients again): refused before
 * anything is accumulated. */
static int check_not_released(const tensor_list *order) {
    for (size_t k = 0; k < order->n; k++) {
        const nbi_node *n = order->v[k]->grad_fn;
        if (n && n->released)
            return (nbi_error("nb_backward: the graph was already backpropagated through %s, and "
                              "what its backward reads was freed then; to call backward twice "
                              "through a graph, retain it the first time: nb_backward_with_opts("
                              "loss, NULL, &(nb_backward_opts){.retain_graph = true}), as "
                              "PyTorch's retain_graph=True", n->op), -1);
    }
    return 0;
}

/* A leaf's gradient-ready hook, or (contribution) its contribution hook
 * with sum, this backward's gradient so far; a failure without a message
 * gets one. */
static int run_grad_hook(nb_tensor *leaf, nb_tensor *sum) {
    uint64_t before = nbi_error_serial();
    nbi_callback cb = {.who_fmt = sum ? "the gradient contribution hook of a leaf of shape %s"
                                      : "the gradient hook of a leaf of shape %s",
                       .who_t = leaf};
    nbi_callback_enter(&cb, "nb_backward", true);
    const nb_tensor *outer_leaf = contrib_leaf;
    nb_tensor *outer_sum = contrib_sum, *view = NULL;
    if (sum) { /* the sum's handle may have died with the rule's scope: a borrowed view */
        view = nbi_unscoped(nbi_make_view(sum, sum->ndim, sum->shape, sum->strides, sum->offset));
        if (!view) return (nbi_callback_leave(&cb), -1);
    }
    contrib_leaf = sum ? leaf : NULL;
    contrib_sum = view;
    int rc = sum ? leaf->contrib_hook(leaf, leaf->contrib_hook_ctx)
                 : leaf->grad_hook(leaf, leaf->grad_hook_ctx);
    contrib_leaf = outer_leaf;
    contrib_sum = outer_sum;
    if (view) { /* its storage reference goes, so later parts may be added in place */
        atomic_store_explicit(&view->freed, (uint8_t)NBI_FREED_WITH_OWNER, memory_order_relaxed);
        nbi_unref(view);
    }
    if (nbi_callback_leave(&cb) != 0) return -1;
    if (rc == 0) return 0;
    if (nbi_error_serial() == before)
        nbi_error("nb_backward: the %s hook of a leaf of shape %s failed without a message "
                  "(report one with nb_report_error)", sum ? "gradient contribution" : "gradient-ready",
                  NBI_SHAPE(leaf));
    return -1;
}

/* nb_autograd_grad: marks the tensors on a path to a wanted one (the
 * order has inputs first), so that rules leading elsewhere never run. */
static int mark_reach(walk *w) {
    for (size_t k = 0; k < w->order.n; k++) {
        nb_tensor *t = w->order.v[k];
        bool r = false;
        for (int i = 0; i < w->n_want && !r; i++) r = w->want[i] == t;
        for (int i = 0; t->grad_fn && !r && i < t->grad_fn->nin; i++) {
            nb_tensor *in = t->grad_fn->in[i];
            bool added;
            if (!in->requires_grad) continue;
            leaf_slot *s = leaf_slot_of(&w->reach, in, &added);
            if (!s) return (nbi_error("nb_autograd_grad: out of memory ordering the graph"), -1);
            r = s->g != NULL;
        }
        bool added;
        leaf_slot *s = r ? leaf_slot_of(&w->reach, t, &added) : NULL;
        if (r && !s) return (nbi_error("nb_autograd_grad: out of memory ordering the graph"), -1);
        if (s) s->g = t; /* any non-NULL mark */
    }
    return 0;
}

static bool reaches(walk *w, nb_tensor *t) {
    bool added;
    leaf_slot *s = leaf_slot_of(&w->reach, t, &added);
    return s && s->g;
}

/* nb_autograd_grad: the whole gradient flowing into t, for each place t
 * is wanted. */
static void capture(walk *w, nb_tensor *t, nb_tensor *g) {
    for (int i = 0; i < w->n_want; i++) {
        if (w->want[i] != t) continue;
        nbi_ref(g);
        w->got[i] = g;
    }
}

/* Runs every node's rule, from the roots down (the walk is ordered). */
static int walk_graph(walk *w) {
    bool was_disabled = nbi_grad_off;
    nbi_grad_off = !w->create_graph; /* plain rules record nothing */
    nbi_trusted++;       /* and may read tensors whose handles were freed */
    int rc = 0;
    for (size_t k = w->order.n; k-- > 0 && rc == 0;) {
        nb_tensor *t = w->order.v[k];
        nb_tensor **in = incoming(w, t), *g = *in;
        if (!g) continue;
        *in = NULL;
        if (w->want) {
            capture(w, t, g);
            if (t->grad_fn && reaches(w, t)) rc = run_node(w, t, g);
        } else {
            rc = t->grad_fn ? run_node(w, t, g) : accumulate_leaf(t, g);
            if (rc == 0 && !t->grad_fn && t->grad_hook) rc = run_grad_hook(t, NULL);
        }
        if (rc == 0 && t->grad_fn && !w->retain) release_node(t->grad_fn);
        nbi_unref(g);
    }
    /* the rest (nodes no gradient reached); after a failure, the failing
     * node and those after it keep what they saved, for a look or a retry */
    for (size_t k = 0; rc == 0 && !w->retain && k < w->order.n; k++)
        if (w->order.v[k]->grad_fn) release_node(w->order.v[k]->grad_fn);
    nbi_trusted--;
    nbi_grad_off = was_disabled;
    return rc;
}

/* The roots are held for the walk: a callback that frees one (or the scope
 * holding the graph, which the callback rule refuses anyway) only drops the
 * user's handle, and the graph goes when the walk is done. seeds[k] is
 * root k's gradient. */
static int run_backward(walk *w, int n, nb_tensor *const *roots, nb_tensor *const *seeds) {
    w->id = atomic_fetch_add(&next_walk_id, 1);
    w->outer = walks_here;
    for (int k = 0; k < n; k++) nbi_ref(roots[k]);
    walks_here = w;
    int rc = 0;
    for (int k = 0; rc == 0 && k < n; k++) rc = topo_order(w, roots[k]);
    if (rc == 0) rc = check_not_released(&w->order);
    if (rc == 0 && w->want) rc = mark_reach(w);
    bool was_disabled = nbi_grad_off;
    nbi_grad_off = !w->create_graph; /* several seeds of one root add up, recorded or not */
    for (int k = 0; rc == 0 && k < n; k++) {
        rc = accumulate(incoming(w, roots[k]), seeds[k]);
        /* a backward from the leaf itself: its seed is a contribution too */
        if (rc == 0 && !roots[k]->grad_fn && roots[k]->contrib_hook && !w->want)
            rc = run_grad_hook(roots[k], *incoming(w, roots[k]));
    }
    nbi_grad_off = was_disabled;
    if (rc == 0) rc = walk_graph(w);
    end_walk(w);
    walks_here = w->outer;
    for (int k = 0; k < n; k++) nbi_unref(roots[k]);
    return rc;
}

static int check_root(const char *fn, nb_tensor *t) {
    if (!nbi_arg(fn, t, 0)) return -1;
    if (t->requires_grad) return 0;
    if (t->from_backward)
        return (nbi_error("%s: the tensor is a gradient made by a backward without "
                          "create_graph, so it has no graph and cannot be differentiated; to "
                          "differentiate a gradient again, make it with create_graph: "
                          "nb_backward_with_opts(loss, NULL, &(nb_backward_opts){.create_graph "
                          "= true}) or nb_autograd_grad with the same option", fn), -1);
    return (nbi_error("%s: the tensor does not require grad and has no graph: no input it was "
                      "made from requires grad (nb_set_requires_grad on a leaf, with grad mode "
                      "on), or it was made from a gradient of a backward without create_graph "
                      "(gradients are recorded only with nb_backward_opts.create_graph)", fn),
            -1);
}

/* The gradient of out (NULL: a one-element out gets 1), checked; it is
 * argument `noun k` of fn, for messages. */
static nb_tensor *seed_for(const char *fn, nb_tensor *out, nb_tensor *grad, const char *noun,
                           int k) {
    if (!grad) {
        if (out->numel != 1)
            return nbi_error("%s: output %d must have one element to get the gradient 1 by "
                             "default, got shape %s; pass its gradient (grad_outputs)", fn, k,
                             NBI_SHAPE(out));
        nb_tensor *seed = nbi_new(fn, out->dtype, out->ndim, out->shape, false);
        if (!seed) return NULL;
        nbi_set_flat(seed, 0, 1.0);
        return seed;
    }
    if (!nbi_live(grad) && !nbi_bad_arg_named(fn, noun, grad, k)) return NULL;
    if (!nbi_same_shape(out, grad) || out->dtype != grad->dtype)
        return nbi_error("%s: grad of shape %s %s does not match the output's %s %s", fn,
                         NBI_SHAPE(grad), nb_dtype_name(grad->dtype), NBI_SHAPE(out),
                         nb_dtype_name(out->dtype));
    if (!nbi_anomaly_seed(fn, grad)) return NULL;
    return grad;
}

static int backward_from(const char *fn, nb_tensor *out, nb_tensor *grad,
                         const nb_backward_opts *o) {
    if (check_root(fn, out) != 0) return -1;
    if (!grad && out->numel != 1)
        return (nbi_error("%s: the loss must have one element, got shape %s; use "
                          "nb_backward_with_grad for other outputs", fn, NBI_SHAPE(out)), -1);
    nb_scope_begin();
    nb_tensor *seed = seed_for(fn, out, grad, "input", 1);
    walk w = {.create_graph = o && o->create_graph,
              .retain = o && (o->retain_graph || o->create_graph)};
    int rc = seed ? run_backward(&w, 1, &out, &seed) : -1;
    nb_scope_end();
    return rc;
}

int nb_backward(nb_tensor *loss) { return backward_from("nb_backward", loss, NULL, NULL); }

int nb_backward_with_grad(nb_tensor *out, nb_tensor *grad) {
    if (!grad) return (nbi_arg("nb_backward_with_grad", grad, 1), -1);
    return backward_from("nb_backward_with_grad", out, grad, NULL);
}

int nb_backward_with_opts(nb_tensor *out, nb_tensor *grad, const nb_backward_opts *opts) {
    return backward_from("nb_backward_with_opts", out, grad, opts);
}

/* ------------------------------------------------------ nb_autograd_grad */
static int grad_args(const char *fn, nb_tensor *const *outputs, int n_outputs,
                     nb_tensor *const *inputs, int n_inputs, nb_tensor **grads) {
    if (!grads) return (nbi_error("%s: grads is NULL", fn), -1);
    for (int i = 0; i < n_inputs; i++) grads[i] = NULL;
    if (n_outputs < 1 || !outputs || n_inputs < 1 || !inputs)
        return (nbi_error("%s: needs at least one output and one input (n_outputs %d, n_inputs "
                          "%d)", fn, n_outputs, n_inputs), -1);
    for (int k = 0; k < n_outputs; k++) {
        if (!nbi_live(outputs[k]) && !nbi_bad_arg_named(fn, "output", outputs[k], k))
            return -1;
        if (!outputs[k]->requires_grad)
            return (nbi_error("%s: output %d does not require grad and has no graph%s", fn, k,
                              outputs[k]->from_backward
                                  ? " (it is a gradient made without create_graph)" : ""), -1);
    }
    for (int i = 0; i < n_inputs; i++) {
        if (!nbi_arg(fn, inputs[i], i)) return -1;
        if (!inputs[i]->requires_grad)
            return (nbi_error("%s: input %d (shape %s) does not require grad, so no gradient "
                              "flows to it", fn, i, NBI_SHAPE(inputs[i])), -1);
    }
    return 0;
}

int nb_autograd_grad(nb_tensor *const *outputs, int n_outputs, nb_tensor *const *grad_outputs,
                     nb_tensor *const *inputs, int n_inputs, const nb_backward_opts *opts,
                     nb_tensor **grads) {
    const char *fn = "nb_autograd_grad";
    if (grad_args(fn, outputs, n_outputs, inputs, n_inputs, grads) != 0) return -1;
    nb_tensor **got = calloc((size_t)n_inputs, sizeof *got);
    nb_tensor **seeds = calloc((size_t)n_outputs, sizeof *seeds);
    if (!got || !seeds) {
        free(got);
        free(seeds);
        return (nbi_error("%s: out of memory", fn), -1);
    }
    nb_scope_begin();
    int rc = 0;
    for (int k = 0; rc == 0 && k < n_outputs; k++)
        if (!(seeds[k] = seed_for(fn, outputs[k], grad_outputs ? grad_outputs[k] : NULL,
                                  "grad_output", k)))
            rc = -1;
    walk w = {.create_graph = opts && opts->create_graph,
              .retain = opts && (opts->retain_graph || opts->create_graph),
              .n_want = n_inputs, .want = inputs, .got = got};
    if (rc == 0) rc = run_backward(&w, n_outputs, outputs, seeds);
    nb_scope_end();
    /* the caller's handles: copies (recorded under create_graph) */
    bool was_disabled = nbi_grad_off;
    nbi_grad_off = !w.create_graph;
    for (int i = 0; rc == 0 && i < n_inputs; i++) {
        if (!got[i]) continue;
        if (!(grads[i] = nbi_grad_copy(fn, got[i]))) rc = -1;
        else if (!grads[i]->requires_grad) grads[i]->from_backward = true;
    }
    nbi_grad_off = was_disabled;
    for (int i = 0; i < n_inputs; i++) {
        nbi_unref(got[i]);
        if (rc != 0) grads[i] = nbi_discard(grads[i]);
    }
    free(got);
    free(seeds);
    return rc;
}

/* ------------------------------------------------- helpers of the rules */
int nbi_no_double_backward(const nbi_node *n) {
    nbi_error("nb_backward: %s has no double backward: its gradient cannot be recorded "
              "(create_graph) to be differentiated again", n->op);
    return -1;
}

static int grad_copy_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    (void)n;
    gin[0] = g;
    return 0;
}

static nb_tensor *grad_copy_jvp(nbi_node *n, nb_tensor *const *tin) {
    (void)n;
    return tin[0] ? nbi_grad_copy("nb_jvp", tin[0]) : NULL;
}

/* a + b (same shape and dtype) as one node: the gradient passes to both */
static int sum_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    (void)n;
    gin[0] = gin[1] = g;
    return 0;
}

static nb_tensor *sum_jvp(nbi_node *n, nb_tensor *const *tin) {
    (void)n;
    if (tin[0] && tin[1]) return nbi_add_new("nb_jvp", tin[0], tin[1]);
    return nbi_grad_copy("nb_jvp", tin[0] ? tin[0] : tin[1]);
}

nb_tensor *nbi_sum_recorded(const char *fn, nb_tensor *a, nb_tensor *b) {
    nb_tensor *s = nbi_add_new(fn, a, b);
    nb_tensor *in[2] = {a, b};
    if (!s || !nbi_needs_grad(2, in)) return s;
    nbi_node *n = nbi_record_unchecked(s, "sum of gradients", sum_backward, 2, in);
    if (!n) return nbi_discard(s);
    n->jvp = sum_jvp;
    return s;
}

nb_tensor *nbi_recorded_alias(nb_tensor *t) { return nbi_recorded_view(t, t); }

nb_tensor *nbi_recorded_view(nb_tensor *data, nb_tensor *history) {
    nb_tensor *v = nbi_make_view(data, data->ndim, data->shape, data->strides, data->offset);
    if (!v || !nbi_needs_grad(1, &history)) return v;
    nbi_node *n = nbi_record_unchecked(v, "identity", grad_copy_backward, 1, &history);
    if (!n) return nbi_discard(v);
    n->jvp = grad_copy_jvp;
    return v;
}

nb_tensor *nbi_grad_copy(const char *fn, nb_tensor *g) {
    nb_tensor *c = nbi_new(fn, g->dtype, g->ndim, g->shape, false);
    if (!c) return NULL;
    nbi_copy_strided(c, g->strides, g);
    if (!nbi_needs_grad(1, &g)) return c;
    nbi_node *n = nbi_record_unchecked(c, "identity", grad_copy_backward, 1, &g);
    if (!n) return nbi_discard(c);
    n->jvp = grad_copy_jvp;
    return c;
}
