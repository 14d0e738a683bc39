/* tapdiff cuda backend: launch configurations and shapes, in plain C so that
 * the host-side tests check them where no GPU exists. The kernels
 * (kernels.cu) take their grid, block and shared-memory sizes from here and
 * nowhere else; a wrong size here is a wrong launch there.
 * A library: no printing, no exit(). */
#ifndef TD_CUDA_LAUNCH_H
#define TD_CUDA_LAUNCH_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TD_CUDA_WARP 32
/* warps per block of the matrix products: one warp per output row */
#define TD_CUDA_MV_WARPS 4
/* tokens whose activations one decoded weight chunk is multiplied with before
 * the next chunk is decoded (the prefill tile) */
#define TD_CUDA_MM_TILE 8
/* threads of the row kernels (norms, softmax) and of the fingerprint reduction */
#define TD_CUDA_ROW_THREADS 256
#define TD_CUDA_FP_THREADS 1024
#define TD_CUDA_ATTN_THREADS 128
/* the largest decode unit: a K/IQ/TQ super-block */
#define TD_CUDA_CHUNK_MAX 256
/* static shared memory a block may use without opting in */
#define TD_CUDA_SMEM_DEFAULT 49152u

typedef struct td_cuda_launch {
    uint32_t grid_x, grid_y; /* blocks */
    uint32_t block;          /* threads per block */
    size_t smem;             /* dynamic shared memory, bytes */
} td_cuda_launch;

/* The decode unit of weight type `type` (td_type id): `vals` values in
 * `bytes` bytes (a block; plain types F32/F16/BF16/F64 in runs of 32 values).
 * 0 when the device kernels do not decode the type. */
int td_cuda_type_chunk(int type, int64_t *vals, int64_t *bytes);

/* Matrix product of n_out rows over T tokens: one warp per row, tokens in
 * tiles of TD_CUDA_MM_TILE inside the warp; grid_y = pairs (MoE: T*K
 * (token, slot) pairs, else 1). */
td_cuda_launch td_cuda_mm_launch(int64_t n_out, int64_t pairs);

/* One block per row of n values (RMSNorm, softmax). */
td_cuda_launch td_cuda_row_launch(int64_t rows, int64_t n);

/* Attention: one block per (token, head); shared memory holds the query
 * (D floats) and the scores of n_kv positions laid out with `stride` floats
 * between them (1 normally; the smem_stride fault reads with 2, so the
 * buffer always has room for twice the positions). */
td_cuda_launch td_cuda_attn_launch(int64_t T, int64_t H, int64_t n_kv, int64_t D);
/* The most KV positions attention fits in the default shared memory for
 * head dim D (0 when not even one). */
int64_t td_cuda_attn_max_ctx(int64_t D);

/* Elementwise kernels over n values. */
td_cuda_launch td_cuda_elem_launch(int64_t n);

/* The fingerprint reduction over n values: one block, grid-stride. */
td_cuda_launch td_cuda_fp_launch(uint64_t n);

#ifdef __cplusplus
}
#endif
#endif
