/* tapdiff: the one interface every forward implements (the reference too),
 * so any arm can be compared with any other. A table of function pointers
 * plus a context, like ggml's backends and dav1d's DSP tables; optional
 * entries say so. */
#ifndef TD_BACKEND_H
#define TD_BACKEND_H

#include "model.h"
#include "tap.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct td_backend_params {
    int threads;           /* 0 = backend default */
    uint32_t n_ctx;        /* KV capacity in positions (prompt + decode steps) */
    const char *inject;    /* named fault (faults.h) the backend implements, NULL = none */
    const char *profile;   /* arithmetic profile to emulate, NULL = native */
    uint32_t n_seq;        /* sequences the caller will use (state operations), 0 = 1 */
} td_backend_params;

/* Sequences a backend with state operations holds at most (ids 0..TD_SEQ_MAX-1). */
#define TD_SEQ_MAX 4

typedef struct td_backend td_backend;

typedef struct td_backend_vt {
    const char *name;       /* "ref", "ref32", "cpu", ... */
    const char *precision;  /* "f64", "f32", ... (tap file attribute) */
    /* Allocate state for `model` (borrowed; outlives the backend). */
    int (*open)(td_backend **out, const td_model *model, const td_backend_params *p, td_err *err);
    /* One forward over n_tokens tokens at positions pos0..pos0+n_tokens-1,
     * appending to the KV cache. Emits taps into `sink` (NULL = off) inside
     * the step the caller has begun. Writes logits [n_tokens, V] as double. */
    int (*forward)(td_backend *b, const int32_t *tokens, int64_t n_tokens, int64_t pos0,
                   td_tap_sink *sink, double *logits, td_err *err);
    /* Forget the sequence (KV cache, positions). */
    void (*reset)(td_backend *b);
    void (*close)(td_backend *b);
    /* (optional) version / build string for provenance; NULL when absent */
    const char *(*version)(const td_backend *b);
    /* (optional) the arithmetic profile this arm computes with by design
     * (DESIGN.md "Backends"), e.g. "act-q8" for llama.cpp's CPU path; NULL
     * = "native". Recorded in tap files; bisect runs the control arm with it. */
    const char *profile;
    /* (optional) the profile this instance computes with, declared at open
     * from what its device actually does (it may differ from `profile`, the
     * usual case, e.g. a GPU without fp16); NULL entry = `profile`. */
    const char *(*profile_of)(const td_backend *b);
    /* (optional) can this arm run here? TD_OK with a one-line description
     * of what it would run on, else TD_SKIP (or another status) with the
     * reason, in why. NULL entry = always available. */
    int (*probe)(char *why, size_t n);
    /* The td_layer kinds its forward implements: TD_KINDS(TD_LAYER_ATTENTION)
     * | ... (forward.h); open refuses a model with any other kind. */
    unsigned layer_kinds;
    /* (optional) TD_FAULT_BIT of each fault of the catalog (faults.h) it can
     * inject; 0 = none. */
    uint64_t faults;
    /* (optional, all three or none) state operations, for the state-ops
     * check (harness/stateops.h). Every sequence holds its own positions
     * and whatever state the forward keeps (KV cache, recurrent state, token
     * history); forward appends to the sequence chosen by seq_use (0 after
     * open/reset) at pos0 = that sequence's length. seq_rm drops positions
     * >= p0 of `seq` (a rollback); seq_cp replaces dst's whole state by a
     * copy of src's. TD_OK, or a status with the reason in err. */
    int (*seq_rm)(td_backend *b, int seq, int64_t p0, td_err *err);
    int (*seq_cp)(td_backend *b, int src, int dst, td_err *err);
    int (*seq_use)(td_backend *b, int seq, td_err *err);
} td_backend_vt;

/* Every backend starts with this header so generic code can reach its table. */
struct td_backend {
    const td_backend_vt *vt;
};

/* Registered backends, NULL-terminated; td_backend_find returns NULL for an
 * unknown name. */
const td_backend_vt *const *td_backend_list(void);
const td_backend_vt *td_backend_find(const char *name);
/* For a backend DESIGN.md names but this build lacks (cpu, cuda, metal,
 * llamacpp): one line saying why and how to get it; callers exit 77 (skip).
 * NULL for a registered backend or an unknown name (a typo: usage error). */
const char *td_backend_absent_reason(const char *name);
/* "ref, ref32, cpu, ..." into buf (truncated to bufsz). */
void td_backend_names(char *buf, size_t bufsz);

#ifdef __cplusplus
}
#endif
#endif
