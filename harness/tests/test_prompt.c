/* Text prompts on the command line: --prompt / --prompt-file on run, bisect,
 * golden and bench, the `prompt` root attribute of tap files, clean text
 * output, and `tapdiff tokenize`. The stories260K continuation ids come from
 * llama2.c's run.c (an independent implementation): greedy after "Once upon a
 * time" it writes 432 383 286 261 376 298 315 first. */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixtures.h"
#include "tapfile.h"
#include "td_test.h"

static char dir[256];
static void setup(void) { td_test_tmpdir(dir, sizeof dir, "prompt"); }
static void teardown(void) { td_test_rmdir(dir); }
TestSuite(prompt, .init = setup, .fini = teardown, .timeout = 600);

static char *root_attr(const char *path, const char *key) {
    td_tapfile *f = NULL;
    td_err err = {{0}};
    cr_assert_eq(td_tapfile_open(&f, path, &err), TD_OK, "%s", err.msg);
    char *v = NULL;
    int rc = td_tapfile_attr_str(f, key, &v, &err);
    td_tapfile_close(f);
    cr_assert_eq(rc, TD_OK, "%s: attribute %s: %s", path, key, err.msg);
    return v;
}

Test(prompt, stories260k_once_upon_a_time_continues_as_llama2c_and_prints_text) {
    const char *model = td_test_shared_model("stories260K.gguf");
    const char *tap = td_test_path(dir, "p.h5");
    char *out = NULL, *err = NULL;
    const char *args[] = {"run", "--model", model, "--backend", "ref", "--prompt", "Once upon a time", "--steps", "30",
                          "--ids", "--out", tap, NULL};
    int rc = td_test_tapdiff_run(dir, &out, &err, args);
    cr_assert_eq(rc, 0, "exit %d\n%s%s", rc, out, err);
    cr_log_info("%s", out);
    cr_expect(strstr(out, "sampled: 432 383 286 261 376 298 315 "), "greedy ids differ from llama2.c's:\n%s", out);
    cr_expect(strstr(out, "\nOnce upon a time, there was a little girl"), "no readable text line:\n%s", out);
    cr_expect(!strstr(out, "\xEF\xBF\xBD"), "U+FFFD in the output");
    char *p = root_attr(tap, "prompt");
    cr_expect_str_eq(p, "Once upon a time");
    free(p);
    free(out);
    free(err);

    /* the same prompt from a file gives the same ids */
    const char *pf = td_test_path(dir, "prompt.txt");
    td_test_write(pf, "Once upon a time", 16);
    const char *args2[] = {"run", "--model", model, "--backend", "ref", "--prompt-file", pf, "--steps", "7",
                           "--ids", "--quiet", NULL};
    const char *args3[] = {"run", "--model", model, "--backend", "ref", "--prompt-file", pf, "--steps", "7",
                           "--ids", NULL};
    rc = td_test_tapdiff_run(dir, &out, &err, args2);
    cr_assert_eq(rc, 0, "%s", err);
    free(out);
    free(err);
    rc = td_test_tapdiff_run(dir, &out, &err, args3);
    cr_assert_eq(rc, 0, "%s", err);
    cr_expect(strstr(out, "prompt: 1 403 407 261 378\n"), "%s", out);
    cr_expect(strstr(out, "sampled: 432 383 286 261 376 298 315 "), "%s", out);
    free(out);
    free(err);
}

Test(prompt, a_character_split_across_byte_tokens_prints_whole) {
    const char *model = td_test_shared_model("stories260K.gguf");
    /* stories260K byte tokens are <0xXX> = id 3 + XX: "é" = C3 A9, "你" = E4 BD A0, one byte per step */
    const char *pin = td_test_path(dir, "pin.txt");
    const char *ids = "198 172 231 192 163\n";
    td_test_write(pin, ids, strlen(ids));
    char dec[1100];
    snprintf(dec, sizeof dec, "pinned:%s", pin);
    const char *args[] = {"run", "--model", model, "--backend", "ref", "--tokens", "1", "--decode", dec, NULL};
    char *out = NULL, *err = NULL;
    int rc = td_test_tapdiff_run(dir, &out, &err, args);
    cr_assert_eq(rc, 0, "%s", err);
    cr_expect(strstr(out, "fed text: \xC3\xA9\xE4\xBD\xA0\n"), "the split characters do not print whole:\n%s", out);
    const char *fed = strstr(out, "fed text:");
    cr_assert_not_null(fed);
    const char *eol = strchr(fed, '\n');
    cr_expect(!memmem(fed, (size_t)(eol - fed), "\xEF\xBF\xBD", 3), "U+FFFD for a valid split sequence:\n%s", out);
    free(out);
    free(err);
}

Test(prompt, tokenize_prints_ids_pieces_and_json) {
    const char *model = td_test_fixture(dir, "qwen3-f32");
    char *out = NULL, *err = NULL;
    const char *args[] = {"tokenize", model, "<|im_start|>the cat", NULL};
    int rc = td_test_tapdiff_run(dir, &out, &err, args);
    cr_assert_eq(rc, 0, "%s", err);
    /* qwen3-f32's vocab: <|im_start|> is its second-to-last token (control), "the" merges */
    cr_expect(strstr(out, "\t<|im_start|>\n"), "%s", out);
    cr_expect(strstr(out, "tokenize: "), "%s", out);
    free(out);
    free(err);
    const char *args2[] = {"tokenize", model, "--json", "--no-special", "<|im_start|>", NULL};
    rc = td_test_tapdiff_run(dir, &out, &err, args2);
    cr_assert_eq(rc, 0, "%s", err);
    cr_expect(strstr(out, "\"tokenizer\":\t\"gpt2\""), "%s", out);
    cr_expect(strstr(out, "\"text\":\t\"<|im_start|>\""), "%s", out);
    free(out);
    free(err);
    const char *args3[] = {"tokenize", td_test_path(dir, "missing.gguf"), "x", NULL};
    cr_expect_eq(td_test_tapdiff_run(dir, NULL, NULL, args3), 3);
    const char *args4[] = {"tokenize", model, NULL};
    cr_expect_eq(td_test_tapdiff_run(dir, NULL, NULL, args4), 2);
}

Test(prompt, bisect_golden_and_bench_take_a_prompt) {
    const char *model = td_test_fixture(dir, "qwen3-f32");
    const char *od = td_test_path(dir, "bisect");
    char *out = NULL, *err = NULL;
    const char *a1[] = {"bisect", "--model", model, "--a", "ref", "--b", "ref32", "--prompt", "the cat sat",
                        "--steps", "2", "--out-dir", od, "--quiet", NULL};
    int rc = td_test_tapdiff_run(dir, &out, &err, a1);
    cr_assert_eq(rc, 0, "bisect exit %d:\n%s%s", rc, out, err);
    char path[1100];
    snprintf(path, sizeof path, "%s/A-ref.h5", od);
    char *p = root_attr(path, "prompt");
    cr_expect_str_eq(p, "the cat sat");
    free(p);
    free(out);
    free(err);

    const char *g = td_test_path(dir, "g.h5");
    const char *a2[] = {"golden", "--model", model, "--prompt", "the cat", "--steps", "2", "--out", g, "--quiet", NULL};
    rc = td_test_tapdiff_run(dir, &out, &err, a2);
    cr_assert_eq(rc, 0, "golden exit %d:\n%s%s", rc, out, err);
    p = root_attr(g, "prompt");
    cr_expect_str_eq(p, "the cat");
    free(p);
    free(out);
    free(err);

    const char *a3[] = {"bench", "--model", model, "--backend", "ref32", "--prompt", "the cat", "--gen", "1",
                        "--repeat", "1", "--bw-mib", "8", "--json", NULL};
    rc = td_test_tapdiff_run(dir, &out, &err, a3);
    cr_assert_eq(rc, 0, "bench exit %d:\n%s%s", rc, out, err);
    /* the prompt's token count, from tokenize */
    char *tout = NULL;
    const char *a4[] = {"tokenize", model, "--json", "the cat", NULL};
    cr_assert_eq(td_test_tapdiff_run(dir, &tout, NULL, a4), 0);
    const char *nt = strstr(tout, "\"n_tokens\":\t");
    cr_assert_not_null(nt, "%s", tout);
    char want[64];
    snprintf(want, sizeof want, "\"prompt_len\":\t%d", atoi(nt + strlen("\"n_tokens\":\t")));
    cr_expect(strstr(out, want), "bench did not prefill the prompt's tokens (%s):\n%s", want, out);
    free(tout);
    free(out);
    free(err);

    const char *a5[] = {"run", "--model", model, "--backend", "ref", "--prompt", "x", "--tokens", "1", NULL};
    cr_expect_eq(td_test_tapdiff_run(dir, NULL, NULL, a5), 2, "--prompt with --tokens is a usage error");
    const char *a6[] = {"run", "--model", model, "--backend", "ref", "--prompt-file", td_test_path(dir, "nope.txt"), NULL};
    cr_expect_eq(td_test_tapdiff_run(dir, NULL, NULL, a6), 3, "a missing prompt file is bad input");
}
