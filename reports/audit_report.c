/* Renderers of a router audit (harness/audit.h): Markdown, JSON and
 * self-contained HTML with an SVG margin histogram, and the report folder. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "audit.h"
#include "report.h"

/* ======================================================================= */
/* Renderers                                                               */
/* ======================================================================= */

static void fmt_rate(char *buf, size_t n, int64_t num, int64_t den) {
    if (den > 0) snprintf(buf, n, "%lld (%.1f%%)", (long long)num, 100.0 * (double)num / (double)den);
    else snprintf(buf, n, "%lld", (long long)num);
}

static void fmt_sel(char *buf, size_t n, const int *sel, int k, int64_t K) {
    size_t len = 0;
    len += (size_t)snprintf(buf + len, n - len, "{");
    for (int j = 0; j < k && len < n; j++) len += (size_t)snprintf(buf + len, n - len, "%s%d", j ? "," : "", sel[j]);
    if (len < n) snprintf(buf + len, n - len, "%s}", K > k ? ",..." : "");
}

static const char *tie_order(const td_audit_layer *L) {
    if (L->n_tb_lower + L->n_tb_higher == 0) return "no exact ties";
    if (L->n_tb_higher == 0) return "lower index first";
    if (L->n_tb_lower == 0) return "higher index first";
    return "mixed";
}

static void fmt_where(char *buf, size_t n, const td_audit_where *w, int64_t K, int two) {
    if (w->step < 0) {
        snprintf(buf, n, "-");
        return;
    }
    char a[160], b[160];
    fmt_sel(a, sizeof a, w->sel_a, w->n_sel, K);
    fmt_sel(b, sizeof b, w->sel_b, w->n_sel, K);
    if (two)
        snprintf(buf, n, "step %lld pos %lld token %lld: A %s B %s, margins %.3g / %.3g", (long long)w->step,
                 (long long)w->pos, (long long)w->token, a, b, w->margin_a, w->margin_b);
    else
        snprintf(buf, n, "step %lld pos %lld token %lld: %s, margin %.3g", (long long)w->step, (long long)w->pos,
                 (long long)w->token, a, w->margin_a);
}

void td_audit_markdown(FILE *f, const td_audit_result *r) {
    fprintf(f, "## Router audit: %s\n\n", r->verdict == TD_OK ? "PASS" : "FAIL");
    fprintf(f, "%s\n\n", r->reason);
    for (int a = 0; a < r->n_arms; a++)
        fprintf(f, "- arm %c: `%s` (backend %s, precision %s, decode %s)\n", 'A' + a, r->arms[a].path,
                *r->arms[a].backend ? r->arms[a].backend : "?", *r->arms[a].precision ? r->arms[a].precision : "?",
                *r->arms[a].decode ? r->arms[a].decode : "?");
    if (r->path_ctrl) fprintf(f, "- control: `%s`\n", r->path_ctrl);
    fprintf(f, "- %s\n- steps: %lld; exact tie = scores of ranks K and K+1 bitwise equal in the stored dtype\n\n",
            r->noise_note, (long long)r->n_steps);
    if (r->arms[0].n_layers == 0) return;

    fprintf(f, "| arm | layer | scores | X/K | tokens | exact ties | bf16 ties | f16 ties | near ties | min margin > 0 | "
               "tie-break (lower/higher) | not top-k (unexplained) |\n");
    fprintf(f, "|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int a = 0; a < r->n_arms; a++)
        for (int i = 0; i < r->arms[a].n_layers; i++) {
            const td_audit_layer *L = &r->arms[a].layers[i];
            char ex[48], bf[48], hf[48], nr[48];
            fmt_rate(ex, sizeof ex, L->n_exact, L->n_tokens);
            fmt_rate(bf, sizeof bf, L->n_tie_bf16, L->n_tokens);
            fmt_rate(hf, sizeof hf, L->n_tie_f16, L->n_tokens);
            fmt_rate(nr, sizeof nr, L->n_near, L->n_tokens);
            fprintf(f, "| %c | %d | %s %s | %lld/%lld | %lld | %s | %s | %s | %s | %.3g | %s (%lld/%lld) | %lld (%lld) |\n",
                    'A' + a, (int)L->layer, L->score_tap, td_dtype_name(L->dtype) ? td_dtype_name(L->dtype) : "?",
                    (long long)L->X, (long long)L->K, (long long)L->n_tokens, ex, bf, hf, nr, L->min_margin,
                    tie_order(L), (long long)L->n_tb_lower, (long long)L->n_tb_higher, (long long)L->n_not_topk,
                    (long long)L->n_not_topk_unexplained);
        }
    for (int a = 0; a < r->n_arms; a++)
        for (int i = 0; i < r->arms[a].n_layers; i++) {
            const td_audit_layer *L = &r->arms[a].layers[i];
            char w[512];
            if (L->first_exact.step >= 0) {
                fmt_where(w, sizeof w, &L->first_exact, L->K, 0);
                fprintf(f, "\n- arm %c layer %d: first exact tie at %s", 'A' + a, (int)L->layer, w);
            }
            if (L->first_unexplained.step >= 0) {
                fmt_where(w, sizeof w, &L->first_unexplained, L->K, 0);
                fprintf(f, "\n- arm %c layer %d: FIRST UNEXPLAINED at %s", 'A' + a, (int)L->layer, w);
            }
        }
    fputc('\n', f);
    if (r->n_arms < 2) return;

    fprintf(f, "\n### Selection disagreements (A vs B)\n\n");
    fprintf(f, "| layer | tokens | disagreements | explained: exact tie | explained: near tie | unexplained | first "
               "unexplained |\n|---|---|---|---|---|---|---|\n");
    for (int i = 0; i < r->n_pairs; i++) {
        const td_audit_pair *p = &r->pairs[i];
        char d[48], w[512];
        fmt_rate(d, sizeof d, p->n_disagree, p->n_tokens);
        fmt_where(w, sizeof w, &p->first_unexplained, r->arms[0].layers[i].K, 1);
        fprintf(f, "| %d | %lld | %s | %lld | %lld | %lld | %s |\n", (int)p->layer, (long long)p->n_tokens, d,
                (long long)p->n_explained_exact, (long long)p->n_explained_near, (long long)p->n_unexplained, w);
    }
}

/* ---- JSON ---------------------------------------------------------------- */

static cJSON *json_num(double v) { return isfinite(v) ? cJSON_CreateNumber(v) : cJSON_CreateNull(); }

static cJSON *json_where(const td_audit_where *w, int two) {
    if (w->step < 0) return cJSON_CreateNull();
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "step", (double)w->step);
    cJSON_AddNumberToObject(o, "row", (double)w->row);
    cJSON_AddNumberToObject(o, "pos", (double)w->pos);
    cJSON_AddNumberToObject(o, "token", (double)w->token);
    cJSON_AddItemToObject(o, "selected_a", cJSON_CreateIntArray(w->sel_a, w->n_sel));
    if (two) cJSON_AddItemToObject(o, "selected_b", cJSON_CreateIntArray(w->sel_b, w->n_sel));
    cJSON_AddItemToObject(o, "margin_a", json_num(w->margin_a));
    cJSON_AddItemToObject(o, "threshold_a", json_num(w->thr_a));
    if (two) {
        cJSON_AddItemToObject(o, "margin_b", json_num(w->margin_b));
        cJSON_AddItemToObject(o, "threshold_b", json_num(w->thr_b));
    }
    cJSON_AddItemToObject(o, "excess", json_num(w->excess));
    return o;
}

/* The head both audit documents open with. */
static cJSON *json_head(const char *format, int verdict, const char *reason) {
    cJSON *doc = cJSON_CreateObject();
    cJSON_AddStringToObject(doc, "format", format);
    cJSON_AddNumberToObject(doc, "version", 1);
    cJSON_AddStringToObject(doc, "verdict", verdict == TD_OK ? "pass" : "fail");
    cJSON_AddNumberToObject(doc, "exit", verdict == TD_OK ? 0 : 1);
    cJSON_AddStringToObject(doc, "reason", reason);
    return doc;
}

char *td_audit_json(const td_audit_result *r) {
    cJSON *doc = json_head("tapdiff-audit", r->verdict, r->reason);
    cJSON_AddNumberToObject(doc, "unexplained", (double)r->n_unexplained);
    cJSON_AddNumberToObject(doc, "steps", (double)r->n_steps);
    cJSON_AddNumberToObject(doc, "near_k", r->near_k);
    cJSON_AddItemToObject(doc, "control", r->path_ctrl ? cJSON_CreateString(r->path_ctrl) : cJSON_CreateNull());
    cJSON_AddStringToObject(doc, "noise", r->noise_note);
    cJSON *arms = cJSON_AddArrayToObject(doc, "arms");
    for (int a = 0; a < r->n_arms; a++) {
        const td_audit_arm *A = &r->arms[a];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "path", A->path);
        cJSON_AddStringToObject(o, "backend", A->backend);
        cJSON_AddStringToObject(o, "precision", A->precision);
        cJSON_AddStringToObject(o, "decode", A->decode);
        cJSON *ls = cJSON_AddArrayToObject(o, "layers");
        for (int i = 0; i < A->n_layers; i++) {
            const td_audit_layer *L = &A->layers[i];
            cJSON *l = cJSON_CreateObject();
            cJSON_AddNumberToObject(l, "layer", L->layer);
            cJSON_AddStringToObject(l, "score_tap", L->score_tap);
            cJSON_AddStringToObject(l, "dtype", td_dtype_name(L->dtype) ? td_dtype_name(L->dtype) : "?");
            cJSON_AddNumberToObject(l, "experts", (double)L->X);
            cJSON_AddNumberToObject(l, "k", (double)L->K);
            cJSON_AddNumberToObject(l, "tokens", (double)L->n_tokens);
            cJSON_AddNumberToObject(l, "nonfinite", (double)L->n_nonfinite);
            cJSON_AddNumberToObject(l, "exact_ties", (double)L->n_exact);
            cJSON_AddItemToObject(l, "exact_tie_rate",
                                  json_num(L->n_tokens ? (double)L->n_exact / (double)L->n_tokens : NAN));
            cJSON_AddNumberToObject(l, "bf16_ties", (double)L->n_tie_bf16);
            cJSON_AddNumberToObject(l, "f16_ties", (double)L->n_tie_f16);
            cJSON_AddNumberToObject(l, "near_ties", (double)L->n_near);
            cJSON_AddItemToObject(l, "near_tie_rate",
                                  json_num(L->n_tokens ? (double)L->n_near / (double)L->n_tokens : NAN));
            cJSON_AddItemToObject(l, "min_margin", json_num(L->min_margin));
            cJSON_AddItemToObject(l, "max_threshold", json_num(L->max_thr));
            cJSON *tb = cJSON_AddObjectToObject(l, "tie_break");
            cJSON_AddStringToObject(tb, "order", tie_order(L));
            cJSON_AddNumberToObject(tb, "lower_first", (double)L->n_tb_lower);
            cJSON_AddNumberToObject(tb, "higher_first", (double)L->n_tb_higher);
            cJSON_AddNumberToObject(l, "not_topk", (double)L->n_not_topk);
            cJSON_AddNumberToObject(l, "not_topk_unexplained", (double)L->n_not_topk_unexplained);
            cJSON *h = cJSON_AddObjectToObject(l, "margin_hist");
            cJSON_AddNumberToObject(h, "log10_lo", TD_AUDIT_HIST_LO);
            cJSON_AddNumberToObject(h, "bin_width", TD_AUDIT_HIST_W);
            cJSON *c = cJSON_AddArrayToObject(h, "counts");
            for (int b = 0; b < TD_AUDIT_HIST_BINS; b++) cJSON_AddItemToArray(c, cJSON_CreateNumber((double)L->hist[b]));
            cJSON_AddItemToObject(l, "first_exact_tie", json_where(&L->first_exact, 0));
            cJSON_AddItemToObject(l, "first_unexplained", json_where(&L->first_unexplained, 0));
            cJSON_AddItemToArray(ls, l);
        }
        cJSON_AddItemToArray(arms, o);
    }
    if (r->n_arms == 2) {
        cJSON *ps = cJSON_AddArrayToObject(doc, "disagreements");
        for (int i = 0; i < r->n_pairs; i++) {
            const td_audit_pair *p = &r->pairs[i];
            cJSON *o = cJSON_CreateObject();
            cJSON_AddNumberToObject(o, "layer", p->layer);
            cJSON_AddNumberToObject(o, "tokens", (double)p->n_tokens);
            cJSON_AddNumberToObject(o, "disagreements", (double)p->n_disagree);
            cJSON_AddNumberToObject(o, "explained", (double)(p->n_explained_exact + p->n_explained_near));
            cJSON_AddNumberToObject(o, "explained_exact", (double)p->n_explained_exact);
            cJSON_AddNumberToObject(o, "explained_near", (double)p->n_explained_near);
            cJSON_AddNumberToObject(o, "unexplained", (double)p->n_unexplained);
            cJSON_AddItemToObject(o, "first_explained", json_where(&p->first_explained, 1));
            cJSON_AddItemToObject(o, "first_unexplained", json_where(&p->first_unexplained, 1));
            cJSON_AddItemToArray(ps, o);
        }
    }
    char *s = cJSON_Print(doc);
    cJSON_Delete(doc);
    TD_ASSERT(s);
    return s;
}

char *td_audit_qsa_json(const td_audit_qsa_result *r) {
    cJSON *doc = json_head("tapdiff-audit-qsa", r->verdict, r->reason);
    cJSON_AddNumberToObject(doc, "files", r->n_arms);
    cJSON_AddNumberToObject(doc, "steps", (double)r->n_steps);
    cJSON_AddNumberToObject(doc, "unexplained", (double)r->n_unexplained);
    cJSON *ls = cJSON_AddArrayToObject(doc, "layers");
    for (int i = 0; i < r->n_layers; i++) {
        const td_audit_qsa_layer *L = &r->layers[i];
        cJSON *l = cJSON_CreateObject();
        cJSON_AddNumberToObject(l, "layer", L->layer);
        cJSON_AddNumberToObject(l, "r", (double)L->r);
        cJSON_AddNumberToObject(l, "W", (double)L->W);
        cJSON_AddNumberToObject(l, "tokens", (double)L->n_tokens);
        cJSON_AddNumberToObject(l, "sparse", (double)L->n_sparse);
        cJSON_AddNumberToObject(l, "cut_block", (double)L->n_cut);
        cJSON_AddNumberToObject(l, "exact_block_ties", (double)L->n_exact);
        cJSON_AddNumberToObject(l, "f16_ties", (double)L->n_tie_f16);
        cJSON_AddNumberToObject(l, "near_ties", (double)L->n_near);
        cJSON_AddNumberToObject(l, "not_topw", (double)L->n_not_topw);
        cJSON_AddNumberToObject(l, "not_topw_unexplained", (double)L->n_not_topw_unexplained);
        if (r->n_arms == 2) {
            cJSON_AddNumberToObject(l, "disagreements", (double)L->n_disagree);
            cJSON_AddNumberToObject(l, "explained_exact", (double)L->n_explained_exact);
            cJSON_AddNumberToObject(l, "explained_near", (double)L->n_explained_near);
            cJSON_AddNumberToObject(l, "unexplained", (double)L->n_unexplained);
        }
        cJSON_AddItemToObject(l, "first_unexplained", json_where(&L->first_unexplained, r->n_arms == 2));
        cJSON_AddItemToArray(ls, l);
    }
    char *s = cJSON_Print(doc);
    cJSON_Delete(doc);
    TD_ASSERT(s);
    return s;
}

/* ---- HTML ------------------------------------------------------------------ */


/* One bar per histogram bin, the exact ties as their own bar at the left,
 * the layer's largest near-tie threshold as a dashed line. */
static void html_hist(FILE *f, const td_audit_layer *L) {
    const int n_bars = TD_AUDIT_HIST_BINS + 1; // [exact] + bins
    const double W = 560, H = 170, x0 = 40, y0 = 20, pw = W - x0 - 10, ph = H - y0 - 40;
    const double bw = pw / n_bars;
    int64_t maxc = L->n_exact;
    for (int b = 0; b < TD_AUDIT_HIST_BINS; b++) maxc = L->hist[b] > maxc ? L->hist[b] : maxc;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\">\n",
            W, H, W, H);
    fprintf(f, "<text x=\"%.0f\" y=\"14\" font-size=\"12\">layer %d: log10 margin s_K - s_K+1 (%lld tokens)</text>\n",
            x0, (int)L->layer, (long long)L->n_tokens);
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#444\"/>\n", x0, y0 + ph, x0 + pw, y0 + ph);
    for (int i = 0; i < n_bars; i++) {
        const int64_t c = i == 0 ? L->n_exact : L->hist[i - 1];
        if (!c || !maxc) continue;
        const double h = ph * (double)c / (double)maxc;
        fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\"><title>%lld</title></rect>\n",
                x0 + i * bw + 1, y0 + ph - h, bw - 2, h, i == 0 ? "#c0392b" : "#2c7fb8", (long long)c);
    }
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" fill=\"#c0392b\">tie</text>\n", x0, y0 + ph + 12);
    for (int d = (int)TD_AUDIT_HIST_LO; d <= (int)(TD_AUDIT_HIST_LO + (TD_AUDIT_HIST_BINS - 2) * TD_AUDIT_HIST_W); d += 4) {
        const double x = x0 + bw * (2 + (d - TD_AUDIT_HIST_LO) / TD_AUDIT_HIST_W);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" text-anchor=\"middle\">1e%d</text>\n", x, y0 + ph + 12, d);
    }
    if (L->max_thr > 0 && isfinite(L->max_thr)) {
        double b = 1 + (log10(L->max_thr) - TD_AUDIT_HIST_LO) / TD_AUDIT_HIST_W;
        b = b < 1 ? 1 : (b > n_bars - 1 ? n_bars - 1 : b);
        const double x = x0 + bw * (1 + b);
        fprintf(f,
                "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e67e22\" stroke-dasharray=\"4 3\"/>\n"
                "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" fill=\"#e67e22\" text-anchor=\"end\">near-tie "
                "threshold (max %.2g)</text>\n",
                x, y0, x, y0 + ph, x - 3, y0 + 10, L->max_thr);
    }
    fprintf(f, "<text x=\"%.0f\" y=\"%.0f\" font-size=\"10\">counts per half decade; red: exact ties</text>\n", x0,
            H - 6);
    fprintf(f, "</svg>\n");
}

void td_audit_html(FILE *f, const td_audit_result *r) {
    fprintf(f, "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>tapdiff router audit</title>\n"
               "<style>body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse}"
               "td,th{border:1px solid #bbb;padding:2px 6px;font-size:13px}.pass{color:#1a7f37}.fail{color:#c0392b}"
               "</style></head><body>\n");
    fprintf(f, "<h1>Router audit: <span class=\"%s\">%s</span></h1>\n<p>", r->verdict == TD_OK ? "pass" : "fail",
            r->verdict == TD_OK ? "PASS" : "FAIL");
    td_report_html_escape(f, r->reason);
    fprintf(f, "</p>\n<ul>\n");
    for (int a = 0; a < r->n_arms; a++) {
        fprintf(f, "<li>arm %c: <code>", 'A' + a);
        td_report_html_escape(f, r->arms[a].path);
        fprintf(f, "</code> (");
        td_report_html_escape(f, r->arms[a].backend);
        fprintf(f, ", ");
        td_report_html_escape(f, r->arms[a].precision);
        fprintf(f, ", decode ");
        td_report_html_escape(f, r->arms[a].decode);
        fprintf(f, ")</li>\n");
    }
    if (r->path_ctrl) {
        fprintf(f, "<li>control: <code>");
        td_report_html_escape(f, r->path_ctrl);
        fprintf(f, "</code></li>\n");
    }
    fprintf(f, "<li>");
    td_report_html_escape(f, r->noise_note);
    fprintf(f, "</li>\n</ul>\n");
    if (r->arms[0].n_layers) {
        fprintf(f, "<table><tr><th>arm</th><th>layer</th><th>scores</th><th>X/K</th><th>tokens</th><th>exact ties</th>"
                   "<th>bf16 ties</th><th>f16 ties</th><th>near ties</th><th>min margin</th><th>tie-break</th>"
                   "<th>not top-k (unexplained)</th></tr>\n");
        for (int a = 0; a < r->n_arms; a++)
            for (int i = 0; i < r->arms[a].n_layers; i++) {
                const td_audit_layer *L = &r->arms[a].layers[i];
                char ex[48], bf[48], hf[48], nr[48];
                fmt_rate(ex, sizeof ex, L->n_exact, L->n_tokens);
                fmt_rate(bf, sizeof bf, L->n_tie_bf16, L->n_tokens);
                fmt_rate(hf, sizeof hf, L->n_tie_f16, L->n_tokens);
                fmt_rate(nr, sizeof nr, L->n_near, L->n_tokens);
                fprintf(f, "<tr><td>%c</td><td>%d</td><td>%s %s</td><td>%lld/%lld</td><td>%lld</td><td>%s</td><td>%s</td>"
                           "<td>%s</td><td>%s</td><td>%.3g</td><td>%s (%lld/%lld)</td><td>%lld (%lld)</td></tr>\n",
                        'A' + a, (int)L->layer, L->score_tap, td_dtype_name(L->dtype) ? td_dtype_name(L->dtype) : "?",
                        (long long)L->X, (long long)L->K, (long long)L->n_tokens, ex, bf, hf, nr, L->min_margin,
                        tie_order(L), (long long)L->n_tb_lower, (long long)L->n_tb_higher, (long long)L->n_not_topk,
                        (long long)L->n_not_topk_unexplained);
            }
        fprintf(f, "</table>\n");
    }
    if (r->n_arms == 2) {
        fprintf(f, "<h2>Selection disagreements (A vs B)</h2>\n<table><tr><th>layer</th><th>tokens</th>"
                   "<th>disagreements</th><th>explained: exact tie</th><th>explained: near tie</th>"
                   "<th>unexplained</th><th>first unexplained</th></tr>\n");
        for (int i = 0; i < r->n_pairs; i++) {
            const td_audit_pair *p = &r->pairs[i];
            char w[512];
            fmt_where(w, sizeof w, &p->first_unexplained, r->arms[0].layers[i].K, 1);
            fprintf(f, "<tr><td>%d</td><td>%lld</td><td>%lld</td><td>%lld</td><td>%lld</td><td>%lld</td><td>", (int)p->layer,
                    (long long)p->n_tokens, (long long)p->n_disagree, (long long)p->n_explained_exact,
                    (long long)p->n_explained_near, (long long)p->n_unexplained);
            td_report_html_escape(f, w);
            fprintf(f, "</td></tr>\n");
        }
        fprintf(f, "</table>\n");
    }
    for (int a = 0; a < r->n_arms; a++) {
        if (!r->arms[a].n_layers) continue;
        fprintf(f, "<h2>Margin distribution, arm %c</h2>\n", 'A' + a);
        for (int i = 0; i < r->arms[a].n_layers; i++) html_hist(f, &r->arms[a].layers[i]);
    }
    fprintf(f, "</body></html>\n");
}

/* ---- Report directory ----------------------------------------------------- */


static int write_one(const char *dir, const char *name, const td_audit_result *r, int kind, td_err *err) {
    const size_t n = strlen(dir) + strlen(name) + 2;
    char *path = td_xmalloc(n);
    snprintf(path, n, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    int rc = TD_OK;
    if (!f) {
        rc = td_err_set(err, TD_EOUTPUT, "%s: cannot write: %s", path, strerror(errno));
    } else {
        if (kind == 0) td_audit_markdown(f, r);
        else if (kind == 1) {
            char *s = td_audit_json(r);
            fputs(s, f);
            fputc('\n', f);
            free(s);
        } else td_audit_html(f, r);
        if (ferror(f) | fclose(f)) rc = td_err_set(err, TD_EOUTPUT, "%s: write failed", path);
    }
    free(path);
    return rc;
}

int td_audit_write_dir(const char *dir, const td_audit_result *r, td_err *err) {
    int rc = td_mkdir_p(dir, err);
    if (!rc) rc = write_one(dir, "audit.md", r, 0, err);
    if (!rc) rc = write_one(dir, "audit.json", r, 1, err);
    if (!rc) rc = write_one(dir, "audit.html", r, 2, err);
    return rc;
}
