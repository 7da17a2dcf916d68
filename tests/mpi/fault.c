/* fault.c: a data-parallel training loop in which one rank dies, for make
 * test-mpi's fault cases (tests/mpi/fault_check.sh runs it).
 *
 *   fault kill    rank size-1 kills itself (SIGKILL) at step 3
 *   fault silent  rank size-1 stops calling nb_ddp_sync at step 3 and
 *                 sleeps (a hung rank: the others must time out)
 *
 * Every surviving rank prints "rank R: step S: <nabla's message>" for the
 * step that failed, and exits 1. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "nabla.h"
#include "nabla_mpi.h"

int main(int argc, char **argv) {
    if (argc != 2 || (strcmp(argv[1], "kill") && strcmp(argv[1], "silent"))) {
        fprintf(stderr, "usage: fault kill|silent\n");
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
    nb_Linear lin;
    nb_linear_init(&lin, ps, "lin", 64, 64, true, &r);
    nb_ddp *ddp = nb_ddp_new(ps, NULL);
    if (!ddp) {
        fprintf(stderr, "rank %d: %s\n", rank, nb_last_error());
        nb_mpi_finalize();
        return 1;
    }
    int rc = 0;
    for (int step = 0; step < 100 && rc == 0; step++) {
        if (rank == size - 1 && step == 3) {
            if (!strcmp(argv[1], "kill")) raise(SIGKILL);
            sleep(120);
        }
        nb_scope_begin();
        nb_tensor *x = nb_randn(NB_F32, NB_SHAPE(8, 64), &r);
        int brc = nb_backward(nb_sum_all(nb_linear_forward(&lin, x)));
        rc = nb_ddp_sync(ddp, brc);
        if (rc != 0) {
            printf("rank %d: step %d: %s\n", rank, step, nb_last_error());
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
