/* tapdiff reference forward: the ONE implementation behind "ref" (double) and
 * "ref32" (float). Not a header for other code: reference_f64.c and
 * reference_f32.c each define the arithmetic type `real` and the libm
 * functions of that precision, then #include this file once.
 *
 * This is the algorithmic reference, the oracle the other arms are measured
 * against, and it refuses to be anything else: plain scalar C that follows
 * ../shared/spec/primitives.md and arch-{llama,qwen3,qwen3moe,qwen3next,qwen4exp}.md line by
 * line. No SIMD, no blocking, no fused kernels; every sum runs in index
 * order, so a run is bit-reproducible. Threads (--threads) only split a
 * matmul's output rows, and attention's (token, head) pairs, into contiguous
 * ranges, one per worker: each output is still computed by one worker in the
 * sequential order, so any thread count gives the same bits. Weights stay in the mapped file:
 * a weight row is decoded into one scratch row when it is needed and, for a
 * prefill of T tokens, used for all T tokens before the next row is decoded.
 * No weight matrix is ever copied, so memory is the mapping + activations +
 * the KV cache.
 *
 * The includer defines:
 *   real                     double or float
 *   REAL_SUFFIX              f64 / f32 (suffix of the exported primitives)
 *   REAL_DTYPE               TD_DT_F64 / TD_DT_F32 (dtype of every float tap)
 *   REAL_DECODE_ROW          td_tensor_decode_row_f64 / _f32
 *   REAL_DECODE_ROW_AS       td_tensor_decode_row_as_f64 / _f32
 *   R_SQRT R_EXP R_LOG R_POW R_COS R_SIN R_FLOOR R_CEIL   libm in that precision
 *   REF_NAME REF_PRECISION   "ref" "f64" / "ref32" "f32"
 *   REAL_IS_FLOAT            defined by the f32 build only
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blocks.h"
#include "forward.h"
#include "qsa_rank.h"
#include "ref_pool.h"
#include "reference.h"
#include "td_config.h"

#define REF_CAT_(a, b) a##_##b
#define REF_CAT(a, b) REF_CAT_(a, b)
/* The profile's rounding formulas in this precision (backends/profile.h). */
#ifdef REAL_IS_FLOAT
#define ACT_ROUND td_act_round_f32
#define F16_ROUND td_f16_round_f32
#define TIE_F16 td_act_tie_f16_f32
#else
#define ACT_ROUND td_act_round_f64
#define F16_ROUND td_f16_round_f64
#define TIE_F16 td_act_tie_f16_f64
#endif
/* FN(rmsnorm) -> td_ref_rmsnorm_f64 / td_ref_rmsnorm_f32 */
#define FN(name) REF_CAT(td_ref_##name, REAL_SUFFIX)

/* ===================================================================== */
/* Primitives (primitives.md §1-§5)                                      */
/* ===================================================================== */

static real dot(const real *a, const real *b, int64_t n) {
    real s = 0;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* One step of ggml-vulkan's f16 accumulator as lavapipe runs it: the
 * product rounded to f16, then the sum rounded to f16 (its fma() on f16
 * values is split in two; measured: a fused step leaves the arm 45x further
 * from the oracle at blk.0.attn_q of qwen3moe-q4_k, 40 tokens). Computed in
 * f64 in ref and ref32 alike (products of f16 values and sums of f16 values
 * are exact there; the f32 hop inside td_act_round_f64 is the device's own),
 * so both arms round the same sums the same way. */
static inline double mul_add_f16(double a, double b, double acc) {
    return td_f16_round_trip_f64(td_f16_round_trip_f64(a * b) + acc);
}

/* dot with an f16 accumulator (profile acc-f16) in ggml-vulkan's tiled
 * order: k in groups of g (2 for quantized weights), each group from its
 * last element down to its first (its dot_product() nests the fma()s that
 * way), groups in increasing k. Zero padding past n adds nothing. */
real FN(dot_acc16)(const real *a, const real *b, int64_t n, int64_t g) {
    double s = 0;
    for (int64_t i0 = 0; i0 < n; i0 += g) {
        const int64_t i1 = i0 + g < n ? i0 + g : n;
        for (int64_t i = i1 - 1; i >= i0; i--) s = mul_add_f16((double)a[i], (double)b[i], s);
    }
    return (real)s;
}

void FN(rmsnorm)(real *out, const real *x, const real *w, real eps, int64_t n) {
    real ss = 0;
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    // eps goes inside the square root, added to the MEAN of squares (§1)
    const real rms = R_SQRT(ss / (real)n + eps);
    for (int64_t i = 0; i < n; i++) out[i] = w[i] * (x[i] / rms);
}

void FN(softmax)(real *out, const real *x, int64_t n) {
    // subtract the max so that exp never overflows (inputs of 1000 are fine)
    real max = x[0];
    for (int64_t i = 1; i < n; i++)
        if (x[i] > max) max = x[i];
    real sum = 0;
    for (int64_t i = 0; i < n; i++) {
        out[i] = R_EXP(x[i] - max);
        sum += out[i];
    }
    for (int64_t i = 0; i < n; i++) out[i] /= sum;
}

void FN(swiglu)(real *out, const real *gate, const real *up, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const real g = gate[i];
        out[i] = g / (1 + R_EXP(-g)) * up[i]; // silu(g) * up
    }
}

/* YaRN correction dimension for a number of rotations beta (§2.3). */
static real yarn_corr_dim(real beta, const td_ref_rope *c) {
    const real R = (real)c->R;
    return R * R_LOG((real)c->n_ctx_orig / (2 * (real)M_PI * beta)) / (2 * R_LOG((real)c->base));
}

/* YaRN's ramp for pair i between the correction dims lo and hi
 * (ext_factor = 1). */
static real yarn_mix(int64_t i, real lo, real hi) {
    real span = hi - lo;
    if (span < (real)0.001) span = (real)0.001;
    real r = ((real)i - lo) / span;
    if (r < 0) r = 0;
    if (r > 1) r = 1;
    return 1 - r;
}

/* The angle of pair i under rope-f32-mul / rope-f32-pow: the arm forms it
 * in f32 (ggml's rope_yarn: the frequency factor, scale and YaRN's mix are
 * f32 operations on the f32 angle), and the rounding of a large angle to
 * f32 is itself an error of up to pos * 2^-24 radians, which grows with the
 * position past what ref32's own f32 angle draws at random. */
static real angle_f32(const td_ref_rope *c, int64_t pos, int64_t i, const real *ff, int yarn, real lo, real hi) {
    float extrap = td_rope_angle_f32((td_rope_angle)c->angle, pos, i, c->R, c->base);
    if (ff) extrap = extrap / (float)ff[i];
    const float fs = c->scaling == TD_ROPE_SCALING_NONE ? 1.0f : (float)c->freq_scale;
    const float interp = fs * extrap;
    if (!yarn) return (real)interp;
    const float mix = (float)yarn_mix(i, lo, hi);
    return (real)(interp * (1 - mix) + extrap * mix);
}

/* The cosine and sine pair i rotates by. Under rope-trig the control
 * (ref32) turns by the device's declared bound (its sign drawn) on top of the
 * angle (cos(theta + d), sin(theta + d) formed in f64 from its own f32
 * values, so that d is not lost to the rounding of theta): the budget then
 * holds the device's honest error and the oracle (f64) stays exact. */
static void trig(const td_ref_rope *c, int64_t pos, int64_t i, real theta, real *cs, real *sn) {
    *cs = R_COS(theta), *sn = R_SIN(theta);
#ifdef REAL_IS_FLOAT
    if (c->trig_u > 0) {
        const double d = td_rope_trig_offset_u(c->trig_u, pos, i, (double)theta);
        const double c0 = (double)*cs, s0 = (double)*sn, cd = cos(d), sd = sin(d);
        *cs = (real)(c0 * cd - s0 * sd);
        *sn = (real)(s0 * cd + c0 * sd);
    }
#else
    (void)c, (void)pos, (void)i;
#endif
}

void FN(rope)(real *x, int64_t pos, const td_ref_rope *c, const real *ff, int64_t n_heads) {
    // x: (n_heads, D), rotated in place; only the first R dims of each head
    const int64_t D = c->D, R = c->R, half = c->R / 2;
    const int yarn = c->scaling == TD_ROPE_SCALING_YARN;
    const real freq_scale = c->scaling == TD_ROPE_SCALING_NONE ? 1 : (real)c->freq_scale;
    real m = (real)c->attn_factor;
    real lo = 0, hi = 0;
    if (yarn) {
        const real factor = 1 / freq_scale;
        if (factor > 1) m *= 1 + (real)0.1 * R_LOG(factor);
        lo = R_FLOOR(yarn_corr_dim(32, c)); // beta_fast
        if (lo < 0) lo = 0;
        hi = R_CEIL(yarn_corr_dim(1, c)); // beta_slow
        if (hi > (real)(R - 1)) hi = (real)(R - 1);
    }
    for (int64_t i = 0; i < half; i++) {
        real theta;
        if (c->angle) {
            theta = angle_f32(c, pos, i, ff, yarn, lo, hi);
        } else {
            // the exponent uses R, not D
            const real omega = R_POW((real)c->base, -(real)(2 * i) / (real)R);
            real extrap = (real)pos * omega;
            if (ff) extrap /= ff[i];
            const real interp = freq_scale * extrap;
            theta = interp;
            if (yarn) {
                const real mix = yarn_mix(i, lo, hi);
                theta = interp * (1 - mix) + extrap * mix;
            }
        }
        real cs, sn;
        trig(c, pos, i, theta, &cs, &sn);
        for (int64_t h = 0; h < n_heads; h++) {
            real *xh = x + h * D;
            // NORM pairs adjacent values; NEOX pairs the two halves of the rotated span
            const int64_t a = c->type == TD_ROPE_NORM ? 2 * i : i;
            const int64_t b = c->type == TD_ROPE_NORM ? 2 * i + 1 : i + half;
            const real u = xh[a], v = xh[b];
            xh[a] = m * (u * cs - v * sn);
            xh[b] = m * (u * sn + v * cs);
        }
    }
}

/* Attention of the (token, head) pairs i = t*H + h in [i0, i1), each pair on
 * its own: its scores in att, its output row in out, nothing shared. So
 * splitting the pairs between threads cannot change a bit. probs16: the
 * probabilities rounded to f16 (profile attn-f16). Both sums stay in the
 * working precision under acc-f16 too: llama.cpp asks for f32 accumulation
 * of the scores, and lavapipe's f16-accumulating context tile measures as
 * f32 (blk.0.attn_ctx of stories260K, 8 tokens: the f32 model equals the arm
 * to ref32's error, an f16 accumulator is 21x further). */
static void attention_range(real *out, const real *q, const real *k, const real *v, const int64_t *pos, real *att,
                            int64_t H, int64_t Hkv, int64_t D, int64_t i0, int64_t i1, int probs16,
                            const int32_t *sel, int64_t sel_w, int64_t tie_call) {
    // out, q: (T, H*D); k, v: (n_kv, Hkv*D), row s = position s; att: (pos[t]+1)
    // sel (T, sel_w): when given, token t attends only to its listed positions
    // (ascending, -1 pads: a QSA selection), summed in that order
    const real scale = 1 / R_SQRT((real)D);
    for (int64_t i = i0; i < i1; i++) {
        const int64_t t = i / H, h = i % H;
        int64_t n = pos[t] + 1; // causal: positions 0..pos[t], the token itself included
        const int32_t *st = sel ? sel + t * sel_w : NULL;
        if (st)
            for (n = 0; n < sel_w && st[n] >= 0;) n++;
#define ATT_POS(j) (st ? (int64_t)st[j] : (j))
        const int64_t g = td_ref_gqa_kv_head(h, H, Hkv);
        const real *qh = q + (t * H + h) * D;
        for (int64_t s = 0; s < n; s++) att[s] = scale * dot(qh, k + (ATT_POS(s) * Hkv + g) * D, D);
        FN(softmax)(att, att, n);
        if (probs16 && tie_call >= 0) // a ties session: probability s of pair i is element (i, s)
            for (int64_t s = 0; s < n; s++) att[s] = TIE_F16(tie_call, i * ((int64_t)1 << 32) + s, att[s]);
        else if (probs16)
            F16_ROUND(att, att, n);
        real *oh = out + (t * H + h) * D;
        for (int64_t d = 0; d < D; d++) oh[d] = 0;
        for (int64_t s = 0; s < n; s++) {
            const real *vs = v + (ATT_POS(s) * Hkv + g) * D;
            for (int64_t d = 0; d < D; d++) oh[d] += att[s] * vs[d];
        }
#undef ATT_POS
    }
}

/* x rounded to f16 (through f32, as the device holds it), in f64: products
 * and sums of two f16 values are exact there, so both precisions round the
 * same values. */
static inline double f16r(double x) { return td_f16_round_trip_f64(x); }

/* A row of a butterfly over n values (power of two): each value plus its
 * partner at distance s, for s in the order given; every position ends with
 * the same sum, returned from position 0. f16: each sum rounded to f16. */
static real fa_butterfly(real *x, int64_t n, int down, int f16) {
    real t[32];
    for (int64_t s = down ? n / 2 : 1; down ? s > 0 : s < n; s = down ? s / 2 : s * 2) {
        for (int64_t i = 0; i < n; i++) t[i] = f16 ? (real)f16r((double)x[i] + (double)x[i ^ s]) : x[i] + x[i ^ s];
        memcpy(x, t, (size_t)n * sizeof *x);
    }
    return x[0];
}

/* The cells of the cache a query at position pos_t sees, as n_kv flags:
 * its causal prefix, or (sel_row not NULL) its QSA selection, sel_w indices
 * ending at the first negative one. */
static void fa_visible(char *ok, int64_t n_kv, int64_t pos_t, const int32_t *sel_row, int64_t sel_w) {
    for (int64_t s = 0; s < n_kv; s++) ok[s] = !sel_row && s <= pos_t;
    if (sel_row)
        for (int64_t j = 0; j < sel_w && sel_row[j] >= 0; j++) ok[sel_row[j]] = 1;
}

/* Flash attention of the (token, head) pairs [i0, i1) as ggml-vulkan's
 * scalar shader runs it (profile fa-acc-f16, geometry g; flash_attn.comp and
 * flash_attn_split_k_reduce.comp of the peer revision): q already holds
 * f16(q*scale), k/v the f16 cache. Per column thread c (columns s with
 * s % cols == c): scores summed in f32 from d_split partials (each over
 * its vec4s, a vec4 from its last lane down), a butterfly joining them;
 * per block of bc columns the thread's running max M (the block's max plus
 * 3*0.6931, keeping probabilities inside f16), its f32 sum L and its f16
 * output O rescaled by f16(e^(Mold-M)); p = f16(e^(s-M)); O += p*v with the
 * product and the sum each rounded to f16. The threads are then rescaled to
 * the common max and summed (f32 L, f16 O) by subgroup butterflies and the
 * groups in order; the output is O*f16(1/L) in f16, or with split-k each
 * split's O, L, M combined in f32 by the reduce shader. Masked columns add
 * exact zeros, so only the valid ones are visited. ws: fa_ws_size(g, D)
 * values, ok: n_kv flags of scratch. */
static int64_t fa_ws_size(const td_fa_geom *g, int64_t D) {
    return 3 * g->cols + g->cols * D + g->bc / g->cols + g->split_k * (D + 2) + g->sg;
}

static void fa_range(real *out, const real *q, const real *k, const real *v, const int64_t *pos, real *ws,
                     char *ok, const td_fa_geom *g, int64_t H, int64_t Hkv, int64_t D, int64_t n_kv, int64_t i0,
                     int64_t i1, const int32_t *sel, int64_t sel_w, int64_t tie_call) {
    const real NEG = (real)(-FLT_MAX / 2), OFF = (real)(3.0f * 0.6931f);
    const int64_t C = g->cols, cpt = g->bc / C, K = g->split_k;
    real *M = ws, *L = M + C, *tmp = L + C, *O = tmp + C, *sv = O + C * D, *Os = sv + cpt,
         *Ls = Os + K * D, *Ms = Ls + K, *Lk = Ms + K;
    for (int64_t i = i0; i < i1; i++) {
        const int64_t t = i / H, h = i % H, kh = td_ref_gqa_kv_head(h, H, Hkv);
        const real *qh = q + (t * H + h) * D;
        fa_visible(ok, n_kv, pos[t], sel ? sel + t * sel_w : NULL, sel_w);
        for (int64_t sp = 0; sp < K; sp++) {
            const int64_t c0 = sp * g->split_kv, c1 = (sp + 1) * g->split_kv < n_kv ? (sp + 1) * g->split_kv : n_kv;
            for (int64_t c = 0; c < C; c++) {
                M[c] = NEG, L[c] = 0;
                for (int64_t d = 0; d < D; d++) O[c * D + d] = 0;
            }
            for (int64_t j = c0 / g->bc; j * g->bc < c1; j++)
                for (int64_t c = 0; c < C; c++) {
                    real mx = NEG;
                    int any = 0;
                    for (int64_t cc = 0; cc < cpt; cc++) {
                        const int64_t s = j * g->bc + cc * C + c;
                        if (s >= c1 || !ok[s]) continue;
                        const real *ks = k + (s * Hkv + kh) * D;
                        real part[8];
                        for (int64_t dt = 0; dt < g->d_split; dt++) {
                            real acc = 0;
                            for (int64_t e = 4 * dt; e < D; e += 4 * g->d_split)
                                for (int64_t x = 3; x >= 0; x--) acc += qh[e + x] * ks[e + x];
                            part[dt] = acc;
                        }
                        sv[cc] = fa_butterfly(part, g->d_split, 1, 0);
                        if (sv[cc] > mx) mx = sv[cc];
                        any = 1;
                    }
                    if (any) mx += OFF; // in f32 the offset vanishes into -FLT_MAX/2
                    const real mold = M[c];
                    M[c] = mx > mold ? mx : mold;
                    const real em = R_EXP(mold - M[c]);
                    L[c] = em * L[c];
                    const double em16 = f16r((double)em);
                    for (int64_t d = 0; d < D; d++) O[c * D + d] = (real)f16r(em16 * (double)O[c * D + d]);
                    for (int64_t cc = 0; cc < cpt; cc++) {
                        const int64_t s = j * g->bc + cc * C + c;
                        if (s >= c1 || !ok[s]) continue;
                        // a ties session: probability s of pair i is element (i, s), as attn-f16's
                        const real p = TIE_F16(tie_call, i * ((int64_t)1 << 32) + s, R_EXP(sv[cc] - M[c]));
                        L[c] += p;
                        const real *vs = v + (s * Hkv + kh) * D;
                        for (int64_t d = 0; d < D; d++)
                            O[c * D + d] = (real)mul_add_f16((double)p, (double)vs[d], (double)O[c * D + d]);
                    }
                }
            // the threads at the common max, then summed
            real mx = NEG;
            for (int64_t c = 0; c < C; c++) mx = M[c] > mx ? M[c] : mx;
            for (int64_t c = 0; c < C; c++) {
                const real em = R_EXP(M[c] - mx);
                L[c] = em * L[c];
                const double em16 = f16r((double)em);
                for (int64_t d = 0; d < D; d++) O[c * D + d] = (real)f16r(em16 * (double)O[c * D + d]);
            }
            const int64_t G = g->group;
            real lsum = 0;
            for (int64_t b = 0; b < C; b += G) {
                const real x = fa_butterfly(L + b, G, 0, 0);
                lsum = b ? lsum + x : x;
            }
            real *os = Os + sp * D;
            for (int64_t d = 0; d < D; d++) {
                real osum = 0;
                for (int64_t b = 0; b < C; b += G) {
                    for (int64_t c = 0; c < G; c++) tmp[c] = O[(b + c) * D + d];
                    const real x = fa_butterfly(tmp, G, 0, 1);
                    osum = b ? (real)f16r((double)osum + (double)x) : x;
                }
                os[d] = osum;
            }
            Ls[sp] = lsum, Ms[sp] = mx;
        }
        real *oh = out + (t * H + h) * D;
        if (K == 1) { // O * f16(1/L), in f16
            const double r16 = f16r(Ls[0] == 0 ? 0.0 : (double)(1 / Ls[0]));
            for (int64_t d = 0; d < D; d++) {
                double o = f16r((double)Os[d] * r16);
                oh[d] = (real)(o > 65504 ? 65504 : o < -65504 ? -65504 : o);
            }
            continue;
        }
        // split-k reduce (f32): the max, L by a tree over sg threads, O in split order
        real mm = -(real)INFINITY;
        for (int64_t sp = 0; sp < K; sp++) mm = Ms[sp] > mm ? Ms[sp] : mm;
        for (int64_t tt = 0; tt < g->sg; tt++) {
            real acc = 0;
            for (int64_t sp = tt; sp < K; sp += g->sg) acc += R_EXP(Ms[sp] - mm) * Ls[sp];
            Lk[tt] = acc;
        }
        for (int64_t s = g->sg / 2; s > 0; s /= 2)
            for (int64_t tt = 0; tt < s; tt++) Lk[tt] += Lk[tt + s];
        const real linv = Lk[0] == 0 ? 0 : 1 / Lk[0];
        for (int64_t d = 0; d < D; d++) {
            real o = 0;
            for (int64_t sp = 0; sp < K; sp++) o += R_EXP(Ms[sp] - mm) * Os[sp * D + d];
            oh[d] = o * linv;
        }
    }
}

/* One score of ggml-cpu's flash attention: ggml_vec_dot_f16 of f16 Q and K
 * rows (products exact in f32) as its AVX2 build sums them: 32 at a time
 * into four 8-lane f32 accumulators, which are then added pairwise (0+2,
 * 1+3, then 0+1), each lane to the one 4 above it, and the four left by two
 * horizontal adds; the last D % 32 products added to that in f64; the
 * result an f32. */
static real fa_cpu_dot(const real *q, const real *k, int64_t D) {
    const int64_t np = D & ~(int64_t)31;
    double sum = 0;
    if (np) {
        real acc[4][8] = {{0}};
        for (int64_t i = 0; i < np; i += 32)
            for (int j = 0; j < 4; j++)
                for (int l = 0; l < 8; l++) acc[j][l] += q[i + 8 * j + l] * k[i + 8 * j + l];
        real t[4];
        for (int l = 0; l < 8; l++) acc[0][l] += acc[2][l], acc[1][l] += acc[3][l];
        for (int l = 0; l < 8; l++) acc[0][l] += acc[1][l];
        for (int l = 0; l < 4; l++) t[l] = acc[0][l] + acc[0][l + 4];
        sum = (double)((t[0] + t[1]) + (t[2] + t[3]));
    }
    for (int64_t i = np; i < D; i++) sum += (double)q[i] * (double)k[i];
    return (real)sum;
}

/* Flash attention of the (token, head) pairs [i0, i1) as ggml-cpu's
 * one-chunk kernel runs it (profile fa-cpu; ops.cpp
 * ggml_compute_forward_flash_attn_ext_f16_one_chunk of the peer revision):
 * q holds f16(q), unscaled, k/v the f16 cache. The visible cells in cache
 * order (masked ones are skipped); each score fa_cpu_dot times the f32
 * scale; a score above the running max M makes it the max and rescales the
 * f16 output O by e^(Mold-M), every element f16(O*ms); then O = f16(O +
 * v*p) with p = e^(s-M) (1 for the new max), the product and sum one fused
 * f32 step in the AVX2 build, and the f32 sum S = S*ms + p; at the end O in
 * f32 times 1/S. Unlike ggml-vulkan's shader the probabilities stay f32.
 * ok: n_kv flags of scratch. In a ties session (tie_call >= 0) the
 * accumulator's roundings are searched ties (profile.h): an arm's f32 O*ms
 * or fused O + v*p lies a few f32 ulps from the f64 value and can round to
 * the other f16 neighbour. Element (i, n, kind, d) of the call is
 * i << 32 | ((2n + kind) * D + d), n the visible cell's index, kind 1 for
 * the rescale. The p = 1 updates stay plain: O + v of two f16 values is
 * exact on both sides, so a midpoint there is no tie, and at distance 0 it
 * would take the search's first slots. */
static void fa_cpu_range(real *out, const real *q, const real *k, const real *v, const int64_t *pos, real *O,
                         char *ok, int64_t H, int64_t Hkv, int64_t D, int64_t n_kv, real scale, int64_t i0,
                         int64_t i1, const int32_t *sel, int64_t sel_w, int64_t tie_call) {
    for (int64_t i = i0; i < i1; i++) {
        const int64_t t = i / H, h = i % H, kh = td_ref_gqa_kv_head(h, H, Hkv);
        const real *qh = q + (t * H + h) * D;
        fa_visible(ok, n_kv, pos[t], sel ? sel + t * sel_w : NULL, sel_w);
        real M = -(real)INFINITY, S = 0;
        for (int64_t d = 0; d < D; d++) O[d] = 0;
        for (int64_t s = 0, n = 0; s < n_kv; s++) {
            if (!ok[s]) continue;
            const real sc = fa_cpu_dot(qh, k + (s * Hkv + kh) * D, D) * scale;
            const int64_t e0 = i * ((int64_t)1 << 32) + 2 * n * D;
            real ms = 1, p = 1;
            if (sc > M) {
                ms = R_EXP(M - sc);
                M = sc;
                for (int64_t d = 0; d < D; d++) O[d] = TIE_F16(tie_call, e0 + D + d, (real)((double)O[d] * (double)ms));
            } else {
                p = R_EXP(sc - M);
            }
            const real *vs = v + (s * Hkv + kh) * D;
            if (p == 1)
                for (int64_t d = 0; d < D; d++) O[d] = (real)f16r((double)O[d] + (double)vs[d]);
            else
                for (int64_t d = 0; d < D; d++)
                    O[d] = TIE_F16(tie_call, e0 + d, (real)((double)O[d] + (double)vs[d] * (double)p));
            S = S * ms + p;
            n++;
        }
        const real inv = S == 0 ? 0 : 1 / S;
        real *oh = out + (t * H + h) * D;
        for (int64_t d = 0; d < D; d++) oh[d] = O[d] * inv;
    }
}

void FN(attention)(real *out, const real *q, const real *k, const real *v, const int64_t *pos, real *att,
                   int64_t T, int64_t H, int64_t Hkv, int64_t D) {
    attention_range(out, q, k, v, pos, att, H, Hkv, D, 0, T * H, 0, NULL, 0, -1);
}

void FN(moe_route)(int32_t *topk, real *weights, const real *probs, int64_t X, int64_t K) {
    // the rule every backend shares (backends/forward.c), at this precision
    REF_CAT(td_moe_route, REAL_SUFFIX)(topk, weights, probs, X, K, 0);
}

/* ===================================================================== */
/* Backend state: config, scratch, activations, KV cache                  */
/* ===================================================================== */

/* Activations of one forward over T tokens; grown when a larger T comes. */
typedef struct ref_acts {
    int64_t cap_T;
    real *x;          // (T, E) residual stream
    real *xn;         // (T, E) normed input of the current sub-block
    real *q;          // (T, H*D)
    real *k;          // (T, Hkv*D)
    real *v;          // (T, Hkv*D)
    real *ctx;        // (T, H*D) attention output before the projection
    real *proj;       // (T, E) attn_out, then ffn_out
    real *gate;       // (T, F)
    real *up;         // (T, F)
    real *act;        // (T, F)
    real *moe_logits; // (T, X)
    real *moe_probs;  // (T, X)
    int32_t *moe_topk;// (T, K)
    real *moe_w;      // (T, K)
    real *xs;         // (T, E) inputs of the tokens routed to one expert
    real *ys;         // (T, E) that expert's outputs
    real *yk;         // (T, K, E) expert outputs in rank order
    real *logits;     // (T, V)
    int32_t *pos32;   // (T)
    int64_t *pos;     // (T)
    int32_t *route_t; // (T) token of each row of xs
    int32_t *route_j; // (T) rank slot of each row of xs
    // qwen3next (NULL elsewhere)
    real *qg;         // (T, 2*H*D) gated attention's projection: per head [q; gate]
    real *agate;      // (T, H*D) attention output gate (before the sigmoid)
    real *sh_g, *sh_u;// (T, F_sh) shared expert's gate and up, then silu(g)*u in sh_g
    real *sh_y;       // (T, E) shared expert's output
    real *sh_s;       // (T) sigmoid(w_sg . x)
    real *m;          // (T, C) GDN projection [q; k; v] before the conv
    real *z;          // (T, Hv*dk) GDN output gate
    real *ba;         // (T, 2*Hv) beta/alpha logits
    real *beta, *gam; // (T, Hv) sigmoid(beta~), log-decay gamma
    real *cq, *ck;    // (T, Hk*dk) q, k after conv + silu (cq/ck: before, qn/kn: after the L2 norm)
    real *qn, *kn;    // (T, Hk*dk)
    real *cv;         // (T, Hv*dk) v after conv + silu
    real *core;       // (T, Hv*dk) recurrence output o
    real *gated;      // (T, Hv*dk) RMSNorm(o) * silu(z)
    // qwen4exp (NULL elsewhere); hcd = hc*E, every stack stream-major
    real *rs;         // (T, hcd) the residual streams Rs
    real *hflat;      // (T, hcd) the streams normed one by one (a mixer's flat)
    real *hlam;       // (T, hc_lr) silu(W_down flat / hc)
    real *hgam;       // (T, hcd) mixer gate before its sigmoid
    real *hinj;       // (T, hc) inject of the current sub-block
    int32_t *ple_ids; // (T, Ng) n-gram context ids
    int32_t *ple_rows;// (T, Np) hashed table rows
    real *ple_p;      // (T, E) P, the concatenated rows
    real *ple_k;      // (T, hcd) key per stream, then normed
    real *ple_g;      // (T, hc) gate per stream
    real *ple_v;      // (T, E) W_value P
    real *ple_gv;     // (T, hcd) gated value per stream
    real *ple_nv;     // (T, hcd) RMSNorm(gated value): the conv input
    real *ple_cv;     // (T, hcd) conv output after silu
    real *ik;         // (T, di) raw indexer keys
    real *iq;         // (T, Hi*di) normed, rotated indexer queries
    int32_t *sel_rank;// (T, Wmax) QSA selection in rank order, -1 pads
    int32_t *sel_set; // (T, Wmax) the same positions ascending (what attention reads), -1 pads
    int64_t *sel64;   // (Wmax)
} ref_acts;

typedef struct ref_backend {
    td_backend base; // vt; first member
    const td_model *m;
    td_hparams hp;
    td_ref_rope rope;
    real *rope_ff;   // (R/2) rope_freqs factors; NULL when the model has none
    int64_t n_ctx;   // KV capacity limit in positions
    int64_t n_past;  // positions already in the cache
    int64_t kv_cap;  // positions allocated so far (grows up to n_ctx)
    real **k_cache;  // n_layer x (kv_cap, Hkv*D): post-norm, post-RoPE keys, row = position
    real **v_cache;  // n_layer x (kv_cap, Hkv*D)
    real *att;       // (n_threads, kv_cap) attention scores of one (token, head) per worker
    td_hist hist;    // last tokens consumed (hist.tokens)
    real *row;       // (n_threads, max_in) one decoded weight row per worker
    td_ref_pool *pool; // workers of matmuls and attention (threads of td_backend_params)
    int *mm_rc;        // (n_threads) each worker's status in the current matmul
    td_err *mm_err;    // (n_threads)
    real *bias;      // (max_out) one decoded bias vector
    real *normw;     // (max(E, D)) one decoded norm weight
    int64_t max_in, max_out;
    td_profile profile; // the arithmetic profile's rules (backends/profile.h)
    char profile_name[TD_PROFILE_NAME_MAX]; // its canonical spelling
    real *qin;       // (cap_qin) activations of one matmul as the profile rounds them
    int64_t cap_qin;
    real *k16, *v16; // (kv_cap, Hkv*D) cache rows as attn-f16 rounds them for one step
    // per-sequence recurrent state of GDN layers (NULL for attention layers)
    real **conv_state; // n_layer x (C, K-1): last K-1 inputs m per channel, oldest first
    real **ssm_state;  // n_layer x (Hv, dk, dk): S_h[i][j] at h*dk*dk + j*dk + i (llama.cpp's layout)
    real *vec;         // (max(E, Hv)) one decoded small vector (ssm_a, dt_bias, shared gate)
    real *vec2;        // (Hv)
    // qwen4exp (NULL elsewhere)
    td_ref_rope rope_idx; // the indexer's rotation: rope with D = d_i
    int32_t *toks;     // (kv_cap) token id of every cached position: the PLE n-gram history
    real **idx_cache;  // n_layer x (kv_cap, di): raw indexer keys of the sparse QSA layers, row = position
    real *ple_state;   // ((Kp-1)*Ng, hcd) last PLE conv inputs, oldest row first
    real *hcw, *hcw2;  // (hcd) decoded {E, hc} gammas
    real *qsa_kb;      // (cap_nb, di) pooled, normed, rotated block keys of one step
    real *qsa_sc;      // (T, cap_nb) block scores of one step
    int64_t cap_nb, cap_sc;
    // > 0 while the experts of a MoE step run: their matmuls see only the
    // rows routed to them, but the arm picks its matmul path by the step's
    // tokens (ggml-vulkan's MUL_MAT_ID), so mm-f16@N judges this count
    int64_t mm_step_T;
    ref_acts a;
} ref_backend;

/* The window of an f16 rounding that reads a tap out of RoPE in a step
 * whose positions reach pos_max (td_act_ties_rope_near). The largest angle
 * is pair 0's (omega 1): pos times the frequency scale (YaRN mixes the
 * scaled and the unscaled angle: neither is exceeded), over the smallest
 * frequency factor. */
static double rope_near(const ref_backend *r, int64_t pos_max) {
    double theta = (double)pos_max;
    if (r->rope.scaling != TD_ROPE_SCALING_NONE && r->rope.freq_scale > 1) theta *= r->rope.freq_scale;
    if (r->rope_ff) {
        double ff = 1;
        for (int64_t i = 0; i < r->rope.R / 2; i++) ff = fmin(ff, fabs((double)r->rope_ff[i]));
        if (ff > 0) theta /= ff;
    }
    return td_act_ties_rope_near(&r->profile, theta);
}

static int64_t max3(int64_t a, int64_t b, int64_t c) {
    int64_t m = a > b ? a : b;
    return m > c ? m : c;
}

static void acts_free(ref_acts *a) {
    free(a->x), free(a->xn), free(a->q), free(a->k), free(a->v), free(a->ctx), free(a->proj);
    free(a->gate), free(a->up), free(a->act), free(a->moe_logits), free(a->moe_probs);
    free(a->moe_topk), free(a->moe_w), free(a->xs), free(a->ys), free(a->yk), free(a->logits);
    free(a->pos32), free(a->pos), free(a->route_t), free(a->route_j);
    free(a->qg), free(a->agate), free(a->sh_g), free(a->sh_u), free(a->sh_y), free(a->sh_s);
    free(a->m), free(a->z), free(a->ba), free(a->beta), free(a->gam), free(a->cq), free(a->ck);
    free(a->qn), free(a->kn), free(a->cv), free(a->core), free(a->gated);
    free(a->rs), free(a->hflat), free(a->hlam), free(a->hgam), free(a->hinj), free(a->ple_ids), free(a->ple_rows);
    free(a->ple_p), free(a->ple_k), free(a->ple_g), free(a->ple_v), free(a->ple_gv), free(a->ple_nv), free(a->ple_cv);
    free(a->ik), free(a->iq), free(a->sel_rank), free(a->sel_set), free(a->sel64);
    memset(a, 0, sizeof *a);
}

/* The widest QSA selection of the model: W = B + r - 1 over its sparse
 * layers (1 when none, so buffers are never empty). */
static int64_t qsa_w_max(const td_hparams *hp) {
    int64_t w = 1;
    for (uint32_t l = 0; l < hp->n_layer && l < 256; l++)
        if (hp->qsa_ratio[l] && (int64_t)hp->idx_topk + hp->qsa_ratio[l] - 1 > w) w = (int64_t)hp->idx_topk + hp->qsa_ratio[l] - 1;
    return w;
}

static void acts_ensure(ref_backend *r, int64_t T) {
    ref_acts *a = &r->a;
    if (T <= a->cap_T) return;
    acts_free(a);
    const td_hparams *hp = &r->hp;
    const size_t E = hp->n_embd, H = hp->n_head, Hkv = hp->n_head_kv, D = hp->head_dim, F = hp->n_ff;
    const size_t X = hp->n_expert, K = hp->n_expert_used, V = hp->n_vocab, n = (size_t)T;
    const size_t rs = sizeof(real);
    a->cap_T = T;
    a->x = td_xcalloc(n * E, rs);
    a->xn = td_xcalloc(n * E, rs);
    a->q = td_xcalloc(n * H * D, rs);
    a->k = td_xcalloc(n * Hkv * D, rs);
    a->v = td_xcalloc(n * Hkv * D, rs);
    a->ctx = td_xcalloc(n * H * D, rs);
    a->proj = td_xcalloc(n * E, rs);
    a->gate = td_xcalloc(n * F, rs);
    a->up = td_xcalloc(n * F, rs);
    a->act = td_xcalloc(n * F, rs);
    a->logits = td_xcalloc(n * V, rs);
    a->pos32 = td_xcalloc(n, sizeof(int32_t));
    a->pos = td_xcalloc(n, sizeof(int64_t));
    if (X > 0) {
        a->moe_logits = td_xcalloc(n * X, rs);
        a->moe_probs = td_xcalloc(n * X, rs);
        a->moe_topk = td_xcalloc(n * K, sizeof(int32_t));
        a->moe_w = td_xcalloc(n * K, rs);
        a->xs = td_xcalloc(n * E, rs);
        a->ys = td_xcalloc(n * E, rs);
        a->yk = td_xcalloc(n * K * E, rs);
        a->route_t = td_xcalloc(n, sizeof(int32_t));
        a->route_j = td_xcalloc(n, sizeof(int32_t));
    }
    if (hp->arch == TD_ARCH_QWEN3NEXT || hp->arch == TD_ARCH_QWEN4EXP) {
        const size_t Fs = hp->n_ff_shexp, Hv = hp->ssm_dt_rank, KD = (size_t)hp->ssm_n_group * hp->ssm_d_state;
        const size_t VD = hp->ssm_d_inner, C = 2 * KD + VD;
        a->qg = td_xcalloc(n * 2 * H * D, rs);
        a->agate = td_xcalloc(n * H * D, rs);
        a->sh_g = td_xcalloc(n * Fs, rs);
        a->sh_u = td_xcalloc(n * Fs, rs);
        a->sh_y = td_xcalloc(n * E, rs);
        a->sh_s = td_xcalloc(n, rs);
        a->m = td_xcalloc(n * C, rs);
        a->z = td_xcalloc(n * VD, rs);
        a->ba = td_xcalloc(n * 2 * Hv, rs);
        a->beta = td_xcalloc(n * Hv, rs);
        a->gam = td_xcalloc(n * Hv, rs);
        a->cq = td_xcalloc(n * KD, rs);
        a->ck = td_xcalloc(n * KD, rs);
        a->qn = td_xcalloc(n * KD, rs);
        a->kn = td_xcalloc(n * KD, rs);
        a->cv = td_xcalloc(n * VD, rs);
        a->core = td_xcalloc(n * VD, rs);
        a->gated = td_xcalloc(n * VD, rs);
    }
    if (hp->arch == TD_ARCH_QWEN4EXP) {
        const size_t hc = hp->hc, hcd = hc * E, Wm = (size_t)qsa_w_max(hp);
        const size_t Ng = hp->ple_ngram ? hp->ple_ngram : 1, Np = hp->ple_n_heads ? hp->ple_n_heads : 1;
        a->rs = td_xcalloc(n * hcd, rs);
        a->hflat = td_xcalloc(n * hcd, rs);
        a->hlam = td_xcalloc(n * hp->hc_lr, rs);
        a->hgam = td_xcalloc(n * hcd, rs);
        a->hinj = td_xcalloc(n * hc, rs);
        a->ple_ids = td_xcalloc(n * Ng, sizeof(int32_t));
        a->ple_rows = td_xcalloc(n * Np, sizeof(int32_t));
        a->ple_p = td_xcalloc(n * E, rs);
        a->ple_k = td_xcalloc(n * hcd, rs);
        a->ple_g = td_xcalloc(n * hc, rs);
        a->ple_v = td_xcalloc(n * E, rs);
        a->ple_gv = td_xcalloc(n * hcd, rs);
        a->ple_nv = td_xcalloc(n * hcd, rs);
        a->ple_cv = td_xcalloc(n * hcd, rs);
        a->ik = td_xcalloc(n * hp->idx_dim, rs);
        a->iq = td_xcalloc(n * hp->idx_heads * hp->idx_dim, rs);
        a->sel_rank = td_xcalloc(n * Wm, sizeof(int32_t));
        a->sel_set = td_xcalloc(n * Wm, sizeof(int32_t));
        a->sel64 = td_xcalloc(Wm, sizeof(int64_t));
    }
}

/* Grows the KV cache (and the score scratch) to hold `need` positions. */
static void kv_ensure(ref_backend *r, int64_t need) {
    if (need <= r->kv_cap) return;
    int64_t cap = r->kv_cap ? 2 * r->kv_cap : 64;
    if (cap < need) cap = need;
    if (cap > r->n_ctx) cap = r->n_ctx;
    const size_t row = (size_t)r->hp.n_head_kv * r->hp.head_dim * sizeof(real);
    for (uint32_t l = 0; l < r->hp.n_layer; l++) {
        r->k_cache[l] = td_xrealloc(r->k_cache[l], (size_t)cap * row);
        r->v_cache[l] = td_xrealloc(r->v_cache[l], (size_t)cap * row);
    }
    r->att = td_xrealloc(r->att, (size_t)td_ref_pool_size(r->pool) * cap * sizeof(real)); // a row per worker
    if (r->idx_cache) {
        r->toks = td_xrealloc(r->toks, (size_t)cap * sizeof(int32_t));
        for (uint32_t l = 0; l < r->hp.n_layer; l++)
            if (r->hp.qsa_ratio[l])
                r->idx_cache[l] = td_xrealloc(r->idx_cache[l], (size_t)cap * r->hp.idx_dim * sizeof(real));
    }
    if (r->profile.rules & TD_RULE_ATTN_F16) {
        r->k16 = td_xrealloc(r->k16, (size_t)cap * row);
        r->v16 = td_xrealloc(r->v16, (size_t)cap * row);
    }
    r->kv_cap = cap;
}

/* ===================================================================== */
/* Weights: row-by-row decoding straight from the mapping                 */
/* ===================================================================== */

/* One matmul shared by the workers: worker w computes the output rows
 * [w*n_out/n, (w+1)*n_out/n), each one dot product in index order, so the
 * split never changes a bit. */
typedef struct mm_job {
    ref_backend *r;
    real *out;
    const real *in, *bias;
    const td_tensor *W;
    int64_t row0, T, n_in, n_out;
    td_row_mode wmode; // the weight rows as the arm's matmul holds them
    int acc16;
    int *rc;     // (n_workers)
    td_err *err; // (n_workers)
} mm_job;

static void mm_worker(void *ctx, int w, int nw) {
    mm_job *j = ctx;
    const int64_t n_in = j->n_in, n_out = j->n_out, T = j->T;
    const int64_t o0 = n_out * w / nw, o1 = n_out * (w + 1) / nw;
    real *row = j->r->row + (int64_t)w * j->r->max_in;
    j->rc[w] = TD_OK;
    for (int64_t o = o0; o < o1; o++) {
        int rc = REAL_DECODE_ROW_AS(j->W, (uint64_t)(j->row0 + o), row, j->wmode, &j->err[w]);
        if (rc) {
            j->rc[w] = rc;
            return;
        }
        for (int64_t t = 0; t < T; t++) {
            real s = j->acc16 ? FN(dot_acc16)(row, j->in + t * n_in, n_in, 2) : dot(row, j->in + t * n_in, n_in);
            if (j->bias) s += j->bias[o];
            j->out[t * n_out + o] = s;
        }
    }
}

/* out (T, n_out) = in (T, n_in) . W[row0 .. row0+n_out)^T (+ b[row0 .. row0+n_out)).
 * W has rows of n_in values (GGUF {n_in, n_out, ...}; an expert e of a 3-D
 * tensor starts at row0 = e*n_out). Each row is decoded once for all T. */
static int matmul(ref_backend *r, real *out, const real *in, const td_tensor *W, const td_tensor *b, int64_t row0,
                  int64_t T, int64_t n_in, int64_t n_out, td_err *err) {
    TD_ASSERT(W->ne[0] == n_in && (uint64_t)(row0 + n_out) <= W->n_rows && n_in <= r->max_in);
    const real *bias = NULL;
    if (b) {
        TD_ASSERT(b->ne[0] >= row0 + n_out && b->ne[0] <= r->max_out);
        int rc = REAL_DECODE_ROW(b, 0, r->bias, err);
        if (rc) return rc;
        bias = r->bias + row0;
    }
    int mm16 = 0, acc16 = 0; // mm-f16: the weight rows are rounded to f16 too; acc-f16: sums in f16
    {
        // profile rounding point: every input row once, as the arm converts
        // it for W's type in a step of T tokens
        td_act_fmt fmt;
        if (td_profile_matmul_fmt(&r->profile, W->type, T, n_in, &fmt))
            return td_err_set(err, TD_EINPUT, REF_NAME ": profile %s: tensor %s has type %s, not a matmul weight type",
                              r->profile_name, W->cname, td_type_name(W->type));
        mm16 = fmt == TD_ACT_F32 && td_profile_mm_f16(&r->profile, r->mm_step_T > 0 ? r->mm_step_T : T);
        // fp16 GPUs accumulate quantized tiles in f16 (F32/F16 weights in f32)
        td_act_fmt wf;
        acc16 = mm16 && (r->profile.rules & TD_RULE_ACC_F16) && !td_act_format(W->type, &wf) && td_act_block(wf) > 1;
        if (mm16) fmt = TD_ACT_F16; // and each weight row below
        if (fmt != TD_ACT_F32) {
            if (T * n_in > r->cap_qin) {
                free(r->qin);
                r->cap_qin = T * n_in;
                r->qin = td_xmalloc((size_t)r->cap_qin * sizeof(real));
            }
            td_act_ties_site(W->cname); // a near tie's log entry names the matmul it fed
            for (int64_t t = 0; t < T; t++) {
                td_act_ties_source_of(in, t * n_in); // row t of the tap `in` was emitted as, if any
                ACT_ROUND(r->qin + t * n_in, in + t * n_in, n_in, fmt);
            }
            in = r->qin;
        }
    }
    // mm-f16: each weight rounded to f16; acc-f16: as ggml-vulkan's f16 tile
    // loader forms it (td_row_mode: the IQ2 grids round their scale first)
    const td_row_mode wmode = acc16 ? TD_ROW_F16_TILE : mm16 ? TD_ROW_F16 : TD_ROW_EXACT;
    mm_job job = {.r = r, .out = out, .in = in, .W = W, .bias = bias, .row0 = row0, .T = T, .n_in = n_in,
                  .n_out = n_out, .wmode = wmode, .acc16 = acc16};
    const int nw = td_ref_pool_size(r->pool);
    job.rc = r->mm_rc;
    job.err = r->mm_err;
    td_ref_pool_run(r->pool, mm_worker, &job);
    for (int w = 0; w < nw; w++) // the first failing range, as one thread would report it
        if (r->mm_rc[w]) {
            if (err) *err = r->mm_err[w];
            return r->mm_rc[w];
        }
    return TD_OK;
}

/* out (T, n) = RMSNorm of each row of x (T, n) with the weight vector w {n}. */
static int rmsnorm_rows(ref_backend *r, real *out, const real *x, const td_tensor *w, int64_t T, int64_t n,
                        td_err *err) {
    TD_ASSERT(w->ne[0] == n);
    int rc = REAL_DECODE_ROW(w, 0, r->normw, err);
    if (rc) return rc;
    for (int64_t t = 0; t < T; t++) FN(rmsnorm)(out + t * n, x + t * n, r->normw, (real)r->hp.rms_eps, n);
    return TD_OK;
}

/* ===================================================================== */
/* Taps                                                                   */
/* ===================================================================== */

static void tap2(td_tap_sink *s, int layer, const char *name, const real *data, int64_t d0, int64_t d1) {
    const int64_t shape[2] = {d0, d1};
    td_act_ties_tap(layer, name); // names the rounding ties before it (profile.h)
    td_act_ties_tap_data(layer, name, data);
    TD_TAP(s, layer, name, REAL_DTYPE, data, 2, shape);
}

/* ===================================================================== */
/* The forward                                                            */
/* ===================================================================== */

/* The attention of one step shared by the workers; probs16: profile attn-f16
 * (the context matmul's B operand in f16 tiles). */
typedef struct att_job {
    ref_backend *r;
    real *out;
    const real *q, *k, *v;
    int64_t T, H, Hkv, D;
    int probs16;
    const int32_t *sel; // (T, sel_w) QSA selections, NULL = causal
    int64_t sel_w;
    int64_t tie_call; // the probabilities' call in a ties session (profile.h), -1 = none
} att_job;

/* Worker w takes the (token, head) pairs [w*T*H/n, (w+1)*T*H/n) with its
 * own score row. */
static void att_worker(void *ctx, int w, int nw) {
    const att_job *j = ctx;
    const int64_t n = j->T * j->H;
    attention_range(j->out, j->q, j->k, j->v, j->r->a.pos, j->r->att + (int64_t)w * j->r->kv_cap, j->H, j->Hkv,
                    j->D, n * w / nw, n * (w + 1) / nw, j->probs16, j->sel, j->sel_w, j->tie_call);
}

/* Flash attention (fa-acc-f16) shared by the workers as att_job is. */
typedef struct fa_job {
    real *out;
    const real *q, *k, *v;
    const int64_t *pos;
    td_fa_geom g;
    int64_t T, H, Hkv, D, n_kv;
    const int32_t *sel;
    int64_t sel_w, tie_call;
} fa_job;

static void fa_worker(void *ctx, int w, int nw) {
    const fa_job *j = ctx;
    const int64_t n = j->T * j->H;
    real *ws = td_xmalloc((size_t)fa_ws_size(&j->g, j->D) * sizeof(real));
    char *ok = td_xmalloc((size_t)j->n_kv);
    fa_range(j->out, j->q, j->k, j->v, j->pos, ws, ok, &j->g, j->H, j->Hkv, j->D, j->n_kv, n * w / nw,
             n * (w + 1) / nw, j->sel, j->sel_w, j->tie_call);
    free(ws), free(ok);
}

/* ggml-cpu's flash attention (fa-cpu) shared by the workers as att_job is. */
typedef struct fa_cpu_job {
    real *out;
    const real *q, *k, *v;
    const int64_t *pos;
    int64_t T, H, Hkv, D, n_kv;
    real scale;
    const int32_t *sel;
    int64_t sel_w, tie_call;
} fa_cpu_job;

static void fa_cpu_worker(void *ctx, int w, int nw) {
    const fa_cpu_job *j = ctx;
    const int64_t n = j->T * j->H;
    real *O = td_xmalloc((size_t)j->D * sizeof(real));
    char *ok = td_xmalloc((size_t)j->n_kv);
    fa_cpu_range(j->out, j->q, j->k, j->v, j->pos, O, ok, j->H, j->Hkv, j->D, j->n_kv, j->scale, n * w / nw,
                 n * (w + 1) / nw, j->sel, j->sel_w, j->tie_call);
    free(O), free(ok);
}

/* The QSA indexer of sparse layer l (arch-qwen4exp.md §4.5) for the step's
 * tokens, on the mixer output a->xn: caches the raw keys, pools the complete
 * blocks of the cache after the step (recomputed every step from the raw
 * keys: pool, then norm, then rotate at the block's first position), scores
 * them per token and selects: a->sel_set (T, W) ascending for the attention,
 * a->sel_rank (T, W) for the tap. Taps qsa_k_raw, qsa_q, qsa_kcache,
 * qsa_scores (only once a block is complete: NB > 0) and qsa_sel. */
static int qsa_indexer(ref_backend *r, int l, int64_t T, td_tap_sink *sink, td_err *err) {
    const td_hparams *hp = &r->hp;
    const td_qsa_parts *Q = &r->m->layers[l].qsa;
    ref_acts *a = &r->a;
    const int64_t E = hp->n_embd, di = hp->idx_dim, Hi = hp->idx_heads, rr = hp->qsa_ratio[l];
    const int64_t W = (int64_t)hp->idx_topk + rr - 1, pos0 = a->pos[0], n_kv = pos0 + T, NB = n_kv / rr;
    int rc;

    if ((rc = matmul(r, a->ik, a->xn, Q->wk, NULL, 0, T, E, di, err))) return rc;
    tap2(sink, l, "qsa_k_raw", a->ik, T, di);
    real *kc = r->idx_cache[l];
    memcpy(kc + pos0 * di, a->ik, (size_t)(T * di) * sizeof(real));
    // profile rounding point: the indexer cache has the K cache's type (§5);
    // flash attention's f16 cast of K/V (fa-f16) does not reach it
    if (td_profile_idx_store_f16(&r->profile)) {
        td_act_ties_site_of(l, "qsa_scores");
        ACT_ROUND(kc + pos0 * di, kc + pos0 * di, T * di, TD_ACT_F16);
    }

    if ((rc = matmul(r, a->iq, a->xn, Q->wq, NULL, 0, T, E, Hi * di, err))) return rc;
    if ((rc = rmsnorm_rows(r, a->iq, a->iq, Q->q_norm, T * Hi, di, err))) return rc;
    for (int64_t t = 0; t < T; t++) {
        const int64_t p4[4] = {a->pos[t], a->pos[t], a->pos[t], 0};
        FN(rope_imrope)(a->iq + t * Hi * di, p4, &r->rope_idx, hp->rope_sections, Hi);
    }
    tap2(sink, l, "qsa_q", a->iq, T, Hi * di);
    tap2(sink, l, "qsa_kcache", kc, n_kv, di);

    if (NB > r->cap_nb) {
        r->cap_nb = NB;
        r->qsa_kb = td_xrealloc(r->qsa_kb, (size_t)NB * di * sizeof(real));
    }
    if (T * NB > r->cap_sc) {
        r->cap_sc = T * NB;
        r->qsa_sc = td_xrealloc(r->qsa_sc, (size_t)(T * NB) * sizeof(real));
    }
    if (NB > 0 && (rc = REAL_DECODE_ROW(Q->k_norm, 0, r->normw, err))) return rc;
    for (int64_t b = 0; b < NB; b++) {
        real *kb = r->qsa_kb + b * di;
        for (int64_t i = 0; i < di; i++) {
            real acc = 0;
            for (int64_t j = 0; j < rr; j++) acc += kc[(b * rr + j) * di + i];
            kb[i] = acc / (real)rr;
        }
        FN(rmsnorm)(kb, kb, r->normw, (real)hp->rms_eps, di);
        // the block's first position in all four components (§4.5 step 3, §7.2)
        const int64_t p4[4] = {b * rr, b * rr, b * rr, b * rr};
        FN(rope_imrope)(kb, p4, &r->rope_idx, hp->rope_sections, 1);
    }
    // profile rounding point (mm-f16@N): the score is one mul_mat of the
    // pooled keys by the queries of every index head and token, activations on
    // both sides, so its columns are Hi*T; above the matrix-vector limit
    // ggml-vulkan runs it in its tiled matmul, both operands in f16 tiles and
    // an f32 sum (its F32 x F32 pipeline). The rounded queries are the qsa_q
    // tap's values, read back from an arm's taps for their f16 ties.
    const real *iq = a->iq;
    if (NB > 0 && td_profile_mm_f16(&r->profile, Hi * T)) {
        if (T * Hi * di > r->cap_qin) {
            free(r->qin);
            r->cap_qin = T * Hi * di;
            r->qin = td_xmalloc((size_t)r->cap_qin * sizeof(real));
        }
        td_act_ties_site_of(l, "qsa_scores");
        for (int64_t t = 0; t < T; t++) {
            td_act_ties_source_of(a->iq, t * Hi * di);
            ACT_ROUND(r->qin + t * Hi * di, a->iq + t * Hi * di, Hi * di, TD_ACT_F16);
        }
        td_act_ties_source_of(r->qsa_kb, 0); // not a tap: the pooled keys are searched, not read
        ACT_ROUND(r->qsa_kb, r->qsa_kb, NB * di, TD_ACT_F16);
        iq = r->qin;
    }
    for (int64_t t = 0; t < T; t++) {
        const int64_t nbt = (a->pos[t] + 1) / rr; // blocks complete for this token
        for (int64_t b = 0; b < NB; b++)
            r->qsa_sc[t * NB + b] = b < nbt ? FN(qsa_block_score)(iq + t * Hi * di, r->qsa_kb + b * di, Hi, di) : -1;
    }
    if (NB > 0) tap2(sink, l, "qsa_scores", r->qsa_sc, T, NB);

    for (int64_t t = 0; t < T; t++) {
        const int64_t n = FN(qsa_select)(a->sel64, r->qsa_sc + t * NB, a->pos[t], rr, W);
        int32_t *set = a->sel_set + t * W, *rank = a->sel_rank + t * W;
        for (int64_t j = 0; j < W; j++) set[j] = j < n ? (int32_t)a->sel64[j] : -1;
        // the tap in the catalog's rank order (taps/qsa_rank.h); a dense row (p + 1 <= W) stays ascending
        memcpy(rank, set, (size_t)W * sizeof *rank);
        if (a->pos[t] + 1 > W) REF_CAT(td_qsa_rank, REAL_SUFFIX)(rank, n, W, a->pos[t], rr, r->qsa_sc + t * NB);
        // the tap and the attention must name the same positions
        for (int64_t j = 0; j < W; j++) {
            int found = rank[j] < 0;
            for (int64_t i = 0; i < n && !found; i++) found = set[i] == rank[j];
            TD_ASSERT(found && (j < n) == (rank[j] >= 0));
        }
        // a boundary tie the caller took the arm's side of (profile.h td_qsa_pin):
        // the attention reads the arm's positions, the tap keeps this choice so
        // that compare judges the tie again
        const td_qsa_pin *pin = td_qsa_pin_find(l, a->pos[t]);
        if (pin) {
            TD_ASSERT(pin->n <= W);
            for (int64_t j = 0; j < W; j++) {
                set[j] = j < pin->n ? pin->sel[j] : -1;
                TD_ASSERT(set[j] <= a->pos[t] && (j == 0 || set[j] < 0 || set[j] > set[j - 1]));
            }
        }
    }
    const int64_t shape[2] = {T, W};
    TD_TAP(sink, l, "qsa_sel", TD_DT_I32, a->sel_rank, 2, shape);
    return TD_OK;
}

/* Attention sub-block of layer l: a->x (T, E) -> a->proj (T, E) = attn_out. */
static int attention_block(ref_backend *r, int l, int64_t T, td_tap_sink *sink, td_err *err) {
    const td_hparams *hp = &r->hp;
    const td_layer *L = &r->m->layers[l];
    ref_acts *a = &r->a;
    const int64_t E = hp->n_embd, H = hp->n_head, Hkv = hp->n_head_kv, D = hp->head_dim;
    const int64_t pos0 = a->pos[0];
    const int hc_qsa = L->kind == TD_LAYER_HC_QSA; // qwen4exp: a->xn is already the HC mixer's u
    int rc;

    if (!hc_qsa) {
        if ((rc = rmsnorm_rows(r, a->xn, a->x, L->attn.norm, T, E, err))) return rc;
        tap2(sink, l, "attn_norm", a->xn, T, E);
    }

    if (L->attn.wqkv) { // fused: output rows are [Q; K; V]
        if ((rc = matmul(r, a->q, a->xn, L->attn.wqkv, L->attn.bqkv, 0, T, E, H * D, err))) return rc;
        if ((rc = matmul(r, a->k, a->xn, L->attn.wqkv, L->attn.bqkv, H * D, T, E, Hkv * D, err))) return rc;
        if ((rc = matmul(r, a->v, a->xn, L->attn.wqkv, L->attn.bqkv, (H + Hkv) * D, T, E, Hkv * D, err))) return rc;
    } else if (L->attn.q_gated) { // qwen3next: per head h rows [q_h; gate_h]
        if ((rc = matmul(r, a->qg, a->xn, L->attn.wq, NULL, 0, T, E, 2 * H * D, err))) return rc;
        for (int64_t t = 0; t < T; t++)
            for (int64_t h = 0; h < H; h++) {
                memcpy(a->q + (t * H + h) * D, a->qg + (t * H + h) * 2 * D, (size_t)D * sizeof(real));
                memcpy(a->agate + (t * H + h) * D, a->qg + (t * H + h) * 2 * D + D, (size_t)D * sizeof(real));
            }
        if ((rc = matmul(r, a->k, a->xn, L->attn.wk, L->attn.bk, 0, T, E, Hkv * D, err))) return rc;
        if ((rc = matmul(r, a->v, a->xn, L->attn.wv, L->attn.bv, 0, T, E, Hkv * D, err))) return rc;
    } else {
        if ((rc = matmul(r, a->q, a->xn, L->attn.wq, L->attn.bq, 0, T, E, H * D, err))) return rc;
        if ((rc = matmul(r, a->k, a->xn, L->attn.wk, L->attn.bk, 0, T, E, Hkv * D, err))) return rc;
        if ((rc = matmul(r, a->v, a->xn, L->attn.wv, L->attn.bv, 0, T, E, Hkv * D, err))) return rc;
    }
    tap2(sink, l, "attn_q", a->q, T, H * D);
    tap2(sink, l, "attn_k", a->k, T, Hkv * D);
    tap2(sink, l, "attn_v", a->v, T, Hkv * D);
    if (L->attn.q_gated) tap2(sink, l, "attn_gate", a->agate, T, H * D);

    if (L->attn.q_norm) { // qwen3 family: per-head RMSNorm, before RoPE
        if ((rc = rmsnorm_rows(r, a->q, a->q, L->attn.q_norm, T * H, D, err))) return rc;
        tap2(sink, l, "attn_q_norm", a->q, T, H * D);
    }
    if (L->attn.k_norm) {
        if ((rc = rmsnorm_rows(r, a->k, a->k, L->attn.k_norm, T * Hkv, D, err))) return rc;
        tap2(sink, l, "attn_k_norm", a->k, T, Hkv * D);
    }

    for (int64_t t = 0; t < T; t++) {
        if (hc_qsa) { // IMROPE, a text token's position (p, p, p, 0)
            const int64_t p4[4] = {a->pos[t], a->pos[t], a->pos[t], 0};
            FN(rope_imrope)(a->q + t * H * D, p4, &r->rope, r->hp.rope_sections, H);
            FN(rope_imrope)(a->k + t * Hkv * D, p4, &r->rope, r->hp.rope_sections, Hkv);
            continue;
        }
        FN(rope)(a->q + t * H * D, a->pos[t], &r->rope, r->rope_ff, H);
        FN(rope)(a->k + t * Hkv * D, a->pos[t], &r->rope, r->rope_ff, Hkv);
    }
    tap2(sink, l, "attn_q_rope", a->q, T, H * D);
    tap2(sink, l, "attn_k_rope", a->k, T, Hkv * D);

    // append this step's keys and values at their positions
    real *kc = r->k_cache[l], *vc = r->v_cache[l];
    memcpy(kc + pos0 * Hkv * D, a->k, (size_t)(T * Hkv * D) * sizeof(real));
    memcpy(vc + pos0 * Hkv * D, a->v, (size_t)(T * Hkv * D) * sizeof(real));
    // a near tie's log entry names the attention part it met (profile.h), not the matmul before
    td_act_ties_site_of(l, "attn_f16");
    if (td_profile_kv_store_f16(&r->profile)) { // profile rounding point: an f16 cache
        // the arm's side of each rounding shows in its K and V taps of this step (ties.h)
        td_act_ties_source_of(a->k, 0);
        td_act_ties_source_near(rope_near(r, pos0 + T - 1));
        ACT_ROUND(kc + pos0 * Hkv * D, kc + pos0 * Hkv * D, T * Hkv * D, TD_ACT_F16);
        td_act_ties_source_of(a->v, 0);
        td_act_ties_source_near(TD_ACT_TIES_ROW_NEAR);
        ACT_ROUND(vc + pos0 * Hkv * D, vc + pos0 * Hkv * D, T * Hkv * D, TD_ACT_F16);
    }
    // a sparse QSA layer attends to the positions its indexer selects
    const int32_t *sel = NULL;
    int64_t sel_w = 0;
    if (hc_qsa && r->hp.qsa_ratio[l]) {
        if ((rc = qsa_indexer(r, l, T, sink, err))) return rc;
        sel = a->sel_set;
        sel_w = (int64_t)r->hp.idx_topk + r->hp.qsa_ratio[l] - 1;
        td_act_ties_site_of(l, "attn_f16"); // the indexer named its own
    }
    td_fa_geom fg;
    const int fa = !td_profile_fa_geom(&r->profile, D, H, Hkv, T, pos0 + T, r->n_ctx, &fg);
    // fa-cpu takes the shapes a Vulkan device leaves to ggml-cpu
    const td_fa_cpu_path fc = td_profile_fa_cpu(&r->profile, D, H, Hkv, T, pos0 + T, r->n_ctx);
    if (!fa && fc == TD_FA_CPU_NONE && (r->profile.rules & TD_RULE_FA_ACC_F16))
        return td_err_set(err, TD_EINPUT,
                          "profile fa-acc-f16: head size %lld with %lld/%lld heads is outside the flash-attention "
                          "shader's modelled shapes (head size a multiple of 8, whole query groups)",
                          (long long)D, (long long)H, (long long)Hkv);
    if (fc == TD_FA_CPU_SPLIT_KV)
        return td_err_set(err, TD_EINPUT,
                          "profile fa-cpu: a one-token step over %lld cached positions (a cache view of 512 cells or "
                          "more) is ggml-cpu's split-KV flash attention, whose per-thread partials are not modelled",
                          (long long)(pos0 + T));
    if (fc == TD_FA_CPU_ONE_CHUNK) {
        // profile rounding point: ggml-cpu's flash attention converts Q (not
        // yet scaled) to f16 for its f16 dot; q is not read after. The arm's
        // side of a near tie shows in its own Q tap (ties.h)
        td_act_ties_source_of(a->q, 0);
        td_act_ties_source_near(rope_near(r, pos0 + T - 1));
        ACT_ROUND(a->q, a->q, T * H * D, TD_ACT_F16);
        td_act_ties_site_of(l, "attn_acc");
        fa_cpu_job j = {.out = a->ctx, .q = a->q, .k = kc, .v = vc, .pos = a->pos, .T = T, .H = H, .Hkv = Hkv,
                        .D = D, .n_kv = pos0 + T, .scale = (real)(1.0f / sqrtf((float)D)), .sel = sel,
                        .sel_w = sel_w, .tie_call = td_act_ties_reserve()};
        td_ref_pool_run(r->pool, fa_cpu_worker, &j);
    } else if (fc == TD_FA_CPU_TILED) {
        // ggml-cpu's tiled kernel: f32 throughout on the f16 cache (fa-f16)
        att_job j = {.r = r, .out = a->ctx, .q = a->q, .k = kc, .v = vc, .T = T, .H = H, .Hkv = Hkv, .D = D,
                     .sel = sel, .sel_w = sel_w, .tie_call = -1};
        td_ref_pool_run(r->pool, att_worker, &j);
    } else if (fa) {
        // profile rounding point: flash attention (fa-acc-f16) reads
        // f16(Q*scale) with llama.cpp's f32 scale; q is not read after
        const float scale = 1.0f / sqrtf((float)D);
        for (int64_t i = 0; i < T * H * D; i++) a->q[i] *= (real)scale;
        // the arm rounds its own Q tap times the scale (ties.h): its side
        // of a near tie shows there
        td_act_ties_source_of(a->q, 0);
        td_act_ties_source_scale(scale);
        td_act_ties_source_near(rope_near(r, pos0 + T - 1));
        ACT_ROUND(a->q, a->q, T * H * D, TD_ACT_F16);
        td_act_ties_site_of(l, "attn_probs");
        fa_job j = {.out = a->ctx, .q = a->q, .k = kc, .v = vc, .pos = a->pos, .g = fg, .T = T, .H = H, .Hkv = Hkv,
                    .D = D, .n_kv = pos0 + T, .sel = sel, .sel_w = sel_w, .tie_call = td_act_ties_reserve()};
        td_ref_pool_run(r->pool, fa_worker, &j);
    } else if (td_profile_attn_qkv_f16(&r->profile, T)) {
        // profile rounding point: a step of several tokens reads Q, the
        // cache rows and the probabilities in f16 (the cache itself keeps
        // its precision); q is not read after attention
        const int64_t n_kv = pos0 + T;
        // the arm's side of each rounding shows in its Q, K and V taps of this step (ties.h)
        td_act_ties_source_of(a->q, 0);
        td_act_ties_source_near(rope_near(r, pos0 + T - 1));
        ACT_ROUND(a->q, a->q, T * H * D, TD_ACT_F16);
        td_act_ties_source(l, "attn_k_rope", -pos0 * Hkv * D);
        td_act_ties_source_near(rope_near(r, pos0 + T - 1)); // the cached rows' positions are lower
        ACT_ROUND(r->k16, kc, n_kv * Hkv * D, TD_ACT_F16);
        td_act_ties_source(l, "attn_v", -pos0 * Hkv * D);
        ACT_ROUND(r->v16, vc, n_kv * Hkv * D, TD_ACT_F16);
        td_act_ties_site_of(l, "attn_probs");
        att_job j = {.r = r, .out = a->ctx, .q = a->q, .k = r->k16, .v = r->v16, .T = T, .H = H, .Hkv = Hkv,
                     .D = D, .probs16 = 1, .sel = sel, .sel_w = sel_w,
                     .tie_call = td_act_ties_reserve()};
        td_ref_pool_run(r->pool, att_worker, &j);
    } else {
        att_job j = {.r = r, .out = a->ctx, .q = a->q, .k = kc, .v = vc, .T = T, .H = H, .Hkv = Hkv, .D = D,
                     .sel = sel, .sel_w = sel_w, .tie_call = -1};
        td_ref_pool_run(r->pool, att_worker, &j);
    }
    tap2(sink, l, "attn_ctx", a->ctx, T, H * D);
    if (L->attn.q_gated) { // o = ctx * sigmoid(gate), elementwise over H*D
        for (int64_t i = 0; i < T * H * D; i++) a->ctx[i] *= 1 / (1 + R_EXP(-a->agate[i]));
        tap2(sink, l, "attn_gated", a->ctx, T, H * D);
    }

    if ((rc = matmul(r, a->proj, a->ctx, L->attn.wo, L->attn.bo, 0, T, H * D, E, err))) return rc;
    tap2(sink, l, "attn_out", a->proj, T, E);
    return TD_OK;
}

/* Dense SwiGLU FFN: a->xn (T, E) -> a->proj (T, E). */
static int ffn_dense(ref_backend *r, int l, int64_t T, td_tap_sink *sink, td_err *err) {
    const td_layer *L = &r->m->layers[l];
    ref_acts *a = &r->a;
    const int64_t E = r->hp.n_embd, F = r->hp.n_ff;
    int rc;
    if ((rc = matmul(r, a->gate, a->xn, L->ffn.gate, NULL, 0, T, E, F, err))) return rc;
    tap2(sink, l, "ffn_gate", a->gate, T, F);
    if ((rc = matmul(r, a->up, a->xn, L->ffn.up, NULL, 0, T, E, F, err))) return rc;
    tap2(sink, l, "ffn_up", a->up, T, F);
    FN(swiglu)(a->act, a->gate, a->up, T * F);
    tap2(sink, l, "ffn_act", a->act, T, F);
    return matmul(r, a->proj, a->act, L->ffn.down, NULL, 0, T, F, E, err);
}

/* Softmax-routed MoE (primitives §5): a->xn (T, E) -> a->proj (T, E).
 * Experts are visited in index order so each expert's rows are decoded once
 * for all the tokens routed to it; the outputs are then summed per token in
 * top-k (rank) order. */
static int ffn_moe(ref_backend *r, int l, int64_t T, td_tap_sink *sink, td_err *err) {
    const td_layer *L = &r->m->layers[l];
    ref_acts *a = &r->a;
    const int64_t E = r->hp.n_embd, F = r->hp.n_ff, X = r->hp.n_expert, K = r->hp.n_expert_used;
    int rc;

    if ((rc = matmul(r, a->moe_logits, a->xn, L->ffn.gate_inp, NULL, 0, T, E, X, err))) return rc;
    tap2(sink, l, "moe_logits", a->moe_logits, T, X);
    for (int64_t t = 0; t < T; t++) FN(softmax)(a->moe_probs + t * X, a->moe_logits + t * X, X);
    tap2(sink, l, "moe_probs", a->moe_probs, T, X);
    for (int64_t t = 0; t < T; t++) FN(moe_route)(a->moe_topk + t * K, a->moe_w + t * K, a->moe_probs + t * X, X, K);
    const int64_t shape_tk[2] = {T, K};
    TD_TAP(sink, l, "moe_topk", TD_DT_I32, a->moe_topk, 2, shape_tk);
    tap2(sink, l, "moe_weights", a->moe_w, T, K);

    // profile rounding point: an expert's matmuls round as a matmul of the
    // whole step would (mm-f16@N: the arm's MUL_MAT_ID takes its tiled f16
    // path for steps of more than N tokens, however few chose the expert)
    r->mm_step_T = T;
    for (int64_t e = 0; e < X && !rc; e++) {
        // gather the tokens that chose expert e: xs (n, E)
        int64_t n = 0;
        for (int64_t t = 0; t < T; t++)
            for (int64_t j = 0; j < K; j++)
                if (a->moe_topk[t * K + j] == e) {
                    memcpy(a->xs + n * E, a->xn + t * E, (size_t)E * sizeof(real));
                    a->route_t[n] = (int32_t)t, a->route_j[n] = (int32_t)j;
                    n++;
                }
        if (n == 0) continue;
        // expert e = rows e*F .. e*F+F-1 of gate/up, e*E .. e*E+E-1 of down
        if ((rc = matmul(r, a->up, a->xs, L->ffn.up_exps, NULL, e * F, n, E, F, err))) break;
        if (L->ffn.gate_exps) {
            if ((rc = matmul(r, a->gate, a->xs, L->ffn.gate_exps, NULL, e * F, n, E, F, err))) break;
            FN(swiglu)(a->act, a->gate, a->up, n * F);
        } else { // llama MoE without gate tensors: W_down . silu(W_up x)
            for (int64_t i = 0; i < n * F; i++) a->act[i] = a->up[i] / (1 + R_EXP(-a->up[i]));
        }
        if ((rc = matmul(r, a->ys, a->act, L->ffn.down_exps, NULL, e * E, n, F, E, err))) break;
        for (int64_t i = 0; i < n; i++)
            memcpy(a->yk + ((int64_t)a->route_t[i] * K + a->route_j[i]) * E, a->ys + i * E, (size_t)E * sizeof(real));
    }
    r->mm_step_T = 0;
    if (rc) return rc;

    for (int64_t t = 0; t < T; t++) {
        real *out = a->proj + t * E;
        for (int64_t i = 0; i < E; i++) out[i] = 0;
        for (int64_t j = 0; j < K; j++) { // rank order: largest probability first
            const real w = a->moe_w[t * K + j];
            const real *y = a->yk + (t * K + j) * E;
            for (int64_t i = 0; i < E; i++) out[i] += w * y[i];
        }
    }
    return TD_OK;
}

void FN(l2norm)(real *x, int64_t n, real eps) {
    real ss = 0;
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    // eps inside the root, added to the SUM of squares (primitives §1.1), not the mean as RMSNorm
    const real inv = 1 / R_SQRT(ss + eps);
    for (int64_t i = 0; i < n; i++) x[i] *= inv;
}

void FN(gdn_step)(real *S, real *o, const real *q, const real *k, const real *v, real gamma, real beta, int64_t dk) {
    // S: (dk [value j], dk [key i]); the decay comes BEFORE the update, o reads the updated state
    const real decay = R_EXP(gamma), qscale = 1 / R_SQRT((real)dk);
    for (int64_t i = 0; i < dk * dk; i++) S[i] *= decay;
    for (int64_t j = 0; j < dk; j++) {
        real *Sj = S + j * dk;             // S[.][j] over the keys i
        const real e = dot(Sj, k, dk);     // (S^T k)_j
        const real delta = beta * (v[j] - e);
        for (int64_t i = 0; i < dk; i++) Sj[i] += k[i] * delta;
        o[j] = qscale * dot(Sj, q, dk);
    }
}

/* ===================================================================== */
/* qwen4exp primitives (arch-qwen4exp.md §4)                              */
/* ===================================================================== */

void FN(rope_imrope)(real *x, const int64_t *pos4, const td_ref_rope *c, const uint32_t *sections, int64_t n_heads) {
    // NEOX pairing (x[i], x[i+R/2]); only the position component of each pair differs from plain NEOX
    TD_ASSERT(c->scaling != TD_ROPE_SCALING_YARN);
    const int64_t D = c->D, R = c->R, half = c->R / 2;
    const real freq_scale = c->scaling == TD_ROPE_SCALING_NONE ? 1 : (real)c->freq_scale;
    const real m = (real)c->attn_factor;
    for (int64_t i = 0; i < half; i++) {
        const int64_t p = pos4[td_ref_imrope_component(i, sections)];
        const real omega = R_POW((real)c->base, -(real)(2 * i) / (real)R);
        // each component's angle is formed as the plain rope's (ggml_mrope_cache_init)
        const real theta = c->angle ? angle_f32(c, p, i, NULL, 0, 0, 0) : freq_scale * ((real)p * omega);
        real cs, sn;
        trig(c, p, i, theta, &cs, &sn);
        for (int64_t h = 0; h < n_heads; h++) {
            real *xh = x + h * D;
            const real u = xh[i], v = xh[i + half];
            xh[i] = m * (u * cs - v * sn);
            xh[i + half] = m * (u * sn + v * cs);
        }
    }
}

void FN(hc_mix)(real *mixed, real *inj, real *flat, real *lam, real *gam, const real *Rs, const real *gamma,
                const real *Wdn, const real *Wup, const real *Winj, int64_t hc, int64_t E, int64_t lr, real eps) {
    const int64_t hcd = hc * E;
    // each stream normed on its own with its own gamma slice; flat is stream-major
    for (int64_t c = 0; c < hc; c++) FN(rmsnorm)(flat + c * E, Rs + c * E, gamma + c * E, eps, E);
    for (int64_t o = 0; o < lr; o++) {
        const real z = dot(Wdn + o * hcd, flat, hcd) / (real)hc;
        lam[o] = z / (1 + R_EXP(-z));
    }
    for (int64_t o = 0; o < hcd; o++) gam[o] = dot(Wup + o * lr, lam, lr);
    for (int64_t e = 0; e < E; e++) {
        real acc = 0;
        for (int64_t c = 0; c < hc; c++) acc += flat[c * E + e] / (1 + R_EXP(-gam[c * E + e]));
        mixed[e] = acc / (real)hc; // the mean over the streams
    }
    if (inj && Winj)
        for (int64_t c = 0; c < hc; c++) inj[c] = dot(Winj + c * hcd, flat, hcd);
}

void FN(hc_combine)(real *Rs, const real *y, const real *inj, int64_t hc, int64_t E) {
    for (int64_t c = 0; c < hc; c++) {
        // 2 sigmoid(0) = 1: a zero injection is a plain residual add
        const real w = 2 / (1 + R_EXP(-inj[c] / (real)hc));
        for (int64_t e = 0; e < E; e++) Rs[c * E + e] += w * y[e];
    }
}

real FN(qsa_block_score)(const real *q, const real *kb, int64_t H_i, int64_t d_i) {
    real s = 0;
    for (int64_t i = 0; i < H_i; i++) {
        const real d = dot(q + i * d_i, kb, d_i);
        s += d > 0 ? d : 0; // ReLU per head, then the sum: no scale, no head weights (§7.3)
    }
    return s;
}

int64_t FN(qsa_select)(int64_t *sel, const real *score, int64_t p, int64_t r, int64_t W) {
    TD_ASSERT(p >= 0 && r > 0 && W > 0);
    int64_t n = 0;
    if (p + 1 <= W) {
        for (int64_t s = 0; s <= p; s++) sel[n++] = s;
        return n;
    }
    const int64_t Tt = (p + 1) / r * r, nb = Tt / r;
    // the complete blocks by descending score; a stable pass keeps the lower block first among equal scores
    int64_t left = W - (p + 1 - Tt);
    unsigned char *taken = calloc((size_t)(nb > 0 ? nb : 1), 1);
    TD_ASSERT(taken);
    while (left > 0) {
        int64_t best = -1;
        for (int64_t b = 0; b < nb; b++)
            if (!taken[b] && (best < 0 || score[b] > score[best])) best = b;
        if (best < 0) break;
        taken[best] = 1;
        // a block cut by the budget keeps its lowest positions
        for (int64_t j = 0; j < r && left > 0; j++, left--) sel[n++] = best * r + j;
    }
    free(taken);
    for (int64_t s = Tt; s <= p; s++) sel[n++] = s; // the tail: always selected
    // ascending, so the selection compares as a set
    td_sort_i64(sel, (size_t)n);
    return n;
}

static real softplus(real z) {
    return z > 20 ? z : R_LOG(1 + R_EXP(z)); // llama.cpp's threshold: beyond it ln(1+e^z) = z in f32
}

/* The per-channel conv and the per-head delta rule of a GDN block, split
 * between the pool's workers: channels (heads) are independent, and each
 * one still runs its tokens in order, so the split never changes a bit. */
typedef struct gdn_job {
    ref_backend *r;
    const td_gdn_parts *G;
    int64_t T, C, KD, VD, Kc, Hk, Hv, dk, rr;
    int tiled; // qwen4exp: value head h reads key head h mod Hk (the converter's tiled order)
    real *cs, *S;
    int *rc;     // (n_workers)
    td_err *err; // (n_workers)
} gdn_job;

/* window [state ; m_t] of channel ch, then shift */
static void gdn_conv_worker(void *ctx, int w, int nw) {
    const gdn_job *j = ctx;
    ref_acts *a = &j->r->a;
    const int64_t C = j->C, KD = j->KD, VD = j->VD, Kc = j->Kc;
    real *row = j->r->row + (int64_t)w * j->r->max_in;
    j->rc[w] = TD_OK;
    for (int64_t ch = C * w / nw; ch < C * (w + 1) / nw; ch++) {
        int rc = REAL_DECODE_ROW(j->G->conv, (uint64_t)ch, row, &j->err[w]); // K taps, oldest first
        if (rc) {
            j->rc[w] = rc;
            return;
        }
        real *st = j->cs + ch * (Kc - 1);
        for (int64_t t = 0; t < j->T; t++) {
            const real u = a->m[t * C + ch];
            real y = row[Kc - 1] * u;
            for (int64_t k = 0; k < Kc - 1; k++) y += row[k] * st[k];
            for (int64_t k = 0; k + 1 < Kc - 1; k++) st[k] = st[k + 1];
            if (Kc > 1) st[Kc - 2] = u;
            y = y / (1 + R_EXP(-y)); // silu
            if (ch < KD) a->cq[t * KD + ch] = y;
            else if (ch < 2 * KD) a->ck[t * KD + ch - KD] = y;
            else a->cv[t * VD + ch - 2 * KD] = y;
        }
    }
}

static void gdn_delta_worker(void *ctx, int w, int nw) {
    const gdn_job *j = ctx;
    ref_acts *a = &j->r->a;
    const int64_t Hk = j->Hk, Hv = j->Hv, dk = j->dk;
    for (int64_t h = Hv * w / nw; h < Hv * (w + 1) / nw; h++) {
        const int64_t g = j->tiled ? h % Hk : h / j->rr; // qwen3next: value head h reads key head h / r
        for (int64_t t = 0; t < j->T; t++)
            FN(gdn_step)(j->S + h * dk * dk, a->core + (t * Hv + h) * dk, a->qn + (t * Hk + g) * dk,
                         a->kn + (t * Hk + g) * dk, a->cv + (t * Hv + h) * dk, a->gam[t * Hv + h],
                         a->beta[t * Hv + h], dk);
    }
}

/* Gated DeltaNet sub-block of layer l (arch-qwen3next.md §4.2): a->x (T, E) ->
 * a->proj (T, E). The definition: every token runs the conv and the delta
 * rule in order, prefill and decode alike; the conv and recurrent state carry
 * over between steps. */
static int gdn_block(ref_backend *r, int l, int64_t T, td_tap_sink *sink, td_err *err) {
    const td_hparams *hp = &r->hp;
    const td_gdn_parts *G = &r->m->layers[l].gdn;
    ref_acts *a = &r->a;
    const int64_t E = hp->n_embd, Hk = hp->ssm_n_group, Hv = hp->ssm_dt_rank, dk = hp->ssm_d_state;
    const int64_t KD = Hk * dk, VD = Hv * dk, C = 2 * KD + VD, Kc = hp->ssm_conv, rr = Hv / Hk;
    const real eps = (real)hp->rms_eps;
    // qwen4exp (arch-qwen4exp.md §4.3): a->xn is already the HC mixer's u;
    // separate beta/alpha rows, tiled value heads, a sigmoid output gate
    const int q4x = r->m->layers[l].kind == TD_LAYER_HC_GDN;
    int rc;

    if (!q4x) {
        if ((rc = rmsnorm_rows(r, a->xn, a->x, G->norm, T, E, err))) return rc;
        tap2(sink, l, "attn_norm", a->xn, T, E);
    }
    if ((rc = matmul(r, a->m, a->xn, G->wqkv, NULL, 0, T, E, C, err))) return rc;
    tap2(sink, l, "ssm_qkv", a->m, T, C);
    if ((rc = matmul(r, a->z, a->xn, G->wgate, NULL, 0, T, E, VD, err))) return rc;
    tap2(sink, l, "ssm_z", a->z, T, VD);
    if (q4x) { // beta logits, then alpha logits, each (T, Hv) in head order
        if ((rc = matmul(r, a->ba, a->xn, G->wbeta, NULL, 0, T, E, Hv, err))) return rc;
        if ((rc = matmul(r, a->ba + T * Hv, a->xn, G->walpha, NULL, 0, T, E, Hv, err))) return rc;
    } else if ((rc = matmul(r, a->ba, a->xn, G->wba, NULL, 0, T, E, 2 * Hv, err))) return rc;

    // gates: beta = sigmoid(b~), gamma = ssm_a * softplus(a~ + dt_bias) <= 0
    if ((rc = REAL_DECODE_ROW(G->a, 0, r->vec, err))) return rc;
    if ((rc = REAL_DECODE_ROW(G->dt_bias, 0, r->vec2, err))) return rc;
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < Hv; h++) {
            const int64_t g = h / rr, j = h % rr; // ssm_ba rows: per key head [b~ x r; a~ x r]
            const real bt = q4x ? a->ba[t * Hv + h] : a->ba[t * 2 * Hv + g * 2 * rr + j];
            const real at = q4x ? a->ba[T * Hv + t * Hv + h] : a->ba[t * 2 * Hv + g * 2 * rr + rr + j];
            a->beta[t * Hv + h] = 1 / (1 + R_EXP(-bt));
            a->gam[t * Hv + h] = r->vec[h] * softplus(at + r->vec2[h]);
        }
    tap2(sink, l, "ssm_beta", a->beta, T, Hv);
    tap2(sink, l, "ssm_gate", a->gam, T, Hv);

    // causal depthwise conv (primitives §6), channels split between workers
    real *cs = r->conv_state[l]; // (C, K-1)
    {
        gdn_job j = {.r = r, .G = G, .T = T, .C = C, .KD = KD, .VD = VD, .Kc = Kc, .cs = cs,
                     .rc = r->mm_rc, .err = r->mm_err};
        td_ref_pool_run(r->pool, gdn_conv_worker, &j);
        for (int w = 0; w < td_ref_pool_size(r->pool); w++) // the first failing range, as one thread would report it
            if (r->mm_rc[w]) {
                if (err) *err = r->mm_err[w];
                return r->mm_rc[w];
            }
    }
    tap2(sink, l, "ssm_q", a->cq, T, KD);
    tap2(sink, l, "ssm_k", a->ck, T, KD);
    tap2(sink, l, "ssm_v", a->cv, T, VD);
    tap2(sink, l, "ssm_conv_state", cs, C, Kc - 1);

    // delta rule, token by token (§4.2 step 7), per value head h on key head h/r
    memcpy(a->qn, a->cq, (size_t)(T * KD) * sizeof(real));
    memcpy(a->kn, a->ck, (size_t)(T * KD) * sizeof(real));
    for (int64_t i = 0; i < T * Hk; i++) {
        FN(l2norm)(a->qn + i * dk, dk, eps);
        FN(l2norm)(a->kn + i * dk, dk, eps);
    }
    real *S = r->ssm_state[l]; // (Hv, dk [value j], dk [key i])
    {
        gdn_job j = {.r = r, .T = T, .Hk = Hk, .Hv = Hv, .dk = dk, .rr = rr, .S = S, .tiled = q4x};
        td_ref_pool_run(r->pool, gdn_delta_worker, &j);
    }
    tap2(sink, l, "ssm_core", a->core, T, VD);
    {
        const int64_t shape[3] = {Hv, dk, dk};
        TD_TAP(sink, l, "ssm_state", REAL_DTYPE, S, 3, shape);
    }

    // gated RMSNorm per value head: RMSNorm(o_h; ssm_norm) * silu(z_h) (qwen4exp: * sigmoid(z_h))
    if ((rc = REAL_DECODE_ROW(G->ssm_norm, 0, r->normw, err))) return rc;
    for (int64_t i = 0; i < T * Hv; i++) {
        FN(rmsnorm)(a->gated + i * dk, a->core + i * dk, r->normw, eps, dk);
        for (int64_t d = 0; d < dk; d++) {
            const real zz = a->z[i * dk + d];
            a->gated[i * dk + d] *= q4x ? 1 / (1 + R_EXP(-zz)) : zz / (1 + R_EXP(-zz));
        }
    }
    tap2(sink, l, "ssm_gated", a->gated, T, VD);
    if ((rc = matmul(r, a->proj, a->gated, G->wout, NULL, 0, T, VD, E, err))) return rc;
    tap2(sink, l, "ssm_out", a->proj, T, E);
    return TD_OK;
}

/* The sigmoid-gated shared expert (arch-qwen3next.md §4.3), added to the MoE
 * output already in a->proj. */
static int ffn_shared_expert(ref_backend *r, int l, int64_t T, td_tap_sink *sink, td_err *err) {
    const td_ffn_parts *f = &r->m->layers[l].ffn;
    ref_acts *a = &r->a;
    const int64_t E = r->hp.n_embd, Fs = r->hp.n_ff_shexp;
    int rc;
    if ((rc = matmul(r, a->sh_g, a->xn, f->gate_shexp, NULL, 0, T, E, Fs, err))) return rc;
    if ((rc = matmul(r, a->sh_u, a->xn, f->up_shexp, NULL, 0, T, E, Fs, err))) return rc;
    FN(swiglu)(a->sh_g, a->sh_g, a->sh_u, T * Fs);
    if ((rc = matmul(r, a->sh_y, a->sh_g, f->down_shexp, NULL, 0, T, Fs, E, err))) return rc;
    tap2(sink, l, "ffn_shexp", a->sh_y, T, E);
    if ((rc = REAL_DECODE_ROW(f->gate_inp_shexp, 0, r->vec, err))) return rc;
    for (int64_t t = 0; t < T; t++) a->sh_s[t] = 1 / (1 + R_EXP(-dot(r->vec, a->xn + t * E, E)));
    {
        const int64_t shape[1] = {T};
        TD_TAP(sink, l, "ffn_shexp_gate", REAL_DTYPE, a->sh_s, 1, shape);
    }
    for (int64_t t = 0; t < T; t++)
        for (int64_t i = 0; i < E; i++) a->proj[t * E + i] += a->sh_s[t] * a->sh_y[t * E + i];
    return TD_OK;
}

/* ===================================================================== */
/* qwen4exp: hyper-connections and PLE (arch-qwen4exp.md §4.1, §4.6)      */
/* ===================================================================== */

/* An {E, hc} gamma (or the same values stored flat, {hc*E}) into out (hc, E). */
static int decode_gamma(ref_backend *r, const td_tensor *g, real *out, td_err *err) {
    const int64_t E = r->hp.n_embd, hc = r->hp.hc;
    int rc = TD_OK;
    if (g->ne[0] != E) return REAL_DECODE_ROW(g, 0, out, err); // flat, stream-major already
    for (int64_t c = 0; c < hc && !rc; c++) rc = REAL_DECODE_ROW(g, (uint64_t)c, out + c * E, err);
    return rc;
}

/* HCMix (§4.1) of the streams a->rs (T, hcd): the mixed vector into a->xn
 * (T, E), the inject into a->hinj (T, hc) when the mixer has one. The three
 * projections are matmuls, so a profile rounds their inputs as it rounds any
 * other weight's. gate_tap / inj_tap: the names of the gate and inject taps. */
static int hc_mix(ref_backend *r, const td_hc_parts *P, int l, int64_t T, const char *gate_tap, const char *inj_tap,
                  td_tap_sink *sink, td_err *err) {
    const td_hparams *hp = &r->hp;
    ref_acts *a = &r->a;
    const int64_t E = hp->n_embd, hc = hp->hc, hcd = hc * E, lr = hp->hc_lr;
    const real eps = (real)hp->rms_eps;
    int rc;
    if ((rc = decode_gamma(r, P->norm, r->hcw, err))) return rc;
    for (int64_t t = 0; t < T; t++)
        for (int64_t c = 0; c < hc; c++)
            FN(rmsnorm)(a->hflat + t * hcd + c * E, a->rs + t * hcd + c * E, r->hcw + c * E, eps, E);
    if ((rc = matmul(r, a->hlam, a->hflat, P->down, NULL, 0, T, hcd, lr, err))) return rc;
    for (int64_t i = 0; i < T * lr; i++) {
        const real z = a->hlam[i] / (real)hc;
        a->hlam[i] = z / (1 + R_EXP(-z));
    }
    if ((rc = matmul(r, a->hgam, a->hlam, P->up, NULL, 0, T, lr, hcd, err))) return rc;
    tap2(sink, l, gate_tap, a->hgam, T, hcd);
    if (P->inject) {
        if ((rc = matmul(r, a->hinj, a->hflat, P->inject, NULL, 0, T, hcd, hc, err))) return rc;
        tap2(sink, l, inj_tap, a->hinj, T, hc);
    }
    for (int64_t t = 0; t < T; t++)
        for (int64_t e = 0; e < E; e++) {
            real acc = 0;
            for (int64_t c = 0; c < hc; c++)
                acc += a->hflat[t * hcd + c * E + e] / (1 + R_EXP(-a->hgam[t * hcd + c * E + e]));
            a->xn[t * E + e] = acc / (real)hc; // the mean over the streams
        }
    return TD_OK;
}

/* The PLE inputs of the step (§4.6): each position's n-gram context from the
 * sequence's token history r->toks, the hashed rows, and P (T, E) =
 * the rows concatenated. Every id here is a text token (no embedding input). */
static int ple_inputs(ref_backend *r, int64_t T, td_tap_sink *sink, td_err *err) {
    const td_hparams *hp = &r->hp;
    ref_acts *a = &r->a;
    const int64_t E = hp->n_embd, Ng = hp->ple_ngram, Np = hp->ple_n_heads, dp = hp->ple_dim;
    int64_t ctx[8], rows[64];
    for (int64_t t = 0; t < T; t++) {
        td_ref_ple_context(ctx, r->toks, a->pos[t], hp->ple_ngram, hp->ple_eos, hp->ple_image);
        td_ref_ple_rows(rows, ctx, hp->ple_ngram, hp->ple_heads_per_ngram, hp->ple_mult, hp->ple_off, hp->ple_vsz);
        for (int64_t i = 0; i < Ng; i++) a->ple_ids[t * Ng + i] = (int32_t)ctx[i];
        for (int64_t h = 0; h < Np; h++) {
            a->ple_rows[t * Np + h] = (int32_t)rows[h]; // < 2^31: the loader checked O_h + V_h
            int rc = REAL_DECODE_ROW(r->m->ple_table, (uint64_t)rows[h], a->ple_p + t * E + h * dp, err);
            if (rc) return rc;
        }
    }
    const int64_t s_ids[2] = {T, Ng}, s_rows[2] = {T, Np};
    TD_TAP(sink, -1, "inp.ple_ids", TD_DT_I32, a->ple_ids, 2, s_ids);
    TD_TAP(sink, -1, "inp.ple_rows", TD_DT_I32, a->ple_rows, 2, s_rows);
    tap2(sink, -1, "inp.ple_embd", a->ple_p, T, E);
    return TD_OK;
}

/* The PLE block of layer l on the streams a->rs (§4.6): a gate per stream
 * from the key/query score, the gated value, and the dilated causal conv
 * (dilation n_g) over its RMSNorm, token by token through the conv history. */
static int ple_block(ref_backend *r, int l, int64_t T, td_tap_sink *sink, td_err *err) {
    const td_hparams *hp = &r->hp;
    const td_ple_parts *P = &r->m->layers[l].ple;
    ref_acts *a = &r->a;
    const int64_t E = hp->n_embd, hc = hp->hc, hcd = hc * E, Kp = hp->ple_conv, Ng = hp->ple_ngram;
    const int64_t Sp = (Kp - 1) * Ng; // history rows
    const real eps = (real)hp->rms_eps;
    int rc;

    if ((rc = matmul(r, a->ple_k, a->ple_p, P->key, NULL, 0, T, E, hcd, err))) return rc;
    if ((rc = decode_gamma(r, P->norm_key, r->hcw, err))) return rc;
    if ((rc = decode_gamma(r, P->norm_query, r->hcw2, err))) return rc;
    for (int64_t t = 0; t < T; t++)
        for (int64_t c = 0; c < hc; c++) {
            real *k = a->ple_k + t * hcd + c * E, *q = a->hflat + t * hcd + c * E;
            FN(rmsnorm)(k, k, r->hcw + c * E, eps, E);
            FN(rmsnorm)(q, a->rs + t * hcd + c * E, r->hcw2 + c * E, eps, E);
            const real sc = dot(k, q, E) / R_SQRT((real)E);
            const real abs_sc = sc < 0 ? -sc : sc;
            const real mag = R_SQRT(abs_sc > (real)1e-6 ? abs_sc : (real)1e-6);
            const real arg = sc > 0 ? mag : sc < 0 ? -mag : 0; // sign(0) = 0: the gate is 1/2
            a->ple_g[t * hc + c] = 1 / (1 + R_EXP(-arg));
        }
    tap2(sink, l, "ple_gate", a->ple_g, T, hc);
    if ((rc = matmul(r, a->ple_v, a->ple_p, P->value, NULL, 0, T, E, E, err))) return rc;
    for (int64_t t = 0; t < T; t++)
        for (int64_t c = 0; c < hc; c++)
            for (int64_t e = 0; e < E; e++) a->ple_gv[t * hcd + c * E + e] = a->ple_g[t * hc + c] * a->ple_v[t * E + e];
    tap2(sink, l, "ple_gated", a->ple_gv, T, hcd);

    if ((rc = decode_gamma(r, P->norm_conv, r->hcw, err))) return rc;
    for (int64_t t = 0; t < T; t++)
        for (int64_t c = 0; c < hc; c++)
            FN(rmsnorm)(a->ple_nv + t * hcd + c * E, a->ple_gv + t * hcd + c * E, r->hcw + c * E, eps, E);
    // channel ch = c*E + e; tap k (oldest first) reads the input (Kp-1-k)*Ng tokens back
    real *st = r->ple_state; // (Sp, hcd), oldest row first
    real *w = r->row;        // (Kp) one channel's taps
    for (int64_t ch = 0; ch < hcd; ch++) {
        if ((rc = REAL_DECODE_ROW(P->conv, (uint64_t)ch, w, err))) return rc;
        for (int64_t t = 0; t < T; t++) {
            const real u = a->ple_nv[t * hcd + ch];
            real y = 0;
            for (int64_t k = 0; k < Kp; k++) {
                const int64_t back = (Kp - 1 - k) * Ng;
                y += w[k] * (back == 0 ? u : st[(Sp - back) * hcd + ch]);
            }
            for (int64_t i = 0; i + 1 < Sp; i++) st[i * hcd + ch] = st[(i + 1) * hcd + ch];
            if (Sp > 0) st[(Sp - 1) * hcd + ch] = u;
            a->ple_cv[t * hcd + ch] = y / (1 + R_EXP(-y)); // silu
        }
    }
    tap2(sink, l, "ple_conv", a->ple_cv, T, hcd);
    if (Sp > 0) tap2(sink, l, "ple_conv_state", st, Sp, hcd);
    for (int64_t i = 0; i < T * hcd; i++) a->rs[i] += a->ple_gv[i] + a->ple_cv[i];
    tap2(sink, l, "ple_out", a->rs, T, hcd);
    return TD_OK;
}

/* One qwen4exp block (§4.2) on the streams a->rs: [PLE], the attention HC
 * mixer, the GDN or QSA attention, the combine, the FFN HC mixer, MoE +
 * shared expert, the combine. */
static int hc_layer_forward(ref_backend *r, int l, int64_t T, td_tap_sink *sink, td_err *err) {
    const td_layer *L = &r->m->layers[l];
    ref_acts *a = &r->a;
    const int64_t E = r->hp.n_embd, hc = r->hp.hc, hcd = hc * E;
    int rc;
    if (l == r->hp.ple_layer && (rc = ple_block(r, l, T, sink, err))) return rc;
    if ((rc = hc_mix(r, &L->hc_attn, l, T, "hc_attn_gate", "hc_attn_inject", sink, err))) return rc;
    tap2(sink, l, "attn_norm", a->xn, T, E);
    rc = L->kind == TD_LAYER_HC_GDN ? gdn_block(r, l, T, sink, err) : attention_block(r, l, T, sink, err);
    if (rc) return rc;
    for (int64_t t = 0; t < T; t++) FN(hc_combine)(a->rs + t * hcd, a->proj + t * E, a->hinj + t * hc, hc, E);
    tap2(sink, l, "ffn_inp", a->rs, T, hcd);
    if ((rc = hc_mix(r, &L->hc_ffn, l, T, "hc_ffn_gate", "hc_ffn_inject", sink, err))) return rc;
    tap2(sink, l, "ffn_norm", a->xn, T, E);
    if ((rc = ffn_moe(r, l, T, sink, err))) return rc;
    if ((rc = ffn_shared_expert(r, l, T, sink, err))) return rc;
    tap2(sink, l, "ffn_out", a->proj, T, E);
    for (int64_t t = 0; t < T; t++) FN(hc_combine)(a->rs + t * hcd, a->proj + t * E, a->hinj + t * hc, hc, E);
    tap2(sink, l, "out", a->rs, T, hcd);
    return TD_OK;
}

static int layer_forward(ref_backend *r, int l, int64_t T, td_tap_sink *sink, td_err *err) {
    const td_layer *L = &r->m->layers[l];
    ref_acts *a = &r->a;
    const int64_t E = r->hp.n_embd;
    int rc = TD_OK;

    // the mixer of this block's kind (ref_open refused kinds not in layer_kinds)
    switch (L->kind) {
    case TD_LAYER_ATTENTION: rc = attention_block(r, l, T, sink, err); break;
    case TD_LAYER_GDN: rc = gdn_block(r, l, T, sink, err); break;
    case TD_LAYER_HC_GDN: // qwen4exp: its streams replace the residual
    case TD_LAYER_HC_QSA: return hc_layer_forward(r, l, T, sink, err);
    case TD_LAYER_KIND_COUNT: TD_ASSERT(0 && "layer kind refused at open");
    }
    if (rc) return rc;
    for (int64_t i = 0; i < T * E; i++) a->x[i] += a->proj[i];
    tap2(sink, l, "ffn_inp", a->x, T, E);

    if ((rc = rmsnorm_rows(r, a->xn, a->x, L->ffn.norm, T, E, err))) return rc;
    tap2(sink, l, "ffn_norm", a->xn, T, E);
    rc = L->ffn.gate_inp ? ffn_moe(r, l, T, sink, err) : ffn_dense(r, l, T, sink, err);
    if (rc) return rc;
    if (L->ffn.gate_inp_shexp && (rc = ffn_shared_expert(r, l, T, sink, err))) return rc;
    tap2(sink, l, "ffn_out", a->proj, T, E);

    for (int64_t i = 0; i < T * E; i++) a->x[i] += a->proj[i];
    tap2(sink, l, "out", a->x, T, E);
    return TD_OK;
}

static int ref_forward(td_backend *b, const int32_t *tokens, int64_t T, int64_t pos0, td_tap_sink *sink,
                       double *logits, td_err *err) {
    ref_backend *r = (ref_backend *)b;
    const td_hparams *hp = &r->hp;
    const int64_t E = hp->n_embd, V = hp->n_vocab;
    int rc;

    if ((rc = td_fwd_check_step(REF_NAME, tokens, T, pos0, r->n_past, r->n_ctx, V, err))) return rc;
    td_act_ties_forward(); // names the near-ties of this forward (profile.h)

    acts_ensure(r, T);
    kv_ensure(r, pos0 + T);
    ref_acts *a = &r->a;
    for (int64_t t = 0; t < T; t++) a->pos[t] = pos0 + t;
    td_fwd_tap_inputs(sink, tokens, T, pos0, a->pos32);

    // embedding lookup: row `token` of token_embd
    for (int64_t t = 0; t < T; t++)
        if ((rc = REAL_DECODE_ROW(r->m->tok_embd, (uint64_t)tokens[t], a->x + t * E, err))) return rc;
    tap2(sink, -1, "inp.embd", a->x, T, E);
    const int hc_model = hp->arch == TD_ARCH_QWEN4EXP;
    if (hc_model) {
        const int64_t hc = hp->hc;
        for (int64_t t = 0; t < T; t++) // hc_init: every stream starts as the embedding
            for (int64_t c = 0; c < hc; c++) memcpy(a->rs + (t * hc + c) * E, a->x + t * E, (size_t)E * sizeof(real));
        // the n-gram history: this step's ids at their positions (committed with n_past on success)
        memcpy(r->toks + pos0, tokens, (size_t)T * sizeof(int32_t));
        if (hp->ple_layer >= 0 && (rc = ple_inputs(r, T, sink, err))) return rc;
    }

    for (uint32_t l = 0; l < hp->n_layer; l++)
        if ((rc = layer_forward(r, (int)l, T, sink, err))) return rc;

    if (hc_model) { // the final norm is an HC mixer without inject
        if ((rc = hc_mix(r, &r->m->hc_out, -1, T, "out.hc_gate", NULL, sink, err))) return rc;
    } else if ((rc = rmsnorm_rows(r, a->xn, a->x, r->m->output_norm, T, E, err))) return rc;
    tap2(sink, -1, "out.norm", a->xn, T, E);
    // output.weight, or token_embd.weight when tied (the model binds either)
    if ((rc = matmul(r, a->logits, a->xn, r->m->output, NULL, 0, T, E, V, err))) return rc;
    tap2(sink, -1, "out.logits", a->logits, T, V);
    for (int64_t i = 0; i < T * V; i++) logits[i] = (double)a->logits[i];

    // the step succeeded: commit its positions and tokens
    r->n_past = pos0 + T;
    td_hist_push(&r->hist, tokens, T);
    td_hist_tap(&r->hist, sink);
    return TD_OK;
}

/* ===================================================================== */
/* Backend table                                                          */
/* ===================================================================== */

/* Values in the PLE conv history: (K_p - 1)*n_g rows of hc*E (1 when none). */
static size_t ple_state_size(const td_hparams *hp) {
    const size_t n = (size_t)(hp->ple_conv ? hp->ple_conv - 1 : 0) * hp->ple_ngram * hp->hc * hp->n_embd;
    return n ? n : 1;
}

/* A new sequence: zero GDN conv and recurrent states (and qwen4exp's PLE
 * conv history; the token history is rewritten as positions are). */
static void state_zero(ref_backend *r) {
    const td_hparams *hp = &r->hp;
    const size_t KD = (size_t)hp->ssm_n_group * hp->ssm_d_state, C = 2 * KD + hp->ssm_d_inner;
    for (uint32_t l = 0; r->conv_state && l < hp->n_layer; l++) {
        if (r->conv_state[l]) memset(r->conv_state[l], 0, C * (hp->ssm_conv - 1) * sizeof(real));
        if (r->ssm_state[l])
            memset(r->ssm_state[l], 0, (size_t)hp->ssm_dt_rank * hp->ssm_d_state * hp->ssm_d_state * sizeof(real));
    }
    if (r->ple_state) memset(r->ple_state, 0, ple_state_size(hp) * sizeof(real));
}

static void ref_reset(td_backend *b) {
    ref_backend *r = (ref_backend *)b;
    r->n_past = 0;
    td_hist_reset(&r->hist);
    state_zero(r);
}

static void ref_close(td_backend *b) {
    ref_backend *r = (ref_backend *)b;
    if (!r) return;
    for (uint32_t l = 0; l < r->hp.n_layer; l++) {
        free(r->k_cache[l]);
        free(r->v_cache[l]);
        if (r->conv_state) free(r->conv_state[l]), free(r->ssm_state[l]);
        if (r->idx_cache) free(r->idx_cache[l]);
    }
    free(r->idx_cache), free(r->toks), free(r->ple_state), free(r->hcw), free(r->hcw2), free(r->qsa_kb), free(r->qsa_sc);
    free(r->conv_state), free(r->ssm_state), free(r->vec), free(r->vec2);
    free(r->k_cache), free(r->v_cache), free(r->att);
    free(r->rope_ff), free(r->row), free(r->bias), free(r->normw), free(r->qin), free(r->k16), free(r->v16);
    acts_free(&r->a);
    td_ref_pool_free(r->pool), free(r->mm_rc), free(r->mm_err);
    free(r);
}

static const char *ref_version(const td_backend *b) {
    (void)b;
    return "tapdiff " TD_VERSION " (" TD_GIT_REV ") reference, scalar " REF_PRECISION;
}

static int check_matrix(const td_tensor *t, const char *what, int l, int64_t n_in, int64_t n_rows, td_err *err) {
    return td_fwd_check_matrix(REF_NAME, t, what, l, n_in, n_rows, err);
}

static int check_hc(const td_hc_parts *P, const char *what, int l, const td_hparams *hp, td_err *err) {
    const int64_t E = hp->n_embd, hcd = (int64_t)hp->hc * E, lr = hp->hc_lr;
    char n[64];
    int rc;
    if (!P->norm || !(P->norm->ne[0] == E ? P->norm->n_rows >= hp->hc : P->norm->ne[0] == hcd))
        return td_err_set(err, TD_EINPUT, REF_NAME ": layer %d: %s_norm is missing or not {E, hc}", l, what);
    snprintf(n, sizeof n, "%s_down", what);
    if ((rc = check_matrix(P->down, n, l, hcd, lr, err))) return rc;
    snprintf(n, sizeof n, "%s_up", what);
    if ((rc = check_matrix(P->up, n, l, lr, hcd, err))) return rc;
    snprintf(n, sizeof n, "%s_inject", what);
    if (P->inject && (rc = check_matrix(P->inject, n, l, hcd, hp->hc, err))) return rc;
    return TD_OK;
}

/* What the qwen4exp forward reads beyond check_model's shared parts. */
static int check_model_hc(const td_model *m, td_err *err) {
    const td_hparams *hp = &m->hp;
    const int64_t E = hp->n_embd, H = hp->n_head, Hkv = hp->n_head_kv, D = hp->head_dim, F = hp->n_ff;
    const int64_t X = hp->n_expert, V = hp->n_vocab, hcd = (int64_t)hp->hc * E, Fs = hp->n_ff_shexp;
    const int64_t Hk = hp->ssm_n_group, Hv = hp->ssm_dt_rank, dk = hp->ssm_d_state, di = hp->idx_dim;
    int rc;
    if (hp->hc < 2 || hp->hc_lr < 1 || hp->rope_scaling == TD_ROPE_SCALING_YARN || hp->n_layer > 256)
        return td_err_set(err, TD_EINPUT, REF_NAME ": qwen4exp needs hc > 1 streams, hc_lr > 0, no YaRN, <= 256 layers");
    if ((rc = check_matrix(m->tok_embd, "token_embd", -1, E, V, err))) return rc;
    if ((rc = check_matrix(m->output, "output", -1, E, V, err))) return rc;
    if ((rc = check_hc(&m->hc_out, "output_hc", -1, hp, err))) return rc;
    if (hp->ple_layer >= 0) {
        if (hp->ple_layer >= (int32_t)hp->n_layer || hp->ple_ngram < 2 || hp->ple_ngram > 8 || hp->ple_n_heads > 64 ||
            (int64_t)hp->ple_n_heads * hp->ple_dim != E)
            return td_err_set(err, TD_EINPUT, REF_NAME ": the PLE sizes are inconsistent (n_p * d_p must be E)");
        if ((rc = check_matrix(m->ple_table, "per_layer_token_embd", -1, hp->ple_dim, (int64_t)hp->ple_rows, err))) return rc;
        const td_ple_parts *P = &m->layers[hp->ple_layer].ple;
        const int l = hp->ple_layer;
        if ((rc = check_matrix(P->key, "ple_key", l, E, hcd, err))) return rc;
        if ((rc = check_matrix(P->value, "ple_value", l, E, E, err))) return rc;
        if ((rc = check_matrix(P->conv, "ple_conv1d", l, hp->ple_conv, hcd, err))) return rc;
        if (!P->norm_key || !P->norm_query || !P->norm_conv)
            return td_err_set(err, TD_EINPUT, REF_NAME ": layer %d: a PLE norm gamma is missing", l);
    }
    for (uint32_t i = 0; i < hp->n_layer; i++) {
        const td_layer *L = &m->layers[i];
        const int l = (int)i;
        if ((rc = check_hc(&L->hc_attn, "hc_attn", l, hp, err))) return rc;
        if ((rc = check_hc(&L->hc_ffn, "hc_ffn", l, hp, err))) return rc;
        if (!L->hc_attn.inject || !L->hc_ffn.inject)
            return td_err_set(err, TD_EINPUT, REF_NAME ": layer %d: an HC inject is missing", l);
        if (L->kind == TD_LAYER_HC_GDN) {
            const td_gdn_parts *G = &L->gdn;
            if (Hk < 1 || Hv < 1 || dk < 1 || Hv % Hk || hp->ssm_conv < 1 || hp->ssm_d_inner != Hv * dk)
                return td_err_set(err, TD_EINPUT, REF_NAME ": layer %d is a GDN layer but the ssm sizes are inconsistent", l);
            const int64_t KD = Hk * dk, VD = Hv * dk;
            if ((rc = check_matrix(G->wqkv, "attn_qkv", l, E, 2 * KD + VD, err))) return rc;
            if ((rc = check_matrix(G->wgate, "attn_gate", l, E, VD, err))) return rc;
            if ((rc = check_matrix(G->wbeta, "ssm_beta", l, E, Hv, err))) return rc;
            if ((rc = check_matrix(G->walpha, "ssm_alpha", l, E, Hv, err))) return rc;
            if ((rc = check_matrix(G->conv, "ssm_conv1d", l, hp->ssm_conv, 2 * KD + VD, err))) return rc;
            if ((rc = check_matrix(G->dt_bias, "ssm_dt.bias", l, Hv, 1, err))) return rc;
            if ((rc = check_matrix(G->a, "ssm_a", l, Hv, 1, err))) return rc;
            if ((rc = check_matrix(G->ssm_norm, "ssm_norm", l, dk, 1, err))) return rc;
            if ((rc = check_matrix(G->wout, "ssm_out", l, VD, E, err))) return rc;
        } else {
            if ((rc = check_matrix(L->attn.wq, "attn_q", l, E, 2 * H * D, err))) return rc;
            if ((rc = check_matrix(L->attn.wk, "attn_k", l, E, Hkv * D, err))) return rc;
            if ((rc = check_matrix(L->attn.wv, "attn_v", l, E, Hkv * D, err))) return rc;
            if ((rc = check_matrix(L->attn.wo, "attn_output", l, H * D, E, err))) return rc;
            if ((rc = check_matrix(L->attn.q_norm, "attn_q_norm", l, D, 1, err))) return rc;
            if ((rc = check_matrix(L->attn.k_norm, "attn_k_norm", l, D, 1, err))) return rc;
            if (!L->attn.q_gated)
                return td_err_set(err, TD_EINPUT, REF_NAME ": layer %d: qwen4exp's attn_q must hold [q; gate]", l);
            if (hp->qsa_ratio[i]) {
                if (hp->idx_heads < 1 || di < hp->rope_dims)
                    return td_err_set(err, TD_EINPUT, REF_NAME ": layer %d: indexer sizes are inconsistent", l);
                if ((rc = check_matrix(L->qsa.wq, "indexer.q_proj", l, E, (int64_t)hp->idx_heads * di, err))) return rc;
                if ((rc = check_matrix(L->qsa.wk, "indexer.k_proj", l, E, di, err))) return rc;
                if ((rc = check_matrix(L->qsa.q_norm, "indexer.q_norm", l, di, 1, err))) return rc;
                if ((rc = check_matrix(L->qsa.k_norm, "indexer.k_norm", l, di, 1, err))) return rc;
            }
        }
        const td_ffn_parts *f = &L->ffn;
        if (X < 1 || !f->gate_exps || !f->gate_inp_shexp)
            return td_err_set(err, TD_EINPUT, REF_NAME ": layer %d: qwen4exp needs a gated MoE with a shared expert", l);
        if ((rc = check_matrix(f->gate_inp, "ffn_gate_inp", l, E, X, err))) return rc;
        if ((rc = check_matrix(f->up_exps, "ffn_up_exps", l, E, X * F, err))) return rc;
        if ((rc = check_matrix(f->gate_exps, "ffn_gate_exps", l, E, X * F, err))) return rc;
        if ((rc = check_matrix(f->down_exps, "ffn_down_exps", l, F, X * E, err))) return rc;
        if ((rc = check_matrix(f->gate_inp_shexp, "ffn_gate_inp_shexp", l, E, 1, err))) return rc;
        if ((rc = check_matrix(f->gate_shexp, "ffn_gate_shexp", l, E, Fs, err))) return rc;
        if ((rc = check_matrix(f->up_shexp, "ffn_up_shexp", l, E, Fs, err))) return rc;
        if ((rc = check_matrix(f->down_shexp, "ffn_down_shexp", l, Fs, E, err))) return rc;
    }
    return TD_OK;
}

/* Checks what the forward relies on, so that a model built by other code than
 * the loader fails with a message rather than an assertion. */
static int check_model(const td_model *m, td_err *err) {
    const td_hparams *hp = &m->hp;
    const int64_t E = hp->n_embd, H = hp->n_head, Hkv = hp->n_head_kv, D = hp->head_dim, F = hp->n_ff;
    const int64_t X = hp->n_expert, V = hp->n_vocab;
    int rc;
    if ((rc = td_fwd_check_model(REF_NAME, FN(backend).layer_kinds, m, err))) return rc;
    if (hp->arch == TD_ARCH_QWEN4EXP) return check_model_hc(m, err);
    if ((rc = check_matrix(m->tok_embd, "token_embd", -1, E, V, err))) return rc;
    if ((rc = check_matrix(m->output, "output", -1, E, V, err))) return rc;
    if ((rc = check_matrix(m->output_norm, "output_norm", -1, E, 1, err))) return rc;
    if (m->rope_freqs && (rc = check_matrix(m->rope_freqs, "rope_freqs", -1, hp->rope_dims / 2, 1, err))) return rc;
    for (uint32_t i = 0; i < hp->n_layer; i++) {
        const td_layer *L = &m->layers[i];
        const int l = (int)i;
        if (L->kind == TD_LAYER_GDN) {
            const td_gdn_parts *G = &L->gdn;
            const int64_t Hk = hp->ssm_n_group, Hv = hp->ssm_dt_rank, dk = hp->ssm_d_state;
            if (Hk < 1 || Hv < 1 || dk < 1 || Hv % Hk || hp->ssm_conv < 1 || hp->ssm_d_inner != Hv * dk)
                return td_err_set(err, TD_EINPUT, REF_NAME ": layer %d is a GDN layer but the ssm sizes are inconsistent", l);
            const int64_t KD = Hk * dk, VD = Hv * dk;
            if ((rc = check_matrix(G->norm, "attn_norm", l, E, 1, err))) return rc;
            if ((rc = check_matrix(G->wqkv, "attn_qkv", l, E, 2 * KD + VD, err))) return rc;
            if ((rc = check_matrix(G->wgate, "attn_gate", l, E, VD, err))) return rc;
            if ((rc = check_matrix(G->wba, "ssm_ba", l, E, 2 * Hv, err))) return rc;
            if ((rc = check_matrix(G->conv, "ssm_conv1d", l, hp->ssm_conv, 2 * KD + VD, err))) return rc;
            if ((rc = check_matrix(G->dt_bias, "ssm_dt.bias", l, Hv, 1, err))) return rc;
            if ((rc = check_matrix(G->a, "ssm_a", l, Hv, 1, err))) return rc;
            if ((rc = check_matrix(G->ssm_norm, "ssm_norm", l, dk, 1, err))) return rc;
            if ((rc = check_matrix(G->wout, "ssm_out", l, VD, E, err))) return rc;
        } else if ((rc = check_matrix(L->attn.norm, "attn_norm", l, E, 1, err))) return rc;
        if (L->kind == TD_LAYER_GDN) {
        } else if (L->attn.q_gated) {
            if ((rc = check_matrix(L->attn.wq, "attn_q", l, E, 2 * H * D, err))) return rc;
            if ((rc = check_matrix(L->attn.wk, "attn_k", l, E, Hkv * D, err))) return rc;
            if ((rc = check_matrix(L->attn.wv, "attn_v", l, E, Hkv * D, err))) return rc;
        } else if (L->attn.wqkv) {
            if ((rc = check_matrix(L->attn.wqkv, "attn_qkv", l, E, (H + 2 * Hkv) * D, err))) return rc;
            if (L->attn.bqkv && (rc = check_matrix(L->attn.bqkv, "attn_qkv.bias", l, (H + 2 * Hkv) * D, 1, err))) return rc;
        } else {
            if ((rc = check_matrix(L->attn.wq, "attn_q", l, E, H * D, err))) return rc;
            if ((rc = check_matrix(L->attn.wk, "attn_k", l, E, Hkv * D, err))) return rc;
            if ((rc = check_matrix(L->attn.wv, "attn_v", l, E, Hkv * D, err))) return rc;
            if (L->attn.bq && (rc = check_matrix(L->attn.bq, "attn_q.bias", l, H * D, 1, err))) return rc;
            if (L->attn.bk && (rc = check_matrix(L->attn.bk, "attn_k.bias", l, Hkv * D, 1, err))) return rc;
            if (L->attn.bv && (rc = check_matrix(L->attn.bv, "attn_v.bias", l, Hkv * D, 1, err))) return rc;
        }
        if (L->kind != TD_LAYER_GDN && (rc = check_matrix(L->attn.wo, "attn_output", l, H * D, E, err))) return rc;
        if (L->attn.bo && (rc = check_matrix(L->attn.bo, "attn_output.bias", l, E, 1, err))) return rc;
        if (L->attn.q_norm && (rc = check_matrix(L->attn.q_norm, "attn_q_norm", l, D, 1, err))) return rc;
        if (L->attn.k_norm && (rc = check_matrix(L->attn.k_norm, "attn_k_norm", l, D, 1, err))) return rc;
        if ((rc = check_matrix(L->ffn.norm, "ffn_norm", l, E, 1, err))) return rc;
        if (L->ffn.gate_inp) {
            if (X < 1) return td_err_set(err, TD_EINPUT, REF_NAME ": layer %d has a router but expert_count is 0", l);
            if ((rc = check_matrix(L->ffn.gate_inp, "ffn_gate_inp", l, E, X, err))) return rc;
            if ((rc = check_matrix(L->ffn.up_exps, "ffn_up_exps", l, E, X * F, err))) return rc;
            if (L->ffn.gate_exps && (rc = check_matrix(L->ffn.gate_exps, "ffn_gate_exps", l, E, X * F, err))) return rc;
            if ((rc = check_matrix(L->ffn.down_exps, "ffn_down_exps", l, F, X * E, err))) return rc;
            if (L->ffn.gate_inp_shexp) {
                const int64_t Fs = hp->n_ff_shexp;
                if ((rc = check_matrix(L->ffn.gate_inp_shexp, "ffn_gate_inp_shexp", l, E, 1, err))) return rc;
                if ((rc = check_matrix(L->ffn.gate_shexp, "ffn_gate_shexp", l, E, Fs, err))) return rc;
                if ((rc = check_matrix(L->ffn.up_shexp, "ffn_up_shexp", l, E, Fs, err))) return rc;
                if ((rc = check_matrix(L->ffn.down_shexp, "ffn_down_shexp", l, Fs, E, err))) return rc;
            }
        } else {
            if ((rc = check_matrix(L->ffn.gate, "ffn_gate", l, E, F, err))) return rc;
            if ((rc = check_matrix(L->ffn.up, "ffn_up", l, E, F, err))) return rc;
            if ((rc = check_matrix(L->ffn.down, "ffn_down", l, F, E, err))) return rc;
        }
    }
    return TD_OK;
}

static int ref_open(td_backend **out, const td_model *m, const td_backend_params *p, td_err *err);

static const char *ref_profile_of(const td_backend *b) {
    return ((const ref_backend *)b)->profile_name;
}

const td_backend_vt FN(backend) = {
    .name = REF_NAME,
    .precision = REF_PRECISION,
    .open = ref_open,
    .forward = ref_forward,
    .reset = ref_reset,
    .close = ref_close,
    .version = ref_version,
    .profile_of = ref_profile_of,
    .layer_kinds = TD_KINDS(TD_LAYER_ATTENTION) | TD_KINDS(TD_LAYER_GDN) | TD_KINDS(TD_LAYER_HC_GDN) |
                   TD_KINDS(TD_LAYER_HC_QSA),
    .faults = 0, // the oracle carries no bug on purpose
};

static int ref_open(td_backend **out, const td_model *m, const td_backend_params *p, td_err *err) {
    *out = NULL;
    if (p && p->inject && p->inject[0])
        return td_err_set(err, TD_EINPUT, REF_NAME ": fault injection '%s' is not available in the reference", p->inject);
    // any profile: ref32 is then the control of an arm that rounds so, ref
    // the profile-matched oracle (the same roundings, the rest in f64)
    td_profile profile;
    char why[256];
    if (td_profile_parse(p ? p->profile : NULL, &profile, why, sizeof why))
        return td_err_set(err, TD_EINPUT, REF_NAME ": arithmetic profile '%s': %s", p->profile, why);
    int rc = check_model(m, err);
    if (rc) return rc;

    ref_backend *r = td_xcalloc(1, sizeof *r);
    r->base.vt = &FN(backend);
    r->profile = profile;
    td_profile_format(&profile, r->profile_name, sizeof r->profile_name);
    r->m = m;
    r->hp = m->hp;
    const td_hparams *hp = &r->hp;
    r->n_ctx = p && p->n_ctx ? p->n_ctx : hp->n_ctx_train;
    if (r->n_ctx < 1) r->n_ctx = 4096;
    r->rope = (td_ref_rope){
        .type = hp->rope_type,
        .D = hp->head_dim,
        .R = hp->rope_dims,
        .base = hp->rope_base,
        .scaling = hp->rope_scaling,
        .freq_scale = hp->rope_freq_scale,
        .attn_factor = hp->rope_attn_factor,
        .n_ctx_orig = hp->rope_n_ctx_orig,
        .angle = (int)td_profile_rope_angle(&profile),
        .trig_u = (profile.rules & TD_RULE_ROPE_TRIG) ? profile.rope_trig_u : 0,
    };
    const int64_t E = hp->n_embd, HD = (int64_t)hp->n_head * hp->head_dim, F = hp->n_ff;
    const int64_t QKV = (int64_t)(hp->n_head + 2 * hp->n_head_kv) * hp->head_dim;
    const int64_t Fs = hp->n_ff_shexp, VD = hp->ssm_d_inner;
    const int64_t C = 2 * (int64_t)hp->ssm_n_group * hp->ssm_d_state + VD;
    r->max_in = max3(max3(E, HD, F), Fs, VD);
    r->max_in = max3(r->max_in, hp->ssm_conv, 1);
    const int64_t hcd = (int64_t)hp->hc * E; // qwen4exp's stream stack (0 elsewhere)
    r->max_in = max3(r->max_in, hcd, max3(hp->hc_lr, hp->ple_conv, 1));
    r->max_out = max3(max3(E, QKV, F), max3(Fs, C, 2 * HD), 1);
    // threads 0 (the backend default) is one: the oracle stays sequential unless asked
    r->pool = td_ref_pool_new(p && p->threads > 1 ? p->threads : 1);
    r->row = td_xcalloc((size_t)td_ref_pool_size(r->pool) * r->max_in, sizeof(real));
    r->mm_rc = td_xcalloc((size_t)td_ref_pool_size(r->pool), sizeof(int));
    r->mm_err = td_xcalloc((size_t)td_ref_pool_size(r->pool), sizeof(td_err));
    r->bias = td_xcalloc((size_t)r->max_out, sizeof(real));
    r->normw = td_xcalloc((size_t)max3(max3(E, hp->head_dim, hp->ssm_d_state), hp->idx_dim, 1), sizeof(real));
    r->vec = td_xcalloc((size_t)max3(E, hp->ssm_dt_rank, 1), sizeof(real));
    r->vec2 = td_xcalloc((size_t)max3(hp->ssm_dt_rank, 1, 1), sizeof(real));
    r->conv_state = td_xcalloc(hp->n_layer ? hp->n_layer : 1, sizeof(real *));
    r->ssm_state = td_xcalloc(hp->n_layer ? hp->n_layer : 1, sizeof(real *));
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        if (m->layers[l].kind != TD_LAYER_GDN && m->layers[l].kind != TD_LAYER_HC_GDN) continue;
        r->conv_state[l] = td_xcalloc((size_t)C * (hp->ssm_conv - 1) + 1, sizeof(real));
        r->ssm_state[l] = td_xcalloc((size_t)hp->ssm_dt_rank * hp->ssm_d_state * hp->ssm_d_state, sizeof(real));
    }
    r->k_cache = td_xcalloc(hp->n_layer ? hp->n_layer : 1, sizeof(real *));
    r->v_cache = td_xcalloc(hp->n_layer ? hp->n_layer : 1, sizeof(real *));
    if (hp->arch == TD_ARCH_QWEN4EXP) {
        r->idx_cache = td_xcalloc(hp->n_layer ? hp->n_layer : 1, sizeof(real *));
        r->ple_state = td_xcalloc(ple_state_size(hp), sizeof(real));
        r->hcw = td_xcalloc((size_t)hcd, sizeof(real));
        r->hcw2 = td_xcalloc((size_t)hcd, sizeof(real));
        r->rope_idx = r->rope;
        r->rope_idx.D = hp->idx_dim; // the same rotation over the first R dims of each d_i-dim head
    }
    if (m->rope_freqs) {
        r->rope_ff = td_xcalloc(hp->rope_dims / 2, sizeof(real));
        if ((rc = REAL_DECODE_ROW(m->rope_freqs, 0, r->rope_ff, err))) {
            ref_close(&r->base);
            return rc;
        }
    }
    *out = &r->base;
    return TD_OK;
}
