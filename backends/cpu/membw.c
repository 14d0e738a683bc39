/* tapdiff cpu backend: a streaming-read bandwidth probe for the bench's
 * memory-bound estimate (decode reads every weight once per token, so
 * tokens/s <= read bandwidth / weight bytes per token). The same pool and
 * the same SIMD loads as the forward read the buffer in 1 MiB tasks. */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cpu.h"
#include "cpu_kernels.h"
#include "pool.h"

#define CHUNK_FLOATS (256 * 1024) /* 1 MiB per task */

typedef struct bw_job {
    const td_cpu_kernels *k;
    const float *buf;
    int64_t n;
    float *sink; /* one per task, so the sums cannot be optimised away */
} bw_job;

static void bw_task(void *ctx, int64_t task, int th) {
    (void)th;
    const bw_job *j = ctx;
    const int64_t i0 = task * CHUNK_FLOATS;
    const int64_t n = j->n - i0 < CHUNK_FLOATS ? j->n - i0 : CHUNK_FLOATS;
    // a dot of the chunk with itself: one stream from memory, the second
    // operand of each multiply is the same, already loaded, cache line
    j->sink[task] = j->k->dot_f32(j->buf + i0, j->buf + i0, n);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double td_cpu_read_bandwidth(int threads, size_t bytes, int reps) {
    if (threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (int)n : 1;
    }
    if (reps < 1) reps = 1;
    const int64_t n = (int64_t)(bytes / sizeof(float));
    if (n < CHUNK_FLOATS) return 0;
    td_cpu_kernels k;
    td_cpu_kernels_init(&k, TD_CPU_ISA_AVX2);
    td_cpu_pool *pool = td_cpu_pool_new(threads);
    if (!pool) return 0;
    float *buf = td_xmalloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) buf[i] = (float)(i & 7); // touch every page
    const int64_t n_tasks = (n + CHUNK_FLOATS - 1) / CHUNK_FLOATS;
    bw_job j = {&k, buf, n, td_xcalloc((size_t)n_tasks, sizeof(float))};
    double best = 0;
    for (int r = 0; r < reps; r++) {
        const double t0 = now_s();
        td_cpu_pool_run(pool, n_tasks, bw_task, &j);
        const double dt = now_s() - t0;
        if (dt > 0 && (double)n * sizeof(float) / dt > best) best = (double)n * sizeof(float) / dt;
    }
    free(j.sink);
    free(buf);
    td_cpu_pool_free(pool);
    return best;
}
