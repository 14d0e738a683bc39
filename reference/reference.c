/* tapdiff reference forward: the parts that do not depend on the arithmetic
 * type (the f64/f32 code is reference_impl.h, compiled by reference_f64.c and
 * reference_f32.c): GQA head mapping. The arithmetic profiles' rules and
 * rounding formulas live in backends/profile.c. */
#include <math.h>
#include <string.h>

#include "reference.h"
#include "types.h"

int64_t td_ref_gqa_kv_head(int64_t h, int64_t H, int64_t Hkv) {
    TD_ASSERT(Hkv > 0 && H % Hkv == 0 && h >= 0 && h < H);
    // consecutive query heads share one KV head (HF repeat_kv), not h mod Hkv
    return h / (H / Hkv);
}

