/* tapdiff tap-file reader: streaming access to the HDF5 files written through
 * tap.h, for compare/localize/audit/inspect. Nothing here loads a whole file:
 * step and tap metadata are read on demand, data one tap (or a row range of
 * one tap) at a time into the caller's buffer.
 *
 * ---- Tap file schema, format "tapdiff-taps" version 1 ----------------------
 * HDF5, written with the 1.8-compatible file format (superblock v1, old-style
 * groups): readable by HDF5 >= 1.8, h5py, h5dump. Strings are variable-length
 * UTF-8 scalar attributes (h5py reads them as str). Integers little-endian.
 *
 * /                       root attributes:
 *     format          str    "tapdiff-taps"
 *     format_version  int32  1
 *     created         str    ISO-8601 UTC, "2025-01-31T12:00:00Z"
 *     tap_mode        str    "full" | "fingerprint"
 *     tap_filter      str    the filter as given ("" = every tap)
 *     ...                    whatever the writer added (td_tap_sink_attr_*):
 *                            the runner adds model, model_sha256, arch,
 *                            backend, backend_version, precision, threads,
 *                            tapdiff_version, git_revision, command_line
 * /steps                  group; one member per step, nothing else
 * /steps/NNNNNN           group, NNNNNN = step index from 0, 6 digits (more
 *                         past 999999); attributes:
 *     kind      str    "prefill" | "decode"
 *     pos0      int64  position of the step's first token
 *     n_tokens  int64  tokens this step consumed
 *     n_taps    int64  datasets in this group (final at step_end)
 *     complete  int32  0 while being written, 1 once step_end returned.
 *                      Readers ignore a trailing step with complete = 0.
 * /steps/NNNNNN/<tap>     one dataset per tap, named by the full tap name
 *                         ("blk.0.attn_q", "out.logits"); attributes:
 *     seq       int64    execution order, strictly increasing across the file
 *     layer     int32    block index, -1 for a global tap
 *     dtype     str      native dtype: "f64" "f32" "f16" "bf16" "i32" "i64"
 *     shape     int64[ndim]  row-major, outermost first ([T, E])
 *     has_data  int32    1: the dataset holds the values; 0: fingerprint only
 *     fp_count, fp_nonfinite, fp_nonzero        uint64
 *     fp_min, fp_max, fp_maxabs, fp_sum, fp_sumabs, fp_sumsq   float64
 *                        over finite values; min/max/maxabs NaN if none
 *     fp_first  float64[4]  first values as they are, NaN-padded
 *   data (has_data = 1): dims = shape, stored in the native dtype: f64/f32 as
 *     IEEE floats, i32/i64 as integers, f16 and bf16 as uint16 bit patterns
 *     (the dtype attribute says which: numpy .view(np.float16), or
 *     (u16.astype(np.uint32) << 16).view(np.float32) for bf16). Datasets over
 *     4 KiB are chunked (~256 KiB chunks of whole rows) with shuffle + deflate
 *     (level = the writer's compress option; 0 = contiguous).
 *   no data (has_data = 0: fingerprint mode, or a tap the filter did not
 *     select in full mode): an H5S_NULL dataset of the native file type
 *     (h5py: shape None); every attribute above is present.
 *
 * Crash safety: the writer creates the file under a temporary name
 * ("F.tmp.XXXXXX") and renames it to F once it is a valid tap file with no
 * step; it commits the file (flush, close, reopen) at every step_end and
 * keeps HDF5's metadata cache from writing anything between two commits, so
 * a process killed at any point leaves at F either nothing new or exactly
 * the steps whose step_end returned (raw bytes of the unfinished step may
 * trail the file unreferenced; HDF5 ignores them). A write error (disk full)
 * is TD_EOUTPUT at the failing step; room for a commit is reserved before it
 * starts, and after an error nothing more reaches the file, so the committed
 * steps stay readable.
 * ---------------------------------------------------------------------------
 */
#ifndef TD_TAPFILE_H
#define TD_TAPFILE_H

#include <stdint.h>

#include "tap.h"
#include "td_common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TD_TAPFILE_FORMAT "tapdiff-taps"
#define TD_TAPFILE_VERSION 1

/* "f64" "f32" "f16" "bf16" "i32" "i64"; NULL for an unknown value. */
const char *td_dtype_name(td_dtype dt);
/* Parses a dtype name; returns 0 and sets *dt, or -1. */
int td_dtype_from_name(const char *name, td_dtype *dt);
/* Bytes per element of the native dtype (8, 4, 2, 2, 4, 8); 0 if unknown. */
size_t td_dtype_size(td_dtype dt);
/* 1 for i32/i64. */
int td_dtype_is_int(td_dtype dt);

typedef struct td_tapfile td_tapfile;

typedef struct td_step_info {
    int64_t index;
    td_step_kind kind;
    int64_t pos0;
    int64_t n_tokens;
    int64_t n_taps;
} td_step_info;

typedef struct td_tap_info {
    char name[TD_TAP_NAME_MAX]; /* full name, "blk.0.attn_q" */
    int64_t seq;
    int32_t layer;              /* -1 = global */
    td_dtype dtype;             /* native dtype as emitted */
    int ndim;
    int64_t shape[TD_TAP_MAX_DIMS];
    uint64_t count;             /* product of shape */
    int has_data;
    td_fingerprint fp;
} td_tap_info;

/* Bounds on the counts of a step (larger is bad input, never an allocation):
 * positions and tokens per step up to 2^24, taps per step up to 2^20. */
#define TD_TAPFILE_MAX_POS (1 << 24)
#define TD_TAPFILE_MAX_TAPS (1 << 20)

/* Opens read-only. Before the file is trusted, a child process reads all of
 * it (td_tapfile_check: every attribute, every dataset not stored plainly
 * contiguous) so that a file that
 * makes the HDF5 library itself crash or loop (a corrupt length inside its
 * metadata) is reported as TD_EINPUT ("reading it crashed the HDF5 library")
 * instead of taking the caller down; TD_TAPFILE_INPROCESS=1 in the
 * environment skips the child (fuzzing, where the crash is the finding).
 * TD_EINPUT with one line naming the file for a missing or
 * non-HDF5 file, a file without format = "tapdiff-taps", another
 * format_version, or a damaged step list. A trailing step with complete = 0
 * (the writer stopped during it) is not counted and is reported by
 * td_tapfile_note, not as an error.
 * The check hands what it read to the reader through an unnamed temporary
 * file (the catalog: every step's and tap's checked attributes, and where
 * the values of a tap stored contiguous as little-endian numbers lie), so
 * listing steps and taps asks HDF5 nothing more and such values are read
 * with pread; the reader holds one step of it in memory. Without a
 * temporary file everything is read through HDF5 as before. A file that is
 * not the one the check read (another inode, size or mtime) is TD_EINPUT. */
int td_tapfile_open(td_tapfile **out, const char *path, td_err *err);
void td_tapfile_close(td_tapfile *f); /* NULL is fine */
/* Opens n files into out[0..n-1] as n calls of td_tapfile_open in that order
 * would (same checks, the first failure in order is the one reported, and
 * then every out[i] is NULL), but with their checkers running at the same
 * time: the caller waits for the slowest check, not for their sum. */
int td_tapfile_open_all(td_tapfile **out, const char *const *paths, int n, td_err *err);

/* Validates the whole file in this process: every step's attributes (counts
 * in range; pos0 strictly increasing from step to step;
 * seq strictly increasing across the file), every tap's attributes and
 * storage, and reads every dataset but those stored contiguous inside the
 * file with exactly their shape's bytes (their reading cannot take the
 * library outside that range). TD_EINPUT with the first defect. */
int td_tapfile_check(const td_tapfile *f, td_err *err);

const char *td_tapfile_path(const td_tapfile *f);
/* Number of complete steps (0 .. n-1 readable). */
int64_t td_tapfile_n_steps(const td_tapfile *f);
/* "" or one line about what was ignored ("step 000003 is incomplete ..."). */
const char *td_tapfile_note(const td_tapfile *f);
/* Values read so far straight from the file's bytes (taps stored contiguous
 * as little-endian numbers, located by the check), not through HDF5: for
 * tests and benchmarks. */
uint64_t td_tapfile_raw_values(const td_tapfile *f);

/* Sets root attribute `key` of the closed tap file at path: a UTF-8 string
 * (str != NULL) or a float64 (*num). Replaces an existing one. */
int td_tapfile_attr_put(const char *path, const char *key, const char *str, const double *num, td_err *err);
/* Root attribute `key` as text, td_xmalloc'd (caller frees): strings as they
 * are, integers in decimal, floats with %.17g, 1-D arrays comma-separated.
 * TD_EINPUT if absent. */
int td_tapfile_attr_str(const td_tapfile *f, const char *key, char **out, td_err *err);
/* Names of every root attribute in name order; *names is an array of *n
 * td_xmalloc'd strings; release with td_tapfile_free_names. */
int td_tapfile_attr_names(const td_tapfile *f, char ***names, int *n, td_err *err);
void td_tapfile_free_names(char **names, int n);

/* Step `step` (0 <= step < n_steps). */
int td_tapfile_step(const td_tapfile *f, int64_t step, td_step_info *info, td_err *err);
/* Every tap of a step sorted by seq (execution order); *taps is td_xmalloc'd
 * (free() it), *n its length (= the step's n_taps). */
int td_tapfile_step_taps(const td_tapfile *f, int64_t step, td_tap_info **taps, int64_t *n, td_err *err);
/* One tap by full name. TD_EINPUT if the step has no such tap. */
int td_tapfile_tap(const td_tapfile *f, int64_t step, const char *name, td_tap_info *info, td_err *err);

/* The whole tap as doubles (exact for every dtype but i64 beyond 2^53).
 * `count` must equal the tap's count; TD_EINPUT if it does not, if the tap
 * is missing or has no data. */
int td_tapfile_read_f64(const td_tapfile *f, int64_t step, const char *name, double *dst, uint64_t count,
                        td_err *err);
/* Rows [row0, row0 + n_rows) of the outermost dimension, for streaming large
 * taps; `count` must equal n_rows * (product of the other dims). */
int td_tapfile_read_rows_f64(const td_tapfile *f, int64_t step, const char *name, int64_t row0, int64_t n_rows,
                             double *dst, uint64_t count, td_err *err);
/* The whole tap as int64; integer taps (i32/i64) only, else TD_EINPUT. */
int td_tapfile_read_i64(const td_tapfile *f, int64_t step, const char *name, int64_t *dst, uint64_t count,
                        td_err *err);

#ifdef __cplusplus
}
#endif
#endif
