/* tapdiff taps/: helpers shared by the writer (tap.c), the reader (tapfile.c)
 * and the fingerprint (fingerprint.c). Private to taps/; engines include
 * tap.h, tools include tapfile.h, nobody includes this. */
#ifndef TD_TAP_INTERNAL_H
#define TD_TAP_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "tap.h"

/* Exact widening of the 16-bit float formats (the reader and the fingerprint
 * must not depend on model/types.c). */
double td_taps_f16_to_f64(uint16_t h);
double td_taps_bf16_to_f64(uint16_t h);

/* HDF5 clears its error stack at the entry of every API call, so the cleanup
 * after a failure would erase the cause. H5OK(call) is true when the call
 * succeeded (>= 0); when it failed it first saves the innermost (most
 * specific: "unable to open file: ... errno = 2 ...") description of the
 * stack, per thread, for td_taps_h5_last. Wrap every HDF5 call whose failure
 * becomes an error message. */
#define H5OK(call) ((call) >= 0 || (td_taps_h5_save(), 0))
void td_taps_h5_save(void);
/* The description saved by the last failing H5OK ("no detail from HDF5" if
 * none). */
const char *td_taps_h5_last(void);

/* Turns off HDF5's own printing of its error stack (STYLE.md: one message of
 * ours instead). Process-wide; idempotent. */
void td_taps_h5_quiet(void);

/* Tests of the writer thread (taps/tap.c): the most bytes its queue held,
 * and whether the sink runs one. */
size_t td_taps_queue_peak(const td_tap_sink *s);
int td_taps_threaded(const td_tap_sink *s);

#endif
