/* tapdiff tap-file reader (tapfile.h): validates the schema documented there
 * and streams steps, tap metadata and tap data out of a tap file, one tap
 * (or row range) at a time. Also the dtype table and the HDF5 error helpers
 * the writer shares. Every defect of the file is TD_EINPUT with one line
 * naming the file, the object, what was expected and what was found. */
#include <errno.h>
#include <hdf5.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tap_internal.h"
#include "tapfile.h"
#include "td_common.h"

/* ----------------------------------------------------------------- dtype */

static const char *const dtype_names[] = {"f64", "f32", "f16", "bf16", "i32", "i64"};
static const size_t dtype_sizes[] = {8, 4, 2, 2, 4, 8};
#define N_DTYPES ((int)(sizeof dtype_names / sizeof dtype_names[0]))

const char *td_dtype_name(td_dtype dt) {
    return (int)dt >= 0 && (int)dt < N_DTYPES ? dtype_names[dt] : NULL;
}

int td_dtype_from_name(const char *name, td_dtype *dt) {
    for (int i = 0; name && i < N_DTYPES; i++)
        if (strcmp(name, dtype_names[i]) == 0) {
            *dt = (td_dtype)i;
            return 0;
        }
    return -1;
}

size_t td_dtype_size(td_dtype dt) {
    return (int)dt >= 0 && (int)dt < N_DTYPES ? dtype_sizes[dt] : 0;
}

int td_dtype_is_int(td_dtype dt) {
    return dt == TD_DT_I32 || dt == TD_DT_I64;
}

/* ----------------------------------------------------------- HDF5 errors */

static _Thread_local char h5_saved[512];

static herr_t innermost_cb(unsigned n, const H5E_error2_t *e, void *data) {
    // Walked upward: n == 0 is the innermost, most specific entry.
    if (n == 0) snprintf(data, sizeof h5_saved, "%s", e->desc && *e->desc ? e->desc : "HDF5 error, no description");
    return 0;
}

void td_taps_h5_save(void) {
    h5_saved[0] = '\0';
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, innermost_cb, h5_saved);
    H5Eclear2(H5E_DEFAULT);
}

const char *td_taps_h5_last(void) {
    return h5_saved[0] ? h5_saved : "no detail from HDF5";
}

void td_taps_h5_quiet(void) {
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
}

/* ---------------------------------------------------------------- reader */

// The library's predefined types the reader asks for, taken once: each use
// of a name like H5T_NATIVE_INT64 is a call into the library (H5open), ~17
// per tap checked. Their ids last as long as the library.
static struct {
    hid_t i32, i64, u64, f64, le[6];
} h5t;
static pthread_once_t h5t_once = PTHREAD_ONCE_INIT;

static void h5t_take(void) {
    h5t.i32 = H5T_NATIVE_INT32;
    h5t.i64 = H5T_NATIVE_INT64;
    h5t.u64 = H5T_NATIVE_UINT64;
    h5t.f64 = H5T_NATIVE_DOUBLE;
    h5t.le[TD_DT_F64] = H5T_IEEE_F64LE;
    h5t.le[TD_DT_F32] = H5T_IEEE_F32LE;
    h5t.le[TD_DT_F16] = H5T_STD_U16LE;
    h5t.le[TD_DT_BF16] = H5T_STD_U16LE;
    h5t.le[TD_DT_I32] = H5T_STD_I32LE;
    h5t.le[TD_DT_I64] = H5T_STD_I64LE;
}

static void h5t_init(void) {
    pthread_once(&h5t_once, h5t_take);
}

// The step td_tapfile_step_taps listed last: its group stays open and its
// taps' checked attributes are kept, so reading their data does not open the
// group and read every attribute of the tap again (that was most of what
// compare spent per tap). Behind a pointer: the reading API takes a const
// td_tapfile.
typedef struct {
    int64_t step;       // -1: none
    hid_t g;
    td_tap_info *taps;  // sorted by name
    int64_t n;
    // The tap whose values were last read through HDF5 stays open: reading
    // it in row blocks then decompresses each chunk once (its chunk cache
    // lives as long as the open dataset), not once per block.
    hid_t dset;
    char dname[TD_TAP_NAME_MAX];
} step_cache;

// The catalog: what the checker learnt about every step and tap, handed to
// the reader so that it does not ask the HDF5 library a second time (opening
// a dataset and reading its 15 attributes cost more than comparing its
// values). The checker writes it to an unnamed temporary file, which grows
// with the tap file; the reader keeps one step of it in memory. A tap whose
// values lie contiguous in the file as little-endian numbers carries their
// byte offset, and is read with pread: the checker proved the range lies in
// the file, and reading bytes cannot crash whatever they hold.
typedef struct {
    td_tap_info info;
    int64_t raw_off;    // offset of the values in the tap file; -1: read them through HDF5
    int64_t contiguous; // stored contiguous in the file (the check skips reading the values)
} cat_tap;

#define CAT_STEP_MAGIC 0x7064745f73746570ull // "pets_tdp"
#define CAT_END_MAGIC 0x7064745f5f646e65ull  // "end__tdp"

typedef struct {
    uint64_t magic;     // CAT_STEP_MAGIC
    int64_t index;
    td_step_info si;
    int64_t n;          // cat_tap records that follow, in seq order
} cat_step;

typedef struct {
    uint64_t magic;     // CAT_END_MAGIC
    int64_t n_steps;
    // the file the checker read: the reader refuses another one at its path
    uint64_t dev, ino, size;
    int64_t mtime_s, mtime_ns;
} cat_end;

typedef struct {
    int fd;             // the catalog
    int raw;            // the tap file, for raw reads
    int64_t n_steps;
    int64_t *off;       // per step: offset of its cat_step
    td_step_info *si;   // per step
    int64_t step;       // the step loaded below, -1: none
    cat_tap *taps;      // its taps in seq order
    const cat_tap **by_name;
    int64_t n;
    uint64_t raw_values; // read by raw_read so far
} catalog;

struct td_tapfile {
    char *path;
    hid_t file;
    hid_t steps;      // "/steps"
    int64_t n_steps;  // complete ones
    char note[512];
    step_cache *sc;
    catalog *cat;     // NULL: metadata is read through HDF5
};

static void cache_drop(step_cache *c) {
    if (c->dset >= 0) H5Dclose(c->dset);
    c->dset = H5I_INVALID_HID;
    if (c->g >= 0) H5Gclose(c->g);
    c->g = H5I_INVALID_HID;
    free(c->taps);
    c->taps = NULL;
    c->n = 0;
    c->step = -1;
}

static int by_name(const void *a, const void *b) {
    return strcmp(((const td_tap_info *)a)->name, ((const td_tap_info *)b)->name);
}

static const td_tap_info *cache_find(const step_cache *c, int64_t step, const char *name) {
    if (c->step != step || !c->taps) return NULL;
    td_tap_info key;
    if (strlen(name) >= sizeof key.name) return NULL;
    strcpy(key.name, name);
    return bsearch(&key, c->taps, (size_t)c->n, sizeof *c->taps, by_name);
}

static void step_name(char buf[32], int64_t index) {
    snprintf(buf, 32, "%06" PRId64, index);
}

// Why H5Aopen failed: the attribute is absent, or looking it up failed. Asked
// only after a failure: a lookup before every open costs a second search of
// the object header on every attribute of every tap.
static int attr_missing(const char *path, hid_t obj, const char *where, const char *name, td_err *err) {
    char why[512];
    snprintf(why, sizeof why, "%s", td_taps_h5_last());
    htri_t exists = H5Aexists(obj, name);
    if (exists == 0) return td_err_set(err, TD_EINPUT, "tap file %s: %s: attribute '%s' is missing", path, where, name);
    if (exists < 0)
        return td_err_set(err, TD_EINPUT, "tap file %s: %s: cannot look up attribute '%s' (%s)", path, where, name,
                          td_taps_h5_last());
    return td_err_set(err, TD_EINPUT, "tap file %s: %s: cannot read attribute '%s' (%s)", path, where, name, why);
}

// A numeric type whose layout HDF5's converters can trust. They take a
// type's bit offset and precision from the file as they are: an 8-byte
// integer with offset 59904 made H5T__bit_find read far outside the value (a
// mutant that crashed compare, or not, depending on the heap). Honest writers
// only make whole-width integers at offset 0 and IEEE floats.
static int numeric_type_sane(hid_t type) {
    H5T_class_t cls = H5Tget_class(type);
    size_t size = H5Tget_size(type);
    if (cls == H5T_INTEGER)
        return (size == 1 || size == 2 || size == 4 || size == 8) && H5Tget_precision(type) == 8 * size &&
               H5Tget_offset(type) == 0;
    if (cls == H5T_FLOAT)
        return H5Tequal(type, H5T_IEEE_F64LE) > 0 || H5Tequal(type, H5T_IEEE_F32LE) > 0 ||
               H5Tequal(type, H5T_IEEE_F64BE) > 0 || H5Tequal(type, H5T_IEEE_F32BE) > 0;
    return 0;
}

// Reads attribute `name` of `obj` (described as `where` in messages) into
// buf as mtype, checking its class and that it holds min_n..max_n values
// (a scalar holds 1). *n (may be NULL) receives the count.
static int attr_read(const char *path, hid_t obj, const char *where, const char *name, H5T_class_t cls,
                     hid_t mtype, hssize_t min_n, hssize_t max_n, void *buf, hssize_t *n, td_err *err) {
    const char *cls_name = cls == H5T_INTEGER ? "an integer" : cls == H5T_FLOAT ? "a float" : "a string";
    hid_t attr, type, space;
    int st = TD_EINPUT, reported = 0;
    if (!H5OK(attr = H5Aopen(obj, name, H5P_DEFAULT))) return attr_missing(path, obj, where, name, err);
    if (!H5OK(type = H5Aget_type(attr))) goto close_attr;
    if (!H5OK(space = H5Aget_space(attr))) goto close_type;
    // Stored as the type it is read into (what tapdiff writes): a sane
    // number of the expected class, known in one call instead of four.
    int as_read = H5Tequal(type, mtype) > 0;
    // The schema's int32 scalars read as int64 (layer, has_data, complete):
    // read as they are stored and widened here, without HDF5's conversion.
    int as_i32 = !as_read && mtype == h5t.i64 && max_n == 1 && H5Tequal(type, h5t.i32) > 0;
    H5T_class_t got = as_read || as_i32 ? cls : H5Tget_class(type);
    // A scalar (most of the schema) is known in one call, an array by its
    // extent; rank and count as H5Sget_simple_extent_ndims/_npoints say.
    H5S_class_t sclass = H5Sget_simple_extent_type(space);
    int rank = sclass == H5S_SCALAR || sclass == H5S_NULL ? 0 : -1;
    hssize_t npoints = sclass == H5S_SCALAR ? 1 : sclass == H5S_NULL ? 0 : -1;
    if (sclass == H5S_SIMPLE) {
        hsize_t dims[H5S_MAX_RANK];
        if ((rank = H5Sget_simple_extent_dims(space, dims, NULL)) >= 0) {
            hsize_t p = 1;
            for (int d = 0; d < rank; d++) p *= dims[d];
            npoints = (hssize_t)p;
        }
    }
    if (got != cls || rank < 0 || rank > 1 || npoints < min_n || npoints > max_n) {
        td_err_set(err, TD_EINPUT,
                   "tap file %s: %s: attribute '%s' should be %s %s of %lld..%lld values; found HDF5 class %d, "
                   "rank %d, %lld values",
                   path, where, name, cls_name, max_n > 1 ? "array" : "scalar", (long long)min_n, (long long)max_n,
                   (int)got, rank, (long long)npoints);
        reported = 1;
        goto close_space;
    }
    if (!as_read && !as_i32 && !numeric_type_sane(type)) {
        td_err_set(err, TD_EINPUT, "tap file %s: %s: attribute '%s' has a damaged HDF5 number type", path, where,
                   name);
        reported = 1;
        goto close_space;
    }
    if (as_i32) {
        int32_t v;
        if (!H5OK(H5Aread(attr, h5t.i32, &v))) goto close_space;
        *(int64_t *)buf = v;
    } else if (!H5OK(H5Aread(attr, mtype, buf))) {
        goto close_space;
    }
    if (n) *n = npoints;
    st = TD_OK;
close_space:
    H5Sclose(space);
close_type:
    H5Tclose(type);
close_attr:
    H5Aclose(attr);
    if (st != TD_OK && !reported)
        td_err_set(err, st, "tap file %s: %s: cannot read attribute '%s' (%s)", path, where, name, td_taps_h5_last());
    return st;
}

static int attr_i64(const char *path, hid_t obj, const char *where, const char *name, int64_t *v, td_err *err) {
    return attr_read(path, obj, where, name, H5T_INTEGER, h5t.i64, 1, 1, v, NULL, err);
}

static int attr_u64(const char *path, hid_t obj, const char *where, const char *name, uint64_t *v, td_err *err) {
    return attr_read(path, obj, where, name, H5T_INTEGER, h5t.u64, 1, 1, v, NULL, err);
}

static int attr_f64(const char *path, hid_t obj, const char *where, const char *name, double *v, td_err *err) {
    return attr_read(path, obj, where, name, H5T_FLOAT, h5t.f64, 1, 1, v, NULL, err);
}

// A scalar string attribute, fixed or variable length; *out td_xmalloc'd.
static int attr_string(const char *path, hid_t obj, const char *where, const char *name, char **out,
                       td_err *err) {
    *out = NULL;
    hid_t attr, type, space;
    int st = TD_EINPUT, reported = 0;
    if (!H5OK(attr = H5Aopen(obj, name, H5P_DEFAULT))) return attr_missing(path, obj, where, name, err);
    if (!H5OK(type = H5Aget_type(attr))) goto close_attr;
    if (!H5OK(space = H5Aget_space(attr))) goto close_type;
    if (H5Tget_class(type) != H5T_STRING || H5Sget_simple_extent_npoints(space) != 1) {
        td_err_set(err, TD_EINPUT, "tap file %s: %s: attribute '%s' should be a scalar string", path, where, name);
        reported = 1;
        goto close_space;
    }
    htri_t vlen;
    if (!H5OK(vlen = H5Tis_variable_str(type))) goto close_space;
    if (vlen) {
        char *p = NULL;
        if (!H5OK(H5Aread(attr, type, &p))) goto close_space;
        *out = td_xstrdup(p ? p : "");
        H5free_memory(p);
    } else {
        // Fixed length: NUL-terminated, NUL-padded or space-padded; the +1
        // terminates a string that fills the whole size.
        size_t size = H5Tget_size(type);
        char *b = td_xcalloc(size + 1, 1);
        if (!H5OK(H5Aread(attr, type, b))) {
            free(b);
            goto close_space;
        }
        if (H5Tget_strpad(type) == H5T_STR_SPACEPAD)
            for (size_t i = size; i > 0 && b[i - 1] == ' '; i--) b[i - 1] = '\0';
        *out = b;
    }
    st = TD_OK;
close_space:
    H5Sclose(space);
close_type:
    H5Tclose(type);
close_attr:
    H5Aclose(attr);
    if (st != TD_OK && !reported)
        td_err_set(err, st, "tap file %s: %s: cannot read attribute '%s' (%s)", path, where, name, td_taps_h5_last());
    return st;
}

static void cat_free(catalog *c) {
    if (!c) return;
    if (c->fd >= 0) close(c->fd);
    if (c->raw >= 0) close(c->raw);
    free(c->off);
    free(c->si);
    free(c->taps);
    free(c->by_name);
    free(c);
}

static void tapfile_free(td_tapfile *f) {
    cat_free(f->cat);
    if (f->sc) cache_drop(f->sc);
    free(f->sc);
    if (f->steps >= 0) H5Gclose(f->steps);
    if (f->file >= 0) H5Fclose(f->file);
    free(f->path);
    free(f);
}

// Counts the complete steps: 000000.. must be exactly the members of /steps,
// complete = 1 except possibly the last (a writer stopped during it).
static int scan_steps(td_tapfile *f, td_err *err) {
    H5G_info_t gi;
    if (!H5OK(H5Gget_info(f->steps, &gi)))
        return td_err_set(err, TD_EINPUT, "tap file %s: cannot list /steps (%s)", f->path, td_taps_h5_last());
    int64_t n = (int64_t)gi.nlinks;
    for (int64_t i = 0; i < n; i++) {
        char name[32], where[48];
        step_name(name, i);
        snprintf(where, sizeof where, "/steps/%s", name);
        htri_t ex;
        if (!H5OK(ex = H5Lexists(f->steps, name, H5P_DEFAULT)) || !ex)
            return td_err_set(err, TD_EINPUT, "tap file %s: /steps has %" PRId64 " members but no %s (expected steps "
                              "numbered 000000..%06" PRId64 ")",
                              f->path, n, name, n - 1);
        hid_t g;
        if (!H5OK(g = H5Gopen2(f->steps, name, H5P_DEFAULT)))
            return td_err_set(err, TD_EINPUT, "tap file %s: %s is not a group (%s)", f->path, where,
                              td_taps_h5_last());
        int64_t complete = 0;
        int st = attr_i64(f->path, g, where, "complete", &complete, err);
        H5Gclose(g);
        if (st) return st;
        if (complete == 1) continue;
        if (i + 1 < n)
            return td_err_set(err, TD_EINPUT, "tap file %s: %s has complete = %" PRId64 " but later steps follow",
                              f->path, where, complete);
        snprintf(f->note, sizeof f->note,
                 "tap file %s: step %s is incomplete (complete = %" PRId64 ": the writer stopped during it); "
                 "ignored, %" PRId64 " complete steps",
                 f->path, name, complete, i);
        n = i;
    }
    f->n_steps = n;
    return TD_OK;
}

static int open_inprocess(td_tapfile **out, const char *path, td_err *err) {
    struct stat sb;
    if (stat(path, &sb) != 0)
        return td_err_set(err, TD_EINPUT, "tap file %s: cannot open it: %s", path, strerror(errno));
    if (!S_ISREG(sb.st_mode)) return td_err_set(err, TD_EINPUT, "tap file %s: not a regular file", path);
    htri_t is_h5;
    if (!H5OK(is_h5 = H5Fis_hdf5(path)) || !is_h5)
        return td_err_set(err, TD_EINPUT, "tap file %s: not an HDF5 file%s%s", path, is_h5 < 0 ? ": " : "",
                          is_h5 < 0 ? td_taps_h5_last() : " (no HDF5 signature)");

    h5t_init();
    td_tapfile *f = td_xcalloc(1, sizeof *f);
    f->path = td_xstrdup(path);
    f->file = f->steps = H5I_INVALID_HID;
    f->sc = td_xcalloc(1, sizeof *f->sc);
    f->sc->step = -1;
    f->sc->g = H5I_INVALID_HID;
    f->sc->dset = H5I_INVALID_HID;
    int st = TD_EINPUT;
    char *format = NULL;
    // HDF5's metadata cache grows with what was read (up to 32 MiB by
    // default): a long file would cost memory in proportion to its steps.
    // A reader visits each object once, so a small cache loses nothing.
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    H5AC_cache_config_t mdc;
    memset(&mdc, 0, sizeof mdc);
    mdc.version = H5AC__CURR_CACHE_CONFIG_VERSION;
    if (fapl >= 0 && H5Pget_mdc_config(fapl, &mdc) >= 0) {
        mdc.set_initial_size = 1;
        // Sizes count the entries' bytes on disk; parsed object headers
        // take ~15 times that in memory (measured: 1 MiB of cache held
        // 25 MB), so 256 KiB is a few steps' worth of objects.
        mdc.initial_size = 256 << 10;
        mdc.min_size = 128 << 10;
        mdc.max_size = 256 << 10;
        H5Pset_mdc_config(fapl, &mdc);
    }
    // Each object is visited once: its header leaves the cache when it is
    // closed, freed while its memory is still hot, instead of being evicted
    // cold later to make room (measured: ~25% of a compare's CPU time).
    if (fapl >= 0) H5Pset_evict_on_close(fapl, 1);
    f->file = H5Fopen(path, H5F_ACC_RDONLY, fapl >= 0 ? fapl : H5P_DEFAULT);
    if (fapl >= 0) H5Pclose(fapl);
    if (!H5OK(f->file)) {
        td_err_set(err, st, "tap file %s: cannot open it as HDF5 (%s)", path, td_taps_h5_last());
        goto fail;
    }
    htri_t has_format;
    if (!H5OK(has_format = H5Aexists(f->file, "format")) || !has_format) {
        td_err_set(err, st, "tap file %s: no root attribute 'format' (expected \"" TD_TAPFILE_FORMAT
               "\"): an HDF5 file, but not a tapdiff tap file", path);
        goto fail;
    }
    if ((st = attr_string(path, f->file, "root", "format", &format, err))) goto fail;
    st = TD_EINPUT;
    if (strcmp(format, TD_TAPFILE_FORMAT) != 0) {
        td_err_set(err, st, "tap file %s: root attribute format is \"%.200s\", expected \"" TD_TAPFILE_FORMAT "\"",
                   path, format);
        goto fail;
    }
    int64_t version = 0;
    if ((st = attr_i64(path, f->file, "root", "format_version", &version, err))) goto fail;
    st = TD_EINPUT;
    if (version != TD_TAPFILE_VERSION) {
        td_err_set(err, st, "tap file %s: format_version is %" PRId64 ", this tapdiff reads version %d", path,
                   version, TD_TAPFILE_VERSION);
        goto fail;
    }
    htri_t has_steps;
    if (!H5OK(has_steps = H5Lexists(f->file, "steps", H5P_DEFAULT)) || !has_steps ||
        !H5OK(f->steps = H5Gopen2(f->file, "steps", H5P_DEFAULT))) {
        td_err_set(err, st, "tap file %s: no group /steps", path);
        goto fail;
    }
    if ((st = scan_steps(f, err))) goto fail;
    free(format);
    *out = f;
    return TD_OK;
fail:
    free(format);
    tapfile_free(f);
    return st;
}

/* --------------------------------------------------------------- catalog */

static int check_file(const td_tapfile *f, int cat_fd, td_err *err);

// An unnamed temporary file for the catalog, or -1 (the reader then asks
// HDF5 for everything, as it would without one).
static int cat_create(void) {
    FILE *t = tmpfile();
    if (!t) return -1;
    int fd = fcntl(fileno(t), F_DUPFD_CLOEXEC, 0);
    fclose(t);
    return fd;
}

static int pread_all(int fd, void *buf, size_t n, uint64_t off) {
    char *p = buf;
    while (n) {
        ssize_t r = pread(fd, p, n, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r == 0) errno = 0; // the file ends early
        if (r <= 0) return -1;
        p += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    return 0;
}

static int pwrite_all(int fd, const void *buf, size_t n, uint64_t off) {
    const char *p = buf;
    while (n) {
        ssize_t w = pwrite(fd, p, n, (off_t)off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
        off += (uint64_t)w;
    }
    return 0;
}

// Takes the catalog the checker wrote to fd (closed here in every case).
// A catalog that is incomplete (the checker could not write it all) is
// dropped: the reader then asks HDF5. A tap file that is not the one the
// checker read (replaced or rewritten since) is TD_EINPUT.
static int cat_attach(td_tapfile *f, int fd, td_err *err) {
    if (fd < 0) return TD_OK;
    catalog *c = td_xcalloc(1, sizeof *c);
    c->fd = fd;
    c->raw = -1;
    c->step = -1;
    struct stat cs, rs;
    cat_end end;
    int st = TD_OK;
    if (fstat(fd, &cs) != 0 || cs.st_size < (off_t)sizeof end ||
        pread_all(fd, &end, sizeof end, (uint64_t)cs.st_size - sizeof end) || end.magic != CAT_END_MAGIC ||
        end.n_steps < 0)
        goto drop;
    c->raw = open(f->path, O_RDONLY | O_CLOEXEC);
    if (c->raw < 0 || fstat(c->raw, &rs) != 0) goto drop;
    if ((uint64_t)rs.st_dev != end.dev || (uint64_t)rs.st_ino != end.ino || (uint64_t)rs.st_size != end.size ||
        (int64_t)rs.st_mtim.tv_sec != end.mtime_s || (int64_t)rs.st_mtim.tv_nsec != end.mtime_ns ||
        end.n_steps != f->n_steps) {
        st = td_err_set(err, TD_EINPUT, "tap file %s: changed while it was being checked (another file, size or "
                        "modification time): not read", f->path);
        goto drop;
    }
    c->n_steps = end.n_steps;
    c->off = td_xmalloc(sizeof *c->off * (size_t)(c->n_steps ? c->n_steps : 1));
    c->si = td_xmalloc(sizeof *c->si * (size_t)(c->n_steps ? c->n_steps : 1));
    uint64_t off = 0, end_off = (uint64_t)cs.st_size - sizeof end;
    for (int64_t s = 0; s < c->n_steps; s++) {
        cat_step h;
        if (end_off - off < sizeof h || pread_all(fd, &h, sizeof h, off) || h.magic != CAT_STEP_MAGIC ||
            h.index != s || h.n < 0 || h.n != h.si.n_taps || h.n > TD_TAPFILE_MAX_TAPS ||
            (uint64_t)h.n * sizeof(cat_tap) > end_off - off - sizeof h)
            goto drop;
        c->off[s] = (int64_t)off;
        c->si[s] = h.si;
        off += sizeof h + (uint64_t)h.n * sizeof(cat_tap);
    }
    if (off != end_off) goto drop;
    f->cat = c;
    return TD_OK;
drop:
    cat_free(c);
    return st;
}

static int cat_by_name(const void *a, const void *b) {
    return strcmp((*(const cat_tap *const *)a)->info.name, (*(const cat_tap *const *)b)->info.name);
}

static int step_range(const td_tapfile *f, int64_t step, td_err *err) {
    if (step >= 0 && step < f->n_steps) return TD_OK;
    return td_err_set(err, TD_EINPUT, "tap file %s: step %" PRId64 " requested, the file has %" PRId64
                      " complete steps", f->path, step, f->n_steps);
}

// Loads the taps of `step` (in range) from the catalog.
static int cat_load(const td_tapfile *f, int64_t step, td_err *err) {
    catalog *c = f->cat;
    if (c->step == step) return TD_OK;
    c->step = -1;
    int64_t n = c->si[step].n_taps;
    c->taps = td_xrealloc(c->taps, sizeof *c->taps * (size_t)(n ? n : 1));
    c->by_name = td_xrealloc(c->by_name, sizeof *c->by_name * (size_t)(n ? n : 1));
    if (pread_all(c->fd, c->taps, sizeof *c->taps * (size_t)n, (uint64_t)c->off[step] + sizeof(cat_step)))
        return td_err_set(err, TD_EINTERNAL, "tap file %s: cannot read back its catalog: %s", f->path,
                          strerror(errno ? errno : EIO));
    for (int64_t i = 0; i < n; i++) c->by_name[i] = &c->taps[i];
    qsort(c->by_name, (size_t)n, sizeof *c->by_name, cat_by_name);
    c->n = n;
    c->step = step;
    return TD_OK;
}

// The tap called name in step, from the catalog; the reader's message when
// there is none.
static int cat_find(const td_tapfile *f, int64_t step, const char *name, const cat_tap **out, td_err *err) {
    int st = step_range(f, step, err);
    if (!st) st = cat_load(f, step, err);
    if (st) return st;
    cat_tap key;
    const cat_tap *kp = &key, *const *hit = NULL;
    if (name && strlen(name) < sizeof key.info.name) {
        strcpy(key.info.name, name);
        hit = bsearch(&kp, f->cat->by_name, (size_t)f->cat->n, sizeof kp, cat_by_name);
    }
    if (!hit) {
        char sname[32];
        step_name(sname, step);
        return td_err_set(err, TD_EINPUT, "tap file %s: step %s has no tap '%s'", f->path, sname,
                          name ? name : "(null)");
    }
    *out = *hit;
    return TD_OK;
}

/* ------------------------------------------------------ isolated check */

// The HDF5 library trusts lengths stored in the file (a variable-length
// string's length is copied from the file and the heap object is copied into
// a buffer of that length), and no API call lets us check them first. So the
// first reading of a file happens in a forked child that walks all of it; a
// child killed by a signal, stopped by a sanitizer or out of time means the
// file is damaged, and the parent never touches it. The child's stderr goes
// to /dev/null: what the library or a sanitizer says about a hostile file is
// not ours to print; the verdict comes back on a pipe as "OK" or
// "<status> <message>".

static int check_child(int fd, const char *path, int cat_fd) {
    int devnull = open("/dev/null", O_WRONLY);
    if (devnull >= 0) {
        dup2(devnull, STDERR_FILENO);
        close(devnull);
    }
    td_err e = {{0}};
    td_tapfile *f = NULL;
    int st = open_inprocess(&f, path, &e);
    if (!st) st = check_file(f, cat_fd, &e);
    // Closing frees the library's cached metadata, which a damaged file can
    // have corrupted: that crash must happen here, not in the parent's close.
    if (f) td_tapfile_close(f);
    char buf[sizeof e.msg + 16];
    int n = st ? snprintf(buf, sizeof buf, "%d %s", st, e.msg) : snprintf(buf, sizeof buf, "OK");
    if (n > (int)sizeof buf - 1) n = (int)sizeof buf - 1;
    ssize_t w = write(fd, buf, (size_t)n);
    (void)w;
    // _exit: no atexit handlers (HDF5's shutdown, leak checks) in the child.
    _exit(0);
}

// A checker under way: its process and the read end of its verdict pipe.
typedef struct {
    pid_t pid;
    int fd;
} checker;

static int checker_start(const char *path, int cat_fd, checker *c, td_err *err) {
    int fds[2];
    if (pipe(fds) != 0)
        return td_err_set(err, TD_EINTERNAL, "tap file %s: cannot create a pipe: %s", path, strerror(errno));
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        return td_err_set(err, TD_EINTERNAL, "tap file %s: cannot fork the checker: %s", path, strerror(errno));
    }
    if (pid == 0) {
        close(fds[0]);
        // A loop inside the library on a hostile file must end too. The
        // limit is on CPU time (a loop spins; a busy machine does not make
        // an honest file look like one): far above what reading any honest
        // file costs (~1 s per 100 MB). The wall-clock alarm is a backstop.
        struct stat sb;
        uint64_t size = stat(path, &sb) == 0 ? (uint64_t)sb.st_size : 0;
        rlim_t cpu = 30 + (rlim_t)(size / (20u << 20));
        const char *env = getenv("TD_TAPFILE_CHECK_SECONDS");
        if (env && atoi(env) > 0) cpu = (rlim_t)atoi(env);
        struct rlimit rl = {cpu, cpu + 5};
        setrlimit(RLIMIT_CPU, &rl);
        alarm((unsigned)(20 * cpu + 600));
        check_child(fds[1], path, cat_fd);
    }
    close(fds[1]);
    c->pid = pid;
    c->fd = fds[0];
    return TD_OK;
}

// Waits for the checker and turns its verdict into a status.
static int checker_finish(const char *path, checker *c, td_err *err) {
    char buf[sizeof err->msg + 16];
    size_t len = 0;
    for (;;) {
        ssize_t r = read(c->fd, buf + len, sizeof buf - 1 - len);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        len += (size_t)r;
        if (len == sizeof buf - 1) break;
    }
    buf[len] = '\0';
    close(c->fd);
    int ws = 0;
    while (waitpid(c->pid, &ws, 0) < 0 && errno == EINTR) {
    }
    if (len >= 2 && strcmp(buf, "OK") == 0 && WIFEXITED(ws) && WEXITSTATUS(ws) == 0) return TD_OK;
    int st = 0, off = 0;
    if (len > 0 && WIFEXITED(ws) && WEXITSTATUS(ws) == 0 && sscanf(buf, "%d %n", &st, &off) == 1 && off > 0 &&
        st > 0) {
        td_err_set(err, st, "%s", buf + off);
        return st;
    }
    if (WIFSIGNALED(ws) && (WTERMSIG(ws) == SIGALRM || WTERMSIG(ws) == SIGXCPU || WTERMSIG(ws) == SIGKILL))
        return td_err_set(err, TD_EINPUT, "tap file %s: damaged: reading it did not finish in time (a loop in its "
                          "HDF5 structures)", path);
    if (WIFSIGNALED(ws))
        return td_err_set(err, TD_EINPUT, "tap file %s: damaged: reading it crashed the HDF5 library (signal %d, "
                          "%s)", path, WTERMSIG(ws), strsignal(WTERMSIG(ws)));
    return td_err_set(err, TD_EINPUT, "tap file %s: damaged: reading it failed inside the HDF5 library (checker "
                      "exit status %d)", path, WIFEXITED(ws) ? WEXITSTATUS(ws) : -1);
}

int td_tapfile_open(td_tapfile **out, const char *path, td_err *err) {
    TD_ASSERT(out != NULL && path != NULL);
    return td_tapfile_open_all(out, &path, 1, err);
}

static int open_stat(const char *path, td_err *err) {
    struct stat sb;
    if (stat(path, &sb) != 0)
        return td_err_set(err, TD_EINPUT, "tap file %s: cannot open it: %s", path, strerror(errno));
    if (!S_ISREG(sb.st_mode)) return td_err_set(err, TD_EINPUT, "tap file %s: not a regular file", path);
    return TD_OK;
}

// The files' checkers run at once; then each file is opened in order, as n
// calls of td_tapfile_open would (the first failure is the one reported).
int td_tapfile_open_all(td_tapfile **out, const char *const *paths, int n, td_err *err) {
    TD_ASSERT(out != NULL && paths != NULL && n >= 0);
    for (int i = 0; i < n; i++) out[i] = NULL;
    td_taps_h5_quiet();
    const char *inproc = getenv("TD_TAPFILE_INPROCESS");
    const int isolated = !(inproc && strcmp(inproc, "1") == 0);
    typedef struct {
        int st;      // of the stat or the checker
        int cat_fd;
        checker c;
        int started;
        td_err e;
    } one;
    one *o = td_xcalloc(n ? (size_t)n : 1, sizeof *o);
    for (int i = 0; i < n; i++) {
        TD_ASSERT(paths[i] != NULL);
        o[i].cat_fd = -1;
        if ((o[i].st = open_stat(paths[i], &o[i].e))) continue;
        o[i].cat_fd = cat_create();
        if (isolated) {
            o[i].st = checker_start(paths[i], o[i].cat_fd, &o[i].c, &o[i].e);
            o[i].started = !o[i].st;
        }
    }
    for (int i = 0; i < n; i++)
        if (o[i].started) o[i].st = checker_finish(paths[i], &o[i].c, &o[i].e);
    int st = TD_OK;
    for (int i = 0; i < n; i++) {
        if (!st) {
            st = o[i].st;
            if (!st) st = open_inprocess(&out[i], paths[i], &o[i].e);
            if (!st && !isolated) st = check_file(out[i], o[i].cat_fd, &o[i].e);
            if (!st) {
                st = cat_attach(out[i], o[i].cat_fd, &o[i].e); // closes the catalog
                o[i].cat_fd = -1;
            }
            if (st && err) *err = o[i].e;
        }
        if (o[i].cat_fd >= 0) close(o[i].cat_fd);
    }
    if (st) {
        for (int i = 0; i < n; i++) {
            td_tapfile_close(out[i]);
            out[i] = NULL;
        }
    }
    free(o);
    return st;
}

void td_tapfile_close(td_tapfile *f) {
    if (f) tapfile_free(f);
}

const char *td_tapfile_path(const td_tapfile *f) {
    return f->path;
}

int64_t td_tapfile_n_steps(const td_tapfile *f) {
    return f->n_steps;
}

const char *td_tapfile_note(const td_tapfile *f) {
    return f->note;
}

uint64_t td_tapfile_raw_values(const td_tapfile *f) {
    return f->cat ? f->cat->raw_values : 0;
}

/* ------------------------------------------------------ root attributes */

static void append(char **buf, size_t *len, size_t *cap, const char *s) {
    size_t n = strlen(s);
    if (*len + n + 1 > *cap) {
        *cap = 2 * (*len + n + 1);
        *buf = td_xrealloc(*buf, *cap);
    }
    memcpy(*buf + *len, s, n + 1);
    *len += n;
}

int td_tapfile_attr_str(const td_tapfile *f, const char *key, char **out, td_err *err) {
    TD_ASSERT(key != NULL && out != NULL);
    *out = NULL;
    htri_t ex;
    if (!H5OK(ex = H5Aexists(f->file, key)) || !ex)
        return td_err_set(err, TD_EINPUT, "tap file %s: no root attribute '%s'", f->path, key);
    hid_t attr, type, space;
    if (!H5OK(attr = H5Aopen(f->file, key, H5P_DEFAULT)))
        return td_err_set(err, TD_EINPUT, "tap file %s: cannot open root attribute '%s' (%s)", f->path, key,
                          td_taps_h5_last());
    H5T_class_t cls = H5T_NO_CLASS;
    H5T_sign_t sign = H5T_SGN_2;
    hssize_t n = -1;
    int rank = -1;
    if (H5OK(type = H5Aget_type(attr))) {
        cls = H5Tget_class(type);
        if (cls == H5T_INTEGER) sign = H5Tget_sign(type);
        H5Tclose(type);
    }
    if (H5OK(space = H5Aget_space(attr))) {
        n = H5Sget_simple_extent_npoints(space);
        rank = H5Sget_simple_extent_ndims(space);
        H5Sclose(space);
    }
    H5Aclose(attr);
    if (cls == H5T_STRING) return attr_string(f->path, f->file, "root", key, out, err);
    if ((cls != H5T_INTEGER && cls != H5T_FLOAT) || n < 1 || rank < 0 || rank > 1)
        return td_err_set(err, TD_EINPUT,
                          "tap file %s: root attribute '%s' is not a string, a number or a 1-D array of numbers",
                          f->path, key);
    // Numbers: read as int64/uint64/double and print, comma-separated.
    void *vals = td_xmalloc((size_t)n * 8);
    hid_t mtype = cls == H5T_FLOAT ? H5T_NATIVE_DOUBLE : sign == H5T_SGN_NONE ? H5T_NATIVE_UINT64 : H5T_NATIVE_INT64;
    int st = attr_read(f->path, f->file, "root", key, cls, mtype, n, n, vals, NULL, err);
    if (st) {
        free(vals);
        return st;
    }
    char *buf = NULL;
    size_t len = 0, cap = 0;
    append(&buf, &len, &cap, "");
    for (hssize_t i = 0; i < n; i++) {
        char one[40];
        if (cls == H5T_FLOAT)
            snprintf(one, sizeof one, "%.17g", ((double *)vals)[i]);
        else if (sign == H5T_SGN_NONE)
            snprintf(one, sizeof one, "%" PRIu64, ((uint64_t *)vals)[i]);
        else
            snprintf(one, sizeof one, "%" PRId64, ((int64_t *)vals)[i]);
        if (i) append(&buf, &len, &cap, ",");
        append(&buf, &len, &cap, one);
    }
    free(vals);
    *out = buf;
    return TD_OK;
}

typedef struct name_list {
    char **names;
    int n, cap;
} name_list;

static herr_t collect_attr(hid_t loc, const char *name, const H5A_info_t *info, void *data) {
    (void)loc;
    (void)info;
    name_list *l = data;
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 16;
        l->names = td_xrealloc(l->names, (size_t)l->cap * sizeof *l->names);
    }
    l->names[l->n++] = td_xstrdup(name);
    return 0;
}

int td_tapfile_attr_names(const td_tapfile *f, char ***names, int *n, td_err *err) {
    name_list l = {0};
    if (!H5OK(H5Aiterate2(f->file, H5_INDEX_NAME, H5_ITER_INC, NULL, collect_attr, &l))) {
        td_tapfile_free_names(l.names, l.n);
        *names = NULL;
        *n = 0;
        return td_err_set(err, TD_EINPUT, "tap file %s: cannot list the root attributes (%s)", f->path,
                          td_taps_h5_last());
    }
    *names = l.names;
    *n = l.n;
    return TD_OK;
}

void td_tapfile_free_names(char **names, int n) {
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
}

/* ----------------------------------------------------------------- steps */

static int open_step(const td_tapfile *f, int64_t step, hid_t *g, char name[32], td_err *err) {
    step_name(name, step);
    int st = step_range(f, step, err);
    if (st) return st;
    if (!H5OK(*g = H5Gopen2(f->steps, name, H5P_DEFAULT)))
        return td_err_set(err, TD_EINPUT, "tap file %s: cannot open /steps/%s (%s)", f->path, name,
                          td_taps_h5_last());
    return TD_OK;
}

int td_tapfile_step(const td_tapfile *f, int64_t step, td_step_info *info, td_err *err) {
    if (f->cat) {
        int st = step_range(f, step, err);
        if (!st) *info = f->cat->si[step];
        return st;
    }
    char name[32], where[48];
    hid_t g;
    int st = open_step(f, step, &g, name, err);
    if (st) return st;
    snprintf(where, sizeof where, "/steps/%s", name);
    memset(info, 0, sizeof *info);
    info->index = step;
    char *kind = NULL;
    if ((st = attr_string(f->path, g, where, "kind", &kind, err)) ||
        (st = attr_i64(f->path, g, where, "pos0", &info->pos0, err)) ||
        (st = attr_i64(f->path, g, where, "n_tokens", &info->n_tokens, err)) ||
        (st = attr_i64(f->path, g, where, "n_taps", &info->n_taps, err)))
        goto out;
    // Counts are checked before anyone sizes a buffer by them.
    if (info->pos0 < 0 || info->pos0 > TD_TAPFILE_MAX_POS || info->n_tokens < 1 ||
        info->n_tokens > TD_TAPFILE_MAX_POS || info->n_taps < 0 || info->n_taps > TD_TAPFILE_MAX_TAPS) {
        st = td_err_set(err, TD_EINPUT,
                        "tap file %s: %s: pos0 %" PRId64 ", n_tokens %" PRId64 ", n_taps %" PRId64
                        " (expected 0 <= pos0 <= %d, 1 <= n_tokens <= %d, 0 <= n_taps <= %d)",
                        f->path, where, info->pos0, info->n_tokens, info->n_taps, TD_TAPFILE_MAX_POS,
                        TD_TAPFILE_MAX_POS, TD_TAPFILE_MAX_TAPS);
        goto out;
    }
    if (strcmp(kind, "prefill") == 0)
        info->kind = TD_STEP_PREFILL;
    else if (strcmp(kind, "decode") == 0)
        info->kind = TD_STEP_DECODE;
    else
        st = td_err_set(err, TD_EINPUT, "tap file %s: %s: kind is \"%.64s\", expected \"prefill\" or \"decode\"",
                        f->path, where, kind);
out:
    free(kind);
    H5Gclose(g);
    return st;
}

// The file type tapdiff writes for each dtype (little-endian).
static hid_t stored_le(td_dtype dt) {
    return (int)dt >= 0 && (int)dt < N_DTYPES ? h5t.le[dt] : H5I_INVALID_HID;
}

// Expected HDF5 storage of each dtype: class, size, signedness.
static int storage_matches(td_dtype dt, hid_t type) {
    H5T_class_t cls = H5Tget_class(type);
    size_t size = H5Tget_size(type);
    if (!numeric_type_sane(type)) return 0;
    switch (dt) {
    case TD_DT_F64: return cls == H5T_FLOAT && size == 8;
    case TD_DT_F32: return cls == H5T_FLOAT && size == 4;
    case TD_DT_F16:
    case TD_DT_BF16: return cls == H5T_INTEGER && size == 2 && H5Tget_sign(type) == H5T_SGN_NONE;
    case TD_DT_I32: return cls == H5T_INTEGER && size == 4 && H5Tget_sign(type) == H5T_SGN_2;
    case TD_DT_I64: return cls == H5T_INTEGER && size == 8 && H5Tget_sign(type) == H5T_SGN_2;
    }
    return 0;
}

// Reads and checks one tap's attributes and storage. dset is open. *le
// (may be NULL): the values are stored as little-endian numbers.
static int load_tap(const td_tapfile *f, hid_t dset, const char *step, const char *name, td_tap_info *t, int *le,
                    td_err *err) {
    char where[48 + TD_TAP_NAME_MAX];
    snprintf(where, sizeof where, "/steps/%s/%s", step, name);
    memset(t, 0, sizeof *t);
    if (strlen(name) >= sizeof t->name)
        return td_err_set(err, TD_EINPUT, "tap file %s: %s: tap name longer than %d bytes", f->path, where,
                          TD_TAP_NAME_MAX - 1);
    strcpy(t->name, name);
    const char *p = f->path;
    int64_t layer = 0, has_data = 0, shape[TD_TAP_MAX_DIMS];
    hssize_t ndim = 0;
    char *dtype = NULL;
    int st;
    if ((st = attr_i64(p, dset, where, "seq", &t->seq, err)) || (st = attr_i64(p, dset, where, "layer", &layer, err)) ||
        (st = attr_string(p, dset, where, "dtype", &dtype, err)) ||
        (st = attr_read(p, dset, where, "shape", H5T_INTEGER, h5t.i64, 1, TD_TAP_MAX_DIMS, shape, &ndim,
                        err)) ||
        (st = attr_i64(p, dset, where, "has_data", &has_data, err)) ||
        (st = attr_u64(p, dset, where, "fp_count", &t->fp.count, err)) ||
        (st = attr_u64(p, dset, where, "fp_nonfinite", &t->fp.n_nonfinite, err)) ||
        (st = attr_u64(p, dset, where, "fp_nonzero", &t->fp.n_nonzero, err)) ||
        (st = attr_f64(p, dset, where, "fp_min", &t->fp.min, err)) ||
        (st = attr_f64(p, dset, where, "fp_max", &t->fp.max, err)) ||
        (st = attr_f64(p, dset, where, "fp_maxabs", &t->fp.max_abs, err)) ||
        (st = attr_f64(p, dset, where, "fp_sum", &t->fp.sum, err)) ||
        (st = attr_f64(p, dset, where, "fp_sumabs", &t->fp.sum_abs, err)) ||
        (st = attr_f64(p, dset, where, "fp_sumsq", &t->fp.sum_sq, err)) ||
        (st = attr_read(p, dset, where, "fp_first", H5T_FLOAT, h5t.f64, 4, 4, t->fp.first, NULL, err)))
        goto out;
    st = TD_EINPUT;
    if (layer < -1 || layer > INT32_MAX) {
        td_err_set(err, st, "tap file %s: %s: layer is %" PRId64 ", expected -1 or a block index", p, where, layer);
        goto out;
    }
    t->layer = (int32_t)layer;
    if (td_dtype_from_name(dtype, &t->dtype) != 0) {
        td_err_set(err, st, "tap file %s: %s: dtype is \"%.32s\", expected one of f64 f32 f16 bf16 i32 i64", p, where,
                   dtype);
        goto out;
    }
    if (has_data != 0 && has_data != 1) {
        td_err_set(err, st, "tap file %s: %s: has_data is %" PRId64 ", expected 0 or 1", p, where, has_data);
        goto out;
    }
    t->has_data = (int)has_data;
    t->ndim = (int)ndim;
    t->count = 1;
    for (int d = 0; d < t->ndim; d++) {
        if (shape[d] < 0 || (shape[d] > 0 && t->count > ((uint64_t)PTRDIFF_MAX / 8) / (uint64_t)shape[d])) {
            td_err_set(err, st, "tap file %s: %s: shape[%d] is %" PRId64 " (negative or too large)", p, where, d,
                       shape[d]);
            goto out;
        }
        t->shape[d] = shape[d];
        t->count *= (uint64_t)shape[d];
    }
    if (t->fp.count != t->count) {
        td_err_set(err, st, "tap file %s: %s: fp_count is %" PRIu64 " but the shape holds %" PRIu64 " values", p, where,
                   t->fp.count, t->count);
        goto out;
    }
    // The stored data must be what the attributes describe.
    hid_t type, space;
    if (!H5OK(type = H5Dget_type(dset))) goto h5fail;
    // What tapdiff writes is known in one call, the rest by its parts.
    int type_le = H5Tequal(type, stored_le(t->dtype)) > 0;
    int type_ok = type_le || storage_matches(t->dtype, type);
    if (le) *le = type_le || (type_ok && H5Tget_order(type) == H5T_ORDER_LE);
    H5Tclose(type);
    if (!type_ok) {
        td_err_set(err, st, "tap file %s: %s: stored HDF5 type does not match dtype %s (expected %s)", p, where,
                   dtype, t->dtype == TD_DT_F16 || t->dtype == TD_DT_BF16 ? "uint16 bits" : "that type");
        goto out;
    }
    if (!H5OK(space = H5Dget_space(dset))) goto h5fail;
    // With data: the extent has the shape's rank (at least 1: only a simple
    // extent has one). Without: a null extent.
    hsize_t dims[H5S_MAX_RANK];
    int space_ok;
    if (t->has_data) {
        int rank = H5Sget_simple_extent_dims(space, dims, NULL);
        space_ok = rank >= 1 && rank == t->ndim;
        for (int d = 0; space_ok && d < rank; d++) space_ok = dims[d] == (hsize_t)t->shape[d];
    } else {
        space_ok = H5Sget_simple_extent_type(space) == H5S_NULL;
    }
    H5Sclose(space);
    if (!space_ok) {
        td_err_set(err, st, "tap file %s: %s: the dataset's dataspace does not match %s", p, where,
                   t->has_data ? "its shape attribute" : "has_data = 0 (expected a null dataspace)");
        goto out;
    }
    st = TD_OK;
    goto out;
h5fail:
    td_err_set(err, st, "tap file %s: %s: cannot inspect the dataset (%s)", p, where, td_taps_h5_last());
out:
    free(dtype);
    return st;
}

// listed: the name came from listing the group, so it exists (no lookup).
static int open_tap(const td_tapfile *f, hid_t g, const char *step, const char *name, int listed, hid_t *dset,
                    td_tap_info *info, int *le, td_err *err) {
    htri_t ex = 1;
    if (!name || !*name || strchr(name, '/') || (!listed && !H5OK(ex = H5Lexists(g, name, H5P_DEFAULT))) || !ex)
        return td_err_set(err, TD_EINPUT, "tap file %s: step %s has no tap '%s'", f->path, step,
                          name ? name : "(null)");
    if (!H5OK(*dset = H5Dopen2(g, name, H5P_DEFAULT)))
        return td_err_set(err, TD_EINPUT, "tap file %s: /steps/%s/%s is not a dataset (%s)", f->path, step, name,
                          td_taps_h5_last());
    int st = load_tap(f, *dset, step, name, info, le, err);
    if (st) H5Dclose(*dset);
    return st;
}

// H5Literate's callback type changed in 1.12 (H5L_info2_t); the names are
// all this needs.
#if H5_VERSION_GE(1, 12, 0)
typedef H5L_info2_t link_info;
#define LINK_ITERATE H5Literate2
#else
typedef H5L_info_t link_info;
#define LINK_ITERATE H5Literate
#endif
static herr_t collect_link(hid_t g, const char *name, const link_info *info, void *data) {
    (void)info;
    return collect_attr(g, name, NULL, data);
}

static int by_seq(const void *a, const void *b) {
    const td_tap_info *x = a, *y = b;
    return (x->seq > y->seq) - (x->seq < y->seq);
}

static int locate(hid_t dset, cat_tap *ct, uint64_t file_size, int le);

static int ct_by_seq(const void *a, const void *b) {
    return by_seq(&((const cat_tap *)a)->info, &((const cat_tap *)b)->info);
}

// The taps of a step through HDF5, checked and sorted by seq; the step's
// group stays open in the step cache. file_size > 0 (the check): also where
// each tap's values lie, found while its dataset is open.
static int list_step(const td_tapfile *f, int64_t step, uint64_t file_size, cat_tap **out, int64_t *n,
                     td_err *err) {
    *out = NULL;
    *n = 0;
    char name[32];
    hid_t g;
    int st = open_step(f, step, &g, name, err);
    if (st) return st;
    td_step_info si;
    if ((st = td_tapfile_step(f, step, &si, err))) {
        H5Gclose(g);
        return st;
    }
    name_list l = {0};
    cat_tap *t = NULL;
    if (!H5OK(LINK_ITERATE(g, H5_INDEX_NAME, H5_ITER_INC, NULL, collect_link, &l))) {
        st = td_err_set(err, TD_EINPUT, "tap file %s: cannot list /steps/%s (%s)", f->path, name, td_taps_h5_last());
        goto out;
    }
    if (l.n != si.n_taps) {
        st = td_err_set(err, TD_EINPUT, "tap file %s: /steps/%s: n_taps is %" PRId64 " but the group holds %d members",
                        f->path, name, si.n_taps, l.n);
        goto out;
    }
    t = td_xcalloc(l.n ? (size_t)l.n : 1, sizeof *t);
    for (int i = 0; i < l.n; i++) {
        hid_t dset;
        int le = 0;
        if ((st = open_tap(f, g, name, l.names[i], 1, &dset, &t[i].info, &le, err))) goto out;
        t[i].raw_off = -1;
        if (file_size && t[i].info.has_data && t[i].info.count)
            t[i].contiguous = locate(dset, &t[i], file_size, le);
        H5Dclose(dset);
    }
    qsort(t, (size_t)l.n, sizeof *t, ct_by_seq);
    for (int i = 1; i < l.n; i++)
        if (t[i].info.seq == t[i - 1].info.seq) {
            st = td_err_set(err, TD_EINPUT, "tap file %s: /steps/%s: taps '%s' and '%s' share seq %" PRId64, f->path,
                            name, t[i - 1].info.name, t[i].info.name, t[i].info.seq);
            goto out;
        }
    cache_drop(f->sc);
    f->sc->taps = td_xmalloc(sizeof *f->sc->taps * (size_t)(l.n ? l.n : 1));
    for (int i = 0; i < l.n; i++) f->sc->taps[i] = t[i].info;
    qsort(f->sc->taps, (size_t)l.n, sizeof *f->sc->taps, by_name);
    f->sc->n = l.n;
    f->sc->step = step;
    f->sc->g = g;
    g = H5I_INVALID_HID;
    *out = t;
    *n = l.n;
    t = NULL;
out:
    free(t);
    td_tapfile_free_names(l.names, l.n);
    if (g >= 0) H5Gclose(g);
    return st;
}

int td_tapfile_step_taps(const td_tapfile *f, int64_t step, td_tap_info **taps, int64_t *n, td_err *err) {
    *taps = NULL;
    *n = 0;
    cat_tap *ct = NULL;
    int st;
    if (f->cat) {
        if ((st = step_range(f, step, err)) || (st = cat_load(f, step, err))) return st;
        ct = f->cat->taps;
        *n = f->cat->n;
    } else if ((st = list_step(f, step, 0, &ct, n, err))) {
        return st;
    }
    td_tap_info *t = td_xmalloc(sizeof *t * (size_t)(*n ? *n : 1));
    for (int64_t i = 0; i < *n; i++) t[i] = ct[i].info;
    if (!f->cat) free(ct);
    *taps = t;
    return TD_OK;
}

int td_tapfile_tap(const td_tapfile *f, int64_t step, const char *name, td_tap_info *info, td_err *err) {
    if (f->cat) {
        const cat_tap *ct;
        int st = cat_find(f, step, name, &ct, err);
        if (!st) *info = ct->info;
        return st;
    }
    char sname[32];
    hid_t g, dset;
    int st = open_step(f, step, &g, sname, err);
    if (st) return st;
    if (!(st = open_tap(f, g, sname, name, 0, &dset, info, NULL, err))) H5Dclose(dset);
    H5Gclose(g);
    return st;
}

/* ------------------------------------------------------------------ data */

#define ALL_ROWS INT64_MIN

// n values of a raw tap from value `first` on, as double or int64 (as_int),
// each exactly as HDF5 converts it (a C cast). The stored bytes are read
// into the tail of dst and widened in place from the front: value i is
// loaded before its 8 bytes are written, and those end at or before where
// value i + 1 starts. -1 with errno (0: the file ends early).
static int raw_read(int fd, int64_t off, td_dtype dt, uint64_t first, uint64_t n, void *dst, int as_int) {
    const size_t es = td_dtype_size(dt);
    unsigned char *out = dst, *in = out + n * (8 - es);
    if (pread_all(fd, in, n * es, (uint64_t)off + first * es)) return -1;
    switch (dt) {
    case TD_DT_F64:
    case TD_DT_I64:
        if (dt == TD_DT_I64 && !as_int)
            for (uint64_t i = 0; i < n; i++) {
                int64_t v;
                memcpy(&v, in + 8 * i, 8);
                double d = (double)v;
                memcpy(out + 8 * i, &d, 8);
            }
        break;
    case TD_DT_F32:
        for (uint64_t i = 0; i < n; i++) {
            float v;
            memcpy(&v, in + 4 * i, 4);
            double d = v;
            memcpy(out + 8 * i, &d, 8);
        }
        break;
    case TD_DT_F16:
    case TD_DT_BF16:
        for (uint64_t i = 0; i < n; i++) {
            uint16_t v;
            memcpy(&v, in + 2 * i, 2);
            double d = dt == TD_DT_F16 ? td_taps_f16_to_f64(v) : td_taps_bf16_to_f64(v);
            memcpy(out + 8 * i, &d, 8);
        }
        break;
    case TD_DT_I32:
        for (uint64_t i = 0; i < n; i++) {
            int32_t v;
            memcpy(&v, in + 4 * i, 4);
            if (as_int) {
                int64_t w = v;
                memcpy(out + 8 * i, &w, 8);
            } else {
                double d = v;
                memcpy(out + 8 * i, &d, 8);
            }
        }
        break;
    }
    return 0;
}

// Opens a tap to read its rows: a chunk larger than HDF5's default chunk
// cache (1 MiB; h5repack makes one chunk of a whole tap) would otherwise be
// decompressed again for every row block read from it. Up to 64 MiB per
// chunk; beyond that, memory wins.
#define ROWS_CHUNK_CACHE_MAX ((size_t)64 << 20)
static hid_t open_for_rows(hid_t g, const char *name) {
    hid_t d = H5Dopen2(g, name, H5P_DEFAULT);
    if (d < 0) return d;
    hid_t dcpl = H5Dget_create_plist(d), type = H5Dget_type(d);
    size_t bytes = 0;
    if (dcpl >= 0 && type >= 0 && H5Pget_layout(dcpl) == H5D_CHUNKED) {
        hsize_t cd[H5S_MAX_RANK];
        int rank = H5Pget_chunk(dcpl, H5S_MAX_RANK, cd);
        bytes = H5Tget_size(type);
        for (int i = 0; i < rank && bytes; i++)
            bytes = cd[i] && bytes <= ROWS_CHUNK_CACHE_MAX / cd[i] ? bytes * (size_t)cd[i] : 0;
    }
    if (type >= 0) H5Tclose(type);
    if (dcpl >= 0) H5Pclose(dcpl);
    if (bytes > ((size_t)1 << 20) && bytes <= ROWS_CHUNK_CACHE_MAX) {
        hid_t dapl = H5Pcreate(H5P_DATASET_ACCESS);
        if (dapl >= 0 && H5Pset_chunk_cache(dapl, H5D_CHUNK_CACHE_NSLOTS_DEFAULT, bytes, 1.0) >= 0) {
            hid_t d2 = H5Dopen2(g, name, dapl);
            if (d2 >= 0) {
                H5Dclose(d);
                d = d2;
            }
        }
        if (dapl >= 0) H5Pclose(dapl);
    }
    H5Eclear2(H5E_DEFAULT);
    return d;
}

// Rows [row0, row0 + n_rows) of the outermost dimension (n_rows = ALL_ROWS:
// all of them) into dst, as double (as_int = 0) or int64 (as_int = 1).
static int read_rows(const td_tapfile *f, int64_t step, const char *name, int64_t row0, int64_t n_rows, void *dst,
                     uint64_t count, int as_int, td_err *err) {
    char sname[32];
    hid_t g = H5I_INVALID_HID, dset = H5I_INVALID_HID;
    td_tap_info t;
    int64_t raw_off = -1;
    int st, own_g = 1, own_dset = 1;
    const td_tap_info *known = name && !f->cat ? cache_find(f->sc, step, name) : NULL;
    if (f->cat) {
        // the dataset is opened below only if its values need HDF5
        const cat_tap *ct;
        if ((st = cat_find(f, step, name, &ct, err))) return st;
        step_name(sname, step);
        own_g = 0;
        t = ct->info;
        raw_off = ct->raw_off;
    } else if (known) {
        step_name(sname, step);
        g = f->sc->g;
        own_g = 0;
        t = *known;
        if (f->sc->dset < 0 || strcmp(f->sc->dname, name) != 0) {
            if (f->sc->dset >= 0) H5Dclose(f->sc->dset);
            f->sc->dset = open_for_rows(g, name);
            snprintf(f->sc->dname, sizeof f->sc->dname, "%s", name);
        }
        if (!H5OK(dset = f->sc->dset))
            return td_err_set(err, TD_EINPUT, "tap file %s: /steps/%s/%s is not a dataset (%s)", f->path, sname, name,
                              td_taps_h5_last());
        own_dset = 0;
    } else {
        if ((st = open_step(f, step, &g, sname, err))) return st;
        if ((st = open_tap(f, g, sname, name, 0, &dset, &t, NULL, err))) {
            H5Gclose(g);
            return st;
        }
    }
    st = TD_EINPUT;
    hid_t fspace = H5I_INVALID_HID, mspace = H5I_INVALID_HID;
    uint16_t *bits = NULL;
    if (!t.has_data) {
        td_err_set(err, st, "tap file %s: step %s: tap '%s' has no data (fingerprint only)", f->path, sname, name);
        goto out;
    }
    if (as_int && !td_dtype_is_int(t.dtype)) {
        td_err_set(err, st, "tap file %s: step %s: tap '%s' is %s, not an integer tap", f->path, sname, name,
                   td_dtype_name(t.dtype));
        goto out;
    }
    if (n_rows == ALL_ROWS) n_rows = t.shape[0];
    if (row0 < 0 || n_rows < 0 || row0 > t.shape[0] || n_rows > t.shape[0] - row0) {
        td_err_set(err, st, "tap file %s: step %s: tap '%s': rows %" PRId64 "..%" PRId64 " requested, it has %" PRId64,
                   f->path, sname, name, row0, row0 + n_rows, t.shape[0]);
        goto out;
    }
    uint64_t inner = 1;
    for (int d = 1; d < t.ndim; d++) inner *= (uint64_t)t.shape[d];
    uint64_t want = (uint64_t)n_rows * inner;
    if (count != want) {
        td_err_set(err, st, "tap file %s: step %s: tap '%s': %" PRIu64 " values requested, %" PRId64 " rows hold %" PRIu64,
                   f->path, sname, name, count, n_rows, want);
        goto out;
    }
    if (want == 0) {
        st = TD_OK;
        goto out;
    }
    if (raw_off >= 0) {
        if (raw_read(f->cat->raw, raw_off, t.dtype, (uint64_t)row0 * inner, want, dst, as_int) == 0) {
            f->cat->raw_values += want;
            st = TD_OK;
        } else {
            td_err_set(err, st, "tap file %s: step %s: cannot read tap '%s' (%s)", f->path, sname, name,
                       errno ? strerror(errno) : "the file ends before its values");
        }
        goto out;
    }
    if (dset < 0) {
        // Catalog, not raw: the step's group stays open for its next reads.
        if (f->sc->step != step) {
            cache_drop(f->sc);
            if ((st = open_step(f, step, &f->sc->g, sname, err))) goto out;
            f->sc->step = step;
            st = TD_EINPUT;
        }
        g = f->sc->g;
        if (f->sc->dset < 0 || strcmp(f->sc->dname, name) != 0) {
            if (f->sc->dset >= 0) H5Dclose(f->sc->dset);
            f->sc->dset = open_for_rows(g, name);
            snprintf(f->sc->dname, sizeof f->sc->dname, "%s", name);
        }
        if (!H5OK(dset = f->sc->dset)) {
            td_err_set(err, st, "tap file %s: /steps/%s/%s is not a dataset (%s)", f->path, sname, name,
                       td_taps_h5_last());
            goto out;
        }
        own_dset = 0;
    }
    hsize_t start[TD_TAP_MAX_DIMS] = {0}, cnt[TD_TAP_MAX_DIMS];
    for (int d = 0; d < t.ndim; d++) cnt[d] = (hsize_t)t.shape[d];
    start[0] = (hsize_t)row0;
    cnt[0] = (hsize_t)n_rows;
    // The memory space has the selection's shape: with another rank HDF5
    // maps every element to its chunk one by one (H5S_select_iterate), which
    // cost more than the decompression.
    if (!H5OK(fspace = H5Dget_space(dset)) ||
        !H5OK(H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, NULL, cnt, NULL)) ||
        !H5OK(mspace = H5Screate_simple(t.ndim, cnt, NULL)))
        goto h5fail;
    if (t.dtype == TD_DT_F16 || t.dtype == TD_DT_BF16) {
        bits = td_xmalloc(want * sizeof *bits);
        if (!H5OK(H5Dread(dset, H5T_NATIVE_UINT16, mspace, fspace, H5P_DEFAULT, bits))) goto h5fail;
        double *out = dst;
        for (uint64_t i = 0; i < want; i++)
            out[i] = t.dtype == TD_DT_F16 ? td_taps_f16_to_f64(bits[i]) : td_taps_bf16_to_f64(bits[i]);
    } else if (t.dtype == TD_DT_F32 && !as_int) {
        // read as stored and widened here (exact): converting, HDF5 zeroes a
        // 1 MiB conversion buffer per read, 10% of a compare
        float *fl = td_xmalloc(want * sizeof *fl);
        int ok = H5OK(H5Dread(dset, H5T_NATIVE_FLOAT, mspace, fspace, H5P_DEFAULT, fl));
        double *out = dst;
        if (ok)
            for (uint64_t i = 0; i < want; i++) out[i] = fl[i];
        free(fl);
        if (!ok) goto h5fail;
    } else if (!H5OK(H5Dread(dset, as_int ? H5T_NATIVE_INT64 : H5T_NATIVE_DOUBLE, mspace, fspace, H5P_DEFAULT, dst))) {
        goto h5fail;
    }
    st = TD_OK;
    goto out;
h5fail:
    td_err_set(err, st, "tap file %s: step %s: cannot read tap '%s' (%s)", f->path, sname, name, td_taps_h5_last());
out:
    free(bits);
    if (mspace >= 0) H5Sclose(mspace);
    if (fspace >= 0) H5Sclose(fspace);
    if (own_dset && dset >= 0) H5Dclose(dset);
    if (own_g && g >= 0) H5Gclose(g);
    return st;
}

int td_tapfile_read_f64(const td_tapfile *f, int64_t step, const char *name, double *dst, uint64_t count,
                        td_err *err) {
    return read_rows(f, step, name, 0, ALL_ROWS, dst, count, 0, err);
}

int td_tapfile_read_rows_f64(const td_tapfile *f, int64_t step, const char *name, int64_t row0, int64_t n_rows,
                             double *dst, uint64_t count, td_err *err) {
    if (n_rows == ALL_ROWS) n_rows = -1; // a negative count is an error here, not "all"
    return read_rows(f, step, name, row0, n_rows, dst, count, 0, err);
}

int td_tapfile_read_i64(const td_tapfile *f, int64_t step, const char *name, int64_t *dst, uint64_t count,
                        td_err *err) {
    return read_rows(f, step, name, 0, ALL_ROWS, dst, count, 1, err);
}

/* ----------------------------------------------------------------- check */

// Values read per H5Dread while checking: bounded memory whatever the tap.
#define CHECK_CHUNK_VALUES ((uint64_t)1 << 20)

// Whether reading the tap's data is safe without reading it here first: it is
// stored contiguous, in this file (no external file list), as exactly the
// bytes its shape needs, inside the file. Such a read is one copy of a byte
// range HDF5 bounds-checks; what can crash the library (B-tree chunk indexes,
// filters on hostile bytes) sits only in chunked or compact storage, which
// the checker still reads in full. So the common file (tapdiff run writes its
// taps stored and contiguous) has its data read once, by the verb. Sets
// ct->raw_off where the reader can take the bytes without HDF5 (le: load_tap
// found them stored as little-endian numbers of the checked class and size).
//
// Without the dataset's creation property list (a copy of every property,
// more than a tenth of the check's time per tap): only contiguous storage
// has an offset (HDF5 gives none for chunked, compact or virtual storage),
// and an external file list is a message of the object header, which is
// refused whatever it holds (the property list counted its entries).
#define EFL_MESSAGE 0x0007 // HDF5 file format, "External Data Files Message"
static int locate(hid_t dset, cat_tap *ct, uint64_t file_size, int le) {
    const td_tap_info *t = &ct->info;
    int ok = 0;
    haddr_t off = H5Dget_offset(dset);
    hsize_t size = H5Dget_storage_size(dset);
    if (off != HADDR_UNDEF && size == t->count * td_dtype_size(t->dtype) && off <= file_size &&
        size <= file_size - off) {
#if H5_VERSION_GE(1, 12, 0)
        H5O_native_info_t oi;
        ok = H5OK(H5Oget_native_info(dset, &oi, H5O_NATIVE_INFO_HDR)) &&
             !(oi.hdr.mesg.present & ((uint64_t)1 << EFL_MESSAGE));
#else
        H5O_info_t oi;
        ok = H5OK(H5Oget_info2(dset, &oi, H5O_INFO_HDR)) && !(oi.hdr.mesg.present & ((uint64_t)1 << EFL_MESSAGE));
#endif
    }
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (ok && le) ct->raw_off = (int64_t)off;
#else
    (void)le;
#endif
    if (!ok) H5Eclear2(H5E_DEFAULT); // what a refused layout left on the error stack
    return ok;
}

int td_tapfile_check(const td_tapfile *f, td_err *err) {
    return check_file(f, -1, err);
}

// The check; with cat_fd >= 0 it also writes the catalog there (a failed
// write only leaves the catalog without its end: the reader then drops it).
static int check_file(const td_tapfile *f, int cat_fd, td_err *err) {
    // Verbs read root attributes outside the schema by name (a golden's
    // calibrations, provenance): each is read here first, so one whose stored
    // length is corrupt stops the checker rather than the verb. One that reads
    // back as an error is the verb's to report.
    char **names = NULL;
    int n_names = 0;
    if (td_tapfile_attr_names(f, &names, &n_names, err)) return TD_EINPUT;
    for (int i = 0; i < n_names; i++) {
        char *v = NULL;
        td_err ignored;
        if (td_tapfile_attr_str(f, names[i], &v, &ignored) == TD_OK) free(v);
    }
    td_tapfile_free_names(names, n_names);
    struct stat sb;
    int have_sb = stat(f->path, &sb) == 0;
    uint64_t file_size = have_sb ? (uint64_t)sb.st_size : 0;
    int cat_ok = cat_fd >= 0 && have_sb;
    uint64_t cat_off = 0;
    int64_t last_pos0 = -1, last_seq = INT64_MIN;
    double *buf = td_xmalloc(CHECK_CHUNK_VALUES * sizeof *buf);
    int st = TD_OK;
    for (int64_t s = 0; s < f->n_steps && !st; s++) {
        td_step_info si;
        if ((st = td_tapfile_step(f, s, &si, err))) break;
        if (s > 0 && si.pos0 <= last_pos0) {
            st = td_err_set(err, TD_EINPUT,
                            "tap file %s: step %06" PRId64 " starts at position %" PRId64 ", not after the step "
                            "before it (position %" PRId64 "): steps reordered or duplicated",
                            f->path, s, si.pos0, last_pos0);
            break;
        }
        last_pos0 = si.pos0;
        cat_tap *ct = NULL;
        int64_t n = 0;
        if ((st = list_step(f, s, file_size, &ct, &n, err))) break;
        if (n > 0 && ct[0].info.seq <= last_seq)
            st = td_err_set(err, TD_EINPUT,
                            "tap file %s: step %06" PRId64 ": tap '%s' has seq %" PRId64 ", not after the previous "
                            "step's last seq %" PRId64 " (steps reordered or duplicated)",
                            f->path, s, ct[0].info.name, ct[0].info.seq, last_seq);
        if (n > 0) last_seq = ct[n - 1].info.seq;
        for (int64_t i = 0; i < n && !st; i++) {
            const td_tap_info *t = &ct[i].info;
            if (!t->has_data || t->count == 0 || ct[i].contiguous) continue;
            uint64_t inner = t->count / (uint64_t)t->shape[0];
            int64_t rows = inner >= CHECK_CHUNK_VALUES ? 1 : (int64_t)(CHECK_CHUNK_VALUES / inner);
            if (inner > CHECK_CHUNK_VALUES) {
                // One row bigger than the buffer: no honest tap is (rows are
                // at most a vocabulary wide).
                st = td_err_set(err, TD_EINPUT, "tap file %s: step %06" PRId64 ": tap '%s' has rows of %" PRIu64
                                " values (more than %" PRIu64 ")", f->path, s, t->name, inner, CHECK_CHUNK_VALUES);
                break;
            }
            for (int64_t r = 0; r < t->shape[0] && !st; r += rows) {
                int64_t nr = t->shape[0] - r < rows ? t->shape[0] - r : rows;
                st = td_tapfile_read_rows_f64(f, s, t->name, r, nr, buf, (uint64_t)nr * inner, err);
            }
        }
        if (!st && cat_ok) {
            cat_step h;
            memset(&h, 0, sizeof h);
            h.magic = CAT_STEP_MAGIC;
            h.index = s;
            h.si = si;
            h.n = n;
            cat_ok = pwrite_all(cat_fd, &h, sizeof h, cat_off) == 0 &&
                     pwrite_all(cat_fd, ct, sizeof *ct * (size_t)n, cat_off + sizeof h) == 0;
            cat_off += sizeof h + sizeof *ct * (size_t)n;
        }
        free(ct);
    }
    if (!st && cat_ok) {
        cat_end e;
        memset(&e, 0, sizeof e);
        e.magic = CAT_END_MAGIC;
        e.n_steps = f->n_steps;
        e.dev = (uint64_t)sb.st_dev;
        e.ino = (uint64_t)sb.st_ino;
        e.size = (uint64_t)sb.st_size;
        e.mtime_s = (int64_t)sb.st_mtim.tv_sec;
        e.mtime_ns = (int64_t)sb.st_mtim.tv_nsec;
        pwrite_all(cat_fd, &e, sizeof e, cat_off);
    }
    free(buf);
    return st;
}
