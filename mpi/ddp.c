/* ddp.c: nabla_mpi.h on Open MPI: the process group, parameter broadcast,
 * and data-parallel gradient averaging in buckets that start reducing while
 * backward runs (see nabla_mpi.h for the contract). Built only on nabla.h.
 *
 * Every wait goes through wait_all, which polls with a deadline, so a dead
 * or silent rank becomes an error message instead of a hang. Collectives are
 * the non-blocking MPI-3 ones for that reason. */
#define _POSIX_C_SOURCE 200809L
#include "nabla_mpi.h"

#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MSG_LEN 1024

static bool inited, broken;
static int my_rank, world = 1;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int mpi_fail(const char *fn, const char *what, int code) {
    char s[MPI_MAX_ERROR_STRING];
    int n = 0;
    MPI_Error_string(code, s, &n);
    nb_report_error("%s: rank %d: %s failed: %s", fn, my_rank, what, s);
    broken = true;
    return -1;
}

static bool need_init(const char *fn) {
    if (inited) return true;
    nb_report_error("%s: MPI is not initialized (call nb_mpi_init first)", fn);
    return false;
}

/* NABLA_MPI_TIMEOUT seconds (default 20) without the requests completing:
 * a rank died or stopped taking part, or the network between them is down. */
static double timeout_s(void) {
    const char *e = getenv("NABLA_MPI_TIMEOUT");
    double t = e ? strtod(e, NULL) : 0;
    return t > 0 ? t : 20.0;
}

static int wait_all(const char *fn, const char *what, int n, MPI_Request *reqs) {
    double limit = timeout_s(), deadline = now() + limit;
    for (;;) {
        int done = 0, rc = MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS) return mpi_fail(fn, what, rc);
        if (done) return 0;
        if (now() > deadline) {
            broken = true;
            nb_report_error("%s: rank %d: %s: no answer from the other ranks for %g s (a rank "
                            "died or stopped calling %s, or the network between the "
                            "ranks is down); MPI cannot go on, and "
                            "nb_mpi_finalize will abort the job", fn, my_rank, what, limit, fn);
            return -1;
        }
        nanosleep(&(struct timespec){0, 20000}, NULL);
    }
}

int nb_mpi_init(int *argc, char ***argv) {
    if (inited) return (nb_report_error("nb_mpi_init: MPI is already initialized"), -1);
    int provided = 0, rc = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
    if (rc != MPI_SUCCESS) return mpi_fail("nb_mpi_init", "MPI_Init_thread", rc);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &my_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    inited = true;
    broken = false;
    return 0;
}

void nb_mpi_finalize(void) {
    if (!inited) return;
    if (broken) MPI_Abort(MPI_COMM_WORLD, 1);
    MPI_Finalize();
    inited = false;
    my_rank = 0;
    world = 1;
}

int nb_mpi_rank(void) { return my_rank; }
int nb_mpi_size(void) { return world; }

/* Every rank learns whether any rank's status is nonzero; if one is, every
 * rank returns -1 with "fn: rank R failed: <R's message>" for the lowest such
 * R (R itself included, so the message is the same everywhere). */
static int agree(const char *fn, int status) {
    if (broken) return (nb_report_error("%s: an earlier MPI failure ended MPI", fn), -1);
    int mine = status != 0 ? my_rank : world, first = world;
    MPI_Request r;
    int rc = MPI_Iallreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD, &r);
    if (rc != MPI_SUCCESS) return mpi_fail(fn, "MPI_Iallreduce", rc);
    if (wait_all(fn, "agreeing on the step's status", 1, &r) != 0) return -1;
    if (first == world) return 0;
    char msg[MSG_LEN] = {0};
    if (my_rank == first) snprintf(msg, sizeof msg, "%s", nb_last_error() ? nb_last_error() : "");
    rc = MPI_Ibcast(msg, MSG_LEN, MPI_CHAR, first, MPI_COMM_WORLD, &r);
    if (rc != MPI_SUCCESS) return mpi_fail(fn, "MPI_Ibcast", rc);
    if (wait_all(fn, "sending the failed rank's message", 1, &r) != 0) return -1;
    msg[MSG_LEN - 1] = '\0';
    nb_report_error("%s: rank %d failed: %s", fn, first, msg[0] ? msg : "(no message)");
    return -1;
}

int nb_mpi_agree(const char *what, int status) {
    if (!need_init("nb_mpi_agree")) return -1;
    return agree(what ? what : "nb_mpi_agree", status);
}

double nb_mpi_mean(double x) {
    const char *fn = "nb_mpi_mean";
    if (!need_init(fn)) return NAN;
    double *all = malloc((size_t)world * sizeof *all);
    if (!all) return (nb_report_error("%s: out of memory", fn), NAN);
    MPI_Request r;
    int rc = MPI_Iallgather(&x, 1, MPI_DOUBLE, all, 1, MPI_DOUBLE, MPI_COMM_WORLD, &r);
    double sum = 0;
    if (rc != MPI_SUCCESS) mpi_fail(fn, "MPI_Iallgather", rc), sum = NAN;
    else if (wait_all(fn, "MPI_Iallgather", 1, &r) != 0) sum = NAN;
    for (int i = 0; i < world && !isnan(sum); i++) sum += all[i];
    free(all);
    return sum / world;
}

/* ------------------------------------------------------------- broadcast */
static size_t elem_size(nb_dtype dt) { return dt == NB_F32 ? 4 : dt == NB_BOOL ? 1 : 8; }

/* FNV-1a of a tensor's name, dtype and shape. */
static uint64_t describe(const char *name, const nb_tensor *t) {
    uint64_t h = 1469598103934665603ULL;
    for (const char *c = name; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ULL;
    h = (h ^ (uint64_t)nb_dtype_of(t)) * 1099511628211ULL;
    for (int i = 0; i < nb_ndim(t); i++) h = (h ^ (uint64_t)nb_shape(t)[i]) * 1099511628211ULL;
    return h;
}

/* Tensor i of ps: its parameters, then its buffers. */
static nb_tensor *tensor_at(nb_params *ps, int i, const char **name) {
    int np = nb_params_count(ps);
    return i < np ? nb_params_at(ps, i, name) : nb_params_buffer_at(ps, i - np, name);
}

/* 0 when every rank's registry matches root's; else this rank's message set
 * (status for agree). */
static int check_same_registry(const char *fn, nb_params *ps, int root) {
    int n = nb_params_count(ps) + nb_params_buffer_count(ps);
    int64_t root_n = n;
    MPI_Request r;
    int rc = MPI_Ibcast(&root_n, 1, MPI_INT64_T, root, MPI_COMM_WORLD, &r);
    if (rc != MPI_SUCCESS) return mpi_fail(fn, "MPI_Ibcast", rc);
    if (wait_all(fn, "comparing the registries", 1, &r) != 0) return -1;
    uint64_t *h = calloc((size_t)(root_n > 0 ? root_n : 1), sizeof *h);
    if (!h) return (nb_report_error("%s: out of memory", fn), -1);
    for (int i = 0; i < n && i < root_n; i++) {
        const char *name = "";
        nb_tensor *t = tensor_at(ps, i, &name);
        h[i] = describe(name, t);
    }
    uint64_t *mine = malloc((size_t)(root_n > 0 ? root_n : 1) * sizeof *mine);
    if (!mine) return (free(h), nb_report_error("%s: out of memory", fn), -1);
    memcpy(mine, h, (size_t)root_n * sizeof *h);
    rc = MPI_Ibcast(h, (int)root_n, MPI_UINT64_T, root, MPI_COMM_WORLD, &r);
    int status = rc != MPI_SUCCESS ? mpi_fail(fn, "MPI_Ibcast", rc)
                                   : wait_all(fn, "comparing the registries", 1, &r);
    if (status == 0 && n != root_n) {
        nb_report_error("it has %d tensors (parameters and buffers), rank %d has %lld", n, root,
                        (long long)root_n);
        status = -1;
    }
    for (int i = 0; status == 0 && i < n; i++) {
        if (mine[i] == h[i]) continue;
        const char *name = "";
        nb_tensor *t = tensor_at(ps, i, &name);
        nb_report_error("its tensor %d, \"%s\" (%s, %d dims), differs from rank %d's (name, "
                        "dtype or shape): the model must be built the same on every rank", i,
                        name, nb_dtype_name(nb_dtype_of(t)), nb_ndim(t), root);
        status = -1;
    }
    free(h);
    free(mine);
    return status;
}

int nb_mpi_broadcast_params(nb_params *ps, int root) {
    const char *fn = "nb_mpi_broadcast_params";
    if (!need_init(fn)) return -1;
    if (!ps) return (nb_report_error("%s: ps is NULL", fn), -1);
    if (root < 0 || root >= world)
        return (nb_report_error("%s: root %d is not a rank (0..%d)", fn, root, world - 1), -1);
    int status = check_same_registry(fn, ps, root);
    if (broken) return -1;
    if (agree(fn, status) != 0) return -1;
    int n = nb_params_count(ps) + nb_params_buffer_count(ps);
    MPI_Request *reqs = malloc((size_t)(n > 0 ? n : 1) * sizeof *reqs);
    if (!reqs) return (nb_report_error("%s: out of memory", fn), -1);
    int posted = 0, rc = MPI_SUCCESS;
    for (int i = 0; i < n && rc == MPI_SUCCESS; i++) {
        const char *name = "";
        nb_tensor *t = tensor_at(ps, i, &name);
        size_t bytes = (size_t)nb_numel(t) * elem_size(nb_dtype_of(t));
        if (bytes > (size_t)INT32_MAX) {
            nb_report_error("%s: \"%s\" has %zu bytes, more than one MPI message holds", fn,
                            name, bytes);
            rc = -1;
            break;
        }
        rc = MPI_Ibcast(nb_data(t), (int)bytes, MPI_BYTE, root, MPI_COMM_WORLD, &reqs[posted]);
        if (rc == MPI_SUCCESS) posted++;
    }
    int out = rc == MPI_SUCCESS ? 0 : rc == -1 ? -1 : mpi_fail(fn, "MPI_Ibcast", rc);
    if (posted && wait_all(fn, "broadcasting the parameters", posted, reqs) != 0) out = -1;
    free(reqs);
    for (int i = 0; out == 0 && i < n; i++) nb_mark_modified(tensor_at(ps, i, &(const char *){0}));
    return out;
}

/* ------------------------------------------------------------------- DDP */
typedef struct nb_ddp nb_ddp;

typedef struct {
    nb_ddp *d;
    int i; /* slot */
} hook_ctx;

typedef struct {
    nb_tensor *p;
    const char *name;
    int bucket;
    int64_t off, numel; /* in the bucket, elements */
    bool filled;        /* its gradient is in the bucket this step */
    /* contributions (nb_set_grad_contribution_hook): counted in the steps
     * before the partial buckets are chosen; snapped: its first one is in
     * the bucket (a partial bucket), and final is the whole gradient */
    int contribs, done_before, done_span; /* completions of others before its first, and
                                           * between its first and its whole */
    bool snapped;
    const char *final;
} slot;

/* One bucket: n elements of dtype dt, padded to world * chunk. Phase 1 is an
 * all-to-all of send (piece r to rank r) into recv; this rank adds its N
 * pieces in rank order into recv's first; phase 2 gathers every rank's first
 * piece of recv into out (send itself, except for a partial bucket). */
typedef struct {
    nb_dtype dt;
    int64_t n, chunk;
    char *send, *recv;
    char *out; /* where phase 2 gathers: send, or for a partial bucket a buffer of its own */
    int nslots, ready;
    int phase; /* 0 filling, 1 all-to-all posted, 2 all-gather posted */
    bool early; /* phase 1 posted from a hook, before nb_ddp_sync */
    bool partial;           /* sent from its gradient's first contribution (one slot) */
    unsigned char *dirty;   /* partial: the chunks of DIRTY elements that changed after */
    MPI_Request req;
} bucket;

/* A partial bucket's fix-up unit, in elements: 4 KiB of f32 (a GPT-2 row of
 * 768 touches one or two). */
#define DIRTY 1024

/* MPI requires the collectives of a communicator to be started in the same
 * order on every rank. Phase 1 starts in bucket order (as buckets fill);
 * phase 2 starts when phase 1 has finished on this rank, which happens in
 * its own order: so each phase has a communicator of its own, and phase 2
 * too starts strictly in bucket order. */
struct nb_ddp {
    MPI_Comm phase1, phase2;
    int *owner;        /* ZeRO-1: each parameter's owner rank, or NULL */
    nb_params *shard;  /* this rank's parameters (shared storage) */
    nb_optim *shard_opt;
    nb_params *ps;
    slot *slots;
    hook_ctx *ctx;
    int nslots;
    bucket *b;
    int nb;
    int next, next2; /* the next bucket (in order[]) to start phase 1, phase 2 of */
    int *order;      /* buckets in the order they start: the partial ones first */
    bool syncing, chosen; /* chosen: the partial buckets are (after a step) */
    bool whole;           /* nb_ddp_opts.no_partial_buckets */
    int done;        /* gradients completed so far this step */
    int64_t resent_total, partial_n; /* elements sent again after backward (good steps); partial buckets */
    int64_t resent_step;             /* this step's */
    nb_ddp_stats stats;
    double first_post;           /* when this step's first bucket started; 0: not yet */
    double window_total, hidden_total; /* reduction windows, and their parts before nb_ddp_sync */
    double wait_total;
    int64_t early_total;
};

static MPI_Datatype mpi_type(nb_dtype dt) { return dt == NB_F32 ? MPI_FLOAT : MPI_DOUBLE; }

/* Phase 1 of bucket k. */
static int post_phase1(nb_ddp *d, int k, bool early) {
    bucket *b = &d->b[d->order[k]];
    int rc = MPI_Ialltoall(b->send, (int)b->chunk, mpi_type(b->dt), b->recv, (int)b->chunk,
                           mpi_type(b->dt), d->phase1, &b->req);
    if (rc != MPI_SUCCESS) return mpi_fail("nb_ddp_sync", "MPI_Ialltoall", rc);
    b->phase = 1;
    b->early = early;
    if (d->first_post == 0) d->first_post = now();
    return 0;
}

/* The N pieces added in rank order into the first, divided by N (the mean,
 * each rank for its 1/N of the bucket); then phase 2 gathers those. */
static int post_phase2(nb_ddp *d, bucket *b) {
    int64_t c = b->chunk;
    if (b->dt == NB_F32) {
        float *sum = (float *)b->recv;
        for (int r = 1; r < world; r++)
            for (int64_t i = 0; i < c; i++) sum[i] += sum[r * c + i];
        for (int64_t i = 0; i < c; i++) sum[i] /= (float)world;
    } else {
        double *sum = (double *)b->recv;
        for (int r = 1; r < world; r++)
            for (int64_t i = 0; i < c; i++) sum[i] += sum[r * c + i];
        for (int64_t i = 0; i < c; i++) sum[i] /= (double)world;
    }
    int rc = MPI_Iallgather(b->recv, (int)c, mpi_type(b->dt), b->out, (int)c, mpi_type(b->dt),
                            d->phase2, &b->req);
    if (rc != MPI_SUCCESS) return mpi_fail("nb_ddp_sync", "MPI_Iallgather", rc);
    b->phase = 2;
    return 0;
}

/* Posts, in order, every bucket that is full; lets MPI progress the ones in
 * flight, and starts phase 2 of those whose phase 1 is done. */
static int advance(nb_ddp *d, bool early) {
    while (d->next < d->nb && d->b[d->order[d->next]].ready == d->b[d->order[d->next]].nslots)
        if (post_phase1(d, d->next++, early) != 0) return -1;
    while (d->next2 < d->next) {
        bucket *b = &d->b[d->order[d->next2]];
        int done = 0, rc = MPI_Test(&b->req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return mpi_fail("nb_ddp_sync", "MPI_Test", rc);
        if (!done) break;
        if (post_phase2(d, b) != 0) return -1;
        d->next2++;
    }
    return 0;
}

/* Slot i's gradient (zeros when g is NULL) into its bucket; for a partial
 * bucket already on its way, the chunks where it differs from what was sent
 * are marked instead, to be sent again after backward. */
static void fill(nb_ddp *d, int i, nb_tensor *g) {
    slot *s = &d->slots[i];
    bucket *b = &d->b[s->bucket];
    size_t es = elem_size(b->dt);
    char *dst = b->send + (size_t)s->off * es;
    s->filled = true;
    if (s->snapped) {
        static const char zeros[DIRTY * sizeof(double)];
        s->final = g ? nb_data(g) : NULL;
        for (int64_t c = 0; c * DIRTY < s->numel; c++) {
            int64_t len = s->numel - c * DIRTY < DIRTY ? s->numel - c * DIRTY : DIRTY;
            const char *now_c = s->final ? s->final + (size_t)(c * DIRTY) * es : zeros;
            b->dirty[c] = memcmp(now_c, dst + (size_t)(c * DIRTY) * es, (size_t)len * es) != 0;
        }
        return;
    }
    if (g) memcpy(dst, nb_data(g), (size_t)s->numel * es);
    else memset(dst, 0, (size_t)s->numel * es);
    b->ready++;
}

/* A gradient's first contribution, while backward goes on: for a partial
 * bucket it starts on its way at once; before the partial buckets are
 * chosen, it is counted. */
static int ddp_contribution(nb_tensor *leaf, void *arg) {
    hook_ctx *h = arg;
    nb_ddp *d = h->d;
    slot *s = &d->slots[h->i];
    bucket *b = &d->b[s->bucket];
    if (d->syncing || s->filled) return 0;
    if (s->contribs++ == 0) s->done_before = d->done;
    if (!b->partial || s->snapped) return 0;
    nb_tensor *g = nb_grad_so_far(leaf);
    if (!g || !nb_is_contiguous(g)) return 0; /* then it goes whole, as any other */
    memcpy(b->send, nb_data(g), (size_t)s->numel * elem_size(b->dt));
    s->snapped = true;
    b->ready++;
    return advance(d, true);
}

static int ddp_hook(nb_tensor *leaf, void *arg) {
    hook_ctx *h = arg;
    nb_ddp *d = h->d;
    slot *s = &d->slots[h->i];
    if (d->syncing) return 0; /* nb_ddp_sync giving a parameter its zero .grad */
    if (s->filled) {
        nb_report_error("nb_ddp: \"%s\" got a second gradient in one step; call nb_ddp_sync "
                        "after each backward", s->name);
        return -1;
    }
    nb_tensor *g = nb_grad(leaf);
    if (!nb_is_contiguous(g)) {
        nb_report_error("nb_ddp: the gradient of \"%s\" is not contiguous", s->name);
        return -1;
    }
    s->done_span = d->done - s->done_before;
    fill(d, h->i, g);
    d->done++;
    return advance(d, true);
}

static void ddp_release(nb_ddp *d) {
    nb_optim_free(d->shard_opt);
    nb_params_free(d->shard);
    nb_params_release(d->shard);
    free(d->owner);
    if (d->phase1 != MPI_COMM_NULL) MPI_Comm_free(&d->phase1);
    if (d->phase2 != MPI_COMM_NULL) MPI_Comm_free(&d->phase2);
    for (int k = 0; d->b && k < d->nb; k++) {
        free(d->b[k].send);
        free(d->b[k].recv);
        if (d->b[k].out != d->b[k].send) free(d->b[k].out);
        free(d->b[k].dirty);
    }
    free(d->b);
    free(d->order);
    free(d->slots);
    free(d->ctx);
    free(d);
}

/* Buckets over the parameters in reverse registration order, one dtype each,
 * up to `bytes` (a bigger parameter gets a bucket of its own). */
static int make_buckets(nb_ddp *d, int64_t bytes) {
    d->b = calloc((size_t)(d->nslots > 0 ? d->nslots : 1), sizeof *d->b);
    d->order = calloc((size_t)(d->nslots > 0 ? d->nslots : 1), sizeof *d->order);
    if (!d->b || !d->order) return -1;
    for (int k = 0; k < d->nslots; k++) d->order[k] = k;
    bucket *cur = NULL;
    for (int j = d->nslots - 1; j >= 0; j--) {
        slot *s = &d->slots[j];
        nb_dtype dt = nb_dtype_of(s->p);
        size_t es = elem_size(dt);
        if (!cur || cur->dt != dt || (cur->n + s->numel) * (int64_t)es > bytes) {
            cur = &d->b[d->nb++];
            cur->dt = dt;
        }
        s->bucket = (int)(cur - d->b);
        s->off = cur->n;
        cur->n += s->numel;
        cur->nslots++;
    }
    for (int k = 0; k < d->nb; k++) {
        bucket *b = &d->b[k];
        size_t es = elem_size(b->dt);
        b->chunk = (b->n + world - 1) / world;
        if (b->chunk * world > INT32_MAX) return 1; /* more than one MPI message holds */
        b->send = b->out = calloc((size_t)(b->chunk * world), es);
        b->recv = calloc((size_t)(b->chunk * world), es);
        if (!b->send || !b->recv) return -1;
        d->stats.bytes += b->n * (int64_t)es;
    }
    d->stats.buckets = d->nb;
    return 0;
}

/* ------------------------------------------- agreeing on the bucket layout */
static uint64_t mix(uint64_t h, uint64_t v) { return (h ^ v) * 1099511628211ULL; }

/* What each rank brings to nb_ddp_new's agreement: its effective
 * bucket_bytes, its parameter count, its bucket count, and hashes of its
 * parameters' sizes and dtypes (in registration order) and of its buckets'
 * sizes and dtypes (in order). */
enum { R_BYTES, R_PARAMS, R_BUCKETS, R_PARAM_HASH, R_BUCKET_HASH, R_N };
#define REC(all, r, f) (all)[(size_t)(r) * R_N + (f)]

/* The lowest rank whose field f differs from rank 0's, or world. */
static int first_differing(const int64_t *all, int f) {
    int r = 1;
    while (r < world && REC(all, r, f) == REC(all, 0, f)) r++;
    return r;
}

/* Called on every rank when the parameter hashes differ but not the counts:
 * every rank's (numel, dtype) per parameter, gathered; the message names the
 * first parameter that differs from rank 0's, and the lowest rank where. */
static int name_differing_parameter(const char *fn, nb_ddp *d) {
    int n = d->nslots;
    int64_t *mine = malloc((size_t)(2 * n + 1) * sizeof *mine);
    int64_t *every = malloc((size_t)world * (size_t)(2 * n + 1) * sizeof *every);
    int status = mine && every ? 0 : (nb_report_error("%s: out of memory", fn), -1);
    /* every rank takes part in the gather, or none: agree first */
    if (agree(fn, status) != 0) return (free(mine), free(every), -1);
    for (int i = 0; i < n; i++) {
        mine[2 * i] = d->slots[i].numel;
        mine[2 * i + 1] = (int64_t)nb_dtype_of(d->slots[i].p);
    }
    MPI_Request r;
    int rc = MPI_Iallgather(mine, 2 * n, MPI_INT64_T, every, 2 * n, MPI_INT64_T, MPI_COMM_WORLD,
                            &r);
    int out = rc != MPI_SUCCESS ? mpi_fail(fn, "MPI_Iallgather", rc)
                                : wait_all(fn, "agreeing on the parameters", 1, &r);
    for (int i = 0; out == 0 && i < n; i++)
        for (int q = 1; out == 0 && q < world; q++) {
            const int64_t *a = &every[2 * i], *b = &every[(size_t)q * (size_t)(2 * n) + 2 * i];
            if (a[0] == b[0] && a[1] == b[1]) continue;
            if (a[1] != b[1])
                nb_report_error("%s: the ranks disagree on the parameters: parameter %d (\"%s\") "
                                "is %s on rank 0, %s on rank %d; the model must be built the "
                                "same on every rank", fn, i, d->slots[i].name,
                                nb_dtype_name((nb_dtype)a[1]), nb_dtype_name((nb_dtype)b[1]), q);
            else
                nb_report_error("%s: the ranks disagree on the parameters: parameter %d (\"%s\") "
                                "has %lld elements on rank 0, %lld on rank %d; the model must be "
                                "built the same on every rank", fn, i, d->slots[i].name,
                                (long long)a[0], (long long)b[0], q);
            out = -1;
        }
    if (out == 0) { /* the hashes differed, the values do not: cannot happen */
        nb_report_error("%s: the ranks disagree on the parameters (sizes or dtypes); the model "
                        "must be built the same on every rank", fn);
        out = -1;
    }
    free(mine);
    free(every);
    return out;
}

/* Every rank's record (all) against rank 0's, the same on every rank: 0, or
 * -1 with a message naming the first difference and the ranks. */
static int compare_records(const char *fn, nb_ddp *d, const int64_t *all) {
    int q;
    if ((q = first_differing(all, R_PARAMS)) < world) {
        nb_report_error("%s: the ranks disagree on the parameters: rank 0 has %lld parameter%s, "
                        "rank %d has %lld; the model must be built the same on every rank", fn,
                        (long long)REC(all, 0, R_PARAMS), REC(all, 0, R_PARAMS) == 1 ? "" : "s",
                        q, (long long)REC(all, q, R_PARAMS));
        return -1;
    }
    if (first_differing(all, R_PARAM_HASH) < world) return name_differing_parameter(fn, d);
    if ((q = first_differing(all, R_BYTES)) < world) {
        nb_report_error("%s: the ranks disagree on the gradient buckets: rank 0 has bucket_bytes "
                        "%lld (%lld bucket%s), rank %d has %lld (%lld bucket%s); every rank must "
                        "pass the same nb_ddp_opts", fn, (long long)REC(all, 0, R_BYTES),
                        (long long)REC(all, 0, R_BUCKETS), REC(all, 0, R_BUCKETS) == 1 ? "" : "s",
                        q, (long long)REC(all, q, R_BYTES), (long long)REC(all, q, R_BUCKETS),
                        REC(all, q, R_BUCKETS) == 1 ? "" : "s");
        return -1;
    }
    if ((q = first_differing(all, R_BUCKETS)) < world ||
        (q = first_differing(all, R_BUCKET_HASH)) < world) {
        /* the same parameters and bucket_bytes make the same buckets: not expected */
        nb_report_error("%s: the ranks disagree on the gradient buckets: rank 0's %lld differ "
                        "from rank %d's %lld, from the same parameters and bucket_bytes %lld",
                        fn, (long long)REC(all, 0, R_BUCKETS), q,
                        (long long)REC(all, q, R_BUCKETS), (long long)REC(all, 0, R_BYTES));
        return -1;
    }
    return 0;
}

/* Before anything depends on the buckets, the ranks agree on them: a rank
 * that failed to make its nb_ddp (status, its message set) still takes part,
 * and then every rank fails with its message; otherwise every rank gathers
 * every rank's record (R_*) and compares the same records, so every rank
 * makes the same calls and all fail, with the same message, or none. */
static int agree_on_layout(const char *fn, nb_ddp *d, int64_t bytes, int status) {
    int64_t *all = malloc((size_t)world * R_N * sizeof *all);
    if (!all && status == 0) status = (nb_report_error("%s: out of memory", fn), -1);
    if (agree(fn, status) != 0) return (free(all), -1);
    /* every rank has its nb_ddp and its buckets */
    uint64_t ph = 1469598103934665603ULL, bh = ph;
    for (int i = 0; i < d->nslots; i++)
        ph = mix(mix(ph, (uint64_t)d->slots[i].numel), (uint64_t)nb_dtype_of(d->slots[i].p));
    for (int k = 0; k < d->nb; k++) bh = mix(mix(bh, (uint64_t)d->b[k].n), (uint64_t)d->b[k].dt);
    int64_t mine[R_N] = {[R_BYTES] = bytes, [R_PARAMS] = d->nslots, [R_BUCKETS] = d->nb,
                         [R_PARAM_HASH] = (int64_t)ph, [R_BUCKET_HASH] = (int64_t)bh};
    MPI_Request r;
    int rc = MPI_Iallgather(mine, R_N, MPI_INT64_T, all, R_N, MPI_INT64_T, MPI_COMM_WORLD, &r);
    int out = rc != MPI_SUCCESS ? mpi_fail(fn, "MPI_Iallgather", rc)
                                : wait_all(fn, "agreeing on the gradient buckets", 1, &r);
    if (out == 0) out = compare_records(fn, d, all);
    free(all);
    return out;
}

/* This rank's nb_ddp over ps, its buckets made (*out, to free, may be set
 * on failure too). 0, or -1 with a message. */
static int build(const char *fn, nb_params *ps, int64_t bytes, nb_ddp **out) {
    nb_ddp *d = *out = calloc(1, sizeof *d);
    if (!d) return (nb_report_error("%s: out of memory", fn), -1);
    int n = nb_params_count(ps);
    d->phase1 = d->phase2 = MPI_COMM_NULL;
    d->ps = ps;
    d->nslots = n;
    d->slots = calloc((size_t)(n > 0 ? n : 1), sizeof *d->slots);
    d->ctx = calloc((size_t)(n > 0 ? n : 1), sizeof *d->ctx);
    if (!d->slots || !d->ctx) return (nb_report_error("%s: out of memory", fn), -1);
    for (int i = 0; i < n; i++) {
        nb_tensor *p = nb_params_at(ps, i, &d->slots[i].name);
        d->slots[i].p = p;
        d->slots[i].numel = nb_numel(p);
        d->ctx[i] = (hook_ctx){d, i};
        if (nb_dtype_of(p) != NB_F32 && nb_dtype_of(p) != NB_F64) {
            nb_report_error("%s: parameter \"%s\" is %s; data parallelism averages f32 and f64 "
                            "gradients", fn, d->slots[i].name, nb_dtype_name(nb_dtype_of(p)));
            return -1;
        }
    }
    int mb = make_buckets(d, bytes);
    if (mb != 0)
        return (nb_report_error(mb > 0 ? "%s: a gradient bucket holds more than 2^31 - 1 "
                                         "elements (one MPI message); give a smaller "
                                         "bucket_bytes"
                                       : "%s: out of memory for the gradient buckets", fn),
                -1);
    return 0;
}

nb_ddp *nb_ddp_new(nb_params *ps, const nb_ddp_opts *opts) {
    const char *fn = "nb_ddp_new";
    if (!need_init(fn)) return NULL;
    if (broken) return (nb_report_error("%s: an earlier MPI failure ended MPI", fn), NULL);
    int64_t bytes = opts && opts->bucket_bytes > 0 ? opts->bucket_bytes : (int64_t)25 << 20;
    nb_ddp *d = NULL;
    /* a rank that fails here still takes part in the agreement (and makes
     * every rank fail), instead of leaving the others in a collective */
    int status = ps ? build(fn, ps, bytes, &d) : (nb_report_error("%s: ps is NULL", fn), -1);
    const char *env = getenv("NABLA_DDP_PARTIAL"); /* 0: as no_partial_buckets, to compare */
    if (d) d->whole = (opts && opts->no_partial_buckets) || (env && !strcmp(env, "0"));
    /* first the layout (a different parameter list fails here, with the
     * layout's message), then rank 0's weights */
    if (agree_on_layout(fn, d, bytes, status) != 0 || nb_mpi_broadcast_params(ps, 0) != 0) {
        if (d) ddp_release(d);
        return NULL;
    }
    int rc = MPI_Comm_dup(MPI_COMM_WORLD, &d->phase1);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_dup(MPI_COMM_WORLD, &d->phase2);
    if (rc != MPI_SUCCESS) {
        mpi_fail(fn, "MPI_Comm_dup", rc);
        ddp_release(d);
        return NULL;
    }
    for (int i = 0; i < d->nslots; i++) {
        nb_set_grad_hook(d->slots[i].p, ddp_hook, &d->ctx[i]);
        if (!d->whole) nb_set_grad_contribution_hook(d->slots[i].p, ddp_contribution, &d->ctx[i]);
    }
    return d;
}

/* Bucket k's parameters' .grad = the bucket's mean. A parameter backward
 * did not reach gets a .grad first, through a backward of the leaf itself. */
static int write_back(nb_ddp *d, int k) {
    for (int i = 0; i < d->nslots; i++) {
        slot *s = &d->slots[i];
        bucket *b = &d->b[s->bucket];
        if (s->bucket != k) continue;
        nb_tensor *g = nb_grad(s->p);
        if (!g) {
            nb_scope_begin();
            int rc = nb_backward_with_grad(s->p, nb_zeros(nb_dtype_of(s->p), nb_ndim(s->p),
                                                          nb_shape(s->p)));
            nb_scope_end();
            if (rc != 0 || !(g = nb_grad(s->p))) return -1;
        }
        size_t es = elem_size(b->dt);
        memcpy(nb_data(g), b->out + (size_t)s->off * es, (size_t)s->numel * es);
        nb_mark_modified(g);
    }
    return 0;
}

static void reset_step(nb_ddp *d) {
    for (int i = 0; i < d->nslots; i++) {
        slot *s = &d->slots[i];
        s->filled = s->snapped = false;
        s->final = NULL;
        s->contribs = 0;
    }
    d->done = 0;
    d->resent_step = 0;
    for (int k = 0; k < d->nb; k++) {
        bucket *b = &d->b[k];
        b->ready = 0;
        b->phase = 0;
        b->early = false; /* send's padding past n stays 0: calloc'd, and gathered as 0 + 0 */
        if (b->dirty) memset(b->dirty, 0, (size_t)((b->n + DIRTY - 1) / DIRTY));
    }
    d->next = d->next2 = 0;
    d->first_post = 0;
}

/* A partial bucket, reduced from its slot's first contribution: the chunks
 * that changed after it on any rank go again (the same all-to-all, sum in
 * rank order, division and gather), so every element gets the bits the
 * whole gradient would have given it. */
static int fix_partial(nb_ddp *d, bucket *b, const slot *s) {
    const char *fn = "nb_ddp_sync";
    int64_t nc = (s->numel + DIRTY - 1) / DIRTY, k = 0;
    size_t es = elem_size(b->dt);
    MPI_Request r;
    int rc = MPI_Iallreduce(MPI_IN_PLACE, b->dirty, (int)nc, MPI_UNSIGNED_CHAR, MPI_BOR, d->phase1,
                            &r);
    if (rc != MPI_SUCCESS) return mpi_fail(fn, "MPI_Iallreduce", rc);
    if (wait_all(fn, "agreeing on what changed after the first part", 1, &r) != 0) return -1;
    for (int64_t c = 0; c < nc; c++) k += b->dirty[c];
    if (k == 0) return 0;
    bucket fx = {.dt = b->dt, .n = k * DIRTY, .chunk = (k * DIRTY + world - 1) / world};
    fx.send = fx.out = calloc((size_t)(fx.chunk * world), es);
    fx.recv = calloc((size_t)(fx.chunk * world), es);
    /* out of memory on one rank only would leave the others in the
     * all-to-all: the ranks agree first, as everywhere */
    if (agree(fn, fx.send && fx.recv ? 0 : (nb_report_error("%s: out of memory", fn), -1)) != 0)
        return (free(fx.send), free(fx.recv), -1);
    /* the whole gradient: final, zeros (backward never finished it), or
     * what was sent (it went whole) */
    const char *src = s->snapped ? s->final : b->send;
    for (int64_t c = 0, j = 0; c < nc; c++) {
        if (!b->dirty[c]) continue;
        int64_t len = s->numel - c * DIRTY < DIRTY ? s->numel - c * DIRTY : DIRTY;
        if (src) memcpy(fx.send + (size_t)(j * DIRTY) * es, src + (size_t)(c * DIRTY) * es, (size_t)len * es);
        j++;
    }
    rc = MPI_Ialltoall(fx.send, (int)fx.chunk, mpi_type(fx.dt), fx.recv, (int)fx.chunk,
                       mpi_type(fx.dt), d->phase1, &fx.req);
    int out = rc != MPI_SUCCESS ? mpi_fail(fn, "MPI_Ialltoall", rc)
                                : wait_all(fn, "reducing the gradients", 1, &fx.req);
    if (out == 0) out = post_phase2(d, &fx);
    if (out == 0) out = wait_all(fn, "gathering the gradients", 1, &fx.req);
    for (int64_t c = 0, j = 0; out == 0 && c < nc; c++) {
        if (!b->dirty[c]) continue;
        int64_t len = s->numel - c * DIRTY < DIRTY ? s->numel - c * DIRTY : DIRTY;
        memcpy(b->out + (size_t)(c * DIRTY) * es, fx.out + (size_t)(j * DIRTY) * es, (size_t)len * es);
        j++;
    }
    d->resent_step += k * DIRTY < s->numel ? k * DIRTY : s->numel;
    free(fx.send);
    free(fx.recv);
    return out;
}

/* After the first step every rank took: a parameter alone in its bucket
 * whose gradient got its first contribution early (a weight tied between
 * the first and the last layer: at least a quarter of the parameters were
 * finished between its first part and its whole) on every rank gets a
 * partial bucket, which starts first, from that part. Every rank votes,
 * each for none when it sends whole gradients only. */
static int choose_partial(nb_ddp *d) {
    const char *fn = "nb_ddp_sync";
    int *vote = calloc((size_t)d->nb, sizeof *vote);
    if (!vote) return (nb_report_error("%s: out of memory", fn), -1);
    int span = d->nslots / 4 > 1 ? d->nslots / 4 : 1;
    for (int i = 0; !d->whole && i < d->nslots; i++) {
        slot *s = &d->slots[i];
        bucket *b = &d->b[s->bucket];
        if (b->nslots != 1 || s->contribs < 2 || s->done_span < span) continue;
        size_t es = elem_size(b->dt);
        b->out = calloc((size_t)(b->chunk * world), es);
        b->dirty = calloc((size_t)((s->numel + DIRTY - 1) / DIRTY), 1);
        vote[s->bucket] = b->out && b->dirty; /* out of memory: no vote */
    }
    MPI_Request r;
    int rc = MPI_Iallreduce(MPI_IN_PLACE, vote, d->nb, MPI_INT, MPI_MIN, d->phase1, &r);
    int out = rc != MPI_SUCCESS ? mpi_fail(fn, "MPI_Iallreduce", rc)
                                : wait_all(fn, "choosing the partial buckets", 1, &r);
    int j = 0;
    for (int k = 0; k < d->nb; k++) {
        bucket *b = &d->b[k];
        b->partial = out == 0 && vote[k];
        if (b->partial) {
            d->order[j++] = k;
            d->partial_n++;
            continue;
        }
        if (b->out != b->send) free(b->out);
        free(b->dirty);
        b->out = b->send;
        b->dirty = NULL;
    }
    for (int k = 0; k < d->nb; k++)
        if (!d->b[k].partial) d->order[j++] = k;
    d->chosen = true;
    free(vote);
    return out;
}

int nb_ddp_sync(nb_ddp *d, int status) {
    const char *fn = "nb_ddp_sync";
    if (!d) return (nb_report_error("%s: d is NULL", fn), -1);
    if (broken) return (nb_report_error("%s: an earlier MPI failure ended data parallelism", fn), -1);
    double t0 = now();
    /* what backward did not give (a failed step, an unused parameter): zeros */
    for (int i = 0; i < d->nslots; i++)
        if (!d->slots[i].filled) fill(d, i, NULL);
    int rc = advance(d, false);
    /* every rank's status first (on its own communicator; the buckets in
     * flight go on meanwhile), so that each bucket's mean is written back as
     * soon as it is complete, while the ones behind it still travel */
    int ok = rc == 0 ? agree(fn, status) : -1;
    if (broken) return -1;
    for (; d->next2 < d->nb; d->next2++) {
        bucket *b = &d->b[d->order[d->next2]];
        if (wait_all(fn, "reducing the gradients", 1, &b->req) != 0 || post_phase2(d, b) != 0)
            return -1;
    }
    int64_t early = 0;
    for (int k = 0; k < d->nb; k++) early += d->b[k].early;
    /* a failed write-back (a .grad could not be made) stops the writing,
     * not the waiting: the other ranks' collectives go on */
    int wrote = 0;
    d->syncing = true;
    for (int k = 0; k < d->nb; k++) {
        int bk = d->order[k];
        bucket *b = &d->b[bk];
        if (wait_all(fn, "gathering the gradients", 1, &b->req) != 0) return (d->syncing = false, -1);
        for (int i = 0; b->partial && i < d->nslots; i++)
            if (d->slots[i].bucket == bk && fix_partial(d, b, &d->slots[i]) != 0)
                return (d->syncing = false, -1);
        if (ok == 0 && wrote == 0) wrote = write_back(d, bk);
    }
    d->syncing = false;
    if (ok != 0) {
        reset_step(d);
        return -1;
    }
    rc = wrote;
    /* every rank takes part, whatever write_back did here, and one without
     * partial buckets (no_partial_buckets, NABLA_DDP_PARTIAL=0) votes no:
     * a rank left out of the vote would leave the others waiting in it */
    if (!d->chosen && choose_partial(d) != 0) rc = -1;
    double first = d->first_post > 0 && d->first_post < t0 ? d->first_post : t0;
    int64_t resent = d->resent_step;
    reset_step(d);
    if (rc != 0) return -1;
    double t1 = now();
    d->stats.steps++;
    d->resent_total += resent;
    d->early_total += early;
    d->wait_total += t1 - t0;
    d->window_total += t1 - first;
    d->hidden_total += t0 - first;
    return 0;
}

nb_ddp_stats nb_ddp_get_stats(const nb_ddp *d) {
    nb_ddp_stats s = {0};
    if (!d) return s;
    s = d->stats;
    s.partial_buckets = d->partial_n;
    int64_t pn = 0;
    for (int k = 0; k < d->nb; k++) pn += d->b[k].partial ? d->b[k].n : 0;
    if (s.steps > 0 && pn > 0) s.resent = (double)d->resent_total / ((double)pn * (double)s.steps);
    if (s.steps > 0 && s.buckets > 0) {
        s.early = (double)d->early_total / (double)(s.steps * s.buckets);
        s.wait_ms = 1e3 * d->wait_total / (double)s.steps;
        s.window_ms = 1e3 * d->window_total / (double)s.steps;
        s.overlap = d->window_total > 0 ? d->hidden_total / d->window_total : 0;
    }
    return s;
}

void nb_ddp_free(nb_ddp *d) {
    if (!d) return;
    for (int i = 0; i < d->nslots; i++) {
        nb_set_grad_hook(d->slots[i].p, NULL, NULL);
        nb_set_grad_contribution_hook(d->slots[i].p, NULL, NULL);
    }
    ddp_release(d);
}

/* ------------------------------------------------------------------ ZeRO-1 */
/* Each parameter's owner, the least loaded rank so far (the lowest on a
 * tie), and this rank's registry of its own. 0, or -1 with a message. */
static int assign_owners(const char *fn, nb_ddp *d) {
    int64_t *load = calloc((size_t)world, sizeof *load);
    d->owner = calloc((size_t)(d->nslots > 0 ? d->nslots : 1), sizeof *d->owner);
    d->shard = nb_params_new();
    nb_params_hold(d->shard); /* make may free it: then it goes with the nb_ddp */
    int rc = load && d->owner && d->shard ? 0 : (nb_report_error("%s: out of memory", fn), -1);
    for (int i = 0; rc == 0 && i < d->nslots; i++) {
        int best = 0;
        for (int r = 1; r < world; r++)
            if (load[r] < load[best]) best = r;
        d->owner[i] = best;
        load[best] += d->slots[i].numel;
        if (best == my_rank && !nb_params_add(d->shard, d->slots[i].name, d->slots[i].p)) rc = -1;
    }
    free(load);
    if (rc == 0 && nb_params_count(d->shard) == 0) {
        nb_report_error("%s: rank %d owns no parameter: %d parameter(s) for %d ranks; use "
                        "fewer ranks, or no sharding", fn, my_rank, d->nslots, world);
        rc = -1;
    }
    return rc;
}

nb_optim *nb_ddp_shard_optimizer(nb_ddp *d, nb_optim *(*make)(nb_params *shard, void *ctx),
                                 void *ctx) {
    const char *fn = "nb_ddp_shard_optimizer";
    if (!need_init(fn)) return NULL;
    if (!d || !make) return (nb_report_error("%s: %s is NULL", fn, d ? "make" : "d"), NULL);
    if (d->shard_opt) return (nb_report_error("%s: this nb_ddp has a shard optimizer already", fn), NULL);
    int status = assign_owners(fn, d);
    nb_optim *opt = NULL;
    if (status == 0) {
        nb_clear_error(); /* so that a make failing without a message is seen */
        int frame = nb_callback_begin(fn, "make"); /* the callback rule of nabla.h */
        status = frame > 0 ? 0 : -1;
        if (status == 0) opt = make(d->shard, ctx);
        if (status == 0 && nb_callback_end(frame) != 0) status = -1;
        else if (status == 0 && !opt) {
            if (!nb_last_error()) nb_report_error("%s: make returned NULL without a message", fn);
            status = -1;
        }
        if (status != 0) {
            nb_optim_free(opt);
            opt = NULL;
        }
    }
    if (agree(fn, status) != 0) { /* as before the call, on every rank */
        nb_optim_free(opt);
        nb_params_free(d->shard);
        nb_params_release(d->shard);
        free(d->owner);
        d->shard = NULL;
        d->owner = NULL;
        return NULL;
    }
    return d->shard_opt = opt;
}

int nb_ddp_shard_step(nb_ddp *d) {
    const char *fn = "nb_ddp_shard_step";
    if (!d || !d->shard_opt)
        return (nb_report_error("%s: %s", fn, d ? "no shard optimizer (nb_ddp_shard_optimizer)"
                                                 : "d is NULL"), -1);
    /* the shard's handles take the averaged gradients of the model's, one at
     * a time, each freed as it is copied: no more gradient memory than the
     * model's; the gradients of parameters other ranks own go at once */
    int rc = 0;
    for (int i = 0; i < d->nslots && rc == 0; i++) {
        nb_tensor *p = d->slots[i].p;
        if (d->owner[i] == my_rank) {
            nb_tensor *h = nb_params_get(d->shard, d->slots[i].name), *g = nb_grad(p);
            rc = h && g ? nb_backward_with_grad(h, g) : -1;
        }
        nb_clear_grad(p);
    }
    if (rc == 0) {
        nb_optim_step(d->shard_opt);
        nb_optim_clear_grad(d->shard_opt);
    }
    if (agree(fn, rc) != 0) return -1;
    MPI_Request *reqs = malloc((size_t)(d->nslots > 0 ? d->nslots : 1) * sizeof *reqs);
    if (!reqs) return (nb_report_error("%s: out of memory", fn), -1);
    int posted = 0, mrc = MPI_SUCCESS;
    for (int i = 0; i < d->nslots && mrc == MPI_SUCCESS; i++) {
        nb_tensor *p = d->slots[i].p;
        mrc = MPI_Ibcast(nb_data(p), (int)d->slots[i].numel, mpi_type(nb_dtype_of(p)),
                         d->owner[i], MPI_COMM_WORLD, &reqs[posted]);
        if (mrc == MPI_SUCCESS) posted++;
    }
    int out = mrc == MPI_SUCCESS ? 0 : mpi_fail(fn, "MPI_Ibcast", mrc);
    if (posted && wait_all(fn, "gathering the updated parameters", posted, reqs) != 0) out = -1;
    free(reqs);
    for (int i = 0; out == 0 && i < d->nslots; i++) {
        nb_mark_modified(d->slots[i].p);
        nb_clear_grad(d->slots[i].p); /* the step is taken: as zero_grad(set_to_none=True) */
    }
    return out;
}

/* ------------------------------------------ ZeRO-1 state, for checkpoints */
/* The slot of state entry "<parameter name>.<what>", or -1. */
static int state_slot(const nb_ddp *d, const char *entry) {
    const char *dot = strrchr(entry, '.');
    if (!dot) return -1;
    size_t len = (size_t)(dot - entry);
    for (int i = 0; i < d->nslots; i++)
        if (strlen(d->slots[i].name) == len && !strncmp(d->slots[i].name, entry, len)) return i;
    return -1;
}

/* Each entry's slot (NULL registry: none). */
static int *entry_slots(const nb_ddp *d, nb_params *st, int *n) {
    *n = nb_params_buffer_count(st);
    int *slot_of = malloc((size_t)(*n > 0 ? *n : 1) * sizeof *slot_of);
    for (int e = 0; slot_of && e < *n; e++) {
        const char *name = "";
        nb_params_buffer_at(st, e, &name);
        slot_of[e] = state_slot(d, name);
    }
    return slot_of;
}

/* Root's state and the owners' shard states must hold the same entries for
 * each parameter (names, dtypes, shapes, in order): each owner sends a hash
 * of its own, root compares. Root's status (this rank's message set), for agree. */
static int check_state_layout(const char *fn, nb_ddp *d, nb_params *state, int root,
                              const int *slot_of, int n, const int *shard_slot, int ns,
                              int status) {
    /* every rank takes part in the reduction, whatever its status */
    uint64_t *h = calloc((size_t)d->nslots + 1, sizeof *h), *all = calloc((size_t)d->nslots + 1, sizeof *all);
    if (!h || !all) { /* this rank cannot take part: the others time out */
        free(h), free(all);
        return (nb_report_error("%s: out of memory", fn), -1);
    }
    for (int e = 0; shard_slot && e < ns; e++) {
        const char *name = "";
        nb_tensor *t = nb_params_buffer_at(nb_optim_state(d->shard_opt), e, &name);
        if (shard_slot[e] >= 0) h[shard_slot[e]] = h[shard_slot[e]] * 31 + describe(name, t);
    }
    MPI_Request r;
    int rc = MPI_Ireduce(h, all, d->nslots, MPI_UINT64_T, MPI_SUM, root, MPI_COMM_WORLD, &r);
    int reduced = rc != MPI_SUCCESS ? mpi_fail(fn, "MPI_Ireduce", rc)
                                    : wait_all(fn, "comparing the optimizer states", 1, &r);
    if (status == 0) status = reduced;
    if (status == 0 && my_rank == root) {
        memset(h, 0, (size_t)d->nslots * sizeof *h);
        for (int e = 0; e < n && status == 0; e++) {
            const char *name = "";
            nb_tensor *t = nb_params_buffer_at(state, e, &name);
            if (slot_of[e] < 0) {
                nb_report_error("%s: state entry \"%s\" belongs to no parameter of the nb_ddp",
                                fn, name);
                status = -1;
            } else h[slot_of[e]] = h[slot_of[e]] * 31 + describe(name, t);
        }
        for (int i = 0; i < d->nslots && status == 0; i++)
            if (h[i] != all[i]) {
                nb_report_error("%s: the state of \"%s\" differs from its owner's (rank %d): make "
                                "the state's optimizer as the shard optimizer, over all of the "
                                "nb_ddp's parameters", fn, d->slots[i].name, d->owner[i]);
                status = -1;
            }
    }
    free(h);
    free(all);
    return status;
}

/* Moves every entry of the shard states to root's state (gather) or back. */
static int move_state(const char *fn, nb_ddp *d, nb_params *state, int root, bool gather) {
    if (!need_init(fn)) return -1;
    if (!d || !d->shard_opt)
        return (nb_report_error("%s: %s", fn, d ? "no shard optimizer (nb_ddp_shard_optimizer)"
                                                 : "d is NULL"), -1);
    if (root < 0 || root >= world)
        return (nb_report_error("%s: root %d is not a rank (0..%d)", fn, root, world - 1), -1);
    nb_params *shard = nb_optim_state(d->shard_opt);
    int n = 0, ns = 0, status = 0;
    if (my_rank == root && !state) status = (nb_report_error("%s: state is NULL on root %d", fn, root), -1);
    int *slot_of = entry_slots(d, my_rank == root ? state : NULL, &n);
    int *shard_slot = entry_slots(d, shard, &ns);
    MPI_Request *reqs = malloc((size_t)(n + ns + 1) * sizeof *reqs);
    if (!slot_of || !shard_slot || !reqs) status = (nb_report_error("%s: out of memory", fn), -1);
    if (slot_of && shard_slot && reqs)
        status = check_state_layout(fn, d, state, root, slot_of, n, shard_slot, ns, status);
    int out = agree(fn, status);
    int posted = 0, rc = MPI_SUCCESS;
    /* slot by slot, each side's entries of that slot in their order */
    for (int i = 0; out == 0 && i < d->nslots && rc == MPI_SUCCESS; i++) {
        bool mine = d->owner[i] == my_rank, at_root = my_rank == root;
        if (!mine && !at_root) continue;
        int e = 0, f = 0;
        for (;;) {
            while (at_root && e < n && slot_of[e] != i) e++;
            while (mine && f < ns && shard_slot[f] != i) f++;
            if ((at_root && e >= n) || (mine && f >= ns)) break;
            nb_tensor *a = at_root ? nb_params_buffer_at(state, e, NULL) : NULL;
            nb_tensor *b = mine ? nb_params_buffer_at(shard, f, NULL) : NULL;
            nb_tensor *src = gather ? b : a, *dst = gather ? a : b;
            nb_tensor *any = a ? a : b;
            size_t bytes = (size_t)nb_numel(any) * elem_size(nb_dtype_of(any));
            if (mine && at_root) memcpy(nb_data(dst), nb_data(src), bytes);
            else if (src) rc = MPI_Isend(nb_data(src), (int)bytes, MPI_BYTE, gather ? root : d->owner[i], 7, MPI_COMM_WORLD, &reqs[posted]);
            else rc = MPI_Irecv(nb_data(dst), (int)bytes, MPI_BYTE, gather ? d->owner[i] : root, 7, MPI_COMM_WORLD, &reqs[posted]);
            if (rc == MPI_SUCCESS && !(mine && at_root)) posted++;
            e += at_root, f += mine;
        }
    }
    if (rc != MPI_SUCCESS) out = mpi_fail(fn, "MPI_Isend/MPI_Irecv", rc);
    if (posted && wait_all(fn, "moving the optimizer state", posted, reqs) != 0) out = -1;
    free(reqs);
    free(slot_of);
    free(shard_slot);
    return out;
}

int nb_ddp_shard_state_gather(nb_ddp *d, nb_params *state, int root) {
    return move_state("nb_ddp_shard_state_gather", d, state, root, true);
}

int nb_ddp_shard_state_scatter(nb_ddp *d, nb_params *state, int root) {
    return move_state("nb_ddp_shard_state_scatter", d, state, root, false);
}
