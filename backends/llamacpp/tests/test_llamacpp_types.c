/* Type conformance of tapdiff's block decoders against ggml's own: every
 * type our loader decodes (td_type_get(t)->can_decode) is decoded from the
 * same random blocks by td_decode_row_f32 and by ggml's
 * ggml_get_type_traits(t)->to_float (the libggml-base that llama.cpp runs
 * with). Two independent implementations of one format: they must agree
 * bit for bit, and on the block geometry. Skips when the peer is not built. */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "types.h"

#ifdef TD_HAVE_LLAMACPP
#include <ggml.h>

/* xorshift64*: any fixed stream of bytes will do, the point is coverage of
 * every bit pattern the scales and quants can take. */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng_next(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1dull;
}

static void fill_random(uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(rng_next() >> 56);
}

/* Blocks whose f16/bf16/e8m0 scales are random bits hold NaN and inf too;
 * where either decoder gives NaN the two are only required to both be NaN
 * (ggml's and our NaN payloads are not part of any contract). */
static int same_value(float a, float b) {
    if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
    uint32_t ua, ub;
    memcpy(&ua, &a, 4);
    memcpy(&ub, &b, 4);
    return ua == ub;
}
#endif

Test(llamacpp_types, geometry_matches_ggml) {
#ifndef TD_HAVE_LLAMACPP
    cr_skip_test("llama.cpp peer not built (run ci/fetch-llamacpp.sh, then meson setup --reconfigure)");
#else
    int checked = 0;
    for (int t = 0; t < TD_TYPE_COUNT; t++) {
        const td_type_info *ti = td_type_get(t);
        if (!ti) continue;
        const struct ggml_type_traits *g = ggml_get_type_traits((enum ggml_type)t);
        cr_assert_eq(strcasecmp(ti->name, ggml_type_name((enum ggml_type)t)), 0, "type %d: %s, ggml %s", t, ti->name,
                     ggml_type_name((enum ggml_type)t));
        cr_expect_eq(ti->block_size, g->blck_size, "%s: block size %lld, ggml %lld", ti->name,
                     (long long)ti->block_size, (long long)g->blck_size);
        cr_expect_eq((size_t)ti->block_bytes, g->type_size, "%s: block bytes %lld, ggml %zu", ti->name,
                     (long long)ti->block_bytes, g->type_size);
        checked++;
    }
    cr_assert_gt(checked, 30, "only %d type ids known", checked);
#endif
}

Test(llamacpp_types, decoders_match_ggml_bitwise) {
#ifndef TD_HAVE_LLAMACPP
    cr_skip_test("llama.cpp peer not built (run ci/fetch-llamacpp.sh, then meson setup --reconfigure)");
#else
    enum { ROWS = 64, BLOCKS = 8 }; // 512 blocks of every type
    int n_types = 0;
    for (int t = 0; t < TD_TYPE_COUNT; t++) {
        const td_type_info *ti = td_type_get(t);
        if (!ti || !ti->can_decode) continue;
        const struct ggml_type_traits *g = ggml_get_type_traits((enum ggml_type)t);
        const int64_t n = BLOCKS * ti->block_size;
        const size_t row_bytes = td_type_row_bytes(t, n);
        cr_assert_gt(row_bytes, 0);
        uint8_t *src = malloc(row_bytes);
        float *ours = malloc((size_t)n * sizeof *ours), *theirs = malloc((size_t)n * sizeof *theirs);
        int64_t nan_pairs = 0;
        for (int r = 0; r < ROWS; r++) {
            fill_random(src, row_bytes);
            td_err err = {{0}};
            int rc = td_decode_row_f32(t, src, ours, n, &err);
            cr_assert_eq(rc, TD_OK, "%s: %s", ti->name, err.msg);
            if (g->to_float) {
                g->to_float(src, theirs, n);
            } else if (t == TD_TYPE_F32) { // ggml-base has no to_float for F32: the bytes are the values
                memcpy(theirs, src, (size_t)n * 4);
            } else if (t == TD_TYPE_F64) { // nor for F64: the nearest float of each double
                for (int64_t i = 0; i < n; i++) {
                    double d;
                    memcpy(&d, src + 8 * i, 8);
                    theirs[i] = (float)d;
                }
            } else if (t == TD_TYPE_Q8_K) {
                // nor for Q8_K (an activation format): block = f32 d, int8 q[256],
                // int16 bsums[16]; value i = d * q[i], one float product
                for (int64_t bk = 0; bk < BLOCKS; bk++) {
                    float d;
                    memcpy(&d, src + bk * 292, 4);
                    for (int i = 0; i < 256; i++) theirs[bk * 256 + i] = d * (float)(int8_t)src[bk * 292 + 4 + i];
                }
            } else {
                cr_assert_fail("%s: we decode it, ggml-base has no to_float for it", ti->name);
            }
            for (int64_t i = 0; i < n; i++) {
                if (isnan(theirs[i])) nan_pairs++;
                if (!same_value(ours[i], theirs[i])) {
                    char hex[3 * 64 + 1] = {0};
                    const int64_t b = i / ti->block_size;
                    for (int64_t k = 0; k < ti->block_bytes && k < 64; k++)
                        snprintf(hex + 3 * k, 4, "%02x ", src[b * ti->block_bytes + k]);
                    cr_assert_fail("%s row %d value %lld: tapdiff %a, ggml %a; block %lld: %s", ti->name, r,
                                   (long long)i, (double)ours[i], (double)theirs[i], (long long)b, hex);
                }
            }
        }
        cr_log_info("%-8s %d x %lld values agree bitwise (%lld NaN on both sides)", ti->name, ROWS, (long long)n,
                    (long long)nan_pairs);
        free(src);
        free(ours);
        free(theirs);
        n_types++;
    }
    cr_assert_geq(n_types, 20, "only %d decodable types", n_types);
#endif
}
