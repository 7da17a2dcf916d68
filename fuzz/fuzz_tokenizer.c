/* fuzz_tokenizer.c: libFuzzer target for the GPT-2 tokenizer (nn/text/tokenizer*.c):
 * nb_tokenizer_load on each format, and nb_tokenizer_encode of any bytes.
 *
 * The first byte of an input picks what the rest is:
 *   'V'  vocab.json, NUL, merges.txt (the two files, side by side)
 *   'E'  encoder.json, NUL, vocab.bpe
 *   'J'  a tokenizer.json
 *   'B'  llm.c's gpt2_tokenizer.bin
 *   'T'  text for the real GPT-2 tokenizer (tests/fixtures/gpt2, loaded once)
 *   else the whole input as one file, named tokenizer.json
 * Checked:
 * - a refused file leaves a message starting "nb_tokenizer_load: " that names
 *   the file (or the merges file beside it);
 * - an accepted file gives every id's bytes (nb_tokenizer_token), a decode
 *   of all ids whose length is the sum, eot in range or -1; when it can
 *   encode: a few texts and the input itself encode to at most one id per
 *   byte, each id in range, counting alike with cap 0, and decode back to
 *   the very bytes (a byte-level BPE loses nothing);
 * - the same for the real tokenizer on 'T' inputs;
 * - libFuzzer's -timeout catches a load or an encode that is not linear.
 * Any violation aborts, which libFuzzer reports as a crash.
 *
 * NABLA_FUZZ_TOKENIZER_SEEDS=<dir> makes the first run write the seed corpus
 * (fuzz/corpus/tokenizer) into <dir> and exit. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../nabla.h"
#include "fuzz_files.h"

#define CHECK(cond, ...)                                                          \
    do {                                                                          \
        if (!(cond)) {                                                            \
            fprintf(stderr, "fuzz_tokenizer: check failed: %s: ", #cond);         \
            fprintf(stderr, __VA_ARGS__);                                         \
            fprintf(stderr, "\n");                                                \
            abort();                                                              \
        }                                                                         \
    } while (0)

static char dir[256], p_main[320], p_side[320];
static nb_tokenizer *gpt2;

static void remove_files(void) {
    static const char *names[] = {"vocab.json", "merges.txt", "encoder.json", "vocab.bpe",
                                  "tokenizer.json", "gpt2_tokenizer.bin"};
    char p[400];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        unlink(p);
    }
    rmdir(dir);
}

/* Encodes text and checks the ids and the round trip. */
static void check_encode(const nb_tokenizer *tok, const uint8_t *text, size_t n) {
    int64_t *ids = malloc((n + 1) * sizeof *ids);
    char *back = malloc(n + 1);
    CHECK(ids && back, "out of memory");
    int64_t k = nb_tokenizer_encode(tok, (const char *)text, (int64_t)n, ids, (int64_t)n);
    CHECK(k >= 0 && k <= (int64_t)n, "%lld ids for %zu bytes: %s", (long long)k, n,
          nb_last_error() ? nb_last_error() : "");
    CHECK(nb_tokenizer_encode(tok, (const char *)text, (int64_t)n, NULL, 0) == k, "cap 0 counts");
    for (int64_t i = 0; i < k; i++)
        CHECK(ids[i] >= 0 && ids[i] < nb_tokenizer_vocab_size(tok), "id %lld", (long long)ids[i]);
    CHECK(nb_tokenizer_decode(tok, ids, k, back, (int64_t)n) == (int64_t)n, "decode length");
    CHECK(n == 0 || memcmp(back, text, n) == 0, "decode(encode(x)) != x");
    free(ids), free(back);
}

static void check_tokenizer(const nb_tokenizer *tok, const uint8_t *input, size_t n) {
    int64_t v = nb_tokenizer_vocab_size(tok), total = 0, len;
    CHECK(v > 0, "vocab size %lld", (long long)v);
    int64_t eot = nb_tokenizer_eot(tok);
    CHECK(eot >= -1 && eot < v, "eot %lld", (long long)eot);
    int64_t *ids = malloc((size_t)v * sizeof *ids);
    CHECK(ids != NULL, "out of memory");
    for (int64_t i = 0; i < v; i++) {
        CHECK(nb_tokenizer_token(tok, i, &len) != NULL && len > 0, "token %lld", (long long)i);
        total += len;
        ids[i] = i;
    }
    CHECK(nb_tokenizer_decode(tok, ids, v, NULL, 0) == total, "decode total");
    free(ids);
    if (!nb_tokenizer_can_encode(tok)) return;
    static const char *texts[] = {"Hello, world", "I'm  \n\n a\t1234 <|endoftext|>x", "\xff\xc3("};
    for (int i = 0; i < 3; i++) check_encode(tok, (const uint8_t *)texts[i], strlen(texts[i]));
    check_encode(tok, input, n);
}

/* Writes data[0..n) to dir/name. */
static void put(const char *path, const uint8_t *d, size_t n) { fuzz_write_file(path, d, n); }

static void run(const uint8_t *data, size_t size) {
    char kind = size ? (char)data[0] : 0;
    const uint8_t *d = data + (size ? 1 : 0);
    size_t n = size ? size - 1 : 0;
    if (kind == 'T') {
        check_encode(gpt2, d, n);
        return;
    }
    remove_files();
    mkdir(dir, 0700);
    const char *main_name = kind == 'V' ? "vocab.json" : kind == 'E' ? "encoder.json"
                          : kind == 'B' ? "gpt2_tokenizer.bin" : "tokenizer.json";
    snprintf(p_main, sizeof p_main, "%s/%s", dir, main_name);
    if (kind == 'V' || kind == 'E') {
        const uint8_t *nul = memchr(d, 0, n);
        size_t a = nul ? (size_t)(nul - d) : n;
        put(p_main, d, a);
        snprintf(p_side, sizeof p_side, "%s/%s", dir, kind == 'V' ? "merges.txt" : "vocab.bpe");
        if (nul) put(p_side, nul + 1, n - a - 1);
    } else {
        if (kind != 'J' && kind != 'B') d = data, n = size;
        put(p_main, d, n);
    }
    nb_clear_error();
    nb_tokenizer *tok = nb_tokenizer_load(p_main);
    if (!tok) {
        const char *m = nb_last_error();
        CHECK(m && !strncmp(m, "nb_tokenizer_load: ", 19), "message %s", m ? m : "(none)");
        CHECK(strstr(m, dir) != NULL || strstr(m, "out of memory"), "the message names no file: %s",
              m);
        return;
    }
    check_tokenizer(tok, d, n);
    nb_tokenizer_free(tok);
}

/* ------------------------------------------------------------------ seeds */
static void seed(const char *sdir, const char *name, const char *kind, const char *a,
                 size_t an, const char *b, size_t bn) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", sdir, name);
    size_t k = strlen(kind), n = k + an + (b ? 1 + bn : 0);
    uint8_t *s = malloc(n + 1);
    memcpy(s, kind, k);
    memcpy(s + k, a, an);
    if (b) s[k + an] = 0, memcpy(s + k + an + 1, b, bn);
    fuzz_write_file(p, s, n);
    free(s);
}

/* {"<the 256 byte characters>": 0..255, "ab": 256, ...} in GPT-2's form */
static size_t small_vocab(char *out, const char *extra) {
    size_t k = 0;
    out[k++] = '{';
    for (int b = 0; b < 256; b++) {
        bool self = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        int cp = b;
        if (!self) {
            cp = 0x100;
            for (int x = 0; x < b; x++)
                cp += !((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE);
        }
        char u[8];
        if (cp == '"' || cp == '\\') snprintf(u, sizeof u, "\\%c", cp);
        else if (cp < 0x80) snprintf(u, sizeof u, "%c", cp);
        else snprintf(u, sizeof u, "%c%c", 0xC0 | cp >> 6, 0x80 | (cp & 63));
        k += (size_t)sprintf(out + k, "%s\"%s\": %d", b ? ", " : "", u, b);
    }
    k += (size_t)sprintf(out + k, "%s}", extra);
    return k;
}

static void write_seeds(const char *sdir) {
    static char v[8192], j[16384];
    const char *extra = ", \"ab\": 256, \"abc\": 257, \"\xc4\xa0t\": 258, \"<|endoftext|>\": 259";
    const char *merges = "#version: 0.2\na b\nab c\n\xc4\xa0 t\n";
    size_t vn = small_vocab(v, extra);
    seed(sdir, "vocab-merges", "V", v, vn, merges, strlen(merges));
    seed(sdir, "encoder-bpe", "E", v, vn, merges, strlen(merges));
    seed(sdir, "bad-merge-not-in-vocab", "V", v, vn, "a b\nx q\n", 8);
    seed(sdir, "bad-no-merges", "V", v, vn, NULL, 0);
    size_t dn = small_vocab(v, ", \"ab\": 65");
    seed(sdir, "bad-duplicate-id", "V", v, dn, "a b\n", 4);
    vn = small_vocab(v, extra);
    v[vn - 1] = 0; /* without its '}' */
    int jn = snprintf(j, sizeof j,
                      "{\"added_tokens\": [{\"id\": 259, \"content\": \"<|endoftext|>\"}], "
                      "\"model\": {\"type\": \"BPE\", \"vocab\": %s}, \"merges\": [\"a b\", "
                      "[\"ab\", \"c\"], \"\xc4\xa0 t\"]}}", v);
    seed(sdir, "tokenizer-json", "J", j, (size_t)jn, NULL, 0);
    seed(sdir, "tokenizer-json-plain", "", j, (size_t)jn, NULL, 0);
    /* gpt2_tokenizer.bin, version 2: three tokens */
    uint8_t bin[1024 + 12] = {0};
    uint32_t h[4] = {20240328, 2, 3, 2};
    for (int i = 0; i < 4; i++)
        for (int k = 0; k < 4; k++) bin[4 * i + k] = (uint8_t)(h[i] >> (8 * k));
    memcpy(bin + 1024, "\x01" "a" "\x02" "bc" "\x05" "<|e|>", 11);
    seed(sdir, "llmc-bin", "B", (const char *)bin, 1035, NULL, 0);
    seed(sdir, "bad-llmc-bin-cut", "B", (const char *)bin, 1030, NULL, 0);
    bin[0]--; /* 20240327 */
    seed(sdir, "bad-llmc-bin-magic", "B", (const char *)bin, 1035, NULL, 0);
    seed(sdir, "bad-binary-plain", "", (const char *)bin, 1035, NULL, 0);
    /* merges.txt with lines ending in a lone \r, or \r\n after a BOM; a BOM
     * before vocab.json */
    vn = small_vocab(v, extra);
    const char *cr = "#version: 0.2\ra b\rab c\r\xc4\xa0 t\r";
    seed(sdir, "merges-cr", "V", v, vn, cr, strlen(cr));
    const char *crlf = "\xef\xbb\xbf#version: 0.2\r\na b\r\nab c\n\xc4\xa0 t";
    seed(sdir, "merges-crlf-bom", "V", v, vn, crlf, strlen(crlf));
    static char bom[8200];
    memcpy(bom, "\xef\xbb\xbf", 3), memcpy(bom + 3, v, vn);
    seed(sdir, "vocab-bom", "V", bom, vn + 3, merges, strlen(merges));
    /* a vocab.json id that is no integer; tokenizer.json members twice or not GPT-2's */
    dn = small_vocab(v, ", \"ab\": 256, \"zz\": \"3\"");
    seed(sdir, "bad-vocab-string-id", "V", v, dn, "a b\n", 4);
    vn = small_vocab(v, extra);
    v[vn - 1] = 0;
    static const char *tails[][3] = { /* name, in the model, after it */
        {"bad-model-twice", "", ", \"model\": null"},
        {"bad-pre-tokenizer", "", ", \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": []}"},
        {"pre-tokenizer-gpt2", "\"dropout\": null, \"ignore_merges\": false, ",
         ", \"normalizer\": null, \"pre_tokenizer\": {\"type\": \"ByteLevel\", "
         "\"add_prefix_space\": false, \"use_regex\": true}"},
        {"bad-added-token", "", ", \"added_tokens\": [{\"id\": 260, \"content\": \"<|im_start|>\"}]"},
        {"bad-model-options", "\"ignore_merges\": true, \"dropout\": 0.1, ", ""},
    };
    for (size_t i = 0; i < sizeof tails / sizeof tails[0]; i++) {
        jn = snprintf(j, sizeof j, "{\"model\": {%s\"type\": \"BPE\", \"vocab\": %s}, \"merges\": "
                      "[\"a b\"]}%s}", tails[i][1], v, tails[i][2]);
        seed(sdir, tails[i][0], "J", j, (size_t)jn, NULL, 0);
    }
    static const char *texts[] = {"Hello, world", "I'm  \n\n a\t1234 <|endoftext|>x", "caf\xc3\xa9 \xff",
                                  "\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd 日本語", "    def f(x):\n\treturn x\r\n"};
    for (int i = 0; i < 5; i++) {
        char name[32];
        snprintf(name, sizeof name, "text-%d", i);
        seed(sdir, name, "T", texts[i], strlen(texts[i]), NULL, 0);
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    setenv("NABLA_NUM_THREADS", "1", 0);
    char in[256], out[256];
    fuzz_paths("tokenizer", in, sizeof in, out, sizeof out);
    snprintf(dir, sizeof dir, "%s", in);
    atexit(remove_files);
    const char *vocab = getenv("NABLA_FUZZ_TOKENIZER_VOCAB");
    gpt2 = nb_tokenizer_load(vocab ? vocab : "tests/fixtures/gpt2/encoder.json");
    CHECK(gpt2 != NULL, "%s (run from the repository, or set NABLA_FUZZ_TOKENIZER_VOCAB)",
          nb_last_error());
    const char *seeds = getenv("NABLA_FUZZ_TOKENIZER_SEEDS");
    if (seeds) {
        mkdir(seeds, 0755);
        write_seeds(seeds);
        exit(0);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    run(data, size);
    return 0;
}
