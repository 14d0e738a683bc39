/* tapdiff "cpu": the faulty code paths that do not fit in one expression of
 * cpu.c (see cpu_faults.h; the catalog is backends/faults.c). Each faulty path is
 * written from the spec's correct formula with exactly one thing changed, so
 * the bug is the one the catalog names and nothing else. */
#include "cpu_faults.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "blocks.h"
#include "types.h"

/* ---- kquant_scale_bit --------------------------------------------------- */

/* Q4_K block (primitives: 256 values, 144 bytes): f16 d, f16 dmin, 12 bytes
 * of packed 6-bit scales/mins, 128 bytes of nibbles. Byte 4 is the first
 * scale byte; its low 6 bits are sub-block 0's scale. */
#define Q4K_VALUES 256
#define Q4K_BYTES 144
#define Q4K_SCALE0_BYTE 4

static void q4k_to_f32_faulty(int type, const void *w, float *dst, int64_t n) {
    const uint8_t *src = w;
    uint8_t blk[Q4K_BYTES];
    for (int64_t i = 0; i < n / Q4K_VALUES; i++) {
        memcpy(blk, src + i * Q4K_BYTES, Q4K_BYTES);
        blk[Q4K_SCALE0_BYTE] ^= 1; // the one wrong bit
        td_err err = {{0}};
        int rc = td_decode_row_f32(type, blk, dst + i * Q4K_VALUES, Q4K_VALUES, &err);
        TD_ASSERT(rc == TD_OK); // the type and size were checked at open
    }
}

/* ---- iq_sign_bit ---------------------------------------------------------- */

static void iq2xxs_to_f32_faulty(int type, const void *w, float *dst, int64_t n) {
    (void)type;
    const uint8_t *src = w;
    double y[8];
    for (int64_t i = 0; i < n / TD_QK_K; i++) {
        const uint8_t *b = src + i * (int64_t)sizeof(td_blk_iq2_xxs);
        const double d = td_blk_f16(td_blk_u16(b + offsetof(td_blk_iq2_xxs, d)));
        for (int g = 0; g < 32; g++) {
            td_iq_group q = td_iq2_xxs_group(b, g);
            uint8_t neg = (uint8_t)((q.neg & ~1u) | ((q.neg >> 1) & 1u)); // the bug: bit 1 for element 0
            td_iq_dec_grid8(d * q.mul / 8, td_iq2xxs_grid[q.idx], neg, y);
            for (int j = 0; j < 8; j++) dst[i * TD_QK_K + 8 * g + j] = (float)y[j];
        }
    }
}

/* ---- simd_tail ------------------------------------------------------------ */

/* An 8-lane f32 dot (an AVX2 accumulator's shape) whose loop stops at the
 * last full group of 8: the n % 8 tail is never added. Exactly that bug, so
 * on lengths that are multiples of 8 it is an honest f32 dot. */
#define TAIL_LANES 8

static float dot_f32_f32_no_tail(const float *a, const float *b, int64_t n) {
    float lane[TAIL_LANES] = {0};
    for (int64_t i = 0; i + TAIL_LANES <= n; i += TAIL_LANES)
        for (int l = 0; l < TAIL_LANES; l++) lane[l] += a[i + l] * b[i + l];
    float s = 0;
    for (int l = 0; l < TAIL_LANES; l++) s += lane[l];
    return s;
}

static float dot_f32_no_tail(const void *w, const float *x, const float *xs, int64_t n) {
    (void)xs;
    return dot_f32_f32_no_tail(w, x, n);
}

/* ---- oddblock_q8_0 -------------------------------------------------------- */

/* A Q8_0 row dot unrolled by two blocks whose remainder step is missing: a
 * row with an odd number of blocks loses its last one. */
static float dot_q8_0_pairs(const void *wv, const float *x, const float *xs, int64_t n) {
    (void)xs;
    const uint8_t *b = wv;
    const int64_t nb = n / 32;
    double s = 0;
    for (int64_t j = 0; j + 2 <= nb; j += 2)
        for (int64_t u = j; u < j + 2; u++) {
            const uint8_t *blk = b + u * (int64_t)sizeof(td_blk_q8_0);
            const int8_t *q = (const int8_t *)(blk + offsetof(td_blk_q8_0, qs));
            float p = 0;
            for (int i = 0; i < 32; i++) p += (float)q[i] * x[32 * u + i];
            s += td_blk_f16(td_blk_u16(blk + offsetof(td_blk_q8_0, d))) * (double)p;
        }
    return (float)s;
}

void td_cpu_fault_patch_kernels(td_cpu_kernels *k, td_fault f) {
    if (f == TD_FAULT_SIMD_TAIL) {
        k->dot_f32 = dot_f32_f32_no_tail;
        k->type[TD_TYPE_F32].dot = dot_f32_no_tail;
        return;
    }
    if (f == TD_FAULT_ODDBLOCK_Q8_0) {
        td_cpu_type_ops *op = &k->type[TD_TYPE_Q8_0];
        op->dot = dot_q8_0_pairs;
        op->dot_rows = NULL; // the several-row kernel would bypass the faulty dot
        op->dot_q8 = NULL; // act-q8 products take x' = d*q through the same faulty dot
        op->gemv_x32 = NULL; // native products too
        return;
    }
    if (f == TD_FAULT_IQ_SIGN_BIT) {
        td_cpu_type_ops *op = &k->type[TD_TYPE_IQ2_XXS];
        op->to_f32 = iq2xxs_to_f32_faulty;
        op->dot = NULL; // every product decodes the row through the faulty decoder
        op->dot_rows = NULL;
        op->dot_q8 = NULL;
        op->gemv_x32 = NULL;
        op->needs_xsum = 0;
        return;
    }
    if (f != TD_FAULT_KQUANT_SCALE_BIT) return;
    TD_ASSERT(td_type_get(TD_TYPE_Q4_K)->block_bytes == Q4K_BYTES &&
              td_type_get(TD_TYPE_Q4_K)->block_size == Q4K_VALUES);
    td_cpu_type_ops *op = &k->type[TD_TYPE_Q4_K];
    op->to_f32 = q4k_to_f32_faulty;
    op->dot = NULL;    // every product decodes the row through the faulty decoder
    op->dot_rows = NULL;
    op->dot_q8 = NULL;
    op->gemv_x32 = NULL;
    op->needs_xsum = 0;
}

/* ---- rmsnorm_eps_outside ------------------------------------------------ */

void td_cpu_fault_rmsnorm_rows(float *out, const float *x, const float *w, float eps, int64_t rows, int64_t n) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        float *o = out + r * n;
        double ss = 0;
        for (int64_t i = 0; i < n; i++) ss += (double)xr[i] * xr[i];
        const float inv = (float)(1.0 / sqrt(ss / (double)n) + (double)eps); // the bug: eps outside
        for (int64_t i = 0; i < n; i++) o[i] = w[i] * (xr[i] * inv);
    }
}
