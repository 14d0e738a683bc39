/* tapdiff backend registry: every forward the CLI and the harness can name.
 * Add a backend by appending its table to `backends` (optional ones under
 * their build flag). */
#include <string.h>

#include "backend.h"
#include "cpu.h"
#include "reference.h"
#ifdef TD_HAVE_LLAMACPP
#include "llamacpp.h"
#endif

static const td_backend_vt *const backends[] = {
    &td_ref_backend_f64, /* "ref": the f64 oracle */
    &td_ref_backend_f32, /* "ref32": the same code in f32, the control arm */
    &td_cpu_backend,     /* "cpu": the optimized CPU forward (backends/cpu) */
#ifdef TD_HAVE_LLAMACPP
    &td_llamacpp_backend, /* "llamacpp": llama.cpp itself, a tapped peer */
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
