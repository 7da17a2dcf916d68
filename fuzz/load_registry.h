/* load_registry.h: the registry fuzz_load.c loads into and gen_seeds.c saves
 * from, with its sentinel values and byte snapshots. Header-only, static
 * inline functions: included by exactly those two programs.
 *
 * Every dtype a checkpoint can hold, contiguous and not (the staged-copy path
 * of nb_load), a 0-d and an empty tensor, and a name that needs JSON escapes:
 *   params   w0 F32 (), w F32 (2,3), NAME_ESC F64 (4), dt F64 (3,2) transposed,
 *            e F32 (0,3)
 *   buffers  steps I64 (3), mask BOOL (2,2), maskT BOOL (3,2) transposed */
#ifndef NABLA_FUZZ_LOAD_REGISTRY_H
#define NABLA_FUZZ_LOAD_REGISTRY_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../nabla.h"

/* d"q\<TAB>é: a quote, a backslash, a control character and UTF-8 */
#define NAME_ESC "d\"q\\\t\xc3\xa9"
#define REG_MAX 8

typedef struct {
    nb_params *ps;
    int n;
    nb_tensor *t[REG_MAX]; /* borrowed from ps, registration order (params, buffers) */
    const char *name[REG_MAX];
    size_t nbytes[REG_MAX];                 /* numel * element size */
    unsigned char sentinel[REG_MAX][64];    /* row-major bytes */
} fuzz_registry;

static inline void reg_die(const char *what) {
    fprintf(stderr, "fuzz registry: %s: %s\n", what, nb_last_error() ? nb_last_error() : "?");
    abort();
}

static inline size_t reg_elem_size(nb_dtype d) {
    return d == NB_F32 ? 4 : d == NB_BOOL ? 1 : 8;
}

/* Copies t's elements, row-major, to or from buf (element-wise memcpy
 * through t's own shape and strides; independent of nb_contiguous). */
static inline void reg_strided(nb_tensor *t, unsigned char *buf, bool to_tensor) {
    int nd = nb_ndim(t);
    const int64_t *sh = nb_shape(t), *st = nb_strides(t);
    int64_t n = nb_numel(t), idx[NB_MAX_DIMS] = {0};
    size_t es = reg_elem_size(nb_dtype_of(t));
    unsigned char *base = nb_data(t);
    for (int64_t i = 0; i < n; i++) {
        int64_t off = 0;
        for (int d = 0; d < nd; d++) off += idx[d] * st[d];
        if (to_tensor) memcpy(base + off * (int64_t)es, buf + (size_t)i * es, es);
        else memcpy(buf + (size_t)i * es, base + off * (int64_t)es, es);
        for (int d = nd - 1; d >= 0; d--) {
            if (++idx[d] < sh[d]) break;
            idx[d] = 0;
        }
    }
}

/* A transposed (rows, cols) view of a fresh (cols, rows) tensor, as a
 * persistent tensor (the base is freed; the view keeps the storage). */
static inline nb_tensor *reg_transposed(nb_dtype dt, int64_t rows, int64_t cols) {
    nb_tensor *base = nb_zeros(dt, NB_SHAPE(cols, rows));
    nb_tensor *v = base ? nb_transpose(base, 0, 1) : NULL;
    nb_free(base);
    return v;
}

static inline void reg_add(fuzz_registry *r, const char *name, nb_tensor *t, bool buffer) {
    if (!t) reg_die(name);
    nb_tensor *h = buffer ? nb_params_add_buffer(r->ps, name, t) : nb_params_add(r->ps, name, t);
    nb_free(t);
    if (!h) reg_die(name);
    r->t[r->n] = h;
    r->name[r->n] = name;
    r->nbytes[r->n] = (size_t)nb_numel(h) * reg_elem_size(nb_dtype_of(h));
    if (r->nbytes[r->n] > sizeof r->sentinel[0]) reg_die("sentinel too small");
    /* sentinel: a byte pattern of its own per tensor (bools 0/1) */
    for (size_t b = 0; b < r->nbytes[r->n]; b++)
        r->sentinel[r->n][b] = nb_dtype_of(h) == NB_BOOL ? (unsigned char)((b + r->n) % 2)
                                                         : (unsigned char)(0x11 * (r->n + 1) + 7 * b);
    r->n++;
}

static inline void reg_build(fuzz_registry *r) {
    memset(r, 0, sizeof *r);
    if (!(r->ps = nb_params_new())) reg_die("nb_params_new");
    reg_add(r, "w0", nb_zeros(NB_F32, 0, NULL), false);
    reg_add(r, "w", nb_zeros(NB_F32, NB_SHAPE(2, 3)), false);
    reg_add(r, NAME_ESC, nb_zeros(NB_F64, NB_SHAPE(4)), false);
    reg_add(r, "dt", reg_transposed(NB_F64, 3, 2), false);
    reg_add(r, "e", nb_zeros(NB_F32, NB_SHAPE(0, 3)), false);
    reg_add(r, "steps", nb_zeros(NB_I64, NB_SHAPE(3)), true);
    reg_add(r, "mask", nb_zeros(NB_BOOL, NB_SHAPE(2, 2)), true);
    reg_add(r, "maskT", reg_transposed(NB_BOOL, 3, 2), true);
}

static inline void reg_set_sentinels(fuzz_registry *r) {
    for (int i = 0; i < r->n; i++) reg_strided(r->t[i], r->sentinel[i], true);
}

static inline void reg_snapshot(fuzz_registry *r, unsigned char snap[REG_MAX][64]) {
    for (int i = 0; i < r->n; i++) reg_strided(r->t[i], snap[i], false);
}

#endif
