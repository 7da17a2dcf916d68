/* matmul.c: nb_matmul with torch.matmul semantics, its kernels and its
 * backward rule.
 *
 *   (K)       x (K)        -> ()            dot product
 *   (K)       x (...,K,N)  -> (...,N)       a gets a dim prepended, removed after
 *   (...,M,K) x (K)        -> (...,M)       b gets a dim appended, removed after
 *   (...,M,K) x (...,K,N)  -> (broadcast(...),M,N)
 *
 * Operands are read in place through their strides (transposed, expanded and
 * narrowed views alike); nothing is copied first. Each output matrix is made
 * by one call of the blocked SIMD kernel in gemm.c (nbi_gemm_f32/f64), which
 * packs blocks of the operands through their strides; a batch whose b is
 * shared and whose a steps over its rows is one taller product. Products
 * with one row (or column) of output per matrix go to the matrix-vector
 * kernels of gemv.c instead, which read the matrix in place (below). Every output
 * element is a sum over k in increasing order from 0, accumulated in the
 * output's dtype (f32 in float, as PyTorch does; fused multiply-adds where the
 * CPU has them), so the result does not depend on blocking or tiling.
 *
 * bf16 (gemm_bf16.c): bf16 x bf16 sums the exact products in f32 and rounds
 * the result to bf16 once; under autocast f32 operands are rounded to bf16 as
 * they are packed and the f32 sum is the result. */
#include "gemm_internal.h"

#include <stdatomic.h>
#include <stdlib.h>
#include "ops_internal.h"

static const char *FN = "nb_matmul";

/* The operands as matrices: batch dims, sizes and strides. A 1-D a is a
 * (1,K) matrix, a 1-D b a (K,1) one (the stride of the added dim is unused). */
typedef struct {
    int nbatch;                         /* batch dims of the output */
    int64_t batch[NB_MAX_DIMS];         /* their sizes */
    int64_t abst[NB_MAX_DIMS], bbst[NB_MAX_DIMS]; /* a's and b's strides over them (0 = broadcast) */
    int64_t M, K, N;
    int64_t sam, sak, sbk, sbn;
} mm_geom;

/* Strides of t's leading nb dims read as the batch (nbatch, batch): 0 for
 * dims t lacks or has with size 1. */
static void batch_strides(const nb_tensor *t, int nb, const mm_geom *g, int64_t *st) {
    int lead = g->nbatch - nb;
    for (int i = 0; i < g->nbatch; i++) {
        int j = i - lead;
        st[i] = (j < 0 || t->shape[j] == 1) ? 0 : t->strides[j];
    }
}

/* A's batch dims and its M dim as one (rows, stride) when b is the same matrix
 * for every batch (all its batch strides 0) and a's batch dims step exactly
 * over its rows (a contiguous (B...,M,K), or a row-major view of one): then
 * the batch is one taller product, c being contiguous (B...,M,N). */
static bool fold_batch(const mm_geom *g, int64_t *rows, int64_t *stride) {
    int64_t n = g->M, st = g->sam; /* the running (size, stride) of the folded dims */
    for (int d = g->nbatch - 1; d >= 0; d--) {
        if (g->batch[d] == 1) continue;
        if (g->bbst[d] != 0) return false;
        if (n == 1) st = g->abst[d];
        else if (g->abst[d] != st * n) return false;
        n *= g->batch[d];
    }
    *rows = n;
    *stride = st;
    return true;
}

/* The kernel for the operands' dtypes: f32 or f64 alike, or bf16 products
 * (either operand bf16 or f32 rounded as packed) into an f32 c. */
typedef struct {
    nb_dtype a, b, c;
    bool bf16;
} mm_types;

static int gemm(nbi_gemm_ws *ws, const mm_types *t, int64_t M, int64_t N, const mm_geom *g,
                const void *a, int64_t sam, const void *b, void *c) {
    if (t->bf16)
        return nbi_gemm_bf16(ws, M, N, g->K, a, t->a == NB_F32, sam, g->sak, b, t->b == NB_F32,
                             g->sbk, g->sbn, c, g->N, 1);
    if (t->c == NB_F32)
        return nbi_gemm_f32(ws, M, N, g->K, a, sam, g->sak, b, g->sbk, g->sbn, c, g->N, 1);
    return nbi_gemm_f64(ws, M, N, g->K, a, sam, g->sak, b, g->sbk, g->sbn, c, g->N, 1);
}

/* One batched product cut into tasks: each is rows [r0, r0 + tile) and
 * columns [c0, c0 + ctile) of one output matrix, a kernel call of its own.
 * Results do not depend on the cut (see gemm_internal.h), so the thread
 * count never changes them. */
typedef struct {
    const mm_geom *g;
    mm_types t;
    int64_t esa, esb, esc; /* element sizes */
    const char *pa, *pb;
    char *pc;
    int64_t M, sam;       /* rows per matrix and their stride in a */
    int64_t tiles, tile;  /* row tiles per matrix, rows per tile */
    int64_t ctiles, ctile; /* column tiles, columns per tile */
    _Atomic int failed;
} mm_job;

/* Offsets of batch t's matrices in a and b (elements). */
static void batch_offsets(const mm_geom *g, int64_t t, int64_t *aoff, int64_t *boff) {
    *aoff = *boff = 0;
    for (int d = g->nbatch - 1; d >= 0; d--) {
        int64_t i = t % g->batch[d];
        t /= g->batch[d];
        *aoff += i * g->abst[d];
        *boff += i * g->bbst[d];
    }
}

static void mm_tasks(void *ctx, int64_t lo, int64_t hi) {
    mm_job *j = ctx;
    nbi_gemm_ws ws = {0};
    for (int64_t t = lo; t < hi && !atomic_load(&j->failed); t++) {
        int64_t ct = t % j->ctiles, rt = t / j->ctiles;
        int64_t bt = rt / j->tiles, r0 = (rt % j->tiles) * j->tile, c0 = ct * j->ctile;
        int64_t rows = j->M - r0 < j->tile ? j->M - r0 : j->tile;
        int64_t cols = j->g->N - c0 < j->ctile ? j->g->N - c0 : j->ctile;
        int64_t aoff = 0, boff = 0;
        if (j->g->nbatch) batch_offsets(j->g, bt, &aoff, &boff);
        aoff += r0 * j->sam;
        boff += c0 * j->g->sbn;
        int64_t coff = (bt * j->M + r0) * j->g->N + c0;
        if (gemm(&ws, &j->t, rows, cols, j->g, j->pa + aoff * j->esa, j->sam,
                 j->pb + boff * j->esb, j->pc + coff * j->esc))
            atomic_store(&j->failed, 1);
    }
    nbi_gemm_ws_free(&ws);
}

/* ------------------------------------------------------------------- gemv */
/* Products with one row of output per matrix, or one column, are
 * matrix-vector products: gemv.c streams W once in place where the general
 * kernel would pack it, with the same bits (see gemm_internal.h). Three forms:
 *
 *   ROWS_B  x (1,K) b, b = W^T with W's rows contiguous (sbk == 1): a linear
 *           layer on one token; attention's q K^T over a KV cache
 *   COLS_B  x (1,K) b, b's rows contiguous (sbn == 1, f32): attention's p V
 *   ROWS_A  a (M,K) x (K,1), a's rows contiguous (sak == 1): lm_head on one
 *           token
 *
 * each for one matrix or per matrix of a batch (heads: (1,H,1,D) x
 * (1,H,D,L)). Threads split the outputs of each matrix in units (16 rows
 * for the rows forms, 64 columns for COLS_B), never a sum. */
enum { GV_ROWS_B, GV_COLS_B, GV_ROWS_A };

typedef struct {
    int form;
    const mm_geom *g;    /* batch offsets; NULL: one matrix */
    const char *pa, *pb; /* the operands' first elements */
    int64_t esa, esb;    /* their element sizes */
    int64_t ldw;         /* W's row stride (elements) */
    int64_t N, K;        /* outputs per matrix, sum length */
    int64_t units, unit; /* units per matrix, outputs per unit */
    const float *x;      /* f32: the x vectors, one per matrix, K apart; NULL: read in place */
    const uint32_t *xp;  /* bf16: x as pairs, K / 2 + 1 words apart */
    float *y;
} gv_job;

/* Outputs [u0 * unit, u1 * unit) of matrix bt */
static void gv_run(const gv_job *j, int64_t bt, int64_t u0, int64_t u1) {
    int64_t aoff = 0, boff = 0;
    if (j->g) batch_offsets(j->g, bt, &aoff, &boff);
    const char *pa = j->pa + aoff * j->esa, *pb = j->pb + boff * j->esb;
    const char *w = j->form == GV_ROWS_A ? pa : pb;
    const void *x = j->form == GV_ROWS_A ? pb : pa; /* in place: contiguous */
    int64_t r0 = u0 * j->unit, n = (u1 * j->unit < j->N ? u1 * j->unit : j->N) - r0;
    float *y = j->y + bt * j->N + r0;
    if (j->form == GV_COLS_B) {
        nbi_vecmat_f32(n, j->K, (const float *)w + r0, j->ldw, j->x ? j->x + bt * j->K : x, y);
    } else {
        int64_t es = j->xp ? 2 : 4;
        w += r0 * j->ldw * es;
        if (j->xp)
            nbi_gemv_bf16(n, j->K, (const uint16_t *)w, j->ldw, j->xp + bt * (j->K / 2 + 1), y, 1);
        else nbi_gemv_f32(n, j->K, (const float *)w, j->ldw, j->x ? j->x + bt * j->K : x, y, 1);
    }
}

static void gv_tasks(void *ctx, int64_t lo, int64_t hi) {
    const gv_job *j = ctx;
    while (lo < hi) { /* runs of units within one matrix */
        int64_t bt = lo / j->units, u0 = lo % j->units;
        int64_t u1 = u0 + (hi - lo) < j->units ? u0 + (hi - lo) : j->units;
        gv_run(j, bt, u0, u1);
        lo += u1 - u0;
    }
}

/* The form of the product (rows, sam: a's rows per matrix and their
 * stride), or -1 when it has none gemv.c does on this CPU. */
static int gv_form(const mm_geom *g, const mm_types *t, int64_t rows, nb_dtype *wdt) {
    if (g->K == 0 || t->c != NB_F32) return -1;
    int form = rows == 1 && g->sbk == 1                ? GV_ROWS_B
               : rows == 1 && g->sbn == 1 && !t->bf16 ? GV_COLS_B /* f32 only */
               : g->N == 1 && g->sak == 1              ? GV_ROWS_A
                                                       : -1;
    if (form < 0) return -1;
    *wdt = form == GV_ROWS_A ? t->a : t->b;
    if (t->bf16 ? *wdt != NB_BF16 : *wdt != NB_F32) return -1; /* f32 W under autocast: packed */
    return nbi_gemv_available(t->bf16) ? form : -1;
}

/* The x vectors, one per matrix, where they cannot be read in place: as
 * pairs (bf16), or gathered from a stride (f32). NULL when out of memory. */
static void *gv_vectors(const gv_job *j, int64_t nbat, nb_dtype xdt, int64_t sx, bool bf16) {
    size_t per = bf16 ? (size_t)(j->K / 2 + 1) * sizeof(uint32_t) : (size_t)j->K * sizeof(float);
    char *buf = malloc(per * (size_t)nbat);
    for (int64_t bt = 0; buf && bt < nbat; bt++) {
        int64_t aoff = 0, boff = 0;
        if (j->g) batch_offsets(j->g, bt, &aoff, &boff);
        const char *x = j->form == GV_ROWS_A ? j->pb + boff * j->esb : j->pa + aoff * j->esa;
        if (bf16) {
            nbi_gemv_pairs(j->K, x, xdt == NB_F32, sx, (uint32_t *)(buf + (size_t)bt * per));
        } else {
            float *d = (float *)(buf + (size_t)bt * per);
            for (int64_t k = 0; k < j->K; k++) d[k] = ((const float *)x)[k * sx];
        }
    }
    return buf;
}

/* 1 when the product is not one gemv.c does on this CPU (the general kernel
 * then runs), else 0, or -1 (message set) when out of memory. nbat matrices
 * (batch offsets from g when nbat > 1); rows, sam: a's rows per matrix
 * (after folding the batch, fold_batch, when nbat == 1). */
static int try_gemv(const mm_geom *g, const mm_types *t, int64_t nbat, int64_t rows, int64_t sam,
                    const char *pa, const char *pb, float *pc) {
    nb_dtype wdt;
    int form = gv_form(g, t, rows, &wdt);
    if (form < 0) return 1;
    nb_dtype xdt = form == GV_ROWS_A ? t->b : t->a;
    int64_t es = (int64_t)nbi_dtype_size(wdt);
    gv_job j = {.form = form, .g = nbat > 1 ? g : NULL, .pa = pa, .pb = pb,
                .esa = (int64_t)nbi_dtype_size(t->a), .esb = (int64_t)nbi_dtype_size(t->b),
                .ldw = form == GV_ROWS_A ? sam : form == GV_ROWS_B ? g->sbn : g->sbk,
                .N = form == GV_ROWS_A ? rows : g->N, .K = g->K,
                .unit = form == GV_COLS_B ? 64 : 16, .y = pc};
    j.units = (j.N + j.unit - 1) / j.unit;
    int64_t sx = form == GV_ROWS_A ? g->sbk : g->sak;
    void *buf = NULL;
    if (t->bf16 || sx != 1) {
        if (!(buf = gv_vectors(&j, nbat, xdt, sx, t->bf16))) {
            nbi_error("%s: out of memory for %lld vectors of %lld elements", FN, (long long)nbat,
                      (long long)g->K);
            return -1;
        }
        if (t->bf16) j.xp = buf;
        else j.x = buf;
    }
    /* at least ~128 KiB of W per task: below that the pool's wake-up costs more */
    int64_t per_unit = j.unit * g->K * es;
    nbi_parallel_for(nbat * j.units, ((int64_t)128 << 10) / per_unit + 1, gv_tasks, &j);
    free(buf);
    return 0;
}

/* a (B...,M,K), b (B...,K,N) -> c (B...,M,N) contiguous. A batch whose b is
 * shared and whose a steps over its rows is one taller matrix. A single
 * product is cut into one task per thread along its longer side: along N
 * when N >= M (each task then packs only its columns of b; a is mostly read
 * in place), else along M, in whole register tiles of the kernel's path
 * (nbi_gemm_blocks_of). A task should be worth at least ~8 us of kernel time
 * (2 MFLOP on the AVX-512 f32 path, 32 lanes of FMA per cycle on this Zen 5;
 * proportionally fewer on narrower paths), or the pool's wake-up costs more
 * than it saves. 0, or -1 (message set) when the kernel's buffers cannot be
 * allocated. */
static int matmul_batched(const mm_geom *g, const nb_tensor *a, const nb_tensor *b,
                          nb_tensor *c, bool bf16) {
    int64_t nbat = 1;
    for (int i = 0; i < g->nbatch; i++) nbat *= g->batch[i];
    if (g->M * g->N == 0 || nbat == 0) return 0;
    mm_job j = {.g = g, .t = {a->dtype, b->dtype, c->dtype, bf16},
                .esa = (int64_t)nbi_dtype_size(a->dtype), .esb = (int64_t)nbi_dtype_size(b->dtype),
                .esc = (int64_t)nbi_dtype_size(c->dtype), .pa = nbi_ptr(a), .pb = nbi_ptr(b),
                .pc = nbi_ptr(c), .M = g->M, .sam = g->sam};
    if (nbat > 1 && fold_batch(g, &j.M, &j.sam)) nbat = 1;
    int rc = try_gemv(g, &j.t, nbat, j.M, j.sam, j.pa, j.pb, (float *)j.pc);
    if (rc <= 0) return rc;
    mm_geom flat = *g;
    if (nbat == 1) flat.nbatch = 0; /* one matrix: no batch offsets */
    j.g = &flat;
    double flops = 2.0 * (double)j.M * (double)g->N * (double)g->K;
    int threads = nb_num_threads();
    /* tasks per matrix: one per thread for a single product, else enough to
     * balance the batch */
    int64_t want = nbat == 1 ? threads : nbat >= 2 * threads ? 1 : (2 * threads + nbat - 1) / nbat;
    const nbi_gemm_blocks bk = nbi_gemm_blocks_of(c->dtype == NB_F64);
    const double min_flops = 2e6 * bk.nr / 32; /* the path's vector width: nr = 2 vectors */
    int64_t by_work = (int64_t)(flops / min_flops);
    if (want > by_work) want = by_work > 1 ? by_work : 1;
    bool by_cols = nbat == 1 && g->N >= j.M && want > 1;
    j.tile = by_cols ? j.M : (j.M + want - 1) / want;
    j.tile = (j.tile + bk.mr - 1) / bk.mr * bk.mr; /* whole register tiles */
    j.tiles = (j.M + j.tile - 1) / j.tile;
    j.ctile = by_cols ? (g->N + want - 1) / want : g->N;
    if (by_cols) j.ctile = (j.ctile + bk.nr - 1) / bk.nr * bk.nr; /* whole column panels */
    j.ctiles = (g->N + j.ctile - 1) / j.ctile;
    int64_t tasks = j.tiles * j.ctiles;
    int64_t per_task = (int64_t)(min_flops / (flops / (double)tasks + 1.0)) + 1;
    nbi_parallel_for(nbat * tasks, per_task, mm_tasks, &j);
    if (atomic_load(&j.failed)) {
        nbi_error("%s: out of memory for the packing buffers of a %lld x %lld x %lld product", FN,
                  (long long)g->M, (long long)g->K, (long long)g->N);
        return -1;
    }
    return 0;
}

/* ----------------------------------------------------------------- backward */
/* x y, laid out like `like` (an operand whose gradient this is): when like's
 * last two dims are column-major (a transposed view, as w^T in nb_linear),
 * the product is made as (y^T x^T)^T, whose buffer is then row-major in
 * like's base order, so the gradient reaches the base (the weight) without
 * a strided copy. The same products are summed in the same order: the bits
 * are those of x y. */
static nb_tensor *product_like(nb_tensor *x, nb_tensor *y, const nb_tensor *like) {
    int n = like->ndim;
    bool colmajor = n >= 2 && like->strides[n - 2] == 1 && like->strides[n - 1] != 1 &&
                    like->shape[n - 1] > 1;
    if (!colmajor) return nb_matmul(x, y);
    return nb_transpose(nb_matmul(nb_transpose(y, -1, -2), nb_transpose(x, -1, -2)), -1, -2);
}

/* out = a b  =>  dA = g bᵀ, dB = aᵀ g, each summed over the batch dims its
 * input was broadcast along. A 1-D operand is seen as a matrix (a: (1,K),
 * b: (K,1)) and g gets the matching size-1 dims back. Made of recorded ops
 * (products, views, nbi_sum_to), so it is differentiable again under
 * create_graph as it is. The engine runs it in the autocast dtype the
 * forward ran in (autocast.c): a product made in a bf16 region makes its
 * two products in bf16 too, with f32 results, and a bf16 operand's gradient
 * is then rounded to bf16. */
static int matmul_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    nb_tensor *a = nbi_saved_in(n, 0), *b = nbi_saved_in(n, 1);
    if (!a || !b) return -1;
    bool a1 = a->ndim == 1, b1 = b->ndim == 1;
    nb_tensor *a2 = a1 ? nb_unsqueeze(a, 0) : a; /* (1,K) */
    nb_tensor *b2 = b1 ? nb_unsqueeze(b, 1) : b; /* (K,1) */
    nb_tensor *g2 = g;                            /* (B...,M,N) */
    if (g2 && a1) g2 = nb_unsqueeze(g2, b1 ? g2->ndim : g2->ndim - 1);
    if (g2 && b1) g2 = nb_unsqueeze(g2, g2->ndim);
    if (!a2 || !b2 || !g2) return -1;
    if (nbi_wants(n, 0)) {
        nb_tensor *da = product_like(g2, nb_transpose(b2, -1, -2), a2); /* (B...,M,K) */
        /* a 1-D a: (B...,1,K) sums to (K) like a broadcast */
        if (!da || !(gin[0] = nbi_sum_to(da, a->ndim, a->shape))) return -1;
    }
    if (nbi_wants(n, 1)) {
        nb_tensor *db = product_like(nb_transpose(a2, -1, -2), g2, b2); /* (B...,K,N) */
        if (db && b1) db = nb_squeeze(db, -1);                    /* (B...,K) */
        if (!db || !(gin[1] = nbi_sum_to(db, b->ndim, b->shape))) return -1;
    }
    for (int k = 0; k < 2; k++) /* autocast: a bf16 operand's gradient is bf16 */
        if (gin[k] && gin[k]->dtype != n->in[k]->dtype && !(gin[k] = nb_to(gin[k], n->in[k]->dtype)))
            return -1;
    return 0;
}

/* p + q for the two terms of a tangent: bf16 terms are added in f32 and
 * rounded once, as PyTorch adds bf16 tensors. */
static nb_tensor *add_terms(nb_tensor *p, nb_tensor *q) {
    if (!p || !q || p->dtype != NB_BF16) return nb_add(p, q);
    return nb_to(nb_add(nb_to(p, NB_F32), nb_to(q, NB_F32)), NB_BF16);
}

/* d(a b) = da b + a db (a NULL tangent adds nothing), each product made
 * the way the recorded one was (the engine runs this in its autocast dtype). */
static nb_tensor *matmul_jvp(nbi_node *n, nb_tensor *const *tin) {
    nb_tensor *a = nbi_saved_in(n, 0), *b = nbi_saved_in(n, 1);
    if (!a || !b) return NULL;
    nb_tensor *p = tin[0] ? nb_matmul(tin[0], b) : NULL;
    nb_tensor *q = tin[1] ? nb_matmul(a, tin[1]) : NULL;
    if ((tin[0] && !p) || (tin[1] && !q)) return NULL;
    return !p ? q : !q ? p : add_terms(p, q);
}

/* ------------------------------------------------------------------ forward */
/* The dtypes nb_matmul runs in: f32/f64 alike, bf16 x bf16 -> bf16, or under
 * autocast f32 (or one bf16) operands -> f32 by the bf16 kernel (*bf16 set).
 * Returns the result's dtype, or -1 with a message. */
static int result_dtype(const nb_tensor *a, const nb_tensor *b, bool *bf16) {
    nb_dtype da = a->dtype, db = b->dtype;
    *bf16 = false;
    bool autocast = nb_autocast_dtype() == NB_BF16;
    if (autocast && (da == NB_F32 || da == NB_BF16) && (db == NB_F32 || db == NB_BF16) &&
        !(da == NB_BF16 && db == NB_BF16)) {
        *bf16 = true;
        return NB_F32;
    }
    if (da == NB_BF16 && db == NB_BF16) {
        *bf16 = true;
        return NB_BF16;
    }
    if ((da == NB_BF16) != (db == NB_BF16)) { /* the kernel exists; the pair has none */
        nb_dtype other = da == NB_BF16 ? db : da;
        if (other == NB_F32)
            return nbi_error("%s: operands are %s and %s: a bf16 operand pairs with another bf16 "
                             "one, or with f32 inside an autocast region (nb_autocast_begin("
                             "NB_BF16)); or convert one with nb_to", FN, nb_dtype_name(da),
                             nb_dtype_name(db)), -1;
        return nbi_error("%s: operands are %s and %s: a bf16 operand pairs with bf16 (or with f32 "
                         "inside an autocast region), never with %s; convert one with nb_to", FN,
                         nb_dtype_name(da), nb_dtype_name(db), nb_dtype_name(other)), -1;
    }
    if (!nbi_check_float(FN, a) || !nbi_check_float(FN, b)) return -1;
    if (!nbi_check_same_dtype(FN, a, b)) return -1;
    return da;
}

/* c (f32 or bf16) = a b by the kernels; a bf16 result is summed in an f32
 * buffer and rounded once. */
static int compute(const mm_geom *g, const nb_tensor *a, const nb_tensor *b, nb_tensor *c,
                   bool bf16) {
    if (c->dtype != NB_BF16) return matmul_batched(g, a, b, c, bf16);
    nb_tensor *acc = nbi_new(FN, NB_F32, c->ndim, c->shape, false);
    if (!acc) return -1;
    int rc = matmul_batched(g, a, b, acc, true);
    if (!rc) nbi_copy_strided(c, acc->strides, acc);
    nb_free(acc);
    return rc;
}

nb_tensor *nb_matmul(nb_tensor *a, nb_tensor *b) {
    if (!nbi_arg(FN, a, 0) || !nbi_arg(FN, b, 1)) return NULL;
    bool bf16;
    int dt = result_dtype(a, b, &bf16);
    if (dt < 0) return NULL;
    if (a->ndim == 0 || b->ndim == 0)
        return nbi_error("%s: both arguments must be at least 1-d, got shapes %s and %s", FN,
                         NBI_SHAPE(a), NBI_SHAPE(b));
    bool a1 = a->ndim == 1, b1 = b->ndim == 1;
    mm_geom g = {0};
    int na = a->ndim, nb = b->ndim;
    g.M = a1 ? 1 : a->shape[na - 2];
    g.sam = a1 ? 0 : a->strides[na - 2];
    g.K = a->shape[na - 1];
    g.sak = a->strides[na - 1];
    int64_t kb = b->shape[b1 ? 0 : nb - 2];
    g.sbk = b->strides[b1 ? 0 : nb - 2];
    g.N = b1 ? 1 : b->shape[nb - 1];
    g.sbn = b1 ? 0 : b->strides[nb - 1];
    if (g.K != kb)
        return nbi_error("%s: shapes %s and %s cannot be multiplied (%lld != %lld)", FN,
                         NBI_SHAPE(a), NBI_SHAPE(b), (long long)g.K, (long long)kb);
    int nba = a1 ? 0 : na - 2, nbb = b1 ? 0 : nb - 2;
    if (!nbi_broadcast_shape(NULL, nba, a->shape, nbb, b->shape, &g.nbatch, g.batch))
        return nbi_error("%s: batch dims of shapes %s and %s cannot be broadcast", FN,
                         NBI_SHAPE(a), NBI_SHAPE(b));
    batch_strides(a, nba, &g, g.abst);
    batch_strides(b, nbb, &g, g.bbst);

    int64_t shape[NB_MAX_DIMS];
    int nd = g.nbatch;
    for (int i = 0; i < g.nbatch; i++) shape[i] = g.batch[i];
    if (!a1) shape[nd++] = g.M;
    if (!b1) shape[nd++] = g.N;
    nb_tensor *c = nbi_new(FN, (nb_dtype)dt, nd, shape, false);
    if (!c) return NULL;
    /* writes every element (zeros when K == 0) */
    if (compute(&g, a, b, c, bf16)) return nbi_discard(c);

    nb_tensor *in[2] = {a, b};
    if (nbi_needs_grad(2, in)) {
        nbi_node *node = nbi_record(c, FN, matmul_backward, 2, in);
        if (!node) return nbi_discard(c);
        nbi_save(node, NBI_SAVE_IN(0) | NBI_SAVE_IN(1));
        node->jvp = matmul_jvp;
    }
    return c;
}
