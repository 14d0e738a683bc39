/* tapdiff tap emit API: the one header an engine includes (C or C++) to
 * report named intermediate tensors of its forward into an HDF5 tap file.
 *
 *   td_tap_sink *s = NULL;                  // NULL = taps off
 *   td_tap_options o = td_tap_options_default();
 *   o.mode = TD_TAP_FULL;
 *   td_tap_sink_open(&s, "run.h5", &o, &err);
 *   td_tap_sink_attr_str(s, "backend", "myengine");
 *   td_tap_step_begin(s, TD_STEP_PREFILL, pos0, n_tokens, &err);
 *   TD_TAP(s, 0, "attn_norm", TD_DT_F32, x, 2, shape);   // -> blk.0.attn_norm
 *   td_tap_step_end(s, &err);               // the step before it is durable on disk
 *   td_tap_sink_close(s, &err);
 *
 * When taps are off (sink == NULL) each TD_TAP site costs one predictable
 * branch: nothing else is evaluated. Names: layer >= 0 gives "blk.<layer>.<name>",
 * layer < 0 gives "<name>" as is (inp.tokens, out.logits, ...).
 * Shapes are row-major, outermost first ([T, E] = T rows of E values). */
#ifndef TD_TAP_H
#define TD_TAP_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The installed library (libtapdiff-taps, `pkg-config tapdiff-taps`) exports
 * exactly the functions marked TD_TAP_API; its ABI is C and versioned by the
 * soname (libtapdiff-taps.so.TD_TAP_ABI_VERSION). */
#define TD_TAP_ABI_VERSION 1
#if defined(__GNUC__) || defined(__clang__)
#define TD_TAP_API __attribute__((visibility("default")))
#else
#define TD_TAP_API
#endif

#ifndef TD_ERR_DEFINED
#define TD_ERR_DEFINED
/* also declared, identically, by taps/tap.h */
typedef struct td_err {
    char msg[1024];
} td_err;
#endif

typedef enum td_dtype {
    TD_DT_F64 = 0,
    TD_DT_F32 = 1,
    TD_DT_F16 = 2,  /* uint16 IEEE half bits */
    TD_DT_BF16 = 3, /* uint16 bfloat16 bits */
    TD_DT_I32 = 4,
    TD_DT_I64 = 5,
} td_dtype;

typedef enum td_tap_mode {
    TD_TAP_FINGERPRINT = 1, /* fingerprints only, no data */
    TD_TAP_FULL = 2,        /* fingerprints and data */
} td_tap_mode;

typedef enum td_step_kind {
    TD_STEP_PREFILL = 0,
    TD_STEP_DECODE = 1,
} td_step_kind;

#define TD_TAP_MAX_DIMS 4
/* Longest full tap name, including the terminating NUL ("blk.12.attn_q" is 14). */
#define TD_TAP_NAME_MAX 128

/* A summary, not a hash: separates wrong (zero, saturated, NaN, another
 * tensor) from last-bits different. Values are taken exactly as doubles
 * (f16/bf16/f32 exactly; i64 beyond 2^53 rounded). min/max/max_abs/sums are
 * over the finite values only, accumulated in index order in double; when
 * there is no finite value min = max = max_abs = NaN and the sums are 0.
 * n_nonzero counts every value that is not +-0, non-finite ones included.
 * first[] holds the raw values (NaN/inf as they are). */
typedef struct td_fingerprint {
    uint64_t count;
    uint64_t n_nonfinite;
    uint64_t n_nonzero;
    double min, max, max_abs;
    double sum, sum_abs, sum_sq;
    double first[4]; /* first min(4, count) values; NaN-padded */
} td_fingerprint;

typedef struct td_tap_options {
    td_tap_mode mode;
    /* Which taps carry data in full mode: comma-separated fnmatch(3) globs
     * over full tap names ("blk.*.attn_*,out.*"; '*' also matches '.';
     * blanks around an item are ignored, empty items too). NULL, "" or only
     * empty items = every tap. EVERY emitted tap is still recorded (dataset,
     * seq, fingerprint) whatever the filter says: a tap that does not match
     * is stored fingerprint-only (has_data = 0), exactly as in fingerprint
     * mode, so execution order and fingerprints stay complete. In fingerprint
     * mode the filter changes nothing (it is still recorded in tap_filter). */
    const char *filter;
    int compress; /* deflate level 0..9 for full data; default 4; 0 = stored
                     contiguous, uncompressed */
} td_tap_options;

typedef struct td_tap_sink td_tap_sink;

/* mode = TD_TAP_FULL, filter = NULL (every tap), compress = 4. */
TD_TAP_API td_tap_options td_tap_options_default(void);

/* Creates (truncates) the file; opt NULL = defaults. Returns 0 or a non-zero
 * status (3 bad input, 99 I/O) with a message in err.
 * Every function below accepts sink == NULL (taps off) and then does nothing
 * and returns 0. A sink is used from one thread (the engine's). By default
 * the sink runs a writer thread of its own that does all of its HDF5 work
 * beside the engine (the engine's thread checks each call, fingerprints and
 * copies the values to keep, at most 64 MiB queued); TAPDIFF_TAP_THREAD=0 in
 * the environment at open writes on the engine's thread instead (the same
 * file). HDF5 is not thread-safe: an engine that calls HDF5 itself either
 * has an HDF5 file open when it opens the sink (then no thread is started)
 * or sets TAPDIFF_TAP_THREAD=0. Do not fork() while a sink is open. */
TD_TAP_API int td_tap_sink_open(td_tap_sink **out, const char *path, const td_tap_options *opt, td_err *err);
/* Root attributes (provenance), scalar; a key set twice keeps the last value.
 * The keys written by the sink itself (format, format_version, created,
 * tap_mode, tap_filter) are refused. Errors are sticky (see td_tap_emit) and
 * also returned. Best called before the first step; allowed at any time
 * (durable at the next step_end or close). */
TD_TAP_API int td_tap_sink_attr_str(td_tap_sink *s, const char *key, const char *value);
TD_TAP_API int td_tap_sink_attr_i64(td_tap_sink *s, const char *key, int64_t value);
TD_TAP_API int td_tap_sink_attr_f64(td_tap_sink *s, const char *key, double value);

/* ---- For an engine author ------------------------------------------------
 * Opens the sink the environment names (the external-arm contract of
 * `tapdiff bisect --b exec:PROGRAM`, README "Bring your own engine"):
 *   path     the argument, else $TAPDIFF_TAPS; neither (or "") = taps off:
 *            *out = NULL and 0 is returned, so every later call is a no-op;
 *   mode     $TAPDIFF_TAP_MODE "full" (default) or "fingerprint";
 *   filter   $TAPDIFF_TAP_FILTER (td_tap_options.filter);
 *   decode   $TAPDIFF_DECODE, recorded as the root attribute "decode".
 * Returns 0 or a status with a message (3 for a bad mode). */
TD_TAP_API int td_tap_sink_open_env(td_tap_sink **out, const char *path, td_err *err);

/* Provenance compare checks: model_sha256 (computed here from the file: two
 * arms of different model files are refused), model, arch ("llama", ...),
 * backend (the engine's name) and, when not NULL, backend_version and
 * precision ("f32", "f16", ...). Call once, before the first step. */
TD_TAP_API int td_tap_sink_provenance(td_tap_sink *s, const char *model_path, const char *arch,
                                      const char *backend, const char *backend_version, const char *precision,
                                      td_err *err);

/* Begins a step that consumes tokens[0..n) at positions pos[0..n) (pos NULL:
 * pos0, pos0+1, ... with pos0 = 0 for the first step, else the end of the
 * previous one) and emits the taps inp.tokens and inp.pos. The prefill is the
 * first step; later ones are decode steps. td_tap_step_end then also emits
 * hist.tokens (the last 16 ids consumed) unless the engine emitted it. */
TD_TAP_API int td_tap_step_begin_tokens(td_tap_sink *s, const int32_t *tokens, const int32_t *pos, int64_t n,
                                        td_err *err);

/* Steps are numbered from 0 in call order; pos0 >= 0, n_tokens >= 1. */
TD_TAP_API int td_tap_step_begin(td_tap_sink *s, td_step_kind kind, int64_t pos0, int64_t n_tokens, td_err *err);
/* Marks the step complete and commits the file. After it returns 0 every
 * earlier step survives a SIGKILL of the process; the step it ends does once
 * the next step_end or the close returns (with TAPDIFF_TAP_THREAD=0: once
 * this call returns). An error the writer thread met (a full disk) is
 * returned by the next call after it, with the message it would have had
 * without the thread. */
TD_TAP_API int td_tap_step_end(td_tap_sink *s, td_err *err);

/* Emits one tap of the current step. The data is read during the call only.
 * layer >= 0 names it "blk.<layer>.<name>", layer < 0 "<name>" (its layer
 * attribute is then parsed from a "blk.<N>." prefix, else -1). 1 <= ndim <=
 * TD_TAP_MAX_DIMS, dims >= 0, data may be NULL only for zero elements; the
 * full name is at most TD_TAP_NAME_MAX-1 bytes, has no '/' and is not ".".
 * A name emitted twice in one step is an error.
 * Errors are sticky: the first one is kept and returned by every later call
 * (step_begin/step_end/attr/close); after it nothing more is written, and
 * the file keeps the steps completed before it (an engine's forward need not
 * check every tap). */
TD_TAP_API void td_tap_emit(td_tap_sink *s, int layer, const char *name, td_dtype dtype, const void *data, int ndim, const int64_t *shape);

/* Closes and frees the sink (always, even on error). A step begun and not
 * ended stays in the file with complete = 0, which readers ignore; that is
 * not an error by itself (error paths close mid-step). Returns the sticky
 * error if any, else the status of closing the file. */
TD_TAP_API int td_tap_sink_close(td_tap_sink *s, td_err *err);

TD_TAP_API void td_fingerprint_compute(td_fingerprint *fp, td_dtype dtype, const void *data, uint64_t count);

/* ---- Device-aware taps ------------------------------------------------
 * A backend whose tensors live on a device (CUDA, Metal, Vulkan) asks, per
 * tap, what the sink will keep, and moves only that to the host:
 *
 *   switch (TD_TAP_WANT(sink, l, "attn_q")) {
 *   case TD_TAP_WANT_NONE: break;                      // taps off: one branch
 *   case TD_TAP_WANT_FINGERPRINT:                      // 80 bytes cross
 *       my_device_fingerprint(&fp, d_q, n);             // same definition as td_fingerprint
 *       td_tap_emit_fingerprint(sink, l, "attn_q", TD_DT_F32, &fp, 2, shape);
 *       break;
 *   case TD_TAP_WANT_FULL:                             // the data crosses
 *       copy_to_host(h_q, d_q, n);
 *       td_tap_emit(sink, l, "attn_q", TD_DT_F32, h_q, 2, shape);
 *   }
 *
 * FULL: the sink stores the values (full mode and the filter selects the
 * name); FINGERPRINT: it stores only a fingerprint (fingerprint mode, or not
 * selected); NONE: taps are off (sink NULL), the sink holds a sticky error,
 * or no step is open: emit nothing. A tap never changes what the arm
 * computes: the device must not synchronize or reorder work for a tap it
 * does not emit. */
typedef enum td_tap_want_level {
    TD_TAP_WANT_NONE = 0,
    TD_TAP_WANT_FINGERPRINT = 1,
    TD_TAP_WANT_FULL = 2,
} td_tap_want_level;

/* What the sink keeps of tap (layer, name) of the open step (names as in
 * td_tap_emit). Cheap (a filter match at most), no side effect. */
TD_TAP_API td_tap_want_level td_tap_want(const td_tap_sink *s, int layer, const char *name);

/* Emits one tap as a fingerprint computed by the caller (on its device):
 * stored exactly like a fingerprint-only tap (has_data = 0), with the same
 * checks as td_tap_emit; fp->count must equal the product of the shape.
 * The fingerprint's definition is td_fingerprint's: min/max/max_abs and the
 * sums over the finite values, first[] the first four values in row-major
 * order. A device may sum in another order than index order: its sums then
 * differ from the host's in the last bits, which is all a fingerprint may. */
TD_TAP_API void td_tap_emit_fingerprint(td_tap_sink *s, int layer, const char *name, td_dtype dtype,
                             const td_fingerprint *fp, int ndim, const int64_t *shape);

#if defined(__GNUC__) || defined(__clang__)
#define TD_TAP_UNLIKELY_(c) __builtin_expect(!!(c), 0)
#else
#define TD_TAP_UNLIKELY_(c) (c)
#endif
/* Taps off (sink == NULL): one branch, no argument but `sink` is evaluated. */
#define TD_TAP(sink, layer, name, dtype, data, ndim, shape)                     \
    do {                                                                        \
        if (TD_TAP_UNLIKELY_((sink) != NULL))                                   \
            td_tap_emit((sink), (layer), (name), (dtype), (data), (ndim), (shape)); \
    } while (0)

/* Taps off: one branch, TD_TAP_WANT_NONE without evaluating layer or name. */
#define TD_TAP_WANT(sink, layer, name)                                          \
    (TD_TAP_UNLIKELY_((sink) != NULL) ? td_tap_want((sink), (layer), (name)) : TD_TAP_WANT_NONE)

#ifdef __cplusplus
}
#endif
#endif
