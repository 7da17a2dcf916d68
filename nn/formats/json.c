/* json.c: the JSON reader of nn/ (see json_internal.h), for safetensors
 * headers and tokenizer files. Strict JSON (RFC 8259): what a text may not
 * hold is refused, with its byte offset, so that a broken file is named as
 * such rather than read as something else. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_internal.h"

void nn_json_init(nn_json *j, const char *text, size_t len, const char *doc) {
    *j = (nn_json){.start = text, .p = text, .end = text + len, .doc = doc};
}

int nn_json_fail(nn_json *j, const char *fmt, ...) {
    if (j->msg[0]) return -1; /* the first problem stays */
    char what[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    snprintf(j->msg, sizeof j->msg, "%s (JSON, byte %lld)", what, (long long)(j->p - j->start));
    return -1;
}

char nn_json_peek(nn_json *j) {
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
        j->p++;
    return j->p < j->end ? *j->p : 0;
}

/* What is at j->p, for a message: "'x'", "byte 0x00" (a byte that would
 * not show), or "the end of the <doc>" (a NUL byte is not the end). */
static const char *found(const nn_json *j, char *buf, size_t cap) {
    if (j->p == j->end) snprintf(buf, cap, "the end of the %s", j->doc);
    else if (*j->p > 0x20 && *j->p < 0x7F) snprintf(buf, cap, "'%c'", *j->p);
    else snprintf(buf, cap, "byte 0x%02X", (unsigned char)*j->p);
    return buf;
}

int nn_json_expect(nn_json *j, char c) {
    if (j->msg[0]) return -1;
    char f[48];
    if (nn_json_peek(j) != c)
        return nn_json_fail(j, "expected '%c', found %s", c, found(j, f, sizeof f));
    j->p++;
    return 0;
}

int nn_json_open(nn_json *j, char open) {
    if (nn_json_expect(j, open)) return -1;
    if (nn_json_peek(j) != (open == '{' ? '}' : ']')) return 1;
    j->p++;
    return 0;
}

int nn_json_more(nn_json *j, char c) {
    if (j->msg[0]) return -1;
    char got = nn_json_peek(j), f[48];
    if (got == ',') return j->p++, 1;
    if (got == c) return j->p++, 0;
    return nn_json_fail(j, "expected ',' or '%c', found %s", c, found(j, f, sizeof f));
}

static int put(nn_json *j, const char *b, size_t n) {
    if (j->s_len + n + 1 > j->s_cap) {
        size_t c = j->s_cap ? j->s_cap : 64;
        while (c < j->s_len + n + 1) c *= 2;
        char *s = realloc(j->s, c);
        if (!s) return nn_json_fail(j, "out of memory");
        j->s = s, j->s_cap = c;
    }
    memcpy(j->s + j->s_len, b, n);
    j->s_len += n;
    j->s[j->s_len] = 0;
    return 0;
}

static int hex4(nn_json *j, unsigned *out) {
    unsigned v = 0;
    for (int i = 0; i < 4; i++, j->p++) {
        char c = j->p < j->end ? *j->p : 0;
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return nn_json_fail(j, "a \\u escape needs 4 hex digits");
        v = v << 4 | (unsigned)d;
    }
    *out = v;
    return 0;
}

static int put_cp(nn_json *j, unsigned cp) {
    char u[4];
    size_t n;
    if (cp < 0x80) u[0] = (char)cp, n = 1;
    else if (cp < 0x800) u[0] = (char)(0xC0 | cp >> 6), u[1] = (char)(0x80 | (cp & 63)), n = 2;
    else if (cp < 0x10000)
        u[0] = (char)(0xE0 | cp >> 12), u[1] = (char)(0x80 | (cp >> 6 & 63)),
        u[2] = (char)(0x80 | (cp & 63)), n = 3;
    else
        u[0] = (char)(0xF0 | cp >> 18), u[1] = (char)(0x80 | (cp >> 12 & 63)),
        u[2] = (char)(0x80 | (cp >> 6 & 63)), u[3] = (char)(0x80 | (cp & 63)), n = 4;
    return put(j, u, n);
}

static int escape(nn_json *j) {
    char e = j->p < j->end ? *j->p++ : 0;
    const char *plain = e ? strchr("\"\\/bfnrt", e) : NULL;
    if (plain) return put(j, &"\"\\/\b\f\n\r\t"[plain - "\"\\/bfnrt"], 1);
    unsigned cp = 0, lo = 0;
    if (e != 'u') return j->p--, nn_json_fail(j, "a string has an invalid escape");
    if (hex4(j, &cp)) return -1;
    if (cp >= 0xD800 && cp < 0xDC00) { /* a surrogate pair */
        if (j->end - j->p < 2 || j->p[0] != '\\' || j->p[1] != 'u')
            return nn_json_fail(j, "a string has an unpaired surrogate escape");
        j->p += 2;
        if (hex4(j, &lo)) return -1;
        if (lo < 0xDC00 || lo >= 0xE000)
            return nn_json_fail(j, "a string has an unpaired surrogate escape");
        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
    } else if (cp >= 0xDC00 && cp < 0xE000) {
        return nn_json_fail(j, "a string has an unpaired surrogate escape");
    } else if (cp == 0) {
        return nn_json_fail(j, "a string holds \\u0000");
    }
    return put_cp(j, cp);
}

int nn_json_string(nn_json *j) {
    if (nn_json_expect(j, '"')) return -1;
    j->s_len = 0;
    if (put(j, "", 0)) return -1;
    for (;;) {
        const char *q = j->p;
        while (q < j->end && *q != '"' && *q != '\\' && (unsigned char)*q >= 0x20) q++;
        if (put(j, j->p, (size_t)(q - j->p))) return -1;
        j->p = q;
        if (q == j->end) return nn_json_fail(j, "a string is not terminated");
        if (*q == '"') return j->p++, 0;
        if (*q != '\\') return nn_json_fail(j, "a string holds a raw control character");
        j->p++;
        if (escape(j)) return -1;
    }
}

int nn_json_int(nn_json *j, int64_t lo, int64_t hi, int64_t *out) {
    if (j->msg[0]) return -1;
    char c = nn_json_peek(j);
    bool neg = c == '-';
    const char *q = j->p + neg;
    if (q >= j->end || *q < '0' || *q > '9') return nn_json_fail(j, "expected an integer");
    if (*q == '0' && q + 1 < j->end && q[1] >= '0' && q[1] <= '9')
        return nn_json_fail(j, "an integer has a leading zero (not JSON)");
    int64_t v = 0;
    bool big = false;
    for (; q < j->end && *q >= '0' && *q <= '9'; q++) { /* to the last digit, even when big */
        int d = *q - '0';
        if (v > (INT64_MAX - d) / 10) big = true;
        else v = v * 10 + d;
    }
    if (q < j->end && (*q == '.' || *q == 'e' || *q == 'E'))
        return nn_json_fail(j, "expected an integer, found a fraction or exponent");
    if (neg) v = -v;
    if (big || v < lo || v > hi) {
        int n = (int)(q - j->p);
        return nn_json_fail(j, "the integer %.*s%s is outside [%lld, %lld]", n > 24 ? 24 : n, j->p,
                          n > 24 ? "..." : "", (long long)lo, (long long)hi);
    }
    j->p = q;
    *out = v;
    return 0;
}

static int skip_number(nn_json *j) {
    const char *q = j->p;
    if (q < j->end && *q == '-') q++;
    const char *d = q;
    while (q < j->end && *q >= '0' && *q <= '9') q++;
    if (q == d) return nn_json_fail(j, "expected a value");
    if (q < j->end && *q == '.') {
        d = ++q;
        while (q < j->end && *q >= '0' && *q <= '9') q++;
        if (q == d) return j->p = q, nn_json_fail(j, "a number has no digits after '.'");
    }
    if (q < j->end && (*q == 'e' || *q == 'E')) {
        q++;
        if (q < j->end && (*q == '+' || *q == '-')) q++;
        d = q;
        while (q < j->end && *q >= '0' && *q <= '9') q++;
        if (q == d) return j->p = q, nn_json_fail(j, "a number has no digits in its exponent");
    }
    j->p = q;
    return 0;
}

static int skip_at(nn_json *j, int depth) {
    if (depth > NN_JSON_MAX_DEPTH)
        return nn_json_fail(j, "values nest deeper than %d levels", NN_JSON_MAX_DEPTH);
    char c = nn_json_peek(j);
    if (c == '"') return nn_json_string(j);
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        int more = nn_json_open(j, c);
        while (more == 1) {
            if (c == '{' && (nn_json_string(j) || nn_json_expect(j, ':'))) return -1;
            if (skip_at(j, depth + 1)) return -1;
            more = nn_json_more(j, close);
        }
        return more;
    }
    static const char *const lit[] = {"true", "false", "null"};
    for (int i = 0; i < 3; i++) {
        size_t n = strlen(lit[i]);
        if ((size_t)(j->end - j->p) >= n && memcmp(j->p, lit[i], n) == 0) return j->p += n, 0;
    }
    if (j->p == j->end) return nn_json_fail(j, "expected a value, found the end of the %s", j->doc);
    return skip_number(j);
}

int nn_json_skip(nn_json *j) { return j->msg[0] ? -1 : skip_at(j, 0); }

int nn_json_end(nn_json *j) {
    if (j->msg[0]) return -1;
    nn_json_peek(j);
    return j->p < j->end ? nn_json_fail(j, "bytes after the JSON object") : 0;
}

void nn_json_free(nn_json *j) {
    free(j->s);
    j->s = NULL;
    j->s_len = j->s_cap = 0;
}
