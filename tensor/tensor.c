/* tensor.c: the life of a tensor object: allocation, views over shared
 * storage, reference counting, freeing, inspection and strided copies. */
#include "tensor_internal.h"

#include "bf16_internal.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

int64_t nb_live_tensors(void) { return nbi_tensor_objs_live(); }

size_t nbi_dtype_size(nb_dtype d) {
    switch (d) {
    case NB_F32: return 4;
    case NB_F64: return 8;
    case NB_I64: return 8;
    case NB_BOOL: return 1;
    case NB_BF16: return 2;
    }
    return 0;
}

static bool shape_has_zero(int ndim, const int64_t *shape) {
    for (int i = 0; i < ndim; i++)
        if (shape[i] == 0) return true;
    return false;
}

/* -1 also when the product of the nonzero sizes overflows: an empty tensor
 * still has the contiguous strides of its shape, and they must fit int64. */
int64_t nbi_shape_numel(int ndim, const int64_t *shape) {
    int64_t n = 1, nonzero = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return -1;
        if (shape[i] && nonzero > INT64_MAX / shape[i]) return -1;
        nonzero *= shape[i] ? shape[i] : 1;
        n *= shape[i];
    }
    return n;
}

void nbi_contiguous_strides(int ndim, const int64_t *shape, int64_t *strides) {
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        strides[i] = s;
        s *= shape[i] ? shape[i] : 1;
    }
}

bool nbi_same_shape(const nb_tensor *a, const nb_tensor *b) {
    if (a->ndim != b->ndim) return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return false;
    return true;
}

static nb_tensor *tensor_object(void) {
    nb_tensor *t = nbi_tensor_obj_alloc();
    if (!t) return NULL;
    nbi_scope_adopt(t);
    return t;
}

static bool check_shape(const char *fn, int ndim, const int64_t *shape, int64_t *numel) {
    if (ndim < 0 || ndim > NB_MAX_DIMS) {
        nbi_error("%s: ndim %d out of range (0..%d)", fn, ndim, NB_MAX_DIMS);
        return false;
    }
    if (ndim > 0 && !shape) {
        nbi_error("%s: shape is NULL for ndim %d", fn, ndim);
        return false;
    }
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) {
            nbi_error("%s: negative size %lld in shape %s", fn, (long long)shape[i],
                      nbi_shape_str(ndim, shape));
            return false;
        }
    }
    *numel = nbi_shape_numel(ndim, shape);
    if (*numel < 0) {
        /* an empty shape can still overflow: its strides are its nonzero sizes' products */
        if (shape_has_zero(ndim, shape))
            nbi_error("%s: shape %s has more strides than int64 can count", fn,
                      nbi_shape_str(ndim, shape));
        else
            nbi_error("%s: shape %s has more elements than int64 can count", fn,
                      nbi_shape_str(ndim, shape));
        return false;
    }
    return true;
}

nb_tensor *nbi_new(const char *fn, nb_dtype dtype, int ndim, const int64_t *shape, bool zero) {
    if ((unsigned)dtype > NB_BF16) return nbi_error("%s: unknown dtype %d", fn, (int)dtype);
    int64_t numel;
    if (!check_shape(fn, ndim, shape, &numel)) return NULL;
    size_t es = nbi_dtype_size(dtype);
    if ((uint64_t)numel > (SIZE_MAX - 128) / es)
        return nbi_error("%s: shape %s needs more bytes than size_t can hold", fn,
                         nbi_shape_str(ndim, shape));
    size_t nbytes = (size_t)numel * es;
    if (nbytes > (size_t)PTRDIFF_MAX - 64)
        return nbi_error("%s: out of memory: shape %s needs %zu bytes", fn,
                         nbi_shape_str(ndim, shape), nbytes);
    size_t cap = 0;
    nbi_storage *s = nbi_obj_alloc(NBI_OBJ_STORAGE, sizeof *s);
    void *data = s ? nbi_buf_alloc(nbytes, &cap) : NULL;
    if (!data) {
        nbi_obj_free(NBI_OBJ_STORAGE, s);
        return nbi_error("%s: out of memory allocating %zu bytes for shape %s", fn, nbytes,
                         nbi_shape_str(ndim, shape));
    }
    if (zero) memset(data, 0, nbytes);
    *s = (nbi_storage){.data = data, .nbytes = nbytes, .cap = cap, .refs = 1};
    nb_tensor *t = tensor_object();
    if (!t) {
        nbi_buf_free(data, cap);
        nbi_obj_free(NBI_OBJ_STORAGE, s);
        return nbi_error("%s: out of memory", fn);
    }
    t->dtype = dtype;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    nbi_contiguous_strides(ndim, shape, t->strides);
    t->numel = numel;
    t->storage = s;
    return t;
}

nb_tensor *nbi_new_like(const char *fn, const nb_tensor *t, bool zero) {
    return nbi_new(fn, t->dtype, t->ndim, t->shape, zero);
}

nb_tensor *nbi_make_view(const nb_tensor *base, int ndim, const int64_t *shape,
                         const int64_t *strides, int64_t offset) {
    nb_tensor *t = tensor_object();
    if (!t) return nbi_error("out of memory creating a view");
    t->dtype = base->dtype;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) {
        t->shape[i] = shape[i];
        t->strides[i] = strides[i];
    }
    t->offset = offset;
    t->numel = nbi_shape_numel(ndim, shape);
    t->storage = base->storage;
    t->storage->refs++;
    return t;
}

void nbi_ref(nb_tensor *t) { t->refs++; }

/* Destruction is iterative: freeing the head of a long graph releases its
 * inputs, which may release theirs, and so on. */
static _Thread_local nb_tensor **doomed;
static _Thread_local size_t ndoomed, capdoomed;

static void destroy(nb_tensor *x);

/* Queues t for destruction; if the queue cannot grow (out of memory), t is
 * destroyed right away, recursively, which is correct but uses stack. */
static void push_doomed(nb_tensor *t) {
    if (ndoomed == capdoomed) {
        size_t cap = capdoomed ? 2 * capdoomed : 64;
        nbi_thread_register();
        nb_tensor **p = realloc(doomed, cap * sizeof *p);
        if (!p) {
            destroy(t);
            return;
        }
        doomed = p;
        capdoomed = cap;
    }
    doomed[ndoomed++] = t;
}

void nbi_tensor_thread_exit(void) {
    free(doomed);
    doomed = NULL;
    ndoomed = capdoomed = 0;
}

static void release_into(nb_tensor *t) {
    if (t && --t->refs == 0) push_doomed(t);
}

void nbi_unref(nb_tensor *t) {
    if (!t) return;
    size_t base = ndoomed;
    release_into(t);
    while (ndoomed > base) destroy(doomed[--ndoomed]);
}

/* The storage of tensors whose data was dropped: no bytes, never freed. */
static nbi_storage released_storage = {.refs = 1};

static void release_storage(nbi_storage *s) {
    if (s != &released_storage && --s->refs == 0) {
        nbi_buf_free(s->data, s->cap);
        nbi_obj_free(NBI_OBJ_STORAGE, s);
    }
}

/* Drops t's data when only graph edges hold t besides `others` references.
 * Two threads may get here for one tensor at once (its owner letting go
 * while a backward elsewhere releases a node that saved it): the swap of
 * the storage pointer decides which of them releases it. */
static void drop_data_if_unneeded(nb_tensor *t, int others) {
    if (t->owned || t->holds > 0 || t->refs - others != t->edges || t->edges == 0) return;
    nbi_storage *s = __atomic_load_n(&t->storage, __ATOMIC_ACQUIRE);
    if (s == &released_storage ||
        !__atomic_compare_exchange_n(&t->storage, &s, &released_storage, false, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE))
        return;
    release_storage(s);
}

void nbi_drop_unneeded_data(nb_tensor *t) { drop_data_if_unneeded(t, 1); }
void nbi_drop_unsaved_data(nb_tensor *t) { drop_data_if_unneeded(t, 0); }

/* autograd/'s node destructor (see nbi_set_node_free). Loads pair with the
 * store (acquire/release), though a thread that holds a tensor with a node
 * has already synchronized with the thread that recorded it. */
static _Atomic(nbi_node_free_fn) node_free;

void nbi_set_node_free(nbi_node_free_fn fn) {
    /* a load first: this runs on every record, on every thread, and the
     * shared word is written once rather than bounced between caches */
    if (atomic_load_explicit(&node_free, memory_order_acquire)) return;
    nbi_node_free_fn unset = NULL;
    atomic_compare_exchange_strong_explicit(&node_free, &unset, fn, memory_order_acq_rel,
                                            memory_order_acquire);
}

static void destroy(nb_tensor *x) {
    if (x->grad_fn) {
        nbi_node_free_fn free_node = atomic_load_explicit(&node_free, memory_order_acquire);
        free_node(x->grad_fn, release_into);
    }
    release_into(x->grad);
    release_into(x->gacc);
    release_storage(x->storage);
    nbi_tensor_obj_free(x);
}

void nbi_release_owned(nb_tensor *t, int how) {
    /* relaxed: atomic only so that another thread's read is defined; the
     * object's life is the reference count's business */
    atomic_store_explicit(&t->owned, false, memory_order_relaxed);
    atomic_store_explicit(&t->freed, (uint8_t)how, memory_order_relaxed);
    if (t->refs > 1) nbi_drop_unneeded_data(t);
    nbi_unref(t);
}

void nb_free(nb_tensor *t) {
    if (!t) return;
    if (!nbi_is_tensor(t) || t->freed) { /* a second nb_free, a handle whose scope ended */
        nbi_bad_arg("nb_free", t, 0);
        return;
    }
    if (!t->owned || t->borrowed) { /* borrowed: its owner frees it */
        nbi_error("nb_free: input 0 is borrowed (a .grad, or a tensor saved by a custom "
                  "function); its owner frees it, and it was left alone");
        return;
    }
    if (!nbi_scope_of_this_thread(t->scope)) {
        nbi_error("nb_free: input 0 belongs to a scope of another thread; only that thread "
                  "may free it (nb_free, or the end of its scope)");
        return;
    }
    if (t->held) {
        nbi_error("nb_free: input 0 is held by the registry or optimizer that lent it out; it "
                  "is freed with it (nb_params_free, nb_optim_free)");
        return;
    }
    nbi_scope_release(t);
    nbi_release_owned(t, NBI_FREED_BY_FREE);
}

void nb_free_with_owner(nb_tensor *t) {
    if (!t) return;
    if (!nbi_is_tensor(t) || t->freed) {
        nbi_bad_arg("nb_free_with_owner", t, 0);
        return;
    }
    if (!t->owned) return;
    t->held = false;
    nbi_scope_release(t);
    nbi_release_owned(t, NBI_FREED_WITH_OWNER);
}

void *nbi_discard(nb_tensor *t) {
    nb_free(t);
    return NULL;
}

nb_tensor *nbi_unscoped(nb_tensor *t) {
    if (!t) return NULL;
    nbi_scope_release(t);
    atomic_store_explicit(&t->owned, false, memory_order_relaxed); /* the caller holds the one reference */
    return t;
}

/* -------------------------------------------------------------- inspection */
int nb_ndim(const nb_tensor *t) { return nbi_arg("nb_ndim", t, 0) ? t->ndim : -1; }
const int64_t *nb_shape(const nb_tensor *t) { return nbi_arg("nb_shape", t, 0) ? t->shape : NULL; }
const int64_t *nb_strides(const nb_tensor *t) {
    return nbi_arg("nb_strides", t, 0) ? t->strides : NULL;
}
int64_t nb_numel(const nb_tensor *t) { return nbi_arg("nb_numel", t, 0) ? t->numel : -1; }
nb_dtype nb_dtype_of(const nb_tensor *t) {
    return nbi_arg("nb_dtype_of", t, 0) ? t->dtype : NB_F32;
}
void *nb_data(nb_tensor *t) {
    if (!nbi_arg("nb_data", t, 0)) return NULL;
    nbi_callback_note_raw(t);
    return nbi_ptr(t);
}

void nb_mark_modified(nb_tensor *t) {
    if (nbi_opt_arg("nb_mark_modified", t, 0) && t) t->storage->version++;
}

uint64_t nb_write_version(const nb_tensor *t) {
    return nbi_arg("nb_write_version", t, 0) ? t->storage->version : 0;
}

int64_t nb_size(const nb_tensor *t, int dim) {
    if (!nbi_arg("nb_size", t, 0)) return -1;
    if (t->ndim == 0) return (nbi_error("nb_size: a 0-d tensor has no dim %d", dim), -1);
    int d = nbi_dim("nb_size", dim, t->ndim);
    return d < 0 ? -1 : t->shape[d];
}

bool nb_is_contiguous(const nb_tensor *t) {
    if (!t || !nbi_arg("nb_is_contiguous", t, 0)) return false;
    if (t->numel == 0) return true; /* as PyTorch: no elements, no layout */
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->strides[i] != s) return false;
        s *= t->shape[i];
    }
    return true;
}

int64_t nbi_flat_offset(const nb_tensor *t, int64_t i) {
    int64_t off = t->offset;
    for (int d = t->ndim - 1; d >= 0; d--) {
        int64_t n = t->shape[d];
        off += (i % n) * t->strides[d];
        i /= n;
    }
    return off;
}

static double load(nb_dtype d, const void *base, int64_t off) {
    switch (d) {
    case NB_F32: return ((const float *)base)[off];
    case NB_F64: return ((const double *)base)[off];
    case NB_I64: return (double)((const int64_t *)base)[off];
    case NB_BOOL: return ((const bool *)base)[off];
    case NB_BF16: return nbi_bf16_to_f32(((const uint16_t *)base)[off]);
    }
    return 0;
}

static int64_t to_i64(double v) {
    return (v > -9.2e18 && v < 9.2e18) ? (int64_t)v : INT64_MIN;
}

static void store(nb_dtype d, void *base, int64_t off, double v) {
    switch (d) {
    case NB_F32: ((float *)base)[off] = (float)v; break;
    case NB_F64: ((double *)base)[off] = v; break;
    case NB_I64: ((int64_t *)base)[off] = to_i64(v); break;
    case NB_BOOL: ((bool *)base)[off] = v != 0; break;
    case NB_BF16: ((uint16_t *)base)[off] = nbi_bf16_from_f64(v); break;
    }
}

double nbi_get_flat(const nb_tensor *t, int64_t i) {
    return load(t->dtype, t->storage->data, nbi_flat_offset(t, i));
}

void nbi_set_flat(nb_tensor *t, int64_t i, double v) {
    store(t->dtype, t->storage->data, nbi_flat_offset(t, i), v);
}

double nb_item(const nb_tensor *t) {
    if (!nbi_arg("nb_item", t, 0)) return NAN;
    if (t->numel != 1) {
        nbi_error("nb_item: tensor of shape %s has %lld elements; nb_item needs exactly one",
                  NBI_SHAPE(t), (long long)t->numel);
        return NAN;
    }
    nbi_callback_note_raw(t);
    return nbi_get_flat(t, 0);
}

int nb_copy_to_f64(const nb_tensor *t, double *out) {
    if (!nbi_arg("nb_copy_to_f64", t, 0)) return -1;
    if (!out) return (nbi_error("nb_copy_to_f64: out is NULL"), -1);
    nbi_callback_note_raw(t);
    const int64_t *st[1] = {t->strides};
    nbi_iter it;
    nbi_iter_init(&it, t->ndim, t->shape, 1, st);
    const void *base = nbi_ptr(t);
    int64_t k = 0, s = NBI_INNER(&it, 0);
    NBI_FOR_ROWS(&it, c)
        for (int64_t j = 0; j < it.n; j++) out[k++] = load(t->dtype, base, c.off[0] + j * s);
    return 0;
}

/* Elements per range below which splitting a copy across threads does not
 * pay (ops/ uses the same grain for its arithmetic). */
#define COPY_GRAIN ((int64_t)1 << 12)

typedef struct {
    nbi_iter it;
    nb_dtype dd, sd;
    char *d;
    const char *s;
} copy_job;

/* Rows of unit stride on both sides (a transpose's contiguous copy, by
 * rows of its last dim) are one memcpy each. */
static void copy_span(void *ctx, int64_t lo, int64_t hi) {
    const copy_job *j = ctx;
    int64_t sd = NBI_INNER(&j->it, 0), ss = NBI_INNER(&j->it, 1);
    size_t es = nbi_dtype_size(j->dd);
    NBI_FOR_SPAN(&j->it, lo, hi, c, jb, je) {
        int64_t od = c.off[0] + jb * sd, os = c.off[1] + jb * ss;
        if (j->dd == NB_BF16 && j->sd == NB_F32) /* one rounding, no detour through double */
            for (int64_t k = 0; k < je - jb; k++)
                ((uint16_t *)j->d)[od + k * sd] = nbi_bf16_from_f32(((const float *)j->s)[os + k * ss]);
        else if (j->dd == NB_F32 && j->sd == NB_BF16) /* exact, NaN payloads kept */
            for (int64_t k = 0; k < je - jb; k++)
                ((float *)j->d)[od + k * sd] = nbi_bf16_to_f32(((const uint16_t *)j->s)[os + k * ss]);
        else if (j->dd != j->sd)
            for (int64_t k = 0; k < je - jb; k++)
                store(j->dd, j->d, od + k * sd, load(j->sd, j->s, os + k * ss));
        else if (sd == 1 && ss == 1)
            memcpy(j->d + (size_t)od * es, j->s + (size_t)os * es, (size_t)(je - jb) * es);
        else
            for (int64_t k = 0; k < je - jb; k++)
                memcpy(j->d + (size_t)(od + k * sd) * es, j->s + (size_t)(os + k * ss) * es, es);
    }
}

/* dst and src have dst's shape; src is read with src_strides. They must not
 * overlap (ranges run on the thread pool). */
void nbi_copy_strided(nb_tensor *dst, const int64_t *src_strides, const nb_tensor *src) {
    const int64_t *st[2] = {dst->strides, src_strides};
    copy_job j = {.dd = dst->dtype, .sd = src->dtype, .d = nbi_ptr(dst), .s = nbi_ptr(src)};
    nbi_iter_init(&j.it, dst->ndim, dst->shape, 2, st);
    nbi_parallel_for(dst->numel, COPY_GRAIN, copy_span, &j);
}

bool nbi_has_internal_overlap(const nb_tensor *t) {
    for (int i = 0; i < t->ndim; i++)
        if (t->strides[i] == 0 && t->shape[i] > 1) return true;
    return false;
}

bool nbi_check_writable(const char *fn, const char *what, const nb_tensor *dst) {
    if (!nbi_has_internal_overlap(dst)) return true;
    nbi_error("%s: %s of shape %s has overlapping elements (an expanded view, stride 0) and "
              "cannot be written in place; pass a tensor of its own (a contiguous copy)",
              fn, what, NBI_SHAPE(dst));
    return false;
}

/* [first, last] element offsets of t's elements in its storage (numel > 0) */
static void extent(const nb_tensor *t, int64_t *lo, int64_t *hi) {
    *lo = *hi = t->offset;
    for (int d = 0; d < t->ndim; d++) {
        int64_t span = (t->shape[d] - 1) * t->strides[d];
        if (span < 0) *lo += span;
        else *hi += span;
    }
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* t's element offsets, sorted (malloc'ed; NULL when out of memory) */
static int64_t *sorted_offsets(const nb_tensor *t) {
    int64_t *o = malloc((size_t)t->numel * sizeof *o);
    if (!o) return NULL;
    for (int64_t i = 0; i < t->numel; i++) o[i] = nbi_flat_offset(t, i);
    qsort(o, (size_t)t->numel, sizeof *o, cmp_i64);
    return o;
}

/* Exact where the element sets are small enough to list (the per-channel
 * vectors and buffers this guards), else whether their byte ranges meet. */
#define NBI_OVERLAP_EXACT_MAX ((int64_t)1 << 22)
bool nbi_overlap(const nb_tensor *a, const nb_tensor *b) {
    if (a->storage != b->storage || a->numel == 0 || b->numel == 0) return false;
    int64_t alo, ahi, blo, bhi;
    extent(a, &alo, &ahi);
    extent(b, &blo, &bhi);
    size_t ea = nbi_dtype_size(a->dtype), eb = nbi_dtype_size(b->dtype);
    if ((ahi + 1) * (int64_t)ea <= blo * (int64_t)eb || (bhi + 1) * (int64_t)eb <= alo * (int64_t)ea)
        return false;
    if (ea != eb || a->numel > NBI_OVERLAP_EXACT_MAX || b->numel > NBI_OVERLAP_EXACT_MAX)
        return true;
    int64_t *oa = sorted_offsets(a), *ob = oa ? sorted_offsets(b) : NULL;
    bool meet = !ob; /* out of memory: assume they do */
    for (int64_t i = 0, j = 0; ob && !meet && i < a->numel && j < b->numel;) {
        if (oa[i] == ob[j]) meet = true;
        else if (oa[i] < ob[j]) i++;
        else j++;
    }
    free(oa);
    free(ob);
    return meet;
}

int nb_copy_into(nb_tensor *dst, const nb_tensor *src) {
    const char *fn = "nb_copy_into";
    if (!nbi_arg(fn, dst, 0) || !nbi_arg(fn, src, 1)) return -1;
    int n;
    int64_t shape[NB_MAX_DIMS];
    if (!nbi_broadcast_shape(fn, dst->ndim, dst->shape, src->ndim, src->shape, &n, shape))
        return -1;
    bool fits = n == dst->ndim;
    for (int i = 0; fits && i < n; i++) fits = shape[i] == dst->shape[i];
    if (!fits)
        return (nbi_error("%s: source of shape %s does not broadcast to destination shape %s", fn,
                          NBI_SHAPE(src), NBI_SHAPE(dst)), -1);
    if (nbi_has_internal_overlap(dst))
        return (nbi_error("%s: destination of shape %s has overlapping elements (an expanded "
                          "view); copy into a contiguous tensor instead", fn, NBI_SHAPE(dst)), -1);
    nb_tensor *tmp = NULL;
    if (src->storage == dst->storage) { /* may overlap: read from a snapshot */
        tmp = nbi_new(fn, src->dtype, src->ndim, src->shape, false);
        if (!tmp) return -1;
        nbi_copy_strided(tmp, src->strides, src);
        src = tmp;
    }
    int64_t st[NB_MAX_DIMS];
    nbi_broadcast_strides(src, dst->ndim, dst->shape, st);
    nbi_copy_strided(dst, st, src);
    dst->storage->version++;
    nb_free(tmp);
    return 0;
}
