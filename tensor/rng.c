/* rng.c: a counter-based generator. Draw number c of a stream is
 * splitmix64's finalizer applied to (mixed seed + (c+1) * golden gamma)
 * (tensor_internal.h has the inline form kernels use), so
 * any element's random number is known without generating the ones before
 * it: kernels can split work across threads and get the same numbers. */
#include "tensor_internal.h"

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
uint64_t nbi_rng_take(nb_rng *rng, uint64_t n) {
    if (!rng || rng == &global_rng)
        return __atomic_fetch_add(&global_rng.offset, n, __ATOMIC_RELAXED);
    uint64_t first = rng->offset;
    rng->offset += n;
    return first;
}
