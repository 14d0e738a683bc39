/* External arms (`bisect --a/--b exec:PROGRAM`, harness/extarm.h): every way
 * a program can break the contract gives its message and exit code before
 * anything is compared (extarm_fake plays the program); and, with the real
 * model, the installed tap library is enough to build an engine that bisect
 * judges conformant, and its planted-bug twin divergent at the expected tap
 * and step. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fixtures.h"
#include "td_test.h"

static char dir[256];
static void setup(void) { td_test_tmpdir(dir, sizeof dir, "extarm"); }
static void teardown(void) { td_test_rmdir(dir); }
TestSuite(extarm, .init = setup, .fini = teardown);

typedef struct fail_case {
    char arm[96];    // after "exec:"; FAKE = the fake arm
    int code;
    char says[96];   // in tapdiff's stderr
} fail_case;

ParameterizedTestParameters(extarm, each_broken_contract_has_its_message_and_code) {
    static fail_case cases[] = {
        {"/nonexistent/engine", 2, "program '/nonexistent/engine' not found"},
        {"td-no-such-engine-in-path", 2, "not found in PATH"},
        {"NOEXEC", 2, "Permission denied (is it an executable?)"},
        {"FAKE exit5", 3, "failed: exit status 5"},
        {"FAKE crash", 3, "crashed: killed by signal 9"},
        {"FAKE exit77", 77, "exited 77: it cannot run here"},
        {"FAKE nofile", 3, "exited 0 but wrote no tap file"},
        {"FAKE othermodel", 3, "it ran another model"},
        {"FAKE nosha", 3, "has no model_sha256"},
        {"FAKE fewer", 3, "has 3 complete steps, bisect asked for 4"},
        {"FAKE othertokens", 3, "decode step 1 (step 2) consumed token"},
        {"FAKE prompt", 3, "its prefill consumed token"},
    };
    return cr_make_param_array(fail_case, cases, sizeof cases / sizeof cases[0]);
}

ParameterizedTest(fail_case *c, extarm, each_broken_contract_has_its_message_and_code) {
    const char *fake = getenv("TD_EXTARM_FAKE");
    cr_assert_not_null(fake, "TD_EXTARM_FAKE is not set (run through meson test)");
    const char *model = td_test_fixture(dir, "llama-f32");
    char arm[1200];
    if (!strncmp(c->arm, "FAKE", 4)) {
        snprintf(arm, sizeof arm, "exec:%s%s", fake, c->arm + 4);
    } else if (!strcmp(c->arm, "NOEXEC")) {
        const char *p = td_test_path(dir, "not-a-program");
        td_test_write(p, "hello\n", 6);
        chmod(p, 0644);
        snprintf(arm, sizeof arm, "exec:%s", p);
    } else {
        snprintf(arm, sizeof arm, "exec:%s", c->arm);
    }
    char *out = NULL, *err = NULL;
    const char *args[] = {"bisect", "--model", model, "--a", "ref", "--b", arm, "--tokens", "1,2,3", "--steps", "3",
                          "--out-dir", td_test_path(dir, "bisect"), "--quiet", NULL};
    int rc = td_test_tapdiff_run(dir, &out, &err, args);
    cr_expect_eq(rc, c->code, "%s: exit %d, want %d; stderr:\n%s", c->arm, rc, c->code, err);
    cr_expect(strstr(err, c->says) != NULL, "%s: stderr lacks '%s':\n%s", c->arm, c->says, err);
    cr_expect(strstr(out, "CONFORMANT") == NULL && strstr(out, "DIVERGENT") == NULL,
              "%s: a broken arm was compared:\n%s", c->arm, out);
    free(out);
    free(err);
}

Test(extarm, a_control_arm_cannot_be_external) {
    char *err = NULL;
    const char *args[] = {"bisect", "--model", "m.gguf", "--a", "ref", "--b", "ref32", "--control-arm", "exec:/bin/true",
                          "--tokens", "1", NULL};
    cr_assert_eq(td_test_tapdiff_run(dir, NULL, &err, args), 2);
    cr_expect(strstr(err, "control arm must be a built-in backend") != NULL, "%s", err);
    free(err);
}

/* ------------------------------------------------ the installed library */

static int sh(const char *cmd) {
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

// The output of a shell command (trailing newline dropped), malloc'd.
static char *sh_out(const char *cmd) {
    char full[4096];
    const char *o = td_test_path(dir, ".sh_out");
    snprintf(full, sizeof full, "%s > '%s'", cmd, o);
    cr_assert_eq(sh(full), 0, "%s", full);
    char *s = td_test_slurp(o, NULL);
    size_t n = strlen(s);
    while (n && s[n - 1] == '\n') s[--n] = '\0';
    return s;
}

// Installs the build into dir/inst and returns the pkg-config command that
// sees only that prefix.
static void install(char *pkgconf, size_t cap) {
    const char *build = getenv("TD_BUILD_ROOT");
    cr_assert_not_null(build, "TD_BUILD_ROOT is not set (run through meson test)");
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "meson install -C '%s' --no-rebuild --destdir '%s/inst' >'%s/install.log' 2>&1", build,
             dir, dir);
    cr_assert_eq(sh(cmd), 0, "%s", cmd);
    const char *prefix = getenv("TD_PREFIX"), *libdir = getenv("TD_LIBDIR");
    cr_assert(prefix && libdir, "TD_PREFIX / TD_LIBDIR are not set (run through meson test)");
    // the .pc of the staged prefix, with its prefix moved to where it was staged
    snprintf(pkgconf, cap,
             "env -u PKG_CONFIG_LIBDIR PKG_CONFIG_PATH='%s/inst%s/%s/pkgconfig' pkg-config "
             "--define-variable=prefix='%s/inst%s'",
             dir, prefix, libdir, dir, prefix);
}

// cc with only what pkg-config says (and the sanitizer of this build, which a
// sanitized library needs in the program too).
static void build_example(const char *pkgconf, const char *out, const char *defines) {
    const char *src_root = getenv("TD_SOURCE_ROOT");
    const char *san = getenv("TD_SANITIZE");
    char sanflags[128] = "";
    if (san && *san && strcmp(san, "none")) snprintf(sanflags, sizeof sanflags, "-fsanitize=%s", san);
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "cd '%s' && cc -std=c17 -Wall -Wextra -Werror -pedantic %s %s '%s/examples/naive_llama.c' -o '%s' "
             "$(%s --cflags --libs tapdiff-taps) -Wl,-rpath,$(%s --variable=libdir tapdiff-taps) -lm 2>'%s.log'",
             dir, sanflags, defines, src_root, out, pkgconf, pkgconf, out);
    cr_assert_eq(sh(cmd), 0, "%s\n%s", cmd, td_test_slurp(td_test_path(dir, "cc.log"), NULL));
}

Test(extarm, installed_library_builds_an_engine_that_bisect_judges, .timeout = 600) {
    const char *model = td_test_shared_model("stories260K.gguf");
    char pc[2048];
    install(pc, sizeof pc);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s --cflags tapdiff-taps", pc);
    char *cflags = sh_out(cmd);
    cr_assert(strstr(cflags, dir) != NULL, "cflags '%s' do not name the staged prefix", cflags);
    cr_assert(strstr(cflags, "hdf5") == NULL, "cflags '%s' put HDF5 on the include path", cflags);
    const char *src_root = getenv("TD_SOURCE_ROOT");
    cr_assert(strstr(cflags, src_root) == NULL, "cflags '%s' name the source tree", cflags);
    free(cflags);
    // C++ includes the header as it is
    snprintf(cmd, sizeof cmd,
             "command -v c++ >/dev/null || exit 0; printf '#include <tapdiff/tap.h>\\nint main() { td_tap_sink *s = "
             "nullptr; return TD_TAP_WANT(s, 0, \"x\"); }\\n' | c++ -x c++ -std=c++11 -Wall -Wextra -Werror "
             "-fsyntax-only $(%s --cflags tapdiff-taps) -",
             pc);
    cr_assert_eq(sh(cmd), 0, "a C++ translation unit does not compile with <tapdiff/tap.h>: %s", cmd);
    // the library exports the tap API and nothing of HDF5 or of tapdiff's internals
    snprintf(cmd, sizeof cmd,
             "nm -D --defined-only \"$(%s --variable=libdir tapdiff-taps)/libtapdiff-taps.so.1\" | awk '$2 ~ /[TDB]/ "
             "{print $3}' | grep -v '^td_tap_\\|^td_fingerprint_compute$' | grep -v '^_' | head -5",
             pc);
    char *extra = sh_out(cmd);
    cr_expect_str_empty(extra, "exported beyond the tap API: %s", extra);
    free(extra);

    const char *good = td_test_path(dir, "naive_llama"), *bad = td_test_path(dir, "naive_llama_bug");
    build_example(pc, good, "");
    build_example(pc, bad, "-DNAIVE_LLAMA_BUG");

    // the static library, with what `pkg-config --static` adds: the engine then
    // needs no libtapdiff-taps.so, and still writes a tap file
    const char *san = getenv("TD_SANITIZE");
    char sanflags[128] = "";
    if (san && *san && strcmp(san, "none")) snprintf(sanflags, sizeof sanflags, "-fsanitize=%s", san);
    static char scmd[16384];
    snprintf(scmd, sizeof scmd,
             "cd '%s' && cc -std=c17 %s '%s/examples/naive_llama.c' -o naive_static $(%s --cflags tapdiff-taps) "
             "$(%s --static --libs tapdiff-taps | sed 's/-ltapdiff-taps/-l:libtapdiff-taps.a/') -lm 2>static.log && "
             "! ldd ./naive_static | grep -q tapdiff-taps && "
             "TAPDIFF_MODEL='%s' TAPDIFF_PROMPT=1,403 TAPDIFF_STEPS=2 TAPDIFF_TAPS=static.h5 ./naive_static "
             ">/dev/null && test -s static.h5",
             dir, sanflags, getenv("TD_SOURCE_ROOT"), pc, pc, model);
    cr_assert_eq(sh(scmd), 0, "static link or run failed: %s\n%s", scmd, td_test_slurp(td_test_path(dir, "static.log"), NULL));

    // meson points LD_LIBRARY_PATH at the build tree's library: the engine
    // must load the installed one (its rpath)
    unsetenv("LD_LIBRARY_PATH");
    char arm[1100];
    snprintf(arm, sizeof arm, "exec:%s", good);
    char *out = NULL, *err = NULL;
    const char *args[] = {"bisect", "--model", model, "--a", "ref", "--b", arm, "--tokens", "1,403,407,261",
                          "--steps", "6", "--out-dir", td_test_path(dir, "good"), "--quiet", "--json", NULL};
    int rc = td_test_tapdiff_run(dir, &out, &err, args);
    cr_assert_eq(rc, 0, "the example engine is not conformant (exit %d):\n%s\n%s", rc, out, err);
    free(out), free(err);

    snprintf(arm, sizeof arm, "exec:%s", bad);
    args[12] = td_test_path(dir, "bad");
    rc = td_test_tapdiff_run(dir, &out, &err, args);
    cr_assert_eq(rc, 1, "the planted bug is not found (exit %d):\n%s\n%s", rc, out, err);
    // the first_divergent object opens with its step, then its name
    const char *fd = strstr(out, "\"first_divergent\":{");
    cr_assert_not_null(fd, "%s", out);
    static const char want_step[] = "\"first_divergent\":{\"step\":1,", want_name[] = "\"name\":\"blk.0.attn_k_rope\",";
    cr_expect(!strncmp(fd, want_step, strlen(want_step)), "first divergence not at step 1:\n%.300s", fd);
    const char *name = strstr(fd, "\"name\":");
    cr_assert_not_null(name);
    cr_expect(!strncmp(name, want_name, strlen(want_name)), "first divergent tap is not blk.0.attn_k_rope:\n%.300s",
              fd);
    free(out), free(err);
}
