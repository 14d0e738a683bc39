/* tapdiff tap fingerprints: the cheap summary stored for every tap, with or
 * without its data (DESIGN.md "Taps"). Exact widening of every dtype to
 * double, one pass in index order; non-finite values are counted and kept
 * out of min/max/sums so one NaN does not erase the rest of the summary. */
#include <math.h>
#include <string.h>

#include "tap.h"
#include "tap_internal.h"
#include "td_common.h"

double td_taps_f16_to_f64(uint16_t h) {
    // IEEE binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits.
    unsigned e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    double v;
    if (e == 0)
        v = ldexp((double)m, -24); // subnormal: m * 2^-14 * 2^-10
    else if (e == 31)
        v = m ? NAN : INFINITY;
    else
        v = ldexp((double)(m | 0x400u), (int)e - 25); // (1024 + m) * 2^(e-15-10)
    return (h & 0x8000u) ? -v : v;
}

double td_taps_bf16_to_f64(uint16_t h) {
    // bfloat16 is the top half of an IEEE binary32.
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return (double)f;
}

typedef struct fp_acc {
    td_fingerprint *fp;
    int have_finite;
} fp_acc;

static inline void fp_add(fp_acc *a, double v, uint64_t i) {
    td_fingerprint *fp = a->fp;
    if (i < 4) fp->first[i] = v;
    if (v != 0.0) fp->n_nonzero++; // NaN != 0 too: non-finite values are non-zero
    if (!isfinite(v)) {
        fp->n_nonfinite++;
        return;
    }
    double av = fabs(v);
    if (!a->have_finite) {
        fp->min = fp->max = v;
        fp->max_abs = av;
        a->have_finite = 1;
    } else {
        if (v < fp->min) fp->min = v;
        if (v > fp->max) fp->max = v;
        if (av > fp->max_abs) fp->max_abs = av;
    }
    fp->sum += v;
    fp->sum_abs += av;
    fp->sum_sq += v * v;
}

void td_fingerprint_compute(td_fingerprint *fp, td_dtype dtype, const void *data, uint64_t count) {
    TD_ASSERT(fp != NULL);
    TD_ASSERT(data != NULL || count == 0);
    memset(fp, 0, sizeof *fp);
    fp->count = count;
    fp->min = fp->max = fp->max_abs = NAN;
    for (int i = 0; i < 4; i++) fp->first[i] = NAN;
    fp_acc a = {fp, 0};
    // One loop per dtype so the conversion is not a switch per element.
    switch (dtype) {
    case TD_DT_F64: {
        const double *x = data;
        for (uint64_t i = 0; i < count; i++) fp_add(&a, x[i], i);
        break;
    }
    case TD_DT_F32: {
        const float *x = data;
        for (uint64_t i = 0; i < count; i++) fp_add(&a, (double)x[i], i);
        break;
    }
    case TD_DT_F16: {
        const uint16_t *x = data;
        for (uint64_t i = 0; i < count; i++) fp_add(&a, td_taps_f16_to_f64(x[i]), i);
        break;
    }
    case TD_DT_BF16: {
        const uint16_t *x = data;
        for (uint64_t i = 0; i < count; i++) fp_add(&a, td_taps_bf16_to_f64(x[i]), i);
        break;
    }
    case TD_DT_I32: {
        const int32_t *x = data;
        for (uint64_t i = 0; i < count; i++) fp_add(&a, (double)x[i], i);
        break;
    }
    case TD_DT_I64: {
        const int64_t *x = data;
        for (uint64_t i = 0; i < count; i++) fp_add(&a, (double)x[i], i);
        break;
    }
    default:
        TD_ASSERT(!"td_fingerprint_compute: unknown dtype");
    }
}
