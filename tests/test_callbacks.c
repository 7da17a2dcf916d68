/* test_callbacks.c: user code that misbehaves inside the callbacks nabla
 * calls. One table: every callback kind of nabla.h (a custom function's
 * forward, backward and destroy, and their multi-output forms; gradient
 * hooks; nb_gradcheck's function; nb_parallel_for's fn; nb_gpt_generate's
 * on_token) x the misbehaviours that apply to it (free what nabla is using,
 * close a scope, leave one open, flip grad mode, start a backward, return
 * garbage). Each row names what nabla does about it: refuses it with a
 * message naming the callback, defers the free until nabla is done, or
 * allows it (and restores what must be restored). Every row ends with the
 * caller's scope still open and a tensor made in it alive, the scope depth
 * and grad mode as they were, and the tensor count and storage bytes it
 * started with (valgrind and ASan check the rest). The table is checked
 * against the function pointers declared in nabla.h, so a new callback kind
 * cannot be added without rows. */
#include "test_util.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifndef NB_FIXTURE_DIR
#define NB_FIXTURE_DIR "tests/fixtures"
#endif

typedef enum {
    FREE_ROOT,      /* nb_free the tensor nb_backward started from */
    FREE_INPUT,     /* nb_free an input of the op (a hook: its leaf) */
    FREE_SAVED,     /* nb_free a saved tensor, or a borrowed .grad */
    FREE_OUTPUT,    /* nb_free what it returns */
    FREE_MODULE,    /* free the model nabla is using */
    FREE_REGISTRY,  /* free the registry that owns the parameters nabla is using */
    REINIT_MODEL,   /* nb_gpt_init over the model being generated from */
    MAKE_TENSOR,    /* make a tensor while its scope is being ended */
    CLOSE_SCOPE,    /* one nb_scope_end too many */
    OPEN_SCOPE,     /* an nb_scope_begin without its end */
    FLIP_GRAD,      /* grad mode on (where it is off) or off (where it is on) */
    START_BACKWARD, /* nb_backward (or a second generation) through what is running */
    LEAVE_FRAME,    /* an nb_callback_begin without its nb_callback_end */
    WRITE_INPUT,    /* write an input in place */
    FLIP_REQUIRES,  /* turn requires_grad off on an input */
    KEEP_TENSOR,    /* nb_keep a tensor out of where it runs */
    RETURN_GARBAGE, /* a failure code without a message, NULL, a freed tensor */
    RETURN_OTHER,   /* a pointer to something that is not a tensor */
} misdeed;

static const char *misdeed_name[] = {
    "free the root", "free an input", "free a saved tensor", "free its output",
    "free the model", "free the registry", "re-initialize the model", "make a tensor",
    "close a scope", "open a scope", "flip grad mode", "start a backward", "leave a callback frame", "write an input in place",
    "turn requires_grad off", "nb_keep a tensor",
    "return garbage", "return a pointer that is not a tensor"};
/* what RETURN_OTHER hands back: memory of the user's, not a tensor */
static double not_a_tensor[16];
#define OTHER ((nb_tensor *)(void *)not_a_tensor)

/* ------------------------------------------------- the row being run */
static misdeed row_misdeed;
static const char *row_kind;
/* What the running callback does: the row's misdeed when it is the row's
 * kind of callback, else nothing (another callback of the same test, such
 * as the forward of a backward row, behaves). */
static int now = -1;
static void act_as(const char *kind) { now = strcmp(kind, row_kind) == 0 ? (int)row_misdeed : -1; }
static nb_tensor *root, *victim; /* what a callback may go after */
static char inner_msg[1024];     /* the message of a call a callback made */
static int inner_rc;
static nb_GPT *gpt_model;

static void note_inner(int rc) {
    inner_rc = rc;
    snprintf(inner_msg, sizeof inner_msg, "%s", nb_last_error() ? nb_last_error() : "");
}

/* The misdeeds every kind of callback can commit the same way. */
static void misbehave_as(int what) {
    switch (what) {
    case CLOSE_SCOPE: nb_scope_end(); break;
    case OPEN_SCOPE: nb_scope_begin(); break;
    case FLIP_GRAD: nb_set_grad_enabled(!nb_grad_enabled()); break;
    case FREE_ROOT: nb_free(root); break;
    case START_BACKWARD: note_inner(nb_backward(root)); break;
    case LEAVE_FRAME: nb_callback_begin("test", "a frame"); break;
    default: break;
    }
}
static void misbehave(void) { misbehave_as(now); }

/* ------------------------------------------------------ a custom function */
/* sq(x) = x^2 (saves x), and split(x) = (2x, 3x). */
static nb_tensor *sq_forward(nb_function_ctx *c, nb_tensor **in, int n, void *user) {
    (void)n;
    (void)user;
    act_as("forward");
    nb_tensor *x = in[0];
    if (now == FREE_SAVED) { /* the ctx keeps its own handle: freeing this one is fine */
        nb_tensor *copy = nb_mul_scalar(x, 1.0);
        if (nb_function_save(c, copy) != 0) return NULL;
        nb_free(copy);
    } else if (nb_function_save(c, x) != 0) {
        return NULL;
    }
    if (now == FREE_INPUT) nb_free(x);
    if (now == RETURN_GARBAGE) return NULL;
    if (now == RETURN_OTHER) return OTHER;
    misbehave();
    nb_tensor *y = nb_mul(x, x);
    if (now == FREE_OUTPUT) nb_free(y);
    return y;
}

static int sq_backward(nb_function_ctx *c, nb_tensor *g, nb_tensor **gin, void *user) {
    (void)user;
    act_as("backward");
    nb_tensor *x = nb_function_saved(c, 0);
    if (now == FREE_SAVED) nb_free(x), note_inner(0);
    if (now == FREE_INPUT) nb_free(victim);
    misbehave();
    if (now == RETURN_GARBAGE) return 7;
    if (now == RETURN_OTHER) return gin[0] = OTHER, 0;
    gin[0] = nb_mul(nb_mul_scalar(x, 2.0), g);
    if (now == FREE_OUTPUT) nb_free(gin[0]);
    return 0;
}

static nb_tensor *plain_forward(nb_function_ctx *c, nb_tensor **in, int n, void *user) {
    (void)n;
    (void)user;
    return nb_function_save(c, in[0]) == 0 ? nb_mul(in[0], in[0]) : NULL;
}
static int plain_backward(nb_function_ctx *c, nb_tensor *g, nb_tensor **gin, void *user) {
    (void)user;
    gin[0] = nb_mul(nb_mul_scalar(nb_function_saved(c, 0), 2.0), g);
    return 0;
}

static int destroyed;
static void sq_destroy(void *user) {
    (void)user;
    act_as("destroy");
    destroyed++;
    if (now == FREE_INPUT) nb_free(victim); /* a tensor of the scope being ended */
    if (now == MAKE_TENSOR) nb_zeros(NB_F64, NB_SHAPE(5)); /* joins the scope being ended */
    if (now == START_BACKWARD) {
        nb_tensor *w = nb_set_requires_grad(nb_ones(NB_F64, NB_SHAPE(2)), true);
        note_inner(nb_backward(nb_sum_all(nb_mul(w, w))));
        nb_free(w);
    }
    if (now == CLOSE_SCOPE || now == OPEN_SCOPE || now == FLIP_GRAD) misbehave();
}

/* forward mode: d(x^2) = 2 x t */
static nb_tensor *sq_jvp(nb_function_ctx *c, nb_tensor **t, int n, void *user) {
    (void)n;
    (void)user;
    act_as("jvp");
    nb_tensor *x = nb_function_saved(c, 0);
    if (now == FREE_SAVED) nb_free(x), note_inner(0);
    misbehave();
    if (now == RETURN_GARBAGE) return NULL;
    if (now == RETURN_OTHER) return OTHER;
    nb_tensor *r = nb_mul(nb_mul_scalar(x, 2.0), t[0]);
    if (now == FREE_OUTPUT) nb_free(r);
    return r;
}

static const nb_function sq_fn = {.name = "sq", .forward = sq_forward, .backward = sq_backward,
                                  .jvp = sq_jvp};
static const nb_function plain_fn = {.name = "sq", .forward = plain_forward,
                                     .backward = plain_backward, .destroy = sq_destroy};

static int split_forward(nb_function_ctx *c, nb_tensor **in, int n, nb_tensor **out, int nout,
                         void *user) {
    (void)c;
    (void)n;
    (void)nout;
    (void)user;
    act_as("forward_multi");
    if (now == FREE_INPUT) nb_free(in[0]);
    if (now == RETURN_GARBAGE) return -1;
    misbehave();
    out[0] = nb_mul_scalar(in[0], 2.0);
    out[1] = nb_mul_scalar(in[0], 3.0);
    if (now == FREE_OUTPUT) nb_free(out[1]);
    return 0;
}
static int split_backward(nb_function_ctx *c, nb_tensor **g, int nout, nb_tensor **gin,
                          void *user) {
    (void)c;
    (void)nout;
    (void)user;
    act_as("backward_multi");
    misbehave();
    if (now == RETURN_GARBAGE) return -1;
    gin[0] = nb_add(nb_mul_scalar(g[0], 2.0), nb_mul_scalar(g[1], 3.0));
    return 0;
}
static const nb_function split_fn = {.name = "split", .forward_multi = split_forward,
                                     .backward_multi = split_backward};

/* x = (1, 2, 3) in f64, a leaf */
static nb_tensor *leaf123(void) {
    return nb_set_requires_grad(nb_from_data(NB_F64, NB_SHAPE(3), (double[]){1, 2, 3}), true);
}

static void expect_grad(nb_tensor *x, double scale) {
    nb_tensor *g = nb_grad(x);
    ck_assert_msg(g != NULL, "no gradient: %s", nb_last_error() ? nb_last_error() : "");
    for (int i = 0; i < 3; i++)
        ck_assert_msg(fabs(nb_item(nb_select(g, 0, i)) - scale * (i + 1)) < 1e-12,
                      "gradient %d: %g, want %g", i, nb_item(nb_select(g, 0, i)), scale * (i + 1));
}

/* forward: apply sq to x, backward through it; the gradient is 2x */
static int run_forward(void) {
    nb_tensor *x = leaf123();
    root = nb_sum_all(nb_mul(x, x)); /* a graph of the caller's, for START_BACKWARD */
    nb_tensor *y = nb_function_apply(&sq_fn, &x, 1, NULL);
    if (!y) return -1;
    ck_assert_int_eq(nb_backward(nb_sum_all(y)), 0);
    expect_grad(x, row_misdeed == START_BACKWARD ? 4.0 : 2.0);
    return 0;
}

/* backward: sq's backward misbehaves while nb_backward walks */
static int run_backward(void) {
    nb_tensor *x = leaf123();
    victim = x;
    root = nb_sum_all(nb_function_apply(&sq_fn, &x, 1, NULL));
    int rc = nb_backward(root);
    if (rc == 0 && row_misdeed != FREE_INPUT) expect_grad(x, 2.0);
    return rc;
}

/* The same under create_graph (nb_autograd_grad): what nb_function_saved
 * hands out then is a recorded view, borrowed just as well. */
static int run_backward_create_graph(void) {
    nb_tensor *x = leaf123(), *gx = NULL;
    victim = x;
    root = nb_sum_all(nb_function_apply(&sq_fn, &x, 1, NULL));
    nb_backward_opts o = {.create_graph = true};
    int rc = nb_autograd_grad(&root, 1, NULL, &x, 1, &o, &gx);
    if (rc == 0) {
        ck_assert_ptr_nonnull(gx);
        for (int i = 0; i < 3; i++)
            ck_assert_double_eq_tol(nb_item(nb_select(gx, 0, i)), 2.0 * (i + 1), 1e-12);
    }
    return rc;
}

/* jvp: nb_jvp through sq, tangent ones: 2x */
static nb_tensor *apply_sq(nb_tensor **in, int n, void *ctx) {
    (void)ctx;
    return nb_function_apply(&sq_fn, in, n, NULL);
}
static int run_jvp(void) {
    nb_tensor *w = leaf123();
    root = nb_sum_all(nb_mul(w, w)); /* a graph of the caller's, for START_BACKWARD */
    nb_tensor *x = nb_from_data(NB_F64, NB_SHAPE(3), (double[]){1, 2, 3});
    nb_tensor *t = nb_ones(NB_F64, NB_SHAPE(3)), *y, *ty;
    if (nb_jvp(apply_sq, NULL, 1, &x, &t, &y, &ty) != 0) return -1;
    for (int i = 0; i < 3; i++)
        ck_assert_msg(fabs(nb_item(nb_select(ty, 0, i)) - 2.0 * (i + 1)) < 1e-12, "tangent %d: %g",
                      i, nb_item(nb_select(ty, 0, i)));
    return 0;
}

/* destroy: runs as the scope holding sq's node ends */
static int run_destroy(void) {
    nb_tensor *x = leaf123();
    nb_scope_begin();
    victim = nb_zeros(NB_F64, NB_SHAPE(4)); /* older than y: still pending at its end */
    nb_tensor *y = nb_function_apply(&plain_fn, &x, 1, NULL);
    ck_assert_ptr_nonnull(y);
    nb_clear_error();
    destroyed = 0;
    nb_scope_end();
    ck_assert_int_eq(destroyed, 1);
    return nb_last_error() ? -1 : 0;
}

static int run_forward_multi(void) {
    nb_tensor *x = leaf123(), *out[2];
    root = NULL;
    if (nb_function_apply_multi(&split_fn, &x, 1, out, 2, NULL) != 0) return -1;
    ck_assert_int_eq(nb_backward(nb_sum_all(nb_mul(nb_add(out[0], out[1]), x))), 0);
    expect_grad(x, 10.0); /* sum(5x * x) */
    return 0;
}

static int run_backward_multi(void) {
    nb_tensor *x = leaf123(), *out[2];
    ck_assert_int_eq(nb_function_apply_multi(&split_fn, &x, 1, out, 2, NULL), 0);
    root = nb_sum_all(nb_mul(nb_add(out[0], out[1]), x)); /* 5x^2: gradient 10x */
    int rc = nb_backward(root);
    if (rc == 0) expect_grad(x, 10.0);
    return rc;
}

/* ----------------------------------------------------------------- hooks */
static nb_params *hook_ps;
static int hook(nb_tensor *leaf, void *ctx) {
    (void)ctx;
    act_as("nb_grad_hook");
    if (now == FREE_INPUT) nb_free(leaf);
    if (now == FREE_SAVED) nb_free(nb_grad(leaf)), note_inner(0);
    if (now == FREE_REGISTRY) nb_params_free(hook_ps);
    if (now == RETURN_GARBAGE) return 5;
    misbehave();
    return 0;
}

static int run_hook(void) {
    nb_tensor *x = leaf123(), *p = x;
    if (row_misdeed == FREE_REGISTRY) { /* a parameter of a registry the hook frees */
        hook_ps = nb_params_new();
        p = nb_params_add(hook_ps, "w", x);
        ck_assert_ptr_nonnull(p);
    }
    ck_assert_int_eq(nb_set_grad_hook(p, hook, NULL), 0);
    root = nb_sum_all(nb_mul(p, p));
    int rc = nb_backward(root);
    if (rc == 0 && row_misdeed != FREE_INPUT && row_misdeed != FREE_REGISTRY) expect_grad(p, 2.0);
    return rc;
}

/* The same misdeeds in a gradient contribution hook, on a leaf used twice
 * (p * p: two contributions); FREE_SAVED frees the borrowed sum so far. */
static int contrib_hook(nb_tensor *leaf, void *ctx) {
    (void)ctx;
    act_as("nb_grad_hook");
    if (now == FREE_INPUT) nb_free(leaf);
    if (now == FREE_SAVED) nb_free(nb_grad_so_far(leaf)), note_inner(0);
    if (now == RETURN_GARBAGE) return 5;
    misbehave();
    return 0;
}

static int run_contrib_hook(void) {
    nb_tensor *x = leaf123();
    ck_assert_int_eq(nb_set_grad_contribution_hook(x, contrib_hook, NULL), 0);
    root = nb_sum_all(nb_mul(x, x));
    int rc = nb_backward(root);
    if (rc == 0 && row_misdeed != FREE_INPUT) expect_grad(x, 2.0);
    return rc;
}

/* ------------------------------------------------------------- gradcheck */
static nb_tensor *checked(nb_tensor **in, int n, void *ctx) {
    (void)n;
    (void)ctx;
    act_as("nb_fn");
    if (now == FREE_INPUT) nb_free(in[0]);
    if (now == RETURN_GARBAGE) return NULL;
    if (now == RETURN_OTHER) return OTHER;
    misbehave();
    if (now == WRITE_INPUT) nb_copy_into(in[0], nb_add_scalar(nb_detach(in[0]), 1.0));
    if (now == FLIP_REQUIRES) nb_set_requires_grad(in[0], false);
    nb_tensor *y = nb_mul(in[0], in[0]);
    if (now == FREE_OUTPUT) nb_free(y);
    if (now == START_BACKWARD) note_inner(nb_backward(nb_sum_all(y)));
    return y;
}

static int run_gradcheck(bool fast) {
    nb_tensor *x = leaf123();
    nb_gradcheck_opts o = NB_GRADCHECK_DEFAULTS;
    o.fast_mode = fast;
    nb_gradcheck_result r;
    bool ok = nb_gradcheck(checked, NULL, 1, &x, &o, &r);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", nb_last_error() ? nb_last_error() : "");
    if (row_misdeed != FREE_INPUT) {
        ck_assert(nb_grad(x) == NULL); /* restored, as it was */
        ck_assert(nb_requires_grad(x));
        for (int i = 0; i < 3; i++) ck_assert_double_eq(nb_item(nb_select(x, 0, i)), i + 1);
    }
    if (!ok) nb_report_error("%s", msg);
    return ok ? 0 : -1;
}
static int run_gradcheck_full(void) { return run_gradcheck(false); }
static int run_gradcheck_fast(void) { return run_gradcheck(true); }

/* -------------------------------------------------------- nb_parallel_for */
static void range_fn(void *ctx, int64_t lo, int64_t hi) {
    (void)ctx;
    (void)hi;
    /* ranges run on several threads: nothing shared is written here */
    bool mine = strcmp(row_kind, "fn") == 0;
    if (mine && row_misdeed == MAKE_TENSOR) nb_ones(NB_F64, NB_SHAPE(16)); /* every range */
    if (mine && row_misdeed == KEEP_TENSOR) { /* every range; the first reports */
        nb_tensor *k = nb_keep(nb_ones(NB_F64, NB_SHAPE(16)));
        if (lo == 0) note_inner(k ? 0 : -1);
    }
    if (lo == 0 && mine) misbehave_as((int)row_misdeed);
}

static int run_parallel_for(void) {
    nb_clear_error();
    nb_parallel_for(1 << 16, 1 << 10, range_fn, NULL);
    /* its own failure; not an inner call's message that fn ignored */
    const char *m = nb_last_error();
    return m && strncmp(m, "nb_parallel_for:", 16) == 0 ? -1 : 0;
}

/* ---------------------------------------------------------------- on_token */
static nb_params *gpt_ps, *gpt_ps2;
static int tokens_seen;
static bool on_token(int64_t token, void *user) {
    (void)token;
    (void)user;
    act_as("on_token");
    tokens_seen++;
    if (now == FREE_MODULE) nb_gpt_free(gpt_model);
    if (now == FREE_REGISTRY) {
        nb_params_free(gpt_ps);
        gpt_ps = NULL;
    }
    if (now == REINIT_MODEL) {
        nb_GPTConfig cfg = {.vocab_size = 7, .block_size = 4, .n_layer = 1, .n_head = 1,
                            .n_embd = 4};
        gpt_ps2 = nb_params_new();
        ck_assert_int_eq(nb_gpt_init(gpt_model, gpt_ps2, &cfg, NULL), 0);
    }
    if (now == START_BACKWARD) {
        int64_t p = 1, o[2];
        note_inner((int)nb_gpt_generate(gpt_model, &p, 1, 2, NULL, NULL, o, NULL, NULL));
    }
    if (now == CLOSE_SCOPE || now == OPEN_SCOPE || now == FLIP_GRAD || now == LEAVE_FRAME)
        misbehave();
    return true;
}

static const nb_GPTConfig tiny_gpt = {.vocab_size = 11, .block_size = 8, .n_layer = 1,
                                      .n_head = 2, .n_embd = 8};

static int run_on_token(void) {
    static nb_GPT m;
    gpt_model = &m;
    gpt_ps = nb_params_new();
    gpt_ps2 = NULL;
    nb_rng r;
    nb_rng_seed(&r, 3);
    ck_assert_int_eq(nb_gpt_init(&m, gpt_ps, &tiny_gpt, &r), 0);
    const int64_t prompt[2] = {1, 2};
    nb_gpt_sample_opts greedy = {.greedy = true};
    int64_t want[5], got[5];
    ck_assert_int_eq(nb_gpt_generate(&m, prompt, 2, 5, &greedy, NULL, want, NULL, NULL), 5);
    tokens_seen = 0;
    int64_t n = nb_gpt_generate(&m, prompt, 2, 5, &greedy, NULL, got, on_token, NULL);
    if (n == 5)
        for (int i = 0; i < 5; i++) ck_assert_int_eq(got[i], want[i]);
    /* what the row left for us to free: the model (unless on_token freed
     * it), the registries */
    char keep[1024];
    snprintf(keep, sizeof keep, "%s", nb_last_error() ? nb_last_error() : "");
    nb_gpt_free(&m);
    nb_params_free(gpt_ps);
    if (gpt_ps2) nb_params_free(gpt_ps2);
    if (n < 0) nb_report_error("%s", keep);
    return n < 0 ? -1 : 0;
}

/* ------------------------------------------------------------ the table */
typedef struct {
    const char *kind; /* the function pointer's name in nabla.h */
    misdeed what;
    int (*run)(void);
    const char *does; /* what nabla does: refused, deferred, allowed, restored */
    /* run fails with a message containing these (NULL: run succeeds) */
    const char *msg[3];
    /* a call the callback made fails with this (inner), or reports it (FREE_SAVED) */
    const char *inner;
} row;

#define FWD "nb_function_apply: sq's forward "
#define BWD "nb_backward: sq's backward "
#define CLOSED "closed a scope it did not open"
#define LEFT "left 1 scope open (nb_scope_begin without nb_scope_end); nabla closed it"
#define GRAD_ON "turned grad mode on (nb_set_grad_enabled(true)); it runs with grad mode off"
#define SAME_GRAPH "started a backward through the graph that the backward running on this " \
                   "thread is walking"
#define BORROWED "nb_free: input 0 is borrowed"

static const row table[] = {
    {"forward", FREE_INPUT, run_forward, "the apply fails (the handle is freed, as asked)",
     {"sq: forward freed its input 0 (nb_free), which belongs to the caller"}, NULL},
    {"forward", FREE_SAVED, run_forward, "allowed (the ctx keeps its own handle)", {NULL}, NULL},
    {"forward", FREE_OUTPUT, run_forward, "refused",
     {"sq: forward returned a freed tensor as output 0"}, NULL},
    {"forward", CLOSE_SCOPE, run_forward, "refused", {FWD CLOSED}, NULL},
    {"forward", OPEN_SCOPE, run_forward, "refused (closed)", {FWD LEFT}, NULL},
    {"forward", FLIP_GRAD, run_forward, "refused", {FWD GRAD_ON}, NULL},
    {"forward", START_BACKWARD, run_forward, "allowed (another graph)", {NULL}, NULL},
    {"forward", LEAVE_FRAME, run_forward, "refused (closed)",
     {FWD "left 1 callback frame open (nb_callback_begin without nb_callback_end)"}, NULL},
    {"forward", RETURN_GARBAGE, run_forward, "refused",
     {"sq: forward failed without reporting an error"}, NULL},

    {"backward", FREE_ROOT, run_backward, "deferred (freed when the walk ends)", {NULL}, NULL},
    {"backward", FREE_INPUT, run_backward, "deferred (the graph holds it)", {NULL}, NULL},
    {"backward", FREE_SAVED, run_backward, "refused (borrowed)", {NULL}, BORROWED},
    {"backward", FREE_SAVED, run_backward_create_graph, "refused under create_graph too (borrowed)",
     {NULL}, BORROWED},
    {"backward", FREE_OUTPUT, run_backward, "refused",
     {"nb_backward: the backward of sq returned a freed tensor as the gradient of input 0"}, NULL},
    {"backward", CLOSE_SCOPE, run_backward, "refused", {BWD CLOSED}, NULL},
    {"backward", OPEN_SCOPE, run_backward, "refused (closed)", {BWD LEFT}, NULL},
    {"backward", FLIP_GRAD, run_backward, "refused", {BWD GRAD_ON}, NULL},
    {"backward", START_BACKWARD, run_backward, "refused (same graph)", {NULL},
     "nb_backward: sq's backward " SAME_GRAPH},
    {"forward", RETURN_OTHER, run_forward, "refused",
     {"sq: forward returned a pointer that is not a tensor as output 0"}, NULL},
    {"backward", RETURN_OTHER, run_backward, "refused",
     {"nb_backward: the backward of sq returned a pointer that is not a tensor as the gradient "
      "of input 0"}, NULL},
    {"jvp", RETURN_OTHER, run_jvp, "refused",
     {"nb_jvp: the jvp of sq returned a pointer that is not a tensor"}, NULL},
    {"nb_fn", RETURN_OTHER, run_gradcheck_full, "refused",
     {"nb_gradcheck: the function returned a pointer that is not a tensor"}, NULL},
    {"backward", RETURN_GARBAGE, run_backward, "refused",
     {"nb_backward: the backward of sq returned 7 without reporting an error"}, NULL},

#define JVP "nb_jvp: sq's jvp "
    {"jvp", FREE_ROOT, run_jvp, "allowed (not the graph being pushed through)", {NULL}, NULL},
    {"jvp", FREE_SAVED, run_jvp, "refused (borrowed)", {NULL}, BORROWED},
    {"jvp", FREE_OUTPUT, run_jvp, "refused", {"nb_jvp: the jvp of sq returned a freed tensor"},
     NULL},
    {"jvp", CLOSE_SCOPE, run_jvp, "refused", {JVP CLOSED}, NULL},
    {"jvp", OPEN_SCOPE, run_jvp, "refused (closed)", {JVP LEFT}, NULL},
    {"jvp", FLIP_GRAD, run_jvp, "refused", {JVP GRAD_ON}, NULL},
    {"jvp", START_BACKWARD, run_jvp, "allowed (another graph)", {NULL}, NULL},
    {"jvp", LEAVE_FRAME, run_jvp, "refused (closed)",
     {JVP "left 1 callback frame open (nb_callback_begin without nb_callback_end)"}, NULL},
    {"jvp", RETURN_GARBAGE, run_jvp, "refused",
     {"nb_jvp: the jvp of sq returned NULL without reporting an error"}, NULL},

    {"destroy", FREE_INPUT, run_destroy, "allowed (a tensor of the ending scope)", {NULL}, NULL},
    {"destroy", MAKE_TENSOR, run_destroy, "allowed (freed with the ending scope)", {NULL}, NULL},
    {"destroy", CLOSE_SCOPE, run_destroy, "refused", {"nb_function: sq's destroy " CLOSED}, NULL},
    {"destroy", OPEN_SCOPE, run_destroy, "refused (closed)", {"nb_function: sq's destroy " LEFT}, NULL},
    {"destroy", FLIP_GRAD, run_destroy, "restored", {NULL}, NULL},
    {"destroy", START_BACKWARD, run_destroy, "allowed (another graph)", {NULL}, NULL},

    {"forward_multi", FREE_INPUT, run_forward_multi, "the apply fails (the handle is freed)",
     {"split: forward freed its input 0 (nb_free)"}, NULL},
    {"forward_multi", FREE_OUTPUT, run_forward_multi, "refused",
     {"split: forward returned a freed tensor as output 1"}, NULL},
    {"forward_multi", CLOSE_SCOPE, run_forward_multi, "refused",
     {"nb_function_apply: split's forward " CLOSED}, NULL},
    {"forward_multi", OPEN_SCOPE, run_forward_multi, "refused (closed)",
     {"nb_function_apply: split's forward " LEFT}, NULL},
    {"forward_multi", FLIP_GRAD, run_forward_multi, "refused",
     {"nb_function_apply: split's forward " GRAD_ON}, NULL},
    {"forward_multi", RETURN_GARBAGE, run_forward_multi, "refused",
     {"split: forward failed without reporting an error"}, NULL},

    {"backward_multi", FREE_ROOT, run_backward_multi, "deferred", {NULL}, NULL},
    {"backward_multi", CLOSE_SCOPE, run_backward_multi, "refused",
     {"nb_backward: split's backward " CLOSED}, NULL},
    {"backward_multi", OPEN_SCOPE, run_backward_multi, "refused (closed)",
     {"nb_backward: split's backward " LEFT}, NULL},
    {"backward_multi", FLIP_GRAD, run_backward_multi, "refused",
     {"nb_backward: split's backward " GRAD_ON}, NULL},
    {"backward_multi", START_BACKWARD, run_backward_multi, "refused (same graph)", {NULL},
     "nb_backward: split's backward " SAME_GRAPH},
    {"backward_multi", RETURN_GARBAGE, run_backward_multi, "refused",
     {"nb_backward: the backward of split returned -1 without reporting an error"}, NULL},

#define HOOK "nb_backward: the gradient hook of a leaf of shape (3) "
    {"nb_grad_hook", FREE_ROOT, run_hook, "deferred (freed when the walk ends)", {NULL}, NULL},
    {"nb_grad_hook", FREE_INPUT, run_hook, "deferred (the graph holds the leaf)", {NULL}, NULL},
    {"nb_grad_hook", FREE_SAVED, run_hook, "refused (borrowed .grad)", {NULL}, BORROWED},
    {"nb_grad_hook", FREE_REGISTRY, run_hook, "deferred (the graph holds the parameter)", {NULL}, NULL},
    {"nb_grad_hook", CLOSE_SCOPE, run_hook, "refused", {HOOK CLOSED}, NULL},
    {"nb_grad_hook", OPEN_SCOPE, run_hook, "refused (closed)", {HOOK LEFT}, NULL},
    {"nb_grad_hook", FLIP_GRAD, run_hook, "refused", {HOOK GRAD_ON}, NULL},
    {"nb_grad_hook", START_BACKWARD, run_hook, "refused (same graph)", {NULL},
     "nb_backward: the gradient hook of a leaf of shape (3) " SAME_GRAPH},
    {"nb_grad_hook", LEAVE_FRAME, run_hook, "refused (closed)",
     {HOOK "left 1 callback frame open"}, NULL},
    {"nb_grad_hook", RETURN_GARBAGE, run_hook, "refused",
     {"nb_backward: the gradient-ready hook of a leaf of shape (3) failed without a message"}, NULL},
#define CHOOK "nb_backward: the gradient contribution hook of a leaf of shape (3) "
    {"nb_grad_hook", FREE_ROOT, run_contrib_hook, "deferred (contribution hook)", {NULL}, NULL},
    {"nb_grad_hook", FREE_INPUT, run_contrib_hook, "deferred (contribution hook)", {NULL}, NULL},
    {"nb_grad_hook", FREE_SAVED, run_contrib_hook, "refused (borrowed sum so far)", {NULL}, BORROWED},
    {"nb_grad_hook", CLOSE_SCOPE, run_contrib_hook, "refused (contribution hook)", {CHOOK CLOSED}, NULL},
    {"nb_grad_hook", OPEN_SCOPE, run_contrib_hook, "refused (contribution hook, closed)", {CHOOK LEFT}, NULL},
    {"nb_grad_hook", FLIP_GRAD, run_contrib_hook, "refused (contribution hook)", {CHOOK GRAD_ON}, NULL},
    {"nb_grad_hook", START_BACKWARD, run_contrib_hook, "refused (contribution hook, same graph)", {NULL},
     CHOOK SAME_GRAPH},
    {"nb_grad_hook", RETURN_GARBAGE, run_contrib_hook, "refused (contribution hook)",
     {CHOOK "failed without a message"}, NULL},

    {"nb_fn", FREE_INPUT, run_gradcheck_full, "the check fails (the handle is freed)",
     {"nb_gradcheck: the function freed input 0 (nb_free); it must leave its inputs alive"}, NULL},
    {"nb_fn", FREE_INPUT, run_gradcheck_fast, "the check fails (fast mode)",
     {"nb_gradcheck: the function freed input 0 (nb_free)"}, NULL},
    {"nb_fn", FREE_OUTPUT, run_gradcheck_full, "refused",
     {"nb_gradcheck: the function returned a freed tensor"}, NULL},
    {"nb_fn", CLOSE_SCOPE, run_gradcheck_full, "refused",
     {"nb_gradcheck: the function " CLOSED}, NULL},
    {"nb_fn", CLOSE_SCOPE, run_gradcheck_fast, "refused (fast mode)",
     {"nb_gradcheck: the function " CLOSED}, NULL},
    {"nb_fn", OPEN_SCOPE, run_gradcheck_full, "refused (closed)",
     {"nb_gradcheck: the function " LEFT}, NULL},
    {"nb_fn", FLIP_GRAD, run_gradcheck_full, "restored (the check then fails)",
     {"nb_gradcheck: first-order: MISMATCH"}, NULL},
    {"nb_fn", START_BACKWARD, run_gradcheck_full, "refused (by the graph it released)",
     {"the graph was already backpropagated through nb_mul"}, NULL},
    {"nb_fn", WRITE_INPUT, run_gradcheck_full, "refused (the values are put back)",
     {"nb_gradcheck: the function changed the values of input 0 (wrote it in place); they were "
      "put back"}, NULL},
    {"nb_fn", WRITE_INPUT, run_gradcheck_fast, "refused (fast mode; put back)",
     {"nb_gradcheck: the function changed the values of input 0"}, NULL},
    {"nb_fn", FLIP_REQUIRES, run_gradcheck_full, "refused (put back)",
     {"nb_gradcheck: the function changed requires_grad of input 0 (turned it off); it must "
      "leave its inputs as they are"}, NULL},
    {"nb_fn", RETURN_GARBAGE, run_gradcheck_full, "refused",
     {"nb_gradcheck: the function returned NULL"}, NULL},

#define PFOR "nb_parallel_for: fn on range [0, "
    {"fn", MAKE_TENSOR, run_parallel_for, "allowed (freed when its range ends)", {NULL}, NULL},
    {"fn", KEEP_TENSOR, run_parallel_for, "refused (no scope outside the range on a worker)",
     {NULL}, "nb_keep: there is no scope to hand a tensor to out of nb_parallel_for's ranges"},
    {"fn", CLOSE_SCOPE, run_parallel_for, "refused", {PFOR, CLOSED}, NULL},
    {"fn", OPEN_SCOPE, run_parallel_for, "refused (closed)", {PFOR, LEFT}, NULL},
    {"fn", FLIP_GRAD, run_parallel_for, "restored", {NULL}, NULL},
    {"fn", LEAVE_FRAME, run_parallel_for, "refused (closed)", {PFOR, "left 1 callback frame open"},
     NULL},

    {"on_token", FREE_MODULE, run_on_token, "deferred (generation stops, then frees it)",
     {"nb_gpt_generate: on_token freed the model (nb_gpt_free) after 1 tokens; generation "
      "stopped there and the model is freed now"}, NULL},
    {"on_token", FREE_REGISTRY, run_on_token, "refused (generation stops)",
     {"nb_gpt_generate: on_token freed the model's parameters (nb_params_free on its registry) "
      "after 1 tokens; generation stopped there"}, NULL},
    {"on_token", REINIT_MODEL, run_on_token, "refused (generation stops, the old model is freed)",
     {"nb_gpt_generate: on_token re-initialized the model being generated from (after 1 "
      "tokens)"}, NULL},
    {"on_token", CLOSE_SCOPE, run_on_token, "refused", {"nb_gpt_generate: on_token " CLOSED}, NULL},
    {"on_token", OPEN_SCOPE, run_on_token, "refused (closed)",
     {"nb_gpt_generate: on_token " LEFT}, NULL},
    {"on_token", FLIP_GRAD, run_on_token, "restored", {NULL}, NULL},
    {"on_token", LEAVE_FRAME, run_on_token, "refused (closed)",
     {"nb_gpt_generate: on_token left 1 callback frame open"}, NULL},
    {"on_token", START_BACKWARD, run_on_token, "refused (a second generation)", {NULL},
     "nb_gpt_generate: the model is generating already (an on_token called nb_gpt_generate "
     "on it)"},
};
#define NROWS ((int)(sizeof table / sizeof table[0]))

static const char *label(const row *r) {
    static char buf[128];
    snprintf(buf, sizeof buf, "%s x %s", r->kind, misdeed_name[r->what]);
    return buf;
}

/* The table as docs/custom-functions.md shows it (make callback-table). */
void print_callback_table(FILE *f) {
    fprintf(f, "| callback | misbehaviour | what nabla does | the message (or what the "
               "callback's own call gets) |\n| --- | --- | --- | --- |\n");
    for (int i = 0; i < NROWS; i++) {
        const row *r = &table[i];
        const char *m = r->msg[0] ? r->msg[0] : r->inner;
        fprintf(f, "| `%s` | %s | %s | %s%s%s |\n", r->kind, misdeed_name[r->what], r->does,
                m ? "`" : "", m ? m : "none: it succeeds", m ? "...`" : "");
    }
}

START_TEST(the_docs_show_this_table) {
    char *doc = test_read_file(NB_FIXTURE_DIR "/../../docs/custom-functions.md", NULL);
    const char *begin = "<!-- callback table: made from tests/test_callbacks.c by make "
                        "callback-table -->\n";
    char *a = strstr(doc, begin), *b = a ? strstr(a, "<!-- end of callback table -->") : NULL;
    ck_assert_msg(a && b, "docs/custom-functions.md: no callback table markers");
    a += strlen(begin);
    char *want = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&want, &n);
    ck_assert_ptr_nonnull(f);
    print_callback_table(f);
    fclose(f);
    ck_assert_msg((size_t)(b - a) == n && memcmp(a, want, n) == 0,
                  "docs/custom-functions.md's callback table differs from the test's table: "
                  "run make callback-table");
    free(want);
    free(doc);
}
END_TEST

START_TEST(callback_misbehaves) {
    const row *r = &table[_i];
    int64_t live = nb_live_tensors(), bytes = nb_memory_allocated();
    int depth = nb_scope_depth();
    bool grad = nb_grad_enabled();
    nb_scope_begin();
    nb_tensor *mine = nb_ones(NB_F32, NB_SHAPE(6)); /* the caller's: must survive */
    row_misdeed = r->what;
    row_kind = r->kind;
    root = victim = NULL;
    inner_msg[0] = 0;
    inner_rc = 1;
    nb_clear_error();
    int rc = r->run();
    const char *msg = nb_last_error() ? nb_last_error() : "(no message)";
    if (r->msg[0]) {
        ck_assert_msg(rc < 0, "%s: succeeded, expected an error", label(r));
        for (int k = 0; k < 3 && r->msg[k]; k++)
            ck_assert_msg(strstr(msg, r->msg[k]), "%s: message \"%s\" lacks \"%s\"", label(r),
                          msg, r->msg[k]);
    } else {
        ck_assert_msg(rc == 0, "%s: failed: %s", label(r), msg);
    }
    if (r->inner)
        ck_assert_msg(strstr(inner_msg, r->inner), "%s: the callback's call said \"%s\", "
                      "expected \"%s\"", label(r), inner_msg, r->inner);
    if (r->inner && r->what == START_BACKWARD) ck_assert_int_lt(inner_rc, 0);
    nb_clear_error();
    ck_assert_msg(nb_scope_depth() == depth + 1, "%s: scope depth %d, expected %d", label(r),
                  nb_scope_depth(), depth + 1);
    ck_assert_msg(nb_numel(mine) == 6, "%s: the caller's tensor was freed: %s", label(r),
                  nb_last_error() ? nb_last_error() : "");
    ck_assert_msg(nb_grad_enabled() == grad, "%s: grad mode changed", label(r));
    nb_scope_end();
    ck_assert_int_eq(nb_scope_depth(), depth);
    ck_assert_msg(nb_live_tensors() == live, "%s: %lld tensor(s) left alive", label(r),
                  (long long)(nb_live_tensors() - live));
    ck_assert_msg(nb_memory_allocated() == bytes, "%s: %lld storage bytes left", label(r),
                  (long long)(nb_memory_allocated() - bytes));
}
END_TEST

/* Every function pointer declared in nabla.h ("(*name)") is a kind of the
 * table, with rows; and every kind of the table is declared there. */
static bool has_rows(const char *kind) {
    for (int i = 0; i < NROWS; i++)
        if (strcmp(table[i].kind, kind) == 0) return true;
    return false;
}

/* Blanks out comments, so that only declarations are read. */
static void strip_comments(char *s) {
    for (char *p = s; (p = strstr(p, "/*"));) {
        char *e = strstr(p + 2, "*/");
        char *stop = e ? e + 2 : p + strlen(p);
        for (; p < stop; p++) *p = ' ';
    }
}

START_TEST(the_table_covers_every_callback_of_nabla_h) {
    char *src = test_read_file(NB_FIXTURE_DIR "/../../nabla.h", NULL);
    strip_comments(src);
    int kinds = 0;
    for (char *p = strstr(src, "(*"); p; p = strstr(p + 2, "(*")) {
        char name[64];
        int len = 0;
        for (const char *q = p + 2; (*q == '_' || (*q >= 'a' && *q <= 'z') ||
                                     (*q >= 'A' && *q <= 'Z') || (*q >= '0' && *q <= '9')) &&
                                    len < 63;
             q++)
            name[len++] = *q;
        name[len] = 0;
        if (len == 0 || p[2 + len] != ')') continue; /* not a declarator "(*name)" */
        ck_assert_msg(has_rows(name), "nabla.h declares the callback \"%s\", which "
                      "tests/test_callbacks.c's table has no rows for", name);
        kinds++;
    }
    for (int i = 0; i < NROWS; i++) {
        char pat[80];
        snprintf(pat, sizeof pat, "(*%s)", table[i].kind);
        ck_assert_msg(strstr(src, pat), "the table's kind \"%s\" is not declared in nabla.h",
                      table[i].kind);
    }
    free(src);
    ck_assert_int_ge(kinds, 9);
    printf("callbacks: %d callback declarations of nabla.h, %d rows\n", kinds, NROWS);
}
END_TEST

/* ------------------------------------------------ beside the table */
/* A hook freeing the root under valgrind's eye: the release build used to
 * return 0 over freed nodes; now the graph goes once, after the walk. */
START_TEST(nb_callback_begin_end_pairs) {
    int depth = nb_scope_depth();
    char *fn = strdup("my_lib"); /* the frame keeps its own copy of fn */
    int a = nb_callback_begin(fn, "my_callback");
    free(fn);
    ck_assert_int_gt(a, 0);
    nb_scope_end(); /* not opened inside */
    expect_error_rc(nb_callback_end(a), "my_lib: my_callback closed a scope it did not open");
    char want[160];
    snprintf(want, sizeof want, "nb_callback_end: %d is not the token of an nb_callback_begin open "
             "in this callback (none runs on this thread)", a);
    expect_error_rc(nb_callback_end(a), want);
    /* tokens are not reused: a stale one, or a guessed small one, ends nothing */
    int b = nb_callback_begin("my_lib", "b");
    ck_assert_int_ne(b, a);
    expect_error_rc(nb_callback_end(a), "is not the token of an nb_callback_begin open in this "
                                        "callback (b)");
    expect_error_rc(nb_callback_end(1), "nb_callback_end: 1 is not the token");
    ck_assert_int_eq(nb_callback_end(b), 0);
    /* a frame the callback left open is closed with its own */
    a = nb_callback_begin("my_lib", "outer");
    b = nb_callback_begin("my_lib", "inner");
    ck_assert_int_gt(b, 0);
    nb_scope_begin();
    expect_error_rc(nb_callback_end(a), "my_lib: outer left 1 callback frame open "
                                        "(nb_callback_begin without nb_callback_end)");
    ck_assert_int_eq(nb_scope_depth(), depth);
    a = nb_callback_begin("my_lib", "cb");
    ck_assert_int_eq(nb_callback_end(a), 0);
    ck_assert_int_eq(nb_scope_depth(), depth);
}
END_TEST

/* A registry held is freed at the last release; an optimizer keeps its own
 * copy of the names, so a registry freed under it (by a hook, say) is
 * reported by the optimizer's calls, not read after free. */
START_TEST(registries_held_and_freed_under_an_optimizer) {
    int64_t live = nb_live_tensors();
    nb_params *ps = nb_params_new();
    nb_scope_begin();
    ck_assert_ptr_nonnull(nb_params_add(ps, "w", nb_ones(NB_F64, NB_SHAPE(3))));
    nb_scope_end();
    nb_params_hold(ps);
    nb_params_free(ps); /* deferred */
    ck_assert_int_eq(nb_params_count(ps), 1);
    ck_assert_ptr_nonnull(nb_params_get(ps, "w"));
    nb_params_release(ps); /* freed now */
    ck_assert_int_eq(nb_live_tensors(), live);
    ps = nb_params_new();
    nb_params_release(ps);
    expect_error(NULL, "nb_params_release: the registry is not held (nb_params_hold first)");
    nb_scope_begin();
    ck_assert_ptr_nonnull(nb_params_add(ps, "w", nb_ones(NB_F64, NB_SHAPE(3))));
    nb_scope_end();
    nb_optim *o = nb_adam(ps, 0.1, 0.9, 0.999, 1e-8, 0.0);
    ck_assert_ptr_nonnull(o);
    nb_params_free(ps);
    ck_assert_int_eq(nb_optim_set_weight_decay(o, "w", 0.5), 0); /* its own names */
    nb_clear_error();
    nb_optim_step(o); /* void: reports through the message */
    expect_error(NULL, "was freed (with its owner");
    nb_optim_free(o);
    ck_assert_int_eq(nb_live_tensors(), live);
}
END_TEST

/* nabla's own functions that need grad mode on (nb_gradcheck) work inside
 * callbacks that run with it off: the refusal is for the callback's own
 * nb_set_grad_enabled(true), not for what nabla does inside. */
static nb_tensor *cube(nb_tensor **in, int n, void *ctx) {
    (void)n;
    (void)ctx;
    return nb_mul(nb_mul(in[0], in[0]), in[0]);
}
static int checks_ok;
static void gradcheck_here(void) {
    nb_tensor *z = nb_set_requires_grad(nb_from_data(NB_F64, NB_SHAPE(2), (double[]){1, -2}), true);
    nb_gradcheck_result r;
    checks_ok += nb_gradcheck(cube, NULL, 1, &z, NULL, &r) && r.checked == 4;
    ck_assert_msg(!nb_grad_enabled(), "grad mode on after nb_gradcheck in a callback");
    nb_free(z);
}
static int hook_gradchecks(nb_tensor *leaf, void *ctx) {
    (void)leaf;
    (void)ctx;
    gradcheck_here();
    return 0;
}
static nb_tensor *forward_gradchecks(nb_function_ctx *c, nb_tensor **in, int n, void *user) {
    (void)c;
    (void)n;
    (void)user;
    gradcheck_here();
    return nb_mul_scalar(in[0], 2.0);
}
static int double_backward(nb_function_ctx *c, nb_tensor *g, nb_tensor **gin, void *user) {
    (void)c;
    (void)user;
    gradcheck_here();
    gin[0] = nb_mul_scalar(g, 2.0);
    return 0;
}

START_TEST(gradcheck_inside_callbacks) {
    int64_t live = nb_live_tensors();
    const nb_function twice = {.name = "twice", .forward = forward_gradchecks,
                               .backward = double_backward};
    nb_tensor *x = leaf123();
    ck_assert_int_eq(nb_set_grad_hook(x, hook_gradchecks, NULL), 0);
    checks_ok = 0;
    nb_scope_begin();
    nb_tensor *y = nb_function_apply(&twice, &x, 1, NULL);
    ck_assert_msg(y != NULL, "%s", nb_last_error());
    ck_assert_msg(nb_backward(nb_sum_all(y)) == 0, "%s", nb_last_error());
    ck_assert_int_eq(checks_ok, 3); /* in forward, in backward, in the hook */
    for (int i = 0; i < 3; i++) ck_assert_double_eq(nb_item(nb_select(nb_grad(x), 0, i)), 2.0);
    nb_scope_end();
    nb_free(x);
    ck_assert_int_eq(nb_live_tensors(), live);
}
END_TEST

/* Two threads backpropagate at once, and each one's hook frees the other's
 * leaf and a tensor in the middle of the other's graph (persistent ones, so
 * any thread may free them): the objects wait for the walks; TSan (make
 * tsan runs this suite) sees no race on the handles' flags. */
#define CHAIN 60
static nb_tensor *xleaf[2], *xchain[2][CHAIN + 2];
static _Atomic int xready;
static int free_the_others(nb_tensor *l, void *c) {
    (void)l;
    int other = 1 - (int)(intptr_t)c;
    nb_free(xleaf[other]);
    nb_free(xchain[other][CHAIN / 2]);
    return 0;
}
static void *walk_mine(void *a) {
    int me = (int)(intptr_t)a;
    nb_tensor *h = xleaf[me];
    for (int i = 0; i < CHAIN; i++) xchain[me][i] = h = nb_tanh(h);
    xchain[me][CHAIN] = nb_sum_all(xchain[me][CHAIN + 1] = nb_mul(h, xleaf[me]));
    xready++;
    while (xready < 2) {
    }
    return (void *)(intptr_t)nb_backward(xchain[me][CHAIN]);
}

START_TEST(hooks_free_what_another_thread_walks) {
    int64_t live = nb_live_tensors();
    for (int rep = 0; rep < 4; rep++) {
        xready = 0;
        for (int i = 0; i < 2; i++) {
            xleaf[i] = nb_set_requires_grad(nb_full(NB_F64, NB_SHAPE(64), 0.1), true);
            ck_assert_int_eq(nb_set_grad_hook(xleaf[i], free_the_others, (void *)(intptr_t)i), 0);
        }
        pthread_t t[2];
        for (int i = 0; i < 2; i++)
            ck_assert_int_eq(pthread_create(&t[i], NULL, walk_mine, (void *)(intptr_t)i), 0);
        for (int i = 0; i < 2; i++) {
            void *rc;
            pthread_join(t[i], &rc);
            ck_assert_int_eq((int)(intptr_t)rc, 0);
        }
        for (int i = 0; i < 2; i++)
            for (int k = 0; k <= CHAIN + 1; k++)
                if (k != CHAIN / 2) nb_free(xchain[i][k]);
    }
    ck_assert_int_eq(nb_live_tensors(), live);
}
END_TEST

/* n_new means "until on_token stops" when it is huge: no allocation of
 * n_new tokens, out may be NULL. */
static int64_t stop_after;
static bool count_down(int64_t tok, void *user) {
    (void)tok;
    (void)user;
    return --stop_after > 0;
}

START_TEST(generate_huge_n_new) {
    int64_t base = nb_live_tensors();
    nb_params *ps = nb_params_new();
    nb_GPT m;
    ck_assert_int_eq(nb_gpt_init(&m, ps, &tiny_gpt, NULL), 0);
    const int64_t prompt[2] = {1, 2};
    const int64_t huge[] = {INT64_MAX, INT64_C(1) << 61, INT64_MAX / 8 + 1};
    for (int i = 0; i < 3; i++) {
        stop_after = 20; /* past 2 x block_size: the history wraps */
        ck_assert_int_eq(nb_gpt_generate(&m, prompt, 2, huge[i], NULL, NULL, NULL, count_down,
                                         NULL), 20);
    }
    int64_t out[20];
    nb_gpt_sample_opts greedy = {.greedy = true};
    stop_after = 20;
    int64_t a[20];
    ck_assert_int_eq(nb_gpt_generate(&m, prompt, 2, 20, &greedy, NULL, a, NULL, NULL), 20);
    ck_assert_int_eq(nb_gpt_generate(&m, prompt, 2, INT64_MAX, &greedy, NULL, NULL, count_down,
                                     NULL), 20);
    stop_after = 20;
    ck_assert_int_eq(nb_gpt_generate(&m, prompt, 2, 20, &greedy, NULL, out, count_down, NULL),
                     20);
    for (int i = 0; i < 20; i++) ck_assert_int_eq(out[i], a[i]);
    nb_gpt_free(&m);
    nb_params_free(ps);
    ck_assert_int_eq(nb_live_tensors(), base);
}
END_TEST

/* A temperature so small that the logits overflow is named as such. */
START_TEST(generate_tiny_temperature) {
    nb_params *ps = nb_params_new();
    nb_GPT m;
    ck_assert_int_eq(nb_gpt_init(&m, ps, &tiny_gpt, NULL), 0);
    const int64_t prompt[2] = {1, 2};
    int64_t out[4];
    nb_gpt_sample_opts o = {.temperature = 1e-300};
    expect_error_rc(nb_gpt_generate(&m, prompt, 2, 4, &o, NULL, out, NULL, NULL),
                    "nb_gpt_generate: temperature 1e-300 is too small: the largest logit",
                    "divided by it overflows f32; use a temperature of at least");
    o.temperature = 1e-30; /* small but finite after the division: samples (the argmax) */
    ck_assert_int_eq(nb_gpt_generate(&m, prompt, 2, 4, &o, NULL, out, NULL, NULL), 4);
    nb_gpt_free(&m);
    nb_params_free(ps);
}
END_TEST

Suite *suite_callbacks(void) {
    Suite *s = suite_create("callbacks");
    TCase *tc = tcase_create("callbacks");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, the_table_covers_every_callback_of_nabla_h);
    tcase_add_test(tc, the_docs_show_this_table);
    tcase_add_loop_test(tc, callback_misbehaves, 0, NROWS);
    tcase_add_test(tc, nb_callback_begin_end_pairs);
    tcase_add_test(tc, registries_held_and_freed_under_an_optimizer);
    tcase_add_test(tc, gradcheck_inside_callbacks);
    tcase_add_test(tc, hooks_free_what_another_thread_walks);
    tcase_add_test(tc, generate_huge_n_new);
    tcase_add_test(tc, generate_tiny_temperature);
    suite_add_tcase(s, tc);
    return s;
}
