/* tapdiff: the oracle takes an arm's side of rounding ties (ties.h). */
#include "ties.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Runs the oracle pinned as configured, with `flips`, into path (NULL: taps
 * off); the near-ties it met go to *log. */
static int rerun(const td_run_config *base, const char *path, const td_act_tie *flips, int n_flips, td_act_tie **log,
                 int *n_log, td_err *err) {
    td_run_config c = *base;
    c.tap_path = path;
    c.on_step = NULL;
    td_run_result res = {0};
    td_act_ties_begin(flips, n_flips, TD_TIES_TAU);
    int rc = td_run(&c, &res, err);
    td_act_ties_end(log, n_log);
    if (rc == TD_OK) td_run_result_free(&res);
    return rc;
}

static double nearness(const td_act_tie *t) { return fabs(t->v - floor(t->v) - 0.5); }

static int by_nearness(const void *a, const void *b) {
    const double x = nearness(a), y = nearness(b);
    return (x > y) - (x < y);
}

static int same_tie(const td_act_tie *a, const td_act_tie *b) {
    return a->step == b->step && a->call == b->call && a->elem == b->elem && a->f16 == b->f16;
}

static int same_value(const td_act_tie *a, const td_act_tie *b) {
    return a->step == b->step && a->elem == b->elem && a->v == b->v && a->f16 == b->f16;
}

static double first_ratio(const td_cmp_result *r) { return td_cmp_tap_at(r, r->first)->ratio; }

int td_ties_follow(const td_run_config *oracle, const td_run_config *control, const char *b_path,
                   const td_cmp_options *o, td_cmp_result **r, td_ties_report *rep, td_err *err) {
    memset(rep, 0, sizeof *rep);
    TD_ASSERT(oracle->tap_path && oracle->decode == TD_DECODE_PINNED && *r);
    TD_ASSERT(control->tap_path && control->decode == TD_DECODE_PINNED);
    char try_path[1024], try_ctrl[1024];
    snprintf(try_path, sizeof try_path, "%s.ties.h5", oracle->tap_path);
    snprintf(try_ctrl, sizeof try_ctrl, "%s.ties.h5", control->tap_path);
    td_act_tie *log = NULL;
    int n_log = 0, rc = rerun(oracle, NULL, NULL, 0, &log, &n_log, err);
    rep->n_reruns++;
    while (rc == TD_OK && (*r)->verdict != TD_OK && rep->n_flips < TD_TIES_MAX) {
        const td_cmp_tap *first = td_cmp_tap_at(*r, (*r)->first);
        const int64_t step = first->step;
        // candidates: this step's near-ties not taken yet, nearest first; a value
        // rounded again for another matmul (the same row feeds the router and
        // the experts) is the same tie, so its copies (same element, same value)
        // form one candidate: the arm rounds equal inputs alike. Activation codes
        // and scales first (few per step); then f16 operand roundings (hundreds
        // per step): those made right before the divergent tap first, then any
        // of this step or an earlier one (a flip in the prefill's cache rows or
        // attention output that stayed under the budget there reaches later
        // taps, and decode steps, where the budget is f32 rounding only)
        qsort(log, (size_t)n_log, sizeof *log, by_nearness);
        int group[TD_TIES_CANDIDATES + 2 * TD_TIES_F16_CANDIDATES], n_cand = 0; // index in log of each candidate's first member
        for (int pass = 0, lim = TD_TIES_CANDIDATES; pass < 3; pass++, lim += TD_TIES_F16_CANDIDATES)
            for (int i = 0; i < n_log && n_cand < lim; i++) {
                int taken = pass == 0   ? log[i].step != step || log[i].f16
                            : pass == 1 ? log[i].step != step || !log[i].f16 || strcmp(log[i].tap, first->name)
                                        : log[i].step > step || !log[i].f16;
                for (int k = 0; k < rep->n_flips && !taken; k++) taken = same_tie(&rep->flips[k], &log[i]);
                for (int g = 0; g < n_cand && !taken; g++) taken = same_value(&log[group[g]], &log[i]);
                if (!taken) group[n_cand++] = i;
            }
        int kept = 0;
        for (int c = 0; c < n_cand && !kept && rc == TD_OK; c++) {
            int n_try = rep->n_flips;
            for (int i = 0; i < n_log && n_try < TD_TIES_MAX; i++)
                if (same_value(&log[group[c]], &log[i])) rep->flips[n_try++] = log[i];
            td_act_tie *log2 = NULL;
            int n_log2 = 0;
            rc = rerun(oracle, try_path, rep->flips, n_try, &log2, &n_log2, err);
            // the control takes the same side, so the budgets after the tie stay f32 rounding
            if (rc == TD_OK) rc = rerun(control, try_ctrl, rep->flips, n_try, NULL, NULL, err);
            rep->n_reruns++;
            td_cmp_result *r2 = NULL;
            if (rc == TD_OK) {
                td_cmp_options o2 = *o;
                o2.control = try_ctrl;
                rc = td_compare(try_path, b_path, &o2, &r2, err);
            }
            // kept when the first divergence moves later, or shrinks 4x where it is (a
            // tie whose copies are not all in this step's log yet)
            const int better = rc == TD_OK && (r2->verdict == TD_OK || r2->first > (*r)->first ||
                                               (r2->first == (*r)->first && first_ratio(r2) * 4 < first_ratio(*r)));
            if (better) {
                kept = 1;
                rep->n_flips = n_try;
                td_cmp_result_free(*r);
                *r = r2;
                free(log);
                log = log2, n_log = n_log2;
                if (rename(try_path, oracle->tap_path) || rename(try_ctrl, control->tap_path))
                    rc = td_err_set(err, TD_EINTERNAL, "ties: cannot replace %s and %s with their reruns",
                                    oracle->tap_path, control->tap_path);
                else {
                    // the kept comparison read the reruns' paths: compare again under the final names
                    td_cmp_options o2 = *o;
                    o2.control = control->tap_path;
                    td_cmp_result_free(*r);
                    *r = NULL;
                    rc = td_compare(oracle->tap_path, b_path, &o2, r, err);
                }
            } else {
                td_cmp_result_free(r2);
                free(log2);
            }
        }
        if (!kept) break;
    }
    free(log);
    remove(try_path);
    remove(try_ctrl);
    return rc;
}

void td_ties_describe(const td_ties_report *rep, char *buf, size_t n) {
    size_t w = 0;
    if (n) buf[0] = '\0';
    for (int i = 0; i < rep->n_flips && w < n;) {
        const td_act_tie *t = &rep->flips[i];
        // the attention's probabilities are named (query-head pair << 32) + cache position
        int k = t->f16 && t->elem >> 32
                    ? snprintf(buf + w, n - w, "%sstep %lld: f16 probability %.9g ulps above the lower f16 (token-head pair %lld, position %lld, before %s) in call(s)",
                               i ? "; " : "", (long long)t->step, t->v, (long long)(t->elem >> 32), (long long)(t->elem & 0xffffffff), t->tap)
              : t->f16 ? snprintf(buf + w, n - w, "%sstep %lld: f16 operand %.9g ulps above the lower f16 (element %lld, before %s) in call(s)",
                                  i ? "; " : "", (long long)t->step, t->v, (long long)t->elem, t->tap)
              : t->elem >= 0 ? snprintf(buf + w, n - w, "%sstep %lld: activation code x/d = %.9g (element %lld) in row(s)",
                                        i ? "; " : "", (long long)t->step, t->v, (long long)t->elem)
                             : snprintf(buf + w, n - w, "%sstep %lld: f16 block scale %.9g ulps above the lower f16 (block %lld) in row(s)",
                                        i ? "; " : "", (long long)t->step, t->v, (long long)(-1 - t->elem));
        // the copies of one tie (the same value rounded for several matmuls) on one line
        for (; k >= 0 && i < rep->n_flips && same_value(t, &rep->flips[i]); i++) {
            w += (size_t)k;
            if (w >= n) return;
            k = snprintf(buf + w, n - w, " %lld", (long long)rep->flips[i].call);
        }
        if (k < 0) return;
        w += (size_t)k;
    }
}
