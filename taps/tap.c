/* tapdiff tap writer: the emit API of tap.h, writing the HDF5 schema
 * documented at the top of tapfile.h.
 *
 * Crash safety is the design constraint. HDF5 (1.10, no SWMR for new
 * objects) keeps metadata in a cache and may write any dirty entry whenever
 * it evicts one; a kill between two such writes can leave a group's B-tree,
 * symbol nodes and name heap disagreeing, and that damages the *finished*
 * steps that share /steps, not only the open one. H5Fflush alone makes the
 * file consistent at the instant of the flush but does not stop the next
 * step's evictions from rewriting shared structures half-way. So:
 *   - the metadata cache runs with evictions disabled: between two commits
 *     nothing of the metadata reaches the disk (the only writes are raw data
 *     of the open step, into space past everything the committed file uses);
 *   - step_end commits by closing the file (flush of every entry, file
 *     truncated to its end of allocation) and reopening it, which also drops
 *     the cache (it cannot grow past one step) and forgets freed space, so no
 *     later allocation can overwrite committed bytes;
 *   - the 1.8 file format (superblock v0/v1): a v3 superblock would record
 *     "open for writing" and every reader would refuse a killed file.
 * A kill therefore leaves the file as of the last step_end plus unreferenced
 * trailing bytes. Measured with 1.10.8, killing a writer during a step of
 * 3000 small taps after 1..100 finished steps: with H5Fflush alone at
 * step_end the file could not even list /steps ("addr overflow") or named a
 * step whose header was never written; with this scheme every finished step
 * read back intact at all 36 kill points. taps/tests/test_taps.c
 * (sigkill_leaves_finished_steps) fails for the flush-only writer. */
#include <ctype.h>
#include <errno.h>
#include <fnmatch.h>
#include <hdf5.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "tap.h"
#include "hist.h"
#include "tap_internal.h"
#include "tapfile.h"
#include "td_common.h"

// Datasets up to this size stay contiguous: chunk index + filters cost more
// than they save.
#define CONTIG_MAX_BYTES 4096
// Chunks of about this size: whole rows where a row fits (the reader
// streams by rows), inside HDF5's default 1 MiB chunk cache.
#define CHUNK_TARGET_BYTES (256u * 1024u)

struct td_tap_sink {
    char *path;
    td_tap_mode mode;
    int compress;
    char *filter;     // as given, "" for every tap
    char *filter_buf; // filter split in place into patterns
    char **patterns;
    int n_patterns;   // 0 = every tap has data (full mode)
    hid_t fapl;
    hid_t str_type;   // variable-length UTF-8 string
    hid_t scalar;     // a scalar dataspace, for the taps' attributes
    hid_t null_space; // the dataspace of every fingerprint-only tap
    hid_t dcpl;       // a tap's dataset creation properties (unchunked)
    hid_t gcpl;       // a step's group creation properties
    hid_t file;       // H5I_INVALID_HID only after a failed reopen
    hid_t steps;      // "/steps"
    hid_t step;       // the open step (writer side), H5I_INVALID_HID between steps
    int64_t step_index; // index of the open step, or of the next one
    int64_t step_taps;  // taps emitted in the open step
    int64_t seq;        // next sequence number
    int step_open;      // the engine's side: a step is begun and not ended
    int status;         // sticky first error (TD_OK while healthy)
    int abandoned;      // the file's descriptor now points at a memfd
    uint64_t reserve;   // bytes last reserved past the allocation (tests)
    td_err err;
    // Names of the open step's taps (duplicates are refused without asking
    // HDF5, which belongs to the writer thread): open addressing, a power of 2.
    char **names;
    size_t names_cap, names_n;
    // The writer (see "The writer thread" below). Everything from here to
    // w_err is shared with the thread and guarded by mu.
    int threaded;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv_work;  // a command was queued, or quit
    pthread_cond_t cv_done;  // a command was finished (room in the queue, a commit)
    struct cmd *head, *tail;
    size_t queued, queue_cap, queue_peak; // bytes of queued commands
    int busy, quit;
    int64_t committed;       // steps the writer has committed
    _Atomic int w_status;    // the writer's first error; w_err is set before it
    td_err w_err;
    double w_cpu;            // the thread's CPU seconds, set as it ends
    double waited;           // seconds the engine's thread waited for the writer
    // td_tap_step_begin_tokens: the token history hist.tokens reports
    int64_t next_pos;   // pos0 of a step begun without positions
    td_hist hist;
    int hist_due;       // the open step was begun with its tokens
    int hist_emitted;   // the engine emitted hist.tokens itself
};

/* ---------------------------------------------------------------- errors */

// Records the first error only: later ones are usually its consequences.
static int fail(td_tap_sink *s, int status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static void drain(td_tap_sink *s);
static int poll_writer(td_tap_sink *s);
static int fail(td_tap_sink *s, int status, const char *fmt, ...) {
    // The first error in the engine's order of calls: what the writer still
    // has queued came before this one.
    if (s->status == TD_OK) {
        drain(s);
        poll_writer(s);
    }
    if (s->status == TD_OK) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(s->err.msg, sizeof s->err.msg, fmt, ap);
        va_end(ap);
        s->status = status;
    }
    return s->status;
}

/* After a write error nothing more may reach the file: HDF5 would still
 * flush the open step's metadata at close, over structures the committed
 * steps share, and a close that fails leaves the library in a state its
 * shutdown at exit crashes on. So the file's descriptor is pointed at an
 * anonymous memory file (memfd): the close then succeeds against it, and the
 * file on disk stays exactly as of the last commit. */
static void abandon_file(td_tap_sink *s) {
    if (s->abandoned || s->file < 0) return;
    void *h = NULL;
    if (H5Fget_vfd_handle(s->file, s->fapl, &h) < 0 || !h) return;
    int fd = *(int *)h, mfd = (int)syscall(SYS_memfd_create, "tapdiff-abandoned", 0);
    if (mfd < 0) return;
    if (dup2(mfd, fd) >= 0) s->abandoned = 1;
    close(mfd);
}

// 0, or -1 with errno (ENOSPC) when the disk cannot hold the commit.
// Filesystems without fallocate are not protected (EOPNOTSUPP: 0).
static int reserve_space(td_tap_sink *s) {
    haddr_t eoa = 0;
    void *h = NULL;
    if (H5Fget_eoa(s->file, &eoa) < 0 || H5Fget_vfd_handle(s->file, s->fapl, &h) < 0 || !h) return 0;
    uint64_t slack = (1u << 20) + (uint64_t)eoa / 8;
    s->reserve = slack;
    const char *lim = getenv("TD_TAPS_FAIL_AT_BYTES"); // test hook: a disk of this size
    if (lim && *lim && (uint64_t)eoa + slack > strtoull(lim, NULL, 10)) {
        errno = ENOSPC;
        return -1;
    }
    int r = fallocate(*(int *)h, FALLOC_FL_KEEP_SIZE, 0, (off_t)(eoa + slack));
    if (r != 0 && (errno == EOPNOTSUPP || errno == ENOSYS)) return 0;
    return r;
}

// The writer's side of fail(): its first error, and nothing more reaches the
// file after it (the engine's thread learns of it at its next call).
static void wfail(td_tap_sink *s, int status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static void wfail(td_tap_sink *s, int status, const char *fmt, ...) {
    if (atomic_load_explicit(&s->w_status, memory_order_relaxed) != TD_OK) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->w_err.msg, sizeof s->w_err.msg, fmt, ap);
    va_end(ap);
    if (status == TD_EOUTPUT) abandon_file(s);
    atomic_store_explicit(&s->w_status, status, memory_order_release);
}

// Takes over the writer's error if it is the first one; returns the status.
static int poll_writer(td_tap_sink *s) {
    if (s->status == TD_OK) {
        int w = atomic_load_explicit(&s->w_status, memory_order_acquire);
        if (w != TD_OK) {
            memcpy(&s->err, &s->w_err, sizeof s->err);
            s->status = w;
        }
    }
    return s->status;
}

static int report(td_tap_sink *s, td_err *err) {
    poll_writer(s);
    if (s->status != TD_OK && err) memcpy(err, &s->err, sizeof *err);
    return s->status;
}

/* ---------------------------------------------------------------- dtypes */

static hid_t file_type(td_dtype dt) {
    switch (dt) {
    case TD_DT_F64: return H5T_IEEE_F64LE;
    case TD_DT_F32: return H5T_IEEE_F32LE;
    case TD_DT_F16:
    case TD_DT_BF16: return H5T_STD_U16LE; // bit patterns; the dtype attr says which
    case TD_DT_I32: return H5T_STD_I32LE;
    case TD_DT_I64: return H5T_STD_I64LE;
    }
    return H5I_INVALID_HID;
}

static hid_t mem_type(td_dtype dt) {
    switch (dt) {
    case TD_DT_F64: return H5T_NATIVE_DOUBLE;
    case TD_DT_F32: return H5T_NATIVE_FLOAT;
    case TD_DT_F16:
    case TD_DT_BF16: return H5T_NATIVE_UINT16;
    case TD_DT_I32: return H5T_NATIVE_INT32;
    case TD_DT_I64: return H5T_NATIVE_INT64;
    }
    return H5I_INVALID_HID;
}

/* ------------------------------------------------------------ attributes */

// n = 0: scalar; else a 1-D array of n. Replaces an existing attribute.
static herr_t attr_put(hid_t obj, const char *name, hid_t ftype, hid_t mtype, hsize_t n, const void *buf) {
    herr_t rc = -1;
    hid_t space, attr;
    htri_t exists;
    if (!H5OK(exists = H5Aexists(obj, name))) goto out;
    if (exists > 0 && !H5OK(H5Adelete(obj, name))) goto out;
    if (!H5OK(space = n ? H5Screate_simple(1, &n, NULL) : H5Screate(H5S_SCALAR))) goto out;
    if (!H5OK(attr = H5Acreate2(obj, name, ftype, space, H5P_DEFAULT, H5P_DEFAULT))) goto close_space;
    if (H5OK(H5Awrite(attr, mtype, buf))) rc = 0;
    if (!H5OK(H5Aclose(attr))) rc = -1;
close_space:
    if (!H5OK(H5Sclose(space))) rc = -1;
out:
    return rc;
}

// A new attribute on an object created by this writer a moment ago (so no
// existing one to replace), on a dataspace the caller keeps: a tap's
// attributes are most of the cost of a fingerprint-only tap.
static herr_t attr_new(hid_t obj, const char *name, hid_t ftype, hid_t mtype, hid_t space, const void *buf) {
    herr_t rc = 0;
    hid_t attr;
    if (!H5OK(attr = H5Acreate2(obj, name, ftype, space, H5P_DEFAULT, H5P_DEFAULT))) return -1;
    if (!H5OK(H5Awrite(attr, mtype, buf))) rc = -1;
    if (!H5OK(H5Aclose(attr))) rc = -1;
    return rc;
}

static herr_t attr_put_str(hid_t str_type, hid_t obj, const char *name, const char *value) {
    return attr_put(obj, name, str_type, str_type, 0, &value);
}

static herr_t attr_put_i64(hid_t obj, const char *name, int64_t v) {
    return attr_put(obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, 0, &v);
}

static herr_t attr_put_i32(hid_t obj, const char *name, int32_t v) {
    return attr_put(obj, name, H5T_STD_I32LE, H5T_NATIVE_INT32, 0, &v);
}

// Overwrites the value of an attribute created earlier (same type and space).
static herr_t attr_set(hid_t obj, const char *name, hid_t mtype, const void *buf) {
    herr_t rc = -1;
    hid_t attr;
    if (!H5OK(attr = H5Aopen(obj, name, H5P_DEFAULT))) return -1;
    if (H5OK(H5Awrite(attr, mtype, buf))) rc = 0;
    if (!H5OK(H5Aclose(attr))) rc = -1;
    return rc;
}

// The attributes of a tap's new dataset; sc: a scalar dataspace.
static herr_t tap_attrs(hid_t str_type, hid_t sc, hid_t dset, int64_t seq, int32_t layer, td_dtype dt, int ndim,
                        const int64_t *shape, int has_data, const td_fingerprint *fp) {
    const char *dtn = td_dtype_name(dt);
    const int32_t hd = has_data;
    if (attr_new(dset, "seq", H5T_STD_I64LE, H5T_NATIVE_INT64, sc, &seq) < 0 ||
        attr_new(dset, "layer", H5T_STD_I32LE, H5T_NATIVE_INT32, sc, &layer) < 0 ||
        attr_new(dset, "dtype", str_type, str_type, sc, &dtn) < 0 ||
        attr_put(dset, "shape", H5T_STD_I64LE, H5T_NATIVE_INT64, (hsize_t)ndim, shape) < 0 ||
        attr_new(dset, "has_data", H5T_STD_I32LE, H5T_NATIVE_INT32, sc, &hd) < 0 ||
        attr_new(dset, "fp_count", H5T_STD_U64LE, H5T_NATIVE_UINT64, sc, &fp->count) < 0 ||
        attr_new(dset, "fp_nonfinite", H5T_STD_U64LE, H5T_NATIVE_UINT64, sc, &fp->n_nonfinite) < 0 ||
        attr_new(dset, "fp_nonzero", H5T_STD_U64LE, H5T_NATIVE_UINT64, sc, &fp->n_nonzero) < 0 ||
        attr_new(dset, "fp_min", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, sc, &fp->min) < 0 ||
        attr_new(dset, "fp_max", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, sc, &fp->max) < 0 ||
        attr_new(dset, "fp_maxabs", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, sc, &fp->max_abs) < 0 ||
        attr_new(dset, "fp_sum", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, sc, &fp->sum) < 0 ||
        attr_new(dset, "fp_sumabs", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, sc, &fp->sum_abs) < 0 ||
        attr_new(dset, "fp_sumsq", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, sc, &fp->sum_sq) < 0 ||
        attr_put(dset, "fp_first", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, 4, fp->first) < 0)
        return -1;
    return 0;
}

/* ---------------------------------------------------------------- filter */

static void filter_parse(td_tap_sink *s) {
    s->filter_buf = td_xstrdup(s->filter);
    size_t n_items = 1;
    for (const char *p = s->filter_buf; *p; p++) n_items += (*p == ',');
    s->patterns = td_xcalloc(n_items, sizeof *s->patterns);
    char *save = NULL;
    // strtok_r skips empty items; blanks around an item are trimmed here.
    for (char *item = strtok_r(s->filter_buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        while (isspace((unsigned char)*item)) item++;
        char *end = item + strlen(item);
        while (end > item && isspace((unsigned char)end[-1])) *--end = '\0';
        if (*item) s->patterns[s->n_patterns++] = item;
    }
}

static int filter_match(const td_tap_sink *s, const char *name) {
    if (s->n_patterns == 0) return 1;
    for (int i = 0; i < s->n_patterns; i++)
        if (fnmatch(s->patterns[i], name, 0) == 0) return 1;
    return 0;
}

/* ------------------------------------------------------------------ sink */

td_tap_options td_tap_options_default(void) {
    td_tap_options o = {.mode = TD_TAP_FULL, .filter = NULL, .compress = 4};
    return o;
}

static int is_reserved_key(const char *key) {
    static const char *const reserved[] = {"format", "format_version", "created", "tap_mode", "tap_filter"};
    for (size_t i = 0; i < sizeof reserved / sizeof reserved[0]; i++)
        if (strcmp(key, reserved[i]) == 0) return 1;
    return 0;
}

static void step_name(char buf[32], int64_t index) {
    snprintf(buf, 32, "%06" PRId64, index);
}

// Closes /steps and the file (the open step must be closed first).
static herr_t file_close(td_tap_sink *s) {
    herr_t rc = 0;
    if (s->steps >= 0 && !H5OK(H5Gclose(s->steps))) rc = -1;
    s->steps = H5I_INVALID_HID;
    if (s->file >= 0 && !H5OK(H5Fclose(s->file))) rc = -1;
    s->file = H5I_INVALID_HID;
    return rc;
}

static void names_clear(td_tap_sink *s);
static void writer_start(td_tap_sink *s, int others_open);

/* HDF5 keeps global state and Debian builds it without thread safety: every
 * HDF5 call of the sinks of a process runs under this lock (a writer thread
 * holds it for one command at a time), so sinks open side by side do not
 * call HDF5 at once. */
static pthread_mutex_t h5_mu = PTHREAD_MUTEX_INITIALIZER;

static void sink_free(td_tap_sink *s) {
    if (s->str_type >= 0) H5Tclose(s->str_type);
    if (s->scalar >= 0) H5Sclose(s->scalar);
    if (s->null_space >= 0) H5Sclose(s->null_space);
    if (s->dcpl >= 0) H5Pclose(s->dcpl);
    if (s->gcpl >= 0) H5Pclose(s->gcpl);
    if (s->fapl >= 0) H5Pclose(s->fapl);
    names_clear(s);
    free(s->names);
    free(s->patterns);
    free(s->filter_buf);
    free(s->filter);
    free(s->path);
    free(s);
}

// The file access properties of every open of the file (see the top).
static hid_t make_fapl(void) {
    hid_t fapl;
    H5AC_cache_config_t mdc;
    memset(&mdc, 0, sizeof mdc);
    mdc.version = H5AC__CURR_CACHE_CONFIG_VERSION;
    if (!H5OK(fapl = H5Pcreate(H5P_FILE_ACCESS))) return H5I_INVALID_HID;
    if (!H5OK(H5Pset_libver_bounds(fapl, H5F_LIBVER_EARLIEST, H5F_LIBVER_V18))) goto fail;
    // SEMI: closing the file while an object is open fails instead of
    // silently postponing the close (which would void the commit).
    if (!H5OK(H5Pset_fclose_degree(fapl, H5F_CLOSE_SEMI))) goto fail;
    if (!H5OK(H5Pget_mdc_config(fapl, &mdc))) goto fail;
    // Evictions can only be disabled with every automatic resize off.
    mdc.incr_mode = H5C_incr__off;
    mdc.flash_incr_mode = H5C_flash_incr__off;
    mdc.decr_mode = H5C_decr__off;
    mdc.evictions_enabled = 0;
    if (!H5OK(H5Pset_mdc_config(fapl, &mdc))) goto fail;
    return fapl;
fail:
    H5Pclose(fapl);
    return H5I_INVALID_HID;
}

int td_tap_sink_open(td_tap_sink **out, const char *path, const td_tap_options *opt, td_err *err) {
    TD_ASSERT(out != NULL && path != NULL);
    *out = NULL;
    td_tap_options o = opt ? *opt : td_tap_options_default();
    if (o.mode != TD_TAP_FULL && o.mode != TD_TAP_FINGERPRINT)
        return td_err_set(err, TD_EINPUT, "tap file %s: tap mode %d is neither full (%d) nor fingerprint (%d)",
                          path, (int)o.mode, (int)TD_TAP_FULL, (int)TD_TAP_FINGERPRINT);
    if (o.compress < 0 || o.compress > 9)
        return td_err_set(err, TD_EINPUT, "tap file %s: compress level %d is outside 0..9", path, o.compress);
    pthread_mutex_lock(&h5_mu);
    td_taps_h5_quiet();
    // An HDF5 file the caller has open (a tap file it reads while writing
    // this one, as golden does) means it calls HDF5 itself: no writer thread.
    const int others_open = H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_FILE) > 0;

    td_tap_sink *s = td_xcalloc(1, sizeof *s);
    s->path = td_xstrdup(path);
    s->mode = o.mode;
    s->compress = o.compress;
    s->filter = td_xstrdup(o.filter ? o.filter : "");
    filter_parse(s);
    s->fapl = s->str_type = s->scalar = s->file = s->steps = s->step = H5I_INVALID_HID;
    s->null_space = s->dcpl = s->gcpl = H5I_INVALID_HID;

    const char *what;
    char *tmp = NULL;
    hid_t fcpl = H5I_INVALID_HID;
    what = "set up HDF5 file access";
    if ((s->fapl = make_fapl()) < 0) goto fail;
    what = "make a scalar dataspace";
    if (!H5OK(s->scalar = H5Screate(H5S_SCALAR)) || !H5OK(s->null_space = H5Screate(H5S_NULL))) goto fail;
    // No modification times on taps and steps: one header message less per
    // object, and a rerun writes the same bytes (readers never used them).
    what = "set up HDF5 object creation";
    if (!H5OK(s->dcpl = H5Pcreate(H5P_DATASET_CREATE)) || !H5OK(H5Pset_obj_track_times(s->dcpl, 0)) ||
        !H5OK(s->gcpl = H5Pcreate(H5P_GROUP_CREATE)) || !H5OK(H5Pset_obj_track_times(s->gcpl, 0)))
        goto fail;
    what = "make the HDF5 string type";
    if (!H5OK(s->str_type = H5Tcopy(H5T_C_S1)) || !H5OK(H5Tset_size(s->str_type, H5T_VARIABLE)) ||
        !H5OK(H5Tset_cset(s->str_type, H5T_CSET_UTF8)))
        goto fail;
    // Chunk-index B-tree nodes of 2*4 entries instead of 2*32: most taps are
    // a chunk or a few, and the default node (~2.5 KiB each) would double the
    // metadata of a small dataset. (Needs superblock v1; still 1.8-readable.)
    what = "set up HDF5 file creation";
    if (!H5OK(fcpl = H5Pcreate(H5P_FILE_CREATE)) || !H5OK(H5Pset_istore_k(fcpl, 4))) goto fail;
    // The file is made under a temporary name and renamed once it is a
    // valid, committed (empty) tap file: a kill at any instant leaves at
    // `path` either nothing new or a readable file.
    struct stat sb;
    if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode)) {
        td_err_set(err, TD_EOUTPUT, "tap file %s: exists and is not a regular file: not overwritten", path);
        goto fail_quiet;
    }
    size_t tl = strlen(path) + 16;
    tmp = td_xmalloc(tl);
    snprintf(tmp, tl, "%s.tmp.XXXXXX", path);
    int tfd = mkstemp(tmp);
    if (tfd < 0) {
        td_err_set(err, TD_EOUTPUT, "tap file %s: cannot create it: %s", path, strerror(errno));
        free(tmp);
        tmp = NULL;
        goto fail_quiet;
    }
    mode_t um = umask(0);
    umask(um);
    if (fchmod(tfd, 0666 & ~um)) { /* keeps mkstemp's 0600: still usable */
    }
    close(tfd);
    what = "create it";
    if (!H5OK(s->file = H5Fcreate(tmp, H5F_ACC_TRUNC, fcpl, s->fapl))) goto fail;
    H5Pclose(fcpl);
    fcpl = H5I_INVALID_HID;

    char created[32];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(created, sizeof created, "%Y-%m-%dT%H:%M:%SZ", &tm);
    int32_t version = TD_TAPFILE_VERSION;
    what = "write the root attributes";
    if (attr_put_str(s->str_type, s->file, "format", TD_TAPFILE_FORMAT) < 0 ||
        attr_put(s->file, "format_version", H5T_STD_I32LE, H5T_NATIVE_INT32, 0, &version) < 0 ||
        attr_put_str(s->str_type, s->file, "created", created) < 0 ||
        attr_put_str(s->str_type, s->file, "tap_mode", s->mode == TD_TAP_FULL ? "full" : "fingerprint") < 0 ||
        attr_put_str(s->str_type, s->file, "tap_filter", s->filter) < 0)
        goto fail;
    what = "create group /steps";
    if (!H5OK(s->steps = H5Gcreate2(s->file, "steps", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT))) goto fail;
    what = "commit it";
    if (file_close(s) < 0) goto fail;
    if (rename(tmp, path) != 0) {
        td_err_set(err, TD_EOUTPUT, "tap file %s: cannot rename %s to it: %s", path, tmp, strerror(errno));
        goto fail_quiet;
    }
    free(tmp);
    tmp = NULL;
    what = "reopen it";
    if (!H5OK(s->file = H5Fopen(path, H5F_ACC_RDWR, s->fapl)) ||
        !H5OK(s->steps = H5Gopen2(s->file, "steps", H5P_DEFAULT)))
        goto fail;
    pthread_mutex_unlock(&h5_mu);
    writer_start(s, others_open);
    *out = s;
    return TD_OK;
fail:
    td_err_set(err, TD_EOUTPUT, "tap file %s: cannot %s (%s)", path, what, td_taps_h5_last());
fail_quiet:
    if (fcpl >= 0) H5Pclose(fcpl);
    file_close(s);
    if (tmp) unlink(tmp);
    free(tmp);
    sink_free(s);
    pthread_mutex_unlock(&h5_mu);
    return TD_EOUTPUT;
}

/* ------------------------------------------------------- the writer thread
 *
 * Every HDF5 call of a sink is one of four commands (a step begun, a tap, a
 * step ended and committed, a root attribute), executed in the engine's
 * order. With the thread (the default) the engine's thread checks the call,
 * copies the values a tap keeps (and those of a tap up to FP_LATER_MAX bytes,
 * whose fingerprint the writer computes; a larger one's it computes itself)
 * and queues the command; a thread of the sink runs beside it and is the only
 * one to call HDF5 while it lives, so the engine computes while the file is
 * written.
 * Without it (TAPDIFF_TAP_THREAD=0, or another HDF5 file open in the process
 * when the sink opens: that caller uses HDF5 itself) the same commands run
 * at once on the engine's thread. Both write the same bytes.
 *   - Memory: the queue holds at most queue_cap bytes (a tap larger than
 *     that waits for an empty queue); the engine's thread blocks when full.
 *   - Durability: td_tap_step_end(k) returns once step k-1 is committed, so
 *     a kill loses at most the last step ended and the open one.
 *   - Errors: the writer's first error is sticky and returned by the next
 *     call (step_begin/step_end/attr/close), message and status as without
 *     the thread; after it the queued commands are dropped unexecuted.
 *   - fork: a child forked while the thread holds a lock of malloc or HDF5
 *     could deadlock; tapdiff closes every sink before it reads a tap file
 *     (which forks a checker), and debug builds of tapdiff abort on a fork
 *     while a writer lives (TD_TAP_FORK_CHECK). */

enum { CMD_STEP_BEGIN, CMD_TAP, CMD_STEP_END, CMD_ATTR };

typedef struct cmd {
    struct cmd *next;
    size_t bytes; // what it counts against the queue's cap
    int kind;
    int64_t step_index;
    td_step_kind skind; // CMD_STEP_BEGIN
    int64_t pos0, n_tokens;
    int64_t n_taps;     // CMD_STEP_END
    char full[TD_TAP_NAME_MAX]; // CMD_TAP
    td_dtype dtype;
    int ndim, has_data;
    int32_t layer;
    int64_t seq;
    uint64_t count;
    int64_t shape[TD_TAP_MAX_DIMS];
    td_fingerprint fp;
    int fp_later; // fp is the writer's to compute, from the queued values
    const void *data;
    char *key; // CMD_ATTR
    hid_t ftype, mtype;
    union {
        int64_t i64;
        double f64;
        const char *str;
    } v;
    _Alignas(16) unsigned char payload[]; // a queued tap's values, a queued attribute's key and string
} cmd;

#define QUEUE_CAP_DEFAULT (64u << 20)

/* With the thread, a tap of at most this many bytes has its fingerprint
 * computed by the writer, on its copy of the values (the same bits): the
 * copy costs the engine a fraction of the summary's sequential sums, and a
 * larger one would only add to the memory the queue holds. */
#define FP_LATER_MAX ((size_t)1 << 20)

static _Atomic int live_writers; // writer threads alive in the process

static void x_step_begin(td_tap_sink *s, const cmd *c) {
    char name[32];
    step_name(name, c->step_index);
    hid_t g;
    if (!H5OK(g = H5Gcreate2(s->steps, name, H5P_DEFAULT, s->gcpl, H5P_DEFAULT))) goto h5fail;
    if (attr_put_str(s->str_type, g, "kind", c->skind == TD_STEP_PREFILL ? "prefill" : "decode") < 0 ||
        attr_put_i64(g, "pos0", c->pos0) < 0 || attr_put_i64(g, "n_tokens", c->n_tokens) < 0 ||
        attr_put_i64(g, "n_taps", 0) < 0 || attr_put_i32(g, "complete", 0) < 0) {
        H5Gclose(g);
        goto h5fail;
    }
    s->step = g;
    return;
h5fail:
    wfail(s, TD_EOUTPUT, "tap file %s: cannot create step /steps/%s (%s)", s->path, name, td_taps_h5_last());
}

static void x_step_end(td_tap_sink *s, const cmd *c) {
    char name[32];
    step_name(name, c->step_index);
    int32_t one = 1;
    herr_t rc = attr_set(s->step, "n_taps", H5T_NATIVE_INT64, &c->n_taps);
    if (rc >= 0) rc = attr_set(s->step, "complete", H5T_NATIVE_INT32, &one);
    if (!H5OK(H5Gclose(s->step))) rc = -1;
    s->step = H5I_INVALID_HID;
    if (rc < 0) {
        wfail(s, TD_EOUTPUT, "tap file %s: cannot finish step /steps/%s (%s)", s->path, name, td_taps_h5_last());
        return;
    }
    // A commit that ran out of space half-way would leave the committed
    // steps' shared structures half-written: room for everything the close
    // can write is reserved first (the step's metadata lies below the
    // allocation end; what the close allocates stays far below the slack).
    if (reserve_space(s) != 0) {
        wfail(s, TD_EOUTPUT, "tap file %s: cannot commit step %s: %s", s->path, name, strerror(errno));
        return;
    }
    // The commit (see the top of this file): the close writes every cached
    // entry and truncates the file to its allocation; the reopen starts with
    // an empty cache and no memory of freed space.
    if (file_close(s) < 0) {
        wfail(s, TD_EOUTPUT, "tap file %s: cannot commit step %s (%s)", s->path, name, td_taps_h5_last());
        return;
    }
    if (!H5OK(s->file = H5Fopen(s->path, H5F_ACC_RDWR, s->fapl)) ||
        !H5OK(s->steps = H5Gopen2(s->file, "steps", H5P_DEFAULT))) {
        wfail(s, TD_EOUTPUT, "tap file %s: cannot reopen it after step %s (%s)", s->path, name,
              td_taps_h5_last());
        return;
    }
}

// Chunks of about CHUNK_TARGET_BYTES in row-major order: walking from the
// outermost dimension, 1 index of each dimension whose single slice is
// already over the target, then as many indices as fit, then all of the
// remaining (inner) dimensions. dims are all > 0.
static void chunk_dims(int ndim, const hsize_t *dims, size_t esize, hsize_t *chunk) {
    for (int d = 0; d < ndim; d++) {
        uint64_t inner = esize;
        for (int e = d + 1; e < ndim; e++) inner *= dims[e];
        if (inner >= CHUNK_TARGET_BYTES && d + 1 < ndim) {
            chunk[d] = 1;
            continue;
        }
        hsize_t n = (hsize_t)(CHUNK_TARGET_BYTES / inner);
        chunk[d] = n < 1 ? 1 : n > dims[d] ? dims[d] : n;
        for (int e = d + 1; e < ndim; e++) chunk[e] = dims[e];
        return;
    }
}

static void x_tap(td_tap_sink *s, const cmd *c) {
    hsize_t dims[TD_TAP_MAX_DIMS];
    for (int d = 0; d < c->ndim; d++) dims[d] = (hsize_t)c->shape[d];
    const size_t esize = td_dtype_size(c->dtype);
    int ok = 0;
    // A fingerprint-only tap (most taps of most runs) creates no dataspace
    // or property list of its own.
    hid_t space = s->null_space, dcpl = s->dcpl, dset;
    if (c->has_data && !H5OK(space = H5Screate_simple(c->ndim, dims, NULL))) goto out;
    if (c->has_data && c->count * esize > CONTIG_MAX_BYTES && s->compress > 0) {
        hsize_t chunk[TD_TAP_MAX_DIMS];
        if (!H5OK(dcpl = H5Pcopy(s->dcpl))) goto close_space;
        chunk_dims(c->ndim, dims, esize, chunk);
        // Order matters: shuffle groups the bytes that deflate then compresses.
        if (!H5OK(H5Pset_chunk(dcpl, c->ndim, chunk)) || !H5OK(H5Pset_shuffle(dcpl)) ||
            !H5OK(H5Pset_deflate(dcpl, (unsigned)s->compress)))
            goto close_dcpl;
    }
    if (!H5OK(dset = H5Dcreate2(s->step, c->full, file_type(c->dtype), space, H5P_DEFAULT, dcpl, H5P_DEFAULT)))
        goto close_dcpl;
    if (c->has_data && c->count > 0 &&
        !H5OK(H5Dwrite(dset, mem_type(c->dtype), H5S_ALL, H5S_ALL, H5P_DEFAULT, c->data)))
        goto close_dset;
    if (tap_attrs(s->str_type, s->scalar, dset, c->seq, c->layer, c->dtype, c->ndim, c->shape, c->has_data,
                  &c->fp) < 0)
        goto close_dset;
    ok = 1;
close_dset:
    if (!H5OK(H5Dclose(dset))) ok = 0;
close_dcpl:
    if (dcpl != s->dcpl && !H5OK(H5Pclose(dcpl))) ok = 0;
close_space:
    if (space != s->null_space && !H5OK(H5Sclose(space))) ok = 0;
out:
    if (!ok) {
        char step[32];
        step_name(step, c->step_index);
        wfail(s, TD_EOUTPUT, "tap file %s: step %s: cannot write tap '%s' (%s)", s->path, step, c->full,
              td_taps_h5_last());
    }
}

static void x_attr(td_tap_sink *s, const cmd *c) {
    const void *buf = c->ftype == s->str_type ? (const void *)&c->v.str : (const void *)&c->v;
    if (attr_put(s->file, c->key, c->ftype, c->mtype, 0, buf) < 0)
        wfail(s, TD_EOUTPUT, "tap file %s: cannot write root attribute '%s' (%s)", s->path, c->key,
              td_taps_h5_last());
}

static void execute(td_tap_sink *s, cmd *c) {
    if (atomic_load_explicit(&s->w_status, memory_order_relaxed) != TD_OK) return; // nothing after an error
    if (c->kind == CMD_TAP && c->fp_later) td_fingerprint_compute(&c->fp, c->dtype, c->data, c->count);
    pthread_mutex_lock(&h5_mu);
    switch (c->kind) {
    case CMD_STEP_BEGIN: x_step_begin(s, c); break;
    case CMD_TAP: x_tap(s, c); break;
    case CMD_STEP_END: x_step_end(s, c); break;
    case CMD_ATTR: x_attr(s, c); break;
    }
    pthread_mutex_unlock(&h5_mu);
}

static void *writer_main(void *arg) {
    td_tap_sink *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->head && !s->quit) pthread_cond_wait(&s->cv_work, &s->mu);
        cmd *c = s->head;
        if (!c) break; // quit with an empty queue
        s->head = c->next;
        if (!s->head) s->tail = NULL;
        s->busy = 1;
        pthread_mutex_unlock(&s->mu);
        execute(s, c);
        pthread_mutex_lock(&s->mu);
        s->busy = 0;
        s->queued -= c->bytes;
        if (c->kind == CMD_STEP_END && atomic_load(&s->w_status) == TD_OK) s->committed++;
        pthread_cond_broadcast(&s->cv_done);
        pthread_mutex_unlock(&s->mu);
        free(c);
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) == 0) s->w_cpu = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
    return NULL;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// Runs c now (no thread; c is the caller's) or queues it (c is then a
// td_xmalloc'd block the writer frees), blocking while the queue is full.
static void submit(td_tap_sink *s, cmd *c) {
    if (!s->threaded) {
        execute(s, c);
        if (c->kind == CMD_STEP_END && atomic_load(&s->w_status) == TD_OK) s->committed++;
        return;
    }
    c->next = NULL;
    pthread_mutex_lock(&s->mu);
    if (s->queued > 0 && s->queued + c->bytes > s->queue_cap) {
        const double t0 = now_s();
        while (s->queued > 0 && s->queued + c->bytes > s->queue_cap && atomic_load(&s->w_status) == TD_OK)
            pthread_cond_wait(&s->cv_done, &s->mu);
        s->waited += now_s() - t0;
    }
    if (atomic_load(&s->w_status) != TD_OK) { // dropped: nothing after an error
        pthread_mutex_unlock(&s->mu);
        free(c);
        return;
    }
    if (s->tail) s->tail->next = c;
    else s->head = c;
    s->tail = c;
    s->queued += c->bytes;
    if (s->queued > s->queue_peak) s->queue_peak = s->queued;
    pthread_cond_signal(&s->cv_work);
    pthread_mutex_unlock(&s->mu);
}

// A command for submit: on the stack without the thread, else on the heap
// with room for extra payload bytes.
static cmd *cmd_new(td_tap_sink *s, cmd *local, int kind, size_t extra) {
    cmd *c = local;
    if (s->threaded) c = td_xmalloc(sizeof *c + extra);
    memset(c, 0, sizeof *c);
    c->kind = kind;
    c->bytes = sizeof *c + extra;
    return c;
}

// Waits until the writer has run every queued command.
static void drain(td_tap_sink *s) {
    if (!s->threaded) return;
    pthread_mutex_lock(&s->mu);
    while (s->head || s->busy) pthread_cond_wait(&s->cv_done, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

// Waits until n steps are committed (or the writer failed).
static void wait_committed(td_tap_sink *s, int64_t n) {
    if (!s->threaded) return;
    pthread_mutex_lock(&s->mu);
    if (s->committed < n) {
        const double t0 = now_s();
        while (s->committed < n && atomic_load(&s->w_status) == TD_OK) pthread_cond_wait(&s->cv_done, &s->mu);
        s->waited += now_s() - t0;
    }
    pthread_mutex_unlock(&s->mu);
}

#ifdef TD_TAP_FORK_CHECK
static void fork_check(void) {
    if (atomic_load(&live_writers) > 0) {
        static const char m[] = "tapdiff: internal error: fork() while a tap writer thread lives "
                                "(close the tap sink before reading tap files)\n";
        if (write(2, m, sizeof m - 1) < 0) { /* aborting anyway */
        }
        abort();
    }
}
static pthread_once_t fork_check_once = PTHREAD_ONCE_INIT;
static void fork_check_install(void) {
    pthread_atfork(fork_check, NULL, NULL);
}
#endif

// Starts the thread unless TAPDIFF_TAP_THREAD=0 or the caller has an HDF5
// file of its own open (it would call HDF5 beside the thread). Not starting
// it is never an error: the commands then run inline.
static void writer_start(td_tap_sink *s, int others_open) {
    const char *env = getenv("TAPDIFF_TAP_THREAD");
    s->queue_cap = QUEUE_CAP_DEFAULT;
    const char *cap = getenv("TD_TAPS_QUEUE_BYTES"); // test hook: a small queue
    if (cap && *cap) s->queue_cap = (size_t)strtoull(cap, NULL, 10);
    if ((env && !strcmp(env, "0")) || others_open) return;
    if (pthread_mutex_init(&s->mu, NULL)) return;
    if (pthread_cond_init(&s->cv_work, NULL)) goto no_work;
    if (pthread_cond_init(&s->cv_done, NULL)) goto no_done;
#ifdef TD_TAP_FORK_CHECK
    pthread_once(&fork_check_once, fork_check_install);
#endif
    // Signals stay with the engine's threads.
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&s->thread, NULL, writer_main, s);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc == 0) {
        s->threaded = 1;
        atomic_fetch_add(&live_writers, 1);
        return;
    }
    pthread_cond_destroy(&s->cv_done);
no_done:
    pthread_cond_destroy(&s->cv_work);
no_work:
    pthread_mutex_destroy(&s->mu);
}

// Runs what is queued, ends the thread; HDF5 is the caller's again.
static void writer_stop(td_tap_sink *s) {
    if (!s->threaded) return;
    const double t0 = now_s();
    pthread_mutex_lock(&s->mu);
    s->quit = 1;
    pthread_cond_signal(&s->cv_work);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    s->waited += now_s() - t0;
    // TD_TAPS_STATS (bench/tap_cost.sh): where the writer's time went, which
    // CPU time alone cannot tell on a machine without a free core.
    const char *st = getenv("TD_TAPS_STATS");
    if (st && *st && strcmp(st, "0"))
        fprintf(stderr, "tap writer: thread cpu %.3f s, engine waited %.3f s, queue peak %zu bytes\n", s->w_cpu,
                s->waited, s->queue_peak);
    pthread_cond_destroy(&s->cv_done);
    pthread_cond_destroy(&s->cv_work);
    pthread_mutex_destroy(&s->mu);
    s->threaded = 0;
    atomic_fetch_sub(&live_writers, 1);
}

size_t td_taps_queue_peak(const td_tap_sink *s) {
    return s ? s->queue_peak : 0;
}

int td_taps_threaded(const td_tap_sink *s) {
    return s ? s->threaded : 0;
}

/* ------------------------------------------------------------ tap names */

static uint64_t name_hash(const char *p) {
    uint64_t h = 1469598103934665603u; // FNV-1a
    for (; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211u;
    return h;
}

static void names_clear(td_tap_sink *s) {
    for (size_t i = 0; i < s->names_cap; i++) {
        free(s->names[i]);
        s->names[i] = NULL;
    }
    s->names_n = 0;
}

// 1 when full was already emitted in the open step, else records it.
static int names_seen(td_tap_sink *s, const char *full) {
    if (2 * (s->names_n + 1) > s->names_cap) {
        size_t cap = s->names_cap ? 2 * s->names_cap : 256;
        char **t = td_xcalloc(cap, sizeof *t);
        for (size_t i = 0; i < s->names_cap; i++) {
            if (!s->names[i]) continue;
            size_t j = name_hash(s->names[i]) & (cap - 1);
            while (t[j]) j = (j + 1) & (cap - 1);
            t[j] = s->names[i];
        }
        free(s->names);
        s->names = t;
        s->names_cap = cap;
    }
    size_t j = name_hash(full) & (s->names_cap - 1);
    for (; s->names[j]; j = (j + 1) & (s->names_cap - 1))
        if (!strcmp(s->names[j], full)) return 1;
    s->names[j] = td_xstrdup(full);
    s->names_n++;
    return 0;
}

/* ---------------------------------------------------------------- attrs */

static int root_attr(td_tap_sink *s, const char *key, hid_t ftype, hid_t mtype, const void *buf) {
    if (poll_writer(s)) return s->status;
    if (!key || !*key) return fail(s, TD_EINPUT, "tap file %s: a root attribute needs a non-empty name", s->path);
    if (is_reserved_key(key))
        return fail(s, TD_EINPUT, "tap file %s: root attribute '%s' is written by the tap sink itself", s->path,
                    key);
    const int is_str = ftype == s->str_type;
    const size_t kl = strlen(key) + 1, vl = is_str ? strlen(*(const char *const *)buf) + 1 : 0;
    cmd local, *c = cmd_new(s, &local, CMD_ATTR, kl + vl);
    c->ftype = ftype;
    c->mtype = mtype;
    if (s->threaded) {
        c->key = memcpy(c->payload, key, kl);
        if (is_str) c->v.str = memcpy(c->payload + kl, *(const char *const *)buf, vl);
    } else {
        c->key = (char *)key;
        if (is_str) c->v.str = *(const char *const *)buf;
    }
    if (!is_str) memcpy(&c->v, buf, mtype == H5T_NATIVE_DOUBLE ? sizeof(double) : sizeof(int64_t));
    submit(s, c);
    // Root attributes are few: returned in full, as without the thread.
    drain(s);
    return poll_writer(s);
}

int td_tap_sink_attr_str(td_tap_sink *s, const char *key, const char *value) {
    if (!s) return TD_OK;
    if (!value)
        return fail(s, TD_EINPUT, "tap file %s: root attribute '%s' given a NULL string", s->path,
                    key ? key : "(null)");
    return root_attr(s, key, s->str_type, s->str_type, &value);
}

int td_tap_sink_attr_i64(td_tap_sink *s, const char *key, int64_t value) {
    if (!s) return TD_OK;
    return root_attr(s, key, H5T_STD_I64LE, H5T_NATIVE_INT64, &value);
}

int td_tap_sink_attr_f64(td_tap_sink *s, const char *key, double value) {
    if (!s) return TD_OK;
    return root_attr(s, key, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &value);
}

/* ----------------------------------------------------------------- steps */

static void emit(td_tap_sink *s, int layer, const char *name, td_dtype dtype, const void *data,
                 const td_fingerprint *pre, int ndim, const int64_t *shape);

int td_tap_step_begin(td_tap_sink *s, td_step_kind kind, int64_t pos0, int64_t n_tokens, td_err *err) {
    if (!s) return TD_OK;
    if (poll_writer(s)) return report(s, err);
    char name[32];
    step_name(name, s->step_index);
    if (s->step_open)
        fail(s, TD_EINPUT, "tap file %s: step_begin while step %s is still open (missing td_tap_step_end)",
             s->path, name);
    else if (kind != TD_STEP_PREFILL && kind != TD_STEP_DECODE)
        fail(s, TD_EINPUT, "tap file %s: step %s: kind %d is neither prefill (0) nor decode (1)", s->path, name,
             (int)kind);
    else if (pos0 < 0 || n_tokens < 1)
        fail(s, TD_EINPUT,
             "tap file %s: step %s: expected pos0 >= 0 and n_tokens >= 1, got %" PRId64 " and %" PRId64, s->path,
             name, pos0, n_tokens);
    if (s->status) return report(s, err);

    cmd local, *c = cmd_new(s, &local, CMD_STEP_BEGIN, 0);
    c->step_index = s->step_index;
    c->skind = kind;
    c->pos0 = pos0;
    c->n_tokens = n_tokens;
    submit(s, c);
    if (poll_writer(s)) return report(s, err);
    s->step_open = 1;
    names_clear(s);
    s->step_taps = 0;
    s->next_pos = pos0 + n_tokens;
    s->hist_due = s->hist_emitted = 0;
    return TD_OK;
}

int td_tap_step_end(td_tap_sink *s, td_err *err) {
    if (!s) return TD_OK;
    if (poll_writer(s)) return report(s, err);
    char name[32];
    step_name(name, s->step_index);
    if (!s->step_open) {
        fail(s, TD_EINPUT, "tap file %s: step_end without step_begin (the next step would be %s)", s->path, name);
        return report(s, err);
    }
    if (s->hist_due && !s->hist_emitted) {
        const int64_t w = s->hist.n;
        emit(s, -1, "hist.tokens", TD_DT_I64, s->hist.ids, NULL, 1, &w);
        if (s->status) return report(s, err);
    }
    cmd local, *c = cmd_new(s, &local, CMD_STEP_END, 0);
    c->step_index = s->step_index;
    c->n_taps = s->step_taps;
    submit(s, c);
    s->step_open = 0;
    s->step_index++;
    // The previous step is durable when this returns (this one by the next
    // step_end or the close): a kill loses at most one ended step.
    wait_committed(s, s->step_index - 1);
    return report(s, err);
}

/* ------------------------------------------------------------------ taps */

// The layer a name without an explicit layer carries ("blk.7.x" -> 7), else -1.
static int32_t layer_of(const char *full) {
    if (strncmp(full, "blk.", 4) != 0 || !isdigit((unsigned char)full[4])) return -1;
    int64_t v = 0;
    const char *p = full + 4;
    while (isdigit((unsigned char)*p) && v <= INT32_MAX) v = v * 10 + (*p++ - '0');
    return (*p == '.' && v <= INT32_MAX) ? (int32_t)v : -1;
}

// Checks the call, then has the dataset written; any failure becomes the
// sticky error. pre != NULL: a fingerprint computed by the caller (on its
// device), data is then NULL and nothing but the fingerprint is stored.
static void emit(td_tap_sink *s, int layer, const char *name, td_dtype dtype, const void *data,
                 const td_fingerprint *pre, int ndim, const int64_t *shape) {
    char step[32], full[TD_TAP_NAME_MAX];
    step_name(step, s->step_index);
    if (!name) {
        fail(s, TD_EINPUT, "tap file %s: step %s: tap with a NULL name", s->path, step);
        return;
    }
    int len = layer >= 0 ? snprintf(full, sizeof full, "blk.%d.%s", layer, name)
                         : snprintf(full, sizeof full, "%s", name);
    if (len < 0 || (size_t)len >= sizeof full) {
        fail(s, TD_EINPUT, "tap file %s: step %s: tap name '%.40s...' is longer than %d bytes", s->path, step,
             full, TD_TAP_NAME_MAX - 1);
        return;
    }
    if (!s->step_open) {
        fail(s, TD_EINPUT, "tap file %s: tap '%s' emitted outside a step (no td_tap_step_begin)", s->path, full);
        return;
    }
    if (!*full || strchr(full, '/') || strcmp(full, ".") == 0) {
        fail(s, TD_EINPUT, "tap file %s: step %s: tap name '%s' is empty, '.' or contains '/'", s->path, step,
             full);
        return;
    }
    size_t esize = td_dtype_size(dtype);
    if (esize == 0) {
        fail(s, TD_EINPUT, "tap file %s: step %s: tap '%s': unknown dtype %d", s->path, step, full, (int)dtype);
        return;
    }
    if (ndim < 1 || ndim > TD_TAP_MAX_DIMS || !shape) {
        fail(s, TD_EINPUT, "tap file %s: step %s: tap '%s': expected 1..%d dimensions, got %d%s", s->path, step,
             full, TD_TAP_MAX_DIMS, ndim, shape ? "" : " and a NULL shape");
        return;
    }
    uint64_t count = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0 || (shape[d] > 0 && count > ((uint64_t)PTRDIFF_MAX / 8) / (uint64_t)shape[d])) {
            fail(s, TD_EINPUT,
                 "tap file %s: step %s: tap '%s': dimension %d is %" PRId64 " (negative, or the tensor is too large)",
                 s->path, step, full, d, shape[d]);
            return;
        }
        count *= (uint64_t)shape[d];
    }
    if (pre && pre->count != count) {
        fail(s, TD_EINPUT,
             "tap file %s: step %s: tap '%s': the fingerprint counts %" PRIu64 " values, the shape %" PRIu64,
             s->path, step, full, pre->count, count);
        return;
    }
    if (!pre && !data && count > 0) {
        fail(s, TD_EINPUT, "tap file %s: step %s: tap '%s': NULL data for %" PRIu64 " values", s->path, step, full,
             count);
        return;
    }
    if (names_seen(s, full)) {
        fail(s, TD_EINPUT, "tap file %s: step %s: tap '%s' emitted twice in one step", s->path, step, full);
        return;
    }

    const int has_data = !pre && s->mode == TD_TAP_FULL && filter_match(s, full);
    const size_t vbytes = (size_t)count * esize;
    const int fp_later = !pre && s->threaded && (has_data || vbytes <= FP_LATER_MAX);
    const size_t nbytes = has_data || fp_later ? vbytes : 0;
    cmd local, *c = cmd_new(s, &local, CMD_TAP, nbytes);
    if (pre)
        c->fp = *pre;
    else if (!fp_later)
        td_fingerprint_compute(&c->fp, dtype, data, count);
    c->fp_later = fp_later;
    c->step_index = s->step_index;
    memcpy(c->full, full, (size_t)len + 1);
    c->dtype = dtype;
    c->ndim = ndim;
    memcpy(c->shape, shape, (size_t)ndim * sizeof *shape);
    c->has_data = has_data;
    c->layer = layer >= 0 ? (int32_t)layer : layer_of(full);
    c->seq = s->seq;
    c->count = count;
    // Queued, the values are the sink's copy: the engine may reuse its buffer
    // as soon as this returns.
    c->data = s->threaded && nbytes ? memcpy(c->payload, data, nbytes) : data;
    submit(s, c);
    if (poll_writer(s)) return;
    s->seq++;
    s->step_taps++;
    if (!strcmp(full, "hist.tokens")) s->hist_emitted = 1;
}

void td_tap_emit(td_tap_sink *s, int layer, const char *name, td_dtype dtype, const void *data, int ndim,
                 const int64_t *shape) {
    if (!s || poll_writer(s)) return;
    emit(s, layer, name, dtype, data, NULL, ndim, shape);
}

void td_tap_emit_fingerprint(td_tap_sink *s, int layer, const char *name, td_dtype dtype, const td_fingerprint *fp,
                             int ndim, const int64_t *shape) {
    if (!s || poll_writer(s)) return;
    if (!fp) {
        fail(s, TD_EINPUT, "tap file %s: tap '%s': td_tap_emit_fingerprint without a fingerprint", s->path,
             name ? name : "(null)");
        return;
    }
    emit(s, layer, name, dtype, NULL, fp, ndim, shape);
}

td_tap_want_level td_tap_want(const td_tap_sink *s, int layer, const char *name) {
    if (!s || s->status || atomic_load_explicit(&s->w_status, memory_order_acquire) || !s->step_open || !name)
        return TD_TAP_WANT_NONE;
    if (s->mode != TD_TAP_FULL) return TD_TAP_WANT_FINGERPRINT;
    if (s->n_patterns == 0) return TD_TAP_WANT_FULL;
    char full[TD_TAP_NAME_MAX];
    int len = layer >= 0 ? snprintf(full, sizeof full, "blk.%d.%s", layer, name)
                         : snprintf(full, sizeof full, "%s", name);
    // a name too long is refused by the emit that follows; asking for its data costs nothing then
    if (len < 0 || (size_t)len >= sizeof full) return TD_TAP_WANT_FINGERPRINT;
    return filter_match(s, full) ? TD_TAP_WANT_FULL : TD_TAP_WANT_FINGERPRINT;
}

int td_tap_sink_close(td_tap_sink *s, td_err *err) {
    if (!s) return TD_OK;
    writer_stop(s); // runs what is queued: what an engine emitted before close is written
    poll_writer(s);
    pthread_mutex_lock(&h5_mu);
    // A step still open keeps complete = 0: readers skip it.
    if (s->step >= 0 && !H5OK(H5Gclose(s->step)))
        fail(s, TD_EOUTPUT, "tap file %s: cannot close the open step (%s)", s->path, td_taps_h5_last());
    s->step = H5I_INVALID_HID;
    if (file_close(s) < 0)
        fail(s, TD_EOUTPUT, "tap file %s: cannot close it (%s)", s->path, td_taps_h5_last());
    int st = report(s, err);
    sink_free(s);
    pthread_mutex_unlock(&h5_mu);
    return st;
}


/* ------------------------------------------------------ engine helpers */

int td_tap_sink_open_env(td_tap_sink **out, const char *path, td_err *err) {
    TD_ASSERT(out != NULL);
    *out = NULL;
    if (!path || !*path) path = getenv("TAPDIFF_TAPS");
    if (!path || !*path) return TD_OK; // taps off
    td_tap_options o = td_tap_options_default();
    const char *mode = getenv("TAPDIFF_TAP_MODE");
    if (mode && *mode && strcmp(mode, "full") != 0) {
        if (strcmp(mode, "fingerprint") != 0)
            return td_err_set(err, TD_EINPUT, "TAPDIFF_TAP_MODE is '%s': expected full or fingerprint", mode);
        o.mode = TD_TAP_FINGERPRINT;
    }
    o.filter = getenv("TAPDIFF_TAP_FILTER");
    int rc = td_tap_sink_open(out, path, &o, err);
    if (rc) return rc;
    const char *decode = getenv("TAPDIFF_DECODE");
    if (decode && *decode && (rc = td_tap_sink_attr_str(*out, "decode", decode))) {
        report(*out, err);
        td_tap_sink_close(*out, NULL);
        *out = NULL;
    }
    return rc;
}

int td_tap_sink_provenance(td_tap_sink *s, const char *model_path, const char *arch, const char *backend,
                           const char *backend_version, const char *precision, td_err *err) {
    if (!s) return TD_OK;
    if (s->status) return report(s, err);
    if (!model_path || !arch || !backend) {
        fail(s, TD_EINPUT, "tap file %s: provenance needs the model path, the architecture and the backend name",
             s->path);
        return report(s, err);
    }
    char sha[65];
    td_err e = {{0}};
    if (td_sha256_file(model_path, sha, &e)) {
        fail(s, TD_EINPUT, "tap file %s: model_sha256: %s", s->path, e.msg);
        return report(s, err);
    }
    td_tap_sink_attr_str(s, "model", model_path);
    td_tap_sink_attr_str(s, "model_sha256", sha);
    td_tap_sink_attr_str(s, "arch", arch);
    td_tap_sink_attr_str(s, "backend", backend);
    if (backend_version) td_tap_sink_attr_str(s, "backend_version", backend_version);
    if (precision) td_tap_sink_attr_str(s, "precision", precision);
    return report(s, err);
}

int td_tap_step_begin_tokens(td_tap_sink *s, const int32_t *tokens, const int32_t *pos, int64_t n, td_err *err) {
    if (!s) return TD_OK;
    if (s->status) return report(s, err);
    if (!tokens || n < 1 || n > INT32_MAX) {
        fail(s, TD_EINPUT, "tap file %s: step_begin_tokens needs 1 or more tokens (got %" PRId64 "%s)", s->path, n,
             tokens ? "" : ", NULL");
        return report(s, err);
    }
    int64_t pos0 = pos ? pos[0] : s->next_pos;
    int rc = td_tap_step_begin(s, s->step_index == 0 ? TD_STEP_PREFILL : TD_STEP_DECODE, pos0, n, err);
    if (rc) return rc;
    const int64_t shape[1] = {n};
    int32_t *p = NULL;
    if (!pos) {
        p = td_xmalloc((size_t)n * sizeof *p);
        for (int64_t i = 0; i < n; i++) p[i] = (int32_t)(pos0 + i);
    }
    emit(s, -1, "inp.tokens", TD_DT_I32, tokens, NULL, 1, shape);
    if (!s->status) emit(s, -1, "inp.pos", TD_DT_I32, pos ? pos : p, NULL, 1, shape);
    free(p);
    td_hist_push(&s->hist, tokens, n);
    s->hist_due = 1;
    return report(s, err);
}
