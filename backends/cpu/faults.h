/* tapdiff "cpu": the fault-injection catalog (DESIGN.md "Fault injection").
 * `--inject NAME` runs the cpu backend with ONE named, deliberate bug, so a
 * test can prove that tapdiff bisect localizes it (red) while the unmutated
 * backend stays conformant (green). The names and each entry's expected first
 * divergent tap and step are a contract: tests assert them.
 *
 * Steps: step 0 is the prefill, step s >= 1 the s-th decode step (the
 * backend counts forwards since open/reset). Tap names are the canonical
 * "blk.L.name" / "inp.*" / "out.*" of the tap files.
 *
 * Zero cost when off: cpu.c holds the fault as one int and tests it once per
 * operation (never per element); the faulty code paths live here, or swap a
 * kernel table entry at open.
 * A library: no printing, no exit(). */
#ifndef TD_CPU_FAULTS_H
#define TD_CPU_FAULTS_H

#include <stdint.h>

#include "cpu_kernels.h"
#include "td_common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum td_cpu_fault {
    TD_FAULT_NONE = 0,
    TD_FAULT_ROPE_PAIRING,      /* NORM <-> NEOX pairing swapped */
    TD_FAULT_STALE_TOKEN,       /* decode step 2 consumes token 0, not the one it was fed */
    TD_FAULT_RMSNORM_EPS,       /* 1/sqrt(mean(x^2)) + eps instead of 1/sqrt(mean(x^2) + eps) */
    TD_FAULT_ROUTER_TIEBREAK,   /* equal router probabilities: the HIGHER expert index ranks first */
    TD_FAULT_MOE_NO_RENORM,     /* selected expert probabilities used without renormalisation */
    TD_FAULT_KQUANT_SCALE_BIT,  /* Q4_K decoder reads bit 0 of sub-block 0's 6-bit scale inverted */
    TD_FAULT_KV_POS,            /* decode: K/V written at position p-1 (attention spans 0..p-1) */
    TD_FAULT_GQA_MAP_MOD,       /* query head h reads KV head h mod Hkv instead of h / (H/Hkv) */
    TD_FAULT_ATTN_SCALE,        /* attention scores scaled by 1/D instead of 1/sqrt(D) */
    TD_FAULT_RESIDUAL_SKIP,     /* layer 1 (0 with one layer): ffn_inp = attn_out, the residual dropped */
    TD_FAULT_IQ_SIGN_BIT,       /* IQ2_XXS decoder takes element 0's sign from bit 1 of the sign mask */
    TD_FAULT_COUNT
} td_cpu_fault;

/* The decode step stale_token hits, and the layer residual_skip hits. */
#define TD_FAULT_STALE_STEP 2
#define TD_FAULT_RESIDUAL_LAYER 1

typedef struct td_cpu_fault_info {
    td_cpu_fault id;
    const char *name;       /* the --inject name */
    const char *bug;        /* one line: what is wrong */
    const char *first_tap;  /* expected first divergent tap (llama and qwen3moe fixtures) */
    const char *first_tap_qwen3; /* the same on qwen3 (dense) fixtures when it differs, else NULL */
    int first_step;         /* expected step of the first divergence */
    const char *fixtures;   /* where it is visible (the conformance test's set) */
} td_cpu_fault_info;

/* Catalog entries 1 .. TD_FAULT_COUNT-1 in order; NULL past the end or for 0. */
const td_cpu_fault_info *td_cpu_fault_get(td_cpu_fault f);
/* NULL or "" -> TD_FAULT_NONE. TD_EINPUT (message lists the names) for an
 * unknown name. */
int td_cpu_fault_parse(const char *name, td_cpu_fault *out, td_err *err);
/* The expected first divergent tap of fault f on a model of architecture
 * `arch` ("llama", "qwen3", "qwen3moe"). */
const char *td_cpu_fault_expected_tap(td_cpu_fault f, const char *arch);

/* Faults that replace a kernel: kquant_scale_bit swaps the Q4_K decoder for
 * the faulty one (and drops Q4_K's direct dot kernels so every product
 * decodes through it); iq_sign_bit does the same for IQ2_XXS. No-op for the
 * other faults. */
void td_cpu_fault_patch_kernels(td_cpu_kernels *k, td_cpu_fault f);

/* rmsnorm_eps_outside: out (rows, n) = w * x * (1/sqrt(mean(x^2)) + eps).
 * out may alias x. */
void td_cpu_fault_rmsnorm_rows(float *out, const float *x, const float *w, float eps, int64_t rows, int64_t n);

/* Router selection and weights for router_tiebreak (tie_high: equal
 * probabilities rank the higher index first) and moe_no_renorm (renorm = 0:
 * w[j] = probs[topk[j]]). topk, w (K); probs (X). */
void td_cpu_fault_moe_route(int32_t *topk, float *w, const float *probs, int64_t X, int64_t K, int tie_high,
                            int renorm);

#ifdef __cplusplus
}
#endif
#endif
