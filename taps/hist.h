/* The token history behind the hist.tokens tap: the last TD_HIST_W ids a
 * sequence consumed, oldest first. One ring for the engine helpers of the tap
 * library (tap.c) and every backend's forward contract (backends/forward.h). */
#ifndef TD_TAPS_HIST_H
#define TD_TAPS_HIST_H

#include <stdint.h>
#include <string.h>

/* Width of the token history tap hist.tokens (the last W ids consumed). */
#define TD_HIST_W 16

typedef struct td_hist {
    int64_t ids[TD_HIST_W]; /* oldest first */
    int64_t n;
} td_hist;

static inline void td_hist_reset(td_hist *h) { h->n = 0; }

/* Appends the T ids a successful step consumed, dropping the oldest. */
static inline void td_hist_push(td_hist *h, const int32_t *tokens, int64_t T) {
    for (int64_t t = 0; t < T; t++) {
        if (h->n == TD_HIST_W) {
            memmove(h->ids, h->ids + 1, (TD_HIST_W - 1) * sizeof h->ids[0]);
            h->n--;
        }
        h->ids[h->n++] = tokens[t];
    }
}

#endif
