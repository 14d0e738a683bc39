/* tapdiff: the ggml block layouts, in one place. One struct per quantized
 * format with a comment per field and a size assertion, plus the per-block
 * field extraction and decoders of the grid types and NVFP4, written so that C
 * and CUDA (host and device) compile the same code: functions are TD_HD
 * (`__host__ __device__` under nvcc, nothing in C), use no libc beyond
 * memcpy, and read multi-byte fields byte-wise (blocks in a mapped file may
 * be unaligned; never dereference a block through a struct pointer, use the
 * structs for offsetof() and sizeof()). Formulas: ../shared/spec/quants.md
 * and docs/quants-iq.md. The codebook tables are data (model/iq_grids.c);
 * a CUDA translation unit defines TD_IQ_TABLE(name) to its device copy
 * (d_##name under __CUDA_ARCH__, td_##name on the host) before including
 * this header, as model/tests/blocks_cuda.cu does (compiled by nvcc in the
 * `model` suite where a CUDA toolkit is installed). */
#ifndef TD_BLOCKS_H
#define TD_BLOCKS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define TD_HD __host__ __device__
#else
#define TD_HD
#endif

#ifdef __cplusplus
#define TD_BLK_ASSERT(c, m) static_assert(c, m)
extern "C" {
#else
#define TD_BLK_ASSERT(c, m) _Static_assert(c, m)
#endif

#ifndef TD_QK_K
#define TD_QK_K 256 /* values per super-block of the K, IQ and TQ types */
#endif

/* ------------------------------------------------------------------------ */
/* Existing formats                                                           */


typedef struct {
    uint16_t d;      /* f16 scale */
    uint8_t qs[16];  /* 32 x 4-bit codes: low nibbles = y[0..15], high = y[16..31] */
} td_blk_q4_0;
TD_BLK_ASSERT(sizeof(td_blk_q4_0) == 18, "Q4_0 block is 18 bytes");

typedef struct {
    uint16_t d;      /* f16 scale */
    uint16_t m;      /* f16 offset added to every value (the block min) */
    uint8_t qs[16];  /* 32 x 4-bit codes, nibble order as Q4_0 */
} td_blk_q4_1;
TD_BLK_ASSERT(sizeof(td_blk_q4_1) == 20, "Q4_1 block is 20 bytes");

typedef struct {
    uint16_t d;      /* f16 scale */
    uint8_t qh[4];   /* u32 LE: bit j = 5th bit of code j (bytes, to keep the struct unpadded) */
    uint8_t qs[16];  /* low 4 bits of the 32 codes, nibble order as Q4_0 */
} td_blk_q5_0;
TD_BLK_ASSERT(sizeof(td_blk_q5_0) == 22, "Q5_0 block is 22 bytes");

typedef struct {
    uint16_t d;      /* f16 scale */
    uint16_t m;      /* f16 offset (min) */
    uint8_t qh[4];   /* u32 LE: 5th bits */
    uint8_t qs[16];  /* low 4 bits */
} td_blk_q5_1;
TD_BLK_ASSERT(sizeof(td_blk_q5_1) == 24, "Q5_1 block is 24 bytes");

typedef struct {
    uint16_t d;      /* f16 scale */
    int8_t qs[32];   /* signed codes */
} td_blk_q8_0;
TD_BLK_ASSERT(sizeof(td_blk_q8_0) == 34, "Q8_0 block is 34 bytes");

typedef struct {
    uint16_t d;      /* f16 scale */
    uint8_t qs[16];  /* 128 sign bits: bit (j mod 8) of byte j/8 set -> +d */
} td_blk_q1_0;
TD_BLK_ASSERT(sizeof(td_blk_q1_0) == 18, "Q1_0 block is 18 bytes");

typedef struct {
    uint16_t d;      /* f16 scale */
    uint8_t qs[16];  /* 64 x 2-bit codes, 4 per byte from the low bits up; value code-1 */
} td_blk_q2_0;
TD_BLK_ASSERT(sizeof(td_blk_q2_0) == 18, "Q2_0 block is 18 bytes");

typedef struct {
    uint8_t e;       /* E8M0 exponent; scale 2^(e-128) against the doubled E2M1 table */
    uint8_t qs[16];  /* 32 x 4-bit E2M1 codes, nibble order as Q4_0 */
} td_blk_mxfp4;
TD_BLK_ASSERT(sizeof(td_blk_mxfp4) == 17, "MXFP4 block is 17 bytes");

typedef struct {
    uint16_t d;      /* f16 scale */
    uint8_t qs[16];  /* 32 x 4-bit codebook indices, nibble order as Q4_0 */
} td_blk_iq4_nl;
TD_BLK_ASSERT(sizeof(td_blk_iq4_nl) == 18, "IQ4_NL block is 18 bytes");

typedef struct {
    uint8_t scales[16]; /* per 16-value sub-block: low nibble scale code, high nibble min code */
    uint8_t qs[64];     /* 256 x 2-bit codes */
    uint16_t d;         /* f16 scale of the scale codes */
    uint16_t dmin;      /* f16 scale of the min codes */
} td_blk_q2_k;
TD_BLK_ASSERT(sizeof(td_blk_q2_k) == 84, "Q2_K block is 84 bytes");

typedef struct {
    uint8_t hmask[32];  /* 3rd bit of each code (clear -> code - 4) */
    uint8_t qs[64];     /* low 2 bits of each code */
    uint8_t scales[12]; /* 16 x 6-bit signed (offset 32) scales, packed */
    uint16_t d;         /* f16 super-block scale */
} td_blk_q3_k;
TD_BLK_ASSERT(sizeof(td_blk_q3_k) == 110, "Q3_K block is 110 bytes");

typedef struct {
    uint16_t d;         /* f16 scale of the 6-bit scale codes */
    uint16_t dmin;      /* f16 scale of the 6-bit min codes */
    uint8_t scales[12]; /* 8 scale + 8 min codes, 6 bits each, packed */
    uint8_t qs[128];    /* 256 x 4-bit codes, 64-value chunks: low nibbles then high */
} td_blk_q4_k;
TD_BLK_ASSERT(sizeof(td_blk_q4_k) == 144, "Q4_K block is 144 bytes");

typedef struct {
    uint16_t d;         /* f16 scale of the scale codes */
    uint16_t dmin;      /* f16 scale of the min codes */
    uint8_t scales[12]; /* packed as Q4_K */
    uint8_t qh[32];     /* 5th bits: bit s of qh[l] belongs to sub-block s */
    uint8_t qs[128];    /* low 4 bits, as Q4_K */
} td_blk_q5_k;
TD_BLK_ASSERT(sizeof(td_blk_q5_k) == 176, "Q5_K block is 176 bytes");

typedef struct {
    uint8_t ql[128];    /* low 4 bits of the 6-bit codes */
    uint8_t qh[64];     /* high 2 bits, four codes per byte */
    int8_t scales[16];  /* signed 8-bit sub-block scales */
    uint16_t d;         /* f16 super-block scale */
} td_blk_q6_k;
TD_BLK_ASSERT(sizeof(td_blk_q6_k) == 210, "Q6_K block is 210 bytes");

typedef struct {
    float d;            /* f32 scale (this type exists for activations) */
    int8_t qs[256];     /* signed codes */
    int16_t bsums[16];  /* sums of 16-code groups; only dot kernels use them */
} td_blk_q8_k;
TD_BLK_ASSERT(sizeof(td_blk_q8_k) == 292, "Q8_K block is 292 bytes");

typedef struct {
    uint8_t qs[48];     /* 5 trits per byte, fixed-point base 3 */
    uint8_t qh[4];      /* 4 trits per byte */
    uint16_t d;         /* f16 scale */
} td_blk_tq1_0;
TD_BLK_ASSERT(sizeof(td_blk_tq1_0) == 54, "TQ1_0 block is 54 bytes");

typedef struct {
    uint8_t qs[64];     /* 256 x 2-bit codes; value code-1 */
    uint16_t d;         /* f16 scale */
} td_blk_tq2_0;
TD_BLK_ASSERT(sizeof(td_blk_tq2_0) == 66, "TQ2_0 block is 66 bytes");

typedef struct {
    uint16_t d;          /* f16 super-block scale */
    uint16_t scales_h;   /* 2 high bits of each sub-block's 6-bit scale */
    uint8_t scales_l[4]; /* 4 low bits of each sub-block's scale, two per byte */
    uint8_t qs[128];     /* 256 x 4-bit codebook indices, 32-value sub-blocks */
} td_blk_iq4_xs;
TD_BLK_ASSERT(sizeof(td_blk_iq4_xs) == 136, "IQ4_XS block is 136 bytes");

/* ------------------------------------------------------------------------ */
/* Grid types (256 values = 8 sub-blocks of 32 = 32 groups of 8) and NVFP4     */

typedef struct {
    uint16_t d;         /* f16 super-block scale */
    uint8_t qs[64];     /* per sub-block: 4 grid indices (bytes), then u32 w:
                           bits 7g..7g+6 sign index of group g, bits 28..31 scale s */
} td_blk_iq2_xxs;
TD_BLK_ASSERT(sizeof(td_blk_iq2_xxs) == 66, "IQ2_XXS block is 66 bytes");

typedef struct {
    uint16_t d;         /* f16 super-block scale */
    uint8_t qs[64];     /* 32 x u16: bits 0..8 grid index, bits 9..15 sign index */
    uint8_t scales[8];  /* per sub-block: low nibble groups 0-1, high nibble groups 2-3 */
} td_blk_iq2_xs;
TD_BLK_ASSERT(sizeof(td_blk_iq2_xs) == 74, "IQ2_XS block is 74 bytes");

typedef struct {
    uint16_t d;         /* f16 super-block scale */
    uint8_t qs[32];     /* low 8 bits of the 10-bit grid index of each group */
    uint8_t signs[32];  /* explicit 8-bit negation mask of each group */
    uint8_t qh[8];      /* per sub-block: bits 2g..2g+1 = index bits 8..9 of group g */
    uint8_t scales[8];  /* as IQ2_XS */
} td_blk_iq2_s;
TD_BLK_ASSERT(sizeof(td_blk_iq2_s) == 82, "IQ2_S block is 82 bytes");

typedef struct {
    uint16_t d;         /* f16 super-block scale */
    uint8_t qs[64];     /* indices of 4-value grid entries, two per group of 8 */
    uint8_t sas[32];    /* 8 x u32 per sub-block: 4 x 7-bit sign indices, scale in bits 28..31 */
} td_blk_iq3_xxs;
TD_BLK_ASSERT(sizeof(td_blk_iq3_xxs) == 98, "IQ3_XXS block is 98 bytes");

typedef struct {
    uint16_t d;         /* f16 super-block scale */
    uint8_t qs[64];     /* low 8 bits of the 9-bit indices of 4-value grid entries */
    uint8_t qh[8];      /* per sub-block: bit k = index bit 8 of qs[8 sb + k] */
    uint8_t signs[32];  /* explicit 8-bit negation mask of each group */
    uint8_t scales[4];  /* one nibble per sub-block: db = d (1 + 2 nibble) */
} td_blk_iq3_s;
TD_BLK_ASSERT(sizeof(td_blk_iq3_s) == 110, "IQ3_S block is 110 bytes");

typedef struct {
    uint16_t d;         /* f16 super-block scale */
    uint8_t qs[32];     /* low 8 bits of the 11-bit grid index of each group */
    uint8_t qh[16];     /* 8 x u16 per sub-block: bits 3g..3g+2 index bits 8..10 of group g,
                           bits 12..14 scale s (dl = d (2s+1)), bit 15 sign of the shift 1/8 */
} td_blk_iq1_s;
TD_BLK_ASSERT(sizeof(td_blk_iq1_s) == 50, "IQ1_S block is 50 bytes");

typedef struct {
    uint8_t qs[32];     /* low 8 bits of the 11-bit grid index of each group */
    uint8_t qh[16];     /* per group pair: low nibble = bits 8..10 + shift sign (bit 3) of the
                           first group, high nibble the same for the second */
    uint8_t scales[8];  /* 4 x u16: 4 x 3-bit sub-scales in bits 0..11; the f16 super-scale
                           is the top nibbles of the four words (word 0 = lowest nibble) */
} td_blk_iq1_m;
TD_BLK_ASSERT(sizeof(td_blk_iq1_m) == 56, "IQ1_M block is 56 bytes");

typedef struct {
    uint8_t d[4];       /* UE4M3 scale of each 16-value sub-block */
    uint8_t qs[32];     /* 64 x 4-bit E2M1 codes: sub-block s = qs[8s..8s+7], low nibbles
                           first 8 values, high nibbles the next 8 */
} td_blk_nvfp4;
TD_BLK_ASSERT(sizeof(td_blk_nvfp4) == 36, "NVFP4 block is 36 bytes");

/* ------------------------------------------------------------------------ */
/* Tables (model/iq_grids.c: data recovered from ggml, see its provenance)    */

extern const uint8_t td_iq2xxs_grid[256][8];
extern const uint8_t td_iq2xs_grid[512][8];
extern const uint8_t td_iq2s_grid[1024][8];
extern const uint8_t td_iq3xxs_grid[256][4];
extern const uint8_t td_iq3s_grid[512][4];
extern const int8_t td_iq1s_grid[2048][8];
extern const uint8_t td_iq_ksigns[128];

#ifndef TD_IQ_TABLE
#define TD_IQ_TABLE(name) td_##name
#endif

/* ------------------------------------------------------------------------ */
/* Field reads                                                                */

TD_HD static inline uint16_t td_blk_u16(const uint8_t *p) { return (uint16_t)(p[0] | (uint16_t)p[1] << 8); }
TD_HD static inline uint32_t td_blk_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* binary16 bits -> double, exact (subnormals, inf, NaN kept) */
TD_HD static inline double td_blk_f16(uint16_t h) {
    int e = (h >> 10) & 0x1F, m = h & 0x3FF;
    double v;
    if (e == 0x1F) {
        uint64_t bits = (uint64_t)(h & 0x8000) << 48 | 0x7FF0000000000000ull | (uint64_t)m << 42;
        memcpy(&v, &bits, 8);
        return v;
    }
    v = e ? (double)(1024 + m) : (double)m;
    /* 2^(e-25) (normal) or 2^-24 (subnormal), built from its bits: no libm on a device */
    uint64_t pb = (uint64_t)(1023 + (e ? e : 1) - 25) << 52;
    double p;
    memcpy(&p, &pb, 8);
    v *= p;
    return (h & 0x8000) ? -v : v;
}

/* UE4M3 byte -> its value halved (the multiplier of the doubled E2M1 table):
 * 0 and 0x7F decode to 0; bit 7 is ignored. */
TD_HD static inline double td_blk_ue4m3_half(uint8_t x) {
    if (x == 0 || x == 0x7F) return 0.0;
    int E = (x >> 3) & 0xF, M = x & 7;
    /* E == 0: M 2^-9; else (8 + M) 2^(E-10); then / 2 */
    int e2 = E == 0 ? -10 : E - 11;
    double m = E == 0 ? (double)M : (double)(8 + M);
    uint64_t pb = (uint64_t)(1023 + e2) << 52;
    double p;
    memcpy(&p, &pb, 8);
    return m * p;
}

/* doubled E2M1 values: index = 4-bit code, bit 3 the sign */
#define TD_KV_FP4_INIT {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12}

/* one group of 8 values of a grid type, as stored: the grid entry, its
 * negation mask (bit j: element j negated) and its multiplier as a small
 * integer over a power of two: value_j = d * mul / div * grid[j] * sign_j */
typedef struct td_iq_group {
    uint16_t idx;   /* grid index (IQ3 types: the first of two 4-value entries) */
    uint16_t idx2;  /* IQ3 types: the second 4-value entry; else unused */
    uint8_t neg;    /* negation mask (IQ1 types: bit 0 = shift sign) */
    uint8_t mul;    /* odd integer multiplier of d */
} td_iq_group;

/* Group g (0..31) of a block, for each grid type. The multiplier mul and
 * divisor (constant per type: IQ2 8, IQ3_XXS 4, IQ3_S 1, IQ1 1) give the
 * group scale d * mul / div exactly. */
TD_HD static inline td_iq_group td_iq2_xxs_group(const uint8_t *b, int g) {
    const uint8_t *q = b + offsetof(td_blk_iq2_xxs, qs) + 8 * (g / 4);
    uint32_t w = td_blk_u32(q + 4);
    td_iq_group r;
    r.idx = q[g % 4];
    r.idx2 = 0;
    r.neg = TD_IQ_TABLE(iq_ksigns)[(w >> (7 * (g % 4))) & 127];
    r.mul = (uint8_t)(2 * (w >> 28) + 1); /* (0.5 + s) * 0.25 = (2s + 1) / 8 */
    return r;
}

TD_HD static inline td_iq_group td_iq2_xs_group(const uint8_t *b, int g) {
    uint16_t q = td_blk_u16(b + offsetof(td_blk_iq2_xs, qs) + 2 * g);
    uint8_t sc = b[offsetof(td_blk_iq2_xs, scales) + g / 4];
    td_iq_group r;
    r.idx = q & 511;
    r.idx2 = 0;
    r.neg = TD_IQ_TABLE(iq_ksigns)[q >> 9];
    r.mul = (uint8_t)(2 * ((g % 4) < 2 ? (sc & 15) : (sc >> 4)) + 1);
    return r;
}

TD_HD static inline td_iq_group td_iq2_s_group(const uint8_t *b, int g) {
    uint8_t qh = b[offsetof(td_blk_iq2_s, qh) + g / 4];
    uint8_t sc = b[offsetof(td_blk_iq2_s, scales) + g / 4];
    td_iq_group r;
    r.idx = (uint16_t)(b[offsetof(td_blk_iq2_s, qs) + g] | ((qh >> (2 * (g % 4))) & 3) << 8);
    r.idx2 = 0;
    r.neg = b[offsetof(td_blk_iq2_s, signs) + g];
    r.mul = (uint8_t)(2 * ((g % 4) < 2 ? (sc & 15) : (sc >> 4)) + 1);
    return r;
}

TD_HD static inline td_iq_group td_iq3_xxs_group(const uint8_t *b, int g) {
    const uint8_t *qs = b + offsetof(td_blk_iq3_xxs, qs);
    uint32_t w = td_blk_u32(b + offsetof(td_blk_iq3_xxs, sas) + 4 * (g / 4));
    td_iq_group r;
    r.idx = qs[2 * g];
    r.idx2 = qs[2 * g + 1];
    r.neg = TD_IQ_TABLE(iq_ksigns)[(w >> (7 * (g % 4))) & 127];
    r.mul = (uint8_t)(2 * (w >> 28) + 1); /* (0.5 + s) * 0.5 = (2s + 1) / 4 */
    return r;
}

TD_HD static inline td_iq_group td_iq3_s_group(const uint8_t *b, int g) {
    const uint8_t *qs = b + offsetof(td_blk_iq3_s, qs);
    uint8_t qh = b[offsetof(td_blk_iq3_s, qh) + g / 4];
    uint8_t sc = b[offsetof(td_blk_iq3_s, scales) + g / 8];
    int k = 2 * (g % 4);
    td_iq_group r;
    r.idx = (uint16_t)(qs[2 * g] | ((qh >> k) & 1) << 8);
    r.idx2 = (uint16_t)(qs[2 * g + 1] | ((qh >> (k + 1)) & 1) << 8);
    r.neg = b[offsetof(td_blk_iq3_s, signs) + g];
    r.mul = (uint8_t)(2 * ((sc >> (4 * ((g / 4) % 2))) & 15) + 1);
    return r;
}

TD_HD static inline td_iq_group td_iq1_s_group(const uint8_t *b, int g) {
    uint16_t qh = td_blk_u16(b + offsetof(td_blk_iq1_s, qh) + 2 * (g / 4));
    td_iq_group r;
    r.idx = (uint16_t)(b[offsetof(td_blk_iq1_s, qs) + g] | ((qh >> (3 * (g % 4))) & 7) << 8);
    r.idx2 = 0;
    r.neg = (uint8_t)(qh >> 15);
    r.mul = (uint8_t)(2 * ((qh >> 12) & 7) + 1);
    return r;
}

/* IQ1_M's f16 super-scale: the top nibble of each of the 4 scale words */
TD_HD static inline uint16_t td_iq1_m_d(const uint8_t *b) {
    const uint8_t *s = b + offsetof(td_blk_iq1_m, scales);
    return (uint16_t)((td_blk_u16(s) >> 12) | ((td_blk_u16(s + 2) >> 8) & 0x00F0) |
                      ((td_blk_u16(s + 4) >> 4) & 0x0F00) | (td_blk_u16(s + 6) & 0xF000));
}

TD_HD static inline td_iq_group td_iq1_m_group(const uint8_t *b, int g) {
    uint8_t h = b[offsetof(td_blk_iq1_m, qh) + g / 2] >> (4 * (g % 2)); /* this group's nibble */
    uint16_t sw = td_blk_u16(b + offsetof(td_blk_iq1_m, scales) + 2 * (g / 8));
    int sub = g / 4, half = (g % 4) / 2; /* groups 0-1 of a sub-block use the first 3-bit scale */
    td_iq_group r;
    r.idx = (uint16_t)(b[offsetof(td_blk_iq1_m, qs) + g] | (h & 7) << 8);
    r.idx2 = 0;
    r.neg = (uint8_t)((h >> 3) & 1);
    r.mul = (uint8_t)(2 * ((sw >> (6 * (sub % 2) + 3 * half)) & 7) + 1);
    return r;
}

/* ------------------------------------------------------------------------ */
/* Block decoders of the new types: one block -> exact doubles. The value    */
/* order of each product (scale, grid, sign) is the one ggml uses, so a zero */
/* scale gives the same signed zero.                                          */

TD_HD static inline void td_iq_dec_grid8(double db, const uint8_t *grid, uint8_t neg, double *y) {
    for (int j = 0; j < 8; j++) y[j] = db * grid[j] * ((neg >> j) & 1 ? -1.0 : 1.0);
}

TD_HD static inline void td_blk_dec_iq2_xxs(const uint8_t *b, double *y) {
    double d = td_blk_f16(td_blk_u16(b));
    for (int g = 0; g < 32; g++) {
        td_iq_group q = td_iq2_xxs_group(b, g);
        td_iq_dec_grid8(d * q.mul / 8, TD_IQ_TABLE(iq2xxs_grid)[q.idx], q.neg, y + 8 * g);
    }
}

TD_HD static inline void td_blk_dec_iq2_xs(const uint8_t *b, double *y) {
    double d = td_blk_f16(td_blk_u16(b));
    for (int g = 0; g < 32; g++) {
        td_iq_group q = td_iq2_xs_group(b, g);
        td_iq_dec_grid8(d * q.mul / 8, TD_IQ_TABLE(iq2xs_grid)[q.idx], q.neg, y + 8 * g);
    }
}

TD_HD static inline void td_blk_dec_iq2_s(const uint8_t *b, double *y) {
    double d = td_blk_f16(td_blk_u16(b));
    for (int g = 0; g < 32; g++) {
        td_iq_group q = td_iq2_s_group(b, g);
        td_iq_dec_grid8(d * q.mul / 8, TD_IQ_TABLE(iq2s_grid)[q.idx], q.neg, y + 8 * g);
    }
}

TD_HD static inline void td_iq3_dec_group(double db, const uint8_t *g1, const uint8_t *g2, uint8_t neg, double *y) {
    for (int j = 0; j < 4; j++) {
        y[j] = db * g1[j] * ((neg >> j) & 1 ? -1.0 : 1.0);
        y[j + 4] = db * g2[j] * ((neg >> (j + 4)) & 1 ? -1.0 : 1.0);
    }
}

TD_HD static inline void td_blk_dec_iq3_xxs(const uint8_t *b, double *y) {
    double d = td_blk_f16(td_blk_u16(b));
    for (int g = 0; g < 32; g++) {
        td_iq_group q = td_iq3_xxs_group(b, g);
        td_iq3_dec_group(d * q.mul / 4, TD_IQ_TABLE(iq3xxs_grid)[q.idx], TD_IQ_TABLE(iq3xxs_grid)[q.idx2], q.neg,
                         y + 8 * g);
    }
}

TD_HD static inline void td_blk_dec_iq3_s(const uint8_t *b, double *y) {
    double d = td_blk_f16(td_blk_u16(b));
    for (int g = 0; g < 32; g++) {
        td_iq_group q = td_iq3_s_group(b, g);
        td_iq3_dec_group(d * q.mul, TD_IQ_TABLE(iq3s_grid)[q.idx], TD_IQ_TABLE(iq3s_grid)[q.idx2], q.neg, y + 8 * g);
    }
}

TD_HD static inline void td_iq1_dec_group(double dl, const int8_t *grid, int neg, double *y) {
    double delta = neg ? -0.125 : 0.125;
    for (int j = 0; j < 8; j++) y[j] = dl * (grid[j] + delta);
}

TD_HD static inline void td_blk_dec_iq1_s(const uint8_t *b, double *y) {
    double d = td_blk_f16(td_blk_u16(b));
    for (int g = 0; g < 32; g++) {
        td_iq_group q = td_iq1_s_group(b, g);
        td_iq1_dec_group(d * q.mul, TD_IQ_TABLE(iq1s_grid)[q.idx], q.neg, y + 8 * g);
    }
}

TD_HD static inline void td_blk_dec_iq1_m(const uint8_t *b, double *y) {
    double d = td_blk_f16(td_iq1_m_d(b));
    for (int g = 0; g < 32; g++) {
        td_iq_group q = td_iq1_m_group(b, g);
        td_iq1_dec_group(d * q.mul, TD_IQ_TABLE(iq1s_grid)[q.idx], q.neg, y + 8 * g);
    }
}

TD_HD static inline void td_blk_dec_nvfp4(const uint8_t *b, double *y) {
    const int8_t kv[16] = TD_KV_FP4_INIT;
    const uint8_t *qs = b + offsetof(td_blk_nvfp4, qs);
    for (int s = 0; s < 4; s++) {
        double ds = td_blk_ue4m3_half(b[offsetof(td_blk_nvfp4, d) + s]);
        for (int j = 0; j < 8; j++) {
            y[16 * s + j] = kv[qs[8 * s + j] & 15] * ds;
            y[16 * s + 8 + j] = kv[qs[8 * s + j] >> 4] * ds;
        }
    }
}

/* ------------------------------------------------------------------------ */
/* The classic block types, per block, for device code (backends/cuda): the   */
/* same formulas as model/types.c's row decoders, which the cuda suite        */
/* compares bit for bit with these compiled by nvcc for the host.             */

#define TD_BLK_F16AT(b, T, f) td_blk_f16(td_blk_u16((b) + offsetof(T, f)))

TD_HD static inline void td_blk_dec_q4_0(const uint8_t *b, double *y) {
    double d = TD_BLK_F16AT(b, td_blk_q4_0, d);
    const uint8_t *qs = b + offsetof(td_blk_q4_0, qs);
    for (int j = 0; j < 16; j++) {
        y[j] = d * ((qs[j] & 15) - 8);
        y[j + 16] = d * ((qs[j] >> 4) - 8);
    }
}

TD_HD static inline void td_blk_dec_q4_1(const uint8_t *b, double *y) {
    double d = TD_BLK_F16AT(b, td_blk_q4_1, d), m = TD_BLK_F16AT(b, td_blk_q4_1, m);
    const uint8_t *qs = b + offsetof(td_blk_q4_1, qs);
    for (int j = 0; j < 16; j++) {
        y[j] = d * (qs[j] & 15) + m;
        y[j + 16] = d * (qs[j] >> 4) + m;
    }
}

TD_HD static inline void td_blk_dec_q5_0(const uint8_t *b, double *y) {
    double d = TD_BLK_F16AT(b, td_blk_q5_0, d);
    uint32_t qh = td_blk_u32(b + offsetof(td_blk_q5_0, qh));
    const uint8_t *qs = b + offsetof(td_blk_q5_0, qs);
    for (int j = 0; j < 16; j++) {
        int q0 = (qs[j] & 15) | (int)(((qh >> j) & 1) << 4), q1 = (qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
        y[j] = d * (q0 - 16);
        y[j + 16] = d * (q1 - 16);
    }
}

TD_HD static inline void td_blk_dec_q5_1(const uint8_t *b, double *y) {
    double d = TD_BLK_F16AT(b, td_blk_q5_1, d), m = TD_BLK_F16AT(b, td_blk_q5_1, m);
    uint32_t qh = td_blk_u32(b + offsetof(td_blk_q5_1, qh));
    const uint8_t *qs = b + offsetof(td_blk_q5_1, qs);
    for (int j = 0; j < 16; j++) {
        int q0 = (qs[j] & 15) | (int)(((qh >> j) & 1) << 4), q1 = (qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
        y[j] = d * q0 + m;
        y[j + 16] = d * q1 + m;
    }
}

TD_HD static inline void td_blk_dec_q8_0(const uint8_t *b, double *y) {
    double d = TD_BLK_F16AT(b, td_blk_q8_0, d);
    const uint8_t *qs = b + offsetof(td_blk_q8_0, qs);
    for (int j = 0; j < 32; j++) y[j] = d * (int8_t)qs[j];
}

TD_HD static inline void td_blk_dec_q1_0(const uint8_t *b, double *y) {
    double d = TD_BLK_F16AT(b, td_blk_q1_0, d);
    const uint8_t *qs = b + offsetof(td_blk_q1_0, qs);
    for (int j = 0; j < 128; j++) y[j] = ((qs[j / 8] >> (j % 8)) & 1) ? d : -d;
}

TD_HD static inline void td_blk_dec_q2_0(const uint8_t *b, double *y) {
    double d = TD_BLK_F16AT(b, td_blk_q2_0, d);
    const uint8_t *qs = b + offsetof(td_blk_q2_0, qs);
    for (int j = 0; j < 64; j++) y[j] = d * (((qs[j / 4] >> (2 * (j % 4))) & 3) - 1);
}

TD_HD static inline void td_blk_dec_mxfp4(const uint8_t *b, double *y) {
    const int8_t kv[16] = TD_KV_FP4_INIT;
    /* 2^(e-128) from its bits: e-128 is in [-128, 127], always a normal double */
    uint64_t pb = (uint64_t)(1023 + (int)b[offsetof(td_blk_mxfp4, e)] - 128) << 52;
    double d;
    memcpy(&d, &pb, 8);
    const uint8_t *qs = b + offsetof(td_blk_mxfp4, qs);
    for (int j = 0; j < 16; j++) {
        y[j] = d * kv[qs[j] & 15];
        y[j + 16] = d * kv[qs[j] >> 4];
    }
}

#define TD_KV_IQ4NL_INIT {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113}

TD_HD static inline void td_blk_dec_iq4_nl(const uint8_t *b, double *y) {
    const int8_t kv[16] = TD_KV_IQ4NL_INIT;
    double d = TD_BLK_F16AT(b, td_blk_iq4_nl, d);
    const uint8_t *qs = b + offsetof(td_blk_iq4_nl, qs);
    for (int j = 0; j < 16; j++) {
        y[j] = d * kv[qs[j] & 15];
        y[j + 16] = d * kv[qs[j] >> 4];
    }
}

TD_HD static inline void td_blk_dec_iq4_xs(const uint8_t *b, double *y) {
    const int8_t kv[16] = TD_KV_IQ4NL_INIT;
    double d = TD_BLK_F16AT(b, td_blk_iq4_xs, d);
    unsigned sh = td_blk_u16(b + offsetof(td_blk_iq4_xs, scales_h));
    const uint8_t *sl = b + offsetof(td_blk_iq4_xs, scales_l), *qs = b + offsetof(td_blk_iq4_xs, qs);
    for (int s = 0; s < 8; s++) {
        int ls = ((sl[s / 2] >> (4 * (s % 2))) & 15) | (int)(((sh >> (2 * s)) & 3) << 4);
        double dl = d * (ls - 32);
        for (int j = 0; j < 16; j++) {
            y[32 * s + j] = dl * kv[qs[16 * s + j] & 15];
            y[32 * s + 16 + j] = dl * kv[qs[16 * s + j] >> 4];
        }
    }
}

TD_HD static inline void td_blk_dec_q2_k(const uint8_t *b, double *y) {
    double d = TD_BLK_F16AT(b, td_blk_q2_k, d), dmin = TD_BLK_F16AT(b, td_blk_q2_k, dmin);
    const uint8_t *sc = b + offsetof(td_blk_q2_k, scales), *qs = b + offsetof(td_blk_q2_k, qs);
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < 4; j++)
            for (int k = 0; k < 2; k++) {
                uint8_t s = sc[8 * h + 2 * j + k];
                double dl = d * (s & 15), ml = dmin * (s >> 4);
                for (int l = 0; l < 16; l++)
                    y[128 * h + 32 * j + 16 * k + l] = dl * ((qs[32 * h + 16 * k + l] >> (2 * j)) & 3) - ml;
            }
}

TD_HD static inline void td_blk_dec_q3_k(const uint8_t *b, double *y) {
    double d = TD_BLK_F16AT(b, td_blk_q3_k, d);
    const uint8_t *hm = b + offsetof(td_blk_q3_k, hmask), *qs = b + offsetof(td_blk_q3_k, qs);
    const uint8_t *sc = b + offsetof(td_blk_q3_k, scales);
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < 4; j++)
            for (int k = 0; k < 2; k++) {
                int i = 8 * h + 2 * j + k;
                int low4 = i < 8 ? (sc[i] & 15) : (sc[i - 8] >> 4), high2 = (sc[8 + i % 4] >> (2 * (i / 4))) & 3;
                double dl = d * (low4 + 16 * high2 - 32);
                for (int l = 0; l < 16; l++) {
                    int q2 = (qs[32 * h + 16 * k + l] >> (2 * j)) & 3, hb = (hm[16 * k + l] >> (4 * h + j)) & 1;
                    y[128 * h + 32 * j + 16 * k + l] = dl * (q2 - (hb ? 0 : 4));
                }
            }
}

/* scale and min code i (0..7, 6 bits each) of the packed Q4_K / Q5_K scales */
TD_HD static inline void td_blk_k_scale(const uint8_t *s, int i, int *sc, int *mn) {
    if (i < 4) {
        *sc = s[i] & 63;
        *mn = s[i + 4] & 63;
    } else {
        *sc = (s[i + 4] & 15) | ((s[i - 4] >> 6) << 4);
        *mn = (s[i + 4] >> 4) | ((s[i] >> 6) << 4);
    }
}

TD_HD static inline void td_blk_dec_q4_k(const uint8_t *b, double *y) {
    double d = TD_BLK_F16AT(b, td_blk_q4_k, d), dmin = TD_BLK_F16AT(b, td_blk_q4_k, dmin);
    const uint8_t *qs = b + offsetof(td_blk_q4_k, qs), *scs = b + offsetof(td_blk_q4_k, scales);
    for (int c = 0; c < 4; c++) {
        int s0, m0, s1, m1;
        td_blk_k_scale(scs, 2 * c, &s0, &m0);
        td_blk_k_scale(scs, 2 * c + 1, &s1, &m1);
        double d0 = d * s0, dm0 = dmin * m0, d1 = d * s1, dm1 = dmin * m1;
        for (int l = 0; l < 32; l++) {
            y[64 * c + l] = d0 * (qs[32 * c + l] & 15) - dm0;
            y[64 * c + 32 + l] = d1 * (qs[32 * c + l] >> 4) - dm1;
        }
    }
}

TD_HD static inline void td_blk_dec_q5_k(const uint8_t *b, double *y) {
    double d = TD_BLK_F16AT(b, td_blk_q5_k, d), dmin = TD_BLK_F16AT(b, td_blk_q5_k, dmin);
    const uint8_t *qh = b + offsetof(td_blk_q5_k, qh), *qs = b + offsetof(td_blk_q5_k, qs);
    const uint8_t *scs = b + offsetof(td_blk_q5_k, scales);
    for (int c = 0; c < 4; c++) {
        int s0, m0, s1, m1;
        td_blk_k_scale(scs, 2 * c, &s0, &m0);
        td_blk_k_scale(scs, 2 * c + 1, &s1, &m1);
        double d0 = d * s0, dm0 = dmin * m0, d1 = d * s1, dm1 = dmin * m1;
        for (int l = 0; l < 32; l++) {
            int q0 = (qs[32 * c + l] & 15) + 16 * ((qh[l] >> (2 * c)) & 1);
            int q1 = (qs[32 * c + l] >> 4) + 16 * ((qh[l] >> (2 * c + 1)) & 1);
            y[64 * c + l] = d0 * q0 - dm0;
            y[64 * c + 32 + l] = d1 * q1 - dm1;
        }
    }
}

TD_HD static inline void td_blk_dec_q6_k(const uint8_t *b, double *y) {
    double d = TD_BLK_F16AT(b, td_blk_q6_k, d);
    const uint8_t *ql = b + offsetof(td_blk_q6_k, ql), *qh = b + offsetof(td_blk_q6_k, qh);
    const uint8_t *sc = b + offsetof(td_blk_q6_k, scales);
    for (int h = 0; h < 2; h++) {
        const uint8_t *L = ql + 64 * h, *H = qh + 32 * h, *S = sc + 8 * h;
        double *o = y + 128 * h;
        for (int l = 0; l < 32; l++) {
            int t = l / 16;
            int q1 = ((L[l] & 15) | ((H[l] & 3) << 4)) - 32, q2 = ((L[l + 32] & 15) | (((H[l] >> 2) & 3) << 4)) - 32;
            int q3 = ((L[l] >> 4) | (((H[l] >> 4) & 3) << 4)) - 32, q4 = ((L[l + 32] >> 4) | (((H[l] >> 6) & 3) << 4)) - 32;
            o[l] = d * (int8_t)S[t] * q1;
            o[l + 32] = d * (int8_t)S[t + 2] * q2;
            o[l + 64] = d * (int8_t)S[t + 4] * q3;
            o[l + 96] = d * (int8_t)S[t + 6] * q4;
        }
    }
}

TD_HD static inline void td_blk_dec_q8_k(const uint8_t *b, double *y) {
    float df;
    memcpy(&df, b + offsetof(td_blk_q8_k, d), 4);
    double d = df;
    const uint8_t *qs = b + offsetof(td_blk_q8_k, qs);
    for (int j = 0; j < TD_QK_K; j++) y[j] = d * (int8_t)qs[j];
}

TD_HD static inline void td_blk_dec_tq2_0(const uint8_t *b, double *y) {
    double d = TD_BLK_F16AT(b, td_blk_tq2_0, d);
    const uint8_t *qs = b + offsetof(td_blk_tq2_0, qs);
    for (int c = 0; c < 2; c++)
        for (int s = 0; s < 4; s++)
            for (int m = 0; m < 32; m++) y[128 * c + 32 * s + m] = d * (((qs[32 * c + m] >> (2 * s)) & 3) - 1);
}

/* n-th base-3 digit of a fixed-point trit byte: floor(3 ((b 3^n) mod 256) / 256) */
TD_HD static inline int td_blk_trit(uint8_t b, int n) {
    const uint8_t pow3[5] = {1, 3, 9, 27, 81};
    uint8_t v = (uint8_t)(b * pow3[n]);
    return (v * 3) >> 8;
}

TD_HD static inline void td_blk_dec_tq1_0(const uint8_t *b, double *y) {
    double d = TD_BLK_F16AT(b, td_blk_tq1_0, d);
    const uint8_t *qs = b + offsetof(td_blk_tq1_0, qs), *qh = b + offsetof(td_blk_tq1_0, qh);
    for (int n = 0; n < 5; n++)
        for (int m = 0; m < 32; m++) y[32 * n + m] = d * (td_blk_trit(qs[m], n) - 1);
    for (int n = 0; n < 5; n++)
        for (int m = 0; m < 16; m++) y[160 + 16 * n + m] = d * (td_blk_trit(qs[32 + m], n) - 1);
    for (int n = 0; n < 4; n++)
        for (int m = 0; m < 4; m++) y[240 + 4 * n + m] = d * (td_blk_trit(qh[m], n) - 1);
}

/* bfloat16 bits -> double, exact */
TD_HD static inline double td_blk_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return (double)f;
}

#ifdef __cplusplus
}
#endif
#endif
