/* tapdiff gate: the CI gate on golden logits. Runs a backend on the golden's
 * model, pinned to the tokens the golden consumed, and judges its logits
 * against the golden's: relative L2 per step against a budget calibrated by
 * the ref32-vs-ref error stored in the golden, top-1 agreement and KL per
 * position (compare.h). Exit 0 pass, 1 fail; `git bisect run` compatible:
 * 125 when this revision cannot be tested (see the help text for exactly
 * when). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "args.h"
#include "cli.h"
#include "compare.h"
#include "fixtures.h"
#include "golden.h"
#include "report.h"
#include "runner.h"

#define EXIT_CANNOT_TEST 125

static const char *const gate_help =
    "usage: tapdiff gate --golden G.h5 --backend B [--model M.gguf] [--k N] [--keep F.h5]\n"
    "                    [--report DIR] [--json] [--quiet]\n"
    "\n"
    "Runs backend B on the golden's model, pinned to the golden's tokens, and judges B's\n"
    "logits against the golden's at every step: r = err / max(k * calib, floor) <= 1, where\n"
    "calib is the ref32-vs-ref logits error stored in the golden (scaled to B's precision;\n"
    "an f64 backend gets the f64 floor 1e-13), no top-1 flip beyond the budget's margin, and\n"
    "KL within its budget at every position.\n"
    "\n"
    "The model: --model M (its sha256 must be the golden's, else exit 3); otherwise the\n"
    "golden's model path when that file has the golden's sha256; otherwise the golden's\n"
    "fixture, regenerated into ${TMPDIR:-/tmp}/tapdiff-fixtures-SHA/ (tapdiff fixture).\n"
    "\n"
    "  --k N         budget multiple of the calibration (default 4)\n"
    "  --keep F.h5   keep B's tap file (default: a temporary file, removed)\n"
    "  --report DIR  write report.md/.json/.html\n"
    "  --json        print the comparison's JSON instead of the text verdict\n"
    "\n"
    "exit: 0 pass, 1 fail, 2 usage, 3 bad input: unreadable golden, --model (or the golden's\n"
    "      model path, with no fixture to fall back on) whose sha256 differs from the golden's,\n"
    "      99 internal error,\n"
    "      125 this revision cannot be tested (git bisect run skips it), exactly when:\n"
    "        - the golden file does not exist;\n"
    "        - B is a backend tapdiff knows of (ref ref32 cpu cuda metal llamacpp) but this\n"
    "          build lacks, or B reports that it cannot run here (no device: status 77);\n"
    "        - no --model and no file with the golden's sha256 at its model path, and the\n"
    "          golden's fixture is unknown to this revision or regenerates to other bytes.\n"
    "      (A build failure is the bisect script's to map: `ninja ... || exit 125`.)\n";


static char *attr(const td_tapfile *f, const char *key) {
    char *v = NULL;
    td_err e;
    if (td_tapfile_attr_str(f, key, &v, &e)) return td_xstrdup("");
    return v;
}

static int sha_of(const char *path, char hex[65]) {
    td_err e;
    struct stat st;
    if (stat(path, &st) || !S_ISREG(st.st_mode)) return -1;
    return td_sha256_file(path, hex, &e) ? -1 : 0;
}

/* Finds the model: see the help text. Returns 0 with *path set (malloc'd),
 * TD_EINPUT or EXIT_CANNOT_TEST with a message in err. */
static int find_model(const char *given, const char *golden_model, const char *sha, const char *fixture, char **path,
                      td_err *err) {
    char hex[65];
    *path = NULL;
    if (given) {
        if (sha_of(given, hex)) return td_err_set(err, TD_EINPUT, "--model %s: cannot read it", given);
        if (strcmp(hex, sha))
            return td_err_set(err, TD_EINPUT,
                              "--model %s has sha256 %s but the golden was made from sha256 %s: a different model",
                              given, hex, sha);
        *path = td_xstrdup(given);
        return TD_OK;
    }
    int path_differs = 0;
    if (golden_model[0] && !sha_of(golden_model, hex)) {
        if (!strcmp(hex, sha)) {
            *path = td_xstrdup(golden_model);
            return TD_OK;
        }
        path_differs = 1;
    }
    if (!fixture[0]) {
        if (path_differs)
            return td_err_set(err, TD_EINPUT,
                              "%s has another sha256 (%s) than the golden's model (%s), and the golden names no "
                              "fixture: pass --model",
                              golden_model, hex, sha);
        return td_err_set(err, EXIT_CANNOT_TEST,
                          "the golden's model %s is not here and the golden names no fixture: cannot test",
                          golden_model[0] ? golden_model : "(no path)");
    }
    if (!td_fixture_find(fixture))
        return td_err_set(err, EXIT_CANNOT_TEST, "fixture %s is unknown to this revision: cannot test", fixture);
    const char *tmpdir = getenv("TMPDIR");
    size_t n = strlen(tmpdir && *tmpdir ? tmpdir : "/tmp") + strlen(fixture) + 64;
    char *dir = td_xmalloc(n), *file = td_xmalloc(n + 16);
    snprintf(dir, n, "%s/tapdiff-fixtures-%.16s", tmpdir && *tmpdir ? tmpdir : "/tmp", sha);
    snprintf(file, n + 16, "%s/%s.gguf", dir, fixture);
    int rc = TD_OK;
    if (sha_of(file, hex) || strcmp(hex, sha)) {
        td_err e2;
        if (td_fixture_write(fixture, dir, NULL, 0, &e2)) {
            rc = td_err_set(err, TD_EINTERNAL, "regenerating fixture %s: %s", fixture, e2.msg);
        } else if (sha_of(file, hex) || strcmp(hex, sha)) {
            rc = td_err_set(err, EXIT_CANNOT_TEST,
                            "fixture %s regenerates to sha256 %s at this revision, the golden's is %s: cannot test",
                            fixture, hex, sha);
        }
    }
    free(dir);
    if (rc) {
        free(file);
        return rc;
    }
    *path = file;
    return TD_OK;
}

/* u of a precision name relative to f32's (the calibration is an f32 error). */
static double roundoff_scale(td_dtype dt) {
    switch (dt) {
    case TD_DT_F16: return ldexp(1.0, -11) / ldexp(1.0, -24);
    case TD_DT_BF16: return ldexp(1.0, -8) / ldexp(1.0, -24);
    default: return 1.0;
    }
}

int td_cmd_gate(int argc, char **argv) {
    const char *golden = NULL, *backend = NULL, *model = NULL, *keep = NULL, *report = NULL;
    double k = TD_CMP_K_DEFAULT;
    int json = 0, quiet = 0;
    td_args p;
    td_args_init(&p, "gate", gate_help, argc, argv);
    for (int k; (k = td_args_next(&p)) != TD_ARG_END;) {
        if (k == TD_ARG_ERROR) return TD_EUSAGE;
        const char *a = p.arg;
        if (k == TD_ARG_POS)
            return td_cli_failf("gate", TD_EUSAGE, "unexpected argument '%s' (see tapdiff gate --help)", a);
        if (k == TD_ARG_HELP) {
            fputs(gate_help, stdout);
            return TD_OK;
        }
        if (!strcmp(a, "--json")) {
            json = 1;
            continue;
        }
        if (!strcmp(a, "--quiet")) {
            quiet = 1;
            continue;
        }
        const char *v = td_args_value(&p);
        if (!v) return TD_EUSAGE;
        if (!strcmp(a, "--golden")) golden = v;
        else if (!strcmp(a, "--backend")) backend = v;
        else if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--keep")) keep = v;
        else if (!strcmp(a, "--report")) report = v;
        else if (!strcmp(a, "--k")) {
            char *end;
            k = strtod(v, &end);
            if (end == v || *end || !(k > 0))
                return td_cli_failf("gate", TD_EUSAGE, "--k: expected a positive number, got '%s'", v);
        } else
            return td_args_unknown(&p);
    }
    if (!golden || !backend)
        return td_cli_failf("gate", TD_EUSAGE, "--golden and --backend are required (see tapdiff gate --help)");
    const td_backend_vt *vt = td_backend_find(backend);
    if (!vt) {
        const char *absent = td_backend_absent_reason(backend);
        if (absent) return td_cli_failf("gate", EXIT_CANNOT_TEST, "%s: cannot test this revision", absent);
        return td_cli_failf("gate", TD_EUSAGE, "unknown backend '%s'", backend);
    }
    if (access(golden, F_OK))
        return td_cli_failf("gate", EXIT_CANNOT_TEST, "golden %s does not exist at this revision: cannot test", golden);

    td_err err = {{0}};
    int rc;
    td_tapfile *gf = NULL;
    char *g_model = NULL, *g_sha = NULL, *g_fix = NULL, *g_cal = NULL, *mpath = NULL, *cand = NULL, *tmpdir = NULL;
    int32_t *prompt = NULL, *decode = NULL;
    int64_t n_prompt = 0, n_decode = 0;
    td_model *m = NULL;
    td_run_result res = {0};
    td_cmp_result *cr = NULL;
    char floor_note[256] = "";

    if ((rc = td_tapfile_open(&gf, golden, &err))) goto out;
    g_model = attr(gf, "model");
    g_sha = attr(gf, "model_sha256");
    g_fix = attr(gf, "fixture");
    g_cal = attr(gf, "calib_logits_rel_l2_max");
    td_tapfile_close(gf);
    gf = NULL;
    if (!g_sha[0]) {
        rc = td_err_set(&err, TD_EINPUT, "golden %s has no model_sha256 attribute: not a golden", golden);
        goto out;
    }
    if ((rc = td_read_tapfile_tokens(golden, &prompt, &n_prompt, &decode, &n_decode, &err))) goto out;
    if ((rc = find_model(model, g_model, g_sha, g_fix, &mpath, &err))) goto out;
    if ((rc = td_model_open(&m, mpath, &err))) goto out;

    if (keep) {
        cand = td_xstrdup(keep);
    } else {
        const char *t = getenv("TMPDIR");
        size_t n = strlen(t && *t ? t : "/tmp") + 32;
        tmpdir = td_xmalloc(n);
        snprintf(tmpdir, n, "%s/tapdiff-gate-XXXXXX", t && *t ? t : "/tmp");
        if (!mkdtemp(tmpdir)) {
            rc = td_err_set(&err, TD_EINTERNAL, "cannot create a temporary directory %s: %s", tmpdir, strerror(errno));
            free(tmpdir);
            tmpdir = NULL;
            goto out;
        }
        n = strlen(tmpdir) + 16;
        cand = td_xmalloc(n);
        snprintf(cand, n, "%s/cand.h5", tmpdir);
    }

    td_run_config cfg;
    td_run_config_init(&cfg);
    cfg.model_path = mpath;
    cfg.model = m;
    cfg.backend = backend;
    cfg.prompt = prompt;
    cfg.n_prompt = n_prompt;
    cfg.n_steps = n_decode;
    cfg.decode = TD_DECODE_PINNED;
    cfg.pinned = decode;
    cfg.n_pinned = n_decode;
    cfg.decode_label = "pinned:golden";
    cfg.tap_path = cand;
    cfg.tap_mode = TD_TAP_FULL;
    cfg.tap_filter = TD_GOLDEN_DATA_TAPS;
    cfg.command_line = td_cli_command_line;
    rc = td_run(&cfg, &res, &err);
    if (rc == TD_SKIP) rc = EXIT_CANNOT_TEST;
    if (rc) goto out;

    td_cmp_options o = td_cmp_options_default();
    o.k = k;
    o.filter = TD_GOLDEN_DATA_TAPS;
    td_dtype dt = TD_DT_F32;
    if (td_dtype_from_name(vt->precision, &dt)) dt = TD_DT_F32;
    char *end;
    double calib = g_cal[0] ? strtod(g_cal, &end) : NAN;
    if (dt != TD_DT_F64 && isfinite(calib) && calib >= 0) {
        double fl = k * calib * roundoff_scale(dt);
        if (fl < td_cmp_floor(dt)) fl = td_cmp_floor(dt);
        o.floor = fl;
        snprintf(floor_note, sizeof floor_note,
                 "gate: max(k x %.3g (the golden's ref32-vs-ref logits error, scaled to %s), the %s floor %.3g)",
                 calib, td_dtype_name(dt), td_dtype_name(dt), td_cmp_floor(dt));
        o.floor_note = floor_note;
    } else if (dt != TD_DT_F64) {
        snprintf(floor_note, sizeof floor_note, "the golden has no calibration: %s floor only", td_dtype_name(dt));
        o.floor = td_cmp_floor(dt);
        o.floor_note = floor_note;
    }
    if ((rc = td_compare(golden, cand, &o, &cr, &err))) goto out;
    if (!quiet && !json)
        printf("tapdiff gate: %s  backend %s vs golden %s (%lld prompt tokens + %lld steps, model %s)\n",
               cr->verdict == TD_OK ? "PASS" : "FAIL", backend, golden, (long long)n_prompt, (long long)n_decode,
               mpath);
    if (json) {
        char *js = td_report_json(cr);
        puts(js);
        free(js);
    } else if (!quiet || cr->verdict != TD_OK) {
        td_report_text(stdout, cr);
    } else {
        printf("tapdiff gate: PASS  backend %s vs golden %s\n", backend, golden);
    }
    if (report) {
        if ((rc = td_report_write_dir(report, cr, &err))) goto out;
        fprintf(json ? stderr : stdout, "report: %s/report.html\n", report);
    }
    rc = cr->verdict == TD_OK ? TD_OK : TD_DIVERGENT;

out:
    if (gf) td_tapfile_close(gf);
    if (tmpdir) {
        if (cand) unlink(cand);
        rmdir(tmpdir);
    }
    td_cmp_result_free(cr);
    td_run_result_free(&res);
    if (m) td_model_close(m);
    free(prompt);
    free(decode);
    free(g_model);
    free(g_sha);
    free(g_fix);
    free(g_cal);
    free(mpath);
    free(cand);
    free(tmpdir);
    if (rc != TD_OK && rc != TD_DIVERGENT) return td_cli_fail("gate", rc, &err);
    fflush(stdout);
    return rc;
}
