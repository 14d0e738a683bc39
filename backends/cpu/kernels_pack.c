/* tapdiff cpu backend: the packed weight layouts of act-q8 (cpu_kernels.h,
 * TD_CPU_PACK_ROWS). A group of 16 rows is stored so that one 64-byte load
 * holds 4 consecutive codes of each of the 16 rows (row r at bytes 4r..4r+3):
 * the dot-product instructions then multiply 4 codes of 16 rows by 4
 * activation bytes broadcast from one token, and every loaded weight vector
 * serves each token of a tile. Scales are stored per group beside their
 * codes, not expanded to f32 (f16 converts exactly in one instruction), so
 * the packed form is no larger than the stored rows and decode streams the
 * same bytes. Portable C: the layout is data, the kernels reading it are
 * per ISA level. */
#include <stdint.h>
#include <string.h>

#include "blocks.h"
#include "cpu_kernels.h"

#define OFF(T, f) offsetof(td_blk_##T, f)
#define SZ(T) sizeof(td_blk_##T)
#define R TD_CPU_PACK_ROWS

/* Q8_0, nb = n/32 blocks, in pairs of blocks (2m, 2m+1) of 1088 bytes (a
 * multiple of 64; the last pair of an odd nb is padded): the codes of block
 * 2m then 2m+1, 512 bytes each (8 words of 4 codes x 16 rows), each code
 * XOR 0x80 = code + 128 as an unsigned byte (the instruction's unsigned
 * operand; the kernel removes 128 * Σa exactly), then the 16 f16 scales of
 * block 2m and of 2m+1 (32 bytes each). Scales beside their codes keep
 * decode one sequential stream. */
size_t td_cpu_pack_bytes_q8_0(int64_t n) {
    return (size_t)((n / 32 + 1) / 2) * 1088;
}

void td_cpu_pack_q8_0(void *dst, const void *rows, size_t row_bytes, int64_t n) {
    // every byte is written below but the padding half of an odd last pair
    // (a fresh copy's first touch: a pass over all of it costs as much)
    if (n / 32 % 2) memset((uint8_t *)dst + (size_t)(n / 32 / 2) * 1088 + 512, 0, 1088 - 512);
    // the copy written in order, 4 codes at a time (a row's codes 4w..4w+3
    // land at 64w + 4r): byte by byte, row by row, it was a seventh of a
    // short run's CPU time
    for (int64_t j = 0; j < n / 32; j++) {
        uint8_t *pair = (uint8_t *)dst + (size_t)(j / 2) * 1088;
        uint8_t *codes = pair + 512 * (j % 2), *scales = pair + 1024 + 32 * (j % 2);
        const uint8_t *b = (const uint8_t *)rows + (size_t)j * SZ(q8_0);
        for (int w = 0; w < 8; w++)
            for (int r = 0; r < R; r++) {
                uint32_t v;
                memcpy(&v, b + (size_t)r * row_bytes + OFF(q8_0, qs) + 4 * w, 4);
                v ^= 0x80808080u;
                memcpy(codes + 64 * w + 4 * r, &v, 4);
            }
        for (int r = 0; r < R; r++) memcpy(scales + 2 * r, b + (size_t)r * row_bytes + OFF(q8_0, d), 2);
    }
}

/* Q4_K, per super-block of 256 values, 2368 bytes (a multiple of 64):
 *   2048  codes: word (8c + i), c = 0..3, i = 0..7, holds bytes
 *         qs[32c + 4i .. +3] of each row: low nibbles are values 64c + 4i..,
 *         high nibbles values 64c + 32 + 4i.. (the stored nibble pairing);
 *    128  scale codes: sub-block k of row r at 16k + r;
 *    128  minimum codes, likewise;
 *     32  d of the 16 rows (f16), 32  dmin (f16). */
#define Q4K_GROUP 2368

size_t td_cpu_pack_bytes_q4_k(int64_t n) {
    return (size_t)(n / TD_QK_K) * Q4K_GROUP;
}

void td_cpu_pack_q4_k(void *dst, const void *rows, size_t row_bytes, int64_t n) {
    for (int r = 0; r < R; r++) {
        const uint8_t *row = (const uint8_t *)rows + (size_t)r * row_bytes;
        for (int64_t sb = 0; sb < n / TD_QK_K; sb++) {
            const uint8_t *b = row + (size_t)sb * SZ(q4_k);
            uint8_t *g = (uint8_t *)dst + (size_t)sb * Q4K_GROUP;
            for (int w = 0; w < 32; w++) memcpy(g + 64 * w + 4 * r, b + OFF(q4_k, qs) + 4 * w, 4);
            uint8_t sc[8], mn[8];
            td_cpu_kq_scales(b + OFF(q4_k, scales), sc, mn);
            for (int k = 0; k < 8; k++) g[2048 + 16 * k + r] = sc[k], g[2176 + 16 * k + r] = mn[k];
            memcpy(g + 2304 + 2 * r, b + OFF(q4_k, d), 2);
            memcpy(g + 2336 + 2 * r, b + OFF(q4_k, dmin), 2);
        }
    }
}
