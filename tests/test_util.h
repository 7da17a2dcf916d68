/* test_util.h: what every Check suite shares: PyTorch fixtures, value
 * comparison, gradcheck and error assertions. */
#ifndef NABLA_TEST_UTIL_H
#define NABLA_TEST_UTIL_H

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "nabla.h"

/* Loads tensor `name` from tests/fixtures/<file> (written by the gen_*.py
 * script beside it, through fxwriter.py).
 * The tensor is persistent and cached for the whole run: do not nb_free it.
 * Fails the test when the file or the name is missing. */
nb_tensor *fx(const char *file, const char *name);

/* Asserts same shape and |got - want| <= atol + rtol*|want| everywhere;
 * the failure message names the first bad element. */
#define expect_close(got, want, atol, rtol) \
    expect_close_at(__FILE__, __LINE__, (got), (want), (atol), (rtol))
void expect_close_at(const char *file, int line, const nb_tensor *got, const nb_tensor *want,
                     double atol, double rtol);

/* Asserts that nb_gradcheck passes (default tolerances) and prints one line
 * "gradcheck ok  <label> ..." so that `make test` lists what was checked. */
#define expect_gradcheck(label, fn, ctx, n, inputs) \
    expect_gradcheck_at(__FILE__, __LINE__, (label), (fn), (ctx), (n), (inputs))
void expect_gradcheck_at(const char *file, int line, const char *label, nb_fn fn, void *ctx,
                         int n, nb_tensor **inputs);
/* The same with nb_gradgradcheck (second order), and with nb_gradcheck's
 * check_forward_ad (forward mode against the numeric Jacobian). */
#define expect_gradgradcheck(label, fn, ctx, n, inputs) \
    expect_gradgradcheck_at(__FILE__, __LINE__, (label), (fn), (ctx), (n), (inputs))
void expect_gradgradcheck_at(const char *file, int line, const char *label, nb_fn fn, void *ctx,
                             int n, nb_tensor **inputs);
#define expect_forward_ad(label, fn, ctx, n, inputs) \
    expect_forward_ad_at(__FILE__, __LINE__, (label), (fn), (ctx), (n), (inputs))
void expect_forward_ad_at(const char *file, int line, const char *label, nb_fn fn, void *ctx,
                          int n, nb_tensor **inputs);
/* All three: first order, second order (create_graph) and forward mode. */
#define expect_all_orders(label, fn, ctx, n, in)                                 \
    do {                                                                         \
        expect_gradcheck(label, fn, ctx, n, in);                                 \
        expect_gradgradcheck(label, fn, ctx, n, in);                             \
        expect_forward_ad(label, fn, ctx, n, in);                                \
    } while (0)

/* Asserts that a call failed: result NULL and nb_last_error() containing
 * every one of the NULL-terminated substrings; clears the error. */
#define expect_error(result, ...) \
    expect_error_at(__FILE__, __LINE__, (const void *)(result), __VA_ARGS__, (const char *)NULL)
void expect_error_at(const char *file, int line, const void *result, ...);
/* The same for functions that return an int status: rc must be negative. */
#define expect_error_rc(rc, ...) \
    expect_error_at(__FILE__, __LINE__, (rc) < 0 ? NULL : (const void *)"", __VA_ARGS__, \
                    (const char *)NULL)

/* Asserts that nb_last_error() is "<head>, after an earlier error: <first>":
 * a NULL input named, and the failure that made it quoted. */
#define expect_error_after(head, first) expect_error_after_at(__FILE__, __LINE__, (head), (first))
void expect_error_after_at(const char *file, int line, const char *head, const char *first);

/* A fresh directory /tmp/nabla-<tag>-XXXXXX for the files of one test (its
 * path in test_tmp_dir), a file name in it (four rotating buffers, so a few
 * paths can be held at once), and its removal with all it holds. */
extern char test_tmp_dir[64];
void test_make_tmp_dir(const char *tag);
const char *test_tmp_path(const char *name);
void test_remove_tmp_dir(void);
/* A whole file, malloc'ed and NUL-terminated (free it); *n gets its size
 * when n is not NULL. Fails the test when it cannot be read. */
char *test_read_file(const char *path, size_t *n);
/* Writes n bytes of data to path (asserting every step). */
void test_write_bytes(const char *path, const void *data, size_t n);

/* Little-endian values in a file's bytes, whatever the host (the files'
 * order: tests that build or inspect a file by hand go through these, never
 * through a memcpy of a host value). Written out byte by byte here, apart
 * from the library's nn/formats/byteorder_internal.h, which they check. */
static inline uint64_t test_le(const void *p, int bytes) {
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; i--) v = v << 8 | ((const unsigned char *)p)[i];
    return v;
}
static inline void test_put_le(void *p, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) ((unsigned char *)p)[i] = (unsigned char)(v >> (8 * i));
}
static inline float test_le_f32(const void *p) {
    uint32_t u = (uint32_t)test_le(p, 4);
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline void test_put_le_f32(void *p, float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    test_put_le(p, u, 4);
}
static inline void test_put_le_f64(void *p, double d) {
    uint64_t u;
    memcpy(&u, &d, 8);
    test_put_le(p, u, 8);
}

/* Deterministic f64 test input: values drawn from a fixed seed, requiring grad. */
nb_tensor *rand_leaf(uint64_t seed, int ndim, const int64_t *shape);

/* A non-contiguous f64 leaf (requires grad) of shape (ndim, shape): random
 * values from seed laid out with dims d0 and d1 swapped in memory. */
nb_tensor *transposed_leaf(uint64_t seed, int ndim, const int64_t *shape, int d0, int d1);
/* A tensor's values in row-major order, as a malloc'ed array (free it). */
double *values(const nb_tensor *t);

/* 1 when built with AddressSanitizer: then RSS means nothing (quarantine,
 * shadow memory) and the library recycles no memory (tensor/alloc.c). */
#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif
#ifndef UNDER_ASAN
#define UNDER_ASAN 0
#endif
/* 1 when built with ThreadSanitizer. */
#if defined(__SANITIZE_THREAD__)
#define UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define UNDER_TSAN 1
#endif
#endif
#ifndef UNDER_TSAN
#define UNDER_TSAN 0
#endif

/* Each suite file defines one of these; run_tests.c runs them all. */
Suite *suite_tensor(void);
Suite *suite_views(void);
Suite *suite_higher_order(void);
Suite *suite_elementwise(void);
Suite *suite_reduce(void);
Suite *suite_matmul(void);
Suite *suite_gemm_bf16(void); /* test_gemm_bf16.c: the bf16 matrix-multiply kernel */
Suite *suite_cpu(void); /* test_cpu.c: caches read from the CPU, the GEMM blocks made from them */
Suite *suite_softmax(void);
Suite *suite_pool(void); /* test_pool.c: max and average pooling */
Suite *suite_conv(void); /* test_conv.c: nb_conv1d, nb_conv2d */
Suite *suite_autograd(void);
Suite *suite_function(void);
Suite *suite_callbacks(void); /* test_callbacks.c: user callbacks that misbehave */
/* test_callbacks.c: the callback x misbehaviour table of docs/custom-functions.md */
void print_callback_table(FILE *f);
Suite *suite_errors(void);
Suite *suite_scope(void);
Suite *suite_nn(void);
Suite *suite_batchnorm(void); /* test_batchnorm.c: BatchNorm modules, batch_norm, losses */
Suite *suite_attention(void);
Suite *suite_rnn(void); /* test_rnn.c: nb_RNNCell, nb_GRUCell, nb_LSTMCell */
Suite *suite_conv_module(void); /* test_conv_module.c: nb_Conv1d, nb_Conv2d */
Suite *suite_optim(void);
Suite *suite_schedule(void); /* test_schedule.c: learning-rate schedules vs PyTorch, nanoGPT */
Suite *suite_transformer(void);
Suite *suite_threads(void);
Suite *suite_concurrency(void);
Suite *suite_checkpoint(void);
Suite *suite_handles(void);
Suite *suite_soak(void);
Suite *suite_registry(void);
Suite *suite_bf16(void);
/* test_registry.c: prints the op table of docs/ops.md ("full") or README.md */
void print_op_table(const char *which);
Suite *suite_edges(void);
Suite *suite_gpt(void);    /* test_gpt.c: the model, generation, weight decay groups */
Suite *suite_gpt_io(void); /* test_gpt_io.c: llm.c / Hugging Face checkpoint files */
Suite *suite_gpt_torch(void); /* test_gpt_torch.c: agreement with PyTorch on generated files */
Suite *suite_randn(void);    /* test_randn.c: nb_randn's values (the f32 fast path = libm) */
Suite *suite_tokens(void);   /* test_tokens.c: nb_load_tokens (llm.c token files, bytes) */
Suite *suite_idx(void);      /* test_idx.c: nb_load_idx (IDX files: MNIST, Fashion-MNIST) */
Suite *suite_byteorder(void); /* test_byteorder.c: files little-endian on any host (IDX big) */
Suite *suite_tokenizer(void); /* test_tokenizer.c: nb_tokenizer (GPT-2 BPE) */
Suite *suite_recompute(void); /* test_recompute.c: nb_checkpoint (activation checkpointing) */
Suite *suite_sizes(void);    /* test_sizes.c: every size argument at 0, -1, INT64_MAX, INT64_MIN */
/* test_second_order.c: Hessians, Hv, jvp and a gradient penalty against PyTorch */
Suite *suite_second_order(void);

#endif
