/* tapdiff cuda backend: launch configurations (cuda_launch.h). */
#include "cuda_launch.h"

#include "types.h"

int td_cuda_type_chunk(int type, int64_t *vals, int64_t *bytes) {
    const td_type_info *ti = td_type_get(type);
    if (!ti || !ti->can_decode) return 0;
    switch (type) {
    case TD_TYPE_F32: *vals = 32, *bytes = 32 * 4; return 1;
    case TD_TYPE_F16:
    case TD_TYPE_BF16: *vals = 32, *bytes = 32 * 2; return 1;
    case TD_TYPE_F64: *vals = 32, *bytes = 32 * 8; return 1;
    default: break;
    }
    if (ti->block_size < 2 || ti->block_size > TD_CUDA_CHUNK_MAX) return 0;
    switch (type) { /* the block types kernels.cu dispatches */
    case TD_TYPE_Q4_0: case TD_TYPE_Q4_1: case TD_TYPE_Q5_0: case TD_TYPE_Q5_1: case TD_TYPE_Q8_0:
    case TD_TYPE_Q1_0: case TD_TYPE_Q2_0: case TD_TYPE_MXFP4: case TD_TYPE_IQ4_NL: case TD_TYPE_IQ4_XS:
    case TD_TYPE_Q2_K: case TD_TYPE_Q3_K: case TD_TYPE_Q4_K: case TD_TYPE_Q5_K: case TD_TYPE_Q6_K:
    case TD_TYPE_Q8_K: case TD_TYPE_TQ1_0: case TD_TYPE_TQ2_0: case TD_TYPE_IQ2_XXS: case TD_TYPE_IQ2_XS:
    case TD_TYPE_IQ2_S: case TD_TYPE_IQ3_XXS: case TD_TYPE_IQ3_S: case TD_TYPE_IQ1_S: case TD_TYPE_IQ1_M:
    case TD_TYPE_NVFP4:
        *vals = ti->block_size, *bytes = ti->block_bytes;
        return 1;
    default: return 0;
    }
}

static uint32_t div_up(int64_t a, int64_t b) { return (uint32_t)((a + b - 1) / b); }

td_cuda_launch td_cuda_mm_launch(int64_t n_out, int64_t pairs) {
    td_cuda_launch l = {div_up(n_out, TD_CUDA_MV_WARPS), (uint32_t)(pairs > 0 ? pairs : 1),
                        TD_CUDA_MV_WARPS * TD_CUDA_WARP, 0};
    return l;
}

td_cuda_launch td_cuda_row_launch(int64_t rows, int64_t n) {
    (void)n; /* threads stride over the row; the block size does not depend on it */
    td_cuda_launch l = {(uint32_t)rows, 1, TD_CUDA_ROW_THREADS, 0};
    return l;
}

td_cuda_launch td_cuda_attn_launch(int64_t T, int64_t H, int64_t n_kv, int64_t D) {
    td_cuda_launch l = {(uint32_t)(T * H), 1, TD_CUDA_ATTN_THREADS, (size_t)(D + 2 * n_kv) * sizeof(float)};
    return l;
}

int64_t td_cuda_attn_max_ctx(int64_t D) {
    const int64_t room = (int64_t)(TD_CUDA_SMEM_DEFAULT / sizeof(float)) - D;
    return room > 1 ? room / 2 : 0;
}

td_cuda_launch td_cuda_elem_launch(int64_t n) {
    td_cuda_launch l = {div_up(n > 0 ? n : 1, TD_CUDA_ROW_THREADS), 1, TD_CUDA_ROW_THREADS, 0};
    return l;
}

td_cuda_launch td_cuda_fp_launch(uint64_t n) {
    (void)n; /* one block: the partial results of blocks would need a second pass */
    td_cuda_launch l = {1, 1, TD_CUDA_FP_THREADS, 0};
    return l;
}
