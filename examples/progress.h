/* progress.h: a one-line progress display for training loops, header-only.
 *
 * When stdout is a terminal, progress_step rewrites one line ("\r", the text,
 * then clear-to-end-of-line) at most 10 times a second:
 *
 *   epoch 3/40  step 12/20  loss 0.8123  61234 tok/s  ETA epoch 0m01s, all 0m19s
 *
 * (the second ETA is for all epochs at the average pace so far, which includes
 * whatever the loop does between epochs; a loop that can stop early may end
 * sooner). When stdout is not a terminal it prints nothing, so logs and pipes
 * keep only the program's own lines; nor does it in a rank of an MPI job
 * (progress_to). Call progress_clear before printing anything else (stdout
 * or stderr) so that the line does not garble it.
 */
#ifndef NB_EXAMPLES_PROGRESS_H
#define NB_EXAMPLES_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

typedef struct progress {
    bool tty;                       /* progress_to(stdout): draw at all */
    bool shown;                     /* a line is on screen now */
    int64_t epochs, steps;          /* steps per epoch */
    int64_t epoch;                  /* current, 1-based */
    double start, epoch_start, last; /* seconds: first epoch, this epoch, last drawing */
    const char *unit;               /* what progress_step counts per second: "tok" (NULL) */
} progress;

static inline double progress_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Whether a progress line may be drawn on f: f is a terminal, and this is
 * no rank of an MPI job. mpirun (Open MPI) gives each rank's stdout a
 * pseudo-terminal of its own, also when mpirun's output goes to a file or a
 * pipe, so isatty says yes there while the "\r" and ESC [K would land in the
 * log; a rank cannot see where mpirun writes, and the launchers' variables
 * (Open MPI's, PMIx's, MPICH's PMI) say it is one. */
static inline bool progress_to(FILE *f) {
    static const char *const launcher[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK",
                                           "PMI_SIZE"};
    if (isatty(fileno(f)) != 1) return false;
    for (size_t i = 0; i < sizeof launcher / sizeof *launcher; i++)
        if (getenv(launcher[i])) return false;
    return true;
}

static inline void progress_init(progress *p, int64_t epochs, int64_t steps_per_epoch) {
    *p = (progress){.tty = progress_to(stdout), .epochs = epochs,
                    .steps = steps_per_epoch, .start = progress_now()};
}

/* "img" for a loop that counts images ("... 1612 img/s ..."); after progress_init */
static inline void progress_unit(progress *p, const char *unit) { p->unit = unit; }

static inline void progress_epoch(progress *p, int64_t epoch) {
    p->epoch = epoch;
    p->epoch_start = progress_now();
}

/* 7s -> "0m07s", 65s -> "1m05s", 3725s -> "1h02m" (at most 99h59m) */
static inline const char *progress_duration(double s, char buf[32]) {
    int t = !(s > 0) ? 0 : s > 359999 ? 359999 : (int)(s + 0.5);
    if (t < 3600) snprintf(buf, 32, "%dm%02ds", t / 60, t % 60);
    else snprintf(buf, 32, "%dh%02dm", t / 3600, t % 3600 / 60);
    return buf;
}

/* A line that wraps cannot be rewritten with "\r": keep it within COLUMNS - 1
 * (the shell's variable, when exported) or 79 characters. */
static inline int progress_width(void) {
    const char *c = getenv("COLUMNS");
    long n = c ? strtol(c, NULL, 10) : 0;
    return n > 1 && n < 1000 ? (int)n - 1 : 79;
}

static inline void progress_clear(progress *p) {
    if (!p->shown) return;
    fputs("\r\x1b[K", stdout);
    fflush(stdout);
    p->shown = false;
}

/* After step (1..steps) of the current epoch: loss is the running value to
 * show, tokens the number processed in this epoch so far (tokens, or the
 * progress_unit's items). */
static inline void progress_step(progress *p, int64_t step, double loss, double tokens) {
    if (!p->tty) return;
    double t = progress_now();
    if (p->shown && t - p->last < 0.1) return;
    double in_epoch = t - p->epoch_start;
    int64_t done = (p->epoch - 1) * p->steps + step, total = p->epochs * p->steps;
    double epoch_eta = in_epoch / (double)step * (double)(p->steps - step);
    double all_eta = (t - p->start) / (double)done * (double)(total - done);
    char a[32], b[32], line[160];
    snprintf(line, sizeof line,
             "epoch %lld/%lld  step %lld/%lld  loss %.4f  %.0f %s/s  ETA epoch %s, all %s",
             (long long)p->epoch, (long long)p->epochs, (long long)step, (long long)p->steps, loss,
             in_epoch > 0 ? tokens / in_epoch : 0.0, p->unit ? p->unit : "tok", progress_duration(epoch_eta, a),
             progress_duration(all_eta, b));
    printf("\r\x1b[K%.*s", progress_width(), line);
    fflush(stdout);
    p->shown = true;
    p->last = t;
}

#endif /* NB_EXAMPLES_PROGRESS_H */
