/* test_attention.c: nb_attention and the multi-head attention module nb_MHA.
 *
 * Against PyTorch (fixtures/attention.txt, written by fixtures/gen_attention.py):
 * attention outputs, weights and q/k/v gradients in f64 and f32 for every
 * mask kind (none, causal (Lq,Lk), padding (B,1,1,Lk), both (B,1,Lq,Lk),
 * Lq != Lk, fully masked rows); MHA output, per-head weights, input and
 * parameter gradients with weights loaded from a PyTorch module (which the
 * generator checks against torch.nn.MultiheadAttention). Also: the all-masked
 * row convention, weights_out after dropout, nb_gradcheck in f64 (masks,
 * Lq != Lk, broadcast batch dims, non-contiguous q, dropout under a fixed
 * seed, MHA w.r.t. inputs and parameters), parameter names, error messages,
 * and no leaks. */
#include "test_util.h"

#include <stdlib.h>

Suite *suite_attention(void);

static const char *FX = "attention.txt";

#define CHECK_NOT_NULL(t) ck_assert_msg((t) != NULL, "%s", nb_last_error() ? nb_last_error() : "?")

/* ------------------------------------------------------------- helpers */
/* "<cs>_<field><sfx>", e.g. causal_gq32 */
static nb_tensor *fxa(const char *cs, const char *field, const char *sfx) {
    char name[96];
    snprintf(name, sizeof name, "%s_%s%s", cs, field, sfx);
    return fx(FX, name);
}

/* "<cs>.<field>", e.g. self.w_q.weight */
static nb_tensor *fxm(const char *cs, const char *field) {
    char name[96];
    snprintf(name, sizeof name, "%s.%s", cs, field);
    return fx(FX, name);
}

/* A tensor with its own storage and t's values, in dtype dt. */
static nb_tensor *copy_as(nb_tensor *t, nb_dtype dt) {
    nb_tensor *x = nb_empty(dt, nb_ndim(t), nb_shape(t));
    CHECK_NOT_NULL(x);
    ck_assert_msg(nb_copy_into(x, t) == 0, "%s", nb_last_error());
    return x;
}

static nb_tensor *leaf_of(nb_tensor *t, nb_dtype dt) {
    return nb_set_requires_grad(copy_as(t, dt), true);
}

/* The same values as t laid out with all dims reversed in memory: a
 * non-contiguous view with no history. */
static nb_tensor *noncontig_copy(nb_tensor *t) {
    int nd = nb_ndim(t), rev[NB_MAX_DIMS];
    for (int i = 0; i < nd; i++) rev[i] = nd - 1 - i;
    nb_tensor *buf = copy_as(nb_permute(t, nd, rev), nb_dtype_of(t));
    nb_tensor *v = nb_permute(buf, nd, rev);
    CHECK_NOT_NULL(v);
    ck_assert(!nb_is_contiguous(v));
    return v;
}

/* max |a - b| over all elements (same numel) */
static double max_diff(const nb_tensor *a, const nb_tensor *b) {
    CHECK_NOT_NULL(a);
    ck_assert_int_eq(nb_numel(a), nb_numel(b));
    double *x = values(a), *y = values(b), m = 0;
    for (int64_t i = 0; i < nb_numel(a); i++) {
        double d = fabs(x[i] - y[i]);
        if (d > m || d != d) m = d;
    }
    free(x);
    free(y);
    return m;
}

static void expect_finite(const nb_tensor *t, const char *what) {
    CHECK_NOT_NULL(t);
    double *x = values(t);
    int64_t bad = -1;
    for (int64_t i = 0; i < nb_numel(t) && bad < 0; i++)
        if (!isfinite(x[i])) bad = i;
    free(x);
    ck_assert_msg(bad < 0, "%s: element %lld is not finite", what, (long long)bad);
}

static nb_tensor *bool_tensor(int ndim, const int64_t *shape, const bool *data) {
    nb_tensor *t = nb_from_data(NB_BOOL, ndim, shape, data);
    CHECK_NOT_NULL(t);
    return t;
}

/* (B,1,1,Lk): key j of batch b may be attended iff j < len[b] */
static nb_tensor *pad_mask(int64_t B, int64_t Lk, const int64_t *len) {
    bool d[64];
    ck_assert(B * Lk <= 64);
    for (int64_t b = 0; b < B; b++)
        for (int64_t j = 0; j < Lk; j++) d[b * Lk + j] = j < len[b];
    return bool_tensor(NB_SHAPE(B, 1, 1, Lk), d);
}

/* (B,1,L,L): causal and padding together */
static nb_tensor *both_mask(int64_t B, int64_t L, const int64_t *len) {
    bool d[128];
    ck_assert(B * L * L <= 128);
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < L; i++)
            for (int64_t j = 0; j < L; j++) d[(b * L + i) * L + j] = j <= i && j < len[b];
    return bool_tensor(NB_SHAPE(B, 1, L, L), d);
}

static nb_tensor *loss_of(nb_tensor *out, nb_tensor *w) { return nb_sum_all(nb_mul(out, w)); }

/* ---------------------------------------------- attention vs PyTorch */
typedef struct {
    const char *name;
    bool mask;
} att_case;
static const att_case att_cases[] = {
    {"none", false}, {"causal", true}, {"pad", true},
    {"both", true},  {"cross", true},  {"fullrow", true},
};
#define NATT (int)(sizeof att_cases / sizeof att_cases[0])

static void attention_vs_torch(const att_case *c, bool f32) {
    const char *sfx = f32 ? "32" : "";
    nb_dtype dt = f32 ? NB_F32 : NB_F64;
    double tol = f32 ? 1e-5 : 1e-10;
    nb_tensor *fq = fxa(c->name, "q", sfx), *fk = fxa(c->name, "k", sfx);
    nb_tensor *fv = fxa(c->name, "v", sfx), *fw = fxa(c->name, "w", sfx);
    nb_tensor *fout = fxa(c->name, "out", sfx), *fp = fxa(c->name, "p", sfx);
    nb_tensor *fgq = fxa(c->name, "gq", sfx), *fgk = fxa(c->name, "gk", sfx);
    nb_tensor *fgv = fxa(c->name, "gv", sfx);
    nb_tensor *mask = c->mask ? fxa(c->name, "mask", "") : NULL;
    int64_t live = nb_live_tensors();
    nb_scope_begin();
    nb_tensor *q = leaf_of(fq, dt), *k = leaf_of(fk, dt), *v = leaf_of(fv, dt);
    nb_tensor *weights = NULL;
    nb_tensor *out = nb_attention(q, k, v, mask, 0.0, false, NULL, &weights);
    CHECK_NOT_NULL(out);
    CHECK_NOT_NULL(weights);
    ck_assert_int_eq(nb_dtype_of(out), dt);
    expect_close(out, fout, tol, tol);
    expect_close(weights, fp, tol, tol);
    ck_assert_msg(nb_backward(loss_of(out, fw)) == 0, "%s", nb_last_error());
    expect_close(nb_grad(q), fgq, tol, tol);
    expect_close(nb_grad(k), fgk, tol, tol);
    expect_close(nb_grad(v), fgv, tol, tol);
    double dg = max_diff(nb_grad(q), fgq);
    if (max_diff(nb_grad(k), fgk) > dg) dg = max_diff(nb_grad(k), fgk);
    if (max_diff(nb_grad(v), fgv) > dg) dg = max_diff(nb_grad(v), fgv);
    printf("torch ok      nb_attention %-8s %s   max |diff| out %.1e, weights %.1e, grads %.1e\n",
           c->name, f32 ? "f32" : "f64", max_diff(out, fout), max_diff(weights, fp), dg);
    fflush(stdout);
    /* the same through non-contiguous q, k, v (read in place) */
    nb_tensor *out2 = nb_attention(noncontig_copy(q), noncontig_copy(k), noncontig_copy(v), mask,
                                   0.0, false, NULL, NULL);
    expect_close(out2, fout, tol, tol);
    nb_scope_end();
    ck_assert_int_eq(nb_live_tensors(), live);
}

START_TEST(test_attention_vs_torch_f64) { attention_vs_torch(&att_cases[_i], false); }
END_TEST

START_TEST(test_attention_vs_torch_f32) { attention_vs_torch(&att_cases[_i], true); }
END_TEST

/* The masks of the fixtures have the documented shapes. */
START_TEST(test_mask_shapes) {
    const char *names[] = {"causal", "pad", "both", "cross"};
    const int nd[] = {2, 4, 4, 4};
    for (int i = 0; i < 4; i++) {
        nb_tensor *m = fxa(names[i], "mask", "");
        ck_assert_int_eq(nb_dtype_of(m), NB_BOOL);
        ck_assert_int_eq(nb_ndim(m), nd[i]);
    }
    ck_assert_int_eq(nb_shape(fxa("pad", "mask", ""))[2], 1);      /* (B,1,1,Lk) */
    ck_assert_int_eq(nb_shape(fxa("both", "mask", ""))[1], 1);     /* (B,1,Lq,Lk) */
    ck_assert_int_eq(nb_shape(fxa("both", "mask", ""))[2], 4);
}
END_TEST

/* ---------------------------------------------- fully masked rows */
/* fullrow: query 1 of batch 0 and query 2 of batch 1 see no key. Zero
 * weights, zero output, zero gradient for those rows; no NaN anywhere. */
START_TEST(test_fully_masked_rows) {
    nb_tensor *fq = fxa("fullrow", "q", ""), *fk = fxa("fullrow", "k", "");
    nb_tensor *fv = fxa("fullrow", "v", ""), *mask = fxa("fullrow", "mask", "");
    int64_t live = nb_live_tensors();
    nb_scope_begin();
    nb_tensor *q = leaf_of(fq, NB_F64), *k = leaf_of(fk, NB_F64), *v = leaf_of(fv, NB_F64);
    nb_tensor *w = NULL;
    nb_tensor *out = nb_attention(q, k, v, mask, 0.0, false, NULL, &w);
    CHECK_NOT_NULL(out);
    /* a gradient that is nonzero everywhere on the output */
    ck_assert_int_eq(nb_backward(nb_sum_all(nb_mul(out, out))), 0);
    expect_finite(out, "out");
    expect_finite(w, "weights");
    expect_finite(nb_grad(q), "q.grad");
    expect_finite(nb_grad(k), "k.grad");
    expect_finite(nb_grad(v), "v.grad");
    /* shapes: q (2,2,3,4), k (2,2,5,4), v (2,2,5,3), weights (2,2,3,5), out (2,2,3,3) */
    double *pw = values(w), *po = values(out), *pg = values(nb_grad(q)), *pm = values(mask);
    for (int b = 0; b < 2; b++)
        for (int h = 0; h < 2; h++)
            for (int i = 0; i < 3; i++) {
                bool dead = (b == 0 && i == 1) || (b == 1 && i == 2);
                double rs = 0;
                for (int j = 0; j < 5; j++) {
                    double x = pw[((b * 2 + h) * 3 + i) * 5 + j];
                    rs += x;
                    if (pm[(b * 3 + i) * 5 + j] == 0.0)
                        ck_assert_msg(x == 0.0, "masked weight (%d,%d,%d,%d) is %g", b, h, i, j, x);
                }
                if (dead) {
                    ck_assert_msg(rs == 0.0, "dead row (%d,%d,%d) sums to %g", b, h, i, rs);
                    for (int d = 0; d < 3; d++) ck_assert(po[((b * 2 + h) * 3 + i) * 3 + d] == 0.0);
                    for (int d = 0; d < 4; d++) ck_assert(pg[((b * 2 + h) * 3 + i) * 4 + d] == 0.0);
                } else {
                    ck_assert_msg(fabs(rs - 1.0) < 1e-12, "row (%d,%d,%d) sums to %.17g", b, h, i, rs);
                }
            }
    free(pw);
    free(po);
    free(pg);
    free(pm);
    nb_scope_end();
    ck_assert_int_eq(nb_live_tensors(), live);
}
END_TEST

/* Every key masked: zero output and zero gradient for q, k and v. */
START_TEST(test_all_masked) {
    nb_scope_begin();
    nb_tensor *q = rand_leaf(1, NB_SHAPE(2, 3, 4)), *k = rand_leaf(2, NB_SHAPE(2, 5, 4));
    nb_tensor *v = rand_leaf(3, NB_SHAPE(2, 5, 2));
    nb_tensor *none = nb_zeros(NB_BOOL, NB_SHAPE(1, 5));
    nb_tensor *w = NULL;
    nb_tensor *out = nb_attention(q, k, v, none, 0.0, false, NULL, &w);
    CHECK_NOT_NULL(out);
    expect_close(out, nb_zeros(NB_F64, NB_SHAPE(2, 3, 2)), 0, 0);
    expect_close(w, nb_zeros(NB_F64, NB_SHAPE(2, 3, 5)), 0, 0);
    ck_assert_int_eq(nb_backward(nb_sum_all(out)), 0);
    nb_tensor *gq = nb_grad(q), *gk = nb_grad(k), *gv = nb_grad(v);
    if (gq) expect_close(gq, nb_zeros(NB_F64, NB_SHAPE(2, 3, 4)), 0, 0);
    if (gk) expect_close(gk, nb_zeros(NB_F64, NB_SHAPE(2, 5, 4)), 0, 0);
    if (gv) expect_close(gv, nb_zeros(NB_F64, NB_SHAPE(2, 5, 2)), 0, 0);
    nb_scope_end();
}
END_TEST

/* ---------------------------------------------- dropout and weights_out */
/* weights_out is the matrix after dropout: softmax * keep / (1-p), and
 * out == weights_out · v. The mask is the dropout stream of the same seed. */
START_TEST(test_weights_out_after_dropout) {
    nb_scope_begin();
    nb_tensor *q = rand_leaf(10, NB_SHAPE(2, 2, 4, 3)), *k = rand_leaf(11, NB_SHAPE(2, 2, 4, 3));
    nb_tensor *v = rand_leaf(12, NB_SHAPE(2, 2, 4, 5));
    nb_tensor *mask = nb_tril_mask(4, 4);
    const double p = 0.5;
    nb_rng r;
    nb_rng_seed(&r, 1234);
    nb_tensor *wd = NULL, *wref = NULL;
    nb_tensor *out = nb_attention(q, k, v, mask, p, true, &r, &wd);
    CHECK_NOT_NULL(out);
    CHECK_NOT_NULL(wd);
    ck_assert_int_eq((int64_t)r.offset, 2 * 2 * 4 * 4); /* one draw per weight */
    /* eval: the plain softmax, no draws */
    nb_rng r2;
    nb_rng_seed(&r2, 1234);
    nb_tensor *out_eval = nb_attention(q, k, v, mask, p, false, &r2, &wref);
    CHECK_NOT_NULL(out_eval);
    ck_assert_int_eq((int64_t)r2.offset, 0);
    nb_tensor *rows = nb_sum(wref, -1, false);
    expect_close(rows, nb_ones(NB_F64, NB_SHAPE(2, 2, 4)), 1e-12, 0);
    /* keep / (1-p) from the same stream: nb_dropout of ones with seed 1234 */
    nb_rng r3;
    nb_rng_seed(&r3, 1234);
    nb_tensor *scale = nb_dropout(nb_ones(NB_F64, NB_SHAPE(2, 2, 4, 4)), p, true, &r3);
    expect_close(wd, nb_mul(wref, scale), 1e-15, 0);
    expect_close(out, nb_matmul(wd, v), 1e-14, 0);
    /* some weights kept, some dropped (where the softmax is nonzero) */
    double *pw = values(wd), *pr = values(wref);
    int kept = 0, dropped = 0;
    for (int i = 0; i < 64; i++)
        if (pr[i] > 0) {
            if (pw[i] == 0.0) dropped++;
            else {
                kept++;
                ck_assert(fabs(pw[i] - pr[i] / (1 - p)) < 1e-15);
            }
        }
    free(pw);
    free(pr);
    ck_assert_msg(kept > 5 && dropped > 5, "kept %d, dropped %d", kept, dropped);
    /* the gradient goes through the same mask */
    ck_assert_int_eq(nb_backward(nb_sum_all(out)), 0);
    CHECK_NOT_NULL(nb_grad(v));
    /* v.grad = wdᵀ · 1 */
    nb_tensor *gv = nb_sum(nb_transpose(wd, -2, -1), -1, true);
    expect_close(nb_grad(v), nb_expand(gv, NB_SHAPE(2, 2, 4, 5)), 1e-14, 0);
    /* p = 1 drops everything; weights_out may be NULL */
    nb_tensor *z = nb_attention(q, k, v, NULL, 1.0, true, &r, NULL);
    expect_close(z, nb_zeros(NB_F64, NB_SHAPE(2, 2, 4, 5)), 0, 0);
    /* training with p = 0 is the eval result, without draws */
    uint64_t off = r.offset;
    expect_close(nb_attention(q, k, v, mask, 0.0, true, &r, NULL), out_eval, 0, 0);
    ck_assert(r.offset == off);
    nb_scope_end();
}
END_TEST

/* ---------------------------------------------- gradcheck */
typedef struct {
    nb_tensor *mask;
    double p;        /* dropout, training when > 0 */
    uint64_t seed;   /* re-seeded every call: the same dropout mask each evaluation */
    bool weights;    /* return the weights instead of the output */
} att_ctx;

static nb_tensor *f_att(nb_tensor **in, int n, void *vctx) {
    (void)n;
    const att_ctx *c = vctx;
    nb_rng r;
    nb_rng_seed(&r, c->seed);
    nb_tensor *w = NULL;
    nb_tensor *out = nb_attention(in[0], in[1], in[2], c->mask, c->p, c->p > 0, &r, &w);
    return c->weights ? w : out;
}

START_TEST(test_gradcheck_attention) {
    nb_scope_begin();
    nb_tensor *in[3];
    att_ctx c = {0};
    in[0] = rand_leaf(20, NB_SHAPE(1, 2, 3, 4));
    in[1] = rand_leaf(21, NB_SHAPE(1, 2, 3, 4));
    in[2] = rand_leaf(22, NB_SHAPE(1, 2, 3, 4));
    expect_gradcheck("nb_attention no mask", f_att, &c, 3, in);
    c.mask = nb_tril_mask(3, 3);
    expect_gradcheck("nb_attention causal (Lq,Lk)", f_att, &c, 3, in);
    c.weights = true;
    expect_gradcheck("nb_attention causal, weights_out", f_att, &c, 3, in);
    c.weights = false;

    in[0] = rand_leaf(23, NB_SHAPE(2, 2, 3, 2));
    in[1] = rand_leaf(24, NB_SHAPE(2, 2, 3, 2));
    in[2] = rand_leaf(25, NB_SHAPE(2, 2, 3, 2));
    c.mask = pad_mask(2, 3, (const int64_t[]){3, 2});
    expect_gradcheck("nb_attention padding (B,1,1,Lk)", f_att, &c, 3, in);
    c.mask = both_mask(2, 3, (const int64_t[]){3, 2});
    expect_gradcheck("nb_attention causal+padding (B,1,Lq,Lk)", f_att, &c, 3, in);
    nb_scope_end();
}
END_TEST

START_TEST(test_gradcheck_attention_shapes) {
    nb_scope_begin();
    nb_tensor *in[3];
    att_ctx c = {0};
    /* cross: Lq 2, Lk 4, D 3, Dv 2 */
    in[0] = rand_leaf(30, NB_SHAPE(2, 2, 3));
    in[1] = rand_leaf(31, NB_SHAPE(2, 4, 3));
    in[2] = rand_leaf(32, NB_SHAPE(2, 4, 2));
    expect_gradcheck("nb_attention Lq != Lk", f_att, &c, 3, in);
    c.mask = nb_tril_mask(2, 4);
    expect_gradcheck("nb_attention Lq != Lk, causal (2,4)", f_att, &c, 3, in);
    c.mask = pad_mask(2, 4, (const int64_t[]){4, 1});
    ck_assert_ptr_nonnull(c.mask = nb_squeeze(c.mask, 1)); /* (B,1,Lk) for 3-d scores */
    expect_gradcheck("nb_attention Lq != Lk, padding (B,1,Lk)", f_att, &c, 3, in);
    /* a fully masked row: constant zero output there */
    bool dead[8] = {1, 1, 1, 1, 0, 0, 0, 0}; /* (2,4): query 1 sees nothing */
    c.mask = bool_tensor(NB_SHAPE(2, 4), dead);
    expect_gradcheck("nb_attention fully masked row", f_att, &c, 3, in);
    c.mask = NULL;
    /* broadcast batch dims: q (2,2,3,2), k (2,4,2), v (4,2) */
    in[0] = rand_leaf(33, NB_SHAPE(2, 2, 3, 2));
    in[1] = rand_leaf(34, NB_SHAPE(2, 4, 2));
    in[2] = rand_leaf(35, NB_SHAPE(4, 2));
    expect_gradcheck("nb_attention broadcast batch dims", f_att, &c, 3, in);
    /* a transposed (non-contiguous) q leaf */
    in[0] = transposed_leaf(36, NB_SHAPE(1, 2, 3, 4), -2, -1);
    in[1] = rand_leaf(37, NB_SHAPE(1, 2, 3, 4));
    in[2] = rand_leaf(38, NB_SHAPE(1, 2, 3, 4));
    c.mask = nb_tril_mask(3, 3);
    expect_gradcheck("nb_attention transposed q leaf", f_att, &c, 3, in);
    nb_scope_end();
}
END_TEST

START_TEST(test_gradcheck_attention_dropout) {
    nb_scope_begin();
    nb_tensor *in[3];
    att_ctx c = {.p = 0.3, .seed = 99};
    in[0] = rand_leaf(40, NB_SHAPE(1, 2, 3, 4));
    in[1] = rand_leaf(41, NB_SHAPE(1, 2, 3, 4));
    in[2] = rand_leaf(42, NB_SHAPE(1, 2, 3, 4));
    /* the mask drops something and keeps something */
    nb_tensor *w = NULL;
    nb_rng r;
    nb_rng_seed(&r, 99);
    CHECK_NOT_NULL(nb_attention(in[0], in[1], in[2], NULL, 0.3, true, &r, &w));
    double *pw = values(w);
    int zeros = 0;
    for (int i = 0; i < 18; i++) zeros += pw[i] == 0.0;
    free(pw);
    ck_assert_msg(zeros > 0 && zeros < 18, "%d of 18 dropped", zeros);
    expect_gradcheck("nb_attention dropout 0.3 (fixed seed)", f_att, &c, 3, in);
    c.mask = nb_tril_mask(3, 3);
    expect_gradcheck("nb_attention dropout 0.3 + causal", f_att, &c, 3, in);
    nb_scope_end();
}
END_TEST

/* ------------------------------------- second order and forward mode
 * expect_all_orders: gradcheck, gradgradcheck and forward mode (each also
 * hands the backward a transposed and a stride-0 upstream gradient) */
START_TEST(test_higher_order_attention) {
    nb_scope_begin();
    nb_tensor *in[3];
    att_ctx c = {0};
    in[0] = rand_leaf(120, NB_SHAPE(1, 2, 3, 2));
    in[1] = rand_leaf(121, NB_SHAPE(1, 2, 3, 2));
    in[2] = rand_leaf(122, NB_SHAPE(1, 2, 3, 2));
    expect_all_orders("nb_attention no mask", f_att, &c, 3, in);
    c.mask = nb_tril_mask(3, 3);
    expect_all_orders("nb_attention causal (Lq,Lk)", f_att, &c, 3, in);
    c.weights = true;
    expect_all_orders("nb_attention causal, weights_out", f_att, &c, 3, in);
    c.weights = false;
    /* cross, Lq 2, Lk 3, a fully masked row and a padding mask */
    in[0] = rand_leaf(123, NB_SHAPE(2, 2, 2));
    in[1] = rand_leaf(124, NB_SHAPE(2, 3, 2));
    in[2] = rand_leaf(125, NB_SHAPE(2, 3, 2));
    bool dead[6] = {0, 0, 0, 1, 0, 1}; /* (2,3): query 0 sees nothing */
    c.mask = bool_tensor(NB_SHAPE(2, 3), dead);
    expect_all_orders("nb_attention fully masked row", f_att, &c, 3, in);
    c.mask = nb_squeeze(pad_mask(2, 3, (const int64_t[]){3, 1}), 1); /* (B,1,Lk) */
    expect_all_orders("nb_attention padding (B,1,Lk)", f_att, &c, 3, in);
    c.mask = NULL;
    in[0] = transposed_leaf(126, NB_SHAPE(2, 2, 2), -2, -1);
    expect_all_orders("nb_attention transposed q leaf", f_att, &c, 3, in);
    nb_scope_end();
}
END_TEST

/* ---------------------------------------------------------- MHA */
static const char *const pnames[8] = {"w_q.weight", "w_q.bias", "w_k.weight", "w_k.bias",
                                      "w_v.weight", "w_v.bias", "w_o.weight", "w_o.bias"};

/* An MHA named cs in dtype dt with the fixture's weights. */
static void load_mha(nb_MHA *m, nb_params *ps, const char *cs, int64_t d_model, bool bias,
                     nb_dtype dt) {
    nb_rng r;
    nb_rng_seed(&r, 7);
    nb_set_default_dtype(dt);
    int rc = nb_mha_init(m, ps, cs, d_model, 2, 0.0, bias, &r);
    nb_set_default_dtype(NB_F32);
    ck_assert_msg(rc == 0, "%s", nb_last_error());
    for (int i = 0; i < 8; i++) {
        if (!bias && i % 2) continue;
        char name[96];
        snprintf(name, sizeof name, "%s.%s", cs, pnames[i]);
        nb_tensor *p = nb_params_get(ps, name);
        CHECK_NOT_NULL(p);
        ck_assert_int_eq(nb_dtype_of(p), dt);
        ck_assert_msg(nb_copy_into(p, fx(FX, name)) == 0, "%s", nb_last_error());
    }
}

typedef struct {
    const char *name;
    int64_t d_model;
    bool bias;
    int ninputs;
    const char *inputs[3]; /* fixture inputs */
    int role[3];           /* which input is q, k, v */
} mha_case;
static const mha_case mha_cases[] = {
    {"self", 8, true, 1, {"x"}, {0, 0, 0}},
    {"cross", 8, true, 2, {"y", "mem"}, {0, 1, 1}},
    {"nobias", 6, false, 3, {"q", "k", "v"}, {0, 1, 2}},
};
#define NMHA (int)(sizeof mha_cases / sizeof mha_cases[0])

static void mha_vs_torch(const mha_case *c, bool f32) {
    nb_dtype dt = f32 ? NB_F32 : NB_F64;
    double tol = f32 ? 1e-5 : 1e-10;
    char nm[64];
    nb_tensor *fin[3], *fgin[3];
    for (int i = 0; i < c->ninputs; i++) {
        fin[i] = fxm(c->name, c->inputs[i]);
        snprintf(nm, sizeof nm, "g%s%s", c->inputs[i], f32 ? "32" : "");
        fgin[i] = fxm(c->name, nm);
    }
    nb_tensor *mask = fxm(c->name, "mask"), *fw = fxm(c->name, "w");
    nb_tensor *fout = fxm(c->name, f32 ? "out32" : "out"), *fattn = fxm(c->name, "attn");
    nb_tensor *fgp[8] = {0};
    for (int i = 0; i < 8; i++)
        if (c->bias || i % 2 == 0) {
            snprintf(nm, sizeof nm, "grad.%s", pnames[i]);
            fgp[i] = fxm(c->name, nm);
        }
    int64_t live = nb_live_tensors();
    nb_params *ps = nb_params_new();
    nb_MHA m;
    load_mha(&m, ps, c->name, c->d_model, c->bias, dt);
    ck_assert_int_eq(nb_params_count(ps), c->bias ? 8 : 4);
    nb_scope_begin();
    nb_tensor *in[3];
    for (int i = 0; i < c->ninputs; i++) in[i] = leaf_of(fin[i], dt);
    nb_tensor *attn = NULL;
    nb_tensor *out = nb_mha_forward(&m, in[c->role[0]], in[c->role[1]], in[c->role[2]], mask,
                                    false, NULL, &attn);
    CHECK_NOT_NULL(out);
    CHECK_NOT_NULL(attn);
    expect_close(out, fout, tol, tol);
    double dattn = 0;
    if (!f32) {
        expect_close(attn, fattn, tol, tol); /* (B,H,Lq,Lk) */
        dattn = max_diff(attn, fattn);
    }
    ck_assert_msg(nb_backward(loss_of(out, nb_to(fw, dt))) == 0, "%s", nb_last_error());
    double dg = 0, dp = 0;
    for (int i = 0; i < c->ninputs; i++) {
        expect_close(nb_grad(in[i]), fgin[i], tol, tol);
        if (max_diff(nb_grad(in[i]), fgin[i]) > dg) dg = max_diff(nb_grad(in[i]), fgin[i]);
    }
    if (!f32)
        for (int i = 0; i < 8; i++) {
            if (!fgp[i]) continue;
            char name[96];
            snprintf(name, sizeof name, "%s.%s", c->name, pnames[i]);
            nb_tensor *g = nb_grad(nb_params_get(ps, name));
            ck_assert_msg(g != NULL, "no gradient for %s", name);
            expect_close(g, fgp[i], tol, tol);
            if (max_diff(g, fgp[i]) > dp) dp = max_diff(g, fgp[i]);
        }
    if (f32)
        printf("torch ok      nb_mha_forward %-7s f32  max |diff| out %.1e, input grads %.1e\n",
               c->name, max_diff(out, fout), dg);
    else
        printf("torch ok      nb_mha_forward %-7s f64  max |diff| out %.1e, weights %.1e, input "
               "grads %.1e, param grads %.1e\n", c->name, max_diff(out, fout), dattn, dg, dp);
    fflush(stdout);
    /* non-contiguous inputs give the same */
    nb_tensor *nc[3];
    for (int i = 0; i < c->ninputs; i++) nc[i] = noncontig_copy(in[i]);
    nb_tensor *out2 = nb_mha_forward(&m, nc[c->role[0]], nc[c->role[1]], nc[c->role[2]], mask,
                                     false, NULL, NULL);
    expect_close(out2, fout, tol, tol);
    nb_scope_end();
    nb_params_free(ps);
    ck_assert_int_eq(nb_live_tensors(), live);
}

START_TEST(test_mha_vs_torch_f64) { mha_vs_torch(&mha_cases[_i], false); }
END_TEST

START_TEST(test_mha_vs_torch_f32) { mha_vs_torch(&mha_cases[_i], true); }
END_TEST

/* The mask broadcasts from any of the documented shapes: the same result as
 * the mask expanded to (B,H,Lq,Lk). */
START_TEST(test_mha_mask_broadcast) {
    nb_params *ps = nb_params_new();
    nb_MHA m;
    nb_rng r;
    nb_rng_seed(&r, 3);
    nb_set_default_dtype(NB_F64);
    ck_assert_int_eq(nb_mha_init(&m, ps, "a", 4, 2, 0.0, true, &r), 0);
    nb_set_default_dtype(NB_F32);
    nb_scope_begin();
    nb_tensor *x = nb_randn(NB_F64, NB_SHAPE(2, 3, 4), &r);
    nb_tensor *masks[3] = {nb_tril_mask(3, 3), pad_mask(2, 3, (const int64_t[]){3, 1}),
                           both_mask(2, 3, (const int64_t[]){2, 3})};
    for (int i = 0; i < 3; i++) {
        nb_tensor *full = nb_contiguous(nb_expand(masks[i], NB_SHAPE(2, 2, 3, 3)));
        nb_tensor *wa = NULL, *wb = NULL;
        nb_tensor *a = nb_mha_forward(&m, x, x, x, masks[i], false, NULL, &wa);
        nb_tensor *b = nb_mha_forward(&m, x, x, x, full, false, NULL, &wb);
        expect_close(a, b, 0, 0);
        expect_close(wa, wb, 0, 0);
        ck_assert_int_eq(nb_ndim(wa), 4);
        ck_assert_int_eq(nb_shape(wa)[1], 2);
    }
    nb_scope_end();
    nb_params_free(ps);
}
END_TEST

/* Dropout in training draws B*H*Lq*Lk numbers from rng; eval draws none. */
START_TEST(test_mha_dropout_rng) {
    nb_params *ps = nb_params_new();
    nb_MHA m;
    nb_rng r;
    nb_rng_seed(&r, 3);
    nb_set_default_dtype(NB_F64);
    ck_assert_int_eq(nb_mha_init(&m, ps, "a", 4, 2, 0.5, true, &r), 0);
    nb_set_default_dtype(NB_F32);
    nb_scope_begin();
    nb_tensor *q = nb_randn(NB_F64, NB_SHAPE(2, 3, 4), &r), *kv = nb_randn(NB_F64, NB_SHAPE(2, 5, 4), &r);
    nb_rng d;
    nb_rng_seed(&d, 5);
    nb_tensor *w = NULL;
    nb_tensor *e1 = nb_mha_forward(&m, q, kv, kv, NULL, false, &d, &w);
    CHECK_NOT_NULL(e1);
    ck_assert(d.offset == 0);
    nb_tensor *t1 = nb_mha_forward(&m, q, kv, kv, NULL, true, &d, &w);
    CHECK_NOT_NULL(t1);
    ck_assert(d.offset == 2 * 2 * 3 * 5);
    /* dropped weights are exact zeros, kept ones doubled */
    double *pw = values(w);
    int zeros = 0;
    for (int i = 0; i < 60; i++) zeros += pw[i] == 0.0;
    free(pw);
    ck_assert_msg(zeros > 5 && zeros < 55, "%d of 60 dropped", zeros);
    nb_rng_seed(&d, 5);
    nb_tensor *t2 = nb_mha_forward(&m, q, kv, kv, NULL, true, &d, NULL);
    expect_close(t2, t1, 0, 0); /* same seed, same result */
    nb_scope_end();
    nb_params_free(ps);
}
END_TEST

/* ---------------------------------------------- MHA gradcheck */
typedef struct {
    nb_MHA *m;
    nb_tensor *mask;
    int mode;          /* 0 self: in[0] is q, k, v; 1 cross: q, mem; 2: q, k, v */
    nb_tensor *x[3];   /* for the parameter check: fixed inputs */
    double p;
    uint64_t seed;
} mha_ctx;

static nb_tensor *mha_call(const mha_ctx *c, nb_MHA *m, nb_tensor **x) {
    nb_rng r;
    nb_rng_seed(&r, c->seed);
    nb_tensor *q = x[0], *k = c->mode == 0 ? x[0] : x[1];
    nb_tensor *v = c->mode == 0 ? x[0] : c->mode == 1 ? x[1] : x[2];
    nb_tensor *w = NULL;
    return nb_mha_forward(m, q, k, v, c->mask, c->p > 0, &r, &w);
}

static nb_tensor *f_mha_inputs(nb_tensor **in, int n, void *vctx) {
    (void)n;
    const mha_ctx *c = vctx;
    return mha_call(c, c->m, in);
}

/* in = the 8 registered parameters, in registration order */
static nb_tensor *f_mha_params(nb_tensor **in, int n, void *vctx) {
    (void)n;
    const mha_ctx *c = vctx;
    nb_MHA m = *c->m;
    nb_Linear *lin[4] = {&m.w_q, &m.w_k, &m.w_v, &m.w_o};
    for (int i = 0; i < 4; i++) {
        lin[i]->weight = in[2 * i];
        lin[i]->bias = in[2 * i + 1];
    }
    nb_tensor *x[3] = {c->x[0], c->x[1], c->x[2]};
    return mha_call(c, &m, x);
}

static nb_params *gradcheck_mha(nb_MHA *m, double dropout) {
    nb_params *ps = nb_params_new();
    nb_rng r;
    nb_rng_seed(&r, 11);
    nb_set_default_dtype(NB_F64);
    ck_assert_int_eq(nb_mha_init(m, ps, "g", 4, 2, dropout, true, &r), 0);
    nb_set_default_dtype(NB_F32);
    return ps;
}

START_TEST(test_gradcheck_mha_inputs) {
    nb_MHA m;
    nb_params *ps = gradcheck_mha(&m, 0.0);
    nb_scope_begin();
    mha_ctx c = {.m = &m};
    nb_tensor *in[3];
    in[0] = rand_leaf(50, NB_SHAPE(2, 3, 4));
    c.mask = both_mask(2, 3, (const int64_t[]){3, 2});
    expect_gradcheck("nb_mha_forward self, causal+padding", f_mha_inputs, &c, 1, in);
    c.mode = 1;
    in[0] = rand_leaf(51, NB_SHAPE(2, 2, 4));
    in[1] = rand_leaf(52, NB_SHAPE(2, 3, 4));
    c.mask = pad_mask(2, 3, (const int64_t[]){3, 1});
    expect_gradcheck("nb_mha_forward cross Lq 2 Lk 3, padding", f_mha_inputs, &c, 2, in);
    c.mode = 2;
    in[0] = rand_leaf(53, NB_SHAPE(1, 3, 4));
    in[1] = rand_leaf(54, NB_SHAPE(1, 3, 4));
    in[2] = rand_leaf(55, NB_SHAPE(1, 3, 4));
    c.mask = nb_tril_mask(3, 3);
    expect_gradcheck("nb_mha_forward distinct q k v, causal", f_mha_inputs, &c, 3, in);
    nb_scope_end();
    nb_params_free(ps);
}
END_TEST

START_TEST(test_gradcheck_mha_params) {
    nb_MHA m;
    nb_params *ps = gradcheck_mha(&m, 0.0);
    nb_tensor *params[8];
    for (int i = 0; i < 8; i++) {
        params[i] = nb_params_at(ps, i, NULL);
        CHECK_NOT_NULL(params[i]);
        ck_assert(nb_is_leaf(params[i]) && nb_requires_grad(params[i]));
    }
    nb_scope_begin();
    mha_ctx c = {.m = &m};
    c.x[0] = nb_set_requires_grad(rand_leaf(56, NB_SHAPE(2, 3, 4)), false);
    c.mask = both_mask(2, 3, (const int64_t[]){3, 2});
    expect_gradcheck("nb_mha_forward w.r.t. parameters, self", f_mha_params, &c, 8, params);
    c.mode = 1;
    c.x[0] = nb_set_requires_grad(rand_leaf(57, NB_SHAPE(1, 2, 4)), false);
    c.x[1] = nb_set_requires_grad(rand_leaf(58, NB_SHAPE(1, 4, 4)), false);
    c.mask = nb_tril_mask(2, 4);
    expect_gradcheck("nb_mha_forward w.r.t. parameters, cross", f_mha_params, &c, 8, params);
    nb_scope_end();
    nb_params_free(ps);
}
END_TEST

START_TEST(test_gradcheck_mha_dropout) {
    nb_MHA m;
    nb_params *ps = gradcheck_mha(&m, 0.3);
    nb_scope_begin();
    mha_ctx c = {.m = &m, .p = 0.3, .seed = 17};
    nb_tensor *in[1] = {rand_leaf(59, NB_SHAPE(1, 3, 4))};
    c.mask = nb_tril_mask(3, 3);
    expect_gradcheck("nb_mha_forward training, dropout 0.3", f_mha_inputs, &c, 1, in);
    nb_scope_end();
    nb_params_free(ps);
}
END_TEST

START_TEST(test_higher_order_mha) {
    nb_MHA m;
    nb_params *ps = gradcheck_mha(&m, 0.0);
    nb_scope_begin();
    mha_ctx c = {.m = &m};
    nb_tensor *in[3] = {rand_leaf(130, NB_SHAPE(1, 3, 4))};
    c.mask = nb_tril_mask(3, 3);
    expect_all_orders("nb_mha_forward self, causal", f_mha_inputs, &c, 1, in);
    c.mode = 1;
    in[0] = rand_leaf(131, NB_SHAPE(2, 2, 4));
    in[1] = rand_leaf(132, NB_SHAPE(2, 3, 4));
    c.mask = pad_mask(2, 3, (const int64_t[]){3, 1});
    expect_all_orders("nb_mha_forward cross, padding", f_mha_inputs, &c, 2, in);
    /* with respect to the parameters, the input fixed */
    nb_tensor *params[8];
    for (int i = 0; i < 8; i++) params[i] = nb_params_at(ps, i, NULL);
    c.mode = 0;
    c.x[0] = nb_set_requires_grad(rand_leaf(133, NB_SHAPE(1, 3, 4)), false);
    c.mask = nb_tril_mask(3, 3);
    expect_all_orders("nb_mha_forward w.r.t. parameters", f_mha_params, &c, 8, params);
    nb_scope_end();
    nb_params_free(ps);
}
END_TEST

/* ---------------------------------------------- MHA parameters */
START_TEST(test_mha_param_names) {
    nb_params *ps = nb_params_new();
    nb_MHA m;
    nb_rng r;
    nb_rng_seed(&r, 1);
    ck_assert_int_eq(nb_mha_init(&m, ps, "decoder.layers.0.src_attn", 8, 2, 0.1, true, &r), 0);
    ck_assert_int_eq(nb_params_count(ps), 8);
    ck_assert_int_eq(m.d_model, 8);
    ck_assert_int_eq(m.heads, 2);
    ck_assert_int_eq(m.d_k, 4);
    ck_assert(m.dropout == 0.1);
    nb_Linear *lin[4] = {&m.w_q, &m.w_k, &m.w_v, &m.w_o};
    for (int i = 0; i < 8; i++) {
        const char *name = NULL;
        nb_tensor *p = nb_params_at(ps, i, &name);
        CHECK_NOT_NULL(p);
        char want[96];
        snprintf(want, sizeof want, "decoder.layers.0.src_attn.%s", pnames[i]);
        ck_assert_str_eq(name, want);
        ck_assert(p == (i % 2 ? lin[i / 2]->bias : lin[i / 2]->weight));
        ck_assert_int_eq(nb_dtype_of(p), NB_F32); /* the default dtype */
        ck_assert(nb_requires_grad(p));
        ck_assert_int_eq(nb_ndim(p), i % 2 ? 1 : 2);
        ck_assert_int_eq(nb_shape(p)[0], 8);
        if (i % 2 == 0) ck_assert_int_eq(nb_shape(p)[1], 8);
        /* torch's nn.Linear init: U(-1/sqrt(in), 1/sqrt(in)) */
        double *pv = values(p);
        for (int64_t e = 0; e < nb_numel(p); e++) ck_assert(fabs(pv[e]) <= 1.0 / sqrt(8.0));
        free(pv);
        ck_assert(nb_params_get(ps, want) == p);
    }
    ck_assert_int_eq(nb_params_numel(ps), 4 * (64 + 8));
    /* without bias: 4 more, weights only */
    nb_MHA m2;
    ck_assert_int_eq(nb_mha_init(&m2, ps, "enc", 6, 3, 0.0, false, &r), 0);
    ck_assert_int_eq(nb_params_count(ps), 12);
    const char *want2[4] = {"enc.w_q.weight", "enc.w_k.weight", "enc.w_v.weight", "enc.w_o.weight"};
    for (int i = 0; i < 4; i++) {
        const char *name = NULL;
        nb_params_at(ps, 8 + i, &name);
        ck_assert_str_eq(name, want2[i]);
    }
    ck_assert_ptr_null(m2.w_q.bias);
    ck_assert_ptr_null(m2.w_o.bias);
    ck_assert_int_eq(m2.d_k, 2);
    /* a duplicate name is refused */
    expect_error_rc(nb_mha_init(&m2, ps, "enc", 6, 3, 0.0, false, &r), "enc.w_q.weight",
                    "exists already");
    nb_params_free(ps);
    /* an empty name: the bare state_dict keys; default dtype f64 is honoured */
    ps = nb_params_new();
    nb_set_default_dtype(NB_F64);
    int rc = nb_mha_init(&m, ps, "", 4, 1, 0.0, true, &r);
    nb_set_default_dtype(NB_F32);
    ck_assert_int_eq(rc, 0);
    for (int i = 0; i < 8; i++) {
        const char *name = NULL;
        nb_tensor *p = nb_params_at(ps, i, &name);
        ck_assert_str_eq(name, pnames[i]);
        ck_assert_int_eq(nb_dtype_of(p), NB_F64);
    }
    ck_assert_int_eq(m.d_k, 4);
    nb_params_free(ps);
}
END_TEST

/* ---------------------------------------------------------- errors */
START_TEST(test_mha_init_errors) {
    nb_params *ps = nb_params_new();
    nb_MHA m;
    expect_error_rc(nb_mha_init(&m, ps, "a", 10, 3, 0.0, true, NULL),
                    "nb_mha_init: d_model 10 is not divisible by heads 3");
    expect_error_rc(nb_mha_init(&m, ps, "a", 8, 0, 0.0, true, NULL), "nb_mha_init",
                    "heads must be positive, got 0");
    expect_error_rc(nb_mha_init(&m, ps, "a", 8, -2, 0.0, true, NULL), "nb_mha_init", "heads",
                    "-2");
    expect_error_rc(nb_mha_init(&m, ps, "a", 0, 2, 0.0, true, NULL), "nb_mha_init",
                    "d_model must be positive, got 0");
    expect_error_rc(nb_mha_init(&m, ps, "a", -8, 2, 0.0, true, NULL), "nb_mha_init", "d_model",
                    "-8");
    expect_error_rc(nb_mha_init(&m, ps, "a", 8, 2, -0.1, true, NULL), "nb_mha_init",
                    "dropout must be in [0, 1], got -0.1");
    expect_error_rc(nb_mha_init(&m, ps, "a", 8, 2, 1.5, true, NULL), "nb_mha_init", "1.5");
    expect_error_rc(nb_mha_init(&m, ps, "a", 8, 2, NAN, true, NULL), "nb_mha_init", "dropout");
    expect_error_rc(nb_mha_init(NULL, ps, "a", 8, 2, 0.0, true, NULL), "nb_mha_init", "NULL");
    expect_error_rc(nb_mha_init(&m, NULL, "a", 8, 2, 0.0, true, NULL), "nb_mha_init", "NULL");
    ck_assert_int_eq(nb_params_count(ps), 0); /* nothing registered by a failed init */
    nb_params_free(ps);
}
END_TEST

START_TEST(test_mha_forward_errors) {
    nb_params *ps = nb_params_new();
    nb_MHA m;
    nb_set_default_dtype(NB_F64);
    ck_assert_int_eq(nb_mha_init(&m, ps, "a", 4, 2, 0.0, true, NULL), 0);
    nb_set_default_dtype(NB_F32);
    int64_t live = nb_live_tensors();
    nb_scope_begin();
    nb_tensor *x = nb_zeros(NB_F64, NB_SHAPE(2, 3, 4)), *mem = nb_zeros(NB_F64, NB_SHAPE(2, 5, 4));
    nb_tensor *w = x; /* any non-NULL value: cleared on failure */
    expect_error(nb_mha_forward(&m, nb_zeros(NB_F64, NB_SHAPE(3, 4)), x, x, NULL, false, NULL, &w),
                 "nb_mha_forward: q must be 3-d (B, L, d_model), got (3,4)");
    ck_assert_ptr_null(w); /* weights_out is cleared on failure */
    expect_error(nb_mha_forward(&m, x, nb_zeros(NB_F64, NB_SHAPE(2, 3, 5)), x, NULL, false, NULL,
                                NULL),
                 "nb_mha_forward: k (2,3,5) must have last dim d_model 4");
    expect_error(nb_mha_forward(&m, x, x, nb_zeros(NB_F64, NB_SHAPE(2, 3, 2, 2)), NULL, false,
                                NULL, NULL),
                 "nb_mha_forward", "v must be 3-d", "(2,3,2,2)");
    expect_error(nb_mha_forward(&m, x, nb_zeros(NB_F64, NB_SHAPE(3, 5, 4)),
                                nb_zeros(NB_F64, NB_SHAPE(3, 5, 4)), NULL, false, NULL, NULL),
                 "nb_mha_forward: batch sizes differ", "q (2,3,4)", "k (3,5,4)");
    expect_error(nb_mha_forward(&m, x, mem, x, NULL, false, NULL, NULL),
                 "nb_mha_forward: k (2,5,4) and v (2,3,4) must have the same length Lk (5 != 3)");
    /* masks that do not broadcast to (B,H,Lq,Lk) = (2,2,3,5) */
    expect_error(nb_mha_forward(&m, x, mem, mem, pad_mask(2, 4, (const int64_t[]){4, 4}), false,
                                NULL, NULL),
                 "nb_mha_forward: keep_mask (2,1,1,4) cannot be broadcast", "(2,2,3,5)");
    expect_error(nb_mha_forward(&m, x, mem, mem, nb_tril_mask(3, 3), false, NULL, NULL),
                 "nb_mha_forward", "keep_mask (3,3)", "(2,2,3,5)");
    expect_error(nb_mha_forward(&m, x, x, x, nb_ones(NB_BOOL, NB_SHAPE(3, 1, 3, 3)), false, NULL,
                                NULL),
                 "nb_mha_forward", "keep_mask (3,1,3,3)", "(2,2,3,3)");
    expect_error(nb_mha_forward(&m, x, x, x, nb_ones(NB_BOOL, NB_SHAPE(1, 2, 1, 3, 3)), false,
                                NULL, NULL),
                 "nb_mha_forward", "keep_mask (1,2,1,3,3)", "(2,2,3,3)");
    expect_error(nb_mha_forward(&m, x, x, x, nb_ones(NB_F64, NB_SHAPE(3, 3)), false, NULL, NULL),
                 "nb_mha_forward: keep_mask must be bool", "f64");
    expect_error(nb_mha_forward(&m, nb_zeros(NB_F32, NB_SHAPE(2, 3, 4)), x, x, NULL, false, NULL,
                                NULL),
                 "nb_mha_forward: q is f32 but the parameters are f64");
    /* NULL: its own message, or the earlier one kept */
    nb_clear_error();
    expect_error(nb_mha_forward(&m, NULL, x, x, NULL, false, NULL, NULL),
                 "nb_mha_forward: input 0 is NULL");
    nb_tensor *bad = nb_matmul(x, x); /* (2,3,4) x (2,3,4): fails */
    ck_assert_ptr_null(bad);
    char first[256];
    snprintf(first, sizeof first, "%s", nb_last_error());
    ck_assert_ptr_null(nb_mha_forward(&m, bad, x, x, NULL, false, NULL, NULL));
    expect_error_after("nb_mha_forward: input 0 is NULL", first);
    nb_clear_error();
    expect_error(nb_mha_forward(NULL, x, x, x, NULL, false, NULL, NULL), "nb_mha_forward",
                 "module is NULL");
    nb_MHA zero = {0};
    expect_error(nb_mha_forward(&zero, x, x, x, NULL, false, NULL, NULL), "nb_mha_forward",
                 "not initialized");
    nb_scope_end();
    ck_assert_int_eq(nb_live_tensors(), live);
    nb_params_free(ps);
}
END_TEST

START_TEST(test_attention_errors) {
    nb_scope_begin();
    nb_tensor *q = nb_zeros(NB_F64, NB_SHAPE(2, 3, 4)), *k = nb_zeros(NB_F64, NB_SHAPE(2, 5, 4));
    nb_tensor *v = nb_zeros(NB_F64, NB_SHAPE(2, 5, 2));
    CHECK_NOT_NULL(nb_attention(q, k, v, NULL, 0.0, false, NULL, NULL));
    nb_tensor *w = q; /* any non-NULL value: cleared on failure */
    expect_error(nb_attention(q, nb_zeros(NB_F64, NB_SHAPE(2, 5, 3)), v, NULL, 0.0, false, NULL,
                              &w),
                 "nb_attention: q (2,3,4) and k (2,5,3) must have the same last dim D (4 != 3)");
    ck_assert_ptr_null(w);
    expect_error(nb_attention(q, k, nb_zeros(NB_F64, NB_SHAPE(2, 4, 2)), NULL, 0.0, false, NULL,
                              NULL),
                 "nb_attention: k (2,5,4) and v (2,4,2) must have the same length Lk", "(5 != 4)");
    expect_error(nb_attention(q, k, v, nb_ones(NB_F32, NB_SHAPE(3, 5)), 0.0, false, NULL, NULL),
                 "nb_attention: keep_mask must be bool", "f32 (3,5)");
    expect_error(nb_attention(q, k, v, nb_tril_mask(3, 3), 0.0, false, NULL, NULL),
                 "nb_attention: keep_mask (3,3) cannot be broadcast to the scores' shape (2,3,5)",
                 "q (2,3,4)", "k (2,5,4)");
    /* masks that would make the scores bigger: more dims, or a bigger size */
    expect_error(nb_attention(q, k, v, nb_ones(NB_BOOL, NB_SHAPE(4, 1, 3, 5)), 0.0, false, NULL,
                              NULL),
                 "nb_attention", "keep_mask (4,1,3,5)", "(2,3,5)");
    nb_tensor *q1 = nb_zeros(NB_F64, NB_SHAPE(1, 2, 3, 4)), *k1 = nb_zeros(NB_F64, NB_SHAPE(1, 2, 5, 4));
    nb_tensor *v1 = nb_zeros(NB_F64, NB_SHAPE(1, 2, 5, 2));
    expect_error(nb_attention(q1, k1, v1, nb_ones(NB_BOOL, NB_SHAPE(2, 1, 1, 5)), 0.0, false,
                              NULL, NULL),
                 "nb_attention", "keep_mask (2,1,1,5)", "(1,2,3,5)");
    /* broadcasting masks that fit are fine: (Lk), (1,Lk), (B,1,Lk) on 3-d scores */
    CHECK_NOT_NULL(nb_attention(q, k, v, nb_ones(NB_BOOL, NB_SHAPE(5)), 0.0, false, NULL, NULL));
    CHECK_NOT_NULL(nb_attention(q, k, v, nb_ones(NB_BOOL, NB_SHAPE(2, 1, 5)), 0.0, false, NULL,
                                NULL));
    expect_error(nb_attention(nb_zeros(NB_F64, NB_SHAPE(4)), k, v, NULL, 0.0, false, NULL, NULL),
                 "nb_attention", "at least 2-d", "q (4)");
    expect_error(nb_attention(q, nb_zeros(NB_F32, NB_SHAPE(2, 5, 4)), v, NULL, 0.0, false, NULL,
                              NULL),
                 "nb_attention", "one dtype", "f64, f32 and f64");
    expect_error(nb_attention(nb_zeros(NB_I64, NB_SHAPE(2, 3, 4)), k, v, NULL, 0.0, false, NULL,
                              NULL),
                 "nb_attention", "floating", "i64");
    expect_error(nb_attention(q, nb_zeros(NB_F64, NB_SHAPE(3, 5, 4)), v, NULL, 0.0, false, NULL,
                              NULL),
                 "nb_attention", "batch dims of q (2,3,4) and k (3,5,4)");
    expect_error(nb_attention(q, k, nb_zeros(NB_F64, NB_SHAPE(3, 5, 2)), NULL, 0.0, false, NULL,
                              NULL),
                 "nb_attention", "batch dims of v (3,5,2)");
    expect_error(nb_attention(q, k, v, NULL, 1.5, true, NULL, NULL),
                 "nb_attention: dropout_p must be in [0, 1], got 1.5");
    expect_error(nb_attention(q, k, v, NULL, -0.5, false, NULL, NULL), "nb_attention", "dropout_p");
    expect_error(nb_attention(nb_zeros(NB_F64, NB_SHAPE(2, 3, 0)), nb_zeros(NB_F64, NB_SHAPE(2, 5, 0)),
                              v, NULL, 0.0, false, NULL, NULL),
                 "nb_attention", "last dim 0");
    nb_clear_error();
    expect_error(nb_attention(NULL, k, v, NULL, 0.0, false, NULL, NULL), "nb_attention: input 0 is NULL");
    expect_error(nb_attention(q, k, NULL, NULL, 0.0, false, NULL, NULL), "nb_attention");
    nb_scope_end();
}
END_TEST

/* ---------------------------------------------------------- memory */
START_TEST(test_no_leak) {
    int64_t live = nb_live_tensors();
    nb_params *ps = nb_params_new();
    nb_MHA m;
    nb_rng r;
    nb_rng_seed(&r, 5);
    ck_assert_int_eq(nb_mha_init(&m, ps, "leak", 8, 2, 0.2, true, &r), 0);
    for (int step = 0; step < 3; step++) {
        nb_scope_begin();
        nb_tensor *x = nb_randn(NB_F32, NB_SHAPE(2, 4, 8), &r);
        nb_tensor *mem = nb_randn(NB_F32, NB_SHAPE(2, 6, 8), &r);
        nb_tensor *w = NULL;
        nb_tensor *y = nb_mha_forward(&m, x, x, x, nb_tril_mask(4, 4), true, &r, &w);
        y = nb_mha_forward(&m, y, mem, mem, pad_mask(2, 6, (const int64_t[]){6, 3}), true, &r, &w);
        CHECK_NOT_NULL(y);
        CHECK_NOT_NULL(w);
        ck_assert_int_eq(nb_backward(nb_sum_all(y)), 0);
        nb_tensor *q = rand_leaf(60, NB_SHAPE(2, 3, 4));
        CHECK_NOT_NULL(nb_attention(q, q, q, nb_tril_mask(3, 3), 0.5, true, &r, &w));
        nb_params_zero_grad(ps);
        nb_scope_end();
    }
    nb_params_free(ps);
    ck_assert_int_eq(nb_live_tensors(), live);
}
END_TEST

Suite *suite_attention(void) {
    Suite *s = suite_create("attention");
    TCase *tc = tcase_create("attention");
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, test_attention_vs_torch_f64, 0, NATT);
    tcase_add_loop_test(tc, test_attention_vs_torch_f32, 0, NATT);
    tcase_add_test(tc, test_mask_shapes);
    tcase_add_test(tc, test_fully_masked_rows);
    tcase_add_test(tc, test_all_masked);
    tcase_add_test(tc, test_weights_out_after_dropout);
    tcase_add_test(tc, test_gradcheck_attention);
    tcase_add_test(tc, test_gradcheck_attention_shapes);
    tcase_add_test(tc, test_gradcheck_attention_dropout);
    tcase_add_test(tc, test_higher_order_attention);
    suite_add_tcase(s, tc);

    tc = tcase_create("mha");
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, test_mha_vs_torch_f64, 0, NMHA);
    tcase_add_loop_test(tc, test_mha_vs_torch_f32, 0, NMHA);
    tcase_add_test(tc, test_mha_mask_broadcast);
    tcase_add_test(tc, test_mha_dropout_rng);
    tcase_add_test(tc, test_gradcheck_mha_inputs);
    tcase_add_test(tc, test_gradcheck_mha_params);
    tcase_add_test(tc, test_gradcheck_mha_dropout);
    tcase_add_test(tc, test_higher_order_mha);
    tcase_add_test(tc, test_mha_param_names);
    suite_add_tcase(s, tc);

    tc = tcase_create("errors");
    tcase_add_test(tc, test_mha_init_errors);
    tcase_add_test(tc, test_mha_forward_errors);
    tcase_add_test(tc, test_attention_errors);
    tcase_add_test(tc, test_no_leak);
    suite_add_tcase(s, tc);
    return s;
}
