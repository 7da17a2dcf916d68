/* iter.c: walking several strided operands over one shape. Size-1 dims are
 * dropped and dims that are contiguous in every operand are merged, so a
 * contiguous tensor is one long inner row. */
#include "tensor_internal.h"

void nbi_iter_init(nbi_iter *it, int ndim, const int64_t *shape, int nops,
                   const int64_t *const *strides) {
    it->nops = nops;
    it->ndim = 0;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] == 1) continue;
        int k = it->ndim;
        bool merge = k > 0;
        for (int o = 0; o < nops && merge; o++)
            merge = it->st[o][k - 1] == strides[o][d] * shape[d];
        if (merge) {
            it->shape[k - 1] *= shape[d];
            for (int o = 0; o < nops; o++) it->st[o][k - 1] = strides[o][d];
            continue;
        }
        it->shape[k] = shape[d];
        for (int o = 0; o < nops; o++) it->st[o][k] = strides[o][d];
        it->ndim++;
    }
    int64_t numel = 1;
    for (int d = 0; d < ndim; d++) numel *= shape[d];
    if (it->ndim == 0) { /* a scalar, or all sizes 1 */
        it->ndim = 1;
        it->shape[0] = 1;
        for (int o = 0; o < nops; o++) it->st[o][0] = 0;
    }
    it->n = it->shape[it->ndim - 1];
    it->rows = numel == 0 ? 0 : numel / it->n;
}

nbi_cursor nbi_cursor_begin(const nbi_iter *it) {
    nbi_cursor c = {0};
    (void)it;
    return c;
}

nbi_cursor nbi_cursor_at(const nbi_iter *it, int64_t row) {
    nbi_cursor c = {.row = row};
    for (int d = it->ndim - 2; d >= 0 && row > 0; d--) {
        c.idx[d] = row % it->shape[d];
        row /= it->shape[d];
        for (int o = 0; o < it->nops; o++) c.off[o] += c.idx[d] * it->st[o][d];
    }
    return c;
}

void nbi_cursor_next(const nbi_iter *it, nbi_cursor *c) {
    c->row++;
    for (int d = it->ndim - 2; d >= 0; d--) {
        if (++c->idx[d] < it->shape[d]) {
            for (int o = 0; o < it->nops; o++) c->off[o] += it->st[o][d];
            return;
        }
        c->idx[d] = 0;
        for (int o = 0; o < it->nops; o++) c->off[o] -= it->st[o][d] * (it->shape[d] - 1);
    }
}
