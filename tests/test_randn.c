/* test_randn.c: nb_randn's values (tensor/randn.c). The definition is libm's
 * Box-Muller in double (fixtures from gen_randn.py, which computes it in
 * Python from the stream's formula); the f32 fast path must give the same
 * bits on every instruction-set path and thread count: checked against the
 * fixtures, against libm over millions of draws (including the draws that
 * land in the band around an f32 midpoint and go back to libm), and on edge
 * draws (u near 0 and 1, u2 at the zeros and extremes of the cosine). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tensor/tensor_internal.h" /* nbi_randn_path, nbi_randn_from_u, the stream */
#include "test_util.h"

static const int paths[] = {NBI_RANDN_PORTABLE, NBI_RANDN_AVX2, NBI_RANDN_AVX512};

static bool under_valgrind(void) {
    const char *pre = getenv("LD_PRELOAD");
    return pre && strstr(pre, "vgpreload");
}

/* the definition, as gen_randn.py and tensor/randn.c's normal_of write it */
static double libm_normal(double u, double u2) {
    return sqrt(-2.0 * log(1.0 - u)) * cos(6.283185307179586 * u2);
}

static void expect_bits(const nb_tensor *got, const nb_tensor *want, const char *what) {
    ck_assert_int_eq(nb_numel(got), nb_numel(want));
    size_t size = nb_dtype_of(got) == NB_F32 ? 4 : 8;
    const unsigned char *g = nb_data((nb_tensor *)got), *w = nb_data((nb_tensor *)want);
    for (int64_t i = 0; i < nb_numel(got); i++)
        if (memcmp(g + i * size, w + i * size, size) != 0)
            ck_abort_msg("%s: element %lld differs from the fixture", what, (long long)i);
}

START_TEST(test_randn_fixtures_every_path_and_thread_count) {
    int orig = nb_num_threads();
    /* a tensor cut in several ranges on the thread pool, against libm */
    enum { BIG = 300001 };
    float *want = malloc(BIG * sizeof *want);
    ck_assert(want != NULL);
    uint64_t key = nbi_rng_key(5);
    for (int64_t i = 0; i < BIG; i++)
        want[i] = (float)libm_normal(nbi_rng_uniform_key(key, 2 * (uint64_t)i + 2),
                                     nbi_rng_uniform_key(key, 2 * (uint64_t)i + 3));
    for (size_t p = 0; p < sizeof paths / sizeof paths[0]; p++) {
        int used = nbi_randn_path(paths[p]);
        for (int th = 1; th <= 3; th++) {
            nb_set_num_threads(th);
            char what[64];
            snprintf(what, sizeof what, "path %d, %d threads", used, th);
            nb_rng r = {.seed = 1234, .offset = 0};
            nb_tensor *a = nb_randn(NB_F32, NB_SHAPE(4099), &r);
            expect_bits(a, fx("randn.txt", "f32_seed1234"), what);
            nb_rng s = {.seed = 7, .offset = 5};
            nb_tensor *b = nb_randn(NB_F32, NB_SHAPE(10, 100), &s);
            ck_assert_int_eq(s.offset, 5 + 2000);
            nb_tensor *bf = nb_reshape(b, NB_SHAPE(1000));
            expect_bits(bf, fx("randn.txt", "f32_seed7_at5"), what);
            nb_rng t = {.seed = 1234, .offset = 0};
            nb_tensor *c = nb_randn(NB_F64, NB_SHAPE(67), &t);
            expect_bits(c, fx("randn.txt", "f64_seed1234"), what);
            nb_rng big = {.seed = 5, .offset = 2};
            nb_tensor *d = nb_randn(NB_F32, NB_SHAPE(BIG), &big);
            ck_assert_msg(memcmp(nb_data(d), want, BIG * sizeof *want) == 0,
                          "%s: %d elements differ from libm", what, BIG);
            nb_free(a), nb_free(b), nb_free(bf), nb_free(c), nb_free(d);
        }
    }
    free(want);
    nbi_randn_path(NBI_RANDN_AUTO);
    nb_set_num_threads(orig);
}
END_TEST

/* n stream draws of each path against libm bit for bit; the fast doubles'
 * largest relative difference from libm's stays below the error bound the
 * band relies on (2^-49; the band is 2^-40), and some draws did fall in the
 * band (so the libm recomputation ran and gave the same bits). */
START_TEST(test_randn_millions_of_draws_equal_libm) {
    int64_t n = under_valgrind() ? (1 << 16) : (1 << 24), chunk = 1 << 20; /* 16M per path */
    if (chunk > n) chunk = n;
    double *u = malloc((size_t)chunk * sizeof *u), *u2 = malloc((size_t)chunk * sizeof *u2);
    double *raw = malloc((size_t)chunk * sizeof *raw);
    float *out = malloc((size_t)chunk * sizeof *out);
    ck_assert(u && u2 && raw && out);
    uint64_t key = nbi_rng_key(99);
    for (size_t p = 0; p < sizeof paths / sizeof paths[0]; p++) {
        int used = nbi_randn_path(paths[p]);
        double worst = 0;
        int64_t in_band = 0;
        for (int64_t at = 0; at < n; at += chunk) {
            for (int64_t i = 0; i < chunk; i++) {
                u[i] = nbi_rng_uniform_key(key, 2 * (uint64_t)(at + i));
                u2[i] = nbi_rng_uniform_key(key, 2 * (uint64_t)(at + i) + 1);
            }
            nbi_randn_from_u(used, u, u2, out, raw, chunk, 0);
            for (int64_t i = 0; i < chunk; i++) {
                double want = libm_normal(u[i], u2[i]);
                float wf = (float)want;
                if (memcmp(&out[i], &wf, 4) != 0) /* (Check writes a record per assertion) */
                    ck_abort_msg("path %d, draw %lld: %a, libm %a (fast double %a)", used,
                                 (long long)(at + i), (double)out[i], want, raw[i]);
                double rel = want != 0 ? fabs(raw[i] - want) / fabs(want) : fabs(raw[i]);
                if (rel > worst) worst = rel;
                uint64_t b;
                memcpy(&b, &raw[i], 8);
                uint64_t low = b & 0x1FFFFFFF; /* the 29 bits f32 rounds away */
                if (low + 8192 >= 0x10000000 && low <= 0x10000000 + 8192) in_band++;
            }
        }
        printf("randn path %d: %lld draws equal libm's f32; fast double within %.2g (2^%.1f) "
               "of libm's; %lld in the band went to libm\n",
               used, (long long)n, worst, worst > 0 ? log2(worst) : -INFINITY, (long long)in_band);
        ck_assert_msg(worst <= 0x1p-49, "path %d: relative error %g above 2^-49", used, worst);
        if (!under_valgrind()) ck_assert_int_gt(in_band, 0);
    }
    nbi_randn_path(NBI_RANDN_AUTO);
    free(u), free(u2), free(raw), free(out);
}
END_TEST

/* The band at work: the fast doubles moved by up to 8000 ulps (over 1,000
 * times the largest error measured above, still inside the 8192-ulp band)
 * must round as libm's do: the elements whose moved value crosses an f32
 * midpoint (about d / 2^29 of them for d ulps) are the band's to catch; a
 * band of 4000 fails here. */
START_TEST(test_randn_band_catches_errors_up_to_its_width) {
    int64_t n = under_valgrind() ? (1 << 14) : (1 << 21);
    double *u = malloc((size_t)n * sizeof *u), *u2 = malloc((size_t)n * sizeof *u2);
    double *raw = malloc((size_t)n * sizeof *raw);
    float *out = malloc((size_t)n * sizeof *out);
    ck_assert(u && u2 && raw && out);
    uint64_t key = nbi_rng_key(31);
    for (int64_t i = 0; i < n; i++) {
        u[i] = nbi_rng_uniform_key(key, 2 * (uint64_t)i);
        u2[i] = nbi_rng_uniform_key(key, 2 * (uint64_t)i + 1);
    }
    const int64_t nudges[] = {8000, -8000, 4096, -4096, 1};
    int used = nbi_randn_path(NBI_RANDN_AUTO);
    for (size_t k = 0; k < sizeof nudges / sizeof nudges[0]; k++) {
        nbi_randn_from_u(used, u, u2, out, raw, n, nudges[k]);
        int64_t crossed = 0;
        for (int64_t i = 0; i < n; i++) {
            float wf = (float)libm_normal(u[i], u2[i]);
            if (memcmp(&out[i], &wf, 4) != 0)
                ck_abort_msg("nudge %lld, draw %lld: %a, libm %a", (long long)nudges[k],
                             (long long)i, (double)out[i], (double)wf);
            crossed += (float)raw[i] != wf;
        }
        printf("randn band: %lld draws moved by %lld ulps: %lld would round wrongly without "
               "it; all equal libm's\n", (long long)n, (long long)nudges[k], (long long)crossed);
        if (nudges[k] >= 4096 && !under_valgrind()) ck_assert_int_gt(crossed, 0);
    }
    free(u), free(u2), free(raw), free(out);
}
END_TEST

/* Draws at the ends: u = 0 (u1 = 1: v = +-0, the sign from cos), u near 1
 * (u1 = 2^-53: the largest |v|, 8.57), u near 1 - 1/sqrt(2) and 1/2 (the
 * log's reduction switching), u2 at 0, 1/4, 1/2, 3/4 and their neighbours
 * (cos at 1, its zeros and -1; the quadrant switching) and near 1. */
START_TEST(test_randn_edge_draws) {
    const double us[] = {0.0, 0x1p-53, 0x1p-52, 3 * 0x1p-53, 0x1p-30, 0.25,
                         0.29289321881345243, 0.2928932188134524, 0.29289321881345254,
                         0.5 - 0x1p-54, 0.5, 0.5 + 0x1p-53, 0.75, 1 - 0x1p-30, 1 - 0x1p-52,
                         1 - 0x1p-53};
    const double u2s[] = {0.0, 0x1p-53, 0.125, 0.25 - 0x1p-55, 0.25, 0.25 + 0x1p-54,
                          0.375, 0.5 - 0x1p-54, 0.5, 0.5 + 0x1p-53, 0.625, 0.75 - 0x1p-54,
                          0.75, 0.75 + 0x1p-53, 0.875, 1 - 0x1p-53};
    enum { NU = sizeof us / sizeof us[0], NU2 = sizeof u2s / sizeof u2s[0], N = NU * NU2 };
    double u[N], u2[N], raw[N];
    float out[N];
    for (int i = 0; i < NU; i++)
        for (int j = 0; j < NU2; j++) u[i * NU2 + j] = us[i], u2[i * NU2 + j] = u2s[j];
    for (size_t p = 0; p < sizeof paths / sizeof paths[0]; p++) {
        int used = nbi_randn_path(paths[p]);
        nbi_randn_from_u(used, u, u2, out, raw, N, 0);
        for (int k = 0; k < N; k++) {
            double want = libm_normal(u[k], u2[k]);
            float wf = (float)want;
            ck_assert_msg(memcmp(&out[k], &wf, 4) == 0, "path %d, u %a, u2 %a: %a, libm %a",
                          used, u[k], u2[k], (double)out[k], want);
            if (want != 0)
                ck_assert_msg(fabs(raw[k] - want) <= 0x1p-49 * fabs(want),
                              "path %d, u %a, u2 %a: fast %a, libm %a", used, u[k], u2[k],
                              raw[k], want);
        }
    }
    /* the largest value, and the signed zeros as libm makes them: u = 0 gives
     * sqrt(-2 * 0) = sqrt(-0) = -0, times cos */
    ck_assert(out[(NU - 1) * NU2] == (float)sqrt(106 * log(2.0)));
    ck_assert(out[0] == 0 && signbit(out[0]));  /* u2 = 0: cos = 1 */
    ck_assert(out[8] == 0 && !signbit(out[8])); /* u2 = 1/2: cos = -1 */
    nbi_randn_path(NBI_RANDN_AUTO);
}
END_TEST

Suite *suite_randn(void) {
    Suite *s = suite_create("randn");
    TCase *tc = tcase_create("values");
    tcase_set_timeout(tc, 600); /* a hang guard: its slowest takes 12 s on a busy machine */
    tcase_add_test(tc, test_randn_fixtures_every_path_and_thread_count);
    tcase_add_test(tc, test_randn_millions_of_draws_equal_libm);
    tcase_add_test(tc, test_randn_band_catches_errors_up_to_its_width);
    tcase_add_test(tc, test_randn_edge_draws);
    suite_add_tcase(s, tc);
    return s;
}
