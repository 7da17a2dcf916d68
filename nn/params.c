/* params.c: the parameter registry, name -> persistent tensor, in the order
 * of registration (the order optimizers and checkpoints walk). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../nabla.h"
#include "nn_internal.h"

void *nn_error(const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    nb_report_error("%s", buf);
    return NULL;
}

typedef struct {
    char *name;
    nb_tensor *t;
} entry;

struct nb_params {
    entry *v;
    int n, cap;
};

nb_params *nb_params_new(void) {
    nb_params *ps = calloc(1, sizeof *ps);
    if (!ps) nn_error("nb_params_new: out of memory");
    return ps;
}

void nb_params_free(nb_params *ps) {
    if (!ps) return;
    for (int i = 0; i < ps->n; i++) {
        nb_free(ps->v[i].t);
        free(ps->v[i].name);
    }
    free(ps->v);
    free(ps);
}

static int find(const nb_params *ps, const char *name) {
    for (int i = 0; i < ps->n; i++)
        if (!strcmp(ps->v[i].name, name)) return i;
    return -1;
}

nb_tensor *nb_params_add(nb_params *ps, const char *name, nb_tensor *t) {
    const char *fn = "nb_params_add";
    if (!ps || !name) return nn_error("%s: registry or name is NULL", fn);
    if (!t) return nn_null(fn);
    if (find(ps, name) >= 0) return nn_error("%s: a parameter named \"%s\" exists already", fn, name);
    nb_dtype d = nb_dtype_of(t);
    if (d != NB_F32 && d != NB_F64)
        return nn_error("%s: parameter \"%s\" must be f32 or f64, got %s", fn, name,
                        nb_dtype_name(d));
    if (ps->n == ps->cap) {
        int cap = ps->cap ? 2 * ps->cap : 16;
        entry *v = realloc(ps->v, (size_t)cap * sizeof *v);
        if (!v) return nn_error("%s: out of memory", fn);
        ps->v = v;
        ps->cap = cap;
    }
    char *copy = malloc(strlen(name) + 1);
    nb_tensor *p = copy ? nb_persistent(t) : NULL;
    if (!p) {
        free(copy);
        return copy ? NULL : nn_error("%s: out of memory", fn);
    }
    strcpy(copy, name);
    nb_set_requires_grad(p, true);
    ps->v[ps->n++] = (entry){copy, p};
    return p;
}

nb_tensor *nb_params_get(nb_params *ps, const char *name) {
    if (!ps || !name) return nn_error("nb_params_get: registry or name is NULL");
    int i = find(ps, name);
    if (i < 0) return nn_error("nb_params_get: no parameter named \"%s\"", name);
    return ps->v[i].t;
}

int nb_params_count(const nb_params *ps) { return ps ? ps->n : 0; }

nb_tensor *nb_params_at(const nb_params *ps, int i, const char **name) {
    if (!ps || i < 0 || i >= ps->n)
        return nn_error("nb_params_at: index %d out of range (%d parameters)", i, ps ? ps->n : 0);
    if (name) *name = ps->v[i].name;
    return ps->v[i].t;
}

int64_t nb_params_numel(const nb_params *ps) {
    int64_t n = 0;
    for (int i = 0; ps && i < ps->n; i++) n += nb_numel(ps->v[i].t);
    return n;
}

void nb_params_zero_grad(nb_params *ps) {
    for (int i = 0; ps && i < ps->n; i++) nb_zero_grad(ps->v[i].t);
}
