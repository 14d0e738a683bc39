/* The reference's thread pool (ref_pool.h): helpers sleep on a condition
 * variable between jobs; a job is published by bumping a generation count. */
#include "ref_pool.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "td_common.h"

typedef struct helper {
    td_ref_pool *pool;
    int index;
    pthread_t tid;
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
};

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
        fn(ctx, h->index, p->n);
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

void td_ref_pool_run(td_ref_pool *p, td_ref_pool_fn fn, void *ctx) {
    if (!p || p->n == 1) {
        fn(ctx, 0, 1);
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
    pthread_mutex_lock(&p->mu);
    while (p->pending > 0) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

void td_ref_pool_free(td_ref_pool *p) {
    if (!p) return;
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
