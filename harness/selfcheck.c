/* tapdiff token-history self-check (selfcheck.h): walks one tap file step
 * by step and checks that greedy decoding fed back its own argmax and that
 * hist.tokens is the tail of what was consumed. */
#include "selfcheck.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tapfile.h"

static void report_init(td_selfcheck_report *rep) {
    memset(rep, 0, sizeof *rep);
    rep->verdict = TD_OK;
    rep->fail_step = -1;
    rep->fail_index = -1;
    rep->expected = rep->found = -1;
}

/* The values of a 1-D integer tap: from its data, or from its fingerprint
 * when it holds at most four. *ok = 0 when neither is possible. */
static int read_ints(const td_tapfile *f, int64_t step, const td_tap_info *ti, int64_t *dst, int *ok, td_err *err) {
    *ok = 0;
    if (ti->has_data) {
        int rc = td_tapfile_read_i64(f, step, ti->name, dst, ti->count, err);
        if (rc) return rc;
        *ok = 1;
    } else if (ti->count <= 4) {
        for (uint64_t i = 0; i < ti->count; i++) dst[i] = (int64_t)ti->fp.first[i];
        *ok = 1;
    }
    return TD_OK;
}

static int is_int_1d(const td_tap_info *ti) { return ti->ndim == 1 && td_dtype_is_int(ti->dtype); }

int td_selfcheck_file(const char *path, td_selfcheck_report *rep, td_err *err) {
    report_init(rep);
    td_tapfile *f = NULL;
    int rc = td_tapfile_open(&f, path, err);
    if (rc) return rc;
    rc = td_selfcheck_tapfile(f, rep, err);
    td_tapfile_close(f);
    return rc;
}

int td_selfcheck_tapfile(const td_tapfile *f, td_selfcheck_report *rep, td_err *err) {
    report_init(rep);
    const char *path = td_tapfile_path(f);
    int rc = TD_OK;
    char *decode = NULL;
    td_err ignore;
    if (td_tapfile_attr_str(f, "decode", &decode, &ignore)) decode = NULL;
    rep->mode = !decode ? TD_SC_UNKNOWN
                        : !strcmp(decode, "greedy") ? TD_SC_GREEDY
                                                    : !strncmp(decode, "pinned", 6) ? TD_SC_PINNED : TD_SC_UNKNOWN;
    rep->n_steps = td_tapfile_n_steps(f);
    int64_t *tokens = NULL, *hist = NULL, *tail = NULL;
    double *row = NULL;
    int64_t n_hist_nodata = 0;

    // pass 1 (metadata only): W = the longest hist.tokens
    for (int64_t s = 0; s < rep->n_steps; s++) {
        td_tap_info ti;
        if (td_tapfile_tap(f, s, "hist.tokens", &ti, &ignore)) continue;
        if (!is_int_1d(&ti)) {
            rc = td_err_set(err, TD_EINPUT, "%s: step %lld: hist.tokens: expected a 1-D integer tap, found %d-D %s", path,
                            (long long)s, ti.ndim, td_dtype_name(ti.dtype) ? td_dtype_name(ti.dtype) : "?");
            goto out;
        }
        if (ti.shape[0] > rep->hist_w) rep->hist_w = ti.shape[0];
    }
    const int64_t W = rep->hist_w;
    tail = td_xmalloc((size_t)(W + 1) * sizeof *tail); // the last W consumed ids, oldest first
    hist = td_xmalloc((size_t)(W + 1) * sizeof *hist);
    int64_t n_tail = 0, n_consumed = 0;
    int64_t sampled_prev = -1; // argmax of the previous step's last logits row; -1 = unknown

    for (int64_t s = 0; s < rep->n_steps && rep->verdict == TD_OK; s++) {
        td_step_info si;
        if ((rc = td_tapfile_step(f, s, &si, err))) goto out;
        td_tap_info ti;
        if ((rc = td_tapfile_tap(f, s, "inp.tokens", &ti, err))) goto out;
        if (!is_int_1d(&ti)) {
            rc = td_err_set(err, TD_EINPUT, "%s: step %lld: inp.tokens: expected a 1-D integer tap", path, (long long)s);
            goto out;
        }
        tokens = td_xrealloc(tokens, (ti.count + 1) * sizeof *tokens);
        int ok;
        if ((rc = read_ints(f, s, &ti, tokens, &ok, err))) goto out;
        if (!ok) {
            rc = td_err_set(err, TD_EINPUT,
                            "%s: step %lld: inp.tokens has %llu values and no data (fingerprint only): the self-check "
                            "needs the consumed tokens",
                            path, (long long)s, (unsigned long long)ti.count);
            goto out;
        }

        // feedback: this decode step must consume the previous step's sample
        if (rep->mode == TD_SC_GREEDY && si.kind == TD_STEP_DECODE && s > 0 && ti.count > 0) {
            rep->n_feedback++;
            if (tokens[0] != sampled_prev) {
                rep->verdict = TD_DIVERGENT;
                rep->fail = TD_SCF_FEEDBACK;
                rep->fail_step = s;
                rep->fail_index = 0;
                rep->expected = sampled_prev;
                rep->found = tokens[0];
                snprintf(rep->message, sizeof rep->message,
                         "%s: step %lld (decode, pos %lld) consumed token %lld, expected %lld: the argmax of step "
                         "%lld's out.logits (greedy decoding must feed back the token it sampled)",
                         path, (long long)s, (long long)si.pos0, (long long)tokens[0], (long long)sampled_prev,
                         (long long)(s - 1));
                break;
            }
        }

        // the consumed ids, oldest first, keeping the last W
        for (uint64_t i = 0; i < ti.count; i++) {
            n_consumed++;
            if (W == 0) continue;
            if (n_tail == W) {
                memmove(tail, tail + 1, (size_t)(W - 1) * sizeof *tail);
                n_tail--;
            }
            tail[n_tail++] = tokens[i];
        }

        // history
        td_tap_info th;
        if (W > 0 && !td_tapfile_tap(f, s, "hist.tokens", &th, &ignore)) {
            if ((rc = read_ints(f, s, &th, hist, &ok, err))) goto out;
            if (!ok) {
                n_hist_nodata++;
            } else {
                rep->n_hist++;
                const int64_t want = n_consumed < W ? n_consumed : W;
                const int64_t len = (int64_t)th.count;
                if (len != want) {
                    rep->verdict = TD_DIVERGENT;
                    rep->fail = TD_SCF_HIST;
                    rep->fail_step = s;
                    rep->fail_index = -1;
                    rep->expected = want;
                    rep->found = len;
                    snprintf(rep->message, sizeof rep->message,
                             "%s: step %lld: hist.tokens holds %lld ids, expected %lld (min of the %lld ids consumed so "
                             "far and W = %lld)",
                             path, (long long)s, (long long)len, (long long)want, (long long)n_consumed, (long long)W);
                    break;
                }
                for (int64_t i = 0; i < len; i++) {
                    const int64_t exp = tail[n_tail - len + i];
                    if (hist[i] == exp) continue;
                    rep->verdict = TD_DIVERGENT;
                    rep->fail = TD_SCF_HIST;
                    rep->fail_step = s;
                    rep->fail_index = i;
                    rep->expected = exp;
                    rep->found = hist[i];
                    snprintf(rep->message, sizeof rep->message,
                             "%s: step %lld: hist.tokens[%lld] = %lld, expected %lld (hist.tokens must be the last %lld "
                             "consumed ids, oldest first)",
                             path, (long long)s, (long long)i, (long long)hist[i], (long long)exp, (long long)len);
                    break;
                }
                if (rep->verdict != TD_OK) break;
            }
        }

        // the sample this step hands to the next one (greedy only)
        sampled_prev = -1;
        if (rep->mode == TD_SC_GREEDY && s + 1 < rep->n_steps) {
            td_step_info next;
            if ((rc = td_tapfile_step(f, s + 1, &next, err))) goto out;
            if (next.kind != TD_STEP_DECODE) continue;
            td_tap_info tl;
            if ((rc = td_tapfile_tap(f, s, "out.logits", &tl, err))) goto out;
            if (!tl.has_data || tl.ndim != 2 || tl.shape[0] < 1 || tl.shape[1] < 1 || td_dtype_is_int(tl.dtype)) {
                rc = td_err_set(err, TD_EINPUT,
                                "%s: step %lld: out.logits: expected [T, V] floating-point data to find the sampled "
                                "token, found %s%d-D (a greedy self-check needs out.logits in full mode)",
                                path, (long long)s, tl.has_data ? "" : "no data, ", tl.ndim);
                goto out;
            }
            const int64_t V = tl.shape[1];
            row = td_xrealloc(row, (size_t)V * sizeof *row);
            if ((rc = td_tapfile_read_rows_f64(f, s, "out.logits", tl.shape[0] - 1, 1, row, (uint64_t)V, err))) goto out;
            sampled_prev = td_argmax(row, V);
        }
    }

    if (rep->verdict == TD_OK) {
        const char *mode = rep->mode == TD_SC_GREEDY ? "greedy" : rep->mode == TD_SC_PINNED ? "pinned" : "unknown";
        if (rep->n_feedback + rep->n_hist == 0)
            snprintf(rep->message, sizeof rep->message,
                     "%s: nothing checked (decode %s, %lld steps; %s%s)", path, mode, (long long)rep->n_steps,
                     W == 0 ? "no hist.tokens tap" : "hist.tokens without data",
                     rep->mode == TD_SC_GREEDY ? ", no decode step" : ", feedback is only checked in greedy files");
        else
            snprintf(rep->message, sizeof rep->message,
                     "%s: consistent: decode %s, %lld decode step%s fed back their argmax, hist.tokens (up to W = %lld ids) "
                     "matched the consumed ids at %lld step%s%s",
                     path, mode, (long long)rep->n_feedback, rep->n_feedback == 1 ? "" : "s", (long long)W,
                     (long long)rep->n_hist, rep->n_hist == 1 ? "" : "s",
                     n_hist_nodata ? " (some hist.tokens had no data)" : "");
    }

out:
    free(decode), free(tokens), free(hist), free(tail), free(row);
    if (rc) report_init(rep);
    return rc;
}

void td_selfcheck_run_result(const td_run_result *res, td_decode_mode mode, td_selfcheck_report *rep) {
    report_init(rep);
    rep->mode = mode == TD_DECODE_GREEDY ? TD_SC_GREEDY : TD_SC_PINNED;
    rep->n_steps = res->n_forwards;
    if (mode != TD_DECODE_GREEDY) {
        snprintf(rep->message, sizeof rep->message, "nothing checked: pinned decoding feeds the pinned list, and "
                                                    "without a tap file there is no hist.tokens to check");
        return;
    }
    for (int64_t i = 0; i < res->n_steps; i++) {
        rep->n_feedback++;
        if (res->fed[i] == res->sampled[i]) continue;
        rep->verdict = TD_DIVERGENT;
        rep->fail = TD_SCF_FEEDBACK;
        rep->fail_step = i + 1;
        rep->fail_index = 0;
        rep->expected = res->sampled[i];
        rep->found = res->fed[i];
        snprintf(rep->message, sizeof rep->message,
                 "step %lld (decode) was fed token %lld, expected %lld: the argmax of step %lld", (long long)(i + 1),
                 (long long)res->fed[i], (long long)res->sampled[i], (long long)i);
        return;
    }
    if (rep->n_feedback == 0)
        snprintf(rep->message, sizeof rep->message, "nothing checked: no decode step");
    else
        snprintf(rep->message, sizeof rep->message,
                 "consistent: %lld decode step%s fed back the previous argmax (in memory: what the runner fed)",
                 (long long)rep->n_feedback, rep->n_feedback == 1 ? "" : "s");
}
