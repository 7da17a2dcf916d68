/* scope.c: every tensor belongs to the scope open when it was made; ending
 * the scope drops them all. The stack is per thread. */
#include "tensor_internal.h"

#include <stdatomic.h>

#include <stdlib.h>

struct nbi_scope {
    nb_tensor *head; /* newest first */
    nbi_scope *parent;
    const void *thread; /* the thread whose stack it is on (mine()) */
};

static _Thread_local nbi_scope *top;
static _Thread_local nbi_scope *spare; /* ended scopes, reused */
static _Thread_local int depth;
/* Scopes begun while no scope record could be allocated: their tensors stay
 * in the enclosing scope, and the matching ends do nothing. */
static _Thread_local int unrecorded;

static void link_into(nbi_scope *s, nb_tensor *t) {
    t->scope = s;
    t->prev = NULL;
    t->next = NULL;
    if (!s) return;
    t->next = s->head;
    if (s->head) s->head->prev = t;
    s->head = t;
}

void nbi_scope_adopt(nb_tensor *t) {
    t->refs = 1;
    atomic_store_explicit(&t->owned, true, memory_order_relaxed);
    link_into(top, t);
}

void nbi_scope_hand_up(nb_tensor *t) {
    nbi_scope_release(t);
    link_into(top ? top->parent : NULL, t);
}

nbi_scope *nbi_scope_current(void) { return top; }

/* A token for the calling thread: the address of one of its thread-locals. */
static const void *mine(void) { return &depth; }

bool nbi_scope_of_this_thread(const nbi_scope *s) { return !s || s->thread == mine(); }

void nbi_scope_release(nb_tensor *t) {
    nbi_scope *s = t->scope;
    if (!s) return;
    if (t->prev) t->prev->next = t->next;
    else s->head = t->next;
    if (t->next) t->next->prev = t->prev;
    t->prev = t->next = NULL;
    t->scope = NULL;
}

void nb_scope_begin(void) {
    nbi_scope *s = spare;
    if (s) spare = s->parent;
    else if (nbi_thread_register(), !(s = malloc(sizeof *s))) {
        nbi_error("nb_scope_begin: out of memory; tensors of this scope go to the enclosing one");
        unrecorded++;
        depth++;
        return;
    }
    s->head = NULL;
    s->parent = top;
    s->thread = mine();
    top = s;
    depth++;
}

void nb_scope_end(void) {
    if (nbi_callback_refuses_scope_end()) return;
    if (unrecorded > 0) {
        unrecorded--;
        depth--;
        return;
    }
    nbi_scope *s = top;
    if (!s) {
        nbi_error("nb_scope_end: no scope is open");
        return;
    }
    /* Newest first: a tensor's graph inputs are older, so they are still
     * owned when it goes and the release never recurses deeply. One at a
     * time from the head, through the list itself: code that runs as a
     * tensor goes (a custom function's destroy) may free another tensor of
     * this scope or make a new one, and the list reflects that. */
    nb_tensor *t;
    while ((t = s->head)) {
        nbi_scope_release(t);
        nbi_release_owned(t, NBI_FREED_BY_SCOPE);
    }
    top = s->parent;
    s->parent = spare;
    spare = s;
    depth--;
}

int nb_scope_depth(void) { return depth; }

/* A thread that exits with scopes open: they end, as nb_scope_end would. */
void nbi_scope_thread_exit(void) {
    while (top) nb_scope_end();
    unrecorded = 0;
    depth = 0;
    while (spare) {
        nbi_scope *s = spare;
        spare = s->parent;
        free(s);
    }
}

nb_tensor *nb_keep(nb_tensor *t) {
    if (!nbi_arg("nb_keep", t, 0)) return NULL;
    const nbi_callback *cb = nbi_callback_current();
    if (cb && cb->no_keep && depth <= cb->depth) /* would leave the range: persistent on a worker */
        return nbi_error("nb_keep: there is no scope to hand a tensor to out of nb_parallel_for's "
                         "ranges, which run on several threads (this is %s); write results into "
                         "memory the caller owns", nbi_callback_who(cb));
    nb_tensor *k = nbi_make_view(t, t->ndim, t->shape, t->strides, t->offset);
    if (!k || !top) return k;
    nbi_scope_release(k);
    nbi_scope *cur = top;
    top = cur->parent; /* adopt into the enclosing scope (or make persistent) */
    nbi_scope_adopt(k);
    top = cur;
    return k;
}

static nb_tensor *persistent(const char *fn, nb_tensor *t, bool held) {
    if (!nbi_arg(fn, t, 0)) return NULL;
    nb_tensor *k = nbi_make_view(t, t->ndim, t->shape, t->strides, t->offset);
    if (!k) return NULL;
    nbi_scope_release(k); /* owned by the caller now, like a tensor made outside scopes */
    k->held = held;
    return k;
}

nb_tensor *nb_persistent(nb_tensor *t) { return persistent("nb_persistent", t, false); }
nb_tensor *nb_persistent_held(nb_tensor *t) { return persistent("nb_persistent_held", t, true); }
