/* Our tokenizer (model/tokenizer.h) against llama.cpp's llama_tokenize on
 * the same GGUF files: stories260K's SentencePiece vocab (when ../shared has
 * it) and the BPE vocab fixture with each pre-tokenizer we support (qwen2,
 * llama-bpe, default) and the model fixtures' small vocabs, over the whole corpus of model/tests/tok_corpus.h,
 * with and without parse_special. Every string must give the same ids.
 * Without the peer each test skips with the reason.
 *
 * With TD_TOK_WRITE_EXPECTED=FILE the test also writes llama.cpp's ids for
 * every third corpus string to FILE: that is how
 * model/tests/data/tokenizer_expected.txt (the reduced check that runs
 * without the peer) was produced. */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../../model/tests/tok_corpus.h"
#include "fixtures.h"
#include "gguf.h"
#include "tokenizer.h"
#include "vocab_bpe.h"

#ifdef TD_HAVE_LLAMACPP
#include <llama.h>

#include "llamacpp.h"
#endif

#define NOT_BUILT "llama.cpp peer not built (run ci/fetch-llamacpp.sh, then meson setup --reconfigure BUILD)"

#ifdef TD_HAVE_LLAMACPP
static FILE *g_expected;

#define TOK_FUZZ_N 1000
/* pieces the random strings are built from, besides random bytes */
static const char *const k_fuzz_frags[] = {
    " ", "  ", "\n", "\t", "\r\n", "a", "the", " cat", "'s", "'LL", "0", "12", "3456", ".", "!!", "...", "(", "}",
    "\xC3\xA9", "\xE4\xBD\xA0", "\xF0\x9F\x98\x80", "\xE2\x96\x81", "\xC2\xA0", "\xE3\x80\x80", "\xED\xA0\x80",
    "\xCC\x81", "<|im_start|>", "<|endoftext|>", "tapdiff", "<s>", "</s>", "\x80", "\xC3", "\xF0\x9F",
};

static void escape(const char *s, size_t n, char *out, size_t cap) {
    size_t o = 0;
    for (size_t i = 0; i < n && o + 5 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7F && c != '\\') out[o++] = (char)c;
        else o += (size_t)snprintf(out + o, cap - o, "\\x%02X", c);
    }
    out[o] = '\0';
}

static void ids_str(const int32_t *v, size_t n, char *out, size_t cap) {
    size_t o = 0;
    out[0] = '\0';
    for (size_t i = 0; i < n && o + 12 < cap; i++) o += (size_t)snprintf(out + o, cap - o, "%s%d", i ? "," : "", v[i]);
}

/* Compares the whole corpus on the GGUF at path; label names the vocab. */
static void compare_file(const char *path, const char *label) {
    td_err err = {{0}};
    int rc = td_llamacpp_init(&err);
    if (rc == TD_SKIP) cr_skip_test("%s", err.msg);
    cr_assert_eq(rc, TD_OK, "%s", err.msg);

    struct llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    mp.n_gpu_layers = 0;
    struct llama_model *lm = llama_model_load_from_file(path, mp);
    cr_assert_not_null(lm, "llama.cpp cannot load %s (vocab_only)", path);
    const struct llama_vocab *lv = llama_model_get_vocab(lm);

    td_gguf *g = NULL;
    cr_assert_eq(td_gguf_open(&g, path, &err), TD_OK, "%s", err.msg);
    td_tokenizer *t = NULL;
    cr_assert_eq(td_tokenizer_open(&t, g, &err), TD_OK, "%s", err.msg);
    cr_assert_eq((int)td_tokenizer_n_vocab(t), llama_vocab_n_tokens(lv));

    size_t compared = 0, bad = 0;
    int32_t theirs[1024];
    for (int parse = 0; parse <= 1; parse++)
        for (size_t i = 0; i < TOK_CORPUS_N; i++) {
            tok_str s;
            tok_corpus(i, &s);
            int n = llama_tokenize(lv, s.s, (int32_t)s.n, theirs, 1024, true, parse != 0);
            cr_assert(n >= 0, "llama_tokenize: more than 1024 ids for corpus string %zu", i);
            int32_t *ours = NULL;
            size_t on = 0;
            cr_assert_eq(td_tokenize(t, s.s, s.n, 1, parse, &ours, &on, &err), TD_OK, "string %zu: %s", i, err.msg);
            compared++;
            if (on != (size_t)n || memcmp(ours, theirs, on * sizeof *ours)) {
                if (bad++ < 8) {
                    char e[2100], a[4096], b[4096];
                    escape(s.s, s.n, e, sizeof e);
                    ids_str(ours, on, a, sizeof a);
                    ids_str(theirs, (size_t)n, b, sizeof b);
                    cr_log_error("%s parse_special=%d string %zu \"%s\":\n  ours     %s\n  llama.cpp %s", label, parse,
                                 i, e, a, b);
                }
            }
            if (g_expected && i % 3 == 0) {
                char b[4096];
                ids_str(theirs, (size_t)n, b, sizeof b);
                fprintf(g_expected, "%s\t%d\t%zu\t%s\n", label, parse, i, b);
            }
            free(ours);
        }
    /* random byte strings: any byte but F4-F8 leads, which can decode past
     * U+10FFFF where llama.cpp throws out of llama_tokenize */
    uint64_t st = 0x243F6A8885A308D3ull;
    for (size_t i = 0; i < TOK_FUZZ_N; i++) {
        char buf[64];
        size_t n = (size_t)(tok_rng(&st) % 48);
        for (size_t k = 0; k < n;) {
            uint64_t r = tok_rng(&st);
            const char *frag = k_fuzz_frags[r % (sizeof k_fuzz_frags / sizeof *k_fuzz_frags)];
            if ((r >> 8) % 3 == 0) {
                unsigned char c = (unsigned char)(r >> 16);
                if (c >= 0xF4 && c <= 0xF7) c = 0xFF;
                buf[k++] = (char)c;
            } else {
                for (size_t j = 0; frag[j] && k < n; j++) buf[k++] = frag[j];
            }
        }
        int nt = llama_tokenize(lv, buf, (int32_t)n, theirs, 1024, true, true);
        cr_assert(nt >= 0);
        int32_t *ours = NULL;
        size_t on = 0;
        cr_assert_eq(td_tokenize(t, buf, n, 1, 1, &ours, &on, &err), TD_OK, "fuzz %zu: %s", i, err.msg);
        compared++;
        if (on != (size_t)nt || memcmp(ours, theirs, on * sizeof *ours)) {
            if (bad++ < 8) {
                char e[300], a[4096], b[4096];
                escape(buf, n, e, sizeof e);
                ids_str(ours, on, a, sizeof a);
                ids_str(theirs, (size_t)nt, b, sizeof b);
                cr_log_error("%s fuzz string %zu \"%s\":\n  ours     %s\n  llama.cpp %s", label, i, e, a, b);
            }
        }
        free(ours);
    }
    td_tokenizer_free(t);
    td_gguf_close(g);
    llama_model_free(lm);
    cr_log_info("%s: %zu strings compared, %zu differ", label, compared, bad);
    cr_assert_eq(bad, 0, "%s: %zu of %zu corpus strings tokenize differently from llama.cpp", label, bad, compared);
    cr_assert_geq(compared, 2000);
}

static void bpe_case(const char *pre) {
    char path[] = "/tmp/td_tokpeer_XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    td_err err = {{0}};
    cr_assert_eq(td_fixture_vocab_bpe_write(pre, path, &err), TD_OK, "%s", err.msg);
    char label[64];
    snprintf(label, sizeof label, "bpe-%s", pre);
    compare_file(path, label);
    unlink(path);
}

/* a model fixture's own vocab (fixtures/fixtures.c): SentencePiece for llama-*, gpt2/qwen2 for qwen3* */
static void model_fixture_case(const char *name) {
    char dir[] = "/tmp/td_tokpeer_XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char path[512];
    td_err err = {{0}};
    cr_assert_eq(td_fixture_write(name, dir, path, sizeof path, &err), TD_OK, "%s", err.msg);
    char label[64];
    snprintf(label, sizeof label, "fixture-%s", name);
    compare_file(path, label);
    unlink(path);
    rmdir(dir);
}

static void open_expected(void) {
    const char *p = getenv("TD_TOK_WRITE_EXPECTED");
    if (p && *p && !g_expected) {
        g_expected = fopen(p, "a");
        cr_assert_not_null(g_expected, "cannot open %s", p);
    }
}
static void close_expected(void) {
    if (g_expected) fclose(g_expected);
    g_expected = NULL;
}
TestSuite(tokenize_peer, .init = open_expected, .fini = close_expected, .timeout = 600);
#else
TestSuite(tokenize_peer, .timeout = 600);
#endif

Test(tokenize_peer, stories260k_spm_equals_llama_tokenize) {
#ifndef TD_HAVE_LLAMACPP
    cr_skip_test(NOT_BUILT);
#else
    const char *shared = getenv("TD_SHARED");
    char path[1024];
    snprintf(path, sizeof path, "%s/models/stories260K.gguf", shared ? shared : "../shared");
    if (access(path, R_OK)) cr_skip_test("%s absent: the SentencePiece peer check needs it", path);
    compare_file(path, "stories260K");
#endif
}

Test(tokenize_peer, bpe_fixture_qwen2_equals_llama_tokenize) {
#ifndef TD_HAVE_LLAMACPP
    cr_skip_test(NOT_BUILT);
#else
    bpe_case("qwen2");
#endif
}

Test(tokenize_peer, bpe_fixture_llama_bpe_equals_llama_tokenize) {
#ifndef TD_HAVE_LLAMACPP
    cr_skip_test(NOT_BUILT);
#else
    bpe_case("llama-bpe");
#endif
}

Test(tokenize_peer, model_fixtures_vocabs_equal_llama_tokenize) {
#ifndef TD_HAVE_LLAMACPP
    cr_skip_test(NOT_BUILT);
#else
    model_fixture_case("llama-f32");
    model_fixture_case("qwen3-f32");
#endif
}

Test(tokenize_peer, bpe_fixture_default_equals_llama_tokenize) {
#ifndef TD_HAVE_LLAMACPP
    cr_skip_test(NOT_BUILT);
#else
    bpe_case("default");
#endif
}
