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
#define TD_CPU_SIMD
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

void td_cpu_kernels_init_avx512vnni(td_cpu_kernels *k) {
    k->isa = TD_CPU_ISA_AVX512VNNI;
    k->type[TD_TYPE_Q8_0].dot_q8 = dot_q8_q8_0;
    k->type[TD_TYPE_Q4_0].dot_q8 = dot_q8_q4_0;
}
#else
typedef int td_cpu_kernels_vnni_unused; /* ISO C: a translation unit is not empty */
#endif
