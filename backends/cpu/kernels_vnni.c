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
#include <string.h>

#include "blocks.h"
#include "cpu_kernels.h"

#define OFF(T, f) offsetof(td_blk_##T, f)
#define SZ(T) sizeof(td_blk_##T)

#define TGT __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))
#define TGTI __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"), always_inline))

TGTI static inline __m256i ld256(const void *p) {
    return _mm256_loadu_si256((const __m256i_u *)p);
}

TGTI static inline float f16s(const uint8_t *p) {
    return _cvtsh_ss(td_cpu_rd_u16(p));
}

TGTI static inline int32_t hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

TGTI static inline __m256i hsum8x8_i32(const __m256i p[8]) {
    const __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
    const __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
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

/* kernels.c's order: block j's (dw * dx) * (float)s into lane j % 8 */
#define Q8_BLOCKS_DOT(name, BYTES, isum)                                                                              \
    TGT static float name(const void *wv, const td_cpu_xq8 *x, int64_t n) {                                          \
        const uint8_t *b = wv;                                                                                       \
        const int64_t nb = n / 32;                                                                                   \
        __m256 acc = _mm256_setzero_ps();                                                                            \
        int64_t j = 0;                                                                                               \
        for (; j + 8 <= nb; j += 8, b += 8 * (BYTES)) {                                                              \
            __m256i p[8];                                                                                            \
            float dw[8];                                                                                             \
            for (int k = 0; k < 8; k++) {                                                                            \
                p[k] = isum(b + k * (BYTES), x->q + 32 * (j + k));                                                   \
                dw[k] = f16s(b + k * (BYTES));                                                                       \
            }                                                                                                        \
            const __m256 sc = _mm256_mul_ps(_mm256_loadu_ps(dw), _mm256_loadu_ps(x->d + j));                         \
            acc = _mm256_add_ps(acc, _mm256_mul_ps(sc, _mm256_cvtepi32_ps(hsum8x8_i32(p))));                         \
        }                                                                                                            \
        float lanes[8];                                                                                              \
        _mm256_storeu_ps(lanes, acc);                                                                                \
        for (int k = 0; j < nb; j++, k++, b += (BYTES)) {                                                            \
            const float sc = f16s(b) * x->d[j];                                                                      \
            lanes[k] += sc * (float)hsum_i32(isum(b, x->q + 32 * j));                                                \
        }                                                                                                            \
        return td_cpu_red8(lanes);                                                                                   \
    }

Q8_BLOCKS_DOT(dot_q8_q8_0, SZ(q8_0), q8_0_isum)
Q8_BLOCKS_DOT(dot_q8_q4_0, SZ(q4_0), q4_0_isum)

void td_cpu_kernels_init_avx512vnni(td_cpu_kernels *k) {
    k->isa = TD_CPU_ISA_AVX512VNNI;
    k->type[TD_TYPE_Q8_0].dot_q8 = dot_q8_q8_0;
    k->type[TD_TYPE_Q4_0].dot_q8 = dot_q8_q4_0;
}
#else
typedef int td_cpu_kernels_vnni_unused; /* ISO C: a translation unit is not empty */
#endif
