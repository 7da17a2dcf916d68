/* checkpoint.c: nb_save and nb_load, checkpoints in the safetensors format:
 * u64 little-endian N, N bytes of JSON header (nn/safetensors.c), then each
 * tensor row-major, little-endian, at [begin, end) of the data section.
 *
 * Saving writes a temporary file beside the target and renames it over the
 * target. Loading is all-or-nothing: the whole file is read and every check
 * is made (the header's own, then names, dtypes and shapes against the
 * registry) before the first tensor is written. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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
        if (nn_st_little_endian() || size == 1) {
            rc = write_all(fd, src, n * size);
        } else {
            unsigned char chunk[1 << 16];
            size_t per = sizeof chunk / size;
            rc = 0;
            for (size_t i = 0; i < n && rc == 0; i += per) {
                size_t k = n - i < per ? n - i : per;
                nn_st_copy_le(chunk, src + i * size, k, size);
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
    nn_st_item *v = NULL;
    int n = registry_items(ps, &v);
    size_t hlen = 0;
    char *header = n < 0 ? NULL : nn_st_header_build(v, n, &hlen);
    if (!header) {
        free(v);
        return nn_error("%s: out of memory", fn), -1;
    }
    char *tmp = NULL;
    int fd = open_temp(path, &tmp);
    if (fd < 0) {
        int e = errno;
        free(v);
        free(header);
        return nn_error("%s: cannot create a file next to \"%s\": %s", fn, path, strerror(e)), -1;
    }
    unsigned char len[8];
    nn_st_copy_le(len, &(uint64_t){hlen}, 1, 8);
    errno = 0;
    int rc = write_all(fd, len, 8) || write_all(fd, header, hlen) ? -1 : 0;
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
    free(header);
    return rc;
}

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

static const nn_st_item *find_item(const nn_st_header *h, const char *name) {
    for (int i = 0; i < h->n; i++)
        if (!strcmp(h->v[i].name, name)) return &h->v[i];
    return NULL;
}

/* Registry against file: the first mismatch, in registry order, then names
 * the file has and the registry does not. */
/* An expanded view (stride 0 over a size > 1) has elements that alias:
 * there is no way to write a file's distinct values into it. */
static bool writable(const nn_st_item *r) {
    for (int d = 0; d < r->ndim; d++)
        if (nb_strides(r->t)[d] == 0 && r->shape[d] > 1) return false;
    return true;
}

static int match(const nn_st_item *reg, int n, const nn_st_header *h, char *msg, size_t cap) {
    char a[96], b[96];
    for (int i = 0; i < n; i++) {
        if (!writable(&reg[i])) {
            snprintf(msg, cap, "registry tensor \"%.200s\" is an expanded view (stride 0), "
                     "which cannot hold loaded values", reg[i].name);
            return -1;
        }
        const nn_st_item *f = find_item(h, reg[i].name);
        if (!f) {
            snprintf(msg, cap, "no tensor \"%.200s\" in the file (the registry has %d entries, "
                     "the file %d)", reg[i].name, n, h->n);
            return -1;
        }
        if (f->dtype != reg[i].dtype) {
            snprintf(msg, cap, "tensor \"%.200s\" is %s in the file but %s in the registry",
                     reg[i].name, nn_st_dtype_tag(f->dtype), nn_st_dtype_tag(reg[i].dtype));
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
static nb_tensor *stage(const nn_st_item *reg, const unsigned char *src) {
    if (nb_is_contiguous(reg->t)) return reg->t;
    size_t size = nn_st_dtype_size(reg->dtype), n = (size_t)nb_numel(reg->t);
    nb_tensor *s = nb_empty(reg->dtype, reg->ndim, reg->shape);
    if (s) nn_st_copy_le(nb_data(s), src, n, size);
    return s;
}

static void fill(const nn_st_item *reg, nb_tensor *staged, const unsigned char *src) {
    size_t size = nn_st_dtype_size(reg->dtype), n = (size_t)nb_numel(reg->t);
    if (staged == reg->t) {
        unsigned char *dst = nb_data(reg->t);
        nn_st_copy_le(dst, src, n, size);
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
        ok = (staged[i] = stage(&reg[i], data + find_item(h, reg[i].name)->begin)) != NULL;
    for (int i = 0; i < n && ok; i++)
        fill(&reg[i], staged[i], data + find_item(h, reg[i].name)->begin);
    nb_scope_end();
    free(staged);
    if (!ok) snprintf(msg, cap, "out of memory");
    return ok ? 0 : -1;
}

int nb_load(nb_params *ps, const char *path) {
    const char *fn = "nb_load";
    if (!ps || !path) return nn_error("%s: %s is NULL", fn, ps ? "path" : "registry"), -1;
    char msg[512] = "";
    uint64_t size = 0;
    unsigned char *buf = read_file(path, &size, msg, sizeof msg);
    if (!buf) return nn_error("%s: %s", fn, msg), -1;
    uint64_t hlen;
    nn_st_copy_le(&hlen, buf, 1, 8);
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
        else if (match(reg, n, &h, msg, sizeof msg) == 0)
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
