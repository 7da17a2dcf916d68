/* test_gpt.c: nb_GPT, the decoder-only model as nanoGPT writes it, and the
 * module features it brought: parameter names, order and counts (GPT-2
 * 124M's from the formula), GPT-2's initialisation statistics, forward,
 * loss and gradients against a nanoGPT-style PyTorch model
 * (tests/fixtures/gen_gpt_model.py), weight tying, dropout, finite
 * differences, KV-cache generation against a full-forward reference (also
 * past block_size), sampling options, per-parameter weight decay (AdamW
 * with two parameter groups against PyTorch), nb_activate and a GELU-tanh
 * feed-forward, and every error with its message. Models are tiny (vocab
 * 7-13, n_embd 4-16, 1-2 layers) so the suite stays fast under valgrind. */
#include "test_util.h"

#include <stdlib.h>

static const char *FX = "gpt_model.txt";

#define OK(x) ck_assert_msg((x) != NULL, "%s", nb_last_error() ? nb_last_error() : "(no error)")
#define OK_RC(x) ck_assert_msg((x) == 0, "%s", nb_last_error() ? nb_last_error() : "(no error)")

/* The fixture's model: vocab 11, block 8, 2 layers, 2 heads, n_embd 8, tied. */
static nb_GPTConfig fixture_cfg(void) {
    return (nb_GPTConfig){.vocab_size = 11, .block_size = 8, .n_layer = 2, .n_head = 2,
                          .n_embd = 8, .dropout = 0.0, .bias = true, .tie_weights = true};
}

/* nb_gpt_init with parameters in dtype (the default dtype is restored). */
static void init_dt(nb_GPT *m, nb_params *ps, const nb_GPTConfig *c, uint64_t seed,
                    nb_dtype dt) {
    nb_rng r;
    nb_rng_seed(&r, seed);
    nb_dtype was = nb_default_dtype();
    nb_set_default_dtype(dt);
    int rc = nb_gpt_init(m, ps, c, &r);
    nb_set_default_dtype(was);
    OK_RC(rc);
}
static void init64(nb_GPT *m, nb_params *ps, const nb_GPTConfig *c, uint64_t seed) {
    init_dt(m, ps, c, seed, NB_F64);
}

/* Every parameter of ps from the fixture ("p.<name>"; lm_head.weight from
 * "lm_head_untied", or from wte when head_is_wte). */
static void load_fixture(nb_params *ps, bool head_is_wte) {
    for (int i = 0; i < nb_params_count(ps); i++) {
        const char *name;
        nb_tensor *p = nb_params_at(ps, i, &name);
        char key[160];
        if (!strcmp(name, "lm_head.weight"))
            snprintf(key, sizeof key, "%s", head_is_wte ? "p.transformer.wte.weight" : "lm_head_untied");
        else
            snprintf(key, sizeof key, "p.%s", name);
        OK_RC(nb_copy_into(p, fx(FX, key)));
    }
}

/* Every parameter of ps to random values (layer-norm weights near 1, biases
 * small, others N(0, std)), so that the model's outputs vary with the input. */
static void scramble(nb_params *ps, uint64_t seed, double std) {
    nb_rng r;
    nb_rng_seed(&r, seed);
    for (int i = 0; i < nb_params_count(ps); i++) {
        const char *name;
        nb_tensor *p = nb_params_at(ps, i, &name);
        nb_scope_begin();
        nb_tensor *z = nb_randn(nb_dtype_of(p), nb_ndim(p), nb_shape(p), &r);
        if (strstr(name, "ln_") && strstr(name, ".weight")) z = nb_add_scalar(nb_mul_scalar(z, 0.1), 1.0);
        else z = nb_mul_scalar(z, strstr(name, ".bias") ? 0.1 : std);
        OK_RC(nb_copy_into(p, z));
        nb_scope_end();
    }
}

static nb_tensor *param(nb_params *ps, const char *name) {
    nb_tensor *p = nb_params_get(ps, name);
    ck_assert_msg(p != NULL, "no parameter %s: %s", name, nb_last_error());
    return p;
}

/* ------------------------------------------------- names, order and counts */
static const char *const BLOCK_NAMES[] = {
    "ln_1.weight",      "ln_1.bias",        "attn.c_attn.weight", "attn.c_attn.bias",
    "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",      "ln_2.bias",
    "mlp.c_fc.weight",  "mlp.c_fc.bias",    "mlp.c_proj.weight", "mlp.c_proj.bias"};

/* The size of a block parameter ("attn.c_attn.weight" -> (3C, C)). */
static int block_shape(const char *what, int64_t C, int64_t *shape) {
    if (strstr(what, "ln_")) return shape[0] = C, 1;
    int64_t out = strstr(what, "c_attn") ? 3 * C : strstr(what, "c_fc") ? 4 * C : C;
    int64_t in = strstr(what, "mlp.c_proj") ? 4 * C : C;
    shape[0] = out;
    shape[1] = in;
    return strstr(what, ".bias") ? 1 : 2;
}

/* nanoGPT's parameter count (named_parameters, so a tied lm_head once). Layer
 * norms keep their bias when cfg.bias is false (nabla's layer norms always
 * have one); bias drops the linear layers' biases 3C + C + 4C + C. */
static int64_t gpt_numel(const nb_GPTConfig *c) {
    int64_t C = c->n_embd, V = c->vocab_size;
    int64_t layer = 12 * C * C + 4 * C + (c->bias ? 9 * C : 0);
    return V * C + c->block_size * C + c->n_layer * layer + 2 * C + (c->tie_weights ? 0 : V * C);
}

static void expect_names(const nb_GPTConfig *c) {
    int64_t base = nb_live_tensors();
    nb_params *ps = nb_params_new();
    nb_GPT m;
    OK_RC(nb_gpt_init(&m, ps, c, NULL));
    int64_t C = c->n_embd;
    int i = 0;
    char name[128];
    const char *got;
    nb_tensor *p;
#define EXPECT_PARAM(nm, nd, ...)                                                              \
    do {                                                                                       \
        ck_assert_msg(i < nb_params_count(ps), "only %d parameters, expected %s", i, (nm));    \
        p = nb_params_at(ps, i++, &got);                                                      \
        ck_assert_msg(!strcmp(got, (nm)), "parameter %d is %s, expected %s", i - 1, got, (nm)); \
        const int64_t want_[] = {__VA_ARGS__};                                                 \
        ck_assert_int_eq(nb_ndim(p), (nd));                                                    \
        for (int d_ = 0; d_ < (nd); d_++) ck_assert_int_eq(nb_shape(p)[d_], want_[d_]);        \
        ck_assert(nb_requires_grad(p) && nb_dtype_of(p) == NB_F32);                            \
    } while (0)
    EXPECT_PARAM("transformer.wte.weight", 2, c->vocab_size, C);
    ck_assert_ptr_eq(p, m.wte.weight);
    EXPECT_PARAM("transformer.wpe.weight", 2, c->block_size, C);
    ck_assert_ptr_eq(p, m.wpe.weight);
    for (int64_t l = 0; l < c->n_layer; l++)
        for (size_t k = 0; k < sizeof BLOCK_NAMES / sizeof *BLOCK_NAMES; k++) {
            const char *w = BLOCK_NAMES[k];
            bool linear_bias = !strstr(w, "ln_") && strstr(w, ".bias");
            if (linear_bias && !c->bias) continue;
            int64_t shape[2] = {0, 0};
            int nd = block_shape(w, C, shape);
            snprintf(name, sizeof name, "transformer.h.%lld.%s", (long long)l, w);
            EXPECT_PARAM(name, nd, shape[0], shape[1]);
        }
    EXPECT_PARAM("transformer.ln_f.weight", 1, C);
    EXPECT_PARAM("transformer.ln_f.bias", 1, C);
    if (!c->tie_weights) {
        EXPECT_PARAM("lm_head.weight", 2, c->vocab_size, C);
        ck_assert_ptr_eq(p, m.lm_head.weight);
        ck_assert_ptr_ne(m.lm_head.weight, m.wte.weight);
    } else {
        ck_assert_ptr_eq(m.lm_head.weight, m.wte.weight);
        ck_assert_ptr_null(nb_params_get(ps, "lm_head.weight"));
        nb_clear_error();
    }
#undef EXPECT_PARAM
    ck_assert_int_eq(nb_params_count(ps), i);
    ck_assert_int_eq(nb_params_numel(ps), gpt_numel(c));
    /* the structs point at the registry's tensors */
    int64_t last = c->n_layer - 1;
    snprintf(name, sizeof name, "transformer.h.%lld.mlp.c_fc.weight", (long long)last);
    ck_assert_ptr_eq(m.h[last].c_fc.weight, param(ps, name));
    snprintf(name, sizeof name, "transformer.h.%lld.attn.c_proj.weight", (long long)last);
    ck_assert_ptr_eq(m.h[last].attn_proj.weight, param(ps, name));
    ck_assert_ptr_eq(m.ln_f.weight, param(ps, "transformer.ln_f.weight"));
    if (c->bias) ck_assert_ptr_eq(m.h[0].c_attn.bias, param(ps, "transformer.h.0.attn.c_attn.bias"));
    else ck_assert(!m.h[0].c_attn.bias && !m.h[0].mlp_proj.bias && m.h[0].ln_1.bias);
    ck_assert_ptr_null(m.lm_head.bias);
    ck_assert(m.ps == ps && m.cfg.n_layer == c->n_layer && m.cfg.tie_weights == c->tie_weights);
    ck_assert(m.ln_f.eps == 1e-5 && m.h[0].ln_2.eps == 1e-5);
    nb_gpt_free(&m);
    nb_params_free(ps);
    ck_assert_int_eq(nb_live_tensors(), base);
}

START_TEST(names_order_and_counts) {
    nb_GPTConfig c = {.vocab_size = 13, .block_size = 6, .n_layer = 2, .n_head = 2, .n_embd = 8,
                      .bias = true, .tie_weights = true};
    expect_names(&c); /* 13*8 + 6*8 + 2*(768 + 32 + 72) + 16 = 1912 */
    ck_assert_int_eq(gpt_numel(&c), 1912);
    c.tie_weights = false;
    expect_names(&c);
    ck_assert_int_eq(gpt_numel(&c), 1912 + 13 * 8);
    c.bias = false;
    c.n_layer = 3;
    expect_names(&c);
    c.tie_weights = true;
    c.n_head = 1;
    expect_names(&c);
    /* GPT-2 124M, by the formula (not allocated here) */
    nb_GPTConfig g = NB_GPT2_CONFIG;
    ck_assert_int_eq(gpt_numel(&g), 124439808);
    g.tie_weights = false; /* a separate head adds 50257 x 768 */
    ck_assert_int_eq(gpt_numel(&g), 163037184);
    /* the count is the one PyTorch's named_parameters() gives for the fixture's model */
    nb_GPTConfig fc = fixture_cfg();
    int64_t n = 0;
    nb_params *ps = nb_params_new();
    nb_GPT m;
    OK_RC(nb_gpt_init(&m, ps, &fc, NULL));
    for (int i = 0; i < nb_params_count(ps); i++) {
        const char *name;
        nb_params_at(ps, i, &name);
        char key[160];
        snprintf(key, sizeof key, "p.%s", name);
        n += nb_numel(fx(FX, key));
    }
    ck_assert_int_eq(n, nb_params_numel(ps));
    ck_assert_int_eq(n, gpt_numel(&fc));
    nb_gpt_free(&m);
    nb_params_free(ps);
}
END_TEST

/* ------------------------------------------------------------ initialisation */
static void mean_std(nb_tensor *t, double *mean, double *std) {
    double *v = values(t);
    int64_t n = nb_numel(t);
    double s = 0, ss = 0;
    for (int64_t i = 0; i < n; i++) s += v[i];
    *mean = s / (double)n;
    for (int64_t i = 0; i < n; i++) ss += (v[i] - *mean) * (v[i] - *mean);
    *std = sqrt(ss / (double)(n - 1));
    free(v);
}

static bool all_equal(nb_tensor *t, double want) {
    double *v = values(t);
    bool ok = true;
    for (int64_t i = 0; i < nb_numel(t); i++) ok &= v[i] == want;
    free(v);
    return ok;
}

START_TEST(init_statistics) {
    int64_t base = nb_live_tensors();
    nb_GPTConfig c = {.vocab_size = 64, .block_size = 32, .n_layer = 4, .n_head = 4, .n_embd = 64,
                      .bias = true, .tie_weights = false};
    nb_params *ps = nb_params_new();
    nb_GPT m;
    nb_rng r;
    nb_rng_seed(&r, 2024);
    OK_RC(nb_gpt_init(&m, ps, &c, &r));
    double proj = 0.02 / sqrt(2.0 * 4);
    int normal = 0, zeros = 0, ones = 0;
    for (int i = 0; i < nb_params_count(ps); i++) {
        const char *name;
        nb_tensor *p = nb_params_at(ps, i, &name);
        if (strstr(name, "ln_") && strstr(name, ".weight")) {
            ck_assert_msg(all_equal(p, 1.0), "%s is not all ones", name);
            ones++;
        } else if (strstr(name, ".bias")) {
            ck_assert_msg(all_equal(p, 0.0), "%s is not all zeros", name);
            zeros++;
        } else {
            double want = strstr(name, "c_proj.weight") ? proj : 0.02, mean, std;
            mean_std(p, &mean, &std);
            int64_t n = nb_numel(p);
            /* the sample std of n normals is within ~5/sqrt(2n) of sigma, the mean within 5 sigma/sqrt(n) */
            ck_assert_msg(fabs(std / want - 1) < 5 / sqrt(2.0 * (double)n),
                          "%s: std %.5f, expected %.5f (%lld values)", name, std, want, (long long)n);
            ck_assert_msg(fabs(mean) < 5 * want / sqrt((double)n), "%s: mean %.2e", name, mean);
            normal++;
        }
    }
    /* wte, wpe, lm_head + 4 weights per layer; 2 layer norms per layer + ln_f */
    ck_assert_int_eq(normal, 3 + 4 * 4);
    ck_assert_int_eq(ones, 2 * 4 + 1);
    ck_assert_int_eq(zeros, (2 + 4) * 4 + 1);
    /* the residual projections, pooled over the layers, are much narrower than c_fc */
    double mean, s1, s2;
    mean_std(param(ps, "transformer.h.3.mlp.c_proj.weight"), &mean, &s1);
    mean_std(param(ps, "transformer.h.3.mlp.c_fc.weight"), &mean, &s2);
    ck_assert_msg(fabs(s2 / s1 - sqrt(8.0)) < 0.1, "std ratio %.3f", s2 / s1);
    nb_gpt_free(&m);
    nb_params_free(ps);
    ck_assert_int_eq(nb_live_tensors(), base);
}
END_TEST

/* Same seed: the same weights bit for bit; another seed: every random
 * tensor differs; the global generator (NULL) is reproducible by nb_manual_seed. */
START_TEST(init_seeds) {
    int64_t base = nb_live_tensors();
    nb_GPTConfig c = fixture_cfg();
    nb_params *a = nb_params_new(), *b = nb_params_new(), *d = nb_params_new();
    nb_params *g1 = nb_params_new(), *g2 = nb_params_new();
    nb_GPT ma, mb, md, mg1, mg2;
    init_dt(&ma, a, &c, 7, NB_F32);
    init_dt(&mb, b, &c, 7, NB_F32);
    init_dt(&md, d, &c, 8, NB_F32);
    nb_manual_seed(99);
    OK_RC(nb_gpt_init(&mg1, g1, &c, NULL));
    nb_manual_seed(99);
    OK_RC(nb_gpt_init(&mg2, g2, &c, NULL));
    int differ = 0, random = 0;
    for (int i = 0; i < nb_params_count(a); i++) {
        const char *name;
        nb_tensor *pa = nb_params_at(a, i, &name);
        expect_close(nb_params_at(b, i, NULL), pa, 0, 0);
        expect_close(nb_params_at(g2, i, NULL), nb_params_at(g1, i, NULL), 0, 0);
        if (strstr(name, ".bias") || strstr(name, "ln_")) continue;
        random++;
        double *x = values(pa), *y = values(nb_params_at(d, i, NULL));
        int64_t same = 0;
        for (int64_t k = 0; k < nb_numel(pa); k++) same += x[k] == y[k];
        differ += same == 0;
        free(x);
        free(y);
    }
    ck_assert_int_eq(random, 2 + 4 * 2);
    ck_assert_int_eq(differ, random);
    nb_GPT *ms[] = {&ma, &mb, &md, &mg1, &mg2};
    nb_params *pss[] = {a, b, d, g1, g2};
    for (int i = 0; i < 5; i++) {
        nb_gpt_free(ms[i]);
        nb_params_free(pss[i]);
    }
    ck_assert_int_eq(nb_live_tensors(), base);
}
END_TEST

/* ------------------------------------------------------- against PyTorch */
START_TEST(forward_loss_grads_match_pytorch) {
    nb_tensor *idx = fx(FX, "idx"), *tg = fx(FX, "targets");
    nb_GPTConfig c = fixture_cfg();
    fx(FX, "loss");
    int64_t base = nb_live_tensors();
    nb_params *ps = nb_params_new();
    nb_GPT m;
    init64(&m, ps, &c, 1);
    load_fixture(ps, false);
    nb_scope_begin();
    nb_tensor *logits = nb_gpt_forward(&m, idx, false, NULL);
    OK(logits);
    ck_assert_int_eq(nb_dtype_of(logits), NB_F64);
    expect_close(logits, fx(FX, "logits"), 1e-12, 1e-10);
    /* training with dropout 0 is the same function */
    expect_close(nb_gpt_forward(&m, idx, true, NULL), fx(FX, "logits"), 1e-12, 1e-10);
    nb_tensor *loss = nb_gpt_loss(&m, idx, tg, false, NULL);
    OK(loss);
    ck_assert_int_eq(nb_ndim(loss), 0);
    expect_close(loss, fx(FX, "loss"), 1e-12, 1e-10);
    /* the loss is nb_cross_entropy of the logits with -1 ignored */
    nb_tensor *ce = nb_cross_entropy(nb_reshape(logits, NB_SHAPE(12, 11)),
                                     nb_reshape(tg, NB_SHAPE(12)), -1, 0.0);
    expect_close(loss, ce, 1e-14, 1e-14);
    OK_RC(nb_backward(loss));
    static const char *const graded[] = {
        "transformer.wte.weight", "transformer.wpe.weight", "transformer.h.0.ln_1.bias",
        "transformer.h.0.attn.c_attn.weight", "transformer.h.1.attn.c_proj.bias",
        "transformer.h.1.mlp.c_proj.weight", "transformer.ln_f.weight"};
    for (size_t i = 0; i < sizeof graded / sizeof *graded; i++) {
        char key[160];
        snprintf(key, sizeof key, "g.%s", graded[i]);
        nb_tensor *g = nb_grad(param(ps, graded[i]));
        ck_assert_msg(g != NULL, "no gradient for %s", graded[i]);
        expect_close(g, fx(FX, key), 1e-12, 1e-9);
    }
    /* T = block_size, one sequence */
    expect_close(nb_gpt_forward(&m, fx(FX, "idx_full"), false, NULL), fx(FX, "logits_full"),
                 1e-12, 1e-10);
    nb_scope_end();
    nb_params_zero_grad(ps);
    nb_gpt_free(&m);
    nb_params_free(ps);
    ck_assert_int_eq(nb_live_tensors(), base);
}
END_TEST

START_TEST(untied_and_f32_match_pytorch) {
    nb_tensor *idx = fx(FX, "idx"), *tg = fx(FX, "targets");
    fx(FX, "loss");
    int64_t base = nb_live_tensors();
    nb_GPTConfig c = fixture_cfg();
    c.tie_weights = false;
    nb_params *ps = nb_params_new();
    nb_GPT m;
    init64(&m, ps, &c, 1);
    load_fixture(ps, false);
    nb_scope_begin();
    expect_close(nb_gpt_forward(&m, idx, false, NULL), fx(FX, "logits_untied"), 1e-12, 1e-10);
    expect_close(nb_gpt_loss(&m, idx, tg, false, NULL), fx(FX, "loss_untied"), 1e-12, 1e-10);
    nb_scope_end();
    nb_gpt_free(&m);
    nb_params_free(ps);
    /* the same tied model in f32 */
    c.tie_weights = true;
    ps = nb_params_new();
    init_dt(&m, ps, &c, 1, NB_F32);
    load_fixture(ps, false);
    nb_scope_begin();
    nb_tensor *logits = nb_gpt_forward(&m, idx, false, NULL);
    OK(logits);
    ck_assert_int_eq(nb_dtype_of(logits), NB_F32);
    expect_close(logits, fx(FX, "logits"), 1e-4, 1e-4);
    expect_close(nb_gpt_loss(&m, idx, tg, false, NULL), fx(FX, "loss"), 1e-5, 1e-5);
    nb_scope_end();
    nb_gpt_free(&m);
    nb_params_free(ps);
    ck_assert_int_eq(nb_live_tensors(), base);
}
END_TEST

/* --------------------------------------------------------------- weight tying */
START_TEST(tied_gradient_is_the_sum_and_moves_together) {
    nb_tensor *idx = fx(FX, "idx"), *tg = fx(FX, "targets"), *wte0 = fx(FX, "p.transformer.wte.weight");
    int64_t base = nb_live_tensors();
    nb_GPTConfig c = fixture_cfg();
    nb_params *pt = nb_params_new(), *pu = nb_params_new();
    nb_GPT t, u;
    init64(&t, pt, &c, 1);
    c.tie_weights = false;
    init64(&u, pu, &c, 1);
    load_fixture(pt, true);
    load_fixture(pu, true); /* untied, lm_head = a copy of wte */
    ck_assert_int_eq(nb_params_count(pu), nb_params_count(pt) + 1);
    nb_scope_begin();
    nb_tensor *lt = nb_gpt_loss(&t, idx, tg, false, NULL), *lu = nb_gpt_loss(&u, idx, tg, false, NULL);
    expect_close(lt, lu, 1e-13, 1e-13);
    expect_close(lt, fx(FX, "loss"), 1e-12, 1e-10);
    OK_RC(nb_backward(lt));
    OK_RC(nb_backward(lu));
    nb_tensor *gsum = nb_add(nb_grad(u.wte.weight), nb_grad(u.lm_head.weight));
    expect_close(nb_grad(t.wte.weight), gsum, 1e-12, 1e-10);
    expect_close(nb_grad(t.wte.weight), fx(FX, "g.transformer.wte.weight"), 1e-12, 1e-9);
    /* both uses matter: neither part alone is the tied gradient */
    double *a = values(nb_grad(u.wte.weight)), *b = values(nb_grad(u.lm_head.weight));
    double na = 0, nbb = 0;
    for (int64_t i = 0; i < 88; i++) na += a[i] * a[i], nbb += b[i] * b[i];
    ck_assert(na > 1e-6 && nbb > 1e-6);
    free(a);
    free(b);
    /* one SGD step moves the one tensor by the summed gradient */
    nb_optim *opt = nb_sgd(pt, 0.1, 0.0, 0.0);
    OK(opt);
    nb_optim_step(opt);
    ck_assert_ptr_null(nb_last_error());
    ck_assert_ptr_eq(t.lm_head.weight, t.wte.weight);
    expect_close(t.wte.weight, nb_sub(wte0, nb_mul_scalar(gsum, 0.1)), 1e-14, 1e-13);
    /* the head reads the moved weights: the untied model given every moved
     * weight, wte as both embedding and head, agrees */
    for (int i = 0; i < nb_params_count(pt); i++) {
        const char *name;
        nb_tensor *p = nb_params_at(pt, i, &name);
        OK_RC(nb_copy_into(param(pu, name), p));
    }
    OK_RC(nb_copy_into(u.lm_head.weight, t.wte.weight));
    nb_tensor *after = nb_gpt_loss(&t, idx, tg, false, NULL);
    expect_close(after, nb_gpt_loss(&u, idx, tg, false, NULL), 1e-13, 1e-13);
    ck_assert(nb_item(after) < nb_item(lt));
    nb_optim_free(opt);
    nb_scope_end();
    nb_gpt_free(&t);
    nb_gpt_free(&u);
    nb_params_free(pt);
    nb_params_free(pu);
    ck_assert_int_eq(nb_live_tensors(), base);
}
END_TEST

/* ------------------------------------------------------------------- dropout */
static double loss_with(nb_GPT *m, nb_tensor *idx, nb_tensor *tg, bool training, nb_rng *r) {
    nb_scope_begin();
    nb_tensor *l = nb_gpt_loss(m, idx, tg, training, r);
    OK(l);
    double v = nb_item(l);
    nb_scope_end();
    return v;
}

START_TEST(dropout_train_and_eval) {
    nb_tensor *idx = fx(FX, "idx"), *tg = fx(FX, "targets"), *want = fx(FX, "loss");
    int64_t base = nb_live_tensors();
    nb_GPTConfig c = fixture_cfg();
    c.dropout = 0.25;
    nb_params *ps = nb_params_new();
    nb_GPT m;
    init64(&m, ps, &c, 1);
    load_fixture(ps, false);
    double eval = nb_item(want);
    nb_rng r;
    /* eval ignores dropout: PyTorch's dropout-free loss */
    ck_assert_double_eq_tol(loss_with(&m, idx, tg, false, NULL), eval, 1e-12);
    nb_rng_seed(&r, 7);
    ck_assert_double_eq_tol(loss_with(&m, idx, tg, false, &r), eval, 1e-12);
    ck_assert_int_eq(r.offset, 0); /* eval draws nothing */
    nb_rng_seed(&r, 7);
    double a = loss_with(&m, idx, tg, true, &r);
    ck_assert(r.offset > 0);
    nb_rng_seed(&r, 7);
    double b = loss_with(&m, idx, tg, true, &r);
    nb_rng_seed(&r, 8);
    double d = loss_with(&m, idx, tg, true, &r);
    ck_assert_msg(a == b, "same seed: %.17g vs %.17g", a, b);
    ck_assert_msg(fabs(a - eval) > 1e-6 && fabs(d - a) > 1e-6, "eval %.6f, seed 7 %.6f, seed 8 %.6f",
                  eval, a, d);
    /* the global generator */
    nb_manual_seed(5);
    double g1 = loss_with(&m, idx, tg, true, NULL);
    nb_manual_seed(5);
    ck_assert(g1 == loss_with(&m, idx, tg, true, NULL));
    /* gradients through the same masks are the same */
    nb_tensor *w = param(ps, "transformer.h.0.mlp.c_fc.weight");
    double *gw[2];
    for (int k = 0; k < 2; k++) {
        nb_params_zero_grad(ps);
        nb_rng_seed(&r, 7);
        nb_scope_begin();
        OK_RC(nb_backward(nb_gpt_loss(&m, idx, tg, true, &r)));
        nb_scope_end();
        gw[k] = values(nb_grad(w));
    }
    for (int64_t i = 0; i < nb_numel(w); i++) ck_assert(gw[0][i] == gw[1][i]);
    free(gw[0]);
    free(gw[1]);
    nb_params_zero_grad(ps);
    nb_gpt_free(&m);
    nb_params_free(ps);

    /* dropout 1 on the embeddings and on both residual branches leaves x = 0,
     * so every position's logits are wte @ ln_f.bias */
    c.dropout = 1.0;
    ps = nb_params_new();
    init64(&m, ps, &c, 1);
    load_fixture(ps, false);
    nb_scope_begin();
    nb_tensor *logits = nb_gpt_forward(&m, idx, true, NULL);
    OK(logits);
    nb_tensor *head = nb_matmul(m.wte.weight, m.ln_f.bias); /* (V) */
    expect_close(logits, nb_expand(head, NB_SHAPE(2, 6, 11)), 1e-14, 1e-14);
    expect_close(nb_gpt_forward(&m, idx, false, NULL), fx(FX, "logits"), 1e-12, 1e-10);
    nb_scope_end();
    nb_gpt_free(&m);
    nb_params_free(ps);
    ck_assert_int_eq(nb_live_tensors(), base);
}
END_TEST

/* The forward written out from public ops in nanoGPT's order, with the
 * dropouts where the header puts them (embeddings; per layer the attention
 * weights, then each residual branch), drawing from rng in that order. */
static nb_tensor *reference_forward(const nb_GPT *m, nb_tensor *idx, bool training, nb_rng *rng) {
    int64_t B = nb_shape(idx)[0], T = nb_shape(idx)[1], C = m->cfg.n_embd, H = m->cfg.n_head;
    double p = m->cfg.dropout;
    nb_tensor *x = nb_add(nb_embedding(m->wte.weight, idx),
                          nb_embedding(m->wpe.weight, nb_arange(NB_I64, T)));
    x = nb_dropout(x, p, training, rng);
    nb_tensor *keep = nb_tril_mask(T, T);
    for (int64_t l = 0; l < m->cfg.n_layer; l++) {
        const nb_GPTBlock *b = &m->h[l];
        nb_tensor *h = nb_layer_norm(x, b->ln_1.weight, b->ln_1.bias, 1e-5);
        nb_tensor *qkv = nb_linear(h, b->c_attn.weight, b->c_attn.bias), *hd[3];
        for (int i = 0; i < 3; i++)
            hd[i] = nb_transpose(nb_reshape(nb_narrow(qkv, 2, i * C, C), NB_SHAPE(B, T, H, C / H)), 1, 2);
        nb_tensor *y = nb_attention(hd[0], hd[1], hd[2], keep, p, training, rng, NULL);
        y = nb_reshape(nb_transpose(y, 1, 2), NB_SHAPE(B, T, C));
        x = nb_add(x, nb_dropout(nb_linear(y, b->attn_proj.weight, b->attn_proj.bias), p, training, rng));
        h = nb_layer_norm(x, b->ln_2.weight, b->ln_2.bias, 1e-5);
        h = nb_gelu_tanh(nb_linear(h, b->c_fc.weight, b->c_fc.bias));
        x = nb_add(x, nb_dropout(nb_linear(h, b->mlp_proj.weight, b->mlp_proj.bias), p, training, rng));
    }
    x = nb_layer_norm(x, m->ln_f.weight, m->ln_f.bias, 1e-5);
    return nb_linear(x, m->lm_head.weight, NULL);
}

/* In training, nb_gpt_forward draws the same masks as the written-out
 * forward: dropout sits on the embeddings, the attention weights and both
 * residual branches, and nowhere else; also without biases and untied. */
START_TEST(training_forward_matches_written_out_forward) {
    nb_tensor *idx = fx(FX, "idx");
    int64_t base = nb_live_tensors();
    for (int variant = 0; variant < 2; variant++) {
        nb_GPTConfig c = fixture_cfg();
        c.dropout = 0.3;
        if (variant == 1) c.bias = false, c.tie_weights = false, c.n_head = 4;
        nb_params *ps = nb_params_new();
        nb_GPT m;
        init64(&m, ps, &c, 1);
        if (variant == 0) load_fixture(ps, false);
        else scramble(ps, 12, 0.4);
        for (uint64_t seed = 1; seed <= 2; seed++) {
            nb_rng r1, r2;
            nb_rng_seed(&r1, seed);
            nb_rng_seed(&r2, seed);
            nb_scope_begin();
            nb_tensor *got = nb_gpt_forward(&m, idx, true, &r1);
            nb_tensor *want = reference_forward(&m, idx, true, &r2);
            OK(want);
            expect_close(got, want, 1e-13, 1e-12);
            ck_assert_int_eq(r1.offset, r2.offset);
            expect_close(nb_gpt_forward(&m, idx, false, NULL), reference_forward(&m, idx, false, NULL),
                         1e-13, 1e-12);
            nb_scope_end();
        }
        nb_gpt_free(&m);
        nb_params_free(ps);
    }
    ck_assert_int_eq(nb_live_tensors(), base);
}
END_TEST

/* ------------------------------------------------------------------ gradcheck */
typedef struct {
    nb_GPT *m;
    nb_tensor *idx, *tg;
    bool training;
    uint64_t seed;
} loss_ctx;

/* The loss; the model reads its parameters (the inputs) directly. In
 * training the dropout masks are the same on every call (rng reseeded). */
static nb_tensor *loss_fn(nb_tensor **in, int n, void *p) {
    (void)in;
    (void)n;
    loss_ctx *c = p;
    nb_rng r;
    nb_rng_seed(&r, c->seed);
    return nb_gpt_loss(c->m, c->idx, c->tg, c->training, &r);
}

static void gradcheck_params(const char *label, loss_ctx *c, nb_params *ps, const char *const *names,
                             int n, bool fast) {
    nb_tensor *in[8];
    for (int i = 0; i < n; i++) in[i] = param(ps, names[i]);
    nb_gradcheck_opts o = NB_GRADCHECK_DEFAULTS;
    o.fast_mode = fast;
    o.fast_probes = 3;
    o.seed = 11;
    nb_gradcheck_result res;
    bool ok = nb_gradcheck(loss_fn, c, n, in, &o, &res);
    ck_assert_msg(ok, "%s: %s", label, res.message);
    printf("gradcheck ok  %s (%s, %lld checked)\n", label, fast ? "fast" : "full",
           (long long)res.checked);
    fflush(stdout);
    nb_params_zero_grad(ps);
}

START_TEST(loss_gradcheck) {
    int64_t base = nb_live_tensors();
    nb_GPTConfig c = {.vocab_size = 7, .block_size = 5, .n_layer = 1, .n_head = 2, .n_embd = 4,
                      .dropout = 0.0, .bias = true, .tie_weights = true};
    nb_params *ps = nb_params_new();
    nb_GPT m;
    init64(&m, ps, &c, 3);
    scramble(ps, 4, 0.5);
    nb_tensor *idx = nb_from_data(NB_I64, NB_SHAPE(2, 4), (int64_t[]){1, 6, 0, 3, 2, 2, 5, 4});
    nb_tensor *tg = nb_from_data(NB_I64, NB_SHAPE(2, 4), (int64_t[]){6, 0, -1, 1, 2, 5, 4, 0});
    loss_ctx ctx = {&m, idx, tg, false, 0};
    static const char *const fast[] = {"transformer.wte.weight", "transformer.wpe.weight",
                                       "transformer.h.0.attn.c_attn.weight",
                                       "transformer.h.0.ln_2.bias",
                                       "transformer.h.0.mlp.c_proj.weight",
                                       "transformer.ln_f.weight"};
    gradcheck_params("nb_gpt_loss wrt wte, wpe, c_attn, ln_2.bias, mlp.c_proj, ln_f", &ctx, ps,
                     fast, 6, true);
    static const char *const full[] = {"transformer.h.0.attn.c_proj.bias",
                                       "transformer.ln_f.bias", "transformer.h.0.ln_1.weight"};
    gradcheck_params("nb_gpt_loss wrt attn.c_proj.bias, ln_f.bias, ln_1.weight", &ctx, ps, full,
                     3, false);
    nb_gpt_free(&m);
    nb_params_free(ps);
    /* in training, through fixed dropout masks */
    c.dropout = 0.2;
    ps = nb_params_new();
    init64(&m, ps, &c, 3);
    scramble(ps, 4, 0.5);
    ctx = (loss_ctx){&m, idx, tg, true, 21};
    static const char *const drop[] = {"transformer.wte.weight",
                                       "transformer.h.0.mlp.c_fc.weight"};
    gradcheck_params("nb_gpt_loss in training (dropout 0.2) wrt wte, c_fc", &ctx, ps, drop, 2,
                     true);
    nb_gpt_free(&m);
    nb_params_free(ps);
    nb_free(idx);
    nb_free(tg);
    ck_assert_int_eq(nb_live_tensors(), base);
}
END_TEST

/* The GPT block twice differentiable and in forward mode: nb_gradgradcheck
 * and check_forward_ad of nb_gpt_loss (one block: embeddings, ln_1,
 * attention, ln_2, the gelu_tanh MLP, ln_f, the tied head, cross-entropy
 * with an ignored target) with respect to parameters of every kind. Forward
 * mode pushes tangents through what fn computes from its inputs, so the loss
 * runs on a copy of the model whose parameters are the inputs. */
typedef struct {
    loss_ctx base;
    const char *const *names;
} param_loss_ctx;

/* the field of m (one block) that holds parameter `name` */
static nb_tensor **param_slot(nb_GPT *m, const char *name) {
    static const char *const pre = "transformer.h.0.";
    nb_GPTBlock *b = &m->h[0];
    struct { const char *name; nb_tensor **slot; } map[] = {
        {"transformer.wte.weight", &m->wte.weight}, {"transformer.wpe.weight", &m->wpe.weight},
        {"transformer.ln_f.weight", &m->ln_f.weight}, {"transformer.ln_f.bias", &m->ln_f.bias},
        {"ln_1.weight", &b->ln_1.weight}, {"ln_1.bias", &b->ln_1.bias},
        {"ln_2.weight", &b->ln_2.weight}, {"ln_2.bias", &b->ln_2.bias},
        {"attn.c_attn.weight", &b->c_attn.weight}, {"attn.c_attn.bias", &b->c_attn.bias},
        {"attn.c_proj.weight", &b->attn_proj.weight}, {"attn.c_proj.bias", &b->attn_proj.bias},
        {"mlp.c_fc.weight", &b->c_fc.weight}, {"mlp.c_fc.bias", &b->c_fc.bias},
        {"mlp.c_proj.weight", &b->mlp_proj.weight}, {"mlp.c_proj.bias", &b->mlp_proj.bias}};
    const char *key = strncmp(name, pre, strlen(pre)) ? name : name + strlen(pre);
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (!strcmp(map[i].name, key)) return map[i].slot;
    ck_abort_msg("no slot for %s", name);
    return NULL;
}

static nb_tensor *param_loss_fn(nb_tensor **in, int n, void *p) {
    param_loss_ctx *c = p;
    nb_GPT m = *c->base.m;
    nb_GPTBlock block = c->base.m->h[0];
    m.h = &block;
    for (int i = 0; i < n; i++) {
        *param_slot(&m, c->names[i]) = in[i];
        if (!strcmp(c->names[i], "transformer.wte.weight") && m.cfg.tie_weights)
            m.lm_head.weight = in[i];
    }
    return nb_gpt_loss(&m, c->base.idx, c->base.tg, false, NULL);
}

static void higher_order_params(const char *label, param_loss_ctx *c, nb_params *ps,
                                const char *const *names, int n, bool fast) {
    nb_tensor *in[8];
    for (int i = 0; i < n; i++) in[i] = param(ps, names[i]);
    c->names = names;
    nb_gradcheck_opts o = NB_GRADCHECK_DEFAULTS;
    o.fast_mode = fast;
    o.fast_probes = 2;
    o.seed = 5;
    nb_gradcheck_result res;
    ck_assert_msg(nb_gradgradcheck(param_loss_fn, c, n, in, &o, &res), "%s: %s", label,
                  res.message);
    printf("gradgradcheck ok  %s (%s, %lld checked)\n", label, fast ? "fast" : "full",
           (long long)res.checked);
    o.check_forward_ad = true;
    ck_assert_msg(nb_gradcheck(param_loss_fn, c, n, in, &o, &res), "%s: %s", label,
                  res.message);
    printf("forward-ad ok  %s (%s, %lld checked)\n", label, fast ? "fast" : "full",
           (long long)res.checked);
    fflush(stdout);
    nb_params_zero_grad(ps);
}

START_TEST(loss_higher_order) {
    int64_t base = nb_live_tensors();
    nb_GPTConfig c = {.vocab_size = 5, .block_size = 4, .n_layer = 1, .n_head = 2, .n_embd = 4,
                      .dropout = 0.0, .bias = true, .tie_weights = true};
    nb_params *ps = nb_params_new();
    nb_GPT m;
    init64(&m, ps, &c, 3);
    scramble(ps, 4, 0.5);
    nb_tensor *idx = nb_from_data(NB_I64, NB_SHAPE(1, 3), (int64_t[]){1, 4, 0});
    nb_tensor *tg = nb_from_data(NB_I64, NB_SHAPE(1, 3), (int64_t[]){4, -1, 2});
    param_loss_ctx ctx = {{&m, idx, tg, false, 0}, NULL};
    static const char *const full[] = {"transformer.h.0.ln_1.weight",
                                       "transformer.h.0.attn.c_proj.bias",
                                       "transformer.ln_f.bias"};
    higher_order_params("nb_gpt_loss wrt ln_1.weight, attn.c_proj.bias, ln_f.bias", &ctx, ps,
                        full, 3, false);
    static const char *const fast[] = {"transformer.wte.weight", "transformer.wpe.weight",
                                       "transformer.h.0.attn.c_attn.weight",
                                       "transformer.h.0.mlp.c_fc.weight",
                                       "transformer.h.0.mlp.c_proj.weight"};
    higher_order_params("nb_gpt_loss wrt wte, wpe, c_attn, c_fc, mlp.c_proj", &ctx, ps, fast, 5,
                        true);
    nb_gpt_free(&m);
    nb_params_free(ps);
    nb_free(idx);
    nb_free(tg);
    ck_assert_int_eq(nb_live_tensors(), base);
}
END_TEST

/* ---------------------------------------------------------------- generation */
static nb_GPTConfig gen_cfg(void) {
    return (nb_GPTConfig){.vocab_size = 13, .block_size = 8, .n_layer = 2, .n_head = 2,
                          .n_embd = 16, .dropout = 0.0, .bias = true, .tie_weights = true};
}

/* The token nb_gpt_generate's options pick from logits (V doubles), drawn as
 * nanoGPT does: logits / temperature, those below the k-th largest set to
 * -inf, softmax, one nb_multinomial draw from rng. */
static int64_t pick(const double *l, int64_t V, const nb_gpt_sample_opts *o, nb_rng *rng) {
    int64_t best = 0;
    for (int64_t i = 1; i < V; i++)
        if (l[i] > l[best]) best = i;
    if (o->greedy) return best;
    double z[64], sorted[64], thr = -INFINITY, sum = 0;
    ck_assert(V <= 64);
    for (int64_t i = 0; i < V; i++) z[i] = sorted[i] = l[i] / o->temperature;
    if (o->top_k > 0 && o->top_k < V) {
        for (int64_t i = 0; i < V; i++) /* descending insertion sort */
            for (int64_t j = i; j > 0 && sorted[j] > sorted[j - 1]; j--) {
                double t = sorted[j];
                sorted[j] = sorted[j - 1];
                sorted[j - 1] = t;
            }
        thr = sorted[o->top_k - 1];
    }
    double zmax = z[best];
    for (int64_t i = 0; i < V; i++) sum += z[i] = z[i] < thr ? 0.0 : exp(z[i] - zmax);
    for (int64_t i = 0; i < V; i++) z[i] /= sum;
    nb_scope_begin();
    nb_tensor *t = nb_multinomial(nb_from_data(NB_F64, NB_SHAPE(V), z), 1, false, rng);
    OK(t);
    int64_t tok = (int64_t)nb_item(t);
    nb_scope_end();
    return tok;
}

/* The logits (V) after seq[0..len), from a full forward of seq[ws..len),
 * into l. */
static void full_logits(nb_GPT *m, const int64_t *seq, int64_t len, int64_t ws, double *l) {
    int64_t T = len - ws;
    nb_scope_begin();
    nb_tensor *idx = nb_from_data(NB_I64, NB_SHAPE(1, T), seq + len - T);
    nb_tensor *last = nb_select(nb_select(nb_gpt_forward(m, idx, false, NULL), 0, 0), 0, T - 1);
    OK(last);
    nb_copy_to_f64(last, l);
    nb_scope_end();
}

/* Where nb_gpt_generate's window starts when it predicts the token after
 * seq[0..len), for a prompt of np tokens (the rule of reference_generate). */
static int64_t window_of(const nb_GPT *m, int64_t np, int64_t len) {
    int64_t block = m->cfg.block_size, half = block / 2 > 0 ? block / 2 : 1;
    int64_t ws = np > block ? np - block : 0;
    for (int64_t l = np; l <= len; l++)
        if (l - ws > block) ws = l - half;
    return ws;
}

/* nb_gpt_generate's rule without a cache: every token from a full forward
 * of the window seq[ws..len): a prompt's last block_size tokens, and when
 * the window would pass block_size tokens, its last block_size/2. */
static void reference_generate(nb_GPT *m, const int64_t *prompt, int64_t np, int64_t n_new,
                               const nb_gpt_sample_opts *o, nb_rng *rng, int64_t *out) {
    int64_t *seq = malloc((size_t)(np + n_new) * sizeof *seq), len = np;
    int64_t block = m->cfg.block_size, half = block / 2 > 0 ? block / 2 : 1;
    int64_t ws = np > block ? np - block : 0;
    memcpy(seq, prompt, (size_t)np * sizeof *seq);
    double l[64];
    for (int64_t i = 0; i < n_new; i++) {
        if (len - ws > block) ws = len - half;
        full_logits(m, seq, len, ws, l);
        out[i] = seq[len++] = pick(l, m->cfg.vocab_size, o, rng);
    }
    free(seq);
}

static void expect_tokens(const int64_t *got, const int64_t *want, int64_t n, const char *what) {
    for (int64_t i = 0; i < n; i++)
        ck_assert_msg(got[i] == want[i], "%s: token %lld is %lld, expected %lld", what,
                      (long long)i, (long long)got[i], (long long)want[i]);
}

/* Generation with the cache equals the reference for a prompt shorter than
 * the block and one longer (cropped), running past block_size (the window
 * slides), greedy and sampled. */
static void expect_like_reference(nb_GPT *m, const int64_t *prompt, int64_t np, int64_t n_new,
                                  nb_gpt_sample_opts o, uint64_t seed, const char *what) {
    int64_t got[64], want[64];
    ck_assert(n_new <= 64);
    nb_rng r1, r2;
    nb_rng_seed(&r1, seed);
    nb_rng_seed(&r2, seed);
    int64_t n = nb_gpt_generate(m, prompt, np, n_new, &o, &r1, got, NULL, NULL);
    ck_assert_msg(n == n_new, "%s: %lld tokens: %s", what, (long long)n, nb_last_error());
    reference_generate(m, prompt, np, n_new, &o, &r2, want);
    expect_tokens(got, want, n_new, what);
    ck_assert_int_eq(r1.offset, r2.offset);
}

/* The logits bf16 generation picks from: nb_gpt_generate's bf16 products
 * are autocast's (the weights rounded to bf16, the activations rounded as
 * they enter each product, f32 sums), so the last position's logits of
 * nb_gpt_forward under nb_autocast_begin(NB_BF16) are those logits up to
 * f32 rounding (the cache sums attention in another order). They are within
 * a bf16-sized distance of f32's: |bf16 - f32| <= 2^-4 x the largest |f32
 * logit| on 16 prompts (each of the 9 products on the way, 2 layers x 4 and
 * lm_head, rounds both operands by up to 2^-9 relative and the errors
 * compound through the layer norms: measured 0.024 = 2^-5.4 here, logits
 * up to about 7), and not equal to them (bf16 did run); and where the top two
 * bf16 logits are further apart than 1e-3, the greedy bf16 generation takes
 * the bf16 argmax (so these are the logits it decided on). */
START_TEST(generate_bf16_logits_near_f32) {
    nb_GPTConfig c = gen_cfg();
    c.vocab_size = 50, c.n_embd = 64, c.n_head = 4, c.block_size = 16;
    nb_params *ps = nb_params_new();
    nb_GPT m;
    init_dt(&m, ps, &c, 21, NB_F32);
    scramble(ps, 22, 0.3);
    nb_gpt_sample_opts b = {.greedy = true, .dtype = NB_BF16};
    double worst = 0;
    int decided = 0;
    for (int64_t i = 0; i < 16; i++) {
        int64_t p[5] = {i % 50, (7 * i + 3) % 50, (11 * i + 5) % 50, (13 * i + 1) % 50, i * 3 % 50};
        nb_scope_begin();
        nb_tensor *idx = nb_from_data(NB_I64, NB_SHAPE(1, 5), p);
        nb_tensor *lf = nb_select(nb_select(nb_gpt_forward(&m, idx, false, NULL), 0, 0), 0, 4);
        ck_assert_int_eq(nb_autocast_begin(NB_BF16), 0);
        nb_tensor *lb = nb_select(nb_select(nb_gpt_forward(&m, idx, false, NULL), 0, 0), 0, 4);
        nb_autocast_end();
        double f[50], g[50], big = 0, diff = 0;
        ck_assert_int_eq(nb_copy_to_f64(lf, f), 0);
        ck_assert_int_eq(nb_copy_to_f64(lb, g), 0);
        int top = 0, second = -1;
        for (int v = 0; v < 50; v++) {
            big = fmax(big, fabs(f[v]));
            diff = fmax(diff, fabs(g[v] - f[v]));
            if (g[v] > g[top]) top = v;
        }
        for (int v = 0; v < 50; v++)
            if (v != top && (second < 0 || g[v] > g[second])) second = v;
        ck_assert_msg(diff <= 0x1p-4 * big, "prompt %lld: bf16 logits %g from f32's (largest %g)",
                      (long long)i, diff, big);
        ck_assert_msg(diff > 0, "prompt %lld: bf16 logits equal f32's (not bf16 products?)",
                      (long long)i);
        worst = fmax(worst, diff / big);
        int64_t tok;
        ck_assert_int_eq(nb_gpt_generate(&m, p, 5, 1, &b, NULL, &tok, NULL, NULL), 1);
        if (g[top] - g[second] > 1e-3) {
            decided++;
            ck_assert_msg(tok == top, "prompt %lld: bf16 generation took %lld, the bf16 argmax "
                          "is %d", (long long)i, (long long)tok, top);
        }
        nb_scope_end();
    }
    printf("gpt bf16 logits: within %.2g of f32's (relative to the largest); greedy bf16 "
           "generation took the bf16 argmax on the %d of 16 prompts with a clear one\n",
           worst, decided);
    ck_assert_int_ge(decided, 12);
    nb_gpt_free(&m);
    nb_params_free(ps);
}
END_TEST

/* dtype NB_BF16: generation from bf16 copies of the linear weights. The
 * first greedy token of 24 prompts mostly agrees with f32's (bf16 logits are
 * f32's to about 2^-8 relative per operand, so near-ties may flip); the
 * result is the same on 1 and 2 threads and on a second call (the copies
 * kept); after the weights change the copies are made again (the tokens are
 * those of a fresh model with the new weights); a bad dtype is refused. */
START_TEST(generate_bf16) {
    nb_GPTConfig c = gen_cfg();
    c.vocab_size = 50, c.n_embd = 32, c.block_size = 16;
    nb_params *ps = nb_params_new();
    nb_GPT m;
    init_dt(&m, ps, &c, 11, NB_F32);
    scramble(ps, 12, 0.3);
    nb_gpt_sample_opts f = {.greedy = true}, b = {.greedy = true, .dtype = NB_BF16};
    int agree = 0;
    for (int64_t i = 0; i < 24; i++) {
        int64_t p[3] = {i % 50, (7 * i + 3) % 50, (11 * i + 5) % 50}, tf, tb;
        ck_assert_int_eq(nb_gpt_generate(&m, p, 3, 1, &f, NULL, &tf, NULL, NULL), 1);
        ck_assert_msg(nb_gpt_generate(&m, p, 3, 1, &b, NULL, &tb, NULL, NULL) == 1, "%s",
                      nb_last_error());
        agree += tf == tb;
    }
    ck_assert_msg(agree >= 20, "bf16 agreed with f32 on %d of 24 first tokens", agree);
    const int64_t p[] = {1, 2, 3};
    int64_t t1[12], t2[12], t3[12];
    int before = nb_num_threads();
    nb_set_num_threads(1);
    ck_assert_int_eq(nb_gpt_generate(&m, p, 3, 12, &b, NULL, t1, NULL, NULL), 12);
    nb_set_num_threads(2);
    ck_assert_int_eq(nb_gpt_generate(&m, p, 3, 12, &b, NULL, t2, NULL, NULL), 12);
    nb_set_num_threads(before);
    expect_tokens(t2, t1, 12, "bf16, 2 threads vs 1");
    /* new weights: the copies follow them */
    scramble(ps, 13, 0.3);
    ck_assert_int_eq(nb_gpt_generate(&m, p, 3, 12, &b, NULL, t2, NULL, NULL), 12);
    nb_params *ps2 = nb_params_new();
    nb_GPT m2;
    init_dt(&m2, ps2, &c, 11, NB_F32);
    scramble(ps2, 13, 0.3);
    ck_assert_int_eq(nb_gpt_generate(&m2, p, 3, 12, &b, NULL, t3, NULL, NULL), 12);
    expect_tokens(t2, t3, 12, "bf16 after the weights changed vs a fresh model");
    int differ = 0;
    for (int i = 0; i < 12; i++) differ += t1[i] != t2[i];
    ck_assert(differ > 0); /* the change mattered (else the test is weak) */
    nb_gpt_sample_opts bad = {.greedy = true, .dtype = NB_I64};
    ck_assert_int_eq(nb_gpt_generate(&m, p, 3, 1, &bad, NULL, t1, NULL, NULL), -1);
    ck_assert_str_eq(nb_last_error(), "nb_gpt_generate: dtype must be 0 or f32 (the model's "
                                      "weights) or bf16 (bf16 copies of the linear weights), got i64");
    nb_gpt_free(&m2);
    nb_params_free(ps2);
    nb_gpt_free(&m);
    nb_params_free(ps);
}
END_TEST

/* Adds delta to element k (flat) of ps's parameter name, through nb_copy_into. */
static void bump_element(nb_params *ps, const char *name, int64_t k, double delta) {
    nb_tensor *w = nb_params_get(ps, name);
    nb_scope_begin();
    nb_tensor *e = nb_narrow(nb_reshape(w, NB_SHAPE(nb_numel(w))), 0, k, 1);
    ck_assert_int_eq(nb_copy_into(e, nb_add_scalar(e, delta)), 0);
    nb_scope_end();
}

/* The bf16 copies follow a change of one weight element that an element
 * sample would miss: their staleness is the weight's nb_write_version. The
 * change is one that alters the greedy tokens (found by trying elements of
 * the first token's lm_head row on fresh models, skipping those a sample of
 * 62 elements, the rule this replaced, would see), and the model that had
 * copies must then give what a fresh model with the change gives. */
START_TEST(generate_bf16_follows_one_element) {
    nb_GPTConfig c = gen_cfg();
    c.vocab_size = 50, c.n_embd = 32, c.block_size = 16;
    nb_gpt_sample_opts b = {.greedy = true, .dtype = NB_BF16};
    const int64_t p[] = {1, 2, 3};
    const char *name = "transformer.wte.weight"; /* lm_head's (tied) */
    nb_params *ps = nb_params_new();
    nb_GPT m;
    init_dt(&m, ps, &c, 11, NB_F32);
    scramble(ps, 12, 0.3);
    int64_t t1[8], t2[8], t3[8], found = -1;
    ck_assert_int_eq(nb_gpt_generate(&m, p, 3, 8, &b, NULL, t1, NULL, NULL), 8);
    double delta = 0;
    for (int64_t j = 1; j < c.n_embd && found < 0; j += 2) {
        for (int sign = -1; sign <= 1 && found < 0; sign += 2) {
            int64_t k = t1[0] * c.n_embd + j, n = c.vocab_size * c.n_embd;
            if ((k % (n / 61) == 0 && k / (n / 61) <= 60) || k == n - 1) continue; /* sampled */
            nb_params *ps2 = nb_params_new();
            nb_GPT m2;
            init_dt(&m2, ps2, &c, 11, NB_F32);
            scramble(ps2, 12, 0.3);
            bump_element(ps2, name, t1[0] * c.n_embd + j, 3.0 * sign);
            ck_assert_int_eq(nb_gpt_generate(&m2, p, 3, 8, &b, NULL, t3, NULL, NULL), 8);
            if (memcmp(t1, t3, sizeof t1)) found = t1[0] * c.n_embd + j, delta = 3.0 * sign;
            nb_gpt_free(&m2);
            nb_params_free(ps2);
        }
    }
    ck_assert_msg(found >= 0, "no one-element change altered the greedy tokens");
    bump_element(ps, name, found, delta);
    ck_assert_int_eq(nb_gpt_generate(&m, p, 3, 8, &b, NULL, t2, NULL, NULL), 8);
    expect_tokens(t2, t3, 8, "bf16 after one element changed vs a fresh model with it");
    nb_gpt_free(&m);
    nb_params_free(ps);
}
END_TEST

START_TEST(generate_matches_full_forward) {
    int64_t base = nb_live_tensors();
    nb_GPTConfig c = gen_cfg();
    nb_params *ps = nb_params_new();
    nb_GPT m;
    init64(&m, ps, &c, 5);
    scramble(ps, 6, 0.3);
    const int64_t shortp[] = {4, 9, 1}, longp[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
    nb_gpt_sample_opts greedy = {.greedy = true}, temp = {.temperature = 0.8},
                       topk = {.temperature = 1.5, .top_k = 4};
    expect_like_reference(&m, shortp, 3, 22, greedy, 1, "greedy, prompt 3, 22 new (block 8)");
    expect_like_reference(&m, longp, 12, 10, greedy, 1, "greedy, prompt 12 > block 8");
    expect_like_reference(&m, shortp, 1, 7, greedy, 1, "greedy, exactly filling the block");
    expect_like_reference(&m, shortp, 3, 25, temp, 2, "temperature 0.8, 25 new");
    expect_like_reference(&m, longp, 12, 12, topk, 3, "top_k 4, temperature 1.5, prompt 12");
    /* the greedy continuation is not constant (the test would be weak) */
    int64_t out[22];
    ck_assert_int_eq(nb_gpt_generate(&m, shortp, 3, 22, &greedy, NULL, out, NULL, NULL), 22);
    int distinct = 0;
    for (int i = 0; i < 22; i++) distinct += out[i] != out[0];
    ck_assert(distinct > 0);
    /* grad mode is restored, and generation records nothing */
    ck_assert(nb_grad_enabled());
    nb_set_grad_enabled(false);
    ck_assert_int_eq(nb_gpt_generate(&m, shortp, 3, 2, &greedy, NULL, out, NULL, NULL), 2);
    ck_assert(!nb_grad_enabled());
    nb_set_grad_enabled(true);
    ck_assert_ptr_null(nb_grad(m.wte.weight));
    /* the cache: 2 tensors per layer, persistent until nb_gpt_free; no growth */
    int64_t live = nb_live_tensors();
    ck_assert_int_eq(nb_gpt_generate(&m, shortp, 3, 22, &temp, NULL, out, NULL, NULL), 22);
    ck_assert_int_eq(nb_live_tensors(), live);
    ck_assert_int_eq(live, base + nb_params_count(ps) + 2 * c.n_layer);
    nb_gpt_free(&m);
    nb_params_free(ps);
    ck_assert_int_eq(nb_live_tensors(), base);
}
END_TEST

/* A period-5 pattern (its bigram table is the rule): a few dozen Adam steps;
 * greedy generation then continues it, also past block_size, and equals the
 * reference. A generation before training shows the cache is refilled. */
static const int64_t PATTERN[5] = {3, 8, 1, 6, 4};

START_TEST(trained_model_continues_pattern) {
    int64_t base = nb_live_tensors();
    nb_GPTConfig c = {.vocab_size = 10, .block_size = 8, .n_layer = 1, .n_head = 2, .n_embd = 16,
                      .dropout = 0.0, .bias = true, .tie_weights = true};
    nb_params *ps = nb_params_new();
    nb_GPT m;
    init64(&m, ps, &c, 9);
    int64_t x[5 * 8], y[5 * 8];
    for (int b = 0; b < 5; b++)
        for (int t = 0; t < 8; t++) {
            x[b * 8 + t] = PATTERN[(b + t) % 5];
            y[b * 8 + t] = PATTERN[(b + t + 1) % 5];
        }
    const int64_t prompt[] = {8, 1};
    nb_gpt_sample_opts greedy = {.greedy = true};
    int64_t before[24], out[24], want[24];
    ck_assert_int_eq(nb_gpt_generate(&m, prompt, 2, 24, &greedy, NULL, before, NULL, NULL), 24);
    nb_tensor *idx = nb_from_data(NB_I64, NB_SHAPE(5, 8), x);
    nb_tensor *tg = nb_from_data(NB_I64, NB_SHAPE(5, 8), y);
    nb_optim *opt = nb_adamw(ps, 2e-2, 0.9, 0.95, 1e-8, 0.0);
    OK(opt);
    double first = 0, last = 0;
    for (int step = 0; step < 40; step++) {
        nb_scope_begin();
        nb_tensor *loss = nb_gpt_loss(&m, idx, tg, true, NULL);
        OK(loss);
        OK_RC(nb_backward(loss));
        nb_optim_step(opt);
        nb_optim_zero_grad(opt);
        if (step == 0) first = nb_item(loss);
        last = nb_item(loss);
        nb_scope_end();
    }
    printf("gpt: period-5 pattern, 40 AdamW steps: loss %.3f -> %.4f\n", first, last);
    fflush(stdout);
    ck_assert_msg(first > 2.0 && last < 0.1, "loss %.3f -> %.3f", first, last);
    ck_assert_int_eq(nb_gpt_generate(&m, prompt, 2, 24, &greedy, NULL, out, NULL, NULL), 24);
    for (int i = 0; i < 24; i++) /* 8 1 -> 6 4 3 8 1 6 ... */
        ck_assert_msg(out[i] == PATTERN[(i + 3) % 5], "token %d is %lld, expected %lld", i,
                      (long long)out[i], (long long)PATTERN[(i + 3) % 5]);
    int same = 0;
    for (int i = 0; i < 24; i++) same += before[i] == out[i];
    ck_assert(same < 24);
    reference_generate(&m, prompt, 2, 24, &greedy, NULL, want);
    expect_tokens(out, want, 24, "trained, greedy");
    /* sampling at a low temperature follows it too */
    nb_gpt_sample_opts cool = {.temperature = 0.5};
    ck_assert_int_eq(nb_gpt_generate(&m, prompt, 2, 24, &cool, NULL, out, NULL, NULL), 24);
    for (int i = 0; i < 24; i++) ck_assert_int_eq(out[i], PATTERN[(i + 3) % 5]);
    nb_optim_free(opt);
    nb_free(idx);
    nb_free(tg);
    nb_gpt_free(&m);
    nb_params_free(ps);
    ck_assert_int_eq(nb_live_tensors(), base);
}
END_TEST

static int64_t gen(nb_GPT *m, const int64_t *prompt, int64_t np, int64_t n,
                   nb_gpt_sample_opts o, uint64_t seed, int64_t *out) {
    nb_rng r;
    nb_rng_seed(&r, seed);
    int64_t k = nb_gpt_generate(m, prompt, np, n, &o, &r, out, NULL, NULL);
    ck_assert_msg(k == n, "generated %lld of %lld: %s", (long long)k, (long long)n, nb_last_error());
    return k;
}

static bool same_tokens(const int64_t *a, const int64_t *b, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (a[i] != b[i]) return false;
    return true;
}

START_TEST(sampling_options) {
    int64_t base = nb_live_tensors();
    nb_GPTConfig c = gen_cfg();
    nb_params *ps = nb_params_new();
    nb_GPT m;
    init64(&m, ps, &c, 5);
    scramble(ps, 6, 0.3);
    const int64_t prompt[] = {2, 7};
    enum { N = 30 };
    int64_t g[N], a[N], b[N], seq[2 + N];
    gen(&m, prompt, 2, N, (nb_gpt_sample_opts){.greedy = true, .temperature = -1}, 0, g);
    /* top_k 1 is greedy, at any temperature; a tiny temperature too */
    gen(&m, prompt, 2, N, (nb_gpt_sample_opts){.temperature = 0.7, .top_k = 1}, 1, a);
    expect_tokens(a, g, N, "top_k 1, temperature 0.7");
    gen(&m, prompt, 2, N, (nb_gpt_sample_opts){.temperature = 50, .top_k = 1}, 2, a);
    expect_tokens(a, g, N, "top_k 1, temperature 50");
    gen(&m, prompt, 2, N, (nb_gpt_sample_opts){.temperature = 1e-4}, 3, a);
    expect_tokens(a, g, N, "temperature 1e-4");
    /* top_k k: every token among the k most likely of its step */
    for (int64_t k = 2; k <= 4; k++) {
        gen(&m, prompt, 2, N, (nb_gpt_sample_opts){.temperature = 5.0, .top_k = k}, 10 + k, a);
        memcpy(seq, prompt, sizeof prompt);
        memcpy(seq + 2, a, sizeof a);
        int not_best = 0;
        for (int i = 0; i < N; i++) {
            double l[16];
            full_logits(&m, seq, 2 + i, window_of(&m, 2, 2 + i), l);
            int64_t above = 0; /* tokens strictly more likely than the one drawn */
            for (int64_t v = 0; v < c.vocab_size; v++) above += l[v] > l[a[i]];
            ck_assert_msg(above < k, "top_k %lld: token %d (%lld) has rank %lld", (long long)k, i,
                          (long long)a[i], (long long)above);
            not_best += above > 0;
        }
        ck_assert_msg(not_best > 0, "top_k %lld at temperature 5 always drew the best", (long long)k);
    }
    /* top_k >= vocab keeps all tokens: the same draws as top_k 0; opts NULL = temperature 1 */
    gen(&m, prompt, 2, N, (nb_gpt_sample_opts){.temperature = 1.0}, 4, a);
    gen(&m, prompt, 2, N, (nb_gpt_sample_opts){.temperature = 1.0, .top_k = 13}, 4, b);
    expect_tokens(b, a, N, "top_k = vocab_size");
    gen(&m, prompt, 2, N, (nb_gpt_sample_opts){.temperature = 1.0, .top_k = 100}, 4, b);
    expect_tokens(b, a, N, "top_k > vocab_size");
    nb_rng r;
    nb_rng_seed(&r, 4);
    ck_assert_int_eq(nb_gpt_generate(&m, prompt, 2, N, NULL, &r, b, NULL, NULL), N);
    expect_tokens(b, a, N, "opts NULL");
    /* the same seed draws the same; another seed, another temperature differ */
    gen(&m, prompt, 2, N, (nb_gpt_sample_opts){.temperature = 1.0}, 4, b);
    expect_tokens(b, a, N, "same seed");
    gen(&m, prompt, 2, N, (nb_gpt_sample_opts){.temperature = 1.0}, 5, b);
    ck_assert(!same_tokens(a, b, N));
    gen(&m, prompt, 2, N, (nb_gpt_sample_opts){.temperature = 3.0}, 4, b);
    ck_assert(!same_tokens(a, b, N));
    gen(&m, prompt, 2, N, (nb_gpt_sample_opts){.temperature = 0.3}, 4, b);
    ck_assert(!same_tokens(a, b, N));
    /* a hotter sampler strays from the greedy choice more often */
    int off_cold = 0, off_hot = 0;
    int64_t cold[N], hot[N];
    gen(&m, prompt, 2, N, (nb_gpt_sample_opts){.temperature = 0.3}, 8, cold);
    gen(&m, prompt, 2, N, (nb_gpt_sample_opts){.temperature = 10.0}, 8, hot);
    for (int k = 0; k < 2; k++) {
        const int64_t *s = k ? hot : cold;
        memcpy(seq, prompt, sizeof prompt);
        memcpy(seq + 2, s, sizeof cold);
        for (int i = 0; i < N; i++) {
            double l[16];
            full_logits(&m, seq, 2 + i, window_of(&m, 2, 2 + i), l);
            int64_t best = 0;
            for (int64_t v = 1; v < c.vocab_size; v++)
                if (l[v] > l[best]) best = v;
            *(k ? &off_hot : &off_cold) += s[i] != best;
        }
    }
    ck_assert_msg(off_hot > off_cold, "temperature 10: %d off greedy, 0.3: %d", off_hot, off_cold);
    /* the global generator */
    nb_manual_seed(17);
    ck_assert_int_eq(nb_gpt_generate(&m, prompt, 2, N, NULL, NULL, a, NULL, NULL), N);
    nb_manual_seed(17);
    ck_assert_int_eq(nb_gpt_generate(&m, prompt, 2, N, NULL, NULL, b, NULL, NULL), N);
    expect_tokens(b, a, N, "nb_manual_seed");
    nb_gpt_free(&m);
    nb_params_free(ps);
    ck_assert_int_eq(nb_live_tensors(), base);
}
END_TEST

typedef struct {
    int calls, stop_after;
    int64_t seen[32];
} cb_state;

static bool on_tok(int64_t token, void *user) {
    cb_state *s = user;
    s->seen[s->calls++] = token;
    return s->calls < s->stop_after;
}

START_TEST(on_token_stops_early) {
    int64_t base = nb_live_tensors();
    nb_GPTConfig c = gen_cfg();
    nb_params *ps = nb_params_new();
    nb_GPT m;
    init64(&m, ps, &c, 5);
    scramble(ps, 6, 0.3);
    const int64_t prompt[] = {5};
    nb_gpt_sample_opts greedy = {.greedy = true};
    int64_t all[12], out[12];
    ck_assert_int_eq(nb_gpt_generate(&m, prompt, 1, 12, &greedy, NULL, all, NULL, NULL), 12);
    for (int i = 0; i < 12; i++) out[i] = -7;
    cb_state s = {.stop_after = 3};
    ck_assert_int_eq(nb_gpt_generate(&m, prompt, 1, 12, &greedy, NULL, out, on_tok, &s), 3);
    ck_assert_int_eq(s.calls, 3);
    expect_tokens(out, all, 3, "stopped after 3");
    expect_tokens(s.seen, all, 3, "tokens seen by on_token");
    for (int i = 3; i < 12; i++) ck_assert_int_eq(out[i], -7); /* not written */
    s = (cb_state){.stop_after = 100};
    ck_assert_int_eq(nb_gpt_generate(&m, prompt, 1, 12, &greedy, NULL, out, on_tok, &s), 12);
    ck_assert_int_eq(s.calls, 12);
    expect_tokens(s.seen, all, 12, "on_token, never stopping");
    s = (cb_state){.stop_after = 1}; /* stopping at the first */
    ck_assert_int_eq(nb_gpt_generate(&m, prompt, 1, 12, &greedy, NULL, out, on_tok, &s), 1);
    s = (cb_state){.stop_after = 12}; /* false on the last token: all written */
    ck_assert_int_eq(nb_gpt_generate(&m, prompt, 1, 12, &greedy, NULL, out, on_tok, &s), 12);
    /* n_new 0: nothing, no call, out may be NULL */
    s = (cb_state){.stop_after = 100};
    ck_assert_int_eq(nb_gpt_generate(&m, prompt, 1, 0, &greedy, NULL, NULL, on_tok, &s), 0);
    ck_assert_int_eq(s.calls, 0);
    ck_assert_ptr_null(nb_last_error());
    nb_gpt_free(&m);
    nb_params_free(ps);
    ck_assert_int_eq(nb_live_tensors(), base);
}
END_TEST

START_TEST(generate_errors) {
    int64_t base = nb_live_tensors();
    nb_GPTConfig c = gen_cfg();
    nb_params *ps = nb_params_new();
    nb_GPT m;
    init64(&m, ps, &c, 5);
    const int64_t prompt[] = {1, 2, 3}, bad[] = {1, 13, 3}, neg[] = {-1};
    int64_t out[4] = {-7, -7, -7, -7};
    nb_gpt_sample_opts o = {.temperature = 1.0};
    expect_error_rc(nb_gpt_generate(&m, prompt, 0, 4, &o, NULL, out, NULL, NULL),
                    "nb_gpt_generate: the prompt must have at least 1 token, got 0");
    expect_error_rc(nb_gpt_generate(&m, NULL, 3, 4, &o, NULL, out, NULL, NULL),
                    "nb_gpt_generate: the prompt must have at least 1 token");
    expect_error_rc(nb_gpt_generate(&m, bad, 3, 4, &o, NULL, out, NULL, NULL),
                    "nb_gpt_generate: prompt token 13 at position 1 is out of range for "
                    "vocab_size 13");
    expect_error_rc(nb_gpt_generate(&m, neg, 1, 4, &o, NULL, out, NULL, NULL),
                    "nb_gpt_generate: prompt token -1 at position 0 is out of range");
    const double temps[] = {0.0, -1.0, NAN, INFINITY};
    const char *shown[] = {"got 0", "got -1", "got nan", "got inf"};
    for (int i = 0; i < 4; i++) {
        nb_gpt_sample_opts t = {.temperature = temps[i]};
        expect_error_rc(nb_gpt_generate(&m, prompt, 3, 4, &t, NULL, out, NULL, NULL),
                        "nb_gpt_generate: temperature must be > 0 and finite", shown[i]);
    }
    nb_gpt_sample_opts k = {.temperature = 1.0, .top_k = -1};
    expect_error_rc(nb_gpt_generate(&m, prompt, 3, 4, &k, NULL, out, NULL, NULL),
                    "nb_gpt_generate: top_k must be >= 0 (0 = all tokens), got -1");
    expect_error_rc(nb_gpt_generate(&m, prompt, 3, 4, &o, NULL, NULL, NULL, NULL),
                    "nb_gpt_generate: n_new must be >= 0, and out or on_token must take the "
                    "tokens; got n_new 4, out NULL, on_token NULL");
    expect_error_rc(nb_gpt_generate(&m, prompt, 3, -1, &o, NULL, out, NULL, NULL),
                    "nb_gpt_generate: n_new must be >= 0", "got n_new -1");
    expect_error_rc(nb_gpt_generate(NULL, prompt, 3, 4, &o, NULL, out, NULL, NULL),
                    "nb_gpt_generate: model is NULL");
    nb_GPT blank = {0};
    expect_error_rc(nb_gpt_generate(&blank, prompt, 3, 4, &o, NULL, out, NULL, NULL),
                    "nb_gpt_generate: model is not initialized (use nb_gpt_init)");
    for (int i = 0; i < 4; i++) ck_assert_int_eq(out[i], -7); /* nothing written */
    ck_assert_ptr_null(m.cache); /* refused before the cache is made */
    /* greedy ignores temperature and top_k */
    nb_gpt_sample_opts g = {.greedy = true, .temperature = 0.0, .top_k = 0};
    ck_assert_int_eq(nb_gpt_generate(&m, prompt, 3, 4, &g, NULL, out, NULL, NULL), 4);
    g.top_k = -1; /* documented as unused there: not checked either */
    ck_assert_int_eq(nb_gpt_generate(&m, prompt, 3, 4, &g, NULL, out, NULL, NULL), 4);
    ck_assert(nb_grad_enabled());
    nb_gpt_free(&m);
    nb_gpt_free(&m); /* twice is harmless */
    nb_gpt_free(NULL);
    nb_params_free(ps);
    ck_assert_int_eq(nb_live_tensors(), base);
}
END_TEST

/* -------------------------------------------------- per-parameter weight decay */
static void expect_gpt_decay(nb_optim *opt, nb_params *ps, bool tied, double wd) {
    for (int i = 0; i < nb_params_count(ps); i++) {
        const char *name;
        nb_params_at(ps, i, &name);
        bool decayed = (strstr(name, ".weight") && (strstr(name, "attn.c_") || strstr(name, "mlp.c_"))) ||
                       (!tied && !strcmp(name, "lm_head.weight"));
        double got = nb_optim_weight_decay(opt, name);
        ck_assert_msg(got == (decayed ? wd : 0.0), "%s: weight decay %g, expected %g", name, got,
                      decayed ? wd : 0.0);
    }
}

START_TEST(gpt_weight_decay_groups) {
    int64_t base = nb_live_tensors();
    for (int tied = 0; tied < 2; tied++) {
        nb_GPTConfig c = fixture_cfg();
        c.tie_weights = tied;
        nb_params *ps = nb_params_new();
        nb_GPT m;
        OK_RC(nb_gpt_init(&m, ps, &c, NULL));
        nb_optim *opt = nb_adamw(ps, 1e-3, 0.9, 0.95, 1e-8, 0.3);
        OK(opt);
        ck_assert(nb_optim_weight_decay(opt, NULL) == 0.3);
        ck_assert(nb_optim_weight_decay(opt, "transformer.wpe.weight") == 0.3);
        OK_RC(nb_gpt_set_weight_decay(&m, opt, 0.1));
        expect_gpt_decay(opt, ps, tied, 0.1);
        ck_assert(nb_optim_weight_decay(opt, "transformer.h.1.mlp.c_proj.weight") == 0.1);
        ck_assert(nb_optim_weight_decay(opt, "transformer.h.1.mlp.c_proj.bias") == 0.0);
        ck_assert(nb_optim_weight_decay(opt, "transformer.wte.weight") == 0.0);
        ck_assert(nb_optim_weight_decay(opt, "transformer.h.0.ln_1.weight") == 0.0);
        /* nb_gpt_decays says the same of every parameter, for optimizers over a part */
        for (int i = 0; i < nb_params_count(ps); i++) {
            const char *name;
            nb_params_at(ps, i, &name);
            ck_assert_int_eq(nb_gpt_decays(&m, name), nb_optim_weight_decay(opt, name) == 0.1);
        }
        ck_assert_int_eq(nb_gpt_decays(&m, "lm_head.weight"), tied ? -1 : 1);
        expect_error_rc(nb_gpt_decays(&m, "transformer.h.9.mlp.c_fc.weight"), "nb_gpt_decays",
                        "the model has no parameter \"transformer.h.9.mlp.c_fc.weight\"");
        expect_error_rc(nb_gpt_decays(&m, NULL), "nb_gpt_decays: name is NULL");
        expect_error_rc(nb_gpt_decays(NULL, "lm_head.weight"), "nb_gpt_decays: model is NULL");
        /* bad values and a foreign optimizer change nothing */
        expect_error_rc(nb_gpt_set_weight_decay(&m, opt, -0.5), "nb_gpt_set_weight_decay",
                        "invalid weight_decay -0.5 (must be >= 0 and finite)");
        expect_error_rc(nb_gpt_set_weight_decay(&m, opt, NAN), "nb_gpt_set_weight_decay",
                        "invalid weight_decay nan");
        expect_error_rc(nb_gpt_set_weight_decay(&m, opt, INFINITY), "nb_gpt_set_weight_decay",
                        "invalid weight_decay inf");
        expect_gpt_decay(opt, ps, tied, 0.1);
        nb_params *other = nb_params_new();
        nb_GPTConfig small = c;
        small.n_layer = 1; /* lacks transformer.h.1.* */
        nb_GPT m1;
        OK_RC(nb_gpt_init(&m1, other, &small, NULL));
        nb_optim *o1 = nb_adamw(other, 1e-3, 0.9, 0.95, 1e-8, 0.3);
        OK(o1);
        expect_error_rc(nb_gpt_set_weight_decay(&m, o1, 0.2), "nb_gpt_set_weight_decay",
                        "the optimizer has no parameter \"transformer.h.1.attn.c_attn.weight\"");
        for (int i = 0; i < nb_params_count(other); i++) {
            const char *name;
            nb_params_at(other, i, &name);
            ck_assert_msg(nb_optim_weight_decay(o1, name) == 0.3, "%s changed", name);
        }
        expect_error_rc(nb_gpt_set_weight_decay(&m, NULL, 0.1), "nb_gpt_set_weight_decay");
        expect_error_rc(nb_gpt_set_weight_decay(NULL, opt, 0.1),
                        "nb_gpt_set_weight_decay: model is NULL");
        /* 0 clears them all */
        OK_RC(nb_gpt_set_weight_decay(&m, opt, 0.0));
        expect_gpt_decay(opt, ps, tied, 0.0);
        nb_optim_free(o1);
        nb_gpt_free(&m1);
        nb_params_free(other);
        nb_optim_free(opt);
        nb_gpt_free(&m);
        nb_params_free(ps);
    }
    ck_assert_int_eq(nb_live_tensors(), base);
}
END_TEST

static nb_tensor *add_param(nb_params *ps, const char *name, nb_tensor *init) {
    nb_scope_begin();
    nb_tensor *z = nb_zeros(NB_F64, nb_ndim(init), nb_shape(init));
    OK_RC(nb_copy_into(z, init));
    nb_tensor *p = nb_params_add(ps, name, z);
    nb_scope_end();
    OK(p);
    return p;
}

/* d/dp sum(p * g) = g: g into p's .grad */
static void add_grad(nb_tensor *p, nb_tensor *g) {
    nb_scope_begin();
    OK_RC(nb_backward(nb_sum_all(nb_mul(p, g))));
    nb_scope_end();
}

/* torch.optim.AdamW with groups {w, e: weight_decay 0.5} and {b: 0}: both
 * ways of setting it up (the default for all and 0 for b; 0 for all and 0.5
 * for w and e) follow PyTorch's trajectory. */
START_TEST(adamw_two_groups_match_pytorch) {
    static const char *const names[] = {"w", "b", "e"};
    nb_tensor *init[3], *grads[3], *after[3];
    for (int k = 0; k < 3; k++) {
        char key[32];
        snprintf(key, sizeof key, "aw_init_%s", names[k]);
        init[k] = fx(FX, key);
        snprintf(key, sizeof key, "aw_grad_%s", names[k]);
        grads[k] = fx(FX, key);
        snprintf(key, sizeof key, "aw_after_%s", names[k]);
        after[k] = fx(FX, key);
    }
    int64_t base = nb_live_tensors();
    for (int way = 0; way < 2; way++) {
        nb_params *ps = nb_params_new();
        nb_tensor *p[3];
        for (int k = 0; k < 3; k++) p[k] = add_param(ps, names[k], init[k]);
        nb_optim *opt = nb_adamw(ps, 0.05, 0.9, 0.95, 1e-8, way == 0 ? 0.5 : 0.0);
        OK(opt);
        if (way == 0) {
            OK_RC(nb_optim_set_weight_decay(opt, "b", 0.0));
        } else {
            OK_RC(nb_optim_set_weight_decay(opt, NULL, 0.0));
            OK_RC(nb_optim_set_weight_decay(opt, "w", 0.5));
            OK_RC(nb_optim_set_weight_decay(opt, "e", 0.5));
        }
        ck_assert(nb_optim_weight_decay(opt, "w") == 0.5 && nb_optim_weight_decay(opt, "e") == 0.5 &&
                  nb_optim_weight_decay(opt, "b") == 0.0);
        ck_assert(nb_optim_weight_decay(opt, NULL) == (way == 0 ? 0.5 : 0.0));
        for (int s = 0; s < 5; s++) {
            nb_scope_begin();
            for (int k = 0; k < 3; k++) add_grad(p[k], nb_select(grads[k], 0, s));
            nb_optim_step(opt);
            ck_assert_ptr_null(nb_last_error());
            for (int k = 0; k < 3; k++) expect_close(p[k], nb_select(after[k], 0, s), 1e-13, 1e-12);
            nb_optim_zero_grad(opt);
            nb_scope_end();
        }
        nb_optim_free(opt);
        nb_params_free(ps);
    }
    ck_assert_int_eq(nb_live_tensors(), base);
}
END_TEST

/* For SGD, Adam and AdamW: a parameter given its own weight decay moves as it
 * would in an optimizer of that weight decay alone. */
START_TEST(per_parameter_decay_in_every_optimizer) {
    nb_tensor *iw = fx(FX, "aw_init_w"), *ib = fx(FX, "aw_init_b");
    nb_tensor *gw = fx(FX, "aw_grad_w"), *gb = fx(FX, "aw_grad_b");
    int64_t base = nb_live_tensors();
    for (int kind = 0; kind < 3; kind++) {
        nb_params *ps = nb_params_new(), *pw = nb_params_new(), *pb = nb_params_new();
        nb_tensor *w = add_param(ps, "w", iw), *b = add_param(ps, "b", ib);
        nb_tensor *w1 = add_param(pw, "w", iw), *b1 = add_param(pb, "b", ib);
        nb_optim *o[3];
        double wd[3] = {0.3, 0.3, 0.0};
        nb_params *reg[3] = {ps, pw, pb};
        for (int i = 0; i < 3; i++) {
            o[i] = kind == 0 ? nb_sgd(reg[i], 0.1, 0.9, wd[i])
                 : kind == 1 ? nb_adam(reg[i], 0.05, 0.9, 0.99, 1e-8, wd[i])
                             : nb_adamw(reg[i], 0.05, 0.9, 0.99, 1e-8, wd[i]);
            OK(o[i]);
        }
        OK_RC(nb_optim_set_weight_decay(o[0], "b", 0.0));
        for (int s = 0; s < 3; s++) {
            nb_scope_begin();
            add_grad(w, nb_select(gw, 0, s));
            add_grad(b, nb_select(gb, 0, s));
            add_grad(w1, nb_select(gw, 0, s));
            add_grad(b1, nb_select(gb, 0, s));
            for (int i = 0; i < 3; i++) {
                nb_optim_step(o[i]);
                nb_optim_zero_grad(o[i]);
            }
            nb_scope_end();
            expect_close(w, w1, 0, 0);
            expect_close(b, b1, 0, 0);
        }
        /* and the decay does act on w: without it w would be elsewhere */
        nb_params *pz = nb_params_new();
        nb_tensor *wz = add_param(pz, "w", iw);
        nb_optim *oz = kind == 0 ? nb_sgd(pz, 0.1, 0.9, 0.0)
                     : kind == 1 ? nb_adam(pz, 0.05, 0.9, 0.99, 1e-8, 0.0)
                                 : nb_adamw(pz, 0.05, 0.9, 0.99, 1e-8, 0.0);
        for (int s = 0; s < 3; s++) {
            nb_scope_begin();
            add_grad(wz, nb_select(gw, 0, s));
            nb_optim_step(oz);
            nb_optim_zero_grad(oz);
            nb_scope_end();
        }
        double *x = values(w), *y = values(wz), dev = 0;
        for (int i = 0; i < 12; i++) dev = fmax(dev, fabs(x[i] - y[i]));
        free(x);
        free(y);
        ck_assert_msg(dev > 1e-4, "kind %d: weight decay had no effect (%g)", kind, dev);
        nb_optim_free(oz);
        nb_params_free(pz);
        for (int i = 0; i < 3; i++) nb_optim_free(o[i]);
        nb_params_free(ps);
        nb_params_free(pw);
        nb_params_free(pb);
    }
    ck_assert_int_eq(nb_live_tensors(), base);
}
END_TEST

START_TEST(optim_weight_decay_errors) {
    nb_tensor *iw = fx(FX, "aw_init_w"), *ib = fx(FX, "aw_init_b");
    int64_t base = nb_live_tensors();
    nb_params *ps = nb_params_new();
    add_param(ps, "w", iw);
    add_param(ps, "b", ib);
    nb_optim *opt = nb_adamw(ps, 1e-3, 0.9, 0.95, 1e-8, 0.2);
    OK(opt);
    OK_RC(nb_optim_set_weight_decay(opt, "b", 0.05));
    const double bad[] = {-1.0, -1e-300, NAN, INFINITY};
    const char *shown[] = {"invalid weight_decay -1 (must be >= 0 and finite)",
                           "invalid weight_decay -1e-300", "invalid weight_decay nan",
                           "invalid weight_decay inf"};
    for (int i = 0; i < 4; i++) {
        expect_error_rc(nb_optim_set_weight_decay(opt, "w", bad[i]), "nb_optim_set_weight_decay: ",
                        shown[i]);
        expect_error_rc(nb_optim_set_weight_decay(opt, NULL, bad[i]), "nb_optim_set_weight_decay: ",
                        shown[i]);
    }
    expect_error_rc(nb_optim_set_weight_decay(opt, "nope", 0.1),
                    "nb_optim_set_weight_decay: the optimizer has no parameter \"nope\"");
    expect_error_rc(nb_optim_set_weight_decay(NULL, "w", 0.1), "nb_optim_set_weight_decay");
    /* nothing changed */
    ck_assert(nb_optim_weight_decay(opt, "w") == 0.2);
    ck_assert(nb_optim_weight_decay(opt, "b") == 0.05);
    ck_assert(nb_optim_weight_decay(opt, NULL) == 0.2);
    ck_assert_ptr_null(nb_last_error());
    /* reading an unknown name or a NULL optimizer: NaN and a message */
    ck_assert(isnan(nb_optim_weight_decay(opt, "nope")));
    ck_assert_ptr_nonnull(strstr(nb_last_error(),
                                 "nb_optim_weight_decay: the optimizer has no parameter \"nope\""));
    nb_clear_error();
    ck_assert(isnan(nb_optim_weight_decay(NULL, "w")));
    ck_assert_ptr_nonnull(strstr(nb_last_error(), "nb_optim_weight_decay"));
    nb_clear_error();
    /* NULL sets every parameter */
    OK_RC(nb_optim_set_weight_decay(opt, NULL, 0.0));
    ck_assert(nb_optim_weight_decay(opt, "w") == 0.0 && nb_optim_weight_decay(opt, "b") == 0.0);
    nb_optim_free(opt);
    nb_params_free(ps);
    ck_assert_int_eq(nb_live_tensors(), base);
}
END_TEST

/* ------------------------------------------------- activations, feed-forward */
START_TEST(activate_is_the_op) {
    int64_t base = nb_live_tensors();
    typedef nb_tensor *(*op_fn)(nb_tensor *);
    const op_fn ops[] = {nb_relu, nb_gelu, nb_gelu_tanh, nb_silu};
    const nb_activation acts[] = {NB_ACT_RELU, NB_ACT_GELU, NB_ACT_GELU_TANH, NB_ACT_SILU};
    ck_assert(NB_ACT_RELU == 0 && NB_ACT_GELU == 1 && NB_ACT_GELU_TANH == 2 && NB_ACT_SILU == 3);
    nb_tensor *x = rand_leaf(3, NB_SHAPE(3, 5));
    nb_tensor *xf = nb_to(x, NB_F32); /* f32 too */
    for (int i = 0; i < 4; i++) {
        nb_scope_begin();
        nb_tensor *got = nb_activate(x, acts[i]), *want = ops[i](x);
        expect_close(got, want, 0, 0);
        expect_close(nb_activate(xf, acts[i]), ops[i](xf), 0, 0);
        ck_assert_int_eq(nb_dtype_of(nb_activate(xf, acts[i])), NB_F32);
        OK_RC(nb_backward(nb_sum_all(nb_mul(got, got))));
        double *g1 = values(nb_grad(x));
        nb_zero_grad(x);
        OK_RC(nb_backward(nb_sum_all(nb_mul(want, want))));
        double *g2 = values(nb_grad(x));
        nb_zero_grad(x);
        for (int k = 0; k < 15; k++) ck_assert(g1[k] == g2[k]);
        free(g1);
        free(g2);
        nb_scope_end();
    }
    /* the activations differ from one another on these values */
    nb_scope_begin();
    double *r = values(nb_activate(x, NB_ACT_GELU)), *t = values(nb_activate(x, NB_ACT_GELU_TANH));
    double d = 0;
    for (int k = 0; k < 15; k++) d = fmax(d, fabs(r[k] - t[k]));
    ck_assert(d > 1e-6 && d < 1e-2); /* tanh's approximation is close to erf's, not equal */
    free(r);
    free(t);
    expect_error(nb_activate(x, (nb_activation)4), "nb_activate: unknown activation 4 "
                 "(NB_ACT_RELU, NB_ACT_GELU, NB_ACT_GELU_TANH or NB_ACT_SILU)");
    expect_error(nb_activate(x, (nb_activation)-1), "nb_activate: unknown activation -1");
    expect_error(nb_activate(NULL, NB_ACT_RELU), "nb_activate: input 0 is NULL");
    nb_tensor *ints = nb_zeros(NB_I64, NB_SHAPE(2));
    expect_error(nb_activate(ints, NB_ACT_GELU_TANH), "nb_activate");
    nb_scope_end();
    nb_free(xf);
    nb_free(x);
    ck_assert_int_eq(nb_live_tensors(), base);
}
END_TEST

START_TEST(feedforward_gelu_tanh_matches_pytorch) {
    nb_tensor *x0 = fx(FX, "ff_x"), *gy = fx(FX, "ff_gy");
    static const char *const names[] = {"ff.w_1.weight", "ff.w_1.bias", "ff.w_2.weight", "ff.w_2.bias"};
    for (int i = 0; i < 4; i++) fx(FX, names[i]);
    fx(FX, "ff_y");
    fx(FX, "ff_gx");
    fx(FX, "ff_gw1");
    int64_t base = nb_live_tensors();
    nb_set_default_dtype(NB_F64);
    nb_params *ps = nb_params_new();
    nb_FeedForward ff;
    OK_RC(nb_feedforward_init(&ff, ps, "ff", 4, 8, 0.0, NULL));
    nb_set_default_dtype(NB_F32);
    ck_assert_int_eq(ff.activation, NB_ACT_RELU); /* The Annotated Transformer's, by default */
    for (int i = 0; i < 4; i++) OK_RC(nb_copy_into(param(ps, names[i]), fx(FX, names[i])));
    nb_tensor *x = add_param(ps, "x", x0); /* a leaf that requires grad */
    nb_scope_begin();
    nb_tensor *relu = nb_feedforward_forward(&ff, x, false, NULL);
    OK(relu);
    ff.activation = NB_ACT_GELU_TANH;
    nb_tensor *y = nb_feedforward_forward(&ff, x, false, NULL);
    expect_close(y, fx(FX, "ff_y"), 1e-13, 1e-12);
    double *a = values(relu), *b = values(y), d = 0;
    for (int k = 0; k < 24; k++) d = fmax(d, fabs(a[k] - b[k]));
    free(a);
    free(b);
    ck_assert(d > 1e-3); /* the field is what chooses */
    OK_RC(nb_backward(nb_sum_all(nb_mul(y, gy))));
    expect_close(nb_grad(x), fx(FX, "ff_gx"), 1e-13, 1e-12);
    expect_close(nb_grad(ff.w_1.weight), fx(FX, "ff_gw1"), 1e-13, 1e-12);
    /* an unknown activation in the struct is an error of the forward */
    ff.activation = (nb_activation)9;
    expect_error(nb_feedforward_forward(&ff, x, false, NULL), "nb_feedforward_forward",
                 "unknown activation 9");
    nb_scope_end();
    nb_params_free(ps);
    ck_assert_int_eq(nb_live_tensors(), base);
}
END_TEST

/* ----------------------------------------------------------------------- errors */
START_TEST(init_errors) {
    int64_t base = nb_live_tensors();
    nb_params *ps = nb_params_new();
    nb_GPT m;
    nb_GPTConfig ok = fixture_cfg(), c;
    static const char *const sizes = "nb_gpt_init: sizes must be positive, got ";
#define BAD(field, value, ...)                                                                 \
    do {                                                                                       \
        c = ok;                                                                                \
        c.field = value;                                                                       \
        memset(&m, 0x5a, sizeof m);                                                            \
        expect_error_rc(nb_gpt_init(&m, ps, &c, NULL), __VA_ARGS__);                           \
        ck_assert_ptr_null(m.h);                                                               \
        ck_assert_int_eq(nb_params_count(ps), 0);                                              \
    } while (0)
    BAD(vocab_size, 0, sizes, "vocab_size 0, block_size 8, n_layer 2, n_head 2, n_embd 8");
    BAD(vocab_size, -3, sizes, "vocab_size -3,");
    BAD(block_size, 0, sizes, "block_size 0,");
    BAD(n_layer, 0, sizes, "n_layer 0,");
    BAD(n_head, -1, sizes, "n_head -1,");
    BAD(n_embd, 0, sizes, "n_embd 0");
    BAD(n_head, 3, "nb_gpt_init: n_embd 8 is not divisible by n_head 3");
    BAD(n_head, 16, "nb_gpt_init: n_embd 8 is not divisible by n_head 16");
    BAD(dropout, -0.1, "nb_gpt_init: dropout must be in [0, 1], got -0.1");
    BAD(dropout, 1.5, "nb_gpt_init: dropout must be in [0, 1], got 1.5");
    BAD(dropout, NAN, "nb_gpt_init: dropout must be in [0, 1], got nan");
    BAD(n_layer, 100001, "nb_gpt_init: n_layer 100001 is too large");
#undef BAD
    expect_error_rc(nb_gpt_init(NULL, ps, &ok, NULL), "nb_gpt_init: model, registry or config is NULL");
    expect_error_rc(nb_gpt_init(&m, NULL, &ok, NULL), "nb_gpt_init: model, registry or config is NULL");
    expect_error_rc(nb_gpt_init(&m, ps, NULL, NULL), "nb_gpt_init: model, registry or config is NULL");
    /* dropout 0 and 1 are fine */
    c = ok;
    c.dropout = 1.0;
    OK_RC(nb_gpt_init(&m, ps, &c, NULL));
    nb_gpt_free(&m);
    nb_params_free(ps);
    /* a failure midway (a name already taken): m is freed, what was
     * registered before stays in ps */
    ps = nb_params_new();
    nb_scope_begin();
    OK(nb_params_add(ps, "transformer.h.1.ln_2.weight", nb_zeros(NB_F32, NB_SHAPE(8))));
    nb_scope_end();
    expect_error_rc(nb_gpt_init(&m, ps, &ok, NULL), "nb_gpt_init", "transformer.h.1.ln_2.weight");
    ck_assert_ptr_null(m.h);
    ck_assert_ptr_nonnull(nb_params_get(ps, "transformer.h.1.attn.c_proj.bias"));
    nb_gpt_free(&m);
    nb_params_free(ps);
    ck_assert_int_eq(nb_live_tensors(), base);
}
END_TEST

START_TEST(forward_and_loss_errors) {
    nb_tensor *idx = fx(FX, "idx"), *tg = fx(FX, "targets");
    int64_t base = nb_live_tensors();
    nb_GPTConfig c = fixture_cfg();
    nb_params *ps = nb_params_new();
    nb_GPT m;
    OK_RC(nb_gpt_init(&m, ps, &c, NULL));
    nb_scope_begin();
    nb_tensor *f = nb_zeros(NB_F64, NB_SHAPE(2, 3));
    expect_error(nb_gpt_forward(&m, f, false, NULL),
                 "nb_gpt_forward: idx must be i64 (B, T), got f64 (2,3)");
    expect_error(nb_gpt_forward(&m, nb_zeros(NB_I64, NB_SHAPE(6)), false, NULL),
                 "nb_gpt_forward: idx must be i64 (B, T), got i64 (6)");
    expect_error(nb_gpt_forward(&m, nb_zeros(NB_I64, NB_SHAPE(1, 2, 3)), false, NULL),
                 "nb_gpt_forward: idx must be i64 (B, T), got i64 (1,2,3)");
    expect_error(nb_gpt_forward(&m, nb_zeros(NB_I64, NB_SHAPE(1, 9)), false, NULL),
                 "nb_gpt_forward: idx has T = 9; it must be in 1..block_size 8");
    expect_error(nb_gpt_forward(&m, nb_zeros(NB_I64, NB_SHAPE(2, 0)), false, NULL),
                 "nb_gpt_forward: idx has T = 0; it must be in 1..block_size 8");
    int64_t bad[6] = {1, 2, 3, 4, 5, 6};
    bad[4] = 11;
    expect_error(nb_gpt_forward(&m, nb_from_data(NB_I64, NB_SHAPE(2, 3), bad), false, NULL),
                 "nb_gpt_forward: idx 11 at position 4 is out of range for vocab_size 11 "
                 "(valid: 0..10)");
    bad[4] = 4;
    bad[1] = -1; /* -1 is not a token in idx */
    expect_error(nb_gpt_forward(&m, nb_from_data(NB_I64, NB_SHAPE(2, 3), bad), false, NULL),
                 "nb_gpt_forward: idx -1 at position 1 is out of range for vocab_size 11 "
                 "(valid: 0..10)");
    expect_error(nb_gpt_forward(&m, NULL, false, NULL), "nb_gpt_forward: input 0 is NULL");
    expect_error(nb_gpt_forward(NULL, idx, false, NULL), "nb_gpt_forward: model is NULL");
    nb_GPT blank = {0};
    expect_error(nb_gpt_forward(&blank, idx, false, NULL),
                 "nb_gpt_forward: model is not initialized (use nb_gpt_init)");
    /* the loss checks idx as the forward does, then the targets */
    expect_error(nb_gpt_loss(&m, nb_zeros(NB_I64, NB_SHAPE(1, 9)), nb_zeros(NB_I64, NB_SHAPE(1, 9)),
                             false, NULL),
                 "nb_gpt_loss: idx has T = 9; it must be in 1..block_size 8");
    expect_error(nb_gpt_loss(&m, idx, nb_zeros(NB_I64, NB_SHAPE(2, 5)), false, NULL),
                 "nb_gpt_loss: targets i64 (2,5) must be i64 of idx's shape (2,6)");
    expect_error(nb_gpt_loss(&m, idx, nb_zeros(NB_I64, NB_SHAPE(12)), false, NULL),
                 "nb_gpt_loss: targets i64 (12) must be i64 of idx's shape (2,6)");
    expect_error(nb_gpt_loss(&m, idx, nb_zeros(NB_F32, NB_SHAPE(2, 6)), false, NULL),
                 "nb_gpt_loss: targets f32 (2,6) must be i64 of idx's shape (2,6)");
    int64_t t[12] = {0};
    t[7] = 11;
    expect_error(nb_gpt_loss(&m, idx, nb_from_data(NB_I64, NB_SHAPE(2, 6), t), false, NULL),
                 "nb_gpt_loss: target 11 at position 7 is out of range for vocab_size 11 "
                 "(valid: 0..10, or -1 to ignore)");
    t[7] = -2;
    expect_error(nb_gpt_loss(&m, idx, nb_from_data(NB_I64, NB_SHAPE(2, 6), t), false, NULL),
                 "nb_gpt_loss: target -2 at position 7 is out of range");
    expect_error(nb_gpt_loss(&m, idx, NULL, false, NULL), "nb_gpt_loss: input 1 is NULL");
    expect_error(nb_gpt_loss(NULL, idx, tg, false, NULL), "nb_gpt_loss: model is NULL");
    /* -1 everywhere but one target is fine; all -1 is nb_cross_entropy's
     * mean of nothing */
    for (int i = 0; i < 12; i++) t[i] = -1;
    t[3] = 2;
    OK(nb_gpt_loss(&m, idx, nb_from_data(NB_I64, NB_SHAPE(2, 6), t), false, NULL));
    /* a non-contiguous idx is read correctly: the transpose of a (6,2) */
    int64_t tr[12];
    const int64_t *pi = nb_data(idx);
    for (int b = 0; b < 2; b++)
        for (int s = 0; s < 6; s++) tr[s * 2 + b] = pi[b * 6 + s];
    nb_tensor *idx_t = nb_transpose(nb_from_data(NB_I64, NB_SHAPE(6, 2), tr), 0, 1);
    ck_assert(!nb_is_contiguous(idx_t));
    expect_close(nb_gpt_forward(&m, idx_t, false, NULL), nb_gpt_forward(&m, idx, false, NULL), 0, 0);
    nb_scope_end();
    nb_gpt_free(&m);
    nb_params_free(ps);
    ck_assert_int_eq(nb_live_tensors(), base);
}
END_TEST

Suite *suite_gpt(void) {
    Suite *s = suite_create("gpt");
    TCase *tc = tcase_create("gpt");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, names_order_and_counts);
    tcase_add_test(tc, init_statistics);
    tcase_add_test(tc, init_seeds);
    tcase_add_test(tc, forward_loss_grads_match_pytorch);
    tcase_add_test(tc, untied_and_f32_match_pytorch);
    tcase_add_test(tc, tied_gradient_is_the_sum_and_moves_together);
    tcase_add_test(tc, dropout_train_and_eval);
    tcase_add_test(tc, training_forward_matches_written_out_forward);
    tcase_add_test(tc, loss_gradcheck);
    tcase_add_test(tc, loss_higher_order);
    tcase_add_test(tc, generate_matches_full_forward);
    tcase_add_test(tc, generate_bf16);
    tcase_add_test(tc, generate_bf16_follows_one_element);
    tcase_add_test(tc, generate_bf16_logits_near_f32);
    tcase_add_test(tc, trained_model_continues_pattern);
    tcase_add_test(tc, sampling_options);
    tcase_add_test(tc, on_token_stops_early);
    tcase_add_test(tc, generate_errors);
    tcase_add_test(tc, gpt_weight_decay_groups);
    tcase_add_test(tc, adamw_two_groups_match_pytorch);
    tcase_add_test(tc, per_parameter_decay_in_every_optimizer);
    tcase_add_test(tc, optim_weight_decay_errors);
    tcase_add_test(tc, activate_is_the_op);
    tcase_add_test(tc, feedforward_gelu_tanh_matches_pytorch);
    tcase_add_test(tc, init_errors);
    tcase_add_test(tc, forward_and_loss_errors);
    suite_add_tcase(s, tc);
    return s;
}
