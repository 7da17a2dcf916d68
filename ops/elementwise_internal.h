/* elementwise_internal.h: the broadcasting binary kernel shared by the
 * arithmetic ops and by backward rules that need a fused gradient. */
#ifndef NABLA_ELEMENTWISE_INTERNAL_H
#define NABLA_ELEMENTWISE_INTERNAL_H

#include "ops_internal.h"
#include "registry.h"

/* NBI_add, NBI_sub, ...: the ops of NB_OPS_BINARY, then the fused gradient
 * kernels of one-input ops' backward rules. */
#define NBI_BINOP_ENUM(name, inputs, flags, call) NBI_##name,
typedef enum {
    NB_OPS_BINARY(NBI_BINOP_ENUM)
    NBI_RELU_GRAD, /* (g, x) -> x > 0 ? g : 0 */
    NBI_TANH_GRAD, /* (g, y) -> g * (1 - y^2), y = tanh(x) */
    NBI_GELU_GRAD, /* (g, x) -> g * gelu'(x) */
    NBI_SIGMOID_GRAD,   /* (g, y) -> g * (1 - y) * y, y = sigmoid(x) */
    NBI_SILU_GRAD,      /* (g, x) -> g * silu'(x) */
    NBI_ABS_GRAD,       /* (g, x) -> g * sgn(x), 0 at 0 and NaN */
    NBI_GELU_TANH_GRAD, /* (g, x) -> g * gelu_tanh'(x) */
    NBI_MAX_SHARE,      /* (a, b) -> a's share of maximum(a, b)'s gradient */
    NBI_MIN_SHARE,      /* (a, b) -> a's share of minimum(a, b)'s gradient */
    NBI_SHARE_GRAD,     /* (g, w) -> g * w, 0 where w = 0 (even for an infinite g) */
} nbi_binop;

/* Records nothing: checks (floating, same dtype, broadcastable), allocates. */
nb_tensor *nbi_binary(const char *fn, nbi_binop op, nb_tensor *a, nb_tensor *b);
void nbi_binary_into(nbi_binop op, nb_tensor *out, const nb_tensor *a, const nb_tensor *b);
/* g * w for a weight w that carries no gradient (a mask, a share), 0 where
 * w == 0 even for an infinite or NaN g (NBI_SHARE_GRAD); recorded when g
 * requires grad with grad mode on (create_graph). */
nb_tensor *nbi_weighted(const char *fn, nb_tensor *g, nb_tensor *w);

#endif
