/* fuzz_files.h: the file handling the loader harnesses (fuzz_load.c,
 * fuzz_gpt.c) share: where their two files go, writing an input to one, and
 * the "J<json>\0<data>" input form that lets the fuzzer edit a safetensors
 * header without keeping its size in step. A failure here aborts (the
 * fuzzer reports it as a crash); the library itself never does. */
#ifndef NABLA_FUZZ_FILES_H
#define NABLA_FUZZ_FILES_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define FUZZ_FILES_CHECK(cond, ...)                                                \
    do {                                                                           \
        if (!(cond)) {                                                             \
            fprintf(stderr, "fuzz: " __VA_ARGS__);                                 \
            fprintf(stderr, "\n");                                                 \
            abort();                                                               \
        }                                                                          \
    } while (0)

/* /dev/shm when it is there (saves fsync; tmpfs makes that free), else /tmp;
 * NABLA_FUZZ_TMPDIR overrides. The pair of files of this process, named
 * nabla-fuzz-<tag>-in-<pid> and ...-out-<pid>. */
static inline void fuzz_paths(const char *tag, char *in, size_t in_cap, char *out,
                              size_t out_cap) {
    const char *dir = getenv("NABLA_FUZZ_TMPDIR");
    struct stat st;
    if (!dir) dir = stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) && !access("/dev/shm", W_OK)
                        ? "/dev/shm" : "/tmp";
    snprintf(in, in_cap, "%s/nabla-fuzz-%s-in-%ld", dir, tag, (long)getpid());
    snprintf(out, out_cap, "%s/nabla-fuzz-%s-out-%ld", dir, tag, (long)getpid());
}

static inline void fuzz_write_file(const char *path, const uint8_t *data, size_t size) {
    FILE *f = fopen(path, "wb");
    FUZZ_FILES_CHECK(f != NULL, "cannot create %s", path);
    FUZZ_FILES_CHECK((size == 0 || fwrite(data, 1, size, f) == size) && fclose(f) == 0,
                     "cannot write %s", path);
}

/* The file for an input: the input itself, or, for an input "J<json>\0<data>",
 * the 8-byte header size, <json> and <data>. Malloc'ed; *n gets its size. */
static inline uint8_t *fuzz_file_of(const uint8_t *data, size_t size, size_t *n) {
    uint8_t *f = malloc(size + 8);
    FUZZ_FILES_CHECK(f != NULL, "out of memory");
    if (size == 0 || data[0] != 'J') {
        if (size) memcpy(f, data, size);
        *n = size;
        return f;
    }
    const uint8_t *nul = memchr(data + 1, 0, size - 1);
    size_t jl = nul ? (size_t)(nul - data - 1) : size - 1, rest = nul ? size - 2 - jl : 0;
    for (int i = 0; i < 8; i++) f[i] = (uint8_t)((uint64_t)jl >> (8 * i));
    memcpy(f + 8, data + 1, jl);
    if (rest) memcpy(f + 8 + jl, nul + 1, rest);
    *n = 8 + jl + rest;
    return f;
}

#endif
