/* idx.c: nb_load_idx, an IDX file (MNIST's and Fashion-MNIST's format) as a
 * persistent tensor.
 *
 * The format (LeCun's MNIST page): two zero bytes, a type byte (0x08 u8,
 * 0x09 i8, 0x0B i16, 0x0C i32, 0x0D f32, 0x0E f64), the number of dims, one
 * big-endian u32 per dim, then the values big-endian in row-major order and
 * nothing after. The whole file is checked before any value is trusted: the
 * header, then the size the header implies against the file's (truncated, or
 * bytes left over), then each value against the dtype asked for (a value the
 * dtype cannot hold exactly is an error, never a silent rounding).
 *
 * The tensor is allocated once the size is known and filled while the file
 * is read in chunks, so a 47 MB image file costs its tensor and no more. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "byteorder_internal.h"
#include "files_internal.h"
#include "../nn_internal.h"

#define IDX_MAX_DIMS 8
#define CHUNK_BYTES (1 << 16)

static const char *FN = "nb_load_idx";

typedef struct {
    unsigned char code; /* the type byte */
    const char *name;
    int width;          /* bytes per value */
} idx_type;

static const idx_type IDX_TYPES[] = {{0x08, "u8", 1},  {0x09, "i8", 1},  {0x0B, "i16", 2},
                                     {0x0C, "i32", 4}, {0x0D, "f32", 4}, {0x0E, "f64", 8}};

static const idx_type *idx_type_of(unsigned char code) {
    for (size_t i = 0; i < sizeof IDX_TYPES / sizeof IDX_TYPES[0]; i++)
        if (IDX_TYPES[i].code == code) return &IDX_TYPES[i];
    return NULL;
}

/* A big-endian unsigned value of width 1, 2, 4 or 8 bytes */
static uint64_t be_u(const unsigned char *p, int width) {
    return width == 1 ? p[0] : width == 2 ? nn_ld_be16(p) : width == 4 ? nn_ld_be32(p)
                                                                          : nn_ld_be64(p);
}

/* One value of type ty at p, as a double (exact: every IDX type fits a double). */
static double idx_value(const idx_type *ty, const unsigned char *p) {
    uint64_t u = be_u(p, ty->width);
    switch (ty->code) {
    case 0x08: return (double)u;
    case 0x09: return (double)(int8_t)(uint8_t)u;
    case 0x0B: return (double)(int16_t)(uint16_t)u;
    case 0x0C: return (double)(int32_t)(uint32_t)u;
    case 0x0D: {
        uint32_t b = (uint32_t)u;
        float f;
        memcpy(&f, &b, sizeof f);
        return (double)f;
    }
    default: {
        double d;
        memcpy(&d, &u, sizeof d);
        return d;
    }
    }
}

/* Stores v as element i of out (dtype): 0, or -1 when dtype cannot hold v
 * exactly. NaN and infinities are floats' own values; an integer dtype
 * takes neither. */
static int store(void *out, nb_dtype dtype, int64_t i, double v) {
    if (dtype == NB_F64) {
        ((double *)out)[i] = v;
        return 0;
    }
    if (dtype == NB_F32) {
        float f = (float)v;
        if ((double)f != v && !isnan(v)) return -1;
        ((float *)out)[i] = f;
        return 0;
    }
    /* NB_I64: an integer within int64's range (2^63 itself is not) */
    if (!(v == floor(v)) || !(v >= -9223372036854775808.0 && v < 9223372036854775808.0))
        return -1;
    ((int64_t *)out)[i] = (int64_t)v;
    return 0;
}

typedef struct {
    const idx_type *type;
    int ndim;
    int64_t shape[IDX_MAX_DIMS];
    int64_t numel, data_bytes;
} idx_header;

/* "u8 (60000,28,28)" into buf */
static const char *describe(const idx_header *h, char *buf, size_t cap) {
    char s[8 * 24];
    snprintf(buf, cap, "%s %s", h->type->name, nn_shape_str(s, sizeof s, h->ndim, h->shape));
    return buf;
}

/* Reads and checks the header against the file's size: 0, or -1 with a message. */
static int read_header(int fd, const char *path, int64_t size, idx_header *h) {
    unsigned char head[4 + 4 * IDX_MAX_DIMS];
    if (size < 4)
        return nn_error("%s: \"%s\" is truncated: %lld bytes, fewer than the 4 of an IDX "
                        "file's magic", FN, path, (long long)size), -1;
    if (nn_read_all(fd, FN, path, head, 4) != 0) return -1;
    if (head[0] != 0 || head[1] != 0)
        return nn_error("%s: \"%s\" is not an IDX file: it starts with bytes 0x%02x 0x%02x, "
                        "not 0x00 0x00 (a gzipped file starts with 0x1f 0x8b: gunzip it first)",
                        FN, path, head[0], head[1]), -1;
    h->type = idx_type_of(head[2]);
    if (!h->type)
        return nn_error("%s: \"%s\": unknown IDX type byte 0x%02x (known: 0x08 u8, 0x09 i8, "
                        "0x0B i16, 0x0C i32, 0x0D f32, 0x0E f64)", FN, path, head[2]), -1;
    h->ndim = head[3];
    if (h->ndim < 1 || h->ndim > IDX_MAX_DIMS)
        return nn_error("%s: \"%s\": %d dims in the IDX header; nabla reads 1 to %d", FN,
                        path, h->ndim, IDX_MAX_DIMS), -1;
    int64_t header_bytes = 4 + 4 * (int64_t)h->ndim;
    if (size < header_bytes)
        return nn_error("%s: \"%s\" is truncated: %lld bytes, fewer than the %lld of its "
                        "header (%d dims)", FN, path, (long long)size, (long long)header_bytes,
                        h->ndim), -1;
    if (nn_read_all(fd, FN, path, head + 4, (size_t)(4 * h->ndim)) != 0) return -1;
    /* The product of the nonzero sizes, in bytes of the widest type, stays
     * below 2^63: a tensor's strides multiply the nonzero sizes even when
     * another size is 0 (and nb_empty counts its elements left to right). */
    int64_t product = 1;
    bool overflow = false, empty = false;
    for (int d = 0; d < h->ndim; d++) {
        h->shape[d] = (int64_t)be_u(head + 4 + 4 * d, 4);
        if (h->shape[d] == 0) empty = true;
        else if (product > INT64_MAX / 8 / h->shape[d]) overflow = true;
        else product *= h->shape[d];
    }
    h->numel = empty ? 0 : product;
    char what[256];
    if (overflow)
        return nn_error("%s: \"%s\": shape %s has more bytes than int64 can count", FN, path,
                        describe(h, what, sizeof what)), -1;
    h->data_bytes = h->numel * h->type->width;
    int64_t want = header_bytes + h->data_bytes;
    if (size < want)
        return nn_error("%s: \"%s\" is truncated: its header says %s (%lld bytes with the "
                        "header) but the file has %lld bytes", FN, path,
                        describe(h, what, sizeof what), (long long)want, (long long)size), -1;
    if (size > want)
        return nn_error("%s: \"%s\" has %lld bytes after its data: its header says %s (%lld "
                        "bytes with the header) but the file has %lld bytes", FN, path,
                        (long long)(size - want), describe(h, what, sizeof what),
                        (long long)want, (long long)size), -1;
    return 0;
}

/* A tensor of the header's shape that outlives any open scope. */
static nb_tensor *persistent_tensor(nb_dtype dtype, const idx_header *h) {
    nb_scope_begin();
    nb_tensor *t = nb_empty(dtype, h->ndim, h->shape);
    nb_tensor *kept = t ? nb_persistent(t) : NULL;
    nb_scope_end();
    return kept; /* on failure nb_empty's message stays */
}

/* Reads the values into a new tensor, each checked against dtype. */
static nb_tensor *read_values(int fd, const char *path, const idx_header *h, nb_dtype dtype) {
    nb_tensor *t = persistent_tensor(dtype, h);
    unsigned char *buf = t ? malloc(CHUNK_BYTES) : NULL;
    if (!buf) {
        if (t) nn_error("%s: out of memory", FN);
        nb_free(t);
        return NULL;
    }
    void *out = nb_data(t);
    int w = h->type->width;
    int64_t per_chunk = CHUNK_BYTES / w;
    for (int64_t done = 0; done < h->numel;) {
        int64_t k = h->numel - done < per_chunk ? h->numel - done : per_chunk;
        if (nn_read_all(fd, FN, path, buf, (size_t)(k * w)) != 0) goto fail;
        for (int64_t i = 0; i < k; i++) {
            double v = idx_value(h->type, buf + i * w);
            if (store(out, dtype, done + i, v) != 0) {
                nn_error("%s: \"%s\": value %.17g (element %lld, %s) is not exact in %s", FN,
                         path, v, (long long)(done + i), h->type->name, nb_dtype_name(dtype));
                goto fail;
            }
        }
        done += k;
    }
    free(buf);
    return t;
fail:
    free(buf);
    nb_free(t);
    return NULL;
}

static nb_tensor *load_idx_body(const char *path, nb_dtype dtype) {
    if (!path) return nn_error("%s: path is NULL", FN);
    if (dtype != NB_F32 && dtype != NB_F64 && dtype != NB_I64)
        return nn_error("%s: dtype must be f32, f64 or i64, got %s", FN, nb_dtype_name(dtype));
    char msg[1024];
    struct stat st;
    int fd = nn_open_regular(path, &st, msg, sizeof msg);
    if (fd < 0) return nn_error("%s: %s", FN, msg);
    idx_header h;
    nb_tensor *t = NULL;
    if (read_header(fd, path, (int64_t)st.st_size, &h) == 0) t = read_values(fd, path, &h, dtype);
    close(fd);
    return t;
}

nb_tensor *nb_load_idx(const char *path, nb_dtype dtype) {
    nn_enter();
    return nn_leave(FN, load_idx_body(path, dtype));
}
