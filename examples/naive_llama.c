/* naive_llama: a small standalone llama forward (F32 GGUF models such as
 * stories260K), written plainly to show how an engine is instrumented with
 * tapdiff's installed tap library and run as an external arm:
 *
 *   cc naive_llama.c -o naive_llama $(pkg-config --cflags --libs tapdiff-taps) -lm
 *   tapdiff bisect --model stories260K.gguf --a ref --b exec:./naive_llama --tokens 1,403,407
 *
 * It knows nothing of tapdiff but <tapdiff/tap.h>: it reads the GGUF file
 * itself, and takes its job from the environment (the external-arm contract,
 * README "Bring your own engine"):
 *   TAPDIFF_MODEL   GGUF file          TAPDIFF_PROMPT  prompt ids "1,2,3"
 *   TAPDIFF_STEPS   decode steps       TAPDIFF_PINNED  file of decode ids (else greedy)
 *   TAPDIFF_TAPS    tap file to write  (and TAPDIFF_TAP_MODE/FILTER/DECODE, read by the library)
 * The instrumentation is the td_tap_* lines; with TAPDIFF_TAPS unset each
 * costs one branch.
 *
 * Built with -DNAIVE_LLAMA_BUG it has a planted bug: decode steps rotate K
 * with the position after the right one, so bisect must name
 * blk.0.attn_k_rope at step 1 (the first decode step). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tapdiff/tap.h>

#define MAX_TOKENS 4096

static void die(const char *what, const char *detail) {
    fprintf(stderr, "naive_llama: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
    exit(3);
}

/* ------------------------------------------------------------------ GGUF */

typedef struct tensor {
    char name[96];
    uint32_t type; // 0 = F32, the only type this engine reads
    uint64_t ne[4];
    uint64_t offset;
} tensor;

typedef struct gguf {
    unsigned char *buf;
    size_t size, pos;
    uint64_t n_tensors;
    tensor *t;
    unsigned char *data;
    // hyper-parameters
    uint32_t E, L, F, H, Hkv, V;
    float eps, rope_base;
} gguf;

static void need(gguf *g, size_t n) {
    if (g->pos + n > g->size) die("GGUF file is truncated", NULL);
}
static uint64_t rd_u(gguf *g, int bytes) {
    need(g, (size_t)bytes);
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++) v |= (uint64_t)g->buf[g->pos + (size_t)i] << (8 * i);
    g->pos += (size_t)bytes;
    return v;
}
static void rd_str(gguf *g, char *out, size_t cap) {
    uint64_t n = rd_u(g, 8);
    need(g, n);
    if (out) snprintf(out, cap, "%.*s", (int)(n < cap ? n : cap - 1), (const char *)g->buf + g->pos);
    g->pos += n;
}
static const int type_bytes[13] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8}; // by GGUF value type; 8 = string
// Reads one value of type `ty`; returns it as a double when numeric.
static double rd_val(gguf *g, uint32_t ty) {
    if (ty == 8) {
        rd_str(g, NULL, 0);
        return 0;
    }
    if (ty == 9) {
        uint32_t ety = (uint32_t)rd_u(g, 4);
        uint64_t n = rd_u(g, 8);
        for (uint64_t i = 0; i < n; i++) rd_val(g, ety);
        return 0;
    }
    if (ty > 12) die("GGUF metadata has an unknown value type", NULL);
    uint64_t raw = rd_u(g, type_bytes[ty]);
    switch (ty) {
    case 1: return (int8_t)raw;
    case 3: return (int16_t)raw;
    case 5: return (int32_t)raw;
    case 11: return (double)(int64_t)raw;
    case 6: {
        uint32_t u = (uint32_t)raw;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    case 12: {
        double d;
        memcpy(&d, &raw, 8);
        return d;
    }
    default: return (double)raw;
    }
}

static void gguf_load(gguf *g, const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) die("cannot open the model", path);
    fseek(f, 0, SEEK_END);
    g->size = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    g->buf = malloc(g->size);
    if (!g->buf || fread(g->buf, 1, g->size, f) != g->size) die("cannot read the model", path);
    fclose(f);
    if (g->size < 4 || memcmp(g->buf, "GGUF", 4)) die("not a GGUF file", path);
    g->pos = 4;
    uint32_t version = (uint32_t)rd_u(g, 4);
    if (version < 2) die("GGUF version 1 is not supported", NULL);
    g->n_tensors = rd_u(g, 8);
    uint64_t n_kv = rd_u(g, 8);
    uint64_t align = 32;
    g->eps = 1e-5f;
    g->rope_base = 10000.0f;
    char arch[32] = "";
    for (uint64_t i = 0; i < n_kv; i++) {
        char key[128];
        rd_str(g, key, sizeof key);
        uint32_t ty = (uint32_t)rd_u(g, 4);
        if (!strcmp(key, "general.architecture")) {
            rd_str(g, arch, sizeof arch);
            continue;
        }
        if (!strcmp(key, "tokenizer.ggml.tokens")) { // n_vocab = the number of tokens
            uint32_t ety = (uint32_t)rd_u(g, 4);
            uint64_t n = rd_u(g, 8);
            for (uint64_t k = 0; k < n; k++) rd_val(g, ety);
            g->V = (uint32_t)n;
            continue;
        }
        double v = rd_val(g, ty);
        if (!strcmp(key, "general.alignment")) align = (uint64_t)v;
        else if (!strcmp(key, "llama.embedding_length")) g->E = (uint32_t)v;
        else if (!strcmp(key, "llama.block_count")) g->L = (uint32_t)v;
        else if (!strcmp(key, "llama.feed_forward_length")) g->F = (uint32_t)v;
        else if (!strcmp(key, "llama.attention.head_count")) g->H = (uint32_t)v;
        else if (!strcmp(key, "llama.attention.head_count_kv")) g->Hkv = (uint32_t)v;
        else if (!strcmp(key, "llama.attention.layer_norm_rms_epsilon")) g->eps = (float)v;
        else if (!strcmp(key, "llama.rope.freq_base")) g->rope_base = (float)v;
    }
    if (strcmp(arch, "llama")) die("not a llama model", arch);
    if (!g->Hkv) g->Hkv = g->H;
    if (!g->E || !g->L || !g->F || !g->H || !g->V || g->E % g->H || g->H % g->Hkv)
        die("missing or inconsistent llama hyper-parameters", NULL);
    g->t = calloc(g->n_tensors, sizeof *g->t);
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        tensor *t = &g->t[i];
        rd_str(g, t->name, sizeof t->name);
        uint32_t nd = (uint32_t)rd_u(g, 4);
        if (nd > 4) die("tensor with more than 4 dimensions", t->name);
        for (uint32_t d = 0; d < 4; d++) t->ne[d] = d < nd ? rd_u(g, 8) : 1;
        t->type = (uint32_t)rd_u(g, 4);
        t->offset = rd_u(g, 8);
    }
    size_t data = (g->pos + align - 1) / align * align;
    if (data > g->size) die("GGUF file is truncated", NULL);
    g->data = g->buf + data;
}

// The F32 tensor `name` with (ne0, ne1) = (n_in, n_out): row r = output r.
static const float *weight(const gguf *g, const char *name, uint64_t n_in, uint64_t n_out) {
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const tensor *t = &g->t[i];
        if (strcmp(t->name, name)) continue;
        if (t->type != 0) die("only F32 tensors are supported", name);
        if (t->ne[0] != n_in || t->ne[1] != n_out) die("unexpected tensor shape", name);
        if ((size_t)(g->data - g->buf) + t->offset + n_in * n_out * 4 > g->size) die("tensor data out of file", name);
        return (const float *)(g->data + t->offset);
    }
    die("missing tensor", name);
    return NULL;
}

/* ----------------------------------------------------------------- model */

typedef struct layer {
    const float *attn_norm, *wq, *wk, *wv, *wo, *ffn_norm, *gate, *up, *down;
} layer;

typedef struct model {
    gguf g;
    uint32_t E, L, F, H, Hkv, D, V;
    const float *tok_embd, *out_norm, *output;
    layer *l;
    float *kcache, *vcache; // (L, MAX_TOKENS, Hkv*D)
} model;

static void model_load(model *m, const char *path) {
    gguf_load(&m->g, path);
    const gguf *g = &m->g;
    m->E = g->E, m->L = g->L, m->F = g->F, m->H = g->H, m->Hkv = g->Hkv, m->V = g->V, m->D = g->E / g->H;
    m->tok_embd = weight(g, "token_embd.weight", m->E, m->V);
    m->out_norm = weight(g, "output_norm.weight", m->E, 1);
    int tied = 1;
    for (uint64_t i = 0; i < g->n_tensors; i++) tied &= strcmp(g->t[i].name, "output.weight") != 0;
    m->output = tied ? m->tok_embd : weight(g, "output.weight", m->E, m->V);
    m->l = calloc(m->L, sizeof *m->l);
    for (uint32_t i = 0; i < m->L; i++) {
        char n[96];
        layer *y = &m->l[i];
#define W(field, suffix, nin, nout) (snprintf(n, sizeof n, "blk.%u.%s.weight", i, suffix), y->field = weight(g, n, nin, nout))
        W(attn_norm, "attn_norm", m->E, 1);
        W(wq, "attn_q", m->E, m->H * m->D);
        W(wk, "attn_k", m->E, m->Hkv * m->D);
        W(wv, "attn_v", m->E, m->Hkv * m->D);
        W(wo, "attn_output", m->H * m->D, m->E);
        W(ffn_norm, "ffn_norm", m->E, 1);
        W(gate, "ffn_gate", m->E, m->F);
        W(up, "ffn_up", m->E, m->F);
        W(down, "ffn_down", m->F, m->E);
#undef W
    }
    size_t kv = (size_t)m->L * MAX_TOKENS * m->Hkv * m->D;
    m->kcache = calloc(kv, sizeof(float));
    m->vcache = calloc(kv, sizeof(float));
}

static void model_free(model *m) {
    free(m->kcache);
    free(m->vcache);
    free(m->l);
    free(m->g.t);
    free(m->g.buf);
}

/* ------------------------------------------------------------------- ops */

// out[t][o] = sum_i w[o][i] x[t][i]
static void matmul(float *out, const float *x, const float *w, int T, int n_in, int n_out) {
    for (int t = 0; t < T; t++)
        for (int o = 0; o < n_out; o++) {
            float s = 0;
            for (int i = 0; i < n_in; i++) s += w[(size_t)o * n_in + i] * x[(size_t)t * n_in + i];
            out[(size_t)t * n_out + o] = s;
        }
}

static void rmsnorm(float *out, const float *x, const float *w, int T, int n, float eps) {
    for (int t = 0; t < T; t++) {
        float ss = 0;
        for (int i = 0; i < n; i++) ss += x[t * n + i] * x[t * n + i];
        float r = 1.0f / sqrtf(ss / (float)n + eps);
        for (int i = 0; i < n; i++) out[t * n + i] = x[t * n + i] * r * w[i];
    }
}

// Adjacent pairs (x[2i], x[2i+1]) of each head, angle p * base^(-2i/D).
static void rope(float *x, const int32_t *pos, int T, int heads, int D, float base, int pos_shift) {
    for (int t = 0; t < T; t++)
        for (int h = 0; h < heads; h++)
            for (int i = 0; i < D / 2; i++) {
                double theta = (double)(pos[t] + pos_shift) * pow((double)base, -2.0 * i / D);
                float c = (float)cos(theta), s = (float)sin(theta);
                float *p = x + ((size_t)t * heads + h) * D + 2 * i;
                float a = p[0], b = p[1];
                p[0] = a * c - b * s;
                p[1] = a * s + b * c;
            }
}

/* --------------------------------------------------------------- forward */

// One forward over T tokens at positions pos[]; last-row logits to `logits`.
static void forward(model *m, td_tap_sink *sink, const int32_t *tok, const int32_t *pos, int T, float *logits) {
    const int E = (int)m->E, H = (int)m->H, G = (int)m->Hkv, D = (int)m->D, F = (int)m->F, V = (int)m->V;
    float *x = malloc(sizeof(float) * T * E), *xn = malloc(sizeof(float) * T * E);
    float *q = malloc(sizeof(float) * T * H * D), *k = malloc(sizeof(float) * T * G * D);
    float *v = malloc(sizeof(float) * T * G * D), *ctx = malloc(sizeof(float) * T * H * D);
    float *att = malloc(sizeof(float) * T * E), *g = malloc(sizeof(float) * T * F), *u = malloc(sizeof(float) * T * F);
    float *act = malloc(sizeof(float) * T * F), *y = malloc(sizeof(float) * T * E);
    float *lg = malloc(sizeof(float) * (size_t)T * V), *sc = malloc(sizeof(float) * MAX_TOKENS);
    const int64_t sE[2] = {T, E}, sQ[2] = {T, H * D}, sK[2] = {T, G * D}, sF[2] = {T, F}, sV[2] = {T, V};

    td_tap_step_begin_tokens(sink, tok, pos, T, NULL); // also emits inp.tokens and inp.pos
    for (int t = 0; t < T; t++) memcpy(x + t * E, m->tok_embd + (size_t)tok[t] * E, sizeof(float) * E);
    TD_TAP(sink, -1, "inp.embd", TD_DT_F32, x, 2, sE);
    for (int l = 0; l < (int)m->L; l++) {
        const layer *w = &m->l[l];
        rmsnorm(xn, x, w->attn_norm, T, E, m->g.eps);
        TD_TAP(sink, l, "attn_norm", TD_DT_F32, xn, 2, sE);
        matmul(q, xn, w->wq, T, E, H * D);
        matmul(k, xn, w->wk, T, E, G * D);
        matmul(v, xn, w->wv, T, E, G * D);
        TD_TAP(sink, l, "attn_q", TD_DT_F32, q, 2, sQ);
        TD_TAP(sink, l, "attn_k", TD_DT_F32, k, 2, sK);
        TD_TAP(sink, l, "attn_v", TD_DT_F32, v, 2, sK);
        rope(q, pos, T, H, D, m->g.rope_base, 0);
#ifdef NAIVE_LLAMA_BUG
        rope(k, pos, T, G, D, m->g.rope_base, pos[0] > 0); // the planted bug: decode K one position late
#else
        rope(k, pos, T, G, D, m->g.rope_base, 0);
#endif
        TD_TAP(sink, l, "attn_q_rope", TD_DT_F32, q, 2, sQ);
        TD_TAP(sink, l, "attn_k_rope", TD_DT_F32, k, 2, sK);
        float *kc = m->kcache + (size_t)l * MAX_TOKENS * G * D, *vc = m->vcache + (size_t)l * MAX_TOKENS * G * D;
        for (int t = 0; t < T; t++) {
            memcpy(kc + (size_t)pos[t] * G * D, k + t * G * D, sizeof(float) * G * D);
            memcpy(vc + (size_t)pos[t] * G * D, v + t * G * D, sizeof(float) * G * D);
        }
        for (int t = 0; t < T; t++)
            for (int h = 0; h < H; h++) {
                int kh = h / (H / G);
                const float *qh = q + (t * H + h) * D;
                float mx = -INFINITY, sum = 0;
                for (int p = 0; p <= pos[t]; p++) {
                    float s = 0;
                    for (int d = 0; d < D; d++) s += qh[d] * kc[((size_t)p * G + kh) * D + d];
                    sc[p] = s / sqrtf((float)D);
                    mx = sc[p] > mx ? sc[p] : mx;
                }
                for (int p = 0; p <= pos[t]; p++) sum += (sc[p] = expf(sc[p] - mx));
                float *o = ctx + (t * H + h) * D;
                for (int d = 0; d < D; d++) o[d] = 0;
                for (int p = 0; p <= pos[t]; p++)
                    for (int d = 0; d < D; d++) o[d] += sc[p] / sum * vc[((size_t)p * G + kh) * D + d];
            }
        TD_TAP(sink, l, "attn_ctx", TD_DT_F32, ctx, 2, sQ);
        matmul(att, ctx, w->wo, T, H * D, E);
        TD_TAP(sink, l, "attn_out", TD_DT_F32, att, 2, sE);
        for (int i = 0; i < T * E; i++) x[i] += att[i];
        TD_TAP(sink, l, "ffn_inp", TD_DT_F32, x, 2, sE);
        rmsnorm(xn, x, w->ffn_norm, T, E, m->g.eps);
        TD_TAP(sink, l, "ffn_norm", TD_DT_F32, xn, 2, sE);
        matmul(g, xn, w->gate, T, E, F);
        matmul(u, xn, w->up, T, E, F);
        TD_TAP(sink, l, "ffn_gate", TD_DT_F32, g, 2, sF);
        TD_TAP(sink, l, "ffn_up", TD_DT_F32, u, 2, sF);
        for (int i = 0; i < T * F; i++) act[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
        TD_TAP(sink, l, "ffn_act", TD_DT_F32, act, 2, sF);
        matmul(y, act, w->down, T, F, E);
        TD_TAP(sink, l, "ffn_out", TD_DT_F32, y, 2, sE);
        for (int i = 0; i < T * E; i++) x[i] += y[i];
        TD_TAP(sink, l, "out", TD_DT_F32, x, 2, sE);
    }
    rmsnorm(xn, x, m->out_norm, T, E, m->g.eps);
    TD_TAP(sink, -1, "out.norm", TD_DT_F32, xn, 2, sE);
    matmul(lg, xn, m->output, T, E, V);
    TD_TAP(sink, -1, "out.logits", TD_DT_F32, lg, 2, sV);
    memcpy(logits, lg + (size_t)(T - 1) * V, sizeof(float) * V);
    td_err err;
    if (td_tap_step_end(sink, &err)) die("tap file", err.msg); // the library also emitted hist.tokens
    free(x), free(xn), free(q), free(k), free(v), free(ctx), free(att), free(g), free(u), free(act), free(y);
    free(lg), free(sc);
}

/* ------------------------------------------------------------------ main */

// "1,2 3" -> ids; returns the count.
static int parse_ids(const char *s, int32_t *ids, int cap, const char *what) {
    int n = 0;
    while (*s) {
        if (*s == ',' || *s == ' ' || *s == '\n' || *s == '\t' || *s == '\r') {
            s++;
            continue;
        }
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 0 || n >= cap) die("bad token list", what);
        ids[n++] = (int32_t)v;
        s = end;
    }
    return n;
}

int main(void) {
    const char *model_path = getenv("TAPDIFF_MODEL"), *prompt_s = getenv("TAPDIFF_PROMPT");
    const char *steps_s = getenv("TAPDIFF_STEPS"), *pinned_path = getenv("TAPDIFF_PINNED");
    if (!model_path || !prompt_s) die("set TAPDIFF_MODEL and TAPDIFF_PROMPT (see the top of naive_llama.c)", NULL);
    int n_steps = steps_s ? atoi(steps_s) : 16;
    static int32_t prompt[MAX_TOKENS], pinned[MAX_TOKENS];
    int n_prompt = parse_ids(prompt_s, prompt, MAX_TOKENS, "TAPDIFF_PROMPT"), n_pinned = -1;
    if (pinned_path && *pinned_path) {
        FILE *f = fopen(pinned_path, "r");
        if (!f) die("cannot open TAPDIFF_PINNED", pinned_path);
        static char text[1 << 16];
        size_t n = fread(text, 1, sizeof text - 1, f);
        fclose(f);
        text[n] = '\0';
        n_pinned = parse_ids(text, pinned, MAX_TOKENS, "TAPDIFF_PINNED");
        if (n_pinned < n_steps) die("TAPDIFF_PINNED holds fewer ids than TAPDIFF_STEPS", pinned_path);
    }
    if (n_prompt < 1 || n_prompt + n_steps > MAX_TOKENS) die("prompt empty or too long", NULL);

    model m;
    memset(&m, 0, sizeof m);
    model_load(&m, model_path);
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] >= (int32_t)m.V) die("prompt token out of the vocabulary", prompt_s);

    td_err err;
    td_tap_sink *sink = NULL; // NULL: taps off
    if (td_tap_sink_open_env(&sink, NULL, &err) ||
        td_tap_sink_provenance(sink, model_path, "llama", "naive_llama", "1", "f32", &err))
        die("tap file", err.msg);

    float *logits = malloc(sizeof(float) * m.V);
    int32_t pos[MAX_TOKENS];
    for (int i = 0; i < n_prompt; i++) pos[i] = i;
    forward(&m, sink, prompt, pos, n_prompt, logits);
    int32_t p = n_prompt;
    for (int s = 0; s < n_steps; s++) {
        int32_t best = 0;
        for (int32_t i = 1; i < (int32_t)m.V; i++)
            if (logits[i] > logits[best]) best = i;
        int32_t next = n_pinned >= 0 ? pinned[s] : best;
        printf("%d%s", best, s + 1 < n_steps ? " " : "\n");
        forward(&m, sink, &next, &p, 1, logits);
        p++;
    }
    if (td_tap_sink_close(sink, &err)) die("tap file", err.msg);
    free(logits);
    model_free(&m);
    return 0;
}
