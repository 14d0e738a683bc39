/* tapdiff tap catalog: the table (see catalog.h) and its lookups. */
#include "catalog.h"

#include "td_common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ALL_ARCHS "llama,qwen3,qwen3moe"
#define QWEN_ARCHS "qwen3,qwen3moe"
#define DENSE_ARCHS "llama,qwen3"
#define MOE_ARCHS "qwen3moe"

/* Letters: T tokens in the step, E embedding, H query heads, Hkv KV heads,
 * D head dim, F FFN width (per expert for MoE), X experts, K experts used,
 * V vocabulary, W history window (16), n_kv cached positions. One row per tap;
 * rows of one layer in execution order. */
static const td_tap_entry catalog[] = {
    {"inp.tokens", TD_TAPC_I32, "T", ALL_ARCHS, "", "token ids this step consumed"},
    {"inp.pos", TD_TAPC_I32, "T", ALL_ARCHS, "", "their positions"},
    {"inp.embd", TD_TAPC_FLOAT, "T, E", ALL_ARCHS, "inp.tokens", "embedding rows"},
    {"blk.L.attn_norm", TD_TAPC_FLOAT, "T, E", ALL_ARCHS, "@prev", "RMSNorm(x)·w before attention"},
    {"blk.L.attn_q", TD_TAPC_FLOAT, "T, H·D", ALL_ARCHS, "attn_norm", "query projection"},
    {"blk.L.attn_k", TD_TAPC_FLOAT, "T, Hkv·D", ALL_ARCHS, "attn_norm", "key projection"},
    {"blk.L.attn_v", TD_TAPC_FLOAT, "T, Hkv·D", ALL_ARCHS, "attn_norm", "value projection"},
    {"blk.L.attn_q_norm", TD_TAPC_FLOAT, "T, H·D", QWEN_ARCHS, "attn_q", "per-head RMSNorm of Q"},
    {"blk.L.attn_k_norm", TD_TAPC_FLOAT, "T, Hkv·D", QWEN_ARCHS, "attn_k", "per-head RMSNorm of K"},
    {"blk.L.attn_q_rope", TD_TAPC_FLOAT, "T, H·D", ALL_ARCHS, "attn_q_norm|attn_q", "Q after RoPE"},
    {"blk.L.attn_k_rope", TD_TAPC_FLOAT, "T, Hkv·D", ALL_ARCHS, "attn_k_norm|attn_k", "K after RoPE"},
    {"blk.L.attn_probs", TD_TAPC_FLOAT, "H, T, n_kv", "", "attn_q_rope|attn_q_norm|attn_q, attn_k_rope|attn_k_norm|attn_k",
     "softmax(QKᵀ/√D) (optional, large: llamacpp with TD_LLAMACPP_ALL_NODES=1)"},
    {"blk.L.attn_ctx", TD_TAPC_FLOAT, "T, H·D", ALL_ARCHS,
     "attn_q_rope|attn_q_norm|attn_q, attn_k_rope|attn_k_norm|attn_k, attn_v",
     "softmax(QKᵀ/√D)·V, before the output projection"},
    {"blk.L.attn_out", TD_TAPC_FLOAT, "T, E", ALL_ARCHS, "attn_ctx", "after the output projection"},
    {"blk.L.ffn_inp", TD_TAPC_FLOAT, "T, E", ALL_ARCHS, "attn_out, @prev", "residual after attention"},
    {"blk.L.ffn_norm", TD_TAPC_FLOAT, "T, E", ALL_ARCHS, "ffn_inp", "RMSNorm before the FFN"},
    {"blk.L.ffn_gate", TD_TAPC_FLOAT, "T, F", DENSE_ARCHS, "ffn_norm", "dense FFN gate projection"},
    {"blk.L.ffn_up", TD_TAPC_FLOAT, "T, F", DENSE_ARCHS, "ffn_norm", "dense FFN up projection"},
    {"blk.L.ffn_act", TD_TAPC_FLOAT, "T, F", DENSE_ARCHS, "ffn_gate, ffn_up", "silu(gate)·up"},
    {"blk.L.moe_logits", TD_TAPC_FLOAT, "T, X", MOE_ARCHS, "ffn_norm", "router logits"},
    {"blk.L.moe_probs", TD_TAPC_FLOAT, "T, X", MOE_ARCHS, "moe_logits", "softmax over all experts"},
    {"blk.L.moe_topk", TD_TAPC_I32, "T, K", MOE_ARCHS, "moe_probs",
     "selected experts in rank order (ties: lower index first)"},
    {"blk.L.moe_weights", TD_TAPC_FLOAT, "T, K", MOE_ARCHS, "moe_probs", "renormalized expert weights"},
    {"blk.L.ffn_out", TD_TAPC_FLOAT, "T, E", ALL_ARCHS, "ffn_act|ffn_norm, moe_weights", "FFN or MoE output"},
    {"blk.L.out", TD_TAPC_FLOAT, "T, E", ALL_ARCHS, "ffn_out, ffn_inp", "layer output (residual after the FFN)"},
    {"out.norm", TD_TAPC_FLOAT, "T, E", ALL_ARCHS, "@last_out", "final norm"},
    {"out.logits", TD_TAPC_FLOAT, "T, V", ALL_ARCHS, "out.norm", "logits"},
    {"hist.tokens", TD_TAPC_I64, "≤W", ALL_ARCHS, "inp.tokens", "the last W token ids consumed, after this step"},
};

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
        snprintf(line, sizeof line, "| `%s` | %s | [%s] | %s | %s | %s |\n", e->name, td_tap_class_name(e->cls),
                 e->shape, *e->archs ? e->archs : "(optional)", from, e->meaning);
        put(&buf, &len, &cap, line);
    }
    return buf;
}
