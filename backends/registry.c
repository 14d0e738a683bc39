/* tapdiff backend registry: every forward the CLI and the harness can name.
 * Add a backend by appending its table to `backends` (optional ones under
 * their build flag). */
#include <stdio.h>
#include <string.h>

#include "backend.h"
#include "cpu.h"
#include "reference.h"
#ifdef TD_HAVE_LLAMACPP
#include "llamacpp.h"
#endif
#ifdef TD_HAVE_CUDA
#include "cuda.h"
#endif

static const td_backend_vt *const backends[] = {
    &td_ref_backend_f64, /* "ref": the f64 oracle */
    &td_ref_backend_f32, /* "ref32": the same code in f32, the control arm */
    &td_cpu_backend,     /* "cpu": the optimized CPU forward (backends/cpu) */
#ifdef TD_HAVE_LLAMACPP
    &td_llamacpp_backend,        /* "llamacpp": llama.cpp itself, a tapped peer */
    &td_llamacpp_vulkan_backend, /* "llamacpp:vulkan": the same on llama.cpp's Vulkan backend */
    &td_llamacpp_cuda_backend,   /* "llamacpp:cuda": the same on llama.cpp's CUDA backend */
#endif
#ifdef TD_HAVE_CUDA
    &td_cuda_backend, /* "cuda": our own CUDA forward (backends/cuda) */
#endif
    NULL,
};

const td_backend_vt *const *td_backend_list(void) {
    return backends;
}

const td_backend_vt *td_backend_find(const char *name) {
    if (!name) return NULL;
    for (size_t i = 0; backends[i]; i++)
        if (!strcmp(backends[i]->name, name)) return backends[i];
    return NULL;
}

const char *td_backend_absent_reason(const char *name) {
    static const struct {
        const char *name, *why;
    } known[] = {
        {"llamacpp", "backend 'llamacpp' is not built into this tapdiff: run ci/fetch-llamacpp.sh (needs npm and the "
                     "npm registry), then `meson setup --reconfigure BUILD_DIR` and rebuild"},
        {"llamacpp:vulkan", "backend 'llamacpp:vulkan' is not built into this tapdiff: run ci/fetch-llamacpp.sh "
                            "(needs npm and the npm registry), then `meson setup --reconfigure BUILD_DIR` and rebuild"},
        {"llamacpp:cuda", "backend 'llamacpp:cuda' is not built into this tapdiff: run ci/fetch-llamacpp.sh --cuda, "
                          "then `meson setup --reconfigure BUILD_DIR` and rebuild"},
        {"cuda", "backend 'cuda' is not built into this tapdiff (it needs nvcc at configure time, -Dcuda=auto or "
                 "enabled, and a GPU to run)"},
        {"metal", "backend 'metal' is not built into this tapdiff (macOS only)"},
        {"cpu", "backend 'cpu' is not built into this tapdiff"},
    };
    if (!name || td_backend_find(name)) return NULL;
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (!strcmp(name, known[i].name)) return known[i].why;
    return NULL;
}

void td_backend_names(char *buf, size_t bufsz) {
    if (!bufsz) return;
    buf[0] = '\0';
    for (size_t i = 0; backends[i]; i++) {
        size_t len = strlen(buf);
        if (len + 1 >= bufsz) break;
        snprintf(buf + len, bufsz - len, "%s%s", len ? ", " : "", backends[i]->name);
    }
}
