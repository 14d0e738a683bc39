/* Test helpers for harness/tests: write small tap files by hand, make
 * "model-like" synthetic arms (a reference in f64 and honest f32 arms whose
 * error grows with depth), and copy a tap file tap by tap through the writer
 * and the reader with an optional perturbation, as a user would to plant a
 * bug. Header-only (static functions) so each test executable stays one file. */
#ifndef TD_TESTS_TAPGEN_H
#define TD_TESTS_TAPGEN_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tap.h"
#include "tapfile.h"

/* ----------------------------------------------------- tiny writer helpers */

static inline td_tap_sink *tg_open(const char *path, const char *backend, const char *precision, const char *sha) {
    td_tap_sink *s = NULL;
    td_err e;
    td_tap_options o = td_tap_options_default();
    if (td_tap_sink_open(&s, path, &o, &e)) {
        fprintf(stderr, "tg_open %s: %s\n", path, e.msg);
        abort();
    }
    if (backend) td_tap_sink_attr_str(s, "backend", backend);
    if (precision) td_tap_sink_attr_str(s, "precision", precision);
    if (sha) td_tap_sink_attr_str(s, "model_sha256", sha);
    return s;
}

static inline void tg_step(td_tap_sink *s, td_step_kind k, int64_t pos0, int64_t n) {
    td_err e;
    if (td_tap_step_begin(s, k, pos0, n, &e)) {
        fprintf(stderr, "tg_step: %s\n", e.msg);
        abort();
    }
}

static inline void tg_end(td_tap_sink *s) {
    td_err e;
    if (td_tap_step_end(s, &e)) {
        fprintf(stderr, "tg_end: %s\n", e.msg);
        abort();
    }
}

static inline void tg_close(td_tap_sink *s) {
    td_err e;
    if (td_tap_sink_close(s, &e)) {
        fprintf(stderr, "tg_close: %s\n", e.msg);
        abort();
    }
}

/* Emits doubles as dtype dt (f64 or f32) or integers (i32). */
static inline void tg_emit(td_tap_sink *s, const char *name, td_dtype dt, const double *v, int ndim,
                           const int64_t *shape) {
    uint64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= (uint64_t)shape[i];
    if (dt == TD_DT_F64) {
        td_tap_emit(s, -1, name, dt, v, ndim, shape);
        return;
    }
    void *buf = malloc(n * 8 + 8);
    for (uint64_t i = 0; i < n; i++) {
        if (dt == TD_DT_F32) ((float *)buf)[i] = (float)v[i];
        if (dt == TD_DT_I32) ((int32_t *)buf)[i] = (int32_t)v[i];
        if (dt == TD_DT_I64) ((int64_t *)buf)[i] = (int64_t)v[i];
    }
    td_tap_emit(s, -1, name, dt, buf, ndim, shape);
    free(buf);
}

static inline void tg_emit2(td_tap_sink *s, const char *name, td_dtype dt, const double *v, int64_t r, int64_t c) {
    int64_t sh[2] = {r, c};
    tg_emit(s, name, dt, v, 2, sh);
}

/* --------------------------------------------------- deterministic noise */

static inline uint64_t tg_hash(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}
/* Uniform in [-1, 1) from (a, b, c). */
static inline double tg_unif(uint64_t a, uint64_t b, uint64_t c) {
    uint64_t h = tg_hash(a * 0x9e3779b97f4a7c15ULL ^ tg_hash(b * 0xbf58476d1ce4e5b9ULL ^ tg_hash(c + 1)));
    return (double)(h >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

/* ------------------------------------------------- synthetic model arms */

/* The tap sequence of one step of a little dense llama-like model, with an
 * MoE-style integer tap per layer. E = 16, F = 24, V = 32. */
typedef struct tg_model {
    int n_layer;
    int n_prompt;  /* prefill tokens */
    int n_decode;  /* decode steps */
    int moe;       /* emit blk.L.moe_topk (i32 [T, 2]) */
} tg_model;

/* arm_seed 0 = the reference (exact values, f64); any other seed = an
 * honest f32 arm: each value times (1 + noise * depth * u), u uniform per
 * (arm, element), stored as f32, where depth grows along execution order. */
typedef struct tg_arm {
    uint64_t seed;
    double noise;       /* relative noise per unit depth, e.g. 1e-7 */
    td_dtype dtype;     /* TD_DT_F64 or TD_DT_F32 */
    const char *backend;
    const char *sha;
} tg_arm;

static const char *const tg_blk_taps[] = {"attn_norm", "attn_q",   "attn_k",  "attn_v",  "attn_ctx",
                                         "attn_out",  "ffn_inp",  "ffn_norm", "ffn_gate", "ffn_up",
                                         "ffn_act",   "ffn_out",  "out"};
#define TG_N_BLK ((int)(sizeof tg_blk_taps / sizeof tg_blk_taps[0]))

static inline int64_t tg_width(const char *base) {
    if (!strcmp(base, "ffn_gate") || !strcmp(base, "ffn_up") || !strcmp(base, "ffn_act")) return 24;
    return 16;
}

/* Token consumed at step s, row t. */
static inline int tg_token(int step, int t) {
    return (step * 7 + t * 3 + 1) % 32;
}

static inline void tg_fill(double *v, uint64_t n, uint64_t step, uint64_t tap, const tg_arm *arm, double depth) {
    for (uint64_t i = 0; i < n; i++) {
        double x = tg_unif(step, tap, i) * 2.0 + 0.1;
        if (arm->seed) x *= 1.0 + arm->noise * depth * tg_unif(arm->seed, step * 1000 + tap, i);
        v[i] = x;
    }
}

static inline void tg_write_model(const char *path, const tg_model *m, const tg_arm *arm) {
    td_tap_sink *s = tg_open(path, arm->backend, arm->dtype == TD_DT_F64 ? "f64" : "f32", arm->sha);
    double *v = malloc(sizeof(double) * 64 * 64);
    int n_steps = 1 + m->n_decode;
    for (int st = 0; st < n_steps; st++) {
        int T = st == 0 ? m->n_prompt : 1;
        int64_t pos0 = st == 0 ? 0 : m->n_prompt + st - 1;
        tg_step(s, st == 0 ? TD_STEP_PREFILL : TD_STEP_DECODE, pos0, T);
        for (int t = 0; t < T; t++) v[t] = tg_token(st, t);
        int64_t shT[1] = {T};
        tg_emit(s, "inp.tokens", TD_DT_I32, v, 1, shT);
        uint64_t tap = 1;
        double depth = 1;
        tg_fill(v, (uint64_t)T * 16, (uint64_t)st, tap++, arm, depth);
        tg_emit2(s, "inp.embd", arm->dtype, v, T, 16);
        for (int L = 0; L < m->n_layer; L++) {
            for (int k = 0; k < TG_N_BLK; k++) {
                char name[64];
                snprintf(name, sizeof name, "blk.%d.%s", L, tg_blk_taps[k]);
                int64_t w = tg_width(tg_blk_taps[k]);
                depth += 1;
                tg_fill(v, (uint64_t)(T * w), (uint64_t)st, tap++, arm, depth);
                tg_emit2(s, name, arm->dtype, v, T, w);
                if (m->moe && !strcmp(tg_blk_taps[k], "ffn_norm")) {
                    snprintf(name, sizeof name, "blk.%d.moe_topk", L);
                    for (int t = 0; t < T; t++) {
                        v[2 * t] = (t + L) % 4;
                        v[2 * t + 1] = (t + L + 1) % 4;
                    }
                    tg_emit2(s, name, TD_DT_I32, v, T, 2);
                }
            }
        }
        depth += 1;
        tg_fill(v, (uint64_t)T * 16, (uint64_t)st, tap++, arm, depth);
        tg_emit2(s, "out.norm", arm->dtype, v, T, 16);
        depth += 1;
        tg_fill(v, (uint64_t)T * 32, (uint64_t)st, tap++, arm, depth);
        for (uint64_t i = 0; i < (uint64_t)T * 32; i++) v[i] *= 4.0; // spread logits: clear top-1
        tg_emit2(s, "out.logits", arm->dtype, v, T, 32);
        tg_end(s);
    }
    free(v);
    tg_close(s);
}

/* ------------------------------------------------------------- the copy */

/* Called for every tap copied; may change the values (count doubles; for
 * integer taps the values are integers held in doubles). `after` is 1 once
 * the target tap (if any) has been passed in execution order. */
typedef void (*tg_perturb_fn)(void *ctx, int64_t step, const td_tap_info *t, double *v, uint64_t n);

/* Copies src to dst: root attributes (as strings; the writer's own keys are
 * left to the writer), every complete step and every tap in execution order
 * with its native float dtype (f64/f32) or integer dtype. Taps without data
 * stay fingerprint-only when `filter` names only the taps with data.
 * set_key/set_value (may be NULL) override one root attribute. drop_name (may
 * be NULL) is left out of the copy. Returns 0 or aborts. */
static inline void tg_copy(const char *src, const char *dst, tg_perturb_fn fn, void *ctx, const char *filter,
                           const char *set_key, const char *set_value, const char *drop_name) {
    td_tapfile *f;
    td_err e;
    if (td_tapfile_open(&f, src, &e)) {
        fprintf(stderr, "tg_copy: %s\n", e.msg);
        abort();
    }
    td_tap_options o = td_tap_options_default();
    o.filter = filter;
    td_tap_sink *s = NULL;
    if (td_tap_sink_open(&s, dst, &o, &e)) {
        fprintf(stderr, "tg_copy: %s\n", e.msg);
        abort();
    }
    char **names;
    int nn;
    if (td_tapfile_attr_names(f, &names, &nn, &e)) abort();
    static const char *const own[] = {"format", "format_version", "created", "tap_mode", "tap_filter"};
    for (int i = 0; i < nn; i++) {
        int skip = 0;
        for (size_t k = 0; k < sizeof own / sizeof own[0]; k++) skip |= !strcmp(names[i], own[k]);
        if (skip || (set_key && !strcmp(names[i], set_key))) continue;
        char *v;
        if (td_tapfile_attr_str(f, names[i], &v, &e)) abort();
        td_tap_sink_attr_str(s, names[i], v);
        free(v);
    }
    td_tapfile_free_names(names, nn);
    if (set_key) td_tap_sink_attr_str(s, set_key, set_value);
    for (int64_t st = 0; st < td_tapfile_n_steps(f); st++) {
        td_step_info si;
        td_tap_info *taps;
        int64_t n;
        if (td_tapfile_step(f, st, &si, &e) || td_tapfile_step_taps(f, st, &taps, &n, &e)) {
            fprintf(stderr, "tg_copy: %s\n", e.msg);
            abort();
        }
        tg_step(s, si.kind, si.pos0, si.n_tokens);
        for (int64_t i = 0; i < n; i++) {
            const td_tap_info *t = &taps[i];
            if (drop_name && !strcmp(drop_name, t->name)) continue;
            uint64_t cnt = t->count;
            double *v = calloc(cnt + 1, sizeof *v);
            if (t->has_data) {
                if (td_dtype_is_int(t->dtype)) {
                    int64_t *iv = calloc(cnt + 1, sizeof *iv);
                    if (td_tapfile_read_i64(f, st, t->name, iv, cnt, &e)) abort();
                    for (uint64_t k = 0; k < cnt; k++) v[k] = (double)iv[k];
                    free(iv);
                } else if (td_tapfile_read_f64(f, st, t->name, v, cnt, &e)) {
                    fprintf(stderr, "tg_copy: %s\n", e.msg);
                    abort();
                }
            }
            if (fn) fn(ctx, st, t, v, cnt);
            td_dtype dt = t->dtype == TD_DT_F16 || t->dtype == TD_DT_BF16 ? TD_DT_F32 : t->dtype;
            tg_emit(s, t->name, dt, v, t->ndim, t->shape);
            free(v);
        }
        free(taps);
        tg_end(s);
    }
    td_tapfile_close(f);
    tg_close(s);
}

/* ------------------------------------------------------ running tapdiff */

/* Runs $TD_TAPDIFF with argv (NULL-terminated, without argv[0]), captures
 * stdout+stderr into out (NUL-terminated, truncated to cap) and returns the
 * exit status (or -1). */
static inline int tg_run(char *out, size_t cap, const char *const *args) {
    const char *exe = getenv("TD_TAPDIFF");
    if (!exe) return -1;
    int p[2];
    if (pipe(p)) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(p[1], 1);
        dup2(p[1], 2);
        close(p[0]);
        close(p[1]);
        const char *argv[64];
        int n = 0;
        argv[n++] = exe;
        for (int i = 0; args[i] && n < 63; i++) argv[n++] = args[i];
        argv[n] = NULL;
        execv(exe, (char *const *)argv);
        _exit(127);
    }
    close(p[1]);
    size_t len = 0;
    ssize_t k;
    char sink[4096];
    while ((k = read(p[0], len + 1 < cap ? out + len : sink, len + 1 < cap ? cap - 1 - len : sizeof sink)) > 0)
        if (len + 1 < cap) len += (size_t)k;
    out[len] = '\0';
    close(p[0]);
    int status;
    if (waitpid(pid, &status, 0) < 0) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

#endif
