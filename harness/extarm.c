/* tapdiff external arms (extarm.h): runs a program under the external-arm
 * contract and checks what it wrote before anyone compares it. */
#include "extarm.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runner.h"
#include "tapfile.h"

int td_extarm_is(const char *arm) { return arm && !strncmp(arm, TD_EXTARM_PREFIX, strlen(TD_EXTARM_PREFIX)); }

// "1,2,3" (td_xmalloc'd).
static char *id_list(const int32_t *ids, int64_t n) {
    size_t cap = (size_t)n * 12 + 1, len = 0;
    char *s = td_xmalloc(cap);
    s[0] = '\0';
    for (int64_t i = 0; i < n; i++) len += (size_t)snprintf(s + len, cap - len, "%s%" PRId32, i ? "," : "", ids[i]);
    return s;
}

static int write_pinned(const td_extarm_config *c, td_err *err) {
    FILE *f = fopen(c->pinned_path, "w");
    if (!f) return td_err_set(err, TD_EINTERNAL, "%s: cannot create: %s", c->pinned_path, strerror(errno));
    char *s = id_list(c->pinned, c->n_steps);
    int ok = fprintf(f, "%s\n", s) >= 0;
    free(s);
    if (fclose(f) || !ok) return td_err_set(err, TD_EINTERNAL, "%s: cannot write", c->pinned_path);
    return TD_OK;
}

// Child side: never returns. The exec's errno goes back through `fd`.
static void child(const td_extarm_config *c, char **argv, const char *prompt, int fd) {
    char num[32];
    setenv("TAPDIFF_MODEL", c->model_path, 1);
    setenv("TAPDIFF_PROMPT", prompt, 1);
    snprintf(num, sizeof num, "%" PRId64, c->n_steps);
    setenv("TAPDIFF_STEPS", num, 1);
    setenv("TAPDIFF_TAPS", c->tap_path, 1);
    setenv("TAPDIFF_TAP_MODE", "full", 1);
    unsetenv("TAPDIFF_TAP_FILTER");
    if (c->pinned) {
        setenv("TAPDIFF_PINNED", c->pinned_path, 1);
        char label[4096];
        snprintf(label, sizeof label, "pinned:%s", c->pinned_path);
        setenv("TAPDIFF_DECODE", label, 1);
    } else {
        unsetenv("TAPDIFF_PINNED");
        setenv("TAPDIFF_DECODE", "greedy", 1);
    }
    snprintf(num, sizeof num, "%d", c->threads);
    setenv("TAPDIFF_THREADS", num, 1);
    dup2(STDERR_FILENO, STDOUT_FILENO); // bisect's stdout is the verdict
    execvp(argv[0], argv);
    int e = errno;
    ssize_t w = write(fd, &e, sizeof e);
    (void)w;
    _exit(127);
}

// Runs the program; TD_OK when it exited 0.
static int spawn(const td_extarm_config *c, td_err *err) {
    const char *cmd = c->spec + strlen(TD_EXTARM_PREFIX);
    char *words = td_xstrdup(cmd);
    char *argv[64];
    int argc = 0;
    for (char *save = NULL, *w = strtok_r(words, " \t", &save); w && argc < 63; w = strtok_r(NULL, " \t", &save))
        argv[argc++] = w;
    argv[argc] = NULL;
    int rc = TD_OK;
    if (argc == 0) {
        rc = td_err_set(err, TD_EUSAGE, "external arm '%s': no program after '%s'", c->spec, TD_EXTARM_PREFIX);
        goto out;
    }
    char *prompt = id_list(c->prompt, c->n_prompt);
    int fds[2];
    if (pipe2(fds, O_CLOEXEC)) {
        free(prompt);
        rc = td_err_set(err, TD_EINTERNAL, "external arm %s: pipe: %s", c->spec, strerror(errno));
        goto out;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        rc = td_err_set(err, TD_EINTERNAL, "external arm %s: fork: %s", c->spec, strerror(errno));
        close(fds[0]);
        close(fds[1]);
        free(prompt);
        goto out;
    }
    if (pid == 0) {
        close(fds[0]);
        child(c, argv, prompt, fds[1]);
    }
    free(prompt);
    close(fds[1]);
    int exec_errno = 0;
    ssize_t got;
    do got = read(fds[0], &exec_errno, sizeof exec_errno);
    while (got < 0 && errno == EINTR);
    close(fds[0]);
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR) {
            rc = td_err_set(err, TD_EINTERNAL, "external arm %s: waitpid: %s", c->spec, strerror(errno));
            goto out;
        }
    if (got == (ssize_t)sizeof exec_errno) {
        if (exec_errno == ENOENT)
            rc = td_err_set(err, TD_EUSAGE, "external arm %s: program '%s' not found%s", c->spec, argv[0],
                            strchr(argv[0], '/') ? "" : " in PATH");
        else
            rc = td_err_set(err, TD_EUSAGE, "external arm %s: cannot run '%s': %s (is it an executable?)", c->spec,
                            argv[0], strerror(exec_errno));
    } else if (WIFSIGNALED(st)) {
        rc = td_err_set(err, TD_EINPUT, "external arm %s crashed: killed by signal %d (%s); its stderr is above",
                        c->spec, WTERMSIG(st), strsignal(WTERMSIG(st)));
    } else if (WIFEXITED(st) && WEXITSTATUS(st) == TD_SKIP) {
        rc = td_err_set(err, TD_SKIP, "external arm %s exited 77: it cannot run here (skipped)", c->spec);
    } else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        rc = td_err_set(err, TD_EINPUT, "external arm %s failed: exit status %d; its stderr is above", c->spec,
                        WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    }
out:
    free(words);
    return rc;
}

// The checks of the contract on the written file.
static int check(const td_extarm_config *c, int32_t **decode, td_err *err) {
    struct stat sb;
    if (stat(c->tap_path, &sb))
        return td_err_set(err, TD_EINPUT,
                          "external arm %s exited 0 but wrote no tap file at %s (it must open TAPDIFF_TAPS)", c->spec,
                          c->tap_path);
    char want[65];
    int rc = td_sha256_file(c->model_path, want, err);
    if (rc) return rc;
    td_tapfile *f = NULL;
    if ((rc = td_tapfile_open(&f, c->tap_path, err))) {
        char msg[sizeof err->msg];
        snprintf(msg, sizeof msg, "%s", err->msg);
        return td_err_set(err, TD_EINPUT, "external arm %s wrote an unreadable tap file: %s", c->spec, msg);
    }
    char *sha = NULL;
    td_err ignore;
    int64_t n_steps = td_tapfile_n_steps(f);
    if (td_tapfile_attr_str(f, "model_sha256", &sha, &ignore)) {
        rc = td_err_set(err, TD_EINPUT,
                        "external arm %s: tap file %s has no model_sha256 (set it with td_tap_sink_provenance)",
                        c->spec, c->tap_path);
    } else if (strcmp(sha, want)) {
        rc = td_err_set(err, TD_EINPUT,
                        "external arm %s: tap file %s has model_sha256 %.16s..., the model %s is %.16s...: it ran "
                        "another model",
                        c->spec, c->tap_path, sha, c->model_path, want);
    } else if (n_steps != 1 + c->n_steps) {
        rc = td_err_set(err, TD_EINPUT,
                        "external arm %s: tap file %s has %" PRId64 " complete steps, bisect asked for %" PRId64
                        " (the prefill and %" PRId64 " decode steps)",
                        c->spec, c->tap_path, n_steps, 1 + c->n_steps, c->n_steps);
    }
    free(sha);
    td_tapfile_close(f);
    if (rc) return rc;

    int32_t *pv = NULL, *dv = NULL;
    int64_t pn = 0, dn = 0;
    if ((rc = td_read_tapfile_tokens(c->tap_path, &pv, &pn, &dv, &dn, err))) {
        char msg[sizeof err->msg];
        snprintf(msg, sizeof msg, "%s", err->msg);
        return td_err_set(err, TD_EINPUT, "external arm %s: %s", c->spec, msg);
    }
    if (pn != c->n_prompt) {
        rc = td_err_set(err, TD_EINPUT,
                        "external arm %s: its prefill consumed %" PRId64 " tokens, the prompt has %" PRId64, c->spec,
                        pn, c->n_prompt);
    } else {
        for (int64_t i = 0; i < pn && !rc; i++)
            if (pv[i] != c->prompt[i])
                rc = td_err_set(err, TD_EINPUT,
                                "external arm %s: its prefill consumed token %" PRId32 " at position %" PRId64
                                ", the prompt has %" PRId32,
                                c->spec, pv[i], i, c->prompt[i]);
    }
    for (int64_t i = 0; i < dn && !rc && c->pinned; i++)
        if (dv[i] != c->pinned[i])
            rc = td_err_set(err, TD_EINPUT,
                            "external arm %s: decode step %" PRId64 " (step %" PRId64 ") consumed token %" PRId32
                            ", pinned %" PRId32 ": it did not follow TAPDIFF_PINNED",
                            c->spec, i, i + 1, dv[i], c->pinned[i]);
    free(pv);
    if (!rc && decode) {
        *decode = dv;
        dv = NULL;
    }
    free(dv);
    return rc;
}

int td_extarm_run(const td_extarm_config *c, int32_t **decode, td_err *err) {
    if (decode) *decode = NULL;
    if (!td_extarm_is(c->spec))
        return td_err_set(err, TD_EUSAGE, "'%s' is not an external arm (exec:PROGRAM)", c->spec);
    // a file left by an earlier run must not pass for this run's
    if (unlink(c->tap_path) && errno != ENOENT)
        return td_err_set(err, TD_EINPUT, "%s: cannot remove the old tap file: %s", c->tap_path, strerror(errno));
    int rc;
    if (c->pinned && (rc = write_pinned(c, err))) return rc;
    if ((rc = spawn(c, err))) return rc;
    return check(c, decode, err);
}
