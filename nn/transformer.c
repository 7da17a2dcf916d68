/* transformer.c: the encoder-decoder of The Annotated Transformer, built from
 * the public modules: embeddings with positional encoding, pre-norm encoder
 * and decoder layers with residual connections, final norms, generator. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "nn_internal.h"

#define LN_EPS 1e-5 /* torch.nn.LayerNorm's default */

/* ------------------------------------------------------------ feed-forward */
static int feedforward_init_body(nb_FeedForward *m, nb_params *ps, const char *name, int64_t d_model,
                        int64_t d_ff, double dropout, nb_rng *rng) {
    if (!m) return (nn_error("nb_feedforward_init: module is NULL"), -1);
    if (!(dropout >= 0 && dropout <= 1))
        return (nn_error("nb_feedforward_init: dropout must be in [0, 1], got %g", dropout), -1);
    char buf[512];
    m->dropout = dropout;
    m->activation = NB_ACT_RELU;
    const char *fn = "nb_feedforward_init";
    if (nb_linear_init(&m->w_1, ps, nn_join(fn, buf, sizeof buf, name, "w_1"), d_model, d_ff,
                       true, rng) != 0)
        return -1;
    return nb_linear_init(&m->w_2, ps, nn_join(fn, buf, sizeof buf, name, "w_2"), d_ff, d_model,
                          true, rng);
}

int nb_feedforward_init(nb_FeedForward *m, nb_params *ps, const char *name, int64_t d_model,
                        int64_t d_ff, double dropout, nb_rng *rng) {
    nn_enter();
    return nn_leave_rc("nb_feedforward_init", feedforward_init_body(m, ps, name, d_model, d_ff, dropout, rng));
}

static nb_tensor *activate_body(nb_tensor *x, nb_activation act) {
    if (!nn_input("nb_activate", x, 0)) return NULL;
    switch (act) {
    case NB_ACT_RELU: return nb_relu(x);
    case NB_ACT_GELU: return nb_gelu(x);
    case NB_ACT_GELU_TANH: return nb_gelu_tanh(x);
    case NB_ACT_SILU: return nb_silu(x);
    }
    return nn_error("nb_activate: unknown activation %d (NB_ACT_RELU, NB_ACT_GELU, "
                    "NB_ACT_GELU_TANH or NB_ACT_SILU)", (int)act);
}

nb_tensor *nb_activate(nb_tensor *x, nb_activation act) {
    nn_enter();
    return nn_leave("nb_activate", activate_body(x, act));
}

/* x (B, L, d_model) -> (B, L, d_model) */
static nb_tensor *feedforward_forward_body(const nb_FeedForward *m, nb_tensor *x, bool training,
                                  nb_rng *rng) {
    if (!m) return nn_error("nb_feedforward_forward: module is NULL");
    if (!nn_input("nb_feedforward_forward", x, 0)) return NULL;
    nb_tensor *h = nb_activate(nb_linear_forward(&m->w_1, x), m->activation);
    return nb_linear_forward(&m->w_2, nb_dropout(h, m->dropout, training, rng));
}

nb_tensor *nb_feedforward_forward(const nb_FeedForward *m, nb_tensor *x, bool training,
                                  nb_rng *rng) {
    nn_enter();
    return nn_leave("nb_feedforward_forward", feedforward_forward_body(m, x, training, rng));
}

/* ---------------------------------------------------------------- helpers */
static nb_tensor *positional_encoding_body(int64_t max_len, int64_t d_model, nb_dtype dtype) {
    if (max_len <= 0 || d_model <= 0)
        return nn_error("nb_positional_encoding: sizes must be positive, got max_len %lld, "
                        "d_model %lld", (long long)max_len, (long long)d_model);
    if (dtype != NB_F32 && dtype != NB_F64)
        return nn_error("nb_positional_encoding: dtype must be f32 or f64, got %s",
                        nb_dtype_name(dtype));
    if (max_len > (int64_t)(SIZE_MAX / sizeof(double)) / d_model)
        return nn_error("nb_positional_encoding: max_len %lld x d_model %lld is too large",
                        (long long)max_len, (long long)d_model);
    double *pe = malloc((size_t)(max_len * d_model) * sizeof *pe);
    if (!pe) return nn_error("nb_positional_encoding: out of memory");
    for (int64_t p = 0; p < max_len; p++) {
        for (int64_t i = 0; i < d_model; i += 2) {
            double angle = (double)p * exp((double)i * -(log(10000.0) / (double)d_model));
            pe[p * d_model + i] = sin(angle);
            if (i + 1 < d_model) pe[p * d_model + i + 1] = cos(angle);
        }
    }
    nb_scope_begin();
    nb_tensor *t = nb_to(nb_from_data(NB_F64, NB_SHAPE(max_len, d_model), pe), dtype);
    nb_tensor *kept = t ? nb_persistent(t) : NULL;
    nb_scope_end();
    free(pe);
    return kept;
}

nb_tensor *nb_positional_encoding(int64_t max_len, int64_t d_model, nb_dtype dtype) {
    nn_enter();
    return nn_leave("nb_positional_encoding", positional_encoding_body(max_len, d_model, dtype));
}

static int init_xavier_uniform_body(nb_tensor *t, nb_rng *rng) {
    if (!nn_input("nb_init_xavier_uniform", t, 0)) return -1;
    nb_dtype dt = nb_dtype_of(t);
    if (dt != NB_F32 && dt != NB_F64)
        return (nn_error("nb_init_xavier_uniform: t must be f32 or f64, got %s",
                         nb_dtype_name(dt)), -1);
    int nd = nb_ndim(t);
    if (nd < 2)
        return (nn_error("nb_init_xavier_uniform: needs a tensor of 2 or more dims, got %d", nd),
                -1);
    int64_t receptive = 1;
    for (int i = 2; i < nd; i++) receptive *= nb_shape(t)[i];
    double fan_in = (double)(nb_shape(t)[1] * receptive);
    double fan_out = (double)(nb_shape(t)[0] * receptive);
    double bound = sqrt(6.0 / (fan_in + fan_out));
    nb_scope_begin();
    nb_tensor *u = nb_rand(nb_dtype_of(t), nd, nb_shape(t), rng);
    int rc = nb_copy_into(t, nb_add_scalar(nb_mul_scalar(u, 2 * bound), -bound));
    nb_scope_end();
    return rc;
}

int nb_init_xavier_uniform(nb_tensor *t, nb_rng *rng) {
    nn_enter();
    return nn_leave_rc("nb_init_xavier_uniform", init_xavier_uniform_body(t, rng));
}

/* x + dropout(y): the residual half of every sublayer */
static nb_tensor *residual(nb_tensor *x, nb_tensor *y, double p, bool training, nb_rng *rng) {
    return nb_add(x, nb_dropout(y, p, training, rng));
}

/* ------------------------------------------------------------------ init */
/* "encoder.layers.3.self_attn" into buf */
static const char *layer_part(char *buf, size_t cap, const char *stack, int i, const char *part) {
    snprintf(buf, cap, "%s.layers.%d.%s", stack, i, part);
    return buf;
}

static int init_encoder_layer(nb_EncoderLayer *l, nb_params *ps, int i,
                              const nb_TransformerConfig *c, nb_rng *rng) {
    char b[256];
    const char *e = "encoder";
    if (nb_mha_init(&l->self_attn, ps, layer_part(b, sizeof b, e, i, "self_attn"), c->d_model,
                    c->heads, c->dropout, true, rng) != 0)
        return -1;
    if (nb_feedforward_init(&l->feed_forward, ps, layer_part(b, sizeof b, e, i, "feed_forward"),
                            c->d_model, c->d_ff, c->dropout, rng) != 0)
        return -1;
    if (nb_layernorm_init(&l->norm1, ps, layer_part(b, sizeof b, e, i, "norm1"), c->d_model,
                          LN_EPS) != 0)
        return -1;
    return nb_layernorm_init(&l->norm2, ps, layer_part(b, sizeof b, e, i, "norm2"), c->d_model,
                             LN_EPS);
}

static int init_decoder_layer(nb_DecoderLayer *l, nb_params *ps, int i,
                              const nb_TransformerConfig *c, nb_rng *rng) {
    char b[256];
    const char *d = "decoder";
    nb_MHA *attn[2] = {&l->self_attn, &l->src_attn};
    const char *attn_name[2] = {"self_attn", "src_attn"};
    for (int k = 0; k < 2; k++)
        if (nb_mha_init(attn[k], ps, layer_part(b, sizeof b, d, i, attn_name[k]), c->d_model,
                        c->heads, c->dropout, true, rng) != 0)
            return -1;
    if (nb_feedforward_init(&l->feed_forward, ps, layer_part(b, sizeof b, d, i, "feed_forward"),
                            c->d_model, c->d_ff, c->dropout, rng) != 0)
        return -1;
    nb_LayerNorm *norm[3] = {&l->norm1, &l->norm2, &l->norm3};
    const char *norm_name[3] = {"norm1", "norm2", "norm3"};
    for (int k = 0; k < 3; k++)
        if (nb_layernorm_init(norm[k], ps, layer_part(b, sizeof b, d, i, norm_name[k]),
                              c->d_model, LN_EPS) != 0)
            return -1;
    return 0;
}

static bool config_ok(const nb_TransformerConfig *c) {
    if (c->src_vocab <= 0 || c->tgt_vocab <= 0 || c->d_model <= 0 || c->d_ff <= 0 ||
        c->heads <= 0 || c->layers <= 0 || c->max_len <= 0) {
        nn_error("nb_transformer_init: every size must be positive (vocab %lld/%lld, d_model "
                 "%lld, d_ff %lld, heads %lld, layers %lld, max_len %lld)",
                 (long long)c->src_vocab, (long long)c->tgt_vocab, (long long)c->d_model,
                 (long long)c->d_ff, (long long)c->heads, (long long)c->layers,
                 (long long)c->max_len);
        return false;
    }
    return true;
}

static int transformer_init_body(nb_Transformer *m, nb_params *ps, const nb_TransformerConfig *cfg,
                        nb_rng *rng) {
    if (!m || !ps || !cfg) return (nn_error("nb_transformer_init: NULL argument"), -1);
    memset(m, 0, sizeof *m);
    if (!config_ok(cfg)) return -1;
    m->cfg = *cfg;
    int first = nb_params_count(ps);
    m->encoder = calloc((size_t)cfg->layers, sizeof *m->encoder);
    m->decoder = calloc((size_t)cfg->layers, sizeof *m->decoder);
    if (!m->encoder || !m->decoder) {
        nb_transformer_free(m);
        return (nn_error("nb_transformer_init: out of memory"), -1);
    }
    int rc = nb_embedding_init(&m->src_embed, ps, "src_embed", cfg->src_vocab, cfg->d_model, rng) ||
             nb_embedding_init(&m->tgt_embed, ps, "tgt_embed", cfg->tgt_vocab, cfg->d_model, rng);
    for (int i = 0; !rc && i < cfg->layers; i++)
        rc = init_encoder_layer(&m->encoder[i], ps, i, cfg, rng);
    for (int i = 0; !rc && i < cfg->layers; i++)
        rc = init_decoder_layer(&m->decoder[i], ps, i, cfg, rng);
    rc = rc || nb_layernorm_init(&m->encoder_norm, ps, "encoder.norm", cfg->d_model, LN_EPS) ||
         nb_layernorm_init(&m->decoder_norm, ps, "decoder.norm", cfg->d_model, LN_EPS) ||
         nb_linear_init(&m->generator, ps, "generator", cfg->d_model, cfg->tgt_vocab, true, rng);
    if (!rc && !(m->pe = nb_positional_encoding(cfg->max_len, cfg->d_model, nb_default_dtype())))
        rc = -1;
    /* as make_model: xavier-uniform for every weight of 2 or more dims */
    for (int i = first; !rc && i < nb_params_count(ps); i++) {
        nb_tensor *p = nb_params_at(ps, i, NULL);
        if (nb_ndim(p) > 1) rc = nb_init_xavier_uniform(p, rng);
    }
    if (rc) {
        nb_transformer_free(m);
        return -1;
    }
    return 0;
}

int nb_transformer_init(nb_Transformer *m, nb_params *ps, const nb_TransformerConfig *cfg,
                        nb_rng *rng) {
    nn_enter();
    return nn_leave_rc("nb_transformer_init", transformer_init_body(m, ps, cfg, rng));
}

void nb_transformer_free(nb_Transformer *m) {
    if (!m) return;
    free(m->encoder);
    free(m->decoder);
    nb_free(m->pe);
    m->encoder = NULL;
    m->decoder = NULL;
    m->pe = NULL;
}

/* ---------------------------------------------------------------- forward */
/* tokens (B, L) -> (B, L, d_model): embedding * sqrt(d_model) + pe, dropout */
static nb_tensor *embed(const char *fn, nb_Transformer *m, const nb_Embedding *e,
                        nb_tensor *tokens, int pos, bool training, nb_rng *rng) {
    if (!nn_input(fn, tokens, pos)) return NULL;
    if (nb_ndim(tokens) != 2)
        return nn_error("%s: tokens must be (B, L), got %d dims", fn, nb_ndim(tokens));
    int64_t len = nb_shape(tokens)[1];
    if (len > m->cfg.max_len)
        return nn_error("%s: sequence length %lld exceeds max_len %lld", fn, (long long)len,
                        (long long)m->cfg.max_len);
    nb_tensor *x = nb_mul_scalar(nb_embedding_forward(e, tokens), sqrt((double)m->cfg.d_model));
    x = nb_add(x, nb_narrow(m->pe, 0, 0, len));
    return nb_dropout(x, m->cfg.dropout, training, rng);
}

static nb_tensor *transformer_encode_body(nb_Transformer *m, nb_tensor *src, nb_tensor *src_keep,
                                 bool training, nb_rng *rng) {
    const char *fn = "nb_transformer_encode";
    if (!m) return nn_error("%s: model is NULL", fn);
    if (!nn_opt_input(fn, src_keep, 1)) return NULL;
    double p = m->cfg.dropout;
    nb_tensor *x = embed(fn, m, &m->src_embed, src, 0, training, rng);
    for (int i = 0; i < m->cfg.layers; i++) {
        nb_EncoderLayer *l = &m->encoder[i];
        nb_tensor *h = nb_layernorm_forward(&l->norm1, x);
        l->self_weights = NULL;
        x = residual(x,
                     nb_mha_forward(&l->self_attn, h, h, h, src_keep, training, rng,
                                    m->keep_attention ? &l->self_weights : NULL),
                     p, training, rng);
        h = nb_layernorm_forward(&l->norm2, x);
        x = residual(x, nb_feedforward_forward(&l->feed_forward, h, training, rng), p, training,
                     rng);
    }
    return nb_layernorm_forward(&m->encoder_norm, x);
}

nb_tensor *nb_transformer_encode(nb_Transformer *m, nb_tensor *src, nb_tensor *src_keep,
                                 bool training, nb_rng *rng) {
    nn_enter();
    return nn_leave("nb_transformer_encode", transformer_encode_body(m, src, src_keep, training, rng));
}

static nb_tensor *transformer_decode_body(nb_Transformer *m, nb_tensor *memory, nb_tensor *src_keep,
                                 nb_tensor *tgt, nb_tensor *tgt_keep, bool training,
                                 nb_rng *rng) {
    const char *fn = "nb_transformer_decode";
    if (!m) return nn_error("%s: model is NULL", fn);
    if (!nn_input(fn, memory, 0) || !nn_opt_input(fn, src_keep, 1) ||
        !nn_opt_input(fn, tgt_keep, 3))
        return NULL;
    double p = m->cfg.dropout;
    nb_tensor *x = embed(fn, m, &m->tgt_embed, tgt, 2, training, rng);
    for (int i = 0; i < m->cfg.layers; i++) {
        nb_DecoderLayer *l = &m->decoder[i];
        nb_tensor *h = nb_layernorm_forward(&l->norm1, x);
        l->self_weights = l->src_weights = NULL;
        x = residual(x,
                     nb_mha_forward(&l->self_attn, h, h, h, tgt_keep, training, rng,
                                    m->keep_attention ? &l->self_weights : NULL),
                     p, training, rng);
        h = nb_layernorm_forward(&l->norm2, x);
        x = residual(x,
                     nb_mha_forward(&l->src_attn, h, memory, memory, src_keep, training, rng,
                                    m->keep_attention ? &l->src_weights : NULL),
                     p, training, rng);
        h = nb_layernorm_forward(&l->norm3, x);
        x = residual(x, nb_feedforward_forward(&l->feed_forward, h, training, rng), p, training,
                     rng);
    }
    return nb_layernorm_forward(&m->decoder_norm, x);
}

nb_tensor *nb_transformer_decode(nb_Transformer *m, nb_tensor *memory, nb_tensor *src_keep,
                                 nb_tensor *tgt, nb_tensor *tgt_keep, bool training,
                                 nb_rng *rng) {
    nn_enter();
    return nn_leave("nb_transformer_decode", transformer_decode_body(m, memory, src_keep, tgt, tgt_keep, training, rng));
}

static nb_tensor *transformer_logits_body(nb_Transformer *m, nb_tensor *x) {
    if (!m) return nn_error("nb_transformer_logits: model is NULL");
    if (!nn_input("nb_transformer_logits", x, 0)) return NULL;
    return nb_linear_forward(&m->generator, x);
}

nb_tensor *nb_transformer_logits(nb_Transformer *m, nb_tensor *x) {
    nn_enter();
    return nn_leave("nb_transformer_logits", transformer_logits_body(m, x));
}
