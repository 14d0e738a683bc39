/* tapdiff: ggml tensor types (ids as stored in GGUF), their block geometry,
 * and row decoders. A row of a tensor is ne[0] values = ne[0]/B consecutive
 * blocks; decoding a row reads exactly those bytes and nothing else.
 * Formulas: ../shared/spec/quants.md. */
#ifndef TD_TYPES_H
#define TD_TYPES_H

#include "td_common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ggml_type ids; values fixed by the file format. */
typedef enum td_type {
    TD_TYPE_F32 = 0,
    TD_TYPE_F16 = 1,
    TD_TYPE_Q4_0 = 2,
    TD_TYPE_Q4_1 = 3,
    TD_TYPE_Q5_0 = 6,
    TD_TYPE_Q5_1 = 7,
    TD_TYPE_Q8_0 = 8,
    TD_TYPE_Q8_1 = 9,
    TD_TYPE_Q2_K = 10,
    TD_TYPE_Q3_K = 11,
    TD_TYPE_Q4_K = 12,
    TD_TYPE_Q5_K = 13,
    TD_TYPE_Q6_K = 14,
    TD_TYPE_Q8_K = 15,
    TD_TYPE_IQ2_XXS = 16,
    TD_TYPE_IQ2_XS = 17,
    TD_TYPE_IQ3_XXS = 18,
    TD_TYPE_IQ1_S = 19,
    TD_TYPE_IQ4_NL = 20,
    TD_TYPE_IQ3_S = 21,
    TD_TYPE_IQ2_S = 22,
    TD_TYPE_IQ4_XS = 23,
    TD_TYPE_I8 = 24,
    TD_TYPE_I16 = 25,
    TD_TYPE_I32 = 26,
    TD_TYPE_I64 = 27,
    TD_TYPE_F64 = 28,
    TD_TYPE_IQ1_M = 29,
    TD_TYPE_BF16 = 30,
    TD_TYPE_TQ1_0 = 34,
    TD_TYPE_TQ2_0 = 35,
    TD_TYPE_MXFP4 = 39,
    TD_TYPE_NVFP4 = 40,
    TD_TYPE_Q1_0 = 41,
    TD_TYPE_Q2_0 = 42,
    TD_TYPE_COUNT = 43,
} td_type;

typedef struct td_type_info {
    const char *name;     /* "Q4_K"; NULL for removed / invalid ids */
    int64_t block_size;   /* values per block (B) */
    int64_t block_bytes;  /* bytes per block (Z) */
    int can_decode;       /* 1 when td_decode_row_* supports it */
} td_type_info;

/* Geometry of a type id; NULL for ids that are not valid ggml types
 * (negative, >= TD_TYPE_COUNT, or removed). */
const td_type_info *td_type_get(int type_id);
/* Name for messages: "Q4_K", or "type#4" for an invalid id (static buffer). */
const char *td_type_name(int type_id);
/* Bytes of one row of n values, or 0 when n is not a multiple of the block
 * size or the type is invalid. */
size_t td_type_row_bytes(int type_id, int64_t n);

/* Decode n values (n a multiple of the block size) starting at `src`, which
 * points at the first block of a row (or any block boundary). Returns TD_OK,
 * or TD_EINPUT with a message when the type has no decoder or n is not a
 * multiple of the block size. The f64 variant is exact (every stored value
 * is representable); the f32 variant rounds the same value to float. */
int td_decode_row_f64(int type_id, const void *src, double *dst, int64_t n, td_err *err);
int td_decode_row_f32(int type_id, const void *src, float *dst, int64_t n, td_err *err);

/* The values a row decoder gives (td_decode_row_as_*). */
typedef enum td_row_mode {
    TD_ROW_EXACT,    /* the stored values (td_decode_row_*) */
    TD_ROW_F16,      /* each rounded to f16 through f32, as an fp16 device converts a weight */
    /* as ggml-vulkan's tiled matmul loads a row into its f16 tile
     * (mul_mm_funcs.glsl, FLOAT_TYPE float16_t): TD_ROW_F16, except the IQ2
     * grids (IQ2_XXS, IQ2_XS, IQ2_S), whose loader rounds the group scale
     * d*(2s+1)/8 to f16 before it multiplies the grid value (in f16). The
     * other IQ types' and NVFP4's loaders round the exact value once: they
     * form it in f32, where it is exact (IQ1, IQ3, IQ4_XS, NVFP4 without the
     * OCP FP4 extension), or multiply f16 values that are exact (IQ4_NL's
     * scale, NVFP4's UE4M3 one with it). */
    TD_ROW_F16_TILE,
} td_row_mode;
/* td_decode_row_* in a mode, with the same errors. */
int td_decode_row_as_f64(int type_id, const void *src, double *dst, int64_t n, td_row_mode mode, td_err *err);
int td_decode_row_as_f32(int type_id, const void *src, float *dst, int64_t n, td_row_mode mode, td_err *err);

/* Scalar conversions (exact, IEEE). */
double td_f16_to_f64(uint16_t h);
float td_f16_to_f32(uint16_t h);
uint16_t td_f32_to_f16(float f);    /* round to nearest even */
/* x rounded to the nearest f16 and back, through f32 (x in f64 first
 * rounded to f32) as a device converts a value it stores in f16. */
float td_f16_round_trip_f32(float x);
double td_f16_round_trip_f64(double x);
float td_bf16_to_f32(uint16_t h);
uint16_t td_f32_to_bf16(float f);   /* round to nearest even, NaN stays NaN */

#ifdef __cplusplus
}
#endif
#endif
