/* tapdiff CLI contract: the dispatcher's exit codes, and that every listed
 * subcommand answers --help with 0 and an unknown option with 2. The list of
 * subcommands is read from `tapdiff --help`, so a new subcommand is covered
 * without editing this file. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "td_test.h"

static const char *tapdiff(void) { return td_test_tapdiff(); }

/* Runs `tapdiff ARGS` with stdout+stderr captured into out; returns the exit
 * status, or -1 when it died from a signal. */
static int run(const char *args, char *out, size_t outsz) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' %s 2>&1", tapdiff(), args);
    return td_test_sh_capture(cmd, out, outsz);
}

static char buf[1 << 16];

Test(cli, no_arguments_is_usage_error) {
    cr_assert_eq(run("", buf, sizeof buf), 2);
    cr_assert(strstr(buf, "usage: tapdiff") != NULL, "%s", buf);
}

Test(cli, help_and_version) {
    cr_assert_eq(run("--help", buf, sizeof buf), 0);
    cr_assert(strstr(buf, "exit codes") != NULL, "%s", buf);
    cr_assert_eq(run("--version", buf, sizeof buf), 0);
    cr_assert(strncmp(buf, "tapdiff ", 8) == 0, "%s", buf);
}

Test(cli, unknown_command_is_usage_error) {
    cr_assert_eq(run("frobnicate", buf, sizeof buf), 2);
    cr_assert(strstr(buf, "unknown command 'frobnicate'") != NULL, "%s", buf);
}

Test(cli, every_subcommand_has_help_and_rejects_unknown_options) {
    static char help[1 << 16];
    cr_assert_eq(run("--help", help, sizeof help), 0);
    const char *cmds = strstr(help, "commands:\n");
    cr_assert_not_null(cmds, "no command list in --help:\n%s", help);
    int seen = 0;
    for (const char *line = strchr(cmds, '\n') + 1; *line == ' '; line = strchr(line, '\n') + 1) {
        char name[64];
        if (sscanf(line, " %63s", name) != 1) break;
        char args[128];
        snprintf(args, sizeof args, "%s --help", name);
        cr_expect_eq(run(args, buf, sizeof buf), 0, "tapdiff %s --help:\n%s", name, buf);
        cr_expect(strstr(buf, name) != NULL, "tapdiff %s --help does not name itself:\n%s", name, buf);
        snprintf(args, sizeof args, "%s --no-such-option-xyz", name);
        cr_expect_eq(run(args, buf, sizeof buf), 2, "tapdiff %s with an unknown option:\n%s", name, buf);
        seen++;
    }
    cr_assert_geq(seen, 3, "only %d subcommands listed in --help", seen);
}

/* One option parser for every verb: --opt=VALUE means --opt VALUE, a flag
 * refuses a value, and an unknown option reads the same in every verb. */
Test(cli, options_take_equals_form_everywhere) {
    char dir[256];
    td_test_tmpdir(dir, sizeof dir, "cli");
    char args[1024];
    snprintf(args, sizeof args, "fixture --out=%s --only=llama-f32", dir);
    cr_assert_eq(run(args, buf, sizeof buf), 0, "%s", buf);
    cr_assert_eq(access(td_test_path(dir, "llama-f32.gguf"), R_OK), 0, "--out=DIR --only=NAME wrote nothing: %s", buf);
    snprintf(args, sizeof args, "inspect --no-sha256 --json -- %s", td_test_path(dir, "llama-f32.gguf"));
    cr_assert_eq(run(args, buf, sizeof buf), 0, "'--' ends the options: %s", buf);
    cr_assert_eq(run("fixture --list=yes", buf, sizeof buf), 2, "%s", buf);
    cr_assert(strstr(buf, "--list takes no value") != NULL, "%s", buf);
    cr_assert_eq(run("compare a.h5 b.h5 --k=0", buf, sizeof buf), 2, "%s", buf);
    cr_assert_eq(run("compare a.h5 b.h5 --topk=x", buf, sizeof buf), 2, "%s", buf);
    td_test_rmdir(dir);
}

Test(cli, unknown_option_reads_the_same_in_every_verb) {
    static const char *const verbs[] = {"inspect", "fixture", "run", "compare", "bisect", "gate", "golden", "bench", "audit", "taps"};
    for (size_t i = 0; i < sizeof verbs / sizeof verbs[0]; i++) {
        char args[256], want[256];
        snprintf(args, sizeof args, "%s --no-such-option=1", verbs[i]);
        cr_assert_eq(run(args, buf, sizeof buf), 2, "%s: %s", verbs[i], buf);
        snprintf(want, sizeof want, "tapdiff %s: unknown option '--no-such-option'", verbs[i]);
        cr_assert(strstr(buf, want) != NULL, "%s: want \"%s\" in:\n%s", verbs[i], want, buf);
    }
}
