/* alloc.c: tensor storage buffers, and a cache that keeps them.
 *
 * On this kind of machine touching fresh pages costs more than most
 * arithmetic on them (a new 32 MiB buffer is ~15 ms of page faults, reusing
 * one ~1 ms), and glibc hands large freed blocks straight back to the OS. So
 * freed buffers of 4 KiB and more are kept in size classes (four per power of
 * two, so at most 25% is wasted) and handed out again; nb_empty_cache()
 * returns them to the system. Counters give the bytes in use and their peak,
 * as torch.cuda.memory_allocated and max_memory_allocated do.
 *
 * How much the cache keeps follows the program's own demand: at most
 * NABLA_CACHE_MB MiB when that is set; otherwise at most the larger of
 * 1 GiB and the most bytes ever in use at once (`high`, which
 * nb_memory_reset_peak leaves alone). A training step frees what it made at
 * its end and asks for the same buffers in the next step; with a fixed
 * 1 GiB, a step whose buffers came to more gave the rest back to the OS at
 * each step's end and faulted it in again, page by page, in the next (a
 * GPT-2 124M step here: at batch 8 x 64, ~2,000 page faults and ~10 of
 * 2 MiB per step; at 16 x 64, ~6,000 and 300, ~0.6 GB of fresh pages and
 * ~0.6 s of a 4.2 s step). Sized from the peak, the cache keeps a step's
 * buffers whatever its size, and it never holds more than the program
 * itself once had in use (freed buffers of one size class cannot serve
 * another, so a step's buffers can add up to more than its peak in use).
 * And what is in use plus what is cached never exceeds that peak for long:
 * a request no cached buffer of its class serves first gives back cached
 * buffers of other classes, largest first, until in use, cached and the new
 * buffer fit within the peak. A step whose mix of sizes changes (activation
 * checkpointing frees a block's buffers and allocates the loss's) would
 * otherwise hold both mixes: 1 GB more than its peak in use for GPT-2 124M at
 * B=4 T=1024 (4.7 GB of RSS for 3.7 in use).
 * If the system refuses a buffer, cached ones go back, largest first, until
 * it is granted, and all of them if need be. */
#define _DEFAULT_SOURCE /* madvise, MADV_HUGEPAGE */
#include "tensor_internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define SMALL ((size_t)4096) /* up to half this, per-thread lists of powers of two */
#define NCLASS 256

typedef struct cached { struct cached *next; } cached;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static cached *classes[NCLASS];
/* Under AddressSanitizer nothing is recycled (no free lists, no buffer
 * cache), so a use after free or an overrun of any tensor, node or buffer
 * reaches the sanitizer instead of landing in a recycled block. */
#if defined(__SANITIZE_ADDRESS__)
#define RECYCLE 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RECYCLE 0
#endif
#endif
#ifndef RECYCLE
#define RECYCLE 1
#endif

static size_t cached_bytes, cache_limit = (size_t)-1;
static bool limit_set; /* NABLA_CACHE_MB gave the limit: no more than it is kept */
static _Atomic int64_t in_use, peak, high; /* high: the peak nb_memory_reset_peak keeps */

/* Class of a request and its capacity: 4 steps per power of two. */
static int size_class(size_t n, size_t *cap) {
    int k = 63 - __builtin_clzll((unsigned long long)n); /* 2^k <= n < 2^(k+1) */
    size_t step = (size_t)1 << (k - 2);
    size_t q = (n - ((size_t)1 << k) + step - 1) / step; /* 0..4 steps above 2^k */
    *cap = ((size_t)1 << k) + q * step;
    return 4 * k + (int)q;
}

/* NABLA_CACHE_MB: a decimal count of MiB; unset or empty means the default,
 * 1024; not a number (junk after the digits, a sign) means the default too,
 * and is said on stderr; a count too large for size_t in bytes means no
 * limit. */
static size_t limit(void) {
    if (cache_limit == (size_t)-1) {
        const char *e = getenv("NABLA_CACHE_MB");
        size_t mb = 1024;
        if (e && *e >= '0' && *e <= '9') {
            size_t v = 0;
            const char *c = e;
            for (; *c >= '0' && *c <= '9'; c++)
                v = v > (SIZE_MAX >> 20) ? v : v * 10 + (size_t)(*c - '0');
            if (!*c) mb = v, limit_set = true;
        }
        if (e && *e && !limit_set)
            nbi_env_warn("NABLA_CACHE_MB=\"%s\" is not a count of MiB (a whole number); it is "
                         "ignored: the default, 1024 MiB, is kept", e);
        cache_limit = mb > (SIZE_MAX >> 20) - 1 ? SIZE_MAX - 1 : mb << 20;
    }
    return cache_limit;
}

static void raise_to(_Atomic int64_t *m, int64_t now) {
    int64_t p = atomic_load(m);
    while (now > p && !atomic_compare_exchange_weak(m, &p, now)) {
    }
}

static void count(int64_t delta) {
    int64_t now = atomic_fetch_add(&in_use, delta) + delta;
    raise_to(&peak, now);
    raise_to(&high, now);
}

/* Whether the cache may hold `extra` more bytes (under mu). */
static bool may_keep(size_t extra) {
    size_t lim = limit();
    if (cached_bytes + extra <= lim) return true;
    return !limit_set && (int64_t)(cached_bytes + extra) <= atomic_load(&high);
}

/* Takes cached buffers, largest classes first, until `want` bytes are taken
 * or none is left; returns them as a list (under mu). */
static struct cached *take_largest(size_t want);
static void free_list(struct cached *b);

static void *list_pop(int kind);
static bool list_push(int kind, void *p);

/* A new buffer of cap bytes from the system. Buffers of HUGE_MIN and more
 * are 2 MiB-aligned and asked to be backed by transparent huge pages: here a
 * fresh 4 KiB page costs ~7 us to fault in, a 2 MiB one ~0.7 ms (a third of
 * the time per byte), and a GPT-2 training step touches ~1 GB of new pages
 * in its first step. Where THP is off (or not Linux), madvise is a no-op. */
#define HUGE_MIN ((size_t)2 << 20)
static void *sys_alloc(size_t cap) {
    if (cap < HUGE_MIN) return aligned_alloc(64, cap);
    void *p = NULL; /* posix_memalign: C11's aligned_alloc wants cap a multiple of 2 MiB */
    if (posix_memalign(&p, HUGE_MIN, cap) != 0) p = NULL;
#if defined(MADV_HUGEPAGE)
    /* whole huge pages only: the tail (and the size class's slack past the
     * tensor's bytes) stays in 4 KiB pages, faulted in only where touched */
    if (p) madvise(p, cap & ~(HUGE_MIN - 1), MADV_HUGEPAGE);
#endif
    return p;
}

/* Small buffers: powers of two from 64 bytes, kept in per-thread lists. */
static int small_kind(size_t cap) { return NBI_OBJ_KINDS + __builtin_ctzll(cap) - 6; }

void *nbi_buf_alloc(size_t nbytes, size_t *cap) {
    if (nbytes <= SMALL / 2) {
        *cap = 64;
        while (*cap < nbytes) *cap *= 2;
        void *p = list_pop(small_kind(*cap));
        if (!p) p = aligned_alloc(64, *cap);
        if (!p) { /* the cache may hold what the system lacks */
            nb_empty_cache();
            p = aligned_alloc(64, *cap);
        }
        if (p) count((int64_t)*cap);
        return p;
    }
    if (nbytes > ((size_t)1 << 61)) return NULL;
    int c = size_class(nbytes, cap);
    pthread_mutex_lock(&mu);
    cached *b = classes[c], *spill = NULL;
    if (b) {
        classes[c] = b->next;
        cached_bytes -= *cap;
    } else { /* a fresh buffer: the footprint stays within the most ever in use */
        int64_t use = atomic_load(&in_use) + (int64_t)*cap, top = atomic_load(&high);
        int64_t room = (use > top ? use : top) - use;
        if ((int64_t)cached_bytes > room) spill = take_largest(cached_bytes - (size_t)room);
    }
    pthread_mutex_unlock(&mu);
    free_list(spill);
    if (!b) b = sys_alloc(*cap);
    if (!b) { /* out of memory: give cached buffers back, largest first, and retry */
        pthread_mutex_lock(&mu);
        spill = take_largest(*cap);
        pthread_mutex_unlock(&mu);
        free_list(spill);
        b = sys_alloc(*cap);
    }
    if (!b) { /* still: all of the cache */
        nb_empty_cache();
        b = sys_alloc(*cap);
    }
    if (b) count((int64_t)*cap);
    return b;
}

void nbi_buf_free(void *p, size_t cap) {
    if (!p) return;
    count(-(int64_t)cap);
    if (cap <= SMALL / 2) {
        if (!list_push(small_kind(cap), p)) free(p);
        return;
    }
    size_t c;
    int k = size_class(cap, &c);
    pthread_mutex_lock(&mu);
    bool keep = RECYCLE && may_keep(cap);
    if (keep) {
        cached *b = p;
        b->next = classes[k];
        classes[k] = b;
        cached_bytes += cap;
    }
    pthread_mutex_unlock(&mu);
    if (!keep) free(p);
}

static struct cached *take_largest(size_t want) {
    cached *out = NULL;
    size_t taken = 0;
    for (int k = NCLASS - 1; k >= 0 && taken < want; k--) {
        while (classes[k] && taken < want) {
            /* class k = 4 e + q holds buffers of 2^e + q 2^(e-2) bytes (size_class) */
            size_t cap = ((size_t)1 << (k / 4)) + (size_t)(k % 4) * ((size_t)1 << (k / 4 - 2));
            cached *b = classes[k];
            classes[k] = b->next;
            b->next = out;
            out = b;
            cached_bytes -= cap;
            taken += cap;
        }
    }
    return out;
}

static void free_list(struct cached *b) {
    while (b) {
        cached *n = b->next;
        free(b);
        b = n;
    }
}

void nb_empty_cache(void) {
    pthread_mutex_lock(&mu);
    for (int k = 0; k < NCLASS; k++) {
        while (classes[k]) {
            cached *b = classes[k];
            classes[k] = b->next;
            free(b);
        }
    }
    cached_bytes = 0;
    pthread_mutex_unlock(&mu);
}

/* The cache is returned at exit, so leak checkers see nothing held. */
__attribute__((destructor)) static void release_cache_at_exit(void) { nb_empty_cache(); }

int64_t nb_memory_allocated(void) { return atomic_load(&in_use); }
int64_t nb_memory_peak(void) { return atomic_load(&peak); }
void nb_memory_reset_peak(void) { atomic_store(&peak, atomic_load(&in_use)); }
int64_t nb_memory_cache_limit(void) {
    pthread_mutex_lock(&mu);
    size_t l = limit();
    pthread_mutex_unlock(&mu);
    return l == SIZE_MAX - 1 ? -1 : (int64_t)l;
}

int64_t nb_memory_cached(void) {
    pthread_mutex_lock(&mu);
    int64_t n = (int64_t)cached_bytes;
    pthread_mutex_unlock(&mu);
    return n;
}

/* ------------------------------------------------------------ object lists */
/* Tensor objects, storage records, graph nodes and small buffers are made and
 * freed once or more per op; each thread keeps up to LIST_MAX freed ones of
 * each kind and hands them out again, which is what keeps the autograd
 * overhead per op to a couple of hundred ns. A thread's lists are returned
 * when it exits (the main thread's at process exit). */
#define LIST_MAX 4096
typedef struct free_obj { struct free_obj *next; } free_obj;
#define ALL_KINDS (NBI_OBJ_KINDS + 6) /* objects, then buffers of 64..2048 bytes */
typedef struct {
    free_obj *head[ALL_KINDS];
    int n[ALL_KINDS];
} obj_lists;
static _Thread_local obj_lists lists;
static _Thread_local bool lists_registered;
static pthread_key_t lists_key;
static pthread_once_t lists_once = PTHREAD_ONCE_INIT;

static void flush_lists(obj_lists *l) {
    for (int k = 0; k < ALL_KINDS; k++) {
        while (l->head[k]) {
            free_obj *o = l->head[k];
            l->head[k] = o->next;
            free(o);
        }
        l->n[k] = 0;
    }
}

static void quarantine_to_graveyard(void);

/* Runs on a thread that used nabla as it exits: its caches go back too. */
static void flush_at_thread_exit(void *arg) {
    nbi_callback_thread_exit(); /* callback frames left open: their fences go first */
    nbi_scope_thread_exit(); /* first: ending open scopes frees tensors */
    quarantine_to_graveyard();
    flush_lists(arg);
    nbi_tensor_thread_exit();
}
static void make_key(void) { pthread_key_create(&lists_key, flush_at_thread_exit); }
__attribute__((destructor)) static void flush_main_lists(void) { flush_lists(&lists); }

void nbi_thread_register(void) {
    if (lists_registered) return;
    pthread_once(&lists_once, make_key);
    pthread_setspecific(lists_key, &lists);
    lists_registered = true;
}

static void *list_pop(int kind) {
    free_obj *o = lists.head[kind];
    if (o) {
        lists.head[kind] = o->next;
        lists.n[kind]--;
    }
    return o;
}

static bool list_push(int kind, void *p) {
    if (!RECYCLE || lists.n[kind] >= LIST_MAX) return false;
    nbi_thread_register();
    free_obj *o = p;
    o->next = lists.head[kind];
    lists.head[kind] = o;
    lists.n[kind]++;
    return true;
}

void *nbi_obj_alloc(int kind, size_t size) {
    void *o = list_pop(kind);
    if (o) {
        memset(o, 0, size);
        return o;
    }
    return calloc(1, size);
}

void nbi_obj_free(int kind, void *p) {
    if (p && !list_push(kind, p)) free(p);
}

/* ------------------------------------------------------ tensor quarantine */
/* A tensor object is what a user's handle points to, so its memory must not
 * turn into another tensor while a stale handle may still be used: a
 * destroyed object keeps its `freed` mark (which every public function
 * checks) in a per-thread FIFO and is reused, or given back, only after
 * NB_HANDLE_WINDOW more tensor allocations have happened on any thread.
 * Objects of a thread that exits go to a shared graveyard that ages the same
 * way. The allocation count doubles as the live count (allocations minus
 * destructions), so the quarantine costs no extra atomic operation. */
typedef struct {
    nb_tensor *head, *tail; /* oldest first, linked through ->next */
    int64_t n;
} tensor_fifo;
static _Thread_local tensor_fifo quarantine;
static tensor_fifo graveyard;       /* under grave_mu */
static _Atomic int64_t graveyard_n; /* graveyard.n, read without the lock */
static pthread_mutex_t grave_mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic uint64_t tensor_allocs, tensor_frees;

/* The cache's lock and the graveyard's are held across fork(): a thread
 * allocating while another forks must not leave the child a lock it can
 * never take (they never nest, so any order is fine). */
static void lock_all(void) {
    pthread_mutex_lock(&mu);
    pthread_mutex_lock(&grave_mu);
}
static void unlock_all(void) {
    pthread_mutex_unlock(&grave_mu);
    pthread_mutex_unlock(&mu);
}
__attribute__((constructor)) static void locks_atfork(void) {
    pthread_atfork(lock_all, unlock_all, unlock_all);
}
/* Past-window objects a thread keeps for reuse beyond its steady state. */
#define QUARANTINE_SPARE 4096

static void fifo_push(tensor_fifo *q, nb_tensor *t) {
    t->next = NULL;
    if (q->tail) q->tail->next = t;
    else q->head = t;
    q->tail = t;
    q->n++;
}

static nb_tensor *fifo_pop(tensor_fifo *q) {
    nb_tensor *t = q->head;
    q->head = t->next;
    if (!q->head) q->tail = NULL;
    q->n--;
    return t;
}

static bool aged(const nb_tensor *t, uint64_t now) { return now - t->freed_at > NB_HANDLE_WINDOW; }

static nb_tensor *reuse(nb_tensor *t) {
    memset(t, 0, sizeof *t);
    t->magic = NBI_TENSOR_MAGIC;
    return t;
}

/* A quarantine far larger than the window holds (a thread that frees more
 * tensors than it makes, the graveyard after many threads exited) gives
 * objects past the window back to the system, a few per call. */
static void trim(tensor_fifo *q, uint64_t now) {
    for (int k = 0; k < 4 && q->head && aged(q->head, now) &&
                    q->n > 2 * NB_HANDLE_WINDOW + QUARANTINE_SPARE; k++)
        free(fifo_pop(q));
}

nb_tensor *nbi_tensor_obj_alloc(void) {
    uint64_t now = atomic_fetch_add(&tensor_allocs, 1) + 1;
    tensor_fifo *q = &quarantine;
    /* Objects past the window: reused (the first), or freed when this
     * thread holds far more than it has been using. */
    while (q->head && aged(q->head, now)) {
        nb_tensor *t = fifo_pop(q);
        if (RECYCLE) {
            trim(q, now);
            return reuse(t);
        }
        free(t); /* under a sanitizer, old objects go back, so it sees a late use */
    }
    if (atomic_load_explicit(&graveyard_n, memory_order_relaxed) > 0) {
        nb_tensor *t = NULL;
        pthread_mutex_lock(&grave_mu);
        while (graveyard.head && aged(graveyard.head, now)) {
            t = fifo_pop(&graveyard);
            if (RECYCLE) break;
            free(t);
            t = NULL;
        }
        trim(&graveyard, now);
        atomic_store(&graveyard_n, graveyard.n);
        pthread_mutex_unlock(&grave_mu);
        if (t) return reuse(t);
    }
    nb_tensor *t = calloc(1, sizeof *t);
    if (!t) atomic_fetch_add(&tensor_frees, 1); /* counted as made and gone */
    else t->magic = NBI_TENSOR_MAGIC;
    return t;
}

void nbi_tensor_obj_free(nb_tensor *t) {
    if (!t) return;
    if (!t->freed) atomic_store_explicit(&t->freed, NBI_FREED_WITH_OWNER, memory_order_relaxed);
    uint64_t now = atomic_load_explicit(&tensor_allocs, memory_order_relaxed);
    t->freed_at = now;
    atomic_fetch_add(&tensor_frees, 1);
    nbi_thread_register();
    fifo_push(&quarantine, t);
    trim(&quarantine, now);
}

int64_t nbi_tensor_objs_live(void) {
    uint64_t frees = atomic_load(&tensor_frees);
    return (int64_t)(atomic_load(&tensor_allocs) - frees);
}

/* A thread's quarantine outlives the thread, in the graveyard: a handle it
 * freed may still be used by another thread. */
static void quarantine_to_graveyard(void) {
    tensor_fifo *q = &quarantine;
    if (!q->head) return;
    pthread_mutex_lock(&grave_mu);
    if (graveyard.tail) graveyard.tail->next = q->head;
    else graveyard.head = q->head;
    graveyard.tail = q->tail;
    graveyard.n += q->n;
    atomic_store(&graveyard_n, graveyard.n);
    pthread_mutex_unlock(&grave_mu);
    *q = (tensor_fifo){0};
}

static void free_fifo(tensor_fifo *q) {
    while (q->head) free(fifo_pop(q));
}

/* At exit, so leak checkers see nothing held. */
__attribute__((destructor)) static void free_quarantine_at_exit(void) {
    free_fifo(&quarantine);
    pthread_mutex_lock(&grave_mu);
    free_fifo(&graveyard);
    atomic_store(&graveyard_n, 0);
    pthread_mutex_unlock(&grave_mu);
}
