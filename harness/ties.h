/* tapdiff: the profile-matched oracle takes an arm's side of rounding ties.
 *
 * An arm that quantizes activations (act-q8) computes each 8-bit code and
 * each f16 block scale from values that differ from the f64 oracle's by f32
 * rounding. Where such a value sits within that rounding of a tie (x/d at a
 * half-integer, a/127 at the midpoint of two f16 values), either result is
 * honest, yet the two sides differ by ~1e-3 relative at the matmul output:
 * a false alarm against a budget of f32 rounding. This search reruns the
 * oracle with ties taken the other way (backends/profile.h td_act_ties_*),
 * one at a time, nearest first, among the near-ties of the step where the
 * comparison first diverges, and keeps a flip only when the first divergent
 * tap moves later (or the comparison becomes conformant). A bug in the arm
 * cannot hide behind it: a flip moves one tap by a discrete, fixed pattern,
 * and it is kept only when that pattern is what the arm shows there.
 *
 * When no near-tie of the divergent step helps, the search tries the ties of
 * that step or an earlier one that the control (ref32 with the arm's profile)
 * rounded to the other side than the oracle, nearest first
 * (TD_TIES_SHARED_CANDIDATES; the control's own log says which). An arm that
 * took the control's side there shows no error beyond the control's at that
 * step, so the step passes and is never searched, but the oracle's side stays
 * in its K/V cache and can surface many steps later at a tap where the
 * control, sharing the arm's side, draws no budget for it. Such a flip is
 * judged as any other (kept only when the first divergence moves later), and
 * the control's side is not taken up front: the arm's f32 sums are not the
 * control's, and where it took the oracle's side a pin would put the
 * divergence at the tie's step, so it is not kept.
 *
 * A GPU arm's f16 operands (attn-f16, mm-f16, kv-f16, fa-f16) have the same
 * kind of tie: a value within a few f32 ulps of the midpoint of two f16
 * neighbours, which the arm's f32 value and the oracle's f64 value round to
 * different sides of, one f16 ulp apart. Those take part too
 * (profile.h TD_ACT_TIES_F16_TAU), after the codes and scales: first the ones
 * rounded right before the divergent tap, then any of that step or an
 * earlier one, nearest first.
 *
 * Before that search, the oracle reads the arm's side of those f16 ties
 * where the arm's taps show it: an f16 rounding whose input is a tap of the
 * step (mm-f16's matmul inputs attn_norm, attn_ctx, ffn_norm, ffn_act,
 * out.norm; attn-f16's Q, K and V rows from attn_q_rope, attn_k_rope,
 * attn_v) rounds, on the arm, the arm's own tapped f32 value; where the
 * oracle's value is a near tie (TD_ACT_TIES_F16_TAU) and the arm's value
 * rounds to the tie's other neighbour, the oracle and the control take that
 * neighbour, when that tap comes before the first divergent one (a value
 * the comparison found honest). Every such tie at once, then again with the
 * values the pins moved and the first divergence they moved
 * (TD_TIES_READ_ROUNDS at most). A bug cannot hide behind it: a pin is the
 * rounding of a value judged conformant at its own tap, before the first
 * divergence; an arm value that rounds to neither neighbour pins nothing;
 * and the control takes the same side, so budgets after the tie stay what
 * they were. The attention's probabilities are not tapped, nor is fa-cpu's
 * f16 output accumulator: their ties are left to the search. */
#ifndef TD_TIES_H
#define TD_TIES_H

#include "compare.h"
#include "profile.h"
#include "runner.h"

/* Tie values kept at most (most of them read from the arm's taps): a value
 * is one rounding (step, element, value); the copies that round it again
 * for more matmuls of the same row (attn_norm's feeds four, ffn_norm's
 * three) count once, so they do not use the cap up. */
#define TD_TIES_MAX 1024
#define TD_TIES_FLIPS_MAX (4 * TD_TIES_MAX) /* the pins of those values, copies included */
#define TD_TIES_READ_ROUNDS 8  /* oracle reruns that read the arm's side of f16 roundings */
#define TD_TIES_CANDIDATES 6   /* near-ties tried per divergent step */
#define TD_TIES_TAU (1.0 / 1024) /* near: within 2^-10 of the tie (code units / f16 ulps) */
/* Recorded in a tap file: within 2^-14, where f32 rounding of the inputs
 * (~1e-7 relative of values up to 127) can decide the side; the nearest
 * TD_TIES_NEAR_MAX of a run. */
#define TD_TIES_NOTE_TAU (1.0 / 16384)
#define TD_TIES_NEAR_MAX 64
#define TD_TIES_F16_CANDIDATES 8 /* f16 operand near-ties tried per divergent step (profile.h TD_ACT_TIES_F16_TAU) */
#define TD_TIES_SHARED_CANDIDATES 8 /* then: near-ties the control rounded to the other side than the oracle */

typedef struct td_ties_report {
    int n_flips;  /* pins: a value once per matmul that rounds it */
    int n_values; /* distinct values among the flips (the ties taken; TD_TIES_MAX counts these) */
    td_act_tie flips[TD_TIES_FLIPS_MAX];
    int n_reruns; /* oracle runs the search made */
    int64_t n_unlogged; /* near-ties past the oracle's log cap (TD_ACT_TIES_LOG_MAX), the most of one run:
                           their sides could not be taken */
    int n_read;   /* of the values, those with a copy read from the arm's taps */
    unsigned char read[TD_TIES_FLIPS_MAX]; /* 1: flips[i] was read from the arm's taps, 0: found by the search */
    int n_near;   /* the final oracle run's near ties (TD_TIES_NOTE_TAU), nearest first */
    td_act_tie near[TD_TIES_NEAR_MAX];
} td_ties_report;

/* `oracle` and `control` are the runs that wrote their tap_path (ref and
 * ref32 with the arm's profile), decode PINNED to the tokens the oracle fed;
 * *r is compare(oracle's file, b_path) with control->tap_path as control and
 * options o, divergent. Each candidate tie is pinned in both reruns (the
 * control takes the same side, so budgets after it stay f32 rounding). On
 * return *r is the comparison with the flips kept (the caller frees it), the
 * two tap files hold the reruns with those flips when any were kept, and rep
 * lists them. Nothing changes when none helps. */
int td_ties_follow(const td_run_config *oracle, const td_run_config *control, const char *b_path,
                   const td_cmp_options *o, td_cmp_result **r, td_ties_report *rep, td_err *err);

/* Appends pin t to rep->flips (read: it was read from the arm's taps),
 * counting it in n_values unless a flip of the same value (step, element,
 * value) is there already. 0, nothing added, when t would be a new value
 * past TD_TIES_MAX or the flips are full; else 1. */
int td_ties_add(td_ties_report *rep, const td_act_tie *t, int read);

/* One line per kept flip into buf ("step S: activation code / block scale
 * at call C element E, scaled value V"); "" when none. */
void td_ties_describe(const td_ties_report *rep, char *buf, size_t n);

/* The near ties of a log within TD_TIES_NOTE_TAU, nearest first, at most
 * TD_TIES_NEAR_MAX, into rep->near. */
void td_ties_keep_near(td_ties_report *rep, const td_act_tie *log, int n_log);

/* Root attributes of the oracle's closed tap file at path (additive to the
 * schema; README "Tap file schema"): `ties_taken`, the ties the oracle took
 * the arm's side of, and `near_ties`, the near ties its run met; each a
 * string of entries "STEP:CALL:ELEM:V:SITE" separated by blanks ("" none). */
int td_ties_record(const char *path, const td_ties_report *rep, td_err *err);

/* When tap file f recorded a near tie (`near_ties`) at `step` in the row of a
 * matmul of block `layer` (-1: outside the blocks), one line about the
 * nearest into buf and 1; else 0 (also when f carries no tie log). */
int td_ties_note(const td_tapfile *f, int64_t step, int32_t layer, char *buf, size_t n);

#endif
