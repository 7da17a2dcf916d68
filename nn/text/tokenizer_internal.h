/* tokenizer_internal.h: the GPT-2 tokenizer's parts (nn/text/tokenizer*.c).
 *
 * A loaded tokenizer is read-only: encode and decode keep their scratch
 * space per call, so any number of threads may use one at once. */
#ifndef NABLA_NN_TOKENIZER_INTERNAL_H
#define NABLA_NN_TOKENIZER_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../../nabla.h"

#define NN_TOK_EOT_TEXT "<|endoftext|>"
#define NN_TOK_EOT_LEN 13
/* more ids than this is refused (ids and ranks are int32 inside) */
#define NN_TOK_MAX_VOCAB (INT64_C(1) << 30)

/* The merge table: open addressing on the pair (left id, right id). */
typedef struct {
    uint64_t *key;   /* ((uint64_t)left << 32 | right) + 1; 0 marks an empty slot */
    int32_t *rank;   /* the merge's line among the merges, from 0 */
    int32_t *result; /* the id of the merged token */
    uint64_t mask;   /* slots - 1 (a power of two) */
} nn_tok_pairs;

struct nb_tokenizer {
    int64_t n;       /* vocabulary size: ids 0..n-1 */
    int64_t eot;     /* the id of <|endoftext|>, or -1 */
    bool can_encode; /* merges were loaded (not llm.c's gpt2_tokenizer.bin) */
    char *bytes;     /* every token's bytes, in id order */
    int64_t *off;    /* n + 1 offsets: token i is bytes[off[i] .. off[i+1]) */
    int32_t byte_id[256]; /* the id of each one-byte token (all 256 when can_encode) */
    nn_tok_pairs pairs;
    char *path;      /* the file it was loaded from, for messages */
};

/* tokenizer_bpe.c: the merge table. */
int nn_tok_pairs_init(nn_tok_pairs *p, int64_t count); /* 0 or -1 (out of memory) */
void nn_tok_pairs_free(nn_tok_pairs *p);
/* Adds (left, right) -> (rank, result): 0, 1 when the pair is already there
 * (*old_rank gets its rank), or -1 when full. */
int nn_tok_pairs_add(nn_tok_pairs *p, int32_t left, int32_t right, int32_t rank, int32_t result,
                     int32_t *old_rank);
/* The rank of (left, right) and its result in *result, or -1 when no merge. */
static inline int32_t nn_tok_pairs_find(const nn_tok_pairs *p, int32_t left, int32_t right,
                                        int32_t *result) {
    uint64_t k = ((uint64_t)(uint32_t)left << 32 | (uint32_t)right) + 1;
    uint64_t h = k * UINT64_C(0x9E3779B97F4A7C15);
    for (uint64_t i = (h ^ h >> 29) & p->mask;; i = (i + 1) & p->mask) {
        if (p->key[i] == k) return *result = p->result[i], p->rank[i];
        if (p->key[i] == 0) return -1;
    }
}

/* tokenizer_pretok.c: GPT-2's pre-tokenizer. The end of the piece that
 * starts at s[i] (i < len), as OpenAI's pattern
 *   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * matches it; a byte that is not part of valid UTF-8 is a character of its
 * own that is neither a letter, a number nor a space. */
int64_t nn_tok_piece_end(const unsigned char *s, int64_t len, int64_t i);

/* tokenizer_bpe.c: the byte-pair merges of one piece. */
typedef struct nn_tok_scratch nn_tok_scratch; /* per-call buffers */
nn_tok_scratch *nn_tok_scratch_new(void);
void nn_tok_scratch_free(nn_tok_scratch *s);
/* Merges the n bytes of piece and calls emit(ctx, id) for each resulting
 * token in order: 0, or -1 when out of memory. */
int nn_tok_bpe(const nb_tokenizer *tok, nn_tok_scratch *s, const unsigned char *piece, int64_t n,
               void (*emit)(void *ctx, int32_t id), void *ctx);

/* tokenizer_pretok.c: GPT-2's byte-to-unicode map (bytes as printable
 * characters in vocab files). The byte a code point stands for, or -1. */
int nn_tok_byte_of_cp(uint32_t cp);
/* Decodes one UTF-8 character of s[0..n) (n > 0): its length (1..4) and *cp,
 * or 0 when s does not start with a valid UTF-8 sequence. */
int nn_tok_utf8(const unsigned char *s, int64_t n, uint32_t *cp);

#endif
