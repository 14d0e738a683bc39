/* Tests of the tap catalog: its producer graph is closed and ordered, the
 * README's tap table is the catalog's, and the reference forward of each
 * architecture emits exactly the catalog's taps for it, with the dtype class
 * and the shape the catalog's letters give. */
#include <criterion/criterion.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "catalog.h"
#include "model.h"
#include "tapfile.h"
#include "td_common.h"

static char tmpdir[256];

static void make_tmpdir(void) {
    const char *base = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/td_catalog_XXXXXX", base && *base ? base : "/tmp");
    cr_assert_not_null(mkdtemp(tmpdir), "mkdtemp: %s", strerror(errno));
}

static void remove_tmpdir(void) {
    char cmd[320];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (tmpdir[0] && system(cmd) != 0) cr_log_warn("could not remove %s", tmpdir);
}

TestSuite(catalog, .init = make_tmpdir, .fini = remove_tmpdir);

static long row_index(const td_tap_entry *cat, const td_tap_entry *e) { return (long)(e - cat); }

Test(catalog, producers_are_catalog_taps_that_come_earlier) {
    size_t n;
    const td_tap_entry *cat = td_tap_catalog(&n);
    cr_assert_gt(n, 20);
    for (size_t i = 0; i < n; i++) {
        char name[TD_TAP_NAME_MAX];
        // a middle layer, so "@prev" names a layer
        if (!strncmp(cat[i].name, "blk.L.", 6))
            snprintf(name, sizeof name, "blk.3.%s", cat[i].name + 6);
        else
            snprintf(name, sizeof name, "%s", cat[i].name);
        long L = -2;
        cr_assert_eq(td_tap_catalog_find(name, &L), &cat[i], "%s does not find its own row", name);
        char g[4][3][TD_TAP_NAME_MAX];
        int last;
        int ng = td_tap_catalog_inputs(name, g, 4, &last);
        int terms = 0;
        for (int k = 0; k < ng; k++)
            for (int a = 0; a < 3 && g[k][a][0]; a++, terms++) {
                long pl;
                const td_tap_entry *p = td_tap_catalog_find(g[k][a], &pl);
                cr_assert_not_null(p, "%s: producer %s is not in the catalog", name, g[k][a]);
                // earlier: an earlier row of the same layer, an earlier layer, or an earlier global
                int earlier = pl < L || (pl == L && row_index(cat, p) < (long)i) ||
                              (L < 0 && pl < 0 && row_index(cat, p) < (long)i);
                cr_assert(earlier, "%s: producer %s does not come before it", name, g[k][a]);
            }
        int has_producers = cat[i].producers[0] != '\0';
        cr_assert_eq(has_producers, terms > 0 || last, "%s: producers '%s' gave %d names", name, cat[i].producers,
                     terms);
    }
}

Test(catalog, find_rejects_what_is_not_a_tap) {
    long L = 7;
    cr_assert_null(td_tap_catalog_find("blk.x.attn_q", &L));
    cr_assert_null(td_tap_catalog_find("blk.-1.attn_q", &L));
    cr_assert_null(td_tap_catalog_find("blk.L.attn_q", &L));
    cr_assert_null(td_tap_catalog_find("llamacpp.norm-0.RMS_NORM", &L));
    cr_assert_null(td_tap_catalog_find("attn_q", &L));
    const td_tap_entry *e = td_tap_catalog_find("blk.12.moe_topk", &L);
    cr_assert_not_null(e);
    cr_assert_eq(L, 12);
    cr_assert_eq(e->cls, TD_TAPC_I32);
    cr_assert(td_tap_catalog_has_arch(e, "qwen3moe"));
    cr_assert(!td_tap_catalog_has_arch(e, "qwen3"));
    cr_assert(!td_tap_catalog_has_arch(e, "qwen3mo"));
}

static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s: %s", path, strerror(errno));
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    cr_assert_eq(fread(s, 1, (size_t)n, f), (size_t)n);
    s[n] = '\0';
    fclose(f);
    return s;
}

#define BEGIN_MARK "<!-- tap catalog: begin"
#define END_MARK "<!-- tap catalog: end -->"

Test(catalog, readme_tap_table_is_the_catalog) {
    const char *root = getenv("TD_SOURCE_ROOT");
    cr_assert_not_null(root, "TD_SOURCE_ROOT is not set (run through meson test)");
    char path[512];
    snprintf(path, sizeof path, "%s/README.md", root);
    char *readme = read_text(path);
    char *b = strstr(readme, BEGIN_MARK);
    cr_assert_not_null(b, "README.md has no '%s' marker", BEGIN_MARK);
    b = strchr(b, '\n') + 1;
    char *e = strstr(b, END_MARK);
    cr_assert_not_null(e, "README.md has no '%s' marker", END_MARK);
    *e = '\0';
    char *want = td_tap_catalog_markdown();
    cr_assert_str_eq(b, want, "README.md's tap table differs from the catalog; replace it with the output of "
                              "`tapdiff taps --markdown`:\n%s", want);
    free(want);
    free(readme);
}

static int run(const char *cmd) {
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

// The value of one dimension written in the catalog's letters ("Hkv·D") in
// layer L (-1: a global tap; NB and Wq are per layer).
static long dim_value(const char *spec, const td_hparams *hp, long T, long n_kv, long L) {
    const long r = L >= 0 && L < 256 ? (long)hp->qsa_ratio[L] : 0;
    long v = 1;
    char buf[64];
    snprintf(buf, sizeof buf, "%s", spec);
    for (char *save = NULL, *f = strtok_r(buf, "\xc2\xb7", &save); f; f = strtok_r(NULL, "\xc2\xb7", &save)) {
        long x = !strcmp(f, "T")     ? T
                 : !strcmp(f, "E")   ? (long)hp->n_embd
                 : !strcmp(f, "H")   ? (long)hp->n_head
                 : !strcmp(f, "Hkv") ? (long)hp->n_head_kv
                 : !strcmp(f, "D")   ? (long)hp->head_dim
                 : !strcmp(f, "F")   ? (long)hp->n_ff
                 : !strcmp(f, "X")   ? (long)hp->n_expert
                 : !strcmp(f, "K")   ? (long)hp->n_expert_used
                 : !strcmp(f, "V")   ? (long)hp->n_vocab
                 : !strcmp(f, "n_kv") ? n_kv
                 : !strcmp(f, "Hk")  ? (long)hp->ssm_n_group
                 : !strcmp(f, "Hv")  ? (long)hp->ssm_dt_rank
                 : !strcmp(f, "dk")  ? (long)hp->ssm_d_state
                 : !strcmp(f, "C")   ? (long)(2 * hp->ssm_n_group * hp->ssm_d_state + hp->ssm_d_inner)
                 : !strcmp(f, "S")   ? (long)hp->ssm_conv - 1
                 : !strcmp(f, "hc")  ? (long)(hp->hc > 1 ? hp->hc : 1)
                 : !strcmp(f, "Ng")  ? (long)hp->ple_ngram
                 : !strcmp(f, "Np")  ? (long)hp->ple_n_heads
                 : !strcmp(f, "(Kp\xe2\x88\x92" "1)") ? (long)hp->ple_conv - 1
                 : !strcmp(f, "Hi")  ? (long)hp->idx_heads
                 : !strcmp(f, "di")  ? (long)hp->idx_dim
                 : !strcmp(f, "NB")  ? (r ? n_kv / r : -1)
                 : !strcmp(f, "Wq")  ? (r ? (long)hp->idx_topk + r - 1 : -1)
                                      : -1;
        cr_assert_geq(x, 0, "unknown shape letter '%s' in '%s'", f, spec);
        v *= x;
    }
    return v;
}

// 1 when kind is one of the comma-separated kinds.
static int kind_listed(const char *kinds, const char *kind) {
    size_t n = strlen(kind);
    for (const char *p = kinds; p;) {
        if (!strncmp(p, kind, n) && (p[n] == ',' || p[n] == '\0')) return 1;
        p = strchr(p, ',');
        if (p) p++;
    }
    return 0;
}

/* Catalog rows of qwen4exp that a layer of the listed kind still does not
 * emit, by the reference's documented rules (README, "qwen4exp"): the PLE
 * rows outside the PLE layer, the indexer rows on a dense (r = 0) layer,
 * qsa_scores while no block is complete (NB = 0), the PLE conv history when
 * K_p = 1. */
static int absent_by_rule(const char *row, const td_hparams *hp, long L, long n_kv) {
    if (!strncmp(row, "blk.L.ple_", 10))
        return L != hp->ple_layer || (!strcmp(row, "blk.L.ple_conv_state") && hp->ple_conv < 2);
    if (!strncmp(row, "blk.L.qsa_", 10)) {
        const long r = L >= 0 && L < 256 ? (long)hp->qsa_ratio[L] : 0;
        return r == 0 || (!strcmp(row, "blk.L.qsa_scores") && n_kv / r == 0);
    }
    return 0;
}

/* The catalog's order of a dense qsa_sel row (p + 1 <= W): 0..p ascending,
 * then -1 pads. */
static void check_dense_sel(const td_tapfile *f, int64_t s, const td_step_info *si, const td_tap_info *t) {
    const int64_t T = t->shape[0], W = t->shape[1];
    int64_t *v = calloc((size_t)(T * W), sizeof *v);
    td_err err = {{0}};
    cr_assert_eq(td_tapfile_read_i64(f, s, t->name, v, (uint64_t)(T * W), &err), 0, "%s", err.msg);
    for (int64_t r = 0; r < T; r++) {
        const int64_t p = si->pos0 + r;
        if (p + 1 > W) continue;
        for (int64_t j = 0; j < W; j++)
            cr_expect_eq(v[r * W + j], j <= p ? j : -1, "step %lld %s p %lld: entry %lld = %lld", (long long)s,
                         t->name, (long long)p, (long long)j, (long long)v[r * W + j]);
    }
    free(v);
}

static void check_arch_tokens(const char *fixture, const char *tokens) {
    const char *exe = getenv("TD_TAPDIFF");
    cr_assert_not_null(exe, "TD_TAPDIFF is not set (run through meson test)");
    char cmd[2048], model[512], taps[512];
    snprintf(cmd, sizeof cmd, "'%s' fixture --out '%s' --only %s >/dev/null", exe, tmpdir, fixture);
    cr_assert_eq(run(cmd), 0, "%s", cmd);
    snprintf(model, sizeof model, "%s/%s.gguf", tmpdir, fixture);
    snprintf(taps, sizeof taps, "%s/%s.h5", tmpdir, fixture);
    snprintf(cmd, sizeof cmd, "'%s' run --model '%s' --backend ref --tokens %s --steps 1 --out '%s' >/dev/null",
             exe, model, tokens, taps);
    cr_assert_eq(run(cmd), 0, "%s", cmd);

    td_err err = {{0}};
    td_model *m = NULL;
    cr_assert_eq(td_model_open(&m, model, &err), 0, "%s", err.msg);
    td_tapfile *f = NULL;
    cr_assert_eq(td_tapfile_open(&f, taps, &err), 0, "%s", err.msg);
    char *arch = NULL;
    cr_assert_eq(td_tapfile_attr_str(f, "arch", &arch, &err), 0, "%s", err.msg);
    size_t n_cat;
    const td_tap_entry *cat = td_tap_catalog(&n_cat);
    cr_assert_eq(td_tapfile_n_steps(f), 2);
    for (int64_t s = 0; s < 2; s++) {
        td_step_info si;
        cr_assert_eq(td_tapfile_step(f, s, &si, &err), 0, "%s", err.msg);
        td_tap_info *t = NULL;
        int64_t n = 0;
        cr_assert_eq(td_tapfile_step_taps(f, s, &t, &n, &err), 0, "%s", err.msg);
        // rows of this arch seen, per layer (globals at index n_layer)
        int64_t n_layer = m->hp.n_layer;
        char *seen = calloc(n_cat * (size_t)(n_layer + 1), 1);
        for (int64_t i = 0; i < n; i++) {
            long L;
            const td_tap_entry *e = td_tap_catalog_find(t[i].name, &L);
            cr_assert_not_null(e, "%s: step %lld: tap %s is not in the catalog", fixture, (long long)s, t[i].name);
            cr_assert(td_tap_catalog_has_arch(e, arch), "%s: tap %s is emitted, but the catalog does not list %s",
                      fixture, t[i].name, arch);
            cr_assert(td_tap_catalog_dtype_ok(e, t[i].dtype), "%s: tap %s has dtype %s, the catalog says %s",
                      fixture, t[i].name, td_dtype_name(t[i].dtype), td_tap_class_name(e->cls));
            cr_assert(L < n_layer);
            seen[(size_t)(L < 0 ? n_layer : L) * n_cat + (size_t)(e - cat)] = 1;
            // shape: one dimension per comma
            char shp[64];
            snprintf(shp, sizeof shp, "%s", e->shape);
            int d = 0;
            for (char *save = NULL, *dim = strtok_r(shp, ", ", &save); dim; dim = strtok_r(NULL, ", ", &save), d++) {
                cr_assert_lt(d, t[i].ndim, "%s: %s has %d dimensions, the catalog says [%s]", fixture, t[i].name,
                             t[i].ndim, e->shape);
                if (!strcmp(dim, "\xe2\x89\xa4W")) { // the history window: up to W = 16 ids
                    cr_assert(t[i].shape[d] >= 1 && t[i].shape[d] <= 16, "%s: %s", fixture, t[i].name);
                    continue;
                }
                long want = dim_value(dim, &m->hp, (long)si.n_tokens, (long)(si.pos0 + si.n_tokens), L);
                cr_assert_eq(t[i].shape[d], want, "%s: %s dimension %d is %lld, the catalog's %s = %ld", fixture,
                             t[i].name, d, (long long)t[i].shape[d], dim, want);
            }
            cr_assert_eq(d, t[i].ndim, "%s: %s has %d dimensions, the catalog says [%s]", fixture, t[i].name,
                         t[i].ndim, e->shape);
            if (!strcmp(e->name, "blk.L.qsa_sel")) check_dense_sel(f, s, &si, &t[i]);
        }
        for (size_t r = 0; r < n_cat; r++) {
            if (!td_tap_catalog_has_arch(&cat[r], arch)) continue;
            int layered = !strncmp(cat[r].name, "blk.L.", 6);
            const char *kinds = td_tap_catalog_kinds(&cat[r]);
            for (int64_t L = 0; L < (layered ? n_layer : 1); L++) {
                if (layered && kinds && !kind_listed(kinds, td_layer_kind_name(m->layers[L].kind))) {
                    cr_assert(!seen[(size_t)L * n_cat + r], "%s: %s emitted in layer %lld, a %s layer (catalog: %s only)",
                              fixture, cat[r].name, (long long)L, td_layer_kind_name(m->layers[L].kind), kinds);
                    continue;
                }
                if (layered && absent_by_rule(cat[r].name, &m->hp, (long)L, (long)(si.pos0 + si.n_tokens))) {
                    cr_assert(!seen[(size_t)L * n_cat + r], "%s: step %lld: %s emitted in layer %lld against its rule",
                              fixture, (long long)s, cat[r].name, (long long)L);
                    continue;
                }
                cr_assert(seen[(size_t)(layered ? L : n_layer) * n_cat + r],
                          "%s: step %lld: the catalog lists %s (layer %lld) for %s, the reference did not emit it",
                          fixture, (long long)s, cat[r].name, (long long)L, arch);
            }
        }
        free(seen);
        free(t);
    }
    free(arch);
    td_tapfile_close(f);
    td_model_close(m);
}

static void check_arch(const char *fixture) { check_arch_tokens(fixture, "1,2,3"); }

Test(catalog, reference_emits_exactly_the_llama_taps) { check_arch("llama-f32"); }
Test(catalog, reference_emits_exactly_the_qwen3_taps) { check_arch("qwen3-f32"); }
Test(catalog, reference_emits_exactly_the_qwen3moe_taps) { check_arch("qwen3moe-f32"); }
Test(catalog, reference_emits_exactly_the_qwen3next_taps_per_layer_kind) { check_arch("qwen3next-f32"); }

// `tapdiff taps` output into a string.
static char *taps_cmd(const char *args, int *rc) {
    const char *exe = getenv("TD_TAPDIFF");
    cr_assert_not_null(exe, "TD_TAPDIFF is not set (run through meson test)");
    char cmd[1024], out[512];
    snprintf(out, sizeof out, "%s/taps.out", tmpdir);
    snprintf(cmd, sizeof cmd, "'%s' taps %s > '%s' 2>&1", exe, args, out);
    *rc = run(cmd);
    return read_text(out);
}

Test(catalog, taps_command_prints_an_architectures_rows) {
    size_t n;
    const td_tap_entry *cat = td_tap_catalog(&n);
    int rc;
    char *js = taps_cmd("--arch qwen3moe --json", &rc);
    cr_assert_eq(rc, 0, "%s", js);
    size_t want = 0, got = 0;
    for (size_t i = 0; i < n; i++) {
        char key[160];
        snprintf(key, sizeof key, "\"name\":\t\"%s\"", cat[i].name);
        int listed = strstr(js, key) != NULL;
        cr_expect_eq(listed, td_tap_catalog_has_arch(&cat[i], "qwen3moe"), "%s: listed %d", cat[i].name, listed);
        want += (size_t)td_tap_catalog_has_arch(&cat[i], "qwen3moe");
    }
    for (const char *p = js; (p = strstr(p, "\"name\":")); p++) got++;
    cr_expect_eq(got, want, "%zu rows printed, %zu wanted", got, want);
    free(js);
    char *md = taps_cmd("--markdown", &rc), *cat_md = td_tap_catalog_markdown();
    cr_assert_eq(rc, 0);
    cr_expect_str_eq(md, cat_md);
    free(md), free(cat_md);
    char *bad = taps_cmd("--arch qwen9", &rc);
    cr_expect_eq(rc, 2, "%s", bad);
    cr_expect(strstr(bad, "no tap lists architecture 'qwen9'") != NULL, "%s", bad);
    free(bad);
}
/* 9 prompt tokens: block 1 (r = 4) has 2 complete blocks, block 3 (r = 8)
 * one, so qsa_scores is there in both steps; the PLE layer is block 0. */
Test(catalog, reference_emits_exactly_the_qwen4exp_taps_per_layer_kind) {
    check_arch_tokens("qwen4exp-f32", "5,9,2,6,5,3,5,8,9");
}

/* The sliding-copy property (td_tap_catalog_copy_axis) is a fact of the
 * reference forward, the source of truth here: in each step of a hybrid's
 * reference run (a 2-token prefill, so one slot still holds the zero start,
 * then one-token steps), every slot of such a tap is, bit for bit, the input
 * row the window puts there or the previous step's slot it moved from.
 * Returns how many (step, tap) pairs it checked. */
static int check_copies(const char *fixture) {
    const char *exe = getenv("TD_TAPDIFF");
    cr_assert_not_null(exe, "TD_TAPDIFF is not set (run through meson test)");
    char cmd[2048], model[512], taps[512];
    snprintf(cmd, sizeof cmd, "'%s' fixture --out '%s' --only %s >/dev/null", exe, tmpdir, fixture);
    cr_assert_eq(run(cmd), 0, "%s", cmd);
    snprintf(model, sizeof model, "%s/%s.gguf", tmpdir, fixture);
    snprintf(taps, sizeof taps, "%s/%s-copies.h5", tmpdir, fixture);
    snprintf(cmd, sizeof cmd, "'%s' run --model '%s' --backend ref --tokens 4,9 --steps 3 --out '%s' >/dev/null", exe,
             model, taps);
    cr_assert_eq(run(cmd), 0, "%s", cmd);
    td_err err = {{0}};
    td_tapfile *f = NULL;
    cr_assert_eq(td_tapfile_open(&f, taps, &err), 0, "%s", err.msg);
    int checked = 0;
    double *prev[64] = {0}; // per tap index of step 0 (same taps every step)
    for (int64_t s = 0; s < td_tapfile_n_steps(f); s++) {
        td_step_info si;
        cr_assert_eq(td_tapfile_step(f, s, &si, &err), 0, "%s", err.msg);
        td_tap_info *t = NULL;
        int64_t n = 0, k = 0;
        cr_assert_eq(td_tapfile_step_taps(f, s, &t, &n, &err), 0, "%s", err.msg);
        for (int64_t i = 0; i < n; i++) {
            const td_tap_entry *e = td_tap_catalog_find(t[i].name, NULL);
            const int axis = e ? td_tap_catalog_copy_axis(e) : -1;
            if (axis < 0) continue;
            cr_assert_lt(k, 64);
            char groups[3][3][TD_TAP_NAME_MAX];
            int last_out;
            cr_assert_geq(td_tap_catalog_inputs(t[i].name, groups, 3, &last_out), 1);
            const td_tap_info *in = NULL;
            for (int64_t j = 0; j < n; j++)
                if (!strcmp(t[j].name, groups[0][0])) in = &t[j];
            cr_assert_not_null(in, "step %lld: %s's input %s", (long long)s, t[i].name, groups[0][0]);
            cr_assert_eq(t[i].ndim, 2);
            const int64_t S = t[i].shape[axis], C = t[i].shape[1 - axis], T = si.n_tokens;
            cr_assert_eq(in->shape[0], T);
            cr_assert_eq(in->shape[1], C, "%s: one slot per input row of %lld values", t[i].name, (long long)C);
            double *v = malloc(sizeof *v * (size_t)(S * C)), *x = malloc(sizeof *x * (size_t)(T * C));
            cr_assert_eq(td_tapfile_read_f64(f, s, t[i].name, v, (uint64_t)(S * C), &err), 0, "%s", err.msg);
            cr_assert_eq(td_tapfile_read_f64(f, s, in->name, x, (uint64_t)(T * C), &err), 0, "%s", err.msg);
            for (int64_t j = 0; j < S; j++)
                for (int64_t ch = 0; ch < C; ch++) {
                    const double got = axis ? v[ch * S + j] : v[j * C + ch];
                    double want;
                    if (j >= S - T)
                        want = x[(T - S + j) * C + ch];
                    else if (s == 0)
                        want = 0; // the window starts empty
                    else
                        want = axis ? prev[k][ch * S + j + T] : prev[k][(j + T) * C + ch];
                    cr_assert_eq(got, want, "step %lld %s slot %lld channel %lld: %.17g, want %.17g", (long long)s,
                                 t[i].name, (long long)j, (long long)ch, got, want);
                }
            free(prev[k]);
            prev[k++] = v;
            free(x);
            checked++;
        }
        free(t);
    }
    for (int k = 0; k < 64; k++) free(prev[k]);
    td_tapfile_close(f);
    return checked;
}

Test(catalog, sliding_copies_hold_their_inputs_rows_and_their_own_previous_slots) {
    int n = check_copies("qwen3next-f32");
    cr_assert_geq(n, 4, "qwen3next: %d sliding copies checked", n);
    n = check_copies("qwen4exp-f32");
    cr_assert_geq(n, 4, "qwen4exp: %d sliding copies checked", n);
}
