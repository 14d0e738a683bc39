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


void td_ref_ple_context(int64_t *ctx, const int32_t *tok, int64_t p, uint32_t n_g, int64_t eos, int64_t image_id) {
    TD_ASSERT(p >= 0 && n_g >= 1);
    ctx[0] = tok[p] >= 0 ? tok[p] : image_id;
    int cut = 0;
    for (uint32_t s = 1; s < n_g; s++) {
        // a gap or an EOS at distance s replaces that entry and every older one
        const int64_t q = p - (int64_t)s;
        if (!cut && (q < 0 || tok[q] < 0 || tok[q] == eos)) cut = 1;
        ctx[s] = cut ? eos : tok[q];
    }
}

void td_ref_ple_rows(int64_t *rows, const int64_t *ctx, uint32_t n_g, uint32_t h_g, const uint64_t *mult,
                     const uint64_t *off, const uint64_t *vsz) {
    uint64_t X = (uint64_t)ctx[0] * mult[0];
    for (uint32_t n = 2; n <= n_g; n++) {
        // unsigned: the products of ids and ~1e13 multipliers wrap mod 2^64 by definition
        X ^= (uint64_t)ctx[n - 1] * mult[n - 1];
        for (uint32_t j = 0; j < h_g; j++) {
            const uint32_t h = (n - 2) * h_g + j;
            rows[h] = (int64_t)(X % vsz[h] + off[h]);
        }
    }
}

int td_ref_imrope_component(int64_t i, const uint32_t *sections) {
    const int64_t S = (int64_t)sections[0] + sections[1] + sections[2] + sections[3];
    TD_ASSERT(S > 0 && i >= 0);
    const int64_t sector = i % S;
    // interleaved: the checks are disjoint by sector mod 3
    if (sector % 3 == 1 && sector < 3 * (int64_t)sections[1]) return 1;
    if (sector % 3 == 2 && sector < 3 * (int64_t)sections[2]) return 2;
    if (sector % 3 == 0 && sector < 3 * (int64_t)sections[0]) return 0;
    return 3;
}
