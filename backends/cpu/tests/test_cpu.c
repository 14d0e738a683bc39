/* Whole-model tests of the cpu backend on the fixture models (written into a
 * temporary directory):
 *   - conformance: cpu against the f64 reference with ref32 as the control
 *     arm, through tapdiff's compare (harness/compare.h), over a prefill and
 *     16 pinned decode steps, on every fixture and weight type;
 *   - the tap sequence (names, shapes, dtypes, order) is the reference's;
 *   - determinism: bitwise identical logits across reruns with the same
 *     thread count, and across thread counts (1, 2, 3);
 *   - a prefill gives the same logits as feeding the tokens one by one
 *     (GEMM path vs dot path, within f32 noise), and reset forgets. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <criterion/parameterized.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "arch.h"
#include "backend.h"
#include "bench_model.h"
#include "compare.h"
#include "cpu.h"
#include "cpu_kernels.h"
#include "fixtures.h"
#include "forward.h"
#include "model.h"
#include "runner.h"
#include "tapfile.h"
#include "td_test.h"

/* ------------------------------------------------------------------------ */
/* Helpers                                                                    */

static char tmpdir[256];

static void make_tmpdir(void) {
    td_test_tmpdir(tmpdir, sizeof tmpdir, "cpu");
}

static void remove_tmpdir(void) { td_test_rmdir(tmpdir); }

static void fixture_path(const char *name, char *path, size_t sz) {
    td_err err = {{0}};
    int rc = td_fixture_write(name, tmpdir, path, sz, &err);
    cr_assert_eq(rc, TD_OK, "td_fixture_write(%s): %s", name, err.msg);
}

/* A fixture whose layer kinds the cpu arm does not implement (yet) is a
 * skip with the arm's own refusal as the reason, not a failure. */
static void skip_unless_cpu_runs(const char *path) {
    td_err err = {{0}};
    td_model *m = NULL;
    cr_assert_eq(td_model_open(&m, path, &err), TD_OK, "%s", err.msg);
    int rc = td_fwd_check_layers("cpu", td_cpu_backend.layer_kinds, m, &err);
    td_model_close(m);
    if (rc != TD_OK) {
        remove_tmpdir();
        cr_skip_test("%s", err.msg);
    }
}

/* A prompt of 12 ids below V (a prefill long enough for the GEMM path) and
 * 16 pinned decode ids. */
static const int32_t k_prompt[12] = {1, 17, 42, 99, 7, 250, 31, 64, 3, 128, 77, 200};
static const int32_t k_pinned[16] = {5, 260, 33, 11, 90, 140, 2, 66, 181, 45, 9, 230, 120, 58, 277, 14};

/* Runs `backend` on the model at `path` (prompt + 16 pinned steps) and
 * writes tap file `out` (NULL: taps off). */
static const char *g_profile; /* profile of the next runs (NULL = native) */

static void run_arm(const char *path, const char *backend, const char *out, int threads, td_run_result *res) {
    td_run_config c;
    td_run_config_init(&c);
    c.keep_all_logits = 1;
    c.profile = g_profile;
    c.model_path = path;
    c.backend = backend;
    c.prompt = k_prompt;
    c.n_prompt = 12;
    c.n_steps = 16;
    c.decode = TD_DECODE_PINNED;
    c.pinned = k_pinned;
    c.n_pinned = 16;
    c.tap_path = out;
    c.tap_mode = TD_TAP_FULL;
    c.threads = threads;
    td_err err = {{0}};
    memset(res, 0, sizeof *res);
    int rc = td_run(&c, res, &err);
    cr_assert_eq(rc, TD_OK, "td_run %s on %s: %s", backend, path, err.msg);
}

/* ------------------------------------------------------------------------ */
/* Conformance                                                                */

/* The verdict, with the first divergent tap in the message. (Router taps of
 * a few values per token are judged by compare against their input's control
 * error too: compare.h "small taps".) */
static void judge(const char *fixture, const td_cmp_result *r) {
    if (r->verdict == TD_OK) return;
    const td_cmp_tap *t = r->first >= 0 ? td_cmp_tap_at(r, r->first) : NULL;
    cr_assert_fail("%s: DIVERGENT%s%s step %lld (%s): err %.3g, control %.3g, budget %.3g, r = %.3g; %s", fixture,
                   t ? " at " : "", t ? t->name : "", t ? (long long)t->step : -1LL, t ? td_cmp_fail_name(t->fail) : "-",
                   t ? t->err : NAN, t ? t->err_ctrl : NAN, t ? t->budget : NAN, t ? t->ratio : NAN, r->reason);
}

/* cpu (profile `profile`) against ref (f64, native), the control ref32
 * computing with the same profile */
static void conformance_profile(const char *fixture, const char *profile) {
    make_tmpdir();
    char path[512], a[600], b[600], c[600];
    fixture_path(fixture, path, sizeof path);
    skip_unless_cpu_runs(path);
    snprintf(a, sizeof a, "%s/ref.h5", tmpdir);
    snprintf(b, sizeof b, "%s/cpu.h5", tmpdir);
    snprintf(c, sizeof c, "%s/ref32.h5", tmpdir);
    td_run_result ra, rb, rc;
    g_profile = NULL;
    run_arm(path, "ref", a, 0, &ra);
    g_profile = profile;
    run_arm(path, "cpu", b, 2, &rb);
    run_arm(path, "ref32", c, 0, &rc);
    g_profile = NULL;
    td_cmp_options o = td_cmp_options_default();
    o.control = c;
    td_cmp_result *r = NULL;
    td_err err = {{0}};
    int st = td_compare(a, b, &o, &r, &err);
    cr_assert_eq(st, TD_OK, "%s: compare refused: %s", fixture, err.msg);
    // no vacuous pass: every tap of both arms was compared
    cr_assert_eq(r->n_missing_in_a + r->n_missing_in_b, 0, "%s: taps missing: %s", fixture, r->missing_example);
    cr_assert_gt(r->n_data, 100, "%s: only %lld taps compared with data", fixture, (long long)r->n_data);
    cr_assert_eq(r->n_steps_b, 17);
    judge(fixture, r);
    td_cmp_result_free(r);
    td_run_result_free(&ra), td_run_result_free(&rb), td_run_result_free(&rc);
    remove_tmpdir();
}

static void conformance(const char *fixture) {
    conformance_profile(fixture, NULL);
}

/* One case per fixture of the fixtures library: the parameters ARE its table,
 * so a fixture added there is covered here without an edit. Indices, not
 * names: Criterion copies parameters into the test process. */
#define MAX_FIXTURES 64
static int k_fixture_ix[MAX_FIXTURES];

ParameterizedTestParameters(cpu_conformance, every_fixture_native) {
    // more fixtures than slots would drop cases silently: refuse to build the list instead
    const size_t n = td_fixture_count() <= MAX_FIXTURES ? td_fixture_count() : 0;
    for (size_t i = 0; i < n; i++) k_fixture_ix[i] = (int)i;
    return cr_make_param_array(int, k_fixture_ix, n);
}

ParameterizedTest(int *ix, cpu_conformance, every_fixture_native, .timeout = 600) {
    const td_fixture_info *fi = td_fixture_at((size_t)*ix);
    cr_assert_not_null(fi, "fixture #%d", *ix);
    conformance(fi->name);
}

/* act-q8: every 8-bit format (Q8_0 inputs of Q8_0 weights, Q8_K of K-quants),
 * dense and MoE; the control ref32 rounds its matmul inputs the same way, so
 * the budget is the profile's own error (~1e-2), like with like. */
static const char *const k_act_q8_fixtures[] = {"llama-q4_k",    "qwen3-q4_k",     "qwen3moe-q6_k",
                                                 "qwen3moe-ties", "qwen3moe-iq1_s", "llama-nvfp4",
                                                 "qwen3next-q8_0", "qwen4exp-q8_0"};
#define N_ACT_Q8 (sizeof k_act_q8_fixtures / sizeof k_act_q8_fixtures[0])
static int k_act_q8_ix[N_ACT_Q8];

ParameterizedTestParameters(cpu_conformance, act_q8) {
    for (size_t i = 0; i < N_ACT_Q8; i++) k_act_q8_ix[i] = (int)i;
    return cr_make_param_array(int, k_act_q8_ix, N_ACT_Q8);
}

ParameterizedTest(int *ix, cpu_conformance, act_q8, .timeout = 600) {
    conformance_profile(k_act_q8_fixtures[*ix], "act-q8");
}

/* ------------------------------------------------------------------------ */
/* The tap sequence is the reference's                                        */

static void same_sequence(const char *fixture) {
    make_tmpdir();
    char path[512], a[600], b[600];
    fixture_path(fixture, path, sizeof path);
    skip_unless_cpu_runs(path);
    snprintf(a, sizeof a, "%s/ref.h5", tmpdir);
    snprintf(b, sizeof b, "%s/cpu.h5", tmpdir);
    td_run_result ra, rb;
    run_arm(path, "ref32", a, 0, &ra);
    run_arm(path, "cpu", b, 2, &rb);
    td_tapfile *fa = NULL, *fb = NULL;
    td_err err = {{0}};
    cr_assert_eq(td_tapfile_open(&fa, a, &err), TD_OK, "%s", err.msg);
    cr_assert_eq(td_tapfile_open(&fb, b, &err), TD_OK, "%s", err.msg);
    cr_assert_eq(td_tapfile_n_steps(fa), td_tapfile_n_steps(fb));
    for (int64_t s = 0; s < td_tapfile_n_steps(fa); s++) {
        td_tap_info *ta = NULL, *tb = NULL;
        int64_t na = 0, nb = 0;
        cr_assert_eq(td_tapfile_step_taps(fa, s, &ta, &na, &err), TD_OK, "%s", err.msg);
        cr_assert_eq(td_tapfile_step_taps(fb, s, &tb, &nb, &err), TD_OK, "%s", err.msg);
        cr_assert_eq(na, nb, "%s step %lld: ref32 emits %lld taps, cpu %lld", fixture, (long long)s, (long long)na,
                     (long long)nb);
        for (int64_t i = 0; i < na; i++) {
            cr_assert_str_eq(tb[i].name, ta[i].name, "%s step %lld tap #%lld", fixture, (long long)s, (long long)i);
            cr_assert_eq(tb[i].dtype, ta[i].dtype, "%s %s dtype", fixture, ta[i].name);
            cr_assert_eq(tb[i].ndim, ta[i].ndim, "%s %s ndim", fixture, ta[i].name);
            for (int d = 0; d < ta[i].ndim; d++)
                cr_assert_eq(tb[i].shape[d], ta[i].shape[d], "%s %s shape[%d]", fixture, ta[i].name, d);
        }
        free(ta), free(tb);
    }
    td_tapfile_close(fa), td_tapfile_close(fb);
    td_run_result_free(&ra), td_run_result_free(&rb);
    remove_tmpdir();
}

/* one fixture per architecture of the table (its first in the fixtures library) */
static int k_arch_ix[MAX_FIXTURES];

ParameterizedTestParameters(cpu_taps, same_sequence_as_reference_per_arch) {
    size_t n = 0;
    for (size_t a = 0; a < td_arch_count(); a++) {
        const char *arch = td_arch_at(a)->name;
        for (size_t i = 0; i < td_fixture_count(); i++)
            if (!strcmp(td_fixture_at(i)->arch, arch)) {
                k_arch_ix[n++] = (int)i;
                break;
            }
    }
    return cr_make_param_array(int, k_arch_ix, n);
}

ParameterizedTest(int *ix, cpu_taps, same_sequence_as_reference_per_arch) {
    same_sequence(td_fixture_at((size_t)*ix)->name);
}

/* every architecture of the table has a fixture, so the case above covers it */
Test(cpu_taps, every_arch_has_a_fixture) {
    for (size_t a = 0; a < td_arch_count(); a++) {
        int found = 0;
        for (size_t i = 0; i < td_fixture_count(); i++) found |= !strcmp(td_fixture_at(i)->arch, td_arch_at(a)->name);
        cr_expect(found, "architecture %s has no fixture", td_arch_at(a)->name);
    }
}

/* ------------------------------------------------------------------------ */
/* Determinism                                                                */

static void logits_of(const char *path, int threads, td_run_result *res) {
    run_arm(path, "cpu", NULL, threads, res);
}

static void assert_bitwise(const td_run_result *x, const td_run_result *y, const char *what) {
    cr_assert_eq(x->n_forwards, y->n_forwards);
    const size_t n = (size_t)(x->n_forwards * x->n_vocab);
    for (size_t i = 0; i < n; i++)
        if (memcmp(&x->logits[i], &y->logits[i], sizeof(double)))
            cr_assert_fail("%s: logits differ at forward %zu, id %zu: %a vs %a", what, i / (size_t)x->n_vocab,
                           i % (size_t)x->n_vocab, x->logits[i], y->logits[i]);
}

static void determinism(const char *fixture) {
    make_tmpdir();
    char path[512];
    fixture_path(fixture, path, sizeof path);
    td_run_result r2a, r2b, r1, r3;
    logits_of(path, 2, &r2a);
    logits_of(path, 2, &r2b);
    logits_of(path, 1, &r1);
    logits_of(path, 3, &r3);
    assert_bitwise(&r2a, &r2b, "two runs with 2 threads");
    assert_bitwise(&r2a, &r1, "2 threads vs 1 thread");
    assert_bitwise(&r2a, &r3, "2 threads vs 3 threads");
    td_run_result_free(&r2a), td_run_result_free(&r2b), td_run_result_free(&r1), td_run_result_free(&r3);
    remove_tmpdir();
}

typedef struct det_case {
    const char *fixture, *profile;
} det_case;
static const det_case k_det[] = {{"llama-q4_k", NULL}, {"qwen3moe-q8_0", NULL}, {"qwen3moe-q6_k", "act-q8"}};
#define N_DET (sizeof k_det / sizeof k_det[0])
static int k_det_ix[N_DET];

ParameterizedTestParameters(cpu_determinism, across_reruns_and_threads) {
    for (size_t i = 0; i < N_DET; i++) k_det_ix[i] = (int)i;
    return cr_make_param_array(int, k_det_ix, N_DET);
}

ParameterizedTest(int *ix, cpu_determinism, across_reruns_and_threads) {
    g_profile = k_det[*ix].profile;
    determinism(k_det[*ix].fixture);
}

/* ------------------------------------------------------------------------ */
/* Prefill (GEMM tiles) vs one token at a time (dot kernels), and reset       */

Test(cpu_forward, prefill_equals_token_by_token_and_reset_forgets) {
    make_tmpdir();
    char path[512];
    fixture_path("qwen3-q4_k", path, sizeof path);
    td_model *m = NULL;
    td_err err = {{0}};
    cr_assert_eq(td_model_open(&m, path, &err), TD_OK, "%s", err.msg);
    td_backend_params p = {.threads = 2, .n_ctx = 64};
    td_backend *b = NULL;
    cr_assert_eq(td_cpu_backend.open(&b, m, &p, &err), TD_OK, "%s", err.msg);
    const int64_t V = m->hp.n_vocab, T = 12;
    double *all = malloc((size_t)(T * V) * sizeof *all), *one = malloc((size_t)V * sizeof *one);
    cr_assert_eq(b->vt->forward(b, k_prompt, T, 0, NULL, all, &err), TD_OK, "%s", err.msg);
    b->vt->reset(b);
    double worst = 0;
    for (int64_t t = 0; t < T; t++) {
        cr_assert_eq(b->vt->forward(b, k_prompt + t, 1, t, NULL, one, &err), TD_OK, "%s", err.msg);
        double num = 0, den = 0;
        for (int64_t v = 0; v < V; v++) {
            num += (one[v] - all[t * V + v]) * (one[v] - all[t * V + v]);
            den += all[t * V + v] * all[t * V + v];
        }
        worst = fmax(worst, sqrt(num / den));
    }
    // two honest f32 evaluations of the same logits (sgemm vs dot kernels):
    // f32 noise (~1e-6), where a position or cache bug is O(1)
    cr_assert_lt(worst, 2e-5, "prefill vs token-by-token logits: relative L2 %.3g", worst);
    // positions must continue: a forward at the wrong position is refused
    cr_assert_eq(b->vt->forward(b, k_prompt, 1, 3, NULL, one, &err), TD_EINPUT);
    b->vt->close(b);
    td_model_close(m);
    free(all), free(one);
    remove_tmpdir();
}

Test(cpu_forward, refuses_unknown_profile_and_injection) {
    make_tmpdir();
    char path[512];
    fixture_path("llama-f32", path, sizeof path);
    td_model *m = NULL;
    td_err err = {{0}};
    cr_assert_eq(td_model_open(&m, path, &err), TD_OK, "%s", err.msg);
    td_backend *b = NULL;
    td_backend_params p = {.profile = "act-q4"};
    cr_assert_eq(td_cpu_backend.open(&b, m, &p, &err), TD_EINPUT);
    cr_assert(strstr(err.msg, "act-q4"), "message: %s", err.msg);
    td_backend_params q = {.inject = "rope-pairs"};
    cr_assert_eq(td_cpu_backend.open(&b, m, &q, &err), TD_EINPUT);
    cr_assert_null(b);
    td_model_close(m);
    remove_tmpdir();
}

Test(cpu_forward, registered_as_cpu) {
    cr_assert_eq(td_backend_find("cpu"), &td_cpu_backend);
    cr_assert_str_eq(td_cpu_backend.precision, "f32");
}

/* ------------------------------------------------------------------------ */
/* act-q8                                                                     */

static double rel_l2(const double *a, const double *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) num += (a[i] - b[i]) * (a[i] - b[i]), den += a[i] * a[i];
    return sqrt(num / den);
}

/* A tiny llama (E = 256, 2 layers, F = 512, V = 1024) whose every matrix is
 * `type`, so that even the first projections (Q, K, V of layer 0, fed by the
 * exactly computed attn_norm) are quantized matmuls. */
static void tiny_model(int type, char *path, size_t sz) {
    td_bench_model_cfg cfg;
    cr_assert(td_bench_model_preset("tiny", &cfg));
    snprintf(path, sz, "%s/tiny-%s.gguf", tmpdir, td_type_name(type));
    td_err err = {{0}};
    cr_assert_eq(td_bench_model_write(path, &cfg, type, &err), TD_OK, "%s", err.msg);
}

/* Runs cpu on `path` over the prompt (one prefill, no decode) with taps,
 * GEMM threshold gemm_min_t (1: sgemm; huge: the dot kernels). */
static void run_prefill_taps(const char *path, const char *profile, const char *gemm_min_t, const char *out) {
    setenv("TD_CPU_GEMM_MIN_T", gemm_min_t, 1);
    td_run_config c;
    td_run_config_init(&c);
    c.model_path = path;
    c.backend = "cpu";
    c.profile = profile;
    c.prompt = k_prompt;
    c.n_prompt = 12;
    c.n_steps = 0;
    c.tap_path = out;
    c.tap_mode = TD_TAP_FULL;
    c.threads = 2;
    td_run_result r;
    td_err err = {{0}};
    int rc = td_run(&c, &r, &err);
    unsetenv("TD_CPU_GEMM_MIN_T");
    cr_assert_eq(rc, TD_OK, "td_run cpu %s on %s: %s", profile, path, err.msg);
    td_run_result_free(&r);
}

static double *read_tap(const char *file, const char *name, uint64_t *count) {
    td_tapfile *f = NULL;
    td_err err = {{0}};
    cr_assert_eq(td_tapfile_open(&f, file, &err), TD_OK, "%s", err.msg);
    td_tap_info info;
    cr_assert_eq(td_tapfile_tap(f, 0, name, &info, &err), TD_OK, "%s", err.msg);
    double *v = malloc(info.count * sizeof *v);
    cr_assert_eq(td_tapfile_read_f64(f, 0, name, v, info.count, &err), TD_OK, "%s", err.msg);
    td_tapfile_close(f);
    *count = info.count;
    return v;
}

/* Under act-q8 a prefill through sgemm multiplies the dequantized weights by
 * x' = d*q in f32, the dot path runs the integer kernels on the codes: two
 * implementations of one profile. Fed bitwise equal activations (layer 0's
 * Q, K, V read attn_norm, computed identically by both), they agree to f32
 * noise, ~1e-7. (Deeper taps are not compared: there f32 noise can move an
 * activation across a rounding boundary of its 8-bit code, a step of 1/127
 * of its block's maximum, which is the profile, not a bug.) The profile
 * itself moves those taps by ~1e-2 from native, so a kernel that is wrong
 * in a scale, a code or an offset cannot hide under the bound. */
static void act_q8_paths(int type) {
    make_tmpdir();
    char path[512], gemm[600], dot[600], nat[600];
    tiny_model(type, path, sizeof path);
    snprintf(gemm, sizeof gemm, "%s/gemm.h5", tmpdir);
    snprintf(dot, sizeof dot, "%s/dot.h5", tmpdir);
    snprintf(nat, sizeof nat, "%s/native.h5", tmpdir);
    run_prefill_taps(path, "act-q8", "1", gemm);
    run_prefill_taps(path, "act-q8", "1000000", dot);
    run_prefill_taps(path, "native", "1000000", nat);
    static const char *const taps[] = {"blk.0.attn_q", "blk.0.attn_k", "blk.0.attn_v"};
    for (int i = 0; i < 3; i++) {
        uint64_t n, n2, n3;
        double *g = read_tap(gemm, taps[i], &n), *d = read_tap(dot, taps[i], &n2), *v = read_tap(nat, taps[i], &n3);
        cr_assert(n == n2 && n == n3);
        const double paths = rel_l2(g, d, (int64_t)n), profile = rel_l2(v, d, (int64_t)n);
        cr_log_info("%s %s: act-q8 sgemm vs integer kernels %.3g, act-q8 vs native %.3g", td_type_name(type), taps[i],
                    paths, profile);
        cr_assert_lt(paths, 2e-6, "%s %s: act-q8 sgemm(x') vs integer kernels: relative L2 %.3g", td_type_name(type),
                     taps[i], paths);
        cr_assert_gt(profile, 1e-3, "%s %s: act-q8 within %.3g of native: is the profile applied?", td_type_name(type),
                     taps[i], profile);
        free(g), free(d), free(v);
    }
    remove_tmpdir();
}

Test(cpu_act_q8, integer_kernels_match_sgemm_q4_k) { act_q8_paths(TD_TYPE_Q4_K); }
Test(cpu_act_q8, integer_kernels_match_sgemm_q5_k) { act_q8_paths(TD_TYPE_Q5_K); }
Test(cpu_act_q8, integer_kernels_match_sgemm_q6_k) { act_q8_paths(TD_TYPE_Q6_K); }
Test(cpu_act_q8, integer_kernels_match_sgemm_q8_0) { act_q8_paths(TD_TYPE_Q8_0); }
Test(cpu_act_q8, integer_kernels_match_sgemm_q4_0) { act_q8_paths(TD_TYPE_Q4_0); }

/* A prefill through the dot kernels and the same tokens one by one run the
 * same arithmetic on every row (same kernels, same attention code, same KV
 * contents): bitwise equal logits, native and act-q8. */
static void prefill_vs_single_of(const char *profile, const char *fixture, int type) {
    make_tmpdir();
    char path[512];
    if (fixture) fixture_path(fixture, path, sizeof path);
    else tiny_model(type, path, sizeof path);
    td_model *m = NULL;
    td_err err = {{0}};
    cr_assert_eq(td_model_open(&m, path, &err), TD_OK, "%s", err.msg);
    setenv("TD_CPU_GEMM_MIN_T", "1000000", 1);
    td_backend_params p = {.threads = 2, .n_ctx = 64, .profile = profile};
    td_backend *b = NULL;
    int rc = td_cpu_backend.open(&b, m, &p, &err);
    unsetenv("TD_CPU_GEMM_MIN_T");
    cr_assert_eq(rc, TD_OK, "%s", err.msg);
    cr_assert(strstr(td_cpu_backend.version(b), profile), "version does not declare the profile: %s",
              td_cpu_backend.version(b));
    const int64_t V = m->hp.n_vocab, T = 12;
    double *all = malloc((size_t)(T * V) * sizeof *all), *one = malloc((size_t)(T * V) * sizeof *one);
    cr_assert_eq(b->vt->forward(b, k_prompt, T, 0, NULL, all, &err), TD_OK, "%s", err.msg);
    b->vt->reset(b);
    for (int64_t t = 0; t < T; t++)
        cr_assert_eq(b->vt->forward(b, k_prompt + t, 1, t, NULL, one + t * V, &err), TD_OK, "%s", err.msg);
    for (int64_t i = 0; i < T * V; i++)
        if (memcmp(&all[i], &one[i], sizeof(double)))
            cr_assert_fail("%s: prefill (dot path) and token-by-token logits differ at position %lld id %lld: %a vs %a",
                           profile, (long long)(i / V), (long long)(i % V), all[i], one[i]);
    b->vt->close(b);
    td_model_close(m);
    free(all), free(one);
    remove_tmpdir();
}

static void prefill_vs_single(const char *profile, const char *fixture) {
    prefill_vs_single_of(profile, fixture, TD_TYPE_Q4_K);
}

Test(cpu_forward, prefill_dot_path_is_bitwise_token_by_token_native) { prefill_vs_single("native", NULL); }
/* Q8_0 native: at avx512vnni the packed integer kernel (gemv_x32) for any T
 * below the sgemm threshold, one token at a time */
Test(cpu_forward, prefill_dot_path_is_bitwise_token_by_token_native_q8_0) {
    prefill_vs_single_of("native", NULL, TD_TYPE_Q8_0);
}
Test(cpu_forward, prefill_dot_path_is_bitwise_token_by_token_act_q8) { prefill_vs_single("act-q8", NULL); }
/* MoE: the grouped expert rows (their offsets into the act-q8 arrays) */
Test(cpu_forward, prefill_dot_path_is_bitwise_token_by_token_moe_native) {
    prefill_vs_single("native", "qwen3moe-q6_k");
}
Test(cpu_forward, prefill_dot_path_is_bitwise_token_by_token_moe_act_q8) {
    prefill_vs_single("act-q8", "qwen3moe-q6_k");
}

/* act-q8 with packed weights (avx512vnni, Q8_0 and Q4_K): a prefill at the
 * default GEMM threshold runs the packed tile kernels where sgemm ran
 * before, and gives the bits of the same tokens one by one at the avx2
 * level (its own packed kernels, other code; the same f32 attention
 * helpers, which the c level's differ from). */
static void packed_prefill_vs_avx2_single(int type) {
    if (!td_cpu_has_isa(TD_CPU_ISA_AVX512VNNI)) cr_skip_test("this CPU has no AVX-512 VNNI: no packed kernels");
    make_tmpdir();
    char path[512];
    tiny_model(type, path, sizeof path);
    td_model *m = NULL;
    td_err err = {{0}};
    cr_assert_eq(td_model_open(&m, path, &err), TD_OK, "%s", err.msg);
    const int64_t V = m->hp.n_vocab, T = 12;
    double *all = malloc((size_t)(T * V) * sizeof *all), *one = malloc((size_t)(T * V) * sizeof *one);
    td_backend_params p = {.threads = 2, .n_ctx = 64, .profile = "act-q8"};
    td_backend *b = NULL;
    cr_assert_eq(td_cpu_backend.open(&b, m, &p, &err), TD_OK, "%s", err.msg);
    cr_assert(strstr(td_cpu_backend.version(b), "avx512vnni"), "%s", td_cpu_backend.version(b));
    cr_assert_eq(b->vt->forward(b, k_prompt, T, 0, NULL, all, &err), TD_OK, "%s", err.msg);
    b->vt->close(b);
    setenv("TD_CPU_ISA", "avx2", 1);
    int rc = td_cpu_backend.open(&b, m, &p, &err);
    unsetenv("TD_CPU_ISA");
    cr_assert_eq(rc, TD_OK, "%s", err.msg);
    for (int64_t t = 0; t < T; t++)
        cr_assert_eq(b->vt->forward(b, k_prompt + t, 1, t, NULL, one + t * V, &err), TD_OK, "%s", err.msg);
    for (int64_t i = 0; i < T * V; i++)
        if (memcmp(&all[i], &one[i], sizeof(double)))
            cr_assert_fail("%s: packed prefill and avx2 token-by-token logits differ at position %lld id %lld: "
                           "%a vs %a",
                           td_type_name(type), (long long)(i / V), (long long)(i % V), all[i], one[i]);
    b->vt->close(b);
    td_model_close(m);
    free(all), free(one);
    remove_tmpdir();
}

Test(cpu_forward, packed_prefill_is_bitwise_avx2_token_by_token_q8_0) { packed_prefill_vs_avx2_single(TD_TYPE_Q8_0); }
Test(cpu_forward, packed_prefill_is_bitwise_avx2_token_by_token_q4_k) { packed_prefill_vs_avx2_single(TD_TYPE_Q4_K); }

/* ------------------------------------------------------------------------ */
/* tapdiff bench                                                              */

/* Runs a shell command; returns its exit status and its stdout (malloc'd). */
static int sh(const char *cmd, char **out) {
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p, "popen %s", cmd);
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    for (size_t got; (got = fread(buf + n, 1, cap - n - 1, p)) > 0;) {
        n += got;
        if (n + 1 >= cap) buf = realloc(buf, cap *= 2);
    }
    buf[n] = '\0';
    const int st = pclose(p);
    *out = buf;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

Test(cpu_bench, make_model_then_bench_json) {
    const char *td = getenv("TD_TAPDIFF");
    if (!td) cr_skip_test("TD_TAPDIFF is not set (run through meson test)");
    make_tmpdir();
    char cmd[1024], *out;
    snprintf(cmd, sizeof cmd, "'%s' bench --make-model '%s/b.gguf' --type q8_0 --size tiny 2>/dev/null", td, tmpdir);
    cr_assert_eq(sh(cmd, &out), 0, "%s: %s", cmd, out);
    free(out);
    snprintf(cmd, sizeof cmd,
             "'%s' bench --model '%s/b.gguf' --backend cpu --threads 2 --prompt-len 9 --gen 3 --repeat 1 "
             "--bw-mib 64 --json 2>/dev/null",
             td, tmpdir);
    cr_assert_eq(sh(cmd, &out), 0, "%s: %s", cmd, out);
    cJSON *j = cJSON_Parse(out);
    cr_assert_not_null(j, "not JSON: %s", out);
    const char *keys[] = {"prefill_tok_s", "decode_tok_s", "peak_rss_mib", "read_bw_gib_s", "decode_bound_tok_s"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        const cJSON *v = cJSON_GetObjectItem(j, keys[i]);
        cr_assert(cJSON_IsNumber(v) && v->valuedouble > 0, "%s missing or not > 0 in %s", keys[i], out);
    }
    // weight bytes per decode token: every tensor of the file but the
    // embedding table, of which one row is read (the bench model's output
    // head is untied)
    td_model *m = NULL;
    td_err err = {{0}};
    char path[600];
    snprintf(path, sizeof path, "%s/b.gguf", tmpdir);
    cr_assert_eq(td_model_open(&m, path, &err), TD_OK, "%s", err.msg);
    double bytes = 0;
    for (uint64_t i = 0; i < m->gguf->n_tensors; i++) bytes += (double)m->gguf->tensors[i].nbytes;
    bytes += (double)m->tok_embd->row_bytes - (double)m->tok_embd->nbytes;
    const double mib = cJSON_GetObjectItem(j, "decode_weight_mib_per_token")->valuedouble;
    cr_assert_float_eq(mib, bytes / (1024.0 * 1024.0), 1e-9, "weight MiB per token %g, expected %g", mib,
                       bytes / (1024.0 * 1024.0));
    const double bound = cJSON_GetObjectItem(j, "decode_bound_tok_s")->valuedouble;
    const double bw = cJSON_GetObjectItem(j, "read_bw_gib_s")->valuedouble;
    cr_assert_float_eq(bound, bw * 1024.0 / mib, 1e-6 * bound, "bound %g != bandwidth / bytes", bound);
    cr_assert_str_eq(cJSON_GetObjectItem(j, "backend")->valuestring, "cpu");
    td_model_close(m);
    cJSON_Delete(j);
    free(out);
    remove_tmpdir();
}

Test(cpu_bench, usage_and_skip_exit_codes) {
    const char *td = getenv("TD_TAPDIFF");
    if (!td) cr_skip_test("TD_TAPDIFF is not set (run through meson test)");
    char cmd[512], *out;
    snprintf(cmd, sizeof cmd, "'%s' bench --backend cpu 2>/dev/null", td); // no --model
    cr_assert_eq(sh(cmd, &out), 2);
    free(out);
    snprintf(cmd, sizeof cmd, "'%s' bench --model x.gguf --backend nosuch 2>/dev/null", td);
    cr_assert_eq(sh(cmd, &out), 2);
    free(out);
    snprintf(cmd, sizeof cmd, "'%s' bench --model /nonexistent.gguf --backend cpu 2>/dev/null", td);
    cr_assert_eq(sh(cmd, &out), 3);
    free(out);
    snprintf(cmd, sizeof cmd, "'%s' bench --help", td);
    cr_assert_eq(sh(cmd, &out), 0);
    cr_assert(strstr(out, "--make-model"), "help: %s", out);
    free(out);
}

/* ------------------------------------------------------------------------ */
/* Every kernel level this CPU runs (TD_CPU_ISA caps the level) is conformant
 * under both profiles; a level above the CPU's is skipped, an unknown name
 * refused. */

typedef struct isa_case {
    int isa;
    int act_q8;
} isa_case;
static isa_case k_isa_cases[2 * TD_CPU_ISA_COUNT];

ParameterizedTestParameters(cpu_conformance, every_isa_level) {
    for (int i = 0; i < 2 * TD_CPU_ISA_COUNT; i++) k_isa_cases[i] = (isa_case){i / 2, i % 2};
    return cr_make_param_array(isa_case, k_isa_cases, 2 * TD_CPU_ISA_COUNT);
}

ParameterizedTest(isa_case *c, cpu_conformance, every_isa_level, .timeout = 600) {
    const char *name = td_cpu_isa_name((td_cpu_isa)c->isa);
    if (!td_cpu_has_isa((td_cpu_isa)c->isa)) cr_skip_test("this CPU lacks kernel level %s", name);
    setenv("TD_CPU_ISA", name, 1);
    // the level is the one that runs, and the version (provenance, bench) says so
    td_model *m = NULL;
    td_err err = {{0}};
    char path[512], want[64];
    make_tmpdir();
    fixture_path("llama-q4_k", path, sizeof path);
    cr_assert_eq(td_model_open(&m, path, &err), TD_OK, "%s", err.msg);
    td_backend *be = NULL;
    td_backend_params p = {.threads = 1, .profile = c->act_q8 ? "act-q8" : NULL};
    cr_assert_eq(td_cpu_backend.open(&be, m, &p, &err), TD_OK, "%s", err.msg);
    snprintf(want, sizeof want, "kernels %s,", name);
    cr_assert_not_null(strstr(td_cpu_backend.version(be), want), "version '%s' lacks '%s'", td_cpu_backend.version(be),
                       want);
    td_cpu_backend.close(be);
    td_model_close(m);
    remove_tmpdir();
    conformance_profile("llama-q4_k", c->act_q8 ? "act-q8" : NULL);
    unsetenv("TD_CPU_ISA");
}

Test(cpu_forward, refuses_unknown_isa_level) {
    td_model *m = NULL;
    td_err err = {{0}};
    char path[512];
    make_tmpdir();
    fixture_path("llama-q4_k", path, sizeof path);
    cr_assert_eq(td_model_open(&m, path, &err), TD_OK, "%s", err.msg);
    setenv("TD_CPU_ISA", "avx1024", 1);
    td_backend *be = NULL;
    cr_assert_eq(td_cpu_backend.open(&be, m, NULL, &err), TD_EINPUT);
    cr_assert_not_null(strstr(err.msg, "TD_CPU_ISA"), "%s", err.msg);
    unsetenv("TD_CPU_ISA");
    td_model_close(m);
    remove_tmpdir();
}

/* logits_last (bench --logits-last): an untapped prefill computes the last
 * row only, bitwise what the token-by-token run gives there (with the dot
 * path for the layers too, as prefill_vs_single). */
static void logits_last_case(const char *profile) {
    make_tmpdir();
    char path[512];
    tiny_model(TD_TYPE_Q4_K, path, sizeof path);
    td_model *m = NULL;
    td_err err = {{0}};
    cr_assert_eq(td_model_open(&m, path, &err), TD_OK, "%s", err.msg);
    const int64_t V = m->hp.n_vocab, T = 12;
    td_backend_params p = {.threads = 2, .n_ctx = 64, .profile = profile, .logits_last = 1};
    td_backend *b = NULL;
    setenv("TD_CPU_GEMM_MIN_T", "1000000", 1);
    const int rc = td_cpu_backend.open(&b, m, &p, &err);
    unsetenv("TD_CPU_GEMM_MIN_T");
    cr_assert_eq(rc, TD_OK, "%s", err.msg);
    double *last = malloc((size_t)(T * V) * sizeof *last), *one = malloc((size_t)V * sizeof *one);
    const double poison = -12345.0;
    for (int64_t i = 0; i < T * V; i++) last[i] = poison;
    cr_assert_eq(b->vt->forward(b, k_prompt, T, 0, NULL, last, &err), TD_OK, "%s", err.msg);
    // the other rows are not written (not computed)
    cr_assert_eq(last[0], poison, "row 0 was written under logits_last");
    b->vt->reset(b);
    for (int64_t t = 0; t < T; t++)
        cr_assert_eq(b->vt->forward(b, k_prompt + t, 1, t, NULL, one, &err), TD_OK, "%s", err.msg);
    for (int64_t v = 0; v < V; v++)
        if (memcmp(&last[(T - 1) * V + v], &one[v], sizeof(double)))
            cr_assert_fail("%s: last-row logits %lld: %a, token by token %a", profile, (long long)v,
                           last[(T - 1) * V + v], one[v]);
    b->vt->close(b);
    td_model_close(m);
    free(last), free(one);
    remove_tmpdir();
}

Test(cpu_forward, logits_last_is_the_last_row_native) { logits_last_case("native"); }
Test(cpu_forward, logits_last_is_the_last_row_act_q8) { logits_last_case("act-q8"); }

/* qwen3next: the chunked GDN prefill against the reference's token-by-token */
/* definition                                                                 */

/* bisect --a ref --b cpu on both qwen3next fixtures with prompts of 1, 8 and
 * 80 tokens (80 spans two GDN chunks of 64, the second one partial), 16
 * decode steps (the sequential form); the cpu arm's native f32 arithmetic. */
Test(cpu_conformance, qwen3next_chunked_prefill_and_decode, .timeout = 600) {
    const char *td = getenv("TD_TAPDIFF");
    if (!td) cr_skip_test("TD_TAPDIFF is not set (run through meson test)");
    make_tmpdir();
    static const char *const names[] = {"qwen3next-f32", "qwen3next-q8_0"};
    static const int lens[] = {1, 8, 80};
    for (size_t f = 0; f < 2; f++) {
        char path[512];
        fixture_path(names[f], path, sizeof path);
        for (size_t k = 0; k < 3; k++) {
            char toks[2048], cmd[4096], *out;
            size_t o = 0;
            for (int i = 0; i < lens[k]; i++)
                o += (size_t)snprintf(toks + o, sizeof toks - o, "%s%d", i ? "," : "", (i * 53 + 3) % 297);
            snprintf(cmd, sizeof cmd,
                     "'%s' bisect --model '%s' --a ref --b cpu --tokens %s --steps 16 --threads 2 --out-dir "
                     "'%s/q3n-%zu-%d' 2>&1",
                     td, path, toks, tmpdir, f, lens[k]);
            const int st = sh(cmd, &out);
            cr_expect_eq(st, 0, "%s, %d-token prompt: bisect ref vs cpu exit %d:\n%s", names[f], lens[k], st, out);
            cr_expect(strstr(out, "over 17 steps") && strstr(out, "missing: 0 in A, 0 in B"), "%s, %d: %s", names[f],
                      lens[k], out);
            free(out);
        }
    }
    remove_tmpdir();
}
