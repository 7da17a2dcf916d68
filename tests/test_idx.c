/* test_idx.c: nb_load_idx on IDX files the tests write themselves (two zero
 * bytes, a type byte, the dims, big-endian u32 sizes, big-endian values):
 * every type's values read exactly into f32, f64 and i64, the tensor's shape
 * and lifetime, and the exact message of every way a file can be wrong
 * (magic, type byte, dims, truncation, bytes left over, a size past int64, a
 * value the dtype cannot hold, a bad argument); and the first 32 test
 * images of Fashion-MNIST itself (tests/fixtures/fashion-mini). */
#include "test_util.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>

#ifndef NB_FIXTURE_DIR
#define NB_FIXTURE_DIR "tests/fixtures"
#endif

/* An IDX file: bytes m0 m1 type ndim, the dims big-endian, then n data bytes
 * as given, then `extra` zero bytes (negative: that many bytes cut off the
 * end). */
static const char *write_idx_raw(const char *name, unsigned char m0, unsigned char m1,
                                 unsigned char type, int ndim, const uint32_t *dims,
                                 const void *data, size_t n, int extra) {
    size_t size = 4 + 4 * (size_t)ndim + n + (size_t)(extra > 0 ? extra : 0);
    unsigned char *b = calloc(1, size);
    ck_assert_ptr_nonnull(b);
    b[0] = m0, b[1] = m1, b[2] = type, b[3] = (unsigned char)ndim;
    for (int d = 0; d < ndim; d++)
        for (int k = 0; k < 4; k++) b[4 + 4 * d + k] = (unsigned char)(dims[d] >> (24 - 8 * k));
    if (n) memcpy(b + 4 + 4 * ndim, data, n);
    const char *path = test_tmp_path(name);
    test_write_bytes(path, b, extra < 0 ? size + (size_t)extra : size);
    free(b);
    return path;
}

static const char *write_idx(const char *name, unsigned char type, int ndim,
                             const uint32_t *dims, const void *data, size_t n) {
    return write_idx_raw(name, 0, 0, type, ndim, dims, data, n, 0);
}

/* result NULL and the message exactly want (printf-formatted); clears it */
static void expect_message(const void *result, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void expect_message(const void *result, const char *fmt, ...) {
    char want[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(want, sizeof want, fmt, ap);
    va_end(ap);
    ck_assert_msg(result == NULL, "expected a failure (\"%s\"), got a tensor", want);
    const char *got = nb_last_error();
    ck_assert_msg(got && strcmp(got, want) == 0, "error \"%s\", expected \"%s\"",
                  got ? got : "(none)", want);
    nb_clear_error();
}

/* t has dtype, shape and the values want (compared as doubles); frees t */
static void expect_values(nb_tensor *t, nb_dtype dtype, int ndim, const int64_t *shape,
                          const double *want) {
    ck_assert_msg(t != NULL, "%s", nb_last_error() ? nb_last_error() : "?");
    ck_assert_int_eq(nb_dtype_of(t), dtype);
    ck_assert_int_eq(nb_ndim(t), ndim);
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) {
        ck_assert_int_eq(nb_shape(t)[d], shape[d]);
        n *= shape[d];
    }
    ck_assert(nb_is_contiguous(t));
    ck_assert(!nb_requires_grad(t));
    for (int64_t i = 0; i < n; i++) {
        double got = dtype == NB_F32   ? (double)((const float *)nb_data(t))[i]
                     : dtype == NB_F64 ? ((const double *)nb_data(t))[i]
                                       : (double)((const int64_t *)nb_data(t))[i];
        ck_assert_msg(got == want[i] || (isnan(got) && isnan(want[i])),
                      "%s element %lld: got %.17g, want %.17g", nb_dtype_name(dtype),
                      (long long)i, got, want[i]);
    }
    nb_free(t);
}

START_TEST(u8_images_in_every_dtype) {
    /* two 2x3 "images" */
    const unsigned char px[12] = {0, 1, 2, 127, 128, 255, 10, 20, 30, 40, 50, 60};
    const char *path = write_idx("img", 0x08, 3, (const uint32_t[]){2, 2, 3}, px, 12);
    double want[12];
    for (int i = 0; i < 12; i++) want[i] = px[i];
    const int64_t shape[3] = {2, 2, 3};
    expect_values(nb_load_idx(path, NB_F32), NB_F32, 3, shape, want);
    expect_values(nb_load_idx(path, NB_F64), NB_F64, 3, shape, want);
    expect_values(nb_load_idx(path, NB_I64), NB_I64, 3, shape, want);
    /* labels: one dim */
    path = write_idx("labels", 0x08, 1, (const uint32_t[]){4}, "\x09\x00\x03\x07", 4);
    expect_values(nb_load_idx(path, NB_I64), NB_I64, 1, (const int64_t[]){4},
                  (const double[]){9, 0, 3, 7});
}
END_TEST

/* every type byte, big-endian, signed where the type is */
START_TEST(every_type_big_endian) {
    const char *path = write_idx("i8", 0x09, 1, (const uint32_t[]){3}, "\x80\x7f\xff", 3);
    expect_values(nb_load_idx(path, NB_I64), NB_I64, 1, (const int64_t[]){3},
                  (const double[]){-128, 127, -1});
    path = write_idx("i16", 0x0B, 1, (const uint32_t[]){3}, "\x01\x02\x80\x00\xff\xfe", 6);
    expect_values(nb_load_idx(path, NB_F32), NB_F32, 1, (const int64_t[]){3},
                  (const double[]){258, -32768, -2});
    path = write_idx("i32", 0x0C, 2, (const uint32_t[]){1, 3},
                     "\x80\x00\x00\x00\x01\x00\x00\x01\x00\x00\x00\x05", 12);
    expect_values(nb_load_idx(path, NB_F64), NB_F64, 2, (const int64_t[]){1, 3},
                  (const double[]){-2147483648.0, 16777217, 5});
    /* f32 1.5 (0x3FC00000), -0.25 (0xBE800000), NaN (0x7FC00000) */
    path = write_idx("f32", 0x0D, 1, (const uint32_t[]){3},
                     "\x3f\xc0\x00\x00\xbe\x80\x00\x00\x7f\xc0\x00\x00", 12);
    expect_values(nb_load_idx(path, NB_F32), NB_F32, 1, (const int64_t[]){3},
                  (const double[]){1.5, -0.25, NAN});
    expect_values(nb_load_idx(path, NB_F64), NB_F64, 1, (const int64_t[]){3},
                  (const double[]){1.5, -0.25, NAN});
    /* f64 2^53 (0x4340000000000000) and -3 (0xC008000000000000) */
    path = write_idx("f64", 0x0E, 1, (const uint32_t[]){2},
                     "\x43\x40\x00\x00\x00\x00\x00\x00\xc0\x08\x00\x00\x00\x00\x00\x00", 16);
    expect_values(nb_load_idx(path, NB_I64), NB_I64, 1, (const int64_t[]){2},
                  (const double[]){9007199254740992.0, -3});
    /* a zero size is an empty tensor of that shape */
    path = write_idx("empty", 0x08, 2, (const uint32_t[]){0, 28}, NULL, 0);
    expect_values(nb_load_idx(path, NB_F32), NB_F32, 2, (const int64_t[]){0, 28}, NULL);
    path = write_idx("empty_large", 0x0E, 3, (const uint32_t[]){0xffffffffu, 0, 0xfffffffu}, NULL, 0);
    expect_values(nb_load_idx(path, NB_F64), NB_F64, 3,
                  (const int64_t[]){4294967295, 0, 268435455}, NULL);
}
END_TEST

/* a value the dtype would round, or cannot hold, is an error naming it */
START_TEST(values_not_exact_in_the_dtype) {
    const char *path = write_idx("i32", 0x0C, 1, (const uint32_t[]){2},
                                 "\x00\x00\x00\x05\x01\x00\x00\x01", 8);
    expect_message(nb_load_idx(path, NB_F32),
                   "nb_load_idx: \"%s\": value 16777217 (element 1, i32) is not exact in f32",
                   path);
    path = write_idx("f32", 0x0D, 1, (const uint32_t[]){1}, "\x3f\xc0\x00\x00", 4);
    expect_message(nb_load_idx(path, NB_I64),
                   "nb_load_idx: \"%s\": value 1.5 (element 0, f32) is not exact in i64", path);
    path = write_idx("nan", 0x0D, 1, (const uint32_t[]){1}, "\x7f\xc0\x00\x00", 4);
    expect_message(nb_load_idx(path, NB_I64),
                   "nb_load_idx: \"%s\": value nan (element 0, f32) is not exact in i64", path);
    /* f64 0.1 (0x3FB999999999999A) has no exact f32 */
    path = write_idx("f64", 0x0E, 1, (const uint32_t[]){1}, "\x3f\xb9\x99\x99\x99\x99\x99\x9a",
                     8);
    expect_message(nb_load_idx(path, NB_F32),
                   "nb_load_idx: \"%s\": value 0.10000000000000001 (element 0, f64) is not "
                   "exact in f32", path);
    /* 2^63 (0x43E0000000000000) is past int64 */
    path = write_idx("big", 0x0E, 1, (const uint32_t[]){1}, "\x43\xe0\x00\x00\x00\x00\x00\x00",
                     8);
    expect_message(nb_load_idx(path, NB_I64),
                   "nb_load_idx: \"%s\": value 9.2233720368547758e+18 (element 0, f64) is not "
                   "exact in i64", path);
}
END_TEST

START_TEST(bad_header) {
    const uint32_t two[1] = {2};
    const char *path = write_idx_raw("magic", 0, 1, 0x08, 1, two, "ab", 2, 0);
    expect_message(nb_load_idx(path, NB_F32),
                   "nb_load_idx: \"%s\" is not an IDX file: it starts with bytes 0x00 0x01, not "
                   "0x00 0x00 (a gzipped file starts with 0x1f 0x8b: gunzip it first)", path);
    path = write_idx_raw("gz", 0x1f, 0x8b, 0x08, 1, two, "ab", 2, 0);
    expect_message(nb_load_idx(path, NB_F32),
                   "nb_load_idx: \"%s\" is not an IDX file: it starts with bytes 0x1f 0x8b, not "
                   "0x00 0x00 (a gzipped file starts with 0x1f 0x8b: gunzip it first)", path);
    path = write_idx("type", 0x0A, 1, two, "ab", 2);
    expect_message(nb_load_idx(path, NB_F32),
                   "nb_load_idx: \"%s\": unknown IDX type byte 0x0a (known: 0x08 u8, 0x09 i8, "
                   "0x0B i16, 0x0C i32, 0x0D f32, 0x0E f64)", path);
    path = write_idx("dims0", 0x08, 0, NULL, "a", 1);
    expect_message(nb_load_idx(path, NB_F32),
                   "nb_load_idx: \"%s\": 0 dims in the IDX header; nabla reads 1 to 8", path);
    const uint32_t ones[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    path = write_idx("dims9", 0x08, 9, ones, "a", 1);
    expect_message(nb_load_idx(path, NB_F32),
                   "nb_load_idx: \"%s\": 9 dims in the IDX header; nabla reads 1 to 8", path);
    /* three sizes of 2^32-1 f64: about 2^99 bytes */
    const uint32_t huge[3] = {0xffffffffu, 0xffffffffu, 0xffffffffu};
    path = write_idx("huge", 0x0E, 3, huge, NULL, 0);
    expect_message(nb_load_idx(path, NB_F32),
                   "nb_load_idx: \"%s\": shape f64 (4294967295,4294967295,4294967295) has more "
                   "bytes than int64 can count", path);
    /* a zero beside them does not help: the strides multiply the other sizes */
    path = write_idx("huge0", 0x08, 3, (const uint32_t[]){0, 0xffffffffu, 0xffffffffu}, NULL, 0);
    expect_message(nb_load_idx(path, NB_F32),
                   "nb_load_idx: \"%s\": shape u8 (0,4294967295,4294967295) has more "
                   "bytes than int64 can count", path);
}
END_TEST

START_TEST(truncated_and_left_over) {
    const char *path = test_tmp_path("three");
    test_write_bytes(path, "\0\0\x08", 3);
    expect_message(nb_load_idx(path, NB_F32),
                   "nb_load_idx: \"%s\" is truncated: 3 bytes, fewer than the 4 of an IDX "
                   "file's magic", path);
    path = test_tmp_path("empty");
    test_write_bytes(path, "", 0);
    expect_message(nb_load_idx(path, NB_F32),
                   "nb_load_idx: \"%s\" is truncated: 0 bytes, fewer than the 4 of an IDX "
                   "file's magic", path);
    /* 3 dims need 16 header bytes; 14 are there */
    const uint32_t dims[3] = {2, 2, 2};
    path = write_idx_raw("header", 0, 0, 0x08, 3, dims, NULL, 0, -2);
    expect_message(nb_load_idx(path, NB_F32),
                   "nb_load_idx: \"%s\" is truncated: 14 bytes, fewer than the 16 of its "
                   "header (3 dims)", path);
    path = write_idx_raw("data", 0, 0, 0x0B, 3, dims, "abcdefghijklmnop", 16, -1);
    expect_message(nb_load_idx(path, NB_F32),
                   "nb_load_idx: \"%s\" is truncated: its header says i16 (2,2,2) (32 bytes "
                   "with the header) but the file has 31 bytes", path);
    path = write_idx_raw("extra", 0, 0, 0x0B, 3, dims, "abcdefghijklmnop", 16, 3);
    expect_message(nb_load_idx(path, NB_F32),
                   "nb_load_idx: \"%s\" has 3 bytes after its data: its header says i16 (2,2,2) "
                   "(32 bytes with the header) but the file has 35 bytes", path);
}
END_TEST

/* more data than one read chunk (64 KiB): every chunk lands in place, and a
 * bad value's element counts from the first */
START_TEST(large_file) {
    enum { N = 30001 }; /* i32: 120004 bytes */
    unsigned char *b = malloc(4 * N);
    ck_assert_ptr_nonnull(b);
    for (uint32_t i = 0; i < N; i++) {
        uint32_t v = i * 2654435761u % 16777216u; /* below 2^24: exact in f32 */
        for (int k = 0; k < 4; k++) b[4 * i + k] = (unsigned char)(v >> (24 - 8 * k));
    }
    const char *path = write_idx("large", 0x0C, 1, (const uint32_t[]){N}, b, 4 * N);
    nb_tensor *t = nb_load_idx(path, NB_F32);
    ck_assert_msg(t != NULL, "%s", nb_last_error());
    const float *v = nb_data(t);
    for (uint32_t i = 0; i < N; i++)
        ck_assert_msg(v[i] == (float)(i * 2654435761u % 16777216u), "element %u", i);
    nb_free(t);
    /* element 20000 (past the first chunk) set to 2^24 + 1 */
    b[4 * 20000] = 0x01, b[4 * 20000 + 1] = 0, b[4 * 20000 + 2] = 0, b[4 * 20000 + 3] = 0x01;
    path = write_idx("large_bad", 0x0C, 1, (const uint32_t[]){N}, b, 4 * N);
    free(b);
    int64_t live = nb_live_tensors(), bytes = nb_memory_allocated();
    expect_message(nb_load_idx(path, NB_F32),
                   "nb_load_idx: \"%s\": value 16777217 (element 20000, i32) is not exact in "
                   "f32", path);
    ck_assert_int_eq(nb_live_tensors(), live);
    ck_assert_int_eq(nb_memory_allocated(), bytes);
}
END_TEST

/* the tensor outlives the scope it was loaded in */
START_TEST(persistent) {
    const char *path = write_idx("p", 0x08, 1, (const uint32_t[]){2}, "\x05\x06", 2);
    int64_t live = nb_live_tensors();
    nb_scope_begin();
    nb_tensor *t = nb_load_idx(path, NB_F64);
    nb_scope_end();
    expect_values(t, NB_F64, 1, (const int64_t[]){2}, (const double[]){5, 6});
    ck_assert_int_eq(nb_live_tensors(), live);
}
END_TEST

START_TEST(bad_arguments_and_files) {
    expect_message(nb_load_idx(NULL, NB_F32), "nb_load_idx: path is NULL");
    const char *path = write_idx("ok", 0x08, 1, (const uint32_t[]){1}, "\x05", 1);
    expect_message(nb_load_idx(path, NB_BOOL), "nb_load_idx: dtype must be f32, f64 or i64, got bool");
    path = test_tmp_path("missing");
    expect_message(nb_load_idx(path, NB_F32),
                   "nb_load_idx: cannot open \"%s\": No such file or directory", path);
    expect_message(nb_load_idx(test_tmp_dir, NB_F32), "nb_load_idx: \"%s\" is not a regular file",
                   test_tmp_dir);
}
END_TEST

/* the real files: tests/fixtures/fashion-mini (gen_fashion_mini.py: the first
 * 32 test images of Fashion-MNIST); the sums are Python's over the bytes */
START_TEST(fashion_mini) {
    nb_tensor *x = nb_load_idx(NB_FIXTURE_DIR "/fashion-mini/t10k-images-idx3-ubyte", NB_F64);
    ck_assert_msg(x != NULL, "%s", nb_last_error());
    ck_assert_int_eq(nb_ndim(x), 3);
    ck_assert_int_eq(nb_shape(x)[0], 32);
    ck_assert_int_eq(nb_shape(x)[1], 28);
    ck_assert_int_eq(nb_shape(x)[2], 28);
    const double *v = nb_data(x);
    double all = 0, first = 0;
    for (int i = 0; i < 32 * 784; i++) all += v[i];
    for (int i = 0; i < 784; i++) first += v[i];
    ck_assert_double_eq(all, 1750726);
    ck_assert_double_eq(first, 33456);
    ck_assert_double_eq(v[14 * 28 + 14], 110);
    nb_free(x);
    nb_tensor *y = nb_load_idx(NB_FIXTURE_DIR "/fashion-mini/t10k-labels-idx1-ubyte", NB_I64);
    expect_values(y, NB_I64, 1, (const int64_t[]){32},
                  (const double[]){9, 2, 1, 1, 6, 1, 4, 6, 5, 7, 4, 5, 7, 3, 4, 1,
                                   2, 4, 8, 0, 2, 5, 7, 9, 1, 4, 6, 0, 9, 3, 8, 8});
}
END_TEST

static void make_dir(void) { test_make_tmp_dir("idx"); }

Suite *suite_idx(void) {
    Suite *s = suite_create("idx");
    TCase *tc = tcase_create("idx");
    tcase_add_checked_fixture(tc, make_dir, test_remove_tmp_dir);
    tcase_add_test(tc, u8_images_in_every_dtype);
    tcase_add_test(tc, every_type_big_endian);
    tcase_add_test(tc, values_not_exact_in_the_dtype);
    tcase_add_test(tc, bad_header);
    tcase_add_test(tc, truncated_and_left_over);
    tcase_add_test(tc, large_file);
    tcase_add_test(tc, persistent);
    tcase_add_test(tc, bad_arguments_and_files);
    tcase_add_test(tc, fashion_mini);
    suite_add_tcase(s, tc);
    return s;
}
