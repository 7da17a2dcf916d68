/* json_internal.h: the one JSON reader of nn/ (nn/formats/json.c), used for the
 * safetensors header (nn/formats/safetensors.c) and the tokenizer's files
 * (nn/text/tokenizer_load.c): a cursor over a text held whole in memory. Strict
 * JSON (RFC 8259). Every function returns 0 (or what it says), or -1 with
 * the first problem in j->msg as "<what> (JSON, byte <offset in the text>)";
 * later calls then fail too. Linear time; nn_json_skip is depth-limited. */
#ifndef NABLA_NN_JSON_INTERNAL_H
#define NABLA_NN_JSON_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define NN_JSON_MAX_DEPTH 64

typedef struct {
    const char *start, *p, *end;
    const char *doc;   /* what the text is, for "found the end of the <doc>" */
    char msg[320];
    char *s;           /* the last string read, NUL-terminated (UTF-8; holds no NUL) */
    size_t s_len, s_cap;
} nn_json;

/* A cursor at the start of text[0..len); doc names the text in messages
 * ("file", "header"). Free it with nn_json_free. */
void nn_json_init(nn_json *j, const char *text, size_t len, const char *doc);
int nn_json_fail(nn_json *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The next non-space byte (not consumed), or 0 at the end. */
char nn_json_peek(nn_json *j);
int nn_json_expect(nn_json *j, char c);
/* '{' or '[' (open), then: 1 when a member follows, 0 when the closing
 * bracket follows at once (consumed), -1 otherwise. */
int nn_json_open(nn_json *j, char open);
/* After an object's or array's member: 1 when a ',' follows (consumed), 0
 * when the closing c does (consumed), -1 otherwise. */
int nn_json_more(nn_json *j, char c);
/* A string into j->s / j->s_len (escapes decoded; \u0000 and unpaired
 * surrogates refused). */
int nn_json_string(nn_json *j);
/* An integer in [lo, hi] (no fraction or exponent). */
int nn_json_int(nn_json *j, int64_t lo, int64_t hi, int64_t *out);
/* Any value, checked and skipped. */
int nn_json_skip(nn_json *j);
/* Nothing but spaces left ("bytes after the JSON object" otherwise). */
int nn_json_end(nn_json *j);
void nn_json_free(nn_json *j);

#endif
