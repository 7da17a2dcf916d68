/* test_tokens.c: nb_load_tokens on llm.c token files (header of 256 int32:
 * magic 20240520, version 1, count; then uint16 tokens) and on plain files
 * (one token per byte): the values, the tensor's kind and lifetime, and the
 * exact message of every way a file can be wrong. */
#include "test_util.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

/* An llm.c token file: header (magic, version, count as given) then the
 * tokens as little-endian uint16, then `extra` zero bytes (may be negative:
 * that many bytes cut from the end). */
static const char *write_llmc(const char *name, int32_t magic, int32_t version, int32_t count,
                              const uint16_t *tok, int n, int extra) {
    size_t size = 1024 + 2 * (size_t)n + (size_t)(extra > 0 ? extra : 0);
    unsigned char *b = calloc(1, size);
    ck_assert_ptr_nonnull(b);
    int32_t h[3] = {magic, version, count};
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 4; k++) b[4 * i + k] = (unsigned char)((uint32_t)h[i] >> (8 * k));
    for (int i = 0; i < n; i++) {
        b[1024 + 2 * i] = (unsigned char)(tok[i] & 0xff);
        b[1024 + 2 * i + 1] = (unsigned char)(tok[i] >> 8);
    }
    const char *path = test_tmp_path(name);
    test_write_bytes(path, b, extra < 0 ? size + (size_t)extra : size);
    free(b);
    return path;
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

static void expect_tokens(nb_tensor *t, const int64_t *want, int64_t n) {
    ck_assert_msg(t != NULL, "%s", nb_last_error() ? nb_last_error() : "?");
    ck_assert_int_eq(nb_dtype_of(t), NB_I64);
    ck_assert_int_eq(nb_ndim(t), 1);
    ck_assert_int_eq(nb_shape(t)[0], n);
    ck_assert(nb_is_contiguous(t));
    const int64_t *v = nb_data(t);
    for (int64_t i = 0; i < n; i++)
        ck_assert_msg(v[i] == want[i], "token %lld: got %lld, want %lld", (long long)i,
                      (long long)v[i], (long long)want[i]);
}

START_TEST(bytes_file) {
    const char *path = test_tmp_path("text.txt");
    test_write_bytes(path, "Hi\n\xff\0z", 6);
    nb_tensor *t = nb_load_tokens(path, 0);
    expect_tokens(t, (const int64_t[]){72, 105, 10, 255, 0, 122}, 6);
    nb_free(t);
    /* vocab_size 256 admits every byte */
    t = nb_load_tokens(path, 256);
    expect_tokens(t, (const int64_t[]){72, 105, 10, 255, 0, 122}, 6);
    nb_free(t);
}
END_TEST

START_TEST(llmc_file) {
    const uint16_t tok[4] = {50256, 0, 1, 0x1234};
    const char *path = write_llmc("gpt2.bin", 20240520, 1, 4, tok, 4, 0);
    nb_tensor *t = nb_load_tokens(path, 50257);
    expect_tokens(t, (const int64_t[]){50256, 0, 1, 0x1234}, 4);
    nb_free(t);
    /* uint16: 65535 is a token, not -1 */
    path = write_llmc("max.bin", 20240520, 1, 1, (const uint16_t[]){65535}, 1, 0);
    t = nb_load_tokens(path, 0);
    expect_tokens(t, (const int64_t[]){65535}, 1);
    nb_free(t);
}
END_TEST

/* the tensor outlives the scope it was loaded in; no tensor is left behind
 * by a failed load */
START_TEST(persistent_and_no_leak) {
    const char *path = test_tmp_path("abc");
    test_write_bytes(path, "abc", 3);
    int64_t live = nb_live_tensors();
    nb_scope_begin();
    nb_tensor *t = nb_load_tokens(path, 0);
    nb_scope_end();
    expect_tokens(t, (const int64_t[]){97, 98, 99}, 3);
    ck_assert(!nb_requires_grad(t));
    nb_free(t);
    ck_assert_int_eq(nb_live_tensors(), live);
    expect_message(nb_load_tokens(path, 98),
                   "nb_load_tokens: \"%s\": token 98 at position 1 is not below vocab_size 98",
                   path);
    ck_assert_int_eq(nb_live_tensors(), live);
}
END_TEST

/* more bytes than one read chunk (64 KiB): every chunk lands in place and a
 * bad token's position counts from the start of the file */
START_TEST(large_bytes_file) {
    enum { N = 200003 };
    unsigned char *b = malloc(N);
    ck_assert_ptr_nonnull(b);
    for (int i = 0; i < N; i++) b[i] = (unsigned char)(i * 7 % 251);
    const char *path = test_tmp_path("large");
    test_write_bytes(path, b, N);
    nb_tensor *t = nb_load_tokens(path, 251);
    ck_assert_ptr_nonnull(t);
    ck_assert_int_eq(nb_numel(t), N);
    const int64_t *v = nb_data(t);
    for (int i = 0; i < N; i++) ck_assert_int_eq(v[i], i * 7 % 251);
    nb_free(t);
    b[150001] = 251;
    test_write_bytes(path, b, N);
    expect_message(nb_load_tokens(path, 251),
                   "nb_load_tokens: \"%s\": token 251 at position 150001 is not below "
                   "vocab_size 251", path);
    free(b);
}
END_TEST

START_TEST(llmc_token_out_of_vocab) {
    const uint16_t tok[3] = {5, 50256, 50257};
    const char *path = write_llmc("oov.bin", 20240520, 1, 3, tok, 3, 0);
    expect_message(nb_load_tokens(path, 50257),
                   "nb_load_tokens: \"%s\": token 50257 at position 2 is not below vocab_size "
                   "50257", path);
    /* without a vocabulary every uint16 goes */
    nb_tensor *t = nb_load_tokens(path, 0);
    expect_tokens(t, (const int64_t[]){5, 50256, 50257}, 3);
    nb_free(t);
}
END_TEST

START_TEST(llmc_wrong_version) {
    const uint16_t tok[2] = {1, 2};
    const char *path = write_llmc("v2.bin", 20240520, 2, 2, tok, 2, 0);
    expect_message(nb_load_tokens(path, 0),
                   "nb_load_tokens: \"%s\" is an llm.c token file of version 2; only version 1 "
                   "is read", path);
}
END_TEST

START_TEST(llmc_count_does_not_match_size) {
    const uint16_t tok[3] = {1, 2, 3};
    const char *path = write_llmc("short.bin", 20240520, 1, 3, tok, 3, -1);
    expect_message(nb_load_tokens(path, 0),
                   "nb_load_tokens: \"%s\" is truncated: its header says 3 tokens (1030 bytes "
                   "with the header) but the file has 1029 bytes", path);
    path = write_llmc("fewer.bin", 20240520, 1, 4, tok, 3, 0);
    expect_message(nb_load_tokens(path, 0),
                   "nb_load_tokens: \"%s\" is truncated: its header says 4 tokens (1032 bytes "
                   "with the header) but the file has 1030 bytes", path);
    path = write_llmc("long.bin", 20240520, 1, 3, tok, 3, 2);
    expect_message(nb_load_tokens(path, 0),
                   "nb_load_tokens: \"%s\" has 2 bytes after its last token: its header says 3 "
                   "tokens (1030 bytes with the header) but the file has 1032 bytes", path);
}
END_TEST

START_TEST(llmc_bad_header) {
    const char *path = write_llmc("none.bin", 20240520, 1, 0, NULL, 0, 0);
    expect_message(nb_load_tokens(path, 0),
                   "nb_load_tokens: \"%s\": llm.c token file with a token count of 0 in its "
                   "header (no tokens)", path);
    path = write_llmc("negative.bin", 20240520, 1, -2, NULL, 0, 0);
    expect_message(nb_load_tokens(path, 0),
                   "nb_load_tokens: \"%s\": llm.c token file with a token count of -2 in its "
                   "header (no tokens)", path);
    /* the magic, then less than a header */
    path = write_llmc("cut.bin", 20240520, 1, 1, NULL, 0, -1000);
    expect_message(nb_load_tokens(path, 0),
                   "nb_load_tokens: \"%s\" starts with llm.c's token magic 20240520 but has 24 "
                   "bytes, fewer than its 1024-byte header", path);
}
END_TEST

/* another magic (llm.c's checkpoint's, 20240326) is no token file: bytes */
START_TEST(other_magic_is_bytes) {
    const char *path = write_llmc("model.bin", 20240326, 3, 1, (const uint16_t[]){7}, 1, 0);
    nb_tensor *t = nb_load_tokens(path, 0);
    ck_assert_ptr_nonnull(t);
    ck_assert_int_eq(nb_numel(t), 1026);
    const int64_t *v = nb_data(t);
    /* 20240326 = 0x0134d7c6, little-endian */
    ck_assert_int_eq(v[0], 0xc6);
    ck_assert_int_eq(v[1], 0xd7);
    ck_assert_int_eq(v[2], 0x34);
    ck_assert_int_eq(v[3], 0x01);
    ck_assert_int_eq(v[4], 3);
    ck_assert_int_eq(v[1024], 7);
    nb_free(t);
    /* files shorter than the magic are bytes too */
    path = test_tmp_path("two");
    test_write_bytes(path, "\x30\x31", 2);
    t = nb_load_tokens(path, 0);
    expect_tokens(t, (const int64_t[]){48, 49}, 2);
    nb_free(t);
}
END_TEST

START_TEST(empty_and_unreadable) {
    const char *path = test_tmp_path("empty");
    test_write_bytes(path, "", 0);
    expect_message(nb_load_tokens(path, 0), "nb_load_tokens: \"%s\" is empty (no tokens)", path);
    path = test_tmp_path("missing");
    expect_message(nb_load_tokens(path, 0),
                   "nb_load_tokens: cannot open \"%s\": No such file or directory", path);
    expect_message(nb_load_tokens(test_tmp_dir, 0), "nb_load_tokens: \"%s\" is not a regular file", test_tmp_dir);
    /* a FIFO is refused at once, not waited on */
    path = test_tmp_path("fifo");
    ck_assert_int_eq(mkfifo(path, 0600), 0);
    expect_message(nb_load_tokens(path, 0), "nb_load_tokens: \"%s\" is not a regular file", path);
    if (getuid() != 0) { /* root reads anything */
        path = test_tmp_path("secret");
        test_write_bytes(path, "x", 1);
        ck_assert_int_eq(chmod(path, 0), 0);
        expect_message(nb_load_tokens(path, 0),
                       "nb_load_tokens: cannot open \"%s\": Permission denied", path);
    }
}
END_TEST

START_TEST(bad_arguments) {
    expect_message(nb_load_tokens(NULL, 0), "nb_load_tokens: path is NULL");
    const char *path = test_tmp_path("x");
    test_write_bytes(path, "x", 1);
    expect_message(nb_load_tokens(path, -1),
                   "nb_load_tokens: vocab_size must be >= 0 (0: no check), got -1");
}
END_TEST

static void make_dir(void) { test_make_tmp_dir("tokens"); }

Suite *suite_tokens(void) {
    Suite *s = suite_create("tokens");
    TCase *tc = tcase_create("tokens");
    tcase_add_checked_fixture(tc, make_dir, test_remove_tmp_dir);
    tcase_add_test(tc, bytes_file);
    tcase_add_test(tc, llmc_file);
    tcase_add_test(tc, persistent_and_no_leak);
    tcase_add_test(tc, large_bytes_file);
    tcase_add_test(tc, llmc_token_out_of_vocab);
    tcase_add_test(tc, llmc_wrong_version);
    tcase_add_test(tc, llmc_count_does_not_match_size);
    tcase_add_test(tc, llmc_bad_header);
    tcase_add_test(tc, other_magic_is_bytes);
    tcase_add_test(tc, empty_and_unreadable);
    tcase_add_test(tc, bad_arguments);
    suite_add_tcase(s, tc);
    return s;
}
