/* tapdiff golden: (re)generates a golden file from the reference. The ref
 * arm runs greedy and its tap file keeps the logits (and the tokens) with
 * data, every other tap as a fingerprint; then ref32 runs pinned to the same
 * tokens and its logits error against ref, per step, is stored in the golden
 * as the calibration `tapdiff gate` scales its floor by. When the model is a
 * fixture the golden also names it, so a gate can regenerate the model
 * bit for bit (`tapdiff fixture`) instead of needing the file.
 *
 * Golden attributes added to the tap file's root (besides the runner's
 * provenance: model, model_sha256, backend, git_revision, command_line...):
 *   golden                   str  "tapdiff-golden"
 *   golden_version           str  "1"
 *   fixture                  str  fixture name, "" when the model is not one
 *   calib_backend            str  "ref32"
 *   calib_logits_rel_l2      str  per-step rel L2 of ref32 vs ref logits,
 *                                 comma-separated, step order
 *   calib_logits_rel_l2_max  f64  their maximum */
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "compare.h"
#include "fixtures.h"
#include "golden.h"
#include "runner.h"

static const char *const golden_help =
    "usage: tapdiff golden --model M.gguf (--tokens LIST | --tokens-file F) --steps N --out G.h5\n"
    "                      [--fixture NAME] [--logits-only] [--quiet]\n"
    "\n"
    "Writes the golden file G.h5: the ref arm run greedy over the prompt and N decode steps,\n"
    "with out.logits and inp.tokens stored in full and every other tap as a fingerprint,\n"
    "plus the ref32-vs-ref logits error per step (the calibration `tapdiff gate` uses).\n"
    "Keep goldens small: a few tokens, 4-8 steps.\n"
    "\n"
    "  --fixture NAME   the model is this fixture (checked: its bytes must match M); by\n"
    "                   default a model named NAME.gguf whose bytes are fixture NAME's\n"
    "                   is recognized as that fixture\n"
    "  --logits-only    keep only the taps with data (out.logits, inp.tokens): a golden a\n"
    "                   tenth of the size, for checking in (golden/ uses it)\n"
    "\n"
    "exit: 0 written, 2 usage, 3 bad model/tokens or a fixture that does not match,\n"
    "      99 internal error\n";

/* ------------------------------------------- attributes on a closed file */

int td_golden_attr_put(const char *path, const char *key, const char *str, const double *num, td_err *err) {
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    if (f < 0) return td_err_set(err, TD_EINPUT, "golden %s: cannot open it for writing attributes", path);
    int rc = TD_OK;
    hid_t type = -1, space = H5Screate(H5S_SCALAR), a = -1;
    if (H5Aexists(f, key) > 0) H5Adelete(f, key);
    if (str) {
        type = H5Tcopy(H5T_C_S1);
        H5Tset_size(type, H5T_VARIABLE);
        H5Tset_cset(type, H5T_CSET_UTF8);
        a = H5Acreate2(f, key, type, space, H5P_DEFAULT, H5P_DEFAULT);
        if (a < 0 || H5Awrite(a, type, &str) < 0) rc = TD_EINTERNAL;
    } else {
        a = H5Acreate2(f, key, H5T_IEEE_F64LE, space, H5P_DEFAULT, H5P_DEFAULT);
        if (a < 0 || H5Awrite(a, H5T_NATIVE_DOUBLE, num) < 0) rc = TD_EINTERNAL;
    }
    if (a >= 0) H5Aclose(a);
    if (type >= 0) H5Tclose(type);
    H5Sclose(space);
    if (H5Fclose(f) < 0) rc = TD_EINTERNAL;
    if (rc) td_err_set(err, rc, "golden %s: cannot write attribute '%s'", path, key);
    return rc;
}

int td_golden_fixture_of(const char *model_path, const char *sha, const char *want, char *name, size_t n,
                         td_err *err) {
    name[0] = '\0';
    char cand[128];
    if (want) {
        snprintf(cand, sizeof cand, "%s", want);
    } else {
        const char *base = strrchr(model_path, '/');
        base = base ? base + 1 : model_path;
        size_t len = strlen(base);
        if (len < 6 || strcmp(base + len - 5, ".gguf") || len - 5 >= sizeof cand) return TD_OK;
        memcpy(cand, base, len - 5);
        cand[len - 5] = '\0';
    }
    if (!td_fixture_find(cand))
        return want ? td_err_set(err, TD_EINPUT, "--fixture %s: no such fixture (tapdiff fixture --list)", want) : TD_OK;
    uint8_t *buf;
    size_t len;
    int rc = td_fixture_build(cand, &buf, &len, err);
    if (rc) return rc;
    char hex[65];
    td_sha256_buf(buf, len, hex);
    free(buf);
    if (strcmp(hex, sha)) {
        if (want)
            return td_err_set(err, TD_EINPUT,
                              "--fixture %s: %s is not that fixture (sha256 %s; fixture %s builds sha256 %s)", want,
                              model_path, sha, want, hex);
        return TD_OK;
    }
    snprintf(name, n, "%s", cand);
    return TD_OK;
}

/* Copies the taps of src that carry data into a new tap file dst (root
 * attributes as text, steps as they are): a golden of the logits alone. */
static int copy_data_taps(const char *src, const char *dst, td_err *err) {
    td_tapfile *f = NULL;
    td_tap_sink *s = NULL;
    char **names = NULL;
    int nn = 0, rc;
    if ((rc = td_tapfile_open(&f, src, err))) return rc;
    td_tap_options o = td_tap_options_default();
    o.compress = 0; // f64 logits do not compress; contiguous storage is smaller
    if ((rc = td_tap_sink_open(&s, dst, &o, err))) goto out;
    if ((rc = td_tapfile_attr_names(f, &names, &nn, err))) goto out;
    static const char *const own[] = {"format", "format_version", "created", "tap_mode", "tap_filter"};
    for (int i = 0; i < nn; i++) {
        int skip = 0;
        for (size_t k = 0; k < sizeof own / sizeof own[0]; k++) skip |= !strcmp(names[i], own[k]);
        char *v;
        if (skip || td_tapfile_attr_str(f, names[i], &v, err)) continue;
        td_tap_sink_attr_str(s, names[i], v);
        free(v);
    }
    for (int64_t st = 0; !rc && st < td_tapfile_n_steps(f); st++) {
        td_step_info si;
        td_tap_info *taps = NULL;
        int64_t n = 0;
        if ((rc = td_tapfile_step(f, st, &si, err)) || (rc = td_tapfile_step_taps(f, st, &taps, &n, err)) ||
            (rc = td_tap_step_begin(s, si.kind, si.pos0, si.n_tokens, err))) {
            free(taps);
            break;
        }
        for (int64_t i = 0; !rc && i < n; i++) {
            const td_tap_info *t = &taps[i];
            if (!t->has_data) continue;
            size_t cnt = (size_t)(t->count ? t->count : 1);
            if (td_dtype_is_int(t->dtype)) {
                int64_t *v = td_xmalloc(cnt * sizeof *v);
                if (!(rc = td_tapfile_read_i64(f, st, t->name, v, t->count, err)))
                    td_tap_emit(s, -1, t->name, TD_DT_I64, v, t->ndim, t->shape);
                free(v);
            } else {
                double *v = td_xmalloc(cnt * sizeof *v);
                if (!(rc = td_tapfile_read_f64(f, st, t->name, v, t->count, err)))
                    td_tap_emit(s, -1, t->name, TD_DT_F64, v, t->ndim, t->shape);
                free(v);
            }
        }
        free(taps);
        if (!rc) rc = td_tap_step_end(s, err);
    }
out:
    td_tapfile_free_names(names, nn);
    if (s) {
        td_err e2;
        int crc = td_tap_sink_close(s, &e2);
        if (crc && !rc) {
            rc = crc;
            *err = e2;
        }
    }
    td_tapfile_close(f);
    return rc;
}

/* ---------------------------------------------------------------- main */

static int parse_ll(const char *s, long long lo, long long hi, long long *v) {
    char *end;
    long long x = strtoll(s, &end, 10);
    if (!*s || *end || x < lo || x > hi) return -1;
    *v = x;
    return 0;
}

int td_cmd_golden(int argc, char **argv) {
    const char *model = NULL, *tokens = NULL, *tokens_file = NULL, *out = NULL, *fixture = NULL;
    long long steps = -1;
    int quiet = 0, logits_only = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(golden_help, stdout);
            return TD_OK;
        }
        if (!strcmp(a, "--quiet")) {
            quiet = 1;
            continue;
        }
        if (!strcmp(a, "--logits-only")) {
            logits_only = 1;
            continue;
        }
        if (strncmp(a, "--", 2) || i + 1 >= argc)
            return td_cli_failf("golden", TD_EUSAGE, "unexpected argument '%s' (see tapdiff golden --help)", a);
        const char *v = argv[++i];
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--tokens")) tokens = v;
        else if (!strcmp(a, "--tokens-file")) tokens_file = v;
        else if (!strcmp(a, "--out")) out = v;
        else if (!strcmp(a, "--fixture")) fixture = v;
        else if (!strcmp(a, "--steps")) {
            if (parse_ll(v, 0, 4096, &steps))
                return td_cli_failf("golden", TD_EUSAGE, "--steps: expected a count 0..4096, got '%s'", v);
        } else
            return td_cli_failf("golden", TD_EUSAGE, "unknown option '%s' (see tapdiff golden --help)", a);
    }
    if (!model || !out || steps < 0)
        return td_cli_failf("golden", TD_EUSAGE, "--model, --steps and --out are required (see tapdiff golden --help)");
    if (!!tokens == !!tokens_file)
        return td_cli_failf("golden", TD_EUSAGE, "give exactly one of --tokens and --tokens-file");

    td_err err = {{0}};
    int rc;
    int32_t *prompt = NULL;
    int64_t n_prompt = 0;
    td_model *m = NULL;
    td_run_result ra = {0}, rb = {0};
    td_cmp_result *cr = NULL;
    char *calib = NULL;
    size_t cl = strlen(out) + 16;
    char *tmp = td_xmalloc(cl), *full = td_xmalloc(cl);
    snprintf(tmp, cl, "%s.calib.h5", out);
    snprintf(full, cl, "%s.full.h5", out);
    char sha[65], fix[128] = "";

    if (tokens && td_parse_token_list(tokens, "--tokens", &prompt, &n_prompt, &err)) {
        rc = TD_EUSAGE;
        goto done;
    }
    if (tokens_file && (rc = td_read_token_text(tokens_file, &prompt, &n_prompt, &err))) goto done;
    if ((rc = td_sha256_file(model, sha, &err))) goto done;
    if ((rc = td_golden_fixture_of(model, sha, fixture, fix, sizeof fix, &err))) goto done;
    if ((rc = td_model_open(&m, model, &err))) goto done;

    td_run_config cfg;
    td_run_config_init(&cfg);
    cfg.model_path = model;
    cfg.model = m;
    cfg.backend = "ref";
    cfg.prompt = prompt;
    cfg.n_prompt = n_prompt;
    cfg.n_steps = steps;
    cfg.tap_path = logits_only ? full : out;
    cfg.tap_mode = TD_TAP_FULL;
    cfg.tap_filter = TD_GOLDEN_DATA_TAPS;
    cfg.command_line = td_cli_command_line;
    if ((rc = td_run(&cfg, &ra, &err))) goto done;
    cfg.backend = "ref32";
    cfg.decode = TD_DECODE_PINNED;
    cfg.pinned = ra.fed;
    cfg.n_pinned = steps;
    cfg.decode_label = "pinned:golden";
    cfg.tap_path = tmp;
    if ((rc = td_run(&cfg, &rb, &err))) goto done;
    if (logits_only && (rc = copy_data_taps(full, out, &err))) goto done;

    td_cmp_options o = td_cmp_options_default();
    o.filter = "out.logits";
    if ((rc = td_compare(out, tmp, &o, &cr, &err))) goto done;
    double mx = 0;
    calib = td_xcalloc((size_t)cr->n_taps + 1, 32);
    for (int64_t i = 0; i < cr->n_taps; i++) {
        char num[32];
        snprintf(num, sizeof num, "%s%.6g", i ? "," : "", cr->taps[i].err);
        strcat(calib, num);
        if (cr->taps[i].err > mx) mx = cr->taps[i].err;
    }
    if ((rc = td_golden_attr_put(out, "golden", "tapdiff-golden", NULL, &err)) ||
        (rc = td_golden_attr_put(out, "golden_version", "1", NULL, &err)) ||
        (rc = td_golden_attr_put(out, "fixture", fix, NULL, &err)) ||
        (rc = td_golden_attr_put(out, "calib_backend", "ref32", NULL, &err)) ||
        (rc = td_golden_attr_put(out, "calib_logits_rel_l2", calib, NULL, &err)) ||
        (rc = td_golden_attr_put(out, "calib_logits_rel_l2_max", NULL, &mx, &err)))
        goto done;
    if (!quiet)
        printf("golden: %s  model %s (sha256 %.16s...)  fixture %s  %lld prompt tokens + %lld steps  ref32 logits "
               "error max %.3g\n",
               out, model, sha, fix[0] ? fix : "(none)", (long long)n_prompt, steps, mx);

done:
    unlink(tmp);
    unlink(full);
    td_cmp_result_free(cr);
    td_run_result_free(&ra);
    td_run_result_free(&rb);
    if (m) td_model_close(m);
    free(prompt);
    free(calib);
    free(tmp);
    free(full);
    if (rc) return td_cli_fail("golden", rc, &err);
    return TD_OK;
}
