/* tapdiff: binds an architecture (llama, qwen3, qwen3moe) to a parsed GGUF:
 * hyper-parameters with the spec's defaults, every tensor the forwards use
 * (presence, decodable type, shape against the hyper-parameters) and the
 * vocabulary. Every forward trusts what this file accepts, so it refuses
 * anything it cannot vouch for with one line naming file, key or tensor,
 * expected and found. Facts: ../shared/spec/arch-{llama,qwen3,qwen3moe}.md,
 * primitives.md §2.3, gguf.md §3.3-3.4, §6, §8.
 *
 * What differs between architectures is their descriptor (arch.c); this file
 * is what they share: the attention and RoPE keys, the vocabulary, the
 * binder, and the walk over the table's hooks.
 *
 * Decisions where the spec leaves room (the others are in arch.c):
 * - Tensors the architecture does not know are ignored (llama.cpp refuses
 *   them; tapdiff is lenient), except ones the forward would need but has no
 *   slot for (".scale" side-cars of bound weights): those would silently
 *   change the math, so they are refused.
 * - A token id of -1 / 0xFFFFFFFF (llama.cpp's "no token") reads as absent. */
#include "model.h"

#include "arch.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Names                                                                      */

const char *td_rope_type_name(td_rope_type r) {
    switch (r) {
    case TD_ROPE_NORM: return "NORM";
    case TD_ROPE_NEOX: return "NEOX";
    case TD_ROPE_IMROPE: return "IMROPE";
    }
    return "unknown";
}

/* ------------------------------------------------------------------------ */
/* Metadata helpers                                                           */

typedef td_binder binder;

static const char *key_of(const binder *b, const char *suffix, char *buf, size_t n) {
    snprintf(buf, n, "%s.%s", b->arch, suffix);
    return buf;
}

/* <arch>.<suffix> as u32, or as an all-equal per-layer array when n_layer > 0. */
int td_bind_u32(const binder *b, const char *suffix, int required, uint32_t def, uint32_t n_layer, uint32_t *out) {
    char key[160];
    key_of(b, suffix, key, sizeof key);
    if (n_layer) return td_gguf_get_u32_or_arr(b->g, key, required, def, n_layer, out, b->err);
    return td_gguf_get_u32(b->g, key, required, def, out, b->err);
}

int td_bind_f32(const binder *b, const char *suffix, int required, float def, float *out) {
    char key[160];
    return td_gguf_get_f32(b->g, key_of(b, suffix, key, sizeof key), required, def, out, b->err);
}

int td_bind_has(const binder *b, const char *suffix) {
    char key[160];
    return td_gguf_find(b->g, key_of(b, suffix, key, sizeof key)) != NULL;
}

#define TRY(x)                                                                                                       \
    do {                                                                                                             \
        int st_ = (x);                                                                                               \
        if (st_ != TD_OK) return st_;                                                                                \
    } while (0)

/* ------------------------------------------------------------------------ */
/* Hyper-parameters                                                           */

static int read_hparams(const binder *b, const td_arch_desc *ad, td_hparams *hp) {
    const td_gguf *g = b->g;
    const char *P = g->path;
    const char *A = b->arch;
    hp->arch = ad->arch;
    hp->rope_type = ad->rope;

    TRY(td_bind_u32(b, "context_length", 1, 0, 0, &hp->n_ctx_train));
    TRY(td_bind_u32(b, "embedding_length", 1, 0, 0, &hp->n_embd));
    TRY(td_bind_u32(b, "block_count", 1, 0, 0, &hp->n_layer));
    if (hp->n_embd == 0)
        return td_err_set(b->err, TD_EINPUT, "%s: key '%s.embedding_length': expected > 0, found 0", P, A);
    if (hp->n_layer == 0)
        return td_err_set(b->err, TD_EINPUT, "%s: key '%s.block_count': expected > 0, found 0", P, A);
    /* Every block needs several tensors; checking this first keeps a corrupt
     * count from sizing the layer table (and per-layer arrays) absurdly. */
    if (hp->n_layer > g->n_tensors)
        return td_err_set(b->err, TD_EINPUT,
                          "%s: key '%s.block_count' = %u: expected at most the file's tensor count (%llu), found more "
                          "blocks than tensors",
                          P, A, hp->n_layer, (unsigned long long)g->n_tensors);
    const uint32_t L = hp->n_layer;

    /* --- attention heads --- */
    TRY(td_bind_u32(b, "attention.head_count", 1, 0, L, &hp->n_head));
    if (hp->n_head == 0)
        return td_err_set(b->err, TD_EINPUT, "%s: key '%s.attention.head_count': expected H > 0, found 0", P, A);
    TRY(td_bind_u32(b, "attention.head_count_kv", 0, hp->n_head, L, &hp->n_head_kv));
    const uint32_t H = hp->n_head, Hkv = hp->n_head_kv;
    if (Hkv == 0)
        return td_err_set(b->err, TD_EINPUT, "%s: key '%s.attention.head_count_kv': expected Hkv > 0, found 0", P, A);
    if (Hkv > H)
        return td_err_set(b->err, TD_EINPUT,
                          "%s: key '%s.attention.head_count_kv': expected Hkv <= H = %u, found Hkv = %u", P, A, H, Hkv);
    if (H % Hkv != 0)
        return td_err_set(b->err, TD_EINPUT,
                          "%s: key '%s.attention.head_count_kv': expected Hkv to divide H = %u (GQA groups), found Hkv "
                          "= %u (H %% Hkv = %u)",
                          P, A, H, Hkv, H % Hkv);

    /* --- head dim D: key_length, else E/H which must then be integral --- */
    const int e_div_h = hp->n_embd % H == 0;
    const uint32_t e_over_h = hp->n_embd / H;
    if (!td_bind_has(b, "attention.key_length") && !e_div_h)
        return td_err_set(b->err, TD_EINPUT,
                          "%s: key '%s.attention.key_length' is absent, so head dim = n_embd/H: expected n_embd = %u "
                          "to be a multiple of H = %u, found remainder %u",
                          P, A, hp->n_embd, H, hp->n_embd % H);
    TRY(td_bind_u32(b, "attention.key_length", 0, e_over_h, 0, &hp->head_dim));
    if (hp->head_dim == 0)
        return td_err_set(b->err, TD_EINPUT, "%s: key '%s.attention.key_length': expected D > 0, found 0", P, A);
    if (!td_bind_has(b, "attention.value_length") && !e_div_h)
        return td_err_set(b->err, TD_EINPUT,
                          "%s: key '%s.attention.value_length' is absent, so it defaults to n_embd/H: expected n_embd "
                          "= %u to be a multiple of H = %u, found remainder %u",
                          P, A, hp->n_embd, H, hp->n_embd % H);
    uint32_t dv;
    TRY(td_bind_u32(b, "attention.value_length", 0, e_over_h, 0, &dv));
    if (dv != hp->head_dim)
        return td_err_set(b->err, TD_EINPUT,
                          "%s: key '%s.attention.value_length': expected value_length == key_length = %u, found %u%s",
                          P, A, hp->head_dim, dv,
                          td_bind_has(b, "attention.value_length") ? "" : " (default n_embd/H)");

    TRY(td_bind_f32(b, "attention.layer_norm_rms_epsilon", 1, 0.0f, &hp->rms_eps));
    if (!isfinite(hp->rms_eps) || hp->rms_eps < 0)
        return td_err_set(b->err, TD_EINPUT,
                          "%s: key '%s.attention.layer_norm_rms_epsilon': expected a finite value >= 0, found %g", P, A,
                          (double)hp->rms_eps);

    /* --- RoPE --- */
    TRY(td_bind_u32(b, "rope.dimension_count", 0, hp->head_dim, 0, &hp->rope_dims));
    const uint32_t R = hp->rope_dims, D = hp->head_dim;
    if (R > D)
        return td_err_set(b->err, TD_EINPUT,
                          "%s: key '%s.rope.dimension_count': expected R <= head dim D = %u, found R = %u", P, A, D, R);
    if (R % 2 != 0)
        return td_err_set(b->err, TD_EINPUT,
                          "%s: key '%s.rope.dimension_count': expected an even R (RoPE rotates pairs), found R = %u",
                          P, A, R);
    if (R != D && !(ad->traits & TD_ARCH_T_PARTIAL_ROPE))
        return td_err_set(b->err, TD_EINPUT,
                          "%s: key '%s.rope.dimension_count': expected R == head dim D = %u (%s rotates the whole "
                          "head), found R = %u",
                          P, A, D, A, R);
    TRY(td_bind_f32(b, "rope.freq_base", 0, 10000.0f, &hp->rope_base));
    if (!isfinite(hp->rope_base) || hp->rope_base <= 0)
        return td_err_set(b->err, TD_EINPUT, "%s: key '%s.rope.freq_base': expected a finite value > 0, found %g", P,
                          A, (double)hp->rope_base);

    char key[160], stype[32];
    key_of(b, "rope.scaling.type", key, sizeof key);
    const char *def_type = ad->default_scaling == TD_ROPE_SCALING_NONE ? "none" : "linear";
    TRY(td_gguf_get_str(g, key, 0, def_type, stype, sizeof stype, b->err));
    if (!strcmp(stype, "none")) hp->rope_scaling = TD_ROPE_SCALING_NONE;
    else if (!strcmp(stype, "linear")) hp->rope_scaling = TD_ROPE_SCALING_LINEAR;
    else if (!strcmp(stype, "yarn")) hp->rope_scaling = TD_ROPE_SCALING_YARN;
    else
        return td_err_set(b->err, TD_EINPUT, "%s: key '%s': expected \"none\", \"linear\" or \"yarn\", found \"%s\"",
                          P, key, stype);

    float factor;
    if (td_bind_has(b, "rope.scaling.factor")) TRY(td_bind_f32(b, "rope.scaling.factor", 0, 1.0f, &factor));
    else TRY(td_bind_f32(b, "rope.scale_linear", 0, 1.0f, &factor)); /* the old key, a fallback */
    if (!isfinite(factor) || factor < 0)
        return td_err_set(b->err, TD_EINPUT, "%s: key '%s.rope.scaling.factor': expected a finite value >= 0, found %g",
                          P, A, (double)factor);
    if (factor == 0) factor = 1; /* 0 means "not set" (primitives §2.3) */
    hp->rope_freq_scale = hp->rope_scaling == TD_ROPE_SCALING_NONE ? 1.0f : 1.0f / factor;
    TRY(td_bind_f32(b, "rope.scaling.attn_factor", 0, 1.0f, &hp->rope_attn_factor));
    if (!isfinite(hp->rope_attn_factor))
        return td_err_set(b->err, TD_EINPUT, "%s: key '%s.rope.scaling.attn_factor': expected a finite value, found %g",
                          P, A, (double)hp->rope_attn_factor);
    TRY(td_bind_u32(b, "rope.scaling.original_context_length", 0, hp->n_ctx_train, 0, &hp->rope_n_ctx_orig));

    /* --- FFN and experts: the architecture's own keys --- */
    return ad->read_hparams(b, hp);
}

/* ------------------------------------------------------------------------ */
/* Vocabulary                                                                 */

static int is_int_vtype(int t) {
    return t == TD_GGUF_UINT8 || t == TD_GGUF_INT8 || t == TD_GGUF_UINT16 || t == TD_GGUF_INT16 ||
           t == TD_GGUF_UINT32 || t == TD_GGUF_INT32 || t == TD_GGUF_UINT64 || t == TD_GGUF_INT64;
}
static int is_signed_vtype(int t) {
    return t == TD_GGUF_INT8 || t == TD_GGUF_INT16 || t == TD_GGUF_INT32 || t == TD_GGUF_INT64;
}

static const char *kv_type_str(const td_gguf_kv *kv, char *buf, size_t n) {
    if (kv->type == TD_GGUF_ARRAY)
        snprintf(buf, n, "ARRAY of %s", td_gguf_vtype_name((int)kv->arr_type));
    else snprintf(buf, n, "%s", td_gguf_vtype_name((int)kv->type));
    return buf;
}

/* A special-token id: -1 when absent or llama.cpp's "none" (-1 / 0xFFFFFFFF). */
static int read_token_id(const binder *b, const char *key, uint32_t n_vocab, int32_t *out) {
    const td_gguf_kv *kv = td_gguf_find(b->g, key);
    *out = -1;
    if (!kv) return TD_OK;
    char tb[48];
    if (!is_int_vtype((int)kv->type))
        return td_err_set(b->err, TD_EINPUT, "%s: key '%s': expected a UINT32 token id, found %s", b->g->path, key,
                          kv_type_str(kv, tb, sizeof tb));
    if (is_signed_vtype((int)kv->type)) {
        if (kv->v.i == -1) return TD_OK;
        if (kv->v.i < 0 || kv->v.i >= (int64_t)n_vocab)
            return td_err_set(b->err, TD_EINPUT,
                              "%s: key '%s': expected a token id in [0, n_vocab = %u) or -1 (none), found %lld",
                              b->g->path, key, n_vocab, (long long)kv->v.i);
        *out = (int32_t)kv->v.i;
        return TD_OK;
    }
    if (kv->v.u == UINT64_MAX || (kv->type == TD_GGUF_UINT32 && kv->v.u == UINT32_MAX)) return TD_OK;
    if (kv->v.u >= n_vocab)
        return td_err_set(b->err, TD_EINPUT,
                          "%s: key '%s': expected a token id in [0, n_vocab = %u) or -1 (none), found %llu",
                          b->g->path, key, n_vocab, (unsigned long long)kv->v.u);
    *out = (int32_t)kv->v.u;
    return TD_OK;
}

/* An optional per-token array: absent, or `want` elements x n_vocab. */
static int read_token_array(const binder *b, const char *key, int want1, int want2, uint32_t n_vocab,
                            const td_gguf_kv **out) {
    const td_gguf_kv *kv = td_gguf_find(b->g, key);
    *out = NULL;
    if (!kv) return TD_OK;
    char tb[48];
    if (kv->type != TD_GGUF_ARRAY || ((int)kv->arr_type != want1 && (int)kv->arr_type != want2))
        return td_err_set(b->err, TD_EINPUT, "%s: key '%s': expected ARRAY of %s, found %s", b->g->path, key,
                          td_gguf_vtype_name(want1), kv_type_str(kv, tb, sizeof tb));
    if (kv->arr_n != n_vocab)
        return td_err_set(b->err, TD_EINPUT, "%s: key '%s': expected %u entries (one per token), found %llu",
                          b->g->path, key, n_vocab, (unsigned long long)kv->arr_n);
    *out = kv;
    return TD_OK;
}

static int read_vocab(const binder *b, td_vocab *v, uint32_t *n_vocab) {
    const td_gguf *g = b->g;
    const char *P = g->path;
    char tb[48];

    const td_gguf_kv *mk = td_gguf_find(g, "tokenizer.ggml.model");
    if (mk && mk->type != TD_GGUF_STRING)
        return td_err_set(b->err, TD_EINPUT, "%s: key 'tokenizer.ggml.model': expected STRING, found %s", P,
                          kv_type_str(mk, tb, sizeof tb));
    if (mk) {
        /* kept as stored, truncated to the field: an unknown name is only informational */
        size_t n = mk->str.len < sizeof v->model - 1 ? (size_t)mk->str.len : sizeof v->model - 1;
        memcpy(v->model, mk->str.ptr, n);
        v->model[n] = '\0';
        for (size_t i = 0; i < n; i++)
            if (v->model[i] == '\0') v->model[i] = '?';
    }
    /* a file without tokenizer.ggml.model has no tokenizer: the "none" case */
    if (!mk || !strcmp(v->model, "none")) v->kind = TD_VOCAB_NONE;
    else if (!strcmp(v->model, "llama")) v->kind = TD_VOCAB_SPM;
    else if (!strcmp(v->model, "gpt2")) v->kind = TD_VOCAB_BPE;
    else v->kind = TD_VOCAB_OTHER;

    if (v->kind == TD_VOCAB_NONE) {
        /* token count from <arch>.vocab_size (gguf.md §3.4), else from a stray tokens array */
        const td_gguf_kv *tk = td_gguf_find(g, "tokenizer.ggml.tokens");
        if (td_bind_has(b, "vocab_size") || !tk) {
            TRY(td_bind_u32(b, "vocab_size", 1, 0, 0, n_vocab));
        } else {
            if (tk->type != TD_GGUF_ARRAY || tk->arr_type != TD_GGUF_STRING)
                return td_err_set(b->err, TD_EINPUT, "%s: key 'tokenizer.ggml.tokens': expected ARRAY of STRING, "
                                  "found %s", P, kv_type_str(tk, tb, sizeof tb));
            if (tk->arr_n > INT32_MAX)
                return td_err_set(b->err, TD_EINPUT, "%s: key 'tokenizer.ggml.tokens': expected at most %d tokens, "
                                  "found %llu", P, INT32_MAX, (unsigned long long)tk->arr_n);
            *n_vocab = (uint32_t)tk->arr_n;
        }
    } else {
        const td_gguf_kv *tk = td_gguf_find(g, "tokenizer.ggml.tokens");
        if (!tk)
            return td_err_set(b->err, TD_EINPUT,
                              "%s: required key 'tokenizer.ggml.tokens' is missing (expected ARRAY of STRING for "
                              "tokenizer '%s')",
                              P, v->model);
        if (tk->type != TD_GGUF_ARRAY || tk->arr_type != TD_GGUF_STRING)
            return td_err_set(b->err, TD_EINPUT, "%s: key 'tokenizer.ggml.tokens': expected ARRAY of STRING, found %s",
                              P, kv_type_str(tk, tb, sizeof tb));
        if (tk->arr_n > INT32_MAX)
            return td_err_set(b->err, TD_EINPUT, "%s: key 'tokenizer.ggml.tokens': expected at most %d tokens, "
                              "found %llu", P, INT32_MAX, (unsigned long long)tk->arr_n);
        v->tokens = tk;
        *n_vocab = (uint32_t)tk->arr_n;
    }
    if (*n_vocab == 0)
        return td_err_set(b->err, TD_EINPUT, "%s: vocabulary: expected at least one token, found 0", P);
    v->n_tokens = v->tokens ? *n_vocab : 0;

    if (v->kind != TD_VOCAB_NONE) {
        TRY(read_token_array(b, "tokenizer.ggml.scores", TD_GGUF_FLOAT32, TD_GGUF_FLOAT32, *n_vocab, &v->scores));
        TRY(read_token_array(b, "tokenizer.ggml.token_type", TD_GGUF_INT32, TD_GGUF_UINT32, *n_vocab,
                             &v->token_type));
        const td_gguf_kv *mg = td_gguf_find(g, "tokenizer.ggml.merges");
        if (mg && (mg->type != TD_GGUF_ARRAY || mg->arr_type != TD_GGUF_STRING))
            return td_err_set(b->err, TD_EINPUT, "%s: key 'tokenizer.ggml.merges': expected ARRAY of STRING, found %s",
                              P, kv_type_str(mg, tb, sizeof tb));
        if (!mg && v->kind == TD_VOCAB_BPE)
            return td_err_set(b->err, TD_EINPUT,
                              "%s: required key 'tokenizer.ggml.merges' is missing (expected ARRAY of STRING for "
                              "tokenizer 'gpt2')",
                              P);
        v->n_merges = mg ? mg->arr_n : 0;
    }
    TRY(read_token_id(b, "tokenizer.ggml.bos_token_id", *n_vocab, &v->bos_id));
    TRY(read_token_id(b, "tokenizer.ggml.eos_token_id", *n_vocab, &v->eos_id));
    TRY(read_token_id(b, "tokenizer.ggml.unknown_token_id", *n_vocab, &v->unk_id));
    return TD_OK;
}

/* ------------------------------------------------------------------------ */
/* Tensors                                                                    */

/* a*b, saturated: a shape that overflows can then never match a stored one */
uint64_t td_bind_mul_sat(uint64_t a, uint64_t b) { return (a && b > UINT64_MAX / a) ? UINT64_MAX : a * b; }

static void fmt_shape(char *buf, size_t n, const uint64_t *ne, uint32_t nd) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, n - o, "{");
    for (uint32_t i = 0; i < nd && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%llu", i ? ", " : "", (unsigned long long)ne[i]);
    if (o < n) snprintf(buf + o, n - o, "}");
}

enum { OPT = TD_BIND_OPT, REQ = TD_BIND_REQ };

/* Binds tensor `name` if present: shape must equal {ne0[, ne1[, ne2]]} (nd
 * listed dims, the rest 1) and the type must be decodable; 1-D weights (norms,
 * biases, frequency factors) must be a float type, as the forwards read them
 * as plain vectors. */
int td_bind_tensor(const binder *b, const char *name, int required, uint32_t nd, uint64_t ne0, uint64_t ne1,
                  uint64_t ne2, const td_tensor **out) {
    const td_gguf *g = b->g;
    const td_tensor *t = td_gguf_tensor(g, name);
    *out = NULL;
    if (!t) {
        if (!required) return TD_OK;
        return td_err_set(b->err, TD_EINPUT, "%s: required tensor %s is missing (%s model)", g->path, name, b->arch);
    }
    const uint64_t want[TD_MAX_DIMS] = {ne0, nd > 1 ? ne1 : 1, nd > 2 ? ne2 : 1, 1};
    int ok = 1;
    for (int i = 0; i < TD_MAX_DIMS; i++)
        if (t->ne[i] < 0 || (uint64_t)t->ne[i] != want[i]) ok = 0;
    if (!ok) {
        uint64_t found[TD_MAX_DIMS];
        uint32_t fnd = t->n_dims ? t->n_dims : 1;
        if (fnd > TD_MAX_DIMS) fnd = TD_MAX_DIMS;
        for (int i = 0; i < TD_MAX_DIMS; i++) found[i] = (uint64_t)t->ne[i];
        char ws[128], fs[128];
        fmt_shape(ws, sizeof ws, want, nd);
        fmt_shape(fs, sizeof fs, found, fnd);
        return td_err_set(b->err, TD_EINPUT, "%s: tensor %s: expected shape %s, found %s", g->path, name, ws, fs);
    }
    const td_type_info *ti = td_type_get(t->type);
    if (nd == 1 && t->type != TD_TYPE_F32 && t->type != TD_TYPE_F16 && t->type != TD_TYPE_BF16)
        return td_err_set(b->err, TD_EINPUT, "%s: tensor %s: expected type F32, F16 or BF16 for a 1-D weight, found %s",
                          g->path, name, td_type_name(t->type));
    if (!ti || !ti->can_decode)
        return td_err_set(b->err, TD_EINPUT, "%s: tensor %s: expected a type tapdiff can decode, found %s (no decoder)",
                          g->path, name, td_type_name(t->type));
    *out = t;
    return TD_OK;
}

/* A tensor the forward would need but td_layer has no slot for: refusing it
 * beats computing a different model without a word. */
int td_bind_refuse(const binder *b, const char *name, const char *why) {
    if (td_gguf_tensor(b->g, name))
        return td_err_set(b->err, TD_EINPUT, "%s: tensor %s: expected absent, found present (%s)", b->g->path, name,
                          why);
    return TD_OK;
}

/* ".scale" side-cars multiply a matmul's result (gguf.md §8); no slot for them. */
static int refuse_scales(const binder *b, const td_model *m) {
    const td_gguf *g = b->g;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const char *nm = g->tensors[i].cname;
        size_t len = strlen(nm);
        if (len < 7 || strcmp(nm + len - 6, ".scale") != 0) continue;
        char w[80];
        snprintf(w, sizeof w, "%.*s.weight", (int)(len - 6), nm);
        const td_tensor *t = td_gguf_tensor(g, w);
        if (!t) continue;
        int bound = t == m->tok_embd || t == m->output;
        for (uint32_t il = 0; il < m->hp.n_layer && !bound; il++) {
            const td_layer *l = &m->layers[il];
            const td_tensor *ws[] = {l->attn.wq,      l->attn.wk,     l->attn.wv,        l->attn.wqkv,
                                     l->attn.wo,      l->ffn.gate,    l->ffn.up,         l->ffn.down,
                                     l->ffn.gate_inp, l->ffn.gate_exps, l->ffn.up_exps, l->ffn.down_exps};
            for (size_t k = 0; k < sizeof ws / sizeof ws[0]; k++)
                if (ws[k] == t) bound = 1;
        }
        if (bound)
            return td_err_set(b->err, TD_EINPUT,
                              "%s: tensor %s: expected absent, found present (per-tensor output scales of %s are not "
                              "supported by tapdiff's forwards)",
                              g->path, nm, w);
    }
    return TD_OK;
}

/* ------------------------------------------------------------------------ */
/* Bind / open / close                                                        */

static int bind_all(td_model *m, td_err *err) {
    const td_gguf *g = m->gguf;
    char arch[32];
    binder b = {g, arch, err};
    TRY(td_gguf_get_str(g, "general.architecture", 1, NULL, arch, sizeof arch, err));
    const td_arch_desc *ad = td_arch_find(arch);
    if (!ad) {
        char names[256];
        td_arch_names(names, sizeof names, ", ");
        return td_err_set(err, TD_EINPUT, "%s: key 'general.architecture': unsupported architecture '%s' (supported: %s)",
                          g->path, arch, names);
    }

    td_hparams *hp = &m->hp;
    TRY(read_hparams(&b, ad, hp));
    TRY(read_vocab(&b, &m->vocab, &hp->n_vocab));

    const uint64_t E = hp->n_embd, V = hp->n_vocab;
    TRY(td_bind_tensor(&b, "token_embd.weight", REQ, 2, E, V, 0, &m->tok_embd));
    if (!(ad->traits & TD_ARCH_T_HC)) TRY(td_bind_tensor(&b, "output_norm.weight", REQ, 1, E, 0, 0, &m->output_norm));
    TRY(td_bind_tensor(&b, "output.weight", OPT, 2, E, V, 0, &m->output));
    if (!m->output) {
        m->output = m->tok_embd;
        m->output_tied = 1;
    }
    if (ad->bind_model) TRY(ad->bind_model(&b, m));

    m->layers = td_xcalloc(hp->n_layer, sizeof *m->layers);
    for (uint32_t il = 0; il < hp->n_layer; il++) {
        td_layer *l = &m->layers[il];
        l->kind = ad->layer_kind(hp, il);
        TRY(ad->bind_layer(&b, hp, il, l));
    }
    TRY(refuse_scales(&b, m));
    return TD_OK;
}

int td_model_bind(td_model **out, td_gguf *g, td_err *err) {
    TD_ASSERT(out && g);
    *out = NULL;
    td_model *m = td_xcalloc(1, sizeof *m);
    m->gguf = g;
    m->vocab.bos_id = m->vocab.eos_id = m->vocab.unk_id = -1;
    int st = bind_all(m, err);
    if (st != TD_OK) {
        td_model_close(m);
        return st;
    }
    *out = m;
    return TD_OK;
}

int td_model_open(td_model **out, const char *path, td_err *err) {
    TD_ASSERT(out && path);
    *out = NULL;
    td_gguf *g = NULL;
    TRY(td_gguf_open(&g, path, err));
    return td_model_bind(out, g, err);
}

void td_model_close(td_model *m) {
    if (!m) return;
    td_gguf_close(m->gguf);
    free(m->layers);
    free(m);
}

/* ------------------------------------------------------------------------ */
/* Token text                                                                 */

const char *td_vocab_piece(const td_model *m, int32_t id, uint64_t *len) {
    TD_ASSERT(m);
    const td_vocab *v = &m->vocab;
    if (!v->tokens || id < 0 || (uint64_t)id >= v->tokens->arr_n) return NULL;
    const td_str *s = &v->tokens->arr_str[id];
    if (len) *len = s->len;
    return s->ptr;
}

/* GPT-2 bytes_to_unicode, inverted: code point -> byte, -1 if not in the table.
 * Printable bytes 33-126, 161-172, 174-255 stand for themselves; the other 68
 * bytes, in increasing order, were moved to U+0100 + n. */
static int gpt2_byte_of(uint32_t cp) {
    if ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174 && cp <= 255)) return (int)cp;
    if (cp < 256 || cp >= 256 + 68) return -1;
    uint32_t n = cp - 256;
    for (int byte = 0; byte < 256; byte++) {
        int printable = (byte >= 33 && byte <= 126) || (byte >= 161 && byte <= 172) || byte >= 174;
        if (printable) continue;
        if (n == 0) return byte;
        n--;
    }
    return -1; /* unreachable: there are exactly 68 non-printable bytes */
}

/* Decodes one UTF-8 sequence at s[0..n); returns its length (1 for a stray byte, cp = that byte). */
static size_t utf8_next(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned c = s[0];
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || len > n) {
        *cp = c;
        return 1;
    }
    uint32_t v = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) {
            *cp = c;
            return 1;
        }
        v = (v << 6) | (s[i] & 0x3F);
    }
    *cp = v;
    return len;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

size_t td_vocab_text(const td_model *m, int32_t id, char *buf, size_t bufsz) {
    TD_ASSERT(m && (buf || bufsz == 0));
    if (bufsz == 0) return 0;
    size_t o = 0;
    /* evaluates ch once (callers must not rely on side effects in it); drops
     * what does not fit, keeping room for the NUL */
#define PUT(ch)                                                                                                      \
    do {                                                                                                             \
        int ch_ = (ch);                                                                                              \
        if (o + 1 < bufsz) buf[o++] = (char)ch_;                                                                     \
    } while (0)
    uint64_t n = 0;
    const char *p = td_vocab_piece(m, id, &n);
    const unsigned char *s = (const unsigned char *)p;
    if (!p) n = 0;
    if (m->vocab.kind == TD_VOCAB_SPM) {
        /* <0xNN>: a byte-fallback token stands for that raw byte */
        if (n == 6 && s[0] == '<' && s[1] == '0' && s[2] == 'x' && s[5] == '>' && hexval(p[3]) >= 0 &&
            hexval(p[4]) >= 0) {
            PUT(hexval(p[3]) * 16 + hexval(p[4]));
        } else {
            for (uint64_t i = 0; i < n;) {
                if (i + 3 <= n && s[i] == 0xE2 && s[i + 1] == 0x96 && s[i + 2] == 0x81) { /* U+2581 */
                    PUT(' ');
                    i += 3;
                } else {
                    PUT(s[i]);
                    i++;
                }
            }
        }
    } else if (m->vocab.kind == TD_VOCAB_BPE) {
        for (uint64_t i = 0; i < n;) {
            uint32_t cp;
            size_t len = utf8_next(s + i, (size_t)(n - i), &cp);
            int byte = gpt2_byte_of(cp);
            if (byte >= 0) PUT(byte);
            else
                for (size_t k = 0; k < len; k++) PUT(s[i + k]); /* not byte-level (an added token): as stored */
            i += len;
        }
    } else {
        for (uint64_t i = 0; i < n; i++) PUT(s[i]);
    }
#undef PUT
    buf[o] = '\0';
    return o;
}
