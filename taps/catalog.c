/* tapdiff tap catalog: the table (see catalog.h) and its lookups. */
#include "catalog.h"

#include "td_common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ALL_ARCHS "llama,qwen3,qwen3moe,qwen3next,qwen4exp"
#define ATTN_ARCHS "llama,qwen3,qwen3moe,qwen3next,qwen4exp" /* hybrids: in their attention layers only */
#define QWEN_ARCHS "qwen3,qwen3moe,qwen3next,qwen4exp"
#define DENSE_ARCHS "llama,qwen3"
#define MOE_ARCHS "qwen3moe,qwen3next,qwen4exp"
#define HYBRID_ARCHS "qwen3next,qwen4exp"
#define HC_ARCHS "qwen4exp" /* hyper-connections: hc residual streams */

/* Letters: T tokens in the step, E embedding, H query heads, Hkv KV heads,
 * D head dim, F FFN width (per expert for MoE), X experts, K experts used,
 * V vocabulary, W history window (16), n_kv cached positions; Gated DeltaNet:
 * Hk key heads, Hv value heads, dk their head dim, C = 2·Hk·dk + Hv·dk conv
 * channels, S = conv taps − 1 (conv state length); hyper-connections
 * (qwen4exp): hc streams; PLE: Ng n-gram size, Np = (Ng − 1)·hg hash heads,
 * Kp its conv taps; QSA: Hi indexer heads of di dims, r block size, NB =
 * floor(n_kv / r) complete blocks, Wq = B + r − 1 selected positions. A
 * stream stack (T, hc·E; hc = 1 but for qwen4exp) is stream-major: row t holds stream 0's
 * E values, then stream 1's. One row per tap; rows of one layer in
 * execution order. */
static const td_tap_entry catalog[] = {
    {"inp.tokens", TD_TAPC_I32, "T", ALL_ARCHS, "", "token ids this step consumed"},
    {"inp.pos", TD_TAPC_I32, "T", ALL_ARCHS, "", "their positions"},
    {"inp.embd", TD_TAPC_FLOAT, "T, E", ALL_ARCHS, "inp.tokens", "embedding rows"},
    {"inp.ple_ids", TD_TAPC_I32, "T, Ng", HC_ARCHS, "inp.tokens",
     "PLE n-gram context per token: its id, then its Ng − 1 predecessors' (the EOS id from the first missing or EOS "
     "one on)"},
    {"inp.ple_rows", TD_TAPC_I32, "T, Np", HC_ARCHS, "inp.ple_ids",
     "PLE table rows hashed from the n-grams, (X_n mod V_h) + O_h in head order (64-bit wrapping products)"},
    {"inp.ple_embd", TD_TAPC_FLOAT, "T, E", HC_ARCHS, "inp.ple_rows", "the hashed PLE rows concatenated (P)"},
    {"blk.L.ple_gate", TD_TAPC_FLOAT, "T, hc", HC_ARCHS, "inp.ple_embd, @prev",
     "PLE gate per stream, σ(sign(s)·√|s|) of the key/query score (the PLE layer only)"},
    {"blk.L.ple_gated", TD_TAPC_FLOAT, "T, hc·E", HC_ARCHS, "ple_gate, inp.ple_embd",
     "gated PLE value per stream, g_c·W_value·P (the PLE layer only)"},
    {"blk.L.ple_conv", TD_TAPC_FLOAT, "T, hc·E", HC_ARCHS, "ple_gated",
     "silu of the dilated causal conv over RMSNorm(gated value) (the PLE layer only)"},
    {"blk.L.ple_conv_state", TD_TAPC_FLOAT, "(Kp−1)·Ng, hc·E", HC_ARCHS, "ple_gated",
     "PLE conv history after the step: the last (Kp−1)·Ng conv inputs, oldest first (the PLE layer only)"},
    {"blk.L.ple_out", TD_TAPC_FLOAT, "T, hc·E", HC_ARCHS, "ple_gated, ple_conv, @prev",
     "streams after the PLE block, Rs + gated value + conv (the PLE layer only)"},
    {"blk.L.hc_attn_gate", TD_TAPC_FLOAT, "T, hc·E", HC_ARCHS, "ple_out|@prev",
     "attention HC mixer gate γ = W_up·silu(W_down·flat / hc), before its sigmoid"},
    {"blk.L.hc_attn_inject", TD_TAPC_FLOAT, "T, hc", HC_ARCHS, "ple_out|@prev",
     "attention HC inject W_inject·flat (the streams add 2σ(inject/hc)·y)"},
    {"blk.L.attn_norm", TD_TAPC_FLOAT, "T, E", ALL_ARCHS, "@prev",
     "RMSNorm(x)·w before attention (qwen4exp: the attention HC mixer's output u)"},
    {"blk.L.attn_q", TD_TAPC_FLOAT, "T, H·D", ATTN_ARCHS, "attn_norm", "query projection"},
    {"blk.L.attn_k", TD_TAPC_FLOAT, "T, Hkv·D", ATTN_ARCHS, "attn_norm", "key projection"},
    {"blk.L.attn_v", TD_TAPC_FLOAT, "T, Hkv·D", ATTN_ARCHS, "attn_norm", "value projection"},
    {"blk.L.attn_gate", TD_TAPC_FLOAT, "T, H·D", HYBRID_ARCHS, "attn_norm",
     "attention output gate (the second half of each head's attn_q rows), before its sigmoid"},
    {"blk.L.attn_q_norm", TD_TAPC_FLOAT, "T, H·D", QWEN_ARCHS, "attn_q", "per-head RMSNorm of Q"},
    {"blk.L.attn_k_norm", TD_TAPC_FLOAT, "T, Hkv·D", QWEN_ARCHS, "attn_k", "per-head RMSNorm of K"},
    {"blk.L.attn_q_rope", TD_TAPC_FLOAT, "T, H·D", ATTN_ARCHS, "attn_q_norm|attn_q", "Q after RoPE"},
    {"blk.L.attn_k_rope", TD_TAPC_FLOAT, "T, Hkv·D", ATTN_ARCHS, "attn_k_norm|attn_k", "K after RoPE"},
    {"blk.L.qsa_k_raw", TD_TAPC_FLOAT, "T, di", HC_ARCHS, "attn_norm",
     "QSA indexer key W_ik·u as cached (no norm, no RoPE)"},
    {"blk.L.qsa_q", TD_TAPC_FLOAT, "T, Hi·di", HC_ARCHS, "attn_norm",
     "QSA indexer queries after their RMSNorm and IMROPE"},
    {"blk.L.qsa_kcache", TD_TAPC_FLOAT, "n_kv, di", HC_ARCHS, "qsa_k_raw",
     "the sequence's indexer key cache after the step, one raw key per cached position"},
    {"blk.L.qsa_scores", TD_TAPC_FLOAT, "T, NB", HC_ARCHS, "qsa_q, qsa_kcache",
     "indexer block scores Σ_heads ReLU(q̃·k̃_b) per token; −1 where block b is not complete for that token"},
    {"blk.L.qsa_sel", TD_TAPC_I32, "T, Wq", HC_ARCHS, "qsa_scores",
     "QSA selected key positions in rank order: the incomplete tail ascending, then whole blocks by descending "
     "score (equal scores: lower block first), positions ascending in a block; −1 pads "
     "(dense while p < Wq: 0..p ascending)"},
    {"blk.L.attn_probs", TD_TAPC_FLOAT, "H, T, n_kv", "", "attn_q_rope|attn_q_norm|attn_q, attn_k_rope|attn_k_norm|attn_k",
     "softmax(QKᵀ/√D) (optional, large: llamacpp with TD_LLAMACPP_ALL_NODES=1)"},
    {"blk.L.attn_ctx", TD_TAPC_FLOAT, "T, H·D", ATTN_ARCHS,
     "attn_q_rope|attn_q_norm|attn_q, attn_k_rope|attn_k_norm|attn_k, attn_v",
     "softmax(QKᵀ/√D)·V, before the output projection"},
    {"blk.L.attn_gated", TD_TAPC_FLOAT, "T, H·D", HYBRID_ARCHS, "attn_ctx, attn_gate", "attn_ctx·sigmoid(attn_gate)"},
    {"blk.L.attn_out", TD_TAPC_FLOAT, "T, E", ATTN_ARCHS, "attn_gated|attn_ctx", "after the output projection"},
    {"blk.L.ssm_qkv", TD_TAPC_FLOAT, "T, C", HYBRID_ARCHS, "attn_norm", "GDN input projection [q; k; v] before the conv"},
    {"blk.L.ssm_z", TD_TAPC_FLOAT, "T, Hv·dk", HYBRID_ARCHS, "attn_norm", "GDN output gate z"},
    {"blk.L.ssm_beta", TD_TAPC_FLOAT, "T, Hv", HYBRID_ARCHS, "attn_norm", "GDN write strength sigmoid(b)"},
    {"blk.L.ssm_gate", TD_TAPC_FLOAT, "T, Hv", HYBRID_ARCHS, "attn_norm",
     "GDN log-decay ssm_a·softplus(a + dt_bias) (<= 0; the state decays by its exp)"},
    {"blk.L.ssm_q", TD_TAPC_FLOAT, "T, Hk·dk", HYBRID_ARCHS, "ssm_qkv", "GDN q after the causal conv and silu"},
    {"blk.L.ssm_k", TD_TAPC_FLOAT, "T, Hk·dk", HYBRID_ARCHS, "ssm_qkv", "GDN k after the causal conv and silu"},
    {"blk.L.ssm_v", TD_TAPC_FLOAT, "T, Hv·dk", HYBRID_ARCHS, "ssm_qkv", "GDN v after the causal conv and silu"},
    {"blk.L.ssm_conv_state", TD_TAPC_FLOAT, "C, S", HYBRID_ARCHS, "ssm_qkv",
     "conv state after the step: the last S inputs per channel, oldest first"},
    {"blk.L.ssm_core", TD_TAPC_FLOAT, "T, Hv·dk", HYBRID_ARCHS, "ssm_q, ssm_k, ssm_v",
     "delta-rule output Sᵀq/√dk per value head (L2-normed q, k)"},
    {"blk.L.ssm_state", TD_TAPC_FLOAT, "Hv, dk, dk", HYBRID_ARCHS, "ssm_q, ssm_k, ssm_v",
     "recurrent state S after the step, [head][value j][key i] (llama.cpp's layout)"},
    {"blk.L.ssm_gated", TD_TAPC_FLOAT, "T, Hv·dk", HYBRID_ARCHS, "ssm_core, ssm_z",
     "RMSNorm(core; ssm_norm)·silu(z) per value head (qwen4exp: ·σ(z))"},
    {"blk.L.ssm_out", TD_TAPC_FLOAT, "T, E", HYBRID_ARCHS, "ssm_gated", "GDN output projection"},
    {"blk.L.ffn_inp", TD_TAPC_FLOAT, "T, hc·E", ALL_ARCHS, "attn_out|ssm_out, @prev",
     "residual after attention (hc = 1 but for qwen4exp's hyper-connections: its stream stack)"},
    {"blk.L.hc_ffn_gate", TD_TAPC_FLOAT, "T, hc·E", HC_ARCHS, "ffn_inp", "FFN HC mixer gate γ, before its sigmoid"},
    {"blk.L.hc_ffn_inject", TD_TAPC_FLOAT, "T, hc", HC_ARCHS, "ffn_inp", "FFN HC inject W_inject·flat"},
    {"blk.L.ffn_norm", TD_TAPC_FLOAT, "T, E", ALL_ARCHS, "ffn_inp",
     "RMSNorm before the FFN (qwen4exp: the FFN HC mixer's output)"},
    {"blk.L.ffn_gate", TD_TAPC_FLOAT, "T, F", DENSE_ARCHS, "ffn_norm", "dense FFN gate projection"},
    {"blk.L.ffn_up", TD_TAPC_FLOAT, "T, F", DENSE_ARCHS, "ffn_norm", "dense FFN up projection"},
    {"blk.L.ffn_act", TD_TAPC_FLOAT, "T, F", DENSE_ARCHS, "ffn_gate, ffn_up", "silu(gate)·up"},
    {"blk.L.moe_logits", TD_TAPC_FLOAT, "T, X", MOE_ARCHS, "ffn_norm", "router logits"},
    {"blk.L.moe_probs", TD_TAPC_FLOAT, "T, X", MOE_ARCHS, "moe_logits", "softmax over all experts"},
    {"blk.L.moe_topk", TD_TAPC_I32, "T, K", MOE_ARCHS, "moe_probs",
     "selected experts in rank order (ties: lower index first)"},
    {"blk.L.moe_weights", TD_TAPC_FLOAT, "T, K", MOE_ARCHS, "moe_probs", "renormalized expert weights"},
    {"blk.L.ffn_shexp", TD_TAPC_FLOAT, "T, E", HYBRID_ARCHS, "ffn_norm", "shared expert's SwiGLU output, before its gate"},
    {"blk.L.ffn_shexp_gate", TD_TAPC_FLOAT, "T", HYBRID_ARCHS, "ffn_norm", "shared-expert gate sigmoid(w·x), one per token"},
    {"blk.L.ffn_out", TD_TAPC_FLOAT, "T, E", ALL_ARCHS, "ffn_act|ffn_norm, moe_weights, ffn_shexp|ffn_norm",
     "FFN or MoE output (+ the gated shared expert)"},
    {"blk.L.out", TD_TAPC_FLOAT, "T, hc·E", ALL_ARCHS, "ffn_out, ffn_inp",
     "layer output, the residual after the FFN (hc = 1 but for qwen4exp: its stream stack)"},
    {"out.hc_gate", TD_TAPC_FLOAT, "T, hc·E", HC_ARCHS, "@last_out", "final HC mixer gate γ, before its sigmoid"},
    {"out.norm", TD_TAPC_FLOAT, "T, E", ALL_ARCHS, "@last_out", "final norm (qwen4exp: the final HC mixer's output)"},
    {"out.logits", TD_TAPC_FLOAT, "T, V", ALL_ARCHS, "out.norm", "logits"},
    {"hist.tokens", TD_TAPC_I64, "≤W", ALL_ARCHS, "inp.tokens", "the last W token ids consumed, after this step"},
};

/* The rows a hybrid architecture emits in some of its layers only: by kind. */
static const struct {
    const char *name, *kinds;
} kinds[] = {
    {"blk.L.attn_q", "attention,hc_qsa"},
    {"blk.L.attn_k", "attention,hc_qsa"},
    {"blk.L.attn_v", "attention,hc_qsa"},
    {"blk.L.attn_gate", "attention,hc_qsa"},
    {"blk.L.attn_q_norm", "attention,hc_qsa"},
    {"blk.L.attn_k_norm", "attention,hc_qsa"},
    {"blk.L.attn_q_rope", "attention,hc_qsa"},
    {"blk.L.attn_k_rope", "attention,hc_qsa"},
    {"blk.L.attn_ctx", "attention,hc_qsa"},
    {"blk.L.attn_gated", "attention,hc_qsa"},
    {"blk.L.attn_out", "attention,hc_qsa"},
    {"blk.L.ssm_qkv", "gdn,hc_gdn"},
    {"blk.L.ssm_z", "gdn,hc_gdn"},
    {"blk.L.ssm_beta", "gdn,hc_gdn"},
    {"blk.L.ssm_gate", "gdn,hc_gdn"},
    {"blk.L.ssm_q", "gdn,hc_gdn"},
    {"blk.L.ssm_k", "gdn,hc_gdn"},
    {"blk.L.ssm_v", "gdn,hc_gdn"},
    {"blk.L.ssm_conv_state", "gdn,hc_gdn"},
    {"blk.L.ssm_core", "gdn,hc_gdn"},
    {"blk.L.ssm_state", "gdn,hc_gdn"},
    {"blk.L.ssm_gated", "gdn,hc_gdn"},
    {"blk.L.ssm_out", "gdn,hc_gdn"},
    {"blk.L.ple_gate", "hc_gdn"},
    {"blk.L.ple_gated", "hc_gdn"},
    {"blk.L.ple_conv", "hc_gdn"},
    {"blk.L.ple_conv_state", "hc_gdn"},
    {"blk.L.ple_out", "hc_gdn"},
    {"blk.L.qsa_k_raw", "hc_qsa"},
    {"blk.L.qsa_q", "hc_qsa"},
    {"blk.L.qsa_kcache", "hc_qsa"},
    {"blk.L.qsa_scores", "hc_qsa"},
    {"blk.L.qsa_sel", "hc_qsa"},
};

const char *td_tap_catalog_kinds(const td_tap_entry *e) {
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        if (!strcmp(kinds[i].name, e->name)) return kinds[i].kinds;
    return NULL;
}

/* Sliding copies of their input's rows (td_tap_catalog_copy_axis). Not
 * ple_conv_state: it holds RMSNorm'd ple_gated rows, arithmetic of its input. */
static const struct {
    const char *name;
    int axis;
} copies[] = {
    {"blk.L.ssm_conv_state", 1}, // [C, S]: the last S ssm_qkv rows as columns
};

int td_tap_catalog_copy_axis(const td_tap_entry *e) {
    for (size_t i = 0; i < sizeof copies / sizeof copies[0]; i++)
        if (!strcmp(copies[i].name, e->name)) return copies[i].axis;
    return -1;
}

/* Readers of cached rows of earlier steps (td_tap_catalog_cached_groups). */
static const struct {
    const char *name;
    unsigned groups;
} cached[] = {
    {"blk.L.attn_probs", 0x2}, // K (group 1) of every cached position
    {"blk.L.attn_ctx", 0x6},   // K and V (groups 1, 2) of every cached position
};

unsigned td_tap_catalog_cached_groups(const td_tap_entry *e) {
    for (size_t i = 0; i < sizeof cached / sizeof cached[0]; i++)
        if (!strcmp(cached[i].name, e->name)) return cached[i].groups;
    return 0;
}

const td_tap_entry *td_tap_catalog(size_t *n) {
    *n = sizeof catalog / sizeof catalog[0];
    return catalog;
}

// "blk.<L>.<base>": the base and L, else NULL.
static const char *blk_base(const char *name, long *layer) {
    if (strncmp(name, "blk.", 4) != 0 || name[4] < '0' || name[4] > '9') return NULL;
    char *end;
    long l = strtol(name + 4, &end, 10);
    if (*end != '.' || l < 0) return NULL;
    *layer = l;
    return end + 1;
}

const td_tap_entry *td_tap_catalog_find(const char *full_name, long *layer) {
    long L = -1;
    const char *base = blk_base(full_name, &L);
    for (size_t i = 0; i < sizeof catalog / sizeof catalog[0]; i++) {
        const char *n = catalog[i].name;
        int per_layer = strncmp(n, "blk.L.", 6) == 0;
        int match = base ? (per_layer && strcmp(n + 6, base) == 0) : (!per_layer && strcmp(n, full_name) == 0);
        if (match) {
            if (layer) *layer = base ? L : -1;
            return &catalog[i];
        }
    }
    return NULL;
}

int td_tap_catalog_has_arch(const td_tap_entry *e, const char *arch) {
    size_t n = strlen(arch);
    for (const char *p = e->archs; *p;) {
        const char *c = strchr(p, ',');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        if (len == n && strncmp(p, arch, n) == 0) return 1;
        if (!c) break;
        p = c + 1;
    }
    return 0;
}

int td_tap_catalog_dtype_ok(const td_tap_entry *e, td_dtype dt) {
    switch (e->cls) {
    case TD_TAPC_FLOAT: return dt == TD_DT_F64 || dt == TD_DT_F32 || dt == TD_DT_F16 || dt == TD_DT_BF16;
    case TD_TAPC_I32: return dt == TD_DT_I32;
    case TD_TAPC_I64: return dt == TD_DT_I64;
    }
    return 0;
}

const char *td_tap_class_name(td_tap_class c) {
    switch (c) {
    case TD_TAPC_FLOAT: return "float";
    case TD_TAPC_I32: return "i32";
    case TD_TAPC_I64: return "i64";
    }
    return "?";
}

// One producer term (already trimmed) of layer L as a full name; 0 if it
// cannot be named (a "@last_out").
static int producer_name(const char *term, size_t len, long L, char out[TD_TAP_NAME_MAX]) {
    if (len == 5 && strncmp(term, "@prev", 5) == 0) {
        if (L <= 0)
            snprintf(out, TD_TAP_NAME_MAX, "inp.embd");
        else
            snprintf(out, TD_TAP_NAME_MAX, "blk.%ld.out", L - 1);
    } else if (L >= 0 && !memchr(term, '.', len)) {
        snprintf(out, TD_TAP_NAME_MAX, "blk.%ld.%.*s", L, (int)len, term);
    } else {
        snprintf(out, TD_TAP_NAME_MAX, "%.*s", (int)len, term);
    }
    return 1;
}

int td_tap_catalog_inputs(const char *name, char groups[][3][TD_TAP_NAME_MAX], int max_groups,
                          int *wants_last_out) {
    *wants_last_out = 0;
    long L = -1;
    const td_tap_entry *e = td_tap_catalog_find(name, &L);
    if (!e) return 0;
    if (strcmp(e->producers, "@last_out") == 0) {
        *wants_last_out = 1;
        return 0;
    }
    int n = 0;
    const char *p = e->producers;
    while (*p && n < max_groups) {
        const char *gend = strchr(p, ',');
        if (!gend) gend = p + strlen(p);
        memset(groups[n], 0, sizeof groups[n]);
        int a = 0;
        for (const char *q = p; q < gend && a < 3;) {
            const char *aend = memchr(q, '|', (size_t)(gend - q));
            if (!aend) aend = gend;
            const char *s = q, *t = aend;
            while (s < t && *s == ' ') s++;
            while (t > s && t[-1] == ' ') t--;
            if (t > s && producer_name(s, (size_t)(t - s), L, groups[n][a])) a++;
            q = aend + (aend < gend);
        }
        if (a) n++;
        p = *gend ? gend + 1 : gend;
    }
    return n;
}

// Appends to a growing buffer.
static void put(char **buf, size_t *len, size_t *cap, const char *s) {
    size_t n = strlen(s);
    if (*len + n + 1 > *cap) {
        *cap = (*len + n + 1) * 2;
        *buf = td_xrealloc(*buf, *cap);
    }
    memcpy(*buf + *len, s, n + 1);
    *len += n;
}

char *td_tap_catalog_markdown(void) {
    char *buf = NULL, line[1024];
    size_t len = 0, cap = 0;
    put(&buf, &len, &cap, "| tap | dtype | shape | architectures | from | meaning |\n|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < sizeof catalog / sizeof catalog[0]; i++) {
        const td_tap_entry *e = &catalog[i];
        const char *kinds_of = td_tap_catalog_kinds(e);
        // '|' would end a Markdown cell: alternatives read "a or b"
        char from[256];
        size_t k = 0;
        for (const char *p = e->producers; *p && k + 4 < sizeof from; p++) {
            if (*p == '|') {
                memcpy(from + k, " or ", 4);
                k += 4;
            } else {
                from[k++] = *p;
            }
        }
        from[k] = '\0';
        snprintf(line, sizeof line, "| `%s` | %s | [%s] | %s | %s | %s%s%s%s |\n", e->name, td_tap_class_name(e->cls),
                 e->shape, *e->archs ? e->archs : "(optional)", from, e->meaning, kinds_of ? " (hybrids: in " : "",
                 kinds_of ? kinds_of : "", kinds_of ? " layers)" : "");
        put(&buf, &len, &cap, line);
    }
    return buf;
}
