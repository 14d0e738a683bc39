/* tapdiff golden files: what `tapdiff golden` writes and `tapdiff gate`
 * reads (the attribute names are documented in harness/cli/golden.c), and the two
 * helpers they share. */
#ifndef TD_GOLDEN_H
#define TD_GOLDEN_H

#include <stddef.h>

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

#endif
