/* autograd_internal.h: graph nodes, as ops record them and the engine walks
 * them. Every op file includes this. */
#ifndef NABLA_AUTOGRAD_INTERNAL_H
#define NABLA_AUTOGRAD_INTERNAL_H

#include "../tensor/tensor_internal.h"

/* --------------------------------------------------------------- autograd */
#define NBI_NODE_INLINE 3
typedef int (*nbi_backward_fn)(nbi_node *n, nb_tensor *gout, nb_tensor **gin);
/* Forward mode (nb_jvp): the tangent of n's output, given its inputs'
 * tangents tin[0..nin) (NULL: zero, or not floating), of the output's shape
 * and dtype, in the current scope; NULL with a message on error. Runs with
 * grad mode off and reads values as backward does, through nbi_saved_in/out. */
typedef nb_tensor *(*nbi_jvp_fn)(nbi_node *n, nb_tensor *const *tin);
/* bits of nbi_node.saved: which tensors backward reads (version-checked) */
#define NBI_SAVE_IN(i) (1u << (i))
#define NBI_SAVE_OUT (1u << 31)
struct nbi_node {
    const char *op;          /* public name of the op, for messages */
    nbi_backward_fn backward;
    /* The tangent rule. An op that sets it also promises that its backward
     * is made of recorded ops under create_graph (NB_OP_JVP and NB_OP_GRAD2
     * go together); NULL: no forward mode, and a backward with create_graph
     * through the node is refused by name (custom functions excepted: their
     * backward answers for itself). */
    nbi_jvp_fn jvp;
    nb_tensor *out;          /* the tensor this node made (not referenced) */
    int nin;
    nb_tensor **in;          /* inputs, referenced */
    nb_tensor *in_inline[NBI_NODE_INLINE];
    uint32_t *ver;           /* storage versions of inputs at record time */
    uint32_t ver_inline[NBI_NODE_INLINE];
    uint32_t ver_out;
    uint32_t saved;          /* NBI_SAVE_* bits */
    nb_tensor *extra;        /* one more tensor kept for backward, referenced */
    double d[4];             /* scalar arguments */
    int64_t i[2 * NB_MAX_DIMS];
    /* After a backward that did not retain the graph, what the rule reads is
     * gone (saved bits cleared, extra and fn_ctx's tensors freed): a second
     * backward through this node is an error naming retain_graph. */
    bool released;
    /* The autocast dtype in force when the node was made (NB_F32: none):
     * its backward and tangent rules run in it (autocast.c). */
    nb_dtype autocast;
    /* Custom functions (function.c): their context, and what frees it
     * (all = false: only what backward reads; true: everything, at node free). */
    void *fn_ctx;
    void (*fn_release)(nbi_node *n, bool all);
    /* Order of recording (process-wide, from 1): nb_checkpoint tells the
     * nodes its function made from those made before it. */
    uint64_t serial;
};
/* nb_checkpoint (checkpoint.c) while its function runs forward on this
 * thread, or NULL: every node recorded then is shown to it, which finds the
 * parameters the function reaches through its context. */
extern _Thread_local struct nbi_ckpt_region *nbi_ckpt_top;
void nbi_checkpoint_saw(const nbi_node *n);
/* The serial the next node recorded gets (or a later one). */
uint64_t nbi_next_node_serial(void);
/* Autocast (autocast.c) around a rule: isolate hides the regions open now
 * and puts dtype in force; restore brings them back (and ends any region the
 * rule left open). */
typedef struct {
    int floor, depth, isolated;
    nb_dtype base;
} nbi_autocast_frame;
nbi_autocast_frame nbi_autocast_isolate(nb_dtype dtype);
void nbi_autocast_restore(nbi_autocast_frame f);
/* True when grad mode is on and some input requires grad. */
bool nbi_needs_grad(int n, nb_tensor *const *inputs);
/* Records a node for out; NULL (and message) on out-of-memory, or when
 * anomaly mode finds NaN or Inf in out. The unchecked form skips that check,
 * for ops that make infinities on purpose. */
nbi_node *nbi_record(nb_tensor *out, const char *op, nbi_backward_fn bw, int n,
                     nb_tensor *const *inputs);
nbi_node *nbi_record_unchecked(nb_tensor *out, const char *op, nbi_backward_fn bw, int n,
                               nb_tensor *const *inputs);
/* Anomaly mode (anomaly.c): true when off or when all is finite; otherwise
 * false with the message set. forward: an op's new output (views skipped);
 * backward: the gradients node n's rule returned for its inputs, given g;
 * seed: the gradient handed to nb_backward_with_grad. */
bool nbi_anomaly_forward(const char *op, const nb_tensor *out, int n, nb_tensor *const *inputs);
bool nbi_anomaly_backward(const nbi_node *n, const nb_tensor *g, nb_tensor *const *gin);
bool nbi_anomaly_seed(const char *fn, const nb_tensor *grad);
/* Declares what backward reads (NBI_SAVE_* bits): those tensors keep their
 * data while the node lives; an input nobody saved loses its storage as soon
 * as its owner frees it (see nbi_drop_unneeded_data), even though the graph
 * still holds it as an edge. */
void nbi_save(nbi_node *n, uint32_t bits);
/* What a backward rule reads of its node's tensors' values: input i, or the
 * output, which the op must have declared with nbi_save (an undeclared one
 * may have lost its data by the time backward runs). NULL, with the message
 * "<op>: backward reads input i, which the op did not declare saved", when
 * it did not. Shapes, dtypes and requires_grad of n->in[i] stay readable
 * directly: only values go. */
nb_tensor *nbi_saved_in(const nbi_node *n, int i);
nb_tensor *nbi_saved_out(const nbi_node *n);
/* For a rule whose gradient for input i is sparse (an embedding's): the
 * gradient already summed for that input in this backward, when it is a
 * contiguous buffer nobody else holds, so the rule may add into it in place
 * (and then leave gin[i] NULL); NULL otherwise. The rule must add exactly
 * what it would return (the same sums, then one addition per element), so
 * the bits match the path that returns a gradient. */
nb_tensor *nbi_grad_sink(const nbi_node *n, int i);
/* True while a rule runs in a backward with create_graph: grad mode is on,
 * and the gradients it returns must be made of recorded ops (public ones,
 * or internal ones that record a node), so that they can be differentiated
 * again. A fused kernel that records nothing is for the plain case only. */
static inline bool nbi_create_graph(void) { return !nbi_grad_off; }
/* For a rule that has no recorded form: -1, with the message
 * "nb_backward: <op> has no double backward (create_graph) ...". */
int nbi_no_double_backward(const nbi_node *n);
/* The tangent when every input's is zero or the rule has nothing to add:
 * zeros of the output's shape and dtype. */
nb_tensor *nbi_zero_tangent(const nbi_node *n);
/* A copy of g in the current scope; when grad mode is on and g requires
 * grad, recorded (gradient identity), so the copy keeps g's history. */
nb_tensor *nbi_grad_copy(const char *fn, nb_tensor *g);
/* a + b, of one shape and floating dtype, in the current scope; recorded
 * (the gradient passes to both) when grad mode is on and one requires grad:
 * how create_graph adds up gradients. */
nb_tensor *nbi_sum_recorded(const char *fn, nb_tensor *a, nb_tensor *b);
/* A new handle (a view) on t in the current scope; recorded the same way,
 * so it keeps t's history. */
nb_tensor *nbi_recorded_alias(nb_tensor *t);
/* The same reading data's values (a view of it) with history's graph: for
 * a tensor whose own data may be gone while a handle on the same values
 * lives (a custom function's saved output). Same shape and dtype. */
nb_tensor *nbi_recorded_view(nb_tensor *data, nb_tensor *history);
/* What an nb_fn (nb_gradcheck's, nb_jvp's) returned, checked: y, or NULL
 * with "<fn>: the function returned NULL[, after an earlier error: ...]"
 * or "... a freed tensor". */
nb_tensor *nbi_fn_returned(const char *fn, nb_tensor *y);
/* Whether backward should compute the gradient of input i. */
static inline bool nbi_wants(const nbi_node *n, int i) {
    return n->in[i]->requires_grad;
}

#endif
