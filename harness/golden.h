/* tapdiff golden files: what `tapdiff golden` writes and `tapdiff gate`
 * reads (the attribute names are documented in harness/cli/golden.c), and the two
 * helpers they share. */
#ifndef TD_GOLDEN_H
#define TD_GOLDEN_H

#include <stddef.h>
#include <stdint.h>

#include "td_common.h"

/* Taps a golden stores with data (tap.h filter syntax); every other tap is a
 * fingerprint. The tokens are kept so a gate can pin any prompt length. */
#define TD_GOLDEN_DATA_TAPS "out.logits,inp.tokens"

/* Sets root attribute `key` of the closed tap file at path: a UTF-8 string
 * (str != NULL) or a float64 (*num). Replaces an existing one. */
int td_golden_attr_put(const char *path, const char *key, const char *str, const double *num, td_err *err);

/* The fixture the model at model_path (sha256 `sha`) is: `want` when given
 * (TD_EINPUT if unknown or if its bytes differ), else the file's base name
 * without ".gguf" when that names a fixture whose bytes have this sha256;
 * name = "" when it is none. */
int td_golden_fixture_of(const char *model_path, const char *sha, const char *want, char *name, size_t n,
                         td_err *err);

/* Copies the taps of src that carry data into a new tap file dst (root
 * attributes as text, steps as they are): a golden of the logits alone. */
int td_golden_copy_data_taps(const char *src, const char *dst, td_err *err);

/* What a golden must hold, checked by td_golden_check. The calibration is
 * the relative L2 error of ref32's logits against ref's: f32 rounding over a
 * forward is ~1e-7..1e-5 for honest models; 0 or anything past 1e-3 means the
 * calibration (or the model) is broken and would widen the gate's budget to
 * the point of passing anything. */
#define TD_GOLDEN_MARKER "tapdiff-golden"
#define TD_GOLDEN_CALIB_MIN 1e-12
#define TD_GOLDEN_CALIB_MAX 1e-3

typedef struct td_golden_info {
    char sha256[65];      /* model_sha256, 64 lowercase hex digits */
    double calib_max;     /* calib_logits_rel_l2_max */
    int64_t n_steps;
} td_golden_info;

/* Validates the golden at path: the tap file itself (tapfile.h), the marker
 * golden = "tapdiff-golden" and golden_version = "1", model_sha256, the
 * calibration (calib_logits_rel_l2_max finite in [TD_GOLDEN_CALIB_MIN,
 * TD_GOLDEN_CALIB_MAX]; calib_logits_rel_l2 one finite value >= 0 per step,
 * none above the max) and finite out.logits with data at every step.
 * TD_EINPUT with the reason. */
int td_golden_check(const char *path, td_golden_info *info, td_err *err);

#endif
