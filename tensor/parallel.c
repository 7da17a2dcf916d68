/* parallel.c: the persistent thread pool behind every parallel kernel.
 *
 * nbi_parallel_for(n, grain, fn, ctx) cuts [0, n) into contiguous ranges and
 * runs fn on them, the caller taking part. Kernels compute each output
 * element entirely inside one range, in a fixed order, so where the cuts fall
 * (which depends on the thread count) never changes a result. Ranges of 64
 * items or more start on multiples of 16, so vector bodies and scalar tails
 * of element kernels (whose grains are far larger) fall on the same elements
 * for any thread count too.
 *
 * Workers spin for SPIN_NS after a job (back-to-back ops are common; timed
 * by the clock, since a pause instruction lasts ~10 cycles on some CPUs and
 * ~140 on others) and then sleep on a condition variable. The default
 * thread count is the CPUs the process may run on (its affinity mask, which
 * a container's or taskset's cpuset narrows), not all the CPUs online. One
 * job runs at a time: a call made while
 * the pool is busy (from a worker, or from a second user thread) runs
 * serially on its caller. A forked child starts with no workers (Check forks
 * per test). The workers are joined at exit so leak checkers see no thread. */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include "tensor_internal.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define MAX_THREADS 64
#define SPIN_NS 50000 /* a worker spins this long for the next job before sleeping */

/* A job is claimed range by range through one atomic word, the ticket:
 * generation << 16 | ranges << 8 | next range. Claiming with a compare-and-
 * swap means a worker that wakes late can never take a range of a newer job
 * by mistake, and the job's fields are read only after a successful claim,
 * which keeps the job alive (its pending count is not zero yet). */
static struct {
    pthread_mutex_t mu;
    pthread_cond_t wake;
    pthread_t th[MAX_THREADS];
    int nworkers;
    bool stop;
    nbi_range_fn fn;
    void *ctx;
    int64_t n, chunk;
    _Atomic uint64_t ticket;
    _Atomic int pending;
} pool = {.mu = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER};

static atomic_flag busy = ATOMIC_FLAG_INIT;
static _Atomic int num_threads; /* 0 = not chosen yet */
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void run_chunks(void) {
    uint64_t t = atomic_load_explicit(&pool.ticket, memory_order_acquire);
    for (;;) {
        int idx = (int)(t & 0xff), nch = (int)((t >> 8) & 0xff);
        if (idx >= nch) return;
        if (!atomic_compare_exchange_weak(&pool.ticket, &t, t + 1)) continue;
        /* written so that nothing overflows for n up to INT64_MAX */
        int64_t lo = idx * pool.chunk, hi = pool.n - lo > pool.chunk ? lo + pool.chunk : pool.n;
        pool.fn(pool.ctx, lo, hi);
        atomic_fetch_sub_explicit(&pool.pending, 1, memory_order_release);
        t = atomic_load_explicit(&pool.ticket, memory_order_acquire);
    }
}

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void *worker(void *arg) {
    (void)arg;
    uint64_t seen = atomic_load(&pool.ticket) >> 16;
    for (;;) {
        uint64_t g;
        const int64_t until = now_ns() + SPIN_NS;
        for (int spins = 1; (g = atomic_load_explicit(&pool.ticket, memory_order_acquire) >> 16) ==
                                seen; spins++) {
            if (spins % 64 == 0 && now_ns() > until) break;
            cpu_relax();
        }
        if (g == seen) {
            pthread_mutex_lock(&pool.mu);
            while ((g = atomic_load(&pool.ticket) >> 16) == seen && !pool.stop)
                pthread_cond_wait(&pool.wake, &pool.mu);
            bool stop = pool.stop;
            pthread_mutex_unlock(&pool.mu);
            if (stop) return NULL;
        }
        seen = g;
        run_chunks();
    }
}

static void child_after_fork(void) {
    pthread_mutex_init(&pool.mu, NULL);
    pthread_cond_init(&pool.wake, NULL);
    pool.nworkers = 0;
    atomic_flag_clear(&busy);
}

static void install_atfork(void) { pthread_atfork(NULL, NULL, child_after_fork); }

/* Starts workers until there are `want`; returns how many there are. */
static int grow(int want) {
    pthread_once(&atfork_once, install_atfork);
    while (pool.nworkers < want && pool.nworkers < MAX_THREADS - 1) {
        if (pthread_create(&pool.th[pool.nworkers], NULL, worker, NULL)) break;
        pool.nworkers++;
    }
    return pool.nworkers;
}

__attribute__((destructor)) static void stop_workers(void) {
    if (!atomic_flag_test_and_set(&busy)) {
        pthread_mutex_lock(&pool.mu);
        pool.stop = true;
        pthread_cond_broadcast(&pool.wake);
        pthread_mutex_unlock(&pool.mu);
        for (int i = 0; i < pool.nworkers; i++) pthread_join(pool.th[i], NULL);
        pool.nworkers = 0;
    }
}

int nbi_parallel_chunks(int64_t n, int64_t grain) {
    int t = nb_num_threads();
    if (t <= 1 || n <= grain) return 1;
    int64_t c = grain > 0 ? n / grain : n;
    return c < t ? (int)(c < 1 ? 1 : c) : t;
}

void nbi_parallel_for(int64_t n, int64_t grain, nbi_range_fn fn, void *ctx) {
    if (n <= 0) return;
    int nt = nbi_parallel_chunks(n, grain);
    if (nt <= 1 || atomic_flag_test_and_set(&busy)) {
        fn(ctx, 0, n);
        return;
    }
    int workers = grow(nt - 1);
    if (workers + 1 < nt) nt = workers + 1;
    int64_t chunk = n / nt + (n % nt != 0); /* n + nt - 1 could overflow */
    if (chunk >= 64) chunk = (chunk + 15) & ~(int64_t)15;
    int nchunks = (int)(n / chunk + (n % chunk != 0));
    pool.fn = fn;
    pool.ctx = ctx;
    pool.n = n;
    pool.chunk = chunk;
    atomic_store(&pool.pending, nchunks);
    uint64_t gen = (atomic_load(&pool.ticket) >> 16) + 1;
    pthread_mutex_lock(&pool.mu);
    atomic_store_explicit(&pool.ticket, gen << 16 | (uint64_t)nchunks << 8, memory_order_release);
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.mu);
    run_chunks();
    while (atomic_load_explicit(&pool.pending, memory_order_acquire) > 0) cpu_relax();
    atomic_flag_clear(&busy);
}

/* The user's fn runs under the callback rule on every thread, one range at
 * a time; the first range that broke it gives the caller its message. */
typedef struct {
    void (*fn)(void *ctx, int64_t lo, int64_t hi);
    void *ctx;
    atomic_flag failed;
    char msg[512];
    int drew, *watch; /* random draws in the ranges (nbi_rng_watch) */
} user_job;

/* Each range in a scope of its own, on whichever thread runs it, so that
 * tensors fn makes go when the range ends, whatever the thread count (a
 * worker has no scope of the caller's to put them in). */
static void user_range(void *p, int64_t lo, int64_t hi) {
    user_job *j = p;
    nbi_rng_tape *tapes = nbi_rng_tapes;
    int *watch = nbi_rng_watch;
    nbi_rng_tapes = NULL;
    nbi_rng_watch = j->watch;
    nb_scope_begin();
    nbi_callback cb = {.who_fmt = "fn on range [%lld, %lld)", .who_lo = lo, .who_hi = hi};
    nbi_callback_enter(&cb, "nb_parallel_for", false);
    cb.no_keep = true;
    j->fn(j->ctx, lo, hi);
    if (nbi_callback_leave(&cb) != 0 && !atomic_flag_test_and_set(&j->failed))
        snprintf(j->msg, sizeof j->msg, "%s", nb_last_error());
    nb_scope_end();
    nbi_rng_tapes = tapes;
    nbi_rng_watch = watch;
}

void nb_parallel_for(int64_t n, int64_t grain, void (*fn)(void *ctx, int64_t lo, int64_t hi),
                     void *ctx) {
    if (!fn) {
        nbi_error("nb_parallel_for: fn is NULL");
        return;
    }
    user_job j = {.fn = fn, .ctx = ctx, .failed = ATOMIC_FLAG_INIT};
    /* under a checkpoint (a tape), or inside a range of one that is */
    j.watch = nbi_rng_tapes ? &j.drew : nbi_rng_watch;
    nbi_parallel_for(n, grain, user_range, &j);
    if (__atomic_load_n(&j.drew, __ATOMIC_RELAXED)) nbi_rng_refuse_parallel();
    if (j.msg[0]) nbi_error("%s", j.msg);
}

void nb_set_num_threads(int n) {
    if (n < 1 || n > MAX_THREADS) {
        nbi_error("nb_set_num_threads: n must be in 1..%d, got %d", MAX_THREADS, n);
        return;
    }
    atomic_store(&num_threads, n);
}

/* The CPUs this process may run on: its affinity mask, else those online. */
static long usable_cpus(void) {
    long online = sysconf(_SC_NPROCESSORS_ONLN);
#ifdef CPU_COUNT
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        long n = CPU_COUNT(&set);
        if (n >= 1 && (online < 1 || n < online)) return n;
    }
#endif
    return online;
}

/* NABLA_NUM_THREADS: 0 when unset or empty, the count when a whole number
 * from 1 (past MAX_THREADS it stops growing), -1 for anything else. */
static long env_count(const char *e) {
    if (!e || !*e) return 0;
    long v = 0;
    for (const char *c = e; *c; c++) {
        if (*c < '0' || *c > '9') return -1;
        if (v <= MAX_THREADS) v = v * 10 + (*c - '0');
    }
    return v >= 1 ? v : -1;
}

int nb_num_threads(void) {
    int n = atomic_load(&num_threads);
    if (n != 0) return n;
    const char *e = getenv("NABLA_NUM_THREADS");
    long v = env_count(e), cpus = usable_cpus();
    if (cpus < 1) cpus = 1;
    n = v < 1 ? (cpus > MAX_THREADS ? MAX_THREADS : (int)cpus) : v > MAX_THREADS ? MAX_THREADS : (int)v;
    int unset = 0;
    if (!atomic_compare_exchange_strong(&num_threads, &unset, n)) return unset; /* another thread's */
    if (v < 0) /* said once: by the thread that set the count */
        nbi_env_warn("NABLA_NUM_THREADS=\"%s\" is not a thread count (a whole number from 1 "
                     "to %d); it is ignored: %d threads (the CPUs this process may run on)", e,
                     MAX_THREADS, n);
    if (v > MAX_THREADS)
        nbi_env_warn("NABLA_NUM_THREADS=%s is above the limit of %d threads; %d run", e,
                     MAX_THREADS, MAX_THREADS);
    return n;
}
