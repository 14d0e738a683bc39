/* libFuzzer target: the GGUF loader, the architecture binding and, for a
 * model small enough, one forward of the reference (two tokens) with taps
 * off. Seeds are the fixture models (fuzz/run.sh: tapdiff fixture). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "gguf.h"
#include "model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    td_err err;
    td_gguf *g = NULL;
    if (td_gguf_open_mem(&g, data, size, "fuzz", &err) != TD_OK) return 0;
    td_model *m = NULL;
    if (td_model_bind(&m, g, &err) != TD_OK) return 0;
    const td_backend_vt *vt = td_backend_find("ref32");
    // A forward costs E*F*layers; the fixtures are ~1e6 weights. Larger
    // dimensions a mutation invents are skipped, not run.
    if (vt && m->hp.n_vocab > 1 && m->hp.n_vocab < 70000 && m->hp.n_embd <= 1024 && m->hp.n_layer <= 8 &&
        m->hp.n_ff <= 4096) {
        td_backend_params p = {.threads = 1, .n_ctx = 4};
        td_backend *b = NULL;
        if (vt->open(&b, m, &p, &err) == TD_OK) {
            int32_t toks[2] = {1, (int32_t)(m->hp.n_vocab - 1)};
            double *lg = malloc(2 * (size_t)m->hp.n_vocab * sizeof *lg);
            b->vt->forward(b, toks, 2, 0, NULL, lg, &err);
            free(lg);
            b->vt->close(b);
        }
    }
    td_model_close(m);
    return 0;
}
