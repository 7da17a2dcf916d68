/* test_schedule.c: the learning-rate schedules of nn/train/schedule.c
 * against PyTorch 1.13's schedulers and nanoGPT's get_lr
 * (tests/fixtures/gen_schedules.py): every step of several configurations of
 * each, past the end too, within 1e-12 relative. PyTorch steps its
 * schedulers recursively (the new rate from the previous one), so its rates
 * drift from the closed forms computed here by a few ulps over a run: the
 * suite prints the largest deviation it saw. Then the edges the fixtures
 * cannot show (total == warmup, a rate that overflows, an empty OneCycle
 * phase), and every refused argument by its message. */
#include "test_util.h"

#include <stdlib.h>

static const char *FX = "schedules.txt";

typedef enum { COSINE, ANNEALING, STEP, EXPONENTIAL, LINEAR, ONE_CYCLE } kind;

/* One configuration of the fixtures: i0, i1, d0..d3, b0, b1 are the
 * function's arguments after step, in its order, by type. */
typedef struct {
    const char *name;
    kind k;
    int64_t i0, i1;
    double d0, d1, d2, d3;
    bool b0, b1;
} config;

static double rate(const config *c, int64_t step) {
    switch (c->k) {
    case COSINE: return nb_lr_cosine(step, c->i0, c->i1, c->d0, c->d1);
    case ANNEALING: return nb_lr_cosine_annealing(step, c->i0, c->d0, c->d1);
    case STEP: return nb_lr_step(step, c->i0, c->d0, c->d1);
    case EXPONENTIAL: return nb_lr_exponential(step, c->d0, c->d1);
    case LINEAR: return nb_lr_linear(step, c->d0, c->d1, c->i0, c->d2);
    case ONE_CYCLE:
        return nb_lr_one_cycle(step, c->i0, c->d0, c->d1, c->d2, c->d3, c->b0, c->b1);
    }
    return NAN;
}

/* The configurations of gen_schedules.py, with PyTorch's defaults spelt out. */
static const config CONFIGS[] = {
    {"cos_w10", COSINE, 10, 100, 6e-4, 6e-5, 0, 0, 0, 0},
    {"cos_w0", COSINE, 0, 50, 1e-3, 0.0, 0, 0, 0, 0},
    {"cos_short", COSINE, 10, 5, 1e-3, 1e-4, 0, 0, 0, 0},
    {"cos_gpt2", COSINE, 2000, 600000, 6e-4, 6e-5, 0, 0, 0, 0},
    {"ca_t10", ANNEALING, 10, 0, 0.1, 0.0, 0, 0, 0, 0},
    {"ca_t7_min", ANNEALING, 7, 0, 1.0, 0.01, 0, 0, 0, 0},
    {"ca_t100", ANNEALING, 100, 0, 1e-3, 1e-5, 0, 0, 0, 0},
    {"ca_t1", ANNEALING, 1, 0, 0.5, 0.0, 0, 0, 0, 0},
    {"step_3", STEP, 3, 0, 0.1, 0.05, 0, 0, 0, 0},
    {"step_1", STEP, 1, 0, 0.5, 1.0, 0, 0, 0, 0},
    {"step_30", STEP, 30, 0, 0.1, 0.05, 0, 0, 0, 0},
    {"step_grow", STEP, 5, 0, 1.5, 0.01, 0, 0, 0, 0},
    {"exp_09", EXPONENTIAL, 0, 0, 0.9, 0.1, 0, 0, 0, 0},
    {"exp_07", EXPONENTIAL, 0, 0, 0.7, 1e-3, 0, 0, 0, 0},
    {"exp_grow", EXPONENTIAL, 0, 0, 1.02, 0.01, 0, 0, 0, 0},
    {"lin_default", LINEAR, 5, 0, 1.0 / 3, 1.0, 0.05, 0, 0, 0},
    {"lin_half", LINEAR, 4, 0, 0.5, 1.0, 0.05, 0, 0, 0},
    {"lin_to_0", LINEAR, 12, 0, 1.0, 0.0, 0.1, 0, 0, 0},
    {"lin_down", LINEAR, 7, 0, 1.0, 0.25, 2.0, 0, 0, 0},
    {"lin_up", LINEAR, 3, 0, 0.1, 0.9, 1.0, 0, 0, 0},
    {"oc_default", ONE_CYCLE, 100, 0, 0.1, 0.3, 25, 1e4, false, true},
    {"oc_linear", ONE_CYCLE, 50, 0, 0.01, 0.25, 25, 1e4, false, false},
    {"oc_three", ONE_CYCLE, 60, 0, 1.0, 0.3, 25, 1e4, true, true},
    {"oc_three_linear", ONE_CYCLE, 37, 0, 0.5, 0.4, 10, 100, true, false},
    {"oc_linear_end", ONE_CYCLE, 20, 0, 0.1, 0.5, 2, 2, false, false},
    {"oc_pct0", ONE_CYCLE, 10, 0, 0.2, 0.0, 25, 1e4, false, true},
    {"oc_pct1", ONE_CYCLE, 10, 0, 0.2, 1.0, 25, 1e4, false, true},
    {"oc_total1", ONE_CYCLE, 1, 0, 0.3, 0.3, 25, 1e4, false, true},
};
#define NCONFIGS ((int)(sizeof CONFIGS / sizeof CONFIGS[0]))

/* Every step of configuration _i against its fixture, each within 1e-12 of
 * PyTorch's rate relative to it (a rate PyTorch makes exactly 0 must be 0). */
START_TEST(test_vs_torch) {
    const config *c = &CONFIGS[_i];
    char steps_name[64];
    snprintf(steps_name, sizeof steps_name, "%s_steps", c->name);
    nb_tensor *steps = fx(FX, steps_name), *want_t = fx(FX, c->name);
    int64_t n = nb_numel(steps);
    ck_assert_int_eq(n, nb_numel(want_t));
    double *s = malloc((size_t)n * sizeof *s), *want = malloc((size_t)n * sizeof *want);
    nb_copy_to_f64(steps, s);
    nb_copy_to_f64(want_t, want);
    double dev = 0;
    for (int64_t i = 0; i < n; i++) {
        double got = rate(c, (int64_t)s[i]);
        ck_assert_msg(got >= 0, "%s step %g: %g (%s)", c->name, s[i], got,
                      nb_last_error() ? nb_last_error() : "no error set");
        double err = fabs(got - want[i]);
        ck_assert_msg(err <= 1e-12 * fabs(want[i]), "%s step %g: %.17g, PyTorch %.17g", c->name,
                      s[i], got, want[i]);
        if (want[i] != 0) dev = fmax(dev, err / fabs(want[i]));
    }
    printf("schedule ok  %-16s %3lld steps, max relative deviation %.1e\n", c->name, (long long)n,
           dev);
    fflush(stdout);
    free(s);
    free(want);
}
END_TEST

/* What the fixtures cannot show: PyTorch or nanoGPT fail there, or the
 * value is known in closed form. */
START_TEST(test_edges) {
    /* total == warmup: warmup, then min_lr (nanoGPT divides 0 by 0) */
    ck_assert_double_eq(nb_lr_cosine(9, 10, 10, 1.0, 0.1), 10.0 / 11);
    ck_assert_double_eq(nb_lr_cosine(10, 10, 10, 1.0, 0.1), 0.1);
    ck_assert_double_eq(nb_lr_cosine(11, 10, 10, 1.0, 0.1), 0.1);
    ck_assert_double_eq(nb_lr_cosine(0, 0, 0, 1.0, 0.1), 0.1);
    /* the cosine starts at lr and ends at min_lr exactly */
    ck_assert_double_eq(nb_lr_cosine(10, 10, 100, 6e-4, 6e-5), 6e-4);
    ck_assert_double_eq(nb_lr_cosine(100, 10, 100, 6e-4, 6e-5), 6e-5);
    ck_assert_double_eq(nb_lr_cosine_annealing(0, 10, 0.1, 0.0), 0.1);
    ck_assert_double_eq(nb_lr_cosine_annealing(10, 10, 0.1, 0.0), 0.0);
    ck_assert_double_eq(nb_lr_cosine_annealing(20, 10, 0.1, 0.0), 0.1);
    /* min_lr == lr: constant */
    ck_assert_double_eq(nb_lr_cosine(50, 10, 100, 0.1, 0.1), 0.1);
    ck_assert_double_eq(nb_lr_cosine_annealing(5, 10, 0.1, 0.1), 0.1);
    /* LinearLR holds end_factor * lr after total_iters */
    ck_assert_double_eq(nb_lr_linear(1000000, 0.5, 0.25, 4, 2.0), 0.5);
    /* gamma 0: lr, then 0 */
    ck_assert_double_eq(nb_lr_exponential(0, 0.0, 0.1), 0.1);
    ck_assert_double_eq(nb_lr_exponential(1, 0.0, 0.1), 0.0);
    /* a rate of 0 is a rate */
    ck_assert_double_eq(nb_lr_step(7, 2, 0.5, 0.0), 0.0);
    ck_assert_double_eq(nb_lr_one_cycle(3, 10, 0.0, 0.3, 25, 1e4, false, true), 0.0);
    /* OneCycleLR: starts at max_lr / div_factor, peaks at max_lr at step
     * pct_start * total - 1, ends at max_lr / div_factor / final_div_factor */
    ck_assert_double_eq_tol(nb_lr_one_cycle(0, 100, 0.1, 0.3, 25, 1e4, false, true), 0.004,
                            1e-17);
    ck_assert_double_eq(nb_lr_one_cycle(29, 100, 0.1, 0.3, 25, 1e4, false, true), 0.1);
    ck_assert_double_eq_tol(nb_lr_one_cycle(99, 100, 0.1, 0.3, 25, 1e4, false, true), 4e-7,
                            1e-20);
    ck_assert_ptr_null(nb_last_error());
}
END_TEST

/* The whole message: function, argument, value. */
#define expect_message(rc, text)                                                            \
    do {                                                                                    \
        double rc_ = (rc);                                                                  \
        ck_assert_msg(rc_ == -1.0, "%s: expected -1, got %g", #rc, rc_);                    \
        ck_assert_msg(nb_last_error() && !strcmp(nb_last_error(), (text)),                 \
                      "%s: error \"%s\", expected \"%s\"", #rc,                             \
                      nb_last_error() ? nb_last_error() : "(none)", (text));                \
        nb_clear_error();                                                                   \
    } while (0)

START_TEST(test_errors_cosine) {
    expect_message(nb_lr_cosine(-1, 10, 100, 1e-3, 0), "nb_lr_cosine: step must be >= 0, got -1");
    expect_message(nb_lr_cosine(0, -3, 100, 1e-3, 0), "nb_lr_cosine: warmup must be >= 0, got -3");
    expect_message(nb_lr_cosine(0, 10, -1, 1e-3, 0), "nb_lr_cosine: total must be >= 0, got -1");
    expect_message(nb_lr_cosine(0, 10, 100, -1e-3, 0),
                   "nb_lr_cosine: lr must be finite and >= 0, got -0.001");
    expect_message(nb_lr_cosine(0, 10, 100, NAN, 0),
                   "nb_lr_cosine: lr must be finite and >= 0, got nan");
    expect_message(nb_lr_cosine(0, 10, 100, INFINITY, 0),
                   "nb_lr_cosine: lr must be finite and >= 0, got inf");
    expect_message(nb_lr_cosine(0, 10, 100, 1e-3, -1),
                   "nb_lr_cosine: min_lr must be finite and >= 0, got -1");
    expect_message(nb_lr_cosine(0, 10, 100, 1e-3, NAN),
                   "nb_lr_cosine: min_lr must be finite and >= 0, got nan");
    /* the arguments swapped */
    expect_message(nb_lr_cosine(0, 10, 100, 6e-5, 6e-4),
                   "nb_lr_cosine: min_lr must be <= lr (6e-05), got 0.0006");
    expect_message(nb_lr_cosine_annealing(-2, 10, 0.1, 0),
                   "nb_lr_cosine_annealing: step must be >= 0, got -2");
    expect_message(nb_lr_cosine_annealing(0, 0, 0.1, 0),
                   "nb_lr_cosine_annealing: t_max must be > 0, got 0");
    expect_message(nb_lr_cosine_annealing(0, 10, NAN, 0),
                   "nb_lr_cosine_annealing: lr must be finite and >= 0, got nan");
    expect_message(nb_lr_cosine_annealing(0, 10, 0.1, -0.5),
                   "nb_lr_cosine_annealing: eta_min must be finite and >= 0, got -0.5");
    expect_message(nb_lr_cosine_annealing(0, 10, 0.1, 0.2),
                   "nb_lr_cosine_annealing: eta_min must be <= lr (0.1), got 0.2");
}
END_TEST

START_TEST(test_errors_decay) {
    expect_message(nb_lr_step(-1, 3, 0.1, 0.05), "nb_lr_step: step must be >= 0, got -1");
    expect_message(nb_lr_step(0, 0, 0.1, 0.05), "nb_lr_step: step_size must be > 0, got 0");
    expect_message(nb_lr_step(0, -4, 0.1, 0.05), "nb_lr_step: step_size must be > 0, got -4");
    expect_message(nb_lr_step(0, 3, -0.1, 0.05),
                   "nb_lr_step: gamma must be finite and >= 0, got -0.1");
    expect_message(nb_lr_step(0, 3, 0.1, NAN), "nb_lr_step: lr must be finite and >= 0, got nan");
    expect_message(nb_lr_step(10000, 1, 2.0, 1.0),
                   "nb_lr_step: lr 1 * gamma 2 ^ 10000 overflows at step 10000");
    expect_message(nb_lr_exponential(-5, 0.9, 0.1), "nb_lr_exponential: step must be >= 0, got -5");
    expect_message(nb_lr_exponential(0, NAN, 0.1),
                   "nb_lr_exponential: gamma must be finite and >= 0, got nan");
    expect_message(nb_lr_exponential(0, 0.9, -1),
                   "nb_lr_exponential: lr must be finite and >= 0, got -1");
    expect_message(nb_lr_exponential(5000, 1.5, 0.1),
                   "nb_lr_exponential: lr 0.1 * gamma 1.5 ^ 5000 overflows at step 5000");
    expect_message(nb_lr_linear(-1, 0.5, 1, 4, 0.05), "nb_lr_linear: step must be >= 0, got -1");
    expect_message(nb_lr_linear(0, 0.0, 1, 4, 0.05),
                   "nb_lr_linear: start_factor must be in (0, 1], got 0");
    expect_message(nb_lr_linear(0, 1.5, 1, 4, 0.05),
                   "nb_lr_linear: start_factor must be in (0, 1], got 1.5");
    expect_message(nb_lr_linear(0, NAN, 1, 4, 0.05),
                   "nb_lr_linear: start_factor must be in (0, 1], got nan");
    expect_message(nb_lr_linear(0, 0.5, -0.1, 4, 0.05),
                   "nb_lr_linear: end_factor must be in [0, 1], got -0.1");
    expect_message(nb_lr_linear(0, 0.5, 2, 4, 0.05),
                   "nb_lr_linear: end_factor must be in [0, 1], got 2");
    expect_message(nb_lr_linear(0, 0.5, 1, 0, 0.05),
                   "nb_lr_linear: total_iters must be > 0, got 0");
    expect_message(nb_lr_linear(0, 0.5, 1, 4, INFINITY),
                   "nb_lr_linear: lr must be finite and >= 0, got inf");
}
END_TEST

START_TEST(test_errors_one_cycle) {
    expect_message(nb_lr_one_cycle(-1, 100, 0.1, 0.3, 25, 1e4, false, true),
                   "nb_lr_one_cycle: step must be >= 0, got -1");
    expect_message(nb_lr_one_cycle(0, 0, 0.1, 0.3, 25, 1e4, false, true),
                   "nb_lr_one_cycle: total_steps must be > 0, got 0");
    expect_message(nb_lr_one_cycle(0, 100, -0.1, 0.3, 25, 1e4, false, true),
                   "nb_lr_one_cycle: max_lr must be finite and >= 0, got -0.1");
    expect_message(nb_lr_one_cycle(0, 100, 0.1, 1.3, 25, 1e4, false, true),
                   "nb_lr_one_cycle: pct_start must be in [0, 1], got 1.3");
    expect_message(nb_lr_one_cycle(0, 100, 0.1, -0.3, 25, 1e4, false, true),
                   "nb_lr_one_cycle: pct_start must be in [0, 1], got -0.3");
    expect_message(nb_lr_one_cycle(0, 100, 0.1, 0.3, 0, 1e4, false, true),
                   "nb_lr_one_cycle: div_factor must be finite and > 0, got 0");
    expect_message(nb_lr_one_cycle(0, 100, 0.1, 0.3, 25, NAN, false, true),
                   "nb_lr_one_cycle: final_div_factor must be finite and > 0, got nan");
    /* PyTorch: "Tried to step 102 times. The specified number of total steps is 100" */
    expect_message(nb_lr_one_cycle(101, 100, 0.1, 0.3, 25, 1e4, false, true),
                   "nb_lr_one_cycle: step 101 is past total_steps 100");
    /* where PyTorch divides by zero: pct_start * total_steps == 1 (phase 1
     * ends at step 0, where it starts), and step total_steps when phase 1
     * takes all of them */
    expect_message(nb_lr_one_cycle(0, 4, 0.1, 0.25, 25, 1e4, false, true),
                   "nb_lr_one_cycle: step 0 falls in phase 1, which is empty (pct_start 0.25, "
                   "total_steps 4)");
    expect_message(nb_lr_one_cycle(10, 10, 0.2, 1.0, 25, 1e4, false, true),
                   "nb_lr_one_cycle: step 10 falls in phase 2, which is empty (pct_start 1, "
                   "total_steps 10)");
    ck_assert(nb_lr_one_cycle(9, 10, 0.2, 1.0, 25, 1e4, false, true) == 0.2);
    /* linear annealing at step total_steps: PyTorch's rate is negative
     * (-0.000266626, never used by an optimizer step) */
    expect_message(nb_lr_one_cycle(50, 50, 0.01, 0.25, 25, 1e4, false, false),
                   "nb_lr_one_cycle: step 50 extrapolates the linear annealing to a negative "
                   "rate (-0.000266626); the last step of a run is total_steps - 1 (49)");
}
END_TEST

Suite *suite_schedule(void) {
    Suite *s = suite_create("schedule");
    TCase *tc = tcase_create("vs_torch");
    tcase_add_loop_test(tc, test_vs_torch, 0, NCONFIGS);
    tcase_add_test(tc, test_edges);
    suite_add_tcase(s, tc);
    tc = tcase_create("errors");
    tcase_add_test(tc, test_errors_cosine);
    tcase_add_test(tc, test_errors_decay);
    tcase_add_test(tc, test_errors_one_cycle);
    suite_add_tcase(s, tc);
    return s;
}
