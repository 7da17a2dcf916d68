/* nn_internal.h: helpers shared by the modules in nn/. nn/ sees only the
 * public API (nabla.h); errors are reported through nb_report_error. */
#ifndef NABLA_NN_INTERNAL_H
#define NABLA_NN_INTERNAL_H

#include <stdbool.h>
#include <stdio.h>

#include "../nabla.h"

/* Reports through nb_report_error and returns NULL. */
void *nn_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Tensor argument i of fn (counted from 0) is live: true, or false with
 * nabla's message for a NULL or freed input; nn_opt_input accepts NULL. */
#define nn_input(fn, t, i) (nb_check_input((fn), (t), (i)) == 0)
#define nn_opt_input(fn, t, i) (!(t) || nn_input((fn), (t), (i)))
/* A NULL non-tensor argument (an optimizer): the same message, with the
 * earlier error that most likely made it NULL. */
static inline void *nn_null(const char *fn) {
    nb_check_input(fn, NULL, 0);
    return NULL;
}

/* "(2,3,4)" into buf */
static inline const char *nn_shape_str(char *buf, size_t cap, int ndim, const int64_t *shape) {
    size_t n = (size_t)snprintf(buf, cap, "(");
    for (int i = 0; i < ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? "," : "", (long long)shape[i]);
    if (n < cap) snprintf(buf + n, cap - n, ")");
    return buf;
}
/* a tensor's shape, into a char array buf */
#define NN_SHAPE(buf, t) nn_shape_str((buf), sizeof(buf), nb_ndim(t), nb_shape(t))

/* "name.suffix" into buf (module parameter names); NULL, with a message
 * naming fn, when it does not fit (nb_params_add keeps that message). */
static inline const char *nn_join(const char *fn, char *buf, size_t cap, const char *name,
                                  const char *suffix) {
    bool any = name && *name;
    int n = snprintf(buf, cap, "%s%s%s", any ? name : "", any ? "." : "", suffix);
    if (n >= 0 && (size_t)n < cap) return buf;
    return nn_error("%s: parameter name \"%.40s...\" is too long (%d bytes, at most %zu)", fn,
                    buf, n, cap - 1);
}

/* U(-bound, bound) in the default dtype, registered in ps as name. */
nb_tensor *nn_uniform_param(nb_params *ps, const char *name, int ndim, const int64_t *shape,
                            double bound, nb_rng *rng);

#endif
