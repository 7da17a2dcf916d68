/* autocast.c: mixed-precision regions, as torch.autocast("cpu", bfloat16).
 *
 * A per-thread stack of regions. Inside one opened with NB_BF16, nb_matmul
 * (and so nb_linear and attention, which are made of it) and the
 * convolutions multiply f32 operands in bf16 with f32 accumulation;
 * everything else runs as written, in f32. The stack lives per thread like
 * the scope stack: a region opened on one thread says nothing about another.
 *
 * Every graph node records the dtype in force when it was made
 * (nbi_node.autocast), and the engine runs its backward and tangent rules in
 * that dtype and no other (nbi_autocast_isolate): a product made outside
 * autocast is differentiated in f32 even when nb_backward is called inside a
 * bf16 region, and one made inside is differentiated in bf16 wherever
 * nb_backward is called. It lives here, below ops/, because the engine
 * needs it. */
#include "autograd_internal.h"

#define AUTOCAST_MAX_DEPTH 64

static _Thread_local nb_dtype stack[AUTOCAST_MAX_DEPTH];
static _Thread_local int depth;
/* An isolated frame (a rule running): the regions below floor are hidden and
 * base is in force until the rule opens one of its own. */
static _Thread_local int floor_, isolated;
static _Thread_local nb_dtype base = NB_F32;

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
    if (depth == floor_ && isolated)
        return (nbi_error("nb_autocast_end: no autocast region is open on this thread (inside a "
                          "backward or tangent rule, only the rule's own)"), -1);
    if (depth == floor_)
        return (nbi_error("nb_autocast_end: no autocast region is open on this thread"), -1);
    depth--;
    return 0;
}

nb_dtype nb_autocast_dtype(void) { return depth > floor_ ? stack[depth - 1] : base; }

nbi_autocast_frame nbi_autocast_isolate(nb_dtype dtype) {
    nbi_autocast_frame f = {floor_, depth, isolated, base};
    floor_ = depth;
    isolated = 1;
    base = dtype;
    return f;
}

void nbi_autocast_restore(nbi_autocast_frame f) {
    depth = f.depth; /* regions a rule left open end with it */
    floor_ = f.floor;
    isolated = f.isolated;
    base = f.base;
}
