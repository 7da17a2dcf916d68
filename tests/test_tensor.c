/* test_tensor.c: the tensor object itself: creation (values, shapes,
 * row-major strides, dtypes), NB_SHAPE, nb_from_data for every dtype,
 * inspection (nb_item, nb_size, nb_copy_to_f64 on views), nb_copy_into
 * (broadcasting, dtype conversion, writing through views, overlapping source
 * and destination, its errors), the default dtype, the counter-based rng,
 * nb_print and the thread count setting. */
#include "test_util.h"

#include <stdlib.h>
#include <unistd.h>

#define CHECK_NOT_NULL(t) \
    ck_assert_msg((t) != NULL, "%s", nb_last_error() ? nb_last_error() : "(no error set)")

/* All values of t in row-major order into out (which holds nb_numel(t)). */
static void read_values(const nb_tensor *t, double *out) {
    CHECK_NOT_NULL(t);
    ck_assert_int_eq(nb_copy_to_f64(t, out), 0);
}

static void expect_values(const nb_tensor *t, const double *want, int64_t n) {
    CHECK_NOT_NULL(t);
    ck_assert_int_eq(nb_numel(t), n);
    double *got = malloc((size_t)(n ? n : 1) * sizeof *got);
    read_values(t, got);
    for (int64_t i = 0; i < n; i++)
        ck_assert_msg(got[i] == want[i], "element %lld is %g, expected %g", (long long)i, got[i],
                      want[i]);
    free(got);
}

static void expect_shape(const nb_tensor *t, int ndim, const int64_t *shape) {
    CHECK_NOT_NULL(t);
    ck_assert_int_eq(nb_ndim(t), ndim);
    for (int i = 0; i < ndim; i++) ck_assert_int_eq(nb_shape(t)[i], shape[i]);
}

/* Contiguous row-major strides, as PyTorch computes them. */
static void expect_row_major(const nb_tensor *t) {
    int64_t s = 1;
    for (int i = nb_ndim(t) - 1; i >= 0; i--) {
        ck_assert_msg(nb_strides(t)[i] == s, "stride %lld at dim %d, expected %lld",
                      (long long)nb_strides(t)[i], i, (long long)s);
        s *= nb_shape(t)[i] ? nb_shape(t)[i] : 1;
    }
}

/* ------------------------------------------------------------------ creation */
START_TEST(test_shape_macro) {
    /* NB_SHAPE expands to the (ndim, shape) argument pair */
    struct { int n; const int64_t *s; } p = {NB_SHAPE(2, 3, 4)}, q = {NB_SHAPE(7)};
    ck_assert_int_eq(p.n, 3);
    ck_assert_int_eq(p.s[0], 2);
    ck_assert_int_eq(p.s[1], 3);
    ck_assert_int_eq(p.s[2], 4);
    ck_assert_int_eq(q.n, 1);
    ck_assert_int_eq(q.s[0], 7);
    nb_scope_begin();
    nb_tensor *t = nb_zeros(NB_F32, NB_SHAPE(2, 3, 4));
    expect_shape(t, 3, (const int64_t[]){2, 3, 4});
    nb_scope_end();
}
END_TEST

static const nb_dtype all_dtypes[] = {NB_F32, NB_F64, NB_I64, NB_BOOL};

START_TEST(test_zeros_ones_full_all_dtypes) {
    nb_dtype dt = all_dtypes[_i];
    nb_scope_begin();
    nb_tensor *z = nb_zeros(dt, NB_SHAPE(2, 3, 4));
    nb_tensor *o = nb_ones(dt, NB_SHAPE(2, 3, 4));
    nb_tensor *f = nb_full(dt, NB_SHAPE(2, 3, 4), dt == NB_BOOL ? 1.0 : 7.0);
    nb_tensor *e = nb_empty(dt, NB_SHAPE(2, 3, 4));
    nb_tensor *all[] = {z, o, f, e};
    for (int k = 0; k < 4; k++) {
        expect_shape(all[k], 3, (const int64_t[]){2, 3, 4});
        ck_assert_int_eq(nb_dtype_of(all[k]), dt);
        ck_assert_int_eq(nb_numel(all[k]), 24);
        ck_assert(nb_is_contiguous(all[k]));
        ck_assert_int_eq(nb_strides(all[k])[0], 12);
        ck_assert_int_eq(nb_strides(all[k])[1], 4);
        ck_assert_int_eq(nb_strides(all[k])[2], 1);
        ck_assert(!nb_requires_grad(all[k]));
        ck_assert(nb_is_leaf(all[k]));
    }
    double v[24];
    read_values(z, v);
    for (int i = 0; i < 24; i++) ck_assert(v[i] == 0.0);
    read_values(o, v);
    for (int i = 0; i < 24; i++) ck_assert(v[i] == 1.0);
    read_values(f, v);
    for (int i = 0; i < 24; i++) ck_assert(v[i] == (dt == NB_BOOL ? 1.0 : 7.0));
    nb_scope_end();
}
END_TEST

START_TEST(test_full_values) {
    nb_scope_begin();
    nb_tensor *a = nb_full(NB_F32, NB_SHAPE(3), 2.5);
    expect_values(a, (const double[]){2.5, 2.5, 2.5}, 3);
    nb_tensor *b = nb_full(NB_F64, NB_SHAPE(2), -1e-300);
    expect_values(b, (const double[]){-1e-300, -1e-300}, 2);
    nb_tensor *c = nb_full(NB_I64, NB_SHAPE(2), -42.0);
    expect_values(c, (const double[]){-42, -42}, 2);
    ck_assert_int_eq(((int64_t *)nb_data(c))[1], -42);
    nb_tensor *d = nb_full(NB_BOOL, NB_SHAPE(2), 0.0);
    expect_values(d, (const double[]){0, 0}, 2);
    nb_tensor *inf = nb_full(NB_F32, NB_SHAPE(1), -INFINITY);
    ck_assert(isinf(nb_item(inf)) && nb_item(inf) < 0);
    /* an i64 fill value out of range is an error, not undefined behaviour */
    expect_error(nb_full(NB_I64, NB_SHAPE(2), 1e30), "nb_full", "i64");
    nb_scope_end();
}
END_TEST

START_TEST(test_strides_row_major) {
    nb_scope_begin();
    static const int64_t shapes[][5] = {{1, 5}, {2, 7, 1}, {3, 1, 4, 2}, {2, 2, 2, 2, 2}};
    static const int ndims[] = {2, 3, 4, 5};
    for (int k = 0; k < 4; k++) {
        nb_tensor *t = nb_zeros(NB_F64, ndims[k], shapes[k]);
        expect_shape(t, ndims[k], shapes[k]);
        expect_row_major(t);
        ck_assert(nb_is_contiguous(t));
    }
    /* the maximum rank */
    nb_tensor *t8 = nb_ones(NB_F32, NB_SHAPE(1, 2, 1, 2, 1, 2, 1, 2));
    expect_row_major(t8);
    ck_assert_int_eq(nb_numel(t8), 16);
    /* 0-d: one element, no dims */
    nb_tensor *s = nb_zeros(NB_F64, 0, NULL);
    CHECK_NOT_NULL(s);
    ck_assert_int_eq(nb_ndim(s), 0);
    ck_assert_int_eq(nb_numel(s), 1);
    ck_assert(nb_is_contiguous(s));
    nb_scope_end();
}
END_TEST

/* PyTorch: torch.zeros(2, 0, 3) has strides (3, 3, 1) and is contiguous
 * (every tensor without elements is). */
/* (0, 2^32-1, 2^32-2^24) holds nothing, but its contiguous strides
 * (2^32-1 times 2^32-2^24) overflow int64: refused, not wrapped. */
START_TEST(test_empty_shape_with_overflowing_strides) {
    nb_tensor *t = nb_empty(NB_F32, 3, (const int64_t[]){0, 4294967295LL, 4278190080LL});
    ck_assert_ptr_null(t);
    ck_assert_str_eq(nb_last_error(),
                     "nb_empty: shape (0,4294967295,4278190080) has more strides than int64 can count");
    t = nb_empty(NB_F32, 3, (const int64_t[]){0, 65536, 65536});
    ck_assert_ptr_nonnull(t);
    ck_assert_int_eq(nb_strides(t)[0], (int64_t)65536 * 65536);
    nb_free(t);
}
END_TEST

START_TEST(test_zero_size_is_contiguous) {
    nb_scope_begin();
    nb_tensor *t = nb_zeros(NB_F32, NB_SHAPE(2, 0, 3));
    CHECK_NOT_NULL(t);
    ck_assert_int_eq(nb_numel(t), 0);
    ck_assert_int_eq(nb_strides(t)[0], 3);
    ck_assert_int_eq(nb_strides(t)[1], 3);
    ck_assert_int_eq(nb_strides(t)[2], 1);
    double dummy = 123;
    ck_assert_int_eq(nb_copy_to_f64(t, &dummy), 0);
    ck_assert(dummy == 123); /* nothing written */
    nb_tensor *u = nb_zeros(NB_F32, NB_SHAPE(0));
    ck_assert(nb_is_contiguous(u));
    ck_assert_msg(nb_is_contiguous(t), "nb_is_contiguous is false for a fresh (2,0,3) tensor");
    nb_scope_end();
}
END_TEST

START_TEST(test_from_data_all_dtypes) {
    nb_scope_begin();
    const float f[] = {1.5f, -2.0f, 3.25f, 0.0f, 1e-3f, -7.0f};
    nb_tensor *tf = nb_from_data(NB_F32, NB_SHAPE(2, 3), f);
    expect_shape(tf, 2, (const int64_t[]){2, 3});
    ck_assert_int_eq(nb_dtype_of(tf), NB_F32);
    double v[6];
    read_values(tf, v);
    for (int i = 0; i < 6; i++) ck_assert(v[i] == (double)f[i]);
    ck_assert(((const float *)nb_data(tf))[2] == 3.25f);

    const double d[] = {1e-300, -2.5, 3.0, 1e300};
    nb_tensor *td = nb_from_data(NB_F64, NB_SHAPE(4), d);
    ck_assert_int_eq(nb_dtype_of(td), NB_F64);
    expect_values(td, d, 4);

    const int64_t l[] = {-3, 0, 5, (int64_t)1 << 40};
    nb_tensor *tl = nb_from_data(NB_I64, NB_SHAPE(2, 2), l);
    ck_assert_int_eq(nb_dtype_of(tl), NB_I64);
    expect_values(tl, (const double[]){-3, 0, 5, 1099511627776.0}, 4);
    ck_assert_int_eq(((const int64_t *)nb_data(tl))[3], (int64_t)1 << 40);

    const bool b[] = {true, false, false, true, true};
    nb_tensor *tb = nb_from_data(NB_BOOL, NB_SHAPE(5), b);
    ck_assert_int_eq(nb_dtype_of(tb), NB_BOOL);
    expect_values(tb, (const double[]){1, 0, 0, 1, 1}, 5);

    /* the data is copied: changing the source afterwards changes nothing */
    double src[2] = {1, 2};
    nb_tensor *c = nb_from_data(NB_F64, NB_SHAPE(2), src);
    src[0] = 100;
    expect_values(c, (const double[]){1, 2}, 2);

    /* a 0-d tensor from one value; an empty tensor from NULL data */
    nb_tensor *s = nb_from_data(NB_F64, 0, NULL, (const double[]){4.5});
    ck_assert_int_eq(nb_ndim(s), 0);
    ck_assert(nb_item(s) == 4.5);
    nb_tensor *e = nb_from_data(NB_F32, NB_SHAPE(0, 3), NULL);
    CHECK_NOT_NULL(e);
    ck_assert_int_eq(nb_numel(e), 0);
    expect_error(nb_from_data(NB_F32, NB_SHAPE(2), NULL), "nb_from_data", "NULL", "(2)");
    nb_scope_end();
}
END_TEST

START_TEST(test_dtype_names) {
    ck_assert_str_eq(nb_dtype_name(NB_F32), "f32");
    ck_assert_str_eq(nb_dtype_name(NB_F64), "f64");
    ck_assert_str_eq(nb_dtype_name(NB_I64), "i64");
    ck_assert_str_eq(nb_dtype_name(NB_BOOL), "bool");
}
END_TEST

START_TEST(test_scalar) {
    nb_scope_begin();
    nb_tensor *s = nb_scalar(NB_F64, -3.5);
    CHECK_NOT_NULL(s);
    ck_assert_int_eq(nb_ndim(s), 0);
    ck_assert_int_eq(nb_numel(s), 1);
    ck_assert_int_eq(nb_dtype_of(s), NB_F64);
    ck_assert(nb_item(s) == -3.5);
    ck_assert(nb_item(nb_scalar(NB_F32, 0.25)) == 0.25);
    ck_assert(nb_item(nb_scalar(NB_I64, 9)) == 9);
    ck_assert(nb_item(nb_scalar(NB_BOOL, 2)) == 1);
    nb_scope_end();
}
END_TEST

START_TEST(test_arange) {
    nb_scope_begin();
    for (int k = 0; k < 3; k++) {
        nb_dtype dt = all_dtypes[k];
        nb_tensor *a = nb_arange(dt, 5);
        expect_shape(a, 1, (const int64_t[]){5});
        ck_assert_int_eq(nb_dtype_of(a), dt);
        expect_values(a, (const double[]){0, 1, 2, 3, 4}, 5);
    }
    nb_tensor *z = nb_arange(NB_I64, 0);
    CHECK_NOT_NULL(z);
    ck_assert_int_eq(nb_numel(z), 0);
    expect_error(nb_arange(NB_F32, -2), "nb_arange", "-2");
    expect_error(nb_arange(NB_BOOL, 3), "nb_arange", "bool");
    nb_scope_end();
}
END_TEST

START_TEST(test_tril_mask) {
    nb_scope_begin();
    nb_tensor *m = nb_tril_mask(3, 4);
    expect_shape(m, 2, (const int64_t[]){3, 4});
    ck_assert_int_eq(nb_dtype_of(m), NB_BOOL);
    expect_values(m, (const double[]){1, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 0}, 12);
    nb_tensor *w = nb_tril_mask(3, 2);
    expect_values(w, (const double[]){1, 0, 1, 1, 1, 1}, 6);
    nb_tensor *e = nb_tril_mask(0, 3);
    CHECK_NOT_NULL(e);
    ck_assert_int_eq(nb_numel(e), 0);
    expect_error(nb_tril_mask(-1, 3), "nb_tril_mask", "-1");
    nb_scope_end();
}
END_TEST

/* --------------------------------------------------------------- inspection */
START_TEST(test_item) {
    nb_scope_begin();
    ck_assert(nb_item(nb_full(NB_F32, NB_SHAPE(1, 1, 1), 2.0)) == 2.0);
    nb_tensor *t = nb_zeros(NB_F64, NB_SHAPE(2, 3));
    nb_clear_error();
    double v = nb_item(t);
    ck_assert(isnan(v));
    const char *msg = nb_last_error();
    ck_assert_ptr_nonnull(msg);
    ck_assert_msg(strstr(msg, "nb_item") && strstr(msg, "(2,3)") && strstr(msg, "6"),
                  "unexpected message: %s", msg);
    nb_clear_error();
    /* an element of a view: the offset is honoured */
    nb_tensor *a = nb_arange(NB_F64, 6);
    ck_assert(nb_item(nb_narrow(a, 0, 4, 1)) == 4.0);
    ck_assert(nb_item(nb_select(a, 0, 2)) == 2.0);
    nb_scope_end();
}
END_TEST

START_TEST(test_copy_to_f64_transposed) {
    nb_scope_begin();
    nb_tensor *a = nb_from_data(NB_F32, NB_SHAPE(2, 3), (const float[]){0, 1, 2, 3, 4, 5});
    nb_tensor *t = nb_transpose(a, 0, 1);
    expect_shape(t, 2, (const int64_t[]){3, 2});
    ck_assert(!nb_is_contiguous(t));
    ck_assert_int_eq(nb_strides(t)[0], 1);
    ck_assert_int_eq(nb_strides(t)[1], 3);
    expect_values(t, (const double[]){0, 3, 1, 4, 2, 5}, 6);
    /* a narrowed, transposed 3-d view */
    nb_tensor *b = nb_reshape(nb_arange(NB_I64, 24), NB_SHAPE(2, 3, 4));
    nb_tensor *v = nb_narrow(nb_transpose(b, 0, 2), 0, 1, 2); /* (2,3,2) */
    expect_shape(v, 3, (const int64_t[]){2, 3, 2});
    double want[12];
    int k = 0;
    for (int i = 1; i < 3; i++)
        for (int j = 0; j < 3; j++)
            for (int l = 0; l < 2; l++) want[k++] = l * 12 + j * 4 + i;
    expect_values(v, want, 12);
    nb_clear_error();
    ck_assert_int_eq(nb_copy_to_f64(a, NULL), -1);
    ck_assert(nb_last_error() && strstr(nb_last_error(), "nb_copy_to_f64"));
    nb_clear_error();
    nb_scope_end();
}
END_TEST

START_TEST(test_size) {
    nb_scope_begin();
    nb_tensor *t = nb_zeros(NB_F32, NB_SHAPE(2, 3, 5));
    ck_assert_int_eq(nb_size(t, 0), 2);
    ck_assert_int_eq(nb_size(t, 2), 5);
    ck_assert_int_eq(nb_size(t, -1), 5);
    ck_assert_int_eq(nb_size(t, -2), 3);
    ck_assert_int_eq(nb_size(t, -3), 2);
    nb_clear_error();
    ck_assert_int_eq(nb_size(t, 3), -1);
    ck_assert_ptr_nonnull(nb_last_error());
    ck_assert(strstr(nb_last_error(), "nb_size") && strstr(nb_last_error(), "3"));
    nb_clear_error();
    ck_assert_int_eq(nb_size(t, -4), -1);
    ck_assert(strstr(nb_last_error(), "nb_size") && strstr(nb_last_error(), "-4"));
    nb_clear_error();
    nb_scope_end();
}
END_TEST

/* ---------------------------------------------------------------- copy_into */
START_TEST(test_copy_into_broadcast_and_convert) {
    nb_scope_begin();
    /* f32 row (3) broadcast into f64 (2,3) */
    nb_tensor *dst = nb_zeros(NB_F64, NB_SHAPE(2, 3));
    nb_tensor *row = nb_from_data(NB_F32, NB_SHAPE(3), (const float[]){1, 2.5f, -3});
    ck_assert_int_eq(nb_copy_into(dst, row), 0);
    expect_values(dst, (const double[]){1, 2.5, -3, 1, 2.5, -3}, 6);
    /* i64 column (2,1) into the same tensor */
    nb_tensor *col = nb_from_data(NB_I64, NB_SHAPE(2, 1), (const int64_t[]){7, -8});
    ck_assert_int_eq(nb_copy_into(dst, col), 0);
    expect_values(dst, (const double[]){7, 7, 7, -8, -8, -8}, 6);
    /* a 0-d value everywhere */
    ck_assert_int_eq(nb_copy_into(dst, nb_scalar(NB_F64, 0.5)), 0);
    expect_values(dst, (const double[]){0.5, 0.5, 0.5, 0.5, 0.5, 0.5}, 6);
    /* f64 -> i64 truncates toward zero, -> bool is "!= 0", bool -> f32 is 0/1 */
    nb_tensor *src = nb_from_data(NB_F64, NB_SHAPE(4), (const double[]){2.9, -2.9, 0.0, 0.25});
    nb_tensor *li = nb_zeros(NB_I64, NB_SHAPE(4));
    ck_assert_int_eq(nb_copy_into(li, src), 0);
    expect_values(li, (const double[]){2, -2, 0, 0}, 4);
    nb_tensor *bo = nb_zeros(NB_BOOL, NB_SHAPE(4));
    ck_assert_int_eq(nb_copy_into(bo, src), 0);
    expect_values(bo, (const double[]){1, 1, 0, 1}, 4);
    nb_tensor *fl = nb_full(NB_F32, NB_SHAPE(4), 9);
    ck_assert_int_eq(nb_copy_into(fl, bo), 0);
    expect_values(fl, (const double[]){1, 1, 0, 1}, 4);
    /* f64 -> f32 rounds */
    nb_tensor *f1 = nb_zeros(NB_F32, NB_SHAPE(1));
    ck_assert_int_eq(nb_copy_into(f1, nb_full(NB_F64, NB_SHAPE(1), 0.1)), 0);
    ck_assert(nb_item(f1) == (double)0.1f);
    /* src with fewer dims and size-1 dims: (1,3) -> (2,2,3) */
    nb_tensor *d3 = nb_zeros(NB_F32, NB_SHAPE(2, 2, 3));
    nb_tensor *s13 = nb_from_data(NB_F32, NB_SHAPE(1, 3), (const float[]){1, 2, 3});
    ck_assert_int_eq(nb_copy_into(d3, s13), 0);
    expect_values(d3, (const double[]){1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3}, 12);
    nb_scope_end();
}
END_TEST

START_TEST(test_copy_into_narrow_view) {
    nb_scope_begin();
    nb_tensor *m = nb_zeros(NB_F64, NB_SHAPE(3, 4));
    nb_tensor *v = nb_narrow(m, 1, 1, 2); /* columns 1..2 */
    CHECK_NOT_NULL(v);
    ck_assert_int_eq(nb_copy_into(v, nb_from_data(NB_F32, NB_SHAPE(2), (const float[]){5, 6})),
                     0);
    expect_values(m, (const double[]){0, 5, 6, 0, 0, 5, 6, 0, 0, 5, 6, 0}, 12);
    /* a row selected from a column-narrowed view */
    nb_tensor *r = nb_select(v, 0, 2);
    ck_assert_int_eq(nb_copy_into(r, nb_scalar(NB_F64, -1)), 0);
    expect_values(m, (const double[]){0, 5, 6, 0, 0, 5, 6, 0, 0, -1, -1, 0}, 12);
    nb_scope_end();
}
END_TEST

START_TEST(test_copy_into_transposed_view) {
    nb_scope_begin();
    nb_tensor *m = nb_zeros(NB_F32, NB_SHAPE(2, 3));
    nb_tensor *t = nb_transpose(m, 0, 1); /* (3,2) */
    nb_tensor *src = nb_from_data(NB_F64, NB_SHAPE(3, 2), (const double[]){1, 2, 3, 4, 5, 6});
    ck_assert_int_eq(nb_copy_into(t, src), 0);
    expect_values(t, (const double[]){1, 2, 3, 4, 5, 6}, 6);
    expect_values(m, (const double[]){1, 3, 5, 2, 4, 6}, 6);
    /* only the view's elements change: the middle column of a (3,3) matrix,
     * written through a transposed, narrowed view */
    nb_tensor *sq = nb_full(NB_F64, NB_SHAPE(3, 3), 9);
    nb_tensor *mid = nb_narrow(nb_transpose(sq, 0, 1), 0, 1, 1); /* (1,3): column 1 */
    ck_assert_int_eq(nb_copy_into(mid, nb_arange(NB_F64, 3)), 0);
    expect_values(sq, (const double[]){9, 0, 9, 9, 1, 9, 9, 2, 9}, 9);
    nb_scope_end();
}
END_TEST

START_TEST(test_copy_into_errors) {
    nb_scope_begin();
    nb_tensor *dst = nb_zeros(NB_F32, NB_SHAPE(2, 3));
    nb_tensor *before = nb_full(NB_F32, NB_SHAPE(2, 3), 0);
    nb_clear_error();
    ck_assert_int_eq(nb_copy_into(dst, nb_ones(NB_F32, NB_SHAPE(4))), -1);
    ck_assert_ptr_nonnull(nb_last_error());
    ck_assert_msg(strstr(nb_last_error(), "nb_copy_into") && strstr(nb_last_error(), "(4)") &&
                      strstr(nb_last_error(), "(2,3)"),
                  "unexpected message: %s", nb_last_error());
    nb_clear_error();
    /* src larger than dst: (2,3) does not fit into (3) */
    nb_tensor *small = nb_zeros(NB_F32, NB_SHAPE(3));
    ck_assert_int_eq(nb_copy_into(small, dst), -1);
    ck_assert(strstr(nb_last_error(), "nb_copy_into") && strstr(nb_last_error(), "(2,3)"));
    nb_clear_error();
    /* a size-1 dim of dst does not broadcast: dst (2,1) <- src (2,3) */
    nb_tensor *narrow_dst = nb_zeros(NB_F32, NB_SHAPE(2, 1));
    ck_assert_int_eq(nb_copy_into(narrow_dst, dst), -1);
    ck_assert(strstr(nb_last_error(), "nb_copy_into") && strstr(nb_last_error(), "(2,1)"));
    nb_clear_error();
    /* an expanded destination would write one element several times */
    nb_tensor *one = nb_zeros(NB_F32, NB_SHAPE(1, 3));
    nb_tensor *ex = nb_expand(one, NB_SHAPE(4, 3));
    CHECK_NOT_NULL(ex);
    ck_assert_int_eq(nb_copy_into(ex, nb_arange(NB_F32, 3)), -1);
    ck_assert_msg(strstr(nb_last_error(), "nb_copy_into") && strstr(nb_last_error(), "overlapping") &&
                      strstr(nb_last_error(), "(4,3)"),
                  "unexpected message: %s", nb_last_error());
    nb_clear_error();
    expect_values(one, (const double[]){0, 0, 0}, 3);
    /* NULL arguments */
    ck_assert_int_eq(nb_copy_into(NULL, dst), -1);
    ck_assert(strstr(nb_last_error(), "nb_copy_into"));
    nb_clear_error();
    ck_assert_int_eq(nb_copy_into(dst, NULL), -1);
    ck_assert(strstr(nb_last_error(), "nb_copy_into"));
    nb_clear_error();
    /* failures leave dst alone */
    expect_close(dst, before, 0, 0);
    nb_scope_end();
}
END_TEST

/* Broadcasting goes from src to dst only: PyTorch's
 * torch.empty(1, 0).copy_(torch.empty(5, 0)) is an error, even though no
 * element would be written. */
START_TEST(test_copy_into_zero_size_shape_mismatch) {
    nb_scope_begin();
    nb_tensor *dst = nb_zeros(NB_F32, NB_SHAPE(1, 0));
    nb_tensor *src = nb_zeros(NB_F32, NB_SHAPE(5, 0));
    nb_clear_error();
    int rc = nb_copy_into(dst, src);
    ck_assert_msg(rc == -1, "nb_copy_into accepted src (5,0) for dst (1,0)");
    ck_assert(strstr(nb_last_error(), "nb_copy_into") && strstr(nb_last_error(), "(5,0)"));
    nb_clear_error();
    nb_scope_end();
}
END_TEST

/* src and dst in the same storage: the copy reads a snapshot of src. */
START_TEST(test_copy_into_overlapping) {
    nb_scope_begin();
    double orig[16], want[16];
    for (int i = 0; i < 16; i++) orig[i] = i * 1.5 - 3;
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) want[i * 4 + j] = orig[j * 4 + i];
    nb_tensor *m = nb_from_data(NB_F64, NB_SHAPE(4, 4), orig);
    ck_assert_int_eq(nb_copy_into(m, nb_transpose(m, 0, 1)), 0);
    expect_values(m, want, 16);
    /* shifted rows, like memmove: rows 1..3 <- rows 0..2 */
    nb_tensor *r = nb_reshape(nb_arange(NB_F32, 8), NB_SHAPE(4, 2));
    ck_assert_int_eq(nb_copy_into(nb_narrow(r, 0, 1, 3), nb_narrow(r, 0, 0, 3)), 0);
    expect_values(r, (const double[]){0, 1, 0, 1, 2, 3, 4, 5}, 8);
    /* and the other direction: rows 0..2 <- rows 1..3 */
    nb_tensor *q = nb_reshape(nb_arange(NB_F32, 8), NB_SHAPE(4, 2));
    ck_assert_int_eq(nb_copy_into(nb_narrow(q, 0, 0, 3), nb_narrow(q, 0, 1, 3)), 0);
    expect_values(q, (const double[]){2, 3, 4, 5, 6, 7, 6, 7}, 8);
    /* a broadcast source from the same storage: every row <- row 0 */
    nb_tensor *b = nb_reshape(nb_arange(NB_I64, 6), NB_SHAPE(3, 2));
    ck_assert_int_eq(nb_copy_into(b, nb_select(b, 0, 2)), 0);
    expect_values(b, (const double[]){4, 5, 4, 5, 4, 5}, 6);
    nb_scope_end();
}
END_TEST

/* Writing through one handle is visible through the others (shared storage). */
START_TEST(test_copy_into_visible_through_views) {
    nb_scope_begin();
    nb_tensor *a = nb_zeros(NB_F32, NB_SHAPE(2, 3));
    nb_tensor *v = nb_view(a, NB_SHAPE(6));
    ck_assert_int_eq(nb_copy_into(a, nb_arange(NB_F32, 3)), 0);
    expect_values(v, (const double[]){0, 1, 2, 0, 1, 2}, 6);
    nb_scope_end();
}
END_TEST

/* ------------------------------------------------------------ default dtype */
START_TEST(test_default_dtype) {
    nb_dtype old = nb_default_dtype();
    ck_assert(old == NB_F32 || old == NB_F64);
    nb_set_default_dtype(NB_F64);
    ck_assert_int_eq(nb_default_dtype(), NB_F64);
    nb_clear_error();
    nb_set_default_dtype(NB_I64);
    ck_assert_int_eq(nb_default_dtype(), NB_F64); /* unchanged */
    ck_assert_ptr_nonnull(nb_last_error());
    ck_assert_msg(strstr(nb_last_error(), "nb_set_default_dtype") && strstr(nb_last_error(), "i64"),
                  "unexpected message: %s", nb_last_error());
    nb_clear_error();
    nb_set_default_dtype(NB_BOOL);
    ck_assert_int_eq(nb_default_dtype(), NB_F64);
    ck_assert(strstr(nb_last_error(), "bool"));
    nb_clear_error();
    nb_set_default_dtype(NB_F32);
    ck_assert_int_eq(nb_default_dtype(), NB_F32);
    nb_set_default_dtype(old);
}
END_TEST

/* ---------------------------------------------------------------------- rng */
static bool same_values(const nb_tensor *a, const nb_tensor *b) {
    int64_t n = nb_numel(a);
    if (n != nb_numel(b)) return false;
    double *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
    read_values(a, x);
    read_values(b, y);
    bool same = memcmp(x, y, (size_t)n * sizeof *x) == 0;
    free(x);
    free(y);
    return same;
}

START_TEST(test_rng_same_seed_same_values) {
    nb_scope_begin();
    for (int k = 0; k < 2; k++) {
        nb_dtype dt = k ? NB_F64 : NB_F32;
        nb_rng r1, r2, r3;
        nb_rng_seed(&r1, 1234);
        nb_rng_seed(&r2, 1234);
        nb_rng_seed(&r3, 1235);
        ck_assert(r1.seed == 1234 && r1.offset == 0);
        nb_tensor *a = nb_randn(dt, NB_SHAPE(4, 5), &r1);
        nb_tensor *b = nb_randn(dt, NB_SHAPE(4, 5), &r2);
        nb_tensor *c = nb_randn(dt, NB_SHAPE(4, 5), &r3);
        expect_shape(a, 2, (const int64_t[]){4, 5});
        ck_assert_int_eq(nb_dtype_of(a), dt);
        ck_assert(nb_is_contiguous(a));
        ck_assert(same_values(a, b));
        ck_assert(!same_values(a, c));
        ck_assert(r1.offset == r2.offset);
        nb_tensor *u1 = nb_rand(dt, NB_SHAPE(7), &r1);
        nb_tensor *u2 = nb_rand(dt, NB_SHAPE(7), &r2);
        ck_assert(same_values(u1, u2));
    }
    nb_scope_end();
}
END_TEST

START_TEST(test_rng_draws_advance) {
    nb_scope_begin();
    nb_rng r;
    nb_rng_seed(&r, 99);
    uint64_t o0 = r.offset;
    nb_tensor *a = nb_randn(NB_F64, NB_SHAPE(10), &r);
    uint64_t o1 = r.offset;
    ck_assert(o1 > o0);
    nb_tensor *b = nb_randn(NB_F64, NB_SHAPE(10), &r);
    ck_assert(r.offset > o1);
    ck_assert(!same_values(a, b));
    uint64_t o2 = r.offset;
    nb_tensor *u = nb_rand(NB_F32, NB_SHAPE(10), &r);
    ck_assert(r.offset > o2);
    nb_tensor *w = nb_rand(NB_F32, NB_SHAPE(10), &r);
    ck_assert(!same_values(u, w));
    /* re-seeding restarts the stream */
    nb_rng_seed(&r, 99);
    ck_assert(r.offset == 0);
    ck_assert(same_values(a, nb_randn(NB_F64, NB_SHAPE(10), &r)));
    /* a counter-based stream: a generator moved to offset o1 gives b */
    nb_rng s = {.seed = 99, .offset = o1};
    ck_assert(same_values(b, nb_randn(NB_F64, NB_SHAPE(10), &s)));
    nb_scope_end();
}
END_TEST

START_TEST(test_rand_in_unit_interval) {
    nb_scope_begin();
    for (int k = 0; k < 2; k++) {
        nb_dtype dt = k ? NB_F64 : NB_F32;
        nb_rng r;
        nb_rng_seed(&r, 7 + (uint64_t)k);
        nb_tensor *u = nb_rand(dt, NB_SHAPE(100000), &r);
        CHECK_NOT_NULL(u);
        ck_assert_int_eq(nb_dtype_of(u), dt);
        double *v = malloc(100000 * sizeof *v);
        read_values(u, v);
        double sum = 0, lo = 1, hi = 0;
        for (int i = 0; i < 100000; i++) {
            ck_assert_msg(v[i] >= 0.0 && v[i] < 1.0, "nb_rand value %.17g outside [0,1)", v[i]);
            sum += v[i];
            lo = v[i] < lo ? v[i] : lo;
            hi = v[i] > hi ? v[i] : hi;
        }
        free(v);
        ck_assert(fabs(sum / 100000 - 0.5) < 0.01);
        ck_assert(lo < 0.001 && hi > 0.999);
    }
    expect_error(nb_rand(NB_I64, NB_SHAPE(2), NULL), "nb_rand", "i64");
    expect_error(nb_randn(NB_BOOL, NB_SHAPE(2), NULL), "nb_randn", "bool");
    nb_scope_end();
}
END_TEST

START_TEST(test_randn_moments) {
    nb_scope_begin();
    for (int k = 0; k < 2; k++) {
        nb_dtype dt = k ? NB_F64 : NB_F32;
        nb_rng r;
        nb_rng_seed(&r, 2024);
        const int n = 100000;
        nb_tensor *x = nb_randn(dt, NB_SHAPE(n), &r);
        double *v = malloc((size_t)n * sizeof *v);
        read_values(x, v);
        double mean = 0, var = 0;
        for (int i = 0; i < n; i++) {
            ck_assert(isfinite(v[i]));
            mean += v[i];
        }
        mean /= n;
        for (int i = 0; i < n; i++) var += (v[i] - mean) * (v[i] - mean);
        double sd = sqrt(var / (n - 1));
        free(v);
        ck_assert_msg(fabs(mean) < 0.01, "%s mean %g", nb_dtype_name(dt), mean);
        ck_assert_msg(fabs(sd - 1) < 0.01, "%s std %g", nb_dtype_name(dt), sd);
    }
    nb_scope_end();
}
END_TEST

START_TEST(test_manual_seed_global_stream) {
    nb_scope_begin();
    nb_manual_seed(42);
    ck_assert(nb_global_rng()->seed == 42 && nb_global_rng()->offset == 0);
    nb_tensor *a = nb_randn(NB_F32, NB_SHAPE(3, 3), NULL);
    nb_tensor *b = nb_rand(NB_F64, NB_SHAPE(5), NULL);
    nb_tensor *c = nb_randn(NB_F32, NB_SHAPE(3, 3), NULL);
    ck_assert(nb_global_rng()->offset > 0);
    ck_assert(!same_values(a, c)); /* successive draws differ */
    nb_manual_seed(42);
    ck_assert(same_values(a, nb_randn(NB_F32, NB_SHAPE(3, 3), NULL)));
    ck_assert(same_values(b, nb_rand(NB_F64, NB_SHAPE(5), NULL)));
    ck_assert(same_values(c, nb_randn(NB_F32, NB_SHAPE(3, 3), NULL)));
    /* the global generator is the stream an explicit rng with the same seed gives */
    nb_rng r;
    nb_rng_seed(&r, 42);
    ck_assert(same_values(a, nb_randn(NB_F32, NB_SHAPE(3, 3), &r)));
    nb_manual_seed(43);
    ck_assert(!same_values(a, nb_randn(NB_F32, NB_SHAPE(3, 3), NULL)));
    nb_scope_end();
}
END_TEST

/* -------------------------------------------------------------------- print */
/* Runs nb_print(t) with stdout sent to a temporary file; returns its text
 * (malloc'd). */
static char *capture_print(const nb_tensor *t) {
    fflush(stdout);
    FILE *tmp = tmpfile();
    ck_assert_ptr_nonnull(tmp);
    int saved = dup(fileno(stdout));
    ck_assert_int_ge(saved, 0);
    ck_assert_int_ge(dup2(fileno(tmp), fileno(stdout)), 0);
    nb_print(t);
    fflush(stdout);
    dup2(saved, fileno(stdout));
    close(saved);
    fseek(tmp, 0, SEEK_END);
    long n = ftell(tmp);
    ck_assert_int_ge(n, 0);
    rewind(tmp);
    char *buf = calloc((size_t)n + 1, 1);
    size_t got = fread(buf, 1, (size_t)n, tmp);
    buf[got] = 0;
    fclose(tmp);
    return buf;
}

START_TEST(test_print) {
    nb_scope_begin();
    nb_tensor *t = nb_from_data(NB_F32, NB_SHAPE(2, 2), (const float[]){1, -2.5f, 3.25f, 0});
    char *s = capture_print(t);
    ck_assert_msg(strstr(s, "tensor(") != NULL, "output: %s", s);
    ck_assert_msg(strstr(s, "1.0000") && strstr(s, "-2.5000") && strstr(s, "3.2500") &&
                      strstr(s, "0.0000"),
                  "output: %s", s);
    ck_assert_msg(strstr(s, "(2,2)") && strstr(s, "f32"), "output: %s", s);
    ck_assert_str_eq(s, "tensor([[1.0000, -2.5000],\n        [3.2500, 0.0000]], shape=(2,2), "
                        "dtype=f32)\n");
    free(s);
    /* a transposed view prints in logical order */
    s = capture_print(nb_transpose(t, 0, 1));
    ck_assert_msg(strstr(s, "[[1.0000, 3.2500],") != NULL, "output: %s", s);
    free(s);
    s = capture_print(nb_from_data(NB_I64, NB_SHAPE(3), (const int64_t[]){4, -5, 6}));
    ck_assert_msg(strstr(s, "[4, -5, 6]") && strstr(s, "i64"), "output: %s", s);
    free(s);
    s = capture_print(nb_tril_mask(1, 2));
    ck_assert_msg(strstr(s, "True") && strstr(s, "False") && strstr(s, "bool"), "output: %s", s);
    free(s);
    s = capture_print(nb_scalar(NB_F64, 0.5));
    ck_assert_msg(strstr(s, "0.5000") && strstr(s, "f64"), "output: %s", s);
    free(s);
    s = capture_print(nb_set_requires_grad(nb_zeros(NB_F64, NB_SHAPE(1)), true));
    ck_assert_msg(strstr(s, "requires_grad") != NULL, "output: %s", s);
    free(s);
    /* long tensors are elided in the middle */
    s = capture_print(nb_arange(NB_I64, 2000));
    ck_assert_msg(strstr(s, "[0, 1, 2, ..., 1997, 1998, 1999]") != NULL, "output: %s", s);
    free(s);
    s = capture_print(NULL);
    ck_assert_msg(strstr(s, "NULL") != NULL, "output: %s", s);
    free(s);
    nb_scope_end();
}
END_TEST

/* ------------------------------------------------------------------ threads */
START_TEST(test_num_threads) {
    int old = nb_num_threads();
    ck_assert_int_ge(old, 1);
    nb_set_num_threads(3);
    ck_assert_int_eq(nb_num_threads(), 3);
    nb_set_num_threads(1);
    ck_assert_int_eq(nb_num_threads(), 1);
    nb_clear_error();
    nb_set_num_threads(0);
    ck_assert_int_eq(nb_num_threads(), 1); /* unchanged */
    ck_assert_ptr_nonnull(nb_last_error());
    ck_assert_msg(strstr(nb_last_error(), "nb_set_num_threads") && strstr(nb_last_error(), "0"),
                  "unexpected message: %s", nb_last_error());
    nb_clear_error();
    nb_set_num_threads(-4);
    ck_assert_int_eq(nb_num_threads(), 1);
    ck_assert(strstr(nb_last_error(), "-4"));
    nb_clear_error();
    nb_set_num_threads(old);
    ck_assert_int_eq(nb_num_threads(), old);
}
END_TEST

/* After each test, even a failed one (CK_FORK=no runs every test in one
 * process): close the scopes it left open and drop its message. */
static void teardown(void) {
    while (nb_scope_depth() > 0) nb_scope_end();
    nb_clear_error();
}

Suite *suite_tensor(void) {
    Suite *s = suite_create("tensor");
    TCase *tc = tcase_create("creation");
    tcase_add_checked_fixture(tc, NULL, teardown);
    tcase_add_test(tc, test_shape_macro);
    tcase_add_loop_test(tc, test_zeros_ones_full_all_dtypes, 0, 4);
    tcase_add_test(tc, test_full_values);
    tcase_add_test(tc, test_strides_row_major);
    tcase_add_test(tc, test_zero_size_is_contiguous);
    tcase_add_test(tc, test_empty_shape_with_overflowing_strides);
    tcase_add_test(tc, test_from_data_all_dtypes);
    tcase_add_test(tc, test_dtype_names);
    tcase_add_test(tc, test_scalar);
    tcase_add_test(tc, test_arange);
    tcase_add_test(tc, test_tril_mask);
    tcase_add_test(tc, test_default_dtype);
    suite_add_tcase(s, tc);

    tc = tcase_create("inspection");
    tcase_add_checked_fixture(tc, NULL, teardown);
    tcase_add_test(tc, test_item);
    tcase_add_test(tc, test_copy_to_f64_transposed);
    tcase_add_test(tc, test_size);
    tcase_add_test(tc, test_print);
    suite_add_tcase(s, tc);

    tc = tcase_create("copy_into");
    tcase_add_checked_fixture(tc, NULL, teardown);
    tcase_add_test(tc, test_copy_into_broadcast_and_convert);
    tcase_add_test(tc, test_copy_into_narrow_view);
    tcase_add_test(tc, test_copy_into_transposed_view);
    tcase_add_test(tc, test_copy_into_errors);
    tcase_add_test(tc, test_copy_into_zero_size_shape_mismatch);
    tcase_add_test(tc, test_copy_into_overlapping);
    tcase_add_test(tc, test_copy_into_visible_through_views);
    suite_add_tcase(s, tc);

    tc = tcase_create("rng");
    tcase_add_checked_fixture(tc, NULL, teardown);
    tcase_add_test(tc, test_rng_same_seed_same_values);
    tcase_add_test(tc, test_rng_draws_advance);
    tcase_add_test(tc, test_rand_in_unit_interval);
    tcase_add_test(tc, test_randn_moments);
    tcase_add_test(tc, test_manual_seed_global_stream);
    suite_add_tcase(s, tc);

    tc = tcase_create("threads");
    tcase_add_checked_fixture(tc, NULL, teardown);
    tcase_add_test(tc, test_num_threads);
    suite_add_tcase(s, tc);
    return s;
}
