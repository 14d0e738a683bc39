/* tapdiff bench: the benchmark model generator (bench_model.h). Weights are
 * drawn like the fixtures' (variance-preserving linear weights, norms near
 * 1) from a fast deterministic generator, tensor by tensor, so only one f32
 * tensor is ever held besides the quantized file image. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_model.h"
#include "gguf_writer.h"
#include "quantize.h"

int td_bench_model_preset(const char *name, td_bench_model_cfg *cfg) {
    if (!strcmp(name, "200m")) {
        *cfg = (td_bench_model_cfg){1024, 12, 16, 4, 2816, 32000, 0x7d2f5a1c};
        return 1;
    }
    if (!strcmp(name, "tiny")) {
        *cfg = (td_bench_model_cfg){256, 2, 4, 2, 512, 1024, 0x7d2f5a1c};
        return 1;
    }
    return 0;
}

uint64_t td_bench_model_params(const td_bench_model_cfg *c) {
    const uint64_t E = c->n_embd, D = c->n_embd / c->n_head, HD = c->n_head * D, KD = c->n_head_kv * D;
    const uint64_t per_layer = 2 * E + E * HD + 2 * E * KD + HD * E + 3 * E * c->n_ff;
    return 2 * E * c->n_vocab + E + c->n_layer * per_layer;
}

/* splitmix64: fast, and the same numbers on every machine */
static uint64_t next_u64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* n values ~ mean + sd * (an approximately normal variate: the sum of four
 * uniforms, centred and scaled to unit variance) */
static float *draw(uint64_t seed, const char *name, size_t n, double mean, double sd) {
    uint64_t s = seed;
    for (const char *p = name; *p; p++) s = (s ^ (uint8_t)*p) * 0x100000001b3ull;
    float *v = td_xmalloc(n * sizeof *v);
    const double k = sqrt(3.0) * sd; // var(sum of 4 U(-1/2, 1/2)) = 1/3
    for (size_t i = 0; i < n; i++) {
        const uint64_t r = next_u64(&s);
        double u = 0;
        for (int j = 0; j < 4; j++) u += (double)((r >> (16 * j)) & 0xFFFF) / 65536.0 - 0.5;
        v[i] = (float)(mean + k * u);
    }
    return v;
}

static void add_weight(td_gw *w, const td_bench_model_cfg *c, int type, const char *name, uint32_t n_dims,
                       int64_t ne0, int64_t ne1, double mean, double sd) {
    const int64_t ne[2] = {ne0, ne1};
    float *v = draw(c->seed, name, (size_t)ne0 * (size_t)(n_dims > 1 ? ne1 : 1), mean, sd);
    td_gw_tensor_f32(w, name, n_dims > 1 ? type : TD_TYPE_F32, n_dims, ne, v);
    free(v);
}

/* A SentencePiece vocabulary llama.cpp loads: <unk> <s> </s>, the 256 byte
 * tokens, then distinct filler pieces. */
static void write_vocab(td_gw *w, uint32_t V) {
    char **tok = td_xcalloc(V, sizeof *tok);
    float *scores = td_xcalloc(V, sizeof *scores);
    int32_t *types = td_xcalloc(V, sizeof *types);
    for (uint32_t i = 0; i < V; i++) {
        char buf[32];
        if (i == 0) snprintf(buf, sizeof buf, "<unk>");
        else if (i == 1) snprintf(buf, sizeof buf, "<s>");
        else if (i == 2) snprintf(buf, sizeof buf, "</s>");
        else if (i < 259) snprintf(buf, sizeof buf, "<0x%02X>", i - 3);
        else { // "▁" followed by the piece's index in base 26 letters
            size_t n = (size_t)snprintf(buf, sizeof buf, "\xE2\x96\x81");
            for (uint32_t x = i - 259; n < sizeof buf - 1; x /= 26) {
                buf[n++] = (char)('a' + x % 26);
                if (x < 26) break;
            }
            buf[n] = '\0';
        }
        tok[i] = td_xstrdup(buf);
        scores[i] = i >= 259 ? -(float)(i - 259) : 0.0f;
        types[i] = i == 0 ? 2 : i < 3 ? 3 : i < 259 ? 6 : 1;
    }
    td_gw_str(w, "tokenizer.ggml.model", "llama");
    td_gw_arr_str(w, "tokenizer.ggml.tokens", V, (const char *const *)tok);
    td_gw_arr(w, "tokenizer.ggml.scores", TD_GGUF_FLOAT32, V, scores);
    td_gw_arr(w, "tokenizer.ggml.token_type", TD_GGUF_INT32, V, types);
    td_gw_u32(w, "tokenizer.ggml.bos_token_id", 1);
    td_gw_u32(w, "tokenizer.ggml.eos_token_id", 2);
    td_gw_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    for (uint32_t i = 0; i < V; i++) free(tok[i]);
    free(tok), free(scores), free(types);
}

static uint32_t file_type_of(int type) {
    switch (type) {
    case TD_TYPE_F32: return 0;
    case TD_TYPE_F16: return 1;
    case TD_TYPE_Q4_0: return 2;
    case TD_TYPE_Q8_0: return 7;
    case TD_TYPE_Q4_K: return 14; /* MOSTLY_Q4_K_S: every weight Q4_K */
    case TD_TYPE_Q5_K: return 16;
    case TD_TYPE_Q6_K: return 18;
    case TD_TYPE_BF16: return 32;
    case TD_TYPE_IQ2_XXS: return 19;
    case TD_TYPE_IQ2_XS: return 20;
    case TD_TYPE_IQ3_XXS: return 23;
    case TD_TYPE_IQ1_S: return 24;
    case TD_TYPE_IQ3_S: return 26;
    case TD_TYPE_IQ2_S: return 28;
    case TD_TYPE_IQ1_M: return 31;
    case TD_TYPE_NVFP4: return 39;
    default: return 0;
    }
}

int td_bench_model_write(const char *path, const td_bench_model_cfg *c, int type, td_err *err) {
    const td_type_info *ti = td_type_get(type);
    if (!ti || !td_quantize_supported(type))
        return td_err_set(err, TD_EINPUT, "bench model %s: type %s has no quantizer", path, td_type_name(type));
    if (c->n_head == 0 || c->n_head_kv == 0 || c->n_embd % c->n_head || c->n_head % c->n_head_kv)
        return td_err_set(err, TD_EINPUT, "bench model %s: heads H=%u Hkv=%u do not divide E=%u", path, c->n_head,
                          c->n_head_kv, c->n_embd);
    if (c->n_embd % ti->block_size || c->n_ff % ti->block_size)
        return td_err_set(err, TD_EINPUT, "bench model %s: %s needs E=%u and F=%u to be multiples of %lld", path,
                          ti->name, c->n_embd, c->n_ff, (long long)ti->block_size);
    const uint32_t E = c->n_embd, D = E / c->n_head, HD = c->n_head * D, KD = c->n_head_kv * D, F = c->n_ff;

    td_gw *w = td_gw_new(3, 32, 0);
    char name[64];
    snprintf(name, sizeof name, "tapdiff-bench-%s", ti->name);
    td_gw_str(w, "general.architecture", "llama");
    td_gw_str(w, "general.name", name);
    td_gw_u32(w, "general.file_type", file_type_of(type));
    td_gw_u32(w, "general.quantization_version", 2);
    td_gw_u32(w, "llama.context_length", 2048);
    td_gw_u32(w, "llama.embedding_length", E);
    td_gw_u32(w, "llama.block_count", c->n_layer);
    td_gw_u32(w, "llama.feed_forward_length", F);
    td_gw_u32(w, "llama.attention.head_count", c->n_head);
    td_gw_u32(w, "llama.attention.head_count_kv", c->n_head_kv);
    td_gw_u32(w, "llama.rope.dimension_count", D);
    td_gw_f32(w, "llama.rope.freq_base", 10000.0f);
    td_gw_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    write_vocab(w, c->n_vocab);

    const double sd_io = 2.0 / sqrt((double)E);
    add_weight(w, c, type, "token_embd.weight", 2, E, c->n_vocab, 0, sd_io);
    for (uint32_t l = 0; l < c->n_layer; l++) {
#define NM(s) (snprintf(name, sizeof name, "blk.%u." s, l), name)
        add_weight(w, c, type, NM("attn_norm.weight"), 1, E, 0, 1.0, 0.05);
        add_weight(w, c, type, NM("attn_q.weight"), 2, E, HD, 0, 1 / sqrt((double)E));
        add_weight(w, c, type, NM("attn_k.weight"), 2, E, KD, 0, 1 / sqrt((double)E));
        add_weight(w, c, type, NM("attn_v.weight"), 2, E, KD, 0, 1 / sqrt((double)E));
        add_weight(w, c, type, NM("attn_output.weight"), 2, HD, E, 0, 1 / sqrt((double)HD));
        add_weight(w, c, type, NM("ffn_norm.weight"), 1, E, 0, 1.0, 0.05);
        add_weight(w, c, type, NM("ffn_gate.weight"), 2, E, F, 0, 1 / sqrt((double)E));
        add_weight(w, c, type, NM("ffn_up.weight"), 2, E, F, 0, 1 / sqrt((double)E));
        add_weight(w, c, type, NM("ffn_down.weight"), 2, F, E, 0, 1 / sqrt((double)F));
#undef NM
    }
    add_weight(w, c, type, "output_norm.weight", 1, E, 0, 1.0, 0.05);
    add_weight(w, c, type, "output.weight", 2, E, c->n_vocab, 0, sd_io);
    int rc = td_gw_write(w, path, err);
    td_gw_free(w);
    return rc;
}
