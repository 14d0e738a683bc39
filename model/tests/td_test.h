/* Helpers every component's Criterion tests share: a private temporary
 * folder per test, paths in it, reading a whole file, spawning a program
 * (tapdiff) with its output captured and a watchdog, the real model from
 * ../shared, and (when fixtures.h is included first) writing a fixture.
 * Header-only so each test executable stays one file. Failures are Criterion
 * assertions; an absent tool or model is a skip with the reason. */
#ifndef TD_TEST_H
#define TD_TEST_H

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

/* 1 in a build with AddressSanitizer, where every run of tapdiff costs several
 * times more: heavy matrices keep one case per code path there (memory errors
 * are what that build looks for) and the plain build runs them all. */
#if defined(__SANITIZE_ADDRESS__)
#define TD_TEST_SANITIZED 1
#else
#define TD_TEST_SANITIZED 0
#endif

/* ---------------------------------------------------------- temp folders */

/* Creates /tmp/td_<tag>_XXXXXX into dir (at least 64 bytes). */
static inline void td_test_tmpdir(char *dir, size_t n, const char *tag) {
    snprintf(dir, n, "%s/td_%s_XXXXXX", getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", tag);
    cr_assert_not_null(mkdtemp(dir), "mkdtemp %s: %s", dir, strerror(errno));
}

static inline int td_test_rm_one_(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    remove(p);
    return 0;
}

/* rm -rf dir (no shell). */
static inline void td_test_rmdir(const char *dir) {
    if (dir && dir[0]) nftw(dir, td_test_rm_one_, 16, FTW_DEPTH | FTW_PHYS);
}

/* dir/name in one of 16 rotating buffers (a path kept in an options struct
 * survives the next few calls). */
static inline const char *td_test_path(const char *dir, const char *name) {
    static char bufs[16][1024];
    static int k;
    char *b = bufs[k++ % 16];
    snprintf(b, sizeof bufs[0], "%s/%s", dir, name);
    return b;
}

/* ------------------------------------------------------------------ files */

/* The whole file, NUL-terminated (malloc'd); *len its size when len != NULL. */
static inline char *td_test_slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot open %s: %s", path, strerror(errno));
    size_t cap = 4096, n = 0;
    char *b = malloc(cap);
    for (size_t r; (r = fread(b + n, 1, cap - n - 1, f)) > 0;) {
        n += r;
        if (cap - n - 1 == 0) b = realloc(b, cap *= 2);
    }
    fclose(f);
    b[n] = '\0';
    if (len) *len = n;
    return b;
}

static inline void td_test_write(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "cannot create %s: %s", path, strerror(errno));
    cr_assert_eq(fwrite(data, 1, n, f), n, "short write to %s", path);
    cr_assert_eq(fclose(f), 0);
}

/* --------------------------------------------------------------- programs */

/* The tapdiff binary meson built (TD_TAPDIFF); skips the test without it. */
static inline const char *td_test_tapdiff(void) {
    const char *bin = getenv("TD_TAPDIFF");
    if (!bin || access(bin, X_OK)) cr_skip_test("TD_TAPDIFF not set or not executable (run through meson test)");
    return bin;
}

/* Runs argv (argv[0] a path) with stdout/stderr into the files (NULL: the
 * test's own); a watchdog kills it after timeout_s. Returns the exit status,
 * or 128 + signal when it died of one. */
static inline int td_test_spawn(char *const argv[], const char *out_path, const char *err_path, int timeout_s) {
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    if (out_path) posix_spawn_file_actions_addopen(&fa, 1, out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (err_path) posix_spawn_file_actions_addopen(&fa, 2, err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    pid_t pid;
    int rc = posix_spawn(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    cr_assert_eq(rc, 0, "cannot spawn %s: %s", argv[0], strerror(rc));
    int status = 0;
    for (long ms = 0;; ms += 5) {
        pid_t w = waitpid(pid, &status, WNOHANG);
        cr_assert_neq(w, -1, "waitpid: %s", strerror(errno));
        if (w == pid) break;
        if (ms > 1000L * timeout_s) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            cr_assert_fail("%s %s: still running after %d s", argv[0], argv[1] ? argv[1] : "", timeout_s);
        }
        nanosleep(&(struct timespec){0, 5 * 1000 * 1000}, NULL);
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* tapdiff with the NULL-terminated args (not counting argv[0]); stdout and
 * stderr captured into *out / *err (malloc'd; either may be NULL), files
 * kept in dir. Returns the exit status. */
static inline int td_test_tapdiff_run(const char *dir, char **out, char **err, const char *const *args) {
    char *argv[64];
    int n = 0;
    argv[n++] = (char *)td_test_tapdiff();
    for (; args[n - 1] && n < 63; n++) argv[n] = (char *)args[n - 1];
    argv[n] = NULL;
    char o[1024], e[1024];
    snprintf(o, sizeof o, "%s/.stdout", dir);
    snprintf(e, sizeof e, "%s/.stderr", dir);
    int rc = td_test_spawn(argv, o, e, 600);
    if (out) *out = td_test_slurp(o, NULL);
    if (err) *err = td_test_slurp(e, NULL);
    return rc;
}

/* `tapdiff ARGS` through the shell (ARGS quoted by the caller) with stdout
 * into out_file and stderr appended to out_file.err, or merged into
 * out_file when merge_stderr. Returns the exit status (128 + signal). */
static inline int td_test_tapdiff_sh(const char *args, const char *out_file, int merge_stderr) {
    const char *bin = td_test_tapdiff();
    size_t n = strlen(bin) + strlen(args) + 2 * strlen(out_file) + 64;
    char *cmd = malloc(n);
    if (merge_stderr) snprintf(cmd, n, "'%s' %s > '%s' 2>&1", bin, args, out_file);
    else snprintf(cmd, n, "'%s' %s > '%s' 2>> '%s.err'", bin, args, out_file, out_file);
    const int st = system(cmd);
    free(cmd);
    cr_assert(st != -1, "cannot run the shell");
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* `sh -c cmd` (the caller redirects stderr as it wants), all of its stdout
 * into *out (malloc'd, NUL-terminated; out may be NULL to drop it); returns
 * its exit status, -1 when it did not exit normally. */
static inline int td_test_sh_capture_all(const char *cmd, char **out) {
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p, "popen(%s)", cmd);
    size_t cap = 1 << 16, len = 0, got;
    char *b = malloc(cap);
    while ((got = fread(b + len, 1, cap - len - 1, p)) > 0) {
        len += got;
        if (len + 1 == cap) b = realloc(b, cap *= 2);
    }
    b[len] = '\0';
    int st = pclose(p);
    if (out) *out = b;
    else free(b);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The same with the first n - 1 bytes of stdout into out (NUL-terminated);
 * the rest is read and dropped, so a long output cannot block the command. */
static inline int td_test_sh_capture(const char *cmd, char *out, size_t n) {
    char *all = NULL;
    const int rc = td_test_sh_capture_all(cmd, &all);
    const size_t len = strlen(all);
    const size_t k = len < n - 1 ? len : n - 1;
    memcpy(out, all, k);
    out[k] = '\0';
    free(all);
    return rc;
}

/* ------------------------------------------------------------------ models */

/* ../shared/models/<name> (TD_SHARED), or skip the test when it is absent. */
static inline const char *td_test_shared_model(const char *name) {
    static char path[1024];
    const char *shared = getenv("TD_SHARED");
    snprintf(path, sizeof path, "%s/models/%s", shared ? shared : "../shared", name);
    if (access(path, R_OK)) cr_skip_test("%s is absent: this test needs the real model", path);
    return path;
}

#ifdef TD_FIXTURES_H
/* Writes fixture `name` into dir; its path in one of 8 rotating buffers. */
static inline const char *td_test_fixture(const char *dir, const char *name) {
    static char bufs[8][1024];
    static int k;
    char *b = bufs[k++ % 8];
    td_err e;
    cr_assert_eq(td_fixture_write(name, dir, b, sizeof bufs[0], &e), TD_OK, "fixture %s: %s", name, e.msg);
    return b;
}
#endif

/* Why a sweep that pairs the reference with another arm skips architecture
 * `arch` (the other arm does not run all of it yet), or NULL. The reference
 * itself runs every fixture (the reference and compare suites call nothing
 * here). */
static inline const char *td_test_ref_pending(const char *arch) {
    return strcmp(arch, "qwen4exp") == 0 ? "qwen4exp: the other arm does not emit its taps yet (issue 14)" : NULL;
}

#endif
