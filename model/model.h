/* tapdiff: an architecture bound to a GGUF file: hyper-parameters with the
 * spec's defaults, every tensor the forward needs (checked for presence,
 * type and shape), and the vocabulary. One loader for every forward, so a
 * loader bug can never hide as a backend difference.
 * What is particular to one architecture is its descriptor (arch.h).
 * Facts: ../shared/spec/arch-{llama,qwen3,qwen3moe}.md. */
#ifndef TD_MODEL_H
#define TD_MODEL_H

#include "gguf.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum td_arch {
    TD_ARCH_LLAMA = 0,
    TD_ARCH_QWEN3 = 1,
    TD_ARCH_QWEN3MOE = 2,
    TD_ARCH_QWEN3NEXT = 3,
    TD_ARCH_QWEN4EXP = 4,
} td_arch;

typedef enum td_rope_type {
    TD_ROPE_NORM = 0, /* adjacent pairs (x[2i], x[2i+1]) */
    TD_ROPE_NEOX = 2, /* (x[i], x[i+R/2]) */
    TD_ROPE_IMROPE = 40, /* NEOX pairing, each pair's angle from one of 4 position components (primitives §2.2) */
} td_rope_type;

typedef enum td_rope_scaling {
    TD_ROPE_SCALING_NONE = 0,
    TD_ROPE_SCALING_LINEAR = 1,
    TD_ROPE_SCALING_YARN = 2,
} td_rope_scaling;

/* Letters follow the spec: E embedding, H heads, Hkv KV heads, D head dim,
 * F FFN width (per expert for MoE), X experts, K experts used, V vocab. */
typedef struct td_hparams {
    td_arch arch;
    uint32_t n_ctx_train;
    uint32_t n_embd;        /* E */
    uint32_t n_layer;
    uint32_t n_ff;          /* F: dense FFN width, or expert FFN width for MoE */
    uint32_t n_head;        /* H */
    uint32_t n_head_kv;     /* Hkv */
    uint32_t head_dim;      /* D (key_length == value_length) */
    uint32_t rope_dims;     /* R */
    float rms_eps;
    float rope_base;
    td_rope_type rope_type;
    td_rope_scaling rope_scaling;
    float rope_freq_scale; /* 1/factor */
    float rope_attn_factor;
    uint32_t rope_n_ctx_orig;
    uint32_t n_expert;      /* X; 0 for dense */
    uint32_t n_expert_used; /* K */
    uint32_t n_vocab;       /* V */
    /* hybrid recurrent architectures (qwen3next); 0 elsewhere. n_layer above
     * is the trunk: block_count minus the trailing MTP blocks. */
    uint32_t n_nextn;       /* MTP blocks after the trunk (not run) */
    uint32_t n_ff_shexp;    /* F_sh: shared-expert width; 0 = no shared expert */
    uint32_t ssm_conv;      /* K conv taps */
    uint32_t ssm_d_state;   /* d_k = d_v: GDN key (and value) head dim */
    uint32_t ssm_n_group;   /* H_k: GDN key heads */
    uint32_t ssm_dt_rank;   /* H_v: GDN value heads */
    uint32_t ssm_d_inner;   /* H_v * d_v */
    uint64_t recurrent[4];  /* bit il: trunk layer il is a GDN layer (at most 256 trunk layers) */
    /* qwen4exp (arch-qwen4exp.md §1.3-§1.5); 0 elsewhere */
    uint32_t rope_sections[4]; /* IMROPE [s0, s1, s2, s3] */
    uint32_t hc;               /* residual streams (> 1) */
    uint32_t hc_lr;            /* rank of the HC mixer's gate MLP */
    uint32_t idx_heads;        /* H_i indexer query heads */
    uint32_t idx_dim;          /* d_i indexer head dim */
    uint32_t idx_topk;         /* B token budget */
    uint32_t qsa_ratio[256];   /* r_N per trunk layer: QSA block size, 0 = dense attention */
    int32_t ple_layer;         /* the PLE layer, -1 = none */
    uint32_t ple_ngram;        /* n_g in [2, 8] */
    uint32_t ple_heads_per_ngram; /* h_g */
    uint32_t ple_n_heads;      /* n_p = (n_g - 1) h_g <= 64 */
    uint32_t ple_conv;         /* K_p conv taps (dilation n_g) */
    uint32_t ple_eos;          /* cuts the n-gram history */
    uint32_t ple_image;        /* hashed at embedding-input positions (= ple_eos when absent or 0) */
    uint32_t ple_dim;          /* d_p, one PLE table row; n_p * d_p = E */
    uint64_t ple_mult[8];      /* M_0..M_{n_g-1}, products wrap mod 2^64 */
    uint64_t ple_off[64];      /* O_h row offset of head h */
    uint64_t ple_vsz[64];      /* V_h modulus of head h */
    uint64_t ple_rows;         /* max_h (O_h + V_h): rows the table must have */
} td_hparams;

/* What a block computes before its FFN. Each kind has its own parts in
 * td_layer; a new kind (qwen3next's Gated DeltaNet, qwen4exp's layers) is
 * appended with its parts, and the forwards dispatch on it. */
typedef enum td_layer_kind {
    TD_LAYER_ATTENTION = 0, /* softmax self-attention over a KV cache */
    TD_LAYER_GDN = 1,       /* Gated DeltaNet: causal conv + delta-rule recurrent state (qwen3next) */
    /* qwen4exp: blocks inside hyper-connections (several residual streams);
     * their own kinds so that a forward without HC refuses them at open */
    TD_LAYER_HC_GDN = 2,    /* GDN with separate beta/alpha, tiled value heads, sigmoid output gate */
    TD_LAYER_HC_QSA = 3,    /* gated attention over the positions a QSA indexer selects (dense when r_N = 0) */
    TD_LAYER_KIND_COUNT
} td_layer_kind;

/* Parts of an attention layer. Optional ones are NULL when absent. */
typedef struct td_attn_parts {
    const td_tensor *norm;                       /* attn_norm {E} */
    const td_tensor *wq, *wk, *wv;               /* {E, H*D}, {E, Hkv*D} x2 (NULL if fused) */
    const td_tensor *wqkv;                       /* {E, (H+2Hkv)*D} fused alternative */
    const td_tensor *bq, *bk, *bv, *bqkv;        /* optional biases */
    const td_tensor *wo;                         /* {H*D, E} */
    const td_tensor *bo;                         /* optional {E} */
    const td_tensor *q_norm, *k_norm;            /* {D}: qwen3 family */
    int q_gated;                                 /* wq is {E, 2*H*D}: per head h rows [q_h (D); gate_h (D)],
                                                    and the output is ctx * sigmoid(gate) (qwen3next) */
} td_attn_parts;

/* Parts of a Gated DeltaNet layer (arch-qwen3next.md §3.2): C = 2*H_k*d_k +
 * H_v*d_v conv channels, in attn_qkv's row order [q; k; v]. */
typedef struct td_gdn_parts {
    const td_tensor *norm;     /* attn_norm {E} */
    const td_tensor *wqkv;     /* attn_qkv {E, C} */
    const td_tensor *wgate;    /* attn_gate {E, H_v*d_v}: the output gate z */
    const td_tensor *wba;      /* ssm_ba {E, 2*H_v}: per key head [beta x r; alpha x r] */
    const td_tensor *conv;     /* ssm_conv1d {K, C} */
    const td_tensor *dt_bias;  /* ssm_dt.bias {H_v} */
    const td_tensor *a;        /* ssm_a {H_v} = -exp(A_log) */
    const td_tensor *ssm_norm; /* {d_v}: gated RMSNorm weight, shared by the heads */
    const td_tensor *wout;     /* ssm_out {H_v*d_v, E} */
    const td_tensor *wbeta, *walpha; /* qwen4exp: ssm_beta, ssm_alpha {E, H_v} (tiled order; wba and norm NULL) */
} td_gdn_parts;

/* A hyper-connection mixer (arch-qwen4exp.md §4.1): gammas {E, hc} (stored
 * {E, hc} or flat {hc*E}, stream-major), down {hc*E, hc_lr}, up {hc_lr,
 * hc*E}, inject {hc*E, hc} (NULL for the final mixer). */
typedef struct td_hc_parts {
    const td_tensor *norm, *down, *up, *inject;
} td_hc_parts;

/* The QSA indexer of a qwen4exp attention layer (§3.3). */
typedef struct td_qsa_parts {
    const td_tensor *wq;     /* indexer.q_proj {E, H_i*d_i} */
    const td_tensor *wk;     /* indexer.k_proj {E, d_i}: one key head */
    const td_tensor *q_norm, *k_norm; /* {d_i} */
} td_qsa_parts;

/* The PLE block of the one PLE layer (§3.5). */
typedef struct td_ple_parts {
    const td_tensor *key;    /* ple_key {E, hc*E} */
    const td_tensor *value;  /* ple_value {E, E} */
    const td_tensor *norm_key, *norm_query, *norm_conv; /* {E, hc} */
    const td_tensor *conv;   /* ple_conv1d {K_p, hc*E} */
} td_ple_parts;

/* The FFN after the mixer: dense SwiGLU, or a softmax-routed MoE when the
 * router (gate_inp) is bound. */
typedef struct td_ffn_parts {
    const td_tensor *norm;                       /* ffn_norm {E} */
    const td_tensor *gate, *up;                  /* dense {E, F} */
    const td_tensor *down;                       /* dense {F, E} */
    const td_tensor *gate_inp;                   /* MoE router {E, X} */
    const td_tensor *gate_exps, *up_exps;        /* {E, F, X} (gate may be NULL for llama MoE) */
    const td_tensor *down_exps;                  /* {F, E, X} */
    const td_tensor *gate_inp_shexp;             /* shared-expert gate vector {E} (qwen3next) */
    const td_tensor *gate_shexp, *up_shexp;      /* {E, F_sh} */
    const td_tensor *down_shexp;                 /* {F_sh, E} */
} td_ffn_parts;

/* Tensors of one block: its kind, that kind's parts (the others stay
 * NULL), and the FFN every kind has. */
typedef struct td_layer {
    td_layer_kind kind;
    td_attn_parts attn; /* kind TD_LAYER_ATTENTION */
    td_gdn_parts gdn;   /* kind TD_LAYER_GDN */
    td_ffn_parts ffn;
    /* qwen4exp (kinds TD_LAYER_HC_*): attn holds the gated attention of an
     * HC_QSA block, gdn the mixer of an HC_GDN block; ffn.norm is NULL (the
     * HC mixer normalises) */
    td_hc_parts hc_attn, hc_ffn;
    td_qsa_parts qsa;   /* HC_QSA */
    td_ple_parts ple;   /* the PLE layer only */
} td_layer;

typedef enum td_vocab_kind {
    TD_VOCAB_NONE = 0,
    TD_VOCAB_SPM = 1,   /* tokenizer.ggml.model = "llama" */
    TD_VOCAB_BPE = 2,   /* "gpt2" */
    TD_VOCAB_OTHER = 3,
} td_vocab_kind;

typedef struct td_vocab {
    td_vocab_kind kind;
    char model[32];              /* tokenizer.ggml.model as stored */
    uint32_t n_tokens;
    const td_gguf_kv *tokens;    /* array of strings, may be NULL for NONE */
    const td_gguf_kv *scores;    /* optional */
    const td_gguf_kv *token_type;/* optional */
    uint64_t n_merges;
    int32_t bos_id, eos_id, unk_id; /* -1 when absent */
} td_vocab;

typedef struct td_model {
    td_gguf *gguf;
    td_hparams hp;
    const td_tensor *tok_embd;    /* {E, V} */
    const td_tensor *output_norm; /* {E}; NULL for qwen4exp (its final norm is the HC mixer hc_out) */
    const td_tensor *output;      /* {E, V}; == tok_embd when tied */
    int output_tied;
    const td_tensor *rope_freqs;  /* optional {R/2} (llama) */
    td_layer *layers;             /* n_layer entries */
    td_hc_parts hc_out;           /* qwen4exp: output_hc_{norm,down,up} */
    const td_tensor *ple_table;   /* qwen4exp: per_layer_token_embd {d_p, >= ple_rows} */
    td_vocab vocab;
} td_model;

/* Opens the GGUF, binds the architecture named by general.architecture and
 * validates hyper-parameters and every tensor shape. */
int td_model_open(td_model **out, const char *path, td_err *err);
/* Binds an already-open GGUF (takes ownership of g, also on failure). */
int td_model_bind(td_model **out, td_gguf *g, td_err *err);
void td_model_close(td_model *m);

/* "llama", ... from the architecture table (arch.h); "unknown" otherwise. */
const char *td_arch_name(td_arch a);
const char *td_rope_type_name(td_rope_type r);
const char *td_layer_kind_name(td_layer_kind k);

/* The piece of a token as stored in the vocab (SentencePiece "▁" and gpt2
 * byte-level characters are not translated). NULL when out of range. */
const char *td_vocab_piece(const td_model *m, int32_t id, uint64_t *len);
/* Printable text of a token for humans: SentencePiece "▁" -> ' ', <0xNN>
 * byte tokens -> that byte, gpt2 byte-level 'Ġ' -> ' ', 'Ċ' -> '\n'.
 * Writes a NUL-terminated string into buf; returns its length. */
size_t td_vocab_text(const td_model *m, int32_t id, char *buf, size_t bufsz);

#ifdef __cplusplus
}
#endif
#endif
