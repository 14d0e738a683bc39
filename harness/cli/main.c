/* tapdiff: the command-line entry point; dispatches to one subcommand. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "td_config.h"

typedef struct subcommand {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *summary;
} subcommand;

static const subcommand commands[] = {
    {"inspect", td_cmd_inspect, "GGUF metadata, tensors, architecture and validation verdict"},
    {"fixture", td_cmd_fixture, "write the deterministic fixture models and print their sha256"},
    {"run", td_cmd_run, "run one backend over prefill + decode steps and write a tap file"},
    {"compare", td_cmd_compare, "compare two tap files: verdict, first divergent tensor, reports"},
    {"bisect", td_cmd_bisect, "run two arms (and a control) pinned to the same tokens and compare them"},
    {"gate", td_cmd_gate, "CI gate: run a backend against a golden file's logits"},
    {"golden", td_cmd_golden, "(re)generate a golden file from the reference"},
    {"bench", td_cmd_bench, "prefill/decode throughput of a backend, and the memory-bandwidth bound"},
    {"audit", td_cmd_audit, "MoE router tie audit of one tap file, or selection disagreements of two"},
    {"taps", td_cmd_taps, "the tap catalog: names, dtypes and shapes an engine emits per architecture"},
    {"tokenize", td_cmd_tokenize, "text -> token ids and pieces with the model's own tokenizer"},
    {"determinism", td_cmd_determinism, "run one arm N times on the same tokens; nondeterministic if any tap differs"},
    {"backends", td_cmd_backends, "the arms this build knows and whether each can run here (GPU, driver)"},
    {"stateops", td_cmd_stateops, "rollback / sequence copy of one arm against the oracle's straight-line forward"},
};

static void usage(FILE *f) {
    fprintf(f,
            "usage: tapdiff <command> [options]   (tapdiff <command> --help for details)\n"
            "\n"
            "Numerical-conformance and differential testing of LLM forwards.\n"
            "\n"
            "commands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-11s %s\n", commands[i].name, commands[i].summary);
    fprintf(f,
            "\n"
            "exit codes: 0 ok/conformant, 1 divergent, 2 usage, 3 bad input file, 5 nondeterministic,\n"
            "            77 skipped (backend not built / no device), 99 internal error\n");
}

static char *join_argv(int argc, char **argv) {
    size_t n = 1;
    for (int i = 0; i < argc; i++) n += strlen(argv[i]) + 1;
    char *s = td_xmalloc(n);
    s[0] = '\0';
    for (int i = 0; i < argc; i++) {
        if (i) strcat(s, " ");
        strcat(s, argv[i]);
    }
    return s;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return TD_EUSAGE;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        usage(stdout);
        return TD_OK;
    }
    if (!strcmp(cmd, "--version")) {
        printf("tapdiff %s (%s)\n", TD_VERSION, TD_GIT_REV);
        return TD_OK;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        if (!strcmp(cmd, commands[i].name)) {
            char *line = join_argv(argc, argv);
            td_cli_command_line = line;
            int rc = commands[i].fn(argc - 1, argv + 1);
            free(line);
            return rc;
        }
    }
    fprintf(stderr, "tapdiff: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return TD_EUSAGE;
}
