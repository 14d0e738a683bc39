/* tapdiff cpu backend: the thread pool (pool.h). One job at a time: the
 * caller publishes (fn, ctx, n_tasks), bumps a generation counter, and every
 * thread takes task indices from one atomic counter until none are left. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "pool.h"
#include "td_common.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

/* ~tens of microseconds of polling before a worker sleeps: long enough to
 * bridge the gaps between the jobs of one decode step */
#define SPIN_ITERS 20000

typedef struct worker_arg {
    td_cpu_pool *p;
    int id;
} worker_arg;

struct td_cpu_pool {
    int n;          /* threads including the caller */
    pthread_t *th;  /* n-1 workers */
    worker_arg *args;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_uint_fast64_t gen; /* bumped once per job */
    atomic_int stop;
    atomic_int_fast64_t next; /* next task index of the current job */
    atomic_int busy;          /* workers that have not finished the current job */
    int64_t n_tasks;
    td_cpu_task_fn fn;
    void *ctx;
};

static void run_tasks(td_cpu_pool *p, int id) {
    for (;;) {
        const int64_t t = atomic_fetch_add(&p->next, 1);
        if (t >= p->n_tasks) break;
        p->fn(p->ctx, t, id);
    }
}

static void *worker(void *argp) {
    worker_arg *a = argp;
    td_cpu_pool *p = a->p;
    uint64_t seen = 0;
    for (;;) {
        uint64_t g;
        int spins = 0;
        while ((g = atomic_load(&p->gen)) == seen && !atomic_load(&p->stop) && spins < SPIN_ITERS) {
            cpu_relax();
            spins++;
        }
        if (g == seen && !atomic_load(&p->stop)) {
            pthread_mutex_lock(&p->mu);
            while ((g = atomic_load(&p->gen)) == seen && !atomic_load(&p->stop)) pthread_cond_wait(&p->cv, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop)) return NULL;
        seen = g;
        run_tasks(p, a->id);
        atomic_fetch_sub(&p->busy, 1);
    }
}

td_cpu_pool *td_cpu_pool_new(int n_threads) {
    TD_ASSERT(n_threads >= 1);
    td_cpu_pool *p = td_xcalloc(1, sizeof *p);
    p->n = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    atomic_init(&p->gen, 0);
    atomic_init(&p->stop, 0);
    atomic_init(&p->next, 0);
    atomic_init(&p->busy, 0);
    if (n_threads > 1) {
        p->th = td_xcalloc((size_t)n_threads - 1, sizeof *p->th);
        p->args = td_xcalloc((size_t)n_threads - 1, sizeof *p->args);
        for (int i = 0; i < n_threads - 1; i++) {
            p->args[i] = (worker_arg){p, i + 1};
            if (pthread_create(&p->th[i], NULL, worker, &p->args[i])) {
                p->n = i + 1; // the workers started so far get joined
                td_cpu_pool_free(p);
                return NULL;
            }
        }
    }
    return p;
}

void td_cpu_pool_free(td_cpu_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n - 1; i++) pthread_join(p->th[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->th);
    free(p->args);
    free(p);
}

int td_cpu_pool_threads(const td_cpu_pool *p) {
    return p->n;
}

void td_cpu_pool_run(td_cpu_pool *p, int64_t n_tasks, td_cpu_task_fn fn, void *ctx) {
    if (n_tasks <= 0) return;
    if (p->n == 1 || n_tasks == 1) {
        for (int64_t t = 0; t < n_tasks; t++) fn(ctx, t, 0);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    p->n_tasks = n_tasks;
    atomic_store(&p->next, 0);
    atomic_store(&p->busy, p->n - 1);
    // publish under the mutex: a worker about to sleep re-checks gen under it
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add(&p->gen, 1);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    run_tasks(p, 0);
    for (int spins = 0; atomic_load(&p->busy) > 0; spins++) {
        if (spins < SPIN_ITERS) cpu_relax();
        else sched_yield(); // a worker was descheduled (2 cores, busy machine)
    }
}
