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

typedef struct {
    entry *v;
    int n, cap;
} list;

/* Parameters and buffers in two lists, each in registration order; names are
 * unique across both (they share one namespace in a checkpoint). */
struct nb_params {
    list params, buffers;
};

nb_params *nb_params_new(void) {
    nb_params *ps = calloc(1, sizeof *ps);
    if (!ps) nn_error("nb_params_new: out of memory");
    return ps;
}

static void list_free(list *l) {
    for (int i = 0; i < l->n; i++) {
        nb_free_with_owner(l->v[i].t); /* handles given out die with the registry */
        free(l->v[i].name);
    }
    free(l->v);
}

void nb_params_free(nb_params *ps) {
    if (!ps) return;
    list_free(&ps->params);
    list_free(&ps->buffers);
    free(ps);
}

static int find(const list *l, const char *name) {
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->v[i].name, name)) return i;
    return -1;
}

static bool exists(const nb_params *ps, const char *name) {
    return find(&ps->params, name) >= 0 || find(&ps->buffers, name) >= 0;
}

/* Appends a persistent handle on t's storage named prefix + name. */
static nb_tensor *append(list *l, const char *fn, const char *prefix, const char *name,
                         nb_tensor *t, bool grad) {
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 16;
        entry *v = realloc(l->v, (size_t)cap * sizeof *v);
        if (!v) return nn_error("%s: out of memory", fn);
        l->v = v;
        l->cap = cap;
    }
    size_t np = strlen(prefix), nn = strlen(name);
    char *copy = malloc(np + nn + 1);
    nb_tensor *p = copy ? nb_persistent_held(t) : NULL; /* lent out, freed by the registry */
    if (!p) {
        free(copy);
        return copy ? NULL : nn_error("%s: out of memory", fn);
    }
    memcpy(copy, prefix, np);
    memcpy(copy + np, name, nn + 1);
    nb_set_requires_grad(p, grad);
    l->v[l->n++] = (entry){copy, p};
    return p;
}

static const char *check_add(const char *fn, nb_params *ps, const char *name, nb_tensor *t) {
    if (!name && ps && nb_last_error()) return NULL; /* a name that failed to build */
    if (!ps || !name) return nn_error("%s: registry or name is NULL", fn);
    if (!nn_input(fn, t, 0)) return NULL;
    if (exists(ps, name)) return nn_error("%s: an entry named \"%s\" exists already", fn, name);
    return "";
}

nb_tensor *nb_params_add(nb_params *ps, const char *name, nb_tensor *t) {
    const char *fn = "nb_params_add";
    if (!check_add(fn, ps, name, t)) return NULL;
    nb_dtype d = nb_dtype_of(t);
    if (d != NB_F32 && d != NB_F64)
        return nn_error("%s: parameter \"%s\" must be f32 or f64, got %s", fn, name,
                        nb_dtype_name(d));
    return append(&ps->params, fn, "", name, t, true);
}

nb_tensor *nb_params_add_buffer(nb_params *ps, const char *name, nb_tensor *t) {
    const char *fn = "nb_params_add_buffer";
    if (!check_add(fn, ps, name, t)) return NULL;
    return append(&ps->buffers, fn, "", name, t, false);
}

/* Checks every new name first, so that an error leaves dst unchanged. */
int nb_params_add_all(nb_params *dst, const char *prefix, const nb_params *src) {
    const char *fn = "nb_params_add_all";
    if (!dst || !src) return nn_error("%s: registry is NULL", fn), -1;
    if (dst == src) return nn_error("%s: dst and src are the same registry", fn), -1;
    if (!prefix) prefix = "";
    const list *from[2] = {&src->params, &src->buffers};
    list *to[2] = {&dst->params, &dst->buffers};
    char name[1024];
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < from[k]->n; i++) {
            int len = snprintf(name, sizeof name, "%s%s", prefix, from[k]->v[i].name);
            if (len >= (int)sizeof name)
                return nn_error("%s: name \"%.40s...\" is too long (%d bytes, at most %zu)",
                                fn, name, len, sizeof name - 1), -1;
            if (exists(dst, name))
                return nn_error("%s: an entry named \"%s\" exists already", fn, name), -1;
        }
    int n0[2] = {to[0]->n, to[1]->n};
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < from[k]->n; i++)
            if (!append(to[k], fn, prefix, from[k]->v[i].name, from[k]->v[i].t, k == 0)) {
                for (int j = 0; j < 2; j++) /* out of memory: undo */
                    while (to[j]->n > n0[j]) {
                        to[j]->n--;
                        nb_free_with_owner(to[j]->v[to[j]->n].t);
                        free(to[j]->v[to[j]->n].name);
                    }
                return -1;
            }
    return 0;
}

nb_tensor *nb_params_get(nb_params *ps, const char *name) {
    if (!ps || !name) return nn_error("nb_params_get: registry or name is NULL");
    int i = find(&ps->params, name);
    if (i >= 0) return ps->params.v[i].t;
    i = find(&ps->buffers, name);
    if (i >= 0) return ps->buffers.v[i].t;
    return nn_error("nb_params_get: no parameter or buffer named \"%s\"", name);
}

static nb_tensor *at(const list *l, const char *fn, const char *what, int i, const char **name) {
    if (i < 0 || i >= l->n)
        return nn_error("%s: index %d out of range (%d %s)", fn, i, l->n, what);
    if (name) *name = l->v[i].name;
    return l->v[i].t;
}

int nb_params_count(const nb_params *ps) { return ps ? ps->params.n : 0; }
int nb_params_buffer_count(const nb_params *ps) { return ps ? ps->buffers.n : 0; }

nb_tensor *nb_params_at(const nb_params *ps, int i, const char **name) {
    if (!ps) return nn_error("nb_params_at: registry is NULL");
    return at(&ps->params, "nb_params_at", "parameters", i, name);
}

nb_tensor *nb_params_buffer_at(const nb_params *ps, int i, const char **name) {
    if (!ps) return nn_error("nb_params_buffer_at: registry is NULL");
    return at(&ps->buffers, "nb_params_buffer_at", "buffers", i, name);
}

int64_t nb_params_numel(const nb_params *ps) {
    int64_t n = 0;
    for (int i = 0; ps && i < ps->params.n; i++) n += nb_numel(ps->params.v[i].t);
    return n;
}

void nb_params_zero_grad(nb_params *ps) {
    for (int i = 0; ps && i < ps->params.n; i++) nb_zero_grad(ps->params.v[i].t);
}
