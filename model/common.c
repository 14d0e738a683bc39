/* tapdiff: error buffer, checked allocation, SHA-256 (OpenSSL) with a cache by file identity. */
#include "td_common.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <openssl/sha.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static void hex_of(const unsigned char md[32], char hex[65]) {
    static const char d[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++) {
        hex[2 * i] = d[md[i] >> 4];
        hex[2 * i + 1] = d[md[i] & 15];
    }
    hex[64] = '\0';
}

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
    unsigned char md[32];
    SHA256(data, n, md);
    hex_of(md, hex);
}

static _Atomic long sha_hashed, sha_cached;

void td_sha256_stats(long *hashed, long *cached) {
    if (hashed) *hashed = sha_hashed;
    if (cached) *cached = sha_cached;
}

/* The cache folder: $XDG_CACHE_HOME/tapdiff/sha256, else ~/.cache/tapdiff/sha256;
 * TAPDIFF_HASH_CACHE=0 turns the cache off. 0 when there is none. */
static int cache_dir(char *dir, size_t n) {
    const char *off = getenv("TAPDIFF_HASH_CACHE");
    if (off && !strcmp(off, "0")) return 0;
    const char *x = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int k;
    if (x && x[0] == '/') k = snprintf(dir, n, "%s/tapdiff/sha256", x);
    else if (home && home[0] == '/') k = snprintf(dir, n, "%s/.cache/tapdiff/sha256", home);
    else return 0;
    return k > 0 && (size_t)k < n;
}

/* The file's identity: a rewrite in place changes the size or the mtime, a
 * replacement (rename over it) the inode; ctime also catches an mtime set
 * back by hand. */
static int cache_entry(const struct stat *sb, char *path, size_t n) {
    char dir[4096];
    if (!cache_dir(dir, sizeof dir)) return 0;
    int k = snprintf(path, n, "%s/%llx-%llx-%llx-%lld.%09ld-%lld.%09ld", dir, (unsigned long long)sb->st_dev,
                     (unsigned long long)sb->st_ino, (unsigned long long)sb->st_size, (long long)sb->st_mtim.tv_sec,
                     sb->st_mtim.tv_nsec, (long long)sb->st_ctim.tv_sec, sb->st_ctim.tv_nsec);
    return k > 0 && (size_t)k < n;
}

static int cache_read(const char *entry, char hex[65]) {
    int fd = open(entry, O_RDONLY | O_NOFOLLOW);
    if (fd < 0) return 0;
    char b[66];
    ssize_t r = read(fd, b, sizeof b);
    close(fd);
    if (r != 64 && !(r == 65 && b[64] == '\n')) return 0;
    for (int i = 0; i < 64; i++)
        if (!((b[i] >= '0' && b[i] <= '9') || (b[i] >= 'a' && b[i] <= 'f'))) return 0;
    memcpy(hex, b, 64);
    hex[64] = '\0';
    return 1;
}

/* Best effort: a cache that cannot be written costs a rehash next time, never
 * the run. Written to a private name and renamed, so a reader sees a whole
 * entry or none. */
static void cache_write(const char *entry, const char hex[65]) {
    char dir[4096], tmp[4200];
    if (!cache_dir(dir, sizeof dir)) return;
    td_err e;
    if (td_mkdir_p(dir, &e)) return;
    static _Atomic long seq;
    snprintf(tmp, sizeof tmp, "%s/.tmp.%ld.%ld", dir, (long)getpid(), seq++);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW, 0644);
    if (fd < 0) return;
    char line[65];
    memcpy(line, hex, 64);
    line[64] = '\n';
    int ok = write(fd, line, sizeof line) == (ssize_t)sizeof line;
    ok &= close(fd) == 0;
    if (!ok || rename(tmp, entry)) unlink(tmp);
}

int td_sha256_file_ex(const char *path, char hex[65], int *from_cache, td_err *err) {
    if (from_cache) *from_cache = 0;
    int fd = open(path, O_RDONLY | O_NONBLOCK);
    if (fd < 0) return td_err_set(err, TD_EINPUT, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return td_err_set(err, TD_EINPUT, "%s: expected a regular file, found another kind of file", path);
    }
    char entry[4400];
    int cacheable = cache_entry(&sb, entry, sizeof entry);
    if (cacheable && cache_read(entry, hex)) {
        close(fd);
        sha_cached++;
        if (from_cache) *from_cache = 1;
        return TD_OK;
    }
    posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (!ctx || !EVP_DigestInit_ex(ctx, EVP_sha256(), NULL)) td_abort_(__FILE__, __LINE__, "EVP sha256 init");
    enum { BUF = 1 << 20 };
    unsigned char *buf = td_xmalloc(BUF);
    for (;;) {
        ssize_t r = read(fd, buf, BUF);
        if (r < 0) {
            if (errno == EINTR) continue;
            int e = errno;
            close(fd);
            free(buf);
            EVP_MD_CTX_free(ctx);
            return td_err_set(err, TD_EINPUT, "%s: read failed: %s", path, strerror(e));
        }
        if (r == 0) break;
        if (!EVP_DigestUpdate(ctx, buf, (size_t)r)) td_abort_(__FILE__, __LINE__, "EVP sha256 update");
    }
    free(buf);
    unsigned char md[32];
    unsigned md_len = 0;
    if (!EVP_DigestFinal_ex(ctx, md, &md_len) || md_len != 32) td_abort_(__FILE__, __LINE__, "EVP sha256 final");
    EVP_MD_CTX_free(ctx);
    hex_of(md, hex);
    sha_hashed++;
    /* Racy-file rule (as git's index): a file modified within the clock's
     * granularity of now could change again without a new mtime, so only a file
     * whose mtime is a few seconds old is remembered (a later write moves the
     * mtime past it, which misses the entry); the identity is re-read
     * after hashing so a change while hashing is not remembered either. */
    struct stat after;
    struct timespec now;
    if (cacheable && fstat(fd, &after) == 0 && after.st_size == sb.st_size &&
        after.st_mtim.tv_sec == sb.st_mtim.tv_sec && after.st_mtim.tv_nsec == sb.st_mtim.tv_nsec &&
        after.st_ctim.tv_sec == sb.st_ctim.tv_sec && after.st_ctim.tv_nsec == sb.st_ctim.tv_nsec &&
        clock_gettime(CLOCK_REALTIME, &now) == 0 && now.tv_sec - sb.st_mtim.tv_sec > 2)
        cache_write(entry, hex);
    close(fd);
    return TD_OK;
}

int td_sha256_file(const char *path, char hex[65], td_err *err) { return td_sha256_file_ex(path, hex, NULL, err); }

int td_mkdir_p(const char *dir, td_err *err) {
    char *p = td_xstrdup(dir);
    int rc = TD_OK;
    for (char *q = p + 1; *q && !rc; q++) {
        if (*q != '/') continue;
        *q = '\0';
        if (mkdir(p, 0777) && errno != EEXIST) rc = td_err_set(err, TD_EOUTPUT, "%s: cannot create: %s", p, strerror(errno));
        *q = '/';
    }
    if (!rc && mkdir(p, 0777) && errno != EEXIST)
        rc = td_err_set(err, TD_EOUTPUT, "%s: cannot create: %s", p, strerror(errno));
    free(p);
    return rc;
}

static int cmp_i32(const void *a, const void *b) {
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static int cmp_i64(const void *a, const void *b) {
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

void td_sort_i32(int32_t *v, size_t n) {
    if (n > 1) qsort(v, n, sizeof *v, cmp_i32);
}

void td_sort_i64(int64_t *v, size_t n) {
    if (n > 1) qsort(v, n, sizeof *v, cmp_i64);
}
