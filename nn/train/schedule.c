/* schedule.c: learning-rate schedules as pure functions of the step, so a
 * resumed run computes the rate it would have had without stopping.
 *
 * Each follows a PyTorch 1.13 scheduler of torch/optim/lr_scheduler.py (or
 * nanoGPT's get_lr, or The Annotated Transformer's rate): "step" is the
 * scheduler's last_epoch, the number of scheduler.step() calls made after
 * the one its constructor makes, so step 0 is the rate of the first
 * optimizer step. PyTorch steps most of them recursively (the new rate from
 * the old one); the closed forms here agree with those to about 1e-15
 * relative, and exactly with the _get_closed_form_lr PyTorch uses when
 * given an epoch.
 *
 * Arguments PyTorch refuses, or on which it divides by zero, are refused
 * here: -1.0 with a message naming the function, the argument and its
 * value. */
#include <math.h>

#include "../nn_internal.h"

static const double PI = 3.14159265358979323846;

/* ------------------------------------------------------------ checks */
/* Each is true, or false with the message set. */
static bool at_least(const char *fn, const char *arg, int64_t v, int64_t min) {
    if (v >= min) return true;
    nn_error("%s: %s must be %s, got %lld", fn, arg, min == 0 ? ">= 0" : "> 0", (long long)v);
    return false;
}

/* A rate or factor: finite and >= 0 (an optimizer refuses a negative lr). */
static bool rate_ok(const char *fn, const char *arg, double v) {
    if (v >= 0 && isfinite(v)) return true;
    nn_error("%s: %s must be finite and >= 0, got %g", fn, arg, v);
    return false;
}

/* A floor: a rate no larger than the rate it anneals from (the swapped
 * arguments nb_lr_cosine(step, w, t, min_lr, lr) would anneal upwards). */
static bool floor_ok(const char *fn, const char *arg, double v, double lr) {
    if (!rate_ok(fn, arg, v)) return false;
    if (v <= lr) return true;
    nn_error("%s: %s must be <= lr (%g), got %g", fn, arg, lr, v);
    return false;
}

static bool in_range(const char *fn, const char *arg, double v, double lo, bool lo_open,
                     double hi) {
    if ((lo_open ? v > lo : v >= lo) && v <= hi) return true;
    nn_error("%s: %s must be in %s%g, %g], got %g", fn, arg, lo_open ? "(" : "[", lo, hi, v);
    return false;
}

/* lr * gamma^k, or -1.0 when it overflows (gamma > 1, many steps). */
static double decayed(const char *fn, double lr, double gamma, int64_t k, int64_t step) {
    double r = lr * pow(gamma, (double)k);
    if (isfinite(r)) return r;
    return (nn_error("%s: lr %g * gamma %g ^ %lld overflows at step %lld", fn, lr, gamma,
                     (long long)k, (long long)step),
            -1.0);
}

/* ------------------------------------------------------------ schedules */
double nb_noam_rate(int64_t step, int64_t d_model, double factor, int64_t warmup) {
    const char *fn = "nb_noam_rate";
    if (step < 0) return (nn_error("%s: step must be >= 0, got %lld", fn, (long long)step), -1.0);
    if (d_model <= 0)
        return (nn_error("%s: d_model must be > 0, got %lld", fn, (long long)d_model), -1.0);
    if (warmup < 0)
        return (nn_error("%s: warmup must be >= 0, got %lld", fn, (long long)warmup), -1.0);
    if (!(factor >= 0)) return (nn_error("%s: factor must be >= 0, got %g", fn, factor), -1.0);
    double s = step == 0 ? 1.0 : (double)step;
    double decay = pow(s, -0.5);
    double warm = warmup > 0 ? s * pow((double)warmup, -1.5) : INFINITY;
    return factor * (pow((double)d_model, -0.5) * (warm < decay ? warm : decay));
}

/* nanoGPT's get_lr(it), operation for operation. */
double nb_lr_cosine(int64_t step, int64_t warmup, int64_t total, double lr, double min_lr) {
    const char *fn = "nb_lr_cosine";
    if (!at_least(fn, "step", step, 0) || !at_least(fn, "warmup", warmup, 0) ||
        !at_least(fn, "total", total, 0) || !rate_ok(fn, "lr", lr) ||
        !floor_ok(fn, "min_lr", min_lr, lr))
        return -1.0;
    if (step < warmup) return lr * ((double)step + 1) / ((double)warmup + 1);
    /* total <= warmup: no cosine to run (nanoGPT would divide 0 by 0 at
     * step == total == warmup) */
    if (step > total || total <= warmup) return min_lr;
    double ratio = (double)(step - warmup) / (double)(total - warmup);
    double coeff = 0.5 * (1.0 + cos(PI * ratio));
    return min_lr + coeff * (lr - min_lr);
}

double nb_lr_cosine_annealing(int64_t step, int64_t t_max, double lr, double eta_min) {
    const char *fn = "nb_lr_cosine_annealing";
    if (!at_least(fn, "step", step, 0) || !at_least(fn, "t_max", t_max, 1) ||
        !rate_ok(fn, "lr", lr) || !floor_ok(fn, "eta_min", eta_min, lr))
        return -1.0;
    return eta_min + (lr - eta_min) * (1 + cos(PI * (double)step / (double)t_max)) / 2;
}

double nb_lr_step(int64_t step, int64_t step_size, double gamma, double lr) {
    const char *fn = "nb_lr_step";
    if (!at_least(fn, "step", step, 0) || !at_least(fn, "step_size", step_size, 1) ||
        !rate_ok(fn, "gamma", gamma) || !rate_ok(fn, "lr", lr))
        return -1.0;
    return decayed(fn, lr, gamma, step / step_size, step);
}

double nb_lr_exponential(int64_t step, double gamma, double lr) {
    const char *fn = "nb_lr_exponential";
    if (!at_least(fn, "step", step, 0) || !rate_ok(fn, "gamma", gamma) || !rate_ok(fn, "lr", lr))
        return -1.0;
    return decayed(fn, lr, gamma, step, step);
}

/* start_factor 0 is refused as PyTorch 2 does: 1.13 accepts it and then
 * divides by zero at step 1. */
double nb_lr_linear(int64_t step, double start_factor, double end_factor, int64_t total_iters,
                    double lr) {
    const char *fn = "nb_lr_linear";
    if (!at_least(fn, "step", step, 0) ||
        !in_range(fn, "start_factor", start_factor, 0, true, 1) ||
        !in_range(fn, "end_factor", end_factor, 0, false, 1) ||
        !at_least(fn, "total_iters", total_iters, 1) || !rate_ok(fn, "lr", lr))
        return -1.0;
    int64_t done = step < total_iters ? step : total_iters;
    return lr * (start_factor + (end_factor - start_factor) * (double)done / (double)total_iters);
}

/* ------------------------------------------------------------ one cycle */
typedef struct {
    double end_step, start_lr, end_lr;
} cycle_phase;

/* OneCycleLR's phases: warm up to max_lr, (three_phase: back down to the
 * initial rate,) anneal to the minimum. Returns their count. */
static int cycle_phases(cycle_phase *p, int64_t total_steps, double max_lr, double pct_start,
                        double initial, double min_lr, bool three_phase) {
    double t = (double)total_steps;
    p[0] = (cycle_phase){pct_start * t - 1, initial, max_lr};
    if (!three_phase) {
        p[1] = (cycle_phase){t - 1, max_lr, min_lr};
        return 2;
    }
    p[1] = (cycle_phase){2 * pct_start * t - 2, max_lr, initial};
    p[2] = (cycle_phase){t - 1, initial, min_lr};
    return 3;
}

static double anneal(double start, double end, double pct, bool cos_anneal) {
    if (cos_anneal) return end + (start - end) / 2.0 * (cos(PI * pct) + 1);
    return (end - start) * pct + start;
}

static bool one_cycle_args_ok(const char *fn, int64_t step, int64_t total_steps, double max_lr,
                              double pct_start, double div_factor, double final_div_factor) {
    if (!at_least(fn, "step", step, 0) || !at_least(fn, "total_steps", total_steps, 1) ||
        !rate_ok(fn, "max_lr", max_lr) || !in_range(fn, "pct_start", pct_start, 0, false, 1))
        return false;
    if (!(div_factor > 0 && isfinite(div_factor)))
        return nn_error("%s: div_factor must be finite and > 0, got %g", fn, div_factor), false;
    if (!(final_div_factor > 0 && isfinite(final_div_factor)))
        return nn_error("%s: final_div_factor must be finite and > 0, got %g", fn,
                        final_div_factor),
               false;
    /* PyTorch computes step total_steps too (the last scheduler.step() of a
     * run) and raises past it */
    if (step > total_steps)
        return nn_error("%s: step %lld is past total_steps %lld", fn, (long long)step,
                        (long long)total_steps),
               false;
    return true;
}

double nb_lr_one_cycle(int64_t step, int64_t total_steps, double max_lr, double pct_start,
                       double div_factor, double final_div_factor, bool three_phase,
                       bool cos_anneal) {
    const char *fn = "nb_lr_one_cycle";
    if (!one_cycle_args_ok(fn, step, total_steps, max_lr, pct_start, div_factor,
                           final_div_factor))
        return -1.0;
    double initial = max_lr / div_factor;
    cycle_phase p[3];
    int n = cycle_phases(p, total_steps, max_lr, pct_start, initial, initial / final_div_factor,
                         three_phase);
    double s = (double)step, start = 0;
    int i = 0;
    while (i < n - 1 && !(s <= p[i].end_step)) start = p[i++].end_step;
    if (p[i].end_step == start) /* PyTorch raises ZeroDivisionError here */
        return (nn_error("%s: step %lld falls in phase %d, which is empty (pct_start %g, "
                         "total_steps %lld)",
                         fn, (long long)step, i + 1, pct_start, (long long)total_steps),
                -1.0);
    return anneal(p[i].start_lr, p[i].end_lr, (s - start) / (p[i].end_step - start), cos_anneal);
}
