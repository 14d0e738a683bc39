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
/* dot of TD_CPU_DOT_ROWS stored rows w[r] with one x: y[r] is bitwise what
 * the same level's `dot` gives for w[r] (each row's sum in that kernel's
 * order), the activations loaded once for all rows. The caller passes rows
 * far apart in memory rather than neighbours: neighbouring rows read side
 * by side defeat the hardware prefetcher of the machine measured (Zen 4),
 * rows in different pages do not (bench/kernel_rate.sh). */
#define TD_CPU_DOT_ROWS 4
typedef void (*td_cpu_dot_rows_fn)(const void *const *w, const float *x, const float *xsum, int64_t n, float *y);

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

/* act-q8 on weights repacked once (the "packed" layout): TD_CPU_PACK_ROWS
 * rows are interleaved so one broadcast activation word meets all of them
 * in one instruction, and a tile of tokens reuses every loaded weight
 * vector. pack writes the packed form of rows (TD_CPU_PACK_ROWS stored rows
 * of n values, row_bytes apart) into dst (pack_bytes(n) bytes, 64-byte
 * aligned); gemm_q8 computes y[t*ldy + r] = dot_q8(row r, token t) + bias[r]
 * (+ 0 without bias, as the per-row path adds) for the rows of n_groups
 * consecutive packed groups and T tokens (token t's act-q8 arrays at
 * x->q + t*n, x->d + t*n/32, x->dsum32 + t*n/32), with the dot_q8 kernels'
 * bits: the same exact integer sums, scaled in the same order. */
#define TD_CPU_PACK_ROWS 16
typedef size_t (*td_cpu_pack_bytes_fn)(int64_t n);
typedef void (*td_cpu_pack_fn)(void *dst, const void *rows, size_t row_bytes, int64_t n);
typedef void (*td_cpu_gemm_q8_fn)(const void *packed, int64_t n_groups, const td_cpu_xq8 *x, int64_t n, int64_t T,
                                  float *y, int64_t ldy, const float *bias);

/* Native (f32 activations) products of Q8_0 and Q4_K weights in the packed layout,
 * on integers instead of converted codes: each block of 32 activations is
 * held exactly (to 2^-30 of its largest |x|) as X_i = round(x_i 2^s), s
 * putting that largest value in [2^29, 2^30), X_i written as four signed
 * base-256 digits, so a block's Σ q_i X_i is four vpdpbusd sums put
 * together exactly; blocks are scaled (d 2^-s, and Q4_K's minimum term from
 * Σ X_i = corr / 128) and summed in double, the
 * row rounded to f32 once. More exact than any f32 order (README "Native
 * Q8_0 and Q4_K on integers"). prep_x32 writes one row's form and returns 1, or 0
 * when the row holds a non-finite value (the caller then takes `dot`).
 * gemv_x32 computes y[r] = dot(row r) + bias[r] (+ 0 without bias) for the
 * rows of n_groups consecutive packed groups and one token. */
typedef struct td_cpu_x32 {
    const int8_t *q;    /* (n/32) x 128: digit k (weight 256^k) of value i of block j at 128 j + 32 k + i */
    const double *sc;   /* (n/32) 2^-s */
    const double *corr; /* (n/32) 128 Σ_i X_i: what the codes' +128 adds to a block's sum */
} td_cpu_x32;
typedef int (*td_cpu_prep_x32_fn)(const float *x, int64_t n, int8_t *q, double *sc, double *corr);
typedef void (*td_cpu_gemv_x32_fn)(const void *packed, int64_t n_groups, const td_cpu_x32 *x, int64_t n, float *y,
                                   const float *bias);

typedef struct td_cpu_type_ops {
    td_cpu_dot_fn dot;       /* NULL: no direct kernel; decode the row, then dot_f32 */
    td_cpu_dot_rows_fn dot_rows; /* NULL: `dot` row by row (always NULL without `dot`) */
    td_cpu_row_fn to_f32;    /* always set for a decodable type */
    int needs_xsum;
    td_cpu_dot_q8_fn dot_q8; /* act-q8 kernel; NULL: use dot (or to_f32) on x' = d*q */
    /* act-q8 on packed weights: all three set, or all NULL (no packed
     * kernel at this level: the per-row kernels run) */
    td_cpu_pack_bytes_fn pack_bytes;
    td_cpu_pack_fn pack;
    td_cpu_gemm_q8_fn gemm_q8;
    /* native products on the packed layout (needs pack_bytes and pack), or NULL */
    td_cpu_gemv_x32_fn gemv_x32;
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
    td_cpu_prep_x32_fn prep_x32; /* NULL below the level with gemv_x32 kernels */
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

/* y[i] = op->dot(row i, x, xsum, n) for nr stored rows, row i at
 * w + i * row_bytes (op->dot set): through op->dot_rows where the level has
 * it, rows i, i+q, i+2q, i+3q (q = nr / TD_CPU_DOT_ROWS) in one pass, the
 * last nr % TD_CPU_DOT_ROWS rows one by one. Every y[i] is bitwise op->dot's. */
void td_cpu_gemv(const td_cpu_type_ops *op, const void *w, size_t row_bytes, int64_t nr, const float *x,
                 const float *xsum, int64_t n, float *y);

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

/* The packed layouts (kernels_pack.c): Q8_0 and Q4_K, portable C. */
size_t td_cpu_pack_bytes_q8_0(int64_t n);
void td_cpu_pack_q8_0(void *dst, const void *rows, size_t row_bytes, int64_t n);
size_t td_cpu_pack_bytes_q4_k(int64_t n);
void td_cpu_pack_q4_k(void *dst, const void *rows, size_t row_bytes, int64_t n);

#if defined(__x86_64__) || defined(__i386__)
/* The f32 part of the 32-value act-q8 kernels, one definition for the SIMD
 * levels (kernels_avx2.c, kernels_vnni.c; each includes <immintrin.h> and
 * defines TD_CPU_SIMD before this header): kernels.c's order, block j's
 * (dw_j * dx_j) * (float)s_j into lane j % 8, separate mul and add. */
#ifdef TD_CPU_SIMD
#define TD_CPU_AVX2_INLINE __attribute__((target("avx2,fma,f16c"), always_inline))

/* acc += (dw[k] * dx[k]) * (float)(horizontal sum of p[k]), k = 0..7 */
TD_CPU_AVX2_INLINE static inline __m256 td_cpu_q8_scale8(__m256 acc, const float dw[8], const float *dx,
                                                         const __m256i p[8]) {
    const __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
    const __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
    const __m256i s = _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
    const __m256 sc = _mm256_mul_ps(_mm256_loadu_ps(dw), _mm256_loadu_ps(dx));
    return _mm256_add_ps(acc, _mm256_mul_ps(sc, _mm256_cvtepi32_ps(s)));
}

/* the last nt (< 8) blocks, sums s[k] and weight scales dw[k], into lanes
 * 0..nt-1 of acc, then the final reduction */
TD_CPU_AVX2_INLINE static inline float td_cpu_q8_finish(__m256 acc, const float *dw, const float *dx,
                                                        const int32_t *s, int nt) {
    float lanes[8];
    _mm256_storeu_ps(lanes, acc);
    for (int k = 0; k < nt; k++) lanes[k] += (dw[k] * dx[k]) * (float)s[k];
    return td_cpu_red8(lanes);
}

TD_CPU_AVX2_INLINE static inline int32_t td_cpu_hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

/* One act-q8 dot of a 32-value type whose block starts with its f16 scale:
 * isum(block, codes) gives the block's int32 lanes; ATTR the level's target
 * attribute. */
#define TD_CPU_Q8_BLOCKS_DOT(name, ATTR, BYTES, isum)                                                                 \
    ATTR static float name(const void *wv, const td_cpu_xq8 *x, int64_t n) {                                         \
        const uint8_t *b = wv;                                                                                       \
        const int64_t nb = n / 32;                                                                                   \
        __m256 acc = _mm256_setzero_ps();                                                                            \
        float dw[8];                                                                                                 \
        int64_t j = 0;                                                                                               \
        for (; j + 8 <= nb; j += 8, b += 8 * (BYTES)) {                                                              \
            __m256i p[8];                                                                                            \
            for (int k = 0; k < 8; k++) {                                                                            \
                p[k] = isum(b + k * (BYTES), x->q + 32 * (j + k));                                                   \
                dw[k] = _cvtsh_ss(td_cpu_rd_u16(b + k * (BYTES)));                                                   \
            }                                                                                                        \
            acc = td_cpu_q8_scale8(acc, dw, x->d + j, p);                                                            \
        }                                                                                                            \
        int32_t s[8];                                                                                                \
        int nt = 0;                                                                                                  \
        for (; j + nt < nb; nt++, b += (BYTES)) {                                                                    \
            dw[nt] = _cvtsh_ss(td_cpu_rd_u16(b));                                                                    \
            s[nt] = td_cpu_hsum_i32(isum(b, x->q + 32 * (j + nt)));                                                  \
        }                                                                                                            \
        return td_cpu_q8_finish(acc, dw, x->d + j, s, nt);                                                           \
    }
#endif
#endif

#ifdef __cplusplus
}
#endif
#endif
