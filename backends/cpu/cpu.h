/* tapdiff "cpu": the optimized CPU forward (llama, qwen3, qwen3moe, llama
 * MoE), registered in backends/registry.c.
 *
 *   - f32 activations, f32 KV cache; weights read in their stored format by
 *     per-type dot kernels (cpu_kernels.h: portable C, overridden by
 *     AVX2/FMA/F16C at run time); arithmetic profile "native" by default (no
 *     activation quantization), so ref32 is its control arm as it is;
 *   - params->profile = "act-q8" (opt-in, declared in the version string):
 *     activations entering a matmul are rounded as llama.cpp's CPU backend
 *     converts them for the weight's type (Q8_0 / Q8_K blocks, f16, bf16;
 *     the definition is profile.h td_act_round_f32, which ref32 uses
 *     under the same profile) and multiplied by the codes in integer
 *     arithmetic;
 *   - prefill (T >= TD_CPU_GEMM_MIN_T tokens) through OpenBLAS sgemm on
 *     weight tiles dequantized to f32 (when built with OpenBLAS), decode
 *     through the dot kernels;
 *   - a pthread pool (params->threads, 0 = every online core): matrix rows
 *     and attention heads in parallel;
 *   - the reference's taps, same names, shapes and order, dtype f32;
 *   - deterministic: every output row is produced by one task whose
 *     arithmetic depends only on the row and the inputs (tiles have a fixed
 *     size that does not depend on the thread count; OpenBLAS runs
 *     single-threaded inside a task), so logits are bitwise identical across
 *     reruns AND across thread counts. */
#ifndef TD_CPU_H
#define TD_CPU_H

#include <stddef.h>

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

extern const td_backend_vt td_cpu_backend; /* "cpu" */

/* Prefill GEMM threshold: a forward of at least this many tokens uses the
 * sgemm path (environment TD_CPU_GEMM_MIN_T overrides it, for measuring). */
#define TD_CPU_GEMM_MIN_T 8

/* Streaming read bandwidth in bytes/s with `threads` threads (0 = every
 * core): the best of `reps` passes over a buffer of `bytes` (choose it well
 * above the last-level cache). For the bench's memory-bound estimate. */
double td_cpu_read_bandwidth(int threads, size_t bytes, int reps);

#ifdef __cplusplus
}
#endif
#endif
