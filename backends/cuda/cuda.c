/* tapdiff "cuda": the host side of the CUDA forward (cuda.h). The math and
 * the taps are the reference's (reference/reference_impl.h order, f32); the
 * device work is behind cuda_dev.h. Shapes in comments are row-major,
 * outermost first: (T, E) = T rows of E. */
#include "cuda.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_dev.h"
#include "cuda_launch.h"
#include "faults.h"
#include "forward.h"
#include "td_config.h"
#include "types.h"

#define NAME "cuda"

typedef struct cu_layer {
    float *attn_norm, *ffn_norm, *q_norm, *k_norm, *bq, *bk, *bv, *bo; /* device f32 vectors */
    const void *wq, *wk, *wv, *wqkv, *wo, *gate, *up, *down, *gate_inp, *gate_exps, *up_exps, *down_exps;
} cu_layer;

typedef struct cu_upload {
    const td_tensor *t;
    void *d;
} cu_upload;

typedef struct cuda_backend {
    td_backend base;
    const td_model *m;
    td_hparams hp;
    int64_t n_ctx, n_past, cap_T;
    int n_fwd;
    td_fault fault;
    unsigned bugs; /* TD_CUDA_BUG_* of the injected fault */
    td_hist hist;
    cu_layer *layers;
    const void *embd, *output;
    float *out_norm;
    float **k_cache, **v_cache; /* per layer (n_ctx, Hkv*D) */
    /* every device allocation, freed at close; uploads are also looked up by tensor */
    void **allocs;
    size_t n_allocs, cap_allocs;
    cu_upload *ups;
    size_t n_ups;
    /* device activations for cap_T tokens */
    float *x, *xn, *q, *k, *v, *ctx, *proj, *gate, *up, *act, *logits, *moe_logits, *moe_probs, *moe_w, *ys, *rc,
        *rs;
    int32_t *topk, *tokens;
    void *fp_scratch;
    /* host scratch */
    float *h_rc, *h_rs, *h_logits, *rope_ff, *h_tap;
    size_t h_tap_cap;
    int32_t *h_pos;
    int dev_failed; /* a device call failed during the step */
    char dev_why[256];
    char version[512];
} cuda_backend;

/* ===================================================================== */
/* Device memory                                                          */
/* ===================================================================== */

static void *dalloc(cuda_backend *b, size_t bytes) {
    void *p = td_cuda_alloc(bytes);
    if (!p) return NULL;
    if (b->n_allocs == b->cap_allocs) {
        b->cap_allocs = b->cap_allocs ? 2 * b->cap_allocs : 64;
        b->allocs = td_xrealloc(b->allocs, b->cap_allocs * sizeof *b->allocs);
    }
    b->allocs[b->n_allocs++] = p;
    return p;
}

static void dfree(cuda_backend *b, void *p) {
    if (!p) return;
    for (size_t i = 0; i < b->n_allocs; i++)
        if (b->allocs[i] == p) {
            td_cuda_free(p);
            b->allocs[i] = b->allocs[--b->n_allocs];
            return;
        }
}

/* the tensor's stored bytes on the device (once per tensor: output may be token_embd) */
static int upload_matrix(cuda_backend *b, const void **out, const td_tensor *t, const char *what, int l, int64_t n_in,
                         int64_t n_rows, td_err *err) {
    *out = NULL;
    if (!t) return TD_OK;
    int rc = td_fwd_check_matrix(NAME, t, what, l, n_in, n_rows, err);
    if (rc) return rc;
    int64_t cv, cb;
    if (!td_cuda_type_chunk(t->type, &cv, &cb))
        return td_err_set(err, TD_EINPUT, NAME ": tensor %s has type %s, which the device kernels do not decode",
                          t->cname, td_type_name(t->type));
    for (size_t i = 0; i < b->n_ups; i++)
        if (b->ups[i].t == t) {
            *out = b->ups[i].d;
            return TD_OK;
        }
    void *d = dalloc(b, t->nbytes);
    if (!d || td_cuda_h2d(d, t->data, t->nbytes))
        return td_err_set(err, TD_EINTERNAL, NAME ": could not copy %s (%zu bytes) to the device", t->cname, t->nbytes);
    b->ups = td_xrealloc(b->ups, (b->n_ups + 1) * sizeof *b->ups);
    b->ups[b->n_ups++] = (cu_upload){t, d};
    *out = d;
    return TD_OK;
}

/* n values from element `off` of a vector tensor, as f32 on the device */
static int upload_vec(cuda_backend *b, float **out, const td_tensor *t, const char *what, int l, int64_t off,
                      int64_t n, td_err *err) {
    *out = NULL;
    if (!t) return TD_OK;
    if ((int64_t)t->n_elements < off + n)
        return td_err_set(err, TD_EINPUT, NAME ": tensor %s (%s, layer %d): %llu values, expected at least %lld",
                          t->cname, what, l, (unsigned long long)t->n_elements, (long long)(off + n));
    float *h = td_xcalloc((size_t)(off + n), sizeof *h);
    int rc = td_decode_row_f32(t->type, t->data, h, off + n, err);
    if (!rc) {
        *out = dalloc(b, (size_t)n * sizeof(float));
        if (!*out || td_cuda_h2d(*out, h + off, (size_t)n * sizeof(float)))
            rc = td_err_set(err, TD_EINTERNAL, NAME ": could not copy %s to the device", t->cname);
    }
    free(h);
    return rc;
}

static void acts_free(cuda_backend *b) {
    float **f[] = {&b->x,  &b->xn,     &b->q,         &b->k,         &b->v,     &b->ctx, &b->proj, &b->gate, &b->up,
                   &b->act, &b->logits, &b->moe_logits, &b->moe_probs, &b->moe_w, &b->ys,  &b->rc,   &b->rs};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) dfree(b, *f[i]), *f[i] = NULL;
    dfree(b, b->topk), dfree(b, b->tokens);
    b->topk = b->tokens = NULL;
    free(b->h_rc), free(b->h_rs), free(b->h_logits), free(b->h_pos);
    b->h_rc = b->h_rs = b->h_logits = NULL, b->h_pos = NULL;
    b->cap_T = 0;
}

static int acts_ensure(cuda_backend *b, int64_t T, td_err *err) {
    if (T <= b->cap_T) return TD_OK;
    acts_free(b);
    const td_hparams *hp = &b->hp;
    const size_t n = (size_t)T, E = hp->n_embd, HD = (size_t)hp->n_head * hp->head_dim;
    const size_t KD = (size_t)hp->n_head_kv * hp->head_dim, F = hp->n_ff, X = hp->n_expert, K = hp->n_expert_used;
    const size_t V = hp->n_vocab, half = hp->rope_dims / 2 + 1, rows = X ? n * K : n, fs = sizeof(float);
    int ok = (b->x = dalloc(b, n * E * fs)) && (b->xn = dalloc(b, n * E * fs)) && (b->q = dalloc(b, n * HD * fs)) &&
             (b->k = dalloc(b, n * KD * fs)) && (b->v = dalloc(b, n * KD * fs)) &&
             (b->ctx = dalloc(b, n * HD * fs)) && (b->proj = dalloc(b, n * E * fs)) &&
             (b->gate = dalloc(b, rows * F * fs)) && (b->up = dalloc(b, rows * F * fs)) &&
             (b->act = dalloc(b, rows * F * fs)) && (b->logits = dalloc(b, n * V * fs)) &&
             (b->rc = dalloc(b, n * half * fs)) && (b->rs = dalloc(b, n * half * fs)) &&
             (b->tokens = dalloc(b, n * sizeof(int32_t)));
    if (ok && X)
        ok = (b->moe_logits = dalloc(b, n * X * fs)) && (b->moe_probs = dalloc(b, n * X * fs)) &&
             (b->moe_w = dalloc(b, n * K * fs)) && (b->topk = dalloc(b, n * K * sizeof(int32_t))) &&
             (b->ys = dalloc(b, rows * E * fs));
    if (!ok) {
        acts_free(b);
        return td_err_set(err, TD_EINTERNAL, NAME ": out of device memory for the activations of %lld tokens",
                          (long long)T);
    }
    b->h_rc = td_xcalloc(n * half, fs);
    b->h_rs = td_xcalloc(n * half, fs);
    b->h_logits = td_xcalloc(n * V, fs);
    b->h_pos = td_xcalloc(n, sizeof(int32_t));
    b->cap_T = T;
    return TD_OK;
}

/* ===================================================================== */
/* Taps: what the sink keeps crosses, nothing else                        */
/* ===================================================================== */

static void tap_dev(cuda_backend *b, td_tap_sink *s, int layer, const char *name, td_dtype dt, const void *d,
                    int64_t d0, int64_t d1) {
    const int64_t shape[2] = {d0, d1};
    const uint64_t n = (uint64_t)(d0 * d1);
    switch (TD_TAP_WANT(s, layer, name)) {
    case TD_TAP_WANT_NONE: return;
    case TD_TAP_WANT_FINGERPRINT: {
        td_fingerprint fp;
        if (td_cuda_fingerprint(&fp, dt, d, n, b->fp_scratch)) {
            b->dev_failed = 1;
            return;
        }
        td_tap_emit_fingerprint(s, layer, name, dt, &fp, 2, shape);
        return;
    }
    case TD_TAP_WANT_FULL: {
        const size_t bytes = n * 4; /* f32 and i32 taps only */
        if (bytes > b->h_tap_cap) {
            b->h_tap = td_xrealloc(b->h_tap, bytes);
            b->h_tap_cap = bytes;
        }
        if (td_cuda_d2h(b->h_tap, d, bytes)) {
            b->dev_failed = 1;
            return;
        }
        td_tap_emit(s, layer, name, dt, b->h_tap, 2, shape);
        return;
    }
    }
}

#define TAP(b, s, l, name, d, d0, d1) tap_dev((b), (s), (l), (name), TD_DT_F32, (d), (d0), (d1))

/* ===================================================================== */
/* The forward                                                            */
/* ===================================================================== */

/* rc/rs (T, R/2) = m cos(theta), m sin(theta) of each token's angles, in
 * double then rounded once, on the host (primitives §2, §2.3: every RoPE
 * mode and scaling is in these tables; the kernel only rotates) */
static void rope_tables(cuda_backend *b, int64_t T, int64_t pos0) {
    td_fwd_rope_tables(&b->hp, b->hp.rope_dims, b->rope_ff, T, pos0, b->h_rc, b->h_rs);
}

static void mm(const td_tensor *t, const void *W, int64_t row0, int64_t n_out, const float *x,
               int64_t T, float *y, const float *bias) {
    td_cuda_matmul(t->type, W, t->row_bytes, t->ne[0], row0, n_out, x, t->ne[0], y, n_out, T, bias, NULL, 0, 0, 0);
}

/* b->x (T, E) -> b->proj (T, E) = attn_out of layer l */
static void attention_block(cuda_backend *b, int l, int64_t T, int64_t pos0, td_tap_sink *sink) {
    const td_hparams *hp = &b->hp;
    const td_layer *L = &b->m->layers[l];
    const cu_layer *C = &b->layers[l];
    const int64_t E = hp->n_embd, H = hp->n_head, Hkv = hp->n_head_kv, D = hp->head_dim, HD = H * D, KD = Hkv * D;

    td_cuda_rmsnorm(b->xn, b->x, C->attn_norm, hp->rms_eps, T, E, b->bugs);
    TAP(b, sink, l, "attn_norm", b->xn, T, E);
    if (L->attn.wqkv) { // fused: output rows are [Q; K; V]
        const td_tensor *t = L->attn.wqkv;
        td_cuda_matmul(t->type, C->wqkv, t->row_bytes, E, 0, HD, b->xn, E, b->q, HD, T, C->bq, NULL, 0, 0, 0);
        td_cuda_matmul(t->type, C->wqkv, t->row_bytes, E, HD, KD, b->xn, E, b->k, KD, T, C->bk, NULL, 0, 0, 0);
        td_cuda_matmul(t->type, C->wqkv, t->row_bytes, E, HD + KD, KD, b->xn, E, b->v, KD, T, C->bv, NULL, 0, 0, 0);
    } else {
        mm(L->attn.wq, C->wq, 0, HD, b->xn, T, b->q, C->bq);
        mm(L->attn.wk, C->wk, 0, KD, b->xn, T, b->k, C->bk);
        mm(L->attn.wv, C->wv, 0, KD, b->xn, T, b->v, C->bv);
    }
    TAP(b, sink, l, "attn_q", b->q, T, HD);
    TAP(b, sink, l, "attn_k", b->k, T, KD);
    TAP(b, sink, l, "attn_v", b->v, T, KD);
    if (C->q_norm) { // qwen3 family: per-head RMSNorm before RoPE
        td_cuda_rmsnorm(b->q, b->q, C->q_norm, hp->rms_eps, T * H, D, b->bugs);
        TAP(b, sink, l, "attn_q_norm", b->q, T, HD);
    }
    if (C->k_norm) {
        td_cuda_rmsnorm(b->k, b->k, C->k_norm, hp->rms_eps, T * Hkv, D, b->bugs);
        TAP(b, sink, l, "attn_k_norm", b->k, T, KD);
    }
    const int norm_pairs = hp->rope_type == TD_ROPE_NORM;
    td_cuda_rope(b->q, T, H, D, hp->rope_dims / 2, norm_pairs, b->rc, b->rs);
    td_cuda_rope(b->k, T, Hkv, D, hp->rope_dims / 2, norm_pairs, b->rc, b->rs);
    TAP(b, sink, l, "attn_q_rope", b->q, T, HD);
    TAP(b, sink, l, "attn_k_rope", b->k, T, KD);

    td_cuda_d2d(b->k_cache[l] + pos0 * KD, b->k, (size_t)(T * KD) * sizeof(float));
    td_cuda_d2d(b->v_cache[l] + pos0 * KD, b->v, (size_t)(T * KD) * sizeof(float));
    td_cuda_attention(b->ctx, b->q, b->k_cache[l], b->v_cache[l], T, H, Hkv, D, pos0, (float)(1.0 / sqrt((double)D)),
                      b->bugs);
    TAP(b, sink, l, "attn_ctx", b->ctx, T, HD);
    mm(L->attn.wo, C->wo, 0, E, b->ctx, T, b->proj, C->bo);
    TAP(b, sink, l, "attn_out", b->proj, T, E);
}

/* dense SwiGLU: b->xn (T, E) -> b->proj (T, E) */
static void ffn_dense(cuda_backend *b, int l, int64_t T, td_tap_sink *sink) {
    const td_layer *L = &b->m->layers[l];
    const cu_layer *C = &b->layers[l];
    const int64_t E = b->hp.n_embd, F = b->hp.n_ff;
    mm(L->ffn.gate, C->gate, 0, F, b->xn, T, b->gate, NULL);
    mm(L->ffn.up, C->up, 0, F, b->xn, T, b->up, NULL);
    TAP(b, sink, l, "ffn_gate", b->gate, T, F);
    TAP(b, sink, l, "ffn_up", b->up, T, F);
    td_cuda_swiglu(b->act, b->gate, b->up, T * F);
    TAP(b, sink, l, "ffn_act", b->act, T, F);
    mm(L->ffn.down, C->down, 0, E, b->act, T, b->proj, NULL);
}

/* softmax-routed MoE on the device: the routing never leaves it; each
 * (token, slot) pair multiplies its expert's rows */
static void ffn_moe(cuda_backend *b, int l, int64_t T, td_tap_sink *sink) {
    const td_layer *L = &b->m->layers[l];
    const cu_layer *C = &b->layers[l];
    const int64_t E = b->hp.n_embd, F = b->hp.n_ff, X = b->hp.n_expert, K = b->hp.n_expert_used, P = T * K;
    mm(L->ffn.gate_inp, C->gate_inp, 0, X, b->xn, T, b->moe_logits, NULL);
    TAP(b, sink, l, "moe_logits", b->moe_logits, T, X);
    td_cuda_softmax_rows(b->moe_probs, b->moe_logits, T, X);
    TAP(b, sink, l, "moe_probs", b->moe_probs, T, X);
    td_cuda_moe_route(b->topk, b->moe_w, b->moe_probs, T, X, K);
    tap_dev(b, sink, l, "moe_topk", TD_DT_I32, b->topk, T, K);
    TAP(b, sink, l, "moe_weights", b->moe_w, T, K);
    const td_tensor *up = L->ffn.up_exps, *gate = L->ffn.gate_exps, *down = L->ffn.down_exps;
    // expert e = rows e*F .. e*F+F-1 of gate/up, rows e*E .. of down
    td_cuda_matmul(up->type, C->up_exps, up->row_bytes, E, 0, F, b->xn, E, b->up, F, P, NULL, b->topk, F, 0, K);
    if (gate)
        td_cuda_matmul(gate->type, C->gate_exps, gate->row_bytes, E, 0, F, b->xn, E, b->gate, F, P, NULL, b->topk, F,
                       0, K);
    // llama MoE without gate tensors: W_down . silu(W_up x)
    td_cuda_swiglu(b->act, gate ? b->gate : NULL, b->up, P * F);
    td_cuda_matmul(down->type, C->down_exps, down->row_bytes, F, 0, E, b->act, F, b->ys, E, P, NULL, b->topk, E, 1,
                   K);
    td_cuda_moe_combine(b->proj, b->ys, b->moe_w, T, K, E);
}

static void layer_forward(cuda_backend *b, int l, int64_t T, int64_t pos0, td_tap_sink *sink) {
    const td_layer *L = &b->m->layers[l];
    const int64_t E = b->hp.n_embd;
    switch (L->kind) {
    case TD_LAYER_ATTENTION: attention_block(b, l, T, pos0, sink); break;
    case TD_LAYER_GDN: // qwen3next: refused at open (layer_kinds)
    case TD_LAYER_HC_GDN: // qwen4exp: likewise
    case TD_LAYER_HC_QSA:
    case TD_LAYER_KIND_COUNT: TD_ASSERT(0 && "layer kind refused at open");
    }
    td_cuda_add(b->x, b->proj, T * E);
    TAP(b, sink, l, "ffn_inp", b->x, T, E);
    td_cuda_rmsnorm(b->xn, b->x, b->layers[l].ffn_norm, b->hp.rms_eps, T, E, b->bugs);
    TAP(b, sink, l, "ffn_norm", b->xn, T, E);
    if (L->ffn.gate_inp) ffn_moe(b, l, T, sink);
    else ffn_dense(b, l, T, sink);
    TAP(b, sink, l, "ffn_out", b->proj, T, E);
    td_cuda_add(b->x, b->proj, T * E);
    TAP(b, sink, l, "out", b->x, T, E);
}

static int cuda_forward(td_backend *base, const int32_t *tokens, int64_t T, int64_t pos0, td_tap_sink *sink,
                        double *logits, td_err *err) {
    cuda_backend *b = (cuda_backend *)base;
    const td_hparams *hp = &b->hp;
    const int64_t E = hp->n_embd, V = hp->n_vocab;
    int rc = td_fwd_check_step(NAME, tokens, T, pos0, b->n_past, b->n_ctx, V, err);
    if (rc) return rc;
    if ((rc = acts_ensure(b, T, err))) return rc;

    int32_t stale[1] = {0}; // stale_token: this decode step consumes token 0
    if (b->fault == TD_FAULT_STALE_TOKEN && b->n_fwd == TD_FAULT_STALE_STEP && T == 1) tokens = stale;
    b->n_fwd++;
    b->dev_failed = 0;
    td_fwd_tap_inputs(sink, tokens, T, pos0, b->h_pos);
    // the ids this step consumes are the caller's, uploaded now: nothing is fed back from device memory
    if (td_cuda_h2d(b->tokens, tokens, (size_t)T * sizeof(int32_t)))
        return td_err_set(err, TD_EINTERNAL, NAME ": could not copy the step's tokens to the device");
    const td_tensor *emb = b->m->tok_embd;
    td_cuda_get_rows(emb->type, b->embd, emb->row_bytes, E, b->tokens, T, b->x);
    TAP(b, sink, -1, "inp.embd", b->x, T, E);

    const size_t half = hp->rope_dims / 2;
    rope_tables(b, T, pos0);
    if (half && (td_cuda_h2d(b->rc, b->h_rc, (size_t)T * half * sizeof(float)) ||
                 td_cuda_h2d(b->rs, b->h_rs, (size_t)T * half * sizeof(float))))
        return td_err_set(err, TD_EINTERNAL, NAME ": could not copy the RoPE tables to the device");
    for (uint32_t l = 0; l < hp->n_layer; l++) layer_forward(b, (int)l, T, pos0, sink);

    td_cuda_rmsnorm(b->xn, b->x, b->out_norm, hp->rms_eps, T, E, b->bugs);
    TAP(b, sink, -1, "out.norm", b->xn, T, E);
    const td_tensor *out = b->m->output; // output.weight, or token_embd.weight when tied
    mm(out, b->output, 0, V, b->xn, T, b->logits, NULL);
    TAP(b, sink, -1, "out.logits", b->logits, T, V);
    char why[256] = "";
    if (td_cuda_d2h(b->h_logits, b->logits, (size_t)(T * V) * sizeof(float)) || b->dev_failed ||
        td_cuda_check(why, sizeof why))
        return td_err_set(err, TD_EINTERNAL, NAME ": the device failed during the step at position %lld%s%s",
                          (long long)pos0, why[0] ? ": " : "", why);
    for (int64_t i = 0; i < T * V; i++) logits[i] = (double)b->h_logits[i];

    b->n_past = pos0 + T;
    td_hist_push(&b->hist, tokens, T);
    td_hist_tap(&b->hist, sink);
    return TD_OK;
}

/* ===================================================================== */
/* Open / close                                                           */
/* ===================================================================== */

static void cuda_reset(td_backend *base) {
    cuda_backend *b = (cuda_backend *)base;
    b->n_past = 0;
    b->n_fwd = 0;
    td_hist_reset(&b->hist);
}

static void cuda_close(td_backend *base) {
    cuda_backend *b = (cuda_backend *)base;
    if (!b) return;
    acts_free(b);
    for (size_t i = 0; i < b->n_allocs; i++) td_cuda_free(b->allocs[i]);
    free(b->allocs), free(b->ups), free(b->layers), free(b->k_cache), free(b->v_cache);
    free(b->rope_ff), free(b->h_tap);
    free(b);
}

static const char *cuda_version(const td_backend *base) {
    return ((const cuda_backend *)base)->version;
}

static int load_model(cuda_backend *b, td_err *err) {
    const td_model *m = b->m;
    const td_hparams *hp = &b->hp;
    const int64_t E = hp->n_embd, H = hp->n_head, Hkv = hp->n_head_kv, D = hp->head_dim, F = hp->n_ff;
    const int64_t X = hp->n_expert, V = hp->n_vocab, HD = H * D, KD = Hkv * D;
    int rc;
    if ((rc = td_fwd_check_model(NAME, td_cuda_backend.layer_kinds, m, err))) return rc;
    if ((rc = upload_matrix(b, &b->embd, m->tok_embd, "token_embd", -1, E, V, err))) return rc;
    if ((rc = upload_matrix(b, &b->output, m->output, "output", -1, E, V, err))) return rc;
    if ((rc = upload_vec(b, &b->out_norm, m->output_norm, "output_norm", -1, 0, E, err))) return rc;
    if (!b->out_norm) return td_err_set(err, TD_EINPUT, NAME ": the model has no output_norm tensor");
    if (m->rope_freqs) {
        const int64_t half = hp->rope_dims / 2;
        if ((int64_t)m->rope_freqs->n_elements < half)
            return td_err_set(err, TD_EINPUT, NAME ": rope_freqs has %llu values, expected %lld",
                              (unsigned long long)m->rope_freqs->n_elements, (long long)half);
        b->rope_ff = td_xcalloc((size_t)half + 1, sizeof(float));
        if ((rc = td_decode_row_f32(m->rope_freqs->type, m->rope_freqs->data, b->rope_ff, half, err))) return rc;
    }
    b->layers = td_xcalloc(hp->n_layer ? hp->n_layer : 1, sizeof *b->layers);
    for (uint32_t i = 0; i < hp->n_layer; i++) {
        const td_layer *L = &m->layers[i];
        cu_layer *C = &b->layers[i];
        const int l = (int)i;
        if ((rc = upload_vec(b, &C->attn_norm, L->attn.norm, "attn_norm", l, 0, E, err))) return rc;
        if ((rc = upload_vec(b, &C->ffn_norm, L->ffn.norm, "ffn_norm", l, 0, E, err))) return rc;
        if (!C->attn_norm || !C->ffn_norm)
            return td_err_set(err, TD_EINPUT, NAME ": layer %d lacks %s", l, C->attn_norm ? "ffn_norm" : "attn_norm");
        if ((rc = upload_vec(b, &C->q_norm, L->attn.q_norm, "attn_q_norm", l, 0, D, err))) return rc;
        if ((rc = upload_vec(b, &C->k_norm, L->attn.k_norm, "attn_k_norm", l, 0, D, err))) return rc;
        if (L->attn.wqkv) {
            if ((rc = upload_matrix(b, &C->wqkv, L->attn.wqkv, "attn_qkv", l, E, HD + 2 * KD, err))) return rc;
            if ((rc = upload_vec(b, &C->bq, L->attn.bqkv, "attn_qkv.bias", l, 0, HD, err))) return rc;
            if ((rc = upload_vec(b, &C->bk, L->attn.bqkv, "attn_qkv.bias", l, HD, KD, err))) return rc;
            if ((rc = upload_vec(b, &C->bv, L->attn.bqkv, "attn_qkv.bias", l, HD + KD, KD, err))) return rc;
        } else {
            if (!L->attn.wq || !L->attn.wk || !L->attn.wv)
                return td_err_set(err, TD_EINPUT, NAME ": layer %d lacks attn_q/attn_k/attn_v", l);
            if ((rc = upload_matrix(b, &C->wq, L->attn.wq, "attn_q", l, E, HD, err))) return rc;
            if ((rc = upload_matrix(b, &C->wk, L->attn.wk, "attn_k", l, E, KD, err))) return rc;
            if ((rc = upload_matrix(b, &C->wv, L->attn.wv, "attn_v", l, E, KD, err))) return rc;
            if ((rc = upload_vec(b, &C->bq, L->attn.bq, "attn_q.bias", l, 0, HD, err))) return rc;
            if ((rc = upload_vec(b, &C->bk, L->attn.bk, "attn_k.bias", l, 0, KD, err))) return rc;
            if ((rc = upload_vec(b, &C->bv, L->attn.bv, "attn_v.bias", l, 0, KD, err))) return rc;
        }
        if (!L->attn.wo) return td_err_set(err, TD_EINPUT, NAME ": layer %d lacks attn_output", l);
        if ((rc = upload_matrix(b, &C->wo, L->attn.wo, "attn_output", l, HD, E, err))) return rc;
        if ((rc = upload_vec(b, &C->bo, L->attn.bo, "attn_output.bias", l, 0, E, err))) return rc;
        if (L->ffn.gate_inp) {
            if (X < 1) return td_err_set(err, TD_EINPUT, NAME ": layer %d has a router but expert_count is 0", l);
            if (!L->ffn.up_exps || !L->ffn.down_exps)
                return td_err_set(err, TD_EINPUT, NAME ": layer %d lacks ffn_up_exps/ffn_down_exps", l);
            if ((rc = upload_matrix(b, &C->gate_inp, L->ffn.gate_inp, "ffn_gate_inp", l, E, X, err))) return rc;
            if ((rc = upload_matrix(b, &C->up_exps, L->ffn.up_exps, "ffn_up_exps", l, E, X * F, err))) return rc;
            if ((rc = upload_matrix(b, &C->gate_exps, L->ffn.gate_exps, "ffn_gate_exps", l, E, X * F, err)))
                return rc;
            if ((rc = upload_matrix(b, &C->down_exps, L->ffn.down_exps, "ffn_down_exps", l, F, X * E, err)))
                return rc;
        } else {
            if (!L->ffn.gate || !L->ffn.up || !L->ffn.down)
                return td_err_set(err, TD_EINPUT, NAME ": layer %d lacks ffn_gate/ffn_up/ffn_down", l);
            if ((rc = upload_matrix(b, &C->gate, L->ffn.gate, "ffn_gate", l, E, F, err))) return rc;
            if ((rc = upload_matrix(b, &C->up, L->ffn.up, "ffn_up", l, E, F, err))) return rc;
            if ((rc = upload_matrix(b, &C->down, L->ffn.down, "ffn_down", l, F, E, err))) return rc;
        }
    }
    return TD_OK;
}

static int cuda_probe(char *why, size_t n) {
    return td_cuda_probe(why, n) ? TD_SKIP : TD_OK;
}

static int cuda_open(td_backend **out, const td_model *m, const td_backend_params *p, td_err *err);

const td_backend_vt td_cuda_backend = {
    .name = NAME,
    .precision = "f32",
    .open = cuda_open,
    .forward = cuda_forward,
    .reset = cuda_reset,
    .close = cuda_close,
    .version = cuda_version,
    .probe = cuda_probe,
    .layer_kinds = TD_KINDS(TD_LAYER_ATTENTION),
    .faults = TD_FAULT_BIT(TD_FAULT_STALE_TOKEN) | TD_FAULT_BIT(TD_FAULT_CUDA_SYNC_MISSING) |
              TD_FAULT_BIT(TD_FAULT_CUDA_SMEM_STRIDE),
};

static int cuda_open(td_backend **out, const td_model *m, const td_backend_params *p, td_err *err) {
    *out = NULL;
    td_fault fault;
    if (td_fault_parse(NAME, p ? p->inject : NULL, &fault, err)) return TD_EINPUT;
    int rc = td_fault_check_backend(&td_cuda_backend, p ? p->inject : NULL, err);
    if (rc) return rc;
    const char *profile = p && p->profile && p->profile[0] ? p->profile : "native";
    if (strcmp(profile, "native"))
        return td_err_set(err, TD_EINPUT,
                          NAME ": arithmetic profile '%s' is not supported (expected native: f32 activations, "
                               "products accumulated in double)",
                          profile);
    char dev[256];
    if (td_cuda_probe(dev, sizeof dev)) return td_err_set(err, TD_SKIP, NAME ": cannot run here: %s", dev);
    char why[256];
    if (td_cuda_upload_tables(why, sizeof why)) return td_err_set(err, TD_EINTERNAL, NAME ": %s", why);

    cuda_backend *b = td_xcalloc(1, sizeof *b);
    b->base.vt = &td_cuda_backend;
    b->m = m;
    b->hp = m->hp;
    b->fault = fault;
    b->bugs = fault == TD_FAULT_CUDA_SYNC_MISSING   ? TD_CUDA_BUG_NOSYNC
              : fault == TD_FAULT_CUDA_SMEM_STRIDE ? TD_CUDA_BUG_SMEM_STRIDE
                                                   : 0u;
    const td_hparams *hp = &b->hp;
    b->n_ctx = p && p->n_ctx ? p->n_ctx : hp->n_ctx_train;
    if (b->n_ctx < 1) b->n_ctx = 4096;
    const int64_t max_ctx = td_cuda_attn_max_ctx(hp->head_dim);
    if (b->n_ctx > max_ctx) {
        if (p && p->n_ctx) {
            cuda_close(&b->base);
            return td_err_set(err, TD_EINPUT,
                              NAME ": a context of %lld positions does not fit the attention kernel's shared memory "
                                   "(at most %lld for head dim %u)",
                              (long long)b->n_ctx, (long long)max_ctx, hp->head_dim);
        }
        b->n_ctx = max_ctx; // the training context is only a default
    }
    if ((rc = load_model(b, err))) {
        cuda_close(&b->base);
        return rc;
    }
    const size_t kv = (size_t)b->n_ctx * hp->n_head_kv * hp->head_dim * sizeof(float);
    b->k_cache = td_xcalloc(hp->n_layer ? hp->n_layer : 1, sizeof(float *));
    b->v_cache = td_xcalloc(hp->n_layer ? hp->n_layer : 1, sizeof(float *));
    for (uint32_t l = 0; l < hp->n_layer; l++)
        if (!(b->k_cache[l] = dalloc(b, kv)) || !(b->v_cache[l] = dalloc(b, kv))) {
            cuda_close(&b->base);
            return td_err_set(err, TD_EINTERNAL, NAME ": out of device memory for a KV cache of %lld positions",
                              (long long)b->n_ctx);
        }
    if (!(b->fp_scratch = dalloc(b, td_cuda_fp_scratch_bytes()))) {
        cuda_close(&b->base);
        return td_err_set(err, TD_EINTERNAL, NAME ": out of device memory");
    }
    snprintf(b->version, sizeof b->version,
             "tapdiff " TD_VERSION " (" TD_GIT_REV ") cuda: %s; profile native (f32 activations and KV cache, "
             "products in double), kernels sm_90 + PTX",
             dev);
    if (fault) { // a run with a deliberate bug must say so wherever its version is recorded
        size_t len = strlen(b->version);
        snprintf(b->version + len, sizeof b->version - len, " FAULT INJECTED: %s", td_fault_get(fault)->name);
    }
    *out = &b->base;
    return TD_OK;
}
