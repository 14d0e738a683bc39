/* tapdiff fixture: writes the deterministic fixture models (fixtures.h) into a
 * directory and prints "sha256  size  path" for each, so a manifest or a
 * golden file can pin exactly which bytes it was made from. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "args.h"
#include "cli.h"
#include "fixtures.h"

#define CMD "fixture"

static void usage(FILE *f) {
    fprintf(f,
            "usage: tapdiff fixture --out DIR [--only NAME[,NAME...]] [--list] [--help]\n"
            "\n"
            "Writes the fixture models DIR/NAME.gguf (creating DIR), each deterministic: the same\n"
            "bytes on every machine. Prints one line \"sha256  size  path\" per file, then\n"
            "\"wrote N fixtures to DIR\".\n"
            "\n"
            "  --out DIR     output directory (created with its parents)\n"
            "  --only LIST   only these fixtures (comma-separated names)\n"
            "  --list        print the fixture names, architectures and descriptions, write nothing\n"
            "  --help        this text\n"
            "\n"
            "exit: 0 ok, 2 usage (unknown option or fixture name), 99 write failure\n");
}

static void list_names(FILE *f) {
    for (size_t i = 0; i < td_fixture_count(); i++) {
        const td_fixture_info *fi = td_fixture_at(i);
        fprintf(f, "  %-16s %-9s %s\n", fi->name, fi->arch, fi->desc);
    }
}

int td_cmd_fixture(int argc, char **argv) {
    const char *out = NULL, *only = NULL;
    int list = 0;
    td_args p;
    td_args_init(&p, CMD, NULL, argc, argv);
    p.usage_fn = usage;
    for (int k; (k = td_args_next(&p)) != TD_ARG_END;) {
        if (k == TD_ARG_HELP) {
            usage(stdout);
            return TD_OK;
        }
        if (k == TD_ARG_ERROR) return TD_EUSAGE;
        if (k == TD_ARG_POS) {
            td_cli_failf(CMD, TD_EUSAGE, "unknown argument '%s'", p.arg);
            usage(stderr);
            return TD_EUSAGE;
        } else if (td_args_is(&p, "--list")) {
            list = 1;
        } else if (td_args_is(&p, "--out")) {
            if (!(out = td_args_value(&p))) return TD_EUSAGE;
        } else if (td_args_is(&p, "--only")) {
            if (!(only = td_args_value(&p))) return TD_EUSAGE;
        } else {
            return td_args_unknown(&p);
        }
    }
    if (list) {
        list_names(stdout);
        return TD_OK;
    }
    if (!out || !out[0]) {
        td_cli_failf(CMD, TD_EUSAGE, "--out DIR is required");
        usage(stderr);
        return TD_EUSAGE;
    }

    /* the selection, validated in full before anything is written */
    const size_t n_all = td_fixture_count();
    const char **sel = td_xcalloc(n_all, sizeof *sel);
    size_t n_sel = 0;
    int rc = TD_OK;
    if (only) {
        char *copy = td_xstrdup(only);
        for (char *save = NULL, *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            const td_fixture_info *fi = td_fixture_find(tok);
            if (!fi) {
                td_cli_failf(CMD, TD_EUSAGE, "unknown fixture '%s'; the fixtures are:", tok);
                list_names(stderr);
                rc = TD_EUSAGE;
                break;
            }
            int dup = 0;
            for (size_t k = 0; k < n_sel; k++) dup |= sel[k] == fi->name;
            if (!dup) sel[n_sel++] = fi->name;
        }
        free(copy);
        if (rc == TD_OK && n_sel == 0) {
            td_cli_failf(CMD, TD_EUSAGE, "--only names no fixture");
            rc = TD_EUSAGE;
        }
    } else {
        for (size_t i = 0; i < n_all; i++) sel[n_sel++] = td_fixture_at(i)->name;
    }

    for (size_t i = 0; rc == TD_OK && i < n_sel; i++) {
        char path[4096], hex[65];
        td_err err = {{0}};
        int st = td_fixture_write(sel[i], out, path, sizeof path, &err);
        if (st == TD_OK) st = td_sha256_file(path, hex, &err);
        struct stat sb;
        if (st == TD_OK && stat(path, &sb) != 0) st = td_err_set(&err, TD_EINTERNAL, "%s: cannot stat", path);
        if (st != TD_OK) {
            rc = td_cli_fail(CMD, st == TD_EINPUT ? TD_EUSAGE : st, &err);
            break;
        }
        printf("%s  %lld  %s\n", hex, (long long)sb.st_size, path);
    }
    if (rc == TD_OK) printf("wrote %zu fixtures to %s\n", n_sel, out);
    free(sel);
    return rc;
}
