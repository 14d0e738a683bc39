/* tapdiff compare: the CLI of compare.h. Compares two tap files, prints the
 * one-screen verdict (or JSON) on stdout, optionally writes the reports, and
 * exits 0 conformant / 1 divergent / 2 usage / 3 refused (bad or
 * incompatible input). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "cli.h"
#include "compare.h"
#include "report.h"
#include "runner.h"

static const char *usage_text =
    "usage: tapdiff compare A.h5 B.h5 [--control C.h5 | --control-a CA.h5 --control-b CB.h5]\n"
    "                       [--k N] [--floor X] [--topk N] [--filter PATTERN] [--allow-token-mismatch]\n"
    "                       [--report DIR] [--json]\n"
    "\n"
    "Compares the candidate B against the reference A tap by tap (B's execution order, matched by\n"
    "step and name) and names the first divergent tensor.\n"
    "\n"
    "  --control C        the control arm: err_ctrl(t) = err(A, C) (e.g. ref32 when A is ref)\n"
    "  --control-a/-b     a control pair: err_ctrl(t) = err(CA, CB)\n"
    "                     without a control, the budget is the dtype floor only\n"
    "  --k N              budget r = err / max(k * err_ctrl, floor); default 4\n"
    "  --floor X          replace the per-dtype floor (f64 1e-13, f32 2^-20, f16 2^-7, bf16 2^-4)\n"
    "  --topk N           logits top-k overlap (default 5)\n"
    "  --filter PATTERN   compare only taps matching these comma-separated globs ('blk.*.ffn_*,out.*')\n"
    "  --allow-unknown-model   compare a file without model_sha256 (refused by default: it\n"
    "                     could have been made from any model)\n"
    "  --allow-token-mismatch  compare arms that consumed different tokens (the mismatch is then\n"
    "                     reported as an integer mismatch at inp.tokens instead of refused)\n"
    "  --report DIR       write DIR/report.md, report.json, report.html\n"
    "  --json             print the JSON document instead of the text verdict\n"
    "\n"
    "exit: 0 conformant, 1 divergent (or nothing/not everything compared), 2 usage,\n"
    "      3 refused: unreadable file, different models, different tokens, incompatible shapes\n";

int td_cmd_compare(int argc, char **argv) {
    td_cmp_options o = td_cmp_options_default();
    const char *pos[2] = {0};
    int npos = 0, json = 0, allow_unknown_model = 0;
    const char *report = NULL;
    td_args p;
    td_args_init(&p, "compare", usage_text, argc, argv);
    for (int k; (k = td_args_next(&p)) != TD_ARG_END;) {
        const char *v;
        if (k == TD_ARG_HELP) {
            fputs(usage_text, stdout);
            return TD_OK;
        }
        if (k == TD_ARG_ERROR) return TD_EUSAGE;
        if (k == TD_ARG_POS) {
            if (npos == 2)
                return td_cli_failf("compare", TD_EUSAGE, "too many files: '%s' (want A.h5 B.h5)", p.arg);
            pos[npos++] = p.arg;
        } else if (td_args_is(&p, "--json")) {
            json = 1;
        } else if (td_args_is(&p, "--allow-token-mismatch")) {
            o.allow_token_mismatch = 1;
        } else if (td_args_is(&p, "--allow-unknown-model")) {
            allow_unknown_model = 1;
        } else if (td_args_is(&p, "--control") || td_args_is(&p, "--control-a") || td_args_is(&p, "--control-b") ||
                   td_args_is(&p, "--filter") || td_args_is(&p, "--report")) {
            const char *a = p.arg;
            if (!(v = td_args_value(&p))) return TD_EUSAGE;
            if (!strcmp(a, "--control")) o.control = v;
            if (!strcmp(a, "--control-a")) o.control_a = v;
            if (!strcmp(a, "--control-b")) o.control_b = v;
            if (!strcmp(a, "--filter")) o.filter = v;
            if (!strcmp(a, "--report")) report = v;
        } else if (td_args_is(&p, "--k") || td_args_is(&p, "--floor")) {
            double d;
            if (td_args_double(&p, 0, HUGE_VAL, &d)) return TD_EUSAGE;
            if (!(d > 0)) return td_cli_failf("compare", TD_EUSAGE, "%s wants a positive number", p.arg);
            if (td_args_is(&p, "--k") && d < 1)
                return td_cli_failf("compare", TD_EUSAGE, "--k wants a finite number >= 1, got %g", d);
            if (td_args_is(&p, "--k")) o.k = d;
            else o.floor = d;
        } else if (td_args_is(&p, "--topk")) {
            if (td_args_int(&p, 1, TD_CMP_TOPK_MAX, &o.topk)) return TD_EUSAGE;
        } else {
            return td_args_unknown(&p);
        }
    }
    if (npos != 2) {
        td_cli_failf("compare", TD_EUSAGE, "want two tap files, A (reference) and B (candidate)");
        fputs(usage_text, stderr);
        return TD_EUSAGE;
    }
    if ((o.control_a != NULL) != (o.control_b != NULL))
        return td_cli_failf("compare", TD_EUSAGE, "--control-a and --control-b go together");
    if (o.control && o.control_a)
        return td_cli_failf("compare", TD_EUSAGE, "--control and --control-a/--control-b exclude each other");

    if (report) {
        const char *inputs[] = {pos[0], pos[1], o.control, o.control_a, o.control_b};
        static const char *const outs[] = {"", "/report.md", "/report.json", "/report.html"};
        for (size_t i = 0; i < sizeof outs / sizeof outs[0]; i++) {
            char path[4096];
            snprintf(path, sizeof path, "%s%s", report, outs[i]);
            if (td_same_file_any(path, inputs, 5))
                return td_cli_failf("compare", TD_EUSAGE, "--report %s: %s is an input file: refusing to overwrite it",
                                    report, path);
        }
    }
    td_cmp_result *r;
    td_err err = {{0}};
    o.require_model_sha256 = !allow_unknown_model;
    o.qsa_ratio_from_model = 1;
    int st = td_compare(pos[0], pos[1], &o, &r, &err);
    if (st) return td_cli_fail("compare", st, &err);
    if (json) {
        td_report_json_write(stdout, r);
        fputc('\n', stdout);
    } else {
        td_report_text(stdout, r);
    }
    if (report) {
        st = td_report_write_dir(report, r, &err);
        if (st) {
            td_cmp_result_free(r);
            return td_cli_fail("compare", st, &err);
        }
        fprintf(json ? stderr : stdout, "report: %s/report.html\n", report);
    }
    int rc = r->verdict == TD_OK ? TD_OK : TD_DIVERGENT;
    td_cmp_result_free(r);
    fflush(stdout);
    return rc;
}
