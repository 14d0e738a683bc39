/* tapdiff: tests of the ggml type table and the row decoders.
 *
 * Every block here is assembled byte by byte in the test (f16 scales as chosen
 * bit patterns whose values are known by hand, codes including the extremes,
 * negative scales, packed 6-bit scales that use their high bits), and the
 * expected values come from the formulas of quants.md re-written here per
 * element (n -> h, j, k, l), never from model/types.c. A few values per type
 * are also worked out by hand as literals, so a mistake shared by the test's
 * formula and the decoder would still show. Values are exact: compared with ==. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "types.h"

/* ------------------------------------------------------------------------ */
/* Test helpers                                                               */

static uint64_t rng_state;
static uint64_t rng(void) { /* splitmix64 */
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static uint8_t rbyte(void) { return (uint8_t)rng(); }
static void rfill(uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++) p[i] = rbyte();
}

/* little-endian stores, written out so they do not depend on the host */
static void put16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static int lo4(uint8_t b) { return b & 15; }
static int hi4(uint8_t b) { return b >> 4; }
static int bitof(uint32_t v, int k) { return (int)((v >> k) & 1); }

/* f16 scales used below, with their values worked out by hand */
#define H_1_5 0x3E00   /* e=15, m=512: 1.5 */
#define H_M2 0xC000    /* sign, e=16: -2 */
#define H_THIRD 0x3555 /* e=13, m=341: (1024+341)/4096 = 1365/4096 */
#define H_MQ 0xB400    /* sign, e=13: -0.25 */
#define H_M1 0xBC00    /* -1 */
#define H_TINY 0x0001  /* smallest subnormal: 2^-24 */
#define H_MAX 0x7BFF   /* largest finite: 65504 */
static const double V_THIRD = 1365.0 / 4096.0;

static int same(double a, double b) { return (isnan(a) && isnan(b)) || a == b; }

/* Decode a row both ways; checks the f32 row is the f64 row rounded once. */
static void decode_both(int type, const void *row, int64_t n, double *got) {
    td_err err = {{0}};
    float *gotf = malloc((size_t)n * sizeof *gotf);
    cr_assert_eq(td_decode_row_f64(type, row, got, n, &err), TD_OK, "%s: %s", td_type_name(type), err.msg);
    cr_assert_eq(td_decode_row_f32(type, row, gotf, n, &err), TD_OK, "%s: %s", td_type_name(type), err.msg);
    for (int64_t i = 0; i < n; i++)
        cr_assert(same(gotf[i], (float)got[i]), "%s f32 y[%lld] = %.9g, (float) of f64 = %.9g", td_type_name(type),
                  (long long)i, (double)gotf[i], (double)(float)got[i]);
    free(gotf);
}

static void expect_row(int type, const void *row, int64_t n, const double *want) {
    double *got = malloc((size_t)n * sizeof *got);
    decode_both(type, row, n, got);
    for (int64_t i = 0; i < n; i++)
        cr_assert(same(got[i], want[i]), "%s y[%lld]: got %.17g, expected %.17g", td_type_name(type), (long long)i,
                  got[i], want[i]);
    free(got);
}

/* a single decoded value, for the hand-worked literals */
static double decoded_at(int type, const void *row, int64_t n, int64_t i) {
    double *got = malloc((size_t)n * sizeof *got);
    decode_both(type, row, n, got);
    double v = got[i];
    free(got);
    return v;
}

#define EXPECT_AT(type, row, n, i, val)                                                                         \
    do {                                                                                                        \
        double v_ = decoded_at((type), (row), (n), (i));                                                        \
        cr_assert(v_ == (double)(val), "%s y[%d]: got %.17g, hand-worked %.17g (%s)", td_type_name(type), (i), \
                  v_, (double)(val), #val);                                                                     \
    } while (0)

/* ------------------------------------------------------------------------ */
/* Type table                                                                 */

Test(types, table_matches_gguf_section5) {
    static const struct {
        int id;
        const char *name;
        int64_t B, Z;
    } want[] = {
        {0, "F32", 1, 4},        {1, "F16", 1, 2},        {2, "Q4_0", 32, 18},     {3, "Q4_1", 32, 20},
        {6, "Q5_0", 32, 22},     {7, "Q5_1", 32, 24},     {8, "Q8_0", 32, 34},     {9, "Q8_1", 32, 36},
        {10, "Q2_K", 256, 84},   {11, "Q3_K", 256, 110},  {12, "Q4_K", 256, 144},  {13, "Q5_K", 256, 176},
        {14, "Q6_K", 256, 210},  {15, "Q8_K", 256, 292},  {16, "IQ2_XXS", 256, 66}, {17, "IQ2_XS", 256, 74},
        {18, "IQ3_XXS", 256, 98}, {19, "IQ1_S", 256, 50}, {20, "IQ4_NL", 32, 18},  {21, "IQ3_S", 256, 110},
        {22, "IQ2_S", 256, 82},  {23, "IQ4_XS", 256, 136}, {24, "I8", 1, 1},       {25, "I16", 1, 2},
        {26, "I32", 1, 4},       {27, "I64", 1, 8},       {28, "F64", 1, 8},       {29, "IQ1_M", 256, 56},
        {30, "BF16", 1, 2},      {34, "TQ1_0", 256, 54},  {35, "TQ2_0", 256, 66},  {39, "MXFP4", 32, 17},
        {40, "NVFP4", 64, 36},   {41, "Q1_0", 128, 18},   {42, "Q2_0", 64, 18},
    };
    int seen[TD_TYPE_COUNT] = {0};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const td_type_info *t = td_type_get(want[i].id);
        cr_assert_not_null(t, "id %d (%s) must be valid", want[i].id, want[i].name);
        cr_assert_str_eq(t->name, want[i].name);
        cr_assert_str_eq(td_type_name(want[i].id), want[i].name);
        cr_assert_eq(t->block_size, want[i].B, "%s B", want[i].name);
        cr_assert_eq(t->block_bytes, want[i].Z, "%s Z", want[i].name);
        seen[want[i].id] = 1;
    }
    int removed = 0;
    for (int id = 0; id < TD_TYPE_COUNT; id++)
        if (!seen[id]) {
            cr_assert_null(td_type_get(id), "removed id %d must be invalid", id);
            removed++;
        }
    cr_assert_eq(removed, 8, "ids 4, 5, 31-33, 36-38 are the removed ones");
    cr_assert_null(td_type_get(4));
    cr_assert_null(td_type_get(33));
    cr_assert_null(td_type_get(38));
    cr_assert_null(td_type_get(-1));
    cr_assert_null(td_type_get(TD_TYPE_COUNT));
    cr_assert_null(td_type_get(1000));
    cr_assert_str_eq(td_type_name(4), "type#4");
    cr_assert_str_eq(td_type_name(-7), "type#-7");
}

Test(types, can_decode_flags) {
    static const int must[] = {TD_TYPE_F32,  TD_TYPE_F16,  TD_TYPE_BF16, TD_TYPE_F64,  TD_TYPE_Q4_0,
                               TD_TYPE_Q4_1, TD_TYPE_Q5_0, TD_TYPE_Q5_1, TD_TYPE_Q8_0, TD_TYPE_Q2_K,
                               TD_TYPE_Q3_K, TD_TYPE_Q4_K, TD_TYPE_Q5_K, TD_TYPE_Q6_K,
                               TD_TYPE_IQ2_XXS, TD_TYPE_IQ2_XS, TD_TYPE_IQ2_S, TD_TYPE_IQ3_XXS, TD_TYPE_IQ3_S,
                               TD_TYPE_IQ1_S, TD_TYPE_IQ1_M, TD_TYPE_NVFP4};
    for (size_t i = 0; i < sizeof must / sizeof must[0]; i++)
        cr_assert_eq(td_type_get(must[i])->can_decode, 1, "%s must decode", td_type_name(must[i]));
    static const int never[] = {TD_TYPE_I8, TD_TYPE_I16, TD_TYPE_I32, TD_TYPE_I64, TD_TYPE_Q8_1};
    for (size_t i = 0; i < sizeof never / sizeof never[0]; i++)
        cr_assert_eq(td_type_get(never[i])->can_decode, 0, "%s is not a weight type", td_type_name(never[i]));
}

Test(types, row_bytes) {
    cr_assert_eq(td_type_row_bytes(TD_TYPE_F32, 7), 28);
    cr_assert_eq(td_type_row_bytes(TD_TYPE_BF16, 3), 6);
    cr_assert_eq(td_type_row_bytes(TD_TYPE_Q4_0, 64), 36);
    cr_assert_eq(td_type_row_bytes(TD_TYPE_Q4_K, 512), 288);
    cr_assert_eq(td_type_row_bytes(TD_TYPE_Q6_K, 4096), 16 * 210);
    cr_assert_eq(td_type_row_bytes(TD_TYPE_MXFP4, 96), 51);
    cr_assert_eq(td_type_row_bytes(TD_TYPE_Q1_0, 256), 36);
    cr_assert_eq(td_type_row_bytes(TD_TYPE_Q4_K, 0), 0);
    cr_assert_eq(td_type_row_bytes(TD_TYPE_Q4_K, 100), 0, "not a multiple of 256");
    cr_assert_eq(td_type_row_bytes(TD_TYPE_Q4_0, 33), 0);
    cr_assert_eq(td_type_row_bytes(TD_TYPE_F32, -4), 0);
    cr_assert_eq(td_type_row_bytes(4, 32), 0, "removed id");
    cr_assert_eq(td_type_row_bytes(99, 32), 0);
}

/* ------------------------------------------------------------------------ */
/* Scalar conversions                                                         */

Test(types, f16_edge_values) {
    cr_assert_eq(td_f16_to_f64(0x0001), ldexp(1, -24), "smallest subnormal");
    cr_assert_eq(td_f16_to_f64(0x03FF), 1023 * ldexp(1, -24), "largest subnormal");
    cr_assert_eq(td_f16_to_f64(0x0400), ldexp(1, -14), "smallest normal");
    cr_assert_eq(td_f16_to_f64(0x7BFF), 65504.0, "max");
    cr_assert_eq(td_f16_to_f64(0xFBFF), -65504.0);
    cr_assert_eq(td_f16_to_f64(0x3C00), 1.0);
    cr_assert_eq(td_f16_to_f64(0x3C01), 1.0 + ldexp(1, -10));
    cr_assert_eq(td_f16_to_f64(H_THIRD), V_THIRD);
    cr_assert_eq(td_f16_to_f64(0x8001), -ldexp(1, -24));
    double nz = td_f16_to_f64(0x8000);
    cr_assert(nz == 0 && signbit(nz), "-0 keeps its sign");
    cr_assert(td_f16_to_f64(0x0000) == 0 && !signbit(td_f16_to_f64(0x0000)));
    cr_assert(isinf(td_f16_to_f64(0x7C00)) && td_f16_to_f64(0x7C00) > 0);
    cr_assert(isinf(td_f16_to_f64(0xFC00)) && td_f16_to_f64(0xFC00) < 0);
    cr_assert(isnan(td_f16_to_f64(0x7E00)));
    cr_assert(isnan(td_f16_to_f64(0x7C01)), "smallest-payload NaN is not inf");
    cr_assert(isnan(td_f16_to_f32(0xFFFF)));
    cr_assert_eq(td_f16_to_f32(0x0001), 0x1p-24f);
    cr_assert_eq(td_f16_to_f32(0x7BFF), 65504.0f);
}

/* the value of binary16 bits, computed from the definition (quants.md §1) */
static double f16_by_definition(uint16_t h) {
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
    return s ? -v : v;
}

Test(types, f16_all_values_and_round_trip) {
    for (uint32_t h = 0; h < 65536; h++) {
        double want = f16_by_definition((uint16_t)h);
        double got = td_f16_to_f64((uint16_t)h);
        cr_assert(same(got, want) && signbit(got) == signbit(want), "f16 0x%04x: got %.17g want %.17g", h, got, want);
        cr_assert(same(td_f16_to_f32((uint16_t)h), (float)want));
        uint16_t back = td_f32_to_f16(td_f16_to_f32((uint16_t)h));
        if (isnan(want))
            cr_assert(isnan(td_f16_to_f64(back)), "NaN 0x%04x stays NaN (0x%04x)", h, back);
        else
            cr_assert_eq(back, h, "f16 0x%04x -> f32 -> 0x%04x", h, back);
    }
}

Test(types, f32_to_f16_rounding) {
    /* hand-worked ties and limits */
    cr_assert_eq(td_f32_to_f16(1.0f + 0x1p-11f), 0x3C00, "tie between 1 and 1+2^-10 goes to even (1)");
    cr_assert_eq(td_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3C02, "tie between 0x3C01 and 0x3C02 goes to even");
    cr_assert_eq(td_f32_to_f16(1.0f + 0x1p-11f + 0x1p-20f), 0x3C01, "just above the tie rounds up");
    cr_assert_eq(td_f32_to_f16(65504.0f), 0x7BFF);
    cr_assert_eq(td_f32_to_f16(65519.996f), 0x7BFF, "below the halfway point to 2^16");
    cr_assert_eq(td_f32_to_f16(65520.0f), 0x7C00, "halfway to 2^16 rounds to even = inf");
    cr_assert_eq(td_f32_to_f16(-1e10f), 0xFC00);
    cr_assert_eq(td_f32_to_f16(INFINITY), 0x7C00);
    cr_assert_eq(td_f32_to_f16(0x1p-25f), 0x0000, "half the smallest subnormal ties to 0");
    cr_assert_eq(td_f32_to_f16(0x1p-25f * 1.0000001f), 0x0001);
    cr_assert_eq(td_f32_to_f16(3 * 0x1p-25f), 0x0002, "1.5 subnormal units ties to 2");
    cr_assert_eq(td_f32_to_f16(0x1p-30f), 0x0000);
    cr_assert_eq(td_f32_to_f16(-0x1p-30f), 0x8000, "underflow keeps the sign");
    cr_assert_eq(td_f32_to_f16(0x1p-14f - 0x1p-26f), 0x0400, "rounds up into the smallest normal");
    cr_assert_eq(td_f32_to_f16(1e-45f), 0x0000, "f32 subnormal");
    cr_assert_eq(td_f32_to_f16(-0.0f), 0x8000);
    uint16_t n = td_f32_to_f16(NAN);
    cr_assert((n & 0x7C00) == 0x7C00 && (n & 0x3FF), "NaN stays NaN: 0x%04x", n);
}

#ifdef __FLT16_MAX__
/* The compiler's _Float16 conversion (IEEE round-to-nearest-even) is an
 * independent oracle: every midpoint between neighbouring f16 values, one
 * f32 ulp either side, and random bit patterns. */
static void check_vs_float16(float f) {
    _Float16 r = (_Float16)f;
    uint16_t want;
    memcpy(&want, &r, 2);
    uint16_t got = td_f32_to_f16(f);
    if (isnan(f))
        cr_assert((got & 0x7C00) == 0x7C00 && (got & 0x3FF));
    else
        cr_assert_eq(got, want, "f32 %a: got 0x%04x, _Float16 gives 0x%04x", (double)f, got, want);
}

Test(types, f32_to_f16_vs_compiler) {
    for (uint32_t h = 0; h < 0x7C00; h++) {
        double a = f16_by_definition((uint16_t)h);
        double b = h == 0x7BFF ? 65536.0 : f16_by_definition((uint16_t)(h + 1));
        float mid = (float)((a + b) / 2); /* exact: a midpoint needs 12 significant bits */
        for (int s = 0; s < 2; s++) {
            float m = s ? -mid : mid;
            check_vs_float16(m);
            check_vs_float16(nextafterf(m, INFINITY));
            check_vs_float16(nextafterf(m, -INFINITY));
        }
    }
    rng_state = 42;
    for (int i = 0; i < 200000; i++) {
        uint32_t u = (uint32_t)rng();
        float f;
        memcpy(&f, &u, 4);
        check_vs_float16(f);
    }
}
#endif

Test(types, bf16) {
    cr_assert_eq(td_bf16_to_f32(0x3F80), 1.0f);
    cr_assert_eq(td_bf16_to_f32(0xC049), -3.140625f, "0xC0490000");
    cr_assert_eq(td_bf16_to_f32(0x0001), 0x1p-133f, "subnormal 0x00010000 = 2^16 * 2^-149");
    cr_assert(isinf(td_bf16_to_f32(0xFF80)) && td_bf16_to_f32(0xFF80) < 0);
    cr_assert(isnan(td_bf16_to_f32(0x7FC0)));
    cr_assert(signbit(td_bf16_to_f32(0x8000)));
    cr_assert_eq(td_f32_to_bf16(1.0f), 0x3F80);
    cr_assert_eq(td_f32_to_bf16(1.0f + 0x1p-8f), 0x3F80, "tie goes to even");
    cr_assert_eq(td_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3F82, "tie goes to even (up)");
    cr_assert_eq(td_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3F81);
    cr_assert_eq(td_f32_to_bf16(0x1.fffffep127f), 0x7F80, "FLT_MAX rounds to inf");
    cr_assert_eq(td_f32_to_bf16(-0.0f), 0x8000);
    uint32_t snan_bits = 0x7F800001u; /* a NaN whose payload sits only in the dropped half */
    float snan;
    memcpy(&snan, &snan_bits, 4);
    cr_assert(isnan(td_bf16_to_f32(td_f32_to_bf16(snan))), "NaN must not become inf");
    cr_assert(isnan(td_bf16_to_f32(td_f32_to_bf16(NAN))));
}

/* ------------------------------------------------------------------------ */
/* Plain float rows                                                           */

Test(types, plain_rows) {
    const uint16_t hb[8] = {0x0001, 0x7BFF, 0x8000, 0x7C00, 0xFC00, 0x7E00, H_THIRD, H_M2};
    const double hv[8] = {ldexp(1, -24), 65504, -0.0, INFINITY, -INFINITY, NAN, V_THIRD, -2};
    uint8_t row[16];
    for (int i = 0; i < 8; i++) put16(row + 2 * i, hb[i]);
    expect_row(TD_TYPE_F16, row, 8, hv);

    const uint16_t bb[6] = {0x3F80, 0xC049, 0x0001, 0x7F80, 0x7FC0, 0x8000};
    const double bv[6] = {1, -3.140625, ldexp(1, -133), INFINITY, NAN, -0.0};
    for (int i = 0; i < 6; i++) put16(row + 2 * i, bb[i]);
    expect_row(TD_TYPE_BF16, row, 6, bv);

    const float fv[4] = {1.0f / 3, -0x1p-149f, 3e38f, -0.0f};
    uint8_t frow[16];
    memcpy(frow, fv, 16);
    const double fw[4] = {(double)(1.0f / 3), -0x1p-149, (double)3e38f, -0.0};
    expect_row(TD_TYPE_F32, frow, 4, fw);

    const double dv[3] = {0.1, -1e300, 1 + 0x1p-40}; /* not representable in f32: the f32 row rounds them */
    uint8_t drow[24];
    memcpy(drow, dv, 24);
    expect_row(TD_TYPE_F64, drow, 3, dv);
}

/* ------------------------------------------------------------------------ */
/* Legacy 32-value blocks                                                     */

Test(types, q4_0) {
    rng_state = 1;
    uint8_t row[2 * 18];
    double want[64];
    const uint16_t db[2] = {H_1_5, H_M2};
    const double dv[2] = {1.5, -2.0};
    for (int b = 0; b < 2; b++) {
        uint8_t *blk = row + 18 * b;
        put16(blk, db[b]);
        rfill(blk + 2, 16);
        blk[2] = 0xF0; /* codes 0 (y[0]) and 15 (y[16]) */
        blk[3] = 0x0F;
        blk[4] = 0xFF;
        blk[5] = 0x00;
        for (int j = 0; j < 16; j++) {
            want[32 * b + j] = dv[b] * (lo4(blk[2 + j]) - 8);
            want[32 * b + j + 16] = dv[b] * (hi4(blk[2 + j]) - 8);
        }
    }
    expect_row(TD_TYPE_Q4_0, row, 64, want);
    EXPECT_AT(TD_TYPE_Q4_0, row, 64, 0, 1.5 * -8);
    EXPECT_AT(TD_TYPE_Q4_0, row, 64, 16, 1.5 * 7);
    EXPECT_AT(TD_TYPE_Q4_0, row, 64, 33, -2.0 * 7);
    EXPECT_AT(TD_TYPE_Q4_0, row, 64, 49, 16.0);
}

Test(types, q4_1) {
    rng_state = 2;
    uint8_t row[2 * 20];
    double want[64];
    const uint16_t db[2] = {H_THIRD, H_M2}, mb[2] = {H_M1, H_TINY};
    const double dv[2] = {V_THIRD, -2.0}, mv[2] = {-1.0, ldexp(1, -24)};
    for (int b = 0; b < 2; b++) {
        uint8_t *blk = row + 20 * b;
        put16(blk, db[b]);
        put16(blk + 2, mb[b]);
        rfill(blk + 4, 16);
        blk[4] = 0xF0;
        blk[5] = 0x0F;
        for (int j = 0; j < 16; j++) {
            want[32 * b + j] = dv[b] * lo4(blk[4 + j]) + mv[b];
            want[32 * b + j + 16] = dv[b] * hi4(blk[4 + j]) + mv[b];
        }
    }
    expect_row(TD_TYPE_Q4_1, row, 64, want);
    EXPECT_AT(TD_TYPE_Q4_1, row, 64, 0, -1.0);
    EXPECT_AT(TD_TYPE_Q4_1, row, 64, 16, 15 * 1365.0 / 4096 - 1);
    EXPECT_AT(TD_TYPE_Q4_1, row, 64, 33, -30 + 0x1p-24); /* exact in f64; the f32 row rounds it */
}

Test(types, q5_0) {
    rng_state = 3;
    uint8_t row[2 * 22];
    double want[64];
    const uint16_t db[2] = {H_MQ, H_MAX};
    const double dv[2] = {-0.25, 65504};
    for (int b = 0; b < 2; b++) {
        uint8_t *blk = row + 22 * b;
        put16(blk, db[b]);
        uint32_t r = (uint32_t)rng();
        /* block 0: bits 0 and 31 set; block 1: bit 0 clear, bit 16 set */
        put32(blk + 2, b == 0 ? r | 0x80000001u : (r | 0x00010000u) & ~1u);
        uint32_t h = blk[2] | blk[3] << 8 | (uint32_t)blk[4] << 16 | (uint32_t)blk[5] << 24;
        rfill(blk + 6, 16);
        blk[6] = 0xFF;
        blk[6 + 15] = 0x0F;
        for (int j = 0; j < 16; j++) {
            want[32 * b + j] = dv[b] * ((lo4(blk[6 + j]) + 16 * bitof(h, j)) - 16);
            want[32 * b + j + 16] = dv[b] * ((hi4(blk[6 + j]) + 16 * bitof(h, j + 16)) - 16);
        }
    }
    expect_row(TD_TYPE_Q5_0, row, 64, want);
    EXPECT_AT(TD_TYPE_Q5_0, row, 64, 0, -0.25 * 15);  /* code 31 */
    EXPECT_AT(TD_TYPE_Q5_0, row, 64, 31, 0.0);         /* hi(0x0F) = 0, bit 31 set: 0 + 16 - 16 */
    EXPECT_AT(TD_TYPE_Q5_0, row, 64, 48, 65504.0 * 15); /* block 1, j=16: hi(0xFF)=15, qh bit 16 set: 31-16 */
    EXPECT_AT(TD_TYPE_Q5_0, row, 64, 32, 65504.0 * -1); /* block 1, j=0: lo(0xFF)=15, bit 0 clear: 15-16 */
}

Test(types, q5_1) {
    rng_state = 4;
    uint8_t row[2 * 24];
    double want[64];
    const uint16_t db[2] = {H_1_5, H_MQ}, mb[2] = {H_M2, H_THIRD};
    const double dv[2] = {1.5, -0.25}, mv[2] = {-2, V_THIRD};
    for (int b = 0; b < 2; b++) {
        uint8_t *blk = row + 24 * b;
        put16(blk, db[b]);
        put16(blk + 2, mb[b]);
        rfill(blk + 4, 4);
        blk[4] |= 0x01; /* bit 0 set */
        blk[7] &= 0x7F; /* bit 31 clear */
        uint32_t h = blk[4] | blk[5] << 8 | (uint32_t)blk[6] << 16 | (uint32_t)blk[7] << 24;
        rfill(blk + 8, 16);
        blk[8] = 0x0F;
        blk[8 + 15] = 0xF0;
        for (int j = 0; j < 16; j++) {
            want[32 * b + j] = dv[b] * (lo4(blk[8 + j]) + 16 * bitof(h, j)) + mv[b];
            want[32 * b + j + 16] = dv[b] * (hi4(blk[8 + j]) + 16 * bitof(h, j + 16)) + mv[b];
        }
    }
    expect_row(TD_TYPE_Q5_1, row, 64, want);
    EXPECT_AT(TD_TYPE_Q5_1, row, 64, 0, 1.5 * 31 - 2); /* code 15 + 16 */
    EXPECT_AT(TD_TYPE_Q5_1, row, 64, 31, 1.5 * 15 - 2); /* hi(0xF0), bit 31 clear */
    EXPECT_AT(TD_TYPE_Q5_1, row, 64, 32, -0.25 * 31 + 1365.0 / 4096);
}

Test(types, q8_0) {
    rng_state = 5;
    uint8_t row[2 * 34];
    double want[64];
    const uint16_t db[2] = {H_M2, H_TINY};
    const double dv[2] = {-2.0, ldexp(1, -24)};
    for (int b = 0; b < 2; b++) {
        uint8_t *blk = row + 34 * b;
        put16(blk, db[b]);
        rfill(blk + 2, 32);
        blk[2] = 0x80; /* -128 */
        blk[3] = 0x7F; /* 127 */
        blk[4] = 0xFF; /* -1 */
        for (int j = 0; j < 32; j++) want[32 * b + j] = dv[b] * (int8_t)blk[2 + j];
    }
    expect_row(TD_TYPE_Q8_0, row, 64, want);
    EXPECT_AT(TD_TYPE_Q8_0, row, 64, 0, 256.0);
    EXPECT_AT(TD_TYPE_Q8_0, row, 64, 1, -254.0);
    EXPECT_AT(TD_TYPE_Q8_0, row, 64, 33, 127 * 0x1p-24);
}

Test(types, q1_0_q2_0) {
    rng_state = 6;
    uint8_t row[2 * 18];
    double want[256];
    const uint16_t db[2] = {H_MQ, H_THIRD};
    const double dv[2] = {-0.25, V_THIRD};
    for (int b = 0; b < 2; b++) {
        uint8_t *blk = row + 18 * b;
        put16(blk, db[b]);
        rfill(blk + 2, 16);
        blk[2] = 0x01;
        for (int j = 0; j < 128; j++) want[128 * b + j] = bitof(blk[2 + j / 8], j % 8) ? dv[b] : -dv[b];
    }
    expect_row(TD_TYPE_Q1_0, row, 256, want);
    EXPECT_AT(TD_TYPE_Q1_0, row, 256, 0, -0.25);
    EXPECT_AT(TD_TYPE_Q1_0, row, 256, 1, 0.25);

    for (int b = 0; b < 2; b++) {
        uint8_t *blk = row + 18 * b;
        blk[2] = 0xE4; /* codes 0,1,2,3 -> -1,0,1,2 */
        for (int j = 0; j < 64; j++) want[64 * b + j] = dv[b] * (((blk[2 + j / 4] >> (2 * (j % 4))) & 3) - 1);
    }
    expect_row(TD_TYPE_Q2_0, row, 128, want);
    EXPECT_AT(TD_TYPE_Q2_0, row, 128, 0, 0.25);
    EXPECT_AT(TD_TYPE_Q2_0, row, 128, 3, -0.5);
}

static const int KV_IQ4NL[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

Test(types, iq4_nl_mxfp4) {
    rng_state = 7;
    uint8_t row[2 * 18];
    double want[64];
    const uint16_t db[2] = {H_M2, H_1_5};
    const double dv[2] = {-2.0, 1.5};
    for (int b = 0; b < 2; b++) {
        uint8_t *blk = row + 18 * b;
        put16(blk, db[b]);
        rfill(blk + 2, 16);
        blk[2] = 0xF0;
        for (int j = 0; j < 16; j++) {
            want[32 * b + j] = dv[b] * KV_IQ4NL[lo4(blk[2 + j])];
            want[32 * b + j + 16] = dv[b] * KV_IQ4NL[hi4(blk[2 + j])];
        }
    }
    expect_row(TD_TYPE_IQ4_NL, row, 64, want);
    EXPECT_AT(TD_TYPE_IQ4_NL, row, 64, 0, 254.0);
    EXPECT_AT(TD_TYPE_IQ4_NL, row, 64, 16, -226.0);

    /* MXFP4: y = E2M1(code) * 2^(e-127), E2M1 = {0,.5,1,1.5,2,3,4,6} with bit 3 the sign */
    static const double e2m1[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
    const int es[4] = {0, 129, 127, 255};
    uint8_t mrow[4 * 17];
    double mwant[128];
    for (int b = 0; b < 4; b++) {
        uint8_t *blk = mrow + 17 * b;
        blk[0] = (uint8_t)es[b];
        rfill(blk + 1, 16);
        blk[1] = 0xF7;
        for (int j = 0; j < 32; j++) {
            int c = j < 16 ? lo4(blk[1 + j]) : hi4(blk[1 + j - 16]);
            double v = e2m1[c & 7] * ldexp(1, es[b] - 127);
            mwant[32 * b + j] = (c & 8) ? -v : v;
        }
    }
    expect_row(TD_TYPE_MXFP4, mrow, 128, mwant);
    EXPECT_AT(TD_TYPE_MXFP4, mrow, 128, 32, 24.0);  /* e=129, code 7: 6 * 4 */
    EXPECT_AT(TD_TYPE_MXFP4, mrow, 128, 48, -24.0); /* code 15 */
    EXPECT_AT(TD_TYPE_MXFP4, mrow, 128, 0, 6 * 0x1p-127);
}

/* ------------------------------------------------------------------------ */
/* K-quants                                                                   */

/* Q2_K by quants.md §4: n = 128h + 32j + 16k + l */
static void ref_q2_k(const uint8_t *blk, double d, double dmin, double *y) {
    for (int n = 0; n < 256; n++) {
        int h = n / 128, j = (n % 128) / 32, k = (n % 32) / 16, l = n % 16;
        int q = (blk[16 + 32 * h + 16 * k + l] >> (2 * j)) & 3;
        uint8_t sc = blk[8 * h + 2 * j + k];
        y[n] = d * lo4(sc) * q - dmin * hi4(sc);
    }
}

Test(types, q2_k) {
    rng_state = 8;
    uint8_t row[2 * 84];
    double want[512];
    rfill(row, sizeof row);
    uint8_t *b0 = row, *b1 = row + 84;
    put16(b0 + 80, H_1_5);
    put16(b0 + 82, H_MQ); /* negative dmin */
    put16(b1 + 80, H_M2); /* negative d */
    put16(b1 + 82, H_THIRD);
    b0[16 + 0] = 0xE4; /* codes 0,1,2,3 at n = 0, 32, 64, 96 */
    b0[0] = 0x3F;      /* sub-block 0: scale 15, min 3 */
    b0[2] = 0xFF;      /* sub-block 2 */
    b0[6] = 0xA7;      /* sub-block 6: scale 7, min 10 */
    b0[16 + 53] = 0x03;
    b0[9] = 0x1F;
    b1[5] = 0x00; /* block 1, sub-block 5: zero scale and min -> zeros */
    ref_q2_k(b0, 1.5, -0.25, want);
    ref_q2_k(b1, -2.0, V_THIRD, want + 256);
    expect_row(TD_TYPE_Q2_K, row, 512, want);
    EXPECT_AT(TD_TYPE_Q2_K, row, 512, 0, 0.75);           /* 1.5*15*0 + 0.25*3 */
    EXPECT_AT(TD_TYPE_Q2_K, row, 512, 32, 26.25);         /* 1.5*15*1 + 0.25*15 */
    EXPECT_AT(TD_TYPE_Q2_K, row, 512, 96, 34.0);          /* 1.5*7*3 + 0.25*10 */
    EXPECT_AT(TD_TYPE_Q2_K, row, 512, 149, 67.75);        /* h1 j0 k1 l5: 1.5*15*3 + 0.25*1 */
}

/* Q3_K: S(i) given directly (the test packs it), codes by the spec's n -> h,j,k,l */
static void ref_q3_k(const uint8_t *blk, double d, const int S[16], double *y) {
    for (int n = 0; n < 256; n++) {
        int h = n / 128, j = (n % 128) / 32, k = (n % 32) / 16, l = n % 16;
        int q2 = (blk[32 + 32 * h + 16 * k + l] >> (2 * j)) & 3;
        int hb = bitof(blk[16 * k + l], 4 * h + j);
        y[n] = d * S[8 * h + 2 * j + k] * (q2 - (hb ? 0 : 4));
    }
}

/* the 12 scale bytes of Q3_K from 16 signed scales, by the layout in quants.md */
static void pack_q3_scales(const int S[16], uint8_t *s) {
    memset(s, 0, 12);
    for (int i = 0; i < 16; i++) {
        int u = S[i] + 32;
        if (i < 8)
            s[i] |= (uint8_t)(u & 15);
        else
            s[i - 8] |= (uint8_t)((u & 15) << 4);
        s[8 + i % 4] |= (uint8_t)(((u >> 4) & 3) << (2 * (i / 4)));
    }
}

Test(types, q3_k) {
    rng_state = 9;
    uint8_t row[2 * 110];
    double want[512];
    rfill(row, sizeof row);
    uint8_t *b0 = row, *b1 = row + 110;
    /* block 0: scale bytes written literally; S decoded by hand:
     * low4 = lo(F0,0F,5A,A5,11,EE,73,3C) then hi(...) ; high2 from E4,1B,FF,00 */
    static const uint8_t sb[12] = {0xF0, 0x0F, 0x5A, 0xA5, 0x11, 0xEE, 0x73, 0x3C, 0xE4, 0x1B, 0xFF, 0x00};
    static const int S0[16] = {-32, 31, 26, -27, -15, 14, 19, -20, 15, -16, 21, -22, 17, -18, 23, -29};
    memcpy(b0 + 96, sb, 12);
    put16(b0 + 108, H_M2);
    b0[32 + 0] = 0x1B; /* q2 = 3,2,1,0 for j = 0..3 */
    b0[0] = 0x05;      /* hmask bits j=0 and j=2 set (h = 0) */
    b0[32 + 16] = 0x00;
    b0[16] = 0x00;
    b0[32 + 32] = 0x02;
    /* block 1: the test's own packer, extremes and negative scales, positive d */
    static const int S1[16] = {31, -32, 0, -1, 1, 17, -17, 16, -16, 30, -30, 5, -5, 2, 15, -31};
    pack_q3_scales(S1, b1 + 96);
    put16(b1 + 108, H_THIRD);
    ref_q3_k(b0, -2.0, S0, want);
    ref_q3_k(b1, V_THIRD, S1, want + 256);
    expect_row(TD_TYPE_Q3_K, row, 512, want);
    EXPECT_AT(TD_TYPE_Q3_K, row, 512, 0, 192.0);   /* -2 * -32 * 3 */
    EXPECT_AT(TD_TYPE_Q3_K, row, 512, 32, 104.0);  /* -2 * 26 * (2-4) */
    EXPECT_AT(TD_TYPE_Q3_K, row, 512, 64, 30.0);   /* -2 * -15 * 1 */
    EXPECT_AT(TD_TYPE_Q3_K, row, 512, 96, 152.0);  /* -2 * 19 * (0-4) */
    EXPECT_AT(TD_TYPE_Q3_K, row, 512, 16, 248.0);  /* -2 * 31 * -4 */
    EXPECT_AT(TD_TYPE_Q3_K, row, 512, 128, 60.0);  /* h=1: -2 * 15 * (2-4) */
}

/* scale bytes with every high bit in use, and their 6-bit codes by hand:
 * sc[0..3] = FF,3F,81,40 & 63; mn[0..3] = E1,21,00,C0 & 63;
 * sc[4..7] = lo(5A,F0,0F,12) | (FF,3F,81,40 >> 6) << 4;
 * mn[4..7] = hi(5A,F0,0F,12) | (E1,21,00,C0 >> 6) << 4 */
static const uint8_t KSB[12] = {0xFF, 0x3F, 0x81, 0x40, 0xE1, 0x21, 0x00, 0xC0, 0x5A, 0xF0, 0x0F, 0x12};
static const int KSC[8] = {63, 63, 1, 0, 58, 0, 47, 18};
static const int KMN[8] = {33, 33, 0, 0, 53, 15, 0, 49};

/* Q4_K / Q5_K (qh = NULL for Q4_K) per element: n = 64c + 32u + l, sub-block 2c+u */
static void ref_q45_k(const uint8_t *qs, const uint8_t *qh, double d, double dmin, const int sc[8],
                      const int mn[8], double *y) {
    for (int n = 0; n < 256; n++) {
        int c = n / 64, u = (n % 64) / 32, l = n % 32;
        int q = u ? hi4(qs[32 * c + l]) : lo4(qs[32 * c + l]);
        if (qh) q += 16 * bitof(qh[l], 2 * c + u);
        y[n] = d * sc[2 * c + u] * q - dmin * mn[2 * c + u];
    }
}

/* the inverse layout, from the byte description in quants.md */
static void pack_k_scales(const int sc[8], const int mn[8], uint8_t *s) {
    for (int b = 0; b < 4; b++) {
        s[b] = (uint8_t)(sc[b] | ((sc[b + 4] >> 4) << 6));
        s[b + 4] = (uint8_t)(mn[b] | ((mn[b + 4] >> 4) << 6));
        s[b + 8] = (uint8_t)((sc[b + 4] & 15) | ((mn[b + 4] & 15) << 4));
    }
}

static const int KSC1[8] = {17, 47, 63, 0, 32, 16, 1, 62};
static const int KMN1[8] = {0, 63, 33, 48, 15, 31, 16, 1};

Test(types, q4_k) {
    rng_state = 10;
    uint8_t row[2 * 144];
    double want[512];
    rfill(row, sizeof row);
    uint8_t *b0 = row, *b1 = row + 144;
    put16(b0, H_THIRD);
    put16(b0 + 2, H_M1); /* negative dmin */
    memcpy(b0 + 4, KSB, 12);
    b0[16 + 0] = 0xF0;
    b0[16 + 64] = 0x3A;
    b0[16 + 96] = 0xFF;
    put16(b1, H_M2); /* negative d */
    put16(b1 + 2, H_1_5);
    pack_k_scales(KSC1, KMN1, b1 + 4);
    ref_q45_k(b0 + 16, NULL, V_THIRD, -1.0, KSC, KMN, want);
    ref_q45_k(b1 + 16, NULL, -2.0, 1.5, KSC1, KMN1, want + 256);
    expect_row(TD_TYPE_Q4_K, row, 512, want);
    EXPECT_AT(TD_TYPE_Q4_K, row, 512, 0, 33.0);                            /* 63*0 + 33 */
    EXPECT_AT(TD_TYPE_Q4_K, row, 512, 32, 1365.0 / 4096 * 63 * 15 + 33);  /* hi nibble, sub-block 1 */
    EXPECT_AT(TD_TYPE_Q4_K, row, 512, 128, 1365.0 / 4096 * 58 * 10 + 53); /* sc[4] = 58, mn[4] = 53 */
    EXPECT_AT(TD_TYPE_Q4_K, row, 512, 160, 15.0);                          /* sc[5] = 0, mn[5] = 15 */
    EXPECT_AT(TD_TYPE_Q4_K, row, 512, 192, 1365.0 / 4096 * 47 * 15);      /* sc[6] = 47, mn[6] = 0 */
    EXPECT_AT(TD_TYPE_Q4_K, row, 512, 224, 1365.0 / 4096 * 18 * 15 + 49); /* sc[7] = 18, mn[7] = 49 */
}

Test(types, q5_k) {
    rng_state = 11;
    uint8_t row[2 * 176];
    double want[512];
    rfill(row, sizeof row);
    uint8_t *b0 = row, *b1 = row + 176;
    put16(b0, H_THIRD);
    put16(b0 + 2, H_M1);
    memcpy(b0 + 4, KSB, 12);
    b0[16 + 0] = 0x05; /* qh[0]: sub-blocks 0 and 2 get the 5th bit */
    b0[48 + 0] = 0xF0;
    b0[48 + 32] = 0x0F;
    put16(b1, H_M2);
    put16(b1 + 2, H_MQ); /* both negative */
    pack_k_scales(KSC1, KMN1, b1 + 4);
    ref_q45_k(b0 + 48, b0 + 16, V_THIRD, -1.0, KSC, KMN, want);
    ref_q45_k(b1 + 48, b1 + 16, -2.0, -0.25, KSC1, KMN1, want + 256);
    expect_row(TD_TYPE_Q5_K, row, 512, want);
    EXPECT_AT(TD_TYPE_Q5_K, row, 512, 0, 1365.0 / 4096 * 63 * 16 + 33);  /* lo 0 + 16 */
    EXPECT_AT(TD_TYPE_Q5_K, row, 512, 32, 1365.0 / 4096 * 63 * 15 + 33); /* hi 15, bit 1 clear */
    EXPECT_AT(TD_TYPE_Q5_K, row, 512, 64, 1365.0 / 4096 * 1 * 31);       /* lo 15 + 16, sc[2] = 1 */
}

/* Q6_K per element: n = 128h + 32m + l, m picks (low/high nibble of ql[l] or
 * ql[l+32]) and bits 2m of qh[l]; the scale is that of sub-block n/16 */
static void ref_q6_k(const uint8_t *blk, double d, double *y) {
    for (int n = 0; n < 256; n++) {
        int h = n / 128, m = (n % 128) / 32, l = n % 32;
        uint8_t L = blk[64 * h + l + 32 * (m & 1)];
        int low = m >= 2 ? hi4(L) : lo4(L);
        int high = (blk[128 + 32 * h + l] >> (2 * m)) & 3;
        int sc = (int8_t)blk[192 + 8 * h + l / 16 + 2 * m];
        y[n] = d * sc * ((low | high << 4) - 32);
    }
}

Test(types, q6_k) {
    rng_state = 12;
    uint8_t row[2 * 210];
    double want[512];
    rfill(row, sizeof row);
    uint8_t *b0 = row, *b1 = row + 210;
    static const int8_t sc0[16] = {-128, 127, -1, 0, 1, -77, 64, -64, 100, -3, 5, 17, -17, 33, -33, 2};
    memcpy(b0 + 192, sc0, 16);
    put16(b0 + 208, H_1_5);
    b0[0] = 0x5F;
    b0[128] = 0x9C; /* high pairs 0,3,1,2 for m = 0..3 */
    b0[32] = 0x3F;
    b0[16] = 0x00;
    b0[128 + 16] = 0x00;
    b0[64] = 0x0A;
    b0[128 + 32] = 0x03;
    put16(b1 + 208, H_MQ); /* negative d, random scales */
    ref_q6_k(b0, 1.5, want);
    ref_q6_k(b1, -0.25, want + 256);
    expect_row(TD_TYPE_Q6_K, row, 512, want);
    EXPECT_AT(TD_TYPE_Q6_K, row, 512, 0, 3264.0);   /* 1.5 * -128 * (15-32) */
    EXPECT_AT(TD_TYPE_Q6_K, row, 512, 32, -46.5);   /* 1.5 * -1 * (63-32) */
    EXPECT_AT(TD_TYPE_Q6_K, row, 512, 64, -16.5);   /* 1.5 * 1 * (5+16-32) */
    EXPECT_AT(TD_TYPE_Q6_K, row, 512, 96, 288.0);   /* 1.5 * 64 * (3+32-32) */
    EXPECT_AT(TD_TYPE_Q6_K, row, 512, 16, -6096.0); /* 1.5 * 127 * -32 */
    EXPECT_AT(TD_TYPE_Q6_K, row, 512, 128, 3900.0); /* 1.5 * 100 * (10+48-32) */
}

Test(types, q8_k_iq4_xs) {
    rng_state = 13;
    uint8_t row[2 * 292];
    double want[512];
    rfill(row, sizeof row);
    const float dk[2] = {-0.1f, 3e-30f};
    for (int b = 0; b < 2; b++) {
        uint8_t *blk = row + 292 * b;
        memcpy(blk, &dk[b], 4);
        blk[4] = 0x80;
        blk[5] = 0x7F;
        for (int j = 0; j < 256; j++) want[256 * b + j] = (double)dk[b] * (int8_t)blk[4 + j];
    }
    expect_row(TD_TYPE_Q8_K, row, 512, want);
    EXPECT_AT(TD_TYPE_Q8_K, row, 512, 0, (double)-0.1f * -128);

    uint8_t xrow[2 * 136];
    rfill(xrow, sizeof xrow);
    const uint16_t db[2] = {H_1_5, H_M2};
    const double dv[2] = {1.5, -2.0};
    for (int b = 0; b < 2; b++) {
        uint8_t *blk = xrow + 136 * b;
        put16(blk, db[b]);
        if (b == 0) {
            put16(blk + 2, 0xC003); /* high bits: sub-block 0 -> 3, 1 -> 0, 7 -> 3 */
            blk[4] = 0x0F;          /* low bits: sub-block 0 -> 15, 1 -> 0 */
            blk[8] = 0xF0;
            blk[8 + 16] = 0x08;
        }
        unsigned sh = blk[2] | blk[3] << 8;
        for (int n = 0; n < 256; n++) {
            int s = n / 32, j = n % 32;
            int ls = ((blk[4 + s / 2] >> (4 * (s % 2))) & 15) | (((sh >> (2 * s)) & 3) << 4);
            uint8_t q = blk[8 + 16 * s + j % 16];
            want[256 * b + n] = dv[b] * (ls - 32) * KV_IQ4NL[j < 16 ? lo4(q) : hi4(q)];
        }
    }
    expect_row(TD_TYPE_IQ4_XS, xrow, 512, want);
    EXPECT_AT(TD_TYPE_IQ4_XS, xrow, 512, 0, 46.5 * -127); /* ls 63: 1.5 * 31 */
    EXPECT_AT(TD_TYPE_IQ4_XS, xrow, 512, 16, 46.5 * 113);
    EXPECT_AT(TD_TYPE_IQ4_XS, xrow, 512, 32, -48.0 * 1); /* ls 0: 1.5 * -32 */
    EXPECT_AT(TD_TYPE_IQ4_XS, xrow, 512, 48, -48.0 * -127);
}

Test(types, tq2_0_tq1_0) {
    rng_state = 14;
    uint8_t row[2 * 66];
    double want[512];
    rfill(row, sizeof row);
    const uint16_t db[2] = {H_MQ, H_THIRD};
    const double dv[2] = {-0.25, V_THIRD};
    for (int b = 0; b < 2; b++) {
        uint8_t *blk = row + 66 * b;
        put16(blk + 64, db[b]);
        for (int n = 0; n < 256; n++) {
            int c = n / 128, s = (n % 128) / 32, m = n % 32;
            want[256 * b + n] = dv[b] * (((blk[32 * c + m] >> (2 * s)) & 3) - 1);
        }
    }
    row[0] = 0xE4; /* codes 0,1,2,3 at n = 0,32,64,96 of block 0 (d = -0.25), worked by hand */
    want[0] = 0.25;
    want[32] = 0;
    want[64] = -0.25;
    want[96] = -0.5;
    expect_row(TD_TYPE_TQ2_0, row, 512, want);

    /* TQ1_0: choose trits, encode them with the spec's encoder
     * b = ceil(256 * sum t_n 3^(4-n) / 243), expect d * (t - 1) */
    uint8_t t1[54];
    int trits[256];
    for (int i = 0; i < 256; i++) trits[i] = (int)(rng() % 3);
    uint8_t bytes[52][5] = {{0}}; /* trit n of byte i */
    double tw[256];
    for (int n = 0; n < 5; n++)
        for (int m = 0; m < 32; m++) bytes[m][n] = (uint8_t)trits[32 * n + m];
    for (int n = 0; n < 5; n++)
        for (int m = 0; m < 16; m++) bytes[32 + m][n] = (uint8_t)trits[160 + 16 * n + m];
    for (int n = 0; n < 4; n++)
        for (int m = 0; m < 4; m++) bytes[48 + m][n] = (uint8_t)trits[240 + 4 * n + m];
    for (int i = 0; i < 52; i++) {
        int v = 0;
        for (int n = 0; n < 5; n++) v = 3 * v + bytes[i][n];
        t1[i] = (uint8_t)((256 * v + 242) / 243);
    }
    put16(t1 + 52, H_M2);
    for (int i = 0; i < 256; i++) tw[i] = -2.0 * (trits[i] - 1);
    expect_row(TD_TYPE_TQ1_0, t1, 256, tw);
    /* hand-worked: trits (2,1,0,2,1) -> 196 -> ceil(256*196/243) = 207 */
    t1[0] = 207;
    EXPECT_AT(TD_TYPE_TQ1_0, t1, 256, 0, -2.0);   /* t=2 */
    EXPECT_AT(TD_TYPE_TQ1_0, t1, 256, 32, 0.0);   /* t=1 */
    EXPECT_AT(TD_TYPE_TQ1_0, t1, 256, 64, 2.0);   /* t=0 */
    EXPECT_AT(TD_TYPE_TQ1_0, t1, 256, 96, -2.0);  /* t=2 */
    EXPECT_AT(TD_TYPE_TQ1_0, t1, 256, 128, 0.0);  /* t=1 */
}

/* every byte the TQ1_0 encoder can produce (243 trit tuples) decodes to its trits */
Test(types, tq1_0_every_encoded_byte) {
    uint8_t blk[54] = {0};
    put16(blk + 52, H_1_5);
    for (int v = 0; v < 243; v++) {
        blk[0] = (uint8_t)((256 * v + 242) / 243); /* ceil(256 v / 243) */
        double y[256];
        decode_both(TD_TYPE_TQ1_0, blk, 256, y);
        int rest = v;
        for (int n = 4; n >= 0; n--) { /* trit 0 is the most significant digit */
            int t = rest % 3;
            rest /= 3;
            cr_assert_eq(y[32 * n], 1.5 * (t - 1), "value %d (byte %d) trit %d: got %g", v, blk[0], n, y[32 * n]);
        }
    }
}

/* ------------------------------------------------------------------------ */
/* Row boundaries, alignment, errors                                          */

/* Every decodable type: a row placed flush against an inaccessible page on
 * either side decodes without touching it (a read past the n/B blocks would
 * fault), and at an odd address decodes to the same values (no aligned loads;
 * UBSan would flag them). */
Test(types, row_reads_only_its_blocks) {
    long pg = sysconf(_SC_PAGESIZE);
    uint8_t *map = mmap(NULL, (size_t)(3 * pg), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(map, MAP_FAILED);
    cr_assert_eq(mprotect(map, (size_t)pg, PROT_NONE), 0);
    cr_assert_eq(mprotect(map + 2 * pg, (size_t)pg, PROT_NONE), 0);
    uint8_t *page = map + pg;
    rng_state = 15;
    int tested = 0;
    for (int id = 0; id < TD_TYPE_COUNT; id++) {
        const td_type_info *t = td_type_get(id);
        if (!t || !t->can_decode) continue;
        int64_t n = 2 * t->block_size + (t->block_size == 1 ? 5 : 0); /* odd length for plain types */
        size_t bytes = td_type_row_bytes(id, n);
        uint8_t src[1024];
        cr_assert(bytes <= sizeof src);
        rfill(src, bytes);
        double *ref = malloc((size_t)n * sizeof *ref), *got = malloc((size_t)n * sizeof *got);
        td_err err;
        uint8_t *aligned = malloc(bytes);
        memcpy(aligned, src, bytes);
        cr_assert_eq(td_decode_row_f64(id, aligned, ref, n, &err), TD_OK);
        uint8_t *places[3] = {page + pg - bytes, page, page + 1};
        for (int p = 0; p < 3; p++) {
            memcpy(places[p], src, bytes);
            decode_both(id, places[p], n, got);
            for (int64_t i = 0; i < n; i++) cr_assert(same(got[i], ref[i]), "%s place %d y[%lld]", t->name, p, (long long)i);
        }
        free(aligned);
        free(ref);
        free(got);
        tested++;
    }
    cr_assert_geq(tested, 14);
    munmap(map, (size_t)(3 * pg));
}

/* f32 = (float) f64 on arbitrary bytes, NaN/inf scales included */
Test(types, f32_row_is_rounded_f64_row) {
    rng_state = 16;
    for (int id = 0; id < TD_TYPE_COUNT; id++) {
        const td_type_info *t = td_type_get(id);
        if (!t || !t->can_decode) continue;
        int64_t n = 8 * t->block_size;
        size_t bytes = td_type_row_bytes(id, n);
        uint8_t *src = malloc(bytes);
        for (int rep = 0; rep < 20; rep++) {
            rfill(src, bytes);
            double *got = malloc((size_t)n * sizeof *got);
            decode_both(id, src, n, got); /* asserts the relation */
            free(got);
        }
        free(src);
    }
}

Test(types, decode_errors) {
    td_err err;
    double y[256];
    float yf[256];
    uint8_t blk[512] = {0};
    const int nodec[] = {TD_TYPE_Q8_1, TD_TYPE_I16, TD_TYPE_I64, TD_TYPE_I32, TD_TYPE_I8};
    for (size_t i = 0; i < sizeof nodec / sizeof nodec[0]; i++) {
        err.msg[0] = 0;
        cr_assert_eq(td_decode_row_f64(nodec[i], blk, y, 256, &err), TD_EINPUT, "%s", td_type_name(nodec[i]));
        cr_assert(strstr(err.msg, td_type_name(nodec[i])), "message names the type: %s", err.msg);
        cr_assert(strstr(err.msg, "td_decode_row_f64:"), "message names the function: %s", err.msg);
        cr_assert_eq(td_decode_row_f32(nodec[i], blk, yf, 256, &err), TD_EINPUT);
        cr_assert(strstr(err.msg, "td_decode_row_f32:"), "message names the function: %s", err.msg);
    }
    cr_assert_eq(td_decode_row_f64(4, blk, y, 32, &err), TD_EINPUT);
    cr_assert_eq(td_decode_row_f64(TD_TYPE_COUNT, blk, y, 32, &err), TD_EINPUT);
    cr_assert_eq(td_decode_row_f64(-1, blk, y, 32, &err), TD_EINPUT);
    err.msg[0] = 0;
    cr_assert_eq(td_decode_row_f64(TD_TYPE_Q4_K, blk, y, 100, &err), TD_EINPUT);
    cr_assert(strstr(err.msg, "256") && strstr(err.msg, "100"), "expected and found: %s", err.msg);
    cr_assert_eq(td_decode_row_f32(TD_TYPE_Q4_0, blk, yf, 31, &err), TD_EINPUT);
    cr_assert_eq(td_decode_row_f64(TD_TYPE_Q4_0, blk, y, -32, &err), TD_EINPUT);
    cr_assert_eq(td_decode_row_f64(TD_TYPE_Q4_0, NULL, NULL, 0, &err), TD_OK, "an empty row is fine");
    cr_assert_eq(td_decode_row_f64(TD_TYPE_Q4_0, blk, y, 64, NULL), TD_OK, "err may be NULL");
    cr_assert_eq(td_decode_row_f64(TD_TYPE_Q1_0, blk, y, 64, NULL), TD_EINPUT, "err may be NULL on failure too");
}

/* ------------------------------------------------------------------------ */
/* Grid types and NVFP4, hand-assembled. Each block is zero but for the
 * fields named; the expected values are worked out here from the layout
 * (quants.md §7, docs/quants-iq.md) and these grid entries (model/iq_grids.c):
 *   iq2xxs[0] = 8 x 8, [1] = {43,8,8,8,8,8,8,8}, [255] = {8,25,8,8,25,43,43,43}
 *   iq2xs[256] = {43,25,8,8,8,8,8,25}, [511] = 8 x 43
 *   iq2s[512] = {25,25,43,8,25,8,8,25}, [768] = {8,43,8,25,8,8,43,25}, [1023] = 8 x 43
 *   iq3xxs[0] = {4,4,4,4}, [255] = {4,28,52,62};  iq3s[0] = {1,1,1,1},
 *   [256] = {7,5,9,5}, [511] = {1,1,15,15}
 *   iq1s[0] = 8 x -1, [256] = {-1,0,1,0,1,-1,0,-1}, [1024] = {0,1,-1,0,0,0,0,0}, [2047] = 8 x 1
 *   ksigns[1] = 0x81, ksigns[3] = 0x03 (7 bits + even parity in bit 7) */

#define H_ONE 0x3C00

Test(types, iq2_xxs_hand_assembled) {
    uint8_t b[66] = {0};
    put16(b, H_ONE);
    b[2] = 1, b[3] = 255;                              /* sub-block 0: groups 0, 1 -> entries 1, 255 */
    put32(b + 6, 3u | 1u << 7 | 3u << 28);             /* signs idx 3 and 1, scale 3: db = 3.5/4 */
    EXPECT_AT(TD_TYPE_IQ2_XXS, b, 256, 0, -0.875 * 43); /* bit 0 of 0x03 */
    EXPECT_AT(TD_TYPE_IQ2_XXS, b, 256, 1, -0.875 * 8);  /* bit 1 */
    EXPECT_AT(TD_TYPE_IQ2_XXS, b, 256, 2, 0.875 * 8);
    EXPECT_AT(TD_TYPE_IQ2_XXS, b, 256, 8, -0.875 * 8);  /* group 1, bit 0 of 0x81 */
    EXPECT_AT(TD_TYPE_IQ2_XXS, b, 256, 9, 0.875 * 25);
    EXPECT_AT(TD_TYPE_IQ2_XXS, b, 256, 15, -0.875 * 43); /* the parity bit */
    EXPECT_AT(TD_TYPE_IQ2_XXS, b, 256, 32, 1.0);          /* sub-block 1: entry 0, scale 0: 8 * 0.5/4 */
}

Test(types, iq2_xs_hand_assembled) {
    uint8_t b[74] = {0};
    put16(b, H_ONE);
    put16(b + 2, 256 | 1 << 9); /* group 0: entry 256, signs idx 1 (0x81) */
    put16(b + 6, 511);          /* group 2: entry 511 */
    b[66] = 0x21;               /* groups 0-1: (0.5+1)/4, groups 2-3: (0.5+2)/4 */
    EXPECT_AT(TD_TYPE_IQ2_XS, b, 256, 0, -0.375 * 43);
    EXPECT_AT(TD_TYPE_IQ2_XS, b, 256, 1, 0.375 * 25);
    EXPECT_AT(TD_TYPE_IQ2_XS, b, 256, 7, -0.375 * 25);
    EXPECT_AT(TD_TYPE_IQ2_XS, b, 256, 16, 0.625 * 43);
    EXPECT_AT(TD_TYPE_IQ2_XS, b, 256, 32, 1.0 / 8 * 8);
}

Test(types, iq2_s_hand_assembled) {
    uint8_t b[82] = {0};
    put16(b, H_ONE);
    b[2 + 3] = 255;                    /* group 3 low index bits */
    b[34] = 0x02;                      /* group 0 sign mask: element 1 negated */
    b[66] = 3 | 2 << 2 | 3 << 6;       /* index bits 8-9: group 0 -> 768, 1 -> 512, 3 -> 1023 */
    b[74] = 0x10;                      /* groups 0-1: 0.5/4, groups 2-3: 1.5/4 */
    EXPECT_AT(TD_TYPE_IQ2_S, b, 256, 0, 1.0);
    EXPECT_AT(TD_TYPE_IQ2_S, b, 256, 1, -0.125 * 43);
    EXPECT_AT(TD_TYPE_IQ2_S, b, 256, 3, 0.125 * 25);
    EXPECT_AT(TD_TYPE_IQ2_S, b, 256, 8, 0.125 * 25);
    EXPECT_AT(TD_TYPE_IQ2_S, b, 256, 10, 0.125 * 43);
    EXPECT_AT(TD_TYPE_IQ2_S, b, 256, 24, 0.375 * 43);
}

/* ------------------------------------------------------------------------ */
/* Row modes (td_row_mode)                                                    */

/* Element i of a row decoded in a mode, f64 and f32 alike (the f32 row holds
 * the same f16 values). */
static double decoded_as(int type, const void *row, int64_t n, int64_t i, td_row_mode mode) {
    td_err err = {{0}};
    double *got = malloc((size_t)n * sizeof *got);
    float *gotf = malloc((size_t)n * sizeof *gotf);
    cr_assert_eq(td_decode_row_as_f64(type, row, got, n, mode, &err), TD_OK, "%s: %s", td_type_name(type), err.msg);
    cr_assert_eq(td_decode_row_as_f32(type, row, gotf, n, mode, &err), TD_OK, "%s: %s", td_type_name(type), err.msg);
    const double v = got[i];
    cr_assert(same(gotf[i], v), "%s mode %d: f32 y[%lld] = %.9g, f64 %.17g", td_type_name(type), (int)mode,
              (long long)i, (double)gotf[i], v);
    free(got);
    free(gotf);
    return v;
}

/* ggml-vulkan's f16 tile loader of the three IQ2 grids (mul_mm_funcs.glsl:
 * FLOAT_TYPE db = d * 0.25 * (0.5 + s), then db times the grid value in
 * f16). d = 2047/2048 (0x3BFF), s = 2, grid value 25, worked by hand:
 *   the scale d*5/8 = 0.62469482421875 (exact in f32) -> f16 0.62451171875
 *   (ulp 2^-11 in [0.5, 1): 1279.36 ulps -> 1279); times 25 = 15.61279296875
 *   -> f16 15.609375 (ulp 2^-7 in [8, 16): 1998.44 -> 1998);
 *   rounded once instead: 15.61737060546875 -> 15.6171875 (1999.02 -> 1999). */
Test(types, f16_tile_rounds_the_iq2_group_scale_first) {
    uint8_t xxs[66] = {0}, xs[74] = {0}, s2[82] = {0};
    put16(xxs, 0x3BFF);
    xxs[2] = 255;               /* group 0: entry 255 = {8,25,...} */
    put32(xxs + 6, 2u << 28);   /* no signs, scale 2 */
    put16(xs, 0x3BFF);
    put16(xs + 2, 256);         /* group 0: entry 256 = {43,25,...}, no signs */
    xs[66] = 0x02;              /* groups 0-1: scale 2 */
    put16(s2, 0x3BFF);
    s2[66] = 2;                 /* group 0: index bits 8-9 = 2 -> entry 512 = {25,25,43,...} */
    s2[74] = 0x02;              /* groups 0-1: scale 2 */
    const struct { int type; const uint8_t *b; int i; } c[] = {
        {TD_TYPE_IQ2_XXS, xxs, 1}, {TD_TYPE_IQ2_XS, xs, 1}, {TD_TYPE_IQ2_S, s2, 0}};
    for (size_t k = 0; k < sizeof c / sizeof c[0]; k++) {
        const char *nm = td_type_name(c[k].type);
        cr_assert_eq(decoded_as(c[k].type, c[k].b, 256, c[k].i, TD_ROW_EXACT), 0.62469482421875 * 25, "%s exact", nm);
        cr_assert_eq(decoded_as(c[k].type, c[k].b, 256, c[k].i, TD_ROW_F16), 15.6171875, "%s f16", nm);
        cr_assert_eq(decoded_as(c[k].type, c[k].b, 256, c[k].i, TD_ROW_F16_TILE), 15.609375, "%s f16 tile", nm);
    }
}

/* TD_ROW_F16 is the stored value rounded to f16 through f32 for every type;
 * TD_ROW_F16_TILE the same but for the IQ2 grids (above): random blocks of
 * every decodable type, non-finite scales included. */
Test(types, row_modes_on_every_type) {
    rng_state = 11;
    uint8_t row[4 * 1024];
    double ex[1024], f16[1024], tile[1024];
    int n_iq2 = 0;
    for (int type = 0; type < TD_TYPE_COUNT; type++) {
        const td_type_info *t = td_type_get(type);
        if (!t || !t->can_decode) continue;
        const int64_t n = t->block_size * (1024 / t->block_size > 4 ? 4 : 1024 / t->block_size);
        cr_assert_leq((size_t)td_type_row_bytes(type, n), sizeof row);
        rfill(row, sizeof row);
        td_err err = {{0}};
        cr_assert_eq(td_decode_row_as_f64(type, row, ex, n, TD_ROW_EXACT, &err), TD_OK, "%s", err.msg);
        cr_assert_eq(td_decode_row_as_f64(type, row, f16, n, TD_ROW_F16, &err), TD_OK, "%s", err.msg);
        cr_assert_eq(td_decode_row_as_f64(type, row, tile, n, TD_ROW_F16_TILE, &err), TD_OK, "%s", err.msg);
        const int iq2 = type == TD_TYPE_IQ2_XXS || type == TD_TYPE_IQ2_XS || type == TD_TYPE_IQ2_S;
        int64_t differ = 0;
        for (int64_t i = 0; i < n; i++) {
            const double want = td_f16_to_f32(td_f32_to_f16((float)ex[i]));
            cr_assert(same(f16[i], want), "%s y[%lld]: f16 mode %.17g, f16 of %.17g is %.17g", t->name, (long long)i,
                      f16[i], ex[i], want);
            if (!iq2)
                cr_assert(same(tile[i], f16[i]), "%s y[%lld]: f16 tile %.17g, f16 %.17g", t->name, (long long)i, tile[i],
                          f16[i]);
            differ += !same(tile[i], f16[i]);
        }
        n_iq2 += iq2 && differ > 0;
    }
    cr_assert_eq(n_iq2, 3, "random IQ2 blocks should show the scale rounding in each of the 3 types (%d did)", n_iq2);
}

/* The f16 tile mode reports what the row decoder reports, and a non-finite
 * scale comes out non-finite as the exact row has it (the tap's non-finite
 * count shows it). */
Test(types, f16_tile_errors_and_non_finite_scales) {
    td_err err;
    double y[256];
    float yf[256];
    uint8_t b[66] = {0};
    err.msg[0] = 0;
    cr_assert_eq(td_decode_row_as_f64(TD_TYPE_IQ2_XXS, b, y, 100, TD_ROW_F16_TILE, &err), TD_EINPUT);
    cr_assert(strstr(err.msg, "256") && strstr(err.msg, "100"), "expected and found: %s", err.msg);
    cr_assert(strstr(err.msg, "td_decode_row_as_f64:"), "message names the function: %s", err.msg);
    cr_assert_eq(td_decode_row_as_f32(TD_TYPE_IQ2_XXS, b, yf, 100, TD_ROW_F16_TILE, &err), TD_EINPUT);
    cr_assert(strstr(err.msg, "td_decode_row_as_f32:"), "message names the function: %s", err.msg);
    cr_assert_eq(td_decode_row_as_f64(TD_TYPE_Q8_1, b, y, 32, TD_ROW_F16_TILE, &err), TD_EINPUT);
    cr_assert_eq(td_decode_row_as_f64(-1, b, y, 256, TD_ROW_F16_TILE, &err), TD_EINPUT);
    const uint16_t bad[2] = {0x7C00, 0x7E00}; /* +inf, NaN */
    for (int k = 0; k < 2; k++) {
        put16(b, bad[k]);
        put32(b + 6, 5u << 28);
        for (int i = 0; i < 256; i += 37) {
            const double v = decoded_as(TD_TYPE_IQ2_XXS, b, 256, i, TD_ROW_F16_TILE);
            cr_assert(k ? isnan(v) : isinf(v), "scale 0x%04x: y[%d] = %g", bad[k], i, v);
            cr_assert(same(v, decoded_as(TD_TYPE_IQ2_XXS, b, 256, i, TD_ROW_EXACT)), "y[%d] as the exact row", i);
        }
    }
}

Test(types, iq3_xxs_hand_assembled) {
    uint8_t b[98] = {0};
    put16(b, H_ONE);
    b[2] = 255;                  /* group 0, first 4 values: entry 255; second: entry 0 */
    put32(b + 66, 3u | 1u << 28); /* signs idx 3 (0x03), scale 1: db = 1.5/2 */
    EXPECT_AT(TD_TYPE_IQ3_XXS, b, 256, 0, -0.75 * 4);
    EXPECT_AT(TD_TYPE_IQ3_XXS, b, 256, 1, -0.75 * 28);
    EXPECT_AT(TD_TYPE_IQ3_XXS, b, 256, 2, 0.75 * 52);
    EXPECT_AT(TD_TYPE_IQ3_XXS, b, 256, 3, 0.75 * 62);
    EXPECT_AT(TD_TYPE_IQ3_XXS, b, 256, 4, 0.75 * 4);
    EXPECT_AT(TD_TYPE_IQ3_XXS, b, 256, 32, 0.25 * 4); /* sub-block 1: scale 0 -> 0.5/2 */
}

Test(types, iq3_s_hand_assembled) {
    uint8_t b[110] = {0};
    put16(b, H_ONE);
    b[3] = 255;          /* group 0 second entry: low bits 255 */
    b[66] = 0x03;        /* 9th bits: first entry 0 -> 256, second 255 -> 511 */
    b[74] = 0x81;        /* group 0 signs: elements 0 and 7 */
    b[106] = 0x32;       /* sub-block 0: 1 + 2*2 = 5, sub-block 1: 1 + 2*3 = 7 */
    EXPECT_AT(TD_TYPE_IQ3_S, b, 256, 0, -35.0);
    EXPECT_AT(TD_TYPE_IQ3_S, b, 256, 1, 25.0);
    EXPECT_AT(TD_TYPE_IQ3_S, b, 256, 4, 5.0);
    EXPECT_AT(TD_TYPE_IQ3_S, b, 256, 6, 75.0);
    EXPECT_AT(TD_TYPE_IQ3_S, b, 256, 7, -75.0);
    EXPECT_AT(TD_TYPE_IQ3_S, b, 256, 32, 7.0);
}

Test(types, iq1_s_hand_assembled) {
    uint8_t b[50] = {0};
    put16(b, H_ONE);
    b[2 + 3] = 255;                                     /* group 3 low bits */
    put16(b + 34, 1 | 7 << 9 | 2 << 12 | 0x8000);       /* group 0 -> 256, group 3 -> 2047; s = 2; shift -1/8 */
    EXPECT_AT(TD_TYPE_IQ1_S, b, 256, 0, 5 * -1.125);
    EXPECT_AT(TD_TYPE_IQ1_S, b, 256, 1, 5 * -0.125);
    EXPECT_AT(TD_TYPE_IQ1_S, b, 256, 2, 5 * 0.875);
    EXPECT_AT(TD_TYPE_IQ1_S, b, 256, 24, 5 * 0.875);
    EXPECT_AT(TD_TYPE_IQ1_S, b, 256, 32, -0.875); /* sub-block 1: entry 0, s = 0, shift +1/8 */
}

Test(types, iq1_m_hand_assembled) {
    uint8_t b[56] = {0};
    b[1] = 255;              /* group 1 low bits */
    b[32] = 0x1 | 0x8 | 0x70; /* group 0: bits 8-10 = 1 (-> 256), shift negative; group 1: 7 (-> 2047) */
    b[33] = 0x04;            /* group 2: bits 8-10 = 4 (-> 1024) */
    /* f16 1.0 = 0x3C00 split over the top nibbles of the 4 scale words, lowest first;
       word 0 also holds the 3-bit scales 1 (groups 0-1: 3) and 2 (groups 2-3: 5) */
    put16(b + 48, 0x0011);
    put16(b + 50, 0x0000);
    put16(b + 52, 0xC000);
    put16(b + 54, 0x3000);
    EXPECT_AT(TD_TYPE_IQ1_M, b, 256, 0, 3 * -1.125);
    EXPECT_AT(TD_TYPE_IQ1_M, b, 256, 2, 3 * 0.875);
    EXPECT_AT(TD_TYPE_IQ1_M, b, 256, 8, 3 * 1.125);
    EXPECT_AT(TD_TYPE_IQ1_M, b, 256, 16, 5 * 0.125);
    EXPECT_AT(TD_TYPE_IQ1_M, b, 256, 17, 5 * 1.125);
    EXPECT_AT(TD_TYPE_IQ1_M, b, 256, 18, 5 * -0.875);
}

Test(types, nvfp4_hand_assembled) {
    uint8_t b[36] = {0};
    b[0] = 0x38;  /* UE4M3 E=7 M=0: 1.0 */
    b[1] = 0x01;  /* E=0 M=1: 2^-9 (subnormal) */
    b[2] = 0x7F;  /* decodes to 0 */
    b[3] = 0xFF;  /* bit 7 ignored: E=15 M=7: 1.875 * 2^8 = 480 */
    b[4] = 0xF7;  /* codes 7 (+6) and 15 (-6) */
    b[12] = 0x11; /* code 1: +0.5 */
    b[20] = 0x77;
    b[28] = 0x09; /* code 9: -0.5; code 0 */
    EXPECT_AT(TD_TYPE_NVFP4, b, 64, 0, 6.0);
    EXPECT_AT(TD_TYPE_NVFP4, b, 64, 8, -6.0);
    EXPECT_AT(TD_TYPE_NVFP4, b, 64, 16, 0x1p-10);
    EXPECT_AT(TD_TYPE_NVFP4, b, 64, 24, 0x1p-10);
    EXPECT_AT(TD_TYPE_NVFP4, b, 64, 32, 0.0);
    EXPECT_AT(TD_TYPE_NVFP4, b, 64, 48, -240.0);
    EXPECT_AT(TD_TYPE_NVFP4, b, 64, 56, 0.0);
}
