/* tapdiff reports/: one self-contained HTML file (inline CSS and SVG, no
 * script, no external resource) that people look at first: the verdict, a
 * log-scale plot of the error per tap in execution order with the control
 * arm's error and the budget beside it, layers and steps marked, the first
 * divergent tap highlighted; then the first divergent tap, the worst taps,
 * decode-vs-prefill and the notes. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "report_internal.h"

void td_report_html_escape(FILE *f, const char *s) {
    for (; *s; s++) {
        switch (*s) {
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '&': fputs("&amp;", f); break;
        case '"': fputs("&quot;", f); break;
        default: fputc(*s, f);
        }
    }
}

/* ---------------------------------------------------------------- plot */

#define PW 1100
#define PH 380
#define ML 64
#define MR 16
#define MT 34
#define MB 46
/* Above this many plotted taps, lines are drawn per pixel column (max). */
#define MAX_POINTS 900

typedef struct plot {
    double ymin, ymax; // log10 range
    int64_t n;
} plot;

static double px(const plot *p, int64_t i) {
    double w = PW - ML - MR;
    return p->n > 1 ? ML + w * (double)i / (double)(p->n - 1) : ML + w / 2;
}

static double py(const plot *p, double v) {
    double h = PH - MT - MB;
    double l = v > 0 && isfinite(v) ? log10(v) : p->ymin;
    if (l < p->ymin) l = p->ymin;
    if (l > p->ymax) l = p->ymax;
    return MT + h * (p->ymax - l) / (p->ymax - p->ymin);
}

static int plotted(const td_cmp_tap *t) {
    return t->method != TD_CMP_INTEGER && !isnan(t->err);
}

static void range(const td_cmp_result *r, plot *p) {
    double lo = INFINITY, hi = -INFINITY;
    for (int64_t i = 0; i < r->n_taps; i++) {
        const td_cmp_tap *t = td_cmp_tap_at(r, i);
        if (!plotted(t)) continue;
        double v[3] = {t->err, t->err_ctrl, t->budget};
        for (int k = 0; k < 3; k++)
            if (v[k] > 0 && isfinite(v[k])) {
                if (v[k] < lo) lo = v[k];
                if (v[k] > hi) hi = v[k];
            }
    }
    if (!isfinite(lo)) lo = 1e-16, hi = 1;
    p->ymin = floor(log10(lo));
    p->ymax = ceil(log10(hi));
    if (p->ymin < -18) p->ymin = -18;
    if (p->ymax > 3) p->ymax = 3;
    if (p->ymax <= p->ymin) p->ymax = p->ymin + 1;
    p->n = r->n_taps;
}

// One series as an SVG path: which = 0 err, 1 control, 2 budget. With many
// taps, the maximum per pixel column.
static void series(FILE *f, const td_cmp_result *r, const plot *p, int which, const char *style) {
    int64_t n = r->n_taps;
    int bins = n > MAX_POINTS ? PW - ML - MR : 0;
    fprintf(f, "<path %s d=\"", style);
    int pen = 0;
    if (!bins) {
        for (int64_t i = 0; i < n; i++) {
            const td_cmp_tap *t = td_cmp_tap_at(r, i);
            double v = which == 0 ? t->err : which == 1 ? t->err_ctrl : t->budget;
            if (!plotted(t) || isnan(v)) continue;
            fprintf(f, "%s%.1f %.1f ", pen ? "L" : "M", px(p, i), py(p, v));
            pen = 1;
        }
    } else {
        double *mx = td_xmalloc(sizeof *mx * (size_t)bins);
        for (int b = 0; b < bins; b++) mx[b] = NAN;
        for (int64_t i = 0; i < n; i++) {
            const td_cmp_tap *t = td_cmp_tap_at(r, i);
            double v = which == 0 ? t->err : which == 1 ? t->err_ctrl : t->budget;
            if (!plotted(t) || isnan(v)) continue;
            int b = (int)((double)i * (double)(bins - 1) / (double)(n - 1));
            if (isnan(mx[b]) || v > mx[b]) mx[b] = v;
        }
        for (int b = 0; b < bins; b++) {
            if (isnan(mx[b])) continue;
            fprintf(f, "%s%d %.1f ", pen ? "L" : "M", ML + b, py(p, mx[b]));
            pen = 1;
        }
        free(mx);
    }
    fprintf(f, "\"/>\n");
}

static void svg_plot(FILE *f, const td_cmp_result *r) {
    plot p;
    range(r, &p);
    double x0 = ML, x1 = PW - MR, y0 = MT, y1 = PH - MB;
    fprintf(f,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" role=\"img\">\n"
            "<title>log10 relative L2 error per tap in execution order</title>\n"
            "<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"#ffffff\"/>\n",
            PW, PH, PW, PH, PW, PH);
    // decades
    for (int d = (int)p.ymin; d <= (int)p.ymax; d++) {
        double y = py(&p, pow(10.0, d));
        fprintf(f, "<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"#e5e5e5\"/>", x0, y, x1, y);
        fprintf(f, "<text x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\" fill=\"#555\">1e%d</text>\n", x0 - 6, y + 4, d);
    }
    // steps and layers
    int64_t n_steps = 0;
    for (int64_t i = 0; i < r->n_taps; i++)
        if (i == 0 || td_cmp_tap_at(r, i)->step != td_cmp_tap_at(r, i - 1)->step) n_steps++;
    int64_t every = n_steps > 30 ? (n_steps + 29) / 30 : 1, k = 0;
    int64_t label_step = r->first >= 0 ? td_cmp_tap_at(r, r->first)->step : (r->n_taps ? td_cmp_tap_at(r, 0)->step : -1);
    int64_t n_layers = 0;
    for (int64_t i = 0; i < r->n_taps; i++)
        if (td_cmp_tap_at(r, i)->layer + 1 > n_layers) n_layers = td_cmp_tap_at(r, i)->layer + 1;
    int64_t lev = n_layers > 24 ? (n_layers + 23) / 24 : 1;
    for (int64_t i = 0; i < r->n_taps; i++) {
        const td_cmp_tap *t = td_cmp_tap_at(r, i);
        double x = px(&p, i);
        if (i == 0 || t->step != td_cmp_tap_at(r, i - 1)->step) {
            if (i) fprintf(f, "<line x1=\"%.1f\" y1=\"%.0f\" x2=\"%.1f\" y2=\"%.0f\" stroke=\"#888\"/>", x, y0, x, y1);
            if (k++ % every == 0)
                fprintf(f, "<text x=\"%.1f\" y=\"%.0f\" fill=\"#333\">%s%lld</text>\n", x + 2, y1 + 16,
                        t->kind == TD_STEP_PREFILL ? "prefill " : "d", (long long)t->step);
        }
        if (t->layer >= 0 && (i == 0 || t->layer != td_cmp_tap_at(r, i - 1)->layer || t->step != td_cmp_tap_at(r, i - 1)->step)) {
            fprintf(f, "<line x1=\"%.1f\" y1=\"%.0f\" x2=\"%.1f\" y2=\"%.0f\" stroke=\"#bbb\"/>", x, y0, x, y0 + 6);
            if (t->step == label_step && t->layer % lev == 0)
                fprintf(f, "<text x=\"%.1f\" y=\"%.0f\" fill=\"#777\" font-size=\"9\">L%d</text>\n", x + 1, y0 - 3,
                        t->layer);
        }
    }
    fprintf(f, "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" stroke=\"#444\"/>\n", x0, y0,
            x1 - x0, y1 - y0);
    series(f, r, &p, 2, "fill=\"none\" stroke=\"#e69f00\" stroke-width=\"1.2\" stroke-dasharray=\"5 3\"");
    series(f, r, &p, 1, "fill=\"none\" stroke=\"#999999\" stroke-width=\"1.2\"");
    series(f, r, &p, 0, "fill=\"none\" stroke=\"#0072b2\" stroke-width=\"1.5\"");
    // failing taps (bounded count), integer mismatches at the top
    int marks = 0;
    for (int64_t i = 0; i < r->n_taps && marks < 2000; i++) {
        const td_cmp_tap *t = td_cmp_tap_at(r, i);
        if (t->fail == TD_CMPF_OK) continue;
        marks++;
        double y = plotted(t) && t->fail != TD_CMPF_INTEGER ? py(&p, t->err) : y0 + 4;
        fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"2.5\" fill=\"#d55e00\"/>", px(&p, i), y);
    }
    if (r->first >= 0) {
        const td_cmp_tap *t = td_cmp_tap_at(r, r->first);
        double x = px(&p, r->first);
        double y = plotted(t) && t->fail != TD_CMPF_INTEGER ? py(&p, t->err) : y0 + 4;
        fprintf(f,
                "\n<line x1=\"%.1f\" y1=\"%.0f\" x2=\"%.1f\" y2=\"%.0f\" stroke=\"#d00000\" stroke-dasharray=\"3 3\"/>"
                "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"7\" fill=\"none\" stroke=\"#d00000\" stroke-width=\"2.5\"/>",
                x, y0, x, y1, x, y);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" fill=\"#d00000\" font-weight=\"bold\" text-anchor=\"%s\">first divergent: ",
                x > PW / 2 ? x - 10 : x + 10, y < y0 + 20 ? y + 20 : y - 10, x > PW / 2 ? "end" : "start");
        td_report_html_escape(f, t->name);
        fprintf(f, " (step %lld)</text>\n", (long long)t->step);
    }
    // legend
    fprintf(f,
            "<g font-size=\"11\"><line x1=\"%d\" y1=\"14\" x2=\"%d\" y2=\"14\" stroke=\"#0072b2\" stroke-width=\"2\"/>"
            "<text x=\"%d\" y=\"18\">err(A, B)</text>"
            "<line x1=\"%d\" y1=\"14\" x2=\"%d\" y2=\"14\" stroke=\"#999\" stroke-width=\"2\"/>"
            "<text x=\"%d\" y=\"18\">control err%s</text>"
            "<line x1=\"%d\" y1=\"14\" x2=\"%d\" y2=\"14\" stroke=\"#e69f00\" stroke-dasharray=\"5 3\" stroke-width=\"2\"/>"
            "<text x=\"%d\" y=\"18\">budget max(k*ctrl, floor)</text>"
            "<circle cx=\"%d\" cy=\"14\" r=\"3\" fill=\"#d55e00\"/><text x=\"%d\" y=\"18\">over budget / mismatch</text>"
            "<text x=\"%d\" y=\"%d\" fill=\"#333\">taps in execution order (steps marked below, layers above)</text></g>\n",
            ML, ML + 24, ML + 28, ML + 110, ML + 134, ML + 138, r->has_control ? "" : " (none)", ML + 250, ML + 274,
            ML + 278, ML + 440, ML + 448, ML, PH - 8);
    fprintf(f, "</svg>\n");
}

/* -------------------------------------------------------------- tables */

static void tap_tr(FILE *f, const td_cmp_result *r, const td_cmp_tap *t, int first) {
    char e[32], c[32], b[32], q[32], g[32], s[96], why[900];
    fprintf(f, "<tr%s><td>%lld</td><td>%s</td><td><code>", first ? " class=\"first\"" : "", (long long)t->step,
            rp_kind(t->kind));
    td_report_html_escape(f, t->name);
    fprintf(f, "</code></td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td>",
            rp_shape(s, sizeof s, t), td_cmp_method_name(t->method), rp_val(e, sizeof e, t->err),
            rp_num(c, sizeof c, t->err_ctrl), rp_budget(b, sizeof b, t), rp_val(q, sizeof q, t->ratio),
            rp_num(g, sizeof g, t->growth), t->fail ? td_cmp_fail_name(t->fail) : "ok");
    fprintf(f, "<td class=\"why\">");
    td_report_html_escape(f, rp_why(why, sizeof why, r, t));
    fprintf(f, "</td></tr>\n");
}

static void table_head(FILE *f) {
    fprintf(f, "<table>\n<tr><th>step</th><th>kind</th><th>tap</th><th>shape</th><th>method</th><th>err</th>"
               "<th>control</th><th>budget</th><th>r</th><th>growth</th><th>result</th><th>why</th></tr>\n");
}

void td_report_html(FILE *f, const td_cmp_result *r) {
    int ok = r->verdict == TD_OK;
    char e[32], c[32], q[32], w[96], why[900];
    fprintf(f,
            "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            "<title>tapdiff compare: %s</title>\n"
            "<style>\n"
            "body{font-family:sans-serif;margin:24px;color:#222;background:#fff}\n"
            "h1 .ok{color:#1a7f37} h1 .bad{color:#cf222e}\n"
            "table{border-collapse:collapse;font-size:13px;margin:8px 0}\n"
            "td,th{border:1px solid #d0d7de;padding:3px 6px;text-align:left;vertical-align:top}\n"
            "th{background:#f6f8fa} tr.first{background:#ffebe9} td.why{font-size:12px;color:#444;max-width:520px}\n"
            "code{font-family:monospace} .note{color:#555} svg{border:1px solid #eee}\n"
            "</style>\n</head>\n<body>\n",
            ok ? "CONFORMANT" : "DIVERGENT");
    fprintf(f, "<h1>tapdiff compare: <span class=\"%s\">%s</span></h1>\n<p>", ok ? "ok" : "bad",
            ok ? "CONFORMANT" : "DIVERGENT");
    td_report_html_escape(f, r->reason);
    fprintf(f, "</p>\n<table>\n<tr><th></th><th>file</th><th>backend</th><th>precision</th></tr>\n");
    fprintf(f, "<tr><td>A (reference)</td><td><code>");
    td_report_html_escape(f, r->path_a);
    fprintf(f, "</code></td><td>");
    td_report_html_escape(f, r->backend_a);
    fprintf(f, "</td><td>");
    td_report_html_escape(f, r->precision_a);
    fprintf(f, "</td></tr>\n<tr><td>B (candidate)</td><td><code>");
    td_report_html_escape(f, r->path_b);
    fprintf(f, "</code></td><td>");
    td_report_html_escape(f, r->backend_b);
    fprintf(f, "</td><td>");
    td_report_html_escape(f, r->precision_b);
    fprintf(f, "</td></tr>\n<tr><td>control</td><td>");
    if (r->has_control) {
        fprintf(f, "err(<code>");
        td_report_html_escape(f, r->path_ctrl_a);
        fprintf(f, "</code>, <code>");
        td_report_html_escape(f, r->path_ctrl_b);
        fprintf(f, "</code>)</td><td>");
        td_report_html_escape(f, r->backend_ctrl_a);
        fprintf(f, " vs ");
        td_report_html_escape(f, r->backend_ctrl_b);
        fprintf(f, "</td><td></td></tr>\n");
    } else {
        fprintf(f, "none: <b>the budget is the floor only</b></td><td></td><td></td></tr>\n");
    }
    fprintf(f, "</table>\n<p>Budget <code>r = err / max(k &middot; err_ctrl, floor)</code>, k = %g; ", r->k);
    if (r->floor_override > 0) {
        fprintf(f, "floor %.3g (", r->floor_override);
        td_report_html_escape(f, r->floor_note[0] ? r->floor_note : "set by option");
        fprintf(f, ").");
    } else {
        fprintf(f, "floor by B's dtype: f64 %.3g, f32 %.3g, f16 %.3g, bf16 %.3g.", td_cmp_floor(TD_DT_F64),
                td_cmp_floor(TD_DT_F32), td_cmp_floor(TD_DT_F16), td_cmp_floor(TD_DT_BF16));
    }
    fprintf(f, " Compared %lld taps (%lld data, %lld fingerprint-only, %lld integer); missing %lld in A, %lld in B.</p>\n",
            (long long)r->n_taps, (long long)r->n_data, (long long)r->n_fingerprint, (long long)r->n_integer,
            (long long)r->n_missing_in_a, (long long)r->n_missing_in_b);

    fprintf(f, "<h2>Error per tap</h2>\n");
    svg_plot(f, r);

    if (r->first >= 0) {
        const td_cmp_tap *t = td_cmp_tap_at(r, r->first);
        fprintf(f, "<h2>First divergent tap: <code>");
        td_report_html_escape(f, t->name);
        fprintf(f, "</code>, step %lld (%s)</h2>\n<ul>\n", (long long)t->step, rp_kind(t->kind));
        fprintf(f, "<li>kind <b>%s</b>; error %s, control %s, budget %s, <b>r = %s</b></li>\n",
                td_cmp_fail_name(t->fail), rp_val(e, sizeof e, t->err), rp_num(c, sizeof c, t->err_ctrl),
                rp_num(q, sizeof q, t->budget), rp_val(w, sizeof w, t->ratio));
        fprintf(f, "<li>why it is not rounding: ");
        td_report_html_escape(f, rp_why(why, sizeof why, r, t));
        fprintf(f, "</li>\n");
        if (t->method == TD_CMP_DATA) {
            fprintf(f, "<li>max |b&minus;a| %s at %s; cosine %.9f</li>\n<li>diverges most at:",
                    rp_num(e, sizeof e, t->max_abs), rp_where(w, sizeof w, t, t->max_index), t->cosine);
            for (int i = 0; i < TD_CMP_N_WHERE && t->rows[i].index >= 0; i++)
                fprintf(f, " %s (%.0f%%)", rp_row(w, sizeof w, t, t->rows[i].index), 100 * t->rows[i].share);
            fprintf(f, "; channels");
            for (int i = 0; i < TD_CMP_N_WHERE && t->cols[i].index >= 0; i++)
                fprintf(f, " %lld (%.0f%%)", (long long)t->cols[i].index, 100 * t->cols[i].share);
            fprintf(f, "</li>\n");
        }
        fprintf(f, "</ul>\n");
        int64_t before[3];
        int nb = rp_before(r, before, 3);
        fprintf(f, "<p>The taps before it and the tap itself:</p>\n");
        table_head(f);
        for (int i = 0; i < nb; i++) tap_tr(f, r, td_cmp_tap_at(r, before[i]), 0);
        tap_tr(f, r, t, 1);
        fprintf(f, "</table>\n");
    }
    int64_t worst[25];
    int nw = td_report_worst(r, worst, 25);
    if (nw) {
        fprintf(f, "<h2>Worst taps</h2>\n");
        table_head(f);
        for (int i = 0; i < nw; i++) tap_tr(f, r, td_cmp_tap_at(r, worst[i]), worst[i] == r->first);
        fprintf(f, "</table>\n");
    }
    if (r->n_dvp) {
        fprintf(f, "<h2>Decode vs prefill</h2>\n<table>\n<tr><th>tap</th><th>prefill err</th><th>worst decode "
                   "err</th><th>step</th><th>ratio</th></tr>\n");
        for (int64_t i = 0; i < r->n_dvp && i < 10; i++) {
            fprintf(f, "<tr><td><code>");
            td_report_html_escape(f, r->dvp[i].name);
            fprintf(f, "</code></td><td>%s</td><td>%s</td><td>%lld</td><td>%s</td></tr>\n",
                    rp_val(e, sizeof e, r->dvp[i].prefill_err), rp_val(c, sizeof c, r->dvp[i].decode_err),
                    (long long)r->dvp[i].decode_step, rp_val(q, sizeof q, r->dvp[i].ratio));
        }
        fprintf(f, "</table>\n");
    }
    if (r->n_notes) {
        fprintf(f, "<h2>Notes</h2>\n<ul class=\"note\">\n");
        for (int i = 0; i < r->n_notes; i++) {
            fprintf(f, "<li>");
            td_report_html_escape(f, r->notes[i]);
            fprintf(f, "</li>\n");
        }
        fprintf(f, "</ul>\n");
    }
    fprintf(f, "</body>\n</html>\n");
}
