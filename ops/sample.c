/* sample.c: nb_multinomial(probs, num_samples, replacement, rng).
 *
 * Sample s of row b is decided by one uniform u = u(seed, base + b *
 * num_samples + s) of the counter-based stream of tensor/rng.c (base: the
 * first of B * num_samples draws reserved on rng, NULL = the global
 * generator): it picks the first category whose running sum of weights
 * exceeds u times the row's total (summed in double, in category order).
 * Without replacement the picked category's weight leaves the row before
 * the next sample (the sequential scheme torch.multinomial also follows).
 * So the draws depend only on (seed, base, b, s), not on the thread count:
 * rows are split across threads whole. Not differentiable. */
#include "ops_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    nb_dtype dt;
    int64_t n, k, ps_row, ps_col; /* categories, samples, probs' strides */
    const char *pp;
    int64_t *out; /* (B, k) contiguous */
    uint64_t key, base;
    bool replacement;
    int failed;
} draw_job;

/* probs (B, n) -> out (B, k): rows [lo, hi) */
static void draw_span(void *ctx, int64_t lo, int64_t hi) {
    draw_job *j = ctx;
    int64_t n = j->n;
    double *w = malloc((size_t)n * sizeof *w), *cdf = malloc((size_t)n * sizeof *cdf);
    if (!w || !cdf) {
        __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
        free(w);
        free(cdf);
        return;
    }
    for (int64_t b = lo; b < hi; b++) {
        for (int64_t i = 0; i < n; i++) {
            int64_t o = b * j->ps_row + i * j->ps_col;
            w[i] = j->dt == NB_F32 ? ((const float *)j->pp)[o] : ((const double *)j->pp)[o];
        }
        for (int64_t s = 0; s < j->k; s++) {
            if (s == 0 || !j->replacement) { /* the running sums of what is left */
                double run = 0;
                for (int64_t i = 0; i < n; i++) cdf[i] = run += w[i];
            }
            double u = nbi_rng_uniform_key(j->key, j->base + (uint64_t)(b * j->k + s));
            double x = u * cdf[n - 1];
            /* the first category whose running sum exceeds x: its weight is
             * positive, since the sum grew past x there */
            int64_t lo_i = 0, hi_i = n - 1;
            while (lo_i < hi_i) {
                int64_t mid = lo_i + (hi_i - lo_i) / 2;
                if (cdf[mid] > x) hi_i = mid;
                else lo_i = mid + 1;
            }
            /* x rounded up to the total: the last category of positive weight */
            while (w[lo_i] <= 0) lo_i--;
            j->out[b * j->k + s] = lo_i;
            if (!j->replacement) w[lo_i] = 0;
        }
    }
    free(cdf);
    free(w);
}

/* probs (n) or (B, n) -> (num_samples) or (B, num_samples), NB_I64 */
nb_tensor *nb_multinomial(nb_tensor *probs, int64_t num_samples, bool replacement, nb_rng *rng) {
    const char *fn = "nb_multinomial";
    if (!nbi_arg(fn, probs, 0)) return NULL;
    if (!nbi_check_float(fn, probs)) return NULL;
    if (probs->ndim != 1 && probs->ndim != 2)
        return nbi_error("%s: probs must be 1-d or 2-d, got shape %s", fn, NBI_SHAPE(probs));
    if (num_samples <= 0)
        return nbi_error("%s: num_samples must be positive, got %lld", fn, (long long)num_samples);
    bool two = probs->ndim == 2;
    int64_t rows = two ? probs->shape[0] : 1, n = probs->shape[probs->ndim - 1];
    int64_t rs = two ? probs->strides[0] : 0, cs = probs->strides[probs->ndim - 1];
    if (!replacement && num_samples > n)
        return nbi_error("%s: cannot draw %lld samples without replacement from %lld categories",
                         fn, (long long)num_samples, (long long)n);
    const char *pp = nbi_ptr(probs);
    for (int64_t b = 0; b < rows; b++) {
        double total = 0;
        int64_t nonzero = 0;
        for (int64_t i = 0; i < n; i++) {
            int64_t o = b * rs + i * cs;
            double v = probs->dtype == NB_F32 ? ((const float *)pp)[o] : ((const double *)pp)[o];
            if (!isfinite(v) || v < 0)
                return nbi_error("%s: row %lld has probability %g at %lld (must be finite and "
                                 ">= 0)", fn, (long long)b, v, (long long)i);
            total += v;
            nonzero += v > 0;
        }
        if (!(total > 0))
            return nbi_error("%s: row %lld sums to %g (must be positive)", fn, (long long)b, total);
        if (!replacement && num_samples > nonzero)
            return nbi_error("%s: cannot draw %lld samples without replacement from row %lld, "
                             "which has %lld nonzero categories", fn, (long long)num_samples,
                             (long long)b, (long long)nonzero);
    }
    int64_t sh[2] = {rows, num_samples};
    nb_tensor *y = two ? nbi_new(fn, NB_I64, 2, sh, false) : nbi_new(fn, NB_I64, 1, sh + 1, false);
    if (!y || y->numel == 0) return y;
    uint64_t seed;
    uint64_t base = nbi_rng_take(rng, (uint64_t)y->numel, &seed);
    draw_job j = {.dt = probs->dtype, .n = n, .k = num_samples, .ps_row = rs, .ps_col = cs,
                  .pp = pp, .out = nbi_ptr(y), .replacement = replacement,
                  .key = nbi_rng_key(seed), .base = base};
    nbi_parallel_for(rows, NBI_GRAIN_HEAVY / (n + num_samples) + 1, draw_span, &j);
    if (j.failed) return nbi_error("%s: out of memory", fn), nbi_discard(y);
    return y;
}
