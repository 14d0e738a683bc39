/* tapdiff bench/kernel_rate.c: bytes of stored weights per CPU second that
 * one native dot kernel (cpu_kernels.h, f32 activations) reads, on a matrix
 * that fits in L2 (what the kernel's arithmetic allows) and on one far above
 * the last-level cache (what it gets from memory), one thread. The decode
 * bound of `tapdiff bench` is the second kind of rate for a plain stream;
 * a kernel whose L2 rate is below it cannot reach it. Built and run by
 * bench/kernel_rate.sh.
 *
 *   kernel_rate ISA TYPE   (ISA: 0 c, 1 avx2, 2 avx512vnni; TYPE: ggml type number) */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cpu_kernels.h"
#include "types.h"

static double cpu_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: kernel_rate ISA TYPE\n");
        return 2;
    }
    const int isa = atoi(argv[1]), type = atoi(argv[2]);
    const td_type_info *ti = td_type_get(type);
    td_cpu_kernels k;
    td_cpu_kernels_init(&k, (td_cpu_isa)isa);
    if (!ti || !k.type[type].dot || (int)k.isa != isa) {
        fprintf(stderr, "kernel_rate: no dot kernel for type %d at level %d here\n", type, isa);
        return 77;
    }
    const int64_t n = 1024;
    const size_t rb = (size_t)n / ti->block_size * ti->block_bytes;
    float x[1024], xs[1024 / TD_CPU_XSUM_GROUP];
    for (int i = 0; i < n; i++) x[i] = (float)(i % 7) * 0.1f;
    td_cpu_xsum(xs, x, n);
    const long rows_l2 = (long)(512 * 1024 / rb), rows_mem = (long)((256u << 20) / rb);
    for (int pass = 0; pass < 2; pass++) {
        const long rows = pass ? rows_mem : rows_l2, reps = pass ? 4 : 4 * rows_mem / rows_l2;
        uint8_t *w = malloc(rb * (size_t)rows);
        if (!w) return 99;
        // bytes that decode to finite values of every type (no f16 NaN/Inf exponents)
        for (size_t i = 0; i < rb * (size_t)rows; i++) w[i] = (uint8_t)((i * 2654435761u >> 13) & 0x3b);
        volatile float sink = 0;
        double t0 = cpu_s();
        for (long r = 0; r < reps; r++)
            for (long i = 0; i < rows; i++) sink += k.type[type].dot(w + (size_t)i * rb, x, xs, n);
        double dt = cpu_s() - t0;
        printf("%s %s %s: %.1f GB/s\n", td_cpu_isa_name(k.isa), td_type_name(type), pass ? "memory" : "L2",
               (double)rb * (double)rows * (double)reps / dt / 1e9);
        // td_cpu_gemv over chunks of `chunk` rows, as a decode step's matmul
        // tasks run them (one thread, 1024 output rows: 128 per task)
        if (k.type[type].dot_rows) {
            const long chunk = 128, nc = rows / chunk;
            float y[128];
            t0 = cpu_s();
            for (long r = 0; r < reps; r++)
                for (long c = 0; c < nc; c++) {
                    td_cpu_gemv(&k.type[type], w + (size_t)(c * chunk) * rb, rb, chunk, x, xs, n, y);
                    sink += y[0];
                }
            dt = cpu_s() - t0;
            printf("%s %s %s gemv: %.1f GB/s\n", td_cpu_isa_name(k.isa), td_type_name(type), pass ? "memory" : "L2",
                   (double)rb * (double)(nc * chunk) * (double)reps / dt / 1e9);
        }
        free(w);
    }
    return 0;
}
