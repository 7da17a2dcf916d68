/* fuzz_gpt.c: libFuzzer target for the GPT checkpoints of llm.c and Hugging
 * Face (nn/formats/gpt_io.c: nb_gpt_load_llmc, nb_gpt_load_hf, the saves,
 * nb_gpt_config_of_file) and the safetensors header parser under them.
 *
 * Each input is written to a file (as it is, or for "J<json>\0<data>" as a
 * safetensors file with the header size computed, as fuzz_load does) and
 * loaded with both loaders into two tiny GPTs (vocab 5, block 2, 1 layer,
 * 1 head, n_embd 4): A tied f32, B untied f64, each reset to its own values
 * first. Checked:
 * - a failed load returns -1, changes no parameter (bit for bit) and leaves
 *   a message that starts with the loader's name;
 * - a successful llm.c load put the file's floats (llm.c's documented
 *   layout, read here independently) in every parameter (B: converted to
 *   f64, lm_head a copy of wte);
 * - a successful load then saves (A: in the format it came in; B: Hugging
 *   Face, as llm.c's format has no untied lm_head), and loading that file
 *   into the reset model gives the same bits;
 * - nb_gpt_config_of_file agrees with the loads: a file it describes with
 *   A's (B's) config loads into A (B), and a file that loads has the config
 *   of the model it loaded into (HF: but for tie_weights);
 * - nb_load_tokens reads the same file as llm.c's token file or as bytes
 *   exactly (check_tokens), or refuses it naming itself;
 * - no tensor object leaks (nb_live_tensors() the same after every input).
 * Any violation aborts, which libFuzzer reports as a crash.
 *
 * NABLA_FUZZ_GPT_SEEDS=<dir> makes the first run write the seed corpus
 * (fuzz/corpus/gpt: valid files of both formats and a few broken ones) into
 * <dir> and exit. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../nabla.h"
#include "fuzz_files.h"

#define CHECK(cond, ...)                                                          \
    do {                                                                          \
        if (!(cond)) {                                                            \
            fprintf(stderr, "fuzz_gpt: check failed: %s: ", #cond);               \
            fprintf(stderr, __VA_ARGS__);                                         \
            fprintf(stderr, "\n");                                                \
            abort();                                                              \
        }                                                                         \
    } while (0)

typedef struct {
    const char *label;
    nb_GPT m;
    nb_params *ps;
    unsigned char *reset; /* every parameter's bytes at start, registration order */
    size_t nbytes;
} model;

static model A, B;
static int64_t live_baseline;
static char path_in[256], path_out[256];
static bool verbose;

static const nb_GPTConfig CFG_A = {.vocab_size = 5, .block_size = 2, .n_layer = 1, .n_head = 1,
                                   .n_embd = 4, .dropout = 0.0, .bias = true,
                                   .tie_weights = true};

/* ----------------------------------------------------------------- models */
static size_t esize(nb_tensor *t) { return nb_dtype_of(t) == NB_F64 ? 8 : 4; }

static void snapshot(const model *x, unsigned char *out) {
    for (int i = 0; i < nb_params_count(x->ps); i++) {
        nb_tensor *t = nb_params_at(x->ps, i, NULL);
        size_t k = (size_t)nb_numel(t) * esize(t);
        memcpy(out, nb_data(t), k);
        out += k;
    }
}

static void reset(const model *x) {
    const unsigned char *p = x->reset;
    for (int i = 0; i < nb_params_count(x->ps); i++) {
        nb_tensor *t = nb_params_at(x->ps, i, NULL);
        size_t k = (size_t)nb_numel(t) * esize(t);
        memcpy(nb_data(t), p, k);
        p += k;
    }
}

static void model_make(model *x, const char *label, nb_GPTConfig cfg, nb_dtype dt, uint64_t seed) {
    nb_rng rng;
    nb_rng_seed(&rng, seed);
    nb_set_default_dtype(dt);
    x->label = label;
    x->ps = nb_params_new();
    CHECK(x->ps && nb_gpt_init(&x->m, x->ps, &cfg, &rng) == 0, "init: %s", nb_last_error());
    nb_set_default_dtype(NB_F32);
    x->nbytes = 0;
    for (int i = 0; i < nb_params_count(x->ps); i++) {
        nb_tensor *t = nb_params_at(x->ps, i, NULL);
        /* biases and norms start at 0 and 1: make every value distinct */
        for (int64_t k = 0; k < nb_numel(t); k++) {
            double v = 0.001 * (double)(i * 1000 + k) + 0.5;
            if (dt == NB_F32) ((float *)nb_data(t))[k] = (float)v;
            else ((double *)nb_data(t))[k] = v;
        }
        x->nbytes += (size_t)nb_numel(t) * esize(t);
    }
    x->reset = malloc(x->nbytes);
    CHECK(x->reset != NULL, "out of memory");
    snapshot(x, x->reset);
}

/* ----------------------------------------------- llm.c, read independently */
static int32_t rd32(const uint8_t *p) {
    return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                     (uint32_t)p[3] << 24);
}

static float rdf(const uint8_t *p) {
    uint32_t u = (uint32_t)rd32(p);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Parameter element k holds file float f: the same bits in f32, (double)f in f64. */
static void expect_float(const model *x, const char *name, int64_t k, float f) {
    nb_tensor *t = nb_params_get(x->ps, name);
    CHECK(t != NULL, "no %s", name);
    if (nb_dtype_of(t) == NB_F32) {
        CHECK(!memcmp((float *)nb_data(t) + k, &f, 4), "%s: %s[%lld] is not the file's float",
              x->label, name, (long long)k);
    } else {
        double d = (double)f;
        CHECK(!memcmp((double *)nb_data(t) + k, &d, 8), "%s: %s[%lld] is not the file's float",
              x->label, name, (long long)k);
    }
}

/* train_gpt2.c's layout: header of 256 int32, then wte (Vp, C), wpe, the 12
 * per-layer tensors stacked over layers, ln_f weight and bias. */
static void check_llmc_values(const model *x, const uint8_t *d, size_t n) {
    static const struct {
        const char *name;
        int c, cc; /* per layer: c*C + cc*C*C elements */
    } layer[12] = {{"ln_1.weight", 1, 0}, {"ln_1.bias", 1, 0}, {"attn.c_attn.weight", 0, 3},
                   {"attn.c_attn.bias", 3, 0}, {"attn.c_proj.weight", 0, 1},
                   {"attn.c_proj.bias", 1, 0}, {"ln_2.weight", 1, 0}, {"ln_2.bias", 1, 0},
                   {"mlp.c_fc.weight", 0, 4}, {"mlp.c_fc.bias", 4, 0},
                   {"mlp.c_proj.weight", 0, 4}, {"mlp.c_proj.bias", 1, 0}};
    CHECK(n >= 1024, "accepted %zu bytes", n);
    int64_t T = rd32(d + 8), V = rd32(d + 12), L = rd32(d + 16), C = rd32(d + 24), Vp = rd32(d + 28);
    const nb_GPTConfig *c = &x->m.cfg;
    CHECK(rd32(d) == 20240326 && rd32(d + 4) == 3 && T == c->block_size && V == c->vocab_size &&
          L == c->n_layer && rd32(d + 20) == c->n_head && C == c->n_embd && Vp >= V,
          "accepted a header that does not fit");
    int64_t per_layer = 0;
    for (int k = 0; k < 12; k++) per_layer += layer[k].c * C + layer[k].cc * C * C;
    size_t want = 1024 + 4 * (size_t)(Vp * C + T * C + L * per_layer + 2 * C);
    CHECK(n == want, "accepted %zu bytes, the layout needs %zu", n, want);
    const uint8_t *p = d + 1024;
    for (int64_t k = 0; k < V * C; k++) {
        expect_float(x, "transformer.wte.weight", k, rdf(p + 4 * k));
        if (!c->tie_weights) expect_float(x, "lm_head.weight", k, rdf(p + 4 * k));
    }
    p += 4 * Vp * C;
    for (int64_t k = 0; k < T * C; k++) expect_float(x, "transformer.wpe.weight", k, rdf(p + 4 * k));
    p += 4 * T * C;
    char name[96];
    for (int k = 0; k < 12; k++) {
        int64_t per = layer[k].c * C + layer[k].cc * C * C;
        for (int64_t l = 0; l < L; l++) {
            snprintf(name, sizeof name, "transformer.h.%lld.%s", (long long)l, layer[k].name);
            for (int64_t e = 0; e < per; e++) expect_float(x, name, e, rdf(p + 4 * e));
            p += 4 * per;
        }
    }
    for (int64_t k = 0; k < C; k++) expect_float(x, "transformer.ln_f.weight", k, rdf(p + 4 * k));
    for (int64_t k = 0; k < C; k++) expect_float(x, "transformer.ln_f.bias", k, rdf(p + 4 * (C + k)));
}

/* ------------------------------------------------------------------ files */
static void make_paths(void) {
    fuzz_paths("gpt", path_in, sizeof path_in, path_out, sizeof path_out);
}

static void remove_files(void) {
    unlink(path_in);
    unlink(path_out);
}

static uint8_t *read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)len + 1);
    CHECK(b && fread(b, 1, (size_t)len, f) == (size_t)len, "cannot read %s", path);
    fclose(f);
    *n = (size_t)len;
    return b;
}

/* --------------------------------------------------------------- seeds */
static uint8_t *find(uint8_t *hay, size_t n, const char *needle) {
    size_t k = strlen(needle);
    for (size_t i = 0; i + k <= n; i++)
        if (!memcmp(hay + i, needle, k)) return hay + i;
    return NULL;
}

static void seed(const char *dir, const char *name, const uint8_t *d, size_t n) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    fuzz_write_file(p, d, n);
}

/* A safetensors file as a "J" input: J, the header without its padding, NUL, data. */
static uint8_t *as_j(const uint8_t *f, size_t n, size_t *out_n, const char *extra_json,
                     const uint8_t *extra_data, size_t extra_n) {
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | f[i];
    size_t jl = (size_t)hlen;
    while (jl > 0 && f[8 + jl - 1] == ' ') jl--;
    size_t data_n = n - 8 - (size_t)hlen, xl = extra_json ? strlen(extra_json) : 0;
    uint8_t *j = malloc(1 + jl + xl + 1 + data_n + extra_n), *p = j;
    *p++ = 'J';
    memcpy(p, f + 8, jl - (xl ? 1 : 0)); /* without its '}' when extended */
    p += jl - (xl ? 1 : 0);
    if (xl) {
        memcpy(p, extra_json, xl);
        p += xl;
        *p++ = '}';
    }
    *p++ = 0;
    memcpy(p, f + 8 + hlen, data_n);
    p += data_n;
    if (extra_n) memcpy(p, extra_data, extra_n);
    p += extra_n;
    *out_n = (size_t)(p - j);
    return j;
}

static void write_seeds(const char *dir) {
    size_t n, jn;
    uint8_t *f, *j;
    /* llm.c: as nabla saves (Vp 128), compact (Vp = V), and broken */
    CHECK(nb_gpt_save_llmc(&A.m, path_out) == 0, "%s", nb_last_error());
    f = read_file(path_out, &n);
    seed(dir, "llmc-vp128.bin", f, n);
    size_t pad = 4 * (size_t)(128 - 5) * 4, wte = 4 * 5 * 4;
    uint8_t *c = malloc(n);
    memcpy(c, f, 1024 + wte);
    memcpy(c + 1024 + wte, f + 1024 + wte + pad, n - 1024 - wte - pad);
    c[28] = 5, c[29] = c[30] = c[31] = 0; /* padded_vocab_size = vocab_size */
    size_t cn = n - pad;
    seed(dir, "llmc-vp5.bin", c, cn);
    c[4] = 1; /* version 1 */
    seed(dir, "bad-llmc-version.bin", c, cn);
    c[4] = 3;
    seed(dir, "bad-llmc-truncated.bin", c, cn - 4);
    c[12] = 6; /* vocab_size 6 */
    seed(dir, "bad-llmc-vocab.bin", c, cn);
    free(c);
    free(f);
    /* Hugging Face: tied f32, untied f64, raw and as J inputs */
    CHECK(nb_gpt_save_hf(&A.m, path_out) == 0, "%s", nb_last_error());
    f = read_file(path_out, &n);
    seed(dir, "hf-tied-f32.safetensors", f, n);
    j = as_j(f, n, &jn, NULL, NULL, 0);
    seed(dir, "J-hf-tied-f32", j, jn);
    free(j);
    /* the hub's spelling: no prefix, with the attention-mask buffers */
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | f[i];
    size_t data_n = n - 8 - (size_t)hlen;
    char extra[256];
    snprintf(extra, sizeof extra, ",\"h.0.attn.masked_bias\":{\"dtype\":\"F32\",\"shape\":[],"
             "\"data_offsets\":[%zu,%zu]},\"h.0.attn.bias\":{\"dtype\":\"U8\",\"shape\":[1,1,2,2],"
             "\"data_offsets\":[%zu,%zu]}", data_n, data_n + 4, data_n + 4, data_n + 8);
    const uint8_t bufs[8] = {0, 0x40, 0x1c, 0xc6, 1, 0, 1, 1}; /* -1e4, tril */
    j = as_j(f, n, &jn, extra, bufs, sizeof bufs);
    /* "transformer." -> "" by moving the rest left (names are in the JSON, before the NUL) */
    size_t json_end = (size_t)((uint8_t *)memchr(j, 0, jn) - j);
    for (uint8_t *p; (p = find(j, json_end, "\"transformer.")) != NULL; jn -= 12, json_end -= 12)
        memmove(p + 1, p + 13, jn - (size_t)(p + 13 - j));
    seed(dir, "J-hf-hub-names", j, jn);
    free(j);
    /* broken: Conv1D weight given as (out, in) */
    j = as_j(f, n, &jn, NULL, NULL, 0);
    uint8_t *s = find(j, jn, "\"shape\":[4,12]");
    CHECK(s != NULL, "no c_attn shape in the seed");
    memcpy(s, "\"shape\":[12,4]", 14);
    seed(dir, "J-bad-hf-not-conv1d", j, jn);
    free(j);
    free(f);
    CHECK(nb_gpt_save_hf(&B.m, path_out) == 0, "%s", nb_last_error());
    f = read_file(path_out, &n);
    seed(dir, "hf-untied-f64.safetensors", f, n);
    j = as_j(f, n, &jn, NULL, NULL, 0);
    seed(dir, "J-hf-untied-f64", j, jn);
    free(j);
    free(f);
    seed(dir, "empty", (const uint8_t *)"", 0);
    remove_files();
}

/* --------------------------------------------------------------- the target */
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    setenv("NABLA_NUM_THREADS", "1", 0);
    setenv("NABLA_CACHE_MB", "0", 0); /* freed storage goes back to malloc: ASan sees reuse */
    make_paths();
    verbose = getenv("NABLA_FUZZ_VERBOSE") != NULL;
    atexit(remove_files);
    nb_GPTConfig cb = CFG_A;
    cb.tie_weights = false;
    model_make(&A, "A (tied, f32)", CFG_A, NB_F32, 1);
    model_make(&B, "B (untied, f64)", cb, NB_F64, 2);
    const char *seeds = getenv("NABLA_FUZZ_GPT_SEEDS");
    if (seeds) {
        write_seeds(seeds);
        exit(0);
    }
    live_baseline = nb_live_tensors();
    return 0;
}

static bool same_config(const nb_GPTConfig *a, const nb_GPTConfig *b, bool tie_too) {
    return a->vocab_size == b->vocab_size && a->block_size == b->block_size &&
           a->n_layer == b->n_layer && a->n_head == b->n_head && a->n_embd == b->n_embd &&
           a->dropout == b->dropout && a->bias == b->bias &&
           (!tie_too || a->tie_weights == b->tie_weights);
}

/* One model, one loader: returns whether it loaded. */
static bool try_load(model *x, bool hf, const uint8_t *data, size_t size) {
    const char *fn = hf ? "nb_gpt_load_hf" : "nb_gpt_load_llmc";
    int (*load)(nb_GPT *, const char *) = hf ? nb_gpt_load_hf : nb_gpt_load_llmc;
    static unsigned char *before, *after;
    static size_t cap;
    if (cap < x->nbytes) {
        free(before);
        free(after);
        before = malloc(x->nbytes);
        after = malloc(x->nbytes);
        cap = x->nbytes;
        CHECK(before && after, "out of memory");
    }
    reset(x);
    snapshot(x, before);
    nb_clear_error();
    int rc = load(&x->m, path_in);
    snapshot(x, after);
    if (verbose)
        fprintf(stderr, "fuzz_gpt: %s into %s: %s\n", fn, x->label, rc ? nb_last_error() : "loaded");
    if (rc != 0) {
        CHECK(rc == -1, "%s returned %d", fn, rc);
        const char *msg = nb_last_error();
        CHECK(msg != NULL, "%s failed without a message", fn);
        CHECK(!strncmp(msg, fn, strlen(fn)) && msg[strlen(fn)] == ':', "message \"%s\"", msg);
        CHECK(!memcmp(before, after, x->nbytes), "a failed %s (%s) changed %s", fn, msg, x->label);
        return false;
    }
    if (!hf) check_llmc_values(x, data, size);
    /* save, reset, load that: the same bits */
    bool as_hf = hf || !x->m.cfg.tie_weights;
    CHECK((as_hf ? nb_gpt_save_hf : nb_gpt_save_llmc)(&x->m, path_out) == 0, "re-save: %s",
          nb_last_error());
    reset(x);
    CHECK((as_hf ? nb_gpt_load_hf : nb_gpt_load_llmc)(&x->m, path_out) == 0, "re-load: %s",
          nb_last_error());
    snapshot(x, before);
    CHECK(!memcmp(before, after, x->nbytes), "%s: %s differs after save + load", fn, x->label);
    unlink(path_out);
    return true;
}

/* nb_load_tokens on the same file, with no vocabulary check and with 300:
 * llm.c's token file (magic 20240520) gives exactly its header's count of
 * uint16 tokens after the 1024-byte header, any other file its bytes; a
 * refusal names the function; the tensor is freed (leaks are counted). */
static void check_tokens(const uint8_t *d, size_t n) {
    for (int k = 0; k < 2; k++) {
        int64_t vocab = k ? 300 : 0;
        nb_clear_error();
        nb_tensor *t = nb_load_tokens(path_in, vocab);
        if (!t) {
            const char *msg = nb_last_error();
            CHECK(msg && !strncmp(msg, "nb_load_tokens: ", 16), "tokens: message \"%s\"",
                  msg ? msg : "(none)");
            continue;
        }
        bool llmc = n >= 4 && rd32(d) == 20240520;
        int64_t count = llmc ? rd32(d + 8) : (int64_t)n;
        CHECK(nb_dtype_of(t) == NB_I64 && nb_ndim(t) == 1 && nb_numel(t) == count,
              "tokens: %lld of them, expected %lld", (long long)nb_numel(t), (long long)count);
        CHECK(!llmc || n == 1024 + 2 * (size_t)count, "tokens: an llm.c file of %zu bytes for "
              "%lld tokens was accepted", n, (long long)count);
        const int64_t *v = nb_data(t);
        for (int64_t i = 0; i < count; i++) {
            int64_t want = llmc ? (int64_t)(d[1024 + 2 * i] | d[1024 + 2 * i + 1] << 8) : d[i];
            CHECK(v[i] == want && (vocab == 0 || v[i] < vocab), "tokens: token %lld is %lld, "
                  "expected %lld", (long long)i, (long long)v[i], (long long)want);
        }
        nb_free(t);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *input, size_t input_size) {
    size_t size;
    uint8_t *data = fuzz_file_of(input, input_size, &size);
    fuzz_write_file(path_in, data, size);
    bool llmc_magic = size >= 4 && rd32(data) == 20240326;
    nb_GPTConfig cfg;
    nb_clear_error();
    int crc = nb_gpt_config_of_file(path_in, &cfg);
    char cmsg[1100] = "";
    if (crc != 0) {
        const char *msg = nb_last_error();
        CHECK(crc == -1 && msg && !strncmp(msg, "nb_gpt_config_of_file: ", 23), "message \"%s\"",
              msg ? msg : "(none)");
        snprintf(cmsg, sizeof cmsg, "%s", msg);
    } else {
        CHECK(cfg.vocab_size > 0 && cfg.block_size > 0 && cfg.n_layer > 0 && cfg.n_head > 0 &&
              cfg.n_embd > 0 && cfg.n_embd % cfg.n_head == 0 && cfg.dropout == 0.0,
              "config_of_file gave a config nb_gpt_init refuses");
    }
    bool loaded[2][2]; /* [model A, B][llmc, hf] */
    for (int mi = 0; mi < 2; mi++)
        for (int hf = 0; hf < 2; hf++)
            loaded[mi][hf] = try_load(mi ? &B : &A, hf, data, size);
    /* the loads and config_of_file agree */
    for (int mi = 0; mi < 2; mi++) {
        const model *x = mi ? &B : &A;
        bool fits = crc == 0 && same_config(&cfg, &x->m.cfg, true);
        bool hf_fits = crc == 0 && same_config(&cfg, &x->m.cfg, false);
        if (fits) CHECK(loaded[mi][!llmc_magic], "config_of_file says %s's config, yet the %s "
                        "load failed", x->label, llmc_magic ? "llm.c" : "HF");
        if (loaded[mi][0]) CHECK(llmc_magic && crc == 0 && same_config(&cfg, &CFG_A, true),
                                 "llm.c load into %s, but config_of_file disagrees", x->label);
        /* a tied model ignores lm_head.weight (config_of_file reads the file as untied
         * then, and may refuse its lm_head); an untied one copies wte when the file has none */
        if (loaded[mi][1] && !(mi == 0 && crc != 0 && strstr(cmsg, "lm_head.weight")))
            CHECK(!llmc_magic && hf_fits,
                  "HF load into %s, but config_of_file disagrees (%s)", x->label,
                  crc ? cmsg : "it succeeded");
    }
    check_tokens(data, size);
    nb_clear_error();
    CHECK(nb_live_tensors() == live_baseline, "live tensors %lld, baseline %lld",
          (long long)nb_live_tensors(), (long long)live_baseline);
    CHECK(nb_scope_depth() == 0, "scope depth %d", nb_scope_depth());
    free(data);
    remove_files();
    return 0;
}
