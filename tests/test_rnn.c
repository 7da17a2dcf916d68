/* test_rnn.c: the recurrent cells nb_RNNCell, nb_GRUCell, nb_LSTMCell.
 * Against PyTorch (tests/fixtures/gen_rnn.py): weights written by PyTorch
 * load into nabla's cells by torch's names, and give torch's outputs and the
 * gradients of the inputs and of every parameter, batched, unbatched, with
 * h (and c) NULL and without bias; the file nabla writes loads into torch.
 * nb_gradcheck (first, second order and forward mode) in f64 on contiguous,
 * transposed and broadcast inputs; the init; the error messages. */
#include "test_util.h"

#include <stdlib.h>

Suite *suite_rnn(void);

static const char *FX = "rnn.txt";

#define CK_OK(expr) ck_assert_msg((expr) == 0, "%s", nb_last_error() ? nb_last_error() : "?")
#define CK_NN(t) ck_assert_msg((t) != NULL, "%s", nb_last_error() ? nb_last_error() : "?")

static const char *fixture_path(const char *name) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", NB_FIXTURE_DIR, name);
    return path;
}

static nb_tensor *fxn(const char *cs, const char *suffix) {
    char name[96];
    snprintf(name, sizeof name, "%s.%s", cs, suffix);
    return fx(FX, name);
}

/* ------------------------------------------------------------ the cells */
typedef enum { K_RNN, K_RNN_RELU, K_GRU, K_LSTM } kind;
static const char *const kind_name[] = {"rnn", "rnn_relu", "gru", "lstm"};

static int cell_init(kind k, nb_RNNCell *m, nb_params *ps, const char *name, bool bias,
                     nb_rng *rng) {
    switch (k) {
    case K_RNN: return nb_rnncell_init(m, ps, name, 3, 4, bias, false, rng);
    case K_RNN_RELU: return nb_rnncell_init(m, ps, name, 3, 4, bias, true, rng);
    case K_GRU: return nb_grucell_init(m, ps, name, 3, 4, bias, rng);
    default: return nb_lstmcell_init(m, ps, name, 3, 4, bias, rng);
    }
}

/* One step: h' (and c' in *c_out for an LSTM) */
static nb_tensor *cell_step(kind k, const nb_RNNCell *m, nb_tensor *x, nb_tensor *h, nb_tensor *c,
                            nb_tensor **c_out) {
    if (k == K_GRU) return nb_grucell_forward(m, x, h);
    if (k != K_LSTM) return nb_rnncell_forward(m, x, h);
    nb_tensor *h2;
    return nb_lstmcell_forward(m, x, h, c, &h2, c_out) ? NULL : h2;
}

/* The seven f64 cells of rnn_torch.safetensors, loaded from it. */
typedef struct {
    nb_params *ps;
    nb_RNNCell cell[4], cell_nb[4]; /* cell_nb[K_RNN_RELU] unused */
} torch_cells;

static void torch_cells_load(torch_cells *t) {
    nb_dtype saved = nb_default_dtype();
    nb_set_default_dtype(NB_F64);
    t->ps = nb_params_new();
    char name[32];
    for (int k = 0; k < 4; k++) {
        CK_OK(cell_init((kind)k, &t->cell[k], t->ps, kind_name[k], true, NULL));
        if (k == K_RNN_RELU) continue;
        snprintf(name, sizeof name, "%s_nb", kind_name[k]);
        CK_OK(cell_init((kind)k, &t->cell_nb[k], t->ps, name, false, NULL));
    }
    nb_set_default_dtype(saved);
    CK_OK(nb_load(t->ps, fixture_path("rnn_torch.safetensors")));
}

/* ------------------------------------------------------- values vs PyTorch */
typedef struct {
    const char *name; /* <cell>_<case> in rnn.txt */
    kind k;
    bool bias, given; /* h (and c) given, or NULL */
} vcase;

static const vcase vcases[] = {
    {"rnn_b", K_RNN, true, true},       {"rnn_u", K_RNN, true, true},
    {"rnn_b0", K_RNN, true, false},     {"rnn_nb_b", K_RNN, false, true},
    {"rnn_relu_b", K_RNN_RELU, true, true}, {"rnn_relu_u", K_RNN_RELU, true, true},
    {"rnn_relu_b0", K_RNN_RELU, true, false},
    {"gru_b", K_GRU, true, true},       {"gru_u", K_GRU, true, true},
    {"gru_b0", K_GRU, true, false},     {"gru_nb_b", K_GRU, false, true},
    {"lstm_b", K_LSTM, true, true},     {"lstm_u", K_LSTM, true, true},
    {"lstm_b0", K_LSTM, true, false},   {"lstm_nb_b", K_LSTM, false, true},
};
#define NVCASES (int)(sizeof vcases / sizeof vcases[0])

static nb_tensor *fx_leaf(const char *cs, const char *suffix) {
    return nb_set_requires_grad(nb_detach(fxn(cs, suffix)), true);
}

/* h' (and c') against torch's, then loss = sum(h' wh) + sum(c' wc)
 * backward: the gradients of x, h, c and every parameter, to 1e-12. */
START_TEST(test_vs_torch) {
    const vcase *v = &vcases[_i];
    bool lstm = v->k == K_LSTM;
    /* the fixtures first: they are persistent, loaded outside any scope */
    const char *const sfx[] = {"x", "h", "c", "wh", "wc", "out_h", "out_c", "gx", "gh", "gc"};
    for (int i = 0; i < 10; i++)
        if ((lstm || (strcmp(sfx[i], "c") && strcmp(sfx[i], "wc") && strcmp(sfx[i], "out_c") &&
                      strcmp(sfx[i], "gc"))) &&
            (v->given || (strcmp(sfx[i], "h") && strcmp(sfx[i], "c") && strcmp(sfx[i], "gh") &&
                          strcmp(sfx[i], "gc"))))
            fxn(v->name, sfx[i]);
    int64_t live = nb_live_tensors();
    torch_cells t;
    torch_cells_load(&t);
    const nb_RNNCell *m = v->bias ? &t.cell[v->k] : &t.cell_nb[v->k];
    nb_scope_begin();
    nb_tensor *x = fx_leaf(v->name, "x");
    nb_tensor *h = v->given ? fx_leaf(v->name, "h") : NULL;
    nb_tensor *c = v->given && lstm ? fx_leaf(v->name, "c") : NULL, *c2 = NULL;
    nb_tensor *h2 = cell_step(v->k, m, x, h, c, &c2);
    CK_NN(h2);
    expect_close(h2, fxn(v->name, "out_h"), 1e-12, 1e-12);
    nb_tensor *loss = nb_sum_all(nb_mul(h2, fxn(v->name, "wh")));
    if (lstm) {
        expect_close(c2, fxn(v->name, "out_c"), 1e-12, 1e-12);
        loss = nb_add(loss, nb_sum_all(nb_mul(c2, fxn(v->name, "wc"))));
    }
    CK_OK(nb_backward(loss));
    expect_close(nb_grad(x), fxn(v->name, "gx"), 1e-12, 1e-12);
    if (h) expect_close(nb_grad(h), fxn(v->name, "gh"), 1e-12, 1e-12);
    if (c) expect_close(nb_grad(c), fxn(v->name, "gc"), 1e-12, 1e-12);
    const struct {
        const char *name;
        nb_tensor *p;
    } ps[] = {{"g_weight_ih", m->weight_ih}, {"g_weight_hh", m->weight_hh},
              {"g_bias_ih", m->bias_ih}, {"g_bias_hh", m->bias_hh}};
    for (int i = 0; i < 4; i++) {
        if (!ps[i].p) continue;
        nb_tensor *g = nb_grad(ps[i].p);
        ck_assert_msg(g != NULL, "%s: %s has no gradient", v->name, ps[i].name + 2);
        expect_close(g, fxn(v->name, ps[i].name), 1e-12, 1e-12);
    }
    /* unbatched in, unbatched out */
    ck_assert_int_eq(nb_ndim(h2), nb_ndim(x));
    nb_scope_end();
    nb_params_free(t.ps); /* with the parameters' gradients */
    ck_assert_int_eq(nb_live_tensors(), live);
}
END_TEST

/* The registry holds torch's names, in torch's shapes. */
START_TEST(test_torch_names) {
    torch_cells t;
    torch_cells_load(&t);
    ck_assert_int_eq(nb_params_count(t.ps), 4 * 4 + 3 * 2);
    const char *name;
    nb_tensor *p = nb_params_at(t.ps, 0, &name);
    ck_assert_str_eq(name, "rnn.weight_ih");
    ck_assert_int_eq(nb_shape(p)[0], 4);
    ck_assert_int_eq(nb_shape(p)[1], 3);
    nb_tensor *w = nb_params_get(t.ps, "gru.weight_hh");
    CK_NN(w);
    ck_assert_int_eq(nb_shape(w)[0], 12);
    ck_assert_int_eq(nb_shape(w)[1], 4);
    w = nb_params_get(t.ps, "lstm.bias_hh");
    CK_NN(w);
    ck_assert_int_eq(nb_shape(w)[0], 16);
    ck_assert_ptr_eq(t.cell[K_LSTM].bias_hh, w);
    ck_assert_ptr_null(t.cell_nb[K_LSTM].bias_ih);
    ck_assert_ptr_null(t.cell_nb[K_LSTM].bias_hh);
    nb_params_free(t.ps);
}
END_TEST

/* nabla -> file -> PyTorch: the committed rnn_nabla.safetensors, which
 * PyTorch loaded (strict), is what nb_save writes for these cells, and
 * PyTorch's outputs on it are nabla's; it loads back into other cells. */
static void nabla_cells(nb_params **ps, nb_RNNCell *m, uint64_t seed) {
    nb_rng rng;
    nb_rng_seed(&rng, seed);
    *ps = nb_params_new();
    CK_OK(nb_rnncell_init(&m[0], *ps, "rnn", 3, 4, true, false, &rng));
    CK_OK(nb_grucell_init(&m[1], *ps, "gru", 3, 4, true, &rng));
    CK_OK(nb_lstmcell_init(&m[2], *ps, "lstm", 3, 4, true, &rng));
}

START_TEST(test_nabla_file_loads_into_torch) {
    nb_tensor *x = fx(FX, "nabla_file.x"), *h = fx(FX, "nabla_file.h");
    const char *want[] = {"nabla_file.rnn_h", "nabla_file.gru_h", "nabla_file.lstm_h",
                          "nabla_file.lstm_c"};
    for (int i = 0; i < 4; i++) fx(FX, want[i]);
    nb_params *ps, *ps2;
    nb_RNNCell m[3], m2[3];
    nabla_cells(&ps, m, 7);
    test_make_tmp_dir("rnn");
    const char *mine = test_tmp_path("rnn.safetensors");
    CK_OK(nb_save(ps, mine));
    if (getenv("NABLA_WRITE_FIXTURES")) CK_OK(nb_save(ps, fixture_path("rnn_nabla.safetensors")));
    size_t na, nb;
    char *a = test_read_file(mine, &na), *b = test_read_file(fixture_path("rnn_nabla.safetensors"), &nb);
    ck_assert_msg(na == nb && !memcmp(a, b, na), "nb_save wrote other bytes than "
                  "rnn_nabla.safetensors (%zu and %zu bytes)", na, nb);
    free(a);
    free(b);
    /* loaded into cells drawn from another seed, the outputs are torch's */
    nabla_cells(&ps2, m2, 99);
    CK_OK(nb_load(ps2, mine));
    nb_scope_begin();
    expect_close(nb_rnncell_forward(&m2[0], x, h), fx(FX, want[0]), 1e-6, 1e-5);
    expect_close(nb_grucell_forward(&m2[1], x, h), fx(FX, want[1]), 1e-6, 1e-5);
    nb_tensor *h2, *c2;
    CK_OK(nb_lstmcell_forward(&m2[2], x, h, h, &h2, &c2));
    expect_close(h2, fx(FX, want[2]), 1e-6, 1e-5);
    expect_close(c2, fx(FX, want[3]), 1e-6, 1e-5);
    nb_scope_end();
    test_remove_tmp_dir();
    nb_params_free(ps);
    nb_params_free(ps2);
}
END_TEST

/* ---------------------------------------------------------------- gradcheck
 * The cell as a function of all its tensors: in = x, h, [c,] weight_ih,
 * weight_hh[, bias_ih, bias_hh]; the module is a struct pointing at them.
 * An LSTM returns h' + 2 c' so that c' is checked too. */
typedef struct {
    kind k;
    bool bias;
    int64_t hidden;
    int64_t expand; /* > 0: h (and c) are (1, H) leaves expanded to (expand, H), stride 0 */
} gc_ctx;

static nb_tensor *gc_cell(nb_tensor **in, int n, void *ctx) {
    (void)n;
    const gc_ctx *g = ctx;
    bool lstm = g->k == K_LSTM;
    int w = lstm ? 3 : 2;
    nb_tensor *x = in[0], *h = in[1], *c = lstm ? in[2] : NULL;
    if (g->expand) {
        h = nb_expand(h, NB_SHAPE(g->expand, -1));
        c = c ? nb_expand(c, NB_SHAPE(g->expand, -1)) : NULL;
    }
    nb_RNNCell m = {.weight_ih = in[w], .weight_hh = in[w + 1],
                    .bias_ih = g->bias ? in[w + 2] : NULL, .bias_hh = g->bias ? in[w + 3] : NULL,
                    .input_size = nb_shape(x)[nb_ndim(x) - 1], .hidden_size = g->hidden,
                    .relu = g->k == K_RNN_RELU};
    nb_tensor *c2 = NULL, *h2 = cell_step(g->k, &m, x, h, c, &c2);
    return lstm ? nb_add(h2, nb_mul_scalar(c2, 2)) : h2;
}

/* a leaf of shape (rows, cols) stored transposed */
static nb_tensor *tr_leaf(uint64_t seed, int64_t rows, int64_t cols) {
    return transposed_leaf(seed, NB_SHAPE(rows, cols), 0, 1);
}

START_TEST(test_gradcheck) {
    const int64_t B = 2, I = 3, H = 2;
    nb_scope_begin();
    for (int k = 0; k < 4; k++) {
        int G = k == K_GRU ? 3 : k == K_LSTM ? 4 : 1, w = k == K_LSTM ? 3 : 2;
        char label[96];
        for (int variant = 0; variant < 4; variant++) {
            /* 0 contiguous, 1 transposed x and weight_hh, 2 h and c broadcast
             * from (1, H) (stride 0), 3 no bias */
            gc_ctx g = {(kind)k, variant != 3, H, variant == 2 ? B : 0};
            int64_t hb = variant == 2 ? 1 : B;
            nb_tensor *in[7];
            in[0] = variant == 1 ? tr_leaf(1, B, I) : rand_leaf(1, NB_SHAPE(B, I));
            in[1] = rand_leaf(2, NB_SHAPE(hb, H));
            if (k == K_LSTM) in[2] = rand_leaf(3, NB_SHAPE(hb, H));
            in[w] = rand_leaf(4, NB_SHAPE(G * H, I));
            in[w + 1] = variant == 1 ? tr_leaf(5, G * H, H) : rand_leaf(5, NB_SHAPE(G * H, H));
            in[w + 2] = rand_leaf(6, NB_SHAPE(G * H));
            in[w + 3] = rand_leaf(7, NB_SHAPE(G * H));
            int n = w + (variant == 3 ? 2 : 4);
            static const char *const vname[] = {"contiguous", "transposed x, weight_hh",
                                                "h (and c) broadcast", "no bias"};
            snprintf(label, sizeof label, "%s cell, %s", kind_name[k], vname[variant]);
            expect_all_orders(label, gc_cell, &g, n, in);
        }
        /* unbatched: x (I), h (H) */
        gc_ctx g = {(kind)k, true, H, 0};
        nb_tensor *in[7];
        in[0] = rand_leaf(8, NB_SHAPE(I));
        in[1] = rand_leaf(9, NB_SHAPE(H));
        if (k == K_LSTM) in[2] = rand_leaf(10, NB_SHAPE(H));
        in[w] = rand_leaf(4, NB_SHAPE(G * H, I));
        in[w + 1] = rand_leaf(5, NB_SHAPE(G * H, H));
        in[w + 2] = rand_leaf(6, NB_SHAPE(G * H));
        in[w + 3] = rand_leaf(7, NB_SHAPE(G * H));
        snprintf(label, sizeof label, "%s cell, unbatched", kind_name[k]);
        expect_gradcheck(label, gc_cell, &g, w + 4, in);
    }
    nb_scope_end();
}
END_TEST

/* The gradient flowing back into h' may be transposed or stride 0. */
START_TEST(test_strided_output_grads) {
    torch_cells t;
    torch_cells_load(&t);
    nb_scope_begin();
    for (int k = 0; k < 4; k++) {
        nb_tensor *x = rand_leaf(1, NB_SHAPE(2, 3)), *c2 = NULL;
        nb_tensor *h2 = cell_step((kind)k, &t.cell[k], x, NULL, NULL, &c2);
        CK_NN(h2);
        /* (2,4) from a (4,2) transposed, then from one (4) row expanded */
        nb_tensor *gt = nb_transpose(rand_leaf(2, NB_SHAPE(4, 2)), 0, 1);
        nb_tensor *ge = nb_expand(rand_leaf(3, NB_SHAPE(1, 4)), NB_SHAPE(2, 4));
        nb_tensor *gcon[2] = {nb_contiguous(gt), nb_contiguous(ge)}, *gs[2] = {gt, ge};
        double *want = NULL;
        for (int v = 0; v < 2; v++) {
            CK_OK(nb_backward_with_opts(h2, gcon[v], &(nb_backward_opts){.retain_graph = true}));
            double *a = values(nb_grad(x));
            nb_zero_grad(x);
            CK_OK(nb_backward_with_opts(h2, gs[v], &(nb_backward_opts){.retain_graph = true}));
            double *b = values(nb_grad(x));
            nb_zero_grad(x);
            for (int i = 0; i < 6; i++)
                ck_assert_msg(a[i] == b[i], "%s: grad %d differs with a strided output grad",
                              kind_name[k], i);
            free(a);
            free(b);
        }
        free(want);
    }
    nb_scope_end();
    nb_params_free(t.ps);
}
END_TEST

/* ----------------------------------------------------------------- init */
START_TEST(test_init) {
    nb_params *ps = nb_params_new();
    nb_rng rng;
    nb_rng_seed(&rng, 1);
    nb_LSTMCell l;
    CK_OK(nb_lstmcell_init(&l, ps, "enc.lstm", 5, 8, true, &rng));
    ck_assert_int_eq(l.input_size, 5);
    ck_assert_int_eq(l.hidden_size, 8);
    const char *names[] = {"enc.lstm.weight_ih", "enc.lstm.weight_hh", "enc.lstm.bias_ih",
                           "enc.lstm.bias_hh"};
    const int64_t numel[] = {32 * 5, 32 * 8, 32, 32};
    double bound = 1 / sqrt(8.0), lo = 1, hi = -1;
    for (int i = 0; i < 4; i++) {
        const char *name;
        nb_tensor *p = nb_params_at(ps, i, &name);
        ck_assert_str_eq(name, names[i]);
        ck_assert_int_eq(nb_numel(p), numel[i]);
        ck_assert_int_eq(nb_dtype_of(p), NB_F32);
        ck_assert(nb_requires_grad(p));
        double *v = values(p);
        for (int64_t j = 0; j < numel[i]; j++) lo = fmin(lo, v[j]), hi = fmax(hi, v[j]);
        free(v);
    }
    /* U(-1/sqrt(8), 1/sqrt(8)): within the bound, and filling most of it */
    ck_assert(lo >= -bound && hi <= bound);
    ck_assert(lo < -0.9 * bound && hi > 0.9 * bound);
    nb_GRUCell g;
    CK_OK(nb_grucell_init(&g, ps, "gru", 2, 3, false, &rng));
    ck_assert_int_eq(nb_params_count(ps), 6);
    ck_assert_ptr_null(g.bias_ih);
    ck_assert_int_eq(nb_shape(g.weight_ih)[0], 9);
    nb_RNNCell r;
    CK_OK(nb_rnncell_init(&r, ps, "r", 2, 3, true, true, &rng));
    ck_assert(r.relu);
    ck_assert_int_eq(nb_shape(r.weight_hh)[0], 3);
    /* the same seed draws the same weights */
    nb_params *ps2 = nb_params_new();
    nb_rng_seed(&rng, 1);
    nb_LSTMCell l2;
    CK_OK(nb_lstmcell_init(&l2, ps2, "enc.lstm", 5, 8, true, &rng));
    nb_scope_begin();
    ck_assert(nb_item(nb_sum_all(nb_abs(nb_sub(l.weight_hh, l2.weight_hh)))) == 0);
    nb_scope_end();
    nb_params_free(ps);
    nb_params_free(ps2);
}
END_TEST

/* ---------------------------------------------------------------- errors */
START_TEST(test_errors) {
    nb_params *ps = nb_params_new();
    nb_RNNCell r, g, l;
    expect_error_rc(nb_rnncell_init(NULL, ps, "r", 3, 4, true, false, NULL),
                    "nb_rnncell_init: module or registry is NULL");
    expect_error_rc(nb_grucell_init(&g, NULL, "g", 3, 4, true, NULL),
                    "nb_grucell_init: module or registry is NULL");
    expect_error_rc(nb_lstmcell_init(&l, ps, "l", 0, 4, true, NULL),
                    "nb_lstmcell_init: sizes must be positive, got input_size 0, hidden_size 4");
    expect_error_rc(nb_rnncell_init(&r, ps, "r", 3, -2, true, false, NULL),
                    "nb_rnncell_init: sizes must be positive, got input_size 3, hidden_size -2");
    expect_error_rc(nb_lstmcell_init(&l, ps, "l", 3, INT64_C(1) << 62, true, NULL),
                    "nb_lstmcell_init: hidden_size 4611686018427387904 is too large");
    ck_assert_int_eq(nb_params_count(ps), 0);
    CK_OK(nb_rnncell_init(&r, ps, "r", 3, 4, true, false, NULL));
    CK_OK(nb_grucell_init(&g, ps, "g", 3, 4, true, NULL));
    CK_OK(nb_lstmcell_init(&l, ps, "l", 3, 4, true, NULL));
    nb_LSTMCell dup;
    expect_error_rc(nb_lstmcell_init(&dup, ps, "l", 3, 4, true, NULL), "nb_lstmcell_init",
                    "l.weight_ih");
    nb_scope_begin();
    nb_tensor *x = nb_zeros(NB_F32, NB_SHAPE(2, 3)), *h = nb_zeros(NB_F32, NB_SHAPE(2, 4));
    nb_tensor *ho, *co;
    expect_error(nb_rnncell_forward(NULL, x, h), "nb_rnncell_forward: module is NULL");
    nb_RNNCell blank = {0};
    expect_error(nb_grucell_forward(&blank, x, h),
                 "nb_grucell_forward: module is not initialized (use nb_grucell_init)");
    /* a cell of another kind */
    expect_error(nb_grucell_forward(&l, x, h), "nb_grucell_forward: weight_ih (16,3) is not that "
                 "of a cell of 3 gates (12, 3): the module was made by another init than "
                 "nb_grucell_init");
    expect_error_rc(nb_lstmcell_forward(&r, x, h, h, &ho, &co),
                    "nb_lstmcell_forward: weight_ih (4,3) is not that of a cell of 4 gates");
    ck_assert_ptr_null(ho);
    ck_assert_ptr_null(co);
    expect_error(nb_rnncell_forward(&g, x, h), "cell of 1 gate (4, 3)", "nb_rnncell_init");
    nb_RNNCell half = r;
    half.bias_hh = NULL;
    expect_error(nb_rnncell_forward(&half, x, h),
                 "nb_rnncell_forward: bias_ih and bias_hh must both be set or both be NULL");
    /* inputs */
    expect_error(nb_rnncell_forward(&r, NULL, h), "nb_rnncell_forward: input 0 is NULL");
    expect_error(nb_rnncell_forward(&r, nb_zeros(NB_F32, NB_SHAPE(2, 5)), h),
                 "nb_rnncell_forward: input (2,5): last dim must be input_size 3");
    expect_error(nb_grucell_forward(&g, nb_zeros(NB_F32, NB_SHAPE(1, 2, 3)), NULL),
                 "nb_grucell_forward: input must be 1-d (input_size) or 2-d (batch, input_size), "
                 "got (1,2,3)");
    expect_error(nb_rnncell_forward(&r, nb_zeros(NB_F64, NB_SHAPE(2, 3)), NULL),
                 "nb_rnncell_forward: input is f64 but the parameters are f32");
    expect_error(nb_grucell_forward(&g, x, nb_zeros(NB_F32, NB_SHAPE(3, 4))),
                 "nb_grucell_forward: h (3,4) does not fit input (2,3): expected (2,4) "
                 "(hidden_size 4)");
    expect_error(nb_grucell_forward(&g, x, nb_zeros(NB_F32, NB_SHAPE(2, 5))),
                 "nb_grucell_forward: h (2,5) does not fit input (2,3): expected (2,4)");
    expect_error(nb_rnncell_forward(&r, nb_zeros(NB_F32, NB_SHAPE(3)), h),
                 "nb_rnncell_forward: h (2,4) does not fit input (3): expected (4)");
    expect_error(nb_rnncell_forward(&r, x, nb_zeros(NB_F64, NB_SHAPE(2, 4))),
                 "nb_rnncell_forward: h is f64 but input is f32");
    expect_error_rc(nb_lstmcell_forward(&l, x, h, nb_zeros(NB_F32, NB_SHAPE(2, 3)), &ho, &co),
                    "nb_lstmcell_forward: c (2,3) does not fit input (2,3): expected (2,4)");
    expect_error_rc(nb_lstmcell_forward(&l, x, h, NULL, NULL, &co),
                    "nb_lstmcell_forward: h_out and c_out must not be NULL");
    expect_error_rc(nb_lstmcell_forward(&l, x, NULL, x, &ho, &co), "nb_lstmcell_forward: c (2,3)");
    /* an earlier failure flows through as a NULL input */
    ck_assert_ptr_null(nb_rnncell_forward(&r, nb_view(x, NB_SHAPE(7)), h));
    expect_error_after("nb_rnncell_forward: input 0 is NULL",
                       "nb_view: shape (7) is invalid for input of shape (2,3) (6 elements)");
    /* and with good inputs, h NULL and c NULL are zeros */
    CK_OK(nb_lstmcell_forward(&l, x, NULL, NULL, &ho, &co));
    ck_assert_int_eq(nb_shape(ho)[1], 4);
    nb_scope_end();
    nb_params_free(ps);
}
END_TEST

/* ------------------------------------------- a sequence, trained a little
 * An LSTM over 6 steps of a batch of 4, 30 Adam steps on the sum of the
 * last h: the loss falls, the graph of 6 steps backpropagates, and the run
 * leaves no tensor behind (scopes free every step's tensors). */
START_TEST(test_sequence_trains) {
    nb_params *ps = nb_params_new();
    nb_rng rng;
    nb_rng_seed(&rng, 5);
    nb_LSTMCell l;
    CK_OK(nb_lstmcell_init(&l, ps, "l", 2, 6, true, &rng));
    nb_optim *opt = nb_adam(ps, 0.05, 0.9, 0.999, 1e-8, 0);
    CK_NN(opt);
    nb_tensor *xs = nb_randn(NB_F32, NB_SHAPE(6, 4, 2), &rng);
    int64_t live = 0;
    double first = 0, last = 0;
    for (int step = 0; step < 30; step++) {
        if (step == 1) live = nb_live_tensors(); /* the gradients exist from step 0 on */
        nb_scope_begin();
        nb_tensor *h = NULL, *c = NULL;
        for (int t = 0; t < 6; t++) CK_OK(nb_lstmcell_forward(&l, nb_select(xs, 0, t), h, c, &h, &c));
        nb_tensor *loss = nb_mean_all(nb_mul(nb_add_scalar(h, -0.5), nb_add_scalar(h, -0.5)));
        CK_NN(loss);
        if (step == 0) first = nb_item(loss);
        last = nb_item(loss);
        CK_OK(nb_backward(loss));
        nb_optim_step(opt);
        nb_optim_zero_grad(opt);
        nb_scope_end();
    }
    ck_assert_msg(last < 0.1 * first, "loss %g -> %g", first, last);
    ck_assert_int_eq(nb_live_tensors(), live);
    nb_free(xs);
    nb_optim_free(opt);
    nb_params_free(ps);
}
END_TEST

Suite *suite_rnn(void) {
    Suite *s = suite_create("rnn");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, test_vs_torch, 0, NVCASES);
    tcase_add_test(tc, test_torch_names);
    tcase_add_test(tc, test_nabla_file_loads_into_torch);
    tcase_add_test(tc, test_gradcheck);
    tcase_add_test(tc, test_strided_output_grads);
    tcase_add_test(tc, test_init);
    tcase_add_test(tc, test_errors);
    tcase_add_test(tc, test_sequence_trains);
    suite_add_tcase(s, tc);
    return s;
}
