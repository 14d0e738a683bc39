/* tapdiff reference forward: the oracle every other arm is compared with.
 *
 * Two backends from one code path (reference_impl.h, compiled twice):
 *   "ref"   computes in double (weights decoded to f64): the oracle;
 *   "ref32" computes the same operations in float (weights decoded to f32):
 *           the control arm, what an honest f32 implementation's error is.
 * Architectures: llama (dense, or Mixtral-style MoE when expert_count > 0),
 * qwen3, qwen3moe. The math is ../shared/spec/primitives.md and arch-*.md.
 *
 * The primitives are exported (f64 and f32) so tests can check each one
 * against hand-worked numbers. Conventions: output first, sizes last; shapes
 * in comments are row-major, outermost first ((T, E) = T rows of E values);
 * letters follow the spec (E, H, Hkv, D, R, F, X, K, T, V). */
#ifndef TD_REFERENCE_H
#define TD_REFERENCE_H

#include <stdint.h>

#include "backend.h"
#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The two backend tables (registered in backends/registry.c). */
extern const td_backend_vt td_ref_backend_f64; /* "ref" */
extern const td_backend_vt td_ref_backend_f32; /* "ref32" */

/* RoPE parameters of primitives.md §2 (scalars as given by the model; each
 * arm converts them to its own precision). */
typedef struct td_ref_rope {
    td_rope_type type;       /* NORM: pairs (x[2i], x[2i+1]); NEOX: (x[i], x[i+R/2]) */
    int64_t D;               /* head dim */
    int64_t R;               /* rotated dims, even, <= D; dims R..D-1 pass unchanged */
    double base;             /* b: omega_i = b^(-2i/R) */
    td_rope_scaling scaling; /* NONE (freq_scale ignored), LINEAR, YARN */
    double freq_scale;       /* 1/factor */
    double attn_factor;      /* magnitude factor (1 = none) */
    double n_ctx_orig;       /* YaRN original context length */
} td_ref_rope;

/* Query head h uses KV head floor(h / (H/Hkv)) (consecutive query heads share
 * one KV head, as HF repeat_kv). Hkv divides H. */
int64_t td_ref_gqa_kv_head(int64_t h, int64_t H, int64_t Hkv);

/* ---- Arithmetic profiles (DESIGN.md "Backends") ------------------------
 *
 * A profile names an arithmetic choice an arm makes on purpose, so that the
 * control arm can make the same one and the budget measures like with like.
 *   "native"  (or NULL / "") every operation as written: f64 in ref, f32 in ref32.
 *   "act-q8"  ref32 only: before each matmul, every activation row is rounded
 *             the way llama.cpp's CPU matmul converts it for that weight type
 *             (../shared/spec/quants.md §8): F32 weights keep f32 activations;
 *             F16 / BF16 weights see them rounded to f16 / bf16; Q4_0, Q5_0,
 *             Q8_0, IQ4_NL, MXFP4, NVFP4, Q1_0, Q2_0 weights see Q8_0 blocks;
 *             Q4_1, Q5_1 see Q8_1 blocks (the same values as Q8_0); K-quants,
 *             IQ1/2/3, IQ4_XS, TQ1_0, TQ2_0 see Q8_K blocks. Embedding
 *             lookups stay exact; attention (f32 KV cache) is untouched. The
 *             dot product is then the reference's own f32 loop over the
 *             rounded values: only the summation order differs from
 *             llama.cpp's integer kernels (f32 rounding, ~1e-7). */
#define TD_PROFILE_NATIVE "native"
#define TD_PROFILE_ACT_Q8 "act-q8"

typedef enum td_ref_profile {
    TD_REF_PROFILE_NATIVE = 0,
    TD_REF_PROFILE_ACT_Q8 = 1,
} td_ref_profile;

/* "native" / NULL / "" -> NATIVE, "act-q8" -> ACT_Q8; -1 for anything else. */
int td_ref_profile_parse(const char *name, td_ref_profile *out);

/* The activation format llama.cpp converts to before a dot with a weight. */
typedef enum td_ref_act_fmt {
    TD_ACT_F32 = 0,  /* unchanged */
    TD_ACT_F16 = 1,  /* f32 -> f16 -> f32, round to nearest even */
    TD_ACT_BF16 = 2, /* f32 -> bf16 -> f32, round to nearest even */
    TD_ACT_Q8_0 = 3, /* blocks of 32, f16 scale */
    TD_ACT_Q8_1 = 4, /* blocks of 32, f16 scale (+ a sum the values do not use) */
    TD_ACT_Q8_K = 5, /* blocks of 256, f32 scale */
} td_ref_act_fmt;

/* The format for a weight of td_type `weight_type`; -1 when the type is not
 * a matmul weight type (I8..I64, F64, Q8_1/Q8_K themselves, unknown ids). */
int td_ref_act_format(int weight_type, td_ref_act_fmt *out);

/* Values per block of the format (1 for F32/F16/BF16, 32, or 256). */
int64_t td_ref_act_block(td_ref_act_fmt fmt);

/* out (n) = x (n) as the dot product sees it after conversion to `fmt`:
 * the dequantized values d*q of the activation blocks. n is a multiple of
 * td_ref_act_block(fmt). out may alias x. Exact formulas, as on the pinned
 * haswell (AVX2) CPU variant of the llama.cpp peer:
 *   Q8_0 / Q8_1, per block of 32: a = max|x|; d = a/127 (f32), stored as
 *     f16(d) (round to nearest even); q = rint(x * (a ? 127/a : 0)) (f32
 *     product, ties to even), in [-127, 127]; value f16(d) * q.
 *   Q8_K, per block of 256: m = the first x of largest |x|; all 0 when m = 0;
 *     s = -127/m (f32); q = min(127, rint(s * x)) (ties to even); d = 1/s
 *     (f32); value d * q. */
void td_ref_act_round_f32(float *out, const float *x, int64_t n, td_ref_act_fmt fmt);

/* ---- f64 primitives --------------------------------------------------- */

/* out (n) = w (n) * x / sqrt(mean(x^2) + eps). out may alias x. */
void td_ref_rmsnorm_f64(double *out, const double *x, const double *w, double eps, int64_t n);
/* out (n) = exp(x - max) / sum(exp(x - max)), summed in index order. out may alias x. */
void td_ref_softmax_f64(double *out, const double *x, int64_t n);
/* out (n) = silu(gate) * up, silu(z) = z / (1 + exp(-z)). */
void td_ref_swiglu_f64(double *out, const double *gate, const double *up, int64_t n);
/* Rotates x (n_heads, D) in place for position pos. ff (R/2): frequency
 * factors (rope_freqs), NULL = none. */
void td_ref_rope_f64(double *x, int64_t pos, const td_ref_rope *c, const double *ff, int64_t n_heads);
/* Causal GQA attention. q (T, H*D); k, v (n_kv, Hkv*D) indexed by position;
 * token t sees cached positions 0..pos[t] (pos[t] < n_kv). att: scratch of
 * max(pos)+1 values. out (T, H*D). Scale 1/sqrt(D). */
void td_ref_attention_f64(double *out, const double *q, const double *k, const double *v, const int64_t *pos,
                          double *att, int64_t T, int64_t H, int64_t Hkv, int64_t D);
/* MoE routing of one token (primitives §5): topk (K) = indices of the K
 * largest probs (X), largest first; among EQUAL probabilities the LOWER
 * expert index ranks first (what a stable descending sort gives; llama.cpp
 * leaves this order unspecified). weights (K) = probs[topk] / max(sum, 2^-14),
 * the sum taken in rank order. The rule is backends/forward.h's
 * td_moe_route_*, shared by every backend; these are its reference names. */
void td_ref_moe_route_f64(int32_t *topk, double *weights, const double *probs, int64_t X, int64_t K);

/* ---- f32 primitives (ref32): the same code computing in float ---------- */

void td_ref_rmsnorm_f32(float *out, const float *x, const float *w, float eps, int64_t n);
void td_ref_softmax_f32(float *out, const float *x, int64_t n);
void td_ref_swiglu_f32(float *out, const float *gate, const float *up, int64_t n);
void td_ref_rope_f32(float *x, int64_t pos, const td_ref_rope *c, const float *ff, int64_t n_heads);
void td_ref_attention_f32(float *out, const float *q, const float *k, const float *v, const int64_t *pos,
                          float *att, int64_t T, int64_t H, int64_t Hkv, int64_t D);
void td_ref_moe_route_f32(int32_t *topk, float *weights, const float *probs, int64_t X, int64_t K);

#ifdef __cplusplus
}
#endif
#endif
