/* The reference oracle follows an arm's explained QSA selection
 * (harness/qsafollow.h), without the llama.cpp peer. The arm is the
 * reference itself attending, at every sparse query of block 1 of
 * qwen4exp-ties, to the W positions right below and in the tail instead of
 * the lowest ones, its qsa_sel tap rewritten to say so. Every complete block
 * of that layer scores exactly 0 (its indexer keys are zero), so every block
 * is in the boundary group and compare explains each such row: what differs
 * is attn_ctx, where the attention really reads other keys. The follow takes
 * every row and the comparison is conformant, the oracle's file saying which
 * (qsa_taken). Red: a row whose arm drops a tail position (no tie explains
 * it) is never taken, and the comparison stays divergent at blk.1.qsa_sel. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compare.h"
#include "fixtures.h"
#include "qsafollow.h"
#include "runner.h"
#include "tapgen.h"
#include "td_test.h"

static char dir[256];
static void mk(void) { td_test_tmpdir(dir, sizeof dir, "qsafollow"); }
static void rm(void) { td_test_rmdir(dir); }
TestSuite(qsafollow, .init = mk, .fini = rm);

/* qwen4exp-ties block 1: r = 4, W = B + r - 1 = 11; 16 + 2 positions, sparse from p = 11 */
enum { NP = 16, NS = 2, LAYER = 1, R = 4, W = 11, FIRST_SPARSE = 11, N_POS = NP + NS };

static const int32_t k_prompt[NP] = {11, 48, 85, 122, 159, 196, 233, 270, 17, 54, 91, 128, 165, 202, 239, 276};

static td_run_config cfg(const char *model, const char *backend, const int32_t *fed, const char *out) {
    td_run_config c;
    td_run_config_init(&c);
    c.model_path = model;
    c.backend = backend;
    c.prompt = k_prompt;
    c.n_prompt = NP;
    c.n_steps = NS;
    c.decode = TD_DECODE_PINNED;
    c.pinned = fed;
    c.n_pinned = NS;
    c.tap_path = out;
    c.tap_mode = TD_TAP_FULL;
    c.threads = 1;
    return c;
}

static void run(const td_run_config *c) {
    td_run_result r = {0};
    td_err e = {{0}};
    cr_assert_eq(td_run(c, &r, &e), TD_OK, "%s: %s", c->backend, e.msg);
    td_run_result_free(&r);
}

/* The arm's choice at position p: the W positions ending at p (the tail and
 * the highest blocks before it); `bad` keeps p out of it (a tail position
 * dropped) and takes one more below instead. */
typedef struct arm_sel {
    int32_t sel[N_POS][W];
    td_qsa_pin pins[N_POS];
    int n;
    int64_t bad;
} arm_sel;

static void make_sel(arm_sel *a, int64_t bad) {
    memset(a, 0, sizeof *a);
    a->bad = bad;
    for (int64_t p = FIRST_SPARSE; p < N_POS; p++) {
        int32_t *s = a->sel[a->n];
        const int64_t top = p == bad ? p - 1 : p;
        for (int j = 0; j < W; j++) s[j] = (int32_t)(top - W + 1 + j);
        a->pins[a->n] = (td_qsa_pin){.layer = LAYER, .pos = p, .step = p < NP ? 0 : p - NP + 1, .n = W, .sel = s};
        a->n++;
    }
}

/* tg_copy's hook: blk.1.qsa_sel rows say what the arm attended to */
static void rewrite_sel(void *ctx, int64_t step, const td_tap_info *t, double *v, uint64_t n) {
    const arm_sel *a = ctx;
    if (strcmp(t->name, "blk.1.qsa_sel") || t->ndim != 2 || t->shape[1] != W) return;
    for (int64_t row = 0; row < t->shape[0]; row++) {
        const int64_t p = step == 0 ? row : NP - 1 + step;
        for (int i = 0; i < a->n; i++)
            if (a->pins[i].pos == p)
                for (int j = 0; j < W && (uint64_t)(row * W + j) < n; j++) v[row * W + j] = a->sel[i][j];
    }
}

/* The arm's tap file: the reference attending to a's rows, its qsa_sel rewritten. */
static void arm_file(const char *model, const int32_t *fed, arm_sel *a, const char *raw, const char *out) {
    td_run_config c = cfg(model, "ref", fed, raw);
    td_qsa_pins_begin(a->pins, a->n);
    run(&c);
    td_qsa_pins_end();
    tg_copy(raw, out, rewrite_sel, a, NULL, NULL, NULL, NULL);
}

static td_cmp_result *compare3(const char *pa, const char *pb, const char *pc) {
    td_cmp_options o = td_cmp_options_default();
    o.control = pc;
    td_cmp_result *r = NULL;
    td_err e = {{0}};
    cr_assert_eq(td_compare(pa, pb, &o, &r, &e), TD_OK, "%s", e.msg);
    return r;
}

static const char *first_name(const td_cmp_result *r, int64_t *step) {
    if (r->first < 0) return "(conformant)";
    const td_cmp_tap *t = td_cmp_tap_at(r, r->first);
    *step = t->step;
    return t->name;
}

/* Runs A (ref) and C (ref32) pinned to fed, the arm with a's rows, compares,
 * follows; returns the report and the final comparison in *out. */
static void follow(const char *model, const int32_t *fed, arm_sel *a, const char *tag, td_cmp_result **before,
                   td_cmp_result **after, td_qsa_follow_report *rep) {
    char pa[1100], pb[1100], pc[1100], raw[1100];
    snprintf(pa, sizeof pa, "%s/A-%s.h5", dir, tag);
    snprintf(pb, sizeof pb, "%s/B-%s.h5", dir, tag);
    snprintf(pc, sizeof pc, "%s/C-%s.h5", dir, tag);
    snprintf(raw, sizeof raw, "%s/Braw-%s.h5", dir, tag);
    const td_run_config oc = cfg(model, "ref", fed, pa), cc = cfg(model, "ref32", fed, pc);
    run(&oc);
    run(&cc);
    arm_file(model, fed, a, raw, pb);
    *before = compare3(pa, pb, pc);
    *after = compare3(pa, pb, pc);
    td_cmp_options o = td_cmp_options_default();
    o.control = pc;
    td_err e = {{0}};
    cr_assert_eq(td_qsa_follow(&oc, &cc, pb, &o, after, rep, &e), TD_OK, "%s", e.msg);
    cr_assert_eq(td_qsa_follow_record(pa, rep, &e), TD_OK, "%s", e.msg);
}

static int32_t *greedy_tokens(const char *model) {
    td_run_config c = cfg(model, "ref", NULL, NULL);
    c.decode = TD_DECODE_GREEDY;
    c.pinned = NULL;
    c.n_pinned = 0;
    td_run_result r = {0};
    td_err e = {{0}};
    cr_assert_eq(td_run(&c, &r, &e), TD_OK, "%s", e.msg);
    int32_t *fed = malloc(NS * sizeof *fed);
    memcpy(fed, r.fed, NS * sizeof *fed);
    td_run_result_free(&r);
    return fed;
}

Test(qsafollow, an_explained_tie_is_followed_and_the_comparison_is_conformant) {
    const char *model = td_test_fixture(dir, "qwen4exp-ties");
    int32_t *fed = greedy_tokens(model);
    static arm_sel a;
    make_sel(&a, -1);
    td_cmp_result *before, *after;
    td_qsa_follow_report rep;
    follow(model, fed, &a, "tie", &before, &after, &rep);
    int64_t s0 = -1, s1 = -1;
    const char *f0 = first_name(before, &s0);
    cr_expect(!strcmp(f0, "blk.1.attn_ctx") && s0 == 0, "without the follow: first divergent %s at step %lld", f0,
              (long long)s0);
    const char *f1 = first_name(after, &s1);
    cr_expect_eq(after->verdict, TD_OK, "after the follow: %s (first %s at step %lld)", after->reason, f1, (long long)s1);
    cr_expect_eq(rep.n_rows, a.n, "rows taken: %d of %d", rep.n_rows, a.n);
    for (int i = 0; i < rep.n_rows && i < a.n; i++)
        cr_expect(rep.pins[i].layer == LAYER && rep.pins[i].pos == a.pins[i].pos && rep.pins[i].n == W &&
                      !memcmp(rep.pins[i].sel, a.sel[i], W * sizeof(int32_t)),
                  "row %d: layer %d pos %lld", i, rep.pins[i].layer, (long long)rep.pins[i].pos);
    // the oracle's file says which rows it took: step 0 position 11 first
    char pa[1100];
    snprintf(pa, sizeof pa, "%s/A-tie.h5", dir);
    td_tapfile *f = NULL;
    td_err e = {{0}};
    cr_assert_eq(td_tapfile_open(&f, pa, &e), TD_OK, "%s", e.msg);
    char *taken = NULL;
    cr_assert_eq(td_tapfile_attr_str(f, "qsa_taken", &taken, &e), TD_OK, "%s", e.msg);
    cr_expect(!strncmp(taken, "0:1:11:1,2,3,4,5,6,7,8,9,10,11 ", 31), "qsa_taken = '%s'", taken);
    free(taken);
    td_tapfile_close(f);
    td_qsa_follow_free(&rep);
    td_cmp_result_free(before);
    td_cmp_result_free(after);
    free(fed);
}

Test(qsafollow, a_selection_no_tie_explains_is_never_taken) {
    const char *model = td_test_fixture(dir, "qwen4exp-ties");
    int32_t *fed = greedy_tokens(model);
    static arm_sel a;
    make_sel(&a, 13); // position 13's tail {12, 13} loses 13
    td_cmp_result *before, *after;
    td_qsa_follow_report rep;
    follow(model, fed, &a, "bug", &before, &after, &rep);
    int64_t s1 = -1;
    const char *f1 = first_name(after, &s1);
    cr_expect(after->verdict != TD_OK && !strcmp(f1, "blk.1.qsa_sel") && s1 == 0,
              "after the follow: %s (first %s at step %lld)", after->reason, f1, (long long)s1);
    cr_expect_eq(rep.n_rows, a.n - 1, "rows taken: %d of %d", rep.n_rows, a.n);
    for (int i = 0; i < rep.n_rows; i++) cr_expect_neq(rep.pins[i].pos, 13, "the unexplained row was taken");
    td_qsa_follow_free(&rep);
    td_cmp_result_free(before);
    td_cmp_result_free(after);
    free(fed);
}

/* Plain `tapdiff compare` takes the QSA block size from the model A's file
 * names (root attributes model, model_sha256, arch), not from the -1
 * pattern of qsa_scores alone. Decode step 1 of a 14-token prompt is one row
 * at p = 14 with 3 complete blocks of block 1 (r = 4): the pattern fits r =
 * 4 and r = 5 (floor(15 / r) = 3). The two files' rows there, on block
 * scores {5, 1, 1}, hold the tail 12..14 and block 0, then block 1 (A) or
 * block 2 (B): tied blocks at the cut under r = 4, so explained; under r = 5
 * position 4 lies in block 0 (score 5), which no tie explains. Red (the
 * guess, every fitting size must explain the row): divergent at
 * blk.1.qsa_sel, exit 1. */
typedef struct cut_rows {
    const int32_t *sel;
} cut_rows;

static void hook_cut(void *ctx, int64_t step, const td_tap_info *t, double *v, uint64_t n) {
    const cut_rows *c = ctx;
    if (step != 1) return;
    if (!strcmp(t->name, "blk.1.qsa_scores")) {
        cr_assert_eq(n, 3, "blk.1.qsa_scores at p = 14: %llu values", (unsigned long long)n);
        v[0] = 5, v[1] = 1, v[2] = 1;
    } else if (!strcmp(t->name, "blk.1.qsa_sel")) {
        cr_assert_eq(n, W, "blk.1.qsa_sel at p = 14: %llu values", (unsigned long long)n);
        for (int j = 0; j < W; j++) v[j] = c->sel[j];
    }
}

Test(qsafollow, plain_compare_uses_the_model_block_size_of_the_file) {
    const char *model = td_test_fixture(dir, "qwen4exp-f32");
    char pr[1100], pa[1100], pb[1100];
    snprintf(pr, sizeof pr, "%s/R.h5", dir);
    snprintf(pa, sizeof pa, "%s/A.h5", dir);
    snprintf(pb, sizeof pb, "%s/B.h5", dir);
    td_run_config c;
    td_run_config_init(&c);
    c.model_path = model;
    c.backend = "ref";
    c.prompt = k_prompt;
    c.n_prompt = 14;
    c.n_steps = 1;
    c.tap_path = pr;
    c.tap_mode = TD_TAP_FULL;
    c.threads = 1;
    run(&c);
    static const int32_t sel_a[W] = {12, 13, 14, 0, 1, 2, 3, 4, 5, 6, 7};
    static const int32_t sel_b[W] = {12, 13, 14, 0, 1, 2, 3, 8, 9, 10, 11};
    cut_rows ca = {sel_a}, cb = {sel_b};
    tg_copy(pr, pa, hook_cut, &ca, NULL, NULL, NULL, NULL);
    tg_copy(pr, pb, hook_cut, &cb, NULL, NULL, NULL, NULL);
    char *so = NULL;
    const char *args[] = {"compare", pa, pb, NULL};
    const int st = td_test_tapdiff_run(dir, &so, NULL, args);
    cr_expect_eq(st, 0, "compare exit %d:\n%s", st, so);
    free(so);
}
