/* tapdiff state-operations check: drives one arm through a script of state
 * operations (prefill, decode, rollback, sequence copy) and judges every
 * forward it makes against the oracle's STRAIGHT-LINE forward of the tokens
 * that sequence holds at that point (reset + one prefill), so the oracle
 * needs no state operations at all. Bugs in rollback and copy (stale cache
 * rows, a copy missing a position, recurrent state not restored) show as
 * logits that no straight forward of the same tokens produces.
 *
 * Script: operations separated by ';' or newlines ('#' starts a comment):
 *   prefill [N] [on S]   the first N prompt tokens (default all) as one step
 *   feed T,T,... [on S]  the given token ids as one step
 *   decode N [on S]      N greedy one-token steps: each consumes the arm's
 *                        argmax at the sequence's last position
 *   rollback N [on S]    drop the sequence's last N positions (seq_rm)
 *   copy A B | copy A->B replace sequence B by a copy of A (seq_cp)
 *   use S                forwards append to sequence S from now on
 * `on S` of a forward makes S current first (as `use S`); of a rollback it
 * names the sequence without changing the current one. Sequences are
 * 0..TD_SEQ_MAX-1; all start empty and 0 is current.
 *
 * Taps (tap_dir set): each step's taps of the arm (one tap file per step)
 * are compared with the same positions' rows of the oracle's straight-line
 * forward: float taps by relative L2 against k times the control's error
 * (a tap of fewer than TD_CMP_SMALL_TAP values gets at least the largest
 * control error of the taps before it in the step: a handful of values is
 * one noisy draw), integer taps exactly; hist.tokens is not compared (a
 * rollback cannot restore ids the 16-wide history already dropped). The
 * first failing tap in the arm's execution order names the step.
 *
 * Budget, per logits row (as tapdiff compare judges out.logits): err =
 * relative L2 of the arm's row against the oracle's (the oracle run with the
 * arm's declared arithmetic profile), r = err / max(k * err_ctrl, floor of
 * the arm's precision), err_ctrl the control arm's (ref32, same profile)
 * error on the same straight-line forward; a row fails with r > 1, a
 * non-finite mismatch, a top-1 flip beyond the budget's margin or a KL over
 * the budget. A library: no printing, no exit(). */
#ifndef TD_STATEOPS_H
#define TD_STATEOPS_H

#include <stdint.h>

#include "backend.h"
#include "model.h"
#include "td_common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The built-in script: rollback on one sequence, then a copy and both
 * sequences continued, then a rollback into the copied positions. */
#define TD_SOP_DEFAULT_SCRIPT                                                                                      \
    "prefill; decode 6; rollback 3; decode 5; copy 0 1; decode 4 on 0; decode 4 on 1; rollback 6 on 1; "           \
    "decode 3 on 1; decode 2 on 0"

typedef enum td_sop_kind {
    TD_SOP_PREFILL = 0,
    TD_SOP_FEED = 1,
    TD_SOP_DECODE = 2,
    TD_SOP_ROLLBACK = 3,
    TD_SOP_COPY = 4,
    TD_SOP_USE = 5,
} td_sop_kind;

typedef struct td_sop {
    td_sop_kind kind;
    int64_t n;       /* prefill: tokens (-1 = the whole prompt); decode / rollback: count */
    int seq;         /* on S / use S / copy's source; -1 = the current sequence */
    int dst;         /* copy's destination */
    int32_t *tokens; /* feed */
    int64_t n_tokens;
    char text[96];   /* the operation as written, trimmed */
} td_sop;

typedef struct td_sop_script {
    td_sop *ops;
    int n;
} td_sop_script;

/* TD_EINPUT with the operation's text and what was expected. */
int td_sop_parse(const char *text, td_sop_script *out, td_err *err);
void td_sop_script_free(td_sop_script *s);

/* One forward of the arm and its verdict. */
typedef struct td_sop_step {
    int64_t step;     /* forwards since the start, 0-based */
    int op;           /* index into the script, 0-based */
    const char *op_text;
    int seq;
    int64_t pos0, n_tokens;
    double err, err_ctrl, budget, ratio; /* of the row with the largest ratio */
    int64_t row_pos;                     /* that row's position */
    int fail;                            /* td_cmp_fail (compare.h); 0 = this step conforms */
    char tap[128];                       /* the tap that decides the step: its first failing one, else
                                            the one of the largest ratio ("out.logits" without taps) */
    int64_t n_taps;                      /* taps compared in this step (0 without taps) */
} td_sop_step;

typedef struct td_sop_config {
    const td_model *model;
    const char *arm;       /* the backend under test */
    const char *oracle;    /* default "ref" */
    const char *control;   /* default "ref32"; "none" = the floor only */
    const char *inject;    /* a fault of the catalog for the arm, or NULL */
    int threads;
    double k;              /* <= 0: TD_CMP_K_DEFAULT */
    const int32_t *prompt; /* what prefill consumes */
    int64_t n_prompt;
    const td_sop_script *script;
    const char *tap_dir;   /* an existing folder for the per-step tap files; NULL = logits only */
    void (*on_step)(void *user, const td_sop_step *st); /* each step as judged (may be NULL) */
    void *user;
} td_sop_config;

typedef struct td_sop_result {
    int verdict;            /* TD_OK or TD_DIVERGENT */
    int64_t n_steps;        /* forwards judged */
    int64_t n_taps;         /* taps compared over all steps (0 without taps) */
    td_sop_step first;      /* the first failing step (verdict TD_DIVERGENT) */
    td_sop_step worst;      /* the step of the largest ratio */
    char profile[128];      /* the arm's declared profile: the oracle's and control's */
    char version[512];      /* the arm's version string */
} td_sop_result;

/* Runs the script. TD_SKIP when the arm has no state operations and the
 * script needs them, or refuses one (llama.cpp's partial seq_rm of a
 * recurrent state without snapshots): err names the arm; TD_EINPUT for a script the prompt
 * cannot satisfy (rollback past the start, decode of an empty sequence,
 * prefill longer than the prompt); TD_EUSAGE for an unknown arm or a fault
 * it does not implement. */
int td_sop_run(const td_sop_config *c, td_sop_result *r, td_err *err);

#ifdef __cplusplus
}
#endif
#endif
