/* tapdiff cpu backend: the portable C kernels and the table that starts from
 * them (cpu_kernels.h). Each dot product works block by block on the stored
 * bytes: integer codes times x summed in f32, then times the block's scale,
 * exactly as quants.md decodes the block. Nothing here depends on the CPU;
 * the AVX2 file overrides entries after. */
#include <math.h>
#include <string.h>

#include "blocks.h"
#include "cpu_kernels.h"

/* field offsets and block sizes from the one layout header */
#define OFF(T, f) offsetof(td_blk_##T, f)
#define SZ(T) sizeof(td_blk_##T)

#define f16 td_f16_to_f32
#define rd16 td_cpu_rd_u16

/* ===================================================================== */
/* Float types                                                            */
/* ===================================================================== */

static float dot_f32_f32(const float *a, const float *b, int64_t n) {
    // four partial sums: the same association the SIMD version uses per lane
    // is not needed here, only a fixed order
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += a[i] * b[i];
        s1 += a[i + 1] * b[i + 1];
        s2 += a[i + 2] * b[i + 2];
        s3 += a[i + 3] * b[i + 3];
    }
    for (; i < n; i++) s0 += a[i] * b[i];
    return (s0 + s1) + (s2 + s3);
}

static void axpy_f32(float *y, float a, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

static float dot_f32(const void *w, const float *x, const float *xs, int64_t n) {
    (void)xs;
    return dot_f32_f32(w, x, n);
}

static float dot_f16(const void *wv, const float *x, const float *xs, int64_t n) {
    (void)xs;
    const uint8_t *w = wv;
    float s = 0;
    for (int64_t i = 0; i < n; i++) s += f16(rd16(w + 2 * i)) * x[i];
    return s;
}

static float dot_bf16(const void *wv, const float *x, const float *xs, int64_t n) {
    (void)xs;
    const uint8_t *w = wv;
    float s = 0;
    for (int64_t i = 0; i < n; i++) s += td_bf16_to_f32(rd16(w + 2 * i)) * x[i];
    return s;
}

/* ===================================================================== */
/* 32-value block types (quants.md §2)                                    */
/* ===================================================================== */

static float dot_q8_0(const void *wv, const float *x, const float *xs, int64_t n) {
    (void)xs;
    const uint8_t *b = wv;
    float acc = 0;
    for (int64_t i = 0; i < n; i += 32, b += SZ(q8_0), x += 32) {
        const int8_t *q = (const int8_t *)(b + OFF(q8_0, qs));
        float s = 0;
        for (int j = 0; j < 32; j++) s += (float)q[j] * x[j];
        acc += f16(rd16(b + OFF(q8_0, d))) * s;
    }
    return acc;
}

static float dot_q4_0(const void *wv, const float *x, const float *xs, int64_t n) {
    (void)xs;
    const uint8_t *b = wv;
    float acc = 0;
    for (int64_t i = 0; i < n; i += 32, b += SZ(q4_0), x += 32) {
        const uint8_t *q = b + OFF(q4_0, qs);
        float s = 0;
        for (int j = 0; j < 16; j++) {
            // low nibbles are values 0..15, high nibbles values 16..31
            s += (float)((q[j] & 15) - 8) * x[j];
            s += (float)((q[j] >> 4) - 8) * x[j + 16];
        }
        acc += f16(rd16(b + OFF(q4_0, d))) * s;
    }
    return acc;
}

static float dot_q4_1(const void *wv, const float *x, const float *xs, int64_t n) {
    const uint8_t *b = wv;
    float acc = 0;
    for (int64_t i = 0; i < n; i += 32, b += SZ(q4_1), x += 32, xs++) {
        const uint8_t *q = b + OFF(q4_1, qs);
        float s = 0;
        for (int j = 0; j < 16; j++) s += (float)(q[j] & 15) * x[j] + (float)(q[j] >> 4) * x[j + 16];
        // y = d q + m: the offset contributes m * sum(x)
        acc += f16(rd16(b + OFF(q4_1, d))) * s + f16(rd16(b + OFF(q4_1, m))) * xs[0];
    }
    return acc;
}

static uint32_t rd_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static float dot_q5_0(const void *wv, const float *x, const float *xs, int64_t n) {
    (void)xs;
    const uint8_t *b = wv;
    float acc = 0;
    for (int64_t i = 0; i < n; i += 32, b += SZ(q5_0), x += 32) {
        const uint32_t qh = rd_u32(b + OFF(q5_0, qh));
        const uint8_t *q = b + OFF(q5_0, qs);
        float s = 0;
        for (int j = 0; j < 16; j++) {
            const int lo = (q[j] & 15) | (int)((qh >> j) & 1) << 4;
            const int hi = (q[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
            s += (float)(lo - 16) * x[j] + (float)(hi - 16) * x[j + 16];
        }
        acc += f16(rd16(b + OFF(q5_0, d))) * s;
    }
    return acc;
}

static float dot_q5_1(const void *wv, const float *x, const float *xs, int64_t n) {
    const uint8_t *b = wv;
    float acc = 0;
    for (int64_t i = 0; i < n; i += 32, b += SZ(q5_1), x += 32, xs++) {
        const uint32_t qh = rd_u32(b + OFF(q5_1, qh));
        const uint8_t *q = b + OFF(q5_1, qs);
        float s = 0;
        for (int j = 0; j < 16; j++) {
            const int lo = (q[j] & 15) | (int)((qh >> j) & 1) << 4;
            const int hi = (q[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
            s += (float)lo * x[j] + (float)hi * x[j + 16];
        }
        acc += f16(rd16(b + OFF(q5_1, d))) * s + f16(rd16(b + OFF(q5_1, m))) * xs[0];
    }
    return acc;
}

/* ===================================================================== */
/* K-quants (quants.md §4)                                                */
/* ===================================================================== */

static float dot_q2_k(const void *wv, const float *x, const float *xs, int64_t n) {
    (void)xs;
    const uint8_t *b = wv;
    float acc = 0;
    for (int64_t i = 0; i < n; i += TD_QK_K, b += SZ(q2_k), x += TD_QK_K) {
        const uint8_t *sc = b + OFF(q2_k, scales), *qs = b + OFF(q2_k, qs);
        const float d = f16(rd16(b + OFF(q2_k, d))), dmin = f16(rd16(b + OFF(q2_k, dmin)));
        float sum = 0, msum = 0;
        for (int h = 0; h < 2; h++)
            for (int j = 0; j < 4; j++)
                for (int k = 0; k < 2; k++) {
                    // 16 values n = 128h + 32j + 16k + l, one scale/min byte
                    const uint8_t s = sc[8 * h + 2 * j + k];
                    const float *xx = x + 128 * h + 32 * j + 16 * k;
                    float sq = 0, sx = 0;
                    for (int l = 0; l < 16; l++) {
                        sq += (float)((qs[32 * h + 16 * k + l] >> (2 * j)) & 3) * xx[l];
                        sx += xx[l];
                    }
                    sum += (float)(s & 15) * sq;
                    msum += (float)(s >> 4) * sx;
                }
        acc += d * sum - dmin * msum;
    }
    return acc;
}

static float dot_q3_k(const void *wv, const float *x, const float *xs, int64_t n) {
    (void)xs;
    const uint8_t *b = wv;
    float acc = 0;
    for (int64_t i = 0; i < n; i += TD_QK_K, b += SZ(q3_k), x += TD_QK_K) {
        const uint8_t *hm = b + OFF(q3_k, hmask), *qs = b + OFF(q3_k, qs), *sc = b + OFF(q3_k, scales);
        int S[16];
        for (int s = 0; s < 16; s++) {
            const int low4 = s < 8 ? sc[s] & 15 : sc[s - 8] >> 4;
            const int high2 = (sc[8 + (s % 4)] >> (2 * (s / 4))) & 3;
            S[s] = low4 + 16 * high2 - 32;
        }
        float sum = 0;
        for (int h = 0; h < 2; h++)
            for (int j = 0; j < 4; j++)
                for (int k = 0; k < 2; k++) {
                    const float *xx = x + 128 * h + 32 * j + 16 * k;
                    float sq = 0;
                    for (int l = 0; l < 16; l++) {
                        const int q2 = (qs[32 * h + 16 * k + l] >> (2 * j)) & 3;
                        const int hb = (hm[16 * k + l] >> (4 * h + j)) & 1;
                        sq += (float)(q2 - (hb ? 0 : 4)) * xx[l];
                    }
                    sum += (float)S[8 * h + 2 * j + k] * sq;
                }
        acc += f16(rd16(b + OFF(q3_k, d))) * sum;
    }
    return acc;
}

static float dot_q4_k(const void *wv, const float *x, const float *xs, int64_t n) {
    const uint8_t *b = wv;
    float acc = 0;
    for (int64_t i = 0; i < n; i += TD_QK_K, b += SZ(q4_k), x += TD_QK_K, xs += 8) {
        const float d = f16(rd16(b + OFF(q4_k, d))), dmin = f16(rd16(b + OFF(q4_k, dmin)));
        uint8_t sc[8], mn[8];
        td_cpu_kq_scales(b + OFF(q4_k, scales), sc, mn);
        const uint8_t *qs = b + OFF(q4_k, qs);
        float sum = 0, msum = 0;
        for (int c = 0; c < 4; c++) {
            float s0 = 0, s1 = 0;
            for (int l = 0; l < 32; l++) {
                s0 += (float)(qs[32 * c + l] & 15) * x[64 * c + l];
                s1 += (float)(qs[32 * c + l] >> 4) * x[64 * c + 32 + l];
            }
            sum += (float)sc[2 * c] * s0 + (float)sc[2 * c + 1] * s1;
        }
        for (int j = 0; j < 8; j++) msum += (float)mn[j] * xs[j];
        acc += d * sum - dmin * msum;
    }
    return acc;
}

static float dot_q5_k(const void *wv, const float *x, const float *xs, int64_t n) {
    const uint8_t *b = wv;
    float acc = 0;
    for (int64_t i = 0; i < n; i += TD_QK_K, b += SZ(q5_k), x += TD_QK_K, xs += 8) {
        const float d = f16(rd16(b + OFF(q5_k, d))), dmin = f16(rd16(b + OFF(q5_k, dmin)));
        uint8_t sc[8], mn[8];
        td_cpu_kq_scales(b + OFF(q5_k, scales), sc, mn);
        const uint8_t *qh = b + OFF(q5_k, qh), *qs = b + OFF(q5_k, qs);
        float sum = 0, msum = 0;
        for (int c = 0; c < 4; c++) {
            float s0 = 0, s1 = 0;
            for (int l = 0; l < 32; l++) {
                const int lo = (qs[32 * c + l] & 15) | ((qh[l] >> (2 * c)) & 1) << 4;
                const int hi = (qs[32 * c + l] >> 4) | ((qh[l] >> (2 * c + 1)) & 1) << 4;
                s0 += (float)lo * x[64 * c + l];
                s1 += (float)hi * x[64 * c + 32 + l];
            }
            sum += (float)sc[2 * c] * s0 + (float)sc[2 * c + 1] * s1;
        }
        for (int j = 0; j < 8; j++) msum += (float)mn[j] * xs[j];
        acc += d * sum - dmin * msum;
    }
    return acc;
}

static float dot_q6_k(const void *wv, const float *x, const float *xs, int64_t n) {
    (void)xs;
    const uint8_t *b = wv;
    float acc = 0;
    for (int64_t i = 0; i < n; i += TD_QK_K, b += SZ(q6_k), x += TD_QK_K) {
        const int8_t *S0 = (const int8_t *)(b + OFF(q6_k, scales));
        float sum = 0;
        for (int h = 0; h < 2; h++) {
            const uint8_t *L = b + OFF(q6_k, ql) + 64 * h, *H = b + OFF(q6_k, qh) + 32 * h;
            const int8_t *S = S0 + 8 * h;
            const float *xx = x + 128 * h;
            for (int t = 0; t < 2; t++) { // 16 values share a scale
                float s1 = 0, s2 = 0, s3 = 0, s4 = 0;
                for (int l = 16 * t; l < 16 * t + 16; l++) {
                    s1 += (float)((int)((L[l] & 15) | ((H[l] >> 0) & 3) << 4) - 32) * xx[l];
                    s2 += (float)((int)((L[l + 32] & 15) | ((H[l] >> 2) & 3) << 4) - 32) * xx[l + 32];
                    s3 += (float)((int)((L[l] >> 4) | ((H[l] >> 4) & 3) << 4) - 32) * xx[l + 64];
                    s4 += (float)((int)((L[l + 32] >> 4) | ((H[l] >> 6) & 3) << 4) - 32) * xx[l + 96];
                }
                sum += (float)S[t] * s1 + (float)S[t + 2] * s2 + (float)S[t + 4] * s3 + (float)S[t + 6] * s4;
            }
        }
        acc += f16(rd16(b + OFF(q6_k, d))) * sum;
    }
    return acc;
}

/* ===================================================================== */
/* act-q8: activations rounded to 8 bits per 32 values                    */
/* ===================================================================== */

/* codes q (n) with scale dj per 32 values: the scale arrays and x' */
static void act_sums(const int8_t *q, int64_t n, float *d, float *dsum16, float *dsum32, float *xd) {
    for (int64_t j = 0; j < n / 32; j++) {
        int s[2] = {0, 0};
        for (int i = 0; i < 32; i++) s[i / 16] += q[32 * j + i];
        dsum16[2 * j] = d[j] * (float)s[0];
        dsum16[2 * j + 1] = d[j] * (float)s[1];
        dsum32[j] = d[j] * (float)(s[0] + s[1]);
        if (xd)
            for (int i = 0; i < 32; i++) xd[32 * j + i] = d[j] * (float)q[32 * j + i];
    }
}

void td_cpu_quantize_act(td_cpu_act_fmt fmt, const float *x, int64_t n, int8_t *q, float *d, float *dsum16,
                         float *dsum32, float *xd) {
    if (fmt == TD_CPU_ACT_Q8_0) {
        for (int64_t j = 0; j < n / 32; j++) {
            const float *xb = x + 32 * j;
            float a = 0;
            for (int i = 0; i < 32; i++) a = fmaxf(a, fabsf(xb[i]));
            // the codes use 127/a, not the stored (f16-rounded) scale
            const float id = a != 0.0f ? 127.0f / a : 0.0f;
            d[j] = td_f16_round_trip_f32(a / 127.0f);
            for (int i = 0; i < 32; i++) {
                const float v = rintf(xb[i] * id); // default rounding: ties to even
                q[32 * j + i] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
            }
        }
    } else {
        for (int64_t b = 0; b < n / 256; b++) {
            const float *xb = x + 256 * b;
            float a = 0, m = 0;
            for (int i = 0; i < 256; i++)
                if (fabsf(xb[i]) > a) a = fabsf(xb[i]), m = xb[i]; // the first of equal magnitudes
            // the largest magnitude maps to -127, whatever its sign
            const float s = a != 0.0f ? -127.0f / m : 0.0f, dd = a != 0.0f ? 1.0f / s : 0.0f;
            for (int i = 0; i < 256; i++) {
                const float v = rintf(s * xb[i]);
                q[256 * b + i] = (int8_t)(v > 127 ? 127 : v);
            }
            for (int k = 0; k < 8; k++) d[8 * b + k] = dd;
        }
    }
    act_sums(q, n, d, dsum16, dsum32, xd);
}

/* The act-q8 dot products, in the one order every ISA level follows so the
 * levels agree bit for bit (cpu_kernels.h):
 *   32-value types: s_j = the block's exact integer sum; v_j =
 *     (dw_j * dx_j) * (float)s_j goes to lane j % 8 of 8 f32 accumulators
 *     (acc += v), summed at the end by td_cpu_red8;
 *   K-quants (one activation scale dx per super-block of 256): isum = the
 *     super-block's exact integer sum of scale code * Σ code*a (Q6_K: codes
 *     minus 32 before the product), v = (d * dx) * (float)isum, minus for
 *     Q4_K/Q5_K dmin * red8(mn_k * dsum32_k); the v of the super-blocks are
 *     added in order.
 * Multiplications and additions only, never fused (the SIMD code uses
 * separate mul and add where a value must match this file). */

static float dot_q8_q8_0(const void *wv, const td_cpu_xq8 *x, int64_t n) {
    const uint8_t *b = wv;
    float acc[8] = {0};
    for (int64_t j = 0; j < n / 32; j++, b += SZ(q8_0)) {
        const int8_t *w = (const int8_t *)(b + OFF(q8_0, qs)), *a = x->q + 32 * j;
        int32_t s = 0;
        for (int i = 0; i < 32; i++) s += (int32_t)w[i] * a[i];
        const float sc = f16(rd16(b + OFF(q8_0, d))) * x->d[j];
        acc[j & 7] += sc * (float)s;
    }
    return td_cpu_red8(acc);
}

static float dot_q8_q4_0(const void *wv, const td_cpu_xq8 *x, int64_t n) {
    const uint8_t *b = wv;
    float acc[8] = {0};
    for (int64_t j = 0; j < n / 32; j++, b += SZ(q4_0)) {
        const uint8_t *c = b + OFF(q4_0, qs);
        const int8_t *a = x->q + 32 * j;
        int32_t s = 0;
        for (int i = 0; i < 16; i++) s += ((c[i] & 15) - 8) * a[i] + ((c[i] >> 4) - 8) * a[i + 16];
        const float sc = f16(rd16(b + OFF(q4_0, d))) * x->d[j];
        acc[j & 7] += sc * (float)s;
    }
    return td_cpu_red8(acc);
}

/* Q4_K (has_qh = 0) and Q5_K */
static float dot_q8_kq(const uint8_t *b, size_t bytes, int has_qh, const td_cpu_xq8 *x, int64_t n) {
    float acc = 0;
    for (int64_t sb = 0; sb < n / TD_QK_K; sb++, b += bytes) {
        uint8_t sc[8], mn[8];
        td_cpu_kq_scales(b + OFF(q4_k, scales), sc, mn);
        const uint8_t *qh = b + OFF(q5_k, qh), *qs = b + (has_qh ? OFF(q5_k, qs) : OFF(q4_k, qs));
        const int8_t *a = x->q + TD_QK_K * sb;
        int32_t isum = 0;
        for (int c = 0; c < 4; c++) {
            int32_t s0 = 0, s1 = 0;
            for (int l = 0; l < 32; l++) {
                int lo = qs[32 * c + l] & 15, hi = qs[32 * c + l] >> 4;
                if (has_qh) lo |= ((qh[l] >> (2 * c)) & 1) << 4, hi |= ((qh[l] >> (2 * c + 1)) & 1) << 4;
                s0 += lo * a[64 * c + l];
                s1 += hi * a[64 * c + 32 + l];
            }
            isum += sc[2 * c] * s0 + sc[2 * c + 1] * s1;
        }
        float t[8];
        for (int k = 0; k < 8; k++) t[k] = (float)mn[k] * x->dsum32[8 * sb + k];
        const float dx = x->d[8 * sb];
        const float d = f16(rd16(b + OFF(q4_k, d))), dmin = f16(rd16(b + OFF(q4_k, dmin)));
        acc += (d * dx) * (float)isum - dmin * td_cpu_red8(t);
    }
    return acc;
}

static float dot_q8_q4_k(const void *w, const td_cpu_xq8 *x, int64_t n) {
    return dot_q8_kq(w, SZ(q4_k), 0, x, n);
}

static float dot_q8_q5_k(const void *w, const td_cpu_xq8 *x, int64_t n) {
    return dot_q8_kq(w, SZ(q5_k), 1, x, n);
}

static float dot_q8_q6_k(const void *wv, const td_cpu_xq8 *x, int64_t n) {
    const uint8_t *b = wv;
    float acc = 0;
    for (int64_t sb = 0; sb < n / TD_QK_K; sb++, b += SZ(q6_k)) {
        const int8_t *S = (const int8_t *)(b + OFF(q6_k, scales));
        int32_t isum = 0;
        for (int h = 0; h < 2; h++) {
            const uint8_t *L = b + OFF(q6_k, ql) + 64 * h, *H = b + OFF(q6_k, qh) + 32 * h;
            for (int m = 0; m < 4; m++) {
                // values 128h + 32m + l, l = 0..31: two groups of 16 with their own scale
                const int8_t *a = x->q + TD_QK_K * sb + 128 * h + 32 * m;
                for (int t = 0; t < 2; t++) {
                    int32_t s = 0;
                    for (int l = 16 * t; l < 16 * t + 16; l++) {
                        const int lq = m & 1 ? L[l + 32] : L[l];
                        const int c = (m < 2 ? lq & 15 : lq >> 4) | ((H[l] >> (2 * m)) & 3) << 4;
                        s += (c - 32) * a[l]; // codes are value + 32
                    }
                    isum += S[8 * h + 2 * m + t] * s;
                }
            }
        }
        acc += (f16(rd16(b + OFF(q6_k, d))) * x->d[8 * sb]) * (float)isum;
    }
    return acc;
}

/* ===================================================================== */
/* Row decoding: the model's exact decoder (one rounding to float)        */
/* ===================================================================== */

static void row_generic(int type, const void *w, float *dst, int64_t n) {
    td_err e;
    // the backend checks at open that every weight type decodes and that
    // rows are whole blocks, so a failure here is a programming error
    int rc = td_decode_row_f32(type, w, dst, n, &e);
    TD_ASSERT(rc == TD_OK);
}

/* ===================================================================== */
/* The table                                                              */
/* ===================================================================== */

void td_cpu_xsum(float *xsum, const float *x, int64_t n) {
    for (int64_t j = 0; j < n / TD_CPU_XSUM_GROUP; j++) {
        float s = 0;
        for (int i = 0; i < TD_CPU_XSUM_GROUP; i++) s += x[j * TD_CPU_XSUM_GROUP + i];
        xsum[j] = s;
    }
}

static const char *const k_isa_names[TD_CPU_ISA_COUNT] = {"c", "avx2", "avx512vnni"};

const char *td_cpu_isa_name(td_cpu_isa isa) {
    return isa >= 0 && isa < TD_CPU_ISA_COUNT ? k_isa_names[isa] : "?";
}

int td_cpu_isa_parse(const char *name) {
    for (int i = 0; name && i < TD_CPU_ISA_COUNT; i++)
        if (!strcmp(name, k_isa_names[i])) return i;
    return -1;
}

int td_cpu_has_isa(td_cpu_isa isa) {
    if (isa == TD_CPU_ISA_C) return 1;
    if (!td_cpu_has_avx2()) return 0;
    if (isa == TD_CPU_ISA_AVX2) return 1;
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__) && !(defined(__clang__) && __clang_major__ < 15)
    if (isa == TD_CPU_ISA_AVX512VNNI)
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
#endif
    return 0;
}

int td_cpu_has_avx2(void) {
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
    __builtin_cpu_init();
#if defined(__clang__) && __clang_major__ < 15
    // clang 14 (the fuzz build, fuzz/run.sh) has no "f16c" here; every CPU
    // with AVX2 and FMA has F16C.
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#endif
#else
    return 0;
#endif
}

void td_cpu_gemv(const td_cpu_type_ops *op, const void *w, size_t row_bytes, int64_t nr, const float *x,
                 const float *xsum, int64_t n, float *y) {
    const uint8_t *b = w;
    int64_t i = 0;
    if (op->dot_rows) {
        // rows a quarter of the range apart rather than neighbours (cpu_kernels.h)
        enum { R = TD_CPU_DOT_ROWS };
        const int64_t q = nr / R;
        for (; i < q; i++) {
            const void *rw[R];
            float yr[R];
            for (int r = 0; r < R; r++) rw[r] = b + (size_t)(i + r * q) * row_bytes;
            op->dot_rows(rw, x, xsum, n, yr);
            for (int r = 0; r < R; r++) y[i + r * q] = yr[r];
        }
        i = R * q;
    }
    for (; i < nr; i++) y[i] = op->dot(b + (size_t)i * row_bytes, x, xsum, n);
}

void td_cpu_kernels_init(td_cpu_kernels *k, td_cpu_isa max_isa) {
    memset(k, 0, sizeof *k);
    k->isa = TD_CPU_ISA_C;
    k->dot_f32 = dot_f32_f32;
    k->axpy_f32 = axpy_f32;
    k->quantize_act = td_cpu_quantize_act;
    for (int t = 0; t < TD_TYPE_COUNT; t++) {
        const td_type_info *ti = td_type_get(t);
        if (ti && ti->can_decode) k->type[t].to_f32 = row_generic;
    }
    static const struct {
        int type;
        td_cpu_dot_fn dot;
        int needs_xsum;
    } dots[] = {
        {TD_TYPE_F32, dot_f32, 0},   {TD_TYPE_F16, dot_f16, 0},   {TD_TYPE_BF16, dot_bf16, 0},
        {TD_TYPE_Q8_0, dot_q8_0, 0}, {TD_TYPE_Q4_0, dot_q4_0, 0}, {TD_TYPE_Q4_1, dot_q4_1, 1},
        {TD_TYPE_Q5_0, dot_q5_0, 0}, {TD_TYPE_Q5_1, dot_q5_1, 1}, {TD_TYPE_Q2_K, dot_q2_k, 0},
        {TD_TYPE_Q3_K, dot_q3_k, 0}, {TD_TYPE_Q4_K, dot_q4_k, 1}, {TD_TYPE_Q5_K, dot_q5_k, 1},
        {TD_TYPE_Q6_K, dot_q6_k, 0},
    };
    for (size_t i = 0; i < sizeof dots / sizeof dots[0]; i++) {
        k->type[dots[i].type].dot = dots[i].dot;
        k->type[dots[i].type].needs_xsum = dots[i].needs_xsum;
    }
    k->type[TD_TYPE_Q8_0].dot_q8 = dot_q8_q8_0;
    k->type[TD_TYPE_Q4_0].dot_q8 = dot_q8_q4_0;
    k->type[TD_TYPE_Q4_K].dot_q8 = dot_q8_q4_k;
    k->type[TD_TYPE_Q5_K].dot_q8 = dot_q8_q5_k;
    k->type[TD_TYPE_Q6_K].dot_q8 = dot_q8_q6_k;
    td_cpu_kernels_init_iq(k);
#if defined(__x86_64__) || defined(__i386__)
    if (max_isa >= TD_CPU_ISA_AVX2 && td_cpu_has_isa(TD_CPU_ISA_AVX2)) td_cpu_kernels_init_avx2(k);
    if (max_isa >= TD_CPU_ISA_AVX512VNNI && td_cpu_has_isa(TD_CPU_ISA_AVX512VNNI)) td_cpu_kernels_init_avx512vnni(k);
#else
    (void)max_isa;
#endif
}
