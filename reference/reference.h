/* tapdiff reference forward: the oracle every other arm is compared with.
 *
 * Two backends from one code path (reference_impl.h, compiled twice):
 *   "ref"   computes in double (weights decoded to f64): the oracle;
 *   "ref32" computes the same operations in float (weights decoded to f32):
 *           the control arm, what an honest f32 implementation's error is.
 * Architectures: llama (dense, or Mixtral-style MoE when expert_count > 0),
 * qwen3, qwen3moe, qwen3next, qwen4exp. The math is ../shared/spec/primitives.md and
 * arch-*.md.
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
#include "profile.h"

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
    int angle;               /* td_rope_angle (backends/profile.h): 0 = exact; rope-f32-mul/-pow: formed in f32 */
    int64_t trig_u;          /* rope-trig@U; 0 = none. Only ref32 (the control) uses it: td_rope_trig_offset_u */
} td_ref_rope;

/* Query head h uses KV head floor(h / (H/Hkv)) (consecutive query heads share
 * one KV head, as HF repeat_kv). Hkv divides H. */
int64_t td_ref_gqa_kv_head(int64_t h, int64_t H, int64_t Hkv);

/* Arithmetic profiles (the rules ref and ref32 apply, and their rounding
 * formulas) are backends/profile.h: both arms accept any profile; ref keeps
 * everything the rules do not round in f64 (the profile-matched oracle). */

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
/* In place: x (n) / sqrt(sum(x^2) + eps), eps on the SUM (primitives §1.1,
 * the Gated DeltaNet's q/k norm). */
void td_ref_l2norm_f64(double *x, int64_t n, double eps);
/* One token of the Gated DeltaNet delta rule for one value head
 * (arch-qwen3next.md §4.2 step 7): S (dk x dk, S[i][j] at j*dk + i for key
 * index i, value index j) <- exp(gamma) S; e = S^T k; S += k (beta (v - e))^T;
 * o (dk) = S^T q / sqrt(dk) with the updated S. q, k already L2-normed. */
void td_ref_gdn_step_f64(double *S, double *o, const double *q, const double *k, const double *v, double gamma,
                         double beta, int64_t dk);
/* a . b (n) with an f16 accumulator, as ggml-vulkan's tiled matmul sums a
 * quantized weight on lavapipe (profile acc-f16): k in groups of g, each group
 * from its last element down to its first, groups in increasing k; every
 * product rounded to f16, then every sum. a, b hold f16 values. */
double td_ref_dot_acc16_f64(const double *a, const double *b, int64_t n, int64_t g);

/* qwen4exp (arch-qwen4exp.md §4). IMROPE: NEOX pairing, pair i's angle from
 * position component td_ref_imrope_component(i) of pos4; no YaRN. */
void td_ref_rope_imrope_f64(double *x, const int64_t *pos4, const td_ref_rope *c, const uint32_t *sections,
                            int64_t n_heads);
/* HC mixer of one token (§4.1): Rs (hc, E) streams, gamma (hc, E), Wdn (lr,
 * hc*E), Wup (hc*E, lr), Winj (hc, hc*E) or NULL (row-major: row o = output
 * o). mixed (E); inj (hc) when Winj; scratch: flat (hc*E), lam (lr), gam
 * (hc*E). */
void td_ref_hc_mix_f64(double *mixed, double *inj, double *flat, double *lam, double *gam, const double *Rs,
                       const double *gamma, const double *Wdn, const double *Wup, const double *Winj, int64_t hc,
                       int64_t E, int64_t lr, double eps);
/* HC combine (§4.1): Rs[c] += 2 sigmoid(inj[c] / hc) y for every stream c. */
void td_ref_hc_combine_f64(double *Rs, const double *y, const double *inj, int64_t hc, int64_t E);
/* QSA block score (§4.5 step 5): sum over the H_i heads of max(0, q_i . kb);
 * q (H_i, d_i) rotated and normed queries, kb (d_i) the block's key. */
double td_ref_qsa_block_score_f64(const double *q, const double *kb, int64_t H_i, int64_t d_i);
/* QSA selection for the query at position p (§4.5 steps 6-8) with blocks of
 * r positions, budget W = B + r - 1 and score[b] for the complete blocks b <
 * floor((p+1)/r): every position when p + 1 <= W; else the tail
 * floor((p+1)/r)*r..p, then the complete blocks by descending score until W
 * positions are used. tapdiff's order where llama.cpp's is unspecified
 * (§7.1): among EQUAL block scores the lower block first; a block cut by the
 * budget keeps its LOWEST positions. sel: the selected positions, ascending;
 * returns their count, min(p + 1, W). */
int64_t td_ref_qsa_select_f64(int64_t *sel, const double *score, int64_t p, int64_t r, int64_t W);

/* ---- f32 primitives (ref32): the same code computing in float ---------- */

void td_ref_rmsnorm_f32(float *out, const float *x, const float *w, float eps, int64_t n);
void td_ref_softmax_f32(float *out, const float *x, int64_t n);
void td_ref_swiglu_f32(float *out, const float *gate, const float *up, int64_t n);
void td_ref_rope_f32(float *x, int64_t pos, const td_ref_rope *c, const float *ff, int64_t n_heads);
void td_ref_attention_f32(float *out, const float *q, const float *k, const float *v, const int64_t *pos,
                          float *att, int64_t T, int64_t H, int64_t Hkv, int64_t D);
void td_ref_moe_route_f32(int32_t *topk, float *weights, const float *probs, int64_t X, int64_t K);
void td_ref_l2norm_f32(float *x, int64_t n, float eps);
void td_ref_gdn_step_f32(float *S, float *o, const float *q, const float *k, const float *v, float gamma, float beta,
                         int64_t dk);
float td_ref_dot_acc16_f32(const float *a, const float *b, int64_t n, int64_t g);
void td_ref_rope_imrope_f32(float *x, const int64_t *pos4, const td_ref_rope *c, const uint32_t *sections,
                            int64_t n_heads);
void td_ref_hc_mix_f32(float *mixed, float *inj, float *flat, float *lam, float *gam, const float *Rs,
                       const float *gamma, const float *Wdn, const float *Wup, const float *Winj, int64_t hc,
                       int64_t E, int64_t lr, float eps);
void td_ref_hc_combine_f32(float *Rs, const float *y, const float *inj, int64_t hc, int64_t E);
float td_ref_qsa_block_score_f32(const float *q, const float *kb, int64_t H_i, int64_t d_i);
int64_t td_ref_qsa_select_f32(int64_t *sel, const float *score, int64_t p, int64_t r, int64_t W);

/* ---- qwen4exp primitives (arch-qwen4exp.md §4): integer parts ---------- */

/* PLE n-gram context of position p (§4.6): ctx[0] = tok[p] (image_id when
 * tok[p] < 0, an embedding input); for s = 1..n_g-1, ctx[s] = tok[p-s] until
 * a predecessor is missing (p-s < 0, or tok[p-s] < 0) or equals eos, and eos
 * from there on (an EOS at p itself does not cut). tok: ids of positions
 * 0..p of the sequence. */
void td_ref_ple_context(int64_t *ctx, const int32_t *tok, int64_t p, uint32_t n_g, int64_t eos, int64_t image_id);
/* PLE table rows of one position (§4.6): for n = 2..n_g, X_n = XOR_{i<n}
 * (ctx[i] * mult[i]) in unsigned 64-bit arithmetic (products wrap mod 2^64);
 * head h = (n-2)*h_g + j takes row (X_n mod vsz[h]) + off[h]. rows:
 * (n_g-1)*h_g entries, head-major. */
void td_ref_ple_rows(int64_t *rows, const int64_t *ctx, uint32_t n_g, uint32_t h_g, const uint64_t *mult,
                     const uint64_t *off, const uint64_t *vsz);
/* Which position component rotates pair i under IMROPE (primitives §2.2):
 * 0 = p_t, 1 = p_h, 2 = p_w, 3 = p_e. sections: [s0, s1, s2, s3], sum > 0. */
int td_ref_imrope_component(int64_t i, const uint32_t *sections);

#ifdef __cplusplus
}
#endif
#endif
