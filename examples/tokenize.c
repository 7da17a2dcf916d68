/* tokenize.c: GPT-2's tokenizer from the command line (nb_tokenizer).
 *
 *   build/examples/tokenize --tokenizer PATH [--decode] [--out FILE] [--in FILE]
 *
 * Reads standard input (or --in FILE). By default encodes it (all of it, as bytes) and
 * prints the ids on one line, separated by single spaces; --out FILE writes
 * llm.c's token file instead (a header of 256 int32 LE: 20240520, 1, the
 * count; then the ids as uint16 LE), which examples/gpt and nb_load_tokens
 * read. --decode reads whitespace-separated ids and writes their bytes,
 * once every id is checked (a bad id writes nothing).
 * PATH: a tokenizer.json, a vocab.json (merges.txt beside it), an
 * encoder.json (vocab.bpe beside it), or llm.c's gpt2_tokenizer.bin
 * (decoding only). Errors go to standard error, naming the file (or
 * standard input or output) and the reason, exit status 1; a --out file
 * whose writing fails is removed. */
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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
            "                    (all ids are checked first: a bad one writes nothing)\n"
            "  --in FILE         read FILE instead of standard input\n"
            "  --help            this text\n"
            "example: echo 'Hello, world' | %s --tokenizer encoder.json\n"
            "         -> 15496 11 995 198\n",
            prog, prog);
}

static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int fail(const char *fmt, ...) {
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "tokenize: %s\n", line);
    return 1;
}

/* Where the input comes from, for messages: --in FILE or standard input. */
static const char *in_path;

static int input_failed(const char *why) {
    if (in_path) return fail("--in: cannot read \"%s\": %s", in_path, why);
    return fail("cannot read standard input: %s", why);
}

/* All of f (malloc'ed; *n bytes), or NULL after a message naming the input
 * and why (a directory given to --in opens, and fails at the first read). */
static char *read_all(FILE *f, int64_t *n) {
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t r = fread(buf + len, 1, cap - len, f);
        len += r;
        if (len < cap) break;
        char *b = realloc(buf, cap * 2);
        if (!b) free(buf);
        buf = b, cap *= 2;
    }
    if (!buf) return input_failed("out of memory"), NULL;
    if (ferror(f)) return free(buf), input_failed(strerror(errno)), NULL;
    *n = (int64_t)len;
    return buf;
}

/* Standard output flushed: 0, or 1 after a message (a full disk, a closed pipe). */
static int flush_stdout(void) {
    if (fflush(stdout) == 0 && !ferror(stdout)) return 0;
    return fail("cannot write standard output: %s", strerror(errno));
}

static void put_le(unsigned char *p, uint32_t v, int bytes) {
    for (int i = 0; i < bytes; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* llm.c's token file: 0, or 1 after a message (a file written in part is removed). */
static int write_tokens(const char *path, const int64_t *ids, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (ids[i] > 65535)
            return fail("--out %s: id %lld at position %lld does not fit llm.c's uint16 token file",
                        path, (long long)ids[i], (long long)i);
    if (n > INT32_MAX)
        return fail("--out %s: over 2^31 tokens, more than llm.c's header can count", path);
    FILE *f = fopen(path, "wb");
    if (!f) return fail("--out: cannot write \"%s\": %s", path, strerror(errno));
    struct stat st;
    int regular = fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode);
    unsigned char header[1024] = {0}, two[2];
    put_le(header, 20240520, 4), put_le(header + 4, 1, 4), put_le(header + 8, (uint32_t)n, 4);
    int ok = fwrite(header, 1, sizeof header, f) == sizeof header;
    for (int64_t i = 0; ok && i < n; i++) {
        put_le(two, (uint32_t)ids[i], 2);
        ok = fwrite(two, 1, 2, f) == 2;
    }
    int e = errno;
    if (fclose(f) != 0 && ok) ok = 0, e = errno;
    if (ok) return 0;
    if (regular && remove(path) == 0)
        return fail("--out: cannot write \"%s\": %s (the part written was removed)", path,
                    strerror(e));
    return fail("--out: cannot write \"%s\": %s", path, strerror(e));
}

static int encode(nb_tokenizer *tok, FILE *in, const char *out) {
    int64_t n;
    char *text = read_all(in, &n);
    if (!text) return 1;
    int64_t *ids = malloc((size_t)(n > 0 ? n : 1) * sizeof *ids); /* never more ids than bytes */
    int64_t k = ids ? nb_tokenizer_encode(tok, text, n, ids, n) : -1;
    free(text);
    int rc = 0;
    if (k < 0) rc = fail("%s", ids ? nb_last_error() : "out of memory");
    else if (out) rc = write_tokens(out, ids, k);
    else {
        for (int64_t i = 0; i < k; i++) printf(i ? " %lld" : "%lld", (long long)ids[i]);
        printf("\n");
        rc = flush_stdout();
    }
    free(ids);
    return rc;
}

static int is_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

/* Whitespace-separated ids to their bytes. Every id is checked before any
 * byte is written: on a bad one, nothing is. */
static int decode(nb_tokenizer *tok, FILE *in) {
    int64_t n;
    char *text = read_all(in, &n);
    if (!text) return 1;
    int64_t vocab = nb_tokenizer_vocab_size(tok), count = 0, i = 0;
    int64_t *ids = malloc((size_t)(n / 2 + 1) * sizeof *ids); /* a word and a space each */
    int rc = ids ? 0 : fail("--decode: out of memory for the ids");
    while (rc == 0) {
        while (i < n && is_space(text[i])) i++;
        if (i == n) break;
        int64_t v = 0, start = i, e = i;
        int big = 0;
        for (; i < n && text[i] >= '0' && text[i] <= '9'; i++) {
            if (v > (INT64_MAX - 9) / 10) big = 1;
            else v = v * 10 + (text[i] - '0');
        }
        while (e < n && e - start < 24 && !is_space(text[e])) e++;
        const char *more = e < n && !is_space(text[e]) ? "..." : "";
        if (i == start || (i < n && !is_space(text[i])))
            rc = fail("--decode: \"%.*s%s\" (word %lld) is not a token id (a non-negative "
                      "integer)", (int)(e - start), text + start, more, (long long)count);
        else if (big || v >= vocab)
            rc = fail("--decode: id %.*s%s at position %lld is not in the vocabulary (ids are "
                      "0..%lld)", (int)(e - start), text + start, more, (long long)count,
                      (long long)vocab - 1);
        else ids[count++] = v;
    }
    free(text);
    int64_t bytes = rc == 0 ? nb_tokenizer_decode(tok, ids, count, NULL, 0) : 0;
    char *out = rc == 0 && bytes >= 0 ? malloc((size_t)(bytes > 0 ? bytes : 1)) : NULL;
    if (rc == 0 && !out) rc = fail("--decode: %s", bytes < 0 ? nb_last_error() : "out of memory");
    if (rc == 0) {
        nb_tokenizer_decode(tok, ids, count, out, bytes);
        if (fwrite(out, 1, (size_t)bytes, stdout) != (size_t)bytes)
            rc = fail("cannot write standard output: %s", strerror(errno));
        else rc = flush_stdout();
    }
    free(out), free(ids);
    return rc;
}

int main(int argc, char **argv) {
    const char *path = NULL, *out = NULL, *in = NULL;
    int dec = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return usage(stdout, argv[0]), 0;
        if (!strcmp(a, "--decode")) {
            dec = 1;
            continue;
        }
        const char **v = !strcmp(a, "--tokenizer") ? &path : !strcmp(a, "--out") ? &out
                       : !strcmp(a, "--in")        ? &in
                                                   : NULL;
        if (!v) return fail("unknown option %s (see --help)", a);
        if (i + 1 == argc) return fail("%s needs a value (see --help)", a);
        if (*v) return fail("%s is given twice (\"%s\" and \"%s\")", a, *v, argv[i + 1]);
        *v = argv[++i];
    }
    if (!path) return fail("--tokenizer PATH is required (see --help)");
    if (dec && out) return fail("--out writes encoded ids; it does not go with --decode");
    FILE *src = stdin;
    in_path = in;
    if (in && !(src = fopen(in, "rb"))) return fail("--in: cannot read \"%s\": %s", in, strerror(errno));
    nb_tokenizer *tok = nb_tokenizer_load(path);
    int rc = !tok ? fail("%s", nb_last_error()) : dec ? decode(tok, src) : encode(tok, src, out);
    nb_tokenizer_free(tok);
    if (src != stdin) fclose(src);
    return rc;
}
