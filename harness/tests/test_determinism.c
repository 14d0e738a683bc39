/* Tests of the nondeterminism check (harness/determinism.h and `tapdiff
 * determinism`): two identical runs are identical; a one-ulp change in one
 * element of one tap of a copied run is found at that tap, step and
 * element; the verb's exit codes. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "determinism.h"
#include "fixtures.h"
#include "runner.h"
#include "tapgen.h"
#include "td_test.h"

static char dir[256];
static void mk(void) { td_test_tmpdir(dir, sizeof dir, "det"); }
static void rm(void) { td_test_rmdir(dir); }
TestSuite(determinism, .init = mk, .fini = rm, .timeout = 300);

static const int32_t prompt[4] = {3, 17, 40, 9};

static void run_ref(const char *model, const char *out) {
    td_run_config c;
    td_run_config_init(&c);
    c.model_path = model;
    c.backend = "ref32";
    c.prompt = prompt;
    c.n_prompt = 4;
    c.n_steps = 3;
    c.tap_path = out;
    c.tap_mode = TD_TAP_FULL;
    td_run_result r = {0};
    td_err e;
    cr_assert_eq(td_run(&c, &r, &e), TD_OK, "%s", e.msg);
    td_run_result_free(&r);
}

typedef struct nudge {
    int64_t step;
    const char *tap;
    uint64_t index;
    int done;
} nudge;

static void one_ulp(void *ctx, int64_t step, const td_tap_info *t, double *v, uint64_t n) {
    nudge *d = ctx;
    if (step != d->step || strcmp(t->name, d->tap) || d->index >= n) return;
    float f = (float)v[d->index];
    v[d->index] = (double)nextafterf(f, INFINITY);
    d->done = 1;
}

Test(determinism, one_ulp_in_one_element_is_found_exactly) {
    const char *model = td_test_fixture(dir, "qwen3moe-f32");
    const char *a = td_test_path(dir, "a.h5"), *b = td_test_path(dir, "b.h5"), *c = td_test_path(dir, "c.h5");
    run_ref(model, a);
    run_ref(model, b);
    td_det_result r;
    memset(&r, 0, sizeof r);
    int differ = -1;
    int64_t n = 0;
    td_err e;
    cr_assert_eq(td_tapfiles_identical(a, b, &differ, &r, &n, &e), TD_OK, "%s", e.msg);
    cr_assert_eq(differ, 0, "two runs of ref32 differ at step %lld %s: %s", (long long)r.step, r.tap, r.what);
    cr_assert_gt(n, 100, "only %lld taps compared", (long long)n);

    nudge d = {2, "blk.1.attn_q", 5, 0};
    tg_copy(a, c, one_ulp, &d, NULL, NULL, NULL, NULL);
    cr_assert(d.done, "the tap to nudge was not found");
    n = 0;
    cr_assert_eq(td_tapfiles_identical(a, c, &differ, &r, &n, &e), TD_OK, "%s", e.msg);
    cr_assert_eq(differ, 1, "a one-ulp change was not seen");
    cr_assert_eq(r.step, 2);
    cr_assert_str_eq(r.tap, "blk.1.attn_q");
    cr_assert_eq(r.index, 5);
    cr_assert_neq(r.value_0, r.value_run);
}

Test(determinism, verb_reports_deterministic_arm_and_refuses_one_run) {
    const char *model = td_test_fixture(dir, "llama-f32");
    char args[2048];
    snprintf(args, sizeof args, "determinism --model %s --backend cpu --tokens 1,2,3,4,5,6,7,8,9 --steps 3 --runs 3 --out-dir %s/d --quiet",
             model, dir);
    const char *out = td_test_path(dir, "out.txt");
    int rc = td_test_tapdiff_sh(args, out, 1);
    char *txt = td_test_slurp(out, NULL);
    if (rc == 77) cr_skip_test("cpu backend not built: %s", txt);
    cr_assert_eq(rc, 0, "%s", txt);
    cr_assert(strstr(txt, "deterministic: 3 runs") != NULL, "%s", txt);
    free(txt);
    snprintf(args, sizeof args, "determinism --model %s --backend cpu --tokens 1 --runs 1", model);
    cr_assert_eq(td_test_tapdiff_sh(args, out, 1), 2);
}

/* The catalog's thread_race (attention tasks share one score row across
 * threads) is found by the verb at 2 threads within 20 runs (exit 5, at an
 * attention tap), while the same runs of the unmutated arm are identical. */
static int det_cpu(const char *model, const char *inject, const char *sub, char **txt) {
    char args[2048];
    snprintf(args, sizeof args,
             "determinism --model %s --backend cpu %s%s --threads 2 --runs 20 --tokens 1,2,3,4,5,6,7,8,9 --steps 3 "
             "--out-dir %s/%s",
             model, inject ? "--inject " : "", inject ? inject : "", dir, sub);
    const char *out = td_test_path(dir, "race.txt");
    int rc = td_test_tapdiff_sh(args, out, 1);
    *txt = td_test_slurp(out, NULL);
    return rc;
}

Test(determinism, thread_race_is_nondeterministic_at_2_threads_and_clean_arm_is_not) {
    const char *model = td_test_fixture(dir, "llama-f32");
    char *txt;
    int rc = det_cpu(model, "thread_race", "race", &txt);
    if (rc == 77) cr_skip_test("cpu backend not built: %s", txt);
    cr_assert_eq(rc, TD_NONDETERMINISTIC, "thread_race not caught in 20 runs at 2 threads: %s", txt);
    cr_assert(strstr(txt, "nondeterministic: run ") && strstr(txt, "attn_"), "%s", txt);
    free(txt);
    rc = det_cpu(model, NULL, "clean", &txt);
    cr_assert_eq(rc, 0, "the unmutated cpu arm at 2 threads: %s", txt);
    cr_assert(strstr(txt, "deterministic: 20 runs"), "%s", txt);
    free(txt);
}
