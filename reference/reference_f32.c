/* tapdiff "ref32": the reference forward computing in float, weights decoded
 * to f32 — the same code as "ref" (reference_impl.h) in single precision.
 * It is the control arm: its distance to "ref" at every tap is what an honest
 * f32 implementation's rounding error looks like. Every operation, constant
 * and libm call is float; nothing is widened to double along the way. */
#include <math.h>

#include "reference.h"

#define real float
#define REAL_IS_FLOAT 1
#define REAL_SUFFIX f32
#define REAL_DTYPE TD_DT_F32
#define REAL_DECODE_ROW td_tensor_decode_row_f32
#define REAL_DECODE_ROW_AS td_tensor_decode_row_as_f32
#define R_SQRT sqrtf
#define R_EXP expf
#define R_LOG logf
#define R_POW powf
#define R_COS cosf
#define R_SIN sinf
#define R_FLOOR floorf
#define R_CEIL ceilf
#define REF_NAME "ref32"
#define REF_PRECISION "f32"

#include "reference_impl.h"
