/* gpt.c: train and sample a GPT (nb_GPT: GPT-2 as nanoGPT writes it).
 *
 * By default a small character-level model (--config char: the 256 byte
 * values as its vocabulary, context 64, 4 layers, 4 heads, n_embd 128) learns
 * the text shipped in examples/data/kjv.txt (the first five books of the King
 * James Bible) in under a minute on two cores, then writes a sample (make gpt):
 *
 *   build/examples/gpt --shuffle --sample 500
 *
 * --config gpt2 is GPT-2 124M exactly (12 layers, 12 heads, n_embd 768,
 * vocabulary 50257, context 1024, tied lm_head, GELU tanh). --init FILE
 * starts from a checkpoint: llm.c's (gpt2_124M.bin) or Hugging Face's
 * model.safetensors; without --config the model takes the file's
 * configuration. The head count is the one size no tensor shows: llm.c's
 * header has it, --export's safetensors store it in __metadata__, Hugging
 * Face keeps it in a config.json beside the weights; a file with none of
 * these gets one head per 64 channels (as every GPT-2 size has), with a
 * warning to give --n-head, and an --n-head that contradicts what the file
 * stores is refused. The --n-layer, --n-head, --n-embd, --block-size and
 * --dropout options change the configuration.
 *
 * What it does is said, never implied: --steps N trains (a fresh model,
 * --init's weights or --load's checkpoint); --sample N and --eval use the
 * model as it is and never train it unless --steps is given; --init or
 * --load with none of the three is an error; with nothing at all a fresh
 * model trains for 1000 steps (make gpt's run). --export FILE writes the
 * model alone at the end (llm.c's checkpoint, or Hugging Face's
 * model.safetensors for a .safetensors name), which --init reads: with
 * --init alone, a conversion between the two formats.
 *
 * --data FILE is llm.c's token file (uint16 tokens after a 256-int header,
 * as its dev/data scripts and build/examples/tokenize --out write), or text:
 * tokenized by --tokenizer (nb_tokenizer: GPT-2's byte-level BPE), or read
 * as bytes by a byte model (vocabulary 256), and refused for any other
 * vocabulary (bytes are not GPT-2's tokens). Training reads batches of B rows of T+1
 * consecutive tokens (inputs, and the targets shifted by one) in file order:
 * row r of step i (counted from 0) starts at token (i*B + r)*T, wrapping
 * around at the end of the training tokens. --shuffle draws each row's
 * start from the seeded data stream instead. Each step: the mean
 * cross-entropy (nb_gpt_loss), backward, gradient clipping (--clip), AdamW
 * (--beta1 0.9, --beta2 0.95, eps 1e-8; weight decay on the linear weights
 * only, nb_gpt_decays, or with --decay-groups 2d on every parameter of 2 or
 * more dims, embeddings included, as nanoGPT). It prints "step N: loss X (Y
 * ms)"; on a terminal a progress line on stderr shows the pace and the time
 * left. --grad-accum A makes a step of A micro-batches of B rows, each
 * loss scaled by 1/A before its backward (nanoGPT's), the gradients summed:
 * the step reads the rows a step of --batch A*B would (micro-batch m rows
 * [m B, m B + B)), and its loss is the mean of the A losses. The
 * gradients are those of --batch A*B up to the order of the sums.
 *
 * The learning rate of step i (from 0) is lr (i+1)/(warmup+1) during the
 * --warmup, then --lr (--lr-schedule constant, the default), or a decay to
 * --min-lr (default lr/10) at step --lr-decay-steps (default --steps) and
 * --min-lr after: cosine (nb_lr_cosine: nanoGPT's get_lr) or linear.
 *
 * A validation set is --val FILE (read as --data is) or --val-split F: the
 * last F of --data's n tokens (training uses the first floor(n (1-F)), as
 * nanoGPT's 90/10 split with F 0.1). With one, or --eval-interval N alone,
 * training evaluates at step 0, every N steps (default 250) and at the
 * last step (not at the step --load resumed from: the run that saved it
 * did), printing "step N: train loss X, val loss Y, lr Z (T ms)" (lr: the
 * next step's). Each loss is the mean over --eval-iters K (default 20)
 * batches of B rows from random places of its split, drawn from a stream
 * of its own seeded afresh at every evaluation (seed+4 train, seed+5 val):
 * evaluations compare the same batches, and training's streams are not
 * touched. --save-best FILE writes a checkpoint (as --save) at each
 * evaluation whose val loss is below all before (the lowest so far is in
 * the checkpoints: a resumed run saves where the straight run would).
 *
 * --eval trains nothing: it prints "loss X", the mean cross-entropy of
 * every target of the validation set (else --data): its n tokens cut into
 * W = floor((n-1)/T) windows, window w the inputs [wT, wT+T) and the targets
 * [wT+1, wT+T], B windows a batch (the last may have fewer); with
 * --eval-iters K the first K batches only (K 1: the first batch in file
 * order). A line on stderr gives the windows and batches.
 *
 * --no-bias makes the linear layers without biases (nanoGPT's bias=False;
 * nb_gpt keeps the layer norms' biases); llm.c's checkpoints hold biases,
 * so --export of such a model needs a .safetensors name.
 *
 * --dtype bf16 runs the forward passes (training, --eval, --sample) inside
 * nb_autocast_begin(NB_BF16): the matrix products in bfloat16 with f32
 * accumulation, their backward likewise; weights, AdamW, softmax, layer norm
 * and the loss stay f32. It prints the same lines as f32. --sample then
 * generates from bf16 copies of the linear weights (nb_gpt_sample_opts.dtype:
 * half the bytes read per token).
 *
 * --sample N generates N tokens at the end (nb_gpt_generate, which keeps a
 * key/value cache) from --prompt: text for a byte vocabulary (default: a
 * newline) or with --tokenizer (default: its <|endoftext|>), printed as
 * text; token ids otherwise (e.g. "50256 464"; default 50256), printed as
 * ids. A tokenizer with more tokens than the model has rows is refused.
 *
 * --save FILE writes a checkpoint (safetensors) at the end (and every
 * --save-every N steps): the model's parameters under their own names
 * (nanoGPT's state_dict keys), AdamW's state under "optim." and the loop's
 * state under "trainer." (the steps done and the data and dropout random
 * streams; the data position follows from them). --load FILE resumes from
 * one: given the same flags, a run of --steps N resumed from the checkpoint
 * of a run of --steps M (M < N) continues at step M+1 and ends where one run
 * of N steps would have: the same losses and checkpoint, bit for bit.
 * With --save-best a checkpoint also holds the lowest val loss so far
 * (trainer.best_val_loss); --load reads checkpoints with or without it.
 *
 * --dist (a build with MPI: make MPI=1, then mpirun -np N
 * build-mpi/examples/gpt --dist) trains data-parallel (nabla_mpi.h): each
 * step's batch has --batch rows per rank, each rank takes its own rows (in
 * file order, or from the shared --shuffle draws) and its own dropout
 * stream, and the gradients are averaged before clipping and AdamW
 * (--grad-accum is refused: the averaging follows every backward); an
 * evaluation's batches likewise, its loss the mean over the ranks. Rank 0
 * prints (the loss is the mean over the ranks) and writes checkpoints;
 * every rank reads them, and a failed save or load stops every rank with
 * its message (nb_mpi_agree). A checkpoint resumes on any number of ranks.
 * --zero shards AdamW's state over the ranks (ZeRO stage 1): each keeps the
 * state of its own parameters; to save, rank 0 gathers the whole state
 * (the same file as without --zero), and after a load it hands each rank
 * its part, so rank 0 holds the whole state when --save, --save-best or
 * --load is given.
 *
 * Errors (a bad option or file, a configuration that does not fit --init's
 * file) print the reason and exit with status 1.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "nabla.h"
#include "checkpoint.h"
#include "dist.h"
#include "progress.h"

#define DEFAULT_DATA "examples/data/kjv.txt"
#define LLMC_MODEL_MAGIC 20240326u
#define LLMC_TOKENS_MAGIC 20240520u
#define DROP_SEED_STEP 7919 /* rank r's dropout stream: seed + 2 + r * this */

typedef enum { SCHED_CONSTANT, SCHED_COSINE, SCHED_LINEAR } sched;

typedef struct {
    const char *config; /* named configuration, NULL: "char" (or --init's file) */
    int64_t n_layer, n_head, n_embd, block_size; /* overrides (0: the config's) */
    double dropout;
    const char *init, *data, *save, *load, *prompt, *dtype, *tokenizer, *export;
    const char *val, *save_best, *lr_schedule, *decay_groups;
    int64_t batch, seq, steps, threads, sample, top_k, save_every, warmup;
    int64_t eval_interval, eval_iters, lr_decay_steps, grad_accum;
    double lr, temperature, weight_decay, clip, val_split, min_lr, beta1, beta2;
    int64_t seed;
    bool shuffle, eval, dist, zero, no_bias;
    bool evals; /* evaluations during training: a validation set or --eval-interval */
    sched schedule;
    bool decay_2d; /* --decay-groups 2d */
    bool train; /* --steps given, or a fresh model with nothing else to do */
    bool bf16; /* --dtype bf16: the products under nb_autocast_begin(NB_BF16) */
} options;

static const char *err(void) { return nb_last_error() ? nb_last_error() : "unknown error"; }

/* Prints "gpt: <message>" to stderr; returns -1. */
static int fail(const char *fmt, ...) {
    char line[2048]; /* one write: ranks under mpirun share the terminal */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "gpt: %s\n", line);
    return -1;
}

static bool ends_with(const char *s, const char *end) {
    size_t n = strlen(s), e = strlen(end);
    return n >= e && !strcmp(s + n - e, end);
}

/* --save's (or --export's) folder exists and takes files: checked (on the
 * rank that writes) before the model is made and any step trains, not found
 * out after the last one. 0, or -1 with nabla's message set. */
static int writable_dir(const char *flag, const char *path) {
    const char *slash = strrchr(path, '/');
    char dir[4096];
    int n = slash ? snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path)
                  : snprintf(dir, sizeof dir, ".");
    if (slash == path) snprintf(dir, sizeof dir, "/");
    struct stat st;
    if (n < 0 || (size_t)n >= sizeof dir)
        nb_report_error("%s: the path \"%s\" is too long", flag, path);
    else if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        nb_report_error("%s: \"%s\" is a folder; give a file name in it", flag, path);
    else if (stat(dir, &st) != 0 || (S_ISDIR(st.st_mode) && access(dir, W_OK) != 0))
        nb_report_error("%s: cannot write \"%s\": its folder \"%s\": %s", flag, path, dir,
                        strerror(errno));
    else if (!S_ISDIR(st.st_mode))
        nb_report_error("%s: cannot write \"%s\": \"%s\" is not a folder", flag, path, dir);
    else
        return 0;
    return -1;
}

static void usage(FILE *f, const char *prog) {
    fprintf(f,
            "usage: %s [options]\n"
            "what it does: --steps N trains (from a fresh model, --init's weights or\n"
            "  --load's checkpoint); --sample N and --eval use the model as it is and\n"
            "  never train unless --steps is given; with none of them, a fresh model\n"
            "  trains for 1000 steps. Examples (GPT-2's files: llm.c's gpt2_124M.bin,\n"
            "  Hugging Face's model.safetensors + tokenizer.json or vocab.json):\n"
            "  sample:    %s --init gpt2_124M.bin --tokenizer tokenizer.json \\\n"
            "               --prompt \"Hello, my name is\" --sample 40\n"
            "  fine-tune: %s --init gpt2_124M.bin --tokenizer tokenizer.json \\\n"
            "               --data my.txt --steps 100 --lr 1e-4 --seq 256 --export ft.bin\n"
            "  loss:      %s --init gpt2_124M.bin --data val.bin --eval\n"
            "  (GPT-2's encoder.json + vocab.bpe ship in tests/fixtures/gpt2/; a real run\n"
            "  on a small model of GPT-2's vocabulary: docs/gpt.md)\n"
            "model:\n"
            "  --config NAME      char (the default: bytes, context 64, 4 layers, 4 heads,\n"
            "                     n_embd 128), tiny (bytes, context 32, 2 layers, 2 heads,\n"
            "                     n_embd 32) or gpt2 (GPT-2 124M); with --init, by default\n"
            "                     the file's configuration\n"
            "  --n-layer N  --n-head N  --n-embd N  --block-size N  --dropout P  (change it)\n"
            "  --no-bias          no biases in the linear layers (nanoGPT's bias=False; the\n"
            "                     layer norms keep theirs); --export then needs .safetensors\n"
            "  --init FILE        llm.c's checkpoint or Hugging Face's model.safetensors\n"
            "  --seed N           initialization, data order, dropout and sampling (default 1)\n",
            prog, prog, prog, prog);
    /* in parts: C99 compilers need to take strings of 4095 bytes only */
    fputs("training:\n"
            "  --data FILE        llm.c token file, or text: tokenized by --tokenizer, or\n"
            "                     read as bytes by a byte model (--config char or tiny)\n"
            "                     (default " DEFAULT_DATA ")\n"
            "  --tokenizer PATH   GPT-2's: tokenizer.json, vocab.json (merges.txt beside\n"
            "                     it), encoder.json (vocab.bpe beside it), or llm.c's\n"
            "                     gpt2_tokenizer.bin (prints samples as text only)\n"
            "  --batch B          rows per step (default 8)\n"
            "  --seq T            tokens per row (default: the context)\n"
            "  --steps N          train until N steps are done (see above)\n"
            "  --shuffle          rows from random places instead of in file order\n"
            "  --grad-accum N     N micro-batches of B rows per step, gradients summed\n"
            "                     (losses scaled by 1/N): the rows of --batch N*B (default 1)\n"
            "  --lr F             AdamW's learning rate (default 0.003)\n"
            "  --warmup N         linear warmup over the first N steps (default 20)\n"
            "  --lr-schedule S    after the warmup: constant (the default: --lr), cosine\n"
            "                     (nanoGPT's get_lr) or linear, from --lr to --min-lr at step\n"
            "                     --lr-decay-steps, --min-lr after\n"
            "  --min-lr F         (default --lr / 10)\n"
            "  --lr-decay-steps N (default --steps)\n"
            "  --beta1 F  --beta2 F  AdamW's betas (default 0.9, 0.95)\n"
            "  --weight-decay F   (default 0.1) on --decay-groups linear (the default: the\n"
            "                     linear weights) or 2d (every parameter of 2+ dims, the\n"
            "                     embeddings too: nanoGPT's groups)\n"
            "  --clip F           gradient norm clipping (default 1; 0: none)\n"
            "  --threads K        kernel threads (default: NABLA_NUM_THREADS or the CPUs)\n"
            "  --dtype D          f32 (the default) or bf16: matrix products in bfloat16\n"
            "                     with f32 accumulation (autocast); weights, optimizer,\n"
            "                     softmax, layer norm and the loss stay f32; --sample\n"
            "                     reads bf16 copies of the weights (half the bytes)\n"
            "  --val FILE         a validation set (a file as --data), or\n"
            "  --val-split F      the last F of --data's tokens (0 < F < 1; nanoGPT: 0.1),\n"
            "                     training on the rest\n"
            "  --eval-interval N  with a validation set, or alone (train loss only): at step\n"
            "                     0, every N steps (default 250) and the last, a line \"step\n"
            "                     N: train loss X, val loss Y, lr Z (T ms)\": the mean over\n"
            "  --eval-iters K     K batches (default 20) drawn afresh from seed + 4 (train)\n"
            "                     and seed + 5 (val) each time\n"
            "  --save-best FILE   a checkpoint (as --save) at each evaluation of a lower val\n"
            "                     loss than all before\n"
            "  --save FILE        checkpoint at the end (and every --save-every N steps)\n"
            "  --load FILE        resume from a checkpoint of a run with the same flags\n"
            "  --export FILE      the model alone at the end, as --init reads it: llm.c's\n"
            "                     checkpoint, or Hugging Face's for a .safetensors name\n"
            "  --eval             no training: print \"loss X\", the mean cross-entropy of the\n"
            "                     validation set (else --data) cut into windows of T tokens\n"
            "                     (with --eval-iters K: its first K batches of B windows)\n"
            "  --dist             data-parallel on the mpirun ranks (a build with make MPI=1):\n"
            "                     --batch rows per rank, each rank its own rows and dropout\n"
            "  --zero             with --dist: AdamW's state sharded over the ranks (ZeRO-1)\n"
            "sampling:\n"
            "  --sample N         generate N tokens at the end\n"
            "  --prompt TEXT      text (byte model or --tokenizer) or token ids (e.g.\n"
            "                     \"50256 464\") to start from\n"
            "  --temperature F    (default 0.8)\n"
            "  --top-k K          sample among the K likeliest tokens (default 0: all)\n", f);
}

/* strict number parsing: the whole string */
static bool parse_i64(const char *s, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end || errno) return false;
    *out = v;
    return true;
}

static bool parse_f64(const char *s, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno || !isfinite(v)) return false;
    *out = v;
    return true;
}

/* What the run does. Training needs --steps, except for a fresh model
 * given nothing else to do (the default run trains the char model):
 * --sample and --eval never train a model they were not asked to. */
static int modes(options *o) {
    if (o->eval && o->train)
        return fail("--eval measures the loss of the model as it is and trains nothing: drop "
                    "--steps (or --eval)");
    if (o->train || o->eval || o->sample > 0) return 0;
    if ((o->init || o->load) && o->export) return 0; /* a conversion */
    if (o->init || o->load)
        return fail("--%s %s: nothing to do; --sample N samples from it, --eval measures its "
                    "loss, --steps N trains it (on --data)", o->init ? "init" : "load",
                    o->init ? o->init : o->load);
    o->train = true; /* the default run: train a fresh model */
    o->steps = 1000;
    return 0;
}

static const char *const schedule_names[] = {"constant", "cosine", "linear"}; /* sched's order */
static const char *const decay_group_names[] = {"linear", "2d"};

/* value's index in names[0 .. n), or -1 after a message naming flag. */
static int pick(const char *flag, const char *value, const char *const *names, int n) {
    for (int i = 0; i < n; i++)
        if (!strcmp(value, names[i])) return i;
    char list[256] = "";
    for (int i = 0; i < n; i++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s",
                 i == 0 ? "" : i == n - 1 ? " or " : ", ", names[i]);
    return fail("%s must be %s, got \"%s\"", flag, list, value);
}

/* The flags that name one of a few choices, and the values that cannot be. */
static int choices(options *o) {
    int s = pick("--lr-schedule", o->lr_schedule ? o->lr_schedule : "constant", schedule_names, 3);
    int g = pick("--decay-groups", o->decay_groups ? o->decay_groups : "linear",
                 decay_group_names, 2);
    if (s < 0 || g < 0) return -1;
    o->schedule = (sched)s;
    o->decay_2d = g == 1;
    if (o->val && o->val_split >= 0)
        return fail("--val %s and --val-split %g both give a validation set: give one", o->val,
                    o->val_split);
    if (o->val_split >= 0 && !(o->val_split > 0 && o->val_split < 1))
        return fail("--val-split F takes the last F of --data's tokens for validation: F must be "
                    "between 0 and 1 (nanoGPT's 90/10 split is 0.1), got %g", o->val_split);
    if (o->beta1 >= 1 || o->beta2 >= 1)
        return fail("--beta%d must be below 1, got %g", o->beta1 >= 1 ? 1 : 2,
                    o->beta1 >= 1 ? o->beta1 : o->beta2);
    return 0;
}

/* The training flags that only make sense together (after modes: o->train). */
static int training_flags(options *o) {
    bool validation = o->val || o->val_split > 0;
    o->evals = validation || o->eval_interval > 0;
    if (o->evals && !o->eval_interval) o->eval_interval = 250;
    if (o->evals && !o->eval_iters) o->eval_iters = 20;
    if (o->save_best && !validation)
        return fail("--save-best FILE keeps the model of the lowest validation loss: give a "
                    "validation set (--val FILE or --val-split F)");
    if (o->eval_iters && !o->evals)
        return fail("--eval-iters %lld: nothing evaluates; give --val FILE, --val-split F or "
                    "--eval-interval N (or --eval)", (long long)o->eval_iters);
    if (o->grad_accum > 1 && o->dist)
        return fail("--grad-accum with --dist is not supported: --dist averages the gradients "
                    "of every backward (give a larger --batch, or more ranks)");
    if (o->schedule == SCHED_CONSTANT) {
        if (o->min_lr >= 0 || o->lr_decay_steps)
            return fail("--%s shapes a decaying --lr-schedule (cosine or linear); the constant "
                        "one (the default) has none", o->min_lr >= 0 ? "min-lr" : "lr-decay-steps");
        return 0;
    }
    if (o->min_lr < 0) o->min_lr = o->lr / 10; /* nanoGPT's advice: min_lr = lr / 10 */
    if (o->min_lr > o->lr)
        return fail("--min-lr %g is above --lr %g: the schedule decays from --lr to --min-lr",
                    o->min_lr, o->lr);
    int64_t decay = o->lr_decay_steps ? o->lr_decay_steps : o->steps;
    if (decay < o->warmup)
        return fail("--lr-decay-steps %lld%s is less than --warmup %lld: the %s decay runs "
                    "from the end of the warmup to that step", (long long)decay,
                    o->lr_decay_steps ? "" : " (by default --steps)", (long long)o->warmup,
                    o->schedule == SCHED_COSINE ? "cosine" : "linear");
    o->lr_decay_steps = decay;
    return 0;
}

/* Without training: the training flags are refused, not ignored. */
static int eval_flags(const options *o) {
    const char *flag = o->eval_interval ? "--eval-interval" : o->save_best ? "--save-best"
                       : o->lr_schedule ? "--lr-schedule" : o->min_lr >= 0 ? "--min-lr"
                       : o->lr_decay_steps ? "--lr-decay-steps" : o->grad_accum > 1 ? "--grad-accum"
                                                                                    : NULL;
    if (flag)
        return fail("%s is a training flag: it needs --steps N%s", flag,
                    o->eval ? " (--eval scores the model as it is, once)" : "");
    if (!o->eval && o->eval_iters)
        return fail("--eval-iters %lld: nothing evaluates (give --eval)", (long long)o->eval_iters);
    if (!o->eval && (o->val || o->val_split > 0))
        return fail("--%s gives a validation set to training (--steps N) or --eval",
                    o->val ? "val" : "val-split");
    return 0;
}

/* 0, 1 (--help) or -1 after a message */
static int parse(int argc, char **argv, options *o) {
    *o = (options){.batch = 8, .lr = 3e-3, .warmup = 20, .weight_decay = 0.1,
                   .clip = 1.0, .temperature = 0.8, .seed = 1, .dropout = -1, .val_split = -1,
                   .min_lr = -1, .beta1 = 0.9, .beta2 = 0.95, .grad_accum = 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return 1;
        bool *flag = !strcmp(a, "--shuffle") ? &o->shuffle
                     : !strcmp(a, "--eval")  ? &o->eval
                     : !strcmp(a, "--dist")  ? &o->dist
                     : !strcmp(a, "--zero")  ? &o->zero
                     : !strcmp(a, "--no-bias") ? &o->no_bias
                                             : NULL;
        if (flag) {
            *flag = true;
            continue;
        }
        const char **text = !strcmp(a, "--config") ? &o->config
                            : !strcmp(a, "--init") ? &o->init
                            : !strcmp(a, "--data") ? &o->data
                            : !strcmp(a, "--save") ? &o->save
                            : !strcmp(a, "--export") ? &o->export
                            : !strcmp(a, "--load") ? &o->load
                            : !strcmp(a, "--prompt") ? &o->prompt
                            : !strcmp(a, "--dtype") ? &o->dtype
                            : !strcmp(a, "--tokenizer") ? &o->tokenizer
                            : !strcmp(a, "--val") ? &o->val
                            : !strcmp(a, "--save-best") ? &o->save_best
                            : !strcmp(a, "--lr-schedule") ? &o->lr_schedule
                            : !strcmp(a, "--decay-groups") ? &o->decay_groups
                                                     : NULL;
        struct {
            const char *name;
            int64_t *v, min;
        } ints[] = {
            {"--batch", &o->batch, 1},           {"--seq", &o->seq, 1},
            {"--steps", &o->steps, 0},           {"--threads", &o->threads, 1},
            {"--sample", &o->sample, 0},         {"--top-k", &o->top_k, 0},
            {"--save-every", &o->save_every, 0}, {"--warmup", &o->warmup, 0},
            {"--n-layer", &o->n_layer, 1},       {"--n-head", &o->n_head, 1},
            {"--n-embd", &o->n_embd, 1},         {"--block-size", &o->block_size, 1},
            {"--seed", &o->seed, 0},             {"--eval-interval", &o->eval_interval, 1},
            {"--eval-iters", &o->eval_iters, 1}, {"--lr-decay-steps", &o->lr_decay_steps, 1},
            {"--grad-accum", &o->grad_accum, 1},
        };
        struct {
            const char *name;
            double *v, min;
        } reals[] = {
            {"--lr", &o->lr, 0},     {"--weight-decay", &o->weight_decay, 0},
            {"--clip", &o->clip, 0}, {"--temperature", &o->temperature, 0},
            {"--dropout", &o->dropout, 0}, {"--val-split", &o->val_split, 0},
            {"--min-lr", &o->min_lr, 0},   {"--beta1", &o->beta1, 0},
            {"--beta2", &o->beta2, 0},
        };
        int ki = -1, kr = -1;
        for (int k = 0; k < (int)(sizeof ints / sizeof *ints); k++)
            if (!strcmp(a, ints[k].name)) ki = k;
        for (int k = 0; k < (int)(sizeof reals / sizeof *reals); k++)
            if (!strcmp(a, reals[k].name)) kr = k;
        if (!text && ki < 0 && kr < 0) return fail("unknown option %s (see --help)", a);
        if (i + 1 >= argc) return fail("%s needs a value (see --help)", a);
        const char *v = argv[++i];
        if (text) {
            *text = v;
        } else if (ki >= 0) {
            int64_t x;
            if (!parse_i64(v, &x) || x < ints[ki].min)
                return fail("%s needs an integer >= %lld, got \"%s\"", a,
                            (long long)ints[ki].min, v);
            *ints[ki].v = x;
            if (ints[ki].v == &o->steps) o->train = true;
        } else {
            double x;
            if (!parse_f64(v, &x) || x < reals[kr].min)
                return fail("%s needs a number >= %g, got \"%s\"", a, reals[kr].min, v);
            *reals[kr].v = x;
        }
    }
    if (o->temperature <= 0) return fail("--temperature must be > 0");
    if (o->dtype && strcmp(o->dtype, "f32") && strcmp(o->dtype, "bf16"))
        return fail("--dtype must be f32 or bf16, got \"%s\"", o->dtype);
    o->bf16 = o->dtype && !strcmp(o->dtype, "bf16");
    if (o->zero && !o->dist) return fail("--zero shards the optimizer over --dist's ranks: give --dist too");
    if (modes(o) != 0 || choices(o) != 0) return -1;
    return o->train ? training_flags(o) : eval_flags(o);
}

/* ------------------------------------------------------------ the model */
static int named_config(const char *name, nb_GPTConfig *c) {
    if (!strcmp(name, "char"))
        *c = (nb_GPTConfig){.vocab_size = 256, .block_size = 64, .n_layer = 4, .n_head = 4,
                            .n_embd = 128, .dropout = 0.0, .bias = true, .tie_weights = true};
    else if (!strcmp(name, "tiny"))
        *c = (nb_GPTConfig){.vocab_size = 256, .block_size = 32, .n_layer = 2, .n_head = 2,
                            .n_embd = 32, .dropout = 0.0, .bias = true, .tie_weights = true};
    else if (!strcmp(name, "gpt2"))
        *c = (nb_GPTConfig)NB_GPT2_CONFIG;
    else
        return fail("unknown --config \"%s\" (char, tiny or gpt2)", name);
    return 0;
}

/* Whether the file (of option flag) starts with the little-endian magic
 * (llm.c's files: checkpoint 20240326, tokens 20240520): 1, 0, or -1. */
static int file_magic(const char *flag, const char *path, uint32_t magic) {
    FILE *f = fopen(path, "rb");
    if (!f) return fail("%s: cannot open \"%s\": %s", flag, path, strerror(errno));
    unsigned char b[4] = {0};
    size_t n = fread(b, 1, 4, f);
    fclose(f);
    return n == 4 && ((uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
                      (uint32_t)b[3] << 24) == magic;
}

/* A run of tokens: the training part of --data, or the validation set. */
typedef struct {
    const int64_t *tok;
    int64_t n;
} tokens;

typedef struct {
    nb_GPTConfig cfg;
    const char *cfg_name;
    nb_params *ps;
    nb_GPT model;
    bool model_made;
    nb_optim *opt;     /* with --zero, this rank's shard optimizer (nb_ddp's) */
    nb_optim *held;    /* --zero with --save/--load, rank 0: the whole state, for checkpoints */
    nb_tokenizer *tok; /* --tokenizer, or NULL */
    nb_tensor *tokens; /* persistent, the whole --data file */
    int64_t n_tokens;
    nb_tensor *val_tokens; /* persistent, --val's file */
    tokens train_set, val_set; /* the tokens trained on, and the validation set (n 0: none) */
    int64_t *xb, *yb;  /* a batch's inputs and targets (B*T each) */
    int64_t *starts;   /* where each row of this rank's part of a step's batch starts */
    nb_rng data, drop, sampler;
    bool resumed;      /* --load: the evaluation at the step it resumes from was done */
    double best_val;   /* --save-best: the lowest validation loss so far */
    nb_tensor *best_val_t; /* ... in the checkpoint (trainer.best_val_loss), borrowed */
    dist_state ds;     /* --dist */
    int64_t step;      /* steps done */
    nb_params *trainer, *ckpt, *ckpt_alt; /* --save/--load */
    char default_data[4096];   /* DEFAULT_DATA, from here or from the repository */
} run;

/* --init's head count, the one size no tensor's shape shows: a file that
 * stores it (llm.c's header, the __metadata__ --export writes, Hugging
 * Face's config.json beside it) and --n-head must agree; a count guessed
 * (n_embd / 64) is said loudly, since a model run with a wrong count
 * computes something else without any error. 0, or -1 after a message. */
static int check_heads(const run *r, const options *o) {
    nb_GPTConfig file;
    nb_gpt_n_head_from from;
    if (nb_gpt_inspect(o->init, &file, &from) != 0) return fail("%s", err());
    if (from != NB_GPT_N_HEAD_GUESSED && o->n_head && o->n_head != file.n_head)
        return fail("--n-head %lld contradicts --init %s, whose model has n_head %lld (%s); "
                    "drop --n-head to take the file's", (long long)o->n_head, o->init,
                    (long long)file.n_head, from == NB_GPT_N_HEAD_FILE ? "stored in the file"
                    : "in the config.json beside it");
    if (from == NB_GPT_N_HEAD_GUESSED && !o->n_head && !o->config && r->ds.rank == 0)
        fprintf(stderr, "gpt: warning: --init %s does not say how many attention heads its "
                        "model has (no n_head in its __metadata__, no config.json beside it): "
                        "guessing n_head %lld (%s); if the model was trained with another "
                        "count it will compute something else: give --n-head N\n", o->init,
                (long long)file.n_head, file.n_embd % 64 == 0
                    ? "heads of 64 channels, as in every GPT-2 size" : "n_embd is not a "
                                                                         "multiple of 64");
    return 0;
}

static int make_model(run *r, const options *o) {
    r->ps = nb_params_new();
    if (!r->ps) return fail("out of memory");
    if (o->init && check_heads(r, o) != 0) return -1;
    bool changed = o->n_layer || o->n_head || o->n_embd || o->block_size || o->dropout >= 0;
    if (o->init && o->no_bias) { /* the file says whether its model has biases */
        nb_GPTConfig file;
        if (nb_gpt_config_of_file(o->init, &file) != 0) return fail("%s", err());
        if (file.bias)
            return fail("--no-bias contradicts --init %s, whose model has biases; drop --no-bias",
                        o->init);
    }
    if (o->init && !o->config && !changed) { /* the file's model, no weights drawn first */
        r->cfg_name = o->init;
        if (nb_gpt_from_file(&r->model, r->ps, o->init) != 0) return fail("%s", err());
        r->model_made = true;
        r->cfg = r->model.cfg;
        return 0;
    }
    if (o->config || !o->init) {
        r->cfg_name = o->config ? o->config : "char";
        if (named_config(r->cfg_name, &r->cfg) != 0) return -1;
    } else {
        r->cfg_name = o->init;
        if (nb_gpt_config_of_file(o->init, &r->cfg) != 0) return fail("%s", err());
    }
    if (o->n_layer) r->cfg.n_layer = o->n_layer;
    if (o->n_head) r->cfg.n_head = o->n_head;
    if (o->n_embd) r->cfg.n_embd = o->n_embd;
    if (o->block_size) r->cfg.block_size = o->block_size;
    if (o->dropout >= 0) r->cfg.dropout = o->dropout;
    if (o->no_bias) r->cfg.bias = false;
    nb_rng init;
    nb_rng_seed(&init, (uint64_t)o->seed);
    if (nb_gpt_init(&r->model, r->ps, &r->cfg, &init) != 0) return fail("%s", err());
    r->model_made = true;
    if (o->init) {
        int llmc = file_magic("--init", o->init, LLMC_MODEL_MAGIC);
        if (llmc < 0) return -1;
        int rc = llmc ? nb_gpt_load_llmc(&r->model, o->init) : nb_gpt_load_hf(&r->model, o->init);
        if (rc != 0) return fail("%s", err());
    }
    return 0;
}

/* --tokenizer: its vocabulary must fit the model's (a model may have more
 * rows than the tokenizer has tokens, as nanoGPT's 50304; never fewer). */
static int load_tokenizer(run *r, const options *o) {
    if (!o->tokenizer) return 0;
    if (!(r->tok = nb_tokenizer_load(o->tokenizer))) return fail("%s", err());
    int64_t tv = nb_tokenizer_vocab_size(r->tok), mv = r->cfg.vocab_size;
    if (tv > mv)
        return fail("--tokenizer %s has %lld tokens, more than the model's vocabulary of %lld "
                    "(config %s): its ids would not fit", o->tokenizer, (long long)tv,
                    (long long)mv, r->cfg_name);
    return 0;
}

/* ------------------------------------------------------------- the data */
/* A whole file in memory (malloc'ed, *len bytes), or NULL after a message. */
static char *read_file(const char *flag, const char *path, int64_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return fail("%s: cannot open \"%s\": %s", flag, path, strerror(errno)), NULL;
    char *buf = NULL;
    size_t n = 0, cap = 0, got;
    do {
        if (n == cap) {
            char *more = realloc(buf, cap = cap ? 2 * cap : 1 << 16);
            if (!more) return free(buf), fclose(f), fail("out of memory reading \"%s\"", path), NULL;
            buf = more;
        }
        got = fread(buf + n, 1, cap - n, f);
        n += got;
    } while (got > 0);
    int bad = ferror(f);
    fclose(f);
    if (bad) return free(buf), fail("%s: cannot read \"%s\"", flag, path), NULL;
    *len = (int64_t)n;
    return buf;
}

/* A text file through --tokenizer: a persistent 1-D NB_I64 tensor. */
static nb_tensor *tokenize_file(run *r, const char *flag, const char *path) {
    int64_t len = 0;
    char *text = read_file(flag, path, &len);
    if (!text) return NULL;
    /* counted first, then exactly that many ids: room for one id per byte
     * would take 8 times the text (a GPT-2 token is about 4 bytes) */
    int64_t n = nb_tokenizer_encode(r->tok, text, len, NULL, 0);
    int64_t *ids = n >= 0 ? malloc((size_t)(n > 0 ? n : 1) * sizeof *ids) : NULL;
    nb_tensor *t = NULL;
    if (ids) n = nb_tokenizer_encode(r->tok, text, len, ids, n);
    if (n < 0) fail("%s", err());
    else if (!ids) fail("out of memory tokenizing \"%s\"", path);
    else if (n == 0) fail("%s \"%s\" is empty", flag, path);
    else {
        nb_scope_begin();
        t = nb_persistent(nb_from_data(NB_I64, 1, &n, ids));
        nb_scope_end();
        if (!t) fail("%s", err());
    }
    free(ids);
    free(text);
    return t;
}

/* --data's or --val's file (flag): llm.c's token file as it is; text through
 * --tokenizer, or as bytes for a byte vocabulary, and refused for any other
 * vocabulary. A persistent 1-D NB_I64 tensor, or NULL after a message. */
static nb_tensor *load_token_file(run *r, const char *flag, const char *path, const char *hint) {
    int llmc = file_magic(flag, path, LLMC_TOKENS_MAGIC);
    if (llmc < 0) return NULL;
    nb_tensor *t = NULL;
    if (!llmc && r->tok)
        return tokenize_file(r, flag, path);
    if (!llmc && r->cfg.vocab_size != 256)
        return fail("%s \"%s\" is not an llm.c token file: read as text, its bytes would be "
                    "token ids 0-255 of a model whose vocabulary has %lld tokens; give "
                    "--tokenizer PATH to tokenize it (or write a token file: "
                    "build/examples/tokenize --tokenizer PATH --out FILE < TEXT)", flag, path,
                    (long long)r->cfg.vocab_size), NULL;
    if (!(t = nb_load_tokens(path, r->cfg.vocab_size))) fail("%s%s", err(), hint);
    return t;
}

/* A split must hold one row: T + 1 tokens. */
static int check_split(const char *what, const char *path, int64_t n, int64_t T) {
    if (n >= T + 1) return 0;
    return fail("%s%s\"%s\" has %lld tokens, fewer than --seq %lld + 1", what, *what ? " " : "",
                path, (long long)n, (long long)T);
}

/* --data, cut by --val-split (the first floor(n (1 - F)) tokens train, as
 * nanoGPT's int(n * 0.9), the rest validates), and --val. */
static int load_data(run *r, const options *o, int64_t T) {
    const char *path = o->data ? o->data : r->default_data;
    const char *hint = o->data ? "" : " (give the text to train on with --data FILE)";
    if (!(r->tokens = load_token_file(r, "--data", path, hint))) return -1;
    r->n_tokens = nb_numel(r->tokens);
    const int64_t *tok = nb_data(r->tokens);
    r->train_set = (tokens){tok, r->n_tokens};
    if (o->val_split > 0) {
        int64_t n = (int64_t)((double)r->n_tokens * (1.0 - o->val_split));
        r->train_set.n = n;
        r->val_set = (tokens){tok + n, r->n_tokens - n};
        if (check_split("the training part of", path, n, T) != 0 ||
            check_split("the validation part (--val-split) of", path, r->val_set.n, T) != 0)
            return -1;
    } else if (check_split("", path, r->n_tokens, T) != 0) {
        return -1;
    }
    if (o->val) {
        if (!(r->val_tokens = load_token_file(r, "--val", o->val, ""))) return -1;
        r->val_set = (tokens){nb_data(r->val_tokens), nb_numel(r->val_tokens)};
        if (check_split("--val", o->val, r->val_set.n, T) != 0) return -1;
    }
    return 0;
}

/* Row starts drawn from rng into starts: rows * ranks uniform draws, of
 * which this rank takes its rows, each a start in [0, n - T - 1] of a run
 * of n tokens. 0, or -1 after a message. */
static int draw_starts(run *r, nb_rng *rng, int64_t rows, int64_t n, int64_t T, int64_t *starts) {
    nb_tensor *draws = nb_rand(NB_F64, NB_SHAPE(rows * r->ds.ranks), rng);
    if (!draws) return fail("%s", err());
    const double *u = (const double *)nb_data(draws) + rows * r->ds.rank;
    for (int64_t j = 0; j < rows; j++) {
        int64_t start = (int64_t)(u[j] * (double)(n - T));
        starts[j] = start > n - T - 1 ? n - T - 1 : start;
    }
    nb_free(draws);
    return 0;
}

/* Where the rows of step `step` (from 0) start in the training tokens, into
 * r->starts: this rank's `rows` (--batch x --grad-accum) of the step's
 * rows * ranks. In file order row j of rank k starts at
 * ((step * ranks + k) * rows + j) * T (wrapping), with --shuffle anywhere:
 * micro-batch m of a step reads rows [m B, m B + B), so --grad-accum 2
 * --batch 6 reads the rows of --batch 12. */
static int step_starts(run *r, int64_t step, int64_t rows, int64_t T, bool shuffle) {
    tokens set = r->train_set;
    if (shuffle) return draw_starts(r, &r->data, rows, set.n, T, r->starts);
    for (int64_t j = 0; j < rows; j++)
        r->starts[j] = ((step * r->ds.ranks + r->ds.rank) * rows + j) * T % set.n;
    return 0;
}

/* Rows of T inputs and their T targets (shifted by one) from set, starting
 * at starts[0 .. rows), into r->xb and r->yb. */
static void fill_rows(run *r, tokens set, const int64_t *starts, int64_t rows, int64_t T) {
    for (int64_t row = 0; row < rows; row++)
        for (int64_t j = 0; j < T; j++) {
            r->xb[row * T + j] = set.tok[(starts[row] + j) % set.n];
            r->yb[row * T + j] = set.tok[(starts[row] + j + 1) % set.n];
        }
}

/* -------------------------------------------------------- --save, --load */
static const char *trainer_names[] = {"step", "data_rng", "drop_rng"};

/* The checkpoint's registry: the parameters, AdamW's state and the loop's
 * own buffers ((seed, offset) for each random stream), and with --save-best
 * the lowest val loss so far (a resumed run then saves where the straight
 * one does; it is in trainer, which --zero's ranks get from rank 0's file).
 * r->ckpt_alt is the other form: --load reads either, so a --save-best
 * checkpoint samples or evaluates without --save-best, and older
 * checkpoints (none have it) still resume. */
static int checkpoint_registry(run *r, const options *o) {
    nb_optim *opt = r->held ? r->held : r->opt;
    nb_params *plain = NULL, *best = nb_params_new();
    if (checkpoint_registry_make(r->ps, opt, trainer_names, 3, 1, &r->trainer, &plain) != 0)
        return nb_params_free(plain), nb_params_free(best), fail("%s", err());
    nb_scope_begin();
    r->best_val_t = nb_params_add_buffer(r->trainer, "best_val_loss", nb_scalar(NB_F64, INFINITY));
    nb_scope_end();
    r->ckpt = o->save_best ? best : plain;
    r->ckpt_alt = o->save_best ? plain : best;
    if (!best || !r->best_val_t || nb_params_add_all(best, "", plain) != 0 ||
        !nb_params_add_buffer(best, "trainer.best_val_loss", r->best_val_t))
        return fail("%s", err());
    return 0;
}

static int64_t *trainer_value(run *r, int i) { return checkpoint_value(r->trainer, i); }

static int save_checkpoint(run *r, const char *path) {
    *trainer_value(r, 0) = r->step;
    const nb_rng *rngs[2] = {&r->data, &r->drop};
    for (int i = 0; i < 2; i++) {
        int64_t *v = trainer_value(r, 1 + i);
        v[0] = (int64_t)rngs[i]->seed, v[1] = (int64_t)rngs[i]->offset;
    }
    trainer_value(r, 2)[0] -= DROP_SEED_STEP * r->ds.rank; /* rank 0's stream */
    *(double *)nb_data(r->best_val_t) = r->best_val;
    /* --zero: the owners' AdamW state to rank 0 first */
    if (dist_gather_state(&r->ds, r->held) != 0) return fail("%s", err());
    int rc = r->ds.rank == 0 ? nb_save(r->ckpt, path) : 0; /* rank 0 writes, every rank reads */
    if (dist_agree(&r->ds, "--save", rc) != 0) return fail("%s", err());
    return 0;
}

/* Every rank reads the file; with --zero only rank 0 does, and sends the
 * weights, the loop's state and each rank's part of AdamW's state. */
static int load_checkpoint(run *r, const char *path, bool quiet) {
    int rc = dist_sharded(&r->ds) && r->ds.rank != 0 ? 0 : nb_load(r->ckpt, path);
    if (rc != 0) { /* the other form (with or without trainer.best_val_loss)? */
        char first[2048];
        snprintf(first, sizeof first, "%s", err());
        rc = nb_load(r->ckpt_alt, path);
        if (rc != 0) nb_report_error("%s", first);
    }
    if (rc != 0) {
        struct stat st; /* a file that is there but does not fit: a hint */
        bool there = stat(path, &st) == 0 && S_ISREG(st.st_mode);
        nb_report_error("%s%s", err(), there ? " (--load needs the model flags the checkpoint "
                                               "was made with)" : "");
    }
    if (dist_agree(&r->ds, "--load", rc) != 0) return fail("%s", err());
    if (dist_share_loaded(&r->ds, r->ps, r->trainer, r->held) != 0) return fail("%s", err());
    r->step = *trainer_value(r, 0);
    nb_rng *rngs[2] = {&r->data, &r->drop};
    for (int i = 0; i < 2; i++) {
        const int64_t *v = trainer_value(r, 1 + i);
        *rngs[i] = (nb_rng){.seed = (uint64_t)v[0], .offset = (uint64_t)v[1]};
    }
    r->drop.seed += DROP_SEED_STEP * (uint64_t)r->ds.rank;
    r->best_val = *(const double *)nb_data(r->best_val_t);
    r->resumed = true;
    if (!quiet) printf("resumed from %s: %lld steps done\n", path, (long long)r->step);
    return 0;
}

/* --export: the model alone, as --init reads it: Hugging Face's
 * model.safetensors for a name ending in .safetensors, else llm.c's
 * checkpoint. Rank 0 writes; a failure stops every rank. */
static int export_model(run *r, const char *path) {
    bool hf = ends_with(path, ".safetensors");
    int rc = r->ds.rank != 0 ? 0 : hf ? nb_gpt_save_hf(&r->model, path)
                                      : nb_gpt_save_llmc(&r->model, path);
    if (dist_agree(&r->ds, "--export", rc) != 0) return fail("%s", err());
    printf("exported %s (%s; --init reads it)\n", path,
           hf ? "Hugging Face's model.safetensors" : "llm.c's checkpoint");
    return 0;
}

/* ------------------------------------------------------------- training */
/* The cross-entropy of predicting every token by its frequency in the data
 * (nats): a model below it has learned more than which tokens are common. */
static double unigram_loss(const run *r) {
    int64_t V = r->cfg.vocab_size, N = r->n_tokens;
    int64_t *count = calloc((size_t)V, sizeof *count);
    if (!count || N == 0) return (free(count), NAN);
    const int64_t *tok = nb_data(r->tokens);
    for (int64_t i = 0; i < N; i++) count[tok[i]]++;
    double h = 0;
    for (int64_t v = 0; v < V; v++)
        if (count[v]) h -= (double)count[v] / (double)N * log((double)count[v] / (double)N);
    free(count);
    return h;
}

/* The progress line on stderr, when it is a terminal and this is no MPI
 * rank (progress_to; stdout gets the step lines; the line is cleared before
 * each is printed). */
typedef struct {
    bool tty, shown;
    int64_t first, last; /* steps: first to run, last */
    double start, drawn;
} bar;

static void bar_clear(bar *b) {
    if (!b->shown) return;
    fputs("\r\x1b[K", stderr);
    fflush(stderr);
    b->shown = false;
}

static void bar_draw(bar *b, int64_t step, double loss, double tokens_per_step) {
    double t = progress_now();
    if (!b->tty || (b->shown && t - b->drawn < 0.1)) return;
    double done = (double)(step - b->first + 1), el = t - b->start;
    char eta[32], line[160];
    snprintf(line, sizeof line, "step %lld/%lld  loss %.4f  %.0f tok/s  ETA %s",
             (long long)step, (long long)b->last, loss, el > 0 ? done * tokens_per_step / el : 0,
             progress_duration(el / done * (double)(b->last - step), eta));
    fprintf(stderr, "\r\x1b[K%.*s", progress_width(), line);
    fflush(stderr);
    b->shown = true;
    b->drawn = t;
}

/* The learning rate of step `step` (from 0): a linear --warmup (nanoGPT's
 * lr (step + 1) / (warmup + 1)), then --lr (constant), or a decay to
 * --min-lr at --lr-decay-steps and --min-lr after: cosine (nanoGPT's
 * get_lr) or linear. A function of the step alone, so --load resumes it;
 * -1 after a message. */
static double lr_at(const options *o, int64_t step) {
    double lr = o->lr;
    if (o->schedule == SCHED_COSINE)
        lr = nb_lr_cosine(step, o->warmup, o->lr_decay_steps, o->lr, o->min_lr);
    else if (step < o->warmup)
        lr = o->lr * (double)(step + 1) / (double)(o->warmup + 1);
    else if (o->schedule == SCHED_LINEAR && step >= o->lr_decay_steps)
        lr = o->min_lr;
    else if (o->schedule == SCHED_LINEAR && o->lr > 0)
        lr = nb_lr_linear(step - o->warmup, 1.0, o->min_lr / o->lr,
                          o->lr_decay_steps - o->warmup, o->lr);
    if (lr < 0) fail("step %lld: %s", (long long)step + 1, err());
    return lr;
}

/* The mean cross-entropy of r->xb, r->yb (rows x T): a 0-d tensor of the
 * scope, or NULL with nabla's message. Training draws dropout from r->drop. */
static nb_tensor *batch_loss(run *r, const options *o, int64_t rows, int64_t T, bool training) {
    nb_tensor *x = nb_from_data(NB_I64, NB_SHAPE(rows, T), r->xb);
    nb_tensor *y = nb_from_data(NB_I64, NB_SHAPE(rows, T), r->yb);
    if (o->bf16) nb_autocast_begin(NB_BF16);
    nb_tensor *loss = nb_gpt_loss(&r->model, x, y, training, training ? &r->drop : NULL);
    if (o->bf16) nb_autocast_end();
    return loss;
}

/* The micro-batches' forward and backward, the gradients accumulating:
 * each loss scaled by 1/A (nanoGPT's), so the gradient is that of the mean
 * over the step's rows. 0 with *loss the mean of the A losses, or -1. */
static int micro_batches(run *r, const options *o, int64_t B, int64_t T, double *loss) {
    int64_t A = o->grad_accum;
    double sum = 0;
    for (int64_t m = 0; m < A; m++) {
        nb_scope_begin();
        fill_rows(r, r->train_set, r->starts + m * B, B, T);
        nb_tensor *l = batch_loss(r, o, B, T, true);
        nb_tensor *scaled = A > 1 ? nb_mul_scalar(l, 1.0 / (double)A) : l;
        int rc = scaled && nb_backward(scaled) == 0 ? 0 : -1;
        if (rc == 0) sum += nb_item(l);
        nb_scope_end();
        if (rc != 0) return -1;
    }
    *loss = sum / (double)A;
    return 0;
}

/* One step on the batch of r->step; its loss, or NAN after a message. */
static double train_step(run *r, const options *o, int64_t B, int64_t T) {
    double value = NAN, lr = lr_at(o, r->step);
    if (lr < 0) return NAN;
    nb_optim_set_lr(r->opt, lr);
    nb_scope_begin();
    if (step_starts(r, r->step, B * o->grad_accum, T, o->shuffle) == 0) {
        int rc = micro_batches(r, o, B, T, &value);
        if (rc != 0) value = NAN;
        rc = dist_sync(&r->ds, rc, &value); /* every rank, even after its own failure */
        if (rc == 0 && (o->clip <= 0 || nb_clip_grad_norm(r->ps, o->clip) >= 0)) {
            if (isnan(value))
                fail("step %lld: the loss is NaN (a smaller --lr may help)",
                     (long long)r->step + 1);
            if (dist_optim_step(&r->ds, r->opt) != 0) {
                fail("step %lld failed: %s", (long long)r->step + 1, err());
                value = NAN;
            }
        } else {
            fail("step %lld failed: %s", (long long)r->step + 1, err());
            value = NAN;
        }
    }
    nb_scope_end();
    return value;
}

/* The mean loss of --eval-iters batches of B rows drawn from set by a
 * stream seeded afresh with seed (the same batches at every evaluation;
 * training's streams untouched), no grad, no dropout. With --dist each rank
 * scores its B of each batch's B * ranks rows, and the mean is the ranks'.
 * NAN after a message (on every rank when one failed). */
static double split_loss(run *r, const options *o, tokens set, uint64_t seed, int64_t B,
                         int64_t T) {
    nb_rng rng;
    nb_rng_seed(&rng, seed);
    double sum = 0;
    for (int64_t k = 0; k < o->eval_iters && !isnan(sum); k++) {
        nb_scope_begin();
        nb_tensor *loss = NULL;
        if (draw_starts(r, &rng, B, set.n, T, r->starts) == 0) {
            fill_rows(r, set, r->starts, B, T);
            loss = batch_loss(r, o, B, T, false);
        }
        sum += loss ? nb_item(loss) : NAN;
        nb_scope_end();
    }
    double mean = sum / (double)o->eval_iters;
    dist_mean(&r->ds, &mean);
    return mean;
}

/* The evaluation after step r->step (nanoGPT's estimate_loss): one line,
 * "step N: train loss X, val loss Y, lr Z (T ms)" (not a step line: tools
 * read those), lr the rate of the next step; with --save-best, the
 * checkpoint when the validation loss is the lowest so far. 0 or -1. */
static int eval_point(run *r, const options *o, int64_t B, int64_t T) {
    double t0 = progress_now(), val = NAN;
    nb_set_grad_enabled(false);
    double train = split_loss(r, o, r->train_set, (uint64_t)o->seed + 4, B, T);
    if (r->val_set.n && !isnan(train))
        val = split_loss(r, o, r->val_set, (uint64_t)o->seed + 5, B, T);
    nb_set_grad_enabled(true);
    if (isnan(train) || (r->val_set.n && isnan(val)))
        return fail("the evaluation at step %lld failed: %s", (long long)r->step, err());
    double lr = lr_at(o, r->step);
    if (lr < 0) return -1;
    printf("step %lld: train loss %.6f", (long long)r->step, train);
    if (r->val_set.n) printf(", val loss %.6f", val);
    printf(", lr %g (%.1f ms)\n", lr, 1000 * (progress_now() - t0));
    fflush(stdout);
    if (!o->save_best || !(val < r->best_val)) return 0;
    r->best_val = val;
    if (save_checkpoint(r, o->save_best) != 0) return -1;
    printf("saved %s (step %lld): the lowest val loss so far\n", o->save_best,
           (long long)r->step);
    return 0;
}

/* Evaluations at step 0, every --eval-interval steps and at the last step;
 * not at the step --load resumed from (the run that saved it evaluated). */
static bool eval_due(const run *r, const options *o) {
    return o->evals && (r->step % o->eval_interval == 0 || r->step == o->steps);
}

static int train(run *r, const options *o, int64_t B, int64_t T) {
    bar b = {.tty = progress_to(stderr), .first = r->step + 1, .last = o->steps,
             .start = progress_now()};
    double start = b.start, recent = 0;
    int64_t n_recent = 0;
    if (!r->resumed && eval_due(r, o) && eval_point(r, o, B, T) != 0) return -1;
    while (r->step < o->steps) {
        double t0 = progress_now();
        double loss = train_step(r, o, B, T);
        if (isnan(loss)) return bar_clear(&b), -1;
        r->step++;
        double ms = 1000 * (progress_now() - t0);
        bar_clear(&b);
        printf("step %lld: loss %.6f (%.1f ms)\n", (long long)r->step, loss, ms);
        fflush(stdout);
        if (o->steps - r->step < 10) recent += loss, n_recent++;
        if (eval_due(r, o) && eval_point(r, o, B, T) != 0) return -1;
        if (o->save && o->save_every > 0 && r->step % o->save_every == 0 && r->step < o->steps &&
            save_checkpoint(r, o->save) != 0)
            return -1;
        bar_draw(&b, r->step, loss, (double)(B * T * o->grad_accum));
    }
    bar_clear(&b);
    if (n_recent > 0)
        printf("trained to step %lld in %.1f s; mean loss of the last %lld steps %.4f (guessing "
               "uniformly: %.2f; from the data's token frequencies alone: %.2f)\n",
               (long long)r->step, progress_now() - start, (long long)n_recent,
               recent / (double)n_recent, log((double)r->cfg.vocab_size), unigram_loss(r));
    if (o->save) {
        if (save_checkpoint(r, o->save) != 0) return -1;
        printf("saved %s (step %lld)\n", o->save, (long long)r->step);
    }
    return 0;
}

/* --eval: the mean cross-entropy over every target token of the
 * validation set (--val, --val-split's part) or else --data: the tokens cut
 * into W = floor((n - 1) / T) windows, window w the inputs [w T, w T + T)
 * and the targets one further, B windows a batch (the last may have fewer);
 * with --eval-iters K the first K batches only. No grad, no dropout. */
static int evaluate(run *r, const options *o, int64_t B, int64_t T) {
    tokens set = r->val_set.n ? r->val_set : r->train_set;
    int64_t W = (set.n - 1) / T, batches = (W + B - 1) / B;
    if (o->eval_iters && o->eval_iters < batches) batches = o->eval_iters, W = batches * B;
    double sum = 0; /* of each batch's mean times its rows */
    nb_set_grad_enabled(false);
    for (int64_t k = 0; k < batches && !isnan(sum); k++) {
        int64_t rows = W - k * B < B ? W - k * B : B;
        for (int64_t j = 0; j < rows; j++) r->starts[j] = (k * B + j) * T;
        nb_scope_begin();
        fill_rows(r, set, r->starts, rows, T);
        nb_tensor *loss = batch_loss(r, o, rows, T, false);
        sum += loss ? nb_item(loss) * (double)rows : NAN;
        nb_scope_end();
    }
    nb_set_grad_enabled(true);
    if (isnan(sum)) return fail("%s", err());
    fprintf(stderr, "gpt: --eval: %lld windows of %lld tokens (%lld targets) in %lld batch(es), "
            "from %s\n", (long long)W, (long long)T, (long long)(W * T), (long long)batches,
            o->val ? o->val : r->val_set.n ? "the validation part of --data" : "--data");
    printf("loss %.6f\n", sum / (double)W);
    return 0;
}

/* ------------------------------------------------------------- sampling */
/* the 256 byte values: text in and out; with --tokenizer text in and out
 * through it; other vocabularies take and print ids */
static bool byte_vocab(const run *r) { return r->cfg.vocab_size == 256 && !r->tok; }

static bool print_token(int64_t token, void *user) {
    const run *r = user;
    int64_t len = 0;
    const char *bytes = r->tok ? nb_tokenizer_token(r->tok, token, &len) : NULL;
    if (bytes) fwrite(bytes, 1, (size_t)len, stdout);
    else if (byte_vocab(r)) putchar((int)token);
    else printf(" %lld", (long long)token); /* also a model row the tokenizer lacks */
    fflush(stdout);
    return true;
}

/* --prompt as tokens (malloc'ed, *n of them) */
static int64_t *prompt_tokens(const run *r, const options *o, int64_t *n) {
    const char *p = o->prompt;
    size_t len = p ? strlen(p) : 0;
    int64_t *t = malloc((len + 1) * sizeof *t);
    if (!t) return fail("out of memory"), NULL;
    *n = 0;
    int64_t eot = r->tok ? nb_tokenizer_eot(r->tok) : -1;
    if (!p || !*p) {
        t[(*n)++] = byte_vocab(r) ? '\n' : eot >= 0 ? eot : r->cfg.vocab_size == 50257 ? 50256 : 0;
    } else if (r->tok) {
        *n = nb_tokenizer_encode(r->tok, p, (int64_t)len, t, (int64_t)len);
        if (*n < 0) return free(t), fail("--prompt: %s", err()), NULL;
    } else if (byte_vocab(r)) {
        for (size_t i = 0; i < len; i++) t[(*n)++] = (unsigned char)p[i];
    } else {
        for (const char *s = p; *s;) {
            char *end;
            if (*s == ' ' || *s == ',') {
                s++;
                continue;
            }
            long long v = strtoll(s, &end, 10);
            if (end == s || v < 0) {
                free(t);
                return fail("--prompt for a vocabulary of %lld takes token ids (e.g. \"50256 "
                            "464\"), got \"%s\"; give --tokenizer PATH for text",
                            (long long)r->cfg.vocab_size, p), NULL;
            }
            t[(*n)++] = v;
            s = end;
        }
    }
    return t;
}

static int sample(run *r, const options *o) {
    int64_t n_prompt = 0;
    int64_t *prompt = prompt_tokens(r, o, &n_prompt);
    if (!prompt) return -1;
    printf("sample (%lld tokens, temperature %g, top-k %lld):\n", (long long)o->sample,
           o->temperature, (long long)o->top_k);
    for (int64_t i = 0; i < n_prompt; i++)
        if (o->prompt && *o->prompt) print_token(prompt[i], r); /* the default prompt unshown */
    /* bf16: the weights read as bf16 copies (half the bytes per token) */
    nb_gpt_sample_opts so = {.temperature = o->temperature, .top_k = o->top_k,
                             .dtype = o->bf16 ? NB_BF16 : 0};
    if (o->bf16) nb_autocast_begin(NB_BF16);
    /* print_token takes the tokens as they come: nothing holds all of them */
    int64_t n = nb_gpt_generate(&r->model, prompt, n_prompt, o->sample, &so, &r->sampler, NULL,
                                print_token, r);
    if (o->bf16) nb_autocast_end();
    printf("\n");
    free(prompt);
    return n < 0 ? fail("%s", err()) : 0;
}

/* DEFAULT_DATA from the current directory (the repository's root), else
 * from the program's: build/examples/gpt is two levels below the root. */
static void find_default_data(run *r, const char *argv0) {
    snprintf(r->default_data, sizeof r->default_data, "%s", DEFAULT_DATA);
    const char *slash = strrchr(argv0, '/');
    if (access(DEFAULT_DATA, R_OK) == 0 || !slash) return;
    char other[sizeof r->default_data];
    int n = snprintf(other, sizeof other, "%.*s/../../%s", (int)(slash - argv0), argv0,
                     DEFAULT_DATA);
    if (n > 0 && (size_t)n < sizeof other && access(other, R_OK) == 0)
        memcpy(r->default_data, other, (size_t)n + 1);
}

/* ------------------------------------------------------------ optimizer */
/* AdamW (--beta1, --beta2) over ps or a part of it, decaying the linear
 * weights only (nb_gpt_decays: minGPT's groups), or with --decay-groups 2d
 * every parameter of 2 or more dims, embeddings included (nanoGPT's
 * configure_optimizers), not the 1-D ones (biases, layer norms). */
typedef struct {
    const run *r;
    const options *o;
} adamw_ctx;

static nb_optim *adamw(nb_params *ps, void *ctx) {
    const run *r = ((const adamw_ctx *)ctx)->r;
    const options *o = ((const adamw_ctx *)ctx)->o;
    nb_optim *opt = nb_adamw(ps, o->lr, o->beta1, o->beta2, 1e-8, 0.0);
    for (int i = 0; opt && i < nb_params_count(ps); i++) {
        const char *name;
        nb_tensor *p = nb_params_at(ps, i, &name);
        int decays = o->decay_2d ? nb_ndim(p) >= 2 : nb_gpt_decays(&r->model, name);
        if (decays < 0 || (decays && nb_optim_set_weight_decay(opt, name, o->weight_decay) != 0))
            nb_optim_free(opt), opt = NULL;
    }
    return opt;
}

/* AdamW over the whole model; with --dist the model's data parallelism
 * first, and with --zero the AdamW of this rank's shard, plus, on rank 0
 * for --save/--save-best/--load, an AdamW over everything that holds the whole state of
 * a checkpoint (it never steps). 0 or -1 with nabla's message. */
static int make_optimizer(run *r, const options *o) {
    adamw_ctx ctx = {r, o};
    if (dist_attach(&r->ds, r->ps) != 0) return -1;
    if (!o->zero) return (r->opt = adamw(r->ps, &ctx)) ? 0 : -1;
    if (!(r->opt = dist_shard(&r->ds, adamw, &ctx))) return -1;
    if ((o->save || o->load || o->save_best) && r->ds.rank == 0 && !(r->held = adamw(r->ps, &ctx)))
        return -1;
    return 0;
}

/* The training settings beyond the data line: the schedule, AdamW, the
 * step's micro-batches, and the evaluations. */
static void print_settings(const run *r, const options *o, int64_t B, int64_t T) {
    printf("training: lr %s %g", schedule_names[o->schedule], o->lr);
    if (o->schedule != SCHED_CONSTANT)
        printf(" -> %g at step %lld", o->min_lr, (long long)o->lr_decay_steps);
    printf(" after %lld warmup steps, AdamW betas %g/%g, weight decay on %s, clip %g; %lld "
           "micro-batch(es) of %lld x %lld tokens per step%s\n", (long long)o->warmup, o->beta1,
           o->beta2, o->decay_2d ? "2-D parameters" : "linear weights", o->clip,
           (long long)o->grad_accum, (long long)B, (long long)T, r->cfg.bias ? "" : "; no biases");
    if (!o->evals) return;
    printf("eval: every %lld steps, %lld batches of %lld x %lld tokens per split; train %lld "
           "tokens", (long long)o->eval_interval, (long long)o->eval_iters, (long long)B,
           (long long)T, (long long)r->train_set.n);
    if (o->val) printf(", val %lld tokens (%s)", (long long)r->val_set.n, o->val);
    else if (r->val_set.n) printf(", val %lld tokens (the last %g of --data)",
                                  (long long)r->val_set.n, o->val_split);
    else printf(" (no validation set)");
    if (o->save_best) printf("; the best to %s", o->save_best);
    printf("\n");
}

/* ---------------------------------------------------------------- main */
static void teardown(run *r) {
    nb_params_free(r->ckpt);
    nb_params_free(r->ckpt_alt);
    nb_params_free(r->trainer);
    nb_optim_free(r->held);
    if (!dist_sharded(&r->ds)) nb_optim_free(r->opt);
    if (r->model_made) nb_gpt_free(&r->model);
    nb_params_free(r->ps);
    nb_free(r->tokens);
    nb_free(r->val_tokens);
    free(r->starts);
    nb_tokenizer_free(r->tok);
    free(r->xb);
    free(r->yb);
}

static int run_all(run *r, const options *o) {
    dist_threads(&r->ds, o->threads);
    if (o->threads > 0 && nb_num_threads() != o->threads) return fail("%s", err());
    if (o->save &&
        dist_agree(&r->ds, "--save", r->ds.rank == 0 ? writable_dir("--save", o->save) : 0) != 0)
        return fail("%s", err());
    if (o->export &&
        dist_agree(&r->ds, "--export", r->ds.rank == 0 ? writable_dir("--export", o->export) : 0))
        return fail("%s", err());
    if (o->save_best && dist_agree(&r->ds, "--save-best", r->ds.rank == 0 ?
                                   writable_dir("--save-best", o->save_best) : 0) != 0)
        return fail("%s", err());
    if (make_model(r, o) != 0 || load_tokenizer(r, o) != 0) return -1;
    if (o->export && !r->cfg.bias && !ends_with(o->export, ".safetensors"))
        return fail("--export %s: llm.c's checkpoints hold biases and this model has none "
                    "(--no-bias); give a .safetensors name (Hugging Face's format)", o->export);
    int64_t B = o->batch, T = o->seq ? o->seq : r->cfg.block_size;
    if (T > r->cfg.block_size)
        return fail("--seq %lld is longer than the model's context (block size %lld)",
                    (long long)T, (long long)r->cfg.block_size);
    nb_rng_seed(&r->data, (uint64_t)o->seed + 1);
    nb_rng_seed(&r->drop, (uint64_t)o->seed + 2 + DROP_SEED_STEP * (uint64_t)r->ds.rank);
    nb_rng_seed(&r->sampler, (uint64_t)o->seed + 3); /* (+4, +5: evaluations' streams) */
    r->best_val = INFINITY;
    if (make_optimizer(r, o) != 0) return fail("%s", err());
    const nb_GPTConfig *c = &r->cfg;
    if (!o->eval)
        printf("gpt: config %s: vocab %lld, context %lld, %lld layers, %lld heads, n_embd %lld, "
               "%.2fM parameters\n", r->cfg_name, (long long)c->vocab_size,
               (long long)c->block_size, (long long)c->n_layer, (long long)c->n_head,
               (long long)c->n_embd, (double)nb_params_numel(r->ps) / 1e6);
    if ((o->save || o->load || o->save_best) && checkpoint_registry(r, o) != 0) return -1;
    if (o->load && load_checkpoint(r, o->load, o->eval) != 0) return -1;
    bool train_now = o->train && r->step < o->steps;
    if (!o->train && !o->eval && !o->init && !o->load)
        fprintf(stderr, "gpt: warning: sampling from an untrained model (random weights; give "
                        "--steps N to train it first, or --init FILE)\n");
    else if (!o->train && !o->eval && o->export) /* say what it does: converts, maybe samples */
        printf("gpt: no training (no --steps): converting %s to %s as it is%s\n",
               o->load ? o->load : o->init, o->export, o->sample > 0 ? ", then sampling from it"
                                                                     : "");
    else if (!o->train && !o->eval)
        printf("gpt: no training (no --steps): sampling from %s as it is\n",
               o->load ? o->load : o->init);
    if (o->eval || train_now) {
        if (B > INT64_MAX / 8 / T / o->grad_accum)
            return fail("--batch %lld x --seq %lld x --grad-accum %lld is too large", (long long)B,
                        (long long)T, (long long)o->grad_accum);
        r->xb = malloc((size_t)(B * T) * sizeof *r->xb);
        r->yb = malloc((size_t)(B * T) * sizeof *r->yb);
        r->starts = malloc((size_t)(B * o->grad_accum) * sizeof *r->starts);
        if (!r->xb || !r->yb || !r->starts) return fail("out of memory for a batch of %lld x %lld",
                                          (long long)B, (long long)T);
        if (load_data(r, o, T) != 0) return -1;
    }
    if (o->eval && evaluate(r, o, B, T) != 0) return -1;
    if (train_now) {
        printf("data %s: %lld tokens; batch %lld x %lld tokens (%s), AdamW lr %g, weight decay "
               "%g, %d thread(s); uniform guessing has loss ln %lld = %.4f\n",
               o->data ? o->data : r->default_data, (long long)r->n_tokens, (long long)B,
               (long long)T, o->shuffle ? "shuffled" : "file order", o->lr, o->weight_decay,
               nb_num_threads(), (long long)c->vocab_size, log((double)c->vocab_size));
        print_settings(r, o, B, T);
        fflush(stdout);
        if (train(r, o, B, T) != 0) return -1;
        dist_report(&r->ds);
    }
    if (o->export && export_model(r, o->export) != 0) return -1;
    if (o->sample > 0 && sample(r, o) != 0) return -1;
    return 0;
}

int main(int argc, char **argv) {
    options o;
    int p = parse(argc, argv, &o);
    if (p > 0) usage(stdout, argv[0]);
    if (p != 0) return p > 0 ? 0 : 1;
    run r = {0};
    char msg[512];
    if (dist_start(&r.ds, o.dist, &argc, &argv, msg, sizeof msg) != 0) return fail("%s", msg), 2;
    find_default_data(&r, argv[0]);
    int rc = run_all(&r, &o);
    teardown(&r);
    dist_stop(&r.ds);
    return rc == 0 ? 0 : 1;
}
