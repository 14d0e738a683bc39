/* tapdiff llamacpp backend: llama.cpp's own library (the prebuilt shared
 * libraries of the npm package @node-llama-cpp/linux-x64, fetched by
 * ci/fetch-llamacpp.sh) run as a tapped peer. Its eval callback observes
 * the graph nodes and maps them to canonical taps
 * (../shared/spec/llamacpp-peer.md). Built only when the libraries were
 * found at configure time (TD_HAVE_LLAMACPP); this header is then the only
 * way in, and it declares nothing of llama.cpp itself.
 *
 * Deterministic settings, always: one pinned CPU variant (chosen by CPU
 * features, recorded in the version string), flash attention off, F32 K/V
 * cache, n_batch = n_ubatch = n_ctx (a prefill is one graph), logits for
 * every position, no weight repacking.
 *
 * Environment:
 *   TD_LLAMACPP_ALL_NODES=1   also emit every computing node that has no
 *                             canonical name, as "llamacpp.<node>.<OP>"
 *                             (".<n>" appended for the n-th repeat in a step),
 *                             and blk.L.attn_probs [H, T, n_kv]; attention
 *                             nodes are sliced to the used KV cells. Pure
 *                             views and KV-cache writes are never emitted.
 *   TD_LLAMACPP_CPU_VARIANT=V pin libggml-cpu-V.so instead of the automatic
 *                             choice (haswell with AVX2+FMA, else sse42 with
 *                             SSE4.2, else x64); read once per process. */
#ifndef TD_LLAMACPP_H
#define TD_LLAMACPP_H

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The backend tables (registered in backends/registry.c): "llamacpp" (CPU),
 * "llamacpp:vulkan" and "llamacpp:cuda" (llama.cpp's device backends, loaded
 * at run time from .deps/llamacpp-vulkan and .deps/llamacpp-cuda; open and
 * probe give TD_SKIP with the reason when the library, its runtime or a
 * device is missing). */
extern const td_backend_vt td_llamacpp_backend;
extern const td_backend_vt td_llamacpp_vulkan_backend;
extern const td_backend_vt td_llamacpp_cuda_backend;

/* Process-wide set-up, done once (later calls return the first result):
 * silences llama.cpp's logging, loads the pinned CPU variant, then
 * llama_backend_init. TD_SKIP when the CPU backend library cannot be loaded.
 * open() calls it; tests may call it first. */
int td_llamacpp_init(td_err *err);

/* The CPU variant pinned by td_llamacpp_init ("haswell", ...), NULL before. */
const char *td_llamacpp_cpu_variant(void);
/* The canonical taps the node rules map to ("blk.L.attn_q" for a layered
 * rule), i-th of them, NULL past the end: the test checks each is in the
 * tap catalog. */
const char *td_llamacpp_mapped_tap(size_t i, char *buf, size_t cap);
/* llama.cpp's own verdict on a GGUF file: its loader alone (CPU, no
 * context), without tapdiff's. TD_OK when it loads (the model is freed
 * again), TD_EINPUT with llama.cpp's last error line in err otherwise. A
 * file that trips one of llama.cpp's asserts aborts the process: callers
 * that feed it malformed files run it in a child. */
int td_llamacpp_load_check(const char *path, td_err *err);

/* The arms run in tapdiff's process: a crash of the peer (llama.cpp, its GPU
 * backend, the device's driver in one of its threads) would end tapdiff with
 * only the shell's "Segmentation fault". open() of a GPU arm calls this with
 * on=1 (its close with on=0): while one is open, a handler of SIGSEGV, SIGBUS,
 * SIGILL, SIGFPE and SIGABRT writes to stderr which arm crashed, in which
 * thread and step, then passes the signal on to the handler it replaced (the
 * default: exit status 128 + signal, never 0 or 1). Installed on the first
 * call; arm is kept, not copied. */
void td_llamacpp_crash_guard(const char *arm, int on);

#ifdef __cplusplus
}
#endif
#endif
