/* Nondeterminism check (determinism.h). */
#include "determinism.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tapfile.h"

/* Bit equality of two doubles read from tap files: f32/f16 values widen
 * exactly, so equal bits here are equal bits in the arm's own precision;
 * NaN equals NaN of the same payload. */
static int same_bits(double a, double b) { return !memcmp(&a, &b, sizeof a); }

static int fp_equal(const td_fingerprint *a, const td_fingerprint *b, const char **field) {
#define FPCMP(f)                                                                                                       \
    if (!same_bits((double)a->f, (double)b->f)) {                                                                      \
        *field = #f;                                                                                                   \
        return 0;                                                                                                      \
    }
    if (a->count != b->count || a->n_nonfinite != b->n_nonfinite || a->n_nonzero != b->n_nonzero) {
        *field = "count";
        return 0;
    }
    FPCMP(min) FPCMP(max) FPCMP(max_abs) FPCMP(sum) FPCMP(sum_abs) FPCMP(sum_sq)
    for (int i = 0; i < 4; i++) FPCMP(first[i])
#undef FPCMP
    return 1;
}

static void note(td_det_result *r, int64_t step, const char *tap, int64_t index, double va, double vb,
                 const char *fmt, const char *arg) {
    r->step = step;
    snprintf(r->tap, sizeof r->tap, "%s", tap);
    r->index = index;
    r->value_0 = va;
    r->value_run = vb;
    snprintf(r->what, sizeof r->what, fmt, arg);
}

int td_tapfiles_identical(const char *pa, const char *pb, int *differ, td_det_result *r, int64_t *n_compared,
                          td_err *err) {
    td_tapfile *a = NULL, *b = NULL;
    td_tap_info *ta = NULL;
    double *va = NULL, *vb = NULL;
    size_t cap = 0;
    int rc;
    *differ = 0;
    if ((rc = td_tapfile_open(&a, pa, err)) || (rc = td_tapfile_open(&b, pb, err))) goto out;
    if (td_tapfile_n_steps(a) != td_tapfile_n_steps(b)) {
        char n[64];
        snprintf(n, sizeof n, "%lld vs %lld", (long long)td_tapfile_n_steps(a), (long long)td_tapfile_n_steps(b));
        note(r, 0, "", -1, NAN, NAN, "the runs have different step counts (%s)", n);
        *differ = 1;
        goto out;
    }
    for (int64_t st = 0; st < td_tapfile_n_steps(a) && !*differ; st++) {
        int64_t n = 0;
        free(ta);
        ta = NULL;
        if ((rc = td_tapfile_step_taps(a, st, &ta, &n, err))) goto out;
        td_step_info sb;
        if ((rc = td_tapfile_step(b, st, &sb, err))) goto out;
        if (sb.n_taps != n) {
            note(r, st, "", -1, NAN, NAN, "%s", "the runs emitted a different number of taps");
            *differ = 1;
            break;
        }
        for (int64_t i = 0; i < n && !*differ; i++) {
            const td_tap_info *x = &ta[i];
            td_tap_info y;
            td_err e2;
            if (td_tapfile_tap(b, st, x->name, &y, &e2)) {
                note(r, st, x->name, -1, NAN, NAN, "%s", "the tap is missing in the other run");
                *differ = 1;
                break;
            }
            (*n_compared)++;
            if (x->count != y.count || x->ndim != y.ndim || x->dtype != y.dtype) {
                note(r, st, x->name, -1, NAN, NAN, "%s", "the tap's shape or dtype differs");
                *differ = 1;
                break;
            }
            const char *field = NULL;
            if (x->has_data && y.has_data && x->count) {
                if (x->count > cap) {
                    cap = x->count;
                    va = td_xrealloc(va, cap * sizeof *va);
                    vb = td_xrealloc(vb, cap * sizeof *vb);
                }
                if ((rc = td_tapfile_read_f64(a, st, x->name, va, x->count, err)) ||
                    (rc = td_tapfile_read_f64(b, st, x->name, vb, x->count, err)))
                    goto out;
                for (uint64_t k = 0; k < x->count; k++) {
                    if (!same_bits(va[k], vb[k])) {
                        note(r, st, x->name, (int64_t)k, va[k], vb[k], "%s", "values differ");
                        *differ = 1;
                        break;
                    }
                }
            } else if (!fp_equal(&x->fp, &y.fp, &field)) {
                note(r, st, x->name, -1, NAN, NAN, "fingerprints differ (%s)", field);
                *differ = 1;
            }
        }
    }
out:
    free(ta), free(va), free(vb);
    td_tapfile_close(a);
    td_tapfile_close(b);
    return rc;
}

int td_determinism(const td_det_config *cfg, td_det_result *r, td_err *err) {
    memset(r, 0, sizeof *r);
    r->step = -1;
    r->index = -1;
    if (cfg->n_runs < 2 || cfg->n_threads < 1 || !cfg->threads || !cfg->dir)
        return td_err_set(err, TD_EUSAGE, "a nondeterminism check needs at least 2 runs and a thread count");
    int rc = td_mkdir_p(cfg->dir, err);
    if (rc) return rc;
    td_run_config rc0 = cfg->run;
    rc0.tap_mode = TD_TAP_FULL;
    rc0.on_step = NULL;
    td_run_result first = {0};
    snprintf(r->path_0, sizeof r->path_0, "%s/run_0.h5", cfg->dir);
    rc0.tap_path = r->path_0;
    rc0.threads = cfg->threads[0];
    r->threads_0 = cfg->threads[0];
    if ((rc = td_run(&rc0, &first, err))) return rc;
    r->n_runs = 1;
    if (cfg->on_run) cfg->on_run(cfg->user, 1, cfg->n_runs);
    char path[1024];
    for (int i = 1; i < cfg->n_runs; i++) {
        td_run_config ci = rc0;
        ci.decode = TD_DECODE_PINNED;
        ci.pinned = first.fed;
        ci.n_pinned = first.n_steps;
        ci.threads = cfg->threads[i % cfg->n_threads];
        snprintf(path, sizeof path, "%s/run_%d.h5", cfg->dir, i);
        ci.tap_path = path;
        td_run_result ri = {0};
        if ((rc = td_run(&ci, &ri, err))) break;
        td_run_result_free(&ri);
        r->n_runs++;
        int differ = 0;
        if ((rc = td_tapfiles_identical(r->path_0, path, &differ, r, &r->n_taps_compared, err))) break;
        if (cfg->on_run) cfg->on_run(cfg->user, i + 1, cfg->n_runs);
        if (differ) {
            r->verdict = TD_NONDETERMINISTIC;
            r->run = i;
            r->threads_run = ci.threads;
            snprintf(r->path_run, sizeof r->path_run, "%s", path);
            break;
        }
        if (!cfg->keep_all) unlink(path);
    }
    td_run_result_free(&first);
    if (!rc && r->verdict == TD_OK && r->n_taps_compared == 0)
        rc = td_err_set(err, TD_EINPUT, "the runs emitted no tap: a check that compared nothing does not pass");
    return rc;
}
