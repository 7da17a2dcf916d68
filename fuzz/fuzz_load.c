/* fuzz_load.c: libFuzzer target for nb_load (nn/formats/checkpoint.c and the
 * safetensors header parser in nn/formats/safetensors.c).
 *
 * Each input is written to a file (as it is, or for "J<json>\0<data>" with
 * the header size computed) and loaded into a registry with every dtype (see
 * load_registry.h), reset to its sentinel values first. Checked:
 * - a failed load changes no tensor (bit for bit) and leaves a message that
 *   starts with "nb_load: ";
 * - a successful load leaves only 0/1 in the BOOL buffers, wrote the bytes
 *   the file has at each tensor's data_offsets (found by a second, strict
 *   JSON reading of the header written here, which must accept every header
 *   nb_load accepts), and nb_save of the result loads back to the same bits;
 * - no tensor object leaks (nb_live_tensors() is the same after every input).
 * Any violation aborts, which libFuzzer reports as a crash. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz_files.h"
#include "load_registry.h"

static fuzz_registry reg;
static int64_t live_baseline;
static char path_in[256], path_out[256];
static bool verbose;

#define CHECK(cond, ...)                                                          \
    do {                                                                          \
        if (!(cond)) {                                                            \
            fprintf(stderr, "fuzz_load: check failed: %s: ", #cond);              \
            fprintf(stderr, __VA_ARGS__);                                         \
            fprintf(stderr, "\n");                                                \
            abort();                                                              \
        }                                                                         \
    } while (0)

static void make_paths(void) {
    fuzz_paths("load", path_in, sizeof path_in, path_out, sizeof path_out);
}

static void remove_files(void) {
    unlink(path_in);
    unlink(path_out);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    setenv("NABLA_NUM_THREADS", "1", 0);
    setenv("NABLA_CACHE_MB", "0", 0); /* freed storage goes back to malloc: ASan sees reuse */
    make_paths();
    verbose = getenv("NABLA_FUZZ_VERBOSE") != NULL;
    atexit(remove_files);
    reg_build(&reg);
    live_baseline = nb_live_tensors();
    return 0;
}

/* ------------------------------------------------ a second, strict reading
 * of a header nb_load accepted: RFC 8259 JSON (numbers without leading
 * zeros), no member twice, no unknown tensor field, __metadata__ values
 * strings, the safetensors reference implementation's rules. It finds each
 * registry tensor's entry, whose bytes the loaded values must equal. Written
 * apart from nn/formats/safetensors.c. */
typedef struct {
    const unsigned char *p, *end;
} jr;

typedef struct {
    char name[256];
    bool long_name; /* longer than name[]: no registry name */
    char dtype[16];
    int ndim;
    uint64_t shape[16], begin, end;
} jentry;

static void jws(jr *j) {
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
        j->p++;
}

static bool jchar(jr *j, char c) {
    jws(j);
    if (j->p >= j->end || *j->p != (unsigned char)c) return false;
    j->p++;
    return true;
}

static bool jpeek(jr *j, char c) {
    jws(j);
    return j->p < j->end && *j->p == (unsigned char)c;
}

static int jhex4(jr *j) {
    if (j->end - j->p < 4) return -1;
    int v = 0;
    for (int i = 0; i < 4; i++) {
        int c = *j->p++, d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                           : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

/* A string, decoded to UTF-8 into out (cap bytes with the NUL); *trunc when
 * it did not fit. Lone surrogate escapes are refused, as serde_json does. */
static bool jstring(jr *j, char *out, size_t cap, bool *trunc) {
    size_t n = 0;
    *trunc = false;
    if (!jchar(j, '"')) return false;
    for (;;) {
        if (j->p >= j->end) return false;
        unsigned c = *j->p++;
        unsigned char u[4];
        size_t k = 0;
        if (c == '"') break;
        if (c < 0x20) return false;
        if (c != '\\') {
            u[k++] = (unsigned char)c;
        } else {
            if (j->p >= j->end) return false;
            c = *j->p++;
            const char *esc = strchr("\"\\/bfnrt", (int)c);
            if (esc && c) {
                u[k++] = (unsigned char)"\"\\/\b\f\n\r\t"[esc - "\"\\/bfnrt"];
            } else if (c == 'u') {
                int cp = jhex4(j);
                if (cp < 0 || (cp >= 0xDC00 && cp < 0xE000)) return false;
                if (cp >= 0xD800 && cp < 0xDC00) {
                    if (j->end - j->p < 2 || j->p[0] != '\\' || j->p[1] != 'u') return false;
                    j->p += 2;
                    int lo = jhex4(j);
                    if (lo < 0xDC00 || lo >= 0xE000) return false;
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                }
                if (cp < 0x80) u[k++] = (unsigned char)cp;
                else if (cp < 0x800) u[k++] = (unsigned char)(0xC0 | cp >> 6),
                                     u[k++] = (unsigned char)(0x80 | (cp & 63));
                else if (cp < 0x10000) u[k++] = (unsigned char)(0xE0 | cp >> 12),
                                       u[k++] = (unsigned char)(0x80 | (cp >> 6 & 63)),
                                       u[k++] = (unsigned char)(0x80 | (cp & 63));
                else u[k++] = (unsigned char)(0xF0 | cp >> 18),
                     u[k++] = (unsigned char)(0x80 | (cp >> 12 & 63)),
                     u[k++] = (unsigned char)(0x80 | (cp >> 6 & 63)),
                     u[k++] = (unsigned char)(0x80 | (cp & 63));
            } else {
                return false;
            }
        }
        for (size_t i = 0; i < k; i++) {
            if (n + 1 < cap) out[n++] = (char)u[i];
            else *trunc = true;
        }
    }
    out[n] = 0;
    return true;
}

/* An unsigned integer as JSON writes one: 0, or no leading zero; no fraction. */
static bool juint(jr *j, uint64_t *v) {
    jws(j);
    if (j->p >= j->end || *j->p < '0' || *j->p > '9') return false;
    if (*j->p == '0' && j->end - j->p > 1 && j->p[1] >= '0' && j->p[1] <= '9') return false;
    *v = 0;
    while (j->p < j->end && *j->p >= '0' && *j->p <= '9') {
        if (*v > (UINT64_MAX - 9) / 10) return false;
        *v = *v * 10 + (uint64_t)(*j->p++ - '0');
    }
    return j->p >= j->end || (*j->p != '.' && *j->p != 'e' && *j->p != 'E');
}

static bool juints(jr *j, uint64_t *v, int max, int *n) {
    *n = 0;
    if (!jchar(j, '[')) return false;
    if (jchar(j, ']')) return true;
    do {
        if (*n == max || !juint(j, &v[(*n)++])) return false;
    } while (jchar(j, ','));
    return jchar(j, ']');
}

static bool jtensor(jr *j, jentry *e) {
    unsigned seen = 0;
    if (!jchar(j, '{')) return false;
    if (jchar(j, '}')) return false; /* no fields */
    do {
        char key[32];
        bool trunc;
        if (!jstring(j, key, sizeof key, &trunc) || !jchar(j, ':')) return false;
        unsigned bit = !strcmp(key, "dtype") ? 1 : !strcmp(key, "shape") ? 2
                     : !strcmp(key, "data_offsets") ? 4 : 0;
        if (!bit || trunc || (seen & bit)) return false; /* unknown or repeated */
        seen |= bit;
        int n;
        uint64_t off[2];
        if (bit == 1 && !jstring(j, e->dtype, sizeof e->dtype, &trunc)) return false;
        if (bit == 2 && !juints(j, e->shape, 16, &e->ndim)) return false;
        if (bit == 4 && (!juints(j, off, 2, &n) || n != 2)) return false;
        if (bit == 4) e->begin = off[0], e->end = off[1];
    } while (jchar(j, ','));
    return jchar(j, '}') && seen == 7;
}

/* The header's tensors into v (at most max); -1 where strict JSON says no. */
static int jheader(const unsigned char *text, size_t len, jentry *v, int max) {
    jr j = {text, text + len};
    int n = 0;
    bool meta = false;
    if (!jchar(&j, '{')) return -1;
    if (!jchar(&j, '}')) {
        do {
            char key[256];
            bool trunc;
            if (!jstring(&j, key, sizeof key, &trunc) || !jchar(&j, ':')) return -1;
            if (!trunc && !strcmp(key, "__metadata__")) {
                if (meta || !jchar(&j, '{')) return -1;
                meta = true;
                if (!jchar(&j, '}')) {
                    do {
                        char k2[8], v2[8];
                        if (!jstring(&j, k2, sizeof k2, &trunc) || !jchar(&j, ':') ||
                            !jpeek(&j, '"') || !jstring(&j, v2, sizeof v2, &trunc))
                            return -1;
                    } while (jchar(&j, ','));
                    if (!jchar(&j, '}')) return -1;
                }
                continue;
            }
            if (n == max) return -1;
            jentry *e = &v[n++];
            memset(e, 0, sizeof *e);
            memcpy(e->name, key, sizeof key < sizeof e->name ? sizeof key : sizeof e->name);
            e->long_name = trunc;
            for (int i = 0; i < n - 1; i++)
                if (!trunc && !v[i].long_name && !strcmp(v[i].name, key)) return -1;
            if (!jtensor(&j, e)) return -1;
        } while (jchar(&j, ','));
        if (!jchar(&j, '}')) return -1;
    }
    jws(&j);
    return j.p == j.end ? n : -1;
}

/* The values of a successful load are the file's bytes (bools as 0/1). */
static void check_loaded_values(const uint8_t *data, size_t size,
                                unsigned char after[REG_MAX][64]) {
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | data[i];
    CHECK(size >= 8 && hlen <= size - 8, "accepted a header of %llu bytes in %zu",
          (unsigned long long)hlen, size);
    static jentry v[64];
    int n = jheader(data + 8, (size_t)hlen, v, 64);
    CHECK(n >= 0, "nb_load accepted a header that is not strict JSON / safetensors "
                  "(a leading zero, a member twice, an unknown field, ...)");
    CHECK(n == reg.n, "the file has %d tensors, the registry %d", n, reg.n);
    const uint8_t *section = data + 8 + hlen;
    for (int i = 0; i < reg.n; i++) {
        int k = 0;
        while (k < n && (v[k].long_name || strcmp(v[k].name, reg.name[i]))) k++;
        CHECK(k < n, "tensor \"%s\" loaded but not in the header", reg.name[i]);
        CHECK(v[k].end - v[k].begin == reg.nbytes[i] && v[k].end <= size - 8 - hlen,
              "tensor \"%s\": data_offsets [%llu, %llu] for %zu bytes", reg.name[i],
              (unsigned long long)v[k].begin, (unsigned long long)v[k].end, reg.nbytes[i]);
        bool is_bool = nb_dtype_of(reg.t[i]) == NB_BOOL;
        for (size_t b = 0; b < reg.nbytes[i]; b++) {
            unsigned char want = section[v[k].begin + b];
            if (is_bool) want = want != 0;
            CHECK(after[i][b] == want, "tensor \"%s\" byte %zu is %u, the file's %u", reg.name[i],
                  b, after[i][b], want);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *input, size_t input_size) {
    size_t size;
    uint8_t *data = fuzz_file_of(input, input_size, &size);
    fuzz_write_file(path_in, data, size);
    reg_set_sentinels(&reg);
    static unsigned char before[REG_MAX][64], after[REG_MAX][64], again[REG_MAX][64];
    reg_snapshot(&reg, before);
    nb_clear_error();

    int rc = nb_load(reg.ps, path_in);
    reg_snapshot(&reg, after);
    if (verbose) /* NABLA_FUZZ_VERBOSE=1: what each input did */
        fprintf(stderr, "fuzz_load: %zu bytes: %s\n", size, rc ? nb_last_error() : "loaded");
    if (rc != 0) {
        CHECK(rc == -1, "nb_load returned %d", rc);
        const char *msg = nb_last_error();
        CHECK(msg != NULL, "a failed load set no message");
        CHECK(!strncmp(msg, "nb_load: ", 9), "message \"%s\"", msg);
        for (int i = 0; i < reg.n; i++)
            CHECK(!memcmp(before[i], after[i], reg.nbytes[i]),
                  "failed load (%s) changed tensor \"%s\"", msg, reg.name[i]);
    } else {
        check_loaded_values(data, size, after);
        for (int i = 0; i < reg.n; i++)
            if (nb_dtype_of(reg.t[i]) == NB_BOOL)
                for (size_t b = 0; b < reg.nbytes[i]; b++)
                    CHECK(after[i][b] <= 1, "bool buffer \"%s\" holds %u at byte %zu",
                          reg.name[i], after[i][b], b);
        /* save what was loaded, reset, load that: the same bits */
        CHECK(nb_save(reg.ps, path_out) == 0, "re-save: %s", nb_last_error());
        reg_set_sentinels(&reg);
        CHECK(nb_load(reg.ps, path_out) == 0, "re-load: %s", nb_last_error());
        reg_snapshot(&reg, again);
        for (int i = 0; i < reg.n; i++)
            CHECK(!memcmp(after[i], again[i], reg.nbytes[i]),
                  "tensor \"%s\" differs after save + load", reg.name[i]);
    }
    nb_clear_error();
    CHECK(nb_live_tensors() == live_baseline, "live tensors %lld, baseline %lld",
          (long long)nb_live_tensors(), (long long)live_baseline);
    CHECK(nb_scope_depth() == 0, "scope depth %d", nb_scope_depth());
    free(data);
    remove_files(); /* libFuzzer may leave by _Exit, past atexit */
    return 0;
}
