/* ops_internal.h: what several op files share: kernels that backward rules
 * call directly (no graph is recorded by these), and nbi_alias. */
#ifndef NABLA_OPS_INTERNAL_H
#define NABLA_OPS_INTERNAL_H

#include "../autograd/autograd_internal.h"

/* Elements per range below which splitting across threads does not pay:
 * cheap arithmetic, and transcendental functions (exp, tanh, erf...). A
 * waiting worker spins, so a range costs it about a microsecond to start;
 * these grains let the small ops of a small model (the copy task at d_model
 * 64: 4K-50K elements) use both threads (1.47x instead of 1.25x a step). */
#define NBI_GRAIN ((int64_t)1 << 12)
#define NBI_GRAIN_HEAVY ((int64_t)1 << 10)
/* Items per range for items of `work` units each: grain / (work + 1) + 1,
 * without forming work + 1 when work is INT64_MAX (the reduced dim of an
 * empty (INT64_MAX, 0) tensor, where there are no items). */
static inline int64_t nbi_grain_per(int64_t grain, int64_t work) {
    return work >= grain ? 1 : grain / (work + 1) + 1;
}

/* Sums g over broadcast dims so that it has (ndim, shape); g itself when it
 * already has that shape. Recorded (nb_sum, nb_reshape) when grad mode is on
 * and g requires grad, as under create_graph. */
nb_tensor *nbi_sum_to(nb_tensor *g, int ndim, const int64_t *shape);
/* A new handle on t's elements (same storage and geometry) whose gradient
 * passes straight through: what an op returns when it has nothing to do
 * (nb_contiguous of a contiguous tensor, a cast to t's own dtype); op names
 * the node. */
nb_tensor *nbi_alias(const char *op, nb_tensor *t);
/* Expands g (the gradient of a reduction over dim, kept or not) back to shape. */
nb_tensor *nbi_unreduce(nb_tensor *g, int dim, bool keepdim, int ndim, const int64_t *shape);

#endif
