/* tapdiff arithmetic profiles (profile.h): the rules as data, and the exact
 * rounding formulas the reference applies at their points. */
#include "profile.h"

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "types.h"

/* ===================================================================== */
/* Activation formats                                                     */
/* ===================================================================== */

int td_act_format(int weight_type, td_act_fmt *out) {
    // quants.md §8: the "vec-dot type" of each weight type on llama.cpp's CPU
    switch (weight_type) {
    case TD_TYPE_F32: *out = TD_ACT_F32; return 0;
    case TD_TYPE_F16: *out = TD_ACT_F16; return 0;
    case TD_TYPE_BF16: *out = TD_ACT_BF16; return 0;
    case TD_TYPE_Q4_0:
    case TD_TYPE_Q5_0:
    case TD_TYPE_Q8_0:
    case TD_TYPE_IQ4_NL:
    case TD_TYPE_MXFP4:
    case TD_TYPE_NVFP4:
    case TD_TYPE_Q1_0:
    case TD_TYPE_Q2_0: *out = TD_ACT_Q8_0; return 0;
    case TD_TYPE_Q4_1:
    case TD_TYPE_Q5_1: *out = TD_ACT_Q8_1; return 0;
    case TD_TYPE_Q2_K:
    case TD_TYPE_Q3_K:
    case TD_TYPE_Q4_K:
    case TD_TYPE_Q5_K:
    case TD_TYPE_Q6_K:
    case TD_TYPE_IQ2_XXS:
    case TD_TYPE_IQ2_XS:
    case TD_TYPE_IQ2_S:
    case TD_TYPE_IQ3_XXS:
    case TD_TYPE_IQ3_S:
    case TD_TYPE_IQ1_S:
    case TD_TYPE_IQ1_M:
    case TD_TYPE_IQ4_XS:
    case TD_TYPE_TQ1_0:
    case TD_TYPE_TQ2_0: *out = TD_ACT_Q8_K; return 0;
    default: return -1;
    }
}

int64_t td_act_block(td_act_fmt fmt) {
    switch (fmt) {
    case TD_ACT_Q8_0:
    case TD_ACT_Q8_1: return 32;
    case TD_ACT_Q8_K: return 256;
    default: return 1;
    }
}

/* Rounding ties of the f64 oracle (profile.h td_act_ties_begin): while a
 * session is open, every code whose scaled value lies within tau of a
 * half-integer is logged, and the listed ones take the other side. One
 * session at a time per process; the f64 rounding runs on the calling thread
 * only (the reference quantizes before it hands rows to its workers). */
typedef struct ties_state {
    int on;
    double tau;
    int64_t step, call;
    const td_act_tie *flips;
    int n_flips;
    td_act_tie *log;
    int n_log, cap_log;
    int64_t n_dropped; /* near-ties past log_max */
    int log_max;       /* TD_ACT_TIES_LOG_MAX, or less under TD_TIES_LOG_MAX (tests) */
    char site[48];          /* td_act_ties_site: the weight (or attention part) rows feed next */
    int n_named; /* log entries already named after the tap that followed them */
    char src[40];           /* td_act_ties_source: the tap the call src_call reads */
    int64_t src_off, src_call;
    double src_scale;       /* td_act_ties_source_scale (0: none) */
    double src_near;        /* td_act_ties_source_near (0: none) */
    double call_abs;        /* the current f16 call's absolute window (0: none) */
    struct {
        const void *data;
        char name[40];
    } taps[64];             /* the buffers this forward's latest taps were emitted from (a ring) */
    int n_taps;
} ties_state;
static ties_state g_ties;
static pthread_mutex_t g_ties_lock = PTHREAD_MUTEX_INITIALIZER; // the log, when workers round (td_act_tie_f16_*)

void td_act_ties_begin(const td_act_tie *flips, int n_flips, double tau) {
    free(g_ties.log);
    g_ties = (ties_state){.on = 1, .tau = tau, .step = -1, .call = -1, .flips = flips, .n_flips = n_flips, .src_call = -2};
    const char *e = getenv("TD_TIES_LOG_MAX");
    const long cap = e ? atol(e) : 0;
    g_ties.log_max = cap >= 1 && cap < TD_ACT_TIES_LOG_MAX ? (int)cap : TD_ACT_TIES_LOG_MAX;
}

void td_act_ties_forward(void) {
    if (!g_ties.on) return;
    g_ties.step++;
    g_ties.call = -1;
    g_ties.src_call = -2;
    g_ties.n_taps = 0; // buffers are reused: a tap names its buffer within one forward only
}

static void tap_full_name(char *full, size_t n, int layer, const char *name) {
    if (layer >= 0) snprintf(full, n, "blk.%d.%s", layer, name);
    else snprintf(full, n, "%s", name);
}

void td_act_ties_source(int layer, const char *name, int64_t offset) {
    if (!g_ties.on) return;
    g_ties.src[0] = '\0';
    if (name) tap_full_name(g_ties.src, sizeof g_ties.src, layer, name);
    g_ties.src_off = offset;
    g_ties.src_call = g_ties.call + 1; // the next rounding call
    g_ties.src_scale = 0;
    g_ties.src_near = 0;
}

void td_act_ties_source_near(double rel) {
    if (g_ties.on) g_ties.src_near = rel;
}

/* The absolute window of the f16 rounding call just counted, over x (n). */
static void ties_call_window_f64(const double *x, int64_t n) {
    g_ties.call_abs = 0;
    if (g_ties.call != g_ties.src_call || !(g_ties.src_near > 0)) return;
    double a = 0;
    for (int64_t i = 0; i < n; i++) a = fmax(a, fabs(x[i]));
    g_ties.call_abs = g_ties.src_near * a;
}

static void ties_call_window_f32(const float *x, int64_t n) {
    g_ties.call_abs = 0;
    if (g_ties.call != g_ties.src_call || !(g_ties.src_near > 0)) return;
    double a = 0;
    for (int64_t i = 0; i < n; i++) a = fmax(a, fabs((double)x[i]));
    g_ties.call_abs = g_ties.src_near * a;
}

double td_act_ties_rope_near(const td_profile *p, double theta_max) {
    if (!(p->rules & TD_RULE_ROPE_TRIG) || p->rope_trig_u <= 0) return TD_ACT_TIES_ROW_NEAR;
    const double d = ldexp((double)p->rope_trig_u, -24) * (1.0 + fabs(theta_max));
    return TD_ACT_TIES_ROW_NEAR + sqrt(2.0) * d;
}

void td_act_ties_source_scale(double scale) {
    if (g_ties.on) g_ties.src_scale = scale;
}

void td_act_ties_tap_data(int layer, const char *name, const void *data) {
    if (!g_ties.on) return;
    const int i = g_ties.n_taps++ % 64;
    g_ties.taps[i].data = data;
    tap_full_name(g_ties.taps[i].name, sizeof g_ties.taps[i].name, layer, name);
}

void td_act_ties_source_of(const void *data, int64_t offset) {
    if (!g_ties.on) return;
    const int n = g_ties.n_taps < 64 ? g_ties.n_taps : 64;
    for (int k = 1; k <= n; k++) { // the latest tap of that buffer: it holds what the buffer holds now
        const int i = (g_ties.n_taps - k) % 64;
        if (g_ties.taps[i].data == data) {
            td_act_ties_source(-1, g_ties.taps[i].name, offset);
            return;
        }
    }
    td_act_ties_source(-1, NULL, 0);
}

static int64_t g_ties_dropped; // the last ended session's n_dropped

void td_act_ties_end(td_act_tie **log, int *n) {
    if (log) *log = g_ties.log, *n = g_ties.n_log;
    else free(g_ties.log);
    g_ties_dropped = g_ties.n_dropped;
    if (g_ties.n_dropped)
        fprintf(stderr,
                "tapdiff: ties: the oracle met %" PRId64 " more near-ties than its log keeps (the first %d): "
                "their sides cannot be taken\n",
                g_ties.n_dropped, g_ties.log_max);
    g_ties = (ties_state){0};
}

int64_t td_act_ties_dropped(void) {
    return g_ties_dropped;
}

void td_act_ties_site(const char *weight) {
    if (g_ties.on) snprintf(g_ties.site, sizeof g_ties.site, "%s", weight ? weight : "");
}

void td_act_ties_site_of(int layer, const char *name) {
    if (g_ties.on) tap_full_name(g_ties.site, sizeof g_ties.site, layer, name);
}

void td_act_ties_tap(int layer, const char *name) {
    if (!g_ties.on) return;
    char full[40];
    tap_full_name(full, sizeof full, layer, name);
    for (; g_ties.n_named < g_ties.n_log; g_ties.n_named++) memcpy(g_ties.log[g_ties.n_named].tap, full, sizeof full);
}

static void ties_call(void) {
    if (g_ties.on) g_ties.call++;
}

/* Logs v (a scaled value whose tie is at v - floor(v) = 0.5) when it lies
 * within tau of the tie, with `alt`, the result on the tie's other side;
 * returns 1 with *pick when (step, call, elem) is pinned. */
static int tie_pinned_kind(int64_t call, double v, int64_t elem, double alt, double *pick, int f16, double x,
                           double wide) {
    if (!g_ties.on || fabs(v - floor(v) - 0.5) >= (f16 ? fmax(TD_ACT_TIES_F16_TAU, wide) : g_ties.tau)) return 0;
    td_act_tie me = {.step = g_ties.step, .call = call, .elem = elem, .v = v, .pick = alt, .f16 = f16, .x = x};
    if (call == g_ties.src_call && g_ties.src[0] && elem + g_ties.src_off >= 0) {
        memcpy(me.src, g_ties.src, sizeof me.src);
        me.src_elem = elem + g_ties.src_off;
        me.src_scale = g_ties.src_scale;
    }
    int pinned = 0;
    for (int i = 0; i < g_ties.n_flips && !pinned; i++) {
        const td_act_tie *t = &g_ties.flips[i];
        if ((pinned = t->step == me.step && t->call == me.call && t->elem == me.elem && t->f16 == f16)) *pick = t->pick;
    }
    pthread_mutex_lock(&g_ties_lock);
    if (g_ties.n_log >= g_ties.log_max) {
        g_ties.n_dropped++;
        pthread_mutex_unlock(&g_ties_lock);
        return pinned;
    }
    if (g_ties.n_log == g_ties.cap_log) {
        g_ties.cap_log = g_ties.cap_log ? 2 * g_ties.cap_log : 64;
        g_ties.log = td_xrealloc(g_ties.log, (size_t)g_ties.cap_log * sizeof *g_ties.log);
    }
    g_ties.log[g_ties.n_log] = me;
    memcpy(g_ties.log[g_ties.n_log++].site, g_ties.site, sizeof me.site);
    pthread_mutex_unlock(&g_ties_lock);
    return pinned;
}

static int tie_pinned(double v, int64_t elem, double alt, double *pick) {
    return tie_pinned_kind(g_ties.call, v, elem, alt, pick, 0, v, 0);
}

/* x rounded to f16 (through its f32 value y, what a device holds), or its
 * pin; v = x's distance above the lower in magnitude of its two f16
 * neighbours, in f16 ulps (0.5: the midpoint); logged within
 * TD_ACT_TIES_F16_TAU of the midpoint, or within abs_w of it in value. */
static double tie_f16_at(int64_t call, double x, float y, int64_t elem, double abs_w) {
    const uint16_t h = td_f32_to_f16(y);
    const double q = td_f16_to_f32(h), ax = fabs(x), aq = fabs(q);
    if (!isfinite(q) || !isfinite(x) || ax == aq) return q;
    // sign-magnitude bits: one step down the bits is one step toward zero
    const uint16_t h2 = ax < aq ? (uint16_t)(h - 1) : (uint16_t)(h + 1);
    if ((h2 & 0x7fff) >= 0x7c00) return q; // past the largest finite f16
    const double q2 = td_f16_to_f32(h2), lo = fmin(aq, fabs(q2)), ulp = fabs(q2 - q);
    double pick = q;
    tie_pinned_kind(call, (ax - lo) / ulp, elem, q2, &pick, 1, x, abs_w / ulp);
    return pick;
}

static double tie_f16(double x, float y, int64_t elem) {
    return tie_f16_at(g_ties.call, x, y, elem, g_ties.call_abs);
}

int64_t td_act_ties_reserve(void) {
    if (!g_ties.on) return -1;
    return ++g_ties.call;
}

float td_act_tie_f16_f32(int64_t call, int64_t elem, float x) {
    if (call < 0 || !g_ties.on) return td_f16_round_trip_f32(x);
    return (float)tie_f16_at(call, x, x, elem, 0);
}

double td_act_tie_f16_f64(int64_t call, int64_t elem, double x) {
    if (call < 0 || !g_ties.on) return td_f16_round_trip_f64(x);
    return tie_f16_at(call, x, (float)x, elem, 0);
}

/* The code of scaled value v rounded as `q` (ties to even), or its pin. */
static double tie_code(double v, double q, int64_t elem) {
    if (!g_ties.on) return q;
    double pick = q;
    tie_pinned(v, elem, q == floor(v) ? q + 1 : q - 1, &pick);
    return pick;
}

/* The f16 scale of a Q8_0 block (elem = -1 - block index), or its pin;
 * v = y's distance above the lower of its two f16 neighbours, in f16 ulps
 * (0.5: the midpoint). */
static double tie_scale_f16(float y, int64_t elem) {
    const uint16_t h = td_f32_to_f16(y);
    const double q = td_f16_to_f32(h);
    if (!g_ties.on || !(y > 0.0f) || !isfinite(q)) return q;
    const uint16_t h2 = (double)y < q ? (uint16_t)(h - 1) : (uint16_t)(h + 1); // positive: bits are monotonic
    const double q2 = td_f16_to_f32(h2), lo = fmin(q, q2), ulp = fabs(q2 - q);
    double pick = q;
    tie_pinned(((double)y - lo) / ulp, elem, q2, &pick);
    return pick;
}

/* One Q8_0 (or Q8_1: the same d and q) block of 32. The scale is rounded to
 * f16 for storage but the codes are computed with 127/a, not with the
 * stored scale, so a value's code can differ from rint(x / f16(d)). */
static void round_q8_0_block(float *out, const float *x, int64_t elem0) {
    float a = 0;
    for (int j = 0; j < 32; j++) {
        const float ax = fabsf(x[j]);
        if (ax > a) a = ax;
    }
    const float d = (float)tie_scale_f16(a / 127.0f, -1 - elem0 / 32);
    const float id = a != 0.0f ? 127.0f / a : 0.0f;
    for (int j = 0; j < 32; j++) {
        const float v = x[j] * id;
        float q = (float)tie_code(v, rintf(v), elem0 + j); // rintf: ties to even
        if (q > 127) q = 127;
        if (q < -127) q = -127;
        out[j] = d * q; // exact: 11-bit scale times an 8-bit code
    }
}

/* One Q8_K block of 256: the scale carries the sign of the largest-magnitude
 * value, so that value maps to -127 (never +128). */
static void round_q8_k_block(float *out, const float *x, int64_t elem0) {
    float a = 0, m = 0;
    for (int j = 0; j < 256; j++) {
        const float ax = fabsf(x[j]);
        if (ax > a) a = ax, m = x[j]; // strict: the first of equal magnitudes
    }
    if (a == 0.0f) {
        for (int j = 0; j < 256; j++) out[j] = 0;
        return;
    }
    const float s = -127.0f / m;
    const float d = 1.0f / s;
    for (int j = 0; j < 256; j++) {
        const float v = s * x[j];
        float q = (float)tie_code(v, rintf(v), elem0 + j);
        if (q > 127) q = 127;
        out[j] = d * q;
    }
}

void td_f16_round_f32(float *out, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = td_f16_round_trip_f32(x[i]);
}

void td_f16_round_f64(double *out, const double *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = td_f16_round_trip_f64(x[i]);
}

void td_act_round_f32(float *out, const float *x, int64_t n, td_act_fmt fmt) {
    TD_ASSERT(n % td_act_block(fmt) == 0);
    switch (fmt) {
    case TD_ACT_F32:
        if (out != x) memmove(out, x, (size_t)n * sizeof *out);
        return;
    case TD_ACT_F16:
        if (g_ties.on) {
            ties_call();
            ties_call_window_f32(x, n);
            for (int64_t i = 0; i < n; i++) out[i] = (float)tie_f16(x[i], x[i], i);
            return;
        }
        td_f16_round_f32(out, x, n);
        return;
    case TD_ACT_BF16:
        for (int64_t i = 0; i < n; i++) out[i] = td_bf16_to_f32(td_f32_to_bf16(x[i]));
        return;
    case TD_ACT_Q8_0:
    case TD_ACT_Q8_1:
        ties_call();
        for (int64_t i = 0; i < n; i += 32) round_q8_0_block(out + i, x + i, i);
        return;
    case TD_ACT_Q8_K:
        ties_call();
        for (int64_t i = 0; i < n; i += 256) round_q8_k_block(out + i, x + i, i);
        return;
    }
    TD_ASSERT(0 && "unknown activation format");
}

/* The same blocks in f64 (profile.h: the scale rounded to its storage type). */
static void round_q8_0_block_f64(double *out, const double *x, int64_t elem0) {
    double a = 0;
    for (int j = 0; j < 32; j++) {
        const double ax = fabs(x[j]);
        if (ax > a) a = ax;
    }
    const double d = tie_scale_f16((float)(a / 127.0), -1 - elem0 / 32);
    const double id = a != 0.0 ? 127.0 / a : 0.0;
    for (int j = 0; j < 32; j++) {
        double q = tie_code(x[j] * id, rint(x[j] * id), elem0 + j);
        if (q > 127) q = 127;
        if (q < -127) q = -127;
        out[j] = d * q;
    }
}

static void round_q8_k_block_f64(double *out, const double *x, int64_t elem0) {
    double a = 0, m = 0;
    for (int j = 0; j < 256; j++) {
        const double ax = fabs(x[j]);
        if (ax > a) a = ax, m = x[j];
    }
    if (a == 0.0) {
        for (int j = 0; j < 256; j++) out[j] = 0;
        return;
    }
    const double s = -127.0 / m;
    const double d = (float)(1.0 / s); // the block stores an f32 scale
    for (int j = 0; j < 256; j++) {
        double q = tie_code(s * x[j], rint(s * x[j]), elem0 + j);
        if (q > 127) q = 127;
        out[j] = d * q;
    }
}

void td_act_round_f64(double *out, const double *x, int64_t n, td_act_fmt fmt) {
    TD_ASSERT(n % td_act_block(fmt) == 0);
    switch (fmt) {
    case TD_ACT_F32:
        if (out != x) memmove(out, x, (size_t)n * sizeof *out);
        return;
    case TD_ACT_F16:
        if (g_ties.on) {
            ties_call();
            ties_call_window_f64(x, n);
            for (int64_t i = 0; i < n; i++) out[i] = tie_f16(x[i], (float)x[i], i);
            return;
        }
        td_f16_round_f64(out, x, n);
        return;
    case TD_ACT_BF16:
        for (int64_t i = 0; i < n; i++) out[i] = td_bf16_to_f32(td_f32_to_bf16((float)x[i]));
        return;
    case TD_ACT_Q8_0:
    case TD_ACT_Q8_1:
        ties_call();
        for (int64_t i = 0; i < n; i += 32) round_q8_0_block_f64(out + i, x + i, i);
        return;
    case TD_ACT_Q8_K:
        ties_call();
        for (int64_t i = 0; i < n; i += 256) round_q8_k_block_f64(out + i, x + i, i);
        return;
    }
    TD_ASSERT(0 && "unknown activation format");
}

/* ===================================================================== */
/* Profiles                                                               */
/* ===================================================================== */

static const struct {
    unsigned rule;
    const char *name;
} rule_names[] = {
    {TD_RULE_ACT_Q8, "act-q8"},     {TD_RULE_ACT_Q8_1, "act-q8_1"}, {TD_RULE_ATTN_F16, "attn-f16"},
    {TD_RULE_KV_F16, "kv-f16"},     {TD_RULE_FA_F16, "fa-f16"},     {TD_RULE_MM_F16, "mm-f16"},
    {TD_RULE_ACC_F16, "acc-f16"},   {TD_RULE_FA_ACC_F16, "fa-acc-f16"},
    {TD_RULE_ROPE_F32_MUL, "rope-f32-mul"}, {TD_RULE_ROPE_F32_POW, "rope-f32-pow"},
    {TD_RULE_ROPE_TRIG, "rope-trig"}, {TD_RULE_FA_CPU, "fa-cpu"},
};
#define N_RULES (sizeof rule_names / sizeof rule_names[0])

int td_profile_parse(const char *s, td_profile *out, char *why, size_t n) {
    td_profile p = {.rules = 0, .q8_1_vec_k = -1, .mm_f16_min = -1, .fa_sg = -1, .rope_trig_u = -1};
    if (why && n) why[0] = '\0';
    if (!s || !s[0] || !strcmp(s, TD_PROFILE_NATIVE)) {
        *out = p;
        return 0;
    }
    const char *c = s;
    for (;;) {
        const char *e = strchr(c, '+');
        size_t len = e ? (size_t)(e - c) : strlen(c);
        const char *at = memchr(c, '@', len);
        size_t nlen = at ? (size_t)(at - c) : len;
        unsigned hit = 0;
        for (size_t i = 0; i < N_RULES && !hit; i++)
            if (strlen(rule_names[i].name) == nlen && !strncmp(c, rule_names[i].name, nlen)) hit = rule_names[i].rule;
        if (!hit) {
            if (why) snprintf(why, n, "unknown rule '%.*s' (rules: act-q8, act-q8_1[@K], attn-f16, kv-f16, fa-f16, mm-f16@N, acc-f16, "
                                      "fa-acc-f16@S, fa-cpu, rope-f32-mul, rope-f32-pow, rope-trig@U; joined with '+', or native)", (int)(len > 60 ? 60 : len), c);
            return -1;
        }
        if (p.rules & hit) {
            if (why) snprintf(why, n, "rule '%.*s' given twice", (int)nlen, c);
            return -1;
        }
        if (at) {
            char num[24];
            size_t dl = len - nlen - 1;
            char *end = NULL;
            if ((hit != TD_RULE_ACT_Q8_1 && hit != TD_RULE_MM_F16 && hit != TD_RULE_FA_ACC_F16 && hit != TD_RULE_ROPE_TRIG) ||
                dl == 0 || dl >= sizeof num) {
                if (why)
                    snprintf(why, n, "'%.*s': only act-q8_1@K, mm-f16@N, fa-acc-f16@S and rope-trig@U take a number",
                             (int)len, c);
                return -1;
            }
            memcpy(num, at + 1, dl);
            num[dl] = '\0';
            long long k = strtoll(num, &end, 10);
            if (*end || k < 0 || num[0] < '0' || num[0] > '9') {
                if (why) snprintf(why, n, "'%.*s': @K must be a non-negative integer", (int)len, c);
                return -1;
            }
            if (hit == TD_RULE_FA_ACC_F16 && (k < 1 || k > 32 || (k & (k - 1)))) {
                if (why) snprintf(why, n, "'%.*s': @S is a subgroup size: a power of two from 1 to 32", (int)len, c);
                return -1;
            }
            // beyond 2^20 the bound passes a radian at theta = 16: no rotation left to check
            if (hit == TD_RULE_ROPE_TRIG && (k < 1 || k > (1 << 20))) {
                if (why) snprintf(why, n, "'%.*s': @U is a bound in units of 2^-24 (1 + |theta|): 1 to 1048576", (int)len, c);
                return -1;
            }
            if (hit == TD_RULE_ACT_Q8_1)
                p.q8_1_vec_k = k;
            else if (hit == TD_RULE_ROPE_TRIG)
                p.rope_trig_u = k;
            else if (hit == TD_RULE_MM_F16)
                p.mm_f16_min = k;
            else
                p.fa_sg = k;
        } else if (hit == TD_RULE_FA_ACC_F16) {
            if (why) snprintf(why, n, "fa-acc-f16 needs @S: the device's subgroup size (e.g. fa-acc-f16@8)");
            return -1;
        } else if (hit == TD_RULE_ROPE_TRIG) {
            if (why) snprintf(why, n, "rope-trig needs @U: the device's rotation bound in units of 2^-24 (1 + |theta|) (e.g. rope-trig@4)");
            return -1;
        } else if (hit == TD_RULE_MM_F16) {
            if (why) snprintf(why, n, "mm-f16 needs @N: the step size above which the tiled path runs (e.g. mm-f16@8)");
            return -1;
        }
        p.rules |= hit;
        if (!e) break;
        c = e + 1;
    }
    // act-q8 is the CPU's whole matmul story; q8_1 (quantized weights) and
    // mm-f16 (the rest of the tiled path) are a GPU's and go together
    if ((p.rules & TD_RULE_ACT_Q8) && (p.rules & (TD_RULE_ACT_Q8_1 | TD_RULE_MM_F16))) {
        if (why) snprintf(why, n, "act-q8 (the CPU path) does not combine with act-q8_1 or mm-f16 (a GPU's)");
        return -1;
    }
    // one angle formula per arm: its rope forms the angle one way
    if ((p.rules & TD_RULE_ROPE_F32_MUL) && (p.rules & TD_RULE_ROPE_F32_POW)) {
        if (why) snprintf(why, n, "rope-f32-mul and rope-f32-pow are two ways to form one angle: give one");
        return -1;
    }
    // the shader's arithmetic refines the K/V cast, which it reads
    if ((p.rules & TD_RULE_FA_ACC_F16) && !(p.rules & TD_RULE_FA_F16)) {
        if (why) snprintf(why, n, "fa-acc-f16 refines fa-f16 (flash attention reads K and V in f16): add fa-f16");
        return -1;
    }
    if ((p.rules & TD_RULE_FA_CPU) && !(p.rules & TD_RULE_FA_F16)) {
        if (why) snprintf(why, n, "fa-cpu refines fa-f16 (flash attention reads K and V in f16): add fa-f16");
        return -1;
    }
    *out = p;
    return 0;
}

void td_profile_format(const td_profile *p, char *buf, size_t n) {
    if (!n) return;
    buf[0] = '\0';
    for (size_t i = 0; i < N_RULES; i++) {
        if (!(p->rules & rule_names[i].rule)) continue;
        size_t len = strlen(buf);
        snprintf(buf + len, n - len, "%s%s", len ? "+" : "", rule_names[i].name);
        if (rule_names[i].rule == TD_RULE_ACT_Q8_1 && p->q8_1_vec_k >= 0) {
            len = strlen(buf);
            snprintf(buf + len, n - len, "@%lld", (long long)p->q8_1_vec_k);
        }
        if (rule_names[i].rule == TD_RULE_MM_F16) {
            len = strlen(buf);
            snprintf(buf + len, n - len, "@%lld", (long long)p->mm_f16_min);
        }
        if (rule_names[i].rule == TD_RULE_FA_ACC_F16) {
            len = strlen(buf);
            snprintf(buf + len, n - len, "@%lld", (long long)p->fa_sg);
        }
        if (rule_names[i].rule == TD_RULE_ROPE_TRIG) {
            len = strlen(buf);
            snprintf(buf + len, n - len, "@%lld", (long long)p->rope_trig_u);
        }
    }
    if (!buf[0]) snprintf(buf, n, "%s", TD_PROFILE_NATIVE);
}

int td_profile_matmul_fmt(const td_profile *p, int weight_type, int64_t T, int64_t k, td_act_fmt *out) {
    *out = TD_ACT_F32;
    if (!(p->rules & (TD_RULE_ACT_Q8 | TD_RULE_ACT_Q8_1))) return 0;
    td_act_fmt f;
    if (td_act_format(weight_type, &f)) return -1;
    if (p->rules & TD_RULE_ACT_Q8) {
        *out = f;
        return 0;
    }
    // act-q8_1: quantized weights only (their CPU format is a block format)
    const int quant = f == TD_ACT_Q8_0 || f == TD_ACT_Q8_1 || f == TD_ACT_Q8_K;
    if (quant && (T > 1 || (p->q8_1_vec_k >= 0 && k > p->q8_1_vec_k))) *out = TD_ACT_Q8_1;
    return 0;
}

int td_profile_attn_qkv_f16(const td_profile *p, int64_t T) {
    return (p->rules & TD_RULE_ATTN_F16) && T > 1;
}

int td_profile_mm_f16(const td_profile *p, int64_t T) {
    return (p->rules & TD_RULE_MM_F16) && T > p->mm_f16_min;
}

int td_profile_kv_store_f16(const td_profile *p) {
    return (p->rules & (TD_RULE_KV_F16 | TD_RULE_FA_F16)) != 0;
}

int td_profile_idx_store_f16(const td_profile *p) {
    return (p->rules & TD_RULE_KV_F16) != 0;
}

/* QSA selections taken from an arm (profile.h td_qsa_pins_begin): a list a
 * forward searches per sparse query; a few hundred at most. */
static struct {
    const td_qsa_pin *pins;
    int n;
} g_qsa;

void td_qsa_pins_begin(const td_qsa_pin *pins, int n) {
    g_qsa.pins = pins;
    g_qsa.n = pins ? n : 0;
}

void td_qsa_pins_end(void) {
    g_qsa.pins = NULL;
    g_qsa.n = 0;
}

const td_qsa_pin *td_qsa_pin_find(int layer, int64_t pos) {
    for (int i = 0; i < g_qsa.n; i++)
        if (g_qsa.pins[i].layer == layer && g_qsa.pins[i].pos == pos) return &g_qsa.pins[i];
    return NULL;
}

static int64_t pad_up(int64_t x, int64_t a) {
    return (x + a - 1) / a * a;
}

/* The cache cells a flash-attention node sees: llama.cpp pads the context
 * to 256 cells and the used cells to 256 (at least 256): get_n_kv. */
static int64_t fa_kv_view(int64_t n_kv, int64_t n_ctx) {
    const int64_t kv = pad_up(n_kv, 256), size = pad_up(n_ctx > n_kv ? n_ctx : n_kv, 256);
    return kv < size ? kv : size;
}

/* ggml-vulkan's get_fa_tuning_params_scalar for a vendor other than Intel
 * and AMD: row split, workgroup size, block rows and columns, D split. */
static void fa_tuning(int64_t S, int64_t D, int64_t n_rows, int reduce_rows, int64_t *rs, int64_t *wg, int64_t *br,
                      int64_t *bc, int64_t *ds) {
    *rs = (n_rows < 4 || D <= 64) ? 1 : 4;
    *wg = (S > 32 && (n_rows < 4 || D < (*rs == 1 ? 128 : 64))) ? 2 * S : 4 * S;
    if (n_rows == 1) {
        *br = 1, *bc = 64;
    } else {
        if (*rs == 1)
            *br = n_rows == 2 ? 2 : (n_rows <= 4 || reduce_rows) ? 4 : 8;
        else
            *br = n_rows <= 4 ? 4 : (n_rows <= 8 || reduce_rows) ? 8 : 16;
        *bc = (D & 8) ? 64 : 32;
    }
    // its shared-memory check can halve block rows only when rows are not
    // reduced already; at lavapipe's limit no head size up to 256 needs it
    const int64_t lsb = D & -D;
    *ds = S < 8 ? S : 8;
    if (lsb / 4 < *ds) *ds = lsb / 4;
}

int td_profile_fa_geom(const td_profile *p, int64_t D, int64_t H, int64_t Hkv, int64_t T, int64_t n_kv,
                       int64_t n_ctx, td_fa_geom *g) {
    // ggml-vulkan leaves head sizes that are not a multiple of 8 to the CPU
    if (!(p->rules & TD_RULE_FA_ACC_F16) || p->fa_sg < 1 || p->fa_sg > 32 || D < 8 || D % 8 || Hkv < 1 || H % Hkv ||
        T < 1 || n_kv < T)
        return -1;
    const int64_t S = p->fa_sg;
    const int64_t kv = fa_kv_view(n_kv, n_ctx);
    const int reduce_rows = (D & 8) || kv < 1024;
    int64_t rs, wg, br, bc, ds;
    // grouped-query steps of up to 8 tokens put a KV head's query heads in one workgroup
    fa_tuning(S, D, 512, reduce_rows, &rs, &wg, &br, &bc, &ds);
    const int64_t ratio = H / Hkv, max_gqa = br < 32 ? br : 32;
    const int gqa = T <= 8 && ratio > 1 && ratio <= max_gqa;
    const int64_t N = gqa ? ratio : T;
    fa_tuning(S, D, N, reduce_rows, &rs, &wg, &br, &bc, &ds);
    if (ds < 1 || (rs > 1 && wg / rs != S)) return -1;
    // split-k: lavapipe reports no shader core count, ggml-vulkan assumes 16
    // and wants twice as many workgroups
    const int64_t want = 2 * 16, wy = gqa ? H / ratio : H;
    int64_t split_k = 1;
    if (gqa && T <= br)
        split_k = want / (T * wy);
    else if (!gqa && (N + br - 1) / br * wy < want)
        split_k = want / ((N + br - 1) / br * wy);
    int64_t split_kv = kv;
    if (split_k > 1) {
        split_kv = pad_up(kv / split_k > 1 ? kv / split_k : 1, bc);
        split_k = (kv + split_kv - 1) / split_kv;
    }
    if (split_k < 1) split_k = 1, split_kv = kv;
    g->kv = kv;
    g->bc = bc;
    g->cols = wg / ds / rs;
    g->d_split = ds;
    g->group = S / ds < g->cols ? S / ds : g->cols;
    g->split_kv = split_kv;
    g->split_k = split_k;
    g->sg = S;
    if (g->group < 1 || g->cols % g->group || bc % g->cols) return -1;
    return 0;
}

td_fa_cpu_path td_profile_fa_cpu(const td_profile *p, int64_t D, int64_t H, int64_t Hkv, int64_t T, int64_t n_kv,
                                 int64_t n_ctx) {
    td_fa_geom g;
    if (!(p->rules & TD_RULE_FA_CPU) || !td_profile_fa_geom(p, D, H, Hkv, T, n_kv, n_ctx, &g)) return TD_FA_CPU_NONE;
    // ggml_compute_forward_flash_attn_ext_f16: a one-token step over 512
    // cells or more splits the cells among the threads
    if (T == 1 && fa_kv_view(n_kv, n_ctx) >= 512) return TD_FA_CPU_SPLIT_KV;
    // tiles of GGML_FA_TILE_Q = 64 query rows (rows of one head), when the
    // head size fills the AVX2 build's 8-lane f32 vectors
    if (T >= 64 && D % 8 == 0) return TD_FA_CPU_TILED;
    return TD_FA_CPU_ONE_CHUNK;
}

td_rope_angle td_profile_rope_angle(const td_profile *p) {
    if (p->rules & TD_RULE_ROPE_F32_MUL) return TD_ROPE_ANGLE_F32_MUL;
    if (p->rules & TD_RULE_ROPE_F32_POW) return TD_ROPE_ANGLE_F32_POW;
    return TD_ROPE_ANGLE_EXACT;
}

double td_rope_trig_offset_u(int64_t u, int64_t pos, int64_t i, double theta) {
    if (u <= 0) return 0.0;
    // splitmix64's finalizer: a sign per (pos, pair) that no pattern of the
    // rotation (pairs in order, positions in order) lines up with
    uint64_t z = (uint64_t)pos * 0x9E3779B97F4A7C15ull + (uint64_t)i + 0x632BE59BD9B4E019ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    // the bound at full size: a tap of one token has few pairs, and the
    // largest angles carry most of its norm, so a draw that could land near
    // 0 there would leave the budget to chance (a uniform draw in [-b, b]
    // measured: worst r 0.55 on qwen3moe-ties at 40 + 16 steps; 0.29 and
    // 0.38 with this, for two choices of the sign's bit)
    const double b = ldexp((double)u, -24) * (1.0 + fabs(theta));
    return (z >> 63) ? b : -b;
}

float td_rope_angle_f32(td_rope_angle form, int64_t pos, int64_t i, int64_t R, double base) {
    // both backends take theta_scale from the host's powf in f32
    const float ts = powf((float)base, -2.0f / (float)R);
    if (form == TD_ROPE_ANGLE_F32_POW) return (float)pos * powf(ts, (float)i);
    // the cache walks the pairs in order, one rounded product per pair: the
    // angle of pair i carries i roundings, which is the point of the rule
    float theta = (float)pos;
    for (int64_t k = 0; k < i; k++) theta *= ts;
    return theta;
}
