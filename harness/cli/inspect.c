/* tapdiff inspect: what a GGUF file holds (container, metadata, tensors), how
 * tapdiff binds it (architecture summary) and whether it is valid, as text for
 * people or one JSON document for tools. A file that parses but does not bind
 * still shows its container first, so the error can be read against it. */
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "cli.h"
#include "arch.h"
#include "model.h"

#define CMD "inspect"
/* tensors listed without --tensors up to this many (a small model fits a screen) */
#define LIST_TENSORS_MAX 100
/* array entries shown per key: tokenizer arrays are long and alike, so fewer */
#define ARR_HEAD 8
#define ARR_HEAD_TOKENIZER 4
/* string values longer than this are cut in text output (chat templates) */
#define STR_SHOW_MAX 80

static void usage(FILE *f) {
    char archs[256];
    td_arch_names(archs, sizeof archs, ", "); // the architecture table, not a copy of it
    fprintf(f,
            "usage: tapdiff inspect MODEL.gguf [--json] [--tensors] [--no-sha256] [--help]\n"
            "\n"
            "Prints a GGUF file's container (size, sha256, version, alignment, counts), its metadata\n"
            "(arrays as [TYPE x N] with their first entries), its tensors (type, shape, offset; always\n"
            "listed up to %d tensors, all with --tensors), the architecture tapdiff binds\n"
            "(%s) and the verdict line \"valid: ...\".\n"
            "\n"
            "  --json        one JSON document on stdout (all tensors; \"valid\" and \"error\" fields)\n"
            "  --tensors     list every tensor even when there are more than %d\n"
            "  --no-sha256   skip hashing the file (large models)\n"
            "  --help        this text\n"
            "\n"
            "exit: 0 valid model, 2 usage, 3 the file does not parse or does not bind (message on stderr)\n",
            LIST_TENSORS_MAX, archs, LIST_TENSORS_MAX);
}

/* ------------------------------------------------------------------------ */
/* Value formatting                                                           */

/* Bytes as a C-ish quoted string for a terminal, cut at max bytes. */
static void print_str(FILE *f, const char *p, uint64_t n, uint64_t max) {
    fputc('"', f);
    uint64_t shown = n < max ? n : max;
    for (uint64_t i = 0; i < shown; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c == '\n') fputs("\\n", f);
        else if (c == '\t') fputs("\\t", f);
        else if (c < 0x20 || c == 0x7f) fprintf(f, "\\x%02x", c);
        else fputc(c, f);
    }
    fputc('"', f);
    if (shown < n) fprintf(f, "... (%" PRIu64 " bytes)", n);
}

/* A NUL-terminated copy that is valid UTF-8 (a JSON document must be):
 * invalid bytes and NULs become '?'. */
static char *utf8_clean(const char *p, uint64_t n) {
    char *s = td_xmalloc((size_t)n + 1);
    const unsigned char *u = (const unsigned char *)p;
    uint64_t i = 0;
    while (i < n) {
        unsigned c = u[i];
        size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        int ok = len > 0 && i + len <= n && c != 0;
        for (size_t k = 1; ok && k < len; k++) ok = (u[i + k] & 0xC0) == 0x80;
        if (!ok) {
            s[i++] = '?';
            continue;
        }
        memcpy(s + i, p + i, len);
        i += len;
    }
    s[n] = '\0';
    return s;
}

static int is_signed_vt(int t) {
    return t == TD_GGUF_INT8 || t == TD_GGUF_INT16 || t == TD_GGUF_INT32 || t == TD_GGUF_INT64;
}
static int is_float_vt(int t) { return t == TD_GGUF_FLOAT32 || t == TD_GGUF_FLOAT64; }

static void print_scalar(FILE *f, const td_gguf_kv *kv) {
    int t = (int)kv->type;
    if (t == TD_GGUF_STRING) print_str(f, kv->str.ptr, kv->str.len, STR_SHOW_MAX);
    else if (t == TD_GGUF_BOOL) fputs(kv->v.u ? "true" : "false", f);
    else if (is_float_vt(t)) fprintf(f, "%.9g", kv->v.f);
    else if (is_signed_vt(t)) fprintf(f, "%" PRId64, kv->v.i);
    else fprintf(f, "%" PRIu64, kv->v.u);
}

static uint64_t arr_head_n(const td_gguf_kv *kv) {
    uint64_t h = kv->key.len >= 10 && memcmp(kv->key.ptr, "tokenizer.", 10) == 0 ? ARR_HEAD_TOKENIZER : ARR_HEAD;
    return kv->arr_n < h ? kv->arr_n : h;
}

static void print_array(FILE *f, const td_gguf_kv *kv) {
    int et = (int)kv->arr_type;
    fprintf(f, "[%s x %" PRIu64 "]", td_gguf_vtype_name(et), kv->arr_n);
    uint64_t h = arr_head_n(kv);
    if (et == TD_GGUF_ARRAY || (et != TD_GGUF_STRING && !kv->arr_data)) return;
    if (et == TD_GGUF_STRING && !kv->arr_str) return;
    for (uint64_t i = 0; i < h; i++) {
        fputs(i ? ", " : " ", f);
        if (et == TD_GGUF_STRING) print_str(f, kv->arr_str[i].ptr, kv->arr_str[i].len, 32);
        else if (is_float_vt(et)) fprintf(f, "%.9g", td_gguf_arr_f64(kv, i));
        else if (et == TD_GGUF_BOOL) fputs(td_gguf_arr_i64(kv, i) ? "true" : "false", f);
        else if (et == TD_GGUF_UINT64) fprintf(f, "%" PRIu64, (uint64_t)td_gguf_arr_i64(kv, i));
        else fprintf(f, "%" PRId64, td_gguf_arr_i64(kv, i));
    }
    if (h < kv->arr_n) fputs(", ...", f);
}

static cJSON *json_scalar(const td_gguf_kv *kv) {
    int t = (int)kv->type;
    if (t == TD_GGUF_STRING) {
        char *s = utf8_clean(kv->str.ptr, kv->str.len);
        cJSON *j = cJSON_CreateString(s);
        free(s);
        return j;
    }
    if (t == TD_GGUF_BOOL) return cJSON_CreateBool(kv->v.u != 0);
    if (is_float_vt(t)) return cJSON_CreateNumber(kv->v.f);
    if (is_signed_vt(t)) return cJSON_CreateNumber((double)kv->v.i);
    return cJSON_CreateNumber((double)kv->v.u);
}

static cJSON *json_kv(const td_gguf_kv *kv) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", td_gguf_vtype_name((int)kv->type));
    if (kv->type != TD_GGUF_ARRAY) {
        cJSON_AddItemToObject(o, "value", json_scalar(kv));
        return o;
    }
    int et = (int)kv->arr_type;
    cJSON_AddStringToObject(o, "elem_type", td_gguf_vtype_name(et));
    cJSON_AddNumberToObject(o, "n", (double)kv->arr_n);
    cJSON *head = cJSON_AddArrayToObject(o, "head");
    if (et == TD_GGUF_ARRAY || (et == TD_GGUF_STRING && !kv->arr_str) || (et != TD_GGUF_STRING && !kv->arr_data))
        return o;
    uint64_t h = arr_head_n(kv);
    for (uint64_t i = 0; i < h; i++) {
        if (et == TD_GGUF_STRING) {
            char *s = utf8_clean(kv->arr_str[i].ptr, kv->arr_str[i].len);
            cJSON_AddItemToArray(head, cJSON_CreateString(s));
            free(s);
        } else if (is_float_vt(et)) cJSON_AddItemToArray(head, cJSON_CreateNumber(td_gguf_arr_f64(kv, i)));
        else if (et == TD_GGUF_BOOL) cJSON_AddItemToArray(head, cJSON_CreateBool(td_gguf_arr_i64(kv, i) != 0));
        else if (et == TD_GGUF_UINT64)
            cJSON_AddItemToArray(head, cJSON_CreateNumber((double)(uint64_t)td_gguf_arr_i64(kv, i)));
        else cJSON_AddItemToArray(head, cJSON_CreateNumber((double)td_gguf_arr_i64(kv, i)));
    }
    return o;
}

static void fmt_shape(char *buf, size_t n, const td_tensor *t) {
    uint32_t nd = t->n_dims ? t->n_dims : 1;
    if (nd > TD_MAX_DIMS) nd = TD_MAX_DIMS;
    size_t o = (size_t)snprintf(buf, n, "{");
    for (uint32_t i = 0; i < nd && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%" PRId64, i ? ", " : "", t->ne[i]);
    if (o < n) snprintf(buf + o, n - o, "}");
}

/* ------------------------------------------------------------------------ */
/* Container (everything td_gguf_open gives, before any binding)              */

static void text_container(const td_gguf *g, const char *sha, int list_tensors) {
    printf("file: %s\n", g->path);
    printf("size: %zu bytes\n", g->size);
    printf("sha256: %s\n", sha ? sha : "(skipped)");
    printf("gguf version: %u\n", g->version);
    printf("alignment: %u\n", g->alignment);
    printf("data offset: %zu\n", g->data_start);
    printf("n_kv: %" PRIu64 "\n", g->n_kv);
    printf("n_tensors: %" PRIu64 "\n", g->n_tensors);

    printf("\nmetadata (%" PRIu64 " keys):\n", g->n_kv);
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const td_gguf_kv *kv = &g->kv[i];
        printf("  %.*s = ", (int)kv->key.len, kv->key.ptr);
        if (kv->type == TD_GGUF_ARRAY) print_array(stdout, kv);
        else {
            printf("%s ", td_gguf_vtype_name((int)kv->type));
            print_scalar(stdout, kv);
        }
        putchar('\n');
    }

    if (list_tensors) {
        printf("\ntensors (%" PRIu64 "):\n", g->n_tensors);
        for (uint64_t i = 0; i < g->n_tensors; i++) {
            const td_tensor *t = &g->tensors[i];
            char shape[128];
            fmt_shape(shape, sizeof shape, t);
            printf("  %-32s %-7s %-22s offset %-10" PRIu64 " %zu bytes\n", t->cname, td_type_name(t->type), shape,
                   t->offset, t->nbytes);
        }
    } else {
        printf("\ntensors: %" PRIu64 " (more than %d; --tensors lists them)\n", g->n_tensors, LIST_TENSORS_MAX);
    }
}

static cJSON *json_container(const td_gguf *g, const char *sha) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "path", g->path);
    cJSON_AddNumberToObject(o, "size", (double)g->size);
    if (sha) cJSON_AddStringToObject(o, "sha256", sha);
    else cJSON_AddNullToObject(o, "sha256");
    cJSON_AddNumberToObject(o, "version", g->version);
    cJSON_AddNumberToObject(o, "alignment", g->alignment);
    cJSON_AddNumberToObject(o, "data_start", (double)g->data_start);
    cJSON_AddNumberToObject(o, "n_kv", (double)g->n_kv);
    cJSON_AddNumberToObject(o, "n_tensors", (double)g->n_tensors);
    cJSON *md = cJSON_AddObjectToObject(o, "metadata");
    for (uint64_t i = 0; i < g->n_kv; i++) {
        char *key = utf8_clean(g->kv[i].key.ptr, g->kv[i].key.len);
        cJSON_AddItemToObject(md, key, json_kv(&g->kv[i]));
        free(key);
    }
    cJSON *ts = cJSON_AddArrayToObject(o, "tensors");
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const td_tensor *t = &g->tensors[i];
        cJSON *jt = cJSON_CreateObject();
        char *name = utf8_clean(t->cname, strlen(t->cname));
        cJSON_AddStringToObject(jt, "name", name);
        free(name);
        cJSON_AddStringToObject(jt, "type", td_type_name(t->type));
        cJSON *sh = cJSON_AddArrayToObject(jt, "shape");
        uint32_t nd = t->n_dims ? t->n_dims : 1;
        for (uint32_t d = 0; d < nd && d < TD_MAX_DIMS; d++)
            cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t->ne[d]));
        cJSON_AddNumberToObject(jt, "offset", (double)t->offset);
        cJSON_AddNumberToObject(jt, "nbytes", (double)t->nbytes);
        cJSON_AddItemToArray(ts, jt);
    }
    return o;
}

/* ------------------------------------------------------------------------ */
/* The bound model                                                            */

/* Tensors of the file that no model field points at (ignored by the binding). */
static uint64_t count_unused(const td_model *m) {
    const td_gguf *g = m->gguf;
    if (g->n_tensors == 0) return 0;
    unsigned char *used = td_xcalloc(g->n_tensors, 1);
#define MARK(p)                                                                                                      \
    do {                                                                                                             \
        const td_tensor *t_ = (p);                                                                                   \
        if (t_ && t_ >= g->tensors && t_ < g->tensors + g->n_tensors) used[t_ - g->tensors] = 1;                     \
    } while (0)
    MARK(m->tok_embd);
    MARK(m->output_norm);
    MARK(m->output);
    MARK(m->rope_freqs);
    for (uint32_t il = 0; il < m->hp.n_layer; il++) {
        const td_layer *l = &m->layers[il];
        const td_tensor *all[] = {l->attn.norm,   l->attn.wq,       l->attn.wk,      l->attn.wv,       l->attn.wqkv,
                                  l->attn.bq,     l->attn.bk,       l->attn.bv,      l->attn.bqkv,     l->attn.wo,
                                  l->attn.bo,     l->attn.q_norm,   l->attn.k_norm,  l->ffn.norm,      l->ffn.gate,
                                  l->ffn.up,      l->ffn.down,      l->ffn.gate_inp, l->ffn.gate_exps, l->ffn.up_exps,
                                  l->ffn.down_exps};
        for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) MARK(all[k]);
        // the hybrids' parts (qwen3next, qwen4exp)
        const td_tensor *hy[] = {l->gdn.norm,          l->gdn.wqkv,          l->gdn.wgate,          l->gdn.wba,
                                 l->gdn.conv,          l->gdn.dt_bias,       l->gdn.a,              l->gdn.ssm_norm,
                                 l->gdn.wout,          l->gdn.wbeta,         l->gdn.walpha,         l->ffn.gate_inp_shexp,
                                 l->ffn.gate_shexp,    l->ffn.up_shexp,      l->ffn.down_shexp,     l->hc_attn.norm,
                                 l->hc_attn.down,      l->hc_attn.up,        l->hc_attn.inject,     l->hc_ffn.norm,
                                 l->hc_ffn.down,       l->hc_ffn.up,         l->hc_ffn.inject,      l->qsa.wq,
                                 l->qsa.wk,            l->qsa.q_norm,        l->qsa.k_norm,         l->ple.key,
                                 l->ple.value,         l->ple.norm_key,      l->ple.norm_query,     l->ple.norm_conv,
                                 l->ple.conv};
        for (size_t k = 0; k < sizeof hy / sizeof hy[0]; k++) MARK(hy[k]);
    }
    MARK(m->hc_out.norm);
    MARK(m->hc_out.down);
    MARK(m->hc_out.up);
    MARK(m->ple_table);
#undef MARK
    uint64_t n = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) n += !used[i];
    free(used);
    return n;
}

static const char *vocab_kind_desc(td_vocab_kind k) {
    switch (k) {
    case TD_VOCAB_NONE: return "none";
    case TD_VOCAB_SPM: return "SentencePiece";
    case TD_VOCAB_BPE: return "byte-level BPE";
    case TD_VOCAB_OTHER: return "other";
    }
    return "?";
}

static const char *scaling_name(td_rope_scaling s) {
    switch (s) {
    case TD_ROPE_SCALING_NONE: return "none";
    case TD_ROPE_SCALING_LINEAR: return "linear";
    case TD_ROPE_SCALING_YARN: return "yarn";
    }
    return "?";
}

static void text_model(const td_model *m) {
    const td_hparams *hp = &m->hp;
    const td_vocab *v = &m->vocab;
    printf("\nmodel:\n");
    printf("  arch: %s\n", td_arch_name(hp->arch));
    printf("  blocks: %u\n", hp->n_layer);
    printf("  n_ctx_train: %u\n", hp->n_ctx_train);
    printf("  embedding (E): %u\n", hp->n_embd);
    printf("  heads (H): %u\n", hp->n_head);
    printf("  kv heads (Hkv): %u\n", hp->n_head_kv);
    printf("  head dim (D): %u\n", hp->head_dim);
    printf("  attention q/k/v: %s\n", m->layers[0].attn.wqkv ? "fused attn_qkv" : "separate");
    if (hp->n_expert) {
        printf("  expert ffn (F): %u\n", hp->n_ff);
        printf("  experts (X): %u, used (K): %u\n", hp->n_expert, hp->n_expert_used);
    } else {
        printf("  ffn (F): %u\n", hp->n_ff);
        printf("  experts (X): 0 (dense)\n");
    }
    printf("  rope: %s, dims %u, base %g, scaling %s, freq_scale %g, attn_factor %g, n_ctx_orig %u%s\n",
           td_rope_type_name(hp->rope_type), hp->rope_dims, (double)hp->rope_base, scaling_name(hp->rope_scaling),
           (double)hp->rope_freq_scale, (double)hp->rope_attn_factor, hp->rope_n_ctx_orig,
           m->rope_freqs ? ", rope_freqs.weight" : "");
    printf("  rms eps: %g\n", (double)hp->rms_eps);
    printf("  vocab: %s (%s), %u tokens, %" PRIu64 " merges, bos %d, eos %d, unk %d\n", v->model[0] ? v->model : "none",
           vocab_kind_desc(v->kind), hp->n_vocab, v->n_merges, v->bos_id, v->eos_id, v->unk_id);
    printf("  output: %s\n", m->output_tied ? "tied to token_embd.weight" : "output.weight");
    printf("  unused tensors: %" PRIu64 "\n", count_unused(m));
}

static cJSON *json_model(const td_model *m) {
    const td_hparams *hp = &m->hp;
    const td_vocab *v = &m->vocab;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "arch", td_arch_name(hp->arch));
    cJSON_AddNumberToObject(o, "n_layer", hp->n_layer);
    cJSON_AddNumberToObject(o, "n_ctx_train", hp->n_ctx_train);
    cJSON_AddNumberToObject(o, "n_embd", hp->n_embd);
    cJSON_AddNumberToObject(o, "n_head", hp->n_head);
    cJSON_AddNumberToObject(o, "n_head_kv", hp->n_head_kv);
    cJSON_AddNumberToObject(o, "head_dim", hp->head_dim);
    cJSON_AddNumberToObject(o, "n_ff", hp->n_ff);
    cJSON_AddNumberToObject(o, "n_expert", hp->n_expert);
    cJSON_AddNumberToObject(o, "n_expert_used", hp->n_expert_used);
    cJSON_AddBoolToObject(o, "fused_qkv", m->layers[0].attn.wqkv != NULL);
    cJSON_AddStringToObject(o, "rope_type", td_rope_type_name(hp->rope_type));
    cJSON_AddNumberToObject(o, "rope_dims", hp->rope_dims);
    cJSON_AddNumberToObject(o, "rope_base", hp->rope_base);
    cJSON_AddStringToObject(o, "rope_scaling", scaling_name(hp->rope_scaling));
    cJSON_AddNumberToObject(o, "rope_freq_scale", hp->rope_freq_scale);
    cJSON_AddNumberToObject(o, "rope_attn_factor", hp->rope_attn_factor);
    cJSON_AddNumberToObject(o, "rope_n_ctx_orig", hp->rope_n_ctx_orig);
    cJSON_AddBoolToObject(o, "rope_freqs", m->rope_freqs != NULL);
    cJSON_AddNumberToObject(o, "rms_eps", hp->rms_eps);
    char *vm = utf8_clean(v->model, strlen(v->model));
    cJSON_AddStringToObject(o, "vocab_model", vm);
    free(vm);
    cJSON_AddStringToObject(o, "vocab_kind", vocab_kind_desc(v->kind));
    cJSON_AddNumberToObject(o, "n_vocab", hp->n_vocab);
    cJSON_AddNumberToObject(o, "n_merges", (double)v->n_merges);
    cJSON_AddNumberToObject(o, "bos_id", v->bos_id);
    cJSON_AddNumberToObject(o, "eos_id", v->eos_id);
    cJSON_AddNumberToObject(o, "unk_id", v->unk_id);
    cJSON_AddBoolToObject(o, "output_tied", m->output_tied);
    cJSON_AddNumberToObject(o, "unused_tensors", (double)count_unused(m));
    return o;
}

static int emit_json(cJSON *doc) {
    char *s = cJSON_Print(doc);
    cJSON_Delete(doc);
    if (!s) return td_cli_failf(CMD, TD_EINTERNAL, "cannot format the JSON document");
    puts(s);
    cJSON_free(s);
    return TD_OK;
}

static void json_verdict(cJSON *doc, const td_err *err) {
    cJSON_AddBoolToObject(doc, "valid", err == NULL);
    if (err) {
        char *e = utf8_clean(err->msg, strlen(err->msg));
        cJSON_AddStringToObject(doc, "error", e);
        free(e);
    } else cJSON_AddNullToObject(doc, "error");
}

/* ------------------------------------------------------------------------ */
/* Entry point                                                                */

int td_cmd_inspect(int argc, char **argv) {
    int json = 0, all_tensors = 0, hash = 1;
    const char *path = NULL;
    td_args p;
    td_args_init(&p, "inspect", NULL, argc, argv);
    p.usage_fn = usage;
    for (int k; (k = td_args_next(&p)) != TD_ARG_END;) {
        if (k == TD_ARG_HELP) {
            usage(stdout);
            return TD_OK;
        }
        if (k == TD_ARG_ERROR) return TD_EUSAGE;
        if (k == TD_ARG_POS) {
            if (path) {
                fprintf(stderr, "tapdiff inspect: expected one MODEL.gguf, found a second one '%s'\n", p.arg);
                usage(stderr);
                return TD_EUSAGE;
            }
            path = p.arg;
        } else if (td_args_is(&p, "--json")) json = 1;
        else if (td_args_is(&p, "--tensors")) all_tensors = 1;
        else if (td_args_is(&p, "--no-sha256")) hash = 0;
        else return td_args_unknown(&p);
    }
    if (!path) {
        fprintf(stderr, "tapdiff inspect: expected MODEL.gguf\n");
        usage(stderr);
        return TD_EUSAGE;
    }

    td_err err = {{0}};
    td_gguf *g = NULL;
    int st = td_gguf_open(&g, path, &err);
    if (st != TD_OK) {
        if (json) {
            cJSON *doc = cJSON_CreateObject();
            cJSON_AddStringToObject(doc, "path", path);
            json_verdict(doc, &err);
            int jst = emit_json(doc);
            if (jst != TD_OK) return jst;
        } else printf("invalid: %s\n", err.msg);
        return td_cli_fail(CMD, st, &err);
    }

    char sha_buf[65], *sha = NULL;
    if (hash) {
        td_err herr = {{0}};
        if (td_sha256_file(path, sha_buf, &herr) != TD_OK) {
            td_gguf_close(g);
            return td_cli_fail(CMD, TD_EINTERNAL, &herr);
        }
        sha = sha_buf;
    }

    /* The container goes out (or into the document) before binding, because
     * td_model_bind owns g from here on and closes it when it fails. */
    cJSON *doc = NULL;
    if (json) doc = json_container(g, sha);
    else text_container(g, sha, all_tensors || g->n_tensors <= LIST_TENSORS_MAX);
    uint64_t n_tensors = g->n_tensors;

    td_model *m = NULL;
    st = td_model_bind(&m, g, &err);
    if (st != TD_OK) {
        if (json) {
            cJSON_AddNullToObject(doc, "model");
            json_verdict(doc, &err);
            int jst = emit_json(doc);
            if (jst != TD_OK) return jst;
        } else printf("\ninvalid: %s\n", err.msg);
        fflush(stdout);
        return td_cli_fail(CMD, st, &err);
    }

    if (json) {
        cJSON_AddItemToObject(doc, "model", json_model(m));
        json_verdict(doc, NULL);
        st = emit_json(doc);
    } else {
        text_model(m);
        printf("\nvalid: %s model, %u blocks, %" PRIu64 " tensors\n", td_arch_name(m->hp.arch), m->hp.n_layer,
               n_tensors);
        st = TD_OK;
    }
    td_model_close(m);
    if (fflush(stdout) != 0) return td_cli_failf(CMD, TD_EINTERNAL, "cannot write to stdout");
    return st;
}
