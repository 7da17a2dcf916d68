/* test_views.c: view and shape ops (nb_view, nb_reshape, nb_transpose,
 * nb_permute, nb_unsqueeze, nb_squeeze, nb_expand, nb_narrow, nb_select,
 * nb_contiguous, nb_cat, nb_to) against PyTorch (tests/fixtures/gen_views.py):
 * forward values in f64 and f32; views share storage (writes through a view
 * reach the base, data pointers and strides are as expected); nb_view of a
 * transposed tensor fails and names nb_reshape; dtype conversions;
 * views of permuted tensors whose size-1 dims carry odd strides (strides and
 * values as PyTorch's computeStride gives them, no copy); nb_gradcheck,
 * nb_gradgradcheck and forward-mode gradcheck of every op on contiguous,
 * transposed and broadcast inputs; the tangent of a slice's gradient (the
 * embedding create_graph records); gradients through chains of views
 * against torch autograd; bad input. */
#include "test_util.h"

#include <stdlib.h>

static const char *FX = "views.txt";

#define CHECK_NOT_NULL(t) ck_assert_msg((t) != NULL, "%s", nb_last_error() ? nb_last_error() : "?")

static nb_tensor *F(const char *name) { return fx(FX, name); }

static void expect_shape(const nb_tensor *t, int ndim, const int64_t *shape) {
    CHECK_NOT_NULL(t);
    ck_assert_int_eq(nb_ndim(t), ndim);
    for (int i = 0; i < ndim; i++)
        ck_assert_msg(nb_shape(t)[i] == shape[i], "dim %d: %lld, expected %lld", i,
                      (long long)nb_shape(t)[i], (long long)shape[i]);
}

static void expect_strides(const nb_tensor *t, int ndim, const int64_t *strides) {
    CHECK_NOT_NULL(t);
    ck_assert_int_eq(nb_ndim(t), ndim);
    for (int i = 0; i < ndim; i++)
        ck_assert_msg(nb_strides(t)[i] == strides[i], "stride %d: %lld, expected %lld", i,
                      (long long)nb_strides(t)[i], (long long)strides[i]);
}

/* Whether t's first element lies in base's memory (f64 or f32 elements). */
static bool inside(nb_tensor *t, nb_tensor *base) {
    const char *p = nb_data(t), *b = nb_data(base);
    size_t es = nb_dtype_of(base) == NB_F32 ? 4 : 8;
    return p >= b && p < b + (size_t)nb_numel(base) * es;
}

/* The values 0, 1, ..., n-1 in f64, shaped. */
static nb_tensor *iota(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    nb_tensor *t = nb_view(nb_arange(NB_F64, n), ndim, shape);
    CHECK_NOT_NULL(t);
    return t;
}

static void expect_values(nb_tensor *t, int64_t n, const double *want) {
    CHECK_NOT_NULL(t);
    ck_assert_int_eq(nb_numel(t), n);
    double *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    ck_assert_int_eq(nb_copy_to_f64(t, v), 0);
    for (int64_t i = 0; i < n; i++) {
        if (v[i] != want[i]) {
            double got = v[i];
            free(v);
            ck_abort_msg("element %lld is %g, expected %g", (long long)i, got, want[i]);
        }
    }
    free(v);
}

/* ------------------------------------------------------ the cases (table) */
#define ARGS nb_tensor **in, int n, void *ctx
#define UNUSED (void)n, (void)ctx
static nb_tensor *f_view_4x6(ARGS) { UNUSED; return nb_view(in[0], NB_SHAPE(4, 6)); }
static nb_tensor *f_view_m1x2(ARGS) { UNUSED; return nb_view(in[0], NB_SHAPE(-1, 2)); }
static nb_tensor *f_view_2xm1(ARGS) { UNUSED; return nb_view(in[0], NB_SHAPE(2, -1)); }
static nb_tensor *f_view_flat(ARGS) { UNUSED; return nb_view(in[0], NB_SHAPE(24)); }
static nb_tensor *f_view_split(ARGS) { UNUSED; return nb_view(in[0], NB_SHAPE(2, 3, 2, 2)); }
static nb_tensor *f_view_tr_split(ARGS) {
    UNUSED;
    return nb_view(nb_transpose(in[0], 0, 1), NB_SHAPE(3, 2, 2, 2));
}
static nb_tensor *f_reshape_view(ARGS) { UNUSED; return nb_reshape(in[0], NB_SHAPE(6, 4)); }
static nb_tensor *f_reshape_tr(ARGS) {
    UNUSED;
    return nb_reshape(nb_transpose(in[0], 0, 1), NB_SHAPE(3, 8));
}
static nb_tensor *f_reshape_tr_m1(ARGS) {
    UNUSED;
    return nb_reshape(nb_transpose(in[0], 1, 2), NB_SHAPE(-1, 3));
}
static nb_tensor *f_transpose_01(ARGS) { UNUSED; return nb_transpose(in[0], 0, 1); }
static nb_tensor *f_transpose_02(ARGS) { UNUSED; return nb_transpose(in[0], 0, 2); }
static nb_tensor *f_transpose_m1m2(ARGS) { UNUSED; return nb_transpose(in[0], -1, -2); }
static nb_tensor *f_permute_201(ARGS) { UNUSED; return nb_permute(in[0], 3, (const int[]){2, 0, 1}); }
static nb_tensor *f_permute_120(ARGS) { UNUSED; return nb_permute(in[0], 3, (const int[]){1, 2, 0}); }
static nb_tensor *f_permute_m1_0_1(ARGS) {
    UNUSED;
    return nb_permute(in[0], 3, (const int[]){-1, 0, 1});
}
static nb_tensor *f_unsqueeze_0(ARGS) { UNUSED; return nb_unsqueeze(in[0], 0); }
static nb_tensor *f_unsqueeze_2(ARGS) { UNUSED; return nb_unsqueeze(in[0], 2); }
static nb_tensor *f_unsqueeze_3(ARGS) { UNUSED; return nb_unsqueeze(in[0], 3); }
static nb_tensor *f_unsqueeze_m1(ARGS) { UNUSED; return nb_unsqueeze(in[0], -1); }
static nb_tensor *f_squeeze_1(ARGS) { UNUSED; return nb_squeeze(in[0], 1); }
static nb_tensor *f_squeeze_m2(ARGS) { UNUSED; return nb_squeeze(in[0], -2); }
static nb_tensor *f_squeeze_0(ARGS) { UNUSED; return nb_squeeze(in[0], 0); }
static nb_tensor *f_expand_234(ARGS) { UNUSED; return nb_expand(in[0], NB_SHAPE(2, 3, 4)); }
static nb_tensor *f_expand_c_m1(ARGS) { UNUSED; return nb_expand(in[0], NB_SHAPE(-1, 5)); }
static nb_tensor *f_expand_e_m1(ARGS) { UNUSED; return nb_expand(in[0], NB_SHAPE(2, -1, 4)); }
static nb_tensor *f_narrow_1_1_2(ARGS) { UNUSED; return nb_narrow(in[0], 1, 1, 2); }
static nb_tensor *f_narrow_2_0_3(ARGS) { UNUSED; return nb_narrow(in[0], 2, 0, 3); }
static nb_tensor *f_narrow_m1_m2_2(ARGS) { UNUSED; return nb_narrow(in[0], -1, -2, 2); }
static nb_tensor *f_select_1_2(ARGS) { UNUSED; return nb_select(in[0], 1, 2); }
static nb_tensor *f_select_m1_m1(ARGS) { UNUSED; return nb_select(in[0], -1, -1); }
static nb_tensor *f_select_0_1(ARGS) { UNUSED; return nb_select(in[0], 0, 1); }
static nb_tensor *f_cat_0(ARGS) { (void)ctx; return nb_cat(in, n, 0); }
static nb_tensor *f_cat_1(ARGS) { (void)ctx; return nb_cat(in, n, 1); }
static nb_tensor *f_cat_m1(ARGS) { (void)ctx; return nb_cat(in, n, -1); }
static nb_tensor *f_cat_tr(ARGS) {
    UNUSED;
    nb_tensor *l[2] = {nb_transpose(in[0], 0, 1), in[1]};
    return nb_cat(l, 2, 0);
}
static nb_tensor *f_contiguous_tr(ARGS) { UNUSED; return nb_contiguous(nb_transpose(in[0], 0, 2)); }

typedef struct {
    const char *name;   /* fixture of the output (and <name>_32) */
    const char *in[3];  /* fixtures of the inputs (and <in>32) */
    int nin;
    nb_fn fn;
    const char *label;  /* for gradcheck */
    bool shares;        /* the result is a view of in[0] */
    bool gc;            /* gradcheck with contiguous leaves of the inputs' shapes */
    bool tr;            /* gradcheck with a transposed leaf of the same shape */
} vcase;

static const vcase cases[] = {
    {"view_4x6", {"a"}, 1, f_view_4x6, "nb_view (4,6)", true, true, false},
    {"view_m1x2", {"a"}, 1, f_view_m1x2, "nb_view (-1,2)", true, true, false},
    {"view_2xm1", {"a"}, 1, f_view_2xm1, "nb_view (2,-1)", true, true, false},
    {"view_flat", {"a"}, 1, f_view_flat, "nb_view (24)", true, true, false},
    {"view_split", {"a"}, 1, f_view_split, "nb_view (2,3,2,2)", true, true, true},
    {"view_tr_split", {"a"}, 1, f_view_tr_split, "nb_view of a transpose (3,2,2,2)", true, true, true},
    {"reshape_view", {"a"}, 1, f_reshape_view, "nb_reshape view path", true, true, false},
    {"reshape_tr", {"a"}, 1, f_reshape_tr, "nb_reshape copy path", false, true, true},
    {"reshape_tr_m1", {"a"}, 1, f_reshape_tr_m1, "nb_reshape copy path (-1,3)", false, true, true},
    {"transpose_01", {"a"}, 1, f_transpose_01, "nb_transpose 0 1", true, true, true},
    {"transpose_02", {"a"}, 1, f_transpose_02, "nb_transpose 0 2", true, true, true},
    {"transpose_m1m2", {"a"}, 1, f_transpose_m1m2, "nb_transpose -1 -2", true, true, true},
    {"permute_201", {"a"}, 1, f_permute_201, "nb_permute (2,0,1)", true, true, true},
    {"permute_120", {"a"}, 1, f_permute_120, "nb_permute (1,2,0)", true, true, true},
    {"permute_m1_0_1", {"a"}, 1, f_permute_m1_0_1, "nb_permute (-1,0,1)", true, true, true},
    {"unsqueeze_0", {"a"}, 1, f_unsqueeze_0, "nb_unsqueeze 0", true, true, true},
    {"unsqueeze_2", {"a"}, 1, f_unsqueeze_2, "nb_unsqueeze 2", true, true, true},
    {"unsqueeze_3", {"a"}, 1, f_unsqueeze_3, "nb_unsqueeze 3", true, true, true},
    {"unsqueeze_m1", {"a"}, 1, f_unsqueeze_m1, "nb_unsqueeze -1", true, true, true},
    {"squeeze_1", {"b"}, 1, f_squeeze_1, "nb_squeeze 1", true, true, true},
    {"squeeze_m2", {"b"}, 1, f_squeeze_m2, "nb_squeeze -2", true, true, true},
    {"squeeze_0", {"b"}, 1, f_squeeze_0, "nb_squeeze 0 (no-op)", true, true, true},
    {"expand_c", {"c"}, 1, f_expand_234, "nb_expand (3,1)->(2,3,4)", true, true, false},
    {"expand_c_m1", {"c"}, 1, f_expand_c_m1, "nb_expand (3,1)->(-1,5)", true, true, false},
    {"expand_e", {"e"}, 1, f_expand_234, "nb_expand (1,3,1)->(2,3,4)", true, true, false},
    {"expand_e_m1", {"e"}, 1, f_expand_e_m1, "nb_expand (1,3,1)->(2,-1,4)", true, true, false},
    {"narrow_1_1_2", {"a"}, 1, f_narrow_1_1_2, "nb_narrow 1 1 2", true, true, true},
    {"narrow_2_0_3", {"a"}, 1, f_narrow_2_0_3, "nb_narrow 2 0 3", true, true, true},
    {"narrow_m1_m2_2", {"a"}, 1, f_narrow_m1_m2_2, "nb_narrow -1 -2 2", true, true, true},
    {"select_1_2", {"a"}, 1, f_select_1_2, "nb_select 1 2", true, true, true},
    {"select_m1_m1", {"a"}, 1, f_select_m1_m1, "nb_select -1 -1", true, true, true},
    {"select_0_1", {"a"}, 1, f_select_0_1, "nb_select 0 1", true, true, true},
    {"cat_0", {"cat0_p", "cat0_q", "cat0_r"}, 3, f_cat_0, "nb_cat dim 0", false, false, false},
    {"cat_1", {"cat1_p", "cat1_q", "cat1_r"}, 3, f_cat_1, "nb_cat dim 1", false, true, true},
    {"cat_m1", {"catm1_p", "catm1_q", "catm1_r"}, 3, f_cat_m1, "nb_cat dim -1", false, true, true},
    {"cat_tr", {"cattr_p", "cattr_q"}, 2, f_cat_tr, "nb_cat of a transpose", false, true, true},
    {"contiguous_tr", {"a"}, 1, f_contiguous_tr, "nb_contiguous copy", false, true, true},
};
#define NCASES (int)(sizeof cases / sizeof cases[0])

START_TEST(test_forward_fixtures) {
    const vcase *c = &cases[_i];
    nb_tensor *in[3], *in32[3];
    char name[96];
    for (int k = 0; k < c->nin; k++) {
        in[k] = F(c->in[k]);
        snprintf(name, sizeof name, "%s32", c->in[k]);
        in32[k] = F(name);
    }
    nb_tensor *want = F(c->name);
    snprintf(name, sizeof name, "%s_32", c->name);
    nb_tensor *want32 = F(name);
    nb_scope_begin();
    nb_tensor *y = c->fn(in, c->nin, NULL);
    expect_close(y, want, 0, 0); /* pure data movement: exact */
    ck_assert_int_eq(nb_dtype_of(y), NB_F64);
    ck_assert(!nb_requires_grad(y));
    ck_assert_msg(inside(y, in[0]) == c->shares, "%s: expected %s", c->name,
                  c->shares ? "a view of the input" : "a copy");
    nb_tensor *y32 = c->fn(in32, c->nin, NULL);
    expect_close(y32, want32, 0, 0);
    ck_assert_int_eq(nb_dtype_of(y32), NB_F32);
    ck_assert(inside(y32, in32[0]) == c->shares);
    nb_scope_end();
}
END_TEST

/* ------------------------------------------------------------ shared storage */
START_TEST(test_views_share_storage) {
    nb_scope_begin();
    nb_tensor *a = iota(NB_SHAPE(2, 3, 4));
    expect_strides(a, NB_SHAPE(12, 4, 1));
    ck_assert(nb_is_contiguous(a));
    double *base = nb_data(a);

    /* narrow: offset start * stride, same strides; a write reaches a */
    nb_tensor *nar = nb_narrow(a, 1, 1, 2);
    expect_shape(nar, NB_SHAPE(2, 2, 4));
    expect_strides(nar, NB_SHAPE(12, 4, 1));
    ck_assert_ptr_eq(nb_data(nar), base + 4);
    ck_assert(!nb_is_contiguous(nar));
    ck_assert_int_eq(nb_copy_into(nar, nb_scalar(NB_F64, -1)), 0);
    for (int i = 0; i < 24; i++) {
        int j = (i / 4) % 3;
        ck_assert_double_eq(base[i], j >= 1 ? -1 : i);
    }

    /* transpose: same pointer, swapped strides, not contiguous */
    nb_tensor *t = nb_transpose(a, 0, 2);
    expect_shape(t, NB_SHAPE(4, 3, 2));
    expect_strides(t, NB_SHAPE(1, 4, 12));
    ck_assert_ptr_eq(nb_data(t), base);
    ck_assert(!nb_is_contiguous(t));
    /* t[1] is a[:, :, 1] */
    nb_tensor *t1 = nb_select(t, 0, 1);
    expect_strides(t1, NB_SHAPE(4, 12));
    ck_assert_ptr_eq(nb_data(t1), base + 1);
    ck_assert_int_eq(nb_copy_into(t1, nb_scalar(NB_F64, 100)), 0);
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++) ck_assert_double_eq(base[i * 12 + j * 4 + 1], 100);
    ck_assert_double_eq(base[0], 0);
    ck_assert_double_eq(base[2], 2);

    /* the base sees writes through a view of a view */
    nb_tensor *v = nb_view(a, NB_SHAPE(6, 4));
    ck_assert_ptr_eq(nb_data(v), base);
    ck_assert(nb_is_contiguous(v));
    ck_assert_int_eq(nb_copy_into(nb_select(v, 0, 5), iota(NB_SHAPE(4))), 0);
    for (int k = 0; k < 4; k++) ck_assert_double_eq(base[20 + k], k);
    /* ... and the view sees writes to the base */
    ck_assert_int_eq(nb_copy_into(a, nb_scalar(NB_F64, 3)), 0);
    double vv[24];
    ck_assert_int_eq(nb_copy_to_f64(t, vv), 0);
    for (int i = 0; i < 24; i++) ck_assert_double_eq(vv[i], 3);

    /* permute, unsqueeze, squeeze, select, reshape (view path): no copy */
    nb_tensor *p = nb_permute(a, 3, (const int[]){2, 0, 1});
    expect_strides(p, NB_SHAPE(1, 12, 4));
    ck_assert_ptr_eq(nb_data(p), base);
    nb_tensor *u = nb_unsqueeze(a, 1);
    expect_shape(u, NB_SHAPE(2, 1, 3, 4));
    expect_strides(u, NB_SHAPE(12, 12, 4, 1));
    ck_assert_ptr_eq(nb_data(u), base);
    ck_assert(nb_is_contiguous(u));
    nb_tensor *ue = nb_unsqueeze(a, 3); /* past the last dim: stride 1 */
    expect_strides(ue, NB_SHAPE(12, 4, 1, 1));
    nb_tensor *sq = nb_squeeze(u, 1);
    expect_shape(sq, NB_SHAPE(2, 3, 4));
    expect_strides(sq, NB_SHAPE(12, 4, 1));
    ck_assert_ptr_eq(nb_data(sq), base);
    nb_tensor *s = nb_select(a, 2, -1);
    expect_shape(s, NB_SHAPE(2, 3));
    expect_strides(s, NB_SHAPE(12, 4));
    ck_assert_ptr_eq(nb_data(s), base + 3);
    nb_tensor *r = nb_reshape(a, NB_SHAPE(4, 6));
    ck_assert_ptr_eq(nb_data(r), base);
    /* views of a slice keep its offset; merging across the gap is refused */
    nb_tensor *row = nb_view(nb_narrow(a, 0, 1, 1), NB_SHAPE(12));
    CHECK_NOT_NULL(row);
    ck_assert_ptr_eq(nb_data(row), base + 12);
    nb_tensor *mid = nb_narrow(a, 1, 1, 2);
    nb_tensor *mv = nb_view(mid, NB_SHAPE(2, 8));
    CHECK_NOT_NULL(mv);
    expect_strides(mv, NB_SHAPE(12, 1));
    ck_assert_ptr_eq(nb_data(mv), base + 4);
    expect_error(nb_view(mid, NB_SHAPE(16)), "nb_view", "nb_reshape");
    nb_tensor *mr = nb_reshape(mid, NB_SHAPE(16));
    CHECK_NOT_NULL(mr);
    ck_assert(!inside(mr, a));
    /* nb_contiguous and nb_to of the same dtype: a new handle, same memory */
    ck_assert_ptr_eq(nb_data(nb_contiguous(a)), base);
    ck_assert_ptr_eq(nb_data(nb_to(a, NB_F64)), base);
    /* nb_contiguous of a transpose copies into row-major order */
    nb_tensor *tc = nb_contiguous(t);
    ck_assert(nb_is_contiguous(tc));
    ck_assert_ptr_ne(nb_data(tc), base);
    expect_strides(tc, NB_SHAPE(6, 2, 1));
    nb_scope_end();
}
END_TEST

START_TEST(test_expand_stride0) {
    nb_scope_begin();
    nb_tensor *c = iota(NB_SHAPE(3, 1));
    nb_tensor *e = nb_expand(c, NB_SHAPE(2, 3, 4));
    expect_shape(e, NB_SHAPE(2, 3, 4));
    expect_strides(e, NB_SHAPE(0, 1, 0));
    ck_assert_ptr_eq(nb_data(e), nb_data(c));
    ck_assert(!nb_is_contiguous(e));
    double want[24];
    for (int i = 0; i < 24; i++) want[i] = (i / 4) % 3;
    expect_values(e, 24, want);
    /* a write to the base shows in every copy */
    ck_assert_int_eq(nb_copy_into(nb_select(c, 0, 1), nb_scalar(NB_F64, 9)), 0);
    for (int i = 0; i < 24; i++) if ((i / 4) % 3 == 1) want[i] = 9;
    expect_values(e, 24, want);
    /* a write into an expanded view is refused */
    ck_assert_int_eq(nb_copy_into(e, nb_scalar(NB_F64, 1)), -1);
    ck_assert_ptr_nonnull(strstr(nb_last_error(), "nb_copy_into"));
    nb_clear_error();
    /* -1 keeps a size; expanding to the same shape is a plain view */
    expect_strides(nb_expand(c, NB_SHAPE(-1, 5)), NB_SHAPE(1, 0));
    expect_strides(nb_expand(c, NB_SHAPE(3, 1)), NB_SHAPE(1, 1));
    /* a size-1 dim may expand to 0 */
    expect_shape(nb_expand(c, NB_SHAPE(3, 0)), NB_SHAPE(3, 0));
    /* nb_reshape of an expanded tensor copies (the strides cannot say it) */
    nb_tensor *r = nb_reshape(e, NB_SHAPE(24));
    CHECK_NOT_NULL(r);
    ck_assert(nb_is_contiguous(r));
    expect_values(r, 24, want);
    expect_error(nb_view(e, NB_SHAPE(24)), "nb_view", "nb_reshape");
    /* ... but may still view when the stride-0 dims are not merged */
    nb_tensor *ve = nb_view(e, NB_SHAPE(2, 3, 2, 2));
    CHECK_NOT_NULL(ve);
    expect_strides(ve, NB_SHAPE(0, 1, 0, 0));
    nb_scope_end();
}
END_TEST

/* ------------------------------------------------------------ view / reshape */
START_TEST(test_view_of_transpose_fails) {
    nb_tensor *fa = F("a"), *want = F("reshape_tr");
    nb_scope_begin();
    nb_tensor *t = nb_transpose(fa, 0, 1);
    expect_error(nb_view(t, NB_SHAPE(3, 8)), "nb_view", "nb_reshape");
    expect_error(nb_view(t, NB_SHAPE(24)), "nb_view", "nb_reshape");
    expect_error(nb_view(t, NB_SHAPE(-1)), "nb_view", "nb_reshape", "(3,2,4)");
    int64_t live = nb_live_tensors();
    nb_tensor *r = nb_reshape(t, NB_SHAPE(3, 8));
    expect_close(r, want, 0, 0);
    ck_assert(nb_is_contiguous(r));
    ck_assert(!inside(r, fa)); /* a copy */
    ck_assert_int_eq(nb_live_tensors(), live + 1);
    /* the copy does not alias: writing it leaves the fixture alone */
    double a0 = nb_item(nb_select(nb_select(nb_select(fa, 0, 0), 0, 0), 0, 0));
    ck_assert_int_eq(nb_copy_into(r, nb_scalar(NB_F64, 1e9)), 0);
    ck_assert_double_eq(nb_item(nb_select(nb_select(nb_select(fa, 0, 0), 0, 0), 0, 0)), a0);
    nb_scope_end();
}
END_TEST

/* A permuted tensor (of arange values, narrowed first where the case says)
 * whose size-1 dims carry strides no contiguous tensor has, viewed to a new
 * shape: PyTorch views it in place (computeStride skips size-1 dims when it
 * looks for runs of dims contiguous in memory), so nb_view must succeed with
 * PyTorch's strides and share storage, and nb_reshape must not copy. */
typedef struct {
    const char *name;
    int nd;
    int64_t shape[4];
    int nar[3]; /* dim, start, length; length 0: no narrow */
    int perm[4];
    int vnd;
    int64_t vshape[4];
} odd_case;

static const odd_case odd_cases[] = { /* tests/fixtures/gen_views.py's ODD */
    {"odd_a", 3, {1, 2, 4}, {0, 0, 0}, {1, 0, 2}, 4, {1, 4, 1, 2}},
    {"odd_b", 4, {2, 1, 3, 2}, {0, 0, 0}, {0, 2, 1, 3}, 2, {2, 6}},
    {"odd_c", 3, {1, 2, 3}, {0, 0, 0}, {1, 2, 0}, 3, {3, 2, 1}},
    {"odd_d", 4, {3, 1, 1, 4}, {0, 0, 0}, {2, 0, 3, 1}, 3, {2, 1, 6}},
    {"odd_e", 3, {2, 3, 4}, {1, 1, 1}, {1, 0, 2}, 3, {2, 2, 2}},
    {"odd_f", 3, {2, 3, 4}, {1, 2, 1}, {2, 1, 0}, 4, {2, 1, 2, 2}},
};
#define NODD (int)(sizeof odd_cases / sizeof odd_cases[0])

START_TEST(test_view_odd_size1_strides) {
    const odd_case *c = &odd_cases[_i];
    char name[64];
    snprintf(name, sizeof name, "%s_strides", c->name);
    nb_tensor *want = F(c->name), *want_st = F(name);
    const int64_t *st = nb_data(want_st);
    nb_scope_begin();
    nb_tensor *base = iota(c->nd, c->shape);
    nb_tensor *t = c->nar[2] ? nb_narrow(base, c->nar[0], c->nar[1], c->nar[2]) : base;
    nb_tensor *p = nb_permute(t, c->nd, c->perm);
    nb_tensor *v = nb_view(p, c->vnd, c->vshape);
    CHECK_NOT_NULL(v);
    expect_strides(v, c->vnd, st);
    expect_close(v, want, 0, 0);
    ck_assert(inside(v, base));
    nb_tensor *r = nb_reshape(p, c->vnd, c->vshape); /* the same view, no copy */
    expect_strides(r, c->vnd, st);
    ck_assert_ptr_eq(nb_data(r), nb_data(v));
    /* a write through the view reaches the base, there and only there */
    ck_assert_int_eq(nb_copy_into(v, nb_scalar(NB_F64, -1)), 0);
    double *tv = values(t), *bv = values(base);
    int64_t written = 0;
    for (int64_t k = 0; k < nb_numel(t); k++) ck_assert_double_eq(tv[k], -1);
    for (int64_t k = 0; k < nb_numel(base); k++) written += bv[k] == -1;
    free(tv);
    free(bv);
    ck_assert_int_eq(written, nb_numel(v));
    nb_scope_end();
}
END_TEST

START_TEST(test_view_infers) {
    nb_scope_begin();
    nb_tensor *a = iota(NB_SHAPE(2, 3, 4));
    expect_shape(nb_view(a, NB_SHAPE(-1)), NB_SHAPE(24));
    expect_shape(nb_view(a, NB_SHAPE(3, -1, 2)), NB_SHAPE(3, 4, 2));
    expect_shape(nb_view(a, NB_SHAPE(-1, 8)), NB_SHAPE(3, 8));
    expect_shape(nb_view(a, NB_SHAPE(1, 1, -1, 1)), NB_SHAPE(1, 1, 24, 1));
    expect_shape(nb_reshape(nb_transpose(a, 0, 2), NB_SHAPE(-1, 6)), NB_SHAPE(4, 6));
    /* to and from 0-d */
    nb_tensor *one = nb_view(nb_select(nb_view(a, NB_SHAPE(-1)), 0, 5), NB_SHAPE(1, 1));
    expect_shape(one, NB_SHAPE(1, 1));
    ck_assert_double_eq(nb_item(one), 5);
    nb_tensor *z = nb_view(one, 0, NULL);
    expect_shape(z, 0, NULL);
    ck_assert_double_eq(nb_item(z), 5);
    expect_shape(nb_view(nb_scalar(NB_F64, 2), NB_SHAPE(-1)), NB_SHAPE(1));
    /* empty tensors: -1 resolves when the other sizes are nonzero */
    nb_tensor *e = nb_zeros(NB_F64, NB_SHAPE(0, 3));
    expect_shape(nb_view(e, NB_SHAPE(-1)), NB_SHAPE(0));
    expect_shape(nb_view(e, NB_SHAPE(3, -1, 2)), NB_SHAPE(3, 0, 2));
    expect_shape(nb_reshape(e, NB_SHAPE(5, 0)), NB_SHAPE(5, 0));
    /* i64 and bool tensors have views too */
    nb_tensor *iv = nb_view(nb_arange(NB_I64, 6), NB_SHAPE(2, 3));
    CHECK_NOT_NULL(iv);
    ck_assert_int_eq(nb_dtype_of(iv), NB_I64);
    ck_assert_double_eq(nb_item(nb_select(nb_select(nb_transpose(iv, 0, 1), 0, 2), 0, 1)), 5);
    nb_scope_end();
}
END_TEST

/* ---------------------------------------------------------------------- to */
START_TEST(test_to_values) {
    static const struct {
        const char *src, *want;
        nb_dtype to;
    } tc[] = {
        {"to_src", "to_f64_f32", NB_F32},       {"to_src", "to_f64_i64", NB_I64},
        {"to_src", "to_f64_bool", NB_BOOL},     {"to_src_i64", "to_i64_f64", NB_F64},
        {"to_src_i64", "to_i64_f32", NB_F32},   {"to_src_i64", "to_i64_bool", NB_BOOL},
        {"to_src_bool", "to_bool_f64", NB_F64}, {"to_src_bool", "to_bool_f32", NB_F32},
        {"to_src_bool", "to_bool_i64", NB_I64},
    };
    nb_tensor *src[9], *want[9];
    for (int k = 0; k < 9; k++) {
        src[k] = F(tc[k].src);
        want[k] = F(tc[k].want);
    }
    nb_tensor *f32_i64 = F("to_f32_i64"), *f32_bool = F("to_f32_bool"), *f32_f64 = F("to_f32_f64");
    nb_scope_begin();
    for (int k = 0; k < 9; k++) {
        nb_tensor *y = nb_to(src[k], tc[k].to);
        CHECK_NOT_NULL(y);
        ck_assert_int_eq(nb_dtype_of(y), tc[k].to);
        ck_assert_msg(nb_dtype_of(y) == nb_dtype_of(want[k]), "%s", tc[k].want);
        expect_close(y, want[k], 0, 0);
        ck_assert(!inside(y, src[k]) || nb_dtype_of(src[k]) == tc[k].to);
    }
    nb_tensor *f = nb_to(src[0], NB_F32);
    expect_close(nb_to(f, NB_I64), f32_i64, 0, 0);
    expect_close(nb_to(f, NB_BOOL), f32_bool, 0, 0);
    expect_close(nb_to(f, NB_F64), f32_f64, 0, 0);
    /* round trips that are exact: i64 -> f64 -> i64, bool -> i64 -> f32 -> bool */
    expect_close(nb_to(nb_to(src[3], NB_F64), NB_I64), src[3], 0, 0);
    expect_close(nb_to(nb_to(nb_to(src[6], NB_I64), NB_F32), NB_BOOL), src[6], 0, 0);
    /* f64 -> i64 truncates toward zero, -> bool is "nonzero"; read by hand too */
    nb_tensor *h = nb_from_data(NB_F64, NB_SHAPE(6), (const double[]){-2.7, -0.5, -0.0, 0.5, 2.9, NAN});
    double hv[6];
    nb_copy_to_f64(nb_to(nb_narrow(h, 0, 0, 5), NB_I64), hv);
    const double ti[5] = {-2, 0, 0, 0, 2};
    for (int i = 0; i < 5; i++) ck_assert_double_eq(hv[i], ti[i]);
    nb_copy_to_f64(nb_to(h, NB_BOOL), hv);
    const double tb[6] = {1, 1, 0, 1, 1, 1};
    for (int i = 0; i < 6; i++) ck_assert_double_eq(hv[i], tb[i]);
    /* a non-contiguous source converts in logical order */
    nb_tensor *tt = nb_to(nb_transpose(src[3], 0, 1), NB_F64);
    CHECK_NOT_NULL(tt);
    expect_shape(tt, NB_SHAPE(4, 2));
    ck_assert(nb_is_contiguous(tt));
    ck_assert_double_eq(nb_item(nb_select(nb_select(tt, 0, 1), 0, 1)), -7);
    nb_scope_end();
}
END_TEST

START_TEST(test_to_backward_dtype) {
    nb_tensor *fx1 = F("x1"), *fw = F("to_rt_w"), *want_out = F("to_rt_out"), *want = F("to_rt_grad");
    nb_scope_begin();
    /* f64 leaf -> f32 -> f64: the gradient comes back f64, rounded through f32 */
    nb_tensor *leaf = nb_zeros(NB_F64, NB_SHAPE(3, 4));
    ck_assert_int_eq(nb_copy_into(leaf, fx1), 0);
    nb_set_requires_grad(leaf, true);
    nb_tensor *y32 = nb_to(leaf, NB_F32);
    CHECK_NOT_NULL(y32);
    ck_assert_int_eq(nb_dtype_of(y32), NB_F32);
    ck_assert(nb_requires_grad(y32));
    nb_tensor *y = nb_to(y32, NB_F64);
    expect_close(y, want_out, 0, 0);
    ck_assert_int_eq(nb_backward(nb_sum_all(nb_mul(y, fw))), 0);
    nb_tensor *g = nb_grad(leaf);
    CHECK_NOT_NULL(g);
    ck_assert_int_eq(nb_dtype_of(g), NB_F64);
    expect_close(g, want, 0, 0);
    /* an f32 leaf through f64 gets an f32 gradient */
    nb_tensor *l32 = nb_set_requires_grad(nb_to(fx1, NB_F32), true);
    CHECK_NOT_NULL(l32);
    ck_assert_int_eq(nb_backward(nb_sum_all(nb_to(l32, NB_F64))), 0);
    ck_assert_int_eq(nb_dtype_of(nb_grad(l32)), NB_F32);
    double gv[12];
    nb_copy_to_f64(nb_grad(l32), gv);
    for (int i = 0; i < 12; i++) ck_assert_double_eq(gv[i], 1);
    /* conversions to i64 and bool record nothing */
    ck_assert(!nb_requires_grad(nb_to(leaf, NB_I64)));
    ck_assert(!nb_requires_grad(nb_to(leaf, NB_BOOL)));
    nb_scope_end();
}
END_TEST

/* ---------------------------------------------------------------- gradcheck */
/* A leaf of the given shape whose strides are reversed (a transposed view of
 * randn data made without grad), requiring grad. */
static nb_tensor *reversed_leaf(uint64_t seed, int ndim, const int64_t *shape) {
    int64_t rs[NB_MAX_DIMS];
    int perm[NB_MAX_DIMS];
    for (int i = 0; i < ndim; i++) {
        rs[i] = shape[ndim - 1 - i];
        perm[i] = ndim - 1 - i;
    }
    nb_rng r;
    nb_rng_seed(&r, seed);
    nb_tensor *v = nb_permute(nb_randn(NB_F64, ndim, rs, &r), ndim, perm);
    CHECK_NOT_NULL(v);
    ck_assert(nb_is_leaf(v));
    return nb_set_requires_grad(v, true);
}

START_TEST(test_gradcheck_cases) {
    const vcase *c = &cases[_i];
    if (!c->gc) return;
    nb_tensor *shape_of[3];
    for (int k = 0; k < c->nin; k++) shape_of[k] = F(c->in[k]);
    char label[128];
    nb_scope_begin();
    nb_tensor *in[3];
    for (int k = 0; k < c->nin; k++) {
        ck_assert(nb_numel(shape_of[k]) <= 24);
        in[k] = rand_leaf((uint64_t)(100 + 3 * _i + k), nb_ndim(shape_of[k]), nb_shape(shape_of[k]));
    }
    snprintf(label, sizeof label, "%s contiguous", c->label);
    expect_all_orders(label, c->fn, NULL, c->nin, in);
    if (c->tr) {
        for (int k = 0; k < c->nin; k++) {
            in[k] = reversed_leaf((uint64_t)(200 + 3 * _i + k), nb_ndim(shape_of[k]),
                                  nb_shape(shape_of[k]));
            ck_assert_msg(!nb_is_contiguous(in[k]), "%s: input %d is contiguous", c->name, k);
        }
        snprintf(label, sizeof label, "%s transposed", c->label);
        expect_all_orders(label, c->fn, NULL, c->nin, in);
    }
    nb_scope_end();
}
END_TEST

static nb_tensor *f_to_f64(ARGS) { UNUSED; return nb_to(in[0], NB_F64); }
static nb_tensor *f_contig(ARGS) { UNUSED; return nb_contiguous(in[0]); }
static nb_tensor *f_expand_342(ARGS) { UNUSED; return nb_expand(in[0], NB_SHAPE(3, 4, 2)); }
static nb_tensor *f_expand_new(ARGS) { UNUSED; return nb_expand(in[0], NB_SHAPE(2, 2, 3)); }
/* x (2,3): a broadcast (expanded) operand fed to a view op */
static nb_tensor *f_expand_then_view(ARGS) {
    UNUSED;
    return nb_select(nb_transpose(nb_expand(in[0], NB_SHAPE(2, 2, 3)), 0, 2), 1, 1);
}
static nb_tensor *f_expand_reshape(ARGS) {
    UNUSED;
    return nb_reshape(nb_expand(in[0], NB_SHAPE(2, 3, 2)), NB_SHAPE(-1));
}
static nb_tensor *f_scalar_views(ARGS) { /* 0-d -> (1) -> (1,1) -> (2,3) -> (3,2) -> (3) */
    UNUSED;
    nb_tensor *y = nb_view(nb_unsqueeze(in[0], 0), NB_SHAPE(1, 1));
    y = nb_transpose(nb_expand(y, NB_SHAPE(2, 3)), 0, 1);
    return nb_select(y, 1, 1);
}
static nb_tensor *f_expand_scalar(ARGS) { UNUSED; return nb_expand(in[0], NB_SHAPE(2, 3)); }
static nb_tensor *f_cat_dup(ARGS) { /* the same tensor twice: gradients add up */
    UNUSED;
    nb_tensor *l[3] = {in[0], in[1], in[0]};
    return nb_cat(l, 3, 0);
}

START_TEST(test_gradcheck_more) {
    nb_scope_begin();
    nb_tensor *in[3];
    /* cat with 3 inputs along dim 0 and dim 1 (small) */
    in[0] = rand_leaf(1, NB_SHAPE(2, 3));
    in[1] = rand_leaf(2, NB_SHAPE(1, 3));
    in[2] = rand_leaf(3, NB_SHAPE(3, 3));
    expect_all_orders("nb_cat dim 0", f_cat_0, NULL, 3, in);
    in[0] = reversed_leaf(4, NB_SHAPE(2, 3));
    in[2] = reversed_leaf(5, NB_SHAPE(3, 3));
    expect_all_orders("nb_cat dim 0 transposed", f_cat_0, NULL, 3, in);
    in[0] = rand_leaf(6, NB_SHAPE(2, 2));
    in[1] = rand_leaf(7, NB_SHAPE(2, 1));
    in[2] = reversed_leaf(8, NB_SHAPE(2, 3));
    expect_all_orders("nb_cat dim 1", f_cat_1, NULL, 3, in);
    in[0] = rand_leaf(9, NB_SHAPE(2, 3));
    in[1] = rand_leaf(10, NB_SHAPE(1, 3));
    expect_all_orders("nb_cat same input twice", f_cat_dup, NULL, 2, in);
    /* more inputs than a graph node holds inline */
    nb_tensor *in5[5] = {rand_leaf(30, NB_SHAPE(1, 2)), rand_leaf(31, NB_SHAPE(2, 2)),
                         reversed_leaf(32, NB_SHAPE(2, 2)), rand_leaf(33, NB_SHAPE(0, 2)),
                         rand_leaf(34, NB_SHAPE(3, 2))};
    expect_all_orders("nb_cat 5 inputs dim 0", f_cat_0, NULL, 5, in5);
    /* only some inputs require grad */
    nb_rng r;
    nb_rng_seed(&r, 11);
    in[0] = nb_randn(NB_F64, NB_SHAPE(2, 3), &r);
    in[1] = rand_leaf(12, NB_SHAPE(2, 1));
    in[2] = nb_randn(NB_F64, NB_SHAPE(2, 2), &r);
    expect_all_orders("nb_cat dim 1, one input requires grad", f_cat_1, NULL, 3, in);

    /* nb_to f64 -> f64 (a new handle) and nb_contiguous on both layouts */
    in[0] = rand_leaf(13, NB_SHAPE(3, 4));
    expect_all_orders("nb_to f64->f64 contiguous", f_to_f64, NULL, 1, in);
    expect_all_orders("nb_contiguous contiguous (no copy)", f_contig, NULL, 1, in);
    in[0] = reversed_leaf(14, NB_SHAPE(3, 4));
    expect_all_orders("nb_to f64->f64 transposed", f_to_f64, NULL, 1, in);
    expect_all_orders("nb_contiguous transposed (copy)", f_contig, NULL, 1, in);

    /* expand of a non-contiguous leaf, and new leading dims */
    in[0] = reversed_leaf(15, NB_SHAPE(3, 1, 2));
    ck_assert(!nb_is_contiguous(in[0]));
    expect_all_orders("nb_expand transposed (3,1,2)->(3,4,2)", f_expand_342, NULL, 1, in);
    in[0] = reversed_leaf(16, NB_SHAPE(2, 3));
    expect_all_orders("nb_expand transposed new leading dim", f_expand_new, NULL, 1, in);
    /* broadcast inputs into other view ops */
    in[0] = rand_leaf(17, NB_SHAPE(2, 3));
    expect_all_orders("nb_transpose/nb_select broadcast", f_expand_then_view, NULL, 1, in);
    in[0] = rand_leaf(18, NB_SHAPE(3, 1));
    expect_all_orders("nb_reshape copy path broadcast", f_expand_reshape, NULL, 1, in);
    /* 0-d leaves */
    in[0] = rand_leaf(19, 0, NULL);
    expect_all_orders("nb_expand 0-d", f_expand_scalar, NULL, 1, in);
    expect_all_orders("nb_unsqueeze/nb_view/nb_expand 0-d", f_scalar_views, NULL, 1, in);
    nb_scope_end();
}
END_TEST

/* (x (3,4), v (2)) -> d<v, x.narrow(1, 1, 2)[1]>/dx with create_graph: v
 * embedded into zeros of x's shape, by an op create_graph records. */
static nb_tensor *slice_vjp(ARGS) {
    UNUSED;
    bool was = nb_grad_enabled();
    nb_set_grad_enabled(true);
    nb_tensor *y = nb_select(nb_narrow(in[0], 1, 1, 2), 0, 1), *g = NULL;
    nb_backward_opts o = {.create_graph = true};
    int rc = y ? nb_autograd_grad(&y, 1, &in[1], &in[0], 1, &o, &g) : -1;
    nb_set_grad_enabled(was);
    return rc ? NULL : g;
}

/* A slice's gradient under create_graph: its own gradient is the slice of
 * the upstream one (gradcheck, gradgradcheck), and its tangent, forward over
 * reverse, the same embedding of v's tangent (x's tangent adds nothing). */
START_TEST(test_slice_gradient_orders) {
    nb_scope_begin();
    nb_tensor *in[2] = {rand_leaf(70, NB_SHAPE(3, 4)), rand_leaf(71, NB_SHAPE(2))};
    expect_gradcheck("slice gradient (embedding)", slice_vjp, NULL, 2, in);
    expect_gradgradcheck("slice gradient (embedding)", slice_vjp, NULL, 2, in);
    nb_tensor *tan[2] = {nb_ones(NB_F64, NB_SHAPE(3, 4)),
                         nb_from_data(NB_F64, NB_SHAPE(2), (const double[]){2, -3})};
    nb_tensor *out, *out_t;
    ck_assert_msg(nb_jvp(slice_vjp, NULL, 2, in, tan, &out, &out_t) == 0, "%s", nb_last_error());
    double want[12] = {0}, vv[2];
    ck_assert_int_eq(nb_copy_to_f64(in[1], vv), 0);
    want[5] = 2;
    want[6] = -3;
    expect_values(out_t, 12, want);
    want[5] = vv[0];
    want[6] = vv[1];
    expect_values(out, 12, want);
    nb_scope_end();
}
END_TEST

/* nb_to between floating dtypes: its tangent and double backward convert
 * the same way (f64 -> f32 -> f64, within f32's rounding). */
static nb_tensor *f_to_f32_f64(ARGS) { UNUSED; return nb_to(nb_to(in[0], NB_F32), NB_F64); }

START_TEST(test_to_orders) {
    nb_scope_begin();
    nb_tensor *x = rand_leaf(72, NB_SHAPE(3, 4));
    nb_gradcheck_opts o = NB_GRADCHECK_DEFAULTS;
    o.eps = 1e-3; /* f32 steps */
    o.atol = 1e-4;
    nb_gradcheck_result r;
    ck_assert_msg(nb_gradgradcheck(f_to_f32_f64, NULL, 1, &x, &o, &r), "%s", r.message);
    o.check_forward_ad = true;
    ck_assert_msg(nb_gradcheck(f_to_f32_f64, NULL, 1, &x, &o, &r), "%s", r.message);
    nb_tensor *out, *out_t, *t = nb_transpose(rand_leaf(73, NB_SHAPE(4, 3)), 0, 1);
    ck_assert_int_eq(nb_jvp(f_to_f32_f64, NULL, 1, &x, &t, &out, &out_t), 0);
    ck_assert_int_eq(nb_dtype_of(out_t), NB_F64);
    expect_close(out_t, nb_to(nb_to(t, NB_F32), NB_F64), 0, 0);
    nb_scope_end();
}
END_TEST

/* --------------------------------------------------------- chains of views */
static nb_tensor *chain1(ARGS) {
    UNUSED;
    nb_tensor *x = in[0];
    nb_tensor *y = nb_reshape(nb_transpose(x, 0, 1), NB_SHAPE(-1)); /* copy path */
    y = nb_view(nb_narrow(y, 0, 2, 8), NB_SHAPE(2, 4));
    y = nb_expand(nb_unsqueeze(y, 0), NB_SHAPE(3, 2, 4));
    y = nb_permute(y, 3, (const int[]){2, 0, 1});
    return nb_select(y, 1, 0);
}
static nb_tensor *chain2(ARGS) {
    UNUSED;
    nb_tensor *x = in[0];
    nb_tensor *y = nb_reshape(nb_narrow(nb_transpose(x, 0, 2), 1, 1, 2), NB_SHAPE(8, 2));
    nb_tensor *l[2] = {y, nb_narrow(y, 0, 0, 3)};
    nb_tensor *z = nb_transpose(nb_contiguous(nb_cat(l, 2, 0)), 0, 1);
    z = nb_squeeze(nb_unsqueeze(z, 1), 1);
    return nb_squeeze(nb_contiguous(nb_transpose(z, -1, -2)), 0);
}

START_TEST(test_chain_vs_torch) {
    static const char *names[] = {"chain1", "chain2"};
    static const nb_fn fns[] = {chain1, chain2};
    static const char *xs[] = {"x1", "x2"};
    char nm[64];
    nb_tensor *fxx = F(xs[_i]);
    snprintf(nm, sizeof nm, "%s_w", names[_i]);
    nb_tensor *fw = F(nm);
    snprintf(nm, sizeof nm, "%s_out", names[_i]);
    nb_tensor *fout = F(nm);
    snprintf(nm, sizeof nm, "%s_grad", names[_i]);
    nb_tensor *fg = F(nm);
    snprintf(nm, sizeof nm, "%s_grad_32", names[_i]);
    nb_tensor *fg32 = F(nm);
    for (int p = 0; p < 2; p++) {
        nb_dtype dt = p ? NB_F32 : NB_F64;
        nb_scope_begin();
        nb_tensor *x = nb_zeros(dt, nb_ndim(fxx), nb_shape(fxx));
        ck_assert_int_eq(nb_copy_into(x, fxx), 0);
        nb_set_requires_grad(x, true);
        nb_tensor *y = fns[_i](&x, 1, NULL);
        CHECK_NOT_NULL(y);
        ck_assert(nb_requires_grad(y));
        expect_close(y, fout, p ? 1e-7 : 0, p ? 1e-6 : 0);
        ck_assert_int_eq(nb_backward(nb_sum_all(nb_mul(y, nb_to(fw, dt)))), 0);
        ck_assert_int_eq(nb_dtype_of(nb_grad(x)), dt);
        expect_close(nb_grad(x), p ? fg32 : fg, p ? 1e-6 : 1e-12, p ? 1e-5 : 1e-12);
        nb_scope_end();
    }
    nb_scope_begin();
    nb_tensor *leaf = rand_leaf(40 + (uint64_t)_i, nb_ndim(fxx), nb_shape(fxx));
    snprintf(nm, sizeof nm, "view chain %d", _i + 1);
    expect_all_orders(nm, fns[_i], NULL, 1, &leaf);
    nb_tensor *tl = reversed_leaf(50 + (uint64_t)_i, nb_ndim(fxx), nb_shape(fxx));
    snprintf(nm, sizeof nm, "view chain %d transposed", _i + 1);
    expect_all_orders(nm, fns[_i], NULL, 1, &tl);
    nb_scope_end();
}
END_TEST

START_TEST(test_no_leak) {
    int64_t live = nb_live_tensors();
    nb_scope_begin();
    nb_tensor *x = rand_leaf(60, NB_SHAPE(2, 3, 4));
    for (int rep = 0; rep < 2; rep++) {
        nb_tensor *y = chain2(&x, 1, NULL);
        ck_assert_int_eq(nb_backward(nb_sum_all(y)), 0);
    }
    nb_tensor *v = nb_view(x, NB_SHAPE(24));
    nb_free(v); /* an early free of a view leaves the base alone */
    ck_assert_double_eq(nb_item(nb_sum_all(nb_mul_scalar(x, 0))), 0);
    nb_scope_end();
    ck_assert_int_eq(nb_live_tensors(), live);
}
END_TEST

/* --------------------------------------------------------------------- errors */
START_TEST(test_error_view_shapes) {
    nb_scope_begin();
    nb_tensor *a = nb_zeros(NB_F64, NB_SHAPE(2, 3, 4));
    expect_error(nb_view(a, NB_SHAPE(5, -1)), "nb_view: shape (5,-1) is invalid for input of 24 elements");
    expect_error(nb_reshape(a, NB_SHAPE(-1, 7)), "nb_reshape: shape (-1,7) is invalid for input of 24 elements");
    expect_error(nb_view(a, NB_SHAPE(5, 5)),
                 "nb_view: shape (5,5) is invalid for input of shape (2,3,4) (24 elements)");
    expect_error(nb_reshape(a, NB_SHAPE(25)), "nb_reshape", "(25)", "(2,3,4)", "24 elements");
    expect_error(nb_view(a, NB_SHAPE(0, -1)), "nb_view", "(0,-1)", "invalid");
    /* two -1s, and negative sizes */
    expect_error(nb_view(a, NB_SHAPE(-1, -1)), "nb_view", "-1", "(-1,-1)");
    expect_error(nb_reshape(a, NB_SHAPE(-1, 2, -1)), "nb_reshape", "(-1,2,-1)");
    expect_error(nb_view(a, NB_SHAPE(-2, -12)), "nb_view: invalid size -2 in shape (-2,-12)");
    /* too many dims, NULL shape */
    expect_error(nb_view(a, NB_SHAPE(1, 1, 1, 1, 1, 2, 3, 4, 1)), "nb_view", "ndim 9 out of range");
    expect_error(nb_reshape(a, 2, NULL), "nb_reshape", "shape is NULL");
    nb_scope_end();
}
END_TEST

START_TEST(test_error_dims) {
    nb_scope_begin();
    nb_tensor *a = nb_zeros(NB_F64, NB_SHAPE(2, 3, 4));
    expect_error(nb_permute(a, 3, (const int[]){0, 0, 1}), "nb_permute: dim 0 appears twice");
    expect_error(nb_permute(a, 3, (const int[]){2, 1, -1}), "nb_permute", "dim 2 appears twice");
    expect_error(nb_permute(a, 2, (const int[]){0, 1}), "nb_permute: got 2 dims for a 3-d tensor");
    expect_error(nb_permute(a, 3, (const int[]){0, 1, 3}), "nb_permute", "dim 3 out of range");
    expect_error(nb_permute(a, 3, NULL), "nb_permute");
    expect_error(nb_transpose(a, 0, 3), "nb_transpose", "dim 3 out of range");
    expect_error(nb_transpose(a, -4, 1), "nb_transpose", "dim -4 out of range");
    expect_error(nb_squeeze(a, 3), "nb_squeeze", "dim 3 out of range");
    expect_error(nb_unsqueeze(a, 4), "nb_unsqueeze", "dim 4 out of range", "(expected -4..3)");
    expect_error(nb_unsqueeze(a, -5), "nb_unsqueeze", "dim -5 out of range");
    /* 8 dims is the maximum */
    nb_tensor *t8 = nb_zeros(NB_F64, NB_SHAPE(1, 2, 1, 2, 1, 2, 1, 2));
    CHECK_NOT_NULL(t8);
    expect_error(nb_unsqueeze(t8, 0), "nb_unsqueeze: tensor already has the maximum of 8 dims");
    expect_error(nb_unsqueeze(nb_unsqueeze(nb_zeros(NB_F64, NB_SHAPE(1, 1, 1, 1, 1, 1, 1)), 0), -1),
                 "nb_unsqueeze", "maximum of 8 dims");
    expect_error(nb_expand(a, NB_SHAPE(1, 1, 1, 1, 1, 1, 2, 3, 4)), "nb_expand", "9 dims");
    nb_scope_end();
}
END_TEST

/* nbi_dim is called with ndim + 1, so the message names a (ndim+1)-d tensor */
START_TEST(test_error_unsqueeze_names_real_ndim) {
    /* the scope is closed before asserting, so that a failure (CK_FORK=no)
     * leaves no scope open for the tests after it */
    char msg[512];
    nb_scope_begin();
    nb_tensor *r = nb_unsqueeze(nb_zeros(NB_F64, NB_SHAPE(2, 3, 4)), 4);
    snprintf(msg, sizeof msg, "%s", nb_last_error() ? nb_last_error() : "");
    nb_clear_error();
    nb_scope_end();
    ck_assert_ptr_null(r);
    ck_assert_msg(strstr(msg, "nb_unsqueeze") && strstr(msg, "dim 4 out of range"), "%s", msg);
    ck_assert_msg(strstr(msg, "4-d tensor") == NULL && strstr(msg, "3-d") != NULL,
                  "message describes the 3-d input as a 4-d tensor: \"%s\"", msg);
}
END_TEST

START_TEST(test_error_narrow_select) {
    nb_scope_begin();
    nb_tensor *a = nb_zeros(NB_F64, NB_SHAPE(2, 3, 4));
    expect_error(nb_narrow(a, 1, 2, 2),
                 "nb_narrow: start 2 and length 2 out of range for dim 1 of size 3");
    expect_error(nb_narrow(a, 1, 4, 0), "nb_narrow", "start 4", "out of range");
    expect_error(nb_narrow(a, 2, 0, -1), "nb_narrow", "length -1", "out of range");
    expect_error(nb_narrow(a, 3, 0, 1), "nb_narrow", "dim 3 out of range");
    expect_error(nb_narrow(nb_scalar(NB_F64, 1), 0, 0, 1), "nb_narrow: cannot narrow a 0-d tensor");
    expect_shape(nb_narrow(a, 1, 3, 0), NB_SHAPE(2, 0, 4)); /* an empty slice at the end is fine */
    expect_error(nb_select(a, 1, 3), "nb_select: index 3 out of range for dim 1 of size 3");
    expect_error(nb_select(a, -1, -5), "nb_select", "index -5 out of range", "size 4");
    expect_error(nb_select(a, 3, 0), "nb_select", "dim 3 out of range");
    expect_error(nb_select(nb_scalar(NB_F64, 1), 0, 0), "nb_select: cannot select from a 0-d tensor");
    nb_scope_end();
}
END_TEST

/* A negative start counts from the end; the message should show the start
 * the caller passed, not the wrapped one. */
START_TEST(test_error_narrow_negative_start) {
    nb_scope_begin();
    nb_tensor *a = nb_zeros(NB_F64, NB_SHAPE(2, 3, 4));
    expect_error(nb_narrow(a, 1, -5, 1), "nb_narrow", "start -5", "dim 1 of size 3");
    nb_scope_end();
}
END_TEST

START_TEST(test_error_expand) {
    nb_scope_begin();
    nb_tensor *c = nb_zeros(NB_F64, NB_SHAPE(3, 1));
    expect_error(nb_expand(c, NB_SHAPE(2, 4, 4)),
                 "nb_expand: cannot expand shape (3,1) to (2,4,4) (dim 1: 3 is not 1)");
    expect_error(nb_expand(c, NB_SHAPE(3)), "nb_expand: cannot expand a 2-d tensor to 1 dims");
    expect_error(nb_expand(c, NB_SHAPE(-1, 3, 1)), "nb_expand", "size -1", "leading dim 0");
    expect_error(nb_expand(c, NB_SHAPE(6, 1)), "nb_expand", "(3,1)", "(6,1)");
    nb_scope_end();
}
END_TEST

/* A negative size other than -1 where the input has size 1: the message must
 * not claim "1 is not 1". */
START_TEST(test_error_expand_negative_size) {
    char msg[512];
    nb_scope_begin();
    nb_tensor *r = nb_expand(nb_zeros(NB_F64, NB_SHAPE(3, 1)), NB_SHAPE(3, -2));
    snprintf(msg, sizeof msg, "%s", nb_last_error() ? nb_last_error() : "");
    nb_clear_error();
    nb_scope_end();
    ck_assert_ptr_null(r);
    ck_assert_msg(strstr(msg, "nb_expand") && strstr(msg, "-2"), "%s", msg);
    ck_assert_msg(strstr(msg, "1 is not 1") == NULL, "misleading message: \"%s\"", msg);
}
END_TEST

START_TEST(test_error_cat) {
    nb_scope_begin();
    nb_tensor *a = nb_zeros(NB_F64, NB_SHAPE(2, 3)), *b = nb_zeros(NB_F64, NB_SHAPE(2, 4));
    nb_tensor *l[3] = {a, b, a};
    expect_error(nb_cat(l, 2, 0), "nb_cat: tensor 1 has shape (2,4), expected (2,3) except in dim 0");
    expect_shape(nb_cat(l, 3, 1), NB_SHAPE(2, 10)); /* fine along dim 1 */
    nb_tensor *l2[2] = {a, nb_zeros(NB_F64, NB_SHAPE(2, 3, 1))};
    expect_error(nb_cat(l2, 2, 0), "nb_cat", "tensor 1 has shape (2,3,1)");
    nb_tensor *l3[2] = {a, nb_zeros(NB_F32, NB_SHAPE(2, 3))};
    expect_error(nb_cat(l3, 2, 0), "nb_cat", "dtype mismatch", "f64", "f32");
    nb_tensor *l4[2] = {nb_zeros(NB_I64, NB_SHAPE(1, 3)), nb_zeros(NB_BOOL, NB_SHAPE(1, 3))};
    expect_error(nb_cat(l4, 2, 0), "nb_cat", "dtype mismatch", "i64", "bool");
    expect_error(nb_cat(l, 2, 2), "nb_cat", "dim 2 out of range");
    expect_error(nb_cat(l, 0, 0), "nb_cat: needs at least one tensor (n = 0)");
    expect_error(nb_cat(NULL, 2, 0), "nb_cat", "at least one tensor");
    nb_tensor *l5[2] = {nb_scalar(NB_F64, 1), nb_scalar(NB_F64, 2)};
    expect_error(nb_cat(l5, 2, 0), "nb_cat: cannot concatenate 0-d tensors");
    nb_clear_error();
    nb_tensor *l6[2] = {a, NULL};
    expect_error(nb_cat(l6, 2, 0), "nb_cat: input 1 is NULL");
    /* i64 and bool tensors concatenate (no gradient) */
    nb_tensor *i1 = nb_arange(NB_I64, 3), *i2 = nb_arange(NB_I64, 2);
    nb_tensor *li[2] = {i1, i2};
    const double want[5] = {0, 1, 2, 0, 1};
    expect_values(nb_cat(li, 2, -1), 5, want);
    nb_scope_end();
}
END_TEST

START_TEST(test_error_to_and_null) {
    nb_scope_begin();
    nb_tensor *a = nb_zeros(NB_F64, NB_SHAPE(2, 3));
    expect_error(nb_to(a, (nb_dtype)7), "nb_to: unknown dtype 7");
    nb_scope_end();
    nb_clear_error();
    expect_error(nb_view(NULL, NB_SHAPE(2)), "nb_view: input 0 is NULL");
    expect_error(nb_reshape(NULL, NB_SHAPE(2)), "nb_reshape: input 0 is NULL");
    expect_error(nb_transpose(NULL, 0, 1), "nb_transpose: input 0 is NULL");
    expect_error(nb_permute(NULL, 2, (const int[]){1, 0}), "nb_permute: input 0 is NULL");
    expect_error(nb_unsqueeze(NULL, 0), "nb_unsqueeze: input 0 is NULL");
    expect_error(nb_squeeze(NULL, 0), "nb_squeeze: input 0 is NULL");
    expect_error(nb_expand(NULL, NB_SHAPE(2)), "nb_expand: input 0 is NULL");
    expect_error(nb_narrow(NULL, 0, 0, 1), "nb_narrow: input 0 is NULL");
    expect_error(nb_select(NULL, 0, 0), "nb_select: input 0 is NULL");
    expect_error(nb_contiguous(NULL), "nb_contiguous: input 0 is NULL");
    expect_error(nb_to(NULL, NB_F32), "nb_to: input 0 is NULL");
    /* the first error survives a chain of views */
    nb_scope_begin();
    nb_tensor *x = nb_zeros(NB_F64, NB_SHAPE(2, 3));
    nb_tensor *bad = nb_view(nb_transpose(x, 0, 1), NB_SHAPE(6));
    ck_assert_ptr_null(bad);
    char first[512];
    snprintf(first, sizeof first, "%s", nb_last_error());
    ck_assert_ptr_null(nb_contiguous(nb_select(nb_unsqueeze(nb_transpose(bad, 0, 0), 0), 0, 0)));
    expect_error_after("nb_contiguous: input 0 is NULL", first);
    nb_clear_error();
    nb_scope_end();
}
END_TEST

/* nb_stack: the new dim's range is one wider than the inputs'; shapes and
 * dtypes must agree; values land at [k] of the new dim, gradients come back. */
START_TEST(test_stack) {
    nb_scope_begin();
    nb_tensor *a = nb_from_data(NB_F64, NB_SHAPE(2, 2), (const double[]){1, 2, 3, 4});
    nb_tensor *b = nb_from_data(NB_F64, NB_SHAPE(2, 2), (const double[]){5, 6, 7, 8});
    nb_set_requires_grad(a, true);
    nb_tensor *l[2] = {a, nb_transpose(b, 0, 1)};
    nb_tensor *y = nb_stack(l, 2, -1); /* (2, 2, 2): y[i][j][k] = l[k][i][j] */
    ck_assert_ptr_nonnull(y);
    ck_assert_int_eq(nb_ndim(y), 3);
    double v[8];
    ck_assert_int_eq(nb_copy_to_f64(y, v), 0);
    const double want[8] = {1, 5, 2, 7, 3, 6, 4, 8};
    for (int i = 0; i < 8; i++) ck_assert_double_eq(v[i], want[i]);
    ck_assert_int_eq(nb_backward(nb_sum_all(nb_select(y, 2, 0))), 0);
    ck_assert_int_eq(nb_copy_to_f64(nb_grad(a), v), 0);
    for (int i = 0; i < 4; i++) ck_assert_double_eq(v[i], 1);
    expect_error(nb_stack(l, 2, 3), "nb_stack", "dim 3 out of range for a 3-d tensor");
    expect_error(nb_stack(l, 2, -4), "nb_stack", "dim -4 out of range");
    expect_error(nb_stack(l, 0, 0), "nb_stack: needs at least one tensor (n = 0)");
    nb_tensor *bad[2] = {a, nb_zeros(NB_F64, NB_SHAPE(2, 3))};
    expect_error(nb_stack(bad, 2, 0), "nb_stack: tensor 1 has shape (2,3), expected (2,2)");
    bad[1] = nb_zeros(NB_F32, NB_SHAPE(2, 2));
    expect_error(nb_stack(bad, 2, 0), "nb_stack", "f32");
    nb_tensor *s[2] = {nb_scalar(NB_F64, 1), nb_scalar(NB_F64, 2)};
    y = nb_stack(s, 2, 0);
    ck_assert_int_eq(nb_ndim(y), 1);
    ck_assert_int_eq(nb_numel(y), 2);
    nb_scope_end();
}
END_TEST

/* nb_shares_memory: exact on views of one storage, as numpy's shares_memory */
START_TEST(test_shares_memory) {
    nb_scope_begin();
    nb_tensor *m = nb_zeros(NB_F32, NB_SHAPE(4, 6)), *other = nb_zeros(NB_F32, NB_SHAPE(4, 6));
    ck_assert(nb_shares_memory(m, m));
    ck_assert(nb_shares_memory(m, nb_transpose(m, 0, 1)));
    ck_assert(!nb_shares_memory(m, other));
    ck_assert(!nb_shares_memory(nb_narrow(m, 0, 0, 2), nb_narrow(m, 0, 2, 2)));  /* rows apart */
    ck_assert(nb_shares_memory(nb_narrow(m, 0, 0, 3), nb_narrow(m, 0, 2, 2)));   /* row 2 */
    ck_assert(!nb_shares_memory(nb_select(m, 1, 0), nb_select(m, 1, 1)));       /* interleaved */
    ck_assert(nb_shares_memory(nb_select(m, 1, 3), nb_select(nb_transpose(m, 0, 1), 0, 3)));
    nb_tensor *one = nb_zeros(NB_F32, NB_SHAPE(1));
    ck_assert(nb_shares_memory(nb_expand(one, NB_SHAPE(5)), one));
    ck_assert(!nb_shares_memory(nb_narrow(m, 0, 1, 0), m)); /* empty */
    ck_assert(!nb_shares_memory(m, NULL));
    ck_assert_msg(strstr(nb_last_error(), "nb_shares_memory: input 1 is NULL"), "%s",
                  nb_last_error());
    nb_clear_error();
    nb_scope_end();
}
END_TEST

/* Three overlapping narrows of one x (q, k, v of a qkv, cut 0-3, 2-5,
 * 6-7 of 8 columns), each reaching the loss through another layout of
 * gradient (_i: contiguous, transposed, stride 0), then x whole: the later
 * slices' backward finds x's gradient already summed and, in a plain
 * backward, adds into its slice in place (nbi_grad_sink). x's gradient must
 * be, bit for bit, that of a create_graph backward (which embeds each
 * slice's gradient into zeros and adds it whole), in f32 and f64. */
static nb_tensor *three_slices_loss(nb_tensor *x, nb_tensor *w, int layout) {
    nb_tensor *q = nb_narrow(x, 1, 0, 4), *k = nb_narrow(x, 1, 2, 4), *v = nb_narrow(x, 1, 6, 2);
    nb_tensor *parts[3] = {nb_sum_all(nb_mul(q, nb_narrow(w, 1, 0, 4))), NULL, NULL};
    nb_tensor *kt = nb_transpose(k, 0, 1); /* (4,5): its gradient a product's, transposed */
    parts[1] = nb_sum_all(nb_matmul(kt, nb_narrow(w, 1, 0, 4)));
    parts[2] = nb_sum_all(v); /* a stride-0 gradient */
    nb_tensor *order[3][3] = {{parts[0], parts[1], parts[2]}, {parts[1], parts[2], parts[0]},
                              {parts[2], parts[0], parts[1]}};
    nb_tensor *const *o = order[layout];
    return nb_add(nb_add(nb_add(o[0], o[1]), o[2]), nb_sum_all(nb_mul(x, x)));
}

START_TEST(test_slices_added_in_place_keep_the_bits) {
    nb_scope_begin();
    for (int dt = 0; dt < 2; dt++) {
        nb_rng r = {23, 0};
        nb_dtype d = dt ? NB_F64 : NB_F32;
        nb_tensor *x = nb_set_requires_grad(nb_randn(d, NB_SHAPE(5, 8), &r), true);
        nb_tensor *w = nb_randn(d, NB_SHAPE(5, 8), &r);
        nb_tensor *plain = NULL, *graph = NULL;
        nb_tensor *loss = three_slices_loss(x, w, _i);
        ck_assert_int_eq(nb_autograd_grad(&loss, 1, NULL, &x, 1, NULL, &plain), 0);
        loss = three_slices_loss(x, w, _i);
        nb_backward_opts o = {.create_graph = true};
        ck_assert_int_eq(nb_autograd_grad(&loss, 1, NULL, &x, 1, &o, &graph), 0);
        ck_assert_int_eq(nb_numel(plain), 40);
        ck_assert_msg(!memcmp(nb_data(plain), nb_data(nb_contiguous(graph)),
                              40 * (dt ? sizeof(double) : sizeof(float))),
                      "%s, order %d: the in-place slices' sum differs from the dense one",
                      nb_dtype_name(d), _i);
        /* and the values: 2x, plus w's first 4 columns in columns 0-3, plus
         * the row sums of those in 2-5 (k's), plus 1 in 6-7 (v's) */
        double xv[40], wv[40], got[40];
        nb_copy_to_f64(x, xv);
        nb_copy_to_f64(w, wv);
        nb_copy_to_f64(plain, got);
        for (int i = 0; i < 5; i++) {
            double rowsum = wv[i * 8] + wv[i * 8 + 1] + wv[i * 8 + 2] + wv[i * 8 + 3];
            for (int j = 0; j < 8; j++) {
                double want = 2 * xv[i * 8 + j] + (j < 4 ? wv[i * 8 + j] : 0) +
                              (j >= 2 && j < 6 ? rowsum : 0) + (j >= 6 ? 1 : 0);
                ck_assert_msg(fabs(got[i * 8 + j] - want) <= 1e-5 * (1 + fabs(want)),
                              "%s, order %d, x.grad[%d][%d]: %.9g, want %.9g", nb_dtype_name(d),
                              _i, i, j, got[i * 8 + j], want);
            }
        }
    }
    nb_scope_end();
}
END_TEST

Suite *suite_views(void) {
    Suite *s = suite_create("views");
    TCase *tc = tcase_create("forward");
    tcase_add_loop_test(tc, test_forward_fixtures, 0, NCASES);
    tcase_add_test(tc, test_views_share_storage);
    tcase_add_test(tc, test_expand_stride0);
    tcase_add_test(tc, test_view_of_transpose_fails);
    tcase_add_test(tc, test_view_infers);
    tcase_add_loop_test(tc, test_view_odd_size1_strides, 0, NODD);
    tcase_add_test(tc, test_to_values);
    suite_add_tcase(s, tc);

    tc = tcase_create("autograd");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_gradcheck_cases, 0, NCASES);
    tcase_add_test(tc, test_gradcheck_more);
    tcase_add_loop_test(tc, test_chain_vs_torch, 0, 2);
    tcase_add_test(tc, test_to_backward_dtype);
    tcase_add_test(tc, test_slice_gradient_orders);
    tcase_add_loop_test(tc, test_slices_added_in_place_keep_the_bits, 0, 3);
    tcase_add_test(tc, test_to_orders);
    tcase_add_test(tc, test_no_leak);
    suite_add_tcase(s, tc);

    tc = tcase_create("errors");
    tcase_add_test(tc, test_error_view_shapes);
    tcase_add_test(tc, test_error_dims);
    tcase_add_test(tc, test_error_unsqueeze_names_real_ndim);
    tcase_add_test(tc, test_error_narrow_select);
    tcase_add_test(tc, test_error_narrow_negative_start);
    tcase_add_test(tc, test_error_expand);
    tcase_add_test(tc, test_error_expand_negative_size);
    tcase_add_test(tc, test_error_cat);
    tcase_add_test(tc, test_stack);
    tcase_add_test(tc, test_error_to_and_null);
    tcase_add_test(tc, test_shares_memory);
    suite_add_tcase(s, tc);
    return s;
}
