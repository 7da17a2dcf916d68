/* nabla_mpi.h: data-parallel training on MPI (Open MPI), the optional part of
 * nabla. libnabla_mpi is built by `make mpi` with Debian's Open MPI
 * (libopenmpi-dev, openmpi-bin); the core library does not need it.
 *
 * The model is PyTorch's DistributedDataParallel: every process (rank) holds
 * a whole replica of the model, reads its own share of each global batch,
 * and after backward every rank holds the mean of all ranks' gradients, so
 * the optimizer steps stay identical everywhere.
 *
 *   nb_mpi_init(&argc, &argv);
 *   ... build the model into ps, on every rank ...
 *   nb_ddp *ddp = nb_ddp_new(ps, NULL);  // rank 0's weights everywhere, hooks set
 *   nb_optim *opt = nb_adam(ps, ...);
 *   for each step:
 *       nb_scope_begin();
 *       int rc = this rank's forward + nb_backward on its share of the batch;
 *       if (nb_ddp_sync(ddp, rc) != 0) { report nb_last_error(); stop; }
 *       nb_optim_step(opt); nb_optim_zero_grad(opt);
 *       nb_scope_end();
 *   nb_ddp_free(ddp);
 *   nb_mpi_finalize();
 *
 * How the gradients travel: parameters are grouped, in the reverse of their
 * registration order (about the order backward finishes them), into buckets
 * of up to bucket_bytes. A gradient-ready hook (nb_set_grad_hook) copies each
 * gradient into its bucket as soon as backward has it; a full bucket starts
 * its reduction while backward goes on, buckets always in the same order on
 * every rank. The reduction has a fixed order, so results are the same from
 * run to run for a given number of ranks: each rank gets 1/N of every bucket
 * from every rank (an all-to-all), adds the N pieces in rank order 0, 1, ...,
 * N-1, and the sums are gathered back to every rank (an all-gather): the
 * traffic of a ring allreduce, 2 (N-1)/N of the bucket per rank.
 *
 * Partial buckets: a weight tied between the first and the last layer
 * (GPT-2's token embedding and lm_head) gets the bulk of its gradient at the
 * start of backward (the output layer's part) and the rest, a few rows from
 * the embedding, at the very end. After the first step, such a parameter
 * (alone in its bucket, with two or more contributions, and at least a
 * quarter of the parameters finished between its first and its whole, on
 * every rank) gets a partial bucket: it starts first, from the first part
 * (nb_set_grad_contribution_hook); when the whole is known, the chunks of
 * 1024 elements that changed since on any rank are reduced again the same
 * way. Every element's sum has the same terms in the same order, so the
 * result is bit for bit that of waiting for the whole; what is left after
 * backward is the changed rows instead of the whole bucket.
 * no_partial_buckets (or NABLA_DDP_PARTIAL=0) turns it off.
 *
 * Errors: as everywhere in nabla, -1 (or NULL) and nb_last_error(). A rank
 * that failed in its step passes its rc to nb_ddp_sync: it still takes part
 * in the step's collectives (with zeros), and then every rank returns -1 with
 * the failed rank's message ("nb_ddp_sync: rank 1 failed: nb_matmul: ..."),
 * instead of the others waiting forever. Every rank must call nb_ddp_sync
 * once per step. A wait that sees no progress for NABLA_MPI_TIMEOUT seconds
 * (default 20: a rank died or stopped calling nb_ddp_sync, or the network
 * between the ranks is down) fails with a message naming the timeout; MPI
 * cannot go on after that, and nb_mpi_finalize then aborts the job instead
 * of waiting for the others. */
#ifndef NABLA_MPI_H
#define NABLA_MPI_H

#include "nabla.h"

#ifdef __cplusplus
extern "C" {
#endif

/* MPI_Init_thread (MPI_THREAD_FUNNELED: call MPI, nabla_mpi and backward with
 * DDP hooks from the main thread; nabla's own worker threads never call MPI).
 * 0, or -1 with a message. Calling it twice is an error. */
NB_API int nb_mpi_init(int *argc, char ***argv);
/* MPI_Finalize (MPI_Abort after a failed or timed-out collective, which the
 * other ranks may never finish). */
NB_API void nb_mpi_finalize(void);
NB_API int nb_mpi_rank(void); /* this process's rank, 0 .. size-1; 0 before init */
NB_API int nb_mpi_size(void); /* the number of ranks; 1 before init */

/* Every parameter and buffer of ps gets root's values (MPI_Bcast), in
 * registration order; the registries must match (names, shapes, dtypes),
 * which is checked first: a mismatch on any rank fails on every rank with
 * a message naming the first differing tensor. 0 or -1. */
NB_API int nb_mpi_broadcast_params(nb_params *ps, int root);

/* Every rank passes its own status (0 = fine) and learns whether all were
 * fine: 0 on every rank, or -1 on every rank with "what: rank R failed:
 * <R's message>" for the lowest failed rank R. For a step only some ranks
 * take (rank 0 writes a checkpoint, every rank reads one) that must stop all
 * of them together, instead of the others waiting in the next collective. */
NB_API int nb_mpi_agree(const char *what, int status);

/* x averaged over the ranks, added in rank order (the same bits on every
 * rank and in every run): for a loss to print. NAN on error. */
NB_API double nb_mpi_mean(double x);

typedef struct nb_ddp nb_ddp;
typedef struct nb_ddp_opts {
    int64_t bucket_bytes; /* gradient bytes per bucket; 0 = 25 MiB (DDP's default) */
    bool no_partial_buckets; /* never send a gradient before it is whole (see below) */
} nb_ddp_opts;

/* Data parallelism over ps's parameters: broadcasts ps from rank 0 (as
 * nb_mpi_broadcast_params) and sets a gradient-ready hook and a
 * contribution hook on every parameter (replacing any hooks of yours).
 * opts NULL = defaults. Every rank calls it, and first the ranks check that
 * they agree: the same effective bucket_bytes, and the same number of
 * parameters with the same sizes and dtypes in order (so the same buckets). When they do not, or nb_ddp_new
 * failed on a rank, it returns NULL on every rank, having freed everything,
 * with a message naming the difference and the ranks ("nb_ddp_new: the
 * ranks disagree on the gradient buckets: rank 0 has bucket_bytes 64 (2
 * buckets), rank 1 has 1048576 (1 bucket); every rank must pass the same
 * nb_ddp_opts"; "... on the parameters: parameter 0 ("a.weight") has 12
 * elements on rank 0, 15 on rank 1; ...") or the failed rank's ("nb_ddp_new:
 * rank 1 failed: <its message>"). */
NB_API nb_ddp *nb_ddp_new(nb_params *ps, const nb_ddp_opts *opts);
/* After this rank's backward (status = its result: 0, or nonzero when the
 * rank's forward or backward failed): waits for every bucket and replaces
 * each parameter's .grad by the mean over the ranks. 0, or -1 on every rank
 * when any rank passed a nonzero status (the message names that rank and
 * gives its message) or a wait timed out. A parameter this backward did not
 * reach counts as a zero gradient (and gets a .grad). */
NB_API int nb_ddp_sync(nb_ddp *d, int status);
NB_API void nb_ddp_free(nb_ddp *d); /* removes the hooks; NULL is ok */

/* ZeRO stage 1, sharded optimizer state: each parameter gets an owner rank
 * (balanced by size, in registration order), and each rank keeps optimizer
 * state only for the parameters it owns. make(shard, ctx) builds this rank's
 * optimizer over `shard`, a registry of its parameters under their names,
 * sharing their storage (e.g. nb_adam(shard, ...)); nb_ddp owns the result
 * and the registry. Then, after each nb_ddp_sync, nb_ddp_shard_step steps
 * it on the averaged gradients, broadcasts every parameter from its owner
 * and clears the parameters' gradients: the weights stay the same on every
 * rank, bit for bit the weights an unsharded optimizer would make, with
 * about 1/N of its state per rank. Every rank calls it: when make fails on
 * one (or a rank would own no parameter), it fails on every rank with that
 * rank's message, and the nb_ddp is as before. make runs under nabla.h's
 * callback rule (a scope it closes but did not open, or leaves open, fails
 * the call: "nb_ddp_shard_optimizer: make left 1 scope open ...").
 * NULL / -1 with a message. */
NB_API nb_optim *nb_ddp_shard_optimizer(nb_ddp *d, nb_optim *(*make)(nb_params *shard, void *ctx),
                                        void *ctx);
NB_API int nb_ddp_shard_step(nb_ddp *d);
/* Checkpoints of sharded state, as PyTorch's consolidate_state_dict: state
 * is, on root only (NULL elsewhere), the nb_optim_state of an optimizer made
 * as the shard optimizer but over all of the nb_ddp's parameters; that is,
 * the state an unsharded run would save. gather copies every rank's shard
 * state into root's state (then nb_save it there); scatter gives every rank
 * its parameters' part of root's state (after nb_load there), so a
 * checkpoint resumes on any number of ranks. Every rank calls; root's state
 * must have each parameter's entries as its owner has them (checked: a
 * message names the first parameter that differs). 0, or -1 on every rank. */
NB_API int nb_ddp_shard_state_gather(nb_ddp *d, nb_params *state, int root);
NB_API int nb_ddp_shard_state_scatter(nb_ddp *d, nb_params *state, int root);

typedef struct nb_ddp_stats {
    int64_t steps;      /* nb_ddp_sync calls that succeeded */
    int64_t buckets;    /* buckets per step */
    int64_t bytes;      /* gradient bytes per step */
    double early;       /* share of buckets whose reduction started before backward ended */
    double wait_ms;     /* time in nb_ddp_sync, per step (the communication not hidden) */
    double window_ms;   /* per step, from the first bucket's start to the end of nb_ddp_sync */
    double overlap;     /* the share of that window before nb_ddp_sync, while backward ran */
    int64_t partial_buckets; /* buckets sent from their gradient's first part (below) */
    double resent;      /* per step, the share of those buckets' elements sent again */
} nb_ddp_stats;
NB_API nb_ddp_stats nb_ddp_get_stats(const nb_ddp *d);

#ifdef __cplusplus
}
#endif
#endif
