/* mha.c: multi-head attention (The Annotated Transformer's MultiHeadedAttention,
 * batch first), built only from public ops:
 *
 *   q (B,Lq,d_model), k and v (B,Lk,d_model)
 *   project      w_q(q), w_k(k), w_v(v)                       (B,L,d_model)
 *   split heads  nb_view (B,L,H,d_k), nb_transpose(1,2)       (B,H,L,d_k)   views, no copy
 *   attention    nb_attention, mask broadcast to (B,H,Lq,Lk)  (B,H,Lq,d_k)
 *   merge heads  nb_transpose(1,2) (B,Lq,H,d_k), nb_reshape   (B,Lq,d_model) a copy
 *   output       w_o                                          (B,Lq,d_model)
 *
 * The merge copies because the transposed heads are not contiguous: nb_view
 * would refuse, nb_reshape copies (as .contiguous().view() in PyTorch).
 *
 * Parameters "<name>.w_q.weight", "<name>.w_q.bias", ..., "<name>.w_o.bias"
 * are registered in that order, as the state_dict of the PyTorch module with
 * four nn.Linear named w_q, w_k, w_v, w_o. Self-attention passes the same
 * tensor as q, k and v; cross-attention passes the memory as k and v
 * (Lq != Lk is fine). */
#include "nn_internal.h"


static int mha_init_body(nb_MHA *m, nb_params *ps, const char *name, int64_t d_model, int64_t heads,
                double dropout, bool bias, nb_rng *rng) {
    const char *fn = "nb_mha_init";
    if (!m || !ps) return (nn_error("%s: module or registry is NULL", fn), -1);
    if (d_model <= 0)
        return (nn_error("%s: d_model must be positive, got %lld", fn, (long long)d_model), -1);
    if (heads <= 0)
        return (nn_error("%s: heads must be positive, got %lld", fn, (long long)heads), -1);
    if (d_model % heads != 0)
        return (nn_error("%s: d_model %lld is not divisible by heads %lld", fn,
                         (long long)d_model, (long long)heads), -1);
    if (!(dropout >= 0.0 && dropout <= 1.0)) /* also rejects NaN */
        return (nn_error("%s: dropout must be in [0, 1], got %g", fn, dropout), -1);
    *m = (nb_MHA){.d_model = d_model, .heads = heads, .d_k = d_model / heads, .dropout = dropout};
    const char *names[4] = {"w_q", "w_k", "w_v", "w_o"};
    nb_Linear *lin[4] = {&m->w_q, &m->w_k, &m->w_v, &m->w_o};
    char buf[512];
    for (int i = 0; i < 4; i++)
        if (nb_linear_init(lin[i], ps, nn_join("nb_mha_init", buf, sizeof buf, name, names[i]),
                           d_model, d_model, bias, rng) < 0)
            return -1;
    return 0;
}

int nb_mha_init(nb_MHA *m, nb_params *ps, const char *name, int64_t d_model, int64_t heads,
                double dropout, bool bias, nb_rng *rng) {
    nn_enter();
    return nn_leave_rc("nb_mha_init", mha_init_body(m, ps, name, d_model, heads, dropout, bias, rng));
}

/* x (B,L,d_model) -> w(x) viewed (B,L,H,d_k) -> transposed (B,H,L,d_k) */
static nb_tensor *project_heads(const nb_MHA *m, const nb_Linear *w, nb_tensor *x) {
    int64_t B = nb_shape(x)[0], L = nb_shape(x)[1];
    nb_tensor *y = nb_linear_forward(w, x);
    return nb_transpose(nb_view(y, NB_SHAPE(B, L, m->heads, m->d_k)), 1, 2);
}

static nb_tensor *mha_forward_body(nb_MHA *m, nb_tensor *q, nb_tensor *k, nb_tensor *v,
                          nb_tensor *keep_mask, bool training, nb_rng *rng,
                          nb_tensor **weights_out) {
    const char *fn = "nb_mha_forward";
    char s1[128], s2[128], s3[128];
    if (weights_out) *weights_out = NULL;
    if (!m) return nn_error("%s: module is NULL", fn);
    if (!m->w_q.weight || !m->w_k.weight || !m->w_v.weight || !m->w_o.weight || m->heads <= 0 ||
        m->d_k * m->heads != m->d_model)
        return nn_error("%s: module is not initialized (use nb_mha_init)", fn);
    if (!nn_input(fn, q, 0) || !nn_input(fn, k, 1) || !nn_input(fn, v, 2) ||
        !nn_opt_input(fn, keep_mask, 3))
        return NULL;

    /* ---- q (B,Lq,d_model), k and v (B,Lk,d_model) */
    nb_tensor *in[3] = {q, k, v};
    const char *iname[3] = {"q", "k", "v"};
    nb_dtype pdt = nb_dtype_of(m->w_q.weight);
    for (int i = 0; i < 3; i++) {
        if (nb_ndim(in[i]) != 3)
            return nn_error("%s: %s must be 3-d (B, L, d_model), got %s", fn, iname[i],
                            NN_SHAPE(s1, in[i]));
        if (nb_shape(in[i])[2] != m->d_model)
            return nn_error("%s: %s %s must have last dim d_model %lld", fn, iname[i],
                            NN_SHAPE(s1, in[i]), (long long)m->d_model);
        if (nb_dtype_of(in[i]) != pdt)
            return nn_error("%s: %s is %s but the parameters are %s", fn, iname[i],
                            nb_dtype_name(nb_dtype_of(in[i])), nb_dtype_name(pdt));
    }
    int64_t B = nb_shape(q)[0], Lq = nb_shape(q)[1], Lk = nb_shape(k)[1], H = m->heads;
    if (nb_shape(k)[0] != B || nb_shape(v)[0] != B)
        return nn_error("%s: batch sizes differ: q %s, k %s, v %s", fn, NN_SHAPE(s1, q),
                        NN_SHAPE(s2, k), NN_SHAPE(s3, v));
    if (nb_shape(v)[1] != Lk)
        return nn_error("%s: k %s and v %s must have the same length Lk (%lld != %lld)", fn,
                        NN_SHAPE(s1, k), NN_SHAPE(s2, v), (long long)Lk, (long long)nb_shape(v)[1]);

    /* ---- the keep mask broadcasts to (B,H,Lq,Lk), unchanged */
    if (keep_mask) {
        if (nb_dtype_of(keep_mask) != NB_BOOL)
            return nn_error("%s: keep_mask must be bool (true = may attend), got %s %s", fn,
                            nb_dtype_name(nb_dtype_of(keep_mask)), NN_SHAPE(s1, keep_mask));
        const int64_t ws[4] = {B, H, Lq, Lk};
        int nm = nb_ndim(keep_mask);
        const int64_t *ms = nb_shape(keep_mask);
        bool ok = nm <= 4;
        for (int i = 0; ok && i < nm; i++) ok = ms[nm - 1 - i] == ws[3 - i] || ms[nm - 1 - i] == 1;
        if (!ok)
            return nn_error("%s: keep_mask %s cannot be broadcast to the attention weights' "
                            "shape %s (B,H,Lq,Lk)", fn, NN_SHAPE(s1, keep_mask),
                            nn_shape_str(s2, sizeof s2, 4, ws));
    }

    /* ---- project and split heads: (B,L,d_model) -> (B,H,L,d_k) */
    nb_tensor *qh = project_heads(m, &m->w_q, q);
    nb_tensor *kh = project_heads(m, &m->w_k, k);
    nb_tensor *vh = project_heads(m, &m->w_v, v);
    /* ---- attention per head: (B,H,Lq,d_k) */
    nb_tensor *att = nb_attention(qh, kh, vh, keep_mask, m->dropout, training, rng, weights_out);
    /* ---- merge heads: (B,H,Lq,d_k) -> (B,Lq,H,d_k) -> (B,Lq,d_model) (copies) */
    nb_tensor *merged = nb_reshape(nb_transpose(att, 1, 2), NB_SHAPE(B, Lq, m->d_model));
    nb_tensor *out = nb_linear_forward(&m->w_o, merged);
    if (!out && weights_out) *weights_out = NULL;
    return out;
}

nb_tensor *nb_mha_forward(nb_MHA *m, nb_tensor *q, nb_tensor *k, nb_tensor *v,
                          nb_tensor *keep_mask, bool training, nb_rng *rng,
                          nb_tensor **weights_out) {
    nn_enter();
    return nn_leave("nb_mha_forward", mha_forward_body(m, q, k, v, keep_mask, training, rng, weights_out));
}
