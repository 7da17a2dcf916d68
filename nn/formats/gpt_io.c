/* gpt_io.c: GPT checkpoints of llm.c (train_gpt2.c's gpt2_124M.bin) and of
 * Hugging Face (GPT-2's model.safetensors), read into and written from an
 * nb_GPT (nn/gpt.c), and the config such a file holds.
 *
 * The model's tensors are walked as "slots": 0 wte, 1 wpe, 2 ln_f.weight,
 * 3 ln_f.bias, 4 lm_head.weight, then 12 per layer in llm.c's order
 * (ln_1 w, b; attn.c_attn w, b; attn.c_proj w, b; ln_2 w, b; mlp.c_fc w, b;
 * mlp.c_proj w, b). A slot the config lacks is absent: lm_head when tied
 * (it is wte), the linear layers' biases when cfg.bias is false.
 *
 * Loading is all-or-nothing and holds one extra copy of the weights at most:
 *   1. the model is checked (every parameter live, f32/f64, contiguous, of
 *      its config's shape);
 *   2. the file's header is read and checked (llm.c: magic, version, sizes
 *      against the model, the exact file size; Hugging Face: the safetensors
 *      header, which also tiles the file exactly, then every name, dtype and
 *      shape), without reading the weights;
 *   3. the weights are read, chunk by chunk, into a staging buffer in the
 *      model's dtypes (converted, Conv1D weights transposed);
 *   4. only then is each parameter written (memcpy through nb_data) and
 *      nb_mark_modified.
 * A failure in 1-3 leaves the model as it was. Saves go through a temporary
 * file, fsync and rename, as nb_save (nn/formats/files.c); saves and loads
 * remove the temporaries killed saves left beside the file. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "byteorder_internal.h"
#include "files_internal.h"
#include "json_internal.h"
#include "safetensors_internal.h"

#define LLMC_MAGIC 20240326
#define LLMC_VERSION 3
#define LLMC_HEADER_BYTES 1024 /* 256 int32 */
#define LLMC_VOCAB_ROUND 128
#define HF_PREFIX "transformer."
#define HF_MAX_LAYERS 100000 /* nb_gpt_init's limit */
#define CHUNK 4096           /* elements per read or write */

/* ------------------------------------------------------------------ slots */
enum { S_WTE, S_WPE, S_LNF_W, S_LNF_B, S_LM_HEAD, S_GLOBAL };
#define KINDS 12

static const struct kind {
    const char *name;  /* after "h.{i}." */
    int rows, cols;    /* the model's shape in multiples of C; cols 0: 1-d */
    bool conv;         /* a linear weight: (in, out) in Hugging Face's files */
    bool linear_bias;  /* absent without cfg.bias */
} kinds[KINDS] = {
    {"ln_1.weight", 1, 0, false, false},        {"ln_1.bias", 1, 0, false, false},
    {"attn.c_attn.weight", 3, 1, true, false},  {"attn.c_attn.bias", 3, 0, false, true},
    {"attn.c_proj.weight", 1, 1, true, false},  {"attn.c_proj.bias", 1, 0, false, true},
    {"ln_2.weight", 1, 0, false, false},        {"ln_2.bias", 1, 0, false, false},
    {"mlp.c_fc.weight", 4, 1, true, false},     {"mlp.c_fc.bias", 4, 0, false, true},
    {"mlp.c_proj.weight", 1, 4, true, false},   {"mlp.c_proj.bias", 1, 0, false, true},
};
static const char *const global_names[S_GLOBAL] = {"wte.weight", "wpe.weight", "ln_f.weight",
                                                   "ln_f.bias", "lm_head.weight"};

static int64_t n_slots(const nb_GPTConfig *c) { return S_GLOBAL + KINDS * c->n_layer; }
static const struct kind *slot_kind(int64_t s) { return &kinds[(s - S_GLOBAL) % KINDS]; }

static bool slot_present(const nb_GPTConfig *c, int64_t s) {
    if (s == S_LM_HEAD) return !c->tie_weights;
    return s < S_GLOBAL || c->bias || !slot_kind(s)->linear_bias;
}

static bool slot_conv(int64_t s) { return s >= S_GLOBAL && slot_kind(s)->conv; }

/* The model's shape of slot s ((out, in) for weights): its ndim. */
static int slot_shape(const nb_GPTConfig *c, int64_t s, int64_t shape[2]) {
    int64_t C = c->n_embd;
    switch (s) {
    case S_WTE:
    case S_LM_HEAD: shape[0] = c->vocab_size, shape[1] = C; return 2;
    case S_WPE: shape[0] = c->block_size, shape[1] = C; return 2;
    case S_LNF_W:
    case S_LNF_B: shape[0] = C; return 1;
    default: break;
    }
    const struct kind *k = slot_kind(s);
    shape[0] = k->rows * C;
    if (!k->cols) return 1;
    shape[1] = k->cols * C;
    return 2;
}

/* Hugging Face's name of slot s (no prefix); with nano, nanoGPT's (the
 * registry's: "transformer." in front of all but lm_head). */
static const char *slot_name(int64_t s, bool nano, char *buf, size_t cap) {
    const char *pre = nano && s != S_LM_HEAD ? HF_PREFIX : "";
    if (s < S_GLOBAL) snprintf(buf, cap, "%s%s", pre, global_names[s]);
    else snprintf(buf, cap, "%sh.%lld.%s", pre, (long long)((s - S_GLOBAL) / KINDS),
                  slot_kind(s)->name);
    return buf;
}

static nb_tensor *slot_tensor(const nb_GPT *m, int64_t s) {
    switch (s) {
    case S_WTE: return m->wte.weight;
    case S_WPE: return m->wpe.weight;
    case S_LNF_W: return m->ln_f.weight;
    case S_LNF_B: return m->ln_f.bias;
    case S_LM_HEAD: return m->cfg.tie_weights ? NULL : m->lm_head.weight;
    default: break;
    }
    const nb_GPTBlock *b = &m->h[(s - S_GLOBAL) / KINDS];
    nb_tensor *const t[KINDS] = {b->ln_1.weight, b->ln_1.bias, b->c_attn.weight, b->c_attn.bias,
                                 b->attn_proj.weight, b->attn_proj.bias, b->ln_2.weight,
                                 b->ln_2.bias, b->c_fc.weight, b->c_fc.bias,
                                 b->mlp_proj.weight, b->mlp_proj.bias};
    return t[(s - S_GLOBAL) % KINDS];
}

static int64_t shape_numel(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    return n;
}

/* -------------------------------------------------------------- the model */
/* m is an initialized GPT whose every parameter is live, f32 or f64,
 * contiguous and of its config's shape: 0, or -1 with a message. */
static int check_model(const char *fn, const nb_GPT *m) {
    if (!m) return nn_error("%s: model is NULL", fn), -1;
    const nb_GPTConfig *c = &m->cfg;
    if (!m->h || !m->wte.weight || !m->lm_head.weight || c->n_layer <= 0 || c->n_embd <= 0 ||
        c->vocab_size <= 0 || c->block_size <= 0 || c->n_layer > HF_MAX_LAYERS)
        return nn_error("%s: model is not initialized (use nb_gpt_init)", fn), -1;
    if (c->tie_weights != (m->lm_head.weight == m->wte.weight))
        return nn_error("%s: the model's cfg.tie_weights is %s but lm_head.weight %s "
                        "transformer.wte.weight", fn, c->tie_weights ? "true" : "false",
                        c->tie_weights ? "is not" : "is"), -1;
    char name[96], a[64], b[64];
    for (int64_t s = 0; s < n_slots(c); s++) {
        if (!slot_present(c, s)) continue;
        nb_tensor *t = slot_tensor(m, s);
        slot_name(s, true, name, sizeof name);
        if (!t) return nn_error("%s: the model has no %s (cfg.bias is true)", fn, name), -1;
        if (nb_check_input(fn, t, 0) != 0)
            return nn_error("%s: the model's parameter %s is not a live tensor (was its "
                            "registry freed?)", fn, name), -1;
        nb_dtype dt = nb_dtype_of(t);
        if (dt != NB_F32 && dt != NB_F64)
            return nn_error("%s: the model's parameter %s is %s; expected f32 or f64", fn, name,
                            nb_dtype_name(dt)), -1;
        int64_t shape[2];
        int nd = slot_shape(c, s, shape);
        bool same = nb_ndim(t) == nd;
        for (int d = 0; same && d < nd; d++) same = nb_shape(t)[d] == shape[d];
        if (!same)
            return nn_error("%s: the model's parameter %s has shape %s, its config says %s", fn,
                            name, NN_SHAPE(a, t), nn_shape_str(b, sizeof b, nd, shape)), -1;
        if (!nb_is_contiguous(t))
            return nn_error("%s: the model's parameter %s is not contiguous", fn, name), -1;
    }
    return 0;
}

/* ------------------------------------------------------------ conversions */
static size_t esize(nb_dtype d) { return d == NB_F64 ? 8 : 4; }

/* Element di of dst (ddt) = element si of src (sdt); same dtypes copy the bits. */
static void convert1(void *dst, nb_dtype ddt, size_t di, const void *src, nb_dtype sdt, size_t si) {
    if (ddt == sdt) {
        size_t z = esize(ddt);
        memcpy((unsigned char *)dst + di * z, (const unsigned char *)src + si * z, z);
    } else if (ddt == NB_F32) {
        ((float *)dst)[di] = (float)((const double *)src)[si];
    } else {
        ((double *)dst)[di] = (double)((const float *)src)[si];
    }
}

/* n elements, contiguous on both sides */
static void convert(void *dst, nb_dtype ddt, const void *src, nb_dtype sdt, size_t n) {
    if (ddt == sdt) {
        memcpy(dst, src, n * esize(ddt));
        return;
    }
    for (size_t i = 0; i < n; i++) convert1(dst, ddt, i, src, sdt, i);
}

/* --------------------------------------------------------------- reading */
typedef struct {
    const char *fn, *path;
    int fd;
    int64_t size;
} source;

/* n bytes at off: 0, or -1 with the reason in msg. */
static int read_at(const source *f, void *buf, size_t n, int64_t off, char *msg, size_t cap) {
    unsigned char *p = buf;
    while (n > 0) {
        ssize_t r = pread(f->fd, p, n, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            snprintf(msg, cap, "cannot read: %s",
                     r < 0 ? strerror(errno) : "the file shrank while being read");
            return -1;
        }
        p += r;
        off += r;
        n -= (size_t)r;
    }
    return 0;
}

/* Opens path (a regular file only: FIFOs and devices refused): 0, or -1 with
 * the message set. */
static int open_source(source *f, const char *fn, const char *path) {
    struct stat st;
    char msg[512];
    *f = (source){.fn = fn, .path = path, .fd = -1};
    f->fd = nn_open_regular(path, &st, msg, sizeof msg);
    if (f->fd < 0) return nn_error("%s: %s", fn, msg), -1;
    f->size = (int64_t)st.st_size;
    return 0;
}

static void close_source(source *f) {
    if (f->fd >= 0) close(f->fd);
    f->fd = -1;
}

/* The staging buffer: each present slot's values in its parameter's dtype. */
typedef struct {
    int64_t *off; /* per slot: byte offset in buf, or -1 */
    unsigned char *buf;
} staging;

static void staging_free(staging *st) {
    free(st->off);
    free(st->buf);
    *st = (staging){0};
}

static int staging_make(const nb_GPT *m, staging *st, char *msg, size_t cap) {
    int64_t n = n_slots(&m->cfg);
    uint64_t total = 0;
    *st = (staging){0};
    if (!(st->off = malloc((size_t)n * sizeof *st->off))) goto oom;
    for (int64_t s = 0; s < n; s++) {
        st->off[s] = -1;
        if (!slot_present(&m->cfg, s)) continue;
        nb_tensor *t = slot_tensor(m, s);
        st->off[s] = (int64_t)total;
        total += ((uint64_t)nb_numel(t) * esize(nb_dtype_of(t)) + 7) / 8 * 8; /* f64-aligned */
    }
    if (total > SIZE_MAX || !(st->buf = malloc(total ? (size_t)total : 1))) goto oom;
    return 0;
oom:
    snprintf(msg, cap, "out of memory (staging %llu bytes of weights)", (unsigned long long)total);
    staging_free(st);
    return -1;
}

/* n elements of dtype fdt at byte off of the file into dst (dtype ddt). With
 * cols > 0 the file holds an (n / cols, cols) matrix that dst holds
 * transposed. 0, or -1 with msg. */
static int read_values(const source *f, int64_t off, nb_dtype fdt, int64_t n, int64_t cols,
                       void *dst, nb_dtype ddt, void *chunk, char *msg, size_t cap) {
    size_t fz = esize(fdt);
    int64_t rows = cols > 0 ? n / cols : 0, r = 0, c = 0;
    for (int64_t at = 0; at < n; at += CHUNK) {
        int64_t k = n - at < CHUNK ? n - at : CHUNK;
        if (read_at(f, chunk, (size_t)k * fz, off + at * (int64_t)fz, msg, cap) != 0) return -1;
        nn_swap_le(chunk, (size_t)k, fz); /* file order -> memory */
        if (cols <= 0) {
            convert((unsigned char *)dst + (size_t)at * esize(ddt), ddt, chunk, fdt, (size_t)k);
            continue;
        }
        for (int64_t i = 0; i < k; i++) { /* file (r, c) -> dst (c, r) */
            convert1(dst, ddt, (size_t)(c * rows + r), chunk, fdt, (size_t)i);
            if (++c == cols) c = 0, r++;
        }
    }
    return 0;
}

/* Every present slot from staging into the model. Cannot fail. */
static void commit(const nb_GPT *m, const staging *st) {
    for (int64_t s = 0; s < n_slots(&m->cfg); s++) {
        if (st->off[s] < 0) continue;
        nb_tensor *t = slot_tensor(m, s);
        memcpy(nb_data(t), st->buf + st->off[s], (size_t)nb_numel(t) * esize(nb_dtype_of(t)));
        nb_mark_modified(t);
    }
}

/* ------------------------------------------------------------------ writing */
typedef struct {
    int fd;
    size_t n;
    unsigned char *buf; /* WBUF bytes */
} writer;
#define WBUF (1u << 16)

/* Writes out the buffered bytes: 0, or -1 with errno. */
static int flush(writer *w) {
    size_t done = 0;
    while (done < w->n) {
        ssize_t r = write(w->fd, w->buf + done, w->n - done);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            if (r == 0) errno = EIO;
            return -1;
        }
        done += (size_t)r;
    }
    w->n = 0;
    return 0;
}

static int put(writer *w, const void *p, size_t n) {
    const unsigned char *c = p;
    while (n > 0) {
        if (w->n == WBUF && flush(w) != 0) return -1;
        size_t k = WBUF - w->n < n ? WBUF - w->n : n;
        memcpy(w->buf + w->n, c, k);
        w->n += k;
        c += k;
        n -= k;
    }
    return 0;
}

/* t's values as dtype fdt, little-endian; a conv weight (out, in) is written
 * (in, out). */
static int put_tensor(writer *w, nb_tensor *t, nb_dtype fdt, bool conv) {
    nb_dtype dt = nb_dtype_of(t);
    const void *src = nb_data(t);
    int64_t n = nb_numel(t), out = conv ? nb_shape(t)[0] : 0, in = conv ? nb_shape(t)[1] : 0;
    int64_t r = 0, c = 0; /* the file's (r, c) is t's (c, r) */
    double chunk[CHUNK];
    for (int64_t at = 0; at < n; at += CHUNK) {
        int64_t k = n - at < CHUNK ? n - at : CHUNK;
        if (!conv) {
            convert(chunk, fdt, (const unsigned char *)src + (size_t)at * esize(dt), dt, (size_t)k);
        } else {
            for (int64_t i = 0; i < k; i++) {
                convert1(chunk, fdt, (size_t)i, src, dt, (size_t)(c * in + r));
                if (++c == out) c = 0, r++;
            }
        }
        nn_swap_le(chunk, (size_t)k, esize(fdt)); /* memory -> file order */
        if (put(w, chunk, (size_t)k * esize(fdt)) != 0) return -1;
    }
    return 0;
}

/* Writes path through a temporary beside it (fsync, rename): body writes the
 * contents. 0, or -1 with the message set. */
static int save_atomic(const char *fn, const char *path, int (*body)(writer *, void *), void *ctx) {
    nn_target t = {0};
    int e = nn_resolve(path, &t), rc = -1;
    nn_temp tmp = {.fd = -1};
    writer w = {.fd = -1};
    if (e != 0) {
        nn_error("%s: cannot write \"%s\": %s (the previous file, if any, is unchanged)", fn, path,
                 strerror(e));
        goto done;
    }
    nn_remove_stale_temps(t.dir);
    if (!(w.buf = malloc(WBUF))) {
        nn_error("%s: out of memory", fn);
        goto done;
    }
    if (nn_temp_open(&t, &tmp) != 0) {
        e = errno;
        nn_error("%s: cannot create a file next to \"%s\": %s", fn, path, strerror(e));
        goto done;
    }
    w.fd = tmp.fd;
    errno = 0;
    rc = body(&w, ctx) == 0 && flush(&w) == 0 ? 0 : -1;
    /* a failed fchmod (a file system without modes) leaves open()'s bits,
     * which are no wider than the old file's */
    if (rc == 0 && t.exists) fchmod(w.fd, t.mode & 0777);
    if (rc == 0 && fsync(w.fd) != 0) rc = -1;
    e = errno;
    if (nn_temp_finish(&tmp, &t, rc == 0) != 0 && rc == 0) rc = -1, e = errno;
    if (rc == 0)
        nn_sync_dir(t.dir);
    else
        nn_error("%s: cannot write \"%s\": %s (the previous file, if any, is unchanged)", fn, path,
                 strerror(e ? e : EIO));
done:
    free(w.buf);
    nn_target_free(&t);
    return rc;
}

/* ------------------------------------------------------------------- llm.c */
typedef struct {
    int32_t magic, version, max_seq_len, vocab_size, num_layers, num_heads, channels,
        padded_vocab_size;
} llmc_header;

static int32_t le32(const unsigned char *p) { return (int32_t)nn_ld_le32(p); }

/* a*b+c into *out, false on int64 overflow (or a negative operand) */
static bool mul_add(int64_t a, int64_t b, int64_t c, int64_t *out) {
    int64_t p;
    return a >= 0 && b >= 0 && c >= 0 && !__builtin_mul_overflow(a, b, &p) &&
           !__builtin_add_overflow(p, c, out);
}

/* The number of floats after the header, or -1 when it overflows. */
static int64_t llmc_floats(const nb_GPTConfig *c, int64_t Vp) {
    int64_t C = c->n_embd, per_layer, n;
    /* per layer: 12 C^2 + 13 C; then wte, wpe, ln_f */
    if (C > INT64_MAX / 16 || !mul_add(12 * C, C, 13 * C, &per_layer) ||
        !mul_add(per_layer, c->n_layer, 2 * C, &n) || !mul_add(Vp, C, n, &n) ||
        !mul_add(c->block_size, C, n, &n))
        return -1;
    return n;
}

/* The header's first 1024 bytes (head, fewer when the file is shorter)
 * against the file's size and, with want, a model's config: 0 with the
 * file's config and Vp, or -1 with the first problem in msg. */
static int llmc_check(const unsigned char *head, int64_t fsize, const nb_GPTConfig *want,
                      nb_GPTConfig *cfg, int64_t *Vp, char *msg, size_t cap) {
    if (fsize == 0) return snprintf(msg, cap, "file is empty (0 bytes)"), -1;
    if (fsize >= 4 && le32(head) != LLMC_MAGIC)
        return snprintf(msg, cap, "bad magic %ld (expected %d, llm.c's GPT-2 checkpoint)",
                        (long)le32(head), LLMC_MAGIC), -1;
    if (fsize < LLMC_HEADER_BYTES)
        return snprintf(msg, cap, "file is %lld bytes, shorter than llm.c's %d-byte header "
                        "(truncated)", (long long)fsize, LLMC_HEADER_BYTES), -1;
    llmc_header h;
    int32_t *f = &h.magic;
    for (int i = 0; i < 8; i++) f[i] = le32(head + 4 * i);
    if (h.version != LLMC_VERSION)
        return snprintf(msg, cap, "version %ld (expected %d)", (long)h.version, LLMC_VERSION), -1;
    static const char *const names[] = {"max_seq_len", "vocab_size", "num_layers", "num_heads",
                                        "channels", "padded_vocab_size"};
    for (int i = 0; i < 6; i++)
        if (f[2 + i] <= 0)
            return snprintf(msg, cap, "%s %ld in the header must be positive", names[i],
                            (long)f[2 + i]), -1;
    if (want) {
        const int64_t model[5] = {want->block_size, want->vocab_size, want->n_layer,
                                  want->n_head, want->n_embd};
        for (int i = 0; i < 5; i++)
            if (f[2 + i] != model[i])
                return snprintf(msg, cap, "%s %ld in the file, the model has %lld", names[i],
                                (long)f[2 + i], (long long)model[i]), -1;
    } else if (h.channels % h.num_heads != 0) {
        return snprintf(msg, cap, "channels %ld is not divisible by num_heads %ld",
                        (long)h.channels, (long)h.num_heads), -1;
    }
    if (h.padded_vocab_size < h.vocab_size)
        return snprintf(msg, cap, "padded_vocab_size %ld is smaller than vocab_size %ld",
                        (long)h.padded_vocab_size, (long)h.vocab_size), -1;
    *cfg = (nb_GPTConfig){.vocab_size = h.vocab_size, .block_size = h.max_seq_len,
                          .n_layer = h.num_layers, .n_head = h.num_heads, .n_embd = h.channels,
                          .dropout = 0.0, .bias = true, .tie_weights = true};
    *Vp = h.padded_vocab_size;
    int64_t floats = llmc_floats(cfg, *Vp), need;
    if (floats < 0 || !mul_add(floats, 4, LLMC_HEADER_BYTES, &need))
        return snprintf(msg, cap, "the header's sizes need more than 2^63 bytes"), -1;
    if (fsize < need)
        return snprintf(msg, cap, "file is %lld bytes, the header's sizes need %lld (truncated)",
                        (long long)fsize, (long long)need), -1;
    if (fsize > need)
        return snprintf(msg, cap, "file is %lld bytes, the header's sizes need %lld (%lld bytes "
                        "too many)", (long long)fsize, (long long)need,
                        (long long)(fsize - need)), -1;
    return 0;
}

/* Reads and checks the header of an open llm.c file: 0, or -1 with msg. */
static int llmc_read_header(const source *f, const nb_GPTConfig *want, nb_GPTConfig *cfg,
                            int64_t *Vp, char *msg, size_t cap) {
    unsigned char head[LLMC_HEADER_BYTES] = {0};
    int64_t n = f->size < LLMC_HEADER_BYTES ? f->size : LLMC_HEADER_BYTES;
    if (read_at(f, head, (size_t)n, 0, msg, cap) != 0) return -1;
    return llmc_check(head, f->size, want, cfg, Vp, msg, cap);
}

/* Byte offset in the file of slot s (a layer's slot: of layer i's part). */
static int64_t llmc_offset(const nb_GPTConfig *c, int64_t Vp, int64_t s) {
    int64_t C = c->n_embd, L = c->n_layer, at = Vp * C + c->block_size * C; /* past wte, wpe */
    if (s == S_WTE) return LLMC_HEADER_BYTES;
    if (s == S_WPE) return LLMC_HEADER_BYTES + 4 * Vp * C;
    int64_t layer = s >= S_GLOBAL ? (s - S_GLOBAL) / KINDS : 0;
    int kk = s >= S_GLOBAL ? (int)((s - S_GLOBAL) % KINDS) : KINDS; /* ln_f after all kinds */
    for (int k = 0; k < kk; k++) {
        int64_t shape[2];
        int nd = slot_shape(c, S_GLOBAL + k, shape);
        at += L * shape_numel(nd, shape);
    }
    int64_t shape[2];
    int nd = s >= S_GLOBAL ? slot_shape(c, s, shape) : 0;
    at += s >= S_GLOBAL ? layer * shape_numel(nd, shape) : s == S_LNF_B ? C : 0;
    return LLMC_HEADER_BYTES + 4 * at;
}

static int load_llmc_body(nb_GPT *m, const char *path) {
    const char *fn = "nb_gpt_load_llmc";
    if (check_model(fn, m) != 0) return -1;
    if (!path) return nn_error("%s: path is NULL", fn), -1;
    if (!m->cfg.bias)
        return nn_error("%s: the model has no biases (cfg.bias false); llm.c's checkpoints "
                        "have them", fn), -1;
    nn_remove_stale_temps_beside(path); /* what saves killed there left */
    source f;
    if (open_source(&f, fn, path) != 0) return -1;
    char msg[400] = "";
    nb_GPTConfig cfg;
    int64_t Vp = 0;
    staging st = {0};
    void *chunk = NULL;
    int rc = llmc_read_header(&f, &m->cfg, &cfg, &Vp, msg, sizeof msg);
    if (rc == 0) rc = staging_make(m, &st, msg, sizeof msg);
    if (rc == 0 && !(chunk = malloc(CHUNK * sizeof(double))))
        rc = -1, snprintf(msg, sizeof msg, "out of memory");
    for (int64_t s = 0; rc == 0 && s < n_slots(&cfg); s++) {
        if (s == S_LM_HEAD) continue; /* llm.c's lm_head is wte */
        nb_tensor *t = slot_tensor(m, s);
        rc = read_values(&f, llmc_offset(&cfg, Vp, s), NB_F32, nb_numel(t), 0,
                         st.buf + st.off[s], nb_dtype_of(t), chunk, msg, sizeof msg);
    }
    if (rc == 0) {
        if (!m->cfg.tie_weights) /* untied: lm_head starts as a copy of wte */
            convert(st.buf + st.off[S_LM_HEAD], nb_dtype_of(m->lm_head.weight),
                    st.buf + st.off[S_WTE], nb_dtype_of(m->wte.weight),
                    (size_t)nb_numel(m->wte.weight));
        commit(m, &st);
    } else {
        nn_error("%s: \"%s\": %s", fn, path, msg);
    }
    free(chunk);
    staging_free(&st);
    close_source(&f);
    return rc;
}

int nb_gpt_load_llmc(nb_GPT *m, const char *path) {
    nn_enter();
    return nn_leave_rc("nb_gpt_load_llmc", load_llmc_body(m, path));
}

static int llmc_body(writer *w, void *ctx) {
    const nb_GPT *m = ctx;
    const nb_GPTConfig *c = &m->cfg;
    int64_t V = c->vocab_size, C = c->n_embd;
    int64_t Vp = (V + LLMC_VOCAB_ROUND - 1) / LLMC_VOCAB_ROUND * LLMC_VOCAB_ROUND;
    unsigned char head[LLMC_HEADER_BYTES] = {0};
    const int64_t v[8] = {LLMC_MAGIC, LLMC_VERSION, c->block_size, V, c->n_layer, c->n_head, C, Vp};
    for (int i = 0; i < 8; i++) nn_st_le32(head + 4 * i, (uint32_t)v[i]);
    if (put(w, head, sizeof head) != 0 || put_tensor(w, m->wte.weight, NB_F32, false) != 0)
        return -1;
    static const float zeros[256];
    for (int64_t left = (Vp - V) * C; left > 0; left -= 256)
        if (put(w, zeros, (size_t)(left < 256 ? left : 256) * sizeof(float)) != 0) return -1;
    if (put_tensor(w, m->wpe.weight, NB_F32, false) != 0) return -1;
    for (int k = 0; k < KINDS; k++)
        for (int64_t i = 0; i < c->n_layer; i++)
            if (put_tensor(w, slot_tensor(m, S_GLOBAL + i * KINDS + k), NB_F32, false) != 0)
                return -1;
    return put_tensor(w, m->ln_f.weight, NB_F32, false) != 0 ||
           put_tensor(w, m->ln_f.bias, NB_F32, false) != 0 ? -1 : 0;
}

static int save_llmc_body(const nb_GPT *m, const char *path) {
    const char *fn = "nb_gpt_save_llmc";
    if (check_model(fn, m) != 0) return -1;
    if (!path) return nn_error("%s: path is NULL", fn), -1;
    const nb_GPTConfig *c = &m->cfg;
    if (!c->tie_weights)
        return nn_error("%s: the model is untied (cfg.tie_weights false); llm.c's checkpoint "
                        "ties lm_head.weight to transformer.wte.weight", fn), -1;
    if (!c->bias)
        return nn_error("%s: the model has no biases (cfg.bias false); llm.c's checkpoints "
                        "have them", fn), -1;
    int64_t Vp = (c->vocab_size + LLMC_VOCAB_ROUND - 1) / LLMC_VOCAB_ROUND * LLMC_VOCAB_ROUND;
    const int64_t v[6] = {c->block_size, c->vocab_size, c->n_layer, c->n_head, c->n_embd, Vp};
    static const char *const names[] = {"block_size", "vocab_size", "n_layer", "n_head",
                                        "n_embd", "padded vocab_size"};
    for (int i = 0; i < 6; i++)
        if (v[i] > INT32_MAX)
            return nn_error("%s: %s %lld does not fit llm.c's int32 header", fn, names[i],
                            (long long)v[i]), -1;
    return save_atomic(fn, path, llmc_body, (void *)m);
}

int nb_gpt_save_llmc(const nb_GPT *m, const char *path) {
    nn_enter();
    return nn_leave_rc("nb_gpt_save_llmc", save_llmc_body(m, path));
}

/* ------------------------------------------------ the head count's source */
/* What a Hugging Face file's tensors cannot say is its head count. nabla
 * writes its config into __metadata__ (string values: "n_layer", "n_head",
 * "n_embd", "vocab_size", "block_size"); Hugging Face keeps it in a
 * config.json beside the weights (n_layer, n_head, n_embd, vocab_size,
 * n_positions). Either is checked against the tensors' shapes (shape: a
 * config of the tensors' sizes); then n_head must divide n_embd. */
enum { K_LAYER, K_HEAD, K_EMBD, K_VOCAB, K_BLOCK, N_KEYS };
static const char *const meta_keys[N_KEYS] = {"n_layer", "n_head", "n_embd", "vocab_size",
                                             "block_size"};
static const char *const json_keys[N_KEYS] = {"n_layer", "n_head", "n_embd", "vocab_size",
                                             "n_positions"};

static int64_t cfg_size(const nb_GPTConfig *c, int k) {
    const int64_t v[N_KEYS] = {c->n_layer, c->n_head, c->n_embd, c->vocab_size, c->block_size};
    return v[k];
}

/* The sizes found (got[k] > 0; 0 when absent) against shape: 0, or -1 with
 * msg naming where they were: __metadata__ (json NULL) or the config.json
 * at json. */
static int stored_check(const int64_t got[N_KEYS], const char *json, const nb_GPTConfig *shape,
                        char *msg, size_t cap) {
    const char *const *keys = json ? json_keys : meta_keys;
    for (int k = 0; k < N_KEYS; k++) {
        if (k == K_HEAD || got[k] <= 0 || got[k] == cfg_size(shape, k)) continue;
        long long a = (long long)got[k], b = (long long)cfg_size(shape, k);
        if (json)
            snprintf(msg, cap, "the Hugging Face config \"%.300s\" says %s %lld, but the file's "
                     "tensors have %lld", json, keys[k], a, b);
        else
            snprintf(msg, cap, "its __metadata__ says %s %lld, but the file's tensors have %lld",
                     keys[k], a, b);
        return -1;
    }
    if (got[K_HEAD] <= 0 || shape->n_embd % got[K_HEAD] == 0) return 0;
    long long a = (long long)got[K_HEAD], b = (long long)shape->n_embd;
    if (json)
        snprintf(msg, cap, "the Hugging Face config \"%.300s\" says n_head %lld, which does not "
                 "divide n_embd %lld", json, a, b);
    else
        snprintf(msg, cap, "its __metadata__ says n_head %lld, which does not divide n_embd %lld",
                 a, b);
    return -1;
}

/* __metadata__'s sizes into got (0 when absent): 0, or -1 with msg. */
static int meta_sizes(const nn_st_header *h, int64_t got[N_KEYS], char *msg, size_t cap) {
    for (int k = 0; k < N_KEYS; k++) {
        got[k] = 0;
        int seen = 0;
        for (int i = 0; i < h->n_meta; i++) seen += !strcmp(h->meta[2 * i], meta_keys[k]);
        if (seen > 1)
            return snprintf(msg, cap, "its __metadata__ gives \"%s\" %d times", meta_keys[k],
                            seen), -1;
        const char *v = nn_st_header_meta(h, meta_keys[k]);
        if (!v) continue;
        int64_t x = 0;
        bool ok = *v >= '1' && *v <= '9';
        for (const char *p = v; ok && *p; p++)
            ok = *p >= '0' && *p <= '9' && x <= (INT32_MAX - (*p - '0')) / 10 &&
                 (x = x * 10 + (*p - '0'), true);
        if (!ok)
            return snprintf(msg, cap, "its __metadata__ \"%s\" is \"%.40s\", not a whole number "
                            "from 1 to %d", meta_keys[k], v, INT32_MAX), -1;
        got[k] = x;
    }
    return 0;
}

/* config.json in path's folder (the folder as path names it: Hugging Face's
 * cache links model.safetensors and config.json alike into a snapshot
 * folder) into where. */
static void config_json_path(const char *path, char *where, size_t cap) {
    const char *slash = strrchr(path, '/');
    if (slash) snprintf(where, cap, "%.*s/config.json", (int)(slash - path), path);
    else snprintf(where, cap, "config.json");
}

/* Reads the sizes of the config.json at where into got: 1 when it holds an
 * integer n_head, 0 when it is missing, unreadable, not JSON or has no
 * integer n_head (then it is not taken to be this file's config). */
static int config_json_sizes(const char *where, int64_t got[N_KEYS]) {
    struct stat st;
    char why[512];
    for (int k = 0; k < N_KEYS; k++) got[k] = 0;
    int fd = nn_open_regular(where, &st, why, sizeof why);
    if (fd < 0) return 0;
    char *text = st.st_size > 0 && st.st_size <= (16 << 20) ? malloc((size_t)st.st_size) : NULL;
    source f = {.fd = fd, .size = st.st_size};
    int rc = text && read_at(&f, text, (size_t)st.st_size, 0, why, sizeof why) == 0;
    close(fd);
    if (!rc) return free(text), 0;
    nn_json j;
    nn_json_init(&j, text, (size_t)st.st_size, "file");
    int more = nn_json_open(&j, '{');
    while (more == 1) {
        if (nn_json_string(&j) || nn_json_expect(&j, ':')) break;
        int k = 0;
        while (k < N_KEYS && strcmp(j.s, json_keys[k])) k++;
        char c = nn_json_peek(&j);
        int64_t x;
        if (k < N_KEYS && c >= '0' && c <= '9' && nn_json_int(&j, 1, INT32_MAX, &x) == 0)
            got[k] = x;
        else if (nn_json_skip(&j))
            break;
        more = nn_json_more(&j, '}');
    }
    rc = more == 0 && nn_json_end(&j) == 0 && got[K_HEAD] > 0;
    nn_json_free(&j);
    free(text);
    return rc;
}

/* The head count of a Hugging Face file whose tensors have the sizes of
 * shape: from its __metadata__, else a config.json beside it (its path in
 * json), else a guess (heads of 64, as every GPT-2 size; one head when 64
 * does not divide n_embd). 0, or -1 with msg. */
static int hf_heads(const nn_st_header *h, const char *path, const nb_GPTConfig *shape,
                    int64_t *n_head, nb_gpt_n_head_from *from, char *json, size_t jcap,
                    char *msg, size_t cap) {
    int64_t got[N_KEYS];
    if (meta_sizes(h, got, msg, cap) != 0 || stored_check(got, NULL, shape, msg, cap) != 0)
        return -1;
    if (got[K_HEAD] > 0) {
        *n_head = got[K_HEAD];
        *from = NB_GPT_N_HEAD_FILE;
        return 0;
    }
    config_json_path(path, json, jcap);
    if (config_json_sizes(json, got)) {
        if (stored_check(got, json, shape, msg, cap) != 0) return -1;
        *n_head = got[K_HEAD];
        *from = NB_GPT_N_HEAD_CONFIG_JSON;
        return 0;
    }
    *n_head = shape->n_embd % 64 == 0 ? shape->n_embd / 64 : 1;
    *from = NB_GPT_N_HEAD_GUESSED;
    return 0;
}

/* ------------------------------------------------------------ Hugging Face */
/* The slot of a Hugging Face name without its prefix: >= 0; -2 for the
 * attention-mask buffers (h.{i}.attn.bias, .attn.masked_bias); -1 for a name
 * that is no tensor of a GPT of L layers. *layer gets h.{i}'s i (-1 for none). */
static int64_t hf_slot(const char *c, int64_t L, int64_t *layer) {
    *layer = -1;
    for (int i = 0; i < S_GLOBAL; i++)
        if (!strcmp(c, global_names[i])) return i;
    if (strncmp(c, "h.", 2) != 0) return -1;
    const char *p = c + 2;
    if (*p < '0' || *p > '9' || (*p == '0' && p[1] >= '0' && p[1] <= '9')) return -1;
    int64_t i = 0;
    for (; *p >= '0' && *p <= '9'; p++)
        if ((i = i * 10 + (*p - '0')) >= HF_MAX_LAYERS) return -1;
    if (*p++ != '.') return -1;
    for (int k = 0; k < KINDS; k++)
        if (!strcmp(p, kinds[k].name)) {
            *layer = i;
            return i < L ? S_GLOBAL + i * KINDS + k : -1;
        }
    if (!strcmp(p, "attn.bias") || !strcmp(p, "attn.masked_bias")) return i < L ? -2 : -1;
    return -1;
}

static const char *hf_canon(const char *name) {
    return strncmp(name, HF_PREFIX, sizeof HF_PREFIX - 1) ? name : name + sizeof HF_PREFIX - 1;
}

/* The header's tensors against a config: file_of[s] gets the tensor of each
 * present slot. 0, or -1 with the first problem in msg (in file order:
 * unexpected names, dtypes, shapes; then missing names in slot order). */
static int hf_match(const nn_st_header *h, const nb_GPTConfig *c, int *file_of, char *msg,
                    size_t cap) {
    int64_t n = n_slots(c);
    char a[64], b[64], name[96];
    for (int64_t s = 0; s < n; s++) file_of[s] = -1;
    for (int i = 0; i < h->n; i++) {
        const nn_st_item *it = &h->v[i];
        int64_t layer, s = hf_slot(hf_canon(it->name), c->n_layer, &layer);
        if (s == -2 || (s == S_LM_HEAD && c->tie_weights)) continue; /* ignored */
        if (s < 0 || !slot_present(c, s))
            return snprintf(msg, cap, "unexpected tensor %.200s%s", it->name,
                            s >= 0 ? " (the model has no biases in its linear layers)"
                            : layer >= c->n_layer ? " (the model has fewer layers)" : ""), -1;
        if (file_of[s] >= 0)
            return snprintf(msg, cap, "%.150s and %.150s are the same tensor (with and "
                            "without the prefix " HF_PREFIX ")", h->v[file_of[s]].name,
                            it->name), -1;
        if (it->dtype != NB_F32 && it->dtype != NB_F64)
            return snprintf(msg, cap, "%.200s has dtype %s, expected F32 or F64", it->name,
                            it->foreign ? it->foreign : nn_st_dtype_tag(it->dtype)), -1;
        int64_t shape[2];
        int nd = slot_shape(c, s, shape);
        if (slot_conv(s)) { /* Conv1D: (in, out) */
            int64_t t = shape[0];
            shape[0] = shape[1], shape[1] = t;
        }
        bool same = it->ndim == nd;
        for (int d = 0; same && d < nd; d++) same = it->shape[d] == shape[d];
        if (!same)
            return snprintf(msg, cap, "%.200s has shape %s, expected %s", it->name,
                            nn_shape_str(a, sizeof a, it->ndim, it->shape),
                            nn_shape_str(b, sizeof b, nd, shape)), -1;
        file_of[s] = i;
    }
    for (int64_t s = 0; s < n; s++) /* a tied file's lm_head is its wte: copied on load */
        if (slot_present(c, s) && file_of[s] < 0 && s != S_LM_HEAD)
            return snprintf(msg, cap, "missing %s", slot_name(s, false, name, sizeof name)), -1;
    return 0;
}

/* Reads and parses the safetensors header of an open file into h: its size
 * in *hlen. 0, or -1 with msg. */
static int hf_read_header(const source *f, nn_st_header *h, uint64_t *hlen, char *msg,
                          size_t cap) {
    unsigned char len[8];
    if (f->size < 8)
        return snprintf(msg, cap, "file is %lld bytes, too short for a safetensors file (an "
                        "8-byte header size first)", (long long)f->size), -1;
    if (read_at(f, len, 8, 0, msg, cap) != 0) return -1;
    if (le32(len) == LLMC_MAGIC)
        return snprintf(msg, cap, "this is llm.c's checkpoint (magic %d), not a safetensors "
                        "file: use nb_gpt_load_llmc", LLMC_MAGIC), -1;
    *hlen = nn_ld_le64(len);
    uint64_t room = (uint64_t)f->size - 8;
    if (*hlen > room || *hlen > NN_ST_MAX_HEADER)
        return snprintf(msg, cap, "invalid safetensors header: header size %llu exceeds %s "
                        "(%llu bytes)", (unsigned long long)*hlen,
                        *hlen > room ? "the file" : "the 100 MiB limit",
                        (unsigned long long)(*hlen > room ? room : NN_ST_MAX_HEADER)), -1;
    char *text = malloc(*hlen ? (size_t)*hlen : 1);
    if (!text) return snprintf(msg, cap, "out of memory"), -1;
    int rc = read_at(f, text, (size_t)*hlen, 8, msg, cap);
    char why[320];
    if (rc == 0 && nn_st_header_parse_any(text, (size_t)*hlen, room - *hlen, h, why,
                                          sizeof why) != 0) {
        snprintf(msg, cap, "invalid safetensors header: %s", why);
        rc = -1;
    }
    free(text);
    return rc;
}

static int load_hf_body(nb_GPT *m, const char *path) {
    const char *fn = "nb_gpt_load_hf";
    if (check_model(fn, m) != 0) return -1;
    if (!path) return nn_error("%s: path is NULL", fn), -1;
    nn_remove_stale_temps_beside(path); /* what saves killed there left */
    source f;
    if (open_source(&f, fn, path) != 0) return -1;
    char msg[400] = "";
    nn_st_header h = {0};
    uint64_t hlen = 0;
    staging st = {0};
    void *chunk = NULL;
    int *file_of = malloc((size_t)n_slots(&m->cfg) * sizeof *file_of);
    int rc = file_of ? 0 : (snprintf(msg, sizeof msg, "out of memory"), -1);
    if (rc == 0) rc = hf_read_header(&f, &h, &hlen, msg, sizeof msg);
    if (rc == 0) rc = hf_match(&h, &m->cfg, file_of, msg, sizeof msg);
    if (rc == 0) { /* the one size the tensors do not show */
        int64_t heads;
        nb_gpt_n_head_from from;
        char json[4200];
        rc = hf_heads(&h, path, &m->cfg, &heads, &from, json, sizeof json, msg, sizeof msg);
        long long a = (long long)heads, b = (long long)m->cfg.n_head;
        if (rc == 0 && from == NB_GPT_N_HEAD_FILE && a != b)
            rc = -1, snprintf(msg, sizeof msg, "n_head %lld in its __metadata__, the model has "
                              "%lld", a, b);
        if (rc == 0 && from == NB_GPT_N_HEAD_CONFIG_JSON && a != b)
            rc = -1, snprintf(msg, sizeof msg, "n_head %lld in the Hugging Face config \"%.300s\", "
                              "the model has %lld", a, json, b);
    }
    if (rc == 0) rc = staging_make(m, &st, msg, sizeof msg);
    if (rc == 0 && !(chunk = malloc(CHUNK * sizeof(double))))
        rc = -1, snprintf(msg, sizeof msg, "out of memory");
    for (int64_t s = 0; rc == 0 && s < n_slots(&m->cfg); s++) {
        if (file_of[s] < 0) continue;
        const nn_st_item *it = &h.v[file_of[s]];
        nb_tensor *t = slot_tensor(m, s);
        rc = read_values(&f, (int64_t)(8 + hlen + it->begin), it->dtype, nb_numel(t),
                         slot_conv(s) ? it->shape[1] : 0, st.buf + st.off[s], nb_dtype_of(t),
                         chunk, msg, sizeof msg);
    }
    if (rc == 0 && !m->cfg.tie_weights && file_of[S_LM_HEAD] < 0) /* a tied file: wte */
        convert(st.buf + st.off[S_LM_HEAD], nb_dtype_of(m->lm_head.weight),
                st.buf + st.off[S_WTE], nb_dtype_of(m->wte.weight),
                (size_t)nb_numel(m->wte.weight));
    if (rc == 0) commit(m, &st);
    else nn_error("%s: \"%s\": %s", fn, path, msg);
    free(chunk);
    free(file_of);
    staging_free(&st);
    nn_st_header_free(&h);
    close_source(&f);
    return rc;
}

int nb_gpt_load_hf(nb_GPT *m, const char *path) {
    nn_enter();
    return nn_leave_rc("nb_gpt_load_hf", load_hf_body(m, path));
}

typedef struct {
    const nb_GPT *m;
    const char *header;
    size_t hlen;
} hf_ctx;

static int hf_body(writer *w, void *ctx) {
    const hf_ctx *x = ctx;
    unsigned char len[8];
    nn_st_le64(len, x->hlen);
    if (put(w, len, 8) != 0 || put(w, x->header, x->hlen) != 0) return -1;
    for (int64_t s = 0; s < n_slots(&x->m->cfg); s++) {
        if (!slot_present(&x->m->cfg, s)) continue;
        nb_tensor *t = slot_tensor(x->m, s);
        if (put_tensor(w, t, nb_dtype_of(t), slot_conv(s)) != 0) return -1;
    }
    return 0;
}

/* Written as GPT2LMHeadModel.save_pretrained writes: "transformer." names,
 * lm_head.weight only when untied, no attention-mask buffers; each tensor in
 * its parameter's dtype (F32, or F64 for an f64 model). */
static int save_hf_body(const nb_GPT *m, const char *path) {
    const char *fn = "nb_gpt_save_hf";
    if (check_model(fn, m) != 0) return -1;
    if (!path) return nn_error("%s: path is NULL", fn), -1;
    int64_t n = n_slots(&m->cfg), k = 0;
    nn_st_item *v = calloc((size_t)n, sizeof *v);
    char *names = NULL;
    size_t total = 0;
    char buf[96];
    for (int64_t s = 0; s < n; s++)
        total += strlen(slot_name(s, true, buf, sizeof buf)) + 1;
    if (v) names = malloc(total);
    hf_ctx x = {.m = m};
    char *header = NULL;
    int rc = -1;
    if (names) {
        char *p = names;
        for (int64_t s = 0; s < n; s++) {
            if (!slot_present(&m->cfg, s)) continue;
            nb_tensor *t = slot_tensor(m, s);
            nn_st_item *it = &v[k++];
            size_t len = strlen(slot_name(s, true, p, 96)) + 1;
            it->name = p;
            p += len;
            it->dtype = nb_dtype_of(t);
            it->ndim = slot_shape(&m->cfg, s, it->shape);
            if (slot_conv(s)) {
                int64_t tmp = it->shape[0];
                it->shape[0] = it->shape[1], it->shape[1] = tmp;
            }
        }
        /* what the tensors do not show (n_head), and the sizes beside it */
        char vals[N_KEYS][24];
        const char *meta[2 * N_KEYS];
        for (int i = 0; i < N_KEYS; i++) {
            snprintf(vals[i], sizeof vals[i], "%lld", (long long)cfg_size(&m->cfg, i));
            meta[2 * i] = meta_keys[i];
            meta[2 * i + 1] = vals[i];
        }
        header = nn_st_header_build_meta(v, (int)k, meta, N_KEYS, &x.hlen);
    }
    if (!header) {
        nn_error("%s: out of memory", fn);
    } else {
        x.header = header;
        rc = save_atomic(fn, path, hf_body, &x);
    }
    free(header);
    free(names);
    free(v);
    return rc;
}

int nb_gpt_save_hf(const nb_GPT *m, const char *path) {
    nn_enter();
    return nn_leave_rc("nb_gpt_save_hf", save_hf_body(m, path));
}

/* ---------------------------------------------------------- config_of_file */
/* The config of a Hugging Face header: from the shapes of wte and wpe, the
 * highest layer named, lm_head.weight (untied) and the linear biases; then
 * the whole header is matched against it. 0, or -1 with msg. */
static int hf_config(const nn_st_header *h, const char *path, nb_GPTConfig *cfg,
                     nb_gpt_n_head_from *from, char *msg, size_t cap) {
    int wte = -1, wpe = -1;
    bool lm_head = false, bias = false;
    int64_t layers = 0;
    char a[64];
    for (int i = 0; i < h->n; i++) {
        int64_t layer, s = hf_slot(hf_canon(h->v[i].name), HF_MAX_LAYERS, &layer);
        if (s == S_WTE) wte = i;
        if (s == S_WPE) wpe = i;
        if (s == S_LM_HEAD) lm_head = true;
        if (s >= S_GLOBAL && slot_kind(s)->linear_bias) bias = true;
        if (s >= S_GLOBAL && layer + 1 > layers) layers = layer + 1;
    }
    if (wte < 0 || wpe < 0) return snprintf(msg, cap, "missing %s", wte < 0 ? "wte.weight" : "wpe.weight"), -1;
    for (int k = 0; k < 2; k++) {
        const nn_st_item *it = &h->v[k ? wpe : wte];
        if (it->ndim != 2 || it->shape[0] <= 0 || it->shape[1] <= 0)
            return snprintf(msg, cap, "%.200s has shape %s, expected (%s, n_embd) of positive "
                            "sizes", it->name, nn_shape_str(a, sizeof a, it->ndim, it->shape),
                            k ? "block_size" : "vocab_size"), -1;
    }
    if (layers == 0) return snprintf(msg, cap, "no layers (missing h.0.ln_1.weight)"), -1;
    int64_t C = h->v[wte].shape[1];
    *cfg = (nb_GPTConfig){.vocab_size = h->v[wte].shape[0], .block_size = h->v[wpe].shape[0],
                          .n_layer = layers, .n_embd = C, .dropout = 0.0, .bias = bias,
                          .tie_weights = !lm_head};
    int *file_of = malloc((size_t)n_slots(cfg) * sizeof *file_of);
    if (!file_of) return snprintf(msg, cap, "out of memory"), -1;
    int rc = hf_match(h, cfg, file_of, msg, cap);
    free(file_of);
    char json[4200];
    if (rc == 0) rc = hf_heads(h, path, cfg, &cfg->n_head, from, json, sizeof json, msg, cap);
    return rc;
}

static int config_of_file_body(const char *fn, const char *path, nb_GPTConfig *cfg,
                               nb_gpt_n_head_from *from_out) {
    if (!path || !cfg) return nn_error("%s: %s is NULL", fn, path ? "cfg" : "path"), -1;
    nb_gpt_n_head_from from = NB_GPT_N_HEAD_FILE;
    source f;
    if (open_source(&f, fn, path) != 0) return -1;
    char msg[400] = "";
    unsigned char magic[4];
    nb_GPTConfig out;
    int rc = f.size >= 4 ? read_at(&f, magic, 4, 0, msg, sizeof msg) : 0;
    if (rc == 0 && f.size >= 4 && le32(magic) == LLMC_MAGIC) {
        int64_t Vp;
        rc = llmc_read_header(&f, NULL, &out, &Vp, msg, sizeof msg);
        if (rc != 0) nn_error("%s: %s: llm.c's checkpoint: %s", fn, path, msg);
    } else if (rc == 0) {
        nn_st_header h = {0};
        uint64_t hlen;
        if (hf_read_header(&f, &h, &hlen, msg, sizeof msg) != 0) {
            rc = -1;
            nn_error("%s: %s: neither llm.c's checkpoint (magic %d) nor a safetensors file: %s",
                     fn, path, LLMC_MAGIC, msg);
        } else if ((rc = hf_config(&h, path, &out, &from, msg, sizeof msg)) != 0) {
            nn_error("%s: \"%s\": %s", fn, path, msg);
        }
        nn_st_header_free(&h);
    } else {
        nn_error("%s: \"%s\": %s", fn, path, msg);
    }
    close_source(&f);
    if (rc == 0) *cfg = out;
    if (rc == 0 && from_out) *from_out = from;
    return rc;
}

int nb_gpt_config_of_file(const char *path, nb_GPTConfig *cfg) {
    nn_enter();
    const char *fn = "nb_gpt_config_of_file";
    return nn_leave_rc(fn, config_of_file_body(fn, path, cfg, NULL));
}

int nb_gpt_inspect(const char *path, nb_GPTConfig *cfg, nb_gpt_n_head_from *from) {
    nn_enter();
    const char *fn = "nb_gpt_inspect";
    return nn_leave_rc(fn, config_of_file_body(fn, path, cfg, from));
}

static int from_file_body(nb_GPT *m, nb_params *ps, const char *path) {
    const char *fn = "nb_gpt_from_file";
    if (!m || !ps) return nn_error("%s: model or registry is NULL", fn), -1;
    *m = (nb_GPT){0};
    nb_GPTConfig cfg;
    if (nb_gpt_config_of_file(path, &cfg) != 0 || nn_gpt_make(m, ps, &cfg, NULL, false) != 0)
        return -1;
    FILE *f = fopen(path, "rb");
    unsigned char magic[4] = {0};
    bool llmc = f && fread(magic, 1, 4, f) == 4 && le32(magic) == LLMC_MAGIC;
    if (f) fclose(f);
    if ((llmc ? nb_gpt_load_llmc : nb_gpt_load_hf)(m, path) != 0) {
        nb_gpt_free(m);
        return -1;
    }
    return 0;
}

int nb_gpt_from_file(nb_GPT *m, nb_params *ps, const char *path) {
    nn_enter();
    return nn_leave_rc("nb_gpt_from_file", from_file_body(m, ps, path));
}
