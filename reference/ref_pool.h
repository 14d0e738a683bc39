/* A small persistent thread pool for the reference forward (ref, ref32).
 *
 * The reference splits work only where the split cannot change a single bit:
 * each worker computes whole outputs (e.g. a contiguous range of a matmul's
 * output rows), every output's sum runs in the same index order as with one
 * thread, and no reduction crosses workers. So the thread count changes the
 * speed, never the result.
 *
 * td_ref_pool_run(p, fn, ctx) calls fn(ctx, w, n) once for every worker
 * w = 0..n-1 (w = 0 on the calling thread) and returns when all have
 * returned. A pool is used from one thread at a time. */
#ifndef TD_REF_POOL_H
#define TD_REF_POOL_H

typedef struct td_ref_pool td_ref_pool;
typedef void (*td_ref_pool_fn)(void *ctx, int worker, int n_workers);

/* n_threads < 1 is taken as 1 (no helper thread is started). Aborts when a
 * thread cannot be created (an environment failure, like out-of-memory). */
td_ref_pool *td_ref_pool_new(int n_threads);
int td_ref_pool_size(const td_ref_pool *p);
void td_ref_pool_run(td_ref_pool *p, td_ref_pool_fn fn, void *ctx);
void td_ref_pool_free(td_ref_pool *p);

#endif
