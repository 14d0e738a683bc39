/* tapdiff: error buffer, checked allocation, SHA-256 (libmd). */
#include "td_common.h"

#include <errno.h>
#include <fcntl.h>
#include <sha2.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int td_err_set(td_err *err, int status, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return status;
}

void td_abort_(const char *file, int line, const char *what) {
    fprintf(stderr, "tapdiff: internal error at %s:%d: %s\n", file, line, what);
    abort();
}

static void *oom(void *p, size_t n, const char *file, int line) {
    if (!p && n) {
        fprintf(stderr, "tapdiff: out of memory allocating %zu bytes at %s:%d\n", n, file, line);
        abort();
    }
    return p;
}

void *td_xmalloc_(size_t n, const char *file, int line) { return oom(malloc(n ? n : 1), n, file, line); }

void *td_xcalloc_(size_t n, size_t size, const char *file, int line) {
    if (size && n > SIZE_MAX / size) td_abort_(file, line, "calloc size overflow");
    return oom(calloc(n ? n : 1, size ? size : 1), n * size, file, line);
}

void *td_xrealloc_(void *p, size_t n, const char *file, int line) { return oom(realloc(p, n ? n : 1), n, file, line); }

char *td_xstrdup_(const char *s, const char *file, int line) {
    size_t n = strlen(s) + 1;
    char *d = td_xmalloc_(n, file, line);
    memcpy(d, s, n);
    return d;
}

void td_sha256_buf(const void *data, size_t n, char hex[65]) {
    SHA2_CTX ctx;
    SHA256Init(&ctx);
    SHA256Update(&ctx, data, n);
    SHA256End(&ctx, hex);
}

int td_sha256_file(const char *path, char hex[65], td_err *err) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return td_err_set(err, TD_EINPUT, "%s: cannot open: %s", path, strerror(errno));
    SHA2_CTX ctx;
    SHA256Init(&ctx);
    static __thread unsigned char buf[1 << 16];
    for (;;) {
        ssize_t r = read(fd, buf, sizeof buf);
        if (r < 0) {
            if (errno == EINTR) continue;
            int e = errno;
            close(fd);
            return td_err_set(err, TD_EINPUT, "%s: read failed: %s", path, strerror(e));
        }
        if (r == 0) break;
        SHA256Update(&ctx, buf, (size_t)r);
    }
    close(fd);
    SHA256End(&ctx, hex);
    return TD_OK;
}

int td_mkdir_p(const char *dir, td_err *err) {
    char *p = td_xstrdup(dir);
    int rc = TD_OK;
    for (char *q = p + 1; *q && !rc; q++) {
        if (*q != '/') continue;
        *q = '\0';
        if (mkdir(p, 0777) && errno != EEXIST) rc = td_err_set(err, TD_EINPUT, "%s: cannot create: %s", p, strerror(errno));
        *q = '/';
    }
    if (!rc && mkdir(p, 0777) && errno != EEXIST)
        rc = td_err_set(err, TD_EINPUT, "%s: cannot create: %s", p, strerror(errno));
    free(p);
    return rc;
}
