/* Unit tests of the reference primitives against hand-worked numbers.
 * Every expected value is written out here (cos/sin/exp constants computed
 * once by hand with a calculator / python's math module) or computed in the
 * test from the spec's formula, never taken from the code under test. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "reference.h"

/* |a - b| <= tol * max(1, |b|) */
#define assert_close(a, b, tol)                                                               \
    do {                                                                                      \
        double a_ = (a), b_ = (b);                                                            \
        cr_assert(fabs(a_ - b_) <= (tol) * fmax(1.0, fabs(b_)), "%s = %.17g, expected %.17g", \
                  #a, a_, b_);                                                                \
    } while (0)

/* ---- RoPE: D = 8, R = 4 < D, base 10000 -------------------------------- */
/* omega_0 = 10000^0 = 1, omega_1 = 10000^(-2/4) = 0.01 */

static const double x_in[8] = {1, 2, 3, 4, 5, 6, 7, 8};

static td_ref_rope rope_cfg(td_rope_type type) {
    return (td_ref_rope){.type = type, .D = 8, .R = 4, .base = 10000, .scaling = TD_ROPE_SCALING_NONE,
                         .freq_scale = 1, .attn_factor = 1, .n_ctx_orig = 2048};
}

/* cos/sin of theta_0 = p * 1 and theta_1 = p * 0.01 at p = 1 and p = 7 */
/* rope-trig@U: ref (f64) rotates by the formed angle exactly, U ignored;
 * ref32, the control, by the angle plus d = +-U 2^-24 (1 + |theta|), the
 * bound at full size, both signs drawn among the pairs, the same for every
 * head. Recovered here from the control's output: the angle of each rotated
 * unit vector, atan2 in f64, minus the formed angle, to within the f32
 * rounding of the rotation (2^-23 rad); with U = 4096 the offsets
 * (2.4e-4 (1 + |theta|)) stand far above that. */
Test(rope, trig_rule_moves_the_control_only_within_its_bound) {
    td_ref_rope c = rope_cfg(TD_ROPE_NORM);
    c.R = 16, c.D = 16, c.angle = TD_ROPE_ANGLE_F32_POW;
    const int64_t pos = 37, U = 4096;
    double x[16];
    for (int i = 0; i < 16; i++) x[i] = i % 2 ? 0 : 1;
    td_ref_rope c64 = c;
    c64.trig_u = U;
    td_ref_rope_f64(x, pos, &c64, NULL, 1);
    float xf[32];
    for (int i = 0; i < 32; i++) xf[i] = i % 2 ? 0.0f : 1.0f;
    c.trig_u = U;
    td_ref_rope_f32(xf, pos, &c, NULL, 2);
    int up = 0, down = 0;
    for (int i = 0; i < 8; i++) {
        const double th = (double)td_rope_angle_f32(TD_ROPE_ANGLE_F32_POW, pos, i, 16, 10000.0);
        cr_expect_eq(x[2 * i], cos(th), "ref pair %d moved under rope-trig", i);
        cr_expect_eq(x[2 * i + 1], sin(th), "ref pair %d moved under rope-trig", i);
        const double b = ldexp((double)U, -24) * (1 + fabs(th));
        double d = atan2((double)xf[2 * i + 1], (double)xf[2 * i]) - th;
        d = remainder(d, 2 * M_PI);
        cr_expect_leq(fabs(fabs(d) - b), ldexp(1.0, -23), "pair %d: control off by %.3g, bound %.3g", i, d, b);
        cr_expect_eq(xf[2 * i], xf[16 + 2 * i], "pair %d: heads drew differently", i);
        cr_expect_eq(xf[2 * i + 1], xf[16 + 2 * i + 1], "pair %d: heads drew differently", i);
        up += d > 0, down += d < 0;
    }
    cr_expect(up > 0 && down > 0, "8 pairs, %d turned up and %d down: the sign is not drawn", up, down);
}

typedef struct angles {
    int64_t pos;
    double c0, s0, c1, s1;
} angles;
static const angles at_pos1 = {1, 0.5403023058681398, 0.8414709848078965, 0.9999500004166653, 0.009999833334166664};
static const angles at_pos7 = {7, 0.7539022543433046, 0.6569865987187891, 0.9975510002532796, 0.06994284733753277};

/* rotate (u, v) by the angle with cosine c and sine s */
static void rot(double *u, double *v, double c, double s) {
    double a = *u, b = *v;
    *u = a * c - b * s;
    *v = a * s + b * c;
}

static void check_rope(td_rope_type type, const angles *an) {
    td_ref_rope c = rope_cfg(type);
    double x[16]; // two heads, the second one the first negated
    for (int i = 0; i < 8; i++) x[i] = x_in[i], x[8 + i] = -x_in[i];
    td_ref_rope_f64(x, an->pos, &c, NULL, 2);

    double e[8];
    memcpy(e, x_in, sizeof e);
    if (type == TD_ROPE_NORM) { // pairs (0,1) and (2,3)
        rot(&e[0], &e[1], an->c0, an->s0);
        rot(&e[2], &e[3], an->c1, an->s1);
    } else { // NEOX: pairs (0,2) and (1,3)
        rot(&e[0], &e[2], an->c0, an->s0);
        rot(&e[1], &e[3], an->c1, an->s1);
    }
    for (int i = 0; i < 8; i++) {
        assert_close(x[i], e[i], 1e-15);
        assert_close(x[8 + i], -e[i], 1e-15);
    }
    for (int i = 4; i < 8; i++) cr_assert_eq(x[i], x_in[i], "dim %d >= R must pass unchanged", i);

    // ref32: the same rotation in float
    float xf[8];
    for (int i = 0; i < 8; i++) xf[i] = (float)x_in[i];
    td_ref_rope_f32(xf, an->pos, &c, NULL, 1);
    for (int i = 0; i < 8; i++) assert_close(xf[i], e[i], 2e-6);
}

Test(rope, pos0_is_identity) {
    for (int type = 0; type <= 2; type += 2) {
        td_ref_rope c = rope_cfg((td_rope_type)type);
        double x[8];
        memcpy(x, x_in, sizeof x);
        td_ref_rope_f64(x, 0, &c, NULL, 1);
        for (int i = 0; i < 8; i++) cr_assert_eq(x[i], x_in[i], "mode %d dim %d", type, i);
    }
}

Test(rope, norm_pos1) { check_rope(TD_ROPE_NORM, &at_pos1); }
Test(rope, norm_pos7) { check_rope(TD_ROPE_NORM, &at_pos7); }
Test(rope, neox_pos1) { check_rope(TD_ROPE_NEOX, &at_pos1); }
Test(rope, neox_pos7) { check_rope(TD_ROPE_NEOX, &at_pos7); }

/* NORM at p = 1, pair 0 by hand: (1, 2) -> (cos1 - 2 sin1, sin1 + 2 cos1) */
Test(rope, norm_pair0_by_hand) {
    td_ref_rope c = rope_cfg(TD_ROPE_NORM);
    double x[8];
    memcpy(x, x_in, sizeof x);
    td_ref_rope_f64(x, 1, &c, NULL, 1);
    assert_close(x[0], 0.5403023058681398 - 2 * 0.8414709848078965, 1e-15);  // -1.1426396637476532
    assert_close(x[1], 0.8414709848078965 + 2 * 0.5403023058681398, 1e-15);  //  1.922075596544176
}

/* Linear scaling halves the angle (freq_scale 1/2), frequency factors divide
 * it (ff_1 = 0.5 doubles pair 1's angle), attn_factor scales the magnitude of
 * the rotated dims only. At p = 2: theta_0 = 2*1/1*0.5 = 1, theta_1 =
 * 2*0.01/0.5*0.5 = 0.02. */
Test(rope, linear_scaling_freq_factors_attn_factor) {
    td_ref_rope c = rope_cfg(TD_ROPE_NEOX);
    c.scaling = TD_ROPE_SCALING_LINEAR;
    c.freq_scale = 0.5;
    c.attn_factor = 3;
    const double ff[2] = {1, 0.5};
    double x[8];
    memcpy(x, x_in, sizeof x);
    td_ref_rope_f64(x, 2, &c, ff, 1);
    double e[8];
    memcpy(e, x_in, sizeof e);
    rot(&e[0], &e[2], 0.5403023058681398, 0.8414709848078965);           // theta = 1
    rot(&e[1], &e[3], 0.9998000066665778, 0.019998666693333080);         // theta = 0.02
    for (int i = 0; i < 4; i++) assert_close(x[i], 3 * e[i], 1e-15);
    for (int i = 4; i < 8; i++) cr_assert_eq(x[i], x_in[i]);
}

/* scaling NONE ignores freq_scale (the spec forces it to 1) */
Test(rope, scaling_none_ignores_freq_scale) {
    td_ref_rope c = rope_cfg(TD_ROPE_NORM);
    c.freq_scale = 0.25;
    double x[8];
    memcpy(x, x_in, sizeof x);
    td_ref_rope_f64(x, 1, &c, NULL, 1);
    assert_close(x[0], 0.5403023058681398 - 2 * 0.8414709848078965, 1e-15);
}

/* YaRN, primitives §2.3, with the ramp evaluated here from the formula.
 * R = 8 (4 pairs), b = 10000, n_ctx_orig = 64, factor 4:
 * corr(32) = 8 ln(64/(64 pi)) / (2 ln 1e4) = -0.497... -> floor -1 -> lo = 0
 * corr(1)  = 8 ln(64/(2 pi)) / (2 ln 1e4)  =  1.00800... -> ceil 2 -> hi = 2
 * ramp_i = 1 - clamp(i/2, 0, 1) = 1, 0.5, 0, 0: pair 0 extrapolates, pair 1
 * mixes half/half, pairs 2, 3 interpolate; m = 1 + 0.1 ln 4. */
Test(rope, yarn) {
    td_ref_rope c = {.type = TD_ROPE_NEOX, .D = 8, .R = 8, .base = 10000, .scaling = TD_ROPE_SCALING_YARN,
                     .freq_scale = 0.25, .attn_factor = 1, .n_ctx_orig = 64};
    const double lo_check = floor(8 * log(64 / (2 * M_PI * 32)) / (2 * log(10000)));
    const double hi_check = ceil(8 * log(64 / (2 * M_PI * 1)) / (2 * log(10000)));
    cr_assert_eq(lo_check, -1.0); // clamped to 0 by max(0, .)
    cr_assert_eq(hi_check, 2.0);
    const double ramp[4] = {1, 0.5, 0, 0};
    const double m = 1 + 0.1 * log(4.0);
    const int64_t p = 5;
    double x[8], e[8];
    memcpy(x, x_in, sizeof x);
    memcpy(e, x_in, sizeof e);
    td_ref_rope_f64(x, p, &c, NULL, 1);
    for (int i = 0; i < 4; i++) {
        double extrap = (double)p * pow(10000, -2.0 * i / 8);
        double interp = 0.25 * extrap;
        double th = interp * (1 - ramp[i]) + extrap * ramp[i];
        rot(&e[i], &e[i + 4], cos(th), sin(th));
    }
    for (int i = 0; i < 8; i++) assert_close(x[i], m * e[i], 1e-14);
}

/* ---- RMSNorm ----------------------------------------------------------- */

Test(rmsnorm, four_vector) {
    // x = (1,2,3,4): mean of squares 30/4 = 7.5; eps 0.5 -> rms = sqrt(8) = 2.8284271247461903
    const double x[4] = {1, 2, 3, 4}, w[4] = {2, 1, 0.5, -1};
    double out[4];
    td_ref_rmsnorm_f64(out, x, w, 0.5, 4);
    const double e[4] = {0.70710678118654752, 0.70710678118654752, 0.53033008588991064, -1.4142135623730950};
    for (int i = 0; i < 4; i++) assert_close(out[i], e[i], 1e-15);
}

Test(rmsnorm, eps_inside_sqrt_of_mean) {
    // x = (3,4,0,0): mean 25/4 = 6.25. eps = 3.75 -> sqrt(10); eps outside the
    // sqrt would give 2.5 + 3.75, eps added to the sum sqrt(28.75/4).
    const double x[4] = {3, 4, 0, 0}, w[4] = {1, 1, 1, 1};
    double out[4];
    td_ref_rmsnorm_f64(out, x, w, 3.75, 4);
    assert_close(out[0], 3 / 3.1622776601683795, 1e-15);
    assert_close(out[1], 4 / 3.1622776601683795, 1e-15);
    cr_assert_eq(out[2], 0.0);
    td_ref_rmsnorm_f64(out, x, w, 0, 4); // rms 2.5 exactly
    cr_assert_eq(out[0], 1.2);
    cr_assert_eq(out[1], 1.6);
    float xf[4] = {3, 4, 0, 0}, wf[4] = {1, 1, 1, 1}, of[4];
    td_ref_rmsnorm_f32(of, xf, wf, 3.75f, 4);
    assert_close(of[1], 4 / 3.1622776601683795, 1e-7);
}

/* ---- softmax ----------------------------------------------------------- */

Test(softmax, large_inputs_do_not_overflow) {
    // softmax(1000, 1001, 1002) = (e^0, e^1, e^2) / (e^0 + e^1 + e^2)
    const double x[3] = {1000, 1001, 1002};
    const double e[3] = {0.09003057317038046, 0.24472847105479764, 0.6652409557748219};
    double out[3];
    td_ref_softmax_f64(out, x, 3);
    for (int i = 0; i < 3; i++) {
        cr_assert(isfinite(out[i]));
        assert_close(out[i], e[i], 1e-15);
    }
    float xf[3] = {1000, 1001, 1002}, of[3];
    td_ref_softmax_f32(of, xf, 3);
    for (int i = 0; i < 3; i++) assert_close(of[i], e[i], 1e-6);
    double neg[3] = {-1000, -1001, -1002}; // in place
    td_ref_softmax_f64(neg, neg, 3);
    for (int i = 0; i < 3; i++) assert_close(neg[i], e[2 - i], 1e-15);
}

Test(swiglu, by_hand) {
    // silu(1) * 2 = 2 / (1 + e^-1); silu(0) * 5 = 0; silu(-1) * 1 = -1/(1 + e)
    const double g[3] = {1, 0, -1}, u[3] = {2, 5, 1};
    double out[3];
    td_ref_swiglu_f64(out, g, u, 3);
    assert_close(out[0], 1.4621171572600098, 1e-15);
    cr_assert_eq(out[1], 0.0);
    assert_close(out[2], -0.2689414213699951, 1e-15);
}

/* ---- GQA head map ------------------------------------------------------ */

Test(gqa, head_map) {
    const int64_t want[8] = {0, 0, 0, 0, 1, 1, 1, 1};
    for (int h = 0; h < 8; h++) cr_assert_eq(td_ref_gqa_kv_head(h, 8, 2), want[h], "h = %d", h);
    for (int h = 0; h < 8; h++) cr_assert_eq(td_ref_gqa_kv_head(h, 8, 8), h);
    for (int h = 0; h < 8; h++) cr_assert_eq(td_ref_gqa_kv_head(h, 8, 1), 0);
}

/* ---- attention: two positions, D = 2 ----------------------------------- */
/* k0 = (1,0), v0 = (1,2); k1 = (0,1), v1 = (3,4); c = 1/sqrt(2).
 * Token at p = 0, q = (1,1): sees only position 0 -> v0.
 * Token at p = 1, q = (2,0): scores (2c, 0) = (sqrt2, 0);
 * alpha0 = 1/(1 + e^-sqrt2) = 0.8044296825069569, alpha1 = 0.1955703174930431;
 * out = alpha0 v0 + alpha1 v1. */
static const double a0 = 0.8044296825069569, a1 = 0.1955703174930431;

Test(attention, two_positions) {
    const double k[4] = {1, 0, 0, 1}, v[4] = {1, 2, 3, 4};
    const double q[4] = {1, 1, 2, 0};
    const int64_t pos[2] = {0, 1};
    double out[4], att[2];
    td_ref_attention_f64(out, q, k, v, pos, att, 2, 1, 1, 2);
    assert_close(out[0], 1, 1e-15);
    assert_close(out[1], 2, 1e-15);
    assert_close(out[2], a0 * 1 + a1 * 3, 1e-15);
    assert_close(out[3], a0 * 2 + a1 * 4, 1e-15);

    // the second token alone (a decode step at p = 1 over the same cache)
    double out1[2];
    td_ref_attention_f64(out1, q + 2, k, v, pos + 1, att, 1, 1, 1, 2);
    assert_close(out1[0], a0 * 1 + a1 * 3, 1e-15);
    assert_close(out1[1], a0 * 2 + a1 * 4, 1e-15);
}

/* H = 2 query heads over Hkv = 1: both heads read the same K/V. H = 2 over
 * Hkv = 2: head 1 reads the second KV head, here (k, v) with the rows swapped. */
Test(attention, gqa_sharing) {
    const double k[4] = {1, 0, 0, 1}, v[4] = {1, 2, 3, 4};
    const double q[4] = {2, 0, 0, 2}; // head 0 = (2,0), head 1 = (0,2)
    const int64_t pos[1] = {1};
    double out[4], att[2];
    td_ref_attention_f64(out, q, k, v, pos, att, 1, 2, 1, 2);
    assert_close(out[0], a0 * 1 + a1 * 3, 1e-15); // head 0 favours position 0
    assert_close(out[1], a0 * 2 + a1 * 4, 1e-15);
    assert_close(out[2], a1 * 1 + a0 * 3, 1e-15); // head 1 favours position 1
    assert_close(out[3], a1 * 2 + a0 * 4, 1e-15);

    // two KV heads: cache rows (pos, Hkv*D); head g=1 holds keys (0,1)/(1,0)
    const double k2[8] = {1, 0, 0, 1, 0, 1, 1, 0}, v2[8] = {1, 2, 10, 20, 3, 4, 30, 40};
    const double qq[4] = {2, 0, 2, 0};
    td_ref_attention_f64(out, qq, k2, v2, pos, att, 1, 2, 2, 2);
    assert_close(out[0], a0 * 1 + a1 * 3, 1e-15);
    assert_close(out[2], a1 * 10 + a0 * 30, 1e-15);
    assert_close(out[3], a1 * 20 + a0 * 40, 1e-15);
}

/* ---- MoE routing ------------------------------------------------------- */

Test(moe, topk_order_and_renormalisation) {
    const double p[4] = {0.1, 0.5, 0.2, 0.2};
    int32_t tk[3];
    double w[3];
    td_ref_moe_route_f64(tk, w, p, 4, 3);
    cr_assert(tk[0] == 1 && tk[1] == 2 && tk[2] == 3, "topk = %d %d %d", tk[0], tk[1], tk[2]);
    assert_close(w[0], 0.5 / 0.9, 1e-15);
    assert_close(w[1], 0.2 / 0.9, 1e-15);
    assert_close(w[2], 0.2 / 0.9, 1e-15);
}

Test(moe, ties_go_to_the_lower_index) {
    const double p[4] = {0.1, 0.3, 0.3, 0.3};
    int32_t tk[2];
    double w[2];
    td_ref_moe_route_f64(tk, w, p, 4, 2);
    cr_assert(tk[0] == 1 && tk[1] == 2, "topk = %d %d", tk[0], tk[1]);
    assert_close(w[0], 0.5, 1e-15);
    assert_close(w[1], 0.5, 1e-15);

    const double q[4] = {0.25, 0.25, 0.25, 0.25};
    int32_t t4[4];
    double w4[4];
    td_ref_moe_route_f64(t4, w4, q, 4, 4);
    for (int j = 0; j < 4; j++) cr_assert_eq(t4[j], j);

    const float pf[4] = {0.4f, 0.1f, 0.4f, 0.1f};
    int32_t tf[3];
    float wf[3];
    td_ref_moe_route_f32(tf, wf, pf, 4, 3);
    cr_assert(tf[0] == 0 && tf[1] == 2 && tf[2] == 1, "topk = %d %d %d", tf[0], tf[1], tf[2]);
}

Test(moe, clamp_2_pow_minus_14) {
    // selected sum 3e-5 < 2^-14 = 6.103515625e-5: divide by 2^-14 (x 16384)
    const double p[4] = {1e-5, 2e-5, 0, 0};
    int32_t tk[2];
    double w[2];
    td_ref_moe_route_f64(tk, w, p, 4, 2);
    cr_assert(tk[0] == 1 && tk[1] == 0);
    assert_close(w[0], 2e-5 * 16384, 1e-15); // 0.32768
    assert_close(w[1], 1e-5 * 16384, 1e-15); // 0.16384
    // just above the clamp: divide by the sum
    const double r[2] = {4e-5, 3e-5};
    td_ref_moe_route_f64(tk, w, r, 2, 2);
    assert_close(w[0], 4.0 / 7.0, 1e-15);
    assert_close(w[1], 3.0 / 7.0, 1e-15);
}

/* ---- Arithmetic profile act-q8: activation rounding -------------------- */
/* Hand-worked blocks (reference.h gives the formulas; quants.md §8 which
 * format each weight type uses). */

/* Q8_0 with max|x| = 127: d = 1 exactly (f16 1.0), codes = rint(x): ties go
 * to the even code, and the largest magnitude maps to +-127. */
Test(act_q8, q8_0_unit_scale_ties_to_even) {
    float x[32] = {0}, y[32];
    x[0] = 127, x[1] = -127, x[2] = 3.5f, x[3] = 2.5f, x[4] = -2.5f, x[5] = 1.4f, x[6] = 126.6f, x[7] = -0.5f;
    x[8] = 0.5f, x[9] = 1.5f, x[31] = -64.49f;
    const float want[32] = {127, -127, 4, 2, -2, 1, 127, -0.0f, 0, 2, [31] = -64};
    td_act_round_f32(y, x, 32, TD_ACT_Q8_0);
    for (int j = 0; j < 32; j++) cr_assert_eq(y[j], want[j], "y[%d] = %.9g, expected %.9g", j, y[j], want[j]);
}

/* Q8_0 with max|x| = 1: d = 1/127 = 0.0078740157.., stored as f16:
 * 2^-7 * (1 + m/1024) with m = round(0.0078740157/2^-7 - 1) * 1024 = round(8.063) = 8,
 * so f16(d) = 0.00787353515625. Codes use 127/a = 127: x = 1 -> 127,
 * x = 0.5 -> 63.5 -> 64, x = -0.25 -> -31.75 -> -32, x = 0.1 -> 12.7 -> 13. */
Test(act_q8, q8_0_f16_scale) {
    float x[64] = {0}, y[64];
    x[0] = 1, x[1] = 0.5f, x[2] = -0.25f, x[3] = 0.1f;
    x[32] = 0; // second block: all zero -> all zero (no division by zero)
    const double d = 0.00787353515625;
    td_act_round_f32(y, x, 64, TD_ACT_Q8_0);
    cr_assert_eq(y[0], (float)(127 * d));
    cr_assert_eq(y[1], (float)(64 * d));
    cr_assert_eq(y[2], (float)(-32 * d));
    cr_assert_eq(y[3], (float)(13 * d));
    for (int j = 32; j < 64; j++) cr_assert_eq(y[j], 0.0f, "zero block: y[%d] = %g", j, y[j]);
    // Q8_1 (Q4_1 / Q5_1 weights) sees the same values
    float z[64];
    td_act_round_f32(z, x, 64, TD_ACT_Q8_1);
    cr_assert_eq(memcmp(y, z, sizeof y), 0);
}

/* Q8_K: one block of 256, scale s = -127/m with m the FIRST value of largest
 * magnitude (here -2 at index 5, before +2 at index 9): s = 63.5, d = 1/63.5.
 * x = -2 -> -127, 2 -> 127, 1 -> 63.5 -> 64 (even), 0.5 -> 31.75 -> 32,
 * -1 -> -63.5 -> -64. Values d*q, d and the product in f32. */
Test(act_q8, q8_k_block) {
    float x[256] = {0}, y[256];
    x[5] = -2, x[9] = 2, x[10] = 1, x[11] = 0.5f, x[12] = -1, x[255] = 0.01f; // 0.635 -> 1
    const float d = 1.0f / 63.5f;
    td_act_round_f32(y, x, 256, TD_ACT_Q8_K);
    cr_assert_eq(y[5], d * -127);
    cr_assert_eq(y[9], d * 127);
    cr_assert_eq(y[10], d * 64);
    cr_assert_eq(y[11], d * 32);
    cr_assert_eq(y[12], d * -64);
    cr_assert_eq(y[255], d * 1);
    cr_assert_eq(y[0], 0.0f);
    // the largest magnitude positive first: s = -63.5, codes change sign, values do not
    // (so which of two equal magnitudes sets the sign is invisible in the values)
    float x2[256] = {0}, y2[256];
    x2[0] = 2, x2[1] = 1, x2[2] = -2;
    td_act_round_f32(y2, x2, 256, TD_ACT_Q8_K);
    cr_assert_eq(y2[0], (1.0f / -63.5f) * -127);
    cr_assert_eq(y2[1], (1.0f / -63.5f) * -64);
    cr_assert_eq(y2[2], (1.0f / -63.5f) * 127);
}

/* Rounding-tie sessions (profile.h td_act_ties_*): a scaled value within tau
 * of a half-integer is logged with the code on the tie's other side, and a
 * pinned one takes it, in both precisions; the f16 scale of a block whose
 * a/127 sits at the midpoint of two f16 values likewise; outside a session
 * nothing changes. Block 0: max 127 -> d = 1, x/d = 40.5 + 2^-12 -> 41
 * (40 pinned). Block 1: max a = 127 (1 + 2^-11) -> a/127 = 1 + 2^-11, the
 * midpoint of f16 1 and 1 + 2^-10: rounds to 1 (even), pinned 1 + 2^-10. */
Test(act_q8, tie_session_logs_near_ties_and_pins_them) {
    double x[64] = {0}, y[64];
    x[0] = 127, x[2] = 40.5 + 0x1p-12, x[3] = 3.25, x[32] = 127 * (1 + 0x1p-11), x[33] = 1;
    float xf[64], yf[64];
    for (int j = 0; j < 64; j++) xf[j] = (float)x[j];
    td_act_round_f64(y, x, 64, TD_ACT_Q8_0);
    cr_assert_eq(y[2], 41.0, "no session: %.17g", y[2]);
    cr_assert_eq(y[32], 127.0, "no session: the scale rounds to 1 (even): %.17g", y[32]);

    td_act_tie *log = NULL;
    int n = 0;
    td_act_ties_begin(NULL, 0, 1.0 / 1024);
    td_act_ties_forward();
    td_act_round_f64(y, x, 64, TD_ACT_Q8_0);
    td_act_ties_end(&log, &n);
    cr_assert_eq(n, 2, "near-ties logged: %d", n);
    cr_assert(log[0].step == 0 && log[0].call == 0 && log[0].elem == 2 && log[0].pick == 40, "code tie: %lld %lld %lld %g",
              (long long)log[0].step, (long long)log[0].call, (long long)log[0].elem, log[0].pick);
    cr_assert(log[1].elem == -2 && log[1].v == 0.5 && log[1].pick == 1 + 0x1p-10, "scale tie: %lld v %g pick %.17g",
              (long long)log[1].elem, log[1].v, log[1].pick);

    td_act_ties_begin(log, n, 1.0 / 1024);
    td_act_ties_forward();
    td_act_round_f64(y, x, 64, TD_ACT_Q8_0);
    td_act_ties_forward(); // a second forward: same call and element, other step: not pinned
    td_act_round_f32(yf, xf, 64, TD_ACT_Q8_0);
    td_act_ties_end(NULL, NULL);
    cr_assert_eq(y[2], 40.0, "pinned code: %.17g", y[2]);
    cr_assert_eq(y[3], 3.0, "3.25 is no tie: %.17g", y[3]);
    cr_assert_eq(y[32], 127 * (1 + 0x1p-10), "pinned scale: %.17g", y[32]);
    cr_assert_eq(yf[2], 41.0f, "step 1 is not pinned: %.9g", yf[2]);

    td_act_ties_begin(log, n, 1.0 / 1024);
    td_act_ties_forward();
    td_act_round_f32(yf, xf, 64, TD_ACT_Q8_0);
    td_act_ties_end(NULL, NULL);
    cr_assert_eq(yf[2], 40.0f, "pinned code in f32: %.9g", yf[2]);
    cr_assert_eq(yf[32], 127 * (1 + 0x1p-10f), "pinned scale in f32: %.9g", yf[32]);
    free(log);
    td_act_round_f32(yf, xf, 64, TD_ACT_Q8_0);
    cr_assert_eq(yf[2], 41.0f, "session closed: %.9g", yf[2]);
}

/* f16 operand roundings take part in a session (profile.h
 * TD_ACT_TIES_F16_TAU): 1 + 2^-11 (1 - 2^-9) lies 0.499 f16 ulps above 1,
 * near the midpoint of 1 and 1 + 2^-10, and rounds to 1; logged with the
 * other neighbour and the tap that follows it, pinned there in f64 and f32;
 * -(1 + 2^-11 (1 + 2^-9)) likewise from below in magnitude; 1.25 + 2^-12
 * (0.25 ulps off) is no tie. td_f16_round_* never take part. */
Test(act_q8, tie_session_logs_and_pins_f16_operands) {
    const double x[3] = {1 + 0x1p-11 * (1 - 0x1p-9), -(1 + 0x1p-11 * (1 + 0x1p-9)), 1.25 + 0x1p-12};
    double y[3];
    float xf[3], yf[3];
    for (int j = 0; j < 3; j++) xf[j] = (float)x[j];
    td_act_tie *log = NULL;
    int n = 0;
    td_act_ties_begin(NULL, 0, 1.0 / 1024);
    td_act_ties_forward();
    td_f16_round_f64(y, x, 3); // not a rounding point of the profile: never logged
    td_act_round_f64(y, x, 3, TD_ACT_F16);
    td_act_ties_tap(0, "attn_ctx");
    td_act_ties_end(&log, &n);
    cr_assert_eq(y[0], 1.0, "unpinned: %.17g", y[0]);
    cr_assert_eq(y[1], -(1 + 0x1p-10), "unpinned: %.17g", y[1]);
    cr_assert_eq(n, 2, "f16 near-ties logged: %d", n);
    cr_assert(log[0].f16 && log[0].call == 0 && log[0].elem == 0 && log[0].pick == 1 + 0x1p-10 &&
                  fabs(log[0].v - (0.5 - 0x1p-10)) < 1e-12 && !strcmp(log[0].tap, "blk.0.attn_ctx"),
              "f16 tie 0: f16 %d call %lld elem %lld v %.9g pick %.17g tap %s", log[0].f16, (long long)log[0].call,
              (long long)log[0].elem, log[0].v, log[0].pick, log[0].tap);
    cr_assert(log[1].f16 && log[1].elem == 1 && log[1].pick == -1.0 && fabs(log[1].v - (0.5 + 0x1p-10)) < 1e-12,
              "f16 tie 1: elem %lld v %.9g pick %.17g", (long long)log[1].elem, log[1].v, log[1].pick);

    td_act_ties_begin(log, 1, 1.0 / 1024); // pin the first only
    td_act_ties_forward();
    td_act_round_f64(y, x, 3, TD_ACT_F16);
    td_act_ties_end(NULL, NULL);
    cr_assert_eq(y[0], 1 + 0x1p-10, "pinned f16 operand: %.17g", y[0]);
    cr_assert_eq(y[1], -(1 + 0x1p-10), "not pinned: %.17g", y[1]);
    cr_assert_eq(y[2], 1.25, "no tie: %.17g", y[2]);
    td_act_ties_begin(log, 1, 1.0 / 1024);
    td_act_ties_forward();
    td_act_round_f32(yf, xf, 3, TD_ACT_F16);
    td_act_ties_end(NULL, NULL);
    cr_assert_eq(yf[0], 1 + 0x1p-10f, "pinned f16 operand in f32: %.9g", yf[0]);
    free(log);
    td_act_round_f32(yf, xf, 3, TD_ACT_F16);
    cr_assert_eq(yf[0], 1.0f, "session closed: %.9g", yf[0]);
}

/* The window of f16 roundings that read a tap out of RoPE
 * (td_act_ties_rope_near), on the numbers of llama-iq1_s, 40 tokens, flash
 * attention on the Vulkan arm (decode step 4, position 43): head 0's
 * f16(Q*scale) call has largest magnitude 0.515; element 5's oracle value is
 * 5.5e-7 (0.018 f16 ulps) above the midpoint of 1372 and 1373 * 2^-15; the
 * arm's rope, 1.9e-6 rad off (within rope-trig@4's 4 * 2^-24 * 44 = 1.05e-5
 * rad), gives 9.5e-7 less, below the midpoint. The row window alone
 * (2^-20 * 0.515 = 4.9e-7) misses it, so the oracle never reads the arm's
 * side; under rope-trig@4 the window is 2^-20 + sqrt(2) * 1.05e-5 of 0.515
 * (8.1e-6, 0.27 ulps there) and logs it with the arm's neighbour. A value
 * 0.3 ulps off stays outside: the window is the declared bound, not all. */
Test(act_q8, rope_trig_widens_the_window_of_rope_sourced_f16_roundings) {
    const double ulp = 0x1p-15, mid = 1372.5 * 0x1p-15;
    const double x[3] = {0.515, mid + 5.5e-7, -(mid + 0.3 * ulp)};
    const double arm = x[1] - 9.5e-7; // the arm's own Q tap times the scale
    td_profile vk, plain;
    char why[200];
    cr_assert_eq(td_profile_parse("attn-f16+mm-f16@8+acc-f16+rope-f32-pow+rope-trig@4+fa-f16+fa-acc-f16@8", &vk, why,
                                  sizeof why),
                 0, "%s", why);
    cr_assert_eq(td_profile_parse("attn-f16+mm-f16@8+acc-f16+rope-f32-pow+fa-f16+fa-acc-f16@8", &plain, why, sizeof why),
                 0, "%s", why);
    cr_assert_eq(td_act_ties_rope_near(&plain, 43), TD_ACT_TIES_ROW_NEAR, "no rope-trig: the row window");
    const double arm_f16 = td_f16_to_f32(td_f32_to_f16((float)arm));
    cr_assert_eq(arm_f16, 1372 * 0x1p-15, "the arm's value rounds down: %.9g", arm_f16);
    for (int k = 0; k < 2; k++) {
        const td_profile *p = k ? &plain : &vk;
        td_act_tie *log = NULL;
        int n = 0;
        double y[3];
        td_act_ties_begin(NULL, 0, 1.0 / 1024);
        td_act_ties_forward();
        td_act_ties_source(0, "attn_q_rope", 0);
        td_act_ties_source_near(td_act_ties_rope_near(p, 43));
        td_act_round_f64(y, x, 3, TD_ACT_F16);
        td_act_ties_end(&log, &n);
        cr_assert_eq(y[1], 1373 * 0x1p-15, "the oracle rounds up: %.9g", y[1]);
        int logged = 0;
        for (int i = 0; i < n; i++) {
            cr_assert_neq(log[i].elem, 2, "0.3 ulps off the midpoint is outside the window (%s)", k ? "plain" : "rope-trig");
            if (log[i].elem != 1) continue;
            logged = 1;
            cr_assert_eq(log[i].pick, arm_f16, "logged with the other neighbour, the arm's: %.9g", log[i].pick);
            cr_assert_str_eq(log[i].src, "blk.0.attn_q_rope");
        }
        free(log);
        if (k == 0) cr_assert(logged, "rope-trig@4 at position 43: 5.5e-7 off the midpoint is within the window");
        else cr_assert(!logged, "without rope-trig the row window (4.9e-7) leaves it out");
    }
}

/* The log is capped (TD_ACT_TIES_LOG_MAX): under a window as wide as the
 * row's largest value (rope-trig@U at long positions) every value is a
 * near-tie, and the log grew with the model and the prompt. The first ones
 * are kept in order, the rest counted; a pin past the cap still applies. */
Test(act_q8, ties_log_stops_at_its_cap_and_pins_still_apply) {
    const int64_t n = TD_ACT_TIES_LOG_MAX + 1000;
    double *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
    cr_assert(x && y);
    for (int64_t i = 0; i < n; i++) x[i] = (i % 2 ? -1 : 1) * (0.25 + 0.5 * (double)(1 + i % 976) / 977.0); // never on the f16 grid
    // the last value pinned to its other f16 neighbour
    const double last = td_f16_to_f32(td_f32_to_f16((float)x[n - 1]));
    td_act_tie pin = {.step = 0, .call = 0, .elem = n - 1, .f16 = 1, .pick = last + 0x1p-11};
    td_act_tie *log = NULL;
    int n_log = 0;
    td_act_ties_begin(&pin, 1, 1.0 / 1024);
    td_act_ties_forward();
    td_act_ties_source(0, "attn_q_rope", 0);
    td_act_ties_source_near(1.0);
    td_act_round_f64(y, x, n, TD_ACT_F16);
    td_act_ties_end(&log, &n_log);
    cr_assert_eq(n_log, TD_ACT_TIES_LOG_MAX, "log of %d entries", n_log);
    cr_assert_eq(td_act_ties_dropped(), 1000, "dropped %lld", (long long)td_act_ties_dropped());
    for (int i = 0; i < n_log; i += 4099) cr_assert_eq(log[i].elem, i, "entry %d is element %lld", i, (long long)log[i].elem);
    cr_assert_eq(y[n - 1], pin.pick, "the pin past the cap: %.9g", y[n - 1]);
    free(log);
    td_act_ties_begin(NULL, 0, 1.0 / 1024);
    td_act_ties_end(NULL, NULL);
    cr_assert_eq(td_act_ties_dropped(), 0, "a new session starts from none");
    free(x);
    free(y);
}

/* F16 / BF16: round to nearest, ties to even. 1 + 2^-11 is half an f16 ulp
 * above 1 -> 1; 1 + 3*2^-11 -> 1 + 2^-9 (the even neighbour); bf16 has 8
 * significant bits: 1 + 2^-8 -> 1, 1 + 3*2^-8 -> 1 + 2^-6. */
Test(act_q8, f16_bf16_round_to_even) {
    const float x[4] = {1 + 0x1p-11f, 1 + 3 * 0x1p-11f, 1 + 0x1p-8f, 1 + 3 * 0x1p-8f};
    float h[4], b[4];
    td_act_round_f32(h, x, 4, TD_ACT_F16);
    td_act_round_f32(b, x, 4, TD_ACT_BF16);
    cr_assert_eq(h[0], 1.0f);
    cr_assert_eq(h[1], 1 + 0x1p-9f);
    cr_assert_eq(b[2], 1.0f);
    cr_assert_eq(b[3], 1 + 0x1p-6f);
    float f[4];
    td_act_round_f32(f, x, 4, TD_ACT_F32);
    cr_assert_eq(memcmp(f, x, sizeof x), 0, "F32 weights keep f32 activations");
}

/* quants.md §8's table, and the profile names. */
Test(act_q8, format_per_weight_type_and_profile_names) {
    static const struct {
        int type;
        int fmt;
    } cases[] = {{TD_TYPE_F32, TD_ACT_F32},   {TD_TYPE_F16, TD_ACT_F16},     {TD_TYPE_BF16, TD_ACT_BF16},
                 {TD_TYPE_Q4_0, TD_ACT_Q8_0}, {TD_TYPE_Q8_0, TD_ACT_Q8_0},   {TD_TYPE_IQ4_NL, TD_ACT_Q8_0},
                 {TD_TYPE_MXFP4, TD_ACT_Q8_0}, {TD_TYPE_Q4_1, TD_ACT_Q8_1},  {TD_TYPE_Q5_1, TD_ACT_Q8_1},
                 {TD_TYPE_Q2_K, TD_ACT_Q8_K}, {TD_TYPE_Q4_K, TD_ACT_Q8_K},   {TD_TYPE_Q6_K, TD_ACT_Q8_K},
                 {TD_TYPE_IQ4_XS, TD_ACT_Q8_K}, {TD_TYPE_IQ2_XXS, TD_ACT_Q8_K}, {TD_TYPE_TQ1_0, TD_ACT_Q8_K}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        td_act_fmt f;
        cr_assert_eq(td_act_format(cases[i].type, &f), 0, "type %d", cases[i].type);
        cr_assert_eq((int)f, cases[i].fmt, "type %d -> %d, expected %d", cases[i].type, (int)f, cases[i].fmt);
    }
    td_act_fmt f;
    cr_assert_eq(td_act_format(TD_TYPE_I32, &f), -1);
    cr_assert_eq(td_act_format(TD_TYPE_Q8_K, &f), -1);
    cr_assert_eq(td_act_format(999, &f), -1);
    td_profile p;
    char why[200];
    cr_assert_eq(td_profile_parse(NULL, &p, why, sizeof why), 0);
    cr_assert_eq(p.rules, 0u);
    cr_assert_eq(td_profile_parse("act-q8", &p, why, sizeof why), 0);
    cr_assert_eq(p.rules, (unsigned)TD_RULE_ACT_Q8);
    cr_assert_eq(td_profile_parse("act_q8", &p, why, sizeof why), -1);
}

/* Profile strings: canonical order and spelling, and the refusals. */
Test(act_q8, profile_parse_and_format) {
    td_profile p;
    char why[256], buf[128];
    cr_assert_eq(td_profile_parse("fa-f16+act-q8_1@4096+attn-f16", &p, why, sizeof why), 0, "%s", why);
    td_profile_format(&p, buf, sizeof buf);
    cr_assert_str_eq(buf, "act-q8_1@4096+attn-f16+fa-f16");
    cr_assert_eq(td_profile_parse("mm-f16@8+attn-f16", &p, why, sizeof why), 0, "%s", why);
    td_profile_format(&p, buf, sizeof buf);
    cr_assert_str_eq(buf, "attn-f16+mm-f16@8");
    cr_assert_eq(td_profile_parse("native", &p, why, sizeof why), 0);
    td_profile_format(&p, buf, sizeof buf);
    cr_assert_str_eq(buf, "native");
    const char *bad[] = {"mm-f16", "attn-f16+attn-f16", "act-q8+act-q8_1", "act-q8+mm-f16@8", "attn-f16@3",
                         "act-q8_1@-1", "act-q8_1@", "f16", "attn-f16+"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(td_profile_parse(bad[i], &p, why, sizeof why), -1, "'%s' must be refused", bad[i]);
        cr_assert(why[0], "'%s': no reason given", bad[i]);
    }
    // act-q8_1 rounds quantized weights in steps of several tokens, and one-token steps above @K
    cr_assert_eq(td_profile_parse("act-q8_1@64", &p, why, sizeof why), 0);
    td_act_fmt f;
    cr_assert_eq(td_profile_matmul_fmt(&p, TD_TYPE_Q4_K, 2, 32, &f), 0);
    cr_assert_eq(f, TD_ACT_Q8_1);
    cr_assert_eq(td_profile_matmul_fmt(&p, TD_TYPE_Q4_K, 1, 64, &f), 0);
    cr_assert_eq(f, TD_ACT_F32);
    cr_assert_eq(td_profile_matmul_fmt(&p, TD_TYPE_Q4_K, 1, 65, &f), 0);
    cr_assert_eq(f, TD_ACT_Q8_1);
    cr_assert_eq(td_profile_matmul_fmt(&p, TD_TYPE_F32, 9, 4096, &f), 0);
    cr_assert_eq(f, TD_ACT_F32);
}

/* fa-acc-f16@S: parsed with its subgroup size, only on top of fa-f16; and
 * the flash-attention layout it implies, worked out by hand from
 * ggml-vulkan's get_fa_tuning_params_scalar and its split-k choice for a
 * device of subgroup size 8 reporting no core count (lavapipe). */
Test(act_q8, fa_acc_f16_parse_and_geometry) {
    td_profile p;
    char why[256], buf[128];
    cr_assert_eq(td_profile_parse("fa-acc-f16@8+attn-f16+fa-f16", &p, why, sizeof why), 0, "%s", why);
    td_profile_format(&p, buf, sizeof buf);
    cr_assert_str_eq(buf, "attn-f16+fa-f16+fa-acc-f16@8");
    const char *bad[] = {"fa-acc-f16@8", "fa-f16+fa-acc-f16", "fa-f16+fa-acc-f16@6", "fa-f16+fa-acc-f16@64",
                         "fa-f16+fa-acc-f16@0"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(td_profile_parse(bad[i], &p, why, sizeof why), -1, "'%s' must be refused", bad[i]);
        cr_assert(why[0], "'%s': no reason given", bad[i]);
    }
    cr_assert_eq(td_profile_parse("fa-f16+fa-acc-f16@8", &p, why, sizeof why), 0, "%s", why);
    td_fa_geom g;
    // stories260K (D 8, 8 heads on 4 KV heads), one token at position 40 of
    // 41: grouped query rows (N = 2, Br 2, Bc 64), 4*8 threads, d_split 2;
    // 32 / (1 token * 4 groups) = 8 splits of 256 cells, 32 each, rounded
    // up to 64: 4 splits of 64
    cr_assert_eq(td_profile_fa_geom(&p, 8, 8, 4, 1, 41, 41, &g), 0);
    cr_assert_eq(g.kv, 256);
    cr_assert_eq(g.bc, 64);
    cr_assert_eq(g.d_split, 2);
    cr_assert_eq(g.cols, 16);
    cr_assert_eq(g.group, 4);
    cr_assert_eq(g.split_k, 4);
    cr_assert_eq(g.split_kv, 64);
    // 40 tokens: rows of tokens (Br 4), 10 row blocks * 8 heads >= 32: no split
    cr_assert_eq(td_profile_fa_geom(&p, 8, 8, 4, 40, 40, 41, &g), 0);
    cr_assert_eq(g.split_k, 1);
    cr_assert_eq(g.bc, 64);
    // head size 32 (the llama fixtures, 4 heads on 2), 8 tokens: d_split 8,
    // Bc 32 (D & 8 == 0), 8 tokens > Br 2: no split; groups of one thread
    cr_assert_eq(td_profile_fa_geom(&p, 32, 4, 2, 8, 8, 12, &g), 0);
    cr_assert_eq(g.d_split, 8);
    cr_assert_eq(g.bc, 32);
    cr_assert_eq(g.cols, 4);
    cr_assert_eq(g.group, 1);
    cr_assert_eq(g.split_k, 1);
    // 300 cached cells: the view grows to 512; one token, 2 query groups
    // (Br 2, Bc 32): 32 / 2 = 16 splits of 32 cells
    cr_assert_eq(td_profile_fa_geom(&p, 32, 4, 2, 1, 300, 400, &g), 0);
    cr_assert_eq(g.kv, 512);
    cr_assert_eq(g.split_k, 16);
    cr_assert_eq(g.split_kv, 32);
    // head sizes that are not a multiple of 8 run on ggml-cpu: not modelled
    cr_assert_eq(td_profile_fa_geom(&p, 18, 4, 2, 1, 1, 1, &g), -1);
    cr_assert_eq(td_profile_parse("fa-f16", &p, why, sizeof why), 0);
    cr_assert_eq(td_profile_fa_geom(&p, 8, 8, 4, 1, 1, 1, &g), -1);
}

/* fa-cpu: parsed only on top of fa-f16, canonical after fa-acc-f16; and the
 * ggml-cpu kernel it names per shape, read by hand from
 * ggml_compute_forward_flash_attn_ext_f16 (AVX2: 8 f32 lanes; tiles of 64
 * query rows; one-token steps split cache views of 512 cells or more). */
Test(act_q8, fa_cpu_parse_and_path) {
    td_profile p;
    char why[256], buf[160];
    cr_assert_eq(td_profile_parse("fa-cpu+attn-f16+fa-f16", &p, why, sizeof why), 0, "%s", why);
    td_profile_format(&p, buf, sizeof buf);
    cr_assert_str_eq(buf, "attn-f16+fa-f16+fa-cpu");
    const char *bad[] = {"fa-cpu", "attn-f16+fa-cpu", "fa-f16+fa-cpu@8", "fa-f16+fa-cpu+fa-cpu"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(td_profile_parse(bad[i], &p, why, sizeof why), -1, "'%s' must be refused", bad[i]);
        cr_assert(why[0], "'%s': no reason given", bad[i]);
    }
    cr_assert_eq(td_profile_parse("fa-f16+fa-cpu", &p, why, sizeof why), 0, "%s", why);
    // qwen3-tails (head size 18): the one-chunk kernel at every step of a
    // short context, 1 to 64 tokens alike (18 fills no 8-lane vector)
    cr_assert_eq(td_profile_fa_cpu(&p, 18, 4, 2, 1, 41, 56), TD_FA_CPU_ONE_CHUNK);
    cr_assert_eq(td_profile_fa_cpu(&p, 18, 4, 2, 8, 8, 24), TD_FA_CPU_ONE_CHUNK);
    cr_assert_eq(td_profile_fa_cpu(&p, 18, 4, 2, 64, 64, 80), TD_FA_CPU_ONE_CHUNK);
    // head size 32: 63 tokens one chunk, 64 the f32 tiles
    cr_assert_eq(td_profile_fa_cpu(&p, 32, 4, 2, 63, 63, 80), TD_FA_CPU_ONE_CHUNK);
    cr_assert_eq(td_profile_fa_cpu(&p, 32, 4, 2, 64, 64, 80), TD_FA_CPU_TILED);
    // one token at position 300 of 400: a view of 512 cells, split by threads;
    // at position 200 the view is 256 cells; a 2-token step never splits
    cr_assert_eq(td_profile_fa_cpu(&p, 18, 4, 2, 1, 301, 400), TD_FA_CPU_SPLIT_KV);
    cr_assert_eq(td_profile_fa_cpu(&p, 18, 4, 2, 1, 201, 400), TD_FA_CPU_ONE_CHUNK);
    cr_assert_eq(td_profile_fa_cpu(&p, 18, 4, 2, 2, 302, 400), TD_FA_CPU_ONE_CHUNK);
    // a context of 300 cells still shows a 512-cell view once past 256
    cr_assert_eq(td_profile_fa_cpu(&p, 18, 4, 2, 1, 260, 300), TD_FA_CPU_SPLIT_KV);
    // with fa-acc-f16 the shader's shapes are its (head size a multiple of 8)
    cr_assert_eq(td_profile_parse("fa-f16+fa-acc-f16@8+fa-cpu", &p, why, sizeof why), 0, "%s", why);
    cr_assert_eq(td_profile_fa_cpu(&p, 32, 4, 2, 8, 8, 24), TD_FA_CPU_NONE);
    cr_assert_eq(td_profile_fa_cpu(&p, 18, 4, 2, 8, 8, 24), TD_FA_CPU_ONE_CHUNK);
    cr_assert_eq(td_profile_parse("fa-f16", &p, why, sizeof why), 0);
    cr_assert_eq(td_profile_fa_cpu(&p, 18, 4, 2, 8, 8, 24), TD_FA_CPU_NONE);
}

/* The f64 rounding gives the f32 rounding's values on f32 inputs (away from
 * ties): the same blocks, scales in their storage types. */
Test(act_q8, f64_rounding_matches_f32) {
    float xf[256];
    double xd[256], yd[256];
    float yf[256];
    for (int i = 0; i < 256; i++) xf[i] = (float)sin(0.37 * i + 0.1) * (1.0f + (float)(i % 7)), xd[i] = xf[i];
    const td_act_fmt fm[4] = {TD_ACT_Q8_0, TD_ACT_Q8_K, TD_ACT_F16, TD_ACT_BF16};
    for (int k = 0; k < 4; k++) {
        td_act_round_f32(yf, xf, 256, fm[k]);
        td_act_round_f64(yd, xd, 256, fm[k]);
        for (int i = 0; i < 256; i++)
            cr_assert(fabs(yd[i] - (double)yf[i]) <= 1e-6 * fabs(yd[i]) + 1e-30, "fmt %d [%d]: f64 %.9g f32 %.9g",
                      (int)fm[k], i, yd[i], (double)yf[i]);
    }
}

/* ---- Gated DeltaNet (arch-qwen3next.md §4.2), worked by hand ------------- */

Test(gdn, l2norm_eps_on_the_sum) {
    double x[2] = {3, 4};
    td_ref_l2norm_f64(x, 2, 0);
    assert_close(x[0], 0.6, 1e-15);
    assert_close(x[1], 0.8, 1e-15);
    double y[2] = {3, 4}; // sqrt(9 + 16 + 11) = 6: eps on the sum, not the mean (that would be sqrt(12.5 + 11))
    td_ref_l2norm_f64(y, 2, 11);
    assert_close(y[0], 0.5, 1e-15);
    assert_close(y[1], 4.0 / 6.0, 1e-15);
}

Test(gdn, delta_rule_three_steps) {
    // dk = 2, S[i][j] at j*2 + i; q/sqrt(2) reads the state
    double S[4] = {0}, o[2];
    const double r2 = 1 / sqrt(2.0);
    // step 1: S = 0, k = e0, v = (2, 3), beta 1/2, no decay: S = k (beta v)^T = [[1, 1.5], [0, 0]]
    const double k1[2] = {1, 0}, v1[2] = {2, 3}, q1[2] = {1, 0};
    td_ref_gdn_step_f64(S, o, q1, k1, v1, 0.0, 0.5, 2);
    assert_close(S[0], 1.0, 1e-15);
    assert_close(S[2], 1.5, 1e-15);
    assert_close(S[1], 0, 0);
    assert_close(S[3], 0, 0);
    assert_close(o[0], 1.0 * r2, 1e-15);
    assert_close(o[1], 1.5 * r2, 1e-15);
    // step 2: decay 1/2 first (S = [[.5, .75], [0, 0]]), k = e1 sees nothing (e = 0), beta 1, v = (1, 1):
    // S = [[.5, .75], [1, 1]]; q = e1 reads row 1 -> (1, 1)/sqrt 2
    const double k2[2] = {0, 1}, v2[2] = {1, 1};
    td_ref_gdn_step_f64(S, o, k2, k2, v2, log(0.5), 1.0, 2);
    assert_close(S[0], 0.5, 1e-15);
    assert_close(S[2], 0.75, 1e-15);
    assert_close(S[1], 1, 1e-15);
    assert_close(S[3], 1, 1e-15);
    assert_close(o[0], r2, 1e-15);
    assert_close(o[1], r2, 1e-15);
    // step 3: beta 1 writes v exactly at key k: afterwards S^T k = v (the delta rule's defining property)
    const double k3[2] = {1, 0}, v3[2] = {-2, 7};
    td_ref_gdn_step_f64(S, o, k3, k3, v3, 0.0, 1.0, 2);
    assert_close(S[0], -2, 1e-15);
    assert_close(S[2], 7, 1e-15);
    assert_close(S[1], 1, 1e-15);
    assert_close(S[3], 1, 1e-15); // key e1's memory untouched
    assert_close(o[0], -2 * r2, 1e-15);
    assert_close(o[1], 7 * r2, 1e-15);
}

/* acc-f16 as lavapipe runs ggml-vulkan's f16-accumulating tile: pairs of k
 * from the higher index down, every product and every sum rounded to f16.
 * Values worked by hand (f16 has 11 significant bits: from 2048 to 4096 its
 * step is 2; ties go to the even significand). */
Test(acc_f16, dot_order_and_roundings) {
    // {2048, 0 | 1, 2}: pair 0 gives 0 then 2048; pair 1 adds 2 (2050, exact)
    // then 1 (2051, a tie between 2050 and 2052: 2052). Index order would
    // give 2048 + 1 -> 2048, + 2 -> 2050; the exact sum is 2051.
    const double a[4] = {1, 1, 1, 1}, b[4] = {2048, 0, 1, 2};
    cr_assert_eq(td_ref_dot_acc16_f64(a, b, 4, 2), 2052.0);
    const float af[4] = {1, 1, 1, 1}, bf[4] = {2048, 0, 1, 2};
    cr_assert_eq(td_ref_dot_acc16_f32(af, bf, 4, 2), 2052.0f);
    // an odd length: the last pair holds one value (the zero padding adds nothing)
    cr_assert_eq(td_ref_dot_acc16_f64(a, b, 3, 2), 2048.0); // 2048 + 1 = 2049 -> 2048
    // the product is rounded before the sum: -1 first (the higher index),
    // then (1 + 3/1024)^2 = 1 + 6/1024 + 9/2^20 rounds to 1 + 6/1024, and the
    // sum is 6/1024 (a fused step would keep 6/1024 + 2^-17)
    const double x = 1 + 3.0 / 1024, c[2] = {x, -1}, d[2] = {x, 1};
    cr_assert_eq(td_ref_dot_acc16_f64(c, d, 2, 2), 6.0 / 1024, "%.17g", td_ref_dot_acc16_f64(c, d, 2, 2));
}

/* ---- qwen4exp (arch-qwen4exp.md §4) ------------------------------------ */

Test(qwen4exp, ple_context_cut_by_eos_and_gaps) {
    // n_g = 4, eos = 2; tokens 5 2 7 9 at positions 0..3
    const int32_t tok[4] = {5, 2, 7, 9};
    int64_t ctx[4];
    td_ref_ple_context(ctx, tok, 3, 4, 2, 99);
    cr_assert(ctx[0] == 9 && ctx[1] == 7 && ctx[2] == 2 && ctx[3] == 2, "EOS at distance 2 cuts it and older");
    td_ref_ple_context(ctx, tok, 1, 4, 2, 99);
    cr_assert(ctx[0] == 2 && ctx[1] == 5 && ctx[2] == 2 && ctx[3] == 2, "an EOS at p does not cut; p-2 < 0 does");
    td_ref_ple_context(ctx, tok, 0, 4, 2, 99);
    cr_assert(ctx[0] == 5 && ctx[1] == 2 && ctx[2] == 2 && ctx[3] == 2);
    // an embedding input (id < 0): itself hashes the image id, its successor sees a gap
    const int32_t img[3] = {4, -1, 6};
    td_ref_ple_context(ctx, img, 1, 3, 2, 99);
    cr_assert(ctx[0] == 99 && ctx[1] == 4 && ctx[2] == 2);
    td_ref_ple_context(ctx, img, 2, 3, 2, 99);
    cr_assert(ctx[0] == 6 && ctx[1] == 2 && ctx[2] == 2);
}

Test(qwen4exp, ple_rows_wrap_mod_2_64) {
    // qwen4exp-f32's constants; both 295*M0 and 297*M2 exceed 2^64. Expected rows from python's
    // unbounded integers reduced mod 2^64: X_2 = (295 M0 ^ 17 M1) mod 2^64, X_3 = X_2 ^ (297 M2 mod 2^64)
    const uint64_t mult[3] = {0x9E3779B97F4A7C15ull, 10000000000037ull, 0xC2B2AE3D27D4EB4Full};
    const uint64_t off[4] = {0, 61, 128, 199}, vsz[4] = {61, 67, 71, 73};
    const int64_t ctx[3] = {295, 17, 297};
    int64_t rows[4];
    td_ref_ple_rows(rows, ctx, 3, 2, mult, off, vsz);
    cr_assert(rows[0] == 35 && rows[1] == 87 && rows[2] == 175 && rows[3] == 265, "rows %lld %lld %lld %lld",
              (long long)rows[0], (long long)rows[1], (long long)rows[2], (long long)rows[3]);
    // a signed 64-bit product or a 32-bit multiplier would differ: X mod V from the low 32 bits only
    const uint64_t m32[3] = {(uint32_t)mult[0], (uint32_t)mult[1], (uint32_t)mult[2]};
    int64_t r32[4];
    td_ref_ple_rows(r32, ctx, 3, 2, m32, off, vsz);
    cr_assert(memcmp(rows, r32, sizeof rows) != 0, "truncated multipliers give other rows");
}

Test(qwen4exp, imrope_components_and_text_equals_neox) {
    const uint32_t s3320[4] = {3, 3, 2, 0}, s1001[4] = {1, 0, 0, 1}, s2110[4] = {2, 1, 1, 0};
    // [3,3,2,0]: sectors 0..7 -> t h w t h w t h (every pair t/h/w)
    static const int want[8] = {0, 1, 2, 0, 1, 2, 0, 1};
    for (int i = 0; i < 8; i++) cr_expect_eq(td_ref_imrope_component(i, s3320), want[i], "pair %d", i);
    cr_expect_eq(td_ref_imrope_component(8, s3320), 0, "sector = 8 mod 8 = 0");
    // [1,0,0,1]: S = 2; sector 1 is neither h (1 < 0 fails) nor w nor t: p_e
    cr_expect_eq(td_ref_imrope_component(0, s1001), 0);
    cr_expect_eq(td_ref_imrope_component(1, s1001), 3);
    // [2,1,1,0]: S = 4; sector 2: w (2 < 3); sector 3: t (3 < 6)
    cr_expect_eq(td_ref_imrope_component(2, s2110), 2);
    cr_expect_eq(td_ref_imrope_component(3, s2110), 0);
    // text positions (p, p, p, 0) with every pair t/h/w: exactly NEOX (D = 8, R = 4: 2 pairs, sections [1,1,0,0])
    const uint32_t s1100[4] = {1, 1, 0, 0};
    td_ref_rope c = rope_cfg(TD_ROPE_NEOX);
    double a[8], b[8];
    memcpy(a, x_in, sizeof a), memcpy(b, x_in, sizeof b);
    const int64_t pos4[4] = {7, 7, 7, 0};
    td_ref_rope_imrope_f64(a, pos4, &c, s1100, 1);
    td_ref_rope_f64(b, 7, &c, NULL, 1);
    for (int i = 0; i < 8; i++) cr_expect_eq(a[i], b[i], "dim %d", i);
    // [1,0,0,1]: pair 1 takes p_e = 0 for text: unrotated; pair 0 rotates as NEOX's pair 0
    memcpy(a, x_in, sizeof a);
    td_ref_rope_imrope_f64(a, pos4, &c, s1001, 1);
    cr_expect_eq(a[1], x_in[1]);
    cr_expect_eq(a[3], x_in[3]);
    cr_expect_eq(a[0], b[0]);
    cr_expect_eq(a[2], b[2]);
}

Test(qwen4exp, hc_mix_and_combine_hand_worked) {
    // hc = 2, E = 2, lr = 1, eps 0. Expected values from the spec's formulas in python's math module:
    // flat = [RMSNorm([3,4]; [1,2]); RMSNorm([1,-1]; [.5,1])] = [.8485.., 2.2627.., .5, -1]
    const double Rs[4] = {3, 4, 1, -1}, gamma[4] = {1, 2, 0.5, 1};
    const double Wdn[4] = {0.5, -0.5, 1.0, 0.25}, Wup[4] = {1.0, -2.0, 0.5, 0.0};
    const double Winj[8] = {1, 0, 0, 0, 0, 0, 1, 1};
    double mixed[2], inj[2], flat[4], lam[1], gam[4];
    td_ref_hc_mix_f64(mixed, inj, flat, lam, gam, Rs, gamma, Wdn, Wup, Winj, 2, 2, 1, 0.0);
    assert_close(flat[1], 2.262741699796952, 1e-14);
    assert_close(lam[0], -0.10127408406595785, 1e-14); // silu((Wdn . flat) / hc)
    assert_close(mixed[0], 0.32323532815316836, 1e-14);
    assert_close(mixed[1], 0.37277963711111695, 1e-14);
    assert_close(inj[0], 0.848528137423857, 1e-14);
    assert_close(inj[1], -0.5, 1e-14);
    double R2[4] = {3, 4, 1, -1};
    const double y[2] = {1, -2};
    td_ref_hc_combine_f64(R2, y, inj, 2, 2); // Rs[c] += 2 sigmoid(inj[c] / hc) y
    assert_close(R2[0], 4.2090063049378275, 1e-14);
    assert_close(R2[1], 1.5819873901243455, 1e-14);
    assert_close(R2[2], 1.8756469982284039, 1e-14);
    assert_close(R2[3], -2.7512939964568077, 1e-14);
    const double zero[2] = {0, 0};
    double R3[4] = {3, 4, 1, -1};
    td_ref_hc_combine_f64(R3, y, zero, 2, 2);
    cr_expect(R3[0] == 4 && R3[1] == 2 && R3[2] == 2 && R3[3] == -3, "a zero inject is a plain residual add");
}

static int64_t select_of(int64_t *sel, const double *score, int64_t p, int64_t r, int64_t W) {
    return td_ref_qsa_select_f64(sel, score, p, r, W);
}

Test(qwen4exp, qsa_selection_tail_blocks_partial_and_ties) {
    int64_t sel[64];
    // r = 4, B = 4: W = 7. p = 5: 6 visible <= 7: dense
    const double sc[3] = {0.5, 2.0, 1.0};
    cr_assert_eq(select_of(sel, sc, 5, 4, 7), 6);
    for (int i = 0; i < 6; i++) cr_expect_eq(sel[i], i);
    // p = 13: tail 12, 13 (T = 12); blocks 0..2 complete, scores .5 2 1: block 1 whole, then block 2's
    // lowest position (5 of the 7 slots after the tail): {4,5,6,7,8,12,13}
    const int64_t want[7] = {4, 5, 6, 7, 8, 12, 13};
    cr_assert_eq(select_of(sel, sc, 13, 4, 7), 7);
    for (int i = 0; i < 7; i++) cr_expect_eq(sel[i], want[i], "slot %d: %lld", i, (long long)sel[i]);
    // exact ties: the lower block first: {0,1,2,3,4,12,13}
    const double tie[3] = {1, 1, 1};
    const int64_t want_tie[7] = {0, 1, 2, 3, 4, 12, 13};
    cr_assert_eq(select_of(sel, tie, 13, 4, 7), 7);
    for (int i = 0; i < 7; i++) cr_expect_eq(sel[i], want_tie[i], "slot %d: %lld", i, (long long)sel[i]);
    // p = 11: no tail (T = 12), 7 of 12: block 1 whole + block 2's lowest three
    const int64_t want11[7] = {4, 5, 6, 7, 8, 9, 10};
    cr_assert_eq(select_of(sel, sc, 11, 4, 7), 7);
    for (int i = 0; i < 7; i++) cr_expect_eq(sel[i], want11[i], "slot %d: %lld", i, (long long)sel[i]);
    // tail of r-1 = 3 and B a multiple of r: whole blocks + tail (the spec's "B/r whole blocks + tail")
    cr_assert_eq(select_of(sel, sc, 14, 4, 7), 7);
    const int64_t want14[7] = {4, 5, 6, 7, 12, 13, 14};
    for (int i = 0; i < 7; i++) cr_expect_eq(sel[i], want14[i], "slot %d: %lld", i, (long long)sel[i]);
    // block score: ReLU per head, then the sum, no scale
    const double q[4] = {1, 2, -3, -1}, kb[2] = {1, 1};
    assert_close(td_ref_qsa_block_score_f64(q, kb, 2, 2), 3.0, 0); // max(0, 3) + max(0, -4)
}

/* rope-f32-mul / rope-f32-pow: parsed, one at a time, in canonical order. */
Test(act_q8, rope_angle_rules_parse) {
    td_profile p;
    char why[256], buf[128];
    cr_assert_eq(td_profile_parse("rope-f32-mul+act-q8", &p, why, sizeof why), 0, "%s", why);
    td_profile_format(&p, buf, sizeof buf);
    cr_assert_str_eq(buf, "act-q8+rope-f32-mul");
    cr_assert_eq(td_profile_rope_angle(&p), TD_ROPE_ANGLE_F32_MUL);
    cr_assert_eq(td_profile_parse("rope-f32-pow+acc-f16+mm-f16@8+attn-f16", &p, why, sizeof why), 0, "%s", why);
    td_profile_format(&p, buf, sizeof buf);
    cr_assert_str_eq(buf, "attn-f16+mm-f16@8+acc-f16+rope-f32-pow");
    cr_assert_eq(td_profile_rope_angle(&p), TD_ROPE_ANGLE_F32_POW);
    cr_assert_eq(td_profile_parse("act-q8", &p, why, sizeof why), 0);
    cr_assert_eq(td_profile_rope_angle(&p), TD_ROPE_ANGLE_EXACT);
    cr_assert_eq(td_profile_parse("rope-trig@4+rope-f32-pow+attn-f16", &p, why, sizeof why), 0, "%s", why);
    td_profile_format(&p, buf, sizeof buf);
    cr_assert_str_eq(buf, "attn-f16+rope-f32-pow+rope-trig@4");
    cr_assert_eq(p.rope_trig_u, 4);
    const char *bad[] = {"rope-f32-mul+rope-f32-pow", "rope-f32", "rope-f32-mul@2", "rope-f32-pow+rope-f32-pow",
                         "rope-trig", "rope-trig@0", "rope-trig@-1", "rope-trig@1048577", "rope-trig@4+rope-trig@4"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(td_profile_parse(bad[i], &p, why, sizeof why), -1, "'%s' must be refused", bad[i]);
        cr_assert(why[0], "'%s': no reason given", bad[i]);
    }
}

/* Under the rule, ref (f64) rotates by the f32 angle written out here step by
 * step (ggml-cpu: theta = pos, theta *= powf(base, -2/R) per pair; ggml-vulkan:
 * pos * powf(theta_scale, i)), its sine and cosine in f64; without it, by the
 * exact angle. At position 84 the f32 angles differ from the exact one by
 * ~1e-6 rad, far above f64 rounding, so each case tells the forms apart. */
Test(rope, angle_rules_rotate_by_the_f32_angle) {
    for (int form = 0; form < 3; form++) {
        td_ref_rope c = rope_cfg(TD_ROPE_NORM);
        c.R = 8, c.D = 8, c.angle = form;
        double x[8] = {1, 0, 1, 0, 1, 0, 1, 0};
        const int64_t pos = 84;
        td_ref_rope_f64(x, pos, &c, NULL, 1);
        const float ts = powf(10000.0f, -2.0f / 8.0f);
        float mul = (float)pos;
        for (int i = 0; i < 4; i++) {
            double th = (double)pos * pow(10000.0, -2.0 * i / 8.0);
            if (form == TD_ROPE_ANGLE_F32_MUL) th = mul;
            if (form == TD_ROPE_ANGLE_F32_POW) th = (float)pos * powf(ts, (float)i);
            mul *= ts;
            cr_expect_eq(x[2 * i], cos(th), "form %d pair %d: %.17g vs cos %.17g", form, i, x[2 * i], cos(th));
            cr_expect_eq(x[2 * i + 1], sin(th), "form %d pair %d: %.17g vs sin %.17g", form, i, x[2 * i + 1], sin(th));
        }
    }
}
