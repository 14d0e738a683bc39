/* tapdiff llamacpp backend: llama.cpp's own CPU forward as a peer arm.
 *
 * The adapter owns no arithmetic. It loads the GGUF with llama.cpp under
 * deterministic settings (llamacpp.h), runs each forward as one llama_decode
 * of the whole step, and observes the graph through the scheduler's eval
 * callback: asked once per node in graph order, it answers "yes" for the
 * nodes that carry a canonical tap, then reads each of them while its
 * buffer is still live, walking ggml's strides into a row-major [T, W] f32
 * (or i32) array. Facts: ../shared/spec/llamacpp-peer.md.
 *
 * A canonical tap is the LAST node of a run of consecutive observed nodes
 * that map to it (a bias ADD after its MUL_MAT carries the same name), so
 * the observed tap is held until a node with another name arrives.
 *
 * Test hook (a deliberately wrong arm, to prove the budget still catches
 * one): TD_LLAMACPP_PERTURB=TAP*S, e.g. blk.1.attn_v*1.01, multiplies every
 * F32 node that maps to canonical tap TAP by S in place while the graph runs,
 * so every later node computes with the wrong values (taps must be on: the
 * hook lives in the eval callback). On a device the node is read, scaled and
 * written back. TD_LLAMACPP_PERTURB_ARM=NAME (e.g. llamacpp:vulkan) limits it
 * to that arm. Recorded in the version string. */
#include "llamacpp.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <ggml-backend.h>
#include <ggml.h>
#include <llama.h>

#include "forward.h"
#include "profile.h"
#include "qsa_rank.h"
#include "types.h"

#ifndef TD_LLAMACPP_LIBDIR
#error "TD_LLAMACPP_LIBDIR must name the folder of the llama.cpp shared libraries"
#endif
#ifndef TD_LLAMACPP_FETCHED
#define TD_LLAMACPP_FETCHED "unknown"
#endif

/* ===================================================================== */
/* Process-wide set-up                                                    */
/* ===================================================================== */

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_init_rc;
static char g_init_msg[1024];
static char g_variant[32];
static char g_features[256]; /* variant "auto": the CPU features ggml reports as on */

/* llama.cpp logs through one global callback; library code must not print,
 * so everything is swallowed except the last error line, which goes into
 * our messages. */
static pthread_mutex_t g_log_mu = PTHREAD_MUTEX_INITIALIZER;
static char g_log_last[512];
static char g_log_prev[512]; /* the error before the last one: a loader's reason before its "failed to load" */
static int g_log_in_error; /* the previous piece was an error (CONT pieces continue it) */
/* ggml-vulkan states each device's arithmetic capabilities (fp16, int dot,
 * matrix cores) only in a debug log line: kept per device index. */
#define LC_MAX_DEV_LINES 8
static char g_vk_lines[LC_MAX_DEV_LINES][400];

static void log_sink(enum ggml_log_level level, const char *text, void *user) {
    (void)user;
    if (!text) return;
    pthread_mutex_lock(&g_log_mu);
    unsigned idx = 0;
    int used = 0;
    if (!strncmp(text, "ggml_vulkan: ", 13) && sscanf(text + 13, "%u = %n", &idx, &used) == 1 && used > 0 &&
        idx < LC_MAX_DEV_LINES && strstr(text, "fp16:")) {
        snprintf(g_vk_lines[idx], sizeof g_vk_lines[idx], "%s", text + 13);
        g_vk_lines[idx][strcspn(g_vk_lines[idx], "\r\n")] = '\0';
    }
    if (level == GGML_LOG_LEVEL_ERROR) {
        if (g_log_last[0]) memcpy(g_log_prev, g_log_last, sizeof g_log_prev);
        g_log_last[0] = '\0';
        g_log_in_error = 1;
    } else if (level != GGML_LOG_LEVEL_CONT) {
        g_log_in_error = 0;
    }
    if (g_log_in_error) {
        size_t len = strlen(g_log_last);
        snprintf(g_log_last + len, sizeof g_log_last - len, "%s", text);
        for (char *p = g_log_last; *p; p++)
            if (*p == '\n' || *p == '\r') *p = ' ';
    }
    pthread_mutex_unlock(&g_log_mu);
}

static void log_clear(void) {
    pthread_mutex_lock(&g_log_mu);
    g_log_last[0] = g_log_prev[0] = '\0';
    g_log_in_error = 0;
    pthread_mutex_unlock(&g_log_mu);
}

/* Copies the last error line (or "no message") into buf. */
static const char *log_last(char *buf, size_t n) {
    pthread_mutex_lock(&g_log_mu);
    size_t len = strlen(g_log_last);
    while (len && g_log_last[len - 1] == ' ') len--;
    // (the precision must not apply to the fallback: "%.0s" of it is "")
    if (len) snprintf(buf, n, "%.*s", (int)len, g_log_last);
    else snprintf(buf, n, "llama.cpp logged no error");
    pthread_mutex_unlock(&g_log_mu);
    return buf;
}

/* Variants differ in their last bits (spec): the choice is pinned per
 * machine kind and recorded in the version string. */
static const char *pick_variant(void) {
    const char *env = getenv("TD_LLAMACPP_CPU_VARIANT");
    if (env && *env) return env;
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "haswell";
    if (__builtin_cpu_supports("sse4.2")) return "sse42";
    return "x64";
}

static void init_once(void) {
    llama_log_set(log_sink, NULL); /* also ggml's logger */
    const char *v = pick_variant();
    size_t n = strlen(v);
    int ok = n > 0 && n < sizeof g_variant;
    for (size_t i = 0; ok && i < n; i++) ok = (v[i] >= 'a' && v[i] <= 'z') || (v[i] >= '0' && v[i] <= '9');
    if (!ok) {
        g_init_rc = TD_EINPUT;
        snprintf(g_init_msg, sizeof g_init_msg,
                 "llamacpp: TD_LLAMACPP_CPU_VARIANT='%.40s' is not a variant name (expected e.g. haswell, sse42, x64)",
                 v);
        return;
    }
    memcpy(g_variant, v, n + 1);
    char path[1024];
    // a relocated copy (ci/device-check.sh's bundle) names its own folder
    const char *libdir = getenv("TD_LLAMACPP_LIBDIR");
    if (!strcmp(v, "auto")) { // what a user gets: ggml scores the variants against this CPU
        ggml_backend_load_all_from_path(libdir && *libdir ? libdir : TD_LLAMACPP_LIBDIR);
        ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
        if (!cpu) {
            g_init_rc = TD_SKIP;
            snprintf(g_init_msg, sizeof g_init_msg, "llamacpp: no CPU variant of ggml loads from %.600s",
                     libdir && *libdir ? libdir : TD_LLAMACPP_LIBDIR);
            g_variant[0] = '\0';
            return;
        }
        ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(cpu);
        ggml_backend_get_features_t gf =
            (ggml_backend_get_features_t)ggml_backend_reg_get_proc_address(reg, "ggml_backend_get_features");
        for (struct ggml_backend_feature *f = gf ? gf(reg) : NULL; f && f->name; f++)
            if (f->value && !strcmp(f->value, "1")) {
                const size_t len = strlen(g_features);
                snprintf(g_features + len, sizeof g_features - len, "%s%s", len ? " " : "", f->name);
            }
        llama_backend_init();
        g_init_rc = TD_OK;
        return;
    }
    snprintf(path, sizeof path, "%s/libggml-cpu-%s.so", libdir && *libdir ? libdir : TD_LLAMACPP_LIBDIR, g_variant);
    // Release builds fail silently here: the device count is the check.
    if (!ggml_backend_load(path) || !ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU)) {
        g_init_rc = TD_SKIP;
        snprintf(g_init_msg, sizeof g_init_msg,
                 "llamacpp: cannot load the CPU backend %.600s (%zu devices loaded); run ci/fetch-llamacpp.sh --force "
                 "to fetch the llama.cpp libraries again",
                 path, ggml_backend_dev_count());
        g_variant[0] = '\0';
        return;
    }
    llama_backend_init();
    g_init_rc = TD_OK;
}

int td_llamacpp_init(td_err *err) {
    pthread_once(&g_once, init_once);
    if (g_init_rc) return td_err_set(err, g_init_rc, "%s", g_init_msg);
    return TD_OK;
}

const char *td_llamacpp_cpu_variant(void) {
    return g_variant[0] ? g_variant : NULL;
}

/* ---- GPU arms: llama.cpp's device backends, loaded at run time --------- */

typedef enum lc_kind { LC_CPU = 0, LC_VULKAN = 1, LC_CUDA = 2 } lc_kind;

static const char *const kind_name[] = {"cpu", "vulkan", "cuda"};

typedef struct lc_gpu {
    pthread_once_t once;
    int rc;
    char msg[1024];
    ggml_backend_dev_t dev;
    char desc[256]; /* the device's own name */
    char caps[400]; /* ggml-vulkan's capability line, "" for CUDA */
    int fp16, int_dot, coopmat;
} lc_gpu;

static lc_gpu g_gpu[3] = {{.once = PTHREAD_ONCE_INIT}, {.once = PTHREAD_ONCE_INIT}, {.once = PTHREAD_ONCE_INIT}};

static void setenv_default(const char *name, const char *value) {
    const char *v = getenv(name);
    if (!v || !*v) setenv(name, value, 1);
}

/* The integer after "key: " in a capability line; -1 when absent. */
static int cap_int(const char *line, const char *key) {
    const char *p = strstr(line, key);
    if (!p) return -1;
    p += strlen(key);
    while (*p == ' ') p++;
    if (!strncmp(p, "dot2", 4)) return 1;
    return *p >= '0' && *p <= '9' ? atoi(p) : -1;
}

static void gpu_init(lc_kind k) {
    lc_gpu *g = &g_gpu[k];
    td_err e = {{0}};
    if ((g->rc = td_llamacpp_init(&e))) {
        snprintf(g->msg, sizeof g->msg, "%s", e.msg);
        return;
    }
    const char *lib = getenv(k == LC_VULKAN ? "TD_LLAMACPP_VULKAN_LIB" : "TD_LLAMACPP_CUDA_LIB");
    if (!lib || !*lib) lib = k == LC_VULKAN ? TD_LLAMACPP_VULKAN_LIB : TD_LLAMACPP_CUDA_LIB;
    const char *fetch = k == LC_VULKAN ? "ci/fetch-llamacpp.sh" : "ci/fetch-llamacpp.sh --cuda";
    if (access(lib, R_OK)) {
        g->rc = TD_SKIP;
        snprintf(g->msg, sizeof g->msg, "llamacpp:%s: %s is not there: run %s", kind_name[k], lib, fetch);
        return;
    }
    if (k == LC_VULKAN) {
        // lavapipe is a CPU-type device that ggml-vulkan skips unless named
        setenv_default("GGML_VK_VISIBLE_DEVICES", "0");
        setenv_default("XDG_RUNTIME_DIR", "/tmp");
        // Taps must not change what they observe: each observed node splits
        // the graph there, so a fused kernel (rms_norm+mul, multi-add, ...)
        // would run untapped and not tapped, with other roundings (measured:
        // 699 of 4608 logits differed). The arm computes unfused, always.
        setenv_default("GGML_VK_DISABLE_FUSION", "1");
        setenv_default("GGML_VK_DISABLE_MULTI_ADD", "1");
        // Mesa compiles every pipeline on first use (minutes on lavapipe):
        // one stable cache folder for every run and test of this user
        const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
        char dir[900];
        if (xdg && *xdg)
            snprintf(dir, sizeof dir, "%.800s/tapdiff/mesa_shader_cache", xdg);
        else
            snprintf(dir, sizeof dir, "%.800s/.cache/tapdiff/mesa_shader_cache", home && *home ? home : "/tmp");
        setenv_default("MESA_SHADER_CACHE_DIR", dir);
        // Mesa creates only the last folder of the path (else it disables the cache)
        char mk[900];
        snprintf(mk, sizeof mk, "%s", getenv("MESA_SHADER_CACHE_DIR"));
        for (char *c = mk + 1; *c; c++)
            if (*c == '/') {
                *c = '\0';
                mkdir(mk, 0755);
                *c = '/';
            }
        mkdir(mk, 0755);
    }
    log_clear();
    ggml_backend_reg_t reg = ggml_backend_load(lib);
    char why[512];
    if (!reg) {
        g->rc = TD_SKIP;
        snprintf(g->msg, sizeof g->msg, "llamacpp:%s: cannot load %s (%s)%s", kind_name[k], lib,
                 log_last(why, sizeof why),
                 k == LC_VULKAN ? "; it needs libvulkan.so.1 and a Vulkan driver (Debian libvulkan1, and "
                                  "mesa-vulkan-drivers for lavapipe on a machine without a GPU; "
                                  "GGML_VK_VISIBLE_DEVICES picks the device)"
                                : "; it needs the CUDA 13 runtime, cuBLAS and an NVIDIA driver");
        return;
    }
    const size_t n = ggml_backend_reg_dev_count(reg);
    const char *env = getenv(k == LC_VULKAN ? "TD_LLAMACPP_VULKAN_DEVICE" : "TD_LLAMACPP_CUDA_DEVICE");
    const size_t idx = env && *env ? (size_t)strtoul(env, NULL, 10) : 0;
    if (idx >= n) {
        g->rc = TD_SKIP;
        snprintf(g->msg, sizeof g->msg, "llamacpp:%s: no %s device %zu here (%zu found)", kind_name[k],
                 k == LC_VULKAN ? "Vulkan" : "CUDA", idx, n);
        return;
    }
    g->dev = ggml_backend_reg_dev_get(reg, idx);
    snprintf(g->desc, sizeof g->desc, "%s", ggml_backend_dev_description(g->dev));
    g->fp16 = g->int_dot = g->coopmat = 0;
    if (k == LC_VULKAN) {
        pthread_mutex_lock(&g_log_mu);
        snprintf(g->caps, sizeof g->caps, "%s", idx < LC_MAX_DEV_LINES ? g_vk_lines[idx] : "");
        pthread_mutex_unlock(&g_log_mu);
        g->fp16 = cap_int(g->caps, "fp16:") > 0;
        g->int_dot = cap_int(g->caps, "int dot:") > 0;
        const char *mc = strstr(g->caps, "matrix cores:");
        g->coopmat = mc && !strstr(mc, "none");
    } else {
        g->fp16 = 1; // CUDA devices compute f16 tiles in cuBLAS and the mmq path (not measured here)
        g->int_dot = 1;
    }
    g->rc = TD_OK;
}

static void gpu_init_vulkan(void) { gpu_init(LC_VULKAN); }
static void gpu_init_cuda(void) { gpu_init(LC_CUDA); }

static int gpu_ready(lc_kind k, td_err *err) {
    pthread_once(&g_gpu[k].once, k == LC_VULKAN ? gpu_init_vulkan : gpu_init_cuda);
    if (g_gpu[k].rc) return td_err_set(err, g_gpu[k].rc, "%s", g_gpu[k].msg);
    return TD_OK;
}

/* ===================================================================== */
/* Node name -> canonical tap                                             */
/* ===================================================================== */

/* Width W of a canonical [T, W] tap, from the model's hyper-parameters. */
typedef enum width_kind { W_E, W_Q, W_KV, W_F, W_X, W_K, W_V, W_C, W_KD, W_VD, W_HV, W_HCD, W_HC, W_QI, W_DI } width_kind;

#define MAX_OPS 2
typedef struct node_rule {
    const char *node;          /* node name without "-L" */
    int layered;               /* 1: "<node>-L" gives blk.L.<tap>; 0: the name as is */
    enum ggml_op ops[MAX_OPS]; /* accepted ops; unused slots repeat the first */
    const char *tap;
    width_kind width;
    td_dtype dtype;
} node_rule;

/* llama, qwen3 and qwen3moe (spec table). Keyed on name and op because
 * names repeat: Qcur-L names the MUL_MAT, its RESHAPE and the ROPE. */
static const node_rule rules[] = {
    {"embd", 0, {GGML_OP_GET_ROWS, GGML_OP_GET_ROWS}, "inp.embd", W_E, TD_DT_F32},
    {"attn_norm", 1, {GGML_OP_MUL, GGML_OP_MUL}, "attn_norm", W_E, TD_DT_F32},
    {"Qcur", 1, {GGML_OP_MUL_MAT, GGML_OP_ADD}, "attn_q", W_Q, TD_DT_F32},
    {"Kcur", 1, {GGML_OP_MUL_MAT, GGML_OP_ADD}, "attn_k", W_KV, TD_DT_F32},
    {"Vcur", 1, {GGML_OP_MUL_MAT, GGML_OP_ADD}, "attn_v", W_KV, TD_DT_F32},
    {"Qcur_normed", 1, {GGML_OP_MUL, GGML_OP_MUL}, "attn_q_norm", W_Q, TD_DT_F32},
    {"Kcur_normed", 1, {GGML_OP_MUL, GGML_OP_MUL}, "attn_k_norm", W_KV, TD_DT_F32},
    {"Qcur", 1, {GGML_OP_ROPE, GGML_OP_ROPE}, "attn_q_rope", W_Q, TD_DT_F32},
    {"Kcur", 1, {GGML_OP_ROPE, GGML_OP_ROPE}, "attn_k_rope", W_KV, TD_DT_F32},
    // flash attention: a RESHAPE view of the FLASH_ATTN_EXT node
    {"kqv_out", 1, {GGML_OP_CONT, GGML_OP_RESHAPE}, "attn_ctx", W_Q, TD_DT_F32},
    {"attn_out", 1, {GGML_OP_MUL_MAT, GGML_OP_ADD}, "attn_out", W_E, TD_DT_F32},
    {"ffn_inp", 1, {GGML_OP_ADD, GGML_OP_ADD}, "ffn_inp", W_E, TD_DT_F32},
    {"ffn_norm", 1, {GGML_OP_MUL, GGML_OP_MUL}, "ffn_norm", W_E, TD_DT_F32},
    {"ffn_gate", 1, {GGML_OP_MUL_MAT, GGML_OP_MUL_MAT}, "ffn_gate", W_F, TD_DT_F32},
    {"ffn_up", 1, {GGML_OP_MUL_MAT, GGML_OP_MUL_MAT}, "ffn_up", W_F, TD_DT_F32},
    {"ffn_swiglu", 1, {GGML_OP_GLU, GGML_OP_GLU}, "ffn_act", W_F, TD_DT_F32},
    {"ffn_moe_logits", 1, {GGML_OP_MUL_MAT, GGML_OP_MUL_MAT}, "moe_logits", W_X, TD_DT_F32},
    {"ffn_moe_probs", 1, {GGML_OP_SOFT_MAX, GGML_OP_SOFT_MAX}, "moe_probs", W_X, TD_DT_F32},
    {"ffn_moe_topk", 1, {GGML_OP_VIEW, GGML_OP_VIEW}, "moe_topk", W_K, TD_DT_I32},
    // the renormalised weights; all three archs renormalise (norm_w)
    {"ffn_moe_weights_norm", 1, {GGML_OP_DIV, GGML_OP_DIV}, "moe_weights", W_K, TD_DT_F32},
    {"ffn_out", 1, {GGML_OP_MUL_MAT, GGML_OP_ADD}, "ffn_out", W_E, TD_DT_F32},
    // K=1 makes the expert sum a CONT instead of an ADD
    {"ffn_moe_out", 1, {GGML_OP_ADD, GGML_OP_CONT}, "ffn_out", W_E, TD_DT_F32},
    {"l_out", 1, {GGML_OP_ADD, GGML_OP_ADD}, "out", W_E, TD_DT_F32},
    {"result_norm", 0, {GGML_OP_MUL, GGML_OP_MUL}, "out.norm", W_E, TD_DT_F32},
    {"result_output", 0, {GGML_OP_MUL_MAT, GGML_OP_MUL_MAT}, "out.logits", W_V, TD_DT_F32},
};

/* qwen3next (arch-qwen3next.md §4, llamacpp-peer.md): its own names; the
 * attention-family names it shares mean other things there (ffn_gate-L is
 * the shared expert's, gate-L is the GDN decay or the attention gate). */
static const node_rule rules_qwen3next[] = {
    {"model.embed_tokens", 0, {GGML_OP_GET_ROWS, GGML_OP_GET_ROWS}, "inp.embd", W_E, TD_DT_F32},
    {"attn_norm", 1, {GGML_OP_MUL, GGML_OP_MUL}, "attn_norm", W_E, TD_DT_F32},
    // GDN blocks (attn_qkv's product, beta, the conv state and the recurrence: special cases in classify)
    {"z", 1, {GGML_OP_MUL_MAT, GGML_OP_MUL_MAT}, "ssm_z", W_VD, TD_DT_F32},
    {"gate", 1, {GGML_OP_MUL, GGML_OP_MUL}, "ssm_gate", W_HV, TD_DT_F32},
    {"q_conv", 1, {GGML_OP_VIEW, GGML_OP_VIEW}, "ssm_q", W_KD, TD_DT_F32},
    {"k_conv", 1, {GGML_OP_VIEW, GGML_OP_VIEW}, "ssm_k", W_KD, TD_DT_F32},
    {"v_conv_predelta", 1, {GGML_OP_VIEW, GGML_OP_VIEW}, "ssm_v", W_VD, TD_DT_F32}, // v_conv renamed in place
    {"final_output", 1, {GGML_OP_RESHAPE, GGML_OP_RESHAPE}, "ssm_gated", W_VD, TD_DT_F32},
    {"linear_attn_out", 1, {GGML_OP_MUL_MAT, GGML_OP_MUL_MAT}, "ssm_out", W_E, TD_DT_F32},
    // gated attention blocks: Qcur_full holds [q; gate] per head, both read as views
    {"Qcur_view", 1, {GGML_OP_VIEW, GGML_OP_VIEW}, "attn_q", W_Q, TD_DT_F32},
    {"Kcur", 1, {GGML_OP_MUL_MAT, GGML_OP_MUL_MAT}, "attn_k", W_KV, TD_DT_F32},
    {"Vcur", 1, {GGML_OP_MUL_MAT, GGML_OP_MUL_MAT}, "attn_v", W_KV, TD_DT_F32},
    {"gate", 1, {GGML_OP_VIEW, GGML_OP_VIEW}, "attn_gate", W_Q, TD_DT_F32},
    {"Qcur_normed", 1, {GGML_OP_MUL, GGML_OP_MUL}, "attn_q_norm", W_Q, TD_DT_F32},
    {"Kcur_normed", 1, {GGML_OP_MUL, GGML_OP_MUL}, "attn_k_norm", W_KV, TD_DT_F32},
    {"Qcur", 1, {GGML_OP_ROPE, GGML_OP_ROPE}, "attn_q_rope", W_Q, TD_DT_F32},
    {"Kcur", 1, {GGML_OP_ROPE, GGML_OP_ROPE}, "attn_k_rope", W_KV, TD_DT_F32},
    {"attn_pregate", 1, {GGML_OP_CONT, GGML_OP_RESHAPE}, "attn_ctx", W_Q, TD_DT_F32},
    {"attn_gated", 1, {GGML_OP_MUL, GGML_OP_MUL}, "attn_gated", W_Q, TD_DT_F32},
    {"attn_output", 1, {GGML_OP_MUL_MAT, GGML_OP_MUL_MAT}, "attn_out", W_E, TD_DT_F32},
    // every block: residual, post-attention norm, MoE, gated shared expert
    {"attn_residual", 1, {GGML_OP_ADD, GGML_OP_ADD}, "ffn_inp", W_E, TD_DT_F32},
    {"attn_post_norm", 1, {GGML_OP_MUL, GGML_OP_MUL}, "ffn_norm", W_E, TD_DT_F32},
    {"ffn_moe_logits", 1, {GGML_OP_MUL_MAT, GGML_OP_MUL_MAT}, "moe_logits", W_X, TD_DT_F32},
    {"ffn_moe_probs", 1, {GGML_OP_SOFT_MAX, GGML_OP_SOFT_MAX}, "moe_probs", W_X, TD_DT_F32},
    {"ffn_moe_topk", 1, {GGML_OP_VIEW, GGML_OP_VIEW}, "moe_topk", W_K, TD_DT_I32},
    {"ffn_moe_weights_norm", 1, {GGML_OP_DIV, GGML_OP_DIV}, "moe_weights", W_K, TD_DT_F32},
    {"ffn_shexp", 1, {GGML_OP_MUL_MAT, GGML_OP_MUL_MAT}, "ffn_shexp", W_E, TD_DT_F32},
    {"ffn_out", 1, {GGML_OP_ADD, GGML_OP_ADD}, "ffn_out", W_E, TD_DT_F32},
    {"l_out", 1, {GGML_OP_ADD, GGML_OP_ADD}, "out", W_E, TD_DT_F32},
    // the final norm is h_nextn; result_norm is the row selection after it
    {"h_nextn", 0, {GGML_OP_MUL, GGML_OP_MUL}, "out.norm", W_E, TD_DT_F32},
    {"result_output", 0, {GGML_OP_MUL_MAT, GGML_OP_MUL_MAT}, "out.logits", W_V, TD_DT_F32},
};

/* qwen4exp (arch-qwen4exp.md §4, §6). A stream stack {E, hc, T} is read as
 * [T, hc·E] rows, stream-major, as the catalog has it. hc_gate, hc_inject and
 * hc_mixed come twice per layer (the attention mixer, then the FFN mixer
 * after hc_combine): classify renames the second ones (q4x_ffn_phase). The
 * final mixer's nodes carry no layer (hc_gate; its output is result_norm). */
static const node_rule rules_qwen4exp[] = {
    {"model.input_embed", 0, {GGML_OP_GET_ROWS, GGML_OP_GET_ROWS}, "inp.embd", W_E, TD_DT_F32},
    {"ple_embd", 0, {GGML_OP_RESHAPE, GGML_OP_RESHAPE}, "inp.ple_embd", W_E, TD_DT_F32},
    {"ple_gate", 1, {GGML_OP_UNARY, GGML_OP_UNARY}, "ple_gate", W_HC, TD_DT_F32},
    {"ple_gated_value", 1, {GGML_OP_MUL, GGML_OP_MUL}, "ple_gated", W_HCD, TD_DT_F32},
    {"ple_conv_out", 1, {GGML_OP_RESHAPE, GGML_OP_RESHAPE}, "ple_conv", W_HCD, TD_DT_F32},
    {"hc_gate", 1, {GGML_OP_MUL_MAT, GGML_OP_MUL_MAT}, "hc_attn_gate", W_HCD, TD_DT_F32},
    {"hc_inject", 1, {GGML_OP_MUL_MAT, GGML_OP_MUL_MAT}, "hc_attn_inject", W_HC, TD_DT_F32},
    // the fused mixer (DSV4_HC_PRE), or the unfused mean over the streams
    {"hc_mixed", 1, {GGML_OP_DSV4_HC_PRE, GGML_OP_SCALE}, "attn_norm", W_E, TD_DT_F32},
    // QSA indexer (scores and selection: special cases in classify)
    {"indexer_k_raw", 1, {GGML_OP_RESHAPE, GGML_OP_RESHAPE}, "qsa_k_raw", W_DI, TD_DT_F32},
    {"indexer_q", 1, {GGML_OP_ROPE, GGML_OP_ROPE}, "qsa_q", W_QI, TD_DT_F32},
    // gated attention: Qcur_full holds [q; gate] per head, q read as a view
    {"Qcur_reshaped", 1, {GGML_OP_VIEW, GGML_OP_VIEW}, "attn_q", W_Q, TD_DT_F32},
    {"Kcur", 1, {GGML_OP_MUL_MAT, GGML_OP_MUL_MAT}, "attn_k", W_KV, TD_DT_F32},
    {"Vcur", 1, {GGML_OP_MUL_MAT, GGML_OP_MUL_MAT}, "attn_v", W_KV, TD_DT_F32},
    {"gate_reshaped", 1, {GGML_OP_CONT, GGML_OP_CONT}, "attn_gate", W_Q, TD_DT_F32},
    {"Qcur_normed", 1, {GGML_OP_MUL, GGML_OP_MUL}, "attn_q_norm", W_Q, TD_DT_F32},
    {"Kcur_normed", 1, {GGML_OP_MUL, GGML_OP_MUL}, "attn_k_norm", W_KV, TD_DT_F32},
    {"Qcur", 1, {GGML_OP_ROPE, GGML_OP_ROPE}, "attn_q_rope", W_Q, TD_DT_F32},
    {"Kcur", 1, {GGML_OP_ROPE, GGML_OP_ROPE}, "attn_k_rope", W_KV, TD_DT_F32},
    {"attn_pregate", 1, {GGML_OP_CONT, GGML_OP_RESHAPE}, "attn_ctx", W_Q, TD_DT_F32},
    {"attn_gated", 1, {GGML_OP_MUL, GGML_OP_MUL}, "attn_gated", W_Q, TD_DT_F32},
    {"attn_output", 1, {GGML_OP_MUL_MAT, GGML_OP_MUL_MAT}, "attn_out", W_E, TD_DT_F32},
    // GDN (as qwen3next, but a named qkv product and separate beta)
    {"linear_attn_qkv_mixed", 1, {GGML_OP_RESHAPE, GGML_OP_RESHAPE}, "ssm_qkv", W_C, TD_DT_F32},
    {"z", 1, {GGML_OP_MUL_MAT, GGML_OP_MUL_MAT}, "ssm_z", W_VD, TD_DT_F32},
    {"beta_sigmoid", 1, {GGML_OP_UNARY, GGML_OP_UNARY}, "ssm_beta", W_HV, TD_DT_F32},
    {"gate", 1, {GGML_OP_MUL, GGML_OP_MUL}, "ssm_gate", W_HV, TD_DT_F32},
    {"q_conv", 1, {GGML_OP_VIEW, GGML_OP_VIEW}, "ssm_q", W_KD, TD_DT_F32},
    {"k_conv", 1, {GGML_OP_VIEW, GGML_OP_VIEW}, "ssm_k", W_KD, TD_DT_F32},
    {"v_conv_predelta", 1, {GGML_OP_VIEW, GGML_OP_VIEW}, "ssm_v", W_VD, TD_DT_F32}, // v_conv renamed in place
    {"final_output", 1, {GGML_OP_RESHAPE, GGML_OP_RESHAPE}, "ssm_gated", W_VD, TD_DT_F32},
    {"linear_attn_out", 1, {GGML_OP_MUL_MAT, GGML_OP_MUL_MAT}, "ssm_out", W_E, TD_DT_F32},
    // the stream stack after the attention combine; the FFN; the layer's stream stack
    {"hc_combine", 1, {GGML_OP_DSV4_HC_POST, GGML_OP_ADD}, "ffn_inp", W_HCD, TD_DT_F32},
    {"ffn_moe_logits", 1, {GGML_OP_MUL_MAT, GGML_OP_MUL_MAT}, "moe_logits", W_X, TD_DT_F32},
    {"ffn_moe_probs", 1, {GGML_OP_SOFT_MAX, GGML_OP_SOFT_MAX}, "moe_probs", W_X, TD_DT_F32},
    {"ffn_moe_topk", 1, {GGML_OP_VIEW, GGML_OP_VIEW}, "moe_topk", W_K, TD_DT_I32},
    {"ffn_moe_weights_norm", 1, {GGML_OP_DIV, GGML_OP_DIV}, "moe_weights", W_K, TD_DT_F32},
    {"ffn_shexp", 1, {GGML_OP_MUL_MAT, GGML_OP_MUL_MAT}, "ffn_shexp", W_E, TD_DT_F32},
    {"ffn_out", 1, {GGML_OP_ADD, GGML_OP_ADD}, "ffn_out", W_E, TD_DT_F32},
    {"l_last", 1, {GGML_OP_DSV4_HC_POST, GGML_OP_ADD}, "out", W_HCD, TD_DT_F32},
    {"hc_gate", 0, {GGML_OP_MUL_MAT, GGML_OP_MUL_MAT}, "out.hc_gate", W_HCD, TD_DT_F32},
    {"result_norm", 0, {GGML_OP_SCALE, GGML_OP_DSV4_HC_PRE}, "out.norm", W_E, TD_DT_F32},
    {"result_output", 0, {GGML_OP_MUL_MAT, GGML_OP_MUL_MAT}, "out.logits", W_V, TD_DT_F32},
};

/* The second mixer of a qwen4exp layer: the attention mixer's tap -> the FFN's. */
static const char *const q4x_ffn_phase[][2] = {
    {"hc_attn_gate", "hc_ffn_gate"}, {"hc_attn_inject", "hc_ffn_inject"}, {"attn_norm", "ffn_norm"}};

/* qwen3next nodes read beyond a plain [T, W] copy */
typedef enum lc_special {
    SP_NONE = 0,
    SP_GDN = 1,        /* GATED_DELTA_NET: [output (T, Hv*dv) ; new state (Hv, dv, dk)] -> ssm_core, ssm_state */
    SP_CONV_STATE = 2, /* conv_input (CONCAT [state ; m], ne (K-1+T, C)): its last K-1 columns -> ssm_conv_state */
    SP_FLAT = 3,       /* one value per token -> [T] */
    /* qwen4exp */
    SP_CONV_STATE_T = 4, /* the PLE conv's CONCAT [history ; Nv]: its last (Kp-1)·Ng columns, time-major */
    SP_QSA_SCORES = 5,   /* indexer_score (T, padded blocks): complete blocks only, -1 where not complete */
    SP_QSA_SEL = 6,      /* indexer_top_k (T, W) cells: positions in the catalog's rank order */
    SP_KCACHE = 7,       /* src 0 of the block gather: the raw indexer key cache, its first n_kv rows */
    SP_PLE_ROWS = 8,     /* src 1 of the PLE table gather: the hashed rows, (T, Np) */
} lc_special;

/* taps of the qwen3next nodes classify recognises by op and operands */
static const char *const special_taps_qwen3next[] = {"ssm_qkv", "ssm_beta", "ffn_shexp_gate", "ssm_conv_state",
                                                     "ssm_core", "ssm_state"};

/* qwen4exp's taps beyond its rules: the FFN mixer's renamed ones and the special nodes */
static const char *const special_taps_qwen4exp[] = {
    "blk.L.hc_ffn_gate", "blk.L.hc_ffn_inject", "blk.L.ffn_norm",  "blk.L.ffn_shexp_gate",
    "blk.L.ssm_conv_state", "blk.L.ssm_core", "blk.L.ssm_state", "blk.L.ple_conv_state",
    "blk.L.ple_out", "blk.L.qsa_scores", "blk.L.qsa_sel", "blk.L.qsa_kcache", "inp.ple_rows"};

const char *td_llamacpp_mapped_tap(size_t i, char *buf, size_t cap) {
    // the rules, the unnamed output projection recognised by its weight, then
    // qwen3next's rules and its special nodes, then qwen4exp's
    const size_t n = sizeof rules / sizeof rules[0], nq = sizeof rules_qwen3next / sizeof rules_qwen3next[0];
    const size_t ns = sizeof special_taps_qwen3next / sizeof special_taps_qwen3next[0];
    const size_t n4 = sizeof rules_qwen4exp / sizeof rules_qwen4exp[0];
    const size_t ns4 = sizeof special_taps_qwen4exp / sizeof special_taps_qwen4exp[0];
    const size_t q4 = n + 1 + nq + ns;
    if (i >= q4 && i < q4 + n4) {
        const node_rule *r = &rules_qwen4exp[i - q4];
        snprintf(buf, cap, "%s%s", r->layered ? "blk.L." : "", r->tap);
        return buf;
    }
    if (i >= q4 + n4 && i < q4 + n4 + ns4) {
        snprintf(buf, cap, "%s", special_taps_qwen4exp[i - q4 - n4]);
        return buf;
    }
    if (i < n) {
        snprintf(buf, cap, "%s%s", rules[i].layered ? "blk.L." : "", rules[i].tap);
    } else if (i == n) {
        snprintf(buf, cap, "blk.L.attn_out");
    } else if (i < n + 1 + nq) {
        const node_rule *r = &rules_qwen3next[i - n - 1];
        snprintf(buf, cap, "%s%s", r->layered ? "blk.L." : "", r->tap);
    } else if (i < n + 1 + nq + ns) {
        snprintf(buf, cap, "blk.L.%s", special_taps_qwen3next[i - n - 1 - nq]);
    } else {
        return NULL;
    }
    return buf;
}

/* Splits "name-12" into ("name", 12); layer -1 when there is no "-<digits>"
 * suffix. base must hold GGML_MAX_NAME bytes. */
static int split_layer(const char *name, char *base) {
    size_t n = strlen(name);
    if (n >= GGML_MAX_NAME) n = GGML_MAX_NAME - 1;
    size_t i = n;
    while (i > 0 && name[i - 1] >= '0' && name[i - 1] <= '9') i--;
    if (i == n || i < 2 || name[i - 1] != '-' || n - i > 6) {
        memcpy(base, name, n);
        base[n] = '\0';
        return -1;
    }
    memcpy(base, name, i - 1);
    base[i - 1] = '\0';
    return atoi(name + i);
}

static int is_view_op(enum ggml_op op) {
    return op == GGML_OP_NONE || op == GGML_OP_VIEW || op == GGML_OP_RESHAPE || op == GGML_OP_PERMUTE ||
           op == GGML_OP_TRANSPOSE;
}

/* ===================================================================== */
/* Backend state                                                          */
/* ===================================================================== */

typedef enum want_kind { WANT_NONE = 0, WANT_CANON = 1, WANT_EXTRA = 2 } want_kind;

/* One converted tap, ready to emit. */
typedef struct lc_tap {
    char name[TD_TAP_NAME_MAX];
    td_dtype dtype;
    int ndim;
    int64_t shape[TD_TAP_MAX_DIMS];
    void *data; /* 4-byte values (f32 or i32) */
    size_t cap; /* bytes allocated */
} lc_tap;

typedef struct lc_count {
    char key[TD_TAP_NAME_MAX];
    int n;
} lc_count;

/* What the eval callback needs during one forward. */
typedef struct lc_obs {
    td_tap_sink *sink;
    const td_hparams *hp;
    int all_nodes;
    char perturb[TD_TAP_NAME_MAX]; /* TD_LLAMACPP_PERTURB: tap to scale in place, "" = none */
    float perturb_scale;
    int64_t T;    /* tokens of this step */
    int64_t n_kv; /* KV cells in use after this step = pos0 + T */

    /* the node that ask=true accepted, read at ask=false */
    const struct ggml_tensor *want;
    want_kind kind;
    char want_name[TD_TAP_NAME_MAX];
    int64_t want_width;  /* canonical: W of [T, W]; 0 = shape from the node */
    td_dtype want_dtype;
    int want_attn;       /* ne[0] spans the KV cells: slice to n_kv */
    int want_special;    /* lc_special */
    int want_src;        /* -1: read the node; else its source of that index (an input or cache view) */
    int cells_are_pos;   /* one sequence: KV cell i holds position i (qwen4exp's indexer taps need it) */
    int q4x_comb_layer;  /* qwen4exp: the layer whose attention combine ran (its next mixer is the FFN's) */
    float *qsa_sc;       /* qwen4exp: the last indexer_score node (T, qsa_nb), for its selection */
    size_t qsa_sc_cap;
    int64_t qsa_nb;
    int qsa_layer;
    float *spare;        /* qwen3next: the state part of a GATED_DELTA_NET node */
    size_t spare_cap;

    lc_tap held, cur;    /* held: the last canonical tap, not yet emitted */
    int have_held;
    uint8_t *raw;        /* device-to-host copy of a non-host tensor */
    size_t raw_cap;
    float *row;          /* one dequantized row */
    size_t row_cap;

    char (*emitted)[TD_TAP_NAME_MAX]; /* canonical names emitted this step */
    size_t n_emitted, cap_emitted;
    lc_count *counts;    /* extras: occurrences of (node, op) this step */
    size_t n_counts, cap_counts;

    int rc;              /* first error inside the callback */
    td_err err;
} lc_obs;

/* The flash-attention kernel an arm runs, by the rule its profile declares. */
typedef enum {
    LC_FA_OFF,     /* flash attention off */
    LC_FA_F16,     /* fa-f16 only: a device whose kernel is not modelled */
    LC_FA_ACC_F16, /* ggml-vulkan's scalar shader on lavapipe (fa-acc-f16) */
    LC_FA_CPU,     /* ggml-cpu's kernel (fa-cpu) */
} lc_fa_kernel;

typedef struct lc_backend {
    td_backend base;
    lc_kind kind;
    int flash_attn;
    lc_fa_kernel fa_kernel; /* which kernel runs flash attention, as declare_profile declared it */
    int user;        /* TD_LLAMACPP_USER_DEFAULTS: llama-bench's settings, for speed only (no taps) */
    int logits_last; /* td_backend_params.logits_last */
    char profile[128]; /* what this arm computes with, from its device */
    int rope_trig_u;   /* Vulkan: the rope-trig@U it declares (0: no rope rule) */
    int rope_trig_env; /* that U came from TD_LLAMACPP_ROPE_TRIG */
    const td_model *m;
    struct llama_model *lm;
    struct llama_context *lctx;
    struct llama_batch batch;
    int64_t n_ctx;  /* positions the caller may use */
    int64_t n_past; /* positions the current sequence consumed so far */
    int64_t n_vocab;
    int threads;
    td_hist hist;
    /* state operations: the sequence forwards append to, and every
     * sequence's positions and history while another is current */
    int n_seq, seq;
    int crash_guarded; // counted in the crash handler's open GPU arms
    int64_t seq_past[TD_SEQ_MAX];
    td_hist seq_hist[TD_SEQ_MAX];
    char version[1024];
    lc_obs obs;
} lc_backend;

static void *grow(void *p, size_t *cap, size_t need) {
    if (need <= *cap) return p;
    size_t c = *cap ? *cap : 256;
    while (c < need) c *= 2;
    *cap = c;
    return td_xrealloc(p, c);
}

/* Keeps the first error of the step; the graph is then aborted. */
static int obs_fail(lc_obs *o, int status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static int obs_fail(lc_obs *o, int status, const char *fmt, ...) {
    if (!o->rc) {
        o->rc = status;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(o->err.msg, sizeof o->err.msg, fmt, ap);
        va_end(ap);
    }
    return status;
}

/* ===================================================================== */
/* Emission                                                               */
/* ===================================================================== */

static int was_emitted(const lc_obs *o, const char *name) {
    for (size_t i = 0; i < o->n_emitted; i++)
        if (!strcmp(o->emitted[i], name)) return 1;
    return 0;
}

static void emit(lc_obs *o, const lc_tap *t) {
    td_tap_emit(o->sink, -1, t->name, t->dtype, t->data, t->ndim, t->shape);
}

static void flush_held(lc_obs *o) {
    if (!o->have_held) return;
    emit(o, &o->held);
    if (o->n_emitted == o->cap_emitted) {
        o->cap_emitted = o->cap_emitted ? 2 * o->cap_emitted : 64;
        o->emitted = td_xrealloc(o->emitted, o->cap_emitted * sizeof o->emitted[0]);
    }
    memcpy(o->emitted[o->n_emitted++], o->held.name, TD_TAP_NAME_MAX);
    o->have_held = 0;
}

/* cur holds a converted canonical tap of node t: it replaces a held tap of
 * the same name (the later node is the final value), else the held one goes
 * out. A name that comes back after another tap means the mapping no longer
 * fits this llama.cpp: an error, never a silent pick. */
static int take_canonical(lc_obs *o, const struct ggml_tensor *t) {
    if (!o->have_held || strcmp(o->held.name, o->cur.name)) {
        flush_held(o);
        if (was_emitted(o, o->cur.name))
            return obs_fail(o, TD_EINTERNAL, "llamacpp: node '%s' (%s) maps to tap %s, already emitted in this step",
                            t->name, ggml_op_desc(t), o->cur.name);
    }
    lc_tap x = o->held;
    o->held = o->cur;
    o->cur = x;
    o->have_held = 1;
    return TD_OK;
}

/* "llamacpp.<node>.<OP>", then ".2", ".3", ... for repeats in this step. */
static void extra_name(lc_obs *o, const struct ggml_tensor *t, char *out) {
    char key[TD_TAP_NAME_MAX];
    snprintf(key, sizeof key, "llamacpp.%.64s.%.40s", t->name, ggml_op_desc(t));
    for (char *p = key; *p; p++)
        if (*p == '/') *p = '_';
    size_t i = 0;
    while (i < o->n_counts && strcmp(o->counts[i].key, key)) i++;
    if (i == o->n_counts) {
        if (o->n_counts == o->cap_counts) {
            o->cap_counts = o->cap_counts ? 2 * o->cap_counts : 64;
            o->counts = td_xrealloc(o->counts, o->cap_counts * sizeof o->counts[0]);
        }
        memcpy(o->counts[i].key, key, sizeof key);
        o->counts[i].n = 0;
        o->n_counts++;
    }
    int n = ++o->counts[i].n;
    if (n == 1)
        memcpy(out, key, TD_TAP_NAME_MAX);
    else
        snprintf(out, TD_TAP_NAME_MAX, "%.112s.%d", key, n);
}

/* ===================================================================== */
/* Reading a node                                                         */
/* ===================================================================== */

/* Converts t (its first ne0_used values of every row) into dst as 4-byte
 * values in row-major order of the reversed ne (ne[3], ne[2], ne[1], ne0_used),
 * i.e. ne[0] fastest. want_i32: the node must be I32 and is copied as such;
 * else floats (F32, F16, BF16, or any type ggml can dequantize). */
static int convert(lc_obs *o, const struct ggml_tensor *t, int64_t ne0_used, int want_i32, void *dst) {
    const uint8_t *base = t->data;
    if (!t->buffer || !ggml_backend_buffer_is_host(t->buffer)) {
        size_t nb = ggml_nbytes(t);
        o->raw = grow(o->raw, &o->raw_cap, nb);
        ggml_backend_tensor_get((struct ggml_tensor *)t, o->raw, 0, nb);
        base = o->raw;
    }
    if (!base) return obs_fail(o, TD_EINTERNAL, "llamacpp: node '%s' has no data", t->name);
    const enum ggml_type ty = t->type;
    if (want_i32 != (ty == GGML_TYPE_I32))
        return obs_fail(o, TD_EINTERNAL, "llamacpp: node '%s' has type %s, expected %s", t->name, ggml_type_name(ty),
                        want_i32 ? "i32" : "a float type");
    const struct ggml_type_traits *tr = ggml_get_type_traits(ty);
    const int quant = ggml_is_quantized(ty);
    if (quant && (!tr->to_float || t->nb[0] != tr->type_size || t->ne[0] % tr->blck_size))
        return obs_fail(o, TD_EINTERNAL, "llamacpp: node '%s' (%s): its quantized rows are not contiguous blocks",
                        t->name, ggml_type_name(ty));
    if (!quant && ty != GGML_TYPE_F32 && ty != GGML_TYPE_F16 && ty != GGML_TYPE_BF16 && ty != GGML_TYPE_I32)
        return obs_fail(o, TD_EINTERNAL, "llamacpp: node '%s' has type %s, not readable as f32 or i32", t->name,
                        ggml_type_name(ty));
    if (quant) o->row = grow(o->row, &o->row_cap, (size_t)t->ne[0] * sizeof(float));

    float *df = dst;
    int32_t *di = dst;
    size_t k = 0;
    for (int64_t i3 = 0; i3 < t->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < t->ne[2]; i2++)
            for (int64_t i1 = 0; i1 < t->ne[1]; i1++) {
                const uint8_t *r = base + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3];
                if (quant) {
                    tr->to_float(r, o->row, t->ne[0]);
                    memcpy(df + k, o->row, (size_t)ne0_used * sizeof(float));
                    k += (size_t)ne0_used;
                    continue;
                }
                for (int64_t i0 = 0; i0 < ne0_used; i0++, k++) {
                    const uint8_t *e = r + i0 * t->nb[0];
                    switch (ty) {
                    case GGML_TYPE_F32: memcpy(df + k, e, 4); break;
                    case GGML_TYPE_F16: {
                        uint16_t h;
                        memcpy(&h, e, 2);
                        df[k] = td_f16_to_f32(h);
                        break;
                    }
                    case GGML_TYPE_BF16: {
                        uint16_t h;
                        memcpy(&h, e, 2);
                        df[k] = td_bf16_to_f32(h);
                        break;
                    }
                    default: memcpy(di + k, e, 4); break; /* I32 */
                    }
                }
            }
    return TD_OK;
}

static int64_t width_of(const td_hparams *hp, width_kind w) {
    switch (w) {
    case W_E: return hp->n_embd;
    case W_Q: return (int64_t)hp->n_head * hp->head_dim;
    case W_KV: return (int64_t)hp->n_head_kv * hp->head_dim;
    case W_F: return hp->n_ff;
    case W_X: return hp->n_expert;
    case W_K: return hp->n_expert_used;
    case W_V: return hp->n_vocab;
    case W_C: return 2 * (int64_t)hp->ssm_n_group * hp->ssm_d_state + hp->ssm_d_inner;
    case W_KD: return (int64_t)hp->ssm_n_group * hp->ssm_d_state;
    case W_VD: return hp->ssm_d_inner;
    case W_HV: return hp->ssm_dt_rank;
    case W_HCD: return (int64_t)hp->hc * hp->n_embd;
    case W_HC: return hp->hc;
    case W_QI: return (int64_t)hp->idx_heads * hp->idx_dim;
    case W_DI: return hp->idx_dim;
    }
    return 0;
}

static int is_sigmoid(const struct ggml_tensor *t) {
    return t->op == GGML_OP_UNARY && ggml_get_unary_op(t) == GGML_UNARY_OP_SIGMOID;
}

/* ask=true: decides whether node t is observed, and as what. */
static int classify(lc_obs *o, const struct ggml_tensor *t) {
    char base[GGML_MAX_NAME];
    const int layer = split_layer(t->name, base);
    const node_rule *hit = NULL;
    const int q3n = o->hp->arch == TD_ARCH_QWEN3NEXT;
    const int q4x = o->hp->arch == TD_ARCH_QWEN4EXP;
    const node_rule *tab = q3n ? rules_qwen3next : q4x ? rules_qwen4exp : rules;
    const size_t n_tab = q3n   ? sizeof rules_qwen3next / sizeof rules_qwen3next[0]
                         : q4x ? sizeof rules_qwen4exp / sizeof rules_qwen4exp[0]
                               : sizeof rules / sizeof rules[0];
    for (size_t i = 0; i < n_tab && !hit; i++) {
        const node_rule *r = &tab[i];
        if ((r->layered != 0) != (layer >= 0) || strcmp(r->node, base)) continue;
        for (int j = 0; j < MAX_OPS; j++)
            if (t->op == r->ops[j]) hit = r;
    }
    int tap_layer = layer;
    const char *tap = hit ? hit->tap : NULL;
    width_kind wk = hit ? hit->width : W_E;
    td_dtype dt = hit ? hit->dtype : TD_DT_F32;
    o->want_special = SP_NONE;
    o->want_src = -1;
    if (hit && q4x && layer >= 0) {
        if (!strcmp(tap, "ffn_inp")) o->q4x_comb_layer = layer;
        for (size_t i = 0; i < sizeof q4x_ffn_phase / sizeof q4x_ffn_phase[0]; i++)
            if (o->q4x_comb_layer == layer && !strcmp(tap, q4x_ffn_phase[i][0])) tap = q4x_ffn_phase[i][1];
    }
    if (!hit && q4x) {
        // unnamed qwen4exp nodes, and named ones read beyond a [T, W] copy
        char b0[GGML_MAX_NAME];
        int l0 = -1, used = 0;
        const char *s0 = t->src[0] ? t->src[0]->name : "";
        const struct ggml_tensor *s1 = t->src[1];
        if (is_sigmoid(t) && layer >= 0 && !strcmp(base, "shared_expert_gate_sigmoid")) {
            tap = "ffn_shexp_gate", o->want_special = SP_FLAT;
        } else if (t->op == GGML_OP_CONCAT && (l0 = split_layer(s0, b0)) >= 0 && !strcmp(b0, "conv_state_at")) {
            // the PLE layer has two: the PLE conv's (hc·E channels) comes first, then the GDN's (C)
            const int ple = t->ne[1] == width_of(o->hp, W_HCD) && o->hp->ple_layer == l0;
            tap = ple ? "ple_conv_state" : "ssm_conv_state", tap_layer = l0;
            o->want_special = ple ? SP_CONV_STATE_T : SP_CONV_STATE;
        } else if (t->op == GGML_OP_GATED_DELTA_NET && (l0 = split_layer(s0, b0)) >= 0) {
            tap = "ssm_core", tap_layer = l0, o->want_special = SP_GDN;
        } else if (t->op == GGML_OP_ADD && s1 && s1->op == GGML_OP_ADD && s1->src[1] &&
                   (l0 = split_layer(s1->src[1]->name, b0)) >= 0 && !strcmp(b0, "ple_conv_out")) {
            tap = "ple_out", tap_layer = l0, wk = W_HCD; // Rs + (gated value + conv)
        } else if (o->cells_are_pos && layer >= 0 && !strcmp(base, "indexer_score") &&
                   (t->op == GGML_OP_ADD || t->op == GGML_OP_CONT)) {
            tap = "qsa_scores", o->want_special = SP_QSA_SCORES;
        } else if (o->cells_are_pos && layer >= 0 && !strcmp(base, "indexer_top_k") && t->op == GGML_OP_RESHAPE) {
            tap = "qsa_sel", o->want_special = SP_QSA_SEL, dt = TD_DT_I32;
        } else if (o->cells_are_pos && t->op == GGML_OP_GET_ROWS &&
                   sscanf(s0, "cache_idx_k_l%d%n", &l0, &used) == 1 && used > 0 && l0 >= 0) {
            tap = "qsa_kcache", tap_layer = l0, o->want_special = SP_KCACHE, o->want_src = 0;
        } else if (t->op == GGML_OP_GET_ROWS && !strcmp(s0, "per_layer_token_embd.weight") && s1 &&
                   s1->type == GGML_TYPE_I32) {
            tap = "inp.ple_rows", tap_layer = -1, o->want_special = SP_PLE_ROWS, o->want_src = 1, dt = TD_DT_I32;
        }
    }
    if (!hit && q3n) {
        // unnamed or renamed qwen3next nodes, recognised by op and operands
        int wl = -1, used = 0;
        const char *s0 = t->src[0] ? t->src[0]->name : "";
        if (t->op == GGML_OP_MUL_MAT && sscanf(s0, "blk.%d.attn_qkv.weight%n", &wl, &used) == 1 && used > 0 &&
            !s0[used] && wl >= 0) {
            tap = "ssm_qkv", tap_layer = wl, wk = W_C;
        } else if (is_sigmoid(t) && sscanf(s0, "b-%d", &wl) == 1 && wl >= 0) {
            tap = "ssm_beta", tap_layer = wl, wk = W_HV; // sigmoid(cont(b-L))
        } else if (is_sigmoid(t) && layer >= 0 && !strcmp(base, "shared_expert_gate_sigmoid")) {
            tap = "ffn_shexp_gate", o->want_special = SP_FLAT, wk = W_E;
        } else if (t->op == GGML_OP_CONCAT && layer >= 0 && !strcmp(base, "conv_input")) {
            tap = "ssm_conv_state", o->want_special = SP_CONV_STATE;
        } else if (t->op == GGML_OP_GATED_DELTA_NET && split_layer(s0, base) >= 0) {
            tap = "ssm_core", tap_layer = split_layer(s0, base), o->want_special = SP_GDN;
        }
    }
    // qwen3's output projection is unnamed: recognised by its weight
    int wl = -1, used = 0;
    if (!hit && !q3n && !q4x && t->op == GGML_OP_MUL_MAT && t->src[0] &&
        sscanf(t->src[0]->name, "blk.%d.attn_output.weight%n", &wl, &used) == 1 && used > 0 &&
        !t->src[0]->name[used] && wl >= 0) {
        tap = "attn_out", tap_layer = wl, wk = W_E;
    }
    o->want_attn = 0;
    if (tap) {
        o->kind = WANT_CANON;
        if (tap_layer >= 0)
            snprintf(o->want_name, sizeof o->want_name, "blk.%d.%s", tap_layer, tap);
        else
            snprintf(o->want_name, sizeof o->want_name, "%s", tap);
        o->want_width = o->want_special ? 0 : width_of(o->hp, wk);
        o->want_dtype = dt;
        return 1;
    }
    if (!o->all_nodes || is_view_op(t->op) || t->op == GGML_OP_SET_ROWS) return 0;
    // attention scores and probabilities span the padded KV cells in ne[0]
    o->want_attn = layer >= 0 && (!strcmp(base, "kq") || !strcmp(base, "kq_soft_max")) && t->ne[0] >= o->n_kv;
    if (o->want_attn && t->op == GGML_OP_SOFT_MAX && !strcmp(base, "kq_soft_max")) {
        o->kind = WANT_CANON;
        snprintf(o->want_name, sizeof o->want_name, "blk.%d.attn_probs", layer);
        o->want_width = 0;
        o->want_dtype = TD_DT_F32;
        return 1;
    }
    o->kind = WANT_EXTRA;
    extra_name(o, t, o->want_name);
    o->want_width = 0;
    o->want_dtype = t->type == GGML_TYPE_I32 ? TD_DT_I32 : TD_DT_F32;
    return 1;
}

/* The layer of a "blk.L.x" tap name. */
static int tap_layer_of(const char *name) { return atoi(name + 4); }

/* qwen4exp's special nodes (lc_special >= SP_CONV_STATE_T), converted into cur. */
static int observe_q4x(lc_obs *o, const struct ggml_tensor *t, int64_t n) {
    const td_hparams *hp = o->hp;
    lc_tap *c = &o->cur;
    const int64_t T = o->T, pos0 = o->n_kv - T;
    if (o->want_special == SP_CONV_STATE_T) {
        // [history ; Nv] of ne (hist + T, hc·E): the last hist columns, as rows oldest first
        const int64_t hist = (int64_t)(hp->ple_conv - 1) * hp->ple_ngram, C = width_of(hp, W_HCD), w = t->ne[0];
        if (t->ne[1] != C || w != hist + T || n != w * C)
            return obs_fail(o, TD_EINTERNAL, "llamacpp: node '%s' is not [history ; Nv] of (%lld, %lld) values",
                            t->name, (long long)(hist + T), (long long)C);
        o->spare = grow(o->spare, &o->spare_cap, (size_t)(hist * C) * sizeof(float));
        const float *v = c->data;
        for (int64_t j = 0; j < hist; j++)
            for (int64_t ch = 0; ch < C; ch++) o->spare[j * C + ch] = v[ch * w + T + j];
        memcpy(c->data, o->spare, (size_t)(hist * C) * sizeof(float));
        c->ndim = 2, c->shape[0] = hist, c->shape[1] = C;
        return take_canonical(o, t);
    }
    if (o->want_special == SP_PLE_ROWS) {
        const int64_t np = hp->ple_n_heads;
        if (n != T * np)
            return obs_fail(o, TD_EINTERNAL, "llamacpp: the PLE rows of node '%s' hold %lld values, expected %lld",
                            t->name, (long long)n, (long long)(T * np));
        c->ndim = 2, c->shape[0] = T, c->shape[1] = np;
        return take_canonical(o, t);
    }
    const int L = tap_layer_of(c->name);
    const int64_t r = L >= 0 && L < 256 ? hp->qsa_ratio[L] : 0;
    if (r <= 0) return obs_fail(o, TD_EINTERNAL, "llamacpp: node '%s' of a layer without a QSA ratio", t->name);
    if (o->want_special == SP_KCACHE) {
        // the cache view (di, cells, streams): cells 0..n_kv-1 are this sequence's positions
        const int64_t di = hp->idx_dim;
        if (t->ne[0] != di || t->ne[1] < o->n_kv)
            return obs_fail(o, TD_EINTERNAL, "llamacpp: the indexer cache view '%s' is not (%lld, >= %lld)", t->name,
                            (long long)di, (long long)o->n_kv);
        c->ndim = 2, c->shape[0] = o->n_kv, c->shape[1] = di;
        return take_canonical(o, t);
    }
    if (o->want_special == SP_QSA_SCORES) {
        // (T, padded blocks) by position bucket: the complete ones, -1 where not complete for a token
        const int64_t nbp = t->ne[0], nb = o->n_kv / r;
        if (n != T * nbp || nbp < nb)
            return obs_fail(o, TD_EINTERNAL, "llamacpp: node '%s' holds %lld values, expected %lld tokens x >= %lld blocks",
                            t->name, (long long)n, (long long)T, (long long)nb);
        o->qsa_sc = grow(o->qsa_sc, &o->qsa_sc_cap, (size_t)(T * nbp) * sizeof(float));
        memcpy(o->qsa_sc, c->data, (size_t)(T * nbp) * sizeof(float));
        o->qsa_nb = nbp, o->qsa_layer = L;
        if (nb == 0) return TD_OK; // no complete block yet: no tap, as the reference (the selection still needs the node)
        float *v = c->data;
        for (int64_t i = 0; i < T; i++)
            for (int64_t b = 0; b < nb; b++) v[i * nb + b] = (b + 1) * r <= pos0 + i + 1 ? o->qsa_sc[i * nbp + b] : -1.0f;
        c->ndim = 2, c->shape[0] = T, c->shape[1] = nb;
        return take_canonical(o, t);
    }
    // SP_QSA_SEL: (T, W) cell indices in the peer's (unstable) top-k order
    const int64_t W = t->ne[0];
    if (n != T * W || W > 4096)
        return obs_fail(o, TD_EINTERNAL, "llamacpp: node '%s' holds %lld values, expected %lld tokens x W", t->name,
                        (long long)n, (long long)T);
    if (o->qsa_layer != L || !o->qsa_sc)
        return obs_fail(o, TD_EINTERNAL, "llamacpp: node '%s' comes without its layer's indexer_score", t->name);
    for (int64_t i = 0; i < T; i++) {
        const int64_t p = pos0 + i;
        int32_t *row = (int32_t *)c->data + i * W;
        int64_t m = 0;
        for (int64_t j = 0; j < W; j++) // masked cells (a later position, an empty cell) leave
            if (row[j] >= 0 && row[j] <= p) row[m++] = row[j];
        // the catalog's order (its top-k order is unstable): a dense row ascending, as the
        // reference writes it; a sparse one in rank order with the peer's own scores
        if (p + 1 <= W) {
            td_sort_i32(row, (size_t)m);
            for (int64_t j = m; j < W; j++) row[j] = -1;
        } else {
            td_qsa_rank_f32(row, m, W, p, r, o->qsa_sc + i * o->qsa_nb);
        }
    }
    c->ndim = 2, c->shape[0] = T, c->shape[1] = W;
    return take_canonical(o, t);
}

/* qwen3next's special nodes (lc_special), already converted into cur. */
static int observe_special(lc_obs *o, const struct ggml_tensor *t, int64_t n) {
    const td_hparams *hp = o->hp;
    lc_tap *c = &o->cur;
    float *v = c->data;
    const int64_t T = o->T, Hv = hp->ssm_dt_rank, dk = hp->ssm_d_state, VD = hp->ssm_d_inner;
    if (o->want_special >= SP_CONV_STATE_T) return observe_q4x(o, t, n);
    if (o->want_special == SP_FLAT) {
        if (n != T)
            return obs_fail(o, TD_EINTERNAL, "llamacpp: node '%s' holds %lld values, expected one per token (%lld)",
                            t->name, (long long)n, (long long)T);
        c->ndim = 1, c->shape[0] = T;
        return take_canonical(o, t);
    }
    if (o->want_special == SP_CONV_STATE) {
        const int64_t K1 = hp->ssm_conv - 1, C = 2 * (int64_t)hp->ssm_n_group * dk + VD, w = t->ne[0];
        if (t->ne[1] != C || w != K1 + T || n != w * C)
            return obs_fail(o, TD_EINTERNAL, "llamacpp: node '%s' is not [state ; m] of (%lld, %lld) values",
                            t->name, (long long)(K1 + T), (long long)C);
        for (int64_t ch = 0; ch < C; ch++) // the last K-1 inputs of each channel, oldest first
            memmove(v + ch * K1, v + ch * w + T, (size_t)K1 * sizeof(float));
        c->ndim = 2, c->shape[0] = C, c->shape[1] = K1;
        return take_canonical(o, t);
    }
    // SP_GDN: output first (T, Hv, dv), then the state (Hv, dv, dk) with key index fastest
    const int64_t n_out = T * VD, n_state = Hv * dk * dk;
    if (n != n_out + n_state)
        return obs_fail(o, TD_EINTERNAL, "llamacpp: node '%s' holds %lld values, expected %lld outputs + %lld state",
                        t->name, (long long)n, (long long)n_out, (long long)n_state);
    o->spare = grow(o->spare, &o->spare_cap, (size_t)n_state * sizeof(float));
    memcpy(o->spare, v + n_out, (size_t)n_state * sizeof(float));
    char core[TD_TAP_NAME_MAX];
    memcpy(core, c->name, sizeof core);
    c->ndim = 2, c->shape[0] = T, c->shape[1] = VD;
    int rc = take_canonical(o, t);
    if (rc) return rc;
    c = &o->cur; // take_canonical swapped the buffers
    const char *dot = strrchr(core, '.');
    snprintf(c->name, sizeof c->name, "%.*s.ssm_state", (int)(dot - core), core);
    c->dtype = TD_DT_F32;
    c->data = grow(c->data, &c->cap, (size_t)n_state * sizeof(float));
    memcpy(c->data, o->spare, (size_t)n_state * sizeof(float));
    c->ndim = 3, c->shape[0] = Hv, c->shape[1] = dk, c->shape[2] = dk;
    return take_canonical(o, t);
}

/* ask=false: reads the node accepted by classify. */
static int observe(lc_obs *o, const struct ggml_tensor *node) {
    // an input or cache view is read through the node that consumes it
    const struct ggml_tensor *t = o->want_src >= 0 ? node->src[o->want_src] : node;
    if (!t) return obs_fail(o, TD_EINTERNAL, "llamacpp: node '%s' lost its source %d", node->name, o->want_src);
    const int64_t ne0_used = o->want_attn ? o->n_kv : t->ne[0];
    const int64_t n = ne0_used * t->ne[1] * t->ne[2] * t->ne[3];
    lc_tap *c = &o->cur;
    memcpy(c->name, o->want_name, sizeof c->name);
    c->dtype = o->want_dtype;
    if (o->want_width > 0) {
        // canonical [T, W]: T must be the outermost dimension of the node
        const int64_t W = o->want_width, T = o->T;
        int outer = 3;
        while (outer > 0 && t->ne[outer] == 1) outer--;
        if (n != T * W || (T > 1 && t->ne[outer] != T))
            return obs_fail(o, TD_EINTERNAL,
                            "llamacpp: node '%s' does not hold [T, W] rows (expected T*W = %lld values, found %lld)",
                            t->name, (long long)(T * W), (long long)n);
        c->ndim = 2;
        c->shape[0] = T;
        c->shape[1] = W;
    } else {
        // the node's own shape, outermost first, without outer 1s
        int top = 3;
        while (top > 0 && t->ne[top] == 1) top--;
        c->ndim = top + 1;
        for (int d = 0; d <= top; d++) c->shape[d] = d == top ? ne0_used : t->ne[top - d];
    }
    if (o->kind == WANT_CANON && o->want_src >= 0 && o->perturb[0] && !strcmp(o->want_name, o->perturb))
        // a tap read from an input or a cache view (qsa_kcache, inp.ple_rows):
        // scaling the cache would carry into later steps, and ignoring the
        // request would make a perturbation check pass without a perturbation
        return obs_fail(o, TD_EINPUT, "llamacpp: TD_LLAMACPP_PERTURB: tap %s is read from an operand of node '%s', "
                        "not computed by it: perturb the tap that feeds it",
                        o->want_name, node->name);
    if (o->kind == WANT_CANON && o->want_src < 0 && o->perturb[0] && !strcmp(o->want_name, o->perturb)) {
        // the test hook: the graph goes on with the scaled values (on a
        // device: read, scale, write back before the next node runs)
        if (t->type != GGML_TYPE_F32 || !ggml_is_contiguous(t) || !t->buffer)
            return obs_fail(o, TD_EINPUT, "llamacpp: TD_LLAMACPP_PERTURB: node '%s' (tap %s) is not a contiguous "
                            "F32 tensor", t->name, o->want_name);
        const int host = ggml_backend_buffer_is_host(t->buffer);
        const size_t nb = ggml_nbytes(t);
        float *v = t->data;
        if (!host) {
            o->raw = grow(o->raw, &o->raw_cap, nb);
            ggml_backend_tensor_get((struct ggml_tensor *)t, o->raw, 0, nb);
            v = (float *)o->raw;
        }
        for (int64_t i = 0; i < ggml_nelements(t); i++) v[i] *= o->perturb_scale;
        if (!host) ggml_backend_tensor_set((struct ggml_tensor *)t, o->raw, 0, nb);
    }
    c->data = grow(c->data, &c->cap, (size_t)(n ? n : 1) * 4);
    int rc = convert(o, t, ne0_used, o->want_dtype == TD_DT_I32, c->data);
    if (rc) return rc;
    if (o->want_special) return observe_special(o, t, n);
    if (o->kind == WANT_CANON) return take_canonical(o, t);
    {
        flush_held(o); // keep execution order
        emit(o, c);
    }
    return TD_OK;
}

static bool eval_cb(struct ggml_tensor *t, bool ask, void *user) {
    lc_obs *o = user;
    if (ask) {
        o->want = NULL;
        if (!o->sink || o->rc) return false;
        if (!classify(o, t)) return false;
        o->want = t;
        return true;
    }
    if (o->rc) return false;
    if (t != o->want) {
        obs_fail(o, TD_EINTERNAL, "llamacpp: the eval callback was handed node '%s' that it had not asked for",
                 t->name);
        return false;
    }
    o->want = NULL;
    return observe(o, t) == TD_OK; // false aborts the graph
}

/* ===================================================================== */
/* A crash of the peer                                                    */
/* ===================================================================== */

/* The arms run inside tapdiff's process, so a crash of the peer (llama.cpp,
 * its GPU backend, or the device's driver: lavapipe's worker threads) ends
 * tapdiff with no verdict. Without a word the user sees only the shell's
 * "Segmentation fault" or glibc's heap message and cannot tell a tapdiff bug
 * from the peer's. While a GPU arm is open this handler names the arm, the
 * step and the thread on stderr, then hands the signal on to the handler it
 * replaced (the default: core dump, exit status 128 + signal; a sanitizer's
 * under -Db_sanitize), so a crash never reads as a verdict. Only
 * async-signal-safe calls below. */
static const int k_crash_sigs[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
#define N_CRASH_SIGS (sizeof k_crash_sigs / sizeof k_crash_sigs[0])
static struct sigaction g_crash_old[N_CRASH_SIGS];
static struct {
    volatile sig_atomic_t open; // GPU arms open
    volatile sig_atomic_t in_step;
    const char *volatile arm;
    volatile long long pos0, T;
    volatile pid_t caller; // the thread in llama_decode
    volatile sig_atomic_t installed;
} g_crash;

static void crash_put(const char *str) {
    size_t n = strlen(str);
    while (n) {
        const ssize_t k = write(STDERR_FILENO, str, n);
        if (k <= 0) return;
        str += k, n -= (size_t)k;
    }
}

static void crash_put_ll(long long v) {
    char buf[24], *e = buf + sizeof buf - 1;
    *e = '\0';
    const int neg = v < 0;
    unsigned long long u = neg ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    do *--e = (char)('0' + u % 10);
    while ((u /= 10) && e > buf + 1);
    if (neg) *--e = '-';
    crash_put(e);
}

static void crash_handler(int sig, siginfo_t *si, void *uc) {
    (void)uc;
    size_t i = 0;
    while (i < N_CRASH_SIGS && k_crash_sigs[i] != sig) i++;
    if (g_crash.open > 0) {
        const pid_t tid = (pid_t)syscall(SYS_gettid);
        char comm[32] = "?";
        const int fd = open("/proc/thread-self/comm", O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            const ssize_t k = read(fd, comm, sizeof comm - 1);
            comm[k > 0 ? k : 1] = '\0';
            if (k > 0 && comm[k - 1] == '\n') comm[k - 1] = '\0';
            close(fd);
        }
        const char *name = sig == SIGSEGV ? "SIGSEGV" : sig == SIGBUS ? "SIGBUS" : sig == SIGILL ? "SIGILL"
                         : sig == SIGFPE  ? "SIGFPE"  : "SIGABRT";
        crash_put("\ntapdiff: the ");
        crash_put(g_crash.arm ? g_crash.arm : "llama.cpp GPU");
        crash_put(" arm crashed: ");
        crash_put(name);
        crash_put(" in thread ");
        crash_put_ll(tid);
        crash_put(" '");
        crash_put(comm);
        crash_put(tid == g_crash.caller ? "' (the thread running the arm: llama.cpp's code or tapdiff's tap callback)"
                                        : "' (not the thread running the arm: a worker of llama.cpp or of the "
                                          "device's driver)");
        if (g_crash.in_step) {
            crash_put(", in its forward of ");
            crash_put_ll(g_crash.T);
            crash_put(" token(s) at position ");
            crash_put_ll(g_crash.pos0);
        } else {
            crash_put(", outside a forward");
        }
        crash_put(". The peer crashed inside tapdiff's process: no verdict (README \"A crash of the peer\").\n");
    }
    // the previous handler takes it from here: a fault re-executes into it,
    // a sent signal (abort's, kill's) is sent again
    if (i < N_CRASH_SIGS) sigaction(sig, &g_crash_old[i], NULL);
    else signal(sig, SIG_DFL);
    if (si->si_code <= 0) raise(sig);
}

void td_llamacpp_crash_guard(const char *arm, int on) {
    if (on) {
        g_crash.arm = arm;
        g_crash.caller = (pid_t)syscall(SYS_gettid);
        g_crash.open++;
    } else if (g_crash.open > 0) {
        g_crash.open--;
    }
    if (!on || g_crash.installed) return;
    g_crash.installed = 1;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = crash_handler;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < N_CRASH_SIGS; i++) sigaction(k_crash_sigs[i], &sa, &g_crash_old[i]);
}

/* ===================================================================== */
/* The backend                                                            */
/* ===================================================================== */

static void lc_close(td_backend *b) {
    lc_backend *s = (lc_backend *)b;
    if (!s) return;
    if (s->crash_guarded) td_llamacpp_crash_guard(NULL, 0);
    if (s->batch.token) llama_batch_free(s->batch);
    if (s->lctx) llama_free(s->lctx);
    if (s->lm) llama_model_free(s->lm);
    free(s->obs.held.data);
    free(s->obs.cur.data);
    free(s->obs.raw);
    free(s->obs.row);
    free(s->obs.spare);
    free(s->obs.qsa_sc);
    free(s->obs.emitted);
    free(s->obs.counts);
    free(s);
}

static bool load_progress(float progress, void *user) {
    (void)progress, (void)user;
    return true; // the default callback prints dots
}

static int env_flag(const char *name) {
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0");
}

/* The arithmetic this arm computes with, from what its device does
 * (../shared/spec/llamacpp-peer.md, measured on lavapipe):
 *   CPU: 8-bit activations before quantized matmuls (act-q8);
 *   GPU: steps of several tokens convert the attention operands (Q and the
 *   permuted K/V cache views) to f16 (attn-f16); devices with integer dot
 *   products quantize activations of quantized matmuls to q8_1 blocks
 *   (act-q8_1); with flash attention K and V are cast to f16 on every
 *   backend (fa-f16), and lavapipe's flash-attention shader sums in f16 in
 *   an order its subgroup size fixes (fa-acc-f16@S); ggml-cpu's kernel
 *   keeps an f16 output (fa-cpu), on the CPU arm and for the head sizes
 *   ggml-vulkan leaves to the CPU. */
/* ggml-cpu: 8-bit activations, and its rope cache forms the angle by
 * repeated f32 multiplication (rope-f32-mul). */
#define LC_CPU_PROFILE "act-q8+rope-f32-mul"

/* The Vulkan device's rotation bound (rope-trig@U, in units of
 * 2^-24 (1 + |theta|)). lavapipe: measured from the arm's own rope taps
 * (qwen3-q4_k 40 + 16 steps, llama-f32 1 + 64: every pair within 3.5 of
 * the exact rotation by the f32 pow angle; README "The rotary angle").
 * Any other device: the Vulkan specification's precision for sin and cos,
 * 2^-11 absolute, the honest worst case a driver may return (loose: a rope
 * tap's budget is then ~1e-3 relative). */
#define LC_VK_ROPE_TRIG_LAVAPIPE 4
#define LC_VK_ROPE_TRIG_SPEC 8192
static int vk_rope_trig_u(const lc_gpu *g) {
    return strstr(g->caps, "llvmpipe") || strstr(g->desc, "llvmpipe") ? LC_VK_ROPE_TRIG_LAVAPIPE : LC_VK_ROPE_TRIG_SPEC;
}

static void declare_profile(lc_backend *s, const td_model *m) {
    char *p = s->profile;
    const size_t n = sizeof s->profile;
    if (s->kind == LC_CPU) {
        snprintf(p, n, "%s", LC_CPU_PROFILE);
    } else {
        const lc_gpu *g = &g_gpu[s->kind];
        // fp16 devices load the tiled matmul (steps of more than 8 tokens;
        // attention at any step of several tokens) into f16 tiles
        snprintf(p, n, "%s", g->fp16 ? "attn-f16+mm-f16@8" : "native");
        // ggml-vulkan sums quantized tiles in f16 on fp16 devices without
        // cooperative matrices or integer dot products (its f16acc shaders)
        if (s->kind == LC_VULKAN && g->fp16 && !g->coopmat && !g->int_dot) snprintf(p + strlen(p), n - strlen(p), "+acc-f16");
        if (g->int_dot) snprintf(p + strlen(p), n - strlen(p), "+act-q8_1");
        // ggml-vulkan forms the angle as float(pos) * pow(theta_scale, i) and
        // rotates with the device's pow/sin/cos: their bound is the device's
        // (rope-trig@U, README "The rotary angle")
        if (s->kind == LC_VULKAN && s->rope_trig_u > 0)
            snprintf(p + strlen(p), n - strlen(p), "+rope-f32-pow+rope-trig@%d", s->rope_trig_u);
    }
    if (s->flash_attn) {
        if (!strcmp(p, "native")) p[0] = '\0';
        snprintf(p + strlen(p), n - strlen(p), "%sfa-f16", p[0] ? "+" : "");
        s->fa_kernel = LC_FA_F16;
        // lavapipe runs ggml-vulkan's scalar flash-attention shader, whose
        // f16 accumulation follows from its subgroup size (fa-acc-f16); the
        // tuning of other vendors' devices differs and is not modelled
        const lc_gpu *g = &g_gpu[s->kind];
        const int sg = s->kind == LC_VULKAN ? cap_int(g->caps, "warp size:") : -1;
        if (g->fp16 && !g->coopmat && sg >= 1 && sg <= 32 && !(sg & (sg - 1)) && m->hp.head_dim % 8 == 0 &&
            (strstr(g->caps, "llvmpipe") || strstr(g->desc, "llvmpipe")))
            snprintf(p + strlen(p), n - strlen(p), "+fa-acc-f16@%d", sg), s->fa_kernel = LC_FA_ACC_F16;
        // ggml-vulkan refuses FLASH_ATTN_EXT for head sizes that are not a
        // multiple of 8 (ggml_backend_vk_device_supports_op), on any device:
        // the scheduler runs it on ggml-cpu, whose kernel sums in f16 (fa-cpu)
        if ((s->kind == LC_VULKAN && m->hp.head_dim % 8) || s->kind == LC_CPU)
            snprintf(p + strlen(p), n - strlen(p), "+fa-cpu"), s->fa_kernel = LC_FA_CPU;
    }
}

static int lc_open_kind(lc_kind kind, td_backend **out, const td_model *m, const td_backend_params *p, td_err *err) {
    *out = NULL;
    const char *arm = kind == LC_CPU ? "llamacpp" : kind == LC_VULKAN ? "llamacpp:vulkan" : "llamacpp:cuda";
    int rc = td_llamacpp_init(err);
    if (rc) return rc;
    if (kind != LC_CPU && (rc = gpu_ready(kind, err))) return rc;
    if (p && p->inject && p->inject[0])
        return td_err_set(err, TD_EINPUT, "%s: fault injection '%s' is not available in the llama.cpp peer", arm,
                          p->inject);
    if ((rc = td_fwd_check_layers(arm, td_llamacpp_backend.layer_kinds, m, err))) return rc;
    // the CPU arm computes one way: asking for it by its profile's name is fine
    // (act-q8 alone, its name before the rope rule, still names it)
    if (kind == LC_CPU && !env_flag("TD_LLAMACPP_FLASH_ATTN") && p && p->profile && p->profile[0] &&
        strcmp(p->profile, "native") && strcmp(p->profile, "act-q8") && strcmp(p->profile, LC_CPU_PROFILE))
        return td_err_set(err, TD_EINPUT,
                          "llamacpp: arithmetic profile '%s' is not llama.cpp's (it computes " LC_CPU_PROFILE
                          "; native means the same)",
                          p->profile);
    const char *path = m->gguf ? m->gguf->path : NULL;
    if (!path) return td_err_set(err, TD_EINPUT, "%s: the model has no file path to give llama.cpp", arm);

    lc_backend *s = td_xcalloc(1, sizeof *s);
    s->kind = kind;
    // flash attention fuses attention into one node and casts K/V to f16;
    // on request only (ggml-cpu's kernel is fa-cpu, on the CPU arm as on a
    // Vulkan device that leaves it a head size)
    s->flash_attn = env_flag("TD_LLAMACPP_FLASH_ATTN");
    if (kind == LC_VULKAN) {
        s->rope_trig_u = vk_rope_trig_u(&g_gpu[kind]);
        // a device measured elsewhere (vulkan::rope_trig_bound_holds_on_the_device)
        // declares its own bound; 0 declares no rope rule (the arm before it)
        const char *rt = getenv("TD_LLAMACPP_ROPE_TRIG");
        if (rt && *rt) {
            char *end = NULL;
            const long u = strtol(rt, &end, 10);
            if (end == rt || *end || u < 0 || u > (1L << 20)) {
                free(s);
                return td_err_set(err, TD_EINPUT,
                                  "llamacpp:vulkan: TD_LLAMACPP_ROPE_TRIG='%.40s': expected the device's rope bound U "
                                  "in units of 2^-24 (1 + |theta|), 0 to 1048576 (0: declare no rope rule)",
                                  rt);
            }
            s->rope_trig_u = (int)u, s->rope_trig_env = 1;
        }
    }
    declare_profile(s, m);
    // llama.cpp computes one way: asking for it by its profile's name is fine
    if (p && p->profile && p->profile[0] && strcmp(p->profile, "native") && strcmp(p->profile, s->profile) &&
        !(kind == LC_CPU && !strcmp(p->profile, "act-q8"))) {
        const char *want = p->profile;
        char decl[sizeof s->profile];
        memcpy(decl, s->profile, sizeof decl);
        free(s);
        return td_err_set(err, TD_EINPUT,
                          "%s: arithmetic profile '%s' is not what this arm computes (it computes %s; native means the "
                          "same)",
                          arm, want, decl);
    }
    s->m = m;
    s->user = kind == LC_CPU && env_flag("TD_LLAMACPP_USER_DEFAULTS");
    s->logits_last = p && p->logits_last;
    s->n_ctx = p && p->n_ctx ? p->n_ctx : m->hp.n_ctx_train;
    if (s->n_ctx < 1) s->n_ctx = 4096;
    s->n_vocab = m->hp.n_vocab;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    s->threads = p && p->threads > 0 ? p->threads : (ncpu > 0 ? (int)ncpu : 1);
    s->obs.hp = &m->hp;
    s->obs.all_nodes = env_flag("TD_LLAMACPP_ALL_NODES");
    const char *pert = getenv("TD_LLAMACPP_PERTURB");
    // one arm of a bisect that runs several llama.cpp arms in one process
    const char *pert_arm = getenv("TD_LLAMACPP_PERTURB_ARM");
    if (pert_arm && *pert_arm && strcmp(pert_arm, arm)) pert = NULL;
    if (pert && *pert) {
        const char *star = strrchr(pert, '*');
        char *end = NULL;
        const double sc = star ? strtod(star + 1, &end) : 0;
        if (!star || star == pert || (size_t)(star - pert) >= sizeof s->obs.perturb || end == star + 1 || *end ||
            !(sc == sc)) {
            lc_close(&s->base);
            return td_err_set(err, TD_EINPUT, "llamacpp: TD_LLAMACPP_PERTURB='%.80s': expected TAP*SCALE, e.g. "
                              "blk.1.attn_v*1.01", pert);
        }
        memcpy(s->obs.perturb, pert, (size_t)(star - pert));
        s->obs.perturb_scale = (float)sc;
    }

    char why[512];
    struct llama_model_params mp = llama_model_default_params();
    // an explicit device list: with a GPU backend loaded in this process the
    // default (NULL) would offload the CPU arm too
    ggml_backend_dev_t devs[2] = {kind == LC_CPU ? NULL : g_gpu[kind].dev, NULL};
    mp.devices = devs;
    mp.n_gpu_layers = kind == LC_CPU ? 0 : 100000;
    mp.split_mode = LLAMA_SPLIT_MODE_NONE;
    mp.main_gpu = 0;
    mp.use_extra_bufts = s->user; // weight repacking only as users get it (it changes the arithmetic)
    mp.progress_callback = load_progress;
    log_clear();
    s->lm = llama_model_load_from_file(path, mp);
    if (!s->lm) {
        lc_close(&s->base);
        return td_err_set(err, TD_EINPUT, "llamacpp: %s: llama.cpp cannot load the model: %s", path,
                          log_last(why, sizeof why));
    }
    const struct llama_vocab *vocab = llama_model_get_vocab(s->lm);
    const int64_t lv = llama_vocab_n_tokens(vocab), le = llama_model_n_embd(s->lm),
                  ll = llama_model_n_layer(s->lm);
    if (lv != s->n_vocab || le != m->hp.n_embd || ll != m->hp.n_layer) {
        lc_close(&s->base);
        return td_err_set(err, TD_EINPUT,
                          "llamacpp: %s: llama.cpp reads V=%lld E=%lld layers=%lld, tapdiff's loader V=%lld E=%lld "
                          "layers=%lld",
                          path, (long long)lv, (long long)le, (long long)ll, (long long)s->n_vocab,
                          (long long)m->hp.n_embd, (long long)m->hp.n_layer);
    }

    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)s->n_ctx;
    cp.n_batch = cp.n_ubatch = (uint32_t)s->n_ctx; // a prefill is one graph
    s->n_seq = p && p->n_seq > 1 ? (int)p->n_seq : 1;
    if (s->n_seq > TD_SEQ_MAX) s->n_seq = TD_SEQ_MAX;
    cp.n_seq_max = (uint32_t)s->n_seq;
    // one cache of n_ctx cells for all sequences, not n_ctx / n_seq_max each
    if (s->n_seq > 1) cp.kv_unified = true;
    cp.n_threads = cp.n_threads_batch = s->threads;
    cp.flash_attn_type = s->flash_attn ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.offload_kqv = kind != LC_CPU;
    cp.op_offload = kind != LC_CPU;
    cp.type_k = cp.type_v = GGML_TYPE_F32;
    cp.cb_eval = eval_cb;
    cp.cb_eval_user_data = &s->obs;
    if (s->user) { // llama-bench's defaults; no node callback (it costs time and taps are refused)
        cp.n_ubatch = 512 < cp.n_batch ? 512 : cp.n_batch;
        cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_AUTO;
        cp.type_k = cp.type_v = GGML_TYPE_F16;
        cp.cb_eval = NULL;
        cp.cb_eval_user_data = NULL;
    }
    cp.embeddings = false;
    cp.no_perf = true;
    log_clear();
    s->lctx = llama_init_from_model(s->lm, cp);
    if (!s->lctx) {
        lc_close(&s->base);
        return td_err_set(err, TD_EINTERNAL, "llamacpp: %s: llama.cpp cannot create a context of %lld positions: %s",
                          path, (long long)s->n_ctx, log_last(why, sizeof why));
    }
    s->batch = llama_batch_init((int32_t)s->n_ctx, 0, 1);

    if (kind == LC_CPU && s->user)
        snprintf(s->version, sizeof s->version,
                 "llama.cpp %s (%s), ggml-cpu-%s%s%.200s%s, user defaults: weight repacking on, flash_attn auto, kv "
                 "f16, n_ubatch %u, threads %d",
                 llama_version(), TD_LLAMACPP_FETCHED, g_variant, g_features[0] ? " [" : "", g_features,
                 g_features[0] ? "]" : "", cp.n_ubatch, s->threads);
    else if (kind == LC_CPU)
        snprintf(s->version, sizeof s->version,
                 "llama.cpp %s (%s), ggml-cpu-%s%s%.200s%s, flash_attn %s, kv f32, n_ubatch = n_ctx = %lld, threads %d%s",
                 llama_version(), TD_LLAMACPP_FETCHED, g_variant, g_features[0] ? " [" : "", g_features,
                 g_features[0] ? "]" : "", s->flash_attn ? "on (fa-cpu)" : "off", (long long)s->n_ctx, s->threads,
                 s->obs.all_nodes ? ", all nodes" : "");
    else { // the device and what changes its arithmetic are provenance
        char rope_trig[96] = "";
        if (kind == LC_VULKAN && !s->rope_trig_u)
            snprintf(rope_trig, sizeof rope_trig, ", no rope rule (TD_LLAMACPP_ROPE_TRIG=0)");
        else if (kind == LC_VULKAN)
            snprintf(rope_trig, sizeof rope_trig, ", rope-trig bound %d (%s)", s->rope_trig_u,
                     s->rope_trig_env                          ? "TD_LLAMACPP_ROPE_TRIG"
                     : s->rope_trig_u == LC_VK_ROPE_TRIG_LAVAPIPE ? "measured on lavapipe"
                                                                 : "Vulkan spec: sin/cos 2^-11 absolute");
        snprintf(s->version, sizeof s->version,
                 "llama.cpp %s (%s), ggml-%s device '%.120s' [%.300s], fp16 %d, int dot %d, coopmat %d, flash_attn "
                 "%s, kv f32, fusion %s, n_ubatch = n_ctx = %lld%s%s",
                 llama_version(), TD_LLAMACPP_FETCHED, kind_name[kind], g_gpu[kind].desc, g_gpu[kind].caps,
                 g_gpu[kind].fp16, g_gpu[kind].int_dot, g_gpu[kind].coopmat,
                 s->fa_kernel == LC_FA_OFF       ? "off"
                 : s->fa_kernel == LC_FA_CPU     ? "on (head size not a multiple of 8: on ggml-cpu, fa-cpu)"
                 : s->fa_kernel == LC_FA_ACC_F16 ? "on (fa-acc-f16)"
                                                 : "on",
                 getenv("GGML_VK_DISABLE_FUSION") ? "off" : "on",
                 (long long)s->n_ctx, s->obs.all_nodes ? ", all nodes" : "", rope_trig);
    }
    if (s->obs.perturb[0]) { // provenance: this arm is wrong on purpose
        size_t len = strlen(s->version);
        snprintf(s->version + len, sizeof s->version - len, ", PERTURBED %s x %g", s->obs.perturb,
                 (double)s->obs.perturb_scale);
    }
    s->base.vt = &td_llamacpp_backend;
    if (kind != LC_CPU) td_llamacpp_crash_guard(arm, 1), s->crash_guarded = 1;
    *out = &s->base;
    return TD_OK;
}

static int lc_forward(td_backend *b, const int32_t *tokens, int64_t T, int64_t pos0, td_tap_sink *sink,
                      double *logits, td_err *err) {
    lc_backend *s = (lc_backend *)b;
    int rc = td_fwd_check_step("llamacpp", tokens, T, pos0, s->n_past, s->n_ctx, s->n_vocab, err);
    if (rc) return rc;

    if (s->user && sink)
        return td_err_set(err, TD_EINPUT, "llamacpp: TD_LLAMACPP_USER_DEFAULTS is for speed only; taps need the "
                                          "aligned settings (unset it)");
    // the rows the caller reads: all, or the last one (bench --logits-last)
    const int64_t t_out = s->logits_last && !sink ? T - 1 : 0;
    struct llama_batch *bt = &s->batch;
    bt->n_tokens = (int32_t)T;
    int32_t *pos32 = td_xmalloc((size_t)T * sizeof *pos32);
    for (int64_t t = 0; t < T; t++) {
        bt->token[t] = tokens[t];
        bt->pos[t] = (llama_pos)(pos0 + t);
        bt->n_seq_id[t] = 1;
        bt->seq_id[t][0] = s->seq;
        bt->logits[t] = t >= t_out; // every position, else the last layer computes only the requested rows
    }
    td_fwd_tap_inputs(sink, tokens, T, pos0, pos32);
    free(pos32);

    lc_obs *o = &s->obs;
    o->sink = sink;
    o->T = T;
    o->n_kv = pos0 + T;
    o->want = NULL;
    o->have_held = 0;
    o->n_emitted = o->n_counts = 0;
    o->rc = 0;
    o->cells_are_pos = s->n_seq == 1;
    o->q4x_comb_layer = -1;
    o->qsa_layer = -1;
    log_clear();
    if (s->crash_guarded) g_crash.pos0 = pos0, g_crash.T = T, g_crash.in_step = 1;
    const int32_t dr = llama_decode(s->lctx, *bt);
    g_crash.in_step = 0;
    if (!o->rc) flush_held(o);
    o->sink = NULL;
    if (o->rc) return td_err_set(err, o->rc, "%s", o->err.msg);
    char why[512];
    if (dr != 0)
        return td_err_set(err, TD_EINTERNAL, "llamacpp: llama_decode of %lld tokens at position %lld returned %d: %s",
                          (long long)T, (long long)pos0, (int)dr, log_last(why, sizeof why));

    for (int64_t t = t_out; t < T; t++) {
        const float *row = llama_get_logits_ith(s->lctx, (int32_t)t);
        if (!row)
            return td_err_set(err, TD_EINTERNAL, "llamacpp: llama.cpp has no logits for token %lld of the step",
                              (long long)t);
        double *dst = logits + t * s->n_vocab;
        for (int64_t v = 0; v < s->n_vocab; v++) dst[v] = (double)row[v];
    }

    // the step succeeded: commit its positions and the token history
    s->n_past = pos0 + T;
    td_hist_push(&s->hist, tokens, T);
    td_hist_tap(&s->hist, sink);
    return TD_OK;
}

static void lc_reset(td_backend *b) {
    lc_backend *s = (lc_backend *)b;
    llama_memory_clear(llama_get_memory(s->lctx), true);
    s->n_past = 0;
    td_hist_reset(&s->hist);
    s->seq = 0;
    for (int i = 0; i < TD_SEQ_MAX; i++) s->seq_past[i] = 0, td_hist_reset(&s->seq_hist[i]);
}

/* The sequences llama.cpp was opened for (td_backend_params.n_seq). */
static int lc_seq_check(const lc_backend *s, int seq, td_err *err) {
    if (seq < 0 || seq >= s->n_seq)
        return td_err_set(err, TD_EINPUT, "llamacpp: sequence %d out of range: the context holds %d (n_seq_max)", seq,
                          s->n_seq);
    return TD_OK;
}

/* The current sequence's counters live in n_past / hist; the others in seq_*. */
static int64_t *lc_past(lc_backend *s, int seq) { return seq == s->seq ? &s->n_past : &s->seq_past[seq]; }
static td_hist *lc_hist(lc_backend *s, int seq) { return seq == s->seq ? &s->hist : &s->seq_hist[seq]; }

/* llama.cpp's own account of a sequence after an operation must match ours. */
static int lc_seq_verify(lc_backend *s, int seq, const char *op, td_err *err) {
    const llama_pos max = llama_memory_seq_pos_max(llama_get_memory(s->lctx), seq);
    if ((int64_t)max + 1 != *lc_past(s, seq))
        return td_err_set(err, TD_EINTERNAL,
                          "llamacpp: after %s, llama_memory_seq_pos_max(seq %d) = %d: expected %lld", op, seq,
                          (int)max, (long long)*lc_past(s, seq) - 1);
    return TD_OK;
}

static int lc_seq_use(td_backend *b, int seq, td_err *err) {
    lc_backend *s = (lc_backend *)b;
    int rc = lc_seq_check(s, seq, err);
    if (rc || seq == s->seq) return rc;
    s->seq_past[s->seq] = s->n_past, s->seq_hist[s->seq] = s->hist;
    s->seq = seq;
    s->n_past = s->seq_past[seq], s->hist = s->seq_hist[seq];
    return TD_OK;
}

static int lc_seq_rm(td_backend *b, int seq, int64_t p0, td_err *err) {
    lc_backend *s = (lc_backend *)b;
    int rc = lc_seq_check(s, seq, err);
    if (rc) return rc;
    int64_t *past = lc_past(s, seq);
    if (p0 < 0 || p0 >= *past) return p0 < 0 ? td_err_set(err, TD_EINPUT, "llamacpp: rollback to %lld", (long long)p0) : TD_OK;
    log_clear();
    char why[512];
    // the tail [p0, inf): a partial removal, which llama.cpp refuses for a
    // recurrent state without rollback snapshots: this arm cannot do it (skip)
    if (!llama_memory_seq_rm(llama_get_memory(s->lctx), seq, (llama_pos)p0, -1))
        return td_err_set(err, TD_SKIP,
                          "llamacpp: llama_memory_seq_rm(seq %d, %lld, -1) refused the rollback: its recurrent memory "
                          "keeps one state per sequence, not one per position, so it can only clear a sequence from "
                          "position 0 (%s)",
                          seq, (long long)p0, log_last(why, sizeof why));
    td_hist *h = lc_hist(s, seq);
    const int64_t dropped = *past - p0;
    h->n = h->n > dropped ? h->n - dropped : 0;
    *past = p0;
    return lc_seq_verify(s, seq, "seq_rm", err);
}

static int lc_seq_cp(td_backend *b, int src, int dst, td_err *err) {
    lc_backend *s = (lc_backend *)b;
    int rc = lc_seq_check(s, src, err);
    if (!rc) rc = lc_seq_check(s, dst, err);
    if (rc || src == dst) return rc;
    llama_memory_t mem = llama_get_memory(s->lctx);
    // seq_cp adds src's cells to dst: what dst held must go first
    if (!llama_memory_seq_rm(mem, dst, -1, -1))
        return td_err_set(err, TD_EINTERNAL, "llamacpp: llama_memory_seq_rm(seq %d, -1, -1) refused", dst);
    llama_memory_seq_cp(mem, src, dst, -1, -1);
    *lc_past(s, dst) = *lc_past(s, src);
    *lc_hist(s, dst) = *lc_hist(s, src);
    return lc_seq_verify(s, dst, "seq_cp", err);
}

static const char *lc_version(const td_backend *b) {
    return ((const lc_backend *)b)->version;
}

static const char *lc_profile_of(const td_backend *b) {
    return ((const lc_backend *)b)->profile;
}

int td_llamacpp_load_check(const char *path, td_err *err) {
    int rc = td_llamacpp_init(err);
    if (rc) return rc;
    struct llama_model_params mp = llama_model_default_params();
    ggml_backend_dev_t devs[1] = {NULL}; // CPU only, whatever else this process loaded
    mp.devices = devs;
    mp.n_gpu_layers = 0;
    mp.progress_callback = load_progress;
    log_clear();
    struct llama_model *lm = llama_model_load_from_file(path, mp);
    char why[512];
    if (!lm) {
        char prev[512];
        pthread_mutex_lock(&g_log_mu);
        snprintf(prev, sizeof prev, "%s", g_log_prev);
        pthread_mutex_unlock(&g_log_mu);
        return td_err_set(err, TD_EINPUT, "llamacpp: %s: %s%s%s", path, prev, prev[0] ? " / " : "",
                          log_last(why, sizeof why));
    }
    llama_model_free(lm);
    return TD_OK;
}

static int lc_open(td_backend **out, const td_model *m, const td_backend_params *p, td_err *err) {
    return lc_open_kind(LC_CPU, out, m, p, err);
}
static int lc_open_vulkan(td_backend **out, const td_model *m, const td_backend_params *p, td_err *err) {
    return lc_open_kind(LC_VULKAN, out, m, p, err);
}
static int lc_open_cuda(td_backend **out, const td_model *m, const td_backend_params *p, td_err *err) {
    return lc_open_kind(LC_CUDA, out, m, p, err);
}

static int probe_kind(lc_kind k, char *why, size_t n) {
    td_err e = {{0}};
    int rc = td_llamacpp_init(&e);
    if (!rc && k != LC_CPU) rc = gpu_ready(k, &e);
    if (rc)
        snprintf(why, n, "%s", e.msg);
    else if (k == LC_CPU)
        snprintf(why, n, "ggml-cpu-%s", g_variant);
    else
        snprintf(why, n, "%s%s%s", g_gpu[k].desc, g_gpu[k].caps[0] ? ": " : "", g_gpu[k].caps);
    return rc;
}
static int lc_probe(char *why, size_t n) { return probe_kind(LC_CPU, why, n); }
static int lc_probe_vulkan(char *why, size_t n) { return probe_kind(LC_VULKAN, why, n); }
static int lc_probe_cuda(char *why, size_t n) { return probe_kind(LC_CUDA, why, n); }

const td_backend_vt td_llamacpp_backend = {
    .name = "llamacpp",
    .precision = "f32",
    .open = lc_open,
    .forward = lc_forward,
    .reset = lc_reset,
    .close = lc_close,
    .version = lc_version,
    // the CPU matmul rounds activations to Q8_0 / Q8_K blocks (quants.md §8)
    .profile = LC_CPU_PROFILE,
    .profile_of = lc_profile_of,
    .probe = lc_probe,
    // GDN: qwen3next's rules below; HC_*: qwen4exp runs (llama.cpp's own graph) with its logits mapped only
    .layer_kinds = TD_KINDS(TD_LAYER_ATTENTION) | TD_KINDS(TD_LAYER_GDN) | TD_KINDS(TD_LAYER_HC_GDN) |
                   TD_KINDS(TD_LAYER_HC_QSA),
    .seq_rm = lc_seq_rm,
    .seq_cp = lc_seq_cp,
    .seq_use = lc_seq_use,
};

/* The same adapter on llama.cpp's Vulkan backend (any Vulkan device,
 * lavapipe on a machine without a GPU). The declared profile below is
 * lavapipe's (fp16, no integer dot, no cooperative matrices); each instance
 * declares its device's own. */
const td_backend_vt td_llamacpp_vulkan_backend = {
    .name = "llamacpp:vulkan",
    .precision = "f32",
    .open = lc_open_vulkan,
    .forward = lc_forward,
    .reset = lc_reset,
    .close = lc_close,
    .version = lc_version,
    .profile = "attn-f16+mm-f16@8+acc-f16+rope-f32-pow+rope-trig@4",
    .profile_of = lc_profile_of,
    .probe = lc_probe_vulkan,
    .layer_kinds = TD_KINDS(TD_LAYER_ATTENTION),
};

/* ... and on llama.cpp's CUDA backend (fetched with --cuda only). */
const td_backend_vt td_llamacpp_cuda_backend = {
    .name = "llamacpp:cuda",
    .precision = "f32",
    .open = lc_open_cuda,
    .forward = lc_forward,
    .reset = lc_reset,
    .close = lc_close,
    .version = lc_version,
    .profile = "attn-f16+act-q8_1@0+mm-f16@8",
    .profile_of = lc_profile_of,
    .probe = lc_probe_cuda,
    .layer_kinds = TD_KINDS(TD_LAYER_ATTENTION),
};
