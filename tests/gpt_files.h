/* gpt_files.h: GPT-2 checkpoints and token files written from a seed, with
 * no help from nabla (plain C and stdio), so that nabla's loaders can be
 * tested on files that tests/fixtures/gen_gpt.py reproduces bit for bit.
 *
 * Every value is a function of (seed, tensor id, element index):
 *
 *   gf_hash(seed, t, i) = mix(seed * 0x9E3779B97F4A7C15 + t * 0xD1B54A32D192ED03 + i)
 *   mix(z): z += 0x9E3779B97F4A7C15; z = (z ^ z >> 30) * 0xBF58476D1CE4E5B9;
 *           z = (z ^ z >> 27) * 0x94D049BB133111EB; z ^ z >> 31    (splitmix64)
 *
 * all modulo 2^64. A weight is u = ((h >> 40) - 2^23) / 2^23, uniform in
 * [-1, 1) on a grid of 2^-23, then (float)(offset + scale * u) computed in
 * double (exact) and rounded once to f32 (round to nearest even):
 *
 *   kind                        offset scale  (std = scale / sqrt 3)
 *   wte                         0      2^-5   (0.018)
 *   wpe                         0      2^-6
 *   c_attn, c_fc weights        0      2^-5
 *   attn/mlp c_proj weights     0      2^-7   (GPT-2's smaller residual init)
 *   linear biases               0      2^-7   (small, nonzero)
 *   layer norm weights          1      2^-3
 *   layer norm biases           0      2^-5
 *
 * i is the row-major index in nanoGPT's layout ((out, in) linear weights,
 * nabla's parameter of that name). Tensor ids: wte 0, wpe 1, then block l's
 * twelve tensors 2 + 12 l + k in GF_BLOCK_NAMES order, ln_f.weight 2 + 12 L,
 * ln_f.bias 3 + 12 L. Token i of the token file is (gf_hash(seed,
 * GF_TOKENS_ID, i) >> 32) % vocab.
 *
 * Files (all little-endian, as the formats are):
 *   llm.c checkpoint: 256 int32 (20240326, 3, block, vocab, L, heads, C,
 *     padded vocab, zeros), then the f32 tensors in llm.c's order; wte rows
 *     vocab..padded-1 are zeros (as llm.c writes them).
 *   Hugging Face model.safetensors: names of GPT2Model (h.{l}.attn.c_attn.weight,
 *     wte.weight, ...), Conv1D weights (in, out), each block's attn.bias mask
 *     buffer (1, 1, block, block) of ones on and below the diagonal, as the
 *     real file has, "__metadata__": {"format": "pt"}; names sorted, data in
 *     that order, the header padded with spaces to a multiple of 8.
 *   llm.c token file: 256 int32 (20240520, 1, count, zeros), count uint16.
 *
 * Header-only (static functions) for tests/test_gpt_torch.c and the
 * programs in tests/tools/. It also reads tests/fixtures/gpt_torch.txt and
 * compares a model's updated parameters with it (gf_fixture_*). */
#ifndef NABLA_TESTS_GPT_FILES_H
#define NABLA_TESTS_GPT_FILES_H

#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct gf_config {
    const char *name;
    int64_t vocab, vocab_padded, block, n_layer, n_head, n_embd;
    uint64_t seed;
    int64_t n_tokens; /* in the token file */
    int64_t batch, seq; /* the batch the fixture's loss is of (tokens [0, batch*seq]) */
} gf_config;

/* small: n_embd 128 with 2 heads of 64, because a Hugging Face file does not
 * store the head count (no __metadata__ sizes; no config.json is written
 * beside it) and nb_gpt_config_of_file then guesses n_embd / 64. */
static const gf_config GF_SMALL = {.name = "small", .vocab = 101, .vocab_padded = 128,
                                   .block = 32, .n_layer = 2, .n_head = 2, .n_embd = 128,
                                   .seed = 1, .n_tokens = 200, .batch = 4, .seq = 16};
/* exactly GPT-2 124M */
static const gf_config GF_GPT2 = {.name = "gpt2", .vocab = 50257, .vocab_padded = 50304,
                                  .block = 1024, .n_layer = 12, .n_head = 12, .n_embd = 768,
                                  .seed = 2, .n_tokens = 1024, .batch = 4, .seq = 64};

/* GPT-2's vocabulary on a tiny model: text in and out through the real
 * tokenizer in seconds (tests/tools/gpt_sample_check.c). */
static const gf_config GF_VOCAB = {.name = "vocab", .vocab = 50257, .vocab_padded = 50304,
                                   .block = 64, .n_layer = 1, .n_head = 1, .n_embd = 64,
                                   .seed = 3, .n_tokens = 200, .batch = 2, .seq = 16};

static inline const gf_config *gf_config_named(const char *name) {
    if (!strcmp(name, GF_SMALL.name)) return &GF_SMALL;
    if (!strcmp(name, GF_VOCAB.name)) return &GF_VOCAB;
    if (!strcmp(name, GF_GPT2.name)) return &GF_GPT2;
    return NULL;
}

#define GF_TOKENS_ID 1000000u
enum { GF_LN_1_W, GF_LN_1_B, GF_C_ATTN_W, GF_C_ATTN_B, GF_ATTN_PROJ_W, GF_ATTN_PROJ_B,
       GF_LN_2_W, GF_LN_2_B, GF_C_FC_W, GF_C_FC_B, GF_MLP_PROJ_W, GF_MLP_PROJ_B, GF_NBLOCK };
static const char *const GF_BLOCK_NAMES[GF_NBLOCK] = {
    "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
    "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
    "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"};

static inline uint64_t gf_hash(uint64_t seed, uint64_t t, uint64_t i) {
    uint64_t z = seed * 0x9E3779B97F4A7C15u + t * 0xD1B54A32D192ED03u + i;
    z += 0x9E3779B97F4A7C15u;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9u;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBu;
    return z ^ (z >> 31);
}

static inline int gf_n_tensors(const gf_config *c) { return (int)(4 + GF_NBLOCK * c->n_layer); }

/* Tensor t's nanoGPT name, (out, in) shape (ndim 1 or 2), offset and scale. */
typedef struct gf_tensor {
    char name[96];
    int ndim;
    int64_t rows, cols; /* ndim 1: rows = 1, cols = size */
    double offset, scale;
    int kind; /* GF_* of a block tensor, -1 otherwise */
} gf_tensor;

static inline gf_tensor gf_tensor_info(const gf_config *c, int t) {
    gf_tensor r = {.ndim = 1, .rows = 1, .cols = c->n_embd, .kind = -1};
    int64_t C = c->n_embd, L = c->n_layer;
    if (t == 0) {
        snprintf(r.name, sizeof r.name, "transformer.wte.weight");
        r.ndim = 2, r.rows = c->vocab, r.scale = 0x1p-5;
    } else if (t == 1) {
        snprintf(r.name, sizeof r.name, "transformer.wpe.weight");
        r.ndim = 2, r.rows = c->block, r.scale = 0x1p-6;
    } else if (t == 2 + GF_NBLOCK * L) {
        snprintf(r.name, sizeof r.name, "transformer.ln_f.weight");
        r.offset = 1, r.scale = 0x1p-3;
    } else if (t == 3 + GF_NBLOCK * L) {
        snprintf(r.name, sizeof r.name, "transformer.ln_f.bias");
        r.scale = 0x1p-5;
    } else {
        int l = (t - 2) / GF_NBLOCK, k = (t - 2) % GF_NBLOCK;
        r.kind = k;
        snprintf(r.name, sizeof r.name, "transformer.h.%d.%s", l, GF_BLOCK_NAMES[k]);
        static const int64_t outs[GF_NBLOCK] = {1, 1, 3, 3, 1, 1, 1, 1, 4, 4, 1, 1};
        static const int64_t ins[GF_NBLOCK] = {0, 0, 1, 0, 1, 0, 0, 0, 1, 0, 4, 0};
        static const double scales[GF_NBLOCK] = {0x1p-3, 0x1p-5, 0x1p-5, 0x1p-7, 0x1p-7, 0x1p-7,
                                                 0x1p-3, 0x1p-5, 0x1p-5, 0x1p-7, 0x1p-7, 0x1p-7};
        r.scale = scales[k];
        r.offset = (k == GF_LN_1_W || k == GF_LN_2_W) ? 1 : 0;
        if (ins[k]) r.ndim = 2, r.rows = outs[k] * C, r.cols = ins[k] * C;
        else r.cols = outs[k] * C;
    }
    return r;
}

static inline float gf_value(const gf_config *c, const gf_tensor *ti, int t, int64_t i) {
    uint64_t h = gf_hash(c->seed, (uint64_t)t, (uint64_t)i);
    double u = ((double)(int64_t)(h >> 40) - 8388608.0) / 8388608.0;
    return (float)(ti->offset + ti->scale * u);
}

static inline int64_t gf_token(const gf_config *c, int64_t i) {
    return (int64_t)((gf_hash(c->seed, GF_TOKENS_ID, (uint64_t)i) >> 32) % (uint64_t)c->vocab);
}

/* ------------------------------------------------------------- writing */
static inline void gf_le32(unsigned char *b, uint32_t v) {
    for (int k = 0; k < 4; k++) b[k] = (unsigned char)(v >> (8 * k));
}

/* Writes n f32 values, little-endian, through a small buffer. */
typedef struct gf_out {
    FILE *f;
    unsigned char buf[1 << 16];
    size_t n;
    int err;
} gf_out;
static inline void gf_flush(gf_out *o) {
    if (o->n && fwrite(o->buf, 1, o->n, o->f) != o->n) o->err = 1;
    o->n = 0;
}
static inline void gf_put_bytes(gf_out *o, const void *p, size_t n) {
    const unsigned char *s = p;
    while (n) {
        size_t k = sizeof o->buf - o->n < n ? sizeof o->buf - o->n : n;
        memcpy(o->buf + o->n, s, k);
        o->n += k, s += k, n -= k;
        if (o->n == sizeof o->buf) gf_flush(o);
    }
}
static inline void gf_put_f32(gf_out *o, float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    unsigned char b[4];
    gf_le32(b, u);
    gf_put_bytes(o, b, 4);
}
/* Tensor t in nanoGPT layout ((out, in)), or transposed ((in, out)). */
static inline void gf_put_tensor(gf_out *o, const gf_config *c, int t, int transposed) {
    gf_tensor ti = gf_tensor_info(c, t);
    if (!transposed)
        for (int64_t i = 0; i < ti.rows * ti.cols; i++) gf_put_f32(o, gf_value(c, &ti, t, i));
    else
        for (int64_t j = 0; j < ti.cols; j++)
            for (int64_t i = 0; i < ti.rows; i++) gf_put_f32(o, gf_value(c, &ti, t, i * ti.cols + j));
}
static inline int gf_close(gf_out *o, const char *path) {
    gf_flush(o);
    if (fclose(o->f) != 0) o->err = 1;
    if (o->err) fprintf(stderr, "gpt_files: cannot write %s\n", path);
    int err = o->err;
    free(o);
    return err ? -1 : 0;
}
static inline gf_out *gf_open(const char *path) {
    gf_out *o = calloc(1, sizeof *o);
    if (!o) return NULL;
    o->f = fopen(path, "wb");
    if (!o->f) {
        fprintf(stderr, "gpt_files: cannot open %s for writing\n", path);
        free(o);
        return NULL;
    }
    return o;
}

/* llm.c's checkpoint, version 3. 0 or -1. */
static inline int gf_write_llmc(const gf_config *c, const char *path) {
    gf_out *o = gf_open(path);
    if (!o) return -1;
    int32_t hdr[256] = {20240326, 3, (int32_t)c->block, (int32_t)c->vocab, (int32_t)c->n_layer,
                        (int32_t)c->n_head, (int32_t)c->n_embd, (int32_t)c->vocab_padded};
    for (int k = 0; k < 256; k++) {
        unsigned char b[4];
        gf_le32(b, (uint32_t)hdr[k]);
        gf_put_bytes(o, b, 4);
    }
    gf_put_tensor(o, c, 0, 0); /* wte (V, C), then the padding rows */
    for (int64_t i = 0; i < (c->vocab_padded - c->vocab) * c->n_embd; i++) gf_put_f32(o, 0.0f);
    gf_put_tensor(o, c, 1, 0); /* wpe */
    static const int order[GF_NBLOCK] = {GF_LN_1_W, GF_LN_1_B, GF_C_ATTN_W, GF_C_ATTN_B,
                                         GF_ATTN_PROJ_W, GF_ATTN_PROJ_B, GF_LN_2_W, GF_LN_2_B,
                                         GF_C_FC_W, GF_C_FC_B, GF_MLP_PROJ_W, GF_MLP_PROJ_B};
    for (int k = 0; k < GF_NBLOCK; k++) /* each kind stacked over the layers */
        for (int l = 0; l < c->n_layer; l++) gf_put_tensor(o, c, 2 + GF_NBLOCK * l + order[k], 0);
    gf_put_tensor(o, c, 2 + GF_NBLOCK * (int)c->n_layer, 0); /* lnfw */
    gf_put_tensor(o, c, 3 + GF_NBLOCK * (int)c->n_layer, 0); /* lnfb */
    return gf_close(o, path);
}

/* One entry of the Hugging Face file: tensor id t (-1 - l: block l's attn.bias). */
typedef struct gf_hf_entry {
    char name[96];
    int t;
    int64_t shape[4];
    int ndim;
    int64_t bytes;
} gf_hf_entry;
static inline int gf_hf_cmp(const void *a, const void *b) {
    return strcmp(((const gf_hf_entry *)a)->name, ((const gf_hf_entry *)b)->name);
}

/* Hugging Face's GPT2Model model.safetensors. 0 or -1. */
static inline int gf_write_hf(const gf_config *c, const char *path) {
    int n = gf_n_tensors(c) + (int)c->n_layer;
    gf_hf_entry *e = calloc((size_t)n, sizeof *e);
    size_t cap = (size_t)n * 160 + 64;
    char *json = malloc(cap + 8);
    if (!e || !json) {
        free(e), free(json);
        return -1;
    }
    for (int t = 0; t < gf_n_tensors(c); t++) {
        gf_tensor ti = gf_tensor_info(c, t);
        const char *short_name = ti.name + strlen("transformer.");
        snprintf(e[t].name, sizeof e[t].name, "%.80s", short_name);
        e[t].t = t;
        if (ti.ndim == 1) e[t].ndim = 1, e[t].shape[0] = ti.cols;
        else if (ti.kind >= 0) e[t].ndim = 2, e[t].shape[0] = ti.cols, e[t].shape[1] = ti.rows;
        else e[t].ndim = 2, e[t].shape[0] = ti.rows, e[t].shape[1] = ti.cols;
        e[t].bytes = 4 * ti.rows * ti.cols;
    }
    for (int l = 0; l < c->n_layer; l++) {
        gf_hf_entry *b = &e[gf_n_tensors(c) + l];
        snprintf(b->name, sizeof b->name, "h.%d.attn.bias", l);
        b->t = -1 - l, b->ndim = 4;
        b->shape[0] = b->shape[1] = 1, b->shape[2] = b->shape[3] = c->block;
        b->bytes = 4 * c->block * c->block;
    }
    qsort(e, (size_t)n, sizeof *e, gf_hf_cmp);
    size_t len = (size_t)snprintf(json, cap, "{\"__metadata__\":{\"format\":\"pt\"}");
    int64_t off = 0;
    for (int k = 0; k < n; k++) {
        len += (size_t)snprintf(json + len, cap - len, ",\"%s\":{\"dtype\":\"F32\",\"shape\":[",
                                e[k].name);
        for (int d = 0; d < e[k].ndim; d++)
            len += (size_t)snprintf(json + len, cap - len, "%s%" PRId64, d ? "," : "", e[k].shape[d]);
        len += (size_t)snprintf(json + len, cap - len, "],\"data_offsets\":[%" PRId64 ",%" PRId64 "]}",
                                off, off + e[k].bytes);
        off += e[k].bytes;
    }
    json[len++] = '}';
    while (len % 8) json[len++] = ' ';
    gf_out *o = gf_open(path);
    if (!o) {
        free(e), free(json);
        return -1;
    }
    unsigned char b8[8];
    for (int k = 0; k < 8; k++) b8[k] = (unsigned char)((uint64_t)len >> (8 * k));
    gf_put_bytes(o, b8, 8);
    gf_put_bytes(o, json, len);
    for (int k = 0; k < n; k++) {
        if (e[k].t >= 0) { /* block weights are Conv1D's (in, out) */
            gf_put_tensor(o, c, e[k].t, gf_tensor_info(c, e[k].t).kind >= 0);
            continue;
        }
        for (int64_t i = 0; i < c->block; i++)
            for (int64_t j = 0; j < c->block; j++) gf_put_f32(o, j <= i ? 1.0f : 0.0f);
    }
    free(e), free(json);
    return gf_close(o, path);
}

/* llm.c's token file (version 1, uint16 tokens). 0 or -1. */
static inline int gf_write_tokens(const gf_config *c, const char *path) {
    gf_out *o = gf_open(path);
    if (!o) return -1;
    unsigned char b[4];
    for (int k = 0; k < 256; k++) {
        gf_le32(b, k == 0 ? 20240520u : k == 1 ? 1u : k == 2 ? (uint32_t)c->n_tokens : 0u);
        gf_put_bytes(o, b, 4);
    }
    for (int64_t i = 0; i < c->n_tokens; i++) {
        uint64_t tok = (uint64_t)gf_token(c, i);
        b[0] = (unsigned char)tok, b[1] = (unsigned char)(tok >> 8);
        gf_put_bytes(o, b, 2);
    }
    return gf_close(o, path);
}

/* ------------------------------------------- the PyTorch fixture (reading) */
/* tests/fixtures/gpt_torch.txt, written by tests/fixtures/gen_gpt.py:
 *   config <name> seed S batch B seq T lr LR beta1 B1 beta2 B2 eps E wd WD
 *   loss_before X
 *   loss_after X
 *   param <nanoGPT name> numel N grad_norm G update_norm U samples K
 *   <index> <updated value> <gradient>          (K lines)
 *   ...
 *   end
 * norms are L2 over the tensor in f64: grad_norm of the gradient of the
 * first batch's loss, update_norm of (updated - initial). */
#define GF_SAMPLES_MAX 16
typedef struct gf_param_fx {
    char name[96];
    int64_t numel;
    double grad_norm, update_norm;
    int k;
    int64_t idx[GF_SAMPLES_MAX];
    double updated[GF_SAMPLES_MAX], grad[GF_SAMPLES_MAX];
} gf_param_fx;
typedef struct gf_fixture {
    char config[32];
    uint64_t seed;
    int64_t batch, seq;
    double lr, beta1, beta2, eps, wd;
    double loss_before, loss_after;
    int n;
    gf_param_fx *p;
} gf_fixture;

static inline void gf_fixture_free(gf_fixture *fx) {
    if (fx) free(fx->p);
}

/* Reads the block of config `name` from path. 0 or -1 (message on stderr). */
static inline int gf_fixture_read(const char *path, const char *name, gf_fixture *fx) {
    memset(fx, 0, sizeof *fx);
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "gpt_files: cannot open %s\n", path);
        return -1;
    }
    char line[512], word[64];
    int found = 0, cap = 0, bad = 0;
    while (fgets(line, sizeof line, f)) {
        if (!found) {
            char cname[32];
            if (sscanf(line, "config %31s", cname) == 1 && !strcmp(cname, name)) {
                found = 1;
                snprintf(fx->config, sizeof fx->config, "%s", cname);
                if (sscanf(line, "config %*s seed %" SCNu64 " batch %" SCNd64 " seq %" SCNd64
                                 " lr %lf beta1 %lf beta2 %lf eps %lf wd %lf",
                           &fx->seed, &fx->batch, &fx->seq, &fx->lr, &fx->beta1, &fx->beta2,
                           &fx->eps, &fx->wd) != 8)
                    bad = 1;
            }
            continue;
        }
        if (sscanf(line, "%63s", word) != 1) continue;
        if (!strcmp(word, "end")) break;
        if (!strcmp(word, "loss_before")) bad |= sscanf(line, "%*s %lf", &fx->loss_before) != 1;
        else if (!strcmp(word, "loss_after")) bad |= sscanf(line, "%*s %lf", &fx->loss_after) != 1;
        else if (!strcmp(word, "param")) {
            if (fx->n == cap) {
                cap = cap ? 2 * cap : 64;
                gf_param_fx *np = realloc(fx->p, (size_t)cap * sizeof *np);
                if (!np) {
                    bad = 1;
                    break;
                }
                fx->p = np;
            }
            gf_param_fx *p = &fx->p[fx->n++];
            memset(p, 0, sizeof *p);
            if (sscanf(line, "param %95s numel %" SCNd64 " grad_norm %lf update_norm %lf samples %d",
                       p->name, &p->numel, &p->grad_norm, &p->update_norm, &p->k) != 5 ||
                p->k < 0 || p->k > GF_SAMPLES_MAX) {
                bad = 1;
                break;
            }
            for (int s = 0; s < p->k && !bad; s++)
                bad |= !fgets(line, sizeof line, f) ||
                       sscanf(line, "%" SCNd64 " %lf %lf", &p->idx[s], &p->updated[s], &p->grad[s]) != 3;
        }
        if (bad) break;
    }
    fclose(f);
    if (!found || bad || fx->n == 0) {
        fprintf(stderr, "gpt_files: %s: config %s %s\n", path, name, found ? "is malformed" : "not found");
        gf_fixture_free(fx);
        return -1;
    }
    return 0;
}

/* One parameter compared with the fixture: its values before and after the
 * step and its gradient, numel f32 each, row-major. */
typedef struct gf_compare {
    double grad_norm_rel, update_norm_rel; /* |ours - torch| / torch (L2 norms, in f64) */
    double worst_sample; /* largest |ours - torch| / tolerance over the sampled values */
    int worst_k;         /* which sample that was */
    int undecided;       /* samples whose gradient sign is not settled (r >= 1 below) */
} gf_compare;

/* At AdamW's first step (m = (1-b1) g, v = (1-b2) g^2, both bias-corrected
 * back to g and g^2) an element moves by -lr g / (|g| + eps) (after the
 * decay p *= 1 - lr wd): about lr sign(g). Its derivative in g is
 * -lr eps / (|g| + eps)^2, so when two gradients of one sign differ by a
 * relative r (of torch's), the updated values differ by at most lr r / 4;
 * if r >= 1 the sign itself is rounding noise and they may differ by up to
 * 2 lr. Tolerance per sampled element: 2.5e-7 + lr * min(2, r), where
 * 2.5e-7 is two f32 ulps of the largest weights (layer norm weights, up to
 * 1.125: ulp 1.19e-7) for the rounding of the updated value. It is well
 * below a missed or misplaced weight decay (lr * wd * |p|: 3e-6 for a
 * linear weight of 0.03 at lr 1e-3, wd 0.1). */
static inline gf_compare gf_compare_param(const gf_fixture *fx, const gf_param_fx *p,
                                          const float *before, const float *after,
                                          const float *grad) {
    gf_compare r = {0};
    double gn = 0, un = 0;
    for (int64_t i = 0; i < p->numel; i++) {
        double d = (double)after[i] - (double)before[i];
        gn += (double)grad[i] * grad[i];
        un += d * d;
    }
    gn = sqrt(gn), un = sqrt(un);
    r.grad_norm_rel = p->grad_norm ? fabs(gn - p->grad_norm) / p->grad_norm : gn;
    r.update_norm_rel = p->update_norm ? fabs(un - p->update_norm) / p->update_norm : un;
    for (int s = 0; s < p->k; s++) {
        int64_t i = p->idx[s];
        if (i < 0 || i >= p->numel) {
            r.worst_sample = INFINITY, r.worst_k = s;
            break;
        }
        double gt = p->grad[s], g = grad[i];
        double rl = gt != 0 ? fabs(g - gt) / fabs(gt) : (g != 0 ? 2 : 0);
        if (rl >= 1) r.undecided++;
        double tol = 2.5e-7 + fx->lr * (rl < 2 ? rl : 2);
        double q = fabs((double)after[i] - p->updated[s]) / tol;
        if (!(q <= r.worst_sample)) r.worst_sample = q, r.worst_k = s;
    }
    return r;
}

#endif
