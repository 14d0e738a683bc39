/* tapdiff cpu backend: the AVX-512 VNNI level. It starts from the AVX2 table
 * (td_cpu_kernels_init installs that first) and overrides the act-q8
 * kernels of the 32-value types, where vpdpbusd does the work of
 * vpmaddubsw + vpmaddwd + vpaddd in one instruction (and without the int16
 * step). The integer sums are the same exact numbers and the f32 part is
 * kernels.c's order, so the results are the C and AVX2 kernels' bits. The
 * K-quants keep the AVX2 kernels: their scale codes multiply pairs inside
 * vpmaddwd, which vpdpbusd cannot do. Compiled per function with a target
 * attribute; the rest of the program stays portable. */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "blocks.h"
#define TD_CPU_SIMD
#include "cpu_kernels.h"

#define OFF(T, f) offsetof(td_blk_##T, f)
#define SZ(T) sizeof(td_blk_##T)

#define TGT __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))
#define TGTI __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"), always_inline))

TGTI static inline __m256i ld256(const void *p) {
    return _mm256_loadu_si256((const __m256i_u *)p);
}

/* signed x signed through vpdpbusd (unsigned x signed): |w| times a with
 * w's sign moved onto a */
TGTI static inline __m256i dot_s8s8(__m256i w, __m256i a) {
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(w), _mm256_sign_epi8(a, w));
}

TGTI static inline __m256i q8_0_isum(const uint8_t *b, const int8_t *a) {
    return dot_s8s8(ld256(b + OFF(q8_0, qs)), ld256(a));
}

TGTI static inline __m256i q4_0_isum(const uint8_t *b, const int8_t *a) {
    const __m128i v = _mm_loadu_si128((const __m128i_u *)(b + OFF(q4_0, qs)));
    const __m128i m4 = _mm_set1_epi8(0x0F);
    const __m256i c = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m4), _mm_and_si128(v, m4));
    return dot_s8s8(_mm256_sub_epi8(c, _mm256_set1_epi8(8)), ld256(a));
}

/* kernels.c's order: the scaling is cpu_kernels.h's, shared with AVX2 */
TD_CPU_Q8_BLOCKS_DOT(dot_q8_q8_0, TGT, SZ(q8_0), q8_0_isum)
TD_CPU_Q8_BLOCKS_DOT(dot_q8_q4_0, TGT, SZ(q4_0), q4_0_isum)

/* ===================================================================== */
/* act-q8 on packed weights (kernels_pack.c): 16 rows x a tile of tokens  */
/* ===================================================================== */
/* One vpdpbusd multiplies a 64-byte word of the packed codes (4 codes of
 * each of 16 rows) by 4 activation bytes of one token broadcast to all
 * lanes, adding into that token's 16 row sums; each weight word serves
 * every token of the tile. The integer sums are the per-row kernels' exact
 * numbers and the f32 part is kernels.c's order, vectorized over the 16 rows,
 * so each (row, token) gets dot_q8's bits. */

TGTI static inline __m512i bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

TGTI static inline __m512 f16x16(const uint8_t *p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i_u *)p));
}

/* td_cpu_red8 of 8 vectors, lane by lane */
TGTI static inline __m512 red8x16(const __m512 v[8]) {
    return _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(v[0], v[4]), _mm512_add_ps(v[2], v[6])),
                         _mm512_add_ps(_mm512_add_ps(v[1], v[5]), _mm512_add_ps(v[3], v[7])));
}

/* y[t*ldy + r] = v[r] + (bias[r] or 0), the per-row path's final add */
TGTI static inline void put16(float *y, __m512 v, const float *bias) {
    _mm512_storeu_ps(y, _mm512_add_ps(v, bias ? _mm512_loadu_ps(bias) : _mm512_setzero_ps()));
}

/* one token: codes this far ahead are prefetched (see q4_k_row1) */
#define PF_Q8_0 4096

/* Q8_0: codes are w + 128 (unsigned), so each block's sum is Σ (w+128) a
 * minus as = 128 Σ a. Block j's scaled value goes to lane j % 8 of its
 * token: acc[t] points at that lane's accumulator. */
TGTI static inline void q8_0_step(const uint8_t *pk, int64_t nb, int64_t j, int TT,
                                  const int8_t *q, const float *d, const int32_t *as, int64_t n, __m512 *acc0,
                                  __m512 *acc1) {
    __m512i s[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        const uint8_t *wp = pk + 1088 * (j / 2) + 512 * (j % 2) + 64 * i;
        if (TT == 1) _mm_prefetch((const char *)wp + PF_Q8_0, _MM_HINT_T0);
        const __m512i w = _mm512_loadu_si512(wp);
#pragma GCC unroll 8
        for (int t = 0; t < TT; t++) s[t] = _mm512_dpbusd_epi32(s[t], w, bcast4(q + t * n + 32 * j + 4 * i));
    }
    if (TT == 1 && j % 2) _mm_prefetch((const char *)pk + 1088 * (j / 2) + 1024 + PF_Q8_0, _MM_HINT_T0);
    const __m512 dw = f16x16(pk + 1088 * (j / 2) + 1024 + 32 * (j % 2));
#pragma GCC unroll 8
    for (int t = 0; t < TT; t++) {
        const __m512i si = _mm512_sub_epi32(s[t], _mm512_set1_epi32(as[t * nb + j]));
        const __m512 sc = _mm512_mul_ps(dw, _mm512_set1_ps(d[t * nb + j]));
        __m512 *a = t ? acc1 : acc0;
        *a = _mm512_add_ps(*a, _mm512_mul_ps(sc, _mm512_cvtepi32_ps(si)));
    }
}

/* the eight lane accumulators of each token stay in registers (TT <= 2):
 * blocks go eight at a time, lane k a constant */
TGTI static inline void q8_0_tile(const uint8_t *pk, int64_t nb, int TT, const int8_t *q,
                                  const float *d, const int32_t *as, int64_t n, float *y, int64_t ldy,
                                  const float *bias) {
    __m512 acc[2][8];
#pragma GCC unroll 8
    for (int t = 0; t < 2; t++)
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) acc[t][k] = _mm512_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= nb; j += 8) {
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) q8_0_step(pk, nb, j + k, TT, q, d, as, n, &acc[0][k], &acc[1][k]);
    }
    __m512 lanes[2][8];
#pragma GCC unroll 8
    for (int t = 0; t < 2; t++)
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) lanes[t][k] = acc[t][k];
    for (int k = 0; j + k < nb; k++) q8_0_step(pk, nb, j + k, TT, q, d, as, n, &lanes[0][k], &lanes[1][k]);
#pragma GCC unroll 8
    for (int t = 0; t < TT; t++) put16(y + t * ldy, red8x16(lanes[t]), bias);
}

/* the tokens' 128 Σa per block, for the tile starting at token t0 */
TGTI static inline void q8_0_asums(const int8_t *q, int64_t n, int TT, int32_t *as) {
    const int64_t nb = n / 32;
#pragma GCC unroll 8
    for (int t = 0; t < TT; t++)
        for (int64_t j = 0; j < nb; j++) {
            const __m256i a = _mm256_loadu_si256((const __m256i_u *)(q + t * n + 32 * j));
            // Σa as vpdpbusd(1, a) per 4 bytes, then the 8 lanes
            const __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(1), a);
            __m128i h = _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
            h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4E));
            h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xB1));
            as[t * nb + j] = 128 * _mm_cvtsi128_si32(h);
        }
}

/* groups per block of the loops: their codes stay in cache while every
 * token tile passes over them */
#define GROUP_BLOCK 4

TGT static void gemm_q8_q8_0(const void *packed, int64_t n_groups, const td_cpu_xq8 *x, int64_t n, int64_t T,
                             float *y, int64_t ldy, const float *bias) {
    const int64_t nb = n / 32;
    const size_t gbytes = td_cpu_pack_bytes_q8_0(n);
    int32_t as[2 * 1024];
    int32_t *asp = nb <= 1024 ? as : td_xcalloc((size_t)(2 * nb), sizeof *asp);
    for (int64_t g0 = 0; g0 < n_groups; g0 += GROUP_BLOCK) {
        const int64_t g1 = g0 + GROUP_BLOCK < n_groups ? g0 + GROUP_BLOCK : n_groups;
        for (int64_t t0 = 0; t0 < T; t0 += 2) {
            const int TT = T - t0 >= 2 ? 2 : 1;
            const int8_t *q = x->q + t0 * n;
            q8_0_asums(q, n, TT, asp);
            for (int64_t g = g0; g < g1; g++) {
                const uint8_t *c = (const uint8_t *)packed + (size_t)g * gbytes;
                float *yy = y + t0 * ldy + 16 * g;
                const float *bb = bias ? bias + 16 * g : NULL;
                if (TT == 2) q8_0_tile(c, nb, 2, q, x->d + t0 * nb, asp, n, yy, ldy, bb);
                else q8_0_tile(c, nb, 1, q, x->d + t0 * nb, asp, n, yy, ldy, bb);
            }
        }
    }
    if (asp != as) free(asp);
}

/* Q4_K: codes 0..15 are the unsigned operand as they are; per sub-block the
 * 16 row sums are multiplied by the rows' scale codes (vpmulld, exact) into
 * the super-block's isum; then kernels.c's
 * acc += (d * dx) * (float)isum - dmin * red8(mn_k * dsum32_k). */
TGTI static inline void q4_k_tile(const uint8_t *G0, int64_t nsb, int TT, const td_cpu_xq8 *x, int64_t n, float *y,
                                  int64_t ldy, const float *bias) {
    const int64_t ns = n / 32;
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512 acc[4];
#pragma GCC unroll 8
    for (int t = 0; t < TT; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t sb = 0; sb < nsb; sb++) {
        const uint8_t *G = G0 + (size_t)sb * 2368;
        __m512i isum[4];
#pragma GCC unroll 8
        for (int t = 0; t < TT; t++) isum[t] = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            __m512i slo[4], shi[4];
#pragma GCC unroll 8
            for (int t = 0; t < TT; t++) slo[t] = shi[t] = _mm512_setzero_si512();
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) {
                const __m512i v = _mm512_loadu_si512(G + 64 * (8 * c + i));
                const __m512i lo = _mm512_and_si512(v, m4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
#pragma GCC unroll 8
                for (int t = 0; t < TT; t++) {
                    const int8_t *a = x->q + t * n + TD_QK_K * sb + 64 * c + 4 * i;
                    slo[t] = _mm512_dpbusd_epi32(slo[t], lo, bcast4(a));
                    shi[t] = _mm512_dpbusd_epi32(shi[t], hi, bcast4(a + 32));
                }
            }
            const __m512i sclo = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i_u *)(G + 2048 + 32 * c)));
            const __m512i schi = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i_u *)(G + 2048 + 32 * c + 16)));
#pragma GCC unroll 8
            for (int t = 0; t < TT; t++)
                isum[t] = _mm512_add_epi32(isum[t], _mm512_add_epi32(_mm512_mullo_epi32(slo[t], sclo),
                                                                     _mm512_mullo_epi32(shi[t], schi)));
        }
        const __m512 d = f16x16(G + 2304), dmin = f16x16(G + 2336);
        __m512 mnf[8];
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++)
            mnf[k] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i_u *)(G + 2176 + 16 * k))));
#pragma GCC unroll 8
        for (int t = 0; t < TT; t++) {
            const float *ds = x->dsum32 + t * ns + 8 * sb;
            __m512 tk[8];
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++) tk[k] = _mm512_mul_ps(mnf[k], _mm512_set1_ps(ds[k]));
            const __m512 v = _mm512_mul_ps(_mm512_mul_ps(d, _mm512_set1_ps(x->d[t * ns + 8 * sb])),
                                           _mm512_cvtepi32_ps(isum[t]));
            acc[t] = _mm512_add_ps(acc[t], _mm512_sub_ps(v, _mm512_mul_ps(dmin, red8x16(tk))));
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < TT; t++) put16(y + t * ldy, acc[t], bias);
}

/* One token (decode): the tile above at TT = 1 does ~8 vector operations
 * per 64-byte word, so the reorder window holds only ~2 KB of loads in
 * flight and a stream from memory ran at ~60% of a plain read; the codes
 * PF_Q4K bytes ahead are prefetched. The high nibbles are summed as
 * v & 0xF0 (16 x the nibble: 4 x 240 x 127 per lane and step, far from
 * overflow), the factor 16 removed once per 8 words by an exact shift, so
 * each word costs one mask less. The integer sums are the same numbers and
 * the f32 part is the tile's in its order, so each row gets the tile's (and
 * dot_q8's) bits. */
#define PF_Q4K 4096
TGTI static inline void q4_k_row1(const uint8_t *G0, int64_t nsb, const td_cpu_xq8 *x, float *y,
                                  const float *bias) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t sb = 0; sb < nsb; sb++) {
        const uint8_t *G = G0 + (size_t)sb * 2368;
        const int8_t *a0 = x->q + TD_QK_K * sb;
        __m512i isum = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            __m512i slo = _mm512_setzero_si512(), shi = _mm512_setzero_si512();
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) {
                _mm_prefetch((const char *)G + PF_Q4K + 64 * (8 * c + i), _MM_HINT_T0);
                const __m512i v = _mm512_loadu_si512(G + 64 * (8 * c + i));
                const int8_t *a = a0 + 64 * c + 4 * i;
                slo = _mm512_dpbusd_epi32(slo, _mm512_and_si512(v, m4), bcast4(a));
                shi = _mm512_dpbusd_epi32(shi, _mm512_andnot_si512(m4, v), bcast4(a + 32));
            }
            const __m512i sclo = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i_u *)(G + 2048 + 32 * c)));
            const __m512i schi = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i_u *)(G + 2048 + 32 * c + 16)));
            isum = _mm512_add_epi32(isum, _mm512_add_epi32(_mm512_mullo_epi32(slo, sclo),
                                                           _mm512_mullo_epi32(_mm512_srai_epi32(shi, 4), schi)));
        }
#pragma GCC unroll 8
        for (int l = 0; l < 5; l++) _mm_prefetch((const char *)G + PF_Q4K + 2048 + 64 * l, _MM_HINT_T0);
        const __m512 d = f16x16(G + 2304), dmin = f16x16(G + 2336);
        const float *ds = x->dsum32 + 8 * sb;
        __m512 tk[8];
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            const __m128i mn = _mm_loadu_si128((const __m128i_u *)(G + 2176 + 16 * k));
            tk[k] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(mn)), _mm512_set1_ps(ds[k]));
        }
        const __m512 v = _mm512_mul_ps(_mm512_mul_ps(d, _mm512_set1_ps(x->d[8 * sb])), _mm512_cvtepi32_ps(isum));
        acc = _mm512_add_ps(acc, _mm512_sub_ps(v, _mm512_mul_ps(dmin, red8x16(tk))));
    }
    put16(y, acc, bias);
}

TGT static void gemm_q8_q4_k(const void *packed, int64_t n_groups, const td_cpu_xq8 *x, int64_t n, int64_t T,
                             float *y, int64_t ldy, const float *bias) {
    const int64_t nsb = n / TD_QK_K, ns = n / 32;
    const size_t gbytes = (size_t)nsb * 2368;
    for (int64_t g0 = 0; g0 < n_groups; g0 += GROUP_BLOCK) {
        const int64_t g1 = g0 + GROUP_BLOCK < n_groups ? g0 + GROUP_BLOCK : n_groups;
        for (int64_t t0 = 0; t0 < T;) {
            const int TT = T - t0 >= 4 ? 4 : T - t0 >= 2 ? 2 : 1;
            const td_cpu_xq8 xt = {x->q + t0 * n, x->d + t0 * ns, x->dsum16 + 2 * t0 * ns, x->dsum32 + t0 * ns};
            for (int64_t g = g0; g < g1; g++) {
                const uint8_t *G = (const uint8_t *)packed + (size_t)g * gbytes;
                float *yy = y + t0 * ldy + 16 * g;
                const float *bb = bias ? bias + 16 * g : NULL;
                if (T == 1) q4_k_row1(G, nsb, &xt, yy, bb);
                else if (TT == 4) q4_k_tile(G, nsb, 4, &xt, n, yy, ldy, bb);
                else if (TT == 2) q4_k_tile(G, nsb, 2, &xt, n, yy, ldy, bb);
                else q4_k_tile(G, nsb, 1, &xt, n, yy, ldy, bb);
            }
            t0 += TT;
        }
    }
}

/* ===================================================================== */
/* native Q8_0 and Q4_K on packed weights: activations as exact integers  */
/* ===================================================================== */
/* cpu_kernels.h td_cpu_x32. The codes are w + 128 (unsigned), so a digit
 * row's vpdpbusd sum is Σ w d + 128 Σ d, and the four digit sums put
 * together are Σ w X + 128 Σ X: corr removes the second term exactly. */

/* X (16 values, |X| <= 2^30) as four signed base-256 digits: X = Σ 256^k d_k */
TGTI static inline void x32_digits(__m512i X, int8_t *q, int64_t stride) {
#pragma GCC unroll 4
    for (int k = 0; k < 3; k++) {
        const __m512i d = _mm512_srai_epi32(_mm512_slli_epi32(X, 24), 24);
        _mm_storeu_si128((__m128i_u *)(q + k * stride), _mm512_cvtepi32_epi8(d));
        X = _mm512_srai_epi32(_mm512_sub_epi32(X, d), 8);
    }
    _mm_storeu_si128((__m128i_u *)(q + 3 * stride), _mm512_cvtepi32_epi8(X));
}

TGTI static inline __m512i x32_int(__m512 v, __m512 s) {
    return _mm512_cvt_roundps_epi32(_mm512_scalef_ps(v, s), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

TGTI static inline int64_t x32_sum(__m512i X) {
    return _mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_cvtepi32_epi64(_mm512_castsi512_si256(X)),
                                                    _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(X, 1))));
}

TGT static int prep_x32(const float *x, int64_t n, int8_t *q, double *sc, double *corr) {
    const __m512i abs_bits = _mm512_set1_epi32(0x7fffffff), inf_bits = _mm512_set1_epi32(0x7f800000);
    for (int64_t j = 0; j < n / 32; j++) {
        const __m512 v0 = _mm512_loadu_ps(x + 32 * j), v1 = _mm512_loadu_ps(x + 32 * j + 16);
        const __m512i a0 = _mm512_and_si512(_mm512_castps_si512(v0), abs_bits);
        const __m512i a1 = _mm512_and_si512(_mm512_castps_si512(v1), abs_bits);
        if (_mm512_cmpge_epi32_mask(a0, inf_bits) | _mm512_cmpge_epi32_mask(a1, inf_bits)) return 0;
        // |x| of finite floats orders as its bits
        const int32_t mbits = _mm512_reduce_max_epi32(_mm512_max_epi32(a0, a1));
        int8_t *qj = q + 128 * j;
        if (mbits == 0) {
            memset(qj, 0, 128);
            sc[j] = 1.0;
            corr[j] = 0.0;
            continue;
        }
        float m;
        memcpy(&m, &mbits, sizeof m);
        int e;
        (void)frexpf(m, &e); // m = f 2^e, f in [0.5, 1): m 2^(30-e) in [2^29, 2^30)
        const __m512 s = _mm512_set1_ps((float)(30 - e));
        const __m512i X0 = x32_int(v0, s), X1 = x32_int(v1, s);
        x32_digits(X0, qj, 32);
        x32_digits(X1, qj + 16, 32);
        sc[j] = ldexp(1.0, e - 30);
        corr[j] = 128.0 * (double)(x32_sum(X0) + x32_sum(X1));
    }
    return 1;
}

/* 16 int32 lanes as two halves of 8 doubles */
TGTI static inline __m512d lo_pd(__m512i v) {
    return _mm512_cvtepi32_pd(_mm512_castsi512_si256(v));
}
TGTI static inline __m512d hi_pd(__m512i v) {
    return _mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(v, 1));
}

/* 16 f16 at p as two halves of 8 doubles (exact) */
TGTI static inline void f16x16_pd(const uint8_t *p, __m512d *lo, __m512d *hi) {
    const __m512 v = f16x16(p);
    *lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
    *hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}

/* a block's four digit sums r (|r| < 2^20) put together, Σ 256^k r_k, as
 * two halves of 8 doubles: L and H are exact in int32, H 2^16 + L in double */
TGTI static inline void x32_join(const __m512i r[4], __m512d *lo, __m512d *hi) {
    const __m512d k16 = _mm512_set1_pd(65536.0);
    const __m512i L = _mm512_add_epi32(r[0], _mm512_slli_epi32(r[1], 8));
    const __m512i H = _mm512_add_epi32(r[2], _mm512_slli_epi32(r[3], 8));
    *lo = _mm512_fmadd_pd(lo_pd(H), k16, lo_pd(L));
    *hi = _mm512_fmadd_pd(hi_pd(H), k16, hi_pd(L));
}

/* the 16 rows' double sums rounded to f32, put16 */
TGTI static inline void put16_pd(float *y, __m512d y0, __m512d y1, const float *bias) {
    const __m512 v = _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(_mm512_cvtpd_ps(y0))),
                                                         _mm256_castps_pd(_mm512_cvtpd_ps(y1)), 1));
    put16(y, v, bias);
}

TGT static void gemv_x32_q8_0(const void *packed, int64_t n_groups, const td_cpu_x32 *x, int64_t n, float *y,
                              const float *bias) {
    const int64_t nb = n / 32;
    const size_t gbytes = td_cpu_pack_bytes_q8_0(n);
    for (int64_t g = 0; g < n_groups; g++) {
        const uint8_t *pk = (const uint8_t *)packed + (size_t)g * gbytes;
        __m512d y0 = _mm512_setzero_pd(), y1 = _mm512_setzero_pd();
        for (int64_t j = 0; j < nb; j++) {
            const uint8_t *cw = pk + 1088 * (j / 2) + 512 * (j % 2);
            const int8_t *a = x->q + 128 * j;
            __m512i r[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(),
                            _mm512_setzero_si512()};
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) {
                _mm_prefetch((const char *)cw + 64 * i + PF_Q8_0, _MM_HINT_T0);
                const __m512i w = _mm512_loadu_si512(cw + 64 * i);
#pragma GCC unroll 4
                for (int k = 0; k < 4; k++) r[k] = _mm512_dpbusd_epi32(r[k], w, bcast4(a + 32 * k + 4 * i));
            }
            if (j % 2) _mm_prefetch((const char *)pk + 1088 * (j / 2) + 1024 + PF_Q8_0, _MM_HINT_T0);
            __m512d b0, b1, d0, d1;
            x32_join(r, &b0, &b1);
            const __m512d c = _mm512_set1_pd(x->corr[j]), s = _mm512_set1_pd(x->sc[j]);
            f16x16_pd(pk + 1088 * (j / 2) + 1024 + 32 * (j % 2), &d0, &d1);
            y0 = _mm512_fmadd_pd(_mm512_sub_pd(b0, c), _mm512_mul_pd(d0, s), y0);
            y1 = _mm512_fmadd_pd(_mm512_sub_pd(b1, c), _mm512_mul_pd(d1, s), y1);
        }
        put16_pd(y + 16 * g, y0, y1, bias ? bias + 16 * g : NULL);
    }
}

/* Q4_K: a sub-block of 32 is one x32 block. Its codes q (0..15) are the
 * unsigned operand as they are (the high nibbles as 16 q, the sums then
 * shifted back exactly), so Σ q X needs no correction; the value is
 * 2^-s (d sc Σ q X - dmin mn Σ X), both products in double. */
TGT static void gemv_x32_q4_k(const void *packed, int64_t n_groups, const td_cpu_x32 *x, int64_t n, float *y,
                              const float *bias) {
    const int64_t nsb = n / TD_QK_K;
    const size_t gbytes = (size_t)nsb * 2368;
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    for (int64_t g = 0; g < n_groups; g++) {
        __m512d y0 = _mm512_setzero_pd(), y1 = _mm512_setzero_pd();
        for (int64_t sb = 0; sb < nsb; sb++) {
            const uint8_t *G = (const uint8_t *)packed + (size_t)g * gbytes + (size_t)sb * 2368;
            __m512d dlo, dhi, mlo, mhi;
            f16x16_pd(G + 2304, &dlo, &dhi);
            f16x16_pd(G + 2336, &mlo, &mhi);
#pragma GCC unroll 1
            for (int c = 0; c < 4; c++) {
                __m512i r[2][4];
#pragma GCC unroll 2
                for (int h = 0; h < 2; h++)
#pragma GCC unroll 4
                    for (int k = 0; k < 4; k++) r[h][k] = _mm512_setzero_si512();
                const int64_t j0 = 8 * sb + 2 * c; // the x32 blocks of the low and the high nibbles
                const int8_t *alo = x->q + 128 * j0, *ahi = x->q + 128 * (j0 + 1);
#pragma GCC unroll 8
                for (int i = 0; i < 8; i++) {
                    _mm_prefetch((const char *)G + PF_Q4K + 64 * (8 * c + i), _MM_HINT_T0);
                    const __m512i v = _mm512_loadu_si512(G + 64 * (8 * c + i));
                    const __m512i lo = _mm512_and_si512(v, m4), hi = _mm512_andnot_si512(m4, v);
#pragma GCC unroll 4
                    for (int k = 0; k < 4; k++) {
                        r[0][k] = _mm512_dpbusd_epi32(r[0][k], lo, bcast4(alo + 32 * k + 4 * i));
                        r[1][k] = _mm512_dpbusd_epi32(r[1][k], hi, bcast4(ahi + 32 * k + 4 * i));
                    }
                }
#pragma GCC unroll 2
                for (int h = 0; h < 2; h++) {
                    if (h) // 16 q: every sum is a multiple of 16
#pragma GCC unroll 4
                        for (int k = 0; k < 4; k++) r[1][k] = _mm512_srai_epi32(r[1][k], 4);
                    const int64_t j = j0 + h;
                    __m512d blo, bhi; // Σ q X
                    x32_join(r[h], &blo, &bhi);
                    const int sub = 2 * c + h;
                    const __m512i sc = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i_u *)(G + 2048 + 16 * sub)));
                    const __m512i mn = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i_u *)(G + 2176 + 16 * sub)));
                    const __m512d xsum = _mm512_set1_pd(x->corr[j] * (1.0 / 128)), s = _mm512_set1_pd(x->sc[j]);
                    // d sc and dmin mn are exact in double; each product below rounds once
                    const __m512d tlo = _mm512_fmsub_pd(_mm512_mul_pd(dlo, lo_pd(sc)), blo,
                                                        _mm512_mul_pd(_mm512_mul_pd(mlo, lo_pd(mn)), xsum));
                    const __m512d thi = _mm512_fmsub_pd(_mm512_mul_pd(dhi, hi_pd(sc)), bhi,
                                                        _mm512_mul_pd(_mm512_mul_pd(mhi, hi_pd(mn)), xsum));
                    y0 = _mm512_fmadd_pd(tlo, s, y0);
                    y1 = _mm512_fmadd_pd(thi, s, y1);
                }
            }
#pragma GCC unroll 8
            for (int l = 0; l < 5; l++) _mm_prefetch((const char *)G + PF_Q4K + 2048 + 64 * l, _MM_HINT_T0);
        }
        put16_pd(y + 16 * g, y0, y1, bias ? bias + 16 * g : NULL);
    }
}

void td_cpu_kernels_init_avx512vnni(td_cpu_kernels *k) {
    k->isa = TD_CPU_ISA_AVX512VNNI;
    k->type[TD_TYPE_Q8_0].dot_q8 = dot_q8_q8_0;
    k->type[TD_TYPE_Q4_0].dot_q8 = dot_q8_q4_0;
    k->type[TD_TYPE_Q8_0].pack_bytes = td_cpu_pack_bytes_q8_0;
    k->type[TD_TYPE_Q8_0].pack = td_cpu_pack_q8_0;
    k->type[TD_TYPE_Q8_0].gemm_q8 = gemm_q8_q8_0;
    k->type[TD_TYPE_Q8_0].gemv_x32 = gemv_x32_q8_0;
    k->prep_x32 = prep_x32;
    k->type[TD_TYPE_Q4_K].pack_bytes = td_cpu_pack_bytes_q4_k;
    k->type[TD_TYPE_Q4_K].pack = td_cpu_pack_q4_k;
    k->type[TD_TYPE_Q4_K].gemm_q8 = gemm_q8_q4_k;
    k->type[TD_TYPE_Q4_K].gemv_x32 = gemv_x32_q4_k;
}
#else
typedef int td_cpu_kernels_vnni_unused; /* ISO C: a translation unit is not empty */
#endif
