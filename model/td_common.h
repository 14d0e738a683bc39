/* tapdiff: status codes and the error buffer every library call fills.
 * Library code never prints or exits; it returns a status (the values are the
 * CLI's exit codes, so a status can be returned from main unchanged) and, on
 * failure, leaves one human-readable line in a td_err. */
#ifndef TD_COMMON_H
#define TD_COMMON_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum td_status {
    TD_OK = 0,
    TD_DIVERGENT = 1,      /* a comparison found a divergence */
    TD_EUSAGE = 2,         /* bad command line */
    TD_EINPUT = 3,         /* bad input file: GGUF, HDF5, token file, ... */
    TD_EOUTPUT = 4,        /* an output cannot be written: path, permission, disk full */
    TD_SKIP = 77,          /* backend not built / no device */
    TD_EINTERNAL = 99,     /* out of memory, I/O failure, bug */
} td_status;

#ifndef TD_ERR_DEFINED
#define TD_ERR_DEFINED
/* also declared, identically, by taps/tap.h */
typedef struct td_err {
    char msg[1024];
} td_err;
#endif

/* printf-style; err may be NULL. Always returns `status` so callers can write
 * `return td_err_set(err, TD_EINPUT, "...", ...);`. */
int td_err_set(td_err *err, int status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* Checked allocation: aborts with file:line on out-of-memory (a programmer /
 * environment failure, not bad input). */
void *td_xmalloc_(size_t n, const char *file, int line);
void *td_xcalloc_(size_t n, size_t size, const char *file, int line);
void *td_xrealloc_(void *p, size_t n, const char *file, int line);
char *td_xstrdup_(const char *s, const char *file, int line);
#define td_xmalloc(n) td_xmalloc_((n), __FILE__, __LINE__)
#define td_xcalloc(n, s) td_xcalloc_((n), (s), __FILE__, __LINE__)
#define td_xrealloc(p, n) td_xrealloc_((p), (n), __FILE__, __LINE__)
#define td_xstrdup(s) td_xstrdup_((s), __FILE__, __LINE__)

/* Programmer errors only (never for bad input). */
#define TD_ASSERT(c)                                                           \
    do {                                                                       \
        if (!(c)) td_abort_(__FILE__, __LINE__, #c);                           \
    } while (0)
void td_abort_(const char *file, int line, const char *what)
#if defined(__GNUC__)
    __attribute__((noreturn))
#endif
    ;

/* SHA-256 of a file (hex, 64 chars + NUL); used for model provenance and the
 * fixture manifest. A regular file that has not changed for a few seconds is
 * remembered by identity (device, inode, size, mtime, ctime) in
 * $XDG_CACHE_HOME/tapdiff/sha256 (else ~/.cache/tapdiff/sha256;
 * TAPDIFF_HASH_CACHE=0: off), so a rerun on the same file does not rehash;
 * *from_cache (when not NULL) says which happened. */
int td_sha256_file(const char *path, char hex[65], td_err *err);
int td_sha256_file_ex(const char *path, char hex[65], int *from_cache, td_err *err);
/* Files hashed and hashes taken from the cache by this process. */
void td_sha256_stats(long *hashed, long *cached);
void td_sha256_buf(const void *data, size_t n, char hex[65]);

/* mkdir -p: creates dir and its missing parents; TD_EINPUT naming the path
 * that could not be created. */
int td_mkdir_p(const char *dir, td_err *err);

/* Sorts v[0..n) ascending (qsort: the QSA selections a real model has run
 * to thousands of positions, too many for an insertion sort per token). */
void td_sort_i32(int32_t *v, size_t n);
void td_sort_i64(int64_t *v, size_t n);

#ifdef __cplusplus
}
#endif
#endif
