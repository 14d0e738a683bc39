/* tapdiff CLI helpers: error printing and a progress bar. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "prompt.h"

const char *td_cli_command_line = "";

int td_cli_fail(const char *cmd, int status, const td_err *err) {
    fprintf(stderr, "tapdiff %s: %s\n", cmd, err && err->msg[0] ? err->msg : "failed");
    return status;
}

int td_cli_failf(const char *cmd, int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "tapdiff %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return status;
}

struct td_progress {
    char label[64];
    long total;
    double t0;
    int enabled;
    int shown;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

td_progress *td_progress_begin(const char *label, long total) {
    td_progress *p = td_xcalloc(1, sizeof *p);
    snprintf(p->label, sizeof p->label, "%s", label);
    p->total = total;
    p->t0 = now_s();
    const char *env = getenv("TD_PROGRESS");
    p->enabled = env ? atoi(env) != 0 : isatty(STDERR_FILENO);
    return p;
}

void td_progress_update(td_progress *p, long done) {
    if (!p || !p->enabled) return;
    double el = now_s() - p->t0;
    if (el < 1.0) return;
    int width = 30;
    int fill = p->total > 0 ? (int)((double)width * (double)done / (double)p->total) : 0;
    if (fill > width) fill = width;
    char bar[64];
    for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '.';
    bar[width] = '\0';
    double rate = el > 0 ? (double)done / el : 0;
    fprintf(stderr, "\r%s [%s] %ld/%ld  %.1f/s ", p->label, bar, done, p->total, rate);
    p->shown = 1;
}

void td_progress_end(td_progress *p) {
    if (!p) return;
    if (p->shown) fputc('\n', stderr);
    free(p);
}

/* --prompt TEXT / --prompt-file F of run, bisect, golden and bench. */
int td_cli_prompt(const char *model, const char *text_opt, const char *file_opt, char **text, size_t *len,
                  int32_t **ids, int64_t *n, td_err *err) {
    *text = NULL;
    *len = 0;
    if (!text_opt && !file_opt) return TD_OK;
    int rc = TD_OK;
    if (text_opt) *text = td_xstrdup(text_opt), *len = strlen(text_opt);
    else if ((rc = td_prompt_read_file(file_opt, text, len, err))) return rc;
    if ((rc = td_prompt_tokenize(model, *text, *len, ids, n, err))) {
        free(*text);
        *text = NULL;
        *len = 0;
    }
    return rc;
}
