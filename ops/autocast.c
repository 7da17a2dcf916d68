/* autocast.c: mixed-precision regions, as torch.autocast("cpu", bfloat16).
 *
 * A per-thread stack of regions. Inside one opened with NB_BF16, nb_matmul
 * (and so nb_linear and attention, which are made of it) multiplies f32
 * operands in bf16 with f32 accumulation; everything else runs as written,
 * in f32. The stack lives per thread like the scope stack: a region opened on
 * one thread says nothing about another. */
#include "ops_internal.h"

#define AUTOCAST_MAX_DEPTH 64

static _Thread_local nb_dtype stack[AUTOCAST_MAX_DEPTH];
static _Thread_local int depth;

int nb_autocast_begin(nb_dtype dtype) {
    const char *fn = "nb_autocast_begin";
    if (dtype != NB_BF16 && dtype != NB_F32)
        return (nbi_error("%s: dtype must be bf16 (products in bf16) or f32 (a region without "
                          "autocast), got %s", fn, nb_dtype_name(dtype)), -1);
    if (depth == AUTOCAST_MAX_DEPTH)
        return (nbi_error("%s: more than %d nested regions (is an nb_autocast_end missing?)",
                          fn, AUTOCAST_MAX_DEPTH), -1);
    stack[depth++] = dtype;
    return 0;
}

int nb_autocast_end(void) {
    if (depth == 0)
        return (nbi_error("nb_autocast_end: no autocast region is open on this thread"), -1);
    depth--;
    return 0;
}

nb_dtype nb_autocast_dtype(void) { return depth ? stack[depth - 1] : NB_F32; }
