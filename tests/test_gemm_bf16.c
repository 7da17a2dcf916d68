/* test_gemm_bf16.c: the bf16 matrix-multiply kernel (ops/gemm_bf16.c) on every
 * path this CPU has, each forced in turn with nbi_isa_force (x86: portable,
 * AVX2, AVX-512 f32 fallbacks, AVX512_BF16; aarch64: each of its paths with a
 * bf16 kernel of its own): values against a double-precision sum
 * of the bf16-rounded inputs on shapes with edges and several cache blocks,
 * every operand layout (row- and column-major, strided, expanded, narrowed;
 * c strided), f32 operands rounded while packed giving the bits of bf16 ones,
 * the bits of a product computed in pieces, and NaN/inf propagation. */
#include <float.h>
#include <stdint.h>
#include <stdlib.h>

#include "ops/gemm_internal.h"
#include "tensor/bf16_internal.h"
#include "tensor/cpu_internal.h"
#include "test_util.h"

/* ck_assert for the loops over elements: Check marks every passing
 * ck_assert (a message down a pipe), too slow a million times over. */
#define EXPECT(cond, ...)                                                                      \
    do {                                                                                       \
        if (!(cond)) ck_abort_msg(__VA_ARGS__);                                                \
    } while (0)

/* Sizes with edges around the register tiles (MR 4..8 rows, NR 8..32 columns). */
static const int64_t SIZES[] = {1, 2, 3, 7, 15, 16, 17, 31, 33, 64, 100, 257};
#define NSIZES (int)(sizeof SIZES / sizeof SIZES[0])

/* The paths to check, isa running over every path of the architecture built
 * for (NBI_ISA_PORTABLE up to NBI_ISA_COUNT): isa forced, 1 when the CPU has
 * it and the kernel reports it; 0 when the CPU lacks it, or when the path
 * has no bf16 kernel of its own and takes one of a path below, checked
 * there (x86: AMX; aarch64: as ops/gemm_bf16.c says). */
static int force_path(int isa) {
    if (nbi_isa_force(isa) != isa) return 0;
    const int path = nbi_gemm_bf16_path();
    ck_assert_int_le(path, isa);
#if NBI_ARCH_X86
    if (isa <= NBI_ISA_AVX512BF16) ck_assert_int_eq(path, isa); /* each has its kernel */
#endif
    return path == isa;
}

/* ------------------------------------------------------------- operands */
/* A matrix (rows x cols) as the kernel reads it: element (x, y) at
 * buf[off + x*s0 + y*s1], bf16 (uint16_t) or f32. */
typedef struct {
    void *buf;
    int f32;
    int64_t rows, cols, s0, s1, off, size;
} opnd;

enum { ROW, COL, STRIDED, EXPAND_ROWS, EXPAND_COLS, NARROW, COL_NARROW, NLAYOUTS };
static const char *const LAYOUT_NAMES[] = {"row-major", "column-major", "strided",
                                           "expanded rows", "expanded columns", "narrowed",
                                           "column-major narrowed"};

static uint64_t rng_state;
static uint32_t rnd(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}
/* A value in +-[2^-4, 2^4), f32 with a full mantissa (so that rounding to
 * bf16 matters). */
static float rnd_value(void) {
    float m = 1.0f + (float)(rnd() & 0xffffff) / 16777216.0f;
    float v = ldexpf(m, (int)(rnd() % 8) - 4);
    return rnd() & 1 ? -v : v;
}

static opnd make_opnd(int64_t rows, int64_t cols, int layout, int f32, uint64_t seed) {
    opnd o = {.f32 = f32, .rows = rows, .cols = cols};
    switch (layout) {
    case ROW: o.s0 = cols, o.s1 = 1; break;
    case COL: o.s0 = 1, o.s1 = rows; break;
    case STRIDED: o.s0 = 2 * cols + 3, o.s1 = 2; break;
    case EXPAND_ROWS: o.s0 = 0, o.s1 = 1; break;
    case EXPAND_COLS: o.s0 = 1, o.s1 = 0; break;
    case NARROW: o.s0 = cols + 5, o.s1 = 1, o.off = 7; break;
    default: o.s0 = 1, o.s1 = rows + 3, o.off = 2; break;
    }
    o.size = o.off + 1;
    if (rows > 0 && cols > 0) o.size += (rows - 1) * o.s0 + (cols - 1) * o.s1;
    o.buf = malloc((size_t)o.size * (f32 ? 4 : 2));
    ck_assert(o.buf != NULL);
    rng_state = seed;
    for (int64_t i = 0; i < o.size; i++) {
        float v = rnd_value();
        if (f32) ((float *)o.buf)[i] = v;
        else ((uint16_t *)o.buf)[i] = nbi_bf16_from_f32(v);
    }
    return o;
}

/* Element (x, y) as the kernel multiplies it: rounded to bf16, widened. */
static double val(const opnd *o, int64_t x, int64_t y) {
    int64_t i = o->off + x * o->s0 + y * o->s1;
    uint16_t h = o->f32 ? nbi_bf16_from_f32(((float *)o->buf)[i]) : ((uint16_t *)o->buf)[i];
    return nbi_bf16_to_f32(h);
}

/* The address of element (x, y). */
static const void *at(const opnd *o, int64_t x, int64_t y) {
    return (const char *)o->buf + (o->off + x * o->s0 + y * o->s1) * (o->f32 ? 4 : 2);
}

/* The same matrix in bf16, rounded from o's f32 (same layout). */
static opnd rounded(const opnd *o) {
    opnd r = *o;
    r.f32 = 0;
    r.buf = malloc((size_t)o->size * 2);
    ck_assert(r.buf != NULL);
    for (int64_t i = 0; i < o->size; i++)
        ((uint16_t *)r.buf)[i] = nbi_bf16_from_f32(((float *)o->buf)[i]);
    return r;
}

/* c (rows [r0, r0+m), columns [c0, c0+n) of A B) through c's strides. */
static int gemm_part(nbi_gemm_ws *ws, const opnd *A, const opnd *B, int64_t r0, int64_t m,
                     int64_t c0, int64_t n, float *c, int64_t scm, int64_t scn) {
    return nbi_gemm_bf16(ws, m, n, A->cols, at(A, r0, 0), A->f32, A->s0, A->s1, at(B, 0, c0),
                         B->f32, B->s0, B->s1, c + r0 * scm + c0 * scn, scm, scn);
}

static int gemm(nbi_gemm_ws *ws, const opnd *A, const opnd *B, float *c, int64_t scm,
                int64_t scn) {
    return gemm_part(ws, A, B, 0, A->rows, 0, B->cols, c, scm, scn);
}

/* c against the sum in double of the bf16 products (exact), within the f32
 * summation bound K 2^-23 sum|a b|, plus K 2^-125 for the subnormals that
 * vdpbf16ps flushes. A NaN reference wants a NaN, an infinite one (or one
 * beyond f32) that infinity. */
static void expect_product(const opnd *A, const opnd *B, const float *c, int64_t scm,
                           int64_t scn, const char *what) {
    const int64_t M = A->rows, K = A->cols, N = B->cols;
    double *a = malloc(sizeof(double) * (size_t)(M * K + 1)); /* rows of A */
    double *bt = malloc(sizeof(double) * (size_t)(N * K + 1)); /* columns of B */
    ck_assert(a && bt);
    for (int64_t i = 0; i < M * K; i++) a[i] = val(A, i / K, i % K);
    for (int64_t i = 0; i < N * K; i++) bt[i] = val(B, i % K, i / K);
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double s = 0, sa = 0;
            for (int64_t k = 0; k < K; k++) {
                const double p = a[i * K + k] * bt[j * K + k];
                s += p;
                sa += fabs(p);
            }
            const double got = c[i * scm + j * scn];
            if (isnan(s))
                EXPECT(isnan(got), "%s: (%lld,%lld) of %lldx%lldx%lld is %g, want NaN", what,
                       (long long)i, (long long)j, (long long)M, (long long)K, (long long)N, got);
            else if (fabs(s) > FLT_MAX)
                EXPECT(got == (s > 0 ? INFINITY : -INFINITY), "%s: (%lld,%lld) is %g, want %g",
                       what, (long long)i, (long long)j, got, s > 0 ? INFINITY : -INFINITY);
            else
                EXPECT(fabs(got - s) <= (double)K * (0x1p-23 * sa + 0x1p-125),
                       "%s: (%lld,%lld) of %lldx%lldx%lld is %.9g, want %.9g (path %s)", what,
                       (long long)i, (long long)j, (long long)M, (long long)K, (long long)N, got, s,
                       nbi_isa_name(nbi_gemm_bf16_path()));
        }
    free(a);
    free(bt);
}

/* One product A (M,K) B (K,N) in the given layouts into a c of row stride
 * N + pad (pad >= 0; the gaps must stay untouched), checked. */
static void check_case(nbi_gemm_ws *ws, int64_t M, int64_t N, int64_t K, int la, int lb,
                       int f32, int64_t pad, uint64_t seed) {
    opnd A = make_opnd(M, K, la, f32, seed), B = make_opnd(K, N, lb, f32, seed * 7 + 1);
    const int64_t scm = N + pad, n = M * scm + 1;
    float *c = malloc((size_t)n * sizeof *c);
    ck_assert(c != NULL);
    for (int64_t i = 0; i < n; i++) c[i] = 12345.0f;
    ck_assert_int_eq(gemm(ws, &A, &B, c, scm, 1), 0);
    char what[160];
    snprintf(what, sizeof what, "A %s, B %s, %s", LAYOUT_NAMES[la], LAYOUT_NAMES[lb],
             f32 ? "f32" : "bf16");
    expect_product(&A, &B, c, scm, 1, what);
    for (int64_t i = 0; i < n; i++) /* the gaps between rows and past the end */
        if (i % scm >= N || i == n - 1) EXPECT(c[i] == 12345.0f, "c[%lld] overwritten", (long long)i);
    free(A.buf);
    free(B.buf);
    free(c);
}

/* ---------------------------------------------------------------- tests */
/* Every (M, N) of SIZES, K running over SIZES too (odd and even), and 33. */
START_TEST(test_values_edges) {
    nbi_gemm_ws ws = {0};
    for (int isa = NBI_ISA_PORTABLE; isa < NBI_ISA_COUNT; isa++) {
        if (!force_path(isa)) continue;
        for (int im = 0; im < NSIZES; im++)
            for (int in = 0; in < NSIZES; in++) {
                const int64_t M = SIZES[im], N = SIZES[in];
                const uint64_t seed = (uint64_t)(im * 31 + in);
                check_case(&ws, M, N, SIZES[(im + in + isa) % NSIZES], ROW, ROW, 0, 0, seed);
                check_case(&ws, M, N, 33, ROW, ROW, 0, 0, seed + 1000);
            }
    }
    nbi_gemm_ws_free(&ws);
    nbi_isa_force(-1);
}
END_TEST

/* K beyond one KC block (odd and even), M beyond MC, N beyond NC. */
START_TEST(test_values_blocks) {
    static const int64_t shapes[][3] = {{17, 33, 1100}, {65, 40, 1025}, {9, 2100, 70},
                                        {200, 37, 520}, {3, 5, 3001}};
    nbi_gemm_ws ws = {0};
    for (int isa = NBI_ISA_PORTABLE; isa < NBI_ISA_COUNT; isa++) {
        if (!force_path(isa)) continue;
        for (int s = 0; s < (int)(sizeof shapes / sizeof *shapes); s++) {
            check_case(&ws, shapes[s][0], shapes[s][1], shapes[s][2], ROW, ROW, 0, 0, (uint64_t)s);
            check_case(&ws, shapes[s][0], shapes[s][1], shapes[s][2], COL, COL, 1, 0, (uint64_t)s);
        }
    }
    nbi_gemm_ws_free(&ws);
    nbi_isa_force(-1);
}
END_TEST

/* K == 0 writes zeros over anything; M or N == 0 touches nothing. */
START_TEST(test_empty) {
    uint16_t ab[4] = {0};
    for (int isa = NBI_ISA_PORTABLE; isa < NBI_ISA_COUNT; isa++) {
        if (!force_path(isa)) continue;
        nbi_gemm_ws ws = {0};
        float c[15];
        for (int i = 0; i < 15; i++) c[i] = NAN;
        ck_assert_int_eq(nbi_gemm_bf16(&ws, 3, 4, 0, ab, 0, 0, 1, ab, 0, 4, 1, c, 5, 1), 0);
        for (int i = 0; i < 15; i++) ck_assert(i % 5 == 4 ? isnan(c[i]) : c[i] == 0.0f);
        for (int i = 0; i < 15; i++) c[i] = 7.0f;
        ck_assert_int_eq(nbi_gemm_bf16(&ws, 0, 4, 3, ab, 0, 3, 1, ab, 0, 4, 1, c, 4, 1), 0);
        ck_assert_int_eq(nbi_gemm_bf16(&ws, 3, 0, 3, ab, 1, 3, 1, ab, 1, 4, 1, c, 4, 1), 0);
        for (int i = 0; i < 15; i++) ck_assert(c[i] == 7.0f);
        nbi_gemm_ws_free(&ws);
    }
    nbi_isa_force(-1);
}
END_TEST

/* Every pair of layouts, bf16 and f32, with c's rows padded; then c
 * column-major (scn != 1) and strided both ways. */
START_TEST(test_layouts) {
    nbi_gemm_ws ws = {0};
    for (int isa = NBI_ISA_PORTABLE; isa < NBI_ISA_COUNT; isa++) {
        if (!force_path(isa)) continue;
        for (int la = 0; la < NLAYOUTS; la++)
            for (int lb = 0; lb < NLAYOUTS; lb++)
                for (int f32 = 0; f32 < 2; f32++)
                    check_case(&ws, 37, 70, 45 + f32, la, lb, f32, (la + lb) % 3 * 5,
                               (uint64_t)(la * 8 + lb));
        const int64_t M = 19, N = 35, K = 41;
        opnd A = make_opnd(M, K, COL, 0, 5), B = make_opnd(K, N, COL, 1, 6);
        float *c = malloc(sizeof(float) * 3 * M * N);
        ck_assert_int_eq(gemm(&ws, &A, &B, c, 1, M), 0); /* c column-major */
        expect_product(&A, &B, c, 1, M, "c column-major");
        ck_assert_int_eq(gemm(&ws, &A, &B, c, 3 * N, 3), 0); /* both strides > 1 */
        expect_product(&A, &B, c, 3 * N, 3, "c strided");
        free(c);
        free(A.buf);
        free(B.buf);
    }
    nbi_gemm_ws_free(&ws);
    nbi_isa_force(-1);
}
END_TEST

/* f32 operands, rounded as they are packed, give bitwise the C of the same
 * operands rounded first (nbi_bf16_from_f32): with NaNs, infinities, values
 * that round up to infinity, ties both ways, subnormals and signed zeros
 * among the values, in each layout (each packing routine). */
START_TEST(test_f32_operands_bitwise) {
    static const uint32_t specials[] = {
        0x7fc00000, 0xffc00001, 0x7f800001, 0x7fbfffff, /* NaNs (quiet, payload, signalling) */
        0x7f800000, 0xff800000,                         /* +-inf */
        0x7f7fffff, 0xff7f8000, 0x7f7f8000,             /* round up to +-inf (ties to even) */
        0x3f808000, 0x3f818000, 0xbf808000, 0x3f80c000, /* ties to even, down and up; not a tie */
        0x3f807fff, 0x00000001, 0x807fffff, 0x00400000, /* below a tie; subnormals */
        0x80000000, 0x00000000, 0x3f800000};            /* -0, +0, 1 */
    const int nsp = (int)(sizeof specials / sizeof *specials);
    nbi_gemm_ws ws = {0};
    for (int isa = NBI_ISA_PORTABLE; isa < NBI_ISA_COUNT; isa++) {
        if (!force_path(isa)) continue;
        for (int la = 0; la < NLAYOUTS; la++) {
            const int lb = (la * 3 + 1) % NLAYOUTS;
            const int64_t M = 23, N = 41, K = 37;
            opnd A = make_opnd(M, K, la, 1, 11), B = make_opnd(K, N, lb, 1, 12);
            for (int64_t i = 0; i < A.size; i += 29) /* one special in a few rows/columns */
                memcpy((float *)A.buf + i, &specials[(i / 29) % nsp], 4);
            for (int64_t i = 5; i < B.size; i += 31)
                memcpy((float *)B.buf + i, &specials[(i / 31) % nsp], 4);
            opnd Ah = rounded(&A), Bh = rounded(&B);
            float *c1 = malloc(sizeof(float) * M * N), *c2 = malloc(sizeof(float) * M * N);
            float *c3 = malloc(sizeof(float) * M * N);
            ck_assert_int_eq(gemm(&ws, &A, &B, c1, N, 1), 0);
            ck_assert_int_eq(gemm(&ws, &Ah, &Bh, c2, N, 1), 0);
            ck_assert_int_eq(gemm(&ws, &A, &Bh, c3, N, 1), 0); /* one of each */
            const size_t bytes = sizeof(float) * M * N;
            ck_assert_msg(!memcmp(c1, c2, bytes) && !memcmp(c1, c3, bytes),
                          "f32 operands (%s) differ from pre-rounded ones on path %s",
                          LAYOUT_NAMES[la], nbi_isa_name(isa));
            free(c1);
            free(c2);
            free(c3);
            free(A.buf);
            free(B.buf);
            free(Ah.buf);
            free(Bh.buf);
        }
    }
    nbi_gemm_ws_free(&ws);
    nbi_isa_force(-1);
}
END_TEST

/* A product computed in pieces, rows [0, r) and [r, M), or columns [0, q) and
 * [q, N) (each its own call), has the bits of the whole: on every path, with
 * K over several blocks, in plain and transposed layouts. */
START_TEST(test_pieces_bitwise) {
    static const int64_t shapes[][3] = {{45, 83, 300}, {21, 70, 1601}, {9, 40, 1030}};
    static const int64_t cuts[] = {1, 8, 17, 33};
    static const int lays[][2] = {{ROW, ROW}, {COL, ROW}, {ROW, COL}, {COL, COL}, {STRIDED, NARROW}};
    nbi_gemm_ws ws = {0};
    for (int isa = NBI_ISA_PORTABLE; isa < NBI_ISA_COUNT; isa++) {
        if (!force_path(isa)) continue;
        for (int s = 0; s < 3; s++)
            for (int l = 0; l < 5; l++) {
                const int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
                opnd A = make_opnd(M, K, lays[l][0], l & 1, (uint64_t)s);
                opnd B = make_opnd(K, N, lays[l][1], 0, (uint64_t)s + 9);
                float *whole = malloc(sizeof(float) * M * N), *part = malloc(sizeof(float) * M * N);
                ck_assert_int_eq(gemm(&ws, &A, &B, whole, N, 1), 0);
                for (int ci = 0; ci < 4; ci++) {
                    const int64_t r = cuts[ci] % M, q = cuts[(ci + 2) % 4] % N;
                    memset(part, 0xff, sizeof(float) * M * N);
                    ck_assert_int_eq(gemm_part(&ws, &A, &B, 0, r, 0, N, part, N, 1), 0);
                    ck_assert_int_eq(gemm_part(&ws, &A, &B, r, M - r, 0, N, part, N, 1), 0);
                    ck_assert_msg(!memcmp(whole, part, sizeof(float) * M * N),
                                  "rows cut at %lld: other bits on path %s", (long long)r,
                                  nbi_isa_name(isa));
                    memset(part, 0xff, sizeof(float) * M * N);
                    ck_assert_int_eq(gemm_part(&ws, &A, &B, 0, M, 0, q, part, N, 1), 0);
                    ck_assert_int_eq(gemm_part(&ws, &A, &B, 0, M, q, N - q, part, N, 1), 0);
                    ck_assert_msg(!memcmp(whole, part, sizeof(float) * M * N),
                                  "columns cut at %lld: other bits on path %s", (long long)q,
                                  nbi_isa_name(isa));
                }
                free(whole);
                free(part);
                free(A.buf);
                free(B.buf);
            }
    }
    nbi_gemm_ws_free(&ws);
    nbi_isa_force(-1);
}
END_TEST

/* NaN and inf propagate as in an f32 product: a NaN or inf in a row of A
 * makes its row NaN or inf, inf times 0 and inf - inf make NaN, and a sum
 * beyond FLT_MAX overflows to inf (every product there finite, so that the
 * double reference sees what f32 sums see). */
START_TEST(test_nan_inf) {
    const int64_t M = 6, N = 20, K = 9;
    nbi_gemm_ws ws = {0};
    for (int isa = NBI_ISA_PORTABLE; isa < NBI_ISA_COUNT; isa++) {
        if (!force_path(isa)) continue;
        for (int f32 = 0; f32 < 2; f32++) {
            opnd A = make_opnd(M, K, ROW, f32, 3), B = make_opnd(K, N, ROW, f32, 4);
            float av[6][9], bv[9][20];
            for (int64_t i = 0; i < M * K; i++) av[i / K][i % K] = 0.5f + (float)(i % 5) * 0.25f;
            for (int64_t i = 0; i < K * N; i++) bv[i / N][i % N] = 1.0f + (float)(i % 3) * 0.5f;
            av[0][3] = INFINITY;                      /* row 0: +inf */
            av[1][0] = NAN;                           /* row 1: NaN */
            av[2][5] = 0.0f, bv[5][2] = -INFINITY;    /* (2,2): inf * 0; column 2: -inf */
            av[3][1] = INFINITY, av[3][2] = -INFINITY; /* row 3: inf - inf */
            for (int k = 0; k < K; k++) av[4][k] = k == 5 ? 0.0f : 3.0e38f; /* row 4: overflows */
            for (int64_t i = 0; i < M * K; i++) {
                float v = av[i / K][i % K];
                if (f32) ((float *)A.buf)[i] = v;
                else ((uint16_t *)A.buf)[i] = nbi_bf16_from_f32(v);
            }
            for (int64_t i = 0; i < K * N; i++) {
                float v = bv[i / N][i % N];
                if (f32) ((float *)B.buf)[i] = v;
                else ((uint16_t *)B.buf)[i] = nbi_bf16_from_f32(v);
            }
            float c[6 * 20];
            ck_assert_int_eq(gemm(&ws, &A, &B, c, N, 1), 0);
            expect_product(&A, &B, c, N, 1, "NaN/inf");
            ck_assert(isinf(c[0]) && c[0] > 0 && isnan(c[N]) && isnan(c[2 * N + 2]));
            ck_assert(isinf(c[2 * N + 3]) == 0 && isinf(c[5 * N + 2]) && c[5 * N + 2] < 0);
            ck_assert(isnan(c[3 * N + 7]) && isinf(c[4 * N + 1]) && c[4 * N + 1] > 0);
            free(A.buf);
            free(B.buf);
        }
    }
    nbi_gemm_ws_free(&ws);
    nbi_isa_force(-1);
}
END_TEST

/* One workspace serves nbi_gemm_f32 and nbi_gemm_bf16 in turn, growing and
 * shrinking (the bf16 kernel's buffers are released by nbi_gemm_ws_free).
 * Small integers: both products are exact, so equal. */
START_TEST(test_workspace_shared) {
    enum { NMAX = 130 };
    float *a = malloc(sizeof(float) * NMAX * NMAX), *b = malloc(sizeof(float) * NMAX * NMAX);
    float *c = malloc(sizeof(float) * NMAX * NMAX), *c16 = malloc(sizeof(float) * NMAX * NMAX);
    for (int i = 0; i < NMAX * NMAX; i++) a[i] = (float)(i % 7) - 3.0f, b[i] = (float)(i % 5) - 2.0f;
    static const int64_t sizes[] = {8, 130, 3, 40, 130, 129};
    nbi_gemm_ws ws = {0};
    for (int r = 0; r < 6; r++) {
        const int64_t n = sizes[r];
        ck_assert_int_eq(nbi_gemm_f32(&ws, n, n, n, a, n, 1, b, n, 1, c, n, 1), 0);
        ck_assert_int_eq(nbi_gemm_bf16(&ws, n, n, n, a, 1, n, 1, b, 1, n, 1, c16, n, 1), 0);
        ck_assert(!memcmp(c, c16, sizeof(float) * (size_t)(n * n)));
        if (r == 2) nbi_gemm_ws_free(&ws);
    }
    nbi_gemm_ws_free(&ws);
    nbi_gemm_ws_free(&ws); /* a second release is harmless */
    free(a);
    free(b);
    free(c);
    free(c16);
}
END_TEST

Suite *suite_gemm_bf16(void) {
    Suite *s = suite_create("gemm_bf16");
    TCase *tc = tcase_create("values");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_values_edges);
    tcase_add_test(tc, test_values_blocks);
    tcase_add_test(tc, test_empty);
    tcase_add_test(tc, test_layouts);
    suite_add_tcase(s, tc);

    tc = tcase_create("bits");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_f32_operands_bitwise);
    tcase_add_test(tc, test_pieces_bitwise);
    tcase_add_test(tc, test_nan_inf);
    tcase_add_test(tc, test_workspace_shared);
    suite_add_tcase(s, tc);
    return s;
}
