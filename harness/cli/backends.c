/* tapdiff backends: the arms this build knows, and whether each can run
 * here (a GPU arm needs its library, a driver and a device). */
#include <stdio.h>
#include <string.h>

#include "args.h"
#include "backend.h"
#include "cli.h"

static const char *const backends_help =
    "usage: tapdiff backends [--json]\n"
    "\n"
    "Lists every backend (arm) of this build with the arithmetic profile it declares and\n"
    "whether it can run on this machine: what it would run on, or why not (a GPU arm needs\n"
    "its library from ci/fetch-llamacpp.sh, a driver and a device; lavapipe, Mesa's Vulkan\n"
    "on the CPU, counts as a device). Backends the design names but this build lacks are\n"
    "listed as not built.\n"
    "\n"
    "exit: 0, 2 usage\n";

int td_cmd_backends(int argc, char **argv) {
    int json = 0;
    td_args p;
    td_args_init(&p, "backends", backends_help, argc, argv);
    for (int k; (k = td_args_next(&p)) != TD_ARG_END;) {
        if (k == TD_ARG_ERROR) return TD_EUSAGE;
        if (k == TD_ARG_HELP) {
            fputs(backends_help, stdout);
            return TD_OK;
        }
        if (k == TD_ARG_POS)
            return td_cli_failf("backends", TD_EUSAGE, "unexpected argument '%s' (see tapdiff backends --help)", p.arg);
        if (td_args_is(&p, "--json"))
            json = 1;
        else
            return td_args_unknown(&p);
    }
    const td_backend_vt *const *list = td_backend_list();
    if (json) printf("[");
    int first = 1;
    for (size_t i = 0; list[i]; i++) {
        char why[1024] = "";
        const int rc = list[i]->probe ? list[i]->probe(why, sizeof why) : TD_OK;
        const char *prof = list[i]->profile ? list[i]->profile : "native";
        if (json) {
            printf("%s{\"name\":\"%s\",\"available\":%s,\"profile\":\"%s\",\"detail\":\"", first ? "" : ",",
                   list[i]->name, rc == TD_OK ? "true" : "false", prof);
            for (const char *c = why; *c; c++) {
                if (*c == '"' || *c == '\\') putchar('\\');
                if ((unsigned char)*c >= 0x20) putchar(*c);
            }
            printf("\"}");
            first = 0;
        } else {
            printf("%-16s %-12s profile %-20s %s\n", list[i]->name, rc == TD_OK ? "available" : "unavailable",
                   prof, why[0] ? why : "-");
        }
    }
    static const char *const known[] = {"cpu", "llamacpp", "llamacpp:vulkan", "llamacpp:cuda", "cuda", "metal"};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        const char *why = td_backend_absent_reason(known[i]);
        if (!why) continue;
        if (json) {
            printf("%s{\"name\":\"%s\",\"available\":false,\"built\":false,\"detail\":\"", first ? "" : ",", known[i]);
            for (const char *c = why; *c; c++) {
                if (*c == '"' || *c == '\\') putchar('\\');
                putchar(*c);
            }
            printf("\"}");
            first = 0;
        } else {
            printf("%-16s %-12s %s\n", known[i], "not built", why);
        }
    }
    if (json) printf("]\n");
    return TD_OK;
}
