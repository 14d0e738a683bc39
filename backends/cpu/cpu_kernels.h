/* tapdiff cpu backend: the kernel table. One entry per ggml weight type: a
 * dot product of one stored weight row with an f32 activation vector
 * (dequantized in registers, never through memory), and a row decoder into
 * f32 for the prefill GEMM tiles. As in dav1d's DSP tables the portable C
 * versions fill the table first and CPU-specific code overrides entries
 * (AVX2+FMA+F16C, chosen at run time), so every entry always exists in its
 * simplest form, and the tests can run both side by side.
 *
 * Arithmetic profiles:
 *   "native"  activations stay f32; every product w_i * x_i uses the exactly
 *             decoded weight, sums are f32 (the `dot` entries);
 *   "act-q8"  (opt-in, declared) the activation row entering a matmul is
 *             first rounded as llama.cpp's CPU matmul converts it for the
 *             weight's type (quants.md §8; the exact rules are the project's
 *             definition, backends/profile.h td_act_round_f32, which
 *             ref32 uses to emulate it): Q8_0 blocks of 32 for the legacy
 *             32-value types, Q8_K blocks of 256 for the K-quants (both
 *             below, td_cpu_quantize_act), f16 / bf16 rounding for F16 / BF16
 *             weights, nothing for F32. The product with the codes is exact
 *             integer arithmetic per 32 values, scaled in f32 (the `dot_q8`
 *             entries). */
#ifndef TD_CPU_KERNELS_H
#define TD_CPU_KERNELS_H

#include <stdint.h>

#include "types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Sums of x over consecutive groups of 32 values, prepared once per
 * activation vector: the K-quant minimum terms need Σx per sub-block
 * (y = d*sc*q - dmin*mn  =>  Σ y x = d*sc Σ q x - dmin*mn Σ x). */
#define TD_CPU_XSUM_GROUP 32

/* dot of n values: w = one stored row (n / B blocks), x (n), xsum (n/32)
 * (only read by types with needs_xsum; may be NULL otherwise). */
typedef float (*td_cpu_dot_fn)(const void *w, const float *x, const float *xsum, int64_t n);
/* decode n values of one stored row of type `type` into dst (n); the
 * specialised decoders ignore `type`. The result is the exact value rounded
 * once to float, as td_decode_row_f32. */
typedef void (*td_cpu_row_fn)(int type, const void *w, float *dst, int64_t n);

/* An activation row quantized for the act-q8 profile, seen by the kernels
 * as blocks of 32 whatever the format: x' = d[j] * q[32j + i], with codes q
 * in -127..127 (a Q8_K scale is repeated over its 8 blocks of 32).
 * dsum16/dsum32 = d * (sum of q over 16 / 32 values), the sums the offset
 * and minimum terms of the weight formats need. */
typedef struct td_cpu_xq8 {
    const int8_t *q;      /* (n) */
    const float *d;       /* (n/32) */
    const float *dsum16;  /* (n/16) */
    const float *dsum32;  /* (n/32) */
} td_cpu_xq8;

/* The 8-bit activation formats of act-q8. */
typedef enum td_cpu_act_fmt {
    TD_CPU_ACT_Q8_0 = 0, /* blocks of 32, f16 scale (also llama.cpp's Q8_1 values) */
    TD_CPU_ACT_Q8_K = 1, /* blocks of 256, f32 scale */
} td_cpu_act_fmt;

/* dot of one stored row with an act-q8 row (n values) */
typedef float (*td_cpu_dot_q8_fn)(const void *w, const td_cpu_xq8 *x, int64_t n);

typedef struct td_cpu_type_ops {
    td_cpu_dot_fn dot;       /* NULL: no direct kernel; decode the row, then dot_f32 */
    td_cpu_row_fn to_f32;    /* always set for a decodable type */
    int needs_xsum;
    td_cpu_dot_q8_fn dot_q8; /* act-q8 kernel; NULL: use dot (or to_f32) on x' = d*q */
} td_cpu_type_ops;

/* The kernel levels, each a superset of the one below; the table takes the
 * highest one the CPU has, capped by the caller (the cpu backend's cap is
 * the environment variable TD_CPU_ISA, so every path this machine can run
 * is testable). Under act-q8 the integer kernels of every level give the
 * same bits: the integer sums are exact and their scaling follows one
 * order (kernels.c, "act-q8"). */
typedef enum td_cpu_isa {
    TD_CPU_ISA_C = 0,          /* portable C only */
    TD_CPU_ISA_AVX2 = 1,       /* AVX2 + FMA + F16C */
    TD_CPU_ISA_AVX512VNNI = 2, /* AVX2 level + AVX-512 F/BW/VL + AVX-512 VNNI (vpdpbusd) */
    TD_CPU_ISA_COUNT
} td_cpu_isa;

typedef struct td_cpu_kernels {
    td_cpu_isa isa; /* what was actually installed */
    td_cpu_type_ops type[TD_TYPE_COUNT];
    /* f32 helpers of attention and the norms */
    float (*dot_f32)(const float *a, const float *b, int64_t n);
    void (*axpy_f32)(float *y, float a, const float *x, int64_t n); /* y += a x */
    /* act-q8 activation rounding: td_cpu_quantize_act, or a SIMD version
     * that gives the same bits */
    void (*quantize_act)(td_cpu_act_fmt fmt, const float *x, int64_t n, int8_t *q, float *d, float *dsum16,
                         float *dsum32, float *xd);
} td_cpu_kernels;

/* Fills k with the C kernels, then overrides with the best ISA not above
 * `max_isa` that this CPU supports. */
void td_cpu_kernels_init(td_cpu_kernels *k, td_cpu_isa max_isa);
/* 1 when this CPU has AVX2, FMA and F16C. */
int td_cpu_has_avx2(void);
/* 1 when this CPU runs level `isa` (every level's features). */
int td_cpu_has_isa(td_cpu_isa isa);
const char *td_cpu_isa_name(td_cpu_isa isa);
/* The level named `name` ("c", "avx2", "avx512vnni"), or -1. */
int td_cpu_isa_parse(const char *name);

/* xsum (n/32) of x (n); n a multiple of 32. */
void td_cpu_xsum(float *xsum, const float *x, int64_t n);

/* act-q8: quantizes x (n, a multiple of the format's block) into the arrays
 * of a td_cpu_xq8 (q: n, d: n/32, dsum16: n/16, dsum32: n/32) and writes
 * x' = d*q into xd (n) when xd is not NULL; x' is bitwise what
 * td_act_round_f32 gives:
 *   Q8_0, per 32: a = max|x|; d = f16(a/127); q = rint(x * (a ? 127/a : 0))
 *         (f32 product, ties to even) clamped to [-127, 127]; x' = d*q;
 *   Q8_K, per 256: m = the first x of largest |x| (all 0 when m = 0);
 *         s = -127/m; q = min(127, rint(s*x)); d = 1/s; x' = d*q.
 * Portable C; the table's entry may be a SIMD version with the same bits. */
void td_cpu_quantize_act(td_cpu_act_fmt fmt, const float *x, int64_t n, int8_t *q, float *d, float *dsum16,
                         float *dsum32, float *xd);

/* The portable dot kernels of the grid types and NVFP4 (kernels_iq.c). */
void td_cpu_kernels_init_iq(td_cpu_kernels *k);

/* The ISA-specific table fillers (kernels_avx2.c, kernels_vnni.c); only
 * call when supported. */
void td_cpu_kernels_init_avx2(td_cpu_kernels *k);
void td_cpu_kernels_init_avx512vnni(td_cpu_kernels *k);

/* ---- block helpers shared by the kernel files ---------------------------- */

#define TD_QK_K 256

static inline uint16_t td_cpu_rd_u16(const uint8_t *p) {
    return (uint16_t)(p[0] | (uint16_t)p[1] << 8);
}

/* The 8 scale and 8 min codes (6 bits each) packed in 12 bytes by Q4_K and
 * Q5_K (quants.md §4). */
static inline void td_cpu_kq_scales(const uint8_t *s, uint8_t sc[8], uint8_t mn[8]) {
    for (int b = 0; b < 4; b++) {
        sc[b] = s[b] & 63;
        mn[b] = s[b + 4] & 63;
    }
    for (int b = 4; b < 8; b++) {
        sc[b] = (uint8_t)((s[b + 4] & 0xF) | ((s[b - 4] >> 6) << 4));
        mn[b] = (uint8_t)((s[b + 4] >> 4) | ((s[b] >> 6) << 4));
    }
}

/* The sum of 8 lanes in the order of the SIMD horizontal sum (halves, then
 * quarters, then pairs): the act-q8 kernels' final reduction. */
static inline float td_cpu_red8(const float a[8]) {
    return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

#ifdef __cplusplus
}
#endif
#endif
