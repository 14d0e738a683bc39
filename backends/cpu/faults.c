/* tapdiff "cpu": the fault-injection catalog and the faulty code paths that
 * do not fit in one expression of cpu.c (see faults.h). Each faulty path is
 * written from the spec's correct formula with exactly one thing changed, so
 * the bug is the one the catalog names and nothing else. */
#include "faults.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "blocks.h"
#include "types.h"

static const td_cpu_fault_info catalog[TD_FAULT_COUNT] = {
    [TD_FAULT_ROPE_PAIRING] = {TD_FAULT_ROPE_PAIRING, "rope_pairing",
                               "RoPE pairs NEOX halves on NORM models and adjacent values on NEOX models",
                               "blk.0.attn_q_rope", NULL, 0,
                               "llama-f32, qwen3-f32, qwen3moe-f32 (positions > 0 of the prefill)"},
    [TD_FAULT_STALE_TOKEN] = {TD_FAULT_STALE_TOKEN, "stale_token",
                              "decode step 2 consumes token 0 instead of the token it was fed",
                              "inp.tokens", NULL, TD_FAULT_STALE_STEP,
                              "every fixture (when the fed token is not 0); also the greedy self-check"},
    [TD_FAULT_RMSNORM_EPS] = {TD_FAULT_RMSNORM_EPS, "rmsnorm_eps_outside",
                              "RMSNorm computes 1/sqrt(mean(x^2)) + eps: eps outside the square root",
                              "blk.0.attn_norm", NULL, 0, "llama-f32, qwen3-f32, qwen3moe-f32"},
    [TD_FAULT_ROUTER_TIEBREAK] = {TD_FAULT_ROUTER_TIEBREAK, "router_tiebreak",
                                  "equal router probabilities rank the HIGHER expert index first",
                                  "blk.0.moe_topk", NULL, 0,
                                  "qwen3moe-ties only (integer mismatch at the even, tied, tokens)"},
    [TD_FAULT_MOE_NO_RENORM] = {TD_FAULT_MOE_NO_RENORM, "moe_no_renorm",
                                "the K selected expert probabilities are used without renormalising to sum 1",
                                "blk.0.moe_weights", NULL, 0, "qwen3moe-f32"},
    [TD_FAULT_KQUANT_SCALE_BIT] = {TD_FAULT_KQUANT_SCALE_BIT, "kquant_scale_bit",
                                   "the Q4_K decoder reads bit 0 of sub-block 0's 6-bit scale inverted",
                                   "blk.0.ffn_out", "blk.0.attn_out", 0,
                                   "*-q4_k only: the first product with a Q4_K weight (ffn_down; qwen3: "
                                   "attn_output)"},
    [TD_FAULT_KV_POS] = {TD_FAULT_KV_POS, "kv_pos_off_by_one",
                         "decode steps write K/V at position p-1 (over the previous token) and attend to 0..p-1",
                         "blk.0.attn_ctx", NULL, 1,
                         "llama-f32, qwen3-f32, qwen3moe-f32 (the prefill, at p = 0.., is untouched)"},
    [TD_FAULT_GQA_MAP_MOD] = {TD_FAULT_GQA_MAP_MOD, "gqa_map_mod",
                              "query head h reads KV head h mod Hkv instead of h / (H/Hkv)",
                              "blk.0.attn_ctx", NULL, 0, "llama-f32, qwen3-f32, qwen3moe-f32 (H=4, Hkv=2)"},
    [TD_FAULT_ATTN_SCALE] = {TD_FAULT_ATTN_SCALE, "attn_scale_1_over_d",
                             "attention scores scaled by 1/D instead of 1/sqrt(D)", "blk.0.attn_ctx", NULL, 0,
                             "llama-f32, qwen3-f32, qwen3moe-f32"},
    [TD_FAULT_RESIDUAL_SKIP] = {TD_FAULT_RESIDUAL_SKIP, "residual_skip",
                                "layer 1 (layer 0 in a one-layer model) drops the attention residual: "
                                "ffn_inp = attn_out",
                                "blk.1.ffn_inp", NULL, 0, "llama-f32, qwen3-f32, qwen3moe-f32"},
    [TD_FAULT_IQ_SIGN_BIT] = {TD_FAULT_IQ_SIGN_BIT, "iq_sign_bit",
                              "the IQ2_XXS decoder takes element 0's sign from bit 1 of its group's sign mask",
                              "blk.0.ffn_out", NULL, 0,
                              "*-iq2_xxs only: the first product with an IQ2_XXS weight (ffn_down)"},
};

const td_cpu_fault_info *td_cpu_fault_get(td_cpu_fault f) {
    return f > TD_FAULT_NONE && f < TD_FAULT_COUNT ? &catalog[f] : NULL;
}

int td_cpu_fault_parse(const char *name, td_cpu_fault *out, td_err *err) {
    *out = TD_FAULT_NONE;
    if (!name || !name[0]) return TD_OK;
    for (int f = 1; f < TD_FAULT_COUNT; f++)
        if (!strcmp(name, catalog[f].name)) {
            *out = (td_cpu_fault)f;
            return TD_OK;
        }
    char names[512] = "";
    for (int f = 1; f < TD_FAULT_COUNT; f++) {
        size_t len = strlen(names);
        snprintf(names + len, sizeof names - len, "%s%s", f > 1 ? " " : "", catalog[f].name);
    }
    return td_err_set(err, TD_EINPUT, "cpu: --inject '%s': expected a fault of the catalog (%s)", name, names);
}

const char *td_cpu_fault_expected_tap(td_cpu_fault f, const char *arch) {
    const td_cpu_fault_info *fi = td_cpu_fault_get(f);
    if (!fi) return NULL;
    return fi->first_tap_qwen3 && arch && !strcmp(arch, "qwen3") ? fi->first_tap_qwen3 : fi->first_tap;
}

/* ---- kquant_scale_bit --------------------------------------------------- */

/* Q4_K block (primitives: 256 values, 144 bytes): f16 d, f16 dmin, 12 bytes
 * of packed 6-bit scales/mins, 128 bytes of nibbles. Byte 4 is the first
 * scale byte; its low 6 bits are sub-block 0's scale. */
#define Q4K_VALUES 256
#define Q4K_BYTES 144
#define Q4K_SCALE0_BYTE 4

static void q4k_to_f32_faulty(int type, const void *w, float *dst, int64_t n) {
    const uint8_t *src = w;
    uint8_t blk[Q4K_BYTES];
    for (int64_t i = 0; i < n / Q4K_VALUES; i++) {
        memcpy(blk, src + i * Q4K_BYTES, Q4K_BYTES);
        blk[Q4K_SCALE0_BYTE] ^= 1; // the one wrong bit
        td_err err = {{0}};
        int rc = td_decode_row_f32(type, blk, dst + i * Q4K_VALUES, Q4K_VALUES, &err);
        TD_ASSERT(rc == TD_OK); // the type and size were checked at open
    }
}

/* ---- iq_sign_bit ---------------------------------------------------------- */

static void iq2xxs_to_f32_faulty(int type, const void *w, float *dst, int64_t n) {
    (void)type;
    const uint8_t *src = w;
    double y[8];
    for (int64_t i = 0; i < n / TD_QK_K; i++) {
        const uint8_t *b = src + i * (int64_t)sizeof(td_blk_iq2_xxs);
        const double d = td_blk_f16(td_blk_u16(b + offsetof(td_blk_iq2_xxs, d)));
        for (int g = 0; g < 32; g++) {
            td_iq_group q = td_iq2_xxs_group(b, g);
            uint8_t neg = (uint8_t)((q.neg & ~1u) | ((q.neg >> 1) & 1u)); // the bug: bit 1 for element 0
            td_iq_dec_grid8(d * q.mul / 8, td_iq2xxs_grid[q.idx], neg, y);
            for (int j = 0; j < 8; j++) dst[i * TD_QK_K + 8 * g + j] = (float)y[j];
        }
    }
}

void td_cpu_fault_patch_kernels(td_cpu_kernels *k, td_cpu_fault f) {
    if (f == TD_FAULT_IQ_SIGN_BIT) {
        td_cpu_type_ops *op = &k->type[TD_TYPE_IQ2_XXS];
        op->to_f32 = iq2xxs_to_f32_faulty;
        op->dot = NULL; // every product decodes the row through the faulty decoder
        op->dot_q8 = NULL;
        op->needs_xsum = 0;
        return;
    }
    if (f != TD_FAULT_KQUANT_SCALE_BIT) return;
    TD_ASSERT(td_type_get(TD_TYPE_Q4_K)->block_bytes == Q4K_BYTES &&
              td_type_get(TD_TYPE_Q4_K)->block_size == Q4K_VALUES);
    td_cpu_type_ops *op = &k->type[TD_TYPE_Q4_K];
    op->to_f32 = q4k_to_f32_faulty;
    op->dot = NULL;    // every product decodes the row through the faulty decoder
    op->dot_q8 = NULL;
    op->needs_xsum = 0;
}

/* ---- rmsnorm_eps_outside ------------------------------------------------ */

void td_cpu_fault_rmsnorm_rows(float *out, const float *x, const float *w, float eps, int64_t rows, int64_t n) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        float *o = out + r * n;
        double ss = 0;
        for (int64_t i = 0; i < n; i++) ss += (double)xr[i] * xr[i];
        const float inv = (float)(1.0 / sqrt(ss / (double)n) + (double)eps); // the bug: eps outside
        for (int64_t i = 0; i < n; i++) o[i] = w[i] * (xr[i] * inv);
    }
}

/* ---- router_tiebreak, moe_no_renorm ------------------------------------- */

void td_cpu_fault_moe_route(int32_t *topk, float *w, const float *probs, int64_t X, int64_t K, int tie_high,
                            int renorm) {
    for (int64_t j = 0; j < K; j++) {
        int64_t best = -1;
        for (int64_t e = 0; e < X; e++) {
            int taken = 0;
            for (int64_t i = 0; i < j; i++) taken |= topk[i] == e;
            if (taken) continue;
            // tie_high: a later (higher) index wins an exact tie
            if (best < 0 || probs[e] > probs[best] || (tie_high && probs[e] == probs[best])) best = e;
        }
        topk[j] = (int32_t)best;
    }
    float sum = 0;
    for (int64_t j = 0; j < K; j++) sum += probs[topk[j]];
    const float z = !renorm ? 1.0f : sum > 0x1p-14f ? sum : 0x1p-14f;
    for (int64_t j = 0; j < K; j++) w[j] = probs[topk[j]] / z;
}
