/* tapdiff: the reference oracle follows an arm's explained QSA selection.
 *
 * qwen4exp's indexer keeps W positions per query (arch-qwen4exp.md §4.5).
 * Where the budget cuts a block, or blocks tie at the cut, which positions
 * are kept is unspecified (§7.1): the reference keeps the lowest, llama.cpp's
 * top-k others. compare explains such a qsa_sel row (td_cmp_qsa_row_explained:
 * the same count, every difference inside the boundary group), but the
 * attention then really reads other keys, and attn_ctx differs by O(1e-1):
 * no rounding budget covers it. This step reruns the oracle and its control
 * attending to the arm's positions in exactly those rows (profile.h
 * td_qsa_pin), so the taps downstream compare like with like. The oracle's
 * qsa_sel tap keeps its own choice, so the final comparison judges every
 * taken row again: a row that is not explained there is divergent. A row
 * compare does not explain is never taken, so a real selection bug (another
 * block above the cut, another count, another tail) stays divergent at its
 * qsa_sel tap.
 *
 * Taking a row changes what follows it (later layers, later steps), where
 * other rows may then tie or stop tying: the rows are collected again from
 * the rerun's files until the set stops changing (at most
 * TD_QSA_FOLLOW_ROUNDS reruns). TD_QSA_FOLLOW=0 in the environment turns the
 * step off (to see the raw divergence). */
#ifndef TD_QSAFOLLOW_H
#define TD_QSAFOLLOW_H

#include "compare.h"
#include "profile.h"
#include "runner.h"

#define TD_QSA_FOLLOW_ROUNDS 6

typedef struct td_qsa_follow_report {
    int n_rows;       /* selection rows the oracle took from the arm (the final runs') */
    int n_reruns;     /* oracle (+ control) reruns */
    td_qsa_pin *pins; /* (n_rows) the rows, step order; each sel owned */
    int n_layers;     /* distinct layers among them */
} td_qsa_follow_report;

/* `oracle` (and `control`, NULL when there is none) are the reference runs
 * that wrote their tap_path, decode PINNED to the tokens the arm was fed,
 * with `model` set; *r is compare(oracle's file, b_path) with options o
 * (o->control = control's file), divergent or not. When *r is divergent and
 * b_path's qsa_sel rows differ from the oracle's where compare explains them,
 * reruns both with the arm's rows and compares again: *r is then that
 * comparison (the caller frees it) and the two tap files hold the reruns.
 * Nothing changes when there is no such row. */
int td_qsa_follow(const td_run_config *oracle, const td_run_config *control, const char *b_path,
                  const td_cmp_options *o, td_cmp_result **r, td_qsa_follow_report *rep, td_err *err);

/* Open the profile.h pin session with rep's rows (nothing when none), for a
 * later run of the oracle that must attend alike; td_qsa_pins_end closes it. */
void td_qsa_follow_pins_begin(const td_qsa_follow_report *rep);

void td_qsa_follow_free(td_qsa_follow_report *rep);

/* One line into buf: "N selection row(s) at blk.L (n), ...; R oracle rerun(s)"; "" when none. */
void td_qsa_follow_describe(const td_qsa_follow_report *rep, char *buf, size_t n);

/* Root attribute `qsa_taken` of the oracle's closed tap file at path
 * (additive to the schema; README "Tap file schema"): the rows taken, entries
 * "STEP:LAYER:POS:P,P,..." (the positions attended, ascending) separated by
 * blanks; "" none. */
int td_qsa_follow_record(const char *path, const td_qsa_follow_report *rep, td_err *err);

#endif
