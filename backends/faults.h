/* tapdiff: the fault-injection catalog (DESIGN.md "Fault injection"), shared
 * by every backend. `--inject NAME` runs ONE backend with ONE named,
 * deliberate bug, so a test can prove that tapdiff bisect localizes it (red)
 * while the unmutated backend stays conformant (green). The names and each
 * entry's expected first divergent tap and step are a contract: tests assert
 * them, whichever backend carries the bug.
 *
 * A backend declares the faults it implements in its td_backend_vt.faults
 * (TD_FAULT_BIT of each); the runner refuses a fault the chosen backend does
 * not implement before opening it (td_fault_check_backend: exit 2). How a
 * backend implements a fault is its own business (backends/cpu/cpu_faults.h);
 * the MoE routing faults are flags of the shared router (forward.h).
 *
 * Steps: step 0 is the prefill, step s >= 1 the s-th decode step (the
 * backend counts forwards since open/reset). Tap names are the canonical
 * "blk.L.name" / "inp.*" / "out.*" of the tap files.
 * A library: no printing, no exit(). */
#ifndef TD_FAULTS_H
#define TD_FAULTS_H

#include <stdint.h>

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum td_fault {
    TD_FAULT_NONE = 0,
    TD_FAULT_ROPE_PAIRING = 1,      /* NORM <-> NEOX pairing swapped */
    TD_FAULT_STALE_TOKEN = 2,       /* decode step 2 consumes token 0, not the one it was fed */
    TD_FAULT_RMSNORM_EPS = 3,       /* 1/sqrt(mean(x^2)) + eps instead of 1/sqrt(mean(x^2) + eps) */
    TD_FAULT_ROUTER_TIEBREAK = 4,   /* equal router probabilities: the HIGHER expert index ranks first */
    TD_FAULT_MOE_NO_RENORM = 5,     /* selected expert probabilities used without renormalisation */
    TD_FAULT_KQUANT_SCALE_BIT = 6,  /* Q4_K decoder reads bit 0 of sub-block 0's 6-bit scale inverted */
    TD_FAULT_KV_POS = 7,            /* decode: K/V written at position p-1 (attention spans 0..p-1) */
    TD_FAULT_GQA_MAP_MOD = 8,       /* query head h reads KV head h mod Hkv instead of h / (H/Hkv) */
    TD_FAULT_ATTN_SCALE = 9,        /* attention scores scaled by 1/D instead of 1/sqrt(D) */
    TD_FAULT_RESIDUAL_SKIP = 10,    /* layer 1 (0 with one layer): ffn_inp = attn_out, the residual dropped */
    TD_FAULT_IQ_SIGN_BIT = 11,      /* IQ2_XXS decoder takes element 0's sign from bit 1 of the sign mask */
    TD_FAULT_CUDA_SYNC_MISSING = 12, /* cuda: the RMSNorm block reduction reads its partials without the barrier */
    TD_FAULT_CUDA_SMEM_STRIDE = 13,  /* cuda: attention writes its scores to shared memory with stride 1, reads 2 */
    TD_FAULT_ROLLBACK_STALE_KV = 14, /* rollback moves the position back but the dropped K/V rows stay attended */
    TD_FAULT_SEQ_COPY_SHORT = 15,   /* sequence copy misses the source's last position */
    TD_FAULT_THREAD_RACE = 16,      /* attention tasks share one score buffer across threads (a data race) */
    TD_FAULT_SIMD_TAIL = 17,        /* the f32 dot kernel drops the n % 8 tail */
    TD_FAULT_ODDBLOCK_Q8_0 = 18,    /* the Q8_0 row dot, unrolled by 2 blocks, drops an odd last block */
    TD_FAULT_GDN_L2_EPS = 19,        /* GDN L2 norm: 1/sqrt(sum x^2) + eps, eps outside the square root */
    TD_FAULT_GDN_CHUNK = 20,         /* chunked GDN prefill: the cumulative decay is not reset at a chunk start */
    TD_FAULT_CONV_SHIFT = 21,        /* decode: the conv state is not shifted before the new input is stored */
    TD_FAULT_GDN_DECAY_AFTER = 22,   /* delta rule: state decayed after the update instead of before */
    TD_FAULT_SHEXP_NO_SIGMOID = 23,  /* shared-expert gate used as w.x, without its sigmoid */
    TD_FAULT_ROPE_PARTIAL_ALL = 24,  /* partial RoPE (R < D) rotates all D dims */
    TD_FAULT_GDN_ROLLBACK_STALE = 25, /* rollback restores the KV positions but not the recurrent (GDN) state */
    TD_FAULT_QSA_TOPK_SKIP = 26,     /* QSA: the block ranking starts at its second entry (the best block is dropped) */
    TD_FAULT_PLE_HASH32 = 27,        /* PLE: the longest n-gram order hashes with 32-bit products */
    TD_FAULT_HC_INJECT_STREAM = 28,  /* HC combine after attention: stream c weighted by stream c+1's inject */
    TD_FAULT_QSA_COPY_NO_IKEY = 29,  /* sequence copy leaves the copy's QSA indexer key cache empty */
    TD_FAULT_COUNT
} td_fault;

/* The bit of fault f in td_backend_vt.faults. */
#define TD_FAULT_BIT(f) (UINT64_C(1) << (f))

/* The decode step stale_token hits, and the layer residual_skip hits. */
#define TD_FAULT_STALE_STEP 2
#define TD_FAULT_RESIDUAL_LAYER 1

typedef struct td_fault_info {
    td_fault id;
    const char *name;            /* the --inject name */
    const char *bug;             /* one line: what is wrong */
    const char *first_tap;       /* expected first divergent tap (llama and qwen3moe fixtures) */
    const char *first_tap_qwen3; /* the same on qwen3 (dense) fixtures when it differs, else NULL */
    int first_step;              /* expected step of the first divergence */
    const char *fixtures;        /* where it is visible (the conformance test's set) */
    /* A fault of the state operations (backend.h seq_rm / seq_cp): invisible
     * to a straight forward (bisect), shown by the state-ops check
     * (harness/stateops.h) with its default script, where first_step is the
     * check's step and this names the script operation. NULL otherwise. */
    const char *state_op;
} td_fault_info;

/* Catalog entries 1 .. TD_FAULT_COUNT-1 in order; NULL past the end or for 0. */
const td_fault_info *td_fault_get(td_fault f);
/* NULL or "" -> TD_FAULT_NONE. TD_EINPUT for an unknown name: the message,
 * prefixed by `who`, lists the names. */
int td_fault_parse(const char *who, const char *name, td_fault *out, td_err *err);
/* The expected first divergent tap of fault f on a model of architecture
 * `arch` ("llama", "qwen3", "qwen3moe"). */
const char *td_fault_expected_tap(td_fault f, const char *arch);

/* 1 when fault f is a race: its verdict is `tapdiff determinism`'s
 * "nondeterministic" (exit 5) at 2+ threads, not a tap of bisect (one run
 * may even be right); its first_tap is where it corrupts values. */
int td_fault_is_race(td_fault f);
/* Whether the backend `vt` implements fault f. */
int td_fault_implemented(const td_backend_vt *vt, td_fault f);
/* For `--inject name` on backend vt: TD_OK when it implements the fault (or
 * name is NULL / ""), TD_EINPUT for an unknown name, TD_EUSAGE (exit 2) with
 * the backends that do implement it when vt does not. */
int td_fault_check_backend(const td_backend_vt *vt, const char *name, td_err *err);
/* The backends (registry order) that implement f: "cpu" / "cpu, ..." / "none". */
void td_fault_backends(td_fault f, char *buf, size_t bufsz);

#ifdef __cplusplus
}
#endif
#endif
