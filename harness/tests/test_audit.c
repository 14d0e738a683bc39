/* Tests of the router audit (harness/audit.h) and `tapdiff audit`.
 *
 * The expected numbers never come from the audit code:
 *  - on the qwen3moe-ties fixture, the planted exact ties are the EVEN token
 *    ids in layer 0 (fixtures.h), counted here from the token list the run
 *    consumed (the prompt below and the runner's record of the fed tokens);
 *  - a copy of the reference file with the tie broken the other way (expert
 *    3 instead of 2 at exactly the tie tokens) must disagree at exactly those
 *    tokens, all explained; a copy changed at one NON-tie token must show one
 *    unexplained disagreement;
 *  - small hand-made files whose margins, noise and bf16/f16 roundings are
 *    worked out in the comments. */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "audit.h"
#include "fixtures.h"
#include "runner.h"
#include "tap.h"
#include "tapfile.h"
#include "tapgen.h"
#include "td_test.h"

static char tmp[256];
static char model[512];

static void mk_tmp(void) {
    td_test_tmpdir(tmp, sizeof tmp, "audit");
}

static void rm_tmp(void) { td_test_rmdir(tmp); }

TestSuite(audit, .init = mk_tmp, .fini = rm_tmp, .timeout = 120);

static const char *in_tmp(const char *name) { return td_test_path(tmp, name); }

/* ------------------------------------------------------------------------ */
/* Reference runs on the tie fixture                                          */

/* 16 prompt ids, even and odd mixed (8 even: 2 4 4 16 8 10 20 22). */
static const int32_t prompt[16] = {2, 7, 4, 4, 9, 11, 16, 3, 8, 5, 10, 13, 20, 21, 22, 1};
#define N_STEPS 4

typedef struct run_out {
    int32_t fed[N_STEPS];
    int64_t n_even; /* tie tokens among everything consumed */
    int64_t n_tokens;
} run_out;

static void write_fixture(void) {
    td_err e;
    cr_assert_eq(td_fixture_write(TD_FIXTURE_TIES_NAME, tmp, model, sizeof model, &e), 0, "%s", e.msg);
}

static void run_ref(const char *backend, const char *out, run_out *ro) {
    td_run_config c;
    td_run_config_init(&c);
    c.model_path = model;
    c.backend = backend;
    c.prompt = prompt;
    c.n_prompt = 16;
    c.n_steps = N_STEPS;
    c.tap_path = out;
    td_run_result res;
    td_err e;
    cr_assert_eq(td_run(&c, &res, &e), 0, "%s", e.msg);
    if (ro) {
        memset(ro, 0, sizeof *ro);
        for (int i = 0; i < 16; i++) ro->n_even += prompt[i] % 2 == 0;
        for (int i = 0; i < N_STEPS; i++) {
            ro->fed[i] = res.fed[i];
            ro->n_even += res.fed[i] % 2 == 0;
        }
        ro->n_tokens = 16 + N_STEPS;
    }
    td_run_result_free(&res);
}

/* ------------------------------------------------------------------------ */
/* Copy a tap file through the reader and the writer, with a hook            */


/* Breaks the planted tie the other way (a tg_copy perturbation, tapgen.h):
 * at every tie token of layer 0, expert b (3) is selected instead of a (2).
 * Counts the rows changed. inp.tokens is the first tap of every step, so the
 * tokens of the rows are known by the time moe_topk comes. */
typedef struct reverse_ties {
    int64_t changed;
    int64_t step;       /* the step `tokens` belongs to */
    int64_t tokens[64];
} reverse_ties;

static void hook_reverse_ties(void *user, int64_t step, const td_tap_info *ti, double *v, uint64_t n) {
    reverse_ties *rt = user;
    cr_assert(ti->has_data, "%s has no data", ti->name);
    if (!strcmp(ti->name, "inp.tokens")) {
        cr_assert_leq(n, 64);
        for (uint64_t k = 0; k < n; k++) rt->tokens[k] = (int64_t)v[k];
        rt->step = step;
        return;
    }
    const td_fixture_ties_plan *p = td_fixture_ties();
    char name[64];
    snprintf(name, sizeof name, "blk.%u.moe_topk", p->layer);
    if (strcmp(ti->name, name)) return;
    cr_assert_eq(rt->step, step, "%s before inp.tokens in step %lld", name, (long long)step);
    const int64_t T = ti->shape[0], K = ti->shape[1];
    for (int64_t t = 0; t < T; t++) {
        if (!td_fixture_ties_is_tie_token((int32_t)rt->tokens[t])) continue;
        int found = 0;
        for (int64_t j = 0; j < K; j++)
            if (v[t * K + j] == (double)p->expert_a) {
                v[t * K + j] = (double)p->expert_b;
                found = 1;
            }
        cr_assert(found, "tie token %lld: the reference did not select expert %u", (long long)rt->tokens[t],
                  p->expert_a);
        rt->changed++;
    }
}

/* Changes the selection at ONE non-tie token (the first odd token of the
 * prefill, layer 0): its lower-ranked expert is replaced by the expert with
 * the smallest probability there, far from any tie. */
typedef struct nontie {
    int64_t row;  /* set by the test: the prefill row to change */
    double probs[TD_FIXTURE_TIES_X];
    int64_t done;
} nontie;

static void hook_nontie(void *user, int64_t step, const td_tap_info *ti, double *v, uint64_t n) {
    (void)n;
    nontie *nt = user;
    cr_assert(ti->has_data, "%s has no data", ti->name);
    if (step != 0) return;
    const int64_t X = TD_FIXTURE_TIES_X;
    if (!strcmp(ti->name, "blk.0.moe_probs"))
        for (int64_t e = 0; e < X; e++) nt->probs[e] = v[nt->row * X + e]; // moe_probs comes before moe_topk
    if (strcmp(ti->name, "blk.0.moe_topk")) return;
    const int64_t K = ti->shape[1];
    int64_t lowest = 0;
    for (int64_t e = 1; e < X; e++)
        if (nt->probs[e] < nt->probs[lowest]) lowest = e;
    v[nt->row * K + (K - 1)] = (double)lowest;
    nt->done = 1;
}

/* ------------------------------------------------------------------------ */
/* The binary                                                                 */

/* Runs `tapdiff ARGS` with stdout into OUT_FILE; returns the exit status. */
static int run_tapdiff(const char *args, const char *out_file) { return td_test_tapdiff_sh(args, out_file, 0); }

static char *slurp(const char *path) { return td_test_slurp(path, NULL); }

/* ------------------------------------------------------------------------ */
/* The planted ties                                                           */

Test(audit, planted_exact_tie_rate_is_reported_exactly) {
    write_fixture();
    run_out ro;
    run_ref("ref", in_tmp("a.h5"), &ro);
    cr_assert(ro.n_even > 0 && ro.n_even < ro.n_tokens, "the prompt mixes even and odd ids");

    td_audit_result *r = NULL;
    td_err e;
    cr_assert_eq(td_audit(in_tmp("a.h5"), NULL, NULL, &r, &e), 0, "%s", e.msg);
    cr_assert_eq(r->n_arms, 1);
    cr_assert_eq(r->arms[0].n_layers, 2, "qwen3moe-ties has 2 MoE blocks");
    const td_audit_layer *L0 = &r->arms[0].layers[0], *L1 = &r->arms[0].layers[1];
    cr_assert_eq(L0->layer, 0);
    cr_assert_eq(L0->X, 8);
    cr_assert_eq(L0->K, 2);
    cr_assert_eq(L0->n_tokens, ro.n_tokens);
    cr_assert_eq(L0->n_exact, ro.n_even, "layer 0 exact ties: %lld, planted (even ids): %lld", (long long)L0->n_exact,
                 (long long)ro.n_even);
    // rounding cannot undo an exact tie
    cr_assert_geq(L0->n_tie_bf16, ro.n_even);
    cr_assert_geq(L0->n_tie_f16, ro.n_even);
    // the reference breaks ties by the lower index (primitives.md §5.1):
    // one tied pair (2, 3) per tie token, 2 selected
    cr_assert_eq(L0->n_tb_lower, ro.n_even);
    cr_assert_eq(L0->n_tb_higher, 0);
    cr_assert(td_fixture_ties_is_tie_token((int32_t)L0->first_exact.token));
    cr_assert_eq(L0->n_not_topk, 0);
    // the other layer's router is random: no planted tie
    cr_assert_eq(L1->n_tokens, ro.n_tokens);
    cr_assert_eq(L1->n_exact, 0);
    cr_assert_eq(r->verdict, TD_OK, "%s", r->reason);
    td_audit_result_free(r);
}

Test(audit, reversed_tie_break_disagrees_only_at_tie_tokens_all_explained) {
    write_fixture();
    run_out ro;
    run_ref("ref", in_tmp("a.h5"), &ro);
    reverse_ties rt = {.step = -1};
    tg_copy(in_tmp("a.h5"), in_tmp("rev.h5"), hook_reverse_ties, &rt, NULL, NULL, NULL, NULL);
    cr_assert_eq(rt.changed, ro.n_even);

    td_audit_result *r = NULL;
    td_err e;
    cr_assert_eq(td_audit(in_tmp("a.h5"), in_tmp("rev.h5"), NULL, &r, &e), 0, "%s", e.msg);
    cr_assert_eq(r->n_pairs, 2);
    const td_audit_pair *p0 = &r->pairs[0], *p1 = &r->pairs[1];
    cr_assert_eq(p0->n_disagree, ro.n_even, "disagreements %lld, tie tokens %lld", (long long)p0->n_disagree,
                 (long long)ro.n_even);
    cr_assert_eq(p0->n_explained_exact, ro.n_even);
    cr_assert_eq(p0->n_unexplained, 0);
    cr_assert(td_fixture_ties_is_tie_token((int32_t)p0->first_explained.token));
    cr_assert_eq(p1->n_disagree, 0);
    // the copy breaks every tie by the higher index
    cr_assert_eq(r->arms[1].layers[0].n_tb_higher, ro.n_even);
    cr_assert_eq(r->arms[1].layers[0].n_tb_lower, 0);
    cr_assert_eq(r->n_unexplained, 0);
    cr_assert_eq(r->verdict, TD_OK, "%s", r->reason);
    td_audit_result_free(r);

    char args[1024];
    snprintf(args, sizeof args, "audit '%s' '%s'", in_tmp("a.h5"), in_tmp("rev.h5"));
    cr_assert_eq(run_tapdiff(args, in_tmp("out.txt")), 0);
}

Test(audit, changed_non_tie_selection_is_unexplained) {
    write_fixture();
    run_ref("ref", in_tmp("a.h5"), NULL);
    nontie nt = {.row = -1};
    for (int i = 0; i < 16 && nt.row < 0; i++)
        if (!td_fixture_ties_is_tie_token(prompt[i])) nt.row = i;
    tg_copy(in_tmp("a.h5"), in_tmp("bug.h5"), hook_nontie, &nt, NULL, NULL, NULL, NULL);
    cr_assert(nt.done);

    td_audit_result *r = NULL;
    td_err e;
    cr_assert_eq(td_audit(in_tmp("a.h5"), in_tmp("bug.h5"), NULL, &r, &e), 0, "%s", e.msg);
    const td_audit_pair *p0 = &r->pairs[0];
    cr_assert_eq(p0->n_disagree, 1);
    cr_assert_eq(p0->n_unexplained, 1);
    cr_assert_eq(p0->first_unexplained.step, 0);
    cr_assert_eq(p0->first_unexplained.row, nt.row);
    cr_assert_eq(p0->first_unexplained.token, prompt[nt.row]);
    cr_assert_eq(r->pairs[1].n_disagree, 0);
    // the copy's selection is no top-k of its own (unchanged) probabilities
    cr_assert_eq(r->arms[1].layers[0].n_not_topk_unexplained, 1);
    cr_assert_eq(r->verdict, TD_DIVERGENT);
    td_audit_result_free(r);

    char args[1024];
    snprintf(args, sizeof args, "audit '%s' '%s'", in_tmp("a.h5"), in_tmp("bug.h5"));
    cr_assert_eq(run_tapdiff(args, in_tmp("out.txt")), 1);
    // and the single arm alone already fails its own consistency check
    snprintf(args, sizeof args, "audit '%s'", in_tmp("bug.h5"));
    cr_assert_eq(run_tapdiff(args, in_tmp("out1.txt")), 1);
}

Test(audit, control_arm_finds_no_near_ties_in_the_fixture) {
    // the fixture's router gaps are O(1) apart from the planted exact ties:
    // with ref32 as the control, nothing is a near tie, and ref32 selects
    // the same experts as ref everywhere (its ties are as exact as ref's)
    write_fixture();
    run_out ro;
    run_ref("ref", in_tmp("a.h5"), &ro);
    run_ref("ref32", in_tmp("c.h5"), NULL);
    td_audit_result *r = NULL;
    td_err e;
    cr_assert_eq(td_audit(in_tmp("a.h5"), in_tmp("c.h5"), in_tmp("c.h5"), &r, &e), 0, "%s", e.msg);
    cr_assert_not_null(r->path_ctrl);
    for (int a = 0; a < 2; a++) {
        cr_assert_eq(r->arms[a].layers[0].n_near, 0);
        cr_assert_eq(r->arms[a].layers[1].n_near, 0);
        cr_assert_eq(r->arms[a].layers[0].n_exact, ro.n_even);
    }
    // the control measured the f32 noise: at least one f32 rounding of a
    // probability ~0.1 (2^-24 * 0.1 ~ 6e-9) times 4, far above the f64 floor
    // (1e-13 x score) that is all a file without control gets
    for (int i = 0; i < 2; i++) {
        cr_assert_gt(r->arms[0].layers[i].max_thr, 1e-9, "layer %d threshold %g", i, r->arms[0].layers[i].max_thr);
    }
    cr_assert_eq(r->pairs[0].n_disagree + r->pairs[1].n_disagree, 0);
    cr_assert_eq(r->verdict, TD_OK, "%s", r->reason);
    td_audit_result_free(r);
}

/* ------------------------------------------------------------------------ */
/* Hand-made files                                                            */

/* One prefill step, T = 4 tokens, X = 4 experts, K = 2, f64 probabilities.
 * probs may be NULL for a file without MoE taps. */
static void write_synth(const char *path, const int32_t *tok, const double *probs, const int32_t *topk) {
    td_tap_sink *s = NULL;
    td_err e;
    td_tap_options o = td_tap_options_default();
    cr_assert_eq(td_tap_sink_open(&s, path, &o, &e), 0, "%s", e.msg);
    td_tap_sink_attr_str(s, "backend", "hand");
    td_tap_sink_attr_str(s, "precision", "f64");
    cr_assert_eq(td_tap_step_begin(s, TD_STEP_PREFILL, 0, 4, &e), 0, "%s", e.msg);
    const int64_t sh_t[1] = {4}, sh_p[2] = {4, 4}, sh_k[2] = {4, 2};
    td_tap_emit(s, -1, "inp.tokens", TD_DT_I32, tok, 1, sh_t);
    if (probs) {
        td_tap_emit(s, 0, "moe_probs", TD_DT_F64, probs, 2, sh_p);
        td_tap_emit(s, 0, "moe_topk", TD_DT_I32, topk, 2, sh_k);
    }
    const double logits[4 * 3] = {0};
    const int64_t sh_l[2] = {4, 3};
    td_tap_emit(s, -1, "out.logits", TD_DT_F64, logits, 2, sh_l);
    cr_assert_eq(td_tap_step_end(s, &e), 0, "%s", e.msg);
    cr_assert_eq(td_tap_sink_close(s, &e), 0, "%s", e.msg);
}

static const int32_t tok4[4] = {5, 6, 7, 8};
/* Arm A. row 0: margin 0.1 (clear). row 1: experts 1 and 2 are 1e-9 apart.
 * row 2: exact tie 0.25 = 0.25. row 3: 0.5 against 0.5 - 2^-10. */
static double pa[16];
static const int32_t ka[8] = {0, 1, 0, 1, 0, 1, 0, 1};

static void fill_pa(void) {
    const double v[16] = {0.4, 0.3, 0.2, 0.1, 0.4, 0.3, 0.3 - 1e-9, 0.0, 0.5, 0.25, 0.25, 0.0, 0.7, 0.5,
                          0.5 - 0x1p-10, 0.1};
    memcpy(pa, v, sizeof v);
}

Test(audit, hand_made_bf16_f16_and_exact_ties) {
    fill_pa();
    write_synth(in_tmp("a.h5"), tok4, pa, ka);
    td_audit_result *r = NULL;
    td_err e;
    cr_assert_eq(td_audit(in_tmp("a.h5"), NULL, NULL, &r, &e), 0, "%s", e.msg);
    const td_audit_layer *L = &r->arms[0].layers[0];
    cr_assert_eq(L->n_tokens, 4);
    cr_assert_eq(L->n_exact, 1); // row 2
    // bf16 (8 significant bits): row 1 (0.3 and 0.3 - 1e-9 round alike),
    // row 2 (exact), row 3 (0.5 - 2^-10 is halfway between 0.5 - 2^-9 and
    // 0.5; ties to even give 0.5). f16 (11 bits) keeps 0.5 - 2^-10 apart.
    cr_assert_eq(L->n_tie_bf16, 3);
    cr_assert_eq(L->n_tie_f16, 2);
    // no control: the f64 floor 1e-13 x 0.3 is far below 1e-9: no near tie
    cr_assert_eq(L->n_near, 0);
    cr_assert(fabs(L->min_margin - 1e-9) < 1e-15, "min margin %g", L->min_margin);
    // row 2: experts 1 and 2 tie, 1 selected: lower first
    cr_assert_eq(L->n_tb_lower, 1);
    cr_assert_eq(L->n_tb_higher, 0);
    cr_assert_eq(r->verdict, TD_OK, "%s", r->reason);
    td_audit_result_free(r);
}

Test(audit, near_tie_is_explained_only_with_the_control_noise) {
    fill_pa();
    write_synth(in_tmp("a.h5"), tok4, pa, ka);
    // arm B sees experts 1 and 2 of row 1 the other way round (and picks 2),
    // breaks row 2's exact tie the other way, and lists row 0's experts in
    // another order (the same set: not a disagreement)
    double pb[16];
    memcpy(pb, pa, sizeof pb);
    pb[5] = 0.3 - 1e-9, pb[6] = 0.3;
    const int32_t kb[8] = {1, 0, 0, 2, 0, 2, 0, 1};
    write_synth(in_tmp("b.h5"), tok4, pb, kb);
    // the control deviates from A by 1e-8 at row 1: noise 1e-8, threshold
    // 4e-8 > the 1e-9 margin; elsewhere it equals A
    double pc[16];
    memcpy(pc, pa, sizeof pc);
    pc[6] += 1e-8;
    write_synth(in_tmp("c.h5"), tok4, pc, ka);

    td_audit_result *r = NULL;
    td_err e;
    cr_assert_eq(td_audit(in_tmp("a.h5"), in_tmp("b.h5"), NULL, &r, &e), 0, "%s", e.msg);
    cr_assert_eq(r->pairs[0].n_disagree, 2);
    cr_assert_eq(r->pairs[0].n_explained_exact, 1); // row 2
    cr_assert_eq(r->pairs[0].n_unexplained, 1);     // row 1: 1e-9 is not rounding for f64 arms
    cr_assert_eq(r->pairs[0].first_unexplained.row, 1);
    cr_assert_eq(r->verdict, TD_DIVERGENT);
    td_audit_result_free(r);

    cr_assert_eq(td_audit(in_tmp("a.h5"), in_tmp("b.h5"), in_tmp("c.h5"), &r, &e), 0, "%s", e.msg);
    cr_assert_eq(r->pairs[0].n_disagree, 2);
    cr_assert_eq(r->pairs[0].n_explained_exact, 1);
    cr_assert_eq(r->pairs[0].n_explained_near, 1);
    cr_assert_eq(r->pairs[0].n_unexplained, 0);
    cr_assert_eq(r->arms[0].layers[0].n_near, 1); // row 1, in A's own scores
    cr_assert(fabs(r->arms[0].layers[0].max_thr - 4e-8) < 1e-12, "threshold %g", r->arms[0].layers[0].max_thr);
    cr_assert_eq(r->verdict, TD_OK, "%s", r->reason);
    td_audit_result_free(r);

    char args[1024];
    snprintf(args, sizeof args, "audit '%s' '%s' --control '%s'", in_tmp("a.h5"), in_tmp("b.h5"), in_tmp("c.h5"));
    cr_assert_eq(run_tapdiff(args, in_tmp("o1.txt")), 0);
    snprintf(args, sizeof args, "audit '%s' '%s'", in_tmp("a.h5"), in_tmp("b.h5"));
    cr_assert_eq(run_tapdiff(args, in_tmp("o2.txt")), 1);
}

Test(audit, rounding_to_bf16_and_f16) {
    // bf16: 8 significant bits, spacing 2^-7 at 1
    cr_assert_eq(td_audit_round_bf16(1 + 0x1p-8), 1.0);                // halfway, to even
    cr_assert_eq(td_audit_round_bf16(1 + 3 * 0x1p-8), 1 + 0x1p-6);     // halfway between 1+2^-7 and 1+2^-6
    cr_assert_eq(td_audit_round_bf16(1 + 0x1p-8 + 0x1p-20), 1 + 0x1p-7); // above halfway
    cr_assert_eq(td_audit_round_bf16(-0.1), -0.10009765625);           // 0x3dcd -> 0.10009765625
    cr_assert(isinf(td_audit_round_bf16(0x1p128)));
    cr_assert(isnan(td_audit_round_bf16(NAN)));
    // f16: 11 significant bits, max 65504, smallest subnormal 2^-24
    cr_assert_eq(td_audit_round_f16(1 + 0x1p-11), 1.0);
    cr_assert_eq(td_audit_round_f16(1 + 0x1p-10), 1 + 0x1p-10);
    cr_assert_eq(td_audit_round_f16(65504), 65504);
    cr_assert(isinf(td_audit_round_f16(65520)));        // halfway to 65536: to even = overflow
    cr_assert_eq(td_audit_round_f16(65519), 65504);
    cr_assert_eq(td_audit_round_f16(0x1p-25), 0.0);     // halfway between 0 and 2^-24, to even
    cr_assert_eq(td_audit_round_f16(3 * 0x1p-26), 0x1p-24);
    cr_assert_eq(td_audit_round_f16(0.1), 0.0999755859375); // 0x2e66
}

Test(audit, no_moe_taps_is_not_a_pass) {
    write_synth(in_tmp("d.h5"), tok4, NULL, NULL);
    td_audit_result *r = NULL;
    td_err e;
    cr_assert_eq(td_audit(in_tmp("d.h5"), NULL, NULL, &r, &e), 0, "%s", e.msg);
    cr_assert_eq(r->arms[0].n_layers, 0);
    cr_assert_eq(r->verdict, TD_DIVERGENT);
    cr_assert_not_null(strstr(r->reason, "no MoE"), "%s", r->reason);
    td_audit_result_free(r);
    char args[1024];
    snprintf(args, sizeof args, "audit '%s'", in_tmp("d.h5"));
    cr_assert_eq(run_tapdiff(args, in_tmp("o.txt")), 1);
}

Test(audit, refuses_arms_with_other_tokens_or_no_data) {
    fill_pa();
    write_synth(in_tmp("a.h5"), tok4, pa, ka);
    const int32_t other[4] = {5, 6, 9, 8};
    write_synth(in_tmp("b.h5"), other, pa, ka);
    td_audit_result *r = NULL;
    td_err e;
    cr_assert_eq(td_audit(in_tmp("a.h5"), in_tmp("b.h5"), NULL, &r, &e), TD_EINPUT);
    cr_assert_null(r);
    cr_assert_not_null(strstr(e.msg, "token"), "%s", e.msg);
    cr_assert_eq(td_audit(in_tmp("a.h5"), NULL, in_tmp("b.h5"), &r, &e), TD_EINPUT, "control with other tokens");
    cr_assert_eq(td_audit(in_tmp("missing.h5"), NULL, NULL, &r, &e), TD_EINPUT);
    // an expert id out of range
    int32_t bad[8];
    memcpy(bad, ka, sizeof bad);
    bad[3] = 4;
    write_synth(in_tmp("c.h5"), tok4, pa, bad);
    cr_assert_eq(td_audit(in_tmp("c.h5"), NULL, NULL, &r, &e), TD_EINPUT);
    cr_assert_not_null(strstr(e.msg, "moe_topk"), "%s", e.msg);
    char args[1024];
    snprintf(args, sizeof args, "audit '%s' '%s'", in_tmp("a.h5"), in_tmp("b.h5"));
    cr_assert_eq(run_tapdiff(args, in_tmp("o.txt")), 3);
    cr_assert_eq(run_tapdiff("audit", in_tmp("o2.txt")), 2);
}

Test(audit, report_dir_json_and_self_contained_html) {
    write_fixture();
    run_out ro;
    run_ref("ref", in_tmp("a.h5"), &ro);
    char args[1024];
    snprintf(args, sizeof args, "audit '%s' --json --report '%s'", in_tmp("a.h5"), in_tmp("rep/sub"));
    cr_assert_eq(run_tapdiff(args, in_tmp("out.json")), 0);
    char *js = slurp(in_tmp("out.json"));
    cJSON *doc = cJSON_Parse(js);
    cr_assert_not_null(doc, "stdout is not JSON: %.200s", js);
    cJSON *l0 = cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(doc, "arms"), 0), "layers"), 0);
    cr_assert_not_null(l0);
    cr_assert_eq(cJSON_GetObjectItem(l0, "exact_ties")->valuedouble, (double)ro.n_even);
    cr_assert_eq(cJSON_GetObjectItem(l0, "tokens")->valuedouble, (double)ro.n_tokens);
    cr_assert_str_eq(cJSON_GetObjectItem(doc, "verdict")->valuestring, "pass");
    cJSON_Delete(doc);
    free(js);

    char *md = slurp(in_tmp("rep/sub/audit.md"));
    cr_assert_not_null(strstr(md, "| A | 0 |"), "%s", md);
    free(md);
    char *j2 = slurp(in_tmp("rep/sub/audit.json"));
    doc = cJSON_Parse(j2);
    cr_assert_not_null(doc);
    cJSON_Delete(doc);
    free(j2);
    char *html = slurp(in_tmp("rep/sub/audit.html"));
    cr_assert_not_null(strstr(html, "<svg"));
    cr_assert_not_null(strstr(html, "</html>"));
    cr_assert_null(strstr(html, "<script"));
    cr_assert_null(strstr(html, "src="));
    cr_assert_null(strstr(html, "href="));
    // one histogram per layer; the exact-tie bar of layer 0 carries the count
    int n_svg = 0;
    for (const char *p = html; (p = strstr(p, "<svg")); p++) n_svg++;
    cr_assert_eq(n_svg, 2);
    char title[64];
    snprintf(title, sizeof title, "fill=\"#c0392b\"><title>%lld</title>", (long long)ro.n_even);
    cr_assert_not_null(strstr(html, title), "no exact-tie bar of height %lld", (long long)ro.n_even);
    free(html);
}

/* qwen3next: every block (Gated DeltaNet and attention alike) has a routed
 * MoE beside its shared expert; the audit finds all four routers. */
Test(audit, covers_every_qwen3next_router) {
    td_err e;
    cr_assert_eq(td_fixture_write("qwen3next-f32", tmp, model, sizeof model, &e), 0, "%s", e.msg);
    run_out ro;
    run_ref("ref", in_tmp("n.h5"), &ro);
    td_audit_result *r = NULL;
    cr_assert_eq(td_audit(in_tmp("n.h5"), NULL, NULL, &r, &e), 0, "%s", e.msg);
    cr_assert_eq(r->n_arms, 1);
    cr_assert_eq(r->arms[0].n_layers, 4, "qwen3next-f32 has 4 MoE blocks (3 GDN, 1 attention), found %d",
                 (int)r->arms[0].n_layers);
    for (int l = 0; l < 4; l++) {
        const td_audit_layer *L = &r->arms[0].layers[l];
        cr_expect_eq(L->layer, l);
        cr_expect(L->X == 8 && L->K == 2, "block %d: X %d K %d", l, (int)L->X, (int)L->K);
        cr_expect_eq(L->n_tokens, ro.n_tokens, "block %d", l);
        cr_expect_eq(L->n_not_topk, 0, "block %d: the reference's picks are its top-k", l);
    }
    cr_expect_eq(r->verdict, TD_OK, "%s", r->reason);
    td_audit_result_free(r);
}

/* `audit --qsa --json` on the reference's qwen4exp taps: a JSON document
 * whose per-layer block size, budget and token counts match the model's
 * hyper-parameters (r = qsa_ratio, W = idx_topk + r - 1; sparse tokens are
 * the positions p with p + 1 > W, counted here), and the two-file form adds
 * the disagreement counts. --report stays refused for --qsa. */
Test(audit, qsa_json_document_counts_what_the_model_implies) {
    td_err e;
    cr_assert_eq(td_fixture_write("qwen4exp-f32", tmp, model, sizeof model, &e), 0, "%s", e.msg);
    run_out ro;
    run_ref("ref", in_tmp("q.h5"), &ro);
    td_model *m = NULL;
    cr_assert_eq(td_model_open(&m, model, &e), 0, "%s", e.msg);
    char args[1024];
    snprintf(args, sizeof args, "audit --qsa '%s' --json", in_tmp("q.h5"));
    cr_assert_eq(run_tapdiff(args, in_tmp("q.json")), 0);
    char *js = slurp(in_tmp("q.json"));
    cJSON *doc = cJSON_Parse(js);
    cr_assert_not_null(doc, "stdout is not JSON: %.200s", js);
    cr_assert_str_eq(cJSON_GetObjectItem(doc, "format")->valuestring, "tapdiff-audit-qsa");
    cr_assert_str_eq(cJSON_GetObjectItem(doc, "verdict")->valuestring, "pass");
    cJSON *ls = cJSON_GetObjectItem(doc, "layers");
    int n_qsa = 0;
    for (uint32_t l = 0; l < m->hp.n_layer; l++) {
        const int64_t r = m->hp.qsa_ratio[l];
        if (!r) continue;
        cJSON *L = cJSON_GetArrayItem(ls, n_qsa++);
        cr_assert_not_null(L, "no JSON row for QSA layer %u", l);
        const int64_t W = (int64_t)m->hp.idx_topk + r - 1;
        int64_t sparse = 0;
        for (int64_t p = 0; p < ro.n_tokens; p++) sparse += p + 1 > W;
        cr_expect_eq(cJSON_GetObjectItem(L, "layer")->valuedouble, (double)l);
        cr_expect_eq(cJSON_GetObjectItem(L, "r")->valuedouble, (double)r, "layer %u", l);
        cr_expect_eq(cJSON_GetObjectItem(L, "W")->valuedouble, (double)W, "layer %u", l);
        cr_expect_eq(cJSON_GetObjectItem(L, "tokens")->valuedouble, (double)ro.n_tokens, "layer %u", l);
        cr_expect_eq(cJSON_GetObjectItem(L, "sparse")->valuedouble, (double)sparse, "layer %u", l);
        cr_expect_null(cJSON_GetObjectItem(L, "disagreements"), "one file: no pair counts");
    }
    cr_assert_gt(n_qsa, 0, "the fixture has QSA layers");
    cr_expect_eq(cJSON_GetArraySize(ls), n_qsa);
    cJSON_Delete(doc);
    free(js);

    snprintf(args, sizeof args, "audit --qsa '%s' '%s' --json", in_tmp("q.h5"), in_tmp("q.h5"));
    cr_assert_eq(run_tapdiff(args, in_tmp("q2.json")), 0);
    js = slurp(in_tmp("q2.json"));
    doc = cJSON_Parse(js);
    cr_assert_not_null(doc, "stdout is not JSON: %.200s", js);
    cJSON *L0 = cJSON_GetArrayItem(cJSON_GetObjectItem(doc, "layers"), 0);
    cr_assert_not_null(cJSON_GetObjectItem(L0, "disagreements"));
    cr_expect_eq(cJSON_GetObjectItem(L0, "disagreements")->valuedouble, 0, "a file against itself");
    cJSON_Delete(doc);
    free(js);

    snprintf(args, sizeof args, "audit --qsa '%s' --report '%s'", in_tmp("q.h5"), in_tmp("rq"));
    cr_expect_eq(run_tapdiff(args, in_tmp("q3.txt")), 2);
    td_model_close(m);
}
