/* tapdiff reports/: the Markdown summary, sized for a PR comment: the
 * verdict, the arms and budget, the first divergent tap with the taps
 * before it, the worst taps, decode-vs-prefill and the notes. */
#include <math.h>
#include <string.h>

#include "report_internal.h"

// Table cells must not break the table: '|' and newlines are escaped.
static void cell(FILE *f, const char *s) {
    for (; *s; s++) {
        if (*s == '|')
            fputs("\\|", f);
        else if (*s == '\n')
            fputc(' ', f);
        else
            fputc(*s, f);
    }
}

static void tap_row(FILE *f, const td_cmp_tap *t, int mark) {
    char e[32], c[32], b[32], q[32], g[32], s[96];
    fprintf(f, "| %s%lld | %s | `", mark ? "**" : "", (long long)t->step, rp_kind(t->kind));
    cell(f, t->name);
    fprintf(f, "`%s | %s | %s | %s | %s | %s | %s | %s | %s |\n", mark ? "**" : "", rp_shape(s, sizeof s, t),
            td_cmp_method_name(t->method), rp_val(e, sizeof e, t->err), rp_num(c, sizeof c, t->err_ctrl),
            rp_budget(b, sizeof b, t), rp_val(q, sizeof q, t->ratio), rp_num(g, sizeof g, t->growth),
            t->fail ? td_cmp_fail_name(t->fail) : "ok");
}

static void table_head(FILE *f) {
    fprintf(f, "| step | kind | tap | shape | method | err | control | budget | r | growth | result |\n");
    fprintf(f, "|---:|---|---|---|---|---:|---:|---:|---:|---:|---|\n");
}

void td_report_markdown(FILE *f, const td_cmp_result *r) {
    char e[32], c[32], q[32], w[96], why[900];
    fprintf(f, "## tapdiff compare: %s\n\n", r->verdict == TD_OK ? "✅ CONFORMANT" : "❌ DIVERGENT");
    fprintf(f, "%s\n\n", r->reason);
    fprintf(f, "| | file | backend | precision |\n|---|---|---|---|\n");
    fprintf(f, "| A (reference) | `%s` | %s | %s |\n", r->path_a, r->backend_a, r->precision_a);
    fprintf(f, "| B (candidate) | `%s` | %s | %s |\n", r->path_b, r->backend_b, r->precision_b);
    if (r->has_control)
        fprintf(f, "| control | err(`%s`, `%s`) | %s vs %s | |\n", r->path_ctrl_a, r->path_ctrl_b, r->backend_ctrl_a,
                r->backend_ctrl_b);
    else
        fprintf(f, "| control | none: **the budget is the floor only** | | |\n");
    fprintf(f, "\nBudget: `r = err / max(k * err_ctrl, floor)`, k = %g, ", r->k);
    if (r->floor_override > 0)
        fprintf(f, "floor = %.3g (%s).", r->floor_override, r->floor_note[0] ? r->floor_note : "set by option");
    else
        fprintf(f, "floor by B's dtype (f64 %.3g, f32 %.3g, f16 %.3g, bf16 %.3g).", td_cmp_floor(TD_DT_F64),
                td_cmp_floor(TD_DT_F32), td_cmp_floor(TD_DT_F16), td_cmp_floor(TD_DT_BF16));
    fprintf(f, " Model `%s` sha256 `%.16s`.\n\n", r->model[0] ? r->model : "?",
            r->model_sha256[0] ? r->model_sha256 : "?");
    fprintf(f, "Compared %lld taps (%lld data, %lld fingerprint-only, %lld integer); missing %lld in A, %lld in B.\n\n",
            (long long)r->n_taps, (long long)r->n_data, (long long)r->n_fingerprint, (long long)r->n_integer,
            (long long)r->n_missing_in_a, (long long)r->n_missing_in_b);

    if (r->first >= 0) {
        const td_cmp_tap *t = td_cmp_tap_at(r, r->first);
        fprintf(f, "### First divergent tap: `%s`, step %lld (%s)\n\n", t->name, (long long)t->step, rp_kind(t->kind));
        fprintf(f, "- kind: **%s**; error %s, control %s, budget %s, **r = %s**\n", td_cmp_fail_name(t->fail),
                rp_val(e, sizeof e, t->err), rp_num(c, sizeof c, t->err_ctrl), rp_num(q, sizeof q, t->budget),
                rp_val(w, sizeof w, t->ratio));
        fprintf(f, "- why it is not rounding: %s\n", rp_why(why, sizeof why, r, t));
        if (t->method == TD_CMP_DATA) {
            fprintf(f, "- max |b-a| %s at %s; cosine %.9f; ulp max %s, median %s\n", rp_num(e, sizeof e, t->max_abs),
                    rp_where(w, sizeof w, t, t->max_index), t->cosine, rp_num(c, sizeof c, t->ulp_max),
                    rp_num(q, sizeof q, t->ulp_median));
            fprintf(f, "- diverges most at:");
            for (int i = 0; i < TD_CMP_N_WHERE && t->rows[i].index >= 0; i++)
                fprintf(f, " %s (%.0f%%)", rp_row(w, sizeof w, t, t->rows[i].index), 100 * t->rows[i].share);
            fprintf(f, "; channels");
            for (int i = 0; i < TD_CMP_N_WHERE && t->cols[i].index >= 0; i++)
                fprintf(f, " %lld (%.0f%%)", (long long)t->cols[i].index, 100 * t->cols[i].share);
            fprintf(f, "\n");
        }
        if (t->is_logits)
            fprintf(f, "- logits: top-1 agree %lld/%lld, top-%d overlap mean %.2f, KL max %s nats\n",
                    (long long)t->lg_top1_agree, (long long)t->lg_rows, r->topk, t->lg_topk_mean,
                    rp_num(e, sizeof e, t->lg_kl_max));
        int64_t before[3];
        int nb = rp_before(r, before, 3);
        fprintf(f, "\nThe taps before it and the tap itself:\n\n");
        table_head(f);
        for (int i = 0; i < nb; i++) tap_row(f, td_cmp_tap_at(r, before[i]), 0);
        tap_row(f, t, 1);
        fprintf(f, "\n");
    }
    int64_t worst[10];
    int nw = td_report_worst(r, worst, 10);
    if (nw) {
        fprintf(f, "### Worst taps (by budget ratio)\n\n");
        table_head(f);
        for (int i = 0; i < nw; i++) tap_row(f, td_cmp_tap_at(r, worst[i]), worst[i] == r->first);
        fprintf(f, "\n");
    }
    if (r->n_dvp) {
        fprintf(f, "### Decode vs prefill (worst decode error / prefill error)\n\n");
        fprintf(f, "| tap | prefill err | worst decode err | step | ratio |\n|---|---:|---:|---:|---:|\n");
        for (int64_t i = 0; i < r->n_dvp && i < 5; i++)
            fprintf(f, "| `%s` | %s | %s | %lld | %s |\n", r->dvp[i].name, rp_val(e, sizeof e, r->dvp[i].prefill_err),
                    rp_val(c, sizeof c, r->dvp[i].decode_err), (long long)r->dvp[i].decode_step,
                    rp_val(q, sizeof q, r->dvp[i].ratio));
        fprintf(f, "\n");
    }
    if (r->n_notes) {
        fprintf(f, "### Notes\n\n");
        for (int i = 0; i < r->n_notes; i++) {
            fprintf(f, "- ");
            cell(f, r->notes[i]);
            fprintf(f, "\n");
        }
    }
}
