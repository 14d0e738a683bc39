/* tapdiff bench: the benchmark model generator. A llama model big enough to
 * make decode memory-bound (~200M parameters, far above any last-level
 * cache), with random weights of realistic scale, written by tapdiff's own
 * GGUF writer (fixtures/gguf_writer.h, fixtures/quantize.h) so our cpu
 * backend and llama.cpp read exactly the same file. Not a fixture: nothing
 * checks its outputs, only how fast they come. Files go to an ignored
 * folder (bench/side_by_side.sh uses out/bench/), never into git. */
#ifndef TD_BENCH_MODEL_H
#define TD_BENCH_MODEL_H

#include <stdint.h>

#include "td_common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct td_bench_model_cfg {
    uint32_t n_embd;    /* E */
    uint32_t n_layer;
    uint32_t n_head;    /* H */
    uint32_t n_head_kv; /* Hkv */
    uint32_t n_ff;      /* F */
    uint32_t n_vocab;   /* V */
    uint64_t seed;
} td_bench_model_cfg;

/* "200m": E=1024, 12 layers, H=16, Hkv=4 (D=64), F=2816, V=32000:
 * 200.5M parameters (Q4_K 113 MB, Q8_0 213 MB, F16 401 MB).
 * "tiny": E=256, 2 layers, H=4, Hkv=2, F=512, V=1024 (for tests).
 * Returns 0 for an unknown name. */
int td_bench_model_preset(const char *name, td_bench_model_cfg *cfg);

/* Parameter count of the model (every weight, norms included). */
uint64_t td_bench_model_params(const td_bench_model_cfg *cfg);

/* Writes the model to path with every 2-D weight of type `type` (a type the
 * quantizer supports, e.g. TD_TYPE_Q4_K / Q8_0 / F16; E and F must be
 * multiples of its block size) and F32 norms. TD_EINPUT for a type without a
 * quantizer or a block size that does not divide E or F, TD_EINTERNAL for an
 * I/O failure. */
int td_bench_model_write(const char *path, const td_bench_model_cfg *cfg, int type, td_err *err);

#ifdef __cplusplus
}
#endif
#endif
