/* tokenizer.c: GPT-2's byte-level BPE tokenizer, encode and decode (loading:
 * tokenizer_load.c; the pre-tokenizer: tokenizer_pretok.c; the merges:
 * tokenizer_bpe.c).
 *
 * Encoding is OpenAI's encoder.py over bytes: the text is cut at each
 * "<|endoftext|>" (the special token, when the vocabulary has it, as Hugging
 * Face's GPT2Tokenizer and tiktoken's encode(..., allowed_special="all") do);
 * each part is cut into pieces by the pre-tokenizer, and each piece's bytes
 * are merged by rank. */
#include <stdlib.h>
#include <string.h>

#include "../nn_internal.h"
#include "tokenizer_internal.h"

void nb_tokenizer_free(nb_tokenizer *tok) {
    if (!tok) return;
    free(tok->bytes), free(tok->off), free(tok->path);
    nn_tok_pairs_free(&tok->pairs);
    free(tok);
}

int64_t nb_tokenizer_vocab_size(const nb_tokenizer *tok) {
    if (!tok) return nn_error("nb_tokenizer_vocab_size: tok is NULL"), -1;
    return tok->n;
}

int64_t nb_tokenizer_eot(const nb_tokenizer *tok) {
    if (!tok) return nn_error("nb_tokenizer_eot: tok is NULL"), -1;
    return tok->eot;
}

bool nb_tokenizer_can_encode(const nb_tokenizer *tok) { return tok && tok->can_encode; }

/* Where the ids go: the first cap of them, all of them counted. */
typedef struct {
    int64_t *ids, cap, count;
} sink;

static void emit(void *ctx, int32_t id) {
    sink *k = ctx;
    if (k->count < k->cap) k->ids[k->count] = id;
    k->count++;
}

/* The next "<|endoftext|>" in s[i..len), or len. */
static int64_t next_eot(const char *s, int64_t len, int64_t i) {
    while (i + NN_TOK_EOT_LEN <= len) {
        const char *lt = memchr(s + i, '<', (size_t)(len - NN_TOK_EOT_LEN + 1 - i));
        if (!lt) break;
        if (memcmp(lt, NN_TOK_EOT_TEXT, NN_TOK_EOT_LEN) == 0) return lt - s;
        i = lt - s + 1;
    }
    return len;
}

int64_t nb_tokenizer_encode(const nb_tokenizer *tok, const char *text, int64_t len, int64_t *ids,
                            int64_t cap) {
    static const char *fn = "nb_tokenizer_encode";
    if (!tok) return nn_error("%s: tok is NULL", fn), -1;
    if (!tok->can_encode)
        return nn_error("%s: \"%s\" is llm.c's gpt2_tokenizer.bin, which has no merges: it can "
                        "decode only (load a tokenizer.json, vocab.json or encoder.json to "
                        "encode)", fn, tok->path), -1;
    if (len < 0 || cap < 0)
        return nn_error("%s: len %lld and cap %lld must be >= 0", fn, (long long)len,
                        (long long)cap), -1;
    if ((!text && len > 0) || (!ids && cap > 0))
        return nn_error("%s: %s is NULL", fn, !text && len > 0 ? "text" : "ids"), -1;
    nn_tok_scratch *scratch = nn_tok_scratch_new();
    if (!scratch) return nn_error("%s: out of memory", fn), -1;
    const unsigned char *s = (const unsigned char *)text;
    sink k = {ids, cap, 0};
    int rc = 0;
    for (int64_t i = 0; i < len && rc == 0;) {
        int64_t stop = tok->eot >= 0 ? next_eot(text, len, i) : len;
        while (i < stop && rc == 0) {
            int64_t e = nn_tok_piece_end(s, stop, i);
            rc = nn_tok_bpe(tok, scratch, s + i, e - i, emit, &k);
            i = e;
        }
        if (stop < len) {
            emit(&k, (int32_t)tok->eot);
            i = stop + NN_TOK_EOT_LEN;
        }
    }
    nn_tok_scratch_free(scratch);
    if (rc) return nn_error("%s: out of memory (a piece of the text is too long)", fn), -1;
    return k.count;
}

/* The first id of ids[0..n) outside the vocabulary: 0 when none, else -1 with the message. */
static int check_ids(const char *fn, const nb_tokenizer *tok, const int64_t *ids, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= tok->n)
            return nn_error("%s: id %lld at position %lld is not in [0, %lld)", fn,
                            (long long)ids[i], (long long)i, (long long)tok->n), -1;
    return 0;
}

int64_t nb_tokenizer_decode(const nb_tokenizer *tok, const int64_t *ids, int64_t n, char *out,
                            int64_t cap) {
    static const char *fn = "nb_tokenizer_decode";
    if (!tok) return nn_error("%s: tok is NULL", fn), -1;
    if (n < 0 || cap < 0)
        return nn_error("%s: n %lld and cap %lld must be >= 0", fn, (long long)n,
                        (long long)cap), -1;
    if ((!ids && n > 0) || (!out && cap > 0))
        return nn_error("%s: %s is NULL", fn, !ids && n > 0 ? "ids" : "out"), -1;
    if (check_ids(fn, tok, ids, n)) return -1;
    int64_t total = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t len = tok->off[ids[i] + 1] - tok->off[ids[i]];
        if (total < cap) memcpy(out + total, tok->bytes + tok->off[ids[i]],
                                (size_t)(len < cap - total ? len : cap - total));
        total += len;
    }
    return total;
}

const char *nb_tokenizer_token(const nb_tokenizer *tok, int64_t id, int64_t *len) {
    static const char *fn = "nb_tokenizer_token";
    if (!tok || !len) return nn_error("%s: %s is NULL", fn, tok ? "len" : "tok");
    if (id < 0 || id >= tok->n)
        return nn_error("%s: id %lld is not in [0, %lld)", fn, (long long)id, (long long)tok->n);
    *len = tok->off[id + 1] - tok->off[id];
    return tok->bytes + tok->off[id];
}
