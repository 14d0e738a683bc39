/* tapdiff: the tokenizers of tokenizer.h. The algorithms follow what
 * llama.cpp does with the same GGUF keys (its ids are the reference the peer
 * test holds us to), including its handling of invalid UTF-8: a byte that does
 * not start a well-formed sequence is U+FFFD for the BPE pre-tokenizer, and
 * SentencePiece splits text into "characters" by the lead byte alone. */
#include "tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 32
#include <pcre2.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* token attributes: llama.cpp's llama_token_attr bit values */
enum {
    ATTR_UNDEFINED = 0,
    ATTR_UNKNOWN = 1 << 0,
    ATTR_UNUSED = 1 << 1,
    ATTR_NORMAL = 1 << 2,
    ATTR_CONTROL = 1 << 3,
    ATTR_USER_DEFINED = 1 << 4,
    ATTR_BYTE = 1 << 5,
};

typedef enum { KIND_SPM = 1, KIND_BPE = 2 } tok_kind;
typedef enum { PRE_NONE = 0, PRE_DEFAULT = 1, PRE_LLAMA3 = 2, PRE_QWEN2 = 3 } pre_kind;

/* ------------------------------------------------------------------------ */
/* A string -> int32 hash map (open addressing, keys copied).                 */

typedef struct smap {
    char **key;
    uint32_t *klen;
    int32_t *val;
    size_t cap; /* power of two */
    size_t n;
} smap;

static uint64_t hash_bytes(const void *p, size_t n) {
    const unsigned char *s = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 1099511628211ull;
    return h;
}

static void smap_init(smap *m, size_t want) {
    size_t cap = 16;
    while (cap < want * 2) cap <<= 1;
    m->cap = cap;
    m->n = 0;
    m->key = td_xcalloc(cap, sizeof *m->key);
    m->klen = td_xcalloc(cap, sizeof *m->klen);
    m->val = td_xcalloc(cap, sizeof *m->val);
}

static void smap_free(smap *m) {
    for (size_t i = 0; i < m->cap; i++) free(m->key[i]);
    free(m->key);
    free(m->klen);
    free(m->val);
    memset(m, 0, sizeof *m);
}

static size_t smap_slot(const smap *m, const char *k, size_t n) {
    size_t i = (size_t)hash_bytes(k, n) & (m->cap - 1);
    while (m->key[i] && !(m->klen[i] == n && !memcmp(m->key[i], k, n))) i = (i + 1) & (m->cap - 1);
    return i;
}

/* -1 when absent */
static int32_t smap_get(const smap *m, const char *k, size_t n) {
    size_t i = smap_slot(m, k, n);
    return m->key[i] ? m->val[i] : -1;
}

/* overwrite: later wins (token_to_id); else the first value stays (bpe_ranks) */
static void smap_put(smap *m, const char *k, size_t n, int32_t v, int overwrite) {
    size_t i = smap_slot(m, k, n);
    if (m->key[i]) {
        if (overwrite) m->val[i] = v;
        return;
    }
    TD_ASSERT(m->n + 1 < m->cap); /* sized for the whole vocabulary at init */
    m->key[i] = td_xmalloc(n + 1);
    memcpy(m->key[i], k, n);
    m->key[i][n] = '\0';
    m->klen[i] = (uint32_t)n;
    m->val[i] = v;
    m->n++;
}

/* ------------------------------------------------------------------------ */
/* Growable buffers                                                           */

typedef struct ibuf {
    int32_t *v;
    size_t n, cap;
} ibuf;

static void ibuf_push(ibuf *b, int32_t x) {
    if (b->n == b->cap) {
        b->cap = b->cap ? b->cap * 2 : 64;
        b->v = td_xrealloc(b->v, b->cap * sizeof *b->v);
    }
    b->v[b->n++] = x;
}

typedef struct cbuf {
    char *v;
    size_t n, cap;
} cbuf;

static void cbuf_add(cbuf *b, const void *p, size_t n) {
    if (b->n + n + 1 > b->cap) {
        while (b->n + n + 1 > b->cap) b->cap = b->cap ? b->cap * 2 : 256;
        b->v = td_xrealloc(b->v, b->cap);
    }
    memcpy(b->v + b->n, p, n);
    b->n += n;
    b->v[b->n] = '\0';
}

/* ------------------------------------------------------------------------ */
/* The tokenizer                                                              */

struct td_tokenizer {
    tok_kind kind;
    pre_kind pre;
    char model[16], pre_name[32];
    uint32_t n;
    char **text;      /* [n], NUL-terminated copies */
    uint32_t *len;    /* [n] */
    float *score;     /* [n] */
    uint32_t *attr;   /* [n] */
    smap tok2id;
    smap ranks;       /* BPE: key = u32 len(left) ++ left ++ right -> merge rank */
    int32_t bos, eos, unk;
    int add_bos, add_eos, add_space_prefix, ignore_merges;
    int32_t *special; /* control / user-defined / unknown ids, longest text first */
    size_t n_special;
    pcre2_code *re[4];
    int n_re;
};

uint32_t td_tokenizer_n_vocab(const td_tokenizer *t) { return t->n; }
const char *td_tokenizer_model(const td_tokenizer *t) { return t->model; }
const char *td_tokenizer_pre(const td_tokenizer *t) { return t->pre_name; }
int32_t td_tokenizer_bos(const td_tokenizer *t) { return t->bos; }
int32_t td_tokenizer_eos(const td_tokenizer *t) { return t->eos; }

void td_tokenizer_free(td_tokenizer *t) {
    if (!t) return;
    for (uint32_t i = 0; i < t->n; i++) free(t->text ? t->text[i] : NULL);
    free(t->text);
    free(t->len);
    free(t->score);
    free(t->attr);
    smap_free(&t->tok2id);
    if (t->ranks.cap) smap_free(&t->ranks);
    free(t->special);
    for (int i = 0; i < t->n_re; i++) pcre2_code_free(t->re[i]);
    free(t);
}

static int str_eq(const td_str *s, const char *c) { return s->len == strlen(c) && !memcmp(s->ptr, c, s->len); }

/* llama.cpp's pre-tokenizer names, grouped by the regexes they mean */
static const char *const k_pre_llama3[] = {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral",
                                           "midm-2.0", "lfm2", "jina-v5-nano"};
static const char *const k_pre_qwen2[] = {"qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2"};

/* The regexes llama.cpp applies for each pre-tokenizer, in order: each one
 * splits the pieces the previous one produced. */
#define RE_LLAMA3_QWEN2(num)                                                                                           \
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|" num                    \
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
static const char *const k_re_llama3[] = {RE_LLAMA3_QWEN2("\\p{N}{1,3}")};
static const char *const k_re_qwen2[] = {RE_LLAMA3_QWEN2("\\p{N}")};
static const char *const k_re_default[] = {
    "[\\p{P}\\$\\+<=>\\^~\\|]+",
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
    "\\p{N}+",
    "[0-9][0-9][0-9]",
};

static int compile_re(td_tokenizer *t, const char *const *src, int n, td_err *err) {
    for (int i = 0; i < n; i++) {
        size_t len = strlen(src[i]);
        PCRE2_UCHAR *pat = td_xmalloc((len + 1) * sizeof *pat);
        for (size_t k = 0; k < len; k++) pat[k] = (unsigned char)src[i][k]; /* the patterns are ASCII */
        int code;
        PCRE2_SIZE off;
        pcre2_code *re = pcre2_compile(pat, len, PCRE2_UTF | PCRE2_UCP, &code, &off, NULL);
        free(pat);
        if (!re) {
            PCRE2_UCHAR msg[256];
            char m8[256];
            int ml = pcre2_get_error_message(code, msg, 256);
            for (int k = 0; k < ml && k < 255; k++) m8[k] = (char)msg[k];
            m8[ml > 0 ? (ml < 255 ? ml : 255) : 0] = '\0';
            return td_err_set(err, TD_EINTERNAL, "tokenizer: pre-tokenizer regex %d does not compile at %zu: %s", i,
                              (size_t)off, m8);
        }
        t->re[t->n_re++] = re;
    }
    return TD_OK;
}

static int key_token_id(const td_gguf *g, const char *key, uint32_t n, int32_t *id, td_err *err) {
    const td_gguf_kv *kv = td_gguf_find(g, key);
    if (*id >= 0 && (uint32_t)*id >= n) *id = -1; /* a default that does not exist in this vocab */
    if (!kv) return TD_OK;
    int64_t v;
    if (kv->type == TD_GGUF_INT8 || kv->type == TD_GGUF_INT16 || kv->type == TD_GGUF_INT32 ||
        kv->type == TD_GGUF_INT64)
        v = kv->v.i;
    else if (kv->type == TD_GGUF_UINT8 || kv->type == TD_GGUF_UINT16 || kv->type == TD_GGUF_UINT32 ||
             kv->type == TD_GGUF_UINT64)
        v = kv->v.u > INT64_MAX ? -1 : (int64_t)kv->v.u;
    else
        return td_err_set(err, TD_EINPUT, "%s: key '%s': expected a UINT32 token id, found %s", g->path, key,
                          td_gguf_vtype_name((int)kv->type));
    *id = (v >= 0 && v < (int64_t)n) ? (int32_t)v : -1;
    return TD_OK;
}

static int key_flag(const td_gguf *g, const char *key, int *flag, td_err *err) {
    return td_gguf_get_bool(g, key, 0, *flag, flag, err);
}

static int cmp_special(const void *a, const void *b, void *ctx) {
    const td_tokenizer *t = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (t->len[x] != t->len[y]) return t->len[x] > t->len[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

int td_tokenizer_open(td_tokenizer **out, const td_gguf *g, td_err *err) {
    *out = NULL;
    const td_gguf_kv *mk = td_gguf_find(g, "tokenizer.ggml.model");
    if (!mk || mk->type != TD_GGUF_STRING)
        return td_err_set(err, TD_EINPUT, "%s: key 'tokenizer.ggml.model': expected a STRING naming the tokenizer, %s",
                          g->path, mk ? "found another type" : "it is missing (the file has no tokenizer)");
    td_tokenizer *t = td_xcalloc(1, sizeof *t);
    int st = TD_OK;
    if (str_eq(&mk->str, "llama")) {
        t->kind = KIND_SPM;
        t->bos = 1, t->eos = 2, t->unk = 0;
        t->add_bos = 1, t->add_space_prefix = 1;
    } else if (str_eq(&mk->str, "gpt2")) {
        t->kind = KIND_BPE;
        t->bos = 11, t->eos = 11, t->unk = -1;
    } else {
        st = td_err_set(err, TD_EINPUT,
                        "%s: key 'tokenizer.ggml.model': expected \"llama\" or \"gpt2\" (the tokenizers tapdiff has), "
                        "found \"%.*s\"",
                        g->path, (int)(mk->str.len > 64 ? 64 : mk->str.len), mk->str.ptr);
        goto fail;
    }
    snprintf(t->model, sizeof t->model, "%s", t->kind == KIND_SPM ? "llama" : "gpt2");

    if (t->kind == KIND_BPE) {
        const td_gguf_kv *pk = td_gguf_find(g, "tokenizer.ggml.pre");
        if (pk && pk->type != TD_GGUF_STRING) {
            st = td_err_set(err, TD_EINPUT, "%s: key 'tokenizer.ggml.pre': expected STRING, found %s", g->path,
                            td_gguf_vtype_name((int)pk->type));
            goto fail;
        }
        if (!pk || str_eq(&pk->str, "default")) t->pre = PRE_DEFAULT;
        for (size_t i = 0; pk && !t->pre && i < sizeof k_pre_llama3 / sizeof *k_pre_llama3; i++)
            if (str_eq(&pk->str, k_pre_llama3[i])) t->pre = PRE_LLAMA3;
        for (size_t i = 0; pk && !t->pre && i < sizeof k_pre_qwen2 / sizeof *k_pre_qwen2; i++)
            if (str_eq(&pk->str, k_pre_qwen2[i])) t->pre = PRE_QWEN2;
        if (!t->pre) {
            st = td_err_set(err, TD_EINPUT,
                            "%s: key 'tokenizer.ggml.pre': expected one of the pre-tokenizers tapdiff has (default, "
                            "qwen2, llama-bpe and their aliases), found \"%.*s\"",
                            g->path, (int)(pk->str.len > 64 ? 64 : pk->str.len), pk->str.ptr);
            goto fail;
        }
        if (pk) snprintf(t->pre_name, sizeof t->pre_name, "%.*s", (int)(pk->str.len > 31 ? 31 : pk->str.len), pk->str.ptr);
        else snprintf(t->pre_name, sizeof t->pre_name, "default");
        if (t->pre == PRE_LLAMA3) t->ignore_merges = 1, t->add_bos = 1;
        st = t->pre == PRE_LLAMA3  ? compile_re(t, k_re_llama3, 1, err)
             : t->pre == PRE_QWEN2 ? compile_re(t, k_re_qwen2, 1, err)
                                   : compile_re(t, k_re_default, 4, err);
        if (st) goto fail;
    }

    const td_gguf_kv *tk = td_gguf_find(g, "tokenizer.ggml.tokens");
    if (!tk || tk->type != TD_GGUF_ARRAY || tk->arr_type != TD_GGUF_STRING || tk->arr_n == 0 ||
        tk->arr_n > INT32_MAX) {
        st = td_err_set(err, TD_EINPUT, "%s: key 'tokenizer.ggml.tokens': expected a non-empty ARRAY of STRING, %s",
                        g->path, tk ? "found another type or size" : "it is missing");
        goto fail;
    }
    t->n = (uint32_t)tk->arr_n;
    const td_gguf_kv *sk = td_gguf_find(g, "tokenizer.ggml.scores");
    if (sk && (sk->type != TD_GGUF_ARRAY || (sk->arr_type != TD_GGUF_FLOAT32 && sk->arr_type != TD_GGUF_INT32) ||
               sk->arr_n < t->n)) {
        st = td_err_set(err, TD_EINPUT, "%s: key 'tokenizer.ggml.scores': expected ARRAY of FLOAT32 with %u entries",
                        g->path, t->n);
        goto fail;
    }
    const td_gguf_kv *yk = td_gguf_find(g, "tokenizer.ggml.token_type");
    if (yk && (yk->type != TD_GGUF_ARRAY || yk->arr_type != TD_GGUF_INT32 || yk->arr_n < t->n)) {
        st = td_err_set(err, TD_EINPUT, "%s: key 'tokenizer.ggml.token_type': expected ARRAY of INT32 with %u entries",
                        g->path, t->n);
        goto fail;
    }
    t->text = td_xcalloc(t->n, sizeof *t->text);
    t->len = td_xcalloc(t->n, sizeof *t->len);
    t->score = td_xcalloc(t->n, sizeof *t->score);
    t->attr = td_xcalloc(t->n, sizeof *t->attr);
    smap_init(&t->tok2id, t->n);
    for (uint32_t i = 0; i < t->n; i++) {
        const td_str *s = &tk->arr_str[i];
        if (s->len == 0) {
            /* llama.cpp names empty pieces so that they stay distinct keys */
            char tmp[32];
            int k = snprintf(tmp, sizeof tmp, "[EMPTY_%u]", i);
            t->text[i] = td_xstrdup(tmp);
            t->len[i] = (uint32_t)k;
        } else {
            t->text[i] = td_xmalloc(s->len + 1);
            memcpy(t->text[i], s->ptr, s->len);
            t->text[i][s->len] = '\0';
            t->len[i] = (uint32_t)s->len;
        }
        smap_put(&t->tok2id, t->text[i], t->len[i], (int32_t)i, 1);
        if (sk) t->score[i] = (float)td_gguf_arr_f64(sk, i);
        t->attr[i] = ATTR_NORMAL;
        if (yk) {
            switch (td_gguf_arr_i64(yk, i)) {
            case 1: t->attr[i] = ATTR_NORMAL; break;
            case 2: t->attr[i] = ATTR_UNKNOWN; break;
            case 3: t->attr[i] = ATTR_CONTROL; break;
            case 4: t->attr[i] = ATTR_USER_DEFINED; break;
            case 5: t->attr[i] = ATTR_UNUSED; break;
            case 6: t->attr[i] = ATTR_BYTE; break;
            default: t->attr[i] = ATTR_UNDEFINED; break;
            }
        }
    }

    if (t->kind == KIND_BPE) {
        const td_gguf_kv *mg = td_gguf_find(g, "tokenizer.ggml.merges");
        if (!mg || mg->type != TD_GGUF_ARRAY || mg->arr_type != TD_GGUF_STRING) {
            st = td_err_set(err, TD_EINPUT, "%s: key 'tokenizer.ggml.merges': expected ARRAY of STRING (gpt2 vocab), %s",
                            g->path, mg ? "found another type" : "it is missing");
            goto fail;
        }
        smap_init(&t->ranks, mg->arr_n);
        cbuf key = {0};
        for (uint64_t i = 0; i < mg->arr_n && i < INT32_MAX; i++) {
            const td_str *s = &mg->arr_str[i];
            /* split at the first space after the first byte; no space: an empty pair, as llama.cpp */
            uint64_t sp = 1;
            while (sp < s->len && s->ptr[sp] != ' ') sp++;
            uint32_t ll = sp < s->len ? (uint32_t)sp : 0;
            const char *r = sp < s->len ? s->ptr + sp + 1 : "";
            size_t rl = sp < s->len ? (size_t)(s->len - sp - 1) : 0;
            key.n = 0;
            cbuf_add(&key, &ll, sizeof ll);
            cbuf_add(&key, s->ptr, ll);
            cbuf_add(&key, r, rl);
            smap_put(&t->ranks, key.v, key.n, (int32_t)i, 0);
        }
        free(key.v);
    }

    if ((st = key_token_id(g, "tokenizer.ggml.bos_token_id", t->n, &t->bos, err)) ||
        (st = key_token_id(g, "tokenizer.ggml.eos_token_id", t->n, &t->eos, err)) ||
        (st = key_token_id(g, "tokenizer.ggml.unknown_token_id", t->n, &t->unk, err)) ||
        (st = key_flag(g, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix, err)) ||
        (st = key_flag(g, "tokenizer.ggml.add_bos_token", &t->add_bos, err)) ||
        (st = key_flag(g, "tokenizer.ggml.add_eos_token", &t->add_eos, err)))
        goto fail;
    if ((t->add_bos && t->bos < 0) || (t->add_eos && t->eos < 0)) {
        st = td_err_set(err, TD_EINPUT, "%s: the tokenizer adds %s but the file names no such token id", g->path,
                        t->add_bos && t->bos < 0 ? "BOS" : "EOS");
        goto fail;
    }

    /* an end-of-turn token that is not typed control is made control when the
     * file names no EOT id (llama.cpp does the same, warning of a bad file) */
    if (!td_gguf_find(g, "tokenizer.ggml.eot_token_id")) {
        static const char *const eot[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                                          "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<end_of_utterance>"};
        for (size_t k = 0; k < sizeof eot / sizeof *eot; k++) {
            int32_t id = smap_get(&t->tok2id, eot[k], strlen(eot[k]));
            if (id >= 0) t->attr[id] |= ATTR_CONTROL;
        }
    }

    t->special = td_xmalloc(t->n * sizeof *t->special);
    for (uint32_t i = 0; i < t->n; i++)
        if (t->attr[i] & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN)) t->special[t->n_special++] = (int32_t)i;
    qsort_r(t->special, t->n_special, sizeof *t->special, cmp_special, t);
    *out = t;
    return TD_OK;
fail:
    td_tokenizer_free(t);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Special tokens: split the text into raw fragments and whole tokens         */

typedef struct frag {
    size_t off, len;
    int32_t id; /* -1: raw text */
} frag;

typedef struct fragv {
    frag *v;
    size_t n, cap;
} fragv;

static void frag_push(fragv *f, size_t off, size_t len, int32_t id) {
    if (f->n == f->cap) {
        f->cap = f->cap ? f->cap * 2 : 16;
        f->v = td_xrealloc(f->v, f->cap * sizeof *f->v);
    }
    f->v[f->n++] = (frag){off, len, id};
}

static const char *find_bytes(const char *h, size_t hn, const char *n, size_t nn) {
    if (nn == 0 || nn > hn) return NULL;
    return memmem(h, hn, n, nn);
}

static void partition(const td_tokenizer *t, const char *text, size_t len, int parse_special, fragv *out) {
    fragv cur = {0}, next = {0};
    if (len) frag_push(&cur, 0, len, -1);
    for (size_t s = 0; s < t->n_special; s++) {
        int32_t id = t->special[s];
        if (!parse_special && (t->attr[id] & (ATTR_CONTROL | ATTR_UNKNOWN))) continue;
        const char *tx = t->text[id];
        size_t tl = t->len[id];
        next.n = 0;
        for (size_t f = 0; f < cur.n; f++) {
            frag fr = cur.v[f];
            if (fr.id >= 0) {
                frag_push(&next, fr.off, fr.len, fr.id);
                continue;
            }
            size_t off = fr.off, rem = fr.len;
            for (;;) {
                const char *m = find_bytes(text + off, rem, tx, tl);
                if (!m) {
                    if (rem) frag_push(&next, off, rem, -1);
                    break;
                }
                size_t at = (size_t)(m - text);
                if (at > off) frag_push(&next, off, at - off, -1);
                frag_push(&next, at, tl, id);
                rem -= at + tl - off;
                off = at + tl;
                if (!rem) break;
            }
        }
        fragv tmp = cur;
        cur = next;
        next = tmp;
    }
    free(next.v);
    *out = cur;
}

/* ------------------------------------------------------------------------ */
/* SentencePiece (llama vocab)                                                */

typedef struct sym {
    int prev, next;
    const char *text;
    size_t n;
} sym;

typedef struct bigram {
    int left, right;
    float score; /* SPM: higher first */
    int32_t rank; /* BPE: lower first */
    size_t size;
} bigram;

/* A binary heap; `before(a, b)` is true when a must pop before b. */
typedef struct heap {
    bigram *v;
    size_t n, cap;
    int bpe;
} heap;

static int before(const heap *h, const bigram *a, const bigram *b) {
    if (h->bpe) return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static void heap_push(heap *h, bigram b) {
    if (h->n == h->cap) {
        h->cap = h->cap ? h->cap * 2 : 64;
        h->v = td_xrealloc(h->v, h->cap * sizeof *h->v);
    }
    size_t i = h->n++;
    h->v[i] = b;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!before(h, &h->v[i], &h->v[p])) break;
        bigram x = h->v[i];
        h->v[i] = h->v[p];
        h->v[p] = x;
        i = p;
    }
}

static bigram heap_pop(heap *h) {
    bigram top = h->v[0];
    h->v[0] = h->v[--h->n];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < h->n && before(h, &h->v[l], &h->v[m])) m = l;
        if (r < h->n && before(h, &h->v[r], &h->v[m])) m = r;
        if (m == i) break;
        bigram x = h->v[i];
        h->v[i] = h->v[m];
        h->v[m] = x;
        i = m;
    }
    return top;
}

/* the byte length a lead byte announces, as llama.cpp's unicode_len_utf8 */
static size_t lead_len(unsigned char c) {
    static const size_t lookup[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lookup[c >> 4];
}

static size_t split_chars(const char *s, size_t n, sym **syms, size_t *cap) {
    size_t k = 0;
    for (size_t o = 0; o < n; k++) {
        size_t l = lead_len((unsigned char)s[o]);
        if (l > n - o) l = n - o;
        if (k == *cap) {
            *cap = *cap ? *cap * 2 : 64;
            *syms = td_xrealloc(*syms, *cap * sizeof **syms);
        }
        (*syms)[k] = (sym){(int)k - 1, o + l == n ? -1 : (int)k + 1, s + o, l};
        o += l;
    }
    return k;
}

static void spm_try_bigram(const td_tokenizer *t, sym *sy, heap *h, int left, int right) {
    if (left < 0 || right < 0) return;
    size_t n = sy[left].n + sy[right].n;
    int32_t id = smap_get(&t->tok2id, sy[left].text, n);
    if (id < 0) return;
    heap_push(h, (bigram){left, right, t->score[id], 0, n});
}

static int spm_byte(const td_tokenizer *t, unsigned char c, int32_t *id, td_err *err) {
    static const char hex[] = "0123456789ABCDEF";
    char b[7] = {'<', '0', 'x', hex[c >> 4], hex[c & 15], '>', 0};
    *id = smap_get(&t->tok2id, b, 6);
    if (*id < 0) *id = smap_get(&t->tok2id, (const char *)&c, 1);
    if (*id < 0)
        return td_err_set(err, TD_EINPUT, "tokenizer: the vocabulary has no token for byte 0x%02X (no <0x%02X>)", c, c);
    return TD_OK;
}

static int spm_tokenize(const td_tokenizer *t, const char *s, size_t n, ibuf *out, td_err *err) {
    sym *sy = NULL;
    size_t cap = 0;
    size_t ns = split_chars(s, n, &sy, &cap);
    heap h = {0};
    h.bpe = 0;
    for (size_t i = 1; i < ns; i++) spm_try_bigram(t, sy, &h, (int)i - 1, (int)i);
    while (h.n) {
        bigram b = heap_pop(&h);
        sym *l = &sy[b.left], *r = &sy[b.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != b.size) continue; /* outdated */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) sy[r->next].prev = b.left;
        spm_try_bigram(t, sy, &h, l->prev, b.left);
        spm_try_bigram(t, sy, &h, b.left, l->next);
    }
    int st = TD_OK;
    for (int i = ns ? 0 : -1; i != -1 && !st; i = sy[i].next) {
        int32_t id = smap_get(&t->tok2id, sy[i].text, sy[i].n);
        if (id >= 0) {
            ibuf_push(out, id);
            continue;
        }
        /* a merged symbol is always a token: only single characters reach here */
        for (size_t k = 0; k < sy[i].n && !st; k++) {
            st = spm_byte(t, (unsigned char)sy[i].text[k], &id, err);
            if (!st) ibuf_push(out, id);
        }
    }
    free(h.v);
    free(sy);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Byte-level BPE (gpt2 vocab)                                                */

/* UTF-8 -> code points as llama.cpp's unicode_cpts_from_utf8: the lead byte's
 * length is trusted (no overlong or surrogate check); a malformed sequence
 * is U+FFFD and consumes one byte. */
static size_t utf8_cpts(const unsigned char *s, size_t n, uint32_t *cp) {
    size_t k = 0;
    for (size_t o = 0; o < n;) {
        unsigned c = s[o];
        size_t l = !(c & 0x80) ? 1 : !(c & 0x40) ? 0 : !(c & 0x20) ? 2 : !(c & 0x10) ? 3 : !(c & 0x08) ? 4 : 0;
        int ok = l > 0 && o + l <= n;
        for (size_t i = 1; ok && i < l; i++)
            if ((s[o + i] & 0xC0) != 0x80) ok = 0;
        if (!ok) {
            cp[k++] = 0xFFFD;
            o++;
            continue;
        }
        uint32_t v = l == 1 ? c : l == 2 ? (c & 0x1F) : l == 3 ? (c & 0x0F) : (c & 0x07);
        for (size_t i = 1; i < l; i++) v = (v << 6) | (s[o + i] & 0x3F);
        cp[k++] = v;
        o += l;
    }
    return k;
}

static size_t cpt_utf8(uint32_t c, char *o) {
    if (c > 0x10FFFF) c = 0xFFFD; /* llama.cpp refuses these outright; not reachable from our decoder's valid range */
    if (c <= 0x7F) return o[0] = (char)c, 1;
    if (c <= 0x7FF) return o[0] = (char)(0xC0 | (c >> 6)), o[1] = (char)(0x80 | (c & 0x3F)), 2;
    if (c <= 0xFFFF)
        return o[0] = (char)(0xE0 | (c >> 12)), o[1] = (char)(0x80 | ((c >> 6) & 0x3F)),
               o[2] = (char)(0x80 | (c & 0x3F)), 3;
    o[0] = (char)(0xF0 | (c >> 18));
    o[1] = (char)(0x80 | ((c >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((c >> 6) & 0x3F));
    o[3] = (char)(0x80 | (c & 0x3F));
    return 4;
}

/* GPT-2's bytes_to_unicode: printable bytes stand for themselves, the other
 * 68 map in increasing order to U+0100 + n. */
static uint32_t byte_cp(unsigned b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174) return b;
    uint32_t n = 0;
    for (unsigned x = 0; x < b; x++)
        if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174)) n++;
    return 256 + n;
}

static int cp_byte(uint32_t cp) {
    for (unsigned b = 0; b < 256; b++)
        if (byte_cp(b) == cp) return (int)b;
    return -1;
}

/* Splits [0, n) of cps with one regex: matches and the gaps between them are pieces. */
static void re_split(const pcre2_code *re, const uint32_t *subj, const size_t *in, size_t nin, size_t **outp,
                     size_t *nout, size_t *cap) {
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    size_t k = 0, start = 0;
#define PUSH(x)                                                                                                        \
    do {                                                                                                               \
        if (k == *cap) {                                                                                               \
            *cap = *cap ? *cap * 2 : 64;                                                                               \
            *outp = td_xrealloc(*outp, *cap * sizeof **outp);                                                          \
        }                                                                                                              \
        (*outp)[k++] = (x);                                                                                            \
    } while (0)
    for (size_t p = 0; p < nin; p++) {
        const uint32_t *s = subj + start;
        size_t len = in[p], at = 0, done = 0;
        while (at < len) {
            int rc = pcre2_match(re, s, len, at, PCRE2_NO_UTF_CHECK, md, NULL);
            if (rc < 0) break;
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            size_t ms = ov[0], me = ov[1];
            if (me == ms) { /* an empty match: none of our patterns has one, but never loop */
                at = ms + 1;
                continue;
            }
            if (ms > done) PUSH(ms - done);
            PUSH(me - ms);
            done = at = me;
        }
        if (done < len) PUSH(len - done);
        start += len;
    }
#undef PUSH
    pcre2_match_data_free(md);
    *nout = k;
}

static int32_t bpe_rank(const td_tokenizer *t, const char *l, size_t ln, const char *r, size_t rn, cbuf *key) {
    uint32_t ll = (uint32_t)ln;
    key->n = 0;
    cbuf_add(key, &ll, sizeof ll);
    cbuf_add(key, l, ln);
    cbuf_add(key, r, rn);
    return smap_get(&t->ranks, key->v, key->n);
}

static void bpe_add_bigram(const td_tokenizer *t, sym *sy, heap *h, int left, int right, cbuf *key) {
    if (left < 0 || right < 0) return;
    int32_t rank = bpe_rank(t, sy[left].text, sy[left].n, sy[right].text, sy[right].n, key);
    if (rank < 0) return;
    heap_push(h, (bigram){left, right, 0.0f, rank, sy[left].n + sy[right].n});
}

static void bpe_word(const td_tokenizer *t, const char *w, size_t n, ibuf *out, cbuf *key, sym **sy, size_t *scap,
                     heap *h) {
    size_t ns;
    if (t->ignore_merges && smap_get(&t->tok2id, w, n) >= 0) {
        if (!*scap) {
            *scap = 64;
            *sy = td_xrealloc(*sy, *scap * sizeof **sy);
        }
        (*sy)[0] = (sym){-1, -1, w, n};
        ns = 1;
    } else {
        ns = split_chars(w, n, sy, scap);
    }
    sym *s = *sy;
    h->n = 0;
    for (size_t i = 1; i < ns; i++) bpe_add_bigram(t, s, h, (int)i - 1, (int)i, key);
    while (h->n) {
        bigram b = heap_pop(h);
        sym *l = &s[b.left], *r = &s[b.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != b.size) continue; /* outdated */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) s[r->next].prev = b.left;
        bpe_add_bigram(t, s, h, l->prev, b.left, key);
        bpe_add_bigram(t, s, h, b.left, l->next, key);
    }
    for (size_t i = 0; i < ns; i++) {
        if (s[i].n == 0) continue;
        int32_t id = smap_get(&t->tok2id, s[i].text, s[i].n);
        if (id >= 0) {
            ibuf_push(out, id);
            continue;
        }
        /* llama.cpp looks each byte of the encoded symbol up alone and drops the misses */
        for (size_t k = 0; k < s[i].n; k++) {
            id = smap_get(&t->tok2id, s[i].text + k, 1);
            if (id >= 0) ibuf_push(out, id);
        }
    }
}

static void bpe_tokenize(const td_tokenizer *t, const char *text, size_t n, ibuf *out) {
    uint32_t *cp = td_xmalloc((n + 1) * sizeof *cp);
    size_t nc = utf8_cpts((const unsigned char *)text, n, cp);
    /* PCRE2 in UTF mode takes only Unicode scalar values; what llama.cpp's
     * decoder lets through beyond them (surrogates, > U+10FFFF) is matched as
     * U+FFFD, a symbol like them, and kept as decoded in the words */
    uint32_t *subj = td_xmalloc((nc + 1) * sizeof *subj);
    for (size_t i = 0; i < nc; i++) subj[i] = (cp[i] >= 0xD800 && cp[i] <= 0xDFFF) || cp[i] > 0x10FFFF ? 0xFFFD : cp[i];
    size_t *off = td_xmalloc(sizeof *off), noff = 1, cap1 = 1;
    off[0] = nc;
    size_t *tmp = NULL, ntmp = 0, cap2 = 0;
    for (int r = 0; r < t->n_re && nc; r++) {
        re_split(t->re[r], subj, off, noff, &tmp, &ntmp, &cap2);
        size_t *x = off;
        off = tmp;
        tmp = x;
        size_t c = cap1;
        cap1 = cap2;
        cap2 = c;
        noff = ntmp;
    }
    cbuf word = {0}, key = {0};
    sym *sy = NULL;
    size_t scap = 0;
    heap h = {0};
    h.bpe = 1;
    size_t start = 0;
    for (size_t p = 0; p < noff && nc; p++) {
        word.n = 0;
        for (size_t i = start; i < start + off[p]; i++) {
            char u[4];
            size_t ul = cpt_utf8(cp[i], u);
            for (size_t k = 0; k < ul; k++) {
                char e[4];
                size_t el = cpt_utf8(byte_cp((unsigned char)u[k]), e);
                cbuf_add(&word, e, el);
            }
        }
        start += off[p];
        if (word.n) bpe_word(t, word.v, word.n, out, &key, &sy, &scap, &h);
    }
    free(h.v);
    free(sy);
    free(word.v);
    free(key.v);
    free(tmp);
    free(off);
    free(subj);
    free(cp);
}

/* ------------------------------------------------------------------------ */
/* The entry points                                                           */

int td_tokenize(const td_tokenizer *t, const char *text, size_t len, int add_special, int parse_special,
                int32_t **ids, size_t *n, td_err *err) {
    *ids = NULL;
    *n = 0;
    fragv fr = {0};
    partition(t, text, len, parse_special, &fr);
    ibuf out = {0};
    int st = TD_OK;
    if (add_special && t->add_bos) ibuf_push(&out, t->bos);
    if (t->kind == KIND_SPM) {
        int prev_special = 1; /* the first text gets the space prefix */
        cbuf s = {0};
        for (size_t f = 0; f < fr.n && !st; f++) {
            if (fr.v[f].id >= 0) {
                ibuf_push(&out, fr.v[f].id);
                prev_special = 1;
                continue;
            }
            s.n = 0;
            if (t->add_space_prefix && prev_special) cbuf_add(&s, "\xE2\x96\x81", 3);
            for (size_t i = 0; i < fr.v[f].len; i++) {
                char c = text[fr.v[f].off + i];
                if (c == ' ') cbuf_add(&s, "\xE2\x96\x81", 3);
                else cbuf_add(&s, &c, 1);
            }
            st = spm_tokenize(t, s.v, s.n, &out, err);
            prev_special = 0;
        }
        free(s.v);
    } else {
        for (size_t f = 0; f < fr.n; f++) {
            if (fr.v[f].id >= 0) ibuf_push(&out, fr.v[f].id);
            else bpe_tokenize(t, text + fr.v[f].off, fr.v[f].len, &out);
        }
    }
    if (add_special && t->add_eos) ibuf_push(&out, t->eos);
    free(fr.v);
    if (st) {
        free(out.v);
        return st;
    }
    if (!out.v) out.v = td_xmalloc(sizeof *out.v);
    *ids = out.v;
    *n = out.n;
    return TD_OK;
}

static int hexv(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

static void piece_bytes(const td_tokenizer *t, int32_t id, int special, cbuf *o) {
    uint32_t a = t->attr[id];
    const char *s = t->text[id];
    size_t n = t->len[id];
    if (!special && (a & (ATTR_UNKNOWN | ATTR_CONTROL))) return;
    if (a & (ATTR_UNKNOWN | ATTR_CONTROL | ATTR_USER_DEFINED)) {
        cbuf_add(o, s, n);
        return;
    }
    if (a & ATTR_BYTE) {
        /* "<0xXX>" */
        int hi = n >= 5 ? hexv(s[3]) : -1, lo = n >= 5 ? hexv(s[4]) : -1;
        unsigned char c = (unsigned char)(hi >= 0 && lo >= 0 ? hi * 16 + lo : 0);
        cbuf_add(o, &c, 1);
        return;
    }
    if (!(a & ATTR_NORMAL)) return;
    if (t->kind == KIND_SPM) {
        for (size_t i = 0; i < n;) {
            if (i + 3 <= n && !memcmp(s + i, "\xE2\x96\x81", 3)) {
                cbuf_add(o, " ", 1);
                i += 3;
            } else {
                cbuf_add(o, s + i, 1);
                i++;
            }
        }
        return;
    }
    uint32_t *cp = td_xmalloc((n + 1) * sizeof *cp);
    size_t nc = utf8_cpts((const unsigned char *)s, n, cp);
    for (size_t i = 0; i < nc; i++) {
        int b = cp_byte(cp[i]);
        if (b >= 0) {
            unsigned char c = (unsigned char)b;
            cbuf_add(o, &c, 1);
        } else {
            /* not a byte-level character: what llama.cpp writes, so the texts stay equal */
            char u[4], hx[4];
            size_t ul = cpt_utf8(cp[i], u);
            cbuf_add(o, "[UNK_BYTE_0x", 12);
            for (size_t k = 0; k < ul; k++) {
                snprintf(hx, sizeof hx, "%02x", (unsigned char)u[k]);
                cbuf_add(o, hx, 2);
            }
            cbuf_add(o, s, n);
            cbuf_add(o, "]", 1);
        }
    }
    free(cp);
}

long td_token_piece(const td_tokenizer *t, int32_t id, int special, char *buf, size_t cap) {
    if (id < 0 || (uint32_t)id >= t->n) return -1;
    cbuf o = {0};
    piece_bytes(t, id, special, &o);
    if (buf && cap && o.n) memcpy(buf, o.v, o.n < cap ? o.n : cap);
    long n = (long)o.n;
    free(o.v);
    return n;
}

int td_detokenize(const td_tokenizer *t, const int32_t *ids, size_t n, int special, char **text, size_t *len,
                  td_err *err) {
    cbuf o = {0};
    cbuf_add(&o, "", 0);
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || (uint32_t)ids[i] >= t->n) {
            free(o.v);
            *text = NULL;
            *len = 0;
            return td_err_set(err, TD_EINPUT, "detokenize: token %zu: expected an id in [0, %u), found %d", i, t->n,
                              ids[i]);
        }
        piece_bytes(t, ids[i], special, &o);
    }
    *text = o.v;
    *len = o.n;
    return TD_OK;
}

/* ------------------------------------------------------------------------ */
/* Streaming UTF-8                                                            */

/* Is c an allowed byte at position i (>= 1) of a sequence led by `lead`?
 * (Unicode Table 3-7: no overlongs, no surrogates, nothing past U+10FFFF.) */
static int cont_ok(unsigned char lead, int i, unsigned char c) {
    if (i == 1) {
        if (lead == 0xE0) return c >= 0xA0 && c <= 0xBF;
        if (lead == 0xED) return c >= 0x80 && c <= 0x9F;
        if (lead == 0xF0) return c >= 0x90 && c <= 0xBF;
        if (lead == 0xF4) return c >= 0x80 && c <= 0x8F;
    }
    return c >= 0x80 && c <= 0xBF;
}

static int seq_len(unsigned char c) {
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) return 2;
    if (c >= 0xE0 && c <= 0xEF) return 3;
    if (c >= 0xF0 && c <= 0xF4) return 4;
    return 0;
}

static size_t put_fffd(char *out) {
    memcpy(out, "\xEF\xBF\xBD", 3);
    return 3;
}

size_t td_utf8_stream_feed(td_utf8_stream *s, const char *in, size_t n, char *out) {
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)in[i];
        if (s->n > 0) {
            if (cont_ok(s->pend[0], s->n, c)) {
                s->pend[s->n++] = c;
                if (s->n == s->need) {
                    memcpy(out + o, s->pend, (size_t)s->n);
                    o += (size_t)s->n;
                    s->n = s->need = 0;
                }
                continue;
            }
            /* the held sequence is broken: it was invalid, c starts afresh */
            o += put_fffd(out + o);
            s->n = s->need = 0;
        }
        int l = seq_len(c);
        if (l == 1) out[o++] = (char)c;
        else if (l == 0) o += put_fffd(out + o);
        else {
            s->pend[0] = c;
            s->n = 1;
            s->need = l;
        }
    }
    return o;
}

size_t td_utf8_stream_flush(td_utf8_stream *s, char *out) {
    if (s->n == 0) return 0;
    s->n = s->need = 0;
    return put_fffd(out);
}
