/* tapdiff "cpu": qwen4exp (../shared/spec/arch-qwen4exp.md): hyper-connection
 * streams and mixers, the PLE n-gram embedding with its token and conv
 * history, QSA attention with the indexer's raw-key cache per sequence, and
 * the final HC mixer. The taps are the catalog's qwen4exp rows
 * (taps/catalog.c).
 *
 * This file is #included by cpu.c, not compiled on its own: it builds on
 * cpu.c's static matmul jobs (seg_add / mm_run, so the native and act-q8
 * paths apply unchanged), row helpers, MoE, shared expert and GDN (cpu.c's
 * gdn_mixer in qwen4exp's form: tiled value heads, separate beta/alpha, the
 * sigmoid gate, with every GDN fault hook), without exporting them. cpu.c calls in at a few marked hooks (q4_*).
 *
 * Choices where llama.cpp leaves it open (spec §7): the QSA selection takes
 * the tail, then complete blocks by descending score, equal scores lower
 * block first, a block cut by the budget keeps its lowest positions (the
 * reference's choice); block keys rotate at (b·r, b·r, b·r, b·r), token
 * queries at (p, p, p, 0); a QSA layer with ratio 0 is dense attention and
 * runs no indexer (no qsa_* taps); caches are f32 (llama.cpp's are f16). */

/* ===================================================================== */
/* qwen4exp state                                                         */
/* ===================================================================== */

/* Per-layer vectors decoded once at open. */
typedef struct cpu_q4layer {
    float *hc_attn_g, *hc_ffn_g;       // (hc*E) HC gammas, stream-major
    float *ple_nk, *ple_nq, *ple_nc;   // (hc*E) PLE norm gammas (the PLE layer only)
    float *ple_conv;                   // (hc*E, Kp) conv taps per channel, oldest first
    float *iq_norm, *ik_norm;          // (di) indexer norms (QSA layers)
} cpu_q4layer;

/* What a sequence holds beyond cpu_seq: the token of every position (the
 * PLE n-grams read it) and each QSA layer's raw indexer keys. The PLE conv
 * history lives in cpu_seq.rs with the GDN state, so snapshots cover it. */
typedef struct cpu_q4seq {
    int64_t cap;
    int32_t *tok;   // (cap)
    float **ikey;   // n_layer x (cap, di), NULL on layers without an indexer
} cpu_q4seq;

typedef struct cpu_q4 {
    cpu_q4layer *layers;
    float *out_g;        // (hc*E) final mixer gammas
    int64_t rs_ple;      // offset of the PLE conv history in a sequence's rs: ((Kp-1)*Ng, hc*E)
    int64_t ple_hist;    // (Kp-1)*Ng rows of that history
    cpu_q4seq seqs[TD_SEQ_MAX];
    unsigned fmts_flat, fmts_lam, fmts_P;
    int64_t cap_T;
    float *Rs;           // (T, hc*E) the streams
    cpu_in flat;         // (T, hc*E) each stream RMSNormed with its gamma slice
    float *lam_raw;      // (T, lr) W_down·flat
    cpu_in lam;          // (T, lr) silu(W_down·flat / hc)
    float *gam;          // (T, hc*E) W_up·lam, before the sigmoid
    float *inj;          // (T, hc)
    cpu_in P;            // (T, E) the PLE embedding
    int32_t *ple_ids;    // (T, Ng)
    int32_t *ple_rows;   // (T, Np)
    float *pk, *pv;      // (T, hc*E), (T, E)
    float *pg;           // (T, hc) PLE gates
    float *pgv, *pnv;    // (T, hc*E) gated value, its RMSNorm
    float *pcv;          // (T, hc*E) conv output
    float *iq, *ik;      // (T, Hi*di) indexer queries, (T, di) raw keys
    float *rc, *rsn;     // (R/2) one position's m*cos, m*sin
    int64_t cap_kv;      // rows of the buffers below
    float *bkey;         // (cap_kv, di) block keys (at most cap_kv blocks)
    float *score;        // (T, cap_kv) block scores
    int32_t *sel;        // (T, Wq max)
    uint8_t *mask;       // (T, cap_kv) 1 = the token attends to that row
    int64_t Wmax;
} cpu_q4;

static int is_q4(const cpu_backend *b) {
    return b->hp.arch == TD_ARCH_QWEN4EXP;
}

/* ===================================================================== */
/* IMROPE (primitives §2.2): NEOX pairs, each pair's angle from one of    */
/* four position components chosen by the sections                        */
/* ===================================================================== */

static int q4_imrope_component(int64_t i, const uint32_t *sec) {
    const int64_t S = (int64_t)sec[0] + sec[1] + sec[2] + sec[3];
    const int64_t k = S > 0 ? i % S : 0;
    if (k % 3 == 0 && k < 3 * (int64_t)sec[0]) return 0;
    if (k % 3 == 1 && k < 3 * (int64_t)sec[1]) return 1;
    if (k % 3 == 2 && k < 3 * (int64_t)sec[2]) return 2;
    return 3;
}

/* m*cos and m*sin of the R/2 angles at positions pos4 (in double, rounded once) */
static void q4_rope_row(const cpu_backend *b, const int64_t pos4[4], float *c, float *s) {
    const td_hparams *hp = &b->hp;
    const int64_t R = hp->rope_dims, half = R / 2;
    const double fs = hp->rope_scaling == TD_ROPE_SCALING_NONE ? 1.0 : (double)hp->rope_freq_scale;
    const double m = hp->rope_attn_factor;
    for (int64_t i = 0; i < half; i++) {
        const double omega = pow((double)hp->rope_base, -(double)(2 * i) / (double)R);
        const double theta = fs * ((double)pos4[q4_imrope_component(i, hp->rope_sections)] * omega);
        c[i] = (float)(m * cos(theta));
        s[i] = (float)(m * sin(theta));
    }
}

/* rotates the first R dims of n_heads heads of `dim` values at x */
static void q4_rope_apply(const cpu_backend *b, float *x, int64_t n_heads, int64_t dim, const float *c,
                          const float *s) {
    const int64_t half = b->hp.rope_dims / 2;
    for (int64_t h = 0; h < n_heads; h++) {
        float *xh = x + h * dim;
        for (int64_t i = 0; i < half; i++) {
            const float u = xh[i], v = xh[i + half];
            xh[i] = u * c[i] - v * s[i];
            xh[i + half] = u * s[i] + v * c[i];
        }
    }
}

/* a token at position p: (p, p, p, 0) */
static void q4_rope_tokens(cpu_backend *b, float *x, int64_t T, int64_t pos0, int64_t n_heads, int64_t dim,
                           int64_t stride) {
    cpu_q4 *q = b->q4;
    for (int64_t t = 0; t < T; t++) {
        const int64_t p = pos0 + t, pos4[4] = {p, p, p, 0};
        q4_rope_row(b, pos4, q->rc, q->rsn);
        q4_rope_apply(b, x + t * stride, n_heads, dim, q->rc, q->rsn);
    }
}

/* ===================================================================== */
/* Hyper-connections (§4.1)                                               */
/* ===================================================================== */

/* HCMix of the streams q->Rs (T, hc*E) with gammas g and mixer P: mixed
 * (T, E), the gate γ into q->gam, the inject (T, hc) into q->inj when P has
 * one. */
static void q4_hc_mix(cpu_backend *b, const td_hc_parts *P, const float *g, int64_t T, float *mixed) {
    cpu_q4 *q = b->q4;
    const int64_t E = b->hp.n_embd, hc = b->hp.hc, hcd = hc * E, lr = b->hp.hc_lr;
    for (int64_t t = 0; t < T; t++)
        for (int64_t c = 0; c < hc; c++)
            rmsnorm_rows(q->flat.x + t * hcd + c * E, q->Rs + t * hcd + c * E, g + c * E, b->hp.rms_eps, 1, E);
    in_prepare(b, &q->flat, 0, T);
    int n = 0;
    seg_add(b, &n, P->down, 0, lr, &q->flat, 0, T, q->lam_raw, lr, NULL, 1);
    if (P->inject) seg_add(b, &n, P->inject, 0, hc, &q->flat, 0, T, q->inj, hc, NULL, 1);
    mm_run(b, n);
    for (int64_t i = 0; i < T * lr; i++) q->lam.x[i] = silu(q->lam_raw[i] / (float)hc);
    in_prepare(b, &q->lam, 0, T);
    matmul(b, q->gam, &q->lam, P->up, 0, hcd, T, NULL);
    for (int64_t t = 0; t < T; t++)
        for (int64_t e = 0; e < E; e++) {
            float acc = 0;
            for (int64_t c = 0; c < hc; c++)
                acc += q->flat.x[t * hcd + c * E + e] / (1.0f + expf(-q->gam[t * hcd + c * E + e]));
            mixed[t * E + e] = acc / (float)hc;
        }
}

/* HCCombine: every stream c adds 2σ(inj_c / hc)·y (y: (T, E)); `shift`
 * (the hc_inject_stream fault) reads stream c+shift's inject instead */
static void q4_hc_combine(cpu_backend *b, const float *y, int64_t T, int64_t shift) {
    cpu_q4 *q = b->q4;
    const int64_t E = b->hp.n_embd, hc = b->hp.hc, hcd = hc * E;
    for (int64_t t = 0; t < T; t++)
        for (int64_t c = 0; c < hc; c++) {
            const float w = 2.0f / (1.0f + expf(-q->inj[t * hc + (c + shift) % hc] / (float)hc));
            float *r = q->Rs + t * hcd + c * E;
            for (int64_t e = 0; e < E; e++) r[e] += w * y[t * E + e];
        }
}

/* ===================================================================== */
/* PLE (§4.6)                                                             */
/* ===================================================================== */

/* inp.ple_ids, inp.ple_rows, inp.ple_embd of the step; tokens of positions
 * pos0.. are already in the sequence's token array */
static void q4_ple_inputs(cpu_backend *b, int64_t T, int64_t pos0, td_tap_sink *sink) {
    const td_hparams *hp = &b->hp;
    cpu_q4 *q = b->q4;
    const cpu_q4seq *qs = &q->seqs[b->s - b->seqs];
    const int64_t Ng = hp->ple_ngram, hg = hp->ple_heads_per_ngram, Np = hp->ple_n_heads, dp = hp->ple_dim;
    const int64_t E = hp->n_embd, eos = hp->ple_eos;
    for (int64_t t = 0; t < T; t++) {
        const int64_t p = pos0 + t;
        int32_t *ctx = q->ple_ids + t * Ng;
        ctx[0] = qs->tok[p];
        int cut = 0;
        for (int64_t s = 1; s < Ng; s++) {
            // an EOS or a missing predecessor at distance s cuts it and every older one
            if (!cut && (p - s < 0 || qs->tok[p - s] == (int32_t)eos)) cut = 1;
            ctx[s] = cut ? (int32_t)eos : qs->tok[p - s];
        }
        uint64_t X = (uint64_t)(uint32_t)ctx[0] * hp->ple_mult[0];
        for (int64_t n = 2; n <= Ng; n++) {
            X ^= (uint64_t)(uint32_t)ctx[n - 1] * hp->ple_mult[n - 1];
            if (b->fault == TD_FAULT_PLE_HASH32 && n == Ng) { // ple_hash32: this order's products wrap at 2^32
                X = 0;
                for (int64_t i = 0; i < n; i++) X ^= (uint32_t)((uint32_t)ctx[i] * (uint32_t)hp->ple_mult[i]);
            }
            for (int64_t j = 0; j < hg; j++) {
                const int64_t h = (n - 2) * hg + j;
                const uint64_t row = X % hp->ple_vsz[h] + hp->ple_off[h];
                q->ple_rows[t * Np + h] = (int32_t)row;
            }
        }
    }
    const int64_t sh_ids[2] = {T, Ng}, sh_rows[2] = {T, Np};
    TD_TAP(sink, -1, "inp.ple_ids", TD_DT_I32, q->ple_ids, 2, sh_ids);
    TD_TAP(sink, -1, "inp.ple_rows", TD_DT_I32, q->ple_rows, 2, sh_rows);
    const td_tensor *tab = b->m->ple_table;
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < Np; h++)
            b->k.type[tab->type].to_f32(tab->type, td_tensor_row(tab, (uint64_t)q->ple_rows[t * Np + h]),
                                        q->P.x + t * E + h * dp, dp);
    tap2(sink, -1, "inp.ple_embd", q->P.x, T, E);
    in_prepare(b, &q->P, 0, T);
}

/* the PLE block of layer l on the streams (before the attention mixer) */
static void q4_ple_block(cpu_backend *b, int l, int64_t T, td_tap_sink *sink) {
    const td_hparams *hp = &b->hp;
    const td_ple_parts *Pp = &b->m->layers[l].ple;
    const cpu_q4layer *QL = &b->q4->layers[l];
    cpu_q4 *q = b->q4;
    const int64_t E = hp->n_embd, hc = hp->hc, hcd = hc * E, Kp = hp->ple_conv, Ng = hp->ple_ngram;
    const int64_t Lh = q->ple_hist;
    int n = 0;
    seg_add(b, &n, Pp->key, 0, hcd, &q->P, 0, T, q->pk, hcd, NULL, 1);
    seg_add(b, &n, Pp->value, 0, E, &q->P, 0, T, q->pv, E, NULL, 1);
    mm_run(b, n);
    const float inv_sqrt_e = (float)(1.0 / sqrt((double)E));
    for (int64_t t = 0; t < T; t++)
        for (int64_t c = 0; c < hc; c++) {
            float *K = q->pk + t * hcd + c * E;
            float *Q = q->pnv + t * hcd + c * E; // scratch: the query norm, overwritten below
            rmsnorm_rows(K, K, QL->ple_nk + c * E, hp->rms_eps, 1, E);
            rmsnorm_rows(Q, q->Rs + t * hcd + c * E, QL->ple_nq + c * E, hp->rms_eps, 1, E);
            const float s = dotf(K, Q, E) * inv_sqrt_e, a = fabsf(s);
            // sign(0) = 0: a zero score gates by one half
            const float z = (s > 0 ? 1.0f : s < 0 ? -1.0f : 0.0f) * sqrtf(a > 1e-6f ? a : 1e-6f);
            const float g = 1.0f / (1.0f + expf(-z));
            q->pg[t * hc + c] = g;
            float *gv = q->pgv + t * hcd + c * E;
            for (int64_t e = 0; e < E; e++) gv[e] = g * q->pv[t * E + e];
            rmsnorm_rows(q->pnv + t * hcd + c * E, gv, QL->ple_nc + c * E, hp->rms_eps, 1, E);
        }
    tap2(sink, l, "ple_gate", q->pg, T, hc);
    tap2(sink, l, "ple_gated", q->pgv, T, hcd);
    // dilated causal conv: tap k reads the input (Kp-1-k)*Ng tokens back; older
    // inputs than this step's come from the history rows (oldest first)
    float *st = b->s->rs + q->rs_ple;
    for (int64_t t = 0; t < T; t++)
        for (int64_t ch = 0; ch < hcd; ch++) {
            const float *w = QL->ple_conv + ch * Kp;
            float y = 0;
            for (int64_t k = 0; k < Kp; k++) {
                const int64_t j = t - (Kp - 1 - k) * Ng;
                y += w[k] * (j >= 0 ? q->pnv[j * hcd + ch] : st[(Lh + j) * hcd + ch]);
            }
            q->pcv[t * hcd + ch] = silu(y);
        }
    if (Lh > 0) {
        if (T >= Lh) {
            memcpy(st, q->pnv + (T - Lh) * hcd, (size_t)(Lh * hcd) * sizeof(float));
        } else {
            memmove(st, st + T * hcd, (size_t)((Lh - T) * hcd) * sizeof(float));
            memcpy(st + (Lh - T) * hcd, q->pnv, (size_t)(T * hcd) * sizeof(float));
        }
    }
    tap2(sink, l, "ple_conv", q->pcv, T, hcd);
    tap2(sink, l, "ple_conv_state", st, Lh, hcd);
    for (int64_t i = 0; i < T * hcd; i++) q->Rs[i] += q->pgv[i] + q->pcv[i];
    tap2(sink, l, "ple_out", q->Rs, T, hcd);
}

/* ===================================================================== */
/* QSA attention (§4.4, §4.5)                                             */
/* ===================================================================== */

/* The selection of a token at row p (rows = positions) with ratio r and
 * budget W, in the tap's rank order: the tail ascending, then whole blocks by
 * descending score (equal scores: lower block first), each block's positions
 * ascending, a block cut by the budget keeping its lowest; -1 pads. Dense
 * (0..p) while p + 1 <= W. score: the token's block scores (nb blocks). */
static void q4_qsa_select(int32_t *sel, const float *score, int64_t p, int64_t r, int64_t W, int skip_best) {
    int64_t n = 0;
    if (p + 1 <= W) {
        for (int64_t s = 0; s <= p; s++) sel[n++] = (int32_t)s;
    } else {
        const int64_t Tt = (p + 1) / r * r, nb = Tt / r;
        for (int64_t s = Tt; s <= p; s++) sel[n++] = (int32_t)s;
        int64_t last = -1; // the block taken last, and its score: the next is the best below it in rank
        float last_s = 0;
        while (n < W) {
            int64_t best = -1;
            for (int64_t bl = 0; bl < nb; bl++) {
                // rank: higher score first, then lower block; take the best ranked after `last`
                const int after = last < 0 || score[bl] < last_s || (score[bl] == last_s && bl > last);
                if (after && (best < 0 || score[bl] > score[best])) best = bl;
            }
            if (best < 0) break;
            if (skip_best) { // qsa_topk_skip: the walk steps over its first entry
                skip_best = 0;
                last = best, last_s = score[best];
                continue;
            }
            for (int64_t j = 0; j < r && n < W; j++) sel[n++] = (int32_t)(best * r + j);
            last = best, last_s = score[best];
        }
    }
    for (; n < W; n++) sel[n] = -1;
}

typedef struct q4_attn_job {
    cpu_backend *b;
    int l;
    int64_t kv0, mcap;
} q4_attn_job;

static void q4_attn_task(void *ctx, int64_t task, int th) {
    const q4_attn_job *j = ctx;
    cpu_backend *b = j->b;
    const int64_t H = b->hp.n_head, Hkv = b->hp.n_head_kv, D = b->hp.head_dim;
    const int64_t t = task / H, h = task % H, g = h / (H / Hkv), p = j->kv0 + t;
    const uint8_t *mask = b->q4->mask + t * j->mcap;
    const float *q = b->a.q + (t * H + h) * D;
    const float *kc = b->s->k_cache[j->l] + g * D, *vc = b->s->v_cache[j->l] + g * D;
    const float scale = (float)(1.0 / sqrt((double)D));
    float *att = b->att[th];
    int64_t n = 0;
    for (int64_t s = 0; s <= p; s++)
        if (mask[s]) att[n++] = scale * b->k.dot_f32(q, kc + s * Hkv * D, D);
    softmax_f32(att, att, n);
    float *o = b->a.ctx.x + (t * H + h) * D;
    memset(o, 0, (size_t)D * sizeof *o);
    n = 0;
    for (int64_t s = 0; s <= p; s++)
        if (mask[s]) b->k.axpy_f32(o, att[n++], vc + s * Hkv * D, D);
}

static void q4_kv_buffers(cpu_backend *b, int64_t T, int64_t n_kv) {
    cpu_q4 *q = b->q4;
    if (n_kv <= q->cap_kv && T <= q->cap_T) return;
    int64_t cap = q->cap_kv > n_kv ? q->cap_kv : n_kv < 64 ? 64 : 2 * n_kv;
    q->cap_kv = cap;
    const int64_t rows = q->cap_T > T ? q->cap_T : T;
    free(q->bkey), free(q->score), free(q->mask);
    q->bkey = td_xcalloc((size_t)(cap * b->hp.idx_dim + 1), sizeof(float));
    q->score = td_xcalloc((size_t)(rows * cap), sizeof(float));
    q->mask = td_xcalloc((size_t)(rows * cap), 1);
}

/* u in a->xn (prepared) -> a->proj (T, E) */
static void q4_qsa_block(cpu_backend *b, int l, int64_t T, int64_t pos0, td_tap_sink *sink) {
    const td_hparams *hp = &b->hp;
    const td_layer *L = &b->m->layers[l];
    const cpu_layer *CL = &b->layers[l];
    const cpu_q4layer *QL = &b->q4->layers[l];
    cpu_q4 *q = b->q4;
    cpu_acts *a = &b->a;
    const int64_t E = hp->n_embd, H = hp->n_head, Hkv = hp->n_head_kv, D = hp->head_dim;
    const int64_t HD = H * D, KD = Hkv * D, Hi = hp->idx_heads, di = hp->idx_dim, r = hp->qsa_ratio[l];

    int n = 0;
    seg_add(b, &n, L->attn.wq, 0, 2 * HD, &a->xn, 0, T, a->qg, 2 * HD, NULL, 1);
    seg_add(b, &n, L->attn.wk, 0, KD, &a->xn, 0, T, a->k, KD, NULL, 1);
    seg_add(b, &n, L->attn.wv, 0, KD, &a->xn, 0, T, a->v, KD, NULL, 1);
    if (r > 0) {
        seg_add(b, &n, L->qsa.wq, 0, Hi * di, &a->xn, 0, T, q->iq, Hi * di, NULL, 1);
        seg_add(b, &n, L->qsa.wk, 0, di, &a->xn, 0, T, q->ik, di, NULL, 1);
    }
    mm_run(b, n);
    for (int64_t th = 0; th < T * H; th++) {
        memcpy(a->q + th * D, a->qg + th * 2 * D, (size_t)D * sizeof(float));
        memcpy(a->agate + th * D, a->qg + th * 2 * D + D, (size_t)D * sizeof(float));
    }
    tap2(sink, l, "attn_q", a->q, T, HD);
    tap2(sink, l, "attn_k", a->k, T, KD);
    tap2(sink, l, "attn_v", a->v, T, KD);
    tap2(sink, l, "attn_gate", a->agate, T, HD);
    par_rmsnorm(b, a->q, a->q, CL->q_norm, T * H, D);
    tap2(sink, l, "attn_q_norm", a->q, T, HD);
    par_rmsnorm(b, a->k, a->k, CL->k_norm, T * Hkv, D);
    tap2(sink, l, "attn_k_norm", a->k, T, KD);
    q4_rope_tokens(b, a->q, T, pos0, H, D, HD);
    q4_rope_tokens(b, a->k, T, pos0, Hkv, D, KD);
    tap2(sink, l, "attn_q_rope", a->q, T, HD);
    tap2(sink, l, "attn_k_rope", a->k, T, KD);

    const int64_t kv0 = pos0 + (b->s->n_kv - b->s->n_past), n_kv = kv0 + T;
    memcpy(b->s->k_cache[l] + kv0 * KD, a->k, (size_t)(T * KD) * sizeof(float));
    memcpy(b->s->v_cache[l] + kv0 * KD, a->v, (size_t)(T * KD) * sizeof(float));
    q4_kv_buffers(b, T, n_kv);
    const int64_t mcap = q->cap_kv;
    if (r > 0) {
        float *ikc = q->seqs[b->s - b->seqs].ikey[l];
        tap2(sink, l, "qsa_k_raw", q->ik, T, di);
        memcpy(ikc + kv0 * di, q->ik, (size_t)(T * di) * sizeof(float));
        par_rmsnorm(b, q->iq, q->iq, QL->iq_norm, T * Hi, di);
        q4_rope_tokens(b, q->iq, T, pos0, Hi, di, Hi * di);
        tap2(sink, l, "qsa_q", q->iq, T, Hi * di);
        tap2(sink, l, "qsa_kcache", ikc, n_kv, di);
        // block keys of the complete blocks: mean of the raw keys, RMSNorm, RoPE at the block start
        const int64_t NB = n_kv / r;
        for (int64_t bl = 0; bl < NB; bl++) {
            float *kb = q->bkey + bl * di;
            for (int64_t i = 0; i < di; i++) {
                double s = 0;
                for (int64_t j = 0; j < r; j++) s += ikc[(bl * r + j) * di + i];
                kb[i] = (float)(s / (double)r);
            }
            rmsnorm_rows(kb, kb, QL->ik_norm, hp->rms_eps, 1, di);
            const int64_t p0 = bl * r, pos4[4] = {p0, p0, p0, p0};
            q4_rope_row(b, pos4, q->rc, q->rsn);
            q4_rope_apply(b, kb, 1, di, q->rc, q->rsn);
        }
        for (int64_t t = 0; t < T; t++) {
            const int64_t p = kv0 + t, nb = (p + 1) / r;
            float *sc = q->score + t * NB;
            for (int64_t bl = 0; bl < NB; bl++) {
                if (bl >= nb) {
                    sc[bl] = -1.0f; // not complete for this token
                    continue;
                }
                float s = 0;
                for (int64_t i = 0; i < Hi; i++) {
                    const float d = dotf(q->iq + t * Hi * di + i * di, q->bkey + bl * di, di);
                    s += d > 0 ? d : 0;
                }
                sc[bl] = s;
            }
        }
        if (NB > 0) tap2(sink, l, "qsa_scores", q->score, T, NB); // no block complete yet: no scores tap
        const int64_t W = (int64_t)hp->idx_topk + r - 1;
        for (int64_t t = 0; t < T; t++) {
            int32_t *sel = q->sel + t * W;
            q4_qsa_select(sel, q->score + t * NB, kv0 + t, r, W, b->fault == TD_FAULT_QSA_TOPK_SKIP);
            uint8_t *mk = q->mask + t * mcap;
            memset(mk, 0, (size_t)mcap);
            for (int64_t i = 0; i < W; i++)
                if (sel[i] >= 0) mk[sel[i]] = 1;
        }
        const int64_t shape[2] = {T, W};
        TD_TAP(sink, l, "qsa_sel", TD_DT_I32, q->sel, 2, shape);
    } else {
        for (int64_t t = 0; t < T; t++) {
            memset(q->mask + t * mcap, 0, (size_t)mcap);
            memset(q->mask + t * mcap, 1, (size_t)(kv0 + t + 1));
        }
    }
    q4_attn_job aj = {b, l, kv0, mcap};
    td_cpu_pool_run(b->pool, T * H, q4_attn_task, &aj);
    tap2(sink, l, "attn_ctx", a->ctx.x, T, HD);
    for (int64_t i = 0; i < T * HD; i++) a->ctx.x[i] *= 1.0f / (1.0f + expf(-a->agate[i]));
    tap2(sink, l, "attn_gated", a->ctx.x, T, HD);
    in_prepare(b, &a->ctx, 0, T);
    matmul(b, a->proj, &a->ctx, L->attn.wo, 0, E, T, NULL);
    tap2(sink, l, "attn_out", a->proj, T, E);
}

/* ===================================================================== */
/* The forward                                                            */
/* ===================================================================== */

static void q4_acts_ensure(cpu_backend *b, int64_t T) {
    cpu_q4 *q = b->q4;
    if (T <= q->cap_T) return;
    const td_hparams *hp = &b->hp;
    const size_t n = (size_t)T, E = hp->n_embd, hc = hp->hc, hcd = hc * E, lr = hp->hc_lr, fs = sizeof(float);
    free(q->Rs), free(q->lam_raw), free(q->gam), free(q->inj), free(q->ple_ids), free(q->ple_rows);
    free(q->pk), free(q->pv), free(q->pg), free(q->pgv), free(q->pnv), free(q->pcv), free(q->iq), free(q->ik);
    free(q->sel), free(q->score), free(q->mask);
    in_free(&q->flat), in_free(&q->lam), in_free(&q->P);
    q->cap_T = T;
    q->Rs = td_xcalloc(n * hcd, fs);
    in_alloc(&q->flat, n, hcd, q->fmts_flat);
    q->lam_raw = td_xcalloc(n * lr, fs);
    in_alloc(&q->lam, n, lr, q->fmts_lam);
    q->gam = td_xcalloc(n * hcd, fs);
    q->inj = td_xcalloc(n * hc, fs);
    in_alloc(&q->P, n, E, q->fmts_P);
    q->ple_ids = td_xcalloc(n * 8, sizeof(int32_t));
    q->ple_rows = td_xcalloc(n * 64, sizeof(int32_t));
    q->pk = td_xcalloc(n * hcd, fs);
    q->pv = td_xcalloc(n * E, fs);
    q->pg = td_xcalloc(n * hc, fs);
    q->pgv = td_xcalloc(n * hcd, fs);
    q->pnv = td_xcalloc(n * hcd, fs);
    q->pcv = td_xcalloc(n * hcd, fs);
    q->iq = td_xcalloc(n * hp->idx_heads * hp->idx_dim + 1, fs);
    q->ik = td_xcalloc(n * hp->idx_dim + 1, fs);
    q->sel = td_xcalloc(n * (size_t)q->Wmax + 1, sizeof(int32_t));
    if (!q->rc) {
        q->rc = td_xcalloc(hp->rope_dims / 2 + 1, fs);
        q->rsn = td_xcalloc(hp->rope_dims / 2 + 1, fs);
    }
    // the per-(token, row) buffers follow the new T at the next q4_kv_buffers
    q->score = NULL, q->mask = NULL;
    q->cap_kv = 0;
}

/* A sequence's token array and indexer key caches hold `need` rows. */
static void q4_seq_ensure(cpu_backend *b, cpu_q4seq *qs, int64_t need) {
    if (need <= qs->cap) return;
    const int64_t cap = need < 64 ? 64 : 2 * need;
    if (!qs->ikey) qs->ikey = td_xcalloc(b->hp.n_layer ? b->hp.n_layer : 1, sizeof(float *));
    qs->tok = td_xrealloc(qs->tok, (size_t)cap * sizeof(int32_t));
    for (uint32_t l = 0; l < b->hp.n_layer; l++)
        if (b->m->layers[l].kind == TD_LAYER_HC_QSA && b->hp.qsa_ratio[l] > 0)
            qs->ikey[l] = td_xrealloc(qs->ikey[l], (size_t)(cap * b->hp.idx_dim) * sizeof(float));
    qs->cap = cap;
}

/* Hook of cpu_forward: a->x holds the embedding rows (T, E); runs the
 * streams through every layer and leaves the final mixer's output in a->xn.x. */
static void q4_body(cpu_backend *b, const int32_t *tokens, int64_t T, int64_t pos0, td_tap_sink *sink) {
    const td_hparams *hp = &b->hp;
    cpu_q4 *q = b->q4;
    cpu_acts *a = &b->a;
    const int64_t E = hp->n_embd, hc = hp->hc, hcd = hc * E;
    cpu_q4seq *qs = &q->seqs[b->s - b->seqs];
    q4_acts_ensure(b, T);
    q4_seq_ensure(b, qs, b->s->n_kv + T > pos0 + T ? b->s->n_kv + T : pos0 + T);
    memcpy(qs->tok + pos0, tokens, (size_t)T * sizeof(int32_t));
    for (int64_t t = 0; t < T; t++)
        for (int64_t c = 0; c < hc; c++) memcpy(q->Rs + t * hcd + c * E, a->x + t * E, (size_t)E * sizeof(float));
    if (hp->ple_layer >= 0) q4_ple_inputs(b, T, pos0, sink);

    for (uint32_t il = 0; il < hp->n_layer; il++) {
        const int l = (int)il;
        const td_layer *L = &b->m->layers[l];
        const cpu_q4layer *QL = &q->layers[l];
        if (l == hp->ple_layer) q4_ple_block(b, l, T, sink);
        q4_hc_mix(b, &L->hc_attn, QL->hc_attn_g, T, a->xn.x);
        tap2(sink, l, "hc_attn_gate", q->gam, T, hcd);
        tap2(sink, l, "hc_attn_inject", q->inj, T, hc);
        tap2(sink, l, "attn_norm", a->xn.x, T, E);
        in_prepare(b, &a->xn, 0, T);
        if (L->kind == TD_LAYER_HC_GDN) gdn_mixer(b, l, T, sink); // its form: gdn_form (cpu.c)
        else q4_qsa_block(b, l, T, pos0, sink);
        q4_hc_combine(b, a->proj, T, b->fault == TD_FAULT_HC_INJECT_STREAM);
        tap2(sink, l, "ffn_inp", q->Rs, T, hcd);

        q4_hc_mix(b, &L->hc_ffn, QL->hc_ffn_g, T, a->xn.x);
        tap2(sink, l, "hc_ffn_gate", q->gam, T, hcd);
        tap2(sink, l, "hc_ffn_inject", q->inj, T, hc);
        tap2(sink, l, "ffn_norm", a->xn.x, T, E);
        in_prepare(b, &a->xn, 0, T);
        ffn_moe(b, l, T, sink);
        ffn_shared_expert(b, l, T, sink);
        tap2(sink, l, "ffn_out", a->proj, T, E);
        q4_hc_combine(b, a->proj, T, 0);
        tap2(sink, l, "out", q->Rs, T, hcd);
    }
    q4_hc_mix(b, &b->m->hc_out, q->out_g, T, a->xn.x);
    tap2(sink, -1, "out.hc_gate", q->gam, T, hcd);
    tap2(sink, -1, "out.norm", a->xn.x, T, E);
}

/* ===================================================================== */
/* Open, state operations, close                                          */
/* ===================================================================== */

/* an {E, hc} gamma (or the same values flat {hc*E}) as hc*E floats, stream-major */
static int q4_gamma(const cpu_backend *b, float **out, const td_tensor *t, const char *what, int l, td_err *err) {
    const int64_t E = b->hp.n_embd, hc = b->hp.hc, hcd = hc * E;
    *out = NULL;
    if (!t) return td_err_set(err, TD_EINPUT, NAME ": layer %d lacks %s", l, what);
    const int flat = t->ne[0] == hcd;
    int rc = check_matrix(&b->k, t, what, l, flat ? hcd : E, flat ? 1 : hc, err);
    if (rc) return rc;
    *out = td_xmalloc((size_t)hcd * sizeof(float));
    for (int64_t c = 0; c < (flat ? 1 : hc); c++)
        b->k.type[t->type].to_f32(t->type, td_tensor_row(t, (uint64_t)c), *out + c * E, flat ? hcd : E);
    return TD_OK;
}

static int q4_check_hc(const cpu_backend *b, const td_hc_parts *P, int l, td_err *err) {
    const int64_t hcd = (int64_t)b->hp.hc * b->hp.n_embd, lr = b->hp.hc_lr;
    int rc;
    if ((rc = check_matrix(&b->k, P->down, "hc_down", l, hcd, lr, err))) return rc;
    if ((rc = check_matrix(&b->k, P->up, "hc_up", l, lr, hcd, err))) return rc;
    if (P->inject && (rc = check_matrix(&b->k, P->inject, "hc_inject", l, hcd, b->hp.hc, err))) return rc;
    return TD_OK;
}

/* Hook of load_model: every qwen4exp tensor the forward reads, checked and
 * its small vectors decoded. */
static int q4_load(cpu_backend *b, td_err *err) {
    const td_model *m = b->m;
    const td_hparams *hp = &b->hp;
    const td_cpu_kernels *k = &b->k;
    const int64_t E = hp->n_embd, H = hp->n_head, Hkv = hp->n_head_kv, D = hp->head_dim, F = hp->n_ff;
    const int64_t X = hp->n_expert, HD = H * D, KD = Hkv * D, hcd = (int64_t)hp->hc * E, Fs = hp->n_ff_shexp;
    int rc;
    if (hp->hc < 2 || hp->hc_lr < 1)
        return td_err_set(err, TD_EINPUT, NAME ": qwen4exp with %u streams of rank %u", hp->hc, hp->hc_lr);
    if (hp->rope_scaling == TD_ROPE_SCALING_YARN)
        return td_err_set(err, TD_EINPUT, NAME ": qwen4exp's IMROPE with YaRN scaling is not supported");
    cpu_q4 *q = b->q4 = td_xcalloc(1, sizeof *q);
    q->layers = td_xcalloc(hp->n_layer ? hp->n_layer : 1, sizeof *q->layers);
    b->layers = td_xcalloc(hp->n_layer ? hp->n_layer : 1, sizeof *b->layers);
    if ((rc = q4_gamma(b, &q->out_g, m->hc_out.norm, "output_hc_norm", -1, err))) return rc;
    if ((rc = q4_check_hc(b, &m->hc_out, -1, err))) return rc;
    if (hp->ple_layer >= 0 &&
        (rc = check_matrix(k, m->ple_table, "per_layer_token_embd", -1, hp->ple_dim, (int64_t)hp->ple_rows, err)))
        return rc;
    for (uint32_t i = 0; i < hp->n_layer; i++) {
        const td_layer *L = &m->layers[i];
        cpu_layer *C = &b->layers[i];
        cpu_q4layer *Q = &q->layers[i];
        const int l = (int)i;
        if ((rc = q4_gamma(b, &Q->hc_attn_g, L->hc_attn.norm, "hc_attn_norm", l, err))) return rc;
        if ((rc = q4_gamma(b, &Q->hc_ffn_g, L->hc_ffn.norm, "hc_ffn_norm", l, err))) return rc;
        if ((rc = q4_check_hc(b, &L->hc_attn, l, err)) || (rc = q4_check_hc(b, &L->hc_ffn, l, err))) return rc;
        if (L->kind == TD_LAYER_HC_GDN) {
            if ((rc = gdn_open_layer(b, l, err))) return rc;
        } else {
            const int64_t di = hp->idx_dim;
            if ((rc = check_matrix(k, L->attn.wq, "attn_q", l, E, 2 * HD, err))) return rc;
            if ((rc = check_matrix(k, L->attn.wk, "attn_k", l, E, KD, err))) return rc;
            if ((rc = check_matrix(k, L->attn.wv, "attn_v", l, E, KD, err))) return rc;
            if ((rc = check_matrix(k, L->attn.wo, "attn_output", l, HD, E, err))) return rc;
            if ((rc = load_vec(k, &C->q_norm, L->attn.q_norm, "attn_q_norm", l, 0, D, err))) return rc;
            if ((rc = load_vec(k, &C->k_norm, L->attn.k_norm, "attn_k_norm", l, 0, D, err))) return rc;
            if (!C->q_norm || !C->k_norm)
                return td_err_set(err, TD_EINPUT, NAME ": layer %d lacks attn_q_norm or attn_k_norm", l);
            if (hp->qsa_ratio[i] > 0) {
                if (hp->idx_heads < 1 || di < (int64_t)hp->rope_dims)
                    return td_err_set(err, TD_EINPUT, NAME ": layer %d: indexer of %u heads of %lld dims", l,
                                      hp->idx_heads, (long long)di);
                if ((rc = check_matrix(k, L->qsa.wq, "indexer.q_proj", l, E, hp->idx_heads * di, err))) return rc;
                if ((rc = check_matrix(k, L->qsa.wk, "indexer.k_proj", l, E, di, err))) return rc;
                if ((rc = load_vec(k, &Q->iq_norm, L->qsa.q_norm, "indexer.q_norm", l, 0, di, err))) return rc;
                if ((rc = load_vec(k, &Q->ik_norm, L->qsa.k_norm, "indexer.k_norm", l, 0, di, err))) return rc;
                if (!Q->iq_norm || !Q->ik_norm)
                    return td_err_set(err, TD_EINPUT, NAME ": layer %d lacks the indexer norms", l);
                const int64_t W = (int64_t)hp->idx_topk + hp->qsa_ratio[i] - 1;
                if (W > q->Wmax) q->Wmax = W;
            }
        }
        if (l == hp->ple_layer) {
            const td_ple_parts *P = &L->ple;
            const int64_t Kp = hp->ple_conv;
            if ((rc = check_matrix(k, P->key, "ple_key", l, E, hcd, err))) return rc;
            if ((rc = check_matrix(k, P->value, "ple_value", l, E, E, err))) return rc;
            if ((rc = check_matrix(k, P->conv, "ple_conv1d", l, Kp, hcd, err))) return rc;
            if ((rc = q4_gamma(b, &Q->ple_nk, P->norm_key, "ple_norm_key", l, err))) return rc;
            if ((rc = q4_gamma(b, &Q->ple_nq, P->norm_query, "ple_norm_query", l, err))) return rc;
            if ((rc = q4_gamma(b, &Q->ple_nc, P->norm_conv, "ple_norm_conv", l, err))) return rc;
            Q->ple_conv = td_xmalloc((size_t)(hcd * Kp) * sizeof(float));
            for (int64_t ch = 0; ch < hcd; ch++)
                k->type[P->conv->type].to_f32(P->conv->type, td_tensor_row(P->conv, (uint64_t)ch),
                                              Q->ple_conv + ch * Kp, Kp);
        }
        if (!L->ffn.gate_inp || !L->ffn.gate_inp_shexp || X < 1)
            return td_err_set(err, TD_EINPUT, NAME ": layer %d lacks the MoE router or the shared-expert gate", l);
        if ((rc = check_moe(k, L, l, E, X, F, 1, err)) || (rc = load_shexp(k, C, L, l, E, Fs, err))) return rc;
    }
    return TD_OK;
}

/* Hook of plan_formats: the act-q8 forms of qwen4exp's own matmul inputs. */
static void q4_plan_formats(cpu_backend *b) {
    if (!is_q4(b)) return;
    cpu_q4 *q = b->q4;
    const td_model *m = b->m;
#define FMT(t) ((t) ? act_fmt(b, (t)->type) : 0u)
    q->fmts_flat = FMT(m->hc_out.down);
    q->fmts_lam = FMT(m->hc_out.up);
    for (uint32_t i = 0; i < b->hp.n_layer; i++) {
        const td_layer *L = &m->layers[i];
        q->fmts_flat |= FMT(L->hc_attn.down) | FMT(L->hc_attn.inject) | FMT(L->hc_ffn.down) | FMT(L->hc_ffn.inject);
        q->fmts_lam |= FMT(L->hc_attn.up) | FMT(L->hc_ffn.up);
        q->fmts_P |= FMT(L->ple.key) | FMT(L->ple.value);
        b->fmts_xn |= FMT(L->gdn.wbeta) | FMT(L->gdn.walpha) | FMT(L->qsa.wq) | FMT(L->qsa.wk);
    }
#undef FMT
}

/* Hook of cpu_open, after the GDN state's layout: the PLE conv history joins
 * the recurrent state (snapshots and copies then cover it), and the widest
 * matmul input is the stream stack. */
static void q4_open(cpu_backend *b) {
    if (!is_q4(b)) return;
    const td_hparams *hp = &b->hp;
    cpu_q4 *q = b->q4;
    const int64_t hcd = (int64_t)hp->hc * hp->n_embd;
    if (hp->ple_layer >= 0) {
        q->ple_hist = (int64_t)(hp->ple_conv - 1) * hp->ple_ngram;
        q->rs_ple = b->rs_n;
        b->rs_n += q->ple_hist * hcd + 1; // +1: a one-tap conv keeps no history
    }
    if (hcd > b->max_in) b->max_in = hcd;
}

/* Hook of cpu_seq_cp: the token array and the indexer keys of `rows` rows. */
static void q4_seq_cp(cpu_backend *b, int src, int dst, int64_t rows) {
    if (!is_q4(b)) return;
    cpu_q4 *q = b->q4;
    cpu_q4seq *s = &q->seqs[src], *d = &q->seqs[dst];
    if (!rows || !s->cap) return;
    q4_seq_ensure(b, d, rows);
    memcpy(d->tok, s->tok, (size_t)rows * sizeof(int32_t));
    // qsa_copy_no_indexer: the copy's indexer keys stay zero (an empty cache)
    const int skip = b->fault == TD_FAULT_QSA_COPY_NO_IKEY;
    for (uint32_t l = 0; l < b->hp.n_layer; l++)
        if (s->ikey[l]) {
            if (skip) memset(d->ikey[l], 0, (size_t)(rows * b->hp.idx_dim) * sizeof(float));
            else memcpy(d->ikey[l], s->ikey[l], (size_t)(rows * b->hp.idx_dim) * sizeof(float));
        }
}

static void q4_free(cpu_backend *b) {
    cpu_q4 *q = b->q4;
    if (!q) return;
    for (uint32_t l = 0; q->layers && l < b->hp.n_layer; l++) {
        cpu_q4layer *Q = &q->layers[l];
        free(Q->hc_attn_g), free(Q->hc_ffn_g), free(Q->ple_nk), free(Q->ple_nq), free(Q->ple_nc), free(Q->ple_conv);
        free(Q->iq_norm), free(Q->ik_norm);
    }
    for (int i = 0; i < TD_SEQ_MAX; i++) {
        cpu_q4seq *s = &q->seqs[i];
        for (uint32_t l = 0; s->ikey && l < b->hp.n_layer; l++) free(s->ikey[l]);
        free(s->ikey), free(s->tok);
    }
    free(q->layers), free(q->out_g);
    free(q->Rs), free(q->lam_raw), free(q->gam), free(q->inj), free(q->ple_ids), free(q->ple_rows);
    free(q->pk), free(q->pv), free(q->pg), free(q->pgv), free(q->pnv), free(q->pcv), free(q->iq), free(q->ik);
    free(q->sel), free(q->score), free(q->mask), free(q->bkey), free(q->rc), free(q->rsn);
    in_free(&q->flat), in_free(&q->lam), in_free(&q->P);
    free(q);
    b->q4 = NULL;
}
