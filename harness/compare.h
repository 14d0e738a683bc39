/* tapdiff compare: streams two tap files (A = reference arm, B = candidate)
 * tap by tap in B's execution order, measures each matched tap's error,
 * judges it against a ratio-based budget calibrated by a control arm, and
 * localizes the FIRST divergent tensor. A library: no printing, no exit();
 * reports/ renders the result (text verdict, Markdown, JSON, HTML).
 *
 * ---- Metrics (per tap matched by step index and full name) ----------------
 *  err      relative L2  ||b-a|| / ||a||  over the indices where both values
 *           are finite. ||a|| = 0: err = 0 when ||b|| = 0 too, else 1 (any
 *           non-zero b against an all-zero reference is a 100% error).
 *  max_abs  max |b-a| and its flat index (reported as position/channel for
 *           [T, ...] taps: row r of a step at pos0 is position pos0 + r).
 *  cosine   a.b / (||a|| ||b||); 1 when both are zero, 0 when one is.
 *  nonfinite mismatch: indices where one arm is NaN/Inf and the other is
 *           not (or NaN vs Inf, +Inf vs -Inf): a divergence at that tap.
 *  non-finite values: counted per arm (NaN, +Inf, -Inf) with the first
 *           position. A tap holding any is never reported as a small error:
 *           err = NaN when a NaN is present, else +Inf (err_finite keeps the
 *           relative L2 over the finite pairs). Both arms non-finite at the
 *           same elements is TD_CMPF_NONFINITE_BOTH, divergent too: a
 *           reference that is not finite answers nothing.
 *  ULP      |b-a| / ulp_B(a), ulp_B = spacing of B's dtype at a (subnormal
 *           spacing near 0). max exact; median from a histogram: exact below
 *           1024 ulp, quarter-octave bins above (reported as the bin's lower
 *           edge).
 *  logits (out.logits [T, V], per row): top-1 agreement, top-k overlap
 *           |topk(a) & topk(b)| / k (k = 5), KL(softmax a || softmax b) in
 *           nats.
 *  integer taps (i32/i64: inp.tokens, inp.pos, moe_topk, hist.tokens):
 *           exact equality; err = fraction of mismatching values. Not
 *           counted: mismatches the control pair shows too, qsa_sel rows
 *           differing only in the boundary group, moe_topk rows differing
 *           only between near-tied experts (td_cmp_topk_row_explained).
 *  fingerprint-only (has_data = 0 in either file): data NOT compared. err is
 *           a LOWER BOUND of the relative L2 error derived from the two
 *           fingerprints: max of |sum_b - sum_a| / (sqrt(n) ||a||),
 *           | ||b|| - ||a|| | / ||a||, |max_b - max_a|, |min_b - min_a| and
 *           |first_b[i] - first_a[i]| over ||a|| (each is <= ||b-a|| / ||a||
 *           by Cauchy-Schwarz or the triangle inequality), so a fingerprint
 *           check can miss a divergence but never invents one. A different
 *           non-finite count is a non-finite mismatch.
 *
 * ---- Budget ----------------------------------------------------------------
 *  r(t) = err(t) / max(k * err_ctrl(t), floor(dtype of B))
 *  err_ctrl(t): the control pair's relative L2 at the same step and tap:
 *           err(A, C) with a control file C (typically ref32 when A is ref),
 *           or err(CA, CB) with two control files. No control: budget =
 *           floor only (the reports say so). A tap missing in the control
 *           gets the floor only (counted in n_no_ctrl).
 *  small taps: a tap of fewer than 64 values (moe_logits/probs/weights of
 *           one token, ...) gets err_ctrl = max(its own, its input's, taken
 *           recursively): the relative L2 of a handful of rounding errors is
 *           one noisy draw (two honest arms differ by 5-10x on a 2-value
 *           moe_weights), while the error such a tap inherits is measured
 *           over many values upstream. A bug there is still O(1e-2..1).
 *  cached rows: attention reads K/V rows earlier steps cached, with their
 *           control error, which a one-token step's own control error is
 *           one draw of; attn_ctx/attn_probs take it, and every tap after
 *           them takes what its inputs carry (at most each one's own error)
 *           times the control's growth on that link at that step.
 *  per-head norms: ssm_gated normalizes ssm_core per value head (and row),
 *           which scales a head of small norm up to full size, and its
 *           relative error with it. ssm_core is measured head by head too
 *           (err_head, err_ctrl_head: the largest over heads and rows of
 *           each head's relative L2 to its own norm) and judged on that as
 *           well (r >= err_head / (k err_ctrl_head)); ssm_gated's
 *           err_ctrl_used is at least ssm_core's err_ctrl_head, which it
 *           carries on to the taps after it as cached rows' error is.
 *           A head of < TD_CMP_SMALL_TAP values is one draw, as a small tap
 *           is: its control error is at least the whole tap's err_ctrl
 *           times the largest spread (err_ctrl_head / err_ctrl, at most
 *           TD_CMP_SMALL_GROWTH) the control showed at the tap so far.
 *  k = 4 by default: the control and the candidate are both honest
 *           roundings of the same computation; a different but correct
 *           implementation (blocked or FMA sums, other reduction trees) is
 *           within a small factor of the control, while the bugs this tool
 *           hunts (wrong eps, RoPE pairing, stale state) are >= 100x.
 *  floor: the least error B's precision must be allowed where the control
 *           measured (nearly) nothing. 16 unit roundoffs for the IEEE
 *           formats below f64 (f32 2^-20 ~ 9.5e-7, f16 2^-7 = 7.8e-3, bf16
 *           2^-4 = 6.25e-2): one rounding of each result costs <= u, a few
 *           chained operations a few u. f64: 1e-13 ~ 900 u, because a second
 *           f64 arm differs from the oracle by summation order over long
 *           dot products and ~50 layers, which grows like sqrt(n) u per sum.
 *  fingerprint-only taps judged against a control that is itself not data
 *           also get floor >= 1e-3 (TD_CMP_FP_FLOOR): a one-projection lower
 *           bound is a noisy statistic, so such taps only catch the gross
 *           errors fingerprints exist for (zero, saturated, another tensor).
 *  logits rows: a top-1 flip is explained (rounding) when the reference's
 *           margin a[top1_a] - a[top1_b] <= 2 * budget * ||a_row||; KL of a
 *           row must be <= (budget * ||a_row||)^2 (KL ~ Var_p(b-a)/2 <=
 *           ||b-a||^2 / 2 for small perturbations). Either failing is a
 *           divergence of that tap.
 *
 * ---- Growth and the producer map -------------------------------------------
 *  growth = err(t) / err(input of t): how much one operation amplified the
 *  error it was handed (+inf: the input was exact, the error was created
 *  here; NaN: no input, e.g. inp.embd). The input of a tap is given by a
 *  producer map of the canonical names (the max over its operands, each
 *  operand the first present of its alternatives, in the same step):
 *    attn_norm <- blk.L-1.out | inp.embd;  attn_q/k/v <- attn_norm;
 *    attn_q_norm <- attn_q; attn_q_rope <- attn_q_norm|attn_q (k alike);
 *    attn_ctx <- q_rope|q_norm|q, k_rope|k_norm|k, attn_v;
 *    attn_out <- attn_ctx;  ffn_inp <- attn_out, blk.L-1.out|inp.embd;
 *    ffn_norm <- ffn_inp;  ffn_gate/up, moe_logits <- ffn_norm;
 *    ffn_act <- ffn_gate, ffn_up;  moe_probs <- moe_logits;
 *    moe_weights <- moe_probs;  ffn_out <- ffn_act|ffn_norm, moe_weights;
 *    out <- ffn_out, ffn_inp;  out.norm <- the last blk.N.out;
 *    out.logits <- out.norm.
 *  Any other name (hybrid architectures, user taps): the previous non-integer
 *  tap of the same step in execution order.
 *
 * ---- Decode vs prefill -----------------------------------------------------
 *  per tap name: worst decode-step err / prefill err (a stale-state or
 *  feedback bug makes it O(1) against ~1e-6). Reported, not judged. A step
 *  whose err is NaN/Inf (non-finite values) is included, not skipped: NaN
 *  dominates the worst, and n_nonfinite counts such steps.
 *
 * ---- Verdict ---------------------------------------------------------------
 *  The first divergent tap is the first in execution order (step order, then
 *  seq) with r > 1, a non-finite mismatch, an integer mismatch, or a failed
 *  logits row check. No vacuous pass: zero matched taps, or a tap present in
 *  one arm and absent from the other (not excluded by the filter), is
 *  DIVERGENT with a reason saying what was not compared.
 *  Refused (TD_EINPUT, no result): unreadable files, different model_sha256
 *  root attributes, steps that disagree (kind, pos0, n_tokens), different
 *  inp.tokens at a step (unless allow_token_mismatch: then it is an integer
 *  mismatch at inp.tokens), a matched tap with another shape or integer vs
 *  float dtype (control files included), a control file whose steps or
 *  inp.tokens differ from A's (a control must answer A's question; a step the
 *  control lacks only leaves its taps without a control error).
 * ---------------------------------------------------------------------------
 */
#ifndef TD_COMPARE_H
#define TD_COMPARE_H

#include <math.h>
#include <stdint.h>

#include "tapfile.h"
#include "td_common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TD_CMP_K_DEFAULT 4.0
#define TD_CMP_TOPK_DEFAULT 5
#define TD_CMP_TOPK_MAX 64
#define TD_CMP_FP_FLOOR 1e-3
/* Taps of fewer values than this inherit their input's control error as a
 * lower bound of their own (see "Budget"). */
#define TD_CMP_SMALL_TAP 64
/* The most a small tap's budget grows by the control's growth there (softmax
 * over 8 router logits measured up to 4.05x; matmul outputs of a tiny model
 * vary as much, and a bug must not buy more room than rounding shows). */
#define TD_CMP_SMALL_GROWTH 4.0
/* Rows / channels kept per tap as the places that diverge most. */
#define TD_CMP_N_WHERE 3

typedef struct td_cmp_options {
    double k;                /* budget multiple of the control error; <= 0 = default (4) */
    double floor;            /* > 0: replaces the per-precision floor for every tap */
    const char *floor_note;  /* why the floor was replaced, for the reports (may be NULL) */
    const char *filter;      /* comma-separated fnmatch globs on full tap names; NULL/"" = all */
    int allow_token_mismatch;
    int require_model_sha256; /* an arm without model_sha256 is refused (TD_EINPUT): the CLI sets it */
    int topk;                /* logits top-k overlap; <= 0 = default (5), at most TD_CMP_TOPK_MAX */
    const char *control;     /* err_ctrl = err(A, control) */
    const char *control_a;   /* err_ctrl = err(control_a, control_b) (both or neither) */
    const char *control_b;
    /* (optional) the model's QSA block size per layer (td_hparams.qsa_ratio,
     * 256 entries, 0 = dense): the qsa_sel rule uses it instead of the block
     * sizes the -1 pattern of qsa_scores allows (with one token per step
     * several do, and every one of them must explain a row) */
    const uint32_t *qsa_ratio;
    /* without qsa_ratio: take the block sizes from the model A's file names
     * (root attributes arch qwen4exp, model, model_sha256) when it is still at
     * that path with that sha256, else infer them as above (the CLI sets it) */
    int qsa_ratio_from_model;
} td_cmp_options;

typedef enum td_cmp_method {
    TD_CMP_DATA = 0,        /* values compared */
    TD_CMP_FINGERPRINT = 1, /* has_data = 0 in an arm: fingerprints only */
    TD_CMP_INTEGER = 2,     /* exact equality */
} td_cmp_method;

typedef enum td_cmp_fail {
    TD_CMPF_OK = 0,
    TD_CMPF_BUDGET = 1,    /* r > 1 */
    TD_CMPF_NONFINITE = 2, /* NaN/Inf where the other arm is finite */
    TD_CMPF_INTEGER = 3,   /* an integer tap differs */
    TD_CMPF_TOP1 = 4,      /* logits: top-1 flip beyond the budget's margin */
    TD_CMPF_KL = 5,        /* logits: a row's KL over its budget */
    TD_CMPF_NONFINITE_BOTH = 6, /* NaN/Inf in both arms at the same elements: not conformant */
} td_cmp_fail;

typedef enum td_cmp_ctrl {
    TD_CTRL_NONE = 0,        /* no control at this tap: floor only */
    TD_CTRL_DATA = 1,        /* control relative L2 from data */
    TD_CTRL_FINGERPRINT = 2, /* control lower bound from fingerprints */
} td_cmp_ctrl;

/* A row (position) or a channel and how much of ||b-a||^2 it holds. */
typedef struct td_cmp_where {
    int64_t index; /* row or channel; -1 = unused */
    double share;  /* its part of sum (b-a)^2, 0..1 */
    double err;    /* its own relative L2 */
} td_cmp_where;

typedef struct td_cmp_tap {
    char name[TD_TAP_NAME_MAX];
    int64_t step;
    td_step_kind kind;
    int64_t pos0;
    int64_t n_tokens; /* of the step */
    int64_t seq;      /* B's */
    int32_t layer;
    td_dtype dtype_a, dtype_b;
    int ndim;
    int64_t shape[TD_TAP_MAX_DIMS];
    uint64_t count;
    td_cmp_method method;
    td_cmp_fail fail;

    double err;      /* relative L2 (fingerprint: lower bound; integer: mismatch fraction) */
    double err_ctrl; /* NaN when ctrl == TD_CTRL_NONE */
    td_cmp_ctrl ctrl;
    double err_ctrl_used; /* what the budget used: err_ctrl, or for a tap of
                             < TD_CMP_SMALL_TAP values the larger of it and its
                             input's err_ctrl_used times the largest control
                             growth (err_ctrl / input's err_ctrl, >= 1) this
                             tap showed so far; at least the error of rows
                             cached by earlier steps that it reads or its
                             inputs carry (see `carried`); NaN = none */
    double carried;  /* the error of rows cached by earlier steps this tap
                        passes on to its consumers (attention's K/V cache:
                        compare.c, cached_inputs and carried_on); NaN = none */
    double err_head; /* a tap a per-head norm reads (ssm_core, read by
                        ssm_gated's RMSNorm per value head): the largest
                        relative L2 of one head of one row, each relative to
                        its own norm; NaN = not measured (other taps, no data) */
    double err_ctrl_head; /* the control's, the same way; NaN = none */
    uint64_t head_n; /* values per head where err_head is measured, else 0 */
    double floor;    /* the floor used for this tap */
    double budget;   /* max(k err_ctrl_used, floor) */
    double ratio;    /* err / budget */
    double growth;   /* err / err_input; NaN: no input; +inf: input exact */
    double err_input;
    char input[TD_TAP_NAME_MAX]; /* "" when none */

    double max_abs;  /* data: max |b-a| over finite pairs */
    uint64_t max_index;
    double cosine;
    uint64_t n_nonfinite_mismatch;
    double ulp_max, ulp_median;

    int is_logits;           /* out.logits compared with data */
    int64_t lg_rows;
    int64_t lg_top1_agree;   /* rows whose argmax agree */
    int64_t lg_top1_unexplained;
    double lg_topk_mean, lg_topk_min; /* overlap fractions */
    double lg_kl_mean, lg_kl_max;     /* nats */
    int64_t lg_kl_over;               /* rows over their KL budget */
    int64_t lg_worst_row;             /* row of kl_max */

    uint64_t n_int_mismatch;
    /* of those, how many the control pair shows at the same element too
     * (an honest flip, e.g. a router near-tie decided the other way by the
     * same arithmetic): when every mismatch is shown by the control the tap
     * is not divergent */
    uint64_t n_int_in_ctrl;
    /* of the rest, how many lie in rows of a QSA selection (qsa_sel) that
     * differ only inside the boundary group (td_cmp_qsa_row_explained): a
     * tie at the budget's cut, not counted as divergent */
    uint64_t n_int_qsa_tie;
    /* of the rest, how many lie in rows of a MoE router's selection
     * (moe_topk) that trade experts only within the near-tie tolerance of
     * A's moe_probs (td_cmp_topk_row_explained): not counted as divergent */
    uint64_t n_int_router_tie;
    /* the first mismatching flat index (integer taps, or non-finite
     * mismatches) and the two values there */
    uint64_t first_mismatch;
    double mis_a, mis_b;

    td_cmp_where rows[TD_CMP_N_WHERE]; /* positions that diverge most (rows of [T, ...]) */
    td_cmp_where cols[TD_CMP_N_WHERE]; /* channels that diverge most */

    /* Non-finite values of each arm (data taps): [0] NaN, [1] +Inf, [2] -Inf;
     * fingerprint-only taps: [0] holds the fingerprint's non-finite count. */
    uint64_t nf_a[3], nf_b[3];
    uint64_t n_nonfinite_both; /* elements non-finite in both arms, same class */
    uint64_t first_nonfinite;  /* first flat index non-finite in either arm */
    double nf_first_a, nf_first_b; /* the two values there */
    double err_finite; /* relative L2 over the finite pairs only (= err when all finite) */
} td_cmp_tap;

/* Worst decode-step error over prefill error, per tap name. */
typedef struct td_cmp_dvp {
    char name[TD_TAP_NAME_MAX];
    double prefill_err;
    double decode_err;   /* worst decode step */
    int64_t decode_step;
    double ratio;        /* decode_err / prefill_err; +inf when prefill is exact */
    int64_t n_nonfinite; /* steps of this tap whose err is NaN/Inf (non-finite values): they
                            make the worst error NaN/Inf, never dropped */
} td_cmp_dvp;

typedef struct td_cmp_result {
    /* settings */
    double k;
    int topk;
    char *filter;          /* "" = every tap */
    char *floor_note;      /* "" unless the floor was replaced */
    double floor_override; /* 0 = per precision */
    int allow_token_mismatch;
    /* arms: paths and the root attributes reports show ("" when absent) */
    char *path_a, *path_b, *path_ctrl_a, *path_ctrl_b; /* ctrl: NULL when none */
    char *backend_a, *backend_b, *backend_ctrl_a, *backend_ctrl_b;
    char *precision_a, *precision_b;
    char *model, *model_sha256;
    int has_control;
    int64_t n_steps_a, n_steps_b;

    /* taps compared, in B's execution order: read them with td_cmp_tap_at.
     * The records live in an unnamed temporary file (in memory only when no
     * temporary file can be made), so that compare's memory does not grow with
     * the number of steps; only the current step's records are kept while
     * comparing. */
    int64_t n_taps;
    struct td_cmp_store *store; /* private */
    int64_t n_data, n_fingerprint, n_integer;
    int64_t n_no_ctrl;    /* compared taps with no control error (floor only) */
    int64_t n_filtered;   /* taps excluded by the filter (both arms) */
    int64_t n_missing_in_a; /* taps of B that A lacks */
    int64_t n_missing_in_b; /* taps of A that B lacks */
    char missing_example[320];

    int64_t first;        /* index in taps of the first divergent tap; -1 */
    int64_t n_divergent;
    int verdict;          /* TD_OK (conformant) or TD_DIVERGENT */
    char reason[512];     /* one line: why the verdict */
    char notes[8][320];   /* things a reader must know (no control, fingerprint-only ...) */
    int n_notes;

    td_cmp_dvp *dvp;      /* sorted by ratio, largest first */
    int64_t n_dvp;
} td_cmp_result;

/* k = 4, topk = 5, everything else 0/NULL. */
td_cmp_options td_cmp_options_default(void);

/* Compares B against A. Returns TD_OK with *out filled (the verdict is
 * (*out)->verdict) or TD_EINPUT/TD_EINTERNAL with one line in err and *out
 * NULL when the comparison is refused. Streams: at most one tap (or a block
 * of rows of it) per arm is in memory, and the records of the compared taps
 * of one step (earlier steps' records are spilled, see td_cmp_tap_at). */
int td_compare(const char *path_a, const char *path_b, const td_cmp_options *opt, td_cmp_result **out,
               td_err *err);
void td_cmp_result_free(td_cmp_result *r);
/* Record i (0 <= i < n_taps) of r; NULL when i is out of range. A record that
 * cannot be read back from the temporary file aborts with a message, as
 * running out of memory does. Record r->first (the first divergent tap) stays valid as long as
 * r; any other is a copy in one of TD_CMP_TAP_SLOTS slots that rotate: it
 * stays valid until TD_CMP_TAP_SLOTS - 1 further calls on r. */
#define TD_CMP_TAP_SLOTS 8
const td_cmp_tap *td_cmp_tap_at(const td_cmp_result *r, int64_t i);
/* The most records r held in memory at once while comparing: one step's, the
 * rest being in the temporary file, unless none could be written. */
int64_t td_cmp_records_peak(const td_cmp_result *r);

/* QSA selections (qwen4exp's blk.L.qsa_sel, arch-qwen4exp.md §4.5, §7.1):
 * whether two arms' selections of one token differ only inside the boundary
 * group, where llama.cpp's choice is unspecified. sel_a, sel_b (W): selected
 * positions, -1 pads (any order); score (nb): the token's complete blocks'
 * scores (blk.L.qsa_scores' row up to its first -1); r: block size; thr: the
 * tie tolerance. The cut score is the lowest score among the blocks A
 * selects from; the boundary group is every complete block whose score is
 * within thr of it (thr = 0: exact ties, and the block the budget cuts).
 * Explained (1) when both select the same number of positions and every
 * position one selects and the other does not is in the boundary group;
 * the tail and every block above the cut must then agree. Identical sets: 1.
 * Used by compare and by the state-operations check. */
int td_cmp_qsa_row_explained(const int64_t *sel_a, const int64_t *sel_b, int64_t W, const double *score, int64_t nb,
                             int64_t r, double thr);

/* MoE router selections (blk.L.moe_topk, rank order): whether the two
 * arms' picks of one token differ only by near ties. sel_a, sel_b (K):
 * expert ids in rank order; score, score_b (X): A's and B's scores of the
 * token (moe_probs); thr: the tie tolerance (td_cmp_qsa_tie_thr over the X
 * scores). Explained (1) when both are K distinct ids in 0..X-1 and every
 * pair of experts the two order differently (A ranks u above v, B v above
 * u, an expert not picked ranking below every pick: a pick traded for a
 * drop, or two picks at swapped ranks) is a near tie of A's scores, within
 * thr (the arm's scores, honest within thr, could order them so), that B's
 * own scores order strictly B's way (B picked what its scores say; an exact
 * tie in B is the tie-break convention's, which only the control can vouch
 * for). Pairs, not ranks: trading 0.30 for 0.28 at one rank while another
 * differs by a near tie is not explained. compare leaves a row whose every
 * mismatch the control shows too to the control. Identical rows: 1. */
int td_cmp_topk_row_explained(const int64_t *sel_a, const int64_t *sel_b, int64_t K, const double *score,
                              const double *score_b, int64_t X, double thr);

/* The tie tolerance of one token's QSA selection, the MoE near-tie rule
 * (harness/audit.h): max(4 x the control pair's largest deviation over the
 * row's block scores, the floor of dtype dt x the row's largest |score|).
 * sa, sb: the two arms' qsa_scores row (nb values); ca, cb: the control
 * pair's (both NULL: no control). */
double td_cmp_qsa_tie_thr(const double *sa, const double *sb, const double *ca, const double *cb, int64_t nb,
                          td_dtype dt);

/* Floor of a precision (see above); integer dtypes: 0. */
double td_cmp_floor(td_dtype dt);
/* Spacing of dt's representable numbers at |x| (subnormal spacing below the
 * smallest normal); for f64/f32/f16/bf16 only, 0 for integer dtypes. */
double td_cmp_ulp(double x, td_dtype dt);
/* The ULP histogram's bin of an error of d ULPs (d >= 0 or NaN): round(d)
 * below 1023.5, else 1024 + floor(4 log2(d / 1024)) clamped to 1024..9823. */
int td_cmp_ulp_bin(double d);
/* Filter match: comma-separated fnmatch(3) globs, blanks around an item and
 * empty items ignored; NULL/"" or only empty items match everything. */
int td_cmp_filter_match(const char *filter, const char *name);
/* The producer map above: writes up to max_groups groups of up to 3
 * alternative names for `name`; returns the number of groups (0 = unknown
 * name, use the previous tap). out.norm returns 0 with *wants_last_out = 1. */
int td_cmp_inputs(const char *name, char groups[][3][TD_TAP_NAME_MAX], int max_groups, int *wants_last_out);

static inline const char *td_cmp_fail_name(td_cmp_fail f) {
    switch (f) {
    case TD_CMPF_OK: return "ok";
    case TD_CMPF_BUDGET: return "budget";
    case TD_CMPF_NONFINITE: return "nonfinite";
    case TD_CMPF_INTEGER: return "integer";
    case TD_CMPF_TOP1: return "top1";
    case TD_CMPF_KL: return "kl";
    case TD_CMPF_NONFINITE_BOTH: return "nonfinite_both";
    }
    return "?";
}
static inline const char *td_cmp_method_name(td_cmp_method m) {
    return m == TD_CMP_DATA ? "data" : m == TD_CMP_FINGERPRINT ? "fingerprint" : "integer";
}
static inline const char *td_cmp_ctrl_name(td_cmp_ctrl c) {
    return c == TD_CTRL_DATA ? "data" : c == TD_CTRL_FINGERPRINT ? "fingerprint" : "none";
}

#ifdef __cplusplus
}
#endif
#endif
