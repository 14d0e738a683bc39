/* tapdiff token-history self-check: one arm, no second one needed
 * (DESIGN.md "Runner and decode modes"). A feedback bug (a decode step fed
 * token 0, a stale or off-by-one history) shows in the arm's own taps:
 *
 *  feedback  (greedy files only) the token a decode step s consumed
 *            (inp.tokens[0] of step s) must be the token sampled at step
 *            s-1: the argmax of the last row of step s-1's out.logits, the
 *            lowest id on ties (td_argmax, as the runner samples);
 *  history   (every file with hist.tokens) hist.tokens of step s must be
 *            the last min(n, W) ids consumed up to and including step s, in
 *            order (oldest first), where n counts every inp.tokens value of
 *            steps 0..s and W is the longest hist.tokens of the file.
 *
 * The decode mode is the root attribute `decode` the runner writes:
 * "greedy" checks both; "pinned..." and anything else (a file from another
 * engine without the attribute) check the history only, since the fed
 * tokens there are the pinned list's, not the arm's argmax.
 * A library: no printing, no exit(). */
#ifndef TD_SELFCHECK_H
#define TD_SELFCHECK_H

#include <stdint.h>

#include "runner.h"
#include "tapfile.h"
#include "td_common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum td_sc_mode {
    TD_SC_GREEDY = 0,
    TD_SC_PINNED = 1,  /* "pinned" or "pinned:FILE" */
    TD_SC_UNKNOWN = 2, /* no or another decode attribute: history only */
} td_sc_mode;

typedef enum td_sc_fail {
    TD_SCF_OK = 0,
    TD_SCF_FEEDBACK = 1, /* a decode step consumed another token than the previous argmax */
    TD_SCF_HIST = 2,     /* hist.tokens is not the last W consumed ids */
} td_sc_fail;

typedef struct td_selfcheck_report {
    td_sc_mode mode;
    int64_t n_steps;
    int64_t n_feedback;   /* decode steps whose consumed token was checked */
    int64_t n_hist;       /* steps whose hist.tokens was checked */
    int64_t hist_w;       /* W; 0 when the file has no hist.tokens */
    int verdict;          /* TD_OK or TD_DIVERGENT */
    td_sc_fail fail;
    int64_t fail_step;    /* the first failing step (file step index); -1 when none */
    int64_t fail_index;   /* history: index into hist.tokens (-1: its length is wrong); feedback: 0 */
    int64_t expected;     /* the token (history: or the length) that should be there */
    int64_t found;        /* what is there */
    char message[512];    /* one line: what was checked, or where and how it failed */
} td_selfcheck_report;

/* Checks a tap file. TD_OK with *rep filled (the verdict is rep->verdict), or
 * TD_EINPUT with one line in err: unreadable file, inp.tokens without values
 * (fingerprint-only with more than 4 tokens), a greedy file whose out.logits
 * has no data at a step whose successor is a decode step, a hist.tokens that
 * is not a 1-D integer tap. Checks stop at the first failing step.
 * rep->verdict TD_OK with n_feedback + n_hist == 0 means nothing could be
 * checked (message says why): callers decide whether that is acceptable
 * (`tapdiff run --check` does not accept it).
 * Streams: one step's inp.tokens, one out.logits row and one hist.tokens at a
 * time. */
int td_selfcheck_file(const char *path, td_selfcheck_report *rep, td_err *err);
/* The same on a tap file the caller has open (compare checks its arms
 * without opening, and so checking, each file a second time). */
int td_selfcheck_tapfile(const td_tapfile *f, td_selfcheck_report *rep, td_err *err);

/* The in-memory variant for a run without a tap file: in greedy mode, the
 * token fed to each decode step must be the previous forward's argmax
 * (res->fed[i] == res->sampled[i]). It sees what the runner fed, not what
 * the backend consumed; the file check sees both. Pinned: nothing to check. */
void td_selfcheck_run_result(const td_run_result *res, td_decode_mode mode, td_selfcheck_report *rep);

#ifdef __cplusplus
}
#endif
#endif
