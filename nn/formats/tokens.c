/* tokens.c: nb_load_tokens, a token file as a 1-D i64 tensor.
 *
 * Two kinds of file. llm.c's (karpathy/llm.c; its dev/data scripts write
 * them): a header of 256 little-endian int32 (magic 20240520, version 1, the
 * token count), then that many little-endian uint16 tokens and nothing
 * after. Any other file is read as bytes, one token (0..255) per byte, as a
 * character-level model wants its text. A file is llm.c's when its first
 * four bytes are the magic.
 *
 * The tensor is allocated once the size is known and filled while the file
 * is read in chunks, so a large token file costs its tensor and no more. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "byteorder_internal.h"
#include "files_internal.h"
#include "../nn_internal.h"

#define TOKENS_MAGIC 20240520
#define TOKENS_VERSION 1
#define TOKENS_HEADER_INTS 256
#define TOKENS_HEADER_BYTES (TOKENS_HEADER_INTS * 4)
#define CHUNK_BYTES (1 << 16)

static const char *FN = "nb_load_tokens";

static int32_t le_i32(const unsigned char *p) { return (int32_t)nn_ld_le32(p); }

/* A 1-D i64 tensor of n elements that outlives any open scope. */
static nb_tensor *persistent_i64(int64_t n) {
    nb_scope_begin();
    nb_tensor *t = nb_empty(NB_I64, 1, &n);
    nb_tensor *kept = t ? nb_persistent(t) : NULL;
    nb_scope_end();
    if (!kept) nn_error("%s: out of memory for %lld tokens", FN, (long long)n);
    return kept;
}

/* Reads n tokens of `width` bytes (1: bytes, 2: little-endian uint16) from
 * fd into a new tensor, checking each against vocab_size (when > 0). */
static nb_tensor *read_tokens(int fd, const char *path, int64_t n, int width,
                              int64_t vocab_size) {
    nb_tensor *t = persistent_i64(n);
    unsigned char *buf = t ? malloc(CHUNK_BYTES) : NULL;
    if (!buf) {
        if (t) nn_error("%s: out of memory", FN);
        nb_free(t);
        return NULL;
    }
    int64_t *out = nb_data(t);
    int64_t per_chunk = CHUNK_BYTES / width;
    for (int64_t done = 0; done < n;) {
        int64_t k = n - done < per_chunk ? n - done : per_chunk;
        if (nn_read_all(fd, FN, path, buf, (size_t)(k * width)) != 0) goto fail;
        for (int64_t i = 0; i < k; i++) {
            int64_t v = width == 1 ? buf[i] : (int64_t)nn_ld_le16(buf + 2 * i);
            if (vocab_size > 0 && v >= vocab_size) {
                nn_error("%s: \"%s\": token %lld at position %lld is not below vocab_size "
                         "%lld", FN, path, (long long)v, (long long)(done + i),
                         (long long)vocab_size);
                goto fail;
            }
            out[done + i] = v;
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

/* llm.c's header (already read): the token count, or -1 with a message. */
static int64_t llmc_count(const char *path, const unsigned char *h, int64_t size) {
    int32_t version = le_i32(h + 4), count = le_i32(h + 8);
    if (version != TOKENS_VERSION)
        return nn_error("%s: \"%s\" is an llm.c token file of version %d; only version %d "
                        "is read", FN, path, version, TOKENS_VERSION), -1;
    if (count <= 0)
        return nn_error("%s: \"%s\": llm.c token file with a token count of %d in its "
                        "header (no tokens)", FN, path, count), -1;
    int64_t want = TOKENS_HEADER_BYTES + 2 * (int64_t)count;
    if (size < want)
        return nn_error("%s: \"%s\" is truncated: its header says %d tokens (%lld bytes with "
                        "the header) but the file has %lld bytes", FN, path, count,
                        (long long)want, (long long)size), -1;
    if (size > want)
        return nn_error("%s: \"%s\" has %lld bytes after its last token: its header says %d "
                        "tokens (%lld bytes with the header) but the file has %lld bytes", FN,
                        path, (long long)(size - want), count, (long long)want,
                        (long long)size), -1;
    return count;
}

static nb_tensor *load_tokens_body(const char *path, int64_t vocab_size) {
    if (!path) return nn_error("%s: path is NULL", FN);
    if (vocab_size < 0)
        return nn_error("%s: vocab_size must be >= 0 (0: no check), got %lld", FN,
                        (long long)vocab_size);
    char msg[1024];
    struct stat st;
    int fd = nn_open_regular(path, &st, msg, sizeof msg);
    if (fd < 0) return nn_error("%s: %s", FN, msg);
    nb_tensor *t = NULL;
    int64_t size = (int64_t)st.st_size;
    unsigned char head[TOKENS_HEADER_BYTES];
    bool llmc = false;
    if (size == 0) {
        nn_error("%s: \"%s\" is empty (no tokens)", FN, path);
    } else if (size >= 4 && nn_read_all(fd, FN, path, head, 4) != 0) {
        /* reported */
    } else if (size >= 4 && (llmc = le_i32(head) == TOKENS_MAGIC) && size < TOKENS_HEADER_BYTES) {
        nn_error("%s: \"%s\" starts with llm.c's token magic %d but has %lld bytes, fewer "
                 "than its %d-byte header", FN, path, TOKENS_MAGIC, (long long)size,
                 TOKENS_HEADER_BYTES);
    } else if (llmc) {
        if (nn_read_all(fd, FN, path, head + 4, TOKENS_HEADER_BYTES - 4) == 0) {
            int64_t n = llmc_count(path, head, size);
            if (n > 0) t = read_tokens(fd, path, n, 2, vocab_size);
        }
    } else if (lseek(fd, 0, SEEK_SET) != 0) {
        nn_error("%s: cannot read \"%s\": %s", FN, path, strerror(errno));
    } else {
        t = read_tokens(fd, path, size, 1, vocab_size);
    }
    close(fd);
    return t;
}

nb_tensor *nb_load_tokens(const char *path, int64_t vocab_size) {
    nn_enter();
    return nn_leave(FN, load_tokens_body(path, vocab_size));
}
