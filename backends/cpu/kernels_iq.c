/* tapdiff cpu backend: portable C dot kernels of the grid types (IQ1_S,
 * IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S) and NVFP4. The fields come
 * from model/blocks.h's per-group accessors (the same code a CUDA kernel
 * compiles), the grids from model/iq_grids.c. Per group of 8 values the
 * signed grid values times x are summed in f32, then scaled once by the
 * group's exact scale (d * odd multiplier / power of two is exact in f32):
 * the "native" arithmetic of cpu_kernels.h. Why no SIMD yet: the grid gather
 * dominates and these types are bandwidth-light; decode-then-dot was the
 * alternative, these avoid the round trip through memory. */
#include <stdint.h>

#include "blocks.h"
#include "cpu_kernels.h"

static inline float f16f(const uint8_t *p) { return td_f16_to_f32(td_blk_u16(p)); }

static inline float grid8_dot(const uint8_t *g, uint8_t neg, const float *x) {
    float s = 0;
    for (int j = 0; j < 8; j++) s += (float)((neg >> j) & 1 ? -g[j] : g[j]) * x[j];
    return s;
}

static inline float grid44_dot(const uint8_t *g1, const uint8_t *g2, uint8_t neg, const float *x) {
    float s = 0;
    for (int j = 0; j < 4; j++) s += (float)((neg >> j) & 1 ? -g1[j] : g1[j]) * x[j];
    for (int j = 0; j < 4; j++) s += (float)((neg >> (j + 4)) & 1 ? -g2[j] : g2[j]) * x[j + 4];
    return s;
}

#define IQ_LOOP(BYTES, BODY)                                                                    \
    const uint8_t *b = w;                                                                       \
    float acc = 0;                                                                              \
    (void)xs;                                                                                   \
    for (int64_t i = 0; i < n; i += TD_QK_K, b += (BYTES), x += TD_QK_K) {                      \
        BODY                                                                                    \
    }                                                                                           \
    return acc;

static float dot_iq2_xxs(const void *w, const float *x, const float *xs, int64_t n) {
    IQ_LOOP(sizeof(td_blk_iq2_xxs), {
        const float d = f16f(b) * 0.125f;
        for (int g = 0; g < 32; g++) {
            td_iq_group q = td_iq2_xxs_group(b, g);
            acc += d * (float)q.mul * grid8_dot(td_iq2xxs_grid[q.idx], q.neg, x + 8 * g);
        }
    })
}

static float dot_iq2_xs(const void *w, const float *x, const float *xs, int64_t n) {
    IQ_LOOP(sizeof(td_blk_iq2_xs), {
        const float d = f16f(b) * 0.125f;
        for (int g = 0; g < 32; g++) {
            td_iq_group q = td_iq2_xs_group(b, g);
            acc += d * (float)q.mul * grid8_dot(td_iq2xs_grid[q.idx], q.neg, x + 8 * g);
        }
    })
}

static float dot_iq2_s(const void *w, const float *x, const float *xs, int64_t n) {
    IQ_LOOP(sizeof(td_blk_iq2_s), {
        const float d = f16f(b) * 0.125f;
        for (int g = 0; g < 32; g++) {
            td_iq_group q = td_iq2_s_group(b, g);
            acc += d * (float)q.mul * grid8_dot(td_iq2s_grid[q.idx], q.neg, x + 8 * g);
        }
    })
}

static float dot_iq3_xxs(const void *w, const float *x, const float *xs, int64_t n) {
    IQ_LOOP(sizeof(td_blk_iq3_xxs), {
        const float d = f16f(b) * 0.25f;
        for (int g = 0; g < 32; g++) {
            td_iq_group q = td_iq3_xxs_group(b, g);
            acc += d * (float)q.mul * grid44_dot(td_iq3xxs_grid[q.idx], td_iq3xxs_grid[q.idx2], q.neg, x + 8 * g);
        }
    })
}

static float dot_iq3_s(const void *w, const float *x, const float *xs, int64_t n) {
    IQ_LOOP(sizeof(td_blk_iq3_s), {
        const float d = f16f(b);
        for (int g = 0; g < 32; g++) {
            td_iq_group q = td_iq3_s_group(b, g);
            acc += d * (float)q.mul * grid44_dot(td_iq3s_grid[q.idx], td_iq3s_grid[q.idx2], q.neg, x + 8 * g);
        }
    })
}

static inline float iq1_dot(const int8_t *g, int neg, const float *x) {
    const float delta = neg ? -0.125f : 0.125f;
    float s = 0;
    for (int j = 0; j < 8; j++) s += ((float)g[j] + delta) * x[j];
    return s;
}

static float dot_iq1_s(const void *w, const float *x, const float *xs, int64_t n) {
    IQ_LOOP(sizeof(td_blk_iq1_s), {
        const float d = f16f(b);
        for (int g = 0; g < 32; g++) {
            td_iq_group q = td_iq1_s_group(b, g);
            acc += d * (float)q.mul * iq1_dot(td_iq1s_grid[q.idx], q.neg, x + 8 * g);
        }
    })
}

static float dot_iq1_m(const void *w, const float *x, const float *xs, int64_t n) {
    IQ_LOOP(sizeof(td_blk_iq1_m), {
        const float d = td_f16_to_f32(td_iq1_m_d(b));
        for (int g = 0; g < 32; g++) {
            td_iq_group q = td_iq1_m_group(b, g);
            acc += d * (float)q.mul * iq1_dot(td_iq1s_grid[q.idx], q.neg, x + 8 * g);
        }
    })
}

static float dot_nvfp4(const void *w, const float *x, const float *xs, int64_t n) {
    static const int8_t kv[16] = TD_KV_FP4_INIT;
    const uint8_t *b = w;
    float acc = 0;
    (void)xs;
    for (int64_t i = 0; i < n; i += 64, b += sizeof(td_blk_nvfp4), x += 64) {
        const uint8_t *qs = b + offsetof(td_blk_nvfp4, qs);
        for (int s = 0; s < 4; s++) {
            float sum = 0;
            for (int j = 0; j < 8; j++) {
                sum += (float)kv[qs[8 * s + j] & 15] * x[16 * s + j];
                sum += (float)kv[qs[8 * s + j] >> 4] * x[16 * s + 8 + j];
            }
            acc += (float)td_blk_ue4m3_half(b[offsetof(td_blk_nvfp4, d) + s]) * sum;
        }
    }
    return acc;
}

void td_cpu_kernels_init_iq(td_cpu_kernels *k) {
    k->type[TD_TYPE_IQ2_XXS].dot = dot_iq2_xxs;
    k->type[TD_TYPE_IQ2_XS].dot = dot_iq2_xs;
    k->type[TD_TYPE_IQ2_S].dot = dot_iq2_s;
    k->type[TD_TYPE_IQ3_XXS].dot = dot_iq3_xxs;
    k->type[TD_TYPE_IQ3_S].dot = dot_iq3_s;
    k->type[TD_TYPE_IQ1_S].dot = dot_iq1_s;
    k->type[TD_TYPE_IQ1_M].dot = dot_iq1_m;
    k->type[TD_TYPE_NVFP4].dot = dot_nvfp4;
}
