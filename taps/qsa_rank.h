/* tapdiff: the rank order of a QSA selection, the one definition every arm
 * that emits blk.L.qsa_sel and every reader that orders one shares (the
 * catalog row's meaning, taps/catalog.c; README "qwen4exp"). The order, for
 * a query at position p with block size r:
 *   1. the incomplete tail, positions floor((p+1)/r)*r .. p, ascending;
 *   2. then the positions of complete blocks by descending block score,
 *      equal scores the lower block first;
 *   3. positions ascending inside a block;
 * and -1 pads the row to its W slots. What a selection holds (which blocks,
 * which positions of a cut block) is the arm's business: this only orders it.
 * Scores are a query's block scores (qsa_scores), finite. */
#ifndef TD_QSA_RANK_H
#define TD_QSA_RANK_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when complete block a (score sa) ranks before block b (score sb): a
 * higher score, or an equal one and a lower index. */
static inline int td_qsa_block_before(double sa, int64_t a, double sb, int64_t b) {
    return sa > sb || (sa == sb && a < b);
}

/* Puts the n distinct positions sel[0..n) (each 0..p) in the rank order
 * above, then sets sel[n..W) to -1 (n <= W). score: the query's score of
 * each complete block, b < floor((p+1)/r). */
void td_qsa_rank_f64(int32_t *sel, int64_t n, int64_t W, int64_t p, int64_t r, const double *score);
/* The same with f32 scores (compared exactly as they are). */
void td_qsa_rank_f32(int32_t *sel, int64_t n, int64_t W, int64_t p, int64_t r, const float *score);

#ifdef __cplusplus
}
#endif
#endif
