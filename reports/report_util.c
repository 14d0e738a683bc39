/* tapdiff reports/: the shared wording (report_internal.h), the choice of the
 * worst taps, and writing the three report files into a directory. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "report_internal.h"

const char *rp_kind(td_step_kind k) {
    return k == TD_STEP_PREFILL ? "prefill" : "decode";
}

const char *rp_verdict(const td_cmp_result *r) {
    return r->verdict == TD_OK ? "conformant" : "divergent";
}

char *rp_num(char *buf, size_t n, double v) {
    if (isnan(v))
        snprintf(buf, n, "n/a");
    else if (isinf(v))
        snprintf(buf, n, v > 0 ? "inf" : "-inf");
    else
        snprintf(buf, n, "%.3g", v);
    return buf;
}

char *rp_val(char *buf, size_t n, double v) {
    if (isnan(v)) {
        snprintf(buf, n, "nan");
        return buf;
    }
    return rp_num(buf, n, v);
}

char *rp_nonfinite(char *buf, size_t n, const td_cmp_tap *t) {
    char w[96], x[32], y[32];
    if (t->method == TD_CMP_FINGERPRINT) {
        snprintf(buf, n, "non-finite values: A %llu, B %llu (fingerprints: NaN and Inf not told apart, positions unknown)",
                 (unsigned long long)t->nf_a[0], (unsigned long long)t->nf_b[0]);
        return buf;
    }
    snprintf(buf, n,
             "non-finite values: A %llu NaN, %llu +Inf, %llu -Inf; B %llu NaN, %llu +Inf, %llu -Inf; %llu at the same "
             "elements in both; first at %s (A = %s, B = %s)",
             (unsigned long long)t->nf_a[0], (unsigned long long)t->nf_a[1], (unsigned long long)t->nf_a[2],
             (unsigned long long)t->nf_b[0], (unsigned long long)t->nf_b[1], (unsigned long long)t->nf_b[2],
             (unsigned long long)t->n_nonfinite_both, rp_where(w, sizeof w, t, t->first_nonfinite),
             rp_val(x, sizeof x, t->nf_first_a), rp_val(y, sizeof y, t->nf_first_b));
    return buf;
}

char *rp_budget(char *buf, size_t n, const td_cmp_tap *t) {
    if (t->method == TD_CMP_INTEGER) {
        snprintf(buf, n, "exact");
        return buf;
    }
    return rp_num(buf, n, t->budget);
}

char *rp_shape(char *buf, size_t n, const td_cmp_tap *t) {
    const char *dn = td_dtype_name(t->dtype_b);
    size_t o = (size_t)snprintf(buf, n, "%s [", dn ? dn : "?");
    for (int i = 0; i < t->ndim && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
    return buf;
}

static int rows_are_tokens(const td_cmp_tap *t) {
    return t->ndim >= 2 && t->shape[0] == t->n_tokens;
}

char *rp_row(char *buf, size_t n, const td_cmp_tap *t, int64_t row) {
    if (rows_are_tokens(t))
        snprintf(buf, n, "pos %lld", (long long)(t->pos0 + row));
    else
        snprintf(buf, n, "row %lld", (long long)row);
    return buf;
}

char *rp_where(char *buf, size_t n, const td_cmp_tap *t, uint64_t flat) {
    if (t->ndim < 2 || t->shape[0] <= 0) {
        snprintf(buf, n, "index %llu", (unsigned long long)flat);
        return buf;
    }
    uint64_t cols = t->count / (uint64_t)t->shape[0];
    if (!cols) cols = 1;
    int64_t row = (int64_t)(flat / cols);
    uint64_t col = flat % cols;
    char rb[48];
    snprintf(buf, n, "%s, %s %llu", rp_row(rb, sizeof rb, t, row), rows_are_tokens(t) ? "ch" : "col",
             (unsigned long long)col);
    return buf;
}

char *rp_why(char *buf, size_t n, const td_cmp_result *r, const td_cmp_tap *t) {
    char w[96], x[32], y[32], z[32], g[32];
    switch (t->fail) {
    case TD_CMPF_NONFINITE_BOTH: {
        char nf[400];
        snprintf(buf, n,
                 "both arms are non-finite at the same elements, so nothing there was compared and the reference "
                 "itself is broken; %s",
                 rp_nonfinite(nf, sizeof nf, t));
        return buf;
    }
    case TD_CMPF_NONFINITE:
        if (t->method == TD_CMP_FINGERPRINT)
            snprintf(buf, n,
                     "the fingerprints' non-finite counts differ by %llu (data not compared); rounding never turns "
                     "finite values into NaN or Inf",
                     (unsigned long long)t->n_nonfinite_mismatch);
        else {
            char nf[400];
            snprintf(buf, n,
                     "%llu values are NaN/Inf in one arm and not in the other (first at %s: A = %s, B = %s); "
                     "rounding never turns finite values into NaN or Inf; %s",
                     (unsigned long long)t->n_nonfinite_mismatch, rp_where(w, sizeof w, t, t->first_mismatch),
                     rp_val(x, sizeof x, t->mis_a), rp_val(y, sizeof y, t->mis_b), rp_nonfinite(nf, sizeof nf, t));
        }
        return buf;
    case TD_CMPF_INTEGER:
        if (t->method == TD_CMP_INTEGER && isnan(t->err))
            snprintf(buf, n, "integer tap: the fingerprints differ (data not stored); integers are exact, rounding "
                             "cannot change them");
        else
            snprintf(buf, n,
                     "integer mismatch: %llu of %llu values differ (first at %s: A = %.0f, B = %.0f); integers are "
                     "exact, rounding cannot change them",
                     (unsigned long long)t->n_int_mismatch, (unsigned long long)t->count,
                     rp_where(w, sizeof w, t, t->first_mismatch), t->mis_a, t->mis_b);
        return buf;
    case TD_CMPF_TOP1:
        snprintf(buf, n,
                 "%lld of %lld positions pick another top-1 token although the reference's margin exceeds 2 x "
                 "budget x ||logits|| (not a near-tie)",
                 (long long)t->lg_top1_unexplained, (long long)t->lg_rows);
        return buf;
    case TD_CMPF_KL:
        snprintf(buf, n, "KL(a||b) reaches %s nats at %s, over its row budget (budget x ||logits||)^2",
                 rp_num(x, sizeof x, t->lg_kl_max), rp_row(w, sizeof w, t, t->lg_worst_row));
        return buf;
    default: break;
    }
    if (t->method == TD_CMP_INTEGER) {
        snprintf(buf, n, "integer tap: all %llu values equal (integers must match exactly)",
                 (unsigned long long)t->count);
        return buf;
    }
    size_t o = 0;
    if (t->ctrl != TD_CTRL_NONE && t->err_ctrl > 0)
        o += (size_t)snprintf(buf + o, n - o, "error %s is %sx the control arm's honest error here (%s)",
                              rp_val(x, sizeof x, t->err), rp_num(y, sizeof y, t->err / t->err_ctrl),
                              rp_num(z, sizeof z, t->err_ctrl));
    else if (t->ctrl != TD_CTRL_NONE)
        o += (size_t)snprintf(buf + o, n - o, "error %s where the control arm is exact", rp_val(x, sizeof x, t->err));
    else
        o += (size_t)snprintf(buf + o, n - o, "error %s against the %s floor %s (no control error here)",
                              rp_val(x, sizeof x, t->err), td_dtype_name(t->dtype_b) ? td_dtype_name(t->dtype_b) : "?",
                              rp_num(z, sizeof z, t->floor));
    if (o < n)
        o += (size_t)snprintf(buf + o, n - o, "; r = %s %s the budget (k = %g)", rp_val(g, sizeof g, t->ratio),
                              t->fail == TD_CMPF_BUDGET ? "over" : "within", r->k);
    if (o < n && !isnan(t->err_ctrl_used) && !(t->err_ctrl_used == t->err_ctrl))
        o += (size_t)snprintf(buf + o, n - o, "; a tap of %llu values: the budget uses the control error its input "
                              "carried, times the control's largest growth at this tap so far, %s", (unsigned long long)t->count, rp_num(z, sizeof z, t->err_ctrl_used));
    if (o < n && t->input[0]) {
        if (isinf(t->growth))
            o += (size_t)snprintf(buf + o, n - o, "; its input %s is exact: the error was created by this operation",
                                  t->input);
        else if (!isnan(t->growth))
            o += (size_t)snprintf(buf + o, n - o, "; this operation amplified its input's error %sx (%s, %s)",
                                  rp_num(g, sizeof g, t->growth), t->input, rp_num(z, sizeof z, t->err_input));
    }
    if (o < n && t->method == TD_CMP_FINGERPRINT)
        snprintf(buf + o, n - o, "; fingerprint lower bound, data not compared");
    return buf;
}

int rp_before(const td_cmp_result *r, int64_t *idx, int n) {
    if (r->first < 0) return 0;
    int64_t from = r->first - n < 0 ? 0 : r->first - n;
    int m = 0;
    for (int64_t i = from; i < r->first; i++) idx[m++] = i;
    return m;
}

// Failures first (non-finite, integer, then by ratio), then by ratio.
static double severity(const td_cmp_tap *t) {
    if (t->fail == TD_CMPF_NONFINITE || t->fail == TD_CMPF_INTEGER) return INFINITY;
    return isnan(t->ratio) ? -1.0 : t->ratio;
}

int td_report_worst(const td_cmp_result *r, int64_t *idx, int n) {
    int m = 0;
    for (int64_t i = 0; i < r->n_taps; i++) {
        double s = severity(td_cmp_tap_at(r, i));
        if (m == n && !(s > severity(td_cmp_tap_at(r, idx[m - 1])))) continue;
        int j = m < n ? m++ : n - 1;
        while (j > 0 && s > severity(td_cmp_tap_at(r, idx[j - 1]))) {
            idx[j] = idx[j - 1];
            j--;
        }
        idx[j] = i;
    }
    return m;
}

int td_report_write_dir(const char *dir, const td_cmp_result *r, td_err *err) {
    int rc = td_mkdir_p(dir, err);
    if (rc) return rc;
    static const char *const names[] = {"report.md", "report.json", "report.html"};
    for (int i = 0; i < 3; i++) {
        size_t len = strlen(dir) + strlen(names[i]) + 2;
        char *path = td_xmalloc(len);
        snprintf(path, len, "%s/%s", dir, names[i]);
        FILE *f = fopen(path, "w");
        if (!f) {
            int e = errno;
            td_err_set(err, TD_EOUTPUT, "report file %s: cannot write it: %s", path, strerror(e));
            free(path);
            return TD_EOUTPUT;
        }
        if (i == 0) td_report_markdown(f, r);
        if (i == 1) {
            td_report_json_write(f, r);
            fputc('\n', f);
        }
        if (i == 2) td_report_html(f, r);
        int bad = ferror(f);
        if (fclose(f) || bad) {
            td_err_set(err, TD_EOUTPUT, "report file %s: write failed", path);
            free(path);
            return TD_EOUTPUT;
        }
        free(path);
    }
    return TD_OK;
}
