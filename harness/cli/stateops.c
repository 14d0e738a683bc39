/* tapdiff stateops: one arm through a script of state operations (rollback,
 * sequence copy), each forward judged against the oracle's straight-line
 * forward of the same tokens (harness/stateops.h); the exit status is the
 * verdict. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "args.h"
#include "cli.h"
#include "compare.h"
#include "runner.h"
#include "stateops.h"

static const char *const sop_help =
    "usage: tapdiff stateops --model M.gguf --arm ARM (--tokens LIST | --tokens-file F |\n"
    "                        --prompt TEXT | --prompt-file F)\n"
    "                        [--script TEXT | --script-file F] [--oracle ARM] [--control-arm ARM|none]\n"
    "                        [--k N] [--threads N] [--inject FAULT] [--taps all|none] [--quiet]\n"
    "\n"
    "Drives ARM through a script of state operations and compares the logits of every forward\n"
    "it makes with the oracle's straight-line forward (reset, then one prefill) of the tokens\n"
    "that sequence holds at that point: the oracle needs no state operations. Decode tokens are\n"
    "the arm's own greedy choices. The oracle and the control compute with the arm's declared\n"
    "arithmetic profile (as bisect's three-arm mode); each logits row is judged as tapdiff\n"
    "compare judges out.logits: r = err / max(k * control error, floor), top-1 margin, KL.\n"
    "With taps (the default) every tap the arm emits in a step is compared with the same\n"
    "positions' rows of the oracle's straight-line forward (integer taps exactly, hist.tokens\n"
    "not at all), and the first failing tap in the arm's order names the step.\n"
    "\n"
    "Script: operations separated by ';' or newlines ('#' comments):\n"
    "  prefill [N] [on S]    the first N prompt tokens (default: all) as one step\n"
    "  feed T,T,... [on S]   these token ids as one step\n"
    "  decode N [on S]       N greedy one-token steps\n"
    "  rollback N [on S]     drop the sequence's last N positions (the arm's seq_rm)\n"
    "  copy A B | copy A->B  sequence B becomes a copy of A (the arm's seq_cp)\n"
    "  use S                 forwards append to sequence S from now on\n"
    "  `on S` of a forward switches to S first; of a rollback it only names S. Sequences\n"
    "  are 0..3, all empty at the start, 0 current. Default script:\n"
    "  \"" TD_SOP_DEFAULT_SCRIPT "\"\n"
    "\n"
    "  --arm ARM            the backend under test (cpu, llamacpp, ...)\n"
    "  --oracle ARM         the straight-line oracle (default ref)\n"
    "  --control-arm ARM    the control for the budget (default ref32); none: the floor only\n"
    "  --inject FAULT       run the arm with a named fault (tapdiff bisect --list-faults)\n"
    "  --k N                budget multiple of the control error (default 4)\n"
    "  --taps all|none      compare every tap (default; one tap file per step in a temporary\n"
    "                       folder of $TMPDIR, removed at the end) or the logits only\n"
    "  --quiet              only the verdict, not one line per step\n"
    "\n"
    "exit: 0 conformant, 1 divergent (the first operation, step and position that diverged),\n"
    "      2 usage (or an unknown arm, a fault it does not implement), 3 bad model, tokens or\n"
    "      script, 77 the arm is not built here or has no state operations, 99 internal error\n";

static const char *fail_name(int f) {
    return f == 0 ? "ok" : td_cmp_fail_name((td_cmp_fail)f);
}

static void on_step(void *user, const td_sop_step *st) {
    (void)user;
    printf("  step %3lld  op %2d %-22s seq %d pos %3lld+%-3lld %-18s err %.3e ctrl %.3e budget %.3e r %9.3g  %s\n",
           (long long)st->step, st->op + 1, st->op_text, st->seq, (long long)st->pos0, (long long)st->n_tokens,
           st->tap, st->err, st->err_ctrl, st->budget, st->ratio, fail_name(st->fail));
}

static int read_text(const char *path, char **out, td_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return td_err_set(err, TD_EINPUT, "%s: %s", path, strerror(errno));
    size_t cap = 4096, len = 0, n;
    char *s = td_xmalloc(cap);
    while ((n = fread(s + len, 1, cap - len - 1, f)) > 0)
        if ((len += n) + 1 == cap) s = td_xrealloc(s, cap *= 2);
    int bad = ferror(f);
    fclose(f);
    s[len] = '\0';
    if (bad || strlen(s) != len) {
        free(s);
        return td_err_set(err, TD_EINPUT, "%s: unreadable or not text", path);
    }
    *out = s;
    return TD_OK;
}

int td_cmd_stateops(int argc, char **argv) {
    const char *model = NULL, *arm = NULL, *tokens = NULL, *tokens_file = NULL, *prompt = NULL, *prompt_file = NULL;
    const char *script = NULL, *script_file = NULL, *oracle = NULL, *control = NULL, *inject = NULL;
    long long threads = 0;
    double k = 0;
    int quiet = 0, taps = 1;
    td_args p;
    td_args_init(&p, "stateops", sop_help, argc, argv);
    for (int kind; (kind = td_args_next(&p)) != TD_ARG_END;) {
        if (kind == TD_ARG_ERROR) return TD_EUSAGE;
        if (kind == TD_ARG_HELP) {
            fputs(sop_help, stdout);
            return TD_OK;
        }
        if (kind == TD_ARG_POS)
            return td_cli_failf("stateops", TD_EUSAGE, "unexpected argument '%s' (see tapdiff stateops --help)",
                                p.arg);
        const char *a = p.arg;
        if (!strcmp(a, "--quiet")) {
            quiet = 1;
            continue;
        }
        const char *v = td_args_value(&p);
        if (!v) return TD_EUSAGE;
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--arm")) arm = v;
        else if (!strcmp(a, "--tokens")) tokens = v;
        else if (!strcmp(a, "--tokens-file")) tokens_file = v;
        else if (!strcmp(a, "--prompt")) prompt = v;
        else if (!strcmp(a, "--prompt-file")) prompt_file = v;
        else if (!strcmp(a, "--script")) script = v;
        else if (!strcmp(a, "--script-file")) script_file = v;
        else if (!strcmp(a, "--oracle")) oracle = v;
        else if (!strcmp(a, "--control-arm")) control = v;
        else if (!strcmp(a, "--inject")) inject = v;
        else if (!strcmp(a, "--taps")) {
            if (strcmp(v, "all") && strcmp(v, "none"))
                return td_cli_failf("stateops", TD_EUSAGE, "--taps: expected all or none, got '%s'", v);
            taps = !strcmp(v, "all");
        }
        else if (!strcmp(a, "--threads")) {
            char *end;
            threads = strtoll(v, &end, 10);
            if (!*v || *end || threads < 0 || threads > 4096)
                return td_cli_failf("stateops", TD_EUSAGE, "--threads: expected 0..4096, got '%s'", v);
        } else if (!strcmp(a, "--k")) {
            char *end;
            k = strtod(v, &end);
            if (end == v || *end || !isfinite(k) || !(k >= 1))
                return td_cli_failf("stateops", TD_EUSAGE, "--k: expected a finite number >= 1, got '%s'", v);
        } else {
            return td_args_unknown(&p);
        }
    }
    if (!model || !arm)
        return td_cli_failf("stateops", TD_EUSAGE, "--model and --arm are required (see tapdiff stateops --help)");
    if (!!tokens + !!tokens_file + !!prompt + !!prompt_file != 1)
        return td_cli_failf("stateops", TD_EUSAGE,
                            "give exactly one of --tokens, --tokens-file, --prompt and --prompt-file");
    if (script && script_file)
        return td_cli_failf("stateops", TD_EUSAGE, "give at most one of --script and --script-file");

    td_err err = {{0}};
    int rc = TD_OK;
    int32_t *ids = NULL;
    int64_t n_ids = 0;
    char *text = NULL, *script_text = NULL;
    size_t text_len = 0;
    td_model *m = NULL;
    td_sop_script sc = {0};
    char tapdir[512] = "";
    if (tokens && td_parse_token_list(tokens, "--tokens", &ids, &n_ids, &err)) {
        rc = TD_EUSAGE;
        goto out;
    }
    if (tokens_file && (rc = td_read_token_text(tokens_file, &ids, &n_ids, &err))) goto out;
    if ((rc = td_cli_prompt(model, prompt, prompt_file, &text, &text_len, &ids, &n_ids, &err))) goto out;
    if (script_file && (rc = read_text(script_file, &script_text, &err))) goto out;
    if ((rc = td_sop_parse(script_file ? script_text : script ? script : TD_SOP_DEFAULT_SCRIPT, &sc, &err))) goto out;
    if ((rc = td_model_open(&m, model, &err))) goto out;
    if (taps) {
        const char *tmp = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
        snprintf(tapdir, sizeof tapdir, "%s/tapdiff-stateops-XXXXXX", tmp);
        if (!mkdtemp(tapdir)) {
            rc = td_err_set(&err, TD_EOUTPUT, "cannot create a folder %s: %s", tapdir, strerror(errno));
            tapdir[0] = '\0';
            goto out;
        }
    }

    td_sop_config cfg = {.model = m,
                         .arm = arm,
                         .oracle = oracle,
                         .control = control,
                         .inject = inject,
                         .threads = (int)threads,
                         .k = k,
                         .prompt = ids,
                         .n_prompt = n_ids,
                         .script = &sc,
                         .tap_dir = taps ? tapdir : NULL,
                         .on_step = quiet ? NULL : on_step};
    td_sop_result r;
    if (!quiet)
        printf("stateops: %s against %s's straight-line forward (control %s), %d operations\n", arm,
               oracle ? oracle : "ref", control ? control : "ref32", sc.n);
    if ((rc = td_sop_run(&cfg, &r, &err))) goto out;
    printf("arm: %s (profile %s)\n", r.version, r.profile);
    if (r.verdict == TD_OK) {
        printf("verdict: conformant: %lld steps, %lld taps compared; worst r %.3g at step %lld (op %d '%s', %s)\n",
               (long long)r.n_steps, (long long)r.n_taps, r.worst.ratio, (long long)r.worst.step, r.worst.op + 1,
               r.worst.op_text ? r.worst.op_text : "-", r.worst.tap);
        rc = TD_OK;
    } else {
        const td_sop_step *f = &r.first;
        printf("verdict: DIVERGENT at operation %d '%s': step %lld, sequence %d, position %lld: %s %s "
               "(err %.3e, control %.3e, budget %.3e, r %.3g)\n",
               f->op + 1, f->op_text, (long long)f->step, f->seq, (long long)f->row_pos, f->tap, fail_name(f->fail), f->err,
               f->err_ctrl, f->budget, f->ratio);
        rc = TD_DIVERGENT;
    }
out:
    td_sop_script_free(&sc);
    if (tapdir[0]) rmdir(tapdir);
    if (m) td_model_close(m);
    free(ids);
    free(text);
    free(script_text);
    if (rc != TD_OK && rc != TD_DIVERGENT) return td_cli_fail("stateops", rc, &err);
    fflush(stdout);
    return rc;
}
