/* tapdiff reports/: the JSON document for tools (`compare --json`,
 * report.json), built with cJSON.
 *
 * ---- JSON schema, format "tapdiff-compare" version 1 ------------------------
 * Numbers are JSON numbers; a value that is not a finite number is null
 * (undefined, e.g. no control) or the string "inf" (e.g. growth over an exact
 * input, ratio of an integer mismatch).
 * {
 *   "format": "tapdiff-compare", "version": 1,
 *   "verdict": "conformant" | "divergent",
 *   "exit_code": 0 | 1,                 // what `tapdiff compare` exits with
 *   "reason": str,                      // one line: why the verdict
 *   "settings": { "k": num, "topk": int, "filter": str,
 *                 "floor_override": num|null, "floor_note": str,
 *                 "floors": {"f64": num, "f32": num, "f16": num, "bf16": num},
 *                 "fingerprint_floor": num, "allow_token_mismatch": bool },
 *   "arms": { "a": {"path": str, "backend": str, "precision": str},
 *             "b": {...same...},
 *             "control": null | {"a": str, "b": str,          // err_ctrl = err(a, b)
 *                                "backend_a": str, "backend_b": str} },
 *   "model": {"path": str, "sha256": str},
 *   "counts": { "steps_a", "steps_b", "compared", "data", "fingerprint",
 *               "integer", "no_control", "filtered", "missing_in_a",
 *               "missing_in_b", "divergent": int },
 *   "missing_example": str,             // "" when nothing is missing
 *   "first_divergent": null | TAP,
 *   "before_first": [TAP, ...],          // up to 3, oldest first
 *   "worst": [TAP, ...],                 // up to 10, by budget ratio
 *   "decode_vs_prefill": [ {"name": str, "prefill_err": num,
 *        "decode_err": num, "decode_step": int, "ratio": num|"inf"} ],  // up to 20, largest ratio first
 *   "taps": [ {"step": int, "name": str, "method": str, "err": num|null,
 *              "err_ctrl": num|null, "budget": num, "ratio": num|"inf",
 *              "fail": str} ],       // every compared tap, execution order
 *   "notes": [str]
 * }
 * TAP = { "step": int, "kind": "prefill"|"decode", "pos0": int,
 *   "n_tokens": int, "seq": int, "name": str, "layer": int,
 *   "dtype_a": str, "dtype_b": str, "shape": [int],
 *   "method": "data"|"fingerprint"|"integer",
 *   "fail": "ok"|"budget"|"nonfinite"|"integer"|"top1"|"kl",
 *   "err": num|null, "err_ctrl": num|null, "ctrl": "data"|"fingerprint"|"none",
 *   "err_ctrl_used": num|null,        // what the budget used (small taps inherit their input's)
 *   "floor": num, "budget": num, "ratio": num|"inf",
 *   "growth": num|"inf"|null, "input": str, "err_input": num|null,
 *   "max_abs": num|null, "max_at": {"flat": int, "row": int, "col": int,
 *                                   "position": int|null} | null,
 *   "cosine": num|null, "nonfinite_mismatch": int,
 *   "nonfinite": {"a": {"nan": int, "+inf": int, "-inf": int}, "b": {...},   // float taps
 *                 "both": int, "first_flat": int, "err": "nan"|"inf"|"finite",
 *                 "err_finite": num|null},   // err is null when NaN: "err" here says so
 *   "ulp_max": num|null, "ulp_median": num|null,
 *   "positions": [{"row": int, "position": int|null, "share": num, "err": num}],
 *   "channels": [{"channel": int, "share": num, "err": num}],
 *   "logits": {"rows": int, "top1_agree": int, "top1_unexplained": int,
 *              "topk_overlap_mean": num, "topk_overlap_min": num,
 *              "kl_mean": num|null, "kl_max": num, "kl_over_budget": int}   // out.logits only
 *   "integer": {"mismatches": int, "first_index": int, "a": num, "b": num}  // integer taps only
 *   "why": str }
 * -----------------------------------------------------------------------------
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "report_internal.h"

static void num(cJSON *o, const char *k, double v) {
    if (isnan(v))
        cJSON_AddNullToObject(o, k);
    else if (isinf(v))
        cJSON_AddStringToObject(o, k, v > 0 ? "inf" : "-inf");
    else
        cJSON_AddNumberToObject(o, k, v);
}

static cJSON *tap_json(const td_cmp_result *r, const td_cmp_tap *t) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "step", (double)t->step);
    cJSON_AddStringToObject(o, "kind", rp_kind(t->kind));
    cJSON_AddNumberToObject(o, "pos0", (double)t->pos0);
    cJSON_AddNumberToObject(o, "n_tokens", (double)t->n_tokens);
    cJSON_AddNumberToObject(o, "seq", (double)t->seq);
    cJSON_AddStringToObject(o, "name", t->name);
    cJSON_AddNumberToObject(o, "layer", t->layer);
    cJSON_AddStringToObject(o, "dtype_a", td_dtype_name(t->dtype_a) ? td_dtype_name(t->dtype_a) : "?");
    cJSON_AddStringToObject(o, "dtype_b", td_dtype_name(t->dtype_b) ? td_dtype_name(t->dtype_b) : "?");
    cJSON *sh = cJSON_AddArrayToObject(o, "shape");
    for (int i = 0; i < t->ndim; i++) cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t->shape[i]));
    cJSON_AddStringToObject(o, "method", td_cmp_method_name(t->method));
    cJSON_AddStringToObject(o, "fail", td_cmp_fail_name(t->fail));
    num(o, "err", t->err);
    num(o, "err_ctrl", t->err_ctrl);
    cJSON_AddStringToObject(o, "ctrl", td_cmp_ctrl_name(t->ctrl));
    num(o, "err_ctrl_used", t->err_ctrl_used);
    num(o, "floor", t->floor);
    num(o, "budget", t->budget);
    num(o, "ratio", t->ratio);
    num(o, "growth", t->growth);
    cJSON_AddStringToObject(o, "input", t->input);
    num(o, "err_input", t->err_input);
    num(o, "max_abs", t->max_abs);
    int rows_tok = t->ndim >= 2 && t->shape[0] == t->n_tokens;
    if (t->method == TD_CMP_DATA) {
        cJSON *m = cJSON_AddObjectToObject(o, "max_at");
        uint64_t cols = t->ndim >= 2 && t->shape[0] > 0 ? t->count / (uint64_t)t->shape[0] : t->count;
        if (!cols) cols = 1;
        int64_t row = t->ndim >= 2 ? (int64_t)(t->max_index / cols) : 0;
        cJSON_AddNumberToObject(m, "flat", (double)t->max_index);
        cJSON_AddNumberToObject(m, "row", (double)row);
        cJSON_AddNumberToObject(m, "col", (double)(t->ndim >= 2 ? t->max_index % cols : t->max_index));
        if (rows_tok)
            cJSON_AddNumberToObject(m, "position", (double)(t->pos0 + row));
        else
            cJSON_AddNullToObject(m, "position");
    } else {
        cJSON_AddNullToObject(o, "max_at");
    }
    num(o, "cosine", t->cosine);
    cJSON_AddNumberToObject(o, "nonfinite_mismatch", (double)t->n_nonfinite_mismatch);
    if (t->method != TD_CMP_INTEGER) {
        cJSON *nf = cJSON_AddObjectToObject(o, "nonfinite");
        const char *cls[3] = {"nan", "+inf", "-inf"};
        const uint64_t *arm[2] = {t->nf_a, t->nf_b};
        for (int a = 0; a < 2; a++) {
            cJSON *x = cJSON_AddObjectToObject(nf, a ? "b" : "a");
            for (int k = 0; k < 3; k++) cJSON_AddNumberToObject(x, cls[k], (double)arm[a][k]);
        }
        cJSON_AddNumberToObject(nf, "both", (double)t->n_nonfinite_both);
        cJSON_AddNumberToObject(nf, "first_flat", (double)t->first_nonfinite);
        cJSON_AddStringToObject(nf, "err", isnan(t->err) ? "nan" : isinf(t->err) ? "inf" : "finite");
        num(nf, "err_finite", t->err_finite);
    }
    num(o, "ulp_max", t->ulp_max);
    num(o, "ulp_median", t->ulp_median);
    cJSON *ps = cJSON_AddArrayToObject(o, "positions");
    for (int i = 0; i < TD_CMP_N_WHERE && t->rows[i].index >= 0; i++) {
        cJSON *p = cJSON_CreateObject();
        cJSON_AddNumberToObject(p, "row", (double)t->rows[i].index);
        if (rows_tok)
            cJSON_AddNumberToObject(p, "position", (double)(t->pos0 + t->rows[i].index));
        else
            cJSON_AddNullToObject(p, "position");
        num(p, "share", t->rows[i].share);
        num(p, "err", t->rows[i].err);
        cJSON_AddItemToArray(ps, p);
    }
    cJSON *cs = cJSON_AddArrayToObject(o, "channels");
    for (int i = 0; i < TD_CMP_N_WHERE && t->cols[i].index >= 0; i++) {
        cJSON *p = cJSON_CreateObject();
        cJSON_AddNumberToObject(p, "channel", (double)t->cols[i].index);
        num(p, "share", t->cols[i].share);
        num(p, "err", t->cols[i].err);
        cJSON_AddItemToArray(cs, p);
    }
    if (t->is_logits) {
        cJSON *l = cJSON_AddObjectToObject(o, "logits");
        cJSON_AddNumberToObject(l, "rows", (double)t->lg_rows);
        cJSON_AddNumberToObject(l, "top1_agree", (double)t->lg_top1_agree);
        cJSON_AddNumberToObject(l, "top1_unexplained", (double)t->lg_top1_unexplained);
        num(l, "topk_overlap_mean", t->lg_topk_mean);
        num(l, "topk_overlap_min", t->lg_topk_min);
        num(l, "kl_mean", t->lg_kl_mean);
        num(l, "kl_max", t->lg_kl_max);
        cJSON_AddNumberToObject(l, "kl_over_budget", (double)t->lg_kl_over);
    }
    if (t->method == TD_CMP_INTEGER) {
        cJSON *in = cJSON_AddObjectToObject(o, "integer");
        cJSON_AddNumberToObject(in, "mismatches", (double)t->n_int_mismatch);
        cJSON_AddNumberToObject(in, "first_index", (double)t->first_mismatch);
        num(in, "a", t->n_int_mismatch ? t->mis_a : NAN);
        num(in, "b", t->n_int_mismatch ? t->mis_b : NAN);
    }
    char why[900];
    cJSON_AddStringToObject(o, "why", rp_why(why, sizeof why, r, t));
    return o;
}

/* The row of one tap in "taps". */
static cJSON *tap_row_json(const td_cmp_tap *t) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "step", (double)t->step);
    cJSON_AddStringToObject(o, "name", t->name);
    cJSON_AddStringToObject(o, "method", td_cmp_method_name(t->method));
    num(o, "err", t->err);
    num(o, "err_ctrl", t->err_ctrl);
    num(o, "budget", t->budget);
    num(o, "ratio", t->ratio);
    cJSON_AddStringToObject(o, "fail", td_cmp_fail_name(t->fail));
    return o;
}

/* The document without its rows: "taps" is an empty array the writer fills. */
static cJSON *doc_json(const td_cmp_result *r) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "format", "tapdiff-compare");
    cJSON_AddNumberToObject(root, "version", 1);
    cJSON_AddStringToObject(root, "verdict", rp_verdict(r));
    cJSON_AddNumberToObject(root, "exit_code", r->verdict == TD_OK ? 0 : 1);
    cJSON_AddStringToObject(root, "reason", r->reason);

    cJSON *s = cJSON_AddObjectToObject(root, "settings");
    cJSON_AddNumberToObject(s, "k", r->k);
    cJSON_AddNumberToObject(s, "topk", r->topk);
    cJSON_AddStringToObject(s, "filter", r->filter);
    num(s, "floor_override", r->floor_override > 0 ? r->floor_override : NAN);
    cJSON_AddStringToObject(s, "floor_note", r->floor_note);
    cJSON *fl = cJSON_AddObjectToObject(s, "floors");
    cJSON_AddNumberToObject(fl, "f64", td_cmp_floor(TD_DT_F64));
    cJSON_AddNumberToObject(fl, "f32", td_cmp_floor(TD_DT_F32));
    cJSON_AddNumberToObject(fl, "f16", td_cmp_floor(TD_DT_F16));
    cJSON_AddNumberToObject(fl, "bf16", td_cmp_floor(TD_DT_BF16));
    cJSON_AddNumberToObject(s, "fingerprint_floor", TD_CMP_FP_FLOOR);
    cJSON_AddBoolToObject(s, "allow_token_mismatch", r->allow_token_mismatch);

    cJSON *arms = cJSON_AddObjectToObject(root, "arms");
    cJSON *a = cJSON_AddObjectToObject(arms, "a");
    cJSON_AddStringToObject(a, "path", r->path_a);
    cJSON_AddStringToObject(a, "backend", r->backend_a);
    cJSON_AddStringToObject(a, "precision", r->precision_a);
    cJSON *b = cJSON_AddObjectToObject(arms, "b");
    cJSON_AddStringToObject(b, "path", r->path_b);
    cJSON_AddStringToObject(b, "backend", r->backend_b);
    cJSON_AddStringToObject(b, "precision", r->precision_b);
    if (r->has_control) {
        cJSON *c = cJSON_AddObjectToObject(arms, "control");
        cJSON_AddStringToObject(c, "a", r->path_ctrl_a);
        cJSON_AddStringToObject(c, "b", r->path_ctrl_b);
        cJSON_AddStringToObject(c, "backend_a", r->backend_ctrl_a);
        cJSON_AddStringToObject(c, "backend_b", r->backend_ctrl_b);
    } else {
        cJSON_AddNullToObject(arms, "control");
    }
    cJSON *m = cJSON_AddObjectToObject(root, "model");
    cJSON_AddStringToObject(m, "path", r->model);
    cJSON_AddStringToObject(m, "sha256", r->model_sha256);

    cJSON *n = cJSON_AddObjectToObject(root, "counts");
    cJSON_AddNumberToObject(n, "steps_a", (double)r->n_steps_a);
    cJSON_AddNumberToObject(n, "steps_b", (double)r->n_steps_b);
    cJSON_AddNumberToObject(n, "compared", (double)r->n_taps);
    cJSON_AddNumberToObject(n, "data", (double)r->n_data);
    cJSON_AddNumberToObject(n, "fingerprint", (double)r->n_fingerprint);
    cJSON_AddNumberToObject(n, "integer", (double)r->n_integer);
    cJSON_AddNumberToObject(n, "no_control", (double)r->n_no_ctrl);
    cJSON_AddNumberToObject(n, "filtered", (double)r->n_filtered);
    cJSON_AddNumberToObject(n, "missing_in_a", (double)r->n_missing_in_a);
    cJSON_AddNumberToObject(n, "missing_in_b", (double)r->n_missing_in_b);
    cJSON_AddNumberToObject(n, "divergent", (double)r->n_divergent);
    cJSON_AddStringToObject(root, "missing_example", r->missing_example);

    if (r->first >= 0)
        cJSON_AddItemToObject(root, "first_divergent", tap_json(r, td_cmp_tap_at(r, r->first)));
    else
        cJSON_AddNullToObject(root, "first_divergent");
    cJSON *bf = cJSON_AddArrayToObject(root, "before_first");
    int64_t idx[10];
    int k = rp_before(r, idx, 3);
    for (int i = 0; i < k; i++) cJSON_AddItemToArray(bf, tap_json(r, td_cmp_tap_at(r, idx[i])));
    cJSON *w = cJSON_AddArrayToObject(root, "worst");
    k = td_report_worst(r, idx, 10);
    for (int i = 0; i < k; i++) cJSON_AddItemToArray(w, tap_json(r, td_cmp_tap_at(r, idx[i])));
    cJSON *dv = cJSON_AddArrayToObject(root, "decode_vs_prefill");
    for (int64_t i = 0; i < r->n_dvp && i < 20; i++) {
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "name", r->dvp[i].name);
        num(d, "prefill_err", r->dvp[i].prefill_err);
        num(d, "decode_err", r->dvp[i].decode_err);
        cJSON_AddNumberToObject(d, "decode_step", (double)r->dvp[i].decode_step);
        num(d, "ratio", r->dvp[i].ratio);
        cJSON_AddItemToArray(dv, d);
    }
    cJSON_AddArrayToObject(root, "taps");
    cJSON *notes = cJSON_AddArrayToObject(root, "notes");
    for (int i = 0; i < r->n_notes; i++) cJSON_AddItemToArray(notes, cJSON_CreateString(r->notes[i]));

    return root;
}

// Write errors are left in the stream: the caller checks ferror(f).
static void put(FILE *f, const char *s, size_t n) { fwrite(s, 1, n, f); }

/* A document of a long comparison has one row per compared tap (hundreds of
 * thousands): the rows are printed one at a time between the two halves of
 * the printed document, so memory holds one row, and the bytes are those
 * cJSON_Print gives for the whole tree (a row printed alone is indented from
 * column 0; inside "taps" its lines sit two tabs deeper; rows are separated
 * by ", "). */
void td_report_json_write(FILE *f, const td_cmp_result *r) {
    cJSON *root = doc_json(r);
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    TD_ASSERT(text != NULL);
    // Keys of the top-level object are the only lines that start with one tab
    // and a quote: strings cannot hold a raw newline.
    static const char mark[] = "\n\t\"taps\":\t[";
    const char *at = strstr(text, mark);
    TD_ASSERT(at != NULL && at[sizeof mark - 1] == ']');
    size_t head = (size_t)(at - text) + sizeof mark - 1;
    put(f, text, head);
    for (int64_t i = 0; i < r->n_taps; i++) {
        cJSON *o = tap_row_json(td_cmp_tap_at(r, i));
        char *row = cJSON_Print(o);
        cJSON_Delete(o);
        TD_ASSERT(row != NULL);
        for (const char *p = row; *p;) {
            const char *nl = strchr(p, '\n');
            if (!nl) {
                put(f, p, strlen(p));
                break;
            }
            put(f, p, (size_t)(nl - p) + 1);
            put(f, "\t\t", 2);
            p = nl + 1;
        }
        free(row);
        if (i + 1 < r->n_taps) put(f, ", ", 2);
    }
    put(f, text + head, strlen(text + head));
    free(text);
}

char *td_report_json(const td_cmp_result *r) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    TD_ASSERT(f != NULL);
    td_report_json_write(f, r);
    int bad = ferror(f), closed = fclose(f);
    TD_ASSERT(!bad && closed == 0 && text != NULL);
    // open_memstream allocates with malloc: callers free() it like any td_xmalloc'd string.
    return text;
}
