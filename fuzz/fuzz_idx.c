/* fuzz_idx.c: libFuzzer target for nb_load_idx (nn/formats/idx.c).
 *
 * Each input is written to a file as it is and loaded as f32, f64 and i64.
 * Checked, against a reading of the format written here apart from idx.c:
 * - a load succeeds exactly when the header is valid (two zero bytes, a known
 *   type byte, 1 to 8 dims), the file's size is the header's plus the
 *   sizes' product times the type's width, and every value is exact in the
 *   dtype; then the shape is the header's and each element equals the
 *   value read here (NaN for NaN);
 * - a failure leaves a message that starts with "nb_load_idx: ";
 * - no tensor object leaks (nb_live_tensors() is the same after every input).
 * Any violation aborts, which libFuzzer reports as a crash. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz_files.h"
#include "nabla.h"

static int64_t live_baseline;
static char path_in[256], path_out[256];

#define CHECK(cond, ...)                                                          \
    do {                                                                          \
        if (!(cond)) {                                                            \
            fprintf(stderr, "fuzz_idx: check failed: %s: ", #cond);               \
            fprintf(stderr, __VA_ARGS__);                                         \
            fprintf(stderr, "\n");                                                \
            abort();                                                              \
        }                                                                         \
    } while (0)

static void remove_files(void) { unlink(path_in); }

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    setenv("NABLA_NUM_THREADS", "1", 0);
    setenv("NABLA_CACHE_MB", "0", 0);
    fuzz_paths("idx", path_in, sizeof path_in, path_out, sizeof path_out);
    atexit(remove_files);
    live_baseline = nb_live_tensors();
    return 0;
}

/* The type byte's width (0: not a type) */
static int width_of(uint8_t code) {
    switch (code) {
    case 0x08: case 0x09: return 1;
    case 0x0B: return 2;
    case 0x0C: case 0x0D: return 4;
    case 0x0E: return 8;
    default: return 0;
    }
}

/* Value i of the data as a double (big-endian) */
static double value_at(const uint8_t *d, uint8_t code, int64_t i) {
    int w = width_of(code);
    uint64_t u = 0;
    for (int k = 0; k < w; k++) u = u << 8 | d[i * w + k];
    if (code == 0x08) return (double)u;
    if (code == 0x09) return (double)(int8_t)u;
    if (code == 0x0B) return (double)(int16_t)u;
    if (code == 0x0C) return (double)(int32_t)u;
    if (code == 0x0D) {
        uint32_t b = (uint32_t)u;
        float f;
        memcpy(&f, &b, 4);
        return f;
    }
    double x;
    memcpy(&x, &u, 8);
    return x;
}

static bool exact_in(double v, nb_dtype dt) {
    if (dt == NB_F64) return true;
    if (dt == NB_F32) return isnan(v) || (double)(float)v == v;
    return v == floor(v) && v >= -9223372036854775808.0 && v < 9223372036854775808.0;
}

/* Whether the file should load as dt, by the format's rules */
static bool expect_ok(const uint8_t *d, size_t n, nb_dtype dt) {
    if (n < 4 || d[0] || d[1] || !width_of(d[2]) || d[3] < 1 || d[3] > 8) return false;
    size_t head = 4 + 4 * (size_t)d[3];
    if (n < head) return false;
    /* the product of the nonzero sizes times the widest type's 8 bytes
     * stays below 2^63 (a tensor's strides multiply them) */
    unsigned __int128 numel = 1, nonzero = 1;
    for (int k = 0; k < d[3]; k++) {
        const uint8_t *p = d + 4 + 4 * k;
        uint32_t s = (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
        numel *= s;
        nonzero *= s ? s : 1;
        if (nonzero * 8 > (unsigned __int128)INT64_MAX) return false;
    }
    if (numel * (unsigned)width_of(d[2]) + head != n) return false;
    for (int64_t i = 0; i < (int64_t)numel; i++)
        if (!exact_in(value_at(d + head, d[2], i), dt)) return false;
    return true;
}

static void check_tensor(nb_tensor *t, const uint8_t *d, nb_dtype dt) {
    int nd = d[3];
    CHECK(nb_ndim(t) == nd, "ndim %d, header %d", nb_ndim(t), nd);
    for (int k = 0; k < nd; k++) {
        const uint8_t *p = d + 4 + 4 * k;
        int64_t s = (int64_t)((uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]);
        CHECK(nb_shape(t)[k] == s, "dim %d: %lld, header %lld", k, (long long)nb_shape(t)[k],
              (long long)s);
    }
    const uint8_t *data = d + 4 + 4 * nd;
    for (int64_t i = 0; i < nb_numel(t); i++) {
        double want = value_at(data, d[2], i);
        double got = dt == NB_F32   ? ((const float *)nb_data(t))[i]
                     : dt == NB_F64 ? ((const double *)nb_data(t))[i]
                                    : (double)((const int64_t *)nb_data(t))[i];
        CHECK(got == want || (isnan(got) && isnan(want)), "element %lld: %.17g, file %.17g",
              (long long)i, got, want);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_write_file(path_in, data, size);
    const nb_dtype dts[3] = {NB_F32, NB_F64, NB_I64};
    for (int k = 0; k < 3; k++) {
        nb_clear_error();
        nb_tensor *t = nb_load_idx(path_in, dts[k]);
        bool ok = expect_ok(data, size, dts[k]);
        CHECK((t != NULL) == ok, "as %s: %s, expected %s (%s)", nb_dtype_name(dts[k]),
              t ? "loaded" : "refused", ok ? "a load" : "a refusal",
              nb_last_error() ? nb_last_error() : "no message");
        if (t) {
            check_tensor(t, data, dts[k]);
            nb_free(t);
        } else {
            const char *m = nb_last_error();
            CHECK(m && !strncmp(m, "nb_load_idx: ", 13), "message \"%s\"", m ? m : "(none)");
        }
    }
    CHECK(nb_live_tensors() == live_baseline, "%lld tensors leaked",
          (long long)(nb_live_tensors() - live_baseline));
    return 0;
}
