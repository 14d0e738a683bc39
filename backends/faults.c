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
    [TD_FAULT_THREAD_RACE] = {TD_FAULT_THREAD_RACE, "thread_race",
                              "attention tasks write their scores into thread 0's scratch row, whichever thread "
                              "runs them (a shared buffer written without synchronisation)",
                              "blk.0.attn_ctx", NULL, 0,
                              "every fixture, at 2+ threads: `tapdiff determinism` (exit 5), not bisect"},
    [TD_FAULT_SIMD_TAIL] = {TD_FAULT_SIMD_TAIL, "simd_tail",
                            "the f32 dot kernel (8 lanes) never adds the n % 8 tail",
                            "blk.0.attn_ctx", NULL, 0,
                            "qwen3-tails-f32 only (D = 18: the attention scores q.k; the prefill's projections "
                            "run through sgemm)"},
    [TD_FAULT_ODDBLOCK_Q8_0] = {TD_FAULT_ODDBLOCK_Q8_0, "oddblock_q8_0",
                                "the Q8_0 row dot, unrolled by two blocks, drops the last block of an odd count",
                                "blk.0.attn_q", NULL, 1,
                                "qwen3-oddblocks-q8_0 only (3 and 5 blocks per row); step 1 because an 8-token "
                                "prefill takes sgemm, step 0 with TD_CPU_GEMM_MIN_T=1000000 (row kernels)"},
    [TD_FAULT_GDN_L2_EPS] = {TD_FAULT_GDN_L2_EPS, "gdn_l2_eps_outside",
                             "the GDN L2 norm of q and k computes 1/sqrt(sum x^2) + eps: eps outside the square root",
                             "blk.0.ssm_core", NULL, 0,
                             "qwen3next-f32, qwen4exp-f32 (80 tokens; q and k are tapped before the norm)"},
    [TD_FAULT_GDN_CHUNK] = {TD_FAULT_GDN_CHUNK, "gdn_chunk_boundary",
                            "the chunked GDN prefill carries the cumulative log-decay across a chunk start",
                            "blk.0.ssm_core", NULL, 0,
                            "qwen3next-f32, qwen4exp-f32 with a prompt of more than 64 tokens"},
    [TD_FAULT_CONV_SHIFT] = {TD_FAULT_CONV_SHIFT, "conv_state_shift",
                             "a decode step stores its conv input without shifting the conv state (off by one)",
                             "blk.0.ssm_conv_state", NULL, 1,
                             "qwen3next-f32, qwen4exp-f32"
                             " (the first decode step's outputs still read the right window)"},
    [TD_FAULT_GDN_DECAY_AFTER] = {TD_FAULT_GDN_DECAY_AFTER, "gdn_decay_after_update",
                                  "the delta rule decays the state after the rank-1 update instead of before",
                                  "blk.0.ssm_core", NULL, 0,
                                  "qwen3next-f32, qwen4exp-f32 (from the second prompt token)"},
    [TD_FAULT_SHEXP_NO_SIGMOID] = {TD_FAULT_SHEXP_NO_SIGMOID, "shexp_gate_no_sigmoid",
                                   "the shared-expert gate is w.x, without its sigmoid", "blk.0.ffn_shexp_gate", NULL,
                                   0, "qwen3next-f32"},
    [TD_FAULT_ROPE_PARTIAL_ALL] = {TD_FAULT_ROPE_PARTIAL_ALL, "rope_partial_all_dims",
                                   "partial RoPE (R < D) rotates all D dims of each head",
                                   "blk.3.attn_q_rope", NULL, 0,
                                   "qwen3next-f32 (R = 16 < D = 64; block 3 is its attention block)"},
    [TD_FAULT_GDN_ROLLBACK_STALE] = {TD_FAULT_GDN_ROLLBACK_STALE, "gdn_rollback_stale",
                                     "a rollback moves the position back and drops the K/V rows but keeps the "
                                     "recurrent (GDN conv and delta-rule) state of the dropped positions",
                                     "blk.0.ssm_q", NULL, 7,
                                     "qwen3next-f32, qwen3next-q8_0, through tapdiff stateops only (its default "
                                     "script: the first decode after 'rollback 3')",
                                     "decode 5"},
    // qwen4exp (8-token prompt): block 1 has r = 4, W = B + r - 1 = 11, so its selection is sparse from
    // position 11 on (decode step 4); blocks 0 and 2 are GDN, block 0 the PLE layer
    [TD_FAULT_QSA_TOPK_SKIP] = {TD_FAULT_QSA_TOPK_SKIP, "qsa_topk_skip",
                                "the QSA block ranking starts at its second entry: the best-scoring complete block "
                                "is never selected (an off-by-one in the top-k walk)",
                                "blk.1.qsa_sel", NULL, 4,
                                "qwen4exp-f32, qwen4exp-q8_0 (the first sparse selection: position 11 of block 1)"},
    [TD_FAULT_PLE_HASH32] = {TD_FAULT_PLE_HASH32, "ple_hash32",
                             "the PLE hash of the longest n-gram order multiplies in 32 bits (wraps mod 2^32, not "
                             "2^64)",
                             "inp.ple_rows", NULL, 0, "qwen4exp-f32, qwen4exp-q8_0, qwen4exp-ties"},
    [TD_FAULT_HC_INJECT_STREAM] = {TD_FAULT_HC_INJECT_STREAM, "hc_inject_stream",
                                   "the HC combine after attention weights stream c by stream c+1's inject",
                                   "blk.0.ffn_inp", NULL, 0, "qwen4exp-f32, qwen4exp-q8_0, qwen4exp-ties"},
    [TD_FAULT_QSA_COPY_NO_IKEY] = {TD_FAULT_QSA_COPY_NO_IKEY, "qsa_copy_no_indexer",
                                   "a sequence copy copies the K/V rows, the recurrent state and the token history "
                                   "but leaves the copy's QSA indexer key cache empty",
                                   "blk.1.qsa_scores", NULL, 16,
                                   "qwen4exp-f32, qwen4exp-q8_0, through tapdiff stateops only (its default script: "
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

int td_fault_is_race(td_fault f) {
    return f == TD_FAULT_THREAD_RACE;
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
