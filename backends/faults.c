/* tapdiff: the fault-injection catalog every backend shares (faults.h). */
#include "faults.h"

#include <stdio.h>
#include <string.h>

static const td_fault_info catalog[TD_FAULT_COUNT] = {
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
    [TD_FAULT_CUDA_SYNC_MISSING] = {TD_FAULT_CUDA_SYNC_MISSING, "cuda_sync_missing",
                                    "the RMSNorm block reduction lacks the __syncthreads between writing and "
                                    "reading its per-warp partial sums (a race: warps read stale shared memory)",
                                    "blk.0.attn_norm", NULL, 0,
                                    "llama-f32, qwen3-f32, qwen3moe-f32 (cuda only; a race, so where it shows "
                                    "is what the device check verifies)"},
    [TD_FAULT_CUDA_SMEM_STRIDE] = {TD_FAULT_CUDA_SMEM_STRIDE, "cuda_smem_stride",
                                   "attention writes its scores to shared memory with stride 1 and reads them "
                                   "with stride 2",
                                   "blk.0.attn_ctx", NULL, 0,
                                   "llama-f32, qwen3-f32, qwen3moe-f32 (cuda only; prefill positions > 0)"},
    [TD_FAULT_ROLLBACK_STALE_KV] = {TD_FAULT_ROLLBACK_STALE_KV, "rollback_stale_kv",
                                    "a rollback moves the position counter back but leaves the dropped K/V rows "
                                    "in the cache, where the next forwards still attend to them",
                                    "blk.0.attn_ctx", NULL, 7,
                                    "every attention fixture, through tapdiff stateops only (its default script: "
                                    "the first decode after 'rollback 3')",
                                    "decode 5"},
    [TD_FAULT_SEQ_COPY_SHORT] = {TD_FAULT_SEQ_COPY_SHORT, "seq_copy_short",
                                 "a sequence copy misses the source's last position (its K/V row left empty in "
                                 "the copy)",
                                 "blk.0.attn_ctx", NULL, 16,
                                 "every attention fixture, through tapdiff stateops only (its default script: "
                                 "the first decode on the copy)",
                                 "decode 4 on 1"},
};

const td_fault_info *td_fault_get(td_fault f) {
    return f > TD_FAULT_NONE && f < TD_FAULT_COUNT ? &catalog[f] : NULL;
}

static void fault_names(char *names, size_t n) {
    names[0] = '\0';
    for (int f = 1; f < TD_FAULT_COUNT; f++) {
        size_t len = strlen(names);
        snprintf(names + len, n - len, "%s%s", f > 1 ? " " : "", catalog[f].name);
    }
}

int td_fault_parse(const char *who, const char *name, td_fault *out, td_err *err) {
    *out = TD_FAULT_NONE;
    if (!name || !name[0]) return TD_OK;
    for (int f = 1; f < TD_FAULT_COUNT; f++)
        if (!strcmp(name, catalog[f].name)) {
            *out = (td_fault)f;
            return TD_OK;
        }
    char names[512];
    fault_names(names, sizeof names);
    return td_err_set(err, TD_EINPUT, "%s: --inject '%s': expected a fault of the catalog (%s)", who, name, names);
}

const char *td_fault_expected_tap(td_fault f, const char *arch) {
    const td_fault_info *fi = td_fault_get(f);
    if (!fi) return NULL;
    return fi->first_tap_qwen3 && arch && !strcmp(arch, "qwen3") ? fi->first_tap_qwen3 : fi->first_tap;
}

int td_fault_implemented(const td_backend_vt *vt, td_fault f) {
    return vt && f > TD_FAULT_NONE && f < TD_FAULT_COUNT && (vt->faults & TD_FAULT_BIT(f)) != 0;
}

void td_fault_backends(td_fault f, char *buf, size_t bufsz) {
    if (!bufsz) return;
    buf[0] = '\0';
    size_t o = 0;
    const td_backend_vt *const *all = td_backend_list();
    for (size_t i = 0; all[i] && o < bufsz; i++)
        if (td_fault_implemented(all[i], f))
            o += (size_t)snprintf(buf + o, bufsz - o, "%s%s", o ? ", " : "", all[i]->name);
    if (!buf[0]) snprintf(buf, bufsz, "none");
}

int td_fault_check_backend(const td_backend_vt *vt, const char *name, td_err *err) {
    td_fault f;
    int rc = td_fault_parse(vt->name, name, &f, err);
    if (rc || f == TD_FAULT_NONE || td_fault_implemented(vt, f)) return rc;
    char who[128];
    td_fault_backends(f, who, sizeof who);
    return td_err_set(err, TD_EUSAGE, "--inject %s: backend '%s' does not implement this fault (implemented by: %s)",
                      name, vt->name, who);
}
