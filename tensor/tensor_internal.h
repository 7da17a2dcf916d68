/* tensor_internal.h: the tensor object, its storage and the helpers every op
 * uses (errors, allocation, strided iteration, threads, scopes). The bottom
 * layer: it includes nothing of autograd/, ops/ or nn/ (tests/layers_check.sh).
 * Not part of the public API: nn/ and users see only nabla.h. */
#ifndef NABLA_TENSOR_INTERNAL_H
#define NABLA_TENSOR_INTERNAL_H

#include "../nabla.h"

#include <stdarg.h>
#include <stdio.h>

typedef struct nbi_storage {
    void *data;
    size_t nbytes;
    size_t cap;        /* bytes reserved (alloc.c's size class) */
    _Atomic int refs;  /* tensors (views) sharing it; atomic: threads may share params */
    uint32_t version;  /* bumped by every in-place write (nb_copy_into) */
} nbi_storage;

typedef struct nbi_node nbi_node;
typedef struct nbi_scope nbi_scope;

/* The first word of every tensor object, from its allocation on: a handle
 * whose first word differs is no tensor (a pointer to something else), and
 * the argument checks say so rather than read it as one. */
#define NBI_TENSOR_MAGIC 0x6e61626cu /* "nabl" */
struct nb_tensor {
    uint32_t magic;
    nb_dtype dtype;
    int ndim;
    int64_t shape[NB_MAX_DIMS];
    int64_t strides[NB_MAX_DIMS]; /* in elements */
    int64_t offset;               /* in elements */
    int64_t numel;
    nbi_storage *storage;

    /* autograd */
    bool requires_grad;
    nbi_node *grad_fn;   /* NULL for leaves; owned */
    nb_tensor *grad;     /* leaves: accumulated gradient; owned */
    nb_grad_hook grad_hook; /* leaves: nb_set_grad_hook's, or NULL */
    void *grad_hook_ctx;
    nb_grad_hook contrib_hook; /* leaves: nb_set_grad_contribution_hook's, or NULL */
    void *contrib_hook_ctx;
    nb_tensor *gacc;     /* engine: gradient flowing in, while a backward holds it (non-leaves) */
    _Atomic uint64_t walker; /* engine: the backward walking through it now, 0 if none */
    bool from_backward;  /* a gradient a backward made without create_graph (for messages) */

    /* ownership: refs counts the owner (scope or user, while `owned`) plus
     * every graph node and engine slot that holds this tensor. */
    _Atomic int refs;
    _Atomic int edges;       /* graph nodes that have it as an input (part of refs) */
    _Atomic int holds;       /* those of them whose backward reads its data */
    _Atomic bool owned;      /* atomic, as freed: another thread may free a tensor a backward reads */
    bool held;               /* persistent, held by an owner that lends it out (a registry) */
    bool borrowed;           /* lent to user code for a call (a custom backward's saved
                              * tensor under create_graph): nb_free refuses it, its scope
                              * frees it */
    nbi_scope *scope;        /* scope that owns it; NULL = persistent */
    nb_tensor *prev, *next;  /* membership list of that scope (alloc.c's quarantine, once dead) */

    /* The handle's life, checked by every public function: NBI_LIVE, or how
     * the user's handle died. The object itself may live on (a graph holds
     * it), and once destroyed it sits in a quarantine (alloc.c) for at least
     * NB_HANDLE_WINDOW tensor allocations before its memory is reused, so
     * a stale handle is reported, not read. */
    _Atomic uint8_t freed;
    uint64_t freed_at; /* quarantine: the allocation count when destroyed */
};
enum { NBI_LIVE = 0, NBI_FREED_BY_FREE, NBI_FREED_BY_SCOPE, NBI_FREED_WITH_OWNER, NBI_FREED_CLEARED };


/* -------------------------------------------------------------- errors */
/* Sets the thread's message (printf-style) and returns NULL. */
void *nbi_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* For a failure that is most likely the result of an earlier one (a NULL
 * argument, a callback that returned NULL), whose message quotes that one:
 * the earlier message (the last set by nbi_error, NULL if none since
 * nb_clear_error), and nbi_error's twin that leaves it in place. */
const char *nbi_error_cause(void);
void *nbi_error_quoting(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Counts the messages set on this thread: a callback that failed without
 * reporting anything leaves it unchanged. */
uint64_t nbi_error_serial(void);
/* One line "nabla: ..." on stderr about a variable of the environment that
 * nabla ignores (a value it cannot read): say it once, with what runs
 * instead. */
void nbi_env_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Argument checks for tensor handles (input i of fn, counted from 0): true
 * when t is a live tensor; otherwise false with a message: "fn: input i is
 * NULL" (followed by the earlier error that most likely made the NULL, when
 * one is set) or "fn: input i was freed (by nb_free)". nbi_opt_arg accepts
 * NULL (an optional argument). */
bool nbi_bad_arg(const char *fn, const nb_tensor *t, int i);
/* The same for arguments of another kind ("output 0", "tangent 1"). */
bool nbi_bad_arg_named(const char *fn, const char *noun, const nb_tensor *t, int i);
/* A tensor handle that may be used: a tensor object not freed. */
static inline bool nbi_live(const nb_tensor *t) {
    return t && t->magic == NBI_TENSOR_MAGIC && !t->freed;
}
static inline bool nbi_is_tensor(const nb_tensor *t) { return t->magic == NBI_TENSOR_MAGIC; }
static inline bool nbi_arg(const char *fn, const nb_tensor *t, int i) {
    return nbi_live(t) || nbi_bad_arg(fn, t, i);
}
/* How a freed handle went, in a word for messages: "nb_free" or "with its owner". */
static inline const char *nbi_freed_how(const nb_tensor *t) {
    return t->freed == NBI_FREED_BY_FREE ? "nb_free" : "with its owner";
}
static inline bool nbi_opt_arg(const char *fn, const nb_tensor *t, int i) {
    return !t || nbi_live(t) || nbi_bad_arg(fn, t, i);
}
/* The backward engine runs built-in rules on tensors whose user handles
 * were freed while a graph still holds them; inside, freed handles pass the
 * argument checks. User callbacks (custom functions) run untrusted. */
extern _Thread_local int nbi_trusted;
/* User code nabla calls (callback.c): nbi_callback_enter before the call,
 * nbi_callback_leave after it, on the same thread, strictly nested. In
 * between, nb_scope_end refuses to close scopes opened before the callback
 * and, with grad_stays_off (for this callback only),
 * nb_set_grad_enabled(true) is refused; leave drops callback frames (of
 * nb_callback_begin) it left open, closes the scopes the callback
 * left open, restores grad mode (and nbi_trusted, which is 0 inside: user
 * code is never trusted) and returns -1 with a message "<fn>: <who> ..."
 * when the callback did any of that, else 0. The caller fills in who_*
 * first; who is formatted only for a message (a callback runs often):
 * who_fmt with who_s (a %s), or the shape of who_t (a %s), or who_lo and
 * who_hi (two %lld), or nothing. */
typedef struct nbi_callback {
    const char *who_fmt, *who_s;
    const nb_tensor *who_t;
    long long who_lo, who_hi;
    const char *fn;
    int level; /* 1 + the callbacks running around it on this thread */
    int depth, trusted;
    bool grad_was_off, grad_stays_off, public_;
    bool no_keep; /* nb_parallel_for's fn: no scope outside its range to hand tensors to */
    int token;    /* public frames: what nb_callback_begin returned */
    int closed, grad_on; /* refused nb_scope_end and nb_set_grad_enabled(true) calls */
    /* a custom backward under create_graph: raw_read is set when it reads
     * the values of a tensor that requires grad (nb_data, nb_item, ...),
     * whose result then cannot be differentiated again */
    bool watch_raw, raw_read;
    struct nbi_callback *prev;
} nbi_callback;
void nbi_callback_enter(nbi_callback *cb, const char *fn, bool grad_stays_off);
int nbi_callback_leave(nbi_callback *cb);
nbi_callback *nbi_callback_current(void); /* innermost running, or NULL */
/* Called by the raw accessors: t's values leave the graph (see watch_raw). */
void nbi_callback_note_raw(const nb_tensor *t);
/* "rmsnorm's forward": who, formatted (a small thread-local ring of buffers). */
const char *nbi_callback_who(const nbi_callback *cb);
/* For nb_scope_end and nb_set_grad_enabled: true (message set, refusal
 * counted) when the running callback may not do this. */
bool nbi_callback_refuses_scope_end(void);
bool nbi_callback_refuses_grad_on(void);
/* Grad mode, per thread (autograd/ owns its meaning; kept here so that
 * callbacks can restore it). */
extern _Thread_local bool nbi_grad_off;
/* Formats a shape as "(2,3)" into a small thread-local ring of buffers. */
const char *nbi_shape_str(int ndim, const int64_t *shape);
#define NBI_SHAPE(t) nbi_shape_str((t)->ndim, (t)->shape)

/* Argument checks: each sets the message and returns false on failure. */
/* f32 or f64; bf16 gets nbi_check_no_bf16's message. */
bool nbi_check_float(const char *fn, const nb_tensor *t);
/* Refuses NB_BF16 in an op that has no bf16 kernel: the message names fn and
 * says how to get there (nb_to to f32, or autocast). */
bool nbi_check_no_bf16(const char *fn, const nb_tensor *t);
bool nbi_check_same_dtype(const char *fn, const nb_tensor *a, const nb_tensor *b);
/* Normalizes a possibly negative dim into [0, ndim); -1 and a message if bad. */
int nbi_dim(const char *fn, int dim, int ndim);
/* Broadcast shape of two shapes; false + message if incompatible (no
 * message when fn is NULL). */
bool nbi_broadcast_shape(const char *fn, int na, const int64_t *sa, int nb, const int64_t *sb,
                         int *nout, int64_t *out);
/* Strides that read a tensor broadcast to (ndim, shape): 0 on new/expanded dims. */
void nbi_broadcast_strides(const nb_tensor *t, int ndim, const int64_t *shape, int64_t *strides);

size_t nbi_dtype_size(nb_dtype dtype);
static inline bool nbi_is_float(nb_dtype d) { return d == NB_F32 || d == NB_F64; }
/* The dtypes gradients flow through: f32, f64 and bf16. */
static inline bool nbi_is_diff(nb_dtype d) { return nbi_is_float(d) || d == NB_BF16; }

/* ---------------------------------------------------------- allocation */
/* Storage buffers (alloc.c): 64-byte aligned, at least nbytes; *cap gets the
 * size reserved, which nbi_buf_free needs back. NULL when out of memory. */
void *nbi_buf_alloc(size_t nbytes, size_t *cap);
void nbi_buf_free(void *p, size_t cap);
/* Fixed-size objects from per-thread free lists (alloc.c): zeroed like
 * calloc; each kind always has the same size. */
enum { NBI_OBJ_STORAGE, NBI_OBJ_NODE, NBI_OBJ_KINDS };
void *nbi_obj_alloc(int kind, size_t size);
/* Tensor objects (the handles users hold), zeroed; a freed one goes through
 * the quarantine described at nb_tensor.freed. */
nb_tensor *nbi_tensor_obj_alloc(void);
void nbi_tensor_obj_free(nb_tensor *t);
int64_t nbi_tensor_objs_live(void);
/* Makes the calling thread return its per-thread caches (object lists, spare
 * scopes, the destruction queue) when it exits. */
void nbi_thread_register(void);
void nbi_scope_thread_exit(void);
void nbi_callback_thread_exit(void);
void nbi_tensor_thread_exit(void);
void nbi_obj_free(int kind, void *p);
/* A new contiguous tensor in the current scope, uninitialized (zeroed when
 * zero is true). fn names the public caller for messages. */
nb_tensor *nbi_new(const char *fn, nb_dtype dtype, int ndim, const int64_t *shape, bool zero);
nb_tensor *nbi_new_like(const char *fn, const nb_tensor *t, bool zero);
/* A new tensor object over base's storage with the given geometry. */
nb_tensor *nbi_make_view(const nb_tensor *base, int ndim, const int64_t *shape,
                         const int64_t *strides, int64_t offset);
/* Reference counting used by graph nodes and the engine. */
void nbi_ref(nb_tensor *t);
void nbi_unref(nb_tensor *t);
/* A tensor owns its grad_fn node, but nodes are autograd/'s, a layer above
 * this one, so tensor/ cannot call autograd's code to free one: autograd/
 * hands its node destructor down through this setter instead (dependency
 * inversion), each time it records a node. A node exists only once that has
 * happened, so a tensor with a grad_fn always finds the destructor set. The
 * first call sets it and later calls leave it (idempotent; threads may race).
 * The destructor lets go of the tensors the node references by calling
 * `release` on each, which queues them, so that freeing the head of a long
 * graph does not recurse through it. */
typedef void (*nbi_node_free_fn)(nbi_node *n, void (*release)(nb_tensor *t));
void nbi_set_node_free(nbi_node_free_fn fn);
/* The owner (its scope, or nb_free) lets go of t: the handle dies (`how`
 * says why, for messages); the object lives on while a graph holds it. */
void nbi_release_owned(nb_tensor *t, int how);
/* Frees t (returns NULL): for an op that fails after allocating its output. */
void *nbi_discard(nb_tensor *t);
int64_t nbi_shape_numel(int ndim, const int64_t *shape); /* -1 on overflow */
void nbi_contiguous_strides(int ndim, const int64_t *shape, int64_t *strides);
bool nbi_same_shape(const nb_tensor *a, const nb_tensor *b);

/* Gives up t's storage when no one can read it any more: its owner has freed
 * it, only graph nodes still reference it, and none of them saved it (t lives
 * on only as an edge of the graph). Called by the owner as it lets go, while
 * its reference is still counted.
 * Intermediates of a big graph (attention scores) then cost no memory once
 * the code that made them frees them. */
void nbi_drop_unneeded_data(nb_tensor *t);
/* The same for a tensor no owner holds any more, once a backward released
 * a node that had saved it. */
void nbi_drop_unsaved_data(nb_tensor *t);
/* A tensor made on the engine's behalf, owned by no scope (refs = 1). */
nb_tensor *nbi_unscoped(nb_tensor *t);

static inline void *nbi_ptr(const nb_tensor *t) {
    return (char *)t->storage->data + (size_t)t->offset * nbi_dtype_size(t->dtype);
}
/* Element at a row-major flat index, as double (slow; tests/gradcheck only). */
double nbi_get_flat(const nb_tensor *t, int64_t i);
void nbi_set_flat(nb_tensor *t, int64_t i, double v);
int64_t nbi_flat_offset(const nb_tensor *t, int64_t i); /* element offset from storage start */

/* Destinations of in-place writes into a caller's tensor. An expanded view
 * (stride 0 over a size > 1) has elements that are one memory location:
 * nbi_has_internal_overlap says so, nbi_check_writable refuses it with a
 * message naming fn and what ("running_mean"). nbi_overlap: whether a and
 * b share a memory location (exact for up to 2^22 elements each, else
 * whether their byte ranges meet). */
bool nbi_has_internal_overlap(const nb_tensor *t);
bool nbi_check_writable(const char *fn, const char *what, const nb_tensor *dst);
bool nbi_overlap(const nb_tensor *a, const nb_tensor *b);

/* Copies src into dst of the same shape (any strides, any dtypes). */
void nbi_copy_strided(nb_tensor *dst, const int64_t *src_strides, const nb_tensor *src);

/* Gradient accumulation (accumulate.c), for the backward engine: operands of
 * one shape and one floating dtype, read with any strides.
 * dst += src, dst contiguous: */
void nbi_add_into(nb_tensor *dst, const nb_tensor *src);
/* a + b as a new contiguous tensor in the current scope; NULL (and message,
 * naming fn) when out of memory. */
nb_tensor *nbi_add_new(const char *fn, const nb_tensor *a, const nb_tensor *b);

/* ------------------------------------------------------ strided iteration */
/* Walks up to NBI_ITER_OPS operands over one shape, row by row: the last
 * (coalesced) dim is the inner loop, the others are stepped by a cursor. */
#define NBI_ITER_OPS 4
typedef struct nbi_iter {
    int ndim, nops;
    int64_t shape[NB_MAX_DIMS];
    int64_t st[NBI_ITER_OPS][NB_MAX_DIMS];
    int64_t n;   /* inner length */
    int64_t rows;
} nbi_iter;
typedef struct nbi_cursor {
    int64_t row;
    int64_t idx[NB_MAX_DIMS];
    int64_t off[NBI_ITER_OPS];
} nbi_cursor;
/* strides[k] are operand k's strides over (ndim, shape); dims are coalesced. */
void nbi_iter_init(nbi_iter *it, int ndim, const int64_t *shape, int nops,
                   const int64_t *const *strides);
nbi_cursor nbi_cursor_begin(const nbi_iter *it);
void nbi_cursor_next(const nbi_iter *it, nbi_cursor *c);
/* Cursor at the start of row `row`. */
nbi_cursor nbi_cursor_at(const nbi_iter *it, int64_t row);
/* The rows holding elements [lo, hi) of the walk (row-major order, lo < hi):
 * the body sees the row's cursor c and the part [jb, je) of it in range.
 * Kernels split across threads take their range this way. */
#define NBI_FOR_SPAN(it, lo, hi, c, jb, je)                                                \
    for (nbi_cursor c = nbi_cursor_at((it), (lo) / (it)->n); (c).row * (it)->n < (hi);    \
         nbi_cursor_next((it), &(c)))                                                      \
        for (int64_t jb = (c).row * (it)->n < (lo) ? (lo) - (c).row * (it)->n : 0,        \
                     je = (hi) - (c).row * (it)->n < (it)->n ? (hi) - (c).row * (it)->n    \
                                                             : (it)->n,                    \
                     once_ = 1;                                                            \
             once_; once_ = 0)
#define NBI_FOR_ROWS(it, c) \
    for (nbi_cursor c = nbi_cursor_begin(it); (c).row < (it)->rows; nbi_cursor_next((it), &(c)))
/* inner stride of operand k */
#define NBI_INNER(it, k) ((it)->st[(k)][(it)->ndim - 1])

/* ---------------------------------------------------------------- threads */
/* Runs fn(ctx, lo, hi) over contiguous ranges covering [0, n), each of at
 * least `grain` items (except the last), on up to nb_num_threads() threads,
 * and returns when all are done. fn must
 * compute each item wholly within its range, so results never depend on the
 * thread count. Ranges of 64 or more items start on multiples of 16. Nested
 * or concurrent calls run serially. */
typedef void (*nbi_range_fn)(void *ctx, int64_t lo, int64_t hi);
void nbi_parallel_for(int64_t n, int64_t grain, nbi_range_fn fn, void *ctx);
/* How many ranges nbi_parallel_for would use (1 = serial). */
int nbi_parallel_chunks(int64_t n, int64_t grain);

/* ------------------------------------------------------------------ scopes */
void nbi_scope_adopt(nb_tensor *t); /* puts a new tensor in the current scope */
nbi_scope *nbi_scope_current(void); /* NULL when none is open */
/* Moves t from the current scope, which owns it, to the enclosing one
 * (persistent at depth 1), as the result of work done in an inner scope. */
void nbi_scope_hand_up(nb_tensor *t);
/* Whether scope s (NULL: persistent) is on the calling thread's stack. */
bool nbi_scope_of_this_thread(const nbi_scope *s);
void nbi_scope_release(nb_tensor *t); /* removes t from its scope's list */

/* --------------------------------------------------------------------- rng */
/* Uniform [0,1) double for draw `counter` of the stream of `seed`. Kernels
 * compute the key once per call and the draws inline. */
static inline uint64_t nbi_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}
static inline uint64_t nbi_rng_key(uint64_t seed) { return nbi_mix64(seed ^ 0x6A09E667F3BCC909ULL); }
static inline double nbi_rng_uniform_key(uint64_t key, uint64_t counter) {
    return (double)(nbi_mix64(key + (counter + 1) * 0x9E3779B97F4A7C15ULL) >> 11) * 0x1.0p-53;
}
double nbi_rng_uniform(uint64_t seed, uint64_t counter);
/* Reserves n draws of rng (NULL: the global stream): returns the first
 * counter, sets *seed to the stream's seed, and advances the stream. While
 * a checkpointed function runs (nb_checkpoint), every call is recorded on
 * the thread's tape, and replayed when the function runs again in backward:
 * then the call hands back the recorded counter and seed and the stream is
 * left as it is. */
uint64_t nbi_rng_take(nb_rng *rng, uint64_t n, uint64_t *seed);
/* The tape (autograd/checkpoint.c owns its meaning): draws in call order.
 * A replaying tape answers every draw made under it (and under the tapes it
 * encloses); a recording tape notes each, also those a replaying tape
 * outside it answers (a checkpoint inside another's recomputation). */
typedef struct nbi_rng_draw {
    const nb_rng *rng; /* the stream (the global one for NULL) */
    uint64_t seed, first, n;
} nbi_rng_draw;
typedef struct nbi_rng_tape {
    nbi_rng_draw *draws;
    size_t len, cap, next; /* next: replay position */
    bool replay;
    bool broken; /* out of memory recording, or a replayed draw that differs (why says how) */
    char why[192];
    struct nbi_rng_tape *outer;
} nbi_rng_tape;
extern _Thread_local nbi_rng_tape *nbi_rng_tapes;
/* Draws inside nb_parallel_for's ranges cannot be replayed: which thread
 * runs which range, in which order, varies from run to run. While a range
 * of a caller with a tape runs, the thread's tapes are set aside and a draw
 * sets *nbi_rng_watch instead; nbi_rng_refuse_parallel then breaks the
 * caller's innermost tape (the checkpoint fails saying so). */
extern _Thread_local int *nbi_rng_watch;
void nbi_rng_refuse_parallel(void);
/* nb_randn's values (tensor/randn.c): dst[i] (f32 or f64, n of them) <- the
 * normal draw of counters base + 2i, base + 2i + 1 of seed's stream, on the
 * thread pool. nbi_randn_path picks the f32 fast path's instruction set as
 * nbi_gemm_path does (NBI_RANDN_AUTO: the best the CPU has; tests force
 * one; the values are the same on every path). nbi_randn_from_u: for tests,
 * f32 values of given draws u (u1 = 1 - u), u2 through a path (out), and
 * that path's unrounded doubles before the check against libm (raw), their
 * bits moved by nudge (standing for an error of nudge double ulps). */
enum { NBI_RANDN_AUTO = -1, NBI_RANDN_PORTABLE = 0, NBI_RANDN_AVX2 = 1, NBI_RANDN_AVX512 = 2 };
void nbi_randn_fill(nb_dtype dtype, void *dst, int64_t n, uint64_t seed, uint64_t base);
int nbi_randn_path(int force);
void nbi_randn_from_u(int path, const double *u, const double *u2, float *out, double *raw,
                      int64_t n, int64_t nudge);

/* A kernel of plain C compiled for AVX-512 and AVX2 too, the copy chosen at
 * load time (target_clones), where wider vectors pay (loops over many
 * independent elements). Every copy does the same operations in the same
 * order (the build does not contract a*b+c, -std=c11, nor reassociate), so
 * every copy gives the same bits. */
/* Not under ThreadSanitizer: the load-time resolver would run instrumented
 * before the TSan runtime is up, and crash the program at start. */
#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define NBI_CLONES
#endif
#endif
#if defined(__x86_64__) && defined(__GNUC__) && defined(__has_attribute) && \
    !defined(__SANITIZE_THREAD__) && !defined(NBI_CLONES)
#if __has_attribute(target_clones)
#define NBI_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
#endif
#ifndef NBI_CLONES
#define NBI_CLONES
#endif

#endif
