/* test_checkpoint.c: nb_save / nb_load (safetensors), registry buffers and
 * nb_params_add_all, optimizer state for exact resumption.
 * PyTorch side: tests/fixtures/gen_checkpoint.py (files written by PyTorch
 * load into nabla and give PyTorch's output; the file nabla writes is the
 * one PyTorch read, byte for byte). Then every way a file can be wrong. */
#include "test_util.h"

#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CK_OK(expr) ck_assert_msg((expr) == 0, "%s", nb_last_error() ? nb_last_error() : "?")
#define CK_NN(t) ck_assert_msg((t) != NULL, "%s", nb_last_error() ? nb_last_error() : "?")

static const char *FX = "checkpoint.txt";

static char dir[64];

static void make_dir(void) {
    snprintf(dir, sizeof dir, "/tmp/nabla-ckpt-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
}

static void remove_dir(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}

static const char *tmp_path(const char *name) {
    static char path[4][128];
    static int k;
    k = (k + 1) % 4;
    snprintf(path[k], sizeof path[k], "%s/%s", dir, name);
    return path[k];
}

static const char *fixture_path(const char *name) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", NB_FIXTURE_DIR, name);
    return path;
}

static unsigned char *slurp(const char *path, long *n) {
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    *n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)*n + 1);
    ck_assert_int_eq((long)fread(b, 1, (size_t)*n, f), *n);
    fclose(f);
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
    make_dir();
    const char *mine = tmp_path("mha.safetensors");
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
    remove_dir();
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
    make_dir();
    CK_OK(nb_save(ps, tmp_path("dt.safetensors")));
    expect_same_bytes(tmp_path("dt.safetensors"), fixture_path("dtypes_torch.safetensors"));
    remove_dir();
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
    make_dir();
    CK_OK(nb_save(a, tmp_path("a.safetensors")));
    CK_OK(nb_load(b, tmp_path("a.safetensors")));
    /* the view wrote through to the tensor it views */
    expect_equal(w2, w);
    expect_equal(nb_params_get(b, "layer.bias"), nb_params_get(a, "layer.bias"));
    expect_equal(nb_params_get(b, "steps"), nb_params_get(a, "steps"));
    /* no temporary file is left next to the checkpoint */
    char cmd[160];
    snprintf(cmd, sizeof cmd, "test $(ls -A '%s' | wc -l) -eq 1", dir);
    ck_assert_int_eq(system(cmd), 0);
    nb_scope_end();
    remove_dir();
    nb_params_free(a);
    nb_params_free(b);
}
END_TEST

/* Saving over a checkpoint replaces it whole: a reader that opened the old
 * file keeps reading the old bytes, and a save killed at any moment leaves
 * either the old file or the new one, never a mixture. */
START_TEST(test_save_replaces_atomically) {
    make_dir();
    const char *path = tmp_path("big.safetensors");
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
    float v;
    ck_assert_int_eq(fseek(old, -4, SEEK_END), 0);
    ck_assert_int_eq(fread(&v, 4, 1, old), 1);
    ck_assert(v == 1.0f); /* the first file, still open, was never written to */
    fclose(old);
    nb_params_free(ps);
    remove_dir();
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
    make_dir();
    for (int kind = 0; kind < 3; kind++) {
        net straight, first, second;
        net_init(&straight, kind);
        for (int s = 0; s < 8; s++) net_step(&straight, s);

        net_init(&first, kind);
        for (int s = 0; s < 4; s++) net_step(&first, s);
        CK_OK(nb_save(first.ps, tmp_path("model.safetensors")));
        CK_OK(nb_save(nb_optim_state(first.opt), tmp_path("optim.safetensors")));
        net_free(&first);

        net_init(&second, kind);
        CK_OK(nb_load(second.ps, tmp_path("model.safetensors")));
        CK_OK(nb_load(nb_optim_state(second.opt), tmp_path("optim.safetensors")));
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
    CK_OK(nb_save(st, tmp_path("adam.safetensors")));
    net sgd;
    net_init(&sgd, 2);
    expect_error_rc(nb_load(nb_optim_state(sgd.opt), tmp_path("adam.safetensors")), "nb_load",
                    "no tensor \"l1.weight.momentum_buffer\" in the file");
    net_free(&sgd);
    net_free(&n);
    remove_dir();
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

/* A file with this header text and data_len bytes of 0x3f (1.0f pieces). */
static const char *write_file(const char *name, const char *header, size_t data_len) {
    const char *path = tmp_path(name);
    FILE *f = fopen(path, "wb");
    uint64_t n = strlen(header);
    unsigned char len[8];
    for (int i = 0; i < 8; i++) len[i] = (unsigned char)(n >> (8 * i));
    fwrite(len, 1, 8, f);
    fwrite(header, 1, n, f);
    for (size_t i = 0; i < data_len; i++) fputc(0x3f, f);
    fclose(f);
    return path;
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
    {"{" GOOD_A "," GOOD_B, 12, "invalid safetensors header", "expected '}'"},
    {"[]", 0, "invalid safetensors header", "expected '{'"},
    {"{" GOOD_A "," GOOD_A "," GOOD_B "}", 12, "tensor \"a\" appears twice", NULL},
    {"{\"a\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]}," GOOD_B "}", 8,
     "tensor \"a\"", "unsupported dtype \"F16\""},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}}", 8,
     "tensor \"a\"", "overflows"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999],\"data_offsets\":[0,8]}}", 8,
     "larger than 2^63-1", NULL},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8,
     "expected a non-negative integer", NULL},
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
    {"{" GOOD_A "," GOOD_B "} x", 12, "bytes after its JSON object", NULL},
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
    make_dir();
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
    nb_params_free(ps);
    remove_dir();
}
END_TEST

START_TEST(test_bad_paths_and_sizes) {
    make_dir();
    nb_params *ps = small_registry();
    expect_error_rc(nb_load(ps, tmp_path("missing")), "nb_load", "cannot open", "missing",
                    "No such file");
    expect_error_rc(nb_load(ps, dir), "nb_load", "is not a regular file");
    FILE *f = fopen(tmp_path("short"), "wb");
    fputs("abc", f);
    fclose(f);
    expect_error_rc(nb_load(ps, tmp_path("short")), "nb_load", "has 3 bytes, too short");
    /* a header size larger than the file, and one above the 100 MiB limit */
    f = fopen(tmp_path("huge"), "wb");
    fwrite("\xff\xff\xff\xff\xff\xff\xff\x7f{}", 1, 10, f);
    fclose(f);
    expect_error_rc(nb_load(ps, tmp_path("huge")), "nb_load", "header size 9223372036854775807",
                    "exceeds the file (2 bytes)");
    expect_error_rc(nb_load(NULL, "x"), "nb_load", "registry is NULL");
    expect_error_rc(nb_load(ps, NULL), "nb_load", "path is NULL");
    expect_error_rc(nb_save(NULL, "x"), "nb_save", "registry is NULL");
    expect_error_rc(nb_save(ps, NULL), "nb_save", "path is NULL");
    expect_error_rc(nb_save(ps, tmp_path("no/such/dir.safetensors")), "nb_save",
                    "cannot create a file next to", "no/such/dir.safetensors", "No such file");
    expect_untouched(ps);
    nb_params_free(ps);
    /* an expanded view can be saved but not loaded into (its elements alias) */
    nb_params *ex = nb_params_new();
    nb_scope_begin();
    nb_tensor *row = nb_from_data(NB_F32, NB_SHAPE(1, 3), (float[]){1, 2, 3});
    nb_params_add_buffer(ex, "e", nb_expand(row, NB_SHAPE(2, 3)));
    nb_scope_end();
    CK_OK(nb_save(ex, tmp_path("ex")));
    expect_error_rc(nb_load(ex, tmp_path("ex")), "nb_load", "registry tensor \"e\" is an "
                    "expanded view (stride 0)", "no tensor was changed");
    nb_params_free(ex);
    remove_dir();
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
    suite_add_tcase(s, tc);
    return s;
}
