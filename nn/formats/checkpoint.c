/* checkpoint.c: nb_save and nb_load, checkpoints in the safetensors format:
 * u64 little-endian N, N bytes of JSON header (nn/formats/safetensors.c), then each
 * tensor row-major, little-endian, at [begin, end) of the data section.
 *
 * Saving writes a temporary file in the target's directory (the directory of
 * the file a symbolic link names: the link stays a link): unnamed where the
 * file system has O_TMPFILE (a killed save leaves nothing), else
 * ".nabla-tmp-<pid>-<n>"; gives it the permission bits of the file it
 * replaces, and renames it over the target. Saves and loads remove the named
 * temporaries killed saves left in that directory (nn/formats/files.c).
 * Loading is all-or-nothing: the whole file is read and every
 * check is made (the header's own, then names, dtypes and shapes against the
 * registry, then the values of the optimizer's state) before the first
 * tensor is written. Names are looked up through hash indexes (a header of
 * a million names once took hours of strcmp; now about a second). The
 * file-system side (links, temporaries, opening) is in nn/formats/files.c. */
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "byteorder_internal.h"
#include "files_internal.h"
#include "safetensors_internal.h"

/* Every tensor of a registry: parameters, then buffers. */
static int registry_items(const nb_params *ps, nn_st_item **out) {
    int np = nb_params_count(ps), nbuf = nb_params_buffer_count(ps), n = np + nbuf;
    nn_st_item *v = calloc((size_t)(n ? n : 1), sizeof *v);
    if (!v) return -1;
    for (int i = 0; i < n; i++) {
        nb_tensor *t = i < np ? nb_params_at(ps, i, &v[i].name)
                              : nb_params_buffer_at(ps, i - np, &v[i].name);
        v[i].t = t;
        v[i].check = nn_params_values(ps, i);
        v[i].dtype = nb_dtype_of(t);
        v[i].ndim = nb_ndim(t);
        memcpy(v[i].shape, nb_shape(t), (size_t)v[i].ndim * sizeof(int64_t));
    }
    *out = v;
    return n;
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
        size_t size = nn_st_dtype_size(nb_dtype_of(c)), n = (size_t)nb_numel(c);
        const unsigned char *src = nb_data(c);
        if (nn_host_le() || size == 1) {
            rc = write_all(fd, src, n * size);
        } else {
            unsigned char chunk[1 << 16];
            size_t per = sizeof chunk / size;
            rc = 0;
            for (size_t i = 0; i < n && rc == 0; i += per) {
                size_t k = n - i < per ? n - i : per;
                nn_copy_le(chunk, src + i * size, k, size);
                rc = write_all(fd, chunk, k * size);
            }
        }
        if (rc != 0 && errno == 0) errno = EIO;
    }
    nb_scope_end();
    return rc;
}

/* ------------------------------------------------------------------ saving */
/* The header, the data, the old file's permission bits (setuid, setgid and
 * sticky are not carried over to a rewritten file), fsync: 0, or -1 with
 * errno (0 when a tensor could not be read). */
static int write_file(int fd, const nn_target *t, const char *header, size_t hlen,
                      const nn_st_item *v, int n) {
    unsigned char len[8];
    nn_st_le64(len, hlen);
    errno = 0;
    int rc = write_all(fd, len, 8) || write_all(fd, header, hlen) ? -1 : 0;
    for (int i = 0; i < n && rc == 0; i++) rc = write_tensor(fd, v[i].t);
    /* a failed fchmod (a file system without modes) leaves the bits open()
     * gave, which are no wider than the old ones */
    if (rc == 0 && t->exists) fchmod(fd, t->mode & 0777);
    if (rc == 0 && fsync(fd) != 0) rc = -1;
    return rc;
}

/* Writes the temporary and renames it over the target: 0, or -1 with the
 * message set. */
static int save_to(const nn_target *t, const char *path, const char *header, size_t hlen,
                   const nn_st_item *v, int n) {
    const char *fn = "nb_save";
    nn_remove_stale_temps(t->dir);
    nn_temp tmp;
    if (nn_temp_open(t, &tmp) != 0) {
        int e = errno;
        char via[256] = ""; /* the directory that matters is the link's file's */
        if (strcmp(t->path, path))
            snprintf(via, sizeof via, " (a link to \"%.200s\")", t->path);
        return nn_error("%s: cannot create a file next to \"%s\"%s: %s", fn, path, via,
                        strerror(e)), -1;
    }
    int rc = write_file(tmp.fd, t, header, hlen, v, n), e = errno;
    if (nn_temp_finish(&tmp, t, rc == 0) != 0 && rc == 0) rc = -1, e = errno;
    if (rc == 0)
        nn_sync_dir(t->dir);
    else
        nn_error("%s: cannot write \"%s\": %s (the previous file, if any, is unchanged)", fn,
                 path, e ? strerror(e) : "a tensor could not be read");
    return rc;
}

/* A last guard: nb_params_add* refuse the name, so no registry has it. */
static int reserved_name(const nn_st_item *v, int n, const char *path) {
    for (int i = 0; i < n; i++)
        if (!strcmp(v[i].name, NN_RESERVED_NAME))
            return nn_error("nb_save: cannot write \"%s\": the registry has a tensor named "
                            "\"%s\", a name the safetensors format reserves", path,
                            NN_RESERVED_NAME), -1;
    return 0;
}

int nb_save(const nb_params *ps, const char *path) {
    const char *fn = "nb_save";
    if (!ps || !path) return nn_error("%s: %s is NULL", fn, ps ? "path" : "registry"), -1;
    nn_st_item *v = NULL;
    int n = registry_items(ps, &v), rc = -1;
    size_t hlen = 0;
    char *header = n < 0 ? NULL : nn_st_header_build(v, n, &hlen);
    if (!header) {
        nn_error("%s: out of memory", fn);
    } else if (reserved_name(v, n, path) == 0) {
        nn_target t = {0};
        int e = nn_resolve(path, &t);
        if (e != 0)
            nn_error("%s: cannot write \"%s\": %s (the previous file, if any, is unchanged)",
                     fn, path, strerror(e));
        else
            rc = save_to(&t, path, header, hlen, v, n);
        nn_target_free(&t);
    }
    free(v);
    free(header);
    return rc;
}

/* ----------------------------------------------------------------- loading */
static unsigned char *read_file(const char *path, uint64_t *size, char *msg, size_t cap) {
    struct stat st;
    int fd = nn_open_regular(path, &st, msg, cap);
    if (fd < 0) return NULL;
    unsigned char *buf = NULL;
    if (st.st_size < 8) {
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

/* An expanded view (stride 0 over a size > 1) has elements that alias:
 * there is no way to write a file's distinct values into it. */
static bool writable(const nn_st_item *r) {
    for (int d = 0; d < r->ndim; d++)
        if (nb_strides(r->t)[d] == 0 && r->shape[d] > 1) return false;
    return true;
}

/* Registry tensor r (of n) against the file: sets r->file; 0, or -1 with the
 * mismatch in msg. */
static int match_one(nn_st_item *r, int n, const nn_st_header *h, char *msg, size_t cap) {
    char a[96], b[96];
    if (!writable(r)) {
        snprintf(msg, cap, "registry tensor \"%.200s\" is an expanded view (stride 0), "
                 "which cannot hold loaded values", r->name);
        return -1;
    }
    if ((r->file = nn_st_header_find(h, r->name)) < 0) {
        snprintf(msg, cap, "no tensor \"%.200s\" in the file (the registry has %d entries, "
                 "the file %d)", r->name, n, h->n);
        return -1;
    }
    const nn_st_item *f = &h->v[r->file];
    if (f->dtype != r->dtype) {
        snprintf(msg, cap, "tensor \"%.200s\" is %s in the file but %s in the registry",
                 r->name, nn_st_dtype_tag(f->dtype), nn_st_dtype_tag(r->dtype));
        return -1;
    }
    bool same = f->ndim == r->ndim;
    for (int d = 0; same && d < f->ndim; d++) same = f->shape[d] == r->shape[d];
    if (!same) {
        snprintf(msg, cap, "tensor \"%.150s\" has shape %s in the file but %s in the "
                 "registry", r->name, nn_shape_str(a, sizeof a, f->ndim, f->shape),
                 nn_shape_str(b, sizeof b, r->ndim, r->shape));
        return -1;
    }
    return 0;
}

/* Registry against file: the first mismatch, in registry order, then names
 * the file has and the registry does not (the first in file order). */
static int match(nn_st_item *reg, int n, const nn_st_header *h, char *msg, size_t cap) {
    for (int i = 0; i < n; i++)
        if (match_one(&reg[i], n, h, msg, cap) != 0) return -1;
    if (h->n == n) return 0; /* n distinct names found among n: the same set */
    bool *known = calloc((size_t)h->n, sizeof *known);
    if (!known) return snprintf(msg, cap, "out of memory"), -1;
    for (int i = 0; i < n; i++) known[reg[i].file] = true;
    int i = 0;
    while (known[i]) i++; /* h->n > n: some entry is not known */
    snprintf(msg, cap, "tensor \"%.200s\" in the file is not in the registry", h->v[i].name);
    free(known);
    return -1;
}

/* --------------------------------------------- values of the optimizer's state */
/* 1 when every one of k values is in [lo, hi] (NaN is not): branch-free, so
 * that the compiler vectorizes the pass over a large state. */
#define DEFINE_IN_RANGE(T)                                                         \
    static bool in_range_##T(const T *x, size_t k, T lo, T hi) {                  \
        int ok = 1; /* an int: a bool accumulator defeats GCC's vectorizer */      \
        for (size_t i = 0; i < k; i++) ok &= (x[i] >= lo) & (x[i] <= hi);          \
        return ok;                                                                 \
    }
DEFINE_IN_RANGE(float)
DEFINE_IN_RANGE(double)
DEFINE_IN_RANGE(int64_t)

static bool chunk_ok(const void *c, nb_dtype d, size_t k, nn_values check) {
    bool nonneg = check == NN_VALUES_FINITE_NONNEG;
    if (d == NB_F32) return in_range_float(c, k, nonneg ? 0 : -FLT_MAX, FLT_MAX);
    if (d == NB_F64) return in_range_double(c, k, nonneg ? 0 : -DBL_MAX, DBL_MAX);
    return in_range_int64_t(c, k, 0, NN_MAX_STEP);
}

/* The first element of r's values in the file (at src) that its check
 * refuses, or -1 when all pass. */
static int64_t first_bad(const nn_st_item *r, const unsigned char *src) {
    if (r->check == NN_VALUES_ANY || (r->check == NN_VALUES_STEP) != (r->dtype == NB_I64) ||
        r->dtype == NB_BOOL)
        return -1; /* a dtype the check is not for: the registry's own business */
    enum { CHUNK = 2048 };
    union {
        float f[CHUNK];
        double d[CHUNK];
        int64_t i[CHUNK];
    } c;
    size_t size = nn_st_dtype_size(r->dtype), n = (size_t)nb_numel(r->t);
    for (size_t at = 0; at < n; at += CHUNK) {
        size_t k = n - at < CHUNK ? n - at : CHUNK;
        nn_copy_le(&c, src + at * size, k, size);
        if (chunk_ok(&c, r->dtype, k, r->check)) continue;
        for (size_t i = 0; i < k; i++)
            if (!chunk_ok((const unsigned char *)&c + i * size, r->dtype, 1, r->check))
                return (int64_t)(at + i);
    }
    return -1;
}

/* "tensor "optim.w.step" holds -1; an optimizer step count must be in [0, 2^53]" */
static void bad_value(const nn_st_item *r, const unsigned char *src, int64_t i, char *msg,
                      size_t cap) {
    size_t size = nn_st_dtype_size(r->dtype);
    union {
        float f;
        double d;
        int64_t i;
    } v;
    nn_copy_le(&v, src + (size_t)i * size, 1, size);
    if (r->dtype == NB_I64) {
        snprintf(msg, cap, "tensor \"%.200s\" holds %lld; an optimizer step count must be in "
                 "[0, %lld]", r->name, (long long)v.i, (long long)NN_MAX_STEP);
        return;
    }
    const char *dot = strrchr(r->name, '.'), *what = dot ? dot + 1 : r->name;
    snprintf(msg, cap, "tensor \"%.200s\" holds %g at element %lld; %.40s must be finite%s in "
             "an optimizer's state", r->name, r->dtype == NB_F32 ? (double)v.f : v.d,
             (long long)i, what, r->check == NN_VALUES_FINITE_NONNEG ? " and >= 0" : "");
}

/* Every registry tensor with a check (the optimizer's state), against the
 * file's values: a step that ++ would overflow or a NaN moment would ruin
 * every weight at the next step. */
static int check_values(const nn_st_item *reg, int n, const nn_st_header *h,
                        const unsigned char *data, char *msg, size_t cap) {
    for (int i = 0; i < n; i++) {
        const unsigned char *src = data + h->v[reg[i].file].begin;
        int64_t bad = first_bad(&reg[i], src);
        if (bad >= 0) {
            bad_value(&reg[i], src, bad, msg, cap);
            return -1;
        }
    }
    return 0;
}

/* Two registry entries that share memory (one tensor under two names, tied
 * weights, overlapping views) take both their file values in one place:
 * the later write wins. That is harmless only when they are the same view
 * and the file holds the same bytes for both (a tied pair saved twice);
 * anything else is refused. */
typedef struct {
    const nn_st_item *reg;
    const nn_st_header *h;
    const unsigned char *data;
} load_view;

static bool same_view(const nn_st_item *a, const nn_st_item *b) {
    return nb_data(a->t) == nb_data(b->t) && a->dtype == b->dtype && a->ndim == b->ndim &&
           !memcmp(a->shape, b->shape, (size_t)a->ndim * sizeof *a->shape) &&
           !memcmp(nb_strides(a->t), nb_strides(b->t), (size_t)a->ndim * sizeof(int64_t));
}

static bool same_values_twice(int a, int b, void *ctx) {
    const load_view *l = ctx;
    const nn_st_item *fa = &l->h->v[l->reg[a].file], *fb = &l->h->v[l->reg[b].file];
    return same_view(&l->reg[a], &l->reg[b]) && fa->end - fa->begin == fb->end - fb->begin &&
           !memcmp(l->data + fa->begin, l->data + fb->begin, fa->end - fa->begin);
}

static int check_distinct(const nn_st_item *reg, int n, const nn_st_header *h,
                          const unsigned char *data, char *msg, size_t cap) {
    nb_tensor **ts = malloc((size_t)(n > 0 ? n : 1) * sizeof *ts);
    if (!ts) return snprintf(msg, cap, "out of memory"), -1;
    for (int i = 0; i < n; i++) ts[i] = reg[i].t;
    load_view l = {reg, h, data};
    int a, b, found = nn_shared_pair(ts, n, same_values_twice, &l, &a, &b);
    free(ts);
    if (found < 0) return snprintf(msg, cap, "out of memory"), -1;
    if (found)
        snprintf(msg, cap, "registry tensors \"%.150s\" and \"%.150s\" share memory%s, so one "
                 "would overwrite the other (register each tensor once, or tie them after "
                 "loading)", reg[a].name, reg[b].name,
                 same_view(&reg[a], &reg[b]) ? " and the file holds different values for them"
                                               : "");
    return found ? -1 : 0;
}

/* Writes one tensor's values from the file. Only contiguous destinations are
 * filled in place; the others get a staged copy made beforehand (*staged),
 * so that nothing can fail once writing has started. */
static nb_tensor *stage(const nn_st_item *reg, const unsigned char *src) {
    if (nb_is_contiguous(reg->t)) return reg->t;
    size_t size = nn_st_dtype_size(reg->dtype), n = (size_t)nb_numel(reg->t);
    nb_tensor *s = nb_empty(reg->dtype, reg->ndim, reg->shape);
    if (s) nn_copy_le(nb_data(s), src, n, size);
    return s;
}

static void fill(const nn_st_item *reg, nb_tensor *staged, const unsigned char *src) {
    size_t size = nn_st_dtype_size(reg->dtype), n = (size_t)nb_numel(reg->t);
    if (staged == reg->t) {
        unsigned char *dst = nb_data(reg->t);
        nn_copy_le(dst, src, n, size);
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

/* Every registry tensor from the data section: staged copies first (the only
 * step that can fail), then the writes. */
static int write_values(const nn_st_item *reg, int n, const nn_st_header *h,
                        const unsigned char *data, char *msg, size_t cap) {
    nb_tensor **staged = calloc((size_t)(n > 0 ? n : 1), sizeof *staged);
    nb_scope_begin();
    bool ok = staged != NULL;
    for (int i = 0; i < n && ok; i++)
        ok = (staged[i] = stage(&reg[i], data + h->v[reg[i].file].begin)) != NULL;
    for (int i = 0; i < n && ok; i++) fill(&reg[i], staged[i], data + h->v[reg[i].file].begin);
    nb_scope_end();
    free(staged);
    if (!ok) snprintf(msg, cap, "out of memory");
    return ok ? 0 : -1;
}

int nb_load(nb_params *ps, const char *path) {
    const char *fn = "nb_load";
    if (!ps || !path) return nn_error("%s: %s is NULL", fn, ps ? "path" : "registry"), -1;
    nn_remove_stale_temps_beside(path); /* what saves killed there left */
    char msg[512] = "";
    uint64_t size = 0;
    unsigned char *buf = read_file(path, &size, msg, sizeof msg);
    if (!buf) return nn_error("%s: %s", fn, msg), -1;
    uint64_t hlen = nn_ld_le64(buf);
    nn_st_item *reg = NULL;
    nn_st_header h = {0};
    char bad_header[320] = "";
    int n = -1, rc = -1;
    if (hlen > size - 8 || hlen > NN_ST_MAX_HEADER)
        snprintf(bad_header, sizeof bad_header, "header size %llu exceeds %s (%llu bytes)",
                 (unsigned long long)hlen, hlen > size - 8 ? "the file" : "the 100 MiB limit",
                 (unsigned long long)(hlen > size - 8 ? size - 8 : NN_ST_MAX_HEADER));
    else if (nn_st_header_parse((const char *)buf + 8, hlen, size - 8 - hlen, &h, bad_header,
                                sizeof bad_header) == 0) {
        if ((n = registry_items(ps, &reg)) < 0) snprintf(msg, sizeof msg, "out of memory");
        else if (match(reg, n, &h, msg, sizeof msg) == 0 &&
                 check_values(reg, n, &h, buf + 8 + hlen, msg, sizeof msg) == 0 &&
                 check_distinct(reg, n, &h, buf + 8 + hlen, msg, sizeof msg) == 0)
            rc = write_values(reg, n, &h, buf + 8 + hlen, msg, sizeof msg);
    }
    if (rc != 0) {
        if (bad_header[0])
            nn_error("%s: \"%s\": invalid safetensors header: %s", fn, path, bad_header);
        else
            nn_error("%s: \"%s\": %s; no tensor was changed", fn, path, msg);
    }
    free(reg);
    nn_st_header_free(&h);
    free(buf);
    return rc;
}
