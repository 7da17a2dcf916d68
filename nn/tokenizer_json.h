/* tokenizer_json.h: the small JSON reader the tokenizer loader needs
 * (nn/tokenizer_json.c): a cursor over a whole file held in memory. Every
 * function returns 0, or -1 with the first problem in j->msg (and its byte
 * offset); later calls then fail too. Linear time, depth-limited. */
#ifndef NABLA_NN_TOKENIZER_JSON_H
#define NABLA_NN_TOKENIZER_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define NN_TJ_MAX_DEPTH 64

typedef struct {
    const char *start, *p, *end;
    char msg[256];
    char *s;           /* the last string read, NUL-terminated (UTF-8; may hold no NUL) */
    size_t s_len, s_cap;
} nn_tj;

int nn_tj_fail(nn_tj *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The next non-space byte (not consumed), or 0 at the end. */
char nn_tj_peek(nn_tj *j);
int nn_tj_expect(nn_tj *j, char c);
/* After an object's or array's member: 1 when a ',' follows (consumed), 0
 * when the closing c does (consumed), -1 otherwise. */
int nn_tj_more(nn_tj *j, char c);
/* A string into j->s / j->s_len (escapes decoded; \u0000 and unpaired
 * surrogates refused). */
int nn_tj_string(nn_tj *j);
/* An integer in [lo, hi] (no fraction or exponent). */
int nn_tj_int(nn_tj *j, int64_t lo, int64_t hi, int64_t *out);
/* Any value, checked and skipped. */
int nn_tj_skip(nn_tj *j);
void nn_tj_free(nn_tj *j);

#endif
