/* tapdiff state-operations check (stateops.h): the script parser, a dry run
 * that checks the script against the prompt before any arm opens, and the
 * run that judges each forward of the arm against straight-line forwards of
 * the oracle and the control. */
#include "stateops.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compare.h"
#include "faults.h"
#include "profile.h"
#include "runner.h"
#include "tapfile.h"

/* ---- Script ------------------------------------------------------------- */

static int bad_op(td_err *err, const char *op, const char *what) {
    return td_err_set(err, TD_EINPUT, "script operation '%s': %s", op, what);
}

static int parse_count(const char *s, int64_t lo, int64_t *v) {
    char *end;
    long long x = strtoll(s, &end, 10);
    if (!*s || *end || x < lo || x > 1000000) return -1;
    *v = x;
    return 0;
}

static int parse_seq(const char *s, int *v) {
    int64_t x;
    if (parse_count(s, 0, &x) || x >= TD_SEQ_MAX) return -1;
    *v = (int)x;
    return 0;
}

/* One operation: its words in w[0..nw). */
static int parse_op(char **w, int nw, const char *text, td_sop *op, td_err *err) {
    char seqmsg[96];
    snprintf(seqmsg, sizeof seqmsg, "expected a sequence 0..%d", TD_SEQ_MAX - 1);
    op->seq = -1;
    // a trailing "on S" for the operations that take one
    int has_on = nw >= 3 && !strcmp(w[nw - 2], "on");
    if (has_on) {
        if (strcmp(w[0], "prefill") && strcmp(w[0], "feed") && strcmp(w[0], "decode") && strcmp(w[0], "rollback"))
            return bad_op(err, text, "'on S' applies to prefill, feed, decode and rollback");
        if (parse_seq(w[nw - 1], &op->seq)) return bad_op(err, text, seqmsg);
        nw -= 2;
    }
    if (!strcmp(w[0], "prefill")) {
        op->kind = TD_SOP_PREFILL;
        op->n = -1;
        if (nw > 2) return bad_op(err, text, "expected 'prefill [N] [on S]'");
        if (nw == 2 && parse_count(w[1], 1, &op->n)) return bad_op(err, text, "expected a token count >= 1");
    } else if (!strcmp(w[0], "feed")) {
        op->kind = TD_SOP_FEED;
        if (nw != 2) return bad_op(err, text, "expected 'feed T,T,... [on S]'");
        td_err e2 = {{0}};
        if (td_parse_token_list(w[1], "feed", &op->tokens, &op->n_tokens, &e2))
            return bad_op(err, text, e2.msg);
    } else if (!strcmp(w[0], "decode") || !strcmp(w[0], "rollback")) {
        op->kind = w[0][0] == 'd' ? TD_SOP_DECODE : TD_SOP_ROLLBACK;
        if (nw != 2 || parse_count(w[1], 1, &op->n)) return bad_op(err, text, "expected a count >= 1 (and 'on S')");
    } else if (!strcmp(w[0], "copy")) {
        op->kind = TD_SOP_COPY;
        char *arrow = nw == 2 ? strstr(w[1], "->") : NULL;
        if (arrow) {
            *arrow = '\0';
            if (parse_seq(w[1], &op->seq) || parse_seq(arrow + 2, &op->dst)) return bad_op(err, text, seqmsg);
        } else if (nw == 3) {
            if (parse_seq(w[1], &op->seq) || parse_seq(w[2], &op->dst)) return bad_op(err, text, seqmsg);
        } else {
            return bad_op(err, text, "expected 'copy A B' or 'copy A->B'");
        }
        if (op->seq == op->dst) return bad_op(err, text, "a sequence copied onto itself");
    } else if (!strcmp(w[0], "use")) {
        op->kind = TD_SOP_USE;
        if (nw != 2 || parse_seq(w[1], &op->seq)) return bad_op(err, text, seqmsg);
    } else {
        return bad_op(err, text, "expected prefill, feed, decode, rollback, copy or use");
    }
    return TD_OK;
}

int td_sop_parse(const char *text, td_sop_script *out, td_err *err) {
    memset(out, 0, sizeof *out);
    char *buf = td_xstrdup(text ? text : "");
    // comments run to the end of their line
    for (char *c = buf; (c = strchr(c, '#'));)
        while (*c && *c != '\n') *c++ = ' ';
    int cap = 8, rc = TD_OK;
    out->ops = td_xcalloc((size_t)cap, sizeof *out->ops);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ";\n", &save); tok; tok = strtok_r(NULL, ";\n", &save)) {
        while (isspace((unsigned char)*tok)) tok++;
        size_t len = strlen(tok);
        while (len && isspace((unsigned char)tok[len - 1])) tok[--len] = '\0';
        if (!len) continue;
        if (out->n == cap) {
            out->ops = td_xrealloc(out->ops, (size_t)(cap *= 2) * sizeof *out->ops);
            memset(out->ops + out->n, 0, (size_t)(cap - out->n) * sizeof *out->ops);
        }
        td_sop *op = &out->ops[out->n];
        snprintf(op->text, sizeof op->text, "%s", tok);
        char *w[8], *ws = NULL;
        int nw = 0;
        for (char *x = strtok_r(tok, " \t", &ws); x; x = strtok_r(NULL, " \t", &ws)) {
            if (nw == 8) {
                rc = bad_op(err, op->text, "too many words");
                goto out;
            }
            w[nw++] = x;
        }
        out->n++;
        if ((rc = parse_op(w, nw, op->text, op, err))) goto out;
    }
    if (!out->n) rc = td_err_set(err, TD_EINPUT, "the script has no operation");
out:
    free(buf);
    if (rc) td_sop_script_free(out);
    return rc;
}

void td_sop_script_free(td_sop_script *s) {
    for (int i = 0; s->ops && i < s->n; i++) free(s->ops[i].tokens);
    free(s->ops);
    memset(s, 0, sizeof *s);
}

/* ---- Dry run -------------------------------------------------------------- */

/* Sequence lengths as the script leaves them: the longest (the context the
 * arms need), whether state operations are used, and every impossible step
 * refused before an arm opens. */
static int dry_run(const td_sop_config *c, int64_t *max_len, int *needs_state, td_err *err) {
    int64_t len[TD_SEQ_MAX] = {0};
    int cur = 0;
    *max_len = 0;
    *needs_state = 0;
    for (int i = 0; i < c->script->n; i++) {
        const td_sop *op = &c->script->ops[i];
        int s = op->seq >= 0 ? op->seq : cur;
        if (op->kind != TD_SOP_ROLLBACK && op->kind != TD_SOP_COPY) cur = s;
        if (s != 0 || op->kind == TD_SOP_ROLLBACK || op->kind == TD_SOP_COPY) *needs_state = 1;
        switch (op->kind) {
        case TD_SOP_PREFILL:
            if (op->n > c->n_prompt)
                return td_err_set(err, TD_EINPUT, "'%s': the prompt has only %lld tokens", op->text,
                                  (long long)c->n_prompt);
            len[s] += op->n < 0 ? c->n_prompt : op->n;
            break;
        case TD_SOP_FEED: len[s] += op->n_tokens; break;
        case TD_SOP_DECODE:
            if (!len[s])
                return td_err_set(err, TD_EINPUT, "'%s': sequence %d is empty: nothing to decode from",
                                  op->text, s);
            len[s] += op->n;
            break;
        case TD_SOP_ROLLBACK:
            if (op->n > len[s])
                return td_err_set(err, TD_EINPUT, "'%s': sequence %d holds only %lld positions",
                                  op->text, s, (long long)len[s]);
            len[s] -= op->n;
            break;
        case TD_SOP_COPY: len[op->dst] = len[op->seq]; break;
        case TD_SOP_USE: break;
        }
        for (int q = 0; q < TD_SEQ_MAX; q++)
            if (len[q] > *max_len) *max_len = len[q];
    }
    if (!*max_len) return td_err_set(err, TD_EINPUT, "the script runs no forward");
    return TD_OK;
}

/* ---- Judging one row ------------------------------------------------------ */

static double lse(const double *x, int64_t n) {
    double m = -INFINITY, s = 0;
    for (int64_t i = 0; i < n; i++)
        if (x[i] > m) m = x[i];
    for (int64_t i = 0; i < n; i++) s += exp(x[i] - m);
    return m + log(s);
}

static int64_t argmax(const double *x, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* ||x - y|| / ||y|| over finite pairs; *nonfinite: a pair finite in one only. */
static double rel_err(const double *x, const double *y, int64_t n, int *nonfinite) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isfinite(x[i]) != isfinite(y[i])) {
            if (nonfinite) *nonfinite = 1;
            continue;
        }
        if (!isfinite(x[i])) continue;
        const double d = x[i] - y[i];
        num += d * d;
        den += y[i] * y[i];
    }
    return den > 0 ? sqrt(num / den) : (num > 0 ? 1.0 : 0.0);
}

/* b (the arm) against a (the oracle) with c (the control, or NULL): the same
 * rules as compare.h's out.logits rows. */
static void judge_row(const double *a, const double *b, const double *c, int64_t V, double k, double floor_,
                      td_sop_step *st, int64_t pos) {
    int nonfinite = 0;
    const double err = rel_err(b, a, V, &nonfinite);
    const double err_ctrl = c ? rel_err(c, a, V, NULL) : NAN;
    double budget = c ? k * err_ctrl : 0;
    if (!(budget > floor_)) budget = floor_;
    const double ratio = err / budget;
    int fail = nonfinite ? TD_CMPF_NONFINITE : ratio > 1 ? TD_CMPF_BUDGET : TD_CMPF_OK;
    if (!fail) {
        double na = 0;
        for (int64_t i = 0; i < V; i++) na += a[i] * a[i];
        na = sqrt(na);
        const int64_t ta = argmax(a, V), tb = argmax(b, V);
        if (ta != tb && a[ta] - a[tb] > 2 * budget * na) fail = TD_CMPF_TOP1;
        const double la = lse(a, V), lb = lse(b, V);
        double kl = 0;
        for (int64_t i = 0; i < V; i++) {
            const double pa = exp(a[i] - la);
            kl += pa * ((a[i] - la) - (b[i] - lb));
        }
        if (!fail && kl > (budget * na) * (budget * na)) fail = TD_CMPF_KL;
    }
    // the row that decides the step: the first failing one, else the largest ratio
    if ((fail && !st->fail) || (!st->fail && ratio > st->ratio) || st->ratio != st->ratio) {
        st->err = err, st->err_ctrl = err_ctrl, st->budget = budget, st->ratio = ratio, st->row_pos = pos;
        st->fail = fail;
    }
}

/* ---- The run -------------------------------------------------------------- */

typedef struct sop_seq {
    int32_t *toks; /* the tokens it holds, position order */
    int32_t *next; /* the arm's argmax at each position */
    int64_t len;
} sop_seq;

static int open_arm(const char *name, const td_model *m, const td_backend_params *p, td_backend **b,
                    const td_backend_vt **vt, td_err *err) {
    *vt = td_backend_find(name);
    if (!*vt) {
        const char *absent = td_backend_absent_reason(name);
        if (absent) return td_err_set(err, TD_SKIP, "%s", absent);
        char names[256];
        td_backend_names(names, sizeof names);
        return td_err_set(err, TD_EUSAGE, "backend '%s' is unknown (built: %s)", name, names);
    }
    int rc = td_fault_check_backend(*vt, p->inject, err);
    if (rc) return rc;
    return (*vt)->open(b, m, p, err);
}

/* One forward, its taps (path != NULL) into a tap file of that one step. */
static int forward_taps(td_backend *b, const int32_t *toks, int64_t T, int64_t pos0, const char *path, double *logits,
                        td_err *err) {
    td_tap_sink *s = NULL;
    int rc = TD_OK;
    if (path) {
        td_tap_options opt = td_tap_options_default();
        opt.compress = 0; // a scratch file read once: no time on deflate
        if ((rc = td_tap_sink_open(&s, path, &opt, err))) return rc;
        rc = td_tap_step_begin(s, pos0 == 0 ? TD_STEP_PREFILL : TD_STEP_DECODE, pos0, T, err);
    }
    if (!rc) rc = b->vt->forward(b, toks, T, pos0, s, logits, err);
    if (s) {
        if (!rc) rc = td_tap_step_end(s, err);
        td_err e2 = {{0}};
        const int crc = td_tap_sink_close(s, &e2);
        if (!rc && crc) rc = crc, *err = e2;
    }
    return rc;
}

/* Straight-line forward of toks[0..n) on a fresh state: rows [n, V]. */
static int straight(td_backend *b, const int32_t *toks, int64_t n, const char *path, double *logits, td_err *err) {
    b->vt->reset(b);
    return forward_taps(b, toks, n, 0, path, logits, err);
}

/* The rows [pos0, pos0 + T) of tap `ti` in a straight-line file f: NULL when
 * f lacks it (or its data, or its shape differs past the first dimension). */
static double *oracle_rows(const td_tapfile *f, const td_tap_info *ti, int64_t pos0, int64_t T, td_err *err) {
    td_tap_info o;
    td_err e2 = {{0}};
    if (!f || td_tapfile_tap(f, 0, ti->name, &o, &e2) || !o.has_data || o.ndim != ti->ndim || o.shape[0] < pos0 + T)
        return NULL;
    for (int d = 1; d < o.ndim; d++)
        if (o.shape[d] != ti->shape[d]) return NULL;
    double *x = td_xmalloc(ti->count * sizeof *x);
    if (td_tapfile_read_rows_f64(f, 0, ti->name, pos0, T, x, ti->count, err)) {
        free(x);
        return NULL;
    }
    return x;
}

/* A qsa_sel tap's mismatches in rows that differ from the oracle only
 * inside the boundary group (compare's rule, td_cmp_qsa_row_explained): the
 * block scores are the arm's qsa_scores of the step, or the oracle's rows of
 * it (more columns: its cache held more positions), the tolerance the floor
 * of the tap's dtype times the row's largest score. Returns how many of the
 * mismatches such rows hold. */
static uint64_t qsa_sel_tied(const td_tapfile *fa, const td_tapfile *fo, const td_tap_info *t, const double *a,
                             const double *o, int64_t pos0, const td_hparams *hp) {
    int layer = -1;
    if (!hp || t->ndim != 2 || sscanf(t->name, "blk.%d.qsa_sel", &layer) != 1 || layer < 0 || layer >= 256 ||
        (uint32_t)layer >= hp->n_layer || !hp->qsa_ratio[layer])
        return 0;
    const int64_t T = t->shape[0], W = t->shape[1], r = hp->qsa_ratio[layer];
    char name[TD_TAP_NAME_MAX];
    snprintf(name, sizeof name, "blk.%d.qsa_scores", layer);
    td_tap_info sa = {0}, so = {0};
    td_err e2 = {{0}};
    double *xa = NULL, *xo = NULL;
    int64_t na = 0, no = 0;
    if (!td_tapfile_tap(fa, 0, name, &sa, &e2) && sa.has_data && sa.ndim == 2 && sa.shape[0] == T) {
        na = sa.shape[1];
        xa = td_xmalloc((size_t)(T * na + 1) * sizeof *xa);
        if (td_tapfile_read_f64(fa, 0, name, xa, sa.count, &e2)) na = 0;
    }
    if (!td_tapfile_tap(fo, 0, name, &so, &e2) && so.has_data && so.ndim == 2 && so.shape[0] >= pos0 + T) {
        no = so.shape[1];
        xo = td_xmalloc((size_t)(T * no + 1) * sizeof *xo);
        if (td_tapfile_read_rows_f64(fo, 0, name, pos0, T, xo, (uint64_t)(T * no), &e2)) no = 0;
    }
    int64_t *ra = td_xmalloc((size_t)W * sizeof *ra), *ro = td_xmalloc((size_t)W * sizeof *ro);
    uint64_t tied = 0;
    for (int64_t row = 0; row < T; row++) {
        uint64_t mis = 0;
        for (int64_t j = 0; j < W; j++) {
            ra[j] = (int64_t)a[row * W + j], ro[j] = (int64_t)o[row * W + j];
            mis += ra[j] != ro[j];
        }
        const int64_t nbt = (pos0 + row + 1) / r; // this token's complete blocks
        int ok = 0;
        for (int which = 0; mis && which < 2 && !ok; which++) {
            const double *x = which ? xo : xa;
            const int64_t n = which ? no : na;
            if (!x || n < nbt) continue;
            double top = 0;
            for (int64_t b = 0; b < nbt; b++) top = fmax(top, fabs(x[row * n + b]));
            ok = td_cmp_qsa_row_explained(ro, ra, W, x + row * n, nbt, r, td_cmp_floor(which ? so.dtype : sa.dtype) * top);
        }
        if (ok) tied += mis;
    }
    free(xa), free(xo), free(ra), free(ro);
    return tied;
}

/* The arm's taps of one step against the oracle's rows of the same
 * positions, in the arm's execution order; st gets the deciding tap. */
static int judge_taps(const char *pa, const char *po, const char *pc, int64_t pos0, int64_t T, double k,
                      const td_hparams *hp, td_sop_step *st, td_err *err) {
    td_tapfile *fa = NULL, *fo = NULL, *fc = NULL;
    td_tap_info *taps = NULL;
    int64_t n = 0;
    int rc;
    if ((rc = td_tapfile_open(&fa, pa, err)) || (rc = td_tapfile_open(&fo, po, err)) ||
        (pc && (rc = td_tapfile_open(&fc, pc, err))) || (rc = td_tapfile_step_taps(fa, 0, &taps, &n, err)))
        goto out;
    double big_ctrl = 0; // the largest control error so far in the step
    for (int64_t i = 0; i < n; i++) {
        const td_tap_info *t = &taps[i];
        // the history is a window: a rollback cannot restore what it dropped
        if (!strcmp(t->name, "hist.tokens") || !t->has_data || t->ndim < 1 || t->shape[0] != T || !t->count) continue;
        double *o = oracle_rows(fo, t, pos0, T, err);
        if (!o) continue;
        double *c = oracle_rows(fc, t, pos0, T, err);
        double *a = td_xmalloc(t->count * sizeof *a);
        if ((rc = td_tapfile_read_f64(fa, 0, t->name, a, t->count, err))) {
            free(a), free(o), free(c);
            goto out;
        }
        double e, ec = NAN, budget;
        int fail = TD_CMPF_OK, nonfinite = 0;
        if (td_dtype_is_int(t->dtype)) {
            uint64_t bad = 0;
            for (uint64_t j = 0; j < t->count; j++) bad += a[j] != o[j];
            if (bad) bad -= qsa_sel_tied(fa, fo, t, a, o, pos0, hp); // a tie at the QSA budget's cut
            e = (double)bad / (double)t->count;
            budget = 0;
            if (bad) fail = TD_CMPF_INTEGER;
        } else {
            e = rel_err(a, o, (int64_t)t->count, &nonfinite);
            if (c) {
                ec = rel_err(c, o, (int64_t)t->count, NULL);
                if (t->count < TD_CMP_SMALL_TAP && big_ctrl > ec) ec = big_ctrl;
                if (ec > big_ctrl) big_ctrl = ec;
            }
            budget = c ? k * ec : 0;
            const double fl = td_cmp_floor(t->dtype);
            if (!(budget > fl)) budget = fl;
            fail = nonfinite ? TD_CMPF_NONFINITE : e > budget ? TD_CMPF_BUDGET : TD_CMPF_OK;
        }
        const double ratio = fail == TD_CMPF_INTEGER ? INFINITY : budget > 0 ? e / budget : 0;
        st->n_taps++;
        if ((fail && !st->fail) || (!st->fail && !(ratio <= st->ratio))) {
            st->err = e, st->err_ctrl = ec, st->budget = budget, st->ratio = ratio, st->fail = fail;
            st->row_pos = pos0;
            snprintf(st->tap, sizeof st->tap, "%s", t->name);
        }
        free(a), free(o), free(c);
    }
out:
    free(taps);
    td_tapfile_close(fa), td_tapfile_close(fo), td_tapfile_close(fc);
    return rc;
}

int td_sop_run(const td_sop_config *c, td_sop_result *r, td_err *err) {
    memset(r, 0, sizeof *r);
    r->first.step = r->worst.step = -1;
    if (!c->script || !c->script->n) return td_err_set(err, TD_EUSAGE, "no script");
    int64_t max_len;
    int needs_state;
    int rc = dry_run(c, &max_len, &needs_state, err);
    if (rc) return rc;
    const td_model *m = c->model;
    const int64_t V = m->hp.n_vocab;
    for (int64_t i = 0; i < c->n_prompt; i++)
        if (c->prompt[i] < 0 || c->prompt[i] >= V)
            return td_err_set(err, TD_EINPUT, "prompt token %lld is id %d: the model has %lld ids",
                              (long long)i, c->prompt[i], (long long)V);
    for (int i = 0; i < c->script->n; i++)
        for (int64_t t = 0; t < c->script->ops[i].n_tokens; t++)
            if (c->script->ops[i].tokens[t] >= V)
                return td_err_set(err, TD_EINPUT, "'%s': token id %d: the model has %lld ids",
                                  c->script->ops[i].text, c->script->ops[i].tokens[t], (long long)V);
    if (m->hp.n_ctx_train > 0 && (uint64_t)max_len > m->hp.n_ctx_train)
        return td_err_set(err, TD_EUSAGE, "the script needs %lld positions, over the model's context %u",
                          (long long)max_len, (unsigned)m->hp.n_ctx_train);

    const char *oracle = c->oracle ? c->oracle : "ref";
    const char *control = c->control ? c->control : "ref32";
    if (!strcmp(control, "none")) control = NULL;
    const double k = c->k > 0 ? c->k : TD_CMP_K_DEFAULT;

    td_backend *arm = NULL, *ora = NULL, *ctl = NULL;
    const td_backend_vt *avt, *ovt, *cvt;
    sop_seq seqs[TD_SEQ_MAX] = {{0}};
    char *pa = NULL, *po = NULL, *pc = NULL;
    if (c->tap_dir) {
        const size_t n = strlen(c->tap_dir) + 32;
        pa = td_xmalloc(n), po = td_xmalloc(n), pc = td_xmalloc(n);
        snprintf(pa, n, "%s/step-arm.h5", c->tap_dir);
        snprintf(po, n, "%s/step-oracle.h5", c->tap_dir);
        snprintf(pc, n, "%s/step-control.h5", c->tap_dir);
    }
    double *la = NULL, *lo = NULL, *lc = NULL;
    td_backend_params ap = {.threads = c->threads, .n_ctx = (uint32_t)max_len, .inject = c->inject,
                            .n_seq = TD_SEQ_MAX};
    if ((rc = open_arm(c->arm, m, &ap, &arm, &avt, err))) goto out;
    if (needs_state && !(avt->seq_rm && avt->seq_cp && avt->seq_use)) {
        rc = td_err_set(err, TD_SKIP, "arm '%s' has no state operations (seq_rm, seq_cp, seq_use)",
                        avt->name);
        goto out;
    }
    const char *own = avt->profile_of ? avt->profile_of(arm) : NULL;
    snprintf(r->profile, sizeof r->profile, "%s",
             own && own[0] ? own : avt->profile ? avt->profile : TD_PROFILE_NATIVE);
    snprintf(r->version, sizeof r->version, "%s", avt->version ? avt->version(arm) : avt->name);
    // the oracle and the control compute with the arm's declared arithmetic, as bisect's three-arm mode
    td_backend_params op = {.threads = c->threads, .n_ctx = (uint32_t)max_len, .profile = r->profile};
    if ((rc = open_arm(oracle, m, &op, &ora, &ovt, err))) goto out;
    if (control && (rc = open_arm(control, m, &op, &ctl, &cvt, err))) goto out;
    const double floor_ = td_cmp_floor(avt->precision && !strcmp(avt->precision, "f64") ? TD_DT_F64 : TD_DT_F32);

    la = td_xmalloc((size_t)(max_len * V) * sizeof *la);
    lo = td_xmalloc((size_t)(max_len * V) * sizeof *lo);
    lc = td_xmalloc((size_t)(max_len * V) * sizeof *lc);
    for (int q = 0; q < TD_SEQ_MAX; q++) {
        seqs[q].toks = td_xcalloc((size_t)max_len, sizeof(int32_t));
        seqs[q].next = td_xcalloc((size_t)max_len, sizeof(int32_t));
    }
    int cur = 0;
    int64_t step = 0;
    r->verdict = TD_OK;
    r->worst.ratio = -1;
    for (int i = 0; i < c->script->n; i++) {
        const td_sop *o = &c->script->ops[i];
        const int s = o->seq >= 0 ? o->seq : cur;
        sop_seq *q = &seqs[s];
        if (o->kind == TD_SOP_ROLLBACK) {
            if ((rc = avt->seq_rm(arm, s, q->len - o->n, err))) goto out;
            q->len -= o->n;
            continue;
        }
        if (o->kind == TD_SOP_COPY) {
            if ((rc = avt->seq_cp(arm, o->seq, o->dst, err))) goto out;
            sop_seq *d = &seqs[o->dst];
            memcpy(d->toks, seqs[o->seq].toks, (size_t)seqs[o->seq].len * sizeof(int32_t));
            memcpy(d->next, seqs[o->seq].next, (size_t)seqs[o->seq].len * sizeof(int32_t));
            d->len = seqs[o->seq].len;
            continue;
        }
        if (s != cur) {
            if ((rc = avt->seq_use(arm, s, err))) goto out;
            cur = s;
        }
        if (o->kind == TD_SOP_USE) continue;
        const int64_t n_fwd = o->kind == TD_SOP_DECODE ? o->n : 1;
        for (int64_t f = 0; f < n_fwd; f++) {
            const int32_t *toks;
            int64_t T;
            if (o->kind == TD_SOP_PREFILL) toks = c->prompt, T = o->n < 0 ? c->n_prompt : o->n;
            else if (o->kind == TD_SOP_FEED) toks = o->tokens, T = o->n_tokens;
            else toks = &q->next[q->len - 1], T = 1;
            const int64_t pos0 = q->len;
            memcpy(q->toks + pos0, toks, (size_t)T * sizeof(int32_t));
            if ((rc = forward_taps(arm, q->toks + pos0, T, pos0, pa, la, err))) goto out;
            q->len += T;
            for (int64_t t = 0; t < T; t++) q->next[pos0 + t] = (int32_t)argmax(la + t * V, V);
            // the same tokens, straight: no state operation between them
            if ((rc = straight(ora, q->toks, q->len, po, lo, err))) goto out;
            if (ctl && (rc = straight(ctl, q->toks, q->len, pc, lc, err))) goto out;
            td_sop_step st = {.step = step, .op = i, .op_text = o->text, .seq = s, .pos0 = pos0, .n_tokens = T,
                              .ratio = NAN, .tap = "out.logits"};
            for (int64_t t = 0; t < T; t++)
                judge_row(lo + (pos0 + t) * V, la + t * V, ctl ? lc + (pos0 + t) * V : NULL, V, k, floor_, &st,
                          pos0 + t);
            if (pa) {
                // the taps decide unless only the logits rows' top-1 / KL rules failed
                td_sop_step ts = st;
                ts.fail = 0, ts.ratio = NAN;
                if ((rc = judge_taps(pa, po, ctl ? pc : NULL, pos0, T, k, &m->hp, &ts, err))) goto out;
                if (ts.fail || (!st.fail && ts.ratio > st.ratio)) st = ts;
                else st.n_taps = ts.n_taps;
                r->n_taps += st.n_taps;
            }
            if (c->on_step) c->on_step(c->user, &st);
            if (st.fail && r->verdict == TD_OK) r->verdict = TD_DIVERGENT, r->first = st;
            if (st.ratio > r->worst.ratio) r->worst = st;
            step++;
        }
    }
    r->n_steps = step;
out:
    if (arm) avt->close(arm);
    if (ora) ovt->close(ora);
    if (ctl) cvt->close(ctl);
    for (int q = 0; q < TD_SEQ_MAX; q++) free(seqs[q].toks), free(seqs[q].next);
    free(la), free(lo), free(lc);
    if (pa) remove(pa), remove(po), remove(pc);
    free(pa), free(po), free(pc);
    return rc;
}
