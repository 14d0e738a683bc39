/* tapdiff reports: renderers of a comparison (harness/compare.h) for people
 * and tools. The one-screen text verdict (what `tapdiff compare` prints),
 * Markdown for a PR comment, JSON for tools (schema in json.c), and one
 * self-contained HTML file with an inline SVG plot (no scripts, no external
 * resources). Renderers only read the result; they write to the stream they
 * are given and never print elsewhere. */
#ifndef TD_REPORT_H
#define TD_REPORT_H

#include <stdio.h>

#include "audit.h"
#include "compare.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Writes s with <, >, & and " escaped for HTML text and attributes. */
void td_report_html_escape(FILE *f, const char *s);

/* The verdict on one screen: CONFORMANT / DIVERGENT, the arms and budget,
 * the first divergent tap (step, kind, error, budget ratio, growth, where it
 * diverges most, why it is not rounding) and the 3 taps before it. */
void td_report_text(FILE *f, const td_cmp_result *r);
void td_report_markdown(FILE *f, const td_cmp_result *r);
/* The JSON document (format "tapdiff-compare", version 1), printed with
 * indentation; caller frees. */
char *td_report_json(const td_cmp_result *r);
/* The same bytes written to f as they are made, one tap row at a time
 * (memory does not grow with the number of compared taps); write errors are
 * left in ferror(f). */
void td_report_json_write(FILE *f, const td_cmp_result *r);
void td_report_html(FILE *f, const td_cmp_result *r);
/* Creates dir (and missing parents) and writes report.md, report.json and
 * report.html into it. TD_EINPUT with the path when it cannot. */
int td_report_write_dir(const char *dir, const td_cmp_result *r, td_err *err);

/* The `n` taps with the largest budget ratio (integer mismatches and
 * non-finite ones first), as indices into r->taps; returns how many. Shared
 * by the renderers so every format lists the same taps. */
int td_report_worst(const td_cmp_result *r, int64_t *idx, int n);

/* ---- Router audit (harness/audit.h) -------------------------------------
 * Markdown: the verdict, the arms and noise estimator, one table of tie
 * statistics per (arm, layer), and with two files one table of selection
 * disagreements per layer. */
void td_audit_markdown(FILE *f, const td_audit_result *r);
/* JSON document, format "tapdiff-audit" version 1, indented; caller frees. */
char *td_audit_json(const td_audit_result *r);
/* The QSA selection audit (td_audit_qsa) as JSON, format "tapdiff-audit-qsa"
 * version 1, indented: the table's counts per layer; caller frees. */
char *td_audit_qsa_json(const td_audit_qsa_result *r);
/* Self-contained HTML (no scripts, no external resources): the tables and,
 * per arm and layer, an inline SVG histogram of log10 margins with the exact
 * ties as their own bar and the largest threshold marked. */
void td_audit_html(FILE *f, const td_audit_result *r);
/* Creates dir (and missing parents) and writes audit.md, audit.json and
 * audit.html. TD_EINPUT naming the path when it cannot. */
int td_audit_write_dir(const char *dir, const td_audit_result *r, td_err *err);

#ifdef __cplusplus
}
#endif
#endif
