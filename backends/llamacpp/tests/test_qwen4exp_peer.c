/* qwen4exp, ref against the llama.cpp peer through `tapdiff bisect` (issue
 * 14): the three fixtures, prompts of 1, 8 and 40 tokens, 16 pinned decode
 * steps, every catalog tap the peer maps (all but inp.ple_ids: it builds the
 * n-gram context on the host, so the filter Q4_TAPS leaves it out, else it
 * counts as missing). The peer's top-k keeps other positions of a cut block,
 * or of blocks tied at the cut, than the reference (spec §7.1); bisect's
 * oracle attends to the peer's positions in the rows compare explains as
 * such a tie (harness/qsafollow.h) and the verdict is conformant. Red: with
 * the follow off (TD_QSA_FOLLOW=0) the 40-token f32 cell diverges at
 * blk.1.attn_ctx in the prefill, where the attention really reads other
 * keys. Each cell's verdict, rows taken and tap closest to its budget are
 * printed (README's table). ~6 s of CPU a cell; its own executable, so that
 * test_llamacpp's time limit is not shared. Skips without the peer. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "fixtures.h"
#include "td_test.h"

#define Q4_TAPS "blk.*,out.*,hist.*,inp.tokens,inp.pos,inp.embd,inp.ple_embd,inp.ple_rows"

static char tmpdir[256];
static void mk(void) { td_test_tmpdir(tmpdir, sizeof tmpdir, "q4peer"); }
static void rm(void) { td_test_rmdir(tmpdir); }
TestSuite(q4peer, .init = mk, .fini = rm);


static const char *peer_or_skip(void) {
#ifndef TD_HAVE_LLAMACPP
    cr_skip_test("llama.cpp peer not built (run ci/fetch-llamacpp.sh, then meson setup --reconfigure BUILD)");
#endif
    const char *exe = getenv("TD_TAPDIFF");
    if (!exe) cr_skip_test("TD_TAPDIFF is not set");
    return exe;
}

static int cell(const char *exe, const char *model, const char *dir, int len, const char *env, char *out, size_t n) {
    char toks[1024], cmd[4096];
    size_t o = 0;
    for (int i = 0; i < len; i++) o += (size_t)snprintf(toks + o, sizeof toks - o, "%s%d", i ? "," : "", (i * 37 + 11) % 290);
    snprintf(cmd, sizeof cmd,
             "%s '%s' bisect --quiet --model '%s' --a ref --b llamacpp --tokens %s --steps 16 --threads 1 "
             "--filter '" Q4_TAPS "' --out-dir '%s' 2>&1",
             env, exe, model, toks, dir);
    return td_test_sh_capture(cmd, out, n);
}

static void fixture_conformant(const char *name) {
    const char *exe = peer_or_skip();
    static const int lens[] = {1, 8, 40};
    static char out[1 << 16];
    const char *model = td_test_fixture(tmpdir, name);
    for (size_t k = 0; k < 3; k++) {
        char dir[700];
        snprintf(dir, sizeof dir, "%s/%s-%d", tmpdir, name, lens[k]);
        const int st = cell(exe, model, dir, lens[k], "", out, sizeof out);
        cr_expect(strstr(out, "over 17 steps") && strstr(out, "missing: 0 in A, 0 in B"), "%s, %d tokens: %s", name,
                  lens[k], out);
        cr_expect_eq(st, 0, "%s, %d-token prompt: bisect ref vs llamacpp exit %d:\n%s", name, lens[k], st, out);
        // not vacuous: every cell reaches sparse queries where the peer keeps other tied positions
        const char *took = strstr(out, "the oracle took B's side of "), *close = strstr(out, "closest to its budget:");
        cr_expect(took != NULL, "%s, %d tokens: the oracle followed no selection row:\n%s", name, lens[k], out);
        const char *line = close ? strstr(close, "step ") : NULL;
        fprintf(stderr, "%s, %d tokens: %s; %d row(s) taken; closest: %.*s\n", name, lens[k],
                st == 0 ? "conformant" : "DIVERGENT", took ? atoi(took + strlen("the oracle took B's side of ")) : 0,
                line ? (int)strcspn(line, "\n") : 1, line ? line : "-");
    }
}

Test(q4peer, bisect_f32_conformant_at_1_8_40_tokens) { fixture_conformant("qwen4exp-f32"); }
Test(q4peer, bisect_q8_0_conformant_at_1_8_40_tokens) { fixture_conformant("qwen4exp-q8_0"); }
Test(q4peer, bisect_ties_conformant_at_1_8_40_tokens) { fixture_conformant("qwen4exp-ties"); }

Test(q4peer, without_the_follow_attn_ctx_diverges_where_the_peer_keeps_other_tied_positions) {
    const char *exe = peer_or_skip();
    static char out[1 << 16];
    const char *model = td_test_fixture(tmpdir, "qwen4exp-f32");
    char dir[700];
    snprintf(dir, sizeof dir, "%s/nofollow", tmpdir);
    const int st = cell(exe, model, dir, 40, "TD_QSA_FOLLOW=0", out, sizeof out);
    cr_expect(st == 1 && strstr(out, "FIRST DIVERGENT  blk.1.attn_ctx  at step 0"), "follow off: exit %d:\n%s", st, out);
}

/* Flash attention on (the CPU arm declares act-q8+rope-f32-mul+fa-f16+fa-cpu):
 * flash attention casts the attention's K/V to f16, but the indexer's key
 * cache stays f32 (kv f32) and its block gather never meets flash attention,
 * so the oracle keeps qsa_kcache unrounded (profile.h
 * td_profile_idx_store_f16). Red with the cache rounded under fa-f16 as
 * well: blk.1.qsa_kcache at step 0, r 141 (1 token) and 209 (8). A wrong
 * raw key (x1.001, what the cache stores) is still named at step 0; the
 * cache tap itself is read from the gather's operand, which the hook
 * refuses to scale (it must not pass as a perturbed run). */
#define FA_ORACLE "--a-profile act-q8+rope-f32-mul+fa-f16+fa-cpu"
Test(q4peer, flash_attention_leaves_the_index_cache_f32) {
    const char *exe = peer_or_skip();
    static char out[1 << 16];
    const char *model = td_test_fixture(tmpdir, "qwen4exp-f32");
    static const int lens[] = {1, 8};
    char dir[700], cmd[4096];
    for (int k = 0; k < 4; k++) {
        const int len = lens[k < 2 ? k : 0];
        snprintf(dir, sizeof dir, "%s/fa-%d-%d", tmpdir, len, k);
        snprintf(cmd, sizeof cmd,
                 "TD_LLAMACPP_FLASH_ATTN=1 %s '%s' bisect --quiet --model '%s' --a ref --b llamacpp --tokens %s "
                 "--steps 2 --threads 1 --filter '" Q4_TAPS "' " FA_ORACLE " --out-dir '%s' 2>&1",
                 k == 2   ? "TD_LLAMACPP_PERTURB='blk.1.qsa_k_raw*1.001'"
                 : k == 3 ? "TD_LLAMACPP_PERTURB='blk.1.qsa_kcache*1.001'"
                          : "",
                 exe, model,
                 len == 1 ? "11" : "11,48,85,122,159,196,233,270", dir);
        const int st = td_test_sh_capture(cmd, out, sizeof out);
        if (k < 2)
            cr_expect(st == 0 && strstr(out, "missing: 0 in A, 0 in B"), "FA on, %d tokens: exit %d:\n%s", len, st,
                      out);
        else if (k == 2)
            cr_expect(st == 1 && strstr(out, "FIRST DIVERGENT  blk.1.qsa_k_raw  at step 0"),
                      "FA on, qsa_k_raw x1.001: exit %d:\n%s", st, out);
        else
            cr_expect(st > 1 && strstr(out, "TD_LLAMACPP_PERTURB: tap blk.1.qsa_kcache is read from an operand"),
                      "FA on, qsa_kcache x1.001 (refused): exit %d:\n%s", st, out);
    }
}

/* The peer has no inp.ple_ids (llama.cpp builds the n-gram context on the
 * host): a three-arm bisect that compares every tap must not call that arm
 * conformant (it crashed in the tie search once, then printed "both arms
 * conformant"); with the tap filtered out, it is. */
Test(q4peer, three_arm_bisect_is_not_conformant_when_an_arm_lacks_a_tap) {
    const char *exe = peer_or_skip();
    static char out[1 << 16];
    const char *model = td_test_fixture(tmpdir, "qwen4exp-f32");
    char cmd[4096];
    for (int filtered = 0; filtered < 2; filtered++) {
        snprintf(cmd, sizeof cmd,
                 "'%s' bisect --model '%s' --a llamacpp --b cpu --tokens 5,17,33,2,90,11,7,250 --steps 2 --threads 1 "
                 "%s --out-dir '%s/three%d' 2>&1",
                 exe, model, filtered ? "--filter '" Q4_TAPS "'" : "", tmpdir, filtered);
        const int st = td_test_sh_capture(cmd, out, sizeof out);
        if (!filtered)
            cr_expect(st == 1 && strstr(out, "arm A (llamacpp) is not conformant") && strstr(out, "inp.ple_ids"),
                      "every tap: exit %d:\n%s", st, out);
        else
            cr_expect(st == 0 && strstr(out, "both arms conformant"), "inp.ple_ids filtered out: exit %d:\n%s", st,
                      out);
    }
}
