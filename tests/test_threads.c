/* test_threads.c: results are bitwise identical for 1, 2 and 3 threads.
 *
 * Every case computes its outputs (and gradients) once with
 * nb_set_num_threads(1), once with 2 and once with 3, on inputs large enough
 * to take the parallel paths (>= 1M elements for reductions, thousands of
 * rows for softmax, batch x row tiles for matmul; every registered op on its
 * own is in tests/test_registry.c),
 * with sizes that are not multiples of 16, 2 or 3 (1000003, (997, 1031),
 * L = 257) so that range cuts fall mid-vector and mid-row. The bytes of each
 * output after nb_contiguous are compared with memcmp (so -0.0 vs +0.0 or a
 * different NaN payload is a failure, not just a value difference); a
 * failure names the output, the thread count, the first differing element
 * and how many differ. The thread count is restored after every case, before
 * anything is compared, and every run must free all it made (tensors and
 * storage bytes). Under valgrind, and under emulation (NB_TEST_REDUCED=1:
 * make test-arm), the sizes shrink (still above the parallel thresholds);
 * NB_SLOW_TESTS=1 keeps the full ones.
 *
 * Also: the harness itself (a thread-dependent result is caught), the
 * nb_set_num_threads errors, the memory statistics (nb_memory_allocated and
 * friends), nb_parallel_for's contract, and user threads calling ops at the
 * same time. */
#include "test_util.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>

/* ------------------------------------------------------------- snapshots */
#define MAX_OUT 256

/* The bytes of every output of one run, in the order they were taken. */
typedef struct {
    int n;
    char name[MAX_OUT][80];
    nb_dtype kind[MAX_OUT];
    int ndim[MAX_OUT];
    int64_t shape[MAX_OUT][NB_MAX_DIMS];
    size_t nbytes[MAX_OUT];
    unsigned char *bytes[MAX_OUT];
} snapshot;

static const int COUNTS[3] = {1, 2, 3};
static int cur_threads; /* the thread count of the run in progress, for messages */

static size_t elem_size(nb_dtype kind) {
    switch (kind) {
    case NB_F32: return sizeof(float);
    case NB_F64: return sizeof(double);
    case NB_I64: return sizeof(int64_t);
    case NB_BOOL: return sizeof(bool);
    default: return 1;
    }
}

/* Asserts t is not NULL; the message names the expression and thread count. */
#define OK(t) ok_at(__LINE__, #t, (t))
static nb_tensor *ok_at(int line, const char *what, nb_tensor *t) {
    ck_assert_msg(t != NULL, "test_threads.c:%d: %s failed with %d thread(s): %s", line, what,
                  cur_threads, nb_last_error() ? nb_last_error() : "(no error set)");
    return t;
}
#define OK_RC(rc) ck_assert_msg((rc) == 0, "test_threads.c:%d: %s failed with %d thread(s): %s", \
                                __LINE__, #rc, cur_threads,                                 \
                                nb_last_error() ? nb_last_error() : "(no error set)")

/* count plain C values of a dtype (double, int64_t, ...) */
static void snap_values(snapshot *s, const char *name, nb_dtype kind, const void *p, size_t count) {
    ck_assert_msg(s->n < MAX_OUT, "too many outputs in one snapshot");
    int i = s->n++;
    size_t n = count * elem_size(kind);
    snprintf(s->name[i], sizeof s->name[i], "%s", name);
    s->kind[i] = kind;
    s->ndim[i] = 1;
    s->shape[i][0] = (int64_t)count;
    s->nbytes[i] = n;
    s->bytes[i] = malloc(n ? n : 1);
    ck_assert(s->bytes[i] != NULL);
    memcpy(s->bytes[i], p, n);
}

/* an nb_rng's (seed, offset) */
static void snap_rng(snapshot *s, const char *name, const nb_rng *r) {
    int64_t w[2];
    memcpy(&w[0], &r->seed, sizeof w[0]);
    memcpy(&w[1], &r->offset, sizeof w[1]);
    snap_values(s, name, NB_I64, w, 2);
}

/* Copies t's values (row-major, through nb_contiguous) into the snapshot. */
static void snap(snapshot *s, const char *name, nb_tensor *t) {
    ck_assert_msg(t != NULL, "%s is NULL with %d thread(s): %s", name, cur_threads,
                  nb_last_error() ? nb_last_error() : "(no error set)");
    ck_assert_msg(s->n < MAX_OUT, "too many outputs in one snapshot");
    nb_tensor *c = nb_contiguous(t);
    ck_assert_msg(c != NULL, "nb_contiguous(%s) failed with %d thread(s): %s", name, cur_threads,
                  nb_last_error());
    int i = s->n++;
    snprintf(s->name[i], sizeof s->name[i], "%s", name);
    s->kind[i] = nb_dtype_of(c);
    s->ndim[i] = nb_ndim(c);
    for (int d = 0; d < s->ndim[i]; d++) s->shape[i][d] = nb_shape(c)[d];
    s->nbytes[i] = (size_t)nb_numel(c) * elem_size(s->kind[i]);
    s->bytes[i] = malloc(s->nbytes[i] ? s->nbytes[i] : 1);
    ck_assert(s->bytes[i] != NULL);
    if (s->nbytes[i]) memcpy(s->bytes[i], nb_data(c), s->nbytes[i]);
    nb_free(c);
}

/* The gradient of a leaf, which must exist. */
static void snap_grad(snapshot *s, const char *name, nb_tensor *leaf) {
    nb_tensor *g = nb_grad(leaf);
    ck_assert_msg(g != NULL, "%s: no gradient with %d thread(s)", name, cur_threads);
    snap(s, name, g);
}

static void snap_free(snapshot *s) {
    for (int i = 0; i < s->n; i++) free(s->bytes[i]);
    s->n = 0;
}

static double elem_value(nb_dtype kind, const unsigned char *p) {
    switch (kind) {
    case NB_F32: { float v; memcpy(&v, p, sizeof v); return v; }
    case NB_F64: { double v; memcpy(&v, p, sizeof v); return v; }
    case NB_I64: { int64_t v; memcpy(&v, p, sizeof v); return (double)v; }
    case NB_BOOL: return *p ? 1.0 : 0.0;
    default: return *p;
    }
}

static void shape_str(char *buf, size_t n, int ndim, const int64_t *shape) {
    size_t k = (size_t)snprintf(buf, n, "(");
    for (int d = 0; d < ndim && k < n; d++)
        k += (size_t)snprintf(buf + k, n - k, d ? ",%lld" : "%lld", (long long)shape[d]);
    if (k < n) snprintf(buf + k, n - k, ")");
}

/* Appends to msg a description of the first difference between the 1-thread
 * snapshot a and the `threads`-thread snapshot b; returns true if any. */
static bool describe_diff(char *msg, size_t cap, const char *label, const snapshot *a,
                          const snapshot *b, int threads) {
    size_t len = strlen(msg);
    if (a->n != b->n) {
        snprintf(msg + len, cap - len, "%s: %d outputs with 1 thread but %d with %d threads. ",
                 label, a->n, b->n, threads);
        return true;
    }
    for (int i = 0; i < a->n; i++) {
        char sa[96], sb[96];
        shape_str(sa, sizeof sa, a->ndim[i], a->shape[i]);
        shape_str(sb, sizeof sb, b->ndim[i], b->shape[i]);
        if (a->kind[i] != b->kind[i] || strcmp(sa, sb) != 0) {
            snprintf(msg + len, cap - len, "%s: output %s is %s %s with 1 thread but %s %s with "
                     "%d threads. ", label, a->name[i],
                     nb_dtype_name(a->kind[i]), sa,
                     nb_dtype_name(b->kind[i]), sb, threads);
            return true;
        }
        if (memcmp(a->bytes[i], b->bytes[i], a->nbytes[i]) == 0) continue;
        size_t es = elem_size(a->kind[i]), ne = a->nbytes[i] / es;
        int64_t first = -1, ndiff = 0;
        for (size_t e = 0; e < ne; e++)
            if (memcmp(a->bytes[i] + e * es, b->bytes[i] + e * es, es) != 0) {
                if (first < 0) first = (int64_t)e;
                ndiff++;
            }
        snprintf(msg + len, cap - len, "%s: output %s %s %s differs between 1 and %d threads: "
                 "first differing element %lld of %zu is %.17g with 1 thread, %.17g with %d "
                 "(%lld elements differ). ", label, a->name[i],
                 nb_dtype_name(a->kind[i]), sa, threads,
                 (long long)first, ne, elem_value(a->kind[i], a->bytes[i] + (size_t)first * es),
                 elem_value(b->kind[i], b->bytes[i] + (size_t)first * es), threads,
                 (long long)ndiff);
        return true;
    }
    return false;
}

typedef void (*compute_fn)(snapshot *out, void *ctx);

static double run_ms[3]; /* the time of each run, in ms, for the summary line */

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return 1e3 * (double)ts.tv_sec + 1e-6 * (double)ts.tv_nsec;
}

/* Runs fn with 1, 2 and 3 threads (each in its own scope, which must free
 * every tensor and storage byte it made), restores the thread count, then
 * compares. Returns NULL when all runs are bitwise identical, else a
 * malloc'ed message naming every difference found. */

static char *run_thread_counts(const char *label, compute_fn fn, void *ctx, size_t *total) {
    int orig = nb_num_threads();
    snapshot *snaps = calloc(3, sizeof *snaps);
    ck_assert(snaps != NULL);
    int64_t live0 = nb_live_tensors(), mem0 = nb_memory_allocated();
    char leak[256] = "";
    for (int i = 0; i < 3; i++) {
        nb_set_num_threads(COUNTS[i]);
        ck_assert_int_eq(nb_num_threads(), COUNTS[i]);
        cur_threads = COUNTS[i];
        double t0 = now_ms();
        nb_scope_begin();
        fn(&snaps[i], ctx);
        nb_scope_end();
        run_ms[i] = now_ms() - t0;
        if (!leak[0] && (nb_live_tensors() != live0 || nb_memory_allocated() != mem0))
            snprintf(leak, sizeof leak, "%s: with %d thread(s) the run left %lld tensors and "
                     "%lld bytes of storage behind", label, COUNTS[i],
                     (long long)(nb_live_tensors() - live0),
                     (long long)(nb_memory_allocated() - mem0));
    }
    nb_set_num_threads(orig);
    cur_threads = orig;
    size_t cap = 4096;
    char *msg = calloc(1, cap);
    ck_assert(msg != NULL);
    for (int i = 1; i < 3; i++) describe_diff(msg, cap, label, &snaps[0], &snaps[i], COUNTS[i]);
    if (leak[0]) snprintf(msg + strlen(msg), cap - strlen(msg), "%s", leak);
    *total = 0;
    for (int i = 0; i < snaps[0].n; i++) *total += snaps[0].nbytes[i];
    for (int i = 0; i < 3; i++) snap_free(&snaps[i]);
    free(snaps);
    if (!msg[0]) {
        free(msg);
        return NULL;
    }
    return msg;
}

#define expect_same_for_1_2_3_threads(label, fn, ctx) \
    expect_same_at(__FILE__, __LINE__, (label), (fn), (ctx))
static void expect_same_at(const char *file, int line, const char *label, compute_fn fn,
                           void *ctx) {
    size_t total = 0;
    char *msg = run_thread_counts(label, fn, ctx, &total);
    if (msg) {
        char buf[4096];
        snprintf(buf, sizeof buf, "%s", msg);
        free(msg);
        ck_abort_msg("%s:%d: %s", file, line, buf);
    }
    ck_assert_int_eq(nb_num_threads(), cur_threads);
    printf("threads ok    %-52s %7.2f MiB identical; 1/2/3 threads %.0f/%.0f/%.0f ms\n",
           label, (double)total / (1 << 20), run_ms[0], run_ms[1], run_ms[2]);
    fflush(stdout);
}

/* ---------------------------------------------------------------- inputs */
static nb_tensor *randn_t(nb_dtype dt, uint64_t seed, int ndim, const int64_t *shape) {
    nb_rng r;
    nb_rng_seed(&r, seed);
    return OK(nb_randn(dt, ndim, shape, &r));
}

/* uniform in [lo, lo + 1) */
static nb_tensor *rand_t(nb_dtype dt, uint64_t seed, double lo, int ndim, const int64_t *shape) {
    nb_rng r;
    nb_rng_seed(&r, seed);
    return OK(nb_add_scalar(OK(nb_rand(dt, ndim, shape, &r)), lo));
}

/* A tensor with its own storage and t's values. */
static nb_tensor *copy_of(nb_tensor *t) {
    nb_tensor *x = OK(nb_empty(nb_dtype_of(t), nb_ndim(t), nb_shape(t)));
    OK_RC(nb_copy_into(x, t));
    return x;
}

/* A fresh leaf (own storage, requires grad) with t's values. */
static nb_tensor *leaf(nb_tensor *t) { return OK(nb_set_requires_grad(copy_of(t), true)); }

/* A (rows, cols) tensor whose values are laid out transposed in memory: the
 * transpose of a contiguous (cols, rows) tensor. */
static nb_tensor *transposed(nb_dtype dt, uint64_t seed, int64_t rows, int64_t cols) {
    return OK(nb_transpose(randn_t(dt, seed, NB_SHAPE(cols, rows)), 0, 1));
}

/* Sizes. Under valgrind (seen by its preload library in LD_PRELOAD) or with
 * NB_TEST_REDUCED=1 (make test-arm's runs under QEMU) they shrink, still
 * above every parallel threshold (NBI_GRAIN 32K elements, NBI_GRAIN_HEAVY
 * 4K, ~2 MFLOP per matmul task), unless NB_SLOW_TESTS=1. */
static int64_t N1 = 1000003;       /* flat elementwise / full reductions */
static int64_t R = 997, C = 1031;  /* 2-d elementwise and reductions */
static int64_t WR = 33, WC = 32771; /* wide: reductions along dim 0 */
static int64_t POW2 = 1 << 20;
static int64_t B = 4, H = 8, L = 257; /* softmax / dropout (B,H,L,L) */
static int64_t B64 = 2, H64 = 4;      /* the f64 (B64,H64,L,L) */
static int64_t M = 515;               /* square matmul */
static int64_t MB0 = 8, MB1 = 8, MM = 128, MK = 64, MN = 128; /* batched matmul */
static int64_t AB = 2, AH = 4, AL = 257, AD = 64; /* attention f32; f64 at (AB,2,AL,AD/2) */
static int64_t LNR = 17, LNC = 61, LND = 515;    /* f64 layer norm (LNR,LNC,LND) */
static int64_t BATCH = 80;                        /* transformer batch */
static int64_t ON = 200003, OR = 199;             /* optimizer params (ON), (OR,C) f64 */
static bool reduced;

static void choose_sizes(void) {
    const char *pre = getenv("LD_PRELOAD"), *slow = getenv("NB_SLOW_TESTS");
    const char *small = getenv("NB_TEST_REDUCED");
    bool shrink = (pre && strstr(pre, "vgpreload")) || (small && strcmp(small, "1") == 0);
    if (!shrink || (slow && slow[0] && strcmp(slow, "0") != 0)) return;
    reduced = true;
    N1 = 200003;
    R = 241;
    WC = 8209;
    POW2 = 1 << 18;
    B = 2;
    H = 2;
    B64 = 1;
    H64 = 2;
    M = 197;
    MB0 = 2, MB1 = 4, MM = 96, MN = 96;
    AB = 2, AH = 2, AL = 129, AD = 32;
    LNR = 5, LND = 257;
    BATCH = 24;
    ON = 50003, OR = 53;
}

/* --------------------------------------------------- the harness itself */
/* A result that depends on the thread count must be reported, with the
 * element: everything at element 0, or only the sign of a zero at the end. */
static void depends_everywhere(snapshot *s, void *ctx) {
    (void)ctx;
    snap(s, "full(num_threads)", OK(nb_full(NB_F32, NB_SHAPE(N1), nb_num_threads())));
}

static void depends_on_last_zero_sign(snapshot *s, void *ctx) {
    (void)ctx;
    nb_tensor *t = OK(nb_zeros(NB_F64, NB_SHAPE(N1)));
    if (nb_num_threads() == 3) ((double *)nb_data(t))[N1 - 1] = -0.0;
    snap(s, "zeros, -0.0 last with 3 threads", t);
}

static void same_always(snapshot *s, void *ctx) {
    (void)ctx;
    snap(s, "arange", OK(nb_arange(NB_F64, 1000)));
}

START_TEST(harness_detects_differences) {
    int orig = nb_num_threads();
    size_t total;
    char want_all[96], want_count[64], want_last[96];
    snprintf(want_all, sizeof want_all, "first differing element 0 of %lld ", (long long)N1);
    snprintf(want_count, sizeof want_count, "(%lld elements differ)", (long long)N1);
    snprintf(want_last, sizeof want_last, "between 1 and 3 threads: first differing element "
             "%lld of %lld ", (long long)N1 - 1, (long long)N1);
    char *m = run_thread_counts("depends_everywhere", depends_everywhere, NULL, &total);
    ck_assert_ptr_nonnull(m);
    ck_assert_msg(strstr(m, "between 1 and 2 threads") && strstr(m, "between 1 and 3 threads") &&
                  strstr(m, want_all) && strstr(m, want_count), "%s", m);
    free(m);
    ck_assert_int_eq(nb_num_threads(), orig);
    m = run_thread_counts("depends_on_last_zero_sign", depends_on_last_zero_sign, NULL, &total);
    ck_assert_ptr_nonnull(m);
    ck_assert_msg(!strstr(m, "between 1 and 2 threads") &&
                  strstr(m, want_last) && strstr(m, "(1 elements differ)"), "%s", m);
    free(m);
    ck_assert_int_eq(nb_num_threads(), orig);
    ck_assert_ptr_null(run_thread_counts("same_always", same_always, NULL, &total));
    ck_assert_int_eq(total, 1000 * sizeof(double));
    ck_assert_int_eq(nb_num_threads(), orig);
}
END_TEST

/* ---------------------------------------------------- threads: the API */
/* msg contains the decimal value v as a whole number (not part of another) */
static bool has_number(const char *msg, int v) {
    char num[32];
    snprintf(num, sizeof num, "%d", v);
    size_t n = strlen(num);
    for (const char *p = strstr(msg, num); p; p = strstr(p + 1, num)) {
        char before = p == msg ? ' ' : p[-1], after = p[n];
        bool digit_before = before >= '0' && before <= '9';
        if (digit_before || (v >= 0 && before == '-')) continue;
        if (!(after >= '0' && after <= '9')) return true;
    }
    return false;
}

START_TEST(num_threads_api) {
    int orig = nb_num_threads();
    ck_assert_int_ge(orig, 1);
    for (int i = 0; i < 3; i++) {
        nb_clear_error();
        nb_set_num_threads(COUNTS[i]);
        ck_assert_int_eq(nb_num_threads(), COUNTS[i]);
        ck_assert_ptr_null(nb_last_error());
    }
    nb_set_num_threads(2);
    const int bad[] = {0, -1, -7};
    for (int i = 0; i < 3; i++) {
        nb_clear_error();
        nb_set_num_threads(bad[i]);
        const char *msg = nb_last_error();
        ck_assert_msg(msg != NULL, "nb_set_num_threads(%d) set no error", bad[i]);
        ck_assert_msg(strstr(msg, "nb_set_num_threads") != NULL,
                      "error \"%s\" does not name nb_set_num_threads", msg);
        ck_assert_msg(has_number(msg, bad[i]), "error \"%s\" does not give the value %d", msg,
                      bad[i]);
        ck_assert_msg(nb_num_threads() == 2, "nb_set_num_threads(%d) changed the count to %d",
                      bad[i], nb_num_threads());
    }
    nb_clear_error();
    nb_set_num_threads(orig);
    ck_assert_int_eq(nb_num_threads(), orig);
    ck_assert_ptr_null(nb_last_error());
}
END_TEST

/* ---------------------------------------------------------- memory stats */
START_TEST(memory_stats) {
    const int64_t MiB = 1 << 20;
    ck_assert_int_eq(nb_scope_depth(), 0);
    int64_t before = nb_memory_allocated();
    ck_assert_int_ge(before, 0);
    ck_assert_int_ge(nb_memory_peak(), before);

    nb_tensor *t = nb_empty(NB_F32, NB_SHAPE(MiB / 4)); /* 1 MiB, persistent */
    ck_assert_msg(t != NULL, "%s", nb_last_error());
    int64_t during = nb_memory_allocated();
    ck_assert_msg(during - before >= MiB, "allocated grew by %lld bytes for a 1 MiB tensor",
                  (long long)(during - before));
    ck_assert_int_ge(nb_memory_peak(), during);
    nb_free(t);
    ck_assert_msg(nb_memory_allocated() == before, "allocated %lld after nb_free, %lld before the "
                  "tensor", (long long)nb_memory_allocated(), (long long)before);
    ck_assert_int_ge(nb_memory_peak(), during); /* the peak remembers */
    /* default cache: the freed buffer is kept for reuse (never under ASan) */
    if (!getenv("NABLA_CACHE_MB") && !UNDER_ASAN)
        ck_assert_msg(nb_memory_cached() >= MiB, "cached %lld after freeing 1 MiB",
                      (long long)nb_memory_cached());

    nb_memory_reset_peak();
    ck_assert_int_eq(nb_memory_peak(), nb_memory_allocated());
    ck_assert_int_eq(nb_memory_peak(), before);

    /* a new high is tracked, and survives the free */
    nb_scope_begin();
    nb_tensor *big = nb_zeros(NB_F64, NB_SHAPE(3, MiB / 8)); /* 3 MiB, scoped */
    ck_assert_msg(big != NULL, "%s", nb_last_error());
    int64_t high = nb_memory_allocated();
    ck_assert_int_ge(high - before, 3 * MiB);
    ck_assert_int_ge(nb_memory_peak(), high);
    nb_scope_end();
    ck_assert_int_eq(nb_memory_allocated(), before);
    ck_assert_int_ge(nb_memory_peak(), high);
    ck_assert_int_ge(nb_memory_peak(), nb_memory_allocated());
    nb_memory_reset_peak();
    ck_assert_int_eq(nb_memory_peak(), before);

    nb_empty_cache();
    ck_assert_int_eq(nb_memory_cached(), 0);
    ck_assert_int_eq(nb_memory_allocated(), before); /* in-use bytes are not the cache's */
    ck_assert_int_ge(nb_memory_peak(), nb_memory_allocated());
    /* and it still works afterwards */
    t = nb_ones(NB_F32, NB_SHAPE(MiB / 4));
    ck_assert_msg(t != NULL, "%s", nb_last_error());
    ck_assert_int_ge(nb_memory_allocated() - before, MiB);
    ck_assert(((float *)nb_data(t))[MiB / 4 - 1] == 1.0f);
    nb_free(t);
    ck_assert_int_eq(nb_memory_allocated(), before);
    nb_empty_cache();
    ck_assert_int_eq(nb_memory_cached(), 0);
}
END_TEST

/* ------------------------------------------------------------- creation */
static void creation(snapshot *s, void *ctx) {
    (void)ctx;
    snap(s, "randn f32 flat", randn_t(NB_F32, 1, NB_SHAPE(N1)));
    snap(s, "randn f64 2-d", randn_t(NB_F64, 2, NB_SHAPE(R, C)));
    snap(s, "rand f32 flat", rand_t(NB_F32, 3, 0.0, NB_SHAPE(N1)));
    snap(s, "rand f64 flat", rand_t(NB_F64, 4, 0.0, NB_SHAPE(N1)));
    nb_tensor *tr = transposed(NB_F32, 5, R, C);
    snap(s, "contiguous(transposed f32)", OK(nb_contiguous(tr)));
    snap(s, "to f64 (transposed f32)", OK(nb_to(tr, NB_F64)));
    nb_tensor *dst = OK(nb_zeros(NB_F64, NB_SHAPE(R, C)));
    OK_RC(nb_copy_into(dst, OK(nb_to(randn_t(NB_F32, 6, NB_SHAPE(C)), NB_F64))));
    snap(s, "copy_into broadcast (C)->(R,C)", dst);
    snap(s, "tril_mask(C,C)", OK(nb_tril_mask(C, C)));
    snap(s, "full f32 flat", OK(nb_full(NB_F32, NB_SHAPE(N1), -0.0)));
}

START_TEST(creation_is_thread_independent) {
    expect_same_for_1_2_3_threads("randn, rand, contiguous, to, copy_into, tril", creation, NULL);
}
END_TEST

/* The registry's ops one by one (contiguous, transposed and broadcast
 * inputs, outputs and gradients): tests/test_registry.c. The cases below
 * are the kernels' own parallel structures (row tiles, reductions over
 * several dims, long softmax rows, GEMM tiles) and whole modules. */
/* ------------------------------------------------------------- reductions */
typedef struct {
    nb_tensor *x, *x64, *wide, *xt, *flat, *flat64, *pow2;
} red_inputs;

static void reductions(snapshot *s, void *ctx) {
    red_inputs *in = ctx;
    nb_tensor *xs[4] = {in->x, in->x64, in->wide, in->xt};
    const char *tag[4] = {"f32 (R,C)", "f64 (R,C)", "f32 wide (WR,WC)", "f32 transposed (R,C)"};
    char name[80];
    for (int i = 0; i < 4; i++) {
        for (int d = 0; d < 2; d++) {
            int dim = d ? 0 : -1;
            bool keep = i % 2 == 0;
            snprintf(name, sizeof name, "sum dim %d %s", dim, tag[i]);
            snap(s, name, OK(nb_sum(xs[i], dim, keep)));
            snprintf(name, sizeof name, "mean dim %d %s", dim, tag[i]);
            snap(s, name, OK(nb_mean(xs[i], dim, !keep)));
            snprintf(name, sizeof name, "max dim %d %s", dim, tag[i]);
            snap(s, name, OK(nb_max(xs[i], dim, keep)));
            snprintf(name, sizeof name, "argmax dim %d %s", dim, tag[i]);
            snap(s, name, OK(nb_argmax(xs[i], dim, keep)));
        }
    }
    snap(s, "sum_all f32 flat", OK(nb_sum_all(in->flat)));
    snap(s, "mean_all f32 flat", OK(nb_mean_all(in->flat)));
    snap(s, "sum_all f64 flat", OK(nb_sum_all(in->flat64)));
    snap(s, "mean_all f64 flat", OK(nb_mean_all(in->flat64)));
    snap(s, "sum_all f32 power of 2", OK(nb_sum_all(in->pow2)));
    snap(s, "sum_all f32 (R,C)", OK(nb_sum_all(in->x)));
    snap(s, "sum_all f32 transposed (R,C)", OK(nb_sum_all(in->xt)));
    snap(s, "mean_all f64 (R,C)", OK(nb_mean_all(in->x64)));
    snap(s, "sum dim 1 of (R,C,1)",
         OK(nb_sum(OK(nb_unsqueeze(in->x, 2)), 1, false)));
}

static void reductions_backward(snapshot *s, void *ctx) {
    red_inputs *in = ctx;
    nb_tensor *x = leaf(in->x), *w = leaf(in->wide), *f = leaf(in->flat64);
    nb_tensor *y = OK(nb_add(OK(nb_max(x, -1, true)), OK(nb_mean(x, 0, true)))); /* (R,C) */
    OK_RC(nb_backward_with_grad(y, randn_t(NB_F32, 60, NB_SHAPE(R, C))));
    snap_grad(s, "grad of max dim -1 + mean dim 0", x);
    nb_tensor *yw = OK(nb_add(OK(nb_sum(w, 0, false)), OK(nb_max(w, 0, false))));
    OK_RC(nb_backward_with_grad(yw, randn_t(NB_F32, 61, NB_SHAPE(WC))));
    snap_grad(s, "grad of sum dim 0 + max dim 0 (wide)", w);
    OK_RC(nb_backward(OK(nb_mean_all(OK(nb_mul(f, f))))));
    snap_grad(s, "grad of mean_all(f*f) f64", f);
}

START_TEST(reductions_sum_mean_max) {
    nb_scope_begin();
    red_inputs in = {randn_t(NB_F32, 70, NB_SHAPE(R, C)), randn_t(NB_F64, 71, NB_SHAPE(R, C)),
                     randn_t(NB_F32, 72, NB_SHAPE(WR, WC)), transposed(NB_F32, 73, R, C),
                     randn_t(NB_F32, 74, NB_SHAPE(N1)), randn_t(NB_F64, 75, NB_SHAPE(N1)),
                     randn_t(NB_F32, 76, NB_SHAPE(POW2))};
    expect_same_for_1_2_3_threads("sum mean max argmax (dim -1, dim 0), sum_all mean_all",
                                  reductions, &in);
    expect_same_for_1_2_3_threads("backward of max, mean, sum, mean_all", reductions_backward,
                                  &in);
    nb_scope_end();
}
END_TEST

/* --------------------------------------------- softmax, masked_fill, dropout */

typedef struct {
    nb_tensor *s, *s64, *causal, *pad, *g;
} sm_inputs;

static void softmaxes(snapshot *s, void *ctx) {
    sm_inputs *in = ctx;
    snap(s, "softmax (B,H,L,L) dim -1", OK(nb_softmax(in->s, -1)));
    snap(s, "log_softmax (B,H,L,L) dim -1", OK(nb_log_softmax(in->s, -1)));
    nb_tensor *st = OK(nb_transpose(in->s, -1, -2));
    snap(s, "softmax of transposed view dim -1", OK(nb_softmax(st, -1)));
    snap(s, "log_softmax of transposed view dim -1", OK(nb_log_softmax(st, -1)));
    snap(s, "softmax (B,H,L,L) dim 2", OK(nb_softmax(in->s, 2)));
    snap(s, "f64 softmax dim -1", OK(nb_softmax(in->s64, -1)));
    snap(s, "f64 log_softmax dim -1", OK(nb_log_softmax(in->s64, -1)));
}

static void masked(snapshot *s, void *ctx) {
    sm_inputs *in = ctx;
    nb_tensor *fill = OK(nb_logical_not(in->causal)); /* (L, L) broadcast */
    nb_tensor *m = OK(nb_masked_fill(in->s, fill, -INFINITY));
    snap(s, "masked_fill(s, !causal (L,L), -inf)", m);
    snap(s, "softmax(masked) dim -1", OK(nb_softmax(m, -1)));
    snap(s, "log_softmax(masked) dim -1", OK(nb_log_softmax(m, -1)));
    snap(s, "masked_fill(s, pad (B,1,1,L), 0.5)", OK(nb_masked_fill(in->s, in->pad, 0.5)));
    snap(s, "masked_fill(transposed, !causal, -1e9)",
         OK(nb_masked_fill(OK(nb_transpose(in->s, -1, -2)), fill, -1e9)));
    /* backward of masked_fill + softmax / log_softmax */
    nb_tensor *x = leaf(in->s);
    nb_tensor *p = OK(nb_softmax(OK(nb_masked_fill(x, fill, -INFINITY)), -1));
    OK_RC(nb_backward_with_grad(p, in->g));
    snap_grad(s, "grad of softmax(masked_fill(x))", x);
    nb_tensor *x2 = leaf(in->s);
    nb_tensor *lp = OK(nb_log_softmax(OK(nb_transpose(x2, -1, -2)), -1));
    OK_RC(nb_backward_with_grad(lp, in->g));
    snap_grad(s, "grad of log_softmax(transposed x)", x2);
    nb_tensor *x64 = leaf(in->s64);
    nb_tensor *p64 = OK(nb_softmax(OK(nb_masked_fill(x64, fill, -INFINITY)), -1));
    OK_RC(nb_backward(OK(nb_sum_all(OK(nb_mul(p64, x64))))));
    snap_grad(s, "f64 grad of sum(softmax(masked_fill(x)) * x)", x64);
}

START_TEST(softmax_and_masked_fill) {
    nb_scope_begin();
    sm_inputs in;
    in.s = OK(nb_mul_scalar(randn_t(NB_F32, 80, NB_SHAPE(B, H, L, L)), 3.0));
    in.s64 = OK(nb_mul_scalar(randn_t(NB_F64, 81, NB_SHAPE(B64, H64, L, L)), 3.0));
    in.causal = OK(nb_tril_mask(L, L));
    /* padding: key positions after each sequence's last one (L-1, L-57, 0, 30) */
    int64_t lastv[4] = {L - 1, L - 57, 0, 30};
    nb_tensor *last = OK(nb_from_data(NB_I64, NB_SHAPE(B, 1, 1, 1), lastv));
    in.pad = OK(nb_gt(OK(nb_view(OK(nb_arange(NB_I64, L)), NB_SHAPE(1, 1, 1, L))), last));
    in.g = randn_t(NB_F32, 82, NB_SHAPE(B, H, L, L));
    expect_same_for_1_2_3_threads("softmax log_softmax (B,H,L,L), transposed, f64", softmaxes,
                                  &in);
    expect_same_for_1_2_3_threads("masked_fill causal/padding + softmax (+ backward)", masked,
                                  &in);
    nb_scope_end();
}
END_TEST

typedef struct {
    nb_tensor *x, *xt, *x64, *g, *g64;
} do_inputs;

static void dropouts(snapshot *s, void *ctx) {
    do_inputs *in = ctx;
    nb_rng r;
    nb_rng_seed(&r, 1234);
    nb_tensor *x = leaf(in->x), *xt = leaf(in->xt), *x64 = leaf(in->x64);
    nb_tensor *y = OK(nb_dropout(x, 0.1, true, &r));
    nb_tensor *yt = OK(nb_dropout(OK(nb_transpose(xt, -1, -2)), 0.1, true, &r));
    nb_tensor *y64 = OK(nb_dropout(x64, 0.1, true, &r));
    snap_rng(s, "rng state after three dropouts", &r);
    snap(s, "dropout p=0.1 f32 (B,H,L,L)", y);
    snap(s, "dropout p=0.1 f32 transposed view", yt);
    snap(s, "dropout p=0.1 f64 flat", y64);
    OK_RC(nb_backward_with_grad(y, in->g));
    OK_RC(nb_backward_with_grad(yt, in->g));
    OK_RC(nb_backward_with_grad(y64, in->g64));
    snap_grad(s, "dropout backward f32", x);
    snap_grad(s, "dropout backward f32 transposed", xt);
    snap_grad(s, "dropout backward f64", x64);
}

START_TEST(dropout_forward_backward) {
    nb_scope_begin();
    do_inputs in = {randn_t(NB_F32, 90, NB_SHAPE(B, H, L, L)),
                    randn_t(NB_F32, 91, NB_SHAPE(B, H, L, L)), randn_t(NB_F64, 92, NB_SHAPE(N1)),
                    randn_t(NB_F32, 93, NB_SHAPE(B, H, L, L)), randn_t(NB_F64, 94, NB_SHAPE(N1))};
    expect_same_for_1_2_3_threads("dropout p=0.1 seeded (f32, f64, strided) + backward",
                                  dropouts, &in);
    nb_scope_end();
}
END_TEST

/* ---------------------------------------------------------------- matmul */

typedef struct {
    nb_tensor *a, *b, *bt, *a64, *b64, *ba, *bb, *bbt_base, *bbt, *ba64, *bb64, *bbt64, *shared;
    nb_tensor *v, *g;
} mm_inputs;

static void matmuls(snapshot *s, void *ctx) {
    mm_inputs *in = ctx;
    snap(s, "f32 (M,M) x (M,M)", OK(nb_matmul(in->a, in->b)));
    snap(s, "f32 (M,M) x transposed view", OK(nb_matmul(in->a, in->bt)));
    snap(s, "f32 transposed view x (M,M)", OK(nb_matmul(in->bt, in->a)));
    snap(s, "f64 (M,M) x (M,M)", OK(nb_matmul(in->a64, in->b64)));
    snap(s, "f64 (M,M) x transposed view",
         OK(nb_matmul(in->a64, OK(nb_transpose(in->b64, 0, 1)))));
    snap(s, "f32 (M,M) x (M)", OK(nb_matmul(in->a, in->v)));
    snap(s, "f32 batched a b", OK(nb_matmul(in->ba, in->bb)));
    snap(s, "f32 batched a x transposed view", OK(nb_matmul(in->ba, in->bbt)));
    snap(s, "f32 batched a x (K,N) broadcast", OK(nb_matmul(in->ba, in->shared)));
    snap(s, "f64 batched a b", OK(nb_matmul(in->ba64, in->bb64)));
    snap(s, "f64 batched a x transposed view", OK(nb_matmul(in->ba64, in->bbt64)));
    snap(s, "f64 batched a x its own transpose",
         OK(nb_matmul(in->ba64, OK(nb_transpose(in->ba64, -1, -2)))));
}

static void matmul_backward(snapshot *s, void *ctx) {
    mm_inputs *in = ctx;
    nb_tensor *a = leaf(in->ba), *b = leaf(in->bb);
    nb_tensor *y = OK(nb_matmul(a, b));
    OK_RC(nb_backward_with_grad(y, in->g));
    snap(s, "y = a b batched", y);
    snap_grad(s, "grad a", a);
    snap_grad(s, "grad b", b);
    /* b read through a transposed view, plus a weight shared over the batch */
    nb_tensor *a2 = leaf(in->ba), *braw = leaf(in->bbt_base), *w = leaf(in->shared);
    nb_tensor *y2 = OK(nb_add(OK(nb_matmul(a2, OK(nb_transpose(braw, -1, -2)))),
                              OK(nb_matmul(a2, w))));
    OK_RC(nb_backward_with_grad(y2, in->g));
    snap(s, "y2 = a b^T + a w", y2);
    snap_grad(s, "grad a (through b^T view and shared w)", a2);
    snap_grad(s, "grad of the transposed b", braw);
    snap_grad(s, "grad of w (K,N) shared over the batch", w);
}

START_TEST(matmul_square_batched_transposed) {
    nb_scope_begin();
    mm_inputs in;
    in.a = randn_t(NB_F32, 100, NB_SHAPE(M, M));
    in.b = randn_t(NB_F32, 101, NB_SHAPE(M, M));
    in.bt = transposed(NB_F32, 102, M, M);
    in.a64 = randn_t(NB_F64, 103, NB_SHAPE(M, M));
    in.b64 = randn_t(NB_F64, 104, NB_SHAPE(M, M));
    in.v = randn_t(NB_F32, 105, NB_SHAPE(M));
    in.ba = randn_t(NB_F32, 106, NB_SHAPE(MB0, MB1, MM, MK));
    in.bb = randn_t(NB_F32, 107, NB_SHAPE(MB0, MB1, MK, MN));
    in.bbt_base = randn_t(NB_F32, 108, NB_SHAPE(MB0, MB1, MM, MK));
    in.bbt = OK(nb_transpose(in.bbt_base, -1, -2));
    in.ba64 = randn_t(NB_F64, 109, NB_SHAPE(MB0, MB1, MM, MK));
    in.bb64 = randn_t(NB_F64, 110, NB_SHAPE(MB0, MB1, MK, MN));
    in.shared = randn_t(NB_F32, 111, NB_SHAPE(MK, MN));
    in.g = randn_t(NB_F32, 112, NB_SHAPE(MB0, MB1, MM, MN));
    in.bbt64 = OK(nb_transpose(randn_t(NB_F64, 113, NB_SHAPE(MB0, MB1, MM, MK)), -1, -2));
    expect_same_for_1_2_3_threads("matmul square, batched, transposed views, f32/f64", matmuls,
                                  &in);
    expect_same_for_1_2_3_threads("batched matmul backward (strided b, shared w)",
                                  matmul_backward, &in);
    nb_scope_end();
}
END_TEST

/* -------------------------------------------------------------------- nn */
typedef struct {
    nb_tensor *x, *w, *b, *g, *x64, *w64, *b64, *g64;
} ln_inputs;

static void layer_norms(snapshot *s, void *ctx) {
    ln_inputs *in = ctx;
    nb_tensor *x = leaf(in->x), *w = leaf(in->w), *b = leaf(in->b);
    nb_tensor *y = OK(nb_layer_norm(x, w, b, 1e-5));
    OK_RC(nb_backward_with_grad(y, in->g));
    snap(s, "layer_norm f32 (R,C)", y);
    snap_grad(s, "grad x", x);
    snap_grad(s, "grad weight (summed over rows)", w);
    snap_grad(s, "grad bias", b);
    nb_tensor *x64 = leaf(in->x64), *w64 = leaf(in->w64), *b64 = leaf(in->b64);
    nb_tensor *xt = OK(nb_transpose(x64, 0, 1)); /* (LNC,LNR,LND) read through strides */
    nb_tensor *y64 = OK(nb_layer_norm(xt, w64, b64, 1e-6));
    OK_RC(nb_backward_with_grad(y64, in->g64));
    snap(s, "layer_norm f64 of a transposed view", y64);
    snap_grad(s, "f64 grad x", x64);
    snap_grad(s, "f64 grad weight", w64);
    snap_grad(s, "f64 grad bias", b64);
}

START_TEST(layer_norm_forward_backward) {
    nb_scope_begin();
    ln_inputs in = {OK(nb_add_scalar(randn_t(NB_F32, 120, NB_SHAPE(R, C)), 0.7)),
                    rand_t(NB_F32, 121, 0.5, NB_SHAPE(C)), randn_t(NB_F32, 122, NB_SHAPE(C)),
                    randn_t(NB_F32, 123, NB_SHAPE(R, C)),
                    randn_t(NB_F64, 124, NB_SHAPE(LNR, LNC, LND)),
                    rand_t(NB_F64, 125, 0.5, NB_SHAPE(LND)), randn_t(NB_F64, 126, NB_SHAPE(LND)),
                    randn_t(NB_F64, 127, NB_SHAPE(LNC, LNR, LND))};
    expect_same_for_1_2_3_threads("layer_norm forward + backward (f32, f64 strided)",
                                  layer_norms, &in);
    nb_scope_end();
}
END_TEST

typedef struct {
    nb_tensor *q, *k, *v, *causal, *g, *q64, *k64, *v64, *g64;
} at_inputs;

static void attentions(snapshot *s, void *ctx) {
    at_inputs *in = ctx;
    nb_rng r;
    nb_rng_seed(&r, 4321);
    nb_tensor *q = leaf(in->q), *k = leaf(in->k), *v = leaf(in->v), *w = NULL;
    nb_tensor *out = OK(nb_attention(q, k, v, in->causal, 0.1, true, &r, &w));
    snap(s, "attention out (AB,AH,AL,AD)", out);
    snap(s, "attention weights after dropout", w);
    OK_RC(nb_backward_with_grad(out, in->g));
    snap_grad(s, "grad q", q);
    snap_grad(s, "grad k", k);
    snap_grad(s, "grad v", v);
    /* f64, k and v given as transposed views (B, L, H, D) -> (B, H, L, D) */
    nb_tensor *q64 = leaf(in->q64), *k64 = leaf(in->k64), *v64 = leaf(in->v64);
    nb_tensor *o64 = OK(nb_attention(q64, OK(nb_transpose(k64, 1, 2)), OK(nb_transpose(v64, 1, 2)),
                                     in->causal, 0.1, true, &r, NULL));
    snap(s, "f64 attention out, strided k v", o64);
    OK_RC(nb_backward_with_grad(o64, in->g64));
    snap_grad(s, "f64 grad q", q64);
    snap_grad(s, "f64 grad k", k64);
    snap_grad(s, "f64 grad v", v64);
    snap_rng(s, "rng state", &r);
}

START_TEST(attention_forward_backward) {
    nb_scope_begin();
    at_inputs in = {randn_t(NB_F32, 130, NB_SHAPE(AB, AH, AL, AD)),
                    randn_t(NB_F32, 131, NB_SHAPE(AB, AH, AL, AD)),
                    randn_t(NB_F32, 132, NB_SHAPE(AB, AH, AL, AD)), OK(nb_tril_mask(AL, AL)),
                    randn_t(NB_F32, 133, NB_SHAPE(AB, AH, AL, AD)),
                    randn_t(NB_F64, 134, NB_SHAPE(AB, 2, AL, AD / 2)),
                    randn_t(NB_F64, 135, NB_SHAPE(AB, AL, 2, AD / 2)),
                    randn_t(NB_F64, 136, NB_SHAPE(AB, AL, 2, AD / 2)),
                    randn_t(NB_F64, 137, NB_SHAPE(AB, 2, AL, AD / 2))};
    expect_same_for_1_2_3_threads("attention causal + dropout 0.1, forward + backward",
                                  attentions, &in);
    nb_scope_end();
}
END_TEST

/* ------------------------------------------- a small transformer, trained */
enum { VOCAB = 11, SEQ = 10, STEPS = 3 };

/* (n, SEQ) i64 as examples/copy_task.c: 1 first, then uniform over 1..10 */
static nb_tensor *random_sequences(int64_t n, nb_rng *rng) {
    nb_tensor *u = OK(nb_rand(NB_F64, NB_SHAPE(n, SEQ), rng));
    nb_tensor *s = OK(nb_empty(NB_I64, NB_SHAPE(n, SEQ)));
    const double *pu = nb_data(u);
    int64_t *ps = nb_data(s);
    for (int64_t i = 0; i < n * SEQ; i++)
        ps[i] = i % SEQ == 0 ? 1 : 1 + (int64_t)(pu[i] * (VOCAB - 1));
    return s;
}

static nb_tensor *padding_keep(nb_tensor *tokens) {
    nb_tensor *k = OK(nb_ne(tokens, OK(nb_full(NB_I64, 0, NULL, 0))));
    return OK(nb_view(k, NB_SHAPE(nb_shape(tokens)[0], 1, 1, nb_shape(tokens)[1])));
}

static void transformer_training(snapshot *s, void *ctx) {
    (void)ctx;
    nb_rng init, data, drop;
    nb_rng_seed(&init, 1);
    nb_rng_seed(&data, 1001);
    nb_rng_seed(&drop, 2001);
    nb_params *ps = nb_params_new();
    ck_assert_ptr_nonnull(ps);
    nb_Transformer m;
    nb_TransformerConfig cfg = {.src_vocab = VOCAB, .tgt_vocab = VOCAB, .d_model = 32,
                                .d_ff = 64, .heads = 4, .layers = 2, .max_len = 64,
                                .dropout = 0.1};
    OK_RC(nb_transformer_init(&m, ps, &cfg, &init));
    nb_optim *opt = nb_adam(ps, 0.0, 0.9, 0.98, 1e-9, 0.0);
    ck_assert_ptr_nonnull(opt);
    char name[96];
    for (int step = 0; step < STEPS; step++) {
        nb_optim_set_lr(opt, nb_noam_rate(step, cfg.d_model, 1.0, 200));
        nb_scope_begin();
        nb_tensor *seq = random_sequences(BATCH, &data);
        nb_tensor *tgt_in = OK(nb_narrow(seq, 1, 0, SEQ - 1));
        nb_tensor *tgt_y = OK(nb_narrow(seq, 1, 1, SEQ - 1));
        nb_tensor *src_keep = padding_keep(seq);
        nb_tensor *tgt_keep = OK(nb_where(padding_keep(tgt_in), OK(nb_tril_mask(SEQ - 1, SEQ - 1)),
                                          OK(nb_full(NB_BOOL, 0, NULL, 0))));
        nb_tensor *memory = OK(nb_transformer_encode(&m, seq, src_keep, true, &drop));
        nb_tensor *out = OK(nb_transformer_decode(&m, memory, src_keep, tgt_in, tgt_keep, true,
                                                  &drop));
        nb_tensor *logits = OK(nb_reshape(OK(nb_transformer_logits(&m, out)),
                                          NB_SHAPE(-1, VOCAB)));
        nb_tensor *loss = OK(nb_cross_entropy(logits, OK(nb_reshape(tgt_y, NB_SHAPE(-1))), 0,
                                              0.0));
        OK_RC(nb_backward(loss));
        if (step == STEPS - 1) {
            /* the gradients of the last step, before the update */
            for (int i = 0; i < nb_params_count(ps); i++) {
                const char *pn;
                nb_tensor *p = nb_params_at(ps, i, &pn);
                snprintf(name, sizeof name, "grad %s", pn);
                snap_grad(s, name, p);
            }
        }
        nb_optim_step(opt);
        nb_optim_zero_grad(opt);
        snprintf(name, sizeof name, "loss of step %d", step);
        snap(s, name, loss);
        nb_scope_end();
    }
    for (int i = 0; i < nb_params_count(ps); i++) {
        const char *pn;
        nb_tensor *p = nb_params_at(ps, i, &pn);
        snap(s, pn, p);
    }
    snap_rng(s, "dropout rng state", &drop);
    nb_optim_free(opt);
    nb_transformer_free(&m);
    nb_params_free(ps);
}

START_TEST(transformer_training_steps) {
    expect_same_for_1_2_3_threads("transformer d_model 32: 3 Adam steps, params and loss",
                                  transformer_training, NULL);
}
END_TEST

/* ------------------------------------------------------------ optimizers */
typedef struct {
    nb_tensor *p32, *p64, *g32, *g64;
} opt_inputs;

/* Registers copies of the two parameters, then three steps of: loss =
 * sum(p * p * g) (gradient 2 p g), clip_grad_norm, step. */
static void optimizer_run(snapshot *s, opt_inputs *in, int kind, const char *tag) {
    nb_params *ps = nb_params_new();
    ck_assert_ptr_nonnull(ps);
    /* the registry shares the storage it is given and steps update it in
     * place: give it copies, so every run starts from the same values */
    nb_tensor *p32 = OK(nb_params_add(ps, "p32", copy_of(in->p32)));
    nb_tensor *p64 = OK(nb_params_add(ps, "p64", copy_of(in->p64)));
    nb_optim *opt = kind == 0   ? nb_adam(ps, 1e-2, 0.9, 0.98, 1e-9, 0.01)
                    : kind == 1 ? nb_adamw(ps, 1e-2, 0.9, 0.999, 1e-8, 0.1)
                                : nb_sgd(ps, 0.05, 0.9, 1e-4);
    ck_assert_ptr_nonnull(opt);
    char name[96];
    for (int step = 0; step < 3; step++) {
        nb_scope_begin();
        nb_tensor *l32 = OK(nb_sum_all(OK(nb_mul(OK(nb_mul(p32, p32)), in->g32))));
        nb_tensor *l64 = OK(nb_sum_all(OK(nb_mul(OK(nb_mul(p64, p64)), in->g64))));
        OK_RC(nb_backward(l32));
        OK_RC(nb_backward(l64));
        double norm = nb_clip_grad_norm(ps, 50.0);
        ck_assert_msg(norm >= 0, "%s", nb_last_error());
        snprintf(name, sizeof name, "%s: clip_grad_norm total of step %d", tag, step);
        snap_values(s, name, NB_F64, &norm, 1);
        nb_optim_step(opt);
        nb_optim_zero_grad(opt);
        nb_scope_end();
    }
    snprintf(name, sizeof name, "%s: f32 parameter after 3 steps", tag);
    snap(s, name, p32);
    snprintf(name, sizeof name, "%s: f64 parameter after 3 steps", tag);
    snap(s, name, p64);
    nb_optim_free(opt);
    nb_params_free(ps);
}

static void optimizers(snapshot *s, void *ctx) {
    optimizer_run(s, ctx, 0, "adam");
    optimizer_run(s, ctx, 1, "adamw");
    optimizer_run(s, ctx, 2, "sgd momentum");
}

START_TEST(optimizer_steps) {
    nb_scope_begin();
    opt_inputs in = {randn_t(NB_F32, 140, NB_SHAPE(ON)), randn_t(NB_F64, 141, NB_SHAPE(OR, C)),
                     randn_t(NB_F32, 142, NB_SHAPE(ON)), randn_t(NB_F64, 143, NB_SHAPE(OR, C))};
    expect_same_for_1_2_3_threads("adam adamw sgd steps + clip_grad_norm (big params)",
                                  optimizers, &in);
    nb_scope_end();
}
END_TEST

/* ------------------------------------------------------ the pool itself */
typedef struct {
    int64_t n, grain;
    unsigned char *mark;
    _Atomic int64_t ranges, short_ranges, bad, nested_ok;
} pf_ctx;

static void pf_inner(void *ctx, int64_t lo, int64_t hi) {
    _Atomic int64_t *sum = ctx;
    for (int64_t i = lo; i < hi; i++) atomic_fetch_add(sum, i);
}

static void pf_fn(void *ctx, int64_t lo, int64_t hi) {
    pf_ctx *c = ctx;
    atomic_fetch_add(&c->ranges, 1);
    if (lo < 0 || hi > c->n || lo >= hi) {
        atomic_fetch_add(&c->bad, 1);
        return;
    }
    if (hi - lo < c->grain && hi != c->n) atomic_fetch_add(&c->short_ranges, 1);
    for (int64_t i = lo; i < hi; i++) c->mark[i]++;
    /* a call from inside fn runs (serially) and still covers its range */
    _Atomic int64_t sum = 0;
    nb_parallel_for(1000, 10, pf_inner, &sum);
    if (atomic_load(&sum) == 999 * 1000 / 2) atomic_fetch_add(&c->nested_ok, 1);
}

START_TEST(parallel_for_covers_every_item_once) {
    int orig = nb_num_threads();
    const int64_t ns[4] = {1000003, 100, 17, 1};
    const int64_t grains[4] = {1000, 1, 16, 1};
    for (int t = 0; t < 3; t++) {
        nb_set_num_threads(COUNTS[t]);
        for (int k = 0; k < 4; k++) {
            pf_ctx c = {.n = ns[k], .grain = grains[k], .mark = calloc((size_t)ns[k], 1)};
            ck_assert_ptr_nonnull(c.mark);
            nb_parallel_for(c.n, c.grain, pf_fn, &c);
            int64_t wrong = -1;
            for (int64_t i = 0; i < c.n && wrong < 0; i++)
                if (c.mark[i] != 1) wrong = i;
            int mark = wrong >= 0 ? c.mark[wrong] : 1;
            free(c.mark);
            int64_t ranges = atomic_load(&c.ranges);
            nb_set_num_threads(orig);
            ck_assert_msg(wrong < 0, "nb_parallel_for(%lld, grain %lld), %d threads: item %lld "
                          "was done %d times", (long long)ns[k], (long long)grains[k],
                          COUNTS[t], (long long)wrong, mark);
            ck_assert_msg(atomic_load(&c.bad) == 0 && atomic_load(&c.short_ranges) == 0,
                          "nb_parallel_for(%lld, grain %lld), %d threads: %lld ranges out of "
                          "bounds, %lld shorter than the grain", (long long)ns[k],
                          (long long)grains[k], COUNTS[t], (long long)atomic_load(&c.bad),
                          (long long)atomic_load(&c.short_ranges));
            ck_assert_int_eq(atomic_load(&c.nested_ok), ranges);
            if (COUNTS[t] == 1) ck_assert_int_eq(ranges, 1);
            nb_set_num_threads(COUNTS[t]);
        }
    }
    nb_parallel_for(0, 1, pf_fn, NULL); /* nothing to do: fn is not called */
    nb_clear_error();
    nb_parallel_for(10, 1, NULL, NULL);
    ck_assert_ptr_nonnull(nb_last_error());
    ck_assert_msg(strstr(nb_last_error(), "nb_parallel_for: fn is NULL") != NULL, "got: %s",
                  nb_last_error());
    nb_clear_error();
    nb_set_num_threads(orig);
    ck_assert_int_eq(nb_num_threads(), orig);
}
END_TEST

/* Two user threads computing at once (each with its own scope) while the
 * pool is set to 3 threads: one gets the pool, the other runs serially, and
 * both get the 1-thread bytes. */
typedef struct {
    nb_tensor *x, *a, *b;
    snapshot out;
    char error[256];
} user_job;

static void user_compute(snapshot *s, user_job *j) {
    snap(s, "softmax", OK(nb_softmax(j->x, -1)));
    snap(s, "matmul", OK(nb_matmul(j->a, j->b)));
    snap(s, "sum dim 0", OK(nb_sum(j->x, 0, false)));
    snap(s, "gelu", OK(nb_gelu(j->x)));
}

static void *user_thread(void *arg) {
    user_job *j = arg;
    nb_scope_begin();
    /* no ck_assert off the main thread: record the first error instead */
    nb_tensor *r[4] = {nb_softmax(j->x, -1), nb_matmul(j->a, j->b), nb_sum(j->x, 0, false),
                       nb_gelu(j->x)};
    const char *names[4] = {"softmax", "matmul", "sum dim 0", "gelu"};
    for (int i = 0; i < 4; i++) {
        nb_tensor *c = r[i] ? nb_contiguous(r[i]) : NULL;
        if (!c) {
            snprintf(j->error, sizeof j->error, "%s failed on a user thread: %s", names[i],
                     nb_last_error() ? nb_last_error() : "(no error set)");
            break;
        }
        int k = j->out.n++;
        snprintf(j->out.name[k], sizeof j->out.name[k], "%s", names[i]);
        j->out.kind[k] = nb_dtype_of(c);
        j->out.ndim[k] = nb_ndim(c);
        for (int d = 0; d < nb_ndim(c); d++) j->out.shape[k][d] = nb_shape(c)[d];
        j->out.nbytes[k] = (size_t)nb_numel(c) * elem_size(j->out.kind[k]);
        j->out.bytes[k] = malloc(j->out.nbytes[k]);
        if (j->out.bytes[k]) memcpy(j->out.bytes[k], nb_data(c), j->out.nbytes[k]);
    }
    nb_scope_end();
    return NULL;
}

START_TEST(concurrent_user_threads) {
    int orig = nb_num_threads();
    nb_scope_begin();
    user_job ref = {.x = randn_t(NB_F32, 150, NB_SHAPE(R, C)),
                    .a = randn_t(NB_F32, 151, NB_SHAPE(M, M)),
                    .b = randn_t(NB_F32, 152, NB_SHAPE(M, M))};
    nb_set_num_threads(1);
    cur_threads = 1;
    user_compute(&ref.out, &ref);
    nb_set_num_threads(3);
    enum { NU = 3 };
    user_job *jobs = calloc(NU, sizeof *jobs);
    pthread_t th[NU];
    for (int i = 0; i < NU; i++) {
        jobs[i].x = ref.x;
        jobs[i].a = ref.a;
        jobs[i].b = ref.b;
        ck_assert_int_eq(pthread_create(&th[i], NULL, user_thread, &jobs[i]), 0);
    }
    for (int i = 0; i < NU; i++) pthread_join(th[i], NULL);
    nb_set_num_threads(orig);
    cur_threads = orig;
    char msg[4096] = "";
    for (int i = 0; i < NU && !msg[0]; i++) {
        if (jobs[i].error[0]) snprintf(msg, sizeof msg, "user thread %d: %s", i, jobs[i].error);
        else describe_diff(msg, sizeof msg, "concurrent user thread", &ref.out, &jobs[i].out, 3);
    }
    for (int i = 0; i < NU; i++) snap_free(&jobs[i].out);
    free(jobs);
    snap_free(&ref.out);
    nb_scope_end();
    ck_assert_msg(!msg[0], "%s", msg);
}
END_TEST

Suite *suite_threads(void) {
    choose_sizes();
    if (reduced)
        printf("threads: under valgrind or NB_TEST_REDUCED=1, reduced sizes (NB_SLOW_TESTS=1 for "
               "the full ones)\n");
    Suite *s = suite_create("threads");
    TCase *tc = tcase_create("harness");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, harness_detects_differences);
    tcase_add_test(tc, num_threads_api);
    tcase_add_test(tc, memory_stats);
    tcase_add_test(tc, parallel_for_covers_every_item_once);
    tcase_add_test(tc, concurrent_user_threads);
    suite_add_tcase(s, tc);
    tc = tcase_create("identical");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, creation_is_thread_independent);
    tcase_add_test(tc, reductions_sum_mean_max);
    tcase_add_test(tc, softmax_and_masked_fill);
    tcase_add_test(tc, dropout_forward_backward);
    tcase_add_test(tc, matmul_square_batched_transposed);
    tcase_add_test(tc, layer_norm_forward_backward);
    tcase_add_test(tc, attention_forward_backward);
    tcase_add_test(tc, optimizer_steps);
    tcase_add_test(tc, transformer_training_steps);
    suite_add_tcase(s, tc);
    return s;
}
