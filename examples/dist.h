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

/* With --dist, one line on how the gradients travelled (rank 0 prints). */
static void dist_report(const dist_state *ds) {
#ifdef NB_MPI
    if (!ds->ddp) return;
    nb_ddp_stats st = nb_ddp_get_stats(ds->ddp);
    printf("--dist: %d ranks; %.1f MB of gradients in %lld bucket(s) per step, %.0f%% of them "
           "started during backward; %.1f ms per step in nb_ddp_sync\n", ds->ranks,
           (double)st.bytes / 1e6, (long long)st.buckets, 100 * st.early, st.wait_ms);
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
