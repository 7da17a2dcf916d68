/* replay.c: runs fuzz_ops.c on every file of a directory, without libFuzzer
 * or sanitizers (make test: replay fuzz/corpus/ops), and checks coverage: each
 * op of ops/registry.h must have run at least once with a valid call whose
 * result passed the reference's checks. A mismatch aborts inside fuzz_ops.c;
 * a registered op that never ran is named here, and the exit status is 1.
 *
 * Usage: replay DIR */
#include <dirent.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops_program.h"

/* The whole file, or NULL; *n its size. */
static unsigned char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, len = 0;
    unsigned char *b = malloc(cap);
    for (size_t got; b && (got = fread(b + len, 1, cap - len, f)) > 0;) {
        len += got;
        if (len == cap) {
            unsigned char *bigger = realloc(b, cap *= 2);
            if (!bigger) free(b);
            b = bigger;
        }
    }
    bool bad = ferror(f);
    fclose(f);
    if (bad) free(b);
    *n = len;
    return bad ? NULL : b;
}

/* Replays every regular file of dir (in readdir's order: each program
 * starts afresh, so order does not matter); the count, or -1. */
static int replay_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) {
        perror(dir);
        return -1;
    }
    int programs = 0;
    for (struct dirent *ent; (ent = readdir(d));) {
        if (ent->d_name[0] == '.') continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, ent->d_name);
        size_t n;
        unsigned char *b = slurp(path, &n);
        if (!b) {
            perror(path);
            closedir(d);
            return -1;
        }
        LLVMFuzzerTestOneInput(b, n);
        free(b);
        programs++;
    }
    closedir(d);
    return programs;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: replay DIR\n");
        return 2;
    }
    LLVMFuzzerInitialize(&argc, &argv);
    int programs = replay_dir(argv[1]);
    if (programs < 0) return 1;
    int ran = 0;
    for (unsigned op = 0; op < OP_REGISTERED; op++) {
        if (fuzz_ops_succeeded(op) > 0) ran++;
        else fprintf(stderr, "fuzz replay: %s never ran successfully\n", fuzz_ops_name(op));
    }
    if (ran < OP_REGISTERED) {
        fprintf(stderr, "fuzz replay: %d programs, %d of %d registered ops ran; add seeds "
                        "(fuzz/gen_seeds.c, make fuzz-seeds)\n", programs, ran, OP_REGISTERED);
        return 1;
    }
    printf("fuzz replay: %d programs, every registered op ran (%d/%d)\n", programs, ran,
           OP_REGISTERED);
    return 0;
}
