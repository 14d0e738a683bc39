/* tapdiff compare (compare.h): the metrics, the ratio-based budget, the
 * producer map and the localization of the first divergent tensor. Two (or
 * up to four, with a control pair) tap files are walked step by step; a tap
 * is streamed in blocks of whole rows, so memory is a few blocks plus one
 * small record per compared tap, whatever the file sizes. */
#include "compare.h"
#include "model.h"
#include "ties.h"
#include "catalog.h"
#include "selfcheck.h"

#include <errno.h>
#include <fnmatch.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Doubles per arm per block: rows are read in blocks of about this many
 * values (at least one row). 1 MiB per arm. */
#define BLOCK_ELEMS ((uint64_t)1 << 17)

/* ULP histogram: bins 0..1023 hold round(d) exactly; above, quarter octaves
 * from 1024 upward. */
#define ULP_EXACT 1024
#define ULP_BINS (ULP_EXACT + 4 * 2200)

/* ------------------------------------------------------------ helpers */

double td_cmp_floor(td_dtype dt) {
    switch (dt) {
    case TD_DT_F64: return 1e-13;
    case TD_DT_F32: return ldexp(1.0, -20);
    case TD_DT_F16: return ldexp(1.0, -7);
    case TD_DT_BF16: return ldexp(1.0, -4);
    default: return 0.0;
    }
}

// What td_cmp_ulp needs of a dtype, worked out once per tap instead of once
// per element (ldexp of the smallest normal was a twentieth of compare).
typedef struct {
    int p;             // significand bits incl. the implicit one; 0: not a float dtype
    double min_normal; // 2^emin
    double sub_ulp;    // spacing below it, 2^(emin - (p - 1))
} ulp_kind;

static ulp_kind ulp_kind_of(td_dtype dt) {
    ulp_kind k = {0, 0, 0};
    int emin;
    switch (dt) {
    case TD_DT_F64: k.p = 53, emin = -1022; break;
    case TD_DT_F32: k.p = 24, emin = -126; break;
    case TD_DT_F16: k.p = 11, emin = -14; break;
    case TD_DT_BF16: k.p = 8, emin = -126; break;
    default: return k;
    }
    k.min_normal = ldexp(1.0, emin);
    k.sub_ulp = ldexp(1.0, emin - (k.p - 1));
    return k;
}

static inline __attribute__((always_inline)) double ulp_of(double x, const ulp_kind *k) {
    if (!k->p) return 0.0;
    double ax = fabs(x);
    if (!(ax >= k->min_normal)) return k->sub_ulp;
    if (!isfinite(ax)) {
        int e;
        frexp(ax, &e); // ax = m 2^e, m in [0.5, 1): the leading bit is 2^(e-1)
        return ldexp(1.0, e - k->p);
    }
    // The same power of two from the bits (compare calls this once per
    // element; frexp and ldexp were a tenth of its time): ax is a normal
    // double here, ax = 1.m 2^(E - 1023), so the spacing is 2^(E - 1022 - p).
    uint64_t bits;
    memcpy(&bits, &ax, sizeof bits);
    int e = (int)(bits >> 52) - 1022 - k->p;
    bits = e >= -1022 ? (uint64_t)(e + 1023) << 52 : (uint64_t)1 << (e + 1074);
    double u;
    memcpy(&u, &bits, sizeof u);
    return u;
}

// ad / ulp_of(x) for a finite x, as a product where the reciprocal of the
// spacing (a power of two) is a normal double: then both are the correctly
// rounded value of the same real number, so the results are equal bit for
// bit, and a multiplication does not wait like a division does.
static inline __attribute__((always_inline)) double in_ulps(double ad, double x, const ulp_kind *k) {
    double ax = fabs(x);
    if (!k->p || !(ax >= k->min_normal)) return ad / ulp_of(x, k);
    uint64_t bits;
    memcpy(&bits, &ax, sizeof bits);
    int e = (int)(bits >> 52) - 1022 - k->p; // the spacing is 2^e
    if (e < -1023) return ad / ulp_of(x, k);
    bits = (uint64_t)(1023 - e) << 52;
    double inv;
    memcpy(&inv, &bits, sizeof inv);
    return ad * inv;
}

double td_cmp_ulp(double x, td_dtype dt) {
    ulp_kind k = ulp_kind_of(dt);
    return ulp_of(x, &k);
}

// Above the exact bins (td_cmp_ulp_bin).
static int ulp_bin_octaves(double d) {
    double y = d / ULP_EXACT;
    // floor(4 log2 y) from y's exponent and where its significand lies
    // among 2^(1/4), 2^(1/2), 2^(3/4): libm's log2 was the largest part of
    // compare's arithmetic. Within 1e-9 of a boundary, or off the normal
    // range, log2 decides as it always did, so the bins stay the same.
    static const double quarter[3] = {1.189207115002721, 1.4142135623730951, 1.681792830507429};
    int q;
    if (isnormal(y)) {
        uint64_t bits;
        memcpy(&bits, &y, sizeof bits);
        int e = (int)(bits >> 52) - 1023;
        bits = (bits & (((uint64_t)1 << 52) - 1)) | ((uint64_t)1023 << 52);
        double m;
        memcpy(&m, &bits, sizeof m);
        q = 4 * e;
        for (int i = 0; i < 3; i++) {
            if (fabs(m - quarter[i]) < 1e-9) goto by_log2;
            q += m >= quarter[i];
        }
        if (fabs(m - 1.0) < 1e-9 || m > 2.0 - 1e-9) goto by_log2;
        return ULP_EXACT + (q < 0 ? 0 : q > 4 * 2200 - 1 ? 4 * 2200 - 1 : q);
    }
by_log2:;
    double fq = floor(4.0 * log2(y));
    return ULP_EXACT + (fq < 0 ? 0 : fq > 4 * 2200 - 1 ? 4 * 2200 - 1 : (int)fq);
}

// ulp_bin_octaves in integer compares on d's bits (d >= 1023.5 here, so
// d / 1024 has d's significand): q counts the quarter-octave boundaries the
// significand passes, and a significand inside one of the 1e-9 bands that
// function hands to log2 (bounds worked out exactly from its own tests:
// m - 2^(i/4) is exact for m in [1, 2)) goes to it unchanged.
static inline __attribute__((always_inline)) int ulp_bin(double d) {
    if (d < ULP_EXACT - 0.5) return (int)(d + 0.5);
    uint64_t bits;
    memcpy(&bits, &d, sizeof bits);
    uint64_t ex = bits >> 52, m = bits & (((uint64_t)1 << 52) - 1);
    if (ex == 0 || ex >= 0x7ff || m < 0x44b830 || m > 0xfffffffbb47d0 ||
        m - 0x306fe09ecfee6 <= 0x306fe0a766f44 - 0x306fe09ecfee6 ||
        m - 0x6a09e663a839e <= 0x6a09e66c3f3fc - 0x6a09e663a839e ||
        m - 0xae89f99161b7e <= 0xae89f999f8bdc - 0xae89f99161b7e)
        return ulp_bin_octaves(d);
    int q = 4 * ((int)ex - 1023 - 10) + (m >= 0x306fe0a31b715) + (m >= 0x6a09e667f3bcd) + (m >= 0xae89f995ad3ad);
    return ULP_EXACT + (q < 0 ? 0 : q > 4 * 2200 - 1 ? 4 * 2200 - 1 : q);
}

int td_cmp_ulp_bin(double d) {
    return ulp_bin(d);
}

int td_cmp_filter_match(const char *filter, const char *name) {
    if (!filter) return 1;
    int any = 0;
    const char *p = filter;
    while (*p) {
        const char *end = strchr(p, ',');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        while (n && (*p == ' ' || *p == '\t')) p++, n--;
        while (n && (p[n - 1] == ' ' || p[n - 1] == '\t')) n--;
        if (n) {
            any = 1;
            char pat[256];
            if (n >= sizeof pat) n = sizeof pat - 1;
            memcpy(pat, p, n);
            pat[n] = '\0';
            if (fnmatch(pat, name, 0) == 0) return 1;
        }
        if (!end) break;
        p = end + 1;
    }
    return !any;
}

/* ------------------------------------------------------ producer map */

// Parses "blk.<L>.<base>"; returns the base or NULL.
static const char *blk_base(const char *name, long *layer) {
    if (strncmp(name, "blk.", 4) != 0) return NULL;
    char *end;
    long l = strtol(name + 4, &end, 10);
    if (end == name + 4 || *end != '.' || l < 0) return NULL;
    *layer = l;
    return end + 1;
}

// The producer graph is the tap catalog's (taps/catalog.c).
int td_cmp_inputs(const char *name, char groups[][3][TD_TAP_NAME_MAX], int max_groups, int *wants_last_out) {
    return td_tap_catalog_inputs(name, groups, max_groups, wants_last_out);
}

/* ---------------------------------------------------------------- arms */

// One tap file and the taps of its currently loaded step.
typedef struct arm {
    td_tapfile *f;
    const char *path;
    int64_t step;       // loaded step, -1 = none
    int present;        // the loaded step exists in this file
    td_tap_info *taps;  // sorted by seq
    int64_t n;
    int64_t *by_name;   // indices into taps sorted by name
} arm;

static const td_tap_info *sort_base_;
static int by_name_cmp(const void *x, const void *y) {
    return strcmp(sort_base_[*(const int64_t *)x].name, sort_base_[*(const int64_t *)y].name);
}

static void arm_clear(arm *a) {
    free(a->taps);
    free(a->by_name);
    a->taps = NULL;
    a->by_name = NULL;
    a->n = 0;
    a->present = 0;
    a->step = -1;
}

static int arm_load(arm *a, int64_t s, td_err *err) {
    if (a->step == s) return TD_OK;
    arm_clear(a);
    a->step = s;
    if (s >= td_tapfile_n_steps(a->f)) return TD_OK;
    int st = td_tapfile_step_taps(a->f, s, &a->taps, &a->n, err);
    if (st) return st;
    a->present = 1;
    a->by_name = td_xmalloc(sizeof *a->by_name * (size_t)(a->n ? a->n : 1));
    for (int64_t i = 0; i < a->n; i++) a->by_name[i] = i;
    sort_base_ = a->taps;
    qsort(a->by_name, (size_t)a->n, sizeof *a->by_name, by_name_cmp);
    return TD_OK;
}

// Index (in taps) of the tap called name in the loaded step, or -1.
static int64_t arm_find(const arm *a, const char *name) {
    int64_t lo = 0, hi = a->n - 1;
    while (lo <= hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(a->taps[a->by_name[mid]].name, name);
        if (c == 0) return a->by_name[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -1;
}

static int arms_open(arm **arms, const char *const *paths, int n, td_err *err) {
    td_tapfile *f[4];
    TD_ASSERT(n <= 4);
    int st = td_tapfile_open_all(f, paths, n, err);
    for (int i = 0; i < n; i++) {
        memset(arms[i], 0, sizeof *arms[i]);
        arms[i]->step = -1;
        arms[i]->path = paths[i];
        arms[i]->f = f[i];
    }
    return st;
}

static void arm_close(arm *a) {
    arm_clear(a);
    td_tapfile_close(a->f);
    a->f = NULL;
}

static char *attr_or_empty(const td_tapfile *f, const char *key) {
    char *v = NULL;
    td_err e;
    if (td_tapfile_attr_str(f, key, &v, &e)) return td_xstrdup("");
    return v;
}

/* ------------------------------------------------------------ context */

/* A small tap's honest amplification of its input's error depends on the
 * error's direction (softmax over 8 router logits: 0.04x to 4x from step to
 * step), so one control draw per step under-measures it; the largest growth
 * the control showed at that tap so far measures the operation instead. */
typedef struct small_growth {
    char name[TD_TAP_NAME_MAX];
    double gmax;
} small_growth;

// name's entry in a growable per-tap list of them (added with gmax = init).
static small_growth *named_entry(small_growth **v, int *n, int *cap, const char *name, double init) {
    int i = 0;
    while (i < *n && strcmp((*v)[i].name, name)) i++;
    if (i == *n) {
        if (*n == *cap) {
            *cap = *cap ? 2 * *cap : 16;
            *v = td_xrealloc(*v, (size_t)*cap * sizeof **v);
        }
        snprintf((*v)[i].name, sizeof(*v)[i].name, "%s", name);
        (*v)[(*n)++].gmax = init;
    }
    return &(*v)[i];
}

/* A sliding copy's slots (copy_carried): per slot, the control error of the
 * input it was copied from, as of `step`. */
typedef struct copy_slots {
    char name[TD_TAP_NAME_MAX];
    int64_t step, n;
    double *src;
} copy_slots;

typedef struct ctx {
    const td_cmp_options *o;
    td_cmp_result *r;
    arm A, B, C1, C2;
    arm *ca, *cb;  // control pair (ca may be &A); NULL without control
    double *ba, *bb, *bca, *bcb;
    uint64_t buf_n;
    double *col_d2, *col_a2;
    uint64_t col_n;
    double *lg_margin, *lg_norm, *lg_kl; // per logits row
    int64_t lg_n;
    uint64_t *ulp_hist; // 2 x ULP_BINS: the fast loop counts every other value in the second half
    int ulp_top; // highest bin touched + 1
    int64_t *res_of; // per B tap of the step: index in r->taps or -1
    int64_t res_n;
    small_growth *sg; // per small tap name: the control's largest growth so far
    int n_sg, cap_sg;
    small_growth *qs; // per qsa_scores tap: the largest |score| of A so far (in gmax)
    int n_qs, cap_qs;
    copy_slots *cs; // per sliding copy tap (the conv states)
    int n_cs, cap_cs;
    small_growth *kc; // per cached input (K, V): its largest control error so far (in gmax)
    int n_kc, cap_kc;
    small_growth *hs; // per tap judged head by head: the control's largest worst-head / whole so far
    int n_hs, cap_hs;
} ctx;

static void ensure_bufs(ctx *c, uint64_t n) {
    if (c->buf_n >= n) return;
    c->ba = td_xrealloc(c->ba, sizeof(double) * (size_t)n);
    c->bb = td_xrealloc(c->bb, sizeof(double) * (size_t)n);
    c->bca = td_xrealloc(c->bca, sizeof(double) * (size_t)n);
    c->bcb = td_xrealloc(c->bcb, sizeof(double) * (size_t)n);
    c->buf_n = n;
}

static void ensure_cols(ctx *c, uint64_t n) {
    if (c->col_n < n) {
        c->col_d2 = td_xrealloc(c->col_d2, sizeof(double) * (size_t)n);
        c->col_a2 = td_xrealloc(c->col_a2, sizeof(double) * (size_t)n);
        c->col_n = n;
    }
    memset(c->col_d2, 0, sizeof *c->col_d2 * (size_t)n);
    memset(c->col_a2, 0, sizeof *c->col_a2 * (size_t)n);
}

static void ensure_lg(ctx *c, int64_t n) {
    if (c->lg_n >= n) return;
    c->lg_margin = td_xrealloc(c->lg_margin, sizeof(double) * (size_t)n);
    c->lg_norm = td_xrealloc(c->lg_norm, sizeof(double) * (size_t)n);
    c->lg_kl = td_xrealloc(c->lg_kl, sizeof(double) * (size_t)n);
    c->lg_n = n;
}

static double rel_l2(double d2, double a2, double b2) {
    if (a2 > 0) return sqrt(d2 / a2);
    return b2 > 0 ? 1.0 : 0.0;
}

// Keeps the TD_CMP_N_WHERE largest (by d2) entries, largest first.
static void where_push(td_cmp_where *w, double *d2s, int64_t index, double d2, double err) {
    int n = TD_CMP_N_WHERE;
    if (!(d2 > d2s[n - 1])) return;
    int i = n - 1;
    while (i > 0 && d2 > d2s[i - 1]) {
        d2s[i] = d2s[i - 1];
        w[i] = w[i - 1];
        i--;
    }
    d2s[i] = d2;
    w[i].index = index;
    w[i].err = err;
}

static void where_reset(td_cmp_where *w, double *d2s) {
    for (int i = 0; i < TD_CMP_N_WHERE; i++) {
        w[i].index = -1;
        w[i].share = 0;
        w[i].err = 0;
        d2s[i] = 0;
    }
}

static void where_share(td_cmp_where *w, const double *d2s, double total) {
    for (int i = 0; i < TD_CMP_N_WHERE; i++)
        if (w[i].index >= 0) w[i].share = total > 0 ? d2s[i] / total : 0;
}

static inline void ulp_add(ctx *c, double d) {
    int bin = ulp_bin(d);
    c->ulp_hist[bin]++;
    if (bin + 1 > c->ulp_top) c->ulp_top = bin + 1;
}

static double ulp_median(ctx *c, uint64_t n) {
    if (!n) return NAN;
    uint64_t half = (n + 1) / 2, acc = 0;
    for (int b = 0; b < c->ulp_top; b++) {
        acc += c->ulp_hist[b] + c->ulp_hist[ULP_BINS + b];
        if (acc >= half) return b < ULP_EXACT ? (double)b : ULP_EXACT * exp2((b - ULP_EXACT) / 4.0);
    }
    return NAN;
}

// Same non-finite class: both NaN, or the same infinity.
static int same_nonfinite(double a, double b) {
    if (isnan(a) && isnan(b)) return 1;
    return isinf(a) && isinf(b) && (a > 0) == (b > 0);
}

// nf[0] NaN, nf[1] +Inf, nf[2] -Inf.
static void nf_count(uint64_t nf[3], double v) {
    if (isnan(v))
        nf[0]++;
    else if (isinf(v))
        nf[v > 0 ? 1 : 2]++;
}

static uint64_t nf_total(const uint64_t nf[3]) { return nf[0] + nf[1] + nf[2]; }

/* The fingerprint lower bound of ||b-a|| / ||a|| (compare.h). */
static double fp_lower_bound(const td_fingerprint *a, const td_fingerprint *b) {
    double na = sqrt(a->sum_sq), nb = sqrt(b->sum_sq);
    uint64_t n = a->count - a->n_nonfinite;
    if (!(na > 0)) {
        int same = nb == 0 && a->sum == b->sum;
        return same ? 0.0 : 1.0;
    }
    double lb = fabs(nb - na) / na;
    if (n > 0) lb = fmax(lb, fabs(b->sum - a->sum) / (sqrt((double)n) * na));
    if (isfinite(a->max) && isfinite(b->max)) lb = fmax(lb, fabs(b->max - a->max) / na);
    if (isfinite(a->min) && isfinite(b->min)) lb = fmax(lb, fabs(b->min - a->min) / na);
    for (int i = 0; i < 4 && (uint64_t)i < a->count; i++)
        if (isfinite(a->first[i]) && isfinite(b->first[i])) lb = fmax(lb, fabs(b->first[i] - a->first[i]) / na);
    return lb;
}

static int fp_int_equal(const td_fingerprint *a, const td_fingerprint *b) {
    if (a->count != b->count || a->n_nonzero != b->n_nonzero || a->sum != b->sum || a->sum_sq != b->sum_sq ||
        a->sum_abs != b->sum_abs)
        return 0;
    if (!(a->min == b->min || (isnan(a->min) && isnan(b->min)))) return 0;
    if (!(a->max == b->max || (isnan(a->max) && isnan(b->max)))) return 0;
    for (int i = 0; i < 4; i++)
        if (!(a->first[i] == b->first[i] || (isnan(a->first[i]) && isnan(b->first[i])))) return 0;
    return 1;
}

static void shape_str(char *buf, size_t n, const td_tap_info *t) {
    size_t o = (size_t)snprintf(buf, n, "%s [", td_dtype_name(t->dtype) ? td_dtype_name(t->dtype) : "?");
    for (int i = 0; i < t->ndim && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
}

static int same_shape(const td_tap_info *a, const td_tap_info *b) {
    if (a->ndim != b->ndim || a->count != b->count) return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return 0;
    return td_dtype_is_int(a->dtype) == td_dtype_is_int(b->dtype);
}

static int refuse_shape(td_err *err, int64_t step, const char *pa, const td_tap_info *a, const char *pb,
                        const td_tap_info *b) {
    char sa[96], sb[96];
    shape_str(sa, sizeof sa, a);
    shape_str(sb, sizeof sb, b);
    return td_err_set(err, TD_EINPUT, "tap %s at step %lld: %s has %s, %s has %s: incompatible shapes or dtypes",
                      b->name, (long long)step, pa, sa, pb, sb);
}

/* --------------------------------------------------- one tap's metrics */

// Reads rows [r0, r0+nr) (or the whole tap when ndim < 2) as doubles.
static int read_block(const arm *a, int64_t step, const td_tap_info *t, int64_t r0, int64_t nr, uint64_t n,
                      double *dst, td_err *err) {
    if (t->ndim < 2) return td_tapfile_read_f64(a->f, step, t->name, dst, n, err);
    return td_tapfile_read_rows_f64(a->f, step, t->name, r0, nr, dst, n, err);
}

// Top-k indices of x (n) by value, largest first, ties to the lower index;
// non-finite values skipped. Returns how many were found.
static int topk_idx(const double *x, int64_t n, int k, int64_t *idx) {
    int m = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(x[i])) continue;
        if (m == k && !(x[i] > x[idx[m - 1]])) continue;
        int j = m < k ? m++ : k - 1;
        while (j > 0 && x[i] > x[idx[j - 1]]) {
            idx[j] = idx[j - 1];
            j--;
        }
        idx[j] = i;
    }
    return m;
}

// log(sum(exp(x))) over finite x.
static double lse(const double *x, int64_t n) {
    double m = -INFINITY;
    for (int64_t i = 0; i < n; i++)
        if (isfinite(x[i]) && x[i] > m) m = x[i];
    if (!isfinite(m)) return NAN;
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        if (isfinite(x[i])) s += exp(x[i] - m);
    return m + log(s);
}

// One logits row: top-1 margin (NaN if the argmaxes agree), ||a||, KL(pa||pb).
static void logits_row(ctx *c, td_cmp_tap *t, const double *a, const double *b, int64_t V, int64_t row,
                       double *topk_sum) {
    int k = c->r->topk;
    int64_t ia[TD_CMP_TOPK_MAX], ib[TD_CMP_TOPK_MAX];
    int na = topk_idx(a, V, k, ia), nb = topk_idx(b, V, k, ib);
    int common = 0;
    for (int i = 0; i < na; i++)
        for (int j = 0; j < nb; j++)
            if (ia[i] == ib[j]) {
                common++;
                break;
            }
    double ov = k > 0 ? (double)common / (double)(k < V ? k : V) : 1.0;
    *topk_sum += ov;
    if (ov < t->lg_topk_min) t->lg_topk_min = ov;
    double margin = NAN;
    if (na && nb) {
        if (ia[0] == ib[0])
            t->lg_top1_agree++;
        else
            margin = a[ia[0]] - a[ib[0]];
    }
    double n2 = 0;
    for (int64_t i = 0; i < V; i++)
        if (isfinite(a[i])) n2 += a[i] * a[i];
    double la = lse(a, V), lb = lse(b, V), kl = 0;
    if (isnan(la) || isnan(lb)) {
        kl = NAN;
    } else {
        for (int64_t i = 0; i < V; i++) {
            if (!isfinite(a[i]) || !isfinite(b[i])) continue;
            double lpa = a[i] - la, lpb = b[i] - lb;
            kl += exp(lpa) * (lpa - lpb);
        }
        if (kl < 0) kl = 0; // rounding of an exact 0
    }
    c->lg_margin[row] = margin;
    c->lg_norm[row] = sqrt(n2);
    c->lg_kl[row] = kl;
}

static void tap_init(td_cmp_tap *t, const td_step_info *si, const td_tap_info *a, const td_tap_info *b) {
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", b->name);
    t->step = si->index;
    t->kind = si->kind;
    t->pos0 = si->pos0;
    t->n_tokens = si->n_tokens;
    t->seq = b->seq;
    t->layer = b->layer;
    t->dtype_a = a->dtype;
    t->dtype_b = b->dtype;
    t->ndim = b->ndim;
    for (int i = 0; i < TD_TAP_MAX_DIMS; i++) t->shape[i] = b->shape[i];
    t->count = b->count;
    t->err_ctrl = NAN;
    t->err_ctrl_used = NAN;
    t->carried = NAN;
    t->err_head = NAN;
    t->err_ctrl_head = NAN;
    t->growth = NAN;
    t->err_input = NAN;
    t->max_abs = NAN;
    t->cosine = NAN;
    t->ulp_max = NAN;
    t->ulp_median = NAN;
    t->lg_worst_row = -1;
    for (int i = 0; i < TD_CMP_N_WHERE; i++) t->rows[i].index = t->cols[i].index = -1;
}

static void add_note(td_cmp_result *r, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static int ctrl_pair(ctx *c, int64_t step, const char *name, const td_tap_info *b, const td_tap_info **ci,
                     const td_tap_info **cj, td_err *err);

// Counts the mismatches of an integer tap that the control pair shows at the
// same element too: where honest arithmetic of the candidate's kind (the
// control) also decides the other way, the mismatch is not a bug.
static int int_mismatch_in_ctrl(ctx *c, int64_t step, const td_tap_info *b, const int64_t *va, const int64_t *vb,
                                td_cmp_tap *t, td_err *err) {
    const td_tap_info *ci, *cj;
    int st = ctrl_pair(c, step, b->name, b, &ci, &cj, err);
    if (st || !ci || !ci->has_data || !cj->has_data) return st;
    uint64_t n = b->count;
    int64_t *xa = td_xmalloc(sizeof *xa * (size_t)(n ? n : 1)), *xb = td_xmalloc(sizeof *xb * (size_t)(n ? n : 1));
    st = td_tapfile_read_i64(c->ca->f, step, ci->name, xa, n, err);
    if (!st) st = td_tapfile_read_i64(c->cb->f, step, cj->name, xb, n, err);
    for (uint64_t i = 0; !st && i < n; i++)
        if (va[i] != vb[i] && xa[i] != xb[i]) t->n_int_in_ctrl++;
    free(xa);
    free(xb);
    return st;
}

static int has_pos(const int64_t *sel, int64_t W, int64_t s) {
    for (int64_t j = 0; j < W; j++)
        if (sel[j] == s) return 1;
    return 0;
}

int td_cmp_qsa_row_explained(const int64_t *sel_a, const int64_t *sel_b, int64_t W, const double *score, int64_t nb,
                             int64_t r, double thr) {
    int64_t na = 0, nbb = 0;
    for (int64_t j = 0; j < W; j++) na += sel_a[j] >= 0, nbb += sel_b[j] >= 0;
    if (na != nbb || r < 1) return 0;
    double cut = INFINITY;
    for (int64_t j = 0; j < W; j++)
        if (sel_a[j] >= 0 && sel_a[j] / r < nb && score[sel_a[j] / r] < cut) cut = score[sel_a[j] / r];
    for (int pass = 0; pass < 2; pass++) {
        const int64_t *x = pass ? sel_b : sel_a, *y = pass ? sel_a : sel_b;
        for (int64_t j = 0; j < W; j++) {
            if (x[j] < 0 || has_pos(y, W, x[j])) continue;
            const int64_t b = x[j] / r; // a position only one arm selects: in a complete block at the cut
            if (b >= nb || !isfinite(cut) || !(fabs(score[b] - cut) <= thr)) return 0;
        }
    }
    return 1;
}

double td_cmp_qsa_tie_thr(const double *sa, const double *sb, const double *ca, const double *cb, int64_t nb,
                          td_dtype dt) {
    double noise = 0, top = 0;
    for (int64_t k = 0; k < nb; k++) {
        if (ca && cb) noise = fmax(noise, fabs(cb[k] - ca[k]));
        top = fmax(top, fmax(fabs(sa[k]), fabs(sb[k])));
    }
    return fmax(4.0 * noise, td_cmp_floor(dt) * top);
}

/* The block sizes r that fit a qsa_scores tap of this step: every row t has
 * floor((pos_t + 1) / r) complete blocks (scores before its first -1), the
 * step floor(n_kv / r) = nb columns, and r <= W (W = B + r - 1). Writes up
 * to 64 candidates, returns their count. */
static int qsa_ratios(const double *sc, int64_t T, int64_t nb, const int64_t *pos, int64_t W, int64_t *cand) {
    int n = 0;
    const int64_t n_kv = pos[T - 1] + 1;
    for (int64_t r = 1; r <= W && n < 64; r++) {
        int ok = n_kv / r == nb;
        for (int64_t t = 0; ok && t < T; t++) {
            int64_t k = 0;
            while (k < nb && sc[t * nb + k] >= 0) k++;
            ok = (pos[t] + 1) / r == k;
        }
        if (ok) cand[n++] = r;
    }
    return n;
}

/* qsa_sel mismatches confined to the boundary group (td_cmp_qsa_row_explained)
 * on A's blk.L.qsa_scores, or on B's: the tie tolerance is the rule MoE
 * near-ties use (harness/audit.h): max(4 x the control pair's deviation at
 * that row, the floor of B's dtype x the cut score); exact without either.
 * Every block size the step's taps allow must explain the row (the model's,
 * when the caller gives it: td_cmp_options.qsa_ratio). Counts the
 * explained rows' mismatches in t->n_int_qsa_tie and marks them in row_ok. */
static int qsa_sel_ties(ctx *c, int64_t step, const td_tap_info *b, const int64_t *va, const int64_t *vb,
                        unsigned char *row_ok, td_cmp_tap *t, td_err *err) {
    if (b->ndim != 2 || b->shape[0] < 1) return TD_OK;
    const int64_t T = b->shape[0], W = b->shape[1];
    char name[TD_TAP_NAME_MAX];
    snprintf(name, sizeof name, "%.*s.qsa_scores", (int)(strlen(b->name) - strlen(".qsa_sel")), b->name);
    int64_t ia = arm_find(&c->A, name), ib = arm_find(&c->B, name), ip = arm_find(&c->A, "inp.pos");
    if (ia < 0 || ib < 0 || ip < 0) return TD_OK; // no complete block: nothing to tie
    const td_tap_info *sa = &c->A.taps[ia], *sb = &c->B.taps[ib];
    if (!sa->has_data || !sb->has_data || sa->ndim != 2 || sa->shape[0] != T || !same_shape(sa, sb) ||
        c->A.taps[ip].count != (uint64_t)T)
        return TD_OK;
    const int64_t nb = sa->shape[1];
    const size_t n = (size_t)(T * nb > 0 ? T * nb : 1);
    double *xa = td_xmalloc(sizeof *xa * n), *xb = td_xmalloc(sizeof *xb * n), *ca = NULL, *cb = NULL;
    int64_t *pos = td_xmalloc(sizeof *pos * (size_t)T);
    int st = td_tapfile_read_f64(c->A.f, step, name, xa, (uint64_t)(T * nb), err);
    if (!st) st = td_tapfile_read_f64(c->B.f, step, name, xb, (uint64_t)(T * nb), err);
    if (!st) st = td_tapfile_read_i64(c->A.f, step, "inp.pos", pos, (uint64_t)T, err);
    const td_tap_info *ci = NULL, *cj = NULL;
    if (!st) st = ctrl_pair(c, step, name, sb, &ci, &cj, err);
    if (!st && ci && ci->has_data && cj->has_data) {
        ca = td_xmalloc(sizeof *ca * n), cb = td_xmalloc(sizeof *cb * n);
        st = td_tapfile_read_f64(c->ca->f, step, ci->name, ca, (uint64_t)(T * nb), err);
        if (!st) st = td_tapfile_read_f64(c->cb->f, step, cj->name, cb, (uint64_t)(T * nb), err);
    }
    int64_t cand[64];
    int n_cand = st ? 0 : qsa_ratios(xa, T, nb, pos, W, cand);
    int layer = -1;
    if (!st && c->o->qsa_ratio && sscanf(b->name, "blk.%d.", &layer) == 1 && layer >= 0 && layer < 256 &&
        c->o->qsa_ratio[layer])
        cand[0] = c->o->qsa_ratio[layer], n_cand = 1; // the caller knows the model's block size
    for (int64_t row = 0; row < T && n_cand > 0; row++) {
        const int64_t *ra = va + row * W, *rb = vb + row * W;
        uint64_t mis = 0;
        for (int64_t j = 0; j < W; j++) mis += ra[j] != rb[j];
        if (!mis) continue;
        const double thr = td_cmp_qsa_tie_thr(xa + row * nb, xb + row * nb, ca ? ca + row * nb : NULL,
                                              ca ? cb + row * nb : NULL, nb, sb->dtype);
        int ok = 1;
        for (int i = 0; i < n_cand && ok; i++) {
            int64_t k = 0; // this row's complete blocks: before the first -1
            while (k < nb && xa[row * nb + k] >= 0) k++;
            ok = td_cmp_qsa_row_explained(ra, rb, W, xa + row * nb, k, cand[i], thr) ||
                 td_cmp_qsa_row_explained(ra, rb, W, xb + row * nb, k, cand[i], thr);
        }
        if (ok) {
            row_ok[row] = 1;
            t->n_int_qsa_tie += mis;
        }
    }
    free(xa), free(xb), free(ca), free(cb), free(pos);
    return st;
}

/* An expert's rank in a selection of K: its index, K when not picked. */
static int64_t topk_rank(const int64_t *sel, int64_t K, int64_t e) {
    for (int64_t j = 0; j < K; j++)
        if (sel[j] == e) return j;
    return K;
}

int td_cmp_topk_row_explained(const int64_t *sel_a, const int64_t *sel_b, int64_t K, const double *score,
                              const double *score_b, int64_t X, double thr) {
    for (int64_t j = 0; j < K; j++) {
        if (sel_a[j] < 0 || sel_a[j] >= X || sel_b[j] < 0 || sel_b[j] >= X) return 0;
        for (int64_t i = 0; i < j; i++)
            if (sel_a[i] == sel_a[j] || sel_b[i] == sel_b[j]) return 0;
    }
    // every pair of experts the two order differently (a pick against a
    // drop, or two picks at swapped ranks), not rank by rank: a row that
    // differs at one rank by a near tie can hide a far one at another
    for (int64_t s = 0; s < 2 * K; s++) {
        const int64_t u = s < K ? sel_a[s] : sel_b[s - K], au = s < K ? s : topk_rank(sel_a, K, u);
        if (s >= K && au < K) continue; // listed once
        const int64_t bu = topk_rank(sel_b, K, u);
        for (int64_t q = 0; q < 2 * K; q++) {
            const int64_t v = q < K ? sel_a[q] : sel_b[q - K], av = q < K ? q : topk_rank(sel_a, K, v);
            if (q >= K && av < K) continue;
            // A puts u above v, B v above u
            if (!(au < av && topk_rank(sel_b, K, v) < bu)) continue;
            if (!(fabs(score[u] - score[v]) <= thr)) return 0;
            // B's own scores must put its choice strictly first: an exact
            // tie in B is the tie-break convention's, which only the
            // control can vouch for
            if (!(score_b[v] > score_b[u])) return 0;
        }
    }
    return 1;
}

/* moe_topk mismatches confined to near ties of A's router probabilities
 * (td_cmp_topk_row_explained, the tolerance of the router audit: 4 x the
 * control pair's largest deviation over the token's probabilities). An
 * arm's router logits carry an honest error up to their budget, and two
 * experts whose probabilities lie that close may rank either way, which the
 * control, one draw of that error, need not show. Counts the explained
 * rows' mismatches in t->n_int_router_tie and marks them in row_ok. */
static int router_ties(ctx *c, int64_t step, const td_tap_info *b, const int64_t *va, const int64_t *vb,
                       unsigned char *row_ok, td_cmp_tap *t, td_err *err) {
    if (b->ndim != 2 || b->shape[0] < 1) return TD_OK;
    const int64_t T = b->shape[0], K = b->shape[1];
    char name[TD_TAP_NAME_MAX];
    snprintf(name, sizeof name, "%.*s.moe_probs", (int)(strlen(b->name) - strlen(".moe_topk")), b->name);
    int64_t ia = arm_find(&c->A, name), ib = arm_find(&c->B, name);
    if (ia < 0 || ib < 0) return TD_OK;
    const td_tap_info *sa = &c->A.taps[ia], *sb = &c->B.taps[ib];
    if (!sa->has_data || !sb->has_data || sa->ndim != 2 || sa->shape[0] != T || !same_shape(sa, sb) ||
        td_dtype_is_int(sa->dtype) || td_dtype_is_int(sb->dtype))
        return TD_OK;
    const int64_t X = sa->shape[1];
    const size_t n = (size_t)(T * X > 0 ? T * X : 1);
    double *xa = td_xmalloc(sizeof *xa * n), *xb = td_xmalloc(sizeof *xb * n), *ca = NULL, *cb = NULL;
    int st = td_tapfile_read_f64(c->A.f, step, name, xa, (uint64_t)(T * X), err);
    if (!st) st = td_tapfile_read_f64(c->B.f, step, name, xb, (uint64_t)(T * X), err);
    const td_tap_info *ci = NULL, *cj = NULL;
    if (!st) st = ctrl_pair(c, step, name, sb, &ci, &cj, err);
    if (!st && ci && ci->has_data && cj->has_data) {
        ca = td_xmalloc(sizeof *ca * n), cb = td_xmalloc(sizeof *cb * n);
        st = td_tapfile_read_f64(c->ca->f, step, ci->name, ca, (uint64_t)(T * X), err);
        if (!st) st = td_tapfile_read_f64(c->cb->f, step, cj->name, cb, (uint64_t)(T * X), err);
    }
    // the control's own picks: a row whose every mismatch the control shows
    // too is left to that stronger explanation (int_mismatch_in_ctrl)
    const td_tap_info *ti = NULL, *tj = NULL;
    int64_t *ka = NULL, *kb = NULL;
    if (!st) st = ctrl_pair(c, step, b->name, b, &ti, &tj, err);
    if (!st && ti && ti->has_data && tj->has_data) {
        ka = td_xmalloc(sizeof *ka * (size_t)(T * K)), kb = td_xmalloc(sizeof *kb * (size_t)(T * K));
        st = td_tapfile_read_i64(c->ca->f, step, ti->name, ka, (uint64_t)(T * K), err);
        if (!st) st = td_tapfile_read_i64(c->cb->f, step, tj->name, kb, (uint64_t)(T * K), err);
    }
    for (int64_t row = 0; !st && row < T; row++) {
        const int64_t *ra = va + row * K, *rb = vb + row * K;
        uint64_t mis = 0, in_ctrl = 0;
        for (int64_t j = 0; j < K; j++)
            if (ra[j] != rb[j]) mis++, in_ctrl += ka && ka[row * K + j] != kb[row * K + j];
        if (!mis || in_ctrl == mis) continue;
        const double thr = td_cmp_qsa_tie_thr(xa + row * X, xb + row * X, ca ? ca + row * X : NULL,
                                              ca ? cb + row * X : NULL, X, sb->dtype);
        if (td_cmp_topk_row_explained(ra, rb, K, xa + row * X, xb + row * X, X, thr)) {
            row_ok[row] = 1;
            t->n_int_router_tie += mis;
        }
    }
    free(xa), free(xb), free(ca), free(cb), free(ka), free(kb);
    return st;
}

static int is_moe_topk(const char *name) {
    const size_t n = strlen(name), k = strlen(".moe_topk");
    return n > k && !strcmp(name + n - k, ".moe_topk");
}

static int is_qsa_scores(const char *name) {
    const size_t n = strlen(name), k = strlen(".qsa_scores");
    return n > k && !strcmp(name + n - k, ".qsa_scores");
}

/* A QSA block score sums the ReLU'd dot products of RMS-normed indexer
 * queries and block keys (arch-qwen4exp.md §4.5): its rounding error is
 * relative to the magnitudes it sums, not to the sum, which cancels (a score
 * of 0.87 where the layer's are ~10 carries ~10x the relative error of
 * honest f32 arithmetic). Those magnitudes are the layer's score scale (the
 * vectors' norms are fixed by their RMSNorm up to the weights): the error of
 * the tap, and the control's, are taken relative to max(||a||, sqrt(n) x S),
 * S the largest |score| of this tap in A so far (this step included). A
 * bug that moves a score by a fraction of the layer's scale still shows. */
static void qsa_scores_scale(ctx *c, td_cmp_tap *t, double amax, uint64_t n, double d2, double a2, int ctrl_data,
                             double cd2, double cx2) {
    small_growth *q = named_entry(&c->qs, &c->n_qs, &c->cap_qs, t->name, 0);
    if (isfinite(amax) && amax > q->gmax) q->gmax = amax;
    const double s2 = (double)n * q->gmax * q->gmax;
    if (!(s2 > a2) || !isfinite(t->err)) return;
    t->err = t->err_finite = sqrt(d2 / s2);
    if (ctrl_data && s2 > cx2) t->err_ctrl = sqrt(cd2 / s2);
}

static int is_qsa_sel(const char *name) {
    const size_t n = strlen(name), k = strlen(".qsa_sel");
    return n > k && !strcmp(name + n - k, ".qsa_sel");
}

static int cmp_integer(ctx *c, int64_t step, const td_tap_info *a, const td_tap_info *b, td_cmp_tap *t,
                       td_err *err) {
    t->method = TD_CMP_INTEGER;
    if (!a->has_data || !b->has_data) {
        int eq = fp_int_equal(&a->fp, &b->fp);
        t->n_int_mismatch = eq ? 0 : 1;
        t->err = eq ? 0 : NAN; // how many differ is unknown without data
        if (!eq) {
            t->first_mismatch = 0;
            t->mis_a = a->fp.first[0];
            t->mis_b = b->fp.first[0];
        }
        return TD_OK;
    }
    uint64_t n = b->count;
    int64_t *va = td_xmalloc(sizeof *va * (size_t)(n ? n : 1)), *vb = td_xmalloc(sizeof *vb * (size_t)(n ? n : 1));
    int st = td_tapfile_read_i64(c->A.f, step, a->name, va, n, err);
    if (!st) st = td_tapfile_read_i64(c->B.f, step, b->name, vb, n, err);
    if (!st) {
        for (uint64_t i = 0; i < n; i++) {
            if (va[i] == vb[i]) continue;
            if (!t->n_int_mismatch) {
                t->first_mismatch = i;
                t->mis_a = (double)va[i];
                t->mis_b = (double)vb[i];
            }
            t->n_int_mismatch++;
        }
        t->err = n ? (double)t->n_int_mismatch / (double)n : 0.0;
    }
    unsigned char *row_ok = NULL; // qsa_sel rows explained by a boundary tie
    if (!st && t->n_int_mismatch && is_qsa_sel(b->name) && b->ndim == 2) {
        row_ok = td_xcalloc((size_t)(b->shape[0] ? b->shape[0] : 1), 1);
        st = qsa_sel_ties(c, step, b, va, vb, row_ok, t, err);
        // the control then counts only the other rows' mismatches
        for (int64_t row = 0; !st && row < b->shape[0]; row++)
            if (row_ok[row])
                for (int64_t j = 0; j < b->shape[1]; j++) vb[row * b->shape[1] + j] = va[row * b->shape[1] + j];
    }
    if (!st && t->n_int_mismatch && is_moe_topk(b->name) && b->ndim == 2) {
        row_ok = td_xcalloc((size_t)(b->shape[0] ? b->shape[0] : 1), 1);
        st = router_ties(c, step, b, va, vb, row_ok, t, err);
        for (int64_t row = 0; !st && row < b->shape[0]; row++)
            if (row_ok[row])
                for (int64_t j = 0; j < b->shape[1]; j++) vb[row * b->shape[1] + j] = va[row * b->shape[1] + j];
    }
    if (!st && t->n_int_mismatch > t->n_int_qsa_tie + t->n_int_router_tie)
        st = int_mismatch_in_ctrl(c, step, b, va, vb, t, err);
    free(row_ok);
    free(va);
    free(vb);
    return st;
}

// The control pair's error at this tap; ci/cj are the control taps (or NULL).
static int ctrl_pair(ctx *c, int64_t step, const char *name, const td_tap_info *b, const td_tap_info **ci,
                     const td_tap_info **cj, td_err *err) {
    *ci = *cj = NULL;
    if (!c->ca) return TD_OK;
    int st = arm_load(c->ca, step, err);
    if (!st) st = arm_load(c->cb, step, err);
    if (st) return st;
    if (!c->ca->present || !c->cb->present) return TD_OK;
    int64_t i = arm_find(c->ca, name), j = arm_find(c->cb, name);
    if (i < 0 || j < 0) return TD_OK;
    const td_tap_info *x = &c->ca->taps[i], *y = &c->cb->taps[j];
    if (!same_shape(x, b)) return refuse_shape(err, step, c->ca->path, x, c->B.path, b);
    if (!same_shape(y, b)) return refuse_shape(err, step, c->cb->path, y, c->B.path, b);
    *ci = x;
    *cj = y;
    return TD_OK;
}

/* Per-head norms: a tap that normalizes its input per head and row (each
 * head of each row scaled to a fixed RMS), that input, and a tap of the same
 * step whose last dimension counts the heads. The norm scales a head of small
 * norm up to full size, and its relative error with it: on qwen3next-q8_0's
 * Vulkan arm (8 tokens, step 3) blk.2.ssm_core's value heads 0 and 1 have a
 * quarter of the others' norm (S.q cancels), and there the arm's error is
 * 1.6e-5 and 1.3e-5 where the control's is 6.7e-6 and 4.1e-6, while the whole
 * tap is 3.75e-6 against 3.2e-6; after the norm ssm_gated is 1.22e-5 against
 * the control's 3.15e-6. */
typedef struct head_norm {
    const char *normed, *input, *heads;
} head_norm;

static const head_norm head_norms[] = {
    {"ssm_gated", "ssm_core", "ssm_beta"},
};

// The head_norms entry whose input (as_input) or normed tap `name` is, with
// the full name of its sibling in the same block: the heads tap for an
// input, the input for a normed tap. NULL when name is neither.
static const head_norm *head_norm_find(const char *name, int as_input, char sibling[TD_TAP_NAME_MAX]) {
    long L;
    const char *base = blk_base(name, &L);
    if (!base) return NULL;
    for (size_t i = 0; i < sizeof head_norms / sizeof head_norms[0]; i++) {
        const head_norm *h = &head_norms[i];
        if (strcmp(base, as_input ? h->input : h->normed)) continue;
        snprintf(sibling, TD_TAP_NAME_MAX, "blk.%ld.%s", L, as_input ? h->heads : h->input);
        return h;
    }
    return NULL;
}

// The values per head of b (cols per row) when a per-head norm reads it
// (head_norms) and the step's heads tap divides its rows, else 0.
static uint64_t head_size(const ctx *c, const td_tap_info *b, uint64_t cols) {
    char heads[TD_TAP_NAME_MAX];
    if (b->ndim != 2 || !cols || !head_norm_find(b->name, 1, heads)) return 0;
    const int64_t j = arm_find(&c->B, heads);
    if (j < 0 || c->B.taps[j].ndim < 1) return 0;
    const int64_t H = c->B.taps[j].shape[c->B.taps[j].ndim - 1];
    return H >= 1 && cols % (uint64_t)H == 0 ? cols / (uint64_t)H : 0;
}

// The largest relative L2 of y against x over the heads (hd values) of nr
// rows of cols values, and m; a head of zero norm in x, or holding a
// non-finite value, is skipped (the whole tap's metrics judge those).
static double head_max(const double *x, const double *y, int64_t nr, uint64_t cols, uint64_t hd, double m) {
    for (int64_t r = 0; r < nr; r++)
        for (uint64_t h0 = 0; h0 + hd <= cols; h0 += hd) {
            const double *xh = x + (uint64_t)r * cols + h0, *yh = y + (uint64_t)r * cols + h0;
            double d2 = 0, a2 = 0;
            int bad = 0;
            for (uint64_t j = 0; j < hd; j++) {
                bad |= !isfinite(xh[j]) || !isfinite(yh[j]);
                const double d = yh[j] - xh[j];
                d2 += d * d;
                a2 += xh[j] * xh[j];
            }
            if (bad || !(a2 > 0)) continue;
            const double e = sqrt(d2 / a2);
            if (isnan(m) || e > m) m = e;
        }
    return m;
}

// The sums and maxima of cmp_float's loop over finite values, kept in
// registers; hist counts the element's ULP bin (two histograms take turns so
// that equal bins in a row do not wait on each other's increment).
typedef struct {
    double d2, a2, b2, ab, rd2, ra2, amax, max_abs, ulp_max;
    uint64_t max_at;
    int have_max, top;
} fin_acc;

static inline __attribute__((always_inline)) void fin_elem(fin_acc *f, double x, double y, uint64_t at,
                                                           const ulp_kind *uk, uint64_t *hist) {
    double d = y - x, dd = d * d;
    f->d2 += dd;
    f->a2 += x * x;
    if (fabs(x) > f->amax) f->amax = fabs(x);
    f->b2 += y * y;
    f->ab += x * y;
    f->rd2 += dd;
    f->ra2 += x * x;
    double ad = fabs(d);
    if (!f->have_max || ad > f->max_abs) {
        f->max_abs = ad;
        f->max_at = at;
        f->have_max = 1;
    }
    double u = in_ulps(ad, x, uk);
    if (u > f->ulp_max) f->ulp_max = u;
    int bin = ulp_bin(u);
    hist[bin]++;
    if (bin + 1 > f->top) f->top = bin + 1;
}

static int cmp_float(ctx *c, int64_t step, const td_tap_info *a, const td_tap_info *b, td_cmp_tap *t,
                     td_err *err) {
    const td_tap_info *ci, *cj;
    int st = ctrl_pair(c, step, b->name, b, &ci, &cj, err);
    if (st) return st;
    int ctrl_data = ci && ci->has_data && cj->has_data;
    if (ci && !ctrl_data) {
        t->ctrl = TD_CTRL_FINGERPRINT;
        t->err_ctrl = fp_lower_bound(&ci->fp, &cj->fp);
    }

    if (!a->has_data || !b->has_data) {
        t->method = TD_CMP_FINGERPRINT;
        t->err = fp_lower_bound(&a->fp, &b->fp);
        t->err_finite = t->err;
        t->nf_a[0] = a->fp.n_nonfinite;
        t->nf_b[0] = b->fp.n_nonfinite;
        if (a->fp.n_nonfinite != b->fp.n_nonfinite) {
            uint64_t x = a->fp.n_nonfinite, y = b->fp.n_nonfinite;
            t->n_nonfinite_mismatch = x > y ? x - y : y - x;
        } else {
            t->n_nonfinite_both = a->fp.n_nonfinite; // same count: where is unknown
        }
        // A fingerprint over non-finite values bounds nothing.
        if (a->fp.n_nonfinite || b->fp.n_nonfinite) t->err = NAN;
        // A data control is still streamed below (only the control pair).
        if (!ctrl_data) return TD_OK;
    } else {
        t->method = TD_CMP_DATA;
    }

    uint64_t count = b->count;
    int64_t rows = b->ndim >= 2 ? b->shape[0] : 1;
    uint64_t cols = rows > 0 ? count / (uint64_t)rows : 0;
    if (count == 0) {
        t->err = 0;
        if (ctrl_data) t->ctrl = TD_CTRL_DATA, t->err_ctrl = 0;
        return TD_OK;
    }
    int data = t->method == TD_CMP_DATA;
    int64_t block = b->ndim >= 2 ? (int64_t)(BLOCK_ELEMS / cols) : 1;
    if (block < 1) block = 1;
    ensure_bufs(c, (uint64_t)block * cols);
    if (data) ensure_cols(c, cols);
    int logits = data && !strcmp(b->name, "out.logits") && b->ndim == 2;
    if (logits) {
        ensure_lg(c, rows);
        t->is_logits = 1;
        t->lg_rows = rows;
        t->lg_topk_min = 1.0;
    }
    memset(c->ulp_hist, 0, sizeof *c->ulp_hist * (size_t)c->ulp_top);
    memset(c->ulp_hist + ULP_BINS, 0, sizeof *c->ulp_hist * (size_t)c->ulp_top);
    c->ulp_top = 0;

    double d2 = 0, a2 = 0, b2 = 0, ab = 0, cd2 = 0, cx2 = 0, cy2 = 0, topk_sum = 0, amax = 0;
    double row_d2s[TD_CMP_N_WHERE];
    where_reset(t->rows, row_d2s);
    uint64_t n_ulp = 0;
    int have_max = 0;
    t->ulp_max = 0;
    int ctrl_alias_a = c->ca == &c->A;
    const ulp_kind uk = ulp_kind_of(b->dtype);
    const uint64_t hd = head_size(c, b, cols);
    t->head_n = hd;
    for (int64_t r0 = 0; r0 < rows; r0 += block) {
        int64_t nr = rows - r0 < block ? rows - r0 : block;
        uint64_t n = (uint64_t)nr * cols;
        if (data || ctrl_alias_a) {
            if ((st = read_block(&c->A, step, a, r0, nr, n, c->ba, err))) return st;
        }
        if (data && (st = read_block(&c->B, step, b, r0, nr, n, c->bb, err))) return st;
        if (ctrl_data) {
            if (!ctrl_alias_a && (st = read_block(c->ca, step, ci, r0, nr, n, c->bca, err))) return st;
            if ((st = read_block(c->cb, step, cj, r0, nr, n, c->bcb, err))) return st;
            const double *x = ctrl_alias_a ? c->ba : c->bca, *y = c->bcb;
            for (uint64_t i = 0; i < n; i++) {
                if (!isfinite(x[i]) || !isfinite(y[i])) continue;
                double d = y[i] - x[i];
                cd2 += d * d;
                cx2 += x[i] * x[i];
                cy2 += y[i] * y[i];
            }
            if (hd) t->err_ctrl_head = head_max(x, y, nr, cols, hd, t->err_ctrl_head);
        }
        if (!data) continue;
        if (hd) t->err_head = head_max(c->ba, c->bb, nr, cols, hd, t->err_head);
        for (int64_t r = 0; r < nr; r++) {
            const double *ar = c->ba + (uint64_t)r * cols, *br = c->bb + (uint64_t)r * cols;
            double rd2 = 0, ra2 = 0;
            // |v| <= DBL_MAX is false for NaN and infinities; this form vectorizes
            int bad = 0;
            for (uint64_t j = 0; j < cols; j++) bad |= !(fabs(ar[j]) <= DBL_MAX) | !(fabs(br[j]) <= DBL_MAX);
            if (!bad) {
                // The loop below without its non-finite branches, its maxima
                // in registers and the column sums in a loop of their own
                // (vectorized): every sum adds the same terms in the same
                // order, so every result keeps its bits.
                fin_acc f = {d2, a2, b2, ab, 0, 0, amax, t->max_abs, t->ulp_max, t->max_index, have_max, c->ulp_top};
                uint64_t base = (uint64_t)(r0 + r) * cols, j = 0;
                uint64_t *h0 = c->ulp_hist, *h1 = c->ulp_hist + ULP_BINS;
                for (; j + 1 < cols; j += 2) {
                    fin_elem(&f, ar[j], br[j], base + j, &uk, h0);
                    fin_elem(&f, ar[j + 1], br[j + 1], base + j + 1, &uk, h1);
                }
                if (j < cols) fin_elem(&f, ar[j], br[j], base + j, &uk, h0);
                d2 = f.d2, a2 = f.a2, b2 = f.b2, ab = f.ab, rd2 = f.rd2, ra2 = f.ra2, amax = f.amax;
                have_max = f.have_max;
                c->ulp_top = f.top;
                n_ulp += cols;
                t->max_abs = f.max_abs;
                t->ulp_max = f.ulp_max;
                t->max_index = f.max_at;
                double *cd2 = c->col_d2, *ca2 = c->col_a2;
                for (uint64_t j = 0; j < cols; j++) {
                    double d = br[j] - ar[j];
                    cd2[j] += d * d;
                    ca2[j] += ar[j] * ar[j];
                }
                where_push(t->rows, row_d2s, r0 + r, rd2, rel_l2(rd2, ra2, rd2 > 0 ? 1 : 0));
                if (logits) logits_row(c, t, ar, br, (int64_t)cols, r0 + r, &topk_sum);
                continue;
            }
            for (uint64_t j = 0; j < cols; j++) {
                double x = ar[j], y = br[j];
                if (!isfinite(x) || !isfinite(y)) {
                    if (!nf_total(t->nf_a) && !nf_total(t->nf_b)) {
                        t->first_nonfinite = (uint64_t)(r0 + r) * cols + j;
                        t->nf_first_a = x;
                        t->nf_first_b = y;
                    }
                    nf_count(t->nf_a, x);
                    nf_count(t->nf_b, y);
                    if (!isfinite(x) && !isfinite(y) && same_nonfinite(x, y)) {
                        t->n_nonfinite_both++;
                        continue;
                    }
                    if (!t->n_nonfinite_mismatch) {
                        t->first_mismatch = (uint64_t)(r0 + r) * cols + j;
                        t->mis_a = x;
                        t->mis_b = y;
                    }
                    t->n_nonfinite_mismatch++;
                    continue;
                }
                double d = y - x, dd = d * d;
                d2 += dd;
                a2 += x * x;
                if (fabs(x) > amax) amax = fabs(x);
                b2 += y * y;
                ab += x * y;
                rd2 += dd;
                ra2 += x * x;
                c->col_d2[j] += dd;
                c->col_a2[j] += x * x;
                double ad = fabs(d);
                if (!have_max || ad > t->max_abs) {
                    t->max_abs = ad;
                    t->max_index = (uint64_t)(r0 + r) * cols + j;
                    have_max = 1;
                }
                double u = ad / ulp_of(x, &uk);
                if (u > t->ulp_max) t->ulp_max = u;
                ulp_add(c, u);
                n_ulp++;
            }
            where_push(t->rows, row_d2s, r0 + r, rd2, rel_l2(rd2, ra2, rd2 > 0 ? 1 : 0));
            if (logits) logits_row(c, t, ar, br, (int64_t)cols, r0 + r, &topk_sum);
        }
    }
    if (ctrl_data) {
        t->ctrl = TD_CTRL_DATA;
        t->err_ctrl = rel_l2(cd2, cx2, cy2);
    }
    if (!data) return TD_OK;

    t->err = t->err_finite = rel_l2(d2, a2, b2);
    if (is_qsa_scores(b->name)) qsa_scores_scale(c, t, amax, count, d2, a2, ctrl_data, cd2, cx2);
    if (!have_max) t->max_abs = 0;
    t->cosine = a2 > 0 && b2 > 0 ? ab / sqrt(a2 * b2) : (a2 == 0 && b2 == 0 ? 1.0 : 0.0);
    if (nf_total(t->nf_a) || nf_total(t->nf_b)) {
        // The error of a tap with non-finite values is not its finite part's.
        t->err = t->nf_a[0] || t->nf_b[0] ? NAN : INFINITY;
        t->cosine = NAN;
    }
    if (!n_ulp) t->ulp_max = NAN;
    t->ulp_median = ulp_median(c, n_ulp);
    where_share(t->rows, row_d2s, d2);
    if (rows <= 1 && b->ndim < 2) where_reset(t->rows, row_d2s); // no positions in a 1-D tap
    double col_d2s[TD_CMP_N_WHERE];
    where_reset(t->cols, col_d2s);
    for (uint64_t j = 0; j < cols; j++) // where_push's own test first: the error only for columns it keeps
        if (c->col_d2[j] > col_d2s[TD_CMP_N_WHERE - 1])
            where_push(t->cols, col_d2s, (int64_t)j, c->col_d2[j], rel_l2(c->col_d2[j], c->col_a2[j], c->col_d2[j]));
    where_share(t->cols, col_d2s, d2);
    if (logits) t->lg_topk_mean = rows ? topk_sum / (double)rows : 1.0;
    return TD_OK;
}

// The axis of t that slides over rows copied from its catalog input and from
// its own previous value (td_tap_catalog_copy_axis; the conv state), or -1.
static int copy_axis(const td_cmp_tap *t) {
    const td_tap_entry *e = td_tap_catalog_find(t->name, NULL);
    const int axis = e ? td_tap_catalog_copy_axis(e) : -1;
    return axis >= 0 && axis < t->ndim ? axis : -1;
}

// The control error a sliding copy carries: each of its S slots keeps its
// source's, the input's control error of the step that wrote it. A step of T
// tokens moves the slots T back and writes the last min(T, S) from its
// input; the rest are the previous step's value, whose rows came from
// earlier steps (after a prefill with f16 operands, a decode step's state
// still holds prefill rows and their error). Without the previous step's
// slots (not compared), every slot counts as this step's input. Returns the
// largest slot's error: the state's relative error is a weighted mean of its
// slots'.
static double copy_carried(ctx *c, const td_cmp_tap *t, int axis, double from_in) {
    const int64_t S = (int64_t)t->shape[axis], T = t->n_tokens > 0 ? t->n_tokens : 1;
    int i = 0;
    while (i < c->n_cs && strcmp(c->cs[i].name, t->name)) i++;
    if (i == c->n_cs) {
        if (c->n_cs == c->cap_cs) {
            c->cap_cs = c->cap_cs ? 2 * c->cap_cs : 16;
            c->cs = td_xrealloc(c->cs, (size_t)c->cap_cs * sizeof *c->cs);
        }
        memset(&c->cs[i], 0, sizeof c->cs[i]);
        snprintf(c->cs[i].name, sizeof c->cs[i].name, "%s", t->name);
        c->cs[i].step = -2;
        c->n_cs++;
    }
    copy_slots *k = &c->cs[i];
    const int carry = k->step == t->step - 1 && k->n == S;
    if (k->n != S) {
        k->src = td_xrealloc(k->src, sizeof *k->src * (size_t)(S ? S : 1));
        k->n = S;
    }
    for (int64_t j = 0; j < S; j++) k->src[j] = carry && j + T < S ? k->src[j + T] : from_in;
    k->step = t->step;
    double m = 0;
    for (int64_t j = 0; j < S; j++)
        if (k->src[j] > m) m = k->src[j];
    return m;
}

// Applies the budget (and the logits row checks) once err and err_ctrl are
// known. Priority of the failure kinds: non-finite, budget, top-1, KL.
static void judge(ctx *c, td_cmp_tap *t, const td_cmp_tap *in, double cached, double passed,
                  const td_cmp_tap *hn) {
    if (t->method == TD_CMP_INTEGER) {
        int bug = t->n_int_mismatch > t->n_int_in_ctrl + t->n_int_qsa_tie + t->n_int_router_tie;
        t->fail = bug ? TD_CMPF_INTEGER : TD_CMPF_OK;
        t->ratio = bug ? INFINITY : 0.0;
        if (!bug && t->n_int_qsa_tie)
            add_note(c->r, "step %lld %s: %llu mismatch(es) in rows whose selections differ only inside the boundary "
                           "group (blocks tied with the budget's cut, per qsa_scores): not divergent",
                     (long long)t->step, t->name, (unsigned long long)t->n_int_qsa_tie);
        if (!bug && t->n_int_router_tie)
            add_note(c->r, "step %lld %s: %llu mismatch(es) in rows whose experts differ only between near-tied "
                           "router probabilities (within 4x the control's deviation, per moe_probs): not divergent",
                     (long long)t->step, t->name, (unsigned long long)t->n_int_router_tie);
        if (!bug && t->n_int_in_ctrl)
            add_note(c->r, "step %lld %s: %llu integer mismatch(es) that the control arm shows too (the same "
                           "arithmetic decides them the same way): not divergent",
                     (long long)t->step, t->name, (unsigned long long)t->n_int_in_ctrl);
        return;
    }
    double fl = c->r->floor_override > 0 ? c->r->floor_override : td_cmp_floor(t->dtype_b);
    if (t->method == TD_CMP_FINGERPRINT && t->ctrl != TD_CTRL_DATA && fl < TD_CMP_FP_FLOOR) fl = TD_CMP_FP_FLOOR;
    t->floor = fl;
    // A tap of few values: its own control error is one noisy draw; the
    // control error its input carried (measured over more values) counts too.
    // It may amplify that error as much as the control's largest growth there so far.
    t->err_ctrl_used = t->ctrl != TD_CTRL_NONE ? t->err_ctrl : NAN;
    // A tap that holds a copy of some rows of its input (the conv state: the
    // last K-1 rows of ssm_qkv) adds no arithmetic of its own: its few rows
    // are one draw of the control error its input measured over all of them,
    // so that error counts for it too, unamplified (a copy grows nothing);
    // the rows it carries from earlier steps keep their own step's.
    const int axis = in ? copy_axis(t) : -1, copy = axis >= 0;
    // The control's growth from the input is learnt at every step of a tap
    // whose per-token row is small, the prefill's too: there it is measured
    // over all the prompt's rows, a steadier draw than the first decode
    // step's one row (qwen3next-f32, 40 tokens: both arms' blk.0.moe_probs
    // at step 1 grew the router logits' error 5x where the control's one row
    // shrank it, r 1.07 with no growth known yet; the prefill showed 1.37).
    const int small = t->count < TD_CMP_SMALL_TAP;
    const int small_rows = small || (t->n_tokens > 1 && t->count / (uint64_t)t->n_tokens < TD_CMP_SMALL_TAP);
    double g = 1.0;
    if (small_rows && !copy && in && t->ctrl != TD_CTRL_NONE && in->ctrl != TD_CTRL_NONE && in->err_ctrl > 0 &&
        isfinite(t->err_ctrl) && isfinite(in->err_ctrl)) {
        small_growth *e = named_entry(&c->sg, &c->n_sg, &c->cap_sg, t->name, 0);
        const double gi = t->err_ctrl / in->err_ctrl;
        if (gi > e->gmax) e->gmax = gi;
        if (e->gmax > g) g = e->gmax < TD_CMP_SMALL_GROWTH ? e->gmax : TD_CMP_SMALL_GROWTH;
    }
    if ((small || copy) && in && !isnan(in->err_ctrl_used)) {
        const double from_in = copy ? copy_carried(c, t, axis, in->err_ctrl_used) : in->err_ctrl_used * g;
        t->err_ctrl_used = fmax(t->err_ctrl_used, from_in); // fmax: a NaN (none yet) counts as missing
    }
    // The error of earlier steps' cached rows: read here (cached_inputs) or
    // passed on by its inputs (carried_on). What this tap passes on is the
    // part of its own error that term explains: never more than the tap
    // showed, so where the arm is as close as the control nothing after it
    // is loosened.
    const double carried = fmax(cached, passed);
    if (!isnan(carried)) {
        t->err_ctrl_used = fmax(t->err_ctrl_used, carried);
        t->carried = isfinite(t->err) && t->err < carried ? t->err : carried;
    }
    // A per-head norm of hn (head_norms): each head comes out with its own
    // relative error, so the control's largest per head is what honest
    // arithmetic leaves in some head of this tap (and in the taps after it,
    // which carry it on as they carry cached rows' error: once per link, at
    // most what this tap showed). The arm's input is judged head by head at
    // hn itself, so a bug in one head is not diluted by the others there.
    if (hn && !isnan(hn->err_ctrl_head)) {
        const double h = hn->err_ctrl_head, pass = isfinite(t->err) && t->err < h ? t->err : h;
        t->err_ctrl_used = fmax(t->err_ctrl_used, h);
        t->carried = fmax(t->carried, pass);
    }
    double kc = !isnan(t->err_ctrl_used) ? c->r->k * t->err_ctrl_used : 0.0;
    t->budget = kc > fl ? kc : fl;
    t->ratio = t->budget > 0 ? t->err / t->budget : (t->err > 0 ? INFINITY : 0.0);
    // A tap a per-head norm reads: its worst head against the control's
    // worst (or what the whole tap's budget allows, when that is more).
    if (!isnan(t->err_head) && !isnan(t->err_ctrl_head)) {
        double u = fmax(t->err_ctrl_head, t->err_ctrl_used);
        // A head of few values is one draw, as a small tap is: which head
        // the arithmetic's error lands in, and how far a head whose S.q
        // cancels scales it up, differ from draw to draw. On qwen4exp-ties'
        // Vulkan arm (40 tokens, 64 steps) blk.2.ssm_core's heads hold 32
        // values; at step 55 the arm's head 2 (half the others' norm) is
        // 5.46e-5 from the oracle where the control's worst head is 1.36e-5
        // and its whole tap 1.27e-5, while the inputs are as close on both
        // arms (the previous state's head 2 1.03e-5 / 1.12e-5), and the
        // control's own worst head was 3.3x its whole tap at the prefill and
        // at step 43. So the control's worst head counts as at least its
        // whole tap's error (measured over every head) times the largest
        // such spread the control showed at this tap so far, at most
        // TD_CMP_SMALL_GROWTH. The spread is the control's, never the
        // arm's: a bug in one head does not widen it.
        if (t->head_n < TD_CMP_SMALL_TAP && t->err_ctrl > 0 && isfinite(t->err_ctrl)) {
            small_growth *e = named_entry(&c->hs, &c->n_hs, &c->cap_hs, t->name, 0);
            const double gi = t->err_ctrl_head / t->err_ctrl;
            if (gi > e->gmax) e->gmax = gi;
            const double spread = t->err_ctrl * (e->gmax < TD_CMP_SMALL_GROWTH ? e->gmax : TD_CMP_SMALL_GROWTH);
            u = fmax(u, spread);
        }
        const double hb = c->r->k * u > fl ? c->r->k * u : fl;
        const double hr = hb > 0 ? t->err_head / hb : (t->err_head > 0 ? INFINITY : 0.0);
        if (hr > t->ratio) t->ratio = hr;
    }
    if (t->is_logits) {
        double kl_sum = 0;
        int64_t kl_n = 0;
        t->lg_kl_max = 0;
        for (int64_t r = 0; r < t->lg_rows; r++) {
            double nrm = c->lg_norm[r], m = c->lg_margin[r], kl = c->lg_kl[r];
            if (!isnan(m) && m > 2.0 * t->budget * nrm) t->lg_top1_unexplained++;
            if (isnan(kl)) continue;
            kl_sum += kl;
            kl_n++;
            if (kl >= t->lg_kl_max) {
                t->lg_kl_max = kl;
                t->lg_worst_row = r;
            }
            double kb = t->budget * nrm;
            if (kl > kb * kb) t->lg_kl_over++;
        }
        t->lg_kl_mean = kl_n ? kl_sum / (double)kl_n : NAN;
    }
    if (t->n_nonfinite_mismatch)
        t->fail = TD_CMPF_NONFINITE;
    else if (t->n_nonfinite_both)
        t->fail = TD_CMPF_NONFINITE_BOTH;
    else if (!(t->ratio <= 1.0))
        t->fail = TD_CMPF_BUDGET;
    else if (t->lg_top1_unexplained)
        t->fail = TD_CMPF_TOP1;
    else if (t->lg_kl_over)
        t->fail = TD_CMPF_KL;
}

/* ---------------------------------------------------------- records */

/* Where the records of compared taps live. A record is ~750 bytes and a long
 * pair holds millions of taps, so the records of finished steps go to an
 * unnamed temporary file and only the current step's stay in memory (the
 * producer map looks up taps of the same step only). Without a temporary
 * file, or once writing it fails, the records are kept in memory instead:
 * more memory, nothing lost. */
struct td_cmp_store {
    FILE *spill;        // unnamed temporary file (read and written by its fd)
    int64_t n_file;     // records 0 .. n_file-1 are in the file
    td_cmp_tap *mem;    // records n_file .. n_file+n_mem-1
    int64_t n_mem, mem_cap;
    td_cmp_tap *win;    // the current step's records: win_first ..
    int64_t win_first, win_n, win_cap;
    int64_t peak;       // most records held in memory at once
    td_cmp_tap first;   // a copy of the first divergent record (r->first)
    td_cmp_tap slot[TD_CMP_TAP_SLOTS];
    unsigned next;
};

static td_cmp_tap *push_tap(td_cmp_result *r) {
    struct td_cmp_store *s = r->store;
    if (s->win_n == 0) s->win_first = r->n_taps;
    if (s->win_n == s->win_cap) {
        s->win_cap = s->win_cap ? 2 * s->win_cap : 256;
        s->win = td_xrealloc(s->win, sizeof *s->win * (size_t)s->win_cap);
    }
    r->n_taps++;
    return &s->win[s->win_n++];
}

// Record i of the current step (i >= the step's first index).
static td_cmp_tap *win_tap(const td_cmp_result *r, int64_t i) {
    return &r->store->win[i - r->store->win_first];
}

static void mem_append(struct td_cmp_store *s, const td_cmp_tap *t, int64_t n) {
    if (s->n_mem + n > s->mem_cap) {
        while (s->n_mem + n > s->mem_cap) s->mem_cap = s->mem_cap ? 2 * s->mem_cap : 256;
        s->mem = td_xrealloc(s->mem, sizeof *s->mem * (size_t)s->mem_cap);
    }
    memcpy(s->mem + s->n_mem, t, sizeof *t * (size_t)n);
    s->n_mem += n;
}

// Moves the current step's records out of the window (to the file while it
// takes them, then to memory).
static void flush_step(td_cmp_result *r) {
    struct td_cmp_store *s = r->store;
    if (s->n_mem + s->win_n > s->peak) s->peak = s->n_mem + s->win_n;
    if (r->first >= s->win_first && r->first < s->win_first + s->win_n) s->first = *win_tap(r, r->first);
    int64_t done = 0;
    if (s->spill && s->n_mem == 0) {
        const char *p = (const char *)s->win;
        size_t left = sizeof *s->win * (size_t)s->win_n, put = 0;
        int fd = fileno(s->spill);
        while (left) {
            ssize_t w = pwrite(fd, p + put, left, (off_t)(sizeof *s->win * (size_t)s->n_file) + (off_t)put);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) break;
            put += (size_t)w;
            left -= (size_t)w;
        }
        done = (int64_t)(put / sizeof *s->win);
        s->n_file += done;
    }
    if (done < s->win_n) mem_append(s, s->win + done, s->win_n - done);
    s->win_n = 0;
}

const td_cmp_tap *td_cmp_tap_at(const td_cmp_result *r, int64_t i) {
    if (!r || !r->store || i < 0 || i >= r->n_taps) return NULL;
    struct td_cmp_store *s = r->store;
    if (s->win_n && i >= s->win_first) return win_tap(r, i);
    if (i == r->first) return &s->first;
    if (i >= s->n_file) return &s->mem[i - s->n_file];
    td_cmp_tap *t = &s->slot[s->next++ % TD_CMP_TAP_SLOTS];
    char *p = (char *)t;
    size_t left = sizeof *t, got = 0;
    while (left) {
        ssize_t n = pread(fileno(s->spill), p + got, left, (off_t)(sizeof *t * (size_t)i) + (off_t)got);
        if (n < 0 && errno == EINTR) continue;
        // A temporary file that cannot give back what was written to it is an
        // I/O failure like running out of memory: no report can be made.
        if (n <= 0) td_abort_(__FILE__, __LINE__, "reading back a compare record from the temporary file");
        got += (size_t)n;
        left -= (size_t)n;
    }
    return t;
}

int64_t td_cmp_records_peak(const td_cmp_result *r) { return r && r->store ? r->store->peak : 0; }

static void store_free(struct td_cmp_store *s) {
    if (!s) return;
    if (s->spill) fclose(s->spill);
    free(s->mem);
    free(s->win);
    free(s);
}

/* ----------------------------------------------------------- growth */

static const td_cmp_tap *step_result(ctx *c, int64_t step_first, const char *name) {
    int64_t i = arm_find(&c->B, name);
    if (i < 0 || c->res_of[i] < step_first) return NULL;
    return win_tap(c->r, c->res_of[i]);
}

// Finds t's input (producer map, else the previous float tap) and sets
// t->input, err_input and growth; returns the input's record or NULL.
static const td_cmp_tap *growth(ctx *c, int64_t step_first, td_cmp_tap *t) {
    if (t->method == TD_CMP_INTEGER) return NULL; // exact or not: no error to amplify
    char groups[3][3][TD_TAP_NAME_MAX];
    int last_out;
    int ng = td_cmp_inputs(t->name, groups, 3, &last_out);
    const td_cmp_tap *best = NULL;
    for (int g = 0; g < ng; g++) {
        for (int a = 0; a < 3 && groups[g][a][0]; a++) {
            const td_cmp_tap *in = step_result(c, step_first, groups[g][a]);
            if (!in || in->method == TD_CMP_INTEGER || in->seq >= t->seq) continue;
            if (!best || in->err > best->err) best = in;
            break;
        }
    }
    int64_t self = c->r->n_taps - 1; // t is the record pushed last
    if (!best && last_out) {
        for (int64_t i = self - 1; i >= step_first; i--) {
            long L;
            const char *base = blk_base(win_tap(c->r, i)->name, &L);
            if (base && !strcmp(base, "out")) {
                best = win_tap(c->r, i);
                break;
            }
        }
    }
    if (!best && !last_out && strcmp(t->name, "inp.embd")) {
        for (int64_t i = self - 1; i >= step_first; i--)
            if (win_tap(c->r, i)->method != TD_CMP_INTEGER) {
                best = win_tap(c->r, i);
                break;
            }
    }
    if (!best) return NULL;
    snprintf(t->input, sizeof t->input, "%s", best->name);
    t->err_input = best->err;
    if (isnan(best->err) || isnan(t->err)) return best;
    if (best->err > 0)
        t->growth = t->err / best->err;
    else
        t->growth = t->err > 0 ? INFINITY : 1.0;
    return best;
}

// The control error t carries from rows earlier steps cached: attention
// reads the K/V rows every earlier step wrote, with the error those steps
// measured (a prefill's f16 operands), which the step's own taps do not show;
// a one-token step's control error is one draw of it through one query
// (qwen4exp-f32 on the Vulkan arm, 40-token prefill: 3.4e-5 to 1.9e-4 at
// blk.1.attn_ctx over the decode steps, the prefill's K/V rows 1.0e-4; the
// arm 1.6e-4 at step 5 where the control drew 3.7e-5). Such a reader carries
// its cached inputs' largest error unamplified; the taps after it take what
// it passes on (carried_on). This is the largest control error (as used) of
// the cached inputs t reads (td_tap_catalog_cached_groups) over this step
// and the earlier ones; NAN when t reads none or none had a control.
static double cached_inputs(ctx *c, int64_t step_first, const td_cmp_tap *t) {
    if (t->method == TD_CMP_INTEGER) return NAN;
    const td_tap_entry *e = td_tap_catalog_find(t->name, NULL);
    const unsigned mask = e ? td_tap_catalog_cached_groups(e) : 0;
    if (!mask) return NAN;
    char groups[3][3][TD_TAP_NAME_MAX];
    int last_out;
    const int ng = td_cmp_inputs(t->name, groups, 3, &last_out);
    double m = NAN;
    for (int g = 0; g < ng; g++) {
        if (!(mask >> g & 1)) continue;
        for (int a = 0; a < 3 && groups[g][a][0]; a++) {
            const td_cmp_tap *in = step_result(c, step_first, groups[g][a]);
            if (!in || in->method == TD_CMP_INTEGER || in->seq >= t->seq) continue;
            small_growth *k = named_entry(&c->kc, &c->n_kc, &c->cap_kc, in->name, NAN);
            if (!isnan(in->err_ctrl_used) && (isnan(k->gmax) || in->err_ctrl_used > k->gmax)) k->gmax = in->err_ctrl_used;
            if (!isnan(k->gmax) && (isnan(m) || k->gmax > m)) m = k->gmax;
            break;
        }
    }
    return m;
}

// What one input passes on to t: the error it carried times the growth the
// control shows on this link at this step (t's control error over the
// input's, at most TD_CMP_SMALL_GROWTH); NAN when it carries none.
static double passed_by(const td_cmp_tap *t, const td_cmp_tap *in) {
    if (!in || isnan(in->carried) || in->ctrl == TD_CTRL_NONE || !(in->err_ctrl > 0) || !isfinite(in->err_ctrl))
        return NAN;
    const double g = t->err_ctrl / in->err_ctrl;
    return in->carried * (g < TD_CMP_SMALL_GROWTH ? g : TD_CMP_SMALL_GROWTH);
}

// The cached rows' error t's inputs pass on to it. A one-token step's
// attn_ctx is one draw of the K/V cache's error through one query, and so is
// every control error after it at that step: on the Vulkan arm (qwen4exp-f32,
// 40 tokens, step 5) the arm's blk.1.attn_ctx is 1.6e-4 and its attn_gated
// 1.65e-4 where the control drew 3.7e-5 and 3.8e-5, the prefill's K/V rows
// 1.0e-4, and the excess runs on through attn_out, the residual, the FFN and
// block 2 (r 0.9..1.6 there). Each tap takes the largest of what its inputs
// (producer map, else growth()'s input `in`) carried times the control's
// growth on that one link, at this step; what it carries on is at most its
// own error (judge). So along a chain the growths of one step multiply to the
// control's growth from attention to t, never to a product of each link's
// largest growth over the steps (which compounded: test_thresholds' 3e-6 at
// llama-f32's blk.1.ffn_up and qwen3-f32's blk.1.attn_out went uncaught), and
// the term dies out wherever the arm is as close as the control. A bug at t
// adds to t's error, not to its inputs', so t's budget does not grow with it.
// NAN when no input carries anything, or t lacks a control.
static double carried_on(ctx *c, int64_t step_first, const td_cmp_tap *t, const td_cmp_tap *in) {
    if (t->method == TD_CMP_INTEGER || t->ctrl == TD_CTRL_NONE || !isfinite(t->err_ctrl)) return NAN;
    double m = passed_by(t, in);
    char groups[3][3][TD_TAP_NAME_MAX];
    int last_out;
    const int ng = td_cmp_inputs(t->name, groups, 3, &last_out);
    for (int g = 0; g < ng; g++) {
        for (int a = 0; a < 3 && groups[g][a][0]; a++) {
            const td_cmp_tap *x = step_result(c, step_first, groups[g][a]);
            if (!x || x->method == TD_CMP_INTEGER || x->seq >= t->seq) continue;
            const double p = passed_by(t, x);
            if (!isnan(p) && (isnan(m) || p > m)) m = p;
            break;
        }
    }
    return m;
}

// The record of the input t normalizes per head (head_norms) at this step,
// when it was measured head by head; else NULL.
static const td_cmp_tap *head_norm_input(ctx *c, int64_t step_first, const td_cmp_tap *t) {
    char input[TD_TAP_NAME_MAX];
    if (t->method == TD_CMP_INTEGER || !head_norm_find(t->name, 0, input)) return NULL;
    const td_cmp_tap *x = step_result(c, step_first, input);
    return x && x->seq < t->seq && !isnan(x->err_ctrl_head) ? x : NULL;
}

/* ------------------------------------------------------------ driver */

static void add_note(td_cmp_result *r, const char *fmt, ...) {
    if (r->n_notes >= (int)(sizeof r->notes / sizeof r->notes[0])) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->notes[r->n_notes++], sizeof r->notes[0], fmt, ap);
    va_end(ap);
}

static void note_missing(td_cmp_result *r, const char *which, int64_t step, const char *name) {
    if (r->missing_example[0]) return;
    snprintf(r->missing_example, sizeof r->missing_example, "%s at step %lld is only in %s", name, (long long)step,
             which);
}


// Compares the inp.tokens of x and y at `step` (both loaded). Returns TD_OK
// with *differs = 0/1 (and the first differing index and values), or an
// error. Taps absent, without data or of other shapes count as "cannot say"
// (*differs = 0; shapes are refused elsewhere).
static int tokens_differ(const arm *x, const arm *y, int64_t step, int *differs, uint64_t *at, int64_t *vx,
                         int64_t *vy, td_err *err) {
    *differs = 0;
    int64_t i = arm_find(x, "inp.tokens"), j = arm_find(y, "inp.tokens");
    if (i < 0 || j < 0) return TD_OK;
    const td_tap_info *a = &x->taps[i], *b = &y->taps[j];
    if (!a->has_data || !b->has_data || !td_dtype_is_int(a->dtype) || !td_dtype_is_int(b->dtype) ||
        !same_shape(a, b))
        return TD_OK;
    uint64_t n = a->count;
    int64_t *va = td_xmalloc(sizeof *va * (size_t)(n ? n : 1)), *vb = td_xmalloc(sizeof *vb * (size_t)(n ? n : 1));
    int st = td_tapfile_read_i64(x->f, step, "inp.tokens", va, n, err);
    if (!st) st = td_tapfile_read_i64(y->f, step, "inp.tokens", vb, n, err);
    for (uint64_t k = 0; !st && k < n; k++)
        if (va[k] != vb[k]) {
            *differs = 1;
            *at = k;
            *vx = va[k];
            *vy = vb[k];
            break;
        }
    free(va);
    free(vb);
    return st;
}

static int check_tokens(ctx *c, int64_t step, td_err *err) {
    int differs;
    uint64_t k;
    int64_t va, vb;
    int st = TD_OK;
    if (!c->o->allow_token_mismatch && !(st = tokens_differ(&c->A, &c->B, step, &differs, &k, &va, &vb, err)) &&
        differs)
        return td_err_set(err, TD_EINPUT,
                          "inp.tokens differ at step %lld, index %llu: %s consumed %lld, %s consumed %lld (the arms "
                          "answered different questions; run them pinned to the same tokens, or pass "
                          "--allow-token-mismatch)",
                          (long long)step, (unsigned long long)k, c->A.path, (long long)va, c->B.path, (long long)vb);
    if (st || !c->ca) return st;
    // The control measures noise on the SAME question as A: its steps and
    // tokens must be A's, whatever --allow-token-mismatch says.
    arm *ctl[2] = {c->ca != &c->A ? c->ca : NULL, c->cb};
    td_step_info sa, sx;
    if ((st = td_tapfile_step(c->A.f, step, &sa, err))) return st;
    for (int i = 0; i < 2; i++) {
        arm *x = ctl[i];
        if (!x || step >= td_tapfile_n_steps(x->f)) continue;
        if ((st = td_tapfile_step(x->f, step, &sx, err)) || (st = arm_load(x, step, err))) return st;
        if (sx.kind != sa.kind || sx.pos0 != sa.pos0 || sx.n_tokens != sa.n_tokens)
            return td_err_set(err, TD_EINPUT,
                              "control %s: step %lld is a %s step at pos %lld with %lld tokens, A's a %s step at pos "
                              "%lld with %lld tokens (run the control pinned to A's tokens)",
                              x->path, (long long)step, sx.kind == TD_STEP_PREFILL ? "prefill" : "decode",
                              (long long)sx.pos0, (long long)sx.n_tokens,
                              sa.kind == TD_STEP_PREFILL ? "prefill" : "decode", (long long)sa.pos0,
                              (long long)sa.n_tokens);
        if ((st = tokens_differ(&c->A, x, step, &differs, &k, &va, &vb, err))) return st;
        if (differs)
            return td_err_set(err, TD_EINPUT,
                              "control %s consumed other tokens than A at step %lld, index %llu (%lld vs %lld): a "
                              "control must answer A's question (run it pinned to A's tokens)",
                              x->path, (long long)step, (unsigned long long)k, (long long)vb, (long long)va);
    }
    return TD_OK;
}

static int compare_step(ctx *c, int64_t s, td_err *err) {
    td_cmp_result *r = c->r;
    td_step_info sa, sb;
    int st = td_tapfile_step(c->A.f, s, &sa, err);
    if (!st) st = td_tapfile_step(c->B.f, s, &sb, err);
    if (st) return st;
    if (sa.kind != sb.kind || sa.pos0 != sb.pos0 || sa.n_tokens != sb.n_tokens)
        return td_err_set(err, TD_EINPUT,
                          "step %lld differs: %s has a %s step at pos %lld with %lld tokens, %s a %s step at pos "
                          "%lld with %lld tokens",
                          (long long)s, c->A.path, sa.kind == TD_STEP_PREFILL ? "prefill" : "decode",
                          (long long)sa.pos0, (long long)sa.n_tokens, c->B.path,
                          sb.kind == TD_STEP_PREFILL ? "prefill" : "decode", (long long)sb.pos0,
                          (long long)sb.n_tokens);
    if ((st = arm_load(&c->A, s, err)) || (st = arm_load(&c->B, s, err))) return st;
    if ((st = check_tokens(c, s, err))) return st;

    c->res_of = td_xrealloc(c->res_of, sizeof *c->res_of * (size_t)(c->B.n ? c->B.n : 1));
    unsigned char *seen = td_xcalloc((size_t)(c->A.n ? c->A.n : 1), 1);
    int64_t step_first = r->n_taps;
    for (int64_t j = 0; j < c->B.n; j++) c->res_of[j] = -1;
    for (int64_t j = 0; j < c->B.n; j++) {
        const td_tap_info *b = &c->B.taps[j];
        int64_t i = arm_find(&c->A, b->name);
        if (i >= 0) seen[i] = 1;
        if (!td_cmp_filter_match(r->filter, b->name)) {
            r->n_filtered++;
            continue;
        }
        if (i < 0) {
            r->n_missing_in_a++;
            note_missing(r, "B", s, b->name);
            continue;
        }
        const td_tap_info *a = &c->A.taps[i];
        if (!same_shape(a, b)) {
            st = refuse_shape(err, s, c->A.path, a, c->B.path, b);
            break;
        }
        int64_t idx = r->n_taps;
        td_cmp_tap *t = push_tap(r);
        tap_init(t, &sb, a, b);
        if (td_dtype_is_int(b->dtype))
            st = cmp_integer(c, s, a, b, t, err);
        else
            st = cmp_float(c, s, a, b, t, err);
        if (st) break;
        const td_cmp_tap *in = growth(c, step_first, t);
        judge(c, t, in, cached_inputs(c, step_first, t), carried_on(c, step_first, t, in),
              head_norm_input(c, step_first, t));
        c->res_of[j] = idx;
        if (t->method == TD_CMP_DATA) r->n_data++;
        if (t->method == TD_CMP_FINGERPRINT) r->n_fingerprint++;
        if (t->method == TD_CMP_INTEGER) r->n_integer++;
        if (t->method != TD_CMP_INTEGER && t->ctrl == TD_CTRL_NONE) r->n_no_ctrl++;
        if (t->fail != TD_CMPF_OK) {
            if (r->first < 0) r->first = idx;
            r->n_divergent++;
        }
    }
    for (int64_t i = 0; !st && i < c->A.n; i++) {
        if (seen[i]) continue;
        if (!td_cmp_filter_match(r->filter, c->A.taps[i].name)) {
            r->n_filtered++;
            continue;
        }
        r->n_missing_in_b++;
        note_missing(r, "A", s, c->A.taps[i].name);
    }
    free(seen);
    flush_step(r);
    return st;
}

// Every tap of step s of `a` that the filter keeps counts as missing from the other arm.
static int count_extra(ctx *c, arm *a, int64_t s, int64_t *counter, const char *which, td_err *err) {
    int st = arm_load(a, s, err);
    if (st) return st;
    for (int64_t i = 0; i < a->n; i++) {
        if (!td_cmp_filter_match(c->r->filter, a->taps[i].name)) {
            c->r->n_filtered++;
            continue;
        }
        (*counter)++;
        note_missing(c->r, which, s, a->taps[i].name);
    }
    return TD_OK;
}

static int dvp_cmp(const void *x, const void *y) {
    const td_cmp_dvp *a = x, *b = y;
    // A non-finite error is the worst news: NaN ratios first.
    if (isnan(a->ratio) != isnan(b->ratio)) return isnan(a->ratio) ? -1 : 1;
    if (a->ratio > b->ratio) return -1;
    if (a->ratio < b->ratio) return 1;
    return strcmp(a->name, b->name);
}

// One tap name's running decode-vs-prefill figures.
typedef struct dvp_acc {
    char name[TD_TAP_NAME_MAX];
    double pre, dec;
    int64_t dstep, n_nf;
    int have_pre, have_dec;
} dvp_acc;

// Reads the records once, in order, keeping one accumulator per tap name
// (sorted by name for the lookup): memory grows with the names of a step,
// not with the steps. In index order, a later equal error never replaces an
// earlier one, so the worst decode step is the first that reached it.
static void decode_vs_prefill(td_cmp_result *r) {
    dvp_acc *acc = NULL;
    int64_t n_acc = 0, cap = 0;
    for (int64_t i = 0; i < r->n_taps; i++) {
        const td_cmp_tap *t = td_cmp_tap_at(r, i);
        if (t->method == TD_CMP_INTEGER) continue;
        int64_t lo = 0, hi = n_acc;
        while (lo < hi) {
            int64_t mid = lo + (hi - lo) / 2;
            if (strcmp(acc[mid].name, t->name) < 0)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (lo == n_acc || strcmp(acc[lo].name, t->name)) {
            if (n_acc == cap) {
                cap = cap ? 2 * cap : 64;
                acc = td_xrealloc(acc, sizeof *acc * (size_t)cap);
            }
            memmove(acc + lo + 1, acc + lo, sizeof *acc * (size_t)(n_acc - lo));
            n_acc++;
            memset(&acc[lo], 0, sizeof acc[lo]);
            snprintf(acc[lo].name, sizeof acc[lo].name, "%s", t->name);
            acc[lo].pre = acc[lo].dec = -1;
            acc[lo].dstep = -1;
        }
        dvp_acc *d = &acc[lo];
        // NaN compares false: a NaN error must win "worst" explicitly.
        if (!isfinite(t->err)) d->n_nf++;
        if (t->kind == TD_STEP_PREFILL) {
            d->have_pre = 1;
            if (!isnan(d->pre) && (isnan(t->err) || t->err > d->pre)) d->pre = t->err;
        } else {
            d->have_dec = 1;
            if (!isnan(d->dec) && (isnan(t->err) || t->err > d->dec)) {
                d->dec = t->err;
                d->dstep = t->step;
            }
        }
    }
    r->dvp = td_xmalloc(sizeof *r->dvp * (size_t)(n_acc ? n_acc : 1));
    for (int64_t i = 0; i < n_acc; i++) {
        const dvp_acc *a = &acc[i];
        if (!a->have_pre || !a->have_dec) continue;
        td_cmp_dvp *d = &r->dvp[r->n_dvp++];
        snprintf(d->name, sizeof d->name, "%s", a->name);
        d->prefill_err = a->pre;
        d->decode_err = a->dec;
        d->decode_step = a->dstep;
        d->ratio = a->pre > 0 ? a->dec / a->pre : (a->dec > 0 ? INFINITY : 1.0);
        if (isnan(a->pre) || isnan(a->dec)) d->ratio = NAN;
        d->n_nonfinite = a->n_nf;
    }
    qsort(r->dvp, (size_t)r->n_dvp, sizeof *r->dvp, dvp_cmp);
    free(acc);
}

static void set_verdict(ctx *c) {
    td_cmp_result *r = c->r;
    int64_t missing = r->n_missing_in_a + r->n_missing_in_b;
    char miss[480] = "";
    if (missing)
        snprintf(miss, sizeof miss,
                 "not everything was compared: %lld taps of B are missing in A and %lld taps of A are missing in B "
                 "(%s)",
                 (long long)r->n_missing_in_a, (long long)r->n_missing_in_b, r->missing_example);
    if (r->n_taps == 0) {
        r->verdict = TD_DIVERGENT;
        if (r->n_filtered && r->filter[0])
            snprintf(r->reason, sizeof r->reason,
                     "nothing was compared: the filter '%s' matched no tap present in both files", r->filter);
        else if (r->n_steps_a == 0 || r->n_steps_b == 0)
            snprintf(r->reason, sizeof r->reason, "nothing was compared: %s has no complete step",
                     r->n_steps_a == 0 ? "A" : "B");
        else
            snprintf(r->reason, sizeof r->reason, "nothing was compared: A and B have no tap in common (%s)",
                     r->missing_example[0] ? r->missing_example : "no taps");
        return;
    }
    if (r->first >= 0) {
        const td_cmp_tap *t = td_cmp_tap_at(r, r->first);
        r->verdict = TD_DIVERGENT;
        snprintf(r->reason, sizeof r->reason, "first divergent tap: %s at step %lld (%s), %s", t->name,
                 (long long)t->step, t->kind == TD_STEP_PREFILL ? "prefill" : "decode", td_cmp_fail_name(t->fail));
        if (missing) add_note(r, "%s", miss);
        return;
    }
    if (missing) {
        r->verdict = TD_DIVERGENT;
        snprintf(r->reason, sizeof r->reason, "%s", miss);
        return;
    }
    r->verdict = TD_OK;
    snprintf(r->reason, sizeof r->reason, "all %lld compared taps are within budget", (long long)r->n_taps);
}

td_cmp_options td_cmp_options_default(void) {
    td_cmp_options o;
    memset(&o, 0, sizeof o);
    o.k = TD_CMP_K_DEFAULT;
    o.topk = TD_CMP_TOPK_DEFAULT;
    return o;
}

void td_cmp_result_free(td_cmp_result *r) {
    if (!r) return;
    free(r->filter);
    free(r->floor_note);
    free(r->path_a);
    free(r->path_b);
    free(r->path_ctrl_a);
    free(r->path_ctrl_b);
    free(r->backend_a);
    free(r->backend_b);
    free(r->backend_ctrl_a);
    free(r->backend_ctrl_b);
    free(r->precision_a);
    free(r->precision_b);
    free(r->model);
    free(r->model_sha256);
    store_free(r->store);
    free(r->dvp);
    free(r);
}

// model_sha256 of every arm must agree where present.
static int check_models(ctx *c, td_err *err) {
    arm *arms[4] = {&c->A, &c->B, c->ca && c->ca != &c->A ? c->ca : NULL, c->cb};
    char *sha[4] = {0};
    int st = TD_OK;
    const char *ref = NULL, *ref_path = NULL;
    for (int i = 0; i < 4; i++) {
        if (!arms[i]) continue;
        sha[i] = attr_or_empty(arms[i]->f, "model_sha256");
        if (!sha[i][0] && c->o->require_model_sha256 && !st)
            st = td_err_set(err, TD_EINPUT,
                            "%s has no model_sha256: which model it ran is unknown, so a comparison could "
                            "pass across models (--allow-unknown-model compares it anyway)",
                            arms[i]->path);
        if (!sha[i][0]) continue;
        if (!ref) {
            ref = sha[i];
            ref_path = arms[i]->path;
        } else if (strcmp(ref, sha[i]) && !st) {
            st = td_err_set(err, TD_EINPUT,
                            "different models: %s has model_sha256 %s, %s has model_sha256 %s (compare arms of the "
                            "same model file)",
                            ref_path, ref, arms[i]->path, sha[i]);
        }
    }
    for (int i = 0; i < 4; i++) free(sha[i]);
    return st;
}

/* The QSA block sizes of the qwen4exp model f names (root attributes arch,
 * model, model_sha256) when that file is still at its path with that sha256:
 * 1 with ratio filled, else 0 (compare infers the sizes from qsa_scores'
 * -1 pattern, which a decode step leaves ambiguous: one row fits several). */
static int model_qsa_ratio(const td_tapfile *f, uint32_t ratio[256]) {
    td_err e = {{0}};
    char *arch = NULL, *model = NULL, *sha = NULL, hex[65];
    td_model *m = NULL;
    int ok = !td_tapfile_attr_str(f, "arch", &arch, &e) && !strcmp(arch, "qwen4exp") &&
             !td_tapfile_attr_str(f, "model", &model, &e) && !td_tapfile_attr_str(f, "model_sha256", &sha, &e) &&
             !td_sha256_file(model, hex, &e) && !strcmp(hex, sha) && !td_model_open(&m, model, &e);
    if (ok) memcpy(ratio, m->hp.qsa_ratio, sizeof m->hp.qsa_ratio);
    td_model_close(m);
    free(arch), free(model), free(sha);
    return ok;
}

int td_compare(const char *path_a, const char *path_b, const td_cmp_options *opt, td_cmp_result **out,
               td_err *err) {
    *out = NULL;
    td_cmp_options o = opt ? *opt : td_cmp_options_default();
    if (o.k <= 0) o.k = TD_CMP_K_DEFAULT;
    if (o.topk <= 0) o.topk = TD_CMP_TOPK_DEFAULT;
    if (o.topk > TD_CMP_TOPK_MAX) o.topk = TD_CMP_TOPK_MAX;
    if ((o.control_a != NULL) != (o.control_b != NULL))
        return td_err_set(err, TD_EUSAGE, "a control pair needs both control_a and control_b");
    if (o.control && o.control_a)
        return td_err_set(err, TD_EUSAGE, "give either one control file or a control pair, not both");

    ctx c;
    memset(&c, 0, sizeof c);
    c.o = &o;
    c.A.step = c.B.step = c.C1.step = c.C2.step = -1;
    td_cmp_result *r = td_xcalloc(1, sizeof *r);
    r->store = td_xcalloc(1, sizeof *r->store);
    r->store->spill = tmpfile();
    c.r = r;
    r->k = o.k;
    r->topk = o.topk;
    r->filter = td_xstrdup(o.filter ? o.filter : "");
    r->floor_note = td_xstrdup(o.floor_note ? o.floor_note : "");
    r->floor_override = o.floor > 0 ? o.floor : 0;
    r->allow_token_mismatch = o.allow_token_mismatch;
    r->first = -1;
    r->path_a = td_xstrdup(path_a);
    r->path_b = td_xstrdup(path_b);

    // Every file is checked at the same time (arms_open); the first one that
    // fails, in this order, is the one reported.
    arm *arms[4] = {&c.A, &c.B};
    const char *paths[4] = {path_a, path_b};
    int n_arms = 2;
    if (o.control) {
        arms[n_arms] = &c.C2;
        paths[n_arms++] = o.control;
        c.ca = &c.A;
        c.cb = &c.C2;
    } else if (o.control_a) {
        arms[n_arms] = &c.C1;
        paths[n_arms++] = o.control_a;
        arms[n_arms] = &c.C2;
        paths[n_arms++] = o.control_b;
        c.ca = &c.C1;
        c.cb = &c.C2;
    }
    int st = arms_open(arms, paths, n_arms, err);
    if (!st) st = check_models(&c, err);
    if (st) goto fail;
    uint32_t ratio[256];
    if (!o.qsa_ratio && o.qsa_ratio_from_model && model_qsa_ratio(c.A.f, ratio)) o.qsa_ratio = ratio;

    r->has_control = c.ca != NULL;
    r->backend_a = attr_or_empty(c.A.f, "backend");
    r->backend_b = attr_or_empty(c.B.f, "backend");
    r->precision_a = attr_or_empty(c.A.f, "precision");
    r->precision_b = attr_or_empty(c.B.f, "precision");
    r->model = attr_or_empty(c.A.f, "model");
    r->model_sha256 = attr_or_empty(c.A.f, "model_sha256");
    if (!r->model_sha256[0]) {
        free(r->model_sha256);
        r->model_sha256 = attr_or_empty(c.B.f, "model_sha256");
    }
    if (c.ca) {
        r->path_ctrl_a = td_xstrdup(c.ca->path);
        r->path_ctrl_b = td_xstrdup(c.cb->path);
        r->backend_ctrl_a = attr_or_empty(c.ca->f, "backend");
        r->backend_ctrl_b = attr_or_empty(c.cb->f, "backend");
    }
    r->n_steps_a = td_tapfile_n_steps(c.A.f);
    r->n_steps_b = td_tapfile_n_steps(c.B.f);
    c.ulp_hist = td_xcalloc(2 * ULP_BINS, sizeof *c.ulp_hist);

    int64_t common = r->n_steps_a < r->n_steps_b ? r->n_steps_a : r->n_steps_b;
    for (int64_t s = 0; !st && s < common; s++) st = compare_step(&c, s, err);
    for (int64_t s = common; !st && s < r->n_steps_b; s++)
        st = count_extra(&c, &c.B, s, &r->n_missing_in_a, "B", err);
    for (int64_t s = common; !st && s < r->n_steps_a; s++)
        st = count_extra(&c, &c.A, s, &r->n_missing_in_b, "A", err);
    if (st) goto fail;

    decode_vs_prefill(r);
    set_verdict(&c);
    const char *why_floor = r->floor_note[0] ? r->floor_note : "set by option";
    if (!r->has_control && r->floor_override > 0)
        add_note(r, "no control arm: the budget is the floor only, %.3g (%s)", r->floor_override, why_floor);
    else if (!r->has_control)
        add_note(r, "no control arm: the budget is the floor only (f64 %.3g, f32 %.3g, f16 %.3g, bf16 %.3g)",
                 td_cmp_floor(TD_DT_F64), td_cmp_floor(TD_DT_F32), td_cmp_floor(TD_DT_F16), td_cmp_floor(TD_DT_BF16));
    else if (r->floor_override > 0)
        add_note(r, "floor replaced by %.3g: %s", r->floor_override, why_floor);
    if (r->has_control && r->n_no_ctrl)
        add_note(r, "%lld taps are missing in the control arm: their budget is the floor only",
                 (long long)r->n_no_ctrl);
    if (r->n_fingerprint)
        add_note(r,
                 "%lld taps were compared by fingerprint only (has_data = 0): data not compared; their error is a "
                 "lower bound",
                 (long long)r->n_fingerprint);
    if (r->n_filtered) add_note(r, "%lld taps excluded by the filter '%s'", (long long)r->n_filtered, r->filter);
    const char *na = td_tapfile_note(c.A.f), *nb = td_tapfile_note(c.B.f);
    if (na && na[0]) add_note(r, "A: %s", na);
    if (nb && nb[0]) add_note(r, "B: %s", nb);
    // two files cannot rerun an arm: a divergence on a rounding tie an oracle recorded is said, not excused
    if (r->verdict != TD_OK && r->first >= 0) {
        const td_cmp_tap *f = td_cmp_tap_at(r, r->first);
        const int64_t fs = f->step;
        const int32_t fl = f->layer;
        char line[320];
        for (int i = 0; i < 2; i++)
            if (td_ties_note(i ? c.B.f : c.A.f, fs, fl, line, sizeof line)) add_note(r, "%s: %s", i ? "B" : "A", line);
    }
    // A feedback bug (a decode step fed a stale token) is visible in one arm
    // alone; it makes the comparison divergent whatever the taps say.
    const td_tapfile *arm_file[2] = {c.A.f, c.B.f};
    for (int i = 0; i < 2; i++) {
        td_selfcheck_report sc;
        td_err se;
        if (td_selfcheck_tapfile(arm_file[i], &sc, &se) != TD_OK) {
            add_note(r, "%s: self-check not run: %.280s", i ? "B" : "A", se.msg);
            continue;
        }
        if (sc.verdict == TD_OK) continue;
        add_note(r, "%s: self-check failed: %.280s", i ? "B" : "A", sc.message);
        if (r->verdict == TD_OK) {
            r->verdict = TD_DIVERGENT;
            snprintf(r->reason, sizeof r->reason, "self-check of %s failed: %.400s", i ? "B" : "A", sc.message);
        }
    }

fail:
    arm_close(&c.A);
    arm_close(&c.B);
    arm_close(&c.C1);
    arm_close(&c.C2);
    free(c.ba);
    free(c.bb);
    free(c.bca);
    free(c.bcb);
    free(c.col_d2);
    free(c.col_a2);
    free(c.lg_margin);
    free(c.lg_norm);
    free(c.lg_kl);
    free(c.ulp_hist);
    free(c.res_of);
    free(c.sg);
    free(c.hs);
    for (int i = 0; i < c.n_cs; i++) free(c.cs[i].src);
    free(c.cs);
    free(c.kc);
    free(c.qs);
    if (st) {
        td_cmp_result_free(r);
        return st;
    }
    *out = r;
    return TD_OK;
}
