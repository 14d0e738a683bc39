/* tapdiff tap fingerprints: the cheap summary stored for every tap, with or
 * without its data (DESIGN.md "Taps"). Exact widening of every dtype to
 * double, one pass in index order; non-finite values are counted and kept
 * out of min/max/sums so one NaN does not erase the rest of the summary. */
#include <math.h>
#include <string.h>

#include "tap.h"
#include "tap_internal.h"
#include "td_common.h"

// IEEE binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits. A normal
// value's double is assembled from its fields (exact, and no ldexp call per
// element in the fingerprint loop).
static inline double f16_to_f64(uint16_t h) {
    unsigned e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    double v;
    if (e == 0) {
        v = (double)m * 0x1p-24; // subnormal: m * 2^-14 * 2^-10
    } else if (e == 31) {
        v = m ? NAN : INFINITY;
    } else {
        const uint64_t bits = ((uint64_t)(e - 15 + 1023) << 52) | ((uint64_t)m << 42);
        memcpy(&v, &bits, sizeof v);
    }
    return (h & 0x8000u) ? -v : v;
}

double td_taps_f16_to_f64(uint16_t h) {
    return f16_to_f64(h);
}

double td_taps_bf16_to_f64(uint16_t h) {
    // bfloat16 is the top half of an IEEE binary32.
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return (double)f;
}

/* The summary in one pass with every accumulator in a register: the sums
 * stay sequential in index order (three dependent chains, so identical bits
 * to an element-by-element update of *fp), the extrema are the same
 * "v < min" / "v > max" comparisons (the first of equal values, e.g. 0.0
 * before -0.0, is kept). Starting min at +inf, max at -inf and max_abs at -1
 * makes the first finite value set all three, as it would. */
#define FP_LOOP(T, CONV)                                                                                        \
    do {                                                                                                       \
        const T *x = data;                                                                                     \
        for (uint64_t i = 0; i < count && i < 4; i++) fp->first[i] = CONV(x[i]);                             \
        for (uint64_t i = 0; i < count; i++) {                                                                 \
            const double v = CONV(x[i]);                                                                       \
            nz += (v != 0.0); /* NaN != 0 too: non-finite values are non-zero */                             \
            if (!isfinite(v)) {                                                                                \
                nf++;                                                                                          \
                continue;                                                                                      \
            }                                                                                                  \
            const double av = fabs(v);                                                                         \
            mn = v < mn ? v : mn;                                                                              \
            mx = v > mx ? v : mx;                                                                              \
            ma = av > ma ? av : ma;                                                                            \
            sum += v;                                                                                          \
            sum_abs += av;                                                                                     \
            sum_sq += v * v;                                                                                   \
        }                                                                                                      \
    } while (0)

#define FP_WIDEN(v) ((double)(v))

void td_fingerprint_compute(td_fingerprint *fp, td_dtype dtype, const void *data, uint64_t count) {
    TD_ASSERT(fp != NULL);
    TD_ASSERT(data != NULL || count == 0);
    memset(fp, 0, sizeof *fp);
    fp->count = count;
    for (int i = 0; i < 4; i++) fp->first[i] = NAN;
    uint64_t nz = 0, nf = 0;
    double mn = INFINITY, mx = -INFINITY, ma = -1.0, sum = 0.0, sum_abs = 0.0, sum_sq = 0.0;
    // One loop per dtype so the conversion is not a switch per element.
    switch (dtype) {
    case TD_DT_F64: FP_LOOP(double, FP_WIDEN); break;
    case TD_DT_F32: FP_LOOP(float, FP_WIDEN); break;
    case TD_DT_F16: FP_LOOP(uint16_t, f16_to_f64); break;
    case TD_DT_BF16: FP_LOOP(uint16_t, td_taps_bf16_to_f64); break;
    case TD_DT_I32: FP_LOOP(int32_t, FP_WIDEN); break;
    case TD_DT_I64: FP_LOOP(int64_t, FP_WIDEN); break;
    default:
        TD_ASSERT(!"td_fingerprint_compute: unknown dtype");
    }
    fp->n_nonzero = nz;
    fp->n_nonfinite = nf;
    fp->sum = sum;
    fp->sum_abs = sum_abs;
    fp->sum_sq = sum_sq;
    if (nf < count) {
        fp->min = mn;
        fp->max = mx;
        fp->max_abs = ma;
    } else {
        fp->min = fp->max = fp->max_abs = NAN;
    }
}
