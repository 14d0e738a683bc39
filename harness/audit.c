/* tapdiff router audit (audit.h): streams one or two tap files (and a
 * control) step by step, MoE layer by MoE layer, and measures how close each
 * token's top-k selection is to a tie; with two files, splits their
 * selection disagreements into explained (a (near-)tie) and unexplained.
 * The renderers (Markdown, JSON, HTML with an SVG margin histogram) are in
 * reports/audit_report.c. */
#include "audit.h"
#include "compare.h"
#include "qsa_rank.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ======================================================================= */
/* Rounding and floors                                                     */
/* ======================================================================= */

/* Nearest value of a binary format with p significand bits (implicit bit
 * included) and exponent range [emin, emax], ties to even. Working on the
 * double directly (not via float) avoids a double rounding. */
static double round_to_format(double x, int p, int emin, int emax) {
    if (x == 0 || !isfinite(x)) return x;
    int e2;
    (void)frexp(x, &e2); // |x| = m * 2^e2, m in [0.5, 1): exponent of x is e2 - 1
    int e = e2 - 1;
    if (e < emin) e = emin; // subnormal range: a fixed quantum
    const double q = ldexp(1.0, e - (p - 1));
    // x / q is exact (a power-of-two scaling well inside double's range);
    // nearbyint rounds half to even in the default rounding mode
    const double r = nearbyint(x / q) * q;
    const double max_finite = ldexp(2.0 - ldexp(1.0, 1 - p), emax);
    if (fabs(r) > max_finite) return copysign(INFINITY, x);
    return r;
}

double td_audit_round_bf16(double x) { return round_to_format(x, 8, -126, 127); }
double td_audit_round_f16(double x) { return round_to_format(x, 11, -14, 15); }

/* ======================================================================= */
/* Reading                                                                 */
/* ======================================================================= */

/* One open arm and its per-step buffers. */
typedef struct arm_io {
    td_tapfile *f;
    const char *path;
    double *scores;  // (T, X) of the current layer
    int64_t *sel;    // (T, K)
    int64_t *tokens; // (T) inp.tokens, -1 when unknown
    int has_tokens;
    size_t cap_s, cap_k, cap_t;
} arm_io;

static void arm_io_free(arm_io *a) {
    td_tapfile_close(a->f);
    free(a->scores), free(a->sel), free(a->tokens);
    memset(a, 0, sizeof *a);
}

static void *grow(void *p, size_t *cap, size_t n, size_t elem) {
    if (n <= *cap && p) return p;
    *cap = n > 0 ? n : 1;
    return td_xrealloc(p, *cap * elem);
}

static char *attr_or_empty(const td_tapfile *f, const char *key) {
    char *v = NULL;
    td_err e;
    if (td_tapfile_attr_str(f, key, &v, &e)) return td_xstrdup("");
    return v;
}

/* "blk.<L>.<suffix>" exactly; returns L or -1. */
static int32_t layer_of(const char *name, const char *suffix) {
    if (strncmp(name, "blk.", 4)) return -1;
    const char *p = name + 4;
    if (*p < '0' || *p > '9') return -1;
    long v = 0;
    while (*p >= '0' && *p <= '9') {
        v = v * 10 + (*p - '0');
        if (v > INT32_MAX) return -1;
        p++;
    }
    if (*p != '.' || strcmp(p + 1, suffix)) return -1;
    return (int32_t)v;
}

/* The layers of step 0 with a blk.L.<suffix> tap (moe_topk: the MoE layers), ascending. */
static int find_layers_of(const td_tapfile *f, const char *suffix, int32_t **layers, int *n, td_err *err) {
    *layers = NULL;
    *n = 0;
    if (td_tapfile_n_steps(f) == 0) return TD_OK;
    td_tap_info *taps = NULL;
    int64_t nt = 0;
    int rc = td_tapfile_step_taps(f, 0, &taps, &nt, err);
    if (rc) return rc;
    int32_t *v = td_xmalloc((size_t)(nt + 1) * sizeof *v);
    int cnt = 0;
    for (int64_t i = 0; i < nt; i++) {
        const int32_t l = layer_of(taps[i].name, suffix);
        if (l >= 0) v[cnt++] = l;
    }
    free(taps);
    // taps come in execution order, which need not be layer order for every engine
    td_sort_i32(v, (size_t)cnt);
    *layers = v;
    *n = cnt;
    return TD_OK;
}

static int find_layers(const td_tapfile *f, int32_t **layers, int *n, td_err *err) {
    return find_layers_of(f, "moe_topk", layers, n, err);
}

/* The score tap of layer l: moe_probs with data, else moe_logits with data. */
static int pick_score_tap(const td_tapfile *f, int32_t l, char *out, size_t outsz, td_err *err) {
    static const char *const names[2] = {"moe_probs", "moe_logits"};
    for (int i = 0; i < 2; i++) {
        char full[TD_TAP_NAME_MAX];
        snprintf(full, sizeof full, "blk.%d.%s", (int)l, names[i]);
        td_tap_info ti;
        td_err e;
        if (!td_tapfile_tap(f, 0, full, &ti, &e) && ti.has_data) {
            snprintf(out, outsz, "%s", names[i]);
            return TD_OK;
        }
    }
    return td_err_set(err, TD_EINPUT,
                      "%s: step 0: neither blk.%d.moe_probs nor blk.%d.moe_logits has data; the audit needs the "
                      "router scores (a full-mode tap file, or a filter that keeps blk.*.moe_*)",
                      td_tapfile_path(f), (int)l, (int)l);
}

/* inp.tokens of a step into a->tokens (T); has_tokens = 0 when absent or
 * without data (a fingerprint keeps the first four values). */
static int read_step_tokens(arm_io *a, int64_t step, int64_t T, td_err *err) {
    a->tokens = grow(a->tokens, &a->cap_t, (size_t)T, sizeof *a->tokens);
    for (int64_t i = 0; i < T; i++) a->tokens[i] = -1;
    a->has_tokens = 0;
    td_tap_info ti;
    td_err e;
    if (td_tapfile_tap(a->f, step, "inp.tokens", &ti, &e)) return TD_OK;
    if (ti.count != (uint64_t)T)
        return td_err_set(err, TD_EINPUT, "%s: step %lld: inp.tokens has %llu values, the step has %lld tokens",
                          a->path, (long long)step, (unsigned long long)ti.count, (long long)T);
    if (ti.has_data) {
        int rc = td_tapfile_read_i64(a->f, step, "inp.tokens", a->tokens, ti.count, err);
        if (rc) return rc;
        a->has_tokens = 1;
    } else if (T <= 4) {
        for (int64_t i = 0; i < T; i++) a->tokens[i] = (int64_t)ti.fp.first[i];
        a->has_tokens = 1;
    }
    return TD_OK;
}

/* A [T, n] tap with data; n_cols is set from it, or checked when > 0. */
static int check_2d(const arm_io *a, int64_t step, const char *name, int64_t T, int64_t *n_cols, td_tap_info *ti,
                    td_err *err) {
    int rc = td_tapfile_tap(a->f, step, name, ti, err);
    if (rc) return rc;
    if (!ti->has_data)
        return td_err_set(err, TD_EINPUT, "%s: step %lld: %s has no data (fingerprint only); the audit needs its values",
                          a->path, (long long)step, name);
    if (ti->ndim != 2 || ti->shape[0] != T || (*n_cols > 0 && ti->shape[1] != *n_cols) || ti->shape[1] < 1)
        return td_err_set(err, TD_EINPUT, "%s: step %lld: %s: expected shape [%lld, %s], found %d-D [%lld%s%lld]",
                          a->path, (long long)step, name, (long long)T, *n_cols > 0 ? "as in step 0" : "n",
                          ti->ndim, (long long)ti->shape[0], ti->ndim > 1 ? ", " : "",
                          ti->ndim > 1 ? (long long)ti->shape[1] : 0LL);
    *n_cols = ti->shape[1];
    return TD_OK;
}

/* Reads layer l's scores and selection of one step; checks the expert ids. */
static int read_layer(arm_io *a, int64_t step, int32_t l, const char *score_tap, int64_t T, int64_t *X, int64_t *K,
                      td_dtype *dt, td_err *err) {
    char name_s[TD_TAP_NAME_MAX], name_k[TD_TAP_NAME_MAX];
    snprintf(name_s, sizeof name_s, "blk.%d.%s", (int)l, score_tap);
    snprintf(name_k, sizeof name_k, "blk.%d.moe_topk", (int)l);
    td_tap_info ts, tk;
    int rc;
    if ((rc = check_2d(a, step, name_s, T, X, &ts, err))) return rc;
    if ((rc = check_2d(a, step, name_k, T, K, &tk, err))) return rc;
    if (td_dtype_is_int(ts.dtype))
        return td_err_set(err, TD_EINPUT, "%s: step %lld: %s: expected floating-point scores, found %s", a->path,
                          (long long)step, name_s, td_dtype_name(ts.dtype));
    if (!td_dtype_is_int(tk.dtype))
        return td_err_set(err, TD_EINPUT, "%s: step %lld: %s: expected integer expert ids, found %s", a->path,
                          (long long)step, name_k, td_dtype_name(tk.dtype));
    if (*K >= *X)
        return td_err_set(err, TD_EINPUT, "%s: step %lld: %s selects K = %lld of X = %lld experts; the audit needs K < X",
                          a->path, (long long)step, name_k, (long long)*K, (long long)*X);
    *dt = ts.dtype;
    a->scores = grow(a->scores, &a->cap_s, (size_t)(T * *X), sizeof *a->scores);
    a->sel = grow(a->sel, &a->cap_k, (size_t)(T * *K), sizeof *a->sel);
    if ((rc = td_tapfile_read_f64(a->f, step, name_s, a->scores, (uint64_t)(T * *X), err))) return rc;
    if ((rc = td_tapfile_read_i64(a->f, step, name_k, a->sel, (uint64_t)(T * *K), err))) return rc;
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < *K; j++) {
            const int64_t e = a->sel[t * *K + j];
            if (e < 0 || e >= *X)
                return td_err_set(err, TD_EINPUT, "%s: step %lld: %s[%lld][%lld] = %lld: expected an expert id in 0..%lld",
                                  a->path, (long long)step, name_k, (long long)t, (long long)j, (long long)e,
                                  (long long)(*X - 1));
            for (int64_t i = 0; i < j; i++)
                if (a->sel[t * *K + i] == e)
                    return td_err_set(err, TD_EINPUT, "%s: step %lld: %s row %lld selects expert %lld twice", a->path,
                                      (long long)step, name_k, (long long)t, (long long)e);
        }
    return TD_OK;
}

/* ======================================================================= */
/* Per-token evaluation                                                    */
/* ======================================================================= */

typedef struct tok_eval {
    int finite;
    double s_k, s_k1; // scores of ranks K and K+1
    double margin;
    double thr;
    double excess;    // max unselected score - min selected score (> 0: not a top-k)
} tok_eval;

/* Scratch: a rank position per expert (K = not selected) and a taken flag. */
typedef struct scratch {
    int64_t *pos;
    unsigned char *taken;
    size_t cap;
} scratch;

static void scratch_fit(scratch *sc, int64_t X) {
    if ((size_t)X <= sc->cap) return;
    sc->cap = (size_t)X;
    sc->pos = td_xrealloc(sc->pos, sc->cap * sizeof *sc->pos);
    sc->taken = td_xrealloc(sc->taken, sc->cap);
}

static void mark_selection(scratch *sc, const int64_t *sel, int64_t X, int64_t K) {
    for (int64_t e = 0; e < X; e++) sc->pos[e] = K;
    for (int64_t j = 0; j < K; j++) sc->pos[sel[j]] = j;
}

/* max_{e not in S} s[e] - min_{e in S} s[e], S given by sc->pos (< K). */
static double selection_excess(const scratch *sc, const double *s, int64_t X, int64_t K) {
    double min_in = INFINITY, max_out = -INFINITY;
    for (int64_t e = 0; e < X; e++) {
        if (sc->pos[e] < K) min_in = fmin(min_in, s[e]);
        else max_out = fmax(max_out, s[e]);
    }
    return max_out - min_in;
}

static int all_finite(const double *s, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(s[i])) return 0;
    return 1;
}

/* s (X): one token's scores; sel (K): its selection. noise: the control's
 * deviation at this token (0 without one). */
static void eval_token(tok_eval *ev, scratch *sc, const double *s, const int64_t *sel, int64_t X, int64_t K,
                       double noise, td_dtype dt) {
    memset(ev, 0, sizeof *ev);
    ev->finite = all_finite(s, X);
    if (!ev->finite) {
        ev->s_k = ev->s_k1 = ev->margin = ev->thr = ev->excess = NAN;
        return;
    }
    // the K+1 largest values, by repeated "largest not yet taken"; which of
    // two equal values is taken first does not change the values
    memset(sc->taken, 0, (size_t)X);
    double v = 0;
    for (int64_t j = 0; j <= K; j++) {
        int64_t best = -1;
        for (int64_t e = 0; e < X; e++)
            if (!sc->taken[e] && (best < 0 || s[e] > s[best])) best = e;
        sc->taken[best] = 1;
        v = s[best];
        if (j == K - 1) ev->s_k = v;
    }
    ev->s_k1 = v;
    ev->margin = ev->s_k - ev->s_k1;
    const double floor_rel = td_cmp_floor(dt) * fmax(fabs(ev->s_k), fabs(ev->s_k1));
    ev->thr = fmax(TD_AUDIT_NEAR_K * noise, floor_rel);
    mark_selection(sc, sel, X, K);
    ev->excess = selection_excess(sc, s, X, K);
}

static void where_fill(td_audit_where *w, int64_t step, int64_t row, int64_t pos0, int64_t token, const int64_t *sel_a,
                       const int64_t *sel_b, int64_t K, const tok_eval *ea, const tok_eval *eb, double excess) {
    memset(w, 0, sizeof *w);
    w->step = step;
    w->row = row;
    w->pos = pos0 + row;
    w->token = token;
    w->n_sel = (int)(K < TD_AUDIT_SEL_MAX ? K : TD_AUDIT_SEL_MAX);
    for (int j = 0; j < w->n_sel; j++) {
        w->sel_a[j] = (int)sel_a[j];
        w->sel_b[j] = sel_b ? (int)sel_b[j] : -1;
    }
    w->margin_a = ea ? ea->margin : NAN;
    w->thr_a = ea ? ea->thr : NAN;
    w->margin_b = eb ? eb->margin : NAN;
    w->thr_b = eb ? eb->thr : NAN;
    w->excess = excess;
}

static void where_none(td_audit_where *w) {
    memset(w, 0, sizeof *w);
    w->step = -1;
    w->margin_a = w->margin_b = w->thr_a = w->thr_b = w->excess = NAN;
}

static int hist_bin(double margin) {
    const double lg = log10(margin);
    if (lg < TD_AUDIT_HIST_LO) return 0;
    const double b = 1 + floor((lg - TD_AUDIT_HIST_LO) / TD_AUDIT_HIST_W);
    return b >= TD_AUDIT_HIST_BINS - 1 ? TD_AUDIT_HIST_BINS - 1 : (int)b;
}

/* Adds one token to an arm's layer statistics. */
static void layer_add(td_audit_layer *L, const tok_eval *ev, scratch *sc, const double *s, const int64_t *sel,
                      int64_t step, int64_t row, int64_t pos0, int64_t token, int64_t *n_unexplained) {
    const int64_t X = L->X, K = L->K;
    L->n_tokens++;
    if (!ev->finite) {
        L->n_nonfinite++;
        (*n_unexplained)++;
        if (L->first_unexplained.step < 0) where_fill(&L->first_unexplained, step, row, pos0, token, sel, NULL, K, ev, NULL, NAN);
        return;
    }
    if (ev->margin == 0) {
        L->n_exact++;
        if (L->first_exact.step < 0) where_fill(&L->first_exact, step, row, pos0, token, sel, NULL, K, ev, NULL, ev->excess);
    } else {
        if (ev->margin <= ev->thr) L->n_near++;
        L->min_margin = fmin(L->min_margin, ev->margin);
        L->hist[hist_bin(ev->margin)]++;
    }
    if (td_audit_round_bf16(ev->s_k) == td_audit_round_bf16(ev->s_k1)) L->n_tie_bf16++;
    if (td_audit_round_f16(ev->s_k) == td_audit_round_f16(ev->s_k1)) L->n_tie_f16++;
    L->max_thr = fmax(L->max_thr, ev->thr);
    // tie-break order: pairs of bitwise-equal scores with at least one
    // selected (sc->pos was set by eval_token)
    for (int64_t j = 0; j < K; j++) {
        const int64_t e = sel[j];
        for (int64_t f = 0; f < X; f++) {
            if (f == e || s[f] != s[e]) continue;
            if (sc->pos[f] < K && f < e) continue; // both selected: count the pair once
            const int64_t lo = e < f ? e : f, hi = e < f ? f : e;
            if (sc->pos[lo] < sc->pos[hi]) L->n_tb_lower++;
            else L->n_tb_higher++;
        }
    }
    if (ev->excess > 0) {
        L->n_not_topk++;
        if (!(ev->excess <= ev->thr)) {
            L->n_not_topk_unexplained++;
            (*n_unexplained)++;
            if (L->first_unexplained.step < 0)
                where_fill(&L->first_unexplained, step, row, pos0, token, sel, NULL, K, ev, NULL, ev->excess);
        }
    }
}

/* ======================================================================= */
/* The audit                                                               */
/* ======================================================================= */

void td_audit_result_free(td_audit_result *r) {
    if (!r) return;
    for (int i = 0; i < 2; i++) {
        free(r->arms[i].path), free(r->arms[i].backend), free(r->arms[i].precision), free(r->arms[i].decode);
        free(r->arms[i].layers);
    }
    free(r->path_ctrl);
    free(r->pairs);
    free(r);
}

static void layer_init(td_audit_layer *L, int32_t layer) {
    memset(L, 0, sizeof *L);
    L->layer = layer;
    L->min_margin = INFINITY;
    where_none(&L->first_exact);
    where_none(&L->first_unexplained);
}

/* The steps of b must be those of a: kind, pos0, n_tokens (and count). */
static int check_same_steps(const arm_io *a, const arm_io *b, const char *what, td_err *err) {
    const int64_t na = td_tapfile_n_steps(a->f), nb = td_tapfile_n_steps(b->f);
    if (na != nb)
        return td_err_set(err, TD_EINPUT, "%s (%s) has %lld steps, %s has %lld: the audit needs the same steps", b->path,
                          what, (long long)nb, a->path, (long long)na);
    for (int64_t s = 0; s < na; s++) {
        td_step_info sa, sb;
        int rc;
        if ((rc = td_tapfile_step(a->f, s, &sa, err)) || (rc = td_tapfile_step(b->f, s, &sb, err))) return rc;
        if (sa.kind != sb.kind || sa.pos0 != sb.pos0 || sa.n_tokens != sb.n_tokens)
            return td_err_set(err, TD_EINPUT,
                              "%s (%s): step %lld is %s at pos %lld with %lld tokens; in %s it is %s at pos %lld with "
                              "%lld tokens",
                              b->path, what, (long long)s, sb.kind == TD_STEP_PREFILL ? "prefill" : "decode",
                              (long long)sb.pos0, (long long)sb.n_tokens, a->path,
                              sa.kind == TD_STEP_PREFILL ? "prefill" : "decode", (long long)sa.pos0,
                              (long long)sa.n_tokens);
    }
    return TD_OK;
}

static int check_same_tokens(const arm_io *a, const arm_io *b, const char *what, int64_t step, int64_t T, td_err *err) {
    if (!a->has_tokens || !b->has_tokens) return TD_OK;
    for (int64_t i = 0; i < T; i++)
        if (a->tokens[i] != b->tokens[i])
            return td_err_set(err, TD_EINPUT,
                              "%s (%s): step %lld consumed token %lld at row %lld, %s consumed %lld: the arms answer "
                              "different questions (run them pinned to the same tokens)",
                              b->path, what, (long long)step, (long long)b->tokens[i], (long long)i, a->path,
                              (long long)a->tokens[i]);
    return TD_OK;
}

static void set_reason(td_audit_result *r, int n_layers) {
    if (n_layers == 0) {
        r->verdict = TD_DIVERGENT;
        snprintf(r->reason, sizeof r->reason,
                 "no MoE router taps (blk.L.moe_topk) in %s: nothing audited, which is not a pass", r->arms[0].path);
        return;
    }
    if (r->n_unexplained == 0) {
        r->verdict = TD_OK;
        if (r->n_arms == 2) {
            int64_t d = 0;
            for (int i = 0; i < r->n_pairs; i++) d += r->pairs[i].n_disagree;
            if (d == 0)
                snprintf(r->reason, sizeof r->reason,
                         "the two arms select the same experts at every token of %d MoE layer%s", n_layers,
                         n_layers == 1 ? "" : "s");
            else
                snprintf(r->reason, sizeof r->reason,
                         "%lld selection disagreement%s over %d MoE layer%s, all explained by exact or near ties",
                         (long long)d, d == 1 ? "" : "s", n_layers, n_layers == 1 ? "" : "s");
        } else {
            snprintf(r->reason, sizeof r->reason,
                     "%d MoE layer%s audited: every selection is a top-k of the arm's own router scores", n_layers,
                     n_layers == 1 ? "" : "s");
        }
        return;
    }
    r->verdict = TD_DIVERGENT;
    // name the first unexplained thing: pair disagreements first (the bug
    // two arms show), then an arm's own inconsistencies
    for (int i = 0; i < r->n_pairs; i++) {
        const td_audit_pair *p = &r->pairs[i];
        if (!p->n_unexplained) continue;
        const td_audit_where *w = &p->first_unexplained;
        snprintf(r->reason, sizeof r->reason,
                 "%lld unexplained; first: layer %d, step %lld, pos %lld (token %lld): the selections differ and "
                 "neither is a top-k of the other arm's scores within its noise (margins %.3g / %.3g, thresholds "
                 "%.3g / %.3g)",
                 (long long)r->n_unexplained, (int)p->layer, (long long)w->step, (long long)w->pos,
                 (long long)w->token, w->margin_a, w->margin_b, w->thr_a, w->thr_b);
        return;
    }
    for (int a = 0; a < r->n_arms; a++)
        for (int i = 0; i < r->arms[a].n_layers; i++) {
            const td_audit_layer *L = &r->arms[a].layers[i];
            if (L->first_unexplained.step < 0) continue;
            const td_audit_where *w = &L->first_unexplained;
            snprintf(r->reason, sizeof r->reason,
                     "%lld unexplained; first: %s layer %d, step %lld, pos %lld (token %lld): %s", (long long)r->n_unexplained,
                     r->arms[a].path, (int)L->layer, (long long)w->step, (long long)w->pos, (long long)w->token,
                     isnan(w->excess) ? "non-finite router scores"
                                      : "the selection is not a top-k of the arm's own router scores");
            return;
        }
    snprintf(r->reason, sizeof r->reason, "%lld unexplained", (long long)r->n_unexplained);
}

int td_audit(const char *path, const char *other, const char *control, td_audit_result **out, td_err *err) {
    *out = NULL;
    arm_io io[3];
    memset(io, 0, sizeof io);
    const int n_arms = other ? 2 : 1;
    arm_io *ctrl = control ? &io[2] : NULL;
    int32_t *layers = NULL, *layers_b = NULL;
    int n_layers = 0, n_layers_b = 0;
    char (*score_tap)[2][16] = NULL; // per layer, per arm
    scratch sc = {0};
    td_audit_result *r = td_xcalloc(1, sizeof *r);
    r->n_arms = n_arms;
    r->near_k = TD_AUDIT_NEAR_K;
    const char *paths[3] = {path, other, control};
    int rc = TD_OK;

    for (int i = 0; i < 3; i++) {
        if (!paths[i]) continue;
        io[i].path = paths[i];
        if ((rc = td_tapfile_open(&io[i].f, paths[i], err))) goto fail;
    }
    for (int a = 0; a < n_arms; a++) {
        r->arms[a].path = td_xstrdup(paths[a]);
        r->arms[a].backend = attr_or_empty(io[a].f, "backend");
        r->arms[a].precision = attr_or_empty(io[a].f, "precision");
        r->arms[a].decode = attr_or_empty(io[a].f, "decode");
    }
    if (control) r->path_ctrl = td_xstrdup(control);
    r->n_steps = td_tapfile_n_steps(io[0].f);

    if ((rc = find_layers(io[0].f, &layers, &n_layers, err))) goto fail;
    if (other) {
        if ((rc = check_same_steps(&io[0], &io[1], "the other arm", err))) goto fail;
        if ((rc = find_layers(io[1].f, &layers_b, &n_layers_b, err))) goto fail;
        int same = n_layers == n_layers_b;
        for (int i = 0; same && i < n_layers; i++) same = layers[i] == layers_b[i];
        if (!same) {
            rc = td_err_set(err, TD_EINPUT, "%s has %d MoE layers (moe_topk taps in step 0), %s has %d%s", other,
                            n_layers_b, path, n_layers, n_layers == n_layers_b ? ", with other indices" : "");
            goto fail;
        }
    }
    if (ctrl && (rc = check_same_steps(&io[0], ctrl, "the control", err))) goto fail;

    score_tap = td_xcalloc((size_t)(n_layers ? n_layers : 1), sizeof *score_tap);
    for (int a = 0; a < n_arms; a++) {
        r->arms[a].n_layers = n_layers;
        r->arms[a].layers = td_xcalloc((size_t)(n_layers ? n_layers : 1), sizeof *r->arms[a].layers);
        for (int i = 0; i < n_layers; i++) {
            layer_init(&r->arms[a].layers[i], layers[i]);
            if ((rc = pick_score_tap(io[a].f, layers[i], score_tap[i][a], sizeof score_tap[i][a], err))) goto fail;
            snprintf(r->arms[a].layers[i].score_tap, sizeof r->arms[a].layers[i].score_tap, "%s", score_tap[i][a]);
        }
    }
    if (n_arms == 2) {
        r->n_pairs = n_layers;
        r->pairs = td_xcalloc((size_t)(n_layers ? n_layers : 1), sizeof *r->pairs);
        for (int i = 0; i < n_layers; i++) {
            r->pairs[i].layer = layers[i];
            where_none(&r->pairs[i].first_explained);
            where_none(&r->pairs[i].first_unexplained);
        }
    }
    if (control)
        snprintf(r->noise_note, sizeof r->noise_note,
                 "near-tie threshold = max(%g x noise, floor(dtype) x score), noise = max over experts |control - %s| "
                 "at the same step and token (control: %s)",
                 TD_AUDIT_NEAR_K, path, control);
    else
        snprintf(r->noise_note, sizeof r->noise_note,
                 "no control arm: near-tie threshold = the precision floor x score (f64 1e-13, f32 2^-20, f16 2^-7, "
                 "bf16 2^-4); give --control (e.g. a ref32 run) to measure the noise");

    double *noise = NULL;
    size_t cap_noise = 0;
    for (int64_t s = 0; s < r->n_steps && !rc; s++) {
        td_step_info si;
        if ((rc = td_tapfile_step(io[0].f, s, &si, err))) break;
        const int64_t T = si.n_tokens;
        for (int i = 0; i < 3 && !rc; i++)
            if (io[i].f) rc = read_step_tokens(&io[i], s, T, err);
        if (rc) break;
        if (other && (rc = check_same_tokens(&io[0], &io[1], "the other arm", s, T, err))) break;
        if (ctrl && (rc = check_same_tokens(&io[0], ctrl, "the control", s, T, err))) break;
        noise = grow(noise, &cap_noise, (size_t)T, sizeof *noise);

        for (int i = 0; i < n_layers && !rc; i++) {
            td_audit_layer *LA = &r->arms[0].layers[i];
            int64_t X = s ? LA->X : 0, K = s ? LA->K : 0;
            td_dtype dt[2] = {TD_DT_F64, TD_DT_F64};
            for (int a = 0; a < n_arms && !rc; a++) {
                int64_t Xa = X, Ka = K;
                rc = read_layer(&io[a], s, layers[i], score_tap[i][a], T, &Xa, &Ka, &dt[a], err);
                if (!rc && a == 0) X = Xa, K = Ka;
                if (!rc && a == 1 && (Xa != X || Ka != K))
                    rc = td_err_set(err, TD_EINPUT, "%s: layer %d routes K = %lld of X = %lld experts; %s: K = %lld of %lld",
                                    other, (int)layers[i], (long long)Ka, (long long)Xa, path, (long long)K,
                                    (long long)X);
            }
            if (rc) break;
            for (int a = 0; a < n_arms; a++) {
                r->arms[a].layers[i].X = X, r->arms[a].layers[i].K = K;
                if (s == 0) r->arms[a].layers[i].dtype = dt[a];
            }
            for (int64_t t = 0; t < T; t++) noise[t] = 0;
            if (ctrl) {
                char name[TD_TAP_NAME_MAX];
                snprintf(name, sizeof name, "blk.%d.%s", (int)layers[i], score_tap[i][0]);
                td_tap_info ti;
                int64_t Xc = X;
                if ((rc = check_2d(ctrl, s, name, T, &Xc, &ti, err))) break;
                ctrl->scores = grow(ctrl->scores, &ctrl->cap_s, (size_t)(T * X), sizeof *ctrl->scores);
                if ((rc = td_tapfile_read_f64(ctrl->f, s, name, ctrl->scores, (uint64_t)(T * X), err))) break;
                for (int64_t t = 0; t < T; t++)
                    for (int64_t e = 0; e < X; e++) {
                        const double d = fabs(ctrl->scores[t * X + e] - io[0].scores[t * X + e]);
                        // a non-finite control says nothing about rounding noise
                        if (isfinite(d)) noise[t] = fmax(noise[t], d);
                    }
            }
            scratch_fit(&sc, X);
            for (int64_t t = 0; t < T; t++) {
                tok_eval ev[2];
                for (int a = 0; a < n_arms; a++) {
                    const double *sa = io[a].scores + t * X;
                    const int64_t *sel = io[a].sel + t * K;
                    eval_token(&ev[a], &sc, sa, sel, X, K, noise[t], dt[a]);
                    layer_add(&r->arms[a].layers[i], &ev[a], &sc, sa, sel, s, t, si.pos0, io[a].tokens[t],
                              &r->n_unexplained);
                }
                if (n_arms < 2) continue;
                td_audit_pair *P = &r->pairs[i];
                P->n_tokens++;
                const int64_t *sel_a = io[0].sel + t * K, *sel_b = io[1].sel + t * K;
                const double *s_a = io[0].scores + t * X, *s_b = io[1].scores + t * X;
                mark_selection(&sc, sel_a, X, K);
                int same = 1;
                for (int64_t j = 0; j < K; j++) same &= sc.pos[sel_b[j]] < K;
                if (same) continue;
                P->n_disagree++;
                // both selections judged on A's scores, then both on B's:
                // rounding explains the disagreement when, in one arm's
                // scores, EACH selection is a top-k within that arm's noise
                const double x_ab = selection_excess(&sc, s_b, X, K); // sc marks S_A: S_A on B's scores
                mark_selection(&sc, sel_b, X, K);
                const double x_ba = selection_excess(&sc, s_a, X, K); // S_B on A's scores
                const int finite = ev[0].finite && ev[1].finite;
                const double on_a = fmax(ev[0].excess, x_ba), on_b = fmax(x_ab, ev[1].excess);
                const double excess = fmin(on_a, on_b);
                if (finite && (on_a <= 0 || on_b <= 0)) {
                    P->n_explained_exact++;
                } else if (finite && (on_a <= ev[0].thr || on_b <= ev[1].thr)) {
                    P->n_explained_near++;
                } else {
                    P->n_unexplained++;
                    r->n_unexplained++;
                    if (P->first_unexplained.step < 0)
                        where_fill(&P->first_unexplained, s, t, si.pos0, io[0].tokens[t], sel_a, sel_b, K, &ev[0], &ev[1],
                                   excess);
                    continue;
                }
                if (P->first_explained.step < 0)
                    where_fill(&P->first_explained, s, t, si.pos0, io[0].tokens[t], sel_a, sel_b, K, &ev[0], &ev[1],
                               excess);
            }
        }
    }
    free(noise);
    if (rc) goto fail;
    set_reason(r, n_layers);
    *out = r;
    r = NULL;

fail:
    for (int i = 0; i < 3; i++) arm_io_free(&io[i]);
    free(layers), free(layers_b), free(score_tap);
    free(sc.pos), free(sc.taken);
    td_audit_result_free(r);
    return rc;
}


/* ======================================================================= */
/* The QSA indexer's selection (audit.h)                                   */
/* ======================================================================= */

#define QSA_TAIL_SCORE 1e9 /* llama.cpp's bias on the tail: it always ranks first */

typedef struct qsa_arm {
    td_tapfile *f;
    const char *path;
    double *sc;   // (T, NB) block scores
    int64_t *sel; // (T, W)
    int64_t NB;
    td_dtype dt;
    size_t cap_s, cap_k;
} qsa_arm;

void td_audit_qsa_result_free(td_audit_qsa_result *r) {
    if (!r) return;
    free(r->layers);
    free(r);
}

/* A [T, n] tap with data (n may be 0); *n_cols from it, or checked when >= 0. */
static int qsa_read(qsa_arm *a, int64_t step, int32_t l, const char *base, int64_t T, int64_t *n_cols, int want_int,
                    td_err *err) {
    char name[TD_TAP_NAME_MAX];
    snprintf(name, sizeof name, "blk.%d.%s", (int)l, base);
    td_tap_info ti;
    int rc = td_tapfile_tap(a->f, step, name, &ti, err);
    if (rc) return rc;
    if (!ti.has_data)
        return td_err_set(err, TD_EINPUT, "%s: step %lld: %s has no data (fingerprint only); the audit needs its values",
                          a->path, (long long)step, name);
    if (ti.ndim != 2 || ti.shape[0] != T || (*n_cols >= 0 && ti.shape[1] != *n_cols))
        return td_err_set(err, TD_EINPUT, "%s: step %lld: %s: expected shape [%lld, %s], found %d-D", a->path,
                          (long long)step, name, (long long)T, *n_cols >= 0 ? "as in step 0" : "n", ti.ndim);
    if (want_int != td_dtype_is_int(ti.dtype))
        return td_err_set(err, TD_EINPUT, "%s: step %lld: %s: expected %s values, found %s", a->path, (long long)step,
                          name, want_int ? "integer" : "floating-point", td_dtype_name(ti.dtype));
    *n_cols = ti.shape[1];
    const size_t n = (size_t)(T * *n_cols);
    if (want_int) {
        a->sel = grow(a->sel, &a->cap_k, n, sizeof *a->sel);
        return n ? td_tapfile_read_i64(a->f, step, name, a->sel, n, err) : TD_OK;
    }
    a->dt = ti.dtype;
    a->sc = grow(a->sc, &a->cap_s, n, sizeof *a->sc);
    return n ? td_tapfile_read_f64(a->f, step, name, a->sc, n, err) : TD_OK;
}

/* The block size from a step's -1 pattern (0: not decided yet); checks it. */
static int qsa_ratio(const qsa_arm *a, int64_t step, int32_t l, int64_t pos0, int64_t T, int64_t *r, td_err *err) {
    for (int64_t t = 0; t < T; t++) {
        int64_t c = 0;
        for (int64_t b = 0; b < a->NB; b++) c += a->sc[t * a->NB + b] >= 0;
        if (!*r && c == 1 && (t > 0 || pos0 == 0 || step > 0)) *r = pos0 + t + 1;
        if (*r && c != (pos0 + t + 1) / *r)
            return td_err_set(err, TD_EINPUT,
                              "%s: step %lld: blk.%d.qsa_scores row %lld (position %lld) has %lld complete blocks; "
                              "block size %lld gives %lld",
                              a->path, (long long)step, (int)l, (long long)t, (long long)(pos0 + t), (long long)c,
                              (long long)*r, (long long)((pos0 + t + 1) / *r));
    }
    return TD_OK;
}

/* Position scores of token t at position p into ps (p + 1). */
static void qsa_pos_scores(const qsa_arm *a, int64_t t, int64_t p, int64_t r, double *ps) {
    const int64_t tail0 = (p + 1) / r * r;
    for (int64_t s = 0; s <= p; s++) ps[s] = s >= tail0 ? QSA_TAIL_SCORE : a->sc[t * a->NB + s / r];
}

/* The valid selected positions of row t (ascending in sel_out); -1 when a
 * position is > p or repeated. */
static int64_t qsa_row(const qsa_arm *a, int64_t t, int64_t W, int64_t p, int64_t *out) {
    int64_t m = 0;
    for (int64_t j = 0; j < W; j++) {
        const int64_t v = a->sel[t * W + j];
        if (v < 0) continue;
        if (v > p) return -1;
        for (int64_t i = 0; i < m; i++)
            if (out[i] == v) return -1;
        out[m++] = v;
    }
    return m;
}

/* Block margins at the cut: the ranks of complete blocks by score; the pairs
 * (last whole block, next) and, when the budget cuts a block, (cut block,
 * next). min_gap: the smallest score gap of those pairs; f16: one pair ties
 * in f16. Returns 1 when the budget cuts a block. */
static int qsa_cut(const double *bs, int64_t nb, int64_t left, int64_t r, int64_t *order, double *min_gap, int *f16,
                   double *s_max) {
    for (int64_t b = 0; b < nb; b++) order[b] = b;
    for (int64_t i = 1; i < nb; i++) // the catalog's block rank (taps/qsa_rank.h)
        for (int64_t j = i; j > 0 && td_qsa_block_before(bs[order[j]], order[j], bs[order[j - 1]], order[j - 1]);
             j--) {
            const int64_t x = order[j];
            order[j] = order[j - 1];
            order[j - 1] = x;
        }
    const int64_t full = left / r, part = left % r;
    *min_gap = INFINITY, *f16 = 0, *s_max = 0;
    int64_t pairs[2][2], np = 0;
    if (full >= 1 && full < nb) pairs[np][0] = full - 1, pairs[np][1] = full, np++;
    if (part > 0 && full + 1 < nb) pairs[np][0] = full, pairs[np][1] = full + 1, np++;
    for (int64_t i = 0; i < np; i++) {
        const double hi = bs[order[pairs[i][0]]], lo = bs[order[pairs[i][1]]];
        *min_gap = fmin(*min_gap, hi - lo);
        *f16 |= td_audit_round_f16(hi) == td_audit_round_f16(lo);
        *s_max = fmax(*s_max, fmax(fabs(hi), fabs(lo)));
    }
    return part > 0;
}

int td_audit_qsa(const char *path, const char *other, const char *control, td_audit_qsa_result **out, td_err *err) {
    *out = NULL;
    qsa_arm io[3];
    memset(io, 0, sizeof io);
    const char *paths[3] = {path, other, control};
    td_audit_qsa_result *r = td_xcalloc(1, sizeof *r);
    int32_t *layers = NULL, *layers_b = NULL;
    int n_layers = 0, n_layers_b = 0, rc = TD_OK;
    int64_t *sel[2] = {NULL, NULL}, *order = NULL;
    double *ps[2] = {NULL, NULL};
    size_t cap_p = 0;
    scratch sc = {0};
    for (int a = 0; a < 3; a++) {
        if (!paths[a]) continue;
        io[a].path = paths[a];
        if ((rc = td_tapfile_open(&io[a].f, paths[a], err))) goto fail;
    }
    r->n_arms = other ? 2 : 1;
    r->n_steps = td_tapfile_n_steps(io[0].f);
    if ((rc = find_layers_of(io[0].f, "qsa_sel", &layers, &n_layers, err))) goto fail;
    if (other) {
        arm_io ea = {.f = io[0].f, .path = path}, eb = {.f = io[1].f, .path = other};
        if ((rc = check_same_steps(&ea, &eb, "the other arm", err))) goto fail;
        if ((rc = find_layers_of(io[1].f, "qsa_sel", &layers_b, &n_layers_b, err))) goto fail;
        int same = n_layers == n_layers_b;
        for (int i = 0; same && i < n_layers; i++) same = layers[i] == layers_b[i];
        if (!same) {
            rc = td_err_set(err, TD_EINPUT, "%s has %d QSA layers (qsa_sel taps in step 0), %s has %d", other,
                            n_layers_b, path, n_layers);
            goto fail;
        }
    }
    if (control) {
        arm_io ea = {.f = io[0].f, .path = path}, ec = {.f = io[2].f, .path = control};
        if ((rc = check_same_steps(&ea, &ec, "the control", err))) goto fail;
    }
    r->n_layers = n_layers;
    r->layers = td_xcalloc((size_t)(n_layers ? n_layers : 1), sizeof *r->layers);
    for (int i = 0; i < n_layers; i++) {
        r->layers[i].layer = layers[i];
        r->layers[i].W = -1;
        where_none(&r->layers[i].first_unexplained);
    }
    for (int64_t s = 0; s < r->n_steps && !rc; s++) {
        td_step_info si;
        if ((rc = td_tapfile_step(io[0].f, s, &si, err))) break;
        const int64_t T = si.n_tokens, pos0 = si.pos0;
        for (int i = 0; i < n_layers && !rc; i++) {
            td_audit_qsa_layer *L = &r->layers[i];
            for (int a = 0; a < 3 && !rc; a++) {
                if (!io[a].f) continue;
                io[a].NB = -1;
                int64_t W = L->W;
                if ((rc = qsa_read(&io[a], s, layers[i], "qsa_scores", T, &io[a].NB, 0, err))) break;
                if (a < 2 && (rc = qsa_read(&io[a], s, layers[i], "qsa_sel", T, &W, 1, err))) break;
                if (a < 2) L->W = W;
                if (a && io[a].NB != io[0].NB)
                    rc = td_err_set(err, TD_EINPUT, "%s: step %lld: blk.%d.qsa_scores has %lld blocks, %s %lld",
                                    io[a].path, (long long)s, (int)layers[i], (long long)io[a].NB, path,
                                    (long long)io[0].NB);
                if (!rc) rc = qsa_ratio(&io[a], s, layers[i], pos0, T, &L->r, err);
            }
            if (rc) break;
            const int64_t W = L->W, rr = L->r, X = pos0 + T;
            if ((size_t)X > cap_p) {
                cap_p = (size_t)X;
                for (int a = 0; a < 2; a++) {
                    ps[a] = td_xrealloc(ps[a], cap_p * sizeof *ps[a]);
                    sel[a] = td_xrealloc(sel[a], cap_p * sizeof *sel[a]);
                }
                order = td_xrealloc(order, cap_p * sizeof *order);
            }
            scratch_fit(&sc, X);
            for (int64_t t = 0; t < T; t++) {
                const int64_t p = pos0 + t;
                L->n_tokens++;
                if (p + 1 <= W || !rr) continue; // dense: every visible position, no boundary
                L->n_sparse++;
                double noise = 0;
                const int64_t nb = (p + 1) / rr;
                if (io[2].f)
                    for (int64_t b = 0; b < nb; b++) {
                        const double d = fabs(io[2].sc[t * io[2].NB + b] - io[0].sc[t * io[0].NB + b]);
                        if (isfinite(d)) noise = fmax(noise, d);
                    }
                tok_eval ev[2];
                int64_t m[2];
                for (int a = 0; a < r->n_arms; a++) {
                    qsa_pos_scores(&io[a], t, p, rr, ps[a]);
                    m[a] = qsa_row(&io[a], t, W, p, sel[a]);
                    if (m[a] == W) eval_token(&ev[a], &sc, ps[a], sel[a], p + 1, W, noise, io[a].dt);
                }
                // ties at the cut, on the first file's scores
                const int64_t tail = p + 1 - nb * rr;
                double gap, smax;
                int f16;
                const int cut = qsa_cut(io[0].sc + t * io[0].NB, nb, W - tail, rr, order, &gap, &f16, &smax);
                const double thr = fmax(TD_AUDIT_NEAR_K * noise, td_cmp_floor(io[0].dt) * smax);
                L->n_cut += cut;
                if (gap == 0) L->n_exact++;
                L->n_tie_f16 += f16;
                if (gap > 0 && gap <= thr) L->n_near++;
                for (int a = 0; a < r->n_arms; a++) {
                    if (m[a] == W && ev[a].excess <= 0) continue;
                    L->n_not_topw++;
                    if (m[a] == W && ev[a].excess <= ev[a].thr) continue;
                    L->n_not_topw_unexplained++;
                    r->n_unexplained++;
                    if (L->first_unexplained.step < 0)
                        where_fill(&L->first_unexplained, s, t, pos0, -1, sel[a], NULL, W, NULL, NULL, NAN);
                }
                if (r->n_arms < 2 || m[0] != W || m[1] != W) continue;
                mark_selection(&sc, sel[0], p + 1, W);
                int same = 1;
                for (int64_t j = 0; j < W; j++) same &= sc.pos[sel[1][j]] < W;
                if (same) continue;
                L->n_disagree++;
                const double x_ab = selection_excess(&sc, ps[1], p + 1, W);
                mark_selection(&sc, sel[1], p + 1, W);
                const double x_ba = selection_excess(&sc, ps[0], p + 1, W);
                const double on_a = fmax(ev[0].excess, x_ba), on_b = fmax(x_ab, ev[1].excess);
                if (on_a <= 0 || on_b <= 0) {
                    L->n_explained_exact++;
                } else if (on_a <= ev[0].thr || on_b <= ev[1].thr) {
                    L->n_explained_near++;
                } else {
                    L->n_unexplained++;
                    r->n_unexplained++;
                    if (L->first_unexplained.step < 0)
                        where_fill(&L->first_unexplained, s, t, pos0, -1, sel[0], sel[1], W, &ev[0], &ev[1],
                                   fmin(on_a, on_b));
                }
            }
        }
    }
    if (rc) goto fail;
    r->verdict = TD_OK;
    if (!n_layers) {
        r->verdict = TD_DIVERGENT;
        snprintf(r->reason, sizeof r->reason, "no QSA selection taps (blk.L.qsa_sel) in step 0 of %s: nothing audited",
                 path);
    } else if (r->n_unexplained) {
        r->verdict = TD_DIVERGENT;
        for (int i = 0; i < n_layers; i++) {
            const td_audit_where *w = &r->layers[i].first_unexplained;
            if (w->step < 0) continue;
            snprintf(r->reason, sizeof r->reason,
                     "%lld unexplained QSA selection(s); first: layer %d, step %lld, position %lld", (long long)r->n_unexplained,
                     (int)r->layers[i].layer, (long long)w->step, (long long)w->pos);
            break;
        }
    } else {
        snprintf(r->reason, sizeof r->reason, "every QSA selection is a top-W of its scores%s",
                 other ? "; every disagreement explained by a tie at the cut" : "");
    }
    *out = r;
    r = NULL;
fail:
    for (int a = 0; a < 3; a++) {
        td_tapfile_close(io[a].f);
        free(io[a].sc), free(io[a].sel);
    }
    free(layers), free(layers_b), free(order);
    for (int a = 0; a < 2; a++) free(ps[a]), free(sel[a]);
    free(sc.pos), free(sc.taken);
    td_audit_qsa_result_free(r);
    return rc;
}

void td_audit_qsa_print(FILE *f, const td_audit_qsa_result *r) {
    fprintf(f, "| layer | r | W | tokens | sparse | cut block | exact block tie | f16 tie | near | not top-W (unexpl.) |%s\n",
            r->n_arms == 2 ? " disagree | expl. exact | expl. near | unexplained |" : "");
    fprintf(f, "|---|---|---|---|---|---|---|---|---|---|%s\n", r->n_arms == 2 ? "---|---|---|---|" : "");
    for (int i = 0; i < r->n_layers; i++) {
        const td_audit_qsa_layer *L = &r->layers[i];
        fprintf(f, "| %d | %lld | %lld | %lld | %lld | %lld | %lld | %lld | %lld | %lld (%lld) |", (int)L->layer,
                (long long)L->r, (long long)L->W, (long long)L->n_tokens, (long long)L->n_sparse, (long long)L->n_cut,
                (long long)L->n_exact, (long long)L->n_tie_f16, (long long)L->n_near, (long long)L->n_not_topw,
                (long long)L->n_not_topw_unexplained);
        if (r->n_arms == 2)
            fprintf(f, " %lld | %lld | %lld | %lld |", (long long)L->n_disagree, (long long)L->n_explained_exact,
                    (long long)L->n_explained_near, (long long)L->n_unexplained);
        fputc('\n', f);
    }
    fprintf(f, "\nverdict: %s: %s\n", r->verdict == TD_OK ? "PASS" : "FAIL", r->reason);
}
