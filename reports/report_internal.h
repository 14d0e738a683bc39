/* tapdiff reports/: formatting helpers shared by the renderers (private to
 * reports/), so the text, Markdown, JSON and HTML say the same thing in the
 * same words. */
#ifndef TD_REPORT_INTERNAL_H
#define TD_REPORT_INTERNAL_H

#include <stddef.h>

#include "report.h"

/* "prefill" / "decode" */
const char *rp_kind(td_step_kind k);
/* %.3g; "n/a" for NaN, "inf" for +inf. Returns buf. */
char *rp_num(char *buf, size_t n, double v);
/* A measured value: like rp_num but "nan" for NaN (an error or a value
 * that IS NaN, never "n/a"). */
char *rp_val(char *buf, size_t n, double v);
/* "non-finite values: A ... NaN, +Inf, -Inf; B ...; first at ..." */
char *rp_nonfinite(char *buf, size_t n, const td_cmp_tap *t);
/* The budget as a number, or "exact" for an integer tap. */
char *rp_budget(char *buf, size_t n, const td_cmp_tap *t);
/* "f32 [1, 64]" */
char *rp_shape(char *buf, size_t n, const td_cmp_tap *t);
/* Where a flat index lies: "pos 7, ch 12" for a [T, ...] tap of its step
 * (row r = position pos0 + r), "row 3, col 5" for another matrix, "index 9"
 * for a vector. */
char *rp_where(char *buf, size_t n, const td_cmp_tap *t, uint64_t flat);
/* The position of row `row` ("pos 7") or "row 7" when the tap's first
 * dimension is not the step's tokens. */
char *rp_row(char *buf, size_t n, const td_cmp_tap *t, int64_t row);
/* One or two sentences: why this tap's error is not rounding (or, for a
 * passing tap, why it is). */
char *rp_why(char *buf, size_t n, const td_cmp_result *r, const td_cmp_tap *t);
/* The taps before r->first in execution order (up to n), oldest first;
 * returns how many. */
int rp_before(const td_cmp_result *r, int64_t *idx, int n);
/* "conformant" / "divergent" */
const char *rp_verdict(const td_cmp_result *r);

#endif
