/* nn_internal.h: helpers shared by the modules in nn/. nn/ sees only the
 * public API (nabla.h); errors are reported through nb_report_error. */
#ifndef NABLA_NN_INTERNAL_H
#define NABLA_NN_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "../nabla.h"

/* Reports through nb_report_error and returns NULL. */
void *nn_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Errors name the function the user called: each public nn function runs
 * its body between nn_enter() and nn_leave(fn, result) (nn_leave_rc for an
 * int result); when the outermost one on this thread fails with a message
 * that an inner function set, its name goes in front: "nb_linear: nb_matmul:
 * expected a floating tensor (f32 or f64), got i64". */
void nn_enter(void);
/* Around user code called from inside an nn function (on_token): the nn
 * functions it calls name themselves as the outermost ones. */
int nn_suspend(void);
void nn_resume(int saved);
void *nn_leave(const char *fn, void *result);
int nn_leave_rc(const char *fn, int rc);
/* Tensor argument i of fn (counted from 0) is live: true, or false with
 * nabla's message for a NULL or freed input; nn_opt_input accepts NULL. */
#define nn_input(fn, t, i) (nb_check_input((fn), (t), (i)) == 0)
#define nn_opt_input(fn, t, i) (!(t) || nn_input((fn), (t), (i)))
/* A NULL non-tensor argument (an optimizer): the same message, with the
 * earlier error that most likely made it NULL. */
/* A kernel of plain C compiled for AVX-512 and AVX2 too, the copy chosen at
 * load time (target_clones): loops over independent elements then run 8 or 4
 * doubles a vector where baseline x86-64 has 2. Every copy does the same
 * operations in the same order (the build does not contract a*b+c, -std=c11,
 * nor reassociate), so every copy gives the same bits. (As NBI_CLONES, which
 * nn/ does not see.) */
/* Not under ThreadSanitizer: the load-time resolver would run instrumented
 * before the TSan runtime is up, and crash the program at start. */
#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define NN_CLONES
#endif
#endif
#if defined(__x86_64__) && defined(__GNUC__) && defined(__has_attribute) && \
    !defined(__SANITIZE_THREAD__) && !defined(NN_CLONES)
#if __has_attribute(target_clones)
#define NN_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
#endif
#ifndef NN_CLONES
#define NN_CLONES
#endif

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

/* A hash index of names (open addressing, linear probing): name -> int, so
 * that registries and checkpoint headers of a million names stay linear.
 * Keys are borrowed: each must outlive the index. */
typedef struct {
    const char *key; /* NULL: an empty slot */
    uint32_t hash;   /* the high half of the key's 64-bit hash, to skip most strcmp */
    int value;
} nn_index_slot;

typedef struct {
    nn_index_slot *slot;
    size_t cap, n; /* cap: 0 or a power of two, at least 2n */
} nn_index;

/* Room for n keys in all, so that the next puts cannot fail: 0, or -1 when
 * out of memory (the index is unchanged). */
int nn_index_reserve(nn_index *ix, size_t n);
void nn_index_put(nn_index *ix, const char *key, int value); /* room reserved, key absent */
int nn_index_get(const nn_index *ix, const char *key);        /* its value, or -1 */
void nn_index_free(nn_index *ix);

/* The index's work, counted on each thread since it started: tests prove
 * that names cost O(1) each by counting these (tests/test_checkpoint.c),
 * never by timing; make bench times them. */
typedef struct {
    uint64_t lookups; /* nn_index_get and nn_index_put calls */
    uint64_t probes;  /* slots they visited */
    uint64_t moved;   /* slots visited by nn_index_reserve's growth: old read, new probed */
} nn_index_work;
nn_index_work nn_index_work_done(void); /* this thread's totals */

/* The one tensor name a checkpoint cannot hold: the safetensors header's
 * metadata entry. */
#define NN_RESERVED_NAME "__metadata__"

/* What nb_load requires of a registry tensor's values before it writes any
 * tensor: the optimizer's state is checked (a step count that ++ would
 * overflow, or a NaN moment, would ruin every weight at the next step).
 * nb_params_add_all copies the check with the tensor. */
typedef enum {
    NN_VALUES_ANY,
    NN_VALUES_STEP,          /* i64 in [0, NN_MAX_STEP] */
    NN_VALUES_FINITE,        /* f32/f64, finite */
    NN_VALUES_FINITE_NONNEG, /* f32/f64, finite and >= 0 (-0 included) */
} nn_values;
/* 2^53: every count up to it is exact in a double (Adam's bias correction
 * takes pow(beta, step)), and ++ from it cannot overflow. */
#define NN_MAX_STEP (INT64_C(1) << 53)

/* nb_params_add_buffer (its messages too), with a check of loaded values. */
nb_tensor *nn_params_add_checked(nb_params *ps, const char *name, nb_tensor *t,
                                 nn_values check);
/* The check of entry i: parameters 0..count-1, then buffers. */
nn_values nn_params_values(const nb_params *ps, int i);

/* U(-bound, bound) in the default dtype, registered in ps as name. */
nb_tensor *nn_uniform_param(nb_params *ps, const char *name, int ndim, const int64_t *shape,
                            double bound, nb_rng *rng);

/* Rows of len elements per nb_parallel_for task in the fused kernels of nn/
 * (layer norm, cross entropy): about 2K elements (ops/'s grain for heavy
 * arithmetic), at least one row. */
static inline int64_t nn_rows_grain(int64_t len) { return len > 0 && len < 2048 ? 2048 / len : 1; }

/* nb_gpt_init's body; draw false makes every weight 0 instead of drawing
 * it (for a load that overwrites them all). On error m is freed. */
/* Writers of several caller tensors (an optimizer step, nb_load) refuse
 * destinations that share memory. nn_shared_pair: the first pair (*a < *b)
 * of ts[0..n) that shares a memory location (nb_shares_memory) and that
 * accept(a, b, ctx) does not let pass (accept NULL: none passes); 1 when
 * found, 0 when none, -1 when out of memory. Sorted by address, only
 * tensors whose byte ranges meet are compared, so n may be large. */
int nn_shared_pair(nb_tensor *const *ts, int n, bool (*accept)(int a, int b, void *ctx),
                   void *ctx, int *a, int *b);
int nn_gpt_make(nb_GPT *m, nb_params *ps, const nb_GPTConfig *cfg, nb_rng *rng, bool draw);

#endif
