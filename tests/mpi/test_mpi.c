/* test_mpi.c: nabla_mpi under mpirun (make test-mpi runs it on 2 and 4
 * ranks). Every rank runs every test, in the same order, without forking
 * (CK_NOFORK: a forked child cannot use MPI); rank 0 prints Check's report,
 * and the exit status is nonzero when any rank failed a test.
 *
 * The data-parallel tests train a small MLP on a global batch of B rows,
 * each rank on its B/N rows, and compare with the same model trained on
 * every rank alone on all B rows (the single-process reference). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nabla.h"
#include "nabla_mpi.h"

#define B 16  /* global batch: divisible by 1, 2 and 4 ranks */
#define IN 5
#define HID 7

static int rank, size;
static char before_init[256]; /* nb_mpi_mean's message before nb_mpi_init */
static nb_ddp_stats last_stats; /* of train_both's last run */

typedef struct {
    nb_params *ps;
    nb_Linear l1, l2;
} mlp;

static void mlp_init(mlp *m, nb_dtype dt, uint64_t seed) {
    nb_dtype was = nb_default_dtype();
    nb_set_default_dtype(dt);
    nb_rng r;
    nb_rng_seed(&r, seed);
    m->ps = nb_params_new();
    ck_assert_int_eq(nb_linear_init(&m->l1, m->ps, "l1", IN, HID, true, &r), 0);
    ck_assert_int_eq(nb_linear_init(&m->l2, m->ps, "l2", HID, 1, true, &r), 0);
    nb_set_default_dtype(was);
}

/* The global batch (the same on every rank) and rows [lo, hi) of it. */
static void batch(nb_dtype dt, int step, int lo, int hi, nb_tensor **x, nb_tensor **y) {
    nb_rng r;
    nb_rng_seed(&r, 1000 + (uint64_t)step);
    nb_tensor *X = nb_randn(dt, NB_SHAPE(B, IN), &r), *Y = nb_randn(dt, NB_SHAPE(B, 1), &r);
    *x = nb_narrow(X, 0, lo, hi - lo);
    *y = nb_narrow(Y, 0, lo, hi - lo);
}

/* mean((mlp(x) - y)^2) over the rows given */
static nb_tensor *loss_of(mlp *m, nb_tensor *x, nb_tensor *y) {
    nb_tensor *h = nb_tanh(nb_linear_forward(&m->l1, x));
    nb_tensor *d = nb_sub(nb_linear_forward(&m->l2, h), y);
    return nb_mean_all(nb_mul(d, d));
}

/* The largest |a - b| / max(1, |b|) over every parameter. */
static double max_rel_diff(nb_params *a, nb_params *b) {
    double worst = 0;
    for (int i = 0; i < nb_params_count(a); i++) {
        nb_tensor *ta = nb_params_at(a, i, NULL), *tb = nb_params_at(b, i, NULL);
        int64_t n = nb_numel(ta);
        double *va = malloc((size_t)n * sizeof *va), *vb = malloc((size_t)n * sizeof *vb);
        nb_copy_to_f64(ta, va);
        nb_copy_to_f64(tb, vb);
        for (int64_t k = 0; k < n; k++) {
            double d = fabs(va[k] - vb[k]) / fmax(1.0, fabs(vb[k]));
            if (d > worst) worst = d;
        }
        free(va);
        free(vb);
    }
    return worst;
}

/* Trains `steps` SGD steps data-parallel (model m, through ddp) and alone on
 * the whole batch (ref); returns the worst relative difference of the
 * weights, and of the losses (the mean of the ranks' losses against the
 * reference's) in *loss_diff. */
static double train_both(nb_dtype dt, int steps, int64_t bucket_bytes, double *loss_diff,
                         nb_params **weights_out) {
    mlp m, ref;
    mlp_init(&m, dt, 7 + (uint64_t)rank); /* different on each rank: the broadcast fixes it */
    mlp_init(&ref, dt, 7);
    nb_ddp *ddp = nb_ddp_new(m.ps, &(nb_ddp_opts){.bucket_bytes = bucket_bytes});
    ck_assert_msg(ddp != NULL, "%s", nb_last_error());
    nb_optim *opt = nb_sgd(m.ps, 0.1, 0.0, 0.0), *ropt = nb_sgd(ref.ps, 0.1, 0.0, 0.0);
    int per = B / size;
    *loss_diff = 0;
    for (int s = 0; s < steps; s++) {
        nb_scope_begin();
        nb_tensor *x, *y;
        batch(dt, s, rank * per, (rank + 1) * per, &x, &y);
        nb_tensor *loss = loss_of(&m, x, y);
        int rc = loss ? nb_backward(loss) : -1;
        ck_assert_msg(nb_ddp_sync(ddp, rc) == 0, "%s", nb_last_error());
        double mean_loss = nb_mpi_mean(nb_item(loss));
        nb_optim_step(opt);
        nb_optim_zero_grad(opt);
        batch(dt, s, 0, B, &x, &y);
        nb_tensor *rloss = loss_of(&ref, x, y);
        ck_assert_int_eq(nb_backward(rloss), 0);
        nb_optim_step(ropt);
        nb_optim_zero_grad(ropt);
        double d = fabs(mean_loss - nb_item(rloss)) / fmax(1.0, fabs(nb_item(rloss)));
        if (d > *loss_diff) *loss_diff = d;
        nb_scope_end();
    }
    double w = max_rel_diff(m.ps, ref.ps);
    nb_ddp_stats st = nb_ddp_get_stats(ddp);
    ck_assert_int_eq(st.steps, steps);
    last_stats = st;
    nb_ddp_free(ddp);
    nb_optim_free(opt);
    nb_optim_free(ropt);
    if (weights_out) *weights_out = m.ps;
    else nb_params_free(m.ps);
    nb_params_free(ref.ps);
    return w;
}

START_TEST(rank_size_and_mean) {
    ck_assert_int_ge(size, 1);
    ck_assert_int_lt(rank, size);
    ck_assert(nb_mpi_mean((double)rank) == (double)(size - 1) / 2);
}
END_TEST

/* Each rank starts from its own weights; after the broadcast all hold rank
 * 0's, which the mean of a checksum shows. */
START_TEST(broadcast_gives_rank_0s_weights) {
    mlp m, r0;
    mlp_init(&m, NB_F64, 100 + (uint64_t)rank);
    mlp_init(&r0, NB_F64, 100);
    ck_assert_int_eq(nb_mpi_broadcast_params(m.ps, 0), 0);
    ck_assert(max_rel_diff(m.ps, r0.ps) == 0);
    nb_params_free(m.ps);
    nb_params_free(r0.ps);
}
END_TEST

/* 5 SGD steps data-parallel and on one process agree within `bound`. */
static void expect_agreement(nb_dtype dt, int64_t bucket_bytes, double bound) {
    double ld, wd = train_both(dt, 5, bucket_bytes, &ld, NULL);
    if (rank == 0)
        printf("mpi ok  %d ranks, %s, %s buckets, 5 SGD steps: weights within %.1e, losses "
               "within %.1e of one process\n", size, nb_dtype_name(dt),
               bucket_bytes ? "64-byte" : "25 MiB", wd, ld);
    ck_assert_msg(wd <= bound && ld <= bound, "weights %.3e, losses %.3e", wd, ld);
}

/* f64: to rounding. */
START_TEST(ddp_agrees_with_one_process_f64) { expect_agreement(NB_F64, 0, 1e-13); }
END_TEST

/* f32, with buckets of 64 bytes (several per step, started from the hooks
 * while backward runs): within f32 rounding. */
START_TEST(ddp_agrees_with_one_process_f32_small_buckets) {
    expect_agreement(NB_F32, 64, 2e-6);
    /* parameters of 35, 7, 7 and 1 floats, bucketed last first: (1, 7, 7)
     * in 60 bytes, then l1.weight alone; both start from the hooks, while
     * backward runs */
    ck_assert_int_eq(last_stats.buckets, 2);
    ck_assert_msg(last_stats.early == 1.0, "%.2f of the buckets started early", last_stats.early);
}
END_TEST

/* The same run twice gives the same bits (the reduction has a fixed order). */
START_TEST(ddp_is_deterministic) {
    double ld;
    nb_params *a, *b;
    train_both(NB_F32, 3, 64, &ld, &a);
    train_both(NB_F32, 3, 64, &ld, &b);
    ck_assert(max_rel_diff(a, b) == 0);
    nb_params_free(a);
    nb_params_free(b);
}
END_TEST

/* A rank that failed makes every rank's nb_ddp_sync fail with its message,
 * then the next step works again. */
START_TEST(a_failed_rank_stops_every_rank) {
    mlp m;
    mlp_init(&m, NB_F64, 3);
    nb_ddp *ddp = nb_ddp_new(m.ps, NULL);
    ck_assert_ptr_nonnull(ddp);
    int bad = size - 1;
    nb_scope_begin();
    nb_tensor *x, *y;
    batch(NB_F64, 0, 0, B, &x, &y);
    int rc;
    if (rank == bad) { /* a bad shape: the forward fails before backward */
        rc = nb_linear_forward(&m.l1, nb_narrow(x, 1, 0, 2)) ? 0 : -1;
        ck_assert_int_eq(rc, -1);
    } else {
        rc = nb_backward(loss_of(&m, x, y));
    }
    ck_assert_int_eq(nb_ddp_sync(ddp, rc), -1);
    char want[256];
    snprintf(want, sizeof want, "nb_ddp_sync: rank %d failed: nb_linear_forward: nb_linear: ", bad);
    ck_assert_msg(strncmp(nb_last_error(), want, strlen(want)) == 0, "%s", nb_last_error());
    nb_optim *opt = nb_sgd(m.ps, 0.1, 0, 0);
    nb_optim_zero_grad(opt);
    ck_assert_int_eq(nb_ddp_sync(ddp, nb_backward(loss_of(&m, x, y))), 0);
    nb_scope_end();
    nb_optim_free(opt);
    nb_ddp_free(ddp);
    nb_params_free(m.ps);
}
END_TEST

/* Models that differ between ranks are refused on every rank, by name: by
 * nb_ddp_new's agreement on the layout when a parameter's size or dtype
 * differs, by the broadcast's registry check when only its shape does. */
START_TEST(different_models_are_refused) {
    for (int same_size = 0; same_size < 2; same_size++) {
        nb_params *ps = nb_params_new();
        nb_rng r;
        nb_rng_seed(&r, 1);
        nb_Linear a;
        bool odd = rank == size - 1 && size > 1;
        /* a.weight (4,3), and on the last rank (5,3), or (3,4) without a bias */
        ck_assert_int_eq(nb_linear_init(&a, ps, "a", odd && same_size ? 4 : 3,
                                        odd ? (same_size ? 3 : 5) : 4, !same_size, &r), 0);
        int64_t live = nb_live_tensors();
        nb_ddp *ddp = nb_ddp_new(ps, NULL);
        if (size > 1) {
            ck_assert_ptr_null(ddp);
            char want[320];
            if (same_size)
                snprintf(want, sizeof want, "nb_mpi_broadcast_params: rank %d failed: its tensor "
                         "0, \"a.weight\" (f32, 2 dims), differs from rank 0's (name, dtype or "
                         "shape): the model must be built the same on every rank", size - 1);
            else
                snprintf(want, sizeof want, "nb_ddp_new: the ranks disagree on the parameters: "
                         "parameter 0 (\"a.weight\") has 12 elements on rank 0, 15 on rank %d; "
                         "the model must be built the same on every rank", size - 1);
            ck_assert_str_eq(nb_last_error(), want);
            ck_assert_int_eq(nb_live_tensors(), live);
        }
        nb_ddp_free(ddp);
        nb_params_free(ps);
    }
    /* the same model in f64 on the last rank */
    mlp m;
    mlp_init(&m, rank == size - 1 ? NB_F64 : NB_F32, 1);
    nb_ddp *ddp = nb_ddp_new(m.ps, NULL);
    if (size > 1) {
        ck_assert_ptr_null(ddp);
        char want[256];
        snprintf(want, sizeof want, "nb_ddp_new: the ranks disagree on the parameters: parameter "
                 "0 (\"l1.weight\") is f32 on rank 0, f64 on rank %d; the model must be built "
                 "the same on every rank", size - 1);
        ck_assert_str_eq(nb_last_error(), want);
    }
    nb_ddp_free(ddp);
    nb_params_free(m.ps);
}
END_TEST

/* One training step through d on this rank's rows: 0 or -1. */
static int one_step(mlp *m, nb_ddp *d) {
    int per = B / size;
    nb_scope_begin();
    nb_tensor *x, *y;
    batch(NB_F32, 0, rank * per, (rank + 1) * per, &x, &y);
    int rc = nb_ddp_sync(d, nb_backward(loss_of(m, x, y)));
    nb_params_zero_grad(m->ps);
    nb_scope_end();
    return rc;
}

/* bucket_bytes that differ between ranks (issue 25, item 7: nb_ddp_new
 * succeeded, then the first backward died with MPI_ERR_TRUNCATE) are refused
 * by nb_ddp_new on every rank, naming both values; nothing is left behind
 * (no tensor, no hook), and an nb_ddp_new with the same options on every
 * rank then trains. */
START_TEST(different_bucket_bytes_are_refused) {
    mlp m;
    mlp_init(&m, NB_F32, 21);
    int64_t live = nb_live_tensors();
    /* parameters of 35, 7, 7 and 1 floats: 64 bytes make 2 buckets, 1 MiB 1 */
    int64_t bytes = rank == 0 ? 64 : (int64_t)1 << 20;
    nb_ddp *ddp = nb_ddp_new(m.ps, &(nb_ddp_opts){.bucket_bytes = bytes});
    if (size > 1) {
        ck_assert_ptr_null(ddp);
        ck_assert_str_eq(nb_last_error(), "nb_ddp_new: the ranks disagree on the gradient "
                         "buckets: rank 0 has bucket_bytes 64 (2 buckets), rank 1 has 1048576 "
                         "(1 bucket); every rank must pass the same nb_ddp_opts");
        ck_assert_int_eq(nb_live_tensors(), live);
        /* no hook is left on the parameters: a plain backward works */
        nb_scope_begin();
        nb_tensor *x, *y;
        batch(NB_F32, 0, 0, B, &x, &y);
        ck_assert_int_eq(nb_backward(loss_of(&m, x, y)), 0);
        nb_params_zero_grad(m.ps);
        nb_scope_end();
    }
    nb_ddp_free(ddp);
    /* the same options everywhere: MPI is fine, the step works */
    ddp = nb_ddp_new(m.ps, &(nb_ddp_opts){.bucket_bytes = 64});
    ck_assert_msg(ddp != NULL, "%s", nb_last_error());
    ck_assert_msg(one_step(&m, ddp) == 0, "%s", nb_last_error());
    ck_assert_int_eq(nb_ddp_get_stats(ddp).buckets, 2);
    ck_assert_int_eq(nb_ddp_get_stats(ddp).steps, 1);
    nb_ddp_free(ddp);
    /* 0 is the default, 25 MiB: the same bucket_bytes as 25 MiB given */
    ddp = nb_ddp_new(m.ps, &(nb_ddp_opts){.bucket_bytes = rank == 0 ? 0 : (int64_t)25 << 20});
    ck_assert_msg(ddp != NULL, "%s", nb_last_error());
    ck_assert_msg(one_step(&m, ddp) == 0, "%s", nb_last_error());
    nb_ddp_free(ddp);
    nb_params_free(m.ps);
}
END_TEST

/* A rank with more parameters than rank 0: refused on every rank with both
 * counts. */
START_TEST(different_parameter_counts_are_refused) {
    mlp m;
    mlp_init(&m, NB_F32, 22);
    nb_Linear extra;
    nb_rng r;
    nb_rng_seed(&r, 2);
    if (rank == size - 1 && size > 1)
        ck_assert_int_eq(nb_linear_init(&extra, m.ps, "l3", 1, 2, true, &r), 0);
    int64_t live = nb_live_tensors();
    nb_ddp *ddp = nb_ddp_new(m.ps, NULL);
    if (size > 1) {
        ck_assert_ptr_null(ddp);
        char want[256];
        snprintf(want, sizeof want, "nb_ddp_new: the ranks disagree on the parameters: rank 0 "
                 "has 4 parameters, rank %d has 6; the model must be built the same on every "
                 "rank", size - 1);
        ck_assert_str_eq(nb_last_error(), want);
        ck_assert_int_eq(nb_live_tensors(), live);
    }
    nb_ddp_free(ddp);
    nb_params_free(m.ps);
}
END_TEST

/* nb_ddp_new failing on one rank (here ps is NULL there) fails on every
 * rank with that rank's message, instead of the others waiting for it in
 * the broadcast; the next nb_ddp_new works. */
START_TEST(a_failed_nb_ddp_new_fails_everywhere) {
    mlp m;
    mlp_init(&m, NB_F32, 23);
    int bad = size - 1;
    ck_assert_ptr_null(nb_ddp_new(rank == bad ? NULL : m.ps, NULL));
    char want[128];
    snprintf(want, sizeof want, "nb_ddp_new: rank %d failed: nb_ddp_new: ps is NULL", bad);
    ck_assert_str_eq(nb_last_error(), want);
    nb_ddp *ddp = nb_ddp_new(m.ps, NULL);
    ck_assert_msg(ddp != NULL, "%s", nb_last_error());
    ck_assert_msg(one_step(&m, ddp) == 0, "%s", nb_last_error());
    nb_ddp_free(ddp);
    nb_params_free(m.ps);
}
END_TEST

/* Values in an optimizer's state (its tensors are buffers and parameters). */
static double state_values(nb_optim *opt) {
    nb_params *st = nb_optim_state(opt);
    double n = (double)nb_params_numel(st);
    for (int i = 0; i < nb_params_buffer_count(st); i++)
        n += (double)nb_numel(nb_params_buffer_at(st, i, NULL));
    return n;
}

/* nb_mpi_agree: one rank's failure, with its message, reaches every rank. */
START_TEST(agree_gives_every_rank_the_failure) {
    ck_assert_int_eq(nb_mpi_agree("saving", 0), 0);
    int bad = size - 1;
    if (rank == bad) nb_report_error("cannot write /x.tmp: No space left on device");
    ck_assert_int_eq(nb_mpi_agree("saving", rank == bad ? -1 : 0), -1);
    char want[128];
    snprintf(want, sizeof want, "saving: rank %d failed: cannot write /x.tmp: No space left on "
             "device", bad);
    ck_assert_str_eq(nb_last_error(), want);
    ck_assert_int_eq(nb_mpi_agree("saving", 0), 0); /* and the next one is fine */
}
END_TEST

/* Misuse reports a message on every rank: two backwards in one step, a
 * root that is not a rank, a shard step without a shard optimizer, a second
 * nb_mpi_init; and the step after works. */
START_TEST(misuse_is_reported) {
    mlp m;
    mlp_init(&m, NB_F64, 5);
    nb_ddp *ddp = nb_ddp_new(m.ps, NULL);
    ck_assert_ptr_nonnull(ddp);
    nb_scope_begin();
    nb_tensor *x, *y;
    batch(NB_F64, 0, 0, B, &x, &y);
    ck_assert_int_eq(nb_backward(loss_of(&m, x, y)), 0);
    int rc = nb_backward(loss_of(&m, x, y)); /* a second backward before nb_ddp_sync */
    ck_assert_int_eq(rc, -1);
    ck_assert_msg(strstr(nb_last_error(), "got a second gradient in one step; call nb_ddp_sync "
                                          "after each backward") != NULL, "%s", nb_last_error());
    ck_assert_int_eq(nb_ddp_sync(ddp, rc), -1);
    const char *prefix = "nb_ddp_sync: rank 0 failed: nb_ddp: \"";
    ck_assert_msg(strncmp(nb_last_error(), prefix, strlen(prefix)) == 0, "%s", nb_last_error());
    nb_params_zero_grad(m.ps);
    ck_assert_int_eq(nb_ddp_sync(ddp, nb_backward(loss_of(&m, x, y))), 0);
    nb_scope_end();
    ck_assert_int_eq(nb_mpi_broadcast_params(m.ps, size), -1);
    char want[128];
    snprintf(want, sizeof want, "nb_mpi_broadcast_params: root %d is not a rank (0..%d)", size,
             size - 1);
    ck_assert_str_eq(nb_last_error(), want);
    ck_assert_int_eq(nb_ddp_shard_step(ddp), -1);
    ck_assert_str_eq(nb_last_error(),
                     "nb_ddp_shard_step: no shard optimizer (nb_ddp_shard_optimizer)");
    int argc = 0;
    char **argv = NULL;
    ck_assert_int_eq(nb_mpi_init(&argc, &argv), -1);
    ck_assert_str_eq(nb_last_error(), "nb_mpi_init: MPI is already initialized");
    nb_ddp_free(ddp);
    nb_params_free(m.ps);
}
END_TEST

static nb_optim *make_adam(nb_params *shard, void *ctx) {
    (void)ctx;
    return nb_adam(shard, 0.01, 0.9, 0.999, 1e-8, 0.0);
}

/* Steps [from, to) of Adam on this rank's rows: a through da and full (the
 * unsharded optimizer), b through db's shard optimizer. */
static void adam_steps(mlp *a, nb_ddp *da, nb_optim *full, mlp *b, nb_ddp *db, int from, int to) {
    int per = B / size;
    for (int s = from; s < to; s++) {
        nb_scope_begin();
        nb_tensor *x, *y;
        batch(NB_F32, s, rank * per, (rank + 1) * per, &x, &y);
        ck_assert_int_eq(nb_ddp_sync(da, nb_backward(loss_of(a, x, y))), 0);
        nb_optim_step(full);
        nb_optim_clear_grad(full);
        ck_assert_int_eq(nb_ddp_sync(db, nb_backward(loss_of(b, x, y))), 0);
        ck_assert_msg(nb_ddp_shard_step(db) == 0, "%s", nb_last_error());
        nb_scope_end();
    }
}

/* A weight tied between the embedding and the output layer (GPT-2's), with
 * 8 linear layers between: its gradient's first part (the output layer's)
 * comes at the start of backward, the whole at the end. */
#define TV 1024 /* vocabulary: 8 chunks of 1024 elements at width TC */
#define TC 8
#define TT 4 /* tokens per row */
typedef struct {
    nb_params *ps;
    nb_tensor *wte;
    nb_Linear mid[4];
} tied;

static void tied_init(tied *m) {
    nb_rng r;
    nb_rng_seed(&r, 5 + (uint64_t)rank); /* different on each rank: the broadcast fixes it */
    m->ps = nb_params_new();
    nb_tensor *w = nb_randn(NB_F32, NB_SHAPE(TV, TC), &r);
    m->wte = nb_params_add(m->ps, "wte", nb_set_requires_grad(w, true));
    nb_free(w); /* the registry holds its own */
    ck_assert_ptr_nonnull(m->wte);
    for (int l = 0; l < 4; l++) {
        char name[16];
        snprintf(name, sizeof name, "mid%d", l);
        ck_assert_int_eq(nb_linear_init(&m->mid[l], m->ps, name, TC, TC, true, &r), 0);
    }
}

/* Rows [rank*per, (rank+1)*per) of step s's global batch of B rows of TT
 * tokens in 0..255 (rows 0-31 of wte: chunks 0 and 1), and on the last
 * rank one token 900 (chunk 7, changed there alone). detach: the embedding
 * gives wte no gradient (its only part is the output layer's). */
static nb_tensor *tied_loss(tied *m, int s, bool detach) {
    int per = B / size;
    int64_t idx[B * TT], tgt[B * TT];
    for (int k = 0; k < per * TT; k++) {
        int64_t g = (int64_t)rank * per * TT + k;
        idx[k] = (s * 31 + g * 7) % 256;
        tgt[k] = (s * 17 + g * 5) % TV;
    }
    if (rank == size - 1) idx[0] = 900;
    nb_tensor *h = nb_embedding(m->wte, nb_from_data(NB_I64, NB_SHAPE(per * TT), idx));
    if (detach) h = nb_detach(h);
    for (int l = 0; l < 4; l++) h = nb_tanh(nb_linear_forward(&m->mid[l], h));
    return nb_cross_entropy(nb_linear(h, m->wte, NULL),
                            nb_from_data(NB_I64, NB_SHAPE(per * TT), tgt), -1, 0);
}

/* 6 Adam steps: step 2's last rank gives wte only its first part, step 3's
 * fails before backward (every rank's sync fails; no step). */
static nb_params *tied_train(bool partial, nb_ddp_stats *st) {
    tied m;
    tied_init(&m);
    nb_ddp *ddp = nb_ddp_new(m.ps, &(nb_ddp_opts){.bucket_bytes = 1024,
                                                  .no_partial_buckets = !partial});
    ck_assert_msg(ddp != NULL, "%s", nb_last_error());
    nb_optim *opt = nb_adam(m.ps, 1e-2, 0.9, 0.999, 1e-8, 0);
    for (int s = 0; s < 6; s++) {
        nb_scope_begin();
        bool fail = s == 3 && rank == size - 1;
        int rc = fail ? -1 : nb_backward(tied_loss(&m, s, s == 2 && rank == size - 1));
        int sync = nb_ddp_sync(ddp, rc);
        ck_assert_msg(sync == (s == 3 && size > 1 ? -1 : 0) || (size == 1 && s == 3 && sync == -1),
                      "step %d: %s", s, nb_last_error());
        if (sync == 0) nb_optim_step(opt);
        nb_optim_zero_grad(opt);
        nb_scope_end();
    }
    *st = nb_ddp_get_stats(ddp);
    nb_ddp_free(ddp);
    nb_optim_free(opt);
    return m.ps;
}

/* The tied weight's bucket starts from its first part and the chunks that
 * changed after are sent again: the weights are, bit for bit, those of
 * sending every gradient whole. */
START_TEST(a_tied_weight_goes_from_its_first_part_with_the_same_bits) {
    nb_ddp_stats a, b, c;
    nb_params *pa = tied_train(true, &a), *pb = tied_train(false, &b);
    /* ranks that disagree (rank 0 whole gradients only): every rank takes
     * part in the choice, none gets a partial bucket, nothing waits */
    nb_params *pc = tied_train(rank != 0, &c);
    ck_assert(max_rel_diff(pa, pb) == 0);
    ck_assert(max_rel_diff(pc, pb) == 0);
    ck_assert_int_eq(a.partial_buckets, 1);
    ck_assert_int_eq(b.partial_buckets, 0);
    ck_assert_int_eq(c.partial_buckets, 0);
    /* chosen after step 0; then, of wte's 8 chunks, sent again: 0 and 1
     * (rows 0-255) and 7 (token 900, last rank) in steps 1, 4 and 5; in
     * step 2 0 and 1 (the last rank's embedding is detached); step 3
     * failed and does not count. Per good step (5): 11 / (8 x 5). One rank
     * is the last: nothing in step 2, 9 / 40. */
    double want = (size > 1 ? 11.0 : 9.0) / 40;
    ck_assert_msg(fabs(a.resent - want) < 1e-12, "resent %g, expected %g", a.resent, want);
    if (rank == 0)
        printf("mpi ok  %d ranks: the tied weight's bucket sent from its first part, %.1f%% of "
               "it again after backward; weights the same bits as whole gradients\n", size,
               100 * a.resent);
    nb_params_free(pa);
    nb_params_free(pb);
    nb_params_free(pc);
}
END_TEST

/* ZeRO-1: Adam sharded over the ranks gives the bits of Adam on every rank,
 * with the state split: the ranks' shares add up to the whole. */
START_TEST(sharded_optimizer_state_gives_the_same_weights) {
    mlp a, b;
    mlp_init(&a, NB_F32, 11);
    mlp_init(&b, NB_F32, 11);
    nb_ddp *da = nb_ddp_new(a.ps, NULL), *db = nb_ddp_new(b.ps, NULL);
    ck_assert_ptr_nonnull(da);
    ck_assert_ptr_nonnull(db);
    nb_optim *full = nb_adam(a.ps, 0.01, 0.9, 0.999, 1e-8, 0.0);
    nb_optim *shard = nb_ddp_shard_optimizer(db, make_adam, NULL);
    ck_assert_msg(shard != NULL, "%s", nb_last_error());
    adam_steps(&a, da, full, &b, db, 0, 5);
    ck_assert(max_rel_diff(a.ps, b.ps) == 0);
    double whole = state_values(full), mine = state_values(shard);
    double sum = nb_mpi_mean(mine) * size;
    if (rank == 0)
        printf("mpi ok  %d ranks, ZeRO-1 Adam: weights bitwise those of unsharded Adam; state "
               "on rank 0 %.0f of %.0f values\n", size, mine, whole);
    ck_assert(sum == whole);
    if (size > 1) ck_assert(mine < whole);
    /* a checkpoint of the sharded state: gathered on the last rank, it is
     * unsharded Adam's state, bit for bit */
    int root = size - 1;
    nb_optim *held = rank == root ? nb_adam(b.ps, 0.01, 0.9, 0.999, 1e-8, 0.0) : NULL;
    nb_params *st = held ? nb_optim_state(held) : NULL;
    ck_assert_msg(nb_ddp_shard_state_gather(db, st, root) == 0, "%s", nb_last_error());
    for (int e = 0; st && e < nb_params_buffer_count(st); e++) {
        const char *name;
        nb_tensor *got = nb_params_buffer_at(st, e, &name);
        nb_tensor *want = nb_params_get(nb_optim_state(full), name);
        ck_assert_ptr_nonnull(want);
        ck_assert_msg(memcmp(nb_data(got), nb_data(want), (size_t)nb_numel(got) * (nb_dtype_of(got) == NB_F32 ? 4 : 8)) == 0,
                      "%s differs", name);
    }
    /* scattered into a fresh shard optimizer, it resumes: 2 more steps, the same bits */
    nb_ddp_free(db);
    db = nb_ddp_new(b.ps, NULL);
    ck_assert_ptr_nonnull(nb_ddp_shard_optimizer(db, make_adam, NULL));
    ck_assert_msg(nb_ddp_shard_state_scatter(db, st, root) == 0, "%s", nb_last_error());
    adam_steps(&a, da, full, &b, db, 5, 7);
    ck_assert(max_rel_diff(a.ps, b.ps) == 0);
    /* root's state must be the same optimizer's: SGD's momentum is refused everywhere */
    nb_optim *sgd = rank == root ? nb_sgd(b.ps, 0.1, 0.9, 0.0) : NULL;
    ck_assert_int_eq(nb_ddp_shard_state_scatter(db, sgd ? nb_optim_state(sgd) : NULL, root), -1);
    char want[256];
    snprintf(want, sizeof want, "nb_ddp_shard_state_scatter: rank %d failed: "
             "nb_ddp_shard_state_scatter: the state of \"l1.weight\" differs from its owner's "
             "(rank 0): make the state's optimizer as the shard optimizer, over all of the "
             "nb_ddp's parameters", root);
    ck_assert_str_eq(nb_last_error(), want);
    ck_assert_int_eq(nb_ddp_shard_state_gather(db, NULL, root), -1);
    snprintf(want, sizeof want, "nb_ddp_shard_state_gather: rank %d failed: "
             "nb_ddp_shard_state_gather: state is NULL on root %d", root, root);
    ck_assert_str_eq(nb_last_error(), want);
    nb_optim_free(sgd);
    nb_optim_free(held);
    nb_optim_free(full);
    nb_ddp_free(da);
    nb_ddp_free(db);
    nb_params_free(a.ps);
    nb_params_free(b.ps);
}
END_TEST

static nb_optim *make_fails_on_last(nb_params *shard, void *ctx) {
    if (rank < size - 1) return make_adam(shard, ctx);
    nb_report_error("no room for the moments (a test)");
    return NULL;
}

static nb_optim *make_null_quietly(nb_params *shard, void *ctx) {
    (void)shard, (void)ctx;
    return NULL;
}

/* make that frees the shard it was given: deferred, the shard goes with the nb_ddp */
static nb_optim *make_frees_shard(nb_params *shard, void *ctx) {
    nb_optim *o = make_adam(shard, ctx);
    nb_params_free(shard);
    return o;
}

/* make under the callback rule: a scope it leaves open is closed and fails the call */
static nb_optim *make_leaves_a_scope(nb_params *shard, void *ctx) {
    nb_scope_begin();
    return make_adam(shard, ctx);
}

/* A shard optimizer that cannot be made on one rank is made on none, with
 * that rank's message, and the nb_ddp takes one afterwards. */
START_TEST(a_failed_shard_optimizer_fails_everywhere) {
    mlp m;
    mlp_init(&m, NB_F32, 3);
    nb_ddp *d = nb_ddp_new(m.ps, NULL);
    ck_assert_ptr_nonnull(d);
    char want[256];
    ck_assert_ptr_null(nb_ddp_shard_optimizer(d, make_fails_on_last, NULL));
    snprintf(want, sizeof want, "nb_ddp_shard_optimizer: rank %d failed: no room for the moments "
             "(a test)", size - 1);
    ck_assert_str_eq(nb_last_error(), want);
    ck_assert_ptr_null(nb_ddp_shard_optimizer(d, make_null_quietly, NULL));
    ck_assert_str_eq(nb_last_error(), "nb_ddp_shard_optimizer: rank 0 failed: "
                     "nb_ddp_shard_optimizer: make returned NULL without a message");
    int depth = nb_scope_depth();
    ck_assert_ptr_null(nb_ddp_shard_optimizer(d, make_leaves_a_scope, NULL));
    ck_assert_str_eq(nb_last_error(), "nb_ddp_shard_optimizer: rank 0 failed: "
                     "nb_ddp_shard_optimizer: make left 1 scope open (nb_scope_begin without "
                     "nb_scope_end); nabla closed it");
    ck_assert_int_eq(nb_scope_depth(), depth);
    ck_assert_ptr_nonnull(nb_ddp_shard_optimizer(d, make_adam, NULL));
    nb_ddp_free(d);
    /* a make that frees the shard: the shard optimizer still steps */
    int64_t live = nb_live_tensors();
    d = nb_ddp_new(m.ps, NULL);
    ck_assert_ptr_nonnull(d);
    ck_assert_ptr_nonnull(nb_ddp_shard_optimizer(d, make_frees_shard, NULL));
    nb_scope_begin();
    nb_tensor *x, *y;
    batch(NB_F32, 0, 0, B, &x, &y);
    ck_assert_int_eq(nb_ddp_sync(d, nb_backward(loss_of(&m, x, y))), 0);
    ck_assert_msg(nb_ddp_shard_step(d) == 0, "%s", nb_last_error());
    nb_scope_end();
    nb_ddp_free(d);
    nb_params_zero_grad(m.ps);
    ck_assert_int_le(nb_live_tensors(), live + nb_params_count(m.ps)); /* at most the .grads */
    nb_params_free(m.ps);
    /* one parameter for several ranks: the others would own nothing */
    nb_params *one = nb_params_new();
    nb_scope_begin();
    ck_assert_ptr_nonnull(nb_params_add(one, "w", nb_zeros(NB_F32, NB_SHAPE(3))));
    nb_scope_end();
    d = nb_ddp_new(one, NULL);
    ck_assert_ptr_nonnull(d);
    ck_assert_ptr_null(nb_ddp_shard_optimizer(d, make_adam, NULL));
    snprintf(want, sizeof want, "nb_ddp_shard_optimizer: rank 1 failed: nb_ddp_shard_optimizer: "
             "rank 1 owns no parameter: 1 parameter(s) for %d ranks; use fewer ranks, or no "
             "sharding", size);
    ck_assert_str_eq(nb_last_error(), want);
    nb_ddp_free(d);
    nb_params_free(one);
}
END_TEST

/* Before nb_mpi_init: a message, not a crash inside MPI. */
START_TEST(use_before_init_is_reported) {
    ck_assert_str_eq(before_init, "nb_mpi_mean: MPI is not initialized (call nb_mpi_init first)");
}
END_TEST

int main(int argc, char **argv) {
    if (!isnan(nb_mpi_mean(1.0)) || nb_mpi_rank() != 0 || nb_mpi_size() != 1)
        snprintf(before_init, sizeof before_init, "nb_mpi_mean did not fail before nb_mpi_init");
    else
        snprintf(before_init, sizeof before_init, "%s", nb_last_error());
    if (nb_mpi_init(&argc, &argv) != 0) {
        fprintf(stderr, "%s\n", nb_last_error());
        return 1;
    }
    rank = nb_mpi_rank();
    size = nb_mpi_size();
    Suite *s = suite_create("mpi");
    TCase *tc = tcase_create("ddp");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, use_before_init_is_reported);
    tcase_add_test(tc, rank_size_and_mean);
    tcase_add_test(tc, broadcast_gives_rank_0s_weights);
    tcase_add_test(tc, ddp_agrees_with_one_process_f64);
    tcase_add_test(tc, ddp_agrees_with_one_process_f32_small_buckets);
    tcase_add_test(tc, ddp_is_deterministic);
    tcase_add_test(tc, a_failed_rank_stops_every_rank);
    tcase_add_test(tc, different_models_are_refused);
    tcase_add_test(tc, different_bucket_bytes_are_refused);
    tcase_add_test(tc, different_parameter_counts_are_refused);
    tcase_add_test(tc, a_failed_nb_ddp_new_fails_everywhere);
    tcase_add_test(tc, a_tied_weight_goes_from_its_first_part_with_the_same_bits);
    tcase_add_test(tc, sharded_optimizer_state_gives_the_same_weights);
    tcase_add_test(tc, misuse_is_reported);
    tcase_add_test(tc, agree_gives_every_rank_the_failure);
    tcase_add_test(tc, a_failed_shard_optimizer_fails_everywhere);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, rank == 0 ? CK_NORMAL : CK_SILENT);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    int any = (int)(nb_mpi_mean(failed > 0 ? 1.0 : 0.0) * size + 0.5);
    if (rank == 0 && any) printf("mpi: %d rank(s) had failures\n", any);
    nb_mpi_finalize();
    return any ? 1 : 0;
}
