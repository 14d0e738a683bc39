/* tapdiff runner: one sequence through one backend (prefill, then decode
 * steps of one token), greedy or pinned, with the tap file and its
 * provenance. See runner.h. */
#include "runner.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <inttypes.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "faults.h"
#include "profile.h"
#include "tapfile.h"
#include "td_config.h"
#include "ties.h"

void td_run_config_init(td_run_config *c) {
    memset(c, 0, sizeof *c);
    c->backend = "ref";
    c->n_steps = 16;
    c->decode = TD_DECODE_GREEDY;
    c->tap_mode = TD_TAP_FULL;
}

void td_run_result_free(td_run_result *res) {
    if (!res) return;
    free(res->fed);
    free(res->sampled);
    free(res->logits);
    memset(res, 0, sizeof *res);
}

int32_t td_argmax(const double *x, int64_t n) {
    int64_t best = -1;
    for (int64_t i = 0; i < n; i++) {
        if (x[i] != x[i]) continue; // NaN
        if (best < 0 || x[i] > x[best]) best = i; // strict: the lowest id keeps a tie
    }
    return best < 0 ? 0 : (int32_t)best;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ------------------------------------------------------------------------ */
/* Token lists                                                                */

int td_parse_token_list(const char *text, const char *what, int32_t **ids, int64_t *n, td_err *err) {
    *ids = NULL;
    *n = 0;
    int64_t cap = 16, len = 0;
    int32_t *v = td_xmalloc((size_t)cap * sizeof *v);
    const char *p = text;
    for (;;) {
        while (*p == ',' || isspace((unsigned char)*p)) p++;
        if (!*p) break;
        if (!isdigit((unsigned char)*p)) {
            free(v);
            return td_err_set(err, TD_EINPUT, "%s: expected token ids separated by commas or blanks, found '%.20s'",
                              what, p);
        }
        errno = 0;
        char *end;
        long long id = strtoll(p, &end, 10);
        if (errno || id > INT32_MAX || (*end && *end != ',' && !isspace((unsigned char)*end))) {
            free(v);
            return td_err_set(err, TD_EINPUT, "%s: '%.20s' is not a token id (a non-negative 32-bit integer)", what,
                              p);
        }
        if (len == cap) v = td_xrealloc(v, (size_t)(cap *= 2) * sizeof *v);
        v[len++] = (int32_t)id;
        p = end;
    }
    if (len == 0) {
        free(v);
        return td_err_set(err, TD_EINPUT, "%s: no token ids found", what);
    }
    *ids = v;
    *n = len;
    return TD_OK;
}

int td_read_token_text(const char *path, int32_t **ids, int64_t *n, td_err *err) {
    *ids = NULL;
    *n = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return td_err_set(err, TD_EINPUT, "%s: cannot open token file: %s", path, strerror(errno));
    size_t cap = 4096, len = 0;
    char *buf = td_xmalloc(cap);
    size_t got;
    while ((got = fread(buf + len, 1, cap - len - 1, f)) > 0) {
        len += got;
        if (len + 1 == cap) buf = td_xrealloc(buf, cap *= 2);
    }
    int bad = ferror(f);
    fclose(f);
    buf[len] = '\0';
    int rc = bad ? td_err_set(err, TD_EINPUT, "%s: read error", path)
                 : (strlen(buf) != len ? td_err_set(err, TD_EINPUT, "%s: not a text file of token ids (NUL byte)", path)
                                       : td_parse_token_list(buf, path, ids, n, err));
    free(buf);
    return rc;
}

int td_is_hdf5_file(const char *path) {
    static const unsigned char sig[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
    unsigned char head[8];
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    size_t got = fread(head, 1, sizeof head, f);
    fclose(f);
    return got == sizeof head && !memcmp(head, sig, sizeof sig);
}

/* Appends the inp.tokens of step s to (*v, *len). */
static int append_step_tokens(const td_tapfile *tf, int64_t s, int32_t **v, int64_t *len, td_err *err) {
    td_tap_info ti;
    int rc = td_tapfile_tap(tf, s, "inp.tokens", &ti, err);
    if (rc) return rc;
    int64_t *vals = td_xmalloc((ti.count ? ti.count : 1) * sizeof *vals);
    if (ti.has_data) {
        rc = td_tapfile_read_i64(tf, s, "inp.tokens", vals, ti.count, err);
    } else if (ti.count <= 4) { // fingerprint mode: the first values are kept
        for (uint64_t i = 0; i < ti.count; i++) vals[i] = (int64_t)ti.fp.first[i];
    } else {
        rc = td_err_set(err, TD_EINPUT,
                        "%s: step %lld: inp.tokens has %llu values and no data (fingerprint-only tap file)",
                        td_tapfile_path(tf), (long long)s, (unsigned long long)ti.count);
    }
    if (!rc) {
        *v = td_xrealloc(*v, (size_t)(*len + (int64_t)ti.count + 1) * sizeof **v);
        for (uint64_t i = 0; i < ti.count; i++) {
            if (vals[i] < 0 || vals[i] > INT32_MAX) {
                rc = td_err_set(err, TD_EINPUT, "%s: step %lld: inp.tokens[%llu] = %lld is not a token id",
                                td_tapfile_path(tf), (long long)s, (unsigned long long)i, (long long)vals[i]);
                break;
            }
            (*v)[(*len)++] = (int32_t)vals[i];
        }
    }
    free(vals);
    return rc;
}

int td_read_tapfile_tokens(const char *path, int32_t **prompt, int64_t *n_prompt, int32_t **decode,
                           int64_t *n_decode, td_err *err) {
    int32_t *pv = NULL, *dv = NULL;
    int64_t pn = 0, dn = 0;
    td_tapfile *tf = NULL;
    int rc = td_tapfile_open(&tf, path, err);
    if (rc) return rc;
    const int64_t n_steps = td_tapfile_n_steps(tf);
    for (int64_t s = 0; s < n_steps && !rc; s++) {
        td_step_info si;
        if ((rc = td_tapfile_step(tf, s, &si, err))) break;
        if (si.kind == TD_STEP_PREFILL) {
            if (pn == 0) rc = append_step_tokens(tf, s, &pv, &pn, err);
        } else {
            rc = append_step_tokens(tf, s, &dv, &dn, err);
        }
    }
    td_tapfile_close(tf);
    if (rc) {
        free(pv), free(dv);
        return rc;
    }
    if (prompt) *prompt = pv, *n_prompt = pn;
    else free(pv);
    if (decode) *decode = dv, *n_decode = dn;
    else free(dv);
    return TD_OK;
}

/* ------------------------------------------------------------------------ */
/* The run                                                                    */

static int check_tokens(const int32_t *ids, int64_t n, int64_t V, const char *what, const char *model, td_err *err) {
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= V)
            return td_err_set(err, TD_EINPUT, "%s token %lld is id %d, out of range: %s has %lld vocabulary ids", what,
                              (long long)i, ids[i], model, (long long)V);
    return TD_OK;
}

/* The arithmetic profile a run computes with (root attribute `profile`):
 * what the open backend declares (profile_of: from its device, canonical),
 * else cfg->profile when it names one other than "native", else the
 * backend's declared vt->profile, else "native". */
static const char *run_profile(const td_run_config *cfg, const td_backend_vt *vt, const td_backend *b) {
    const char *own = b && vt->profile_of ? vt->profile_of(b) : NULL;
    if (own && own[0]) return own;
    // "native" asks for the arm's own arithmetic, which is what it declares
    if (cfg->profile && cfg->profile[0] && strcmp(cfg->profile, "native")) return cfg->profile;
    return vt && vt->profile ? vt->profile : "native";
}

/* Does this run log its near rounding ties (td_run_config.record_ties)? The
 * reference forwards round a Q8 profile's activations through profile.h's
 * td_act_round_* and name each forward (td_act_ties_forward), so a session
 * sees every code and scale they round; the other arms round in their own
 * kernels, which log nothing: they record no list rather than an empty one,
 * which would claim there was no near tie. */
static int logs_ties(const td_run_config *cfg, const td_backend_vt *vt, const char *profile) {
    if (!cfg->record_ties || (strcmp(vt->name, "ref") && strcmp(vt->name, "ref32"))) return 0;
    td_profile p;
    char why[200];
    return !td_profile_parse(profile, &p, why, sizeof why) && (p.rules & (TD_RULE_ACT_Q8 | TD_RULE_ACT_Q8_1));
}

/* Root attributes: enough provenance that h5dump alone says what made the file. */
static int write_provenance(td_tap_sink *s, const td_run_config *cfg, const td_model *m, const char *model_path,
                            const td_backend_vt *vt, const td_backend *b, const char *version, td_err *err) {
    char sha[65];
    int rc = td_sha256_file(model_path, sha, err);
    if (rc) return rc;
    const char *decode = cfg->decode_label ? cfg->decode_label
                                           : (cfg->decode == TD_DECODE_GREEDY ? "greedy" : "pinned");
    int bad = 0;
    bad |= td_tap_sink_attr_str(s, "model", model_path);
    bad |= td_tap_sink_attr_str(s, "model_sha256", sha);
    bad |= td_tap_sink_attr_str(s, "arch", td_arch_name(m->hp.arch));
    bad |= td_tap_sink_attr_str(s, "backend", vt->name);
    bad |= td_tap_sink_attr_str(s, "backend_version", version);
    bad |= td_tap_sink_attr_str(s, "precision", vt->precision);
    bad |= td_tap_sink_attr_str(s, "profile", run_profile(cfg, vt, b));
    bad |= td_tap_sink_attr_i64(s, "threads", cfg->threads);
    bad |= td_tap_sink_attr_str(s, "tapdiff_version", TD_VERSION);
    bad |= td_tap_sink_attr_str(s, "git_revision", TD_GIT_REV);
    bad |= td_tap_sink_attr_str(s, "command_line", cfg->command_line ? cfg->command_line : "");
    if (cfg->prompt_text) bad |= td_tap_sink_attr_str(s, "prompt", cfg->prompt_text);
    bad |= td_tap_sink_attr_str(s, "decode", decode);
    bad |= td_tap_sink_attr_i64(s, "n_prompt", cfg->n_prompt);
    bad |= td_tap_sink_attr_i64(s, "n_decode_steps", cfg->n_steps);
    // the sink keeps the precise message; td_run reports it when closing
    if (bad) return td_err_set(err, bad, "cannot write the provenance attributes of the tap file");
    return TD_OK;
}

int td_run(const td_run_config *cfg, td_run_result *res, td_err *err) {
    memset(res, 0, sizeof *res);
    if (!cfg->prompt || cfg->n_prompt < 1)
        return td_err_set(err, TD_EINPUT, "run: the prompt needs at least one token");
    if (cfg->n_steps < 0) return td_err_set(err, TD_EINPUT, "run: negative number of decode steps");
    if (cfg->decode == TD_DECODE_PINNED && cfg->n_pinned < cfg->n_steps)
        return td_err_set(err, TD_EINPUT, "run: pinned decode has %lld tokens for %lld decode steps",
                          (long long)cfg->n_pinned, (long long)cfg->n_steps);
    const td_backend_vt *vt = td_backend_find(cfg->backend);
    if (!vt) {
        const char *absent = td_backend_absent_reason(cfg->backend);
        if (absent) return td_err_set(err, TD_SKIP, "run: %s", absent);
        char names[256];
        td_backend_names(names, sizeof names);
        return td_err_set(err, TD_EUSAGE, "run: unknown backend '%s' (known: %s)", cfg->backend ? cfg->backend : "",
                          names);
    }

    // a fault the backend does not implement is refused before anything runs (faults.h)
    int rc = td_fault_check_backend(vt, cfg->inject, err);
    if (rc) return rc;

    td_model *own = NULL;
    const td_model *m = cfg->model;
    if (!m) {
        if (!cfg->model_path) return td_err_set(err, TD_EUSAGE, "run: no model given");
        if ((rc = td_model_open(&own, cfg->model_path, err))) return rc;
        m = own;
    }
    const char *model_path = cfg->model_path ? cfg->model_path : m->gguf->path;
    const int64_t V = m->hp.n_vocab, n_fwd = 1 + cfg->n_steps;
    td_backend *b = NULL;
    td_tap_sink *sink = NULL;
    double *lg = NULL;
    int ties_on = 0;
    td_act_tie *tie_log = NULL;
    int n_tie_log = 0;

    if ((rc = check_tokens(cfg->prompt, cfg->n_prompt, V, "prompt", model_path, err))) goto done;
    if (cfg->decode == TD_DECODE_PINNED &&
        (rc = check_tokens(cfg->pinned, cfg->n_steps, V, "pinned", model_path, err)))
        goto done;

    const uint64_t ctx = m->hp.n_ctx_train;
    if (ctx > 0 && (uint64_t)cfg->n_prompt + (uint64_t)cfg->n_steps > ctx) {
        rc = td_err_set(err, TD_EUSAGE,
                        "%" PRId64 " prompt tokens + %" PRId64 " steps exceed the model's context length %" PRIu64
                        " (%s)", cfg->n_prompt, cfg->n_steps, ctx, model_path);
        goto done;
    }
    td_backend_params params = {
        .threads = cfg->threads,
        .n_ctx = cfg->n_ctx ? cfg->n_ctx : (uint32_t)(cfg->n_prompt + cfg->n_steps),
        .inject = cfg->inject,
        .profile = cfg->profile,
    };
    if ((rc = vt->open(&b, m, &params, err))) goto done;
    const char *version = vt->version ? vt->version(b) : NULL;
    snprintf(res->backend_version, sizeof res->backend_version, "%s", version ? version : vt->name);
    snprintf(res->arch, sizeof res->arch, "%s", td_arch_name(m->hp.arch));
    snprintf(res->profile, sizeof res->profile, "%s", run_profile(cfg, vt, b));

    // Outputs never overwrite inputs; /dev/null means "no taps".
    const char *tap_path = cfg->tap_path;
    struct stat ts, is;
    if (tap_path && stat(tap_path, &ts) == 0) {
        if (S_ISCHR(ts.st_mode) && strcmp(tap_path, "/dev/null") == 0) {
            tap_path = NULL;
        } else if (stat(model_path, &is) == 0 && is.st_dev == ts.st_dev && is.st_ino == ts.st_ino) {
            rc = td_err_set(err, TD_EUSAGE, "the tap file %s is the model %s: refusing to overwrite the model",
                            tap_path, model_path);
            goto done;
        } else if (cfg->decode_label && !strncmp(cfg->decode_label, "pinned:", 7) &&
                   stat(cfg->decode_label + 7, &is) == 0 && is.st_dev == ts.st_dev && is.st_ino == ts.st_ino) {
            rc = td_err_set(err, TD_EUSAGE, "the tap file %s is the pinned input %s: refusing to overwrite it",
                            tap_path, cfg->decode_label + 7);
            goto done;
        }
    }
    if (tap_path) {
        td_tap_options opt = td_tap_options_default();
        opt.mode = cfg->tap_mode;
        opt.filter = cfg->tap_filter;
        // stored, not deflated: on bench-q8_0's full taps deflate saved 11% of
        // the file at 1.5x the untapped run's CPU time
        opt.compress = 0;
        if ((rc = td_tap_sink_open(&sink, tap_path, &opt, err))) goto done;
        if ((rc = write_provenance(sink, cfg, m, model_path, vt, b, res->backend_version, err))) goto done;
        if ((ties_on = logs_ties(cfg, vt, res->profile))) td_act_ties_begin(NULL, 0, TD_TIES_TAU);
    }

    res->n_forwards = n_fwd;
    res->n_steps = cfg->n_steps;
    res->n_vocab = V;
    res->fed = td_xcalloc((size_t)(cfg->n_steps ? cfg->n_steps : 1), sizeof *res->fed);
    res->sampled = td_xcalloc((size_t)n_fwd, sizeof *res->sampled);
    // Only the latest row is kept: memory does not grow with the steps.
    const int64_t rows = cfg->keep_all_logits ? n_fwd : 1;
    res->logits = td_xcalloc((size_t)(rows * V), sizeof *res->logits);
    lg = td_xmalloc((size_t)(cfg->n_prompt * V) * sizeof *lg);

    for (int64_t f = 0; f < n_fwd; f++) {
        const int prefill = f == 0;
        int32_t tok;
        const int32_t *tokens = cfg->prompt;
        int64_t T = cfg->n_prompt, pos0 = 0;
        if (!prefill) {
            tok = cfg->decode == TD_DECODE_GREEDY ? res->sampled[f - 1] : cfg->pinned[f - 1];
            res->fed[f - 1] = tok;
            tokens = &tok;
            T = 1;
            pos0 = cfg->n_prompt + f - 1;
        }
        if ((rc = td_tap_step_begin(sink, prefill ? TD_STEP_PREFILL : TD_STEP_DECODE, pos0, T, err))) goto done;
        const double t0 = now_s();
        if ((rc = b->vt->forward(b, tokens, T, pos0, sink, lg, err))) goto done;
        const double dt = now_s() - t0;
        if ((rc = td_tap_step_end(sink, err))) goto done;
        if (prefill) res->prefill_s = dt;
        else res->decode_s += dt;
        double *last = res->logits + (cfg->keep_all_logits ? f * V : 0);
        memcpy(last, lg + (T - 1) * V, (size_t)V * sizeof *last);
        res->sampled[f] = td_argmax(last, V);
        if (cfg->on_step) cfg->on_step(cfg->user, f + 1, n_fwd);
    }
    res->final_logits = res->logits + (rows - 1) * V;

done:
    if (ties_on) td_act_ties_end(&tie_log, &n_tie_log);
    if (sink) {
        td_err cerr = {{0}};
        int crc = td_tap_sink_close(sink, &cerr);
        if (crc && (!rc || rc == crc)) { // the sink's own message is the precise one
            rc = crc;
            *err = cerr;
        }
    }
    if (b) b->vt->close(b);
    free(lg);
    if (own) td_model_close(own);
    if (ties_on && rc == TD_OK) {
        // written once the file is closed and valid: the same attributes bisect's oracle records
        td_ties_report *rep = td_xcalloc(1, sizeof *rep);
        td_ties_keep_near(rep, tie_log, n_tie_log);
        rc = td_ties_record(cfg->tap_path, rep, err);
        free(rep);
    }
    free(tie_log);
    if (rc) td_run_result_free(res);
    return rc;
}

int td_same_file_any(const char *path, const char *const *inputs, int n) {
    struct stat ps, is;
    if (!path || stat(path, &ps) != 0) return 0;
    for (int i = 0; i < n; i++)
        if (inputs[i] && stat(inputs[i], &is) == 0 && is.st_dev == ps.st_dev && is.st_ino == ps.st_ino) return 1;
    return 0;
}
