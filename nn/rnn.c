/* rnn.c: one time step of torch.nn.RNNCell, GRUCell and LSTMCell, built from
 * public ops (nb_linear, nb_narrow, nb_sigmoid, nb_tanh, nb_relu and
 * elementwise arithmetic), so their gradients of every order come from the
 * ops'. Parameters under torch's names and in torch's gate order, so a
 * state_dict moves between the two through safetensors unchanged:
 *   weight_ih (G*H, I), weight_hh (G*H, H), bias_ih, bias_hh (G*H),
 *   G = 1 (RNN), 3 (GRU: r, z, n), 4 (LSTM: i, f, g, o).
 * Inputs: x (B, I) or (I); h and c (B, H) or (H) alike (NULL = zeros). */
#include <math.h>

#include "nn_internal.h"

enum { RNN_GATES = 1, GRU_GATES = 3, LSTM_GATES = 4 };

/* torch's RNNCellBase.reset_parameters: every parameter U(+-1/sqrt(H)), in
 * the order weight_ih, weight_hh, bias_ih, bias_hh. */
static int cell_init(const char *fn, nb_RNNCell *m, nb_params *ps, const char *name, int64_t in,
                     int64_t hidden, int gates, bool bias, bool relu, nb_rng *rng) {
    if (!m || !ps) return (nn_error("%s: module or registry is NULL", fn), -1);
    if (in <= 0 || hidden <= 0)
        return (nn_error("%s: sizes must be positive, got input_size %lld, hidden_size %lld", fn,
                         (long long)in, (long long)hidden), -1);
    if (hidden > INT64_MAX / gates)
        return (nn_error("%s: hidden_size %lld is too large", fn, (long long)hidden), -1);
    *m = (nb_RNNCell){.input_size = in, .hidden_size = hidden, .relu = relu};
    char buf[512];
    double bound = 1.0 / sqrt((double)hidden);
    int64_t gh = gates * hidden;
    m->weight_ih = nn_uniform_param(ps, nn_join(fn, buf, sizeof buf, name, "weight_ih"), 2,
                                    (const int64_t[]){gh, in}, bound, rng);
    if (!m->weight_ih) return -1;
    m->weight_hh = nn_uniform_param(ps, nn_join(fn, buf, sizeof buf, name, "weight_hh"), 2,
                                    (const int64_t[]){gh, hidden}, bound, rng);
    if (!m->weight_hh || !bias) return m->weight_hh ? 0 : -1;
    m->bias_ih = nn_uniform_param(ps, nn_join(fn, buf, sizeof buf, name, "bias_ih"), 1, &gh,
                                  bound, rng);
    if (!m->bias_ih) return -1;
    m->bias_hh = nn_uniform_param(ps, nn_join(fn, buf, sizeof buf, name, "bias_hh"), 1, &gh,
                                  bound, rng);
    return m->bias_hh ? 0 : -1;
}

int nb_rnncell_init(nb_RNNCell *m, nb_params *ps, const char *name, int64_t input_size,
                    int64_t hidden_size, bool bias, bool relu, nb_rng *rng) {
    nn_enter();
    return nn_leave_rc("nb_rnncell_init", cell_init("nb_rnncell_init", m, ps, name, input_size,
                                                    hidden_size, RNN_GATES, bias, relu, rng));
}

int nb_grucell_init(nb_GRUCell *m, nb_params *ps, const char *name, int64_t input_size,
                    int64_t hidden_size, bool bias, nb_rng *rng) {
    nn_enter();
    return nn_leave_rc("nb_grucell_init", cell_init("nb_grucell_init", m, ps, name, input_size,
                                                    hidden_size, GRU_GATES, bias, false, rng));
}

int nb_lstmcell_init(nb_LSTMCell *m, nb_params *ps, const char *name, int64_t input_size,
                     int64_t hidden_size, bool bias, nb_rng *rng) {
    nn_enter();
    return nn_leave_rc("nb_lstmcell_init", cell_init("nb_lstmcell_init", m, ps, name, input_size,
                                                     hidden_size, LSTM_GATES, bias, false, rng));
}

/* ------------------------------------------------------------ the checks */
static const char *const init_name[] = {"", "nb_rnncell_init", "", "nb_grucell_init",
                                        "nb_lstmcell_init"};

/* m is a cell of `gates` gates: its weights have the shapes that many gates
 * give (a GRU cell passed to nb_lstmcell_forward is named as such). */
static bool check_module(const char *fn, const nb_RNNCell *m, int gates) {
    if (!m) return nn_error("%s: module is NULL", fn), false;
    if (!m->weight_ih || !m->weight_hh || m->input_size <= 0 || m->hidden_size <= 0)
        return nn_error("%s: module is not initialized (use %s)", fn, init_name[gates]), false;
    int64_t H = m->hidden_size, I = m->input_size;
    const nb_tensor *w = m->weight_ih;
    if (nb_ndim(w) != 2 || nb_shape(w)[1] != I || nb_shape(w)[0] % H != 0 ||
        nb_shape(w)[0] / H != gates) {
        char s[128];
        return nn_error("%s: weight_ih %s is not that of a cell of %d gate%s (%lld, %lld): the "
                        "module was made by another init than %s", fn, NN_SHAPE(s, w), gates,
                        gates > 1 ? "s" : "", (long long)(gates * H), (long long)I,
                        init_name[gates]), false;
    }
    if ((m->bias_ih == NULL) != (m->bias_hh == NULL))
        return nn_error("%s: bias_ih and bias_hh must both be set or both be NULL", fn), false;
    return true;
}

/* x (B, I) or (I); s (B, H) or (H), batched as x ("h" or "c"), or NULL */
static bool check_state(const char *fn, const nb_RNNCell *m, nb_tensor *x, nb_tensor *s,
                        const char *what) {
    if (!s) return true;
    char sx[128], ss[128], se[128];
    int nd = nb_ndim(x);
    bool ok = nb_ndim(s) == nd && nb_shape(s)[nd - 1] == m->hidden_size &&
              (nd == 1 || nb_shape(s)[0] == nb_shape(x)[0]);
    if (!ok)
        return nn_error("%s: %s %s does not fit input %s: expected %s (hidden_size %lld)", fn,
                        what, NN_SHAPE(ss, s), NN_SHAPE(sx, x),
                        nd == 1 ? nn_shape_str(se, sizeof se, 1, &m->hidden_size)
                                : nn_shape_str(se, sizeof se, 2,
                                               (const int64_t[]){nb_shape(x)[0], m->hidden_size}),
                        (long long)m->hidden_size), false;
    if (nb_dtype_of(s) != nb_dtype_of(x))
        return nn_error("%s: %s is %s but input is %s", fn, what, nb_dtype_name(nb_dtype_of(s)),
                        nb_dtype_name(nb_dtype_of(x))), false;
    return true;
}

/* Everything a forward checks before computing: the module, x's shape and
 * dtype, h's and c's. */
static bool check_inputs(const char *fn, const nb_RNNCell *m, int gates, nb_tensor *x,
                         nb_tensor *h, nb_tensor *c) {
    if (!check_module(fn, m, gates)) return false;
    if (!nn_input(fn, x, 0) || !nn_opt_input(fn, h, 1) || !nn_opt_input(fn, c, 2)) return false;
    char s[128];
    int nd = nb_ndim(x);
    if (nd != 1 && nd != 2)
        return nn_error("%s: input must be 1-d (input_size) or 2-d (batch, input_size), got %s",
                        fn, NN_SHAPE(s, x)), false;
    if (nb_shape(x)[nd - 1] != m->input_size)
        return nn_error("%s: input %s: last dim must be input_size %lld", fn, NN_SHAPE(s, x),
                        (long long)m->input_size), false;
    if (nb_dtype_of(x) != nb_dtype_of(m->weight_ih))
        return nn_error("%s: input is %s but the parameters are %s", fn,
                        nb_dtype_name(nb_dtype_of(x)), nb_dtype_name(nb_dtype_of(m->weight_ih))),
               false;
    return check_state(fn, m, x, h, "h") && check_state(fn, m, x, c, "c");
}

/* zeros of x's batch shape with hidden_size features: (B, H) or (H). torch
 * uses zeros too, so that weight_hh gets a (zero) gradient as in torch. */
static nb_tensor *zero_state(const nb_RNNCell *m, nb_tensor *x) {
    int nd = nb_ndim(x);
    int64_t shape[2] = {nb_shape(x)[0], m->hidden_size};
    return nb_zeros(nb_dtype_of(x), nd, nd == 1 ? shape + 1 : shape);
}

/* gate k of a (..., G*H) matrix: a view (..., H) */
static nb_tensor *gate(nb_tensor *t, int k, int64_t H) { return nb_narrow(t, -1, k * H, H); }

/* ------------------------------------------------------------- the cells */
/* h' = act(x W_ih^T + b_ih + h W_hh^T + b_hh) */
static nb_tensor *rnncell_body(const nb_RNNCell *m, nb_tensor *x, nb_tensor *h) {
    const char *fn = "nb_rnncell_forward";
    if (!check_inputs(fn, m, RNN_GATES, x, h, NULL)) return NULL;
    if (!h) h = zero_state(m, x);
    nb_tensor *pre = nb_add(nb_linear(x, m->weight_ih, m->bias_ih),
                            nb_linear(h, m->weight_hh, m->bias_hh));
    return m->relu ? nb_relu(pre) : nb_tanh(pre);
}

nb_tensor *nb_rnncell_forward(const nb_RNNCell *m, nb_tensor *x, nb_tensor *h) {
    nn_enter();
    return nn_leave("nb_rnncell_forward", rnncell_body(m, x, h));
}

/* gi = x W_ih^T + b_ih, gh = h W_hh^T + b_hh, each (.., 3H) = (r | z | n):
 *   r = sigmoid(gi_r + gh_r), z = sigmoid(gi_z + gh_z),
 *   n = tanh(gi_n + r * gh_n), h' = (1 - z) n + z h = n + z (h - n) */
static nb_tensor *grucell_body(const nb_GRUCell *m, nb_tensor *x, nb_tensor *h) {
    const char *fn = "nb_grucell_forward";
    if (!check_inputs(fn, m, GRU_GATES, x, h, NULL)) return NULL;
    if (!h) h = zero_state(m, x);
    int64_t H = m->hidden_size;
    nb_tensor *gi = nb_linear(x, m->weight_ih, m->bias_ih);
    nb_tensor *gh = nb_linear(h, m->weight_hh, m->bias_hh);
    nb_tensor *r = nb_sigmoid(nb_add(gate(gi, 0, H), gate(gh, 0, H)));
    nb_tensor *z = nb_sigmoid(nb_add(gate(gi, 1, H), gate(gh, 1, H)));
    nb_tensor *n = nb_tanh(nb_add(gate(gi, 2, H), nb_mul(r, gate(gh, 2, H))));
    return nb_add(n, nb_mul(z, nb_sub(h, n)));
}

nb_tensor *nb_grucell_forward(const nb_GRUCell *m, nb_tensor *x, nb_tensor *h) {
    nn_enter();
    return nn_leave("nb_grucell_forward", grucell_body(m, x, h));
}

/* gates = x W_ih^T + b_ih + h W_hh^T + b_hh (.., 4H) = (i | f | g | o):
 *   c' = sigmoid(f) c + sigmoid(i) tanh(g), h' = sigmoid(o) tanh(c') */
static int lstmcell_body(const nb_LSTMCell *m, nb_tensor *x, nb_tensor *h, nb_tensor *c,
                         nb_tensor **h_out, nb_tensor **c_out) {
    const char *fn = "nb_lstmcell_forward";
    if (h_out) *h_out = NULL;
    if (c_out) *c_out = NULL;
    if (!h_out || !c_out) return (nn_error("%s: h_out and c_out must not be NULL", fn), -1);
    if (!check_inputs(fn, m, LSTM_GATES, x, h, c)) return -1;
    if (!h) h = zero_state(m, x);
    if (!c) c = zero_state(m, x);
    int64_t H = m->hidden_size;
    nb_tensor *g = nb_add(nb_linear(x, m->weight_ih, m->bias_ih),
                          nb_linear(h, m->weight_hh, m->bias_hh));
    nb_tensor *c2 = nb_add(nb_mul(nb_sigmoid(gate(g, 1, H)), c),
                           nb_mul(nb_sigmoid(gate(g, 0, H)), nb_tanh(gate(g, 2, H))));
    nb_tensor *h2 = nb_mul(nb_sigmoid(gate(g, 3, H)), nb_tanh(c2));
    if (!c2 || !h2) return -1;
    *h_out = h2;
    *c_out = c2;
    return 0;
}

int nb_lstmcell_forward(const nb_LSTMCell *m, nb_tensor *x, nb_tensor *h, nb_tensor *c,
                        nb_tensor **h_out, nb_tensor **c_out) {
    nn_enter();
    return nn_leave_rc("nb_lstmcell_forward", lstmcell_body(m, x, h, c, h_out, c_out));
}
