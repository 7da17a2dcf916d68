/* tokenize.c: GPT-2's tokenizer from the command line (nb_tokenizer).
 *
 *   build/examples/tokenize --tokenizer PATH [--decode] [--out FILE] [--in FILE]
 *
 * Reads standard input (or --in FILE). By default encodes it (all of it, as bytes) and
 * prints the ids on one line, separated by single spaces; --out FILE writes
 * llm.c's token file instead (a header of 256 int32 LE: 20240520, 1, the
 * count; then the ids as uint16 LE), which examples/gpt and nb_load_tokens
 * read. --decode reads whitespace-separated ids and writes their bytes.
 * PATH: a tokenizer.json, a vocab.json (merges.txt beside it), an
 * encoder.json (vocab.bpe beside it), or llm.c's gpt2_tokenizer.bin
 * (decoding only). Errors go to standard error, exit status 1. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nabla.h"

static void usage(FILE *f, const char *prog) {
    fprintf(f,
            "usage: %s --tokenizer PATH [--decode] [--out FILE] [--in FILE] < input\n"
            "  GPT-2's byte-level BPE tokenizer (docs/tokenizer.md).\n"
            "  --tokenizer PATH  tokenizer.json, vocab.json (+ merges.txt beside it),\n"
            "                    encoder.json (+ vocab.bpe beside it), or llm.c's\n"
            "                    gpt2_tokenizer.bin (decoding only)\n"
            "  (default)         encode standard input; print the ids on one line\n"
            "  --out FILE        write llm.c's token file (uint16 ids) to FILE instead\n"
            "  --decode          read whitespace-separated ids; write their bytes\n"
            "  --in FILE         read FILE instead of standard input\n"
            "  --help            this text\n"
            "example: echo 'Hello, world' | %s --tokenizer encoder.json\n"
            "         -> 15496 11 995 198\n",
            prog, prog);
}

static int fail(const char *fmt, const char *a, const char *b) {
    fprintf(stderr, "tokenize: ");
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, "\n");
    return 1;
}

/* All of standard input (malloc'ed; *n bytes), or NULL. */
static char *read_stdin(int64_t *n) {
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t r = fread(buf + len, 1, cap - len, stdin);
        len += r;
        if (len < cap) break;
        char *b = realloc(buf, cap * 2);
        if (!b) free(buf);
        buf = b, cap *= 2;
    }
    if (buf && ferror(stdin)) free(buf), buf = NULL;
    *n = (int64_t)len;
    return buf;
}

static void put_le(unsigned char *p, uint32_t v, int bytes) {
    for (int i = 0; i < bytes; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* llm.c's token file: 0, or 1 after a message. */
static int write_tokens(const char *path, const int64_t *ids, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (ids[i] > 65535) {
            char m[96];
            snprintf(m, sizeof m, "id %lld at position %lld", (long long)ids[i], (long long)i);
            return fail("--out %s: %s does not fit llm.c's uint16 token file", path, m);
        }
    if (n > INT32_MAX) return fail("--out %s: %s tokens, more than llm.c's header can count", path,
                                   "over 2^31");
    FILE *f = fopen(path, "wb");
    if (!f) return fail("--out: cannot write \"%s\": %s", path, strerror(errno));
    unsigned char header[1024] = {0}, two[2];
    put_le(header, 20240520, 4), put_le(header + 4, 1, 4), put_le(header + 8, (uint32_t)n, 4);
    int ok = fwrite(header, 1, sizeof header, f) == sizeof header;
    for (int64_t i = 0; ok && i < n; i++) {
        put_le(two, (uint32_t)ids[i], 2);
        ok = fwrite(two, 1, 2, f) == 2;
    }
    if (fclose(f) != 0) ok = 0;
    return ok ? 0 : fail("--out: cannot write \"%s\": %s", path, strerror(errno));
}

static int encode(nb_tokenizer *tok, const char *out) {
    int64_t n;
    char *text = read_stdin(&n);
    if (!text) return fail("cannot read standard input%s%s", "", "");
    int64_t *ids = malloc((size_t)(n > 0 ? n : 1) * sizeof *ids); /* never more ids than bytes */
    int64_t k = ids ? nb_tokenizer_encode(tok, text, n, ids, n) : -1;
    free(text);
    int rc = 0;
    if (k < 0) rc = fail("%s%s", ids ? nb_last_error() : "out of memory", "");
    else if (out) rc = write_tokens(out, ids, k);
    else {
        for (int64_t i = 0; i < k; i++) printf(i ? " %lld" : "%lld", (long long)ids[i]);
        printf("\n");
    }
    free(ids);
    return rc;
}

static int is_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

static int decode(nb_tokenizer *tok) {
    int64_t n;
    char *text = read_stdin(&n);
    if (!text) return fail("cannot read standard input%s%s", "", "");
    int64_t count = 0, i = 0;
    int rc = 0;
    while (rc == 0) {
        while (i < n && is_space(text[i])) i++;
        if (i == n) break;
        int64_t v = 0, start = i;
        while (i < n && text[i] >= '0' && text[i] <= '9' && v < INT64_C(1) << 40)
            v = v * 10 + (text[i++] - '0');
        char m[96];
        if (i == start || (i < n && !is_space(text[i]))) {
            int64_t e = start;
            while (e < n && e - start < 20 && !is_space(text[e])) e++;
            snprintf(m, sizeof m, "\"%.*s\" (word %lld)", (int)(e - start), text + start,
                     (long long)count);
            rc = fail("--decode: %s is not a token id (a non-negative integer)%s", m, "");
            break;
        }
        int64_t len;
        const char *b = nb_tokenizer_token(tok, v, &len);
        snprintf(m, sizeof m, "%lld at position %lld", (long long)v, (long long)count);
        if (!b) rc = fail("--decode: id %s is not in the vocabulary (%s)", m, nb_last_error());
        else if (fwrite(b, 1, (size_t)len, stdout) != (size_t)len)
            rc = fail("cannot write standard output%s%s", "", "");
        count++;
    }
    free(text);
    if (fflush(stdout) != 0 && rc == 0) rc = fail("cannot write standard output%s%s", "", "");
    return rc;
}

int main(int argc, char **argv) {
    const char *path = NULL, *out = NULL, *in = NULL;
    int dec = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return usage(stdout, argv[0]), 0;
        if (!strcmp(a, "--decode")) dec = 1;
        else if ((!strcmp(a, "--tokenizer") || !strcmp(a, "--out") || !strcmp(a, "--in")) &&
                 i + 1 < argc)
            *(a[2] == 't' ? &path : a[2] == 'o' ? &out : &in) = argv[++i];
        else if (!strcmp(a, "--tokenizer") || !strcmp(a, "--out") || !strcmp(a, "--in"))
            return fail("%s needs a value (see --help)%s", a, "");
        else return fail("unknown option %s (see --help)%s", a, "");
    }
    if (!path) return fail("--tokenizer PATH is required (see --help)%s%s", "", "");
    if (dec && out) return fail("--out writes encoded ids; it does not go with --decode%s%s", "", "");
    if (in && !freopen(in, "rb", stdin)) return fail("--in: cannot read \"%s\": %s", in, strerror(errno));
    nb_tokenizer *tok = nb_tokenizer_load(path);
    if (!tok) return fail("%s%s", nb_last_error(), "");
    int rc = dec ? decode(tok) : encode(tok, out);
    nb_tokenizer_free(tok);
    return rc;
}
