/* tapdiff external arms: any program run as an arm of bisect
 * (`--b exec:PROGRAM`), judged by the tap file it writes like any other arm's.
 *
 * The contract (README "Bring your own engine"). PROGRAM is split at blanks
 * into the program (found in PATH unless it holds a '/') and its arguments,
 * and run with its stdout sent to stderr (bisect's stdout is the verdict) and
 * these environment variables:
 *   TAPDIFF_MODEL     the GGUF file
 *   TAPDIFF_PROMPT    the prompt's token ids, comma-separated: one prefill step
 *   TAPDIFF_STEPS     N: decode steps after the prefill, one token each
 *   TAPDIFF_PINNED    (pinned arm only) a text file of N comma-separated ids:
 *                     decode step i consumes the i-th, whatever the arm predicted;
 *                     unset: the arm decodes greedily (argmax, lowest id on ties)
 *   TAPDIFF_TAPS      the tap file to write (full mode)
 *   TAPDIFF_TAP_MODE  "full"
 *   TAPDIFF_DECODE    "pinned:FILE" or "greedy", for the file's decode attribute
 *   TAPDIFF_THREADS   threads to use, 0 = the program's default
 * The tap library's td_tap_sink_open_env and td_tap_sink_provenance do the
 * tap side. The run is accepted when the program exits 0 and the tap file
 * exists, has model_sha256 = the model's, 1 + N complete steps, and consumed
 * exactly the prompt then (pinned) the pinned ids. */
#ifndef TD_EXTARM_H
#define TD_EXTARM_H

#include <stdint.h>

#include "td_common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TD_EXTARM_PREFIX "exec:"

/* 1 when arm names an external arm ("exec:..."). */
int td_extarm_is(const char *arm);

typedef struct td_extarm_config {
    const char *spec;          /* "exec:PROGRAM [ARGS]" */
    const char *model_path;
    const int32_t *prompt;
    int64_t n_prompt;
    int64_t n_steps;
    const int32_t *pinned;     /* n_steps ids, or NULL: greedy */
    const char *pinned_path;   /* where the pinned ids are written for the program */
    const char *tap_path;
    int threads;
} td_extarm_config;

/* Runs the program and checks its tap file. On success *decode (may be NULL)
 * gets the n_steps ids its decode steps consumed (td_xmalloc'd).
 * Statuses, each with one line naming the arm in err:
 *   TD_EUSAGE (2)  the program is not found or not executable;
 *   TD_SKIP (77)   it exited 77 (it cannot run here: no device, ...);
 *   TD_EINPUT (3)  it exited non-zero or was killed by a signal, wrote no
 *                  (or an unreadable) tap file, a file of another model or
 *                  without model_sha256, fewer or more steps than asked, or
 *                  consumed other tokens than the prompt and the pinned ids;
 *   TD_EINTERNAL   fork/pipe/write failures here. */
int td_extarm_run(const td_extarm_config *c, int32_t **decode, td_err *err);

#ifdef __cplusplus
}
#endif
#endif
