/* Recovers the IQ codebook grids and the IQ2/IQ3 sign table from a running
 * llama.cpp (the peer's libggml-base), by decoding crafted blocks through
 * ggml's to_float and reading the values back, and prints them as the C data
 * file model/iq_grids.c. Every block is built so that the decoded value IS the
 * table entry: super-scale and sub-scale chosen so the multiplier is exactly 1,
 * no sign bits, one grid index per 8 (or 4) values. Nothing of ggml's source
 * is read; the numbers are what its decoder returns.
 * Build and run: bash ci/gen-iq-grids.sh (needs .deps/llamacpp). */
#include <ggml.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define QK 256

static void die(const char *m, long i) {
    fprintf(stderr, "gen-iq-grids: %s (entry %ld)\n", m, i);
    exit(1);
}

static void put16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }

/* decode nb blocks of type t */
static float *decode(enum ggml_type t, const uint8_t *src, int nb) {
    float *y = malloc(sizeof(float) * QK * (size_t)nb);
    ggml_get_type_traits(t)->to_float(src, y, (int64_t)nb * QK);
    return y;
}

static int as_byte(float v, long i) {
    if (v != floorf(v) || v < 0 || v > 255) die("value is not an unsigned byte", i);
    return (int)v;
}

static void print_u8(const char *decl, const int *v, int rows, int width) {
    printf("%s = {\n", decl);
    for (int r = 0; r < rows; r++) {
        printf("%s{", r % 4 == 0 ? "    " : " ");
        for (int j = 0; j < width; j++) printf("%s%d", j ? "," : "", v[r * width + j]);
        printf("}%s", r + 1 < rows ? "," : "");
        if (r % 4 == 3 || r + 1 == rows) printf("\n");
    }
    printf("};\n\n");
}

int main(int argc, char **argv) {
    const char *fetched = argc > 1 ? argv[1] : "unknown fetch";
    /* ---- IQ2_XXS: d = 8, scale nibble 0 -> db = 8 * 0.5 * 0.25 = 1 */
    static int g2xxs[256 * 8], g2xs[512 * 8], g2s[1024 * 8], g3xxs[256 * 4], g3s[512 * 4], g1s[2048 * 8], ks[128];
    {
        enum { NB = 256 / 32, Z = 66 };
        uint8_t *b = calloc(NB, Z);
        for (int i = 0; i < 256; i++) {
            uint8_t *blk = b + (i / 32) * Z;
            put16(blk, 0x4800);
            int sb = (i % 32) / 4, g = i % 4;
            blk[2 + 8 * sb + g] = (uint8_t)i;
        }
        float *y = decode(GGML_TYPE_IQ2_XXS, b, NB);
        for (int i = 0; i < 256 * 8; i++) g2xxs[i] = as_byte(y[i], i / 8);
        free(y);
        free(b);
    }
    /* ---- IQ2_XXS sign index s: grid entry 0 is all-positive; sign index i
     * in group g of the block gives its 8 signs */
    {
        enum { NB = 128 / 32, Z = 66 };
        uint8_t *b = calloc(NB, Z);
        for (int i = 0; i < 128; i++) {
            uint8_t *blk = b + (i / 32) * Z;
            put16(blk, 0x4800);
            int sb = (i % 32) / 4, g = i % 4;
            uint32_t w;
            memcpy(&w, blk + 2 + 8 * sb + 4, 4);
            w |= (uint32_t)i << (7 * g);
            memcpy(blk + 2 + 8 * sb + 4, &w, 4);
        }
        float *y = decode(GGML_TYPE_IQ2_XXS, b, NB);
        for (int i = 0; i < 128; i++) {
            int m = 0;
            for (int j = 0; j < 8; j++) {
                float v = y[8 * i + j], e = (float)g2xxs[j];
                if (v == -e) m |= 1 << j;
                else if (v != e) die("sign probe: unexpected magnitude", i);
            }
            ks[i] = m;
        }
        free(y);
        free(b);
    }
    /* ---- IQ2_XS: 9-bit index in a u16, sign index 0, scale 0 */
    {
        enum { NB = 512 / 32, Z = 74 };
        uint8_t *b = calloc(NB, Z);
        for (int i = 0; i < 512; i++) {
            uint8_t *blk = b + (i / 32) * Z;
            put16(blk, 0x4800);
            put16(blk + 2 + 2 * (i % 32), (uint16_t)i);
        }
        float *y = decode(GGML_TYPE_IQ2_XS, b, NB);
        for (int i = 0; i < 512 * 8; i++) g2xs[i] = as_byte(y[i], i / 8);
        free(y);
        free(b);
    }
    /* ---- IQ2_S: low 8 bits in qs[0..31], top 2 bits in qh[sub-block] bits 2g..2g+1 */
    {
        enum { NB = 1024 / 32, Z = 82 };
        uint8_t *b = calloc(NB, Z);
        for (int i = 0; i < 1024; i++) {
            uint8_t *blk = b + (i / 32) * Z;
            put16(blk, 0x4800);
            int k = i % 32, sb = k / 4, g = k % 4;
            blk[2 + k] = (uint8_t)(i & 255);
            blk[2 + 64 + sb] |= (uint8_t)((i >> 8) << (2 * g));
        }
        float *y = decode(GGML_TYPE_IQ2_S, b, NB);
        for (int i = 0; i < 1024 * 8; i++) g2s[i] = as_byte(y[i], i / 8);
        free(y);
        free(b);
    }
    /* ---- IQ3_XXS: d = 4, scale 0 -> db = 4 * 0.5 * 0.5 = 1; 4 values per index */
    {
        enum { NB = 256 / 64, Z = 98 };
        uint8_t *b = calloc(NB, Z);
        for (int i = 0; i < 256; i++) {
            uint8_t *blk = b + (i / 64) * Z;
            put16(blk, 0x4400);
            blk[2 + i % 64] = (uint8_t)i;
        }
        float *y = decode(GGML_TYPE_IQ3_XXS, b, NB);
        for (int i = 0; i < 256 * 4; i++) g3xxs[i] = as_byte(y[i], i / 4);
        free(y);
        free(b);
    }
    /* ---- IQ3_S: d = 1, scale nibble 0 -> db = 1; bit k of qh[sb] = 9th bit of qs[8 sb + k] */
    {
        enum { NB = 512 / 64, Z = 110 };
        uint8_t *b = calloc(NB, Z);
        for (int i = 0; i < 512; i++) {
            uint8_t *blk = b + (i / 64) * Z;
            put16(blk, 0x3C00);
            int k = i % 64;
            blk[2 + k] = (uint8_t)(i & 255);
            blk[2 + 64 + k / 8] |= (uint8_t)((i >> 8) << (k % 8));
        }
        float *y = decode(GGML_TYPE_IQ3_S, b, NB);
        for (int i = 0; i < 512 * 4; i++) g3s[i] = as_byte(y[i], i / 4);
        free(y);
        free(b);
    }
    /* ---- IQ1_S: d = 1, scale 0, shift sign bit clear -> value = grid + 1/8 */
    {
        enum { NB = 2048 / 32, Z = 50 };
        uint8_t *b = calloc(NB, Z);
        for (int i = 0; i < 2048; i++) {
            uint8_t *blk = b + (i / 32) * Z;
            put16(blk, 0x3C00);
            int k = i % 32, sb = k / 4, g = k % 4;
            blk[2 + k] = (uint8_t)(i & 255);
            uint16_t qh;
            memcpy(&qh, blk + 34 + 2 * sb, 2);
            qh |= (uint16_t)((i >> 8) << (3 * g));
            memcpy(blk + 34 + 2 * sb, &qh, 2);
        }
        float *y = decode(GGML_TYPE_IQ1_S, b, NB);
        for (int i = 0; i < 2048 * 8; i++) {
            float v = y[i] - 0.125f;
            if (v != -1 && v != 0 && v != 1) die("IQ1_S value is not grid + 1/8 with grid in {-1,0,1}", i / 8);
            g1s[i] = (int)v;
        }
        free(y);
        free(b);
    }

    printf("/* tapdiff: the IQ codebook grids and the IQ2/IQ3 sign table, as data.\n"
           " *\n"
           " * Provenance: GENERATED by ci/gen-iq-grids.sh (ci/gen-iq-grids.c) from the\n"
           " * llama.cpp peer (ggml %s; %s).\n"
           " * Each entry is the value ggml's to_float returns for a crafted block\n"
           " * whose scales multiply to exactly 1 and whose sign bits are\n"
           " * clear (IQ1_S: value - 1/8), so entry = decoded value. Not copied from any\n"
           " * source file. Every entry is tested against the peer by\n"
           " * backends/llamacpp/tests/test_llamacpp_types.c (every grid index, every sign\n"
           " * index). Do not edit by hand; regenerate.\n"
           " *\n"
           " * Layout: grid[i][j] is element j of the 8- (or 4-) value group that index i\n"
           " * selects; ksigns[s] is the 8-bit negation mask that 7-bit sign index s stands\n"
           " * for (bit j set: element j negated). */\n"
           "#include \"blocks.h\"\n\n",
           ggml_version(), fetched);
    print_u8("const uint8_t td_iq2xxs_grid[256][8]", g2xxs, 256, 8);
    print_u8("const uint8_t td_iq2xs_grid[512][8]", g2xs, 512, 8);
    print_u8("const uint8_t td_iq2s_grid[1024][8]", g2s, 1024, 8);
    print_u8("const uint8_t td_iq3xxs_grid[256][4]", g3xxs, 256, 4);
    print_u8("const uint8_t td_iq3s_grid[512][4]", g3s, 512, 4);
    print_u8("const int8_t td_iq1s_grid[2048][8]", g1s, 2048, 8);
    printf("const uint8_t td_iq_ksigns[128] = {\n");
    for (int i = 0; i < 128; i++) printf("%s%d%s", i % 16 == 0 ? "    " : "", ks[i], i == 127 ? "\n" : i % 16 == 15 ? ",\n" : ",");
    printf("};\n");
    return 0;
}
