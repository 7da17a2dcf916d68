/* copy_task.c: The Annotated Transformer's first example, trained end to end.
 *
 * The model learns to copy its input: sequences of 10 symbols from 1..10
 * (vocabulary 11, 0 is padding), the first symbol always 1 (the start
 * token). An encoder-decoder transformer is trained with cross entropy,
 * Adam (betas 0.9/0.98, eps 1e-9) and the Noam learning-rate schedule, on
 * batches drawn fresh at every step.
 *
 * When to stop: each epoch ends by checking 1,000 held-out sequences
 * (--check N sets the size of this set and of the final one). Once
 * 99% of them (--anneal-at 0.99) are copied exactly, the learning rate
 * anneals linearly to 0 over --anneal epochs (a Noam rate still this high makes the last few
 * sequences come and go from one epoch to the next); training stops when the
 * held-out set is 100% right at the end of an annealing, and otherwise
 * resumes the Noam schedule and anneals again (--all-epochs never stops
 * early). The final figure is greedy decoding of 1,000 other fresh
 * sequences, never used for training or for deciding when to stop.
 *
 *   build/examples/copy_task [--d-model 64] [--heads 4] [--layers 2] [--d-ff 256]
 *       [--batch 80] [--batches 20] [--epochs 40] [--dropout 0.1] [--lr 1.0]
 *       [--warmup 200] [--anneal 6] [--anneal-at 0.99] [--check 1000] [--seed 1]
 *       [--threads N] [--all-epochs]
 *       [--attn-map DIR] [--loss-plot FILE.svg] [--save FILE] [--load FILE]
 *       [--detect-anomaly] [--dtype f32|bf16]
 *
 * --dtype bf16 runs the whole program inside nb_autocast_begin(NB_BF16): the
 * matrix products (attention, linear layers, forward and backward) in
 * bfloat16 with f32 accumulation; parameters, Adam, softmax, layer norm and
 * the loss stay f32. It prints the same lines as f32.
 *
 * --attn-map DIR greedy-decodes the first fresh sequence after training and
 * writes every head's attention weights as SVG heatmaps, one file per layer
 * and attention: DIR/encoder.layer<i>.self_attn.svg (source x source),
 * DIR/decoder.layer<i>.self_attn.svg (target x target) and
 * DIR/decoder.layer<i>.src_attn.svg (target x source), with "<s>" for the
 * start token. --loss-plot FILE.svg writes the loss of every training step.
 * On a terminal a progress line shows the current epoch's steps.
 *
 * --save FILE writes a checkpoint (safetensors) at the end of every epoch:
 * the model's parameters under their own names (PyTorch state_dict keys),
 * Adam's state under "optim.", and the loop's own state under "trainer."
 * (epoch, step, where annealing began, the data and dropout random streams). --load FILE resumes
 * from one: given the same flags, the run continues exactly as if it had
 * never stopped (the same losses, bitwise).
 *
 * --dist (a build with MPI: make MPI=1, then mpirun -np N
 * build-mpi/examples/copy_task --dist) trains data-parallel on N processes
 * (nabla_mpi.h): every rank draws the same global batch and trains on its
 * batch/N rows, with a dropout stream of its own; gradients are averaged
 * after each backward. Every rank checks the held-out set (their weights are
 * the same, so are their decisions); rank 0 prints and writes checkpoints,
 * every rank reads them. Each rank runs on (CPUs / N) threads unless
 * --threads says otherwise.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "nabla.h"
#include "checkpoint.h"
#include "dist.h"
#include "progress.h"
#include "svg.h"

#define VOCAB 11
#define SEQ 10
#define PAD 0
#define START 1

typedef struct {
    int64_t d_model, heads, layers, d_ff, batch, batches, epochs, warmup, anneal, threads;
    int64_t check; /* sequences in the held-out set (checked after every epoch: when to anneal
                      and to stop) and in the fresh set (the final check, never used before) */
    double dropout, lr, anneal_at;
    uint64_t seed;
    bool all_epochs;       /* do not stop at the first epoch with 100% exact match */
    bool detect_anomaly;   /* nb_set_detect_anomaly: fail at the first NaN or Inf */
    bool dist;             /* --dist: data-parallel over MPI ranks */
    const char *attn_dir;  /* --attn-map DIR, or NULL */
    const char *loss_plot; /* --loss-plot FILE.svg, or NULL */
    const char *save, *load; /* --save FILE, --load FILE, or NULL */
    const char *dtype;       /* --dtype f32 | bf16 (products under autocast), or NULL */
} options;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void usage(const char *prog) {
    fprintf(stderr,
            "usage: %s [--d-model N] [--heads N] [--layers N] [--d-ff N] [--batch N]\n"
            "          [--batches N] [--epochs N] [--dropout P] [--lr F] [--warmup N]\n"
            "          [--anneal EPOCHS] [--anneal-at FRACTION] [--seed N] [--threads N]\n"
            "          [--all-epochs] [--attn-map DIR] [--loss-plot FILE.svg] [--save FILE]\n"
            "          [--load FILE] [--detect-anomaly] [--dist] [--check N] [--dtype f32|bf16]\n",
            prog);
}

static int parse(int argc, char **argv, options *o) {
    *o = (options){.d_model = 64, .heads = 4, .layers = 2, .d_ff = 256, .batch = 80,
                   .batches = 20, .epochs = 40, .warmup = 200, .anneal = 6, .threads = 0, .check = 1000, .dropout = 0.1,
                   .lr = 1.0, .anneal_at = 0.99, .seed = 1, .all_epochs = false};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool *flag = !strcmp(a, "--all-epochs")       ? &o->all_epochs
                     : !strcmp(a, "--detect-anomaly") ? &o->detect_anomaly
                     : !strcmp(a, "--dist")           ? &o->dist
                                                      : NULL;
        if (flag) {
            *flag = true;
            continue;
        }
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return -1;
        if (i + 1 >= argc) return -1;
        const char *v = argv[++i];
        const char **path = !strcmp(a, "--attn-map")    ? &o->attn_dir
                            : !strcmp(a, "--loss-plot") ? &o->loss_plot
                            : !strcmp(a, "--save")      ? &o->save
                            : !strcmp(a, "--load")      ? &o->load
                            : !strcmp(a, "--dtype")     ? &o->dtype
                                                        : NULL;
        if (path) {
            *path = v;
            continue;
        }
        char *end;
        double x = strtod(v, &end);
        if (*end) return -1;
        if (!strcmp(a, "--d-model")) o->d_model = (int64_t)x;
        else if (!strcmp(a, "--heads")) o->heads = (int64_t)x;
        else if (!strcmp(a, "--layers")) o->layers = (int64_t)x;
        else if (!strcmp(a, "--d-ff")) o->d_ff = (int64_t)x;
        else if (!strcmp(a, "--batch")) o->batch = (int64_t)x;
        else if (!strcmp(a, "--batches")) o->batches = (int64_t)x;
        else if (!strcmp(a, "--epochs")) o->epochs = (int64_t)x;
        else if (!strcmp(a, "--warmup")) o->warmup = (int64_t)x;
        else if (!strcmp(a, "--anneal")) o->anneal = (int64_t)x;
        else if (!strcmp(a, "--anneal-at")) o->anneal_at = x;
        else if (!strcmp(a, "--check")) o->check = (int64_t)x;
        else if (!strcmp(a, "--threads")) o->threads = (int64_t)x;
        else if (!strcmp(a, "--dropout")) o->dropout = x;
        else if (!strcmp(a, "--lr")) o->lr = x;
        else if (!strcmp(a, "--seed")) o->seed = (uint64_t)x;
        else return -1;
    }
    if (o->batch < 1 || o->batches < 1 || o->epochs < 1 || o->warmup < 1 ||
        o->anneal < 1 || !(o->anneal_at >= 0 && o->anneal_at <= 1) || o->check < 3)
        return -1;
    if (o->dtype && strcmp(o->dtype, "f32") && strcmp(o->dtype, "bf16")) return -1;
    return 0;
}

/* (n, SEQ) i64: symbol 1 first, then uniform over 1..VOCAB-1 */
static nb_tensor *random_sequences(int64_t n, nb_rng *rng) {
    nb_tensor *u = nb_rand(NB_F64, NB_SHAPE(n, SEQ), rng);
    nb_tensor *s = nb_empty(NB_I64, NB_SHAPE(n, SEQ));
    if (!u || !s) {
        nb_free(u);
        nb_free(s);
        return NULL;
    }
    const double *pu = nb_data(u);
    int64_t *ps = nb_data(s);
    for (int64_t i = 0; i < n * SEQ; i++)
        ps[i] = i % SEQ == 0 ? START : 1 + (int64_t)(pu[i] * (VOCAB - 1));
    nb_free(u); /* callers outside a scope keep only s */
    return s;
}

/* keep-masks: padding (B,1,1,L) from tokens != PAD, and causal & padding */
static nb_tensor *padding_keep(nb_tensor *tokens) {
    nb_tensor *pad = nb_full(NB_I64, 0, NULL, PAD);
    nb_tensor *k = nb_ne(tokens, pad);
    return nb_view(k, NB_SHAPE(nb_shape(tokens)[0], 1, 1, nb_shape(tokens)[1]));
}

static nb_tensor *causal_keep(nb_tensor *tokens) {
    int64_t len = nb_shape(tokens)[1];
    nb_tensor *no = nb_full(NB_BOOL, 0, NULL, 0);
    return nb_where(padding_keep(tokens), nb_tril_mask(len, len), no); /* (B,1,L,L) */
}

/* seq (B, SEQ) -> logits (B, SEQ-1, VOCAB), the decoder fed seq's first SEQ-1
 * symbols (teacher forcing): logit row i predicts symbol i+1. */
static nb_tensor *teacher_forced_logits(nb_Transformer *m, nb_tensor *seq, bool train,
                                        nb_rng *drop) {
    nb_tensor *tgt_in = nb_narrow(seq, 1, 0, SEQ - 1);
    nb_tensor *src_keep = padding_keep(seq);
    nb_tensor *memory = nb_transformer_encode(m, seq, src_keep, train, drop);
    nb_tensor *out = nb_transformer_decode(m, memory, src_keep, tgt_in, causal_keep(tgt_in),
                                           train, drop);
    return nb_transformer_logits(m, out);
}

/* One optimization step on a fresh batch (this rank's rows of it); returns
 * the loss of the whole batch (NAN on error). */
static double train_step(nb_Transformer *m, nb_optim *opt, nb_rng *data, nb_rng *drop,
                         int64_t batch, const dist_state *ds) {
    int64_t per = batch / ds->ranks;
    nb_tensor *seq = nb_narrow(random_sequences(batch, data), 0, ds->rank * per, per);
    nb_tensor *tgt_y = nb_narrow(seq, 1, 1, SEQ - 1);
    nb_tensor *logits = nb_reshape(teacher_forced_logits(m, seq, true, drop), NB_SHAPE(-1, VOCAB));
    nb_tensor *loss = nb_cross_entropy(logits, nb_reshape(tgt_y, NB_SHAPE(-1)), PAD, 0.0);
    int rc = loss && nb_backward(loss) == 0 ? 0 : -1;
    double value = rc == 0 ? nb_item(loss) : NAN;
    if (dist_sync(ds, rc, &value) != 0) return NAN; /* every rank, even after its own failure */
    nb_optim_step(opt);
    nb_optim_zero_grad(opt);
    return value;
}

/* Greedy decoding of src (n, SEQ): returns (n, SEQ) predictions. */
static nb_tensor *greedy_decode(nb_Transformer *m, nb_tensor *src) {
    int64_t n = nb_shape(src)[0];
    nb_tensor *src_keep = padding_keep(src);
    nb_tensor *memory = nb_transformer_encode(m, src, src_keep, false, NULL);
    nb_tensor *ys = nb_full(NB_I64, NB_SHAPE(n, 1), START);
    for (int64_t len = 1; len < SEQ && ys; len++) {
        nb_tensor *out = nb_transformer_decode(m, memory, src_keep, ys, causal_keep(ys), false,
                                               NULL);
        nb_tensor *last = nb_select(nb_transformer_logits(m, out), 1, len - 1); /* (n, V) */
        nb_tensor *next = nb_argmax(last, -1, true);                            /* (n, 1) */
        nb_tensor *parts[2] = {ys, next};
        ys = nb_cat(parts, 2, 1);
    }
    return ys;
}

typedef struct {
    int64_t exact, tokens; /* sequences copied exactly, symbols right (of n * (SEQ-1)) */
} accuracy;

/* The checks run on EVAL_CHUNK sequences at a time, each chunk in its own
 * scope: the next chunk reuses the buffers of the last from the allocator's
 * cache, where all 1,000 at once would fault in ~270 MB of fresh pages. */
#define EVAL_CHUNK 100

/* Greedy decoding of src (n, SEQ), scored; exact is -1 on error. The first
 * n_first decoded rows are copied to first (n_first * SEQ). */
static accuracy evaluate(nb_Transformer *m, nb_tensor *src, int64_t *first, int64_t n_first) {
    accuracy a = {0, 0};
    int64_t n = nb_shape(src)[0];
    for (int64_t c = 0; c < n; c += EVAL_CHUNK) {
        int64_t rows = n - c < EVAL_CHUNK ? n - c : EVAL_CHUNK;
        nb_scope_begin();
        nb_set_grad_enabled(false);
        nb_tensor *chunk = nb_contiguous(nb_narrow(src, 0, c, rows));
        nb_tensor *pred = chunk ? greedy_decode(m, chunk) : NULL;
        nb_set_grad_enabled(true);
        if (!pred) {
            nb_scope_end();
            return (accuracy){-1, -1};
        }
        const int64_t *p = nb_data(pred), *s = nb_data(chunk);
        for (int64_t i = 0; i < rows; i++) {
            int64_t same = 0;
            for (int64_t j = 1; j < SEQ; j++) same += p[i * SEQ + j] == s[i * SEQ + j];
            a.tokens += same;
            a.exact += same == SEQ - 1;
            if (c + i < n_first) memcpy(first + (c + i) * SEQ, p + i * SEQ, SEQ * sizeof *p);
        }
        nb_scope_end();
    }
    return a;
}

/* "100" only when k == n: otherwise k/n in percent rounded down to 0.1, so
 * 999 of 1000 never reads as 100. */
static const char *percent(int64_t k, int64_t n, char buf[16]) {
    if (k == n) return "100";
    snprintf(buf, 16, "%.1f", floor(1000.0 * (double)k / (double)n) / 10);
    return buf;
}

/* How many sequences of seq (n, SEQ) greedy decoding copies exactly, or -1
 * on error. Greedy decoding gets a sequence right exactly when, fed the true
 * prefix, the model's argmax is the next true symbol at every position, so
 * one teacher-forced forward pass gives the answer nine decoding steps would. */
static int64_t heldout_exact(nb_Transformer *m, nb_tensor *seq) {
    int64_t n = nb_shape(seq)[0], exact = 0;
    for (int64_t c = 0; c < n && exact >= 0; c += EVAL_CHUNK) {
        int64_t rows = n - c < EVAL_CHUNK ? n - c : EVAL_CHUNK;
        nb_scope_begin();
        nb_tensor *chunk = nb_narrow(seq, 0, c, rows);
        nb_set_grad_enabled(false);
        nb_tensor *pred = nb_argmax(teacher_forced_logits(m, chunk, false, NULL), -1, false);
        nb_set_grad_enabled(true);
        nb_tensor *want = nb_contiguous(nb_narrow(chunk, 1, 1, SEQ - 1));
        if (!pred || !want) exact = -1;
        for (int64_t i = 0; i < rows && exact >= 0; i++)
            exact += !memcmp((const int64_t *)nb_data(pred) + i * (SEQ - 1),
                             (const int64_t *)nb_data(want) + i * (SEQ - 1),
                             (SEQ - 1) * sizeof(int64_t));
        nb_scope_end();
    }
    return exact;
}

static void show(const char *label, const int64_t *row) {
    printf("  %s", label);
    for (int j = 0; j < SEQ; j++) printf(" %2lld", (long long)row[j]);
    printf("\n");
}

static const char *err(void) { return nb_last_error() ? nb_last_error() : "unknown error"; }

/* Prints "copy_task: <message>" to stderr; returns -1. */
static int fail(const char *fmt, ...) {
    char line[2048]; /* one write: ranks under mpirun share the terminal */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "copy_task: %s\n", line);
    return -1;
}

/* A growable array of doubles; push returns 0, or -1 when out of memory. */
typedef struct {
    double *v;
    int64_t n, cap;
} doubles;

static int doubles_push(doubles *d, double x) {
    if (d->n == d->cap) {
        int64_t cap = d->cap ? 2 * d->cap : 256;
        double *v = realloc(d->v, (size_t)cap * sizeof *v);
        if (!v) return -1;
        d->v = v;
        d->cap = cap;
    }
    d->v[d->n++] = x;
    return 0;
}

typedef struct {
    nb_params *ps;
    nb_Transformer model;
    nb_optim *opt;
    nb_tensor *heldout, *final_set; /* persistent */
    nb_rng data, drop;
    dist_state ds;
    doubles losses, epoch_ends; /* for --loss-plot: every step's loss, x of the epoch ends */
    progress bar;
    double start, train_time, train_end;
    int64_t perfect_epoch; /* the first to end an annealing with the held-out set 100% right, or -1 */
    int64_t anneal_start;  /* the step the learning rate began to anneal at, or -1 */
    int64_t epoch, step;   /* epochs and steps done (more than 0 after --load) */
    int64_t first_step;    /* the step training started from */
    nb_params *trainer;    /* --save/--load: the loop's own state, as buffers */
    nb_params *ckpt;       /* --save/--load: model + "optim." + "trainer.", sharing storage */
} run;

/* Rank r's dropout stream: its own seed (the checkpoint keeps rank 0's). */
#define DROP_SEED_STEP 7919

static int setup(run *r, const options *o) {
    if (o->batch % r->ds.ranks != 0)
        return fail("--dist: batch %lld does not split evenly over %d ranks", (long long)o->batch,
                    r->ds.ranks);
    dist_threads(&r->ds, o->threads);
    nb_set_detect_anomaly(o->detect_anomaly);
    nb_rng init, test, fresh;
    nb_rng_seed(&init, o->seed);
    nb_rng_seed(&r->data, o->seed + 1000);
    nb_rng_seed(&r->drop, o->seed + 2000 + DROP_SEED_STEP * (uint64_t)r->ds.rank);
    nb_rng_seed(&test, o->seed + 3000);  /* held-out sequences, never trained on */
    nb_rng_seed(&fresh, o->seed + 4000); /* never trained on, never used to stop */

    nb_TransformerConfig cfg = {.src_vocab = VOCAB, .tgt_vocab = VOCAB, .d_model = o->d_model,
                                .d_ff = o->d_ff, .heads = o->heads, .layers = o->layers,
                                .max_len = 64, .dropout = o->dropout};
    r->ps = nb_params_new();
    if (!r->ps || nb_transformer_init(&r->model, r->ps, &cfg, &init) != 0)
        return fail("%s", err());
    r->opt = nb_adam(r->ps, 0.0, 0.9, 0.98, 1e-9, 0.0);
    r->heldout = random_sequences(o->check, &test);
    r->final_set = random_sequences(o->check, &fresh);
    if (!r->opt || !r->heldout || !r->final_set) return fail("%s", err());
    if (dist_attach(&r->ds, r->ps) != 0) return fail("%s", err());
    printf("copy task: d_model %lld, heads %lld, layers %lld, d_ff %lld, %lld parameters; "
           "batch %lld x %lld per epoch, %d thread(s)",
           (long long)o->d_model, (long long)o->heads, (long long)o->layers, (long long)o->d_ff,
           (long long)nb_params_numel(r->ps), (long long)o->batch, (long long)o->batches,
           nb_num_threads());
    if (r->ds.ranks > 1) printf(" x %d ranks (--dist)", r->ds.ranks);
    printf("\n");
    return 0;
}

/* ---------------------------------------------------------- --save, --load */
static const char *trainer_names[] = {"epoch",    "step",     "perfect_epoch",
                                      "anneal_start", "data_rng", "drop_rng"};
#define TRAINER_VALUES 6

/* The checkpoint's registry: the parameters, Adam's state and the trainer's
 * buffers, one i64 (2) per random stream: (seed, offset). */
static int checkpoint_registry(run *r) {
    if (checkpoint_registry_make(r->ps, r->opt, trainer_names, TRAINER_VALUES, 4, &r->trainer,
                                 &r->ckpt) != 0)
        return fail("%s", err());
    return 0;
}

static int64_t *trainer_value(run *r, int i) { return checkpoint_value(r->trainer, i); }

static int save_checkpoint(run *r, const char *path) {
    int64_t *v[TRAINER_VALUES];
    for (int i = 0; i < TRAINER_VALUES; i++) v[i] = trainer_value(r, i);
    *v[0] = r->epoch, *v[1] = r->step, *v[2] = r->perfect_epoch, *v[3] = r->anneal_start;
    v[4][0] = (int64_t)r->data.seed, v[4][1] = (int64_t)r->data.offset;
    v[5][0] = (int64_t)(r->drop.seed - DROP_SEED_STEP * (uint64_t)r->ds.rank);
    v[5][1] = (int64_t)r->drop.offset;
    int rc = r->ds.rank == 0 ? nb_save(r->ckpt, path) : 0; /* rank 0 writes, every rank reads */
    if (dist_agree(&r->ds, "--save", rc) != 0) return progress_clear(&r->bar), fail("%s", err());
    return 0;
}

static int load_checkpoint(run *r, const char *path) {
    int rc = nb_load(r->ckpt, path);
    if (rc != 0)
        nb_report_error("%s (--load needs the flags the checkpoint was trained with)", err());
    if (dist_agree(&r->ds, "--load", rc) != 0) return fail("%s", err());
    int64_t *v[TRAINER_VALUES];
    for (int i = 0; i < TRAINER_VALUES; i++) v[i] = trainer_value(r, i);
    r->epoch = *v[0], r->step = r->first_step = *v[1], r->perfect_epoch = *v[2];
    r->anneal_start = *v[3];
    r->data = (nb_rng){.seed = (uint64_t)v[4][0], .offset = (uint64_t)v[4][1]};
    r->drop = (nb_rng){.seed = (uint64_t)v[5][0] + DROP_SEED_STEP * (uint64_t)r->ds.rank,
                       .offset = (uint64_t)v[5][1]};
    printf("resumed from %s: %lld epochs, %lld steps done\n", path, (long long)r->epoch,
           (long long)r->step);
    return 0;
}

/* Noam's rate; while annealing, the rate annealing began at, falling
 * linearly to 0 over o->anneal epochs (LinearLR from factor 1 to 0). */
static double learning_rate(const run *r, const options *o, int64_t step) {
    if (r->anneal_start < 0) return o->lr * nb_noam_rate(step, o->d_model, 1.0, o->warmup);
    double from = o->lr * nb_noam_rate(r->anneal_start, o->d_model, 1.0, o->warmup);
    return nb_lr_linear(step - r->anneal_start, 1.0, 0.0, o->anneal * o->batches, from);
}

/* The steps of one epoch; returns their mean loss, or NAN after printing why. */
static double run_epoch(run *r, const options *o, int64_t epoch, int64_t *step) {
    double loss_sum = 0;
    progress_epoch(&r->bar, epoch);
    for (int64_t b = 0; b < o->batches; b++, (*step)++) {
        nb_optim_set_lr(r->opt, learning_rate(r, o, *step));
        nb_scope_begin();
        double loss = train_step(&r->model, r->opt, &r->data, &r->drop, o->batch, &r->ds);
        nb_scope_end();
        if (isnan(loss)) {
            progress_clear(&r->bar);
            fail("step %lld failed: %s", (long long)*step,
                 nb_last_error() ? nb_last_error() : "loss is NaN");
            return NAN;
        }
        loss_sum += loss;
        if (o->loss_plot && doubles_push(&r->losses, loss) != 0) {
            progress_clear(&r->bar);
            fail("out of memory");
            return NAN;
        }
        progress_step(&r->bar, b + 1, loss_sum / (double)(b + 1),
                      (double)((b + 1) * o->batch * (SEQ - 1)));
    }
    return loss_sum / (double)o->batches;
}

static int train(run *r, const options *o) {
    r->start = now();
    progress_init(&r->bar, o->epochs, o->batches);
    int64_t step = r->step;
    bool done = r->perfect_epoch > 0 && !o->all_epochs; /* a checkpoint of a finished run */
    for (int64_t epoch = r->epoch + 1; epoch <= o->epochs && !done; epoch++) {
        double t0 = now(), loss = run_epoch(r, o, epoch, &step);
        if (isnan(loss)) return -1;
        double dt = now() - t0;
        r->train_time += dt;
        int64_t exact = heldout_exact(&r->model, r->heldout);
        progress_clear(&r->bar);
        if (exact < 0) return fail("checking the held-out set failed: %s", err());
        bool annealing = r->anneal_start >= 0;
        char pc[16];
        printf("epoch %3lld  loss %.4f  %7.0f tokens/s  lr %.2e%s  held-out exact %5s%%  "
               "elapsed %.1fs\n",
               (long long)epoch, loss, (double)(o->batches * o->batch * (SEQ - 1)) / dt,
               nb_optim_lr(r->opt), annealing ? " (annealing)" : "", percent(exact, o->check, pc),
               now() - r->start);
        fflush(stdout);
        /* steps are numbered from 1 in the plot: the boundary lies between two */
        if (o->loss_plot && doubles_push(&r->epoch_ends, (double)step + 0.5) != 0)
            return fail("out of memory");
        if (annealing && step - r->anneal_start >= o->anneal * o->batches) {
            r->anneal_start = -1; /* back to Noam's rate, unless this is the end */
            if (exact == o->check && r->perfect_epoch < 0) {
                r->perfect_epoch = epoch;
                done = !o->all_epochs;
            }
        }
        if (!done && r->anneal_start < 0 && (double)exact >= o->anneal_at * (double)o->check) r->anneal_start = step;
        r->epoch = epoch;
        r->step = step;
        if (o->save && save_checkpoint(r, o->save) != 0) return -1;
    }
    r->train_end = now();
    return 0;
}

/* The last line is the result: "exact match 100% (1000/1000)" when greedy
 * decoding copies every fresh sequence. */
static int final_report(run *r, const options *o) {
    if (r->perfect_epoch > 0)
        printf("held-out set: %lld/%lld exact after annealing, stopped after epoch %lld; "
               "training %.1fs (%.1fs with the checks)\n",
               (long long)o->check, (long long)o->check, (long long)r->perfect_epoch, r->train_time,
               r->train_end - r->start);
    else
        printf("held-out set: not all %lld exact at the end of an annealing within %lld epochs; "
               "training %.1fs (%.1fs with the checks)\n",
               (long long)o->check, (long long)o->epochs, r->train_time, r->train_end - r->start);
    int64_t first[3 * SEQ];
    accuracy acc = evaluate(&r->model, r->final_set, first, 3);
    if (acc.exact < 0) return fail("decoding the fresh sequences failed: %s", err());
    printf("greedy decoding of %lld fresh sequences, never used for training or for stopping "
           "(first 3 shown):\n", (long long)o->check);
    for (int i = 0; i < 3; i++) {
        show("source   ", (const int64_t *)nb_data(r->final_set) + i * SEQ);
        show("decoded  ", first + i * SEQ);
    }
    char pc[16];
    printf("token accuracy %s%% (%lld/%lld)\n", percent(acc.tokens, o->check * (SEQ - 1), pc),
           (long long)acc.tokens, (long long)(o->check * (SEQ - 1)));
    printf("exact match %s%% (%lld/%lld)\n", percent(acc.exact, o->check, pc),
           (long long)acc.exact, (long long)o->check);
    return 0;
}

/* ------------------------------------------------------------ --loss-plot */
/* out[i] = the mean of y over [i - half, i + half] (clipped at the ends): a
 * smooth curve without the lag of an exponential average. */
static void centered_mean(const double *y, int64_t n, int64_t half, double *out) {
    double sum = 0;
    int64_t lo = 0, hi = 0; /* the window is [lo, hi) */
    for (int64_t i = 0; i < n; i++) {
        for (; hi < n && hi <= i + half; hi++) sum += y[hi];
        for (; lo < i - half; lo++) sum -= y[lo];
        out[i] = sum / (double)(hi - lo);
    }
}

static int write_loss_plot(const run *r, const options *o) {
    int64_t n = r->losses.n;
    double *x = malloc(2 * (size_t)(n > 0 ? n : 1) * sizeof *x);
    if (!x) return fail("out of memory");
    double *smooth = x + n;
    for (int64_t i = 0; i < n; i++) x[i] = (double)(r->first_step + i + 1);
    centered_mean(r->losses.v, n, 10, smooth);
    char title[160];
    snprintf(title, sizeof title, "copy task: training loss (d_model %lld, %lld heads, "
             "%lld layers, batch %lld)", (long long)o->d_model, (long long)o->heads,
             (long long)o->layers, (long long)o->batch);
    svg_series series[2] = {
        {.label = "loss of each step", .x = x, .y = r->losses.v, .n = n, .color = "#9ecae1",
         .width = 1},
        {.label = "centered mean of 21 steps", .x = x, .y = smooth, .n = n, .color = "#08519c",
         .width = 2},
    };
    svg_plot_spec spec = {.title = title, .x_label = "training step",
                          .y_label = "cross-entropy loss (log scale)", .series = series,
                          .n_series = 2, .log_y = true, .vlines = r->epoch_ends.v,
                          .n_vlines = r->epoch_ends.n, .vline_label = "end of an epoch"};
    int rc = svg_lineplot(o->loss_plot, &spec);
    free(x);
    if (rc != 0) return fail("%s", svg_error());
    printf("wrote %s\n", o->loss_plot);
    return 0;
}

/* -------------------------------------------------------------- --attn-map */
/* mkdir -p */
static int make_dirs(const char *dir) {
    char p[4096];
    size_t n = strlen(dir);
    if (n == 0 || n >= sizeof p) return fail("--attn-map: bad directory name \"%s\"", dir);
    memcpy(p, dir, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (p[i] != '/' && p[i] != '\0') continue;
        char c = p[i];
        p[i] = '\0';
        if (mkdir(p, 0777) != 0 && errno != EEXIST)
            return fail("cannot create directory %s: %s", p, strerror(errno));
        p[i] = c;
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) return fail("%s is not a directory", dir);
    return 0;
}

/* "<s>" for the start token in front, the symbol's number elsewhere */
static void token_labels(const int64_t *tokens, int n, char buf[][24], const char **labels) {
    for (int i = 0; i < n; i++) {
        if (i == 0 && tokens[i] == START) snprintf(buf[i], 24, "<s>");
        else snprintf(buf[i], 24, "%lld", (long long)tokens[i]);
        labels[i] = buf[i];
    }
}

typedef struct {
    nb_tensor *w;                   /* (1, H, rows, cols) */
    const char *file, *what;        /* "decoder.layer%lld.src_attn", a title */
    const char *const *rows, *const *cols;
    int nrows, ncols;
    const char *row_axis, *col_axis;
} attn_map;

static int write_map(const char *dir, int64_t layer, const attn_map *a, const char *subtitle) {
    char name[64], path[4096], title[160];
    snprintf(name, sizeof name, a->file, (long long)layer);
    int len = snprintf(path, sizeof path, "%s/%s.svg", dir, name);
    if (len < 0 || len >= (int)sizeof path) return fail("--attn-map: path too long: %s", dir);
    const int64_t *s = a->w ? nb_shape(a->w) : NULL;
    if (!s || nb_ndim(a->w) != 4 || s[0] != 1 || s[2] != a->nrows || s[3] != a->ncols)
        return fail("%s: the model kept no attention weights of shape (1, H, %d, %d)", path,
                    a->nrows, a->ncols);
    double *v = malloc((size_t)nb_numel(a->w) * sizeof *v);
    if (!v) return fail("out of memory");
    if (nb_copy_to_f64(a->w, v) != 0) {
        free(v);
        return fail("%s: %s", path, err());
    }
    snprintf(title, sizeof title, "%s, layer %lld", a->what, (long long)layer);
    svg_heatmap_spec spec = {.title = title, .subtitle = subtitle, .row_axis = a->row_axis,
                             .col_axis = a->col_axis, .panel_name = "head", .panels = (int)s[1],
                             .rows = a->nrows, .cols = a->ncols, .values = v,
                             .row_labels = a->rows, .col_labels = a->cols};
    int rc = svg_heatmaps(path, &spec);
    free(v);
    if (rc != 0) return fail("%s", svg_error());
    printf("wrote %s\n", path);
    return 0;
}

/* src: the source (SEQ); out: the decoded sequence (SEQ), whose first SEQ-1
 * tokens were the decoder's input at the last step. */
static int write_maps(const nb_Transformer *m, const int64_t *src, const int64_t *out,
                      const char *dir) {
    char sb[SEQ][24], tb[SEQ][24], subtitle[256];
    const char *sl[SEQ], *tl[SEQ];
    token_labels(src, SEQ, sb, sl);
    token_labels(out, SEQ, tb, tl);
    int n = snprintf(subtitle, sizeof subtitle, "first fresh sequence; source");
    for (int i = 0; i < SEQ; i++) n += snprintf(subtitle + n, sizeof subtitle - n, " %s", sl[i]);
    n += snprintf(subtitle + n, sizeof subtitle - n, ", decoded");
    for (int i = 0; i < SEQ; i++) n += snprintf(subtitle + n, sizeof subtitle - n, " %s", tl[i]);
    const char *src_q = "source tokens (queries)", *src_k = "source tokens (keys)";
    const char *tgt_q = "decoder input (row i predicts output token i+1)";
    const char *tgt_k = "decoder input (keys)";
    for (int64_t i = 0; i < m->cfg.layers; i++) {
        const attn_map maps[3] = {
            {m->encoder[i].self_weights, "encoder.layer%lld.self_attn", "encoder self-attention",
             sl, sl, SEQ, SEQ, src_q, src_k},
            {m->decoder[i].self_weights, "decoder.layer%lld.self_attn", "decoder self-attention",
             tl, tl, SEQ - 1, SEQ - 1, tgt_q, tgt_k},
            {m->decoder[i].src_weights, "decoder.layer%lld.src_attn",
             "decoder cross-attention (src_attn)", tl, sl, SEQ - 1, SEQ, tgt_q, src_k},
        };
        for (int k = 0; k < 3; k++)
            if (write_map(dir, i, &maps[k], subtitle) != 0) return -1;
    }
    return 0;
}

/* Greedy-decodes the first sequence of set with the model keeping its
 * attention weights: the encoder's come from encode, the decoder's from the
 * last decoding step, which sees the whole target prefix. */
static int attention_maps(nb_Transformer *m, nb_tensor *set, const char *dir) {
    nb_scope_begin();
    nb_set_grad_enabled(false);
    m->keep_attention = true;
    nb_tensor *src = nb_narrow(set, 0, 0, 1);
    nb_tensor *ys = greedy_decode(m, src);
    m->keep_attention = false;
    nb_set_grad_enabled(true);
    int rc = ys ? write_maps(m, nb_data(src), nb_data(ys), dir)
                : fail("decoding for --attn-map failed: %s", err());
    nb_scope_end();
    return rc;
}

static void teardown(run *r) {
    nb_params_free(r->ckpt);
    nb_params_free(r->trainer);
    free(r->losses.v);
    free(r->epoch_ends.v);
    nb_free(r->heldout);
    nb_free(r->final_set);
    nb_optim_free(r->opt);
    nb_transformer_free(&r->model);
    nb_params_free(r->ps);
}

int main(int argc, char **argv) {
    options o;
    if (parse(argc, argv, &o) != 0) {
        usage(argv[0]);
        return 2;
    }
    run r = {.perfect_epoch = -1, .anneal_start = -1};
    char msg[512];
    if (dist_start(&r.ds, o.dist, &argc, &argv, msg, sizeof msg) != 0)
        return fail("%s", msg), 2;
    if (o.dtype && !strcmp(o.dtype, "bf16")) nb_autocast_begin(NB_BF16); /* this thread's, to the end */
    int rc = o.attn_dir ? make_dirs(o.attn_dir) : 0; /* before training, which may be long */
    if (rc == 0) rc = setup(&r, &o);
    if (rc == 0 && (o.save || o.load)) rc = checkpoint_registry(&r);
    if (rc == 0 && o.load) rc = load_checkpoint(&r, o.load);
    if (rc == 0) rc = train(&r, &o);
    if (rc == 0) dist_report(&r.ds); /* before the result, which is the last line */
    if (rc == 0) rc = final_report(&r, &o);
    if (rc == 0 && o.loss_plot) rc = write_loss_plot(&r, &o);
    if (rc == 0 && o.attn_dir) rc = attention_maps(&r.model, r.final_set, o.attn_dir);
    teardown(&r);
    dist_stop(&r.ds);
    return rc == 0 ? 0 : 1; /* the accuracy is in the output, not in the exit code */
}
