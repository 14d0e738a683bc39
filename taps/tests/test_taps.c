/* tapdiff: tests of the tap emit API, the fingerprints and the HDF5 tap-file
 * writer and reader (taps/).
 *
 * One sample run (3 steps: a prefill of 4 tokens and 2 decodes; taps of every
 * dtype, global and per-layer, NaN/inf/-0, a chunked one) is written and read
 * back. Every expected fingerprint below is worked out by hand from the
 * values written next to it (the f16/bf16 bit patterns decoded by hand); only
 * the generated logits are summed by a loop of the test's own. The file is
 * also read by h5py (read_taps.py, with no tapdiff code) and compared with the
 * C reader, and a writer killed with SIGKILL must leave its finished steps. */
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tap.h"
#include "tap_internal.h"
#include "tapfile.h"
#include "td_common.h"
#include "td_config.h"
#include "td_test.h"

/* ------------------------------------------------------------------------ */
/* Temporary files                                                            */

static char tmpdir[256];

static void make_tmpdir(void) {
    const char *base = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/td_taps_XXXXXX", base && *base ? base : "/tmp");
    cr_assert_not_null(mkdtemp(tmpdir), "mkdtemp: %s", strerror(errno));
}

static void remove_tmpdir(void) { td_test_rmdir(tmpdir); }

static const char *tmp_path(const char *name) {
    static char buf[4][400];
    static int k;
    char *p = buf[k++ % 4];
    snprintf(p, 400, "%s/%s", tmpdir, name);
    return p;
}

TestSuite(taps, .init = make_tmpdir, .fini = remove_tmpdir);

/* ------------------------------------------------------------------------ */
/* The sample run                                                             */

#define NV 600 /* logits row: 4 x 600 f32 = 9600 bytes, over the contiguous limit */

static const int32_t tokens0[4] = {1, 5, 9, 0};
static const int32_t pos0v[4] = {0, 1, 2, 3};
static const double embd0[8] = {0.5, -1.25, 2, 0, -3, 0.25, 1, -0.5};
static float norm0[8];              /* {1.5, NaN, -2, inf, 0, -0, 0.75, -inf}, set in sample_init */
static const uint16_t q0_f16[6] = {
    0x3C00, /*  1.0 */
    0xC000, /* -2.0 */
    0x3800, /*  0.5 */
    0x0001, /*  2^-24, the smallest subnormal */
    0x7BFF, /*  65504, the largest finite */
    0xFC00, /* -inf */
};
static const double q0_vals[6] = {1.0, -2.0, 0.5, 0x1p-24, 65504.0, -INFINITY};
static const uint16_t ffn0_bf16[3] = {
    0x3F80, /*  1.0 */
    0xC0A0, /* -5.0: sign 1, exponent 129 (2^2), mantissa 0x20 (1.25) */
    0x7FC0, /*  NaN */
};
static const float attn_out0[2] = {-0.0f, 3.0f};
static const int64_t hist0[3] = {7, -2, 4000000000};
static const int32_t tokens1[1] = {42}, tokens2[1] = {7};
static const float q1[3] = {0.125f, -0.0625f, 8.0f};
static float q2[3]; /* {NaN, 1, 2} */
static float logits[3][4 * NV];

static float logit_value(int step, int i) {
    return (float)((i % 37) - 18) * 0.125f + (float)step;
}

typedef struct sample_tap {
    int step;
    int layer;          /* as passed to emit */
    const char *name;   /* as passed to emit */
    const char *full;
    td_dtype dt;
    int ndim;
    int64_t shape[2];
    const void *data;
    int32_t layer_attr;
    int in_filter;      /* matches SAMPLE_FILTER */
    td_fingerprint fp;
} sample_tap;

#define SAMPLE_FILTER " blk.*.attn_*, out.logits ,,"
#define NAN4 {NAN, NAN, NAN, NAN}

static sample_tap sample[] = {
    {0, -1, "inp.tokens", "inp.tokens", TD_DT_I32, 1, {4}, tokens0, -1, 0,
     {4, 0, 3, 0, 9, 9, 15, 15, 107, {1, 5, 9, 0}}},
    {0, -1, "inp.pos", "inp.pos", TD_DT_I32, 1, {4}, pos0v, -1, 0, {4, 0, 3, 0, 3, 3, 6, 6, 14, {0, 1, 2, 3}}},
    // sum 0.5-1.25+2+0-3+0.25+1-0.5 = -1; |x| 8.5; x^2 .25+1.5625+4+0+9+.0625+1+.25 = 16.125
    {0, -1, "inp.embd", "inp.embd", TD_DT_F64, 2, {4, 2}, embd0, -1, 0,
     {8, 0, 7, -3, 2, 3, -1, 8.5, 16.125, {0.5, -1.25, 2, 0}}},
    // finite: 1.5 -2 0 -0 0.75: sum 0.25, |x| 4.25, x^2 2.25+4+.5625 = 6.8125;
    // non-finite NaN inf -inf = 3; non-zero = 8 - 2 zeros = 6
    {0, 0, "attn_norm", "blk.0.attn_norm", TD_DT_F32, 2, {4, 2}, norm0, 0, 1,
     {8, 3, 6, -2, 1.5, 2, 0.25, 4.25, 6.8125, {1.5, NAN, -2, INFINITY}}},
    // finite: 1 -2 0.5 2^-24 65504 (sums in index order, as the spec says)
    {0, 0, "attn_q", "blk.0.attn_q", TD_DT_F16, 2, {2, 3}, q0_f16, 0, 1,
     {6, 1, 6, -2, 65504, 65504, 1.0 - 2.0 + 0.5 + 0x1p-24 + 65504.0, 1.0 + 2.0 + 0.5 + 0x1p-24 + 65504.0,
      1.0 + 4.0 + 0.25 + 0x1p-48 + 65504.0 * 65504.0, {1, -2, 0.5, 0x1p-24}}},
    {0, 0, "ffn_out", "blk.0.ffn_out", TD_DT_BF16, 1, {3}, ffn0_bf16, 0, 0,
     {3, 1, 3, -5, 1, 5, -4, 6, 26, {1, -5, NAN, NAN}}},
    // a layer tap named in full by the engine: its layer comes from the name
    {0, -1, "blk.1.attn_out", "blk.1.attn_out", TD_DT_F32, 1, {2}, attn_out0, 1, 1,
     {2, 0, 1, -0.0, 3, 3, 3, 3, 9, {-0.0, 3, NAN, NAN}}},
    {0, -1, "out.logits", "out.logits", TD_DT_F32, 2, {4, NV}, logits[0], -1, 1, {0}},
    // 4e9^2 = 1.6e19 is exact; + 53 rounds away (ulp 2048 there)
    {0, -1, "hist.tokens", "hist.tokens", TD_DT_I64, 1, {3}, hist0, -1, 0,
     {3, 0, 3, -2, 4000000000.0, 4000000000.0, 4000000005.0, 4000000009.0, 16000000000000000000.0, {7, -2, 4e9, NAN}}},
    {1, -1, "inp.tokens", "inp.tokens", TD_DT_I32, 1, {1}, tokens1, -1, 0, {1, 0, 1, 42, 42, 42, 42, 42, 1764, {42, NAN, NAN, NAN}}},
    // 0.125 - 0.0625 + 8 = 8.0625; |x| 8.1875; x^2 1/64 + 1/256 + 64
    {1, 0, "attn_q", "blk.0.attn_q", TD_DT_F32, 2, {1, 3}, q1, 0, 1,
     {3, 0, 3, -0.0625, 8, 8, 8.0625, 8.1875, 64.01953125, {0.125, -0.0625, 8, NAN}}},
    {1, -1, "out.logits", "out.logits", TD_DT_F32, 2, {1, NV}, logits[1], -1, 1, {0}},
    {2, -1, "inp.tokens", "inp.tokens", TD_DT_I32, 1, {1}, tokens2, -1, 0, {1, 0, 1, 7, 7, 7, 7, 7, 49, {7, NAN, NAN, NAN}}},
    {2, 0, "attn_q", "blk.0.attn_q", TD_DT_F32, 2, {1, 3}, q2, 0, 1, {3, 1, 3, 1, 2, 2, 3, 3, 5, {NAN, 1, 2, NAN}}},
    {2, -1, "out.logits", "out.logits", TD_DT_F32, 2, {1, NV}, logits[2], -1, 1, {0}},
};
#define N_SAMPLE ((int)(sizeof sample / sizeof sample[0]))
static const int sample_steps = 3;
static const int64_t step_pos0[3] = {0, 4, 5}, step_ntok[3] = {4, 1, 1}, step_ntaps[3] = {9, 3, 3};

static void sample_init(void) {
    const float n[8] = {1.5f, NAN, -2.0f, INFINITY, 0.0f, -0.0f, 0.75f, -INFINITY};
    memcpy(norm0, n, sizeof n);
    q2[0] = NAN, q2[1] = 1.0f, q2[2] = 2.0f;
    for (int s = 0; s < 3; s++)
        for (int i = 0; i < 4 * NV; i++) logits[s][i] = logit_value(s, i);
    // The logits' fingerprints, summed here by a loop of the test's own; the
    // values are multiples of 1/8 below 2^10, so every sum is exact.
    for (int k = 0; k < N_SAMPLE; k++) {
        sample_tap *t = &sample[k];
        if (strcmp(t->full, "out.logits") != 0) continue;
        int n_el = (int)(t->shape[0] * t->shape[1]);
        td_fingerprint *fp = &t->fp;
        memset(fp, 0, sizeof *fp);
        fp->count = (uint64_t)n_el;
        fp->min = INFINITY, fp->max = -INFINITY;
        for (int i = 0; i < n_el; i++) {
            double v = logit_value(t->step, i);
            if (i < 4) fp->first[i] = v;
            fp->n_nonzero += v != 0;
            fp->min = v < fp->min ? v : fp->min;
            fp->max = v > fp->max ? v : fp->max;
            fp->max_abs = fabs(v) > fp->max_abs ? fabs(v) : fp->max_abs;
            fp->sum += v, fp->sum_abs += fabs(v), fp->sum_sq += v * v;
        }
    }
}

static int sample_compress = 4; /* the writer's default; 0: stored, as tapdiff run writes */
static int sample_threaded = -1; /* 0/1: write_sample checks the sink runs (no) writer thread */

static void write_sample(const char *path, td_tap_mode mode, const char *filter) {
    sample_init();
    td_err err = {{0}};
    td_tap_options o = td_tap_options_default();
    o.compress = sample_compress;
    o.mode = mode;
    o.filter = filter;
    td_tap_sink *s = NULL;
    cr_assert_eq(td_tap_sink_open(&s, path, &o, &err), TD_OK, "%s", err.msg);
    if (sample_threaded >= 0) cr_assert_eq(td_taps_threaded(s), sample_threaded, "writer thread for %s", path);
    cr_assert_eq(td_tap_sink_attr_str(s, "backend", "unit-test"), TD_OK);
    cr_assert_eq(td_tap_sink_attr_i64(s, "threads", 4), TD_OK);
    cr_assert_eq(td_tap_sink_attr_f64(s, "temperature", 0.5), TD_OK);
    cr_assert_eq(td_tap_sink_attr_str(s, "backend", "unit-test-2"), TD_OK); // last value wins
    int k = 0;
    for (int step = 0; step < sample_steps; step++) {
        cr_assert_eq(td_tap_step_begin(s, step == 0 ? TD_STEP_PREFILL : TD_STEP_DECODE, step_pos0[step],
                                       step_ntok[step], &err),
                     TD_OK, "%s", err.msg);
        for (; k < N_SAMPLE && sample[k].step == step; k++) {
            const sample_tap *t = &sample[k];
            TD_TAP(s, t->layer, t->name, t->dt, t->data, t->ndim, t->shape);
        }
        cr_assert_eq(td_tap_step_end(s, &err), TD_OK, "%s", err.msg);
    }
    cr_assert_eq(td_tap_sink_close(s, &err), TD_OK, "%s", err.msg);
}

/* ------------------------------------------------------------------------ */
/* Comparisons                                                                */

// Same double, NaN equal to NaN, and the sign of zero counts.
static int same(double a, double b) {
    if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
    return a == b && signbit(a) == signbit(b);
}

static void check_fp(const char *what, const td_fingerprint *got, const td_fingerprint *want) {
    cr_expect_eq(got->count, want->count, "%s: count %llu, want %llu", what, (unsigned long long)got->count,
                 (unsigned long long)want->count);
    cr_expect_eq(got->n_nonfinite, want->n_nonfinite, "%s: n_nonfinite %llu, want %llu", what,
                 (unsigned long long)got->n_nonfinite, (unsigned long long)want->n_nonfinite);
    cr_expect_eq(got->n_nonzero, want->n_nonzero, "%s: n_nonzero %llu, want %llu", what,
                 (unsigned long long)got->n_nonzero, (unsigned long long)want->n_nonzero);
    const double g[6] = {got->min, got->max, got->max_abs, got->sum, got->sum_abs, got->sum_sq};
    const double w[6] = {want->min, want->max, want->max_abs, want->sum, want->sum_abs, want->sum_sq};
    static const char *const names[6] = {"min", "max", "max_abs", "sum", "sum_abs", "sum_sq"};
    for (int i = 0; i < 6; i++)
        cr_expect(same(g[i], w[i]), "%s: %s = %.17g, want %.17g", what, names[i], g[i], w[i]);
    for (int i = 0; i < 4; i++)
        cr_expect(same(got->first[i], want->first[i]), "%s: first[%d] = %.17g, want %.17g", what, i, got->first[i],
                  want->first[i]);
}

// The value of element i of a sample tap, decoded by the test itself.
static double sample_value(const sample_tap *t, uint64_t i) {
    switch (t->dt) {
    case TD_DT_F64: return ((const double *)t->data)[i];
    case TD_DT_F32: return ((const float *)t->data)[i];
    case TD_DT_I32: return ((const int32_t *)t->data)[i];
    case TD_DT_I64: return (double)((const int64_t *)t->data)[i];
    case TD_DT_F16: return q0_vals[i]; // the only f16 tap
    case TD_DT_BF16: return i == 0 ? 1.0 : i == 1 ? -5.0 : NAN; // the only bf16 tap
    }
    return NAN;
}

static uint64_t sample_count(const sample_tap *t) {
    uint64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= (uint64_t)t->shape[d];
    return n;
}

// Reads `path` with the C reader and checks every step, tap, fingerprint and
// value of the sample; has_data as `mode`/`filtered` say.
static void check_sample(const char *path, td_tap_mode mode, int filtered, const char *filter_attr) {
    td_err err = {{0}};
    td_tapfile *f = NULL;
    cr_assert_eq(td_tapfile_open(&f, path, &err), TD_OK, "%s", err.msg);
    cr_assert_eq(td_tapfile_n_steps(f), sample_steps);
    cr_expect_str_empty(td_tapfile_note(f));

    char *v = NULL;
    struct {
        const char *key, *want;
    } attrs[] = {{"format", "tapdiff-taps"},
                 {"format_version", "1"},
                 {"tap_mode", mode == TD_TAP_FULL ? "full" : "fingerprint"},
                 {"tap_filter", filter_attr},
                 {"backend", "unit-test-2"},
                 {"threads", "4"},
                 {"temperature", "0.5"}};
    for (size_t i = 0; i < sizeof attrs / sizeof attrs[0]; i++) {
        cr_assert_eq(td_tapfile_attr_str(f, attrs[i].key, &v, &err), TD_OK, "%s", err.msg);
        cr_expect_str_eq(v, attrs[i].want, "root attribute %s", attrs[i].key);
        free(v);
    }
    cr_assert_eq(td_tapfile_attr_str(f, "created", &v, &err), TD_OK, "%s", err.msg);
    // ISO-8601 UTC: 2025-01-31T12:00:00Z
    int Y, M, D, h, m, sec;
    char z = 0;
    cr_expect(strlen(v) == 20 && sscanf(v, "%4d-%2d-%2dT%2d:%2d:%2d%c", &Y, &M, &D, &h, &m, &sec, &z) == 7 && z == 'Z' &&
                  Y >= 2024 && M >= 1 && M <= 12,
              "created = \"%s\"", v);
    free(v);
    cr_expect_eq(td_tapfile_attr_str(f, "no_such_attr", &v, &err), TD_EINPUT);
    cr_expect(strstr(err.msg, "no_such_attr") != NULL, "%s", err.msg);
    char **names = NULL;
    int n_names = 0;
    cr_assert_eq(td_tapfile_attr_names(f, &names, &n_names, &err), TD_OK, "%s", err.msg);
    cr_expect_eq(n_names, 8, "root attributes: %d", n_names);
    td_tapfile_free_names(names, n_names);

    int k = 0;
    int64_t last_seq = -1;
    for (int step = 0; step < sample_steps; step++) {
        td_step_info si;
        cr_assert_eq(td_tapfile_step(f, step, &si, &err), TD_OK, "%s", err.msg);
        cr_expect_eq(si.kind, step == 0 ? TD_STEP_PREFILL : TD_STEP_DECODE);
        cr_expect_eq(si.pos0, step_pos0[step]);
        cr_expect_eq(si.n_tokens, step_ntok[step]);
        cr_expect_eq(si.n_taps, step_ntaps[step]);
        td_tap_info *taps = NULL;
        int64_t n = 0;
        cr_assert_eq(td_tapfile_step_taps(f, step, &taps, &n, &err), TD_OK, "%s", err.msg);
        cr_assert_eq(n, step_ntaps[step]);
        for (int64_t j = 0; j < n; j++, k++) {
            const sample_tap *t = &sample[k];
            const td_tap_info *ti = &taps[j];
            // listed in emission order, seq strictly increasing across steps
            cr_expect_str_eq(ti->name, t->full, "step %d tap %lld", step, (long long)j);
            cr_expect_eq(ti->seq, last_seq + 1, "%s: seq %lld after %lld", t->full, (long long)ti->seq,
                         (long long)last_seq);
            last_seq = ti->seq;
            cr_expect_eq(ti->layer, t->layer_attr, "%s: layer %d", t->full, ti->layer);
            cr_expect_eq(ti->dtype, t->dt, "%s: dtype", t->full);
            cr_expect_eq(ti->ndim, t->ndim, "%s: ndim", t->full);
            for (int d = 0; d < t->ndim; d++) cr_expect_eq(ti->shape[d], t->shape[d], "%s: shape[%d]", t->full, d);
            uint64_t count = sample_count(t);
            cr_expect_eq(ti->count, count);
            int want_data = mode == TD_TAP_FULL && (!filtered || t->in_filter);
            cr_expect_eq(ti->has_data, want_data, "%s: has_data %d", t->full, ti->has_data);
            check_fp(t->full, &ti->fp, &t->fp);

            double *x = calloc(count, sizeof *x);
            int st = td_tapfile_read_f64(f, step, t->full, x, count, &err);
            if (!want_data) {
                cr_expect_eq(st, TD_EINPUT, "%s: data read from a fingerprint-only tap", t->full);
                cr_expect(strstr(err.msg, "no data") != NULL, "%s", err.msg);
            } else {
                cr_expect_eq(st, TD_OK, "%s", err.msg);
                for (uint64_t i = 0; i < count; i++)
                    cr_expect(same(x[i], sample_value(t, i)), "%s[%llu] = %.17g, want %.17g", t->full,
                              (unsigned long long)i, x[i], sample_value(t, i));
            }
            if (want_data && td_dtype_is_int(t->dt)) {
                int64_t *iv = calloc(count, sizeof *iv);
                cr_expect_eq(td_tapfile_read_i64(f, step, t->full, iv, count, &err), TD_OK, "%s", err.msg);
                for (uint64_t i = 0; i < count; i++) {
                    int64_t want = t->dt == TD_DT_I32 ? ((const int32_t *)t->data)[i] : ((const int64_t *)t->data)[i];
                    cr_expect_eq(iv[i], want, "%s[%llu] = %lld", t->full, (unsigned long long)i, (long long)iv[i]);
                }
                free(iv);
            }
            free(x);
        }
        free(taps);
    }
    cr_expect_eq(k, N_SAMPLE);
    td_tapfile_close(f);
}

/* ------------------------------------------------------------------------ */
/* Fingerprints alone                                                         */

Test(taps, fingerprint_by_hand) {
    sample_init();
    for (int k = 0; k < N_SAMPLE; k++) {
        td_fingerprint fp;
        td_fingerprint_compute(&fp, sample[k].dt, sample[k].data, sample_count(&sample[k]));
        check_fp(sample[k].full, &fp, &sample[k].fp);
    }
    // Nothing finite: min/max/max_abs NaN, sums 0.
    td_fingerprint fp;
    const float nan2[2] = {NAN, -INFINITY};
    td_fingerprint_compute(&fp, TD_DT_F32, nan2, 2);
    check_fp("all non-finite", &fp, &(td_fingerprint){2, 2, 2, NAN, NAN, NAN, 0, 0, 0, {NAN, -INFINITY, NAN, NAN}});
    td_fingerprint_compute(&fp, TD_DT_F64, NULL, 0);
    check_fp("empty", &fp, &(td_fingerprint){0, 0, 0, NAN, NAN, NAN, 0, 0, 0, NAN4});
    // f16 subnormals, negative zero and NaN, bf16 subnormal.
    const uint16_t h[4] = {0x8001, 0x03FF, 0x8000, 0x7E00}; // -2^-24, 1023 * 2^-24, -0, NaN
    td_fingerprint_compute(&fp, TD_DT_F16, h, 4);
    check_fp("f16 subnormals", &fp,
             &(td_fingerprint){4, 1, 3, -0x1p-24, 1023 * 0x1p-24, 1023 * 0x1p-24, 1022 * 0x1p-24, 1024 * 0x1p-24,
                               0x1p-48 + 1023.0 * 1023.0 * 0x1p-48, {-0x1p-24, 1023 * 0x1p-24, -0.0, NAN}});
    const uint16_t b[2] = {0x0001, 0xFF80}; // 2^-133 (subnormal), -inf
    td_fingerprint_compute(&fp, TD_DT_BF16, b, 2);
    check_fp("bf16 subnormal", &fp,
             &(td_fingerprint){2, 1, 2, 0x1p-133, 0x1p-133, 0x1p-133, 0x1p-133, 0x1p-133, 0x1p-266,
                               {0x1p-133, -INFINITY, NAN, NAN}});
}

// The fingerprint as the schema defines it, one element at a time: the
// oracle for the writer's one-pass loop (which must give the same bits).
static double oracle_f16(uint16_t h) {
    unsigned e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m | 0x400u, (int)e - 25);
    return (h & 0x8000u) ? -v : v;
}

static double oracle_value(td_dtype dt, const void *data, uint64_t i) {
    switch (dt) {
    case TD_DT_F64: return ((const double *)data)[i];
    case TD_DT_F32: return ((const float *)data)[i];
    case TD_DT_F16: return oracle_f16(((const uint16_t *)data)[i]);
    case TD_DT_BF16: {
        uint32_t bits = (uint32_t)((const uint16_t *)data)[i] << 16;
        float f;
        memcpy(&f, &bits, sizeof f);
        return f;
    }
    case TD_DT_I32: return ((const int32_t *)data)[i];
    case TD_DT_I64: return (double)((const int64_t *)data)[i];
    }
    return NAN;
}

static void oracle_fp(td_fingerprint *fp, td_dtype dt, const void *data, uint64_t count) {
    memset(fp, 0, sizeof *fp);
    fp->count = count;
    fp->min = fp->max = fp->max_abs = NAN;
    for (int i = 0; i < 4; i++) fp->first[i] = NAN;
    int have = 0;
    for (uint64_t i = 0; i < count; i++) {
        double v = oracle_value(dt, data, i);
        if (i < 4) fp->first[i] = v;
        if (v != 0.0) fp->n_nonzero++;
        if (!isfinite(v)) {
            fp->n_nonfinite++;
            continue;
        }
        if (!have || v < fp->min) fp->min = v;
        if (!have || v > fp->max) fp->max = v;
        if (!have || fabs(v) > fp->max_abs) fp->max_abs = fabs(v);
        have = 1;
        fp->sum += v;
        fp->sum_abs += fabs(v);
        fp->sum_sq += v * v;
    }
}

Test(taps, fingerprint_is_the_element_by_element_summary_bit_for_bit) {
    // Every f16 and bf16 bit pattern, then random values of every dtype
    // salted with zeros of both signs, infinities, NaNs and ties of extrema.
    enum { N = 65536 };
    uint16_t *h = malloc(N * sizeof *h);
    double *d = malloc(N * sizeof *d);
    float *f = malloc(N * sizeof *f);
    int32_t *i32 = malloc(N * sizeof *i32);
    int64_t *i64 = malloc(N * sizeof *i64);
    cr_assert(h && d && f && i32 && i64);
    for (int i = 0; i < N; i++) h[i] = (uint16_t)(i * 40503u);
    for (int i = 0; i < N; i++) { // each f16 value alone: its widening is first[0]
        const uint16_t one = (uint16_t)i;
        td_fingerprint got;
        td_fingerprint_compute(&got, TD_DT_F16, &one, 1);
        const double want = oracle_f16(one);
        cr_expect_eq(memcmp(&got.first[0], &want, sizeof want), 0, "f16 0x%04x: %.17g, want %.17g", i, got.first[0],
                     want);
    }
    uint64_t r = 0x9e3779b97f4a7c15u;
    for (int i = 0; i < N; i++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        double v = ldexp((double)(int64_t)(r >> 11) - 0x1p52, (int)(r % 40) - 60);
        switch (r % 23) {
        case 0: v = 0.0; break;
        case 1: v = -0.0; break;
        case 2: v = INFINITY; break;
        case 3: v = -INFINITY; break;
        case 4: v = NAN; break;
        case 5: v = 1e-310; break;
        }
        d[i] = v;
        f[i] = (float)v;
        i32[i] = (int32_t)(r >> 40) - (1 << 23);
        i64[i] = (int64_t)r;
    }
    // Which zero an extremum keeps when it is the extremum.
    const double zmin[3] = {0.0, -0.0, 1.0}, zmax[3] = {-0.0, 0.0, -1.0};
    const float zminf[3] = {-0.0f, 0.0f, 1.0f}, zmaxf[3] = {0.0f, -0.0f, -1.0f};
    const struct {
        td_dtype dt;
        const void *p;
    } cases[] = {{TD_DT_F16, h}, {TD_DT_BF16, h}, {TD_DT_F64, d}, {TD_DT_F32, f}, {TD_DT_I32, i32}, {TD_DT_I64, i64},
                   {TD_DT_F64, zmin}, {TD_DT_F64, zmax}, {TD_DT_F32, zminf}, {TD_DT_F32, zmaxf}};
    const uint64_t counts[] = {0, 1, 3, 5, 1000, N};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (size_t k = 0; k < sizeof counts / sizeof counts[0] && (c < 6 || counts[k] <= 3); k++) {
            td_fingerprint got, want;
            td_fingerprint_compute(&got, cases[c].dt, cases[c].p, counts[k]);
            oracle_fp(&want, cases[c].dt, cases[c].p, counts[k]);
            char what[64];
            snprintf(what, sizeof what, "%s x %llu", td_dtype_name(cases[c].dt), (unsigned long long)counts[k]);
            cr_expect_eq(memcmp(&got, &want, sizeof got), 0, "%s: not the same bits", what);
            check_fp(what, &got, &want);
        }
    free(h), free(d), free(f), free(i32), free(i64);
}

Test(taps, null_sink_is_one_branch) {
    td_tap_sink *s = NULL;
    int e_layer = 0, e_name = 0, e_data = 0, e_shape = 0;
    const float x[1] = {1};
    const int64_t shape[1] = {1};
    // Taps off: no argument but the sink is evaluated, nothing is called.
    TD_TAP(s, (e_layer++, 0), (e_name++, "x"), TD_DT_F32, (e_data++, x), 1, (e_shape++, shape));
    cr_expect_eq(e_layer + e_name + e_data + e_shape, 0);
    td_err err = {{0}};
    cr_expect_eq(td_tap_step_begin(NULL, TD_STEP_PREFILL, 0, 1, &err), TD_OK);
    cr_expect_eq(td_tap_sink_attr_str(NULL, "k", "v"), TD_OK);
    td_tap_emit(NULL, 0, "x", TD_DT_F32, x, 1, shape);
    cr_expect_eq(td_tap_step_end(NULL, &err), TD_OK);
    cr_expect_eq(td_tap_sink_close(NULL, &err), TD_OK);
}

/* ------------------------------------------------------------------------ */
/* Write and read back                                                        */

Test(taps, full_roundtrip) {
    const char *path = tmp_path("full.h5");
    write_sample(path, TD_TAP_FULL, NULL);
    check_sample(path, TD_TAP_FULL, 0, "");

    // Streaming by rows, and the reader's refusals.
    td_err err = {{0}};
    td_tapfile *f = NULL;
    cr_assert_eq(td_tapfile_open(&f, path, &err), TD_OK, "%s", err.msg);
    double rows[2 * NV];
    cr_assert_eq(td_tapfile_read_rows_f64(f, 0, "out.logits", 1, 2, rows, 2 * NV, &err), TD_OK, "%s", err.msg);
    for (int i = 0; i < 2 * NV; i++)
        cr_expect_eq(rows[i], logit_value(0, NV + i), "row-read logits[%d]", NV + i);
    cr_expect_eq(td_tapfile_read_rows_f64(f, 0, "out.logits", 3, 2, rows, 2 * NV, &err), TD_EINPUT);
    cr_expect(strstr(err.msg, "rows") != NULL, "%s", err.msg);
    cr_expect_eq(td_tapfile_read_f64(f, 0, "out.logits", rows, 2 * NV, &err), TD_EINPUT); // count 4*NV
    cr_expect(strstr(err.msg, "2400") != NULL, "%s", err.msg);
    int64_t iv[8];
    cr_expect_eq(td_tapfile_read_i64(f, 0, "inp.embd", iv, 8, &err), TD_EINPUT);
    cr_expect(strstr(err.msg, "not an integer tap") != NULL, "%s", err.msg);
    td_tap_info ti;
    cr_expect_eq(td_tapfile_tap(f, 1, "blk.0.attn_norm", &ti, &err), TD_EINPUT); // prefill-only tap
    cr_expect(strstr(err.msg, "blk.0.attn_norm") != NULL && strstr(err.msg, "000001") != NULL, "%s", err.msg);
    cr_expect_eq(td_tapfile_tap(f, 2, "blk.0.attn_q", &ti, &err), TD_OK, "%s", err.msg);
    cr_expect_eq(ti.seq, 13);
    td_step_info si;
    cr_expect_eq(td_tapfile_step(f, 3, &si, &err), TD_EINPUT);
    cr_expect(strstr(err.msg, "3 complete steps") != NULL, "%s", err.msg);
    td_tapfile_close(f);
}

// Stored taps (compress 0, as tapdiff run writes them) are read straight from
// the file's bytes at the offsets the check found: every dtype must come
// back as written, whole and by rows, with the check in a child and in
// process; chunked (deflated) taps still go through HDF5.
Test(taps, raw_reads_give_the_values_written) {
    const char *stored = tmp_path("stored.h5"), *deflated = tmp_path("deflated.h5");
    sample_compress = 0;
    write_sample(stored, TD_TAP_FULL, NULL);
    sample_compress = 4;
    write_sample(deflated, TD_TAP_FULL, NULL);
    for (int inproc = 0; inproc < 2; inproc++) {
        if (inproc) setenv("TD_TAPFILE_INPROCESS", "1", 1);
        check_sample(stored, TD_TAP_FULL, 0, "");
        td_err err = {{0}};
        td_tapfile *f = NULL;
        cr_assert_eq(td_tapfile_open(&f, stored, &err), TD_OK, "%s", err.msg);
        uint64_t total = 0;
        for (int k = 0; k < N_SAMPLE; k++) {
            const sample_tap *t = &sample[k];
            uint64_t count = sample_count(t);
            double *x = calloc(count, sizeof *x);
            cr_assert_eq(td_tapfile_read_f64(f, t->step, t->full, x, count, &err), TD_OK, "%s", err.msg);
            for (uint64_t i = 0; i < count; i++)
                cr_expect(same(x[i], sample_value(t, i)), "%s[%llu] = %.17g, want %.17g", t->full,
                          (unsigned long long)i, x[i], sample_value(t, i));
            total += count;
            free(x);
        }
        cr_expect_eq(td_tapfile_raw_values(f), total, "in process %d: %llu of %llu values read raw", inproc,
                     (unsigned long long)td_tapfile_raw_values(f), (unsigned long long)total);
        double rows[2 * NV];
        cr_assert_eq(td_tapfile_read_rows_f64(f, 0, "out.logits", 2, 2, rows, 2 * NV, &err), TD_OK, "%s", err.msg);
        for (int i = 0; i < 2 * NV; i++) cr_expect_eq(rows[i], logit_value(0, 2 * NV + i), "logits[%d]", 2 * NV + i);
        td_tapfile_close(f);

        cr_assert_eq(td_tapfile_open(&f, deflated, &err), TD_OK, "%s", err.msg);
        cr_assert_eq(td_tapfile_read_rows_f64(f, 0, "out.logits", 2, 2, rows, 2 * NV, &err), TD_OK, "%s", err.msg);
        for (int i = 0; i < 2 * NV; i++) cr_expect_eq(rows[i], logit_value(0, 2 * NV + i), "logits[%d]", 2 * NV + i);
        cr_expect_eq(td_tapfile_raw_values(f), 0, "deflated logits read raw");
        td_tapfile_close(f);
    }
    unsetenv("TD_TAPFILE_INPROCESS");
}

// Rewrites tap `name` of step 0 of a closed tap file stored as file type
// ftype, in an external file (ext != NULL) or in the tap file, with its
// attributes as they were; the values are the same numbers.
static void restore_tap(const char *path, const char *name, hid_t ftype, const char *ext) {
    hid_t h = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    cr_assert_geq(h, 0);
    hid_t g = H5Gopen2(h, "/steps/000000", H5P_DEFAULT), d = H5Dopen2(g, name, H5P_DEFAULT);
    cr_assert_geq(d, 0);
    hid_t space = H5Dget_space(d), old_type = H5Dget_type(d);
    hid_t mtype = H5Tget_native_type(old_type, H5T_DIR_ASCEND);
    size_t bytes = (size_t)H5Sget_simple_extent_npoints(space) * H5Tget_size(mtype);
    unsigned char *vals = malloc(bytes);
    cr_assert_geq(H5Dread(d, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, vals), 0);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    if (ext) cr_assert_geq(H5Pset_external(dcpl, ext, 0, (hsize_t)bytes), 0);
    hid_t nd = H5Dcreate2(g, "restored", ftype, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    cr_assert_geq(nd, 0);
    cr_assert_geq(H5Dwrite(nd, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, vals), 0);
    H5O_info_t oi;
    cr_assert_geq(H5Oget_info2(d, &oi, H5O_INFO_NUM_ATTRS), 0);
    for (hsize_t i = 0; i < oi.num_attrs; i++) {
        hid_t a = H5Aopen_by_idx(d, ".", H5_INDEX_NAME, H5_ITER_INC, i, H5P_DEFAULT, H5P_DEFAULT);
        cr_assert_geq(a, 0);
        char an[64];
        cr_assert_gt(H5Aget_name(a, sizeof an, an), 0);
        hid_t at = H5Aget_type(a), as = H5Aget_space(a);
        unsigned char buf[64] = {0}; // read as stored: a string comes back as a pointer to free
        cr_assert_leq((size_t)H5Sget_simple_extent_npoints(as) * H5Tget_size(at), sizeof buf);
        cr_assert_geq(H5Aread(a, at, buf), 0);
        hid_t na = H5Acreate2(nd, an, at, as, H5P_DEFAULT, H5P_DEFAULT);
        cr_assert_geq(na, 0);
        cr_assert_geq(H5Awrite(na, at, buf), 0);
        if (H5Tis_variable_str(at) > 0) {
            char *str;
            memcpy(&str, buf, sizeof str);
            H5free_memory(str);
        }
        H5Aclose(na);
        H5Sclose(as);
        H5Tclose(at);
        H5Aclose(a);
    }
    free(vals);
    H5Dclose(nd);
    H5Pclose(dcpl);
    H5Tclose(mtype);
    H5Tclose(old_type);
    H5Sclose(space);
    H5Dclose(d);
    cr_assert_geq(H5Ldelete(g, name, H5P_DEFAULT), 0);
    cr_assert_geq(H5Lmove(g, "restored", g, name, H5P_DEFAULT, H5P_DEFAULT), 0);
    H5Gclose(g);
    H5Fclose(h);
}

// Replaces the first run of 8 0xff bytes (HDF5's "no address") after the
// layout message signature of a contiguous dataset (version 3, class 1) with
// address 0: storage that claims to lie in the tap file while an external
// file list holds its values. Returns 1 if it found one.
static int give_external_an_address(const char *path) {
    FILE *fp = fopen(path, "r+b");
    cr_assert_not_null(fp);
    static unsigned char b[1 << 20];
    size_t n = fread(b, 1, sizeof b, fp);
    int done = 0;
    for (size_t i = 0; i + 10 <= n && !done; i++) {
        if (b[i] != 3 || b[i + 1] != 1) continue;
        int undef = 1;
        for (int k = 0; k < 8; k++) undef &= b[i + 2 + k] == 0xff;
        if (!undef) continue;
        memset(b + i + 2, 0, 8);
        cr_assert_eq(fseek(fp, (long)(i + 2), SEEK_SET), 0);
        cr_assert_eq(fwrite(b + i + 2, 1, 8, fp), 8);
        done = 1;
    }
    fclose(fp);
    return done;
}

// Values stored big-endian, or in an external file while the layout claims
// an address in the tap file, are not taken as raw little-endian bytes from
// the tap file: they are read through HDF5 as they are (the check reads the
// external ones too), every other tap raw as before.
Test(taps, raw_reads_only_for_little_endian_values_in_the_file) {
    const char *be = tmp_path("be.h5"), *ext = tmp_path("ext.h5");
    sample_compress = 0;
    write_sample(be, TD_TAP_FULL, NULL);
    restore_tap(be, "blk.0.attn_norm", H5T_IEEE_F32BE, NULL);
    write_sample(ext, TD_TAP_FULL, NULL);
    char ext_values[400];
    snprintf(ext_values, sizeof ext_values, "%s.values", ext);
    restore_tap(ext, "inp.embd", H5T_IEEE_F64LE, ext_values);
    cr_assert(give_external_an_address(ext), "no external storage without an address in %s", ext);
    uint64_t all = 0;
    for (int k = 0; k < N_SAMPLE; k++) all += sample_count(&sample[k]);
    const char *paths[2] = {be, ext};
    const uint64_t not_raw[2] = {8, 8}; // attn_norm: 4 x 2; embd: 4 x 2
    for (int inproc = 0; inproc < 2; inproc++) {
        if (inproc) setenv("TD_TAPFILE_INPROCESS", "1", 1);
        for (int i = 0; i < 2; i++) {
            check_sample(paths[i], TD_TAP_FULL, 0, "");
            td_err err = {{0}};
            td_tapfile *f = NULL;
            cr_assert_eq(td_tapfile_open(&f, paths[i], &err), TD_OK, "%s", err.msg);
            uint64_t total = 0;
            for (int k = 0; k < N_SAMPLE; k++) {
                uint64_t count = sample_count(&sample[k]);
                double *x = calloc(count, sizeof *x);
                cr_assert_eq(td_tapfile_read_f64(f, sample[k].step, sample[k].full, x, count, &err), TD_OK, "%s",
                             err.msg);
                for (uint64_t j = 0; j < count; j++)
                    cr_expect(same(x[j], sample_value(&sample[k], j)), "%s: %s[%llu] = %.17g, want %.17g", paths[i],
                              sample[k].full, (unsigned long long)j, x[j], sample_value(&sample[k], j));
                free(x);
                total += count;
            }
            cr_expect_eq(total, all);
            cr_expect_eq(td_tapfile_raw_values(f), all - not_raw[i], "%s, in process %d: %llu of %llu values raw",
                         paths[i], inproc, (unsigned long long)td_tapfile_raw_values(f), (unsigned long long)all);
            td_tapfile_close(f);
        }
    }
    unsetenv("TD_TAPFILE_INPROCESS");
}

Test(taps, fingerprint_mode_writes_no_data) {
    const char *full = tmp_path("full.h5"), *fpo = tmp_path("fp.h5");
    write_sample(full, TD_TAP_FULL, NULL);
    write_sample(fpo, TD_TAP_FINGERPRINT, "out.*"); // the filter changes nothing here
    check_sample(fpo, TD_TAP_FINGERPRINT, 0, "out.*");
    // No data stored: the file is much smaller than the full one.
    struct stat a, b;
    cr_assert_eq(stat(full, &a), 0);
    cr_assert_eq(stat(fpo, &b), 0);
    cr_expect(b.st_size + 8000 < a.st_size, "fingerprint file %lld bytes, full %lld", (long long)b.st_size,
              (long long)a.st_size);
}

Test(taps, filter_keeps_matching_data) {
    const char *path = tmp_path("filtered.h5");
    write_sample(path, TD_TAP_FULL, SAMPLE_FILTER);
    check_sample(path, TD_TAP_FULL, 1, SAMPLE_FILTER);
}

Test(taps, compress_zero_and_bad_options) {
    const char *path = tmp_path("plain.h5");
    sample_init();
    td_err err = {{0}};
    td_tap_options o = td_tap_options_default();
    cr_expect_eq(o.mode, TD_TAP_FULL);
    cr_expect_eq(o.compress, 4);
    cr_expect_null(o.filter);
    td_tap_sink *s = NULL;
    o.compress = 10;
    cr_expect_eq(td_tap_sink_open(&s, path, &o, &err), TD_EINPUT);
    cr_expect(strstr(err.msg, "compress level 10") != NULL, "%s", err.msg);
    cr_expect_null(s);
    o.compress = 4;
    o.mode = (td_tap_mode)7;
    cr_expect_eq(td_tap_sink_open(&s, path, &o, &err), TD_EINPUT);
    cr_expect(strstr(err.msg, "tap mode 7") != NULL, "%s", err.msg);
    cr_expect_eq(td_tap_sink_open(&s, tmp_path("no/such/dir.h5"), NULL, &err), TD_EOUTPUT);
    cr_expect(strstr(err.msg, "no/such/dir.h5") != NULL && strstr(err.msg, "cannot create") != NULL, "%s", err.msg);
}

/* ------------------------------------------------------------------------ */
/* Sticky errors                                                              */

Test(taps, duplicate_tap_is_sticky) {
    const char *path = tmp_path("dup.h5");
    td_err err = {{0}};
    td_tap_sink *s = NULL;
    const float x[2] = {1, 2};
    const int64_t shape[1] = {2};
    cr_assert_eq(td_tap_sink_open(&s, path, NULL, &err), TD_OK, "%s", err.msg);
    cr_assert_eq(td_tap_step_begin(s, TD_STEP_PREFILL, 0, 2, &err), TD_OK, "%s", err.msg);
    td_tap_emit(s, 3, "attn_q", TD_DT_F32, x, 1, shape);
    cr_assert_eq(td_tap_step_end(s, &err), TD_OK, "%s", err.msg);
    cr_assert_eq(td_tap_step_begin(s, TD_STEP_DECODE, 2, 1, &err), TD_OK, "%s", err.msg);
    td_tap_emit(s, 3, "attn_q", TD_DT_F32, x, 1, shape);
    td_tap_emit(s, 3, "attn_q", TD_DT_F32, x, 1, shape); // the duplicate
    td_tap_emit(s, 3, "attn_k", TD_DT_F32, x, 1, shape); // ignored after the error
    cr_expect_eq(td_tap_step_end(s, &err), TD_EINPUT);
    cr_expect(strstr(err.msg, "blk.3.attn_q") && strstr(err.msg, "twice") && strstr(err.msg, "000001") &&
                  strstr(err.msg, path),
              "%s", err.msg);
    td_err again = {{0}};
    cr_expect_eq(td_tap_step_begin(s, TD_STEP_DECODE, 3, 1, &again), TD_EINPUT);
    cr_expect_str_eq(again.msg, err.msg); // the first error is kept
    cr_expect_eq(td_tap_sink_attr_i64(s, "threads", 1), TD_EINPUT);
    memset(&again, 0, sizeof again);
    cr_expect_eq(td_tap_sink_close(s, &again), TD_EINPUT);
    cr_expect_str_eq(again.msg, err.msg);

    // The step finished before the error is intact; the failed one is not counted.
    td_tapfile *f = NULL;
    cr_assert_eq(td_tapfile_open(&f, path, &err), TD_OK, "%s", err.msg);
    cr_expect_eq(td_tapfile_n_steps(f), 1);
    cr_expect(strstr(td_tapfile_note(f), "000001") != NULL, "note: %s", td_tapfile_note(f));
    double v[2];
    cr_expect_eq(td_tapfile_read_f64(f, 0, "blk.3.attn_q", v, 2, &err), TD_OK, "%s", err.msg);
    cr_expect(v[0] == 1 && v[1] == 2);
    td_tapfile_close(f);
}

Test(taps, misuse_is_sticky) {
    td_err err = {{0}};
    td_tap_sink *s = NULL;
    const float x[2] = {1, 2};
    const int64_t shape[2] = {2, -1};
    struct {
        const char *what, *expect;
    } cases[] = {{"outside a step", "outside a step"}, {"bad shape", "dimension 1 is -1"},
                 {"slash", "contains '/'"},         {"reserved attr", "written by the tap sink"},
                 {"end without begin", "without step_begin"}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        cr_assert_eq(td_tap_sink_open(&s, tmp_path("misuse.h5"), NULL, &err), TD_OK, "%s", err.msg);
        if (c != 0 && c != 4) cr_assert_eq(td_tap_step_begin(s, TD_STEP_PREFILL, 0, 2, &err), TD_OK);
        switch (c) {
        case 0: td_tap_emit(s, -1, "x", TD_DT_F32, x, 1, shape); break;
        case 1: td_tap_emit(s, -1, "x", TD_DT_F32, x, 2, shape); break;
        case 2: td_tap_emit(s, -1, "a/b", TD_DT_F32, x, 1, shape); break;
        case 3: cr_expect_eq(td_tap_sink_attr_str(s, "format", "mine"), TD_EINPUT); break;
        case 4: break;
        }
        cr_expect_eq(td_tap_step_end(s, &err), TD_EINPUT, "%s", cases[c].what);
        cr_expect(strstr(err.msg, cases[c].expect) != NULL, "%s: %s", cases[c].what, err.msg);
        cr_expect_eq(td_tap_sink_close(s, &err), TD_EINPUT, "%s", cases[c].what);
    }
}

/* ------------------------------------------------------------------------ */
/* The reader's refusals                                                      */

Test(taps, reader_rejects_foreign_files) {
    td_err err = {{0}};
    td_tapfile *f = NULL;
    const char *txt = tmp_path("not.h5");
    FILE *fp = fopen(txt, "w");
    cr_assert_not_null(fp);
    fputs("this is not an HDF5 file\n", fp);
    fclose(fp);
    cr_expect_eq(td_tapfile_open(&f, txt, &err), TD_EINPUT);
    cr_expect(strstr(err.msg, "not an HDF5 file") && strstr(err.msg, txt), "%s", err.msg);
    cr_expect_null(f);

    cr_expect_eq(td_tapfile_open(&f, tmp_path("missing.h5"), &err), TD_EINPUT);
    cr_expect(strstr(err.msg, "No such file") != NULL, "%s", err.msg);

    // An HDF5 file that is not ours (made with the HDF5 API directly).
    const char *other = tmp_path("other.h5");
    hid_t h = H5Fcreate(other, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    cr_assert_geq(h, 0);
    hid_t g = H5Gcreate2(h, "steps", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    cr_assert_geq(g, 0);
    H5Gclose(g);
    H5Fclose(h);
    cr_expect_eq(td_tapfile_open(&f, other, &err), TD_EINPUT);
    cr_expect(strstr(err.msg, "'format'") && strstr(err.msg, "not a tapdiff tap file"), "%s", err.msg);

    // A format attribute that names another format.
    h = H5Fopen(other, H5F_ACC_RDWR, H5P_DEFAULT);
    cr_assert_geq(h, 0);
    hid_t str = H5Tcopy(H5T_C_S1), sp = H5Screate(H5S_SCALAR);
    cr_assert_geq(H5Tset_size(str, H5T_VARIABLE), 0);
    hid_t fa = H5Acreate2(h, "format", str, sp, H5P_DEFAULT, H5P_DEFAULT);
    cr_assert_geq(fa, 0);
    const char *fmt = "someone-elses-taps";
    cr_assert_geq(H5Awrite(fa, str, &fmt), 0);
    H5Aclose(fa);
    H5Sclose(sp);
    H5Tclose(str);
    H5Fclose(h);
    cr_expect_eq(td_tapfile_open(&f, other, &err), TD_EINPUT);
    cr_expect(strstr(err.msg, "someone-elses-taps") && strstr(err.msg, "expected \"tapdiff-taps\""), "%s", err.msg);

    // Ours, but a later format version.
    const char *later = tmp_path("later.h5");
    write_sample(later, TD_TAP_FINGERPRINT, NULL);
    h = H5Fopen(later, H5F_ACC_RDWR, H5P_DEFAULT);
    cr_assert_geq(h, 0);
    hid_t a = H5Aopen(h, "format_version", H5P_DEFAULT);
    cr_assert_geq(a, 0);
    int32_t two = 2;
    cr_assert_geq(H5Awrite(a, H5T_NATIVE_INT32, &two), 0);
    H5Aclose(a);
    H5Fclose(h);
    cr_expect_eq(td_tapfile_open(&f, later, &err), TD_EINPUT);
    cr_expect(strstr(err.msg, "format_version is 2") != NULL, "%s", err.msg);
}

// Several files checked at once report what opening them one by one would:
// the first failure in order, and nothing left open.
Test(taps, open_all_is_open_in_order) {
    td_err err = {{0}};
    // tmp_path's buffers are reused: copies, to hold five paths at once
    char good[400], good2[400], later[400], txt[400], missing[400];
    snprintf(good, sizeof good, "%s", tmp_path("good.h5"));
    snprintf(good2, sizeof good2, "%s", tmp_path("good2.h5"));
    snprintf(later, sizeof later, "%s", tmp_path("later2.h5"));
    snprintf(txt, sizeof txt, "%s", tmp_path("text.h5"));
    snprintf(missing, sizeof missing, "%s", tmp_path("missing2.h5"));
    write_sample(good, TD_TAP_FULL, NULL);
    write_sample(good2, TD_TAP_FINGERPRINT, NULL);
    write_sample(later, TD_TAP_FINGERPRINT, NULL);
    hid_t h = H5Fopen(later, H5F_ACC_RDWR, H5P_DEFAULT);
    cr_assert_geq(h, 0);
    hid_t a = H5Aopen(h, "format_version", H5P_DEFAULT);
    cr_assert_geq(a, 0);
    int32_t two = 2;
    cr_assert_geq(H5Awrite(a, H5T_NATIVE_INT32, &two), 0);
    H5Aclose(a);
    H5Fclose(h);
    FILE *fp = fopen(txt, "w");
    cr_assert_not_null(fp);
    fputs("this is not an HDF5 file\n", fp);
    fclose(fp);

    td_tapfile *f[3] = {NULL, NULL, NULL}, *one = NULL;
    const char *ok[2] = {good, good2};
    cr_assert_eq(td_tapfile_open_all(f, ok, 2, &err), TD_OK, "%s", err.msg);
    cr_assert(f[0] && f[1]);
    cr_assert_eq(td_tapfile_open(&one, good, &err), TD_OK, "%s", err.msg);
    cr_expect_eq(td_tapfile_n_steps(f[0]), td_tapfile_n_steps(one));
    cr_expect_str_eq(td_tapfile_path(f[1]), good2);
    td_tap_info t0, t1;
    cr_assert_eq(td_tapfile_tap(f[0], 0, "out.logits", &t0, &err), TD_OK, "%s", err.msg);
    cr_assert_eq(td_tapfile_tap(one, 0, "out.logits", &t1, &err), TD_OK, "%s", err.msg);
    cr_expect_eq(memcmp(&t0, &t1, sizeof t0), 0);
    td_tapfile_close(one);
    td_tapfile_close(f[0]);
    td_tapfile_close(f[1]);

    struct {
        const char *paths[3];
        int n;
        const char *msg; // the first failing file's message
    } cases[] = {
        {{good, later}, 2, "format_version is 2"},
        {{txt, later}, 2, "not an HDF5 file"},
        {{later, txt}, 2, "format_version is 2"},
        {{missing, good}, 2, "No such file"},
        {{good, good2, txt}, 3, "not an HDF5 file"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        err.msg[0] = '\0';
        f[0] = f[1] = f[2] = (td_tapfile *)&err; // must come back NULL
        cr_expect_eq(td_tapfile_open_all(f, cases[i].paths, cases[i].n, &err), TD_EINPUT, "case %zu", i);
        cr_expect(strstr(err.msg, cases[i].msg) != NULL, "case %zu: %s", i, err.msg);
        for (int k = 0; k < cases[i].n; k++) cr_expect_null(f[k], "case %zu file %d", i, k);
    }
}

Test(taps, trailing_incomplete_step_is_ignored) {
    const char *path = tmp_path("partial.h5");
    td_err err = {{0}};
    td_tap_sink *s = NULL;
    const int32_t tok[1] = {3};
    const int64_t shape[1] = {1};
    cr_assert_eq(td_tap_sink_open(&s, path, NULL, &err), TD_OK, "%s", err.msg);
    for (int step = 0; step < 3; step++) {
        cr_assert_eq(td_tap_step_begin(s, TD_STEP_DECODE, step, 1, &err), TD_OK, "%s", err.msg);
        td_tap_emit(s, -1, "inp.tokens", TD_DT_I32, tok, 1, shape);
        if (step < 2) cr_assert_eq(td_tap_step_end(s, &err), TD_OK, "%s", err.msg);
    }
    cr_assert_eq(td_tap_sink_close(s, &err), TD_OK, "%s", err.msg); // closing mid-step is allowed
    td_tapfile *f = NULL;
    cr_assert_eq(td_tapfile_open(&f, path, &err), TD_OK, "%s", err.msg);
    cr_expect_eq(td_tapfile_n_steps(f), 2);
    cr_expect(strstr(td_tapfile_note(f), "step 000002 is incomplete") != NULL, "note: %s", td_tapfile_note(f));
    td_step_info si;
    cr_expect_eq(td_tapfile_step(f, 2, &si, &err), TD_EINPUT);
    td_tapfile_close(f);
}

/* ------------------------------------------------------------------------ */
/* A writer killed with SIGKILL                                               */

#define KILL_STEPS 3      /* steps completed before the kill */
/* Taps of the unfinished step: enough metadata (~1 KiB each) to overflow
 * HDF5's default 2 MiB metadata cache, so that a writer relying on H5Fflush
 * alone has evictions write half-updated /steps structures and loses the
 * whole file (seen with 1.10.8: "addr overflow" listing /steps). */
#define KILL_OPEN_TAPS 3000

static float kill_value(int step, int i) {
    return (float)(i % 101) * 0.5f - (float)step;
}

// The child: writes KILL_STEPS steps, tells the parent, then writes part of
// one more and waits to be killed. Never returns into Criterion.
static void kill_child(const char *path, int fd, int threaded) {
    alarm(60); // never outlive a parent that failed
    if (!threaded) setenv("TAPDIFF_TAP_THREAD", "0", 1);
    td_err err = {{0}};
    td_tap_sink *s = NULL;
    static float x[4 * NV];
    const int64_t shape[2] = {4, NV}, one[1] = {1};
    if (td_tap_sink_open(&s, path, NULL, &err) || td_taps_threaded(s) != threaded) _exit(2);
    for (int step = 0; step <= KILL_STEPS; step++) {
        if (td_tap_step_begin(s, step ? TD_STEP_DECODE : TD_STEP_PREFILL, step, step ? 1 : 4, &err)) _exit(3);
        for (int i = 0; i < 4 * NV; i++) x[i] = kill_value(step, i);
        int32_t tok = 100 + step;
        td_tap_emit(s, -1, "inp.tokens", TD_DT_I32, &tok, 1, one);
        td_tap_emit(s, 0, "attn_q", TD_DT_F32, x, 2, shape); // chunked + deflated
        td_tap_emit(s, -1, "out.logits", TD_DT_F32, x, 1, one);
        if (step == KILL_STEPS) break;
        if (td_tap_step_end(s, &err)) _exit(4);
    }
    // The unfinished step goes on with many small datasets.
    for (int i = 0; i < KILL_OPEN_TAPS; i++) {
        char name[32];
        snprintf(name, sizeof name, "extra_%d", i);
        td_tap_emit(s, i % 8, name, TD_DT_F32, x, 1, one);
    }
    char c = 'k';
    if (write(fd, &c, 1) != 1) _exit(5);
    for (;;) pause();
}

/* The promise (tap.h, td_tap_step_end): without the writer thread every
 * ended step survives; with it every step but the last one ended (whose
 * commit may still be queued). Either way the file reads, and every step it
 * lists is intact. */
static void sigkill_run(const char *path, int threaded) {
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        close(fds[0]);
        kill_child(path, fds[1], threaded);
        _exit(1);
    }
    close(fds[1]);
    char c = 0;
    ssize_t r = read(fds[0], &c, 1);
    close(fds[0]);
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    cr_assert_eq(r, 1, "the writer exited before its signal (status %d)", status);
    cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "status %d", status);

    td_err err = {{0}};
    td_tapfile *f = NULL;
    cr_assert_eq(td_tapfile_open(&f, path, &err), TD_OK, "%s", err.msg);
    const int64_t n_steps = td_tapfile_n_steps(f);
    if (threaded)
        cr_assert(n_steps == KILL_STEPS || n_steps == KILL_STEPS - 1, "%lld steps; note: %s", (long long)n_steps,
                  td_tapfile_note(f));
    else
        cr_assert_eq(n_steps, KILL_STEPS, "note: %s", td_tapfile_note(f));
    static double v[4 * NV];
    for (int step = 0; step < n_steps; step++) {
        td_tap_info *taps = NULL;
        int64_t n = 0;
        cr_assert_eq(td_tapfile_step_taps(f, step, &taps, &n, &err), TD_OK, "%s", err.msg);
        cr_expect_eq(n, 3);
        cr_expect_eq(taps[1].seq, 3 * step + 1);
        free(taps);
        cr_assert_eq(td_tapfile_read_f64(f, step, "blk.0.attn_q", v, 4 * NV, &err), TD_OK, "%s", err.msg);
        for (int i = 0; i < 4 * NV; i++)
            cr_expect_eq(v[i], kill_value(step, i), "step %d attn_q[%d] = %g", step, i, v[i]);
        int64_t tok = 0;
        cr_assert_eq(td_tapfile_read_i64(f, step, "inp.tokens", &tok, 1, &err), TD_OK, "%s", err.msg);
        cr_expect_eq(tok, 100 + step);
    }
    td_tapfile_close(f);
}

Test(taps, sigkill_leaves_finished_steps) {
    sigkill_run(tmp_path("killed.h5"), 0);
}

Test(taps, sigkill_with_the_writer_thread_leaves_all_but_the_last_ended_step) {
    sigkill_run(tmp_path("killed-thread.h5"), 1);
}

/* ------------------------------------------------------------------------ */
/* h5py sees what the C reader sees                                          */

// Parses "key=value" out of a read_taps.py tap line.
static const char *field(const char *line, const char *key, char *buf, size_t n) {
    char pat[40];
    snprintf(pat, sizeof pat, " %s=", key);
    const char *p = strstr(line, pat);
    if (!p) return NULL;
    p += strlen(pat);
    size_t i = 0;
    while (p[i] && p[i] != ' ' && p[i] != '\n' && i + 1 < n) buf[i] = p[i], i++;
    buf[i] = '\0';
    return buf;
}

Test(taps, h5py_reads_the_same) {
    if (system("/usr/bin/python3 -c 'import h5py' >/dev/null 2>&1") != 0)
        cr_skip_test("/usr/bin/python3 cannot import h5py (Debian's python3-h5py): h5py check skipped");
    const char *root = getenv("TD_SOURCE_ROOT");
    if (!root || !*root) root = TD_SOURCE_ROOT;
    char script[512];
    snprintf(script, sizeof script, "%s/taps/tests/read_taps.py", root);
    cr_assert_eq(access(script, R_OK), 0, "cannot read %s", script);

    const char *path = tmp_path("h5py.h5");
    write_sample(path, TD_TAP_FULL, "blk.*,out.*");
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 '%s' '%s' 2>&1", script, path);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);

    td_err err = {{0}};
    td_tapfile *f = NULL;
    cr_assert_eq(td_tapfile_open(&f, path, &err), TD_OK, "%s", err.msg);
    static char line[1 << 16];
    int n_root_str = 0, n_steps = 0, n_taps = 0, n_vals = 0, saw_gzip = 0;
    while (fgets(line, sizeof line, p)) {
        char key[64], type[16], val[256], name[TD_TAP_NAME_MAX], b[256];
        int step;
        if (sscanf(line, "root %63s %15s %255[^\n]", key, type, val) == 3) {
            char *mine = NULL;
            cr_assert_eq(td_tapfile_attr_str(f, key, &mine, &err), TD_OK, "%s", err.msg);
            if (strcmp(key, "format_version") == 0 || strcmp(key, "threads") == 0) {
                cr_expect_str_eq(type, "int", "h5py type of %s", key);
                cr_expect_str_eq(val, mine, "root %s", key);
            } else if (strcmp(key, "temperature") == 0) {
                cr_expect(strcmp(type, "float") == 0 && strtod(val, NULL) == 0.5, "%s", line);
            } else {
                // every string attribute comes out of h5py as str, not bytes
                cr_expect_str_eq(type, "str", "h5py type of %s", key);
                cr_expect_str_eq(val, mine, "root %s", key);
                n_root_str++;
            }
            free(mine);
        } else if (sscanf(line, "step %d kind=%255s", &step, val) == 2) {
            td_step_info si;
            cr_assert_eq(td_tapfile_step(f, step, &si, &err), TD_OK, "%s", err.msg);
            cr_expect_str_eq(val, si.kind == TD_STEP_PREFILL ? "prefill" : "decode");
            cr_expect_eq(strtoll(field(line, "pos0", b, sizeof b), NULL, 10), si.pos0);
            cr_expect_eq(strtoll(field(line, "n_tokens", b, sizeof b), NULL, 10), si.n_tokens);
            cr_expect_eq(strtoll(field(line, "n_taps", b, sizeof b), NULL, 10), si.n_taps);
            cr_expect_str_eq(field(line, "complete", b, sizeof b), "1");
            n_steps++;
        } else if (sscanf(line, "tap %d %127s", &step, name) == 2) {
            td_tap_info t;
            cr_assert_eq(td_tapfile_tap(f, step, name, &t, &err), TD_OK, "%s", err.msg);
            cr_expect_eq(strtoll(field(line, "seq", b, sizeof b), NULL, 10), t.seq, "%s", name);
            cr_expect_eq(strtol(field(line, "layer", b, sizeof b), NULL, 10), t.layer, "%s", name);
            cr_expect_str_eq(field(line, "dtype", b, sizeof b), td_dtype_name(t.dtype), "%s", name);
            cr_expect_eq(strtol(field(line, "has_data", b, sizeof b), NULL, 10), t.has_data, "%s", name);
            cr_expect_eq(strtol(field(line, "null", b, sizeof b), NULL, 10), !t.has_data, "%s: null dataspace", name);
            char want[128] = "";
            for (int d = 0; d < t.ndim; d++)
                snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", d ? "," : "", (long long)t.shape[d]);
            cr_expect_str_eq(field(line, "shape", b, sizeof b), want, "%s", name);
            if (strcmp(name, "out.logits") == 0 && step == 0) {
                cr_expect_str_eq(field(line, "gzip", b, sizeof b), "1", "out.logits is deflated");
                cr_expect_str_eq(field(line, "shuffle", b, sizeof b), "1", "out.logits is shuffled");
                saw_gzip = 1;
            }
            td_fingerprint hp = {0};
            hp.count = strtoull(field(line, "fp_count", b, sizeof b), NULL, 10);
            hp.n_nonfinite = strtoull(field(line, "fp_nonfinite", b, sizeof b), NULL, 10);
            hp.n_nonzero = strtoull(field(line, "fp_nonzero", b, sizeof b), NULL, 10);
            hp.min = strtod(field(line, "fp_min", b, sizeof b), NULL);
            hp.max = strtod(field(line, "fp_max", b, sizeof b), NULL);
            hp.max_abs = strtod(field(line, "fp_maxabs", b, sizeof b), NULL);
            hp.sum = strtod(field(line, "fp_sum", b, sizeof b), NULL);
            hp.sum_abs = strtod(field(line, "fp_sumabs", b, sizeof b), NULL);
            hp.sum_sq = strtod(field(line, "fp_sumsq", b, sizeof b), NULL);
            char *q = (char *)field(line, "fp_first", b, sizeof b);
            for (int i = 0; i < 4; i++) hp.first[i] = strtod(q, &q), q += (*q == ',');
            check_fp(name, &hp, &t.fp);
            n_taps++;
        } else if (sscanf(line, "val %d %127s", &step, name) == 2) {
            td_tap_info t;
            cr_assert_eq(td_tapfile_tap(f, step, name, &t, &err), TD_OK, "%s", err.msg);
            double *x = calloc(t.count, sizeof *x);
            cr_assert_eq(td_tapfile_read_f64(f, step, name, x, t.count, &err), TD_OK, "%s", err.msg);
            char *q = strstr(line, name) + strlen(name);
            for (uint64_t i = 0; i < t.count; i++) {
                char *end;
                double v = strtod(q, &end);
                cr_assert(end != q, "%s: h5py gave fewer than %llu values", name, (unsigned long long)t.count);
                cr_expect(same(v, x[i]), "%s[%llu]: h5py %.17g, C reader %.17g", name, (unsigned long long)i, v, x[i]);
                q = end;
            }
            free(x);
            n_vals++;
        } else {
            cr_expect_fail("unexpected output of read_taps.py: %s", line);
        }
    }
    int rc = pclose(p);
    cr_expect_eq(rc, 0, "read_taps.py exited with %d", rc);
    cr_expect_eq(n_root_str, 5, "string root attributes"); // format created tap_mode tap_filter backend
    cr_expect_eq(n_steps, 3);
    cr_expect_eq(n_taps, N_SAMPLE);
    cr_expect_eq(n_vals, 9, "taps with data under blk.*,out.*"); // 4 blk.* + 1 logits in step 0, 2+2 later
    cr_expect(saw_gzip);
    td_tapfile_close(f);
}

/* ------------------------------------------------------------------------ */
/* Device-aware taps                                                          */

// The sample written the way a device backend does: it asks what the sink
// keeps, copies data only for FULL, and hands FINGERPRINT taps a fingerprint
// of its own (here the table's, worked out by hand: not td_fingerprint_compute).
static void write_sample_device(const char *path, td_tap_mode mode, const char *filter, int *n_full) {
    sample_init();
    td_err err = {{0}};
    td_tap_options o = td_tap_options_default();
    o.mode = mode;
    o.filter = filter;
    td_tap_sink *s = NULL;
    cr_assert_eq(td_tap_sink_open(&s, path, &o, &err), TD_OK, "%s", err.msg);
    cr_assert_eq(td_tap_sink_attr_str(s, "backend", "unit-test-2"), TD_OK);
    cr_assert_eq(td_tap_sink_attr_i64(s, "threads", 4), TD_OK);
    cr_assert_eq(td_tap_sink_attr_f64(s, "temperature", 0.5), TD_OK);
    cr_assert_eq(TD_TAP_WANT(s, 0, "attn_q"), TD_TAP_WANT_NONE, "no step is open: nothing is wanted");
    *n_full = 0;
    int k = 0;
    for (int step = 0; step < sample_steps; step++) {
        cr_assert_eq(td_tap_step_begin(s, step == 0 ? TD_STEP_PREFILL : TD_STEP_DECODE, step_pos0[step],
                                       step_ntok[step], &err),
                     TD_OK, "%s", err.msg);
        for (; k < N_SAMPLE && sample[k].step == step; k++) {
            const sample_tap *t = &sample[k];
            switch (TD_TAP_WANT(s, t->layer, t->name)) {
            case TD_TAP_WANT_NONE: cr_assert_fail("%s: a sink in a step wants at least the fingerprint", t->full); break;
            case TD_TAP_WANT_FINGERPRINT:
                td_tap_emit_fingerprint(s, t->layer, t->name, t->dt, &t->fp, t->ndim, t->shape);
                break;
            case TD_TAP_WANT_FULL:
                (*n_full)++;
                td_tap_emit(s, t->layer, t->name, t->dt, t->data, t->ndim, t->shape);
                break;
            }
        }
        cr_assert_eq(td_tap_step_end(s, &err), TD_OK, "%s", err.msg);
    }
    cr_assert_eq(td_tap_sink_close(s, &err), TD_OK, "%s", err.msg);
}

Test(taps, device_path_writes_what_the_host_path_writes) {
    const char *a = tmp_path("dev_full.h5"), *b = tmp_path("dev_filtered.h5"), *c = tmp_path("dev_fp.h5");
    int n_full;
    write_sample_device(a, TD_TAP_FULL, NULL, &n_full);
    cr_expect_eq(n_full, N_SAMPLE, "full mode without a filter wants every tap's data");
    check_sample(a, TD_TAP_FULL, 0, "");
    write_sample_device(b, TD_TAP_FULL, SAMPLE_FILTER, &n_full);
    int in_filter = 0;
    for (int k = 0; k < N_SAMPLE; k++) in_filter += sample[k].in_filter;
    cr_expect_eq(n_full, in_filter, "only the filtered taps' data is wanted");
    check_sample(b, TD_TAP_FULL, 1, SAMPLE_FILTER);
    write_sample_device(c, TD_TAP_FINGERPRINT, "out.*", &n_full);
    cr_expect_eq(n_full, 0, "fingerprint mode wants no data");
    check_sample(c, TD_TAP_FINGERPRINT, 0, "out.*");
}

Test(taps, want_is_none_when_off_or_failed) {
    cr_assert_eq(TD_TAP_WANT((td_tap_sink *)NULL, 0, "attn_q"), TD_TAP_WANT_NONE);
    cr_assert_eq(td_tap_want(NULL, -1, "out.logits"), TD_TAP_WANT_NONE);
    td_err err = {{0}};
    td_tap_sink *s = NULL;
    cr_assert_eq(td_tap_sink_open(&s, tmp_path("want.h5"), NULL, &err), TD_OK, "%s", err.msg);
    cr_assert_eq(td_tap_step_begin(s, TD_STEP_PREFILL, 0, 2, &err), TD_OK, "%s", err.msg);
    cr_assert_eq(td_tap_want(s, 3, "attn_q"), TD_TAP_WANT_FULL);
    // a fingerprint whose count is not the shape's is refused, and sticks
    td_fingerprint fp;
    const float x[4] = {1, 2, 3, 4};
    td_fingerprint_compute(&fp, TD_DT_F32, x, 4);
    const int64_t shape[2] = {2, 3};
    td_tap_emit_fingerprint(s, 3, "attn_q", TD_DT_F32, &fp, 2, shape);
    cr_assert_eq(td_tap_want(s, 3, "attn_k"), TD_TAP_WANT_NONE, "after an error nothing is wanted");
    cr_assert_eq(td_tap_step_end(s, &err), TD_EINPUT);
    cr_expect(strstr(err.msg, "fingerprint counts 4 values, the shape 6") != NULL, "%s", err.msg);
    cr_assert_eq(td_tap_sink_close(s, &err), TD_EINPUT);
}

/* ------------------------------------------------------------------------ */
/* Engine helpers: the sink from the environment, provenance, token steps     */

Test(taps, engine_helpers_write_inputs_history_and_provenance) {
    td_err err = {{0}};
    td_tap_sink *s = (td_tap_sink *)1;
    unsetenv("TAPDIFF_TAPS");
    cr_assert_eq(td_tap_sink_open_env(&s, NULL, &err), TD_OK);
    cr_assert_null(s, "no path anywhere: taps off");
    setenv("TAPDIFF_TAP_MODE", "bogus", 1);
    cr_assert_eq(td_tap_sink_open_env(&s, tmp_path("x.h5"), &err), TD_EINPUT);
    cr_expect(strstr(err.msg, "TAPDIFF_TAP_MODE is 'bogus'") != NULL, "%s", err.msg);
    setenv("TAPDIFF_TAP_MODE", "full", 1);
    setenv("TAPDIFF_DECODE", "pinned:p.txt", 1);
    const char *path = tmp_path("engine.h5"), *model = tmp_path("model.bin");
    setenv("TAPDIFF_TAPS", path, 1);
    FILE *mf = fopen(model, "w");
    cr_assert_not_null(mf);
    fputs("abc", mf);
    fclose(mf);
    cr_assert_eq(td_tap_sink_open_env(&s, NULL, &err), TD_OK, "%s", err.msg);
    unsetenv("TAPDIFF_TAPS");
    unsetenv("TAPDIFF_DECODE");
    cr_assert_eq(td_tap_sink_provenance(s, model, "llama", "eng", NULL, "f32", &err), TD_OK, "%s", err.msg);
    // a 10-token prefill then 10 decode steps, positions left to the sink
    int32_t prompt[10];
    for (int i = 0; i < 10; i++) prompt[i] = 100 + i;
    cr_assert_eq(td_tap_step_begin_tokens(s, prompt, NULL, 10, &err), TD_OK, "%s", err.msg);
    cr_assert_eq(td_tap_step_end(s, &err), TD_OK, "%s", err.msg);
    for (int i = 0; i < 10; i++) {
        int32_t t = 200 + i;
        cr_assert_eq(td_tap_step_begin_tokens(s, &t, NULL, 1, &err), TD_OK, "%s", err.msg);
        if (i == 4) { // an engine with its own history: the sink does not add a second one
            const int64_t h[2] = {-1, -2}, w = 2;
            td_tap_emit(s, -1, "hist.tokens", TD_DT_I64, h, 1, &w);
        }
        cr_assert_eq(td_tap_step_end(s, &err), TD_OK, "%s", err.msg);
    }
    cr_assert_eq(td_tap_sink_close(s, &err), TD_OK, "%s", err.msg);

    td_tapfile *f = NULL;
    cr_assert_eq(td_tapfile_open(&f, path, &err), TD_OK, "%s", err.msg);
    cr_assert_eq(td_tapfile_n_steps(f), 11);
    char *v = NULL;
    // sha256("abc"), FIPS 180-2 appendix B.1
    struct {
        const char *key, *want;
    } attrs[] = {{"model_sha256", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
                 {"arch", "llama"},
                 {"backend", "eng"},
                 {"precision", "f32"},
                 {"decode", "pinned:p.txt"},
                 {"model", model}};
    for (size_t i = 0; i < sizeof attrs / sizeof attrs[0]; i++) {
        cr_assert_eq(td_tapfile_attr_str(f, attrs[i].key, &v, &err), TD_OK, "%s", err.msg);
        cr_expect_str_eq(v, attrs[i].want, "root attribute %s", attrs[i].key);
        free(v);
    }
    int64_t x[16];
    td_step_info si;
    cr_assert_eq(td_tapfile_step(f, 0, &si, &err), TD_OK, "%s", err.msg);
    cr_expect(si.kind == TD_STEP_PREFILL && si.pos0 == 0 && si.n_tokens == 10);
    cr_assert_eq(td_tapfile_read_i64(f, 0, "inp.pos", x, 10, &err), TD_OK, "%s", err.msg);
    for (int i = 0; i < 10; i++) cr_expect_eq(x[i], i);
    cr_assert_eq(td_tapfile_read_i64(f, 0, "hist.tokens", x, 10, &err), TD_OK, "%s", err.msg);
    for (int i = 0; i < 10; i++) cr_expect_eq(x[i], 100 + i);
    cr_assert_eq(td_tapfile_step(f, 10, &si, &err), TD_OK, "%s", err.msg);
    cr_expect(si.kind == TD_STEP_DECODE && si.pos0 == 19 && si.n_tokens == 1, "step 10: pos0 %lld",
              (long long)si.pos0);
    cr_assert_eq(td_tapfile_read_i64(f, 10, "inp.tokens", x, 1, &err), TD_OK, "%s", err.msg);
    cr_expect_eq(x[0], 209);
    // the window: the last 16 consumed, oldest first
    td_tap_info ti;
    cr_assert_eq(td_tapfile_tap(f, 10, "hist.tokens", &ti, &err), TD_OK, "%s", err.msg);
    cr_assert_eq(ti.shape[0], 16);
    cr_assert_eq(td_tapfile_read_i64(f, 10, "hist.tokens", x, 16, &err), TD_OK, "%s", err.msg);
    const int64_t want[16] = {104, 105, 106, 107, 108, 109, 200, 201, 202, 203, 204, 205, 206, 207, 208, 209};
    for (int i = 0; i < 16; i++) cr_expect_eq(x[i], want[i], "hist.tokens[%d] = %lld", i, (long long)x[i]);
    cr_assert_eq(td_tapfile_tap(f, 5, "hist.tokens", &ti, &err), TD_OK, "%s", err.msg);
    cr_expect_eq(ti.shape[0], 2, "the engine's own hist.tokens is kept");
    td_tapfile_close(f);
}

/* ------------------------------------------------------------------------ */
/* The writer thread (taps/tap.c): the same file as without it               */

static unsigned char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s: %s", path, strerror(errno));
    cr_assert_eq(fseek(f, 0, SEEK_END), 0);
    long len = ftell(f);
    cr_assert_geq(len, 0);
    rewind(f);
    unsigned char *b = malloc((size_t)len + 1);
    cr_assert_not_null(b);
    cr_assert_eq(fread(b, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    *n = (size_t)len;
    return b;
}

// Blanks the root attribute "created" ("YYYY-MM-DDTHH:MM:SSZ", the one thing
// two runs may write differently); 1 when it was found exactly once.
static int blank_created(unsigned char *b, size_t n) {
    static const char pat[] = "dddd-dd-ddTdd:dd:ddZ";
    const size_t L = sizeof pat - 1;
    int found = 0;
    for (size_t i = 0; i + L <= n; i++) {
        size_t k = 0;
        for (; k < L; k++) {
            const unsigned char c = b[i + k];
            if (pat[k] == 'd' ? !(c >= '0' && c <= '9') : c != (unsigned char)pat[k]) break;
        }
        if (k == L) {
            memset(b + i, 'X', L);
            found++;
        }
    }
    return found == 1;
}

static void same_bytes(const char *a, const char *b) {
    size_t na, nb;
    unsigned char *x = slurp(a, &na), *y = slurp(b, &nb);
    cr_expect(blank_created(x, na) && blank_created(y, nb), "the created attribute of %s / %s", a, b);
    cr_expect_eq(na, nb, "%s is %zu bytes, %s %zu", a, na, b, nb);
    size_t first = 0;
    while (first < na && first < nb && x[first] == y[first]) first++;
    cr_expect(na == nb && first == na, "%s and %s differ from byte %zu on", a, b, first);
    free(x);
    free(y);
}

Test(taps, writer_thread_writes_the_bytes_of_the_inline_writer) {
    static const struct {
        td_tap_mode mode;
        const char *filter;
        int compress;
    } cases[] = {
        {TD_TAP_FULL, NULL, 4}, {TD_TAP_FULL, NULL, 0}, {TD_TAP_FULL, SAMPLE_FILTER, 4}, {TD_TAP_FINGERPRINT, NULL, 4}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char a[64], b[64], c[64];
        snprintf(a, sizeof a, "inline%zu.h5", i);
        snprintf(b, sizeof b, "thread%zu.h5", i);
        snprintf(c, sizeof c, "tinyq%zu.h5", i);
        const char *pa = tmp_path(a), *pb = tmp_path(b), *pc = tmp_path(c);
        sample_compress = cases[i].compress;
        setenv("TAPDIFF_TAP_THREAD", "0", 1);
        sample_threaded = 0;
        write_sample(pa, cases[i].mode, cases[i].filter);
        unsetenv("TAPDIFF_TAP_THREAD");
        sample_threaded = 1;
        write_sample(pb, cases[i].mode, cases[i].filter);
        // a queue smaller than any tap: the emitter waits for the writer at every tap
        setenv("TD_TAPS_QUEUE_BYTES", "1", 1);
        write_sample(pc, cases[i].mode, cases[i].filter);
        unsetenv("TD_TAPS_QUEUE_BYTES");
        sample_threaded = -1;
        same_bytes(pa, pb);
        same_bytes(pa, pc);
    }
    sample_compress = 4;
}

// The engine may reuse a tap's buffer as soon as the emit returns, whether the
// writer thread keeps the values (full taps) or only computes their summary
// from them later (small fingerprint-only taps): every tap here is emitted
// from one buffer overwritten right after, so a queued pointer to it would
// give the next tap's (or the garbage's) fingerprint.
Test(taps, a_reused_buffer_gives_each_tap_its_own_fingerprint) {
    enum { N = 3000, TAPS = 6 };
    static const size_t sizes[] = {1, 100, N};
    for (int mode = 0; mode < 2; mode++) {
        const char *path = tmp_path(mode ? "reuse-full.h5" : "reuse-fp.h5");
        td_err err = {{0}};
        td_tap_options o = td_tap_options_default();
        o.mode = mode ? TD_TAP_FULL : TD_TAP_FINGERPRINT;
        td_tap_sink *s = NULL;
        cr_assert_eq(td_tap_sink_open(&s, path, &o, &err), TD_OK, "%s", err.msg);
        cr_assert(td_taps_threaded(s), "the writer thread runs");
        cr_assert_eq(td_tap_step_begin(s, TD_STEP_PREFILL, 0, 1, &err), TD_OK, "%s", err.msg);
        float *buf = malloc(N * sizeof *buf);
        td_fingerprint want[TAPS];
        for (int t = 0; t < TAPS; t++) {
            const size_t n = sizes[t % 3];
            for (size_t i = 0; i < n; i++) buf[i] = (float)(t + 1) * 0.25f + (float)i;
            td_fingerprint_compute(&want[t], TD_DT_F32, buf, n);
            char name[16];
            snprintf(name, sizeof name, "t%d", t);
            const int64_t shape[1] = {(int64_t)n};
            td_tap_emit(s, -1, name, TD_DT_F32, buf, 1, shape);
            for (size_t i = 0; i < N; i++) buf[i] = NAN;
        }
        free(buf);
        cr_assert_eq(td_tap_step_end(s, &err), TD_OK, "%s", err.msg);
        cr_assert_eq(td_tap_sink_close(s, &err), TD_OK, "%s", err.msg);
        td_tapfile *f = NULL;
        cr_assert_eq(td_tapfile_open(&f, path, &err), TD_OK, "%s", err.msg);
        td_tap_info *taps = NULL;
        int64_t n = 0;
        cr_assert_eq(td_tapfile_step_taps(f, 0, &taps, &n, &err), TD_OK, "%s", err.msg);
        cr_assert_eq(n, TAPS);
        for (int t = 0; t < TAPS; t++) {
            cr_expect_eq(taps[t].fp.n_nonfinite, 0, "%s: %llu non-finite values", taps[t].name,
                         (unsigned long long)taps[t].fp.n_nonfinite);
            check_fp(taps[t].name, &taps[t].fp, &want[t]);
        }
        free(taps);
        td_tapfile_close(f);
    }
}

// A caller with an HDF5 file of its own open (golden reads one tap file while
// it writes another) gets no writer thread: HDF5 is not thread-safe.
Test(taps, no_writer_thread_beside_an_open_hdf5_file) {
    const char *path = tmp_path("reader.h5"), *out = tmp_path("writer.h5");
    write_sample(path, TD_TAP_FINGERPRINT, NULL);
    td_err err = {{0}};
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    cr_assert_geq(f, 0);
    td_tap_sink *s = NULL;
    cr_assert_eq(td_tap_sink_open(&s, out, NULL, &err), TD_OK, "%s", err.msg);
    cr_expect_eq(td_taps_threaded(s), 0);
    cr_expect_eq(td_tap_sink_close(s, &err), TD_OK, "%s", err.msg);
    H5Fclose(f);
    cr_assert_eq(td_tap_sink_open(&s, out, NULL, &err), TD_OK, "%s", err.msg);
    cr_expect_eq(td_taps_threaded(s), 1, "no other file open: the thread runs");
    cr_expect_eq(td_tap_sink_close(s, &err), TD_OK, "%s", err.msg);
}

/* The queue holds at most TD_TAPS_QUEUE_BYTES (a tap larger than that alone),
 * and what it held is written: every value reads back. */
#define BIG_N 100000 /* 400 KB of f32 per tap */
Test(taps, writer_queue_is_bounded) {
    const char *path = tmp_path("bounded.h5");
    const size_t cap = 1000000;
    setenv("TD_TAPS_QUEUE_BYTES", "1000000", 1);
    static float x[5 * BIG_N];
    td_tap_options o = td_tap_options_default();
    o.compress = 0;
    td_err err = {{0}};
    td_tap_sink *s = NULL;
    cr_assert_eq(td_tap_sink_open(&s, path, &o, &err), TD_OK, "%s", err.msg);
    unsetenv("TD_TAPS_QUEUE_BYTES");
    cr_assert_eq(td_taps_threaded(s), 1);
    const int64_t shape[1] = {BIG_N}, big[1] = {5 * BIG_N};
    for (int step = 0; step < 3; step++) {
        cr_assert_eq(td_tap_step_begin(s, step ? TD_STEP_DECODE : TD_STEP_PREFILL, step, 1, &err), TD_OK, "%s",
                     err.msg);
        for (int t = 0; t < 12; t++) {
            for (int i = 0; i < BIG_N; i++) x[i] = (float)(step * 1000 + t) + (float)i * 0.25f;
            td_tap_emit(s, t, "ffn_out", TD_DT_F32, x, 1, shape); // the engine reuses its buffer at once
        }
        if (step == 0) // (the peak is over the run: the 2 MB tap below raises it)
            cr_expect(td_taps_queue_peak(s) <= cap && td_taps_queue_peak(s) > BIG_N * sizeof(float),
                      "queue peak %zu bytes, cap %zu", td_taps_queue_peak(s), cap);
        for (int i = 0; i < 5 * BIG_N; i++) x[i] = (float)(i % 1000) - (float)step;
        td_tap_emit(s, -1, "out.big", TD_DT_F32, x, 1, big); // 2 MB, over the cap: goes alone
        cr_assert_eq(td_tap_step_end(s, &err), TD_OK, "%s", err.msg);
    }
    const size_t peak = td_taps_queue_peak(s);
    cr_expect(peak > 5 * BIG_N * sizeof(float) && peak < 5 * BIG_N * sizeof(float) + 4096,
              "queue peak %zu: the 2 MB tap alone", peak);
    cr_assert_eq(td_tap_sink_close(s, &err), TD_OK, "%s", err.msg);

    td_tapfile *f = NULL;
    cr_assert_eq(td_tapfile_open(&f, path, &err), TD_OK, "%s", err.msg);
    cr_assert_eq(td_tapfile_n_steps(f), 3);
    static double v[5 * BIG_N];
    for (int step = 0; step < 3; step++) {
        for (int t = 0; t < 12; t += 11) {
            char name[32];
            snprintf(name, sizeof name, "blk.%d.ffn_out", t);
            cr_assert_eq(td_tapfile_read_f64(f, step, name, v, BIG_N, &err), TD_OK, "%s", err.msg);
            int bad = 0;
            for (int i = 0; i < BIG_N; i++) bad += v[i] != (double)((float)(step * 1000 + t) + (float)i * 0.25f);
            cr_expect_eq(bad, 0, "step %d %s: %d values differ", step, name, bad);
        }
        cr_assert_eq(td_tapfile_read_f64(f, step, "out.big", v, 5 * BIG_N, &err), TD_OK, "%s", err.msg);
        int bad = 0;
        for (int i = 0; i < 5 * BIG_N; i++) bad += v[i] != (double)((float)(i % 1000) - (float)step);
        cr_expect_eq(bad, 0, "step %d out.big: %d values differ", step, bad);
    }
    td_tapfile_close(f);
}

/* A full disk met by the writer thread: the same status and message as
 * without it, reported by a later call, and the same committed steps. */
static int disk_full_run(const char *path, int threaded, td_err *first, int64_t *steps) {
    static float x[BIG_N];
    for (int i = 0; i < BIG_N; i++) x[i] = (float)i;
    if (!threaded) setenv("TAPDIFF_TAP_THREAD", "0", 1);
    setenv("TD_TAPS_FAIL_AT_BYTES", "4000000", 1);
    td_tap_options o = td_tap_options_default();
    o.compress = 0;
    td_err err = {{0}};
    td_tap_sink *s = NULL;
    cr_assert_eq(td_tap_sink_open(&s, path, &o, &err), TD_OK, "%s", err.msg);
    unsetenv("TAPDIFF_TAP_THREAD");
    cr_assert_eq(td_taps_threaded(s), threaded);
    const int64_t shape[1] = {BIG_N};
    int rc = TD_OK;
    for (int step = 0; step < 20 && !rc; step++) {
        if ((rc = td_tap_step_begin(s, step ? TD_STEP_DECODE : TD_STEP_PREFILL, step, 1, &err))) break;
        td_tap_emit(s, 0, "attn_out", TD_DT_F32, x, 1, shape);
        rc = td_tap_step_end(s, &err);
    }
    td_err cerr = {{0}};
    const int crc = td_tap_sink_close(s, &cerr);
    unsetenv("TD_TAPS_FAIL_AT_BYTES");
    cr_expect_eq(crc, rc, "close returns the sticky error");
    cr_expect_str_eq(cerr.msg, err.msg);
    *first = err;
    td_tapfile *f = NULL;
    cr_assert_eq(td_tapfile_open(&f, path, &err), TD_OK, "%s", err.msg);
    *steps = td_tapfile_n_steps(f);
    td_tapfile_close(f);
    return rc;
}

Test(taps, writer_thread_reports_a_full_disk_as_the_inline_writer) {
    const char *path = tmp_path("full.h5");
    td_err a = {{0}}, b = {{0}};
    int64_t na = 0, nb = 0;
    const int ra = disk_full_run(path, 0, &a, &na), rb = disk_full_run(path, 1, &b, &nb);
    cr_expect_eq(ra, TD_EOUTPUT, "%s", a.msg);
    cr_expect_eq(rb, ra);
    cr_expect(strstr(a.msg, "No space left on device") != NULL, "%s", a.msg);
    cr_expect_str_eq(b.msg, a.msg);
    cr_expect(na >= 2 && nb == na, "committed steps: %lld inline, %lld with the thread", (long long)na,
              (long long)nb);
}

/* A fork while the writer thread lives could deadlock the child on a lock
 * the thread held: tapdiff's debug builds abort instead. */
Test(taps, fork_while_a_writer_lives_aborts_in_debug_builds) {
#ifndef TD_TAP_FORK_CHECK
    cr_skip_test("built without debug (TD_TAP_FORK_CHECK): no check to test");
#else
    const char *path = tmp_path("forked.h5");
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        td_err err = {{0}};
        td_tap_sink *s = NULL;
        if (td_tap_sink_open(&s, path, NULL, &err) || !td_taps_threaded(s)) _exit(2);
        pid_t g = fork(); // must not return
        if (g == 0) _exit(0);
        _exit(3);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    cr_expect(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT, "status %d: expected SIGABRT", status);
    // with the sink closed, fork is fine
    td_err err = {{0}};
    td_tap_sink *s = NULL;
    cr_assert_eq(td_tap_sink_open(&s, path, NULL, &err), TD_OK, "%s", err.msg);
    cr_assert_eq(td_tap_sink_close(s, &err), TD_OK, "%s", err.msg);
    pid = fork();
    if (pid == 0) _exit(0);
    waitpid(pid, &status, 0);
    cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 0);
#endif
}
