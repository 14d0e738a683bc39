/* tapdiff "cuda": our own forward on an NVIDIA GPU (llama, qwen3, qwen3moe;
 * every weight type the loader decodes), registered in backends/registry.c
 * when meson found nvcc.
 *
 *   - weights stay in their stored format in device memory; one matrix
 *     kernel decodes them with model/blocks.h's per-block decoders compiled
 *     for the device; activations and the KV cache are f32 in device memory,
 *     products and norms accumulate in double: arithmetic profile "native",
 *     so ref32 is its control arm;
 *   - taps: td_tap_want per tap; fingerprints are computed on the device and
 *     only 80 bytes cross; full data is copied for the taps the sink keeps;
 *     with taps off nothing is copied or waited for but the logits;
 *   - the tokens of every step come from the caller (the runner), uploaded
 *     per step; nothing is fed back from device memory;
 *   - faults: stale_token, cuda_sync_missing, cuda_smem_stride (faults.h).
 * open exits with TD_SKIP (77) where no driver or device exists. */
#ifndef TD_CUDA_H
#define TD_CUDA_H

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

extern const td_backend_vt td_cuda_backend;

#ifdef __cplusplus
}
#endif
#endif
