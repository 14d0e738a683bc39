/* tapdiff: the oracle takes an arm's side of rounding ties (ties.h). */
#include "ties.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "types.h"

/* Runs the oracle pinned as configured, with `flips`, into path (NULL: taps
 * off); the near-ties it met go to *log, those past the log's cap are
 * counted in rep->n_unlogged. */
static int rerun(td_ties_report *rep, const td_run_config *base, const char *path, const td_act_tie *flips,
                 int n_flips, td_act_tie **log, int *n_log, td_err *err) {
    td_run_config c = *base;
    c.tap_path = path;
    c.on_step = NULL;
    td_run_result res = {0};
    td_act_ties_begin(flips, n_flips, TD_TIES_TAU);
    int rc = td_run(&c, &res, err);
    td_act_ties_end(log, n_log);
    if (td_act_ties_dropped() > rep->n_unlogged) rep->n_unlogged = td_act_ties_dropped();
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

static int by_source(const void *a, const void *b) {
    const td_act_tie *x = a, *y = b;
    if (x->step != y->step) return (x->step > y->step) - (x->step < y->step);
    return strcmp(x->src, y->src);
}

/* The tap `name` of `step` of f as doubles (td_xmalloc'd), its count and its
 * seq; NULL when the file has no such tap or no data for it. */
static double *read_tap(const td_tapfile *f, int64_t step, const char *name, uint64_t *count, int64_t *seq) {
    td_tap_info ti;
    td_err ignored;
    if (step >= td_tapfile_n_steps(f) || td_tapfile_tap(f, step, name, &ti, &ignored) != TD_OK || !ti.has_data ||
        !ti.count)
        return NULL;
    double *d = td_xmalloc(ti.count * sizeof *d);
    if (td_tapfile_read_f64(f, step, name, d, ti.count, &ignored) != TD_OK) {
        free(d);
        return NULL;
    }
    *count = ti.count;
    *seq = ti.seq;
    return d;
}

/* f16 near ties whose side the arm's taps show to be the oracle's own: the
 * search leaves them alone (flipping one could only contradict the arm). */
typedef struct agreed_ties {
    td_act_tie *v;
    int n, cap;
} agreed_ties;

static int agreed_has(const agreed_ties *a, const td_act_tie *t) {
    for (int i = 0; i < a->n; i++)
        if (same_tie(&a->v[i], t)) return 1;
    return 0;
}

int td_ties_add(td_ties_report *rep, const td_act_tie *t, int read) {
    if (rep->n_flips == TD_TIES_FLIPS_MAX) return 0;
    // a value counts as read when any copy of it was, in whatever order they came
    int known = 0, known_read = 0;
    for (int k = 0; k < rep->n_flips; k++) {
        if (!same_value(&rep->flips[k], t)) continue;
        known = 1;
        known_read |= rep->read[k];
    }
    if (!known && rep->n_values == TD_TIES_MAX) return 0;
    if (!known) rep->n_values++;
    if (read && !known_read) rep->n_read++;
    rep->read[rep->n_flips] = (unsigned char)read;
    rep->flips[rep->n_flips++] = *t;
    return 1;
}

/* Can rep take a new value? */
static int ties_room(const td_ties_report *rep) {
    return rep->n_values < TD_TIES_MAX && rep->n_flips < TD_TIES_FLIPS_MAX;
}

/* Is t pinned already (one of rep's flips)? */
static int pinned(const td_ties_report *rep, const td_act_tie *t) {
    for (int k = 0; k < rep->n_flips; k++)
        if (same_tie(&rep->flips[k], t)) return 1;
    return 0;
}

/* Is t no new candidate of the search: pinned, an f16 tie the arm's taps
 * show on the oracle's side (agreed), or a copy of a candidate chosen
 * already (log[group[0 .. n_cand)], each candidate's first member)? */
static int candidate_taken(const td_act_tie *t, const td_ties_report *rep, const agreed_ties *agreed,
                           const td_act_tie *log, const int *group, int n_cand) {
    if (pinned(rep, t) || (t->f16 && agreed_has(agreed, t))) return 1;
    for (int g = 0; g < n_cand; g++)
        if (same_value(&log[group[g]], t)) return 1;
    return 0;
}

/* Adds to rep->flips the f16 near ties of log whose input the arm tapped
 * (td_act_tie.src) before the first divergent tap `first` of the comparison
 * (a value the comparison found honest) and rounded to the tie's other
 * neighbour (ties.h); the oracle's own tap at that element must hold the
 * value it rounded, so a source named wrongly pins nothing. *added: how many. */
static int read_arm_side(const char *b_path, const char *oracle_path, const td_cmp_tap *first, const td_act_tie *log,
                         int n_log, td_ties_report *rep, agreed_ties *agreed, int *added, td_err *err) {
    *added = 0;
    td_act_tie *cand = td_xmalloc(((size_t)n_log + 1) * sizeof *cand);
    int n = 0;
    for (int i = 0; i < n_log; i++) {
        if (log[i].f16 && log[i].src[0] && !pinned(rep, &log[i])) cand[n++] = log[i];
    }
    td_tapfile *fb = NULL, *fo = NULL;
    int rc = TD_OK;
    if (n && (rc = td_tapfile_open(&fb, b_path, err)) == TD_OK) rc = td_tapfile_open(&fo, oracle_path, err);
    qsort(cand, (size_t)n, sizeof *cand, by_source);
    for (int g0 = 0, g1; rc == TD_OK && g0 < n; g0 = g1) {
        for (g1 = g0 + 1; g1 < n && !by_source(&cand[g0], &cand[g1]);) g1++;
        if (cand[g0].step > first->step) break; // sorted by step: the rest is later still
        uint64_t nb = 0, no = 0;
        int64_t seq = 0, seq_o = 0;
        double *b = read_tap(fb, cand[g0].step, cand[g0].src, &nb, &seq),
               *o = read_tap(fo, cand[g0].step, cand[g0].src, &no, &seq_o);
        const int honest = cand[g0].step < first->step || seq < first->seq;
        for (int i = g0; honest && b && o && nb == no && i < g1 && rep->n_flips < TD_TIES_FLIPS_MAX; i++) {
            const td_act_tie *t = &cand[i];
            // a scaled source: the oracle rounded its tapped value times the
            // scale, the arm its own f32 value times the f32 scale
            const double sc = t->src_scale != 0 ? t->src_scale : 1;
            if (t->src_elem >= (int64_t)nb || o[t->src_elem] * sc != t->x) continue;
            // the arm rounds its f32 value to nearest even, as the device converts it
            const float bv = t->src_scale != 0 ? (float)b[t->src_elem] * (float)sc : (float)b[t->src_elem];
            const double side = td_f16_round_trip_f32(bv);
            if (side != t->pick) {
                if (side == td_f16_round_trip_f64(t->x) && !agreed_has(agreed, t)) {
                    if (agreed->n == agreed->cap) {
                        agreed->cap = agreed->cap ? 2 * agreed->cap : 64;
                        agreed->v = td_xrealloc(agreed->v, (size_t)agreed->cap * sizeof *agreed->v);
                    }
                    agreed->v[agreed->n++] = *t;
                }
                continue;
            }
            *added += td_ties_add(rep, t, 1);
        }
        free(b);
        free(o);
    }
    td_tapfile_close(fb);
    td_tapfile_close(fo);
    free(cand);
    return rc;
}

/* The control's near ties under the current flips (n -1: it has not run
 * under them yet), sorted by_name once per change, when phase 1 first looks
 * them up. */
typedef struct control_log {
    td_act_tie *v;
    int n, sorted;
} control_log;

static void control_log_set(control_log *c, td_act_tie *v, int n) {
    free(c->v);
    *c = (control_log){.v = v, .n = n};
}

/* The f16 ties whose side the arm's taps show, all at once, then again: pins
 * move the values after them and the first divergence, so each round reads
 * the near ties of the last rerun before the last comparison's first
 * divergent tap. *log is the last rerun's (replaced). */
static int read_rounds(const td_run_config *oracle, const td_run_config *control, const char *b_path,
                       const td_cmp_options *o, td_cmp_result **r, td_ties_report *rep, td_act_tie **log, int *n_log,
                       control_log *clog, agreed_ties *agreed, td_err *err) {
    int rc = TD_OK;
    for (int round = 0; rc == TD_OK && (*r)->verdict != TD_OK && (*r)->first >= 0 && round < TD_TIES_READ_ROUNDS;
         round++) {
        int added = 0;
        if ((rc = read_arm_side(b_path, oracle->tap_path, td_cmp_tap_at(*r, (*r)->first), *log, *n_log, rep, agreed, &added,
                                err)) ||
            !added)
            break;
        free(*log);
        *log = NULL;
        rc = rerun(rep, oracle, oracle->tap_path, rep->flips, rep->n_flips, log, n_log, err);
        td_act_tie *cv = NULL;
        int n_cv = -1;
        if (rc == TD_OK) rc = rerun(rep, control, control->tap_path, rep->flips, rep->n_flips, &cv, &n_cv, err);
        control_log_set(clog, cv, n_cv);
        rep->n_reruns++;
        if (rc == TD_OK) {
            td_cmp_options o2 = *o;
            o2.control = control->tap_path;
            td_cmp_result_free(*r);
            *r = NULL;
            rc = td_compare(oracle->tap_path, b_path, &o2, r, err);
        }
    }
    return rc;
}

/* Order of a log by the tie's name (step, call, element, kind), for lookups. */
static int by_name(const void *a, const void *b) {
    const td_act_tie *x = a, *y = b;
    if (x->step != y->step) return (x->step > y->step) - (x->step < y->step);
    if (x->call != y->call) return (x->call > y->call) - (x->call < y->call);
    if (x->elem != y->elem) return (x->elem > y->elem) - (x->elem < y->elem);
    return (x->f16 > y->f16) - (x->f16 < y->f16);
}

static void control_log_sort(control_log *c) {
    if (!c->sorted && c->n > 0) qsort(c->v, (size_t)c->n, sizeof *c->v, by_name);
    c->sorted = 1;
}

/* Did the control (its log clog, sorted) round tie t of the oracle to the
 * other neighbour? Its log holds the same tie when its value was near too,
 * and `pick` there is the side the control did not take: the oracle's when
 * the two parted. */
static int control_parted(const control_log *clog, const td_act_tie *t) {
    const td_act_tie *c = clog->n > 0 ? bsearch(t, clog->v, (size_t)clog->n, sizeof *clog->v, by_name) : NULL;
    return c && c->pick != t->pick;
}

int td_ties_follow(const td_run_config *oracle, const td_run_config *control, const char *b_path,
                   const td_cmp_options *o, td_cmp_result **r, td_ties_report *rep, td_err *err) {
    memset(rep, 0, sizeof *rep);
    TD_ASSERT(oracle->tap_path && oracle->decode == TD_DECODE_PINNED && *r);
    TD_ASSERT(control->tap_path && control->decode == TD_DECODE_PINNED);
    // divergent without a divergent tap (taps missing, steps or tokens that
    // differ): no tie can explain that, and there is no step to search
    if ((*r)->first < 0) return TD_OK;
    char try_path[1024], try_ctrl[1024];
    snprintf(try_path, sizeof try_path, "%s.ties.h5", oracle->tap_path);
    snprintf(try_ctrl, sizeof try_ctrl, "%s.ties.h5", control->tap_path);
    td_act_tie *log = NULL; // the near ties of the oracle's last run
    control_log clog = {.n = -1};
    agreed_ties agreed = {0};
    int n_log = 0;
    int rc = rerun(rep, oracle, NULL, NULL, 0, &log, &n_log, err);
    rep->n_reruns++;
    rc = rc == TD_OK ? read_rounds(oracle, control, b_path, o, r, rep, &log, &n_log, &clog, &agreed, err) : rc;
    while (rc == TD_OK && (*r)->verdict != TD_OK && (*r)->first >= 0 && ties_room(rep)) {
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
        // taps, and decode steps, where the budget is f32 rounding only).
        // When none of those helps: the ties of this step or an earlier one that
        // the control rounded to the other side than the oracle (phase 1). Where
        // the arm took that side too, its error there equals the control's and
        // the step passes; the oracle's side stays in its cache and may show
        // steps later, where the control, sharing the arm's side, drew no budget.
        qsort(log, (size_t)n_log, sizeof *log, by_nearness);
        int group[TD_TIES_CANDIDATES + 2 * TD_TIES_F16_CANDIDATES + TD_TIES_SHARED_CANDIDATES], n_cand = 0; // index in log of each candidate's first member
        int kept = 0;
        for (int phase = 0, c0 = 0; phase < 2 && !kept && rc == TD_OK; phase++, c0 = n_cand) {
            if (phase == 0) {
                for (int pass = 0, lim = TD_TIES_CANDIDATES; pass < 3; pass++, lim += TD_TIES_F16_CANDIDATES)
                    for (int i = 0; i < n_log && n_cand < lim; i++) {
                        const int other = pass == 0   ? log[i].step != step || log[i].f16
                                          : pass == 1 ? log[i].step != step || !log[i].f16 || strcmp(log[i].tap, first->name)
                                                      : log[i].step > step || !log[i].f16;
                        if (!other && !candidate_taken(&log[i], rep, &agreed, log, group, n_cand)) group[n_cand++] = i;
                    }
            } else {
                if (clog.n < 0) { // once per set of flips: a control run with taps off
                    td_act_tie *cv = NULL;
                    int n_cv = -1;
                    rc = rerun(rep, control, NULL, rep->flips, rep->n_flips, &cv, &n_cv, err);
                    control_log_set(&clog, cv, n_cv);
                    rep->n_reruns++;
                    if (rc != TD_OK) break;
                }
                control_log_sort(&clog);
                for (int i = 0; i < n_log && n_cand < c0 + TD_TIES_SHARED_CANDIDATES; i++)
                    if (log[i].step <= step && control_parted(&clog, &log[i]) &&
                        !candidate_taken(&log[i], rep, &agreed, log, group, n_cand))
                        group[n_cand++] = i;
            }
            for (int c = c0; c < n_cand && !kept && rc == TD_OK; c++) {
                // the candidate's copies are pinned on trial, dropped again when it is not kept
                const int n_kept = rep->n_flips, v_kept = rep->n_values;
                for (int i = 0; i < n_log; i++)
                    if (same_value(&log[group[c]], &log[i])) td_ties_add(rep, &log[i], 0);
                const int n_try = rep->n_flips, v_try = rep->n_values;
                rep->n_flips = n_kept, rep->n_values = v_kept;
                td_act_tie *log2 = NULL, *clog2 = NULL;
                int n_log2 = 0, n_clog2 = -1;
                rc = rerun(rep, oracle, try_path, rep->flips, n_try, &log2, &n_log2, err);
                // the control takes the same side, so the budgets after the tie stay f32 rounding.
                // Its near ties are kept too: the session logs them whether kept or not, and
                // when the flip is kept they spare phase 1 a control run under the new flips.
                if (rc == TD_OK) rc = rerun(rep, control, try_ctrl, rep->flips, n_try, &clog2, &n_clog2, err);
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
                    rep->n_flips = n_try, rep->n_values = v_try;
                    td_cmp_result_free(*r);
                    *r = r2;
                    free(log);
                    log = log2, n_log = n_log2;
                    control_log_set(&clog, clog2, n_clog2);
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
                    free(clog2);
                }
            }
        }
        if (!kept) break;
        // the first divergence moved: the arm's taps before it may show more ties
        if (rc == TD_OK) rc = read_rounds(oracle, control, b_path, o, r, rep, &log, &n_log, &clog, &agreed, err);
    }
    td_ties_keep_near(rep, log, n_log);
    free(log);
    free(clog.v);
    free(agreed.v);
    remove(try_path);
    remove(try_ctrl);
    return rc;
}

/* Whether a tie's site is part `part` of some layer's attention ("blk.L.part"). */
static int site_is(const char *site, const char *part) {
    const char *dot = strrchr(site, '.');
    return dot && !strcmp(dot + 1, part);
}

/* Whether a tie's site names a part of a layer that is no weight
 * (profile.h td_act_ties_site_of) rather than the weight its row fed. */
static int site_is_part(const char *site) {
    static const char *const parts[] = {"attn_acc", "attn_probs", "attn_f16", "qsa_scores"};
    for (size_t i = 0; i < sizeof parts / sizeof *parts; i++)
        if (site_is(site, parts[i])) return 1;
    return 0;
}

void td_ties_describe(const td_ties_report *rep, char *buf, size_t n) {
    size_t w = 0;
    if (n) buf[0] = '\0';
    if (rep->n_read && n) {
        // one line for the ties read from the arm's taps: there can be hundreds
        int k = snprintf(buf, n, "%d f16 operand rounding(s) taken the arm's way, as its own taps show", rep->n_read);
        if (k < 0 || (size_t)k >= n) return;
        w = (size_t)k;
    }
    for (int i = 0; i < rep->n_flips && w < n;) {
        if (rep->read[i]) {
            i++;
            continue;
        }
        const td_act_tie *t = &rep->flips[i];
        // attention's probabilities are named (query-head pair << 32) + cache position, flash
        // attention's accumulator (pair << 32) + its slot (profile.h: td_act_ties_site_of)
        int k = t->f16 && site_is(t->site, "attn_acc")
                    ? snprintf(buf + w, n - w, "%sstep %lld: f16 flash-attention accumulator %.9g ulps above the lower f16 (token-head pair %lld, slot %lld = (2 cell + rescale) * head_dim + dim, before %s) in call(s)",
                               w ? "; " : "", (long long)t->step, t->v, (long long)(t->elem >> 32), (long long)(t->elem & 0xffffffff), t->tap)
              : t->f16 && (t->elem >> 32 || site_is(t->site, "attn_probs"))
                    ? snprintf(buf + w, n - w, "%sstep %lld: f16 probability %.9g ulps above the lower f16 (token-head pair %lld, position %lld, before %s) in call(s)",
                               w ? "; " : "", (long long)t->step, t->v, (long long)(t->elem >> 32), (long long)(t->elem & 0xffffffff), t->tap)
              : t->f16 ? snprintf(buf + w, n - w, "%sstep %lld: f16 operand %.9g ulps above the lower f16 (element %lld, before %s) in call(s)",
                                  w ? "; " : "", (long long)t->step, t->v, (long long)t->elem, t->tap)
              : t->elem >= 0 ? snprintf(buf + w, n - w, "%sstep %lld: activation code x/d = %.9g (element %lld) in row(s)",
                                        w ? "; " : "", (long long)t->step, t->v, (long long)t->elem)
                             : snprintf(buf + w, n - w, "%sstep %lld: f16 block scale %.9g ulps above the lower f16 (block %lld) in row(s)",
                                        w ? "; " : "", (long long)t->step, t->v, (long long)(-1 - t->elem));
        // the copies of one tie (the same value rounded for several matmuls) on one line
        for (; k >= 0 && i < rep->n_flips && !rep->read[i] && same_value(t, &rep->flips[i]); i++) {
            w += (size_t)k;
            if (w >= n) return;
            k = snprintf(buf + w, n - w, " %lld", (long long)rep->flips[i].call);
        }
        if (k < 0) return;
        w += (size_t)k;
    }
}

void td_ties_keep_near(td_ties_report *rep, const td_act_tie *log, int n_log) {
    rep->n_near = 0;
    for (int i = 0; i < n_log; i++) {
        if (!(nearness(&log[i]) < TD_TIES_NOTE_TAU)) continue;
        int at = rep->n_near; // insertion, nearest first: the list is short
        while (at > 0 && nearness(&rep->near[at - 1]) > nearness(&log[i])) at--;
        if (at >= TD_TIES_NEAR_MAX) continue;
        const int n_move = (rep->n_near < TD_TIES_NEAR_MAX ? rep->n_near : TD_TIES_NEAR_MAX - 1) - at;
        memmove(&rep->near[at + 1], &rep->near[at], (size_t)n_move * sizeof *rep->near);
        rep->near[at] = log[i];
        if (rep->n_near < TD_TIES_NEAR_MAX) rep->n_near++;
    }
}

/* "STEP:CALL:ELEM:V:SITE" entries separated by blanks; malloc'd. */
static char *format_ties(const td_act_tie *t, int n) {
    const size_t cap = (size_t)n * (sizeof t->site + 4 * 24 + 8) + 1; // 3 integers, one %.17g, separators
    char *s = td_xmalloc(cap);
    size_t w = 0;
    s[0] = '\0';
    for (int i = 0; i < n && w < cap; i++)
        w += (size_t)snprintf(s + w, cap - w, "%s%lld:%lld:%lld:%.17g:%s", i ? " " : "", (long long)t[i].step,
                              (long long)t[i].call, (long long)t[i].elem, t[i].v, t[i].site);
    return s;
}

int td_ties_record(const char *path, const td_ties_report *rep, td_err *err) {
    char *taken = format_ties(rep->flips, rep->n_flips), *near = format_ties(rep->near, rep->n_near);
    int rc = td_tapfile_attr_put(path, "ties_taken", taken, NULL, err);
    if (rc == TD_OK) rc = td_tapfile_attr_put(path, "near_ties", near, NULL, err);
    free(taken);
    free(near);
    return rc;
}

/* The block a weight belongs to ("blk.L.…"), -1 for the others. */
static int32_t site_layer(const char *site) {
    int L = -1, k = 0;
    return sscanf(site, "blk.%d.%n", &L, &k) == 1 && k > 0 ? L : -1;
}

int td_ties_note(const td_tapfile *f, int64_t step, int32_t layer, char *buf, size_t n) {
    char *s = NULL;
    td_err ignored;
    if (td_tapfile_attr_str(f, "near_ties", &s, &ignored) != TD_OK) return 0;
    int found = 0, count = 0;
    td_act_tie best = {0};
    for (char *p = s, *save = NULL, *e; (e = strtok_r(p, " ", &save)); p = NULL) {
        long long st, call, elem;
        double v;
        int k = 0;
        td_act_tie t = {0};
        if (sscanf(e, "%lld:%lld:%lld:%lf:%n", &st, &call, &elem, &v, &k) != 4 || !k) continue; // not ours: ignored
        snprintf(t.site, sizeof t.site, "%s", e + k);
        if (st != step || site_layer(t.site) != layer) continue;
        t.step = st, t.call = call, t.elem = elem, t.v = v;
        count++;
        if (!found || nearness(&t) < nearness(&best)) best = t;
        found = 1;
    }
    free(s);
    if (!found) return 0;
    char what[112];
    // the record keeps no f16 flag: the attention parts are known by their site (profile.h)
    if (site_is(best.site, "attn_acc"))
        snprintf(what, sizeof what, "f16 accumulator %.9g ulps up (token-head pair %lld, slot %lld)", best.v,
                 (long long)(best.elem >> 32), (long long)(best.elem & 0xffffffff));
    else if (site_is(best.site, "attn_probs"))
        snprintf(what, sizeof what, "f16 probability %.9g ulps up (token-head pair %lld, position %lld)", best.v,
                 (long long)(best.elem >> 32), (long long)(best.elem & 0xffffffff));
    else if (site_is_part(best.site))
        snprintf(what, sizeof what, "f16 operand %.9g ulps up (element %lld)", best.v, (long long)best.elem);
    else if (best.elem >= 0)
        snprintf(what, sizeof what, "code x/d = %.9g (element %lld)", best.v, (long long)best.elem);
    else
        snprintf(what, sizeof what, "f16 block scale %.9g ulps up (block %lld)", best.v, (long long)(-1 - best.elem));
    snprintf(buf, n, "divergence on a recorded near rounding tie: %d at its step and block; nearest %s, %s %s; "
             "either side is honest (bisect --a-profile lets the oracle take the arm's)", count, what,
             site_is_part(best.site) ? "in" : "input of", best.site[0] ? best.site : "a matmul");
    return 1;
}
