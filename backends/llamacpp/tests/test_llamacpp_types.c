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

/* ------------------------------------------------------------------------ */
/* The grid types and NVFP4 on crafted blocks: every grid index, every sign
 * index or mask, every scale code and both shift signs appear at least once,
 * each in a block whose other bytes are random (so every field is exercised
 * against every other). The crafting writes fields by the layouts of
 * ../shared/spec/quants.md §3 and §7; ggml decodes them, we decode them,
 * and the two must agree bit for bit. Since the super-scale is random f16
 * bits too, a wrong grid entry, sign or scale cannot hide. */

#ifdef TD_HAVE_LLAMACPP
static void put_u16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }
static uint16_t get_u16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static uint32_t get_u32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static void put_u32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }

/* a finite, normal f16 super-scale of either sign: keeps the sweep free of
 * NaN so that every value is compared by its bits */
static uint16_t finite_f16(void) {
    uint16_t h = (uint16_t)(rng_next() >> 48);
    int e = (h >> 10) & 0x1F;
    if (e == 0x1F || e == 0) h = (uint16_t)((h & 0x83FF) | (15u << 10));
    return h;
}

/* sweep item i of the crafting for group g of a block: index i, sign i, scale i */
static void craft_group(int t, uint8_t *b, int g, int i) {
    int sb = g / 4, l = g % 4;
    switch (t) {
    case TD_TYPE_IQ2_XXS: { /* d, then per sub-block 4 index bytes + u32 (4 x 7-bit signs, scale) */
        uint8_t *q = b + 2 + 8 * sb;
        q[l] = (uint8_t)(i & 255);
        uint32_t w = get_u32(q + 4);
        w = (w & ~(127u << (7 * l))) | ((uint32_t)(i & 127) << (7 * l));
        if (l == 0) w = (w & 0x0FFFFFFFu) | ((uint32_t)(i & 15) << 28);
        put_u32(q + 4, w);
        break;
    }
    case TD_TYPE_IQ2_XS: /* u16 = 9-bit index | 7-bit sign index << 9 */
        put_u16(b + 2 + 2 * g, (uint16_t)((i & 511) | ((i % 128) << 9)));
        if (l == 0) b[66 + sb] = (uint8_t)(i & 255);
        break;
    case TD_TYPE_IQ2_S: /* qs low index, signs, qh 2 bits per group, scales */
        b[2 + g] = (uint8_t)(i & 255);
        b[34 + g] = (uint8_t)((i * 7) & 255);
        b[66 + sb] = (uint8_t)((b[66 + sb] & ~(3 << (2 * l))) | (((i >> 8) & 3) << (2 * l)));
        if (l == 0) b[74 + sb] = (uint8_t)(i & 255);
        break;
    case TD_TYPE_IQ3_XXS: { /* 2 index bytes per group, then per sub-block u32 */
        b[2 + 2 * g] = (uint8_t)(i & 255);
        b[2 + 2 * g + 1] = (uint8_t)((i * 5 + 3) & 255);
        uint8_t *p = b + 66 + 4 * sb;
        uint32_t w = get_u32(p);
        w = (w & ~(127u << (7 * l))) | ((uint32_t)(i & 127) << (7 * l));
        if (l == 0) w = (w & 0x0FFFFFFFu) | ((uint32_t)(i & 15) << 28);
        put_u32(p, w);
        break;
    }
    case TD_TYPE_IQ3_S: { /* qs[64], qh[8], signs[32], scales[4] */
        int i1 = i & 511, i2 = (i * 5 + 7) & 511;
        b[2 + 2 * g] = (uint8_t)(i1 & 255);
        b[2 + 2 * g + 1] = (uint8_t)(i2 & 255);
        uint8_t qh = b[66 + sb];
        qh = (uint8_t)((qh & ~(3 << (2 * l))) | ((i1 >> 8) << (2 * l)) | ((i2 >> 8) << (2 * l + 1)));
        b[66 + sb] = qh;
        b[74 + g] = (uint8_t)(i & 255);
        if (l == 0) b[106 + sb / 2] = (uint8_t)((b[106 + sb / 2] & (sb % 2 ? 0x0F : 0xF0)) | ((i & 15) << (4 * (sb % 2))));
        break;
    }
    case TD_TYPE_IQ1_S: { /* qs[32], qh[8] u16: 3 index bits per group, scale, shift sign */
        b[2 + g] = (uint8_t)(i & 255);
        uint16_t qh = get_u16(b + 34 + 2 * sb);
        qh = (uint16_t)((qh & ~(7u << (3 * l))) | (((i >> 8) & 7) << (3 * l)));
        if (l == 0) qh = (uint16_t)((qh & 0x0FFF) | ((i & 15) << 12));
        put_u16(b + 34 + 2 * sb, qh);
        break;
    }
    case TD_TYPE_IQ1_M: { /* qs[32], qh[16] nibble per group, scales (3-bit codes; super-scale kept) */
        b[g] = (uint8_t)(i & 255);
        uint8_t *h = b + 32 + g / 2;
        int nib = ((i >> 8) & 7) | ((i & 1) << 3);
        *h = (uint8_t)((*h & (g % 2 ? 0x0F : 0xF0)) | (nib << (4 * (g % 2))));
        if (l % 2 == 0) {
            uint8_t *s = b + 48 + 2 * (g / 8);
            uint16_t w = get_u16(s);
            int sh = 6 * (sb % 2) + 3 * (l / 2);
            w = (uint16_t)((w & ~(7u << sh)) | ((i & 7) << sh));
            put_u16(s, w);
        }
        break;
    }
    case TD_TYPE_NVFP4: /* "group" g = 16-value sub-block: its UE4M3 scale, then 8 code bytes */
        b[g] = (uint8_t)(i & 255);
        for (int j = 0; j < 8; j++) {
            int c = (i + j) & 15;
            b[4 + 8 * g + j] = (uint8_t)(c | (15 - c) << 4);
        }
        break;
    default: cr_assert_fail("no crafting for type %d", t);
    }
}

static void check_bitwise(int t, const uint8_t *src, int64_t n, const char *what) {
    const td_type_info *ti = td_type_get(t);
    float *ours = malloc((size_t)n * sizeof *ours), *theirs = malloc((size_t)n * sizeof *theirs);
    td_err err = {{0}};
    cr_assert_eq(td_decode_row_f32(t, src, ours, n, &err), TD_OK, "%s: %s", ti->name, err.msg);
    ggml_get_type_traits((enum ggml_type)t)->to_float(src, theirs, n);
    for (int64_t i = 0; i < n; i++) {
        if (!same_value(ours[i], theirs[i])) {
            const int64_t b = i / ti->block_size;
            char hex[3 * 110 + 1] = {0};
            for (int64_t k = 0; k < ti->block_bytes; k++) snprintf(hex + 3 * k, 4, "%02x ", src[b * ti->block_bytes + k]);
            cr_assert_fail("%s %s value %lld: tapdiff %a, ggml %a; block %lld: %s", ti->name, what, (long long)i,
                           (double)ours[i], (double)theirs[i], (long long)b, hex);
        }
    }
    free(ours);
    free(theirs);
}
#endif

Test(llamacpp_types, grid_types_every_index_sign_and_scale_match_ggml) {
#ifndef TD_HAVE_LLAMACPP
    cr_skip_test("llama.cpp peer not built (run ci/fetch-llamacpp.sh, then meson setup --reconfigure)");
#else
    /* sweep length per type: the largest of its index space, sign space, scale space */
    static const struct { int type; int sweep; int groups; } k_sweep[] = {
        {TD_TYPE_IQ2_XXS, 256, 32}, {TD_TYPE_IQ2_XS, 512, 32}, {TD_TYPE_IQ2_S, 1024, 32},
        {TD_TYPE_IQ3_XXS, 256, 32}, {TD_TYPE_IQ3_S, 512, 32},  {TD_TYPE_IQ1_S, 2048, 32},
        {TD_TYPE_IQ1_M, 2048, 32},  {TD_TYPE_NVFP4, 256, 4},
    };
    for (size_t k = 0; k < sizeof k_sweep / sizeof k_sweep[0]; k++) {
        const int t = k_sweep[k].type;
        const td_type_info *ti = td_type_get(t);
        cr_assert(ti && ti->can_decode, "type %d has no decoder", t);
        /* each sweep item once as group g = item mod groups: blocks = sweep / groups, twice over
         * with different random surroundings */
        const int nb = 2 * k_sweep[k].sweep / k_sweep[k].groups;
        uint8_t *src = malloc((size_t)nb * (size_t)ti->block_bytes);
        fill_random(src, (size_t)nb * (size_t)ti->block_bytes);
        for (int bk = 0; bk < nb; bk++) {
            uint8_t *b = src + (size_t)bk * (size_t)ti->block_bytes;
            if (t != TD_TYPE_NVFP4 && t != TD_TYPE_IQ1_M) put_u16(b, finite_f16());
            for (int g = 0; g < k_sweep[k].groups; g++)
                craft_group(t, b, g, (bk * k_sweep[k].groups + g) % k_sweep[k].sweep);
        }
        check_bitwise(t, src, (int64_t)nb * ti->block_size, "crafted sweep");
        cr_log_info("%-8s %d crafted blocks agree bitwise", ti->name, nb);
        free(src);
    }
#endif
}
