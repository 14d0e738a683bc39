// tapdiff cuda backend: the device kernels and the runtime calls behind
// cuda_dev.h. One kernel per operation, no templates: the weight type is a
// run-time switch over model/blocks.h's per-block decoders (compiled for the
// device from the same source as the C loader), so every type the loader
// decodes is covered by one matrix-product kernel. Activations are f32;
// products and norms accumulate in double (the decoders produce doubles),
// which keeps the arm at least as close to the f64 oracle as ref32 is.
// Refuses: tensor cores, quantized activations, fused graphs: this arm is
// for localizing, its speed is measured, not tuned for.
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

// device copies of the grid-type codebooks (model/iq_grids.c), filled by
// td_cuda_upload_tables; host code keeps using the loader's tables
__device__ uint8_t d_iq2xxs_grid[256][8], d_iq2xs_grid[512][8], d_iq2s_grid[1024][8], d_iq3xxs_grid[256][4],
    d_iq3s_grid[512][4], d_iq_ksigns[128];
__device__ int8_t d_iq1s_grid[2048][8];
#ifdef __CUDA_ARCH__
#define TD_IQ_TABLE(name) d_##name
#else
#define TD_IQ_TABLE(name) td_##name
#endif
#include "blocks.h"
#include "cuda_dev.h"
#include "cuda_launch.h"
#include "types.h"


// ---- decode dispatch (host and device) -----------------------------------

// The values of decode unit `c` of a row of n_in values; returns how many.
TD_HD static int dec_chunk(int type, const uint8_t *row, int64_t n_in, int64_t c, double *y) {
    switch (type) {
    case TD_TYPE_F32:
    case TD_TYPE_F16:
    case TD_TYPE_BF16:
    case TD_TYPE_F64: {
        int64_t i0 = 32 * c, n = n_in - i0 < 32 ? n_in - i0 : 32;
        for (int64_t i = 0; i < n; i++) {
            if (type == TD_TYPE_F32) {
                float f;
                memcpy(&f, row + 4 * (i0 + i), 4);
                y[i] = f;
            } else if (type == TD_TYPE_F64) {
                memcpy(&y[i], row + 8 * (i0 + i), 8);
            } else {
                uint16_t h = td_blk_u16(row + 2 * (i0 + i));
                y[i] = type == TD_TYPE_F16 ? td_blk_f16(h) : td_blk_bf16(h);
            }
        }
        return (int)n;
    }
#define BLK(T, S, fn)                                                                                              \
    case T: fn(row + c * (int64_t)sizeof(S), y); return (int)((T == TD_TYPE_Q4_0 || T == TD_TYPE_Q4_1 ||          \
                                                             T == TD_TYPE_Q5_0 || T == TD_TYPE_Q5_1 ||           \
                                                             T == TD_TYPE_Q8_0 || T == TD_TYPE_MXFP4 ||          \
                                                             T == TD_TYPE_IQ4_NL) ? 32                           \
                                                            : T == TD_TYPE_Q1_0 ? 128                            \
                                                            : T == TD_TYPE_Q2_0 || T == TD_TYPE_NVFP4 ? 64       \
                                                            : 256);
        BLK(TD_TYPE_Q4_0, td_blk_q4_0, td_blk_dec_q4_0)
        BLK(TD_TYPE_Q4_1, td_blk_q4_1, td_blk_dec_q4_1)
        BLK(TD_TYPE_Q5_0, td_blk_q5_0, td_blk_dec_q5_0)
        BLK(TD_TYPE_Q5_1, td_blk_q5_1, td_blk_dec_q5_1)
        BLK(TD_TYPE_Q8_0, td_blk_q8_0, td_blk_dec_q8_0)
        BLK(TD_TYPE_Q1_0, td_blk_q1_0, td_blk_dec_q1_0)
        BLK(TD_TYPE_Q2_0, td_blk_q2_0, td_blk_dec_q2_0)
        BLK(TD_TYPE_MXFP4, td_blk_mxfp4, td_blk_dec_mxfp4)
        BLK(TD_TYPE_IQ4_NL, td_blk_iq4_nl, td_blk_dec_iq4_nl)
        BLK(TD_TYPE_IQ4_XS, td_blk_iq4_xs, td_blk_dec_iq4_xs)
        BLK(TD_TYPE_Q2_K, td_blk_q2_k, td_blk_dec_q2_k)
        BLK(TD_TYPE_Q3_K, td_blk_q3_k, td_blk_dec_q3_k)
        BLK(TD_TYPE_Q4_K, td_blk_q4_k, td_blk_dec_q4_k)
        BLK(TD_TYPE_Q5_K, td_blk_q5_k, td_blk_dec_q5_k)
        BLK(TD_TYPE_Q6_K, td_blk_q6_k, td_blk_dec_q6_k)
        BLK(TD_TYPE_Q8_K, td_blk_q8_k, td_blk_dec_q8_k)
        BLK(TD_TYPE_TQ1_0, td_blk_tq1_0, td_blk_dec_tq1_0)
        BLK(TD_TYPE_TQ2_0, td_blk_tq2_0, td_blk_dec_tq2_0)
        BLK(TD_TYPE_IQ2_XXS, td_blk_iq2_xxs, td_blk_dec_iq2_xxs)
        BLK(TD_TYPE_IQ2_XS, td_blk_iq2_xs, td_blk_dec_iq2_xs)
        BLK(TD_TYPE_IQ2_S, td_blk_iq2_s, td_blk_dec_iq2_s)
        BLK(TD_TYPE_IQ3_XXS, td_blk_iq3_xxs, td_blk_dec_iq3_xxs)
        BLK(TD_TYPE_IQ3_S, td_blk_iq3_s, td_blk_dec_iq3_s)
        BLK(TD_TYPE_IQ1_S, td_blk_iq1_s, td_blk_dec_iq1_s)
        BLK(TD_TYPE_IQ1_M, td_blk_iq1_m, td_blk_dec_iq1_m)
        BLK(TD_TYPE_NVFP4, td_blk_nvfp4, td_blk_dec_nvfp4)
#undef BLK
    default: return 0;
    }
}

extern "C" int td_cuda_host_decode(int type, const uint8_t *row, int64_t n_in, int64_t chunk, double *y) {
    return dec_chunk(type, row, n_in, chunk, y);
}

// ---- reductions -------------------------------------------------------------

__device__ static double warp_sum(double v) {
    for (int o = TD_CUDA_WARP / 2; o > 0; o /= 2) v += __shfl_down_sync(0xffffffffu, v, o);
    return v;
}

__device__ static double warp_max(double v) {
    for (int o = TD_CUDA_WARP / 2; o > 0; o /= 2) v = fmax(v, __shfl_down_sync(0xffffffffu, v, o));
    return v;
}

// Block-wide sum (is_max: max) of v, the same value in every thread. red:
// shared scratch of one double per warp. The partials are added in warp
// order, so the result does not depend on scheduling. `nosync` is the
// cuda_sync_missing fault: the partials are read before every warp wrote.
__device__ static double block_reduce(double v, int is_max, double *red, int nosync) {
    const int lane = threadIdx.x % TD_CUDA_WARP, warp = threadIdx.x / TD_CUDA_WARP;
    const int nw = (blockDim.x + TD_CUDA_WARP - 1) / TD_CUDA_WARP;
    v = is_max ? warp_max(v) : warp_sum(v);
    __syncthreads(); // red may still be read by the previous reduction
    if (lane == 0) red[warp] = v;
    if (!nosync) __syncthreads();
    double r = red[0];
    for (int w = 1; w < nw; w++) r = is_max ? fmax(r, red[w]) : r + red[w];
    return r;
}

// ---- kernels --------------------------------------------------------------

__global__ void k_get_rows(int type, const uint8_t *W, size_t row_bytes, int64_t n, const int32_t *tokens,
                           float *out, int64_t cv) {
    double y[TD_CUDA_CHUNK_MAX];
    const int64_t t = blockIdx.x, n_chunks = (n + cv - 1) / cv;
    const uint8_t *row = W + (size_t)tokens[t] * row_bytes;
    for (int64_t c = threadIdx.x; c < n_chunks; c += blockDim.x) {
        int m = dec_chunk(type, row, n, c, y);
        for (int i = 0; i < m; i++) out[t * n + c * cv + i] = (float)y[i];
    }
}

__global__ void k_matmul(int type, const uint8_t *W, size_t row_bytes, int64_t n_in, int64_t row0, int64_t n_out,
                         const float *x, int64_t xs, float *y, int64_t ys, int64_t pairs, const float *bias,
                         const int32_t *topk, int64_t rpe, int x_per_pair, int64_t K, int64_t cv) {
    double w[TD_CUDA_CHUNK_MAX];
    const int lane = threadIdx.x % TD_CUDA_WARP;
    const int64_t r = (int64_t)blockIdx.x * TD_CUDA_MV_WARPS + threadIdx.x / TD_CUDA_WARP;
    if (r >= n_out) return; // whole warps leave: the shuffles below see full warps
    const uint8_t *wr;
    const float *xb;
    float *yb;
    int64_t nt;
    if (topk) { // one (token, slot) pair per blockIdx.y, its expert's rows
        const int64_t p = blockIdx.y;
        wr = W + (size_t)(row0 + (int64_t)topk[p] * rpe + r) * row_bytes;
        xb = x + (x_per_pair ? p : p / K) * xs;
        yb = y + p * ys;
        nt = 1;
    } else {
        wr = W + (size_t)(row0 + r) * row_bytes;
        xb = x, yb = y, nt = pairs;
    }
    const int64_t n_chunks = (n_in + cv - 1) / cv;
    for (int64_t t0 = 0; t0 < nt; t0 += TD_CUDA_MM_TILE) {
        const int tile = (int)(nt - t0 < TD_CUDA_MM_TILE ? nt - t0 : TD_CUDA_MM_TILE);
        double acc[TD_CUDA_MM_TILE] = {0};
        for (int64_t c = lane; c < n_chunks; c += TD_CUDA_WARP) {
            const int m = dec_chunk(type, wr, n_in, c, w); // decoded once per tile of tokens
            for (int tt = 0; tt < tile; tt++) {
                const float *xv = xb + (t0 + tt) * xs + c * cv;
                double s = 0;
                for (int i = 0; i < m; i++) s += w[i] * (double)xv[i];
                acc[tt] += s;
            }
        }
        for (int tt = 0; tt < tile; tt++) {
            const double s = warp_sum(acc[tt]);
            if (lane == 0) yb[(t0 + tt) * ys + r] = (float)(s + (bias ? (double)bias[r] : 0.0));
        }
    }
}

__global__ void k_rmsnorm(float *out, const float *x, const float *w, float eps, int64_t n, int nosync) {
    __shared__ double red[TD_CUDA_ROW_THREADS / TD_CUDA_WARP];
    const float *xr = x + (int64_t)blockIdx.x * n;
    float *o = out + (int64_t)blockIdx.x * n;
    double ss = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss += (double)xr[i] * xr[i];
    ss = block_reduce(ss, 0, red, nosync);
    const float inv = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) o[i] = w[i] * (xr[i] * inv);
}

__global__ void k_rope(float *x, int64_t T, int64_t n_heads, int64_t D, int64_t half, int norm_pairs,
                       const float *cs, const float *sn) {
    const int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= T * n_heads * half) return;
    const int64_t i = k % half, th = k / half, t = th / n_heads;
    float *xh = x + th * D;
    // NORM pairs adjacent values; NEOX the two halves of the rotated span
    const int64_t ia = norm_pairs ? 2 * i : i, ib = norm_pairs ? 2 * i + 1 : i + half;
    const float c = cs[t * half + i], s = sn[t * half + i], u = xh[ia], v = xh[ib];
    xh[ia] = u * c - v * s;
    xh[ib] = u * s + v * c;
}

__global__ void k_attention(float *ctx, const float *q, const float *kc, const float *vc, int64_t H, int64_t Hkv,
                            int64_t D, int64_t pos0, float scale, int stride_bug) {
    extern __shared__ float sh[]; // q (D), then the scores
    __shared__ double red[TD_CUDA_ATTN_THREADS / TD_CUDA_WARP];
    const int64_t t = blockIdx.x / H, h = blockIdx.x % H, g = h / (H / Hkv), KD = Hkv * D;
    const int64_t n = pos0 + t + 1; // causal: positions 0..pos, the token itself included
    float *qs = sh, *sc = sh + D;
    const int rs = stride_bug ? 2 : 1; // cuda_smem_stride: written with stride 1, read with 2
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) qs[d] = q[(t * H + h) * D + d];
    __syncthreads();
    for (int64_t s = threadIdx.x; s < n; s += blockDim.x) {
        const float *k = kc + s * KD + g * D;
        double dot = 0;
        for (int64_t d = 0; d < D; d++) dot += (double)qs[d] * k[d];
        sc[s] = scale * (float)dot;
    }
    __syncthreads();
    double mx = -INFINITY;
    for (int64_t s = threadIdx.x; s < n; s += blockDim.x) mx = fmax(mx, (double)sc[s * rs]);
    mx = block_reduce(mx, 1, red, 0);
    double sum = 0;
    for (int64_t s = threadIdx.x; s < n; s += blockDim.x) {
        const float e = expf(sc[s * rs] - (float)mx);
        sc[s * rs] = e;
        sum += e;
    }
    sum = block_reduce(sum, 0, red, 0);
    const float inv = (float)(1.0 / sum);
    __syncthreads();
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
        double acc = 0;
        for (int64_t s = 0; s < n; s++) acc += (double)(sc[s * rs] * inv) * vc[s * KD + g * D + d];
        ctx[(t * H + h) * D + d] = (float)acc;
    }
}

__global__ void k_softmax_rows(float *out, const float *x, int64_t n) {
    __shared__ double red[TD_CUDA_ROW_THREADS / TD_CUDA_WARP];
    const float *xr = x + (int64_t)blockIdx.x * n;
    float *o = out + (int64_t)blockIdx.x * n;
    double mx = -INFINITY;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) mx = fmax(mx, (double)xr[i]);
    mx = block_reduce(mx, 1, red, 0);
    double sum = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) sum += expf(xr[i] - (float)mx);
    sum = block_reduce(sum, 0, red, 0);
    const float inv = (float)(1.0 / sum);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) o[i] = expf(xr[i] - (float)mx) * inv;
}

__global__ void k_swiglu(float *out, const float *gate, const float *up, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float g = gate ? gate[i] : up[i];
    const float s = g / (1.0f + expf(-g));
    out[i] = gate ? s * up[i] : s;
}

__global__ void k_add(float *x, const float *y, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

// forward.h's routing rule for one token: K passes of "largest not yet
// chosen", scanning up and replacing only on a STRICTLY larger value, so the
// lower index wins a tie; weights renormalised with the 2^-14 clamp. Host and
// device: the cuda suite compares it with td_moe_route_f32 on the host.
TD_HD static void route_one(int32_t *tk, float *w, const float *p, int64_t X, int64_t K) {
    for (int64_t j = 0; j < K; j++) {
        int64_t best = -1;
        for (int64_t e = 0; e < X; e++) {
            int taken = 0;
            for (int64_t i = 0; i < j; i++) taken |= tk[i] == e;
            if (taken) continue;
            if (best < 0 || p[e] > p[best]) best = e;
        }
        tk[j] = (int32_t)best;
    }
    float sum = 0;
    for (int64_t j = 0; j < K; j++) sum += p[tk[j]];
    const float z = sum > 0x1p-14f ? sum : 0x1p-14f;
    for (int64_t j = 0; j < K; j++) w[j] = p[tk[j]] / z;
}

extern "C" void td_cuda_host_moe_route(int32_t *topk, float *w, const float *probs, int64_t X, int64_t K) {
    route_one(topk, w, probs, X, K);
}

__global__ void k_moe_route(int32_t *topk, float *w, const float *probs, int64_t T, int64_t X, int64_t K) {
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t < T) route_one(topk + t * K, w + t * K, probs + t * X, X, K);
}

__global__ void k_moe_combine(float *out, const float *ys, const float *w, int64_t T, int64_t K, int64_t E) {
    const int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= T * E) return;
    const int64_t t = k / E, i = k % E;
    float acc = 0;
    for (int64_t j = 0; j < K; j++) acc += w[t * K + j] * ys[(t * K + j) * E + i];
    out[k] = acc;
}

// td_fingerprint (tap.h) of n values, one block: the same definition as the
// host's, the sums in another order (allowed: they may differ in last bits).
__global__ void k_fingerprint(td_fingerprint *fp, int is_i32, const void *data, uint64_t n) {
    __shared__ double red[TD_CUDA_FP_THREADS / TD_CUDA_WARP];
    double mn = INFINITY, mx = -INFINITY, mabs = 0, s = 0, sa = 0, sq = 0, nf = 0, nz = 0, fin = 0;
    for (uint64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const double v = is_i32 ? (double)((const int32_t *)data)[i] : (double)((const float *)data)[i];
        nz += v != 0;
        if (!isfinite(v)) {
            nf += 1;
            continue;
        }
        fin += 1;
        mn = fmin(mn, v), mx = fmax(mx, v), mabs = fmax(mabs, fabs(v));
        s += v, sa += fabs(v), sq += v * v;
    }
    mn = -block_reduce(-mn, 1, red, 0);
    mx = block_reduce(mx, 1, red, 0);
    mabs = block_reduce(mabs, 1, red, 0);
    s = block_reduce(s, 0, red, 0);
    sa = block_reduce(sa, 0, red, 0);
    sq = block_reduce(sq, 0, red, 0);
    nf = block_reduce(nf, 0, red, 0);
    nz = block_reduce(nz, 0, red, 0);
    fin = block_reduce(fin, 0, red, 0);
    if (threadIdx.x) return;
    fp->count = n;
    fp->n_nonfinite = (uint64_t)nf;
    fp->n_nonzero = (uint64_t)nz;
    fp->min = fin > 0 ? mn : NAN;
    fp->max = fin > 0 ? mx : NAN;
    fp->max_abs = fin > 0 ? mabs : NAN;
    fp->sum = s, fp->sum_abs = sa, fp->sum_sq = sq;
    for (uint64_t i = 0; i < 4; i++)
        fp->first[i] = i < n ? (is_i32 ? (double)((const int32_t *)data)[i] : (double)((const float *)data)[i]) : NAN;
}

// ---- host side ----------------------------------------------------------------

static int fail(char *why, size_t n, const char *what, cudaError_t e) {
    if (why && n) snprintf(why, n, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
    return 1;
}

extern "C" int td_cuda_probe(char *what, size_t n) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice || (e == cudaSuccess && count == 0)) {
        if (what && n)
            snprintf(what, n, "no CUDA device here (%s)",
                     e == cudaErrorInsufficientDriver ? "no NVIDIA driver, or one older than the runtime"
                                                      : "the driver sees no device");
        return 1;
    }
    if (e != cudaSuccess) return fail(what, n, "cudaGetDeviceCount", e);
    cudaDeviceProp p;
    if ((e = cudaGetDeviceProperties(&p, 0)) != cudaSuccess) return fail(what, n, "cudaGetDeviceProperties", e);
    int rt = 0, drv = 0;
    cudaRuntimeGetVersion(&rt);
    cudaDriverGetVersion(&drv);
    if (what && n)
        snprintf(what, n, "%s (sm_%d%d, %.0f GiB, %d SMs), runtime %d, driver %d", p.name, p.major, p.minor,
                 (double)p.totalGlobalMem / (1024.0 * 1024 * 1024), p.multiProcessorCount, rt, drv);
    return 0;
}

extern "C" int td_cuda_upload_tables(char *why, size_t n) {
    cudaError_t e;
#define UP(name)                                                                                                   \
    if ((e = cudaMemcpyToSymbol(d_##name, td_##name, sizeof td_##name)) != cudaSuccess)                            \
        return fail(why, n, "copying " #name " to the device", e);
    UP(iq2xxs_grid) UP(iq2xs_grid) UP(iq2s_grid) UP(iq3xxs_grid) UP(iq3s_grid) UP(iq_ksigns) UP(iq1s_grid)
#undef UP
    return 0;
}

extern "C" int td_cuda_check(char *why, size_t n) {
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? 0 : fail(why, n, "kernel launch", e);
}

extern "C" void *td_cuda_alloc(size_t bytes) {
    void *p = NULL;
    return cudaMalloc(&p, bytes ? bytes : 1) == cudaSuccess ? p : NULL;
}
extern "C" void td_cuda_free(void *p) {
    if (p) cudaFree(p);
}
extern "C" int td_cuda_h2d(void *dst, const void *src, size_t bytes) {
    return cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice) != cudaSuccess;
}
extern "C" int td_cuda_d2h(void *dst, const void *src, size_t bytes) {
    return cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost) != cudaSuccess;
}
extern "C" int td_cuda_d2d(void *dst, const void *src, size_t bytes) {
    return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, 0) != cudaSuccess;
}

static int64_t chunk_vals(int type) {
    int64_t v = 0, b = 0;
    return td_cuda_type_chunk(type, &v, &b) ? v : 32;
}

extern "C" void td_cuda_get_rows(int type, const void *W, size_t row_bytes, int64_t n, const int32_t *tokens,
                                 int64_t T, float *out) {
    k_get_rows<<<(unsigned)T, TD_CUDA_WARP>>>(type, (const uint8_t *)W, row_bytes, n, tokens, out, chunk_vals(type));
}

extern "C" void td_cuda_matmul(int type, const void *W, size_t row_bytes, int64_t n_in, int64_t row0, int64_t n_out,
                               const float *x, int64_t xs, float *y, int64_t ys, int64_t pairs, const float *bias,
                               const int32_t *topk, int64_t rows_per_expert, int x_per_pair, int64_t K) {
    const td_cuda_launch l = td_cuda_mm_launch(n_out, topk ? pairs : 1);
    k_matmul<<<dim3(l.grid_x, l.grid_y), l.block, l.smem>>>(type, (const uint8_t *)W, row_bytes, n_in, row0, n_out,
                                                           x, xs, y, ys, pairs, bias, topk, rows_per_expert,
                                                           x_per_pair, K, chunk_vals(type));
}

extern "C" void td_cuda_rmsnorm(float *out, const float *x, const float *w, float eps, int64_t rows, int64_t n,
                                unsigned bugs) {
    const td_cuda_launch l = td_cuda_row_launch(rows, n);
    k_rmsnorm<<<l.grid_x, l.block>>>(out, x, w, eps, n, (bugs & TD_CUDA_BUG_NOSYNC) != 0);
}

extern "C" void td_cuda_rope(float *x, int64_t T, int64_t n_heads, int64_t D, int64_t half, int norm_pairs,
                             const float *cs, const float *sn) {
    const td_cuda_launch l = td_cuda_elem_launch(T * n_heads * half);
    k_rope<<<l.grid_x, l.block>>>(x, T, n_heads, D, half, norm_pairs, cs, sn);
}

extern "C" void td_cuda_attention(float *ctx, const float *q, const float *kc, const float *vc, int64_t T, int64_t H,
                                  int64_t Hkv, int64_t D, int64_t pos0, float scale, unsigned bugs) {
    const td_cuda_launch l = td_cuda_attn_launch(T, H, pos0 + T, D);
    k_attention<<<l.grid_x, l.block, l.smem>>>(ctx, q, kc, vc, H, Hkv, D, pos0, scale,
                                               (bugs & TD_CUDA_BUG_SMEM_STRIDE) != 0);
}

extern "C" void td_cuda_softmax_rows(float *out, const float *x, int64_t rows, int64_t n) {
    const td_cuda_launch l = td_cuda_row_launch(rows, n);
    k_softmax_rows<<<l.grid_x, l.block>>>(out, x, n);
}

extern "C" void td_cuda_swiglu(float *out, const float *gate, const float *up, int64_t n) {
    const td_cuda_launch l = td_cuda_elem_launch(n);
    k_swiglu<<<l.grid_x, l.block>>>(out, gate, up, n);
}

extern "C" void td_cuda_add(float *x, const float *y, int64_t n) {
    const td_cuda_launch l = td_cuda_elem_launch(n);
    k_add<<<l.grid_x, l.block>>>(x, y, n);
}

extern "C" void td_cuda_moe_route(int32_t *topk, float *w, const float *probs, int64_t T, int64_t X, int64_t K) {
    const td_cuda_launch l = td_cuda_elem_launch(T);
    k_moe_route<<<l.grid_x, l.block>>>(topk, w, probs, T, X, K);
}

extern "C" void td_cuda_moe_combine(float *out, const float *ys, const float *w, int64_t T, int64_t K, int64_t E) {
    const td_cuda_launch l = td_cuda_elem_launch(T * E);
    k_moe_combine<<<l.grid_x, l.block>>>(out, ys, w, T, K, E);
}

extern "C" size_t td_cuda_fp_scratch_bytes(void) { return sizeof(td_fingerprint); }

extern "C" int td_cuda_fingerprint(td_fingerprint *fp, td_dtype dtype, const void *d, uint64_t n, void *scratch) {
    const td_cuda_launch l = td_cuda_fp_launch(n);
    k_fingerprint<<<l.grid_x, l.block>>>((td_fingerprint *)scratch, dtype == TD_DT_I32, d, n);
    return td_cuda_d2h(fp, scratch, sizeof *fp);
}
