/* tapdiff golden files: the library side of `tapdiff golden` and `tapdiff
 * gate` (which fixture a model is, attributes on a closed golden, the copy of
 * a run's data taps). No HDF5 call here: taps/ owns the file format. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixtures.h"
#include "golden.h"
#include "tap.h"
#include "tapfile.h"

int td_golden_attr_put(const char *path, const char *key, const char *str, const double *num, td_err *err) {
    return td_tapfile_attr_put(path, key, str, num, err);
}

int td_golden_fixture_of(const char *model_path, const char *sha, const char *want, char *name, size_t n,
                         td_err *err) {
    name[0] = '\0';
    char cand[128];
    if (want) {
        snprintf(cand, sizeof cand, "%s", want);
    } else {
        const char *base = strrchr(model_path, '/');
        base = base ? base + 1 : model_path;
        size_t len = strlen(base);
        if (len < 6 || strcmp(base + len - 5, ".gguf") || len - 5 >= sizeof cand) return TD_OK;
        memcpy(cand, base, len - 5);
        cand[len - 5] = '\0';
    }
    if (!td_fixture_find(cand))
        return want ? td_err_set(err, TD_EINPUT, "--fixture %s: no such fixture (tapdiff fixture --list)", want) : TD_OK;
    uint8_t *buf;
    size_t len;
    int rc = td_fixture_build(cand, &buf, &len, err);
    if (rc) return rc;
    char hex[65];
    td_sha256_buf(buf, len, hex);
    free(buf);
    if (strcmp(hex, sha)) {
        if (want)
            return td_err_set(err, TD_EINPUT,
                              "--fixture %s: %s is not that fixture (sha256 %s; fixture %s builds sha256 %s)", want,
                              model_path, sha, want, hex);
        return TD_OK;
    }
    snprintf(name, n, "%s", cand);
    return TD_OK;
}

/* Copies the taps of src that carry data into a new tap file dst (root
 * attributes as text, steps as they are): a golden of the logits alone. */
int td_golden_copy_data_taps(const char *src, const char *dst, td_err *err) {
    td_tapfile *f = NULL;
    td_tap_sink *s = NULL;
    char **names = NULL;
    int nn = 0, rc;
    if ((rc = td_tapfile_open(&f, src, err))) return rc;
    td_tap_options o = td_tap_options_default();
    o.compress = 0; // f64 logits do not compress; contiguous storage is smaller
    if ((rc = td_tap_sink_open(&s, dst, &o, err))) goto out;
    if ((rc = td_tapfile_attr_names(f, &names, &nn, err))) goto out;
    static const char *const own[] = {"format", "format_version", "created", "tap_mode", "tap_filter"};
    for (int i = 0; i < nn; i++) {
        int skip = 0;
        for (size_t k = 0; k < sizeof own / sizeof own[0]; k++) skip |= !strcmp(names[i], own[k]);
        char *v;
        if (skip || td_tapfile_attr_str(f, names[i], &v, err)) continue;
        td_tap_sink_attr_str(s, names[i], v);
        free(v);
    }
    for (int64_t st = 0; !rc && st < td_tapfile_n_steps(f); st++) {
        td_step_info si;
        td_tap_info *taps = NULL;
        int64_t n = 0;
        if ((rc = td_tapfile_step(f, st, &si, err)) || (rc = td_tapfile_step_taps(f, st, &taps, &n, err)) ||
            (rc = td_tap_step_begin(s, si.kind, si.pos0, si.n_tokens, err))) {
            free(taps);
            break;
        }
        for (int64_t i = 0; !rc && i < n; i++) {
            const td_tap_info *t = &taps[i];
            if (!t->has_data) continue;
            size_t cnt = (size_t)(t->count ? t->count : 1);
            if (td_dtype_is_int(t->dtype)) {
                int64_t *v = td_xmalloc(cnt * sizeof *v);
                if (!(rc = td_tapfile_read_i64(f, st, t->name, v, t->count, err)))
                    td_tap_emit(s, -1, t->name, TD_DT_I64, v, t->ndim, t->shape);
                free(v);
            } else {
                double *v = td_xmalloc(cnt * sizeof *v);
                if (!(rc = td_tapfile_read_f64(f, st, t->name, v, t->count, err)))
                    td_tap_emit(s, -1, t->name, TD_DT_F64, v, t->ndim, t->shape);
                free(v);
            }
        }
        free(taps);
        if (!rc) rc = td_tap_step_end(s, err);
    }
out:
    td_tapfile_free_names(names, nn);
    if (s) {
        td_err e2;
        int crc = td_tap_sink_close(s, &e2);
        if (crc && !rc) {
            rc = crc;
            *err = e2;
        }
    }
    td_tapfile_close(f);
    return rc;
}

