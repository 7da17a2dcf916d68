/* test_soak.c: long training loops stay flat in memory, and errors in the
 * middle of a step are reported, skipped and leave nothing behind.
 *
 * The model is small but goes through the whole attention path: an input
 * projection, a pre-norm causal nb_MHA block (views and transposes for the
 * heads, masked_fill, softmax, dropout in training mode), a reshape to rows,
 * a mixing matmul with GELU and dropout, and a linear head to 4 classes,
 * trained with Adam and nb_clip_grad_norm on a cross-entropy loss. Each step
 * draws a fresh batch from an nb_rng; the class of a token is the argmax of
 * (x_t + mean of x_0..x_t) through a fixed random teacher matrix, which the
 * causal attention can learn. Every step runs inside nb_scope_begin/end.
 *
 * soak: 10,000 steps (300, with a batch of 4, under valgrind, seen through
 * LD_PRELOAD as in test_threads.c; NB_SLOW_TESTS=1 keeps the full run). RSS
 * from /proc/self/statm is sampled every 1% of the steps; after a warm-up of
 * the first 10% (the buffer cache and the per-thread free lists fill up
 * then) it may not grow by 1 MiB or more (not checked under valgrind, whose
 * RSS says nothing about ours). After every step's scope the live tensor
 * count and nb_memory_allocated() must equal exactly their values after the
 * first step, warm-up or not: the grads exist from the first backward on,
 * Adam's state from nb_adam, and nothing else survives a step. The loss must
 * drop.
 *
 * errors: 1,000 steps (200 under valgrind); in 10 of them (every 10% of the
 * run, half a period in) the forward pass goes wrong halfway, after the
 * attention block: alternately a matmul with the head's weight instead of
 * the mixing one (an un-transposed (C, D) weight: mismatched inner dim) and
 * a reshape to a shape of the wrong element count. The rest of the forward
 * pass and nb_backward then get NULL and keep that first message, which must
 * be exactly the failing op's; the loop skips clipping and the optimizer
 * step and goes on. A skipped step must leave the parameters bitwise as they
 * were and Adam's step counts unchanged (nb_optim_step on the zeroed grads
 * would still move them through the momentum, so skipping is what keeps
 * them), the grads zero (zeroed at the start of the step, nothing
 * accumulated), and the memory counters at their baseline.
 *
 * Each of these checks was seen to fail on a deliberately broken copy: a
 * tensor nb_keep'ed out of every step, failed steps leaving their scope
 * open, 1 KiB malloc'ed and never freed per step (only RSS sees that one),
 * nb_optim_step called on failed steps, zero_grad skipped on them. */
#include "test_util.h"

#include <stdbool.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define L 16     /* sequence length */
#define IN 8     /* input features */
#define D 16     /* d_model */
#define HEADS 2
#define C 4      /* classes */
#define P_DROP 0.1
#define LR 3e-3

static bool reduced; /* under valgrind: fewer steps, a smaller batch, no RSS bound */

static int B = 16;   /* batch (4 under valgrind) */

static void choose_sizes(void) {
    const char *pre = getenv("LD_PRELOAD"), *slow = getenv("NB_SLOW_TESTS");
    reduced = pre && strstr(pre, "vgpreload") && !(slow && slow[0] && strcmp(slow, "0") != 0);
    if (reduced) B = 4;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Resident set size in bytes, from /proc/self/statm (resident pages). */
static int64_t rss_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    ck_assert_msg(f != NULL, "cannot open /proc/self/statm");
    long size = 0, resident = 0;
    int got = fscanf(f, "%ld %ld", &size, &resident);
    fclose(f);
    ck_assert_int_eq(got, 2);
    return (int64_t)resident * (int64_t)sysconf(_SC_PAGESIZE);
}

#define OK(t) ok_at(__LINE__, #t, (t))
static nb_tensor *ok_at(int line, const char *what, nb_tensor *t) {
    ck_assert_msg(t != NULL, "test_soak.c:%d: %s failed: %s", line, what,
                  nb_last_error() ? nb_last_error() : "(no error set)");
    return t;
}
#define OK_RC(rc) ck_assert_msg((rc) == 0, "test_soak.c:%d: %s failed: %s", __LINE__, #rc, \
                                nb_last_error() ? nb_last_error() : "(no error set)")

/* ------------------------------------------------------------------ model */
typedef struct {
    nb_params *ps;
    nb_Linear in_proj, head;
    nb_LayerNorm ln1, ln2;
    nb_MHA attn;
    nb_tensor *w_mix;   /* (D, D), used as x @ w_mix */
    nb_tensor *teacher; /* (IN, C) persistent, makes the targets */
    nb_tensor *prefix;  /* (L, L) persistent: row t averages positions 0..t */
    nb_tensor *keep;    /* (L, L) persistent causal keep-mask */
    nb_optim *opt;
    nb_rng init_rng, data_rng, drop_rng;
    nb_dtype saved_dtype;
} model;

static void model_init(model *m, uint64_t seed) {
    memset(m, 0, sizeof *m);
    m->saved_dtype = nb_default_dtype();
    nb_set_default_dtype(NB_F32);
    nb_set_grad_enabled(true);
    nb_rng_seed(&m->init_rng, seed);
    nb_rng_seed(&m->data_rng, seed + 1);
    nb_rng_seed(&m->drop_rng, seed + 2);
    m->ps = nb_params_new();
    ck_assert_ptr_nonnull(m->ps);
    OK_RC(nb_linear_init(&m->in_proj, m->ps, "in_proj", IN, D, true, &m->init_rng));
    OK_RC(nb_layernorm_init(&m->ln1, m->ps, "ln1", D, 1e-5));
    OK_RC(nb_mha_init(&m->attn, m->ps, "attn", D, HEADS, P_DROP, true, &m->init_rng));
    OK_RC(nb_layernorm_init(&m->ln2, m->ps, "ln2", D, 1e-5));
    nb_scope_begin();
    m->w_mix = OK(nb_params_add(
        m->ps, "mix.weight",
        OK(nb_mul_scalar(nb_randn(NB_F32, NB_SHAPE(D, D), &m->init_rng), 1.0 / sqrt(D)))));
    nb_scope_end();
    OK_RC(nb_linear_init(&m->head, m->ps, "head", D, C, true, &m->init_rng));

    /* persistent constants (no scope is open) */
    ck_assert_int_eq(nb_scope_depth(), 0);
    m->teacher = OK(nb_randn(NB_F32, NB_SHAPE(IN, C), &m->init_rng));
    float avg[L][L] = {{0}};
    for (int t = 0; t < L; t++)
        for (int s = 0; s <= t; s++) avg[t][s] = 1.0f / (float)(t + 1);
    m->prefix = OK(nb_from_data(NB_F32, NB_SHAPE(L, L), avg));
    m->keep = OK(nb_tril_mask(L, L));

    m->opt = nb_adam(m->ps, LR, 0.9, 0.98, 1e-9, 0.0);
    ck_assert_msg(m->opt != NULL, "%s", nb_last_error());
}

static void model_free(model *m) {
    nb_optim_free(m->opt);
    nb_params_free(m->ps);
    nb_free(m->teacher);
    nb_free(m->prefix);
    nb_free(m->keep);
    nb_set_default_dtype(m->saved_dtype);
}

/* targets (B*L) i64: argmax over classes of (x_t + mean(x_0..x_t)) @ teacher */
static nb_tensor *targets_for(model *m, nb_tensor *x) {
    nb_tensor *ctx = nb_matmul(m->prefix, x); /* (L,L) x (B,L,IN) -> (B,L,IN) */
    nb_tensor *z = nb_matmul(nb_add(x, ctx), m->teacher);
    return nb_view(nb_argmax(z, -1, false), NB_SHAPE(B * L));
}

typedef enum { FAULT_NONE, FAULT_MATMUL, FAULT_RESHAPE } fault;

/* The loss of one batch, or NULL (with the first failure's message) when a
 * fault is injected halfway: every op after the failing one gets NULL. */
static nb_tensor *forward(model *m, nb_tensor *x, nb_tensor *targets, fault f) {
    nb_tensor *h = nb_linear_forward(&m->in_proj, x); /* (B,L,D) */
    nb_tensor *n1 = nb_layernorm_forward(&m->ln1, h);
    h = nb_add(h, nb_mha_forward(&m->attn, n1, n1, n1, m->keep, true, &m->drop_rng, NULL));
    /* rows (B*L, D); the fault asks for one column too many */
    int64_t rows[2] = {B * L, f == FAULT_RESHAPE ? D + 1 : D};
    nb_tensor *h2 = nb_reshape(h, 2, rows);
    nb_tensor *n2 = nb_layernorm_forward(&m->ln2, h2);
    /* the fault: the head's (C, D) weight where the (D, D) one belongs */
    nb_tensor *mix = nb_matmul(n2, f == FAULT_MATMUL ? m->head.weight : m->w_mix);
    h2 = nb_add(h2, nb_dropout(nb_gelu(mix), P_DROP, true, &m->drop_rng));
    nb_tensor *logits = nb_linear_forward(&m->head, h2); /* (B*L, C) */
    return nb_cross_entropy(logits, targets, -1, 0.0);
}

typedef struct {
    bool ok;
    double loss;       /* when ok */
    int backward_rc;   /* when not ok: what nb_backward(NULL) returned */
    char error[1024];   /* when not ok: nb_last_error() after the skipped step */
} step_result;

/* One training step in a scope of its own: zero the grads, forward, and only
 * if backward succeeds clip and step. */
static step_result train_step(model *m, fault f) {
    step_result r = {.ok = false, .loss = NAN};
    nb_scope_begin();
    nb_optim_zero_grad(m->opt);
    nb_tensor *x = nb_randn(NB_F32, NB_SHAPE(B, L, IN), &m->data_rng);
    nb_tensor *y = targets_for(m, x);
    nb_tensor *loss = forward(m, x, y, f);
    if (loss) r.loss = nb_item(loss);
    r.backward_rc = nb_backward(loss);
    if (r.backward_rc == 0) {
        double norm = nb_clip_grad_norm(m->ps, 1.0);
        ck_assert_msg(norm >= 0 && isfinite(norm), "nb_clip_grad_norm gave %g: %s", norm,
                      nb_last_error() ? nb_last_error() : "");
        nb_optim_step(m->opt);
        r.ok = true;
    }
    nb_scope_end();
    if (!r.ok)
        snprintf(r.error, sizeof r.error, "%s", nb_last_error() ? nb_last_error() : "(none)");
    return r;
}

/* Mean loss of the first and of the last `window` of n good steps, summed as
 * they come (no per-step array: filling one would grow RSS by 8 bytes a step). */
typedef struct {
    int n, window, seen;
    double first, last, step0;
} loss_track;
static void track(loss_track *t, double loss) {
    if (t->seen == 0) t->step0 = loss;
    if (t->seen < t->window) t->first += loss / t->window;
    if (t->seen >= t->n - t->window) t->last += loss / t->window;
    t->seen++;
}

/* ------------------------------------------------------------------- soak */
START_TEST(soak_memory_is_flat) {
    const int steps = reduced ? 300 : 10000;
    const int warm = steps / 10, every = steps / 100, window = reduced ? 30 : 100;
    int64_t live_start = nb_live_tensors(), alloc_start = nb_memory_allocated();
    model m;
    model_init(&m, 2024);
    nb_clear_error();

    loss_track lt = {.n = steps, .window = window};
    int64_t live0 = 0, alloc0 = 0, rss_warm = 0, rss_max = 0, rss_last = 0;
    double t0 = now_s();
    for (int step = 0; step < steps; step++) {
        step_result r = train_step(&m, FAULT_NONE);
        ck_assert_msg(r.ok, "step %d failed: %s", step, r.error);
        ck_assert_msg(nb_last_error() == NULL, "step %d left an error: %s", step,
                      nb_last_error());
        ck_assert_msg(isfinite(r.loss), "step %d: loss %g", step, r.loss);
        track(&lt, r.loss);
        int64_t live = nb_live_tensors(), alloc = nb_memory_allocated();
        if (step == 0) {
            live0 = live;
            alloc0 = alloc;
        }
        ck_assert_msg(live == live0 && alloc == alloc0,
                      "after step %d: %lld live tensors and %lld bytes allocated, after step 0 "
                      "%lld and %lld", step, (long long)live, (long long)alloc,
                      (long long)live0, (long long)alloc0);
        if ((step + 1) % every == 0) {
            int64_t rss = rss_bytes();
            if (step + 1 == warm) rss_warm = rss_max = rss;
            else if (step + 1 > warm && rss > rss_max) rss_max = rss;
            rss_last = rss;
        }
    }
    double secs = now_s() - t0;
    double first = lt.first, last = lt.last;
    double growth = (double)(rss_last - rss_warm) / (1 << 20);
    double max_growth = (double)(rss_max - rss_warm) / (1 << 20);
    bool check_rss = !reduced && !UNDER_ASAN;
    char rss_note[160];
    snprintf(rss_note, sizeof rss_note, "RSS not checked under %s",
             UNDER_ASAN ? "AddressSanitizer" : "valgrind");
    if (check_rss)
        snprintf(rss_note, sizeof rss_note,
                 "RSS %.1f MiB after warm-up, growth %+.2f MiB (max %+.2f)",
                 (double)rss_warm / (1 << 20), growth, max_growth);
    printf("soak: %d steps in %.1f s, %s, loss %.3f -> %.3f (step 0: %.3f), live tensors %lld, "
           "%lld bytes allocated, stable\n", steps, secs, rss_note, first, last, lt.step0,
           (long long)(live0 - live_start), (long long)(alloc0 - alloc_start));
    fflush(stdout);
    /* the model learned something: not a loop that does nothing */
    ck_assert_msg(last < 0.75 * first, "loss went from %.4f (first %d steps) to %.4f (last %d)",
                  first, window, last, window);
    if (check_rss)
        ck_assert_msg(rss_max - rss_warm < (1 << 20),
                      "RSS grew by %.3f MiB after the warm-up (%.1f MiB at step %d, max %.1f MiB)",
                      max_growth, (double)rss_warm / (1 << 20), warm,
                      (double)rss_max / (1 << 20));
    model_free(&m);
    ck_assert_int_eq(nb_live_tensors(), live_start);
    ck_assert_int_eq(nb_memory_allocated(), alloc_start);
}
END_TEST

/* ----------------------------------------------------------------- errors */
/* The parameters' bytes, concatenated (all f32, contiguous). */
static size_t params_bytes(nb_params *ps) {
    size_t n = 0;
    for (int i = 0; i < nb_params_count(ps); i++)
        n += (size_t)nb_numel(nb_params_at(ps, i, NULL)) * sizeof(float);
    return n;
}
static void params_snapshot(nb_params *ps, unsigned char *out) {
    for (int i = 0; i < nb_params_count(ps); i++) {
        nb_tensor *p = nb_params_at(ps, i, NULL);
        ck_assert(nb_dtype_of(p) == NB_F32 && nb_is_contiguous(p));
        size_t n = (size_t)nb_numel(p) * sizeof(float);
        memcpy(out, nb_data(p), n);
        out += n;
    }
}

/* Adam's step count of parameter i ("<name>.step" in nb_optim_state). */
static int64_t adam_steps(model *m, int i) {
    const char *name;
    ck_assert_ptr_nonnull(nb_params_at(m->ps, i, &name));
    char key[256];
    snprintf(key, sizeof key, "%s.step", name);
    return (int64_t)nb_item(OK(nb_params_get(nb_optim_state(m->opt), key)));
}

/* Every .grad exists and is all zeros. */
static void expect_zero_grads(nb_params *ps, int step) {
    for (int i = 0; i < nb_params_count(ps); i++) {
        const char *name;
        nb_tensor *g = nb_grad(nb_params_at(ps, i, &name));
        ck_assert_msg(g != NULL, "step %d: %s has no .grad", step, name);
        const float *v = nb_data(g);
        for (int64_t k = 0; k < nb_numel(g); k++)
            ck_assert_msg(v[k] == 0.0f, "step %d: %s.grad[%lld] = %g after a skipped step", step,
                          name, (long long)k, (double)v[k]);
    }
}

START_TEST(errors_midway_are_reported_and_skipped) {
    const int steps = reduced ? 200 : 1000, period = steps / 10, window = steps / 10;
    int64_t live_start = nb_live_tensors(), alloc_start = nb_memory_allocated();
    model m;
    model_init(&m, 7);
    nb_clear_error();
    int np = nb_params_count(m.ps);
    size_t nbytes = params_bytes(m.ps);
    unsigned char *before = malloc(nbytes), *after = malloc(nbytes);
    loss_track lt = {.n = steps - 10, .window = window};
    ck_assert(before && after);

    /* nb_backward gets the NULL loss; its message quotes the first failure */
    char want_matmul[512], want_reshape[512];
    snprintf(want_matmul, sizeof want_matmul,
             "nb_backward: input 0 is NULL, after an earlier error: "
             "nb_matmul: shapes (%d,%d) and (%d,%d) cannot be multiplied (%d != %d)", B * L, D, C,
             D, D, C);
    snprintf(want_reshape, sizeof want_reshape,
             "nb_backward: input 0 is NULL, after an earlier error: "
             "nb_reshape: shape (%d,%d) is invalid for input of shape (%d,%d,%d) (%d elements)",
             B * L, D + 1, B, L, D, B * L * D);

    int errors = 0, good = 0;
    int64_t live0 = 0, alloc0 = 0;
    double t0 = now_s();
    for (int step = 0; step < steps; step++) {
        fault f = FAULT_NONE;
        if (step % period == period / 2)
            f = (step / period) % 2 == 0 ? FAULT_MATMUL : FAULT_RESHAPE;
        int64_t steps_before = f != FAULT_NONE ? adam_steps(&m, 0) : 0;
        if (f != FAULT_NONE) params_snapshot(m.ps, before);

        step_result r = train_step(&m, f);
        int64_t live = nb_live_tensors(), alloc = nb_memory_allocated();
        if (step == 0) {
            live0 = live;
            alloc0 = alloc;
        }
        ck_assert_msg(live == live0 && alloc == alloc0,
                      "after step %d (%s): %lld live tensors and %lld bytes allocated, after "
                      "step 0 %lld and %lld", step, f == FAULT_NONE ? "good" : "failed",
                      (long long)live, (long long)alloc, (long long)live0, (long long)alloc0);

        if (f == FAULT_NONE) {
            ck_assert_msg(r.ok, "step %d failed: %s", step, r.error);
            ck_assert_msg(nb_last_error() == NULL, "step %d left an error: %s", step,
                          nb_last_error());
            track(&lt, r.loss);
            good++;
            continue;
        }
        /* the failed step: reported, with the first failure's message */
        ck_assert_msg(!r.ok, "step %d: the injected fault went unnoticed", step);
        ck_assert_int_eq(r.backward_rc, -1);
        const char *want = f == FAULT_MATMUL ? want_matmul : want_reshape;
        ck_assert_msg(strcmp(r.error, want) == 0, "step %d: error \"%s\", expected \"%s\"", step,
                      r.error, want);
        ck_assert_str_eq(nb_last_error(), want); /* scope end did not touch it */
        errors++;
        nb_clear_error();
        /* skipped: parameters bitwise the same, no optimizer step, grads zero */
        params_snapshot(m.ps, after);
        ck_assert_msg(memcmp(before, after, nbytes) == 0, "step %d changed the parameters", step);
        for (int i = 0; i < np; i++) ck_assert_int_eq(adam_steps(&m, i), steps_before);
        expect_zero_grads(m.ps, step);
    }
    double secs = now_s() - t0;
    ck_assert_int_eq(errors, 10);
    ck_assert_int_eq(good, steps - 10);
    for (int i = 0; i < np; i++) ck_assert_int_eq(adam_steps(&m, i), good);
    double first = lt.first, last = lt.last;
    printf("soak: %d steps with %d injected errors in %.1f s: %d reported and skipped, %d good "
           "steps, loss %.3f -> %.3f, live tensors and allocated bytes back to baseline\n",
           steps, errors, secs, errors, good, first, last);
    fflush(stdout);
    ck_assert_msg(last < 0.85 * first,
                  "loss went from %.4f (first %d good steps) to %.4f (last %d)", first, window,
                  last, window);
    ck_assert_int_eq(nb_live_tensors(), live0);
    ck_assert_int_eq(nb_memory_allocated(), alloc0);
    free(before);
    free(after);
    model_free(&m);
    ck_assert_int_eq(nb_live_tensors(), live_start);
    ck_assert_int_eq(nb_memory_allocated(), alloc_start);
}
END_TEST

Suite *suite_soak(void) {
    choose_sizes();
    if (reduced)
        printf("soak: under valgrind, fewer steps and a batch of 4 (NB_SLOW_TESTS=1 for the "
               "full run)\n");
    Suite *s = suite_create("soak");
    TCase *tc = tcase_create("soak");
    tcase_set_timeout(tc, 900); /* a hang guard: 10,000 steps take 20 s on a busy machine */
    tcase_add_test(tc, soak_memory_is_flat);
    tcase_add_test(tc, errors_midway_are_reported_and_skipped);
    suite_add_tcase(s, tc);
    return s;
}
