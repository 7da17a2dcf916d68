/* test_registry.c: what every op of ops/registry.h must have, checked from
 * the registry itself, so a new op cannot skip it:
 *   - a NULL or freed input at any position is refused, naming op and position;
 *   - its flags tell the truth (an op marked differentiable records a node
 *     on inputs that require grad; an unmarked one does not);
 *   - nb_gradcheck in f64 on contiguous, transposed and broadcast inputs
 *     (indices and masks non-contiguous too; nb_gradcheck itself hands the
 *     rule transposed and stride-0 upstream gradients), and, for ops flagged
 *     so, nb_gradgradcheck (NB_OP_GRAD2) and forward mode (NB_OP_JVP) on the
 *     same layouts; every differentiable op must carry both flags;
 *   - bitwise identical outputs, gradients, second-order gradients and
 *     tangents for 1, 2 and 3 threads, with
 *     dim 0 of the inputs grown to reach the parallel paths, on contiguous,
 *     transposed and broadcast inputs;
 *   - its inputs and its output freed before backward give gradients bitwise
 *     equal to the run that keeps them (a save declaration missing from the
 *     op fails here: the rule's nbi_saved_in names it, or its data is gone);
 *   - the op tables of README.md and docs/ops.md are the registry's.
 * PyTorch fixtures for every op are required by test_edges.c, the fuzzer's
 * entries by the replay of make test (fuzz/replay.c). */
#include "test_util.h"

#include "ops/registry.h"

#include <stdlib.h>

/* the generator dropout's registry call draws from: the same mask each call */
static _Thread_local nb_rng op_rng_state;
static nb_rng *op_rng(void) {
    nb_rng_seed(&op_rng_state, 20261125);
    return &op_rng_state;
}

#define CALL_FN(name, inputs, flags, call) \
    static nb_tensor *call_##name(nb_tensor **x) { return call; }
NB_OPS(CALL_FN)

typedef struct {
    const char *name, *family, *inputs, *call_text;
    unsigned flags;
    nb_tensor *(*call)(nb_tensor **x);
} reg_op;

#define REG_ROW(name, inputs, flags, call) \
    {#name, REG_FAMILY, inputs, #call, flags, call_##name},
static const reg_op OPS[] = {
#define REG_FAMILY "elementwise"
    NB_OPS_ELEMENTWISE(REG_ROW)
#undef REG_FAMILY
#define REG_FAMILY "binary"
    NB_OPS_BINARY(REG_ROW)
#undef REG_FAMILY
#define REG_FAMILY "compare"
    NB_OPS_COMPARE(REG_ROW)
#undef REG_FAMILY
#define REG_FAMILY "reduce"
    NB_OPS_REDUCE(REG_ROW)
#undef REG_FAMILY
#define REG_FAMILY "matmul"
    NB_OPS_MATMUL(REG_ROW)
#undef REG_FAMILY
#define REG_FAMILY "softmax"
    NB_OPS_SOFTMAX(REG_ROW)
#undef REG_FAMILY
#define REG_FAMILY "masked_fill"
    NB_OPS_MASKED_FILL(REG_ROW)
#undef REG_FAMILY
#define REG_FAMILY "dropout"
    NB_OPS_DROPOUT(REG_ROW)
#undef REG_FAMILY
#define REG_FAMILY "view"
    NB_OPS_VIEW(REG_ROW)
#undef REG_FAMILY
#define REG_FAMILY "shape"
    NB_OPS_SHAPE(REG_ROW)
#undef REG_FAMILY
#define REG_FAMILY "index"
    NB_OPS_INDEX(REG_ROW)
#undef REG_FAMILY
#define REG_FAMILY "sort"
    NB_OPS_SORT(REG_ROW)
#undef REG_FAMILY
#define REG_FAMILY "sample"
    NB_OPS_SAMPLE(REG_ROW)
#undef REG_FAMILY
#define REG_FAMILY "batch_norm"
    NB_OPS_BATCH_NORM(REG_ROW)
#undef REG_FAMILY
#define REG_FAMILY "loss"
    NB_OPS_LOSS(REG_ROW)
#undef REG_FAMILY
#define REG_FAMILY "pool"
    NB_OPS_POOL(REG_ROW)
#undef REG_FAMILY
#define REG_FAMILY "conv"
    NB_OPS_CONV(REG_ROW)
#undef REG_FAMILY
};
#define NOPS (int)(sizeof OPS / sizeof OPS[0])

/* The registry's count, independent of the table above: a family list left
 * out of OPS fails registry_table_covers_every_op. */
#define COUNT_ONE(name, inputs, flags, call) +1
static const int REGISTRY_COUNT = 0 NB_OPS(COUNT_ONE);

/* ------------------------------------------------------------------ inputs */
#define MAX_IN 3

typedef struct {
    int n;
    char kind[MAX_IN];
    bool opt[MAX_IN];  /* "?N": NULL accepted there */
    bool fixed[MAX_IN]; /* "=": dim 0 does not grow */
    int argno[MAX_IN]; /* the number the op's messages give it (N, else its position) */
    int ndim[MAX_IN];
    int64_t shape[MAX_IN][NB_MAX_DIMS];
} spec;

/* "f p:2x3 i:5" -> kinds and shapes (default 3x4) */
static spec parse_spec(const reg_op *op) {
    spec s = {0};
    const char *p = op->inputs;
    while (*p) {
        while (*p == ' ') p++;
        if (!*p) break;
        ck_assert_msg(s.n < MAX_IN, "%s: more than %d inputs", op->name, MAX_IN);
        int k = s.n++;
        s.kind[k] = *p++;
        ck_assert_msg(strchr("fpabi", s.kind[k]) != NULL, "%s: input kind '%c'", op->name,
                      s.kind[k]);
        if (*p == ':') {
            p++;
            while (*p && *p != ' ' && *p != '?' && *p != '=') {
                ck_assert(s.ndim[k] < NB_MAX_DIMS);
                s.shape[k][s.ndim[k]++] = strtoll(p, (char **)&p, 10);
                if (*p == 'x') p++;
            }
        } else {
            s.ndim[k] = 2;
            s.shape[k][0] = 3;
            s.shape[k][1] = 4;
        }
        s.argno[k] = k;
        if (*p == '=') {
            s.fixed[k] = true;
            p++;
        }
        if (*p == '?') {
            s.opt[k] = true;
            s.argno[k] = (int)strtol(p + 1, (char **)&p, 10);
        }
    }
    return s;
}

static bool is_float_kind(char k) { return k == 'f' || k == 'p' || k == 'a'; }

/* Row-major values of one input: normal draws mapped to its kind's domain. */
static nb_tensor *values_for(char kind, nb_dtype dt, int ndim, const int64_t *shape,
                             uint64_t seed) {
    nb_rng r;
    nb_rng_seed(&r, seed);
    nb_tensor *z = nb_randn(NB_F64, ndim, shape, &r);
    ck_assert_msg(z != NULL, "%s", nb_last_error());
    double *v = nb_data(z);
    int64_t n = nb_numel(z);
    for (int64_t i = 0; i < n; i++) {
        double a = fabs(v[i]);
        switch (kind) {
        case 'p': v[i] = a + 0.5; break;
        case 'a': v[i] = v[i] < 0 ? -(a + 0.5) : a + 0.5; break;
        case 'b': v[i] = v[i] > 0; break;
        case 'i': v[i] = (double)((int64_t)(a * 1000) % 3); break;
        default: break;
        }
    }
    nb_dtype want = kind == 'b' ? NB_BOOL : kind == 'i' ? NB_I64 : dt;
    return nb_to(z, want);
}

enum { LAYOUT_CONTIG, LAYOUT_TRANSPOSED };

/* One input with the given logical values, laid out contiguously or with its
 * last two dims swapped in memory (not contiguous, same values). */
static nb_tensor *laid_out(nb_tensor *vals, int layout) {
    int nd = nb_ndim(vals);
    if (layout == LAYOUT_CONTIG || nd < 1) return nb_contiguous(vals);
    if (nd == 1) { /* every other element of an (n, 2) buffer: stride 2 */
        nb_tensor *base = nb_empty(nb_dtype_of(vals), NB_SHAPE(nb_shape(vals)[0], 2));
        nb_tensor *v = nb_select(base, 1, 0);
        ck_assert_int_eq(nb_copy_into(v, vals), 0);
        return v;
    }
    int64_t sw[NB_MAX_DIMS];
    memcpy(sw, nb_shape(vals), sizeof(int64_t) * (size_t)nd);
    sw[nd - 2] = nb_shape(vals)[nd - 1];
    sw[nd - 1] = nb_shape(vals)[nd - 2];
    nb_tensor *base = nb_empty(nb_dtype_of(vals), nd, sw);
    nb_tensor *v = nb_transpose(base, -1, -2);
    ck_assert_int_eq(nb_copy_into(v, vals), 0);
    return v;
}

/* The inputs of op, dim 0 of each multiplied by grow, in dtype dt. */
static void make_inputs(const reg_op *op, const spec *s, nb_dtype dt, int64_t grow, int layout,
                        uint64_t seed, nb_tensor **x) {
    for (int k = 0; k < s->n; k++) {
        int64_t sh[NB_MAX_DIMS];
        memcpy(sh, s->shape[k], sizeof sh);
        if (!s->fixed[k]) sh[0] *= grow;
        nb_tensor *v = values_for(s->kind[k], dt, s->ndim[k], sh, seed + (uint64_t)k);
        x[k] = laid_out(v, layout); /* indices and masks too: kernels read them strided */
        ck_assert_msg(x[k] != NULL, "%s input %d: %s", op->name, k, nb_last_error());
    }
}

/* ----------------------------------------------------------- honest flags */
START_TEST(registry_table_covers_every_op) {
    ck_assert_int_eq(NOPS, REGISTRY_COUNT);
    for (int i = 0; i < NOPS; i++)
        for (int j = 0; j < i; j++)
            ck_assert_msg(strcmp(OPS[i].name, OPS[j].name) != 0, "%s registered twice",
                          OPS[i].name);
}
END_TEST

/* An op flagged differentiable records a node (its output requires grad
 * when a floating input does); an unflagged one records none. */
static void registry_flags_match_behaviour(const reg_op *op) {
    spec s = parse_spec(op);
    nb_scope_begin();
    nb_tensor *x[MAX_IN];
    make_inputs(op, &s, NB_F64, 1, LAYOUT_CONTIG, 7, x);
    for (int k = 0; k < s.n; k++)
        if (is_float_kind(s.kind[k])) nb_set_requires_grad(x[k], true);
    nb_tensor *y = op->call(x);
    ck_assert_msg(y != NULL, "%s: %s", op->name, nb_last_error());
    bool diff = (op->flags & NB_OP_DIFF) != 0;
    ck_assert_msg(nb_requires_grad(y) == diff, "%s: flagged %sdifferentiable, but its output %s",
                  op->name, diff ? "" : "not ",
                  nb_requires_grad(y) ? "requires grad" : "does not require grad");
    nb_scope_end();
}

/* Every input position refuses NULL with a message naming the op and it;
 * an optional one ("?N") takes NULL and gives a result. */
static void registry_null_inputs_named(const reg_op *op) {
    spec s = parse_spec(op);
    nb_scope_begin();
    nb_tensor *x[MAX_IN];
    make_inputs(op, &s, NB_F64, 1, LAYOUT_CONTIG, 5, x);
    for (int k = 0; k < s.n; k++) {
        nb_tensor *keep = x[k];
        x[k] = NULL;
        char want[64];
        snprintf(want, sizeof want, "nb_%s: input %d is NULL", op->name, s.argno[k]);
        nb_clear_error();
        if (s.opt[k]) {
            nb_tensor *y = op->call(x);
            ck_assert_msg(y != NULL, "nb_%s with optional input %d NULL: %s", op->name,
                          s.argno[k], nb_last_error());
        } else {
            expect_error(op->call(x), want);
        }
        x[k] = keep;
    }
    nb_scope_end();
}

/* Every input position refuses a freed handle, freed by nb_free or by its
 * scope's end, with a message naming the op, the position and how. */
static void registry_freed_inputs_named(const reg_op *op) {
    spec s = parse_spec(op);
    for (int how = 0; how < 2; how++)
        for (int k = 0; k < s.n; k++) {
            nb_scope_begin();
            nb_tensor *x[MAX_IN];
            if (how) nb_scope_begin();
            make_inputs(op, &s, NB_F64, 1, LAYOUT_CONTIG, 5, x);
            nb_tensor *dead = x[k];
            if (how) {
                nb_scope_end();
                make_inputs(op, &s, NB_F64, 1, LAYOUT_CONTIG, 5, x);
                x[k] = dead;
            } else {
                nb_free(dead);
            }
            char want[96];
            snprintf(want, sizeof want, "nb_%s: input %d was freed (by %s", op->name, s.argno[k],
                     how ? "nb_scope_end" : "nb_free");
            nb_clear_error();
            expect_error(op->call(x), want);
            nb_scope_end();
        }
}

/* ---------------------------------------------------------------- gradcheck */
typedef struct {
    const reg_op *op;
    spec s;
    nb_tensor *fixed[MAX_IN]; /* bool and index inputs, not perturbed */
    int nfloat;
    bool broadcast;           /* the leaves are (1, ...) and expanded here */
} gc_ctx;

static nb_tensor *gc_fn(nb_tensor **leaves, int n, void *vctx) {
    gc_ctx *c = vctx;
    (void)n;
    nb_tensor *x[MAX_IN];
    for (int k = 0, f = 0; k < c->s.n; k++) {
        if (!is_float_kind(c->s.kind[k])) {
            x[k] = c->fixed[k];
            continue;
        }
        x[k] = c->broadcast ? nb_expand(leaves[f], c->s.ndim[k], c->s.shape[k]) : leaves[f];
        f++;
    }
    return c->op->call(x);
}

static const char *const LAYOUT_NAMES[] = {"contiguous", "transposed", "broadcast"};

enum { CHECK_FIRST, CHECK_SECOND, CHECK_FORWARD };

static void gradcheck_layout(const reg_op *op, int mode, int kind) {
    gc_ctx c = {.op = op, .s = parse_spec(op), .broadcast = mode == 2};
    nb_tensor *x[MAX_IN], *leaves[MAX_IN];
    make_inputs(op, &c.s, NB_F64, 1, mode == 1 ? LAYOUT_TRANSPOSED : LAYOUT_CONTIG, 11, x);
    for (int k = 0; k < c.s.n; k++) {
        if (!is_float_kind(c.s.kind[k])) {
            c.fixed[k] = x[k];
            continue;
        }
        nb_tensor *leaf = x[k];
        if (c.broadcast) { /* one row, read through stride 0 by the op */
            leaf = nb_contiguous(nb_narrow(x[k], 0, 0, 1));
        }
        leaves[c.nfloat++] = nb_set_requires_grad(leaf, true);
    }
    char label[96];
    snprintf(label, sizeof label, "nb_%s (%s inputs)", op->name, LAYOUT_NAMES[mode]);
    if (kind == CHECK_FIRST) expect_gradcheck(label, gc_fn, &c, c.nfloat, leaves);
    else if (kind == CHECK_SECOND) expect_gradgradcheck(label, gc_fn, &c, c.nfloat, leaves);
    else expect_forward_ad(label, gc_fn, &c, c.nfloat, leaves);
}

/* First order; second order (nb_gradgradcheck) for NB_OP_GRAD2; forward
 * mode for NB_OP_JVP: each on contiguous, transposed and broadcast inputs
 * (nb_gradcheck itself also hands the rules transposed and stride-0
 * upstream gradients). */
static void registry_gradcheck(const reg_op *op) {
    if (!(op->flags & NB_OP_DIFF)) return;
    for (int kind = CHECK_FIRST; kind <= CHECK_FORWARD; kind++) {
        if (kind == CHECK_SECOND && !(op->flags & NB_OP_GRAD2)) continue;
        if (kind == CHECK_FORWARD && !(op->flags & NB_OP_JVP)) continue;
        for (int mode = 0; mode < 3; mode++) {
            nb_scope_begin();
            gradcheck_layout(op, mode, kind);
            nb_scope_end();
        }
    }
}

/* Every differentiable op is twice differentiable and has a tangent rule. */
START_TEST(registry_every_diff_op_has_higher_order) {
    char missing[2048] = "";
    for (int i = 0; i < NOPS; i++) {
        unsigned f = OPS[i].flags;
        if (!(f & NB_OP_DIFF) || ((f & NB_OP_GRAD2) && (f & NB_OP_JVP))) continue;
        size_t k = strlen(missing);
        snprintf(missing + k, sizeof missing - k, " %s(%s%s)", OPS[i].name,
                 f & NB_OP_GRAD2 ? "" : "no NB_OP_GRAD2 ", f & NB_OP_JVP ? "" : "no NB_OP_JVP");
    }
    ck_assert_msg(!missing[0], "differentiable ops without a double backward or a tangent rule:%s",
                  missing);
}
END_TEST

/* ------------------------------------------------------------ thread counts */
/* The bytes of a tensor, row-major. */
static unsigned char *bytes_of(nb_tensor *t, size_t *n) {
    nb_tensor *c = nb_contiguous(t);
    ck_assert_msg(c != NULL, "%s", nb_last_error());
    size_t es = nb_dtype_of(c) == NB_BOOL ? sizeof(bool)
                : nb_dtype_of(c) == NB_F32 ? sizeof(float) : 8;
    *n = (size_t)nb_numel(c) * es;
    unsigned char *b = malloc(*n ? *n : 1);
    ck_assert(b != NULL);
    if (*n) memcpy(b, nb_data(c), *n);
    return b;
}

#define MAX_SNAP (2 + 3 * MAX_IN) /* output, gradients, second-order gradients, tangent */
typedef struct {
    int n;
    size_t len[MAX_SNAP];
    unsigned char *b[MAX_SNAP];
} snap;

/* The output and every floating input's gradient of sum(y * w). */
/* d/d(leaves) of sum(w * d(sum(y w))/d(leaves) . u): the double backward's bits */
static void snap_second_order(const reg_op *op, const spec *s, nb_tensor **x, nb_tensor **leaf,
                              nb_tensor *w, snap *r) {
    nb_tensor *lv[MAX_IN], *g[MAX_IN], *h[MAX_IN];
    int n = 0;
    for (int k = 0; k < s->n; k++)
        if (is_float_kind(s->kind[k])) lv[n++] = leaf[k];
    nb_tensor *y = nb_sum_all(nb_mul(op->call(x), w));
    ck_assert_msg(nb_autograd_grad(&y, 1, NULL, lv, n, &(nb_backward_opts){.create_graph = true},
                                   g) == 0, "nb_%s: create_graph: %s", op->name, nb_last_error());
    nb_tensor *z = NULL;
    for (int k = 0; k < n; k++) {
        if (!g[k]) continue;
        nb_tensor *u = values_for('f', nb_dtype_of(g[k]), nb_ndim(g[k]), nb_shape(g[k]), 50 + k);
        nb_tensor *t = nb_sum_all(nb_mul(g[k], u));
        z = z ? nb_add(z, t) : t;
    }
    if (!z || !nb_requires_grad(z)) return; /* linear in its inputs: no second derivative */
    ck_assert_msg(nb_autograd_grad(&z, 1, NULL, lv, n, NULL, h) == 0, "nb_%s: double backward: %s",
                  op->name, nb_last_error());
    for (int k = 0; k < n; k++)
        if (h[k]) r->b[r->n] = bytes_of(h[k], &r->len[r->n]), r->n++;
}

static nb_tensor *call_op(nb_tensor **x, int n, void *op) {
    (void)n;
    return ((const reg_op *)op)->call(x);
}

/* the tangent nb_jvp pushes through the op */
static void snap_tangent(const reg_op *op, const spec *s, nb_tensor **x, snap *r) {
    nb_tensor *t[MAX_IN] = {0}, *y, *ty;
    for (int k = 0; k < s->n; k++)
        if (is_float_kind(s->kind[k]))
            t[k] = values_for('f', nb_dtype_of(x[k]), nb_ndim(x[k]), nb_shape(x[k]), 70 + k);
    ck_assert_msg(nb_jvp(call_op, (void *)op, s->n, x, t, &y, &ty) == 0, "nb_%s: nb_jvp: %s",
                  op->name, nb_last_error());
    r->b[r->n] = bytes_of(ty, &r->len[r->n]);
    r->n++;
}

static snap run_grown(const reg_op *op, nb_dtype dt, int64_t grow, int mode) {
    spec s = parse_spec(op);
    snap r = {0};
    nb_scope_begin();
    nb_tensor *x[MAX_IN], *leaf[MAX_IN];
    make_inputs(op, &s, dt, grow, mode == 1 ? LAYOUT_TRANSPOSED : LAYOUT_CONTIG, 23, x);
    bool diff = op->flags & NB_OP_DIFF;
    for (int k = 0; k < s.n; k++) {
        leaf[k] = x[k];
        if (!is_float_kind(s.kind[k])) continue;
        if (mode == 2) leaf[k] = nb_contiguous(nb_narrow(x[k], 0, 0, 1)); /* one row */
        if (diff) nb_set_requires_grad(leaf[k], true);
        if (mode == 2) x[k] = nb_expand(leaf[k], nb_ndim(x[k]), nb_shape(x[k])); /* stride 0 */
    }
    nb_tensor *y = op->call(x);
    ck_assert_msg(y != NULL, "%s: %s", op->name, nb_last_error());
    r.b[r.n] = bytes_of(y, &r.len[r.n]);
    r.n++;
    if (diff) {
        nb_tensor *w = values_for('f', nb_dtype_of(y), nb_ndim(y), nb_shape(y), 99);
        /* retained: the second-order snap goes through the same x (an
         * expanded leaf in the broadcast layout) */
        nb_backward_opts keep = {.retain_graph = true};
        ck_assert_msg(nb_backward_with_opts(nb_sum_all(nb_mul(y, w)), NULL, &keep) == 0,
                      "nb_%s: backward: %s", op->name, nb_last_error());
        for (int k = 0; k < s.n; k++) {
            if (!is_float_kind(s.kind[k])) continue;
            r.b[r.n] = bytes_of(nb_grad(leaf[k]), &r.len[r.n]);
            r.n++;
        }
        if (op->flags & NB_OP_GRAD2) snap_second_order(op, &s, x, leaf, w, &r);
        if (op->flags & NB_OP_JVP) snap_tangent(op, &s, x, &r);
    }
    nb_scope_end();
    return r;
}

static void snap_free(snap *s) {
    for (int i = 0; i < s->n; i++) free(s->b[i]);
}

/* Dim 0 grows 8191 times: 3x4 inputs become 98,292 elements, past the
 * parallel threshold of every kernel (32,768 for the cheapest), in ranges
 * that end mid-vector. Inputs contiguous, transposed, and broadcast (one
 * row expanded: its gradient sums 24,573 rows). Under valgrind (which runs
 * one thread at a time anyway) only f64, contiguous, 1 and 2 threads: the
 * memory checks see the same parallel paths. */
static bool under_valgrind(void) {
    const char *pre = getenv("LD_PRELOAD");
    return pre && strstr(pre, "vgpreload");
}

static void registry_thread_identity(const reg_op *op) {
    int before = nb_num_threads();
    bool quick = under_valgrind();
    /* under a sanitizer, 1 against 3 threads only: the same parallel paths */
    int first = UNDER_ASAN || UNDER_TSAN ? 3 : 2;
    for (int mode = 0; mode < (quick ? 1 : 3); mode++)
        for (int d = 0; d < (quick ? 1 : 2); d++) {
            nb_dtype dt = d ? NB_F32 : NB_F64;
            nb_set_num_threads(1);
            snap one = run_grown(op, dt, 8191, mode);
            for (int t = quick ? 2 : first; t <= (quick ? 2 : 3); t++) {
                nb_set_num_threads(t);
                snap other = run_grown(op, dt, 8191, mode);
                nb_set_num_threads(before);
                ck_assert_int_eq(other.n, one.n);
                for (int i = 0; i < one.n; i++)
                    ck_assert_msg(other.len[i] == one.len[i] &&
                                      memcmp(other.b[i], one.b[i], one.len[i]) == 0,
                                  "nb_%s (%s, %s inputs): %s differs between 1 and %d threads",
                                  op->name, nb_dtype_name(dt), LAYOUT_NAMES[mode],
                                  i == 0 ? "the output" : "a gradient or tangent", t);
                snap_free(&other);
            }
            snap_free(&one);
        }
    nb_set_num_threads(before);
}

/* ---------------------------------------------------- freed before backward */
/* Leaves' gradients of sum(op(x)), where x are intermediates (leaf + 0). With
 * free_all, x and the output are nb_free'd before backward: the op must have
 * declared what its rule reads. */
static snap run_freed(const reg_op *op, bool free_all) {
    spec s = parse_spec(op);
    snap r = {0};
    nb_scope_begin();
    nb_tensor *leaf[MAX_IN] = {0}, *x[MAX_IN];
    make_inputs(op, &s, NB_F64, 1, LAYOUT_CONTIG, 31, leaf);
    for (int k = 0; k < s.n; k++) {
        x[k] = leaf[k]; /* bool and index inputs: fresh tensors, freed as they are */
        if (!is_float_kind(s.kind[k])) continue;
        nb_set_requires_grad(leaf[k], true);
        x[k] = nb_add_scalar(leaf[k], 0.0);
    }
    nb_tensor *y = op->call(x);
    ck_assert_msg(y != NULL, "%s: %s", op->name, nb_last_error());
    nb_tensor *loss = nb_sum_all(y); /* reads nothing of y */
    if (free_all) {
        nb_free(y);
        for (int k = 0; k < s.n; k++) nb_free(x[k]);
    }
    int rc = nb_backward(loss);
    ck_assert_msg(rc == 0, "nb_%s with its inputs%s freed before backward: %s", op->name,
                  free_all ? " and output" : "", nb_last_error());
    for (int k = 0; k < s.n; k++) {
        if (!is_float_kind(s.kind[k])) continue;
        r.b[r.n] = bytes_of(nb_grad(leaf[k]), &r.len[r.n]);
        r.n++;
    }
    nb_scope_end();
    return r;
}

static void registry_inputs_freed_before_backward(const reg_op *op) {
    if (!(op->flags & NB_OP_DIFF)) return;
    snap keep = run_freed(op, false), freed = run_freed(op, true);
    ck_assert_int_eq(keep.n, freed.n);
    for (int i = 0; i < keep.n; i++)
        ck_assert_msg(keep.len[i] == freed.len[i] && memcmp(keep.b[i], freed.b[i], keep.len[i]) == 0,
                      "nb_%s: the gradient of input %d changes when the inputs and output are "
                      "freed before backward", op->name, i);
    snap_free(&keep);
    snap_free(&freed);
}

/* One test per op (a crash names the op by its loop index; every failure
 * message names op and property): one fork per op rather than per property
 * keeps make asan's run short (each forked test costs more as Check's parent
 * grows). */
/* ------------------------------------------------------------------- bf16 */
/* t's values as f64, compared element by element (shapes must match). */
static void expect_values_near(const char *what, const nb_tensor *got, const nb_tensor *want,
                               double atol, double rtol) {
    ck_assert_msg(nb_ndim(got) == nb_ndim(want), "%s: ndim %d, want %d", what, nb_ndim(got),
                  nb_ndim(want));
    ck_assert_int_eq(nb_numel(got), nb_numel(want));
    for (int d = 0; d < nb_ndim(got); d++) ck_assert_int_eq(nb_shape(got)[d], nb_shape(want)[d]);
    double *g = values(got), *w = values(want);
    for (int64_t i = 0; i < nb_numel(got); i++)
        ck_assert_msg(fabs(g[i] - w[i]) <= atol + rtol * fabs(w[i]) || (g[i] == w[i]),
                      "%s: element %lld is %.9g, want %.9g", what, (long long)i, g[i], w[i]);
    free(g);
    free(w);
}

/* An op flagged NB_OP_BF16 takes bf16 inputs and gives what it gives in f32
 * on the same (bf16-rounded) values, rounded to bf16: bit for bit for exact
 * ops, within a bf16 rounding for matmul (f32 accumulation in another
 * order); gradients flow back to bf16 inputs in bf16. Every other op refuses
 * bf16 with a message naming it. */
static void registry_bf16(const reg_op *op) {
    spec s = parse_spec(op);
    bool any_float = false;
    for (int k = 0; k < s.n; k++) any_float = any_float || is_float_kind(s.kind[k]);
    if (!any_float) return; /* nothing of it can be bf16 */
    nb_scope_begin();
    nb_tensor *x[MAX_IN], *h[MAX_IN], *r[MAX_IN];
    make_inputs(op, &s, NB_F32, 1, LAYOUT_CONTIG, 11, x);
    for (int k = 0; k < s.n; k++) {
        h[k] = is_float_kind(s.kind[k]) ? nb_to(x[k], NB_BF16) : x[k];
        r[k] = is_float_kind(s.kind[k]) ? nb_to(h[k], NB_F32) : x[k];
        if (is_float_kind(s.kind[k])) nb_set_requires_grad(h[k], true);
        if (is_float_kind(s.kind[k])) nb_set_requires_grad(r[k], true);
    }
    char want_name[64];
    snprintf(want_name, sizeof want_name, "nb_%s:", op->name);
    nb_tensor *got = op->call(h);
    if (!(op->flags & NB_OP_BF16)) {
        expect_error(got, want_name, "no bf16 kernel", "nb_to(t, NB_F32)");
        nb_scope_end();
        return;
    }
    ck_assert_msg(got != NULL, "%s on bf16: %s", op->name, nb_last_error());
    nb_tensor *ref = op->call(r);
    ck_assert_msg(ref != NULL, "%s on f32: %s", op->name, nb_last_error());
    bool exact = op->flags & NB_OP_EXACT;
    nb_dtype out_dt = nb_dtype_of(got);
    ck_assert_msg(out_dt == (nb_dtype_of(ref) == NB_F32 ? NB_BF16 : nb_dtype_of(ref)),
                  "%s: bf16 inputs gave %s", op->name, nb_dtype_name(out_dt));
    nb_tensor *want = nb_to(ref, out_dt);
    expect_values_near(op->name, got, want, exact ? 0 : 1e-2, exact ? 0 : 8e-3);
    /* backward: the same upstream gradient (bf16-representable) through both */
    nb_tensor *gr = nb_to(nb_to(nb_randn(NB_F32, nb_ndim(ref), nb_shape(ref), op_rng()), NB_BF16),
                          nb_dtype_of(ref));
    ck_assert_int_eq(nb_backward_with_grad(got, nb_to(gr, out_dt)), 0);
    ck_assert_int_eq(nb_backward_with_grad(ref, gr), 0);
    for (int k = 0; k < s.n; k++) {
        if (!is_float_kind(s.kind[k])) continue;
        nb_tensor *gh = nb_grad(h[k]), *gf = nb_grad(r[k]);
        ck_assert_msg(gh && gf, "%s: input %d got no gradient", op->name, k);
        ck_assert_int_eq(nb_dtype_of(gh), NB_BF16);
        expect_values_near(op->name, gh, nb_to(gf, NB_BF16), exact ? 0 : 2e-2, exact ? 0 : 1.6e-2);
    }
    nb_scope_end();
}

START_TEST(registry_op) {
    const reg_op *op = &OPS[_i];
    registry_flags_match_behaviour(op);
    registry_null_inputs_named(op);
    registry_freed_inputs_named(op);
    registry_gradcheck(op);
    registry_thread_identity(op);
    registry_inputs_freed_before_backward(op);
    registry_bf16(op);
}
END_TEST

/* ---------------------------------------------------------------- op tables */
#define OP_TABLE_BEGIN "<!-- op table: made from ops/registry.h by make op-table -->"
#define OP_TABLE_END "<!-- end of op table -->"

/* The table docs/ops.md and README.md show between the markers. */
static char *op_table(bool full) {
    size_t cap = 1 << 16, len = 0;
    char *s = malloc(cap); /* no ck_assert: make op-table calls this outside a test */
    if (!s) abort();
#define PUT(...) len += (size_t)snprintf(s + len, cap - len, __VA_ARGS__)
    PUT("%s\n", OP_TABLE_BEGIN);
    if (full) {
        PUT("| op | ops/ file | differentiable | vs PyTorch | bf16 | the call the tests make |\n");
        PUT("| --- | --- | --- | --- | --- | --- |\n");
        for (int i = 0; i < NOPS; i++)
            PUT("| `nb_%s` | %s.c | %s | %s | %s | `%s` |\n", OPS[i].name, OPS[i].family,
                !(OPS[i].flags & NB_OP_DIFF) ? "no"
                : (OPS[i].flags & NB_OP_GRAD2) && (OPS[i].flags & NB_OP_JVP)
                    ? "yes: twice, and forward mode"
                : OPS[i].flags & NB_OP_GRAD2 ? "yes: twice" : "yes",
                OPS[i].flags & NB_OP_EXACT ? "bit for bit" : "within tolerance",
                OPS[i].flags & NB_OP_BF16 ? "yes" : "refused", OPS[i].call_text);
    } else {
        PUT("| ops/ file | ops |\n| --- | --- |\n");
        for (int i = 0; i < NOPS; i++) {
            bool first = i == 0 || strcmp(OPS[i].family, OPS[i - 1].family) != 0;
            bool last = i == NOPS - 1 || strcmp(OPS[i].family, OPS[i + 1].family) != 0;
            if (first) PUT("| %s.c | `", OPS[i].family);
            PUT("nb_%s%s", OPS[i].name, last ? "` |\n" : " ");
        }
    }
    PUT("%s\n", OP_TABLE_END);
#undef PUT
    if (len >= cap) abort();
    return s;
}

void print_op_table(const char *which) { /* run_tests.c: NB_TEST_PRINT_OP_TABLE */
    char *t = op_table(strcmp(which, "full") == 0);
    fputs(t, stdout);
    free(t);
}

static void expect_table_in(const char *rel, bool full) {
    char path[512];
    snprintf(path, sizeof path, "%s/../../%s", NB_FIXTURE_DIR, rel);
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    static char buf[1 << 18];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *want = op_table(full);
    ck_assert_msg(strstr(buf, want) != NULL,
                  "%s: its op table is not the registry's; run make op-table", rel);
    free(want);
}

START_TEST(registry_tables_in_docs) {
    expect_table_in("docs/ops.md", true);
    expect_table_in("README.md", false);
}
END_TEST

Suite *suite_registry(void) {
    Suite *s = suite_create("registry");
    TCase *tc = tcase_create("registry");
    tcase_set_timeout(tc, 900); /* a hang guard: its slowest op takes 18 s on a busy machine */
    tcase_add_test(tc, registry_table_covers_every_op);
    tcase_add_test(tc, registry_every_diff_op_has_higher_order);
    tcase_add_loop_test(tc, registry_op, 0, NOPS);
    tcase_add_test(tc, registry_tables_in_docs);
    suite_add_tcase(s, tc);
    return s;
}
