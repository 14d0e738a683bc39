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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "args.h"
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
    const char *prompt_opt = NULL, *prompt_file = NULL;
    long long steps = -1;
    int quiet = 0, logits_only = 0;
    td_args p;
    td_args_init(&p, "golden", golden_help, argc, argv);
    for (int k; (k = td_args_next(&p)) != TD_ARG_END;) {
        if (k == TD_ARG_ERROR) return TD_EUSAGE;
        const char *a = p.arg;
        if (k == TD_ARG_POS)
            return td_cli_failf("golden", TD_EUSAGE, "unexpected argument '%s' (see tapdiff golden --help)", a);
        if (k == TD_ARG_HELP) {
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
        const char *v = td_args_value(&p);
        if (!v) return TD_EUSAGE;
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--tokens")) tokens = v;
        else if (!strcmp(a, "--tokens-file")) tokens_file = v;
        else if (!strcmp(a, "--prompt")) prompt_opt = v;
        else if (!strcmp(a, "--prompt-file")) prompt_file = v;
        else if (!strcmp(a, "--out")) out = v;
        else if (!strcmp(a, "--fixture")) fixture = v;
        else if (!strcmp(a, "--steps")) {
            if (parse_ll(v, 0, 4096, &steps))
                return td_cli_failf("golden", TD_EUSAGE, "--steps: expected a count 0..4096, got '%s'", v);
        } else
            return td_args_unknown(&p);
    }
    if (!model || !out || steps < 0)
        return td_cli_failf("golden", TD_EUSAGE, "--model, --steps and --out are required (see tapdiff golden --help)");
    if (!!tokens + !!tokens_file + !!prompt_opt + !!prompt_file != 1)
        return td_cli_failf("golden", TD_EUSAGE, "give exactly one of --tokens, --tokens-file, --prompt and --prompt-file");

    td_err err = {{0}};
    int rc;
    int32_t *prompt = NULL;
    int64_t n_prompt = 0;
    char *prompt_text = NULL;
    size_t prompt_len = 0;
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
    if ((rc = td_cli_prompt(model, prompt_opt, prompt_file, &prompt_text, &prompt_len, &prompt, &n_prompt, &err)))
        goto done;
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
    cfg.prompt_text = prompt_text;
    if ((rc = td_run(&cfg, &ra, &err))) goto done;
    cfg.backend = "ref32";
    cfg.decode = TD_DECODE_PINNED;
    cfg.pinned = ra.fed;
    cfg.n_pinned = steps;
    cfg.decode_label = "pinned:golden";
    cfg.tap_path = tmp;
    if ((rc = td_run(&cfg, &rb, &err))) goto done;
    if (logits_only && (rc = td_golden_copy_data_taps(full, out, &err))) goto done;

    td_cmp_options o = td_cmp_options_default();
    o.filter = "out.logits";
    if ((rc = td_compare(out, tmp, &o, &cr, &err))) goto done;
    double mx = 0;
    calib = td_xcalloc((size_t)cr->n_taps + 1, 32);
    for (int64_t i = 0; i < cr->n_taps; i++) {
        char num[32];
        snprintf(num, sizeof num, "%s%.6g", i ? "," : "", td_cmp_tap_at(cr, i)->err);
        strcat(calib, num);
        if (td_cmp_tap_at(cr, i)->err > mx) mx = td_cmp_tap_at(cr, i)->err;
    }
    if ((rc = td_golden_attr_put(out, "golden", "tapdiff-golden", NULL, &err)) ||
        (rc = td_golden_attr_put(out, "golden_version", "1", NULL, &err)) ||
        (rc = td_golden_attr_put(out, "fixture", fix, NULL, &err)) ||
        (rc = td_golden_attr_put(out, "calib_backend", "ref32", NULL, &err)) ||
        (rc = td_golden_attr_put(out, "calib_logits_rel_l2", calib, NULL, &err)) ||
        (rc = td_golden_attr_put(out, "calib_logits_rel_l2_max", NULL, &mx, &err)))
        goto done;
    // What gate will refuse is not written: non-finite logits (a model
    // holding a NaN) or a calibration out of range.
    td_golden_info gi;
    if ((rc = td_golden_check(out, &gi, &err))) {
        unlink(out);
        td_err why = err;
        td_err_set(&err, rc, "not written: %s", why.msg);
        goto done;
    }
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
    free(prompt_text);
    free(calib);
    free(tmp);
    free(full);
    if (rc) return td_cli_fail("golden", rc, &err);
    return TD_OK;
}
