/* checkpoint.c: nb_save and nb_load in the safetensors format.
 *
 * File layout: u64 little-endian N, then N bytes of JSON header
 *   {"__metadata__": {"format": "pt"},
 *    "<name>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...}
 * padded with spaces to a multiple of 8, then the data section: each tensor
 * row-major, little-endian, at [begin, end) of the section.
 *
 * Loading is all-or-nothing: the whole file is read and every check is made
 * (header syntax, dtypes, shapes, offsets that tile the data section exactly,
 * names against the registry) before the first tensor is written. The rules
 * on offsets are those of the reference implementation: no holes, no
 * overlaps, nothing past the end. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "nn_internal.h"

#define MAX_HEADER (100u << 20) /* bytes of JSON, as the reference implementation */

static const struct {
    const char *name;
    nb_dtype dtype;
    size_t size;
} dtypes[] = {{"F32", NB_F32, 4}, {"F64", NB_F64, 8}, {"I64", NB_I64, 8}, {"BOOL", NB_BOOL, 1}};

static size_t dtype_size(nb_dtype d) {
    for (size_t i = 0; i < sizeof dtypes / sizeof *dtypes; i++)
        if (dtypes[i].dtype == d) return dtypes[i].size;
    return 0;
}

static const char *dtype_tag(nb_dtype d) {
    for (size_t i = 0; i < sizeof dtypes / sizeof *dtypes; i++)
        if (dtypes[i].dtype == d) return dtypes[i].name;
    return "?";
}

static bool little_endian(void) {
    const uint16_t one = 1;
    return *(const unsigned char *)&one == 1;
}

/* Copies n elements of `size` bytes, reversing each element's bytes on a
 * big-endian host: file order and memory order are then both correct. */
static void copy_le(void *dst, const void *src, size_t n, size_t size) {
    if (little_endian() || size == 1) {
        memcpy(dst, src, n * size);
        return;
    }
    unsigned char *d = dst;
    const unsigned char *s = src;
    for (size_t i = 0; i < n; i++)
        for (size_t b = 0; b < size; b++) d[i * size + b] = s[i * size + size - 1 - b];
}

/* ------------------------------------------------------------------ entries
 * Every tensor of a registry (parameters, then buffers), or of a file. */
typedef struct {
    const char *name; /* the registry's, or points into the parsed header */
    nb_tensor *t;     /* registry side */
    nb_dtype dtype;
    int ndim;
    int64_t shape[NB_MAX_DIMS];
    uint64_t begin, end; /* file side: data_offsets */
} item;

static int registry_items(const nb_params *ps, item **out) {
    int np = nb_params_count(ps), nbuf = nb_params_buffer_count(ps), n = np + nbuf;
    item *v = calloc((size_t)(n ? n : 1), sizeof *v);
    if (!v) return -1;
    for (int i = 0; i < n; i++) {
        nb_tensor *t = i < np ? nb_params_at(ps, i, &v[i].name)
                              : nb_params_buffer_at(ps, i - np, &v[i].name);
        v[i].t = t;
        v[i].dtype = nb_dtype_of(t);
        v[i].ndim = nb_ndim(t);
        memcpy(v[i].shape, nb_shape(t), (size_t)v[i].ndim * sizeof(int64_t));
    }
    *out = v;
    return n;
}

static uint64_t item_bytes(const item *it) {
    uint64_t n = dtype_size(it->dtype);
    for (int d = 0; d < it->ndim; d++) n *= (uint64_t)it->shape[d];
    return n;
}

/* =================================================================== save */
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
static int build_header(strbuf *b, const item *v, int n) {
    puts_(b, "{\"__metadata__\":{\"format\":\"pt\"}");
    uint64_t at = 0;
    for (int i = 0; i < n; i++) {
        puts_(b, ",");
        put_json_string(b, v[i].name);
        puts_(b, ":{\"dtype\":\"");
        puts_(b, dtype_tag(v[i].dtype));
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

static int write_all(int fd, const void *p, size_t n) {
    const char *c = p;
    while (n > 0) {
        ssize_t w = write(fd, c, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

/* One tensor's values, contiguous and little-endian, in chunks. */
static int write_tensor(int fd, nb_tensor *t) {
    nb_scope_begin();
    nb_tensor *c = nb_contiguous(t);
    int rc = -1;
    if (c) {
        size_t size = dtype_size(nb_dtype_of(c)), n = (size_t)nb_numel(c);
        const unsigned char *src = nb_data(c);
        if (little_endian() || size == 1) {
            rc = write_all(fd, src, n * size);
        } else {
            unsigned char chunk[1 << 16];
            size_t per = sizeof chunk / size;
            rc = 0;
            for (size_t i = 0; i < n && rc == 0; i += per) {
                size_t k = n - i < per ? n - i : per;
                copy_le(chunk, src + i * size, k, size);
                rc = write_all(fd, chunk, k * size);
            }
        }
        if (rc != 0 && errno == 0) errno = EIO;
    }
    nb_scope_end();
    return rc;
}

/* A fresh file next to path: path.tmp-<pid>-<n>, created exclusively. */
static int open_temp(const char *path, char **tmp_out) {
    size_t len = strlen(path) + 64;
    char *tmp = malloc(len);
    if (!tmp) return -1;
    static _Atomic unsigned counter;
    for (int attempt = 0; attempt < 100; attempt++) {
        snprintf(tmp, len, "%s.tmp-%ld-%u", path, (long)getpid(), counter++);
        int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd >= 0) {
            *tmp_out = tmp;
            return fd;
        }
        if (errno != EEXIST) break;
    }
    free(tmp);
    return -1;
}

/* The directory entry made by rename survives a crash only once the
 * directory itself is synced; a failure here is not worth failing the save. */
static void sync_parent_dir(const char *path) {
    const char *slash = strrchr(path, '/');
    char dir[4096] = ".";
    if (slash && (size_t)(slash - path) < sizeof dir) {
        size_t n = slash == path ? 1 : (size_t)(slash - path);
        memcpy(dir, path, n);
        dir[n] = 0;
    }
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
}

int nb_save(const nb_params *ps, const char *path) {
    const char *fn = "nb_save";
    if (!ps || !path) return nn_error("%s: %s is NULL", fn, ps ? "path" : "registry"), -1;
    item *v = NULL;
    int n = registry_items(ps, &v);
    strbuf h = {0};
    if (n < 0 || build_header(&h, v, n) != 0) {
        free(v);
        free(h.p);
        return nn_error("%s: out of memory", fn), -1;
    }
    char *tmp = NULL;
    int fd = open_temp(path, &tmp);
    if (fd < 0) {
        int e = errno;
        free(v);
        free(h.p);
        return nn_error("%s: cannot create a file next to \"%s\": %s", fn, path, strerror(e)), -1;
    }
    unsigned char len[8];
    copy_le(len, &(uint64_t){h.n}, 1, 8);
    errno = 0;
    int rc = write_all(fd, len, 8) || write_all(fd, h.p, h.n) ? -1 : 0;
    for (int i = 0; i < n && rc == 0; i++) rc = write_tensor(fd, v[i].t);
    if (rc == 0 && fsync(fd) != 0) rc = -1;
    int e = errno;
    if (close(fd) != 0 && rc == 0) rc = -1, e = errno;
    if (rc == 0 && rename(tmp, path) != 0) rc = -1, e = errno;
    if (rc == 0) {
        sync_parent_dir(path);
    } else {
        unlink(tmp);
        nn_error("%s: cannot write \"%s\": %s (the previous file, if any, is unchanged)", fn,
                 path, e ? strerror(e) : "a tensor could not be read");
    }
    free(tmp);
    free(v);
    free(h.p);
    return rc;
}

/* =================================================================== load */
/* A cursor over the JSON header; errors set msg and stop everything. */
typedef struct {
    const char *start, *p, *end;
    char msg[320];
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
    item it;
    unsigned seen; /* bit 0 dtype, 1 shape, 2 data_offsets */
} tensor_ctx;

static int tensor_field(json *j, const char *key, void *ctx) {
    tensor_ctx *t = ctx;
    char m[160];
    if (!strcmp(key, "dtype")) {
        char *s = NULL;
        if (parse_string(j, &s)) return -1;
        size_t k = 0, nd = sizeof dtypes / sizeof *dtypes;
        while (k < nd && strcmp(dtypes[k].name, s)) k++;
        if (k == nd) {
            snprintf(m, sizeof m, "unsupported dtype \"%.40s\" (nabla reads F32, F64, I64, BOOL)",
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

typedef struct {
    item *v;
    int n, cap;
    char **names; /* owned copies, one per item */
} header;

static void header_free(header *h) {
    for (int i = 0; i < h->n; i++) free(h->names[i]);
    free(h->names);
    free(h->v);
}

static int top_field(json *j, const char *key, void *ctx) {
    header *h = ctx;
    char m[320];
    if (!strcmp(key, "__metadata__")) return parse_object(j, metadata_field, NULL);
    for (int i = 0; i < h->n; i++)
        if (!strcmp(h->names[i], key)) {
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
    if (h->n == h->cap) {
        int cap = h->cap ? 2 * h->cap : 16;
        item *v = realloc(h->v, (size_t)cap * sizeof *v);
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
    h->v[h->n++] = t.it;
    return 0;
}

/* Sizes that fit int64 and data_offsets that match them. */
static int check_sizes(json *j, const item *it, uint64_t data_len) {
    char m[320];
    uint64_t bytes = dtype_size(it->dtype);
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
    const item *x = *(item *const *)a, *y = *(item *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* The tensors must tile [0, data_len) with no gap and no overlap. */
static int check_tiling(json *j, header *h, uint64_t data_len) {
    item **order = malloc((size_t)(h->n > 0 ? h->n : 1) * sizeof *order);
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

static int parse_header(json *j, header *h, uint64_t data_len) {
    skip_ws(j);
    if (parse_object(j, top_field, h)) return -1;
    skip_ws(j);
    if (j->p != j->end) return fail(j, "the header has bytes after its JSON object");
    for (int i = 0; i < h->n; i++)
        if (check_sizes(j, &h->v[i], data_len)) return -1;
    return check_tiling(j, h, data_len);
}

/* The whole file in memory (a regular file, at least the 8-byte size). */
static unsigned char *read_file(const char *path, uint64_t *size, char *msg, size_t cap) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        snprintf(msg, cap, "cannot open \"%s\": %s", path, strerror(errno));
        if (fd >= 0) close(fd);
        return NULL;
    }
    unsigned char *buf = NULL;
    if (!S_ISREG(st.st_mode)) {
        snprintf(msg, cap, "\"%s\" is not a regular file", path);
    } else if (st.st_size < 8) {
        snprintf(msg, cap, "\"%s\" has %lld bytes, too short for a safetensors file", path,
                 (long long)st.st_size);
    } else if ((uint64_t)st.st_size > SIZE_MAX || !(buf = malloc((size_t)st.st_size))) {
        snprintf(msg, cap, "\"%s\" (%lld bytes) does not fit in memory", path,
                 (long long)st.st_size);
    } else {
        size_t got = 0, want = (size_t)st.st_size;
        while (got < want) {
            ssize_t r = read(fd, buf + got, want - got);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) {
                snprintf(msg, cap, "cannot read \"%s\": %s", path,
                         r < 0 ? strerror(errno) : "the file shrank while being read");
                free(buf);
                buf = NULL;
                break;
            }
            got += (size_t)r;
        }
        *size = want;
    }
    close(fd);
    return buf;
}

static const item *find_item(const header *h, const char *name) {
    for (int i = 0; i < h->n; i++)
        if (!strcmp(h->v[i].name, name)) return &h->v[i];
    return NULL;
}

/* Registry against file: the first mismatch, in registry order, then names
 * the file has and the registry does not. */
static int match(const item *reg, int n, const header *h, char *msg, size_t cap) {
    char a[96], b[96];
    for (int i = 0; i < n; i++) {
        const item *f = find_item(h, reg[i].name);
        if (!f) {
            snprintf(msg, cap, "no tensor \"%.200s\" in the file (the registry has %d entries, "
                     "the file %d)", reg[i].name, n, h->n);
            return -1;
        }
        if (f->dtype != reg[i].dtype) {
            snprintf(msg, cap, "tensor \"%.200s\" is %s in the file but %s in the registry",
                     reg[i].name, dtype_tag(f->dtype), dtype_tag(reg[i].dtype));
            return -1;
        }
        bool same = f->ndim == reg[i].ndim;
        for (int d = 0; same && d < f->ndim; d++) same = f->shape[d] == reg[i].shape[d];
        if (!same) {
            snprintf(msg, cap, "tensor \"%.150s\" has shape %s in the file but %s in the "
                     "registry", reg[i].name, nn_shape_str(a, sizeof a, f->ndim, f->shape),
                     nn_shape_str(b, sizeof b, reg[i].ndim, reg[i].shape));
            return -1;
        }
    }
    for (int i = 0; i < h->n; i++) {
        bool known = false;
        for (int k = 0; k < n && !known; k++) known = !strcmp(reg[k].name, h->v[i].name);
        if (!known) {
            snprintf(msg, cap, "tensor \"%.200s\" in the file is not in the registry",
                     h->v[i].name);
            return -1;
        }
    }
    return 0;
}

/* Writes one tensor's values from the file. Only contiguous destinations are
 * filled in place; the others get a staged copy made beforehand (*staged),
 * so that nothing can fail once writing has started. */
static nb_tensor *stage(const item *reg, const unsigned char *src) {
    if (nb_is_contiguous(reg->t)) return reg->t;
    size_t size = dtype_size(reg->dtype), n = (size_t)nb_numel(reg->t);
    nb_tensor *s = nb_empty(reg->dtype, reg->ndim, reg->shape);
    if (s) copy_le(nb_data(s), src, n, size);
    return s;
}

static void fill(const item *reg, nb_tensor *staged, const unsigned char *src) {
    size_t size = dtype_size(reg->dtype), n = (size_t)nb_numel(reg->t);
    if (staged == reg->t) {
        unsigned char *dst = nb_data(reg->t);
        copy_le(dst, src, n, size);
        if (reg->dtype == NB_BOOL) /* C's bool holds 0 or 1 only */
            for (size_t i = 0; i < n; i++) dst[i] = dst[i] != 0;
    } else {
        if (reg->dtype == NB_BOOL) {
            unsigned char *s = nb_data(staged);
            for (size_t i = 0; i < n; i++) s[i] = s[i] != 0;
        }
        nb_copy_into(reg->t, staged);
    }
    nb_mark_modified(reg->t);
}

int nb_load(nb_params *ps, const char *path) {
    const char *fn = "nb_load";
    if (!ps || !path) return nn_error("%s: %s is NULL", fn, ps ? "path" : "registry"), -1;
    char msg[512] = "";
    uint64_t size = 0;
    unsigned char *buf = read_file(path, &size, msg, sizeof msg);
    if (!buf) return nn_error("%s: %s", fn, msg), -1;
    uint64_t hlen;
    copy_le(&hlen, buf, 1, 8);
    item *reg = NULL;
    header h = {0};
    json j = {.start = (const char *)buf + 8, .p = (const char *)buf + 8, .msg = ""};
    int n = -1, rc = -1;
    if (hlen > size - 8 || hlen > MAX_HEADER) {
        snprintf(j.msg, sizeof j.msg, "header size %llu exceeds %s (%llu bytes)",
                 (unsigned long long)hlen, hlen > size - 8 ? "the file" : "the 100 MiB limit",
                 (unsigned long long)(hlen > size - 8 ? size - 8 : MAX_HEADER));
    } else {
        j.end = j.p + hlen;
        if (parse_header(&j, &h, size - 8 - hlen) == 0 && (n = registry_items(ps, &reg)) < 0)
            fail(&j, "out of memory");
    }
    if (!j.msg[0] && match(reg, n, &h, msg, sizeof msg) == 0) {
        const unsigned char *data = buf + 8 + hlen;
        nb_tensor **staged = calloc((size_t)(n > 0 ? n : 1), sizeof *staged);
        nb_scope_begin();
        bool ok = staged != NULL;
        for (int i = 0; i < n && ok; i++)
            ok = (staged[i] = stage(&reg[i], data + find_item(&h, reg[i].name)->begin)) != NULL;
        for (int i = 0; i < n && ok; i++)
            fill(&reg[i], staged[i], data + find_item(&h, reg[i].name)->begin);
        nb_scope_end();
        free(staged);
        rc = ok ? 0 : -1;
        if (!ok) snprintf(msg, sizeof msg, "out of memory");
    }
    if (rc != 0) {
        if (j.msg[0]) nn_error("%s: \"%s\": invalid safetensors header: %s", fn, path, j.msg);
        else nn_error("%s: \"%s\": %s; no tensor was changed", fn, path, msg);
    }
    free(reg);
    header_free(&h);
    free(buf);
    return rc;
}
