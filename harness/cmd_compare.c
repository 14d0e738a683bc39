/* tapdiff compare: the CLI of compare.h. Compares two tap files, prints the
 * one-screen verdict (or JSON) on stdout, optionally writes the reports, and
 * exits 0 conformant / 1 divergent / 2 usage / 3 refused (bad or
 * incompatible input). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "compare.h"
#include "report.h"

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
    "  --allow-token-mismatch  compare arms that consumed different tokens (the mismatch is then\n"
    "                     reported as an integer mismatch at inp.tokens instead of refused)\n"
    "  --report DIR       write DIR/report.md, report.json, report.html\n"
    "  --json             print the JSON document instead of the text verdict\n"
    "\n"
    "exit: 0 conformant, 1 divergent (or nothing/not everything compared), 2 usage,\n"
    "      3 refused: unreadable file, different models, different tokens, incompatible shapes\n";

// The value of option argv[*i], advancing *i; NULL (after a message) when missing.
static const char *value(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        td_cli_failf("compare", TD_EUSAGE, "%s needs a value", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

static int parse_double(const char *s, double *out) {
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end || !(v > 0)) return -1;
    *out = v;
    return 0;
}

int td_cmd_compare(int argc, char **argv) {
    td_cmp_options o = td_cmp_options_default();
    const char *pos[2] = {0};
    int npos = 0, json = 0;
    const char *report = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(usage_text, stdout);
            return TD_OK;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "--allow-token-mismatch")) {
            o.allow_token_mismatch = 1;
        } else if (!strcmp(a, "--control") || !strcmp(a, "--control-a") || !strcmp(a, "--control-b") ||
                   !strcmp(a, "--filter") || !strcmp(a, "--report")) {
            if (!(v = value(argc, argv, &i))) return TD_EUSAGE;
            if (!strcmp(a, "--control")) o.control = v;
            if (!strcmp(a, "--control-a")) o.control_a = v;
            if (!strcmp(a, "--control-b")) o.control_b = v;
            if (!strcmp(a, "--filter")) o.filter = v;
            if (!strcmp(a, "--report")) report = v;
        } else if (!strcmp(a, "--k") || !strcmp(a, "--floor") || !strcmp(a, "--topk")) {
            double d;
            if (!(v = value(argc, argv, &i))) return TD_EUSAGE;
            if (parse_double(v, &d))
                return td_cli_failf("compare", TD_EUSAGE, "%s wants a positive number, got '%s'", a, v);
            if (!strcmp(a, "--k")) o.k = d;
            if (!strcmp(a, "--floor")) o.floor = d;
            if (!strcmp(a, "--topk")) {
                if (d != (int)d || d > TD_CMP_TOPK_MAX)
                    return td_cli_failf("compare", TD_EUSAGE, "--topk wants an integer 1..%d, got '%s'",
                                        TD_CMP_TOPK_MAX, v);
                o.topk = (int)d;
            }
        } else if (a[0] == '-' && a[1]) {
            td_cli_failf("compare", TD_EUSAGE, "unknown option '%s'", a);
            fputs(usage_text, stderr);
            return TD_EUSAGE;
        } else {
            if (npos == 2) return td_cli_failf("compare", TD_EUSAGE, "too many files: '%s' (want A.h5 B.h5)", a);
            pos[npos++] = a;
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

    td_cmp_result *r;
    td_err err = {{0}};
    int st = td_compare(pos[0], pos[1], &o, &r, &err);
    if (st) return td_cli_fail("compare", st, &err);
    if (json) {
        char *js = td_report_json(r);
        fputs(js, stdout);
        fputc('\n', stdout);
        free(js);
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
