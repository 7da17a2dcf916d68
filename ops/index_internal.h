/* index_internal.h: the scatter that puts values back where a gather or an
 * index_select read them; the backward rules of index.c, reduce.c (max,
 * min) and sort.c (sort, topk) use it. */
#ifndef NABLA_INDEX_INTERNAL_H
#define NABLA_INDEX_INTERNAL_H

#include "ops_internal.h"

typedef enum {
    NBI_SCATTER_SET, /* as nb_gather read (idx of src's shape), no position twice */
    NBI_SCATTER_ADD, /* as nb_gather read, repeated positions summed */
    NBI_INDEX_ADD    /* as nb_index_select read (1-d idx), repeated rows summed */
} nbi_scatter_mode;

/* src -> zeros of (ndim, shape) with src put back along dim at the indices
 * idx gives (in range: they came from a forward). Recorded as op when src
 * needs grad: its backward is nb_gather / nb_index_select of the gradient,
 * its tangent the same scatter of src's, so it differentiates any number
 * of times. */
nb_tensor *nbi_scatter(const char *op, nb_tensor *src, int dim, nb_tensor *idx,
                       nbi_scatter_mode mode, int ndim, const int64_t *shape);

#endif
