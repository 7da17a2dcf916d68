/* test_concurrency.c: nabla used from several user threads and across
 * fork(): backward on other threads (one after another, taking turns, at the
 * same time into a shared leaf, and through a graph another thread is
 * walking), fork while other threads allocate or backpropagate, tensors of
 * one thread's scope freed on another, a thread that exits with a scope
 * open, nb_parallel_for at the edge of int64, and the allocator's retry
 * after emptying its cache. `make tsan` runs this suite under
 * ThreadSanitizer (the fork case is left out there, and under ASan and
 * valgrind: see the test). */
#include "test_util.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>


typedef struct {
    int64_t live, bytes;
} usage;
static usage usage_now(void) { return (usage){nb_live_tensors(), nb_memory_allocated()}; }
static void expect_usage(usage u) {
    ck_assert_int_eq(nb_live_tensors(), u.live);
    ck_assert_int_eq(nb_memory_allocated(), u.bytes);
}

/* Under valgrind, /proc/self/exe is valgrind's own program, and a forked
 * child that _exits reports the other threads' memory as leaked. */
static bool under_valgrind(void) {
    const char *pre = getenv("LD_PRELOAD");
    return pre && strstr(pre, "vgpreload");
}

static nb_tensor *scalar_leaf(double v) {
    return nb_set_requires_grad(nb_scalar(NB_F64, v), true);
}

static pthread_t start(void *(*fn)(void *), void *arg) {
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, fn, arg), 0);
    return th;
}

/* ------------------------------------------- backward on other threads */
/* loss = sum(w * k): adds k to every element of w's gradient */
static int backward_times(nb_tensor *w, double k) {
    nb_scope_begin();
    int rc = nb_backward(nb_sum_all(nb_mul_scalar(w, k)));
    nb_scope_end();
    return rc;
}

static void *backward_3(void *w) { return (void *)(intptr_t)backward_times(w, 3.0); }

/* Three threads, one after another: the gradients add up (was 3, not 9: the
 * visit mark was stamped per thread). */
START_TEST(backward_on_threads_one_after_another_adds_up) {
    usage u = usage_now();
    nb_tensor *w = scalar_leaf(1.0);
    for (int k = 0; k < 3; k++) {
        void *rc;
        pthread_join(start(backward_3, w), &rc);
        ck_assert_int_eq((int)(intptr_t)rc, 0);
    }
    ck_assert_double_eq(nb_item(nb_grad(w)), 9.0);
    nb_free(w);
    expect_usage(u);
}
END_TEST

/* Two threads taking turns under a mutex, zeroing the gradient each step:
 * every step sees exactly its own gradient (9 of 10 steps did not). */
typedef struct {
    nb_tensor *w;
    pthread_mutex_t mu;
    int steps, wrong;
} turns;

static void *take_turns(void *arg) {
    turns *t = arg;
    for (int s = 0; s < t->steps; s++) {
        pthread_mutex_lock(&t->mu);
        nb_zero_grad(t->w);
        int rc = backward_times(t->w, 3.0);
        if (rc != 0 || nb_item(nb_grad(t->w)) != 3.0) t->wrong++;
        pthread_mutex_unlock(&t->mu);
    }
    return NULL;
}

START_TEST(threads_taking_turns_see_their_own_gradient) {
    usage u = usage_now();
    turns t = {.w = scalar_leaf(1.0), .mu = PTHREAD_MUTEX_INITIALIZER, .steps = 10};
    ck_assert_int_eq(backward_times(t.w, 3.0), 0); /* the .grad exists from here on */
    pthread_t a = start(take_turns, &t), b = start(take_turns, &t);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    ck_assert_int_eq(t.wrong, 0);
    nb_free(t.w);
    expect_usage(u);
}
END_TEST

/* Backward on two threads at the same time into one shared leaf: every
 * contribution arrives (was 399 of 400: the accumulation raced). */
typedef struct {
    nb_tensor *w;
    int n, failed;
} shared_leaf;

static void *many_backwards(void *arg) {
    shared_leaf *s = arg;
    for (int k = 0; k < s->n; k++)
        if (backward_times(s->w, 1.0) != 0) s->failed++;
    return NULL;
}

START_TEST(concurrent_backward_into_a_shared_leaf_adds_up) {
    usage u = usage_now();
    nb_tensor *w = nb_set_requires_grad(nb_zeros(NB_F64, NB_SHAPE(64)), true);
    shared_leaf s[2] = {{w, 200, 0}, {w, 200, 0}};
    pthread_t a = start(many_backwards, &s[0]), b = start(many_backwards, &s[1]);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    ck_assert_int_eq(s[0].failed + s[1].failed, 0);
    double *g = values(nb_grad(w));
    for (int i = 0; i < 64; i++) ck_assert_double_eq(g[i], 400.0);
    free(g);
    nb_free(w);
    expect_usage(u);
}
END_TEST

/* A graph another thread is walking: refused with a message, never a mixed
 * up gradient. A custom op holds the first walk inside its backward until
 * the second has tried. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stage; /* 1: the first walk is inside; 2: the second has tried */
} gate;

static nb_tensor *gate_forward(nb_function_ctx *ctx, nb_tensor **in, int n, void *user) {
    (void)ctx, (void)n, (void)user;
    return nb_mul_scalar(in[0], 1.0);
}
static int gate_backward(nb_function_ctx *ctx, nb_tensor *g, nb_tensor **gin, void *user) {
    (void)ctx;
    gate *gt = user;
    pthread_mutex_lock(&gt->mu);
    if (gt->stage == 0) { /* only the first walk waits */
        gt->stage = 1;
        pthread_cond_broadcast(&gt->cv);
        while (gt->stage < 2) pthread_cond_wait(&gt->cv, &gt->mu);
    }
    pthread_mutex_unlock(&gt->mu);
    gin[0] = nb_mul_scalar(g, 1.0);
    return gin[0] ? 0 : -1;
}
static const nb_function GATE = {.name = "gate", .forward = gate_forward,
                                 .backward = gate_backward};

typedef struct {
    nb_tensor *loss;
    int rc;
} walk_arg;
static void *walk_retained(void *arg) {
    walk_arg *a = arg;
    nb_backward_opts keep = {.retain_graph = true};
    a->rc = nb_backward_with_opts(a->loss, NULL, &keep);
    return NULL;
}

START_TEST(a_graph_walked_by_another_thread_is_refused) {
    usage u = usage_now();
    nb_tensor *w = nb_set_requires_grad(nb_ones(NB_F64, NB_SHAPE(4)), true);
    gate gt = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    nb_scope_begin();
    nb_tensor *h = nb_function_apply(&GATE, &w, 1, &gt);
    nb_tensor *loss = nb_sum_all(nb_mul_scalar(h, 2.0));
    ck_assert_ptr_nonnull(loss);
    walk_arg a = {loss, -2};
    pthread_t th = start(walk_retained, &a);
    pthread_mutex_lock(&gt.mu);
    while (gt.stage < 1) pthread_cond_wait(&gt.cv, &gt.mu);
    pthread_mutex_unlock(&gt.mu);
    /* the first walk holds the graph: this one must stop before adding anything */
    nb_backward_opts keep = {.retain_graph = true};
    int rc = nb_backward_with_opts(loss, NULL, &keep);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", nb_last_error() ? nb_last_error() : "");
    pthread_mutex_lock(&gt.mu);
    gt.stage = 2;
    pthread_cond_broadcast(&gt.cv);
    pthread_mutex_unlock(&gt.mu);
    pthread_join(th, NULL);
    ck_assert_int_eq(a.rc, 0);
    ck_assert_int_eq(rc, -1);
    ck_assert_msg(strstr(msg, "nb_backward: another thread is backpropagating through this "
                              "graph") != NULL, "message: %s", msg);
    double *g = values(nb_grad(w)); /* exactly one walk's worth */
    for (int i = 0; i < 4; i++) ck_assert_double_eq(g[i], 2.0);
    free(g);
    /* the graph is free again: a third walk goes through */
    nb_clear_error();
    ck_assert_int_eq(nb_backward(loss), 0);
    g = values(nb_grad(w));
    for (int i = 0; i < 4; i++) ck_assert_double_eq(g[i], 4.0);
    free(g);
    nb_scope_end();
    nb_free(w);
    expect_usage(u);
}
END_TEST

/* ------------------------------------------------------------------- fork */
typedef struct {
    atomic_bool stop;
    nb_tensor *w;
} busy_arg;

/* Allocates and frees 8-16 KiB buffers in a tight loop (the cache's lock),
 * and now and then backpropagates into w (the gradient lock), until told. */
static void *stay_busy(void *arg) {
    busy_arg *b = arg;
    unsigned k = 0;
    while (!atomic_load(&b->stop)) {
        nb_free(nb_empty(NB_F32, NB_SHAPE(2048 + (int64_t)(k % 2048))));
        if ((++k & 255) == 0) backward_times(b->w, 1.0);
        k++;
    }
    return NULL;
}

/* Waits for pid up to `seconds` (a hang guard: a child needs milliseconds,
 * a second or two on a loaded machine); true when it exited with status 0.
 * Polled: waitpid cannot wait with a limit. */
static bool child_ok(pid_t pid, int seconds) {
    for (int k = 0; k < seconds * 100; k++) {
        int st;
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) return WIFEXITED(st) && WEXITSTATUS(st) == 0;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return false;
}

/* Forks while two other threads allocate and backpropagate: every child can
 * allocate, compute on the pool and backpropagate (32 of 200 children hung
 * on the cache's lock before). */
START_TEST(fork_while_other_threads_allocate) {
    /* ThreadSanitizer does not follow a threaded fork; valgrind: see above;
     * AddressSanitizer's own allocator (gcc 12's libasan) does not hold its
     * quarantine lock across fork: 3 of 2,000 children hung there, in
     * __asan::Quarantine::Drain, none in nabla's locks */
    if (UNDER_TSAN || UNDER_ASAN || under_valgrind()) return;
    int forks = 200;
    busy_arg b = {.w = nb_set_requires_grad(nb_zeros(NB_F64, NB_SHAPE(8)), true)};
    pthread_t th[2] = {start(stay_busy, &b), start(stay_busy, &b)};
    int bad = -1; /* the first child that hung or failed: no more are forked */
    for (int k = 0; k < forks && bad < 0; k++) {
        pid_t pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
            nb_scope_begin();
            nb_tensor *t = nb_ones(NB_F32, NB_SHAPE(1 << 20)); /* 4 MiB: the cache */
            nb_tensor *s = t ? nb_sum_all(nb_exp(t)) : NULL;
            int rc = backward_times(b.w, 1.0);
            nb_scope_end();
            _exit(s && rc == 0 ? 0 : 1);
        }
        if (!child_ok(pid, 60)) bad = k;
    }
    atomic_store(&b.stop, true);
    pthread_join(th[0], NULL);
    pthread_join(th[1], NULL);
    nb_free(b.w);
    ck_assert_msg(bad < 0, "child %d of %d hung (60 s) or failed", bad + 1, forks);
}
END_TEST

/* ----------------------------------------------- scopes and other threads */
typedef struct {
    nb_tensor *t;
    int rc;
    char msg[512];
} free_arg;
static void *free_it(void *arg) {
    free_arg *a = arg;
    nb_clear_error();
    nb_free(a->t);
    snprintf(a->msg, sizeof a->msg, "%s", nb_last_error() ? nb_last_error() : "");
    return NULL;
}

/* A tensor of this thread's scope freed on another thread: an error there,
 * and the tensor stays this scope's (was a heap-use-after-free in
 * nb_scope_end). A persistent tensor may be freed on any thread. */
START_TEST(freeing_another_threads_scoped_tensor_is_an_error) {
    usage u = usage_now();
    nb_scope_begin();
    nb_tensor *t = nb_full(NB_F64, NB_SHAPE(3), 2.0);
    free_arg a = {.t = t};
    pthread_join(start(free_it, &a), NULL);
    ck_assert_msg(strstr(a.msg, "nb_free: input 0 belongs to a scope of another thread") != NULL,
                  "message: %s", a.msg);
    ck_assert_double_eq(nb_item(nb_sum_all(t)), 6.0); /* still alive, still here */
    nb_scope_end();
    expect_usage(u);
    free_arg p = {.t = nb_full(NB_F64, NB_SHAPE(3), 1.0)}; /* persistent */
    pthread_join(start(free_it, &p), NULL);
    ck_assert_str_eq(p.msg, "");
    expect_usage(u);
}
END_TEST

static void *leave_a_scope_open(void *arg) {
    (void)arg;
    nb_scope_begin();
    nb_scope_begin();
    nb_tensor *t = nb_ones(NB_F32, NB_SHAPE(1 << 18)); /* 1 MiB */
    return t ? NULL : (void *)1;                        /* exits with two scopes open */
}

/* A thread that exits with scopes open: they end (their tensors were leaked). */
START_TEST(a_thread_exiting_with_a_scope_open_frees_it) {
    usage u = usage_now();
    void *rc;
    pthread_join(start(leave_a_scope_open, NULL), &rc);
    ck_assert_ptr_null(rc);
    expect_usage(u);
}
END_TEST

/* ----------------------------------------------------------- parallel_for */
typedef struct {
    pthread_mutex_t mu;
    int n;
    int64_t lo[64], hi[64];
} ranges;
static void record(void *ctx, int64_t lo, int64_t hi) {
    ranges *r = ctx;
    pthread_mutex_lock(&r->mu);
    if (r->n < 64) {
        r->lo[r->n] = lo;
        r->hi[r->n] = hi;
    }
    r->n++;
    pthread_mutex_unlock(&r->mu);
}
static int by_lo(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Ranges near INT64_MAX: no overflow (UBSan) and no negative bound; the
 * ranges tile [0, n) exactly. */
START_TEST(parallel_for_near_int64_max) {
    int saved = nb_num_threads();
    const int64_t ns[3] = {INT64_MAX, INT64_MAX - 1, INT64_MAX / 3 * 2};
    for (int t = 1; t <= 3; t++) {
        nb_set_num_threads(t);
        for (int k = 0; k < 3; k++) {
            ranges r = {.mu = PTHREAD_MUTEX_INITIALIZER};
            nb_parallel_for(ns[k], INT64_MAX / 8, record, &r);
            ck_assert_int_ge(r.n, 1);
            ck_assert_int_le(r.n, 64);
            int64_t pair[64][2];
            for (int i = 0; i < r.n; i++) {
                pair[i][0] = r.lo[i];
                pair[i][1] = r.hi[i];
            }
            qsort(pair, (size_t)r.n, sizeof pair[0], by_lo);
            ck_assert_int_eq(pair[0][0], 0);
            for (int i = 0; i < r.n; i++) {
                ck_assert_int_ge(pair[i][0], 0);
                ck_assert_int_gt(pair[i][1], pair[i][0]);
                if (i + 1 < r.n) ck_assert_int_eq(pair[i][1], pair[i + 1][0]);
            }
            ck_assert_int_eq(pair[r.n - 1][1], ns[k]);
        }
    }
    nb_set_num_threads(saved);
}
END_TEST

/* ------------------------------------------------------------- allocator */
/* Under an address-space limit, with 1 GiB in the cache of freed buffers,
 * a tensor that needs fresh memory gets it: the allocator empties the cache
 * and tries again (it reported out of memory before). In a child process,
 * so the limit stays there; not under ASan or valgrind, whose own memory
 * the limit would count. */
START_TEST(allocation_retries_after_emptying_the_cache) {
    if (UNDER_ASAN || UNDER_TSAN || under_valgrind()) return;
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        nb_empty_cache();
        nb_tensor *a = nb_empty(NB_F32, NB_SHAPE(1 << 28)); /* 1 GiB */
        if (!a) _exit(2);
        nb_free(a); /* into the cache */
        if (nb_memory_cached() < (int64_t)1 << 30) _exit(3);
        struct rlimit rl;
        getrlimit(RLIMIT_AS, &rl);
        /* what the process maps now (the cached 1 GiB with it), plus 0.5 GiB */
        FILE *f = fopen("/proc/self/statm", "r");
        long pages = 0;
        if (!f || fscanf(f, "%ld", &pages) != 1) _exit(4);
        fclose(f);
        rl.rlim_cur = (rlim_t)pages * (rlim_t)sysconf(_SC_PAGESIZE) + ((rlim_t)1 << 29);
        if (setrlimit(RLIMIT_AS, &rl) != 0) _exit(5);
        /* 1.25 GiB: another size class, so the cached 1 GiB cannot serve it,
         * and it fits only once the cache is given back */
        nb_tensor *b = nb_empty(NB_F32, NB_SHAPE((int64_t)5 << 26));
        _exit(b ? 0 : 6);
    }
    int st;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child: status %d",
                  WIFEXITED(st) ? WEXITSTATUS(st) : -1);
}
END_TEST

/* NABLA_CACHE_MB is read once per process: each value is tried in a child
 * that runs this test binary with NB_TEST_PRINT_CACHE_LIMIT set
 * (run_tests.c prints nb_memory_cache_limit() then). */
static long long cache_limit_with(const char *value) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "NB_TEST_PRINT_CACHE_LIMIT=1 NABLA_CACHE_MB='%s' /proc/%ld/exe 2>/dev/null",
             value, (long)getpid());
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    long long v = -2;
    ck_assert_int_eq(fscanf(p, "%lld", &v), 1);
    pclose(p);
    return v;
}

/* This test binary run with `env` (VAR='value' ...) and `print` set
 * (NB_TEST_PRINT_ISA, _THREADS, _CACHE_LIMIT): its first line of output
 * into out, its whole stderr into err. */
static void run_self(const char *env, const char *print, char *out, size_t no, char *err,
                     size_t ne) {
    test_make_tmp_dir("env");
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s %s=1 /proc/%ld/exe 2>%s", env, print, (long)getpid(),
             test_tmp_path("err"));
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    out[0] = 0;
    ck_assert_ptr_nonnull(fgets(out, (int)no, p));
    out[strcspn(out, "\n")] = 0;
    ck_assert_int_eq(pclose(p), 0);
    size_t n = 0;
    char *e = test_read_file(test_tmp_path("err"), &n);
    snprintf(err, ne, "%s", e);
    free(e);
    test_remove_tmp_dir();
}

/* A value nabla cannot read is ignored, and said once on stderr with the
 * variable, the value and what runs instead; a good value says nothing. */
START_TEST(environment_values_it_cannot_read_are_named) {
    if (under_valgrind()) return;
    char best[64], out[64], err[1024];
    run_self("env -u NABLA_ISA", "NB_TEST_PRINT_ISA", best, sizeof best, err, sizeof err);
    ck_assert_str_eq(err, "");
    static const char *bad_isa[] = {"garbage", "avx2 ", "avx512bf16x"};
    for (int k = 0; k < 3; k++) {
        char env[128], want[256];
        snprintf(env, sizeof env, "NABLA_ISA='%s'", bad_isa[k]);
        run_self(env, "NB_TEST_PRINT_ISA", out, sizeof out, err, sizeof err);
        ck_assert_str_eq(out, best); /* the best path, as without it */
#if defined(__aarch64__)
        const char *paths = "portable, neon, neon-bf16, sve";
#elif defined(__x86_64__) || defined(__i386__)
        const char *paths = "portable, avx2, avx512, avx512bf16, amx";
#else
        const char *paths = "portable";
#endif
        snprintf(want, sizeof want, "nabla: NABLA_ISA=\"%s\" names no vector path (one of "
                 "%s); it is ignored: this CPU's best path, %s, runs\n", bad_isa[k], paths, best);
        ck_assert_str_eq(err, want);
    }
    run_self("NABLA_ISA=portable", "NB_TEST_PRINT_ISA", out, sizeof out, err, sizeof err);
    ck_assert_str_eq(out, "portable");
    ck_assert_str_eq(err, "");

    char cpus[64];
    run_self("env -u NABLA_NUM_THREADS", "NB_TEST_PRINT_THREADS", cpus, sizeof cpus, err, sizeof err);
    ck_assert_str_eq(err, "");
    static const char *bad_n[] = {"abc", "0", "-2", "4x", " 3"};
    for (int k = 0; k < 5; k++) {
        char env[128], want[256];
        snprintf(env, sizeof env, "NABLA_NUM_THREADS='%s'", bad_n[k]);
        run_self(env, "NB_TEST_PRINT_THREADS", out, sizeof out, err, sizeof err);
        ck_assert_str_eq(out, cpus);
        snprintf(want, sizeof want, "nabla: NABLA_NUM_THREADS=\"%s\" is not a thread count (a "
                 "whole number from 1 to 64); it is ignored: %s threads (the CPUs this process "
                 "may run on)\n", bad_n[k], cpus);
        ck_assert_str_eq(err, want);
    }
    run_self("NABLA_NUM_THREADS=3", "NB_TEST_PRINT_THREADS", out, sizeof out, err, sizeof err);
    ck_assert_str_eq(out, "3");
    ck_assert_str_eq(err, "");
    run_self("NABLA_NUM_THREADS=1000", "NB_TEST_PRINT_THREADS", out, sizeof out, err, sizeof err);
    ck_assert_str_eq(out, "64");
    ck_assert_str_eq(err, "nabla: NABLA_NUM_THREADS=1000 is above the limit of 64 threads; 64 run\n");

    run_self("NABLA_CACHE_MB=12x", "NB_TEST_PRINT_CACHE_LIMIT", out, sizeof out, err, sizeof err);
    ck_assert_str_eq(out, "1073741824");
    ck_assert_str_eq(err, "nabla: NABLA_CACHE_MB=\"12x\" is not a count of MiB (a whole number); "
                          "it is ignored: the default, 1024 MiB, is kept\n");
    run_self("NABLA_CACHE_MB=", "NB_TEST_PRINT_CACHE_LIMIT", out, sizeof out, err, sizeof err);
    ck_assert_str_eq(err, ""); /* empty: as unset */
}
END_TEST

START_TEST(cache_limit_from_the_environment) {
    if (under_valgrind()) return;
    ck_assert_int_eq(cache_limit_with("64"), 64LL << 20);
    ck_assert_int_eq(cache_limit_with("0"), 0);
    ck_assert_int_eq(cache_limit_with(""), 1024LL << 20);     /* empty: the default */
    ck_assert_int_eq(cache_limit_with("abc"), 1024LL << 20);  /* junk: the default */
    ck_assert_int_eq(cache_limit_with("-5"), 1024LL << 20);   /* a sign: the default */
    ck_assert_int_eq(cache_limit_with("12x"), 1024LL << 20);  /* junk after digits */
    /* too large for bytes in size_t (was 0 or 1 MiB after overflow): no limit */
    ck_assert_int_eq(cache_limit_with("99999999999999999999999"), -1);
    ck_assert_int_eq(cache_limit_with("17592186044416"), -1); /* 2^44 MiB = 2^64 bytes */
}
END_TEST

Suite *suite_concurrency(void) {
    Suite *s = suite_create("concurrency");
    TCase *tc = tcase_create("threads");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, backward_on_threads_one_after_another_adds_up);
    tcase_add_test(tc, threads_taking_turns_see_their_own_gradient);
    tcase_add_test(tc, concurrent_backward_into_a_shared_leaf_adds_up);
    tcase_add_test(tc, a_graph_walked_by_another_thread_is_refused);
    tcase_add_test(tc, freeing_another_threads_scoped_tensor_is_an_error);
    tcase_add_test(tc, a_thread_exiting_with_a_scope_open_frees_it);
    tcase_add_test(tc, parallel_for_near_int64_max);
    suite_add_tcase(s, tc);
    tc = tcase_create("process");
    tcase_set_timeout(tc, 600); /* a hang guard: 200 forks beside busy threads take 10 s */
    tcase_add_test(tc, fork_while_other_threads_allocate);
    tcase_add_test(tc, allocation_retries_after_emptying_the_cache);
    tcase_add_test(tc, cache_limit_from_the_environment);
    tcase_add_test(tc, environment_values_it_cannot_read_are_named);
    suite_add_tcase(s, tc);
    return s;
}
