// model/blocks.h is meant to be compiled by nvcc for host AND device from
// the same source: this translation unit instantiates every decoder of the
// grid types and NVFP4 in a __global__ kernel and in a host function, with
// the tables supplied as __device__ copies on the device side (the
// TD_IQ_TABLE hook). Compiled (not run) by the `cuda_compile` test when nvcc
// is present; a device would fill d_* from model/iq_grids.c before use.
#include <stdint.h>
#ifdef __CUDA_ARCH__
#define TD_IQ_TABLE(name) d_##name
#else
#define TD_IQ_TABLE(name) td_##name
#endif
__device__ uint8_t d_iq2xxs_grid[256][8], d_iq2xs_grid[512][8], d_iq2s_grid[1024][8], d_iq3xxs_grid[256][4],
    d_iq3s_grid[512][4], d_iq_ksigns[128];
__device__ int8_t d_iq1s_grid[2048][8];
#include "blocks.h"

__global__ void decode_all(const uint8_t *b, double *y) {
    td_blk_dec_iq2_xxs(b, y);
    td_blk_dec_iq2_xs(b, y);
    td_blk_dec_iq2_s(b, y);
    td_blk_dec_iq3_xxs(b, y);
    td_blk_dec_iq3_s(b, y);
    td_blk_dec_iq1_s(b, y);
    td_blk_dec_iq1_m(b, y);
    td_blk_dec_nvfp4(b, y);
}

void decode_all_host(const uint8_t *b, double *y) {
    td_blk_dec_iq2_xxs(b, y);
    td_blk_dec_iq1_m(b, y);
    td_blk_dec_nvfp4(b, y);
}
