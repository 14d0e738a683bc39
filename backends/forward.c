/* tapdiff: the forward contract every backend shares (forward.h). */
#include "forward.h"

#include <math.h>
#include <string.h>

/* ===================================================================== */
/* Token history                                                          */
/* ===================================================================== */

void td_hist_tap(const td_hist *h, td_tap_sink *sink) {
    const int64_t shape[1] = {h->n};
    TD_TAP(sink, -1, "hist.tokens", TD_DT_I64, h->ids, 1, shape);
}

/* ===================================================================== */
/* Step checks and input taps                                             */
/* ===================================================================== */

int td_fwd_check_step(const char *name, const int32_t *tokens, int64_t T, int64_t pos0, int64_t n_past,
                      int64_t n_ctx, int64_t n_vocab, td_err *err) {
    if (T < 1) return td_err_set(err, TD_EINPUT, "%s: a forward needs at least one token, got %lld", name, (long long)T);
    if (pos0 != n_past)
        return td_err_set(err, TD_EINPUT,
                          "%s: positions must continue the sequence: expected pos0 = %lld, got %lld "
                          "(reset to start a new sequence)",
                          name, (long long)n_past, (long long)pos0);
    if (pos0 + T > n_ctx)
        return td_err_set(err, TD_EINPUT, "%s: KV cache holds %lld positions (n_ctx); this step needs positions %lld..%lld",
                          name, (long long)n_ctx, (long long)pos0, (long long)(pos0 + T - 1));
    for (int64_t t = 0; t < T; t++)
        if (tokens[t] < 0 || tokens[t] >= n_vocab)
            return td_err_set(err, TD_EINPUT, "%s: token %lld of the step is id %d; the vocabulary has %lld ids", name,
                              (long long)t, tokens[t], (long long)n_vocab);
    return TD_OK;
}

void td_fwd_tap_inputs(td_tap_sink *sink, const int32_t *tokens, int64_t T, int64_t pos0, int32_t *pos32) {
    for (int64_t t = 0; t < T; t++) pos32[t] = (int32_t)(pos0 + t);
    const int64_t shape[1] = {T};
    TD_TAP(sink, -1, "inp.tokens", TD_DT_I32, tokens, 1, shape);
    TD_TAP(sink, -1, "inp.pos", TD_DT_I32, pos32, 1, shape);
}

int td_fwd_check_layers(const char *name, unsigned kinds, const td_model *m, td_err *err) {
    for (uint32_t il = 0; il < m->hp.n_layer; il++) {
        const td_layer_kind k = m->layers[il].kind;
        if (k >= TD_LAYER_KIND_COUNT || !(kinds & TD_KINDS(k)))
            return td_err_set(err, TD_EINPUT,
                              "%s: architecture %s is not supported: block %u is a %s layer, which this backend does "
                              "not implement",
                              name, td_arch_name(m->hp.arch), il, td_layer_kind_name(k));
    }
    return TD_OK;
}

int td_fwd_check_model(const char *name, unsigned kinds, const td_model *m, td_err *err) {
    int rc = td_fwd_check_layers(name, kinds, m, err);
    if (rc) return rc;
    const td_hparams *hp = &m->hp;
    const int64_t E = hp->n_embd, H = hp->n_head, Hkv = hp->n_head_kv, D = hp->head_dim, V = hp->n_vocab;
    const int64_t X = hp->n_expert, K = hp->n_expert_used;
    if (E < 1 || H < 1 || Hkv < 1 || D < 1 || V < 1 || H % Hkv)
        return td_err_set(err, TD_EINPUT, "%s: bad hyper-parameters: E=%lld H=%lld Hkv=%lld D=%lld V=%lld (Hkv must divide H)",
                          name, (long long)E, (long long)H, (long long)Hkv, (long long)D, (long long)V);
    if (hp->rope_dims % 2 || hp->rope_dims > hp->head_dim)
        return td_err_set(err, TD_EINPUT, "%s: rope dims R=%u must be even and <= head dim %lld", name, hp->rope_dims,
                          (long long)D);
    if (X > 0 && (K < 1 || K > X))
        return td_err_set(err, TD_EINPUT, "%s: expert_used_count %lld must be in 1..expert_count %lld", name,
                          (long long)K, (long long)X);
    return TD_OK;
}

int td_fwd_check_matrix(const char *name, const td_tensor *t, const char *what, int l, int64_t n_in, int64_t n_rows,
                        td_err *err) {
    if (!t && l < 0) return td_err_set(err, TD_EINPUT, "%s: the model has no %s tensor", name, what);
    if (!t) return td_err_set(err, TD_EINPUT, "%s: layer %d has no %s tensor", name, l, what);
    if (t->ne[0] != n_in || t->n_rows < (uint64_t)n_rows)
        return td_err_set(err, TD_EINPUT,
                          "%s: tensor %s: expected rows of %lld values, at least %lld rows; found ne[0] = %lld, %llu rows",
                          name, t->cname, (long long)n_in, (long long)n_rows, (long long)t->ne[0],
                          (unsigned long long)t->n_rows);
    return TD_OK;
}

/* ===================================================================== */
/* MoE routing                                                            */
/* ===================================================================== */

/* One body for both precisions: the rule is the same, only `real` differs. */
#define MOE_ROUTE_BODY(real)                                                                                         \
    do {                                                                                                             \
        /* K passes of "largest not yet chosen". The scan is in ascending index and only a STRICTLY larger value    \
         * replaces the current best, so among equal probabilities the lower expert index ranks first. */           \
        const int tie_high = (flags & TD_ROUTE_TIE_HIGH) != 0;                                                       \
        for (int64_t j = 0; j < K; j++) {                                                                            \
            int64_t best = -1;                                                                                       \
            for (int64_t e = 0; e < X; e++) {                                                                        \
                int taken = 0;                                                                                       \
                for (int64_t i = 0; i < j; i++) taken |= topk[i] == e;                                               \
                if (taken) continue;                                                                                 \
                if (best < 0 || probs[e] > probs[best] || (tie_high && probs[e] == probs[best])) best = e;           \
            }                                                                                                        \
            topk[j] = (int32_t)best;                                                                                 \
        }                                                                                                            \
        /* renormalise the selected probabilities; the clamp only matters when they sum to almost nothing */         \
        real sum = 0;                                                                                                \
        for (int64_t j = 0; j < K; j++) sum += probs[topk[j]];                                                       \
        const real z = (flags & TD_ROUTE_NO_RENORM) ? (real)1 : sum > (real)0x1p-14 ? sum : (real)0x1p-14;           \
        for (int64_t j = 0; j < K; j++) weights[j] = probs[topk[j]] / z;                                             \
    } while (0)

void td_moe_route_f64(int32_t *topk, double *weights, const double *probs, int64_t X, int64_t K, unsigned flags) {
    MOE_ROUTE_BODY(double);
}

void td_moe_route_f32(int32_t *topk, float *weights, const float *probs, int64_t X, int64_t K, unsigned flags) {
    MOE_ROUTE_BODY(float);
}

/* YaRN's correction dimension for beta rotations over the original context */
static double yarn_corr_dim(double beta, const td_hparams *hp) {
    return (double)hp->rope_dims * log((double)hp->rope_n_ctx_orig / (2 * M_PI * beta)) /
           (2 * log((double)hp->rope_base));
}

void td_fwd_rope_tables(const td_hparams *hp, int64_t span, const float *ff, int64_t T, int64_t pos0, float *c,
                        float *s) {
    const int64_t half = span / 2;
    const int yarn = hp->rope_scaling == TD_ROPE_SCALING_YARN;
    const double freq_scale = hp->rope_scaling == TD_ROPE_SCALING_NONE ? 1.0 : (double)hp->rope_freq_scale;
    double m = hp->rope_attn_factor, lo = 0, hi = 0;
    if (yarn) {
        const double factor = 1 / freq_scale;
        if (factor > 1) m *= 1 + 0.1 * log(factor);
        lo = floor(yarn_corr_dim(32, hp)); // beta_fast
        if (lo < 0) lo = 0;
        hi = ceil(yarn_corr_dim(1, hp)); // beta_slow
        if (hi > (double)(hp->rope_dims - 1)) hi = (double)(hp->rope_dims - 1);
    }
    for (int64_t i = 0; i < half; i++) {
        const double omega = pow((double)hp->rope_base, -(double)(2 * i) / (double)span);
        double mix = 0;
        if (yarn) {
            const double width = hi - lo < 0.001 ? 0.001 : hi - lo;
            double r = ((double)i - lo) / width;
            r = r < 0 ? 0 : r > 1 ? 1 : r;
            mix = 1 - r;
        }
        for (int64_t t = 0; t < T; t++) {
            double extrap = (double)(pos0 + t) * omega;
            if (ff) extrap /= ff[i];
            const double interp = freq_scale * extrap;
            const double theta = yarn ? interp * (1 - mix) + extrap * mix : interp;
            c[t * half + i] = (float)(m * cos(theta));
            s[t * half + i] = (float)(m * sin(theta));
        }
    }
}
