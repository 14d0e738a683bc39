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
 *   td_tap_step_end(s, &err);               // the step is durable on disk
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

/* A summary, not a hash: separates wrong (zero, saturated, NaN, another
 * tensor) from last-bits different. Min/max/sums are over finite values. */
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
    /* Comma-separated glob patterns over full tap names ("blk.*.attn_*,out.*");
     * NULL or "" = every tap. A tap that does not match is not written. In
     * fingerprint mode, non-matching taps still get a fingerprint; in full
     * mode, they get a fingerprint only. */
    const char *filter;
    int compress; /* deflate level 0..9 for full data; default 4 */
} td_tap_options;

typedef struct td_tap_sink td_tap_sink;

td_tap_options td_tap_options_default(void);

/* Creates (truncates) the file. Returns 0 or a non-zero status (3 bad input,
 * 99 I/O) with a message in err. */
int td_tap_sink_open(td_tap_sink **out, const char *path, const td_tap_options *opt, td_err *err);
/* Root attributes (provenance). Call before the first step. */
int td_tap_sink_attr_str(td_tap_sink *s, const char *key, const char *value);
int td_tap_sink_attr_i64(td_tap_sink *s, const char *key, int64_t value);
int td_tap_sink_attr_f64(td_tap_sink *s, const char *key, double value);

int td_tap_step_begin(td_tap_sink *s, td_step_kind kind, int64_t pos0, int64_t n_tokens, td_err *err);
/* Flushes: after it returns the step survives a SIGKILL of the process. */
int td_tap_step_end(td_tap_sink *s, td_err *err);

/* Emits one tap of the current step. The data is read during the call only.
 * Errors are sticky: the first one is kept and returned by step_end/close
 * (an engine's forward need not check every tap). */
void td_tap_emit(td_tap_sink *s, int layer, const char *name, td_dtype dtype, const void *data, int ndim, const int64_t *shape);

int td_tap_sink_close(td_tap_sink *s, td_err *err);

void td_fingerprint_compute(td_fingerprint *fp, td_dtype dtype, const void *data, uint64_t count);

#define TD_TAP(sink, layer, name, dtype, data, ndim, shape)                     \
    do {                                                                        \
        if (__builtin_expect((sink) != NULL, 0))                                \
            td_tap_emit((sink), (layer), (name), (dtype), (data), (ndim), (shape)); \
    } while (0)

#ifdef __cplusplus
}
#endif
#endif
