/* tapdiff: the architecture table (arch.h) and the descriptors' hooks. The
 * three architectures of today share one attention-layer binder and one
 * FFN/expert reader, steered by their traits; an architecture whose layers
 * or keys differ brings its own hooks here.
 * Facts: ../shared/spec/arch-{llama,qwen3,qwen3moe}.md.
 *
 * Decisions where the spec leaves room (documented for the forwards):
 * - qwen3 (dense) does not read <arch>.expert_* (arch-qwen3.md "Not read"):
 *   an expert_count there is ignored, the model stays dense.
 * - llama with expert_count > 0 is a Mixtral-style MoE; F = feed_forward_length.
 * - Fused attn_qkv together with separate attn_q/k/v is ambiguous: refused.
 * - Dense FFN biases have no slot in td_ffn_parts: refused, not ignored. */
#include "arch.h"

#include <stdio.h>
#include <string.h>

#define TRY(x)                                                                                                       \
    do {                                                                                                             \
        int st_ = (x);                                                                                               \
        if (st_ != TD_OK) return st_;                                                                                \
    } while (0)

/* ------------------------------------------------------------------------ */
/* Hyper-parameters: FFN width and experts                                    */

static int read_ffn(const td_binder *b, td_hparams *hp) {
    const char *P = b->g->path, *A = b->arch;
    const unsigned traits = td_arch_get(hp->arch)->traits;
    const uint32_t L = hp->n_layer;
    const int moe = (traits & TD_ARCH_T_MOE) != 0;
    if (moe) {
        TRY(td_bind_u32(b, "expert_count", 1, 0, 0, &hp->n_expert));
        TRY(td_bind_u32(b, "expert_used_count", 1, 0, L, &hp->n_expert_used));
    } else if (traits & TD_ARCH_T_MOE_OPTIONAL) {
        TRY(td_bind_u32(b, "expert_count", 0, 0, 0, &hp->n_expert));
        TRY(td_bind_u32(b, "expert_used_count", 0, 0, L, &hp->n_expert_used));
        if (hp->n_expert == 0 && hp->n_expert_used != 0)
            return td_err_set(b->err, TD_EINPUT,
                              "%s: key '%s.expert_used_count': expected 0 for a dense model (no %s.expert_count), "
                              "found K = %u",
                              P, A, A, hp->n_expert_used);
    } /* dense-only architectures do not read expert_* (see the file comment) */

    const uint32_t X = hp->n_expert, K = hp->n_expert_used;
    if (moe && X == 0)
        return td_err_set(b->err, TD_EINPUT, "%s: key '%s.expert_count': expected X > 0 for an MoE model, found 0", P,
                          A);
    if (X > 0 && K == 0)
        return td_err_set(b->err, TD_EINPUT, "%s: key '%s.expert_used_count': expected 1 <= K <= X = %u, found K = 0%s",
                          P, A, X, td_bind_has(b, "expert_used_count") ? "" : " (key absent)");
    if (X > 0 && K > X)
        return td_err_set(b->err, TD_EINPUT,
                          "%s: key '%s.expert_used_count': expected K <= expert_count X = %u, found K = %u", P, A, X,
                          K);

    if (moe) {
        /* F = expert_feed_forward_length, else llama.cpp's fallback n_ff / K */
        uint32_t n_ff = 0;
        TRY(td_bind_u32(b, "feed_forward_length", 0, 0, L, &n_ff));
        if (td_bind_has(b, "expert_feed_forward_length")) {
            TRY(td_bind_u32(b, "expert_feed_forward_length", 0, 0, L, &hp->n_ff));
            if (hp->n_ff == 0)
                return td_err_set(b->err, TD_EINPUT,
                                  "%s: key '%s.expert_feed_forward_length': expected F > 0, found 0", P, A);
        } else {
            hp->n_ff = n_ff / K;
            if (hp->n_ff == 0)
                return td_err_set(b->err, TD_EINPUT,
                                  "%s: required key '%s.expert_feed_forward_length' is missing and the fallback "
                                  "feed_forward_length / K = %u / %u gives F = 0 (expected F > 0)",
                                  P, A, n_ff, K);
        }
    } else {
        /* dense and Mixtral-style experts both use feed_forward_length */
        TRY(td_bind_u32(b, "feed_forward_length", 1, 0, L, &hp->n_ff));
        if (hp->n_ff == 0)
            return td_err_set(b->err, TD_EINPUT, "%s: key '%s.feed_forward_length': expected F > 0, found 0", P, A);
    }
    return TD_OK;
}

/* ------------------------------------------------------------------------ */
/* Layers                                                                     */

static td_layer_kind all_attention(const td_hparams *hp, uint32_t il) {
    (void)hp, (void)il;
    return TD_LAYER_ATTENTION;
}

static int bind_attention(const td_binder *b, const td_hparams *hp, unsigned traits, uint32_t il, td_attn_parts *a) {
    const uint64_t E = hp->n_embd, H = hp->n_head, Hkv = hp->n_head_kv, D = hp->head_dim;
    const uint64_t HD = td_bind_mul_sat(H, D), HkvD = td_bind_mul_sat(Hkv, D);
    const uint64_t QKV = td_bind_mul_sat(H + 2 * Hkv, D);
    char n[96];
#define NM(s) (snprintf(n, sizeof n, "blk.%u." s, il), n)
    TRY(td_bind_tensor(b, NM("attn_norm.weight"), TD_BIND_REQ, 1, E, 0, 0, &a->norm));

    /* q/k/v: separate, or fused rows [Q; K; V] */
    TRY(td_bind_tensor(b, NM("attn_qkv.weight"), TD_BIND_OPT, 2, E, QKV, 0, &a->wqkv));
    if (a->wqkv) {
        static const char *const sep[] = {"attn_q.weight", "attn_k.weight", "attn_v.weight",
                                          "attn_q.bias", "attn_k.bias", "attn_v.bias"};
        for (size_t i = 0; i < sizeof sep / sizeof sep[0]; i++) {
            snprintf(n, sizeof n, "blk.%u.%s", il, sep[i]);
            TRY(td_bind_refuse(b, n, "the block has a fused attn_qkv.weight; separate and fused q/k/v are ambiguous"));
        }
        TRY(td_bind_tensor(b, NM("attn_qkv.bias"), TD_BIND_OPT, 1, QKV, 0, 0, &a->bqkv));
    } else {
        TRY(td_bind_tensor(b, NM("attn_q.weight"), TD_BIND_REQ, 2, E, HD, 0, &a->wq));
        TRY(td_bind_tensor(b, NM("attn_k.weight"), TD_BIND_REQ, 2, E, HkvD, 0, &a->wk));
        TRY(td_bind_tensor(b, NM("attn_v.weight"), TD_BIND_REQ, 2, E, HkvD, 0, &a->wv));
        TRY(td_bind_tensor(b, NM("attn_q.bias"), TD_BIND_OPT, 1, HD, 0, 0, &a->bq));
        TRY(td_bind_tensor(b, NM("attn_k.bias"), TD_BIND_OPT, 1, HkvD, 0, 0, &a->bk));
        TRY(td_bind_tensor(b, NM("attn_v.bias"), TD_BIND_OPT, 1, HkvD, 0, 0, &a->bv));
        TRY(td_bind_refuse(b, NM("attn_qkv.bias"), "a fused bias without a fused attn_qkv.weight"));
    }
    TRY(td_bind_tensor(b, NM("attn_output.weight"), TD_BIND_REQ, 2, HD, E, 0, &a->wo));
    /* qwen3's graph has no output bias (arch-qwen3.md §2): left unbound there */
    if (traits & TD_ARCH_T_ATTN_OUT_BIAS) TRY(td_bind_tensor(b, NM("attn_output.bias"), TD_BIND_OPT, 1, E, 0, 0, &a->bo));
    if (traits & TD_ARCH_T_QK_NORM) {
        TRY(td_bind_tensor(b, NM("attn_q_norm.weight"), TD_BIND_REQ, 1, D, 0, 0, &a->q_norm));
        TRY(td_bind_tensor(b, NM("attn_k_norm.weight"), TD_BIND_REQ, 1, D, 0, 0, &a->k_norm));
    }
#undef NM
    return TD_OK;
}

static int bind_ffn(const td_binder *b, const td_hparams *hp, unsigned traits, uint32_t il, td_ffn_parts *f) {
    const uint64_t E = hp->n_embd, F = hp->n_ff, X = hp->n_expert;
    char n[96];
#define NM(s) (snprintf(n, sizeof n, "blk.%u." s, il), n)
    TRY(td_bind_tensor(b, NM("ffn_norm.weight"), TD_BIND_REQ, 1, E, 0, 0, &f->norm));
    if (X == 0) {
        TRY(td_bind_tensor(b, NM("ffn_gate.weight"), TD_BIND_REQ, 2, E, F, 0, &f->gate));
        TRY(td_bind_tensor(b, NM("ffn_up.weight"), TD_BIND_REQ, 2, E, F, 0, &f->up));
        TRY(td_bind_tensor(b, NM("ffn_down.weight"), TD_BIND_REQ, 2, F, E, 0, &f->down));
        static const char *const fb[] = {"ffn_gate.bias", "ffn_up.bias", "ffn_down.bias"};
        for (size_t i = 0; i < 3; i++) {
            snprintf(n, sizeof n, "blk.%u.%s", il, fb[i]);
            TRY(td_bind_refuse(b, n, "FFN biases are not supported by tapdiff's forwards"));
        }
    } else {
        TRY(td_bind_tensor(b, NM("ffn_gate_inp.weight"), TD_BIND_REQ, 2, E, X, 0, &f->gate_inp));
        /* Mixtral-style llama MoE may omit the gate (experts compute W_down silu(W_up x)) */
        TRY(td_bind_tensor(b, NM("ffn_gate_exps.weight"), (traits & TD_ARCH_T_MOE) ? TD_BIND_REQ : TD_BIND_OPT, 3,
                           E, F, X, &f->gate_exps));
        TRY(td_bind_tensor(b, NM("ffn_up_exps.weight"), TD_BIND_REQ, 3, E, F, X, &f->up_exps));
        TRY(td_bind_tensor(b, NM("ffn_down_exps.weight"), TD_BIND_REQ, 3, F, E, X, &f->down_exps));
    }
#undef NM
    return TD_OK;
}

/* An attention block then an FFN, every block alike (llama, qwen3, qwen3moe). */
static int bind_attention_layer(const td_binder *b, const td_hparams *hp, uint32_t il, td_layer *l) {
    const unsigned traits = td_arch_get(hp->arch)->traits;
    TD_ASSERT(l->kind == TD_LAYER_ATTENTION);
    TRY(bind_attention(b, hp, traits, il, &l->attn));
    return bind_ffn(b, hp, traits, il, &l->ffn);
}

/* LLaMA-3.1 frequency factors {R/2} */
static int bind_rope_freqs(const td_binder *b, td_model *m) {
    return td_bind_tensor(b, "rope_freqs.weight", TD_BIND_OPT, 1, m->hp.rope_dims / 2, 0, 0, &m->rope_freqs);
}


/* ------------------------------------------------------------------------ */
/* qwen3next: Gated DeltaNet + gated attention, MoE with a shared expert      */
/* Facts: ../shared/spec/arch-qwen3next.md §1-§3.                              */

#define Q3N_MAX_TRUNK 256 /* bits of td_hparams.recurrent */

static void set_recurrent(td_hparams *hp, uint32_t il) { hp->recurrent[il / 64] |= 1ull << (il % 64); }

static int read_qwen3next(const td_binder *b, td_hparams *hp) {
    const char *P = b->g->path, *A = b->arch;
    const uint32_t n_all = hp->n_layer; /* block_count: trunk + MTP; per-layer arrays have this length */
    TRY(read_ffn(b, hp));
    uint32_t n_ff_dense = 0;
    TRY(td_bind_u32(b, "feed_forward_length", 0, 0, n_all, &n_ff_dense));
    TRY(td_bind_u32(b, "expert_shared_feed_forward_length", 0, n_ff_dense, 0, &hp->n_ff_shexp));
    if (hp->n_ff_shexp == 0)
        return td_err_set(b->err, TD_EINPUT,
                          "%s: key '%s.expert_shared_feed_forward_length': expected F_sh > 0 (every layer has a "
                          "shared expert), found 0%s",
                          P, A, td_bind_has(b, "expert_shared_feed_forward_length") ? "" : " (default feed_forward_length)");

    TRY(td_bind_u32(b, "nextn_predict_layers", 0, 0, 0, &hp->n_nextn));
    if (hp->n_nextn >= n_all)
        return td_err_set(b->err, TD_EINPUT,
                          "%s: key '%s.nextn_predict_layers': expected fewer MTP blocks than block_count = %u, found %u",
                          P, A, n_all, hp->n_nextn);
    hp->n_layer = n_all - hp->n_nextn; /* the MTP blocks are not part of the forward (spec §3.4) */
    if (hp->n_layer > Q3N_MAX_TRUNK)
        return td_err_set(b->err, TD_EINPUT, "%s: key '%s.block_count': expected at most %u trunk layers, found %u", P,
                          A, Q3N_MAX_TRUNK, hp->n_layer);

    static const char *const ssm_keys[5] = {"ssm.conv_kernel", "ssm.state_size", "ssm.group_count",
                                            "ssm.time_step_rank", "ssm.inner_size"};
    uint32_t *ssm_vals[5] = {&hp->ssm_conv, &hp->ssm_d_state, &hp->ssm_n_group, &hp->ssm_dt_rank, &hp->ssm_d_inner};
    for (int i = 0; i < 5; i++) {
        TRY(td_bind_u32(b, ssm_keys[i], 1, 0, 0, ssm_vals[i]));
        if (*ssm_vals[i] == 0)
            return td_err_set(b->err, TD_EINPUT, "%s: key '%s.%s': expected > 0, found 0", P, A, ssm_keys[i]);
    }
    const uint32_t Hk = hp->ssm_n_group, Hv = hp->ssm_dt_rank, dk = hp->ssm_d_state;
    if (Hv % Hk != 0)
        return td_err_set(b->err, TD_EINPUT,
                          "%s: key '%s.ssm.group_count': expected H_k to divide ssm.time_step_rank H_v = %u, found H_k "
                          "= %u",
                          P, A, Hv, Hk);
    if (hp->ssm_d_inner % Hv != 0 || hp->ssm_d_inner / Hv != dk)
        return td_err_set(b->err, TD_EINPUT,
                          "%s: key '%s.ssm.inner_size': expected H_v * d_k = %u * %u = %llu (the state is d_k x d_v "
                          "with d_v = d_k), found %u",
                          P, A, Hv, dk, (unsigned long long)Hv * dk, hp->ssm_d_inner);

    /* which trunk layers are GDN: recurrent_layers, else every layer but each interval-th */
    memset(hp->recurrent, 0, sizeof hp->recurrent);
    char key[160];
    snprintf(key, sizeof key, "%s.attention.recurrent_layers", A);
    const td_gguf_kv *kv = td_gguf_find(b->g, key);
    if (kv) {
        const int et = (int)kv->arr_type;
        const int int_like = et == TD_GGUF_BOOL || et == TD_GGUF_UINT8 || et == TD_GGUF_INT8 || et == TD_GGUF_UINT16 ||
                             et == TD_GGUF_INT16 || et == TD_GGUF_UINT32 || et == TD_GGUF_INT32;
        if (kv->type != TD_GGUF_ARRAY || !int_like)
            return td_err_set(b->err, TD_EINPUT, "%s: key '%s': expected an array of BOOL (or integer) flags, found %s",
                              P, key, td_gguf_vtype_name((int)(kv->type == TD_GGUF_ARRAY ? kv->arr_type : kv->type)));
        if (kv->arr_n != n_all)
            return td_err_set(b->err, TD_EINPUT, "%s: key '%s': expected %u entries (one per block), found %llu", P,
                              key, n_all, (unsigned long long)kv->arr_n);
        for (uint32_t il = 0; il < n_all; il++) {
            const int64_t v = td_gguf_arr_i64(kv, il);
            if (v != 0 && v != 1)
                return td_err_set(b->err, TD_EINPUT, "%s: key '%s': entry %u: expected 0 or 1, found %lld", P, key, il,
                                  (long long)v);
            if (v && il >= hp->n_layer)
                return td_err_set(b->err, TD_EINPUT,
                                  "%s: key '%s': entry %u: expected 0 (block %u is an MTP block, never recurrent), "
                                  "found 1",
                                  P, key, il, il);
            if (v) set_recurrent(hp, il);
        }
    } else {
        uint32_t interval = 0;
        TRY(td_bind_u32(b, "full_attention_interval", 0, 4, 0, &interval));
        if (interval == 0)
            return td_err_set(b->err, TD_EINPUT, "%s: key '%s.full_attention_interval': expected > 0, found 0", P, A);
        for (uint32_t il = 0; il < hp->n_layer; il++)
            if ((il + 1) % interval != 0) set_recurrent(hp, il);
    }
    return TD_OK;
}

static td_layer_kind qwen3next_kind(const td_hparams *hp, uint32_t il) {
    return il < 64 * 4 && (hp->recurrent[il / 64] >> (il % 64) & 1) ? TD_LAYER_GDN : TD_LAYER_ATTENTION;
}

static int bind_gdn(const td_binder *b, const td_hparams *hp, uint32_t il, td_gdn_parts *g) {
    const uint64_t E = hp->n_embd, Hk = hp->ssm_n_group, Hv = hp->ssm_dt_rank, dk = hp->ssm_d_state;
    const uint64_t key_dim = Hk * dk, value_dim = Hv * dk, C = 2 * key_dim + value_dim;
    char n[96];
#define NM(s) (snprintf(n, sizeof n, "blk.%u." s, il), n)
    TRY(td_bind_refuse(b, NM("ssm_in.weight"),
                       "the legacy fused ssm_in layout is not supported (expected attn_qkv + attn_gate)"));
    TRY(td_bind_tensor(b, NM("attn_norm.weight"), TD_BIND_REQ, 1, E, 0, 0, &g->norm));
    TRY(td_bind_tensor(b, NM("attn_qkv.weight"), TD_BIND_REQ, 2, E, C, 0, &g->wqkv));
    TRY(td_bind_tensor(b, NM("attn_gate.weight"), TD_BIND_REQ, 2, E, value_dim, 0, &g->wgate));
    TRY(td_bind_tensor(b, NM("ssm_ba.weight"), TD_BIND_REQ, 2, E, 2 * Hv, 0, &g->wba));
    TRY(td_bind_tensor(b, NM("ssm_conv1d.weight"), TD_BIND_REQ, 2, hp->ssm_conv, C, 0, &g->conv));
    TRY(td_bind_tensor(b, NM("ssm_dt.bias"), TD_BIND_REQ, 1, Hv, 0, 0, &g->dt_bias));
    TRY(td_bind_tensor(b, NM("ssm_a"), TD_BIND_REQ, 1, Hv, 0, 0, &g->a));
    TRY(td_bind_tensor(b, NM("ssm_norm.weight"), TD_BIND_REQ, 1, dk, 0, 0, &g->ssm_norm));
    TRY(td_bind_tensor(b, NM("ssm_out.weight"), TD_BIND_REQ, 2, value_dim, E, 0, &g->wout));
#undef NM
    return TD_OK;
}

static int bind_gated_attention(const td_binder *b, const td_hparams *hp, uint32_t il, td_attn_parts *a) {
    const uint64_t E = hp->n_embd, H = hp->n_head, Hkv = hp->n_head_kv, D = hp->head_dim;
    const uint64_t HD = td_bind_mul_sat(H, D), HkvD = td_bind_mul_sat(Hkv, D);
    char n[96];
#define NM(s) (snprintf(n, sizeof n, "blk.%u." s, il), n)
    TRY(td_bind_refuse(b, NM("attn_qkv.weight"),
                       "a fused attn_qkv in a full-attention layer is not supported (expected attn_q/k/v)"));
    TRY(td_bind_tensor(b, NM("attn_norm.weight"), TD_BIND_REQ, 1, E, 0, 0, &a->norm));
    TRY(td_bind_tensor(b, NM("attn_q.weight"), TD_BIND_REQ, 2, E, td_bind_mul_sat(2, HD), 0, &a->wq));
    TRY(td_bind_tensor(b, NM("attn_k.weight"), TD_BIND_REQ, 2, E, HkvD, 0, &a->wk));
    TRY(td_bind_tensor(b, NM("attn_v.weight"), TD_BIND_REQ, 2, E, HkvD, 0, &a->wv));
    TRY(td_bind_tensor(b, NM("attn_output.weight"), TD_BIND_REQ, 2, HD, E, 0, &a->wo));
    TRY(td_bind_tensor(b, NM("attn_q_norm.weight"), TD_BIND_REQ, 1, D, 0, 0, &a->q_norm));
    TRY(td_bind_tensor(b, NM("attn_k_norm.weight"), TD_BIND_REQ, 1, D, 0, 0, &a->k_norm));
    a->q_gated = 1;
#undef NM
    return TD_OK;
}

/* post_attention_norm plays ffn_norm's role; routed MoE + gated shared expert */
static int bind_q3n_ffn(const td_binder *b, const td_hparams *hp, uint32_t il, td_ffn_parts *f) {
    const uint64_t E = hp->n_embd, F = hp->n_ff, X = hp->n_expert, Fs = hp->n_ff_shexp;
    char n[96];
#define NM(s) (snprintf(n, sizeof n, "blk.%u." s, il), n)
    TRY(td_bind_refuse(b, NM("ffn_gate_up_exps.weight"),
                       "the merged gate/up expert tensor is not supported (expected ffn_gate_exps + ffn_up_exps)"));
    TRY(td_bind_tensor(b, NM("post_attention_norm.weight"), TD_BIND_REQ, 1, E, 0, 0, &f->norm));
    TRY(td_bind_tensor(b, NM("ffn_gate_inp.weight"), TD_BIND_REQ, 2, E, X, 0, &f->gate_inp));
    TRY(td_bind_tensor(b, NM("ffn_gate_exps.weight"), TD_BIND_REQ, 3, E, F, X, &f->gate_exps));
    TRY(td_bind_tensor(b, NM("ffn_up_exps.weight"), TD_BIND_REQ, 3, E, F, X, &f->up_exps));
    TRY(td_bind_tensor(b, NM("ffn_down_exps.weight"), TD_BIND_REQ, 3, F, E, X, &f->down_exps));
    TRY(td_bind_tensor(b, NM("ffn_gate_inp_shexp.weight"), TD_BIND_REQ, 1, E, 0, 0, &f->gate_inp_shexp));
    TRY(td_bind_tensor(b, NM("ffn_gate_shexp.weight"), TD_BIND_REQ, 2, E, Fs, 0, &f->gate_shexp));
    TRY(td_bind_tensor(b, NM("ffn_up_shexp.weight"), TD_BIND_REQ, 2, E, Fs, 0, &f->up_shexp));
    TRY(td_bind_tensor(b, NM("ffn_down_shexp.weight"), TD_BIND_REQ, 2, Fs, E, 0, &f->down_shexp));
#undef NM
    return TD_OK;
}

static int bind_qwen3next_layer(const td_binder *b, const td_hparams *hp, uint32_t il, td_layer *l) {
    if (l->kind == TD_LAYER_GDN) TRY(bind_gdn(b, hp, il, &l->gdn));
    else TRY(bind_gated_attention(b, hp, il, &l->attn));
    return bind_q3n_ffn(b, hp, il, &l->ffn);
}

/* ------------------------------------------------------------------------ */
/* The table                                                                  */

static const td_arch_desc k_archs[] = {
    {
        .name = "llama",
        .arch = TD_ARCH_LLAMA,
        .spec = "shared/spec/arch-llama.md",
        .rope = TD_ROPE_NORM,
        .default_scaling = TD_ROPE_SCALING_LINEAR,
        .traits = TD_ARCH_T_MOE_OPTIONAL | TD_ARCH_T_ATTN_OUT_BIAS | TD_ARCH_T_ROPE_FREQS,
        .read_hparams = read_ffn,
        .layer_kind = all_attention,
        .bind_layer = bind_attention_layer,
        .bind_model = bind_rope_freqs,
    },
    {
        .name = "qwen3",
        .arch = TD_ARCH_QWEN3,
        .spec = "shared/spec/arch-qwen3.md",
        .rope = TD_ROPE_NEOX,
        .default_scaling = TD_ROPE_SCALING_LINEAR,
        .traits = TD_ARCH_T_QK_NORM,
        .read_hparams = read_ffn,
        .layer_kind = all_attention,
        .bind_layer = bind_attention_layer,
    },
    {
        .name = "qwen3moe",
        .arch = TD_ARCH_QWEN3MOE,
        .spec = "shared/spec/arch-qwen3moe.md",
        .rope = TD_ROPE_NEOX,
        .default_scaling = TD_ROPE_SCALING_NONE,
        .traits = TD_ARCH_T_QK_NORM | TD_ARCH_T_MOE,
        .read_hparams = read_ffn,
        .layer_kind = all_attention,
        .bind_layer = bind_attention_layer,
    },
    {
        .name = "qwen3next",
        .arch = TD_ARCH_QWEN3NEXT,
        .spec = "shared/spec/arch-qwen3next.md",
        .rope = TD_ROPE_NEOX,
        .default_scaling = TD_ROPE_SCALING_NONE,
        .traits = TD_ARCH_T_QK_NORM | TD_ARCH_T_MOE | TD_ARCH_T_PARTIAL_ROPE | TD_ARCH_T_SHARED_EXPERT |
                  TD_ARCH_T_ATTN_GATE,
        .read_hparams = read_qwen3next,
        .layer_kind = qwen3next_kind,
        .bind_layer = bind_qwen3next_layer,
    },
};
#define N_ARCHS (sizeof k_archs / sizeof k_archs[0])

size_t td_arch_count(void) { return N_ARCHS; }

const td_arch_desc *td_arch_at(size_t i) { return i < N_ARCHS ? &k_archs[i] : NULL; }

const td_arch_desc *td_arch_find(const char *name) {
    for (size_t i = 0; name && i < N_ARCHS; i++)
        if (!strcmp(name, k_archs[i].name)) return &k_archs[i];
    return NULL;
}

const td_arch_desc *td_arch_get(td_arch a) {
    for (size_t i = 0; i < N_ARCHS; i++)
        if (k_archs[i].arch == a) return &k_archs[i];
    return NULL;
}

void td_arch_names(char *buf, size_t bufsz, const char *sep) {
    if (!bufsz) return;
    buf[0] = '\0';
    size_t o = 0;
    for (size_t i = 0; i < N_ARCHS && o < bufsz; i++)
        o += (size_t)snprintf(buf + o, bufsz - o, "%s%s", i ? sep : "", k_archs[i].name);
}

const char *td_arch_name(td_arch a) {
    const td_arch_desc *d = td_arch_get(a);
    return d ? d->name : "unknown";
}

const char *td_layer_kind_name(td_layer_kind k) {
    switch (k) {
    case TD_LAYER_ATTENTION: return "attention";
    case TD_LAYER_GDN: return "gdn";
    case TD_LAYER_KIND_COUNT: break;
    }
    return "unknown";
}
