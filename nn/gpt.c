/* gpt.c: GPT-2 as nanoGPT writes it, built from the public modules and ops:
 *
 *   idx (B,T)            wte[idx] + wpe[0..T)                       (B,T,C)
 *   n_layer blocks       x = x + c_proj(attention(split(c_attn(ln_1(x)))))
 *                        x = x + mlp_proj(gelu_tanh(c_fc(ln_2(x))))
 *   head                 lm_head(ln_f(x))                           (B,T,V)
 *
 * Attention: qkv = c_attn(h) (B,T,3C); q, k, v are nb_narrow views of it,
 * each viewed (B,T,H,D) and transposed to (B,H,T,D) (views, no copy), then
 * nb_attention with the causal keep-mask (T,T); the heads merge with a
 * transpose and nb_reshape (a copy) into (B,T,C).
 *
 * Generation keeps each layer's keys and values in a cache (1,H,block,D):
 * a new token runs one position through the blocks, writes its k and v at
 * its position (nb_copy_into a narrowed view of the cache) and attends over
 * the positions so far. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nn_internal.h"

#define GPT_LN_EPS 1e-5
#define GPT_INIT_STD 0.02

struct nb_gpt_cache {
    nb_tensor **k, **v; /* per layer (1, H, block_size, D), persistent */
    /* bf16 generation: bf16 copies of the linear weights, 4 per layer (c_attn,
     * attn.c_proj, c_fc, mlp.c_proj) then lm_head, persistent; made at the first
     * bf16 generation, made again when the weights changed (wb_stale) */
    nb_tensor **wb;
    uint64_t *wb_version; /* each source weight's nb_write_version when copied */
    bool use_bf16;      /* this generation reads wb */
    int64_t pos;        /* positions filled */
    /* nb_gpt_generate is running on the model (on_token may call nabla), and
     * nb_gpt_free was called meanwhile: it takes effect when generation ends */
    bool generating, free_deferred;
};

/* ------------------------------------------------------------------ init */
/* N(0, std) in the default dtype, registered as name; scaled in place, so
 * that making GPT-2's 124M weights needs no second copy of them. */
static nb_tensor *normal_param(nb_params *ps, const char *name, int ndim, const int64_t *shape,
                               double std, nb_rng *rng, bool draw) {
    nb_scope_begin();
    nb_tensor *r = draw ? nb_randn(nb_default_dtype(), ndim, shape, rng)
                        : nb_zeros(nb_default_dtype(), ndim, shape);
    int64_t n = nb_numel(r);
    if (r && nb_dtype_of(r) == NB_F32)
        for (float *d = nb_data(r); n-- > 0; d++) *d = (float)(*d * std);
    else if (r)
        for (double *d = nb_data(r); n-- > 0; d++) *d *= std;
    nb_tensor *p = nb_params_add(ps, name, r);
    nb_scope_end();
    return p;
}

static nb_tensor *const_param(nb_params *ps, const char *name, int64_t n, double value) {
    nb_scope_begin();
    nb_tensor *p = nb_params_add(ps, name, nb_full(nb_default_dtype(), 1, &n, value));
    nb_scope_end();
    return p;
}

/* "<prefix>.<what>" of layer i, e.g. transformer.h.3.attn.c_attn.weight */
static const char *block_name(char *buf, size_t cap, int64_t i, const char *what) {
    int n = snprintf(buf, cap, "transformer.h.%lld.%s", (long long)i, what);
    return n > 0 && (size_t)n < cap ? buf : NULL;
}

/* A linear layer (out, in) of N(0, std) weights and zero biases. */
static int linear(nb_Linear *l, nb_params *ps, int64_t i, const char *what, int64_t in,
                  int64_t out, double std, bool bias, nb_rng *rng, bool draw) {
    char name[256], full[300];
    *l = (nb_Linear){.in_features = in, .out_features = out};
    snprintf(name, sizeof name, "%s.weight", what);
    if (!(l->weight = normal_param(ps, block_name(full, sizeof full, i, name), 2,
                                   (const int64_t[]){out, in}, std, rng, draw)))
        return -1;
    snprintf(name, sizeof name, "%s.bias", what);
    if (bias && !(l->bias = const_param(ps, block_name(full, sizeof full, i, name), out, 0.0)))
        return -1;
    return 0;
}

static int layer_norm(nb_LayerNorm *ln, nb_params *ps, const char *prefix, int64_t i,
                      const char *what, int64_t dim) {
    char name[256], full[300];
    *ln = (nb_LayerNorm){.dim = dim, .eps = GPT_LN_EPS};
    for (int k = 0; k < 2; k++) {
        snprintf(name, sizeof name, "%s.%s", what, k ? "bias" : "weight");
        const char *n = i < 0 ? (snprintf(full, sizeof full, "%s.%s", prefix, name), full)
                              : block_name(full, sizeof full, i, name);
        nb_tensor *p = const_param(ps, n, dim, k ? 0.0 : 1.0);
        if (!p) return -1;
        *(k ? &ln->bias : &ln->weight) = p;
    }
    return 0;
}

static int check_config(const nb_GPTConfig *c) {
    const char *fn = "nb_gpt_init";
    if (c->vocab_size <= 0 || c->block_size <= 0 || c->n_layer <= 0 || c->n_head <= 0 ||
        c->n_embd <= 0)
        return (nn_error("%s: sizes must be positive, got vocab_size %lld, block_size %lld, "
                         "n_layer %lld, n_head %lld, n_embd %lld", fn, (long long)c->vocab_size,
                         (long long)c->block_size, (long long)c->n_layer, (long long)c->n_head,
                         (long long)c->n_embd), -1);
    if (c->n_embd % c->n_head != 0)
        return (nn_error("%s: n_embd %lld is not divisible by n_head %lld", fn,
                         (long long)c->n_embd, (long long)c->n_head), -1);
    if (!(c->dropout >= 0 && c->dropout <= 1))
        return (nn_error("%s: dropout must be in [0, 1], got %g", fn, c->dropout), -1);
    if (c->n_layer > 100000)
        return (nn_error("%s: n_layer %lld is too large", fn, (long long)c->n_layer), -1);
    return 0;
}

static int gpt_init_body(nb_GPT *m, nb_params *ps, const nb_GPTConfig *cfg, nb_rng *rng,
                         bool draw) {
    if (!m || !ps || !cfg) return (nn_error("nb_gpt_init: model, registry or config is NULL"), -1);
    *m = (nb_GPT){0};
    if (check_config(cfg)) return -1;
    m->cfg = *cfg;
    m->ps = ps;
    int64_t C = cfg->n_embd, V = cfg->vocab_size, L = cfg->n_layer;
    double std = GPT_INIT_STD, proj_std = GPT_INIT_STD / sqrt(2.0 * (double)L);
    m->wte = (nb_Embedding){.num_embeddings = V, .embedding_dim = C};
    m->wpe = (nb_Embedding){.num_embeddings = cfg->block_size, .embedding_dim = C};
    if (!(m->wte.weight = normal_param(ps, "transformer.wte.weight", NB_SHAPE(V, C), std, rng, draw)) ||
        !(m->wpe.weight = normal_param(ps, "transformer.wpe.weight",
                                       NB_SHAPE(cfg->block_size, C), std, rng, draw)))
        return -1;
    if (!(m->h = calloc((size_t)L, sizeof *m->h))) return (nn_error("nb_gpt_init: out of memory"), -1);
    for (int64_t i = 0; i < L; i++) {
        nb_GPTBlock *b = &m->h[i];
        if (layer_norm(&b->ln_1, ps, NULL, i, "ln_1", C) ||
            linear(&b->c_attn, ps, i, "attn.c_attn", C, 3 * C, std, cfg->bias, rng, draw) ||
            linear(&b->attn_proj, ps, i, "attn.c_proj", C, C, proj_std, cfg->bias, rng, draw) ||
            layer_norm(&b->ln_2, ps, NULL, i, "ln_2", C) ||
            linear(&b->c_fc, ps, i, "mlp.c_fc", C, 4 * C, std, cfg->bias, rng, draw) ||
            linear(&b->mlp_proj, ps, i, "mlp.c_proj", 4 * C, C, proj_std, cfg->bias, rng, draw))
            return -1;
    }
    if (layer_norm(&m->ln_f, ps, "transformer", -1, "ln_f", C)) return -1;
    m->lm_head = (nb_Linear){.in_features = C, .out_features = V};
    if (cfg->tie_weights) m->lm_head.weight = m->wte.weight;
    else if (!(m->lm_head.weight = normal_param(ps, "lm_head.weight", NB_SHAPE(V, C), std, rng, draw)))
        return -1;
    return 0;
}

int nn_gpt_make(nb_GPT *m, nb_params *ps, const nb_GPTConfig *cfg, nb_rng *rng, bool draw) {
    int rc = gpt_init_body(m, ps, cfg, rng, draw);
    if (rc != 0 && m) nb_gpt_free(m);
    return rc;
}

int nb_gpt_init(nb_GPT *m, nb_params *ps, const nb_GPTConfig *cfg, nb_rng *rng) {
    nn_enter();
    return nn_leave_rc("nb_gpt_init", nn_gpt_make(m, ps, cfg, rng, true));
}

/* The linear weights bf16 generation copies: 4 per layer, then lm_head. */
static int64_t wb_count(const nb_GPT *m) { return 4 * m->cfg.n_layer + 1; }
static nb_tensor *wb_source(const nb_GPT *m, int64_t i) {
    if (i == 4 * m->cfg.n_layer) return m->lm_head.weight;
    const nb_GPTBlock *b = &m->h[i / 4];
    const nb_Linear *l[4] = {&b->c_attn, &b->attn_proj, &b->c_fc, &b->mlp_proj};
    return l[i % 4]->weight;
}

static void wb_free(nb_GPT *m) {
    struct nb_gpt_cache *c = m->cache;
    for (int64_t i = 0; c->wb && i < wb_count(m); i++) nb_free(c->wb[i]);
    free(c->wb);
    free(c->wb_version);
    c->wb = NULL;
    c->wb_version = NULL;
}

static void cache_free(nb_GPT *m) {
    struct nb_gpt_cache *c = m->cache;
    if (!c) return;
    for (int64_t i = 0; i < m->cfg.n_layer; i++) {
        if (c->k) nb_free(c->k[i]);
        if (c->v) nb_free(c->v[i]);
    }
    free(c->k);
    free(c->v);
    wb_free(m);
    free(c);
    m->cache = NULL;
}

void nb_gpt_free(nb_GPT *m) {
    if (!m) return;
    if (m->cache && m->cache->generating) { /* from on_token: generation stops, then frees */
        m->cache->free_deferred = true;
        return;
    }
    cache_free(m);
    free(m->h);
    m->h = NULL;
    free(m->block_ctx);
    m->block_ctx = NULL;
}

/* --------------------------------------------------------------- forward */
static bool check_model(const char *fn, const nb_GPT *m) {
    if (!m) return nn_error("%s: model is NULL", fn), false;
    if (!m->h || !m->wte.weight || !m->lm_head.weight)
        return nn_error("%s: model is not initialized (use nb_gpt_init)", fn), false;
    return true;
}

/* Frees a tensor of this scope and returns next: a step of a chain whose
 * intermediates need not outlive it (the graph keeps what backward reads). */
static nb_tensor *then(nb_tensor *done, nb_tensor *next) {
    nb_free(done);
    return next;
}

/* x w^T + b, f32 (B,T,out): by l's weight, or when wb (l's weight in bf16,
 * for generation) is given, with bf16 products and f32 sums (autocast). */
static nb_tensor *lin(const nb_Linear *l, nb_tensor *x, nb_tensor *wb) {
    if (!wb || !x) return nb_linear_forward(l, x);
    if (nb_autocast_begin(NB_BF16)) return NULL;
    nb_tensor *wt = nb_transpose(wb, 0, 1);
    nb_tensor *y = nb_matmul(x, wt);
    nb_autocast_end();
    nb_free(wt);
    return l->bias ? then(y, nb_add(y, l->bias)) : y;
}

/* x (B,T,C) -> causal self-attention (B,T,C). keep: (T,Lk) or NULL; with a
 * cache (generation), k and v of these T positions are written at pos and
 * the attention reads positions [0, pos + T). */
static nb_tensor *attention(const nb_GPT *m, const nb_GPTBlock *b, nb_tensor *x, nb_tensor *keep,
                            bool training, nb_rng *rng, nb_tensor *kc, nb_tensor *vc, int64_t pos,
                            nb_tensor *const *wb) {
    if (!x) return NULL; /* an earlier step failed: its message stands */
    int64_t B = nb_shape(x)[0], T = nb_shape(x)[1], C = m->cfg.n_embd, H = m->cfg.n_head;
    nb_tensor *qkv = lin(&b->c_attn, x, wb ? wb[0] : NULL); /* (B,T,3C) */
    nb_tensor *hd[3];
    for (int i = 0; i < 3; i++) { /* (B,T,C) -> (B,T,H,D) -> (B,H,T,D), views */
        nb_tensor *part = nb_narrow(qkv, 2, i * C, C);
        part = then(part, nb_view(part, NB_SHAPE(B, T, H, C / H)));
        hd[i] = then(part, nb_transpose(part, 1, 2));
    }
    nb_free(qkv); /* the views hold its storage while they live */
    if (kc) { /* generation: append to the cache, attend over all of it */
        nb_tensor *kd = nb_narrow(kc, 2, pos, T), *vd = nb_narrow(vc, 2, pos, T);
        bool ok = nb_copy_into(kd, hd[1]) == 0 && nb_copy_into(vd, hd[2]) == 0;
        nb_free(kd);
        nb_free(vd);
        if (!ok) return NULL;
        hd[1] = then(hd[1], nb_narrow(kc, 2, 0, pos + T));
        hd[2] = then(hd[2], nb_narrow(vc, 2, 0, pos + T));
    }
    nb_tensor *y = nb_attention(hd[0], hd[1], hd[2], keep, m->cfg.dropout, training, rng, NULL);
    for (int i = 0; i < 3; i++) nb_free(hd[i]);
    y = then(y, nb_transpose(y, 1, 2));
    y = then(y, nb_reshape(y, NB_SHAPE(B, T, C))); /* merge heads (a copy) */
    y = then(y, lin(&b->attn_proj, y, wb ? wb[1] : NULL));
    return m->cfg.dropout > 0 && training ? then(y, nb_dropout(y, m->cfg.dropout, true, rng)) : y;
}

static nb_tensor *mlp(const nb_GPT *m, const nb_GPTBlock *b, nb_tensor *x, bool training,
                      nb_rng *rng, nb_tensor *const *wb) {
    nb_tensor *h = lin(&b->c_fc, x, wb ? wb[2] : NULL);
    h = then(h, nb_gelu_tanh(h));
    h = then(h, lin(&b->mlp_proj, h, wb ? wb[3] : NULL));
    return m->cfg.dropout > 0 && training ? then(h, nb_dropout(h, m->cfg.dropout, true, rng)) : h;
}

/* x + f(x) for a block's branch, freeing x, the branch's input and output */
static nb_tensor *residual(nb_tensor *x, nb_tensor *branch_in, nb_tensor *branch_out) {
    nb_tensor *y = nb_add(x, branch_out);
    nb_free(x);
    nb_free(branch_in);
    nb_free(branch_out);
    return y;
}

/* Every token of idx (any shape, NB_I64) in [0, V): true, or false with a message. */
static bool check_tokens(const char *fn, const char *what, nb_tensor *t, int64_t V, bool ignore) {
    nb_scope_begin();
    nb_tensor *c = nb_contiguous(t);
    const int64_t *p = nb_data(c);
    bool ok = c != NULL;
    for (int64_t i = 0; ok && i < nb_numel(c); i++)
        if ((p[i] < 0 || p[i] >= V) && !(ignore && p[i] == -1)) {
            nn_error("%s: %s %lld at position %lld is out of range for vocab_size %lld (valid: "
                     "0..%lld%s)", fn, what, (long long)p[i], (long long)i, (long long)V,
                     (long long)V - 1, ignore ? ", or -1 to ignore" : "");
            ok = false;
        }
    nb_scope_end();
    return ok;
}

static bool check_idx(const char *fn, const nb_GPT *m, nb_tensor *idx, const char *what,
                      bool ignore) {
    char s[128];
    if (nb_dtype_of(idx) != NB_I64 || nb_ndim(idx) != 2)
        return nn_error("%s: %s must be i64 (B, T), got %s %s", fn, what,
                        nb_dtype_name(nb_dtype_of(idx)), NN_SHAPE(s, idx)), false;
    int64_t T = nb_shape(idx)[1];
    if (T < 1 || T > m->cfg.block_size)
        return nn_error("%s: %s has T = %lld; it must be in 1..block_size %lld", fn, what,
                        (long long)T, (long long)m->cfg.block_size), false;
    return check_tokens(fn, what, idx, m->cfg.vocab_size, ignore);
}

/* Block i on x (B,T,C) -> (B,T,C); x stays the caller's (not freed). */
static nb_tensor *block(const nb_GPT *m, int64_t i, nb_tensor *x, nb_tensor *keep, bool training,
                        nb_rng *rng, struct nb_gpt_cache *c) {
    const nb_GPTBlock *b = &m->h[i];
    int64_t pos = c ? c->pos : 0;
    nb_tensor *const *wb = c && c->use_bf16 ? c->wb + 4 * i : NULL;
    nb_tensor *h = nb_layernorm_forward(&b->ln_1, x);
    nb_tensor *a = attention(m, b, h, keep, training, rng, c ? c->k[i] : NULL,
                             c ? c->v[i] : NULL, pos, wb);
    nb_tensor *y = nb_add(x, a);
    nb_free(h);
    nb_free(a);
    h = nb_layernorm_forward(&b->ln_2, y);
    return residual(y, h, mlp(m, b, h, training, rng, wb));
}

/* nb_checkpoint's function: block ctx->i on inputs[0], masked by inputs[1].
 * Its context must live until backward: the model keeps one per block and
 * training flag (the rng of the latest forward is noted there; a backward
 * after a forward with another stream fails: nb_checkpoint checks draws). */
typedef struct nb_gpt_block_ctx {
    const nb_GPT *m;
    int64_t i;
    bool training;
    nb_rng *rng;
} block_ctx;

static block_ctx *block_ctx_of(nb_GPT *m, int64_t i, bool training, nb_rng *rng) {
    if (!m->block_ctx && !(m->block_ctx = calloc(2 * (size_t)m->cfg.n_layer, sizeof *m->block_ctx)))
        return nn_error("nb_gpt: out of memory"), NULL;
    block_ctx *b = &m->block_ctx[2 * i + training];
    *b = (block_ctx){m, i, training, rng};
    return b;
}

static nb_tensor *checkpointed_block(nb_tensor **inputs, int n, void *ctx) {
    const block_ctx *b = ctx;
    (void)n;
    return block(b->m, b->i, inputs[0], inputs[1], b->training, b->rng, NULL);
}

/* idx (B,T) at positions [pos, pos+T) -> final hidden states ln_f(x) (B,T,C) */
static nb_tensor *trunk(nb_GPT *m, nb_tensor *idx, bool training, nb_rng *rng,
                        struct nb_gpt_cache *c, nb_tensor *keep) {
    int64_t T = nb_shape(idx)[1], pos = c ? c->pos : 0;
    nb_tensor *positions = nb_arange(NB_I64, T);
    if (pos > 0) positions = nb_narrow(nb_arange(NB_I64, pos + T), 0, pos, T);
    nb_tensor *tok = nb_embedding(m->wte.weight, idx), *pe = nb_embedding(m->wpe.weight, positions);
    nb_tensor *x = nb_add(tok, pe);
    nb_free(tok);
    nb_free(pe);
    nb_free(positions);
    if (m->cfg.dropout > 0 && training) x = then(x, nb_dropout(x, m->cfg.dropout, true, rng));
    /* checkpointed: the mask is an input, so that it outlives this call
     * for the blocks' second run in backward */
    bool checkpoint = m->checkpoint && !c && nb_grad_enabled();
    for (int64_t i = 0; x && i < m->cfg.n_layer; i++) {
        nb_tensor *in[2] = {x, keep};
        block_ctx *bc = checkpoint ? block_ctx_of(m, i, training, rng) : NULL;
        x = then(x, !checkpoint ? block(m, i, x, keep, training, rng, c)
                    : bc        ? nb_checkpoint(checkpointed_block, bc, 2, in)
                                : NULL);
    }
    return then(x, nb_layernorm_forward(&m->ln_f, x));
}

static nb_tensor *gpt_forward_body(nb_GPT *m, nb_tensor *idx, bool training, nb_rng *rng) {
    const char *fn = "nb_gpt_forward";
    if (!check_model(fn, m) || !nn_input(fn, idx, 0) || !check_idx(fn, m, idx, "idx", false))
        return NULL;
    int64_t T = nb_shape(idx)[1];
    nb_tensor *keep = nb_tril_mask(T, T);
    nb_tensor *x = trunk(m, idx, training, rng, NULL, keep);
    nb_free(keep);
    return then(x, nb_linear(x, m->lm_head.weight, NULL));
}

nb_tensor *nb_gpt_forward(nb_GPT *m, nb_tensor *idx, bool training, nb_rng *rng) {
    nn_enter();
    return nn_leave("nb_gpt_forward", gpt_forward_body(m, idx, training, rng));
}

static nb_tensor *gpt_loss_body(nb_GPT *m, nb_tensor *idx, nb_tensor *targets, bool training,
                                nb_rng *rng) {
    const char *fn = "nb_gpt_loss";
    char s1[128], s2[128];
    if (!check_model(fn, m) || !nn_input(fn, idx, 0) || !nn_input(fn, targets, 1) ||
        !check_idx(fn, m, idx, "idx", false))
        return NULL;
    if (nb_dtype_of(targets) != NB_I64 || nb_ndim(targets) != 2 ||
        nb_shape(targets)[0] != nb_shape(idx)[0] || nb_shape(targets)[1] != nb_shape(idx)[1])
        return nn_error("%s: targets %s %s must be i64 of idx's shape %s", fn,
                        nb_dtype_name(nb_dtype_of(targets)), NN_SHAPE(s1, targets),
                        NN_SHAPE(s2, idx));
    if (!check_tokens(fn, "target", targets, m->cfg.vocab_size, true)) return NULL;
    int64_t N = nb_numel(idx), V = m->cfg.vocab_size;
    nb_tensor *logits = gpt_forward_body(m, idx, training, rng);
    nb_tensor *flat = then(logits, nb_view(logits, NB_SHAPE(N, V)));
    nb_tensor *t = nb_reshape(targets, NB_SHAPE(N));
    nb_tensor *loss = nb_cross_entropy(flat, t, -1, 0.0);
    nb_free(flat);
    nb_free(t);
    return loss;
}

nb_tensor *nb_gpt_loss(nb_GPT *m, nb_tensor *idx, nb_tensor *targets, bool training, nb_rng *rng) {
    nn_enter();
    return nn_leave("nb_gpt_loss", gpt_loss_body(m, idx, targets, training, rng));
}

/* ---------------------------------------------------------- weight decay */
static const char *const decayed[] = {"attn.c_attn.weight", "attn.c_proj.weight",
                                      "mlp.c_fc.weight", "mlp.c_proj.weight"};

static int gpt_decays_body(const nb_GPT *m, const char *name) {
    const char *fn = "nb_gpt_decays";
    if (!check_model(fn, m)) return -1;
    if (!name) return (nn_error("%s: name is NULL", fn), -1);
    char full[300];
    for (int64_t i = 0; i < m->cfg.n_layer; i++)
        for (int k = 0; k < 4; k++)
            if (!strcmp(name, block_name(full, sizeof full, i, decayed[k]))) return 1;
    if (!m->cfg.tie_weights && !strcmp(name, "lm_head.weight")) return 1;
    if (m->ps && nb_params_get(m->ps, name)) return 0;
    return (nn_error("%s: the model has no parameter \"%s\"", fn, name), -1);
}

int nb_gpt_decays(const nb_GPT *m, const char *name) {
    nn_enter();
    int rc = gpt_decays_body(m, name);
    return nn_leave_rc("nb_gpt_decays", rc < 0 ? rc : 0) < 0 ? -1 : rc;
}

static int gpt_set_weight_decay_body(const nb_GPT *m, nb_optim *opt, double wd) {
    const char *fn = "nb_gpt_set_weight_decay";
    if (!check_model(fn, m)) return -1;
    if (!opt) return (nn_null(fn), -1);
    char name[300];
    /* check the value and every name first: an error changes nothing */
    if (!(wd >= 0) || isinf(wd))
        return (nn_error("%s: invalid weight_decay %g (must be >= 0 and finite)", fn, wd), -1);
    for (int64_t i = 0; i < m->cfg.n_layer; i++)
        for (int k = 0; k < 4; k++)
            if (isnan(nb_optim_weight_decay(opt, block_name(name, sizeof name, i, decayed[k]))))
                return (nn_error("%s: the optimizer has no parameter \"%s\" (make it from the "
                                 "model's registry)", fn, name), -1);
    if (!m->cfg.tie_weights && isnan(nb_optim_weight_decay(opt, "lm_head.weight")))
        return (nn_error("%s: the optimizer has no parameter \"lm_head.weight\" (make it from "
                         "the model's registry)", fn), -1);
    if (nb_optim_set_weight_decay(opt, NULL, 0.0)) return -1;
    for (int64_t i = 0; i < m->cfg.n_layer; i++)
        for (int k = 0; k < 4; k++)
            if (nb_optim_set_weight_decay(opt, block_name(name, sizeof name, i, decayed[k]), wd))
                return -1;
    if (!m->cfg.tie_weights && nb_optim_set_weight_decay(opt, "lm_head.weight", wd)) return -1;
    return 0;
}

int nb_gpt_set_weight_decay(const nb_GPT *m, nb_optim *opt, double weight_decay) {
    nn_enter();
    return nn_leave_rc("nb_gpt_set_weight_decay", gpt_set_weight_decay_body(m, opt, weight_decay));
}

/* ------------------------------------------------------------ generation */
static int cache_make(nb_GPT *m) {
    if (m->cache) return 0;
    int64_t L = m->cfg.n_layer, H = m->cfg.n_head, D = m->cfg.n_embd / H;
    struct nb_gpt_cache *c = calloc(1, sizeof *c);
    if (!c) return (nn_error("nb_gpt_generate: out of memory"), -1);
    m->cache = c;
    c->k = calloc((size_t)L, sizeof *c->k);
    c->v = calloc((size_t)L, sizeof *c->v);
    if (!c->k || !c->v) return (cache_free(m), nn_error("nb_gpt_generate: out of memory"), -1);
    nb_dtype dt = nb_dtype_of(m->wte.weight);
    nb_scope_begin();
    for (int64_t i = 0; i < L; i++) {
        nb_tensor *k = nb_zeros(dt, NB_SHAPE(1, H, m->cfg.block_size, D));
        nb_tensor *v = nb_zeros(dt, NB_SHAPE(1, H, m->cfg.block_size, D));
        c->k[i] = k ? nb_persistent(k) : NULL;
        c->v[i] = v ? nb_persistent(v) : NULL;
    }
    nb_scope_end();
    for (int64_t i = 0; i < L; i++)
        if (!c->k[i] || !c->v[i]) return (cache_free(m), -1);
    return 0;
}

/* Whether copy (bf16) still matches w: w not written since it was made
 * (nb_write_version: optimizer steps, loads, nb_copy_into, nb_mark_modified)
 * and, against raw writes through nb_data that were not marked, sampled
 * elements (61 spread over w, and the last) compared after rounding. */
static bool wb_matches(nb_tensor *w, nb_tensor *copy, uint64_t version) {
    if (!copy || nb_numel(copy) != nb_numel(w) || nb_write_version(w) != version) return false;
    nb_scope_begin();
    int64_t n = nb_numel(w);
    nb_tensor *wf = nb_reshape(w, NB_SHAPE(n)), *cf = nb_reshape(copy, NB_SHAPE(n));
    bool same = wf && cf;
    for (int64_t s = 0; same && s <= 61; s++) {
        int64_t i = s == 61 ? n - 1 : s * (n / 61);
        nb_tensor *a = nb_to(nb_to(nb_narrow(wf, 0, i, 1), NB_BF16), NB_F32);
        nb_tensor *b = nb_to(nb_narrow(cf, 0, i, 1), NB_F32);
        same = a && b && nb_item(a) == nb_item(b); /* (a NaN weight: made again each time) */
    }
    nb_scope_end();
    return same;
}

/* The bf16 copies of the linear weights (made, or made again when stale). */
static int wb_make(nb_GPT *m) {
    struct nb_gpt_cache *c = m->cache;
    int64_t n = wb_count(m);
    if (c->wb) {
        bool fresh = true;
        for (int64_t i = 0; fresh && i < n; i++)
            fresh = wb_matches(wb_source(m, i), c->wb[i], c->wb_version[i]);
        if (fresh) return 0;
        wb_free(m);
    }
    c->wb = calloc((size_t)n, sizeof *c->wb);
    c->wb_version = calloc((size_t)n, sizeof *c->wb_version);
    if (!c->wb || !c->wb_version) return (wb_free(m), nn_error("nb_gpt_generate: out of memory"), -1);
    nb_scope_begin();
    for (int64_t i = 0; i < n; i++) {
        c->wb_version[i] = nb_write_version(wb_source(m, i));
        nb_tensor *w = nb_to(wb_source(m, i), NB_BF16);
        c->wb[i] = w ? nb_persistent(w) : NULL;
    }
    nb_scope_end();
    for (int64_t i = 0; i < n; i++)
        if (!c->wb[i]) return (wb_free(m), -1);
    return 0;
}

/* Runs tokens[0..n) at the cache's next positions; the logits (V) of the
 * last one, in the current scope. Keep-mask (n, pos+n): position pos+i sees
 * positions up to pos+i. */
static nb_tensor *feed(nb_GPT *m, const int64_t *tokens, int64_t n) {
    struct nb_gpt_cache *c = m->cache;
    int64_t pos = c->pos, Lk = pos + n;
    nb_tensor *keep = NULL;
    if (n > 1) {
        bool *k = malloc((size_t)(n * Lk));
        if (!k) return nn_error("nb_gpt_generate: out of memory");
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < Lk; j++) k[i * Lk + j] = j <= pos + i;
        keep = nb_from_data(NB_BOOL, NB_SHAPE(n, Lk), k);
        free(k);
        if (!keep) return NULL;
    }
    nb_tensor *idx = nb_from_data(NB_I64, NB_SHAPE(1, n), tokens);
    nb_tensor *x = trunk(m, idx, false, NULL, c, keep);
    nb_tensor *last = nb_select(nb_select(x, 0, 0), 0, n - 1); /* (C) */
    nb_tensor *logits;                                        /* (V) */
    if (c->use_bf16) {
        if (nb_autocast_begin(NB_BF16)) return NULL;
        logits = nb_matmul(c->wb[4 * m->cfg.n_layer], last);
        nb_autocast_end();
    } else {
        logits = nb_matmul(m->lm_head.weight, last);
    }
    if (logits) c->pos = Lk;
    return logits;
}

/* The logits divided by the temperature, or NULL with a message naming the
 * temperature when that overflows (a tiny temperature: softmax would then
 * be inf - inf, NaN probabilities). */
static nb_tensor *tempered(nb_tensor *logits, double temperature) {
    nb_tensor *z = nb_mul_scalar(logits, 1.0 / temperature);
    nb_tensor *big = nb_max(nb_abs(z), 0, false), *raw = nb_max(nb_abs(logits), 0, false);
    if (!big || !raw) return NULL;
    double zmax = nb_item(big), lmax = nb_item(raw);
    if (isfinite(zmax) || !isfinite(lmax)) return z;
    return nn_error("nb_gpt_generate: temperature %g is too small: the largest logit, %g, divided "
                    "by it overflows %s; use a temperature of at least %.3g, or greedy decoding",
                    temperature, lmax, nb_dtype_name(nb_dtype_of(z)),
                    lmax / (nb_dtype_of(z) == NB_F64 ? DBL_MAX : FLT_MAX));
}

/* One token from logits (V) */
static int64_t sample(nb_tensor *logits, const nb_gpt_sample_opts *o, nb_rng *rng) {
    nb_tensor *t;
    if (o->greedy) {
        t = nb_argmax(logits, 0, false);
        return t ? (int64_t)nb_item(t) : -1;
    }
    nb_tensor *z = tempered(logits, o->temperature);
    if (!z) return -1;
    int64_t V = nb_numel(logits);
    if (o->top_k > 0 && o->top_k < V) { /* below the k-th largest: -inf */
        nb_tensor *kth = nb_narrow(nb_topk(z, o->top_k, 0, true, true, NULL), 0, o->top_k - 1, 1);
        z = nb_masked_fill(z, nb_lt(z, kth), -INFINITY);
    }
    t = nb_multinomial(nb_softmax(z, 0), 1, false, rng);
    return t ? (int64_t)nb_item(t) : -1;
}

/* The history: the last tokens, of which the model has cached [0, from);
 * hist[from..len) is not cached yet. Holds at most 2 * block tokens: older
 * ones are never fed again (a refill re-encodes at most block/2), so a
 * generation of any length needs no more memory than that. */
typedef struct {
    int64_t *v, len, from, cap, block;
} history;

static void hist_push(history *h, int64_t tok) {
    if (h->len == h->cap) { /* keep the last block tokens */
        int64_t drop = h->len - h->block;
        memmove(h->v, h->v + drop, (size_t)h->block * sizeof *h->v);
        h->len -= drop;
        h->from -= drop;
    }
    h->v[h->len++] = tok;
}

/* on_token, under the callback rule: 1 go on, 0 stop (asked), -1 failed
 * (message set). */
static int call_on_token(nb_GPT *m, bool (*on_token)(int64_t, void *), void *user, int64_t tok,
                         int64_t done) {
    if (!on_token) return 1;
    nb_GPT before = *m;
    int frame = nb_callback_begin("nb_gpt_generate", "on_token");
    if (frame < 0) return -1;
    int nest = nn_suspend();
    bool go_on = on_token(tok, user);
    nn_resume(nest);
    if (nb_callback_end(frame) != 0) return -1;
    if (m->cache != before.cache || m->h != before.h) { /* nb_gpt_init over it: ours goes */
        before.cache->generating = false;
        nb_gpt_free(&before);
        nn_error("nb_gpt_generate: on_token re-initialized the model being generated from (after "
                 "%lld tokens); generation stopped there", (long long)done);
        return -1;
    }
    if (nb_check_input("nb_gpt_generate", m->wte.weight, 0) != 0 ||
        nb_check_input("nb_gpt_generate", m->lm_head.weight, 0) != 0)
        return (nn_error("nb_gpt_generate: on_token freed the model's parameters (nb_params_free "
                         "on its registry) after %lld tokens; generation stopped there",
                         (long long)done), -1);
    if (m->cache->free_deferred)
        return (nn_error("nb_gpt_generate: on_token freed the model (nb_gpt_free) after %lld "
                         "tokens; generation stopped there and the model is freed now",
                         (long long)done), -1);
    return go_on ? 1 : 0;
}

static int64_t gpt_generate_body(nb_GPT *m, const int64_t *prompt, int64_t n_prompt,
                                 int64_t n_new, const nb_gpt_sample_opts *opts, nb_rng *rng,
                                 int64_t *out, bool (*on_token)(int64_t, void *), void *user) {
    const char *fn = "nb_gpt_generate";
    if (!check_model(fn, m)) return -1;
    nb_gpt_sample_opts o = opts ? *opts : (nb_gpt_sample_opts){.temperature = 1.0};
    if (!prompt || n_prompt < 1)
        return (nn_error("%s: the prompt must have at least 1 token, got %lld", fn,
                         (long long)n_prompt), -1);
    if (n_new < 0 || (n_new > 0 && !out && !on_token))
        return (nn_error("%s: n_new must be >= 0, and out or on_token must take the tokens; got "
                         "n_new %lld, out NULL, on_token NULL", fn, (long long)n_new), -1);
    if (!o.greedy && !(o.temperature > 0 && isfinite(o.temperature)))
        return (nn_error("%s: temperature must be > 0 and finite, got %g", fn, o.temperature), -1);
    if (!o.greedy && o.top_k < 0)
        return (nn_error("%s: top_k must be >= 0 (0 = all tokens), got %lld", fn,
                         (long long)o.top_k), -1);
    int64_t V = m->cfg.vocab_size, block = m->cfg.block_size;
    for (int64_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= V)
            return (nn_error("%s: prompt token %lld at position %lld is out of range for "
                             "vocab_size %lld", fn, (long long)prompt[i], (long long)i,
                             (long long)V), -1);
    if (m->cache && m->cache->generating)
        return (nn_error("%s: the model is generating already (an on_token called "
                         "nb_gpt_generate on it); one generation at a time per model", fn), -1);
    if (o.dtype != 0 && o.dtype != NB_F32 && o.dtype != NB_BF16)
        return (nn_error("%s: dtype must be 0 or f32 (the model's weights) or bf16 (bf16 copies "
                         "of the linear weights), got %s", fn, nb_dtype_name(o.dtype)), -1);
    bool bf16 = o.dtype == NB_BF16;
    if (bf16 && nb_dtype_of(m->lm_head.weight) != NB_F32)
        return (nn_error("%s: dtype bf16 needs an f32 model, got %s weights", fn,
                         nb_dtype_name(nb_dtype_of(m->lm_head.weight))), -1);
    if (cache_make(m) || (bf16 && wb_make(m))) return -1;
    m->cache->use_bf16 = bf16;
    int64_t keep0 = n_prompt < block ? n_prompt : block;
    history h = {.v = malloc((size_t)(2 * block) * sizeof *h.v), .cap = 2 * block, .block = block};
    if (!h.v) return (nn_error("%s: out of memory", fn), -1);
    memcpy(h.v, prompt + n_prompt - keep0, (size_t)keep0 * sizeof *h.v);
    h.len = keep0;
    int64_t done = 0;
    bool was = nb_grad_enabled(), failed = false, stop = false;
    struct nb_gpt_cache *c = m->cache;
    c->pos = 0;
    c->generating = true;
    nb_set_grad_enabled(false); /* on_token's changes are undone after each call */
    while (done < n_new && !stop) {
        nb_scope_begin();
        if (m->cache->pos + (h.len - h.from) > block) {
            /* full: the last half block is re-encoded from position 0, so
             * a refill costs block/2 positions once per block/2 tokens
             * (nanoGPT's crop would re-encode a whole block per token) */
            int64_t keep = block / 2 > 0 ? block / 2 : 1;
            m->cache->pos = 0;
            h.from = h.len - (keep < h.len ? keep : h.len);
        }
        nb_tensor *logits = feed(m, h.v + h.from, h.len - h.from);
        int64_t tok = logits ? sample(logits, &o, rng) : -1;
        nb_scope_end();
        if (tok < 0) {
            failed = true;
            break;
        }
        h.from = h.len;
        hist_push(&h, tok);
        if (out) out[done] = tok;
        done++;
        int go = call_on_token(m, on_token, user, tok, done);
        failed = go < 0;
        stop = go <= 0;
    }
    nb_set_grad_enabled(was);
    free(h.v);
    if (m->cache == c) { /* else re-initialized by on_token, and c freed then */
        c->generating = false;
        if (c->free_deferred) nb_gpt_free(m);
    }
    return failed ? -1 : done;
}

int64_t nb_gpt_generate(nb_GPT *m, const int64_t *prompt, int64_t n_prompt, int64_t n_new,
                        const nb_gpt_sample_opts *opts, nb_rng *rng, int64_t *out,
                        bool (*on_token)(int64_t, void *), void *user) {
    nn_enter();
    int64_t n = gpt_generate_body(m, prompt, n_prompt, n_new, opts, rng, out, on_token, user);
    nn_leave_rc("nb_gpt_generate", n < 0 ? -1 : 0);
    return n;
}
