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

/* The GDN keys (§1.2 of both specs): all required and non-zero, d_v = d_k. */
static int read_ssm(const td_binder *b, td_hparams *hp) {
    const char *P = b->g->path, *A = b->arch;
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
    return TD_OK;
}

/* Which trunk layers are GDN: attention.recurrent_layers, else every layer but
 * each full_attention_interval-th (qwen3next and qwen4exp alike). */
static int read_recurrent(const td_binder *b, td_hparams *hp, uint32_t n_all) {
    const char *P = b->g->path, *A = b->arch;
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

/* The MoE keys and the shared expert's width F_sh (default: the dense
 * feed_forward_length), which every layer of qwen3next and qwen4exp has. */
static int read_ffn_shexp(const td_binder *b, td_hparams *hp, uint32_t n_all) {
    const char *P = b->g->path, *A = b->arch;
    TRY(read_ffn(b, hp));
    uint32_t n_ff_dense = 0;
    TRY(td_bind_u32(b, "feed_forward_length", 0, 0, n_all, &n_ff_dense));
    TRY(td_bind_u32(b, "expert_shared_feed_forward_length", 0, n_ff_dense, 0, &hp->n_ff_shexp));
    if (hp->n_ff_shexp == 0)
        return td_err_set(b->err, TD_EINPUT,
                          "%s: key '%s.expert_shared_feed_forward_length': expected F_sh > 0 (every layer has a "
                          "shared expert), found 0%s",
                          P, A, td_bind_has(b, "expert_shared_feed_forward_length") ? "" : " (default feed_forward_length)");
    return TD_OK;
}

static int read_qwen3next(const td_binder *b, td_hparams *hp) {
    const char *P = b->g->path, *A = b->arch;
    const uint32_t n_all = hp->n_layer; /* block_count: trunk + MTP; per-layer arrays have this length */
    TRY(read_ffn_shexp(b, hp, n_all));

    TRY(td_bind_u32(b, "nextn_predict_layers", 0, 0, 0, &hp->n_nextn));
    if (hp->n_nextn >= n_all)
        return td_err_set(b->err, TD_EINPUT,
                          "%s: key '%s.nextn_predict_layers': expected fewer MTP blocks than block_count = %u, found %u",
                          P, A, n_all, hp->n_nextn);
    hp->n_layer = n_all - hp->n_nextn; /* the MTP blocks are not part of the forward (spec §3.4) */
    if (hp->n_layer > Q3N_MAX_TRUNK)
        return td_err_set(b->err, TD_EINPUT, "%s: key '%s.block_count': expected at most %u trunk layers, found %u", P,
                          A, Q3N_MAX_TRUNK, hp->n_layer);

    TRY(read_ssm(b, hp));
    return read_recurrent(b, hp, n_all);
}

static td_layer_kind qwen3next_kind(const td_hparams *hp, uint32_t il) {
    return il < 64 * 4 && (hp->recurrent[il / 64] >> (il % 64) & 1) ? TD_LAYER_GDN : TD_LAYER_ATTENTION;
}

/* The Gated DeltaNet tensors qwen3next and qwen4exp share (the projections
 * in, the conv, the decay parameters, the output norm and projection); each
 * binds its own beta/alpha projection(s) first. */
static int bind_gdn_common(const td_binder *b, const td_hparams *hp, uint32_t il, td_gdn_parts *g) {
    const uint64_t E = hp->n_embd, Hk = hp->ssm_n_group, Hv = hp->ssm_dt_rank, dk = hp->ssm_d_state;
    const uint64_t key_dim = Hk * dk, value_dim = Hv * dk, C = 2 * key_dim + value_dim;
    char n[96];
#define NM(s) (snprintf(n, sizeof n, "blk.%u." s, il), n)
    TRY(td_bind_tensor(b, NM("attn_qkv.weight"), TD_BIND_REQ, 2, E, C, 0, &g->wqkv));
    TRY(td_bind_tensor(b, NM("attn_gate.weight"), TD_BIND_REQ, 2, E, value_dim, 0, &g->wgate));
    TRY(td_bind_tensor(b, NM("ssm_conv1d.weight"), TD_BIND_REQ, 2, hp->ssm_conv, C, 0, &g->conv));
    TRY(td_bind_tensor(b, NM("ssm_dt.bias"), TD_BIND_REQ, 1, Hv, 0, 0, &g->dt_bias));
    TRY(td_bind_tensor(b, NM("ssm_a"), TD_BIND_REQ, 1, Hv, 0, 0, &g->a));
    TRY(td_bind_tensor(b, NM("ssm_norm.weight"), TD_BIND_REQ, 1, dk, 0, 0, &g->ssm_norm));
    TRY(td_bind_tensor(b, NM("ssm_out.weight"), TD_BIND_REQ, 2, value_dim, E, 0, &g->wout));
#undef NM
    return TD_OK;
}

static int bind_gdn(const td_binder *b, const td_hparams *hp, uint32_t il, td_gdn_parts *g) {
    char n[96];
#define NM(s) (snprintf(n, sizeof n, "blk.%u." s, il), n)
    TRY(td_bind_refuse(b, NM("ssm_in.weight"),
                       "the legacy fused ssm_in layout is not supported (expected attn_qkv + attn_gate)"));
    TRY(td_bind_tensor(b, NM("attn_norm.weight"), TD_BIND_REQ, 1, hp->n_embd, 0, 0, &g->norm));
    TRY(td_bind_tensor(b, NM("ssm_ba.weight"), TD_BIND_REQ, 2, hp->n_embd, 2 * (uint64_t)hp->ssm_dt_rank, 0, &g->wba));
#undef NM
    return bind_gdn_common(b, hp, il, g);
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

/* routed MoE + gated shared expert; qwen3next's post_attention_norm plays ffn_norm's role,
 * qwen4exp has none (its HC mixer normalises) */
static int bind_moe_shexp_ffn(const td_binder *b, const td_hparams *hp, uint32_t il, int with_norm,
                              td_ffn_parts *f) {
    const uint64_t E = hp->n_embd, F = hp->n_ff, X = hp->n_expert, Fs = hp->n_ff_shexp;
    char n[96];
#define NM(s) (snprintf(n, sizeof n, "blk.%u." s, il), n)
    TRY(td_bind_refuse(b, NM("ffn_gate_up_exps.weight"),
                       "the merged gate/up expert tensor is not supported (expected ffn_gate_exps + ffn_up_exps)"));
    if (with_norm) TRY(td_bind_tensor(b, NM("post_attention_norm.weight"), TD_BIND_REQ, 1, E, 0, 0, &f->norm));
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
    return bind_moe_shexp_ffn(b, hp, il, 1, &l->ffn);
}

/* ------------------------------------------------------------------------ */
/* qwen4exp: hyper-connections, GDN + QSA attention, PLE n-gram embeddings    */
/* Facts: ../shared/spec/arch-qwen4exp.md §1-§3.                               */
/*                                                                            */
/* Rules tapdiff adds where llama.cpp's loader is silent (each stated with the */
/* spec's reason; llama.cpp would fail later or compute nonsense):            */
/* - n_p * d_p must equal n_embd (the PLE projections take an E-wide input);  */
/* - indexer key_length d_i >= R (the indexer rotates the first R dims);      */
/* - IMROPE sections: exactly 4 non-negative entries (or one scalar, as       */
/*   llama.cpp's key-or-array reader), sum > 0 (sector = pair mod sum);       */
/* - compress_ratios: one entry per block, 0 on every GDN block (the          */
/*   converter's layout; a ratio there has no attention to make sparse);      */
/* - PLE all-or-nothing: any ple.* key or the PLE table without ple.layers is */
/*   refused (llama.cpp ignores them, silently dropping the embedding);       */
/* - the multiplier / offset / vocab-size arrays must be 64-bit integer       */
/*   arrays: ~1e13 multipliers do not survive a 32-bit type.                  */

static const td_gguf_kv *q4x_key(const td_binder *b, const char *suffix, char *key, size_t n) {
    snprintf(key, n, "%s.%s", b->arch, suffix);
    return td_gguf_find(b->g, key);
}

static int is_int_arr(const td_gguf_kv *kv) {
    const int et = (int)kv->arr_type;
    return kv->type == TD_GGUF_ARRAY &&
           (et == TD_GGUF_UINT8 || et == TD_GGUF_INT8 || et == TD_GGUF_UINT16 || et == TD_GGUF_INT16 ||
            et == TD_GGUF_UINT32 || et == TD_GGUF_INT32 || et == TD_GGUF_UINT64 || et == TD_GGUF_INT64);
}

static int read_sections(const td_binder *b, td_hparams *hp) {
    const char *P = b->g->path;
    char key[160];
    const td_gguf_kv *kv = q4x_key(b, "rope.dimension_sections", key, sizeof key);
    if (!kv)
        return td_err_set(b->err, TD_EINPUT, "%s: required key '%s' is missing (IMROPE needs 4 sections)", P, key);
    if (kv->type != TD_GGUF_ARRAY) {
        uint32_t v = 0;
        TRY(td_bind_u32(b, "rope.dimension_sections", 1, 0, 0, &v));
        for (int i = 0; i < 4; i++) hp->rope_sections[i] = v;
    } else {
        if (!is_int_arr(kv))
            return td_err_set(b->err, TD_EINPUT, "%s: key '%s': expected an array of 4 integers, found ARRAY of %s", P,
                              key, td_gguf_vtype_name((int)kv->arr_type));
        if (kv->arr_n != 4)
            return td_err_set(b->err, TD_EINPUT, "%s: key '%s': expected 4 IMROPE sections, found %llu entries", P,
                              key, (unsigned long long)kv->arr_n);
        for (uint32_t i = 0; i < 4; i++) {
            const int64_t v = td_gguf_arr_i64(kv, i);
            if (v < 0 || v > 0xFFFF)
                return td_err_set(b->err, TD_EINPUT, "%s: key '%s': entry %u: expected a section in [0, 65535], found %lld",
                                  P, key, i, (long long)v);
            hp->rope_sections[i] = (uint32_t)v;
        }
    }
    const uint32_t S = hp->rope_sections[0] + hp->rope_sections[1] + hp->rope_sections[2] + hp->rope_sections[3];
    if (S == 0)
        return td_err_set(b->err, TD_EINPUT,
                          "%s: key '%s': expected sections with a sum > 0 (each pair's sector is its index mod the sum), "
                          "found [0, 0, 0, 0]",
                          P, key);
    return TD_OK;
}

static int read_ratios(const td_binder *b, td_hparams *hp) {
    const char *P = b->g->path;
    char key[160];
    const td_gguf_kv *kv = q4x_key(b, "attention.compress_ratios", key, sizeof key);
    memset(hp->qsa_ratio, 0, sizeof hp->qsa_ratio);
    if (!kv) return TD_OK; /* absent: every attention layer dense */
    const uint32_t L = hp->n_layer;
    if (kv->type != TD_GGUF_ARRAY) {
        uint32_t v = 0;
        TRY(td_bind_u32(b, "attention.compress_ratios", 1, 0, 0, &v));
        for (uint32_t il = 0; il < L; il++)
            if (!(hp->recurrent[il / 64] >> (il % 64) & 1)) hp->qsa_ratio[il] = v;
        return TD_OK;
    }
    if (!is_int_arr(kv))
        return td_err_set(b->err, TD_EINPUT, "%s: key '%s': expected UINT32 or an array of UINT32, found ARRAY of %s",
                          P, key, td_gguf_vtype_name((int)kv->arr_type));
    if (kv->arr_n != L)
        return td_err_set(b->err, TD_EINPUT, "%s: key '%s': expected %u entries (one per block), found %llu", P, key, L,
                          (unsigned long long)kv->arr_n);
    for (uint32_t il = 0; il < L; il++) {
        const int64_t v = td_gguf_arr_i64(kv, il);
        if (v < 0 || v > (int64_t)hp->n_ctx_train)
            return td_err_set(b->err, TD_EINPUT,
                              "%s: key '%s': entry %u: expected a block size in [0, context_length = %u], found %lld", P,
                              key, il, hp->n_ctx_train, (long long)v);
        const int gdn = (int)(hp->recurrent[il / 64] >> (il % 64) & 1);
        if (gdn && v != 0)
            return td_err_set(b->err, TD_EINPUT,
                              "%s: key '%s': entry %u: expected 0 (block %u is a GDN layer, it has no attention to make "
                              "sparse), found %lld",
                              P, key, il, il, (long long)v);
        hp->qsa_ratio[il] = (uint32_t)v;
    }
    return TD_OK;
}

/* a 64-bit integer array of at least n entries into out[0..n) */
static int read_u64_arr(const td_binder *b, const char *suffix, uint32_t n, const char *what, uint64_t *out) {
    const char *P = b->g->path;
    char key[160];
    const td_gguf_kv *kv = q4x_key(b, suffix, key, sizeof key);
    if (!kv)
        return td_err_set(b->err, TD_EINPUT, "%s: required key '%s' is missing (PLE is all-or-nothing: ple.layers is set)",
                          P, key);
    if (kv->type != TD_GGUF_ARRAY || (kv->arr_type != TD_GGUF_UINT64 && kv->arr_type != TD_GGUF_INT64))
        return td_err_set(b->err, TD_EINPUT,
                          "%s: key '%s': expected an ARRAY of UINT64 (the hash constants need 64 bits), found %s%s", P,
                          key, kv->type == TD_GGUF_ARRAY ? "ARRAY of " : "",
                          td_gguf_vtype_name((int)(kv->type == TD_GGUF_ARRAY ? kv->arr_type : kv->type)));
    if (kv->arr_n < n)
        return td_err_set(b->err, TD_EINPUT, "%s: key '%s': expected at least %u entries (%s), found %llu", P, key, n,
                          what, (unsigned long long)kv->arr_n);
    for (uint32_t i = 0; i < n; i++) out[i] = (uint64_t)td_gguf_arr_i64(kv, i);
    return TD_OK;
}

static int read_ple(const td_binder *b, td_hparams *hp) {
    const char *P = b->g->path, *A = b->arch;
    static const char *const ple_keys[] = {"ple.ngram_size",      "ple.heads_per_ngram", "ple.conv_kernel",
                                           "ple.eos_token_id",    "ple.image_token_id",  "ple.layer_multipliers",
                                           "ple.head_offsets",    "ple.head_vocab_sizes",
                                           "embedding_length_per_layer_input"};
    char key[160];
    hp->ple_layer = -1;
    const td_gguf_kv *kv = q4x_key(b, "ple.layers", key, sizeof key);
    if (!kv) {
        for (size_t i = 0; i < sizeof ple_keys / sizeof ple_keys[0]; i++)
            if (td_bind_has(b, ple_keys[i]))
                return td_err_set(b->err, TD_EINPUT,
                                  "%s: key '%s.%s': expected absent (PLE is all-or-nothing and '%s.ple.layers' is "
                                  "missing), found present",
                                  P, A, ple_keys[i], A);
        return TD_OK;
    }
    if (!is_int_arr(kv))
        return td_err_set(b->err, TD_EINPUT, "%s: key '%s': expected an array of layer indices, found %s", P, key,
                          td_gguf_vtype_name((int)(kv->type == TD_GGUF_ARRAY ? kv->arr_type : kv->type)));
    if (kv->arr_n != 1)
        return td_err_set(b->err, TD_EINPUT, "%s: key '%s': expected exactly one PLE layer, found %llu entries", P, key,
                          (unsigned long long)kv->arr_n);
    const int64_t il = td_gguf_arr_i64(kv, 0);
    if (il < 0 || il >= (int64_t)hp->n_layer)
        return td_err_set(b->err, TD_EINPUT, "%s: key '%s': entry 0: expected a block index < block_count = %u, found %lld",
                          P, key, hp->n_layer, (long long)il);
    if (!(hp->recurrent[il / 64] >> (il % 64) & 1))
        return td_err_set(b->err, TD_EINPUT,
                          "%s: key '%s': entry 0: expected a GDN layer (the PLE conv history lives in the recurrent "
                          "state), found block %lld, a full-attention layer",
                          P, key, (long long)il);
    hp->ple_layer = (int32_t)il;

    TRY(td_bind_u32(b, "ple.ngram_size", 1, 0, 0, &hp->ple_ngram));
    if (hp->ple_ngram < 2 || hp->ple_ngram > 8)
        return td_err_set(b->err, TD_EINPUT, "%s: key '%s.ple.ngram_size': expected n_g in [2, 8], found %u", P, A,
                          hp->ple_ngram);
    TRY(td_bind_u32(b, "ple.heads_per_ngram", 1, 0, 0, &hp->ple_heads_per_ngram));
    const uint64_t np = (uint64_t)(hp->ple_ngram - 1) * hp->ple_heads_per_ngram;
    if (np == 0 || np > 64)
        return td_err_set(b->err, TD_EINPUT,
                          "%s: key '%s.ple.heads_per_ngram': expected (n_g - 1) * h_g in [1, 64] PLE heads, found "
                          "(%u - 1) * %u = %llu",
                          P, A, hp->ple_ngram, hp->ple_heads_per_ngram, (unsigned long long)np);
    hp->ple_n_heads = (uint32_t)np;
    TRY(td_bind_u32(b, "ple.conv_kernel", 1, 0, 0, &hp->ple_conv));
    if (hp->ple_conv == 0)
        return td_err_set(b->err, TD_EINPUT, "%s: key '%s.ple.conv_kernel': expected > 0, found 0", P, A);
    TRY(td_bind_u32(b, "ple.eos_token_id", 1, 0, 0, &hp->ple_eos));
    TRY(td_bind_u32(b, "ple.image_token_id", 0, 0, 0, &hp->ple_image));
    if (hp->ple_image == 0) hp->ple_image = hp->ple_eos;
    TRY(td_bind_u32(b, "embedding_length_per_layer_input", 1, 0, 0, &hp->ple_dim));
    if (hp->ple_dim == 0)
        return td_err_set(b->err, TD_EINPUT, "%s: key '%s.embedding_length_per_layer_input': expected d_p > 0, found 0",
                          P, A);
    if ((uint64_t)hp->ple_n_heads * hp->ple_dim != hp->n_embd)
        return td_err_set(b->err, TD_EINPUT,
                          "%s: key '%s.embedding_length_per_layer_input': expected n_p * d_p = n_embd = %u (the PLE "
                          "projections take an n_embd-wide input), found %u * %u = %llu",
                          P, A, hp->n_embd, hp->ple_n_heads, hp->ple_dim,
                          (unsigned long long)hp->ple_n_heads * hp->ple_dim);
    TRY(read_u64_arr(b, "ple.layer_multipliers", hp->ple_ngram, "one multiplier per n-gram position", hp->ple_mult));
    TRY(read_u64_arr(b, "ple.head_offsets", hp->ple_n_heads, "one per PLE head", hp->ple_off));
    TRY(read_u64_arr(b, "ple.head_vocab_sizes", hp->ple_n_heads, "one per PLE head", hp->ple_vsz));
    hp->ple_rows = 0;
    for (uint32_t h = 0; h < hp->ple_n_heads; h++) {
        const uint64_t O = hp->ple_off[h], V = hp->ple_vsz[h];
        if (V == 0)
            return td_err_set(b->err, TD_EINPUT, "%s: key '%s.ple.head_vocab_sizes': entry %u: expected V_h > 0, found 0",
                              P, A, h);
        if (O > INT32_MAX || V > INT32_MAX || O + V > INT32_MAX)
            return td_err_set(b->err, TD_EINPUT,
                              "%s: key '%s.ple.head_offsets': head %u: expected O_h + V_h <= %d (an int32 row index), "
                              "found %llu + %llu",
                              P, A, h, INT32_MAX, (unsigned long long)O, (unsigned long long)V);
        if (O + V > hp->ple_rows) hp->ple_rows = O + V;
    }
    return TD_OK;
}

static int read_qwen4exp(const td_binder *b, td_hparams *hp) {
    const char *P = b->g->path, *A = b->arch;
    TRY(read_ffn_shexp(b, hp, hp->n_layer));
    if (hp->n_layer > Q3N_MAX_TRUNK)
        return td_err_set(b->err, TD_EINPUT, "%s: key '%s.block_count': expected at most %u layers, found %u", P, A,
                          Q3N_MAX_TRUNK, hp->n_layer);
    TRY(read_sections(b, hp));
    TRY(read_ssm(b, hp));

    TRY(td_bind_u32(b, "hyper_connection.count", 1, 0, 0, &hp->hc));
    if (hp->hc <= 1)
        return td_err_set(b->err, TD_EINPUT,
                          "%s: key '%s.hyper_connection.count': expected hc > 1 residual streams (one stream has nothing "
                          "to mix), found %u",
                          P, A, hp->hc);
    if (hp->hc > 64)
        return td_err_set(b->err, TD_EINPUT, "%s: key '%s.hyper_connection.count': expected hc <= 64, found %u", P, A,
                          hp->hc);
    TRY(td_bind_u32(b, "hyper_connection.low_rank", 1, 0, 0, &hp->hc_lr));
    if (hp->hc_lr == 0)
        return td_err_set(b->err, TD_EINPUT, "%s: key '%s.hyper_connection.low_rank': expected > 0, found 0", P, A);

    static const char *const idx_keys[3] = {"attention.indexer.head_count", "attention.indexer.key_length",
                                            "attention.indexer.top_k"};
    uint32_t *idx_vals[3] = {&hp->idx_heads, &hp->idx_dim, &hp->idx_topk};
    for (int i = 0; i < 3; i++) {
        TRY(td_bind_u32(b, idx_keys[i], 1, 0, 0, idx_vals[i]));
        if (*idx_vals[i] == 0)
            return td_err_set(b->err, TD_EINPUT, "%s: key '%s.%s': expected > 0, found 0", P, A, idx_keys[i]);
    }
    if (hp->idx_dim < hp->rope_dims)
        return td_err_set(b->err, TD_EINPUT,
                          "%s: key '%s.attention.indexer.key_length': expected d_i >= rope.dimension_count R = %u (the "
                          "indexer rotates the first R dims of each head), found %u",
                          P, A, hp->rope_dims, hp->idx_dim);

    TRY(read_recurrent(b, hp, hp->n_layer));
    TRY(read_ratios(b, hp));
    return read_ple(b, hp);
}

static td_layer_kind qwen4exp_kind(const td_hparams *hp, uint32_t il) {
    return il < 64 * 4 && (hp->recurrent[il / 64] >> (il % 64) & 1) ? TD_LAYER_HC_GDN : TD_LAYER_HC_QSA;
}

/* An {E, hc} gamma, or the same values stored flat as {hc*E} (§2); a float type. */
static int bind_gamma(const td_binder *b, const td_hparams *hp, const char *name, const td_tensor **out) {
    const uint64_t E = hp->n_embd, hc = hp->hc;
    const td_tensor *t = td_gguf_tensor(b->g, name);
    const int flat = t && t->ne[1] == 1 && t->ne[2] == 1 && (uint64_t)t->ne[0] == E * hc;
    return flat ? td_bind_tensor(b, name, TD_BIND_REQ, 1, E * hc, 0, 0, out)
                : td_bind_tensor(b, name, TD_BIND_REQ, 2, E, hc, 0, out);
}

static int bind_hc(const td_binder *b, const td_hparams *hp, const char *prefix, int with_inject, td_hc_parts *h) {
    const uint64_t hcd = td_bind_mul_sat(hp->n_embd, hp->hc), lr = hp->hc_lr;
    char n[96];
    snprintf(n, sizeof n, "%s_norm.weight", prefix);
    TRY(bind_gamma(b, hp, n, &h->norm));
    if (h->norm && h->norm->type != TD_TYPE_F32 && h->norm->type != TD_TYPE_F16 && h->norm->type != TD_TYPE_BF16)
        return td_err_set(b->err, TD_EINPUT, "%s: tensor %s: expected type F32, F16 or BF16 for a gamma, found %s",
                          b->g->path, n, td_type_name(h->norm->type));
    snprintf(n, sizeof n, "%s_down.weight", prefix);
    TRY(td_bind_tensor(b, n, TD_BIND_REQ, 2, hcd, lr, 0, &h->down));
    snprintf(n, sizeof n, "%s_up.weight", prefix);
    TRY(td_bind_tensor(b, n, TD_BIND_REQ, 2, lr, hcd, 0, &h->up));
    if (with_inject) {
        snprintf(n, sizeof n, "%s_inject.weight", prefix);
        TRY(td_bind_tensor(b, n, TD_BIND_REQ, 2, hcd, hp->hc, 0, &h->inject));
    }
    return TD_OK;
}

static int bind_q4x_gdn(const td_binder *b, const td_hparams *hp, uint32_t il, td_gdn_parts *g) {
    char n[96];
#define NM(s) (snprintf(n, sizeof n, "blk.%u." s, il), n)
    TRY(td_bind_refuse(b, NM("ssm_ba.weight"), "qwen4exp has separate ssm_beta and ssm_alpha, not an interleaved ssm_ba"));
    TRY(td_bind_tensor(b, NM("ssm_beta.weight"), TD_BIND_REQ, 2, hp->n_embd, hp->ssm_dt_rank, 0, &g->wbeta));
    TRY(td_bind_tensor(b, NM("ssm_alpha.weight"), TD_BIND_REQ, 2, hp->n_embd, hp->ssm_dt_rank, 0, &g->walpha));
#undef NM
    return bind_gdn_common(b, hp, il, g);
}

static int bind_q4x_attention(const td_binder *b, const td_hparams *hp, uint32_t il, td_layer *l) {
    const uint64_t E = hp->n_embd, H = hp->n_head, Hkv = hp->n_head_kv, D = hp->head_dim;
    const uint64_t HD = td_bind_mul_sat(H, D), HkvD = td_bind_mul_sat(Hkv, D), di = hp->idx_dim;
    td_attn_parts *a = &l->attn;
    td_qsa_parts *q = &l->qsa;
    char n[96];
#define NM(s) (snprintf(n, sizeof n, "blk.%u." s, il), n)
    TRY(td_bind_refuse(b, NM("attn_qkv.weight"),
                       "a fused attn_qkv in a full-attention layer is not supported (expected attn_q/k/v)"));
    TRY(td_bind_tensor(b, NM("attn_q.weight"), TD_BIND_REQ, 2, E, td_bind_mul_sat(2, HD), 0, &a->wq));
    TRY(td_bind_tensor(b, NM("attn_k.weight"), TD_BIND_REQ, 2, E, HkvD, 0, &a->wk));
    TRY(td_bind_tensor(b, NM("attn_v.weight"), TD_BIND_REQ, 2, E, HkvD, 0, &a->wv));
    TRY(td_bind_tensor(b, NM("attn_output.weight"), TD_BIND_REQ, 2, HD, E, 0, &a->wo));
    TRY(td_bind_tensor(b, NM("attn_q_norm.weight"), TD_BIND_REQ, 1, D, 0, 0, &a->q_norm));
    TRY(td_bind_tensor(b, NM("attn_k_norm.weight"), TD_BIND_REQ, 1, D, 0, 0, &a->k_norm));
    a->q_gated = 1;
    TRY(td_bind_tensor(b, NM("indexer.q_proj.weight"), TD_BIND_REQ, 2, E, td_bind_mul_sat(hp->idx_heads, di), 0,
                       &q->wq));
    TRY(td_bind_tensor(b, NM("indexer.k_proj.weight"), TD_BIND_REQ, 2, E, di, 0, &q->wk));
    TRY(td_bind_tensor(b, NM("indexer.q_norm.weight"), TD_BIND_REQ, 1, di, 0, 0, &q->q_norm));
    TRY(td_bind_tensor(b, NM("indexer.k_norm.weight"), TD_BIND_REQ, 1, di, 0, 0, &q->k_norm));
#undef NM
    return TD_OK;
}

static int bind_q4x_ple(const td_binder *b, const td_hparams *hp, uint32_t il, td_ple_parts *p) {
    const uint64_t E = hp->n_embd, hcd = td_bind_mul_sat(E, hp->hc);
    char n[96];
#define NM(s) (snprintf(n, sizeof n, "blk.%u." s, il), n)
    TRY(td_bind_tensor(b, NM("ple_key.weight"), TD_BIND_REQ, 2, E, hcd, 0, &p->key));
    TRY(td_bind_tensor(b, NM("ple_value.weight"), TD_BIND_REQ, 2, E, E, 0, &p->value));
    TRY(bind_gamma(b, hp, NM("ple_norm_key.weight"), &p->norm_key));
    TRY(bind_gamma(b, hp, NM("ple_norm_query.weight"), &p->norm_query));
    TRY(bind_gamma(b, hp, NM("ple_norm_conv.weight"), &p->norm_conv));
    TRY(td_bind_tensor(b, NM("ple_conv1d.weight"), TD_BIND_REQ, 2, hp->ple_conv, hcd, 0, &p->conv));
#undef NM
    return TD_OK;
}

static int bind_qwen4exp_layer(const td_binder *b, const td_hparams *hp, uint32_t il, td_layer *l) {
    char n[64];
    snprintf(n, sizeof n, "blk.%u.hc_attn", il);
    TRY(bind_hc(b, hp, n, 1, &l->hc_attn));
    snprintf(n, sizeof n, "blk.%u.hc_ffn", il);
    TRY(bind_hc(b, hp, n, 1, &l->hc_ffn));
    if (l->kind == TD_LAYER_HC_GDN) TRY(bind_q4x_gdn(b, hp, il, &l->gdn));
    else TRY(bind_q4x_attention(b, hp, il, l));
    if ((int64_t)il == hp->ple_layer) TRY(bind_q4x_ple(b, hp, il, &l->ple));
    return bind_moe_shexp_ffn(b, hp, il, 0, &l->ffn);
}

static int bind_qwen4exp_model(const td_binder *b, td_model *m) {
    const td_hparams *hp = &m->hp;
    const char *P = b->g->path;
    TRY(bind_hc(b, hp, "output_hc", 0, &m->hc_out));
    if (hp->ple_layer < 0)
        return td_bind_refuse(b, "per_layer_token_embd.weight",
                              "a PLE table without the ple.* keys: PLE is all-or-nothing");
    if (hp->ple_eos >= hp->n_vocab)
        return td_err_set(b->err, TD_EINPUT, "%s: key '%s.ple.eos_token_id': expected a token id < n_vocab = %u, found %u",
                          P, b->arch, hp->n_vocab, hp->ple_eos);
    if (hp->ple_image >= hp->n_vocab)
        return td_err_set(b->err, TD_EINPUT,
                          "%s: key '%s.ple.image_token_id': expected a token id < n_vocab = %u, found %u", P, b->arch,
                          hp->n_vocab, hp->ple_image);
    const char *name = "per_layer_token_embd.weight";
    const td_tensor *t = td_gguf_tensor(b->g, name);
    /* the converter pads the table: at least the rows the head ranges index */
    const uint64_t rows = t && t->ne[1] >= 0 && (uint64_t)t->ne[1] >= hp->ple_rows ? (uint64_t)t->ne[1] : hp->ple_rows;
    if (t && t->ne[0] == (int64_t)hp->ple_dim && (uint64_t)t->ne[1] < hp->ple_rows && t->ne[2] == 1)
        return td_err_set(b->err, TD_EINPUT,
                          "%s: tensor %s: expected at least max_h(O_h + V_h) = %llu rows, found %lld", P, name,
                          (unsigned long long)hp->ple_rows, (long long)t->ne[1]);
    return td_bind_tensor(b, name, TD_BIND_REQ, 2, hp->ple_dim, rows, 0, &m->ple_table);
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
    {
        .name = "qwen4exp",
        .arch = TD_ARCH_QWEN4EXP,
        .spec = "shared/spec/arch-qwen4exp.md",
        .rope = TD_ROPE_IMROPE,
        .default_scaling = TD_ROPE_SCALING_NONE,
        .traits = TD_ARCH_T_QK_NORM | TD_ARCH_T_MOE | TD_ARCH_T_PARTIAL_ROPE | TD_ARCH_T_SHARED_EXPERT |
                  TD_ARCH_T_ATTN_GATE | TD_ARCH_T_HC,
        .read_hparams = read_qwen4exp,
        .layer_kind = qwen4exp_kind,
        .bind_layer = bind_qwen4exp_layer,
        .bind_model = bind_qwen4exp_model,
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
    case TD_LAYER_HC_GDN: return "hc_gdn";
    case TD_LAYER_HC_QSA: return "hc_qsa";
    case TD_LAYER_KIND_COUNT: break;
    }
    return "unknown";
}
