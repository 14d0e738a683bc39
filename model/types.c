/* tapdiff: the ggml type table and the row decoders (blocks of bytes -> real
 * numbers) that every arm of the harness trusts. This is the oracle side:
 * scalar, one block at a time, no SIMD. The f64 decoder is exact (the codes
 * are small integers and the scales exact f16/f32 values, so every product and
 * sum fits in 53 bits); the f32 decoder returns the same numbers rounded once
 * to float. Formulas: ../shared/spec/quants.md; ids and sizes: gguf.md §5. */
#include "types.h"
#include "blocks.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

/* Field reads below go byte-wise through memcpy, which only gives the file's
 * little-endian values on a little-endian host. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "tapdiff assumes a little-endian host");
_Static_assert(sizeof(float) == 4 && sizeof(double) == 8, "IEEE binary32/binary64 expected");

/* ------------------------------------------------------------------------ */
/* Type table (gguf.md §5). Removed ids keep a zero entry (name NULL).        */

static const td_type_info k_types[TD_TYPE_COUNT] = {
    [TD_TYPE_F32] = {"F32", 1, 4, 1},
    [TD_TYPE_F16] = {"F16", 1, 2, 1},
    [TD_TYPE_Q4_0] = {"Q4_0", 32, 18, 1},
    [TD_TYPE_Q4_1] = {"Q4_1", 32, 20, 1},
    [TD_TYPE_Q5_0] = {"Q5_0", 32, 22, 1},
    [TD_TYPE_Q5_1] = {"Q5_1", 32, 24, 1},
    [TD_TYPE_Q8_0] = {"Q8_0", 32, 34, 1},
    [TD_TYPE_Q8_1] = {"Q8_1", 32, 36, 0},
    [TD_TYPE_Q2_K] = {"Q2_K", 256, 84, 1},
    [TD_TYPE_Q3_K] = {"Q3_K", 256, 110, 1},
    [TD_TYPE_Q4_K] = {"Q4_K", 256, 144, 1},
    [TD_TYPE_Q5_K] = {"Q5_K", 256, 176, 1},
    [TD_TYPE_Q6_K] = {"Q6_K", 256, 210, 1},
    [TD_TYPE_Q8_K] = {"Q8_K", 256, 292, 1},
    [TD_TYPE_IQ2_XXS] = {"IQ2_XXS", 256, 66, 1},
    [TD_TYPE_IQ2_XS] = {"IQ2_XS", 256, 74, 1},
    [TD_TYPE_IQ3_XXS] = {"IQ3_XXS", 256, 98, 1},
    [TD_TYPE_IQ1_S] = {"IQ1_S", 256, 50, 1},
    [TD_TYPE_IQ4_NL] = {"IQ4_NL", 32, 18, 1},
    [TD_TYPE_IQ3_S] = {"IQ3_S", 256, 110, 1},
    [TD_TYPE_IQ2_S] = {"IQ2_S", 256, 82, 1},
    [TD_TYPE_IQ4_XS] = {"IQ4_XS", 256, 136, 1},
    [TD_TYPE_I8] = {"I8", 1, 1, 0},
    [TD_TYPE_I16] = {"I16", 1, 2, 0},
    [TD_TYPE_I32] = {"I32", 1, 4, 0},
    [TD_TYPE_I64] = {"I64", 1, 8, 0},
    [TD_TYPE_F64] = {"F64", 1, 8, 1},
    [TD_TYPE_IQ1_M] = {"IQ1_M", 256, 56, 1},
    [TD_TYPE_BF16] = {"BF16", 1, 2, 1},
    [TD_TYPE_TQ1_0] = {"TQ1_0", 256, 54, 1},
    [TD_TYPE_TQ2_0] = {"TQ2_0", 256, 66, 1},
    [TD_TYPE_MXFP4] = {"MXFP4", 32, 17, 1},
    [TD_TYPE_NVFP4] = {"NVFP4", 64, 36, 1},
    [TD_TYPE_Q1_0] = {"Q1_0", 128, 18, 1},
    [TD_TYPE_Q2_0] = {"Q2_0", 64, 18, 1},
};

const td_type_info *td_type_get(int type_id) {
    if (type_id < 0 || type_id >= TD_TYPE_COUNT) return NULL;
    const td_type_info *t = &k_types[type_id];
    return t->name ? t : NULL;
}

const char *td_type_name(int type_id) {
    const td_type_info *t = td_type_get(type_id);
    if (t) return t->name;
    /* per thread, so two threads reporting bad ids do not garble each other */
    static _Thread_local char buf[32];
    snprintf(buf, sizeof buf, "type#%d", type_id);
    return buf;
}

size_t td_type_row_bytes(int type_id, int64_t n) {
    const td_type_info *t = td_type_get(type_id);
    if (!t || n < 0 || n % t->block_size != 0) return 0;
    int64_t blocks = n / t->block_size;
    if (blocks > (int64_t)(SIZE_MAX / 2) / t->block_bytes) return 0; /* would overflow */
    return (size_t)blocks * (size_t)t->block_bytes;
}

/* ------------------------------------------------------------------------ */
/* Scalar conversions                                                         */

static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float td_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t e = (h >> 10) & 0x1F;
    uint32_t m = h & 0x3FF;
    if (e == 0x1F) return bits_f32(sign | 0x7F800000u | (m << 13)); /* inf, or NaN keeping its payload */
    if (e != 0) return bits_f32(sign | ((e + 112) << 23) | (m << 13)); /* rebias 15 -> 127 */
    /* zero or subnormal: m * 2^-24 is exact in binary32 (normal there) */
    float v = (float)m * 0x1p-24f;
    return sign ? -v : v;
}

double td_f16_to_f64(uint16_t h) {
    /* every binary16 value (inf and NaN included) is exact in binary32 */
    return (double)td_f16_to_f32(h);
}

uint16_t td_f32_to_f16(float f) {
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return (uint16_t)(sign | 0x7E00 | ((a >> 13) & 0x1FF)); /* NaN stays NaN */
    /* 65520 is halfway between 65504 (odd mantissa) and 2^16: ties go up, to inf */
    if (a >= 0x477FF000u) return (uint16_t)(sign | 0x7C00);
    if (a >= 0x38800000u) { /* normal in binary16: drop 13 mantissa bits, round to nearest even */
        uint32_t r = ((a >> 23) - 112) << 10 | ((a >> 13) & 0x3FF);
        uint32_t rem = a & 0x1FFF;
        if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) r++; /* a carry into the exponent is right */
        return (uint16_t)(sign | r);
    }
    /* subnormal (or zero) in binary16: the result is round(|f| * 2^24) */
    uint32_t e = a >> 23;
    if (e < 101) return sign; /* |f| < 2^-26: below half the smallest subnormal */
    uint32_t m = (a & 0x7FFFFF) | 0x800000;
    uint32_t shift = 126 - e; /* |f| * 2^24 = m * 2^(e - 126); shift is 14..25 here */
    uint32_t q = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) q++; /* may become 0x400, the smallest normal */
    return (uint16_t)(sign | q);
}

float td_f16_round_trip_f32(float x) { return td_f16_to_f32(td_f32_to_f16(x)); }

double td_f16_round_trip_f64(double x) { return td_f16_to_f32(td_f32_to_f16((float)x)); }

float td_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t td_f32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x0040); /* keep it a NaN */
    u += 0x7FFF + ((u >> 16) & 1); /* round to nearest even; overflow carries into inf */
    return (uint16_t)(u >> 16);
}

/* ------------------------------------------------------------------------ */
/* Block decoders: one block at `b` -> B exact doubles in y.                  */

static inline uint16_t rd_u16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

static inline uint32_t rd_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline double rd_f16(const uint8_t *p) { return td_f16_to_f64(rd_u16(p)); }

#define FIELD(b, T, f) ((b) + offsetof(T, f))

/* Each decoder below computes the exact double of every value and stores it
 * either as is (y) or rounded once to float (yf, when not NULL): the f32 row
 * is (float) of the f64 row by construction, in one pass over the block. The
 * decoders are forced inline into a wrapper per output type so the branch
 * folds away. */
#define DEC_INLINE inline __attribute__((always_inline))
#define PUT(i, v)              \
    do {                       \
        double v_ = (v);       \
        if (yf)                \
            yf[i] = (float)v_; \
        else                   \
            y[i] = v_;         \
    } while (0)
#define LO(x) ((x) & 0x0F)
#define HI(x) ((x) >> 4)

static DEC_INLINE void dec_q4_0(const uint8_t *b, double *y, float *yf) {
    double d = rd_f16(FIELD(b, td_blk_q4_0, d));
    const uint8_t *qs = FIELD(b, td_blk_q4_0, qs);
    for (int j = 0; j < 16; j++) {
        PUT(j, d * (LO(qs[j]) - 8));
        PUT(j + 16, d * (HI(qs[j]) - 8));
    }
}

static DEC_INLINE void dec_q4_1(const uint8_t *b, double *y, float *yf) {
    double d = rd_f16(FIELD(b, td_blk_q4_1, d));
    double m = rd_f16(FIELD(b, td_blk_q4_1, m));
    const uint8_t *qs = FIELD(b, td_blk_q4_1, qs);
    for (int j = 0; j < 16; j++) {
        PUT(j, d * LO(qs[j]) + m);
        PUT(j + 16, d * HI(qs[j]) + m);
    }
}

static DEC_INLINE void dec_q5_0(const uint8_t *b, double *y, float *yf) {
    double d = rd_f16(FIELD(b, td_blk_q5_0, d));
    uint32_t qh = rd_u32(FIELD(b, td_blk_q5_0, qh));
    const uint8_t *qs = FIELD(b, td_blk_q5_0, qs);
    for (int j = 0; j < 16; j++) {
        int q0 = LO(qs[j]) | (int)(((qh >> j) & 1) << 4);
        int q1 = HI(qs[j]) | (int)(((qh >> (j + 16)) & 1) << 4);
        PUT(j, d * (q0 - 16));
        PUT(j + 16, d * (q1 - 16));
    }
}

static DEC_INLINE void dec_q5_1(const uint8_t *b, double *y, float *yf) {
    double d = rd_f16(FIELD(b, td_blk_q5_1, d));
    double m = rd_f16(FIELD(b, td_blk_q5_1, m));
    uint32_t qh = rd_u32(FIELD(b, td_blk_q5_1, qh));
    const uint8_t *qs = FIELD(b, td_blk_q5_1, qs);
    for (int j = 0; j < 16; j++) {
        int q0 = LO(qs[j]) | (int)(((qh >> j) & 1) << 4);
        int q1 = HI(qs[j]) | (int)(((qh >> (j + 16)) & 1) << 4);
        PUT(j, d * q0 + m);
        PUT(j + 16, d * q1 + m);
    }
}

static DEC_INLINE void dec_q8_0(const uint8_t *b, double *y, float *yf) {
    double d = rd_f16(FIELD(b, td_blk_q8_0, d));
    const int8_t *qs = (const int8_t *)FIELD(b, td_blk_q8_0, qs);
    for (int j = 0; j < 32; j++) PUT(j, d * qs[j]);
}

static DEC_INLINE void dec_q1_0(const uint8_t *b, double *y, float *yf) {
    double d = rd_f16(FIELD(b, td_blk_q1_0, d));
    const uint8_t *qs = FIELD(b, td_blk_q1_0, qs);
    for (int j = 0; j < 128; j++) PUT(j, ((qs[j / 8] >> (j % 8)) & 1) ? d : -d);
}

static DEC_INLINE void dec_q2_0(const uint8_t *b, double *y, float *yf) {
    double d = rd_f16(FIELD(b, td_blk_q2_0, d));
    const uint8_t *qs = FIELD(b, td_blk_q2_0, qs);
    for (int j = 0; j < 64; j++) PUT(j, d * (((qs[j / 4] >> (2 * (j % 4))) & 3) - 1));
}

/* doubled E2M1 values, so that every entry is an integer */
static const int8_t k_fp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

static DEC_INLINE void dec_mxfp4(const uint8_t *b, double *y, float *yf) {
    double d = ldexp(1.0, (int)b[offsetof(td_blk_mxfp4, e)] - 128);
    const uint8_t *qs = FIELD(b, td_blk_mxfp4, qs);
    for (int j = 0; j < 16; j++) {
        PUT(j, d * k_fp4[LO(qs[j])]);
        PUT(j + 16, d * k_fp4[HI(qs[j])]);
    }
}

static const int8_t k_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                   1,    13,   25,  38,  53,  69,  89,  113};

static DEC_INLINE void dec_iq4_nl(const uint8_t *b, double *y, float *yf) {
    double d = rd_f16(FIELD(b, td_blk_iq4_nl, d));
    const uint8_t *qs = FIELD(b, td_blk_iq4_nl, qs);
    for (int j = 0; j < 16; j++) {
        PUT(j, d * k_iq4nl[LO(qs[j])]);
        PUT(j + 16, d * k_iq4nl[HI(qs[j])]);
    }
}

static DEC_INLINE void dec_iq4_xs(const uint8_t *b, double *y, float *yf) {
    double d = rd_f16(FIELD(b, td_blk_iq4_xs, d));
    unsigned sh = rd_u16(FIELD(b, td_blk_iq4_xs, scales_h));
    const uint8_t *sl = FIELD(b, td_blk_iq4_xs, scales_l);
    const uint8_t *qs = FIELD(b, td_blk_iq4_xs, qs);
    for (int s = 0; s < 8; s++) { /* 32-value sub-blocks */
        int ls = ((sl[s / 2] >> (4 * (s % 2))) & 0xF) | (int)(((sh >> (2 * s)) & 3) << 4);
        double dl = d * (ls - 32);
        for (int j = 0; j < 16; j++) {
            PUT(32 * s + j, dl * k_iq4nl[LO(qs[16 * s + j])]);
            PUT(32 * s + 16 + j, dl * k_iq4nl[HI(qs[16 * s + j])]);
        }
    }
}

static DEC_INLINE void dec_q2_k(const uint8_t *b, double *y, float *yf) {
    double d = rd_f16(FIELD(b, td_blk_q2_k, d));
    double dmin = rd_f16(FIELD(b, td_blk_q2_k, dmin));
    const uint8_t *sc = FIELD(b, td_blk_q2_k, scales);
    const uint8_t *qs = FIELD(b, td_blk_q2_k, qs);
    /* n = 128h + 32j + 16k + l: each qs byte holds 4 codes, 32 values apart */
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < 4; j++)
            for (int k = 0; k < 2; k++) {
                uint8_t s = sc[8 * h + 2 * j + k];
                double dl = d * LO(s), ml = dmin * HI(s);
                for (int l = 0; l < 16; l++) {
                    int q = (qs[32 * h + 16 * k + l] >> (2 * j)) & 3;
                    PUT(128 * h + 32 * j + 16 * k + l, dl * q - ml);
                }
            }
}

static DEC_INLINE void dec_q3_k(const uint8_t *b, double *y, float *yf) {
    double d = rd_f16(FIELD(b, td_blk_q3_k, d));
    const uint8_t *hm = FIELD(b, td_blk_q3_k, hmask);
    const uint8_t *qs = FIELD(b, td_blk_q3_k, qs);
    const uint8_t *sc = FIELD(b, td_blk_q3_k, scales);
    int S[16];
    for (int i = 0; i < 16; i++) {
        int low4 = i < 8 ? LO(sc[i]) : HI(sc[i - 8]);
        int high2 = (sc[8 + i % 4] >> (2 * (i / 4))) & 3;
        S[i] = low4 + 16 * high2 - 32;
    }
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < 4; j++)
            for (int k = 0; k < 2; k++) {
                double dl = d * S[8 * h + 2 * j + k];
                for (int l = 0; l < 16; l++) {
                    int q2 = (qs[32 * h + 16 * k + l] >> (2 * j)) & 3;
                    int hb = (hm[16 * k + l] >> (4 * h + j)) & 1;
                    PUT(128 * h + 32 * j + 16 * k + l, dl * (q2 - (hb ? 0 : 4)));
                }
            }
}

/* the 8 scale and 8 min codes (6 bits each) of Q4_K / Q5_K */
static void unpack_k_scales(const uint8_t *s, int sc[8], int mn[8]) {
    for (int i = 0; i < 4; i++) {
        sc[i] = s[i] & 63;
        mn[i] = s[i + 4] & 63;
    }
    for (int i = 4; i < 8; i++) {
        sc[i] = LO(s[i + 4]) | ((s[i - 4] >> 6) << 4);
        mn[i] = HI(s[i + 4]) | ((s[i] >> 6) << 4);
    }
}

static DEC_INLINE void dec_q4_k(const uint8_t *b, double *y, float *yf) {
    double d = rd_f16(FIELD(b, td_blk_q4_k, d));
    double dmin = rd_f16(FIELD(b, td_blk_q4_k, dmin));
    const uint8_t *qs = FIELD(b, td_blk_q4_k, qs);
    int sc[8], mn[8];
    unpack_k_scales(FIELD(b, td_blk_q4_k, scales), sc, mn);
    for (int c = 0; c < 4; c++) {
        double d0 = d * sc[2 * c], m0 = dmin * mn[2 * c];
        double d1 = d * sc[2 * c + 1], m1 = dmin * mn[2 * c + 1];
        for (int l = 0; l < 32; l++) {
            PUT(64 * c + l, d0 * LO(qs[32 * c + l]) - m0);
            PUT(64 * c + 32 + l, d1 * HI(qs[32 * c + l]) - m1);
        }
    }
}

static DEC_INLINE void dec_q5_k(const uint8_t *b, double *y, float *yf) {
    double d = rd_f16(FIELD(b, td_blk_q5_k, d));
    double dmin = rd_f16(FIELD(b, td_blk_q5_k, dmin));
    const uint8_t *qh = FIELD(b, td_blk_q5_k, qh);
    const uint8_t *qs = FIELD(b, td_blk_q5_k, qs);
    int sc[8], mn[8];
    unpack_k_scales(FIELD(b, td_blk_q5_k, scales), sc, mn);
    for (int c = 0; c < 4; c++) {
        double d0 = d * sc[2 * c], m0 = dmin * mn[2 * c];
        double d1 = d * sc[2 * c + 1], m1 = dmin * mn[2 * c + 1];
        for (int l = 0; l < 32; l++) {
            int q0 = LO(qs[32 * c + l]) + 16 * ((qh[l] >> (2 * c)) & 1);
            int q1 = HI(qs[32 * c + l]) + 16 * ((qh[l] >> (2 * c + 1)) & 1);
            PUT(64 * c + l, d0 * q0 - m0);
            PUT(64 * c + 32 + l, d1 * q1 - m1);
        }
    }
}

static DEC_INLINE void dec_q6_k(const uint8_t *b, double *y, float *yf) {
    double d = rd_f16(FIELD(b, td_blk_q6_k, d));
    const uint8_t *ql = FIELD(b, td_blk_q6_k, ql);
    const uint8_t *qh = FIELD(b, td_blk_q6_k, qh);
    const int8_t *sc = (const int8_t *)FIELD(b, td_blk_q6_k, scales);
    for (int h = 0; h < 2; h++) {
        const uint8_t *L = ql + 64 * h, *H = qh + 32 * h;
        const int8_t *S = sc + 8 * h;
        const int o = 128 * h;
        for (int l = 0; l < 32; l++) {
            int t = l / 16;
            int q1 = (LO(L[l]) | (((H[l] >> 0) & 3) << 4)) - 32;
            int q2 = (LO(L[l + 32]) | (((H[l] >> 2) & 3) << 4)) - 32;
            int q3 = (HI(L[l]) | (((H[l] >> 4) & 3) << 4)) - 32;
            int q4 = (HI(L[l + 32]) | (((H[l] >> 6) & 3) << 4)) - 32;
            PUT(o + l, d * S[t + 0] * q1);
            PUT(o + l + 32, d * S[t + 2] * q2);
            PUT(o + l + 64, d * S[t + 4] * q3);
            PUT(o + l + 96, d * S[t + 6] * q4);
        }
    }
}

static DEC_INLINE void dec_q8_k(const uint8_t *b, double *y, float *yf) {
    float df;
    memcpy(&df, FIELD(b, td_blk_q8_k, d), 4);
    double d = df;
    const int8_t *qs = (const int8_t *)FIELD(b, td_blk_q8_k, qs);
    for (int j = 0; j < TD_QK_K; j++) PUT(j, d * qs[j]);
}

static DEC_INLINE void dec_tq2_0(const uint8_t *b, double *y, float *yf) {
    double d = rd_f16(FIELD(b, td_blk_tq2_0, d));
    const uint8_t *qs = FIELD(b, td_blk_tq2_0, qs);
    for (int c = 0; c < 2; c++)
        for (int s = 0; s < 4; s++)
            for (int m = 0; m < 32; m++) PUT(128 * c + 32 * s + m, d * (((qs[32 * c + m] >> (2 * s)) & 3) - 1));
}

/* n-th base-3 digit of a fixed-point trit byte: floor(3 * ((b * 3^n) mod 256) / 256) */
static inline int trit(uint8_t b, int n) {
    static const uint8_t pow3[5] = {1, 3, 9, 27, 81};
    uint8_t v = (uint8_t)(b * pow3[n]); /* the mod 256 is the 8-bit wrap */
    return (v * 3) >> 8;
}

static DEC_INLINE void dec_tq1_0(const uint8_t *b, double *y, float *yf) {
    double d = rd_f16(FIELD(b, td_blk_tq1_0, d));
    const uint8_t *qs = FIELD(b, td_blk_tq1_0, qs);
    const uint8_t *qh = FIELD(b, td_blk_tq1_0, qh);
    for (int n = 0; n < 5; n++)
        for (int m = 0; m < 32; m++) PUT(32 * n + m, d * (trit(qs[m], n) - 1));
    for (int n = 0; n < 5; n++)
        for (int m = 0; m < 16; m++) PUT(160 + 16 * n + m, d * (trit(qs[32 + m], n) - 1));
    for (int n = 0; n < 4; n++)
        for (int m = 0; m < 4; m++) PUT(240 + 4 * n + m, d * (trit(qh[m], n) - 1));
}

typedef void (*block_dec_fn)(const uint8_t *b, double *y);
typedef void (*block_dec32_fn)(const uint8_t *b, float *y);

#define DEC_PAIR(name)                                                       \
    static void name##_64(const uint8_t *b, double *y) { name(b, y, NULL); } \
    static void name##_32(const uint8_t *b, float *y) { name(b, NULL, y); }
DEC_PAIR(dec_q4_0)
DEC_PAIR(dec_q4_1)
DEC_PAIR(dec_q5_0)
DEC_PAIR(dec_q5_1)
DEC_PAIR(dec_q8_0)
DEC_PAIR(dec_q1_0)
DEC_PAIR(dec_q2_0)
DEC_PAIR(dec_mxfp4)
DEC_PAIR(dec_iq4_nl)
DEC_PAIR(dec_iq4_xs)
DEC_PAIR(dec_q2_k)
DEC_PAIR(dec_q3_k)
DEC_PAIR(dec_q4_k)
DEC_PAIR(dec_q5_k)
DEC_PAIR(dec_q6_k)
DEC_PAIR(dec_q8_k)
DEC_PAIR(dec_tq1_0)
DEC_PAIR(dec_tq2_0)

/* decoders of the block types (block_size > 1); plain types are handled inline */
static block_dec_fn block_decoder(int type_id) {
    switch (type_id) {
    case TD_TYPE_Q4_0: return dec_q4_0_64;
    case TD_TYPE_Q4_1: return dec_q4_1_64;
    case TD_TYPE_Q5_0: return dec_q5_0_64;
    case TD_TYPE_Q5_1: return dec_q5_1_64;
    case TD_TYPE_Q8_0: return dec_q8_0_64;
    case TD_TYPE_Q1_0: return dec_q1_0_64;
    case TD_TYPE_Q2_0: return dec_q2_0_64;
    case TD_TYPE_MXFP4: return dec_mxfp4_64;
    case TD_TYPE_IQ4_NL: return dec_iq4_nl_64;
    case TD_TYPE_IQ4_XS: return dec_iq4_xs_64;
    case TD_TYPE_Q2_K: return dec_q2_k_64;
    case TD_TYPE_Q3_K: return dec_q3_k_64;
    case TD_TYPE_Q4_K: return dec_q4_k_64;
    case TD_TYPE_Q5_K: return dec_q5_k_64;
    case TD_TYPE_Q6_K: return dec_q6_k_64;
    case TD_TYPE_Q8_K: return dec_q8_k_64;
    case TD_TYPE_TQ1_0: return dec_tq1_0_64;
    case TD_TYPE_TQ2_0: return dec_tq2_0_64;
    case TD_TYPE_IQ2_XXS: return td_blk_dec_iq2_xxs;
    case TD_TYPE_IQ2_XS: return td_blk_dec_iq2_xs;
    case TD_TYPE_IQ2_S: return td_blk_dec_iq2_s;
    case TD_TYPE_IQ3_XXS: return td_blk_dec_iq3_xxs;
    case TD_TYPE_IQ3_S: return td_blk_dec_iq3_s;
    case TD_TYPE_IQ1_S: return td_blk_dec_iq1_s;
    case TD_TYPE_IQ1_M: return td_blk_dec_iq1_m;
    case TD_TYPE_NVFP4: return td_blk_dec_nvfp4;
    default: return NULL;
    }
}

/* the one-pass float decoders; NULL for the types (the IQ grids, NVFP4) whose
 * shared block decoders (blocks.h) only produce doubles */
static block_dec32_fn block_decoder32(int type_id) {
    switch (type_id) {
    case TD_TYPE_Q4_0: return dec_q4_0_32;
    case TD_TYPE_Q4_1: return dec_q4_1_32;
    case TD_TYPE_Q5_0: return dec_q5_0_32;
    case TD_TYPE_Q5_1: return dec_q5_1_32;
    case TD_TYPE_Q8_0: return dec_q8_0_32;
    case TD_TYPE_Q1_0: return dec_q1_0_32;
    case TD_TYPE_Q2_0: return dec_q2_0_32;
    case TD_TYPE_MXFP4: return dec_mxfp4_32;
    case TD_TYPE_IQ4_NL: return dec_iq4_nl_32;
    case TD_TYPE_IQ4_XS: return dec_iq4_xs_32;
    case TD_TYPE_Q2_K: return dec_q2_k_32;
    case TD_TYPE_Q3_K: return dec_q3_k_32;
    case TD_TYPE_Q4_K: return dec_q4_k_32;
    case TD_TYPE_Q5_K: return dec_q5_k_32;
    case TD_TYPE_Q6_K: return dec_q6_k_32;
    case TD_TYPE_Q8_K: return dec_q8_k_32;
    case TD_TYPE_TQ1_0: return dec_tq1_0_32;
    case TD_TYPE_TQ2_0: return dec_tq2_0_32;
    default: return NULL;
    }
}

/* ggml-vulkan's f16 tile loader of the IQ2 grids (td_row_mode): the group
 * scale d*(2s+1)/8, exact in f32, rounded to f16 before the grid value
 * multiplies it; the row decoder rounds the product to f16 after. */

static void dec_iq2_f16_scale(const uint8_t *b, double *y, td_iq_group (*group)(const uint8_t *, int),
                              const uint8_t (*grid)[8]) {
    const double d = td_blk_f16(td_blk_u16(b));
    for (int g = 0; g < 32; g++) {
        const td_iq_group q = group(b, g);
        td_iq_dec_grid8(td_f16_round_trip_f64(d * q.mul / 8), grid[q.idx], q.neg, y + 8 * g);
    }
}

static void dec_iq2_xxs_tile(const uint8_t *b, double *y) {
    dec_iq2_f16_scale(b, y, td_iq2_xxs_group, TD_IQ_TABLE(iq2xxs_grid));
}
static void dec_iq2_xs_tile(const uint8_t *b, double *y) {
    dec_iq2_f16_scale(b, y, td_iq2_xs_group, TD_IQ_TABLE(iq2xs_grid));
}
static void dec_iq2_s_tile(const uint8_t *b, double *y) {
    dec_iq2_f16_scale(b, y, td_iq2_s_group, TD_IQ_TABLE(iq2s_grid));
}

/* the block decoders of the types whose f16 tile loader rounds before the
 * end (td_row_mode); NULL for the others */
static block_dec_fn tile_decoder(int type_id) {
    switch (type_id) {
    case TD_TYPE_IQ2_XXS: return dec_iq2_xxs_tile;
    case TD_TYPE_IQ2_XS: return dec_iq2_xs_tile;
    case TD_TYPE_IQ2_S: return dec_iq2_s_tile;
    default: return NULL;
    }
}

static void round_f16_64(double *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = td_f16_round_trip_f64(x[i]);
}

static void round_f16_32(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = td_f16_round_trip_f32(x[i]);
}

/* ------------------------------------------------------------------------ */
/* Row decoders                                                              */

static int check_row(int type_id, int64_t n, const char *fn, const td_type_info **out, td_err *err) {
    const td_type_info *t = td_type_get(type_id);
    if (!t) return td_err_set(err, TD_EINPUT, "%s: invalid ggml type id %d", fn, type_id);
    if (!t->can_decode)
        return td_err_set(err, TD_EINPUT, "%s: type %s (id %d) has no row decoder", fn, t->name, type_id);
    if (n < 0 || n % t->block_size != 0)
        return td_err_set(err, TD_EINPUT,
                          "%s: type %s: expected a row length that is a multiple of the block size %lld, "
                          "found %lld values",
                          fn, t->name, (long long)t->block_size, (long long)n);
    *out = t;
    return TD_OK;
}

/* A row's values in a mode (n > 0, checked). */
static void decode_values_f64(const td_type_info *t, int type_id, const uint8_t *p, double *dst, int64_t n,
                              td_row_mode mode) {
    switch (type_id) {
    case TD_TYPE_F32:
        for (int64_t i = 0; i < n; i++) {
            float v;
            memcpy(&v, p + 4 * i, 4);
            dst[i] = v;
        }
        break;
    case TD_TYPE_F64: memcpy(dst, p, (size_t)n * 8); break;
    case TD_TYPE_F16:
        for (int64_t i = 0; i < n; i++) dst[i] = td_f16_to_f64(rd_u16(p + 2 * i));
        break;
    case TD_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) dst[i] = td_bf16_to_f32(rd_u16(p + 2 * i));
        break;
    default: {
        block_dec_fn tile = mode == TD_ROW_F16_TILE ? tile_decoder(type_id) : NULL;
        block_dec_fn fn = tile ? tile : block_decoder(type_id);
        TD_ASSERT(fn); /* the table's can_decode and block_decoder() must agree */
        int64_t nb = n / t->block_size;
        for (int64_t i = 0; i < nb; i++) fn(p + i * t->block_bytes, dst + i * t->block_size);
    }
    }
    if (mode != TD_ROW_EXACT) round_f16_64(dst, n);
}

/* td_decode_row_f64 and _as_f64, errors under the name fn. */
static int decode_row_f64(const char *fn, int type_id, const void *src, double *dst, int64_t n, td_row_mode mode,
                          td_err *err) {
    const td_type_info *t;
    int st = check_row(type_id, n, fn, &t, err);
    if (st != TD_OK || n == 0) return st;
    TD_ASSERT(src && dst);
    decode_values_f64(t, type_id, src, dst, n, mode);
    return TD_OK;
}

int td_decode_row_f64(int type_id, const void *src, double *dst, int64_t n, td_err *err) {
    return decode_row_f64("td_decode_row_f64", type_id, src, dst, n, TD_ROW_EXACT, err);
}

int td_decode_row_as_f64(int type_id, const void *src, double *dst, int64_t n, td_row_mode mode, td_err *err) {
    return decode_row_f64("td_decode_row_as_f64", type_id, src, dst, n, mode, err);
}

/* The block values of a row in float: the f32 decoder's, else the f64 ones
 * rounded once (the f32 row is by construction (float) of the f64 row). */
static void decode_blocks_f32(const td_type_info *t, int type_id, const uint8_t *p, float *dst, int64_t n,
                              td_row_mode mode) {
    int64_t nb = n / t->block_size;
    block_dec_fn tile = mode == TD_ROW_F16_TILE ? tile_decoder(type_id) : NULL;
    block_dec32_fn f32 = tile ? NULL : block_decoder32(type_id);
    if (f32) {
        for (int64_t i = 0; i < nb; i++) f32(p + i * t->block_bytes, dst + i * t->block_size);
        return;
    }
    block_dec_fn fn = tile ? tile : block_decoder(type_id);
    TD_ASSERT(fn);
    double y[TD_QK_K]; /* the largest block */
    TD_ASSERT(t->block_size <= TD_QK_K);
    for (int64_t i = 0; i < nb; i++) {
        fn(p + i * t->block_bytes, y);
        float *o = dst + i * t->block_size;
        for (int64_t j = 0; j < t->block_size; j++) o[j] = (float)y[j];
    }
}

/* td_decode_row_f32 and _as_f32, errors under the name fn. */
static int decode_row_f32(const char *fn, int type_id, const void *src, float *dst, int64_t n, td_row_mode mode,
                          td_err *err) {
    const td_type_info *t;
    int st = check_row(type_id, n, fn, &t, err);
    if (st != TD_OK || n == 0) return st;
    TD_ASSERT(src && dst);
    const uint8_t *p = src;
    switch (type_id) {
    case TD_TYPE_F32: memcpy(dst, p, (size_t)n * 4); break;
    case TD_TYPE_F64:
        for (int64_t i = 0; i < n; i++) {
            double v;
            memcpy(&v, p + 8 * i, 8);
            dst[i] = (float)v;
        }
        break;
    case TD_TYPE_F16:
        for (int64_t i = 0; i < n; i++) dst[i] = td_f16_to_f32(rd_u16(p + 2 * i));
        break;
    case TD_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) dst[i] = td_bf16_to_f32(rd_u16(p + 2 * i));
        break;
    default: decode_blocks_f32(t, type_id, p, dst, n, mode);
    }
    if (mode != TD_ROW_EXACT) round_f16_32(dst, n);
    return TD_OK;
}

int td_decode_row_f32(int type_id, const void *src, float *dst, int64_t n, td_err *err) {
    return decode_row_f32("td_decode_row_f32", type_id, src, dst, n, TD_ROW_EXACT, err);
}

int td_decode_row_as_f32(int type_id, const void *src, float *dst, int64_t n, td_row_mode mode, td_err *err) {
    return decode_row_f32("td_decode_row_as_f32", type_id, src, dst, n, mode, err);
}
