/* tapdiff cpu backend: the thread pool (pool.h). One job at a time: the
 * caller publishes (fn, ctx, n_tasks), bumps a generation counter, and every
 * thread claims task indices until none are left. The caller returns when
 * every task is done, not when every worker has seen the job: on a machine
 * with more runnable threads than cores a worker may not get a core for a
 * whole time slice, and a job it never started must not wait for it (at
 * load ~20 on 2 cores that wait made 2-thread decode 4x slower than 1
 * thread). So a claim names its job: a worker that wakes late finds the job
 * it saw over, or joins the current one, and never runs a task twice. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

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

/* claim and limit words: job number in the high 32 bits, a task index
 * (claim) or the task count (limit) in the low 32 */
#define JOB_SHIFT 32
#define LOW_MASK 0xFFFFFFFFu

typedef struct worker_arg {
    td_cpu_pool *p;
    int id;
    double cpu; // TD_CPU_POOL_STATS: CPU time running tasks
} worker_arg;

struct td_cpu_pool {
    int n;          /* threads including the caller */
    pthread_t *th;  /* n-1 workers */
    worker_arg *args;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_uint_fast64_t gen;   /* bumped once per job: wakes the workers */
    atomic_int stop;
    atomic_uint_fast64_t claim; /* job << 32 | next task index */
    atomic_uint_fast64_t limit; /* job << 32 | task count, stored after claim */
    atomic_int_fast64_t done;   /* tasks of the current job finished */
    uint64_t job;               /* the current job's number (caller only) */
    /* the current job; stable while any of its tasks is unfinished, which
     * holds for whoever has claimed one */
    td_cpu_task_fn fn;
    void *ctx;
    // TD_CPU_POOL_STATS=1: CPU time by kind, printed to stderr at free, so
    // what a second thread gives is measurable on a busy machine (CPU time
    // does not count waiting for a core; it does count memory stalls, so
    // bandwidth contention between threads shows as more work)
    int stats;
    uint64_t jobs, shared; // jobs; those handed to the workers (a wake-up and a wait each)
    double cpu0;           // the caller's CPU time at creation
    double in_jobs;        // the caller's CPU time running tasks
    double waited;         // the caller's CPU time waiting for workers' tasks to finish
};

static double thread_cpu(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* claims and runs tasks of the job published now, if any is left */
static void run_tasks(td_cpu_pool *p, int id) {
    const uint64_t lim = atomic_load(&p->limit);
    const uint64_t job = lim >> JOB_SHIFT, n = lim & LOW_MASK;
    uint64_t c = atomic_load(&p->claim);
    for (;;) {
        // a claim of another job: the one `lim` named is over (all its
        // tasks claimed, or finished and a newer one published)
        if (c >> JOB_SHIFT != job || (c & LOW_MASK) >= n) return;
        if (!atomic_compare_exchange_weak(&p->claim, &c, c + 1)) continue; // c reloaded
        p->fn(p->ctx, (int64_t)(c & LOW_MASK), id);
        atomic_fetch_add(&p->done, 1);
        c = atomic_load(&p->claim);
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
        const double c0 = p->stats ? thread_cpu() : 0;
        run_tasks(p, a->id);
        if (p->stats) a->cpu += thread_cpu() - c0;
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
    atomic_init(&p->claim, 0);
    atomic_init(&p->limit, 0); // job 0, no tasks
    atomic_init(&p->done, 0);
    const char *st = getenv("TD_CPU_POOL_STATS");
    p->stats = st && *st && *st != '0';
    if (p->stats) p->cpu0 = thread_cpu();
    if (n_threads > 1) {
        p->th = td_xcalloc((size_t)n_threads - 1, sizeof *p->th);
        p->args = td_xcalloc((size_t)n_threads - 1, sizeof *p->args);
        for (int i = 0; i < n_threads - 1; i++) {
            p->args[i] = (worker_arg){p, i + 1, 0};
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
    if (p->stats) {
        double workers = 0;
        for (int i = 0; i < p->n - 1; i++) workers += p->args[i].cpu;
        // outside: the caller's CPU time between jobs (norms, RoPE, the
        // residual adds, sampling, taps...), which no thread count shortens
        const double outside = thread_cpu() - p->cpu0 - p->in_jobs - p->waited;
        fprintf(stderr,
                "tapdiff: cpu pool: %d threads, %llu jobs (%llu shared), CPU s: outside jobs %.3f, in jobs %.3f "
                "(caller %.3f, workers %.3f), caller waiting %.3f\n",
                p->n, (unsigned long long)p->jobs, (unsigned long long)p->shared, outside, p->in_jobs + workers,
                p->in_jobs, workers, p->waited);
    }
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
    const double c0 = p->stats ? thread_cpu() : 0;
    p->jobs++;
    if (p->n == 1 || n_tasks == 1) {
        for (int64_t t = 0; t < n_tasks; t++) fn(ctx, t, 0);
        if (p->stats) p->in_jobs += thread_cpu() - c0;
        return;
    }
    TD_ASSERT((uint64_t)n_tasks <= LOW_MASK);
    p->shared++;
    p->fn = fn;
    p->ctx = ctx;
    atomic_store(&p->done, 0);
    // job numbers wrap after 2^32 jobs; a worker would have to sleep between
    // reading limit and claim through all of them to confuse two
    p->job = (p->job + 1) & LOW_MASK;
    atomic_store(&p->claim, (uint_fast64_t)p->job << JOB_SHIFT);
    atomic_store(&p->limit, (uint_fast64_t)p->job << JOB_SHIFT | (uint64_t)n_tasks);
    // wake under the mutex: a worker about to sleep re-checks gen under it
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add(&p->gen, 1);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    run_tasks(p, 0);
    const double c1 = p->stats ? thread_cpu() : 0;
    for (int spins = 0; atomic_load(&p->done) < n_tasks; spins++) {
        if (spins < SPIN_ITERS) cpu_relax();
        else sched_yield(); // a worker holding a task was descheduled (2 cores, busy machine)
    }
    if (p->stats) {
        p->in_jobs += c1 - c0;
        p->waited += thread_cpu() - c1;
    }
}
