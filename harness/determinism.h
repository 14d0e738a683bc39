/* Nondeterminism check: runs one arm several times on the same tokens (the
 * first run greedy, the others pinned to its tokens, so every run answers
 * the same question) and compares the runs' tap files bit for bit. A
 * difference is its own verdict, "nondeterministic", apart from "divergent":
 * it says the arm does not compute a function of its inputs (a race, an
 * uninitialised read, a reduction whose order depends on timing), not that
 * it computes the wrong one. */
#ifndef TD_DETERMINISM_H
#define TD_DETERMINISM_H

#include <stdint.h>

#include "runner.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The exit status of a nondeterministic verdict (README's exit-code table). */
#define TD_NONDETERMINISTIC 5

typedef struct td_det_config {
    td_run_config run;   /* model, backend, prompt, steps, profile, inject... (tap fields are set here) */
    int n_runs;          /* >= 2 */
    const int *threads;  /* thread count of run i is threads[i % n_threads] */
    int n_threads;       /* >= 1 */
    const char *dir;     /* run_<i>.h5 go there (created) */
    int keep_all;        /* keep every run's file (else only the first and the first differing one) */
    void (*on_run)(void *user, int done, int total);
    void *user;
} td_det_config;

typedef struct td_det_result {
    int verdict;             /* TD_OK or TD_NONDETERMINISTIC */
    int n_runs;              /* runs done */
    int64_t n_taps_compared; /* (step, tap) pairs compared over all runs */
    /* the first difference (verdict != TD_OK): run `run` vs run 0 */
    int run, threads_0, threads_run;
    int64_t step;
    char tap[128];
    int64_t index;           /* first differing element, -1 when only the fingerprint differs */
    double value_0, value_run;
    char what[160];          /* "values differ", "tap missing", ... */
    char path_0[1024], path_run[1024];
} td_det_result;

/* Runs and compares. TD_OK with r->verdict set; an error status (bad model,
 * tokens, backend) with one line in err. */
int td_determinism(const td_det_config *cfg, td_det_result *r, td_err *err);

/* Compares two tap files bit for bit (every step, every tap of `a` in
 * execution order: the data when both stored it, else the fingerprint).
 * Sets *differ (0/1) and, when they differ, the difference fields of r
 * (step, tap, index, values, what). Returns TD_OK or TD_EINPUT (unreadable
 * file) with err set. */
int td_tapfiles_identical(const char *a, const char *b, int *differ, td_det_result *r, int64_t *n_compared,
                          td_err *err);

#ifdef __cplusplus
}
#endif
#endif
