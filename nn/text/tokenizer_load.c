/* tokenizer_load.c: nb_tokenizer_load, GPT-2's vocabulary and merges from
 * the files people have:
 * - Hugging Face's tokenizer.json ({"model": {"type": "BPE", "vocab": {...},
 *   "merges": ["a b", ...] or [["a", "b"], ...]}, "added_tokens": [...]});
 * - a vocab.json with merges.txt beside it (Hugging Face), or OpenAI's
 *   encoder.json with vocab.bpe beside it (the same two formats): tokens as
 *   GPT-2 writes them, each byte as a printable character (byte-to-unicode),
 *   merges one "a b" a line after an optional "#version" line;
 * - llm.c's gpt2_tokenizer.bin: 256 uint32 LE (magic 20240328, version 1 or
 *   2, vocab_size, eot in version 2), then per token a uint8 length (>= 1)
 *   and its bytes. No merges: decoding only.
 * Files are read whole and checked in one pass each, then the vocabulary is
 * indexed by a hash of its bytes: linear time whatever they hold. The first
 * problem found is the message. */
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../formats/byteorder_internal.h"
#include "../formats/files_internal.h"
#include "../nn_internal.h"
#include "tokenizer_internal.h"
#include "../formats/json_internal.h"

static const char *FN = "nb_tokenizer_load";

#define BIN_MAGIC 20240328u
#define BIN_HEADER_BYTES 1024
#define MAX_FILE_BYTES (INT64_C(1) << 30)

typedef struct {
    int64_t off, len, id;
    bool added, dropped; /* from added_tokens; the same token already in the vocab */
} tok_entry;

typedef struct {
    int64_t a, a_len, b, b_len, where; /* bytes in mbuf; line (text) or index (JSON) */
} merge_entry;

typedef struct {
    char *p;
    int64_t len, cap;
} bytes;

typedef struct {
    const char *path;    /* the file the tokens come from */
    char *merges_path;   /* merges.txt / vocab.bpe, or NULL (tokenizer.json) */
    char msg[640];
    bytes tb, mb;        /* token bytes, merge bytes */
    tok_entry *t;
    int64_t nt, ct;
    merge_entry *m;
    int64_t nm, cm;
    int64_t *table;      /* hash of the tokens' bytes -> entry index, -1 empty */
    uint64_t mask;
} loader;

static int lfail(loader *L, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int lfail(loader *L, const char *fmt, ...) {
    if (L->msg[0]) return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(L->msg, sizeof L->msg, fmt, ap);
    va_end(ap);
    return -1;
}

/* s[0..n) for a message: quotes, backslashes and control bytes escaped, cut at 40 bytes. */
static const char *shown(const char *s, int64_t n, char *out, size_t cap) {
    size_t k = 0;
    for (int64_t i = 0; i < n && k + 8 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        if (i == 40) {
            k += (size_t)snprintf(out + k, cap - k, "...");
            break;
        }
        if (c < 0x20 || c == 0x7F || c == '"' || c == '\\')
            k += (size_t)snprintf(out + k, cap - k, "\\x%02X", c);
        else out[k++] = (char)c;
    }
    out[k] = 0;
    return out;
}

static int put(loader *L, bytes *b, const char *s, int64_t n) {
    if (b->len + n > b->cap) {
        int64_t c = b->cap ? b->cap : 4096;
        while (c < b->len + n) c *= 2;
        char *p = realloc(b->p, (size_t)c);
        if (!p) return lfail(L, "out of memory");
        b->p = p, b->cap = c;
    }
    if (n) memcpy(b->p + b->len, s, (size_t)n);
    b->len += n;
    return 0;
}

/* GPT-2's printable form of a token (UTF-8, one character per byte) into
 * its bytes, appended to b: 0; or -1 with *bad the code point no byte
 * stands for (0xFFFFFFFF: the text is not valid UTF-8). */
static int unmap(loader *L, bytes *b, const char *s, int64_t n, uint32_t *bad) {
    for (int64_t i = 0; i < n;) {
        uint32_t cp;
        int k = nn_tok_utf8((const unsigned char *)s + i, n - i, &cp);
        int byte = k ? nn_tok_byte_of_cp(cp) : -1;
        if (byte < 0) return *bad = k ? cp : 0xFFFFFFFFu, -1;
        char c = (char)byte;
        if (put(L, b, &c, 1)) return *bad = 0, -1;
        i += k;
    }
    return 0;
}

static int unmap_failed(loader *L, const char *where, const char *s, int64_t n, uint32_t bad) {
    char sh[200];
    if (L->msg[0]) return -1;
    if (bad == 0xFFFFFFFFu)
        return lfail(L, "%s: \"%s\" is not valid UTF-8", where, shown(s, n, sh, sizeof sh));
    return lfail(L, "%s: \"%s\" holds U+%04X, which is none of GPT-2's 256 byte characters "
                 "(not a byte-level BPE vocabulary)", where, shown(s, n, sh, sizeof sh), bad);
}

/* ------------------------------------------------------------- collecting */
/* p (n items used of *cap, of size bytes each) with room for one more:
 * doubled when full; NULL after a message. */
static void *room_for_one(loader *L, void *p, int64_t n, int64_t *cap, size_t size) {
    if (n < *cap) return p;
    int64_t c = *cap ? *cap * 2 : 1024;
    void *q = realloc(p, (size_t)c * size);
    if (!q) return lfail(L, "out of memory"), NULL;
    *cap = c;
    return q;
}

static int add_token(loader *L, const char *s, int64_t n, bool map) {
    tok_entry *t = room_for_one(L, L->t, L->nt, &L->ct, sizeof *t);
    if (!t) return -1;
    L->t = t;
    tok_entry *e = &L->t[L->nt];
    *e = (tok_entry){.off = L->tb.len, .id = -1, .added = !map};
    uint32_t bad;
    if (map ? unmap(L, &L->tb, s, n, &bad) : put(L, &L->tb, s, n)) {
        char where[300];
        snprintf(where, sizeof where, "\"%s\": token %lld", L->path, (long long)L->nt);
        return unmap_failed(L, where, s, n, bad);
    }
    e->len = L->tb.len - e->off;
    if (e->len == 0) return lfail(L, "\"%s\": token %lld is the empty string", L->path,
                                  (long long)L->nt);
    L->nt++;
    return 0;
}

static int add_merge(loader *L, const char *a, int64_t an, const char *b, int64_t bn,
                     int64_t where, const char *where_text) {
    merge_entry *m = room_for_one(L, L->m, L->nm, &L->cm, sizeof *m);
    if (!m) return -1;
    L->m = m;
    merge_entry *e = &L->m[L->nm];
    uint32_t bad;
    e->where = where;
    e->a = L->mb.len;
    if (unmap(L, &L->mb, a, an, &bad)) return unmap_failed(L, where_text, a, an, bad);
    e->a_len = L->mb.len - e->a;
    e->b = L->mb.len;
    if (unmap(L, &L->mb, b, bn, &bad)) return unmap_failed(L, where_text, b, bn, bad);
    e->b_len = L->mb.len - e->b;
    L->nm++;
    return 0;
}

/* "a b": exactly two non-empty parts around one space. */
static int add_merge_line(loader *L, const char *s, int64_t n, int64_t where,
                          const char *where_text) {
    const char *sp = memchr(s, ' ', (size_t)n);
    char sh[200];
    if (!sp || sp == s || sp == s + n - 1 || memchr(sp + 1, ' ', (size_t)(s + n - sp - 1)))
        return lfail(L, "%s: \"%s\" is not two tokens separated by one space", where_text,
                     shown(s, n, sh, sizeof sh));
    return add_merge(L, s, sp - s, sp + 1, s + n - sp - 1, where, where_text);
}

/* ------------------------------------------------------------------ JSON */
static int json_failed(loader *L, nn_json *j) {
    return lfail(L, "\"%s\": %s", L->path, j->msg[0] ? j->msg : "out of memory");
}

/* What the value at the cursor is when it is no number, for a message ("a
 * string", "null", ...), or NULL (a number, or no JSON value: the reader
 * names that). */
static const char *not_a_number(nn_json *j) {
    static const char *const lit[] = {"true", "false", "null"};
    char c = nn_json_peek(j);
    if (c == '"') return "a string";
    if (c == '{') return "an object";
    if (c == '[') return "an array";
    for (int i = 0; i < 3; i++) {
        size_t n = strlen(lit[i]);
        if ((size_t)(j->end - j->p) >= n && memcmp(j->p, lit[i], n) == 0) return lit[i];
    }
    return NULL;
}

/* "token": id, the current member of a vocabulary object (key in j->s). */
static int vocab_member(loader *L, nn_json *j) {
    if (add_token(L, j->s, (int64_t)j->s_len, true) || nn_json_expect(j, ':')) return -1;
    const char *kind = not_a_number(j);
    if (kind) nn_json_fail(j, "expected an integer, found %s", kind);
    else if (nn_json_int(j, 0, NN_TOK_MAX_VOCAB - 1, &L->t[L->nt - 1].id) == 0) return 0;
    char sh[200];
    tok_entry *e = &L->t[L->nt - 1];
    return lfail(L, "\"%s\": the id of token \"%s\": %s", L->path,
                 shown(L->tb.p + e->off, e->len, sh, sizeof sh), j->msg);
}

static int parse_vocab(loader *L, nn_json *j) {
    int more = nn_json_open(j, '{');
    while (more == 1) {
        if (nn_json_string(j)) return json_failed(L, j);
        if (vocab_member(L, j)) return L->msg[0] ? -1 : json_failed(L, j);
        more = nn_json_more(j, '}');
    }
    return more ? json_failed(L, j) : 0;
}

/* One merge: "a b" or ["a", "b"]. */
static int parse_merge(loader *L, nn_json *j) {
    char where[300];
    snprintf(where, sizeof where, "\"%s\": model.merges[%lld]", L->path, (long long)L->nm);
    if (nn_json_peek(j) == '"') {
        if (nn_json_string(j)) return json_failed(L, j);
        return add_merge_line(L, j->s, (int64_t)j->s_len, L->nm, where);
    }
    /* ["a", "b"]: the first part is kept while the second is read */
    int64_t mark = L->mb.len;
    if (nn_json_expect(j, '[') || nn_json_string(j)) return json_failed(L, j);
    if (put(L, &L->mb, j->s, (int64_t)j->s_len)) return -1;
    int64_t an = L->mb.len - mark;
    if (nn_json_expect(j, ',') || nn_json_string(j) || nn_json_expect(j, ']'))
        return json_failed(L, j);
    char *a = malloc((size_t)an + 1);
    if (!a) return lfail(L, "out of memory");
    memcpy(a, L->mb.p + mark, (size_t)an);
    L->mb.len = mark;
    int rc = add_merge(L, a, an, j->s, (int64_t)j->s_len, L->nm, where);
    free(a);
    return rc;
}

static int parse_merges(loader *L, nn_json *j) {
    int more = nn_json_open(j, '[');
    while (more == 1) {
        if (parse_merge(L, j)) return -1;
        more = nn_json_more(j, ']');
    }
    return more ? json_failed(L, j) : 0;
}

/* A first pass over "model": its type and the options that would change the
 * ids, whatever the order of its members (the cursor goes back after it).
 * Options that cannot change a byte-level BPE's ids (unk_token, fuse_unk,
 * byte_fallback: every byte has its token) are not looked at. */
static int check_model(loader *L, nn_json *j) {
    const char *start = j->p;
    bool type = false;
    char sh[200];
    int more = nn_json_open(j, '{');
    while (more == 1) {
        if (nn_json_string(j) || nn_json_expect(j, ':')) return json_failed(L, j);
        const char *key = j->s;
        if (strcmp(key, "type") == 0) {
            if (type) return lfail(L, "\"%s\": model.type appears twice", L->path);
            type = true;
            if (nn_json_string(j)) return json_failed(L, j);
            if (strcmp(j->s, "BPE") != 0)
                return lfail(L, "\"%s\": model.type is \"%s\", not \"BPE\"", L->path,
                             shown(j->s, (int64_t)j->s_len, sh, sizeof sh));
        } else if (strcmp(key, "ignore_merges") == 0 && nn_json_peek(j) == 't') {
            return lfail(L, "\"%s\": model.ignore_merges is true, not GPT-2's false (nabla's ids "
                         "would differ from Hugging Face's)", L->path);
        } else if ((strcmp(key, "continuing_subword_prefix") == 0 ||
                    strcmp(key, "end_of_word_suffix") == 0) && nn_json_peek(j) == '"') {
            const char *member = key[0] == 'c' ? "continuing_subword_prefix" : "end_of_word_suffix";
            if (nn_json_string(j)) return json_failed(L, j);
            if (j->s_len)
                return lfail(L, "\"%s\": model.%s is \"%s\", not GPT-2's \"\" (nabla's ids would "
                             "differ from Hugging Face's)", L->path, member,
                             shown(j->s, (int64_t)j->s_len, sh, sizeof sh));
        } else if (strcmp(key, "dropout") == 0 && !not_a_number(j)) {
            const char *p = j->p;
            if (nn_json_skip(j)) return json_failed(L, j);
            bool zero = true;
            for (const char *q = p; q < j->p && *q != 'e' && *q != 'E'; q++)
                zero = zero && !(*q >= '1' && *q <= '9');
            if (!zero)
                return lfail(L, "\"%s\": model.dropout is %s, not GPT-2's null (nabla's ids would "
                             "differ from Hugging Face's)", L->path, shown(p, j->p - p, sh, sizeof sh));
        } else if (nn_json_skip(j)) {
            return json_failed(L, j);
        }
        more = nn_json_more(j, '}');
    }
    if (more) return json_failed(L, j);
    j->p = start;
    return 0;
}

/* {"type": "BPE", "vocab": {...}, "merges": [...], ...} */
static int parse_model(loader *L, nn_json *j) {
    if (check_model(L, j)) return -1;
    bool vocab = false, merges = false;
    int more = nn_json_open(j, '{');
    while (more == 1) {
        if (nn_json_string(j) || nn_json_expect(j, ':')) return json_failed(L, j);
        if (strcmp(j->s, "vocab") == 0) {
            if (vocab) return lfail(L, "\"%s\": model.vocab appears twice", L->path);
            vocab = true;
            if (parse_vocab(L, j)) return -1;
        } else if (strcmp(j->s, "merges") == 0) {
            if (merges) return lfail(L, "\"%s\": model.merges appears twice", L->path);
            merges = true;
            if (parse_merges(L, j)) return -1;
        } else if (nn_json_skip(j)) {
            return json_failed(L, j);
        }
        more = nn_json_more(j, '}');
    }
    if (more) return json_failed(L, j);
    if (!vocab) return lfail(L, "\"%s\": \"model\" has no \"vocab\"", L->path);
    if (!merges) return lfail(L, "\"%s\": \"model\" has no \"merges\"", L->path);
    return 0;
}

/* [{"id": 50256, "content": "<|endoftext|>", ...}, ...]: tokens matched in
 * the text as they are (not byte-mapped). The encoder matches
 * <|endoftext|> only, so another added token is refused: Hugging Face would
 * match it in the text, and the ids would differ. */
static int parse_added_entry(loader *L, nn_json *j, int64_t entry) {
    int64_t id = -1, index = L->nt;
    bool content = false, has_id = false;
    char sh[200];
    int more = nn_json_open(j, '{');
    while (more == 1) {
        if (nn_json_string(j) || nn_json_expect(j, ':')) return json_failed(L, j);
        bool is_id = strcmp(j->s, "id") == 0, is_content = strcmp(j->s, "content") == 0;
        if ((is_id && has_id) || (is_content && content))
            return lfail(L, "\"%s\": added_tokens[%lld] has \"%s\" twice", L->path,
                         (long long)entry, is_id ? "id" : "content");
        if (is_id) {
            has_id = true;
            if (nn_json_int(j, 0, NN_TOK_MAX_VOCAB - 1, &id)) return json_failed(L, j);
        } else if (is_content) {
            content = true;
            if (nn_json_string(j)) return json_failed(L, j);
            if (j->s_len != NN_TOK_EOT_LEN || memcmp(j->s, NN_TOK_EOT_TEXT, NN_TOK_EOT_LEN) != 0)
                return lfail(L, "\"%s\": added_tokens[%lld] is \"%s\": nabla matches no added token "
                             "in the text but <|endoftext|> (nabla's ids would differ from Hugging "
                             "Face's)", L->path, (long long)entry,
                             shown(j->s, (int64_t)j->s_len, sh, sizeof sh));
            if (add_token(L, j->s, (int64_t)j->s_len, false)) return -1;
        } else if (nn_json_skip(j)) {
            return json_failed(L, j);
        }
        more = nn_json_more(j, '}');
    }
    if (more < 0) return json_failed(L, j);
    if (!content || id < 0)
        return lfail(L, "\"%s\": an entry of added_tokens has no %s", L->path,
                     content ? "\"id\"" : "\"content\"");
    L->t[index].id = id;
    return 0;
}

static int parse_added(loader *L, nn_json *j) {
    int more = nn_json_open(j, '[');
    for (int64_t entry = 0; more == 1; entry++) {
        if (parse_added_entry(L, j, entry)) return -1;
        more = nn_json_more(j, ']');
    }
    return more ? json_failed(L, j) : 0;
}

/* "pre_tokenizer" (GPT-2's: {"type": "ByteLevel", "add_prefix_space":
 * false, "use_regex": true (the default)}) or "normalizer" (GPT-2 has none:
 * null): anything else would split or change the text otherwise. */
static int check_text_step(loader *L, nn_json *j, bool pre) {
    char is[240] = "", sh[200];
    const char *kind = not_a_number(j);
    if (nn_json_peek(j) == '{') {
        bool type = false, prefix = false, regex = true;
        int more = nn_json_open(j, '{');
        while (more == 1) {
            if (nn_json_string(j) || nn_json_expect(j, ':')) return json_failed(L, j);
            if (strcmp(j->s, "type") == 0 && nn_json_peek(j) == '"') {
                if (nn_json_string(j)) return json_failed(L, j);
                type = true;
                if (!is[0] && (!pre || strcmp(j->s, "ByteLevel") != 0))
                    snprintf(is, sizeof is, "\"%s\"", shown(j->s, (int64_t)j->s_len, sh, sizeof sh));
            } else if (pre && strcmp(j->s, "add_prefix_space") == 0 && nn_json_peek(j) == 't') {
                prefix = true;
                if (nn_json_skip(j)) return json_failed(L, j);
            } else if (pre && strcmp(j->s, "use_regex") == 0 && nn_json_peek(j) == 'f') {
                regex = false;
                if (nn_json_skip(j)) return json_failed(L, j);
            } else if (nn_json_skip(j)) {
                return json_failed(L, j);
            }
            more = nn_json_more(j, '}');
        }
        if (more) return json_failed(L, j);
        if (!is[0] && !type) snprintf(is, sizeof is, "an object without \"type\"");
        else if (!is[0] && prefix) snprintf(is, sizeof is, "ByteLevel with add_prefix_space true");
        else if (!is[0] && !regex) snprintf(is, sizeof is, "ByteLevel with use_regex false");
    } else if (kind && (pre || strcmp(kind, "null") != 0)) {
        snprintf(is, sizeof is, "%s", kind);
        if (nn_json_skip(j)) return json_failed(L, j);
    } else if (nn_json_skip(j)) {
        return json_failed(L, j);
    } else if (!kind) {
        snprintf(is, sizeof is, "a number");
    }
    if (!is[0]) return 0;
    if (pre)
        return lfail(L, "\"%s\": pre_tokenizer is %s, not GPT-2's ByteLevel (add_prefix_space "
                     "false, use_regex true) (nabla's ids would differ from Hugging Face's)",
                     L->path, is);
    return lfail(L, "\"%s\": normalizer is %s, not GPT-2's null (nabla's ids would differ from "
                 "Hugging Face's)", L->path, is);
}

/* Whether the value after the key just read (and its ':') is a number. */
static bool number_follows(const nn_json *j) {
    const char *p = j->p;
    for (int colon = 0; p < j->end; p++) {
        if (*p == ':' && !colon++) continue;
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') break;
    }
    return p < j->end && (*p == '-' || (*p >= '0' && *p <= '9'));
}

/* A vocab.json / encoder.json (flat: every member is "token": id) or a
 * tokenizer.json (the members "model", "added_tokens", "pre_tokenizer" and
 * "normalizer" read, others skipped). A UTF-8 byte order mark at the start
 * is skipped (RFC 8259 lets a reader ignore it); byte offsets in messages
 * count it. */
static int parse_json(loader *L, const char *data, int64_t len, bool *is_tokenizer_json) {
    nn_json j;
    nn_json_init(&j, data, (size_t)len, "file");
    if (len >= 3 && memcmp(data, "\xEF\xBB\xBF", 3) == 0) j.p += 3;
    static const char *const known[] = {"model", "added_tokens", "pre_tokenizer", "normalizer"};
    bool flat = false, seen[4] = {false};
    char other[200] = "";      /* the first member that is not "token": id */
    const char *other_kind = NULL;
    int64_t other_at = 0;
    int rc = -1, more = nn_json_open(&j, '{');
    for (; more == 1; more = nn_json_more(&j, '}')) {
        if (nn_json_string(&j)) goto done;
        if (number_follows(&j)) {
            flat = true;
            if (vocab_member(L, &j)) goto done;
            continue;
        }
        if (nn_json_expect(&j, ':')) goto done;
        if (!other_kind && (other_kind = not_a_number(&j))) {
            shown(j.s, (int64_t)j.s_len, other, sizeof other);
            other_at = j.p - j.start;
        }
        int k = 0;
        while (k < 4 && strcmp(j.s, known[k]) != 0) k++;
        if (k == 4) {
            if (nn_json_skip(&j)) goto done;
            continue;
        }
        if (seen[k]) {
            lfail(L, "\"%s\": \"%s\" appears twice", L->path, known[k]);
            goto done;
        }
        seen[k] = true;
        if (k == 0 ? parse_model(L, &j) : k == 1 ? parse_added(L, &j)
                                                  : check_text_step(L, &j, k == 2))
            goto done;
    }
    if (more < 0 || nn_json_end(&j)) goto done;
    if (flat && seen[0]) {
        lfail(L, "\"%s\": has both \"token\": id members (a vocab.json) and a \"model\" "
              "(a tokenizer.json)", L->path);
        goto done;
    }
    if (flat && other_kind) {
        lfail(L, "\"%s\": member \"%s\": expected an integer (a token id), found %s (JSON, byte "
              "%lld)", L->path, other, other_kind, (long long)other_at);
        goto done;
    }
    if (!flat && !seen[0]) {
        lfail(L, "\"%s\": neither a vocab.json (\"token\": id members) nor a tokenizer.json "
              "(a \"model\" object)", L->path);
        goto done;
    }
    *is_tokenizer_json = seen[0];
    rc = 0;
done:
    if (rc && !L->msg[0]) json_failed(L, &j);
    nn_json_free(&j);
    return rc;
}

/* ------------------------------------------------------------------ files */
/* The whole file: 0, or -1 with a message (ENOENT in *err when it is not there). */
static int read_file(loader *L, const char *path, char **data, int64_t *len, int *err) {
    struct stat st;
    char m[400];
    *err = 0;
    errno = 0; /* a file that is there but not regular leaves it 0 */
    int fd = nn_open_regular(path, &st, m, sizeof m);
    if (fd < 0) {
        *err = errno;
        if (errno == 0 && stat(path, &st) == 0 && S_ISDIR(st.st_mode))
            return lfail(L, "\"%s\" is a directory, not a tokenizer file (give the tokenizer.json, "
                         "vocab.json, encoder.json or gpt2_tokenizer.bin in it)", path);
        return lfail(L, "%s", m);
    }
    if ((int64_t)st.st_size > MAX_FILE_BYTES) {
        close(fd);
        return lfail(L, "\"%s\": %lld bytes, larger than any tokenizer file (1 GiB)", path,
                     (long long)st.st_size);
    }
    *len = (int64_t)st.st_size;
    *data = malloc((size_t)*len + 1);
    if (!*data) {
        close(fd);
        return lfail(L, "\"%s\": out of memory for %lld bytes", path, (long long)*len);
    }
    for (int64_t got = 0; got < *len;) {
        ssize_t r = read(fd, *data + got, (size_t)(*len - got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            close(fd);
            free(*data);
            *data = NULL;
            return lfail(L, "cannot read \"%s\": %s", path,
                         r < 0 ? strerror(errno) : "the file shrank while being read");
        }
        got += r;
    }
    close(fd);
    return 0;
}

/* merges.txt / vocab.bpe: "#version..." first (optional), then "a b" a line.
 * A line ends at "\n", "\r\n" or a lone "\r": the file is read as Python's
 * universal newlines read it (OpenAI's encoder.py and Hugging Face's
 * GPT2Tokenizer open it in text mode). A UTF-8 byte order mark at the start
 * is skipped; an empty file (0 bytes: a download that failed) is refused. */
static int parse_merges_text(loader *L, const char *data, int64_t len) {
    if (len == 0) return lfail(L, "\"%s\": the file is empty (0 bytes)", L->merges_path);
    const char *p = data, *end = data + len;
    if (len >= 3 && memcmp(p, "\xEF\xBB\xBF", 3) == 0) p += 3;
    for (int64_t line = 1; p < end; line++) {
        const char *e = p;
        while (e < end && *e != '\n' && *e != '\r') e++;
        int64_t n = e - p;
        if (!(line == 1 && n >= 8 && memcmp(p, "#version", 8) == 0) && n > 0) {
            char where[300];
            snprintf(where, sizeof where, "\"%s\" line %lld", L->merges_path, (long long)line);
            if (add_merge_line(L, p, n, line, where)) return -1;
        }
        if (e == end) break;
        p = e + (*e == '\r' && e + 1 < end && e[1] == '\n' ? 2 : 1);
    }
    return 0;
}

/* The merges beside a vocab.json (merges.txt) or an encoder.json (vocab.bpe):
 * the usual one for the file's name first, then the other. */
static int read_merges_beside(loader *L) {
    const char *slash = strrchr(L->path, '/');
    size_t dir = slash ? (size_t)(slash - L->path + 1) : 0;
    const char *base = L->path + dir;
    const char *names[2] = {"merges.txt", "vocab.bpe"};
    if (strcmp(base, "encoder.json") == 0) names[0] = "vocab.bpe", names[1] = "merges.txt";
    char first[512] = "";
    for (int k = 0; k < 2; k++) {
        free(L->merges_path);
        L->merges_path = malloc(dir + strlen(names[k]) + 1);
        if (!L->merges_path) return lfail(L, "out of memory");
        memcpy(L->merges_path, L->path, dir);
        strcpy(L->merges_path + dir, names[k]);
        char *data = NULL;
        int64_t len = 0;
        int err;
        int rc = read_file(L, L->merges_path, &data, &len, &err);
        if (rc == 0) {
            rc = parse_merges_text(L, data, len);
            free(data);
            return rc;
        }
        if (err != ENOENT) return -1;
        if (k == 0) snprintf(first, sizeof first, "%s", L->merges_path);
        L->msg[0] = 0;
    }
    return lfail(L, "\"%s\": no merges file beside it (no \"%s\", no \"%s\")", L->path, first,
                 L->merges_path);
}

static uint32_t le32(const unsigned char *p) { return nn_ld_le32(p); }

/* llm.c's gpt2_tokenizer.bin, into tok (tokens only; can_encode stays false). */
static int load_bin(loader *L, nb_tokenizer *tok, const unsigned char *d, int64_t len) {
    if (len >= 4 && le32(d) != BIN_MAGIC)
        return lfail(L, "\"%s\": bad magic number %u for llm.c's gpt2_tokenizer.bin (expected "
                     "%u)", L->path, le32(d), BIN_MAGIC);
    if (len < BIN_HEADER_BYTES)
        return lfail(L, "\"%s\": %lld bytes, shorter than llm.c's tokenizer header (%d)", L->path,
                     (long long)len, BIN_HEADER_BYTES);
    uint32_t version = le32(d + 4), n = le32(d + 8), eot = le32(d + 12);
    if (version != 1 && version != 2)
        return lfail(L, "\"%s\": llm.c tokenizer version %u (1 and 2 are known)", L->path, version);
    if (n == 0 || n > NN_TOK_MAX_VOCAB)
        return lfail(L, "\"%s\": vocab_size %u is not in [1, %lld]", L->path, n,
                     (long long)NN_TOK_MAX_VOCAB);
    if (version == 2 && eot >= n)
        return lfail(L, "\"%s\": eot token %u is not below vocab_size %u", L->path, eot, n);
    /* one pass to check the lengths, before allocating anything by them */
    int64_t p = BIN_HEADER_BYTES, total = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (p >= len || p + 1 + d[p] > len)
            return lfail(L, "\"%s\": token %u of %u is cut short (the file ends at byte %lld)",
                         L->path, i, n, (long long)len);
        if (d[p] == 0) return lfail(L, "\"%s\": token %u has length 0", L->path, i);
        total += d[p];
        p += 1 + d[p];
    }
    if (p != len)
        return lfail(L, "\"%s\": %lld bytes after the last of its %u tokens", L->path,
                     (long long)(len - p), n);
    tok->n = n;
    tok->off = malloc(((size_t)n + 1) * sizeof *tok->off);
    tok->bytes = malloc((size_t)total);
    if (!tok->off || !tok->bytes) return lfail(L, "out of memory");
    p = BIN_HEADER_BYTES;
    tok->off[0] = 0;
    for (uint32_t i = 0; i < n; i++) {
        memcpy(tok->bytes + tok->off[i], d + p + 1, d[p]);
        tok->off[i + 1] = tok->off[i] + d[p];
        p += 1 + d[p];
    }
    tok->eot = version == 2 ? (int64_t)eot : -1;
    for (uint32_t i = 0; version == 1 && i < n; i++)
        if (tok->off[i + 1] - tok->off[i] == NN_TOK_EOT_LEN &&
            memcmp(tok->bytes + tok->off[i], NN_TOK_EOT_TEXT, NN_TOK_EOT_LEN) == 0) {
            tok->eot = i;
            break;
        }
    return 0;
}

/* ------------------------------------------------------------ the vocabulary */
static uint64_t hash_bytes(const char *s, int64_t n) {
    uint64_t h = UINT64_C(1469598103934665603);
    for (int64_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * UINT64_C(1099511628211);
    return h ^ h >> 32;
}

/* The entry whose bytes are s[0..n), or -1. */
static int64_t lookup(const loader *L, const char *s, int64_t n) {
    for (uint64_t i = hash_bytes(s, n) & L->mask;; i = (i + 1) & L->mask) {
        int64_t k = L->table[i];
        if (k < 0) return -1;
        if (L->t[k].len == n && memcmp(L->tb.p + L->t[k].off, s, (size_t)n) == 0) return k;
    }
}

/* Indexes the entries by bytes; a token twice is an error, but for an added
 * token the vocabulary also has with its id (the second is dropped). */
static int index_tokens(loader *L) {
    uint64_t slots = 16;
    while (slots < (uint64_t)L->nt * 2) slots <<= 1;
    L->mask = slots - 1;
    L->table = malloc(slots * sizeof *L->table);
    if (!L->table) return lfail(L, "out of memory");
    memset(L->table, 0xFF, slots * sizeof *L->table);
    for (int64_t k = 0; k < L->nt; k++) {
        tok_entry *e = &L->t[k];
        int64_t old = lookup(L, L->tb.p + e->off, e->len);
        if (old < 0) {
            uint64_t i = hash_bytes(L->tb.p + e->off, e->len) & L->mask;
            while (L->table[i] >= 0) i = (i + 1) & L->mask;
            L->table[i] = k;
            continue;
        }
        char sh[200];
        shown(L->tb.p + e->off, e->len, sh, sizeof sh);
        if ((e->added || L->t[old].added) && L->t[old].id == e->id) {
            e->dropped = true;
            continue;
        }
        return lfail(L, "\"%s\": token \"%s\" appears twice (ids %lld and %lld)", L->path, sh,
                     (long long)L->t[old].id, (long long)e->id);
    }
    return 0;
}

/* Ids must be 0..n-1, each once; then the tokens go to tok in id order. */
static int place_tokens(loader *L, nb_tokenizer *tok) {
    int64_t n = 0;
    for (int64_t k = 0; k < L->nt; k++) n += !L->t[k].dropped;
    if (n == 0) return lfail(L, "\"%s\": the vocabulary is empty", L->path);
    int64_t *slot = malloc((size_t)n * sizeof *slot);
    tok->off = malloc(((size_t)n + 1) * sizeof *tok->off);
    tok->bytes = malloc((size_t)L->tb.len + 1);
    if (!slot || !tok->off || !tok->bytes) return free(slot), lfail(L, "out of memory");
    memset(slot, 0xFF, (size_t)n * sizeof *slot);
    int rc = 0;
    char sh[200], sh2[200];
    for (int64_t k = 0; k < L->nt && rc == 0; k++) {
        tok_entry *e = &L->t[k];
        if (e->dropped) continue;
        shown(L->tb.p + e->off, e->len, sh, sizeof sh);
        if (e->id >= n)
            rc = lfail(L, "\"%s\": token \"%s\" has id %lld, but there are %lld tokens "
                       "(ids must be 0..%lld)", L->path, sh, (long long)e->id, (long long)n,
                       (long long)n - 1);
        else if (slot[e->id] >= 0)
            rc = lfail(L, "\"%s\": id %lld is given to two tokens, \"%s\" and \"%s\"", L->path,
                       (long long)e->id,
                       shown(L->tb.p + L->t[slot[e->id]].off, L->t[slot[e->id]].len, sh2,
                             sizeof sh2), sh);
        else slot[e->id] = k;
    }
    tok->n = n;
    tok->off[0] = 0;
    for (int64_t i = 0; i < n && rc == 0; i++) {
        const tok_entry *e = &L->t[slot[i]];
        memcpy(tok->bytes + tok->off[i], L->tb.p + e->off, (size_t)e->len);
        tok->off[i + 1] = tok->off[i] + e->len;
    }
    free(slot);
    return rc;
}

/* The merges as pairs of ids, ranked by their order. */
static int place_merges(loader *L, nb_tokenizer *tok) {
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        int64_t k = lookup(L, &c, 1);
        if (k < 0)
            return lfail(L, "\"%s\": no token is the byte 0x%02X alone (a byte-level BPE "
                         "vocabulary has all 256)", L->path, b);
        tok->byte_id[b] = (int32_t)L->t[k].id;
    }
    if (L->nm > INT32_MAX) return lfail(L, "\"%s\": more than 2^31 merges", L->path);
    if (nn_tok_pairs_init(&tok->pairs, L->nm)) return lfail(L, "out of memory");
    bytes cat = {0};
    int rc = 0;
    for (int64_t i = 0; i < L->nm && rc == 0; i++) {
        const merge_entry *m = &L->m[i];
        const char *a = L->mb.p + m->a, *b = L->mb.p + m->b;
        char where[400], sh[200], sh2[200];
        if (L->merges_path)
            snprintf(where, sizeof where, "\"%s\" line %lld", L->merges_path, (long long)m->where);
        else snprintf(where, sizeof where, "\"%s\": model.merges[%lld]", L->path, (long long)m->where);
        int64_t ka = lookup(L, a, m->a_len), kb = lookup(L, b, m->b_len), kr = -1;
        cat.len = 0;
        if (ka >= 0 && kb >= 0 && put(L, &cat, a, m->a_len) == 0 && put(L, &cat, b, m->b_len) == 0)
            kr = lookup(L, cat.p, cat.len);
        int32_t old;
        if (L->msg[0]) rc = -1;
        else if (ka < 0 || kb < 0)
            rc = lfail(L, "%s: \"%s\" is not in the vocabulary of \"%s\"", where,
                       ka < 0 ? shown(a, m->a_len, sh, sizeof sh) : shown(b, m->b_len, sh, sizeof sh),
                       L->path);
        else if (kr < 0)
            rc = lfail(L, "%s: the merge of \"%s\" and \"%s\" is not in the vocabulary of \"%s\"",
                       where, shown(a, m->a_len, sh, sizeof sh), shown(b, m->b_len, sh2, sizeof sh2),
                       L->path);
        else if (nn_tok_pairs_add(&tok->pairs, (int32_t)L->t[ka].id, (int32_t)L->t[kb].id,
                                  (int32_t)i, (int32_t)L->t[kr].id, &old) != 0)
            rc = lfail(L, "%s: the merge \"%s %s\" is there already (merge %d)", where,
                       shown(a, m->a_len, sh, sizeof sh), shown(b, m->b_len, sh2, sizeof sh2), old);
    }
    free(cat.p);
    return rc;
}

static int build(loader *L, nb_tokenizer *tok) {
    if (index_tokens(L) || place_tokens(L, tok) || place_merges(L, tok)) return -1;
    int64_t k = lookup(L, NN_TOK_EOT_TEXT, NN_TOK_EOT_LEN);
    tok->eot = k >= 0 ? L->t[k].id : -1;
    tok->can_encode = true;
    return 0;
}

/* llm.c's gpt2_tokenizer.bin: its magic number, or what is left of it in
 * a file cut before 4 bytes, or a name ending in ".bin" (so that a bad
 * magic number or a cut file is named as such, not read as JSON). */
static bool is_bin(const char *path, const unsigned char *d, int64_t len) {
    static const unsigned char magic[4] = {BIN_MAGIC & 0xFF, BIN_MAGIC >> 8 & 0xFF,
                                           BIN_MAGIC >> 16 & 0xFF, BIN_MAGIC >> 24};
    size_t n = strlen(path);
    return memcmp(d, magic, (size_t)(len < 4 ? len : 4)) == 0 ||
           (n >= 4 && strcmp(path + n - 4, ".bin") == 0);
}

/* Whether the file starts as a text (JSON or not) does: with a printable
 * ASCII byte, a space, tab, newline or carriage return, or a UTF-8 byte
 * order mark. The JSON reader then names what is wrong with it; a binary
 * file of 4 bytes or more gets a message of its own. */
static bool looks_json(const unsigned char *d, int64_t len) {
    if (len < 4 || (len >= 3 && memcmp(d, "\xEF\xBB\xBF", 3) == 0)) return true;
    return (d[0] >= 0x20 && d[0] < 0x7F) || d[0] == '\t' || d[0] == '\n' || d[0] == '\r';
}

static void loader_free(loader *L) {
    free(L->merges_path), free(L->tb.p), free(L->mb.p), free(L->t), free(L->m), free(L->table);
}

nb_tokenizer *nb_tokenizer_load(const char *path) {
    if (!path) return nn_error("%s: path is NULL", FN);
    loader L = {.path = path};
    nb_tokenizer *tok = calloc(1, sizeof *tok);
    char *data = NULL;
    int64_t len = 0;
    int err, rc = -1;
    bool tj = false;
    if (!tok) lfail(&L, "out of memory");
    else if (read_file(&L, path, &data, &len, &err) == 0) {
        const unsigned char *d = (const unsigned char *)data;
        if (len == 0) lfail(&L, "\"%s\": the file is empty (0 bytes)", path);
        else if (is_bin(path, d, len)) rc = load_bin(&L, tok, d, len);
        else if (!looks_json(d, len))
            lfail(&L, "\"%s\": neither JSON (it starts with byte 0x%02X, not '{') nor llm.c's "
                  "gpt2_tokenizer.bin (its magic number would be %u, not %u)", path, d[0],
                  le32(d), BIN_MAGIC);
        else if (parse_json(&L, data, len, &tj) == 0 && (tj || read_merges_beside(&L) == 0))
            rc = build(&L, tok);
    }
    free(data);
    if (rc == 0 && !(tok->path = strdup(path))) rc = lfail(&L, "out of memory");
    loader_free(&L);
    if (rc == 0) return tok;
    nb_tokenizer_free(tok);
    return nn_error("%s: %s", FN, L.msg);
}
