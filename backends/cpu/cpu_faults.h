/* tapdiff "cpu": how the cpu backend implements faults of the shared catalog
 * (backends/faults.h) that do not fit in one expression of cpu.c. It
 * implements every fault of the catalog (td_cpu_backend.faults).
 *
 * Zero cost when off: cpu.c holds the fault as one int and tests it once per
 * operation (never per element); the faulty code paths live here, swap a
 * kernel table entry at open, or are flags of the shared MoE router.
 * A library: no printing, no exit(). */
#ifndef TD_CPU_FAULTS_H
#define TD_CPU_FAULTS_H

#include <stdint.h>

#include "cpu_kernels.h"
#include "faults.h"
#include "td_common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Faults that replace a kernel: kquant_scale_bit swaps the Q4_K decoder for
 * the faulty one (and drops Q4_K's direct dot kernels so every product
 * decodes through it). No-op for the other faults. */
void td_cpu_fault_patch_kernels(td_cpu_kernels *k, td_fault f);

/* rmsnorm_eps_outside: out (rows, n) = w * x * (1/sqrt(mean(x^2)) + eps).
 * out may alias x. */
void td_cpu_fault_rmsnorm_rows(float *out, const float *x, const float *w, float eps, int64_t rows, int64_t n);

#ifdef __cplusplus
}
#endif
#endif
