/* The rank order of a QSA selection (taps/qsa_rank.h) against rows worked
 * out by hand from the catalog's rule: the tail ascending, then blocks by
 * descending score (equal scores: lower block first), positions ascending in
 * a block, -1 pads. The inputs are scrambled sets, as an arm's top-k gives
 * them. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "qsa_rank.h"

static void expect_row(const int32_t *got, const int32_t *want, int64_t W, const char *what) {
    for (int64_t j = 0; j < W; j++)
        cr_expect_eq(got[j], want[j], "%s: slot %lld: %d, expected %d", what, (long long)j, got[j], want[j]);
}

/* r = 4, query at p = 17: tail 16, 17; complete blocks 0..3 scored
 * 0.5, 2, 0.5, 1. Blocks rank 1, 3, 0, 2 (0 before 2: equal scores). */
static const double k_score[4] = {0.5, 2.0, 0.5, 1.0};

Test(qsa_rank, tail_then_blocks_by_descending_score_then_pads) {
    int32_t sel[13] = {0, 13, 5, 17, 12, 4, 16, 6, 15, 7, 14};
    const int32_t want[13] = {16, 17, 4, 5, 6, 7, 12, 13, 14, 15, 0, -1, -1};
    td_qsa_rank_f64(sel, 11, 13, 17, 4, k_score);
    expect_row(sel, want, 13, "f64");
}

Test(qsa_rank, equal_scores_lower_block_first_positions_ascending) {
    // blocks 0 and 2 tie at 0.5; the arm kept positions of both
    int32_t sel[14] = {9, 2, 17, 14, 8, 5, 1, 12, 16, 6, 15, 4, 13, 7};
    const int32_t want[14] = {16, 17, 4, 5, 6, 7, 12, 13, 14, 15, 1, 2, 8, 9};
    td_qsa_rank_f64(sel, 14, 14, 17, 4, k_score);
    expect_row(sel, want, 14, "tie");
}

Test(qsa_rank, f32_scores_order_exactly_as_they_are) {
    // blocks 0 and 2 one f32 ulp apart (2 first), blocks 1 and 3 equal (1 first): 2, 0, 1, 3
    const float sc[4] = {1.0f, 0.25f, nextafterf(1.0f, 2.0f), 0.25f};
    int32_t sel[12] = {5, 17, 0, 11, 8, 16, 4, 10, 1, 9};
    const int32_t want[12] = {16, 17, 8, 9, 10, 11, 0, 1, 4, 5, -1, -1};
    td_qsa_rank_f32(sel, 10, 12, 17, 4, sc);
    expect_row(sel, want, 12, "f32");
}

Test(qsa_rank, a_row_with_every_visible_position_is_ordered_too) {
    // p = 5, r = 4: tail 4, 5; block 0 complete. The helper orders what it is given; an arm whose rule
    // keeps a dense row ascending (the reference) does not call it there
    const double sc[1] = {3.0};
    int32_t sel[6] = {3, 5, 0, 4, 1, 2};
    const int32_t want[6] = {4, 5, 0, 1, 2, 3};
    td_qsa_rank_f64(sel, 6, 6, 5, 4, sc);
    expect_row(sel, want, 6, "dense");
}

Test(qsa_rank, block_before_is_the_catalog_rule) {
    cr_expect(td_qsa_block_before(2.0, 5, 1.0, 0), "a higher score ranks first");
    cr_expect(!td_qsa_block_before(1.0, 0, 2.0, 5), "a lower score ranks later");
    cr_expect(td_qsa_block_before(1.0, 2, 1.0, 3), "equal scores: the lower block first");
    cr_expect(!td_qsa_block_before(1.0, 3, 1.0, 2), "equal scores: the higher block later");
}
