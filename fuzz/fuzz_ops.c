/* fuzz_ops.c: libFuzzer target for the tensor ops, views and autograd.
 *
 * The input is a small program. Its first bytes pick the floating dtype (f32
 * or f64, and whether the first input and the others are bf16 instead) and
 * make 1-3 tensors (0-4 dims of size 0-5, values from the bytes, some
 * NB_BOOL, some requiring grad); each following byte picks an op: one of
 * ops/registry.h (every op of nabla, each with its decoder op_<name> here,
 * which the dispatch table made from the registry requires), or nb_detach /
 * nb_set_requires_grad / nb_autocast_begin and _end. Its operands and
 * arguments (dims, sizes, starts, index tensors, dropout's p and seed, nb_to's
 * dtype, bf16 among them) come from the next bytes, and its result joins the
 * pool of operands.
 *
 * Every call is judged by a slow reference written here on plain double
 * arrays (row-major values, explicit shapes, its own broadcast and index
 * arithmetic; nothing from the library but the public accessors that read a
 * tensor's shape, strides and data pointer):
 * - valid and invalid must agree: a call the reference finds invalid must
 *   return NULL with nb_last_error() starting with "<function>:", and a valid
 *   one must succeed;
 * - a result has the reference's dtype and shape, and its values (read
 *   through the result's own strides) match: bit-exact for ops that round
 *   once (views, copies, + - * /, relu, max, where, comparisons), else within
 *   a tolerance relative to the sum of |terms|: f64 1e-9, f32 1e-5, plus n
 *   rounding errors for sums of n terms kept in the result's precision
 *   (matmul, softmax);
 *   NaN and +-Inf must agree in position;
 * - bf16, as the registry's NB_OP_BF16 flag says (bf16_rule): a flagged op
 *   (views, copies, cat, stack, nb_to, nb_matmul) is checked like the others,
 *   its bf16 results bit for bit (the sign of 0, NaN as 0xffff; the
 *   reference rounds to nearest even by its own arithmetic, f64 through f32
 *   first), bf16 products within one bf16 rounding of the exact sum plus f32
 *   accumulation (and, under autocast, f32 results of bf16-rounded operands);
 *   any other op must refuse a bf16 operand, and a call valid but for bf16
 *   with a message that says "bf16"; nb_to from bf16 is exact bit for bit;
 *   nb_autocast_dtype follows the regions the program opens and closes;
 * - the operands' values are unchanged by the call;
 * - a floating result that requires grad backpropagates (nb_backward of its
 *   nb_sum_all; a bf16 one's nb_to to f32 first) without error, and every
 *   leaf's gradient has the leaf's shape and dtype (bf16 for a bf16 leaf);
 *   without bf16, so does a backward with create_graph, and a backward
 *   through the sum of those gradients (the double backward) succeeds;
 * - everything runs in one scope, after which nb_live_tensors() is back to
 *   its value before the input.
 * A violation prints the op and its operands' shapes and aborts. Calls that
 * passed are counted per opcode: fuzz/replay.c (make test) replays the seed
 * corpus and requires each registered op to have passed at least once.
 *
 * nb_dropout's mask is random: its reference checks each element is x * 0
 * (dropped, as PyTorch's x * mask) or x * (1/(1-p)) as the dtype computes it,
 * and that the same seed repeats it.
 *
 * Limits of the reference: results of more than MAX_NUMEL elements are not
 * computed (the call is skipped); f32 and bf16 matmul values are not
 * compared when an operand holds a finite |x| > 1e15 (f64: 1e150), where
 * float accumulation may overflow where the double reference does not; bf16
 * products allow for the AVX512_BF16 path's flushing of subnormal operands,
 * products and sums (documented in ops/gemm_bf16.c). Shapes stay small
 * (sizes up to 6), so int64 overflow of shapes is not explored here. */
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../nabla.h"
#include "../ops/conv_internal.h"   /* nbi_wino_*: which convs take Winograd's kernels */
#include "../ops/gemm_internal.h"   /* nbi_gemm_path: each matmul kernel path, as tests do */
#include "../tensor/cpu_internal.h" /* nbi_isa_force: each bf16 product path, as tests do */
#include "ops_program.h"

#define MAX_NUMEL 4096
#define POOL 10
#define MAX_OPS 24
#define MAX_BACKWARD 6
#define MAX_LEAVES 32

/* --------------------------------------------------------------- failures */
static char ctx[1024]; /* the op being checked, for the failure report */

static void fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "\nfuzz_ops: MISMATCH in %s\n  ", ctx);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n  nb_last_error(): %s\n", nb_last_error() ? nb_last_error() : "(none)");
    va_end(ap);
    abort();
}

/* ------------------------------------------------------------ input bytes */
typedef struct {
    const uint8_t *p;
    size_t n, i;
} reader;

static unsigned u8(reader *r) { return r->i < r->n ? r->p[r->i++] : 0; }
static bool more(const reader *r) { return r->i < r->n; }

/* Element values: mostly multiples of 1/8 in [-15.4, 15.5], and specials. */
static double val_of(unsigned b) {
    switch (b) {
    case 255: return NAN;
    case 254: return INFINITY;
    case 253: return -INFINITY;
    case 252: return -0.0;
    case 251: return 1e30;
    case 250: return -1e-30;
    case 249: return 88.75;  /* exp overflows f32 */
    case 248: return 710.0;  /* exp overflows f64 */
    case 247: return 3e38;
    case 246: return -1e300; /* -inf in f32 */
    case 245: return 1e-310; /* subnormal f64, 0 in f32 */
    default: return ((int)b - 123) / 8.0;
    }
}

/* ------------------------------------------------------------------ bf16 */
/* bf16 values are held in doubles like the others (exactly: 8 significant
 * bits). The reference rounds to bf16 by arithmetic, independently of the
 * library's bit trick: round to nearest even at the bf16 quantum of x's
 * binade (2^-133 below f32's normal range, as bf16 keeps f32's subnormals),
 * overflow (past (2 - 2^-7) 2^127, ties to even included) to inf, and every
 * NaN to the NaN whose bits are 0xffff. */
#define BF16_MAX 0x1.fep127

static double bf16_nan(void) {
    uint32_t u = 0xffff0000u;
    float f;
    memcpy(&f, &u, sizeof f);
    return f; /* a quiet NaN: widening keeps its payload */
}

static double bf16_round(double f) { /* f: an f32 value (or +-inf, NaN) */
    if (isnan(f)) return bf16_nan();
    if (isinf(f) || f == 0) return f;
    int e = ilogb(f);
    double q = ldexp(1.0, (e < -126 ? -126 : e) - 7);
    double v = nearbyint(f / q) * q; /* the default rounding mode: ties to even */
    return fabs(v) > BF16_MAX ? copysign(INFINITY, f) : v;
}

/* The bf16 bits of a double holding a bf16 value (NaN payloads survive the
 * round trip through float, as they are quiet). */
static uint16_t bf16_bits(double d) {
    float f = (float)d;
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (uint16_t)(u >> 16);
}

static double bf16_value(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ------------------------------------------------------- shapes, indexing */
typedef struct {
    int nd;
    int64_t s[NB_MAX_DIMS];
} shp;

static int64_t numel(const shp *a) {
    int64_t n = 1;
    for (int i = 0; i < a->nd; i++) n *= a->s[i]; /* sizes are small: no overflow */
    return n;
}

static bool same_shape(const shp *a, const shp *b) {
    if (a->nd != b->nd) return false;
    for (int i = 0; i < a->nd; i++)
        if (a->s[i] != b->s[i]) return false;
    return true;
}

static const char *shape_str(const shp *a) {
    static char buf[8][96];
    static int k;
    k = (k + 1) % 8;
    int n = snprintf(buf[k], sizeof buf[k], "(");
    for (int i = 0; i < a->nd; i++)
        n += snprintf(buf[k] + n, sizeof buf[k] - (size_t)n, "%s%lld", i ? "," : "",
                      (long long)a->s[i]);
    snprintf(buf[k] + n, sizeof buf[k] - (size_t)n, ")");
    return buf[k];
}

/* Advances a row-major multi-index; false after the last one. */
static bool next_index(int64_t *idx, const shp *a) {
    for (int d = a->nd - 1; d >= 0; d--) {
        if (++idx[d] < a->s[d]) return true;
        idx[d] = 0;
    }
    return false;
}

/* Row-major flat position in `in` of the element an index of `out` reads when
 * `in` is broadcast to `out` (dims aligned at the right; size-1 dims repeat). */
static int64_t bcast_flat(const shp *out, const int64_t *idx, const shp *in) {
    int64_t f = 0;
    int lead = out->nd - in->nd;
    for (int j = 0; j < in->nd; j++) f = f * in->s[j] + (in->s[j] == 1 ? 0 : idx[j + lead]);
    return f;
}

/* NumPy broadcasting of two shapes. */
static bool bcast(const shp *a, const shp *b, shp *out) {
    int n = a->nd > b->nd ? a->nd : b->nd;
    out->nd = n;
    for (int i = 0; i < n; i++) {
        int ia = i - (n - a->nd), ib = i - (n - b->nd);
        int64_t x = ia >= 0 ? a->s[ia] : 1, y = ib >= 0 ? b->s[ib] : 1;
        if (x != y && x != 1 && y != 1) return false;
        out->s[i] = x == 1 ? y : x;
    }
    return true;
}

/* A dim argument against ndim (0-d tensors accept 0 and -1): normalized, or -1. */
static int norm_dim(int dim, int nd) {
    int lo = nd ? -nd : -1, hi = nd ? nd - 1 : 0;
    if (dim < lo || dim > hi) return -1;
    return dim < 0 ? dim + (nd ? nd : 1) : dim;
}

/* ----------------------------------------------------- reading a tensor */
typedef struct {
    nb_dtype dt;
    shp sh;
    int64_t n;
    double *v; /* n values, row-major */
} vals;

static void vals_free(vals *a) {
    free(a->v);
    a->v = NULL;
}

/* Floating: can require grad; bf16 included (which ops take it is the
 * registry's NB_OP_BF16, see bf16_rule). */
static bool is_float(nb_dtype d) { return d == NB_F32 || d == NB_F64 || d == NB_BF16; }

/* t's values read through its shape, strides and data pointer. */
static vals read_tensor(nb_tensor *t) {
    vals a = {.dt = nb_dtype_of(t), .sh.nd = nb_ndim(t)};
    if (a.sh.nd < 0 || a.sh.nd > NB_MAX_DIMS) fail("tensor with ndim %d", a.sh.nd);
    const int64_t *shape = nb_shape(t), *st = nb_strides(t);
    for (int i = 0; i < a.sh.nd; i++) {
        if (shape[i] < 0) fail("negative size in %s", shape_str(&a.sh));
        a.sh.s[i] = shape[i];
    }
    a.n = numel(&a.sh);
    if (nb_numel(t) != a.n) fail("nb_numel %lld for shape %s", (long long)nb_numel(t), shape_str(&a.sh));
    a.v = malloc((size_t)(a.n ? a.n : 1) * sizeof *a.v);
    if (!a.v) abort();
    if (a.n == 0) return a;
    const char *base = nb_data(t);
    if (!base) fail("nb_data is NULL for a non-empty tensor");
    int64_t idx[NB_MAX_DIMS] = {0};
    int64_t i = 0;
    do {
        int64_t off = 0;
        for (int d = 0; d < a.sh.nd; d++) off += idx[d] * st[d];
        switch (a.dt) {
        case NB_F32: a.v[i] = ((const float *)base)[off]; break;
        case NB_F64: a.v[i] = ((const double *)base)[off]; break;
        case NB_I64: a.v[i] = (double)((const int64_t *)base)[off]; break;
        case NB_BF16: a.v[i] = bf16_value(((const uint16_t *)base)[off]); break;
        case NB_BOOL: {
            unsigned char c;
            memcpy(&c, base + off, 1);
            if (c > 1) fail("a bool element holds %u", c);
            a.v[i] = c;
            break;
        }
        default: fail("unknown dtype %d", (int)a.dt);
        }
        i++;
    } while (next_index(idx, &a.sh));
    return a;
}

/* Element offsets (in elements, relative to nb_data) of t in row-major order. */
static int64_t *offsets(nb_tensor *t, int64_t n) {
    int nd = nb_ndim(t);
    shp sh = {.nd = nd};
    memcpy(sh.s, nb_shape(t), (size_t)nd * sizeof(int64_t));
    const int64_t *st = nb_strides(t);
    int64_t *o = malloc((size_t)(n ? n : 1) * sizeof *o);
    if (!o) abort();
    if (n == 0) return o;
    int64_t idx[NB_MAX_DIMS] = {0}, i = 0;
    do {
        int64_t off = 0;
        for (int d = 0; d < nd; d++) off += idx[d] * st[d];
        o[i++] = off;
    } while (next_index(idx, &sh));
    return o;
}

/* ------------------------------------------------------- the expectation */
enum { EXACT, TOL, NOVALS };

typedef struct {
    const char *fn;
    bool ok;      /* the reference accepts the call */
    bool skip;    /* valid but too big to compute: not called */
    nb_dtype dt;  /* result dtype */
    shp sh;       /* result shape */
    double *v;    /* reference values, row-major */
    double *mag;  /* per element: sum of |terms| (NULL: |v|) */
    int rule;
    double rtol;
    bool bitwise;  /* EXACT down to the bits (NaN payloads, the sign of 0); bf16 always */
    bool bf16_msg; /* refused for bf16 alone: the message must say "bf16" */
    bool bf16_call; /* a bf16 operand or result, judged by the op's NB_OP_BF16 */
} expect;

static void expect_init(expect *e, const char *fn, nb_dtype dt) {
    memset(e, 0, sizeof *e);
    e->fn = fn;
    e->dt = dt;
    e->rule = EXACT;
}

static void expect_alloc(expect *e, bool mag) {
    int64_t n = numel(&e->sh);
    e->ok = true;
    if (n > MAX_NUMEL) {
        e->skip = true;
        return;
    }
    e->v = calloc((size_t)(n ? n : 1), sizeof *e->v);
    e->mag = mag ? calloc((size_t)(n ? n : 1), sizeof *e->mag) : NULL;
    if (!e->v || (mag && !e->mag)) abort();
}

static void expect_free(expect *e) {
    free(e->v);
    free(e->mag);
}

/* A double rounded to the result dtype (f32 rounds once, as the library's
 * float arithmetic of exactly rounded ops does; bf16 goes through f32 first,
 * as nb_to from f64 does, and is f32's rounding for an f32 value). */
static double round_to(double x, nb_dtype dt) {
    if (dt == NB_F32 || dt == NB_BF16) {
        double f;
        if (x > FLT_MAX * 2.0) f = INFINITY; /* explicit: no out-of-range conversion */
        else if (x < -FLT_MAX * 2.0) f = -INFINITY;
        else f = (double)(float)x;
        return dt == NB_BF16 ? bf16_round(f) : f;
    }
    return x;
}

/* Whether two doubles holding values of dt have the same bits in dt. */
static bool same_bits(double r, double l, nb_dtype dt) {
    if (dt == NB_BF16) return bf16_bits(r) == bf16_bits(l);
    if (dt == NB_F32) {
        float a = (float)r, b = (float)l;
        return !memcmp(&a, &b, sizeof a);
    }
    return !memcmp(&r, &l, sizeof r);
}

/* "library 0x.. vs reference 0x..", for a failure report */
static const char *bits_str(double l, double r, nb_dtype dt) {
    static char buf[80];
    uint64_t a = 0, b = 0;
    if (dt == NB_BF16) a = bf16_bits(l), b = bf16_bits(r);
    else if (dt == NB_F32) {
        float x = (float)l, y = (float)r;
        uint32_t u, v;
        memcpy(&u, &x, 4), memcpy(&v, &y, 4);
        a = u, b = v;
    } else memcpy(&a, &l, 8), memcpy(&b, &r, 8);
    snprintf(buf, sizeof buf, "0x%llx vs 0x%llx", (unsigned long long)a, (unsigned long long)b);
    return buf;
}

static void compare_values(const expect *e, const vals *got) {
    bool bf = e->dt == NB_BF16;
    double big = e->dt == NB_F64 ? 1e307 : 1e38;
    for (int64_t i = 0; i < got->n; i++) {
        /* bf16 products are judged against the exact sum, unrounded (the
         * tolerance below holds the result's one rounding) */
        double r = is_float(e->dt) && !(bf && e->rule == TOL) ? round_to(e->v[i], e->dt) : e->v[i];
        double l = got->v[i];
        bool ok;
        if ((bf || e->bitwise) && e->rule == EXACT) {
            ok = same_bits(r, l, e->dt);
        } else if (!is_float(e->dt) && isnan(r)) {
            ok = true; /* an unspecified integer (nb_to of NaN, Inf or out of range) */
        } else if (isnan(r) || isnan(l)) {
            ok = isnan(r) && isnan(l);
        } else if (isinf(r) || isinf(l)) {
            /* at the edge of overflow one side may round to the largest finite value */
            ok = r == l || (e->rule == TOL && (r > 0) == (l > 0) && fabs(isinf(r) ? l : r) >= big);
        } else if (e->rule == EXACT) {
            ok = r == l;
        } else {
            double m = e->mag ? e->mag[i] : fabs(r);
            double tol = e->rtol * m + (e->dt == NB_F64 ? 1e-300 : 1e-37);
            if (bf) tol += 0x1p-8 * (fabs(r) + tol); /* the f32 sum's rounding to bf16 */
            ok = !(fabs(l - r) > tol); /* a NaN or infinite tolerance accepts */
        }
        if (!ok) {
            int64_t idx[NB_MAX_DIMS] = {0}, k = i;
            for (int d = got->sh.nd - 1; d >= 0; d--) {
                idx[d] = got->sh.s[d] ? k % got->sh.s[d] : 0;
                k = got->sh.s[d] ? k / got->sh.s[d] : 0;
            }
            char where[128] = "";
            int n = 0;
            for (int d = 0; d < got->sh.nd; d++)
                n += snprintf(where + n, sizeof where - (size_t)n, "%s%lld", d ? "," : "",
                              (long long)idx[d]);
            if ((bf || e->bitwise) && e->rule == EXACT)
                fail("element %lld [%s] of %s: library %.17g, reference %.17g; %s bits %s",
                     (long long)i, where, shape_str(&got->sh), l, r, nb_dtype_name(e->dt),
                     bits_str(l, r, e->dt));
            fail("element %lld [%s] of %s: library %.17g, reference %.17g (mag %.3g)",
                 (long long)i, where, shape_str(&got->sh), l, r, e->mag ? e->mag[i] : fabs(r));
        }
    }
}

/* Relative tolerance (of the sum of |terms|) for n terms accumulated in the
 * result's own precision: 1e-5 (f32) or 1e-9 (f64), plus the worst-case
 * rounding of n additions (about n units of 2^-24 / 2^-53). */
static double acc_rtol(nb_dtype dt, int64_t n) {
    return dt == NB_F32 ? 1e-5 + (double)n * 1.2e-7 : 1e-9 + (double)n * 2.3e-16;
}

/* --------------------------------------------------------------- the pool */
typedef struct {
    nb_tensor *t[POOL];
    nb_tensor *leaves[MAX_LEAVES]; /* leaves that require grad */
    int n, nleaves, backwards;
    nb_dtype fdt;
    unsigned bf16_inputs;     /* head bits 5-6: bit 0 the first input is bf16, bit 1 the others */
    nb_dtype ac[MAX_OPS + 1]; /* the autocast regions this program opened, innermost last */
    int nac;
} pool;

/* Whether nb_matmul multiplies f32 operands in bf16 now (the model of
 * nb_autocast_begin's per-thread stack, which op_autocast checks). */
static bool autocast_bf16(const pool *p) { return p->nac && p->ac[p->nac - 1] == NB_BF16; }

static void pool_add(pool *p, nb_tensor *t, reader *r) {
    if (p->n < POOL) p->t[p->n++] = t;
    else p->t[u8(r) % POOL] = t;
}

static nb_tensor *pick(pool *p, reader *r) { return p->t[u8(r) % p->n]; }

/* n operands, read in order (the order of an initializer list's calls is unspecified) */
static void pick_n(pool *p, reader *r, nb_tensor **ops, int n) {
    for (int k = 0; k < n; k++) ops[k] = pick(p, r);
}

/* Per opcode: calls that were valid and passed every check, calls refused
 * (as the reference said), calls skipped as too big, and of the first two
 * those whose bf16 behaviour was checked (a bf16 operand or result: a flagged
 * op's result, or another op's refusal of a call valid but for bf16).
 * replay.c reads the first (fuzz_ops_succeeded), gen_seeds.c the last
 * (fuzz_ops_bf16); NABLA_FUZZ_STATS=1 prints all four at exit. */
enum { SUCCEEDED, REFUSED, SKIPPED, BF16, NSTATS };
static long stats[OP_COUNT][NSTATS];
static unsigned cur_op; /* the opcode being run */

static bool verbose;

static void count(int what) { stats[cur_op][what]++; }

long fuzz_ops_succeeded(unsigned op) { return op < OP_COUNT ? stats[op][SUCCEEDED] : 0; }
long fuzz_ops_bf16(unsigned op) { return op < OP_COUNT ? stats[op][BF16] : 0; }

static void print_stats(void) {
    fprintf(stderr,
            "fuzz_ops: calls per function (succeeded / refused / skipped / bf16 checked):\n");
    for (unsigned op = 0; op < OP_COUNT; op++)
        fprintf(stderr, "  %-22s %10ld %10ld %8ld %10ld\n", fuzz_ops_name(op),
                stats[op][SUCCEEDED], stats[op][REFUSED], stats[op][SKIPPED], stats[op][BF16]);
}

static bool op_takes_bf16(unsigned op); /* the registry's NB_OP_BF16 (program_ops below) */

/* bf16, for every op alike, from the registry: an op flagged NB_OP_BF16 is
 * judged by its own reference, which treats bf16 as a floating dtype like
 * f32 and f64 (validity, the result's dtype, values rounded to bf16); any
 * other op with a bf16 operand must refuse the call, and when the reference
 * finds the call valid but for bf16 (as if bf16 were f32), the message must
 * say "bf16". Called once the reference has decided, before the call. */
static void bf16_rule(expect *e, const vals *in, int nops) {
    bool any = e->ok && e->dt == NB_BF16;
    for (int k = 0; k < nops; k++) any |= in[k].dt == NB_BF16;
    if (!any) return;
    if (op_takes_bf16(cur_op)) {
        e->bf16_call = e->ok;
    } else if (e->ok) {
        e->ok = false;
        e->skip = false; /* a refusal is cheap at any size */
        e->bf16_msg = e->bf16_call = true;
    }
}

/* The gradients of s with create_graph (shapes as the leaves'), then the
 * gradient of their sum: every op on the way must be twice differentiable.
 * bf16 leaves are left out (bf16 gradients are not differentiated again). */
static void double_backward(pool *p, nb_tensor *s) {
    nb_tensor *lv[MAX_LEAVES], *g[MAX_LEAVES], *h[MAX_LEAVES];
    int n = 0;
    for (int i = 0; i < p->nleaves; i++)
        if (nb_dtype_of(p->leaves[i]) != NB_BF16) lv[n++] = p->leaves[i];
    for (int i = 0; i < p->nleaves; i++)
        if (nb_dtype_of(p->leaves[i]) == NB_BF16) return; /* a graph through bf16 ops */
    if (!n) return;
    nb_backward_opts create = {.create_graph = true};
    if (nb_autograd_grad(&s, 1, NULL, lv, n, &create, g) != 0)
        fail("backward with create_graph through the result failed");
    nb_tensor *z = NULL;
    for (int i = 0; i < n; i++) {
        if (!g[i]) continue;
        if (nb_ndim(g[i]) != nb_ndim(lv[i]) ||
            memcmp(nb_shape(g[i]), nb_shape(lv[i]), (size_t)nb_ndim(g[i]) * sizeof(int64_t)))
            fail("create_graph: the gradient of leaf %d has ndim %d, the leaf %d", i,
                 nb_ndim(g[i]), nb_ndim(lv[i]));
        if (!nb_requires_grad(g[i])) continue; /* constant in the leaves */
        nb_tensor *t = nb_sum_all(g[i]);
        z = z ? nb_add(z, t) : t;
    }
    nb_backward_opts keep = {.retain_graph = true}; /* later results share the graph */
    if (z && nb_autograd_grad(&z, 1, NULL, lv, n, &keep, h) != 0)
        fail("the double backward through the result failed");
}

/* Checks one call: result against the expectation, operands unchanged, then
 * backward through it. Takes ownership of nothing (all tensors are scoped). */
static void check_call(pool *p, reader *r, expect *e, nb_tensor *res, nb_tensor **ops, int nops,
                       vals *before) {
    for (int k = 0; k < nops; k++) { /* operands unchanged */
        vals a = read_tensor(ops[k]);
        for (int64_t i = 0; i < a.n; i++)
            if (!(a.v[i] == before[k].v[i] || (isnan(a.v[i]) && isnan(before[k].v[i]))))
                fail("operand %d changed at element %lld: %.17g -> %.17g", k, (long long)i,
                     before[k].v[i], a.v[i]);
        vals_free(&a);
    }
    if (verbose) /* NABLA_FUZZ_VERBOSE=1: every call and its outcome */
        fprintf(stderr, "fuzz_ops: %s -> %s\n", ctx, res ? shape_str(&e->sh) : nb_last_error());
    if (!res) {
        const char *msg = nb_last_error();
        size_t len = strlen(e->fn);
        if (e->ok) fail("the library refused a call the reference accepts");
        if (!msg || strncmp(msg, e->fn, len) || msg[len] != ':')
            fail("error message does not start with \"%s:\"", e->fn);
        if (e->bf16_msg && !strstr(msg, "bf16"))
            fail("a call valid but for its bf16 operands was refused without saying \"bf16\"");
        nb_clear_error();
        count(REFUSED);
        if (e->bf16_call) count(BF16);
        return;
    }
    if (!e->ok) fail("the library accepted a call the reference refuses");
    vals got = read_tensor(res);
    if (got.dt != e->dt)
        fail("dtype %s, expected %s", nb_dtype_name(got.dt), nb_dtype_name(e->dt));
    if (!same_shape(&got.sh, &e->sh))
        fail("shape %s, expected %s", shape_str(&got.sh), shape_str(&e->sh));
    if (e->rule != NOVALS) compare_values(e, &got);
    vals_free(&got);
    nb_clear_error();

    /* backward through the new result (bf16 through nb_to to f32, as nb_sum_all
     * refuses bf16: gradients still flow back through the bf16 ops) */
    if (is_float(got.dt) && nb_requires_grad(res) && p->backwards < MAX_BACKWARD) {
        p->backwards++;
        nb_tensor *f = got.dt == NB_BF16 ? nb_to(res, NB_F32) : res;
        nb_tensor *s = f ? nb_sum_all(f) : NULL;
        /* retained: later results share this graph and backpropagate through it again */
        nb_backward_opts keep = {.retain_graph = true};
        if (!s || nb_backward_with_opts(s, NULL, &keep) != 0)
            fail("backward through the result failed");
        for (int i = 0; i < p->nleaves; i++) {
            nb_tensor *g = nb_grad(p->leaves[i]);
            if (!g) continue;
            if (nb_dtype_of(g) != nb_dtype_of(p->leaves[i]) ||
                nb_ndim(g) != nb_ndim(p->leaves[i]) ||
                memcmp(nb_shape(g), nb_shape(p->leaves[i]),
                       (size_t)nb_ndim(g) * sizeof(int64_t)))
                fail("the gradient of leaf %d has dtype %s ndim %d, the leaf %s ndim %d", i,
                     nb_dtype_name(nb_dtype_of(g)), nb_ndim(g),
                     nb_dtype_name(nb_dtype_of(p->leaves[i])), nb_ndim(p->leaves[i]));
        }
        if (s && got.dt != NB_BF16) double_backward(p, s);
    }
    count(SUCCEEDED);
    if (e->bf16_call) count(BF16);
    pool_add(p, res, r);
}

/* Reads the operands, describes the call in ctx. */
static void begin_call(const char *what, nb_tensor **ops, int nops, vals *in) {
    int n = snprintf(ctx, sizeof ctx, "%s on", what);
    for (int k = 0; k < nops; k++) {
        in[k] = read_tensor(ops[k]);
        n += snprintf(ctx + n, sizeof ctx - (size_t)n, " %s%s%s", nb_dtype_name(in[k].dt),
                      shape_str(&in[k].sh), nb_requires_grad(ops[k]) ? "[rg]" : "");
        if (n >= (int)sizeof ctx) break;
    }
}

static void end_call(vals *in, int nops, expect *e) {
    if (e->skip) count(SKIPPED);
    for (int k = 0; k < nops; k++) vals_free(&in[k]);
    expect_free(e);
}

/* Runs the library call (unless the expectation says to skip it) and checks it. */
#define RUN(p, r, e, ops, nops, in, CALL)                   \
    do {                                                    \
        bf16_rule(&(e), in, nops);                          \
        if (!(e).skip) {                                    \
            nb_clear_error();                               \
            nb_tensor *res_ = (CALL);                       \
            check_call(p, r, &(e), res_, ops, nops, in);    \
        }                                                   \
        end_call(in, nops, &(e));                           \
    } while (0)

/* --------------------------------------------------------- argument bytes */
/* A dim for an nd-d tensor: mostly in range, sometimes just outside, rarely far. */
static int dim_arg(reader *r, int nd) {
    unsigned b = u8(r);
    if (b == 255) return 1000;
    if (b == 254) return -1000;
    int span = 2 * (nd ? nd : 1) + 3;
    return (int)(b % (unsigned)span) - (nd ? nd : 1) - 1;
}

/* -------------------------------------------------------- reference ops */
/* The references' "floating operand" test: bf16 passes it, as though it were
 * f32; bf16_rule then refuses it for every op not flagged NB_OP_BF16. */
static bool float_ok(nb_dtype d) { return is_float(d); }

/* + - * /: the library call and its reference on one pair of elements */
typedef nb_tensor *binary_call(nb_tensor *, nb_tensor *);
static void binary(pool *p, reader *r, const char *fn, binary_call *call,
                   double (*ref)(double, double)) {
    nb_tensor *ops[2];
    pick_n(p, r, ops, 2);
    vals in[2];
    begin_call(fn, ops, 2, in);
    expect e;
    expect_init(&e, fn, in[0].dt);
    if (float_ok(in[0].dt) && in[0].dt == in[1].dt && bcast(&in[0].sh, &in[1].sh, &e.sh)) {
        expect_alloc(&e, false);
        if (!e.skip && numel(&e.sh)) {
            int64_t idx[NB_MAX_DIMS] = {0}, i = 0;
            do {
                double x = in[0].v[bcast_flat(&e.sh, idx, &in[0].sh)];
                double y = in[1].v[bcast_flat(&e.sh, idx, &in[1].sh)];
                e.v[i++] = ref(x, y);
            } while (next_index(idx, &e.sh));
        }
    }
    RUN(p, r, e, ops, 2, in, call(ops[0], ops[1]));
}

static double ref_add(double x, double y) { return x + y; }
static double ref_sub(double x, double y) { return x - y; }
static double ref_mul(double x, double y) { return x * y; }
static double ref_div(double x, double y) { return x / y; }
static void op_add(pool *p, reader *r, const char *fn) { binary(p, r, fn, nb_add, ref_add); }
static void op_sub(pool *p, reader *r, const char *fn) { binary(p, r, fn, nb_sub, ref_sub); }
static void op_mul(pool *p, reader *r, const char *fn) { binary(p, r, fn, nb_mul, ref_mul); }
static void op_div(pool *p, reader *r, const char *fn) { binary(p, r, fn, nb_div, ref_div); }
/* NaN on either side wins; at a tie (-0 against +0) a */
static double ref_minimum(double x, double y) {
    return isnan(x) ? x : isnan(y) ? y : y < x ? y : x;
}
static double ref_maximum(double x, double y) {
    return isnan(x) ? x : isnan(y) ? y : x < y ? y : x;
}
static void op_minimum(pool *p, reader *r, const char *fn) {
    binary(p, r, fn, nb_minimum, ref_minimum);
}
static void op_maximum(pool *p, reader *r, const char *fn) {
    binary(p, r, fn, nb_maximum, ref_maximum);
}

/* comparisons: any dtype (one for both), bool result */
static void compare(pool *p, reader *r, const char *fn, binary_call *call,
                    bool (*ref)(double, double)) {
    nb_tensor *ops[2];
    pick_n(p, r, ops, 2);
    vals in[2];
    begin_call(fn, ops, 2, in);
    expect e;
    expect_init(&e, fn, NB_BOOL);
    if (in[0].dt == in[1].dt && bcast(&in[0].sh, &in[1].sh, &e.sh)) {
        expect_alloc(&e, false);
        if (!e.skip && numel(&e.sh)) {
            int64_t idx[NB_MAX_DIMS] = {0}, i = 0;
            do {
                /* f32 values are exact in double: comparing doubles is comparing floats */
                double x = in[0].v[bcast_flat(&e.sh, idx, &in[0].sh)];
                double y = in[1].v[bcast_flat(&e.sh, idx, &in[1].sh)];
                e.v[i++] = ref(x, y);
            } while (next_index(idx, &e.sh));
        }
    }
    RUN(p, r, e, ops, 2, in, call(ops[0], ops[1]));
}

static bool ref_eq(double x, double y) { return x == y; }
static bool ref_ne(double x, double y) { return x != y; }
static bool ref_lt(double x, double y) { return x < y; }
static bool ref_gt(double x, double y) { return x > y; }
static void op_eq(pool *p, reader *r, const char *fn) { compare(p, r, fn, nb_eq, ref_eq); }
static void op_ne(pool *p, reader *r, const char *fn) { compare(p, r, fn, nb_ne, ref_ne); }
static void op_lt(pool *p, reader *r, const char *fn) { compare(p, r, fn, nb_lt, ref_lt); }
static void op_gt(pool *p, reader *r, const char *fn) { compare(p, r, fn, nb_gt, ref_gt); }

static void op_logical_not(pool *p, reader *r, const char *fn) {
    nb_tensor *ops[1] = {pick(p, r)};
    vals in[1];
    begin_call(fn, ops, 1, in);
    expect e;
    expect_init(&e, fn, NB_BOOL);
    if (in[0].dt == NB_BOOL) {
        e.sh = in[0].sh;
        expect_alloc(&e, false);
        for (int64_t i = 0; !e.skip && i < in[0].n; i++) e.v[i] = !in[0].v[i];
    }
    RUN(p, r, e, ops, 1, in, nb_logical_not(ops[0]));
}

/* one-input floating ops. exp, tanh, log and gelu go through libm's float
 * functions for f32: correct to an ulp or so, not correctly rounded (TOL,
 * relative to |x| for gelu, whose terms cancel near 0); the others EXACT. */
typedef nb_tensor *unary_call(nb_tensor *);
enum { REL_Y, REL_X }; /* the tolerance's magnitude: |result| or |x| */
static void unary(pool *p, reader *r, const char *fn, unary_call *call, double (*ref)(double),
                  int rule, int rel) {
    nb_tensor *ops[1] = {pick(p, r)};
    vals in[1];
    begin_call(fn, ops, 1, in);
    expect e;
    expect_init(&e, fn, in[0].dt);
    if (float_ok(in[0].dt)) {
        e.sh = in[0].sh;
        expect_alloc(&e, rel == REL_X);
        e.rule = rule;
        e.rtol = in[0].dt == NB_F32 ? 1e-5 : 1e-9;
        for (int64_t i = 0; !e.skip && i < in[0].n; i++) {
            e.v[i] = ref(in[0].v[i]);
            if (e.mag) e.mag[i] = fabs(in[0].v[i]);
        }
    }
    RUN(p, r, e, ops, 1, in, call(ops[0]));
}

static double ref_neg(double x) { return -x; }
static double ref_relu(double x) { return x < 0 ? 0 : x; } /* NaN and -0 stay */
static double ref_gelu(double x) { return 0.5 * x * (1 + erf(x / sqrt(2.0))); }
static void op_neg(pool *p, reader *r, const char *fn) {
    unary(p, r, fn, nb_neg, ref_neg, EXACT, REL_Y);
}
static void op_exp(pool *p, reader *r, const char *fn) {
    unary(p, r, fn, nb_exp, exp, TOL, REL_Y);
}
static void op_log(pool *p, reader *r, const char *fn) {
    unary(p, r, fn, nb_log, log, TOL, REL_Y);
}
static void op_sqrt(pool *p, reader *r, const char *fn) {
    unary(p, r, fn, nb_sqrt, sqrt, EXACT, REL_Y);
}
static void op_tanh(pool *p, reader *r, const char *fn) {
    unary(p, r, fn, nb_tanh, tanh, TOL, REL_Y);
}
static void op_relu(pool *p, reader *r, const char *fn) {
    unary(p, r, fn, nb_relu, ref_relu, EXACT, REL_Y);
}
static void op_gelu(pool *p, reader *r, const char *fn) {
    unary(p, r, fn, nb_gelu, ref_gelu, TOL, REL_X);
}
static double ref_sigmoid(double x) { return 1 / (1 + exp(-x)); }
static double ref_silu(double x) { return x / (1 + exp(-x)); }
static double ref_abs(double x) { return fabs(x); }
static double ref_gelu_tanh(double x) {
    return 0.5 * x * (1 + tanh(sqrt(2 / 3.14159265358979323846) * (x + 0.044715 * x * x * x)));
}
static void op_sigmoid(pool *p, reader *r, const char *fn) {
    unary(p, r, fn, nb_sigmoid, ref_sigmoid, TOL, REL_Y);
}
static void op_silu(pool *p, reader *r, const char *fn) {
    unary(p, r, fn, nb_silu, ref_silu, TOL, REL_X);
}
static void op_abs(pool *p, reader *r, const char *fn) {
    unary(p, r, fn, nb_abs, ref_abs, EXACT, REL_Y);
}
static void op_gelu_tanh(pool *p, reader *r, const char *fn) {
    unary(p, r, fn, nb_gelu_tanh, ref_gelu_tanh, TOL, REL_X);
}
/* relative to |x| (at least 1): sin and cos pass through 0 */
static void op_sin(pool *p, reader *r, const char *fn) { unary(p, r, fn, nb_sin, sin, TOL, REL_X); }
static void op_cos(pool *p, reader *r, const char *fn) { unary(p, r, fn, nb_cos, cos, TOL, REL_X); }

/* torch.matmul. bf16 x bf16 gives bf16: the exact products summed in f32,
 * rounded once to bf16 (within that rounding of the f32 sum, see
 * compare_values). Under autocast (op_autocast), f32 and bf16 operands but
 * bf16 x bf16 are rounded to bf16 and summed in f32 into an f32 result; f64
 * is never cast, and other mixtures are refused. On the AVX512_BF16 path a
 * subnormal bf16 operand reads as 0 and subnormal products and partial sums
 * flush to 0 (ops/gemm_bf16.c): the tolerance holds those terms and up to
 * 2^-126 per step. */
static void op_matmul(pool *p, reader *r, const char *fn) {
    nb_tensor *ops[2];
    pick_n(p, r, ops, 2);
    vals in[2];
    begin_call(fn, ops, 2, in);
    if (autocast_bf16(p)) snprintf(ctx + strlen(ctx), sizeof ctx - strlen(ctx), " (autocast)");
    nb_dtype da = in[0].dt, db = in[1].dt;
    bool bfa = da == NB_F32 || da == NB_BF16, bfb = db == NB_F32 || db == NB_BF16;
    bool cast = autocast_bf16(p) && bfa && bfb && !(da == NB_BF16 && db == NB_BF16);
    bool bf16 = cast || (da == NB_BF16 && db == NB_BF16); /* products of bf16 values */
    expect e;
    expect_init(&e, fn, cast ? NB_F32 : da);
    const shp *a = &in[0].sh, *b = &in[1].sh;
    bool ok = (cast || (float_ok(da) && da == db)) && a->nd > 0 && b->nd > 0;
    bool a1 = a->nd == 1, b1 = b->nd == 1;
    int64_t M = 0, K = 0, N = 0;
    shp ba = {0}, bb = {0}, batch = {0};
    if (ok) {
        M = a1 ? 1 : a->s[a->nd - 2];
        K = a->s[a->nd - 1];
        N = b1 ? 1 : b->s[b->nd - 1];
        ok = K == b->s[b1 ? 0 : b->nd - 2];
        ba.nd = a1 ? 0 : a->nd - 2;
        bb.nd = b1 ? 0 : b->nd - 2;
        memcpy(ba.s, a->s, (size_t)ba.nd * sizeof(int64_t));
        memcpy(bb.s, b->s, (size_t)bb.nd * sizeof(int64_t));
        ok = ok && bcast(&ba, &bb, &batch);
    }
    if (ok) {
        e.sh = batch;
        if (!a1) e.sh.s[e.sh.nd++] = M;
        if (!b1) e.sh.s[e.sh.nd++] = N;
        expect_alloc(&e, true);
        e.rule = TOL;
        e.rtol = acc_rtol(bf16 ? NB_F32 : e.dt, K); /* bf16 products: an f32 sum */
        double big = e.dt == NB_F64 ? 1e150 : 1e15;
        for (int k = 0; k < 2; k++)
            for (int64_t i = 0; i < in[k].n; i++)
                if (isfinite(in[k].v[i]) && fabs(in[k].v[i]) > big) e.rule = NOVALS;
        int64_t nbat = numel(&batch);
        if (!e.skip && nbat * M * N > 0) {
            int64_t bidx[NB_MAX_DIMS] = {0}, out = 0;
            do {
                /* row-major position of this batch's matrix in a and b */
                int64_t fa = ba.nd ? bcast_flat(&batch, bidx, &ba) : 0;
                int64_t fb = bb.nd ? bcast_flat(&batch, bidx, &bb) : 0;
                for (int64_t m = 0; m < M; m++)
                    for (int64_t n = 0; n < N; n++, out++) {
                        double s = 0, mag = 0, flush = 0;
                        for (int64_t k = 0; k < K; k++) {
                            double x = in[0].v[(fa * M + m) * K + k];
                            double y = in[1].v[(fb * K + k) * N + n];
                            if (bf16) { /* as packed: f32 rounded to bf16 (bf16 unchanged) */
                                x = round_to(x, NB_BF16), y = round_to(y, NB_BF16);
                                if (fabs(x) < 0x1p-126 || fabs(y) < 0x1p-126) flush += fabs(x * y);
                            }
                            s += x * y;
                            mag += fabs(x * y);
                        }
                        if (bf16) flush += (double)(K + 1) * 0x1p-126;
                        e.v[out] = s;
                        e.mag[out] = mag + flush / e.rtol; /* tol = rtol * mag + flush */
                    }
            } while (next_index(bidx, &batch));
        }
    }
    RUN(p, r, e, ops, 2, in, nb_matmul(ops[0], ops[1]));
}

/* softmax / log_softmax over dim: the stable formula, a slice of all -inf
 * gives zeros (nabla's documented convention; PyTorch gives NaN) */
typedef nb_tensor *dim_call(nb_tensor *, int);
static void softmax_dim(pool *p, reader *r, const char *fn, dim_call *call, bool log_mode) {
    nb_tensor *ops[1] = {pick(p, r)};
    int dim = dim_arg(r, nb_ndim(ops[0]));
    vals in[1];
    begin_call(fn, ops, 1, in);
    snprintf(ctx + strlen(ctx), sizeof ctx - strlen(ctx), " dim %d", dim);
    expect e;
    expect_init(&e, fn, in[0].dt);
    const shp *s = &in[0].sh;
    int d = norm_dim(dim, s->nd);
    if (float_ok(in[0].dt) && d >= 0) {
        e.sh = *s;
        expect_alloc(&e, true);
        int64_t len = s->nd ? s->s[d] : 1, inner = 1, outer = 1;
        e.rule = TOL;
        e.rtol = acc_rtol(e.dt, len);
        for (int i = d + 1; i < s->nd; i++) inner *= s->s[i];
        for (int i = 0; i < d && i < s->nd; i++) outer *= s->s[i];
        for (int64_t o = 0; !e.skip && o < outer; o++)
            for (int64_t j = 0; j < inner; j++) {
                const double *x = in[0].v + o * len * inner + j;
                double *y = e.v + o * len * inner + j, *mg = e.mag + o * len * inner + j;
                double m = -INFINITY;
                bool nan = false;
                for (int64_t k = 0; k < len; k++) {
                    nan |= isnan(x[k * inner]);
                    if (x[k * inner] > m) m = x[k * inner];
                }
                if (nan) m = NAN;
                if (m == -INFINITY) {
                    for (int64_t k = 0; k < len; k++) y[k * inner] = 0, mg[k * inner] = 1;
                    continue;
                }
                double sum = 0;
                for (int64_t k = 0; k < len; k++) sum += exp(x[k * inner] - m);
                for (int64_t k = 0; k < len; k++) {
                    double z = x[k * inner] - m;
                    y[k * inner] = log_mode ? z - log(sum) : exp(z) / sum;
                    mg[k * inner] = log_mode ? fabs(z) + log(sum) + 1 : 1;
                }
            }
    }
    RUN(p, r, e, ops, 1, in, call(ops[0], dim));
}

static void op_softmax(pool *p, reader *r, const char *fn) {
    softmax_dim(p, r, fn, nb_softmax, false);
}
static void op_log_softmax(pool *p, reader *r, const char *fn) {
    softmax_dim(p, r, fn, nb_log_softmax, true);
}

/* sum / mean / max / min over a dim */
enum { R_SUM, R_MEAN, R_MAX, R_MIN };
typedef nb_tensor *reduce_call(nb_tensor *, int, bool);
static void reduce_dim(pool *p, reader *r, const char *fn, reduce_call *call, int which) {
    nb_tensor *ops[1] = {pick(p, r)};
    int dim = dim_arg(r, nb_ndim(ops[0]));
    bool keep = u8(r) & 1;
    vals in[1];
    begin_call(fn, ops, 1, in);
    snprintf(ctx + strlen(ctx), sizeof ctx - strlen(ctx), " dim %d keepdim %d", dim, keep);
    expect e;
    expect_init(&e, fn, in[0].dt);
    const shp *s = &in[0].sh;
    int d = norm_dim(dim, s->nd);
    bool ok = float_ok(in[0].dt) && d >= 0;
    bool ext = which == R_MAX || which == R_MIN;
    if (ok && ext && s->nd > 0 && s->s[d] == 0) ok = false; /* max of nothing */
    if (ok && s->nd == 0) { /* a 0-d tensor: the same value */
        e.sh = *s;
        expect_alloc(&e, false);
        e.v[0] = in[0].v[0];
    } else if (ok) {
        e.sh.nd = 0;
        for (int i = 0; i < s->nd; i++)
            if (i != d) e.sh.s[e.sh.nd++] = s->s[i];
            else if (keep) e.sh.s[e.sh.nd++] = 1;
        expect_alloc(&e, !ext);
        if (!ext) {
            e.rule = TOL;
            e.rtol = e.dt == NB_F32 ? 1e-6 : 1e-12; /* accumulated in double */
        }
        int64_t len = s->s[d], inner = 1;
        for (int i = d + 1; i < s->nd; i++) inner *= s->s[i];
        int64_t outer = 1;
        for (int i = 0; i < d; i++) outer *= s->s[i];
        for (int64_t o = 0; !e.skip && o < outer; o++)
            for (int64_t j = 0; j < inner; j++) {
                const double *x = in[0].v + o * len * inner + j;
                double acc = 0, mag = 0, best = len ? x[0] : 0;
                for (int64_t k = 0; k < len; k++) {
                    acc += x[k * inner];
                    mag += fabs(x[k * inner]);
                    /* NaN counts as the max (min); the first one wins */
                    double v = x[k * inner];
                    bool better = which == R_MIN ? v < best : v > best;
                    if (k && !isnan(best) && (better || isnan(v))) best = v;
                }
                int64_t at = o * inner + j;
                e.v[at] = which == R_SUM ? acc : which == R_MEAN ? acc / (double)len : best;
                if (e.mag) e.mag[at] = which == R_MEAN ? mag / (double)len : mag;
            }
    }
    RUN(p, r, e, ops, 1, in, call(ops[0], dim, keep));
}

static void op_sum(pool *p, reader *r, const char *fn) { reduce_dim(p, r, fn, nb_sum, R_SUM); }
static void op_mean(pool *p, reader *r, const char *fn) { reduce_dim(p, r, fn, nb_mean, R_MEAN); }
static void op_max(pool *p, reader *r, const char *fn) { reduce_dim(p, r, fn, nb_max, R_MAX); }
static void op_min(pool *p, reader *r, const char *fn) { reduce_dim(p, r, fn, nb_min, R_MIN); }

/* sum / mean / var / std over a list of dims (none: all), two passes in
 * double for var and std, row-major within each output as the library */
enum { RD_SUM, RD_MEAN, RD_VAR, RD_STD };
static void reduce_dims(pool *p, reader *r, const char *fn, int which) {
    nb_tensor *ops[1] = {pick(p, r)};
    int nd0 = nb_ndim(ops[0]), ndims = u8(r) % 4, dims[4];
    for (int i = 0; i < ndims; i++) dims[i] = dim_arg(r, nd0);
    unsigned b = u8(r);
    bool keep = b & 1;
    static const double corrs[] = {0, 1, 2, 0.5, 7};
    double corr = corrs[(b >> 1) % 5];
    vals in[1];
    begin_call(fn, ops, 1, in);
    snprintf(ctx + strlen(ctx), sizeof ctx - strlen(ctx), " ndims %d keepdim %d corr %g", ndims,
             keep, corr);
    expect e;
    expect_init(&e, fn, in[0].dt);
    const shp *s = &in[0].sh;
    bool ok = float_ok(in[0].dt), red[NB_MAX_DIMS] = {false};
    for (int i = 0; ok && i < ndims; i++) {
        int d = norm_dim(dims[i], s->nd);
        if (d < 0 || red[d]) ok = false; /* out of range, or given twice */
        else red[d] = true;
    }
    if (ok && ndims == 0)
        for (int i = 0; i < s->nd; i++) red[i] = true;
    if (ok) {
        e.sh.nd = 0;
        int64_t cnt = 1;
        for (int i = 0; i < s->nd; i++)
            if (!red[i]) e.sh.s[e.sh.nd++] = s->s[i];
            else {
                cnt *= s->s[i];
                if (keep) e.sh.s[e.sh.nd++] = 1;
            }
        expect_alloc(&e, true);
        e.rule = TOL;
        e.rtol = e.dt == NB_F32 ? 1e-6 : 1e-12;
        int64_t no = numel(&e.sh);
        double *acc = calloc((size_t)(no ? no : 1), sizeof *acc);
        int64_t *dst = calloc((size_t)(in[0].n ? in[0].n : 1), sizeof *dst);
        if (!acc || !dst) abort();
        /* the output element of each input element, row-major */
        for (int64_t i = 0; !e.skip && i < in[0].n; i++) {
            int64_t k = i, o = 0, mul = 1;
            for (int q = s->nd - 1; q >= 0; q--) {
                int64_t ix = k % s->s[q];
                k /= s->s[q];
                if (!red[q]) o += ix * mul, mul *= s->s[q];
            }
            dst[i] = o;
        }
        for (int64_t i = 0; !e.skip && i < in[0].n; i++) {
            acc[dst[i]] += in[0].v[i];
            e.mag[dst[i]] += fabs(in[0].v[i]);
        }
        double den = (double)cnt - corr;
        if (den < 0) den = 0;
        for (int64_t o = 0; !e.skip && o < no; o++) {
            if (which == RD_SUM) e.v[o] = acc[o];
            else if (which == RD_MEAN) e.v[o] = acc[o] / (double)cnt, e.mag[o] /= (double)cnt;
            else acc[o] /= (double)cnt, e.v[o] = 0, e.mag[o] = 0; /* acc: the means */
        }
        if (which == RD_VAR || which == RD_STD) {
            for (int64_t i = 0; !e.skip && i < in[0].n; i++) {
                double dv = in[0].v[i] - acc[dst[i]];
                e.v[dst[i]] += dv * dv;
                e.mag[dst[i]] += (fabs(in[0].v[i]) + fabs(acc[dst[i]])) *
                                 (fabs(in[0].v[i]) + fabs(acc[dst[i]]));
            }
            for (int64_t o = 0; !e.skip && o < no; o++) {
                e.v[o] = cnt ? e.v[o] / den : NAN;
                e.mag[o] /= den;
                if (which == RD_STD) e.v[o] = sqrt(e.v[o]), e.mag[o] = sqrt(e.mag[o]);
            }
        }
        free(acc);
        free(dst);
    }
    const int *dp = ndims ? dims : (b & 2) ? NULL : dims;
    switch (which) {
    case RD_SUM: RUN(p, r, e, ops, 1, in, nb_sum_dims(ops[0], ndims, dp, keep)); break;
    case RD_MEAN: RUN(p, r, e, ops, 1, in, nb_mean_dims(ops[0], ndims, dp, keep)); break;
    case RD_VAR: RUN(p, r, e, ops, 1, in, nb_var(ops[0], ndims, dp, corr, keep)); break;
    default: RUN(p, r, e, ops, 1, in, nb_std(ops[0], ndims, dp, corr, keep)); break;
    }
}
static void op_sum_dims(pool *p, reader *r, const char *fn) { reduce_dims(p, r, fn, RD_SUM); }
static void op_mean_dims(pool *p, reader *r, const char *fn) { reduce_dims(p, r, fn, RD_MEAN); }
static void op_var(pool *p, reader *r, const char *fn) { reduce_dims(p, r, fn, RD_VAR); }
static void op_std(pool *p, reader *r, const char *fn) { reduce_dims(p, r, fn, RD_STD); }

/* running sums along a dim, sequential in double, rounded per element */
static void op_cumsum(pool *p, reader *r, const char *fn) {
    nb_tensor *ops[1] = {pick(p, r)};
    int dim = dim_arg(r, nb_ndim(ops[0]));
    vals in[1];
    begin_call(fn, ops, 1, in);
    snprintf(ctx + strlen(ctx), sizeof ctx - strlen(ctx), " dim %d", dim);
    expect e;
    expect_init(&e, fn, in[0].dt);
    const shp *s = &in[0].sh;
    int d = norm_dim(dim, s->nd);
    if (float_ok(in[0].dt) && d >= 0) {
        e.sh = *s;
        expect_alloc(&e, false);
        int64_t len = s->nd ? s->s[d] : 1, inner = 1, outer = 1;
        for (int i = d + 1; i < s->nd; i++) inner *= s->s[i];
        for (int i = 0; i < d && i < s->nd; i++) outer *= s->s[i];
        for (int64_t o = 0; !e.skip && o < outer; o++)
            for (int64_t j = 0; j < inner; j++) {
                double a = 0;
                for (int64_t k = 0; k < len; k++) {
                    int64_t at = o * len * inner + j + k * inner;
                    a += in[0].v[at];
                    e.v[at] = a;
                }
            }
    }
    RUN(p, r, e, ops, 1, in, nb_cumsum(ops[0], dim));
}

static void reduce_all(pool *p, reader *r, const char *fn, unary_call *call, bool mean) {
    nb_tensor *ops[1] = {pick(p, r)};
    vals in[1];
    begin_call(fn, ops, 1, in);
    expect e;
    expect_init(&e, fn, in[0].dt);
    if (float_ok(in[0].dt)) {
        e.sh.nd = 0;
        expect_alloc(&e, true);
        e.rule = TOL;
        e.rtol = e.dt == NB_F32 ? 1e-6 : 1e-12;
        double acc = 0, mag = 0;
        for (int64_t i = 0; i < in[0].n; i++) acc += in[0].v[i], mag += fabs(in[0].v[i]);
        e.v[0] = mean ? acc / (double)in[0].n : acc; /* the mean of nothing is NaN */
        e.mag[0] = mean ? mag / (double)in[0].n : mag;
    }
    RUN(p, r, e, ops, 1, in, call(ops[0]));
}

static void op_sum_all(pool *p, reader *r, const char *fn) {
    reduce_all(p, r, fn, nb_sum_all, false);
}
static void op_mean_all(pool *p, reader *r, const char *fn) {
    reduce_all(p, r, fn, nb_mean_all, true);
}

/* value where mask, t elsewhere; the broadcast shape */
static void op_masked_fill(pool *p, reader *r, const char *fn) {
    static const double fills[] = {0, 1.5, -INFINITY, INFINITY, NAN, -1e9, 1e39, -0.0};
    nb_tensor *ops[2];
    pick_n(p, r, ops, 2);
    double value = fills[u8(r) % 8];
    vals in[2];
    begin_call(fn, ops, 2, in);
    snprintf(ctx + strlen(ctx), sizeof ctx - strlen(ctx), " value %g", value);
    expect e;
    expect_init(&e, fn, in[0].dt);
    if (float_ok(in[0].dt) && in[1].dt == NB_BOOL && bcast(&in[0].sh, &in[1].sh, &e.sh)) {
        expect_alloc(&e, false);
        if (!e.skip && numel(&e.sh)) {
            int64_t idx[NB_MAX_DIMS] = {0}, i = 0;
            do {
                bool m = in[1].v[bcast_flat(&e.sh, idx, &in[1].sh)] != 0;
                e.v[i++] = m ? value : in[0].v[bcast_flat(&e.sh, idx, &in[0].sh)];
            } while (next_index(idx, &e.sh));
        }
    }
    RUN(p, r, e, ops, 2, in, nb_masked_fill(ops[0], ops[1], value));
}

/* cond ? a : b, three-way broadcast; a and b of one (any) dtype */
static void op_where(pool *p, reader *r, const char *fn) {
    nb_tensor *ops[3];
    pick_n(p, r, ops, 3);
    vals in[3];
    begin_call(fn, ops, 3, in);
    expect e;
    expect_init(&e, fn, in[1].dt);
    shp t;
    if (in[0].dt == NB_BOOL && in[1].dt == in[2].dt && bcast(&in[0].sh, &in[1].sh, &t) &&
        bcast(&t, &in[2].sh, &e.sh)) {
        expect_alloc(&e, false);
        if (!e.skip && numel(&e.sh)) {
            int64_t idx[NB_MAX_DIMS] = {0}, i = 0;
            do {
                bool c = in[0].v[bcast_flat(&e.sh, idx, &in[0].sh)] != 0;
                e.v[i++] = c ? in[1].v[bcast_flat(&e.sh, idx, &in[1].sh)]
                             : in[2].v[bcast_flat(&e.sh, idx, &in[2].sh)];
            } while (next_index(idx, &e.sh));
        }
    }
    RUN(p, r, e, ops, 3, in, nb_where(ops[0], ops[1], ops[2]));
}

/* 1-3 tensors along dim */
static void op_cat(pool *p, reader *r, const char *fn) {
    int n = 1 + (int)(u8(r) % 3);
    nb_tensor *ops[3];
    for (int k = 0; k < n; k++) ops[k] = pick(p, r);
    int dim = dim_arg(r, nb_ndim(ops[0]));
    vals in[3];
    begin_call(fn, ops, n, in);
    snprintf(ctx + strlen(ctx), sizeof ctx - strlen(ctx), " dim %d", dim);
    expect e;
    expect_init(&e, fn, in[0].dt);
    int nd = in[0].sh.nd, d = norm_dim(dim, nd);
    bool ok = nd > 0 && d >= 0;
    for (int k = 0; ok && k < n; k++) {
        ok = in[k].dt == in[0].dt && in[k].sh.nd == nd;
        for (int i = 0; ok && i < nd; i++) ok = i == d || in[k].sh.s[i] == in[0].sh.s[i];
    }
    if (ok) {
        e.sh = in[0].sh;
        e.sh.s[d] = 0;
        for (int k = 0; k < n; k++) e.sh.s[d] += in[k].sh.s[d];
        expect_alloc(&e, false);
        if (!e.skip && numel(&e.sh)) {
            int64_t idx[NB_MAX_DIMS] = {0}, i = 0;
            do {
                int64_t at = idx[d];
                int k = 0;
                while (at >= in[k].sh.s[d]) at -= in[k].sh.s[d], k++;
                int64_t f = 0;
                for (int j = 0; j < nd; j++) f = f * in[k].sh.s[j] + (j == d ? at : idx[j]);
                e.v[i++] = in[k].v[f];
            } while (next_index(idx, &e.sh));
        }
    }
    RUN(p, r, e, ops, n, in, nb_cat(ops, n, dim));
}

/* 1-3 tensors of one shape joined along a new dim */
static void op_stack(pool *p, reader *r, const char *fn) {
    int n = 1 + (int)(u8(r) % 3);
    nb_tensor *ops[3];
    for (int k = 0; k < n; k++) ops[k] = pick(p, r);
    int dim = dim_arg(r, nb_ndim(ops[0]) + 1);
    vals in[3];
    begin_call(fn, ops, n, in);
    snprintf(ctx + strlen(ctx), sizeof ctx - strlen(ctx), " dim %d", dim);
    expect e;
    expect_init(&e, fn, in[0].dt);
    int nd = in[0].sh.nd, d = norm_dim(dim, nd + 1);
    bool ok = d >= 0 && nd < NB_MAX_DIMS;
    for (int k = 0; ok && k < n; k++) ok = in[k].dt == in[0].dt && same_shape(&in[k].sh, &in[0].sh);
    if (ok) {
        e.sh.nd = nd + 1;
        for (int i = 0, j = 0; i <= nd; i++) e.sh.s[i] = i == d ? n : in[0].sh.s[j++];
        expect_alloc(&e, false);
        if (!e.skip && numel(&e.sh)) {
            int64_t idx[NB_MAX_DIMS] = {0}, i = 0;
            do {
                int64_t f = 0;
                for (int j = 0; j <= nd; j++)
                    if (j != d) f = f * e.sh.s[j] + idx[j];
                e.v[i++] = in[idx[d]].v[f];
            } while (next_index(idx, &e.sh));
        }
    }
    RUN(p, r, e, ops, n, in, nb_stack(ops, n, dim));
}

static void op_contiguous(pool *p, reader *r, const char *fn) {
    nb_tensor *ops[1] = {pick(p, r)};
    vals in[1];
    begin_call(fn, ops, 1, in);
    expect e;
    expect_init(&e, fn, in[0].dt);
    e.sh = in[0].sh;
    expect_alloc(&e, false);
    if (!e.skip) memcpy(e.v, in[0].v, (size_t)in[0].n * sizeof *e.v);
    bf16_rule(&e, in, 1);
    nb_clear_error();
    if (!e.skip) {
        nb_tensor *res = nb_contiguous(ops[0]);
        if (res && !nb_is_contiguous(res)) fail("%s gave a non-contiguous tensor", fn);
        check_call(p, r, &e, res, ops, 1, in);
    }
    end_call(in, 1, &e);
}

/* ------------------------------------------------------------ view ops */
/* The result of a view op: element i of the result is element src[i] of
 * the input (row-major positions); src NULL = the same order. */
static void expect_gather(expect *e, const vals *in, const int64_t *src) {
    expect_alloc(e, false);
    for (int64_t i = 0; !e->skip && i < numel(&e->sh); i++) e->v[i] = in->v[src ? src[i] : i];
}

/* Row-major positions in `in` of the elements of a view made by reordering
 * its dims (perm[i] = the input dim of output dim i). */
static int64_t *permuted(const shp *in, const int *perm, shp *out) {
    out->nd = in->nd;
    for (int i = 0; i < in->nd; i++) out->s[i] = in->s[perm[i]];
    int64_t n = numel(out), *src = malloc((size_t)(n ? n : 1) * sizeof *src);
    if (!src) abort();
    if (n == 0) return src;
    int64_t idx[NB_MAX_DIMS] = {0}, i = 0;
    do {
        int64_t full[NB_MAX_DIMS];
        for (int k = 0; k < in->nd; k++) full[perm[k]] = idx[k];
        int64_t f = 0;
        for (int k = 0; k < in->nd; k++) f = f * in->s[k] + full[k];
        src[i++] = f;
    } while (next_index(idx, out));
    return src;
}

static void op_transpose(pool *p, reader *r, const char *fn) {
    nb_tensor *ops[1] = {pick(p, r)};
    int nd = nb_ndim(ops[0]), d0 = dim_arg(r, nd), d1 = dim_arg(r, nd);
    vals in[1];
    begin_call(fn, ops, 1, in);
    snprintf(ctx + strlen(ctx), sizeof ctx - strlen(ctx), " dims %d %d", d0, d1);
    expect e;
    expect_init(&e, fn, in[0].dt);
    int a = norm_dim(d0, nd), b = norm_dim(d1, nd);
    if (a >= 0 && b >= 0) {
        int perm[NB_MAX_DIMS];
        for (int i = 0; i < nd; i++) perm[i] = i;
        if (nd) perm[a] = b, perm[b] = a;
        int64_t *src = permuted(&in[0].sh, perm, &e.sh);
        expect_gather(&e, &in[0], src);
        free(src);
    }
    RUN(p, r, e, ops, 1, in, nb_transpose(ops[0], d0, d1));
}

static void op_permute(pool *p, reader *r, const char *fn) {
    nb_tensor *ops[1] = {pick(p, r)};
    int nd = nb_ndim(ops[0]), dims[NB_MAX_DIMS + 1], n = nd;
    unsigned mode = u8(r) % 4;
    if (mode < 3) { /* a permutation, maybe with negative dims */
        for (int i = 0; i < nd; i++) dims[i] = i;
        for (int i = nd - 1; i > 0; i--) {
            int j = (int)(u8(r) % (unsigned)(i + 1)), t = dims[i];
            dims[i] = dims[j], dims[j] = t;
        }
        if (mode == 1)
            for (int i = 0; i < nd; i++) dims[i] -= nd;
    } else { /* anything: repeats, out of range, a wrong count */
        n = nd + (int)(u8(r) % 3) - 1;
        if (n < 0 || n > NB_MAX_DIMS) n = nd;
        for (int i = 0; i < n; i++) dims[i] = dim_arg(r, nd);
    }
    vals in[1];
    begin_call(fn, ops, 1, in);
    int len = (int)strlen(ctx);
    len += snprintf(ctx + len, sizeof ctx - (size_t)len, " dims");
    for (int i = 0; i < n; i++) len += snprintf(ctx + len, sizeof ctx - (size_t)len, " %d", dims[i]);
    expect e;
    expect_init(&e, fn, in[0].dt);
    bool ok = n == nd, seen[NB_MAX_DIMS] = {false};
    int perm[NB_MAX_DIMS];
    for (int i = 0; ok && i < n; i++) {
        int d = norm_dim(dims[i], nd);
        ok = d >= 0 && d < nd && !seen[d];
        if (ok) seen[d] = true, perm[i] = d;
    }
    if (ok) {
        int64_t *src = permuted(&in[0].sh, perm, &e.sh);
        expect_gather(&e, &in[0], src);
        free(src);
    }
    RUN(p, r, e, ops, 1, in, nb_permute(ops[0], n, dims));
}

static void op_unsqueeze(pool *p, reader *r, const char *fn) {
    nb_tensor *ops[1] = {pick(p, r)};
    int nd = nb_ndim(ops[0]);
    int dim = (int)(u8(r) % (unsigned)(2 * nd + 4)) - nd - 2; /* -(nd+2) .. nd+1 */
    vals in[1];
    begin_call(fn, ops, 1, in);
    snprintf(ctx + strlen(ctx), sizeof ctx - strlen(ctx), " dim %d", dim);
    expect e;
    expect_init(&e, fn, in[0].dt);
    if (nd < NB_MAX_DIMS && dim >= -(nd + 1) && dim <= nd) {
        int d = dim < 0 ? dim + nd + 1 : dim;
        e.sh.nd = nd + 1;
        for (int i = 0, j = 0; i <= nd; i++) e.sh.s[i] = i == d ? 1 : in[0].sh.s[j++];
        expect_gather(&e, &in[0], NULL);
    }
    RUN(p, r, e, ops, 1, in, nb_unsqueeze(ops[0], dim));
}

static void op_squeeze(pool *p, reader *r, const char *fn) {
    nb_tensor *ops[1] = {pick(p, r)};
    int nd = nb_ndim(ops[0]), dim = dim_arg(r, nd);
    vals in[1];
    begin_call(fn, ops, 1, in);
    snprintf(ctx + strlen(ctx), sizeof ctx - strlen(ctx), " dim %d", dim);
    expect e;
    expect_init(&e, fn, in[0].dt);
    int d = norm_dim(dim, nd);
    if (d >= 0) {
        e.sh.nd = 0;
        for (int i = 0; i < nd; i++)
            if (i != d || in[0].sh.s[i] != 1) e.sh.s[e.sh.nd++] = in[0].sh.s[i];
        expect_gather(&e, &in[0], NULL);
    }
    RUN(p, r, e, ops, 1, in, nb_squeeze(ops[0], dim));
}

static void op_expand(pool *p, reader *r, const char *fn) {
    nb_tensor *ops[1] = {pick(p, r)};
    int tnd = nb_ndim(ops[0]);
    const int64_t *ts = nb_shape(ops[0]);
    unsigned b = u8(r);
    int nd = b == 255 ? tnd - 1 : tnd + (int)(b % 3);
    if (nd < 0) nd = 0;
    if (nd > NB_MAX_DIMS) nd = NB_MAX_DIMS;
    int64_t want[NB_MAX_DIMS];
    int lead = nd - tnd;
    for (int i = 0; i < nd; i++) {
        unsigned c = u8(r);
        int j = i - lead;
        if (j < 0) want[i] = c == 255 ? -1 : (int64_t)(c % 4); /* new dims: 0..3 (or -1) */
        else if (c % 4 == 0) want[i] = -1;
        else if (c % 4 == 1) want[i] = ts[j];
        else want[i] = c == 254 ? -2 : (int64_t)(c / 4 % 6); /* often a bad size */
    }
    vals in[1];
    begin_call(fn, ops, 1, in);
    int len = (int)strlen(ctx);
    len += snprintf(ctx + len, sizeof ctx - (size_t)len, " to");
    for (int i = 0; i < nd; i++)
        len += snprintf(ctx + len, sizeof ctx - (size_t)len, " %lld", (long long)want[i]);
    expect e;
    expect_init(&e, fn, in[0].dt);
    bool ok = nd >= tnd;
    e.sh.nd = nd;
    for (int i = 0; ok && i < nd; i++) {
        int j = i - lead;
        if (j < 0) ok = want[i] >= 0, e.sh.s[i] = want[i];
        else if (want[i] == -1 || want[i] == in[0].sh.s[j]) e.sh.s[i] = in[0].sh.s[j];
        else ok = in[0].sh.s[j] == 1 && want[i] >= 0, e.sh.s[i] = want[i];
    }
    if (ok) {
        int64_t n = numel(&e.sh);
        int64_t *src = n <= MAX_NUMEL ? malloc((size_t)(n ? n : 1) * sizeof *src) : NULL;
        if (src && n) {
            int64_t idx[NB_MAX_DIMS] = {0}, i = 0;
            do src[i++] = bcast_flat(&e.sh, idx, &in[0].sh);
            while (next_index(idx, &e.sh));
        }
        expect_gather(&e, &in[0], src);
        free(src);
    }
    RUN(p, r, e, ops, 1, in, nb_expand(ops[0], nd, want));
}

/* narrow, or select (one index: the dim goes) */
static void slice(pool *p, reader *r, const char *fn, bool select) {
    nb_tensor *ops[1] = {pick(p, r)};
    int nd = nb_ndim(ops[0]), dim = dim_arg(r, nd), dn = norm_dim(dim, nd);
    /* start in -size-1 .. size+1 and length in -1 .. size+1 (size of the dim, if valid) */
    int64_t size0 = nd && dn >= 0 ? nb_shape(ops[0])[dn] : 2;
    int64_t start = (int64_t)(u8(r) % (unsigned)(2 * size0 + 3)) - size0 - 1;
    int64_t length = (int64_t)(u8(r) % (unsigned)(size0 + 3)) - 1;
    vals in[1];
    begin_call(fn, ops, 1, in);
    snprintf(ctx + strlen(ctx), sizeof ctx - strlen(ctx), " dim %d %s %lld length %lld", dim,
             select ? "index" : "start", (long long)start, (long long)length);
    expect e;
    expect_init(&e, fn, in[0].dt);
    int d = nd ? norm_dim(dim, nd) : -1;
    bool ok = d >= 0;
    int64_t size = ok ? in[0].sh.s[d] : 0, s0 = start < 0 ? start + size : start;
    if (select) ok = ok && start >= -size && start < size;
    else ok = ok && s0 >= 0 && s0 <= size && length >= 0 && s0 + length <= size;
    if (ok) {
        e.sh.nd = 0;
        for (int i = 0; i < nd; i++)
            if (i != d) e.sh.s[e.sh.nd++] = in[0].sh.s[i];
            else if (!select) e.sh.s[e.sh.nd++] = length;
        int64_t n = numel(&e.sh), *src = malloc((size_t)(n ? n : 1) * sizeof *src);
        if (!src) abort();
        if (n) {
            int64_t idx[NB_MAX_DIMS] = {0}, i = 0;
            do {
                int64_t f = 0;
                for (int j = 0, k = 0; j < nd; j++) {
                    int64_t c = j == d ? (select ? s0 : s0 + idx[k++]) : idx[k++];
                    f = f * in[0].sh.s[j] + c;
                }
                src[i++] = f;
            } while (next_index(idx, &e.sh));
        }
        expect_gather(&e, &in[0], src);
        free(src);
    }
    RUN(p, r, e, ops, 1, in,
        select ? nb_select(ops[0], dim, start) : nb_narrow(ops[0], dim, start, length));
}

static void op_narrow(pool *p, reader *r, const char *fn) { slice(p, r, fn, false); }
static void op_select(pool *p, reader *r, const char *fn) { slice(p, r, fn, true); }

/* Whether t's elements, in row-major order, can be seen with shape `to`
 * through some strides: the strides of the dims of size > 1 are fixed by
 * the offsets of their first steps, and then every element must be where
 * those strides put it. (Brute force over the elements.) */
static bool viewable(nb_tensor *t, int64_t n, const shp *to) {
    if (n == 0) return true;
    int64_t *off = offsets(t, n), st[NB_MAX_DIMS], step = 1;
    for (int k = to->nd - 1; k >= 0; k--) {
        st[k] = to->s[k] > 1 ? off[step] - off[0] : 0;
        step *= to->s[k];
    }
    int64_t idx[NB_MAX_DIMS] = {0}, i = 0;
    bool ok = true;
    do {
        int64_t o = off[0];
        for (int k = 0; k < to->nd; k++) o += idx[k] * st[k];
        ok = o == off[i++];
    } while (ok && next_index(idx, to));
    free(off);
    return ok;
}

/* nb_view, or nb_reshape (which may copy where a view cannot be) */
static void view_shape(pool *p, reader *r, const char *fn, bool reshape) {
    nb_tensor *ops[1] = {pick(p, r)};
    int64_t n = nb_numel(ops[0]), want[NB_MAX_DIMS];
    int nd = (int)(u8(r) % 6);
    unsigned mode = u8(r) % 4;
    if (mode == 0) { /* anything in -1..5 */
        for (int i = 0; i < nd; i++) want[i] = (int64_t)(u8(r) % 7) - 1;
    } else if (nd == 0) {
    } else if (n == 0) { /* an empty tensor: any shape with a 0 */
        for (int i = 0; i < nd; i++) want[i] = (int64_t)(u8(r) % 4);
        want[u8(r) % (unsigned)nd] = 0;
    } else { /* a factorization of n, maybe with one -1 */
        int64_t rest = n;
        for (int i = 0; i < nd - 1; i++) {
            int64_t divs[64];
            int nds = 0;
            for (int64_t k = 1; k <= rest && nds < 64; k++)
                if (rest % k == 0) divs[nds++] = k;
            want[i] = divs[u8(r) % (unsigned)nds];
            rest /= want[i];
        }
        want[nd - 1] = rest;
        if (mode == 2) want[u8(r) % (unsigned)nd] = -1;
    }
    vals in[1];
    begin_call(fn, ops, 1, in);
    int len = (int)strlen(ctx);
    len += snprintf(ctx + len, sizeof ctx - (size_t)len, " to");
    for (int i = 0; i < nd; i++)
        len += snprintf(ctx + len, sizeof ctx - (size_t)len, " %lld", (long long)want[i]);
    expect e;
    expect_init(&e, fn, in[0].dt);
    /* one -1 at most, inferred from the others (which may not be 0 then) */
    int infer = -1;
    int64_t known = 1;
    bool ok = true;
    e.sh.nd = nd;
    for (int i = 0; i < nd; i++) {
        e.sh.s[i] = want[i];
        if (want[i] == -1 && infer < 0) infer = i;
        else if (want[i] < 0) ok = false;
        else known *= want[i];
    }
    if (ok && infer >= 0) {
        ok = known != 0 && n % known == 0;
        if (ok) e.sh.s[infer] = n / known;
    }
    ok = ok && numel(&e.sh) == n;
    if (ok && !reshape) ok = viewable(ops[0], n, &e.sh);
    if (ok) expect_gather(&e, &in[0], NULL);
    RUN(p, r, e, ops, 1, in, reshape ? nb_reshape(ops[0], nd, want) : nb_view(ops[0], nd, want));
}

static void op_view(pool *p, reader *r, const char *fn) { view_shape(p, r, fn, false); }
static void op_reshape(pool *p, reader *r, const char *fn) { view_shape(p, r, fn, true); }

/* nb_to: any dtype to any; to I64 truncates (NaN, +-Inf and values out of
 * int64's range are not specified: any result is accepted). To bf16 rounds
 * to nearest even (f64 through f32 first: two roundings), overflow to inf,
 * NaN to 0xffff, checked bit for bit; from bf16 to f32 and f64 is exact, NaN
 * payloads and the sign of 0 kept, checked bit for bit too. The dtype byte:
 * bf16 when its bits 2 and 3 are set, else byte % 4 (the dtypes before bf16,
 * as before it existed). */
static void op_to(pool *p, reader *r, const char *fn) {
    nb_tensor *ops[1] = {pick(p, r)};
    unsigned b = u8(r);
    nb_dtype to = (b & 0x0c) == 0x0c ? NB_BF16 : (nb_dtype)(b % 4);
    vals in[1];
    begin_call(fn, ops, 1, in);
    snprintf(ctx + strlen(ctx), sizeof ctx - strlen(ctx), " to %s", nb_dtype_name(to));
    expect e;
    expect_init(&e, fn, to);
    e.sh = in[0].sh;
    expect_alloc(&e, false);
    e.bitwise = in[0].dt == NB_BF16 && (to == NB_F32 || to == NB_F64);
    for (int64_t i = 0; !e.skip && i < in[0].n; i++) {
        double x = in[0].v[i];
        switch (to) {
        case NB_F32: e.v[i] = round_to(x, NB_F32); break;
        case NB_F64: e.v[i] = x; break;
        case NB_I64: e.v[i] = isfinite(x) && fabs(x) < 9.2e18 ? trunc(x) : NAN; break;
        case NB_BOOL: e.v[i] = x != 0; break;
        case NB_BF16: e.v[i] = round_to(x, NB_BF16); break;
        }
    }
    RUN(p, r, e, ops, 1, in, nb_to(ops[0], to));
}

/* t ^ s, t + s, t * s: the scalar is rounded to the dtype first, as the
 * library's kernels do ((T)s); powf for f32 is within an ulp or so (TOL) */
typedef nb_tensor *scalar_call(nb_tensor *, double);
static void scalar_op(pool *p, reader *r, const char *fn, scalar_call *call,
                      double (*ref)(double, double), int rule) {
    static const double scalars[] = {0, 1, 2, 0.5, -1, 3, -0.5, 2.5, 1e-3, -7.25, 1e39, NAN};
    nb_tensor *ops[1] = {pick(p, r)};
    double sc = scalars[u8(r) % 12];
    vals in[1];
    begin_call(fn, ops, 1, in);
    snprintf(ctx + strlen(ctx), sizeof ctx - strlen(ctx), " scalar %g", sc);
    expect e;
    expect_init(&e, fn, in[0].dt);
    if (float_ok(in[0].dt)) {
        e.sh = in[0].sh;
        expect_alloc(&e, false);
        double s = round_to(sc, e.dt);
        e.rule = rule;
        e.rtol = e.dt == NB_F32 ? 1e-5 : 1e-9;
        for (int64_t i = 0; !e.skip && i < in[0].n; i++) e.v[i] = ref(in[0].v[i], s);
    }
    RUN(p, r, e, ops, 1, in, call(ops[0], sc));
}

/* PyTorch's special exponents (ops/elementwise.c pow_path): sqrt, 1/sqrt,
 * 1/x, x*x, x*x*x, 1/(x*x), which differ from pow at -0 and -inf. */
static double ref_pow(double x, double s) {
    return s == 0.5 ? sqrt(x) : s == -0.5 ? 1 / sqrt(x) : s == -1 ? 1 / x : s == 2 ? x * x
         : s == 3 ? x * x * x : s == -2 ? 1 / (x * x) : pow(x, s);
}
static void op_pow_scalar(pool *p, reader *r, const char *fn) {
    scalar_op(p, r, fn, nb_pow_scalar, ref_pow, TOL);
}
static void op_add_scalar(pool *p, reader *r, const char *fn) {
    scalar_op(p, r, fn, nb_add_scalar, ref_add, EXACT);
}
static void op_mul_scalar(pool *p, reader *r, const char *fn) {
    scalar_op(p, r, fn, nb_mul_scalar, ref_mul, EXACT);
}

/* torch.clamp(t, lo, hi) = min(max(t, lo), hi) with the bounds rounded to the
 * dtype: NaN stays, -0 stays against a +0 bound, lo > hi gives hi; a NaN
 * bound is an error */
static void op_clamp(pool *p, reader *r, const char *fn) {
    static const double bounds[] = {-INFINITY, -1, -0.5, -0.0, 0, 0.25, 0.8, 2, 1e39, INFINITY,
                                    NAN, 1e-3};
    nb_tensor *ops[1] = {pick(p, r)};
    double lo = bounds[u8(r) % 12], hi = bounds[u8(r) % 12];
    vals in[1];
    begin_call(fn, ops, 1, in);
    snprintf(ctx + strlen(ctx), sizeof ctx - strlen(ctx), " lo %g hi %g", lo, hi);
    expect e;
    expect_init(&e, fn, in[0].dt);
    if (float_ok(in[0].dt) && !isnan(lo) && !isnan(hi)) {
        e.sh = in[0].sh;
        expect_alloc(&e, false);
        double l = round_to(lo, e.dt), h = round_to(hi, e.dt);
        for (int64_t i = 0; !e.skip && i < in[0].n; i++) {
            double x = in[0].v[i];
            double v = x < l ? l : x; /* NaN compares false: stays */
            e.v[i] = v > h ? h : v;
        }
    }
    RUN(p, r, e, ops, 1, in, nb_clamp(ops[0], lo, hi));
}

/* index of the first max over dim (NaN counts as the max), any dtype */
static void op_argmax(pool *p, reader *r, const char *fn) {
    nb_tensor *ops[1] = {pick(p, r)};
    int dim = dim_arg(r, nb_ndim(ops[0]));
    bool keep = u8(r) & 1;
    vals in[1];
    begin_call(fn, ops, 1, in);
    snprintf(ctx + strlen(ctx), sizeof ctx - strlen(ctx), " dim %d keepdim %d", dim, keep);
    expect e;
    expect_init(&e, fn, NB_I64);
    const shp *s = &in[0].sh;
    int d = norm_dim(dim, s->nd);
    if (d >= 0 && s->nd == 0) { /* a 0-d zero */
        e.sh.nd = 0;
        expect_alloc(&e, false);
        e.v[0] = 0;
    } else if (d >= 0 && s->s[d] > 0) {
        e.sh.nd = 0;
        for (int i = 0; i < s->nd; i++)
            if (i != d) e.sh.s[e.sh.nd++] = s->s[i];
            else if (keep) e.sh.s[e.sh.nd++] = 1;
        expect_alloc(&e, false);
        int64_t len = s->s[d], inner = 1, outer = 1;
        for (int i = d + 1; i < s->nd; i++) inner *= s->s[i];
        for (int i = 0; i < d; i++) outer *= s->s[i];
        for (int64_t o = 0; !e.skip && o < outer; o++)
            for (int64_t j = 0; j < inner; j++) {
                const double *x = in[0].v + o * len * inner + j;
                int64_t best = 0;
                for (int64_t k = 1; k < len && !isnan(x[best * inner]); k++)
                    if (x[k * inner] > x[best * inner] || isnan(x[k * inner])) best = k;
                e.v[o * inner + j] = (double)best;
            }
    }
    RUN(p, r, e, ops, 1, in, nb_argmax(ops[0], dim, keep));
}

/* ---------------------------------------------------------- sort, topk */
/* a strictly before b in ascending order: NaN is the largest, -0 == +0 */
static bool ref_less(double a, double b) { return !isnan(a) && (isnan(b) || a < b); }

/* sorted along dim (stable, by insertion), the first k kept (k < 0: all) */
static void sort_like(pool *p, reader *r, const char *fn, bool topk) {
    nb_tensor *ops[1] = {pick(p, r)};
    int dim = dim_arg(r, nb_ndim(ops[0]));
    unsigned b = u8(r);
    bool desc = b & 1;
    int64_t k = topk ? (int64_t)(b >> 1) % 9 - 1 : 0; /* -1..7: sometimes out of range */
    vals in[1];
    begin_call(fn, ops, 1, in);
    snprintf(ctx + strlen(ctx), sizeof ctx - strlen(ctx), " dim %d desc %d k %lld", dim, desc,
             (long long)k);
    expect e;
    expect_init(&e, fn, in[0].dt);
    const shp *s = &in[0].sh;
    int d = norm_dim(dim, s->nd);
    int64_t len = s->nd ? (d >= 0 ? s->s[d] : 0) : 1;
    if (!topk) k = len;
    if (float_ok(in[0].dt) && d >= 0 && k >= 0 && k <= len) {
        e.sh = *s;
        if (s->nd) e.sh.s[d] = k;
        expect_alloc(&e, false);
        int64_t inner = 1, outer = 1;
        for (int i = d + 1; i < s->nd; i++) inner *= s->s[i];
        for (int i = 0; i < d && i < s->nd; i++) outer *= s->s[i];
        double *row = malloc((size_t)(len + 1) * sizeof *row);
        if (!row) abort();
        for (int64_t o = 0; !e.skip && o < outer; o++)
            for (int64_t j = 0; j < inner; j++) {
                int64_t m = 0;
                for (int64_t q = 0; q < len; q++) {
                    double v = in[0].v[o * len * inner + q * inner + j];
                    int64_t at = m++;
                    while (at > 0 && (desc ? ref_less(row[at - 1], v) : ref_less(v, row[at - 1])))
                        row[at] = row[at - 1], at--;
                    row[at] = v;
                }
                for (int64_t q = 0; q < (s->nd ? k : 1); q++)
                    e.v[o * k * inner + q * inner + j] = row[q];
            }
        free(row);
    }
    if (topk) RUN(p, r, e, ops, 1, in, nb_topk(ops[0], k, dim, desc, true, NULL));
    else RUN(p, r, e, ops, 1, in, nb_sort(ops[0], dim, desc, NULL));
}

static void op_sort(pool *p, reader *r, const char *fn) { sort_like(p, r, fn, false); }
static void op_topk(pool *p, reader *r, const char *fn) { sort_like(p, r, fn, true); }

/* ------------------------------------------------------------------ conv */
/* torch.nn.functional.conv2d / conv1d without bias (the registry's calls),
 * stride, padding (0..2 or "same"), dilation and groups from the bytes:
 * validity as ops/conv.c checks it (x (N,C,H,W) or (C,H,W), 1-d (N,C,L) or
 * (C,L); w (O,C/G,KH,KW); kernel sizes >= 1; the dilated kernel within the
 * padded input; "same" only with stride 1); values the direct sum, padded
 * positions as 0 * w so that NaN and Inf land where im2col puts them. */
static void conv_like(pool *p, reader *r, const char *fn, bool one_d) {
    nb_tensor *ops[2];
    pick_n(p, r, ops, 2);
    unsigned b1 = u8(r), b2 = one_d ? b1 : u8(r);
    int64_t st[2] = {1 + (b1 & 1), 1 + (b2 & 1)}, dl[2] = {1 + ((b1 >> 1) & 1), 1 + ((b2 >> 1) & 1)};
    int64_t pd[2] = {(b1 >> 2) % 4, (b2 >> 2) % 4}, groups = 1 + (b1 >> 4) % 3;
    bool same = pd[0] == 3;
    if (one_d) st[0] = dl[0] = 1, pd[0] = 0; /* the 2-d form's H: 1, unpadded */
    if (same) pd[0] = pd[1] = 0;
    vals in[2];
    begin_call(fn, ops, 2, in);
    snprintf(ctx + strlen(ctx), sizeof ctx - strlen(ctx),
             " stride %lld,%lld pad %s%lld,%lld dil %lld,%lld groups %lld", (long long)st[0],
             (long long)st[1], same ? "same " : "", (long long)pd[0], (long long)pd[1],
             (long long)dl[0], (long long)dl[1], (long long)groups);
    expect e;
    expect_init(&e, fn, in[0].dt);
    const shp *xs = &in[0].sh, *ws = &in[1].sh;
    int xd = one_d ? 2 : 3; /* unbatched rank */
    bool ok = float_ok(in[0].dt) && in[0].dt == in[1].dt && (xs->nd == xd || xs->nd == xd + 1) &&
              ws->nd == xd + 1;
    int64_t N = 1, C = 0, H = 1, W = 0, O = 0, KH = 1, KW = 0, OH = 0, OW = 0, ph = 0, pw = 0;
    if (ok) {
        bool bat = xs->nd == xd + 1;
        N = bat ? xs->s[0] : 1;
        C = xs->s[bat];
        H = one_d ? 1 : xs->s[bat + 1];
        W = xs->s[xs->nd - 1];
        O = ws->s[0];
        KH = one_d ? 1 : ws->s[2];
        KW = ws->s[ws->nd - 1];
        ok = KH >= 1 && KW >= 1 && C % groups == 0 && O % groups == 0 && ws->s[1] * groups == C &&
             (!same || (st[0] == 1 && st[1] == 1));
        int64_t in2[2] = {H, W}, k2[2] = {KH, KW}, out2[2] = {0, 0}, lead[2] = {0, 0};
        for (int k = 0; ok && k < 2; k++) {
            int64_t span = dl[k] * (k2[k] - 1) + 1, tot = same ? span - 1 : 2 * pd[k];
            lead[k] = same ? tot / 2 : pd[k];
            ok = in2[k] + tot >= span;
            out2[k] = ok ? (in2[k] + tot - span) / st[k] + 1 : 0;
        }
        OH = out2[0], OW = out2[1], ph = lead[0], pw = lead[1];
        if (ok) {
            e.sh.nd = 0;
            if (bat) e.sh.s[e.sh.nd++] = N;
            e.sh.s[e.sh.nd++] = O;
            if (!one_d) e.sh.s[e.sh.nd++] = OH;
            e.sh.s[e.sh.nd++] = OW;
        }
    }
    if (ok) {
        expect_alloc(&e, true);
        e.rule = TOL;
        int64_t Cg = C / groups, Og = groups ? O / groups : 0;
        e.rtol = acc_rtol(e.dt, Cg * KH * KW);
        double big = e.dt == NB_F64 ? 1e150 : 1e15;
        for (int k = 0; k < 2; k++)
            for (int64_t i = 0; i < in[k].n; i++)
                if (isfinite(in[k].v[i]) && fabs(in[k].v[i]) > big) e.rule = NOVALS;
        /* An f32 conv Winograd computes (ops/conv_winograd.c) is exact only
         * up to the magnitudes of its 2x2 tile's whole (K+1)^2 input patch
         * (its transforms mix every pixel of it): the tolerance scales with
         * the patch's sum of |x| times o's largest |w| there (measured: the
         * error stays below 6e-6 of it with 1e8 pixels beside N(0,1) ones). */
        nbi_wino_geom wg = {N, C, H, W, O, KH, OH, OW, ph, pw};
        bool wino = !one_d && e.dt == NB_F32 && groups == 1 && st[0] == 1 && st[1] == 1 &&
                    dl[0] == 1 && dl[1] == 1 && KH == KW && nbi_wino_enabled() &&
                    nbi_wino_fits(&wg);
        for (int64_t n = 0; !e.skip && n < N; n++)
            for (int64_t o = 0; o < O; o++)
                for (int64_t oh = 0; oh < OH; oh++)
                    for (int64_t ow = 0; ow < OW; ow++) {
                        double sum = 0, mag = 0, patch = 0, wmax = 0;
                        for (int64_t c = 0; wino && c < C; c++) {
                            for (int64_t k = 0; k < KH * KW; k++)
                                wmax = fmax(wmax, fabs(in[1].v[(o * C + c) * KH * KW + k]));
                            for (int64_t a = 0; a <= KH; a++)
                                for (int64_t b = 0; b <= KW; b++) {
                                    int64_t ih = oh / 2 * 2 - ph + a, iw = ow / 2 * 2 - pw + b;
                                    if (ih >= 0 && ih < H && iw >= 0 && iw < W)
                                        patch += fabs(in[0].v[((n * C + c) * H + ih) * W + iw]);
                                }
                        }
                        int64_t grp = o / Og;
                        for (int64_t c = 0; c < Cg; c++)
                            for (int64_t kh = 0; kh < KH; kh++)
                                for (int64_t kw = 0; kw < KW; kw++) {
                                    int64_t ih = oh * st[0] - ph + kh * dl[0];
                                    int64_t iw = ow * st[1] - pw + kw * dl[1];
                                    double wv = in[1].v[((o * Cg + c) * KH + kh) * KW + kw];
                                    double xv = ih >= 0 && ih < H && iw >= 0 && iw < W
                                                    ? in[0].v[((n * C + grp * Cg + c) * H + ih) * W + iw]
                                                    : 0.0;
                                    sum += xv * wv;
                                    mag += fabs(xv * wv);
                                }
                        int64_t at = ((n * O + o) * OH + oh) * OW + ow;
                        e.v[at] = sum;
                        e.mag[at] = fmax(mag, patch * wmax);
                    }
    }
    if (one_d)
        RUN(p, r, e, ops, 2, in,
            nb_conv1d(ops[0], ops[1], NULL, st[1], same ? NB_PADDING_SAME : pd[1], dl[1], groups));
    else
        RUN(p, r, e, ops, 2, in,
            nb_conv2d(ops[0], ops[1], NULL, st, same ? (const int64_t[]){NB_PADDING_SAME, 0} : pd,
                      dl, groups));
}

static void op_conv2d(pool *p, reader *r, const char *fn) { conv_like(p, r, fn, false); }
static void op_conv1d(pool *p, reader *r, const char *fn) { conv_like(p, r, fn, true); }

/* a view with no history that does not require grad */
static void op_detach(pool *p, reader *r, const char *fn) {
    nb_tensor *ops[1] = {pick(p, r)};
    vals in[1];
    begin_call(fn, ops, 1, in);
    expect e;
    expect_init(&e, fn, in[0].dt);
    e.sh = in[0].sh;
    expect_gather(&e, &in[0], NULL);
    bf16_rule(&e, in, 1);
    if (!e.skip) {
        nb_clear_error();
        nb_tensor *res = nb_detach(ops[0]);
        if (res && (nb_requires_grad(res) || !nb_is_leaf(res)))
            fail("%s gave a tensor that requires grad or has history", fn);
        check_call(p, r, &e, res, ops, 1, in);
    }
    end_call(in, 1, &e);
}

/* nb_set_requires_grad(t, true): a floating leaf starts requiring grad (and
 * joins the leaves whose gradients are checked); a non-leaf (which requires
 * grad already) is returned as it is; other dtypes are refused. Not added to
 * the pool again (it is the same tensor). */
static void op_requires_grad(pool *p, reader *r, const char *fn) {
    nb_tensor *t = pick(p, r);
    snprintf(ctx, sizeof ctx, "%s on %s%s", fn, nb_dtype_name(nb_dtype_of(t)),
             nb_is_leaf(t) ? " (leaf)" : "");
    bool was = nb_requires_grad(t), leaf = nb_is_leaf(t);
    nb_clear_error();
    nb_tensor *res = nb_set_requires_grad(t, true);
    if (!is_float(nb_dtype_of(t))) {
        const char *msg = nb_last_error();
        size_t len = strlen(fn);
        if (res) fail("a %s tensor was made to require grad", nb_dtype_name(nb_dtype_of(t)));
        if (!msg || strncmp(msg, fn, len) || msg[len] != ':') fail("message not named");
        nb_clear_error();
        count(REFUSED);
        return;
    }
    if (res != t || !nb_requires_grad(t)) fail("a floating tensor does not require grad");
    if (leaf && !was && p->nleaves < MAX_LEAVES) p->leaves[p->nleaves++] = t;
    count(SUCCEEDED);
    if (nb_dtype_of(t) == NB_BF16) count(BF16);
}

/* nb_autocast_begin / nb_autocast_end, by a byte: 0 opens a bf16 region, 1
 * a plain one (NB_F32) inside, 2 ends the innermost, 3 asks for a dtype that
 * is refused (f64, i64, bool). Ending with none open is refused. The model's
 * stack (pool.ac) must agree with nb_autocast_dtype after each; the program's
 * end closes what it left open. */
static void op_autocast(pool *p, reader *r, const char *fn) {
    (void)fn;
    static const nb_dtype bad[] = {NB_F64, NB_I64, NB_BOOL};
    unsigned b = u8(r), mode = b % 4;
    nb_dtype dt = mode == 0 ? NB_BF16 : mode == 1 ? NB_F32 : bad[(b >> 2) % 3];
    const char *name = mode == 2 ? "nb_autocast_end" : "nb_autocast_begin";
    snprintf(ctx, sizeof ctx, "%s %s (%d regions open)", name, mode == 2 ? "" : nb_dtype_name(dt),
             p->nac);
    bool ok = mode == 2 ? p->nac > 0 : mode < 2; /* at most MAX_OPS deep: below the limit */
    nb_clear_error();
    int rc = mode == 2 ? nb_autocast_end() : nb_autocast_begin(dt);
    if (verbose) fprintf(stderr, "fuzz_ops: %s -> %d\n", ctx, rc);
    if (ok != (rc == 0)) fail("returned %d", rc);
    if (rc) {
        const char *msg = nb_last_error();
        size_t len = strlen(name);
        if (rc != -1 || !msg || strncmp(msg, name, len) || msg[len] != ':')
            fail("a refusal that is not -1 with a message starting \"%s:\"", name);
        nb_clear_error();
        count(REFUSED);
    } else {
        if (mode == 2) p->nac--;
        else p->ac[p->nac++] = dt;
        count(SUCCEEDED);
    }
    nb_dtype want = autocast_bf16(p) ? NB_BF16 : NB_F32;
    if (nb_autocast_dtype() != want)
        fail("nb_autocast_dtype() is %s, the model's %s", nb_dtype_name(nb_autocast_dtype()),
             nb_dtype_name(want));
}

/* ------------------------------------------------------------- dropout */
/* nb_dropout on its own generator seeded from the program (or the global
 * one, seeded): exactly t when !training or p == 0, zeros when p == 1, else
 * each element is +0 or x * scale, with scale = 1/(1-p) computed in t's
 * dtype as ops/dropout.c does. The same seed gives the same bits, and the
 * generator advances by numel when the call draws (0 < p < 1, training),
 * else not at all (ops/dropout.c). The mask itself is not recomputed here:
 * it is tensor/rng.c's hash, which a copy would only repeat. */
static nb_tensor *dropout_seeded(nb_tensor *t, double prob, bool training, unsigned seed,
                                 nb_rng *own, uint64_t *offset) {
    nb_clear_error();
    nb_rng *g = own ? own : nb_global_rng();
    if (own) nb_rng_seed(own, seed);
    else nb_manual_seed(seed);
    nb_tensor *res = nb_dropout(t, prob, training, own);
    *offset = g->offset;
    return res;
}

/* Every element of got is +0 (dropped) or x * scale in the dtype (kept). */
static void check_dropped_or_scaled(const vals *x, const vals *got, double prob) {
    double scale = x->dt == NB_F32 ? (double)(1.0f / (float)(1.0 - prob)) : 1.0 / (1.0 - prob);
    for (int64_t i = 0; i < got->n; i++) {
        /* f32: the double product of two floats is exact, rounded once like the float one */
        double k = round_to(x->v[i] * scale, x->dt), l = got->v[i];
        double d = x->v[i] * 0.0; /* dropped, as PyTorch's x * mask: NaN for inf, -0 for x < 0 */
        bool kept = isnan(k) ? isnan(l) : l == k && signbit(l) == signbit(k);
        bool dropped = isnan(d) ? isnan(l) : l == 0 && signbit(l) == signbit(d);
        if (!kept && !dropped)
            fail("element %lld is %.17g: neither x * 0 = %g nor x * scale = %.17g (x %.17g)",
                 (long long)i, l, d, k, x->v[i]);
    }
}

/* The call again with the same seed: the same bits, the same generator offset. */
static void check_same_seed(nb_tensor *t, nb_tensor *res, double prob, bool training,
                            unsigned seed, bool global, uint64_t offset) {
    nb_rng own2;
    uint64_t offset2;
    nb_tensor *again = dropout_seeded(t, prob, training, seed, global ? NULL : &own2, &offset2);
    if (!again) fail("the same call with the same seed failed");
    vals a = read_tensor(res), b = read_tensor(again);
    if (!same_shape(&a.sh, &b.sh) || memcmp(a.v, b.v, (size_t)a.n * sizeof *a.v))
        fail("the same seed gave another result");
    if (offset2 != offset) fail("generator offsets %llu and %llu", (unsigned long long)offset,
                                (unsigned long long)offset2);
    vals_free(&a);
    vals_free(&b);
}

static void op_dropout(pool *p, reader *r, const char *fn) {
    static const double probs[] = {0, 0.25, 0.5, 0.9, 1, 1e-3, -0.5, NAN};
    nb_tensor *ops[1] = {pick(p, r)};
    double prob = probs[u8(r) % 8];
    unsigned mode = u8(r), seed = u8(r);
    bool training = mode % 4 != 3, global = mode & 4;
    vals in[1];
    begin_call(fn, ops, 1, in);
    snprintf(ctx + strlen(ctx), sizeof ctx - strlen(ctx), " p %g training %d seed %u%s", prob,
             training, seed, global ? " (global generator)" : "");
    expect e;
    expect_init(&e, fn, in[0].dt);
    bool draws = training && prob > 0 && prob < 1;
    if (float_ok(in[0].dt) && prob >= 0 && prob <= 1) {
        e.sh = in[0].sh;
        expect_alloc(&e, false);
        bool zeros = training && prob == 1;
        for (int64_t i = 0; !e.skip && i < in[0].n; i++)
            e.v[i] = zeros ? in[0].v[i] * 0.0 : in[0].v[i];
        if (draws) e.rule = NOVALS; /* checked by check_dropped_or_scaled */
    }
    bf16_rule(&e, in, 1);
    if (!e.skip) {
        nb_rng own, *rng = global ? NULL : &own;
        uint64_t offset;
        nb_tensor *res = dropout_seeded(ops[0], prob, training, seed, rng, &offset);
        if (res && e.ok) {
            if (offset != (draws ? (uint64_t)in[0].n : 0)) /* seeding restarts it at 0 */
                fail("the generator advanced to offset %llu", (unsigned long long)offset);
            if (draws) {
                vals got = read_tensor(res);
                check_dropped_or_scaled(&in[0], &got, prob);
                vals_free(&got);
            }
            check_same_seed(ops[0], res, prob, training, seed, global, offset);
        }
        check_call(p, r, &e, res, ops, 1, in);
    }
    end_call(in, 1, &e);
}

/* ---------------------------------------------------------- multinomial */
/* nb_multinomial on its own generator seeded from the program: validity as
 * torch.multinomial (1-d or 2-d floating weights, finite, >= 0, each row
 * summing above 0, num_samples >= 1 and, without replacement, no more than
 * the nonzero weights of any row); the draws are checked for support:
 * indices in range, of positive weight, unrepeated in a row without
 * replacement, and the same seed repeats them. */
/* nb_batch_norm in training without running statistics (the registry's
 * call; the running ones are tests/test_batchnorm.c's): x (N, C, ...), weight
 * and bias (C), one dtype; more than one value per channel. Two-pass
 * statistics in double; the tolerance is relative to |x - mean| invstd |w| + |b|. */
static void op_batch_norm(pool *p, reader *r, const char *fn) {
    nb_tensor *ops[3];
    pick_n(p, r, ops, 3);
    vals in[3];
    begin_call(fn, ops, 3, in);
    expect e;
    expect_init(&e, fn, in[0].dt);
    const shp *s = &in[0].sh;
    bool ok = float_ok(in[0].dt) && s->nd >= 2;
    int64_t n = ok ? s->s[0] : 0, c = ok ? s->s[1] : 0, rest = 1;
    for (int d = 2; ok && d < s->nd; d++) rest *= s->s[d];
    for (int k = 1; ok && k < 3; k++)
        ok = in[k].dt == in[0].dt && in[k].sh.nd == 1 && in[k].sh.s[0] == c;
    ok = ok && n * rest > 1;
    if (ok) {
        e.sh = *s;
        expect_alloc(&e, true);
        e.rule = TOL;
        e.rtol = acc_rtol(e.dt, n * rest);
        for (int64_t ch = 0; !e.skip && ch < c; ch++) {
            double sum = 0, m2 = 0, m = (double)(n * rest);
            for (int64_t i = 0; i < n; i++)
                for (int64_t j = 0; j < rest; j++) sum += in[0].v[(i * c + ch) * rest + j];
            double mean = sum / m;
            for (int64_t i = 0; i < n; i++)
                for (int64_t j = 0; j < rest; j++) {
                    double dv = in[0].v[(i * c + ch) * rest + j] - mean;
                    m2 += dv * dv;
                }
            double is = 1 / sqrt(m2 / m + 1e-5), w = in[1].v[ch], b = in[2].v[ch];
            for (int64_t i = 0; i < n; i++)
                for (int64_t j = 0; j < rest; j++) {
                    int64_t at = (i * c + ch) * rest + j;
                    double x = in[0].v[at];
                    e.v[at] = (x - mean) * is * w + b;
                    e.mag[at] = (fabs(x) + fabs(mean)) * is * fabs(w) + fabs(b);
                }
        }
    }
    RUN(p, r, e, ops, 3, in, nb_batch_norm(ops[0], NULL, NULL, ops[1], ops[2], true, 0.1, 1e-5));
}

/* the losses: an argument byte picks the reduction (mean, sum, none) */
static void loss_reduce(expect *e, const shp *s, const double *l, const double *mag,
                        int red) {
    int64_t n = numel(s);
    if (red == NB_REDUCTION_NONE) {
        e->sh = *s;
        expect_alloc(e, true);
        for (int64_t i = 0; !e->skip && i < n; i++) e->v[i] = l[i], e->mag[i] = mag[i];
    } else {
        e->sh.nd = 0;
        expect_alloc(e, true);
        double acc = 0, m = 0;
        for (int64_t i = 0; i < n; i++) acc += l[i], m += mag[i];
        e->v[0] = red == NB_REDUCTION_MEAN ? acc / (double)n : acc;
        e->mag[0] = red == NB_REDUCTION_MEAN ? m / (double)n : m;
    }
    e->rule = TOL;
    e->rtol = acc_rtol(e->dt, n);
}

/* (x - y)^2: one dtype, one shape */
static void op_mse_loss(pool *p, reader *r, const char *fn) {
    nb_tensor *ops[2];
    pick_n(p, r, ops, 2);
    int red = (int)(u8(r) % 3);
    vals in[2];
    begin_call(fn, ops, 2, in);
    snprintf(ctx + strlen(ctx), sizeof ctx - strlen(ctx), " reduction %d", red);
    expect e;
    expect_init(&e, fn, in[0].dt);
    if (float_ok(in[0].dt) && in[1].dt == in[0].dt && same_shape(&in[0].sh, &in[1].sh)) {
        int64_t n = in[0].n;
        double *l = calloc((size_t)(n ? n : 1), sizeof *l);
        if (!l) abort();
        for (int64_t i = 0; i < n; i++) {
            double d = round_to(in[0].v[i] - in[1].v[i], in[0].dt);
            l[i] = d * d;
        }
        loss_reduce(&e, &in[0].sh, l, l, red);
        free(l);
    }
    RUN(p, r, e, ops, 2, in, nb_mse_loss(ops[0], ops[1], (nb_reduction)red));
}

/* (1 - y) x + (1 + (pw - 1) y) softplus(-x): pw broadcasts to x */
static void op_binary_cross_entropy_with_logits(pool *p, reader *r, const char *fn) {
    nb_tensor *ops[3];
    pick_n(p, r, ops, 3);
    int red = (int)(u8(r) % 3);
    vals in[3];
    begin_call(fn, ops, 3, in);
    snprintf(ctx + strlen(ctx), sizeof ctx - strlen(ctx), " reduction %d", red);
    expect e;
    expect_init(&e, fn, in[0].dt);
    const shp *s = &in[0].sh;
    shp b;
    bool ok = float_ok(in[0].dt) && in[1].dt == in[0].dt && in[2].dt == in[0].dt &&
              same_shape(s, &in[1].sh) && bcast(s, &in[2].sh, &b) && same_shape(s, &b);
    if (ok) {
        int64_t n = in[0].n;
        double *l = calloc((size_t)(n ? n : 1), sizeof *l), *mag = calloc((size_t)(n ? n : 1), sizeof *mag);
        if (!l || !mag) abort();
        int64_t idx[NB_MAX_DIMS] = {0}, i = 0;
        if (n) do {
            double x = in[0].v[i], y = in[1].v[i], pw = in[2].v[bcast_flat(s, idx, &in[2].sh)];
            double sp = log1p(exp(-fabs(x))) + (x < 0 ? -x : 0), lw = 1 + (pw - 1) * y;
            l[i] = (1 - y) * x + lw * sp;
            mag[i] = fabs((1 - y) * x) + fabs(lw * sp) + fabs((pw - 1) * y * sp);
            i++;
        } while (next_index(idx, s));
        loss_reduce(&e, s, l, mag, red);
        free(l);
        free(mag);
    }
    RUN(p, r, e, ops, 3, in,
        nb_binary_cross_entropy_with_logits(ops[0], ops[1], NULL, ops[2], (nb_reduction)red));
}

static void op_multinomial(pool *p, reader *r, const char *fn) {
    nb_tensor *ops[1] = {pick(p, r)};
    unsigned b = u8(r), seed = u8(r);
    int64_t k = (int64_t)(b % 7); /* 0 is refused */
    bool repl = b & 8;
    vals in[1];
    begin_call(fn, ops, 1, in);
    snprintf(ctx + strlen(ctx), sizeof ctx - strlen(ctx), " num_samples %lld replacement %d",
             (long long)k, repl);
    expect e;
    expect_init(&e, fn, NB_I64);
    const shp *s = &in[0].sh;
    bool ok = float_ok(in[0].dt) && (s->nd == 1 || s->nd == 2) && k >= 1;
    int64_t rows = ok && s->nd == 2 ? s->s[0] : 1, n = ok ? s->s[s->nd - 1] : 0;
    if (ok && !repl && k > n) ok = false;
    for (int64_t row = 0; ok && row < rows; row++) {
        double total = 0;
        int64_t nonzero = 0;
        for (int64_t i = 0; ok && i < n; i++) {
            double v = in[0].v[row * n + i];
            ok = isfinite(v) && v >= 0;
            total += v;
            nonzero += v > 0;
        }
        ok = ok && total > 0 && (repl || k <= nonzero);
    }
    if (ok) {
        e.sh.nd = s->nd;
        e.sh.s[0] = s->nd == 2 ? rows : k;
        e.sh.s[1] = k;
        expect_alloc(&e, false);
        e.rule = NOVALS;
    }
    bf16_rule(&e, in, 1);
    if (!e.skip) {
        nb_rng own;
        nb_rng_seed(&own, seed);
        nb_clear_error();
        nb_tensor *res = nb_multinomial(ops[0], k, repl, &own);
        if (res && e.ok) {
            vals got = read_tensor(res);
            for (int64_t i = 0; i < got.n; i++) {
                int64_t row = i / k, c = (int64_t)got.v[i];
                if (c < 0 || c >= n || !(in[0].v[row * n + c] > 0))
                    fail("draw %lld is category %lld", (long long)i, (long long)c);
                for (int64_t j = row * k; !repl && j < i; j++)
                    if (got.v[j] == got.v[i]) fail("draw %lld repeats category %lld", (long long)i,
                                                   (long long)c);
            }
            if (own.offset != (uint64_t)got.n) fail("the generator advanced to %llu",
                                                     (unsigned long long)own.offset);
            nb_rng again;
            nb_rng_seed(&again, seed);
            nb_tensor *res2 = nb_multinomial(ops[0], k, repl, &again);
            if (!res2) fail("the same call with the same seed failed");
            vals got2 = read_tensor(res2);
            if (memcmp(got.v, got2.v, (size_t)got.n * sizeof *got.v))
                fail("the same seed gave other draws");
            vals_free(&got);
            vals_free(&got2);
        }
        check_call(p, r, &e, res, ops, 1, in);
    }
    end_call(in, 1, &e);
}

/* ------------------------------------------------------ gather, index_select */
/* The index operand, by a mode byte: 0 takes one from the pool (any dtype
 * and shape: mostly refused); else a new I64 tensor from the program's
 * bytes, of a valid shape for t and dim d (gather: t's ndim and no larger
 * outside d; index_select: 1-d) with values in range (mode 1) or in
 * -1 .. size+1, some out of range (mode 2), or of any shape (mode 3, or d
 * invalid). */
static nb_tensor *index_arg(pool *p, reader *r, const shp *t, int d, bool select) {
    unsigned mode = u8(r) % 4;
    if (mode == 0) return pick(p, r);
    int64_t size = d >= 0 && t->nd ? t->s[d] : 2;
    shp s = {.nd = select ? 1 : t->nd};
    if (mode == 3 || d < 0) s.nd = (int)(u8(r) % 5);
    for (int i = 0; i < s.nd; i++) {
        unsigned most = mode == 3 || d < 0 ? 5 : select || i == d ? 4 : (unsigned)t->s[i];
        s.s[i] = (int64_t)(u8(r) % (most + 1));
    }
    int64_t n = numel(&s), *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    if (!v) abort();
    for (int64_t i = 0; i < n; i++) {
        unsigned b = u8(r);
        v[i] = mode == 1 && size > 0 ? (int64_t)(b % (unsigned)size)
                                     : (int64_t)(b % (unsigned)(size + 3)) - 1;
    }
    nb_tensor *idx = nb_from_data(NB_I64, s.nd, s.s, v);
    free(v);
    if (!idx) fail("could not make an index tensor");
    return idx;
}

/* Row-major positions in t of out's elements, where out's coordinate at d
 * is replaced by an index value: index[i] for gather (index has out's
 * shape), index[coordinate d] for index_select. NULL when out is too big. */
static int64_t *picked(const shp *out, const shp *t, int d, const double *index, bool select) {
    int64_t n = numel(out);
    if (n > MAX_NUMEL) return NULL;
    int64_t *src = malloc((size_t)(n ? n : 1) * sizeof *src);
    if (!src) abort();
    if (n == 0) return src;
    int64_t idx[NB_MAX_DIMS] = {0}, i = 0;
    do {
        int64_t f = 0;
        for (int j = 0; j < t->nd; j++)
            f = f * t->s[j] + (j != d ? idx[j] : (int64_t)index[select ? idx[d] : i]);
        src[i++] = f;
    } while (next_index(idx, out));
    return src;
}

/* Valid: t not 0-d, dim in range, an I64 index (gather: t's ndim, no larger
 * than t outside dim; index_select: 1-d) whose values are in [0, size at dim).
 * Any dtype of t; the result has t's. */
static void pick_op(pool *p, reader *r, const char *fn, bool select) {
    nb_tensor *ops[2] = {pick(p, r), NULL};
    int nd = nb_ndim(ops[0]), dim = dim_arg(r, nd), d = nd ? norm_dim(dim, nd) : -1;
    shp ts = {.nd = nd};
    memcpy(ts.s, nb_shape(ops[0]), (size_t)nd * sizeof(int64_t));
    ops[1] = index_arg(p, r, &ts, d, select);
    vals in[2];
    begin_call(fn, ops, 2, in);
    snprintf(ctx + strlen(ctx), sizeof ctx - strlen(ctx), " dim %d", dim);
    expect e;
    expect_init(&e, fn, in[0].dt);
    const shp *is = &in[1].sh;
    bool ok = d >= 0 && in[1].dt == NB_I64 && is->nd == (select ? 1 : nd);
    for (int i = 0; ok && !select && i < nd; i++) ok = i == d || is->s[i] <= ts.s[i];
    for (int64_t i = 0; ok && i < in[1].n; i++) ok = in[1].v[i] >= 0 && in[1].v[i] < ts.s[d];
    if (ok) {
        e.sh = select ? ts : *is;
        if (select) e.sh.s[d] = is->s[0];
        int64_t *src = picked(&e.sh, &ts, d, in[1].v, select);
        expect_gather(&e, &in[0], src);
        free(src);
    }
    RUN(p, r, e, ops, 2, in,
        select ? nb_index_select(ops[0], dim, ops[1]) : nb_gather(ops[0], dim, ops[1]));
}

static void op_gather(pool *p, reader *r, const char *fn) { pick_op(p, r, fn, false); }
static void op_index_select(pool *p, reader *r, const char *fn) { pick_op(p, r, fn, true); }

/* Pooling (ops/pool.c): kernel 0-3, stride 0-3 (a stride of 0 is the
 * kernel's, in 1-d and per dim in 2-d; 2-d: a stride of 0 in h is passed as
 * stride NULL, the kernel's in both dims), padding 0-2. Valid as
 * torch: floating, (N,)C,H,W (1-d: (N,)C,L) with only N empty, kernel and
 * stride > 0, padding <= kernel / 2, a window that fits the padded input.
 * Max: torch's scan from -inf (greater or NaN replaces), exact; avg: the
 * window's sum over its count (padding counted when count_include_pad). */
enum { POOL_MAX2D, POOL_AVG2D, POOL_MAX1D };
static void pool_op(pool *p, reader *r, const char *fn, int kind) {
    nb_tensor *ops[1] = {pick(p, r)};
    unsigned b = u8(r), c = u8(r);
    bool one = kind == POOL_MAX1D, cip = (c / 9) & 1;
    int64_t k[2] = {b % 4, (b / 4) % 4}, s[2] = {(b / 16) % 4, (b / 64) % 4};
    int64_t pd[2] = {c % 3, (c / 3) % 3};
    bool snull = !one && s[0] == 0;
    vals in[1];
    begin_call(fn, ops, 1, in);
    snprintf(ctx + strlen(ctx), sizeof ctx - strlen(ctx), " k %lld,%lld s %lld,%lld p %lld,%lld",
             (long long)k[0], (long long)k[1], (long long)s[0], (long long)s[1],
             (long long)pd[0], (long long)pd[1]);
    /* the arguments as (h, w); 1-d: h is a dim of size 1 */
    int64_t K[2] = {one ? 1 : k[0], k[1]}, P[2] = {one ? 0 : pd[0], pd[1]};
    int64_t S[2] = {one ? 1 : s[0] == 0 ? k[0] : s[0], s[1] == 0 || snull ? k[1] : s[1]};
    expect e;
    expect_init(&e, fn, in[0].dt);
    const shp *sh = &in[0].sh;
    int want = one ? 2 : 3;
    bool ok = float_ok(in[0].dt) && (sh->nd == want || sh->nd == want + 1);
    for (int i = sh->nd - want; ok && i < sh->nd; i++) ok = sh->s[i] > 0;
    int64_t H = ok && !one ? sh->s[sh->nd - 2] : 1, W = ok ? sh->s[sh->nd - 1] : 1, O[2];
    int64_t in_hw[2] = {H, W};
    for (int d = 0; ok && d < 2; d++) {
        ok = K[d] > 0 && S[d] > 0 && P[d] <= K[d] / 2 && in_hw[d] + 2 * P[d] >= K[d];
        O[d] = ok ? (in_hw[d] + 2 * P[d] - K[d]) / S[d] + 1 : 0;
    }
    if (ok) {
        e.sh = *sh;
        e.sh.s[sh->nd - 1] = O[1];
        if (!one) e.sh.s[sh->nd - 2] = O[0];
        expect_alloc(&e, kind == POOL_AVG2D);
        if (kind == POOL_AVG2D) {
            e.rule = TOL;
            e.rtol = e.dt == NB_F32 ? 2e-6 : 1e-12;
        }
        int64_t planes = in[0].n / (H * W);
        for (int64_t q = 0; !e.skip && q < planes; q++)
            for (int64_t oh = 0; oh < O[0]; oh++)
                for (int64_t ow = 0; ow < O[1]; ow++) {
                    int64_t h0 = oh * S[0] - P[0], w0 = ow * S[1] - P[1];
                    int64_t h1 = h0 + K[0] < H + P[0] ? h0 + K[0] : H + P[0];
                    int64_t w1 = w0 + K[1] < W + P[1] ? w0 + K[1] : W + P[1];
                    int64_t padded = (h1 - h0) * (w1 - w0);
                    h0 = h0 < 0 ? 0 : h0, w0 = w0 < 0 ? 0 : w0;
                    h1 = h1 > H ? H : h1, w1 = w1 > W ? W : w1;
                    double m = -INFINITY, sum = 0, mag = 0;
                    for (int64_t h = h0; h < h1; h++)
                        for (int64_t w = w0; w < w1; w++) {
                            double v = in[0].v[q * H * W + h * W + w];
                            if (v > m || v != v) m = v;
                            sum += v, mag += fabs(v);
                        }
                    int64_t at = (q * O[0] + oh) * O[1] + ow;
                    double count = (double)(cip ? padded : (h1 - h0) * (w1 - w0));
                    e.v[at] = kind == POOL_AVG2D ? sum / count : m;
                    if (e.mag) e.mag[at] = mag / count;
                }
    }
    const int64_t kk[2] = {k[0], k[1]}, ss[2] = {s[0], s[1]}, pp[2] = {pd[0], pd[1]};
    RUN(p, r, e, ops, 1, in,
        kind == POOL_MAX1D   ? nb_max_pool1d(ops[0], k[1], s[1], pd[1])
        : kind == POOL_MAX2D ? nb_max_pool2d(ops[0], kk, snull ? NULL : ss, pp)
                             : nb_avg_pool2d(ops[0], kk, snull ? NULL : ss, pp, cip));
}
static void op_max_pool2d(pool *p, reader *r, const char *fn) { pool_op(p, r, fn, POOL_MAX2D); }
static void op_avg_pool2d(pool *p, reader *r, const char *fn) { pool_op(p, r, fn, POOL_AVG2D); }
static void op_max_pool1d(pool *p, reader *r, const char *fn) { pool_op(p, r, fn, POOL_MAX1D); }

/* ------------------------------------------------------------- the program */
/* The decoder of each opcode: one per registered op (a registry line
 * without its op_<name> here does not compile), then the fuzzer's own. */
/* Each keeps its registry flags: NB_OP_BF16 says whether it takes bf16
 * (bf16_rule). The fuzzer's own take bf16 (a view; a floating leaf; nothing
 * of a tensor). */
typedef void op_decoder(pool *p, reader *r, const char *fn);
static const struct {
    op_decoder *run;
    const char *fn;
    unsigned flags;
} program_ops[OP_COUNT] = {
#define X(name, inputs, flags, call) [OP_##name] = {op_##name, "nb_" #name, flags},
    NB_OPS(X)
#undef X
    [OP_detach] = {op_detach, "nb_detach", NB_OP_BF16},
    [OP_requires_grad] = {op_requires_grad, "nb_set_requires_grad", NB_OP_BF16},
    [OP_autocast] = {op_autocast, "nb_autocast_begin", NB_OP_BF16},
};

const char *fuzz_ops_name(unsigned op) { return op < OP_COUNT ? program_ops[op].fn : NULL; }

static bool op_takes_bf16(unsigned op) { return program_ops[op].flags & NB_OP_BF16; }

static void run_op(pool *p, reader *r, unsigned op) {
    cur_op = op;
    program_ops[op].run(p, r, program_ops[op].fn);
}

/* One input tensor: a byte of kind (ndim, bool, requires grad), sizes, values.
 * A floating one is bf16 when the head says so for input k (values rounded). */
static void make_tensor(pool *p, reader *r, int k) {
    unsigned b = u8(r);
    int nd = (int)(b % 5);
    bool is_bool = (b >> 3) % 4 == 3, rg = (b >> 5) & 1;
    shp s = {.nd = nd};
    for (int i = 0; i < nd; i++) s.s[i] = (int64_t)(u8(r) % 6);
    int64_t n = numel(&s);
    bool bf16 = p->bf16_inputs >> (k ? 1 : 0) & 1;
    nb_dtype dt = is_bool ? NB_BOOL : bf16 ? NB_BF16 : p->fdt;
    void *data = malloc((size_t)(n ? n : 1) * 8);
    if (!data) abort();
    for (int64_t i = 0; i < n; i++) {
        unsigned c = u8(r);
        if (dt == NB_BOOL) ((bool *)data)[i] = c & 1;
        else if (dt == NB_F64) ((double *)data)[i] = val_of(c);
        else if (dt == NB_BF16) ((uint16_t *)data)[i] = bf16_bits(round_to(val_of(c), NB_BF16));
        else ((float *)data)[i] = (float)round_to(val_of(c), NB_F32);
    }
    nb_tensor *t = nb_from_data(dt, s.nd, s.s, data);
    free(data);
    snprintf(ctx, sizeof ctx, "nb_from_data %s%s", nb_dtype_name(dt), shape_str(&s));
    if (!t) fail("could not make an input tensor");
    if (rg && dt != NB_BOOL) {
        if (nb_set_requires_grad(t, true) != t) fail("nb_set_requires_grad failed");
        p->leaves[p->nleaves++] = t;
    }
    p->t[p->n++] = t;
}

static int64_t live_baseline;
static int last_ops; /* ops the last input ran */

int fuzz_ops_last_ops(void) { return last_ops; }

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    setenv("NABLA_NUM_THREADS", "1", 0);
    setenv("NABLA_CACHE_MB", "0", 0); /* freed storage goes back to malloc: ASan sees reuse */
    live_baseline = nb_live_tensors();
    if (getenv("NABLA_FUZZ_STATS")) atexit(print_stats);
    verbose = getenv("NABLA_FUZZ_VERBOSE") != NULL;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    reader r = {data, size, 0};
    pool p = {.fdt = NB_F32};
    unsigned head = u8(&r);
    p.fdt = head & 1 ? NB_F64 : NB_F32;
    p.bf16_inputs = head >> 5 & 3;
    int ntensors = 1 + (int)((head >> 1 & 3) % 3);
    /* the kernel path of f32/f64 products and of bf16 ones: 0 the best, k the
     * k-th path of this architecture from portable (x86: portable, AVX2,
     * AVX-512; aarch64: portable, NEON, NEON_BF16), capped by the best the
     * CPU has; the f32/f64 product path follows the capped one */
    const int k = (int)(head >> 3 & 3);
    nbi_isa_force(k == 0 || k > NBI_ISA_COUNT ? -1 : k - 1);
    nbi_gemm_path(NBI_GEMM_AUTO);
    nb_clear_error();
    nb_scope_begin();
    for (int i = 0; i < ntensors; i++) make_tensor(&p, &r, i);
    for (last_ops = 0; last_ops < MAX_OPS && more(&r); last_ops++)
        run_op(&p, &r, u8(&r) % OP_COUNT);
    nb_scope_end();
    snprintf(ctx, sizeof ctx, "the end of the program");
    for (; p.nac > 0; p.nac--)
        if (nb_autocast_end() != 0) fail("nb_autocast_end failed with a region open");
    if (nb_autocast_dtype() != NB_F32) fail("an autocast region is still open");
    if (nb_live_tensors() != live_baseline)
        fail("%lld tensors alive after the scope, %lld before", (long long)nb_live_tensors(),
             (long long)live_baseline);
    if (nb_scope_depth() != 0) fail("scope depth %d", nb_scope_depth());
    nb_clear_error();
    return 0;
}
