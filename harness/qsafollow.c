/* tapdiff: the oracle follows an arm's explained QSA selection (qsafollow.h). */
#include "qsafollow.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tapfile.h"

typedef struct pin_list {
    td_qsa_pin *pins;
    int n, cap;
} pin_list;

static void pins_free(pin_list *l) {
    for (int i = 0; i < l->n; i++) free((void *)l->pins[i].sel);
    free(l->pins);
    memset(l, 0, sizeof *l);
}

/* The positions of a qsa_sel row as a set: ascending, -1 pads last. */
static void as_set(int64_t *out, const int64_t *row, int64_t W) {
    memcpy(out, row, (size_t)W * sizeof *out);
    for (int64_t j = 0; j < W; j++)
        if (out[j] < 0) out[j] = INT64_MAX;
    td_sort_i64(out, (size_t)W);
    for (int64_t j = 0; j < W; j++)
        if (out[j] == INT64_MAX) out[j] = -1;
}

/* A tap of the step, or 0 when the file lacks it. */
static int has_tap(const td_tapfile *f, int64_t step, const char *name, td_tap_info *ti) {
    td_err e = {{0}};
    return td_tapfile_tap(f, step, name, ti, &e) == TD_OK && ti->has_data;
}

/* The qsa_sel rows of one step and layer where B's selection differs from
 * A's as a set and compare explains it, appended to l. */
static int collect_tap(const td_tapfile *fa, const td_tapfile *fb, const td_tapfile *fc, int64_t step, int layer,
                       int64_t r, const td_tap_info *ib, pin_list *l, td_err *err) {
    char sname[TD_TAP_NAME_MAX];
    snprintf(sname, sizeof sname, "blk.%d.qsa_scores", layer);
    td_tap_info ia, xa_i, xb_i, xc_i, ip;
    if (!has_tap(fa, step, ib->name, &ia) || ia.ndim != 2 || ia.shape[0] != ib->shape[0] ||
        ia.shape[1] != ib->shape[1] || !has_tap(fa, step, sname, &xa_i) || !has_tap(fb, step, sname, &xb_i) ||
        !has_tap(fa, step, "inp.pos", &ip))
        return TD_OK; // no complete block yet: every query is dense, nothing can tie
    const int64_t T = ib->shape[0], W = ib->shape[1];
    if (xa_i.ndim != 2 || xa_i.shape[0] != T || xb_i.ndim != 2 || xb_i.shape[0] != T ||
        xb_i.shape[1] != xa_i.shape[1] || ip.count != (uint64_t)T || W < 1)
        return TD_OK;
    const int64_t nb = xa_i.shape[1];
    const int ctrl = fc && has_tap(fc, step, sname, &xc_i) && xc_i.ndim == 2 && xc_i.shape[0] == T &&
                     xc_i.shape[1] == nb;
    const size_t nsel = (size_t)(T * W), nsc = (size_t)(T * nb > 0 ? T * nb : 1);
    int64_t *va = td_xmalloc(nsel * sizeof *va), *vb = td_xmalloc(nsel * sizeof *vb), *pos = td_xmalloc((size_t)T * sizeof *pos);
    int64_t *sa = td_xmalloc((size_t)W * sizeof *sa), *sb = td_xmalloc((size_t)W * sizeof *sb);
    double *xa = td_xmalloc(nsc * sizeof *xa), *xb = td_xmalloc(nsc * sizeof *xb), *xc = ctrl ? td_xmalloc(nsc * sizeof *xc) : NULL;
    int rc = td_tapfile_read_i64(fa, step, ib->name, va, nsel, err);
    if (!rc) rc = td_tapfile_read_i64(fb, step, ib->name, vb, nsel, err);
    if (!rc) rc = td_tapfile_read_i64(fa, step, "inp.pos", pos, (uint64_t)T, err);
    if (!rc) rc = td_tapfile_read_f64(fa, step, sname, xa, (uint64_t)(T * nb), err);
    if (!rc) rc = td_tapfile_read_f64(fb, step, sname, xb, (uint64_t)(T * nb), err);
    if (!rc && ctrl) rc = td_tapfile_read_f64(fc, step, sname, xc, (uint64_t)(T * nb), err);
    for (int64_t t = 0; !rc && t < T; t++) {
        const int64_t *ra = va + t * W, *rb = vb + t * W;
        as_set(sa, ra, W);
        as_set(sb, rb, W);
        if (!memcmp(sa, sb, (size_t)W * sizeof *sa)) continue;
        // compare's rule, on A's scores or on B's (compare.c qsa_sel_ties)
        const double *ya = xa + t * nb, *yb = xb + t * nb;
        int64_t k = 0; // this token's complete blocks: before the first -1
        while (k < nb && ya[k] >= 0) k++;
        const double thr = td_cmp_qsa_tie_thr(ya, yb, ctrl ? ya : NULL, ctrl ? xc + t * nb : NULL, nb, xb_i.dtype);
        if (!td_cmp_qsa_row_explained(ra, rb, W, ya, k, r, thr) && !td_cmp_qsa_row_explained(ra, rb, W, yb, k, r, thr))
            continue;
        int32_t n = 0, ok = 1;
        for (int64_t j = 0; j < W && sb[j] >= 0; j++, n++)
            if (sb[j] > pos[t] || (j > 0 && sb[j] == sb[j - 1])) ok = 0;
        if (!ok || n == 0) continue; // not a selection of this query: never taken
        int32_t *sel = td_xmalloc((size_t)n * sizeof *sel);
        for (int32_t j = 0; j < n; j++) sel[j] = (int32_t)sb[j];
        if (l->n == l->cap) {
            l->cap = l->cap ? 2 * l->cap : 64;
            l->pins = td_xrealloc(l->pins, (size_t)l->cap * sizeof *l->pins);
        }
        l->pins[l->n++] = (td_qsa_pin){.layer = layer, .pos = pos[t], .step = step, .n = n, .sel = sel};
    }
    free(va), free(vb), free(pos), free(sa), free(sb), free(xa), free(xb), free(xc);
    return rc;
}

/* Every explained, differing qsa_sel row of B's file against A's (control C, or NULL). */
static int collect(const char *pa, const char *pb, const char *pc, const td_model *m, pin_list *l, td_err *err) {
    td_tapfile *fa = NULL, *fb = NULL, *fc = NULL;
    int rc = td_tapfile_open(&fa, pa, err);
    if (!rc) rc = td_tapfile_open(&fb, pb, err);
    if (!rc && pc) rc = td_tapfile_open(&fc, pc, err);
    const int64_t ns = rc ? 0 : td_tapfile_n_steps(fb) < td_tapfile_n_steps(fa) ? td_tapfile_n_steps(fb)
                                                                               : td_tapfile_n_steps(fa);
    for (int64_t s = 0; !rc && s < ns; s++) {
        td_tap_info *taps = NULL;
        int64_t nt = 0;
        if ((rc = td_tapfile_step_taps(fb, s, &taps, &nt, err))) break;
        for (int64_t i = 0; !rc && i < nt; i++) {
            int layer = -1, k = 0;
            const td_tap_info *t = &taps[i];
            if (sscanf(t->name, "blk.%d.qsa_sel%n", &layer, &k) != 1 || t->name[k] || layer < 0 ||
                (uint32_t)layer >= m->hp.n_layer || layer >= 256 || !m->hp.qsa_ratio[layer] || t->ndim != 2 ||
                !t->has_data || !td_dtype_is_int(t->dtype))
                continue;
            rc = collect_tap(fa, fb, fc, s, layer, m->hp.qsa_ratio[layer], t, l, err);
        }
        free(taps);
    }
    td_tapfile_close(fa), td_tapfile_close(fb), td_tapfile_close(fc);
    return rc;
}

static int same_pins(const pin_list *x, const td_qsa_follow_report *y) {
    if (x->n != y->n_rows) return 0;
    for (int i = 0; i < x->n; i++) {
        const td_qsa_pin *a = &x->pins[i], *b = &y->pins[i];
        if (a->layer != b->layer || a->pos != b->pos || a->n != b->n ||
            memcmp(a->sel, b->sel, (size_t)a->n * sizeof *a->sel))
            return 0;
    }
    return 1;
}

static int rerun(const td_run_config *base, const char *path, td_err *err) {
    td_run_config c = *base;
    c.tap_path = path;
    c.on_step = NULL;
    td_run_result res = {0};
    int rc = td_run(&c, &res, err);
    if (rc == TD_OK) td_run_result_free(&res);
    return rc;
}

static void count_layers(td_qsa_follow_report *rep) {
    rep->n_layers = 0;
    for (int i = 0; i < rep->n_rows; i++) {
        int seen = 0;
        for (int j = 0; j < i && !seen; j++) seen = rep->pins[j].layer == rep->pins[i].layer;
        rep->n_layers += !seen;
    }
}

int td_qsa_follow(const td_run_config *oracle, const td_run_config *control, const char *b_path,
                  const td_cmp_options *o, td_cmp_result **r, td_qsa_follow_report *rep, td_err *err) {
    memset(rep, 0, sizeof *rep);
    TD_ASSERT(oracle->tap_path && oracle->decode == TD_DECODE_PINNED && *r);
    TD_ASSERT(!control || (control->tap_path && control->decode == TD_DECODE_PINNED));
    const char *off = getenv("TD_QSA_FOLLOW");
    if (off && !strcmp(off, "0")) return TD_OK;
    td_model *own = NULL;
    const td_model *m = oracle->model;
    int rc = TD_OK;
    if (!m) {
        if ((rc = td_model_open(&own, oracle->model_path, err))) return rc;
        m = own;
    }
    int any = 0; // a qwen4exp-like model: some layer selects
    for (uint32_t i = 0; i < m->hp.n_layer && i < 256; i++) any |= m->hp.qsa_ratio[i] != 0;
    char try_path[1024], try_ctrl[1024];
    snprintf(try_path, sizeof try_path, "%s.qsa.h5", oracle->tap_path);
    if (control) snprintf(try_ctrl, sizeof try_ctrl, "%s.qsa.h5", control->tap_path);
    const char *ctrl_path = control ? control->tap_path : NULL;
    for (int round = 0; any && rc == TD_OK && (*r)->verdict != TD_OK && round < TD_QSA_FOLLOW_ROUNDS; round++) {
        pin_list l = {0};
        if ((rc = collect(oracle->tap_path, b_path, ctrl_path, m, &l, err)) || same_pins(&l, rep)) {
            pins_free(&l);
            break;
        }
        td_qsa_follow_free(rep);
        rep->pins = l.pins, rep->n_rows = l.n; // owned by rep from here
        td_qsa_pins_begin(rep->pins, rep->n_rows);
        rc = rerun(oracle, try_path, err);
        if (rc == TD_OK && control) rc = rerun(control, try_ctrl, err);
        td_qsa_pins_end();
        rep->n_reruns = round + 1;
        if (rc) break;
        if (rename(try_path, oracle->tap_path) || (control && rename(try_ctrl, control->tap_path))) {
            rc = td_err_set(err, TD_EINTERNAL, "qsa follow: cannot replace %s with its rerun", oracle->tap_path);
            break;
        }
        td_cmp_options o2 = *o;
        o2.control = ctrl_path;
        td_cmp_result *r2 = NULL;
        if ((rc = td_compare(oracle->tap_path, b_path, &o2, &r2, err))) break;
        td_cmp_result_free(*r);
        *r = r2;
    }
    count_layers(rep);
    remove(try_path);
    if (control) remove(try_ctrl);
    if (own) td_model_close(own);
    return rc;
}

void td_qsa_follow_pins_begin(const td_qsa_follow_report *rep) { td_qsa_pins_begin(rep->pins, rep->n_rows); }

void td_qsa_follow_free(td_qsa_follow_report *rep) {
    pin_list l = {.pins = rep->pins, .n = rep->n_rows};
    pins_free(&l);
    rep->pins = NULL;
    rep->n_rows = rep->n_layers = 0;
}

void td_qsa_follow_describe(const td_qsa_follow_report *rep, char *buf, size_t n) {
    size_t w = 0;
    if (n) buf[0] = '\0';
    if (!rep->n_rows) return;
    for (int i = 0; i < rep->n_rows && w < n; i++) {
        int seen = 0, c = 0;
        for (int j = 0; j < i && !seen; j++) seen = rep->pins[j].layer == rep->pins[i].layer;
        if (seen) continue;
        for (int j = i; j < rep->n_rows; j++) c += rep->pins[j].layer == rep->pins[i].layer;
        const int k = snprintf(buf + w, n - w, "%sblk.%d: %d row(s)", w ? ", " : "", rep->pins[i].layer, c);
        if (k < 0) return;
        w += (size_t)k;
    }
    if (w < n) snprintf(buf + w, n - w, "; %d oracle rerun(s)", rep->n_reruns);
}

int td_qsa_follow_record(const char *path, const td_qsa_follow_report *rep, td_err *err) {
    size_t cap = 1, w = 0;
    for (int i = 0; i < rep->n_rows; i++) cap += 64 + 12 * (size_t)rep->pins[i].n;
    char *s = td_xmalloc(cap);
    s[0] = '\0';
    for (int i = 0; i < rep->n_rows && w < cap; i++) {
        const td_qsa_pin *p = &rep->pins[i];
        w += (size_t)snprintf(s + w, cap - w, "%s%lld:%d:%lld:", i ? " " : "", (long long)p->step, p->layer,
                              (long long)p->pos);
        for (int32_t j = 0; j < p->n && w < cap; j++)
            w += (size_t)snprintf(s + w, cap - w, "%s%d", j ? "," : "", p->sel[j]);
    }
    const int rc = td_tapfile_attr_put(path, "qsa_taken", s, NULL, err);
    free(s);
    return rc;
}
