/* tapdiff taps: prints the tap catalog (taps/catalog.h), the names, dtypes
 * and shapes an engine must emit for an architecture, so an engine author can
 * map their graph nodes. --markdown prints the README's table. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>

#include "args.h"
#include "catalog.h"
#include "cli.h"

static const char *usage_text =
    "usage: tapdiff taps [--arch A] [--json | --markdown]\n"
    "\n"
    "Prints the tap catalog: every canonical tap name (blk.L.* once per layer), its dtype\n"
    "class (float = the arm's native float precision), its shape in the spec's letters, the\n"
    "architectures that emit it, the taps it is computed from and its meaning.\n"
    "\n"
    "  --arch A      only the taps architecture A emits (llama, qwen3, qwen3moe)\n"
    "  --json        a JSON array of {name, dtype, shape, archs, from, meaning}\n"
    "  --markdown    the README's Markdown table (the whole catalog)\n"
    "\n"
    "Letters: T tokens in the step, E embedding, H query heads, Hkv KV heads, D head dim,\n"
    "F FFN width (per expert for MoE), X experts, K experts used, V vocabulary, W history\n"
    "window (16), n_kv cached positions.\n"
    "\n"
    "exit: 0 ok, 2 usage (or an architecture no tap lists)\n";

// Prints s left-aligned in `width` columns: printf's %-*s counts bytes, and
// the shape letters hold a two-byte middle dot.
static void cell(const char *s, int width) {
    int cols = 0;
    for (const char *p = s; *p; p++) cols += ((unsigned char)*p & 0xC0) != 0x80;
    fputs(s, stdout);
    for (; cols < width; cols++) putchar(' ');
    putchar(' ');
}

int td_cmd_taps(int argc, char **argv) {
    const char *arch = NULL;
    int json = 0, markdown = 0;
    td_args p;
    td_args_init(&p, "taps", usage_text, argc, argv);
    for (int k; (k = td_args_next(&p)) != TD_ARG_END;) {
        if (k == TD_ARG_HELP) {
            fputs(usage_text, stdout);
            return TD_OK;
        }
        if (k == TD_ARG_ERROR) return TD_EUSAGE;
        if (k == TD_ARG_POS) return td_cli_failf("taps", TD_EUSAGE, "unexpected argument '%s'", p.arg);
        if (td_args_is(&p, "--json")) json = 1;
        else if (td_args_is(&p, "--markdown")) markdown = 1;
        else if (td_args_is(&p, "--arch")) {
            if (!(arch = td_args_value(&p))) return TD_EUSAGE;
        } else {
            return td_args_unknown(&p);
        }
    }
    if (json && markdown) return td_cli_failf("taps", TD_EUSAGE, "give one of --json and --markdown");
    if (markdown && arch) return td_cli_failf("taps", TD_EUSAGE, "--markdown prints the whole catalog (no --arch)");
    size_t n;
    const td_tap_entry *cat = td_tap_catalog(&n);
    if (arch) {
        size_t hits = 0;
        for (size_t i = 0; i < n; i++) hits += td_tap_catalog_has_arch(&cat[i], arch);
        if (!hits)
            return td_cli_failf("taps", TD_EUSAGE, "no tap lists architecture '%s' (known: llama, qwen3, qwen3moe)",
                                arch);
    }
    if (markdown) {
        char *md = td_tap_catalog_markdown();
        fputs(md, stdout);
        free(md);
        return TD_OK;
    }
    cJSON *arr = json ? cJSON_CreateArray() : NULL;
    if (!json)
        printf("%-18s %-6s %-12s %-22s %-34s %s\n", "tap", "dtype", "shape", "architectures", "from", "meaning");
    for (size_t i = 0; i < n; i++) {
        const td_tap_entry *e = &cat[i];
        if (arch && !td_tap_catalog_has_arch(e, arch)) continue;
        const char *archs = *e->archs ? e->archs : "(optional)";
        if (json) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "name", e->name);
            cJSON_AddStringToObject(o, "dtype", td_tap_class_name(e->cls));
            cJSON_AddStringToObject(o, "shape", e->shape);
            cJSON_AddStringToObject(o, "archs", e->archs);
            cJSON_AddStringToObject(o, "from", e->producers);
            cJSON_AddStringToObject(o, "meaning", e->meaning);
            cJSON_AddItemToArray(arr, o);
        } else {
            char shape[48];
            snprintf(shape, sizeof shape, "[%s]", e->shape);
            cell(e->name, 18);
            cell(td_tap_class_name(e->cls), 6);
            cell(shape, 12);
            cell(archs, 22);
            cell(e->producers, 34);
            printf("%s\n", e->meaning);
        }
    }
    if (json) {
        char *s = cJSON_Print(arr);
        puts(s);
        free(s);
        cJSON_Delete(arr);
    }
    return TD_OK;
}
