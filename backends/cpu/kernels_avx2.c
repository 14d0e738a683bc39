/* tapdiff cpu backend: AVX2 + FMA + F16C versions of the hot kernels, which
 * override the C entries of the table at run time (td_cpu_kernels_init checks
 * the CPU first). Each function is compiled for that ISA alone with a target
 * attribute, so the rest of the program stays portable.
 *
 * The weights are dequantized in registers: 8 codes are widened to 8 int32
 * lanes (vpmovzxbd/vpmovsxbd), converted to float, and multiplied into the
 * f32 activations; a block's (or sub-block's) sum is then scaled once. Sums
 * are f32 in a fixed lane/accumulator order, so a row's dot product does not
 * depend on anything but the row and x. */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "blocks.h"
#define TD_CPU_SIMD
#include "cpu_kernels.h"

/* field offsets and block sizes from the one layout header */
#define OFF(T, f) offsetof(td_blk_##T, f)
#define SZ(T) sizeof(td_blk_##T)

#define TGT __attribute__((target("avx2,fma,f16c")))
/* helpers are forced inline and their short loops unrolled, so the
 * accumulator arrays indexed by loop counters live in registers */
#define TGTI __attribute__((target("avx2,fma,f16c"), always_inline))

TGTI static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

TGTI static inline float f16s(const uint8_t *p) {
    return _cvtsh_ss(td_cpu_rd_u16(p));
}

TGTI static inline __m256 ld(const float *p) {
    return _mm256_loadu_ps(p);
}

/* 8 unsigned bytes -> 8 int32 lanes */
TGTI static inline __m256i u8x8(const uint8_t *p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i_u *)p));
}

/* 8 signed bytes -> 8 floats */
TGTI static inline __m256 i8x8f(const uint8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i_u *)p)));
}

TGTI static inline __m256 cvt(__m256i v) {
    return _mm256_cvtepi32_ps(v);
}

/* ===================================================================== */
/* Float types                                                            */
/* ===================================================================== */

TGT static float dot_f32_f32(const float *a, const float *b, int64_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_fmadd_ps(ld(a + i), ld(b + i), a0);
        a1 = _mm256_fmadd_ps(ld(a + i + 8), ld(b + i + 8), a1);
        a2 = _mm256_fmadd_ps(ld(a + i + 16), ld(b + i + 16), a2);
        a3 = _mm256_fmadd_ps(ld(a + i + 24), ld(b + i + 24), a3);
    }
    for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(ld(a + i), ld(b + i), a0);
    float s = hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

TGT static void axpy_f32(float *y, float a, const float *x, int64_t n) {
    const __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, ld(x + i), ld(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

TGT static float dot_f32(const void *w, const float *x, const float *xs, int64_t n) {
    (void)xs;
    return dot_f32_f32(w, x, n);
}

TGTI static inline __m256 f16x8(const uint8_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i_u *)p));
}

TGTI static inline __m256 bf16x8(const uint8_t *p) {
    // bf16 is the upper half of a binary32
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i_u *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

TGT static float dot_f16(const void *wv, const float *x, const float *xs, int64_t n) {
    (void)xs;
    const uint8_t *w = wv;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_fmadd_ps(f16x8(w + 2 * i), ld(x + i), a0);
        a1 = _mm256_fmadd_ps(f16x8(w + 2 * i + 16), ld(x + i + 8), a1);
        a2 = _mm256_fmadd_ps(f16x8(w + 2 * i + 32), ld(x + i + 16), a2);
        a3 = _mm256_fmadd_ps(f16x8(w + 2 * i + 48), ld(x + i + 24), a3);
    }
    for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(f16x8(w + 2 * i), ld(x + i), a0);
    float s = hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < n; i++) s += f16s(w + 2 * i) * x[i];
    return s;
}

/* dot_f16 of TD_CPU_DOT_ROWS rows with one x: each row's lanes and
 * accumulators take the same values in the same order as dot_f16, so every
 * y[r] is bitwise dot_f16(w[r]); each activation vector is loaded once for
 * all rows. */
TGT static void dot_rows_f16(const void *const *wv, const float *x, const float *xs, int64_t n, float *y) {
    (void)xs;
    enum { R = TD_CPU_DOT_ROWS };
    const uint8_t *w[R];
    __m256 a[R][4];
    #pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        w[r] = wv[r];
        for (int k = 0; k < 4; k++) a[r][k] = _mm256_setzero_ps();
    }
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m256 x0 = ld(x + i), x1 = ld(x + i + 8), x2 = ld(x + i + 16), x3 = ld(x + i + 24);
        #pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const uint8_t *p = w[r] + 2 * i;
            a[r][0] = _mm256_fmadd_ps(f16x8(p), x0, a[r][0]);
            a[r][1] = _mm256_fmadd_ps(f16x8(p + 16), x1, a[r][1]);
            a[r][2] = _mm256_fmadd_ps(f16x8(p + 32), x2, a[r][2]);
            a[r][3] = _mm256_fmadd_ps(f16x8(p + 48), x3, a[r][3]);
        }
    }
    for (; i + 8 <= n; i += 8)
        #pragma GCC unroll 4
        for (int r = 0; r < R; r++) a[r][0] = _mm256_fmadd_ps(f16x8(w[r] + 2 * i), ld(x + i), a[r][0]);
    #pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        float s = hsum8(_mm256_add_ps(_mm256_add_ps(a[r][0], a[r][1]), _mm256_add_ps(a[r][2], a[r][3])));
        for (int64_t t = i; t < n; t++) s += f16s(w[r] + 2 * t) * x[t];
        y[r] = s;
    }
}

TGT static float dot_bf16(const void *wv, const float *x, const float *xs, int64_t n) {
    (void)xs;
    const uint8_t *w = wv;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_fmadd_ps(bf16x8(w + 2 * i), ld(x + i), a0);
        a1 = _mm256_fmadd_ps(bf16x8(w + 2 * i + 16), ld(x + i + 8), a1);
        a2 = _mm256_fmadd_ps(bf16x8(w + 2 * i + 32), ld(x + i + 16), a2);
        a3 = _mm256_fmadd_ps(bf16x8(w + 2 * i + 48), ld(x + i + 24), a3);
    }
    for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(bf16x8(w + 2 * i), ld(x + i), a0);
    float s = hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < n; i++) s += td_bf16_to_f32(td_cpu_rd_u16(w + 2 * i)) * x[i];
    return s;
}

TGT static void row_f16(int type, const void *wv, float *dst, int64_t n) {
    (void)type;
    const uint8_t *w = wv;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, f16x8(w + 2 * i));
    for (; i < n; i++) dst[i] = f16s(w + 2 * i);
}

TGT static void row_bf16(int type, const void *wv, float *dst, int64_t n) {
    (void)type;
    const uint8_t *w = wv;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, bf16x8(w + 2 * i));
    for (; i < n; i++) dst[i] = td_bf16_to_f32(td_cpu_rd_u16(w + 2 * i));
}

/* ===================================================================== */
/* Q8_0 and Q4_0 (32-value blocks)                                        */
/* ===================================================================== */

/* Σ q x of one Q8_0 block (34 bytes: f16 d, int8 q[32]), unscaled */
TGTI static inline __m256 q8_0_sum(const uint8_t *b, const float *x) {
    __m256 s0 = _mm256_mul_ps(i8x8f(b + OFF(q8_0, qs)), ld(x));
    __m256 s1 = _mm256_mul_ps(i8x8f(b + OFF(q8_0, qs) + 8), ld(x + 8));
    s0 = _mm256_fmadd_ps(i8x8f(b + OFF(q8_0, qs) + 16), ld(x + 16), s0);
    s1 = _mm256_fmadd_ps(i8x8f(b + OFF(q8_0, qs) + 24), ld(x + 24), s1);
    return _mm256_add_ps(s0, s1);
}

/* a block's f16 scale in all 8 lanes: the half broadcast, then converted
 * (the same exact value as converting once and broadcasting the float, in
 * fewer instructions) */
TGTI static inline __m256 f16b8(const uint8_t *p) {
    return _mm256_cvtph_ps(_mm_set1_epi16((short)td_cpu_rd_u16(p)));
}

TGT static float dot_q8_0(const void *wv, const float *x, const float *xs, int64_t n) {
    (void)xs;
    const uint8_t *b = wv;
    const int64_t nb = n / 32;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
    int64_t j = 0;
    for (; j + 2 <= nb; j += 2, b += 2 * SZ(q8_0), x += 64) {
        acc0 = _mm256_fmadd_ps(f16b8(b + OFF(q8_0, d)), q8_0_sum(b, x), acc0);
        acc1 = _mm256_fmadd_ps(f16b8(b + SZ(q8_0) + OFF(q8_0, d)), q8_0_sum(b + SZ(q8_0), x + 32), acc1);
    }
    if (j < nb) acc0 = _mm256_fmadd_ps(f16b8(b + OFF(q8_0, d)), q8_0_sum(b, x), acc0);
    return hsum8(_mm256_add_ps(acc0, acc1));
}

TGT static void row_q8_0(int type, const void *wv, float *dst, int64_t n) {
    (void)type;
    const uint8_t *b = wv;
    for (int64_t i = 0; i < n; i += 32, b += SZ(q8_0), dst += 32) {
        const __m256 d = _mm256_set1_ps(f16s(b + OFF(q8_0, d)));
        for (int k = 0; k < 4; k++) _mm256_storeu_ps(dst + 8 * k, _mm256_mul_ps(d, i8x8f(b + OFF(q8_0, qs) + 8 * k)));
    }
}

/* the 32 codes of a Q4_0 block minus 8, as signed bytes: lo = values 0..15,
 * hi = values 16..31 */
TGTI static inline void q4_0_codes(const uint8_t *b, __m128i *lo, __m128i *hi) {
    const __m128i v = _mm_loadu_si128((const __m128i_u *)(b + OFF(q4_0, qs)));
    const __m128i m4 = _mm_set1_epi8(0x0F), e8 = _mm_set1_epi8(8);
    *lo = _mm_sub_epi8(_mm_and_si128(v, m4), e8);
    *hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(v, 4), m4), e8);
}

TGTI static inline __m256 i8lo8f(__m128i v) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
}
TGTI static inline __m256 i8hi8f(__m128i v) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v, 8)));
}

TGTI static inline __m256 q4_0_sum(const uint8_t *b, const float *x) {
    __m128i lo, hi;
    q4_0_codes(b, &lo, &hi);
    __m256 s0 = _mm256_mul_ps(i8lo8f(lo), ld(x));
    __m256 s1 = _mm256_mul_ps(i8hi8f(lo), ld(x + 8));
    s0 = _mm256_fmadd_ps(i8lo8f(hi), ld(x + 16), s0);
    s1 = _mm256_fmadd_ps(i8hi8f(hi), ld(x + 24), s1);
    return _mm256_add_ps(s0, s1);
}

TGT static float dot_q4_0(const void *wv, const float *x, const float *xs, int64_t n) {
    (void)xs;
    const uint8_t *b = wv;
    const int64_t nb = n / 32;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
    int64_t j = 0;
    for (; j + 2 <= nb; j += 2, b += 2 * SZ(q4_0), x += 64) {
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(f16s(b + OFF(q4_0, d))), q4_0_sum(b, x), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_set1_ps(f16s(b + SZ(q4_0) + OFF(q4_0, d))), q4_0_sum(b + SZ(q4_0), x + 32), acc1);
    }
    if (j < nb) acc0 = _mm256_fmadd_ps(_mm256_set1_ps(f16s(b + OFF(q4_0, d))), q4_0_sum(b, x), acc0);
    return hsum8(_mm256_add_ps(acc0, acc1));
}

TGT static void row_q4_0(int type, const void *wv, float *dst, int64_t n) {
    (void)type;
    const uint8_t *b = wv;
    for (int64_t i = 0; i < n; i += 32, b += SZ(q4_0), dst += 32) {
        const __m256 d = _mm256_set1_ps(f16s(b + OFF(q4_0, d)));
        __m128i lo, hi;
        q4_0_codes(b, &lo, &hi);
        _mm256_storeu_ps(dst, _mm256_mul_ps(d, i8lo8f(lo)));
        _mm256_storeu_ps(dst + 8, _mm256_mul_ps(d, i8hi8f(lo)));
        _mm256_storeu_ps(dst + 16, _mm256_mul_ps(d, i8lo8f(hi)));
        _mm256_storeu_ps(dst + 24, _mm256_mul_ps(d, i8hi8f(hi)));
    }
}

/* ===================================================================== */
/* Q4_K and Q5_K                                                          */
/* ===================================================================== */
/* Chunk c (c = 0..3) of a super-block is 32 code bytes: low nibbles are
 * values 64c + l (sub-block 2c), high nibbles values 64c + 32 + l
 * (sub-block 2c+1). Each group of 8 bytes is widened once and gives 8 codes
 * of each sub-block (mask, shift). Q5_K adds bit 2c / 2c+1 of qh[l] as the
 * 5th bit. */

/* q: 32 code bytes; h[4]: qh[l] as int32 lanes (Q5_K, shifted right by 2c
 * already) or NULL; s_lo/s_hi: Σ code x of the two sub-blocks */
TGTI static inline void kq_chunk_sums(const uint8_t *q, const __m256i *h, const float *x, __m256 *s_lo, __m256 *s_hi) {
    const __m256i m4 = _mm256_set1_epi32(0xF), b4 = _mm256_set1_epi32(0x10);
    __m256 lo0 = _mm256_setzero_ps(), lo1 = lo0, hi0 = lo0, hi1 = lo0;
#pragma GCC unroll 2
    for (int g = 0; g < 4; g += 2) {
        __m256i w0 = u8x8(q + 8 * g), w1 = u8x8(q + 8 * g + 8);
        __m256i l0 = _mm256_and_si256(w0, m4), l1 = _mm256_and_si256(w1, m4);
        __m256i u0 = _mm256_srli_epi32(w0, 4), u1 = _mm256_srli_epi32(w1, 4);
        if (h) {
            l0 = _mm256_or_si256(l0, _mm256_and_si256(_mm256_slli_epi32(h[g], 4), b4));
            l1 = _mm256_or_si256(l1, _mm256_and_si256(_mm256_slli_epi32(h[g + 1], 4), b4));
            u0 = _mm256_or_si256(u0, _mm256_and_si256(_mm256_slli_epi32(h[g], 3), b4));
            u1 = _mm256_or_si256(u1, _mm256_and_si256(_mm256_slli_epi32(h[g + 1], 3), b4));
        }
        lo0 = _mm256_fmadd_ps(cvt(l0), ld(x + 8 * g), lo0);
        lo1 = _mm256_fmadd_ps(cvt(l1), ld(x + 8 * g + 8), lo1);
        hi0 = _mm256_fmadd_ps(cvt(u0), ld(x + 32 + 8 * g), hi0);
        hi1 = _mm256_fmadd_ps(cvt(u1), ld(x + 32 + 8 * g + 8), hi1);
    }
    *s_lo = _mm256_add_ps(lo0, lo1);
    *s_hi = _mm256_add_ps(hi0, hi1);
}

/* The 8 scales times d (as floats, stored for broadcast loads) and the 8
 * minimum codes (as a float vector) of a Q4_K/Q5_K super-block: the 6-bit
 * fields of quants.md §4 unpacked four bytes at a time. */
TGTI static inline void kq_scales(const uint8_t *b, float d, float scf[8], __m256 *mnf) {
    uint32_t s0, s1, s2;
    memcpy(&s0, b + OFF(q4_k, scales), 4), memcpy(&s1, b + OFF(q4_k, scales) + 4, 4),
        memcpy(&s2, b + OFF(q4_k, scales) + 8, 4);
    // sc[0..3] = bytes 0..3 & 63; sc[4..7] = low nibbles of bytes 8..11 | top bits of bytes 0..3 << 4
    const uint64_t sc = (uint64_t)(s0 & 0x3f3f3f3fu) |
                        (uint64_t)((s2 & 0x0f0f0f0fu) | ((s0 >> 2) & 0x30303030u)) << 32;
    // mn[0..3] = bytes 4..7 & 63; mn[4..7] = high nibbles of bytes 8..11 | top bits of bytes 4..7 << 4
    const uint64_t mn = (uint64_t)(s1 & 0x3f3f3f3fu) |
                        (uint64_t)(((s2 >> 4) & 0x0f0f0f0fu) | ((s1 >> 2) & 0x30303030u)) << 32;
    const __m256 scv = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)sc)));
    _mm256_storeu_ps(scf, _mm256_mul_ps(_mm256_set1_ps(d), scv));
    *mnf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)mn)));
}

/* one Q4_K (qh == NULL) or Q5_K super-block: adds d*sc*Σqx into acc[4] and
 * dmin * mn * Σx (per lane j: sub-block j) into macc */
TGTI static inline void kq_block(const uint8_t *b, const uint8_t *qh, const uint8_t *qs, const float *x,
                                 const float *xs, __m256 acc[4], __m256 *macc) {
    float scf[8];
    __m256 mnf;
    kq_scales(b, f16s(b + OFF(q4_k, d)), scf, &mnf);
    __m256i h[4];
    if (qh)
        for (int g = 0; g < 4; g++) h[g] = u8x8(qh + 8 * g);
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        __m256 s_lo, s_hi;
        kq_chunk_sums(qs + 32 * c, qh ? h : NULL, x + 64 * c, &s_lo, &s_hi);
        // even and odd chunks go to different accumulators: short chains
        const int a = 2 * (c & 1);
        acc[a] = _mm256_fmadd_ps(_mm256_broadcast_ss(&scf[2 * c]), s_lo, acc[a]);
        acc[a + 1] = _mm256_fmadd_ps(_mm256_broadcast_ss(&scf[2 * c + 1]), s_hi, acc[a + 1]);
        if (qh)
            for (int g = 0; g < 4; g++) h[g] = _mm256_srli_epi32(h[g], 2);
    }
    // the minimum terms: dmin * Σ_j mn[j] * xsum[j], in one vector
    *macc = _mm256_fmadd_ps(_mm256_set1_ps(f16s(b + OFF(q4_k, dmin))), _mm256_mul_ps(mnf, ld(xs)), *macc);
}

TGT static float dot_q4_k(const void *wv, const float *x, const float *xs, int64_t n) {
    const uint8_t *b = wv;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    __m256 macc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += TD_QK_K, b += SZ(q4_k), x += TD_QK_K, xs += 8)
        kq_block(b, NULL, b + OFF(q4_k, qs), x, xs, acc, &macc);
    return hsum8(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]))) - hsum8(macc);
}

TGT static float dot_q5_k(const void *wv, const float *x, const float *xs, int64_t n) {
    const uint8_t *b = wv;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    __m256 macc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += TD_QK_K, b += SZ(q5_k), x += TD_QK_K, xs += 8)
        kq_block(b, b + OFF(q5_k, qh), b + OFF(q5_k, qs), x, xs, acc, &macc);
    return hsum8(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]))) - hsum8(macc);
}

/* y = code * (d*sc) - dmin*mn, one rounding (the FMA), which is the exact
 * value rounded to float as the model's decoder gives it */
TGTI static inline void kq_row_block(const uint8_t *b, const uint8_t *qh, const uint8_t *qs, float *y) {
    const float d = f16s(b + OFF(q4_k, d)), dmin = f16s(b + OFF(q4_k, dmin));
    uint8_t sc[8], mn[8];
    td_cpu_kq_scales(b + OFF(q4_k, scales), sc, mn);
    const __m256i m4 = _mm256_set1_epi32(0xF), b4 = _mm256_set1_epi32(0x10);
    for (int c = 0; c < 4; c++) {
        const __m256 dl = _mm256_set1_ps(d * (float)sc[2 * c]), ml = _mm256_set1_ps(dmin * (float)mn[2 * c]);
        const __m256 dh = _mm256_set1_ps(d * (float)sc[2 * c + 1]), mh = _mm256_set1_ps(dmin * (float)mn[2 * c + 1]);
        for (int g = 0; g < 4; g++) {
            const __m256i w = u8x8(qs + 32 * c + 8 * g);
            __m256i lo = _mm256_and_si256(w, m4), hi = _mm256_srli_epi32(w, 4);
            if (qh) {
                const __m256i h = _mm256_srli_epi32(u8x8(qh + 8 * g), 2 * c);
                lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi32(h, 4), b4));
                hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi32(h, 3), b4));
            }
            _mm256_storeu_ps(y + 64 * c + 8 * g, _mm256_fmsub_ps(cvt(lo), dl, ml));
            _mm256_storeu_ps(y + 64 * c + 32 + 8 * g, _mm256_fmsub_ps(cvt(hi), dh, mh));
        }
    }
}

TGT static void row_q4_k(int type, const void *wv, float *dst, int64_t n) {
    (void)type;
    const uint8_t *b = wv;
    for (int64_t i = 0; i < n; i += TD_QK_K, b += SZ(q4_k), dst += TD_QK_K) kq_row_block(b, NULL, b + OFF(q4_k, qs), dst);
}

TGT static void row_q5_k(int type, const void *wv, float *dst, int64_t n) {
    (void)type;
    const uint8_t *b = wv;
    for (int64_t i = 0; i < n; i += TD_QK_K, b += SZ(q5_k), dst += TD_QK_K) kq_row_block(b, b + OFF(q5_k, qh), b + OFF(q5_k, qs), dst);
}

/* ===================================================================== */
/* Q6_K                                                                   */
/* ===================================================================== */
/* Half h (128 values): L = ql + 64h, H = qh + 32h, scales S = sc + 8h. For
 * l = 0..31 the four 6-bit codes (minus 32) of values 128h + l + 32m,
 * m = 0..3, come from L[l] / L[l+32] nibbles and bit pairs 2m of H[l]. A
 * scale covers 16 consecutive l. */

/* codes of values l0..l0+7 (+32m) as int32 lanes, minus 32 */
TGTI static inline void q6_codes(const uint8_t *L, const uint8_t *H, int l0, __m256i q[4]) {
    const __m256i m4 = _mm256_set1_epi32(0xF), m30 = _mm256_set1_epi32(0x30), o32 = _mm256_set1_epi32(32);
    const __m256i a = u8x8(L + l0), b = u8x8(L + 32 + l0), h = u8x8(H + l0);
    q[0] = _mm256_sub_epi32(_mm256_or_si256(_mm256_and_si256(a, m4), _mm256_and_si256(_mm256_slli_epi32(h, 4), m30)), o32);
    q[1] = _mm256_sub_epi32(_mm256_or_si256(_mm256_and_si256(b, m4), _mm256_and_si256(_mm256_slli_epi32(h, 2), m30)), o32);
    q[2] = _mm256_sub_epi32(_mm256_or_si256(_mm256_srli_epi32(a, 4), _mm256_and_si256(h, m30)), o32);
    q[3] = _mm256_sub_epi32(_mm256_or_si256(_mm256_srli_epi32(b, 4), _mm256_and_si256(_mm256_srli_epi32(h, 2), m30)), o32);
}

TGT static float dot_q6_k(const void *wv, const float *x, const float *xs, int64_t n) {
    (void)xs;
    const uint8_t *b = wv;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t i = 0; i < n; i += TD_QK_K, b += SZ(q6_k), x += TD_QK_K) {
        // the 16 signed scales times d, stored for broadcast loads
        float dS[16];
        const __m256 d = _mm256_set1_ps(f16s(b + OFF(q6_k, d)));
        _mm256_storeu_ps(dS, _mm256_mul_ps(d, i8x8f(b + OFF(q6_k, scales))));
        _mm256_storeu_ps(dS + 8, _mm256_mul_ps(d, i8x8f(b + OFF(q6_k, scales) + 8)));
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const uint8_t *L = b + OFF(q6_k, ql) + 64 * h, *H = b + OFF(q6_k, qh) + 32 * h;
            const float *xx = x + 128 * h;
#pragma GCC unroll 2
            for (int t = 0; t < 2; t++) { // l = 16t .. 16t+15 share scales S[t + 2m]
                __m256i qa[4], qb[4];
                q6_codes(L, H, 16 * t, qa);
                q6_codes(L, H, 16 * t + 8, qb);
#pragma GCC unroll 4
                for (int m = 0; m < 4; m++) {
                    const float *xm = xx + 32 * m + 16 * t;
                    __m256 s = _mm256_mul_ps(cvt(qa[m]), ld(xm));
                    s = _mm256_fmadd_ps(cvt(qb[m]), ld(xm + 8), s);
                    acc[m] = _mm256_fmadd_ps(_mm256_broadcast_ss(&dS[8 * h + t + 2 * m]), s, acc[m]);
                }
            }
        }
    }
    return hsum8(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
}

TGT static void row_q6_k(int type, const void *wv, float *dst, int64_t n) {
    (void)type;
    const uint8_t *b = wv;
    for (int64_t i = 0; i < n; i += TD_QK_K, b += SZ(q6_k), dst += TD_QK_K) {
        const float d = f16s(b + OFF(q6_k, d));
        const int8_t *S0 = (const int8_t *)(b + OFF(q6_k, scales));
        for (int h = 0; h < 2; h++) {
            const uint8_t *L = b + OFF(q6_k, ql) + 64 * h, *H = b + OFF(q6_k, qh) + 32 * h;
            for (int l0 = 0; l0 < 32; l0 += 8) {
                __m256i q[4];
                q6_codes(L, H, l0, q);
                for (int m = 0; m < 4; m++) {
                    const __m256 dm = _mm256_set1_ps(d * (float)S0[8 * h + l0 / 16 + 2 * m]);
                    _mm256_storeu_ps(dst + 128 * h + 32 * m + l0, _mm256_mul_ps(dm, cvt(q[m])));
                }
            }
        }
    }
}

/* ===================================================================== */
/* act-q8 kernels: 32 codes x 32 int8 activations per vpmaddubsw          */
/* ===================================================================== */
/* vpmaddubsw multiplies unsigned bytes (the codes) by signed bytes (the
 * activations) and adds adjacent pairs into int16 without overflow here
 * (|pair| <= 2 * 63 * 128 < 2^15); vpmaddwd with ones (or with int16
 * scales) widens to int32. Every integer sum is exact, and the f32 part
 * follows kernels.c's order step for step (separate mul and add, lane j % 8
 * for block j, td_cpu_red8 = hsum8), so the result is the C kernel's bits. */

TGTI static inline __m256i ld256(const void *p) {
    return _mm256_loadu_si256((const __m256i_u *)p);
}

/* Σ w a over one Q8_0 block (signed x signed: |w| times a with w's sign
 * moved onto a), as 8 int32 lanes */
TGTI static inline __m256i q8_0_isum(const uint8_t *b, const int8_t *a) {
    const __m256i w = ld256(b + OFF(q8_0, qs)), x = ld256(a);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w)), _mm256_set1_epi16(1));
}

/* the codes of one Q4_0 block minus 8 (values 0..15 low nibbles, 16..31 high) */
TGTI static inline __m256i q4_0_signed(const uint8_t *b) {
    const __m128i v = _mm_loadu_si128((const __m128i_u *)(b + OFF(q4_0, qs)));
    const __m128i m4 = _mm_set1_epi8(0x0F);
    const __m256i c = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m4), _mm_and_si128(v, m4));
    return _mm256_sub_epi8(c, _mm256_set1_epi8(8));
}

TGTI static inline __m256i q4_0_isum(const uint8_t *b, const int8_t *a) {
    const __m256i w = q4_0_signed(b), x = ld256(a);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w)), _mm256_set1_epi16(1));
}

/* the scale d sits first in both block layouts */
TD_CPU_Q8_BLOCKS_DOT(dot_q8_q8_0, TGT, SZ(q8_0), q8_0_isum)
TD_CPU_Q8_BLOCKS_DOT(dot_q8_q4_0, TGT, SZ(q4_0), q4_0_isum)

/* the 6-bit scale (sc) and minimum (mn) codes of a Q4_K/Q5_K super-block,
 * byte k = sub-block k (the bit layout of kq_scales) */
TGTI static inline void kq_codes(const uint8_t *b, uint64_t *sc, uint64_t *mn) {
    uint32_t s0, s1, s2;
    memcpy(&s0, b + OFF(q4_k, scales), 4), memcpy(&s1, b + OFF(q4_k, scales) + 4, 4),
        memcpy(&s2, b + OFF(q4_k, scales) + 8, 4);
    *sc = (uint64_t)(s0 & 0x3f3f3f3fu) | (uint64_t)((s2 & 0x0f0f0f0fu) | ((s0 >> 2) & 0x30303030u)) << 32;
    *mn = (uint64_t)(s1 & 0x3f3f3f3fu) | (uint64_t)(((s2 >> 4) & 0x0f0f0f0fu) | ((s1 >> 2) & 0x30303030u)) << 32;
}

/* Q4_K (qh == NULL) and Q5_K */
TGTI static inline float dot_q8_kq(const uint8_t *b, size_t bytes, int has_qh, const td_cpu_xq8 *x, int64_t n) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), b1 = _mm256_set1_epi8(0x01);
    float acc = 0;
    for (int64_t sb = 0; sb < n / TD_QK_K; sb++, b += bytes) {
        uint64_t sc, mn;
        kq_codes(b, &sc, &mn);
        const uint8_t *qs = b + (has_qh ? OFF(q5_k, qs) : OFF(q4_k, qs));
        __m256i h = has_qh ? ld256(b + OFF(q5_k, qh)) : _mm256_setzero_si256();
        const int8_t *a = x->q + TD_QK_K * sb;
        __m256i is0 = _mm256_setzero_si256(), is1 = is0;
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            const __m256i v = ld256(qs + 32 * c);
            __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            if (has_qh) { // bits 2c and 2c+1 of qh[l]; h is shifted right by 2 per chunk
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(h, b1), 4));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 1), b1), 4));
                h = _mm256_srli_epi16(h, 2);
            }
            // the scale code joins in vpmaddwd: lanes hold sc * (pairs of products), exact
            const __m256i s_lo = _mm256_set1_epi16((short)((sc >> (16 * c)) & 0xFF));
            const __m256i s_hi = _mm256_set1_epi16((short)((sc >> (16 * c + 8)) & 0xFF));
            is0 = _mm256_add_epi32(is0, _mm256_madd_epi16(_mm256_maddubs_epi16(lo, ld256(a + 64 * c)), s_lo));
            is1 = _mm256_add_epi32(is1, _mm256_madd_epi16(_mm256_maddubs_epi16(hi, ld256(a + 64 * c + 32)), s_hi));
        }
        const int32_t isum = td_cpu_hsum_i32(_mm256_add_epi32(is0, is1));
        const __m256 mnf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)mn)));
        const float msum = hsum8(_mm256_mul_ps(mnf, _mm256_loadu_ps(x->dsum32 + 8 * sb)));
        const float dx = x->d[8 * sb];
        const float d = f16s(b + OFF(q4_k, d)), dmin = f16s(b + OFF(q4_k, dmin));
        const float v = (d * dx) * (float)isum;
        acc += v - dmin * msum;
    }
    return acc;
}

TGT static float dot_q8_q4_k(const void *w, const td_cpu_xq8 *x, int64_t n) {
    return dot_q8_kq(w, SZ(q4_k), 0, x, n);
}

TGT static float dot_q8_q5_k(const void *w, const td_cpu_xq8 *x, int64_t n) {
    return dot_q8_kq(w, SZ(q5_k), 1, x, n);
}

TGT static float dot_q8_q6_k(const void *wv, const td_cpu_xq8 *x, int64_t n) {
    const uint8_t *b = wv;
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30), o32 = _mm256_set1_epi8(32);
    float acc = 0;
    for (int64_t sb = 0; sb < n / TD_QK_K; sb++, b += SZ(q6_k)) {
        // the 16 scales as int16 pairs: group m of half h uses S[8h+2m] (l < 16), S[8h+2m+1]
        const __m128i S = _mm_loadu_si128((const __m128i_u *)(b + OFF(q6_k, scales)));
        __m256i is0 = _mm256_setzero_si256(), is1 = is0;
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const __m256i L0 = ld256(b + OFF(q6_k, ql) + 64 * h), L1 = ld256(b + OFF(q6_k, ql) + 64 * h + 32),
                          H = ld256(b + OFF(q6_k, qh) + 32 * h);
            __m256i c[4];
            c[0] = _mm256_or_si256(_mm256_and_si256(L0, m4), _mm256_and_si256(_mm256_slli_epi16(H, 4), m30));
            c[1] = _mm256_or_si256(_mm256_and_si256(L1, m4), _mm256_and_si256(_mm256_slli_epi16(H, 2), m30));
            c[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(L0, 4), m4), _mm256_and_si256(H, m30));
            c[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(L1, 4), m4),
                                   _mm256_and_si256(_mm256_srli_epi16(H, 2), m30));
#pragma GCC unroll 4
            for (int m = 0; m < 4; m++) {
                const __m256i a = ld256(x->q + TD_QK_K * sb + 128 * h + 32 * m);
                const __m128i sel = _mm_set_epi64x(0x0101010101010101ll * (8 * h + 2 * m + 1),
                                                   0x0101010101010101ll * (8 * h + 2 * m));
                const __m256i s16 = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(S, sel));
                // (code - 32) * a in pairs: both products fit int16, so does the difference
                const __m256i p16 = _mm256_sub_epi16(_mm256_maddubs_epi16(c[m], a), _mm256_maddubs_epi16(o32, a));
                if (m & 1) is1 = _mm256_add_epi32(is1, _mm256_madd_epi16(p16, s16));
                else is0 = _mm256_add_epi32(is0, _mm256_madd_epi16(p16, s16));
            }
        }
        const int32_t isum = td_cpu_hsum_i32(_mm256_add_epi32(is0, is1));
        const float v = (f16s(b + OFF(q6_k, d)) * x->d[8 * sb]) * (float)isum;
        acc += v;
    }
    return acc;
}

/* The act-q8 rounding of td_cpu_quantize_act with the same IEEE operations
 * (|x| maxima, the f32 divisions, x*id or s*x rounded half to even, the f16
 * scale through F16C), so the same bits. */

TGTI static inline float hmax8(__m256 m) {
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    return _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
}

/* 32 codes rint(x * f) clamped to [lo, 127] -> q (in order); returns their
 * int32 lanes for the sums */
TGTI static inline void codes32(const float *x, float f, int lo, int8_t *q, __m256i qi[4]) {
    for (int k = 0; k < 4; k++) {
        const __m256 v = _mm256_round_ps(_mm256_mul_ps(ld(x + 8 * k), _mm256_set1_ps(f)),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        qi[k] = _mm256_max_epi32(_mm256_min_epi32(_mm256_cvtps_epi32(v), _mm256_set1_epi32(127)),
                                 _mm256_set1_epi32(lo));
    }
    // |q| <= 127: the packs do not saturate; they work per 128-bit lane, the permute restores order
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3]));
    _mm256_storeu_si256((__m256i_u *)q, _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

/* the scale arrays and x' of one block of 32 with scale dj */
TGTI static inline void sums32(const __m256i qi[4], float dj, float *d, float *dsum16, float *dsum32, float *xd) {
    int32_t t0[8], t1[8];
    _mm256_storeu_si256((__m256i_u *)t0, _mm256_add_epi32(qi[0], qi[1]));
    _mm256_storeu_si256((__m256i_u *)t1, _mm256_add_epi32(qi[2], qi[3]));
    int sa = 0, sb = 0;
    for (int k = 0; k < 8; k++) sa += t0[k], sb += t1[k];
    *d = dj;
    dsum16[0] = dj * (float)sa;
    dsum16[1] = dj * (float)sb;
    *dsum32 = dj * (float)(sa + sb);
    if (xd)
        for (int k = 0; k < 4; k++) _mm256_storeu_ps(xd + 8 * k, _mm256_mul_ps(_mm256_set1_ps(dj), _mm256_cvtepi32_ps(qi[k])));
}

TGT static void quantize_act(td_cpu_act_fmt fmt, const float *x, int64_t n, int8_t *q, float *d, float *dsum16,
                             float *dsum32, float *xd) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    __m256i qi[4];
    if (fmt == TD_CPU_ACT_Q8_0) {
        for (int64_t j = 0; j < n / 32; j++) {
            const float *xb = x + 32 * j;
            __m256 m = _mm256_and_ps(ld(xb), absmask);
            for (int k = 1; k < 4; k++) m = _mm256_max_ps(m, _mm256_and_ps(ld(xb + 8 * k), absmask));
            const float a = hmax8(m);
            const float id = a != 0.0f ? 127.0f / a : 0.0f;
            const float dj = _cvtsh_ss(_cvtss_sh(a / 127.0f, _MM_FROUND_TO_NEAREST_INT));
            codes32(xb, id, -127, q + 32 * j, qi);
            sums32(qi, dj, d + j, dsum16 + 2 * j, dsum32 + j, xd ? xd + 32 * j : NULL);
        }
        return;
    }
    for (int64_t b = 0; b < n / 256; b++) {
        const float *xb = x + 256 * b;
        __m256 m = _mm256_and_ps(ld(xb), absmask);
        for (int k = 1; k < 32; k++) m = _mm256_max_ps(m, _mm256_and_ps(ld(xb + 8 * k), absmask));
        const float a = hmax8(m);
        float mx = 0;
        for (int i = 0; i < 256; i++) // the first value of largest magnitude
            if (fabsf(xb[i]) == a) {
                mx = xb[i];
                break;
            }
        const float sc = a != 0.0f ? -127.0f / mx : 0.0f, dd = a != 0.0f ? 1.0f / sc : 0.0f;
        for (int k = 0; k < 8; k++) {
            const int64_t j = 8 * b + k;
            // s*x >= -127 up to one rounding, so only the top needs the clamp
            codes32(xb + 32 * k, sc, -128, q + 32 * j, qi);
            sums32(qi, dd, d + j, dsum16 + 2 * j, dsum32 + j, xd ? xd + 32 * j : NULL);
        }
    }
}

/* ===================================================================== */
/* act-q8 on packed weights (kernels_pack.c): 16 rows as two halves of 8   */
/* ===================================================================== */
/* A 64-byte word of the packed codes is two vectors: rows 0..7 and 8..15,
 * 4 codes each per 32-bit lane. vpmaddubsw multiplies them by 4 activation
 * bytes broadcast from one token (pairs into int16, exact as above) and
 * vpmaddwd finishes each row's 4 products in int32, so one loaded word
 * serves every token of the tile. The integer sums and kernels.c's f32
 * order are those of the per-row kernels: each (row, token) gets dot_q8's
 * bits, as at the VNNI level. */

TGTI static inline __m256i bc4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

TGTI static inline __m256 f16x8p(const uint8_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i_u *)p));
}

/* td_cpu_red8 of 8 vectors, lane by lane */
TGTI static inline __m256 red8x8(const __m256 v[8]) {
    return _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(v[0], v[4]), _mm256_add_ps(v[2], v[6])),
                         _mm256_add_ps(_mm256_add_ps(v[1], v[5]), _mm256_add_ps(v[3], v[7])));
}

/* y[r] = v[r] + (bias[r] or 0) for 8 rows */
TGTI static inline void put8(float *y, __m256 v, const float *bias) {
    _mm256_storeu_ps(y, _mm256_add_ps(v, bias ? _mm256_loadu_ps(bias) : _mm256_setzero_ps()));
}

/* Q8_0: codes are stored as w + 128; back to w (xor), then |w| times a with
 * w's sign moved onto a. The lane accumulators (lane j % 8 of block j) live
 * in an array: sixteen vector registers do not hold them. */
TGTI static inline void q8_0_tile2(const uint8_t *pk, int64_t nb, int TT, const int8_t *q, const float *d, int64_t n,
                                   float *y, int64_t ldy, const float *bias) {
    const __m256i x80 = _mm256_set1_epi8((char)0x80), one = _mm256_set1_epi16(1);
    __m256 acc[2][2][8]; // token, half, lane
#pragma GCC unroll 8
    for (int t = 0; t < 2; t++)
#pragma GCC unroll 8
        for (int h = 0; h < 2; h++)
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++) acc[t][h][k] = _mm256_setzero_ps();
    for (int64_t j = 0; j < nb; j++) {
        const uint8_t *c = pk + 1088 * (j / 2) + 512 * (j % 2), *sc = pk + 1088 * (j / 2) + 1024 + 32 * (j % 2);
#pragma GCC unroll 8
        for (int h = 0; h < 2; h++) {
            __m256i s[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) {
                const __m256i w = _mm256_xor_si256(ld256(c + 64 * i + 32 * h), x80), aw = _mm256_sign_epi8(w, w);
#pragma GCC unroll 8
                for (int t = 0; t < TT; t++) {
                    const __m256i a = _mm256_sign_epi8(bc4(q + t * n + 32 * j + 4 * i), w);
                    s[t] = _mm256_add_epi32(s[t], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, a), one));
                }
            }
            const __m256 dw = f16x8p(sc + 16 * h);
#pragma GCC unroll 8
            for (int t = 0; t < TT; t++) {
                const __m256 f = _mm256_mul_ps(dw, _mm256_set1_ps(d[t * nb + j]));
                acc[t][h][j & 7] = _mm256_add_ps(acc[t][h][j & 7], _mm256_mul_ps(f, _mm256_cvtepi32_ps(s[t])));
            }
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < TT; t++)
#pragma GCC unroll 8
        for (int h = 0; h < 2; h++) put8(y + t * ldy + 8 * h, red8x8(acc[t][h]), bias ? bias + 8 * h : NULL);
}

#define GROUP_BLOCK 4

TGT static void gemm_q8_q8_0(const void *packed, int64_t n_groups, const td_cpu_xq8 *x, int64_t n, int64_t T,
                             float *y, int64_t ldy, const float *bias) {
    const int64_t nb = n / 32;
    const size_t gbytes = td_cpu_pack_bytes_q8_0(n);
    for (int64_t g0 = 0; g0 < n_groups; g0 += GROUP_BLOCK) {
        const int64_t g1 = g0 + GROUP_BLOCK < n_groups ? g0 + GROUP_BLOCK : n_groups;
        for (int64_t t0 = 0; t0 < T; t0 += 2) {
            const int TT = T - t0 >= 2 ? 2 : 1;
            for (int64_t g = g0; g < g1; g++) {
                const uint8_t *c = (const uint8_t *)packed + (size_t)g * gbytes;
                float *yy = y + t0 * ldy + 16 * g;
                const float *bb = bias ? bias + 16 * g : NULL;
                if (TT == 2) q8_0_tile2(c, nb, 2, x->q + t0 * n, x->d + t0 * nb, n, yy, ldy, bb);
                else q8_0_tile2(c, nb, 1, x->q + t0 * n, x->d + t0 * nb, n, yy, ldy, bb);
            }
        }
    }
}

/* Q4_K has no packed kernel at this level: written the same way (vpmaddwd
 * with the rows' scale pairs), it sped prefill up by ~1.4x but decode ran
 * ~13% slower than the per-row kernel (CPU time, bench/cpu_time.sh), and
 * without VNNI each code still costs as many instructions as per row. */

/* ===================================================================== */

void td_cpu_kernels_init_avx2(td_cpu_kernels *k) {
    k->isa = TD_CPU_ISA_AVX2;
    k->dot_f32 = dot_f32_f32;
    k->axpy_f32 = axpy_f32;
    k->quantize_act = quantize_act;
    k->type[TD_TYPE_F32].dot = dot_f32;
    k->type[TD_TYPE_F16].dot = dot_f16;
    k->type[TD_TYPE_F16].dot_rows = dot_rows_f16;
    k->type[TD_TYPE_F16].to_f32 = row_f16;
    k->type[TD_TYPE_BF16].dot = dot_bf16;
    k->type[TD_TYPE_BF16].to_f32 = row_bf16;
    k->type[TD_TYPE_Q8_0].dot = dot_q8_0;
    k->type[TD_TYPE_Q8_0].to_f32 = row_q8_0;
    k->type[TD_TYPE_Q4_0].dot = dot_q4_0;
    k->type[TD_TYPE_Q4_0].to_f32 = row_q4_0;
    k->type[TD_TYPE_Q4_K].dot = dot_q4_k;
    k->type[TD_TYPE_Q4_K].to_f32 = row_q4_k;
    k->type[TD_TYPE_Q5_K].dot = dot_q5_k;
    k->type[TD_TYPE_Q5_K].to_f32 = row_q5_k;
    k->type[TD_TYPE_Q6_K].dot = dot_q6_k;
    k->type[TD_TYPE_Q6_K].to_f32 = row_q6_k;
    k->type[TD_TYPE_Q8_0].dot_q8 = dot_q8_q8_0;
    k->type[TD_TYPE_Q4_0].dot_q8 = dot_q8_q4_0;
    k->type[TD_TYPE_Q4_K].dot_q8 = dot_q8_q4_k;
    k->type[TD_TYPE_Q5_K].dot_q8 = dot_q8_q5_k;
    k->type[TD_TYPE_Q6_K].dot_q8 = dot_q8_q6_k;
    k->type[TD_TYPE_Q8_0].pack_bytes = td_cpu_pack_bytes_q8_0;
    k->type[TD_TYPE_Q8_0].pack = td_cpu_pack_q8_0;
    k->type[TD_TYPE_Q8_0].gemm_q8 = gemm_q8_q8_0;
}
#else
typedef int td_cpu_kernels_avx2_unused; /* ISO C: a translation unit is not empty */
#endif
