/* tapdiff cuda backend: the device layer. Everything that touches the CUDA
 * runtime is behind these C functions (kernels.cu), so cuda.c is plain C17
 * and the runtime is linked statically (libcudart_static, which loads the
 * driver with dlopen on first use): tapdiff starts on a machine without a
 * driver and the backend's probe says why it cannot run.
 *
 * Kernels are queued on the default stream and return at once; only
 * td_cuda_d2h and td_cuda_fingerprint wait for the device. A launch error
 * is sticky in the runtime and reported by the next td_cuda_check.
 * A library: no printing, no exit(). */
#ifndef TD_CUDA_DEV_H
#define TD_CUDA_DEV_H

#include <stddef.h>
#include <stdint.h>

#include "tap.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 0 when a device can run our kernels (its description in what), else
 * nonzero with the reason in what ("no CUDA driver", "no device", ...). */
int td_cuda_probe(char *what, size_t n);
/* Copies the grid-type codebooks to the device (once per process). */
int td_cuda_upload_tables(char *why, size_t n);
/* 0, or nonzero with the pending runtime error in why. */
int td_cuda_check(char *why, size_t n);

void *td_cuda_alloc(size_t bytes); /* NULL on failure */
void td_cuda_free(void *p);
int td_cuda_h2d(void *dst, const void *src, size_t bytes);
int td_cuda_d2h(void *dst, const void *src, size_t bytes); /* waits */
int td_cuda_d2d(void *dst, const void *src, size_t bytes);

/* Fault switches of the device kernels (backends/faults.h). */
enum {
    TD_CUDA_BUG_NOSYNC = 1u << 0,      /* cuda_sync_missing: the RMSNorm reduction reads before the barrier */
    TD_CUDA_BUG_SMEM_STRIDE = 1u << 1, /* cuda_smem_stride: attention reads its scores with stride 2 */
};

/* out (T, n) = rows tokens[t] of the embedding W (type, row_bytes per row). */
void td_cuda_get_rows(int type, const void *W, size_t row_bytes, int64_t n, const int32_t *tokens, int64_t T,
                      float *out);
/* y[p][r * ys + ...]: rows row0 + e(p) * rows_per_expert + r (r < n_out) of W
 * (n_in values each) times x[p or token of p]. Dense (topk NULL, pairs = T):
 * y (T, ys) = x (T, xs) W^T + bias. MoE (topk (T*K) expert ids): pair p =
 * t*K + j uses expert topk[p] and x row t (x_per_pair 0) or p (1). */
void td_cuda_matmul(int type, const void *W, size_t row_bytes, int64_t n_in, int64_t row0, int64_t n_out,
                    const float *x, int64_t xs, float *y, int64_t ys, int64_t pairs, const float *bias,
                    const int32_t *topk, int64_t rows_per_expert, int x_per_pair, int64_t K);
/* out (rows, n) = w * x / sqrt(mean(x^2) + eps), the sum in double */
void td_cuda_rmsnorm(float *out, const float *x, const float *w, float eps, int64_t rows, int64_t n, unsigned bugs);
/* rotates x (T, n_heads, D) in place with the tables cs/sn (T, half) */
void td_cuda_rope(float *x, int64_t T, int64_t n_heads, int64_t D, int64_t half, int norm_pairs, const float *cs,
                  const float *sn);
/* ctx (T, H*D): causal attention of queries at pos0.. over the caches
 * (n_ctx, Hkv*D); query head h reads KV head g(h) = h / (H/Hkv) */
void td_cuda_attention(float *ctx, const float *q, const float *kc, const float *vc, int64_t T, int64_t H,
                       int64_t Hkv, int64_t D, int64_t pos0, float scale, unsigned bugs);
void td_cuda_softmax_rows(float *out, const float *x, int64_t rows, int64_t n);
/* out = silu(gate) * up (gate NULL: silu(up)) */
void td_cuda_swiglu(float *out, const float *gate, const float *up, int64_t n);
void td_cuda_add(float *x, const float *y, int64_t n); /* x += y */
/* per token: top-K of probs (X) with the reference's tie order (lower index
 * first) and renormalised weights (forward.h's rule) */
void td_cuda_moe_route(int32_t *topk, float *w, const float *probs, int64_t T, int64_t X, int64_t K);
/* out (T, E) = sum over slots j in rank order of w[t][j] * ys[t*K+j] */
void td_cuda_moe_combine(float *out, const float *ys, const float *w, int64_t T, int64_t K, int64_t E);
/* fp = td_fingerprint of n values (dtype TD_DT_F32 or TD_DT_I32) on the
 * device; waits. scratch: td_cuda_fp_scratch_bytes() of device memory. */
size_t td_cuda_fp_scratch_bytes(void);
int td_cuda_fingerprint(td_fingerprint *fp, td_dtype dtype, const void *d, uint64_t n, void *scratch);

/* The block decode dispatch the kernels use, run on the host (compiled by
 * nvcc from the same source): the values of decode unit `chunk` of a row of
 * n_in values of weight type `type` (cuda_launch.h's td_cuda_type_chunk),
 * as doubles.
 * Returns the number of values, 0 for a type the kernels do not decode. */
int td_cuda_host_decode(int type, const uint8_t *row, int64_t n_in, int64_t chunk, double *y);
/* The routing of one token as k_moe_route computes it, run on the host. */
void td_cuda_host_moe_route(int32_t *topk, float *w, const float *probs, int64_t X, int64_t K);

#ifdef __cplusplus
}
#endif
#endif
