/* rng.c: a counter-based generator. Draw number c of a stream is
 * splitmix64's finalizer applied to (mixed seed + (c+1) * golden gamma)
 * (tensor_internal.h has the inline form kernels use), so
 * any element's random number is known without generating the ones before
 * it: kernels can split work across threads and get the same numbers. */
#include "tensor_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

double nbi_rng_uniform(uint64_t seed, uint64_t counter) {
    return nbi_rng_uniform_key(nbi_rng_key(seed), counter);
}

static nb_rng global_rng = {.seed = 0, .offset = 0};

nb_rng *nb_global_rng(void) { return &global_rng; }

void nb_rng_seed(nb_rng *rng, uint64_t seed) {
    if (!rng) rng = &global_rng;
    rng->seed = seed;
    rng->offset = 0;
}

void nb_manual_seed(uint64_t seed) { nb_rng_seed(&global_rng, seed); }

/* The global generator may be used by several threads at once: reserving
 * draws is atomic, so two calls never get the same numbers. A caller's own
 * nb_rng belongs to one thread at a time. */
static uint64_t take(nb_rng *rng, uint64_t n) {
    if (rng == &global_rng) return __atomic_fetch_add(&global_rng.offset, n, __ATOMIC_RELAXED);
    uint64_t first = rng->offset;
    rng->offset += n;
    return first;
}

_Thread_local nbi_rng_tape *nbi_rng_tapes;
_Thread_local int *nbi_rng_watch;

__attribute__((format(printf, 2, 3))) static void tape_break(nbi_rng_tape *t, const char *fmt,
                                                              ...) {
    if (t->broken) return; /* the first difference is the one to tell */
    t->broken = true;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->why, sizeof t->why, fmt, ap);
    va_end(ap);
}

static void tape_note(nbi_rng_tape *t, nbi_rng_draw d) {
    if (t->len == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 8;
        nbi_rng_draw *v = realloc(t->draws, cap * sizeof *v);
        if (!v) {
            tape_break(t, "out of memory recording draw %zu", t->len + 1);
            return;
        }
        t->draws = v;
        t->cap = cap;
    }
    t->draws[t->len++] = d;
}

/* The recorded draw a replaying tape hands back in place of a new one; a
 * draw that differs from the record (another stream or count) breaks the
 * tape and is drawn anew. */
static bool tape_replay(nbi_rng_tape *t, const nb_rng *rng, uint64_t n, nbi_rng_draw *d) {
    if (t->next >= t->len) {
        tape_break(t, "draw %zu (of %llu numbers) was not made in the forward", t->next + 1,
                   (unsigned long long)n);
        return false;
    }
    const nbi_rng_draw *r = &t->draws[t->next++];
    if (r->rng != rng || r->n != n) {
        tape_break(t, "draw %zu takes %llu numbers from %s stream than in the forward (%llu "
                      "numbers)", t->next, (unsigned long long)n, r->rng != rng ? "another" : "the same",
                   (unsigned long long)r->n);
        return false;
    }
    *d = *r;
    return true;
}

void nbi_rng_refuse_parallel(void) {
    if (nbi_rng_tapes)
        tape_break(nbi_rng_tapes, "random numbers were drawn inside nb_parallel_for's ranges, "
                   "which cannot be replayed (which thread runs a range varies): draw on the "
                   "function's own thread, outside nb_parallel_for");
}

uint64_t nbi_rng_take(nb_rng *rng, uint64_t n, uint64_t *seed) {
    if (!rng) rng = &global_rng;
    if (nbi_rng_watch) __atomic_store_n(nbi_rng_watch, 1, __ATOMIC_RELAXED);
    nbi_rng_tape *replayer = nbi_rng_tapes;
    while (replayer && !replayer->replay) replayer = replayer->outer;
    nbi_rng_draw d = {.rng = rng, .n = n};
    if (!replayer || !tape_replay(replayer, rng, n, &d)) {
        d.seed = rng->seed;
        d.first = take(rng, n);
    }
    for (nbi_rng_tape *t = nbi_rng_tapes; t != replayer; t = t->outer) tape_note(t, d);
    *seed = d.seed;
    return d.first;
}
