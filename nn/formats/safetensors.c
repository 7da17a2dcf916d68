/* safetensors.c: the header of a safetensors file, written and parsed.
 *
 * The header is JSON:
 *   {"__metadata__": {"format": "pt"},
 *    "<name>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...}
 * padded with spaces to a multiple of 8. Parsing (through nn/formats/json.c, the
 * reader the tokenizer's files use too) checks everything that can
 * be checked without the registry: syntax (integers without leading zeros,
 * as JSON writes them), known dtypes, at most NB_MAX_DIMS dims, sizes that
 * fit int64, unique names (looked up in a hash index, not scanned: headers
 * may hold a million names), no field or __metadata__ given twice (readers
 * would disagree on which counts), and data_offsets that match the
 * sizes and tile the data section exactly (no holes, no overlaps, nothing
 * past the end: the reference implementation's rules). */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_internal.h"
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

/* The header for items laid out one after another, padded to 8 bytes;
 * __metadata__ holds "format": "pt", then the n_meta pairs of meta. */
static int build_header(strbuf *b, const nn_st_item *v, int n, const char *const *meta,
                        int n_meta) {
    puts_(b, "{\"__metadata__\":{\"format\":\"pt\"");
    for (int i = 0; i < n_meta; i++) {
        puts_(b, ",");
        put_json_string(b, meta[2 * i]);
        puts_(b, ":");
        put_json_string(b, meta[2 * i + 1]);
    }
    puts_(b, "}");
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
/* The JSON cursor (nn/formats/json.c) and what the header's checks keep; errors set
 * j.msg and stop everything. */
typedef struct {
    nn_json j;
    bool metadata; /* __metadata__ seen */
    bool any_dtype; /* foreign dtypes accepted (nn_st_header_parse_any) */
} reader;

/* A problem of the header's meaning (no byte offset: JSON's own problems
 * have theirs, from nn_json_fail). The first problem stays. */
static int fail(reader *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(reader *r, const char *fmt, ...) {
    if (r->j.msg[0]) return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->j.msg, sizeof r->j.msg, fmt, ap);
    va_end(ap);
    return -1;
}

/* [a, b, ...] of up to max integers in [0, 2^63-1]; *n gets the count. */
static int parse_uint_array(reader *r, uint64_t *v, int max, int *n, const char *what) {
    *n = 0;
    int more = nn_json_open(&r->j, '[');
    while (more == 1) {
        if (*n == max) return fail(r, "%s has more than %d entries", what, max);
        int64_t x;
        if (nn_json_int(&r->j, 0, INT64_MAX, &x)) return -1;
        v[(*n)++] = (uint64_t)x;
        more = nn_json_more(&r->j, ']');
    }
    return more;
}

/* Calls field(r, ctx) for each member of an object, its key in r->j.s;
 * field parses the value (and may use the key only before that). */
static int parse_object(reader *r, int (*field)(reader *, void *), void *ctx) {
    int more = nn_json_open(&r->j, '{');
    while (more == 1) {
        if (nn_json_string(&r->j) || nn_json_expect(&r->j, ':') || field(r, ctx)) return -1;
        more = nn_json_more(&r->j, '}');
    }
    return more;
}

/* __metadata__: string values only, as the format says; kept in h->meta. */
static int metadata_field(reader *r, void *ctx) {
    nn_st_header *h = ctx;
    if (nn_json_peek(&r->j) != '"') return fail(r, "__metadata__ values must be strings");
    char *key = strdup(r->j.s);
    if (!key) return fail(r, "out of memory");
    if (nn_json_string(&r->j)) return free(key), -1;
    char **more = realloc(h->meta, (size_t)(h->n_meta + 1) * 2 * sizeof *more);
    char *value = more ? strdup(r->j.s) : NULL;
    if (more) h->meta = more;
    if (!value) return free(key), fail(r, "out of memory");
    h->meta[2 * h->n_meta] = key;
    h->meta[2 * h->n_meta + 1] = value;
    h->n_meta++;
    return 0;
}

const char *nn_st_header_meta(const nn_st_header *h, const char *key) {
    for (int i = 0; i < h->n_meta; i++)
        if (!strcmp(h->meta[2 * i], key)) return h->meta[2 * i + 1];
    return NULL;
}

typedef struct {
    nn_st_item it;
    unsigned seen; /* bit 0 dtype, 1 shape, 2 data_offsets */
} tensor_ctx;

static int parse_dtype(reader *r, tensor_ctx *t) {
    if (nn_json_string(&r->j)) return -1;
    const char *s = r->j.s;
    size_t k = 0, nd = sizeof dtypes / sizeof *dtypes, nf = sizeof foreign_dtypes /
                                                            sizeof *foreign_dtypes;
    while (k < nd && strcmp(dtypes[k].name, s)) k++;
    if (k < nd) {
        t->it.dtype = dtypes[k].dtype;
        return 0;
    }
    size_t f = 0;
    while (r->any_dtype && f < nf && strcmp(foreign_dtypes[f].name, s)) f++;
    if (!r->any_dtype || f == nf)
        return fail(r, "unsupported dtype \"%.40s\" (nabla reads F32, F64, BF16, I64, BOOL)", s);
    t->it.dtype = NN_ST_FOREIGN;
    t->it.foreign = foreign_dtypes[f].name;
    return 0;
}

static int tensor_field(reader *r, void *ctx) {
    tensor_ctx *t = ctx;
    const char *key = r->j.s;
    unsigned bit = !strcmp(key, "dtype") ? 1 : !strcmp(key, "shape") ? 2
                 : !strcmp(key, "data_offsets") ? 4 : 0;
    if (!bit) return fail(r, "unknown field \"%.40s\"", key);
    if (t->seen & bit) /* which one would count is a guess: refuse */
        return fail(r, "field \"%s\" appears twice", key);
    t->seen |= bit;
    if (bit == 1) return parse_dtype(r, t);
    uint64_t v[NB_MAX_DIMS];
    if (bit == 2) {
        if (parse_uint_array(r, v, NB_MAX_DIMS, &t->it.ndim, "shape")) return -1;
        for (int d = 0; d < t->it.ndim; d++) t->it.shape[d] = (int64_t)v[d];
        return 0;
    }
    int n = 0;
    if (parse_uint_array(r, v, 2, &n, "data_offsets")) return -1;
    if (n != 2) return fail(r, "data_offsets must be [begin, end]");
    t->it.begin = v[0];
    t->it.end = v[1];
    return 0;
}

void nn_st_header_free(nn_st_header *h) {
    for (int i = 0; i < h->n; i++) free(h->names[i]);
    for (int i = 0; i < 2 * h->n_meta; i++) free(h->meta[i]);
    free(h->meta);
    free(h->names);
    free(h->v);
    nn_index_free(&h->index);
}

int nn_st_header_find(const nn_st_header *h, const char *name) {
    return nn_index_get(&h->index, name);
}

/* Room for one more entry in h. */
static int header_grow(reader *r, nn_st_header *h) {
    if (nn_index_reserve(&h->index, (size_t)h->n + 1) != 0) return fail(r, "out of memory");
    if (h->n < h->cap) return 0;
    int cap = h->cap ? 2 * h->cap : 16;
    nn_st_item *v = realloc(h->v, (size_t)cap * sizeof *v);
    if (v) h->v = v;
    char **nm = v ? realloc(h->names, (size_t)cap * sizeof *nm) : NULL;
    if (!nm) return fail(r, "out of memory");
    h->names = nm;
    h->cap = cap;
    return 0;
}

/* "<name>": {...} or "__metadata__": {...}, the key in r->j.s. */
static int top_field(reader *r, void *ctx) {
    nn_st_header *h = ctx;
    if (!strcmp(r->j.s, "__metadata__")) {
        if (r->metadata) return fail(r, "__metadata__ appears twice");
        r->metadata = true;
        return parse_object(r, metadata_field, h);
    }
    if (nn_index_get(&h->index, r->j.s) >= 0)
        return fail(r, "tensor \"%.200s\" appears twice", r->j.s);
    /* the name is kept before the entry's own strings overwrite r->j.s */
    char *name = malloc(r->j.s_len + 1);
    if (!name) return fail(r, "out of memory");
    memcpy(name, r->j.s, r->j.s_len + 1);
    tensor_ctx t = {.it.name = name};
    char inner[sizeof r->j.msg];
    if (parse_object(r, tensor_field, &t)) {
        snprintf(inner, sizeof inner, "%s", r->j.msg);
        r->j.msg[0] = 0;
        fail(r, "tensor \"%.100s\": %.200s", name, inner);
    } else if (t.seen != 7) {
        fail(r, "tensor \"%.200s\" lacks %s", name,
             !(t.seen & 1) ? "dtype" : !(t.seen & 2) ? "shape" : "data_offsets");
    }
    if (r->j.msg[0] || header_grow(r, h)) {
        free(name);
        return -1;
    }
    h->names[h->n] = name;
    nn_index_put(&h->index, name, h->n);
    h->v[h->n++] = t.it;
    return 0;
}

/* Sizes that fit int64 and data_offsets that match them. */
static int check_sizes(reader *r, const nn_st_item *it, uint64_t data_len) {
    uint64_t bytes = elem_size(it);
    bool zero = false;
    for (int d = 0; d < it->ndim; d++) zero |= it->shape[d] == 0;
    for (int d = 0; d < it->ndim && !zero; d++) {
        if (bytes > (uint64_t)INT64_MAX / (uint64_t)it->shape[d])
            return fail(r, "tensor \"%.200s\": its shape overflows 64-bit sizes", it->name);
        bytes *= (uint64_t)it->shape[d];
    }
    if (zero) bytes = 0;
    if (it->begin > it->end || it->end > data_len || it->end - it->begin != bytes)
        return fail(r, "tensor \"%.150s\": data_offsets [%llu, %llu] do not hold %llu bytes within "
                    "the %llu-byte data section", it->name, (unsigned long long)it->begin,
                    (unsigned long long)it->end, (unsigned long long)bytes,
                    (unsigned long long)data_len);
    return 0;
}

static int by_begin(const void *a, const void *b) {
    const nn_st_item *x = *(nn_st_item *const *)a, *y = *(nn_st_item *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* The tensors must tile [0, data_len) with no gap and no overlap. */
static int check_tiling(reader *r, nn_st_header *h, uint64_t data_len) {
    nn_st_item **order = malloc((size_t)(h->n > 0 ? h->n : 1) * sizeof *order);
    if (!order) return fail(r, "out of memory");
    for (int i = 0; i < h->n; i++) order[i] = &h->v[i];
    qsort(order, (size_t)h->n, sizeof *order, by_begin);
    uint64_t at = 0;
    for (int i = 0; i < h->n && !r->j.msg[0]; i++) {
        if (order[i]->begin != at)
            fail(r, "tensor \"%.150s\" starts at byte %llu of the data section, expected %llu "
                 "(tensors must not overlap or leave gaps)", order[i]->name,
                 (unsigned long long)order[i]->begin, (unsigned long long)at);
        at = order[i]->end;
    }
    free(order);
    if (!r->j.msg[0] && at != data_len)
        fail(r, "the data section has %llu bytes but the tensors cover %llu",
             (unsigned long long)data_len, (unsigned long long)at);
    return r->j.msg[0] ? -1 : 0;
}

static int parse_header(reader *r, nn_st_header *h, uint64_t data_len) {
    if (parse_object(r, top_field, h) || nn_json_end(&r->j)) return -1;
    for (int i = 0; i < h->n; i++)
        if (check_sizes(r, &h->v[i], data_len)) return -1;
    return check_tiling(r, h, data_len);
}

/* The whole file in memory (a regular file, at least the 8-byte size). */
char *nn_st_header_build(const nn_st_item *v, int n, size_t *len) {
    return nn_st_header_build_meta(v, n, NULL, 0, len);
}

char *nn_st_header_build_meta(const nn_st_item *v, int n, const char *const *meta, int n_meta,
                              size_t *len) {
    strbuf b = {0};
    if (build_header(&b, v, n, meta, n_meta) != 0) {
        free(b.p);
        return NULL;
    }
    *len = b.n;
    return b.p;
}

static int header_parse(const char *text, size_t len, uint64_t data_len, nn_st_header *h,
                        char *msg, size_t cap, bool any_dtype) {
    reader r = {.any_dtype = any_dtype};
    nn_json_init(&r.j, text, len, "header");
    int rc = parse_header(&r, h, data_len);
    if (rc) snprintf(msg, cap, "%s", r.j.msg[0] ? r.j.msg : "out of memory");
    nn_json_free(&r.j);
    return rc;
}

int nn_st_header_parse(const char *text, size_t len, uint64_t data_len, nn_st_header *h,
                       char *msg, size_t cap) {
    return header_parse(text, len, data_len, h, msg, cap, false);
}

int nn_st_header_parse_any(const char *text, size_t len, uint64_t data_len, nn_st_header *h,
                           char *msg, size_t cap) {
    return header_parse(text, len, data_len, h, msg, cap, true);
}
