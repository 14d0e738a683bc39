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
    case TD_LAYER_KIND_COUNT: break;
    }
    return "unknown";
}
