/* tapdiff determinism: runs one arm N times on the same tokens (threads
 * cycled over a list, by default including more threads than cores) and
 * compares the runs' tap files bit for bit; a difference is the verdict
 * "nondeterministic" (exit 5), apart from "divergent". */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "args.h"
#include "cli.h"
#include "determinism.h"

static const char *const det_help =
    "usage: tapdiff determinism --model M.gguf --backend B (--tokens 1,2,3 | --tokens-file F)\n"
    "                           [--steps N] [--runs R] [--threads LIST] [--profile P] [--inject FAULT]\n"
    "                           [--out-dir D] [--keep] [--json] [--quiet]\n"
    "\n"
    "Runs the arm R times on the same tokens (run 0 greedy, the others pinned to its tokens) and\n"
    "compares every tap of every step bit for bit with run 0. An arm whose output is not a function\n"
    "of its inputs (a race in a thread pool, an uninitialised read, a timing-dependent reduction\n"
    "order) is reported as nondeterministic, with the first tap and step where two runs differ.\n"
    "\n"
    "  --runs R           runs (default 10, at least 2)\n"
    "  --threads LIST     thread counts, cycled over the runs (default \"2,2C+1\" with C the cores:\n"
    "                     oversubscription exposes races that a quiet machine hides). An arm whose\n"
    "                     result depends on the thread count also differs: the verdict names both\n"
    "                     counts; repeat with one count to tell the two apart.\n"
    "  --steps N          decode steps after the prefill (default 8)\n"
    "  --out-dir D        where the runs' tap files go (default tapdiff-determinism); run 0 and the\n"
    "                     first differing run are kept, the rest removed unless --keep\n"
    "  --json             print the verdict as JSON\n"
    "\n"
    "exit: 0 deterministic, 5 nondeterministic, 2 usage, 3 bad input, 77 backend not available here\n";

static void on_run(void *user, int done, int total) {
    (void)total;
    td_progress_update((td_progress *)user, done);
}

int td_cmd_determinism(int argc, char **argv) {
    const char *model = NULL, *backend = NULL, *tokens = NULL, *tokens_file = NULL, *threads_s = NULL;
    const char *out_dir = "tapdiff-determinism";
    td_det_config cfg;
    memset(&cfg, 0, sizeof cfg);
    td_run_config_init(&cfg.run);
    cfg.run.n_steps = 8;
    cfg.n_runs = 10;
    int json = 0, quiet = 0;
    long long ll;
    td_args p;
    td_args_init(&p, "determinism", det_help, argc, argv);
    for (int k; (k = td_args_next(&p)) != TD_ARG_END;) {
        if (k == TD_ARG_HELP) {
            fputs(det_help, stdout);
            return TD_OK;
        }
        if (k == TD_ARG_ERROR) return TD_EUSAGE;
        if (k == TD_ARG_POS)
            return td_cli_failf("determinism", TD_EUSAGE, "unexpected argument '%s' (see --help)", p.arg);
        const char **str = NULL;
        if (td_args_is(&p, "--json")) json = 1;
        else if (td_args_is(&p, "--quiet")) quiet = 1;
        else if (td_args_is(&p, "--keep")) cfg.keep_all = 1;
        else if (td_args_is(&p, "--model")) str = &model;
        else if (td_args_is(&p, "--backend")) str = &backend;
        else if (td_args_is(&p, "--tokens")) str = &tokens;
        else if (td_args_is(&p, "--tokens-file")) str = &tokens_file;
        else if (td_args_is(&p, "--threads")) str = &threads_s;
        else if (td_args_is(&p, "--out-dir")) str = &out_dir;
        else if (td_args_is(&p, "--profile")) str = &cfg.run.profile;
        else if (td_args_is(&p, "--inject")) str = &cfg.run.inject;
        else if (td_args_is(&p, "--steps")) {
            if (td_args_long(&p, 0, 1000000, &ll)) return TD_EUSAGE;
            cfg.run.n_steps = ll;
        } else if (td_args_is(&p, "--runs")) {
            if (td_args_int(&p, 2, 100000, &cfg.n_runs)) return TD_EUSAGE;
        } else
            return td_args_unknown(&p);
        if (str && !(*str = td_args_value(&p))) return TD_EUSAGE;
    }
    if (!model || !backend)
        return td_cli_failf("determinism", TD_EUSAGE, "--model and --backend are required (see --help)");
    if (!!tokens == !!tokens_file)
        return td_cli_failf("determinism", TD_EUSAGE, "give exactly one of --tokens and --tokens-file");
    if (!td_backend_find(backend)) {
        const char *absent = td_backend_absent_reason(backend);
        if (absent) return td_cli_failf("determinism", TD_SKIP, "%s", absent);
        char names[256];
        td_backend_names(names, sizeof names);
        return td_cli_failf("determinism", TD_EUSAGE, "unknown backend '%s' (known: %s)", backend, names);
    }

    int threads[64], n_threads = 0;
    if (threads_s) {
        int32_t *ids = NULL;
        int64_t n = 0;
        td_err e;
        if (td_parse_token_list(threads_s, "--threads", &ids, &n, &e) || n > 64)
            return td_cli_failf("determinism", TD_EUSAGE, "--threads wants up to 64 counts like 2,5, got '%s'",
                                threads_s);
        for (int64_t i = 0; i < n; i++) {
            if (ids[i] < 1 || ids[i] > 4096) {
                free(ids);
                return td_cli_failf("determinism", TD_EUSAGE, "--threads: each count must be 1..4096");
            }
            threads[n_threads++] = ids[i];
        }
        free(ids);
    } else {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        threads[n_threads++] = 2;
        threads[n_threads++] = (int)(2 * (cores > 0 ? cores : 1) + 1);
    }
    cfg.threads = threads;
    cfg.n_threads = n_threads;
    cfg.dir = out_dir;

    td_err err = {{0}};
    int32_t *prompt = NULL;
    int64_t n_prompt = 0;
    int rc = tokens ? td_parse_token_list(tokens, "--tokens", &prompt, &n_prompt, &err)
                    : td_read_token_text(tokens_file, &prompt, &n_prompt, &err);
    if (rc) return td_cli_fail("determinism", tokens ? TD_EUSAGE : rc, &err);
    cfg.run.model_path = model;
    cfg.run.backend = backend;
    cfg.run.prompt = prompt;
    cfg.run.n_prompt = n_prompt;
    cfg.run.command_line = td_cli_command_line;
    td_progress *prog = quiet ? NULL : td_progress_begin("determinism", cfg.n_runs);
    if (prog) {
        cfg.on_run = on_run;
        cfg.user = prog;
    }
    td_det_result r;
    rc = td_determinism(&cfg, &r, &err);
    td_progress_end(prog);
    free(prompt);
    if (rc) return td_cli_fail("determinism", rc, &err);

    const int nd = r.verdict == TD_NONDETERMINISTIC;
    if (json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "format", "tapdiff-determinism");
        cJSON_AddNumberToObject(j, "format_version", 1);
        cJSON_AddStringToObject(j, "verdict", nd ? "nondeterministic" : "deterministic");
        cJSON_AddNumberToObject(j, "exit_code", r.verdict);
        cJSON_AddStringToObject(j, "backend", backend);
        cJSON_AddNumberToObject(j, "runs", r.n_runs);
        cJSON_AddNumberToObject(j, "taps_compared", (double)r.n_taps_compared);
        cJSON *th = cJSON_AddArrayToObject(j, "threads");
        for (int i = 0; i < n_threads; i++) cJSON_AddItemToArray(th, cJSON_CreateNumber(threads[i]));
        if (nd) {
            cJSON *d = cJSON_AddObjectToObject(j, "first_difference");
            cJSON_AddNumberToObject(d, "run", r.run);
            cJSON_AddNumberToObject(d, "threads_run0", r.threads_0);
            cJSON_AddNumberToObject(d, "threads_run", r.threads_run);
            cJSON_AddNumberToObject(d, "step", (double)r.step);
            cJSON_AddStringToObject(d, "tap", r.tap);
            cJSON_AddNumberToObject(d, "index", (double)r.index);
            if (isfinite(r.value_0)) cJSON_AddNumberToObject(d, "value_run0", r.value_0);
            if (isfinite(r.value_run)) cJSON_AddNumberToObject(d, "value_run", r.value_run);
            cJSON_AddStringToObject(d, "what", r.what);
            cJSON_AddStringToObject(d, "file_run0", r.path_0);
            cJSON_AddStringToObject(d, "file_run", r.path_run);
        }
        char *s = cJSON_Print(j);
        puts(s);
        free(s);
        cJSON_Delete(j);
    } else if (!nd) {
        printf("deterministic: %d runs of %s (threads", r.n_runs, backend);
        for (int i = 0; i < n_threads; i++) printf("%s%d", i ? "," : " ", threads[i]);
        printf("), %lld taps compared bit for bit, all identical\n", (long long)r.n_taps_compared);
    } else {
        printf("nondeterministic: run %d (%d threads) differs from run 0 (%d threads) at step %lld, %s", r.run,
               r.threads_run, r.threads_0, (long long)r.step, r.tap[0] ? r.tap : "(step)");
        if (r.index >= 0) printf("[%lld]: %.17g vs %.17g", (long long)r.index, r.value_0, r.value_run);
        printf(" (%s)\n", r.what);
        if (r.threads_run != r.threads_0)
            printf("  the two runs used different thread counts: repeat with --threads %d to tell a race from a "
                   "thread-count-dependent order\n",
                   r.threads_0);
        printf("  files: %s %s\n", r.path_0, r.path_run);
    }
    return r.verdict;
}
