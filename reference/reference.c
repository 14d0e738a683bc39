/* tapdiff reference forward: the parts that do not depend on the arithmetic
 * type (the f64/f32 code is reference_impl.h, compiled by reference_f64.c and
 * reference_f32.c): GQA head mapping, and the arithmetic profiles' activation
 * rounding (reference.h). */
#include <math.h>
#include <string.h>

#include "reference.h"
#include "types.h"

int64_t td_ref_gqa_kv_head(int64_t h, int64_t H, int64_t Hkv) {
    TD_ASSERT(Hkv > 0 && H % Hkv == 0 && h >= 0 && h < H);
    // consecutive query heads share one KV head (HF repeat_kv), not h mod Hkv
    return h / (H / Hkv);
}

/* ===================================================================== */
/* Arithmetic profiles                                                    */
/* ===================================================================== */

int td_ref_profile_parse(const char *name, td_ref_profile *out) {
    if (!name || !name[0] || !strcmp(name, TD_PROFILE_NATIVE)) {
        *out = TD_REF_PROFILE_NATIVE;
        return 0;
    }
    if (!strcmp(name, TD_PROFILE_ACT_Q8)) {
        *out = TD_REF_PROFILE_ACT_Q8;
        return 0;
    }
    return -1;
}

int td_ref_act_format(int weight_type, td_ref_act_fmt *out) {
    // quants.md §8: the "vec-dot type" of each weight type on llama.cpp's CPU
    switch (weight_type) {
    case TD_TYPE_F32: *out = TD_ACT_F32; return 0;
    case TD_TYPE_F16: *out = TD_ACT_F16; return 0;
    case TD_TYPE_BF16: *out = TD_ACT_BF16; return 0;
    case TD_TYPE_Q4_0:
    case TD_TYPE_Q5_0:
    case TD_TYPE_Q8_0:
    case TD_TYPE_IQ4_NL:
    case TD_TYPE_MXFP4:
    case TD_TYPE_NVFP4:
    case TD_TYPE_Q1_0:
    case TD_TYPE_Q2_0: *out = TD_ACT_Q8_0; return 0;
    case TD_TYPE_Q4_1:
    case TD_TYPE_Q5_1: *out = TD_ACT_Q8_1; return 0;
    case TD_TYPE_Q2_K:
    case TD_TYPE_Q3_K:
    case TD_TYPE_Q4_K:
    case TD_TYPE_Q5_K:
    case TD_TYPE_Q6_K:
    case TD_TYPE_IQ2_XXS:
    case TD_TYPE_IQ2_XS:
    case TD_TYPE_IQ2_S:
    case TD_TYPE_IQ3_XXS:
    case TD_TYPE_IQ3_S:
    case TD_TYPE_IQ1_S:
    case TD_TYPE_IQ1_M:
    case TD_TYPE_IQ4_XS:
    case TD_TYPE_TQ1_0:
    case TD_TYPE_TQ2_0: *out = TD_ACT_Q8_K; return 0;
    default: return -1;
    }
}

int64_t td_ref_act_block(td_ref_act_fmt fmt) {
    switch (fmt) {
    case TD_ACT_Q8_0:
    case TD_ACT_Q8_1: return 32;
    case TD_ACT_Q8_K: return 256;
    default: return 1;
    }
}

/* One Q8_0 (or Q8_1: the same d and q) block of 32. The scale is rounded to
 * f16 for storage but the codes are computed with 127/a, not with the
 * stored scale, so a value's code can differ from rint(x / f16(d)). */
static void round_q8_0_block(float *out, const float *x) {
    float a = 0;
    for (int j = 0; j < 32; j++) {
        const float ax = fabsf(x[j]);
        if (ax > a) a = ax;
    }
    const float d = td_f16_to_f32(td_f32_to_f16(a / 127.0f));
    const float id = a != 0.0f ? 127.0f / a : 0.0f;
    for (int j = 0; j < 32; j++) {
        float q = rintf(x[j] * id); // default rounding mode: ties to even
        if (q > 127) q = 127;
        if (q < -127) q = -127;
        out[j] = d * q; // exact: 11-bit scale times an 8-bit code
    }
}

/* One Q8_K block of 256: the scale carries the sign of the largest-magnitude
 * value, so that value maps to -127 (never +128). */
static void round_q8_k_block(float *out, const float *x) {
    float a = 0, m = 0;
    for (int j = 0; j < 256; j++) {
        const float ax = fabsf(x[j]);
        if (ax > a) a = ax, m = x[j]; // strict: the first of equal magnitudes
    }
    if (a == 0.0f) {
        for (int j = 0; j < 256; j++) out[j] = 0;
        return;
    }
    const float s = -127.0f / m;
    const float d = 1.0f / s;
    for (int j = 0; j < 256; j++) {
        float q = rintf(s * x[j]);
        if (q > 127) q = 127;
        out[j] = d * q;
    }
}

void td_ref_act_round_f32(float *out, const float *x, int64_t n, td_ref_act_fmt fmt) {
    TD_ASSERT(n % td_ref_act_block(fmt) == 0);
    switch (fmt) {
    case TD_ACT_F32:
        if (out != x) memmove(out, x, (size_t)n * sizeof *out);
        return;
    case TD_ACT_F16:
        for (int64_t i = 0; i < n; i++) out[i] = td_f16_to_f32(td_f32_to_f16(x[i]));
        return;
    case TD_ACT_BF16:
        for (int64_t i = 0; i < n; i++) out[i] = td_bf16_to_f32(td_f32_to_bf16(x[i]));
        return;
    case TD_ACT_Q8_0:
    case TD_ACT_Q8_1:
        for (int64_t i = 0; i < n; i += 32) round_q8_0_block(out + i, x + i);
        return;
    case TD_ACT_Q8_K:
        for (int64_t i = 0; i < n; i += 256) round_q8_k_block(out + i, x + i);
        return;
    }
    TD_ASSERT(0 && "unknown activation format");
}
