/* tapdiff: the rank order of a QSA selection (qsa_rank.h). */
#include "qsa_rank.h"

typedef struct rank_key {
    int64_t tail0, r;
    const double *sd; // one of the two score arrays
    const float *sf;
} rank_key;

static double block_score(const rank_key *k, int64_t b) {
    return k->sf ? (double)k->sf[b] : k->sd[b]; // f32 -> f64 is exact: f32 scores order as they are
}

/* 1 when position x ranks before position y */
static int before(const rank_key *k, int32_t x, int32_t y) {
    const int tx = x >= k->tail0, ty = y >= k->tail0;
    if (tx != ty) return tx;
    if (tx) return x < y;
    const int64_t bx = x / k->r, by = y / k->r;
    if (bx == by) return x < y;
    return td_qsa_block_before(block_score(k, bx), bx, block_score(k, by), by);
}

static void sift_down(const rank_key *k, int32_t *v, int64_t i, int64_t n) {
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= n) return;
        if (c + 1 < n && before(k, v[c], v[c + 1])) c++;
        if (!before(k, v[i], v[c])) return;
        const int32_t t = v[i];
        v[i] = v[c], v[c] = t;
        i = c;
    }
}

/* Heapsort: no allocation, n log n for the thousands of slots a real model's
 * budget has; the order is total on distinct positions, so any correct sort
 * gives the same row. */
static void rank_sort(const rank_key *k, int32_t *sel, int64_t n, int64_t W) {
    for (int64_t i = n / 2 - 1; i >= 0; i--) sift_down(k, sel, i, n);
    for (int64_t e = n - 1; e > 0; e--) {
        const int32_t t = sel[0];
        sel[0] = sel[e], sel[e] = t;
        sift_down(k, sel, 0, e);
    }
    for (int64_t j = n; j < W; j++) sel[j] = -1;
}

void td_qsa_rank_f64(int32_t *sel, int64_t n, int64_t W, int64_t p, int64_t r, const double *score) {
    const rank_key k = {(p + 1) / r * r, r, score, 0};
    rank_sort(&k, sel, n, W);
}

void td_qsa_rank_f32(int32_t *sel, int64_t n, int64_t W, int64_t p, int64_t r, const float *score) {
    const rank_key k = {(p + 1) / r * r, r, 0, score};
    rank_sort(&k, sel, n, W);
}
