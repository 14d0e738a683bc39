/* tapdiff bisect: one command from "these two arms disagree" to the first
 * divergent tensor. Runs arm A greedy, then arm B and the control arm pinned
 * to the tokens A consumed (so every decode step asks both arms the same
 * question), writes the three tap files, compares B against A with the
 * control's error as the budget (the control computing with B's declared
 * arithmetic profile, so the budget measures the same arithmetic choices), prints the verdict, writes the reports and
 * exits with the verdict (0 conformant, 1 divergent). */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cJSON.h>

#include "args.h"
#include "cli.h"
#include "faults.h"
#include "profile.h"
#include "compare.h"
#include "extarm.h"
#include "report.h"
#include "runner.h"
#include "ties.h"
#include "qsafollow.h"

/* An oracle run met more near-ties than its log keeps (profile.h
 * TD_ACT_TIES_LOG_MAX): the ties past it could not be taken. */
static void print_unlogged(const char *who, int64_t n) {
    printf("%sthe oracle met %" PRId64 " near-tie(s) past its log's cap (README \"Rounding ties\"): their sides "
           "could not be taken, so a divergence on one of them is not explained\n",
           who, n);
}

static const char *const bisect_help =
    "usage: tapdiff bisect --model M.gguf --a ARM --b ARM (--tokens LIST | --tokens-file F |\n"
    "                      --prompt TEXT | --prompt-file F)\n"
    "                      [--steps N] [--control-arm ARM|none] [--out-dir DIR] [--report DIR]\n"
    "                      [--control-profile P] [--k N] [--filter PATTERN] [--threads N]\n"
    "                      [--inject FAULT] [--oracle ARM|none] [--a-profile P] [--json] [--quiet]\n"
    "       tapdiff bisect --list-faults\n"
    "\n"
    "Runs arm A (the reference) greedy over the prompt and N decode steps, then arm B and the\n"
    "control arm pinned to the tokens A consumed, and compares B against A tap by tap. The\n"
    "budget of each tap is k times the control arm's error against A at that tap.\n"
    "\n"
    "  --a ARM, --b ARM     backends (ref, ref32, ...): A is the reference, B the candidate;\n"
    "                       exec:PROGRAM runs any program as the arm (README \"Bring your own\n"
    "                       engine\": TAPDIFF_* environment variables in, a tap file out)\n"
    "  --oracle ARM|none    three-arm mode (the default when A is not ref or ref32 and no\n"
    "                       --control-arm is given): each arm is judged against the oracle\n"
    "                       (default ref) run with that arm's own arithmetic profile, with\n"
    "                       ref32 under the same profile as its control; A and B are also\n"
    "                       compared directly (control: ref32 with B's profile against A).\n"
    "                       The verdict names the arm that is wrong first (tap, step), or\n"
    "                       says both are conformant and their difference is rounding.\n"
    "                       Each arm's distance to the plain oracle is reported too.\n"
    "                       none: the two-arm comparison of B against A\n"
    "  --prompt TEXT        the prompt as text, tokenized with the model's tokenizer; the\n"
    "                       tap files record it (root attribute `prompt`)\n"
    "  --prompt-file F      the same from a file, byte for byte\n"
    "  --control-arm ARM    the control arm (default: ref32 when A is ref, else none);\n"
    "                       none: the budget is the dtype floor only. When it is B's arm\n"
    "                       (and B has no --inject) B's tap file is reused: then r = 1/k at\n"
    "                       every tap, which checks the pipeline, not B.\n"
    "  --a-profile P        two-arm mode: A (ref or ref32) computes with profile P, the\n"
    "                       profile-matched oracle (e.g. act-q8+rope-f32-mul for llamacpp).\n"
    "                       With act-q8 or act-q8_1, A = ref and the control under the same\n"
    "                       profile, a\n"
    "                       divergence first reruns A and the control with rounding ties\n"
    "                       taken the arm's way (README \"Rounding ties\"); A's tap file\n"
    "                       records them (root attributes ties_taken, near_ties)\n"
    "                       qwen4exp: where B's QSA selection differs from the reference\n"
    "                       oracle's only inside the boundary group (a tie compare\n"
    "                       explains), the oracle and its control rerun attending to B's\n"
    "                       positions there (both modes; TD_QSA_FOLLOW=0: off); the\n"
    "                       oracle's file records the rows (root attribute qsa_taken)\n"
    "  --control-profile P  arithmetic profile of the control arm (default: --a-profile's\n"
    "                       when given and the control is ref or ref32, else the one B\n"
    "                       declares, e.g. act-q8+rope-f32-mul for llamacpp; native for\n"
    "                       ref32 and cpu)\n"
    "  --steps N            decode steps after the prefill (default 16)\n"
    "  --out-dir DIR        where the tap files go (default tapdiff-bisect): DIR/A-ARM.h5,\n"
    "                       DIR/B-ARM.h5, DIR/control-ARM.h5\n"
    "  --report DIR         report directory (default OUT-DIR/report): report.md/.json/.html\n"
    "  --k N, --filter P    as in tapdiff compare\n"
    "  --threads N          backend threads\n"
    "  --inject FAULT       run B (only) with a named fault (any backend that implements\n"
    "                       it: --list-faults); an inp.tokens difference is then\n"
    "                       localized, not refused. A backend without it: exit 2\n"
    "  --list-faults        print the fault catalog: name, expected first divergent tap\n"
    "                       and step, the bug, where it shows, the backends implementing it\n"
    "  --json               print the comparison's JSON instead of the text verdict\n"
    "\n"
    "exit: 0 conformant, 1 divergent, 2 usage (or an unknown backend, a fault B does not\n"
    "      implement, or an exec: program not found / not executable), 3 bad model/tokens\n"
    "      (or an exec: arm that failed, crashed, wrote no tap file, another model's, other\n"
    "      tokens or fewer steps),\n"
    "      77 a backend tapdiff knows (cpu cuda metal llamacpp) is not built here (or an\n"
    "      exec: arm exited 77),\n"
    "      99 internal error\n";

typedef struct bisect_args {
    const char *model, *a, *b, *ctrl, *ctrl_profile, *tokens, *tokens_file, *out_dir, *report, *filter, *inject;
    const char *a_profile; /* two-arm: A's arithmetic profile (NULL: native) */
    const char *oracle; /* three-arm mode: the oracle arm; NULL = two-arm */
    const char *prompt, *prompt_file;
    const char *prompt_text; /* set once read: recorded in every arm's tap file */
    long long steps, threads;
    double k;
    int json, quiet;
} bisect_args;

static int parse_ll(const char *s, long long lo, long long hi, long long *v) {
    char *end;
    long long x = strtoll(s, &end, 10);
    if (!*s || *end || x < lo || x > hi) return -1;
    *v = x;
    return 0;
}

/* The fault catalog, one fault a line, with the backends that implement each (faults.h). */
static void list_faults(void) {
    printf("%-20s %-30s %s\n", "fault", "first divergent tap (step)", "bug / where it shows");
    for (int f = 1; f < TD_FAULT_COUNT; f++) {
        const td_fault_info *fi = td_fault_get((td_fault)f);
        char tap[96], who[128];
        if (fi->first_tap_qwen3)
            snprintf(tap, sizeof tap, "%s (%d); qwen3: %s", fi->first_tap, fi->first_step, fi->first_tap_qwen3);
        else
            snprintf(tap, sizeof tap, "%s (%d)", fi->first_tap, fi->first_step);
        td_fault_backends((td_fault)f, who, sizeof who);
        printf("%-20s %-30s %s\n%-51s  shows on: %s\n%-51s  backends: %s\n", fi->name, tap, fi->bug, "", fi->fixtures,
               "", who);
    }
}

static int parse_args(int argc, char **argv, bisect_args *a) {
    memset(a, 0, sizeof *a);
    a->steps = 16;
    a->out_dir = "tapdiff-bisect";
    td_args p;
    td_args_init(&p, "bisect", bisect_help, argc, argv);
    for (int k; (k = td_args_next(&p)) != TD_ARG_END;) {
        if (k == TD_ARG_ERROR) return TD_EUSAGE;
        const char *arg = p.arg;
        if (k == TD_ARG_POS)
            return td_cli_failf("bisect", TD_EUSAGE, "unexpected argument '%s' (see tapdiff bisect --help)", arg);
        if (k == TD_ARG_HELP) {
            fputs(bisect_help, stdout);
            return -1;
        }
        if (!strcmp(arg, "--list-faults")) {
            list_faults();
            return -1;
        }
        if (!strcmp(arg, "--json")) {
            a->json = 1;
            continue;
        }
        if (!strcmp(arg, "--quiet")) {
            a->quiet = 1;
            continue;
        }
        const char *v = td_args_value(&p);
        if (!v) return TD_EUSAGE;
        if (!strcmp(arg, "--model")) a->model = v;
        else if (!strcmp(arg, "--a")) a->a = v;
        else if (!strcmp(arg, "--b")) a->b = v;
        else if (!strcmp(arg, "--control-arm")) a->ctrl = v;
        else if (!strcmp(arg, "--control-profile")) a->ctrl_profile = v;
        else if (!strcmp(arg, "--tokens")) a->tokens = v;
        else if (!strcmp(arg, "--tokens-file")) a->tokens_file = v;
        else if (!strcmp(arg, "--prompt")) a->prompt = v;
        else if (!strcmp(arg, "--prompt-file")) a->prompt_file = v;
        else if (!strcmp(arg, "--out-dir")) a->out_dir = v;
        else if (!strcmp(arg, "--report")) a->report = v;
        else if (!strcmp(arg, "--filter")) a->filter = v;
        else if (!strcmp(arg, "--inject")) a->inject = v;
        else if (!strcmp(arg, "--oracle")) a->oracle = v;
        else if (!strcmp(arg, "--a-profile")) a->a_profile = v;
        else if (!strcmp(arg, "--steps")) {
            if (parse_ll(v, 0, 1000000, &a->steps))
                return td_cli_failf("bisect", TD_EUSAGE, "--steps: expected a count >= 0, got '%s'", v);
        } else if (!strcmp(arg, "--threads")) {
            if (parse_ll(v, 0, 4096, &a->threads))
                return td_cli_failf("bisect", TD_EUSAGE, "--threads: expected 0..4096, got '%s'", v);
        } else if (!strcmp(arg, "--k")) {
            char *end;
            a->k = strtod(v, &end);
            if (end == v || *end || !isfinite(a->k) || !(a->k >= 1))
                return td_cli_failf("bisect", TD_EUSAGE, "--k: expected a finite number >= 1, got '%s'", v);
        } else {
            return td_args_unknown(&p);
        }
    }
    if (!a->model || !a->a || !a->b)
        return td_cli_failf("bisect", TD_EUSAGE, "--model, --a and --b are required (see tapdiff bisect --help)");
    if (!!a->tokens + !!a->tokens_file + !!a->prompt + !!a->prompt_file != 1)
        return td_cli_failf("bisect", TD_EUSAGE, "give exactly one of --tokens, --tokens-file, --prompt and --prompt-file");
    // any two arms, neither of them the reference: the reference judges both
    // (an external arm is judged two-arm: it declares no profile for the oracle to match)
    if (!a->oracle && !a->ctrl && strcmp(a->a, "ref") && strcmp(a->a, "ref32") && !td_extarm_is(a->a) &&
        !td_extarm_is(a->b))
        a->oracle = "ref";
    if (a->oracle && !strcmp(a->oracle, "none")) a->oracle = NULL;
    if (a->oracle && (td_extarm_is(a->a) || td_extarm_is(a->b)))
        return td_cli_failf("bisect", TD_EUSAGE, "three-arm mode (--oracle) needs built-in arms: use --oracle none");
    if (a->a_profile) {
        td_profile pr;
        char why[200];
        if (a->oracle || (strcmp(a->a, "ref") && strcmp(a->a, "ref32")))
            return td_cli_failf("bisect", TD_EUSAGE, "--a-profile needs A = ref or ref32 in the two-arm mode "
                                                     "(--oracle none when A is another arm)");
        if (td_profile_parse(a->a_profile, &pr, why, sizeof why))
            return td_cli_failf("bisect", TD_EUSAGE, "--a-profile: %s", why);
    }
    if (a->oracle && (a->ctrl || a->ctrl_profile || a->inject))
        return td_cli_failf("bisect", TD_EUSAGE,
                            "--oracle (three-arm mode) picks each arm's control itself: --control-arm, "
                            "--control-profile and --inject need --oracle none");
    if (!a->ctrl) a->ctrl = !strcmp(a->a, "ref") ? "ref32" : "none";
    const char *arms[4] = {a->a, a->b, strcmp(a->ctrl, "none") ? a->ctrl : NULL, a->oracle};
    if (arms[2] && td_extarm_is(arms[2]))
        return td_cli_failf("bisect", TD_EUSAGE, "the control arm must be a built-in backend, not %s", arms[2]);
    if (a->oracle && td_extarm_is(a->oracle))
        return td_cli_failf("bisect", TD_EUSAGE, "the oracle must be a built-in backend, not %s", a->oracle);
    if (a->inject && td_extarm_is(a->b))
        return td_cli_failf("bisect", TD_EUSAGE, "--inject needs a built-in backend as B, not %s", a->b);
    for (int i = 0; i < 4; i++)
        if (arms[i] && !td_extarm_is(arms[i]) && !td_backend_find(arms[i])) {
            char names[256];
            td_backend_names(names, sizeof names);
            const char *absent = td_backend_absent_reason(arms[i]);
            if (absent) return td_cli_failf("bisect", TD_SKIP, "%s", absent);
            return td_cli_failf("bisect", TD_EUSAGE, "backend '%s' is unknown (built: %s)", arms[i], names);
        }
    if (!arms[2] && a->ctrl_profile)
        return td_cli_failf("bisect", TD_EUSAGE, "--control-profile needs a control arm (--control-arm is none)");
    return 0;
}

static void on_step(void *user, int64_t done, int64_t total) {
    (void)total;
    td_progress_update((td_progress *)user, (long)done);
}

/* One arm over the prompt: greedy when pinned == NULL, else pinned. */
static td_run_config arm_config(const bisect_args *a, const td_model *m, const char *backend, const char *path,
                                const int32_t *prompt, int64_t n_prompt, const int32_t *pinned, const char *inject,
                                const char *profile) {
    td_run_config cfg;
    td_run_config_init(&cfg);
    cfg.model_path = a->model;
    cfg.model = m;
    cfg.backend = backend;
    cfg.prompt = prompt;
    cfg.n_prompt = n_prompt;
    cfg.n_steps = a->steps;
    cfg.decode = pinned ? TD_DECODE_PINNED : TD_DECODE_GREEDY;
    cfg.pinned = pinned;
    cfg.n_pinned = pinned ? a->steps : 0;
    cfg.decode_label = pinned ? "pinned:A" : NULL;
    cfg.tap_path = path;
    cfg.tap_mode = TD_TAP_FULL;
    cfg.keep_all_logits = 1; // the three-arm verdict measures every forward's logits
    cfg.threads = (int)a->threads;
    cfg.inject = inject;
    cfg.profile = profile;
    cfg.command_line = td_cli_command_line;
    cfg.prompt_text = a->prompt_text;
    return cfg;
}

static int run_arm(const bisect_args *a, const td_model *m, const char *backend, const char *path,
                   const int32_t *prompt, int64_t n_prompt, const int32_t *pinned, const char *inject,
                   const char *profile, td_run_result *res, td_err *err) {
    td_run_config cfg = arm_config(a, m, backend, path, prompt, n_prompt, pinned, inject, profile);
    char label[64];
    snprintf(label, sizeof label, "bisect %s", backend);
    td_progress *p = a->quiet ? NULL : td_progress_begin(label, (long)(1 + a->steps));
    cfg.on_step = p ? on_step : NULL;
    cfg.user = p;
    int rc = td_run(&cfg, res, err);
    td_progress_end(p);
    return rc;
}

static char *join(const char *dir, const char *prefix, const char *arm);

/* Does profile p round activations to Q8 blocks (the rounding ties.h follows)? */
static int q8_profile(const char *p) {
    td_profile pr;
    char why[200];
    return !td_profile_parse(p, &pr, why, sizeof why) && (pr.rules & (TD_RULE_ACT_Q8 | TD_RULE_ACT_Q8_1));
}

static int same_profile(const char *x, const char *y) {
    td_profile px, py;
    char why[200], fx[TD_PROFILE_NAME_MAX], fy[TD_PROFILE_NAME_MAX];
    if (td_profile_parse(x, &px, why, sizeof why) || td_profile_parse(y, &py, why, sizeof why)) return 0;
    td_profile_format(&px, fx, sizeof fx);
    td_profile_format(&py, fy, sizeof fy);
    return !strcmp(fx, fy);
}

/* Arms that honour the QSA pins of profile.h (the reference). */
static int is_ref(const char *arm) { return !strcmp(arm, "ref") || !strcmp(arm, "ref32"); }

/* Does some layer of m select positions with the QSA indexer (qwen4exp)? */
static int has_qsa(const td_model *m) {
    for (uint32_t i = 0; i < m->hp.n_layer && i < 256; i++)
        if (m->hp.qsa_ratio[i]) return 1;
    return 0;
}

/* ---- Three-arm mode ------------------------------------------------------ */

/* What one arm's column shows. */
typedef struct arm_col {
    const char *arm;
    char profile[TD_PROFILE_NAME_MAX];
    char *path, *oracle_path, *ctrl_path;
    td_run_result run, oracle, ctrl;
    td_cmp_result *cr;
    double logits_vs_oracle, logits_vs_plain; /* rel. L2 of the last-position logits, all steps */
    td_ties_report ties; /* rounding ties where the oracle took this arm's side */
    td_qsa_follow_report qsa; /* QSA selection rows the oracle took from this arm */
    int qsa_model;            /* the model has a sparse QSA layer: the JSON says how many rows */
} arm_col;

/* ||x - y|| / ||y|| over n values. */
static double rel_l2(const double *x, const double *y, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        const double d = x[i] - y[i];
        num += d * d;
        den += y[i] * y[i];
    }
    return den > 0 ? sqrt(num / den) : (num > 0 ? INFINITY : 0);
}

static const td_cmp_tap *first_tap(const td_cmp_result *r) {
    return r && r->verdict != TD_OK && r->first >= 0 ? td_cmp_tap_at(r, r->first) : NULL;
}

// name: a copy, for the records of compare are read back one at a time.
static double worst_ratio(const td_cmp_result *r, char *name, size_t name_n, int64_t *step) {
    double w = 0;
    snprintf(name, name_n, "-");
    *step = -1;
    for (int64_t i = 0; i < r->n_taps; i++) {
        const td_cmp_tap *t = td_cmp_tap_at(r, i);
        if (t->ratio > w) {
            w = t->ratio;
            snprintf(name, name_n, "%s", t->name);
            *step = t->step;
        }
    }
    return w;
}

/* -1 when x went wrong before y (earlier step, then earlier layer), 1 after, 0 when undecided. */
static int earlier(const td_cmp_tap *x, const td_cmp_tap *y) {
    if (x->step != y->step) return x->step < y->step ? -1 : 1;
    if (x->layer != y->layer) return x->layer < y->layer ? -1 : 1;
    return 0;
}

/* A divergent comparison without a divergent tap: taps missing on one side,
 * nothing compared, steps or tokens that differ (its reason says which). */
static int untapped_divergence(const td_cmp_result *r) {
    return r && r->verdict != TD_OK && r->first < 0;
}

static void col_first(const arm_col *c, char *buf, size_t n) {
    const td_cmp_tap *t = first_tap(c->cr);
    if (!t)
        snprintf(buf, n, "%s", untapped_divergence(c->cr) ? "none (not compared in full: see below)" : "-");
    else
        snprintf(buf, n, "%s step %lld (r %.3g)", t->name, (long long)t->step, t->ratio);
}

static cJSON *col_json(const arm_col *c) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "arm", c->arm);
    cJSON_AddStringToObject(o, "profile", c->profile);
    cJSON_AddStringToObject(o, "verdict", c->cr->verdict == TD_OK ? "conformant" : "divergent");
    const td_cmp_tap *t = first_tap(c->cr);
    if (t) {
        cJSON_AddStringToObject(o, "first_tap", t->name);
        cJSON_AddNumberToObject(o, "first_step", (double)t->step);
        cJSON_AddNumberToObject(o, "first_ratio", t->ratio);
    }
    char wn[TD_TAP_NAME_MAX];
    int64_t ws;
    cJSON_AddNumberToObject(o, "worst_ratio", worst_ratio(c->cr, wn, sizeof wn, &ws));
    cJSON_AddStringToObject(o, "worst_tap", wn);
    cJSON_AddNumberToObject(o, "logits_vs_oracle", c->logits_vs_oracle);
    cJSON_AddNumberToObject(o, "logits_vs_plain_oracle", c->logits_vs_plain);
    cJSON_AddNumberToObject(o, "oracle_ties_taken", c->ties.n_values);
    if (c->ties.n_unlogged) cJSON_AddNumberToObject(o, "oracle_ties_unlogged", (double)c->ties.n_unlogged);
    if (c->qsa_model) cJSON_AddNumberToObject(o, "oracle_qsa_taken", c->qsa.n_rows);
    char *js = td_report_json(c->cr);
    cJSON *cmp = cJSON_Parse(js);
    free(js);
    if (cmp) cJSON_AddItemToObject(o, "compare", cmp);
    return o;
}

/* Runs A (greedy), then B, and for each arm the oracle and ref32 with that
 * arm's profile, pinned to A's tokens; the plain oracle once (no taps);
 * compares each arm with its oracle (control: ref32 with its profile) and A
 * with B directly (control: ref32 with B's profile, against A). */
static int three_arm(const bisect_args *a, const td_model *m, const int32_t *prompt, int64_t n_prompt, td_err *err) {
    // two tie reports (~0.8 MB each) do not belong on the stack; one bisect per process
    static arm_col col[2];
    memset(col, 0, sizeof col);
    col[0].arm = a->a, col[1].arm = a->b;
    td_run_result plain = {0};
    td_cmp_result *direct = NULL;
    char *rep = NULL;
    int rc;
    const char *ctrl_arm = "ref32";
    for (int i = 0; i < 2; i++) {
        const char *pre = i ? "B-" : "A-";
        col[i].path = join(a->out_dir, pre, col[i].arm);
        char buf[64];
        snprintf(buf, sizeof buf, "%soracle-", pre);
        col[i].oracle_path = join(a->out_dir, buf, a->oracle);
        snprintf(buf, sizeof buf, "%scontrol-", pre);
        col[i].ctrl_path = join(a->out_dir, buf, ctrl_arm);
    }
    if ((rc = run_arm(a, m, col[0].arm, col[0].path, prompt, n_prompt, NULL, NULL, NULL, &col[0].run, err))) goto out;
    if ((rc = run_arm(a, m, col[1].arm, col[1].path, prompt, n_prompt, col[0].run.fed, NULL, NULL, &col[1].run, err)))
        goto out;
    const int32_t *fed = col[0].run.fed;
    if ((rc = run_arm(a, m, a->oracle, NULL, prompt, n_prompt, fed, NULL, "native", &plain, err))) goto out;
    const int64_t nl = col[0].run.n_forwards * col[0].run.n_vocab;
    td_cmp_options o = td_cmp_options_default();
    if (a->k > 0) o.k = a->k;
    o.filter = a->filter;
    o.allow_token_mismatch = 1;
    o.qsa_ratio = m->hp.qsa_ratio; // the QSA tie rule with the model's block sizes
    for (int i = 0; i < 2; i++) {
        arm_col *c = &col[i];
        snprintf(c->profile, sizeof c->profile, "%s", c->run.profile[0] ? c->run.profile : "native");
        if ((rc = run_arm(a, m, a->oracle, c->oracle_path, prompt, n_prompt, fed, NULL, c->profile, &c->oracle, err)))
            goto out;
        if ((rc = run_arm(a, m, ctrl_arm, c->ctrl_path, prompt, n_prompt, fed, NULL, c->profile, &c->ctrl, err)))
            goto out;
        o.control = c->ctrl_path;
        if ((rc = td_compare(c->oracle_path, c->path, &o, &c->cr, err))) goto out;
        c->qsa_model = has_qsa(m);
        if (c->cr->verdict != TD_OK && c->qsa_model && is_ref(a->oracle)) {
            // qwen4exp: the arm kept other positions of a boundary tie; the oracle attends to them (qsafollow.h)
            const td_run_config oc = arm_config(a, m, a->oracle, c->oracle_path, prompt, n_prompt, fed, NULL, c->profile),
                                cc = arm_config(a, m, ctrl_arm, c->ctrl_path, prompt, n_prompt, fed, NULL, c->profile);
            if ((rc = td_qsa_follow(&oc, &cc, c->path, &o, &c->cr, &c->qsa, err))) goto out;
        }
        if (c->cr->verdict != TD_OK && strcmp(c->profile, "native") && !strcmp(a->oracle, "ref")) {
            // the arm may have rounded an activation code or block scale on the other side
            // of a tie than the f64 oracle: the oracle takes its side there (ties.h)
            const td_run_config oc = arm_config(a, m, a->oracle, c->oracle_path, prompt, n_prompt, fed, NULL, c->profile),
                                cc = arm_config(a, m, ctrl_arm, c->ctrl_path, prompt, n_prompt, fed, NULL, c->profile);
            td_qsa_follow_pins_begin(&c->qsa); // its reruns attend as the follow's did
            rc = td_ties_follow(&oc, &cc, c->path, &o, &c->cr, &c->ties, err);
            td_qsa_pins_end();
            if (rc) goto out;
            if ((rc = td_ties_record(c->oracle_path, &c->ties, err))) goto out;
        }
        if (c->qsa.n_reruns && (rc = td_qsa_follow_record(c->oracle_path, &c->qsa, err))) goto out;
        if (c->ties.n_flips || c->qsa.n_rows) { // the oracle's logits with the same ties and selections
            td_run_result_free(&c->oracle);
            if (c->ties.n_flips) td_act_ties_begin(c->ties.flips, c->ties.n_flips, TD_TIES_TAU);
            td_qsa_follow_pins_begin(&c->qsa);
            rc = run_arm(a, m, a->oracle, NULL, prompt, n_prompt, fed, NULL, c->profile, &c->oracle, err);
            td_qsa_pins_end();
            if (c->ties.n_flips) td_act_ties_end(NULL, NULL);
            if (rc) goto out;
        }
        c->logits_vs_oracle = rel_l2(c->run.logits, c->oracle.logits, nl);
        c->logits_vs_plain = rel_l2(c->run.logits, plain.logits, nl);
    }
    o.control = col[1].ctrl_path;
    if ((rc = td_compare(col[0].path, col[1].path, &o, &direct, err))) goto out;

    // the verdict: which arm is wrong first, or both conformant
    const td_cmp_tap *fa = first_tap(col[0].cr), *fb = first_tap(col[1].cr);
    const char *wrong = NULL; /* "a", "b", "both" */
    char verdict[1200];
    const int ua = untapped_divergence(col[0].cr), ub = untapped_divergence(col[1].cr);
    if (!fa && !fb && (ua || ub)) {
        // never "conformant" when an arm's comparison did not compare everything
        wrong = ua && ub ? "both" : ua ? "a" : "b";
        const int i = ua ? 0 : 1;
        snprintf(verdict, sizeof verdict, "%s %s (%s) is not conformant with the %s oracle: %.520s%s",
                 ua && ub ? "neither arm is conformant;" : "arm", i ? "B" : "A", col[i].arm, a->oracle,
                 col[i].cr->reason, ua && ub ? "; the other arm likewise (see its report)" : "");
    } else if (!fa && !fb) {
        snprintf(verdict, sizeof verdict,
                 "both arms conformant with the %s oracle under their own profiles; their difference is rounding "
                 "(direct comparison: %s)",
                 a->oracle, direct->verdict == TD_OK ? "conformant" : "divergent beyond the control pair's budget");
    } else {
        const int order = fa && fb ? earlier(fa, fb) : fa ? -1 : 1;
        const int ia = order <= 0 && fa ? 0 : 1;
        const td_cmp_tap *t = ia == 0 ? fa : fb;
        wrong = fa && fb ? (order == 0 ? "both" : order < 0 ? "a" : "b") : fa ? "a" : "b";
        snprintf(verdict, sizeof verdict, "%s %s (%s) is wrong first: %s at step %lld (r %.3g)%s",
                 !strcmp(wrong, "both") ? "both arms wrong at the same point;" : "arm", ia == 0 ? "A" : "B",
                 col[ia].arm, t->name, (long long)t->step, t->ratio,
                 fa && fb ? "; the other arm diverges too (see its column)" : "; the other arm is conformant");
    }

    if (a->json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "schema", "tapdiff-bisect3");
        cJSON_AddNumberToObject(j, "version", 1);
        cJSON_AddStringToObject(j, "oracle", a->oracle);
        cJSON_AddStringToObject(j, "control_arm", ctrl_arm);
        cJSON_AddStringToObject(j, "verdict", wrong ? "divergent" : "conformant");
        if (wrong)
            cJSON_AddStringToObject(j, "wrong_arm", wrong);
        else
            cJSON_AddNullToObject(j, "wrong_arm");
        cJSON_AddStringToObject(j, "summary", verdict);
        cJSON_AddItemToObject(j, "a", col_json(&col[0]));
        cJSON_AddItemToObject(j, "b", col_json(&col[1]));
        char *js = td_report_json(direct);
        cJSON *d = cJSON_Parse(js);
        free(js);
        if (d) cJSON_AddItemToObject(j, "direct", d);
        char *out = cJSON_PrintUnformatted(j);
        puts(out);
        free(out);
        cJSON_Delete(j);
    } else {
        printf("three-arm bisect: oracle %s run with each arm's own profile, control %s with the same profile\n",
               a->oracle, ctrl_arm);
        printf("%-26s %-40s %-40s\n", "", "A", "B");
        printf("%-26s %-40s %-40s\n", "arm", col[0].arm, col[1].arm);
        printf("%-26s %-40s %-40s\n", "profile", col[0].profile, col[1].profile);
        printf("%-26s %-40s %-40s\n", "verdict vs oracle", col[0].cr->verdict == TD_OK ? "conformant" : "DIVERGENT",
               col[1].cr->verdict == TD_OK ? "conformant" : "DIVERGENT");
        char f0[200], f1[200];
        col_first(&col[0], f0, sizeof f0);
        col_first(&col[1], f1, sizeof f1);
        printf("%-26s %-40s %-40s\n", "first divergent", f0, f1);
        for (int i = 0; i < 2; i++) {
            char wn[TD_TAP_NAME_MAX];
            int64_t ws;
            const double w = worst_ratio(col[i].cr, wn, sizeof wn, &ws);
            snprintf(i ? f1 : f0, 200, "%.3g (%s step %lld)", w, wn, (long long)ws);
        }
        printf("%-26s %-40s %-40s\n", "worst r", f0, f1);
        printf("%-26s %-40lld %-40lld\n", "taps compared", (long long)col[0].cr->n_taps, (long long)col[1].cr->n_taps);
        printf("%-26s %-40.3e %-40.3e\n", "logits vs matched oracle", col[0].logits_vs_oracle, col[1].logits_vs_oracle);
        printf("%-26s %-40.3e %-40.3e\n", "logits vs plain oracle", col[0].logits_vs_plain, col[1].logits_vs_plain);
        char d[200];
        const td_cmp_tap *dt = first_tap(direct);
        if (dt)
            snprintf(d, sizeof d, "divergent, first %s step %lld (r %.3g)", dt->name, (long long)dt->step, dt->ratio);
        else if (untapped_divergence(direct))
            snprintf(d, sizeof d, "divergent: %.180s", direct->reason);
        else
            snprintf(d, sizeof d, "conformant");
        printf("direct A vs B (control: %s with B's profile %s, against A): %s\n", ctrl_arm, col[1].profile, d);
        for (int i = 0; i < 2; i++)
            if (col[i].ties.n_flips) {
                char tl[2048];
                td_ties_describe(&col[i].ties, tl, sizeof tl);
                printf("%s: the oracle took arm %s's side of %d rounding tie(s) (%d oracle reruns): %s\n", i ? "B" : "A",
                       col[i].arm, col[i].ties.n_values, col[i].ties.n_reruns, tl);
            }
        for (int i = 0; i < 2; i++)
            if (col[i].ties.n_unlogged) print_unlogged(i ? "B: " : "A: ", col[i].ties.n_unlogged);
        for (int i = 0; i < 2; i++)
            if (col[i].qsa.n_rows) {
                char ql[512];
                td_qsa_follow_describe(&col[i].qsa, ql, sizeof ql);
                printf("%s: the oracle took arm %s's side of %d indexer tie(s) (QSA selection rows that differ only "
                       "in the boundary group): %s\n", i ? "B" : "A", col[i].arm, col[i].qsa.n_rows, ql);
            }
        printf("verdict: %s\n", verdict);
    }
    {
        const char *base = a->report ? a->report : a->out_dir;
        size_t n = strlen(base) + 32;
        rep = td_xmalloc(n);
        const char *const sub[3] = {"report-a", "report-b", "report-direct"};
        const td_cmp_result *rs[3] = {col[0].cr, col[1].cr, direct};
        for (int i = 0; i < 3; i++) {
            snprintf(rep, n, "%s/%s", base, sub[i]);
            if ((rc = td_report_write_dir(rep, rs[i], err))) goto out;
        }
        fprintf(a->json ? stderr : stdout, "reports: %s/report-{a,b,direct}/report.html; tap files in %s\n", base,
                a->out_dir);
    }
    rc = wrong ? TD_DIVERGENT : TD_OK;
out:
    for (int i = 0; i < 2; i++) {
        td_run_result_free(&col[i].run);
        td_run_result_free(&col[i].oracle);
        td_run_result_free(&col[i].ctrl);
        td_cmp_result_free(col[i].cr);
        td_qsa_follow_free(&col[i].qsa);
        free(col[i].path), free(col[i].oracle_path), free(col[i].ctrl_path);
    }
    td_run_result_free(&plain);
    td_cmp_result_free(direct);
    free(rep);
    return rc;
}

static char *join(const char *dir, const char *prefix, const char *arm) {
    size_t n = strlen(dir) + strlen(prefix) + strlen(arm) + 8;
    char *s = td_xmalloc(n);
    if (td_extarm_is(arm)) { // "exec:./bin/eng --x" -> "exec-eng": a file name
        const char *prog = arm + strlen(TD_EXTARM_PREFIX);
        size_t len = strcspn(prog, " \t");
        const char *base = prog;
        for (size_t i = 0; i < len; i++)
            if (prog[i] == '/') base = prog + i + 1;
        int blen = (int)(prog + len - base);
        snprintf(s, n, "%s/%sexec-%.*s.h5", dir, prefix, blen, base);
    } else {
        snprintf(s, n, "%s/%s%s.h5", dir, prefix, arm);
    }
    for (char *c = s + strlen(dir); *c; c++)
        if (*c == ':') *c = '-'; // llamacpp:vulkan -> B-llamacpp-vulkan.h5
    return s;
}

/* An external arm: greedy when pinned == NULL. *fed gets its decode tokens. */
static int run_ext(const bisect_args *a, const char *spec, const char *path, const int32_t *prompt, int64_t n_prompt,
                   const int32_t *pinned, int32_t **fed, td_err *err) {
    size_t n = strlen(path) + 16;
    char *pinned_path = td_xmalloc(n);
    snprintf(pinned_path, n, "%s.pinned.txt", path);
    td_extarm_config c = {.spec = spec,
                          .model_path = a->model,
                          .prompt = prompt,
                          .n_prompt = n_prompt,
                          .n_steps = a->steps,
                          .pinned = pinned,
                          .pinned_path = pinned_path,
                          .tap_path = path,
                          .threads = (int)a->threads};
    if (!a->quiet) fprintf(stderr, "bisect: running %s\n", spec);
    int rc = td_extarm_run(&c, fed, err);
    free(pinned_path);
    return rc;
}

int td_cmd_bisect(int argc, char **argv) {
    bisect_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc < 0) return TD_OK;
    if (rc) return rc;

    td_err err = {{0}};
    int32_t *prompt = NULL;
    int64_t n_prompt = 0;
    char *prompt_text = NULL;
    size_t prompt_len = 0;
    td_model *m = NULL;
    td_run_result ra = {0}, rb = {0}, rc_ = {0};
    int32_t *a_fed = NULL; // an external A's decode tokens
    td_cmp_result *cr = NULL;
    static td_ties_report ties; // large; one bisect per process
    memset(&ties, 0, sizeof ties);
    td_qsa_follow_report qf = {0};
    const int ties_on = a.a_profile && q8_profile(a.a_profile);
    char *pa = join(a.out_dir, "A-", a.a), *pb = join(a.out_dir, "B-", a.b), *pc = NULL, *rep = NULL;
    int ctrl = strcmp(a.ctrl, "none") != 0;
    int reuse_b = ctrl && !strcmp(a.ctrl, a.b) && !a.inject;
    if (ctrl) pc = reuse_b ? td_xstrdup(pb) : join(a.out_dir, "control-", a.ctrl);

    if (a.tokens && td_parse_token_list(a.tokens, "--tokens", &prompt, &n_prompt, &err)) {
        rc = TD_EUSAGE;
        goto out;
    }
    if (a.tokens_file && (rc = td_read_token_text(a.tokens_file, &prompt, &n_prompt, &err))) goto out;
    if ((rc = td_cli_prompt(a.model, a.prompt, a.prompt_file, &prompt_text, &prompt_len, &prompt, &n_prompt, &err)))
        goto out;
    a.prompt_text = prompt_text;
    if ((rc = td_mkdir_p(a.out_dir, &err))) goto out;
    if ((rc = td_model_open(&m, a.model, &err))) goto out;

    if (a.oracle) {
        rc = three_arm(&a, m, prompt, n_prompt, &err);
        goto out;
    }
    if (td_extarm_is(a.a)) {
        if ((rc = run_ext(&a, a.a, pa, prompt, n_prompt, NULL, &a_fed, &err))) goto out;
    } else {
        // an oracle rounding activations to Q8 blocks logs its near ties as it runs (ties.h)
        if (ties_on) td_act_ties_begin(NULL, 0, TD_TIES_TAU);
        rc = run_arm(&a, m, a.a, pa, prompt, n_prompt, NULL, NULL, a.a_profile, &ra, &err);
        if (ties_on) {
            td_act_tie *log = NULL;
            int n_log = 0;
            td_act_ties_end(&log, &n_log);
            ties.n_unlogged = td_act_ties_dropped();
            td_ties_keep_near(&ties, log, n_log);
            free(log);
        }
        if (rc) goto out;
        // recorded before compare reads it: a divergence there on a recorded near tie says so
        if (ties_on && (rc = td_ties_record(pa, &ties, &err))) goto out;
    }
    const int32_t *fed = a_fed ? a_fed : ra.fed;
    if (td_extarm_is(a.b)) {
        if ((rc = run_ext(&a, a.b, pb, prompt, n_prompt, fed, NULL, &err))) goto out;
    } else {
        if ((rc = run_arm(&a, m, a.b, pb, prompt, n_prompt, fed, a.inject, NULL, &rb, &err))) goto out;
    }
    // B's arithmetic as it declared it when it opened (from its device), so
    // the budget compares like with like; an external arm declares nothing: native
    const char *declared = !td_extarm_is(a.b) && rb.profile[0] ? rb.profile : "native";
    // Two-arm mode with --a-profile: the control computes with A's profile, so
    // A and its control are the profile-matched pair the tie search needs
    // (`--a-profile act-q8` against llamacpp, which declares act-q8+rope-f32-mul,
    // kept its tie search); otherwise B's declared profile.
    const int ctrl_profile_given = a.ctrl_profile != NULL;
    if (!a.ctrl_profile) a.ctrl_profile = a.a_profile && ctrl && is_ref(a.ctrl) ? a.a_profile : declared;
    if (ctrl && !reuse_b &&
        (rc = run_arm(&a, m, a.ctrl, pc, prompt, n_prompt, fed, NULL, a.ctrl_profile, &rc_, &err)))
        goto out;

    td_cmp_options o = td_cmp_options_default();
    if (a.k > 0) o.k = a.k;
    o.filter = a.filter;
    o.control = pc;
    o.qsa_ratio = m->hp.qsa_ratio; // the QSA tie rule with the model's block sizes
    // B was fed A's tokens: an inp.tokens difference is B consuming another
    // token than it was given (a feedback bug to localize), not a usage error
    o.allow_token_mismatch = 1;
    if ((rc = td_compare(pa, pb, &o, &cr, &err))) goto out;
    // the arm may have rounded an activation code or block scale on the other side of a tie
    // than the f64 oracle: the oracle (and the control with it) takes its side there, as in
    // the three-arm mode; the control must compute with A's profile for the pins to match
    // qwen4exp: where B's QSA selection differs from the oracle's only inside the boundary group
    // (a tie compare explains), the oracle and the control attend to B's positions (qsafollow.h)
    const int qsa_model = has_qsa(m);
    if (qsa_model && cr->verdict != TD_OK && !td_extarm_is(a.a) && is_ref(a.a) &&
        (!ctrl || (!reuse_b && is_ref(a.ctrl)))) {
        td_run_config oc = arm_config(&a, m, a.a, pa, prompt, n_prompt, fed, NULL, a.a_profile),
                      cc = ctrl ? arm_config(&a, m, a.ctrl, pc, prompt, n_prompt, fed, NULL, a.ctrl_profile) : oc;
        if ((rc = td_qsa_follow(&oc, ctrl ? &cc : NULL, pb, &o, &cr, &qf, &err))) goto out;
    }
    if (ties_on && cr->verdict != TD_OK && !strcmp(a.a, "ref") && ctrl && !reuse_b &&
        (!strcmp(a.ctrl, "ref32") || !strcmp(a.ctrl, "ref")) && same_profile(a.a_profile, a.ctrl_profile)) {
        td_run_config oc = arm_config(&a, m, a.a, pa, prompt, n_prompt, fed, NULL, a.a_profile),
                      cc = arm_config(&a, m, a.ctrl, pc, prompt, n_prompt, fed, NULL, a.ctrl_profile);
        td_qsa_follow_pins_begin(&qf); // its reruns attend as the follow's did
        rc = td_ties_follow(&oc, &cc, pb, &o, &cr, &ties, &err);
        td_qsa_pins_end();
        if (rc) goto out;
    }
    // a rerun replaced A's file: its attributes are written again
    if ((ties.n_reruns || (ties_on && qf.n_reruns)) && (rc = td_ties_record(pa, &ties, &err))) goto out;
    if (qf.n_reruns && (rc = td_qsa_follow_record(pa, &qf, &err))) goto out;
    char ctrl_line[256];
    if (!ctrl)
        snprintf(ctrl_line, sizeof ctrl_line, "control: none (budget: the dtype floor)");
    else if (reuse_b)
        snprintf(ctrl_line, sizeof ctrl_line, "control: %s (B's own run, profile %s)", a.ctrl, declared);
    else
        snprintf(ctrl_line, sizeof ctrl_line, "control: %s, profile %s (%s %s)", a.ctrl, a.ctrl_profile,
                 !strcmp(a.ctrl_profile, declared) ? "B declares"
                 : ctrl_profile_given          ? "--control-profile; B declares"
                                               : "A's --a-profile; B declares",
                 declared);
    if (a.json) {
        char *js = td_report_json(cr);
        // the control's profile is part of the verdict's meaning: add it to the object
        cJSON *o = cJSON_Parse(js);
        if (o && cJSON_IsObject(o)) {
            cJSON_AddStringToObject(o, "control_arm", ctrl ? a.ctrl : "none");
            cJSON_AddStringToObject(o, "control_profile", !ctrl ? "none" : reuse_b ? declared : a.ctrl_profile);
            if (ties_on) cJSON_AddNumberToObject(o, "oracle_ties_taken", ties.n_values);
            if (ties.n_unlogged) cJSON_AddNumberToObject(o, "oracle_ties_unlogged", (double)ties.n_unlogged);
            if (qsa_model && is_ref(a.a)) cJSON_AddNumberToObject(o, "oracle_qsa_taken", qf.n_rows);
            char *js2 = cJSON_PrintUnformatted(o);
            puts(js2);
            free(js2);
        } else {
            puts(js);
        }
        cJSON_Delete(o);
        free(js);
        fprintf(stderr, "%s\n", ctrl_line);
    } else {
        td_report_text(stdout, cr);
        printf("%s\n", ctrl_line);
        if (ties.n_flips) {
            char tl[2048];
            td_ties_describe(&ties, tl, sizeof tl);
            printf("the oracle took B's side of %d rounding tie(s) (%d oracle reruns; A's file records them): %s\n",
                   ties.n_values, ties.n_reruns, tl);
        }
        if (ties.n_unlogged) print_unlogged("", ties.n_unlogged);
        if (qf.n_rows) {
            char ql[512];
            td_qsa_follow_describe(&qf, ql, sizeof ql);
            printf("the oracle took B's side of %d indexer tie(s) (QSA selection rows that differ only in the boundary "
                   "group; A's file records them in qsa_taken): %s\n", qf.n_rows, ql);
        }
    }
    if (a.report) {
        rep = td_xstrdup(a.report);
    } else {
        size_t n = strlen(a.out_dir) + 16;
        rep = td_xmalloc(n);
        snprintf(rep, n, "%s/report", a.out_dir);
    }
    if ((rc = td_report_write_dir(rep, cr, &err))) goto out;
    fprintf(a.json ? stderr : stdout, "tap files: %s %s%s%s\nreport: %s/report.html\n", pa, pb, pc && !reuse_b ? " " : "",
            pc && !reuse_b ? pc : "", rep);
    rc = cr->verdict == TD_OK ? TD_OK : TD_DIVERGENT;

out:
    td_qsa_follow_free(&qf);
    td_cmp_result_free(cr);
    td_run_result_free(&ra);
    td_run_result_free(&rb);
    td_run_result_free(&rc_);
    free(a_fed);
    if (m) td_model_close(m);
    free(prompt);
    free(prompt_text);
    free(pa);
    free(pb);
    free(pc);
    free(rep);
    if (rc != TD_OK && rc != TD_DIVERGENT) return td_cli_fail("bisect", rc, &err);
    fflush(stdout);
    return rc;
}
