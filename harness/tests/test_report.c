/* Tests of reports/: the JSON document (parsed back with cJSON), the
 * Markdown, the self-contained HTML (escaping, no scripts or external
 * resources, the first divergent tap highlighted), writing a report
 * directory, and the HTML rendered by headless Chromium: no console errors
 * and a screenshot that is not blank (skipped without /usr/bin/chromium). */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "compare.h"
#include "report.h"
#include "tapgen.h"
#include "td_test.h"

static char dir[256];
static int pool_n;

static void mkdir_tmp(void) {
    td_test_tmpdir(dir, sizeof dir, "report");
    pool_n = 0;
}

static void rm_tmp(void) { td_test_rmdir(dir); }

/* DIR/name; each call returns its own buffer for the rest of the test (a
 * path kept in an options struct must not be overwritten by a later call). */
static char pool[512][320];
static const char *P(const char *name) {
    TD_ASSERT(pool_n < 512);
    char *b = pool[pool_n++];
    snprintf(b, 320, "%s/%s", dir, name);
    return b;
}

TestSuite(report, .init = mkdir_tmp, .fini = rm_tmp);

static const tg_model M = {.n_layer = 3, .n_prompt = 4, .n_decode = 4, .moe = 1};

static void bump(void *ctx, int64_t step, const td_tap_info *t, double *v, uint64_t n) {
    int *passed = ctx;
    if (td_dtype_is_int(t->dtype)) return;
    int hit = step == 2 && !strcmp(t->name, "blk.1.ffn_up");
    double rel = hit ? 1e-3 : (*passed ? 5e-4 : 0);
    if (hit) *passed = 1;
    for (uint64_t i = 0; rel && i < n; i++) v[i] *= 1.0 + rel * tg_unif(7, (uint64_t)step, i);
}

/* A divergent comparison with a control: blk.1.ffn_up at step 2 planted.
 * b_name lets a test put characters that need escaping in B's path. */
static td_cmp_result *divergent(const char *b_name) {
    tg_arm ref = {.seed = 0, .dtype = TD_DT_F64, .backend = "ref", .sha = "feed"};
    tg_arm r32 = {.seed = 11, .noise = 1e-7, .dtype = TD_DT_F32, .backend = "ref32", .sha = "feed"};
    tg_arm cand = {.seed = 23, .noise = 1e-7, .dtype = TD_DT_F32, .backend = "cand<&>", .sha = "feed"};
    tg_write_model(P("ref.h5"), &M, &ref);
    tg_write_model(P("ref32.h5"), &M, &r32);
    tg_write_model(P("cand.h5"), &M, &cand);
    int passed = 0;
    tg_copy(P("cand.h5"), P(b_name), bump, &passed, NULL, NULL, NULL, NULL);
    td_cmp_options o = td_cmp_options_default();
    o.control = P("ref32.h5");
    td_cmp_result *r = NULL;
    td_err e;
    cr_assert_eq(td_compare(P("ref.h5"), P(b_name), &o, &r, &e), TD_OK, "%s", e.msg);
    cr_assert_eq(r->verdict, TD_DIVERGENT);
    return r;
}

static char *slurp(const char *path) { return td_test_slurp(path, NULL); }

__attribute__((noinline)) static char *render(void (*fn)(FILE *, const td_cmp_result *), const td_cmp_result *r) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    fn(f, r);
    fclose(f);
    return buf;
}

Test(report, json_round_trips_the_verdict) {
    td_cmp_result *r = divergent("bad.h5");
    char *js = td_report_json(r);
    cJSON *j = cJSON_Parse(js);
    cr_assert_not_null(j, "report.json does not parse");
    cr_assert_str_eq(cJSON_GetObjectItem(j, "format")->valuestring, "tapdiff-compare");
    cr_assert_str_eq(cJSON_GetObjectItem(j, "verdict")->valuestring, "divergent");
    cr_assert_eq(cJSON_GetObjectItem(j, "exit_code")->valueint, 1);
    cJSON *first = cJSON_GetObjectItem(j, "first_divergent");
    cr_assert(cJSON_IsObject(first));
    // the planted tap, not whatever the code says
    cr_assert_str_eq(cJSON_GetObjectItem(first, "name")->valuestring, "blk.1.ffn_up");
    cr_assert_eq(cJSON_GetObjectItem(first, "step")->valueint, 2);
    cr_assert_str_eq(cJSON_GetObjectItem(first, "kind")->valuestring, "decode");
    cr_assert_str_eq(cJSON_GetObjectItem(first, "fail")->valuestring, "budget");
    cr_assert_str_eq(cJSON_GetObjectItem(first, "input")->valuestring, "blk.1.ffn_norm");
    // position: the decode step 2 of a 4-token prompt is at position 4 + 2 - 1 = 5
    cJSON *pos = cJSON_GetArrayItem(cJSON_GetObjectItem(first, "positions"), 0);
    cr_assert_eq(cJSON_GetObjectItem(pos, "position")->valueint, 5);
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(j, "before_first")), 3);
    cJSON *taps = cJSON_GetObjectItem(j, "taps");
    cr_assert_eq(cJSON_GetArraySize(taps), (int)r->n_taps);
    cJSON *counts = cJSON_GetObjectItem(j, "counts");
    cr_assert_eq(cJSON_GetObjectItem(counts, "compared")->valueint, (int)r->n_taps);
    cr_assert_eq(cJSON_GetObjectItem(counts, "missing_in_a")->valueint, 0);
    cJSON *settings = cJSON_GetObjectItem(j, "settings");
    cr_assert_eq(cJSON_GetObjectItem(settings, "k")->valuedouble, 4.0);
    cr_assert(cJSON_IsObject(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "arms"), "control")));
    // every err is a number equal to the result's (cJSON prints 15 significant
    // digits when they read back within its epsilon: not bit-exact)
    for (int i = 0; i < cJSON_GetArraySize(taps); i++) {
        cJSON *t = cJSON_GetArrayItem(taps, i);
        cJSON *err = cJSON_GetObjectItem(t, "err");
        cr_assert(cJSON_IsNumber(err));
        cr_assert_float_eq(err->valuedouble, td_cmp_tap_at(r, i)->err, 1e-14 * td_cmp_tap_at(r, i)->err + 1e-300);
        cr_assert_str_eq(cJSON_GetObjectItem(t, "name")->valuestring, td_cmp_tap_at(r, i)->name);
    }
    cJSON_Delete(j);
    free(js);
    td_cmp_result_free(r);
}

/* compare --json writes the document one tap row at a time: its bytes must
 * be what cJSON prints for the parsed document (an independent printer of
 * the same tree), with many rows, one row and none. */
static void assert_cjson_prints(const td_cmp_result *r) {
    char *js = td_report_json(r);
    cJSON *j = cJSON_Parse(js);
    cr_assert_not_null(j, "report.json does not parse");
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(j, "taps")), (int)r->n_taps);
    char *again = cJSON_Print(j);
    cr_assert_str_eq(js, again);
    free(again);
    cJSON_Delete(j);
    free(js);
}

Test(report, json_stream_is_what_cjson_prints) {
    td_cmp_result *r = divergent("bad.h5");
    cr_assert_gt(r->n_taps, 10);
    assert_cjson_prints(r);
    td_cmp_result_free(r);
    td_cmp_options o = td_cmp_options_default();
    const char *filters[] = {"blk.1.ffn_up", "no.such.tap"};
    for (int i = 0; i < 2; i++) {
        o.filter = filters[i];
        cr_assert_eq(td_compare(P("ref.h5"), P("bad.h5"), &o, &r, &(td_err){{0}}), TD_OK);
        if (i) cr_assert_eq(r->n_taps, 0);
        else cr_assert_gt(r->n_taps, 0);
        assert_cjson_prints(r);
        td_cmp_result_free(r);
    }
}

Test(report, json_encodes_non_finite_values) {
    // a tap created from an exact input: growth +inf; no control: err_ctrl null
    double a[4] = {1, 2, 3, 4}, b[4] = {1, 2, 3, 4.5};
    td_tap_sink *s = tg_open(P("a.h5"), "ref", "f64", NULL);
    tg_step(s, TD_STEP_PREFILL, 0, 1);
    tg_emit2(s, "blk.0.ffn_norm", TD_DT_F64, a, 1, 4);
    tg_emit2(s, "blk.0.ffn_up", TD_DT_F64, a, 1, 4);
    tg_end(s);
    tg_close(s);
    s = tg_open(P("b.h5"), "x", "f64", NULL);
    tg_step(s, TD_STEP_PREFILL, 0, 1);
    tg_emit2(s, "blk.0.ffn_norm", TD_DT_F64, a, 1, 4);
    tg_emit2(s, "blk.0.ffn_up", TD_DT_F64, b, 1, 4);
    tg_end(s);
    tg_close(s);
    td_cmp_result *r;
    td_err e;
    cr_assert_eq(td_compare(P("a.h5"), P("b.h5"), NULL, &r, &e), TD_OK);
    char *js = td_report_json(r);
    cJSON *j = cJSON_Parse(js);
    cr_assert_not_null(j);
    cJSON *first = cJSON_GetObjectItem(j, "first_divergent");
    cr_assert_str_eq(cJSON_GetObjectItem(first, "name")->valuestring, "blk.0.ffn_up");
    cr_assert_str_eq(cJSON_GetObjectItem(first, "growth")->valuestring, "inf");
    cr_assert(cJSON_IsNull(cJSON_GetObjectItem(first, "err_ctrl")));
    cr_assert(cJSON_IsNull(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "arms"), "control")));
    cr_assert(strstr(cJSON_GetObjectItem(first, "why")->valuestring, "created by this operation"));
    cJSON_Delete(j);
    free(js);
    td_cmp_result_free(r);
}

/* An all-NaN tap reads as NaN with its counts in every report, never "err
 * 0" nor "n/a". */
Test(report, nan_tap_reads_as_nan_with_counts) {
    double a[4] = {1, 2, 3, 4}, b[4] = {NAN, NAN, INFINITY, -INFINITY};
    td_tap_sink *s = tg_open(P("a.h5"), "ref", "f64", NULL);
    tg_step(s, TD_STEP_PREFILL, 0, 1);
    tg_emit2(s, "blk.0.ffn_up", TD_DT_F64, a, 1, 4);
    tg_end(s);
    tg_close(s);
    s = tg_open(P("b.h5"), "x", "f64", NULL);
    tg_step(s, TD_STEP_PREFILL, 0, 1);
    tg_emit2(s, "blk.0.ffn_up", TD_DT_F64, b, 1, 4);
    tg_end(s);
    tg_close(s);
    td_cmp_result *r;
    td_err e;
    cr_assert_eq(td_compare(P("a.h5"), P("b.h5"), NULL, &r, &e), TD_OK);
    char *tx = render(td_report_text, r);
    cr_assert(strstr(tx, "rel L2 nan"), "%s", tx);
    cr_assert(strstr(tx, "B 2 NaN, 1 +Inf, 1 -Inf"), "%s", tx);
    cr_assert(strstr(tx, "kind: nonfinite"), "%s", tx);
    char *md = render(td_report_markdown, r);
    cr_assert(strstr(md, "nan"), "%s", md);
    char *js = td_report_json(r);
    cJSON *j = cJSON_Parse(js);
    cJSON *nf = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "first_divergent"), "nonfinite");
    cr_assert_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(nf, "b"), "nan")->valueint, 2);
    cr_assert_str_eq(cJSON_GetObjectItem(nf, "err")->valuestring, "nan");
    cJSON_Delete(j);
    free(js);
    free(md);
    free(tx);
    td_cmp_result_free(r);
}

Test(report, markdown_names_the_first_tap) {
    td_cmp_result *r = divergent("bad.h5");
    char *md = render(td_report_markdown, r);
    cr_assert(strstr(md, "DIVERGENT"));
    cr_assert(strstr(md, "### First divergent tap: `blk.1.ffn_up`, step 2 (decode)"), "%s", md);
    cr_assert(strstr(md, "| **2 | decode | `blk.1.ffn_up`**"), "%s", md);
    cr_assert(strstr(md, "blk.1.ffn_norm"));
    cr_assert(strstr(md, "cand<&>"), "Markdown keeps the backend name as is");
    free(md);
    td_cmp_result_free(r);
}

Test(report, text_verdict_fits_one_screen) {
    td_cmp_result *r = divergent("bad.h5");
    char *tx = render(td_report_text, r);
    int lines = 0, width = 0, w = 0;
    for (const char *p = tx; *p; p++) {
        if (*p == '\n') {
            lines++;
            if (w > width) width = w;
            w = 0;
        } else {
            w++;
        }
    }
    cr_assert_leq(lines, 30, "%d lines:\n%s", lines, tx);
    cr_assert(strncmp(tx, "tapdiff compare: DIVERGENT", 26) == 0, "%s", tx);
    cr_assert(strstr(tx, "FIRST DIVERGENT  blk.1.ffn_up  at step 2 (decode, pos 5, 1 token)"), "%s", tx);
    cr_assert(strstr(tx, "growth"), "%s", tx);
    cr_assert(strstr(tx, "control arm's honest error"), "%s", tx);
    free(tx);
    td_cmp_result_free(r);
}

Test(report, html_is_self_contained_and_escaped) {
    td_cmp_result *r = divergent("b<i>x&.h5");
    char *h = render(td_report_html, r);
    cr_assert(strncmp(h, "<!DOCTYPE html>", 15) == 0);
    cr_assert(strstr(h, "<svg"));
    cr_assert(strstr(h, "</svg>"));
    cr_assert_null(strstr(h, "<script"), "no scripts");
    cr_assert_null(strstr(h, "https://"), "no external resources");
    // the only http:// is the SVG namespace, which is a name, not a fetch
    const char *p = strstr(h, "http://");
    cr_assert_not_null(p);
    cr_assert(strncmp(p, "http://www.w3.org/2000/svg\"", 27) == 0);
    cr_assert_null(strstr(p + 1, "http://"));
    cr_assert_null(strstr(h, "<i>x"), "the file name must be escaped");
    cr_assert(strstr(h, "b&lt;i&gt;x&amp;.h5"));
    cr_assert(strstr(h, "cand&lt;&amp;&gt;"));
    cr_assert(strstr(h, "first divergent: blk.1.ffn_up (step 2)"), "the plot highlights the first divergent tap");
    cr_assert(strstr(h, "<tr class=\"first\">"), "the table highlights it too");
    free(h);
    td_cmp_result_free(r);
}

Test(report, write_dir_writes_three_files) {
    td_cmp_result *r = divergent("bad.h5");
    td_err e;
    cr_assert_eq(td_report_write_dir(P("out/nested/rep"), r, &e), TD_OK, "%s", e.msg);
    static const char *const names[] = {"report.md", "report.json", "report.html"};
    for (int i = 0; i < 3; i++) {
        char path[400];
        snprintf(path, sizeof path, "%s/%s", P("out/nested/rep"), names[i]);
        struct stat st;
        cr_assert_eq(stat(path, &st), 0, "%s missing", path);
        cr_assert_gt(st.st_size, 500);
    }
    FILE *f = fopen(P("plainfile"), "w");
    fclose(f);
    cr_assert_eq(td_report_write_dir(P("plainfile/rep"), r, &e), TD_EOUTPUT);
    cr_assert(strstr(e.msg, "plainfile"), "%s", e.msg);
    td_cmp_result_free(r);
}

Test(report, worst_orders_failures_first) {
    td_cmp_result *r = divergent("bad.h5");
    int64_t w[5];
    int n = td_report_worst(r, w, 5);
    cr_assert_eq(n, 5);
    for (int i = 1; i < n; i++) cr_assert_geq(td_cmp_tap_at(r, w[i - 1])->ratio, td_cmp_tap_at(r, w[i])->ratio);
    td_cmp_result_free(r);
}

/* ---------------------------------------------------- headless Chromium */

static int sh(const char *cmd) {
    int s = system(cmd);
    return WIFEXITED(s) ? WEXITSTATUS(s) : -1;
}

Test(report, html_renders_in_chromium, .timeout = 120) {
    if (access("/usr/bin/chromium", X_OK)) cr_skip_test("/usr/bin/chromium is absent (Debian package chromium)");
    const char *root = getenv("TD_SOURCE_ROOT");
    if (!root) cr_skip_test("TD_SOURCE_ROOT not set (needs harness/tests/png_check.py)");
    td_cmp_result *r = divergent("bad.h5");
    td_err e;
    cr_assert_eq(td_report_write_dir(P("rep"), r, &e), TD_OK, "%s", e.msg);
    td_cmp_result_free(r);
    char cmd[4096];
    const char *flags = "--headless --no-sandbox --disable-gpu --disable-quic --no-first-run "
                        "--disable-background-networking --disable-component-update --disable-sync "
                        "--hide-scrollbars --enable-logging=stderr --v=0";
    snprintf(cmd, sizeof cmd,
             "cd '%s' && timeout 60 /usr/bin/chromium %s --user-data-dir=\"$(mktemp -d -p '%s')\" "
             "--window-size=1000,900 --screenshot='%s/shot.png' 'file://%s/rep/report.html' >log.txt 2>&1",
             dir, flags, dir, dir, dir);
    cr_assert_eq(sh(cmd), 0, "chromium --screenshot failed (see %s/log.txt)", dir);
    snprintf(cmd, sizeof cmd,
             "cd '%s' && timeout 60 /usr/bin/chromium %s --user-data-dir=\"$(mktemp -d -p '%s')\" --dump-dom "
             "'file://%s/rep/report.html' >dom.html 2>>log.txt",
             dir, flags, dir, dir);
    cr_assert_eq(sh(cmd), 0, "chromium --dump-dom failed");
    char *log = slurp(P("log.txt"));
    cr_assert_null(strstr(log, "CONSOLE"), "console output from the page:\n%s", log);
    cr_assert_null(strstr(log, "Uncaught"), "%s", log);
    cr_assert_null(strstr(log, "Failed to load resource"), "%s", log);
    cr_assert_null(strstr(log, "net::ERR"), "%s", log);
    free(log);
    char *dom = slurp(P("dom.html"));
    cr_assert(strstr(dom, "<svg"), "the DOM has no SVG");
    cr_assert(strstr(dom, "first divergent: blk.1.ffn_up (step 2)"));
    free(dom);
    snprintf(cmd, sizeof cmd, "python3 '%s/harness/tests/png_check.py' '%s/shot.png'", root, dir);
    cr_assert_eq(sh(cmd), 0, "the screenshot is blank (or not a PNG)");
}
