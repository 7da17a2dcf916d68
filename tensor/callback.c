/* callback.c: the one rule for user code that nabla calls.
 *
 * nabla calls user code in several places (a custom function's forward,
 * backward and destroy; gradient hooks; nb_gradcheck's function;
 * nb_parallel_for's fn; nb_gpt_generate's on_token). Each call is bracketed
 * by nbi_callback_enter/leave, which keep a per-thread stack of the
 * callbacks running. While one runs:
 * - nb_scope_end cannot close a scope opened before it (the call is refused
 *   with a message and counted); scopes it leaves open are closed at leave;
 * - grad mode is restored at leave to what it was at enter; where nabla runs
 *   the callback with grad mode off (custom functions, hooks),
 *   nb_set_grad_enabled(true) is refused and counted;
 * and leave turns any of those into an error naming the callback. What the
 * engine uses while a callback runs is kept alive by the engine's own
 * references (see engine.c, function.c, gradcheck.c), so freeing it there
 * is deferred, never a use after free. */
#include "tensor_internal.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

_Thread_local bool nbi_grad_off;

static _Thread_local nbi_callback *top;

void nbi_callback_enter(nbi_callback *cb, const char *fn, bool grad_stays_off) {
    cb->level = top ? top->level + 1 : 1;
    cb->fn = fn;
    cb->depth = nb_scope_depth();
    cb->grad_was_off = nbi_grad_off;
    /* not inherited: nabla's own functions called inside (nb_gradcheck)
     * may run their callbacks with grad mode on */
    cb->grad_stays_off = grad_stays_off;
    cb->closed = cb->grad_on = 0;
    cb->trusted = nbi_trusted;
    nbi_trusted = 0; /* user code: a freed handle is an error there, even inside backward */
    cb->public_ = false;
    cb->no_keep = false;
    cb->token = 0;
    cb->prev = top;
    top = cb;
}

nbi_callback *nbi_callback_current(void) { return top; }

void nbi_callback_note_raw(const nb_tensor *t) {
    if (!t || !t->requires_grad) return;
    for (nbi_callback *cb = top; cb; cb = cb->prev)
        if (cb->watch_raw) {
            cb->raw_read = true;
            return;
        }
}

const char *nbi_callback_who(const nbi_callback *cb) {
    static _Thread_local char ring[2][160];
    static _Thread_local int k;
    char *b = ring[k ^= 1];
    const char *f = cb->who_fmt ? cb->who_fmt : "a callback";
    if (cb->who_t) snprintf(b, sizeof ring[0], f, NBI_SHAPE(cb->who_t));
    else if (cb->who_s) snprintf(b, sizeof ring[0], f, cb->who_s);
    else if (strstr(f, "%lld")) snprintf(b, sizeof ring[0], f, cb->who_lo, cb->who_hi);
    else snprintf(b, sizeof ring[0], "%s", f);
    return b;
}

/* Frames above cb (those its callback opened with nb_callback_begin and left
 * open; all of them when cb is NULL, as the thread exits): dropped. Their
 * count. */
static int drop_frames_above(const nbi_callback *cb) {
    int n = 0;
    while (top && top != cb) {
        nbi_callback *x = top;
        top = x->prev;
        if (x->public_) free(x);
        n++;
    }
    return n;
}

int nbi_callback_leave(nbi_callback *cb) {
    int frames = drop_frames_above(cb);
    int left_open = nb_scope_depth() - cb->depth;
    /* scopes the callback left open end here, while its fence still allows it */
    for (int k = 0; k < left_open; k++) nb_scope_end();
    top = cb->prev;
    nbi_grad_off = cb->grad_was_off;
    nbi_trusted = cb->trusted;
    if (frames)
        return (nbi_error("%s: %s left %d callback frame%s open (nb_callback_begin without "
                          "nb_callback_end); nabla closed %s", cb->fn, nbi_callback_who(cb), frames,
                          frames > 1 ? "s" : "", frames > 1 ? "them" : "it"), -1);
    if (cb->closed)
        return (nbi_error("%s: %s closed a scope it did not open (%d nb_scope_end too many); the "
                          "caller's scopes were kept open", cb->fn, nbi_callback_who(cb), cb->closed), -1);
    if (left_open > 0)
        return (nbi_error("%s: %s left %d scope%s open (nb_scope_begin without nb_scope_end); "
                          "nabla closed %s", cb->fn, nbi_callback_who(cb), left_open, left_open > 1 ? "s" : "",
                          left_open > 1 ? "them" : "it"), -1);
    if (cb->grad_on)
        return (nbi_error("%s: %s turned grad mode on (nb_set_grad_enabled(true)); it runs with "
                          "grad mode off, which nabla kept", cb->fn, nbi_callback_who(cb)), -1);
    return 0;
}

bool nbi_callback_refuses_scope_end(void) {
    if (!top || nb_scope_depth() > top->depth) return false;
    top->closed++;
    nbi_error("nb_scope_end: %s may close only the scopes it opened; this one was opened before "
              "it ran and stays open", nbi_callback_who(top));
    return true;
}

bool nbi_callback_refuses_grad_on(void) {
    if (!top || !top->grad_stays_off) return false;
    top->grad_on++;
    nbi_error("nb_set_grad_enabled: grad mode stays off inside %s", nbi_callback_who(top));
    return true;
}

/* ------------------------------------------------------- the public pair */
/* Tokens are never reused on a thread (stale ones match nothing) and start
 * far from small numbers (a guessed 1 matches nothing either). */
static _Thread_local int next_token;

int nb_callback_begin(const char *fn, const char *who) {
    fn = fn ? fn : "nb_callback_begin";
    who = who ? who : "a callback";
    size_t nf = strlen(fn) + 1, nw = strlen(who) + 1;
    nbi_callback *cb = malloc(sizeof *cb + nf + nw);
    if (!cb) return (nbi_error("nb_callback_begin: out of memory"), -1);
    char *copies = (char *)(cb + 1); /* the caller's strings may go before the end */
    memcpy(copies, fn, nf);
    memcpy(copies + nf, who, nw);
    nbi_thread_register(); /* a thread that exits with the frame open frees it */
    *cb = (nbi_callback){.who_fmt = "%s", .who_s = copies + nf};
    nbi_callback_enter(cb, copies, false);
    cb->public_ = true;
    if (next_token <= 0 || next_token == INT_MAX) next_token = 0x4e420000; /* "NB" */
    cb->token = next_token++;
    return cb->token;
}

int nb_callback_end(int token) {
    /* the frame begun with this token: above it only frames its callback
     * left open; a frame of nabla's own in between means the token is not
     * this callback's to end */
    nbi_callback *cb = top;
    while (cb && cb->public_ && cb->token != token) cb = cb->prev;
    if (!cb || !cb->public_ || token <= 0)
        return (nbi_error("nb_callback_end: %d is not the token of an nb_callback_begin open in "
                          "this callback (%s)", token, top ? nbi_callback_who(top) : "none runs on this thread"),
                -1);
    int rc = nbi_callback_leave(cb);
    free(cb);
    return rc;
}

void nbi_callback_thread_exit(void) { drop_frames_above(NULL); }
