/* tokenizer_bpe.c: the byte-pair merges of one pre-tokenized piece, and the
 * merge table they look pairs up in.
 *
 * OpenAI's encoder.py repeats: take the adjacent pair of lowest rank, merge
 * every occurrence of it left to right, until no pair has a rank. Done
 * literally that is quadratic in the piece's length (1 MB of "a" is one
 * piece). Here the piece is a linked list of symbols and the candidate pairs
 * sit in a binary heap ordered by (rank, position): O(n log n). A heap entry
 * goes stale when one of its symbols is merged away; it is checked when
 * popped. To stay exact on any merge list, the pairs a merge of rank r
 * creates with a rank below r wait until every occurrence of r is merged (in
 * encoder.py they only exist from its next round on); GPT-2's own merges
 * never do that (a merge's parts come from earlier merges), so it costs
 * nothing there. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"

/* ------------------------------------------------------------- merge table */
int nn_tok_pairs_init(nn_tok_pairs *p, int64_t count) {
    uint64_t slots = 16;
    while (slots < (uint64_t)count * 2) slots <<= 1; /* at most half full */
    p->mask = slots - 1;
    p->key = calloc(slots, sizeof *p->key);
    p->rank = malloc(slots * sizeof *p->rank);
    p->result = malloc(slots * sizeof *p->result);
    if (p->key && p->rank && p->result) return 0;
    nn_tok_pairs_free(p);
    return -1;
}

void nn_tok_pairs_free(nn_tok_pairs *p) {
    free(p->key);
    free(p->rank);
    free(p->result);
    memset(p, 0, sizeof *p);
}

int nn_tok_pairs_add(nn_tok_pairs *p, int32_t left, int32_t right, int32_t rank, int32_t result,
                     int32_t *old_rank) {
    uint64_t k = ((uint64_t)(uint32_t)left << 32 | (uint32_t)right) + 1;
    uint64_t h = k * UINT64_C(0x9E3779B97F4A7C15);
    for (uint64_t i = (h ^ h >> 29) & p->mask, tries = 0; tries <= p->mask;
         i = (i + 1) & p->mask, tries++) {
        if (p->key[i] == k) return *old_rank = p->rank[i], 1;
        if (p->key[i] == 0) {
            p->key[i] = k, p->rank[i] = rank, p->result[i] = result;
            return 0;
        }
    }
    return -1;
}

/* ------------------------------------------------------------------ scratch */
typedef struct {
    int32_t rank, left_id, right_id;
    int64_t pos, right; /* the two symbols' positions (their first byte) */
} cand;

struct nn_tok_scratch {
    int32_t *id;         /* per symbol, by its first byte's position; -1: merged away */
    int64_t *prev, *next;
    int64_t cap;         /* of the three arrays above */
    cand *heap, *wait;   /* the heap; pairs created below the current rank */
    int64_t heap_n, wait_n, heap_cap, wait_cap;
};

nn_tok_scratch *nn_tok_scratch_new(void) { return calloc(1, sizeof(nn_tok_scratch)); }

void nn_tok_scratch_free(nn_tok_scratch *s) {
    if (!s) return;
    free(s->id), free(s->prev), free(s->next), free(s->heap), free(s->wait);
    free(s);
}

static int reserve(nn_tok_scratch *s, int64_t n) {
    if (n <= s->cap) return 0;
    int64_t c = s->cap ? s->cap : 64;
    while (c < n) c *= 2;
    int32_t *id = realloc(s->id, (size_t)c * sizeof *id);
    if (id) s->id = id;
    int64_t *pv = realloc(s->prev, (size_t)c * sizeof *pv);
    if (pv) s->prev = pv;
    int64_t *nx = realloc(s->next, (size_t)c * sizeof *nx);
    if (nx) s->next = nx;
    if (!id || !pv || !nx) return -1;
    s->cap = c;
    return 0;
}

static int grow(cand **v, int64_t *cap, int64_t need) {
    if (need <= *cap) return 0;
    int64_t c = *cap ? *cap * 2 : 64;
    while (c < need) c *= 2;
    cand *p = realloc(*v, (size_t)c * sizeof *p);
    if (!p) return -1;
    *v = p, *cap = c;
    return 0;
}

/* ------------------------------------------------------------------- heap */
static bool before(const cand *a, const cand *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static int heap_push(nn_tok_scratch *s, cand c) {
    if (grow(&s->heap, &s->heap_cap, s->heap_n + 1)) return -1;
    int64_t i = s->heap_n++;
    while (i > 0 && before(&c, &s->heap[(i - 1) / 2])) {
        s->heap[i] = s->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    s->heap[i] = c;
    return 0;
}

/* Moves the entry at i down to its place among entries [0, n). */
static void sift_down(cand *h, int64_t n, int64_t i) {
    cand x = h[i];
    for (;;) {
        int64_t k = 2 * i + 1;
        if (k >= n) break;
        if (k + 1 < n && before(&h[k + 1], &h[k])) k++;
        if (!before(&h[k], &x)) break;
        h[i] = h[k];
        i = k;
    }
    h[i] = x;
}

static cand heap_pop(nn_tok_scratch *s) {
    cand top = s->heap[0];
    if (--s->heap_n) {
        s->heap[0] = s->heap[s->heap_n];
        sift_down(s->heap, s->heap_n, 0);
    }
    return top;
}

/* The pair (a, b) of adjacent symbols as a candidate, if it has a merge:
 * into the heap, or to wait when its rank is below floor. */
static int offer(const nb_tokenizer *tok, nn_tok_scratch *s, int64_t a, int64_t b,
                 int32_t floor) {
    int32_t result;
    int32_t r = nn_tok_pairs_find(&tok->pairs, s->id[a], s->id[b], &result);
    if (r < 0) return 0;
    cand c = {r, s->id[a], s->id[b], a, b};
    if (r >= floor) return heap_push(s, c);
    if (grow(&s->wait, &s->wait_cap, s->wait_n + 1)) return -1;
    s->wait[s->wait_n++] = c;
    return 0;
}

static bool still_there(const nn_tok_scratch *s, const cand *c) {
    return s->id[c->pos] == c->left_id && s->id[c->right] == c->right_id &&
           s->next[c->pos] == c->right;
}

int nn_tok_bpe(const nb_tokenizer *tok, nn_tok_scratch *s, const unsigned char *piece, int64_t n,
               void (*emit)(void *ctx, int32_t id), void *ctx) {
    if (n == 1) return emit(ctx, tok->byte_id[piece[0]]), 0;
    if (reserve(s, n)) return -1;
    s->heap_n = s->wait_n = 0;
    for (int64_t i = 0; i < n; i++) {
        s->id[i] = tok->byte_id[piece[i]];
        s->prev[i] = i - 1;
        s->next[i] = i + 1 < n ? i + 1 : -1;
    }
    /* the first candidates: all in, then one heapify (O(n), not n pushes) */
    if (grow(&s->heap, &s->heap_cap, n)) return -1;
    for (int64_t i = 0; i + 1 < n; i++) {
        int32_t result, r = nn_tok_pairs_find(&tok->pairs, s->id[i], s->id[i + 1], &result);
        if (r >= 0) s->heap[s->heap_n++] = (cand){r, s->id[i], s->id[i + 1], i, i + 1};
    }
    for (int64_t i = s->heap_n / 2 - 1; i >= 0; i--) sift_down(s->heap, s->heap_n, i);
    int32_t cur = -1; /* the rank being merged */
    for (;;) {
        if (s->wait_n && (s->heap_n == 0 || s->heap[0].rank != cur)) {
            for (int64_t k = 0; k < s->wait_n; k++)
                if (heap_push(s, s->wait[k])) return -1;
            s->wait_n = 0;
        }
        if (s->heap_n == 0) break;
        cand c = heap_pop(s);
        if (!still_there(s, &c)) continue;
        cur = c.rank;
        int32_t result = -1;
        nn_tok_pairs_find(&tok->pairs, c.left_id, c.right_id, &result);
        int64_t a = c.pos, b = c.right, after = s->next[b];
        s->id[a] = result;
        s->id[b] = -1;
        s->next[a] = after;
        if (after >= 0) s->prev[after] = a;
        if (s->prev[a] >= 0 && offer(tok, s, s->prev[a], a, cur)) return -1;
        if (after >= 0 && offer(tok, s, a, after, cur)) return -1;
    }
    for (int64_t i = 0; i >= 0; i = s->next[i]) emit(ctx, s->id[i]);
    return 0;
}
