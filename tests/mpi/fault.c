/* fault.c: a data-parallel training loop in which one rank dies, for make
 * test-mpi's fault cases (tests/mpi/fault_check.sh runs it).
 *
 *   fault kill    rank size-1 kills itself (SIGKILL) at step 3
 *   fault silent  rank size-1 stops calling nb_ddp_sync at step 3 and
 *                 sleeps (a hung rank: the others must time out)
 *   fault train   every rank trains (a 512x512 linear layer, 1 MiB of
 *                 gradients a step) and prints "rank R: step S" after each
 *                 step, for up to 10 minutes: the fault comes from outside
 *                 (tests/mpi/net_check.sh takes a host's link down, or
 *                 kills a rank)
 *
 * Every surviving rank prints "rank R: step S: <nabla's message>" for the
 * step that failed, and exits 1. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "nabla.h"
#include "nabla_mpi.h"

int main(int argc, char **argv) {
    if (argc != 2 || (strcmp(argv[1], "kill") && strcmp(argv[1], "silent") &&
                      strcmp(argv[1], "train"))) {
        fprintf(stderr, "usage: fault kill|silent|train\n");
        return 2;
    }
    if (nb_mpi_init(&argc, &argv) != 0) {
        fprintf(stderr, "%s\n", nb_last_error());
        return 1;
    }
    int rank = nb_mpi_rank(), size = nb_mpi_size();
    nb_set_num_threads(1);
    nb_rng r;
    nb_rng_seed(&r, 1);
    nb_params *ps = nb_params_new();
    bool train = !strcmp(argv[1], "train");
    int d = train ? 512 : 64, steps = train ? 1000000 : 100;
    time_t t0 = time(NULL);
    nb_Linear lin;
    nb_linear_init(&lin, ps, "lin", d, d, true, &r);
    nb_ddp *ddp = nb_ddp_new(ps, NULL);
    if (!ddp) {
        fprintf(stderr, "rank %d: %s\n", rank, nb_last_error());
        nb_mpi_finalize();
        return 1;
    }
    int rc = 0;
    for (int step = 0; step < steps && rc == 0; step++) {
        if (train && time(NULL) - t0 > 600) break;
        if (!train && rank == size - 1 && step == 3) {
            if (!strcmp(argv[1], "kill")) raise(SIGKILL);
            sleep(120);
        }
        nb_scope_begin();
        nb_tensor *x = nb_randn(NB_F32, NB_SHAPE(8, d), &r);
        int brc = nb_backward(nb_sum_all(nb_linear_forward(&lin, x)));
        rc = nb_ddp_sync(ddp, brc);
        if (rc != 0) {
            printf("rank %d: step %d: %s\n", rank, step, nb_last_error());
            fflush(stdout);
        } else if (train) {
            printf("rank %d: step %d\n", rank, step);
            fflush(stdout);
        }
        nb_params_zero_grad(ps);
        nb_scope_end();
    }
    nb_ddp_free(ddp);
    nb_params_free(ps);
    nb_mpi_finalize();
    return rc == 0 ? 0 : 1;
}
