/* lstm_add.c: an LSTM learns to add. Two numbers of D digits are read digit
 * by digit, least significant first (step t sees digit t of a and digit t of
 * b, one-hot, 20 inputs; step D sees zeros), and at each of the D + 1 steps
 * a linear layer on h predicts digit t of a + b (the last one is the carry).
 * The carry is what the cell has to remember.
 *
 *   build/examples/lstm_add [--steps 1000] [--batch 32] [--digits 5] [--hidden 32]
 *                           [--lr 0.01] [--seed 1] [--log-every 50] [--f64]
 *                           [--init FILE] [--save FILE] [--threads N]
 *
 * Model: nb_LSTMCell "lstm" (20 -> hidden) and nb_Linear "out" (hidden ->
 * 10), cross entropy over the (D + 1) x batch predictions, Adam (torch's
 * defaults but lr). The weights are drawn from --seed, or read from --init
 * (a safetensors file under torch's names: lstm.weight_ih, lstm.weight_hh,
 * lstm.bias_ih, lstm.bias_hh, out.weight, out.bias); --save writes them
 * after training. The problems come from a splitmix64 stream of --seed
 * (train) and of --seed + 1000 (the 1000 test problems), so
 * tests/fixtures/gen_lstm_add.py makes the same batches in PyTorch and
 * tests/tools/lstm_add_check.c (run by make test) compares the two runs
 * from the same initial weights, step by step. The last line:
 *
 *   test accuracy 0.9870 (987/1000 sums with every digit right)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nabla.h"

#define TEST_N 1000

typedef struct {
    int64_t steps, batch, digits, hidden, log_every, threads;
    double lr;
    uint64_t seed;
    bool f64;
    const char *init, *save;
} options;

typedef struct {
    nb_params *ps;
    nb_LSTMCell lstm;
    nb_Linear out;
} model;

/* splitmix64: the same numbers in C and in Python */
static uint64_t next_u64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

/* n problems: x (T, n, 20) one-hot digits (T = D + 1, the last step zeros),
 * y (T, n) the digits of the sums. The digits of a then of b, each drawn as
 * (next >> 33) % 10, least significant first. */
static void make_problems(uint64_t *s, int64_t n, int64_t D, double *x, int64_t *y) {
    int64_t T = D + 1;
    memset(x, 0, (size_t)(T * n * 20) * sizeof *x);
    for (int64_t i = 0; i < n; i++) {
        int a[64], b[64];
        for (int64_t t = 0; t < D; t++) a[t] = (int)((next_u64(s) >> 33) % 10);
        for (int64_t t = 0; t < D; t++) b[t] = (int)((next_u64(s) >> 33) % 10);
        int carry = 0;
        for (int64_t t = 0; t < T; t++) {
            int sum = carry + (t < D ? a[t] + b[t] : 0);
            if (t < D) {
                x[(t * n + i) * 20 + a[t]] = 1;
                x[(t * n + i) * 20 + 10 + b[t]] = 1;
            }
            y[t * n + i] = sum % 10;
            carry = sum / 10;
        }
    }
}

/* x (T, n, 20) -> logits (T * n, 10): the cell over the T steps, h and c
 * starting at zeros, and the linear layer on each step's h. */
static nb_tensor *forward(const model *m, nb_tensor *x) {
    int64_t T = nb_shape(x)[0], n = nb_shape(x)[1];
    nb_tensor *h = NULL, *c = NULL, *logits[64];
    for (int64_t t = 0; t < T; t++) {
        if (nb_lstmcell_forward(&m->lstm, nb_select(x, 0, t), h, c, &h, &c)) return NULL;
        logits[t] = nb_linear_forward(&m->out, h);
    }
    return nb_reshape(nb_stack(logits, (int)T, 0), NB_SHAPE(T * n, 10));
}

/* Sums with every digit right, among the n problems of x, y. */
static int64_t count_right(const model *m, nb_tensor *x, const int64_t *y) {
    int64_t T = nb_shape(x)[0], n = nb_shape(x)[1], right = 0;
    nb_scope_begin();
    bool was = nb_grad_enabled();
    nb_set_grad_enabled(false);
    nb_tensor *pred = nb_argmax(forward(m, x), 1, false); /* (T * n) */
    nb_set_grad_enabled(was);
    const int64_t *p = pred ? nb_data(nb_contiguous(pred)) : NULL;
    for (int64_t i = 0; p && i < n; i++) {
        bool ok = true;
        for (int64_t t = 0; t < T; t++) ok &= p[t * n + i] == y[t * n + i];
        right += ok;
    }
    nb_scope_end();
    return p ? right : -1;
}

static int usage(const char *msg) {
    if (*msg) fprintf(stderr, "lstm_add: %s\n", msg);
    fprintf(stderr, "usage: lstm_add [--steps N] [--batch B] [--digits D (1..60)] "
            "[--hidden H] [--lr LR] [--seed S] [--log-every K] [--f64] [--init FILE] "
            "[--save FILE] [--threads N]\n");
    return 2;
}

static int parse(int argc, char **argv, options *o) {
    *o = (options){.steps = 1000, .batch = 32, .digits = 5, .hidden = 32, .log_every = 50,
                   .lr = 0.01, .seed = 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end = NULL;
        if (!strcmp(a, "--f64")) {
            o->f64 = true;
            continue;
        }
        static const char *const known[] = {"--init", "--save", "--lr", "--steps", "--batch",
                                            "--digits", "--hidden", "--seed", "--log-every",
                                            "--threads"};
        bool is_known = false;
        for (size_t k = 0; k < sizeof known / sizeof *known; k++) is_known |= !strcmp(a, known[k]);
        if (!is_known) return fprintf(stderr, "lstm_add: unknown option %s\n", a), usage("");
        if (!v) return fprintf(stderr, "lstm_add: %s needs a value\n", a), usage("");
        i++;
        if (!strcmp(a, "--init")) o->init = v;
        else if (!strcmp(a, "--save")) o->save = v;
        else if (!strcmp(a, "--lr")) o->lr = strtod(v, &end);
        else {
            long long n = strtoll(v, &end, 10);
            if (!strcmp(a, "--steps")) o->steps = n;
            else if (!strcmp(a, "--batch")) o->batch = n;
            else if (!strcmp(a, "--digits")) o->digits = n;
            else if (!strcmp(a, "--hidden")) o->hidden = n;
            else if (!strcmp(a, "--seed")) o->seed = (uint64_t)n;
            else if (!strcmp(a, "--log-every")) o->log_every = n;
            else o->threads = n;
        }
        if (end && *end) return usage("a value is not a number");
    }
    if (o->steps < 0 || o->batch < 1 || o->digits < 1 || o->digits > 60 || o->hidden < 1 ||
        o->log_every < 1 || !(o->lr > 0) || o->threads < 0)
        return usage("a value is out of range");
    return 0;
}

/* The model, drawn from the seed or read from --init */
static int model_make(model *m, const options *o) {
    nb_rng rng;
    nb_rng_seed(&rng, o->seed);
    nb_set_default_dtype(o->f64 ? NB_F64 : NB_F32);
    m->ps = nb_params_new();
    if (!m->ps || nb_lstmcell_init(&m->lstm, m->ps, "lstm", 20, o->hidden, true, &rng) ||
        nb_linear_init(&m->out, m->ps, "out", o->hidden, 10, true, &rng))
        return -1;
    return o->init ? nb_load(m->ps, o->init) : 0;
}

/* A problem set as tensors of the model's dtype: x (T, n, 20), y (T * n) */
static int problems(uint64_t seed, int64_t n, const options *o, nb_tensor **x, nb_tensor **y,
                    int64_t **ys) {
    int64_t T = o->digits + 1;
    double *xv = malloc((size_t)(T * n * 20) * sizeof *xv);
    *ys = malloc((size_t)(T * n) * sizeof **ys);
    if (!xv || !*ys) return free(xv), -1;
    uint64_t s = seed;
    make_problems(&s, n, o->digits, xv, *ys);
    nb_scope_begin(); /* kept into the caller's scope (or made persistent) */
    *x = nb_keep(nb_to(nb_from_data(NB_F64, NB_SHAPE(T, n, 20), xv), o->f64 ? NB_F64 : NB_F32));
    *y = nb_keep(nb_from_data(NB_I64, NB_SHAPE(T * n), *ys));
    nb_scope_end();
    free(xv);
    return *x && *y ? 0 : -1;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int train(const model *m, const options *o, uint64_t *stream) {
    nb_optim *opt = nb_adam(m->ps, o->lr, 0.9, 0.999, 1e-8, 0);
    if (!opt) return -1;
    int rc = 0;
    double t0 = now();
    for (int64_t step = 1; step <= o->steps && !rc; step++) {
        nb_scope_begin();
        nb_tensor *x, *y;
        int64_t *ys;
        uint64_t seed = next_u64(stream); /* one stream per batch */
        rc = problems(seed, o->batch, o, &x, &y, &ys);
        free(ys);
        nb_tensor *loss = rc ? NULL : nb_cross_entropy(forward(m, x), y, -1, 0.0);
        rc = !loss || nb_backward(loss) ? -1 : 0;
        if (!rc) {
            nb_optim_step(opt);
            nb_optim_zero_grad(opt);
            rc = nb_last_error() ? -1 : 0;
        }
        if (!rc && (step % o->log_every == 0 || step == 1 || step == o->steps))
            printf("step %4lld  loss %.*g\n", (long long)step, o->f64 ? 15 : 9, nb_item(loss));
        nb_scope_end();
    }
    if (!rc)
        printf("trained %lld steps in %.2f s\n", (long long)o->steps, now() - t0);
    nb_optim_free(opt);
    return rc;
}

int main(int argc, char **argv) {
    options o;
    if (parse(argc, argv, &o)) return 2;
    if (o.threads) nb_set_num_threads((int)o.threads);
    model m = {0};
    int rc = model_make(&m, &o);
    printf("lstm_add: %lld-digit sums, LSTM hidden %lld, batch %lld, Adam lr %g, %s, %s\n",
           (long long)o.digits, (long long)o.hidden, (long long)o.batch, o.lr,
           o.f64 ? "f64" : "f32", o.init ? o.init : "weights from --seed");
    uint64_t stream = o.seed;
    if (!rc) rc = train(&m, &o, &stream);
    if (!rc && o.save) rc = nb_save(m.ps, o.save);
    nb_tensor *tx = NULL, *ty = NULL;
    int64_t *tys = NULL, right = -1;
    if (!rc) rc = problems(o.seed + 1000, TEST_N, &o, &tx, &ty, &tys);
    if (!rc) rc = (right = count_right(&m, tx, tys)) < 0 ? -1 : 0;
    if (rc) fprintf(stderr, "lstm_add: %s\n", nb_last_error() ? nb_last_error() : "out of memory");
    else
        printf("test accuracy %.4f (%lld/%d sums with every digit right)\n",
               (double)right / TEST_N, (long long)right, TEST_N);
    free(tys);
    nb_free(tx);
    nb_free(ty);
    nb_params_free(m.ps);
    return rc ? 1 : 0;
}
