/* Tests of the token-history self-check (harness/selfcheck.h) and
 * `tapdiff run --check`. A greedy reference run must pass; copies of its tap
 * file with one decode step's consumed token replaced by 0, or one
 * hist.tokens entry changed, must fail at exactly that step, with the
 * expected token taken from the runner's own record (independent of the
 * check). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fixtures.h"
#include "runner.h"
#include "selfcheck.h"
#include "tap.h"
#include "tapfile.h"
#include "tapgen.h"
#include "td_test.h"

static char tmp[256];
static char model[512];

static void mk_tmp(void) {
    td_test_tmpdir(tmp, sizeof tmp, "selfcheck");
    td_err e;
    cr_assert_eq(td_fixture_write("qwen3moe-f32", tmp, model, sizeof model, &e), 0, "%s", e.msg);
}

static void rm_tmp(void) { td_test_rmdir(tmp); }

TestSuite(selfcheck, .init = mk_tmp, .fini = rm_tmp, .timeout = 120);

static const char *in_tmp(const char *name) { return td_test_path(tmp, name); }

static const int32_t prompt[5] = {10, 200, 33, 47, 5};
#define N_STEPS 6

/* Runs the reference; fed (N_STEPS) receives what the runner fed each
 * decode step. pinned: NULL = greedy. */
static void run_ref(const char *out, td_tap_mode mode, const int32_t *pinned, int32_t *fed) {
    td_run_config c;
    td_run_config_init(&c);
    c.model_path = model;
    c.backend = "ref";
    c.prompt = prompt;
    c.n_prompt = 5;
    c.n_steps = N_STEPS;
    c.tap_path = out;
    c.tap_mode = mode;
    if (pinned) {
        c.decode = TD_DECODE_PINNED;
        c.pinned = pinned;
        c.n_pinned = N_STEPS;
    }
    td_run_result res;
    td_err e;
    cr_assert_eq(td_run(&c, &res, &e), 0, "%s", e.msg);
    if (fed) memcpy(fed, res.fed, N_STEPS * sizeof *fed);
    td_run_result_free(&res);
}


typedef struct doctor {
    int64_t step;      /* the step to change */
    const char *tap;   /* "inp.tokens" or "hist.tokens" */
    int64_t index;     /* which value */
    int64_t value;     /* the new value */
    int64_t old;       /* the value it replaced */
    int done;
} doctor;

/* A tg_copy perturbation (tapgen.h): one integer tap entry replaced. */
static void hook_doctor(void *user, int64_t step, const td_tap_info *ti, double *v, uint64_t n) {
    doctor *d = user;
    cr_assert(ti->has_data, "%s has no data", ti->name);
    if (step != d->step || strcmp(ti->name, d->tap)) return;
    cr_assert_lt((uint64_t)d->index, n);
    d->old = (int64_t)v[d->index];
    v[d->index] = (double)d->value;
    d->done = 1;
}

static int run_tapdiff(const char *args, const char *out_file) { return td_test_tapdiff_sh(args, out_file, 1); }

static char *slurp(const char *path) { return td_test_slurp(path, NULL); }

/* ------------------------------------------------------------------------ */

Test(selfcheck, greedy_reference_file_passes) {
    run_ref(in_tmp("g.h5"), TD_TAP_FULL, NULL, NULL);
    td_selfcheck_report rep;
    td_err e;
    cr_assert_eq(td_selfcheck_file(in_tmp("g.h5"), &rep, &e), 0, "%s", e.msg);
    cr_assert_eq(rep.verdict, TD_OK, "%s", rep.message);
    cr_assert_eq(rep.mode, TD_SC_GREEDY);
    cr_assert_eq(rep.n_steps, 1 + N_STEPS);
    cr_assert_eq(rep.n_feedback, N_STEPS);   // every decode step
    cr_assert_eq(rep.n_hist, 1 + N_STEPS);   // every step has hist.tokens
    cr_assert_eq(rep.hist_w, 5 + N_STEPS);   // fewer ids consumed than the reference's W = 16
    cr_assert_eq(rep.fail_step, -1);
}

Test(selfcheck, decode_step_fed_token_zero_fails_at_that_step) {
    int32_t fed[N_STEPS];
    run_ref(in_tmp("g.h5"), TD_TAP_FULL, NULL, fed);
    // file step 3 = decode step 3, fed[2] by the runner
    doctor d = {.step = 3, .tap = "inp.tokens", .index = 0, .value = 0};
    cr_assert_neq(fed[2], 0, "pick a step whose token is not 0 already");
    tg_copy(in_tmp("g.h5"), in_tmp("bad.h5"), hook_doctor, &d, NULL, NULL, NULL, NULL);
    cr_assert(d.done);
    cr_assert_eq(d.old, fed[2]);

    td_selfcheck_report rep;
    td_err e;
    cr_assert_eq(td_selfcheck_file(in_tmp("bad.h5"), &rep, &e), 0, "%s", e.msg);
    cr_assert_eq(rep.verdict, TD_DIVERGENT);
    cr_assert_eq(rep.fail, TD_SCF_FEEDBACK);
    cr_assert_eq(rep.fail_step, 3, "failed at step %lld: %s", (long long)rep.fail_step, rep.message);
    cr_assert_eq(rep.expected, fed[2]);
    cr_assert_eq(rep.found, 0);
    cr_assert_eq(rep.n_feedback, 3); // steps 1, 2 passed, 3 failed
    cr_assert_not_null(strstr(rep.message, "step 3"), "%s", rep.message);
}

Test(selfcheck, history_entry_changed_fails_at_that_step) {
    int32_t fed[N_STEPS];
    run_ref(in_tmp("g.h5"), TD_TAP_FULL, NULL, fed);
    // after step 2 the reference has consumed prompt + fed[0] + fed[1]
    // (7 ids, W = 16): hist.tokens[5] is fed[0]
    doctor d = {.step = 2, .tap = "hist.tokens", .index = 5, .value = fed[0] + 1};
    tg_copy(in_tmp("g.h5"), in_tmp("bad.h5"), hook_doctor, &d, NULL, NULL, NULL, NULL);
    cr_assert(d.done);
    cr_assert_eq(d.old, fed[0]);
    td_selfcheck_report rep;
    td_err e;
    cr_assert_eq(td_selfcheck_file(in_tmp("bad.h5"), &rep, &e), 0, "%s", e.msg);
    cr_assert_eq(rep.verdict, TD_DIVERGENT);
    cr_assert_eq(rep.fail, TD_SCF_HIST);
    cr_assert_eq(rep.fail_step, 2);
    cr_assert_eq(rep.fail_index, 5);
    cr_assert_eq(rep.expected, fed[0]);
    cr_assert_eq(rep.found, fed[0] + 1);
}

Test(selfcheck, pinned_file_checks_history_only) {
    // pinned tokens that are (almost surely) not the argmax: a greedy check
    // would fail at step 1, the pinned one must not
    const int32_t pin[N_STEPS] = {1, 2, 3, 4, 5, 6};
    run_ref(in_tmp("p.h5"), TD_TAP_FULL, pin, NULL);
    td_selfcheck_report rep;
    td_err e;
    cr_assert_eq(td_selfcheck_file(in_tmp("p.h5"), &rep, &e), 0, "%s", e.msg);
    cr_assert_eq(rep.mode, TD_SC_PINNED);
    cr_assert_eq(rep.verdict, TD_OK, "%s", rep.message);
    cr_assert_eq(rep.n_feedback, 0);
    cr_assert_eq(rep.n_hist, 1 + N_STEPS);
    // the consumed token of step 4 replaced: the history (written by the
    // engine from what it really consumed) no longer matches inp.tokens
    doctor d = {.step = 4, .tap = "inp.tokens", .index = 0, .value = 0};
    tg_copy(in_tmp("p.h5"), in_tmp("bad.h5"), hook_doctor, &d, NULL, NULL, NULL, NULL);
    cr_assert_eq(d.old, pin[3]);
    cr_assert_eq(td_selfcheck_file(in_tmp("bad.h5"), &rep, &e), 0, "%s", e.msg);
    cr_assert_eq(rep.verdict, TD_DIVERGENT);
    cr_assert_eq(rep.fail, TD_SCF_HIST);
    cr_assert_eq(rep.fail_step, 4);
    cr_assert_eq(rep.fail_index, 5 + 4 - 1); // the newest id of 9 consumed
    cr_assert_eq(rep.expected, 0);
    cr_assert_eq(rep.found, pin[3]);
}

Test(selfcheck, fingerprint_only_greedy_file_is_refused) {
    run_ref(in_tmp("fp.h5"), TD_TAP_FINGERPRINT, NULL, NULL);
    td_selfcheck_report rep;
    td_err e;
    // the 5-token prefill's inp.tokens has no data and more than 4 values
    cr_assert_eq(td_selfcheck_file(in_tmp("fp.h5"), &rep, &e), TD_EINPUT);
    cr_assert_not_null(strstr(e.msg, "inp.tokens"), "%s", e.msg);
    cr_assert_eq(td_selfcheck_file(in_tmp("missing.h5"), &rep, &e), TD_EINPUT);
}

Test(selfcheck, in_memory_result) {
    int32_t fed[3] = {4, 5, 6}, sampled[4] = {4, 5, 6, 9};
    td_run_result res = {.n_forwards = 4, .n_steps = 3, .fed = fed, .sampled = sampled};
    td_selfcheck_report rep;
    td_selfcheck_run_result(&res, TD_DECODE_GREEDY, &rep);
    cr_assert_eq(rep.verdict, TD_OK, "%s", rep.message);
    cr_assert_eq(rep.n_feedback, 3);
    fed[1] = 0; // decode step 2 fed 0 instead of sampled[1] = 5
    td_selfcheck_run_result(&res, TD_DECODE_GREEDY, &rep);
    cr_assert_eq(rep.verdict, TD_DIVERGENT);
    cr_assert_eq(rep.fail_step, 2);
    cr_assert_eq(rep.expected, 5);
    cr_assert_eq(rep.found, 0);
    td_selfcheck_run_result(&res, TD_DECODE_PINNED, &rep);
    cr_assert_eq(rep.n_feedback + rep.n_hist, 0); // nothing to check
}

Test(selfcheck, run_check_cli_on_a_good_run) {
    char args[2048];
    snprintf(args, sizeof args, "run --model '%s' --backend ref --tokens 10,200,33 --steps 4 --out '%s' --quiet --check",
             model, in_tmp("c.h5"));
    const int rc = run_tapdiff(args, in_tmp("out.txt"));
    char *out = slurp(in_tmp("out.txt"));
    cr_assert_eq(rc, 0, "exit %d: %s", rc, out);
    cr_assert_not_null(strstr(out, "check: ok"), "%s", out);
    cr_assert_not_null(strstr(out, "4 decode steps"), "%s", out);
    free(out);
    // without a tap file: the in-memory check
    snprintf(args, sizeof args, "run --model '%s' --backend ref --tokens 10,200,33 --steps 2 --quiet --check", model);
    cr_assert_eq(run_tapdiff(args, in_tmp("out2.txt")), 0);
    out = slurp(in_tmp("out2.txt"));
    cr_assert_not_null(strstr(out, "check: ok"), "%s", out);
    free(out);
    // a greedy check cannot see fingerprint-only logits: refused up front
    snprintf(args, sizeof args, "run --model '%s' --backend ref --tokens 1 --steps 1 --taps fingerprint --out '%s' --check",
             model, in_tmp("f.h5"));
    cr_assert_eq(run_tapdiff(args, in_tmp("out3.txt")), 2);
}

/* compare runs the self-check on each arm: two identical files that both
 * consumed a stale token agree tap for tap, yet the comparison must not pass. */
Test(selfcheck, compare_of_two_identical_stale_files_is_divergent) {
    int32_t fed[N_STEPS];
    run_ref(in_tmp("g.h5"), TD_TAP_FULL, NULL, fed);
    doctor d = {.step = 3, .tap = "inp.tokens", .index = 0, .value = 0};
    cr_assert_neq(fed[2], 0, "pick a step whose token is not 0 already");
    tg_copy(in_tmp("g.h5"), in_tmp("bad.h5"), hook_doctor, &d, NULL, NULL, NULL, NULL);
    cr_assert(d.done);
    char args[1024];
    snprintf(args, sizeof args, "compare '%s' '%s' --control '%s'", in_tmp("g.h5"), in_tmp("g.h5"), in_tmp("g.h5"));
    cr_assert_eq(run_tapdiff(args, in_tmp("ok.txt")), 0, "%s", slurp(in_tmp("ok.txt")));
    snprintf(args, sizeof args, "compare '%s' '%s' --control '%s'", in_tmp("bad.h5"), in_tmp("bad.h5"),
             in_tmp("bad.h5"));
    cr_assert_eq(run_tapdiff(args, in_tmp("cmp.txt")), 1, "%s", slurp(in_tmp("cmp.txt")));
    char *out = slurp(in_tmp("cmp.txt"));
    cr_assert_not_null(strstr(out, "self-check"), "%s", out);
    free(out);
}
