/* tapdiff cpu backend: a small pthread pool for "parallel for" over tasks.
 * The caller is thread 0 and works too; workers spin briefly between jobs
 * (decode issues a few hundred short jobs per token) and then sleep.
 *
 * Which thread runs which task is left to scheduling; callers make every
 * task's arithmetic independent of that (a task owns its output rows and
 * its reduction order), so results do not depend on the thread count. */
#ifndef TD_CPU_POOL_H
#define TD_CPU_POOL_H

#include <stdint.h>

typedef struct td_cpu_pool td_cpu_pool;

/* fn(ctx, task, thread): task in 0..n_tasks-1, thread in 0..n_threads-1 */
typedef void (*td_cpu_task_fn)(void *ctx, int64_t task, int thread);

/* n_threads >= 1 (the caller included). Returns NULL when a thread cannot
 * be created. */
td_cpu_pool *td_cpu_pool_new(int n_threads);
void td_cpu_pool_free(td_cpu_pool *p);
int td_cpu_pool_threads(const td_cpu_pool *p);
/* Runs fn over every task and returns when all are done. */
void td_cpu_pool_run(td_cpu_pool *p, int64_t n_tasks, td_cpu_task_fn fn, void *ctx);

#endif
