/* gen_seeds.c: writes the seed corpora, fuzz_load's into argv[1] and
 * fuzz_ops's into argv[2] (make fuzz-seeds; committed as fuzz/corpus/load and
 * fuzz/corpus/ops).
 *
 * Valid files: nb_save of the fuzz registry (sentinel values and others), and
 * hand-made headers for it (other tensor order, \u escapes in names, extra
 * whitespace and __metadata__). Invalid files: each a small edit of a valid
 * header, one defect each (see the table in main).
 *
 * fuzz_ops: one program per op of ops/registry.h, made from its registry line
 * (see registry_seed; linked with fuzz_ops.c, it runs the harness to check
 * them), in f32, f64 and bf16 (its floating inputs bf16: the op's result
 * checked, or its refusal of bf16, as its NB_OP_BF16 flag says), and
 * hand-made ones (ops_seeds' tables): a few ops in a row, bad calls, each
 * matmul kernel path, each again on bf16 inputs, and conversions to and from
 * bf16, bf16 products and autocast regions. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "load_registry.h"
#include "ops_program.h"

static const char *dir;

static void die(const char *what) {
    fprintf(stderr, "gen_seeds: %s: %s\n", what, nb_last_error() ? nb_last_error() : "");
    exit(1);
}

static void put_file(const char *name, const void *p, size_t n) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n || fclose(f) != 0) die(path);
}

/* 8-byte little-endian hlen (given, or the JSON's length), JSON, data. */
static void put_st(const char *name, uint64_t hlen, const char *json, const void *data,
                   size_t dlen) {
    size_t jl = strlen(json);
    unsigned char *b = malloc(8 + jl + dlen + 2);
    if (!b) die("out of memory");
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(hlen >> (8 * i));
    memcpy(b + 8, json, jl);
    if (dlen) memcpy(b + 8 + jl, data, dlen);
    put_file(name, b, 8 + jl + dlen);
    if (hlen == jl && !memchr(json, 0, jl)) { /* the same as fuzz_load's "J" form */
        char jname[512];
        snprintf(jname, sizeof jname, "J-%s", name);
        b[7] = 'J';
        memcpy(b + 8 + jl, "", 1);
        if (dlen) memcpy(b + 9 + jl, data, dlen);
        put_file(jname, b + 7, 2 + jl + dlen);
    }
    free(b);
}

/* The "J" twin (see put_st) of a file nb_save wrote. */
static void j_twin(const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    static unsigned char b[1 << 16];
    size_t n = f ? fread(b, 1, sizeof b - 1, f) : 0;
    if (!f || n < 8) die(path);
    fclose(f);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | b[i];
    if (hlen > n - 8) die("a saved header is longer than its file");
    static char json[1 << 16];
    memcpy(json, b + 8, (size_t)hlen);
    json[hlen] = 0;
    snprintf(path, sizeof path, "%s.tmp", name);
    put_st(path, hlen, json, b + 8 + hlen, n - 8 - (size_t)hlen);
    snprintf(path, sizeof path, "%s/%s.tmp", dir, name);
    remove(path); /* keep only the twin, named as the file */
    char from[512];
    snprintf(from, sizeof from, "%s/J-%s.tmp", dir, name);
    snprintf(path, sizeof path, "%s/J-%s", dir, name);
    if (rename(from, path) != 0) die(path);
}

/* The registry's tensors as a file would list them. */
static const struct {
    const char *json_name, *dtype, *shape;
    size_t bytes;
} items[] = {
    {"\"w0\"", "F32", "[]", 4},
    {"\"w\"", "F32", "[2,3]", 24},
    {"\"d\\\"q\\\\\\u0009\xc3\xa9\"", "F64", "[4]", 32},
    {"\"dt\"", "F64", "[3,2]", 48},
    {"\"e\"", "F32", "[0,3]", 0},
    {"\"steps\"", "I64", "[3]", 24},
    {"\"mask\"", "BOOL", "[2,2]", 4},
    {"\"maskT\"", "BOOL", "[3,2]", 6},
};
#define NITEMS (sizeof items / sizeof *items)
#define DATA_BYTES 142

/* A header for the registry with the tensors laid out in `order`; meta is
 * the text before the first tensor (e.g. a __metadata__ member). */
static char *header(const int *order, const char *meta, const char *sep) {
    static char h[4096];
    size_t at = 0, n = 0;
    n += (size_t)snprintf(h + n, sizeof h - n, "{%s", meta);
    for (size_t k = 0; k < NITEMS; k++) {
        int i = order[k];
        n += (size_t)snprintf(h + n, sizeof h - n,
                              "%s%s:%s{\"dtype\":\"%s\",%s\"shape\":%s,\"data_offsets\":[%zu,%zu]}",
                              k || meta[0] ? "," : "", items[i].json_name, sep, items[i].dtype,
                              sep, items[i].shape, at, at + items[i].bytes);
        at += items[i].bytes;
    }
    snprintf(h + n, sizeof h - n, "}");
    return h;
}

/* header with the first occurrence of `from` replaced by `to` */
static char *edit(const char *h, const char *from, const char *to) {
    static char out[4096];
    const char *p = strstr(h, from);
    if (!p) {
        fprintf(stderr, "gen_seeds: \"%s\" not in the header\n", from);
        exit(1);
    }
    snprintf(out, sizeof out, "%.*s%s%s", (int)(p - h), h, to, p + strlen(from));
    return out;
}

/* ------------------------------------------------------ fuzz_ops programs */
/* The program's first byte for n (1-3) input tensors; see ops_program.h.
 * bf16: bit 0 makes the first input bf16, bit 1 the others. */
static unsigned char head_byte(int f64, int ntensors, int path, int bf16) {
    return (unsigned char)(f64 | (ntensors - 1) << 1 | path << 3 | bf16 << 5);
}

/* A kind byte for an nd-d input (see ops_program.h): bool, or floating and
 * requiring grad. */
static unsigned char kind_byte(int nd, bool is_bool) {
    for (unsigned k = 0; k < 256; k++)
        if ((int)(k % 5) == nd && ((k >> 3) % 4 == 3) == is_bool && ((k & 0x20) != 0) == !is_bool)
            return (unsigned char)k;
    die("no kind byte");
    return 0;
}

/* The value byte of element i of an input of letter c (ops/registry.h):
 * f in [-1.5, 1.5], p in (0, 3], a with |x| >= 0.5 (fuzz_ops.c's val_of is
 * (byte - 123) / 8), b 0 or 1. */
static unsigned char value_byte(char c, int i) {
    int k = (i * 7 + 3) % 25 - 12; /* -12 .. 12, varied */
    switch (c) {
    case 'p': return (unsigned char)(124 + (k + 12) % 24);
    case 'a': return (unsigned char)(123 + (k < 0 ? k - 4 : k + 4) / 2 * 2);
    case 'b': return (unsigned char)(i % 3 == 1);
    default: return (unsigned char)(123 + k);
    }
}

/* The inputs of a registry line's "inputs" word list (letter[:AxBxC][=][?N], default
 * 3x4), as program bytes; 'i' (an index) is left to the op's decoder, which
 * makes its index tensor from the program. Returns the number of tensors. */
static int registry_inputs(const char *spec, unsigned char *b, size_t *n) {
    int count = 0;
    for (const char *w = spec; *w;) {
        char letter = *w++;
        int64_t s[4] = {3, 4};
        int nd = 2;
        if (*w == ':')
            for (nd = 0; *w == ':' || *w == 'x'; nd++) s[nd] = strtol(w + 1, (char **)&w, 10);
        if (*w == '=') w++;                               /* fixed size */
        if (*w == '?') strtol(w + 1, (char **)&w, 10); /* optional: given here */
        while (*w == ' ') w++;
        if (letter == 'i') continue;
        b[(*n)++] = kind_byte(nd, letter == 'b');
        int64_t numel = 1;
        for (int i = 0; i < nd; i++) b[(*n)++] = (unsigned char)s[i], numel *= s[i];
        for (int i = 0; i < numel; i++) b[(*n)++] = value_byte(letter, i);
        count++;
    }
    return count;
}

/* Whether fuzz_ops runs exactly one op on prog, successfully, as opcode op
 * (bf16: with its bf16 behaviour checked, a result or a refusal of bf16). */
static bool runs_once(unsigned op, const unsigned char *prog, size_t n, bool bf16) {
    long before = bf16 ? fuzz_ops_bf16(op) : fuzz_ops_succeeded(op);
    LLVMFuzzerTestOneInput(prog, n);
    long after = bf16 ? fuzz_ops_bf16(op) : fuzz_ops_succeeded(op);
    return fuzz_ops_last_ops() == 1 && after == before + 1;
}

/* One seed per registered op: its registry inputs, its opcode, its operands
 * in order, then the arguments its decoder reads. Those are searched for:
 * the shortest prefix, of a fixed pseudo-random sequence of byte strings,
 * under which the harness itself finds the call valid and correct. So a new
 * registry line gets its seed with no edit here, and the same one each time. */
static const struct {
    unsigned op;
    const char *name, *inputs;
} registered[] = {
#define X(name, inputs, flags, call) {OP_##name, #name, inputs},
    NB_OPS(X)
#undef X
};

enum { SEED_F32, SEED_F64, SEED_BF16 };

/* dtype: f32 or f64 inputs, the call valid; or bf16 inputs (its floating
 * ones; none for an op of bool inputs only: no seed), the call's bf16
 * behaviour checked: a result for an op flagged NB_OP_BF16, else a refusal
 * of a call that is valid in f32. */
static void registry_seed(size_t k, int dtype) {
    if (dtype == SEED_BF16 && !strpbrk(registered[k].inputs, "fpa")) return;
    unsigned char b[512];
    size_t n = 1;
    int ntensors = registry_inputs(registered[k].inputs, b, &n);
    b[0] = head_byte(dtype == SEED_F64, ntensors, 0, dtype == SEED_BF16 ? 3 : 0);
    b[n++] = (unsigned char)registered[k].op;
    for (int i = 0; i < ntensors; i++) b[n++] = (unsigned char)i;
    uint64_t x = 0x9E3779B97F4A7C15ULL;
    for (const char *c = registered[k].name; *c; c++) /* FNV-1a: a stream per op name */
        x = (x ^ (unsigned char)*c) * 0x100000001B3ULL;
    enum { TAIL = 16, TRIES = 4096 };
    for (int t = 0; t < TRIES; t++) {
        for (int i = 0; i < TAIL; i++) { /* try 0: zeros; then xorshift64 */
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            b[n + (size_t)i] = t ? (unsigned char)(x >> 24) : 0;
        }
        for (size_t len = 0; len <= TAIL; len++)
            if (runs_once(registered[k].op, b, n + len, dtype == SEED_BF16)) {
                char name[96];
                snprintf(name, sizeof name, "op-%s-%s", registered[k].name,
                         dtype == SEED_F64 ? "f64" : dtype == SEED_BF16 ? "bf16" : "f32");
                put_file(name, b, n + len);
                return;
            }
    }
    fprintf(stderr, "gen_seeds: no %s program found for nb_%s\n",
            dtype == SEED_BF16 ? "bf16" : "valid", registered[k].name);
    exit(1);
}

/* Writes a hand-made program, "NAME-DTYPE[-PATH]": head, inputs, ops; and
 * runs it (a mismatch aborts here, as in make test's replay). bf16: the head's
 * bf16 bits (DTYPE bf16 when both are set: every floating input is bf16). */
static void put_program(const char *name, int f64, int path, int bf16, const unsigned char *in,
                        size_t nin, int ntensors, const unsigned char *prog, size_t len) {
    unsigned char b[160];
    size_t n = 0;
    if (1 + nin + len > sizeof b) die("a hand-made program is too long");
    b[n++] = head_byte(f64, ntensors, path, bf16);
    memcpy(b + n, in, nin);
    n += nin;
    memcpy(b + n, prog, len);
    n += len;
    char file[96];
    snprintf(file, sizeof file, "%s-%s%s", name, bf16 == 3 ? "bf16" : f64 ? "f64" : "f32",
             path == 1   ? "-portable"
             : path == 2 ? "-avx2"
             : path == 3 ? "-avx512"
                         : "");
    put_file(file, b, n);
    LLVMFuzzerTestOneInput(b, n);
}

/* fuzz_ops programs: three inputs, A (2,3) and B (3) requiring grad and a
 * bool C (2,3), then one op (or a few) per seed; see ops_program.h. Each runs
 * with A and B in f32, in f64, and in bf16; those whose name starts with
 * "matmul" on each kernel path. Then bf16 programs with inputs of their own. */
static void ops_seeds(void) {
    int argc = 0;
    char **argv = NULL;
    LLVMFuzzerInitialize(&argc, &argv); /* registry_seed runs the harness */
    for (size_t k = 0; k < sizeof registered / sizeof *registered; k++)
        for (int dtype = SEED_F32; dtype <= SEED_BF16; dtype++) registry_seed(k, dtype);

    static const unsigned char inputs[] = {
        32, 2, 3, 131, 139, 115, 127, 147, 119, /* A = [[1,2,-1],[.5,3,-.5]] */
        36, 3, 135, 111, 125,                   /* B = [1.5,-1.5,.25] */
        27, 2, 3, 1, 0, 1, 0, 0, 1};            /* C */
    enum { A, B, C, R }; /* pool slots; R = the first result */
    static const struct {
        const char *name;
        unsigned char prog[40];
        size_t len;
    } seeds[] = {
#define P(...) {__VA_ARGS__}, sizeof((unsigned char[]){__VA_ARGS__})
        {"add", P(OP_add, A, B, OP_sum_all, R)},
        {"sub", P(OP_sub, B, A)},
        {"mul", P(OP_mul, A, B)},
        {"div", P(OP_div, A, B)},
        {"matmul", P(OP_matmul, A, B, OP_transpose, A, 3, 4, OP_matmul, R + 1, A)},
        {"softmax", P(OP_softmax, A, 4)},
        {"log-softmax", P(OP_log_softmax, A, 3)},
        {"masked-fill", P(OP_masked_fill, A, C, 2, OP_softmax, R, 4)},
        {"sum", P(OP_sum, A, 4, 0)},
        {"mean", P(OP_mean, A, 3, 1)},
        {"max", P(OP_max, A, 4, 1)},
        {"sum-all", P(OP_sum_all, A)},
        {"mean-all", P(OP_mean_all, B)},
        {"exp", P(OP_exp, A)},
        {"tanh", P(OP_tanh, A)},
        {"relu", P(OP_relu, A)},
        {"neg", P(OP_neg, A)},
        {"log", P(OP_log, A)},
        {"sqrt", P(OP_sqrt, A)},
        {"gelu", P(OP_gelu, A)},
        {"contiguous", P(OP_transpose, A, 3, 4, OP_contiguous, R)},
        {"cat", P(OP_cat, 1, A, A, 3)},
        {"where", P(OP_where, C, A, B)},
        {"gt", P(OP_gt, A, B)},
        {"lt", P(OP_lt, A, B)},
        {"eq", P(OP_eq, A, A)},
        {"not", P(OP_logical_not, C)},
        {"transpose", P(OP_transpose, A, 3, 4)},
        {"permute", P(OP_permute, A, 0, 0)},
        {"unsqueeze", P(OP_unsqueeze, A, 5)},
        {"squeeze", P(OP_unsqueeze, A, 5, OP_squeeze, R, 5)},
        {"expand", P(OP_expand, B, 1, 2, 1, OP_add, R, A)},
        {"narrow", P(OP_narrow, A, 4, 5, 3)},
        {"select", P(OP_select, A, 3, 4, 0)},
        {"view", P(OP_view, A, 2, 1, 2)},
        {"reshape", P(OP_transpose, A, 3, 4, OP_reshape, R, 1, 2, 0)},
        {"to", P(OP_to, A, 2, OP_where, C, R, R, OP_to, R + 1, 3)},
        {"bad-add-mixed-dtypes", P(OP_to, A, 1, OP_to, A, 0, OP_add, R, R + 1)},
        {"matmul-big", P(OP_cat, 2, A, A, A, 3, OP_cat, 2, R, R, R, 3, OP_cat, 2, R + 1, R + 1,
                         R + 1, 4, OP_transpose, R + 2, 3, 4, OP_matmul, R + 2, R + 3,
                         OP_matmul, R + 3, R + 2)},
        {"pow", P(OP_pow_scalar, A, 2, OP_pow_scalar, A, 7)},
        {"add-scalar", P(OP_add_scalar, A, 9)},
        {"mul-scalar", P(OP_mul_scalar, A, 4)},
        {"argmax", P(OP_argmax, A, 4, 0, OP_argmax, C, 3, 1)},
        {"ne", P(OP_ne, A, B)},
        {"detach", P(OP_detach, A, OP_requires_grad, R, OP_mul, R, A)},
        /* dropout: operand, p (index into fuzz_ops.c's probs: 0 .25 .5 .9 1
         * 1e-3 -.5 NaN), mode (3: not training; 4: the global generator), seed */
        {"dropout", P(OP_dropout, A, 1, 0, 7, OP_dropout, B, 2, 4, 9, OP_dropout, A, 3, 0, 200)},
        {"dropout-identity-zeros", P(OP_dropout, A, 0, 0, 1, OP_dropout, A, 4, 0, 1,
                                     OP_dropout, A, 2, 3, 1)},
        /* gather / index_select: operand, dim byte, index mode (0: from the
         * pool; 1: in range; 2: some out of range; 3: any shape), index sizes, values */
        {"gather", P(OP_gather, A, 4, 1, 2, 4, 0, 2, 1, 1, 2, 0, 0, 1)},
        {"gather-dim0", P(OP_gather, A, 3, 1, 3, 2, 0, 1, 1, 0, 1, 1)},
        {"gather-argmax-index", P(OP_argmax, A, 4, 1, OP_gather, A, 4, 0, R)},
        {"index-select", P(OP_index_select, A, 4, 1, 4, 2, 0, 1, 1)},
        {"index-select-dim0", P(OP_index_select, B, 2, 1, 3, 2, 2, 0)},
        {"bad-dropout-p",
         P(OP_dropout, A, 6, 0, 1, OP_dropout, A, 7, 0, 1, OP_dropout, C, 1, 0, 1)},
        {"bad-gather-range", P(OP_gather, A, 4, 2, 2, 2, 1, 2, 3, 5, OP_gather, A, 4, 2, 1, 1, 0)},
        {"bad-gather-dtype", P(OP_gather, A, 4, 0, A)},
        {"bad-index-select-range", P(OP_index_select, A, 3, 2, 2, 4, 0)},
        {"bad-index-select-2d", P(OP_index_select, A, 3, 3, 2, 1, 1, 0)},
        {"bad-requires-grad-bool", P(OP_requires_grad, C)},
        {"bad-view-transposed", P(OP_transpose, A, 3, 4, OP_view, R, 1, 1)},
        {"bad-add-bool", P(OP_add, A, C)},
        {"bad-matmul-k", P(OP_matmul, A, A)},
        {"bad-softmax-dim", P(OP_softmax, A, 255)},
#undef P
    };
    for (int dt = 0; dt < 3; dt++) /* f32, f64, bf16 */
        for (size_t i = 0; i < sizeof seeds / sizeof *seeds; i++)
            for (int path = 0; path < 4; path++) { /* matmul seeds on each kernel path */
                if (path && strncmp(seeds[i].name, "matmul", 6)) continue;
                put_program(seeds[i].name, dt == 1, path, dt == 2 ? 3 : 0, inputs,
                            sizeof inputs, 3, seeds[i].prog, seeds[i].len);
            }

    /* bf16 with inputs of their own. BF: nb_to's dtype byte for bf16. */
    enum { BF = 0x0c };
    static const unsigned char specials[] = {
        32, 3, 5,                /* S (3,5): */
        255, 254, 253, 252, 251, /* NaN inf -inf -0 1e30 */
        250, 249, 248, 247, 246, /* -1e-30 88.75 710 3e38 -1e300 */
        245, 130, 160, 124, 0,   /* 1e-310 7/8 37/8 1/8 -123/8 */
        36, 5, 131, 160, 130, 127, 200}; /* T (5): 1 37/8 7/8 .5 77/8 */
    static const unsigned char tiny[] = {
        32, 2, 3, 250, 123, 123, 130, 160, 124, /* U (2,3): [-1e-30 0 0] [7/8 37/8 1/8] */
        36, 3, 244, 131, 123};                  /* V (3): 15.125 1 0 */
    enum { S, T, S2 }; /* pool slots; S2 = the first result */
    static const struct {
        const char *name;
        int bf16, f64s; /* head bf16 bits; f64s: also with f64 inputs */
        const unsigned char *in;
        size_t nin;
        int ntensors;
        unsigned char prog[48];
        size_t len;
    } bseeds[] = {
#define P(...) {__VA_ARGS__}, sizeof((unsigned char[]){__VA_ARGS__})
        /* to bf16 and back to each dtype, bf16 to bf16 (a view), a quotient's rounding */
        {"to-bf16-and-back", 0, 1, inputs, sizeof inputs, 3,
         P(OP_to, A, BF, OP_to, R, 0, OP_to, R, 1, OP_to, R, 2, OP_to, R, 3, OP_to, R, BF,
           OP_div, A, B, OP_to, R + 6, BF, 4)},
        /* specials: NaN to 0xffff, overflow, -0, subnormal, f64's two roundings; a tie
         * (7/8 * 37/8 = 259/64 rounds to even, 260/64) */
        {"to-bf16-specials", 0, 1, specials, sizeof specials, 2,
         P(OP_to, S, BF, OP_to, S2, 0, OP_to, S2, 1, OP_to, S2, 2, OP_to, S2, 3, OP_mul, S, T,
           OP_to, S2 + 5, BF, OP_to, S2 + 6, 1)},
        /* A bf16, B f32: mixed products and sums refused, B converted then multiplied */
        {"matmul-mixed", 1, 0, inputs, sizeof inputs, 3,
         P(OP_matmul, A, B, OP_add, A, A, OP_to, B, BF, OP_matmul, A, R, OP_matmul, R + 1, R + 1)},
        /* subnormal bf16 operands (-1e-39): the AVX512_BF16 path reads them as 0 */
        {"matmul-subnormal", 0, 0, tiny, sizeof tiny, 2,
         P(OP_mul_scalar, S, 8, OP_mul_scalar, S2, 8, OP_mul_scalar, S2 + 1, 8, OP_to, S2 + 2, BF,
           OP_pow_scalar, T, 5, OP_pow_scalar, S2 + 4, 5, OP_to, S2 + 5, BF,
           OP_matmul, S2 + 3, S2 + 6)},
        /* autocast: f32 products in bf16, bf16 x f32 and bf16 x bf16 inside, a plain
         * region inside, ends (one too many), a bad dtype, a region left open */
        {"matmul-autocast", 0, 1, inputs, sizeof inputs, 3,
         P(OP_autocast, 0, OP_matmul, A, B, OP_to, A, BF, OP_transpose, R + 1, 3, 4,
           OP_matmul, R + 1, R + 2, OP_autocast, 1, OP_matmul, A, B, OP_autocast, 2,
           OP_autocast, 2, OP_autocast, 2, OP_autocast, 3, OP_autocast, 0,
           OP_matmul, R + 2, R + 1, OP_matmul, R + 1, B)},
#undef P
    };
    for (int f64 = 0; f64 < 2; f64++)
        for (size_t i = 0; i < sizeof bseeds / sizeof *bseeds; i++)
            for (int path = 0; path < 4; path++) {
                if ((f64 && !bseeds[i].f64s) || (path && strncmp(bseeds[i].name, "matmul", 6)))
                    continue;
                put_program(bseeds[i].name, f64, path, bseeds[i].bf16, bseeds[i].in,
                            bseeds[i].nin, bseeds[i].ntensors, bseeds[i].prog, bseeds[i].len);
            }
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: gen_seeds LOAD_DIR OPS_DIR\n");
        return 2;
    }
    dir = argv[2];
    ops_seeds();
    dir = argv[1];
    char path[512];

    /* nb_save's own files */
    fuzz_registry r;
    reg_build(&r);
    reg_set_sentinels(&r);
    snprintf(path, sizeof path, "%s/valid-saved-sentinels.safetensors", dir);
    if (nb_save(r.ps, path) != 0) die("nb_save");
    j_twin("valid-saved-sentinels.safetensors");
    float *w = nb_data(r.t[1]);
    w[0] = NAN, w[1] = -INFINITY, w[2] = -0.0f, w[3] = 1e-45f, w[4] = 3.4e38f, w[5] = 1;
    ((int64_t *)nb_data(r.t[5]))[0] = INT64_MIN;
    ((int64_t *)nb_data(r.t[5]))[2] = INT64_MAX;
    snprintf(path, sizeof path, "%s/valid-saved-special.safetensors", dir);
    if (nb_save(r.ps, path) != 0) die("nb_save");
    j_twin("valid-saved-special.safetensors");

    unsigned char data[DATA_BYTES + 16];
    for (size_t i = 0; i < sizeof data; i++) data[i] = (unsigned char)(i * 37 + 11);
    const int in_order[NITEMS] = {0, 1, 2, 3, 4, 5, 6, 7};
    const int reversed[NITEMS] = {7, 6, 5, 4, 3, 2, 1, 0};
    const char *h = header(in_order, "", "");
    char base[4096];
    snprintf(base, sizeof base, "%s", h);

    /* valid, hand-made (bool bytes are arbitrary: nb_load makes them 0/1) */
    put_st("valid-in-order.safetensors", strlen(base), base, data, DATA_BYTES);
    h = header(reversed, "\"__metadata__\":{\"format\":\"pt\",\"k\\u00e9y\":\"v\\n\"}", " ");
    put_st("valid-reversed-metadata.safetensors", strlen(h), h, data, DATA_BYTES);
    h = edit(base, "\"d\\\"q\\\\\\u0009\xc3\xa9\"", "\"\\u0064\\u0022q\\\\\\t\\u00E9\"");
    put_st("valid-escaped-name.safetensors", strlen(h), h, data, DATA_BYTES);
    char padded[4200];
    snprintf(padded, sizeof padded, " \n\t%s        ", base);
    put_st("valid-whitespace.safetensors", strlen(padded), padded, data, DATA_BYTES);

    /* invalid: one defect each */
    static const struct {
        const char *name, *from, *to;
    } bad[] = {
        {"bad-json-missing-colon", "\"w\":", "\"w\""},
        {"bad-json-trailing-comma", "]}}", "]},}"},
        {"bad-json-unterminated-string", "\"w0\"", "\"w0"},
        {"bad-json-nested-array", "[2,3]", "[[2],3]"},
        {"bad-json-float", "[2,3]", "[2.0,3]"},
        {"bad-json-negative", "[2,3]", "[-2,3]"},
        {"bad-json-true", "\"F32\"", "true"},
        {"bad-dtype-f16", "\"F32\"", "\"F16\""},
        {"bad-dtype-bf16", "\"F64\"", "\"BF16\""},
        {"bad-dtype-lowercase", "\"I64\"", "\"i64\""},
        {"bad-dtype-mismatch", "\"F64\"", "\"I64\""},
        {"bad-shape-overflow", "[2,3]", "[4294967296,4294967296,4294967296]"},
        {"bad-shape-int64-max", "[2,3]", "[9223372036854775807,2]"},
        {"bad-shape-huge-number", "[2,3]", "[99999999999999999999999,3]"},
        {"bad-shape-9-dims", "[2,3]", "[1,1,1,1,1,1,1,2,3]"},
        {"bad-shape-mismatch", "[2,3]", "[3,2]"},
        {"bad-offsets-past-end", "[136,142]", "[136,1142]"},
        {"bad-offsets-near-int64-max", "[0,4]", "[9223372036854775800,9223372036854775804]"},
        {"bad-offsets-reversed", "[4,28]", "[28,4]"},
        {"bad-offsets-overlap", "[4,28]", "[0,24]"},
        {"bad-offsets-gap", "[0,4]", "[1,5]"},
        {"bad-offsets-one-entry", "[0,4]", "[4]"},
        {"bad-offsets-three-entries", "[0,4]", "[0,4,8]"},
        {"bad-offsets-huge", "[0,4]", "[18446744073709551615,3]"},
        {"bad-duplicate-name", "\"w\":", "\"w0\":"},
        {"bad-unknown-name", "\"w\":", "\"v\":"},
        {"bad-missing-field", ",\"shape\":[2,3]", ""},
        {"bad-unknown-field", "\"dtype\":\"F32\",", "\"dtype\":\"F32\",\"x\":1,"},
        {"bad-metadata-number", "{", "{\"__metadata__\":{\"format\":1},"},
        {"bad-metadata-nested", "{", "{\"__metadata__\":{\"a\":{\"b\":\"c\"}},"},
        {"bad-escape-unpaired-surrogate", "\"w0\"", "\"w\\ud800\""},
        {"bad-escape-low-surrogate", "\"w0\"", "\"w\\udc00\""},
        {"bad-escape-nul", "\"w0\"", "\"w\\u0000\""},
        {"bad-escape-x", "\"w0\"", "\"w\\x41\""},
        {"bad-escape-short-u", "\"w0\"", "\"w\\u12\""},
        {"bad-raw-control-char", "\"w0\"", "\"w\x01\""},
        {"bad-surrogate-pair-name", "\"w0\"", "\"\\ud83d\\ude00\""},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        h = edit(base, bad[i].from, bad[i].to);
        snprintf(path, sizeof path, "%s.safetensors", bad[i].name);
        put_st(path, strlen(h), h, data, DATA_BYTES);
    }
    /* the data section: too short, too long */
    put_st("bad-data-short.safetensors", strlen(base), base, data, DATA_BYTES - 1);
    put_st("bad-data-long.safetensors", strlen(base), base, data, DATA_BYTES + 8);
    /* the header size: past the file, past 100 MiB, zero, the whole file */
    put_st("bad-hlen-past-file.safetensors", strlen(base) + DATA_BYTES + 1, base, data,
           DATA_BYTES);
    put_st("bad-hlen-huge.safetensors", UINT64_MAX, base, data, DATA_BYTES);
    put_st("bad-hlen-over-100mib.safetensors", (100u << 20) + 1, base, data, DATA_BYTES);
    put_st("bad-hlen-zero.safetensors", 0, base, data, DATA_BYTES);
    put_st("bad-hlen-short.safetensors", strlen(base) - 1, base, data, DATA_BYTES);
    put_st("bad-empty-object.safetensors", 2, "{}", NULL, 0);
    put_st("bad-truncated-header.safetensors", strlen(base), "{\"w0\":{\"dtype\"", NULL, 0);
    put_file("bad-file-7-bytes.safetensors", "\x02\0\0\0\0\0\0", 7);
    put_file("bad-file-empty.safetensors", "", 0);
    nb_params_free(r.ps);
    return 0;
}
