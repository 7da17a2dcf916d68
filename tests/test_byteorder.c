/* test_byteorder.c: the byte order of nabla's files, whatever the host.
 * nn/formats/byteorder_internal.h against known bytes (little-endian stores
 * and loads, big-endian loads, the in-place swap); nb_save's data section,
 * byte for byte; a hand-built big-endian IDX file. On a little-endian host
 * these pin the file side; make test-s390x runs them on a big-endian one. */
#include "test_util.h"

#include <stdint.h>
#include <stdlib.h>

#include "nn/formats/byteorder_internal.h"

#define CK_OK(expr) ck_assert_msg((expr) == 0, "%s", nb_last_error() ? nb_last_error() : "?")
#define CK_NN(t) ck_assert_msg((t) != NULL, "%s", nb_last_error() ? nb_last_error() : "?")

static void expect_bytes(const char *what, const unsigned char *got, const unsigned char *want,
                         size_t n) {
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(got[i] == want[i], "%s: byte %zu is 0x%02x, expected 0x%02x", what, i,
                      got[i], want[i]);
}

START_TEST(little_endian_stores_and_loads) {
    unsigned char b[8];
    nn_st_le16(b, 0x0102);
    expect_bytes("u16", b, (const unsigned char[]){0x02, 0x01}, 2);
    ck_assert_uint_eq(nn_ld_le16(b), 0x0102);
    nn_st_le32(b, 0x01020304u);
    expect_bytes("u32", b, (const unsigned char[]){0x04, 0x03, 0x02, 0x01}, 4);
    ck_assert_uint_eq(nn_ld_le32(b), 0x01020304u);
    nn_st_le64(b, 0x0102030405060708u);
    expect_bytes("u64", b, (const unsigned char[]){8, 7, 6, 5, 4, 3, 2, 1}, 8);
    ck_assert(nn_ld_le64(b) == 0x0102030405060708u);
    nn_st_le64(b, 0xfedcba9876543210u); /* the high bit: no sign extension */
    ck_assert(nn_ld_le64(b) == 0xfedcba9876543210u);
    nn_st_le32(b, 0xfffffffeu);
    ck_assert_uint_eq(nn_ld_le32(b), 0xfffffffeu);
    nn_st_le_f32(b, -2.5f); /* 0xc0200000 */
    expect_bytes("f32", b, (const unsigned char[]){0x00, 0x00, 0x20, 0xc0}, 4);
    ck_assert(nn_ld_le_f32(b) == -2.5f);
    nn_st_le_f64(b, 1.0); /* 0x3ff0000000000000 */
    expect_bytes("f64", b, (const unsigned char[]){0, 0, 0, 0, 0, 0, 0xf0, 0x3f}, 8);
    ck_assert(nn_ld_le_f64(b) == 1.0);
    nn_st_le_bf16(b, 0x3f80); /* bf16 1.0 */
    expect_bytes("bf16", b, (const unsigned char[]){0x80, 0x3f}, 2);
    ck_assert_uint_eq(nn_ld_le_bf16(b), 0x3f80);
    /* the test's own byte-by-byte reading agrees */
    nn_st_le32(b, 20240326u);
    ck_assert_uint_eq(test_le(b, 4), 20240326u);
}
END_TEST

START_TEST(big_endian_loads) {
    const unsigned char b[8] = {0x00, 0x00, 0x08, 0x03, 0x89, 0xab, 0xcd, 0xef};
    ck_assert_uint_eq(nn_ld_be16(b + 2), 0x0803);
    ck_assert_uint_eq(nn_ld_be32(b), 0x0803u); /* an IDX magic: u8, 3 dims */
    ck_assert_uint_eq(nn_ld_be32(b + 4), 0x89abcdefu);
    ck_assert(nn_ld_be64(b) == 0x0000080389abcdefu);
}
END_TEST

START_TEST(swapping) {
    unsigned char b[16];
    for (int i = 0; i < 16; i++) b[i] = (unsigned char)i;
    nn_swap_bytes(b, 2, 4);
    expect_bytes("swap 4", b, (const unsigned char[]){3, 2, 1, 0, 7, 6, 5, 4, 8}, 9);
    for (int i = 0; i < 16; i++) b[i] = (unsigned char)i;
    nn_swap_bytes(b, 2, 8);
    expect_bytes("swap 8", b, (const unsigned char[]){7, 6, 5, 4, 3, 2, 1, 0, 15, 14}, 10);
    for (int i = 0; i < 16; i++) b[i] = (unsigned char)i;
    nn_swap_bytes(b, 3, 2);
    expect_bytes("swap 2", b, (const unsigned char[]){1, 0, 3, 2, 5, 4, 6}, 7);
    nn_swap_bytes(b, 16, 1);
    expect_bytes("swap 1", b, (const unsigned char[]){1, 0, 3, 2, 5, 4, 6}, 7);
    /* host values, copied out as they are in memory, then put in file order:
     * the little-endian bytes on any host */
    const float f[2] = {1.0f, -2.5f};
    memcpy(b, f, sizeof f);
    nn_swap_le(b, 2, 4);
    expect_bytes("f32 in file order", b,
                 (const unsigned char[]){0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x20, 0xc0}, 8);
    const int64_t i64 = -2;
    memcpy(b, &i64, 8);
    nn_swap_le(b, 1, 8);
    expect_bytes("i64 in file order", b,
                 (const unsigned char[]){0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, 8);
    /* and back: file bytes into host values */
    const unsigned char file[8] = {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x20, 0xc0};
    float g[2];
    nn_copy_le(g, file, 2, 4);
    ck_assert(g[0] == 1.0f && g[1] == -2.5f);
    uint16_t u[4];
    nn_copy_le(u, file, 4, 2);
    ck_assert(u[0] == 0 && u[1] == 0x3f80 && u[2] == 0 && u[3] == 0xc020);
}
END_TEST

/* nb_save's data section, byte for byte, and nb_load reading it back. */
START_TEST(save_writes_little_endian) {
    test_make_tmp_dir("byteorder");
    nb_scope_begin();
    nb_params *ps = nb_params_new(), *qs = nb_params_new();
    ck_assert_ptr_nonnull(nb_params_add_buffer(
        ps, "a", nb_from_data(NB_F32, NB_SHAPE(2), (const float[]){1.0f, -2.5f})));
    ck_assert_ptr_nonnull(
        nb_params_add_buffer(ps, "b", nb_from_data(NB_F64, NB_SHAPE(1), (const double[]){1.0})));
    ck_assert_ptr_nonnull(nb_params_add_buffer(
        ps, "c", nb_from_data(NB_I64, NB_SHAPE(1), (const int64_t[]){0x0102030405060708})));
    ck_assert_ptr_nonnull(nb_params_add_buffer(
        ps, "d", nb_to(nb_from_data(NB_F32, NB_SHAPE(1), (const float[]){1.0f}), NB_BF16)));
    nb_params_add_buffer(qs, "a", nb_zeros(NB_F32, NB_SHAPE(2)));
    nb_params_add_buffer(qs, "b", nb_zeros(NB_F64, NB_SHAPE(1)));
    nb_params_add_buffer(qs, "c", nb_zeros(NB_I64, NB_SHAPE(1)));
    nb_params_add_buffer(qs, "d", nb_zeros(NB_BF16, NB_SHAPE(1)));
    const char *path = test_tmp_path("le.safetensors");
    CK_OK(nb_save(ps, path));
    size_t n;
    unsigned char *f = (unsigned char *)test_read_file(path, &n);
    ck_assert_uint_ge(n, 8);
    uint64_t hlen = test_le(f, 8);
    ck_assert_uint_eq(n, 8 + hlen + 8 + 8 + 8 + 2); /* the data in registry order */
    const unsigned char want[26] = {
        0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x20, 0xc0, /* a: f32 1, -2.5 */
        0, 0, 0, 0, 0, 0, 0xf0, 0x3f,                    /* b: f64 1 */
        8, 7, 6, 5, 4, 3, 2, 1,                          /* c: i64 0x0102030405060708 */
        0x80, 0x3f};                                     /* d: bf16 1 */
    expect_bytes("nb_save's data", f + 8 + hlen, want, sizeof want);
    free(f);
    CK_OK(nb_load(qs, path));
    const float *a = nb_data(nb_params_get(qs, "a"));
    ck_assert(a[0] == 1.0f && a[1] == -2.5f);
    ck_assert(*(const double *)nb_data(nb_params_get(qs, "b")) == 1.0);
    ck_assert(*(const int64_t *)nb_data(nb_params_get(qs, "c")) == 0x0102030405060708);
    ck_assert_uint_eq(*(const uint16_t *)nb_data(nb_params_get(qs, "d")), 0x3f80);
    nb_scope_end();
    nb_params_free(ps);
    nb_params_free(qs);
    test_remove_tmp_dir();
}
END_TEST

/* An IDX file built by hand, big-endian as the format says: i32 (2, 3),
 * then f32 (2). */
START_TEST(idx_read_big_endian) {
    test_make_tmp_dir("byteorder");
    const char *path = test_tmp_path("be.idx");
    const unsigned char i32[12 + 24] = {
        0x00, 0x00, 0x0c, 0x02, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x03,
        0x00, 0x00, 0x00, 0x01, 0xff, 0xff, 0xff, 0xfe, 0x01, 0x02, 0x03, 0x04,
        0x00, 0x00, 0x01, 0x00, 0x80, 0x00, 0x00, 0x00, 0x7f, 0xff, 0xff, 0xff};
    test_write_bytes(path, i32, sizeof i32);
    nb_tensor *t = nb_load_idx(path, NB_I64);
    CK_NN(t);
    ck_assert_int_eq(nb_ndim(t), 2);
    ck_assert_int_eq(nb_shape(t)[0], 2);
    ck_assert_int_eq(nb_shape(t)[1], 3);
    const int64_t want[6] = {1, -2, 0x01020304, 256, INT32_MIN, INT32_MAX};
    for (int i = 0; i < 6; i++) ck_assert_int_eq(((const int64_t *)nb_data(t))[i], want[i]);
    nb_free(t);
    const unsigned char f32[8 + 8] = {0x00, 0x00, 0x0d, 0x01, 0x00, 0x00, 0x00, 0x02,
                                      0x3f, 0x80, 0x00, 0x00, 0xc0, 0x20, 0x00, 0x00};
    test_write_bytes(path, f32, sizeof f32);
    CK_NN(t = nb_load_idx(path, NB_F32));
    ck_assert_int_eq(nb_shape(t)[0], 2);
    ck_assert(((const float *)nb_data(t))[0] == 1.0f && ((const float *)nb_data(t))[1] == -2.5f);
    nb_free(t);
    test_remove_tmp_dir();
}
END_TEST

Suite *suite_byteorder(void) {
    Suite *s = suite_create("byteorder");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, little_endian_stores_and_loads);
    tcase_add_test(tc, big_endian_loads);
    tcase_add_test(tc, swapping);
    tcase_add_test(tc, save_writes_little_endian);
    tcase_add_test(tc, idx_read_big_endian);
    suite_add_tcase(s, tc);
    return s;
}
