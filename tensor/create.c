/* create.c: making tensors: empty, filled, from data, ranges, random, masks;
 * the default dtype. */
#include "tensor_internal.h"

#include "bf16_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static nb_dtype default_dtype = NB_F32;

void nb_set_default_dtype(nb_dtype d) {
    if (nbi_is_float(d)) default_dtype = d;
    else nbi_error("nb_set_default_dtype: the default dtype must be f32 or f64, got %s",
                   nb_dtype_name(d));
}

nb_dtype nb_default_dtype(void) { return default_dtype; }

nb_tensor *nb_empty(nb_dtype dtype, int ndim, const int64_t *shape) {
    return nbi_new("nb_empty", dtype, ndim, shape, false);
}

nb_tensor *nb_zeros(nb_dtype dtype, int ndim, const int64_t *shape) {
    return nbi_new("nb_zeros", dtype, ndim, shape, true);
}

static void fill(nb_tensor *t, double v) {
    void *p = nbi_ptr(t);
    int64_t n = t->numel;
    switch (t->dtype) {
    case NB_F32: for (int64_t i = 0; i < n; i++) ((float *)p)[i] = (float)v; break;
    case NB_F64: for (int64_t i = 0; i < n; i++) ((double *)p)[i] = v; break;
    case NB_I64: for (int64_t i = 0; i < n; i++) ((int64_t *)p)[i] = (int64_t)v; break;
    case NB_BOOL: memset(p, v != 0, (size_t)n); break;
    case NB_BF16: {
        uint16_t h = nbi_bf16_from_f64(v);
        for (int64_t i = 0; i < n; i++) ((uint16_t *)p)[i] = h;
        break;
    }
    }
}

static nb_tensor *filled(const char *fn, nb_dtype dtype, int ndim, const int64_t *shape,
                         double v) {
    if (dtype == NB_I64 && !(v >= -9.2e18 && v <= 9.2e18))
        return nbi_error("%s: value %g does not fit i64", fn, v);
    nb_tensor *t = nbi_new(fn, dtype, ndim, shape, false);
    if (t) fill(t, v);
    return t;
}

nb_tensor *nb_ones(nb_dtype dtype, int ndim, const int64_t *shape) {
    return filled("nb_ones", dtype, ndim, shape, 1.0);
}

nb_tensor *nb_full(nb_dtype dtype, int ndim, const int64_t *shape, double value) {
    return filled("nb_full", dtype, ndim, shape, value);
}

nb_tensor *nb_scalar(nb_dtype dtype, double value) {
    return filled("nb_scalar", dtype, 0, NULL, value);
}

nb_tensor *nb_from_data(nb_dtype dtype, int ndim, const int64_t *shape, const void *data) {
    nb_tensor *t = nbi_new("nb_from_data", dtype, ndim, shape, false);
    if (!t) return NULL;
    if (!data && t->numel > 0) {
        nb_free(t);
        return nbi_error("nb_from_data: data is NULL for shape %s", nbi_shape_str(ndim, shape));
    }
    if (t->numel) memcpy(nbi_ptr(t), data, (size_t)t->numel * nbi_dtype_size(dtype));
    return t;
}

nb_tensor *nb_arange(nb_dtype dtype, int64_t n) {
    if (n < 0) return nbi_error("nb_arange: n must be >= 0, got %lld", (long long)n);
    if (dtype == NB_BOOL) return nbi_error("nb_arange: dtype bool is not a number type");
    nb_tensor *t = nbi_new("nb_arange", dtype, 1, &n, false);
    for (int64_t i = 0; t && i < n; i++) nbi_set_flat(t, i, (double)i);
    return t;
}

/* Random numbers: element i of the tensor uses draws base + 2i, base + 2i + 1
 * (normal: Box-Muller, tensor/randn.c) or base + i (uniform). */
static nb_tensor *random_tensor(const char *fn, nb_dtype dtype, int ndim, const int64_t *shape,
                                nb_rng *rng, bool normal) {
    if (!nbi_is_float(dtype))
        return nbi_error("%s: dtype must be f32 or f64, got %s", fn, nb_dtype_name(dtype));
    nb_tensor *t = nbi_new(fn, dtype, ndim, shape, false);
    if (!t) return NULL;
    uint64_t seed, base = nbi_rng_take(rng, (uint64_t)t->numel * (normal ? 2 : 1), &seed);
    if (normal) {
        nbi_randn_fill(dtype, nbi_ptr(t), t->numel, seed, base);
        return t;
    }
    for (int64_t i = 0; i < t->numel; i++) {
        double v = nbi_rng_uniform(seed, base + (uint64_t)i);
        if (dtype == NB_F32) ((float *)nbi_ptr(t))[i] = (float)v;
        else ((double *)nbi_ptr(t))[i] = v;
    }
    return t;
}

nb_tensor *nb_randn(nb_dtype dtype, int ndim, const int64_t *shape, nb_rng *rng) {
    return random_tensor("nb_randn", dtype, ndim, shape, rng, true);
}

nb_tensor *nb_rand(nb_dtype dtype, int ndim, const int64_t *shape, nb_rng *rng) {
    nb_tensor *t = random_tensor("nb_rand", dtype, ndim, shape, rng, false);
    /* an f32 rounding of a double just below 1 can reach 1.0f: keep [0, 1) */
    if (t && dtype == NB_F32)
        for (int64_t i = 0; i < t->numel; i++)
            if (((float *)nbi_ptr(t))[i] >= 1.0f) ((float *)nbi_ptr(t))[i] = nextafterf(1.0f, 0.0f);
    return t;
}

nb_tensor *nb_tril_mask(int64_t rows, int64_t cols) {
    nb_tensor *t = nbi_new("nb_tril_mask", NB_BOOL, 2, (const int64_t[]){rows, cols}, false);
    if (!t) return NULL;
    bool *p = nbi_ptr(t);
    for (int64_t i = 0; i < rows && cols > 0; i++) /* (rows may be INT64_MAX when cols is 0) */
        for (int64_t j = 0; j < cols; j++) p[i * cols + j] = j <= i;
    return t;
}
