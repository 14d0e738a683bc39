/* tapdiff: the architecture table. One descriptor per architecture says
 * everything particular to it: its name, the spec it follows, its traits,
 * how to read its hyper-parameters (the spec's defaults), the kind of each
 * layer and how to bind that layer's tensors. Everything else asks the table:
 * the loader (model.c), the forwards (through td_layer kinds and the traits),
 * fixtures, `inspect`. Adding an architecture is one descriptor in arch.c.
 *
 * The second half of this header is the binder the descriptors are written
 * with (key readers with defaults, shape-checked tensor binding); it belongs
 * to model/ and is not for other folders. */
#ifndef TD_ARCH_H
#define TD_ARCH_H

#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Traits: facts about an architecture the forwards and fixtures act on. */
enum {
    TD_ARCH_T_QK_NORM = 1u << 0,     /* per-head RMSNorm of q and k before RoPE (attn_q_norm, attn_k_norm) */
    TD_ARCH_T_MOE = 1u << 1,         /* every FFN is a routed MoE (expert_count required, > 0) */
    TD_ARCH_T_MOE_OPTIONAL = 1u << 2,/* MoE when expert_count > 0, else dense (Mixtral-style llama) */
    TD_ARCH_T_ATTN_OUT_BIAS = 1u << 3,/* attn_output.bias is read when present */
    TD_ARCH_T_ROPE_FREQS = 1u << 4,  /* rope_freqs.weight frequency factors are read when present */
    TD_ARCH_T_PARTIAL_ROPE = 1u << 5,/* rope.dimension_count R may be < D (dims R..D-1 pass unrotated) */
    TD_ARCH_T_SHARED_EXPERT = 1u << 6,/* every MoE has a sigmoid-gated shared expert (ffn_*_shexp) */
    TD_ARCH_T_ATTN_GATE = 1u << 7,   /* attn_q holds [q; gate] per head; output = ctx * sigmoid(gate) */
    TD_ARCH_T_HC = 1u << 8,          /* hyper-connections: no output_norm, the final norm is an HC mixer */
};

typedef struct td_binder td_binder;

typedef struct td_arch_desc {
    const char *name;                /* general.architecture */
    td_arch arch;
    const char *spec;                /* where the facts are, relative to the repository's parent */
    td_rope_type rope;
    td_rope_scaling default_scaling; /* the spec table's default rope.scaling.type */
    unsigned traits;                 /* TD_ARCH_T_* */
    /* The architecture's own keys, after the shared attention and RoPE keys
     * (model.c): FFN width and experts. */
    int (*read_hparams)(const td_binder *b, td_hparams *hp);
    /* The kind of block il. */
    td_layer_kind (*layer_kind)(const td_hparams *hp, uint32_t il);
    /* Binds block il (l->kind already set) with shapes from hp. */
    int (*bind_layer)(const td_binder *b, const td_hparams *hp, uint32_t il, td_layer *l);
    /* (optional) model-level tensors beyond embeddings, output and norm */
    int (*bind_model)(const td_binder *b, td_model *m);
} td_arch_desc;

size_t td_arch_count(void);
/* NULL when i >= td_arch_count(). */
const td_arch_desc *td_arch_at(size_t i);
/* NULL for an unknown name / id. */
const td_arch_desc *td_arch_find(const char *name);
const td_arch_desc *td_arch_get(td_arch a);
/* "llama, qwen3, qwen3moe" into buf (truncated to bufsz). */
void td_arch_names(char *buf, size_t bufsz, const char *sep);

/* ------------------------------------------------------------------------ */
/* The binder (model/ only)                                                   */

struct td_binder {
    const td_gguf *g;
    const char *arch; /* key prefix */
    td_err *err;
};

enum { TD_BIND_OPT = 0, TD_BIND_REQ = 1 };

/* <arch>.<suffix> as u32, or as an all-equal per-layer array when n_layer > 0. */
int td_bind_u32(const td_binder *b, const char *suffix, int required, uint32_t def, uint32_t n_layer, uint32_t *out);
int td_bind_f32(const td_binder *b, const char *suffix, int required, float def, float *out);
int td_bind_has(const td_binder *b, const char *suffix);
/* Binds tensor `name` if present: shape {ne0[, ne1[, ne2]]} (nd dims, the
 * rest 1), a decodable type, a float type for 1-D weights. */
int td_bind_tensor(const td_binder *b, const char *name, int required, uint32_t nd, uint64_t ne0, uint64_t ne1,
                   uint64_t ne2, const td_tensor **out);
/* Refuses a tensor the forward would need but has no slot for. */
int td_bind_refuse(const td_binder *b, const char *name, const char *why);
/* a*b, saturated: a shape that overflows can then never match a stored one */
uint64_t td_bind_mul_sat(uint64_t a, uint64_t b);

#ifdef __cplusplus
}
#endif
#endif
