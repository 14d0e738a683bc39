/* tapdiff: tests of the architecture binding (model/model.c) and of
 * `tapdiff inspect` (harness/cli/inspect.c).
 *
 * - stories260K.gguf (a real model): the expected numbers come from
 *   ../shared/models/README.md and the token pieces from reading the file's
 *   bytes with an independent script, never from the code under test.
 * - Small models assembled here byte by byte (a local GGUF byte builder:
 *   fixtures/gguf_writer.c was still a placeholder when this was written), one
 *   valid model per architecture and a corpus of invalid variants, each one
 *   breaking exactly one rule of arch-*.md; every variant must fail with
 *   TD_EINPUT from td_model_open with a message naming the file and the rule,
 *   and `tapdiff inspect` must exit 3 (never a signal) with that message. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "arch.h"
#include "model.h"

/* ------------------------------------------------------------------------ */
/* A minimal GGUF byte builder (gguf.md §1-4)                                 */

typedef struct buf {
    uint8_t *p;
    size_t n, cap;
} buf;

static void b_put(buf *b, const void *d, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        cr_assert(b->p);
    }
    if (n) memcpy(b->p + b->n, d, n);
    b->n += n;
}
static void b_le(buf *b, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) {
        uint8_t c = (uint8_t)(v >> (8 * i));
        b_put(b, &c, 1);
    }
}
static void b_str(buf *b, const char *s) {
    b_le(b, strlen(s), 8);
    b_put(b, s, strlen(s));
}

typedef struct kvent {
    char key[96];
    uint32_t type;
    buf val; /* the value's bytes after the type tag */
} kvent;

typedef struct tent {
    char name[64];
    int type;
    uint32_t nd;
    int64_t ne[4];
} tent;

typedef struct mb {
    kvent kv[64];
    int nkv;
    tent t[128];
    int nt;
} mb;

static void mb_free(mb *m) {
    for (int i = 0; i < m->nkv; i++) free(m->kv[i].val.p);
    free(m);
}

static void mb_del(mb *m, const char *key) {
    for (int i = 0; i < m->nkv; i++)
        if (!strcmp(m->kv[i].key, key)) {
            free(m->kv[i].val.p);
            memmove(&m->kv[i], &m->kv[i + 1], (size_t)(m->nkv - i - 1) * sizeof m->kv[0]);
            m->nkv--;
            return;
        }
}

/* a fresh value slot for key (replacing an existing one) */
static buf *mb_set(mb *m, const char *key, uint32_t type) {
    mb_del(m, key);
    cr_assert(m->nkv < 64);
    kvent *e = &m->kv[m->nkv++];
    memset(e, 0, sizeof *e);
    snprintf(e->key, sizeof e->key, "%s", key);
    e->type = type;
    return &e->val;
}

enum { G_U8 = 0, G_I8, G_U16, G_I16, G_U32, G_I32, G_F32, G_BOOL, G_STR, G_ARR, G_U64, G_I64, G_F64 };

static void mb_u32(mb *m, const char *k, uint32_t v) { b_le(mb_set(m, k, G_U32), v, 4); }
static void mb_i32(mb *m, const char *k, int32_t v) { b_le(mb_set(m, k, G_I32), (uint32_t)v, 4); }
static void mb_f32(mb *m, const char *k, float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    b_le(mb_set(m, k, G_F32), u, 4);
}
static void mb_str(mb *m, const char *k, const char *v) { b_str(mb_set(m, k, G_STR), v); }
static void mb_arr_str(mb *m, const char *k, int n, const char *const *v) {
    buf *b = mb_set(m, k, G_ARR);
    b_le(b, G_STR, 4);
    b_le(b, (uint64_t)n, 8);
    for (int i = 0; i < n; i++) b_str(b, v[i]);
}
/* array of 4-byte elements (U32, I32, F32) */
static void mb_arr4(mb *m, const char *k, uint32_t et, int n, const void *v) {
    buf *b = mb_set(m, k, G_ARR);
    b_le(b, et, 4);
    b_le(b, (uint64_t)n, 8);
    b_put(b, v, 4 * (size_t)n);
}

/* array of 8-byte integers (U64, I64) */
static void mb_arr8(mb *m, const char *k, uint32_t et, int n, const uint64_t *v) {
    buf *b = mb_set(m, k, G_ARR);
    b_le(b, et, 4);
    b_le(b, (uint64_t)n, 8);
    for (int i = 0; i < n; i++) b_le(b, v[i], 8);
}

static tent *mb_tget(mb *m, const char *name) {
    for (int i = 0; i < m->nt; i++)
        if (!strcmp(m->t[i].name, name)) return &m->t[i];
    return NULL;
}
static void mb_tdel(mb *m, const char *name) {
    tent *t = mb_tget(m, name);
    cr_assert(t, "fixture bug: no tensor %s", name);
    memmove(t, t + 1, (size_t)(m->t + m->nt - t - 1) * sizeof *t);
    m->nt--;
}
static void mb_tensor(mb *m, const char *name, int type, uint32_t nd, int64_t ne0, int64_t ne1, int64_t ne2) {
    tent *t = mb_tget(m, name);
    if (!t) {
        cr_assert(m->nt < 128);
        t = &m->t[m->nt++];
    }
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->type = type;
    t->nd = nd;
    t->ne[0] = ne0;
    t->ne[1] = nd > 1 ? ne1 : 1;
    t->ne[2] = nd > 2 ? ne2 : 1;
    t->ne[3] = 1;
}

static size_t pad32(size_t x) { return (x + 31) / 32 * 32; }

/* Header, keys, tensor infos, padding, zero-filled data (binding never reads
 * values); each tensor padded to 32 bytes, offsets consecutive. */
static void mb_write(const mb *m, const char *path) {
    buf b = {0};
    b_put(&b, "GGUF", 4);
    b_le(&b, 3, 4);
    b_le(&b, (uint64_t)m->nt, 8);
    b_le(&b, (uint64_t)m->nkv, 8);
    for (int i = 0; i < m->nkv; i++) {
        b_str(&b, m->kv[i].key);
        b_le(&b, m->kv[i].type, 4);
        b_put(&b, m->kv[i].val.p, m->kv[i].val.n);
    }
    size_t off = 0, total = 0;
    for (int i = 0; i < m->nt; i++) {
        const tent *t = &m->t[i];
        b_str(&b, t->name);
        b_le(&b, t->nd, 4);
        for (uint32_t d = 0; d < t->nd; d++) b_le(&b, (uint64_t)t->ne[d], 8);
        b_le(&b, (uint32_t)t->type, 4);
        b_le(&b, off, 8);
        size_t rb = td_type_row_bytes(t->type, t->ne[0]);
        cr_assert(rb > 0, "fixture bug: tensor %s type %d ne0 %lld", t->name, t->type, (long long)t->ne[0]);
        off += pad32(rb * (size_t)(t->ne[1] * t->ne[2] * t->ne[3]));
    }
    total = off;
    size_t start = pad32(b.n);
    size_t n = start + total;
    uint8_t *zeros = calloc(1, n - b.n + 1);
    b_put(&b, zeros, n - b.n);
    free(zeros);
    FILE *f = fopen(path, "wb");
    cr_assert(f, "cannot write %s", path);
    cr_assert_eq(fwrite(b.p, 1, b.n, f), b.n);
    fclose(f);
    free(b.p);
}

/* ------------------------------------------------------------------------ */
/* Small models of each architecture                                          */

typedef struct cfg {
    const char *arch;
    uint32_t E, H, Hkv, F, L;
    uint32_t D;        /* head dim; written as key_length when key_length is set */
    int key_length;    /* write <arch>.attention.key_length/value_length */
    uint32_t X, K;     /* experts; X > 0 makes an MoE */
    int moe_gate;      /* MoE: write ffn_gate_exps */
    int fused, tied;
    int gpt2;          /* gpt2 vocab instead of the SentencePiece one */
    int expert_ff_key; /* qwen3moe: write expert_feed_forward_length = F (else n_ff = F*K) */
} cfg;

/* llama: E 32, H 4, Hkv 2, D 8, F 48, 2 blocks, 8 tokens */
static const cfg LLAMA = {"llama", 32, 4, 2, 48, 2, 8, 0, 0, 0, 0, 0, 0, 0, 0};

static const char *const SPM_TOKENS[] = {"<unk>", "<s>", "</s>", "<0x41>", "\xE2\x96\x81" "a", "\xE2\x96\x81" "b",
                                         "c", "<0x0A>"};
#define N_SPM 8
/* gpt2 byte-level pieces; the byte each stands for is worked out in test gpt2_text */
static const char *const GPT2_TOKENS[] = {"!", "\xC4\xA0hello", "\xC4\x8A", "\xC4\x80", "\xC4\xA1",
                                          "\xC5\x82", "\xC5\x83", "\xC2\xA1", "<|endoftext|>", "\xE4\xB8\xAD"};
#define N_GPT2 10

static uint32_t n_vocab_of(const cfg *c) { return c->gpt2 ? N_GPT2 : N_SPM; }

static void key(char *buf, size_t n, const cfg *c, const char *suffix) { snprintf(buf, n, "%s.%s", c->arch, suffix); }

static mb *build(const cfg *c) {
    mb *m = calloc(1, sizeof *m);
    cr_assert(m);
    char k[128], t[96];
    const uint32_t V = n_vocab_of(c);
    mb_str(m, "general.architecture", c->arch);
    mb_str(m, "general.name", "test model");
#define AK(s) (key(k, sizeof k, c, s), k)
    mb_u32(m, AK("context_length"), 256);
    mb_u32(m, AK("embedding_length"), c->E);
    mb_u32(m, AK("block_count"), c->L);
    mb_u32(m, AK("attention.head_count"), c->H);
    mb_u32(m, AK("attention.head_count_kv"), c->Hkv);
    mb_f32(m, AK("attention.layer_norm_rms_epsilon"), 1e-5f);
    mb_f32(m, AK("rope.freq_base"), 10000.0f);
    if (c->key_length) {
        mb_u32(m, AK("attention.key_length"), c->D);
        mb_u32(m, AK("attention.value_length"), c->D);
    }
    int qmoe = !strcmp(c->arch, "qwen3moe");
    if (c->X) {
        mb_u32(m, AK("expert_count"), c->X);
        mb_u32(m, AK("expert_used_count"), c->K);
    }
    if (qmoe) {
        if (c->expert_ff_key) mb_u32(m, AK("expert_feed_forward_length"), c->F);
        else mb_u32(m, AK("feed_forward_length"), c->F * c->K); /* F = n_ff / K by the spec's fallback */
    } else mb_u32(m, AK("feed_forward_length"), c->F);

    if (c->gpt2) {
        mb_str(m, "tokenizer.ggml.model", "gpt2");
        mb_arr_str(m, "tokenizer.ggml.tokens", N_GPT2, GPT2_TOKENS);
        const char *merges[] = {"\xC4\xA0 h", "e l", "l o"};
        mb_arr_str(m, "tokenizer.ggml.merges", 3, merges);
        mb_u32(m, "tokenizer.ggml.eos_token_id", 8);
    } else {
        mb_str(m, "tokenizer.ggml.model", "llama");
        mb_arr_str(m, "tokenizer.ggml.tokens", N_SPM, SPM_TOKENS);
        float sc[N_SPM];
        int32_t tt[N_SPM];
        for (int i = 0; i < N_SPM; i++) {
            sc[i] = -(float)i;
            tt[i] = i < 3 ? 3 : 1;
        }
        tt[0] = 2;
        tt[3] = tt[7] = 6;
        mb_arr4(m, "tokenizer.ggml.scores", G_F32, N_SPM, sc);
        mb_arr4(m, "tokenizer.ggml.token_type", G_I32, N_SPM, tt);
        mb_u32(m, "tokenizer.ggml.unknown_token_id", 0);
        mb_u32(m, "tokenizer.ggml.bos_token_id", 1);
        mb_u32(m, "tokenizer.ggml.eos_token_id", 2);
        mb_u32(m, "tokenizer.ggml.padding_token_id", 0xFFFFFFFFu); /* llama.cpp's "none" */
    }
#undef AK

    const int64_t E = c->E, D = c->D, HD = (int64_t)c->H * D, KD = (int64_t)c->Hkv * D, F = c->F, X = c->X;
    mb_tensor(m, "token_embd.weight", 0, 2, E, V, 0);
    mb_tensor(m, "output_norm.weight", 0, 1, E, 0, 0);
    if (!c->tied) mb_tensor(m, "output.weight", 0, 2, E, V, 0);
    int qwen = strncmp(c->arch, "qwen3", 5) == 0;
    for (uint32_t l = 0; l < c->L; l++) {
#define TN(s) (snprintf(t, sizeof t, "blk.%u." s, l), t)
        mb_tensor(m, TN("attn_norm.weight"), 0, 1, E, 0, 0);
        if (c->fused) mb_tensor(m, TN("attn_qkv.weight"), 0, 2, E, HD + 2 * KD, 0);
        else {
            mb_tensor(m, TN("attn_q.weight"), 0, 2, E, HD, 0);
            mb_tensor(m, TN("attn_k.weight"), 0, 2, E, KD, 0);
            mb_tensor(m, TN("attn_v.weight"), 0, 2, E, KD, 0);
        }
        mb_tensor(m, TN("attn_output.weight"), 0, 2, HD, E, 0);
        if (qwen) {
            mb_tensor(m, TN("attn_q_norm.weight"), 0, 1, D, 0, 0);
            mb_tensor(m, TN("attn_k_norm.weight"), 0, 1, D, 0, 0);
        }
        mb_tensor(m, TN("ffn_norm.weight"), 0, 1, E, 0, 0);
        if (X && strcmp(c->arch, "qwen3") != 0) {
            mb_tensor(m, TN("ffn_gate_inp.weight"), 0, 2, E, X, 0);
            if (c->moe_gate) mb_tensor(m, TN("ffn_gate_exps.weight"), 0, 3, E, F, X);
            mb_tensor(m, TN("ffn_up_exps.weight"), 0, 3, E, F, X);
            mb_tensor(m, TN("ffn_down_exps.weight"), 0, 3, F, E, X);
        } else {
            mb_tensor(m, TN("ffn_gate.weight"), 0, 2, E, F, 0);
            mb_tensor(m, TN("ffn_up.weight"), 0, 2, E, F, 0);
            mb_tensor(m, TN("ffn_down.weight"), 0, 2, F, E, 0);
        }
#undef TN
    }
    return m;
}

/* qwen3: head dim 16 from key_length, not E/H = 8 (as real Qwen3 does) */
static const cfg QWEN3 = {"qwen3", 32, 4, 2, 48, 2, 16, 1, 0, 0, 0, 0, 0, 0, 0};
/* qwen3moe: 4 experts, 2 used, expert width 24 only via the n_ff/K fallback */
static const cfg QWEN3MOE = {"qwen3moe", 32, 4, 2, 24, 2, 8, 0, 4, 2, 1, 0, 0, 0, 0};
/* Mixtral-style llama MoE without gate experts */
static const cfg LLAMA_MOE = {"llama", 32, 4, 2, 48, 2, 8, 0, 4, 2, 0, 0, 0, 0, 0};
/* qwen3next's attention keys and MoE; build_qwen3next turns block 0 into a GDN block */
static const cfg QWEN3NEXT = {"qwen3next", 32, 4, 2, 24, 2, 8, 0, 4, 2, 1, 0, 0, 0, 0};

/* qwen3next (arch-qwen3next.md §1, §3), written by hand from the spec: 2
 * blocks, full_attention_interval 2 (block 0 GDN, block 1 gated attention),
 * R = 4 < D = 8, GDN H_k = 1, H_v = 2, d_k = 8 (C = 32), K = 4 conv taps,
 * F = 24, F_sh = 16; every block has a shared expert. */
static mb *build_qwen3next(void) {
    mb *m = build(&QWEN3NEXT);
    mb_u32(m, "qwen3next.expert_feed_forward_length", 24);
    mb_u32(m, "qwen3next.expert_shared_feed_forward_length", 16);
    mb_u32(m, "qwen3next.rope.dimension_count", 4);
    mb_u32(m, "qwen3next.ssm.conv_kernel", 4);
    mb_u32(m, "qwen3next.ssm.state_size", 8);
    mb_u32(m, "qwen3next.ssm.group_count", 1);
    mb_u32(m, "qwen3next.ssm.time_step_rank", 2);
    mb_u32(m, "qwen3next.ssm.inner_size", 16);
    mb_u32(m, "qwen3next.full_attention_interval", 2);
    static const char *const attn[] = {"attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
                                       "attn_q_norm.weight", "attn_k_norm.weight"};
    char t[64];
    for (size_t i = 0; i < sizeof attn / sizeof attn[0]; i++) {
        snprintf(t, sizeof t, "blk.0.%s", attn[i]);
        mb_tdel(m, t);
    }
    mb_tensor(m, "blk.0.attn_qkv.weight", 0, 2, 32, 32, 0);
    mb_tensor(m, "blk.0.attn_gate.weight", 0, 2, 32, 16, 0);
    mb_tensor(m, "blk.0.ssm_ba.weight", 0, 2, 32, 4, 0);
    mb_tensor(m, "blk.0.ssm_conv1d.weight", 0, 2, 4, 32, 0);
    mb_tensor(m, "blk.0.ssm_dt.bias", 0, 1, 2, 0, 0);
    mb_tensor(m, "blk.0.ssm_a", 0, 1, 2, 0, 0);
    mb_tensor(m, "blk.0.ssm_norm.weight", 0, 1, 8, 0, 0);
    mb_tensor(m, "blk.0.ssm_out.weight", 0, 2, 16, 32, 0);
    mb_tensor(m, "blk.1.attn_q.weight", 0, 2, 32, 64, 0); /* [q; gate] per head */
    for (int l = 0; l < 2; l++) {
        snprintf(t, sizeof t, "blk.%d.ffn_norm.weight", l);
        mb_tdel(m, t);
        snprintf(t, sizeof t, "blk.%d.post_attention_norm.weight", l);
        mb_tensor(m, t, 0, 1, 32, 0, 0);
        snprintf(t, sizeof t, "blk.%d.ffn_gate_inp_shexp.weight", l);
        mb_tensor(m, t, 0, 1, 32, 0, 0);
        snprintf(t, sizeof t, "blk.%d.ffn_gate_shexp.weight", l);
        mb_tensor(m, t, 0, 2, 32, 16, 0);
        snprintf(t, sizeof t, "blk.%d.ffn_up_shexp.weight", l);
        mb_tensor(m, t, 0, 2, 32, 16, 0);
        snprintf(t, sizeof t, "blk.%d.ffn_down_shexp.weight", l);
        mb_tensor(m, t, 0, 2, 16, 32, 0);
    }
    return m;
}

/* qwen4exp (arch-qwen4exp.md §1, §3), written by hand from the spec: E 32, 2
 * blocks, full_attention_interval 2 (block 0 GDN with the PLE, block 1 QSA
 * attention with compress ratio 4), H 4, Hkv 2, D 8, R 4, IMROPE sections
 * [1, 1, 0, 0]; hc 2 streams (hcd 64), hc_lr 4; indexer H_i 2, d_i 8, top_k
 * 4; GDN H_k 1, H_v 2, d_k 8 (C 32), K 4; PLE n_g 3, h_g 2 (n_p 4), d_p 8
 * (n_p d_p = E), K_p 2, head ranges [0,5) [5,10) [10,15) [15,20) so the
 * table needs 20 rows, eos 2; X 4, K 2, F 24, F_sh 16; SPM vocab of 8. */
static const cfg QWEN4EXP = {"qwen4exp", 32, 4, 2, 24, 2, 8, 0, 4, 2, 1, 0, 0, 0, 0};

static mb *build_qwen4exp(void) {
    mb *m = build(&QWEN4EXP);
    mb_del(m, "qwen4exp.feed_forward_length");
    mb_u32(m, "qwen4exp.expert_feed_forward_length", 24);
    mb_u32(m, "qwen4exp.expert_shared_feed_forward_length", 16);
    mb_u32(m, "qwen4exp.rope.dimension_count", 4);
    const uint32_t sect[4] = {1, 1, 0, 0};
    mb_arr4(m, "qwen4exp.rope.dimension_sections", G_U32, 4, sect);
    mb_u32(m, "qwen4exp.ssm.conv_kernel", 4);
    mb_u32(m, "qwen4exp.ssm.state_size", 8);
    mb_u32(m, "qwen4exp.ssm.group_count", 1);
    mb_u32(m, "qwen4exp.ssm.time_step_rank", 2);
    mb_u32(m, "qwen4exp.ssm.inner_size", 16);
    mb_u32(m, "qwen4exp.full_attention_interval", 2);
    mb_u32(m, "qwen4exp.hyper_connection.count", 2);
    mb_u32(m, "qwen4exp.hyper_connection.low_rank", 4);
    mb_u32(m, "qwen4exp.attention.indexer.head_count", 2);
    mb_u32(m, "qwen4exp.attention.indexer.key_length", 8);
    mb_u32(m, "qwen4exp.attention.indexer.top_k", 4);
    const uint32_t ratios[2] = {0, 4};
    mb_arr4(m, "qwen4exp.attention.compress_ratios", G_U32, 2, ratios);
    const uint32_t ple_layers[1] = {0};
    mb_arr4(m, "qwen4exp.ple.layers", G_U32, 1, ple_layers);
    mb_u32(m, "qwen4exp.ple.ngram_size", 3);
    mb_u32(m, "qwen4exp.ple.heads_per_ngram", 2);
    mb_u32(m, "qwen4exp.ple.conv_kernel", 2);
    mb_u32(m, "qwen4exp.ple.eos_token_id", 2);
    mb_u32(m, "qwen4exp.embedding_length_per_layer_input", 8);
    const uint64_t mult[3] = {0x9E3779B97F4A7C15ull, 10000000000019ull, 20000000000003ull};
    const uint64_t off[4] = {0, 5, 10, 15}, vsz[4] = {5, 5, 5, 5};
    mb_arr8(m, "qwen4exp.ple.layer_multipliers", G_U64, 3, mult);
    mb_arr8(m, "qwen4exp.ple.head_offsets", G_U64, 4, off);
    mb_arr8(m, "qwen4exp.ple.head_vocab_sizes", G_U64, 4, vsz);

    mb_tdel(m, "output_norm.weight");
    mb_tensor(m, "output_hc_norm.weight", 0, 2, 32, 2, 0);
    mb_tensor(m, "output_hc_down.weight", 0, 2, 64, 4, 0);
    mb_tensor(m, "output_hc_up.weight", 0, 2, 4, 64, 0);
    mb_tensor(m, "per_layer_token_embd.weight", 0, 2, 8, 20, 0);
    static const char *const attn[] = {"attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight"};
    char t[64];
    for (size_t i = 0; i < sizeof attn / sizeof attn[0]; i++) {
        snprintf(t, sizeof t, "blk.0.%s", attn[i]);
        mb_tdel(m, t);
    }
    mb_tensor(m, "blk.0.attn_qkv.weight", 0, 2, 32, 32, 0);
    mb_tensor(m, "blk.0.attn_gate.weight", 0, 2, 32, 16, 0);
    mb_tensor(m, "blk.0.ssm_beta.weight", 0, 2, 32, 2, 0);
    mb_tensor(m, "blk.0.ssm_alpha.weight", 0, 2, 32, 2, 0);
    mb_tensor(m, "blk.0.ssm_conv1d.weight", 0, 2, 4, 32, 0);
    mb_tensor(m, "blk.0.ssm_dt.bias", 0, 1, 2, 0, 0);
    mb_tensor(m, "blk.0.ssm_a", 0, 1, 2, 0, 0);
    mb_tensor(m, "blk.0.ssm_norm.weight", 0, 1, 8, 0, 0);
    mb_tensor(m, "blk.0.ssm_out.weight", 0, 2, 16, 32, 0);
    mb_tensor(m, "blk.0.ple_key.weight", 0, 2, 32, 64, 0);
    mb_tensor(m, "blk.0.ple_value.weight", 0, 2, 32, 32, 0);
    mb_tensor(m, "blk.0.ple_norm_key.weight", 0, 2, 32, 2, 0);
    mb_tensor(m, "blk.0.ple_norm_query.weight", 0, 1, 64, 0, 0); /* the flat {hc*E} form */
    mb_tensor(m, "blk.0.ple_norm_conv.weight", 0, 2, 32, 2, 0);
    mb_tensor(m, "blk.0.ple_conv1d.weight", 0, 2, 2, 64, 0);
    mb_tensor(m, "blk.1.attn_q.weight", 0, 2, 32, 64, 0); /* [q; gate] per head */
    mb_tensor(m, "blk.1.attn_q_norm.weight", 0, 1, 8, 0, 0);
    mb_tensor(m, "blk.1.attn_k_norm.weight", 0, 1, 8, 0, 0);
    mb_tensor(m, "blk.1.indexer.q_proj.weight", 0, 2, 32, 16, 0);
    mb_tensor(m, "blk.1.indexer.k_proj.weight", 0, 2, 32, 8, 0);
    mb_tensor(m, "blk.1.indexer.q_norm.weight", 0, 1, 8, 0, 0);
    mb_tensor(m, "blk.1.indexer.k_norm.weight", 0, 1, 8, 0, 0);
    static const char *const hcs[] = {"hc_attn", "hc_ffn"};
    for (int l = 0; l < 2; l++) {
#define TN(f, ...) (snprintf(t, sizeof t, "blk.%d." f, l, __VA_ARGS__), t)
        mb_tdel(m, TN("%s", "attn_norm.weight"));
        mb_tdel(m, TN("%s", "ffn_norm.weight"));
        for (int h = 0; h < 2; h++) {
            mb_tensor(m, TN("%s_norm.weight", hcs[h]), 0, 2, 32, 2, 0);
            mb_tensor(m, TN("%s_down.weight", hcs[h]), 0, 2, 64, 4, 0);
            mb_tensor(m, TN("%s_up.weight", hcs[h]), 0, 2, 4, 64, 0);
            mb_tensor(m, TN("%s_inject.weight", hcs[h]), 0, 2, 64, 2, 0);
        }
        mb_tensor(m, TN("%s", "ffn_gate_inp_shexp.weight"), 0, 1, 32, 0, 0);
        mb_tensor(m, TN("%s", "ffn_gate_shexp.weight"), 0, 2, 32, 16, 0);
        mb_tensor(m, TN("%s", "ffn_up_shexp.weight"), 0, 2, 32, 16, 0);
        mb_tensor(m, TN("%s", "ffn_down_shexp.weight"), 0, 2, 16, 32, 0);
#undef TN
    }
    return m;
}

/* ------------------------------------------------------------------------ */
/* Files and processes                                                        */

static void tmp_path(char *path, size_t n, const char *tag) {
    snprintf(path, n, "/tmp/td_test_model_%s_XXXXXX", tag);
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    cr_assert(f, "cannot read %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    cr_assert(s);
    cr_assert_eq(fread(s, 1, (size_t)n, f), (size_t)n);
    s[n] = '\0';
    fclose(f);
    return s;
}

typedef struct proc {
    int status; /* waitpid status */
    char *out, *err;
} proc;

static const char *tapdiff_bin(void) {
    const char *t = getenv("TD_TAPDIFF");
    if (!t || access(t, X_OK) != 0) cr_skip_test("TD_TAPDIFF is not set to the built tapdiff binary");
    return t;
}

/* tapdiff inspect FILE [extra] */
static proc run_inspect(const char *file, const char *extra) {
    const char *bin = tapdiff_bin();
    char op[64], ep[64];
    tmp_path(op, sizeof op, "out");
    tmp_path(ep, sizeof ep, "err");
    fflush(NULL);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        if (!freopen(op, "w", stdout) || !freopen(ep, "w", stderr)) _exit(126);
        char *argv[] = {(char *)bin, "inspect", (char *)file, (char *)extra, NULL};
        execv(bin, argv);
        _exit(127);
    }
    proc p = {0};
    cr_assert_eq(waitpid(pid, &p.status, 0), pid);
    p.out = slurp(op);
    p.err = slurp(ep);
    unlink(op);
    unlink(ep);
    return p;
}

static void proc_free(proc *p) {
    free(p->out);
    free(p->err);
}

/* The number after "key": in a JSON text (keys used here are unique in the document). */
static double json_num(const char *js, const char *key) {
    char k[64];
    snprintf(k, sizeof k, "\"%s\"", key);
    const char *p = strstr(js, k);
    cr_assert(p, "JSON has no key %s", key);
    p += strlen(k);
    while (*p == ' ' || *p == '\t' || *p == '\n') p++;
    cr_assert_eq(*p, ':');
    p++;
    char *end;
    double v = strtod(p, &end);
    cr_assert(end != p, "JSON key %s is not a number", key);
    return v;
}

/* The raw value text after "key": (up to the next , or newline). */
static void json_raw(const char *js, const char *key, char *out, size_t n) {
    char k[64];
    snprintf(k, sizeof k, "\"%s\"", key);
    const char *p = strstr(js, k);
    cr_assert(p, "JSON has no key %s", key);
    p += strlen(k);
    while (*p == ' ' || *p == '\t' || *p == ':') p++;
    size_t i = 0;
    while (p[i] && p[i] != ',' && p[i] != '\n' && i + 1 < n) {
        out[i] = p[i];
        i++;
    }
    out[i] = '\0';
}

/* ------------------------------------------------------------------------ */
/* stories260K.gguf                                                           */

static const char *stories_path(char *buf, size_t n) {
    const char *sh = getenv("TD_SHARED");
    if (!sh) cr_skip_test("TD_SHARED is not set: no ../shared/models/stories260K.gguf to test against");
    snprintf(buf, n, "%s/models/stories260K.gguf", sh);
    if (access(buf, R_OK) != 0) cr_skip_test("%s is absent (a fresh clone has no ../shared)", buf);
    return buf;
}

Test(model, stories260K_binds) {
    char path[4096];
    stories_path(path, sizeof path);
    td_model *m = NULL;
    td_err err = {{0}};
    int st = td_model_open(&m, path, &err);
    cr_assert_eq(st, TD_OK, "%s", err.msg);
    /* numbers from ../shared/models/README.md */
    const td_hparams *hp = &m->hp;
    cr_expect_eq(hp->arch, TD_ARCH_LLAMA);
    cr_expect_eq(hp->n_embd, 64);
    cr_expect_eq(hp->n_ff, 172);
    cr_expect_eq(hp->n_layer, 5);
    cr_expect_eq(hp->n_head, 8);
    cr_expect_eq(hp->n_head_kv, 4);
    cr_expect_eq(hp->head_dim, 8);
    cr_expect_eq(hp->rope_dims, 8);
    cr_expect_eq(hp->rope_type, TD_ROPE_NORM);
    cr_expect_eq(hp->rms_eps, 1e-5f);
    cr_expect_eq(hp->n_ctx_train, 2048);
    cr_expect_eq(hp->rope_n_ctx_orig, 2048); /* default: context_length */
    cr_expect_eq(hp->rope_base, 10000.0f);   /* default: absent from the file */
    cr_expect_eq(hp->rope_freq_scale, 1.0f);
    cr_expect_eq(hp->n_expert, 0);
    cr_expect_eq(hp->n_vocab, 512);
    cr_expect_eq(m->vocab.kind, TD_VOCAB_SPM);
    cr_expect_str_eq(m->vocab.model, "llama");
    cr_expect_eq(m->vocab.n_tokens, 512);
    cr_expect_eq(m->vocab.bos_id, 1);
    cr_expect_eq(m->vocab.eos_id, 2);
    cr_expect_eq(m->vocab.unk_id, 0);
    cr_expect(m->vocab.scores && m->vocab.token_type);
    cr_expect_eq(m->output_tied, 0);
    cr_expect(m->output && m->output != m->tok_embd);
    cr_expect_null(m->rope_freqs);
    for (uint32_t l = 0; l < 5; l++) {
        cr_expect(m->layers[l].attn.wq && m->layers[l].attn.wk && m->layers[l].attn.wv && !m->layers[l].attn.wqkv);
        cr_expect(m->layers[l].ffn.gate && !m->layers[l].ffn.gate_inp && !m->layers[l].attn.q_norm);
        cr_expect_eq(m->layers[l].attn.wk->ne[1], 32); /* Hkv*D = 4*8 */
    }
    cr_expect_str_eq(m->layers[4].ffn.down->cname, "blk.4.ffn_down.weight");

    /* token text; pieces read from the file's bytes by an independent script */
    char t[64];
    uint64_t len = 0;
    const char *p = td_vocab_piece(m, 265, &len);
    cr_assert(p);
    cr_expect(len == 6 && !memcmp(p, "\xE2\x96\x81the", 6), "piece 265 is '\u2581the'");
    cr_expect_eq(td_vocab_text(m, 265, t, sizeof t), 4);
    cr_expect_str_eq(t, " the");
    cr_expect_eq(td_vocab_text(m, 403, t, sizeof t), 5);
    cr_expect_str_eq(t, " Once");
    td_vocab_text(m, 260, t, sizeof t);
    cr_expect_str_eq(t, "he");
    td_vocab_text(m, 1, t, sizeof t);
    cr_expect_str_eq(t, "<s>");
    /* byte tokens <0x00>..<0xFF> are ids 3..258: id 3 + 0x41 = "A", 3 + 0x0A = newline */
    cr_expect_eq(td_vocab_text(m, 3 + 0x41, t, sizeof t), 1);
    cr_expect_str_eq(t, "A");
    cr_expect_eq(td_vocab_text(m, 3 + 0x0A, t, sizeof t), 1);
    cr_expect_str_eq(t, "\n");
    cr_expect_eq(td_vocab_text(m, 3, t, sizeof t), 1); /* the NUL byte: length 1, content 0 */
    cr_expect_eq(t[0], 0);
    cr_expect_null(td_vocab_piece(m, 512, NULL));
    cr_expect_null(td_vocab_piece(m, -1, NULL));
    cr_expect_eq(td_vocab_text(m, 512, t, sizeof t), 0);
    cr_expect_str_eq(t, "");
    td_model_close(m);
}

Test(model, stories260K_inspect_text) {
    char path[4096];
    stories_path(path, sizeof path);
    proc p = run_inspect(path, NULL);
    cr_assert(WIFEXITED(p.status), "tapdiff inspect died by a signal");
    cr_assert_eq(WEXITSTATUS(p.status), 0, "stderr: %s", p.err);
    const char *want[] = {
        "sha256: 270cba1bd5109f42d03350f60406024560464db173c0e387d91f0426d3bd256d\n",
        "size: 1185376 bytes\n",
        "n_tensors: 48\n",
        "llama.attention.head_count = UINT32 8\n",
        "tokenizer.ggml.tokens = [STRING x 512] \"<unk>\", \"<s>\", \"</s>\"",
        "  blk.4.ffn_norm.weight ", /* tensor list (48 <= 100 tensors) */
        "  arch: llama\n",
        "  blocks: 5\n",
        "  embedding (E): 64\n",
        "  heads (H): 8\n",
        "  kv heads (Hkv): 4\n",
        "  head dim (D): 8\n",
        "  ffn (F): 172\n",
        "  rope: NORM, dims 8, base 10000,",
        "  vocab: llama (SentencePiece), 512 tokens, 0 merges, bos 1, eos 2, unk 0\n",
        "  output: output.weight\n",
        "  unused tensors: 0\n",
        "\nvalid: llama model, 5 blocks, 48 tensors\n",
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        cr_expect(strstr(p.out, want[i]), "inspect output lacks [%s]; got:\n%s", want[i], p.out);
    cr_expect_str_eq(p.err, "");
    proc_free(&p);
}

Test(model, stories260K_inspect_json) {
    char path[4096];
    stories_path(path, sizeof path);
    proc p = run_inspect(path, "--json");
    cr_assert(WIFEXITED(p.status) && WEXITSTATUS(p.status) == 0, "stderr: %s", p.err);
    char raw[128];
    json_raw(p.out, "valid", raw, sizeof raw);
    cr_expect_str_eq(raw, "true");
    json_raw(p.out, "error", raw, sizeof raw);
    cr_expect_str_eq(raw, "null");
    json_raw(p.out, "arch", raw, sizeof raw);
    cr_expect_str_eq(raw, "\"llama\"");
    json_raw(p.out, "rope_type", raw, sizeof raw);
    cr_expect_str_eq(raw, "\"NORM\"");
    json_raw(p.out, "vocab_kind", raw, sizeof raw);
    cr_expect_str_eq(raw, "\"SentencePiece\"");
    json_raw(p.out, "sha256", raw, sizeof raw);
    cr_expect_str_eq(raw, "\"270cba1bd5109f42d03350f60406024560464db173c0e387d91f0426d3bd256d\"");
    cr_expect_eq(json_num(p.out, "n_tensors"), 48);
    cr_expect_eq(json_num(p.out, "size"), 1185376);
    cr_expect_eq(json_num(p.out, "n_layer"), 5);
    cr_expect_eq(json_num(p.out, "n_embd"), 64);
    cr_expect_eq(json_num(p.out, "n_head"), 8);
    cr_expect_eq(json_num(p.out, "n_head_kv"), 4);
    cr_expect_eq(json_num(p.out, "head_dim"), 8);
    cr_expect_eq(json_num(p.out, "rope_dims"), 8);
    cr_expect_eq(json_num(p.out, "n_ff"), 172);
    cr_expect_eq(json_num(p.out, "n_vocab"), 512);
    cr_expect_eq(json_num(p.out, "bos_id"), 1);
    cr_expect_eq(json_num(p.out, "eos_id"), 2);
    cr_expect_eq(json_num(p.out, "unk_id"), 0);
    cr_expect(strstr(p.out, "\"blk.4.ffn_up.weight\""), "tensor list missing from JSON");
    /* one document: it starts with { and its last non-space character is } */
    size_t n = strlen(p.out);
    while (n && (p.out[n - 1] == '\n' || p.out[n - 1] == ' ')) n--;
    cr_expect(p.out[0] == '{' && n && p.out[n - 1] == '}');
    proc_free(&p);
}

Test(model, inspect_usage) {
    const char *bin = tapdiff_bin();
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "'%s' inspect >/dev/null 2>&1", bin);
    int s = system(cmd);
    cr_expect(WIFEXITED(s) && WEXITSTATUS(s) == 2, "no file: expected exit 2");
    snprintf(cmd, sizeof cmd, "'%s' inspect --frobnicate x.gguf >/dev/null 2>&1", bin);
    s = system(cmd);
    cr_expect(WIFEXITED(s) && WEXITSTATUS(s) == 2, "unknown option: expected exit 2");
    snprintf(cmd, sizeof cmd, "'%s' inspect a.gguf b.gguf >/dev/null 2>&1", bin);
    s = system(cmd);
    cr_expect(WIFEXITED(s) && WEXITSTATUS(s) == 2, "two files: expected exit 2");
    snprintf(cmd, sizeof cmd, "'%s' inspect --help | grep -q 'usage: tapdiff inspect'", bin);
    s = system(cmd);
    cr_expect(WIFEXITED(s) && WEXITSTATUS(s) == 0, "--help: expected exit 0 and usage on stdout");
    /* not a GGUF: parse failure, exit 3 with the reader's message */
    char path[64];
    tmp_path(path, sizeof path, "notgguf");
    FILE *f = fopen(path, "w");
    fputs("this is not a gguf file at all\n", f);
    fclose(f);
    proc p = run_inspect(path, NULL);
    cr_expect(WIFEXITED(p.status) && WEXITSTATUS(p.status) == 3);
    cr_expect(strstr(p.err, path), "stderr should name the file: %s", p.err);
    proc_free(&p);
    p = run_inspect(path, "--json");
    cr_expect(WIFEXITED(p.status) && WEXITSTATUS(p.status) == 3);
    char raw[64];
    json_raw(p.out, "valid", raw, sizeof raw);
    cr_expect_str_eq(raw, "false");
    proc_free(&p);
    unlink(path);
}

/* ------------------------------------------------------------------------ */
/* Valid synthetic models                                                     */

static td_model *open_built(mb *m, char *path, size_t n) {
    tmp_path(path, n, "ok");
    mb_write(m, path);
    mb_free(m);
    td_model *md = NULL;
    td_err err = {{0}};
    int st = td_model_open(&md, path, &err);
    cr_assert_eq(st, TD_OK, "expected a valid model: %s", err.msg);
    return md;
}

Test(model, llama_base_binds) {
    char path[64];
    td_model *m = open_built(build(&LLAMA), path, sizeof path);
    const td_hparams *hp = &m->hp;
    cr_expect_eq(hp->n_embd, 32);
    cr_expect_eq(hp->head_dim, 32 / 4); /* default D = E/H */
    cr_expect_eq(hp->rope_dims, 8);     /* default R = D */
    cr_expect_eq(hp->n_head_kv, 2);
    cr_expect_eq(hp->n_ff, 48);
    cr_expect_eq(hp->n_vocab, N_SPM);
    cr_expect_eq(hp->rope_scaling, TD_ROPE_SCALING_LINEAR); /* llama's default */
    cr_expect_eq(m->output_tied, 0);
    cr_expect_eq(m->vocab.bos_id, 1);
    cr_expect_eq(m->vocab.eos_id, 2);
    cr_expect_eq(m->layers[1].attn.wk->ne[1], 2 * 8);
    cr_expect_null(m->layers[0].attn.bq);
    cr_expect_null(m->layers[0].attn.bo);
    /* SentencePiece text: U+2581 -> ' ', <0xNN> -> that byte */
    char t[16];
    td_vocab_text(m, 4, t, sizeof t);
    cr_expect_str_eq(t, " a");
    td_vocab_text(m, 3, t, sizeof t);
    cr_expect_str_eq(t, "A");
    td_vocab_text(m, 7, t, sizeof t);
    cr_expect_str_eq(t, "\n");
    /* truncation keeps the NUL inside the buffer */
    cr_expect_eq(td_vocab_text(m, 4, t, 2), 1);
    cr_expect_str_eq(t, " ");
    proc p = run_inspect(path, NULL);
    cr_expect(WIFEXITED(p.status) && WEXITSTATUS(p.status) == 0, "stderr: %s", p.err);
    cr_expect(strstr(p.out, "valid: llama model, 2 blocks, 21 tensors\n"), "%s", p.out); /* 3 + 2 x 9 */
    proc_free(&p);
    td_model_close(m);
    unlink(path);
}

Test(model, tied_output_binds) {
    cfg c = LLAMA;
    c.tied = 1;
    char path[64];
    td_model *m = open_built(build(&c), path, sizeof path);
    cr_expect_eq(m->output_tied, 1);
    cr_expect_eq(m->output, m->tok_embd);
    proc p = run_inspect(path, NULL);
    cr_expect(WIFEXITED(p.status) && WEXITSTATUS(p.status) == 0, "stderr: %s", p.err);
    cr_expect(strstr(p.out, "  output: tied to token_embd.weight\n"), "%s", p.out);
    proc_free(&p);
    td_model_close(m);
    unlink(path);
}

Test(model, fused_qkv_binds) {
    cfg c = LLAMA;
    c.fused = 1;
    char path[64];
    td_model *m = open_built(build(&c), path, sizeof path);
    for (int l = 0; l < 2; l++) {
        cr_expect_not_null(m->layers[l].attn.wqkv);
        cr_expect_eq(m->layers[l].attn.wqkv->ne[1], (4 + 2 * 2) * 8); /* (H + 2 Hkv) D */
        cr_expect(!m->layers[l].attn.wq && !m->layers[l].attn.wk && !m->layers[l].attn.wv);
    }
    proc p = run_inspect(path, "--json");
    cr_expect(WIFEXITED(p.status) && WEXITSTATUS(p.status) == 0, "stderr: %s", p.err);
    char raw[32];
    json_raw(p.out, "fused_qkv", raw, sizeof raw);
    cr_expect_str_eq(raw, "true");
    proc_free(&p);
    td_model_close(m);
    unlink(path);
}

Test(model, optional_biases_bind) {
    mb *b = build(&LLAMA);
    mb_tensor(b, "blk.0.attn_q.bias", 0, 1, 4 * 8, 0, 0);
    mb_tensor(b, "blk.0.attn_k.bias", 0, 1, 2 * 8, 0, 0);
    mb_tensor(b, "blk.0.attn_output.bias", 0, 1, 32, 0, 0);
    mb_tensor(b, "rope_freqs.weight", 0, 1, 8 / 2, 0, 0);
    mb_tensor(b, "some.unknown.tensor", 0, 1, 5, 0, 0); /* ignored, counted as unused */
    char path[64];
    td_model *m = open_built(b, path, sizeof path);
    cr_expect_not_null(m->layers[0].attn.bq);
    cr_expect_not_null(m->layers[0].attn.bk);
    cr_expect_null(m->layers[0].attn.bv);
    cr_expect_not_null(m->layers[0].attn.bo);
    cr_expect_null(m->layers[1].attn.bq);
    cr_expect_not_null(m->rope_freqs);
    proc p = run_inspect(path, NULL);
    cr_expect(WIFEXITED(p.status) && WEXITSTATUS(p.status) == 0, "stderr: %s", p.err);
    cr_expect(strstr(p.out, "  unused tensors: 1\n"), "%s", p.out);
    proc_free(&p);
    td_model_close(m);
    unlink(path);
}

Test(model, qwen3_binds) {
    mb *b = build(&QWEN3);
    mb_u32(b, "qwen3.expert_count", 4); /* not read by qwen3 (arch-qwen3.md): stays dense */
    char path[64];
    td_model *m = open_built(b, path, sizeof path);
    const td_hparams *hp = &m->hp;
    cr_expect_eq(hp->arch, TD_ARCH_QWEN3);
    cr_expect_eq(hp->rope_type, TD_ROPE_NEOX);
    cr_expect_eq(hp->head_dim, 16); /* key_length, not E/H = 8 */
    cr_expect_eq(hp->rope_dims, 16);
    cr_expect_eq(hp->n_expert, 0);
    cr_expect_not_null(m->layers[1].attn.q_norm);
    cr_expect_eq(m->layers[1].attn.q_norm->ne[0], 16);
    cr_expect_eq(m->layers[1].attn.wq->ne[1], 4 * 16);
    cr_expect_eq(m->layers[1].attn.wo->ne[0], 4 * 16);
    cr_expect_not_null(m->layers[0].ffn.up);
    td_model_close(m);
    unlink(path);
}

Test(model, qwen3moe_binds_with_fallback_F) {
    mb *b = build(&QWEN3MOE);
    mb_str(b, "qwen3moe.rope.scaling.type", "yarn");
    mb_f32(b, "qwen3moe.rope.scaling.factor", 4.0f);
    mb_u32(b, "qwen3moe.rope.scaling.original_context_length", 64);
    char path[64];
    td_model *m = open_built(b, path, sizeof path);
    const td_hparams *hp = &m->hp;
    cr_expect_eq(hp->arch, TD_ARCH_QWEN3MOE);
    cr_expect_eq(hp->rope_type, TD_ROPE_NEOX);
    cr_expect_eq(hp->n_expert, 4);
    cr_expect_eq(hp->n_expert_used, 2);
    cr_expect_eq(hp->n_ff, 48 / 2); /* no expert_feed_forward_length: F = n_ff / K */
    cr_expect_eq(hp->rope_scaling, TD_ROPE_SCALING_YARN);
    cr_expect_eq(hp->rope_freq_scale, 0.25f); /* 1 / factor */
    cr_expect_eq(hp->rope_n_ctx_orig, 64);
    cr_expect_eq(hp->rope_attn_factor, 1.0f);
    for (int l = 0; l < 2; l++) {
        const td_layer *ly = &m->layers[l];
        cr_expect(ly->ffn.gate_inp && ly->ffn.gate_exps && ly->ffn.up_exps && ly->ffn.down_exps);
        cr_expect(!ly->ffn.gate && !ly->ffn.up && !ly->ffn.down);
        cr_expect_eq(ly->ffn.up_exps->ne[2], 4);
        cr_expect(ly->attn.q_norm && ly->attn.k_norm);
    }
    td_model_close(m);
    unlink(path);
}

Test(model, qwen3next_binds_gdn_and_gated_attention_blocks) {
    char path[64];
    td_model *m = open_built(build_qwen3next(), path, sizeof path);
    const td_hparams *hp = &m->hp;
    cr_expect_eq(hp->arch, TD_ARCH_QWEN3NEXT);
    cr_expect_eq(hp->rope_type, TD_ROPE_NEOX);
    cr_expect_eq(hp->n_layer, 2);
    cr_expect_eq(hp->rope_dims, 4); /* partial: R < D = 8 */
    cr_expect_eq(hp->head_dim, 8);
    cr_expect_eq(hp->n_ff, 24);
    cr_expect_eq(hp->n_ff_shexp, 16);
    cr_expect(hp->ssm_conv == 4 && hp->ssm_d_state == 8 && hp->ssm_n_group == 1 && hp->ssm_dt_rank == 2 &&
              hp->ssm_d_inner == 16);
    cr_expect_eq(m->layers[0].kind, TD_LAYER_GDN);
    cr_expect_eq(m->layers[1].kind, TD_LAYER_ATTENTION);
    const td_gdn_parts *g = &m->layers[0].gdn;
    cr_expect(g->norm && g->wqkv && g->wgate && g->wba && g->conv && g->dt_bias && g->a && g->ssm_norm && g->wout);
    cr_expect_eq(g->conv->ne[0], 4);
    cr_expect_null(m->layers[0].attn.wq);
    cr_expect(m->layers[1].attn.q_gated && m->layers[1].attn.wq->ne[1] == 64);
    for (int l = 0; l < 2; l++) {
        const td_ffn_parts *f = &m->layers[l].ffn;
        cr_expect(f->norm && f->gate_inp && f->gate_exps && f->gate_inp_shexp && f->gate_shexp && f->up_shexp &&
                  f->down_shexp, "block %d", l);
    }
    td_model_close(m);
    unlink(path);
}

Test(model, qwen3next_recurrent_layers_and_mtp_blocks) {
    /* recurrent_layers wins over full_attention_interval (which here would
     * make every block attention); a trailing MTP block is not in the trunk */
    mb *b = build_qwen3next();
    mb_u32(b, "qwen3next.full_attention_interval", 1); /* would make every block attention */
    mb_u32(b, "qwen3next.block_count", 3);
    mb_u32(b, "qwen3next.nextn_predict_layers", 1);
    uint8_t flags[4] = {1, 0, 0, 0};
    buf *arr = mb_set(b, "qwen3next.attention.recurrent_layers", G_ARR);
    b_le(arr, G_BOOL, 4);
    b_le(arr, 3, 8);
    b_put(arr, flags, 3);
    char path[64];
    td_model *m = open_built(b, path, sizeof path);
    cr_expect_eq(m->hp.n_layer, 2);
    cr_expect_eq(m->hp.n_nextn, 1);
    cr_expect_eq(m->layers[0].kind, TD_LAYER_GDN);
    cr_expect_eq(m->layers[1].kind, TD_LAYER_ATTENTION);
    td_model_close(m);
    unlink(path);
}

Test(model, qwen4exp_binds_hc_qsa_gdn_and_ple) {
    char path[64];
    td_model *m = open_built(build_qwen4exp(), path, sizeof path);
    const td_hparams *hp = &m->hp;
    cr_expect_eq(hp->arch, TD_ARCH_QWEN4EXP);
    cr_expect_eq(hp->rope_type, TD_ROPE_IMROPE);
    cr_expect_str_eq(td_rope_type_name(hp->rope_type), "IMROPE");
    cr_expect(hp->rope_sections[0] == 1 && hp->rope_sections[1] == 1 && hp->rope_sections[2] == 0 &&
              hp->rope_sections[3] == 0);
    cr_expect(hp->hc == 2 && hp->hc_lr == 4);
    cr_expect(hp->idx_heads == 2 && hp->idx_dim == 8 && hp->idx_topk == 4);
    cr_expect(hp->qsa_ratio[0] == 0 && hp->qsa_ratio[1] == 4);
    cr_expect_eq(hp->ple_layer, 0);
    cr_expect(hp->ple_ngram == 3 && hp->ple_heads_per_ngram == 2 && hp->ple_n_heads == 4 && hp->ple_conv == 2 &&
              hp->ple_dim == 8 && hp->ple_eos == 2);
    cr_expect_eq(hp->ple_image, 2, "absent image token id falls back to the EOS id");
    cr_expect_eq(hp->ple_mult[0], 0x9E3779B97F4A7C15ull, "a multiplier above INT64_MAX keeps its 64 bits");
    cr_expect_eq(hp->ple_mult[2], 20000000000003ull);
    cr_expect_eq(hp->ple_rows, 20);
    cr_expect_eq(m->layers[0].kind, TD_LAYER_HC_GDN);
    cr_expect_eq(m->layers[1].kind, TD_LAYER_HC_QSA);
    cr_expect_str_eq(td_layer_kind_name(TD_LAYER_HC_GDN), "hc_gdn");
    cr_expect_str_eq(td_layer_kind_name(TD_LAYER_HC_QSA), "hc_qsa");
    cr_expect_null(m->output_norm);
    cr_expect(m->hc_out.norm && m->hc_out.down && m->hc_out.up && !m->hc_out.inject);
    cr_expect(m->ple_table && m->ple_table->ne[1] == 20);
    const td_gdn_parts *g = &m->layers[0].gdn;
    cr_expect(g->wqkv && g->wgate && g->wbeta && g->walpha && g->conv && g->dt_bias && g->a && g->ssm_norm && g->wout);
    cr_expect(!g->wba && !g->norm);
    const td_ple_parts *p = &m->layers[0].ple;
    cr_expect(p->key && p->value && p->norm_key && p->norm_query && p->norm_conv && p->conv);
    cr_expect_eq(p->norm_query->ne[0], 64, "the flat gamma binds");
    cr_expect_null(m->layers[1].ple.key);
    const td_layer *a = &m->layers[1];
    cr_expect(a->attn.q_gated && a->attn.wq->ne[1] == 64 && a->attn.q_norm && a->attn.k_norm && !a->attn.norm);
    cr_expect(a->qsa.wq && a->qsa.wk && a->qsa.q_norm && a->qsa.k_norm);
    for (int l = 0; l < 2; l++) {
        const td_layer *ly = &m->layers[l];
        cr_expect(ly->hc_attn.norm && ly->hc_attn.down && ly->hc_attn.up && ly->hc_attn.inject, "block %d", l);
        cr_expect(ly->hc_ffn.norm && ly->hc_ffn.down && ly->hc_ffn.up && ly->hc_ffn.inject, "block %d", l);
        cr_expect(!ly->ffn.norm && ly->ffn.gate_inp && ly->ffn.gate_exps && ly->ffn.gate_inp_shexp &&
                  ly->ffn.down_shexp, "block %d", l);
    }
    td_model_close(m);
    proc ip = run_inspect(path, NULL); // every tensor of the file is bound, none left over
    cr_expect_eq(WEXITSTATUS(ip.status), 0, "%s", ip.err);
    cr_expect(strstr(ip.out, "valid: qwen4exp model, 2 blocks"), "%s", ip.out);
    cr_expect(strstr(ip.out, "  unused tensors: 0\n"), "%s", ip.out);
    proc_free(&ip);
    unlink(path);
}

Test(model, qwen4exp_without_ple_and_scalar_keys) {
    /* no ple.* keys and no table: no PLE; a scalar compress ratio applies to
     * the attention layers only; a scalar sections key fills all four */
    mb *b = build_qwen4exp();
    static const char *const ple[] = {"ple.layers", "ple.ngram_size", "ple.heads_per_ngram", "ple.conv_kernel",
                                      "ple.eos_token_id", "ple.layer_multipliers", "ple.head_offsets",
                                      "ple.head_vocab_sizes", "embedding_length_per_layer_input"};
    char k[96];
    for (size_t i = 0; i < sizeof ple / sizeof ple[0]; i++) {
        snprintf(k, sizeof k, "qwen4exp.%s", ple[i]);
        mb_del(b, k);
    }
    static const char *const pt[] = {"per_layer_token_embd.weight", "blk.0.ple_key.weight", "blk.0.ple_value.weight",
                                     "blk.0.ple_norm_key.weight", "blk.0.ple_norm_query.weight",
                                     "blk.0.ple_norm_conv.weight", "blk.0.ple_conv1d.weight"};
    for (size_t i = 0; i < sizeof pt / sizeof pt[0]; i++) mb_tdel(b, pt[i]);
    mb_u32(b, "qwen4exp.attention.compress_ratios", 8);
    mb_u32(b, "qwen4exp.rope.dimension_sections", 3);
    char path[64];
    td_model *m = open_built(b, path, sizeof path);
    cr_expect_eq(m->hp.ple_layer, -1);
    cr_expect_null(m->ple_table);
    cr_expect(m->hp.qsa_ratio[0] == 0 && m->hp.qsa_ratio[1] == 8);
    for (int i = 0; i < 4; i++) cr_expect_eq(m->hp.rope_sections[i], 3);
    td_model_close(m);
    unlink(path);
}

Test(model, llama_moe_binds_without_gate_experts) {
    char path[64];
    td_model *m = open_built(build(&LLAMA_MOE), path, sizeof path);
    cr_expect_eq(m->hp.arch, TD_ARCH_LLAMA);
    cr_expect_eq(m->hp.rope_type, TD_ROPE_NORM);
    cr_expect_eq(m->hp.n_expert, 4);
    cr_expect_eq(m->hp.n_ff, 48); /* llama experts use feed_forward_length */
    cr_expect_not_null(m->layers[0].ffn.gate_inp);
    cr_expect_null(m->layers[0].ffn.gate_exps);
    cr_expect_not_null(m->layers[0].ffn.down_exps);
    cr_expect_null(m->layers[0].attn.q_norm);
    td_model_close(m);
    unlink(path);
}

/* ------------------------------------------------------------------------ */
/* The architecture table                                                     */

/* One case per architecture shape: what the spec says each must bind
 * (arch-*.md), written here by hand, not read from the descriptors. */
typedef struct arch_case {
    const cfg *c;
    td_arch arch;
    td_rope_type rope;
    int qk_norm, moe;
} arch_case;
static const arch_case k_arch_cases[] = {
    {&LLAMA, TD_ARCH_LLAMA, TD_ROPE_NORM, 0, 0},
    {&LLAMA_MOE, TD_ARCH_LLAMA, TD_ROPE_NORM, 0, 1},
    {&QWEN3, TD_ARCH_QWEN3, TD_ROPE_NEOX, 1, 0},
    {&QWEN3MOE, TD_ARCH_QWEN3MOE, TD_ROPE_NEOX, 1, 1},
};
#define N_ARCH_CASES (sizeof k_arch_cases / sizeof k_arch_cases[0])
static int k_arch_case_ix[N_ARCH_CASES];

ParameterizedTestParameters(arch_table, binds_attention_layers_per_spec) {
    for (size_t i = 0; i < N_ARCH_CASES; i++) k_arch_case_ix[i] = (int)i;
    return cr_make_param_array(int, k_arch_case_ix, N_ARCH_CASES);
}

ParameterizedTest(int *ix, arch_table, binds_attention_layers_per_spec) {
    const arch_case *k = &k_arch_cases[*ix];
    char path[64];
    td_model *m = open_built(build(k->c), path, sizeof path);
    const char *name = k->c->arch;
    cr_expect_eq(m->hp.arch, k->arch, "%s", name);
    cr_expect_eq(m->hp.rope_type, k->rope, "%s", name);
    cr_expect_str_eq(td_arch_name(m->hp.arch), name);
    const td_arch_desc *d = td_arch_find(name);
    cr_assert_not_null(d, "%s is not in the table", name);
    cr_expect_eq(d, td_arch_get(k->arch), "%s: find and get disagree", name);
    for (uint32_t l = 0; l < m->hp.n_layer; l++) {
        const td_layer *ly = &m->layers[l];
        cr_expect_eq(ly->kind, TD_LAYER_ATTENTION, "%s block %u: kind %s", name, l, td_layer_kind_name(ly->kind));
        cr_expect(ly->attn.norm && ly->attn.wo && ly->ffn.norm, "%s block %u: attention parts", name, l);
        cr_expect_eq(ly->attn.q_norm != NULL, k->qk_norm, "%s block %u: q_norm", name, l);
        cr_expect_eq(ly->attn.k_norm != NULL, k->qk_norm, "%s block %u: k_norm", name, l);
        cr_expect_eq(ly->ffn.gate_inp != NULL, k->moe, "%s block %u: router", name, l);
        cr_expect_eq(ly->ffn.gate != NULL, !k->moe, "%s block %u: dense gate", name, l);
    }
    td_model_close(m);
    unlink(path);
}

Test(arch_table, every_descriptor_is_complete_and_found_by_name) {
    cr_assert_eq(td_arch_count(), 5,
                 "llama, qwen3, qwen3moe, qwen3next, qwen4exp (arch-*.md); a new one comes with its tests");
    for (size_t i = 0; i < td_arch_count(); i++) {
        const td_arch_desc *d = td_arch_at(i);
        cr_assert_not_null(d);
        cr_expect(d->name && d->spec && d->read_hparams && d->layer_kind && d->bind_layer, "%s: hooks", d->name);
        cr_expect_eq(td_arch_find(d->name), d, "%s", d->name);
        cr_expect_eq(td_arch_get(d->arch), d, "%s", d->name);
    }
    cr_expect_null(td_arch_at(td_arch_count()));
    cr_expect_null(td_arch_find("gpt9"));
    cr_expect_null(td_arch_find(NULL));
    char names[128];
    td_arch_names(names, sizeof names, ", ");
    cr_expect_str_eq(names, "llama, qwen3, qwen3moe, qwen3next, qwen4exp");
    cr_expect_str_eq(td_layer_kind_name(TD_LAYER_ATTENTION), "attention");
    cr_expect_str_eq(td_layer_kind_name(TD_LAYER_GDN), "gdn");
    cr_expect_str_eq(td_layer_kind_name(TD_LAYER_KIND_COUNT), "unknown");
}

Test(model, gpt2_text) {
    cfg c = LLAMA;
    c.gpt2 = 1;
    mb *b = build(&c);
    mb_i32(b, "tokenizer.ggml.bos_token_id", -1); /* llama.cpp's "no token", as INT32 */
    char path[64];
    td_model *m = open_built(b, path, sizeof path);
    cr_expect_eq(m->vocab.kind, TD_VOCAB_BPE);
    cr_expect_eq(m->vocab.n_merges, 3);
    cr_expect_eq(m->vocab.bos_id, -1);
    cr_expect_eq(m->vocab.eos_id, 8);
    /* bytes_to_unicode by hand: printable bytes 33-126, 161-172, 174-255 are
     * themselves; the other 68 in increasing order (0..32 -> n 0..32,
     * 127..160 -> n 33..66, 173 -> n 67) are U+0100 + n. So U+0120 'Ġ' = 32
     * (space), U+010A 'Ċ' = 10, U+0100 = 0, U+0121 = 127, U+0142 = 160,
     * U+0143 = 173, U+00A1 = 161. */
    char t[32];
    cr_expect_eq(td_vocab_text(m, 0, t, sizeof t), 1);
    cr_expect_str_eq(t, "!");
    cr_expect_eq(td_vocab_text(m, 1, t, sizeof t), 6);
    cr_expect_str_eq(t, " hello");
    cr_expect_eq(td_vocab_text(m, 2, t, sizeof t), 1);
    cr_expect_str_eq(t, "\n");
    cr_expect_eq(td_vocab_text(m, 3, t, sizeof t), 1);
    cr_expect_eq((unsigned char)t[0], 0);
    cr_expect_eq(td_vocab_text(m, 4, t, sizeof t), 1);
    cr_expect_eq((unsigned char)t[0], 127);
    cr_expect_eq(td_vocab_text(m, 5, t, sizeof t), 1);
    cr_expect_eq((unsigned char)t[0], 160);
    cr_expect_eq(td_vocab_text(m, 6, t, sizeof t), 1);
    cr_expect_eq((unsigned char)t[0], 173);
    cr_expect_eq(td_vocab_text(m, 7, t, sizeof t), 1);
    cr_expect_eq((unsigned char)t[0], 161);
    td_vocab_text(m, 8, t, sizeof t);
    cr_expect_str_eq(t, "<|endoftext|>");
    cr_expect_eq(td_vocab_text(m, 9, t, sizeof t), 3); /* U+4E2D: not byte-level, kept as stored */
    cr_expect_str_eq(t, "\xE4\xB8\xAD");
    uint64_t len;
    const char *p = td_vocab_piece(m, 1, &len);
    cr_expect(p && len == 7 && !memcmp(p, "\xC4\xA0hello", 7), "piece is stored untranslated");
    td_model_close(m);
    unlink(path);
}

Test(model, no_tokenizer_uses_vocab_size) {
    mb *b = build(&LLAMA);
    mb_str(b, "tokenizer.ggml.model", "none");
    mb_del(b, "tokenizer.ggml.tokens");
    mb_del(b, "tokenizer.ggml.scores");
    mb_del(b, "tokenizer.ggml.token_type");
    mb_u32(b, "llama.vocab_size", N_SPM); /* token_embd has N_SPM rows */
    char path[64];
    td_model *m = open_built(b, path, sizeof path);
    cr_expect_eq(m->vocab.kind, TD_VOCAB_NONE);
    cr_expect_eq(m->hp.n_vocab, N_SPM);
    cr_expect_null(td_vocab_piece(m, 1, NULL));
    char t[8] = "x";
    cr_expect_eq(td_vocab_text(m, 1, t, sizeof t), 0);
    cr_expect_str_eq(t, "");
    td_model_close(m);
    unlink(path);
}

Test(model, inspect_long_tensor_list) {
    cfg c = LLAMA;
    c.L = 12; /* 3 + 12 x 9 = 111 tensors: more than inspect lists by default */
    mb *b = build(&c);
    char path[64];
    tmp_path(path, sizeof path, "long");
    mb_write(b, path);
    mb_free(b);
    proc p = run_inspect(path, NULL);
    cr_expect(WIFEXITED(p.status) && WEXITSTATUS(p.status) == 0, "stderr: %s", p.err);
    cr_expect(strstr(p.out, "tensors: 111 (more than 100; --tensors lists them)\n"), "%s", p.out);
    cr_expect_null(strstr(p.out, "blk.11.ffn_up.weight"));
    cr_expect(strstr(p.out, "valid: llama model, 12 blocks, 111 tensors\n"), "%s", p.out);
    proc_free(&p);
    p = run_inspect(path, "--tensors");
    cr_expect(WIFEXITED(p.status) && WEXITSTATUS(p.status) == 0, "stderr: %s", p.err);
    cr_expect(strstr(p.out, "  blk.11.ffn_up.weight "), "%s", p.out);
    proc_free(&p);
    unlink(path);
}

/* ------------------------------------------------------------------------ */
/* Invalid variants                                                           */

typedef enum base_kind { B_LLAMA, B_QWEN3, B_QWEN3MOE, B_QWEN3NEXT, B_QWEN4EXP } base_kind;

typedef struct bad_case {
    const char *name;
    base_kind base;
    void (*mutate)(mb *m);
    const char *expect; /* substring of the one-line message */
} bad_case;

static void mut_missing_key(mb *m) { mb_del(m, "llama.embedding_length"); }
static void mut_wrong_key_type(mb *m) { mb_f32(m, "llama.embedding_length", 32.0f); }
static void mut_missing_eps(mb *m) { mb_del(m, "llama.attention.layer_norm_rms_epsilon"); }
static void mut_heads_not_dividing(mb *m) { mb_u32(m, "llama.attention.head_count_kv", 3); }
static void mut_hkv_gt_h(mb *m) { mb_u32(m, "llama.attention.head_count_kv", 8); }
static void mut_h_zero(mb *m) { mb_u32(m, "llama.attention.head_count", 0); }
static void mut_hkv_zero(mb *m) { mb_u32(m, "llama.attention.head_count_kv", 0); }
static void mut_heads_per_layer_differ(mb *m) {
    uint32_t h[2] = {4, 2};
    mb_arr4(m, "llama.attention.head_count", G_U32, 2, h);
}
static void mut_e_over_h(mb *m) { /* 32 / 5, with Hkv = H so that only E/H breaks */
    mb_u32(m, "llama.attention.head_count", 5);
    mb_u32(m, "llama.attention.head_count_kv", 5);
}
static void mut_value_length(mb *m) {
    mb_u32(m, "llama.attention.key_length", 8);
    mb_u32(m, "llama.attention.value_length", 4);
}
static void mut_rope_gt_d(mb *m) { mb_u32(m, "llama.rope.dimension_count", 10); }
static void mut_rope_odd(mb *m) { mb_u32(m, "llama.rope.dimension_count", 7); }
static void mut_rope_partial(mb *m) { mb_u32(m, "llama.rope.dimension_count", 4); }
static void mut_rope_type(mb *m) { mb_str(m, "llama.rope.scaling.type", "longrope"); }
static void mut_k_gt_x(mb *m) { mb_u32(m, "qwen3moe.expert_used_count", 5); }
static void mut_k_zero(mb *m) { mb_u32(m, "qwen3moe.expert_used_count", 0); }
static void mut_x_zero(mb *m) { mb_u32(m, "qwen3moe.expert_count", 0); }
static void mut_dense_with_k(mb *m) { mb_u32(m, "llama.expert_used_count", 2); }
static void mut_unsupported_arch(mb *m) { mb_str(m, "general.architecture", "gpt9"); }
static void mut_missing_tensor(mb *m) { mb_tdel(m, "blk.1.ffn_up.weight"); }
static void mut_missing_qnorm(mb *m) { mb_tdel(m, "blk.0.attn_k_norm.weight"); }
static void mut_wrong_shape(mb *m) { mb_tensor(m, "blk.1.attn_k.weight", 0, 2, 32, 24, 0); }
static void mut_wrong_embd_rows(mb *m) { mb_tensor(m, "token_embd.weight", 0, 2, 32, 9, 0); }
static void mut_wrong_expert_shape(mb *m) { mb_tensor(m, "blk.1.ffn_down_exps.weight", 0, 3, 24, 32, 3); }
static void mut_undecodable(mb *m) { mb_tensor(m, "blk.0.ffn_gate.weight", TD_TYPE_I32, 2, 32, 48, 0); }
static void mut_norm_quantized(mb *m) { mb_tensor(m, "blk.1.attn_norm.weight", TD_TYPE_Q8_0, 1, 32, 0, 0); }
static void mut_vocab_type(mb *m) {
    int32_t ids[N_SPM] = {0};
    mb_arr4(m, "tokenizer.ggml.tokens", G_I32, N_SPM, ids);
}
static void mut_bos_range(mb *m) { mb_u32(m, "tokenizer.ggml.bos_token_id", N_SPM); }
static void mut_eos_negative(mb *m) { mb_i32(m, "tokenizer.ggml.eos_token_id", -5); }
static void mut_scores_len(mb *m) {
    float s[3] = {0, 0, 0};
    mb_arr4(m, "tokenizer.ggml.scores", G_F32, 3, s);
}
static void mut_scores_type(mb *m) {
    int32_t s[N_SPM] = {0};
    mb_arr4(m, "tokenizer.ggml.scores", G_I32, N_SPM, s);
}
static void mut_gpt2_no_merges(mb *m) { mb_str(m, "tokenizer.ggml.model", "gpt2"); }
static void mut_blocks_absurd(mb *m) { mb_u32(m, "llama.block_count", 4000000000u); }
static void mut_ffn_bias(mb *m) { mb_tensor(m, "blk.0.ffn_up.bias", 0, 1, 48, 0, 0); }
static void mut_q3n_state_zero(mb *m) { mb_u32(m, "qwen3next.ssm.state_size", 0); }
static void mut_q3n_groups(mb *m) {
    mb_u32(m, "qwen3next.ssm.group_count", 2);
    mb_u32(m, "qwen3next.ssm.time_step_rank", 3);
}
static void mut_q3n_inner(mb *m) { mb_u32(m, "qwen3next.ssm.inner_size", 24); }
static void mut_q3n_nextn(mb *m) { mb_u32(m, "qwen3next.nextn_predict_layers", 2); }
static void mut_q3n_flags_len(mb *m) {
    int32_t f[3] = {1, 0, 1};
    mb_arr4(m, "qwen3next.attention.recurrent_layers", G_I32, 3, f);
}
static void mut_q3n_flag_mtp(mb *m) {
    mb_u32(m, "qwen3next.block_count", 3);
    mb_u32(m, "qwen3next.nextn_predict_layers", 1);
    int32_t f[3] = {1, 0, 1};
    mb_arr4(m, "qwen3next.attention.recurrent_layers", G_I32, 3, f);
}
static void mut_q3n_interval(mb *m) { mb_u32(m, "qwen3next.full_attention_interval", 0); }
static void mut_q3n_fsh(mb *m) { mb_u32(m, "qwen3next.expert_shared_feed_forward_length", 0); }
static void mut_q3n_ssm_in(mb *m) { mb_tensor(m, "blk.0.ssm_in.weight", 0, 2, 32, 48, 0); }
static void mut_q3n_conv_shape(mb *m) { mb_tensor(m, "blk.0.ssm_conv1d.weight", 0, 2, 3, 32, 0); }
static void mut_q3n_q_ungated(mb *m) { mb_tensor(m, "blk.1.attn_q.weight", 0, 2, 32, 32, 0); }
static void mut_q3n_no_shexp(mb *m) { mb_tdel(m, "blk.1.ffn_gate_inp_shexp.weight"); }
static void mut_q3n_rope_gt_d(mb *m) { mb_u32(m, "qwen3next.rope.dimension_count", 10); }
static void mut_fused_and_separate(mb *m) { mb_tensor(m, "blk.1.attn_qkv.weight", 0, 2, 32, 64, 0); }
static void mut_q4x_hc_one(mb *m) { mb_u32(m, "qwen4exp.hyper_connection.count", 1); }
static void mut_q4x_hc_missing(mb *m) { mb_del(m, "qwen4exp.hyper_connection.count"); }
static void mut_q4x_hc_lr_zero(mb *m) { mb_u32(m, "qwen4exp.hyper_connection.low_rank", 0); }
static void mut_q4x_idx_heads_zero(mb *m) { mb_u32(m, "qwen4exp.attention.indexer.head_count", 0); }
static void mut_q4x_idx_topk_missing(mb *m) { mb_del(m, "qwen4exp.attention.indexer.top_k"); }
static void mut_q4x_idx_dim_lt_r(mb *m) { mb_u32(m, "qwen4exp.attention.indexer.key_length", 2); }
static void mut_q4x_sections_missing(mb *m) { mb_del(m, "qwen4exp.rope.dimension_sections"); }
static void mut_q4x_sections_three(mb *m) {
    const uint32_t s3[3] = {1, 1, 0};
    mb_arr4(m, "qwen4exp.rope.dimension_sections", G_U32, 3, s3);
}
static void mut_q4x_sections_zero(mb *m) {
    const uint32_t z[4] = {0, 0, 0, 0};
    mb_arr4(m, "qwen4exp.rope.dimension_sections", G_U32, 4, z);
}
static void mut_q4x_sections_negative(mb *m) {
    const int32_t s4[4] = {1, -1, 0, 0};
    mb_arr4(m, "qwen4exp.rope.dimension_sections", G_I32, 4, s4);
}
static void mut_q4x_ratios_len(mb *m) {
    const uint32_t r[3] = {0, 4, 4};
    mb_arr4(m, "qwen4exp.attention.compress_ratios", G_U32, 3, r);
}
static void mut_q4x_ratio_on_gdn(mb *m) {
    const uint32_t r[2] = {4, 4};
    mb_arr4(m, "qwen4exp.attention.compress_ratios", G_U32, 2, r);
}
static void mut_q4x_ple_key_without_layers(mb *m) { mb_del(m, "qwen4exp.ple.layers"); }
static void mut_q4x_ple_table_without_keys(mb *m) {
    static const char *const ple[] = {"ple.layers", "ple.ngram_size", "ple.heads_per_ngram", "ple.conv_kernel",
                                      "ple.eos_token_id", "ple.layer_multipliers", "ple.head_offsets",
                                      "ple.head_vocab_sizes", "embedding_length_per_layer_input"};
    char k[96];
    for (size_t i = 0; i < sizeof ple / sizeof ple[0]; i++) {
        snprintf(k, sizeof k, "qwen4exp.%s", ple[i]);
        mb_del(m, k);
    }
}
static void mut_q4x_ple_two_layers(mb *m) {
    const uint32_t l[2] = {0, 1};
    mb_arr4(m, "qwen4exp.ple.layers", G_U32, 2, l);
}
static void mut_q4x_ple_on_attention(mb *m) {
    const uint32_t l[1] = {1};
    mb_arr4(m, "qwen4exp.ple.layers", G_U32, 1, l);
}
static void mut_q4x_ple_ngram(mb *m) { mb_u32(m, "qwen4exp.ple.ngram_size", 9); }
static void mut_q4x_ple_width(mb *m) { mb_u32(m, "qwen4exp.embedding_length_per_layer_input", 4); }
static void mut_q4x_ple_mult_u32(mb *m) {
    const uint32_t mu[3] = {3, 5, 7};
    mb_arr4(m, "qwen4exp.ple.layer_multipliers", G_U32, 3, mu);
}
static void mut_q4x_ple_mult_short(mb *m) {
    const uint64_t mu[2] = {3, 5};
    mb_arr8(m, "qwen4exp.ple.layer_multipliers", G_U64, 2, mu);
}
static void mut_q4x_ple_vsz_zero(mb *m) {
    const uint64_t v[4] = {5, 5, 0, 5};
    mb_arr8(m, "qwen4exp.ple.head_vocab_sizes", G_U64, 4, v);
}
static void mut_q4x_ple_range_int32(mb *m) {
    const uint64_t o[4] = {0, 5, 10, 2147483645ull};
    mb_arr8(m, "qwen4exp.ple.head_offsets", G_U64, 4, o);
}
static void mut_q4x_ple_table_rows(mb *m) { mb_tensor(m, "per_layer_token_embd.weight", 0, 2, 8, 19, 0); }
static void mut_q4x_ple_eos(mb *m) { mb_u32(m, "qwen4exp.ple.eos_token_id", 8); }
static void mut_q4x_inject_missing(mb *m) { mb_tdel(m, "blk.1.hc_ffn_inject.weight"); }
static void mut_q4x_gamma_shape(mb *m) { mb_tensor(m, "blk.0.hc_attn_norm.weight", 0, 2, 32, 3, 0); }
static void mut_q4x_ssm_ba(mb *m) { mb_tensor(m, "blk.0.ssm_ba.weight", 0, 2, 32, 4, 0); }
static void mut_q4x_idx_k_shape(mb *m) { mb_tensor(m, "blk.1.indexer.k_proj.weight", 0, 2, 32, 16, 0); }
static void mut_q4x_out_hc_missing(mb *m) { mb_tdel(m, "output_hc_up.weight"); }

/* expected substrings are the rule as the spec states it, with the numbers of
 * the base models above (E 32, H 4, Hkv 2, D 8, F 48, 8 tokens, X 4, K 2) */
static const bad_case bad_cases[] = {
    {"missing key", B_LLAMA, mut_missing_key, "required key 'llama.embedding_length' is missing"},
    {"wrong key type", B_LLAMA, mut_wrong_key_type, "'llama.embedding_length': expected UINT32, found FLOAT32"},
    {"missing eps", B_LLAMA, mut_missing_eps, "'llama.attention.layer_norm_rms_epsilon' is missing"},
    {"heads not dividing", B_LLAMA, mut_heads_not_dividing, "expected Hkv to divide H = 4"},
    {"Hkv > H", B_LLAMA, mut_hkv_gt_h, "expected Hkv <= H = 4, found Hkv = 8"},
    {"H = 0", B_LLAMA, mut_h_zero, "'llama.attention.head_count': expected H > 0, found 0"},
    {"Hkv = 0", B_LLAMA, mut_hkv_zero, "'llama.attention.head_count_kv': expected Hkv > 0, found 0"},
    {"per-layer heads differ", B_LLAMA, mut_heads_per_layer_differ, "'llama.attention.head_count'"},
    {"E/H not integral", B_LLAMA, mut_e_over_h,
     "'llama.attention.key_length' is absent, so head dim = n_embd/H: expected n_embd = 32 to be a multiple of H = 5"},
    {"value_length != key_length", B_LLAMA, mut_value_length, "expected value_length == key_length = 8, found 4"},
    {"rope dims > D", B_LLAMA, mut_rope_gt_d, "expected R <= head dim D = 8, found R = 10"},
    {"rope dims odd", B_LLAMA, mut_rope_odd, "expected an even R"},
    {"rope dims != D", B_LLAMA, mut_rope_partial, "expected R == head dim D = 8"},
    {"rope scaling type", B_LLAMA, mut_rope_type, "found \"longrope\""},
    {"K > X", B_QWEN3MOE, mut_k_gt_x, "expected K <= expert_count X = 4, found K = 5"},
    {"K = 0", B_QWEN3MOE, mut_k_zero, "expected 1 <= K <= X = 4, found K = 0"},
    {"X = 0", B_QWEN3MOE, mut_x_zero, "expected X > 0"},
    {"dense llama with K", B_LLAMA, mut_dense_with_k, "'llama.expert_used_count': expected 0 for a dense model"},
    {"unsupported arch", B_LLAMA, mut_unsupported_arch,
     "unsupported architecture 'gpt9' (supported: llama, qwen3, qwen3moe, qwen3next, qwen4exp)"},
    {"missing tensor", B_LLAMA, mut_missing_tensor, "required tensor blk.1.ffn_up.weight is missing"},
    {"missing k_norm", B_QWEN3, mut_missing_qnorm, "required tensor blk.0.attn_k_norm.weight is missing"},
    {"wrong shape", B_LLAMA, mut_wrong_shape, "tensor blk.1.attn_k.weight: expected shape {32, 16}, found {32, 24}"},
    {"embd rows != n_vocab", B_LLAMA, mut_wrong_embd_rows,
     "tensor token_embd.weight: expected shape {32, 8}, found {32, 9}"},
    {"expert shape", B_QWEN3MOE, mut_wrong_expert_shape,
     "tensor blk.1.ffn_down_exps.weight: expected shape {24, 32, 4}, found {24, 32, 3}"},
    {"undecodable type", B_LLAMA, mut_undecodable,
     "tensor blk.0.ffn_gate.weight: expected a type tapdiff can decode, found I32"},
    {"quantized norm", B_LLAMA, mut_norm_quantized, "tensor blk.1.attn_norm.weight: expected type F32, F16 or BF16"},
    {"vocab array type", B_LLAMA, mut_vocab_type,
     "'tokenizer.ggml.tokens': expected ARRAY of STRING, found ARRAY of INT32"},
    {"bos out of range", B_LLAMA, mut_bos_range,
     "'tokenizer.ggml.bos_token_id': expected a token id in [0, n_vocab = 8) or -1 (none), found 8"},
    {"eos negative", B_LLAMA, mut_eos_negative,
     "'tokenizer.ggml.eos_token_id': expected a token id in [0, n_vocab = 8) or -1 (none), found -5"},
    {"scores length", B_LLAMA, mut_scores_len, "'tokenizer.ggml.scores': expected 8 entries"},
    {"scores type", B_LLAMA, mut_scores_type,
     "'tokenizer.ggml.scores': expected ARRAY of FLOAT32, found ARRAY of INT32"},
    {"gpt2 without merges", B_LLAMA, mut_gpt2_no_merges, "'tokenizer.ggml.merges' is missing"},
    {"absurd block count", B_LLAMA, mut_blocks_absurd, "'llama.block_count' = 4000000000"},
    {"ffn bias", B_LLAMA, mut_ffn_bias, "tensor blk.0.ffn_up.bias: expected absent"},
    {"fused and separate qkv", B_LLAMA, mut_fused_and_separate, "tensor blk.1.attn_q.weight: expected absent"},
    {"qwen3next d_k = 0", B_QWEN3NEXT, mut_q3n_state_zero, "'qwen3next.ssm.state_size': expected > 0, found 0"},
    {"qwen3next H_k not dividing H_v", B_QWEN3NEXT, mut_q3n_groups,
     "expected H_k to divide ssm.time_step_rank H_v = 3, found H_k = 2"},
    {"qwen3next inner_size", B_QWEN3NEXT, mut_q3n_inner, "expected H_v * d_k = 2 * 8 = 16"},
    {"qwen3next MTP >= blocks", B_QWEN3NEXT, mut_q3n_nextn,
     "'qwen3next.nextn_predict_layers': expected fewer MTP blocks than block_count = 2, found 2"},
    {"qwen3next recurrent_layers length", B_QWEN3NEXT, mut_q3n_flags_len,
     "'qwen3next.attention.recurrent_layers': expected 2 entries (one per block), found 3"},
    {"qwen3next recurrent MTP block", B_QWEN3NEXT, mut_q3n_flag_mtp, "entry 2: expected 0 (block 2 is an MTP block"},
    {"qwen3next interval 0", B_QWEN3NEXT, mut_q3n_interval, "'qwen3next.full_attention_interval': expected > 0"},
    {"qwen3next F_sh = 0", B_QWEN3NEXT, mut_q3n_fsh, "expected F_sh > 0"},
    {"qwen3next legacy ssm_in", B_QWEN3NEXT, mut_q3n_ssm_in, "tensor blk.0.ssm_in.weight: expected absent"},
    {"qwen3next conv taps", B_QWEN3NEXT, mut_q3n_conv_shape,
     "tensor blk.0.ssm_conv1d.weight: expected shape {4, 32}, found {3, 32}"},
    {"qwen3next attn_q without gate rows", B_QWEN3NEXT, mut_q3n_q_ungated,
     "tensor blk.1.attn_q.weight: expected shape {32, 64}, found {32, 32}"},
    {"qwen3next shared-expert gate missing", B_QWEN3NEXT, mut_q3n_no_shexp,
     "required tensor blk.1.ffn_gate_inp_shexp.weight is missing"},
    {"qwen3next rope dims > D", B_QWEN3NEXT, mut_q3n_rope_gt_d, "expected R <= head dim D = 8, found R = 10"},
    {"qwen4exp hc = 1", B_QWEN4EXP, mut_q4x_hc_one, "'qwen4exp.hyper_connection.count': expected hc > 1"},
    {"qwen4exp hc missing", B_QWEN4EXP, mut_q4x_hc_missing,
     "required key 'qwen4exp.hyper_connection.count' is missing"},
    {"qwen4exp hc low rank 0", B_QWEN4EXP, mut_q4x_hc_lr_zero,
     "'qwen4exp.hyper_connection.low_rank': expected > 0, found 0"},
    {"qwen4exp indexer heads 0", B_QWEN4EXP, mut_q4x_idx_heads_zero,
     "'qwen4exp.attention.indexer.head_count': expected > 0, found 0"},
    {"qwen4exp indexer top_k missing", B_QWEN4EXP, mut_q4x_idx_topk_missing,
     "required key 'qwen4exp.attention.indexer.top_k' is missing"},
    {"qwen4exp indexer d_i < R", B_QWEN4EXP, mut_q4x_idx_dim_lt_r,
     "expected d_i >= rope.dimension_count R = 4 (the indexer rotates the first R dims of each head), found 2"},
    {"qwen4exp sections missing", B_QWEN4EXP, mut_q4x_sections_missing,
     "required key 'qwen4exp.rope.dimension_sections' is missing"},
    {"qwen4exp sections count", B_QWEN4EXP, mut_q4x_sections_three, "expected 4 IMROPE sections, found 3 entries"},
    {"qwen4exp sections sum 0", B_QWEN4EXP, mut_q4x_sections_zero, "expected sections with a sum > 0"},
    {"qwen4exp section negative", B_QWEN4EXP, mut_q4x_sections_negative,
     "entry 1: expected a section in [0, 65535], found -1"},
    {"qwen4exp ratios length", B_QWEN4EXP, mut_q4x_ratios_len,
     "'qwen4exp.attention.compress_ratios': expected 2 entries (one per block), found 3"},
    {"qwen4exp ratio on a GDN layer", B_QWEN4EXP, mut_q4x_ratio_on_gdn,
     "entry 0: expected 0 (block 0 is a GDN layer, it has no attention to make sparse), found 4"},
    {"qwen4exp PLE key without ple.layers", B_QWEN4EXP, mut_q4x_ple_key_without_layers,
     "key 'qwen4exp.ple.ngram_size': expected absent (PLE is all-or-nothing"},
    {"qwen4exp PLE table without keys", B_QWEN4EXP, mut_q4x_ple_table_without_keys,
     "tensor per_layer_token_embd.weight: expected absent, found present (a PLE table without the ple.* keys"},
    {"qwen4exp two PLE layers", B_QWEN4EXP, mut_q4x_ple_two_layers, "expected exactly one PLE layer, found 2 entries"},
    {"qwen4exp PLE on attention", B_QWEN4EXP, mut_q4x_ple_on_attention,
     "expected a GDN layer (the PLE conv history lives in the recurrent state), found block 1"},
    {"qwen4exp n-gram size", B_QWEN4EXP, mut_q4x_ple_ngram, "'qwen4exp.ple.ngram_size': expected n_g in [2, 8], found 9"},
    {"qwen4exp PLE widths vs n_embd", B_QWEN4EXP, mut_q4x_ple_width,
     "expected n_p * d_p = n_embd = 32 (the PLE projections take an n_embd-wide input), found 4 * 4 = 16"},
    {"qwen4exp multipliers 32-bit", B_QWEN4EXP, mut_q4x_ple_mult_u32,
     "'qwen4exp.ple.layer_multipliers': expected an ARRAY of UINT64 (the hash constants need 64 bits), found ARRAY "
     "of UINT32"},
    {"qwen4exp multipliers short", B_QWEN4EXP, mut_q4x_ple_mult_short,
     "'qwen4exp.ple.layer_multipliers': expected at least 3 entries (one multiplier per n-gram position), found 2"},
    {"qwen4exp head vocab 0", B_QWEN4EXP, mut_q4x_ple_vsz_zero,
     "'qwen4exp.ple.head_vocab_sizes': entry 2: expected V_h > 0, found 0"},
    {"qwen4exp head range past int32", B_QWEN4EXP, mut_q4x_ple_range_int32,
     "head 3: expected O_h + V_h <= 2147483647 (an int32 row index), found 2147483645 + 5"},
    {"qwen4exp PLE table rows", B_QWEN4EXP, mut_q4x_ple_table_rows,
     "tensor per_layer_token_embd.weight: expected at least max_h(O_h + V_h) = 20 rows, found 19"},
    {"qwen4exp PLE eos out of range", B_QWEN4EXP, mut_q4x_ple_eos,
     "'qwen4exp.ple.eos_token_id': expected a token id < n_vocab = 8, found 8"},
    {"qwen4exp inject missing", B_QWEN4EXP, mut_q4x_inject_missing,
     "required tensor blk.1.hc_ffn_inject.weight is missing"},
    {"qwen4exp gamma shape", B_QWEN4EXP, mut_q4x_gamma_shape,
     "tensor blk.0.hc_attn_norm.weight: expected shape {32, 2}, found {32, 3}"},
    {"qwen4exp interleaved ssm_ba", B_QWEN4EXP, mut_q4x_ssm_ba, "tensor blk.0.ssm_ba.weight: expected absent"},
    {"qwen4exp indexer k_proj shape", B_QWEN4EXP, mut_q4x_idx_k_shape,
     "tensor blk.1.indexer.k_proj.weight: expected shape {32, 8}, found {32, 16}"},
    {"qwen4exp final HC mixer missing", B_QWEN4EXP, mut_q4x_out_hc_missing,
     "required tensor output_hc_up.weight is missing"},
};

#define N_BAD (sizeof bad_cases / sizeof bad_cases[0])

/* Parameters are indices: Criterion runs each in a re-executed worker, where
 * pointers into this process's data (names, mutators) would not be valid. */
ParameterizedTestParameters(model_bad, rejects) {
    static int idx[N_BAD];
    for (size_t i = 0; i < N_BAD; i++) idx[i] = (int)i;
    return cr_make_param_array(int, idx, N_BAD);
}

ParameterizedTest(int *ip, model_bad, rejects) {
    cr_assert(*ip >= 0 && (size_t)*ip < N_BAD);
    const bad_case *bc = &bad_cases[*ip];
    const cfg *base = bc->base == B_QWEN3 ? &QWEN3 : bc->base == B_QWEN3MOE ? &QWEN3MOE : &LLAMA;
    mb *b = bc->base == B_QWEN3NEXT ? build_qwen3next() : bc->base == B_QWEN4EXP ? build_qwen4exp() : build(base);
    bc->mutate(b);
    char path[64];
    tmp_path(path, sizeof path, "bad");
    mb_write(b, path);
    mb_free(b);

    td_model *m = NULL;
    td_err err = {{0}};
    int st = td_model_open(&m, path, &err);
    cr_log_info("[%s] %s", bc->name, err.msg); /* shown with --verbose */
    cr_expect_eq(st, TD_EINPUT, "[%s] expected TD_EINPUT, got %d (%s)", bc->name, st, err.msg);
    cr_expect_null(m, "[%s] no model on failure", bc->name);
    cr_expect(strstr(err.msg, bc->expect), "[%s] message lacks [%s]: %s", bc->name, bc->expect, err.msg);
    cr_expect(strstr(err.msg, path), "[%s] message does not name the file: %s", bc->name, err.msg);
    cr_expect(!strchr(err.msg, '\n'), "[%s] message is not one line", bc->name);
    if (m) td_model_close(m);

    proc p = run_inspect(path, NULL);
    cr_expect(WIFEXITED(p.status), "[%s] tapdiff inspect died by a signal", bc->name);
    cr_expect_eq(WEXITSTATUS(p.status), 3, "[%s] inspect exit %d, stderr: %s", bc->name, WEXITSTATUS(p.status), p.err);
    cr_expect(strstr(p.err, bc->expect), "[%s] inspect stderr lacks [%s]: %s", bc->name, bc->expect, p.err);
    /* the container still goes out before the error */
    cr_expect(strstr(p.out, "n_tensors: "), "[%s] inspect printed no container info", bc->name);
    proc_free(&p);
    // TD_KEEP_MALFORMED=DIR keeps each file as DIR/<case>.gguf (the peer's cross-check in test_llamacpp)
    const char *keep = getenv("TD_KEEP_MALFORMED");
    if (keep && *keep) {
        char dst[512];
        int n = snprintf(dst, sizeof dst, "%s/", keep);
        for (const char *c = bc->name; *c && n < (int)sizeof dst - 6; c++)
            dst[n++] = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ? *c : '_';
        snprintf(dst + n, sizeof dst - (size_t)n, ".gguf");
        cr_expect_eq(rename(path, dst), 0, "[%s] keep as %s", bc->name, dst);
        if (bc->base == B_QWEN4EXP) { // and the unmutated file once, for the cross-check's control
            snprintf(dst, sizeof dst, "%s/base_qwen4exp.gguf", keep);
            mb *g = build_qwen4exp();
            mb_write(g, dst);
            mb_free(g);
        }
    }
    unlink(path);
}
