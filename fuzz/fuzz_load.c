/* fuzz_load.c: libFuzzer target for nb_load (nn/checkpoint.c and the
 * safetensors header parser in nn/safetensors.c).
 *
 * Each input is written to a file and loaded into a registry with every dtype
 * (see load_registry.h), reset to its sentinel values first. Checked:
 * - a failed load changes no tensor (bit for bit) and leaves a message that
 *   starts with "nb_load: ";
 * - a successful load leaves only 0/1 in the BOOL buffers, and nb_save of the
 *   result loads back to the same bits;
 * - no tensor object leaks (nb_live_tensors() is the same after every input).
 * Any violation aborts, which libFuzzer reports as a crash. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

/* /dev/shm when it is there (nb_save fsyncs; tmpfs makes that free), else /tmp;
 * NABLA_FUZZ_TMPDIR overrides. One pair of files per process. */
static void make_paths(void) {
    const char *dir = getenv("NABLA_FUZZ_TMPDIR");
    struct stat st;
    if (!dir) dir = stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) && !access("/dev/shm", W_OK)
                        ? "/dev/shm" : "/tmp";
    snprintf(path_in, sizeof path_in, "%s/nabla-fuzz-load-%ld.safetensors", dir, (long)getpid());
    snprintf(path_out, sizeof path_out, "%s/nabla-fuzz-save-%ld.safetensors", dir, (long)getpid());
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

static void write_input(const uint8_t *data, size_t size) {
    FILE *f = fopen(path_in, "wb");
    CHECK(f != NULL, "cannot create %s", path_in);
    CHECK(fwrite(data, 1, size, f) == size && fclose(f) == 0, "cannot write %s", path_in);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    write_input(data, size);
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
    return 0;
}
