/* tapdiff run: one backend over a prompt (prefill) and N decode steps,
 * greedy or pinned, optionally writing a tap file. The work is the runner's
 * (runner.h); this file is the command line and the printing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "cli.h"
#include "gguf.h"
#include "runner.h"
#include "selfcheck.h"
#include "tokenizer.h"

static const char *const run_help =
    "usage: tapdiff run --model M.gguf --backend B (--tokens 1,2,3 | --tokens-file F |\n"
    "                   --prompt TEXT | --prompt-file F) [options]\n"
    "\n"
    "Runs backend B on model M: a prefill of the prompt tokens in one forward, then N\n"
    "decode steps of one token each. Prints the sampled ids (the argmax of each\n"
    "forward's last position, lowest id on ties) and their text, then a one-line summary.\n"
    "\n"
    "  --model M            GGUF model file\n"
    "  --backend B          ref (f64 reference) | ref32 (the same code in f32)\n"
    "  --tokens LIST        prompt token ids, separated by commas or blanks\n"
    "  --tokens-file F      the same from a text file\n"
    "  --prompt TEXT        the prompt as text, tokenized with the model's tokenizer (BOS/EOS\n"
    "                       per the GGUF's flags, control tokens in the text parsed); the\n"
    "                       output is then the prompt and the generated text, and the tap\n"
    "                       file records the text (root attribute `prompt`)\n"
    "  --prompt-file F      the same from a file, byte for byte\n"
    "  --ids                with a text prompt, also print the prompt and sampled ids\n"    "  --steps N            decode steps after the prefill (default 16; with a pinned\n"
    "                       list and no --steps: as many as the list holds)\n"
    "  --decode MODE        greedy (default): feed back the argmax;\n"
    "                       pinned:FILE: feed the ids of FILE, a text list or a tap file\n"
    "                       (its decode steps' inp.tokens; its prefill tokens are the\n"
    "                       prompt when --tokens is absent)\n"
    "  --taps T             full | fingerprint | none | PATTERN (full data only for the\n"
    "                       taps matching the comma-separated globs, e.g. 'out.*,blk.0.*');\n"
    "                       default full with --out, none without\n"
    "  --out F.h5           tap file to write\n"
    "  --threads N          backend threads (default: the backend's choice)\n"
    "  --inject FAULT       run with a named deliberate bug (a backend that implements it;\n"
    "                       tapdiff bisect --list-faults lists them; exit 2 otherwise)\n"
    "  --profile P          arithmetic profile: native (default: the backend's own) or\n"
    "                       act-q8 (ref32, cpu: activations rounded before each matmul as\n"
    "                       llama.cpp's CPU path does); recorded as the tap file's `profile`\n"
    "  --ctx N              KV cache capacity in positions (default: prompt + steps)\n"
    "  --check              after the run, self-check the token history: in greedy mode\n"
    "                       each decode step must consume the previous step's argmax of\n"
    "                       out.logits, and hist.tokens must be the last W consumed ids\n"
    "                       (on the tap file when --out is given, else on the run in memory);\n"
    "                       exit 1 at the first failing step\n"
    "  --quiet              only the summary line, no progress bar\n"
    "  --help               this text\n"
    "\n"
    "exit: 0 ok, 1 --check failed, 2 usage (or --inject a fault the backend does not implement),\n"
    "      3 bad model / tokens / token file, 77 backend not built here, 99 internal error\n";

typedef struct run_args {
    const char *model, *backend, *tokens, *tokens_file, *decode, *taps, *out, *profile, *inject;
    const char *prompt, *prompt_file;
    long long steps, threads, ctx;
    int steps_given, quiet, check, ids;
} run_args;

static int parse_ll(const char *s, long long lo, long long hi, long long *v) {
    char *end;
    long long x = strtoll(s, &end, 10);
    if (!*s || *end || x < lo || x > hi) return -1;
    *v = x;
    return 0;
}

/* Fills a; returns -1 after --help, 0 ok, TD_EUSAGE (message printed). */
static int parse_args(int argc, char **argv, run_args *a) {
    memset(a, 0, sizeof *a);
    a->steps = 16;
    td_args p;
    td_args_init(&p, "run", run_help, argc, argv);
    for (int k; (k = td_args_next(&p)) != TD_ARG_END;) {
        if (k == TD_ARG_ERROR) return TD_EUSAGE;
        const char *arg = p.arg;
        if (k == TD_ARG_POS)
            return td_cli_failf("run", TD_EUSAGE, "unexpected argument '%s' (see tapdiff run --help)", arg);
        if (k == TD_ARG_HELP) {
            fputs(run_help, stdout);
            return -1;
        }
        if (!strcmp(arg, "--quiet")) {
            a->quiet = 1;
            continue;
        }
        if (!strcmp(arg, "--check")) {
            a->check = 1;
            continue;
        }
        if (!strcmp(arg, "--ids")) {
            a->ids = 1;
            continue;
        }
        const char *name = arg;
        const char *val = td_args_value(&p);
        if (!val) return TD_EUSAGE;
        if (!strcmp(name, "--model")) a->model = val;
        else if (!strcmp(name, "--backend")) a->backend = val;
        else if (!strcmp(name, "--tokens")) a->tokens = val;
        else if (!strcmp(name, "--tokens-file")) a->tokens_file = val;
        else if (!strcmp(name, "--prompt")) a->prompt = val;
        else if (!strcmp(name, "--prompt-file")) a->prompt_file = val;
        else if (!strcmp(name, "--decode")) a->decode = val;
        else if (!strcmp(name, "--taps")) a->taps = val;
        else if (!strcmp(name, "--out")) a->out = val;
        else if (!strcmp(name, "--profile")) a->profile = val;
        else if (!strcmp(name, "--inject")) a->inject = val;
        else if (!strcmp(name, "--steps")) {
            if (parse_ll(val, 0, 100000000, &a->steps))
                return td_cli_failf("run", TD_EUSAGE, "--steps: expected a count >= 0, got '%s'", val);
            a->steps_given = 1;
        } else if (!strcmp(name, "--threads")) {
            if (parse_ll(val, 0, 4096, &a->threads))
                return td_cli_failf("run", TD_EUSAGE, "--threads: expected 0..4096, got '%s'", val);
        } else if (!strcmp(name, "--ctx")) {
            if (parse_ll(val, 1, UINT32_MAX, &a->ctx))
                return td_cli_failf("run", TD_EUSAGE, "--ctx: expected a positive count, got '%s'", val);
        } else
            return td_args_unknown(&p);
    }
    if (!a->model) return td_cli_failf("run", TD_EUSAGE, "--model is required (see tapdiff run --help)");
    if (!a->backend) return td_cli_failf("run", TD_EUSAGE, "--backend is required (see tapdiff run --help)");
    if (!!a->tokens + !!a->tokens_file + !!a->prompt + !!a->prompt_file > 1)
        return td_cli_failf("run", TD_EUSAGE, "give one of --tokens, --tokens-file, --prompt and --prompt-file");
    if (a->decode && strcmp(a->decode, "greedy") && strncmp(a->decode, "pinned:", 7))
        return td_cli_failf("run", TD_EUSAGE, "--decode: expected greedy or pinned:FILE, got '%s'", a->decode);
    if (a->decode && !strncmp(a->decode, "pinned:", 7) && !a->decode[7])
        return td_cli_failf("run", TD_EUSAGE, "--decode pinned:FILE needs a file name");
    if (!a->tokens && !a->tokens_file && !a->prompt && !a->prompt_file && !(a->decode && !strncmp(a->decode, "pinned:", 7)))
        return td_cli_failf("run", TD_EUSAGE,
                            "--tokens, --tokens-file, --prompt or --prompt-file is required (see tapdiff run --help)");
    if (a->taps && strcmp(a->taps, "none") && !a->out)
        return td_cli_failf("run", TD_EUSAGE, "--taps %s needs --out FILE.h5", a->taps);
    if (a->out && a->taps && !strcmp(a->taps, "none"))
        return td_cli_failf("run", TD_EUSAGE, "--out given with --taps none");
    if (a->check && a->out && a->taps && !strcmp(a->taps, "fingerprint") &&
        !(a->decode && !strncmp(a->decode, "pinned:", 7)))
        return td_cli_failf("run", TD_EUSAGE,
                            "--check of a greedy run needs out.logits data: use --taps full (or a filter with out.*)");
    return 0;
}

/* --check: the self-check of selfcheck.h on the tap file (or the run in
 * memory without one). Returns 0, TD_DIVERGENT or an input error. */
static int run_check(const td_run_config *cfg, const td_run_result *res) {
    td_selfcheck_report rep;
    td_err err = {{0}};
    if (cfg->tap_path) {
        int rc = td_selfcheck_file(cfg->tap_path, &rep, &err);
        if (rc) return td_cli_fail("run", rc, &err);
    } else {
        td_selfcheck_run_result(res, cfg->decode, &rep);
    }
    if (rep.verdict != TD_OK)
        return td_cli_failf("run", TD_DIVERGENT, "check failed at step %lld: expected %s %lld, found %lld: %s",
                            (long long)rep.fail_step, rep.fail == TD_SCF_HIST && rep.fail_index < 0 ? "length" : "token",
                            (long long)rep.expected, (long long)rep.found, rep.message);
    if (rep.n_feedback + rep.n_hist == 0)
        return td_cli_failf("run", TD_DIVERGENT, "check: %s (a check that checked nothing does not pass)", rep.message);
    printf("check: ok: %s\n", rep.message);
    return TD_OK;
}

static void on_step(void *user, int64_t done, int64_t total) {
    (void)total;
    td_progress_update((td_progress *)user, (long)done);
}

/* Prints the text of ids: the tokenizer's pieces through a streaming UTF-8
 * decoder (a character split across tokens prints whole, never as U+FFFD);
 * without a tokenizer, the vocab's own rendering of each piece. */
static void print_text(const td_model *m, const td_tokenizer *t, const int32_t *ids, int64_t n) {
    char piece[256];
    if (!t) {
        for (int64_t i = 0; i < n; i++) {
            td_vocab_text(m, ids[i], piece, sizeof piece);
            fputs(piece, stdout);
        }
        return;
    }
    td_utf8_stream st = TD_UTF8_STREAM_INIT;
    char out[3 * (sizeof piece + 4)];
    for (int64_t i = 0; i < n; i++) {
        long pl = td_token_piece(t, ids[i], 0, piece, sizeof piece);
        if (pl < 0) continue;
        if (pl > (long)sizeof piece) pl = (long)sizeof piece; /* a piece longer than 256 bytes: its start */
        fwrite(out, 1, td_utf8_stream_feed(&st, piece, (size_t)pl, out), stdout);
    }
    fwrite(out, 1, td_utf8_stream_flush(&st, out), stdout);
}

/* Prints the ids, then the concatenated text of their pieces. */
static void print_tokens(const td_model *m, const td_tokenizer *t, const char *label, const int32_t *ids, int64_t n) {
    printf("%s:", label);
    for (int64_t i = 0; i < n; i++) printf(" %d", ids[i]);
    printf("\n%s text: ", label);
    print_text(m, t, ids, n);
    putchar('\n');
}

int td_cmd_run(int argc, char **argv) {
    run_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc < 0) return TD_OK;
    if (rc) return rc;
    if (!td_backend_find(a.backend)) {
        const char *absent = td_backend_absent_reason(a.backend);
        if (absent) return td_cli_failf("run", TD_SKIP, "%s", absent);
        char names[256];
        td_backend_names(names, sizeof names);
        return td_cli_failf("run", TD_EUSAGE, "unknown backend '%s' (known: %s)", a.backend, names);
    }

    td_err err = {{0}};
    int32_t *prompt = NULL, *pinned = NULL;
    int64_t n_prompt = 0, n_pinned = 0;
    td_model *m = NULL;
    td_run_result res = {0};
    td_progress *prog = NULL;
    td_tokenizer *tok = NULL;
    char *prompt_text = NULL;
    size_t prompt_len = 0;
    int check_rc = TD_OK;

    if (a.tokens && td_parse_token_list(a.tokens, "--tokens", &prompt, &n_prompt, &err)) {
        rc = TD_EUSAGE; // a malformed command line, not a bad file
        goto out;
    }
    if (a.tokens_file && (rc = td_read_token_text(a.tokens_file, &prompt, &n_prompt, &err))) goto out;
    if ((rc = td_cli_prompt(a.model, a.prompt, a.prompt_file, &prompt_text, &prompt_len, &prompt, &n_prompt, &err)))
        goto out;

    td_run_config cfg;
    td_run_config_init(&cfg);
    if (a.decode && !strncmp(a.decode, "pinned:", 7)) {
        const char *file = a.decode + 7;
        if (td_is_hdf5_file(file)) {
            int32_t *fp = NULL;
            int64_t nfp = 0;
            if ((rc = td_read_tapfile_tokens(file, &fp, &nfp, &pinned, &n_pinned, &err))) goto out;
            if (!prompt) prompt = fp, n_prompt = nfp;
            else free(fp);
            if (!prompt) {
                rc = td_err_set(&err, TD_EINPUT, "%s: the tap file has no prefill step to take the prompt from", file);
                goto out;
            }
        } else if ((rc = td_read_token_text(file, &pinned, &n_pinned, &err))) {
            goto out;
        }
        if (!a.steps_given) a.steps = n_pinned;
        if (n_pinned < a.steps) {
            rc = td_err_set(&err, TD_EINPUT, "%s holds %lld decode tokens; --steps asks for %lld", file,
                            (long long)n_pinned, a.steps);
            goto out;
        }
        cfg.decode = TD_DECODE_PINNED;
        cfg.pinned = pinned;
        cfg.n_pinned = n_pinned;
        cfg.decode_label = a.decode;
    }

    if ((rc = td_model_open(&m, a.model, &err))) goto out;
    cfg.model_path = a.model;
    cfg.model = m;
    cfg.backend = a.backend;
    cfg.prompt = prompt;
    cfg.n_prompt = n_prompt;
    cfg.n_steps = a.steps;
    cfg.threads = (int)a.threads;
    cfg.profile = a.profile;
    cfg.inject = a.inject;
    cfg.n_ctx = (uint32_t)a.ctx;
    cfg.command_line = td_cli_command_line;
    cfg.prompt_text = prompt_text;
    cfg.record_ties = 1; // a reference run under a Q8 profile records its near ties (README "Rounding ties")
    td_err terr = {{0}};
    if (m->gguf && td_tokenizer_open(&tok, m->gguf, &terr) != TD_OK) tok = NULL; /* no tokenizer: the vocab renders */
    if (a.out && (!a.taps || strcmp(a.taps, "none"))) {
        cfg.tap_path = a.out;
        cfg.tap_mode = a.taps && !strcmp(a.taps, "fingerprint") ? TD_TAP_FINGERPRINT : TD_TAP_FULL;
        if (a.taps && strcmp(a.taps, "full") && strcmp(a.taps, "fingerprint")) cfg.tap_filter = a.taps;
    }
    if (!a.quiet) {
        prog = td_progress_begin("run", (long)(1 + a.steps));
        cfg.on_step = on_step;
        cfg.user = prog;
    }

    rc = td_run(&cfg, &res, &err);
    td_progress_end(prog);
    if (rc) goto out;

    if (!a.quiet && prompt_text) {
        if (a.ids) {
            printf("prompt:");
            for (int64_t i = 0; i < n_prompt; i++) printf(" %d", prompt[i]);
            putchar('\n');
            if (cfg.decode == TD_DECODE_PINNED) print_tokens(m, tok, "fed", res.fed, res.n_steps);
            print_tokens(m, tok, "sampled", res.sampled, res.n_forwards);
        }
        /* the text as a reader wants it: the prompt, then what the model wrote */
        fwrite(prompt_text, 1, prompt_len, stdout);
        print_text(m, tok, res.sampled, res.n_forwards);
        putchar('\n');
    } else if (!a.quiet) {
        if (cfg.decode == TD_DECODE_PINNED) print_tokens(m, tok, "fed", res.fed, res.n_steps);
        print_tokens(m, tok, "sampled", res.sampled, res.n_forwards);
    }
    const double prefill_tps = res.prefill_s > 0 ? (double)n_prompt / res.prefill_s : 0;
    const double decode_tps = res.decode_s > 0 ? (double)res.n_steps / res.decode_s : 0;
    printf("run: backend %s, model %s, prefill %lld + decode %lld steps (%s), %.1f tokens/s decode, "
           "%.1f tokens/s prefill, taps %s\n",
           a.backend, a.model, (long long)n_prompt, (long long)res.n_steps,
           cfg.decode == TD_DECODE_GREEDY ? "greedy" : "pinned", decode_tps, prefill_tps,
           cfg.tap_path ? cfg.tap_path : "none");
    if (a.check) check_rc = run_check(&cfg, &res); // prints its own message

out:
    td_tokenizer_free(tok);
    free(prompt_text);
    td_run_result_free(&res);
    if (m) td_model_close(m);
    free(prompt);
    free(pinned);
    if (rc) return td_cli_fail("run", rc, &err);
    return check_rc;
}
