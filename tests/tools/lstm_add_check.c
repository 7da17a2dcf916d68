/* lstm_add_check.c: examples/lstm_add against PyTorch, as a user runs it.
 *
 *   lstm_add_check LSTM_ADD FIXTURE_DIR
 *
 * tests/fixtures/gen_lstm_add.py trained the example's model in PyTorch
 * from the initial weights it wrote (lstm_add_init.safetensors, and the same
 * values in f64), on the same batches, with the same Adam, and recorded the
 * loss of each of the 1000 steps and the final test accuracy (lstm_add.txt).
 * Here the example runs from those weights (--init, --log-every 1) and:
 *   - f32: every step's loss within 1e-5 relative of PyTorch's (measured:
 *     1.5e-6 at most; the two sum in other orders, and the difference grows
 *     slowly over the steps), the test accuracy within 0.01 of PyTorch's;
 *   - f64 (--f64): every loss within 1e-12 relative (measured: 5e-15);
 *   - the model learns: the test accuracy is at least 0.95, from the
 *     fixture's weights and from the example's own --seed draw;
 *   - weights of the wrong dtype are refused with a message naming the file.
 * Prints one line per check; exit status 1 if any failed. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include "tool_check.h"

#define STEPS 1000

/* Tensor `name` of a fixture file (tests/fixtures/fxwriter.py's format:
 * "tensor <name> <dtype> <ndim> <sizes...>" then the values) into v, at most
 * cap values; the count, or -1. */
static int read_fixture(const char *path, const char *name, double *v, int cap) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[4096], want[128];
    snprintf(want, sizeof want, "tensor %s ", name);
    int n = -1;
    while (fgets(line, sizeof line, f)) {
        if (n < 0) {
            if (!strncmp(line, want, strlen(want))) n = 0;
            continue;
        }
        if (!strncmp(line, "tensor ", 7)) break;
        for (char *s = line, *end; n < cap; s = end) {
            double x = strtod(s, &end);
            if (end == s) break;
            v[n++] = x;
        }
    }
    fclose(f);
    return n;
}

/* The losses of the "step N  loss X" lines (N from 1) into loss; the count */
static int parse_losses(const char *out, double *loss) {
    int n = 0;
    for (const char *s = out; (s = strstr(s, "step ")) != NULL; s++) {
        long step;
        double x;
        if (sscanf(s, "step %ld loss %lf", &step, &x) == 2 && step == n + 1 && n < STEPS)
            loss[n++] = x;
    }
    return n;
}

/* The accuracy of the last line "test accuracy A (k/n ...", or -1 */
static double parse_accuracy(const char *out) {
    const char *s = out ? strstr(out, "test accuracy ") : NULL;
    double a;
    return s && sscanf(s, "test accuracy %lf", &a) == 1 ? a : -1;
}

/* One run from the fixture weights against PyTorch's losses and accuracy */
static void against_torch(const char *prog, const char *dir, bool f64, double rtol) {
    char cmd[2048], fxp[1024], what[256], detail[4096];
    snprintf(fxp, sizeof fxp, "%s/lstm_add.txt", dir);
    snprintf(cmd, sizeof cmd, "%s --init %s/lstm_add_init%s.safetensors --log-every 1%s", prog,
             dir, f64 ? "64" : "", f64 ? " --f64" : "");
    double want[STEPS], got[STEPS], acc;
    int st, nw = read_fixture(fxp, f64 ? "loss64" : "loss32", want, STEPS);
    int na = read_fixture(fxp, f64 ? "acc64" : "acc32", &acc, 1);
    char *out = run(cmd, &st);
    int n = out ? parse_losses(out, got) : 0;
    const char *dt = f64 ? "f64" : "f32";
    snprintf(detail, sizeof detail, "status %d, %d loss lines, %d in %s; command: %s", st, n, nw,
             fxp, cmd);
    snprintf(what, sizeof what, "%s: %d steps from PyTorch's weights", dt, STEPS);
    check(st == 0 && n == STEPS && nw == STEPS && na == 1, what, detail);
    double worst = 0;
    int at = 0;
    for (int i = 0; i < n && i < nw; i++) {
        double rel = fabs(got[i] - want[i]) / fabs(want[i]);
        if (!(rel <= worst)) worst = rel, at = i;
    }
    snprintf(what, sizeof what, "%s: every step's loss within %g relative of PyTorch's "
             "(worst %.1e, step %d)", dt, rtol, worst, at + 1);
    snprintf(detail, sizeof detail, "step %d: nabla %.15g, PyTorch %.15g", at + 1,
             n > at ? got[at] : NAN, nw > at ? want[at] : NAN);
    check(n == STEPS && worst <= rtol, what, detail);
    double a = parse_accuracy(out);
    snprintf(what, sizeof what, "%s: test accuracy %.4f, PyTorch's %.4f, at least 0.95", dt, a,
             acc);
    check(na == 1 && fabs(a - acc) <= 0.01 && a >= 0.95, what, out ? out : "(no output)");
    free(out);
}

int main(int argc, char **argv) {
    tool_name = "lstm-add-check";
    if (argc != 3) {
        fprintf(stderr, "usage: %s LSTM_ADD FIXTURE_DIR\n", argv[0]);
        return 2;
    }
    const char *prog = argv[1], *dir = argv[2];
    against_torch(prog, dir, false, 1e-5);
    against_torch(prog, dir, true, 1e-12);

    /* as a user runs it: weights from --seed */
    int st;
    char cmd[2048];
    char *out = run(prog, &st);
    double a = parse_accuracy(out);
    const char *last = out ? strrchr(out, '\n') : NULL;
    while (last && last > out && last[-1] != '\n') last--;
    check(st == 0 && a >= 0.95 && last && !strncmp(last, "test accuracy ", 14),
          "lstm_add alone learns (last line: test accuracy >= 0.95)", out ? out : "(no output)");
    free(out);

    /* the f64 weights into the f32 model: refused, naming the file */
    snprintf(cmd, sizeof cmd, "%s --init %s/lstm_add_init64.safetensors --steps 1", prog, dir);
    out = run(cmd, &st);
    check(st == 1 && out && strstr(out, "lstm_add_init64.safetensors") && !strstr(out, "step "),
          "weights of another dtype are refused, naming the file, before training",
          out ? out : "(no output)");
    free(out);
    return fails ? 1 : 0;
}
