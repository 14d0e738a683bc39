/* Tests of `tapdiff gate` and `tapdiff golden` against the checked-in
 * goldens (golden/MANIFEST): ref and ref32 pass every golden; a golden whose
 * logits were perturbed fails, naming the step; a model of another sha256 is
 * refused (3); the "cannot test" cases exit 125 (git bisect run); a golden
 * made by `tapdiff golden` carries its fixture and calibration. Skipped when
 * this build cannot run the reference. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "fixtures.h"
#include "tapgen.h"
#include "td_test.h"

static char dir[256];
static int pool_n;

static void mkdir_tmp(void) {
    td_test_tmpdir(dir, sizeof dir, "gate");
    pool_n = 0;
    setenv("TMPDIR", dir, 1); // the gate's fixture cache and temporary files
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

TestSuite(gate, .init = mkdir_tmp, .fini = rm_tmp, .timeout = 120);

typedef struct entry {
    char file[128], fixture[64], sha[65];
} entry;

/* The MANIFEST's entries; skips the test when the goldens or the reference
 * are not usable here. */
static int manifest(entry *e, int max) {
    const char *root = getenv("TD_SOURCE_ROOT");
    if (!root || !getenv("TD_TAPDIFF")) cr_skip_test("TD_SOURCE_ROOT / TD_TAPDIFF not set");
    char path[400], line[1024];
    snprintf(path, sizeof path, "%s/golden/MANIFEST", root);
    FILE *f = fopen(path, "r");
    if (!f) cr_skip_test("no %s", path);
    int n = 0;
    while (n < max && fgets(line, sizeof line, f)) {
        if (line[0] == '#' || line[0] == '\n') continue;
        char *save, *file = strtok_r(line, "\t", &save), *fx = strtok_r(NULL, "\t", &save),
                    *sha = strtok_r(NULL, "\t", &save);
        cr_assert(file && fx && sha, "malformed MANIFEST line");
        snprintf(e[n].file, sizeof e[n].file, "%s/golden/%s", root, file);
        snprintf(e[n].fixture, sizeof e[n].fixture, "%s", fx);
        snprintf(e[n].sha, sizeof e[n].sha, "%s", sha);
        n++;
    }
    fclose(f);
    cr_assert_gt(n, 0, "golden/MANIFEST lists no golden");
    // can this build run the reference at all?
    char model[400], out[4096];
    td_err err;
    cr_assert_eq(td_fixture_write("llama-f32", dir, model, sizeof model, &err), TD_OK, "%s", err.msg);
    const char *args[] = {"run", "--model", model, "--backend", "ref", "--tokens", "1", "--steps", "1", "--quiet", NULL};
    int rc = tg_run(out, sizeof out, args);
    if (rc) cr_skip_test("the ref backend does not run in this build (exit %d): %.200s", rc, out);
    return n;
}

static const char *fixture_path(const char *name) {
    static char path[400];
    td_err e;
    cr_assert_eq(td_fixture_write(name, dir, path, sizeof path, &e), TD_OK, "%s", e.msg);
    return path;
}

static int gate(char *out, size_t cap, const char *golden, const char *backend, const char *model) {
    const char *args[12] = {"gate", "--golden", golden, "--backend", backend};
    int n = 5;
    if (model) args[n++] = "--model", args[n++] = model;
    args[n] = NULL;
    return tg_run(out, cap, args);
}

Test(gate, ref_and_ref32_pass_every_golden) {
    entry e[16];
    int n = manifest(e, 16);
    char out[16384];
    for (int i = 0; i < n; i++) {
        const char *model = fixture_path(e[i].fixture);
        for (int b = 0; b < 2; b++) {
            const char *be = b ? "ref32" : "ref";
            int rc = gate(out, sizeof out, e[i].file, be, model);
            cr_assert_eq(rc, 0, "gate %s against %s: exit %d\n%s", be, e[i].file, rc, out);
            cr_assert(strstr(out, "tapdiff gate: PASS"), "%s", out);
        }
    }
    // without --model: the fixture is regenerated from the golden's name
    int rc = gate(out, sizeof out, e[0].file, "ref32", NULL);
    cr_assert_eq(rc, 0, "gate without --model: exit %d\n%s", rc, out);
}

static void bump_logits(void *ctx, int64_t step, const td_tap_info *t, double *v, uint64_t n) {
    const double *rel = ctx;
    if (step != 3 || strcmp(t->name, "out.logits")) return;
    for (uint64_t i = 0; i < n; i++) v[i] *= 1.0 + *rel * tg_unif(5, 6, i);
}

Test(gate, perturbed_golden_logits_fail) {
    entry e[16];
    manifest(e, 16);
    const char *model = fixture_path(e[0].fixture);
    char out[16384];
    double rel = 1e-3; // ~1000x the ref32 calibration (~1e-6)
    tg_copy(e[0].file, P("bad.h5"), bump_logits, &rel, NULL, NULL, NULL, NULL);
    for (int b = 0; b < 2; b++) {
        const char *be = b ? "ref32" : "ref";
        int rc = gate(out, sizeof out, P("bad.h5"), be, model);
        cr_assert_eq(rc, 1, "gate %s against a perturbed golden: exit %d\n%s", be, rc, out);
        cr_assert(strstr(out, "tapdiff gate: FAIL"), "%s", out);
        cr_assert(strstr(out, "FIRST DIVERGENT  out.logits  at step 3"), "%s", out);
    }
    // an untouched copy (same path handling, same attributes as text) still passes
    rel = 0;
    tg_copy(e[0].file, P("same.h5"), bump_logits, &rel, NULL, NULL, NULL, NULL);
    cr_assert_eq(gate(out, sizeof out, P("same.h5"), "ref32", model), 0, "%s", out);
}

Test(gate, another_model_is_refused) {
    entry e[16];
    int n = manifest(e, 16);
    const char *other = strcmp(e[0].fixture, "llama-f32") ? "llama-f32" : "qwen3-f32";
    char out[8192];
    int rc = gate(out, sizeof out, e[0].file, "ref", fixture_path(other));
    cr_assert_eq(rc, 3, "exit %d\n%s", rc, out);
    // refused before running anything, naming the option and both hashes
    cr_assert(strstr(out, "--model") && strstr(out, "sha256") && strstr(out, e[0].sha), "%s", out);
    (void)n;
}

Test(gate, cannot_test_exits_125) {
    entry e[16];
    manifest(e, 16);
    char out[8192];
    cr_assert_eq(gate(out, sizeof out, P("no-such-golden.h5"), "ref", NULL), 125, "%s", out);
    // a golden whose fixture this revision does not know, and no model file
    tg_copy(e[0].file, P("g1.h5"), NULL, NULL, NULL, "fixture", "no-such-fixture", NULL);
    tg_copy(P("g1.h5"), P("g2.h5"), NULL, NULL, NULL, "model", "/nonexistent/m.gguf", NULL);
    cr_assert_eq(gate(out, sizeof out, P("g2.h5"), "ref", NULL), 125, "%s", out);
    cr_assert(strstr(out, "no-such-fixture"), "%s", out);
    // a backend tapdiff knows of but this build lacks
    if (!td_backend_find("metal")) cr_assert_eq(gate(out, sizeof out, e[0].file, "metal", NULL), 125, "%s", out);
    // a name tapdiff never heard of is a usage error, not "cannot test"
    cr_assert_eq(gate(out, sizeof out, e[0].file, "nonsense", NULL), 2, "%s", out);
}

Test(gate, golden_carries_fixture_and_calibration) {
    entry e[16];
    manifest(e, 16);
    const char *model = fixture_path("llama-q8_0");
    char out[8192];
    const char *args[] = {"golden", "--model", model, "--tokens", "1,15,20,7", "--steps", "4", "--out", P("g.h5"),
                          "--quiet", NULL};
    cr_assert_eq(tg_run(out, sizeof out, args), 0, "%s", out);
    td_tapfile *f;
    td_err err;
    cr_assert_eq(td_tapfile_open(&f, P("g.h5"), &err), TD_OK, "%s", err.msg);
    cr_assert_eq(td_tapfile_n_steps(f), 5);
    char *fx, *list, *mx, *sha;
    cr_assert_eq(td_tapfile_attr_str(f, "fixture", &fx, &err), TD_OK);
    cr_assert_str_eq(fx, "llama-q8_0");
    cr_assert_eq(td_tapfile_attr_str(f, "model_sha256", &sha, &err), TD_OK);
    char want[65];
    cr_assert_eq(td_sha256_file(model, want, &err), TD_OK);
    cr_assert_str_eq(sha, want);
    cr_assert_eq(td_tapfile_attr_str(f, "calib_logits_rel_l2", &list, &err), TD_OK);
    cr_assert_eq(td_tapfile_attr_str(f, "calib_logits_rel_l2_max", &mx, &err), TD_OK);
    // the maximum is the list's maximum, one value per step, f32-sized errors
    double m = 0;
    int k = 0;
    for (char *p = list; *p; k++) {
        char *end;
        double v = strtod(p, &end);
        cr_assert(v > 1e-9 && v < 1e-4, "calibration %g is not an f32-sized error", v);
        if (v > m) m = v;
        p = *end == ',' ? end + 1 : end;
    }
    cr_assert_eq(k, 5);
    cr_assert_float_eq(strtod(mx, NULL), m, 1e-5 * m);
    // logits kept with data, other taps as fingerprints
    td_tap_info ti;
    cr_assert_eq(td_tapfile_tap(f, 2, "out.logits", &ti, &err), TD_OK);
    cr_assert_eq(ti.has_data, 1);
    cr_assert_eq(td_tapfile_tap(f, 2, "blk.0.attn_q", &ti, &err), TD_OK);
    cr_assert_eq(ti.has_data, 0);
    free(fx);
    free(sha);
    free(list);
    free(mx);
    td_tapfile_close(f);
    // and the fresh golden gates ref32
    cr_assert_eq(gate(out, sizeof out, P("g.h5"), "ref32", NULL), 0, "%s", out);
}
