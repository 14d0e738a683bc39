/* tapdiff reports/: the one-screen verdict `tapdiff compare` prints on
 * stdout. The first line alone answers the question; the rest says which
 * tap, where, by how much, and why that is not rounding. */
#include <math.h>
#include <string.h>

#include "report_internal.h"

static void arms(FILE *f, const td_cmp_result *r) {
    fprintf(f, "  A (reference)  %s  [%s %s]\n", r->path_a, r->backend_a[0] ? r->backend_a : "?",
            r->precision_a[0] ? r->precision_a : "?");
    fprintf(f, "  B (candidate)  %s  [%s %s]\n", r->path_b, r->backend_b[0] ? r->backend_b : "?",
            r->precision_b[0] ? r->precision_b : "?");
    if (r->has_control)
        fprintf(f, "  control        err(%s, %s)  [%s vs %s]\n", r->path_ctrl_a, r->path_ctrl_b,
                r->backend_ctrl_a[0] ? r->backend_ctrl_a : "?", r->backend_ctrl_b[0] ? r->backend_ctrl_b : "?");
    else
        fprintf(f, "  control        none: the budget is the floor only\n");
    if (r->floor_override > 0)
        fprintf(f, "  budget         r = err / max(k * err_ctrl, floor), k = %g, floor = %.3g (%s)\n", r->k,
                r->floor_override, r->floor_note[0] ? r->floor_note : "set by option");
    else
        fprintf(f, "  budget         r = err / max(k * err_ctrl, floor), k = %g, floor of B's dtype: f32 %.3g, f64 %.3g\n",
                r->k, td_cmp_floor(TD_DT_F32), td_cmp_floor(TD_DT_F64));
    fprintf(f,
            "  compared       %lld taps over %lld steps (%lld data, %lld fingerprint-only, %lld integer); missing: %lld "
            "in A, %lld in B%s%s%s\n",
            (long long)r->n_taps, (long long)(r->n_steps_b < r->n_steps_a ? r->n_steps_b : r->n_steps_a),
            (long long)r->n_data, (long long)r->n_fingerprint, (long long)r->n_integer, (long long)r->n_missing_in_a,
            (long long)r->n_missing_in_b, r->filter[0] ? "; filter '" : "", r->filter, r->filter[0] ? "'" : "");
}

static void tap_line(FILE *f, const td_cmp_tap *t) {
    char e[32], b[32], q[32];
    if (t->method == TD_CMP_INTEGER) {
        fprintf(f, "    step %-3lld %-24s integer: %llu of %llu values differ %s\n", (long long)t->step, t->name,
                (unsigned long long)t->n_int_mismatch, (unsigned long long)t->count, t->fail ? "integer" : "");
        return;
    }
    fprintf(f, "    step %-3lld %-24s err %-9s budget %-9s r %-9s %s\n", (long long)t->step, t->name,
            rp_val(e, sizeof e, t->err), rp_num(b, sizeof b, t->budget), rp_val(q, sizeof q, t->ratio),
            t->fail ? td_cmp_fail_name(t->fail) : "");
}

static void first_tap(FILE *f, const td_cmp_result *r) {
    const td_cmp_tap *t = td_cmp_tap_at(r, r->first);
    char s[96], e[32], c[32], b[32], q[32], g[32], w[96], why[900];
    fprintf(f, "\nFIRST DIVERGENT  %s  at step %lld (%s, pos %lld, %lld token%s)  %s  kind: %s\n", t->name,
            (long long)t->step, rp_kind(t->kind), (long long)t->pos0, (long long)t->n_tokens,
            t->n_tokens == 1 ? "" : "s",
            rp_shape(s, sizeof s, t), td_cmp_fail_name(t->fail));
    fprintf(f, "  error      rel L2 %s   control %s (%s)   budget %s   r = %s\n", rp_val(e, sizeof e, t->err),
            rp_num(c, sizeof c, t->err_ctrl), td_cmp_ctrl_name(t->ctrl), rp_num(b, sizeof b, t->budget),
            rp_val(q, sizeof q, t->ratio));
    if (t->fail == TD_CMPF_NONFINITE || t->fail == TD_CMPF_NONFINITE_BOTH) {
        char nf[400];
        fprintf(f, "  %s; rel L2 over the finite pairs %s\n", rp_nonfinite(nf, sizeof nf, t),
                rp_num(e, sizeof e, t->err_finite));
    }
    if (t->input[0])
        fprintf(f, "  growth     %s over its input %s (err %s)\n", rp_num(g, sizeof g, t->growth), t->input,
                rp_num(e, sizeof e, t->err_input));
    else
        fprintf(f, "  growth     n/a (no input tap)\n");
    fprintf(f, "  why        %s\n", rp_why(why, sizeof why, r, t));
    if (t->method == TD_CMP_DATA) {
        fprintf(f, "  max |b-a|  %s at %s   cosine %.9f   ulp max %s median %s\n", rp_num(e, sizeof e, t->max_abs),
                rp_where(w, sizeof w, t, t->max_index), t->cosine, rp_num(c, sizeof c, t->ulp_max),
                rp_num(b, sizeof b, t->ulp_median));
        if (t->rows[0].index >= 0) {
            fprintf(f, "  positions ");
            for (int i = 0; i < TD_CMP_N_WHERE && t->rows[i].index >= 0; i++)
                fprintf(f, " %s (%.0f%% of the error, rel %s)%s", rp_row(w, sizeof w, t, t->rows[i].index),
                        100 * t->rows[i].share, rp_num(e, sizeof e, t->rows[i].err),
                        i + 1 < TD_CMP_N_WHERE && t->rows[i + 1].index >= 0 ? "," : "");
            fprintf(f, "\n");
        }
        if (t->cols[0].index >= 0) {
            fprintf(f, "  channels  ");
            for (int i = 0; i < TD_CMP_N_WHERE && t->cols[i].index >= 0; i++)
                fprintf(f, " %lld (%.0f%%, rel %s)%s", (long long)t->cols[i].index, 100 * t->cols[i].share,
                        rp_num(e, sizeof e, t->cols[i].err),
                        i + 1 < TD_CMP_N_WHERE && t->cols[i + 1].index >= 0 ? "," : "");
            fprintf(f, "\n");
        }
    }
    if (t->is_logits)
        fprintf(f, "  logits     top-1 agree %lld/%lld, top-%d overlap mean %.2f min %.2f, KL max %s mean %s\n",
                (long long)t->lg_top1_agree, (long long)t->lg_rows, r->topk, t->lg_topk_mean, t->lg_topk_min,
                rp_num(e, sizeof e, t->lg_kl_max), rp_num(c, sizeof c, t->lg_kl_mean));
    for (int64_t i = 0; i < r->n_dvp; i++)
        if (!strcmp(r->dvp[i].name, t->name)) {
            fprintf(f, "  decode/prefill  worst decode error %s (step %lld) / prefill %s = %s%s%lld%s\n",
                    rp_val(e, sizeof e, r->dvp[i].decode_err), (long long)r->dvp[i].decode_step,
                    rp_val(c, sizeof c, r->dvp[i].prefill_err), rp_val(q, sizeof q, r->dvp[i].ratio),
                    r->dvp[i].n_nonfinite ? " (" : "", (long long)r->dvp[i].n_nonfinite,
                    r->dvp[i].n_nonfinite ? " step(s) with non-finite values included)" : "");
            break;
        }
    int64_t before[3];
    int nb = rp_before(r, before, 3);
    fprintf(f, "  taps before it:%s\n", nb ? "" : " none (it is the first compared tap)");
    for (int i = 0; i < nb; i++) tap_line(f, td_cmp_tap_at(r, before[i]));
    if (r->n_divergent > 1)
        fprintf(f, "  (%lld taps diverge in all; later ones usually inherit this one's error)\n",
                (long long)r->n_divergent);
}

void td_report_text(FILE *f, const td_cmp_result *r) {
    fprintf(f, "tapdiff compare: %s - %s\n", r->verdict == TD_OK ? "CONFORMANT" : "DIVERGENT", r->reason);
    arms(f, r);
    if (r->first >= 0) {
        first_tap(f, r);
    } else if (r->n_taps) {
        int64_t w;
        if (td_report_worst(r, &w, 1) == 1) {
            fprintf(f, "  closest to its budget:\n");
            tap_line(f, td_cmp_tap_at(r, w));
        }
    }
    for (int i = 0; i < r->n_notes; i++) fprintf(f, "  note: %s\n", r->notes[i]);
}
