/* mpi_allreduce.c [KIB...]: make bench-mpi's reduction figures, under mpirun
 * (2 ranks on this machine). For gradients of 4, 64 and 256 MiB (f32; or
 * the sizes given, in KiB: make bench-mpi-net adds 4 KiB for the latency):
 *   - MPI_Allreduce (MPI_SUM, in place), Open MPI's own choice of algorithm:
 *     the machine's figure;
 *   - nb_ddp_sync after a backward whose gradient is ready at once (one
 *     parameter p, loss sum(p)): nabla's fixed-order reduction (all-to-all,
 *     add in rank order, all-gather) and the copies in and out of its bucket.
 * Each is the median of 7 runs after a warm-up; "bus bandwidth" is
 * 2 (N-1)/N x bytes / time, the traffic of a ring allreduce per rank. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "nabla.h"
#include "nabla_mpi.h"

#define REPS 7

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *t) {
    qsort(t, REPS, sizeof *t, cmp);
    return t[REPS / 2];
}

int main(int argc, char **argv) {
    if (nb_mpi_init(&argc, &argv) != 0) {
        fprintf(stderr, "%s\n", nb_last_error());
        return 1;
    }
    int rank = nb_mpi_rank(), n = nb_mpi_size();
    nb_set_num_threads(1);
    if (rank == 0)
        printf("%-10s %14s %12s %14s %12s %12s\n", "gradient", "MPI_Allreduce", "bus GB/s",
               "nb_ddp_sync", "bus GB/s", "backward");
    int64_t kib[16] = {4 << 10, 64 << 10, 256 << 10};
    int nsizes = argc > 1 ? argc - 1 : 3;
    if (nsizes > 16) nsizes = 16;
    for (int s = 0; s < nsizes && argc > 1; s++) {
        kib[s] = strtoll(argv[s + 1], NULL, 10);
        if (kib[s] < 1 || kib[s] > (1 << 20)) {
            if (rank == 0) fprintf(stderr, "mpi_allreduce: size %s KiB: give 1 .. 1048576\n", argv[s + 1]);
            nb_mpi_finalize();
            return 2;
        }
    }
    for (int s = 0; s < nsizes; s++) {
        int64_t count = kib[s] << 8; /* floats */
        double bytes = 4.0 * (double)count, bus = 2.0 * (n - 1) / n * bytes;
        float *buf = calloc((size_t)count, sizeof *buf);
        double t[REPS];
        for (int r = -1; r < REPS; r++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = now();
            MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            if (r >= 0) t[r] = now() - t0;
        }
        double mpi = median(t);
        free(buf);

        nb_params *ps = nb_params_new();
        nb_tensor *z = nb_zeros(NB_F32, NB_SHAPE(count));
        nb_tensor *p = nb_params_add(ps, "p", z);
        nb_free(z);
        double tb[REPS];
        for (int r = -1; r < REPS; r++) { /* backward alone, without data parallelism */
            double t0 = now();
            nb_scope_begin();
            nb_backward(nb_sum_all(p));
            nb_scope_end();
            nb_clear_grad(p);
            if (r >= 0) tb[r] = now() - t0;
        }
        double back = median(tb);
        nb_ddp *ddp = nb_ddp_new(ps, &(nb_ddp_opts){.bucket_bytes = (int64_t)bytes});
        for (int r = -1; r < REPS && ddp; r++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = now();
            nb_scope_begin();
            int rc = nb_backward(nb_sum_all(p));
            rc = nb_ddp_sync(ddp, rc);
            nb_scope_end();
            nb_clear_grad(p);
            if (rc != 0) {
                fprintf(stderr, "%s\n", nb_last_error());
                break;
            }
            if (r >= 0) t[r] = now() - t0;
        }
        double ddp_t = median(t);
        if (rank == 0)
            printf("%6lld %s %12.2f ms %12.2f %12.2f ms %12.2f %9.2f ms\n",
                   (long long)(kib[s] % 1024 ? kib[s] : kib[s] >> 10), kib[s] % 1024 ? "KiB" : "MiB",
                   1e3 * mpi, bus / mpi * 1e-9, 1e3 * (ddp_t - back),
                   bus / (ddp_t - back) * 1e-9, 1e3 * back);
        nb_ddp_free(ddp);
        nb_params_free(ps);
    }
    nb_mpi_finalize();
    return 0;
}
