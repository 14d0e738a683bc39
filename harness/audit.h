/* tapdiff router audit: how close each MoE layer's top-k selection is to a
 * tie, in one arm or two, and whether two arms' different selections are
 * explained by such (near-)ties or point at a bug. A library: no printing,
 * no exit(); the renderers at the end write to the stream they are given.
 * The spec: ../shared/spec/primitives.md §5 (routing), §5.1 (tie-breaking:
 * the order among exactly equal router scores is unspecified, so an exact
 * tie at the k-th boundary is a known source of divergence).
 *
 * ---- What is read (per step, per MoE layer L, per token = row t) ----------
 *  blk.L.moe_topk  [T, K] integers: the experts the arm selected.
 *  scores          blk.L.moe_probs [T, X]; when it has no data, moe_logits
 *                  (softmax is monotone: the ranking is the same). The score
 *                  tap used is named in the result (score_tap).
 *  Both need data (a full-mode tap); a MoE layer is a layer with a moe_topk
 *  tap in step 0; every step must have the same layers. K < X.
 *
 * ---- Per token --------------------------------------------------------------
 *  ranks    experts sorted by score, descending (lower index first among
 *           equal scores); s_K and s_K+1 are the scores of ranks K and K+1
 *           (1-based), margin = s_K - s_K+1 >= 0.
 *  exact    margin == 0: the two scores are bitwise equal in the stored
 *           dtype (the reader converts f64/f32/f16/bf16 exactly to double).
 *  bf16/f16 the pair would tie after rounding both scores to bf16 / f16
 *           (round to nearest even, from the stored value). Exact ties
 *           count here too.
 *  noise    with a control file C (same tokens, e.g. ref32 next to a ref
 *           file): noise(t) = max over experts |s_C[t,e] - s_A[t,e]|, the
 *           control's deviation from the FIRST file at the same step, token
 *           and score tap. Without a control: 0 (the floor alone).
 *  threshold thr(t) = max(near_k * noise(t), floor(dtype) * max|s_K|,|s_K+1|)
 *           with near_k = 4 (a rounding moves the margin of two experts by up
 *           to twice one arm's score error; two honest arms, each within the
 *           control's noise, move it by up to 4 noise) and the relative floor
 *           of the arm's stored precision: 16 unit roundoffs (f32 2^-20,
 *           f16 2^-7, bf16 2^-4), f64 1e-13 (the per-precision floors of
 *           compare.h, so both tools call the same thing rounding).
 *  near     0 < margin <= thr(t).
 *  tie-break order: for every pair of experts i < j with bitwise equal
 *           scores of which at least one is selected, "lower first" when i
 *           ranks before j in moe_topk (or only i is selected), "higher
 *           first" otherwise. The reference (and a stable descending sort)
 *           gives lower first.
 *  not top-k: the selection is not a top-k of the arm's OWN scores
 *           (v = max unselected score - min selected score > 0). Explained
 *           when v <= thr(t) (a near-tie the arm resolved from other
 *           roundings, e.g. scores computed in another precision than
 *           stored), unexplained otherwise.
 *  non-finite scores: the token is counted in n_nonfinite and left out of
 *           the tie statistics; its selection cannot be explained.
 *
 * ---- Two files: selection disagreements ------------------------------------
 *  The two arms must have the same steps (kind, pos0, n_tokens), the same
 *  inp.tokens where both have it, and the same MoE layers, X and K; else the
 *  audit is refused (TD_EINPUT). At each token, the SETS of selected experts
 *  are compared (the order inside a selection does not change the result,
 *  §5). With x_A(S) = max_{e not in S} s_A[e] - min_{e in S} s_A[e] (how far
 *  S is from a top-k of A's scores; <= 0: it is one), a disagreement is
 *  explained when, in one arm's scores, BOTH selections are top-k within
 *  that arm's threshold: max(x_A(S_A), x_A(S_B)) <= thr_A(t), or the same
 *  on B's scores with thr_B(t). Two different sets can only both be (near)
 *  top-k when the scores at the k-th boundary (nearly) tie. It is explained
 *  by an exact tie when that holds with thr = 0. (One arm's set being a
 *  top-k of the other's scores is not enough: an arm that reports honest
 *  scores and selects wrongly would pass.)
 *
 * ---- Verdict -----------------------------------------------------------------
 *  TD_OK when at least one MoE layer was audited and nothing is unexplained
 *  (disagreements between the arms, selections that are not a top-k of the
 *  arm's own scores, selections at non-finite scores); TD_DIVERGENT
 *  otherwise, with one line in reason. An audit of a file without MoE taps
 *  audited nothing and is DIVERGENT ("no MoE router taps"), never a pass.
 * ---------------------------------------------------------------------------
 */
#ifndef TD_AUDIT_H
#define TD_AUDIT_H

#include <stdint.h>
#include <stdio.h>

#include "tapfile.h"
#include "td_common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TD_AUDIT_NEAR_K 4.0
/* Margin histogram: bin 0 holds margins < 10^LO (exact ties excluded, they
 * have their own count), bin i >= 1 holds [10^(LO+(i-1)w), 10^(LO+iw)), the
 * last bin everything above. */
#define TD_AUDIT_HIST_LO (-16.0)
#define TD_AUDIT_HIST_W 0.5
#define TD_AUDIT_HIST_BINS 38
/* Expert ids kept per selection in a reported location (K may be larger). */
#define TD_AUDIT_SEL_MAX 16

/* One token where something happened. */
typedef struct td_audit_where {
    int64_t step;   /* -1: none */
    int64_t row;    /* token within the step */
    int64_t pos;    /* its position (pos0 + row) */
    int64_t token;  /* inp.tokens[row], -1 when the arm has no inp.tokens data */
    int n_sel;      /* min(K, TD_AUDIT_SEL_MAX) */
    int sel_a[TD_AUDIT_SEL_MAX], sel_b[TD_AUDIT_SEL_MAX]; /* in rank order; sel_b: two-file only */
    double margin_a, margin_b; /* s_K - s_K+1 in each arm (NaN when not applicable) */
    double thr_a, thr_b;       /* their thresholds */
    double excess;             /* how far the selection is from a top-k of the scores (see above) */
} td_audit_where;

typedef struct td_audit_layer {
    int32_t layer;
    char score_tap[16];   /* "moe_probs" or "moe_logits" */
    td_dtype dtype;       /* of the score tap (step 0) */
    int64_t X, K;
    int64_t n_tokens;
    int64_t n_nonfinite;
    int64_t n_exact;      /* s_K == s_K+1 */
    int64_t n_tie_bf16;   /* would tie in bf16 (exact ones included) */
    int64_t n_tie_f16;
    int64_t n_near;       /* 0 < margin <= thr */
    int64_t n_tb_lower;   /* exact-tie pairs ranked lower index first */
    int64_t n_tb_higher;
    int64_t n_not_topk;           /* selection is not a top-k of the own scores */
    int64_t n_not_topk_unexplained;
    double min_margin;    /* smallest non-zero margin; +inf if none */
    double max_thr;       /* largest threshold used */
    int64_t hist[TD_AUDIT_HIST_BINS]; /* log10(margin) for margin > 0 */
    td_audit_where first_exact;      /* step -1 when none */
    td_audit_where first_unexplained;
} td_audit_layer;

typedef struct td_audit_arm {
    char *path;
    char *backend, *precision, *decode; /* root attributes, "" when absent */
    td_audit_layer *layers;
    int n_layers;
} td_audit_arm;

typedef struct td_audit_pair {
    int32_t layer;
    int64_t n_tokens;
    int64_t n_disagree;
    int64_t n_explained_exact; /* explained with thr = 0 */
    int64_t n_explained_near;  /* explained only within thr */
    int64_t n_unexplained;
    td_audit_where first_explained;
    td_audit_where first_unexplained;
} td_audit_pair;

typedef struct td_audit_result {
    td_audit_arm arms[2];
    int n_arms;              /* 1 or 2 */
    char *path_ctrl;         /* NULL without a control */
    double near_k;
    char noise_note[320];    /* how the threshold was set, for the reports */
    int64_t n_steps;
    td_audit_pair *pairs;    /* two files: one per layer */
    int n_pairs;
    int64_t n_unexplained;   /* everything unexplained, both arms and the pair */
    int verdict;             /* TD_OK or TD_DIVERGENT */
    char reason[512];
} td_audit_result;

/* Audits `path` (and `other` when not NULL; `control` when not NULL gives
 * the noise). Returns TD_OK with *out filled (verdict inside) or TD_EINPUT
 * with one line in err and *out NULL: an unreadable file, a score or topk
 * tap without data, an expert id out of range or repeated, K >= X, arms (or
 * the control) with other steps, tokens, layers or shapes. Streams: per
 * arm, one step's [T, X] scores and [T, K] selection of one layer at a time. */
int td_audit(const char *path, const char *other, const char *control, td_audit_result **out, td_err *err);
void td_audit_result_free(td_audit_result *r);

/* ---- The QSA indexer's selection (qwen4exp, arch-qwen4exp.md §4.5, §7.1) ----
 * Per step, per layer with blk.L.qsa_sel [T, W] (positions, -1 pads) and
 * blk.L.qsa_scores [T, NB] (complete blocks; -1 where a block is not
 * complete for the token), per SPARSE token (p + 1 > W; a dense one selects
 * every visible position): each visible position s scores its block's score
 * (the tail T_p..p, T_p = floor((p+1)/r)·r, scores 1e9 as in llama.cpp, so
 * it always ranks first); the selection is a top-W of those position scores.
 * The block size r is read from the scores' -1 pattern (the first position
 * whose row has a complete block is r - 1; every row must then have
 * floor((p+1)/r) of them). With s_W and s_W+1 the W-th and (W+1)-th largest
 * position scores:
 *   cut      (W - |tail|) is not a multiple of r: the budget cuts a block,
 *            whose positions tie by construction (s_W = s_W+1, counted apart)
 *   exact    s_W = s_W+1 between two different blocks (a block tie at the cut)
 *   f16      the two would tie after rounding both to f16
 *   near     0 < margin <= thr, thr as for routers (4 x control noise over the
 *            token's complete-block scores, or the precision floor)
 *   not top-W the selection is not a top-W of the arm's own position scores
 *            (explained within thr), or holds a position > p or twice.
 * Two files: the SETS of selected positions per token; a disagreement is
 * explained when, on one arm's scores, both sets are top-W within that arm's
 * threshold (exactly: thr = 0), as for routers. Verdict TD_OK when some QSA
 * layer was audited and nothing is unexplained. */
typedef struct td_audit_qsa_layer {
    int32_t layer;
    int64_t r, W;
    int64_t n_tokens;        /* all tokens seen */
    int64_t n_sparse;        /* with a boundary (p + 1 > W) */
    int64_t n_cut;           /* the budget cuts a block */
    int64_t n_exact;         /* block tie at the W-th position (cut blocks excluded) */
    int64_t n_tie_f16;       /* would tie in f16 (exact ones included, cut blocks excluded) */
    int64_t n_near;
    int64_t n_not_topw, n_not_topw_unexplained;
    int64_t n_disagree, n_explained_exact, n_explained_near, n_unexplained; /* two files */
    td_audit_where first_unexplained; /* sel_a/sel_b: the first positions of each selection */
} td_audit_qsa_layer;

typedef struct td_audit_qsa_result {
    int n_arms;
    td_audit_qsa_layer *layers; /* the first file's view; pair counts filled with two files */
    int n_layers;
    int64_t n_steps;
    int64_t n_unexplained;
    int verdict;
    char reason[512];
} td_audit_qsa_result;

int td_audit_qsa(const char *path, const char *other, const char *control, td_audit_qsa_result **out, td_err *err);
void td_audit_qsa_result_free(td_audit_qsa_result *r);
/* One Markdown table of the result on f. */
void td_audit_qsa_print(FILE *f, const td_audit_qsa_result *r);

/* Nearest bf16 / f16 value of x (round to nearest, ties to even; overflow
 * to +-inf; NaN stays NaN), as a double. */
double td_audit_round_bf16(double x);
double td_audit_round_f16(double x);
/* The relative floor of a precision is compare.h's td_cmp_floor. */

#ifdef __cplusplus
}
#endif
#endif
