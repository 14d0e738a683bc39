/* SHA-256 of files and the provenance cache by file identity: the digests
 * against published vectors (FIPS 180-2 "abc" and one million 'a') and
 * coreutils' sha256sum; a rewritten or resized file is rehashed, an unchanged
 * one is taken from the cache, a just-written one is not cached, and a cache
 * that cannot be written costs nothing but the rehash. */
#include "td_common.h"
#include "td_test.h"

#include <dirent.h>

#define H_ABC "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
#define H_ABD "a52d159f262b2c6ddb724a61840befc36eb30c88877a4030b65cbe86298449c9"  /* sha256sum */
#define H_ABCD "88d4266fd4e6338d13b845fcf289579d209c897823b9217da3e161936f031589" /* sha256sum */
#define H_MILLION_A "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"

static char dir[256];

static void setup(void) {
    td_test_tmpdir(dir, sizeof dir, "sha");
    setenv("XDG_CACHE_HOME", td_test_path(dir, "cache"), 1);
    unsetenv("TAPDIFF_HASH_CACHE");
}
static void teardown(void) { td_test_rmdir(dir); }

static void put(const char *path, const char *bytes, size_t n, int flags) {
    int fd = open(path, O_WRONLY | O_CREAT | flags, 0644);
    cr_assert(fd >= 0, "%s: %s", path, strerror(errno));
    cr_assert_eq(write(fd, bytes, n), (ssize_t)n);
    close(fd);
}

/* mtime set to a fixed second long past: the file counts as settled. */
static void age(const char *path, time_t when) {
    struct timespec ts[2] = {{when, 0}, {when, 0}};
    cr_assert_eq(utimensat(AT_FDCWD, path, ts, 0), 0, "utimensat: %s", strerror(errno));
}

static int hash(const char *path, char hex[65]) {
    td_err err = {{0}};
    int cached = -1;
    cr_assert_eq(td_sha256_file_ex(path, hex, &cached, &err), TD_OK, "%s", err.msg);
    return cached;
}

TestSuite(sha256, .init = setup, .fini = teardown);

Test(sha256, published_vectors) {
    char hex[65];
    td_sha256_buf("abc", 3, hex);
    cr_assert_str_eq(hex, H_ABC);
    size_t n = 1000000;
    char *a = malloc(n);
    memset(a, 'a', n);
    const char *f = td_test_path(dir, "million");
    put(f, a, n, O_TRUNC);
    free(a);
    hash(f, hex);
    cr_assert_str_eq(hex, H_MILLION_A);
}

Test(sha256, unchanged_file_comes_from_cache_changed_file_is_rehashed) {
    const char *f = td_test_path(dir, "model.gguf");
    char hex[65];
    long h0, c0, h1, c1;
    put(f, "abc", 3, O_TRUNC);
    age(f, 1600000000);
    td_sha256_stats(&h0, &c0);
    cr_assert_eq(hash(f, hex), 0, "first sight: hashed");
    cr_assert_str_eq(hex, H_ABC);
    cr_assert_eq(hash(f, hex), 1, "unchanged: from the cache");
    cr_assert_str_eq(hex, H_ABC);
    td_sha256_stats(&h1, &c1);
    cr_assert_eq(h1 - h0, 1);
    cr_assert_eq(c1 - c0, 1);

    /* same size, same inode, new bytes and a new mtime */
    put(f, "abd", 3, 0);
    age(f, 1600000100);
    cr_assert_eq(hash(f, hex), 0, "rewritten in place: rehashed");
    cr_assert_str_eq(hex, H_ABD);
    cr_assert_eq(hash(f, hex), 1);
    cr_assert_str_eq(hex, H_ABD);

    /* a new size with the mtime set back to the cached entry's */
    put(f, "abcd", 4, O_TRUNC);
    age(f, 1600000100);
    cr_assert_eq(hash(f, hex), 0, "resized: rehashed");
    cr_assert_str_eq(hex, H_ABCD);

    /* replaced by another file (another inode) with the old size and mtime */
    const char *g = td_test_path(dir, "other");
    put(g, "abc", 3, O_TRUNC);
    age(g, 1600000000);
    cr_assert_eq(rename(g, f), 0);
    cr_assert_eq(hash(f, hex), 0, "replaced: rehashed");
    cr_assert_str_eq(hex, H_ABC);
}

Test(sha256, just_written_file_is_not_cached) {
    const char *f = td_test_path(dir, "fresh");
    char hex[65];
    put(f, "abc", 3, O_TRUNC);
    cr_assert_eq(hash(f, hex), 0);
    cr_assert_eq(hash(f, hex), 0, "a file written within the clock's granularity could change unseen");
    cr_assert_str_eq(hex, H_ABC);
}

Test(sha256, corrupt_cache_entry_is_ignored) {
    const char *f = td_test_path(dir, "m");
    char hex[65];
    put(f, "abc", 3, O_TRUNC);
    age(f, 1600000000);
    cr_assert_eq(hash(f, hex), 0);
    /* the one entry overwritten with something that is not a digest */
    char cdir[512];
    snprintf(cdir, sizeof cdir, "%s/tapdiff/sha256", td_test_path(dir, "cache"));
    DIR *d = opendir(cdir);
    cr_assert_not_null(d);
    struct dirent *de;
    int n = 0;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        char p[1024];
        snprintf(p, sizeof p, "%s/%s", cdir, de->d_name);
        put(p, "zz", 2, O_TRUNC);
        n++;
    }
    closedir(d);
    cr_assert_eq(n, 1, "one cache entry per file identity");
    cr_assert_eq(hash(f, hex), 0, "a damaged entry is not believed");
    cr_assert_str_eq(hex, H_ABC);
    cr_assert_eq(hash(f, hex), 1, "and is rewritten");
}

Test(sha256, unwritable_or_disabled_cache_never_fails_the_hash) {
    const char *f = td_test_path(dir, "m");
    char hex[65];
    put(f, "abc", 3, O_TRUNC);
    age(f, 1600000000);
    const char *blocker = td_test_path(dir, "not_a_dir");
    put(blocker, "x", 1, O_TRUNC);
    setenv("XDG_CACHE_HOME", blocker, 1);
    cr_assert_eq(hash(f, hex), 0);
    cr_assert_eq(hash(f, hex), 0);
    cr_assert_str_eq(hex, H_ABC);

    setenv("XDG_CACHE_HOME", td_test_path(dir, "cache2"), 1);
    setenv("TAPDIFF_HASH_CACHE", "0", 1);
    cr_assert_eq(hash(f, hex), 0);
    cr_assert_eq(hash(f, hex), 0, "TAPDIFF_HASH_CACHE=0: never from the cache");
    cr_assert_str_eq(hex, H_ABC);
}

/* td_sort_i32 / td_sort_i64 (common.c, beside the hashing): ascending, with
 * repeats, negatives and the extremes of the type; n 0 and 1 untouched. */
Test(common, sort_i32_and_i64_ascending) {
    int32_t a[] = {5, -1, INT32_MAX, 0, 5, INT32_MIN, 3};
    const int32_t wa[] = {INT32_MIN, -1, 0, 3, 5, 5, INT32_MAX};
    td_sort_i32(a, sizeof a / sizeof a[0]);
    for (size_t i = 0; i < sizeof a / sizeof a[0]; i++) cr_expect_eq(a[i], wa[i], "i32 [%zu] = %d", i, a[i]);
    int64_t b[] = {14, 12, 13, 3, 2, 1, 0, INT64_MIN, INT64_MAX, 7};
    const int64_t wb[] = {INT64_MIN, 0, 1, 2, 3, 7, 12, 13, 14, INT64_MAX};
    td_sort_i64(b, sizeof b / sizeof b[0]);
    for (size_t i = 0; i < sizeof b / sizeof b[0]; i++) cr_expect_eq(b[i], wb[i], "i64 [%zu] = %lld", i, (long long)b[i]);
    int64_t one = 9;
    td_sort_i64(&one, 1);
    td_sort_i64(NULL, 0);
    cr_expect_eq(one, 9);
}
