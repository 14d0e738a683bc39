/* The state-operations check (harness/stateops.h, `tapdiff stateops`): the
 * script parser refuses what it cannot run; cpu and llamacpp arms pass the
 * default script and a copy-over-a-used-sequence script on llama, qwen3 and
 * qwen3moe fixtures and stories260K, and on qwen3next (recurrent) ones the
 * rollbacks the arm can honour (the oracle's straight-line forward is
 * the independent source); each state fault of the catalog is localized at
 * the operation and step the catalog names; an arm without state operations
 * is a skip (77). Under AddressSanitizer the matrices keep one fixture per
 * code path (TD_TEST_SANITIZED). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "faults.h"
#include "fixtures.h"
#include "stateops.h"
#include "td_test.h"

static char tmpdir[256];
static void make_tmpdir(void) { td_test_tmpdir(tmpdir, sizeof tmpdir, "stateops"); }
static void remove_tmpdir(void) { td_test_rmdir(tmpdir); }

#define PROMPT "1,17,42,99,7,250,31,64"
/* A copy onto a sequence that already holds positions, a rollback of the
 * copy's source, a copy back, and a sequence emptied and refilled. */
#define SCRIPT_REUSE                                                                                               \
    "prefill; decode 2; copy 0 1; decode 3 on 1; copy 0->1; decode 2 on 1; rollback 4 on 0; decode 2 on 0; "       \
    "copy 1 0; decode 2 on 0; use 2; feed 5,6,7; decode 2; rollback 5; feed 9; decode 1"

/* Recurrent (GDN) fixtures: rollbacks only to where a forward started
 * (the cpu arm's snapshots) or to 0, copies onto fresh and used sequences. */
#define SCRIPT_GDN                                                                                                 \
    "prefill; decode 3; copy 0 1; decode 4 on 1; rollback 2 on 1; decode 2 on 1; rollback 1 on 0; decode 2 on 0; " \
    "copy 1->0; decode 1 on 0; use 2; feed 5,6,7; decode 2; rollback 5; feed 9; decode 1"
/* Copies and no rollback: what llama.cpp does on a recurrent model. */
#define SCRIPT_COPY_ONLY "prefill; decode 2; copy 0 1; decode 3 on 1; decode 2 on 0; copy 1 0; decode 1 on 0"

static const char *const k_gdn_fixtures[] = {"qwen3next-f32", "qwen3next-q8_0"};
/* qwen4exp: with PROMPT the default script's decodes pass position 11, where
 * block 1's QSA selection turns sparse (W = 11), and copy 16 positions. */
static const char *const k_q4x_fixtures[] = {"qwen4exp-f32", "qwen4exp-q8_0"};

static const char *const k_fixtures[] = {"llama-f32", "qwen3-f32", "qwen3moe-f32", "llama-q8_0"};
#define N_FIXTURES (sizeof k_fixtures / sizeof k_fixtures[0])

/* `tapdiff stateops` on model with the arm (and script / fault; taps or the
 * logits only); stdout in *out. */
static int stateops(const char *model, const char *arm, const char *script, const char *inject, int taps,
                    char **out) {
    const char *args[24];
    int n = 0;
    args[n++] = "stateops", args[n++] = "--model", args[n++] = model, args[n++] = "--arm", args[n++] = arm;
    args[n++] = "--tokens", args[n++] = PROMPT, args[n++] = "--threads", args[n++] = "1", args[n++] = "--quiet";
    if (script) args[n++] = "--script", args[n++] = script;
    if (inject) args[n++] = "--inject", args[n++] = inject;
    args[n++] = "--taps", args[n++] = taps ? "all" : "none";
    args[n] = NULL;
    char *err = NULL;
    int rc = td_test_tapdiff_run(tmpdir, out, &err, args);
    if (rc != 0 && rc != 1) cr_log_info("stderr: %s", err);
    free(err);
    return rc;
}

static void expect_conformant(const char *model, const char *arm, const char *script, int taps) {
    char *out = NULL;
    int rc = stateops(model, arm, script, NULL, taps, &out);
    cr_expect_eq(rc, 0, "%s on %s (%s): exit %d: %s", arm, model, script ? "reuse script" : "default", rc, out);
    cr_expect(strstr(out, "verdict: conformant: ") != NULL, "%s", out);
    // no vacuous pass: with taps, every step compared some
    if (taps) cr_expect(strstr(out, " 0 taps compared") == NULL, "%s", out);
    free(out);
}

/* The fixture matrix on the logits (fast), one fixture with every tap. */
static void conformant_matrix(const char *arm) {
    for (size_t i = 0; i < N_FIXTURES; i++) {
        const char *m = td_test_fixture(tmpdir, k_fixtures[i]);
        expect_conformant(m, arm, NULL, 0);
        if (!TD_TEST_SANITIZED || i == 0) expect_conformant(m, arm, SCRIPT_REUSE, 0);
    }
    expect_conformant(td_test_fixture(tmpdir, "qwen3moe-f32"), arm, NULL, 1);
    expect_conformant(td_test_shared_model("stories260K.gguf"), arm, NULL, 0);
}

Test(stateops, parser_accepts_the_documented_syntax) {
    td_sop_script s;
    td_err e = {{0}};
    cr_assert_eq(td_sop_parse(TD_SOP_DEFAULT_SCRIPT, &s, &e), TD_OK, "%s", e.msg);
    cr_expect_eq(s.n, 10);
    td_sop_script_free(&s);
    cr_assert_eq(td_sop_parse("prefill 3 on 2 # first\n\ndecode 1;copy 2->3 ; feed 4,5 on 3\nrollback 1 on 3;use 0",
                              &s, &e),
                 TD_OK, "%s", e.msg);
    cr_assert_eq(s.n, 6);
    cr_expect(s.ops[0].kind == TD_SOP_PREFILL && s.ops[0].n == 3 && s.ops[0].seq == 2);
    cr_expect(s.ops[1].kind == TD_SOP_DECODE && s.ops[1].n == 1 && s.ops[1].seq == -1);
    cr_expect(s.ops[2].kind == TD_SOP_COPY && s.ops[2].seq == 2 && s.ops[2].dst == 3);
    cr_expect(s.ops[3].kind == TD_SOP_FEED && s.ops[3].n_tokens == 2 && s.ops[3].tokens[1] == 5 && s.ops[3].seq == 3);
    cr_expect(s.ops[4].kind == TD_SOP_ROLLBACK && s.ops[4].n == 1 && s.ops[4].seq == 3);
    cr_expect(s.ops[5].kind == TD_SOP_USE && s.ops[5].seq == 0);
    cr_expect_str_eq(s.ops[2].text, "copy 2->3");
    td_sop_script_free(&s);
}

Test(stateops, parser_refuses_what_it_cannot_run) {
    static const char *const bad[] = {"",           "# only a comment", "jump 3",   "decode",       "decode 0",
                                      "decode x",   "rollback 1 on 9",  "copy 1 1", "copy 0",       "copy 0->",
                                      "use",        "feed",             "feed a,b", "use 1 on 2",   "prefill 0",
                                      "decode 2 3", "copy 0 1 on 2"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        td_sop_script s;
        td_err e = {{0}};
        cr_expect_eq(td_sop_parse(bad[i], &s, &e), TD_EINPUT, "'%s' accepted", bad[i]);
        cr_expect(e.msg[0], "'%s': no reason given", bad[i]);
    }
}

Test(stateops, cpu_conformant_on_fixtures_and_stories, .init = make_tmpdir, .fini = remove_tmpdir, .timeout = 600) {
    conformant_matrix("cpu");
}

/* A rollback past the arm's recurrent-state snapshots (here: into the
 * prefill) is refused with a skip that says why; nothing is misjudged. */
static void expect_refused(const char *model, const char *arm, const char *script, const char *why) {
    const char *args[] = {"stateops", "--model", model,  "--arm", arm,      "--tokens", PROMPT,
                          "--threads", "1",      "--taps", "none", "--script", script,   NULL};
    char *out = NULL, *err = NULL;
    const int rc = td_test_tapdiff_run(tmpdir, &out, &err, args);
    cr_expect_eq(rc, 77, "%s on %s (%s): exit %d: %s %s", arm, model, script, rc, out, err);
    cr_expect(strstr(err, why) != NULL, "%s on %s: expected '%s' in: %s", arm, model, why, err);
    free(out), free(err);
}

Test(stateops, cpu_conformant_on_recurrent_fixtures, .init = make_tmpdir, .fini = remove_tmpdir, .timeout = 600) {
    for (size_t i = 0; i < sizeof k_gdn_fixtures / sizeof k_gdn_fixtures[0]; i++) {
        const char *m = td_test_fixture(tmpdir, k_gdn_fixtures[i]);
        expect_conformant(m, "cpu", NULL, 0);
        expect_conformant(m, "cpu", SCRIPT_GDN, 0);
        expect_conformant(m, "cpu", SCRIPT_GDN, 1);
        expect_refused(m, "cpu", "prefill; decode 2; rollback 4", "needs the recurrent (GDN) state there");
    }
}

/* llama.cpp at the peer revision keeps no recurrent snapshots: a partial
 * rollback is refused (77), copies and a rollback to 0 run. */
Test(stateops, llamacpp_on_recurrent_fixtures_copies_and_refuses_partial_rollback, .init = make_tmpdir,
     .fini = remove_tmpdir, .timeout = 600) {
    const td_backend_vt *vt = td_backend_find("llamacpp");
    if (!vt) cr_skip_test("the llamacpp arm is not built (%s)", td_backend_absent_reason("llamacpp"));
    char why[512];
    if (vt->probe && vt->probe(why, sizeof why) != TD_OK) cr_skip_test("llamacpp cannot run here: %s", why);
    const char *m = td_test_fixture(tmpdir, "qwen3next-f32");
    expect_conformant(m, "llamacpp", SCRIPT_COPY_ONLY, 0);
    expect_conformant(m, "llamacpp", "prefill; decode 2; rollback 10; prefill 3; decode 2", 0);
    expect_refused(m, "llamacpp", "prefill; decode 2; rollback 1", "refused the rollback: its recurrent memory");
}

Test(stateops, llamacpp_conformant_on_fixtures_and_stories, .init = make_tmpdir, .fini = remove_tmpdir,
     .timeout = 600) {
    const td_backend_vt *vt = td_backend_find("llamacpp");
    if (!vt) cr_skip_test("the llamacpp arm is not built (%s)", td_backend_absent_reason("llamacpp"));
    char why[512];
    if (vt->probe && vt->probe(why, sizeof why) != TD_OK) cr_skip_test("llamacpp cannot run here: %s", why);
    conformant_matrix("llamacpp");
}

Test(stateops, each_state_fault_is_localized_at_its_operation_and_step, .init = make_tmpdir, .fini = remove_tmpdir,
     .timeout = 600) {
    int n_faults = 0;
    for (int f = 1; f < TD_FAULT_COUNT; f++) {
        const td_fault_info *fi = td_fault_get((td_fault)f);
        if (!fi->state_op) continue;
        n_faults++;
        // a recurrent-state fault shows on the recurrent fixtures only, an indexer fault on qwen4exp's
        const int gdn = strstr(fi->fixtures, "qwen3next") != NULL, q4x = !gdn && strstr(fi->fixtures, "qwen4exp");
        const char *const *fx = gdn ? k_gdn_fixtures : q4x ? k_q4x_fixtures : k_fixtures;
        const size_t n_fx = gdn ? sizeof k_gdn_fixtures / sizeof *k_gdn_fixtures
                            : q4x ? sizeof k_q4x_fixtures / sizeof *k_q4x_fixtures
                                  : N_FIXTURES;
        char want[160], want_tap[160];
        snprintf(want, sizeof want, "'%s': step %d, ", fi->state_op, fi->first_step);
        snprintf(want_tap, sizeof want_tap, ": %s budget", fi->first_tap);
        // with taps: the catalog's tap; on the logits only: the same operation and step
        for (int taps = 1; taps >= 0; taps--)
            for (size_t i = 0; i < n_fx; i++) {
                if (taps && i >= 2) continue; // one tap file per step is slow: llama and qwen3 show the tap
                if (TD_TEST_SANITIZED && i >= 1) continue;
                const char *m = td_test_fixture(tmpdir, fx[i]);
                char *out = NULL;
                int rc = stateops(m, "cpu", NULL, fi->name, taps, &out);
                const char *v = strstr(out, "verdict:");
                fprintf(stderr, "%-18s %-13s taps %d exit %d %s", fi->name, fx[i], taps, rc, v ? v : out);
                cr_expect_eq(rc, 1, "%s on %s: exit %d (expected divergent): %s", fi->name, fx[i], rc, out);
                cr_expect(strstr(out, "DIVERGENT") && strstr(out, want) && strstr(out, taps ? want_tap : ": out.logits "),
                          "%s on %s (taps %d): expected %s%s in: %s", fi->name, fx[i], taps, want,
                          taps ? want_tap : "out.logits", out);
                free(out);
            }
    }
    cr_expect_geq(n_faults, 2, "the catalog has no state-operations fault");
}

/* qwen4exp on cpu: the default and the recurrent script conformant (the
 * indexer key cache, the token history of the PLE n-grams and the PLE conv
 * history follow rollbacks and copies), a rollback past the snapshots refused,
 * and the recurrent-state fault shown at the PLE conv, block 0's first tap
 * that reads the history (before its GDN conv). */
Test(stateops, cpu_on_qwen4exp_fixtures, .init = make_tmpdir, .fini = remove_tmpdir, .timeout = 600) {
    for (size_t i = 0; i < (TD_TEST_SANITIZED ? 1 : sizeof k_q4x_fixtures / sizeof k_q4x_fixtures[0]); i++) {
        const char *m = td_test_fixture(tmpdir, k_q4x_fixtures[i]);
        expect_conformant(m, "cpu", NULL, 0);
        expect_conformant(m, "cpu", SCRIPT_GDN, 0);
        if (i == 0) expect_conformant(m, "cpu", NULL, 1);
        expect_refused(m, "cpu", "prefill; decode 2; rollback 4", "needs the recurrent (GDN) state there");
    }
    char *out = NULL;
    const int rc = stateops(td_test_fixture(tmpdir, "qwen4exp-f32"), "cpu", NULL, "gdn_rollback_stale", 1, &out);
    cr_expect_eq(rc, 1, "gdn_rollback_stale on qwen4exp-f32: exit %d: %s", rc, out);
    cr_expect(strstr(out, "'decode 5': step 7, ") && strstr(out, ": blk.0.ple_conv budget"),
              "gdn_rollback_stale on qwen4exp-f32: expected 'decode 5': step 7 at blk.0.ple_conv in: %s", out);
    free(out);
}

Test(stateops, exit_codes_for_no_state_ops_usage_and_bad_script, .init = make_tmpdir, .fini = remove_tmpdir) {
    const char *m = td_test_fixture(tmpdir, "llama-f32");
    char *out = NULL, *err = NULL;
    // ref32 has no seq_rm / seq_cp / seq_use: the check cannot run there
    const char *a77[] = {"stateops", "--model", m, "--arm", "ref32", "--tokens", PROMPT, NULL};
    cr_expect_eq(td_test_tapdiff_run(tmpdir, &out, &err, a77), 77, "%s", err);
    cr_expect(strstr(err, "arm 'ref32' has no state operations"), "%s", err);
    free(out), free(err);
    // ... while a script without state operations runs on it
    const char *a0[] = {"stateops", "--model", m, "--arm", "ref32", "--tokens", PROMPT, "--script", "prefill; decode 3",
                        "--quiet", NULL};
    cr_expect_eq(td_test_tapdiff_run(tmpdir, &out, &err, a0), 0, "%s%s", out, err);
    free(out), free(err);
    const char *a2[] = {"stateops", "--model", m, "--tokens", PROMPT, NULL};
    cr_expect_eq(td_test_tapdiff_run(tmpdir, NULL, NULL, a2), 2, "no --arm");
    const char *a2b[] = {"stateops", "--model", m, "--arm", "cpu", "--tokens", PROMPT, "--bogus", NULL};
    cr_expect_eq(td_test_tapdiff_run(tmpdir, NULL, NULL, a2b), 2, "unknown option");
    const char *a2c[] = {"stateops", "--model", m, "--arm", "nosuch", "--tokens", PROMPT, NULL};
    cr_expect_eq(td_test_tapdiff_run(tmpdir, NULL, NULL, a2c), 2, "unknown arm");
    const char *a3[] = {"stateops", "--model", m, "--arm", "cpu", "--tokens", PROMPT, "--script", "prefill; rollback 9",
                        NULL};
    cr_expect_eq(td_test_tapdiff_run(tmpdir, &out, &err, a3), 3, "rollback past the start");
    cr_expect(strstr(err, "holds only 8 positions"), "%s", err);
    free(out), free(err);
    const char *a3b[] = {"stateops", "--model", m, "--arm", "cpu", "--tokens", PROMPT, "--script", "decode 2", NULL};
    cr_expect_eq(td_test_tapdiff_run(tmpdir, NULL, NULL, a3b), 3, "decode of an empty sequence");
    const char *a3c[] = {"stateops", "--model", m, "--arm", "cpu", "--tokens", PROMPT, "--script", "prefill; hop", NULL};
    cr_expect_eq(td_test_tapdiff_run(tmpdir, NULL, NULL, a3c), 3, "unknown operation");
}
