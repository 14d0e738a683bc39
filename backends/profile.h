/* tapdiff arithmetic profiles: the rounding choices an arm makes on purpose,
 * as data, so that the control arm (ref32) and the oracle (ref) can make the
 * same ones at the same points and a budget compares like with like.
 *
 * A profile is a '+'-separated list of rules (order does not matter; the
 * canonical spelling sorts them as listed below); "native" (or NULL / "")
 * is the empty list: every operation as written.
 *
 *   act-q8      before each matmul, every activation row is rounded the way
 *               llama.cpp's CPU matmul converts it for that weight type
 *               (../shared/spec/quants.md §8): F32 weights keep f32; F16 /
 *               BF16 weights see f16 / bf16; Q4_0, Q5_0, Q8_0, IQ4_NL, MXFP4,
 *               NVFP4, Q1_0, Q2_0 see Q8_0 blocks; Q4_1, Q5_1 see Q8_1 blocks
 *               (the same values); K-quants, IQ1/2/3, IQ4_XS, TQ1_0, TQ2_0
 *               see Q8_K blocks. Embedding lookups stay exact.
 *   act-q8_1[@K] GPU integer-dot path: activations of matmuls with quantized
 *               weights are rounded to Q8_1 blocks of 32 in steps of more
 *               than one token, and in one-token steps too when the inner
 *               size exceeds K (no @K: never; @0: always). F32/F16/BF16
 *               weights are untouched. Excludes act-q8.
 *   attn-f16    in a step of more than one token, the operands of both
 *               attention matmuls are rounded to f16 (a GPU's tiled matmul
 *               loads them into f16 tiles): Q and the K rows for the
 *               scores, the softmax probabilities and the V rows for the
 *               context; sums stay in the working precision. The cache
 *               itself keeps its precision.
 *   mm-f16@N    in a step of more than N tokens, the weight matmuls round
 *               both operands (activations and dequantized weights) to f16
 *               (the tiled path, N = the matrix-vector limit, 8 in
 *               ggml-vulkan); sums stay in the working precision. The
 *               QSA indexer's score (pooled keys x queries, activations on
 *               both sides) is one such matmul with index heads x tokens
 *               columns: above N both operands are rounded to f16 too.
 *   acc-f16     quantized weight matmuls under mm-f16 sum in f16, as
 *               ggml-vulkan's f16acc tile runs on lavapipe (fp16 devices
 *               without cooperative matrices or integer dot products): k in
 *               pairs, each pair from its higher index down, every product
 *               rounded to f16 and then every sum (lavapipe splits the f16
 *               fma). Attention sums stay in the working precision
 *               (llama.cpp asks for f32 scores; the context tile measures
 *               as f32 there).
 *   kv-f16      the K/V cache stores f16: keys and values are rounded when
 *               written.
 *   fa-f16      flash attention casts K and V to f16 (every step), as
 *               llama.cpp does on every backend.
 *   fa-acc-f16@S with fa-f16: flash attention as ggml-vulkan's scalar shader
 *               runs it on a device of subgroup size S without cooperative
 *               matrices (lavapipe; the f32-score variant llama.cpp asks for):
 *               Q*scale in f16, f32 scores, the probabilities in f16, the
 *               output summed in f16 per column thread with an online-softmax
 *               rescale per block of columns, the threads then combined in
 *               ggml-vulkan's order, split-k partials in f32 (td_fa_geom).
 *               Replaces attn-f16 for attention in every step.
 *   fa-cpu      with fa-f16: flash attention as ggml-cpu runs it (ops.cpp,
 *               flash_attn_ext_f16_one_chunk, AVX2 build), for the shapes
 *               fa-acc-f16 does not take (a Vulkan device leaves head sizes
 *               that are not a multiple of 8 to the CPU): Q in f16
 *               (unscaled), each score ggml_vec_dot_f16's f32 sum times the
 *               scale, the keys in cache order with a running max; the
 *               output accumulates in f16, rescaled by f16(O*e^(Mold-M))
 *               on a new max and updated by f16(O + v*e^(s-M)) (one fused
 *               f32 step), the probabilities and their sum staying f32;
 *               then O*(1/sum) in f32. Steps ggml-cpu runs in its f32 tiled
 *               kernel (64+ tokens, head size a multiple of 8) take fa-f16
 *               alone (td_profile_fa_cpu). Replaces attn-f16 for attention.
 *   rope-f32-mul the rotary angle as ggml-cpu forms it (ops.cpp,
 *               ggml_rope_cache_init): theta_scale = powf(base, -2/R) in
 *               f32, theta = pos then theta *= theta_scale once per pair,
 *               every product rounded to f32; the frequency factor, the
 *               frequency scale and YaRN's mix in f32 on that angle. Only
 *               the angle: its sine and cosine and the rotation stay in the
 *               working precision. IMROPE: the same per position component.
 *   rope-f32-pow the rotary angle as ggml-vulkan's rope shaders form it
 *               (rope_funcs.glsl): theta = float(pos) * pow(theta_scale, i)
 *               in f32 (theta_scale = powf(base, -2/R) from the host), the
 *               rest as rope-f32-mul. The device's pow, sin and cos are its
 *               own approximations; the host's correctly rounded powf
 *               stands in for them (the closest host form, not the device's
 *               bits). Excludes rope-f32-mul. No arm declares it: on
 *               lavapipe the device's functions add more than the form
 *               explains (README "The rotary angle"): with rope-trig.
 *   rope-trig@U  the device's pow, sin and cos are its own approximations:
 *               each pair's rotation may be off the exact rotation by the
 *               formed angle by up to U * 2^-24 * (1 + |theta|) radians (an
 *               angle error relative to theta, as pow's, plus an absolute
 *               one, as sin's and cos's). The f64 oracle keeps the formed
 *               angle with exact sine and cosine; ref32, the control, rotates
 *               by the angle plus that bound at full size, its sign drawn
 *               per position and pair (td_rope_trig_offset_u), so the budget
 *               (k times the control's error) holds what the declared
 *               device may honestly add, and no more. U is
 *               the device's: measured on lavapipe (4), or the Vulkan
 *               specification's sin/cos precision (2^-11 absolute: 8192).
 *
 * The rounding helpers below are exact formulas; the reference calls them in
 * its own precision (f32 for ref32, f64 for ref), everything else it keeps. */
#ifndef TD_PROFILE_H
#define TD_PROFILE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TD_PROFILE_NATIVE "native"
#define TD_PROFILE_ACT_Q8 "act-q8"
#define TD_PROFILE_NAME_MAX 128

/* The activation format a matmul converts to before its dot products. */
typedef enum td_act_fmt {
    TD_ACT_F32 = 0,  /* unchanged */
    TD_ACT_F16 = 1,  /* f32 -> f16 -> f32, round to nearest even */
    TD_ACT_BF16 = 2, /* f32 -> bf16 -> f32, round to nearest even */
    TD_ACT_Q8_0 = 3, /* blocks of 32, f16 scale */
    TD_ACT_Q8_1 = 4, /* blocks of 32, f16 scale (+ a sum the values do not use) */
    TD_ACT_Q8_K = 5, /* blocks of 256, f32 scale */
} td_act_fmt;

/* The format llama.cpp's CPU path uses for a weight of td_type
 * `weight_type`; -1 when the type is not a matmul weight type (I8..I64,
 * F64, Q8_1/Q8_K themselves, unknown ids). */
int td_act_format(int weight_type, td_act_fmt *out);

/* Values per block of the format (1 for F32/F16/BF16, 32, or 256). */
int64_t td_act_block(td_act_fmt fmt);

/* out (n) = x (n) as the dot product sees it after conversion to `fmt`:
 * the dequantized values d*q of the activation blocks. n is a multiple of
 * td_act_block(fmt). out may alias x. Exact formulas, as on the pinned
 * haswell (AVX2) CPU variant of the llama.cpp peer:
 *   Q8_0 / Q8_1, per block of 32: a = max|x|; d = a/127 (f32), stored as
 *     f16(d) (round to nearest even); q = rint(x * (a ? 127/a : 0)) (f32
 *     product, ties to even), in [-127, 127]; value f16(d) * q.
 *   Q8_K, per block of 256: m = the first x of largest |x|; all 0 when m = 0;
 *     s = -127/m (f32); q = min(127, rint(s * x)) (ties to even); d = 1/s
 *     (f32); value d * q.
 * The f64 version applies the same rules to f64 values: the scale is rounded
 * to its storage type (f16 or f32) and the codes are the same integers
 * except where x sits within f32 rounding of a tie; F16/BF16 round through
 * f32 first (what a device would have held). */
void td_act_round_f32(float *out, const float *x, int64_t n, td_act_fmt fmt);
void td_act_round_f64(double *out, const double *x, int64_t n, td_act_fmt fmt);

/* ---- Profiles ---------------------------------------------------------- */

enum {
    TD_RULE_ACT_Q8 = 1u << 0,
    TD_RULE_ACT_Q8_1 = 1u << 1,
    TD_RULE_ATTN_F16 = 1u << 2,
    TD_RULE_KV_F16 = 1u << 3,
    TD_RULE_FA_F16 = 1u << 4,
    TD_RULE_MM_F16 = 1u << 5,
    TD_RULE_ACC_F16 = 1u << 6,
    TD_RULE_FA_ACC_F16 = 1u << 7,
    TD_RULE_ROPE_F32_MUL = 1u << 8,
    TD_RULE_ROPE_F32_POW = 1u << 9,
    TD_RULE_ROPE_TRIG = 1u << 10,
    TD_RULE_FA_CPU = 1u << 11,
};

typedef struct td_profile {
    unsigned rules;     /* TD_RULE_* */
    int64_t q8_1_vec_k; /* act-q8_1@K: one-token steps round too when the inner size > K; -1 = never */
    int64_t mm_f16_min; /* mm-f16@N: steps of more than N tokens */
    int64_t fa_sg;      /* fa-acc-f16@S: the device's subgroup size */
    int64_t rope_trig_u; /* rope-trig@U: the device's rotation bound in units of 2^-24 (1 + |theta|) */
} td_profile;

/* Parses a profile string. 0 on success; -1 with a one-line reason in why
 * (unknown rule, repeated rule, act-q8 with act-q8_1, bad @K). */
int td_profile_parse(const char *s, td_profile *out, char *why, size_t n);

/* The canonical spelling ("native" for the empty list) into buf. */
void td_profile_format(const td_profile *p, char *buf, size_t n);

/* The format the activations of a matmul with weight type `weight_type`
 * take in a step of T tokens with inner size k. 0 on success (TD_ACT_F32
 * when no rule applies); -1 when a rule applies to matmuls and the weight
 * type is not a matmul weight type. */
int td_profile_matmul_fmt(const td_profile *p, int weight_type, int64_t T, int64_t k, td_act_fmt *out);

/* Are Q (and the K/V rows read) rounded to f16 for attention in a step of T
 * tokens (attn-f16 with T > 1; fa-f16 rounds K/V only, see below)? */
int td_profile_attn_qkv_f16(const td_profile *p, int64_t T);

/* Does a weight matmul in a step of T tokens round its operands (activations
 * and weights) to f16 (mm-f16@N, T > N)? */
int td_profile_mm_f16(const td_profile *p, int64_t T);

/* Are K and V rounded to f16 when stored (kv-f16, fa-f16: every step)? */
int td_profile_kv_store_f16(const td_profile *p);

/* Is the QSA indexer's raw-key cache rounded to f16 when stored? Under
 * kv-f16 only: that cache has the K cache's type. fa-f16 is flash
 * attention's cast of K and V where attention reads them; the indexer's keys
 * never reach flash attention, so with an f32 cache they stay f32 (llama.cpp
 * gathers the blocks straight from the cache). */
int td_profile_idx_store_f16(const td_profile *p);

/* How the rotary angle is formed (rope-f32-mul / rope-f32-pow). */
typedef enum td_rope_angle {
    TD_ROPE_ANGLE_EXACT = 0, /* pos * base^(-2i/R) in the working precision */
    TD_ROPE_ANGLE_F32_MUL = 1,
    TD_ROPE_ANGLE_F32_POW = 2,
} td_rope_angle;
td_rope_angle td_profile_rope_angle(const td_profile *p);

/* The f32 angle of pair i (0 <= i < R/2) at position pos, before the
 * frequency factor and scale, formed as `form` says (not EXACT). */
float td_rope_angle_f32(td_rope_angle form, int64_t pos, int64_t i, int64_t R, double base);

/* rope-trig@U: the angle offset the control (ref32) rotates pair i at
 * position pos by, on top of theta: +-U * 2^-24 * (1 + |theta|), the bound
 * at full size, its sign a deterministic draw from (pos, i) so that
 * neighbouring pairs and positions do not err alike. 0 when u <= 0 (no
 * rope-trig: the profile's rope_trig_u). */
double td_rope_trig_offset_u(int64_t u, int64_t pos, int64_t i, double theta);

/* How ggml-vulkan's scalar flash-attention shader (flash_attn.comp, this
 * peer revision) lays one step out on a device of subgroup size S that is
 * neither Intel nor AMD and reports no shader core count (lavapipe): its
 * tuning and split-k choices, redone here because the order of every f16
 * sum follows from them. Per query row (token, head): column (cache
 * position) s belongs to column thread s % cols, in block s / bc; each
 * thread runs its own online softmax block by block; the threads are then
 * summed by butterflies over `group` threads and the groups in order; with
 * split_k > 1 each range of split_kv columns does that on its own and a
 * second shader combines the ranges in f32. */
typedef struct td_fa_geom {
    int64_t kv;       /* columns the shader sees: llama.cpp's cache view (256-cell padding) */
    int64_t bc;       /* columns per block (one online-softmax rescale each) */
    int64_t cols;     /* column threads per query row */
    int64_t d_split;  /* threads sharing one score's dot product (a butterfly of f32 partials) */
    int64_t group;    /* column threads summed by one subgroup's butterfly */
    int64_t split_kv; /* columns per split */
    int64_t split_k;  /* splits (1: none) */
    int64_t sg;       /* subgroup size (the split reduce's tree) */
} td_fa_geom;

/* The geometry of a step of T tokens over n_kv cached positions (the step's
 * included) in a context of n_ctx, head size D, H query and Hkv KV heads.
 * 0 when fa-acc-f16 applies; -1 when the profile has no fa-acc-f16 or the
 * shape is outside what the rule models (D not a multiple of 8: ggml-vulkan
 * runs those on the CPU; H not a multiple of Hkv). */
int td_profile_fa_geom(const td_profile *p, int64_t D, int64_t H, int64_t Hkv, int64_t T, int64_t n_kv,
                       int64_t n_ctx, td_fa_geom *g);

/* How ggml-cpu runs the flash attention of a step of T tokens over n_kv
 * cached positions in a context of n_ctx, head size D (profile fa-cpu, this
 * peer revision, its AVX2 variant): TD_FA_CPU_NONE when the profile has no
 * fa-cpu or fa-acc-f16 takes the shape (td_profile_fa_geom); ONE_CHUNK, its
 * f16-accumulating kernel; TILED, its f32 kernel (T >= 64 and D a multiple
 * of the 8 f32 lanes: nothing to round beyond fa-f16); SPLIT_KV, one-token
 * steps over a cache view of 512 cells or more, whose partials per thread
 * are not modelled (the caller refuses the shape). */
typedef enum td_fa_cpu_path {
    TD_FA_CPU_NONE = 0,
    TD_FA_CPU_ONE_CHUNK = 1,
    TD_FA_CPU_TILED = 2,
    TD_FA_CPU_SPLIT_KV = 3,
} td_fa_cpu_path;
td_fa_cpu_path td_profile_fa_cpu(const td_profile *p, int64_t D, int64_t H, int64_t Hkv, int64_t T, int64_t n_kv,
                                 int64_t n_ctx);

/* ---- Rounding ties of the f64 oracle ------------------------------------
 * An arm computing in f32 rounds an activation code from a value that
 * differs from the oracle's by f32 rounding; where the scaled value x/d lies
 * that close to a half-integer, either code is honest, and the flip moves a
 * matmul output by d times one weight column (~1e-3 relative): far above a
 * budget of f32 rounding. A session lets the caller see those near-ties and
 * have the oracle take the other side of chosen ones (harness/ties.h
 * searches for the ones the arm took). Only the Q8 formats take part; a tie is named by the forward (step, from 0 = the prefill), the
 * call of td_act_round_f64 in that forward (one activation row each), and
 * the element within the row. */
typedef struct td_act_tie {
    int64_t step, call, elem;
    double v;    /* the scaled value: its distance to the half-integer says how near */
    double pick; /* in a log: the other side's result; in a pin list: the result to take */
    char site[48]; /* in a log: the weight the rounded row multiplies ("" when not named) */
    int f16;     /* 1: an f16 operand rounding (v: ulps above the lower f16 neighbour) */
    char tap[40]; /* the first tap the forward emitted after this rounding ("" = none yet) */
    char src[40]; /* the tap of this step whose values the rounding read ("" = not known: td_act_ties_source) */
    int64_t src_elem; /* the element of src (flat index) */
    double x;     /* the value rounded */
    double src_scale; /* 0: x is src's value; else x = src's value * src_scale (td_act_ties_source_scale) */
} td_act_tie;

/* f16 operand roundings (td_act_round_* with TD_ACT_F16: attn-f16's Q and
 * K/V rows, mm-f16's activations, kv-f16/fa-f16 cache stores) take part too:
 * a value within TD_ACT_TIES_F16_TAU f16 ulps of the midpoint of its two f16
 * neighbours is logged and can be pinned to the other one. The window is
 * wider than the codes' because these values come out of whole matmuls,
 * norms and RoPE: an honest f32 arm differs from the f64 oracle there by a
 * few f32 ulps, 2^-13 f16 ulps each. */
#define TD_ACT_TIES_F16_TAU (1.0 / 256)

/* Opens a session: logs every code (or Q8_0 f16 scale) within tau (code
 * units, f16 ulps) of a tie, and gives the n_flips pinned ones their pick
 * (borrowed until td_act_ties_end). td_act_round_f32 and _f64 both take
 * part, so the f32 control can take the same side as the oracle. */
void td_act_ties_begin(const td_act_tie *flips, int n_flips, double tau);
/* A forward starts (the reference calls it; no-op outside a session). */
void td_act_ties_forward(void);
/* Closes the session; *log (free() it) and *n receive the near-ties met in
 * order, or log NULL to drop them. */
void td_act_ties_end(td_act_tie **log, int *n);
/* A session logs at most TD_ACT_TIES_LOG_MAX near-ties (~60 MB), the first
 * it meets: a wide window (rope-trig@U at long positions on a real GPU takes
 * nearly every Q and K value of a row) would otherwise grow the log with the
 * model and the prompt. Pins still apply past it; the near-ties not logged
 * cannot be taken, and td_act_ties_end says on stderr how many there were.
 * td_act_ties_dropped: that count for the last session ended. The
 * environment variable TD_TIES_LOG_MAX=N (1 <= N) lowers the cap (tests). */
#define TD_ACT_TIES_LOG_MAX (1 << 18)
int64_t td_act_ties_dropped(void);
/* Names the weight the rows rounded next are multiplied with (copied; no-op
 * outside a session): a log entry's site. td_act_ties_site_of names a part
 * of a layer that is no weight (layer >= 0: blk.<layer>.<name>): attention's
 * f16 operands ("attn_f16"), its probabilities ("attn_probs", element
 * pair << 32 | position), flash attention's output accumulator ("attn_acc",
 * element pair << 32 | (2 cell + rescale) * head_dim + dim), the QSA
 * indexer's f16 operands ("qsa_scores"). */
void td_act_ties_site(const char *weight);
void td_act_ties_site_of(int layer, const char *name);

/* The forward emitted tap `name` (layer >= 0: blk.<layer>.<name>): the
 * near-ties logged since the previous tap are named after it (no-op outside
 * a session). */
void td_act_ties_tap(int layer, const char *name);

/* Roundings made on worker threads (the attention's f16 probabilities):
 * td_act_ties_reserve() names them one call of the forward (-1 outside a
 * session; the caller reserves it before it starts the workers), and
 * td_act_tie_f16_*(call, elem, x) rounds one value to f16 with the session's
 * log and pins, from any thread (call -1: plain rounding). */
int64_t td_act_ties_reserve(void);
float td_act_tie_f16_f32(int64_t call, int64_t elem, float x);
double td_act_tie_f16_f64(int64_t call, int64_t elem, double x);

/* Where the rounded values come from, so that a caller holding an arm's
 * taps can read which f16 neighbour the arm took (harness/ties.h): the next
 * rounding call (td_act_round_*) reads tap `name` of block `layer` (-1:
 * outside the blocks) of this step, its element e being the tap's element
 * e + offset (none where that is negative). td_act_ties_tap_data records the
 * buffer each tap was emitted from, and td_act_ties_source_of(data, offset)
 * names the last tap emitted from `data` (none when no tap was: an
 * unobserved buffer). No-ops outside a session. */
void td_act_ties_source(int layer, const char *name, int64_t offset);
void td_act_ties_tap_data(int layer, const char *name, const void *data);
void td_act_ties_source_of(const void *data, int64_t offset);
/* After td_act_ties_source*: the next rounding call reads the source's values
 * times `scale`, a product the arm forms in f32 before it rounds (flash
 * attention's f16(Q*scale)). */
void td_act_ties_source_scale(double scale);
/* After td_act_ties_source*: the next rounding call (f16) also logs values
 * within rel * (its largest magnitude) of a midpoint, however many f16 ulps
 * that is: values out of sums with cancellation (RoPE's rotation, a matmul's
 * dot products), whose honest error is a few f32 ulps of the row's
 * magnitude, not of their own (a small value's f16 ulp can be smaller). */
void td_act_ties_source_near(double rel);
/* rel for flash attention's Q, K and V: 8 f32 ulps of the largest value
 * (llama-q8_0 on lavapipe: the arm's Q/K/V 1e-7..3e-7 from the oracle's on
 * values up to ~4, measured) */
#define TD_ACT_TIES_ROW_NEAR (1.0 / (1 << 20))
/* rel for an f16 rounding that reads a tap out of RoPE (flash attention's
 * f16(Q*scale), its f16 K cache rows, attn-f16's Q and K) in a step whose
 * rotary angles are at most theta_max: TD_ACT_TIES_ROW_NEAR, plus, under
 * rope-trig@U, the rotation error the profile declares honest. The device
 * may turn a pair (a, b) by up to d = U * 2^-24 * (1 + theta_max) off the
 * formed angle; the rotated pair keeps its length |(a, b)|, and turning it
 * by d moves each of its two values by at most |(a, b)| * d. Both values are
 * in the call, so |(a, b)| <= sqrt(2) * (the call's largest magnitude), and
 * a scale applied after RoPE scales both sides alike: the window is
 * sqrt(2) * d of the call's largest magnitude on top of the f32 rounding the
 * row window holds (the two errors add). Without rope-trig the oracle forms
 * the arm's angle and the row window alone is left. */
double td_act_ties_rope_near(const td_profile *p, double theta_max);

/* x (n) rounded to f16 and back, never logged or pinned: roundings that are
 * exact functions of values the arm and the oracle already share (f16
 * weights, f16 sums of f16 products), or that run on worker threads. */
void td_f16_round_f32(float *out, const float *x, int64_t n);
void td_f16_round_f64(double *out, const double *x, int64_t n);

/* ---- QSA selections the oracle takes from an arm -------------------------
 * qwen4exp's indexer (arch-qwen4exp.md §4.5) keeps W positions; where a
 * block is cut by the budget, or blocks tie at the cut, which positions are
 * kept is unspecified (§7.1), and llama.cpp's top-k keeps other ones than
 * the reference. Either is honest, yet the attention then reads other keys:
 * a false alarm against a budget of rounding. harness/qsafollow.h hands the
 * reference the arm's selection of such a query (only when compare explains
 * the difference as a boundary tie), and the reference attends to it while
 * its qsa_sel tap keeps its own choice, so compare judges the tie again. One
 * session per process, as the rounding ties; keyed by (layer, position):
 * the reference runs one sequence. */
typedef struct td_qsa_pin {
    int32_t layer;
    int64_t pos;        /* the query's position */
    int64_t step;       /* the forward the arm showed it in (reports only) */
    int32_t n;          /* positions selected */
    const int32_t *sel; /* (n) ascending; borrowed */
} td_qsa_pin;

/* Opens a session with n pins (borrowed until td_qsa_pins_end); replaces an
 * open one. */
void td_qsa_pins_begin(const td_qsa_pin *pins, int n);
void td_qsa_pins_end(void);
/* The pin of the query at `pos` in sparse layer `layer`; NULL when there is
 * none or no session is open. */
const td_qsa_pin *td_qsa_pin_find(int layer, int64_t pos);

#ifdef __cplusplus
}
#endif
#endif
