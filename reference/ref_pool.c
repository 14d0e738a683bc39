/* The reference's thread pool (ref_pool.h): helpers sleep on a condition
 * variable between jobs; a job is published by bumping a generation count. */
#include "ref_pool.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "td_common.h"

typedef struct helper {
    td_ref_pool *pool;
    int index;
    pthread_t tid;
    double job_cpu; // CPU seconds of its part of the last job (with stats on)
} helper;

struct td_ref_pool {
    int n;               // workers, the caller included
    helper *helpers;     // n - 1
    pthread_mutex_t mu;
    pthread_cond_t start, done;
    unsigned long gen;   // bumped once per job
    int pending;         // helpers still running the current job
    int stop;
    td_ref_pool_fn fn;
    void *ctx;
    // TD_REF_POOL_STATS=1: thread CPU time per job, printed to stderr at
    // free, so the speedup threads can give is measurable on a busy machine
    // (CPU time, unlike wall time, does not count waiting for a core)
    int stats;
    unsigned long jobs;
    double cpu0;      // the caller's CPU time at creation
    double in_jobs;   // the caller's CPU time inside its parts of jobs
    double busy;      // sum over workers of CPU time inside jobs
    double critical;  // sum over jobs of the slowest worker's CPU time
};

static double thread_cpu(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *helper_main(void *arg) {
    helper *h = arg;
    td_ref_pool *p = h->pool;
    unsigned long seen = 0;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        while (!p->stop && p->gen == seen) pthread_cond_wait(&p->start, &p->mu);
        if (p->stop) {
            pthread_mutex_unlock(&p->mu);
            return NULL;
        }
        seen = p->gen;
        td_ref_pool_fn fn = p->fn;
        void *ctx = p->ctx;
        pthread_mutex_unlock(&p->mu);
        double c0 = p->stats ? thread_cpu() : 0;
        fn(ctx, h->index, p->n);
        if (p->stats) h->job_cpu = thread_cpu() - c0;
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0) pthread_cond_signal(&p->done);
        pthread_mutex_unlock(&p->mu);
    }
}

td_ref_pool *td_ref_pool_new(int n_threads) {
    td_ref_pool *p = td_xcalloc(1, sizeof *p);
    p->n = n_threads < 1 ? 1 : n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->start, NULL);
    pthread_cond_init(&p->done, NULL);
    const char *st = getenv("TD_REF_POOL_STATS");
    p->stats = st && *st && *st != '0';
    if (p->stats) p->cpu0 = thread_cpu();
    if (p->n > 1) p->helpers = td_xcalloc((size_t)p->n - 1, sizeof *p->helpers);
    for (int i = 1; i < p->n; i++) {
        helper *h = &p->helpers[i - 1];
        h->pool = p;
        h->index = i;
        if (pthread_create(&h->tid, NULL, helper_main, h)) {
            fprintf(stderr, "tapdiff: reference: cannot start thread %d of %d\n", i + 1, p->n);
            abort();
        }
    }
    return p;
}

int td_ref_pool_size(const td_ref_pool *p) { return p ? p->n : 1; }

static void account(td_ref_pool *p, double main_cpu) {
    double mx = main_cpu, sum = main_cpu;
    for (int i = 1; i < p->n; i++) {
        double c = p->helpers[i - 1].job_cpu;
        sum += c;
        if (c > mx) mx = c;
    }
    p->jobs++;
    p->in_jobs += main_cpu;
    p->busy += sum;
    p->critical += mx;
}

void td_ref_pool_run(td_ref_pool *p, td_ref_pool_fn fn, void *ctx) {
    if (!p) {
        fn(ctx, 0, 1);
        return;
    }
    double c0 = p->stats ? thread_cpu() : 0;
    if (p->n == 1) {
        fn(ctx, 0, 1);
        if (p->stats) account(p, thread_cpu() - c0);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->pending = p->n - 1;
    p->gen++;
    pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->mu);
    fn(ctx, 0, p->n);
    double main_cpu = p->stats ? thread_cpu() - c0 : 0;
    pthread_mutex_lock(&p->mu);
    while (p->pending > 0) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
    if (p->stats) account(p, main_cpu); // the helpers' job_cpu are published by the mutex
}

void td_ref_pool_free(td_ref_pool *p) {
    if (!p) return;
    if (p->stats) {
        // outside: the caller's CPU time between jobs (norms, RoPE, the
        // residual adds, taps...), which no thread count shortens
        double outside = thread_cpu() - p->cpu0 - p->in_jobs;
        fprintf(stderr,
                "tapdiff: reference pool: %d workers, %lu jobs, CPU s: outside jobs %.3f, in jobs %.3f "
                "(all workers), critical path %.3f (outside + slowest worker of each job)\n",
                p->n, p->jobs, outside, p->busy, outside + p->critical);
    }
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++) pthread_join(p->helpers[i - 1].tid, NULL);
    pthread_cond_destroy(&p->start);
    pthread_cond_destroy(&p->done);
    pthread_mutex_destroy(&p->mu);
    free(p->helpers);
    free(p);
}
