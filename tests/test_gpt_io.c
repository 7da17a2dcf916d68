/* test_gpt_io.c: GPT checkpoints of llm.c and Hugging Face (nn/formats/gpt_io.c):
 * nb_gpt_load_llmc, nb_gpt_save_llmc, nb_gpt_load_hf, nb_gpt_save_hf and
 * nb_gpt_config_of_file, on tiny models (vocab 11, block 8, 2 layers, 2
 * heads, n_embd 8).
 *
 * - Round trips: saved from one model, loaded into a model of another seed:
 *   every parameter bitwise equal (f32 and f64; llm.c's f32 format gives an
 *   f64 model its values rounded to f32), tied, untied and bias-free.
 * - The layouts, written here byte by byte from the documented formats (not
 *   through the library): llm.c's header and 16 tensors, the padded rows of
 *   wte, Hugging Face's names (with and without "transformer."), Conv1D
 *   (in, out) weights, F64 tensors and ignored attention-mask buffers.
 * - Every way a file can be wrong: each refusal's message is checked, and
 *   the model's parameters are bitwise unchanged. */
#include "test_util.h"

#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#define CK_OK(expr) ck_assert_msg((expr) == 0, "%s", nb_last_error() ? nb_last_error() : "?")

/* ------------------------------------------------------------ temp files */
static unsigned char *slurp(const char *path, size_t *n) {
    return (unsigned char *)test_read_file(path, n);
}

/* ----------------------------------------------------------------- models */
static nb_GPTConfig tiny(void) {
    return (nb_GPTConfig){.vocab_size = 11, .block_size = 8, .n_layer = 2, .n_head = 2,
                          .n_embd = 8, .dropout = 0.0, .bias = true, .tie_weights = true};
}

typedef struct {
    nb_GPT m;
    nb_params *ps;
} model;

static uint64_t lcg(uint64_t *s) {
    *s = *s * 6364136223846793005u + 1442695040888963407u;
    return *s >> 11;
}

/* A GPT of cfg in dtype dt whose every parameter (biases and norms too)
 * holds distinct values drawn from seed: a misplaced copy shows. */
static void model_make(model *x, nb_GPTConfig cfg, nb_dtype dt, uint64_t seed) {
    nb_rng rng;
    nb_rng_seed(&rng, seed);
    nb_dtype old = nb_default_dtype();
    nb_set_default_dtype(dt);
    x->ps = nb_params_new();
    int rc = nb_gpt_init(&x->m, x->ps, &cfg, &rng);
    nb_set_default_dtype(old);
    CK_OK(rc);
    uint64_t s = seed * 7919 + 1;
    for (int i = 0; i < nb_params_count(x->ps); i++) {
        nb_tensor *t = nb_params_at(x->ps, i, NULL);
        for (int64_t k = 0; k < nb_numel(t); k++) {
            double v = (double)lcg(&s) / 9007199254740992.0 * 2 - 1; /* 53 random bits */
            if (dt == NB_F32) ((float *)nb_data(t))[k] = (float)v;
            else ((double *)nb_data(t))[k] = v;
        }
    }
}

static void model_free(model *x) {
    nb_gpt_free(&x->m);
    nb_params_free(x->ps);
}

static size_t elem(nb_tensor *t) { return nb_dtype_of(t) == NB_F64 ? 8 : 4; }

/* All parameter bytes, registration order. */
static unsigned char *snapshot(const model *x, size_t *n) {
    size_t total = 0;
    for (int i = 0; i < nb_params_count(x->ps); i++) {
        nb_tensor *t = nb_params_at(x->ps, i, NULL);
        total += (size_t)nb_numel(t) * elem(t);
    }
    unsigned char *b = malloc(total), *p = b;
    for (int i = 0; i < nb_params_count(x->ps); i++) {
        nb_tensor *t = nb_params_at(x->ps, i, NULL);
        size_t k = (size_t)nb_numel(t) * elem(t);
        memcpy(p, nb_data(t), k);
        p += k;
    }
    *n = total;
    return b;
}

#define expect_unchanged(x, before, n) expect_unchanged_at(__LINE__, (x), (before), (n))
static void expect_unchanged_at(int line, const model *x, unsigned char *before, size_t n) {
    size_t m;
    unsigned char *after = snapshot(x, &m);
    ck_assert_msg(m == n && memcmp(before, after, n) == 0,
                  "line %d: a failed load changed the model's parameters", line);
    free(after);
    free(before);
}

/* The call fails with a message holding each substring, and leaves x's
 * parameters bitwise as they were. */
#define EXPECT_REFUSED(x, call, ...)                          \
    do {                                                      \
        size_t n_;                                            \
        unsigned char *before_ = snapshot((x), &n_);          \
        int64_t live_ = nb_live_tensors();                    \
        expect_error_rc((call), __VA_ARGS__);                 \
        ck_assert_int_eq(nb_live_tensors(), live_);           \
        expect_unchanged((x), before_, n_);                   \
    } while (0)

/* Every parameter of b has a's bits (same names, dtypes, shapes). With
 * rounded, an f64 a's values rounded to f32 (llm.c's format). */
static void expect_same_params(const model *a, const model *b, bool rounded) {
    ck_assert_int_eq(nb_params_count(a->ps), nb_params_count(b->ps));
    for (int i = 0; i < nb_params_count(a->ps); i++) {
        const char *name;
        nb_tensor *ta = nb_params_at(a->ps, i, &name), *tb = nb_params_get(b->ps, name);
        ck_assert_msg(tb != NULL, "%s missing", name);
        ck_assert_int_eq(nb_dtype_of(ta), nb_dtype_of(tb));
        ck_assert_int_eq(nb_numel(ta), nb_numel(tb));
        if (!rounded || nb_dtype_of(ta) == NB_F32) {
            ck_assert_msg(!memcmp(nb_data(ta), nb_data(tb), (size_t)nb_numel(ta) * elem(ta)),
                          "%s differs", name);
            continue;
        }
        const double *va = nb_data(ta), *vb = nb_data(tb);
        for (int64_t k = 0; k < nb_numel(ta); k++) {
            double want = (double)(float)va[k];
            ck_assert_msg(!memcmp(&want, &vb[k], 8), "%s[%lld]: %.17g, expected %.17g", name,
                          (long long)k, vb[k], want);
        }
    }
}

static double value_at(const model *x, const char *name, int64_t k) {
    nb_tensor *t = nb_params_get(x->ps, name);
    ck_assert_msg(t != NULL, "no %s", name);
    return nb_dtype_of(t) == NB_F32 ? ((float *)nb_data(t))[k] : ((double *)nb_data(t))[k];
}

/* ---------------------------------------------- llm.c's layout, by hand */
/* The 16 tensors of train_gpt2.c in file order: the nanoGPT parameter of
 * each (per layer: "transformer.h.{i}." + name), its elements per layer in
 * multiples of C and C*C. */
static const struct {
    const char *name;
    bool layered;
    int c, cc; /* numel = c*C + cc*C*C (wte and wpe: special) */
} LLMC[16] = {
    {"transformer.wte.weight", false, 0, 0}, {"transformer.wpe.weight", false, 0, 0},
    {"ln_1.weight", true, 1, 0},         {"ln_1.bias", true, 1, 0},
    {"attn.c_attn.weight", true, 0, 3},  {"attn.c_attn.bias", true, 3, 0},
    {"attn.c_proj.weight", true, 0, 1},  {"attn.c_proj.bias", true, 1, 0},
    {"ln_2.weight", true, 1, 0},         {"ln_2.bias", true, 1, 0},
    {"mlp.c_fc.weight", true, 0, 4},     {"mlp.c_fc.bias", true, 4, 0},
    {"mlp.c_proj.weight", true, 0, 4},   {"mlp.c_proj.bias", true, 1, 0},
    {"transformer.ln_f.weight", false, 1, 0}, {"transformer.ln_f.bias", false, 1, 0},
};

/* Elements of tensor t in the file (all layers; wte with its padded rows). */
static int64_t llmc_numel(const nb_GPTConfig *c, int64_t Vp, int t) {
    int64_t C = c->n_embd;
    if (t == 0) return Vp * C;
    if (t == 1) return c->block_size * C;
    return (LLMC[t].layered ? c->n_layer : 1) * (LLMC[t].c * C + LLMC[t].cc * C * C);
}

/* The value written at element i of tensor t: exact in f32. */
static float llmc_value(int t, int64_t i) { return (float)(t * 100000 + i); }

/* An llm.c file written from the documented layout: header ints (magic,
 * version, maxT, V, L, NH, C, Vp, then zeros), then each tensor's values
 * llmc_value; wte's rows V..Vp-1 hold pad. */
static unsigned char *llmc_file(const nb_GPTConfig *c, int64_t Vp, float pad, size_t *n) {
    int64_t floats = 0;
    for (int t = 0; t < 16; t++) floats += llmc_numel(c, Vp, t);
    *n = 1024 + 4 * (size_t)floats;
    unsigned char *b = calloc(1, *n);
    int32_t head[8] = {20240326, 3, (int32_t)c->block_size, (int32_t)c->vocab_size,
                       (int32_t)c->n_layer, (int32_t)c->n_head, (int32_t)c->n_embd, (int32_t)Vp};
    for (int i = 0; i < 8; i++)
        for (int k = 0; k < 4; k++) b[4 * i + k] = (unsigned char)((uint32_t)head[i] >> (8 * k));
    unsigned char *p = b + 1024;
    for (int t = 0; t < 16; t++)
        for (int64_t i = 0; i < llmc_numel(c, Vp, t); i++) {
            float v = t == 0 && i >= c->vocab_size * c->n_embd ? pad : llmc_value(t, i);
            uint32_t u;
            memcpy(&u, &v, 4);
            for (int k = 0; k < 4; k++) *p++ = (unsigned char)(u >> (8 * k));
        }
    return b;
}

static void write_llmc(const char *path, const nb_GPTConfig *c, int64_t Vp, float pad) {
    size_t n;
    unsigned char *b = llmc_file(c, Vp, pad, &n);
    test_write_bytes(path, b, n);
    free(b);
}

/* Every parameter of x holds the values llmc_file wrote (an untied
 * lm_head: wte's). */
static void expect_llmc_values(const model *x) {
    const nb_GPTConfig *c = &x->m.cfg;
    int64_t C = c->n_embd;
    char name[128];
    for (int t = 0; t < 16; t++) {
        int64_t per = t == 0 ? c->vocab_size * C : t == 1 ? c->block_size * C
                    : LLMC[t].c * C + LLMC[t].cc * C * C;
        for (int64_t l = 0; l < (LLMC[t].layered ? c->n_layer : 1); l++) {
            if (LLMC[t].layered) snprintf(name, sizeof name, "transformer.h.%lld.%s", (long long)l, LLMC[t].name);
            else snprintf(name, sizeof name, "%s", LLMC[t].name);
            for (int64_t k = 0; k < per; k++)
                ck_assert_msg(value_at(x, name, k) == llmc_value(t, l * per + k),
                              "%s[%lld] = %g, expected %g", name, (long long)k,
                              value_at(x, name, k), (double)llmc_value(t, l * per + k));
        }
    }
    if (!c->tie_weights)
        for (int64_t k = 0; k < c->vocab_size * C; k++)
            ck_assert(value_at(x, "lm_head.weight", k) == llmc_value(0, k));
}

/* ------------------------------------- Hugging Face's layout, by hand */
typedef struct {
    char name[96];
    char dtype[8];
    int ndim;
    int64_t shape[4];
    unsigned char *data;
    size_t nbytes;
} hf_entry;

typedef struct {
    hf_entry e[64];
    int n;
    char meta[256]; /* more of __metadata__ after "format": ",\"n_head\":\"4\"" (hf_full: "") */
} hf_file;

static size_t dtype_bytes(const char *d) {
    return !strcmp(d, "F64") || !strcmp(d, "I64") ? 8 : !strcmp(d, "U8") ? 1
           : !strcmp(d, "F16") ? 2 : 4;
}

/* Adds a tensor whose element k is id * 100000 + k (0 for U8, I64). */
static hf_entry *hf_add(hf_file *f, const char *name, const char *dtype, int ndim,
                        const int64_t *shape, int id) {
    ck_assert_int_lt(f->n, 64);
    hf_entry *e = &f->e[f->n++];
    memset(e, 0, sizeof *e);
    snprintf(e->name, sizeof e->name, "%s", name);
    snprintf(e->dtype, sizeof e->dtype, "%s", dtype);
    e->ndim = ndim;
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= (e->shape[d] = shape[d]);
    size_t z = dtype_bytes(dtype);
    e->nbytes = (size_t)n * z;
    e->data = calloc(1, e->nbytes + 1);
    for (int64_t k = 0; k < n; k++) {
        if (!strcmp(dtype, "F32")) test_put_le_f32(e->data + 4 * k, (float)(id * 100000 + k));
        if (!strcmp(dtype, "F64")) test_put_le_f64(e->data + 8 * k, id * 100000 + k + 0.25);
    }
    return e;
}

static void hf_free(hf_file *f) {
    for (int i = 0; i < f->n; i++) free(f->e[i].data);
    f->n = 0;
}

static int hf_find(hf_file *f, const char *name) {
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->e[i].name, name)) return i;
    ck_abort_msg("no %s", name);
    return -1;
}

static void hf_remove(hf_file *f, const char *name) {
    int i = hf_find(f, name);
    free(f->e[i].data);
    memmove(&f->e[i], &f->e[i + 1], (size_t)(f->n - i - 1) * sizeof f->e[0]);
    f->n--;
}

/* The safetensors file: u64 header size, JSON, data in entry order. */
static void hf_write(const hf_file *f, const char *path) {
    char *json = malloc(1 << 16);
    size_t n = (size_t)sprintf(json, "{\"__metadata__\":{\"format\":\"pt\"%s}", f->meta);
    size_t at = 0;
    for (int i = 0; i < f->n; i++) {
        const hf_entry *e = &f->e[i];
        n += (size_t)sprintf(json + n, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", e->name, e->dtype);
        for (int d = 0; d < e->ndim; d++)
            n += (size_t)sprintf(json + n, "%s%lld", d ? "," : "", (long long)e->shape[d]);
        n += (size_t)sprintf(json + n, "],\"data_offsets\":[%zu,%zu]}", at, at + e->nbytes);
        at += e->nbytes;
    }
    json[n++] = '}';
    while (n % 8) json[n++] = ' ';
    FILE *out = fopen(path, "wb");
    ck_assert_ptr_nonnull(out);
    unsigned char len[8];
    for (int k = 0; k < 8; k++) len[k] = (unsigned char)((uint64_t)n >> (8 * k));
    fwrite(len, 1, 8, out);
    fwrite(json, 1, n, out);
    for (int i = 0; i < f->n; i++) fwrite(f->e[i].data, 1, f->e[i].nbytes, out);
    ck_assert_int_eq(fclose(out), 0);
    free(json);
}

/* The per-layer names and Hugging Face shapes (multiples of C; Conv1D
 * weights (in, out)). */
static const struct {
    const char *name;
    int r, c; /* c 0: 1-d */
    bool conv;
    bool linear_bias;
} HF_LAYER[12] = {
    {"ln_1.weight", 1, 0, false, false},       {"ln_1.bias", 1, 0, false, false},
    {"attn.c_attn.weight", 1, 3, true, false}, {"attn.c_attn.bias", 3, 0, false, true},
    {"attn.c_proj.weight", 1, 1, true, false}, {"attn.c_proj.bias", 1, 0, false, true},
    {"ln_2.weight", 1, 0, false, false},       {"ln_2.bias", 1, 0, false, false},
    {"mlp.c_fc.weight", 1, 4, true, false},    {"mlp.c_fc.bias", 4, 0, false, true},
    {"mlp.c_proj.weight", 4, 1, true, false},  {"mlp.c_proj.bias", 1, 0, false, true},
};

/* A whole GPT-2 file for c: tensor ids 0 wte, 1 wpe, 2 ln_f.weight,
 * 3 ln_f.bias, 4 lm_head (when untied), 10 + 12 i + k for layer i.
 * prefix "" or "transformer."; weights in wdtype; buffers adds each layer's
 * attn.bias (U8) and attn.masked_bias (F32, 0-d), which loads ignore. */
static void hf_full(hf_file *f, const nb_GPTConfig *c, const char *prefix, const char *wdtype,
                    bool buffers) {
    int64_t C = c->n_embd;
    char name[96];
    f->n = 0;
    f->meta[0] = 0;
    snprintf(name, sizeof name, "%swte.weight", prefix);
    hf_add(f, name, wdtype, NB_SHAPE(c->vocab_size, C), 0);
    snprintf(name, sizeof name, "%swpe.weight", prefix);
    hf_add(f, name, wdtype, NB_SHAPE(c->block_size, C), 1);
    for (int64_t i = 0; i < c->n_layer; i++) {
        for (int k = 0; k < 12; k++) {
            if (HF_LAYER[k].linear_bias && !c->bias) continue;
            snprintf(name, sizeof name, "%sh.%lld.%s", prefix, (long long)i, HF_LAYER[k].name);
            int64_t shape[2] = {HF_LAYER[k].r * C, HF_LAYER[k].c * C};
            hf_add(f, name, wdtype, HF_LAYER[k].c ? 2 : 1, shape, 10 + 12 * (int)i + k);
        }
        if (buffers) {
            snprintf(name, sizeof name, "%sh.%lld.attn.bias", prefix, (long long)i);
            hf_add(f, name, "U8", NB_SHAPE(1, 1, c->block_size, c->block_size), 0);
            snprintf(name, sizeof name, "%sh.%lld.attn.masked_bias", prefix, (long long)i);
            hf_add(f, name, "F32", 0, NULL, 0);
        }
    }
    snprintf(name, sizeof name, "%sln_f.weight", prefix);
    hf_add(f, name, wdtype, NB_SHAPE(C), 2);
    snprintf(name, sizeof name, "%sln_f.bias", prefix);
    hf_add(f, name, wdtype, NB_SHAPE(C), 3);
    if (!c->tie_weights) hf_add(f, "lm_head.weight", wdtype, NB_SHAPE(c->vocab_size, C), 4);
}

/* x holds what hf_full wrote: Conv1D weights transposed, F64 values
 * (k + 0.25) converted to the model's dtype. */
static void expect_hf_values(const model *x, bool f64_file) {
    const nb_GPTConfig *c = &x->m.cfg;
    int64_t C = c->n_embd;
    char name[128];
    for (int id = 0; id < 10 + 12 * (int)c->n_layer; id++) {
        bool conv = false;
        int64_t rows = 0, cols = 0;
        if (id >= 5 && id < 10) continue;
        if (id == 4 && c->tie_weights) continue;
        if (id < 5) {
            static const char *const g[] = {"transformer.wte.weight", "transformer.wpe.weight",
                                            "transformer.ln_f.weight", "transformer.ln_f.bias",
                                            "lm_head.weight"};
            snprintf(name, sizeof name, "%s", g[id]);
        } else {
            int i = (id - 10) / 12, k = (id - 10) % 12;
            if (HF_LAYER[k].linear_bias && !c->bias) continue;
            snprintf(name, sizeof name, "transformer.h.%d.%s", i, HF_LAYER[k].name);
            conv = HF_LAYER[k].conv;
            rows = HF_LAYER[k].r * C, cols = HF_LAYER[k].c * C; /* the file's (in, out) */
        }
        nb_tensor *t = nb_params_get(x->ps, name);
        ck_assert_msg(t != NULL, "%s", name);
        for (int64_t k = 0; k < nb_numel(t); k++) {
            /* model element k: (o, i) of (out, in) = file (i, o) */
            int64_t fk = conv ? (k % rows) * cols + k / rows : k;
            double want = id * 100000 + fk + (f64_file ? 0.25 : 0);
            if (nb_dtype_of(t) == NB_F32) want = (float)want;
            ck_assert_msg(value_at(x, name, k) == want, "%s[%lld] = %.17g, expected %.17g", name,
                          (long long)k, value_at(x, name, k), want);
        }
    }
}

/* ---------------------------------------------------------- round trips */
static void roundtrip(nb_GPTConfig cfg, nb_dtype dt, bool hf) {
    test_make_tmp_dir("gptio");
    const char *path = test_tmp_path(hf ? "m.safetensors" : "m.bin");
    model a, b;
    model_make(&a, cfg, dt, 1);
    model_make(&b, cfg, dt, 2);
    int64_t live = nb_live_tensors();
    CK_OK(hf ? nb_gpt_save_hf(&a.m, path) : nb_gpt_save_llmc(&a.m, path));
    CK_OK(hf ? nb_gpt_load_hf(&b.m, path) : nb_gpt_load_llmc(&b.m, path));
    ck_assert_int_eq(nb_live_tensors(), live);
    expect_same_params(&a, &b, !hf && dt == NB_F64);
    /* what b saves is what a saved: the same bytes */
    size_t n1, n2;
    unsigned char *f1 = slurp(path, &n1);
    CK_OK(hf ? nb_gpt_save_hf(&b.m, path) : nb_gpt_save_llmc(&b.m, path));
    unsigned char *f2 = slurp(path, &n2);
    ck_assert(n1 == n2 && !memcmp(f1, f2, n1));
    free(f1);
    free(f2);
    /* and the two models compute the same logits */
    nb_scope_begin();
    nb_tensor *idx = nb_from_data(NB_I64, NB_SHAPE(1, 4), (int64_t[]){1, 5, 2, 10});
    nb_tensor *la = nb_gpt_forward(&a.m, idx, false, NULL), *lb = nb_gpt_forward(&b.m, idx, false, NULL);
    ck_assert_ptr_nonnull(la);
    if (hf || dt == NB_F32) expect_close(lb, la, 0, 0);
    nb_scope_end();
    model_free(&a);
    model_free(&b);
    test_remove_tmp_dir();
}

START_TEST(roundtrip_llmc_f32) { roundtrip(tiny(), NB_F32, false); }
END_TEST

START_TEST(roundtrip_llmc_f64) { roundtrip(tiny(), NB_F64, false); }
END_TEST

START_TEST(roundtrip_hf_f32) { roundtrip(tiny(), NB_F32, true); }
END_TEST

START_TEST(roundtrip_hf_f64) { roundtrip(tiny(), NB_F64, true); }
END_TEST

START_TEST(roundtrip_hf_untied_and_without_bias) {
    nb_GPTConfig c = tiny();
    c.tie_weights = false;
    roundtrip(c, NB_F32, true);
    c.bias = false;
    roundtrip(c, NB_F64, true);
}
END_TEST

/* ------------------------------------------------------- llm.c's layout */
START_TEST(llmc_layout_by_hand) {
    test_make_tmp_dir("gptio");
    nb_GPTConfig c = tiny();
    const char *path = test_tmp_path("hand.bin"), *again = test_tmp_path("again.bin");
    write_llmc(path, &c, 128, 0.0f);
    model m;
    model_make(&m, c, NB_F32, 3);
    CK_OK(nb_gpt_load_llmc(&m.m, path));
    expect_llmc_values(&m);
    /* qkvw of layer 1, row 3 is transformer.h.1.attn.c_attn.weight's row 3 */
    int64_t C = c.n_embd;
    for (int64_t j = 0; j < C; j++)
        ck_assert(value_at(&m, "transformer.h.1.attn.c_attn.weight", 3 * C + j) ==
                  llmc_value(4, 3 * C * C + 3 * C + j));
    /* fcprojb of layer 0 is transformer.h.0.mlp.c_proj.bias */
    ck_assert(value_at(&m, "transformer.h.0.mlp.c_proj.bias", 5) == llmc_value(13, 5));
    /* saving writes the very bytes of the documented layout (padding zeros) */
    CK_OK(nb_gpt_save_llmc(&m.m, again));
    size_t n1, n2;
    unsigned char *f1 = slurp(path, &n1), *f2 = slurp(again, &n2);
    ck_assert_uint_eq(n1, 1024 + 4 * (128 * 8 + 8 * 8 + 2 * (12 * 64 + 13 * 8) + 16));
    ck_assert(n1 == n2 && !memcmp(f1, f2, n1));
    free(f1);
    free(f2);
    /* an f64 model gets the same values */
    model d;
    model_make(&d, c, NB_F64, 4);
    CK_OK(nb_gpt_load_llmc(&d.m, path));
    expect_llmc_values(&d);
    model_free(&d);
    model_free(&m);
    test_remove_tmp_dir();
}
END_TEST

START_TEST(llmc_padded_vocab) {
    test_make_tmp_dir("gptio");
    nb_GPTConfig c = tiny();
    model a, b;
    model_make(&a, c, NB_F32, 5);
    model_make(&b, c, NB_F32, 6);
    const char *path = test_tmp_path("pad.bin");
    /* rows V..Vp-1 written as zeros; Vp = 128 */
    CK_OK(nb_gpt_save_llmc(&a.m, path));
    size_t n;
    unsigned char *f = slurp(path, &n);
    ck_assert_int_eq(test_le(f + 28, 4), 128); /* Vp */
    for (size_t k = 1024 + 4 * 11 * 8; k < 1024 + 4 * 128 * 8; k++) ck_assert_int_eq(f[k], 0);
    /* padding rows are ignored on load, whatever they hold */
    for (size_t k = 1024 + 4 * 11 * 8; k < 1024 + 4 * 128 * 8; k += 4) test_put_le_f32(f + k, 123.5f);
    test_write_bytes(path, f, n);
    free(f);
    CK_OK(nb_gpt_load_llmc(&b.m, path));
    expect_same_params(&a, &b, false);
    /* any Vp >= V loads: none (Vp = V) or not a multiple of 128 */
    model m;
    model_make(&m, c, NB_F32, 7);
    write_llmc(path, &c, 11, 0.0f);
    CK_OK(nb_gpt_load_llmc(&m.m, path));
    expect_llmc_values(&m);
    write_llmc(path, &c, 200, -9.0f);
    model_free(&m);
    model_make(&m, c, NB_F32, 8);
    CK_OK(nb_gpt_load_llmc(&m.m, path));
    expect_llmc_values(&m);
    /* V = 128 needs no padding row; V = 129 needs 127 */
    nb_GPTConfig big = c;
    big.vocab_size = 129;
    model v;
    model_make(&v, big, NB_F32, 9);
    CK_OK(nb_gpt_save_llmc(&v.m, path));
    f = slurp(path, &n);
    ck_assert_int_eq(test_le(f + 28, 4), 256);
    free(f);
    model_free(&v);
    model_free(&m);
    model_free(&a);
    model_free(&b);
    test_remove_tmp_dir();
}
END_TEST

START_TEST(llmc_tied_untied_bias) {
    test_make_tmp_dir("gptio");
    nb_GPTConfig c = tiny();
    const char *path = test_tmp_path("t.bin");
    write_llmc(path, &c, 128, 0.0f);
    /* untied: lm_head gets a copy of wte (checked by expect_llmc_values) */
    nb_GPTConfig u = c;
    u.tie_weights = false;
    model m;
    model_make(&m, u, NB_F32, 10);
    CK_OK(nb_gpt_load_llmc(&m.m, path));
    expect_llmc_values(&m);
    ck_assert_ptr_ne(m.m.lm_head.weight, m.m.wte.weight);
    /* saving an untied model is refused, and writes nothing */
    const char *out = test_tmp_path("untied.bin");
    expect_error_rc(nb_gpt_save_llmc(&m.m, out), "nb_gpt_save_llmc: the model is untied");
    ck_assert_int_ne(access(out, F_OK), 0);
    model_free(&m);
    /* a model without biases: refused both ways */
    nb_GPTConfig nb = c;
    nb.bias = false;
    model_make(&m, nb, NB_F32, 11);
    EXPECT_REFUSED(&m, nb_gpt_load_llmc(&m.m, path), "nb_gpt_load_llmc: the model has no biases");
    expect_error_rc(nb_gpt_save_llmc(&m.m, out), "nb_gpt_save_llmc: the model has no biases");
    ck_assert_int_ne(access(out, F_OK), 0);
    model_free(&m);
    test_remove_tmp_dir();
}
END_TEST

/* ------------------------------------------------- Hugging Face's layout */
START_TEST(hf_layout_by_hand) {
    test_make_tmp_dir("gptio");
    nb_GPTConfig c = tiny();
    const char *path = test_tmp_path("hand.safetensors");
    hf_file f;
    const char *prefixes[2] = {"", "transformer."};
    for (int p = 0; p < 2; p++)
        for (int d = 0; d < 2; d++) {
            hf_full(&f, &c, prefixes[p], d ? "F64" : "F32", p == 0);
            hf_write(&f, path);
            hf_free(&f);
            for (int dt = 0; dt < 2; dt++) {
                model m;
                model_make(&m, c, dt ? NB_F64 : NB_F32, 12);
                CK_OK(nb_gpt_load_hf(&m.m, path));
                expect_hf_values(&m, d == 1);
                model_free(&m);
            }
        }
    /* Conv1D, spelled out: file h.1.attn.c_attn.weight (C, 3C) element (2, 17)
     * is the model's (17, 2) */
    hf_full(&f, &c, "", "F32", false);
    hf_write(&f, path);
    hf_free(&f);
    model m;
    model_make(&m, c, NB_F32, 13);
    CK_OK(nb_gpt_load_hf(&m.m, path));
    ck_assert(value_at(&m, "transformer.h.1.attn.c_attn.weight", 17 * 8 + 2) ==
              (10 + 12 + 2) * 100000 + 2 * 24 + 17);
    /* names may mix the two spellings; an untied model reads lm_head */
    nb_GPTConfig u = c;
    u.tie_weights = false;
    hf_full(&f, &u, "", "F32", true);
    snprintf(f.e[hf_find(&f, "wpe.weight")].name, 96, "transformer.wpe.weight");
    hf_write(&f, path);
    hf_free(&f);
    model x;
    model_make(&x, u, NB_F32, 14);
    CK_OK(nb_gpt_load_hf(&x.m, path));
    expect_hf_values(&x, false);
    /* a tied model ignores lm_head.weight: wte is the file's wte */
    CK_OK(nb_gpt_load_hf(&m.m, path));
    expect_hf_values(&m, false);
    /* an untied model given a tied file (no lm_head.weight) copies wte, as from llm.c */
    CK_OK(nb_gpt_save_hf(&m.m, path));
    CK_OK(nb_gpt_load_hf(&x.m, path));
    nb_tensor *wte = nb_params_get(x.ps, "transformer.wte.weight");
    nb_tensor *head = nb_params_get(x.ps, "lm_head.weight");
    ck_assert_ptr_nonnull(wte);
    ck_assert_ptr_nonnull(head);
    ck_assert_ptr_ne(wte, head);
    ck_assert(memcmp(nb_data(wte), nb_data(head), (size_t)nb_numel(wte) * sizeof(float)) == 0);
    model_free(&x);
    model_free(&m);
    test_remove_tmp_dir();
}
END_TEST

/* What nb_gpt_save_hf writes: names with "transformer.", Conv1D weights
 * (in, out), the model's dtype, no lm_head when tied. */
START_TEST(hf_saved_layout) {
    test_make_tmp_dir("gptio");
    const char *path = test_tmp_path("s.safetensors");
    model m;
    model_make(&m, tiny(), NB_F32, 15);
    CK_OK(nb_gpt_save_hf(&m.m, path));
    size_t n;
    unsigned char *f = slurp(path, &n);
    uint64_t hlen = test_le(f, 8);
    char *json = malloc(hlen + 1);
    memcpy(json, f + 8, hlen);
    json[hlen] = 0;
    ck_assert_ptr_null(strstr(json, "lm_head"));
    ck_assert_ptr_null(strstr(json, ".0.attn.bias"));
    ck_assert_ptr_null(strstr(json, "masked_bias"));
    const char *key = "\"transformer.h.1.attn.c_attn.weight\":{\"dtype\":\"F32\",\"shape\":[8,24],"
                      "\"data_offsets\":[";
    char *at = strstr(json, key);
    ck_assert_msg(at != NULL, "%s", json);
    unsigned long long begin, end;
    ck_assert_int_eq(sscanf(at + strlen(key), "%llu,%llu", &begin, &end), 2);
    ck_assert_uint_eq(end - begin, 8 * 24 * 4);
    const unsigned char *w = f + 8 + hlen + begin;
    nb_tensor *t = nb_params_get(m.ps, "transformer.h.1.attn.c_attn.weight");
    for (int i = 0; i < 8; i++)
        for (int o = 0; o < 24; o++)
            ck_assert(test_le_f32(w + 4 * (i * 24 + o)) == ((float *)nb_data(t))[o * 8 + i]);
    ck_assert_ptr_nonnull(strstr(json, "\"transformer.wte.weight\":{\"dtype\":\"F32\",\"shape\":[11,8]"));
    free(json);
    free(f);
    model_free(&m);
    /* untied f64: lm_head.weight, F64 */
    nb_GPTConfig u = tiny();
    u.tie_weights = false;
    model_make(&m, u, NB_F64, 16);
    CK_OK(nb_gpt_save_hf(&m.m, path));
    f = slurp(path, &n);
    hlen = test_le(f, 8);
    json = malloc(hlen + 1);
    memcpy(json, f + 8, hlen);
    json[hlen] = 0;
    ck_assert_ptr_nonnull(strstr(json, "\"lm_head.weight\":{\"dtype\":\"F64\",\"shape\":[11,8]"));
    free(json);
    free(f);
    model_free(&m);
    test_remove_tmp_dir();
}
END_TEST

/* ------------------------------------------------------- config_of_file */
static void expect_config(nb_GPTConfig got, nb_GPTConfig want) {
    ck_assert_int_eq(got.vocab_size, want.vocab_size);
    ck_assert_int_eq(got.block_size, want.block_size);
    ck_assert_int_eq(got.n_layer, want.n_layer);
    ck_assert_int_eq(got.n_head, want.n_head);
    ck_assert_int_eq(got.n_embd, want.n_embd);
    ck_assert(got.dropout == 0.0);
    ck_assert_int_eq(got.bias, want.bias);
    ck_assert_int_eq(got.tie_weights, want.tie_weights);
}

START_TEST(config_of_file) {
    test_make_tmp_dir("gptio");
    const char *path = test_tmp_path("c.bin");
    nb_GPTConfig c = tiny(), got;
    c.n_head = 4;
    write_llmc(path, &c, 128, 0.0f);
    CK_OK(nb_gpt_config_of_file(path, &got));
    expect_config(got, c); /* llm.c's header has everything */
    /* Hugging Face as nb_gpt_save_hf writes it: n_head from its __metadata__
     * (4, where the shapes alone would have suggested n_embd / 64 = 2) */
    nb_GPTConfig w = {.vocab_size = 5, .block_size = 3, .n_layer = 1, .n_head = 4, .n_embd = 128,
                      .bias = true, .tie_weights = true};
    model m;
    model_make(&m, w, NB_F32, 17);
    CK_OK(nb_gpt_save_hf(&m.m, path));
    CK_OK(nb_gpt_config_of_file(path, &got));
    expect_config(got, w);
    nb_gpt_n_head_from from = NB_GPT_N_HEAD_GUESSED;
    CK_OK(nb_gpt_inspect(path, &got, &from));
    expect_config(got, w);
    ck_assert_int_eq(from, NB_GPT_N_HEAD_FILE);
    model_free(&m);
    /* untied: lm_head.weight is there */
    nb_GPTConfig u = tiny();
    u.tie_weights = false;
    u.n_layer = 3;
    model_make(&m, u, NB_F32, 18);
    CK_OK(nb_gpt_save_hf(&m.m, path));
    CK_OK(nb_gpt_config_of_file(path, &got));
    expect_config(got, u);
    model_free(&m);
    /* a file without the linear biases says so; with the prefix or without;
     * without __metadata__ (or config.json) n_head is a guess: n_embd / 64,
     * one head when 64 does not divide n_embd */
    hf_file f;
    nb_GPTConfig nb = tiny();
    nb.bias = false;
    nb.n_head = 1;
    hf_full(&f, &nb, "", "F64", true);
    hf_write(&f, path);
    hf_free(&f);
    CK_OK(nb_gpt_config_of_file(path, &got));
    expect_config(got, nb);
    CK_OK(nb_gpt_inspect(path, &got, &from));
    ck_assert_int_eq(from, NB_GPT_N_HEAD_GUESSED);
    /* the config it gives makes a model the file loads into */
    model_make(&m, got, NB_F32, 19);
    CK_OK(nb_gpt_load_hf(&m.m, path));
    model_free(&m);
    /* errors: each format's own, and neither */
    nb_GPTConfig keep = got;
    test_write_bytes(path, "hello, world", 12);
    expect_error_rc(nb_gpt_config_of_file(path, &got), "nb_gpt_config_of_file: ", path,
                    "neither llm.c's checkpoint (magic 20240326) nor a safetensors file");
    expect_config(got, keep);
    size_t n;
    unsigned char *b = llmc_file(&c, 128, 0.0f, &n);
    test_write_bytes(path, b, n - 4);
    free(b);
    expect_error_rc(nb_gpt_config_of_file(path, &got), "nb_gpt_config_of_file: ", path,
                    "llm.c's checkpoint: file is 12412 bytes, the header's sizes need 12416 "
                    "(truncated)");
    hf_full(&f, &nb, "", "F32", false);
    hf_remove(&f, "h.1.ln_2.bias");
    hf_write(&f, path);
    hf_free(&f);
    expect_error_rc(nb_gpt_config_of_file(path, &got), "nb_gpt_config_of_file: ", path,
                    ": missing h.1.ln_2.bias");
    hf_full(&f, &nb, "", "F32", false);
    hf_remove(&f, "wpe.weight");
    hf_write(&f, path);
    hf_free(&f);
    expect_error_rc(nb_gpt_config_of_file(path, &got), ": missing wpe.weight");
    expect_error_rc(nb_gpt_config_of_file(test_tmp_path("none"), &got), "nb_gpt_config_of_file: ",
                    "cannot open", "No such file");
    expect_error_rc(nb_gpt_config_of_file(test_tmp_dir, &got), "nb_gpt_config_of_file: ",
                    "is not a regular file");
    expect_error_rc(nb_gpt_config_of_file(NULL, &got), "nb_gpt_config_of_file: path is NULL");
    expect_error_rc(nb_gpt_config_of_file(path, NULL), "nb_gpt_config_of_file: cfg is NULL");
    test_remove_tmp_dir();
}
END_TEST

/* -------------------------------------------------------- llm.c refusals */
static void put32(unsigned char *b, int i, int32_t v) { test_put_le(b + 4 * i, (uint32_t)v, 4); }

START_TEST(llmc_errors) {
    test_make_tmp_dir("gptio");
    nb_GPTConfig c = tiny();
    model m;
    model_make(&m, c, NB_F32, 20);
    const char *path = test_tmp_path("e.bin");
    size_t n;
    unsigned char *good = llmc_file(&c, 128, 0.0f, &n), *b = malloc(n + 8);
    char want[256];
#define LLMC_REFUSED(len, ...)                                                    \
    do {                                                                          \
        test_write_bytes(path, b, (len));                                              \
        EXPECT_REFUSED(&m, nb_gpt_load_llmc(&m.m, path), "nb_gpt_load_llmc: ",     \
                       path, __VA_ARGS__);                                        \
        memcpy(b, good, n);                                                       \
    } while (0)
    memcpy(b, good, n);
    put32(b, 0, 12345);
    snprintf(want, sizeof want, "\"%s\": bad magic 12345 (expected 20240326, llm.c's GPT-2 "
             "checkpoint)", path);
    LLMC_REFUSED(n, want);
    put32(b, 1, 1);
    LLMC_REFUSED(n, ": version 1 (expected 3)");
    put32(b, 1, 5);
    LLMC_REFUSED(n, ": version 5 (expected 3)");
    LLMC_REFUSED(n - 4, ": file is 12412 bytes, the header's sizes need 12416 (truncated)");
    memset(b + n, 0, 4);
    LLMC_REFUSED(n + 4, ": file is 12420 bytes, the header's sizes need 12416 (4 bytes too many)");
    LLMC_REFUSED(1024, ": file is 1024 bytes, the header's sizes need 12416 (truncated)");
    LLMC_REFUSED(100, ": file is 100 bytes, shorter than llm.c's 1024-byte header (truncated)");
    LLMC_REFUSED(0, ": file is empty (0 bytes)");
    put32(b, 3, 50257);
    LLMC_REFUSED(n, ": vocab_size 50257 in the file, the model has 11");
    put32(b, 2, 1024);
    LLMC_REFUSED(n, ": max_seq_len 1024 in the file, the model has 8");
    put32(b, 4, 3);
    LLMC_REFUSED(n, ": num_layers 3 in the file, the model has 2");
    put32(b, 5, 4);
    LLMC_REFUSED(n, ": num_heads 4 in the file, the model has 2");
    put32(b, 6, 16);
    LLMC_REFUSED(n, ": channels 16 in the file, the model has 8");
    put32(b, 7, 10);
    LLMC_REFUSED(n, ": padded_vocab_size 10 is smaller than vocab_size 11");
    put32(b, 7, -128);
    LLMC_REFUSED(n, ": padded_vocab_size -128 in the header must be positive");
    /* a file written for a bigger vocabulary: its sizes, not the model's */
    nb_GPTConfig big = c;
    big.vocab_size = 50;
    unsigned char *other = llmc_file(&big, 128, 0.0f, &n);
    test_write_bytes(path, other, n);
    free(other);
    EXPECT_REFUSED(&m, nb_gpt_load_llmc(&m.m, path), path,
                   ": vocab_size 50 in the file, the model has 11");
    /* not a regular file, not there, not llm.c's */
    EXPECT_REFUSED(&m, nb_gpt_load_llmc(&m.m, test_tmp_dir), "nb_gpt_load_llmc: ", test_tmp_dir,
                   "is not a regular file");
    const char *fifo = test_tmp_path("fifo");
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    EXPECT_REFUSED(&m, nb_gpt_load_llmc(&m.m, fifo), "nb_gpt_load_llmc: ", fifo,
                   "is not a regular file");
    const char *none = test_tmp_path("none.bin");
    EXPECT_REFUSED(&m, nb_gpt_load_llmc(&m.m, none), "nb_gpt_load_llmc: cannot open", none,
                   "No such file or directory");
    const char *st = test_tmp_path("m.safetensors");
    CK_OK(nb_gpt_save_hf(&m.m, st));
    EXPECT_REFUSED(&m, nb_gpt_load_llmc(&m.m, st), "nb_gpt_load_llmc: ", st, ": bad magic");
    /* arguments */
    EXPECT_REFUSED(&m, nb_gpt_load_llmc(&m.m, NULL), "nb_gpt_load_llmc: path is NULL");
    expect_error_rc(nb_gpt_load_llmc(NULL, path), "nb_gpt_load_llmc: model is NULL");
    nb_GPT zero = {0};
    expect_error_rc(nb_gpt_load_llmc(&zero, path), "nb_gpt_load_llmc: model is not initialized");
    expect_error_rc(nb_gpt_save_llmc(NULL, path), "nb_gpt_save_llmc: model is NULL");
    expect_error_rc(nb_gpt_save_llmc(&m.m, NULL), "nb_gpt_save_llmc: path is NULL");
    expect_error_rc(nb_gpt_save_llmc(&m.m, test_tmp_path("no/such/dir.bin")),
                    "nb_gpt_save_llmc: cannot create a file next to");
#undef LLMC_REFUSED
    free(b);
    free(good);
    model_free(&m);
    test_remove_tmp_dir();
}
END_TEST

/* ------------------------------------------------- Hugging Face refusals */
static void edit_not_conv(hf_file *f) { /* nanoGPT's (out, in): not Conv1D's (in, out) */
    hf_entry *e = &f->e[hf_find(f, "h.1.attn.c_attn.weight")];
    e->shape[0] = 24;
    e->shape[1] = 8;
}
static void edit_missing(hf_file *f) { hf_remove(f, "h.0.ln_1.weight"); }
static void edit_foo(hf_file *f) { hf_add(f, "foo", "F32", NB_SHAPE(2), 0); }
static void edit_layer2(hf_file *f) { hf_add(f, "h.2.ln_1.weight", "F32", NB_SHAPE(8), 0); }
static void edit_twice(hf_file *f) { hf_add(f, "transformer.ln_f.bias", "F32", NB_SHAPE(8), 0); }
static void edit_i64(hf_file *f) {
    hf_remove(f, "ln_f.bias");
    hf_add(f, "ln_f.bias", "I64", NB_SHAPE(8), 0);
}
static void edit_f16(hf_file *f) {
    hf_remove(f, "ln_f.bias");
    hf_add(f, "ln_f.bias", "F16", NB_SHAPE(8), 0);
}
static void edit_vocab(hf_file *f) {
    hf_remove(f, "wte.weight");
    hf_add(f, "wte.weight", "F32", NB_SHAPE(50257, 8), 0);
}
static void edit_offsets(hf_file *f) { f->e[hf_find(f, "ln_f.weight")].nbytes -= 4; }

/* The tiny file, edited, is refused by nb_gpt_load_hf with "\"<path>\"<want>". */
static void hf_refused(model *m, void (*edit)(hf_file *), const char *want) {
    const char *path = test_tmp_path("e.safetensors");
    hf_file f;
    nb_GPTConfig c = tiny();
    hf_full(&f, &c, "", "F32", false);
    edit(&f);
    hf_write(&f, path);
    hf_free(&f);
    char msg[512];
    snprintf(msg, sizeof msg, "nb_gpt_load_hf: \"%s\"%s", path, want);
    EXPECT_REFUSED(m, nb_gpt_load_hf(&m->m, path), msg);
}

START_TEST(hf_errors) {
    test_make_tmp_dir("gptio");
    nb_GPTConfig c = tiny();
    model m;
    model_make(&m, c, NB_F32, 21);
    const char *path = test_tmp_path("e.safetensors");
    hf_file f;
    hf_refused(&m, edit_not_conv, ": h.1.attn.c_attn.weight has shape (24,8), expected (8,24)");
    hf_refused(&m, edit_missing, ": missing h.0.ln_1.weight");
    hf_refused(&m, edit_foo, ": unexpected tensor foo");
    hf_refused(&m, edit_layer2, ": unexpected tensor h.2.ln_1.weight (the model has fewer layers)");
    hf_refused(&m, edit_twice, ": ln_f.bias and transformer.ln_f.bias are the same tensor");
    hf_refused(&m, edit_i64, ": ln_f.bias has dtype I64, expected F32 or F64");
    hf_refused(&m, edit_f16, ": ln_f.bias has dtype F16, expected F32 or F64");
    hf_refused(&m, edit_vocab, ": wte.weight has shape (50257,8), expected (11,8)");
    hf_refused(&m, edit_offsets,
               ": invalid safetensors header: tensor \"ln_f.weight\": data_offsets");
    /* bytes past the data section, a garbage header, empty, short */
    hf_full(&f, &c, "", "F32", false);
    hf_write(&f, path);
    hf_free(&f);
    size_t n;
    unsigned char *b = slurp(path, &n);
    unsigned char *b2 = malloc(n + 8);
    memcpy(b2, b, n);
    memset(b2 + n, 0, 8);
    test_write_bytes(path, b2, n + 8);
    EXPECT_REFUSED(&m, nb_gpt_load_hf(&m.m, path), "nb_gpt_load_hf: ", path,
                   "invalid safetensors header: the data section has");
    test_write_bytes(path, b, n - 1);
    EXPECT_REFUSED(&m, nb_gpt_load_hf(&m.m, path), "nb_gpt_load_hf: ", path,
                   "invalid safetensors header");
    uint64_t hlen = test_le(b, 8);
    test_write_bytes(path, b, 8 + hlen); /* the header only */
    EXPECT_REFUSED(&m, nb_gpt_load_hf(&m.m, path), "nb_gpt_load_hf: ", path,
                   "invalid safetensors header", "data_offsets");
    b[8] = 'x';
    test_write_bytes(path, b, n);
    EXPECT_REFUSED(&m, nb_gpt_load_hf(&m.m, path), "nb_gpt_load_hf: ", path,
                   "invalid safetensors header: expected '{'");
    memset(b, 0xff, 8);
    test_write_bytes(path, b, n);
    EXPECT_REFUSED(&m, nb_gpt_load_hf(&m.m, path), "nb_gpt_load_hf: ", path,
                   "header size 18446744073709551615 exceeds the file");
    test_write_bytes(path, b, 0);
    EXPECT_REFUSED(&m, nb_gpt_load_hf(&m.m, path), "nb_gpt_load_hf: ", path,
                   ": file is 0 bytes, too short for a safetensors file");
    test_write_bytes(path, b, 5);
    EXPECT_REFUSED(&m, nb_gpt_load_hf(&m.m, path), ": file is 5 bytes, too short");
    free(b);
    free(b2);
    /* an llm.c file, a directory, a FIFO, nothing */
    const char *bin = test_tmp_path("m.bin");
    CK_OK(nb_gpt_save_llmc(&m.m, bin));
    EXPECT_REFUSED(&m, nb_gpt_load_hf(&m.m, bin), "nb_gpt_load_hf: ", bin,
                   "llm.c's checkpoint (magic 20240326), not a safetensors file");
    EXPECT_REFUSED(&m, nb_gpt_load_hf(&m.m, test_tmp_dir), "nb_gpt_load_hf: ", "is not a regular file");
    const char *fifo = test_tmp_path("fifo");
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    EXPECT_REFUSED(&m, nb_gpt_load_hf(&m.m, fifo), "nb_gpt_load_hf: ", fifo,
                   "is not a regular file");
    EXPECT_REFUSED(&m, nb_gpt_load_hf(&m.m, test_tmp_path("none")), "nb_gpt_load_hf: cannot open",
                   "No such file");
    /* biases into a model without */
    hf_full(&f, &c, "", "F32", false);
    hf_write(&f, path);
    hf_free(&f);
    nb_GPTConfig nb = c;
    nb.bias = false;
    model x;
    model_make(&x, nb, NB_F64, 23);
    EXPECT_REFUSED(&x, nb_gpt_load_hf(&x.m, path), "nb_gpt_load_hf: ", path,
                   ": unexpected tensor h.0.attn.c_attn.bias (the model has no biases");
    model_free(&x);
    /* arguments */
    EXPECT_REFUSED(&m, nb_gpt_load_hf(&m.m, NULL), "nb_gpt_load_hf: path is NULL");
    expect_error_rc(nb_gpt_load_hf(NULL, path), "nb_gpt_load_hf: model is NULL");
    expect_error_rc(nb_gpt_save_hf(NULL, path), "nb_gpt_save_hf: model is NULL");
    expect_error_rc(nb_gpt_save_hf(&m.m, NULL), "nb_gpt_save_hf: path is NULL");
    expect_error_rc(nb_gpt_save_hf(&m.m, test_tmp_dir), "nb_gpt_save_hf: cannot write", test_tmp_dir);
    model_free(&m);
    test_remove_tmp_dir();
}
END_TEST

/* A refused save keeps the file that was there; a save replaces it whole. */
/* nb_gpt_from_file: the model a file holds, made and loaded (no draws),
 * from either format; a bad file leaves m freed and the error named. */
START_TEST(from_file) {
    test_make_tmp_dir("gptio");
    model a;
    nb_GPTConfig c = tiny();
    c.n_embd = 64; /* a head count the HF file implies (n_embd / 64) */
    c.n_head = 1;
    model_make(&a, c, NB_F32, 31);
    for (int hf = 0; hf < 2; hf++) {
        const char *path = test_tmp_path(hf ? "ff.safetensors" : "ff.bin");
        CK_OK((hf ? nb_gpt_save_hf : nb_gpt_save_llmc)(&a.m, path));
        model b = {.ps = nb_params_new()};
        nb_rng before = *nb_global_rng();
        CK_OK(nb_gpt_from_file(&b.m, b.ps, path));
        ck_assert(nb_global_rng()->offset == before.offset); /* nothing drawn */
        ck_assert_int_eq(b.m.cfg.n_layer, c.n_layer);
        ck_assert(b.m.cfg.tie_weights);
        expect_same_params(&a, &b, false);
        model_free(&b);
    }
    nb_params *ps = nb_params_new();
    nb_GPT m;
    const char *bad = test_tmp_path("bad.bin");
    FILE *f = fopen(bad, "wb");
    fputs("not a model", f);
    fclose(f);
    expect_error_rc(nb_gpt_from_file(&m, ps, bad), "nb_gpt_config_of_file: ", bad);
    ck_assert_ptr_null(m.h);
    expect_error_rc(nb_gpt_from_file(NULL, ps, bad), "nb_gpt_from_file: model or registry is NULL");
    nb_params_free(ps);
    model_free(&a);
    test_remove_tmp_dir();
}
END_TEST

/* A forward's logits on a fixed input, as a persistent tensor. */
static nb_tensor *logits_of(model *x) {
    const int64_t idx[6] = {1, 5, 2, 9, 0, 3};
    nb_scope_begin();
    nb_tensor *out = nb_gpt_forward(&x->m, nb_from_data(NB_I64, NB_SHAPE(1, 6), idx), false, NULL);
    ck_assert_msg(out != NULL, "%s", nb_last_error());
    nb_tensor *kept = nb_persistent(out);
    nb_scope_end();
    return kept;
}

/* The head count (the one size no tensor's shape shows) survives an export
 * to Hugging Face's format: a 4-head model of n_embd 128 (where heads of 64
 * would make 2) comes back with 4 heads and the same logits; a model of
 * another head count is refused, naming both. */
START_TEST(hf_head_count_round_trip) {
    test_make_tmp_dir("gptio");
    const char *path = test_tmp_path("m.safetensors");
    nb_GPTConfig c = tiny();
    c.n_embd = 128, c.n_head = 4;
    model a;
    model_make(&a, c, NB_F32, 41);
    CK_OK(nb_gpt_save_hf(&a.m, path));
    model b = {.ps = nb_params_new()};
    CK_OK(nb_gpt_from_file(&b.m, b.ps, path));
    ck_assert_int_eq(b.m.cfg.n_head, 4);
    nb_tensor *la = logits_of(&a), *lb = logits_of(&b);
    expect_close(lb, la, 0, 0);
    nb_free(la);
    nb_free(lb);
    model_free(&b);
    /* the file's heads against a model's */
    nb_GPTConfig two = c;
    two.n_head = 2;
    model x;
    model_make(&x, two, NB_F32, 42);
    char want[600];
    snprintf(want, sizeof want, "nb_gpt_load_hf: \"%s\": n_head 4 in its __metadata__, the model "
             "has 2", path);
    EXPECT_REFUSED(&x, nb_gpt_load_hf(&x.m, path), want);
    model_free(&x);
    model_free(&a);
    test_remove_tmp_dir();
}
END_TEST

static void write_text(const char *path, const char *text) {
    test_write_bytes(path, text, strlen(text));
}

/* __metadata__ that contradicts the tensors is refused; a Hugging Face file
 * without it takes n_head (and checks the sizes) from a config.json beside
 * it; __metadata__ comes first; a config.json that is not JSON or has no
 * integer n_head is not this file's config, and n_head is a guess. */
START_TEST(hf_head_count_sources) {
    test_make_tmp_dir("gptio");
    const char *path = test_tmp_path("w.safetensors"), *json = test_tmp_path("config.json");
    nb_GPTConfig c = tiny(), got; /* n_embd 8, 2 layers */
    nb_gpt_n_head_from from;
    hf_file f;
    static const struct {
        const char *meta, *msg;
    } bad[] = {
        {",\"n_layer\":\"3\"", "its __metadata__ says n_layer 3, but the file's tensors have 2"},
        {",\"n_embd\":\"16\"", "its __metadata__ says n_embd 16, but the file's tensors have 8"},
        {",\"block_size\":\"9\"", "its __metadata__ says block_size 9, but the file's tensors have 8"},
        {",\"vocab_size\":\"12\"", "its __metadata__ says vocab_size 12, but the file's tensors have 11"},
        {",\"n_head\":\"3\"", "its __metadata__ says n_head 3, which does not divide n_embd 8"},
        {",\"n_head\":\"four\"", "its __metadata__ \"n_head\" is \"four\", not a whole number from 1 "
                                 "to 2147483647"},
        {",\"n_head\":\"04\"", "its __metadata__ \"n_head\" is \"04\", not a whole number"},
        {",\"n_head\":\"99999999999\"", "\"n_head\" is \"99999999999\", not a whole number"},
        {",\"n_head\":\"2\",\"n_head\":\"4\"", "its __metadata__ gives \"n_head\" 2 times"},
    };
    model m;
    model_make(&m, c, NB_F32, 43);
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        hf_full(&f, &c, "", "F32", false);
        snprintf(f.meta, sizeof f.meta, "%s", bad[i].meta);
        hf_write(&f, path);
        hf_free(&f);
        expect_error_rc(nb_gpt_config_of_file(path, &got), "nb_gpt_config_of_file: \"", path,
                        bad[i].msg);
        EXPECT_REFUSED(&m, nb_gpt_load_hf(&m.m, path), "nb_gpt_load_hf: \"", path, bad[i].msg);
    }
    /* no __metadata__ sizes: config.json beside it (Hugging Face's, with
     * fields of every kind) */
    hf_full(&f, &c, "", "F32", false);
    hf_write(&f, path);
    hf_free(&f);
    write_text(json, "{\"activation_function\": \"gelu_new\", \"architectures\": [\"GPT2LMHeadModel\"],"
               " \"layer_norm_epsilon\": 1e-05, \"model_type\": \"gpt2\", \"n_ctx\": 8,"
               " \"n_embd\": 8, \"n_head\": 4, \"n_layer\": 2, \"n_positions\": 8,"
               " \"summary_activation\": null, \"task_specific_params\": {\"text-generation\":"
               " {\"do_sample\": true, \"max_length\": 50}}, \"vocab_size\": 11}\n");
    CK_OK(nb_gpt_inspect(path, &got, &from));
    ck_assert_int_eq(got.n_head, 4);
    ck_assert_int_eq(from, NB_GPT_N_HEAD_CONFIG_JSON);
    char want[700];
    snprintf(want, sizeof want, ": n_head 4 in the Hugging Face config \"%s\", the model has 2",
             json);
    EXPECT_REFUSED(&m, nb_gpt_load_hf(&m.m, path), "nb_gpt_load_hf: \"", path, want);
    model k = {.ps = nb_params_new()};
    CK_OK(nb_gpt_from_file(&k.m, k.ps, path));
    ck_assert_int_eq(k.m.cfg.n_head, 4);
    model_free(&k);
    /* a config.json of other sizes is refused: it is not this file's */
    write_text(json, "{\"n_embd\": 768, \"n_head\": 12, \"n_layer\": 2}");
    snprintf(want, sizeof want, ": the Hugging Face config \"%s\" says n_embd 768, but the file's "
             "tensors have 8", json);
    expect_error_rc(nb_gpt_config_of_file(path, &got), "nb_gpt_config_of_file: \"", path, want);
    /* __metadata__ first: nabla's own export ignores the config.json */
    hf_full(&f, &c, "", "F32", false);
    snprintf(f.meta, sizeof f.meta, ",\"n_head\":\"2\"");
    hf_write(&f, path);
    hf_free(&f);
    CK_OK(nb_gpt_inspect(path, &got, &from));
    ck_assert_int_eq(got.n_head, 2);
    ck_assert_int_eq(from, NB_GPT_N_HEAD_FILE);
    CK_OK(nb_gpt_load_hf(&m.m, path));
    /* config.json that is no model config (no integer n_head, or not JSON): a guess */
    const char *others[] = {"{\"n_head\": \"4\"}", "{\"name\": \"my app\"}", "n_head = 4", "[4]", ""};
    hf_full(&f, &c, "", "F32", false);
    hf_write(&f, path);
    hf_free(&f);
    for (size_t i = 0; i < sizeof others / sizeof *others; i++) {
        write_text(json, others[i]);
        CK_OK(nb_gpt_inspect(path, &got, &from));
        ck_assert_int_eq(from, NB_GPT_N_HEAD_GUESSED);
        ck_assert_int_eq(got.n_head, 1);
        CK_OK(nb_gpt_load_hf(&m.m, path)); /* a guess is no contradiction */
    }
    model_free(&m);
    test_remove_tmp_dir();
}
END_TEST

START_TEST(saves_are_atomic) {
    test_make_tmp_dir("gptio");
    const char *path = test_tmp_path("keep.bin");
    test_write_bytes(path, "old", 3);
    nb_GPTConfig u = tiny();
    u.tie_weights = false;
    model m;
    model_make(&m, u, NB_F32, 24);
    expect_error_rc(nb_gpt_save_llmc(&m.m, path), "nb_gpt_save_llmc: the model is untied");
    size_t n;
    unsigned char *b = slurp(path, &n);
    ck_assert(n == 3 && !memcmp(b, "old", 3));
    free(b);
    CK_OK(nb_gpt_save_hf(&m.m, path));
    nb_GPTConfig got;
    CK_OK(nb_gpt_config_of_file(path, &got));
    ck_assert(!got.tie_weights);
    model_free(&m);
    test_remove_tmp_dir();
}
END_TEST

Suite *suite_gpt_io(void) {
    Suite *s = suite_create("gpt_io");
    TCase *tc = tcase_create("gpt_io");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, roundtrip_llmc_f32);
    tcase_add_test(tc, roundtrip_llmc_f64);
    tcase_add_test(tc, roundtrip_hf_f32);
    tcase_add_test(tc, roundtrip_hf_f64);
    tcase_add_test(tc, roundtrip_hf_untied_and_without_bias);
    tcase_add_test(tc, llmc_layout_by_hand);
    tcase_add_test(tc, llmc_padded_vocab);
    tcase_add_test(tc, llmc_tied_untied_bias);
    tcase_add_test(tc, hf_layout_by_hand);
    tcase_add_test(tc, hf_saved_layout);
    tcase_add_test(tc, config_of_file);
    tcase_add_test(tc, llmc_errors);
    tcase_add_test(tc, hf_errors);
    tcase_add_test(tc, from_file);
    tcase_add_test(tc, hf_head_count_round_trip);
    tcase_add_test(tc, hf_head_count_sources);
    tcase_add_test(tc, saves_are_atomic);
    suite_add_tcase(s, tc);
    return s;
}
