/* tokenizer_pretok.c: GPT-2's pre-tokenizer, a hand-written matcher for
 * OpenAI's pattern (encoder.py, compiled by the Python regex module)
 *   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * tried at each position, leftmost alternative first; and the UTF-8 and
 * byte-to-unicode helpers of the tokenizer.
 *
 * Characters are Unicode code points read from UTF-8. A byte that does not
 * start a well-formed sequence (stray continuation, overlong form,
 * surrogate, above U+10FFFF, cut short) is one character by itself of class
 * "other" (not \p{L}, \p{N} nor \s): as Python's decode with
 * errors="surrogateescape" reads it (U+DC80 + byte, category Cs). */
#include "tokenizer_internal.h"
#include "tokenizer_unicode.h"

enum { C_L, C_N, C_S, C_O }; /* letter, number, space, other */

int nn_tok_utf8(const unsigned char *s, int64_t n, uint32_t *cp) {
    unsigned c = s[0];
    if (c < 0x80) return *cp = c, 1;
    int len = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    if (len == 0 || n < len) return 0;
    /* the second byte's range (Unicode Table 3-7): no overlongs, surrogates or > U+10FFFF */
    unsigned lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80;
    unsigned hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
    if (s[1] < lo || s[1] > hi) return 0;
    uint32_t v = c & (0x7F >> len);
    for (int k = 1; k < len; k++) {
        if (k > 1 && (s[k] & 0xC0) != 0x80) return 0;
        v = v << 6 | (s[k] & 0x3F);
    }
    *cp = v;
    return len;
}

int nn_tok_byte_of_cp(uint32_t cp) {
    /* bytes ! .. ~, ¡ .. ¬, ® .. ÿ stand for themselves; the other 68 bytes,
     * in order, for U+0100 .. U+0143 */
    if ((cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF))
        return (int)cp;
    if (cp < 0x100 || cp >= 0x100 + 68) return -1;
    int k = (int)(cp - 0x100);
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        if (!printable && k-- == 0) return b;
    }
    return -1;
}

static bool in_ranges(const nn_cp_range *r, int n, uint32_t cp) {
    int lo = 0, hi = n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (cp < r[mid].lo) hi = mid - 1;
        else if (cp > r[mid].hi) lo = mid + 1;
        else return true;
    }
    return false;
}

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

static int class_of_cp(uint32_t cp) {
    if (in_ranges(NN_UNI_L, COUNT(NN_UNI_L), cp)) return C_L;
    if (in_ranges(NN_UNI_N, COUNT(NN_UNI_N), cp)) return C_N;
    if (in_ranges(NN_UNI_S, COUNT(NN_UNI_S), cp)) return C_S;
    return C_O;
}

/* The class of the character at s[i] (i < len); *next gets where the next starts. */
static int class_at(const unsigned char *s, int64_t len, int64_t i, int64_t *next) {
    unsigned c = s[i];
    if (c < 0x80) { /* ASCII: the tables' answers, without the search */
        *next = i + 1;
        if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return C_L;
        if (c >= '0' && c <= '9') return C_N;
        if (c == ' ' || (c >= '\t' && c <= '\r')) return C_S;
        return C_O;
    }
    uint32_t cp;
    int n = nn_tok_utf8(s + i, len - i, &cp);
    if (n == 0) return *next = i + 1, C_O;
    *next = i + n;
    return class_of_cp(cp);
}

/* The end of the run of characters of class cls starting at i (at least one). */
static int64_t run_end(const unsigned char *s, int64_t len, int64_t i, int cls) {
    int64_t next;
    while (i < len && class_at(s, len, i, &next) == cls) i = next;
    return i;
}

/* 's 't 're 've 'm 'll 'd at i (lowercase only, as the pattern): its end, or -1. */
static int64_t contraction(const unsigned char *s, int64_t len, int64_t i) {
    if (s[i] != '\'' || i + 1 >= len) return -1;
    unsigned char a = s[i + 1], b = i + 2 < len ? s[i + 2] : 0;
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
    return -1;
}

int64_t nn_tok_piece_end(const unsigned char *s, int64_t len, int64_t i) {
    int64_t e = contraction(s, len, i), next;
    if (e >= 0) return e;
    int cls = class_at(s, len, i, &next);
    /*  ?\p{L}+,  ?\p{N}+,  ?[^\s\p{L}\p{N}]+: a space (U+0020 only) joins the run after it */
    if (s[i] == ' ' && next < len) {
        int64_t after;
        int c2 = class_at(s, len, next, &after);
        if (c2 != C_S) return run_end(s, len, next, c2);
    }
    if (cls != C_S) return run_end(s, len, i, cls);
    /* \s+(?!\S): a run of spaces up to the end, or but its last character when a
     * non-space follows (if that leaves one at least); else \s+ */
    int64_t end = run_end(s, len, i, C_S);
    if (end == len) return end;
    int64_t last = i, p = i;
    while (p < end) {
        last = p;
        class_at(s, len, p, &p);
    }
    return last > i ? last : end;
}
