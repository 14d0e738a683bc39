/* Tests of the llama.cpp Vulkan arm ("llamacpp:vulkan") on stories260K and a
 * fixture. The oracle is the f64 reference run with the arm's own declared
 * arithmetic profile (three-arm bisect), or the reference's greedy ids, or
 * the arm itself run without taps: never numbers the arm produced alone.
 *
 * They need the llama.cpp peer, the Vulkan library (ci/fetch-llamacpp.sh),
 * libvulkan1 and a Vulkan device (lavapipe on a machine without a GPU), and
 * skip with the reason otherwise. Under the sanitizers they skip too: lavapipe
 * compiles every shader with LLVM inside the process (minutes per arm, and
 * its JIT code is not instrumented), so the plain build runs them once.
 * Mesa's shader cache (~/.cache/tapdiff/mesa_shader_cache) makes every run
 * after the first take seconds. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "fixtures.h"
#include "gguf.h"
#include "profile.h"
#include "reference.h"
#include "runner.h"
#include "tapfile.h"
#include "td_test.h"

#if defined(__SANITIZE_ADDRESS__)
#define TD_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TD_SANITIZED 1
#endif
#endif

static char dir[256];

static void setup(void) {
    td_test_tmpdir(dir, sizeof dir, "vulkan");
}

static void teardown(void) {
    td_test_rmdir(dir);
}

/* Skips unless the Vulkan arm can run here. */
static void require_vulkan(void) {
#ifndef TD_HAVE_LLAMACPP
    cr_skip_test("llama.cpp peer not built (run ci/fetch-llamacpp.sh, then meson setup --reconfigure BUILD)");
#else
#ifdef TD_SANITIZED
    cr_skip_test("the Vulkan arm runs in the plain build only: lavapipe JIT-compiles its shaders with LLVM in the "
                 "process, which takes minutes per arm under ASan and is not instrumented");
#endif
    const td_backend_vt *vt = td_backend_find("llamacpp:vulkan");
    cr_assert_not_null(vt, "llamacpp:vulkan is not registered though the peer is built");
    char why[1024];
    if (vt->probe && vt->probe(why, sizeof why) != TD_OK) cr_skip_test("Vulkan arm unavailable: %s", why);
#endif
}

static char *field(const char *json, const char *key, char *buf, size_t n) {
    // the first "key":value after the given object's key; enough for flat checks
    const char *p = strstr(json, key);
    buf[0] = '\0';
    if (!p) return buf;
    p += strlen(key);
    while (*p == '"' || *p == ':' || *p == ' ') p++;
    size_t i = 0;
    while (p[i] && p[i] != '"' && p[i] != ',' && p[i] != '}' && i + 1 < n) buf[i] = p[i], i++;
    buf[i] = '\0';
    return buf;
}

/* The JSON object of arm "b" in a tapdiff-bisect3 document. */
static const char *arm_b(const char *json) {
    const char *p = strstr(json, "\"b\":{\"arm\"");
    cr_assert_not_null(p, "no arm b in the three-arm JSON: %.300s", json);
    return p;
}

static int bisect3(const char *model, const char *tokens, const char *steps, char **out) {
    const char *args[] = {"bisect", "--model", model, "--a", "llamacpp", "--b", "llamacpp:vulkan", "--tokens", tokens,
                          "--steps", steps, "--threads", "1", "--out-dir", td_test_path(dir, "b3"), "--quiet",
                          "--json", NULL};
    char *err = NULL;
    int rc = td_test_tapdiff_run(dir, out, &err, args);
    if (rc != 0 && rc != 1) cr_log_error("bisect exited %d: %s", rc, err ? err : "");
    free(err);
    return rc;
}

/* A one-token prompt and 16 decode steps: every step is the matrix-vector
 * path (f32), conformant against the reference under its profile. */
Test(vulkan, stories_prompt1_three_arm_conformant, .init = setup, .fini = teardown) {
    require_vulkan();
    const char *model = td_test_shared_model("stories260K.gguf");
    char *out = NULL, b[128];
    int rc = bisect3(model, "1", "16", &out);
    cr_assert_eq(rc, 0, "three-arm bisect llamacpp vs llamacpp:vulkan: exit %d\n%.300s", rc, out);
    cr_assert(strstr(out, "\"wrong_arm\":null"), "%.300s", out);
    cr_assert_str_eq(field(arm_b(out), "\"verdict\"", b, sizeof b), "conformant");
    free(out);
}

/* Prompts of 8 and 40 tokens (the matrix-vector path with several columns,
 * then the tiled f16 path) and 16 decode steps: the arm is conformant with
 * the oracle under its profile (at 40 tokens only once the oracle takes the
 * arm's side of the f16 ties its taps show, ties.h: before, blk.2.attn_ctx
 * at decode step 1 diverged, r 1.18), and its logits stay within 1e-4 of the
 * profile-matched oracle's and 1e-3 of the plain oracle's. */
Test(vulkan, stories_prompts_8_40_logits_close, .init = setup, .fini = teardown) {
    require_vulkan();
    const char *model = td_test_shared_model("stories260K.gguf");
    const char *prompts[2] = {"1,2,3,4,5,6,7,8",
                              "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,"
                              "32,33,34,35,36,37,38,39,40"};
    for (int i = 0; i < 2; i++) {
        char *out = NULL, v[64];
        int rc = bisect3(model, prompts[i], "16", &out);
        cr_assert(rc == 0 || rc == 1, "bisect exit %d", rc);
        const char *bj = arm_b(out);
        const double matched = atof(field(bj, "\"logits_vs_oracle\"", v, sizeof v));
        const double plain = atof(field(bj, "\"logits_vs_plain_oracle\"", v, sizeof v));
        cr_log_info("prompt %d tokens: Vulkan out.logits vs matched oracle %.3g, vs plain %.3g, verdict %s", i ? 40 : 8,
                    matched, plain, field(bj, "\"verdict\"", v, sizeof v));
        cr_assert_str_eq(field(bj, "\"verdict\"", v, sizeof v), "conformant", "prompt %d tokens", i ? 40 : 8);
        cr_assert(matched < 1e-4, "prompt %d: logits vs matched oracle %.3g", i, matched);
        cr_assert(plain < 1e-3, "prompt %d: logits vs plain oracle %.3g", i, plain);
        free(out);
    }
}

/* 201 greedy ids (BOS + 200 decode steps) equal the reference's. */
Test(vulkan, stories_201_greedy_ids_equal_reference, .init = setup, .fini = teardown) {
    require_vulkan();
    const char *model = td_test_shared_model("stories260K.gguf");
    char *ids[2];
    const char *arms[2] = {"ref", "llamacpp:vulkan"};
    for (int i = 0; i < 2; i++) {
        const char *args[] = {"run", "--model", model, "--backend", arms[i], "--tokens", "1", "--steps", "200",
                              "--taps", "none", "--threads", "1", NULL};
        char *out = NULL;
        int rc = td_test_tapdiff_run(dir, &out, NULL, args);
        cr_assert_eq(rc, 0, "run %s: exit %d", arms[i], rc);
        char *s = strstr(out, "sampled:");
        cr_assert_not_null(s, "%s printed no sampled ids", arms[i]);
        s[strcspn(s, "\n")] = '\0';
        ids[i] = strdup(s);
        free(out);
    }
    cr_assert_str_eq(ids[1], ids[0], "greedy ids differ");
    int n = 0;
    for (const char *c = ids[0] + 8; *c; c++) n += *c == ' ' && c[1] && c[1] != ' ';
    cr_assert_eq(n, 201, "expected 201 ids, got %d", n);
    free(ids[0]), free(ids[1]);
}

/* One node of the running Vulkan graph scaled by 1.001 (read from the
 * device, scaled, written back): the three-arm verdict names the GPU arm, at
 * that tap and step, and not the CPU arm; after a one-token prompt and after
 * a 40-token one, where the oracle reads f16 ties from the arm's taps (only
 * those before the first divergence: they cannot hide it). */
Test(vulkan, perturbed_node_named_and_gpu_arm_blamed, .init = setup, .fini = teardown) {
    require_vulkan();
    const char *model = td_test_shared_model("stories260K.gguf");
    setenv("TD_LLAMACPP_PERTURB", "blk.1.attn_v*1.001", 1);
    setenv("TD_LLAMACPP_PERTURB_ARM", "llamacpp:vulkan", 1);
    const char *prompts[2] = {"1", "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,"
                                   "32,33,34,35,36,37,38,39,40"};
    for (int i = 0; i < 2; i++) {
        char *out = NULL, v[128];
        int rc = bisect3(model, prompts[i], "4", &out);
        cr_assert_eq(rc, 1, "prompt %d tokens: a perturbed arm must be divergent (exit %d)\n%.300s", i ? 40 : 1, rc, out);
        cr_assert(strstr(out, "\"wrong_arm\":\"b\""), "%.300s", out);
        const char *bj = arm_b(out);
        cr_assert_str_eq(field(bj, "\"first_tap\"", v, sizeof v), "blk.1.attn_v", "prompt %d tokens", i ? 40 : 1);
        cr_assert_str_eq(field(bj, "\"first_step\"", v, sizeof v), "0", "prompt %d tokens", i ? 40 : 1);
        free(out);
    }
    unsetenv("TD_LLAMACPP_PERTURB");
    unsetenv("TD_LLAMACPP_PERTURB_ARM");
}

/* Taps change nothing: the logits of an untapped run equal those of a fully
 * tapped run bit for bit (every node observed splits the graph there). */
Test(vulkan, untapped_and_tapped_logits_equal, .init = setup, .fini = teardown) {
    require_vulkan();
    const char *model = td_test_shared_model("stories260K.gguf");
    const int32_t prompt[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    // flash attention off, then on (one fused node the taps must not split)
    for (int fa = 0; fa < 2; fa++) {
    if (fa) setenv("TD_LLAMACPP_FLASH_ATTN", "1", 1);
    td_run_result res[2] = {{0}, {0}};
    for (int i = 0; i < 2; i++) {
        td_run_config cfg;
        td_run_config_init(&cfg);
        cfg.model_path = model;
        cfg.backend = "llamacpp:vulkan";
        cfg.prompt = prompt;
        cfg.n_prompt = 8;
        cfg.n_steps = 8;
        cfg.threads = 1;
        cfg.tap_path = i ? td_test_path(dir, fa ? "full-fa.h5" : "full.h5") : NULL;
        cfg.tap_mode = TD_TAP_FULL;
        cfg.keep_all_logits = 1; // every forward's row, not the latest only
        td_err err = {{0}};
        int rc = td_run(&cfg, &res[i], &err);
        cr_assert_eq(rc, TD_OK, "run (%s): %s", i ? "tapped" : "untapped", err.msg);
    }
    const int64_t n = res[0].n_forwards * res[0].n_vocab;
    cr_assert_eq(res[1].n_forwards * res[1].n_vocab, n);
    int64_t diff = 0;
    for (int64_t k = 0; k < n; k++) diff += memcmp(&res[0].logits[k], &res[1].logits[k], sizeof(double)) != 0;
    if (fa) unsetenv("TD_LLAMACPP_FLASH_ATTN");
    cr_assert_eq(diff, 0, "flash attention %s: %lld of %lld logits differ between the untapped and the tapped run",
                 fa ? "on" : "off", (long long)diff, (long long)n);
    td_run_result_free(&res[0]);
    td_run_result_free(&res[1]);
    }
}

/* Flash attention on (one fused node; lavapipe runs ggml-vulkan's scalar
 * shader: f16 Q*scale, K, V and probabilities, an f16 output accumulator per
 * column thread, split-k in one-token steps): the arm declares
 * fa-f16+fa-acc-f16@S and is conformant with the oracle under that profile
 * at prompts of 1 (split-k decode), 8 (grouped-query workgroups) and 40
 * tokens (row blocks of tokens) with decode steps, on stories260K and two
 * fixtures. Red without the rule (fa-f16 alone): stories260K, 1 token,
 * blk.0.attn_ctx at step 1 r ~270. stories260K at 40 tokens is left out:
 * with flash attention off or on, its first divergence is a decode-step
 * flip outside attention (README, "What lavapipe computes"). */
Test(vulkan, flash_attention_conformant, .init = setup, .fini = teardown) {
    require_vulkan();
    char forty[160] = "";
    for (int i = 1; i <= 40; i++) snprintf(forty + strlen(forty), sizeof forty - strlen(forty), "%s%d", i > 1 ? "," : "", i);
    const char *stories = td_test_shared_model("stories260K.gguf"), *llama = td_test_fixture(dir, "llama-f32"),
               *qwen3 = td_test_fixture(dir, "qwen3-f32"), *eight = "1,2,3,4,5,6,7,8";
    const struct {
        const char *model, *tokens;
        int n;
    } cells[] = {{stories, "1", 1}, {stories, eight, 8}, {llama, eight, 8}, {llama, forty, 40}, {qwen3, "1", 1},
                 {qwen3, forty, 40}};
    setenv("TD_LLAMACPP_FLASH_ATTN", "1", 1);
    for (size_t c = 0; c < sizeof cells / sizeof cells[0]; c++) {
        char *out = NULL, v[128], f[128], l[64];
        int rc = bisect3(cells[c].model, cells[c].tokens, "4", &out);
        cr_assert_not_null(out, "bisect printed nothing (exit %d)", rc);
        const char *bj = arm_b(out);
        cr_log_info("flash attention, %s, %d-token prompt: verdict %s, first divergent %s, out.logits vs matched "
                    "oracle %s", strrchr(cells[c].model, '/') + 1, cells[c].n, field(bj, "\"verdict\"", v, sizeof v),
                    field(bj, "\"first_tap\"", f, sizeof f), field(bj, "\"logits_vs_oracle\"", l, sizeof l));
        cr_expect(rc == 0 || rc == 1, "bisect exit %d", rc);
        cr_expect(strstr(field(bj, "\"profile\"", v, sizeof v), "fa-acc-f16@"), "profile %s", v);
        cr_expect_str_eq(field(bj, "\"verdict\"", v, sizeof v), "conformant", "%s, %d-token prompt",
                         cells[c].model, cells[c].n);
        free(out);
    }
    unsetenv("TD_LLAMACPP_FLASH_ATTN");
}

/* An f16 rounding tie (profile.h TD_ACT_TIES_F16_TAU): qwen3moe-ties puts
 * V[0] channel 0 of layer 0 a hair from the midpoint of two f16 values; in an
 * 8-token prefill (attn-f16) the arm's f32 value and the f64 oracle's round
 * to different neighbours, one f16 step that both query heads sharing that
 * KV head see (blk.0.attn_ctx r ~46 against the matched oracle). The oracle
 * takes the arm's side of that tie (and the control the same), and the arm
 * is conformant; the JSON says how many ties the oracle took. */
Test(vulkan, f16_operand_tie_taken_and_conformant, .init = setup, .fini = teardown) {
    require_vulkan();
    const char *model = td_test_fixture(dir, "qwen3moe-ties");
    char *out = NULL, v[64];
    int rc = bisect3(model, "1,2,3,4,5,6,7,8", "2", &out);
    cr_assert_eq(rc, 0, "three-arm bisect on qwen3moe-ties, 8 tokens: exit %d\n%.600s", rc, out);
    const char *bj = arm_b(out);
    cr_assert_str_eq(field(bj, "\"verdict\"", v, sizeof v), "conformant");
    cr_assert_geq(atoi(field(bj, "\"oracle_ties_taken\"", v, sizeof v)), 1, "no tie taken: %s", v);
    free(out);
}

/* The oracle's near-tie log is capped (profile.h TD_ACT_TIES_LOG_MAX): at a
 * cap of 1 (TD_TIES_LOG_MAX) the tie above can no longer be taken; the JSON
 * counts the near-ties past the cap, so the arm's divergence there reads as
 * unexplained rather than as a bug found. */
Test(vulkan, ties_past_the_log_cap_are_counted, .init = setup, .fini = teardown) {
    require_vulkan();
    const char *model = td_test_fixture(dir, "qwen3moe-ties");
    char *out = NULL, v[64];
    setenv("TD_TIES_LOG_MAX", "1", 1);
    int rc = bisect3(model, "1,2,3,4,5,6,7,8", "2", &out);
    unsetenv("TD_TIES_LOG_MAX");
    cr_assert(rc == 0 || rc == 1, "three-arm bisect on qwen3moe-ties: exit %d\n%.600s", rc, out);
    const char *bj = arm_b(out);
    cr_assert_gt(atoi(field(bj, "\"oracle_ties_unlogged\"", v, sizeof v)), 1, "near-ties past the cap: '%s'", v);
    free(out);
}

/* Flash attention on a quantized model: llama-q8_0's Q/K/V come out of f16
 * sums (acc-f16) equal in the oracle and its control, so only RoPE separates
 * them and the control's f16(Q*scale) and f16(K) meet no flip: attn_ctx had
 * a floor budget, and the arm's 7 flips (5 of them small RoPE outputs, not
 * near ties by f16 ulps) read as a divergence (r 38.9; the fa-acc-f16 rule
 * itself reproduces 5118 of 5120 of the arm's values from its own Q/K/V).
 * The oracle reads the arm's side of those roundings from its attn_q_rope
 * (times the scale) and attn_k_rope taps, the search then finds the one
 * probability tie left (pair 156, position 36), and the arm is conformant.
 * Run without the rope rules (TD_LLAMACPP_ROPE_TRIG=0): under rope-trig the
 * control's own RoPE flips f16 roundings too, the budget holds the arm's,
 * and the arm is conformant with no tie read (0 taken), which would leave
 * the reading untested here. */
Test(vulkan, flash_attention_quantized_rope_flips_read_from_the_arm, .init = setup, .fini = teardown) {
    require_vulkan();
    char forty[160] = "";
    for (int i = 1; i <= 40; i++) snprintf(forty + strlen(forty), sizeof forty - strlen(forty), "%s%d", i > 1 ? "," : "", i);
    const char *model = td_test_fixture(dir, "llama-q8_0");
    char *out = NULL, v[128], f[64];
    setenv("TD_LLAMACPP_FLASH_ATTN", "1", 1);
    setenv("TD_LLAMACPP_ROPE_TRIG", "0", 1);
    int rc = bisect3(model, forty, "1", &out);
    unsetenv("TD_LLAMACPP_FLASH_ATTN");
    unsetenv("TD_LLAMACPP_ROPE_TRIG");
    cr_assert_not_null(out, "bisect printed nothing (exit %d)", rc);
    const char *bj = arm_b(out);
    cr_log_info("llama-q8_0 FA on, 40 tokens: verdict %s, first divergent %s, ties %s", field(bj, "\"verdict\"", v, sizeof v),
                field(bj, "\"first_tap\"", f, sizeof f), field(bj, "\"oracle_ties_taken\"", v + 64, 64));
    cr_assert(strstr(field(bj, "\"profile\"", v, sizeof v), "fa-acc-f16@"), "profile %s", v);
    cr_assert(!strstr(v, "rope-"), "profile %s", v);
    cr_assert_eq(rc, 0, "three-arm bisect on llama-q8_0, FA on, 40 tokens: exit %d\n%.600s", rc, out);
    cr_assert_str_eq(field(bj, "\"verdict\"", v, sizeof v), "conformant");
    cr_assert_geq(atoi(field(bj, "\"oracle_ties_taken\"", v, sizeof v)), 7, "ties taken: %s", v);
    free(out);
}

/* The error of tap `tap` at step `at` of candidate `cand` against `oracle`
 * (compare --json's per-tap record); -1 when it is not there. */
static double tap_err_at(const char *oracle, const char *cand, const char *tap, int at) {
    const char *args[] = {"compare", oracle, cand, "--filter", tap, "--json", NULL};
    char *out = NULL;
    int rc = td_test_tapdiff_run(dir, &out, NULL, args);
    cr_assert(rc == 0 || rc == 1, "compare %s %s: exit %d", oracle, cand, rc);
    cJSON *j = cJSON_Parse(out);
    cr_assert_not_null(j, "compare printed no JSON: %.200s", out);
    double e = -1;
    const cJSON *t;
    cJSON_ArrayForEach(t, cJSON_GetObjectItem(j, "taps")) {
        const cJSON *name = cJSON_GetObjectItem(t, "name"), *step = cJSON_GetObjectItem(t, "step");
        if (cJSON_IsString(name) && !strcmp(name->valuestring, tap) && cJSON_IsNumber(step) && step->valueint == at)
            e = cJSON_GetNumberValue(cJSON_GetObjectItem(t, "err"));
    }
    cJSON_Delete(j);
    free(out);
    return e;
}

static double tap_err(const char *oracle, const char *cand, const char *tap) {
    return tap_err_at(oracle, cand, tap, 0);
}

/* The declared acc-f16 rule is what the device computes: in a 40-token step
 * (ggml-vulkan's tiled matmul) the first quantized weight matmul of
 * qwen3-q8_0, blk.0.attn_q, sums f16 products in f16 in the tile's order.
 * Its inputs there are the oracle's but for f32 rounding, so the oracle that
 * applies the rule must sit far closer to the arm than one that sums in f64
 * (measured: 0, bit for bit, with the rule; 1.7e-3 without it; an f16 sum in
 * index order with fused products: 1.3e-3 on qwen3moe-q4_k). */
Test(vulkan, acc_f16_rule_explains_the_tiled_quantized_matmul, .init = setup, .fini = teardown) {
    require_vulkan();
    const char *model = td_test_fixture(dir, "qwen3-q8_0");
    char toks[160] = "";
    for (int i = 1; i <= 40; i++) snprintf(toks + strlen(toks), sizeof toks - strlen(toks), "%s%d", i > 1 ? "," : "", i);
    const char *vk = td_test_path(dir, "vk.h5");
    const char *run_vk[] = {"run", "--model", model, "--backend", "llamacpp:vulkan", "--tokens", toks, "--steps", "1",
                            "--taps", "inp.*,blk.0.attn_q", "--threads", "1", "--out", vk, "--quiet", NULL};
    int rc = td_test_tapdiff_run(dir, NULL, NULL, run_vk);
    cr_assert_eq(rc, 0, "vulkan run: exit %d", rc);
    const char *prof[2] = {"attn-f16+mm-f16@8+acc-f16", "attn-f16+mm-f16@8"};
    double e[2];
    for (int i = 0; i < 2; i++) {
        const char *ref = td_test_path(dir, i ? "ref-f64sum.h5" : "ref-acc16.h5");
        char decode[1100];
        snprintf(decode, sizeof decode, "pinned:%s", td_test_path(dir, "vk.h5"));
        const char *run_ref[] = {"run", "--model", model, "--backend", "ref", "--profile", prof[i], "--tokens", toks,
                                 "--steps", "1", "--decode", decode, "--taps", "blk.0.attn_q", "--out", ref, "--quiet",
                                 NULL};
        rc = td_test_tapdiff_run(dir, NULL, NULL, run_ref);
        cr_assert_eq(rc, 0, "ref --profile %s: exit %d", prof[i], rc);
        e[i] = tap_err(ref, td_test_path(dir, "vk.h5"), "blk.0.attn_q");
        cr_assert_geq(e[i], 0, "no blk.0.attn_q at step 0 in the comparison");
        cr_log_info("blk.0.attn_q, 40 tokens: Vulkan vs ref --profile %s: %.3g", prof[i], e[i]);
    }
    cr_assert_gt(e[1], 1e-4, "without acc-f16 the arm should be visibly off (%.3g)", e[1]);
    cr_assert_lt(e[0], 1e-6, "acc-f16 does not explain the arm: %.3g with the rule, %.3g without", e[0], e[1]);
}

/* One matmul of a 40-token step of the Vulkan arm on fixture `fixture`:
 * its input tap `in` (x, 40 x K, rounded to f16 as the tile loads it) and
 * output tap `out` (y, 40 x M) of step 0, and the weight (K = ne[0],
 * M = ne[1]) from *g, left open. */
static const td_tensor *arm_matmul_io(const char *fixture, const char *in, const char *out, const char *weight,
                                      td_gguf **g, double **x, double **y) {
    const char *model = td_test_fixture(dir, fixture);
    char toks[160] = "", taps[128];
    for (int i = 1; i <= 40; i++) snprintf(toks + strlen(toks), sizeof toks - strlen(toks), "%s%d", i > 1 ? "," : "", i);
    snprintf(taps, sizeof taps, "%s,%s", in, out);
    const char *vk = td_test_path(dir, "vk.h5");
    const char *run_vk[] = {"run", "--model", model, "--backend", "llamacpp:vulkan", "--tokens", toks, "--steps", "0",
                            "--taps", taps, "--threads", "1", "--out", vk, "--quiet", NULL};
    int rc = td_test_tapdiff_run(dir, NULL, NULL, run_vk);
    cr_assert_eq(rc, 0, "vulkan run: exit %d", rc);
    td_err err = {{0}};
    cr_assert_eq(td_gguf_open(g, model, &err), TD_OK, "%s", err.msg);
    const td_tensor *W = td_gguf_tensor(*g, weight);
    cr_assert_not_null(W, "%s", weight);
    const int64_t K = W->ne[0], M = W->ne[1], T = 40;
    td_tapfile *f = NULL;
    cr_assert_eq(td_tapfile_open(&f, vk, &err), TD_OK, "%s", err.msg);
    *x = malloc(sizeof(double) * (size_t)(T * K)), *y = malloc(sizeof(double) * (size_t)(T * M));
    cr_assert_eq(td_tapfile_read_f64(f, 0, in, *x, (uint64_t)(T * K), &err), TD_OK, "%s", err.msg);
    cr_assert_eq(td_tapfile_read_f64(f, 0, out, *y, (uint64_t)(T * M), &err), TD_OK, "%s", err.msg);
    td_tapfile_close(f);
    td_f16_round_f64(*x, *x, T * K);
    return W;
}

/* The acc-f16 rule holds at the output projection too: from the arm's own
 * blk.0.attn_ctx (its input, as the device holds it) the rule reproduces the
 * arm's blk.0.attn_out of a 40-token step bit for bit, every element, on
 * llama-q8_0 (Q8_0 attn_output, K = 128); an f32 sum of the same f16
 * operands matches almost none. So the r 2.15 this tap showed against the
 * oracle was its input's f16 roundings (ties.h reads them from the arm's
 * taps), not a missing rule. */
Test(vulkan, acc_f16_rule_reproduces_attn_out_from_the_arms_own_input, .init = setup, .fini = teardown) {
    require_vulkan();
    td_gguf *g = NULL;
    double *x, *y;
    const td_tensor *W = arm_matmul_io("llama-q8_0", "blk.0.attn_ctx", "blk.0.attn_out", "blk.0.attn_output.weight", &g, &x, &y);
    const int64_t K = W->ne[0], M = W->ne[1], T = 40;
    double *w = malloc(sizeof(double) * (size_t)K);
    td_err err = {{0}};
    int64_t same = 0, same_f32 = 0;
    for (int64_t o = 0; o < M; o++) {
        cr_assert_eq(td_tensor_decode_row_f64(W, (uint64_t)o, w, &err), TD_OK, "%s", err.msg);
        td_f16_round_f64(w, w, K); // and the dequantized weights
        for (int64_t t = 0; t < T; t++) {
            float f32 = 0;
            for (int64_t k = 0; k < K; k++) f32 += (float)(w[k] * x[t * K + k]); // products of f16 values: exact
            same += (float)td_ref_dot_acc16_f64(w, x + t * K, K, 2) == (float)y[t * M + o];
            same_f32 += f32 == (float)y[t * M + o];
        }
    }
    free(x), free(y), free(w);
    td_gguf_close(g);
    cr_log_info("blk.0.attn_out, 40 tokens: %lld of %lld equal under acc-f16, %lld with f32 sums", (long long)same,
                (long long)(T * M), (long long)same_f32);
    cr_assert_lt(same_f32, T * M / 2, "f32 sums should not explain the arm (%lld equal)", (long long)same_f32);
    cr_assert_eq(same, T * M, "acc-f16 reproduces %lld of %lld outputs", (long long)same, (long long)(T * M));
}

/* The prompt's tokens as "1,2,...". */
static void token_list(const int32_t *prompt, int n, char *buf, size_t cap) {
    buf[0] = '\0';
    for (int i = 0; i < n; i++) snprintf(buf + strlen(buf), cap - strlen(buf), "%s%d", i ? "," : "", prompt[i]);
}

/* The Vulkan arm with flash attention on: the prompt and one decode step,
 * full taps of filter into path; the profile it declared into profile. */
static void vulkan_fa_run(const char *model, const int32_t *prompt, int n, const char *filter, const char *path,
                          char *profile, size_t cap) {
    setenv("TD_LLAMACPP_FLASH_ATTN", "1", 1);
    td_run_config cfg;
    td_run_config_init(&cfg);
    cfg.model_path = model;
    cfg.backend = "llamacpp:vulkan";
    cfg.prompt = prompt;
    cfg.n_prompt = n;
    cfg.n_steps = 1;
    cfg.threads = 1;
    cfg.tap_path = path;
    cfg.tap_mode = TD_TAP_FULL;
    cfg.tap_filter = filter;
    td_run_result res = {0};
    td_err err = {{0}};
    int rc = td_run(&cfg, &res, &err);
    unsetenv("TD_LLAMACPP_FLASH_ATTN");
    cr_assert_eq(rc, TD_OK, "vulkan run: %s", err.msg);
    snprintf(profile, cap, "%s", res.profile);
    td_run_result_free(&res);
}

/* blk.0.attn_ctx of the Vulkan file vk (vulkan_fa_run) against `ref` run
 * under profile prof on vk's tokens into ref_path: the error at the
 * prefill (e[0]) and at the decode step (e[1]). */
static void fa_ref_errors(const char *model, const int32_t *prompt, int n, const char *prof, const char *ref_path,
                          const char *vk, double e[2]) {
    char toks[400], decode[1100];
    token_list(prompt, n, toks, sizeof toks);
    snprintf(decode, sizeof decode, "pinned:%s", vk);
    const char *run_ref[] = {"run", "--model", model, "--backend", "ref", "--profile", prof, "--tokens", toks,
                             "--steps", "1", "--decode", decode, "--taps", "blk.0.attn_ctx", "--out", ref_path,
                             "--quiet", NULL};
    int rc = td_test_tapdiff_run(dir, NULL, NULL, run_ref);
    cr_assert_eq(rc, 0, "ref --profile %s: exit %d", prof, rc);
    for (int st = 0; st < 2; st++) {
        e[st] = tap_err_at(ref_path, vk, "blk.0.attn_ctx", st);
        cr_assert_geq(e[st], 0, "no blk.0.attn_ctx at step %d in the comparison", st);
        cr_log_info("blk.0.attn_ctx step %d (%s): Vulkan vs ref --profile %s: %.3g", st,
                    st ? "1 token" : "the prompt", prof, e[st]);
    }
}

/* The declared fa-acc-f16 rule is what lavapipe's flash-attention shader
 * computes: blk.0.attn_ctx of stories260K in a 40-token step (row blocks of
 * query tokens) and in the one-token step after it (split-k, the partials
 * combined in f32), whose inputs are the oracle's but for f32 rounding,
 * must sit at least 10x closer to an oracle that applies the rule than to
 * one with fa-f16 alone (K and V in f16, every sum in f64). */
Test(vulkan, fa_acc_f16_rule_explains_flash_attention, .init = setup, .fini = teardown) {
    require_vulkan();
    const char *model = td_test_shared_model("stories260K.gguf");
    int32_t prompt[40];
    for (int i = 0; i < 40; i++) prompt[i] = i + 1;
    const char *vk = td_test_path(dir, "vk.h5");
    char with[128], without[128];
    vulkan_fa_run(model, prompt, 40, "inp.*,blk.0.attn_ctx", vk, with, sizeof with);
    char *rule = strstr(with, "+fa-acc-f16@");
    cr_assert_not_null(rule, "flash attention on lavapipe should declare fa-acc-f16@S: %s", with);
    snprintf(without, sizeof without, "%.*s%s", (int)(rule - with), with, rule + strcspn(rule + 1, "+") + 1);
    double e[2][2];
    fa_ref_errors(model, prompt, 40, with, td_test_path(dir, "ref-faacc.h5"), vk, e[0]);
    fa_ref_errors(model, prompt, 40, without, td_test_path(dir, "ref-fa16.h5"), vk, e[1]);
    // measured: 1.8e-5 and 1.4e-6 with the rule (ref32 under it: 3.3e-5 and
    // 3.6e-7 from the oracle, so f16 rounding flips), 7.8e-4 and 4.4e-4 without
    for (int st = 0; st < 2; st++) {
        cr_expect_gt(e[1][st], 1e-4, "step %d: without fa-acc-f16 the arm should be visibly off (%.3g)", st, e[1][st]);
        cr_expect_lt(e[0][st], e[1][st] / 10, "step %d: fa-acc-f16 does not explain the arm: %.3g with the rule, %.3g "
                     "without", st, e[0][st], e[1][st]);
    }
}

/* The experts of a MoE step round as the step's other weight matmuls: the
 * arm's MUL_MAT_ID takes ggml-vulkan's tiled f16 path for every expert of a
 * step of more than 8 tokens, however few tokens chose the expert. From the
 * arm's own expert inputs (llama.cpp's ffn_moe_swiglu node, as the device
 * holds it) and its router picks, acc-f16 reproduces every output of its
 * ffn_moe_down node of a 40-token step bit for bit on qwen3moe-q4_k,
 * experts chosen by 8 tokens or fewer included (the reference rounded those
 * in f32: blk.1.attn_ctx r 1.72 after 50 ties, the rule applied per expert's
 * token count instead of the step's); an f32 sum of the same f16 operands
 * matches few. */
Test(vulkan, acc_f16_rule_reproduces_every_expert_of_a_moe_step, .init = setup, .fini = teardown) {
    require_vulkan();
    const char *model = td_test_fixture(dir, "qwen3moe-q4_k");
    char toks[160] = "";
    for (int i = 1; i <= 40; i++) snprintf(toks + strlen(toks), sizeof toks - strlen(toks), "%s%d", i > 1 ? "," : "", i);
    const char *vk = td_test_path(dir, "vk.h5");
    const char *act = "llamacpp.ffn_moe_swiglu-0.SWIGLU", *down = "llamacpp.ffn_moe_down-0.MUL_MAT_ID";
    char taps[200];
    snprintf(taps, sizeof taps, "blk.0.moe_topk,%s,%s", act, down);
    const char *run_vk[] = {"run", "--model", model, "--backend", "llamacpp:vulkan", "--tokens", toks, "--steps", "0",
                            "--taps", taps, "--threads", "1", "--out", vk, "--quiet", NULL};
    setenv("TD_LLAMACPP_ALL_NODES", "1", 1);
    int rc = td_test_tapdiff_run(dir, NULL, NULL, run_vk);
    unsetenv("TD_LLAMACPP_ALL_NODES");
    cr_assert_eq(rc, 0, "vulkan run: exit %d", rc);
    td_err err = {{0}};
    td_gguf *g = NULL;
    cr_assert_eq(td_gguf_open(&g, model, &err), TD_OK, "%s", err.msg);
    const td_tensor *W = td_gguf_tensor(g, "blk.0.ffn_down_exps.weight");
    cr_assert_not_null(W);
    const int64_t F = W->ne[0], E = W->ne[1], X = W->ne[2], T = 40, K = 2;
    td_tapfile *f = NULL;
    cr_assert_eq(td_tapfile_open(&f, vk, &err), TD_OK, "%s", err.msg);
    int64_t *pick = malloc(sizeof(int64_t) * (size_t)(T * K));
    double *x = malloc(sizeof(double) * (size_t)(T * K * F)), *y = malloc(sizeof(double) * (size_t)(T * K * E)),
           *w = malloc(sizeof(double) * (size_t)F);
    cr_assert_eq(td_tapfile_read_i64(f, 0, "blk.0.moe_topk", pick, (uint64_t)(T * K), &err), TD_OK, "%s", err.msg);
    cr_assert_eq(td_tapfile_read_f64(f, 0, act, x, (uint64_t)(T * K * F), &err), TD_OK, "%s", err.msg);
    cr_assert_eq(td_tapfile_read_f64(f, 0, down, y, (uint64_t)(T * K * E), &err), TD_OK, "%s", err.msg);
    td_tapfile_close(f);
    td_f16_round_f64(x, x, T * K * F); // the tile loads the activations in f16
    int64_t used[64] = {0};
    cr_assert_leq(X, 64);
    for (int64_t i = 0; i < T * K; i++) {
        cr_assert(pick[i] >= 0 && pick[i] < X, "router pick %lld", (long long)pick[i]);
        used[pick[i]]++;
    }
    int64_t same = 0, same_f32 = 0, few = 0, same_few = 0;
    for (int64_t i = 0; i < T * K; i++) {
        const int small = used[pick[i]] <= 8;
        for (int64_t o = 0; o < E; o++) {
            cr_assert_eq(td_tensor_decode_row_f64(W, (uint64_t)(pick[i] * E + o), w, &err), TD_OK, "%s", err.msg);
            td_f16_round_f64(w, w, F); // and the dequantized weights
            float f32 = 0;
            for (int64_t k = 0; k < F; k++) f32 += (float)(w[k] * x[i * F + k]); // products of f16 values: exact
            const int eq = (float)td_ref_dot_acc16_f64(w, x + i * F, F, 2) == (float)y[i * E + o];
            same += eq, same_f32 += f32 == (float)y[i * E + o];
            few += small, same_few += small && eq;
        }
    }
    free(pick), free(x), free(y), free(w);
    td_gguf_close(g);
    cr_log_info("blk.0 expert down projections, 40 tokens: %lld of %lld equal under acc-f16 (%lld of %lld of experts "
                "chosen by <= 8 tokens), %lld with f32 sums",
                (long long)same, (long long)(T * K * E), (long long)same_few, (long long)few, (long long)same_f32);
    cr_assert_gt(few, 0, "no expert chosen by 8 tokens or fewer: the check would not reach the point it is about");
    cr_assert_lt(same_f32, T * K * E / 2, "f32 sums should not explain the arm (%lld equal)", (long long)same_f32);
    cr_assert_eq(same, T * K * E, "acc-f16 reproduces %lld of %lld outputs", (long long)same, (long long)(T * K * E));
}

/* qwen3moe-q4_k, 40-token prompt and one decode step: the Vulkan arm is
 * conformant with the oracle under its profile once the reference rounds
 * every expert of the step as the arm does (above); before, it diverged at
 * blk.1.attn_ctx of the prefill (r 1.72, 50 ties read from the arm's taps,
 * blk.0.ffn_out already 2.2e-3 from the oracle). */
Test(vulkan, moe_40_tokens_three_arm_conformant, .init = setup, .fini = teardown) {
    require_vulkan();
    const char *model = td_test_fixture(dir, "qwen3moe-q4_k");
    char toks[160] = "", *out = NULL, v[64], t[64];
    for (int i = 1; i <= 40; i++) snprintf(toks + strlen(toks), sizeof toks - strlen(toks), "%s%d", i > 1 ? "," : "", i);
    int rc = bisect3(model, toks, "1", &out);
    cr_assert(rc == 0 || rc == 1, "bisect exit %d", rc);
    const char *bj = arm_b(out);
    cr_log_info("qwen3moe-q4_k, 40 tokens: Vulkan %s, %s ties taken", field(bj, "\"verdict\"", v, sizeof v),
                field(bj, "\"oracle_ties_taken\"", t, sizeof t));
    cr_assert_str_eq(field(bj, "\"verdict\"", v, sizeof v), "conformant", "%.600s", bj);
    cr_assert_eq(rc, 0, "three-arm bisect: exit %d", rc);
    free(out);
}

/* IQ2_XXS in the tiled f16 matmul (a 40-token prefill): lavapipe's tile
 * loader rounds the group scale d*(2s+1)/8 to f16 before multiplying it by
 * the grid value (mul_mm_funcs.glsl), and acc-f16 forms the weight so. Before
 * (the exact weight rounded to f16 once), llama-iq2_xxs diverged at its one
 * IQ2_XXS matmul, blk.0.ffn_out of the prefill, r 2.43. With the later rules
 * (rope-trig) the control's error there hides it: without the rule the cell
 * is conformant (r 0.19), so the test below is the one that fails then. */
Test(vulkan, acc_f16_rule_forms_iq2_xxs_as_the_tile_loader, .init = setup, .fini = teardown) {
    require_vulkan();
    const char *model = td_test_fixture(dir, "llama-iq2_xxs");
    char toks[160] = "", *out = NULL, v[64], f[128];
    for (int i = 1; i <= 40; i++) snprintf(toks + strlen(toks), sizeof toks - strlen(toks), "%s%d", i > 1 ? "," : "", i);
    int rc = bisect3(model, toks, "1", &out);
    cr_assert(rc == 0 || rc == 1, "bisect exit %d", rc);
    const char *bj = arm_b(out);
    cr_assert_str_eq(field(bj, "\"verdict\"", v, sizeof v), "conformant", "first divergent %s; %.600s",
                     field(bj, "\"name\"", f, sizeof f), bj);
    cr_assert_eq(rc, 0, "three-arm bisect: exit %d", rc);
    free(out);
}

/* The f16 tile mode at its own matmul: from the arm's blk.0.ffn_act of a
 * 40-token step (ffn_down's input, as the device holds it) the acc-f16 sums
 * over the IQ2_XXS weight as TD_ROW_F16_TILE forms it reproduce the arm's
 * blk.0.ffn_out; the weight rounded to f16 once (TD_ROW_F16) reproduces far
 * fewer (56%). The three-arm bisect above no longer tells the two apart on this
 * revision (without the rule: conformant, blk.0.ffn_out r 0.19 against 0.11
 * with it, its control error 1.3e-3 there), so this is the check that can
 * fail when the rule is missing. */
Test(vulkan, f16_tile_mode_reproduces_the_iq2_xxs_matmul_from_the_arms_own_input, .init = setup, .fini = teardown) {
    require_vulkan();
    td_gguf *g = NULL;
    double *x, *y;
    const td_tensor *W = arm_matmul_io("llama-iq2_xxs", "blk.0.ffn_act", "blk.0.ffn_out", "blk.0.ffn_down.weight", &g, &x, &y);
    cr_assert_eq(W->type, TD_TYPE_IQ2_XXS, "ffn_down is %s", td_type_name(W->type));
    const int64_t K = W->ne[0], M = W->ne[1], T = 40;
    double *w = malloc(sizeof(double) * (size_t)K);
    td_err err = {{0}};
    const td_row_mode mode[2] = {TD_ROW_F16_TILE, TD_ROW_F16};
    int64_t same[2] = {0, 0};
    for (int m = 0; m < 2; m++)
        for (int64_t o = 0; o < M; o++) {
            cr_assert_eq(td_tensor_decode_row_as_f64(W, (uint64_t)o, w, mode[m], &err), TD_OK, "%s", err.msg);
            for (int64_t t = 0; t < T; t++)
                same[m] += (float)td_ref_dot_acc16_f64(w, x + t * K, K, 2) == (float)y[t * M + o];
        }
    free(x), free(y), free(w);
    td_gguf_close(g);
    cr_log_info("blk.0.ffn_out (IQ2_XXS), 40 tokens: %lld of %lld equal with the f16 tile, %lld with f16 weights",
                (long long)same[0], (long long)(T * M), (long long)same[1]);
    // measured: 5120 of 5120 with the tile, 2871 with f16 weights (the scale not an f16 in most groups)
    cr_assert_lt(same[1], T * M * 3 / 4, "f16 weights should not explain the arm (%lld equal)", (long long)same[1]);
    cr_assert_eq(same[0], T * M, "the f16 tile reproduces %lld of %lld outputs", (long long)same[0], (long long)(T * M));
}

/* ---- hybrid architectures (qwen4exp, qwen3next) ------------------------ */

/* Every catalog tap the llama.cpp arms emit on qwen4exp: they build the
 * n-gram context on the host, so inp.ple_ids would count as missing. */
#define HYB_Q4_TAPS "blk.*,out.*,hist.*,inp.tokens,inp.pos,inp.embd,inp.ple_embd,inp.ple_rows"

/* bisect3 with a tap filter (NULL: every tap); *out the JSON. */
static int bisect3_filtered(const char *model, const char *tokens, const char *steps, const char *filter, char **out) {
    const char *args[] = {"bisect", "--model", model, "--a", "llamacpp", "--b", "llamacpp:vulkan", "--tokens", tokens,
                          "--steps", steps, "--threads", "1", "--out-dir", td_test_path(dir, "b3"), "--quiet",
                          "--json", filter ? "--filter" : NULL, filter, NULL};
    char *err = NULL;
    int rc = td_test_tapdiff_run(dir, out, &err, args);
    if (rc != 0 && rc != 1) cr_log_error("bisect exited %d: %s", rc, err ? err : "");
    free(err);
    return rc;
}

/* qwen4exp's indexer score is one mul_mat of the pooled keys by the queries
 * of every index head and token: 2 heads x 8 tokens = 16 columns, above
 * ggml-vulkan's matrix-vector limit, so its tiled matmul loads both
 * activations into f16 tiles (mm-f16@8 counts those columns, profile.h).
 * At 8 tokens the weight matmuls are still matrix-vector (f32), so an oracle
 * without mm-f16 differs from the declared one only there. The arm's
 * blk.1.qsa_scores of the prefill must sit 10x closer to the oracle with the
 * rule (measured: 7.3e-7 with it, 7.0e-5 without; the three-arm bisect was
 * divergent there, r 62.7); the one-token step after it (2 columns,
 * matrix-vector) is f32 either way. */
Test(vulkan, mm_f16_rule_explains_the_qsa_score_matmul, .init = setup, .fini = teardown) {
    require_vulkan();
    const char *model = td_test_fixture(dir, "qwen4exp-f32");
    const char *toks = "1,2,3,4,5,6,7,8", *vk = td_test_path(dir, "vk.h5");
    const char *run_vk[] = {"run", "--model", model, "--backend", "llamacpp:vulkan", "--tokens", toks, "--steps", "1",
                            "--taps", "inp.*,blk.1.qsa_scores", "--threads", "1", "--out", vk, "--quiet", NULL};
    int rc = td_test_tapdiff_run(dir, NULL, NULL, run_vk);
    cr_assert_eq(rc, 0, "vulkan run: exit %d", rc);
    const char *prof[2] = {"attn-f16+mm-f16@8+acc-f16", "attn-f16+acc-f16"};
    double e[2];
    for (int i = 0; i < 2; i++) {
        const char *ref = td_test_path(dir, i ? "ref-nomm.h5" : "ref-mm.h5");
        char decode[1100];
        snprintf(decode, sizeof decode, "pinned:%s", vk);
        const char *run_ref[] = {"run", "--model", model, "--backend", "ref", "--profile", prof[i], "--tokens", toks,
                                 "--steps", "1", "--decode", decode, "--taps", "blk.1.qsa_scores", "--out", ref,
                                 "--quiet", NULL};
        rc = td_test_tapdiff_run(dir, NULL, NULL, run_ref);
        cr_assert_eq(rc, 0, "ref --profile %s: exit %d", prof[i], rc);
        e[i] = tap_err(ref, vk, "blk.1.qsa_scores");
        cr_assert_geq(e[i], 0, "no blk.1.qsa_scores at step 0 in the comparison");
        cr_log_info("blk.1.qsa_scores, 8 tokens: Vulkan vs ref --profile %s: %.3g", prof[i], e[i]);
    }
    cr_assert_gt(e[1], 1e-5, "without the rule the arm should be visibly off (%.3g)", e[1]);
    cr_assert_lt(e[0], e[1] / 10, "mm-f16 does not explain the score matmul: %.3g with it, %.3g without", e[0], e[1]);
}

/* With the rule, qwen4exp-f32 at 8 and 40 tokens is conformant on the
 * Vulkan arm (4 decode steps; red without the rule: divergent at
 * blk.1.qsa_scores of the prefill, r 62.7 at 8 tokens). */
Test(vulkan, qwen4exp_three_arm_conformant, .init = setup, .fini = teardown) {
    require_vulkan();
    const char *model = td_test_fixture(dir, "qwen4exp-f32");
    const char *prompts[2] = {"1,2,3,4,5,6,7,8",
                              "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,"
                              "32,33,34,35,36,37,38,39,40"};
    for (int i = 0; i < 2; i++) {
        char *out = NULL, v[64], tap[96];
        int rc = bisect3_filtered(model, prompts[i], "4", HYB_Q4_TAPS, &out);
        const char *bj = arm_b(out);
        cr_assert_eq(rc, 0, "qwen4exp-f32, %d tokens: exit %d, Vulkan arm %s at %s\n%.400s", i ? 40 : 8, rc,
                     field(bj, "\"verdict\"", v, sizeof v), field(bj, "\"first_tap\"", tap, sizeof tap), out);
        cr_assert_str_eq(field(bj, "\"verdict\"", v, sizeof v), "conformant");
        free(out);
    }
}

/* qwen3next's conv state after a 40-token prefill is the last 3 rows of the
 * conv input ssm_qkv, copied: those rows of the arm carry f16 flips of the
 * tiled matmul that the control happened not to meet there (its error on
 * them 1.9e-7, on the whole ssm_qkv 2.4e-4), so judged on its own the state
 * read r 247 while ssm_qkv itself was r 0.22. compare now gives a tap that
 * copies rows of its input that input's control error (compare.c,
 * copies_rows_of_input), and the prefill is conformant. */
Test(vulkan, qwen3next_conv_state_judged_as_a_copy_of_its_input, .init = setup, .fini = teardown) {
    require_vulkan();
    const char *model = td_test_fixture(dir, "qwen3next-f32");
    char *out = NULL, v[64], tap[96];
    int rc = bisect3_filtered(model,
                              "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,"
                              "32,33,34,35,36,37,38,39,40",
                              "0", NULL, &out);
    const char *bj = arm_b(out);
    cr_assert_eq(rc, 0, "qwen3next-f32, 40 tokens: exit %d, Vulkan arm %s at %s\n%.400s", rc,
                 field(bj, "\"verdict\"", v, sizeof v), field(bj, "\"first_tap\"", tap, sizeof tap), out);
    cr_assert_str_eq(field(bj, "\"verdict\"", v, sizeof v), "conformant");
    free(out);
}

/* ---- the rotary embedding at late positions (rope-f32-pow + rope-trig) -- */

/* llama-f32: NORM pairs (x[2i], x[2i+1]), R = D = 32, base 10000, 4 query
 * and 2 KV heads (fixtures/). */
#define ROPE_R 32
#define ROPE_BASE 10000.0

/* The largest error of the arm's own rotation of `in` into `out` (step s,
 * position s after a one-token prompt), per pair, against the exact
 * rotation by the angle as its shader forms it (f32 pos * pow(ts, i),
 * td_rope_angle_f32), in units of 2^-24 (1 + |theta|) of the pair's length:
 * into worst[0] over every pair, worst[1] over the pairs with |theta| >= 4,
 * where the f32 rounding of the rotation itself is under half a unit. */
static void rope_worst_units(const td_tapfile *f, int64_t s, const char *in, const char *out, int64_t heads,
                             double worst[2]) {
    double x[4 * ROPE_R], y[4 * ROPE_R];
    const uint64_t n = (uint64_t)(heads * ROPE_R);
    td_err err = {{0}};
    cr_assert_eq(td_tapfile_read_f64(f, s, in, x, n, &err), TD_OK, "%s", err.msg);
    cr_assert_eq(td_tapfile_read_f64(f, s, out, y, n, &err), TD_OK, "%s", err.msg);
    for (int64_t i = 0; i < ROPE_R / 2; i++) {
        const double th = (double)td_rope_angle_f32(TD_ROPE_ANGLE_F32_POW, s, i, ROPE_R, ROPE_BASE);
        const double c = cos(th), sn = sin(th);
        for (int64_t h = 0; h < heads; h++) {
            const double u = x[h * ROPE_R + 2 * i], v = x[h * ROPE_R + 2 * i + 1];
            const double len = hypot(u, v);
            if (len == 0) continue;
            const double e = hypot(y[h * ROPE_R + 2 * i] - (u * c - v * sn), y[h * ROPE_R + 2 * i + 1] - (u * sn + v * c));
            const double units = e / (len * ldexp(1.0, -24) * (1 + fabs(th)));
            if (units > worst[0]) worst[0] = units;
            if (fabs(th) >= 4 && units > worst[1]) worst[1] = units;
        }
    }
}

/* What the device's rope computes, from its own taps: each pair of
 * blk.0.attn_q/attn_k (llama-f32, 1 token + 64 steps, positions 0-64) is
 * rotated within the rope-trig@U bound the arm declares for lavapipe
 * (measured: worst 3.5, from pow(theta_scale, i) 3-4 f32 ulps off the host's
 * powf at some pairs), and the bound is needed: at |theta| >= 4 the f32
 * rounding of the rotation alone stays under half a unit, the device shows
 * 2.6. A device whose pow/sin/cos outgrow the declared U fails here first. */
Test(vulkan, rope_trig_bound_holds_on_the_device, .init = setup, .fini = teardown) {
    require_vulkan();
    const char *model = td_test_fixture(dir, "llama-f32");
    const char *vk = td_test_path(dir, "vk.h5");
    const char *run_vk[] = {"run", "--model", model, "--backend", "llamacpp:vulkan", "--tokens", "1", "--steps", "64",
                            "--taps", "blk.0.attn_q,blk.0.attn_k,blk.0.attn_q_rope,blk.0.attn_k_rope", "--threads", "1",
                            "--out", vk, "--quiet", NULL};
    int rc = td_test_tapdiff_run(dir, NULL, NULL, run_vk);
    cr_assert_eq(rc, 0, "vulkan run: exit %d", rc);
    td_err err = {{0}};
    td_tapfile *f = NULL;
    cr_assert_eq(td_tapfile_open(&f, vk, &err), TD_OK, "%s", err.msg);
    char *prof = NULL, why[256];
    cr_assert_eq(td_tapfile_attr_str(f, "profile", &prof, &err), TD_OK, "%s", err.msg);
    td_profile p;
    cr_assert_eq(td_profile_parse(prof, &p, why, sizeof why), 0, "%s", why);
    cr_assert(p.rules & TD_RULE_ROPE_TRIG, "the Vulkan arm declares no rope-trig: %s", prof);
    cr_assert_eq(td_profile_rope_angle(&p), TD_ROPE_ANGLE_F32_POW, "%s", prof);
    double worst[2] = {0, 0};
    for (int64_t s = 0; s <= 64; s++) {
        rope_worst_units(f, s, "blk.0.attn_q", "blk.0.attn_q_rope", 4, worst);
        rope_worst_units(f, s, "blk.0.attn_k", "blk.0.attn_k_rope", 2, worst);
    }
    td_tapfile_close(f);
    cr_log_info("llama-f32 positions 0-64: the device's rotation is within %.2f units of 2^-24 (1 + |theta|) "
                "(%.2f where |theta| >= 4), declared %s", worst[0], worst[1], prof);
    cr_assert_leq(worst[0], (double)p.rope_trig_u, "the device's rotation (%.2f units) exceeds its declared %s",
                  worst[0], prof);
    cr_assert_gt(worst[1], 1.0,
                 "f32 rounding alone explains the rotation at |theta| >= 4 (%.2f units): the bound is not the device's",
                 worst[1]);
    free(prof);
}

/* The late-position cells the rule is for, as a verdict: qwen3moe-ties, 40
 * tokens + 16 decode steps (positions to 55). Without a rope rule the arm
 * diverged at blk.0.attn_q_rope step 16 (r 1.02); with rope-f32-pow alone
 * (the control's own f32 angle error taken away, nothing for the device's
 * pow/sin/cos put back) at step 3 (r 1.2). */
Test(vulkan, rope_late_positions_three_arm_conformant, .init = setup, .fini = teardown) {
    require_vulkan();
    const char *model = td_test_fixture(dir, "qwen3moe-ties");
    char toks[160] = "", *out = NULL, v[64], tap[96], st[32], pr[160];
    for (int i = 1; i <= 40; i++) snprintf(toks + strlen(toks), sizeof toks - strlen(toks), "%s%d", i > 1 ? "," : "", i);
    int rc = bisect3(model, toks, "16", &out);
    cr_assert(rc == 0 || rc == 1, "bisect exit %d", rc);
    const char *bj = arm_b(out);
    cr_assert_eq(rc, 0, "qwen3moe-ties, 40 tokens + 16 steps: exit %d, Vulkan arm %s at %s step %s (profile %s)", rc,
                 field(bj, "\"verdict\"", v, sizeof v), field(bj, "\"first_tap\"", tap, sizeof tap),
                 field(bj, "\"first_step\"", st, sizeof st), field(bj, "\"profile\"", pr, sizeof pr));
    cr_assert_str_eq(field(bj, "\"verdict\"", v, sizeof v), "conformant");
    free(out);
}

/* The rule cannot hide a rope bug: the arm's blk.0.attn_k_rope scaled by
 * 1.001 on the device (llama-f32, 1 token + 4 steps) is named, on the GPU
 * arm, at that tap and the first step (the bound's smallest, at position 0).
 * A looser declared bound hides it: with the Vulkan specification's
 * (rope-trig@8192, sin/cos 2^-11) it is caught there at r 1.17 only, with
 * rope-trig@32768 not at all (seen: conformant). That is why lavapipe
 * declares what it measures. */
Test(vulkan, rope_perturbation_named_despite_rope_trig, .init = setup, .fini = teardown) {
    require_vulkan();
    const char *model = td_test_fixture(dir, "llama-f32");
    setenv("TD_LLAMACPP_PERTURB", "blk.0.attn_k_rope*1.001", 1);
    setenv("TD_LLAMACPP_PERTURB_ARM", "llamacpp:vulkan", 1);
    char *out = NULL, v[128];
    int rc = bisect3(model, "1", "4", &out);
    unsetenv("TD_LLAMACPP_PERTURB");
    unsetenv("TD_LLAMACPP_PERTURB_ARM");
    cr_assert_eq(rc, 1, "a perturbed rope must be divergent (exit %d)\n%.400s", rc, out);
    cr_assert(strstr(out, "\"wrong_arm\":\"b\""), "%.300s", out);
    const char *bj = arm_b(out);
    cr_assert(strstr(field(bj, "\"profile\"", v, sizeof v), "rope-trig@"), "profile %s", v);
    cr_assert_str_eq(field(bj, "\"first_tap\"", v, sizeof v), "blk.0.attn_k_rope");
    cr_assert_str_eq(field(bj, "\"first_step\"", v, sizeof v), "0");
    free(out);
}

/* A head size that is not a multiple of 8 (qwen3-tails-f32: 18) with flash
 * attention on: ggml-vulkan refuses the op and ggml-cpu runs it (f16 Q, an
 * f16 output accumulator), which the arm declares as fa-cpu. From the
 * oracle's inputs but for f32 rounding, blk.0.attn_ctx of an 8-token step and
 * of the one-token step after it must sit at least 100x closer to an oracle
 * that applies the rule than to one without it (the profile less fa-cpu:
 * attn-f16's f16 operands in the prefill, f64 sums), which must be visibly
 * off. Measured: 5.3e-8 and 5.8e-8 with the rule (ref32 under it: 2.1e-5
 * and 1.2e-7 from the oracle: f16 flips of the control's own), 3.7e-4 and
 * 5.8e-4 without. */
Test(vulkan, fa_cpu_rule_explains_flash_attention_on_the_cpu, .init = setup, .fini = teardown) {
    require_vulkan();
    const char *model = td_test_fixture(dir, "qwen3-tails-f32");
    const int32_t prompt[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    const char *vk = td_test_path(dir, "vk.h5");
    char with[160], without[160];
    vulkan_fa_run(model, prompt, 8, "inp.*,blk.0.attn_ctx", vk, with, sizeof with);
    char *rule = strstr(with, "+fa-cpu");
    cr_assert_not_null(rule, "head size 18 with flash attention should declare fa-cpu: %s", with);
    cr_assert_null(strstr(with, "fa-acc-f16"), "the shader does not run head size 18: %s", with);
    snprintf(without, sizeof without, "%.*s%s", (int)(rule - with), with, rule + strlen("+fa-cpu"));
    double e[2][2];
    fa_ref_errors(model, prompt, 8, with, td_test_path(dir, "ref-facpu.h5"), vk, e[0]);
    fa_ref_errors(model, prompt, 8, without, td_test_path(dir, "ref-nocpu.h5"), vk, e[1]);
    for (int st = 0; st < 2; st++) {
        cr_expect_gt(e[1][st], 1e-4, "step %d: without fa-cpu the arm should be visibly off (%.3g)", st, e[1][st]);
        cr_expect_lt(e[0][st], e[1][st] / 100, "step %d: fa-cpu does not explain the arm: %.3g with the rule, %.3g "
                     "without", st, e[0][st], e[1][st]);
    }
}

/* The same fixture three-arm, flash attention on, prompts of 1 and 8 tokens
 * and 16 decode steps: conformant under the declared fa-cpu (without it:
 * divergent at blk.0.attn_ctx, r 202 at step 1 and r 24 at step 0). The
 * rule hides no bug of the size it must catch: the arm's FLASH_ATTN_EXT
 * output scaled by 1.001 is named at blk.0.attn_ctx, step 0, on the GPU arm. */
Test(vulkan, fa_cpu_three_arm_conformant_and_perturbation_named, .init = setup, .fini = teardown) {
    require_vulkan();
    const char *model = td_test_fixture(dir, "qwen3-tails-f32");
    const char *prompts[2] = {"1", "1,2,3,4,5,6,7,8"};
    setenv("TD_LLAMACPP_FLASH_ATTN", "1", 1);
    for (int i = 0; i < 2; i++) {
        char *out = NULL, v[160], tap[96], st[32], r[32];
        int rc = bisect3(model, prompts[i], "16", &out);
        cr_assert_not_null(out, "bisect printed nothing (exit %d)", rc);
        const char *bj = arm_b(out);
        cr_expect(strstr(field(bj, "\"profile\"", v, sizeof v), "+fa-cpu"), "profile %s", v);
        cr_expect_eq(rc, 0, "qwen3-tails-f32 FA on, %d-token prompt: exit %d, Vulkan arm %s at %s step %s r %s",
                     i ? 8 : 1, rc, field(bj, "\"verdict\"", v, sizeof v), field(bj, "\"first_tap\"", tap, sizeof tap),
                     field(bj, "\"first_step\"", st, sizeof st), field(bj, "\"first_ratio\"", r, sizeof r));
        cr_expect_str_eq(field(bj, "\"verdict\"", v, sizeof v), "conformant", "%d-token prompt", i ? 8 : 1);
        free(out);
    }
    setenv("TD_LLAMACPP_PERTURB", "blk.0.attn_ctx*1.001", 1);
    setenv("TD_LLAMACPP_PERTURB_ARM", "llamacpp:vulkan", 1);
    char *out = NULL, v[128];
    int rc = bisect3(model, prompts[1], "2", &out);
    unsetenv("TD_LLAMACPP_PERTURB");
    unsetenv("TD_LLAMACPP_PERTURB_ARM");
    unsetenv("TD_LLAMACPP_FLASH_ATTN");
    cr_assert_eq(rc, 1, "a perturbed flash-attention output must be divergent (exit %d)\n%.400s", rc, out);
    cr_assert(strstr(out, "\"wrong_arm\":\"b\""), "%.300s", out);
    const char *bj = arm_b(out);
    cr_assert_str_eq(field(bj, "\"first_tap\"", v, sizeof v), "blk.0.attn_ctx");
    cr_assert_str_eq(field(bj, "\"first_step\"", v, sizeof v), "0");
    free(out);
}
