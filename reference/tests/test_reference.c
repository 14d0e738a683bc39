/* Tests of the reference forward as a whole, on the fixture models (written
 * into a temporary directory) and on stories260K when ../shared has it.
 * The checks are metamorphic (two computations that must agree by
 * construction), statistical (ref32 vs ref lies in the band an honest f32
 * implementation gives), or about the tap file and the CLI contract. */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <criterion/parameterized.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend.h"
#include "fixtures.h"
#include "model.h"
#include "profile.h"
#include "reference.h"
#include "runner.h"
#include "tapfile.h"
#include "td_test.h"

/* ------------------------------------------------------------------------ */
/* Helpers                                                                    */

static char tmpdir[256];

static void make_tmpdir(void) {
    td_test_tmpdir(tmpdir, sizeof tmpdir, "ref");
}

static void remove_tmpdir(void) { td_test_rmdir(tmpdir); }

/* Writes fixture `name` into tmpdir and opens it. */
static td_model *open_fixture(const char *name) {
    char path[512];
    td_err err = {{0}};
    int rc = td_fixture_write(name, tmpdir, path, sizeof path, &err);
    cr_assert_eq(rc, TD_OK, "td_fixture_write(%s): %s", name, err.msg);
    td_model *m = NULL;
    rc = td_model_open(&m, path, &err);
    cr_assert_eq(rc, TD_OK, "td_model_open(%s): %s", path, err.msg);
    return m;
}

static td_backend *open_backend(const char *name, const td_model *m, uint32_t n_ctx) {
    const td_backend_vt *vt = td_backend_find(name);
    cr_assert_not_null(vt, "backend %s is not registered", name);
    td_backend_params p = {.n_ctx = n_ctx};
    td_backend *b = NULL;
    td_err err = {{0}};
    int rc = vt->open(&b, m, &p, &err);
    cr_assert_eq(rc, TD_OK, "%s open: %s", name, err.msg);
    return b;
}

static void forward(td_backend *b, const int32_t *tok, int64_t T, int64_t pos0, td_tap_sink *sink, double *logits) {
    td_err err = {{0}};
    int rc = b->vt->forward(b, tok, T, pos0, sink, logits, &err);
    cr_assert_eq(rc, TD_OK, "%s forward (T=%lld, pos0=%lld): %s", b->vt->name, (long long)T, (long long)pos0,
                 err.msg);
}

/* max |a - b| / max |a|: relative to the row's scale, not element-wise
 * (logits near 0 would make an element-wise ratio meaningless). */
static double max_rel(const double *a, const double *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num = fmax(num, fabs(a[i] - b[i]));
        den = fmax(den, fabs(a[i]));
    }
    return den > 0 ? num / den : num;
}

static int32_t argmax(const double *x, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return (int32_t)best;
}

static int run_cmd(const char *cmd, char **out) { return td_test_sh_capture_all(cmd, out); }

static const char *tapdiff_bin(void) {
    const char *t = getenv("TD_TAPDIFF");
    if (!t || !*t) cr_skip_test("TD_TAPDIFF is not set (run through meson test)");
    return t;
}

static const char *stories_path(void) {
    static char path[1024];
    const char *shared = getenv("TD_SHARED");
    if (!shared || !*shared) return NULL;
    snprintf(path, sizeof path, "%s/models/stories260K.gguf", shared);
    return access(path, R_OK) == 0 ? path : NULL;
}

/* ------------------------------------------------------------------------ */
/* Metamorphic: an MoE whose experts are copies of the dense FFN is the dense
 * model (the renormalised weights sum to 1).                                */

Test(reference, moe_of_copies_equals_dense, .init = make_tmpdir, .fini = remove_tmpdir) {
    td_model *dense = open_fixture("qwen3-dense"), *moe = open_fixture("qwen3moe-copies");
    cr_assert_eq(dense->hp.n_vocab, moe->hp.n_vocab);
    cr_assert_eq(moe->hp.n_expert, 8);
    const int64_t V = dense->hp.n_vocab, T = 5, steps = 8;
    td_backend *bd = open_backend("ref", dense, 64), *bm = open_backend("ref", moe, 64);
    double *ld = malloc(sizeof(double) * T * V), *lm = malloc(sizeof(double) * T * V);
    const int32_t prompt[5] = {5, 17, 42, 99, 7};

    forward(bd, prompt, T, 0, NULL, ld);
    forward(bm, prompt, T, 0, NULL, lm);
    double worst = 0;
    for (int64_t t = 0; t < T; t++) {
        double r = max_rel(ld + t * V, lm + t * V, V);
        worst = fmax(worst, r);
        cr_assert(r <= 1e-12, "prefill position %lld: relative difference %.3g > 1e-12", (long long)t, r);
    }
    int32_t tok = argmax(ld + (T - 1) * V, V);
    for (int64_t s = 0; s < steps; s++) { // greedy on the dense model; the MoE is fed the same token
        forward(bd, &tok, 1, T + s, NULL, ld);
        forward(bm, &tok, 1, T + s, NULL, lm);
        double r = max_rel(ld, lm, V);
        worst = fmax(worst, r);
        cr_assert(r <= 1e-12, "decode step %lld: relative difference %.3g > 1e-12", (long long)s, r);
        cr_assert_eq(argmax(ld, V), argmax(lm, V), "decode step %lld: the argmax differs", (long long)s);
        tok = argmax(ld, V);
    }
    fprintf(stderr, "[reference] qwen3moe-copies vs qwen3-dense (ref): worst max-relative logit difference %.3g\n",
            worst);
    bd->vt->close(bd), bm->vt->close(bm);
    td_model_close(dense), td_model_close(moe);
    free(ld), free(lm);
}

/* ------------------------------------------------------------------------ */
/* The KV cache: decoding token by token equals re-running the whole prefix
 * as one prefill.                                                            */

static void check_kv_cache(const char *fixture, const char *backend) {
    td_model *m = open_fixture(fixture);
    const int64_t V = m->hp.n_vocab, n = 10, p = 3;
    const int32_t seq[10] = {1, 50, 200, 7, 33, 250, 12, 99, 101, 3};
    td_backend *inc = open_backend(backend, m, 16), *full = open_backend(backend, m, 16);
    double *li = malloc(sizeof(double) * n * V), *lf = malloc(sizeof(double) * n * V);

    forward(inc, seq, p, 0, NULL, li); // prefill of p tokens, then one token per step
    for (int64_t s = p - 1; s < n; s++) {
        if (s >= p) forward(inc, &seq[s], 1, s, NULL, li);
        const double *last_inc = s >= p ? li : li + (p - 1) * V;
        full->vt->reset(full);
        forward(full, seq, s + 1, 0, NULL, lf);
        double r = max_rel(lf + s * V, last_inc, V);
        cr_assert(r <= 1e-12, "%s/%s: position %lld: decode vs full prefill relative difference %.3g", fixture,
                  backend, (long long)s, r);
    }
    // and a wrong cache is caught: decoding the last token at the wrong history differs
    full->vt->reset(full);
    forward(full, seq + 1, n - 1, 0, NULL, lf);
    cr_assert(max_rel(lf + (n - 2) * V, li, V) > 1e-6, "%s: logits do not depend on the history", fixture);

    inc->vt->close(inc), full->vt->close(full);
    td_model_close(m);
    free(li), free(lf);
}

/* (fixture, arm) cases; indices are the parameters (Criterion copies them
 * into the test process, where pointers into this one are not valid) */
typedef struct fx_arm {
    const char *fixture, *backend;
} fx_arm;

static const fx_arm k_kv_cases[] = {{"llama-f32", "ref"},    {"llama-q4_k", "ref"},     {"qwen3-q8_0", "ref"},
                                    {"qwen3moe-f32", "ref"}, {"qwen3moe-q6_k", "ref32"},
                                    // hybrid: the GDN conv and recurrent state carried across steps
                                    {"qwen3next-f32", "ref"}, {"qwen3next-q8_0", "ref32"}};
#define N_KV_CASES (sizeof k_kv_cases / sizeof k_kv_cases[0])
static int k_kv_ix[N_KV_CASES];

ParameterizedTestParameters(reference, kv_cache_decode_equals_prefill) {
    for (size_t i = 0; i < N_KV_CASES; i++) k_kv_ix[i] = (int)i;
    return cr_make_param_array(int, k_kv_ix, N_KV_CASES);
}

ParameterizedTest(int *ix, reference, kv_cache_decode_equals_prefill, .init = make_tmpdir, .fini = remove_tmpdir) {
    check_kv_cache(k_kv_cases[*ix].fixture, k_kv_cases[*ix].backend);
}

/* ------------------------------------------------------------------------ */
/* ref32 vs ref: the control arm's error at out.logits must be that of an
 * honest f32 computation: well above f64 noise, well below a bug.           */

/* Relative L2 of ref32 against ref over the logits of a prefill of 4 tokens
 * and 4 decode steps pinned to ref's greedy choices. */
static double ref32_rel_l2(const td_model *m) {
    const int64_t V = m->hp.n_vocab, T = 4, steps = 4;
    td_backend *a = open_backend("ref", m, 16), *b = open_backend("ref32", m, 16);
    double *la = malloc(sizeof(double) * T * V), *lb = malloc(sizeof(double) * T * V);
    const int32_t prompt[4] = {1, 20, 40, 60};
    double num = 0, den = 0;
    forward(a, prompt, T, 0, NULL, la);
    forward(b, prompt, T, 0, NULL, lb);
    for (int64_t s = 0;; s++) {
        const int64_t rows = s == 0 ? T : 1;
        for (int64_t i = 0; i < rows * V; i++) {
            num += (lb[i] - la[i]) * (lb[i] - la[i]);
            den += la[i] * la[i];
        }
        if (s == steps) break;
        int32_t tok = argmax(la + (rows - 1) * V, V);
        forward(a, &tok, 1, T + s, NULL, la);
        forward(b, &tok, 1, T + s, NULL, lb);
    }
    a->vt->close(a), b->vt->close(b);
    free(la), free(lb);
    return sqrt(num / den);
}

Test(reference, ref32_vs_ref_error_band, .init = make_tmpdir, .fini = remove_tmpdir) {
    const size_t n = td_fixture_count();
    cr_assert_gt(n, 0);
    fprintf(stderr, "[reference] ref32 vs ref, relative L2 error at out.logits (prefill 4 + 4 decode steps):\n");
    for (size_t i = 0; i < n; i++) {
        const char *name = td_fixture_at(i)->name;
        td_model *m = open_fixture(name);
        double e = ref32_rel_l2(m);
        fprintf(stderr, "[reference]   %-18s %.3e\n", name, e);
        cr_expect(e >= 1e-8 && e <= 1e-4, "%s: ref32 vs ref relative L2 %.3e outside [1e-8, 1e-4]", name, e);
        td_model_close(m);
    }
    const char *st = stories_path();
    if (st) {
        td_model *m = NULL;
        td_err err = {{0}};
        cr_assert_eq(td_model_open(&m, st, &err), TD_OK, "%s", err.msg);
        double e = ref32_rel_l2(m);
        fprintf(stderr, "[reference]   %-18s %.3e\n", "stories260K", e);
        cr_expect(e >= 1e-8 && e <= 1e-4, "stories260K: ref32 vs ref relative L2 %.3e outside [1e-8, 1e-4]", e);
        td_model_close(m);
    }
}

/* ------------------------------------------------------------------------ */
/* Router ties: qwen3moe-ties plants, for even token ids in layer 0, two
 * experts with bitwise equal probabilities at ranks K and K+1; the reference
 * keeps the lower index.                                                    */

Test(reference, router_tie_keeps_lower_expert, .init = make_tmpdir, .fini = remove_tmpdir) {
    td_model *m = open_fixture(TD_FIXTURE_TIES_NAME);
    const td_fixture_ties_plan *plan = td_fixture_ties();
    const int64_t X = m->hp.n_expert, K = m->hp.n_expert_used, T = 4;
    cr_assert_eq(K, 2);
    char h5[400];
    snprintf(h5, sizeof h5, "%s/ties.h5", tmpdir);
    td_tap_options o = td_tap_options_default();
    o.filter = "blk.0.moe_*";
    td_tap_sink *sink = NULL;
    td_err err = {{0}};
    cr_assert_eq(td_tap_sink_open(&sink, h5, &o, &err), TD_OK, "%s", err.msg);
    const int32_t tok[4] = {4, 10, 7, 100};
    double *lg = malloc(sizeof(double) * T * m->hp.n_vocab);
    td_backend *b = open_backend("ref", m, 8);
    cr_assert_eq(td_tap_step_begin(sink, TD_STEP_PREFILL, 0, T, &err), TD_OK, "%s", err.msg);
    forward(b, tok, T, 0, sink, lg);
    cr_assert_eq(td_tap_step_end(sink, &err), TD_OK, "%s", err.msg);
    cr_assert_eq(td_tap_sink_close(sink, &err), TD_OK, "%s", err.msg);
    b->vt->close(b);

    td_tapfile *f = NULL;
    cr_assert_eq(td_tapfile_open(&f, h5, &err), TD_OK, "%s", err.msg);
    int64_t topk[8];
    double probs[32];
    cr_assert_eq(td_tapfile_read_i64(f, 0, "blk.0.moe_topk", topk, (uint64_t)(T * K), &err), TD_OK, "%s", err.msg);
    cr_assert_eq(td_tapfile_read_f64(f, 0, "blk.0.moe_probs", probs, (uint64_t)(T * X), &err), TD_OK, "%s", err.msg);
    int n_ties = 0;
    for (int64_t t = 0; t < T; t++) {
        const double *p = probs + t * X;
        if (td_fixture_ties_is_tie_token(tok[t])) {
            n_ties++;
            cr_assert_eq(p[plan->expert_a], p[plan->expert_b], "token %d: the planted tie is not exact", tok[t]);
            cr_assert_eq(topk[t * K + 0], 0, "token %d: rank 0", tok[t]);
            cr_assert_eq(topk[t * K + 1], (int64_t)plan->expert_a,
                         "token %d: tie between experts %u and %u must keep the lower one, got %lld", tok[t],
                         plan->expert_a, plan->expert_b, (long long)topk[t * K + 1]);
        } else {
            cr_assert_eq(topk[t * K + 0], 1, "odd token %d: rank 0", tok[t]);
        }
    }
    cr_assert_eq(n_ties, 3);
    td_tapfile_close(f);
    td_model_close(m);
    free(lg);
}

/* ------------------------------------------------------------------------ */
/* Errors: bad input is a status with a message, never a crash.              */

Test(reference, bad_input_is_reported, .init = make_tmpdir, .fini = remove_tmpdir) {
    td_model *m = open_fixture("llama-f32");
    const int64_t V = m->hp.n_vocab;
    td_backend *b = open_backend("ref", m, 4);
    double *lg = malloc(sizeof(double) * 8 * V);
    td_err err = {{0}};
    const int32_t ok[5] = {1, 2, 3, 4, 5};
    const int32_t bad = (int32_t)V;
    cr_assert_eq(b->vt->forward(b, &bad, 1, 0, NULL, lg, &err), TD_EINPUT);
    cr_assert(strstr(err.msg, "vocabulary"), "message: %s", err.msg);
    cr_assert_eq(b->vt->forward(b, ok, 5, 0, NULL, lg, &err), TD_EINPUT, "n_ctx 4 must refuse 5 positions");
    cr_assert(strstr(err.msg, "n_ctx"), "message: %s", err.msg);
    cr_assert_eq(b->vt->forward(b, ok, 2, 1, NULL, lg, &err), TD_EINPUT, "pos0 must continue the sequence");
    forward(b, ok, 4, 0, NULL, lg);
    cr_assert_eq(b->vt->forward(b, ok, 1, 4, NULL, lg, &err), TD_EINPUT, "the cache is full");
    b->vt->reset(b);
    forward(b, ok, 4, 0, NULL, lg);
    b->vt->close(b);
    td_model_close(m);
    free(lg);
}

/* ------------------------------------------------------------------------ */
/* stories260K: a real trained model speaks English greedily from BOS.       */

/* Common English words (function words and the simple vocabulary of
 * TinyStories). A correct forward's greedy story uses almost only these (and
 * names); a subtly broken one (RoPE pairs swapped, say) still starts with
 * "Once upon a time" but soon produces non-words ("tooking", "ffarden"). */
static const char *const common_words[] = {
    "a", "about", "after", "again", "all", "also", "always", "am", "an", "and", "any", "are", "around", "as", "ask",
    "asked", "at", "away", "back", "bad", "ball", "be", "because", "bed", "been", "before", "best", "big", "bird",
    "birds", "blue", "boat", "book", "box", "boy", "but", "by", "call", "called", "came", "can", "can't", "car",
    "cat", "come", "could", "cried", "dad", "day", "did", "didn't", "do", "does", "dog", "don't", "door", "down",
    "each", "eat", "end", "even", "every", "eyes", "fast", "felt", "find", "fine", "first", "fish", "for", "found",
    "friend", "friends", "from", "fun", "game", "gave", "get", "girl", "give", "go", "going", "good", "got", "great",
    "green", "had", "happy", "hard", "has", "have", "he", "help", "her", "here", "high", "him", "his", "home",
    "house", "how", "hug", "i", "i'm", "if", "in", "into", "is", "it", "it's", "its", "jump", "just", "kind", "knew",
    "know", "laugh", "learned", "let", "let's", "like", "little", "lived", "look", "looked", "lot", "love", "loved",
    "made", "make", "man", "many", "may", "me", "mom", "mommy", "more", "most", "much", "must", "my", "name", "named",
    "new", "next", "nice", "night", "no", "not", "now", "of", "off", "oh", "old", "on", "once", "one", "or", "other",
    "our", "out", "outside", "over", "park", "play", "played", "playing", "please", "pretty", "put", "ran", "red",
    "remember", "right", "room", "run", "said", "sad", "saw", "say", "see", "she", "shiny", "should", "sky",
    "small", "smile", "so", "some", "something", "soon", "sorry", "start", "started", "stay", "still", "stop",
    "story", "sun", "sure", "surprised", "take", "tell", "than", "thank", "that", "the", "their", "them", "then",
    "there", "they", "thing", "things", "think", "this", "through", "time", "to", "together", "too", "took", "toy",
    "toys", "tree", "tried", "try", "two", "under", "up", "upon", "us", "very", "walk", "want", "wanted", "was",
    "water", "way", "we", "went", "were", "what", "when", "where", "which", "while", "white", "who", "why", "will",
    "with", "wish", "won't", "word", "work", "would", "yes", "you", "your",
};

static int is_common_word(const char *w) {
    for (size_t i = 0; i < sizeof common_words / sizeof common_words[0]; i++)
        if (!strcmp(w, common_words[i])) return 1;
    return 0;
}

/* Counts the words ([a-z']+, lower-cased) of text[0..n) and the common ones. */
static void count_words(const char *text, size_t n, int *words, int *common) {
    *words = *common = 0;
    char w[64];
    size_t len = 0;
    for (size_t i = 0; i <= n; i++) {
        char c = i < n ? text[i] : ' ';
        if (c >= 'A' && c <= 'Z') c = (char)(c - 'A' + 'a');
        if ((c >= 'a' && c <= 'z') || (c == '\'' && len > 0)) {
            if (len + 1 < sizeof w) w[len++] = c;
            continue;
        }
        if (len) {
            w[len] = '\0';
            (*words)++;
            *common += is_common_word(w);
            len = 0;
        }
    }
}

Test(reference, stories260K_greedy_is_english) {
    const char *bin = tapdiff_bin();
    const char *st = stories_path();
    if (!st) cr_skip_test("stories260K.gguf not found under $TD_SHARED/models (no ../shared)");
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' run --model '%s' --backend ref --tokens 1 --steps 200 --taps none --quiet 2>&1",
             bin, st);
    char *quiet = NULL;
    cr_assert_eq(run_cmd(cmd, &quiet), 0, "%s failed:\n%s", cmd, quiet);
    cr_assert(strstr(quiet, "tokens/s"), "the summary line is missing:\n%s", quiet);
    free(quiet);
    snprintf(cmd, sizeof cmd, "'%s' run --model '%s' --backend ref --tokens 1 --steps 200 --taps none 2>/dev/null",
             bin, st);
    char *out = NULL;
    cr_assert_eq(run_cmd(cmd, &out), 0, "%s failed:\n%s", cmd, out);

    // keep the output for the lead (cwd is the build directory under meson)
    FILE *keep = fopen("reference_stories260K_greedy.txt", "w");
    if (keep) {
        fprintf(keep, "$ %s\n%s", cmd, out);
        fclose(keep);
    }
    fprintf(stderr, "[reference] stories260K greedy from BOS, 200 steps:\n%s", out);

    const char *text = strstr(out, "sampled text:");
    cr_assert_not_null(text, "no text line in:\n%s", out);
    text += strlen("sampled text:");
    // the summary line follows the text; the text itself may hold newlines
    const char *summary = strstr(text, "\nrun: backend ref");
    cr_assert_not_null(summary);
    const size_t n = (size_t)(summary - text);
    size_t ascii = 0;
    for (size_t i = 0; i < n; i++) ascii += (unsigned char)text[i] < 128;
    cr_assert_gt(n, 400, "200 tokens of text should be several hundred characters, got %zu", n);
    cr_assert_eq(ascii, n, "TinyStories text is ASCII");
    cr_assert(strstr(text, "Once upon a time"), "no 'Once upon a time' in: %.*s", (int)n, text);
    int words, common;
    count_words(text, n, &words, &common);
    fprintf(stderr, "[reference] stories260K: %d of %d words are common English words\n", common, words);
    cr_assert_geq(words, 60, "too few words: %.*s", (int)n, text);
    cr_assert_geq(common * 100, words * 85, "only %d of %d words are common English words in: %.*s", common, words,
                  (int)n, text);
    free(out);
}

/* ------------------------------------------------------------------------ */
/* The tap file of `tapdiff run --taps full`: names in execution order,
 * shapes, dtypes, steps, provenance, the greedy self-check, hist.tokens.    */

typedef struct want_tap {
    char name[64];
    int64_t d0, d1; /* d1 = 0: 1-D */
    td_dtype dt;
} want_tap;

/* The taps of one step, in execution order; `fdt` is the dtype of the float
 * taps (f64 for ref, f32 for ref32). */
static int expected_taps(const td_model *m, int64_t T, int64_t n_hist, td_dtype fdt, want_tap *w) {
    const td_hparams *hp = &m->hp;
    const int64_t E = hp->n_embd, HD = (int64_t)hp->n_head * hp->head_dim, KD = (int64_t)hp->n_head_kv * hp->head_dim;
    const int64_t F = hp->n_ff, X = hp->n_expert, K = hp->n_expert_used, V = hp->n_vocab;
    int n = 0;
#define W(nm, a, b, t) (snprintf(w[n].name, sizeof w[n].name, "%s", nm), w[n].d0 = (a), w[n].d1 = (b), w[n++].dt = (t))
    W("inp.tokens", T, 0, TD_DT_I32);
    W("inp.pos", T, 0, TD_DT_I32);
    W("inp.embd", T, E, fdt);
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        char nm[64];
#define WL(s, a, b, t) (snprintf(nm, sizeof nm, "blk.%u.%s", l, s), W(nm, a, b, t))
        WL("attn_norm", T, E, fdt);
        WL("attn_q", T, HD, fdt);
        WL("attn_k", T, KD, fdt);
        WL("attn_v", T, KD, fdt);
        if (hp->arch != TD_ARCH_LLAMA) {
            WL("attn_q_norm", T, HD, fdt);
            WL("attn_k_norm", T, KD, fdt);
        }
        WL("attn_q_rope", T, HD, fdt);
        WL("attn_k_rope", T, KD, fdt);
        WL("attn_ctx", T, HD, fdt);
        WL("attn_out", T, E, fdt);
        WL("ffn_inp", T, E, fdt);
        WL("ffn_norm", T, E, fdt);
        if (X > 0) {
            WL("moe_logits", T, X, fdt);
            WL("moe_probs", T, X, fdt);
            WL("moe_topk", T, K, TD_DT_I32);
            WL("moe_weights", T, K, fdt);
        } else {
            WL("ffn_gate", T, F, fdt);
            WL("ffn_up", T, F, fdt);
            WL("ffn_act", T, F, fdt);
        }
        WL("ffn_out", T, E, fdt);
        WL("out", T, E, fdt);
#undef WL
    }
    W("out.norm", T, E, fdt);
    W("out.logits", T, V, fdt);
    W("hist.tokens", n_hist, 0, TD_DT_I64);
#undef W
    return n;
}

static void check_tap_file(const char *model_path, const td_model *m, const char *backend) {
    const int is32 = !strcmp(backend, "ref32");
    const char *bin = tapdiff_bin();
    char h5[400], cmd[2048];
    snprintf(h5, sizeof h5, "%s/run.h5", tmpdir);
    const int64_t P = 3, N = 3;
    snprintf(cmd, sizeof cmd, "'%s' run --model '%s' --backend %s --tokens 1,2,3 --steps %lld --taps full --out '%s' 2>&1",
             bin, model_path, backend, (long long)N, h5);
    char *out = NULL;
    cr_assert_eq(run_cmd(cmd, &out), 0, "%s:\n%s", cmd, out);
    free(out);

    td_err err = {{0}};
    td_tapfile *f = NULL;
    cr_assert_eq(td_tapfile_open(&f, h5, &err), TD_OK, "%s", err.msg);
    cr_assert_eq(td_tapfile_n_steps(f), 1 + N);

    // provenance
    char *v = NULL, sha[65];
    cr_assert_eq(td_sha256_file(model_path, sha, &err), TD_OK);
    const char *want_attr[][2] = {{"model_sha256", sha}, {"backend", backend},     {"precision", is32 ? "f32" : "f64"},
                                  {"decode", "greedy"},  {"arch", td_arch_name(m->hp.arch)}};
    for (size_t i = 0; i < sizeof want_attr / sizeof want_attr[0]; i++) {
        cr_assert_eq(td_tapfile_attr_str(f, want_attr[i][0], &v, &err), TD_OK, "%s", err.msg);
        cr_assert_str_eq(v, want_attr[i][1], "attribute %s", want_attr[i][0]);
        free(v);
    }
    const char *present[] = {"model", "backend_version", "threads", "tapdiff_version", "git_revision", "command_line"};
    for (size_t i = 0; i < sizeof present / sizeof present[0]; i++) {
        cr_assert_eq(td_tapfile_attr_str(f, present[i], &v, &err), TD_OK, "attribute %s: %s", present[i], err.msg);
        free(v);
    }

    // every step: kind, positions, names in execution order, shapes, dtypes
    want_tap *w = calloc(512, sizeof *w);
    const int64_t V = m->hp.n_vocab;
    int64_t prev_argmax = -1, consumed = 0;
    for (int64_t s = 0; s <= N; s++) {
        td_step_info si;
        cr_assert_eq(td_tapfile_step(f, s, &si, &err), TD_OK, "%s", err.msg);
        const int64_t T = s == 0 ? P : 1;
        cr_assert_eq(si.kind, s == 0 ? TD_STEP_PREFILL : TD_STEP_DECODE);
        cr_assert_eq(si.pos0, s == 0 ? 0 : P + s - 1);
        cr_assert_eq(si.n_tokens, T);
        consumed += T;
        const int64_t W = 16; // the history window of the README tap table
        int nw = expected_taps(m, T, consumed < W ? consumed : W, is32 ? TD_DT_F32 : TD_DT_F64, w);
        td_tap_info *taps = NULL;
        int64_t nt = 0;
        cr_assert_eq(td_tapfile_step_taps(f, s, &taps, &nt, &err), TD_OK, "%s", err.msg);
        cr_assert_eq(nt, nw, "step %lld: %lld taps, expected %d", (long long)s, (long long)nt, nw);
        for (int i = 0; i < nw; i++) {
            cr_assert_str_eq(taps[i].name, w[i].name, "step %lld tap #%d", (long long)s, i);
            cr_assert_eq(taps[i].dtype, w[i].dt, "%s dtype", w[i].name);
            cr_assert_eq(taps[i].ndim, w[i].d1 ? 2 : 1, "%s ndim", w[i].name);
            cr_assert_eq(taps[i].shape[0], w[i].d0, "%s shape[0]", w[i].name);
            if (w[i].d1) cr_assert_eq(taps[i].shape[1], w[i].d1, "%s shape[1]", w[i].name);
            cr_assert(taps[i].has_data, "%s has no data in full mode", w[i].name);
            cr_assert_eq(taps[i].fp.n_nonfinite, 0, "%s has non-finite values", w[i].name);
            if (i) cr_assert_gt(taps[i].seq, taps[i - 1].seq);
        }
        free(taps);
        // greedy self-check: this step consumed the previous step's argmax
        int64_t tok[3];
        cr_assert_eq(td_tapfile_read_i64(f, s, "inp.tokens", tok, (uint64_t)T, &err), TD_OK, "%s", err.msg);
        if (s > 0) cr_assert_eq(tok[0], prev_argmax, "step %lld consumed %lld, the argmax was %lld", (long long)s,
                                (long long)tok[0], (long long)prev_argmax);
        double *lg = malloc(sizeof(double) * (size_t)(T * V));
        cr_assert_eq(td_tapfile_read_f64(f, s, "out.logits", lg, (uint64_t)(T * V), &err), TD_OK, "%s", err.msg);
        prev_argmax = argmax(lg + (T - 1) * V, V);
        free(lg);
        // hist.tokens: every id consumed so far, oldest first (fewer than W here)
        int64_t hist[16];
        cr_assert_eq(td_tapfile_read_i64(f, s, "hist.tokens", hist, (uint64_t)consumed, &err), TD_OK, "%s", err.msg);
        cr_assert_eq(hist[consumed - 1], tok[T - 1]);
        if (s == 0) cr_assert(hist[0] == 1 && hist[1] == 2 && hist[2] == 3);
    }
    free(w);
    td_tapfile_close(f);
}

static const fx_arm k_tap_cases[] = {
    {"llama-q8_0", "ref"}, {"qwen3-f32", "ref"}, {"qwen3moe-q4_k", "ref"}, {"qwen3moe-f32", "ref32"}};
#define N_TAP_CASES (sizeof k_tap_cases / sizeof k_tap_cases[0])
static int k_tap_ix[N_TAP_CASES];

ParameterizedTestParameters(reference, tap_file_full) {
    for (size_t i = 0; i < N_TAP_CASES; i++) k_tap_ix[i] = (int)i;
    return cr_make_param_array(int, k_tap_ix, N_TAP_CASES);
}

ParameterizedTest(int *ix, reference, tap_file_full, .init = make_tmpdir, .fini = remove_tmpdir) {
    const fx_arm *c = &k_tap_cases[*ix];
    char path[512];
    td_err err = {{0}};
    cr_assert_eq(td_fixture_write(c->fixture, tmpdir, path, sizeof path, &err), TD_OK, "%s", err.msg);
    td_model *m = NULL;
    cr_assert_eq(td_model_open(&m, path, &err), TD_OK, "%s", err.msg);
    check_tap_file(path, m, c->backend);
    td_model_close(m);
}

/* --taps PATTERN: every tap is recorded, only the matching ones with data;
 * --taps fingerprint: none with data. */
Test(reference, tap_modes, .init = make_tmpdir, .fini = remove_tmpdir) {
    const char *bin = tapdiff_bin();
    char path[512], cmd[2048], h5[600];
    td_err err = {{0}};
    cr_assert_eq(td_fixture_write("qwen3moe-q8_0", tmpdir, path, sizeof path, &err), TD_OK, "%s", err.msg);
    const char *modes[] = {"out.*,blk.1.moe_*", "fingerprint"};
    for (int k = 0; k < 2; k++) {
        snprintf(h5, sizeof h5, "%s/m%d.h5", tmpdir, k);
        snprintf(cmd, sizeof cmd, "'%s' run --model '%s' --backend ref --tokens 5,6 --steps 1 --taps '%s' --out '%s' 2>&1",
                 bin, path, modes[k], h5);
        char *out = NULL;
        cr_assert_eq(run_cmd(cmd, &out), 0, "%s\n%s", cmd, out);
        free(out);
        td_tapfile *f = NULL;
        cr_assert_eq(td_tapfile_open(&f, h5, &err), TD_OK, "%s", err.msg);
        td_tap_info *taps = NULL;
        int64_t nt = 0, with_data = 0;
        cr_assert_eq(td_tapfile_step_taps(f, 1, &taps, &nt, &err), TD_OK, "%s", err.msg);
        for (int64_t i = 0; i < nt; i++) {
            const char *nm = taps[i].name;
            int want = k == 0 && (!strncmp(nm, "out.", 4) || !strncmp(nm, "blk.1.moe_", 10));
            cr_assert_eq(taps[i].has_data, want, "mode %s: tap %s has_data = %d", modes[k], nm, taps[i].has_data);
            cr_assert_eq(taps[i].fp.count, (uint64_t)(taps[i].shape[0] * (taps[i].ndim > 1 ? taps[i].shape[1] : 1)));
            with_data += taps[i].has_data;
        }
        cr_assert_eq(with_data, k == 0 ? 6 : 0); // out.norm, out.logits, blk.1.moe_{logits,probs,topk,weights}
        free(taps);
        td_tapfile_close(f);
    }
}

/* ------------------------------------------------------------------------ */
/* tapdiff run: exit codes and pinned decoding.                              */

Test(reference, run_exit_codes_and_pinned, .init = make_tmpdir, .fini = remove_tmpdir) {
    const char *bin = tapdiff_bin();
    char path[512], cmd[2048];
    td_err err = {{0}};
    cr_assert_eq(td_fixture_write("llama-f32", tmpdir, path, sizeof path, &err), TD_OK, "%s", err.msg);
    struct {
        const char *args;
        int status;
    } cases[] = {
        {"--help", 0},
        {"--model M --backend ref --tokens 1,2 --steps 2", 0},
        {"--model M --backend ref32 --tokens-file TOK --steps 1 --quiet", 0},
        {"--model M --backend ref --tokens 1,320", 3},                 // V = 320
        {"--model M --backend ref --tokens 1,x", 2},
        {"--model M --backend nope --tokens 1", 2},
        {"--model M --backend ref", 2},
        {"--model M --backend ref --tokens 1 --taps full", 2},          // no --out
        {"--model M --backend ref --tokens 1 --bogus 3", 2},
        {"--model M.missing --backend ref --tokens 1", 3},
        {"--model M --backend ref --tokens-file M.missing", 3},
        {"--model M --backend ref --tokens 1 --decode pinned:PIN --steps 5", 3}, // PIN holds 3 ids
    };
    char tokfile[600], pinfile[600];
    snprintf(tokfile, sizeof tokfile, "%s/tok.txt", tmpdir);
    snprintf(pinfile, sizeof pinfile, "%s/pin.txt", tmpdir);
    FILE *f = fopen(tokfile, "w");
    fputs("1, 5\n9\n", f);
    fclose(f);
    f = fopen(pinfile, "w");
    fputs("7 8,9", f);
    fclose(f);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        // substitute M, TOK and PIN
        char args[1024] = "";
        for (const char *p = cases[i].args; *p;) {
            if (!strncmp(p, "TOK", 3)) strcat(args, tokfile), p += 3;
            else if (!strncmp(p, "PIN", 3)) strcat(args, pinfile), p += 3;
            else if (*p == 'M' && (p[1] == ' ' || p[1] == '.')) strcat(args, path), p += 1;
            else strncat(args, p++, 1);
        }
        snprintf(cmd, sizeof cmd, "'%s' run %s >/dev/null 2>&1", bin, args);
        cr_expect_eq(run_cmd(cmd, NULL), cases[i].status, "exit status of: %s", cmd);
    }

    // pinned from a text file: the fed ids are the file's, whatever the argmax
    snprintf(cmd, sizeof cmd, "'%s' run --model '%s' --backend ref --tokens 1 --decode pinned:'%s' --out '%s/p.h5' 2>&1",
             bin, path, pinfile, tmpdir);
    char *out = NULL;
    cr_assert_eq(run_cmd(cmd, &out), 0, "%s\n%s", cmd, out);
    cr_assert(strstr(out, "fed: 7 8 9\n"), "output:\n%s", out);
    free(out);
    // pinned from that tap file: the same prompt and decode tokens are fed
    snprintf(cmd, sizeof cmd, "'%s' run --model '%s' --backend ref32 --decode pinned:'%s/p.h5' 2>&1", bin, path,
             tmpdir);
    cr_assert_eq(run_cmd(cmd, &out), 0, "%s\n%s", cmd, out);
    cr_assert(strstr(out, "fed: 7 8 9\n"), "output:\n%s", out);
    cr_assert(strstr(out, "prefill 1 + decode 3 steps (pinned)"), "output:\n%s", out);
    free(out);
}

/* ------------------------------------------------------------------------ */
/* The runner in-process (what bisect/gate use).                             */

Test(reference, runner_in_process, .init = make_tmpdir, .fini = remove_tmpdir) {
    char path[512];
    td_err err = {{0}};
    cr_assert_eq(td_fixture_write("qwen3-q6_k", tmpdir, path, sizeof path, &err), TD_OK, "%s", err.msg);
    const int32_t prompt[3] = {10, 20, 30};
    td_run_config c;
    td_run_config_init(&c);
    c.model_path = path;
    c.backend = "ref";
    c.prompt = prompt;
    c.n_prompt = 3;
    c.n_steps = 4;
    td_run_result r;
    cr_assert_eq(td_run(&c, &r, &err), TD_OK, "%s", err.msg);
    cr_assert_eq(r.n_forwards, 5);
    for (int64_t s = 0; s < 4; s++) cr_assert_eq(r.fed[s], r.sampled[s], "greedy feeds back the argmax");
    cr_assert_eq(r.sampled[4], td_argmax(r.final_logits, r.n_vocab));

    // the same through the backend directly: identical final logits
    td_model *m = NULL;
    cr_assert_eq(td_model_open(&m, path, &err), TD_OK, "%s", err.msg);
    td_backend *b = open_backend("ref", m, 7);
    double *lg = malloc(sizeof(double) * 3 * r.n_vocab);
    forward(b, prompt, 3, 0, NULL, lg);
    for (int64_t s = 0; s < 4; s++) forward(b, &r.fed[s], 1, 3 + s, NULL, lg);
    cr_assert_eq(memcmp(lg, r.final_logits, sizeof(double) * r.n_vocab), 0);
    b->vt->close(b);
    td_model_close(m);
    free(lg);
    td_run_result_free(&r);

    // argmax: lowest id wins ties, NaN never wins
    const double x[5] = {NAN, 1, 3, 3, 2};
    cr_assert_eq(td_argmax(x, 5), 2);
}

/* ------------------------------------------------------------------------ */
/* Arithmetic profile act-q8 (reference.h)                                    */

/* Unknown profiles are input errors; ref (f64) with act-q8 is the
 * profile-matched oracle: the same roundings, the rest in f64, so ref32
 * act-q8 is as close to it as native ref32 is to native ref (f32 rounding
 * only, not the 8-bit steps); with F32 weights act-q8
 * changes nothing (bitwise: llama.cpp keeps f32 activations for F32
 * weights); with Q8_0 weights the 8-bit activations move the logits by
 * ~1e-2 relative to ref (quants.md §8 expects ~1e-3 per matmul), far more
 * than native ref32's ~1e-6. The values themselves are checked against
 * llama.cpp in the llamacpp suite. */
Test(reference, act_q8_profile, .init = make_tmpdir, .fini = remove_tmpdir) {
    const int32_t tok[5] = {1, 17, 42, 99, 150};
    const char *names[2] = {"llama-f32", "llama-q8_0"};
    for (int i = 0; i < 2; i++) {
        td_model *m = open_fixture(names[i]);
        const int64_t V = m->hp.n_vocab;
        td_err err = {{0}};
        td_backend *b = NULL;
        td_backend_params bad = {.n_ctx = 8, .profile = "act-q9"};
        cr_assert_eq(td_ref_backend_f32.open(&b, m, &bad, &err), TD_EINPUT);
        cr_assert(strstr(err.msg, "act-q9"), "%s", err.msg);
        td_backend_params q8 = {.n_ctx = 8, .profile = "act-q8"};
        td_backend *o = NULL;
        cr_assert_eq(td_ref_backend_f64.open(&o, m, &q8, &err), TD_OK, "ref (f64) act-q8: %s", err.msg);
        double *l64 = malloc((size_t)(5 * V) * sizeof(double)), *ln = malloc((size_t)(5 * V) * sizeof(double)),
               *lq = malloc((size_t)(5 * V) * sizeof(double)), *lo = malloc((size_t)(5 * V) * sizeof(double));
        cr_assert_eq(o->vt->forward(o, tok, 5, 0, NULL, lo, &err), TD_OK, "%s", err.msg);
        td_backend *r64 = open_backend("ref", m, 8), *rn = open_backend("ref32", m, 8);
        cr_assert_eq(td_ref_backend_f32.open(&b, m, &q8, &err), TD_OK, "%s", err.msg);
        cr_assert_eq(r64->vt->forward(r64, tok, 5, 0, NULL, l64, &err), TD_OK, "%s", err.msg);
        cr_assert_eq(rn->vt->forward(rn, tok, 5, 0, NULL, ln, &err), TD_OK, "%s", err.msg);
        cr_assert_eq(b->vt->forward(b, tok, 5, 0, NULL, lq, &err), TD_OK, "%s", err.msg);
        double num = 0, den = 0;
        for (int64_t k = 0; k < 5 * V; k++) num += (lq[k] - l64[k]) * (lq[k] - l64[k]), den += l64[k] * l64[k];
        const double e = sqrt(num / den);
        fprintf(stderr, "[reference]   %s: ref32 act-q8 vs ref at out.logits %.3e\n", names[i], e);
        num = den = 0;
        for (int64_t k = 0; k < 5 * V; k++) num += (lq[k] - lo[k]) * (lq[k] - lo[k]), den += lo[k] * lo[k];
        const double em = sqrt(num / den);
        fprintf(stderr, "[reference]   %s: ref32 act-q8 vs ref act-q8 (matched oracle) %.3e\n", names[i], em);
        if (i == 0) {
            cr_assert_eq(memcmp(ln, lq, (size_t)(5 * V) * sizeof(double)), 0, "F32 weights: act-q8 must equal native");
            cr_assert_eq(memcmp(l64, lo, (size_t)(5 * V) * sizeof(double)), 0, "F32 weights: ref act-q8 = ref");
        } else {
            cr_assert(e > 1e-3 && e < 1e-1, "Q8_0 weights: act-q8 vs ref %.3e, expected 1e-3..1e-1", e);
            // rare codes on either side of a tie may differ between f32 and f64: still far below the 8-bit step
            cr_assert(em < 1e-4 && em < e / 100, "matched oracle: ref32 act-q8 vs ref act-q8 %.3e (vs plain %.3e)", em,
                      e);
        }
        b->vt->close(b), r64->vt->close(r64), rn->vt->close(rn), o->vt->close(o);
        free(l64), free(ln), free(lq), free(lo);
        td_model_close(m);
    }
}

/* ------------------------------------------------------------------------ */
/* Profiles as data (backends/profile.h): each rule rounds at its point      */

static void logits_with(const td_model *m, const td_backend_vt *vt, const char *profile, const int32_t *tok,
                        int64_t T, double *out) {
    td_backend_params p = {.n_ctx = 16, .profile = profile};
    td_backend *b = NULL;
    td_err err = {{0}};
    cr_assert_eq(vt->open(&b, m, &p, &err), TD_OK, "%s %s: %s", vt->name, profile, err.msg);
    cr_assert_eq(b->vt->forward(b, tok, T, 0, NULL, out, &err), TD_OK, "%s", err.msg);
    cr_assert_str_eq(vt->profile_of(b), profile, "the reference reports its profile canonically");
    b->vt->close(b);
}

/* attn-f16 and mm-f16@N act only in steps above their size, kv-f16 at every
 * step; in f64 and f32 alike. On llama-f32, a one-token step with attn-f16 or
 * mm-f16@1 equals native bit for bit, two tokens do not; kv-f16 moves even one
 * token. */
Test(reference, profile_rules_round_at_their_points, .init = make_tmpdir, .fini = remove_tmpdir) {
    td_model *m = open_fixture("llama-f32");
    const int64_t V = m->hp.n_vocab;
    const int32_t tok[2] = {1, 17};
    const td_backend_vt *vts[2] = {&td_ref_backend_f64, &td_ref_backend_f32};
    double *n = malloc((size_t)(2 * V) * sizeof(double)), *x = malloc((size_t)(2 * V) * sizeof(double));
    for (int a = 0; a < 2; a++) {
        for (int64_t T = 1; T <= 2; T++) {
            logits_with(m, vts[a], "native", tok, T, n);
            const char *const rules[3] = {"attn-f16", "mm-f16@1", "kv-f16"};
            for (int r = 0; r < 3; r++) {
                logits_with(m, vts[a], rules[r], tok, T, x);
                const int same = !memcmp(n, x, (size_t)(T * V) * sizeof(double));
                const int expect_same = r < 2 && T == 1;
                cr_assert_eq(same, expect_same, "%s %s T=%lld: logits %s native", vts[a]->name, rules[r], (long long)T,
                             same ? "equal" : "differ from");
            }
        }
    }
    free(n), free(x);
    td_model_close(m);
}

/* The QSA indexer's raw-key cache has the K cache's type: f16 under kv-f16,
 * the raw keys as computed otherwise. fa-f16 is flash attention's cast of
 * K/V where attention reads them; llama.cpp's indexer gathers its blocks
 * straight from an f32 cache, which flash attention never touches (a f16
 * cache under fa-f16 made both llama.cpp arms diverge at qsa_kcache by
 * f16's rounding, r 167 on qwen4exp-f32). Every row of qsa_kcache, prefill
 * and decode, against that step's qsa_k_raw; f16 by the compiler's own
 * _Float16 of the f32 value (the arm's raw key is f32). */
Test(reference, qsa_index_cache_is_f16_under_kv_f16_only, .init = make_tmpdir, .fini = remove_tmpdir) {
    const char *bin = tapdiff_bin();
    char path[512], h5[600], cmd[2048];
    td_err err = {{0}};
    cr_assert_eq(td_fixture_write("qwen4exp-f32", tmpdir, path, sizeof path, &err), TD_OK, "%s", err.msg);
    static const char *const be[2] = {"ref", "ref32"};
    static const char *const prof[3] = {"fa-f16", "native", "kv-f16"};
    for (int b = 0; b < 2; b++) {
        for (int q = 0; q < 3; q++) {
            snprintf(h5, sizeof h5, "%s/qsa-%s-%s.h5", tmpdir, be[b], prof[q]);
            snprintf(cmd, sizeof cmd,
                     "'%s' run --quiet --model '%s' --backend %s --profile %s --tokens 3,14,15,92,65 --steps 1 "
                     "--out '%s' 2>&1",
                     bin, path, be[b], prof[q], h5);
            char *out = NULL;
            const int st = run_cmd(cmd, &out);
            cr_assert_eq(st, 0, "%s", out ? out : "");
            free(out);
            const int f16 = !strcmp(prof[q], "kv-f16");
            td_tapfile *f = NULL;
            cr_assert_eq(td_tapfile_open(&f, h5, &err), TD_OK, "%s", err.msg);
            int64_t checked = 0, rounded = 0;
            for (int64_t s = 0; s < td_tapfile_n_steps(f); s++) {
                td_step_info si;
                cr_assert_eq(td_tapfile_step(f, s, &si, &err), TD_OK, "%s", err.msg);
                for (int l = 0; l < 8; l++) {
                    char kc[64], kr[64];
                    snprintf(kc, sizeof kc, "blk.%d.qsa_kcache", l);
                    snprintf(kr, sizeof kr, "blk.%d.qsa_k_raw", l);
                    td_tap_info ic, ir;
                    if (td_tapfile_tap(f, s, kc, &ic, &err)) continue;
                    cr_assert_eq(td_tapfile_tap(f, s, kr, &ir, &err), TD_OK, "%s", err.msg);
                    const int64_t di = ir.shape[1], T = ir.shape[0], n_kv = ic.shape[0];
                    cr_assert_eq(n_kv, si.pos0 + T, "%s step %lld: %s holds every cached position", h5, (long long)s,
                                 kc);
                    double *c = malloc(sizeof(double) * ic.count), *r = malloc(sizeof(double) * ir.count);
                    cr_assert_eq(td_tapfile_read_f64(f, s, kc, c, ic.count, &err), TD_OK, "%s", err.msg);
                    cr_assert_eq(td_tapfile_read_f64(f, s, kr, r, ir.count, &err), TD_OK, "%s", err.msg);
                    for (int64_t i = 0; i < T * di; i++) {
                        const double raw = r[i], want = f16 ? (double)(_Float16)(float)raw : raw;
                        const double got = c[si.pos0 * di + i];
                        cr_assert(got == want, "%s %s step %lld %s[%lld]: %.17g, want %.17g (raw key %.17g)", be[b],
                                  prof[q], (long long)s, kc, (long long)(si.pos0 * di + i), got, want, raw);
                        rounded += raw != want, checked++;
                    }
                    free(c), free(r);
                }
            }
            td_tapfile_close(f);
            cr_assert_gt(checked, 0, "%s: no qsa_kcache row checked", h5);
            // not vacuous: f16 moves most raw keys
            if (f16) cr_assert_gt(rounded, checked / 2, "%s: f16 moved only %lld of %lld keys", h5, (long long)rounded,
                                  (long long)checked);
        }
    }
}

/* ------------------------------------------------------------------------ */
/* Threads: a matmul's output rows are split between workers, every dot
 * product keeps its index order, so 1, 2 and 3 threads give the same bits in
 * every tap (logits included) and every step, for both arms.               */

/* Every tap of every step of two tap files, compared bit for bit. */
static void assert_tapfiles_bitwise_equal(const char *h5a, const char *h5b, const char *what) {
    td_err err = {{0}};
    td_tapfile *fa = NULL, *fb = NULL;
    cr_assert_eq(td_tapfile_open(&fa, h5a, &err), TD_OK, "%s", err.msg);
    cr_assert_eq(td_tapfile_open(&fb, h5b, &err), TD_OK, "%s", err.msg);
    cr_assert_eq(td_tapfile_n_steps(fa), td_tapfile_n_steps(fb), "%s: step counts", what);
    cr_assert_gt(td_tapfile_n_steps(fa), 1, "%s: a prefill and decode steps", what);
    int64_t n_data = 0;
    for (int64_t s = 0; s < td_tapfile_n_steps(fa); s++) {
        td_tap_info *ta = NULL, *tb = NULL;
        int64_t na = 0, nb = 0;
        cr_assert_eq(td_tapfile_step_taps(fa, s, &ta, &na, &err), TD_OK, "%s", err.msg);
        cr_assert_eq(td_tapfile_step_taps(fb, s, &tb, &nb, &err), TD_OK, "%s", err.msg);
        cr_assert_eq(na, nb, "%s step %lld: tap counts", what, (long long)s);
        for (int64_t i = 0; i < na; i++) {
            cr_assert_str_eq(ta[i].name, tb[i].name, "%s step %lld tap #%lld", what, (long long)s, (long long)i);
            cr_assert(ta[i].has_data && tb[i].has_data, "%s: %s has no data", what, ta[i].name);
            cr_assert_eq(ta[i].count, tb[i].count, "%s: %s count", what, ta[i].name);
            double *a = malloc(sizeof(double) * ta[i].count), *b = malloc(sizeof(double) * ta[i].count);
            cr_assert_eq(td_tapfile_read_f64(fa, s, ta[i].name, a, ta[i].count, &err), TD_OK, "%s", err.msg);
            cr_assert_eq(td_tapfile_read_f64(fb, s, tb[i].name, b, tb[i].count, &err), TD_OK, "%s", err.msg);
            for (uint64_t k = 0; k < ta[i].count; k++)
                cr_assert(!memcmp(&a[k], &b[k], sizeof a[k]), "%s step %lld %s[%llu]: %.17g vs %.17g", what,
                          (long long)s, ta[i].name, (unsigned long long)k, a[k], b[k]);
            free(a), free(b);
            n_data++;
        }
        free(ta), free(tb);
    }
    cr_assert_gt(n_data, 20, "%s: only %lld taps compared", what, (long long)n_data);
    td_tapfile_close(fa), td_tapfile_close(fb);
}

/* profile NULL: the default; tokens NULL: a 5-token prefill. */
static void check_threads_bitwise_tokens(const char *model_path, const char *backend, const char *profile,
                                         const char *tokens) {
    const char *bin = tapdiff_bin();
    char h5[3][400], cmd[2048];
    const int threads[3] = {1, 2, 3};
    for (int i = 0; i < 3; i++) {
        snprintf(h5[i], sizeof h5[i], "%s/thr%d.h5", tmpdir, threads[i]);
        // a 5-token prefill (T > 1: every matmul's rows x tokens) and 3 decode steps
        snprintf(cmd, sizeof cmd,
                 "'%s' run --model '%s' --backend %s --threads %d --tokens %s --steps 3 --taps full --out '%s' "
                 "%s%s 2>&1",
                 bin, model_path, backend, threads[i], tokens ? tokens : "1,7,2,9,4", h5[i],
                 profile ? "--profile " : "", profile ? profile : "");
        char *out = NULL;
        cr_assert_eq(run_cmd(cmd, &out), 0, "%s:\n%s", cmd, out);
        free(out);
    }
    char what[600];
    for (int i = 1; i < 3; i++) {
        snprintf(what, sizeof what, "%s %s %s threads 1 vs %d", model_path, backend, profile ? profile : "",
                 threads[i]);
        assert_tapfiles_bitwise_equal(h5[0], h5[i], what);
    }
}

static void check_threads_bitwise(const char *model_path, const char *backend, const char *profile) {
    check_threads_bitwise_tokens(model_path, backend, profile, NULL);
}

static const fx_arm k_thr_cases[] = {{"llama-q4_k", "ref"},    {"llama-q4_k", "ref32"},    {"qwen3moe-q4_k", "ref"},
                                     {"qwen3moe-f32", "ref32"}, {"qwen3next-q8_0", "ref"}, {"qwen3next-f32", "ref32"}};
#define N_THR_CASES (sizeof k_thr_cases / sizeof k_thr_cases[0])
static int k_thr_ix[N_THR_CASES];

ParameterizedTestParameters(reference, threads_are_bitwise_identical) {
    for (size_t i = 0; i < N_THR_CASES; i++) k_thr_ix[i] = (int)i;
    return cr_make_param_array(int, k_thr_ix, N_THR_CASES);
}

ParameterizedTest(int *ix, reference, threads_are_bitwise_identical, .init = make_tmpdir, .fini = remove_tmpdir) {
    const fx_arm *c = &k_thr_cases[*ix];
    char path[512];
    td_err err = {{0}};
    cr_assert_eq(td_fixture_write(c->fixture, tmpdir, path, sizeof path, &err), TD_OK, "%s", err.msg);
    check_threads_bitwise(path, c->backend, NULL);
}

/* qwen4exp with a 16-token prefill, so that its QSA layers (blocks of 4 and 8,
 * 11 and 15 positions selected) select sparsely and the PLE conv reaches back
 * through its history. */
Test(reference, threads_are_bitwise_identical_qwen4exp, .init = make_tmpdir, .fini = remove_tmpdir) {
    static const char *const fx[2] = {"qwen4exp-q8_0", "qwen4exp-ties"};
    static const char *const be[2] = {"ref", "ref32"};
    for (int i = 0; i < 2; i++) {
        char path[512];
        td_err err = {{0}};
        cr_assert_eq(td_fixture_write(fx[i], tmpdir, path, sizeof path, &err), TD_OK, "%s", err.msg);
        check_threads_bitwise_tokens(path, be[i], NULL, "3,14,15,92,65,35,89,79,32,38,46,26,43,38,32,79");
    }
}

/* The profile's f16 paths (rounded rows, f16 sums, f16 attention) split the
 * same way. */
Test(reference, threads_are_bitwise_identical_f16_profile, .init = make_tmpdir, .fini = remove_tmpdir) {
    char path[512];
    td_err err = {{0}};
    cr_assert_eq(td_fixture_write("llama-q4_k", tmpdir, path, sizeof path, &err), TD_OK, "%s", err.msg);
    check_threads_bitwise(path, "ref", "attn-f16+mm-f16@1+acc-f16");
    check_threads_bitwise(path, "ref32", "attn-f16+mm-f16@1+acc-f16");
}

Test(reference, threads_are_bitwise_identical_stories260K, .init = make_tmpdir, .fini = remove_tmpdir) {
    const char *path = stories_path();
    if (!path) cr_skip_test("stories260K.gguf is not in $TD_SHARED/models");
    check_threads_bitwise(path, "ref", NULL);
    check_threads_bitwise(path, "ref32", NULL);
}

/* ------------------------------------------------------------------------ */
/* f16 tie sources (profile.h td_act_ties_source): what the arm's taps show   */

/* A ties session over the reference's run of a 16-token prompt and one
 * decode step under `profile`: the log, pinning `pin` when given. */
static void ties_run(const char *model, const char *taps, const char *profile, const td_act_tie *pin,
                     td_act_tie **log, int *n) {
    int32_t prompt[16];
    for (int i = 0; i < 16; i++) prompt[i] = 3 + 7 * i;
    td_run_config c;
    td_run_config_init(&c);
    c.model_path = model;
    c.backend = "ref";
    c.profile = profile;
    c.prompt = prompt;
    c.n_prompt = 16;
    c.n_steps = 2;
    c.tap_path = taps;
    td_run_result r;
    td_err err = {{0}};
    td_act_ties_begin(pin, pin ? 1 : 0, 1.0 / 1024);
    int rc = td_run(&c, &r, &err);
    td_act_ties_end(log, n);
    cr_assert_eq(rc, TD_OK, "%s", err.msg);
    td_run_result_free(&r);
}

/* Every f16 near tie the reference logs with a source names a tap of its
 * step and an element of it that holds exactly the value it rounded, so a
 * reader of an arm's taps (harness/ties.h) sees the arm's side of that very
 * rounding; each kind of rounding point has one: mm-f16's inputs (attn_norm,
 * attn_ctx, ffn_norm, ffn_act, out.norm) and attn-f16's Q, K and V rows. */
Test(reference, f16_tie_sources_name_the_tapped_values, .init = make_tmpdir, .fini = remove_tmpdir) {
    char path[512], taps[600];
    td_err err = {{0}};
    cr_assert_eq(td_fixture_write("llama-f32", tmpdir, path, sizeof path, &err), TD_OK, "%s", err.msg);
    snprintf(taps, sizeof taps, "%s/ref.h5", tmpdir);
    td_act_tie *log = NULL;
    int n = 0;
    ties_run(path, taps, "attn-f16+mm-f16@0", NULL, &log, &n);
    td_tapfile *f = NULL;
    cr_assert_eq(td_tapfile_open(&f, taps, &err), TD_OK, "%s", err.msg);
    const char *kinds[] = {"attn_norm", "attn_q_rope", "attn_k_rope", "attn_v", "attn_ctx", "ffn_norm", "ffn_act", "out.norm"};
    int seen[8] = {0}, n_src = 0;
    for (int i = 0; i < n; i++) {
        const td_act_tie *t = &log[i];
        if (!t->f16 || !t->src[0]) continue;
        n_src++;
        // attention's operands name the attention part, a matmul's input its weight (the site)
        const size_t ls = strlen(t->src), lsite = strlen(t->site);
        const int att = (ls > 6 && !strcmp(t->src + ls - 6, "attn_v")) || strstr(t->src, "_rope");
        const char *want = att ? ".attn_f16" : ".weight";
        cr_assert(lsite > strlen(want) && !strcmp(t->site + lsite - strlen(want), want), "tie %d of %s: site '%s'", i,
                  t->src, t->site);
        td_tap_info ti;
        cr_assert_eq(td_tapfile_tap(f, t->step, t->src, &ti, &err), TD_OK, "tie %d: %s", i, err.msg);
        cr_assert(t->src_elem >= 0 && (uint64_t)t->src_elem < ti.count, "tie %d: element %lld of %s (%llu)", i,
                  (long long)t->src_elem, t->src, (unsigned long long)ti.count);
        double *d = malloc(ti.count * sizeof *d);
        cr_assert_eq(td_tapfile_read_f64(f, t->step, t->src, d, ti.count, &err), TD_OK, "%s", err.msg);
        cr_assert_eq(d[t->src_elem], t->x, "tie %d (step %lld, before %s): %s[%lld] = %.17g, rounded %.17g", i,
                     (long long)t->step, t->tap, t->src, (long long)t->src_elem, d[t->src_elem], t->x);
        free(d);
        const char *base = strncmp(t->src, "blk.", 4) ? t->src : strchr(t->src + 4, '.') + 1;
        for (int k = 0; k < 8; k++) seen[k] += !strcmp(base, kinds[k]);
    }
    td_tapfile_close(f);
    free(log);
    cr_log_info("%d f16 near ties, %d with a source", n, n_src);
    for (int k = 0; k < 8; k++) cr_assert_gt(seen[k], 0, "no near tie read from %s", kinds[k]);
}

static double *read_tap(const char *taps, int64_t step, const char *name, uint64_t *count) {
    td_err err = {{0}};
    td_tapfile *f = NULL;
    cr_assert_eq(td_tapfile_open(&f, taps, &err), TD_OK, "%s", err.msg);
    td_tap_info ti;
    cr_assert_eq(td_tapfile_tap(f, step, name, &ti, &err), TD_OK, "%s: %s", name, err.msg);
    double *d = malloc(ti.count * sizeof *d);
    cr_assert_eq(td_tapfile_read_f64(f, step, name, d, ti.count, &err), TD_OK, "%s", err.msg);
    td_tapfile_close(f);
    *count = ti.count;
    return d;
}

/* ggml-cpu's flash attention (fa-f16+fa-cpu) rounds its output accumulator
 * to f16 at every rescale and update, each an arm's f32 value a few f32
 * ulps from the oracle's: those roundings are near ties of their own call
 * (no source tap, named after attn_ctx), element (token*H + head) << 32 |
 * (2n + kind)*D + d. The p = 1 updates (O + v of two f16 values, exact on
 * both sides) are not: their midpoints are exact, and no entry may be.
 * Pinning one entry moves that head's dimension d of attn_ctx at its step
 * and nothing else of the tap (the dimensions of O never mix). Each entry
 * names the accumulator as its site (td_ties_describe words it by that). */
Test(reference, fa_cpu_accumulator_roundings_are_ties, .init = make_tmpdir, .fini = remove_tmpdir) {
    char path[512], taps[600], pinned[600];
    td_err err = {{0}};
    cr_assert_eq(td_fixture_write("llama-f32", tmpdir, path, sizeof path, &err), TD_OK, "%s", err.msg);
    snprintf(taps, sizeof taps, "%s/ref.h5", tmpdir);
    snprintf(pinned, sizeof pinned, "%s/pinned.h5", tmpdir);
    td_act_tie *log = NULL;
    int n = 0;
    ties_run(path, taps, "fa-f16+fa-cpu", NULL, &log, &n);
    const int64_t D = 32, H = 4; // the fixture's head size and heads
    int n_acc = 0, kinds[2] = {0};
    for (int i = 0; i < n; i++) {
        const td_act_tie *t = &log[i];
        const size_t lt = strlen(t->tap);
        const size_t ls = strlen(t->site);
        const int acc_site = ls > 9 && !strcmp(t->site + ls - 9, ".attn_acc");
        if (!t->f16 || t->src[0] || lt < 8 || strcmp(t->tap + lt - 8, "attn_ctx")) {
            cr_assert(!acc_site, "entry %d (%s, source %s) named as the accumulator", i, t->tap, t->src);
            continue;
        }
        // named after the attention's part, not the matmul before it (td_ties_describe reads it)
        cr_assert(acc_site && !strncmp(t->site, t->tap, lt - 8), "entry %d of %s: site '%s'", i, t->tap, t->site);
        const double frac = t->v - floor(t->v);
        cr_assert(fabs(frac - 0.5) < TD_ACT_TIES_F16_TAU, "entry %d (%s): %.9g ulps", i, t->tap, t->v);
        cr_assert_neq(frac, 0.5, "entry %d (%s, step %lld, element %#llx): an exact midpoint (a p = 1 update)", i,
                      t->tap, (long long)t->step, (unsigned long long)t->elem);
        kinds[((t->elem & 0xffffffff) / D) & 1]++;
        n_acc++;
    }
    cr_log_info("%d accumulator ties (%d updates, %d rescales) of %d logged", n_acc, kinds[0], kinds[1], n);
    cr_assert_gt(n_acc, 0, "no accumulator rounding of fa-cpu logged as a tie");
    // a flipped ulp can be absorbed by a later rounding (O*ms, or O + v for
    // a larger v): the first entries are tried until one shows
    int tried = 0, moved = 0;
    for (int i = 0; i < n && tried < 8 && !moved; i++) {
        const td_act_tie pin = log[i];
        const size_t lt = strlen(pin.tap);
        if (!pin.f16 || pin.src[0] || lt < 8 || strcmp(pin.tap + lt - 8, "attn_ctx")) continue;
        tried++;
        td_act_tie *log2 = NULL;
        int n2 = 0;
        ties_run(path, pinned, "fa-f16+fa-cpu", &pin, &log2, &n2);
        free(log2);
        uint64_t na = 0, nb = 0;
        double *a = read_tap(taps, pin.step, pin.tap, &na), *b = read_tap(pinned, pin.step, pin.tap, &nb);
        cr_assert_eq(na, nb);
        cr_assert_eq(na % (uint64_t)(H * D), 0);
        const uint64_t want = (uint64_t)((pin.elem >> 32) * D + (pin.elem & 0xffffffff) % D);
        for (uint64_t e = 0; e < na; e++) {
            if (a[e] == b[e]) continue;
            cr_assert_eq(e, want, "pinning %s step %lld element %#llx moved element %llu (%.9g -> %.9g), not %llu",
                         pin.tap, (long long)pin.step, (unsigned long long)pin.elem, (unsigned long long)e, a[e],
                         b[e], (unsigned long long)want);
            moved++;
        }
        cr_log_info("pinned %s step %lld element %#llx: %d moved", pin.tap, (long long)pin.step,
                    (unsigned long long)pin.elem, moved);
        free(a), free(b);
    }
    cr_assert_eq(moved, 1, "pinning %d accumulator ties moved no attn_ctx element", tried);
    free(log);
}

/* The same for flash attention (fa-f16+fa-acc-f16): its f16 K and V cache
 * stores read attn_k_rope and attn_v, and its f16(Q*scale) reads attn_q_rope
 * times the scale (src_scale, llama.cpp's f32 1/sqrt(D)); those roundings
 * also log values within TD_ACT_TIES_ROW_NEAR of the row's largest magnitude
 * of a midpoint (small RoPE and matmul outputs), farther than
 * TD_ACT_TIES_F16_TAU ulps. */
Test(reference, f16_tie_sources_of_flash_attention, .init = make_tmpdir, .fini = remove_tmpdir) {
    char path[512], taps[600];
    td_err err = {{0}};
    cr_assert_eq(td_fixture_write("llama-f32", tmpdir, path, sizeof path, &err), TD_OK, "%s", err.msg);
    snprintf(taps, sizeof taps, "%s/ref.h5", tmpdir);
    int32_t prompt[16];
    for (int i = 0; i < 16; i++) prompt[i] = 3 + 7 * i;
    td_run_config c;
    td_run_config_init(&c);
    c.model_path = path;
    c.backend = "ref";
    c.profile = "fa-f16+fa-acc-f16@8";
    c.prompt = prompt;
    c.n_prompt = 16;
    c.n_steps = 2;
    c.tap_path = taps;
    td_run_result r;
    td_act_tie *log = NULL;
    int n = 0;
    td_act_ties_begin(NULL, 0, 1.0 / 1024);
    int rc = td_run(&c, &r, &err);
    td_act_ties_end(&log, &n);
    cr_assert_eq(rc, TD_OK, "%s", err.msg);
    td_run_result_free(&r);
    td_tapfile *f = NULL;
    cr_assert_eq(td_tapfile_open(&f, taps, &err), TD_OK, "%s", err.msg);
    const char *kinds[] = {"attn_q_rope", "attn_k_rope", "attn_v"};
    int seen[3] = {0}, wide[3] = {0};
    const double scale = 1.0f / sqrtf(32.0f); // the fixture's head size
    for (int i = 0; i < n; i++) {
        const td_act_tie *t = &log[i];
        if (!t->f16 || !t->src[0]) continue;
        td_tap_info ti;
        cr_assert_eq(td_tapfile_tap(f, t->step, t->src, &ti, &err), TD_OK, "tie %d: %s", i, err.msg);
        cr_assert(t->src_elem >= 0 && (uint64_t)t->src_elem < ti.count, "tie %d: element %lld of %s", i,
                  (long long)t->src_elem, t->src);
        double *d = malloc(ti.count * sizeof *d);
        cr_assert_eq(td_tapfile_read_f64(f, t->step, t->src, d, ti.count, &err), TD_OK, "%s", err.msg);
        const char *base = strchr(t->src + 4, '.') + 1;
        const int q = !strcmp(base, "attn_q_rope");
        cr_assert_eq(t->src_scale, q ? scale : 0, "tie %d (%s): scale %.9g", i, t->src, t->src_scale);
        cr_assert_eq(d[t->src_elem] * (q ? scale : 1), t->x, "tie %d (step %lld): %s[%lld] = %.17g, rounded %.17g", i,
                     (long long)t->step, t->src, (long long)t->src_elem, d[t->src_elem], t->x);
        free(d);
        for (int k = 0; k < 3; k++)
            if (!strcmp(base, kinds[k])) seen[k]++, wide[k] += fabs(t->v - floor(t->v) - 0.5) >= TD_ACT_TIES_F16_TAU;
    }
    td_tapfile_close(f);
    free(log);
    for (int k = 0; k < 3; k++) {
        cr_log_info("%s: %d sourced f16 ties, %d beyond %.3g ulps of the midpoint", kinds[k], seen[k], wide[k],
                    TD_ACT_TIES_F16_TAU);
        cr_assert_gt(wide[k], 0, "no tie read from %s beyond the f16 tau (row window)", kinds[k]);
    }
}
