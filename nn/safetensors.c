/* safetensors.c: the header of a safetensors file, written and parsed.
 *
 * The header is JSON:
 *   {"__metadata__": {"format": "pt"},
 *    "<name>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...}
 * padded with spaces to a multiple of 8. Parsing checks everything that can
 * be checked without the registry: syntax (integers without leading zeros,
 * as JSON writes them), known dtypes, at most NB_MAX_DIMS dims, sizes that
 * fit int64, unique names (looked up in a hash index, not scanned: headers
 * may hold a million names), no field or __metadata__ given twice (readers
 * would disagree on which counts), and data_offsets that match the
 * sizes and tile the data section exactly (no holes, no overlaps, nothing
 * past the end: the reference implementation's rules). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "safetensors_internal.h"

static const struct {
    const char *name;
    nb_dtype dtype;
    size_t size;
} dtypes[] = {{"F32", NB_F32, 4}, {"F64", NB_F64, 8}, {"I64", NB_I64, 8}, {"BOOL", NB_BOOL, 1},
                {"BF16", NB_BF16, 2}};

/* The format's other dtypes: read (and skipped) only by nn_st_header_parse_any. */
static const struct {
    const char *name;
    size_t size;
} foreign_dtypes[] = {{"F16", 2}, {"I8", 1}, {"U8", 1}, {"I16", 2}, {"U16", 2},
                      {"I32", 4}, {"U32", 4}, {"U64", 8}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};

static size_t foreign_size(const char *tag) {
    for (size_t i = 0; i < sizeof foreign_dtypes / sizeof *foreign_dtypes; i++)
        if (!strcmp(foreign_dtypes[i].name, tag)) return foreign_dtypes[i].size;
    return 0;
}

/* Bytes per element of an item (foreign dtypes included). */
static size_t elem_size(const nn_st_item *it) {
    return it->foreign ? foreign_size(it->foreign) : nn_st_dtype_size(it->dtype);
}

size_t nn_st_dtype_size(nb_dtype d) {
    for (size_t i = 0; i < sizeof dtypes / sizeof *dtypes; i++)
        if (dtypes[i].dtype == d) return dtypes[i].size;
    return 0;
}

const char *nn_st_dtype_tag(nb_dtype d) {
    for (size_t i = 0; i < sizeof dtypes / sizeof *dtypes; i++)
        if (dtypes[i].dtype == d) return dtypes[i].name;
    return "?";
}

bool nn_st_little_endian(void) {
    const uint16_t one = 1;
    return *(const unsigned char *)&one == 1;
}

/* Copies n elements of `size` bytes, reversing each element's bytes on a
 * big-endian host: file order and memory order are then both correct. */
void nn_st_copy_le(void *dst, const void *src, size_t n, size_t size) {
    if (nn_st_little_endian() || size == 1) {
        memcpy(dst, src, n * size);
        return;
    }
    unsigned char *d = dst;
    const unsigned char *s = src;
    for (size_t i = 0; i < n; i++)
        for (size_t b = 0; b < size; b++) d[i * size + b] = s[i * size + size - 1 - b];
}

static uint64_t item_bytes(const nn_st_item *it) {
    uint64_t n = elem_size(it);
    for (int d = 0; d < it->ndim; d++) n *= (uint64_t)it->shape[d];
    return n;
}

/* ------------------------------------------------------------------ writing */
typedef struct {
    char *p;
    size_t n, cap;
    bool oom;
} strbuf;

static void put(strbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void puts_(strbuf *b, const char *s) { put(b, s, strlen(s)); }

static void put_u64(strbuf *b, uint64_t v) {
    char tmp[24];
    snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)v);
    puts_(b, tmp);
}

/* A JSON string: quotes, backslashes and control characters escaped. */
static void put_json_string(strbuf *b, const char *s) {
    put(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            put(b, e, 2);
        } else if (c < 0x20) {
            char e[8];
            snprintf(e, sizeof e, "\\u%04x", c);
            puts_(b, e);
        } else {
            put(b, (const char *)&c, 1);
        }
    }
    put(b, "\"", 1);
}

/* The header for items laid out one after another, padded to 8 bytes. */
static int build_header(strbuf *b, const nn_st_item *v, int n) {
    puts_(b, "{\"__metadata__\":{\"format\":\"pt\"}");
    uint64_t at = 0;
    for (int i = 0; i < n; i++) {
        puts_(b, ",");
        put_json_string(b, v[i].name);
        puts_(b, ":{\"dtype\":\"");
        puts_(b, nn_st_dtype_tag(v[i].dtype));
        puts_(b, "\",\"shape\":[");
        for (int d = 0; d < v[i].ndim; d++) {
            if (d) puts_(b, ",");
            put_u64(b, (uint64_t)v[i].shape[d]);
        }
        puts_(b, "],\"data_offsets\":[");
        put_u64(b, at);
        puts_(b, ",");
        at += item_bytes(&v[i]);
        put_u64(b, at);
        puts_(b, "]}");
    }
    puts_(b, "}");
    while (!b->oom && b->n % 8) puts_(b, " ");
    return b->oom ? -1 : 0;
}

/* ------------------------------------------------------------------ parsing */
/* A cursor over the JSON nn_st_header; errors set msg and stop everything. */
typedef struct {
    const char *start, *p, *end;
    char msg[320];
    bool metadata; /* __metadata__ seen */
    bool any_dtype; /* foreign dtypes accepted (nn_st_header_parse_any) */
} json;

static int fail(json *j, const char *what) {
    if (!j->msg[0]) snprintf(j->msg, sizeof j->msg, "%s", what);
    return -1;
}

static void skip_ws(json *j) {
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
        j->p++;
}

static int expect(json *j, char c) {
    skip_ws(j);
    if (j->p >= j->end || *j->p != c) {
        char m[64];
        snprintf(m, sizeof m, "expected '%c' at byte %ld of the header", c, (long)(j->p - j->start));
        return fail(j, m);
    }
    j->p++;
    return 0;
}

static int hex4(json *j, unsigned *out) {
    if (j->end - j->p < 4) return fail(j, "a \\u escape is cut short");
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = *j->p++;
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
        else return fail(j, "a \\u escape has a non-hex digit");
    }
    *out = v;
    return 0;
}

static void put_utf8(strbuf *b, unsigned cp) {
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
    put(b, u, n);
}

/* A JSON string into *out (malloc'ed, NUL-terminated; NUL inside refused). */
static int parse_string(json *j, char **out) {
    if (expect(j, '"')) return -1;
    strbuf b = {0};
    put(&b, "", 0);
    while (j->p < j->end && *j->p != '"') {
        unsigned char c = (unsigned char)*j->p++;
        if (c < 0x20) {
            free(b.p);
            return fail(j, "a string holds a raw control character");
        }
        if (c != '\\') {
            put(&b, (const char *)&c, 1);
            continue;
        }
        if (j->p >= j->end) break;
        char e = *j->p++;
        const char *plain = strchr("\"\\/bfnrt", e);
        if (plain && e) {
            put(&b, &"\"\\/\b\f\n\r\t"[plain - "\"\\/bfnrt"], 1);
            continue;
        }
        unsigned cp, lo;
        if (e != 'u' || hex4(j, &cp)) {
            free(b.p);
            return fail(j, "a string has an invalid escape");
        }
        if (cp >= 0xD800 && cp < 0xDC00) { /* a surrogate pair */
            if (j->end - j->p < 6 || j->p[0] != '\\' || j->p[1] != 'u' || (j->p += 2, hex4(j, &lo)) ||
                lo < 0xDC00 || lo >= 0xE000) {
                free(b.p);
                return fail(j, "a string has an unpaired surrogate escape");
            }
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        } else if ((cp >= 0xDC00 && cp < 0xE000) || cp == 0) {
            free(b.p);
            return fail(j, cp ? "a string has an unpaired surrogate escape"
                              : "a string holds \\u0000");
        }
        put_utf8(&b, cp);
    }
    if (j->p >= j->end || b.oom) {
        free(b.p);
        return fail(j, b.oom ? "out of memory" : "a string is not terminated");
    }
    j->p++;
    *out = b.p;
    return 0;
}

/* A non-negative integer that fits int64 (all the header's numbers). */
static int parse_uint(json *j, uint64_t *out) {
    skip_ws(j);
    if (j->p >= j->end || *j->p < '0' || *j->p > '9')
        return fail(j, "expected a non-negative integer");
    if (*j->p == '0' && j->end - j->p > 1 && j->p[1] >= '0' && j->p[1] <= '9')
        return fail(j, "an integer has a leading zero (not JSON)");
    uint64_t v = 0;
    while (j->p < j->end && *j->p >= '0' && *j->p <= '9') {
        unsigned d = (unsigned)(*j->p++ - '0');
        if (v > ((uint64_t)INT64_MAX - d) / 10) return fail(j, "an integer is larger than 2^63-1");
        v = v * 10 + d;
    }
    if (j->p < j->end && (*j->p == '.' || *j->p == 'e' || *j->p == 'E'))
        return fail(j, "expected an integer, found a fraction or exponent");
    *out = v;
    return 0;
}

/* [a, b, ...] of up to max integers; *n gets the count. */
static int parse_uint_array(json *j, uint64_t *v, int max, int *n, const char *what) {
    if (expect(j, '[')) return -1;
    *n = 0;
    skip_ws(j);
    if (j->p < j->end && *j->p == ']') return j->p++, 0;
    for (;;) {
        if (*n == max) {
            char m[96];
            snprintf(m, sizeof m, "%s has more than %d entries", what, max);
            return fail(j, m);
        }
        if (parse_uint(j, &v[(*n)++])) return -1;
        skip_ws(j);
        if (j->p < j->end && *j->p == ',') {
            j->p++;
            continue;
        }
        return expect(j, ']');
    }
}

/* Calls field(j, key, ctx) for each member of an object; field parses the value. */
static int parse_object(json *j, int (*field)(json *, const char *, void *), void *ctx) {
    if (expect(j, '{')) return -1;
    skip_ws(j);
    if (j->p < j->end && *j->p == '}') return j->p++, 0;
    for (;;) {
        char *key = NULL;
        if (parse_string(j, &key) || expect(j, ':')) {
            free(key);
            return -1;
        }
        int rc = field(j, key, ctx);
        free(key);
        if (rc) return -1;
        skip_ws(j);
        if (j->p < j->end && *j->p == ',') {
            j->p++;
            continue;
        }
        return expect(j, '}');
    }
}

/* __metadata__: string values only, as the format says; kept for nothing. */
static int metadata_field(json *j, const char *key, void *ctx) {
    (void)key, (void)ctx;
    skip_ws(j);
    if (j->p >= j->end || *j->p != '"') return fail(j, "__metadata__ values must be strings");
    char *s = NULL;
    int rc = parse_string(j, &s);
    free(s);
    return rc;
}

typedef struct {
    nn_st_item it;
    unsigned seen; /* bit 0 dtype, 1 shape, 2 data_offsets */
} tensor_ctx;

static int tensor_field(json *j, const char *key, void *ctx) {
    tensor_ctx *t = ctx;
    char m[160];
    unsigned bit = !strcmp(key, "dtype") ? 1 : !strcmp(key, "shape") ? 2
                 : !strcmp(key, "data_offsets") ? 4 : 0;
    if (t->seen & bit) { /* which one would count is a guess: refuse */
        snprintf(m, sizeof m, "field \"%s\" appears twice", key);
        return fail(j, m);
    }
    if (!strcmp(key, "dtype")) {
        char *s = NULL;
        if (parse_string(j, &s)) return -1;
        size_t k = 0, nd = sizeof dtypes / sizeof *dtypes, nf = sizeof foreign_dtypes /
                                                                sizeof *foreign_dtypes;
        while (k < nd && strcmp(dtypes[k].name, s)) k++;
        size_t f = 0;
        while (k == nd && j->any_dtype && f < nf && strcmp(foreign_dtypes[f].name, s)) f++;
        if (k == nd && j->any_dtype && f < nf) {
            free(s);
            t->it.dtype = NN_ST_FOREIGN;
            t->it.foreign = foreign_dtypes[f].name;
            t->seen |= 1;
            return 0;
        }
        if (k == nd) {
            snprintf(m, sizeof m, "unsupported dtype \"%.40s\" (nabla reads F32, F64, BF16, I64, BOOL)",
                     s);
            free(s);
            return fail(j, m);
        }
        free(s);
        t->it.dtype = dtypes[k].dtype;
        t->seen |= 1;
    } else if (!strcmp(key, "shape")) {
        uint64_t v[NB_MAX_DIMS];
        if (parse_uint_array(j, v, NB_MAX_DIMS, &t->it.ndim, "shape")) return -1;
        for (int d = 0; d < t->it.ndim; d++) t->it.shape[d] = (int64_t)v[d];
        t->seen |= 2;
    } else if (!strcmp(key, "data_offsets")) {
        uint64_t v[2];
        int n = 0;
        if (parse_uint_array(j, v, 2, &n, "data_offsets")) return -1;
        if (n != 2) return fail(j, "data_offsets must be [begin, end]");
        t->it.begin = v[0];
        t->it.end = v[1];
        t->seen |= 4;
    } else {
        snprintf(m, sizeof m, "unknown field \"%.40s\"", key);
        return fail(j, m);
    }
    return 0;
}

void nn_st_header_free(nn_st_header *h) {
    for (int i = 0; i < h->n; i++) free(h->names[i]);
    free(h->names);
    free(h->v);
    nn_index_free(&h->index);
}

int nn_st_header_find(const nn_st_header *h, const char *name) {
    return nn_index_get(&h->index, name);
}

static int top_field(json *j, const char *key, void *ctx) {
    nn_st_header *h = ctx;
    char m[320];
    if (!strcmp(key, "__metadata__")) {
        if (j->metadata) return fail(j, "__metadata__ appears twice");
        j->metadata = true;
        return parse_object(j, metadata_field, NULL);
    }
    if (nn_index_get(&h->index, key) >= 0) {
        snprintf(m, sizeof m, "tensor \"%.200s\" appears twice", key);
        return fail(j, m);
    }
    tensor_ctx t = {0};
    if (parse_object(j, tensor_field, &t)) {
        snprintf(m, sizeof m, "tensor \"%.100s\": %.200s", key, j->msg);
        j->msg[0] = 0;
        return fail(j, m);
    }
    if (t.seen != 7) {
        snprintf(m, sizeof m, "tensor \"%.200s\" lacks %s", key,
                 !(t.seen & 1) ? "dtype" : !(t.seen & 2) ? "shape" : "data_offsets");
        return fail(j, m);
    }
    if (nn_index_reserve(&h->index, (size_t)h->n + 1) != 0) return fail(j, "out of memory");
    if (h->n == h->cap) {
        int cap = h->cap ? 2 * h->cap : 16;
        nn_st_item *v = realloc(h->v, (size_t)cap * sizeof *v);
        if (v) h->v = v;
        char **nm = v ? realloc(h->names, (size_t)cap * sizeof *nm) : NULL;
        if (!nm) return fail(j, "out of memory");
        h->names = nm;
        h->cap = cap;
    }
    size_t len = strlen(key);
    if (!(h->names[h->n] = malloc(len + 1))) return fail(j, "out of memory");
    memcpy(h->names[h->n], key, len + 1);
    t.it.name = h->names[h->n];
    nn_index_put(&h->index, t.it.name, h->n);
    h->v[h->n++] = t.it;
    return 0;
}

/* Sizes that fit int64 and data_offsets that match them. */
static int check_sizes(json *j, const nn_st_item *it, uint64_t data_len) {
    char m[320];
    uint64_t bytes = elem_size(it);
    bool zero = false;
    for (int d = 0; d < it->ndim; d++) zero |= it->shape[d] == 0;
    for (int d = 0; d < it->ndim && !zero; d++) {
        if (bytes > (uint64_t)INT64_MAX / (uint64_t)it->shape[d]) {
            snprintf(m, sizeof m, "tensor \"%.200s\": its shape overflows 64-bit sizes", it->name);
            return fail(j, m);
        }
        bytes *= (uint64_t)it->shape[d];
    }
    if (zero) bytes = 0;
    if (it->begin > it->end || it->end > data_len || it->end - it->begin != bytes) {
        snprintf(m, sizeof m,
                 "tensor \"%.150s\": data_offsets [%llu, %llu] do not hold %llu bytes within "
                 "the %llu-byte data section", it->name, (unsigned long long)it->begin,
                 (unsigned long long)it->end, (unsigned long long)bytes,
                 (unsigned long long)data_len);
        return fail(j, m);
    }
    return 0;
}

static int by_begin(const void *a, const void *b) {
    const nn_st_item *x = *(nn_st_item *const *)a, *y = *(nn_st_item *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* The tensors must tile [0, data_len) with no gap and no overlap. */
static int check_tiling(json *j, nn_st_header *h, uint64_t data_len) {
    nn_st_item **order = malloc((size_t)(h->n > 0 ? h->n : 1) * sizeof *order);
    if (!order) return fail(j, "out of memory");
    for (int i = 0; i < h->n; i++) order[i] = &h->v[i];
    qsort(order, (size_t)h->n, sizeof *order, by_begin);
    uint64_t at = 0;
    char m[320];
    for (int i = 0; i < h->n && !j->msg[0]; i++) {
        if (order[i]->begin != at) {
            snprintf(m, sizeof m, "tensor \"%.150s\" starts at byte %llu of the data section, "
                     "expected %llu (tensors must not overlap or leave gaps)", order[i]->name,
                     (unsigned long long)order[i]->begin, (unsigned long long)at);
            fail(j, m);
        }
        at = order[i]->end;
    }
    free(order);
    if (!j->msg[0] && at != data_len) {
        snprintf(m, sizeof m, "the data section has %llu bytes but the tensors cover %llu",
                 (unsigned long long)data_len, (unsigned long long)at);
        fail(j, m);
    }
    return j->msg[0] ? -1 : 0;
}

static int parse_header(json *j, nn_st_header *h, uint64_t data_len) {
    skip_ws(j);
    if (parse_object(j, top_field, h)) return -1;
    skip_ws(j);
    if (j->p != j->end) return fail(j, "the header has bytes after its JSON object");
    for (int i = 0; i < h->n; i++)
        if (check_sizes(j, &h->v[i], data_len)) return -1;
    return check_tiling(j, h, data_len);
}

/* The whole file in memory (a regular file, at least the 8-byte size). */
char *nn_st_header_build(const nn_st_item *v, int n, size_t *len) {
    strbuf b = {0};
    if (build_header(&b, v, n) != 0) {
        free(b.p);
        return NULL;
    }
    *len = b.n;
    return b.p;
}

static int header_parse(const char *text, size_t len, uint64_t data_len, nn_st_header *h,
                        char *msg, size_t cap, bool any_dtype) {
    json j = {.start = text, .p = text, .end = text + len, .msg = "", .any_dtype = any_dtype};
    if (parse_header(&j, h, data_len) == 0) return 0;
    snprintf(msg, cap, "%s", j.msg);
    return -1;
}

int nn_st_header_parse(const char *text, size_t len, uint64_t data_len, nn_st_header *h,
                       char *msg, size_t cap) {
    return header_parse(text, len, data_len, h, msg, cap, false);
}

int nn_st_header_parse_any(const char *text, size_t len, uint64_t data_len, nn_st_header *h,
                           char *msg, size_t cap) {
    return header_parse(text, len, data_len, h, msg, cap, true);
}
