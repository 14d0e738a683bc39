/* tapdiff runner: drives any registered backend over one sequence (a
 * prefill of the prompt in one forward, then N decode steps of one token)
 * and writes the tap file. Used by `tapdiff run`, and in-process by the
 * subcommands that need forwards (bisect, gate, golden).
 *
 * Decode modes (DESIGN.md "Runner and decode modes"):
 *   greedy  each decode step consumes the argmax of the previous forward's
 *           last position (lowest id on ties);
 *   pinned  decode step i consumes pinned[i], whatever the arm predicted, so
 *           two arms answer the same question at every step. */
#ifndef TD_RUNNER_H
#define TD_RUNNER_H

#include <stdint.h>

#include "backend.h"
#include "model.h"
#include "tap.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum td_decode_mode {
    TD_DECODE_GREEDY = 0,
    TD_DECODE_PINNED = 1,
} td_decode_mode;

typedef struct td_run_config {
    const char *model_path;    /* GGUF to open; with `model` set, provenance only */
    const td_model *model;     /* (optional) an open model, borrowed */
    const char *backend;       /* registered name: "ref", "ref32", ... */
    const int32_t *prompt;     /* prefill tokens, n_prompt >= 1 */
    int64_t n_prompt;
    int64_t n_steps;           /* decode steps after the prefill, >= 0 */
    td_decode_mode decode;
    const int32_t *pinned;     /* PINNED: token of decode step i, n_pinned >= n_steps */
    int64_t n_pinned;
    const char *decode_label;  /* (optional) "pinned:FILE" for the tap file; NULL = mode name */
    const char *tap_path;      /* (optional) tap file to write; NULL = taps off */
    td_tap_mode tap_mode;      /* TD_TAP_FULL or TD_TAP_FINGERPRINT */
    const char *tap_filter;    /* (optional) data filter in full mode (tap.h) */
    int threads;               /* backend threads, 0 = its default */
    uint32_t n_ctx;            /* KV capacity, 0 = n_prompt + n_steps */
    int keep_all_logits;       /* 1: res->logits keeps every forward's row (tests); 0: the latest only */
    const char *inject;        /* (optional) backend fault injection */
    const char *profile;       /* (optional) arithmetic profile */
    const char *command_line;  /* (optional) provenance */
    const char *prompt_text;   /* (optional) the text `prompt` was tokenized from: root attribute `prompt` */
    /* 1: a reference arm (ref, ref32) under a Q8 activation profile logs the near rounding ties
     * it meets and records them in the tap file (root attributes near_ties and ties_taken,
     * harness/ties.h), so compare can name a divergence on one; `tapdiff run` sets it. Off for
     * callers that hold their own tie session (bisect, ties.h): one session per process. */
    int record_ties;
    /* (optional) progress: called after each forward with done/total forwards */
    void (*on_step)(void *user, int64_t done, int64_t total);
    void *user;
} td_run_config;

/* Defaults: greedy, 16 steps, full taps (when tap_path is set), rest empty. */
void td_run_config_init(td_run_config *c);

typedef struct td_run_result {
    int64_t n_forwards;   /* 1 (prefill) + n_steps */
    int64_t n_steps;
    int64_t n_vocab;      /* V */
    int32_t *fed;         /* (n_steps) token consumed by each decode step */
    int32_t *sampled;     /* (n_forwards) argmax of each forward's last position */
    double *logits;       /* (n_forwards, V) with keep_all_logits, else (V): the latest forward's row */
    const double *final_logits; /* the last forward's row of `logits` (V) */
    double prefill_s;     /* wall time of the prefill forward (taps included) */
    double decode_s;      /* wall time of all decode forwards */
    char backend_version[1024];
    char arch[32];
    char profile[128];        /* the arithmetic profile the arm computed with (canonical) */
} td_run_result;

/* Runs the sequence. On failure returns its status with one line in err
 * (TD_EINPUT for a bad model, token or pinned list, TD_EUSAGE for an unknown
 * backend, TD_EINTERNAL for I/O); the tap file then keeps every finished
 * step, and *res is left empty. */
int td_run(const td_run_config *cfg, td_run_result *res, td_err *err);
void td_run_result_free(td_run_result *res);

/* Index of the largest value, the lowest index on ties; NaNs never win. */
int32_t td_argmax(const double *x, int64_t n);

/* Token ids separated by commas and/or blanks ("1, 2 3"); *ids is
 * td_xmalloc'd. TD_EINPUT names `what` for anything that is not a
 * non-negative int32, or an empty list. */
int td_parse_token_list(const char *text, const char *what, int32_t **ids, int64_t *n, td_err *err);

/* A text file holding one such id list. */
int td_read_token_text(const char *path, int32_t **ids, int64_t *n, td_err *err);
/* 1 when the file starts with the HDF5 signature (a tap file, presumably). */
int td_is_hdf5_file(const char *path);
/* The tokens a tap file's run consumed: its prefill step's inp.tokens and
 * the inp.tokens of its decode steps, in step order (either output may be
 * NULL). A tap without data (fingerprint mode) still gives its values when
 * it has at most 4 (the fingerprint keeps the first four). */
int td_read_tapfile_tokens(const char *path, int32_t **prompt, int64_t *n_prompt, int32_t **decode,
                           int64_t *n_decode, td_err *err);

#ifdef __cplusplus
}
#endif
/* 1 when path names the same file as any of the n inputs (same device and
 * inode: links and relative spellings resolve); NULL inputs are skipped. An
 * output for which this holds would overwrite an input. */
int td_same_file_any(const char *path, const char *const *inputs, int n);

#endif
