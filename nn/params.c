/* params.c: the parameter registry, name -> persistent tensor, in the order
 * of registration (the order optimizers and checkpoints walk), with a hash
 * index of the names (also used by nn/formats/safetensors.c for headers). */
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
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

static _Thread_local int depth; /* public nn functions running on this thread */

void nn_enter(void) { depth++; }

int nn_suspend(void) {
    int d = depth;
    depth = 0;
    return d;
}
void nn_resume(int saved) { depth = saved; }

/* The outermost function puts its name before a message that an inner one
 * set (its own messages start with its name already); when that message is
 * a NULL passed along after an earlier failure, the earlier failure is the
 * reason to give. */
static void name_the_failure(const char *fn) {
    static const char after[] = ", after an earlier error: ";
    const char *m = nb_last_error();
    size_t n = strlen(fn);
    if (depth > 0 || !m || (strncmp(m, fn, n) == 0 && m[n] == ':')) return;
    const char *cause = strstr(m, after);
    nb_report_error("%s: %s", fn, cause ? cause + sizeof after - 1 : m);
}

void *nn_leave(const char *fn, void *result) {
    depth--;
    if (!result) name_the_failure(fn);
    return result;
}

int nn_leave_rc(const char *fn, int rc) {
    depth--;
    if (rc != 0) name_the_failure(fn);
    return rc;
}

/* ------------------------------------------------------------ name index */
/* FNV-1a, then the high bits folded down: the low bits pick the slot. */
static uint64_t hash_name(const char *s) {
    uint64_t h = 0xcbf29ce484222325u;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3u;
    return h ^ (h >> 29);
}

static _Thread_local nn_index_work work; /* per thread: no lock, no race */

nn_index_work nn_index_work_done(void) { return work; }

static nn_index_slot *probe(nn_index_slot *slot, size_t cap, const char *key, uint64_t h) {
    uint32_t tag = (uint32_t)(h >> 32);
    uint64_t visited = 1;
    size_t i = (size_t)h & (cap - 1);
    for (; slot[i].key && (slot[i].hash != tag || strcmp(slot[i].key, key)); visited++)
        i = (i + 1) & (cap - 1);
    work.probes += visited;
    return &slot[i];
}

int nn_index_reserve(nn_index *ix, size_t n) {
    if (n <= ix->cap / 2) return 0;
    size_t cap = ix->cap ? ix->cap : 16;
    while (cap / 2 < n) {
        if (cap > SIZE_MAX / 2 / sizeof *ix->slot) return -1;
        cap *= 2;
    }
    nn_index_slot *slot = calloc(cap, sizeof *slot);
    if (!slot) return -1;
    uint64_t moved = ix->cap;
    for (size_t i = 0; i < ix->cap; i++) {
        const nn_index_slot *s = &ix->slot[i];
        if (!s->key) continue;
        size_t k = (size_t)hash_name(s->key) & (cap - 1);
        for (moved++; slot[k].key; moved++) k = (k + 1) & (cap - 1);
        slot[k] = *s;
    }
    work.moved += moved;
    free(ix->slot);
    ix->slot = slot;
    ix->cap = cap;
    return 0;
}

void nn_index_put(nn_index *ix, const char *key, int value) {
    work.lookups++;
    uint64_t h = hash_name(key);
    nn_index_slot *s = probe(ix->slot, ix->cap, key, h);
    if (!s->key) ix->n++;
    *s = (nn_index_slot){key, (uint32_t)(h >> 32), value};
}

int nn_index_get(const nn_index *ix, const char *key) {
    work.lookups++;
    if (ix->n == 0) return -1;
    const nn_index_slot *s = probe(ix->slot, ix->cap, key, hash_name(key));
    return s->key ? s->value : -1;
}

void nn_index_free(nn_index *ix) {
    free(ix->slot);
    *ix = (nn_index){0};
}

/* ------------------------------------------------------------ the registry */
typedef struct {
    char *name;
    nb_tensor *t;
    nn_values check; /* of values nb_load reads into t */
} entry;

typedef struct {
    entry *v;
    int n, cap;
} list;

/* Parameters and buffers in two lists, each in registration order; names are
 * unique across both (they share one namespace in a checkpoint), and the
 * index maps each name to 2 * position + (1 for a buffer). */
struct nb_params {
    list params, buffers;
    nn_index index;
    int holds;         /* nb_params_hold minus nb_params_release */
    bool free_pending; /* nb_params_free while held: done at the last release */
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

void nb_params_hold(nb_params *ps) {
    if (ps) ps->holds++;
}

void nb_params_release(nb_params *ps) {
    if (!ps) return;
    if (ps->holds <= 0) {
        nn_error("nb_params_release: the registry is not held (nb_params_hold first)");
        return;
    }
    if (--ps->holds == 0 && ps->free_pending) nb_params_free(ps);
}

void nb_params_free(nb_params *ps) {
    if (!ps) return;
    if (ps->holds > 0) { /* in use by its holder (a callback freed it): at the last release */
        ps->free_pending = true;
        return;
    }
    list_free(&ps->params);
    list_free(&ps->buffers);
    nn_index_free(&ps->index);
    free(ps);
}

static const entry *find(const nb_params *ps, const char *name) {
    int k = nn_index_get(&ps->index, name);
    if (k < 0) return NULL;
    const list *l = k & 1 ? &ps->buffers : &ps->params;
    return &l->v[k >> 1];
}

/* Room for k more entries in each list and in the index, so that what
 * follows fails only in the allocations of one entry. */
static int reserve(nb_params *ps, int kp, int kb) {
    list *l[2] = {&ps->params, &ps->buffers};
    int more[2] = {kp, kb};
    for (int j = 0; j < 2; j++) {
        if (more[j] > INT_MAX / 2 - l[j]->n) return -1; /* the index's values are 2n + 1 */
        if (l[j]->n + more[j] <= l[j]->cap) continue;
        int cap = l[j]->cap ? l[j]->cap : 16;
        while (cap < l[j]->n + more[j]) cap = cap > INT_MAX / 4 ? INT_MAX / 2 : 2 * cap;
        entry *v = realloc(l[j]->v, (size_t)cap * sizeof *v);
        if (!v) return -1;
        l[j]->v = v;
        l[j]->cap = cap;
    }
    return nn_index_reserve(&ps->index, (size_t)ps->params.n + (size_t)ps->buffers.n +
                                            (size_t)kp + (size_t)kb);
}

/* Appends a persistent handle on t's storage named prefix + name (room
 * reserved); the caller indexes it. */
static nb_tensor *append(list *l, const char *fn, const char *prefix, const char *name,
                         nb_tensor *t, bool grad, nn_values check) {
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
    l->v[l->n++] = (entry){copy, p, check};
    return p;
}

static void index_last(nb_params *ps, bool buffer) {
    const list *l = buffer ? &ps->buffers : &ps->params;
    nn_index_put(&ps->index, l->v[l->n - 1].name, 2 * (l->n - 1) + buffer);
}

static void *reserved(const char *fn) {
    return nn_error("%s: \"%s\" is reserved by the safetensors format (its header's metadata "
                    "entry) and cannot name a tensor", fn, NN_RESERVED_NAME);
}

static const char *check_add(const char *fn, nb_params *ps, const char *name, nb_tensor *t) {
    if (!name && ps && nb_last_error()) return NULL; /* a name that failed to build */
    if (!ps || !name) return nn_error("%s: registry or name is NULL", fn);
    if (!nn_input(fn, t, 0)) return NULL;
    if (!strcmp(name, NN_RESERVED_NAME)) return reserved(fn);
    if (find(ps, name)) return nn_error("%s: an entry named \"%s\" exists already", fn, name);
    return "";
}

static nb_tensor *add_one(nb_params *ps, const char *fn, const char *name, nb_tensor *t,
                          bool buffer, nn_values check) {
    if (reserve(ps, !buffer, buffer) != 0) return nn_error("%s: out of memory", fn);
    nb_tensor *p = append(buffer ? &ps->buffers : &ps->params, fn, "", name, t, !buffer, check);
    if (p) index_last(ps, buffer);
    return p;
}

nb_tensor *nb_params_add(nb_params *ps, const char *name, nb_tensor *t) {
    const char *fn = "nb_params_add";
    if (!check_add(fn, ps, name, t)) return NULL;
    nb_dtype d = nb_dtype_of(t);
    if (d != NB_F32 && d != NB_F64)
        return nn_error("%s: parameter \"%s\" must be f32 or f64, got %s", fn, name,
                        nb_dtype_name(d));
    return add_one(ps, fn, name, t, false, NN_VALUES_ANY);
}

nb_tensor *nn_params_add_checked(nb_params *ps, const char *name, nb_tensor *t,
                                 nn_values check) {
    const char *fn = "nb_params_add_buffer";
    if (!check_add(fn, ps, name, t)) return NULL;
    return add_one(ps, fn, name, t, true, check);
}

nb_tensor *nb_params_add_buffer(nb_params *ps, const char *name, nb_tensor *t) {
    return nn_params_add_checked(ps, name, t, NN_VALUES_ANY);
}

nn_values nn_params_values(const nb_params *ps, int i) {
    if (!ps || i < 0) return NN_VALUES_ANY;
    if (i < ps->params.n) return ps->params.v[i].check;
    i -= ps->params.n;
    return i < ps->buffers.n ? ps->buffers.v[i].check : NN_VALUES_ANY;
}

/* Each new name is free: src's names are distinct, so prefix + name are too. */
static int check_names(nb_params *dst, const char *prefix, const nb_params *src) {
    const char *fn = "nb_params_add_all";
    const list *from[2] = {&src->params, &src->buffers};
    char name[1024];
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < from[k]->n; i++) {
            int len = snprintf(name, sizeof name, "%s%s", prefix, from[k]->v[i].name);
            if (len >= (int)sizeof name)
                return nn_error("%s: name \"%.40s...\" is too long (%d bytes, at most %zu)",
                                fn, name, len, sizeof name - 1), -1;
            if (!strcmp(name, NN_RESERVED_NAME)) return reserved(fn), -1;
            if (find(dst, name))
                return nn_error("%s: an entry named \"%s\" exists already", fn, name), -1;
        }
    return 0;
}

/* Checks every new name and makes room first, so that an error leaves dst
 * unchanged; the new names are indexed once all are in. */
int nb_params_add_all(nb_params *dst, const char *prefix, const nb_params *src) {
    const char *fn = "nb_params_add_all";
    if (!dst || !src) return nn_error("%s: registry is NULL", fn), -1;
    if (dst == src) return nn_error("%s: dst and src are the same registry", fn), -1;
    if (!prefix) prefix = "";
    if (check_names(dst, prefix, src) != 0) return -1;
    if (reserve(dst, src->params.n, src->buffers.n) != 0)
        return nn_error("%s: out of memory", fn), -1;
    const list *from[2] = {&src->params, &src->buffers};
    list *to[2] = {&dst->params, &dst->buffers};
    int n0[2] = {to[0]->n, to[1]->n};
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < from[k]->n; i++) {
            const entry *e = &from[k]->v[i];
            if (!append(to[k], fn, prefix, e->name, e->t, k == 0, e->check)) {
                for (int j = 0; j < 2; j++) /* out of memory: undo */
                    while (to[j]->n > n0[j]) {
                        to[j]->n--;
                        nb_free_with_owner(to[j]->v[to[j]->n].t);
                        free(to[j]->v[to[j]->n].name);
                    }
                return -1;
            }
        }
    for (int k = 0; k < 2; k++)
        for (int i = n0[k]; i < to[k]->n; i++)
            nn_index_put(&dst->index, to[k]->v[i].name, 2 * i + k);
    return 0;
}

nb_tensor *nb_params_get(nb_params *ps, const char *name) {
    if (!ps || !name) return nn_error("nb_params_get: registry or name is NULL");
    const entry *e = find(ps, name);
    if (e) return e->t;
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

/* ------------------------------------------------- destinations that meet */
typedef struct {
    uintptr_t lo, hi; /* bytes [lo, hi) */
    int i;
} extent;

static int cmp_extent(const void *a, const void *b) {
    const extent *x = a, *y = b;
    return (x->lo > y->lo) - (x->lo < y->lo);
}

int nn_shared_pair(nb_tensor *const *ts, int n, bool (*accept)(int a, int b, void *ctx),
                   void *ctx, int *a, int *b) {
    extent *v = malloc((size_t)(n > 0 ? n : 1) * sizeof *v);
    if (!v) return -1;
    int k = 0;
    for (int i = 0; i < n; i++) {
        nb_tensor *t = ts[i];
        if (nb_numel(t) == 0) continue;
        int64_t es = nb_dtype_of(t) == NB_F64 || nb_dtype_of(t) == NB_I64 ? 8
                     : nb_dtype_of(t) == NB_F32                           ? 4
                     : nb_dtype_of(t) == NB_BF16                          ? 2
                                                                          : 1;
        uintptr_t lo = (uintptr_t)nb_data(t), hi = lo;
        for (int d = 0; d < nb_ndim(t); d++) {
            int64_t span = (nb_shape(t)[d] - 1) * nb_strides(t)[d] * es;
            if (span < 0) lo -= (uintptr_t)-span;
            else hi += (uintptr_t)span;
        }
        v[k++] = (extent){lo, hi + (uintptr_t)es, i};
    }
    qsort(v, (size_t)k, sizeof *v, cmp_extent);
    int found = 0;
    /* a cluster: extents that chain into each other; only within one can two meet */
    for (int j = 1, start = 0; j < k && !found; j++) {
        uintptr_t reach = 0;
        for (int i = start; i < j; i++) reach = v[i].hi > reach ? v[i].hi : reach;
        if (v[j].lo >= reach) {
            start = j;
            continue;
        }
        for (int i = start; i < j && !found; i++) {
            int x = v[i].i < v[j].i ? v[i].i : v[j].i, y = v[i].i < v[j].i ? v[j].i : v[i].i;
            if (v[i].hi <= v[j].lo || !nb_shares_memory(ts[x], ts[y])) continue;
            if (accept && accept(x, y, ctx)) continue;
            *a = x, *b = y, found = 1;
        }
    }
    free(v);
    return found;
}
