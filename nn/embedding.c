/* embedding.c: a lookup table, as torch.nn.Embedding: row idx of the weight
 * for every index. Built on nb_index_select, whose backward adds the output
 * gradient back into the rows picked (repeated indices accumulate). */
#include "nn_internal.h"

/* The first value of idx (NB_I64, any strides) outside [0, size), walking
 * in row-major order; false when every value is in range. */
static bool first_out_of_range(nb_tensor *idx, int64_t size, int64_t *bad) {
    int nd = nb_ndim(idx);
    const int64_t *sh = nb_shape(idx), *st = nb_strides(idx);
    int64_t n = nb_numel(idx), c[NB_MAX_DIMS] = {0}, off = 0;
    const int64_t *p = nb_data(idx);
    for (int64_t k = 0; k < n; k++) {
        if (p[off] < 0 || p[off] >= size) return *bad = p[off], true;
        for (int d = nd - 1; d >= 0; d--) { /* next coordinate, last dim fastest */
            if (++c[d] < sh[d]) {
                off += st[d];
                break;
            }
            off -= st[d] * (sh[d] - 1);
            c[d] = 0;
        }
    }
    return false;
}

/* weight (num, dim), idx NB_I64 (...) -> (..., dim) */
static nb_tensor *embedding_body(nb_tensor *weight, nb_tensor *idx) {
    const char *fn = "nb_embedding";
    if (!nn_input(fn, weight, 0) || !nn_input(fn, idx, 1)) return NULL;
    if (nb_ndim(weight) != 2)
        return nn_error("%s: weight must be 2-d (num_embeddings, embedding_dim), got %d-d", fn,
                        nb_ndim(weight));
    if (nb_dtype_of(idx) != NB_I64)
        return nn_error("%s: indices must be i64, got %s", fn, nb_dtype_name(nb_dtype_of(idx)));
    int nd = nb_ndim(idx);
    if (nd >= NB_MAX_DIMS)
        return nn_error("%s: indices have %d dims; at most %d (the output adds one)", fn, nd,
                        NB_MAX_DIMS - 1);
    int64_t num = nb_shape(weight)[0], dim = nb_shape(weight)[1], bad;
    if (first_out_of_range(idx, num, &bad))
        return nn_error("%s: index %lld out of range for vocabulary size %lld (valid: 0..%lld)",
                        fn, (long long)bad, (long long)num, (long long)num - 1);
    int64_t shape[NB_MAX_DIMS];
    for (int i = 0; i < nd; i++) shape[i] = nb_shape(idx)[i];
    shape[nd] = dim;
    nb_tensor *flat = nb_reshape(idx, 1, (const int64_t[]){nb_numel(idx)});
    return nb_reshape(nb_index_select(weight, 0, flat), nd + 1, shape);
}

nb_tensor *nb_embedding(nb_tensor *weight, nb_tensor *idx) {
    nn_enter();
    return nn_leave("nb_embedding", embedding_body(weight, idx));
}

/* N(0, 1) weights, as torch.nn.Embedding's default */
static int embedding_init_body(nb_Embedding *m, nb_params *ps, const char *name, int64_t num, int64_t dim,
                      nb_rng *rng) {
    if (!m || !ps) return (nn_error("nb_embedding_init: module or registry is NULL"), -1);
    if (num <= 0 || dim <= 0)
        return (nn_error("nb_embedding_init: sizes must be positive, got num %lld, dim %lld",
                         (long long)num, (long long)dim), -1);
    char buf[512];
    *m = (nb_Embedding){.num_embeddings = num, .embedding_dim = dim};
    nb_scope_begin();
    nb_tensor *w = nb_randn(nb_default_dtype(), 2, (const int64_t[]){num, dim}, rng);
    m->weight =
        nb_params_add(ps, nn_join("nb_embedding_init", buf, sizeof buf, name, "weight"), w);
    nb_scope_end();
    return m->weight ? 0 : -1;
}

int nb_embedding_init(nb_Embedding *m, nb_params *ps, const char *name, int64_t num, int64_t dim,
                      nb_rng *rng) {
    nn_enter();
    return nn_leave_rc("nb_embedding_init", embedding_init_body(m, ps, name, num, dim, rng));
}

static nb_tensor *embedding_forward_body(const nb_Embedding *m, nb_tensor *idx) {
    if (!m) return nn_error("nb_embedding_forward: module is NULL");
    if (!nn_input("nb_embedding_forward", idx, 0)) return NULL;
    return nb_embedding(m->weight, idx);
}

nb_tensor *nb_embedding_forward(const nb_Embedding *m, nb_tensor *idx) {
    nn_enter();
    return nn_leave("nb_embedding_forward", embedding_forward_body(m, idx));
}
