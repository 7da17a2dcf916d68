/* dist.h: the examples' --dist flag, shared by copy_task.c and gpt.c.
 * Built with MPI (make MPI=1 defines NB_MPI and links libnabla_mpi), --dist
 * trains data-parallel over the mpirun ranks through nabla_mpi.h; built
 * without, --dist is an error that says how to build it. On one process
 * (no --dist) every function here is a no-op and ranks is 1. */
#ifndef NABLA_EXAMPLES_DIST_H
#define NABLA_EXAMPLES_DIST_H

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "nabla.h"
#ifdef NB_MPI
#include "nabla_mpi.h"
#endif

typedef struct {
    int rank, ranks; /* this process and how many there are: 0 and 1 without --dist */
#ifdef NB_MPI
    bool on;
    nb_ddp *ddp;
    bool sharded; /* --zero: the optimizer is nb_ddp's shard optimizer */
#endif
} dist_state;

/* Starts MPI for --dist (on), and sends the stdout of every rank but 0 to
 * /dev/null: rank 0 prints. 0, or -1 with a message in msg. */
static int dist_start(dist_state *ds, bool on, int *argc, char ***argv, char *msg, size_t cap) {
    ds->rank = 0;
    ds->ranks = 1;
    if (!on) return 0;
#ifdef NB_MPI
    if (nb_mpi_init(argc, argv) != 0) return snprintf(msg, cap, "%s", nb_last_error()), -1;
    ds->on = true;
    ds->rank = nb_mpi_rank();
    ds->ranks = nb_mpi_size();
    if (ds->rank != 0 && !freopen("/dev/null", "w", stdout))
        return snprintf(msg, cap, "cannot silence rank %d: %s", ds->rank, strerror(errno)), -1;
    return 0;
#else
    (void)argc;
    const char *prog = strrchr((*argv)[0], '/') ? strrchr((*argv)[0], '/') + 1 : (*argv)[0];
    snprintf(msg, cap, "--dist needs a build with MPI: make MPI=1, then mpirun -np N "
             "build-mpi/examples/%s --dist", prog);
    return -1;
#endif
}

/* Kernel threads: `threads` when given, else the CPUs shared among the
 * ranks (NABLA_NUM_THREADS or the CPUs on one process). */
static void dist_threads(const dist_state *ds, int64_t threads) {
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    if (threads > 0) nb_set_num_threads((int)threads);
    else if (ds->ranks > 1) nb_set_num_threads(cpus > ds->ranks ? (int)(cpus / ds->ranks) : 1);
}

/* Data parallelism over ps (rank 0's weights everywhere). 0 or -1 + nabla's message. */
static int dist_attach(dist_state *ds, nb_params *ps) {
#ifdef NB_MPI
    if (ds->on && !(ds->ddp = nb_ddp_new(ps, NULL))) return -1;
#else
    (void)ds, (void)ps;
#endif
    return 0;
}

/* --zero: this rank's optimizer over its shard of ps, made by make (ZeRO
 * stage 1, owned by the nb_ddp), or NULL with nabla's message. */
static inline nb_optim *dist_shard(dist_state *ds, nb_optim *(*make)(nb_params *, void *),
                                    void *ctx) {
#ifdef NB_MPI
    nb_optim *opt = ds->ddp ? nb_ddp_shard_optimizer(ds->ddp, make, ctx) : NULL;
    ds->sharded = opt != NULL;
    return opt;
#else
    (void)ds, (void)make, (void)ctx;
    return NULL;
#endif
}

/* The optimizer's step on the (averaged) gradients, which it clears. */
static inline int dist_optim_step(const dist_state *ds, nb_optim *opt) {
#ifdef NB_MPI
    if (ds->sharded) return nb_ddp_shard_step(ds->ddp);
#else
    (void)ds;
#endif
    nb_optim_step(opt);
    nb_optim_clear_grad(opt);
    return 0;
}

static inline bool dist_sharded(const dist_state *ds) {
#ifdef NB_MPI
    return ds->sharded;
#else
    (void)ds;
    return false;
#endif
}

/* --zero, before rank 0 saves: every rank's part of the optimizer state into
 * held, rank 0's optimizer over the whole model (NULL elsewhere). */
static inline int dist_gather_state(const dist_state *ds, nb_optim *held) {
#ifdef NB_MPI
    if (ds->sharded) return nb_ddp_shard_state_gather(ds->ddp, held ? nb_optim_state(held) : NULL, 0);
#else
    (void)ds, (void)held;
#endif
    return 0;
}

/* --zero, after rank 0 loaded: its weights and the loop's state (trainer) to
 * every rank, and each rank's part of the optimizer state from held. */
static inline int dist_share_loaded(const dist_state *ds, nb_params *ps, nb_params *trainer,
                             nb_optim *held) {
#ifdef NB_MPI
    if (ds->sharded)
        return nb_mpi_broadcast_params(ps, 0) != 0 || nb_mpi_broadcast_params(trainer, 0) != 0 ||
                       nb_ddp_shard_state_scatter(ds->ddp, held ? nb_optim_state(held) : NULL, 0)
                   ? -1
                   : 0;
#else
    (void)ds, (void)ps, (void)trainer, (void)held;
#endif
    return 0;
}

/* rc, made the same on every rank: -1 everywhere (with the failed rank's
 * message) when any rank's rc is nonzero. For what only some ranks do. */
static inline int dist_agree(const dist_state *ds, const char *what, int rc) {
#ifdef NB_MPI
    if (ds->on) return nb_mpi_agree(what, rc);
#else
    (void)ds, (void)what;
#endif
    return rc;
}

/* After this rank's backward (rc its result): the gradients averaged over
 * the ranks, and *loss (this rank's; NAN after a failure) made the mean over
 * the ranks. 0, or -1 on every rank when any rank failed (nabla's message). */
static int dist_sync(const dist_state *ds, int rc, double *loss) {
#ifdef NB_MPI
    if (ds->ddp) {
        if (nb_ddp_sync(ds->ddp, rc) != 0) return -1;
        *loss = nb_mpi_mean(*loss);
    }
#else
    (void)ds, (void)loss;
#endif
    return rc;
}

/* *x made the mean over the ranks (added in rank order: the same bits on
 * every rank); NAN everywhere when a rank's is NAN. */
static inline void dist_mean(const dist_state *ds, double *x) {
#ifdef NB_MPI
    if (ds->on) *x = nb_mpi_mean(*x);
#else
    (void)ds, (void)x;
#endif
}

/* With --dist, one line on how the gradients travelled (rank 0 prints). */
static void dist_report(const dist_state *ds) {
#ifdef NB_MPI
    if (!ds->ddp) return;
    nb_ddp_stats st = nb_ddp_get_stats(ds->ddp);
    printf("--dist: %d ranks; %.1f MB of gradients in %lld bucket(s) per step, %.0f%% of them "
           "started during backward; per step, %.1f ms from the first bucket's start to the "
           "averaged gradients, %.0f%% of it during backward, %.1f ms in nb_ddp_sync\n",
           ds->ranks, (double)st.bytes / 1e6, (long long)st.buckets, 100 * st.early,
           st.window_ms, 100 * st.overlap, st.wait_ms);
    if (st.partial_buckets > 0)
        printf("--dist: %lld bucket(s) sent from their gradient's first part (a tied weight), "
               "%.2f%% of it sent again after backward\n", (long long)st.partial_buckets,
               100 * st.resent);
#else
    (void)ds;
#endif
}

static void dist_stop(dist_state *ds) {
#ifdef NB_MPI
    nb_ddp_free(ds->ddp);
    ds->ddp = NULL;
    if (ds->on) nb_mpi_finalize();
    ds->on = false;
#else
    (void)ds;
#endif
}

#endif
