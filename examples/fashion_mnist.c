/* fashion_mnist.c: Fashion-MNIST's "2 Conv+pooling" benchmark network
 * (TensorFlow's layers tutorial; 0.916 in the dataset's benchmark table),
 * trained end to end on Zalando's 60,000 training images and checked on the
 * 10,000 test images.
 *
 *   x (N, 1, 28, 28) in [0, 1]
 *   conv 5x5, 32, padding "same" [batch norm] ReLU, max-pool 2  -> (N, 32, 14, 14)
 *   conv 5x5, 64, padding "same" [batch norm] ReLU, max-pool 2  -> (N, 64, 7, 7)
 *   flatten (NCHW order) -> dense 1024, ReLU -> dropout 0.4 -> dense 10
 *
 * Cross-entropy with label smoothing 0.1 (torch's label_smoothing: the
 * target is 0.9 on the true class plus 0.01 on each class), Adam (lr 1e-3,
 * 2e-3 with --bn; betas 0.9/0.999, eps 1e-8, no weight decay) with a cosine
 * learning rate (torch's CosineAnnealingLR with T_max = 10 epochs of steps,
 * stepped every step: step t from 0 trains at lr * (1 + cos(pi t / T)) / 2,
 * down to 0 at the end of epoch 10: nb_lr_cosine_annealing, a function of
 * the step alone, so a resumed run needs no schedule state), batch 64 (the last batch of an epoch
 * is the 32 left over: 938 steps), the training set shuffled every epoch,
 * pixels divided by 255 and nothing else (no augmentation, no
 * normalization). Weights and biases start as torch.nn's defaults,
 * U(+-1/sqrt(fan_in)). The tutorial's plain SGD at 1e-3 needs far more than
 * 10 epochs; Adam at 1e-3 reaches the table's figure within 10, the decaying
 * rate lets the last epochs settle instead of wandering around one
 * accuracy, and batch norm, which takes the doubled rate, reaches 0.93 with
 * the smoothing (docs/fashion.md has the runs). bench/torch_fashion.py is
 * the same program in PyTorch 1.13.
 *
 *   build/examples/fashion_mnist [--data DIR] [--epochs 10] [--bn] [--batch 64]
 *       [--lr 0.001 (--bn: 0.002)] [--schedule cosine|exp] [--cosine-epochs 10]
 *       [--lr-decay 0.7] [--label-smoothing 0.1] [--weight-decay 0] [--seed 1]
 *       [--threads N] [--save FILE] [--load FILE] [--svg FILE] [--train-limit N]
 *       [--test-limit N]
 *
 * --cosine-epochs N is the cosine's length T in epochs, whatever --epochs
 * is (past it the rate rises again, as torch's). --schedule exp is the
 * previous recipe: epoch e trains at lr * lr_decay^(e-1) (torch's
 * ExponentialLR stepped per epoch, nb_lr_exponential, --lr-decay 0.7). --weight-decay F > 0 trains with AdamW
 * (decoupled decay, torch's convention: every step multiplies each
 * parameter by 1 - lr * F) instead of Adam.
 *
 * --data DIR holds the four IDX files, unpacked (make fashion installs
 * Debian's dataset-fashion-mnist and gunzips them into
 * build/data/fashion-mnist, the default). --bn puts batch norm
 * (nb_BatchNorm, 2d) after each convolution, before its ReLU: batch
 * statistics in training, the running ones when testing. --train-limit and
 * --test-limit use only the first N images of each set (quick runs).
 *
 * After every epoch: the mean training loss, the test accuracy (eval mode:
 * no dropout, batch norm's running statistics) and the epoch's time. At the
 * end: the confusion matrix of the test set (rows: the true class), an SVG
 * of misclassified test images (--svg FILE, default
 * fashion_misclassified.svg in the current folder; make fashion writes
 * build/fashion_misclassified.svg) and, last, the result:
 *
 *   test accuracy 0.9163 (9163/10000)
 *
 * --save FILE writes a checkpoint (safetensors) at the end of every epoch:
 * the parameters and batch norm's buffers under PyTorch's state_dict names,
 * Adam's state under "optim." and the loop's own state under "trainer."
 * (epochs and steps done, the shuffling and dropout random streams). --load
 * FILE resumes from one: given the same flags, the run goes on exactly as if
 * it had never stopped. On a terminal a progress line shows the epoch's steps.
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
#include "progress.h"
#include "svg.h"

#define SIDE 28
#define PIXELS (SIDE * SIDE)
#define CLASSES 10
#define EVAL_BATCH 500
#define SVG_MAX 100 /* misclassified images drawn */

static const char *const CLASS_NAMES[CLASSES] = {"T-shirt/top", "Trouser", "Pullover", "Dress",
                                                 "Coat",        "Sandal",  "Shirt",    "Sneaker",
                                                 "Bag",         "Ankle boot"};

typedef struct {
    const char *data, *save, *load, *svg;
    int64_t epochs, batch, threads, train_limit, test_limit;
    /* cosine: step t (from 0) trains at lr * (1 + cos(pi t / T)) / 2, T =
     * cosine_epochs x the steps of an epoch; else epoch e at lr * lr_decay^(e-1) */
    bool cosine;
    int64_t cosine_epochs;
    double lr, lr_decay;
    double label_smoothing, weight_decay; /* weight_decay > 0: AdamW's, decoupled */
    uint64_t seed;
    bool bn;
} options;

static const char *err(void) { return nb_last_error() ? nb_last_error() : "unknown error"; }

/* Prints "fashion_mnist: <message>" to stderr; returns -1. */
static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int fail(const char *fmt, ...) {
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "fashion_mnist: %s\n", line);
    return -1;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void usage(const char *prog) {
    fprintf(stderr,
            "usage: %s [--data DIR] [--epochs N] [--bn] [--batch N] [--lr F] [--lr-decay F]\n"
            "          [--schedule cosine|exp] [--cosine-epochs N] [--label-smoothing F]\n"
            "          [--weight-decay F] [--seed N] [--threads N]\n"
            "          [--save FILE] [--load FILE] [--svg FILE] [--train-limit N] [--test-limit N]\n",
            prog);
}

/* Says why the arguments are refused (the usage follows); -1. */
static int refuse(const char *fmt, const char *a, const char *v) {
    fprintf(stderr, "fashion_mnist: ");
    fprintf(stderr, fmt, a, v);
    fprintf(stderr, "\n");
    return -1;
}

static int parse(int argc, char **argv, options *o) {
    *o = (options){.data = "build/data/fashion-mnist", .svg = "fashion_misclassified.svg",
                   .epochs = 10, .batch = 64, .cosine = true, .cosine_epochs = 10,
                   .lr_decay = 0.7, .label_smoothing = 0.1, .seed = 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--bn")) {
            o->bn = true;
            continue;
        }
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return -1;
        if (i + 1 >= argc) return refuse("%s needs a value%s", a, "");
        const char *v = argv[++i];
        if (!strcmp(a, "--schedule")) {
            if (strcmp(v, "cosine") && strcmp(v, "exp"))
                return refuse("%s must be cosine or exp, got \"%s\"", a, v);
            o->cosine = !strcmp(v, "cosine");
            continue;
        }
        const char **path = !strcmp(a, "--data")   ? &o->data
                            : !strcmp(a, "--save") ? &o->save
                            : !strcmp(a, "--load") ? &o->load
                            : !strcmp(a, "--svg")  ? &o->svg
                                                   : NULL;
        if (path) {
            *path = v;
            continue;
        }
        char *end;
        double x = strtod(v, &end);
        if (*end || !*v) return refuse("%s needs a number, got \"%s\"", a, v);
        bool ok = true; /* the range of each number */
        if (!strcmp(a, "--epochs")) ok = x >= 0, o->epochs = (int64_t)x;
        else if (!strcmp(a, "--batch")) ok = x >= 1, o->batch = (int64_t)x;
        else if (!strcmp(a, "--threads")) ok = x >= 0 && x <= 64, o->threads = (int64_t)x;
        else if (!strcmp(a, "--train-limit")) ok = x >= 0, o->train_limit = (int64_t)x;
        else if (!strcmp(a, "--test-limit")) ok = x >= 0, o->test_limit = (int64_t)x;
        else if (!strcmp(a, "--lr")) ok = x > 0, o->lr = x;
        else if (!strcmp(a, "--lr-decay")) ok = x > 0 && x <= 1, o->lr_decay = x;
        else if (!strcmp(a, "--cosine-epochs")) ok = x >= 1, o->cosine_epochs = (int64_t)x;
        else if (!strcmp(a, "--label-smoothing")) ok = x >= 0 && x <= 1, o->label_smoothing = x;
        else if (!strcmp(a, "--weight-decay")) ok = x >= 0, o->weight_decay = x;
        else if (!strcmp(a, "--seed")) ok = x >= 0, o->seed = (uint64_t)x;
        else return refuse("unknown option %s%s", a, "");
        if (!ok) return refuse("%s %s is out of range (the usage below gives each flag)", a, v);
    }
    if (o->lr == 0) o->lr = o->bn ? 2e-3 : 1e-3; /* not given: batch norm takes twice the rate */
    return 0;
}

/* ------------------------------------------------------------------- data */
typedef struct {
    nb_tensor *images; /* (n, 1, 28, 28) f32 in [0, 1], persistent */
    int64_t *labels;   /* n, in 0..9 */
    int64_t n;
} dataset;

static void dataset_free(dataset *d) {
    nb_free(d->images);
    free(d->labels);
    *d = (dataset){0};
}

/* "DIR/name" into buf */
static const char *data_path(char *buf, size_t cap, const char *dir, const char *name) {
    snprintf(buf, cap, "%s/%s", dir, name);
    return buf;
}

/* Reads one split (images and labels files), keeping its first `limit`
 * images (0: all): 0, or -1 after printing why. */
static int load_split(dataset *d, const char *dir, const char *images, const char *labels,
                      int64_t limit) {
    char ipath[4096], lpath[4096];
    data_path(ipath, sizeof ipath, dir, images);
    data_path(lpath, sizeof lpath, dir, labels);
    nb_tensor *x = nb_load_idx(ipath, NB_F32);
    if (!x) return fail("%s", err());
    nb_tensor *y = nb_load_idx(lpath, NB_I64);
    int rc = 0;
    const int64_t *xs = nb_shape(x), *ys = y ? nb_shape(y) : NULL;
    if (!y) rc = fail("%s", err());
    else if (nb_ndim(x) != 3 || xs[1] != SIDE || xs[2] != SIDE)
        rc = fail("%s: expected images of shape (N,%d,%d), got %d dims", ipath, SIDE, SIDE,
                  nb_ndim(x));
    else if (nb_ndim(y) != 1)
        rc = fail("%s: expected labels of shape (N), got %d dims", lpath, nb_ndim(y));
    else if (ys[0] != xs[0])
        rc = fail("%s has %lld images but %s has %lld labels: the counts must agree", ipath,
                  (long long)xs[0], lpath, (long long)ys[0]);
    int64_t n = rc == 0 ? xs[0] : 0;
    if (limit > 0 && limit < n) n = limit;
    const int64_t *lv = y && rc == 0 ? nb_data(y) : NULL;
    for (int64_t i = 0; i < n && rc == 0; i++)
        if (lv[i] < 0 || lv[i] >= CLASSES)
            rc = fail("%s: label %lld at position %lld is not a class (0..%d)", lpath,
                      (long long)lv[i], (long long)i, CLASSES - 1);
    if (rc == 0) {
        d->n = n;
        d->labels = malloc((size_t)(n > 0 ? n : 1) * sizeof *d->labels);
        nb_scope_begin(); /* (n, 1, 28, 28) / 255, kept */
        nb_tensor *s = nb_mul_scalar(nb_narrow(x, 0, 0, n), 1.0 / 255.0);
        d->images = nb_persistent(nb_contiguous(nb_reshape(s, NB_SHAPE(n, 1, SIDE, SIDE))));
        nb_scope_end();
        if (!d->labels || !d->images) rc = fail("out of memory for %lld images: %s",
                                                (long long)n, err());
        else memcpy(d->labels, lv, (size_t)n * sizeof *d->labels);
    }
    nb_free(x);
    nb_free(y);
    return rc;
}

static int load_data(const options *o, dataset *train, dataset *test) {
    char p[4096];
    struct stat st;
    data_path(p, sizeof p, o->data, "train-images-idx3-ubyte");
    if (stat(p, &st) != 0)
        return fail("no Fashion-MNIST in %s (%s: %s). `make fashion` gets it: it installs "
                    "Debian's dataset-fashion-mnist (apt-get install dataset-fashion-mnist) and "
                    "gunzips its four files from /usr/share/datasets/fashion-mnist into "
                    "build/data/fashion-mnist", o->data, p, strerror(errno));
    if (load_split(train, o->data, "train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                   o->train_limit) != 0 ||
        load_split(test, o->data, "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte",
                   o->test_limit) != 0)
        return -1;
    if (train->n == 0 || test->n == 0) return fail("%s: an empty set of images", o->data);
    return 0;
}

/* ------------------------------------------------------------------ model */
typedef struct {
    nb_Conv2d conv1, conv2;
    nb_BatchNorm bn1, bn2;
    bool bn;
    nb_Linear fc1, fc2;
} net;

static int net_init(net *m, nb_params *ps, bool bn, nb_rng *rng) {
    const int64_t k5[2] = {5, 5}, same[2] = {NB_PADDING_SAME, NB_PADDING_SAME};
    m->bn = bn;
    if (nb_conv2d_init(&m->conv1, ps, "conv1", 1, 32, k5, NULL, same, NULL, 1, true, rng) != 0 ||
        nb_conv2d_init(&m->conv2, ps, "conv2", 32, 64, k5, NULL, same, NULL, 1, true, rng) != 0)
        return -1;
    if (bn && (nb_batchnorm2d_init(&m->bn1, ps, "bn1", 32, 1e-5, 0.1) != 0 ||
               nb_batchnorm2d_init(&m->bn2, ps, "bn2", 64, 1e-5, 0.1) != 0))
        return -1;
    if (nb_linear_init(&m->fc1, ps, "fc1", 64 * 7 * 7, 1024, true, rng) != 0 ||
        nb_linear_init(&m->fc2, ps, "fc2", 1024, CLASSES, true, rng) != 0)
        return -1;
    return 0;
}

/* conv [batch norm] ReLU, max-pool 2: (N, C, H, W) -> (N, O, H/2, W/2) */
static nb_tensor *conv_block(const nb_Conv2d *c, nb_BatchNorm *bn, nb_tensor *x) {
    const int64_t two[2] = {2, 2};
    nb_tensor *h = nb_conv2d_forward(c, x);
    if (bn) h = nb_batchnorm_forward(bn, h);
    return nb_max_pool2d(nb_relu(h), two, NULL, NULL);
}

/* x (N, 1, 28, 28) -> logits (N, 10); dropout and batch statistics when training */
static nb_tensor *net_forward(net *m, nb_tensor *x, bool training, nb_rng *drop) {
    m->bn1.training = m->bn2.training = training;
    nb_tensor *h = conv_block(&m->conv1, m->bn ? &m->bn1 : NULL, x);
    h = conv_block(&m->conv2, m->bn ? &m->bn2 : NULL, h);
    h = nb_reshape(h, NB_SHAPE(nb_shape(x)[0], 64 * 7 * 7));
    h = nb_relu(nb_linear_forward(&m->fc1, h));
    return nb_linear_forward(&m->fc2, nb_dropout(h, 0.4, training, drop));
}

/* ---------------------------------------------------------------- the run */
typedef struct {
    nb_params *ps;
    net model;
    nb_optim *opt;
    dataset train, test;
    int64_t *order;        /* this epoch's permutation of the training set */
    int64_t *predicted;    /* the last evaluation's class per test image */
    nb_rng data, drop;     /* shuffling, dropout */
    int64_t epoch, step;   /* epochs and steps done (more than 0 after --load) */
    double label_smoothing;
    progress bar;
    double train_time;
    nb_params *trainer, *ckpt; /* --save / --load */
} run;

static int setup(run *r, const options *o) {
    if (o->threads > 0) nb_set_num_threads((int)o->threads);
    nb_rng init;
    nb_rng_seed(&init, o->seed);
    nb_rng_seed(&r->data, o->seed + 1000);
    nb_rng_seed(&r->drop, o->seed + 2000);
    r->label_smoothing = o->label_smoothing;
    r->ps = nb_params_new();
    if (!r->ps || net_init(&r->model, r->ps, o->bn, &init) != 0) return fail("%s", err());
    r->opt = o->weight_decay > 0 ? nb_adamw(r->ps, o->lr, 0.9, 0.999, 1e-8, o->weight_decay)
                                 : nb_adam(r->ps, o->lr, 0.9, 0.999, 1e-8, 0.0);
    if (!r->opt) return fail("%s", err());
    r->order = malloc((size_t)r->train.n * sizeof *r->order);
    r->predicted = malloc((size_t)r->test.n * sizeof *r->predicted);
    if (!r->order || !r->predicted) return fail("out of memory");
    printf("fashion-mnist: 2 conv+pooling%s, %lld parameters; %lld training and %lld test "
           "images, batch %lld, %s lr %g", o->bn ? " + batch norm" : "",
           (long long)nb_params_numel(r->ps), (long long)r->train.n, (long long)r->test.n,
           (long long)o->batch, o->weight_decay > 0 ? "AdamW" : "Adam", o->lr);
    if (o->cosine) printf(" cosine to 0 over %lld epochs", (long long)o->cosine_epochs);
    else printf(" x%g per epoch", o->lr_decay);
    if (o->weight_decay > 0) printf(", weight decay %g", o->weight_decay);
    if (o->label_smoothing > 0) printf(", label smoothing %g", o->label_smoothing);
    printf(", %d thread(s)\n", nb_num_threads());
    return 0;
}

static const char *trainer_names[] = {"epoch", "step", "data_rng", "drop_rng"};
#define TRAINER_VALUES 4

static int save_checkpoint(run *r, const char *path) {
    int64_t *v[TRAINER_VALUES];
    for (int i = 0; i < TRAINER_VALUES; i++) v[i] = checkpoint_value(r->trainer, i);
    *v[0] = r->epoch, *v[1] = r->step;
    v[2][0] = (int64_t)r->data.seed, v[2][1] = (int64_t)r->data.offset;
    v[3][0] = (int64_t)r->drop.seed, v[3][1] = (int64_t)r->drop.offset;
    if (nb_save(r->ckpt, path) != 0) return fail("%s", err());
    return 0;
}

static int load_checkpoint(run *r, const char *path) {
    if (nb_load(r->ckpt, path) != 0)
        return fail("%s (--load needs the flags the checkpoint was trained with)", err());
    int64_t *v[TRAINER_VALUES];
    for (int i = 0; i < TRAINER_VALUES; i++) v[i] = checkpoint_value(r->trainer, i);
    r->epoch = *v[0], r->step = *v[1];
    r->data = (nb_rng){.seed = (uint64_t)v[2][0], .offset = (uint64_t)v[2][1]};
    r->drop = (nb_rng){.seed = (uint64_t)v[3][0], .offset = (uint64_t)v[3][1]};
    printf("resumed from %s: %lld epochs, %lld steps done\n", path, (long long)r->epoch,
           (long long)r->step);
    return 0;
}

/* r->order: a fresh permutation of the training set (Fisher-Yates on
 * uniforms drawn from r->data, so a resumed run draws the same). */
static int shuffle(run *r) {
    int64_t n = r->train.n;
    nb_scope_begin();
    nb_tensor *u = nb_rand(NB_F64, 1, &n, &r->data);
    const double *pu = u ? nb_data(u) : NULL;
    for (int64_t i = 0; pu && i < n; i++) r->order[i] = i;
    for (int64_t i = n - 1; pu && i > 0; i--) {
        int64_t j = (int64_t)(pu[i] * (double)(i + 1));
        if (j > i) j = i; /* u < 1, but never trust a rounding */
        int64_t t = r->order[i];
        r->order[i] = r->order[j], r->order[j] = t;
    }
    nb_scope_end();
    return pu ? 0 : fail("%s", err());
}

/* Images order[lo, lo + b) as a batch x (b, 1, 28, 28) and their labels y (b). */
static int make_batch(const dataset *d, const int64_t *order, int64_t lo, int64_t b,
                      nb_tensor **x, nb_tensor **y) {
    *x = nb_empty(NB_F32, NB_SHAPE(b, 1, SIDE, SIDE));
    *y = nb_empty(NB_I64, NB_SHAPE(b));
    if (!*x || !*y) return -1;
    float *px = nb_data(*x);
    int64_t *py = nb_data(*y);
    const float *src = nb_data(d->images);
    for (int64_t i = 0; i < b; i++) {
        int64_t k = order ? order[lo + i] : lo + i;
        memcpy(px + i * PIXELS, src + k * PIXELS, PIXELS * sizeof *px);
        py[i] = d->labels[k];
    }
    return 0;
}

/* One step on images order[lo, lo + b): the batch's loss, or NaN. */
static double train_step(run *r, int64_t lo, int64_t b) {
    nb_tensor *x, *y;
    if (make_batch(&r->train, r->order, lo, b, &x, &y) != 0) return NAN;
    nb_tensor *loss = nb_cross_entropy(net_forward(&r->model, x, true, &r->drop), y, -1,
                                       r->label_smoothing);
    if (!loss || nb_backward(loss) != 0) return NAN;
    nb_clear_error(); /* nb_optim_step reports through the message only */
    nb_optim_step(r->opt);
    nb_optim_zero_grad(r->opt);
    return nb_last_error() ? NAN : nb_item(loss);
}

/* Classifies the test set in eval mode into r->predicted: the number right, or -1. */
static int64_t evaluate(run *r) {
    const dataset *d = &r->test;
    int64_t right = 0;
    nb_set_grad_enabled(false);
    for (int64_t lo = 0; lo < d->n && right >= 0; lo += EVAL_BATCH) {
        int64_t b = d->n - lo < EVAL_BATCH ? d->n - lo : EVAL_BATCH;
        nb_scope_begin();
        nb_tensor *x, *y;
        nb_tensor *cls = make_batch(d, NULL, lo, b, &x, &y) == 0
                             ? nb_argmax(net_forward(&r->model, x, false, NULL), 1, false)
                             : NULL;
        if (!cls) right = -1;
        for (int64_t i = 0; cls && i < b; i++) {
            r->predicted[lo + i] = ((const int64_t *)nb_data(cls))[i];
            right += r->predicted[lo + i] == d->labels[lo + i];
        }
        nb_scope_end();
    }
    nb_set_grad_enabled(true);
    return right;
}

/* The steps of one epoch: their mean loss, or NaN after printing why. */
static double run_epoch(run *r, const options *o, int64_t epoch, int64_t steps) {
    if (shuffle(r) != 0) return NAN;
    nb_optim_set_lr(r->opt, nb_lr_exponential(epoch - 1, o->lr_decay, o->lr));
    double loss_sum = 0;
    progress_epoch(&r->bar, epoch);
    for (int64_t s = 0; s < steps; s++) {
        if (o->cosine) /* a function of the steps done alone: --load resumes it */
            nb_optim_set_lr(r->opt,
                            nb_lr_cosine_annealing(r->step, o->cosine_epochs * steps, o->lr, 0));
        int64_t lo = s * o->batch, b = r->train.n - lo < o->batch ? r->train.n - lo : o->batch;
        nb_scope_begin();
        double loss = train_step(r, lo, b);
        nb_scope_end();
        if (isnan(loss)) {
            progress_clear(&r->bar);
            fail("epoch %lld, step %lld failed: %s", (long long)epoch, (long long)s + 1,
                 nb_last_error() ? nb_last_error() : "the loss is NaN");
            return NAN;
        }
        loss_sum += loss;
        r->step++;
        progress_step(&r->bar, s + 1, loss_sum / (double)(s + 1), (double)(lo + b));
    }
    return loss_sum / (double)steps;
}

static int train(run *r, const options *o) {
    int64_t steps = (r->train.n + o->batch - 1) / o->batch;
    progress_init(&r->bar, o->epochs, steps);
    progress_unit(&r->bar, "img");
    for (int64_t epoch = r->epoch + 1; epoch <= o->epochs; epoch++) {
        double t0 = now(), loss = run_epoch(r, o, epoch, steps);
        if (isnan(loss)) return -1;
        double dt = now() - t0;
        r->train_time += dt;
        progress_clear(&r->bar);
        int64_t right = evaluate(r);
        if (right < 0) return fail("testing failed: %s", err());
        printf("epoch %2lld  loss %.4f  test accuracy %.4f  epoch time %.1fs (%.1f ms/step, "
               "%.0f images/s)\n",
               (long long)epoch, loss, (double)right / (double)r->test.n, dt,
               1e3 * dt / (double)steps, (double)r->train.n / dt);
        fflush(stdout);
        r->epoch = epoch;
        if (o->save && save_checkpoint(r, o->save) != 0) return -1;
    }
    return 0;
}

/* ------------------------------------------------------------- the report */
/* Rows: the true class; columns: the predicted one; then each class's recall. */
static void confusion_matrix(const run *r) {
    int64_t m[CLASSES][CLASSES] = {{0}};
    for (int64_t i = 0; i < r->test.n; i++) m[r->test.labels[i]][r->predicted[i]]++;
    printf("confusion matrix (rows: true class, columns: predicted class)\n%-14s", "");
    for (int c = 0; c < CLASSES; c++) printf(" %5d", c);
    printf("  recall\n");
    for (int t = 0; t < CLASSES; t++) {
        int64_t n = 0;
        printf("%d %-12s", t, CLASS_NAMES[t]);
        for (int c = 0; c < CLASSES; c++) {
            printf(" %5lld", (long long)m[t][c]);
            n += m[t][c];
        }
        printf("  %.3f\n", n ? (double)m[t][t] / (double)n : 0.0);
    }
}

/* pixel value in [0, 1] -> one of 16 shades, 0 (none) .. 15 */
static int shade(float v) { return (int)lrintf(15.0f * v); }

/* One 28x28 image at (x0, y0), `scale` px a pixel, dark on white (Fashion-MNIST's
 * are light on black), in 16 shades (#fff .. #000): one path per shade, a
 * run of that shade in a row one rectangle of it ("M x y h w v 1 h -w z", in
 * pixel units inside a scaled group; 100 images take about 0.5 MB). */
static void svg_image(FILE *f, const float *px, double x0, double y0, double scale) {
    fprintf(f, "<g transform=\"translate(%.0f %.0f) scale(%.0f)\" shape-rendering=\"crispEdges\">\n",
            x0, y0, scale);
    for (int s = 1; s < 16; s++) {
        bool open = false;
        for (int i = 0; i < SIDE; i++)
            for (int j = 0; j < SIDE; j++) {
                if (shade(px[i * SIDE + j]) != s) continue;
                int k = j + 1;
                while (k < SIDE && shade(px[i * SIDE + k]) == s) k++;
                if (!open) fprintf(f, "<path fill=\"#%x%x%x\" d=\"", 15 - s, 15 - s, 15 - s);
                fprintf(f, "M%d %dh%dv1h-%dz", j, i, k - j, k - j);
                open = true;
                j = k - 1;
            }
        if (open) fputs("\"/>\n", f);
    }
    fputs("</g>\n", f);
}

/* The first SVG_MAX misclassified test images, 10 a row, each with its true
 * and predicted class. */
static int write_svg(const run *r, const char *path, int64_t wrong) {
    enum { COLS = 10, SCALE = 3, CELL_W = 120, CELL_H = 124, TOP = 50 };
    int64_t shown = wrong < SVG_MAX ? wrong : SVG_MAX, rows = (shown + COLS - 1) / COLS;
    FILE *f = svg_open(path, COLS * CELL_W + 20, TOP + rows * CELL_H + 10);
    if (!f) return fail("%s", svg_error());
    char title[160];
    snprintf(title, sizeof title, "Fashion-MNIST: %lld of %lld test images misclassified "
             "(the first %lld, in test-set order)", (long long)wrong, (long long)r->test.n,
             (long long)shown);
    svg_text(f, 10, 24, "font-size=\"16\" font-weight=\"bold\"", title);
    svg_text(f, 10, 42, "font-size=\"12\" fill=\"#555\"",
             "under each image: its index, the true class, and (red) the predicted class");
    const float *px = nb_data(r->test.images);
    int64_t k = 0;
    for (int64_t i = 0; i < r->test.n && k < shown; i++) {
        if (r->predicted[i] == r->test.labels[i]) continue;
        double x = 10 + (double)(k % COLS) * CELL_W, y = TOP + (double)(k / COLS) * CELL_H;
        fprintf(f, "<rect x=\"%.0f\" y=\"%.0f\" width=\"%d\" height=\"%d\" fill=\"none\" "
                   "stroke=\"#ccc\"/>\n", x + 16, y, SIDE * SCALE, SIDE * SCALE);
        svg_image(f, px + i * PIXELS, x + 16, y, SCALE);
        char line[64];
        snprintf(line, sizeof line, "#%lld %s", (long long)i, CLASS_NAMES[r->test.labels[i]]);
        svg_text(f, x + 16, y + SIDE * SCALE + 14, "font-size=\"11\"", line);
        svg_text(f, x + 16, y + SIDE * SCALE + 27, "font-size=\"11\" fill=\"#c00\"",
                 CLASS_NAMES[r->predicted[i]]);
        k++;
    }
    if (svg_close(f, path) != 0) return fail("%s", svg_error());
    printf("wrote %s (%lld misclassified test images)\n", path, (long long)shown);
    return 0;
}

/* The last line is the result: "test accuracy 0.9163 (9163/10000)". */
static int final_report(run *r, const options *o) {
    int64_t right = evaluate(r);
    if (right < 0) return fail("testing failed: %s", err());
    printf("training %.1fs for %lld epochs (%lld steps) on %d thread(s)\n", r->train_time,
           (long long)(o->epochs), (long long)r->step, nb_num_threads());
    confusion_matrix(r);
    if (o->svg && *o->svg && write_svg(r, o->svg, r->test.n - right) != 0) return -1;
    printf("test accuracy %.4f (%lld/%lld)\n", (double)right / (double)r->test.n,
           (long long)right, (long long)r->test.n);
    return 0;
}

static void teardown(run *r) {
    nb_params_free(r->ckpt);
    nb_params_free(r->trainer);
    nb_optim_free(r->opt);
    nb_params_free(r->ps);
    dataset_free(&r->train);
    dataset_free(&r->test);
    free(r->order);
    free(r->predicted);
}

int main(int argc, char **argv) {
    options o;
    if (parse(argc, argv, &o) != 0) {
        usage(argv[0]);
        return 2;
    }
    run r = {0};
    int rc = load_data(&o, &r.train, &r.test);
    if (rc == 0) rc = setup(&r, &o);
    if (rc == 0 && (o.save || o.load) &&
        checkpoint_registry_make(r.ps, r.opt, trainer_names, TRAINER_VALUES, 2, &r.trainer,
                                 &r.ckpt) != 0)
        rc = fail("%s", err());
    if (rc == 0 && o.load) rc = load_checkpoint(&r, o.load);
    if (rc == 0) rc = train(&r, &o);
    if (rc == 0) rc = final_report(&r, &o);
    teardown(&r);
    return rc == 0 ? 0 : 1; /* the accuracy is in the output, not in the exit code */
}
