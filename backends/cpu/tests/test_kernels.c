/* Per-kernel checks of the cpu backend, in the spirit of dav1d's checkasm:
 * every entry of the kernel table, in its C form and (when this CPU has
 * AVX2+FMA+F16C) its AVX2 form, against an independent oracle, on random
 * inputs; on a mismatch the inputs that caused it are printed.
 *
 * Oracle for a dot product: the model's exact f64 row decoder
 * (td_decode_row_f64, quants.md) and a dot product in long double of the
 * decoded row with x. Bound: the kernel sums N = n products (plus per-block
 * scale products and minimum terms) in f32 in some order; for any order the
 * rounding error is at most gamma_(N+8) * M (Higham, Accuracy and Stability,
 * Thm 3.1 / Lemma 3.3), where M is the sum of the absolute values of every
 * term the kernel adds: sum |w_i x_i|, and for the types with a minimum
 * (y = d*sc*q - dmin*mn, or d*q + m) sum (|d*sc*q_i| + |dmin*mn|) |x_i|.
 * A wrong nibble, scale or block order is an error of O(M), far above. */
#include <criterion/criterion.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "reference.h"
#include "types.h"

/* ------------------------------------------------------------------------ */
/* Random inputs                                                              */

static uint64_t rng_state;

static uint64_t rnd(void) { // splitmix64
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* uniform in [-1, 1) */
static double urnd(void) { return (double)(rnd() >> 11) * 0x1p-52 - 1.0; }

static void put_f16(uint8_t *p, float v) {
    const uint16_t h = td_f32_to_f16(v);
    p[0] = (uint8_t)h, p[1] = (uint8_t)(h >> 8);
}

/* Offsets of the f16 fields of a block (scales, minimums): random bytes
 * there could be inf/NaN; they get sane finite values instead. */
static int f16_fields(int type, int off[2]) {
    switch (type) {
    case TD_TYPE_Q8_0: case TD_TYPE_Q4_0: case TD_TYPE_Q5_0: off[0] = 0; return 1;
    case TD_TYPE_Q4_1: case TD_TYPE_Q5_1: case TD_TYPE_Q4_K: case TD_TYPE_Q5_K: off[0] = 0, off[1] = 2; return 2;
    case TD_TYPE_Q2_K: off[0] = 80, off[1] = 82; return 2;
    case TD_TYPE_Q3_K: off[0] = 108; return 1;
    case TD_TYPE_Q6_K: off[0] = 208; return 1;
    case TD_TYPE_IQ2_XXS: case TD_TYPE_IQ2_XS: case TD_TYPE_IQ2_S: case TD_TYPE_IQ3_XXS: case TD_TYPE_IQ3_S:
    case TD_TYPE_IQ1_S: off[0] = 0; return 1;
    default: return 0; /* IQ1_M: see random_row; NVFP4's UE4M3 scales are always finite */
    }
}

/* A random row of n values of `type`: random code bytes, f16 scales in
 * +-[2^-12, 2^-4], f16/bf16/f32 values ~U(-1, 1). */
static uint8_t *random_row(int type, int64_t n, size_t *bytes) {
    const td_type_info *ti = td_type_get(type);
    *bytes = td_type_row_bytes(type, n);
    uint8_t *w = malloc(*bytes);
    if (type == TD_TYPE_F32) {
        for (int64_t i = 0; i < n; i++) {
            float v = (float)urnd();
            memcpy(w + 4 * i, &v, 4);
        }
    } else if (type == TD_TYPE_F16 || type == TD_TYPE_BF16) {
        for (int64_t i = 0; i < n; i++) {
            const uint16_t h = type == TD_TYPE_F16 ? td_f32_to_f16((float)urnd()) : td_f32_to_bf16((float)urnd());
            w[2 * i] = (uint8_t)h, w[2 * i + 1] = (uint8_t)(h >> 8);
        }
    } else {
        for (size_t i = 0; i < *bytes; i++) w[i] = (uint8_t)rnd();
        int off[2];
        const int nf = f16_fields(type, off);
        for (int64_t b = 0; b < n / ti->block_size; b++)
            for (int f = 0; f < nf; f++)
                put_f16(w + b * ti->block_bytes + off[f], (float)(ldexp(1.0 + urnd() * 0.5, -4 - (int)(rnd() % 9))));
        if (type == TD_TYPE_IQ1_M) /* its f16 scale is the top nibbles of the 4 scale words (bytes 49, 51, 53, 55) */
            for (int64_t b = 0; b < n / ti->block_size; b++) {
                uint8_t *blk = w + b * ti->block_bytes;
                const uint16_t h = td_f32_to_f16((float)ldexp(1.0 + urnd() * 0.5, -4 - (int)(rnd() % 9)));
                for (int k = 0; k < 4; k++) blk[49 + 2 * k] = (uint8_t)((blk[49 + 2 * k] & 0x0F) | ((h >> (4 * k)) & 15) << 4);
            }
    }
    return w;
}

/* ------------------------------------------------------------------------ */
/* The oracle                                                                 */

/* exact dot (long double over exactly decoded values) and M, the sum of the
 * magnitudes of the terms the kernel adds (see the file comment) */
static void oracle(int type, const uint8_t *w, const float *x, int64_t n, long double *exact, double *mass) {
    double *y = malloc((size_t)n * sizeof *y);
    td_err err;
    cr_assert_eq(td_decode_row_f64(type, w, y, n, &err), TD_OK, "%s", err.msg);
    long double s = 0;
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        s += (long double)y[i] * x[i];
        m += fabs(y[i] * x[i]);
    }
    // the minimum terms: the kernel adds d*sc*q*x and -dmin*mn*x separately
    const td_type_info *ti = td_type_get(type);
    if (type == TD_TYPE_Q4_K || type == TD_TYPE_Q5_K || type == TD_TYPE_Q2_K || type == TD_TYPE_Q4_1 ||
        type == TD_TYPE_Q5_1) {
        m = 0;
        for (int64_t b = 0; b < n / ti->block_size; b++) {
            const uint8_t *blk = w + b * ti->block_bytes;
            double dmin = 0;
            if (type == TD_TYPE_Q2_K) dmin = td_f16_to_f64(td_cpu_rd_u16(blk + 82));
            else dmin = td_f16_to_f64(td_cpu_rd_u16(blk + 2));
            // bound each value's minimum part by the largest it can be (63 codes, 15 for Q2_K)
            const double maxmin = type == TD_TYPE_Q2_K ? 15 * fabs(dmin)
                                  : type == TD_TYPE_Q4_K || type == TD_TYPE_Q5_K ? 63 * fabs(dmin)
                                                                                 : fabs(dmin);
            for (int64_t i = b * ti->block_size; i < (b + 1) * ti->block_size; i++)
                m += (fabs(y[i]) + 2 * maxmin) * fabs((double)x[i]);
        }
    }
    free(y);
    *exact = s;
    *mass = m;
}

static void print_inputs(const char *what, int type, const uint8_t *w, size_t bytes, const float *x, int64_t n) {
    fprintf(stderr, "%s: type %s, n = %lld\n  w (%zu bytes):", what, td_type_name(type), (long long)n, bytes);
    for (size_t i = 0; i < bytes; i++) fprintf(stderr, "%s%02x", i % 32 ? "" : "\n    ", w[i]);
    fprintf(stderr, "\n  x:");
    for (int64_t i = 0; i < n; i++) fprintf(stderr, "%s%a", i % 8 ? " " : "\n    ", (double)x[i]);
    fputc('\n', stderr);
}

/* ------------------------------------------------------------------------ */
/* Dot kernels                                                                */

static const int k_dot_types[] = {TD_TYPE_F32,  TD_TYPE_F16,  TD_TYPE_BF16, TD_TYPE_Q8_0, TD_TYPE_Q4_0,
                                  TD_TYPE_Q4_1, TD_TYPE_Q5_0, TD_TYPE_Q5_1, TD_TYPE_Q2_K, TD_TYPE_Q3_K,
                                  TD_TYPE_Q4_K, TD_TYPE_Q5_K, TD_TYPE_Q6_K, TD_TYPE_IQ2_XXS, TD_TYPE_IQ2_XS,
                                  TD_TYPE_IQ2_S, TD_TYPE_IQ3_XXS, TD_TYPE_IQ3_S, TD_TYPE_IQ1_S, TD_TYPE_IQ1_M,
                                  TD_TYPE_NVFP4};

/* Runs every dot kernel of `isa` over random rows; returns the number of
 * kernels checked (0 when the ISA is not available). */
static int check_dots(td_cpu_isa isa) {
    td_cpu_kernels k;
    td_cpu_kernels_init(&k, isa);
    if (k.isa != isa) return 0;
    int checked = 0;
    const double u = 0x1p-24;
    for (size_t ti = 0; ti < sizeof k_dot_types / sizeof k_dot_types[0]; ti++) {
        const int type = k_dot_types[ti];
        const td_cpu_type_ops *op = &k.type[type];
        cr_assert_not_null(op->dot, "%s: no %s dot kernel", td_cpu_isa_name(isa), td_type_name(type));
        const int64_t B = td_type_get(type)->block_size;
        // one block, a few blocks, a long row; the float types also odd lengths (tails)
        const int64_t lens[] = {B, 3 * B, B >= 256 ? 16 * B : 128 * B, B == 1 ? 37 : 2 * B, B == 1 ? 8 : B};
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            const int64_t n = lens[li];
            for (int rep = 0; rep < 4; rep++) {
                size_t bytes;
                uint8_t *w = random_row(type, n, &bytes);
                float *x = malloc((size_t)n * sizeof *x);
                for (int64_t i = 0; i < n; i++) x[i] = (float)urnd();
                float *xs = calloc((size_t)(n / TD_CPU_XSUM_GROUP + 1), sizeof *xs);
                if (n % TD_CPU_XSUM_GROUP == 0) td_cpu_xsum(xs, x, n);
                const float got = op->dot(w, x, op->needs_xsum ? xs : NULL, n);
                long double exact;
                double mass;
                oracle(type, w, x, n, &exact, &mass);
                const double bound = (double)(n + 8) * u / (1 - (double)(n + 8) * u) * mass;
                const double err = fabs((double)((long double)got - exact));
                if (!(err <= bound)) { // also catches NaN
                    print_inputs("dot mismatch", type, w, bytes, x, n);
                    cr_assert_fail("%s dot_%s, n = %lld: got %.9g, exact %.9Lg, error %.3g > bound %.3g "
                                   "(gamma_(n+8) * M, M = %.6g)",
                                   td_cpu_isa_name(isa), td_type_name(type), (long long)n, (double)got, exact, err,
                                   bound, mass);
                }
                free(w), free(x), free(xs);
            }
        }
        checked++;
    }
    return checked;
}

Test(cpu_kernels, dot_c_vs_exact) {
    rng_state = 1;
    cr_assert_eq(check_dots(TD_CPU_ISA_C), (int)(sizeof k_dot_types / sizeof k_dot_types[0]));
}

Test(cpu_kernels, dot_avx2_vs_exact) {
    if (!td_cpu_has_avx2()) cr_skip_test("this CPU has no AVX2+FMA+F16C");
    rng_state = 2;
    cr_assert_eq(check_dots(TD_CPU_ISA_AVX2), (int)(sizeof k_dot_types / sizeof k_dot_types[0]));
}

/* ------------------------------------------------------------------------ */
/* Native products of several rows: bitwise the per-row kernels              */

/* The SIMD levels' native Q8_0 and F16 dot products, in scalar C: the order
 * in which kernels_avx2.c adds (8 lanes; fmaf for a fused multiply-add),
 * written here from that order, not by calling the kernels, so it pins the
 * bits every row had before the several-row kernels (the conformance
 * profile `native` relies on them). Q8_0: per block and lane l, s0 = q[l] x,
 * s1 = q[l+8] x, s0 += q[l+16] x, s1 += q[l+24] x (fused), then
 * acc[block parity][l] += d (s0 + s1) (fused); the lanes of acc0 + acc1
 * reduced by halves, quarters, pairs. F16: four accumulators over 32 values
 * (a remaining 8 into the first), (a0 + a1) + (a2 + a3) reduced as above,
 * then the last n % 8 products added one by one. */
static float lanes_red(const float v[8]) {
    return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
}

static float model_q8_0(const uint8_t *w, const float *x, int64_t n) {
    float acc[2][8] = {{0}};
    for (int64_t j = 0; j < n / 32; j++) {
        const uint8_t *b = w + j * 34;
        const int8_t *q = (const int8_t *)(b + 2);
        const float d = td_f16_to_f32(td_cpu_rd_u16(b));
        const float *xb = x + 32 * j;
        for (int l = 0; l < 8; l++) {
            float s0 = (float)q[l] * xb[l], s1 = (float)q[l + 8] * xb[l + 8];
            s0 = fmaf((float)q[l + 16], xb[l + 16], s0);
            s1 = fmaf((float)q[l + 24], xb[l + 24], s1);
            acc[j & 1][l] = fmaf(d, s0 + s1, acc[j & 1][l]);
        }
    }
    float v[8];
    for (int l = 0; l < 8; l++) v[l] = acc[0][l] + acc[1][l];
    return lanes_red(v);
}

static float model_f16(const uint8_t *w, const float *x, int64_t n) {
    float a[4][8] = {{0}};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int k = 0; k < 4; k++)
            for (int l = 0; l < 8; l++)
                a[k][l] = fmaf(td_f16_to_f32(td_cpu_rd_u16(w + 2 * (i + 8 * k + l))), x[i + 8 * k + l], a[k][l]);
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) a[0][l] = fmaf(td_f16_to_f32(td_cpu_rd_u16(w + 2 * (i + l))), x[i + l], a[0][l]);
    float v[8];
    for (int l = 0; l < 8; l++) v[l] = (a[0][l] + a[1][l]) + (a[2][l] + a[3][l]);
    float s = lanes_red(v);
    for (; i < n; i++) {
        const float p = td_f16_to_f32(td_cpu_rd_u16(w + 2 * i)) * x[i];
        s += p;
    }
    return s;
}

/* x whose values span 2^-10 .. 2^10, so a sum in another order rounds
 * differently (seen: a tail block added to the other accumulator fails) */
static void wide_x(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = (float)ldexp(urnd(), (int)(rnd() % 21) - 10);
}

/* For every level this CPU runs: the level's `dot`, its several-row kernel
 * (where it has one) and td_cpu_gemv over odd row counts and ragged n, each
 * bitwise against the per-row `dot` and, at the SIMD levels, against the
 * scalar model above. Returns the number of levels checked. */
static int check_dot_rows(int type, int has_rows, float (*model)(const uint8_t *, const float *, int64_t),
                          const int64_t *ns, int n_ns) {
    static const int64_t nrs[] = {1, 2, 3, 4, 5, 7, 8, 13, 33, 128, 131};
    int levels = 0;
    for (int isa = TD_CPU_ISA_C; isa < TD_CPU_ISA_COUNT; isa++) {
        td_cpu_kernels k;
        td_cpu_kernels_init(&k, (td_cpu_isa)isa);
        if ((int)k.isa != isa) continue;
        levels++;
        const td_cpu_type_ops *op = &k.type[type];
        cr_assert_not_null(op->dot);
        if (isa == TD_CPU_ISA_C || !has_rows) cr_assert_null(op->dot_rows, "%s %s: a several-row kernel",
                                                             td_cpu_isa_name(k.isa), td_type_name(type));
        else cr_assert_not_null(op->dot_rows, "%s %s: no several-row kernel", td_cpu_isa_name(k.isa), td_type_name(type));
        for (int a = 0; a < n_ns; a++) {
            const int64_t n = ns[a], max_nr = 131;
            const size_t rb = td_type_row_bytes(type, n);
            uint8_t *w = malloc(rb * (size_t)max_nr);
            for (int64_t r = 0; r < max_nr; r++) {
                size_t bytes;
                uint8_t *row = random_row(type, n, &bytes);
                memcpy(w + (size_t)r * rb, row, rb);
                free(row);
            }
            float *x = malloc((size_t)n * sizeof *x), *xs = malloc((size_t)(n / 32 + 1) * sizeof *xs);
            float *y = malloc((size_t)max_nr * sizeof *y), *ref = malloc((size_t)max_nr * sizeof *ref);
            wide_x(x, n);
            for (int64_t r = 0; r < max_nr; r++) {
                ref[r] = op->dot(w + (size_t)r * rb, x, xs, n);
                if (isa != TD_CPU_ISA_C) {
                    const float m = model(w + (size_t)r * rb, x, n);
                    cr_assert(memcmp(&ref[r], &m, 4) == 0, "%s %s dot, n = %lld, row %lld: %a, the lane model gives %a",
                              td_cpu_isa_name(k.isa), td_type_name(type), (long long)n, (long long)r,
                              (double)ref[r], (double)m);
                }
            }
            if (op->dot_rows) { // rows 0, 5, 9, 130 together, and 4 neighbours
                const int64_t pick[2][TD_CPU_DOT_ROWS] = {{0, 5, 9, 130}, {60, 61, 62, 63}};
                for (int p = 0; p < 2; p++) {
                    const void *rw[TD_CPU_DOT_ROWS];
                    float yr[TD_CPU_DOT_ROWS];
                    for (int r = 0; r < TD_CPU_DOT_ROWS; r++) rw[r] = w + (size_t)pick[p][r] * rb;
                    op->dot_rows(rw, x, xs, n, yr);
                    for (int r = 0; r < TD_CPU_DOT_ROWS; r++)
                        cr_assert(memcmp(&yr[r], &ref[pick[p][r]], 4) == 0,
                                  "%s %s dot_rows, n = %lld, row %lld: %a, dot gives %a", td_cpu_isa_name(k.isa),
                                  td_type_name(type), (long long)n, (long long)pick[p][r], (double)yr[r],
                                  (double)ref[pick[p][r]]);
                }
            }
            for (size_t c = 0; c < sizeof nrs / sizeof nrs[0]; c++) {
                const int64_t nr = nrs[c], r0 = max_nr - nr; // the last nr rows: not at the buffer's start
                for (int64_t r = 0; r < nr; r++) y[r] = NAN;
                td_cpu_gemv(op, w + (size_t)r0 * rb, rb, nr, x, xs, n, y);
                for (int64_t r = 0; r < nr; r++)
                    cr_assert(memcmp(&y[r], &ref[r0 + r], 4) == 0,
                              "%s %s gemv of %lld rows, n = %lld, row %lld: %a, dot gives %a", td_cpu_isa_name(k.isa),
                              td_type_name(type), (long long)nr, (long long)n, (long long)r, (double)y[r],
                              (double)ref[r0 + r]);
            }
            free(w), free(x), free(xs), free(y), free(ref);
        }
    }
    return levels;
}

/* Q8_0 has no several-row kernel (measured slower from memory on Zen 4,
 * README "Benchmarks"): its per-row kernel keeps the model's bits and
 * td_cpu_gemv runs it row by row */
Test(cpu_kernels, dot_rows_q8_0_bitwise) {
    rng_state = 41;
    static const int64_t ns[] = {32, 64, 96, 160, 1024, 1056};
    cr_assert_geq(check_dot_rows(TD_TYPE_Q8_0, 0, model_q8_0, ns, 6), 1);
}

Test(cpu_kernels, dot_rows_f16_bitwise) {
    rng_state = 42;
    static const int64_t ns[] = {1, 7, 8, 13, 31, 32, 33, 40, 72, 1000, 1029};
    cr_assert_geq(check_dot_rows(TD_TYPE_F16, 1, model_f16, ns, 11), 1);
}

/* ------------------------------------------------------------------------ */
/* Row decoders: exact values rounded once, so bitwise equal to the model's */

static void check_rows(td_cpu_isa isa) {
    td_cpu_kernels k;
    td_cpu_kernels_init(&k, isa);
    cr_assert_eq(k.isa, isa);
    for (size_t ti = 0; ti < sizeof k_dot_types / sizeof k_dot_types[0]; ti++) {
        const int type = k_dot_types[ti];
        cr_assert_not_null(k.type[type].to_f32);
        const int64_t n = 8 * td_type_get(type)->block_size + (type <= TD_TYPE_F16 || type == TD_TYPE_BF16 ? 5 : 0);
        size_t bytes;
        uint8_t *w = random_row(type, n, &bytes);
        float *got = malloc((size_t)n * sizeof *got), *want = malloc((size_t)n * sizeof *want);
        td_err err;
        cr_assert_eq(td_decode_row_f32(type, w, want, n, &err), TD_OK, "%s", err.msg);
        k.type[type].to_f32(type, w, got, n);
        for (int64_t i = 0; i < n; i++)
            if (memcmp(&got[i], &want[i], sizeof(float))) {
                print_inputs("row decode mismatch", type, w, bytes, got, 0);
                cr_assert_fail("%s to_f32 %s: value %lld is %a, the model's decoder gives %a", td_cpu_isa_name(isa),
                               td_type_name(type), (long long)i, (double)got[i], (double)want[i]);
            }
        free(w), free(got), free(want);
    }
}

Test(cpu_kernels, row_decode_c) {
    rng_state = 3;
    check_rows(TD_CPU_ISA_C);
}

Test(cpu_kernels, row_decode_avx2) {
    if (!td_cpu_has_avx2()) cr_skip_test("this CPU has no AVX2+FMA+F16C");
    rng_state = 4;
    check_rows(TD_CPU_ISA_AVX2);
}

/* ------------------------------------------------------------------------ */
/* f32 helpers and the activation sums                                        */

static void check_f32_helpers(td_cpu_isa isa) {
    td_cpu_kernels k;
    td_cpu_kernels_init(&k, isa);
    cr_assert_eq(k.isa, isa);
    const double u = 0x1p-24;
    for (int64_t n = 1; n <= 200; n += 13) {
        float a[200], b[200], y[200], y0[200];
        for (int64_t i = 0; i < n; i++) a[i] = (float)urnd(), b[i] = (float)urnd(), y0[i] = y[i] = (float)urnd();
        long double exact = 0;
        double mass = 0;
        for (int64_t i = 0; i < n; i++) exact += (long double)a[i] * b[i], mass += fabs((double)a[i] * b[i]);
        const float got = k.dot_f32(a, b, n);
        cr_assert_leq(fabs((double)((long double)got - exact)), (double)(n + 8) * u * 1.01 * mass,
                      "%s dot_f32 n = %lld: got %.9g exact %.9Lg", td_cpu_isa_name(isa), (long long)n, (double)got,
                      exact);
        const float s = (float)urnd();
        k.axpy_f32(y, s, a, n);
        for (int64_t i = 0; i < n; i++) {
            // one multiply-add per element: fused or not, within 2 roundings of the exact value
            const double ex = (double)y0[i] + (double)s * a[i];
            cr_assert_leq(fabs((double)y[i] - ex), 2 * u * (fabs((double)y0[i]) + fabs((double)s * a[i])) + 1e-30,
                          "%s axpy n = %lld, element %lld: got %a, exact %a", td_cpu_isa_name(isa), (long long)n,
                          (long long)i, (double)y[i], ex);
        }
    }
}

Test(cpu_kernels, f32_helpers_c) {
    rng_state = 5;
    check_f32_helpers(TD_CPU_ISA_C);
}

Test(cpu_kernels, f32_helpers_avx2) {
    if (!td_cpu_has_avx2()) cr_skip_test("this CPU has no AVX2+FMA+F16C");
    rng_state = 6;
    check_f32_helpers(TD_CPU_ISA_AVX2);
}

Test(cpu_kernels, xsum_is_per_32_sums) {
    // hand-worked: x[i] = i, so group j sums 32j..32j+31 = 1024j + 496 exactly
    float x[96], xs[3];
    for (int i = 0; i < 96; i++) x[i] = (float)i;
    td_cpu_xsum(xs, x, 96);
    for (int j = 0; j < 3; j++) cr_assert_eq(xs[j], 1024.0f * (float)j + 496.0f, "group %d: %g", j, (double)xs[j]);
}

Test(cpu_kernels, table_is_filled_c_first_then_overridden) {
    td_cpu_kernels c, best;
    td_cpu_kernels_init(&c, TD_CPU_ISA_C);
    td_cpu_kernels_init(&best, TD_CPU_ISA_AVX2);
    cr_assert_eq(c.isa, TD_CPU_ISA_C);
    cr_assert_eq(best.isa, td_cpu_has_avx2() ? TD_CPU_ISA_AVX2 : TD_CPU_ISA_C);
    // every type the model can decode has a row decoder in both tables
    for (int t = 0; t < TD_TYPE_COUNT; t++) {
        const td_type_info *ti = td_type_get(t);
        const int dec = ti && ti->can_decode;
        cr_assert_eq(c.type[t].to_f32 != NULL, dec, "type %s", td_type_name(t));
        cr_assert_eq(best.type[t].to_f32 != NULL, dec, "type %s", td_type_name(t));
    }
    if (best.isa == TD_CPU_ISA_AVX2)
        cr_assert_neq((void *)best.type[TD_TYPE_Q4_K].dot, (void *)c.type[TD_TYPE_Q4_K].dot,
                      "the AVX2 table still holds the C Q4_K kernel");
}

/* ------------------------------------------------------------------------ */
/* act-q8: the activation rounding and the integer kernels                    */

Test(cpu_kernels, quantize_act_q8_0_hand_worked) {
    // block 0: max |x| = 2, so the codes are rint(x * 63.5), ties to even, and
    // the scale is 2/127 rounded to f16; block 1: all zero
    float x[64] = {0};
    x[0] = 2.0f, x[1] = -1.0f, x[2] = 0.5f, x[3] = 0x1p-7f, x[5] = -0.75f, x[17] = 1.5f;
    int8_t q[64];
    float d[2], d16[4], d32[2], xd[64];
    td_cpu_quantize_act(TD_CPU_ACT_Q8_0, x, 64, q, d, d16, d32, xd);
    // 127; -63.5 -> -64 (even); 31.75 -> 32; 0.496 -> 0; -47.625 -> -48; 95.25 -> 95
    const int want[6] = {127, -64, 32, 0, 0, -48};
    for (int i = 0; i < 6; i++) cr_assert_eq(q[i], want[i], "q[%d] = %d, expected %d", i, q[i], want[i]);
    cr_assert_eq(q[17], 95);
    // 2/127 = 0.0157480..., in binary16 0x2008 = 2^-6 * (1 + 8/1024) = 0.0157470703125
    const float dd = 0.0157470703125f;
    cr_assert_eq(d[0], dd, "d = %a", (double)d[0]);
    cr_assert_eq(d16[0], dd * 47.0f, "dsum16[0] = %a", (double)d16[0]); // 127 - 64 + 32 - 48
    cr_assert_eq(d16[1], dd * 95.0f);
    cr_assert_eq(d32[0], dd * 142.0f);
    cr_assert_eq(xd[1], dd * -64.0f);
    cr_assert_eq(d[1], 0.0f);
    cr_assert_eq(d32[1], 0.0f);
    for (int i = 32; i < 64; i++) cr_assert(q[i] == 0 && xd[i] == 0.0f);
}

Test(cpu_kernels, quantize_act_q8_k_hand_worked) {
    // 256 values; the largest magnitude 2 occurs first as -2 (index 7), then
    // as +2 (index 9): the first decides, s = -127 / -2 = 63.5, d = 1/63.5
    float x[256] = {0};
    x[0] = 1.0f, x[3] = 0.5f, x[7] = -2.0f, x[9] = 2.0f, x[40] = -0.25f;
    int8_t q[256];
    float d[8], d16[16], d32[8], xd[256];
    td_cpu_quantize_act(TD_CPU_ACT_Q8_K, x, 256, q, d, d16, d32, xd);
    // 63.5 -> 64 (even); 31.75 -> 32; -127; 127; -15.875 -> -16
    cr_assert(q[0] == 64 && q[3] == 32 && q[7] == -127 && q[9] == 127 && q[40] == -16, "%d %d %d %d %d", q[0], q[3],
              q[7], q[9], q[40]);
    const float dd = 1.0f / 63.5f;
    for (int k = 0; k < 8; k++) cr_assert_eq(d[k], dd, "d[%d] = %a: one Q8_K scale for the 8 blocks of 32", k, (double)d[k]);
    cr_assert_eq(d16[0], dd * 96.0f); // 64 + 32 - 127 + 127
    cr_assert_eq(d32[1], dd * -16.0f);
    cr_assert_eq(xd[7], dd * -127.0f);
}

/* Our activation rounding is the project's definition of act-q8: the values
 * x' = d*q equal td_act_round_f32's (ref32 computes with them) exactly,
 * in C and AVX2 (as values: the reference keeps the sign of a -0 code,
 * integer codes cannot; no sum can tell). Random blocks, all-zero blocks,
 * blocks of exact ties. */
static void check_act_rounding(td_cpu_isa isa) {
    td_cpu_kernels k;
    td_cpu_kernels_init(&k, isa);
    cr_assert_eq(k.isa, isa);
    enum { N = 256 * 16 };
    static float x[N], d[N / 32], d16[N / 16], d32[N / 32], xd[N], want[N];
    static int8_t q[N];
    for (int i = 0; i < N; i++) {
        // blocks of 32: some all zero; some with max 127 (127/max = 1) and
        // values m + 1/2, every code a tie; the rest random
        const int blk = i / 32;
        x[i] = blk % 7 == 3   ? 0.0f
               : blk % 7 == 5 ? (i % 32 == 0 ? 127.0f : (float)((int)(rnd() % 254) - 127) + 0.5f)
                              : (float)urnd() * 3.0f;
    }
    // Q8_K blocks whose largest magnitude occurs twice, negative first (the first
    // decides the sign of the codes and of d, never x')
    for (int b = 1; b < N / 256; b += 3) x[256 * b + 5] = -300.0f, x[256 * b + 200] = 300.0f;
    for (int f = 0; f < 2; f++) {
        const td_act_fmt rf = f ? TD_ACT_Q8_K : TD_ACT_Q8_0;
        td_act_round_f32(want, x, N, rf);
        k.quantize_act((td_cpu_act_fmt)f, x, N, q, d, d16, d32, xd);
        for (int i = 0; i < N; i++)
            if (xd[i] != want[i])
                cr_assert_fail("%s %s: x'[%d] = %a (code %d, scale %a), the reference's rounding gives %a (x = %a)",
                               td_cpu_isa_name(isa), f ? "Q8_K" : "Q8_0", i, (double)xd[i], q[i], (double)d[i / 32],
                               (double)want[i], (double)x[i]);
        for (int i = 0; i < N; i++) cr_assert_eq(xd[i], d[i / 32] * (float)q[i], "x' is not d*q at %d", i);
    }
}

Test(cpu_kernels, act_rounding_is_the_reference_definition_c) {
    rng_state = 10;
    check_act_rounding(TD_CPU_ISA_C);
}

Test(cpu_kernels, act_rounding_is_the_reference_definition_avx2) {
    if (!td_cpu_has_avx2()) cr_skip_test("this CPU has no AVX2+FMA+F16C");
    rng_state = 11;
    check_act_rounding(TD_CPU_ISA_AVX2);
}

static const int k_q8_types[] = {TD_TYPE_Q8_0, TD_TYPE_Q4_0, TD_TYPE_Q4_K, TD_TYPE_Q5_K, TD_TYPE_Q6_K};

/* the largest offset/minimum a value of the block can carry, the kernel's
 * extra term per value (see oracle()) */
static double q8_offset_bound(int type, const uint8_t *blk) {
    switch (type) {
    case TD_TYPE_Q4_0: return 8 * fabs(td_f16_to_f64(td_cpu_rd_u16(blk)));
    case TD_TYPE_Q4_K: case TD_TYPE_Q5_K: return 63 * fabs(td_f16_to_f64(td_cpu_rd_u16(blk + 2)));
    case TD_TYPE_Q6_K: return 32 * 128 * fabs(td_f16_to_f64(td_cpu_rd_u16(blk + 208)));
    default: return 0;
    }
}

static int check_q8_dots(td_cpu_isa isa) {
    td_cpu_kernels k;
    td_cpu_kernels_init(&k, isa);
    if (k.isa != isa) return 0;
    const double u = 0x1p-24;
    int checked = 0;
    for (size_t ti = 0; ti < sizeof k_q8_types / sizeof k_q8_types[0]; ti++) {
        const int type = k_q8_types[ti];
        const td_type_info *inf = td_type_get(type);
        cr_assert_not_null(k.type[type].dot_q8, "%s: no act-q8 %s kernel", td_cpu_isa_name(isa), inf->name);
        const int64_t B = inf->block_size;
        const int64_t lens[] = {B, 3 * B, B >= 256 ? 16 * B : 128 * B};
        for (size_t li = 0; li < 3; li++) {
            const int64_t n = lens[li];
            for (int rep = 0; rep < 4; rep++) {
                size_t bytes;
                uint8_t *w = random_row(type, n, &bytes);
                float *x = malloc((size_t)n * sizeof *x), *d = malloc((size_t)n / 32 * sizeof *d);
                float *d16 = malloc((size_t)n / 16 * sizeof *d16), *d32 = malloc((size_t)n / 32 * sizeof *d32);
                int8_t *q = malloc((size_t)n);
                double *y = malloc((size_t)n * sizeof *y);
                for (int64_t i = 0; i < n; i++) x[i] = (float)urnd();
                const td_cpu_act_fmt fmt = B == 256 ? TD_CPU_ACT_Q8_K : TD_CPU_ACT_Q8_0;
                td_cpu_quantize_act(fmt, x, n, q, d, d16, d32, NULL);
                const td_cpu_xq8 xq = {q, d, d16, d32};
                const float got = k.type[type].dot_q8(w, &xq, n);
                td_err err;
                cr_assert_eq(td_decode_row_f64(type, w, y, n, &err), TD_OK, "%s", err.msg);
                // exact product with the exact x' = d*q
                long double exact = 0;
                double mass = 0;
                for (int64_t i = 0; i < n; i++) {
                    const double xi = (double)d[i / 32] * q[i];
                    exact += (long double)y[i] * xi;
                    const double off = q8_offset_bound(type, w + (i / B) * inf->block_bytes);
                    mass += (fabs(y[i]) + 2 * off) * fabs(xi);
                }
                const double bound = (double)(n + 8) * u / (1 - (double)(n + 8) * u) * mass;
                const double e = fabs((double)((long double)got - exact));
                if (!(e <= bound)) {
                    print_inputs("act-q8 dot mismatch", type, w, bytes, x, n);
                    cr_assert_fail("%s dot_q8_%s, n = %lld: got %.9g, exact %.9Lg, error %.3g > bound %.3g",
                                   td_cpu_isa_name(isa), inf->name, (long long)n, (double)got, exact, e, bound);
                }
                free(w), free(x), free(d), free(d16), free(d32), free(q), free(y);
            }
        }
        checked++;
    }
    return checked;
}

Test(cpu_kernels, dot_q8_c_vs_exact) {
    rng_state = 7;
    cr_assert_eq(check_q8_dots(TD_CPU_ISA_C), (int)(sizeof k_q8_types / sizeof k_q8_types[0]));
}

Test(cpu_kernels, dot_q8_avx2_vs_exact) {
    if (!td_cpu_has_avx2()) cr_skip_test("this CPU has no AVX2+FMA+F16C");
    rng_state = 8;
    cr_assert_eq(check_q8_dots(TD_CPU_ISA_AVX2), (int)(sizeof k_q8_types / sizeof k_q8_types[0]));
}

/* ------------------------------------------------------------------------ */
/* ISA levels: dispatch, and act-q8's integer kernels bit-equal at every level */

Test(cpu_kernels, isa_names_round_trip_and_levels_nest) {
    for (int i = 0; i < TD_CPU_ISA_COUNT; i++) {
        cr_assert_eq(td_cpu_isa_parse(td_cpu_isa_name((td_cpu_isa)i)), i, "level %d", i);
        // a CPU with a level has every level below it
        if (i > 0 && td_cpu_has_isa((td_cpu_isa)i)) cr_assert(td_cpu_has_isa((td_cpu_isa)(i - 1)), "level %d", i);
    }
    cr_assert_eq(td_cpu_isa_parse("avx-512"), -1);
    cr_assert_eq(td_cpu_isa_parse(NULL), -1);
    td_cpu_kernels k;
    td_cpu_kernels_init(&k, TD_CPU_ISA_COUNT - 1);
    for (int i = TD_CPU_ISA_COUNT - 1; i >= 0; i--)
        if (td_cpu_has_isa((td_cpu_isa)i)) {
            cr_assert_eq((int)k.isa, i, "the table took %s, the CPU has %s", td_cpu_isa_name(k.isa),
                         td_cpu_isa_name((td_cpu_isa)i));
            break;
        }
}

Test(cpu_kernels, dot_avx512vnni_vs_exact) {
    if (!td_cpu_has_isa(TD_CPU_ISA_AVX512VNNI)) cr_skip_test("this CPU has no AVX-512 F/BW/VL + VNNI");
    rng_state = 21;
    cr_assert_eq(check_dots(TD_CPU_ISA_AVX512VNNI), (int)(sizeof k_dot_types / sizeof k_dot_types[0]));
    rng_state = 22;
    cr_assert_eq(check_q8_dots(TD_CPU_ISA_AVX512VNNI), (int)(sizeof k_q8_types / sizeof k_q8_types[0]));
}

/* Every act-q8 kernel of every level this CPU runs returns the C kernel's
 * bits: the integer sums are exact and the scaling follows one order. The
 * lengths cover whole groups of 8 blocks, tails, and one block. */
Test(cpu_kernels, dot_q8_bitwise_equal_across_isa_levels) {
    rng_state = 23;
    td_cpu_kernels lv[TD_CPU_ISA_COUNT];
    int n_lv = 0;
    for (int i = 0; i < TD_CPU_ISA_COUNT; i++) {
        td_cpu_kernels_init(&lv[n_lv], (td_cpu_isa)i);
        if ((int)lv[n_lv].isa == i) n_lv++;
    }
    if (n_lv < 2) cr_skip_test("this CPU runs only the C kernels");
    int compared = 0;
    for (size_t ti = 0; ti < sizeof k_q8_types / sizeof k_q8_types[0]; ti++) {
        const int type = k_q8_types[ti];
        const int64_t B = td_type_get(type)->block_size;
        const int64_t lens[] = {B, 3 * B, 8 * B, 11 * B, B >= 256 ? 16 * B : 128 * B};
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
            for (int rep = 0; rep < 6; rep++) {
                const int64_t n = lens[li];
                size_t bytes;
                uint8_t *w = random_row(type, n, &bytes);
                float *x = malloc((size_t)n * sizeof *x), *d = malloc((size_t)n / 32 * sizeof *d);
                float *d16 = malloc((size_t)n / 16 * sizeof *d16), *d32 = malloc((size_t)n / 32 * sizeof *d32);
                int8_t *q = malloc((size_t)n);
                // magnitudes over several decades, so roundings differ if the order does
                for (int64_t i = 0; i < n; i++) x[i] = (float)(urnd() * pow(10.0, (double)(i % 7) - 3));
                td_cpu_quantize_act(B == 256 ? TD_CPU_ACT_Q8_K : TD_CPU_ACT_Q8_0, x, n, q, d, d16, d32, NULL);
                const td_cpu_xq8 xq = {q, d, d16, d32};
                const float c = lv[0].type[type].dot_q8(w, &xq, n);
                for (int i = 1; i < n_lv; i++) {
                    const float s = lv[i].type[type].dot_q8(w, &xq, n);
                    uint32_t bc, bs;
                    memcpy(&bc, &c, 4), memcpy(&bs, &s, 4);
                    if (bc != bs) {
                        print_inputs("act-q8 level mismatch", type, w, bytes, x, n);
                        cr_assert_fail("dot_q8_%s, n = %lld: %s gives %.9g (0x%08x), c gives %.9g (0x%08x)",
                                       td_type_name(type), (long long)n, td_cpu_isa_name(lv[i].isa), (double)s, bs,
                                       (double)c, bc);
                    }
                    compared++;
                }
                free(w), free(x), free(d), free(d16), free(d32), free(q);
            }
    }
    cr_assert_gt(compared, 0);
}

/* ------------------------------------------------------------------------ */
/* act-q8 on packed weights: every (row, token) of the tile kernels is the C
 * per-row kernel's bits, with and without bias, over tile tails (token
 * counts not a multiple of the tile) and lengths with and without whole
 * groups of 8 blocks. */

static const int k_pack_types[] = {TD_TYPE_Q8_0, TD_TYPE_Q4_K};

/* G groups of random rows of n values: the stored rows in *W (row_bytes
 * *bytes apart), returned packed by op (64-byte aligned) */
static uint8_t *random_packed(const td_cpu_type_ops *op, int type, int64_t n, int64_t G, uint8_t **W, size_t *bytes) {
    const int64_t rows = G * TD_CPU_PACK_ROWS;
    *bytes = td_type_row_bytes(type, n);
    *W = malloc(*bytes * (size_t)rows);
    for (int64_t r = 0; r < rows; r++) {
        size_t b2;
        uint8_t *w = random_row(type, n, &b2);
        memcpy(*W + (size_t)r * *bytes, w, *bytes);
        free(w);
    }
    const size_t gb = op->pack_bytes(n);
    uint8_t *P = aligned_alloc(64, (gb * (size_t)G + 63) / 64 * 64);
    for (int64_t g = 0; g < G; g++) op->pack(P + g * gb, *W + (size_t)(g * TD_CPU_PACK_ROWS) * *bytes, *bytes, n);
    return P;
}

Test(cpu_kernels, gemm_q8_packed_bitwise_equal_to_c_dot_q8) {
    rng_state = 31;
    td_cpu_kernels c;
    td_cpu_kernels_init(&c, TD_CPU_ISA_C);
    int compared = 0;
    for (int lvl = 0; lvl < TD_CPU_ISA_COUNT; lvl++) {
        td_cpu_kernels k;
        td_cpu_kernels_init(&k, (td_cpu_isa)lvl);
        if ((int)k.isa != lvl) continue;
        for (size_t ti = 0; ti < sizeof k_pack_types / sizeof k_pack_types[0]; ti++) {
            const int type = k_pack_types[ti];
            const td_cpu_type_ops *op = &k.type[type];
            if (!op->gemm_q8) continue;
            cr_assert(op->pack && op->pack_bytes, "%s %s: gemm_q8 without pack", td_cpu_isa_name(k.isa),
                      td_type_name(type));
            const int64_t B = td_type_get(type)->block_size;
            const int64_t lens[] = {B, 3 * B, 8 * B, 11 * B};
            const int64_t Ts[] = {1, 2, 3, 5, 8};
            for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
                for (size_t tj = 0; tj < sizeof Ts / sizeof Ts[0]; tj++) {
                    const int64_t n = lens[li], T = Ts[tj], G = 5, rows = G * TD_CPU_PACK_ROWS, ns = n / 32;
                    size_t bytes;
                    uint8_t *W, *P = random_packed(op, type, n, G, &W, &bytes);
                    float *x = malloc((size_t)(T * n) * sizeof *x), *d = malloc((size_t)(T * ns) * sizeof *d);
                    float *d16 = malloc((size_t)(2 * T * ns) * sizeof *d16);
                    float *d32 = malloc((size_t)(T * ns) * sizeof *d32);
                    int8_t *q = malloc((size_t)(T * n));
                    for (int64_t i = 0; i < T * n; i++) x[i] = (float)(urnd() * pow(10.0, (double)(i % 7) - 3));
                    for (int64_t t = 0; t < T; t++)
                        td_cpu_quantize_act(B == 256 ? TD_CPU_ACT_Q8_K : TD_CPU_ACT_Q8_0, x + t * n, n, q + t * n,
                                            d + t * ns, d16 + 2 * t * ns, d32 + t * ns, NULL);
                    float *bias = malloc((size_t)rows * sizeof *bias), *y = malloc((size_t)(T * rows) * sizeof *y);
                    for (int64_t r = 0; r < rows; r++) bias[r] = (float)urnd();
                    for (int with_bias = 0; with_bias < 2; with_bias++) {
                        const td_cpu_xq8 xq = {q, d, d16, d32};
                        op->gemm_q8(P, G, &xq, n, T, y, rows, with_bias ? bias : NULL);
                        for (int64_t t = 0; t < T; t++)
                            for (int64_t r = 0; r < rows; r++) {
                                const td_cpu_xq8 xt = {q + t * n, d + t * ns, d16 + 2 * t * ns, d32 + t * ns};
                                const float want = c.type[type].dot_q8(W + (size_t)r * bytes, &xt, n) +
                                                   (with_bias ? bias[r] : 0.0f);
                                const float got = y[t * rows + r];
                                uint32_t bw, bg;
                                memcpy(&bw, &want, 4), memcpy(&bg, &got, 4);
                                if (bw != bg)
                                    cr_assert_fail("%s gemm_q8_%s n = %lld T = %lld, row %lld token %lld%s: got %.9g "
                                                   "(0x%08x), c dot_q8 gives %.9g (0x%08x)",
                                                   td_cpu_isa_name(k.isa), td_type_name(type), (long long)n,
                                                   (long long)T, (long long)r, (long long)t,
                                                   with_bias ? " (bias)" : "", (double)got, bg, (double)want, bw);
                                compared++;
                            }
                    }
                    free(W), free(P), free(x), free(d), free(d16), free(d32), free(q), free(bias), free(y);
                }
        }
    }
    if (!compared) cr_skip_test("no packed act-q8 kernel at any level this CPU runs");
}

/* ------------------------------------------------------------------------ */
/* Native products on integers (gemv_x32, cpu_kernels.h td_cpu_x32; Q8_0,
 * Q4_K): each block of x held to 2^-30 of its largest |x|, block sums
 * exact, blocks summed in double. Bound, derived from that and not from the
 * kernel: per block j 2^(e_j - 31) Σ|w| (X rounded to the nearest integer,
 * 2^-s = 2^(e-30), w the exactly decoded weights), the double arithmetic's
 * 2 (nb + 2) 2^-53 M, and the final f32 rounding, half an ulp of the exact
 * value. A lost correction, digit, minimum term or block is O(M), far
 * above; the bound is also far below what an f32 sum may be off. */

static double x32_bound(int type, const uint8_t *w, const float *x, int64_t n, long double exact, double mass) {
    double *wd = malloc((size_t)n * sizeof *wd);
    td_err err;
    cr_assert_eq(td_decode_row_f64(type, w, wd, n, &err), TD_OK, "%s", err.msg);
    double b = 0;
    for (int64_t j = 0; j < n / 32; j++) {
        double m = 0, sw = 0;
        for (int i = 0; i < 32; i++) {
            m = fmax(m, fabs((double)x[32 * j + i]));
            sw += fabs(wd[32 * j + i]);
        }
        if (m == 0) continue;
        int e;
        (void)frexp(m, &e);
        b += ldexp(1.0, e - 31) * sw;
    }
    free(wd);
    return b + 0x1p-53 * mass * (double)(n / 32 + 2) * 2 + fabs((double)exact) * 0x1p-24 + 0x1p-149;
}

static const int k_x32_types[] = {TD_TYPE_Q8_0, TD_TYPE_Q4_K};

Test(cpu_kernels, gemv_x32_within_the_integer_bound) {
    rng_state = 41;
    td_cpu_kernels k;
    td_cpu_kernels_init(&k, TD_CPU_ISA_AVX512VNNI);
    if (!k.prep_x32) cr_skip_test("no native integer kernel at any level this CPU runs");
    int compared = 0, tighter = 0;
    for (size_t ti = 0; ti < sizeof k_x32_types / sizeof k_x32_types[0]; ti++) {
        const int type = k_x32_types[ti];
        const td_cpu_type_ops *op = &k.type[type];
        cr_assert(op->gemv_x32 && op->pack && op->pack_bytes, "%s: no gemv_x32 with its packing",
                  td_type_name(type));
        const int64_t B = td_type_get(type)->block_size;
        const int64_t lens[] = {B, 3 * B, 8 * B, 11 * B, B >= 256 ? 16 * B : 128 * B};
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
            for (int pat = 0; pat < 6; pat++) {
                const int64_t n = lens[li], G = 3, rows = G * TD_CPU_PACK_ROWS, nb = n / 32;
                size_t bytes;
                uint8_t *W, *P = random_packed(op, type, n, G, &W, &bytes);
                float *x = malloc((size_t)n * sizeof *x);
                for (int64_t i = 0; i < n; i++) {
                    const double u = urnd();
                    switch (pat) {
                    case 0: x[i] = (float)(u * pow(10.0, (double)(i % 7) - 3)); break; // decades inside a block
                    case 1: x[i] = (float)(i % 32 == 5 ? u * 1e6 : u * 1e-3); break;   // one outlier per block
                    case 2: x[i] = (i / 32) % 2 ? 0.0f : (float)u; break;              // whole blocks of zeros
                    case 3: x[i] = (float)(u * 0x1p-140); break;                       // subnormals
                    case 4: x[i] = (float)(u * 1e30); break;                           // large
                    default: x[i] = (float)u * (float)(rnd() % 3 ? 1 : 0); break;      // scattered zeros
                    }
                }
                int8_t *q = malloc((size_t)(4 * n));
                double *sc = malloc((size_t)nb * sizeof *sc), *corr = malloc((size_t)nb * sizeof *corr);
                cr_assert_eq(k.prep_x32(x, n, q, sc, corr), 1, "pattern %d: a finite row refused", pat);
                const td_cpu_x32 xt = {q, sc, corr};
                float *y = malloc((size_t)rows * sizeof *y), *yb = malloc((size_t)rows * sizeof *yb);
                float *bias = malloc((size_t)rows * sizeof *bias);
                for (int64_t r = 0; r < rows; r++) bias[r] = (float)urnd();
                op->gemv_x32(P, G, &xt, n, y, NULL);
                op->gemv_x32(P, G, &xt, n, yb, bias);
                for (int64_t r = 0; r < rows; r++) {
                    const uint8_t *w = W + (size_t)r * bytes;
                    long double exact;
                    double mass;
                    oracle(type, w, x, n, &exact, &mass);
                    const double err = fabs((double)((long double)y[r] - exact));
                    const double bound = x32_bound(type, w, x, n, exact, mass);
                    if (!(err <= bound)) {
                        print_inputs("gemv_x32 over its bound", type, w, bytes, x, n);
                        cr_assert_fail("gemv_x32_%s n = %lld pattern %d row %lld: %.9g, exact %.12Lg, error %.3g > "
                                       "bound %.3g",
                                       td_type_name(type), (long long)n, pat, (long long)r, (double)y[r], exact, err,
                                       bound);
                    }
                    // an f32 sum of the same terms may be off by up to ~n 2^-24 M
                    tighter += bound < 0x1p-24 * (double)n * mass;
                    const float want = y[r] + bias[r];
                    cr_assert_eq(memcmp(&want, &yb[r], 4), 0, "row %lld: with bias %a, without bias + bias %a",
                                 (long long)r, (double)yb[r], (double)want);
                    compared++;
                }
                free(W), free(P), free(x), free(q), free(sc), free(corr), free(y), free(yb), free(bias);
            }
    }
    cr_assert_gt(compared, 0);
    cr_assert_gt(tighter, compared / 2, "the bound was not tighter than an f32 sum's for most rows (%d of %d)",
                 tighter, compared);
}

/* a row with NaN or an infinity is refused (the f32 kernels take it) */
Test(cpu_kernels, prep_x32_refuses_non_finite_rows) {
    td_cpu_kernels k;
    td_cpu_kernels_init(&k, TD_CPU_ISA_AVX512VNNI);
    if (!k.prep_x32) cr_skip_test("no native integer Q8_0 kernel at any level this CPU runs");
    float x[64];
    int8_t q[256];
    double sc[2], corr[2];
    const float bad[] = {NAN, INFINITY, -INFINITY};
    for (int b = 0; b < 3; b++)
        for (int at = 0; at < 64; at += 21) {
            for (int i = 0; i < 64; i++) x[i] = (float)i - 30.0f;
            cr_assert_eq(k.prep_x32(x, 64, q, sc, corr), 1);
            x[at] = bad[b];
            cr_assert_eq(k.prep_x32(x, 64, q, sc, corr), 0, "%g at %d accepted", (double)bad[b], at);
        }
    // the largest finite values fit: 2^30 X's digits
    for (int i = 0; i < 64; i++) x[i] = i % 2 ? 3.4e38f : -3.4e38f;
    cr_assert_eq(k.prep_x32(x, 64, q, sc, corr), 1);
}

/* ------------------------------------------------------------------------ */
/* The thread pool: every task of every job runs once, within its own job,  */
/* also when workers wake late (more threads than cores: a worker can miss  */
/* whole jobs, and the caller must not wait for one that never started)     */

#include <stdatomic.h>

#include "pool.h"

typedef struct pool_case {
    int job;              // this job's number
    atomic_int *owner;    // the job number each slot of the table last saw
    atomic_int count[65]; // runs of each task in this job (one slot past the largest job)
    atomic_int worker_in; // a worker has started a task of this job
} pool_case;

static void pool_count_task(void *ctx, int64_t task, int th) {
    pool_case *c = ctx;
    // a worker's task is slow and the caller waits (a while) for one to
    // start, so a caller that returned before its workers finished is seen
    volatile unsigned spin = 0;
    if (th) {
        atomic_store(&c->worker_in, 1);
        for (int i = 0; i < 20000; i++) spin += (unsigned)i;
    } else {
        for (int i = 0; i < 1000 && !atomic_load(&c->worker_in); i++) sched_yield();
    }
    atomic_fetch_add(&c->count[task], 1);
    atomic_store(&c->owner[task], c->job);
}

Test(cpu_pool, every_task_runs_once_in_its_own_job) {
    const int threads[] = {2, 5};
    atomic_int owner[64];
    for (size_t ti = 0; ti < sizeof threads / sizeof threads[0]; ti++) {
        td_cpu_pool *p = td_cpu_pool_new(threads[ti]);
        cr_assert_not_null(p);
        cr_assert_eq(td_cpu_pool_threads(p), threads[ti]);
        for (int job = 0; job < 500; job++) {
            // a fresh context on the stack each job: a task of a finished
            // job run late would write into a dead frame (ASan) or count twice
            pool_case c = {.job = job, .owner = owner};
            const int64_t n = 1 + job % 64;
            for (int64_t t = 0; t < 65; t++) atomic_init(&c.count[t], 0);
            for (int64_t t = 0; t < 64; t++) atomic_init(&owner[t], -1);
            td_cpu_pool_run(p, n, pool_count_task, &c);
            for (int64_t t = 0; t < 65; t++) {
                cr_assert_eq(atomic_load(&c.count[t]), t < n, "%d threads, job %d: task %lld of %lld ran %d times",
                             threads[ti], job, (long long)t, (long long)n, atomic_load(&c.count[t]));
                cr_assert(t >= n || atomic_load(&owner[t]) == job,
                          "%d threads, job %d: task %lld finished outside its job", threads[ti], job, (long long)t);
            }
            // nothing may touch the job after td_cpu_pool_run returned
            for (int64_t t = 0; t < 64; t++) atomic_store(&owner[t], -2);
            if (job % 100 == 0) sched_yield();
            for (int64_t t = 0; t < 64; t++)
                cr_assert_eq(atomic_load(&owner[t]), -2, "%d threads, job %d: task %lld ran after its job returned",
                             threads[ti], job, (long long)t);
        }
        td_cpu_pool_free(p);
    }
}
