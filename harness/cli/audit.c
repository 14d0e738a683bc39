/* tapdiff audit: the CLI of audit.h. Audits the MoE router of one tap file
 * (tie rates, margins, tie-break order) or two (plus their selection
 * disagreements, explained or not), prints the Markdown table (or JSON) on
 * stdout, optionally writes the reports, and exits 0 pass / 1 fail (an
 * unexplained selection, or nothing audited) / 2 usage / 3 refused input. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "audit.h"
#include "report.h"
#include "args.h"
#include "cli.h"

static const char *const audit_help =
    "usage: tapdiff audit FILE.h5 [OTHER.h5] [--control C.h5] [--json] [--report DIR] [--qsa]\n"
    "\n"
    "Router tie audit of the MoE layers (taps blk.L.moe_topk with blk.L.moe_probs, or\n"
    "moe_logits when the probabilities have no data), over every token of every step:\n"
    "  exact ties    the scores of ranks K and K+1 are bitwise equal in the stored dtype\n"
    "  bf16/f16 ties they would be equal after rounding both to bf16 / f16\n"
    "  near ties     0 < margin <= max(4 x noise, floor(dtype) x score); noise = max over\n"
    "                experts |control - FILE| at the same step and token (--control), else\n"
    "                0: the precision floor alone (f64 1e-13, f32 2^-20, f16 2^-7, bf16 2^-4)\n"
    "  tie-break     among bitwise-equal scores: lower expert index first, or not\n"
    "  not top-k     the selection is not a top-k of the arm's own scores (explained only\n"
    "                within the near-tie threshold)\n"
    "With OTHER: selection disagreements (the sets of selected experts differ at a token),\n"
    "explained when one arm's set is a top-k of the other arm's scores within that arm's\n"
    "threshold (an exact or near tie at the k-th boundary), unexplained otherwise.\n"
    "The arms (and the control) must have the same steps and tokens (run them pinned).\n"
    "\n"
    "  --control C    control arm measuring the rounding noise (e.g. ref32 next to ref)\n"
    "  --json         print the JSON document (format tapdiff-audit) instead of the table\n"
    "  --report DIR   write DIR/audit.md, audit.json, audit.html (with margin histograms)\n"
    "  --qsa          audit the QSA indexer's selection instead (qwen4exp: blk.L.qsa_sel with\n"
    "                 blk.L.qsa_scores): per sparse token, block ties at the W-th position (a\n"
    "                 cut block counted apart), f16 and near ties, selections that are not a\n"
    "                 top-W of their scores; with OTHER, disagreements explained or not (one\n"
    "                 Markdown table; with --json the document of format tapdiff-audit-qsa;\n"
    "                 --report is for routers only)\n"
    "  --help         this text\n"
    "\n"
    "exit: 0 pass, 1 fail (an unexplained disagreement or selection, or no MoE taps: an\n"
    "      audit that audited nothing does not pass), 2 usage,\n"
    "      3 bad input (unreadable file, no data, different steps/tokens/layers)\n";

int td_cmd_audit(int argc, char **argv) {
    const char *pos[2] = {0}, *control = NULL, *report = NULL;
    int npos = 0, json = 0, qsa = 0;
    td_args p;
    td_args_init(&p, "audit", audit_help, argc, argv);
    for (int k; (k = td_args_next(&p)) != TD_ARG_END;) {
        if (k == TD_ARG_HELP) {
            fputs(audit_help, stdout);
            return TD_OK;
        }
        if (k == TD_ARG_ERROR) return TD_EUSAGE;
        if (k == TD_ARG_POS) {
            if (npos == 2) return td_cli_failf("audit", TD_EUSAGE, "at most two tap files (got '%s' too)", p.arg);
            pos[npos++] = p.arg;
        } else if (td_args_is(&p, "--qsa")) {
            qsa = 1;
        } else if (td_args_is(&p, "--json")) {
            json = 1;
        } else if (td_args_is(&p, "--control")) {
            if (!(control = td_args_value(&p))) return TD_EUSAGE;
        } else if (td_args_is(&p, "--report")) {
            if (!(report = td_args_value(&p))) return TD_EUSAGE;
        } else {
            return td_args_unknown(&p);
        }
    }
    if (npos == 0) return td_cli_failf("audit", TD_EUSAGE, "a tap file is required (see tapdiff audit --help)");
    if ((control && !*control) || (report && !*report))
        return td_cli_failf("audit", TD_EUSAGE, "--control and --report need a non-empty value");

    td_err err = {{0}};
    if (qsa) {
        if (report) return td_cli_failf("audit", TD_EUSAGE, "--qsa prints one table or --json: no --report");
        td_audit_qsa_result *q = NULL;
        int rq = td_audit_qsa(pos[0], pos[1], control, &q, &err);
        if (rq) return td_cli_fail("audit", rq, &err);
        if (json) {
            char *s = td_audit_qsa_json(q);
            puts(s);
            free(s);
        } else {
            td_audit_qsa_print(stdout, q);
        }
        rq = q->verdict;
        if (rq != TD_OK) td_cli_failf("audit", rq, "FAIL: %s", q->reason);
        td_audit_qsa_result_free(q);
        return rq;
    }
    td_audit_result *r = NULL;
    int rc = td_audit(pos[0], pos[1], control, &r, &err);
    if (rc) return td_cli_fail("audit", rc, &err);
    if (json) {
        char *s = td_audit_json(r);
        puts(s);
        free(s);
    } else {
        td_audit_markdown(stdout, r);
    }
    if (report && (rc = td_audit_write_dir(report, r, &err))) {
        td_audit_result_free(r);
        return td_cli_fail("audit", rc, &err);
    }
    rc = r->verdict;
    if (rc != TD_OK) td_cli_failf("audit", rc, "FAIL: %s", r->reason);
    td_audit_result_free(r);
    return rc;
}
