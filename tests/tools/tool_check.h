/* tool_check.h: what the command-line checks of tests/tools/ share: one
 * "<tool>: ok: what" or "<tool>: FAIL: what: detail" line per check, counted
 * in fails, and a shell command's output. Set tool_name first in main. */
#ifndef NABLA_TESTS_TOOL_CHECK_H
#define NABLA_TESTS_TOOL_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

static const char *tool_name = "check";
static int fails;

static void check(int ok, const char *what, const char *detail) {
    printf("%s: %s: %s%s%s\n", tool_name, ok ? "ok" : "FAIL", what, ok ? "" : ": ",
           ok ? "" : detail);
    fails += !ok;
}

/* Runs a shell command; its stdout and stderr (malloc'ed) and exit status. */
static char *run(const char *cmd, int *status) {
    char full[8192];
    snprintf(full, sizeof full, "%s 2>&1", cmd);
    FILE *p = popen(full, "r");
    if (!p) return NULL;
    size_t n = 0, cap = 1 << 16;
    char *out = malloc(cap);
    for (size_t got; out && (got = fread(out + n, 1, cap - n - 1, p)) > 0;) {
        n += got;
        if (n + 1 == cap) out = realloc(out, cap *= 2);
    }
    int st = pclose(p);
    *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    if (out) out[n] = 0;
    return out;
}

#endif
