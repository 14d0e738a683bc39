/* tapdiff "ref": the reference forward computing in double, weights decoded
 * to f64 (exact for every stored type). The oracle. The code is
 * reference_impl.h; this file only fixes the arithmetic. */
#include <math.h>

#include "reference.h"

#define real double
#define REAL_SUFFIX f64
#define REAL_DTYPE TD_DT_F64
#define REAL_DECODE_ROW td_tensor_decode_row_f64
#define REAL_DECODE_ROW_AS td_tensor_decode_row_as_f64
#define R_SQRT sqrt
#define R_EXP exp
#define R_LOG log
#define R_POW pow
#define R_COS cos
#define R_SIN sin
#define R_FLOOR floor
#define R_CEIL ceil
#define REF_NAME "ref"
#define REF_PRECISION "f64"

#include "reference_impl.h"
