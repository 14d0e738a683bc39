/* Tests of the rounding-tie report (harness/ties.h): what TD_TIES_MAX
 * counts. A tie is one value rounded at one step and element; the same row
 * rounded again for each matmul it feeds gives copies of it, pinned one by
 * one but counted once, so copies do not use the cap up. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "ties.h"

static td_ties_report rep; // large: not on the stack

/* The f16 tie at (step, elem) with value v, as rounded for matmul `call`. */
static td_act_tie tie(int64_t step, int64_t call, int64_t elem, double v) {
    return (td_act_tie){.step = step, .call = call, .elem = elem, .v = v, .f16 = 1};
}

/* attn_norm's row feeds four matmuls: four pins, one tie; a different
 * element, step or value is another tie. */
Test(ties, copies_of_one_value_count_as_one_tie) {
    memset(&rep, 0, sizeof rep);
    for (int call = 0; call < 4; call++) {
        const td_act_tie t = tie(0, call, 7, 0.5);
        cr_assert_eq(td_ties_add(&rep, &t, 1), 1);
    }
    cr_expect_eq(rep.n_flips, 4);
    cr_expect_eq(rep.n_values, 1, "4 copies of one value counted as %d ties", rep.n_values);
    cr_expect_eq(rep.n_read, 1, "read ties: %d", rep.n_read);
    const td_act_tie others[3] = {tie(0, 0, 8, 0.5), tie(1, 0, 7, 0.5), tie(0, 0, 7, 0.5 + 1.0 / 4096)};
    for (int i = 0; i < 3; i++) cr_assert_eq(td_ties_add(&rep, &others[i], 0), 1);
    cr_expect_eq(rep.n_flips, 7);
    cr_expect_eq(rep.n_values, 4);
    cr_expect_eq(rep.n_read, 1, "found by the search, not read: %d", rep.n_read);
    for (int i = 0; i < 7; i++) cr_expect_eq(rep.read[i], i < 4, "flip %d read %d", i, rep.read[i]);
}

/* A value first pinned by the search and later read from the arm's taps
 * (another matmul's copy of it) is a read value: n_read counts values with
 * any copy read, once each, whatever order the copies came in. */
Test(ties, a_value_read_after_its_search_copy_counts_as_read) {
    memset(&rep, 0, sizeof rep);
    const td_act_tie a = tie(2, 0, 5, 0.5), b = tie(2, 1, 5, 0.5), c = tie(2, 2, 5, 0.5);
    cr_assert_eq(td_ties_add(&rep, &a, 0), 1);
    cr_expect_eq(rep.n_read, 0);
    cr_assert_eq(td_ties_add(&rep, &b, 1), 1);
    cr_expect_eq(rep.n_read, 1, "a value read on its second copy counted as %d read", rep.n_read);
    cr_assert_eq(td_ties_add(&rep, &c, 1), 1);
    cr_expect_eq(rep.n_read, 1, "one value read twice counted as %d", rep.n_read);
    cr_expect_eq(rep.n_values, 1);
}

/* TD_TIES_MAX values of three copies each all fit (counted by copy, a third
 * of them would); past it a new value is refused and a copy of a kept one
 * is still taken. */
Test(ties, the_cap_counts_values_not_copies) {
    memset(&rep, 0, sizeof rep);
    for (int64_t e = 0; e < TD_TIES_MAX; e++)
        for (int call = 0; call < 3; call++) {
            const td_act_tie t = tie(0, call, e, 0.5);
            cr_assert_eq(td_ties_add(&rep, &t, 1), 1, "value %lld copy %d refused (%d flips, %d values)",
                         (long long)e, call, rep.n_flips, rep.n_values);
        }
    cr_expect_eq(rep.n_values, TD_TIES_MAX);
    cr_expect_eq(rep.n_flips, 3 * TD_TIES_MAX);
    const td_act_tie extra = tie(0, 0, TD_TIES_MAX, 0.5), copy = tie(0, 3, 5, 0.5);
    cr_expect_eq(td_ties_add(&rep, &extra, 0), 0, "a value past the cap was taken");
    cr_expect_eq(rep.n_flips, 3 * TD_TIES_MAX);
    cr_expect_eq(td_ties_add(&rep, &copy, 0), 1, "a copy of a kept value was refused");
    cr_expect_eq(rep.n_values, TD_TIES_MAX);
    cr_expect_eq(rep.n_flips, 3 * TD_TIES_MAX + 1);
}

/* A searched tie is described by what it rounded: flash attention's output
 * accumulator (site blk.L.attn_acc, element pair << 32 | slot), attention's
 * probabilities (blk.L.attn_probs, pair << 32 | position; pair 0 too, whose
 * element alone looks like an operand's), attention's f16 operands. */
Test(ties, attention_parts_are_described_by_their_site) {
    memset(&rep, 0, sizeof rep);
    td_act_tie t[3] = {tie(2, 0, (5LL << 32) | 70, 3.5 - 1e-6), tie(1, 1, 3, 0.5 + 1e-6), tie(1, 2, 9, 7.5)};
    snprintf(t[0].site, sizeof t[0].site, "blk.1.attn_acc");
    snprintf(t[1].site, sizeof t[1].site, "blk.0.attn_probs");
    snprintf(t[2].site, sizeof t[2].site, "blk.0.attn_f16");
    for (int i = 0; i < 3; i++) {
        snprintf(t[i].tap, sizeof t[i].tap, "blk.%d.attn_ctx", i ? 0 : 1);
        cr_assert_eq(td_ties_add(&rep, &t[i], 0), 1);
    }
    char d[1024];
    td_ties_describe(&rep, d, sizeof d);
    cr_log_info("%s", d);
    cr_expect(strstr(d, "step 2: f16 flash-attention accumulator 3.499999") && strstr(d, "pair 5, slot 70"), "%s", d);
    cr_expect(strstr(d, "step 1: f16 probability 0.500001") && strstr(d, "pair 0, position 3"), "%s", d);
    cr_expect(strstr(d, "step 1: f16 operand 7.5 ulps above the lower f16 (element 9"), "%s", d);
    cr_expect_null(strstr(d, "probability 3.49"), "the accumulator read as a probability: %s", d);
}
