/* test_checkpoint.c: nb_save / nb_load (safetensors), registry buffers and
 * nb_params_add_all, optimizer state for exact resumption.
 * PyTorch side: tests/fixtures/gen_checkpoint.py (files written by PyTorch
 * load into nabla and give PyTorch's output; the file nabla writes is the
 * one PyTorch read, byte for byte). Then every way a file can be wrong. */
#include "test_util.h"
#include "../nn/formats/files_internal.h" /* nn_temp_*: the temporaries' two paths */
#include "nn/nn_internal.h" /* nn_index_work_done: the name index's work, counted */

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CK_OK(expr) ck_assert_msg((expr) == 0, "%s", nb_last_error() ? nb_last_error() : "?")
#define CK_NN(t) ck_assert_msg((t) != NULL, "%s", nb_last_error() ? nb_last_error() : "?")

static const char *FX = "checkpoint.txt";

static const char *fixture_path(const char *name) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", NB_FIXTURE_DIR, name);
    return path;
}

static unsigned char *slurp(const char *path, long *n) {
    size_t len;
    unsigned char *b = (unsigned char *)test_read_file(path, &len);
    *n = (long)len;
    return b;
}

static void expect_same_bytes(const char *a, const char *b) {
    long na, nb;
    unsigned char *x = slurp(a, &na), *y = slurp(b, &nb);
    ck_assert_msg(na == nb && memcmp(x, y, (size_t)na) == 0, "%s (%ld bytes) and %s (%ld bytes) "
                  "differ", a, na, b, nb);
    free(x);
    free(y);
}

/* Exact equality of values (any dtype) */
static void expect_equal(const nb_tensor *got, const nb_tensor *want) {
    expect_close(got, want, 0, 0);
}

/* -------------------------------------------------------- PyTorch interop */
static void mha_registry(nb_params **ps, nb_MHA *m, uint64_t seed) {
    fx(FX, "q"), fx(FX, "kv"), fx(FX, "keep"); /* fixtures load outside scopes */
    nb_rng rng;
    nb_rng_seed(&rng, seed);
    *ps = nb_params_new();
    CK_OK(nb_mha_init(m, *ps, "", 16, 4, 0.0, true, &rng));
}

static nb_tensor *mha_out(nb_MHA *m) {
    nb_tensor *kv = fx(FX, "kv");
    return nb_mha_forward(m, fx(FX, "q"), kv, kv, fx(FX, "keep"), false, NULL, NULL);
}

START_TEST(test_torch_file_loads_into_nabla) {
    nb_params *ps;
    nb_MHA m;
    mha_registry(&ps, &m, 1);
    CK_OK(nb_load(ps, fixture_path("mha_torch.safetensors")));
    nb_tensor *want = fx(FX, "torch_out");
    nb_scope_begin();
    nb_tensor *out = mha_out(&m);
    CK_NN(out);
    expect_close(out, want, 1e-6, 1e-5);
    nb_scope_end();
    nb_params_free(ps);
}
END_TEST

/* The committed mha_nabla.safetensors, which PyTorch loaded, is exactly what
 * nb_save writes for this module; PyTorch's output on it is nabla's. */
START_TEST(test_nabla_file_loads_into_torch) {
    nb_params *ps;
    nb_MHA m;
    mha_registry(&ps, &m, 7);
    test_make_tmp_dir("ckpt");
    const char *mine = test_tmp_path("mha.safetensors");
    CK_OK(nb_save(ps, mine));
    if (getenv("NABLA_WRITE_FIXTURES")) CK_OK(nb_save(ps, fixture_path("mha_nabla.safetensors")));
    expect_same_bytes(mine, fixture_path("mha_nabla.safetensors"));
    expect_equal(nb_params_get(ps, "w_o.bias"), fx(FX, "nabla_file.w_o.bias"));
    nb_tensor *want = fx(FX, "nabla_file_out");
    nb_scope_begin();
    nb_tensor *out = mha_out(&m);
    CK_NN(out);
    expect_close(out, want, 1e-6, 1e-5);
    nb_scope_end();
    /* and it loads back into a differently initialized module */
    nb_params *ps2;
    nb_MHA m2;
    mha_registry(&ps2, &m2, 99);
    CK_OK(nb_load(ps2, mine));
    for (int i = 0; i < nb_params_count(ps); i++)
        expect_equal(nb_params_at(ps2, i, NULL), nb_params_at(ps, i, NULL));
    test_remove_tmp_dir();
    nb_params_free(ps);
    nb_params_free(ps2);
}
END_TEST

/* Buffers named as in the PyTorch file, registered in sorted order (the
 * order PyTorch's writer lays them out in), zero-filled. */
static nb_params *dtypes_registry(void) {
    nb_params *ps = nb_params_new();
    nb_scope_begin();
    CK_NN(nb_params_add_buffer(ps, "index", nb_zeros(NB_I64, NB_SHAPE(4))));
    CK_NN(nb_params_add_buffer(ps, "mask", nb_zeros(NB_BOOL, NB_SHAPE(2, 3))));
    CK_NN(nb_params_add_buffer(ps, "scale", nb_zeros(NB_F32, 0, NULL)));
    CK_NN(nb_params_add_buffer(ps, "table", nb_zeros(NB_F64, NB_SHAPE(2, 3))));
    nb_scope_end();
    return ps;
}

START_TEST(test_every_dtype_both_ways) {
    nb_params *ps = dtypes_registry();
    CK_OK(nb_load(ps, fixture_path("dtypes_torch.safetensors")));
    const char *names[] = {"index", "mask", "scale", "table"};
    char fxname[32];
    for (int i = 0; i < 4; i++) {
        snprintf(fxname, sizeof fxname, "dt.%s", names[i]);
        expect_equal(nb_params_get(ps, names[i]), fx(FX, fxname));
    }
    /* nabla writes the very bytes PyTorch wrote */
    test_make_tmp_dir("ckpt");
    CK_OK(nb_save(ps, test_tmp_path("dt.safetensors")));
    expect_same_bytes(test_tmp_path("dt.safetensors"), fixture_path("dtypes_torch.safetensors"));
    test_remove_tmp_dir();
    nb_params_free(ps);
}
END_TEST

/* ------------------------------------------------------------- round trips */
START_TEST(test_round_trip_views_f64_and_empty) {
    nb_params *a = nb_params_new(), *b = nb_params_new();
    nb_scope_begin();
    nb_tensor *w = nb_randn(NB_F64, NB_SHAPE(3, 4), NULL);
    CK_NN(nb_params_add(a, "layer.weight_t", nb_transpose(w, 0, 1))); /* a (4,3) view */
    CK_NN(nb_params_add(a, "layer.bias", nb_randn(NB_F32, NB_SHAPE(5), NULL)));
    CK_NN(nb_params_add(a, "empty", nb_zeros(NB_F32, NB_SHAPE(0, 3))));
    CK_NN(nb_params_add_buffer(a, "steps", nb_full(NB_I64, NB_SHAPE(2), 41)));
    nb_tensor *w2 = nb_zeros(NB_F64, NB_SHAPE(3, 4));
    CK_NN(nb_params_add(b, "layer.weight_t", nb_transpose(w2, 0, 1)));
    CK_NN(nb_params_add(b, "layer.bias", nb_zeros(NB_F32, NB_SHAPE(5))));
    CK_NN(nb_params_add(b, "empty", nb_zeros(NB_F32, NB_SHAPE(0, 3))));
    CK_NN(nb_params_add_buffer(b, "steps", nb_zeros(NB_I64, NB_SHAPE(2))));
    test_make_tmp_dir("ckpt");
    CK_OK(nb_save(a, test_tmp_path("a.safetensors")));
    CK_OK(nb_load(b, test_tmp_path("a.safetensors")));
    /* the view wrote through to the tensor it views */
    expect_equal(w2, w);
    expect_equal(nb_params_get(b, "layer.bias"), nb_params_get(a, "layer.bias"));
    expect_equal(nb_params_get(b, "steps"), nb_params_get(a, "steps"));
    /* no temporary file is left next to the checkpoint */
    char cmd[160];
    snprintf(cmd, sizeof cmd, "test $(ls -A '%s' | wc -l) -eq 1", test_tmp_dir);
    ck_assert_int_eq(system(cmd), 0);
    nb_scope_end();
    test_remove_tmp_dir();
    nb_params_free(a);
    nb_params_free(b);
}
END_TEST

/* Saving over a checkpoint replaces it whole: a reader that opened the old
 * file keeps reading the old bytes, and a save killed at any moment leaves
 * either the old file or the new one, never a mixture. */
START_TEST(test_save_replaces_atomically) {
    test_make_tmp_dir("ckpt");
    const char *path = test_tmp_path("big.safetensors");
    nb_params *ps = nb_params_new();
    nb_scope_begin();
    nb_tensor *p = nb_params_add(ps, "w", nb_full(NB_F32, NB_SHAPE(1 << 22), 1.0)); /* 16 MiB */
    nb_scope_end();
    CK_NN(p);
    CK_OK(nb_save(ps, path));
    FILE *old = fopen(path, "rb");
    ck_assert_ptr_nonnull(old);
    for (int round = 0; round < 3; round++) {
        nb_scope_begin();
        ck_assert_int_eq(nb_copy_into(p, nb_scalar(NB_F32, 2.0 + round)), 0);
        nb_scope_end();
        pid_t child = fork();
        ck_assert_int_ge(child, 0);
        if (child == 0) _exit(nb_save(ps, path) == 0 ? 0 : 1);
        nanosleep(&(struct timespec){0, 3000000L * round}, NULL); /* 0, 3, 6 ms into it */
        kill(child, SIGKILL);
        waitpid(child, NULL, 0);
        nb_params *q = nb_params_new();
        nb_scope_begin();
        nb_tensor *t = nb_params_add(q, "w", nb_zeros(NB_F32, NB_SHAPE(1 << 22)));
        nb_scope_end();
        CK_OK(nb_load(q, path));
        const float *v = nb_data(t);
        int64_t same = 0;
        for (int64_t i = 0; i < 1 << 22; i++) same += v[i] == v[0];
        ck_assert_msg(same == 1 << 22 && v[0] >= 1.0f && v[0] <= 2.0f + (float)round,
                      "round %d: a mixed file (%lld of %d values are %g)", round,
                      (long long)same, 1 << 22, v[0]);
        nb_params_free(q);
    }
    unsigned char last[4];
    ck_assert_int_eq(fseek(old, -4, SEEK_END), 0);
    ck_assert_int_eq(fread(last, 4, 1, old), 1);
    ck_assert(test_le_f32(last) == 1.0f); /* the first file, still open, was never written to */
    fclose(old);
    nb_params_free(ps);
    test_remove_tmp_dir();
}
END_TEST

/* ------------------------------------------------- buffers and add_all */
START_TEST(test_buffers_and_add_all) {
    nb_params *ps = nb_params_new(), *all = nb_params_new();
    nb_scope_begin();
    nb_tensor *w = nb_params_add(ps, "w", nb_ones(NB_F32, NB_SHAPE(2, 2)));
    nb_tensor *b = nb_params_add_buffer(ps, "running", nb_zeros(NB_I64, NB_SHAPE(3)));
    nb_scope_end();
    CK_NN(w);
    CK_NN(b);
    ck_assert_int_eq(nb_params_count(ps), 1);
    ck_assert_int_eq(nb_params_buffer_count(ps), 1);
    ck_assert_int_eq(nb_params_numel(ps), 4);
    ck_assert(nb_requires_grad(w) && !nb_requires_grad(b));
    ck_assert_ptr_eq(nb_params_get(ps, "running"), b);
    const char *name = NULL;
    ck_assert_ptr_eq(nb_params_buffer_at(ps, 0, &name), b);
    ck_assert_str_eq(name, "running");
    expect_error(nb_params_buffer_at(ps, 1, NULL), "nb_params_buffer_at", "index 1",
                 "1 buffers");
    nb_scope_begin();
    expect_error(nb_params_add_buffer(ps, "w", nb_ones(NB_F32, NB_SHAPE(1))),
                 "nb_params_add_buffer", "\"w\"", "exists already");
    nb_scope_end();
    /* add_all: shared storage under a prefix, parameters stay parameters */
    CK_OK(nb_params_add_all(all, "model.", ps));
    ck_assert_int_eq(nb_params_count(all), 1);
    ck_assert_int_eq(nb_params_buffer_count(all), 1);
    ck_assert_ptr_eq(nb_data(nb_params_get(all, "model.w")), nb_data(w));
    ck_assert_ptr_eq(nb_data(nb_params_get(all, "model.running")), nb_data(b));
    /* a clash anywhere leaves dst as it was */
    nb_params *clash = nb_params_new();
    nb_scope_begin();
    nb_params_add(clash, "a", nb_ones(NB_F32, NB_SHAPE(1)));
    nb_params_add_buffer(clash, "running", nb_ones(NB_F32, NB_SHAPE(1)));
    nb_scope_end();
    expect_error_rc(nb_params_add_all(all, "model.", clash), "nb_params_add_all",
                    "\"model.running\"", "exists already");
    ck_assert_int_eq(nb_params_count(all), 1);
    ck_assert_int_eq(nb_params_buffer_count(all), 1);
    expect_error_rc(nb_params_add_all(all, "", all), "nb_params_add_all", "same registry");
    expect_error_rc(nb_params_add_all(NULL, "", ps), "nb_params_add_all", "NULL");
    nb_params_free(clash);
    nb_params_free(all);
    ck_assert_int_eq(((float *)nb_data(w))[3], 1.0f); /* still ps's */
    nb_params_free(ps);
}
END_TEST

/* ------------------------------------------------ optimizer state, resume */
typedef struct {
    nb_params *ps;
    nb_Linear l1, l2;
    nb_optim *opt;
} net;

static void net_init(net *n, int kind) {
    nb_rng rng;
    nb_rng_seed(&rng, 3);
    n->ps = nb_params_new();
    CK_OK(nb_linear_init(&n->l1, n->ps, "l1", 4, 8, true, &rng));
    CK_OK(nb_linear_init(&n->l2, n->ps, "l2", 8, 1, true, &rng));
    n->opt = kind == 0   ? nb_adam(n->ps, 0.01, 0.9, 0.98, 1e-9, 0.01)
             : kind == 1 ? nb_adamw(n->ps, 0.01, 0.9, 0.98, 1e-9, 0.01)
                         : nb_sgd(n->ps, 0.01, 0.9, 0.01);
    CK_NN(n->opt);
}

static void net_free(net *n) {
    nb_optim_free(n->opt);
    nb_params_free(n->ps);
}

/* Step s of a fixed problem: the data depend on s only. */
static void net_step(net *n, int s) {
    nb_rng rng;
    nb_rng_seed(&rng, 100 + (uint64_t)s);
    nb_scope_begin();
    nb_tensor *x = nb_randn(NB_F32, NB_SHAPE(16, 4), &rng), *y = nb_sum(x, -1, true);
    nb_tensor *h = nb_relu(nb_linear_forward(&n->l1, x));
    nb_tensor *d = nb_sub(nb_linear_forward(&n->l2, h), y);
    CK_OK(nb_backward(nb_mean_all(nb_mul(d, d))));
    nb_optim_step(n->opt);
    nb_optim_zero_grad(n->opt);
    nb_scope_end();
}

START_TEST(test_resume_is_exact) {
    const char *kinds[] = {"adam", "adamw", "sgd"};
    test_make_tmp_dir("ckpt");
    for (int kind = 0; kind < 3; kind++) {
        net straight, first, second;
        net_init(&straight, kind);
        for (int s = 0; s < 8; s++) net_step(&straight, s);

        net_init(&first, kind);
        for (int s = 0; s < 4; s++) net_step(&first, s);
        CK_OK(nb_save(first.ps, test_tmp_path("model.safetensors")));
        CK_OK(nb_save(nb_optim_state(first.opt), test_tmp_path("optim.safetensors")));
        net_free(&first);

        net_init(&second, kind);
        CK_OK(nb_load(second.ps, test_tmp_path("model.safetensors")));
        CK_OK(nb_load(nb_optim_state(second.opt), test_tmp_path("optim.safetensors")));
        int64_t step = ((int64_t *)nb_data(nb_params_get(nb_optim_state(second.opt),
                                                          "l1.weight.step")))[0];
        ck_assert_int_eq(step, 4);
        for (int s = 4; s < 8; s++) net_step(&second, s);
        for (int i = 0; i < nb_params_count(straight.ps); i++) {
            const char *name;
            nb_tensor *a = nb_params_at(straight.ps, i, &name);
            ck_assert_msg(memcmp(nb_data(a), nb_data(nb_params_at(second.ps, i, NULL)),
                                 (size_t)nb_numel(a) * 4) == 0,
                          "%s: %s differs after resuming", kinds[kind], name);
        }
        net_free(&straight);
        net_free(&second);
    }
    /* the state's names, PyTorch's per-parameter keys */
    net n;
    net_init(&n, 0);
    nb_params *st = nb_optim_state(n.opt);
    const char *want[] = {"l1.weight.step", "l1.weight.exp_avg", "l1.weight.exp_avg_sq"};
    for (int i = 0; i < 3; i++) {
        const char *name;
        nb_params_buffer_at(st, i, &name);
        ck_assert_str_eq(name, want[i]);
    }
    ck_assert_int_eq(nb_params_buffer_count(st), 12);
    expect_error(nb_optim_state(NULL), "nb_optim_state", "NULL");
    /* a state saved from Adam does not load into SGD */
    CK_OK(nb_save(st, test_tmp_path("adam.safetensors")));
    net sgd;
    net_init(&sgd, 2);
    expect_error_rc(nb_load(nb_optim_state(sgd.opt), test_tmp_path("adam.safetensors")), "nb_load",
                    "no tensor \"l1.weight.momentum_buffer\" in the file");
    net_free(&sgd);
    net_free(&n);
    test_remove_tmp_dir();
}
END_TEST

/* ------------------------------------------------------------- bad files */
static nb_params *small_registry(void) {
    nb_params *ps = nb_params_new();
    nb_scope_begin();
    nb_params_add(ps, "a", nb_full(NB_F32, NB_SHAPE(2), 7.0));
    nb_params_add(ps, "b", nb_full(NB_F32, NB_SHAPE(1), 7.0));
    nb_scope_end();
    return ps;
}

/* A file with this header of n bytes and data_len bytes of 0x3f (1.0f pieces). */
static const char *write_file_n(const char *name, const char *header, uint64_t n,
                                size_t data_len) {
    const char *path = test_tmp_path(name);
    FILE *f = fopen(path, "wb");
    unsigned char len[8];
    for (int i = 0; i < 8; i++) len[i] = (unsigned char)(n >> (8 * i));
    fwrite(len, 1, 8, f);
    fwrite(header, 1, n, f);
    for (size_t i = 0; i < data_len; i++) fputc(0x3f, f);
    fclose(f);
    return path;
}

static const char *write_file(const char *name, const char *header, size_t data_len) {
    return write_file_n(name, header, strlen(header), data_len);
}

static void expect_untouched(nb_params *ps) {
    for (int i = 0; i < nb_params_count(ps); i++) {
        nb_tensor *t = nb_params_at(ps, i, NULL);
        for (int64_t k = 0; k < nb_numel(t); k++) ck_assert(((float *)nb_data(t))[k] == 7.0f);
    }
}

#define GOOD_A "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}"
#define GOOD_B "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}"

static const struct {
    const char *header;
    size_t data;
    const char *msg1, *msg2;
} bad[] = {
    /* names, dtypes, shapes against the registry */
    {"{" GOOD_A "}", 8, "no tensor \"b\" in the file", "no tensor was changed"},
    {"{" GOOD_A "," GOOD_B ",\"c\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[12,16]}}",
     16, "tensor \"c\" in the file is not in the registry", NULL},
    {"{\"a\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[0,16]}," 
     "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[16,20]}}",
     20, "tensor \"a\" is F64 in the file but F32 in the registry", NULL},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1,2],\"data_offsets\":[0,8]}," GOOD_B "}", 12,
     "tensor \"a\" has shape (1,2) in the file but (2) in the registry", NULL},
    /* the header itself */
    /* JSON's own problems (nn/formats/json.c) with their byte in the header */
    {"{" GOOD_A "," GOOD_B, 12, "invalid safetensors header: expected ',' or '}', found the end "
     "of the header (JSON, byte 107)", NULL},
    {"[]", 0, "invalid safetensors header: expected '{', found '[' (JSON, byte 0)", NULL},
    {"{\"a\\u12g4\":{}}", 0, "a \\u escape needs 4 hex digits (JSON, byte 7)", NULL},
    {"{" GOOD_A "," GOOD_A "," GOOD_B "}", 12, "tensor \"a\" appears twice", NULL},
    {"{\"a\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]}," GOOD_B "}", 8,
     "tensor \"a\"", "unsupported dtype \"F16\""},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}}", 8,
     "tensor \"a\"", "overflows"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999],\"data_offsets\":[0,8]}}", 8,
     "tensor \"a\": the integer 99999999999999999999 is outside [0, 9223372036854775807] "
     "(JSON, byte 29)", NULL},
    /* 2^63-1 itself is an integer the header may hold (then too large a shape) */
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[9223372036854775807],\"data_offsets\":[0,8]}}", 8,
     "tensor \"a\": its shape overflows 64-bit sizes", NULL},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8,
     "tensor \"a\": the integer -2 is outside [0, 9223372036854775807] (JSON, byte 29)", NULL},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}," 
     "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,112]}}", 12,
     "data_offsets [8, 112] do not hold 4 bytes within the 12-byte data section", NULL},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}," GOOD_B "}", 12,
     "data_offsets [8, 0]", NULL},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}," 
     "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 12,
     "tensor \"b\" starts at byte 4 of the data section, expected 8", NULL},
    {"{" GOOD_A "," GOOD_B "}", 20, "the data section has 20 bytes but the tensors cover 12",
     NULL},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}," GOOD_B "}", 12, "tensor \"a\" lacks data_offsets",
     NULL},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1}}", 8,
     "unknown field \"x\"", NULL},
    {"{\"__metadata__\":{\"format\":7}," GOOD_A "," GOOD_B "}", 12,
     "__metadata__ values must be strings", NULL},
    {"{" GOOD_A "," GOOD_B "} x", 12, "bytes after the JSON object (JSON, byte 109)", NULL},
    {"{\"a\\u0000\":{}}", 0, "\\u0000", NULL},
    {"{\"a\\ud800\":{}}", 0, "unpaired surrogate", NULL},
    {"{\"a", 0, "not terminated", NULL},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1,2,3,4,5,6,7,8,9],\"data_offsets\":[0,8]}}", 8,
     "shape has more than 8 entries", NULL},
    /* found by fuzz/fuzz_load (fuzz/regressions/load): not JSON, or ambiguous */
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[02],\"data_offsets\":[0,8]}," GOOD_B "}", 12,
     "an integer has a leading zero (not JSON)", NULL},
    {"{\"a\":{\"dtype\":\"F64\",\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
     GOOD_B "}", 12, "tensor \"a\"", "field \"dtype\" appears twice"},
    {"{\"__metadata__\":{},\"__metadata__\":{}," GOOD_A "," GOOD_B "}", 12,
     "__metadata__ appears twice", NULL},
};

START_TEST(test_bad_files_change_nothing) {
    test_make_tmp_dir("ckpt");
    nb_params *ps = small_registry();
    /* a good file of the same names loads (the cases below differ from it) */
    CK_OK(nb_load(ps, write_file("good", "{" GOOD_A "," GOOD_B "}", 12)));
    ck_assert(((float *)nb_data(nb_params_get(ps, "a")))[0] != 7.0f);
    nb_params_free(ps);
    ps = small_registry();
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char name[16];
        snprintf(name, sizeof name, "bad%zu", i);
        const char *path = write_file(name, bad[i].header, bad[i].data);
        ck_assert_int_eq(nb_load(ps, path), -1);
        const char *msg = nb_last_error();
        ck_assert_msg(msg && strstr(msg, "nb_load") && strstr(msg, path) &&
                          strstr(msg, bad[i].msg1) && (!bad[i].msg2 || strstr(msg, bad[i].msg2)),
                      "case %zu: message \"%s\" lacks \"%s\"", i, msg ? msg : "(none)",
                      bad[i].msg1);
        nb_clear_error();
        expect_untouched(ps);
    }
    /* a NUL byte is neither the end of the header nor padding (spaces are) */
    static const char nul_pad[] = "{" GOOD_A "," GOOD_B "}\0\0\0\0\0";
    expect_error_rc(nb_load(ps, write_file_n("nulpad", nul_pad, sizeof nul_pad - 1, 12)),
                    "nb_load", "invalid safetensors header: bytes after the JSON object (JSON, "
                    "byte 108)");
    static const char nul_colon[] = "{\"a\"\0{}}";
    expect_error_rc(nb_load(ps, write_file_n("nulcolon", nul_colon, sizeof nul_colon - 1, 0)),
                    "nb_load", "invalid safetensors header: expected ':', found byte 0x00 (JSON, "
                    "byte 4)");
    expect_untouched(ps);
    nb_params_free(ps);
    test_remove_tmp_dir();
}
END_TEST

START_TEST(test_bad_paths_and_sizes) {
    test_make_tmp_dir("ckpt");
    nb_params *ps = small_registry();
    expect_error_rc(nb_load(ps, test_tmp_path("missing")), "nb_load", "cannot open", "missing",
                    "No such file");
    expect_error_rc(nb_load(ps, test_tmp_dir), "nb_load", "is not a regular file");
    FILE *f = fopen(test_tmp_path("short"), "wb");
    fputs("abc", f);
    fclose(f);
    expect_error_rc(nb_load(ps, test_tmp_path("short")), "nb_load", "has 3 bytes, too short");
    /* a header size larger than the file, and one above the 100 MiB limit */
    f = fopen(test_tmp_path("huge"), "wb");
    fwrite("\xff\xff\xff\xff\xff\xff\xff\x7f{}", 1, 10, f);
    fclose(f);
    expect_error_rc(nb_load(ps, test_tmp_path("huge")), "nb_load", "header size 9223372036854775807",
                    "exceeds the file (2 bytes)");
    expect_error_rc(nb_load(NULL, "x"), "nb_load", "registry is NULL");
    expect_error_rc(nb_load(ps, NULL), "nb_load", "path is NULL");
    expect_error_rc(nb_save(NULL, "x"), "nb_save", "registry is NULL");
    expect_error_rc(nb_save(ps, NULL), "nb_save", "path is NULL");
    expect_error_rc(nb_save(ps, test_tmp_path("no/such/dir.safetensors")), "nb_save",
                    "cannot create a file next to", "no/such/dir.safetensors", "No such file");
    expect_untouched(ps);
    nb_params_free(ps);
    /* an expanded view can be saved but not loaded into (its elements alias) */
    nb_params *ex = nb_params_new();
    nb_scope_begin();
    nb_tensor *row = nb_from_data(NB_F32, NB_SHAPE(1, 3), (float[]){1, 2, 3});
    nb_params_add_buffer(ex, "e", nb_expand(row, NB_SHAPE(2, 3)));
    nb_scope_end();
    CK_OK(nb_save(ex, test_tmp_path("ex")));
    expect_error_rc(nb_load(ex, test_tmp_path("ex")), "nb_load", "registry tensor \"e\" is an "
                    "expanded view (stride 0)", "no tensor was changed");
    nb_params_free(ex);
    test_remove_tmp_dir();
}
END_TEST

/* ------------------------------------------------- many tensors: O(1) per name */
/* The registry and nb_load look names up in a hash index: the work per name
 * must not grow with the number of names. It is counted, not timed (the
 * index counts the slots it visits: nn/nn_internal.h), so the verdict is the
 * same on a loaded machine; make bench times the same phases (section 7). */
typedef struct {
    nn_index_work add, load, get; /* registering n names, nb_load, n nb_params_get */
} scale_work;

static nn_index_work work_since(nn_index_work before) {
    nn_index_work now = nn_index_work_done();
    return (nn_index_work){now.lookups - before.lookups, now.probes - before.probes,
                           now.moved - before.moved};
}

/* n empty tensors (shape (0), one storage) registered as "layers.<i>.w",
 * saved, then loaded back and looked up, the index's work counted in each
 * phase (this thread's counts: the phases run on it alone). */
static scale_work scale_run(int n) {
    scale_work w;
    char name[32];
    nb_params *ps = nb_params_new();
    nb_scope_begin();
    nb_tensor *e = nb_zeros(NB_F32, NB_SHAPE(0));
    int failed = 0;
    nn_index_work t0 = nn_index_work_done();
    for (int i = 0; i < n; i++) {
        snprintf(name, sizeof name, "layers.%d.w", i);
        failed += nb_params_add(ps, name, e) == NULL;
    }
    w.add = work_since(t0);
    nb_scope_end();
    ck_assert_msg(failed == 0, "%d of %d nb_params_add failed: %s", failed, n, nb_last_error());
    const char *path = test_tmp_path("scale.safetensors");
    CK_OK(nb_save(ps, path));
    t0 = nn_index_work_done();
    CK_OK(nb_load(ps, path));
    w.load = work_since(t0);
    t0 = nn_index_work_done();
    for (int i = n - 1; i >= 0; i--) {
        snprintf(name, sizeof name, "layers.%d.w", i);
        failed += nb_params_get(ps, name) == NULL;
    }
    w.get = work_since(t0);
    ck_assert_int_eq(failed, 0);
    nb_params_free(ps);
    return w;
}

/* One phase over n names: each name goes through the index `lookups` times,
 * one more at most (registering: 2, is it new, then insert it; nb_load: 3,
 * the header's duplicate check and insert, then the registry's match;
 * nb_params_get: 1), and a lookup visits fewer than 4 slots on average
 * (linear probing at a load of at most 1/2: about 1.5 for a name found, 2.5
 * for one absent). Growing the table by doubling reads the old tables (fewer
 * than 4 slots a name in all) and inserts their names again (fewer than 2 a
 * name, a few slots each): fewer than 12 slots a name. A scan of every name
 * instead visits n/2 slots a lookup (6,000 at n = 12,000), and a lookup that
 * bypasses the index leaves fewer lookups than names need. */
static void expect_constant_work(const char *phase, int n, nn_index_work w, int lookups,
                                 bool grows) {
    double per_name = (double)w.lookups / n;
    double per_lookup = w.lookups ? (double)w.probes / (double)w.lookups : 0;
    ck_assert_msg(per_name >= lookups && per_name <= lookups + 1, "%s %d names: %llu index "
                  "lookups (%.2f a name, expected %d to %d)", phase, n,
                  (unsigned long long)w.lookups, per_name, lookups, lookups + 1);
    ck_assert_msg(per_lookup < 4, "%s %d names: %llu slots visited by %llu lookups (%.1f a "
                  "lookup, expected fewer than 4: the work grows with the names)", phase, n,
                  (unsigned long long)w.probes, (unsigned long long)w.lookups, per_lookup);
    ck_assert_msg(grows ? w.moved < 12 * (uint64_t)n : w.moved == 0, "%s %d names: growing "
                  "the index visited %llu slots (%s)", phase, n, (unsigned long long)w.moved,
                  grows ? "expected fewer than 12 a name" : "expected no growth");
}

static void expect_scale(int n, scale_work w) {
    expect_constant_work("registering", n, w.add, 2, true);
    expect_constant_work("nb_load of", n, w.load, 3, true);
    expect_constant_work("nb_params_get of", n, w.get, 1, false);
}

/* 12,000 names first: a lookup that had become a scan fails there in a
 * fraction of a second; then 120,000 must cost the same per name. */
START_TEST(test_many_tensors_scale) {
    test_make_tmp_dir("ckpt");
    scale_work small = scale_run(12000);
    expect_scale(12000, small);
    scale_work large = scale_run(120000);
    expect_scale(120000, large);
#define PER(w, n) (double)((w).probes + (w).moved) / (n), (double)(w).lookups / (n)
    printf("checkpoint scale: index slots visited a name, growth included (lookups a name), "
           "12,000 -> 120,000 names: registering %.2f (%.0f) -> %.2f (%.0f), nb_load %.2f "
           "(%.0f) -> %.2f (%.0f), nb_params_get %.2f (%.0f) -> %.2f (%.0f)\n",
           PER(small.add, 12000), PER(large.add, 120000), PER(small.load, 12000),
           PER(large.load, 120000), PER(small.get, 12000), PER(large.get, 120000));
#undef PER
    fflush(stdout);
    test_remove_tmp_dir();
}
END_TEST

/* ------------------------------------------------- files that are not files */
static void on_alarm(int sig) { (void)sig; }

/* open() of a FIFO waits for a writer: nb_load must refuse it at once. An
 * alarm guards the test: without SA_RESTART, a blocked open() returns EINTR
 * after 10 s, and a regression fails on the message rather than hanging.
 * Only that hang meets it: the refusal takes microseconds, and an alarm that
 * found nb_load anywhere but in a blocked open() would change nothing. */
START_TEST(test_load_fifo_does_not_block) {
    test_make_tmp_dir("ckpt");
    nb_params *ps = small_registry();
    const char *fifo = test_tmp_path("fifo");
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    struct sigaction sa = {.sa_handler = on_alarm}, old;
    sigemptyset(&sa.sa_mask);
    ck_assert_int_eq(sigaction(SIGALRM, &sa, &old), 0);
    alarm(10);
    int rc = nb_load(ps, fifo);
    alarm(0);
    sigaction(SIGALRM, &old, NULL);
    expect_error_rc(rc, "nb_load", fifo, "is not a regular file");
    expect_error_rc(nb_load(ps, "/dev/null"), "nb_load", "\"/dev/null\" is not a regular file");
    expect_untouched(ps);
    nb_params_free(ps);
    test_remove_tmp_dir();
}
END_TEST

/* ------------------------------------------------- optimizer state values */
/* Every byte of every tensor of a registry (all contiguous here), in order. */
static unsigned char *registry_bytes(nb_params *ps, size_t *len) {
    int np = nb_params_count(ps), n = np + nb_params_buffer_count(ps);
    size_t total = 0;
    for (int pass = 0; pass < 2; pass++) {
        unsigned char *out = pass ? malloc(total ? total : 1) : NULL;
        size_t at = 0;
        for (int i = 0; i < n; i++) {
            nb_tensor *t = i < np ? nb_params_at(ps, i, NULL)
                                  : nb_params_buffer_at(ps, i - np, NULL);
            ck_assert(nb_is_contiguous(t));
            size_t k = (size_t)nb_numel(t) * (nb_dtype_of(t) == NB_F32 ? 4 : 8);
            if (out) memcpy(out + at, nb_data(t), k);
            at += k;
        }
        total = at;
        if (out) {
            *len = total;
            return out;
        }
    }
    return NULL;
}

static void expect_bytes_unchanged(nb_params *ps, const unsigned char *before, size_t len) {
    size_t now_len;
    unsigned char *now = registry_bytes(ps, &now_len);
    ck_assert_msg(now_len == len && memcmp(now, before, len) == 0,
                  "a refused load changed the registry");
    free(now);
}

/* One element of a state tensor, read or written as a double (i64 or f32). */
static double state_get(nb_params *st, const char *name, int64_t at) {
    nb_tensor *t = nb_params_get(st, name);
    CK_NN(t);
    return nb_dtype_of(t) == NB_I64 ? (double)((int64_t *)nb_data(t))[at]
                                    : (double)((float *)nb_data(t))[at];
}

static void state_set(nb_params *st, const char *name, int64_t at, int64_t i, double f) {
    nb_tensor *t = nb_params_get(st, name);
    CK_NN(t);
    if (nb_dtype_of(t) == NB_I64) ((int64_t *)nb_data(t))[at] = i;
    else ((float *)nb_data(t))[at] = (float)f;
}

typedef struct {
    const char *name; /* the state tensor, without the registry's prefix */
    int64_t at, i;    /* element; value for the i64 step */
    double f;         /* value for the f32 moments */
    const char *msg;  /* what the message says about it */
} bad_state;

/* Saves ps with one state value made bad (then restores it) and expects
 * nb_load to refuse the file and leave every byte of ps as it was. */
static void expect_state_refused(nb_params *ps, nb_params *st, const char *prefix,
                                 bad_state b) {
    char full[160];
    snprintf(full, sizeof full, "%s%s", prefix, b.name);
    int64_t old_i = 0;
    double old_f = state_get(st, b.name, b.at);
    if (nb_dtype_of(nb_params_get(st, b.name)) == NB_I64)
        old_i = ((int64_t *)nb_data(nb_params_get(st, b.name)))[b.at];
    state_set(st, b.name, b.at, b.i, b.f);
    const char *path = test_tmp_path("bad-state.safetensors");
    CK_OK(nb_save(ps, path));
    state_set(st, b.name, b.at, old_i, old_f);
    size_t len;
    unsigned char *before = registry_bytes(ps, &len);
    char quoted[192];
    snprintf(quoted, sizeof quoted, "tensor \"%s\" holds", full);
    expect_error_rc(nb_load(ps, path), "nb_load", path, quoted, b.msg, "no tensor was changed");
    expect_bytes_unchanged(ps, before, len);
    free(before);
}

#define STEP_MSG "an optimizer step count must be in [0, 9007199254740992]"

static const bad_state bad_adam[] = {
    {"l1.weight.step", 0, INT64_MAX, 0, "holds 9223372036854775807; " STEP_MSG},
    {"l1.weight.step", 0, -1, 0, "holds -1; " STEP_MSG},
    {"l2.bias.step", 0, INT64_MIN, 0, "holds -9223372036854775808; " STEP_MSG},
    {"l2.bias.step", 0, (INT64_C(1) << 53) + 1, 0, "holds 9007199254740993; " STEP_MSG},
    {"l1.weight.exp_avg_sq", 5, 0, -1.0, "holds -1 at element 5; exp_avg_sq"},
    {"l1.weight.exp_avg_sq", 0, 0, NAN, "at element 0; exp_avg_sq must be finite and >= 0"},
    {"l2.weight.exp_avg_sq", 7, 0, INFINITY, "holds inf at element 7"},
    {"l1.bias.exp_avg", 2, 0, NAN, "holds nan at element 2; exp_avg"},
    {"l2.weight.exp_avg", 0, 0, -INFINITY, "holds -inf at element 0; exp_avg must be finite"},
};

START_TEST(test_bad_optimizer_state_refused) {
    test_make_tmp_dir("ckpt");
    net n;
    net_init(&n, 0);
    for (int s = 0; s < 2; s++) net_step(&n, s);
    nb_params *st = nb_optim_state(n.opt);
    for (size_t i = 0; i < sizeof bad_adam / sizeof *bad_adam; i++)
        expect_state_refused(st, st, "", bad_adam[i]);
    /* the edges of what is accepted load: a step of 2^53, -0 in exp_avg_sq, a
     * large finite moment */
    state_set(st, "l1.weight.step", 0, INT64_C(1) << 53, 0);
    state_set(st, "l1.weight.exp_avg_sq", 1, 0, -0.0);
    state_set(st, "l1.weight.exp_avg", 1, 0, -1e30);
    const char *path = test_tmp_path("edge.safetensors");
    CK_OK(nb_save(st, path));
    state_set(st, "l1.weight.step", 0, 3, 0);
    CK_OK(nb_load(st, path));
    ck_assert(state_get(st, "l1.weight.step", 0) == 0x1p53);
    ck_assert(state_get(st, "l1.weight.exp_avg", 1) == -1e30f);
    /* SGD's momentum buffer */
    net sgd;
    net_init(&sgd, 2);
    net_step(&sgd, 0);
    expect_state_refused(nb_optim_state(sgd.opt), nb_optim_state(sgd.opt), "",
                         (bad_state){"l2.weight.momentum_buffer", 3, 0, INFINITY,
                                     "holds inf at element 3; momentum_buffer must be finite"});
    net_free(&sgd);
    /* the checks belong to the optimizer's tensors, not to names: a buffer of
     * the user's called "x.step" holds what it likes, and so do parameters */
    nb_params *mine = nb_params_new();
    nb_scope_begin();
    CK_NN(nb_params_add_buffer(mine, "x.step", nb_scalar(NB_I64, -1)));
    CK_NN(nb_params_add(mine, "x.exp_avg_sq", nb_full(NB_F32, NB_SHAPE(2), -INFINITY)));
    nb_scope_end();
    CK_OK(nb_save(mine, test_tmp_path("mine.safetensors")));
    CK_OK(nb_load(mine, test_tmp_path("mine.safetensors")));
    nb_params_free(mine);
    net_free(&n);
    test_remove_tmp_dir();
}
END_TEST

/* The model and "optim." + its state in one registry (as copy_task and the
 * bench save them): the checks travel with nb_params_add_all, and a refused
 * file changes neither the model nor the state. */
START_TEST(test_bad_optimizer_state_in_combined_registry) {
    test_make_tmp_dir("ckpt");
    net n;
    net_init(&n, 1);
    for (int s = 0; s < 2; s++) net_step(&n, s);
    nb_params *all = nb_params_new(), *outer = nb_params_new();
    CK_OK(nb_params_add_all(all, "", n.ps));
    CK_OK(nb_params_add_all(all, "optim.", nb_optim_state(n.opt)));
    nb_params *st = nb_optim_state(n.opt);
    expect_state_refused(all, st, "optim.", (bad_state){"l1.weight.step", 0, -1, 0,
                                                        "holds -1; " STEP_MSG});
    expect_state_refused(all, st, "optim.", (bad_state){"l2.bias.exp_avg_sq", 0, 0, -2.5,
                                                        "holds -2.5 at element 0"});
    /* copied again: a registry of registries */
    CK_OK(nb_params_add_all(outer, "run.", all));
    expect_state_refused(outer, st, "run.optim.", (bad_state){"l1.bias.exp_avg", 1, 0, NAN,
                                                              "holds nan at element 1"});
    /* a good combined file still loads */
    CK_OK(nb_save(all, test_tmp_path("good.safetensors")));
    CK_OK(nb_load(all, test_tmp_path("good.safetensors")));
    nb_params_free(outer);
    nb_params_free(all);
    net_free(&n);
    test_remove_tmp_dir();
}
END_TEST

/* ------------------------------------------------- names, modes, links, temporaries */
START_TEST(test_reserved_name_refused) {
    test_make_tmp_dir("ckpt");
    nb_params *ps = nb_params_new(), *src = nb_params_new();
    nb_scope_begin();
    nb_tensor *one = nb_ones(NB_F32, NB_SHAPE(1));
    expect_error(nb_params_add(ps, "__metadata__", one), "nb_params_add", "\"__metadata__\"",
                 "reserved by the safetensors format");
    expect_error(nb_params_add_buffer(ps, "__metadata__", one), "nb_params_add_buffer",
                 "\"__metadata__\"", "reserved by the safetensors format");
    CK_NN(nb_params_add(src, "metadata__", one));
    CK_NN(nb_params_add(ps, "__metadata__.w", one)); /* only the exact name is taken */
    CK_NN(nb_params_add_buffer(ps, "__METADATA__", one));
    nb_scope_end();
    expect_error_rc(nb_params_add_all(ps, "__", src), "nb_params_add_all", "\"__metadata__\"",
                    "reserved by the safetensors format");
    ck_assert_int_eq(nb_params_count(ps), 1);
    ck_assert_int_eq(nb_params_buffer_count(ps), 1);
    CK_OK(nb_params_add_all(ps, "_", src));
    CK_OK(nb_save(ps, test_tmp_path("names.safetensors")));
    CK_OK(nb_load(ps, test_tmp_path("names.safetensors")));
    nb_params_free(src);
    nb_params_free(ps);
    test_remove_tmp_dir();
}
END_TEST

static mode_t mode_of(const char *path) {
    struct stat st;
    ck_assert_int_eq(stat(path, &st), 0);
    return st.st_mode & 07777;
}

START_TEST(test_save_keeps_permissions) {
    test_make_tmp_dir("ckpt");
    nb_params *ps = small_registry();
    const char *path = test_tmp_path("perm.safetensors"), *fresh = test_tmp_path("fresh.safetensors");
    mode_t saved_umask = umask(022), got[5];
    int rc[5];
    rc[0] = nb_save(ps, path), got[0] = mode_of(path); /* new: 0666 & ~umask, as fopen */
    chmod(path, 0600);
    rc[1] = nb_save(ps, path), got[1] = mode_of(path);
    chmod(path, 0640);
    umask(077); /* the umask narrows new files only, not the bits a file has */
    rc[2] = nb_save(ps, path), got[2] = mode_of(path);
    rc[3] = nb_save(ps, fresh), got[3] = mode_of(fresh);
    chmod(path, 0444); /* read-only to its owner: replaced, still read-only */
    rc[4] = nb_save(ps, path), got[4] = mode_of(path);
    umask(saved_umask);
    const mode_t want[5] = {0644, 0600, 0640, 0600, 0444};
    for (int i = 0; i < 5; i++)
        ck_assert_msg(rc[i] == 0 && got[i] == want[i], "save %d: rc %d, mode %04o, want %04o",
                      i, rc[i], (unsigned)got[i], (unsigned)want[i]);
    CK_OK(nb_load(ps, path));
    nb_params_free(ps);
    test_remove_tmp_dir();
}
END_TEST

static void expect_link(const char *link, const char *target) {
    struct stat st;
    char buf[256];
    ck_assert_int_eq(lstat(link, &st), 0);
    ck_assert_msg(S_ISLNK(st.st_mode), "%s is no longer a symbolic link", link);
    ssize_t n = readlink(link, buf, sizeof buf - 1);
    ck_assert_int_gt(n, 0);
    buf[n] = 0;
    ck_assert_str_eq(buf, target);
}

static int entries_in(const char *d) {
    char cmd[200];
    snprintf(cmd, sizeof cmd, "exit $(ls -A '%s' | wc -l)", d);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Saving to a symbolic link writes the file it points to (through a chain of
 * links, into another directory, or a file the link names that does not
 * exist yet), and the link stays a link. */
START_TEST(test_save_through_symlink) {
    test_make_tmp_dir("ckpt");
    nb_params *ps = small_registry();
    const char *real = test_tmp_path("real.st"), *link = test_tmp_path("link.st");
    CK_OK(nb_save(ps, real));
    chmod(real, 0600);
    ck_assert_int_eq(symlink("real.st", link), 0);
    ck_assert_int_eq(symlink("link.st", test_tmp_path("chain.st")), 0);
    nb_scope_begin();
    ck_assert_int_eq(nb_copy_into(nb_params_get(ps, "a"), nb_scalar(NB_F32, 3.0)), 0);
    nb_scope_end();
    CK_OK(nb_save(ps, test_tmp_path("chain.st")));
    expect_link(link, "real.st");
    expect_link(test_tmp_path("chain.st"), "link.st");
    ck_assert_int_eq(mode_of(real), 0600);
    nb_params *q = small_registry();
    CK_OK(nb_load(q, real));
    ck_assert(((float *)nb_data(nb_params_get(q, "a")))[0] == 3.0f);
    /* into another directory, and a link whose file is still to be made */
    char sub[96];
    snprintf(sub, sizeof sub, "%s/sub", test_tmp_dir);
    ck_assert_int_eq(mkdir(sub, 0700), 0);
    ck_assert_int_eq(symlink("sub/made.st", test_tmp_path("dangling.st")), 0);
    CK_OK(nb_save(ps, test_tmp_path("dangling.st")));
    expect_link(test_tmp_path("dangling.st"), "sub/made.st");
    CK_OK(nb_load(q, test_tmp_path("sub/made.st")));
    ck_assert_int_eq(entries_in(sub), 1); /* no temporary left in either directory */
    ck_assert_int_eq(entries_in(test_tmp_dir), 5);
    /* a link into a directory that does not exist: the message names both */
    ck_assert_int_eq(symlink("nodir/x.st", test_tmp_path("nowhere.st")), 0);
    expect_error_rc(nb_save(ps, test_tmp_path("nowhere.st")), "nb_save", "cannot create a file next "
                    "to", "nowhere.st\" (a link to \"", "nodir/x.st\")", "No such file");
    /* a loop of links is an error, not a hang */
    ck_assert_int_eq(symlink("loop2", test_tmp_path("loop1")), 0);
    ck_assert_int_eq(symlink("loop1", test_tmp_path("loop2")), 0);
    expect_error_rc(nb_save(ps, test_tmp_path("loop1")), "nb_save", "cannot write", "loop1",
                    "Too many levels of symbolic links");
    nb_params_free(q);
    nb_params_free(ps);
    test_remove_tmp_dir();
}
END_TEST

static void touch(const char *name) {
    FILE *f = fopen(test_tmp_path(name), "wb");
    ck_assert_ptr_nonnull(f);
    fclose(f);
}

static bool present(const char *name) {
    struct stat st;
    return lstat(test_tmp_path(name), &st) == 0;
}

/* A save killed with SIGKILL leaves its temporary: the next save into that
 * directory removes it, once its process is gone, and only then. */
START_TEST(test_stale_temporaries_removed) {
    test_make_tmp_dir("ckpt");
    pid_t dead = fork();
    ck_assert_int_ge(dead, 0);
    if (dead == 0) _exit(0);
    ck_assert_int_eq(waitpid(dead, NULL, 0), dead); /* exited and reaped: no such process */
    char stale[64], live[2][64], other[5][64];
    snprintf(stale, sizeof stale, ".nabla-tmp-%ld-0", (long)dead);
    snprintf(live[0], sizeof live[0], ".nabla-tmp-%ld-999", (long)getpid());
    snprintf(live[1], sizeof live[1], ".nabla-tmp-%ld-3", (long)getppid()); /* another's */
    /* names that are not exactly a temporary's stay too */
    snprintf(other[0], sizeof other[0], "x.nabla-tmp-%ld-0", (long)dead);
    snprintf(other[1], sizeof other[1], ".nabla-tmp-%ld", (long)dead);
    snprintf(other[2], sizeof other[2], ".nabla-tmp-%ld-1x", (long)dead);
    snprintf(other[3], sizeof other[3], ".nabla-tmp-0-1");
    snprintf(other[4], sizeof other[4], ".nabla-tmp--%ld-1", (long)dead);
    touch(stale);
    touch(live[0]);
    touch(live[1]);
    for (int i = 0; i < 5; i++) touch(other[i]);
    char stale_dir[64];
    snprintf(stale_dir, sizeof stale_dir, ".nabla-tmp-%ld-7", (long)dead);
    ck_assert_int_eq(mkdir(test_tmp_path(stale_dir), 0700), 0); /* not a file: left alone */
    nb_params *ps = small_registry();
    CK_OK(nb_save(ps, test_tmp_path("model.safetensors")));
    ck_assert_msg(!present(stale), "%s (pid %ld has exited) is still there", stale, (long)dead);
    for (int i = 0; i < 2; i++)
        ck_assert_msg(present(live[i]), "%s (a live process's) was removed", live[i]);
    for (int i = 0; i < 5; i++) ck_assert_msg(present(other[i]), "%s was removed", other[i]);
    ck_assert(present(stale_dir));
    nb_params_free(ps);
    test_remove_tmp_dir();
}
END_TEST

/* The pid in a temporary's name may be a new process's by now (pids are
 * reused): a temporary with bytes whose lock nobody holds is a killed
 * save's, whatever runs under its pid; one whose lock is held is a live
 * save's, whatever its name says; an empty one of a live pid may be a save
 * between its open and its lock, and stays. */
START_TEST(test_stale_temporaries_and_reused_pids) {
    test_make_tmp_dir("ckpt");
    pid_t dead = fork();
    ck_assert_int_ge(dead, 0);
    if (dead == 0) _exit(0);
    ck_assert_int_eq(waitpid(dead, NULL, 0), dead);
    char reused[64], held[64], empty[64];
    snprintf(reused, sizeof reused, ".nabla-tmp-%ld-5", (long)getppid()); /* a live pid */
    snprintf(held, sizeof held, ".nabla-tmp-%ld-6", (long)dead);
    snprintf(empty, sizeof empty, ".nabla-tmp-%ld-7", (long)getppid());
    const char *names[2] = {reused, held};
    for (int i = 0; i < 2; i++) {
        FILE *f = fopen(test_tmp_path(names[i]), "wb");
        ck_assert_ptr_nonnull(f);
        fputs("a killed save's bytes", f);
        fclose(f);
    }
    touch(empty);
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    pid_t holder = fork(); /* holds the lock of `held` as a live save would */
    ck_assert_int_ge(holder, 0);
    if (holder == 0) {
        int fd = open(test_tmp_path(held), O_RDONLY);
        if (fd < 0 || flock(fd, LOCK_EX) != 0 || write(fds[1], "x", 1) != 1) _exit(1);
        for (;;) pause();
    }
    char c;
    ck_assert_int_eq(read(fds[0], &c, 1), 1);
    nb_params *ps = small_registry();
    CK_OK(nb_save(ps, test_tmp_path("model.safetensors")));
    ck_assert_msg(!present(reused), "%s (bytes, no lock, pid %ld alive) is still there", reused,
                  (long)getppid());
    ck_assert_msg(present(held), "%s (locked by a live process) was removed", held);
    ck_assert_msg(present(empty), "%s (empty, pid alive) was removed", empty);
    kill(holder, SIGKILL);
    ck_assert_int_eq(waitpid(holder, NULL, 0), holder);
    CK_OK(nb_load(ps, test_tmp_path("model.safetensors")));
    ck_assert_msg(!present(held), "%s (its locker is gone) is still there", held);
    ck_assert(present(empty));
    close(fds[0]), close(fds[1]);
    nb_params_free(ps);
    test_remove_tmp_dir();
}
END_TEST

/* Files named as a save's temporary in dir: ".nabla-tmp-..." */
static int temps_in(const char *dir) {
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) n += !strncmp(e->d_name, ".nabla-tmp-", 11);
    closedir(d);
    return n;
}

/* A process that dies while it writes a temporary: where the file system
 * has O_TMPFILE the file never had a name, so nothing is left; a named one
 * (forced here, as on a file system without O_TMPFILE) stays while its
 * process lives, even through a save and a load beside it, and the next
 * load after the kill removes it. */
START_TEST(test_killed_writer_leaves_no_temporary) {
    for (int named = 0; named < 2; named++) {
        int before = nn_temp_force_named(named);
        test_make_tmp_dir("ckpt");
        const char *path = test_tmp_path("model.st");
        nb_params *ps = small_registry();
        CK_OK(nb_save(ps, path));
        int fds[2];
        ck_assert_int_eq(pipe(fds), 0);
        pid_t child = fork();
        ck_assert_int_ge(child, 0);
        if (child == 0) { /* a save that stops halfway and waits to be killed */
            nn_target t = {0};
            nn_temp tmp;
            char unnamed = 2;
            if (nn_resolve(path, &t) == 0 && nn_temp_open(&t, &tmp) == 0 &&
                write(tmp.fd, "half a checkpoint", 17) == 17)
                unnamed = tmp.unnamed;
            if (write(fds[1], &unnamed, 1) != 1) _exit(1);
            for (;;) pause();
        }
        char unnamed = 2;
        ck_assert_int_eq(read(fds[0], &unnamed, 1), 1);
        close(fds[0]), close(fds[1]);
        ck_assert_msg(unnamed != 2, "the child could not open its temporary");
        if (named) ck_assert_int_eq(unnamed, 0);
        int live = unnamed ? 0 : 1; /* what the live writer shows in the folder */
        ck_assert_int_eq(temps_in(test_tmp_dir), live);
        CK_OK(nb_save(ps, path)); /* a live save's temporary is not another's to remove */
        CK_OK(nb_load(ps, path));
        ck_assert_int_eq(temps_in(test_tmp_dir), live);
        kill(child, SIGKILL);
        ck_assert_int_eq(waitpid(child, NULL, 0), child);
        ck_assert_int_eq(temps_in(test_tmp_dir), live); /* named: left by the kill */
        CK_OK(nb_load(ps, path));
        ck_assert_int_eq(temps_in(test_tmp_dir), 0); /* ...and removed by the next load */
        nb_params_free(ps);
        test_remove_tmp_dir();
        nn_temp_force_named(before);
    }
}
END_TEST

/* Saves SIGKILLed at various moments of a loop of saves (4 MiB each), with
 * unnamed and with named temporaries: after the next load, or the next
 * save, no temporary is left, and the checkpoint loads whole (one save's
 * values, never a mixture). Where the kills land does not matter. */
START_TEST(test_killed_saves_leave_no_temporaries) {
    enum { N = 1 << 20 };
    for (int named = 0; named < 2; named++) {
        int before = nn_temp_force_named(named);
        test_make_tmp_dir("ckpt");
        const char *path = test_tmp_path("big.safetensors");
        nb_params *ps = nb_params_new();
        nb_scope_begin();
        nb_tensor *p = nb_params_add(ps, "w", nb_full(NB_F32, NB_SHAPE(N), 1.0));
        nb_scope_end();
        CK_NN(p);
        CK_OK(nb_save(ps, path));
        for (int round = 0; round < 6; round++) {
            pid_t child = fork();
            ck_assert_int_ge(child, 0);
            if (child == 0) {
                for (int k = 2;; k++) {
                    nb_scope_begin();
                    nb_copy_into(p, nb_scalar(NB_F32, (double)k));
                    nb_scope_end();
                    if (nb_save(ps, path) != 0) _exit(1);
                }
            }
            nanosleep(&(struct timespec){0, 2000000L * round}, NULL); /* 0, 2, ... 10 ms */
            kill(child, SIGKILL);
            ck_assert_int_eq(waitpid(child, NULL, 0), child);
            if (round % 2) CK_OK(nb_save(ps, test_tmp_path("other.safetensors")));
            nb_params *q = nb_params_new();
            nb_scope_begin();
            nb_tensor *t = nb_params_add(q, "w", nb_zeros(NB_F32, NB_SHAPE(N)));
            nb_scope_end();
            ck_assert_msg(nb_load(q, path) == 0, "round %d (%s temporaries): %s", round,
                          named ? "named" : "unnamed", nb_last_error());
            ck_assert_msg(temps_in(test_tmp_dir) == 0, "round %d (%s temporaries): %d "
                          "temporaries left after the next %s", round,
                          named ? "named" : "unnamed", temps_in(test_tmp_dir),
                          round % 2 ? "save" : "load");
            const float *v = nb_data(t);
            int64_t same = 0;
            for (int64_t i = 0; i < N; i++) same += v[i] == v[0];
            ck_assert_msg(same == N && v[0] >= 1.0f, "round %d: a mixed file", round);
            nb_params_free(q);
        }
        nb_params_free(ps);
        test_remove_tmp_dir();
        nn_temp_force_named(before);
    }
}
END_TEST

/* A name of 253 bytes (NAME_MAX is 255): the temporary's name does not grow with it. */
/* Registry entries that share memory take their file values in one place:
 * a tensor registered twice loads when the file holds the same values under
 * both names (a tied pair saved twice), and is refused, changing nothing,
 * when they differ; overlapping views are refused; views that interleave
 * without meeting load as any two tensors. */
static double first_value(nb_tensor *t) {
    double v[64];
    ck_assert_int_eq(nb_copy_to_f64(t, v), 0);
    return v[0];
}

START_TEST(test_load_into_shared_memory) {
    test_make_tmp_dir("ckpt");
    const char *same = test_tmp_path("same.safetensors"), *diff = test_tmp_path("diff.safetensors");
    nb_params *two = nb_params_new();
    nb_scope_begin(); /* the registry keeps handles of its own */
    ck_assert_ptr_nonnull(nb_params_add(two, "a", nb_full(NB_F32, NB_SHAPE(2, 3), 1.0)));
    ck_assert_ptr_nonnull(nb_params_add(two, "b", nb_full(NB_F32, NB_SHAPE(2, 3), 2.0)));
    nb_scope_end();
    ck_assert_int_eq(nb_save(two, diff), 0);

    nb_tensor *w = nb_full(NB_F32, NB_SHAPE(2, 3), 5.0);
    nb_params *tied = nb_params_new();
    ck_assert_ptr_nonnull(nb_params_add(tied, "a", w));
    ck_assert_ptr_nonnull(nb_params_add(tied, "b", w));
    ck_assert_int_eq(nb_save(tied, same), 0);
    nb_tensor *zero = nb_zeros(NB_F32, NB_SHAPE(1));
    nb_copy_into(w, zero);
    nb_free(zero);
    ck_assert_int_eq(nb_load(tied, same), 0); /* the same values twice: fine */
    ck_assert_double_eq(first_value(w), 5.0);
    expect_error_rc(nb_load(tied, diff), "nb_load", "registry tensors \"a\" and \"b\" share "
                    "memory and the file holds different values for them, so one would overwrite "
                    "the other", "no tensor was changed");
    ck_assert_double_eq(first_value(w), 5.0);

    nb_tensor *buf = nb_zeros(NB_F32, NB_SHAPE(3, 3));
    nb_params *rows = nb_params_new(), *cols = nb_params_new();
    nb_scope_begin(); /* rows 0..1 and 1..2: row 1 in both */
    ck_assert_ptr_nonnull(nb_params_add(rows, "a", nb_narrow(buf, 0, 0, 2)));
    ck_assert_ptr_nonnull(nb_params_add(rows, "b", nb_narrow(buf, 0, 1, 2)));
    nb_scope_end();
    expect_error_rc(nb_load(rows, diff), "nb_load", "registry tensors \"a\" and \"b\" share "
                    "memory, so one would overwrite the other");
    nb_tensor *big = nb_zeros(NB_F32, NB_SHAPE(4, 3));
    nb_scope_begin(); /* rows 0 and 2 of a (4,3) buffer, as (2,3): interleaved with rows 1, 3 */
    nb_tensor *even = nb_select(nb_view(big, NB_SHAPE(2, 2, 3)), 1, 0);
    nb_tensor *odd = nb_select(nb_view(big, NB_SHAPE(2, 2, 3)), 1, 1);
    ck_assert_ptr_nonnull(nb_params_add(cols, "a", even));
    ck_assert_ptr_nonnull(nb_params_add(cols, "b", odd));
    nb_scope_end();
    ck_assert_int_eq(nb_load(cols, diff), 0);
    double v[12];
    ck_assert_int_eq(nb_copy_to_f64(big, v), 0);
    for (int i = 0; i < 12; i++) ck_assert_double_eq(v[i], i / 3 % 2 ? 2.0 : 1.0);
    nb_free(big);
    nb_free(buf);
    nb_free(w);
    nb_params_free(two);
    nb_params_free(tied);
    nb_params_free(rows);
    nb_params_free(cols);
    test_remove_tmp_dir();
}
END_TEST

START_TEST(test_long_file_name) {
    test_make_tmp_dir("ckpt");
    char name[254], path[400];
    memset(name, 'a', 250);
    memcpy(name + 250, ".st", 4);
    snprintf(path, sizeof path, "%s/%s", test_tmp_dir, name);
    nb_params *ps = small_registry();
    CK_OK(nb_save(ps, path));
    CK_OK(nb_save(ps, path)); /* and over itself */
    CK_OK(nb_load(ps, path));
    ck_assert_int_eq(entries_in(test_tmp_dir), 1);
    nb_params_free(ps);
    test_remove_tmp_dir();
}
END_TEST

Suite *suite_checkpoint(void) {
    Suite *s = suite_create("checkpoint");
    TCase *tc = tcase_create("checkpoint");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_torch_file_loads_into_nabla);
    tcase_add_test(tc, test_nabla_file_loads_into_torch);
    tcase_add_test(tc, test_every_dtype_both_ways);
    tcase_add_test(tc, test_round_trip_views_f64_and_empty);
    tcase_add_test(tc, test_save_replaces_atomically);
    tcase_add_test(tc, test_buffers_and_add_all);
    tcase_add_test(tc, test_resume_is_exact);
    tcase_add_test(tc, test_bad_files_change_nothing);
    tcase_add_test(tc, test_bad_paths_and_sizes);
    tcase_add_test(tc, test_load_fifo_does_not_block);
    tcase_add_test(tc, test_bad_optimizer_state_refused);
    tcase_add_test(tc, test_bad_optimizer_state_in_combined_registry);
    tcase_add_test(tc, test_reserved_name_refused);
    tcase_add_test(tc, test_save_keeps_permissions);
    tcase_add_test(tc, test_save_through_symlink);
    tcase_add_test(tc, test_stale_temporaries_removed);
    tcase_add_test(tc, test_stale_temporaries_and_reused_pids);
    tcase_add_test(tc, test_killed_writer_leaves_no_temporary);
    tcase_add_test(tc, test_killed_saves_leave_no_temporaries);
    tcase_add_test(tc, test_long_file_name);
    tcase_add_test(tc, test_load_into_shared_memory);
    suite_add_tcase(s, tc);
    /* alone: 12,000 then 120,000 names, their work counted */
    TCase *scale = tcase_create("scale");
    tcase_set_timeout(scale, 300);
    tcase_add_test(scale, test_many_tensors_scale);
    suite_add_tcase(s, scale);
    return s;
}
