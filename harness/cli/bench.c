/* tapdiff bench: throughput of one backend on one model — prefill and decode
 * tokens/s, peak RSS, and the memory-bandwidth bound of decode (every weight
 * is read once per decoded token, so tokens/s <= read bandwidth / weight
 * bytes per token). Also writes the benchmark models (bench/bench_model.h).
 * Timings are wall clock, best of --repeat runs after one warm-up, taps off;
 * on a shared machine repeat and take the best. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "../bench/bench_model.h"
#include "args.h"
#include "cli.h"
#include "cpu.h"
#include "runner.h"

#define CMD "bench"

static const char *const bench_help =
    "usage: tapdiff bench --model M.gguf --backend B [--threads N] [--prompt-len P | --prompt TEXT |\n"
    "                     --prompt-file F] [--gen G]\n"
    "                     [--repeat R] [--logits-last] [--json]\n"
    "       tapdiff bench --make-model OUT.gguf --type T [--size 200m|tiny]\n"
    "\n"
    "Measures backend B on model M: a prefill of P tokens in one forward, then G decode\n"
    "steps of one token (greedy), taps off. One warm-up run, then R timed runs; the best\n"
    "of each is reported (the machine may be shared: best-of-R is the least disturbed).\n"
    "Also prints peak RSS (getrusage) and the decode memory-bandwidth bound: the weight\n"
    "bytes one decode step reads over a streaming-read bandwidth measured here with the\n"
    "same thread count on a buffer far above the last-level cache.\n"
    "\n"
    "  --model M          GGUF model file\n"
    "  --backend B        a registered backend (cpu, llamacpp, ref32, ref, ...)\n"
    "  --threads N        backend threads (default 0: every core)\n"
    "  --profile P        arithmetic profile (cpu: native (default) or act-q8)\n"
    "  --prompt-len P     prefill tokens (default 128: ids spread over the vocabulary)\n"
    "  --prompt TEXT      prefill this text instead, tokenized with the model's tokenizer\n"
    "                     (P is then its token count)\n"
    "  --prompt-file F    the same from a file, byte for byte\n"
    "  --gen G            decode steps (default 32)\n"
    "  --repeat R         timed runs (default 3)\n"
    "  --bw-mib N         bandwidth probe buffer in MiB (default 512)\n"
    "  --logits-last      compute logits for the last position of the prefill only, as\n"
    "                     llama-bench does (backends that honour it: cpu, llamacpp)\n"
    "  --json             one JSON object on stdout instead of text\n"
    "\n"
    "  --make-model OUT   write a benchmark model (llama arch, random weights) and exit\n"
    "  --type T           its weight type: Q4_K, Q8_0, F16, ... (norms stay F32)\n"
    "  --size S           200m (default: ~200M parameters, memory-bound) or tiny\n"
    "\n"
    "exit: 0 ok, 2 usage, 3 bad model, 77 backend not built, 99 internal error\n";

typedef struct bench_args {
    const char *model, *backend, *make_model, *type, *size, *profile;
    const char *prompt_text, *prompt_file;
    long long threads, prompt, gen, repeat, bw_mib;
    int json, prompt_len_given, logits_last;
    const int32_t *ids; /* the tokenized --prompt (then prompt = its count) */
} bench_args;

static int parse_ll(const char *s, long long lo, long long hi, long long *v) {
    char *end;
    long long x = strtoll(s, &end, 10);
    if (!*s || *end || x < lo || x > hi) return -1;
    *v = x;
    return 0;
}

/* -1 after --help, 0 ok, TD_EUSAGE (message printed) */
static int parse_args(int argc, char **argv, bench_args *a) {
    memset(a, 0, sizeof *a);
    a->prompt = 128, a->gen = 32, a->repeat = 3, a->bw_mib = 512, a->size = "200m";
    td_args p;
    td_args_init(&p, CMD, bench_help, argc, argv);
    for (int k; (k = td_args_next(&p)) != TD_ARG_END;) {
        if (k == TD_ARG_ERROR) return TD_EUSAGE;
        const char *arg = p.arg;
        if (k == TD_ARG_POS)
            return td_cli_failf(CMD, TD_EUSAGE, "unexpected argument '%s' (see tapdiff bench --help)", arg);
        if (k == TD_ARG_HELP) {
            fputs(bench_help, stdout);
            return -1;
        }
        if (!strcmp(arg, "--json")) {
            a->json = 1;
            continue;
        }
        if (!strcmp(arg, "--logits-last")) {
            a->logits_last = 1;
            continue;
        }
        const char *val = td_args_value(&p);
        if (!val) return TD_EUSAGE;
        long long *num = NULL, lo = 0, hi = 0;
        if (!strcmp(arg, "--model")) a->model = val;
        else if (!strcmp(arg, "--backend")) a->backend = val;
        else if (!strcmp(arg, "--make-model")) a->make_model = val;
        else if (!strcmp(arg, "--type")) a->type = val;
        else if (!strcmp(arg, "--size")) a->size = val;
        else if (!strcmp(arg, "--profile")) a->profile = val;
        else if (!strcmp(arg, "--prompt")) a->prompt_text = val;
        else if (!strcmp(arg, "--prompt-file")) a->prompt_file = val;
        else if (!strcmp(arg, "--threads")) num = &a->threads, lo = 0, hi = 4096;
        else if (!strcmp(arg, "--prompt-len")) num = &a->prompt, lo = 1, hi = 1 << 20, a->prompt_len_given = 1;
        else if (!strcmp(arg, "--gen")) num = &a->gen, lo = 0, hi = 1 << 20;
        else if (!strcmp(arg, "--repeat")) num = &a->repeat, lo = 1, hi = 1000;
        else if (!strcmp(arg, "--bw-mib")) num = &a->bw_mib, lo = 1, hi = 1 << 20;
        else return td_args_unknown(&p);
        if (num && parse_ll(val, lo, hi, num))
            return td_cli_failf(CMD, TD_EUSAGE, "%s: expected an integer in %lld..%lld, got '%s'", arg, lo, hi, val);
    }
    if (a->make_model) {
        if (!a->type) return td_cli_failf(CMD, TD_EUSAGE, "--make-model needs --type (Q4_K, Q8_0, F16, ...)");
        return 0;
    }
    if (!a->model) return td_cli_failf(CMD, TD_EUSAGE, "--model is required (see tapdiff bench --help)");
    if (!a->backend) return td_cli_failf(CMD, TD_EUSAGE, "--backend is required (see tapdiff bench --help)");
    if (!!a->prompt_len_given + !!a->prompt_text + !!a->prompt_file > 1)
        return td_cli_failf(CMD, TD_EUSAGE, "give at most one of --prompt-len, --prompt and --prompt-file");
    return 0;
}

static int make_model(const bench_args *a) {
    td_bench_model_cfg cfg;
    if (!td_bench_model_preset(a->size, &cfg))
        return td_cli_failf(CMD, TD_EUSAGE, "--size: expected 200m or tiny, got '%s'", a->size);
    int type = -1;
    for (int t = 0; t < TD_TYPE_COUNT; t++) {
        const td_type_info *ti = td_type_get(t);
        if (ti && ti->name && !strcasecmp(ti->name, a->type)) type = t;
    }
    if (type < 0) return td_cli_failf(CMD, TD_EUSAGE, "--type: unknown type '%s'", a->type);
    td_err err = {{0}};
    fprintf(stderr, "tapdiff bench: writing %s (%s, %.1fM parameters)...\n", a->make_model, a->type,
            (double)td_bench_model_params(&cfg) / 1e6);
    int rc = td_bench_model_write(a->make_model, &cfg, type, &err);
    if (rc) return td_cli_fail(CMD, rc, &err);
    char sha[65];
    if ((rc = td_sha256_file(a->make_model, sha, &err))) return td_cli_fail(CMD, rc, &err);
    printf("%s  %s\n", sha, a->make_model);
    return TD_OK;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Bytes of weights one decode token reads: every matrix and norm of every
 * layer and the output head, one embedding row, and for a MoE layer the
 * router plus K of the X experts. */
static double decode_weight_bytes(const td_model *m) {
    const td_hparams *hp = &m->hp;
    double bytes = (double)m->tok_embd->row_bytes + (double)m->output->nbytes + (m->output_norm ? (double)m->output_norm->nbytes : 0.0);
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        const td_layer *L = &m->layers[l];
        const td_tensor *dense[] = {L->attn.norm,   L->attn.wq,     L->attn.wk,   L->attn.wv,     L->attn.wqkv,
                                    L->attn.bq,     L->attn.bk,     L->attn.bv,   L->attn.bqkv,   L->attn.wo,
                                    L->attn.bo,     L->attn.q_norm, L->attn.k_norm, L->ffn.norm,  L->ffn.gate,
                                    L->ffn.up,      L->ffn.down,    L->ffn.gate_inp};
        for (size_t i = 0; i < sizeof dense / sizeof dense[0]; i++)
            if (dense[i]) bytes += (double)dense[i]->nbytes;
        const td_tensor *exps[] = {L->ffn.gate_exps, L->ffn.up_exps, L->ffn.down_exps};
        for (size_t i = 0; i < 3; i++)
            if (exps[i] && hp->n_expert) bytes += (double)exps[i]->nbytes * hp->n_expert_used / hp->n_expert;
    }
    return bytes;
}

typedef struct bench_result {
    double prefill_tps, decode_tps; /* best of the repeats */
    double prefill_s, decode_s;     /* the best runs' times */
    long peak_rss_kib;
    double weight_bytes, bw_bytes_s, bound_tps;
    char version[512];
} bench_result;

static int run_bench(const bench_args *a, const td_backend_vt *vt, const td_model *m, bench_result *res,
                     td_err *err) {
    const int64_t P = a->prompt, G = a->gen, V = m->hp.n_vocab;
    td_backend_params bp = {.threads = (int)a->threads, .n_ctx = (uint32_t)(P + G), .profile = a->profile,
                            .logits_last = a->logits_last};
    td_backend *be = NULL;
    int rc = vt->open(&be, m, &bp, err);
    if (rc) return rc;
    snprintf(res->version, sizeof res->version, "%s", vt->version ? vt->version(be) : vt->name);
    int32_t *prompt = td_xmalloc((size_t)P * sizeof *prompt);
    // ids spread over the vocabulary, away from the first (special) ids
    for (int64_t i = 0; i < P; i++)
        prompt[i] = a->ids ? a->ids[i] : (int32_t)(V > 16 ? 3 + (i * 7919) % (V - 3) : i % V);
    double *logits = td_xmalloc((size_t)(P > 1 ? P : 1) * (size_t)V * sizeof *logits);
    res->prefill_tps = res->decode_tps = 0;
    for (long long r = 0; r <= a->repeat && !rc; r++) { // run 0 is the warm-up (page faults, caches)
        vt->reset(be);
        double t0 = now_s();
        if ((rc = vt->forward(be, prompt, P, 0, NULL, logits, err))) break;
        const double tp = now_s() - t0;
        int32_t tok = td_argmax(logits + (P - 1) * V, V);
        t0 = now_s();
        for (int64_t g = 0; g < G && !rc; g++) {
            rc = vt->forward(be, &tok, 1, P + g, NULL, logits, err);
            tok = td_argmax(logits, V);
        }
        const double td = now_s() - t0;
        if (rc || r == 0) continue;
        if ((double)P / tp > res->prefill_tps) res->prefill_tps = (double)P / tp, res->prefill_s = tp;
        if (G > 0 && (double)G / td > res->decode_tps) res->decode_tps = (double)G / td, res->decode_s = td;
        fprintf(stderr, "tapdiff bench: run %lld/%lld: prefill %.1f tok/s, decode %.2f tok/s\n", r, a->repeat,
                (double)P / tp, G > 0 ? (double)G / td : 0.0);
    }
    free(logits);
    free(prompt);
    vt->close(be);
    if (rc) return rc;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    res->peak_rss_kib = ru.ru_maxrss;
    res->weight_bytes = decode_weight_bytes(m);
    res->bw_bytes_s = td_cpu_read_bandwidth((int)a->threads, (size_t)a->bw_mib << 20, 5);
    res->bound_tps = res->bw_bytes_s > 0 ? res->bw_bytes_s / res->weight_bytes : 0;
    return TD_OK;
}

int td_cmd_bench(int argc, char **argv) {
    bench_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc < 0) return TD_OK;
    if (rc) return rc;
    if (a.make_model) return make_model(&a);

    const td_backend_vt *vt = td_backend_find(a.backend);
    if (!vt) {
        // a backend tapdiff knows of but this build lacks is a skip, not a usage error
        const char *why = td_backend_absent_reason(a.backend);
        if (why) return td_cli_failf(CMD, TD_SKIP, "%s", why);
        char names[256];
        td_backend_names(names, sizeof names);
        return td_cli_failf(CMD, TD_EUSAGE, "unknown backend '%s' (known: %s)", a.backend, names);
    }
    td_err err = {{0}};
    td_model *m = NULL;
    char *prompt_text = NULL;
    size_t prompt_len = 0;
    int32_t *ids = NULL;
    int64_t n_ids = 0;
    if ((rc = td_cli_prompt(a.model, a.prompt_text, a.prompt_file, &prompt_text, &prompt_len, &ids, &n_ids, &err)))
        return td_cli_fail(CMD, rc, &err);
    free(prompt_text);
    if (ids) a.ids = ids, a.prompt = n_ids;
    if ((rc = td_model_open(&m, a.model, &err))) {
        free(ids);
        return td_cli_fail(CMD, rc, &err);
    }
    bench_result r;
    memset(&r, 0, sizeof r);
    rc = run_bench(&a, vt, m, &r, &err);
    free(ids);
    a.ids = NULL;
    if (rc) {
        td_model_close(m);
        return td_cli_fail(CMD, rc, &err);
    }
    const double mib = 1024.0 * 1024.0;
    if (a.json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "model", a.model);
        cJSON_AddStringToObject(o, "backend", a.backend);
        cJSON_AddStringToObject(o, "backend_version", r.version);
        cJSON_AddStringToObject(o, "profile", a.profile ? a.profile : "native");
        cJSON_AddNumberToObject(o, "threads", (double)a.threads);
        cJSON_AddNumberToObject(o, "prompt_len", (double)a.prompt);
        cJSON_AddNumberToObject(o, "gen", (double)a.gen);
        cJSON_AddNumberToObject(o, "repeat", (double)a.repeat);
        cJSON_AddStringToObject(o, "logits", a.logits_last ? "last" : "all");
        cJSON_AddNumberToObject(o, "prefill_tok_s", r.prefill_tps);
        cJSON_AddNumberToObject(o, "decode_tok_s", r.decode_tps);
        cJSON_AddNumberToObject(o, "peak_rss_mib", (double)r.peak_rss_kib / 1024.0);
        cJSON_AddNumberToObject(o, "decode_weight_mib_per_token", r.weight_bytes / mib);
        cJSON_AddNumberToObject(o, "read_bw_gib_s", r.bw_bytes_s / (mib * 1024.0));
        cJSON_AddNumberToObject(o, "decode_bound_tok_s", r.bound_tps);
        cJSON_AddNumberToObject(o, "decode_fraction_of_bound", r.bound_tps > 0 ? r.decode_tps / r.bound_tps : 0);
        char *s = cJSON_Print(o);
        puts(s);
        free(s);
        cJSON_Delete(o);
    } else {
        printf("model      %s (%s, %u layers, E=%u, V=%u)\n", a.model, td_arch_name(m->hp.arch), m->hp.n_layer,
               m->hp.n_embd, m->hp.n_vocab);
        printf("backend    %s: %s\n", a.backend, r.version);
        printf("threads    %lld%s\n", a.threads, a.threads ? "" : " (every core)");
        printf("prefill    %.1f tok/s  (%lld tokens, best of %lld, logits of %s)\n", r.prefill_tps, a.prompt, a.repeat,
               a.logits_last ? "the last position" : "every position");
        printf("decode     %.2f tok/s  (%lld steps, best of %lld)\n", r.decode_tps, a.gen, a.repeat);
        printf("peak RSS   %.1f MiB\n", (double)r.peak_rss_kib / 1024.0);
        printf("bound      %.2f tok/s = read bandwidth %.2f GiB/s / %.1f MiB of weights per token"
               " (decode at %.0f%% of it)\n",
               r.bound_tps, r.bw_bytes_s / (mib * 1024.0), r.weight_bytes / mib,
               r.bound_tps > 0 ? 100.0 * r.decode_tps / r.bound_tps : 0.0);
    }
    td_model_close(m);
    return TD_OK;
}
