/* tapdiff: the forward contract every backend shares (ref, ref32, cpu,
 * llamacpp, and the ones to come). What a step must check, the input taps
 * and the token history it must emit, and the MoE routing rule, written once
 * so that two backends can only differ where their arithmetic does.
 *
 * A backend's forward does, in this order:
 *   td_fwd_check_step      refuse a bad step before touching any state;
 *   td_fwd_tap_inputs      inp.tokens and inp.pos (the ids it really consumes);
 *   ... its own computation (MoE layers route with td_moe_route_*) ...;
 *   td_hist_push + td_hist_tap   after the step succeeded: hist.tokens.
 * At open, td_fwd_check_layers refuses a model with a layer kind the backend
 * does not implement (its td_backend_vt.layer_kinds).
 * A library: no printing, no exit(). */
#ifndef TD_FORWARD_H
#define TD_FORWARD_H

#include <stdint.h>

#include "backend.h"
#include "hist.h"

#ifdef __cplusplus
extern "C" {
#endif

/* td_hist, td_hist_reset and td_hist_push: taps/hist.h. */
/* hist.tokens: i64 [n], n <= W. */
void td_hist_tap(const td_hist *h, td_tap_sink *sink);

/* A step of T tokens at positions pos0.. on a backend named `name` that has
 * consumed n_past positions, holds n_ctx and knows n_vocab ids: TD_EINPUT
 * with one line naming the backend when T < 1, the positions do not continue
 * the sequence, they overflow n_ctx, or an id is outside the vocabulary. */
int td_fwd_check_step(const char *name, const int32_t *tokens, int64_t T, int64_t pos0, int64_t n_past,
                      int64_t n_ctx, int64_t n_vocab, td_err *err);

/* inp.tokens (i32 [T]) = tokens and inp.pos (i32 [T]) = pos0.. ; pos32 is
 * scratch of T values (filled with the positions). */
void td_fwd_tap_inputs(td_tap_sink *sink, const int32_t *tokens, int64_t T, int64_t pos0, int32_t *pos32);

/* 1 << kind for each td_layer_kind a backend implements. */
#define TD_KINDS(k) (1u << (k))

/* TD_EINPUT naming the first layer whose kind is not in `kinds`. */
int td_fwd_check_layers(const char *name, unsigned kinds, const td_model *m, td_err *err);

/* What every forward relies on, so that a model built by other code than the
 * loader fails with a message rather than an assertion: the layer kinds
 * (above), E, H, Hkv, D, V >= 1 with Hkv dividing H, an even R <= D, and
 * 1 <= K <= X for an MoE. */
int td_fwd_check_model(const char *name, unsigned kinds, const td_model *m, td_err *err);

/* A matrix the forward reads: present (layer l, or the model when l < 0),
 * rows of n_in values, at least n_rows rows. */
int td_fwd_check_matrix(const char *name, const td_tensor *t, const char *what, int l, int64_t n_in, int64_t n_rows,
                        td_err *err);

/* ---- MoE routing (primitives §5) ---------------------------------------
 * topk (K) = indices of the K largest probs (X), largest first; among EQUAL
 * probabilities the LOWER expert index ranks first (what a stable descending
 * sort gives; llama.cpp leaves this order unspecified). weights (K) =
 * probs[topk] / max(sum, 2^-14), the sum taken in rank order.
 * `flags` are 0 in every honest run; the fault catalog (faults.h) uses them
 * to route with one named bug. */
enum {
    TD_ROUTE_TIE_HIGH = 1u << 0,  /* router_tiebreak: a later (higher) index wins an exact tie */
    TD_ROUTE_NO_RENORM = 1u << 1, /* moe_no_renorm: weights = probs[topk], not renormalised */
};
void td_moe_route_f64(int32_t *topk, double *weights, const double *probs, int64_t X, int64_t K, unsigned flags);
void td_moe_route_f32(int32_t *topk, float *weights, const float *probs, int64_t X, int64_t K, unsigned flags);

/* The RoPE tables of a step of T tokens at positions pos0..: c and s
 * (T, span/2) = m cos(theta), m sin(theta), each computed in double and
 * rounded once to float (primitives §2, §2.3: every RoPE mode and scaling,
 * YaRN included, is in these tables; a kernel only rotates). span: the
 * rotated dims (hp->rope_dims, unless a fault widens it); ff: the
 * rope_freqs divisors (span/2 of them) or NULL. */
void td_fwd_rope_tables(const td_hparams *hp, int64_t span, const float *ff, int64_t T, int64_t pos0, float *c,
                        float *s);

#ifdef __cplusplus
}
#endif
#endif
