/* tapdiff "cpu": the optimized CPU forward (see cpu.h for what it is and
 * promises). The math is the reference's (../shared/spec/primitives.md,
 * arch-{llama,qwen3,qwen3moe}.md) and so are the taps: same names, shapes
 * and order as reference/reference_impl.h, dtype f32. What differs is how:
 *   - matrix products are jobs of "segments" (one weight matrix, a block of
 *     its rows, the activations it multiplies); Q/K/V, gate/up and all the
 *     experts of a MoE layer each run as ONE job so a decode step pays few
 *     synchronisations; a task is a block of output rows;
 *   - a segment of at least gemm_min_t tokens dequantizes a tile of weight
 *     rows to f32 and calls sgemm; a smaller one (decode) runs the per-type
 *     dot kernel on the stored row for each token;
 *   - profile act-q8 (opt-in): every input row of a matmul is first rounded
 *     as llama.cpp converts it for the weight's type (Q8_0 / Q8_K blocks,
 *     f16, bf16; profile.h td_act_round_f32 is the definition); the
 *     dot path then runs the integer kernels on the codes, sgemm and the
 *     types without an integer kernel compute with x' = d*q in f32;
 *   - attention runs one task per (token, head).
 * Shapes in comments are row-major, outermost first: (T, E) = T rows of E. */
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifdef TD_HAVE_OPENBLAS
#include <cblas.h>
#include <dlfcn.h>
#endif

#include "cpu.h"
#include "cpu_kernels.h"
#include "cpu_faults.h"
#include "forward.h"
#include "pool.h"
#include "profile.h"   /* td_act_format: the act-q8 formats */
#include "td_config.h"

#define NAME "cpu"

/* A GEMM tile of weight rows decoded to f32 holds about this many bytes
 * (the tile's row count depends on n_in only, never on the thread count).
 * sgemm packs the activations again for every tile, so a tile is at least
 * TILE_MIN_ROWS rows (measured: 1 MiB / 64 rows took 4-7% less CPU time per
 * prefill of the 200M Q4_K model than 256 KiB / 16 rows). */
#define TILE_BYTES (1024 * 1024)
#define TILE_MIN_ROWS 64

/* Tokens per chunk of the chunked Gated DeltaNet prefill (arch-qwen3next.md
 * §4.2.1; llama.cpp's and HF's chunk size). */
#define GDN_CHUNK 64

/* ===================================================================== */
/* State                                                                  */
/* ===================================================================== */

/* Small per-layer vectors decoded to f32 once at open. */
typedef struct cpu_layer {
    float *attn_norm, *ffn_norm; // (E)
    float *q_norm, *k_norm;      // (D) or NULL
    float *bq, *bk, *bv;         // (H*D), (Hkv*D), (Hkv*D) or NULL (from bqkv when fused)
    float *bo;                   // (E) or NULL
    // qwen3next (NULL elsewhere)
    float *ssm_a, *ssm_dt;       // (Hv) -exp(A_log), dt_bias
    float *ssm_norm;             // (dk)
    float *conv;                 // (C, K) conv taps per channel, oldest first
    float *shexp_gate;           // (E) shared-expert gate vector
} cpu_layer;

/* One 8-bit activation format of an input (act-q8): the td_cpu_xq8 arrays
 * and x' = d*q for the paths that read floats. */
typedef struct cpu_q8 {
    int8_t *q;            // (rows, n)
    float *d, *d16, *d32; // (rows, n/32), (rows, n/16), (rows, n/32)
    float *xd, *xds;      // (rows, n) x' = d*q; (rows, n/32) its sums per 32
} cpu_q8;

/* The forms an input is prepared in under act-q8: one bit per activation
 * format the weights it feeds convert it to (profile.h td_act_format). */
enum { FMT_Q8_0 = 1, FMT_Q8_K = 2, FMT_F16 = 4, FMT_BF16 = 8, FMT_X32 = 16 };

/* One matmul input (rows, n) in every form the kernels read: f32 with its
 * sums per 32 values (native dots), and under act-q8 the roundings its
 * weights ask for (fmts). */
typedef struct cpu_in {
    int64_t n;
    unsigned fmts;        // FMT_* bits prepared (under native FMT_X32 or 0)
    float *x;             // (rows, n)
    float *xs;            // (rows, n/32)
    cpu_q8 q8[2];         // [TD_CPU_ACT_Q8_0], [TD_CPU_ACT_Q8_K]
    float *xh[2];         // (rows, n) x rounded to f16 [0] / bf16 [1]
    // native, FMT_X32 (cpu_kernels.h td_cpu_x32): x as exact integers per 32
    int8_t *x32q;         // (rows, 4n)
    double *x32sc, *x32corr; // (rows, n/32)
    uint8_t *x32ok;       // (rows) 0: the row holds a non-finite value (the f32 kernels take it)
} cpu_in;

/* Activations of one forward over T tokens; grown when a larger T comes. */
typedef struct cpu_acts {
    int64_t cap_T;
    float *x;                // (T, E) residual stream
    cpu_in xn;               // (T, E) normed input of the current sub-block
    float *q, *k, *v;        // (T, H*D), (T, Hkv*D), (T, Hkv*D)
    cpu_in ctx;              // (T, H*D) attention output before the projection
    float *proj;             // (T, E) attn_out, then ffn_out
    float *gate, *up;        // dense (T, F); MoE (T*K, F) rows grouped by expert
    cpu_in act;              // same shape: silu(gate) * up
    float *logits;           // (T, V)
    float *moe_logits, *moe_probs; // (T, X)
    int32_t *moe_topk;       // (T, K)
    float *moe_w;            // (T, K)
    cpu_in xs;               // (T*K, E) MoE inputs grouped by expert
    float *ys;               // (T*K, E) expert outputs, same order
    int32_t *route_t, *route_j; // (T*K) token and rank slot of each grouped row
    int64_t *estart, *ecount;   // (X) first grouped row and row count of each expert
    float *rope_c, *rope_s;  // (T, R/2) m*cos, m*sin of each token's angles
    int32_t *pos32;          // (T)
    // qwen3next (NULL elsewhere)
    float *qg, *agate;       // (T, 2*H*D) [q; gate] per head; (T, H*D) the gate
    float *m, *z, *ba;       // (T, C), (T, Hv*dk), (T, 2*Hv)
    float *beta, *gam;       // (T, Hv)
    float *cq, *ck, *cv;     // (T, Hk*dk) x2, (T, Hv*dk) after conv + silu
    float *qn, *kn;          // (T, Hk*dk) L2-normed
    float *core;             // (T, Hv*dk)
    cpu_in gated;            // (T, Hv*dk) RMSNorm(core)*silu(z): ssm_out's input
    float *sh_g, *sh_u;      // (T, F_sh)
    cpu_in sh_act;           // (T, F_sh) silu(g)*u: ffn_down_shexp's input
    float *sh_y, *sh_s;      // (T, E), (T)
    float *ck_buf;           // chunk scratch: see gdn_chunked
} cpu_acts;

/* One matrix product: y[t][o] (row stride ldy) = x[t] . W[row0 + o] (+ bias[o])
 * for t < T, o < n_out. */
typedef struct mm_seg {
    const td_tensor *W;
    int64_t row0, n_out, n_in;
    const float *x, *xsum; // (T, n_in) f32 input (x itself, or x' under act-q8); (T, n_in/32) or NULL
    td_cpu_xq8 xq;         // act-q8 input of token 0 when use_q8
    int use_q8;
    int64_t T;
    float *y;
    int64_t ldy;
    const float *bias;     // (n_out) or NULL
    int gemm;
    const uint8_t *packed; // act-q8 on packed weights: row0's group (rows in groups of TD_CPU_PACK_ROWS), or NULL
    size_t pack_group;     // bytes per packed group
    int native_packed;     // packed, native: gemv_x32 per token on in's FMT_X32 form
    td_cpu_x32 x32;        // token 0's (the segment's first row of in) FMT_X32 arrays
    const uint8_t *x32ok;
    int64_t chunk;         // output rows per task
    int64_t big, n_big;    // the first n_big tasks take `big` rows each (0: none)
    int64_t task0, n_tasks;
} mm_seg;

/* Recurrent-state snapshots a sequence keeps, one per position a forward
 * started at (slot pos % CPU_SNAPS): a rollback of a recurrent model can
 * only land where one is, since the state keeps no per-position history. */
#define CPU_SNAPS 8

/* What one sequence holds: the state operations (backend.h) copy and cut
 * this and nothing else. */
typedef struct cpu_seq {
    int64_t n_past; // positions consumed: the next forward's pos0
    int64_t n_kv;   // K/V rows written (n_past, unless a state fault left stale rows)
    int64_t kv_cap;
    float **k_cache, **v_cache; // n_layer x (kv_cap, Hkv*D), row = position; post-norm, post-RoPE keys
    td_hist hist;
    // GDN layers (NULL until the sequence's first forward or copy; never on models without them)
    float *rs;                    // (rs_n) every GDN layer's conv and recurrent state: see cpu_backend.rs_conv
    float *snap;                  // (CPU_SNAPS, rs_n) rs as it was when a forward started at snap_pos
    int64_t snap_pos[CPU_SNAPS];  // -1 = empty
} cpu_seq;

typedef struct cpu_backend {
    td_backend base; // vt; first member
    const td_model *m;
    td_hparams hp;
    td_cpu_kernels k;
    td_cpu_pool *pool;
    int n_threads;
    int state_ops;   // snapshots of the GDN state are kept: opened for n_seq > 1, or a state operation came
    int fault;       // td_fault (faults.h); TD_FAULT_NONE = 0 in every normal run
    int64_t n_fwd;   // forwards since open/reset: the step index stale_token counts
    int act_q8;      // profile "act-q8": matmul inputs rounded as llama.cpp's CPU path does
    int logits_last; // td_backend_params.logits_last: untapped forwards compute the last row only
    unsigned fmts_xn, fmts_ctx, fmts_act, fmts_xs; // FMT_* each input needs (its weights' types)
    unsigned fmts_gated, fmts_shact;               // qwen3next's ssm_out and ffn_down_shexp inputs
    int64_t gemm_min_t;
    int64_t n_ctx;
    cpu_seq seqs[TD_SEQ_MAX];
    cpu_seq *s;                 // the sequence forwards append to
    int64_t att_cap;            // score rows' length: the largest kv_cap of any sequence
    cpu_layer *layers;
    // where GDN layer l's state lies in a sequence's rs (-1 for other layers):
    // conv (C, K-1), the last K-1 inputs m per channel, oldest first; ssm
    // (Hv, dk, dk), S_h[i][j] at h*dk*dk + j*dk + i (llama.cpp's layout)
    int64_t *rs_conv, *rs_ssm;
    int64_t rs_n;               // floats of one sequence's recurrent state; 0 without GDN layers
    float *out_norm;            // (E)
    float *rope_ff;             // (R/2) or NULL
    int64_t max_in;
    int64_t tile_cap;           // floats per thread tile
    float **tile;               // per thread (tile_cap)
    float **rowbuf;             // per thread (max_in): a decoded row for types without a dot kernel
    float **att;                // per thread (att_cap) attention scores
    mm_seg *segs;               // job scratch
    int max_segs;
    // act-q8 weights in the packed layout (cpu_kernels.h), made on a
    // matrix's first product: (matrix, packed copy or NULL = not packable)
    struct cpu_pack {
        const td_tensor *W;
        uint8_t *p;
    } *packs;
    int n_packs, cap_packs;
    // the copies' memory (pack_alloc): every chunk, and the one handed out in order
    uint8_t **pack_chunks;
    int n_pack_chunks;
    uint8_t *pack_open;
    size_t pack_used; // of pack_open's PACK_CHUNK bytes
    cpu_acts a;
    char version[320];
    struct cpu_q4 *q4;          // qwen4exp's own state (cpu_hc.c), NULL for other architectures
} cpu_backend;

/* qwen4exp hooks (cpu_hc.c, included below) */
static void q4_body(cpu_backend *b, const int32_t *tokens, int64_t T, int64_t pos0, td_tap_sink *sink);
static void q4_seq_cp(cpu_backend *b, int src, int dst, int64_t rows);
static void q4_free(cpu_backend *b);

/* ===================================================================== */
/* Matrix products                                                        */
/* ===================================================================== */

typedef struct mm_job {
    cpu_backend *b;
    const mm_seg *segs;
    int n_segs;
} mm_job;

static int64_t tile_rows(int64_t n_in) {
    int64_t r = TILE_BYTES / (4 * n_in);
    r -= r % 16;
    return r < TILE_MIN_ROWS ? TILE_MIN_ROWS : r > 256 ? 256 : r;
}

static void mm_dot_rows(cpu_backend *b, const mm_seg *s, int64_t r0, int64_t nr, int th) {
    const td_cpu_type_ops *op = &b->k.type[s->W->type];
    const int64_t n = s->n_in, ns = n / TD_CPU_XSUM_GROUP;
    if (!s->use_q8 && op->dot && s->T == 1) {
        // one token (decode): several rows per pass where the level has a kernel
        // for it; several tokens keep the loop below, which reuses each row from L1
        td_cpu_gemv(op, td_tensor_row(s->W, (uint64_t)(s->row0 + r0)), s->W->row_bytes, nr, s->x, s->xsum, n,
                    s->y + r0);
        for (int64_t i = 0; i < nr; i++) s->y[r0 + i] += s->bias ? s->bias[r0 + i] : 0.0f;
        return;
    }
    for (int64_t o = r0; o < r0 + nr; o++) {
        const uint8_t *w = td_tensor_row(s->W, (uint64_t)(s->row0 + o));
        const float bias = s->bias ? s->bias[o] : 0.0f;
        if (s->use_q8) {
            for (int64_t t = 0; t < s->T; t++) {
                const td_cpu_xq8 xq = {s->xq.q + t * n, s->xq.d + t * ns, s->xq.dsum16 + 2 * t * ns,
                                       s->xq.dsum32 + t * ns};
                s->y[t * s->ldy + o] = op->dot_q8(w, &xq, n) + bias;
            }
        } else if (op->dot) {
            for (int64_t t = 0; t < s->T; t++)
                s->y[t * s->ldy + o] = op->dot(w, s->x + t * n, s->xsum ? s->xsum + t * ns : NULL, n) + bias;
        } else { // no kernel for this type: decode the row once, then f32 dots
            float *row = b->rowbuf[th];
            op->to_f32(s->W->type, w, row, n);
            for (int64_t t = 0; t < s->T; t++) s->y[t * s->ldy + o] = b->k.dot_f32(row, s->x + t * n, n) + bias;
        }
    }
}

#ifdef TD_HAVE_OPENBLAS
static void mm_gemm_rows(cpu_backend *b, const mm_seg *s, int64_t r0, int64_t nr, int th) {
    const td_cpu_type_ops *op = &b->k.type[s->W->type];
    const int64_t n = s->n_in;
    float *tile = b->tile[th]; // (nr, n)
    for (int64_t i = 0; i < nr; i++)
        op->to_f32(s->W->type, td_tensor_row(s->W, (uint64_t)(s->row0 + r0 + i)), tile + i * n, n);
    // y[:, r0 .. r0+nr) (T, nr) = x (T, n) . tile^T
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)s->T, (int)nr, (int)n, 1.0f, s->x, (int)n, tile, (int)n,
                0.0f, s->y + r0, (int)s->ldy);
    if (s->bias)
        for (int64_t t = 0; t < s->T; t++)
            for (int64_t i = 0; i < nr; i++) s->y[t * s->ldy + r0 + i] += s->bias[r0 + i];
}
#endif

/* rows r0 .. r0+nr of a packed segment (r0 and nr multiples of the group) */
static void mm_packed_rows(cpu_backend *b, const mm_seg *s, int64_t r0, int64_t nr) {
    const td_cpu_type_ops *op = &b->k.type[s->W->type];
    op->gemm_q8(s->packed + (size_t)(r0 / TD_CPU_PACK_ROWS) * s->pack_group, nr / TD_CPU_PACK_ROWS, &s->xq, s->n_in,
                s->T, s->y + r0, s->ldy, s->bias ? s->bias + r0 : NULL);
}

/* native rows r0 .. r0+nr of a packed segment, token by token: a token
 * with a non-finite value takes the f32 kernels on the stored rows, as a
 * one-token segment (its NaN and infinities as every other path has them) */
static void mm_native_packed_rows(cpu_backend *b, const mm_seg *s, int64_t r0, int64_t nr, int th) {
    const td_cpu_type_ops *op = &b->k.type[s->W->type];
    const int64_t n = s->n_in, ns = n / TD_CPU_XSUM_GROUP;
    for (int64_t t = 0; t < s->T; t++) {
        if (s->x32ok[t]) {
            const td_cpu_x32 xt = {s->x32.q + t * 4 * n, s->x32.sc + t * ns, s->x32.corr + t * ns};
            op->gemv_x32(s->packed + (size_t)(r0 / TD_CPU_PACK_ROWS) * s->pack_group, nr / TD_CPU_PACK_ROWS, &xt, n,
                         s->y + t * s->ldy + r0, s->bias ? s->bias + r0 : NULL);
            continue;
        }
        mm_seg one = *s;
        one.T = 1;
        one.x = s->x + t * n;
        one.xsum = s->xsum ? s->xsum + t * ns : NULL;
        one.y = s->y + t * s->ldy;
        mm_dot_rows(b, &one, r0, nr, th);
    }
}

static void mm_task(void *ctx, int64_t task, int th) {
    const mm_job *j = ctx;
    // segments are in task order; find the last one starting at or before `task`
    int lo = 0, hi = j->n_segs - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (j->segs[mid].task0 <= task) lo = mid;
        else hi = mid - 1;
    }
    const mm_seg *s = &j->segs[lo];
    const int64_t t = task - s->task0;
    const int64_t r0 = t < s->n_big ? t * s->big : s->n_big * s->big + (t - s->n_big) * s->chunk;
    const int64_t lim = t < s->n_big ? s->big : s->chunk;
    const int64_t nr = s->n_out - r0 < lim ? s->n_out - r0 : lim;
    if (s->native_packed) {
        mm_native_packed_rows(j->b, s, r0, nr, th);
        return;
    }
    if (s->packed) {
        mm_packed_rows(j->b, s, r0, nr);
        return;
    }
#ifdef TD_HAVE_OPENBLAS
    if (s->gemm) {
        mm_gemm_rows(j->b, s, r0, nr, th);
        return;
    }
#endif
    mm_dot_rows(j->b, s, r0, nr, th);
}

/* The FMT_* bit a weight of `type` converts its input to under act-q8
 * (0: f32 as is); under native FMT_X32 where the level has gemv_x32 for
 * the type, else 0. */
static unsigned act_fmt(const cpu_backend *b, int type) {
    td_act_fmt f;
    if (!b->act_q8) return b->k.prep_x32 && b->k.type[type].gemv_x32 ? FMT_X32 : 0;
    if (td_act_format(type, &f)) return 0;
    switch (f) {
    case TD_ACT_Q8_0: case TD_ACT_Q8_1: return FMT_Q8_0;
    case TD_ACT_Q8_K: return FMT_Q8_K;
    case TD_ACT_F16: return FMT_F16;
    case TD_ACT_BF16: return FMT_BF16;
    default: return 0;
    }
}

/* Memory for packed copies, cut in order from chunks of PACK_CHUNK or more
 * in 2 MiB pages where the kernel gives them on request (transparent huge
 * pages, "madvise" mode): decode reads every copy once per token, and 4 KiB
 * pages cost a TLB miss and, when first written, a fault each (measured: a
 * third of the CPU time of bench-q8_0's 64-token run). One region for all,
 * because a model's matrices are a few MiB each: a 2 MiB page per matrix
 * would round each up. Without huge pages the madvise fails and the chunks
 * keep 4 KiB pages. NULL: no memory. */
#define PACK_HUGE ((size_t)2 << 20)
#define PACK_CHUNK ((size_t)64 << 20)
static uint8_t *pack_chunk(cpu_backend *b, size_t cap) {
    void *p = NULL;
    if (posix_memalign(&p, PACK_HUGE, cap)) return NULL;
#ifdef MADV_HUGEPAGE
    madvise(p, cap, MADV_HUGEPAGE);
#endif
    b->pack_chunks = td_xrealloc(b->pack_chunks, (size_t)(b->n_pack_chunks + 1) * sizeof *b->pack_chunks);
    b->pack_chunks[b->n_pack_chunks++] = p;
    return p;
}

static uint8_t *pack_alloc(cpu_backend *b, size_t bytes) {
    bytes = bytes ? (bytes + 63) / 64 * 64 : 64;
    // a chunk of its own; the open one stays open
    if (bytes > PACK_CHUNK) return pack_chunk(b, (bytes + PACK_HUGE - 1) / PACK_HUGE * PACK_HUGE);
    if (!b->pack_open || PACK_CHUNK - b->pack_used < bytes) {
        if (!(b->pack_open = pack_chunk(b, PACK_CHUNK))) return NULL;
        b->pack_used = 0;
    }
    uint8_t *p = b->pack_open + b->pack_used;
    b->pack_used += bytes;
    return p;
}

/* Packing on every thread: a copy's first write is also where its pages are
 * faulted in and zeroed, most of the packing's time (a bench-q8_0 run's first
 * forward). PACK_TASK groups of 16 rows per task. */
#define PACK_TASK 16
typedef struct {
    const td_cpu_type_ops *op;
    const td_tensor *W;
    uint8_t *p;
    size_t gb;
    int64_t ng;
} pack_job;

static void pack_task(void *ctx, int64_t task, int th) {
    (void)th;
    const pack_job *j = ctx;
    for (int64_t g = task * PACK_TASK; g < j->ng && g < (task + 1) * PACK_TASK; g++)
        j->op->pack(j->p + (size_t)g * j->gb, td_tensor_row(j->W, (uint64_t)g * TD_CPU_PACK_ROWS), j->W->row_bytes,
                    j->W->ne[0]);
}

/* W in the packed layout, packed now if this is its first product, or NULL
 * when this level has no packed kernel for its type (or a fault patch took
 * the per-row kernel away: the packed one goes with it) or its rows do not
 * fill whole groups. Only the thread building jobs calls this. */
static const uint8_t *packed_weights(cpu_backend *b, const td_tensor *W) {
    for (int i = 0; i < b->n_packs; i++)
        if (b->packs[i].W == W) return b->packs[i].p;
    const td_cpu_type_ops *op = &b->k.type[W->type];
    uint8_t *p = NULL;
    if (((op->gemm_q8 && op->dot_q8) || op->gemv_x32) && W->n_rows % TD_CPU_PACK_ROWS == 0) {
        const size_t gb = op->pack_bytes(W->ne[0]), ng = W->n_rows / TD_CPU_PACK_ROWS;
        // no memory for the copy: the per-row kernels still run on the stored rows
        p = pack_alloc(b, gb * ng);
        pack_job j = {op, W, p, gb, (int64_t)ng};
        if (p) td_cpu_pool_run(b->pool, (j.ng + PACK_TASK - 1) / PACK_TASK, pack_task, &j);
    }
    if (b->n_packs == b->cap_packs) {
        b->cap_packs = b->cap_packs ? 2 * b->cap_packs : 64;
        b->packs = td_xrealloc(b->packs, (size_t)b->cap_packs * sizeof *b->packs);
    }
    b->packs[b->n_packs++] = (struct cpu_pack){W, p};
    return p;
}

/* The rows of a segment among the pool's threads, in multiples of `align`
 * (results never depend on the split). Each thread's first task is one
 * contiguous run of 3/4 of its share, the last quarter goes in small tasks
 * (2 per thread) that balance the load when a thread is late. Measured on
 * bench-q8_0's native decode at 2 threads: 76% of the bandwidth bound with
 * 8 equal tasks per thread taken in turn, 86% so (likely the prefetchers:
 * each task starts a stream cold, and taking turns made every start a jump). */
static void split_rows(mm_seg *s, int64_t n_out, int64_t nt, int64_t align) {
    s->big = n_out * 3 / (4 * nt) / align * align;
    s->n_big = nt > 1 && s->big > 0 ? nt : 0;
    s->chunk = (n_out - s->n_big * s->big) / (2 * nt) / align * align;
    if (s->chunk < align) s->chunk = align;
}

/* Appends a segment to the job being built in b->segs, reading rows
 * r0 .. r0+T-1 of the input `in`. */
static void seg_add(cpu_backend *b, int *n_segs, const td_tensor *W, int64_t row0, int64_t n_out, const cpu_in *in,
                    int64_t r0, int64_t T, float *y, int64_t ldy, const float *bias, int allow_gemm) {
    TD_ASSERT(*n_segs < b->max_segs && W->ne[0] <= b->max_in && (uint64_t)(row0 + n_out) <= W->n_rows);
    TD_ASSERT(in->n == W->ne[0]);
    mm_seg *s = &b->segs[*n_segs];
    const mm_seg *prev = *n_segs ? &b->segs[*n_segs - 1] : NULL;
    const int64_t n = in->n, ns = n / TD_CPU_XSUM_GROUP;
    const td_cpu_type_ops *op = &b->k.type[W->type];
    *s = (mm_seg){.W = W, .row0 = row0, .n_out = n_out, .n_in = n, .T = T, .y = y, .ldy = ldy, .bias = bias};
#ifdef TD_HAVE_OPENBLAS
    // the choice depends on T only: the same rows give the same bits whatever the thread count
    s->gemm = allow_gemm && T >= b->gemm_min_t;
#else
    (void)allow_gemm;
#endif
    s->x = in->x + r0 * n;
    s->xsum = in->xs + r0 * ns;
    const unsigned fmt = act_fmt(b, W->type);
    if (fmt == FMT_X32) {
        // native on packed weights for every T the dot path takes (so a
        // prefill below gemm_min_t keeps a token-by-token run's bits);
        // an input prepared without the form keeps the f32 kernels
        const uint8_t *pk = !s->gemm && (in->fmts & FMT_X32) && row0 % TD_CPU_PACK_ROWS == 0 &&
                                    n_out % TD_CPU_PACK_ROWS == 0
                                ? packed_weights(b, W)
                                : NULL;
        if (pk) {
            s->pack_group = op->pack_bytes(n);
            s->packed = pk + (size_t)(row0 / TD_CPU_PACK_ROWS) * s->pack_group;
            s->native_packed = 1;
            s->x32 = (td_cpu_x32){in->x32q + r0 * 4 * n, in->x32sc + r0 * ns, in->x32corr + r0 * ns};
            s->x32ok = in->x32ok + r0;
        }
    } else if (fmt & (FMT_Q8_0 | FMT_Q8_K)) {
        // the profile's activations x' = d*q: as codes for an integer kernel, else as floats
        const cpu_q8 *c = &in->q8[fmt == FMT_Q8_K];
        TD_ASSERT(in->fmts & fmt);
        s->use_q8 = !s->gemm && op->dot_q8;
        s->xq = (td_cpu_xq8){c->q + r0 * n, c->d + r0 * ns, c->d16 + 2 * r0 * ns, c->d32 + r0 * ns};
        // the packed kernels give the per-row kernels' bits, for any T: they
        // replace both the dot path and sgemm on x'
        const uint8_t *pk = row0 % TD_CPU_PACK_ROWS == 0 && n_out % TD_CPU_PACK_ROWS == 0 ? packed_weights(b, W) : NULL;
        if (pk) {
            s->pack_group = op->pack_bytes(n);
            s->packed = pk + (size_t)(row0 / TD_CPU_PACK_ROWS) * s->pack_group;
            s->gemm = 0;
            s->use_q8 = 1;
        }
        s->x = c->xd + r0 * n;
        s->xsum = c->xds + r0 * ns;
    } else if (fmt) { // F16 / BF16 weights: x rounded to their format
        TD_ASSERT(in->fmts & fmt);
        s->x = in->xh[fmt == FMT_BF16] + r0 * n;
    }
    if (!op->needs_xsum) s->xsum = NULL;
    if (s->gemm) s->chunk = tile_rows(s->n_in);
    else split_rows(s, n_out, b->n_threads, s->packed ? TD_CPU_PACK_ROWS : 8); // packed: whole groups
    s->task0 = prev ? prev->task0 + prev->n_tasks : 0;
    s->n_tasks = s->n_big + (n_out - s->n_big * s->big + s->chunk - 1) / s->chunk;
    (*n_segs)++;
}

static void mm_run(cpu_backend *b, int n_segs) {
    if (!n_segs) return;
    mm_job j = {b, b->segs, n_segs};
    const mm_seg *last = &b->segs[n_segs - 1];
    td_cpu_pool_run(b->pool, last->task0 + last->n_tasks, mm_task, &j);
}

/* y (T, n_out) = in (T, n_in) . W[row0..)^T (+ bias): a job of one segment */
static void matmul(cpu_backend *b, float *y, const cpu_in *in, const td_tensor *W, int64_t row0, int64_t n_out,
                   int64_t T, const float *bias) {
    int n = 0;
    seg_add(b, &n, W, row0, n_out, in, 0, T, y, n_out, bias, 1);
    mm_run(b, n);
}

/* ===================================================================== */
/* Element-wise parts                                                     */
/* ===================================================================== */

/* Rows [r0, r0+rows) of in->x were written: derive the other forms. Rows
 * whose n is not a multiple of 32 only feed float types (every block of a
 * quantized type is >= 32 values), so they need none. */
static void in_prepare_rows(const cpu_backend *b, cpu_in *in, int64_t r0, int64_t rows) {
    const int64_t n = in->n, ns = n / TD_CPU_XSUM_GROUP;
    for (int64_t r = r0; r < r0 + rows; r++) {
        const float *x = in->x + r * n;
        if (n % TD_CPU_XSUM_GROUP == 0) td_cpu_xsum(in->xs + r * ns, x, n);
        for (int f = 0; f < 2; f++) // the 8-bit formats (their weights' blocks make n fit)
            if (in->fmts & (f ? FMT_Q8_K : FMT_Q8_0)) {
                const cpu_q8 *c = &in->q8[f];
                b->k.quantize_act((td_cpu_act_fmt)f, x, n, c->q + r * n, c->d + r * ns, c->d16 + 2 * r * ns,
                                  c->d32 + r * ns, c->xd + r * n);
                td_cpu_xsum(c->xds + r * ns, c->xd + r * n, n);
            }
        if (in->fmts & FMT_F16)
            for (int64_t i = 0; i < n; i++) in->xh[0][r * n + i] = td_f16_round_trip_f32(x[i]);
        if (in->fmts & FMT_BF16)
            for (int64_t i = 0; i < n; i++) in->xh[1][r * n + i] = td_bf16_to_f32(td_f32_to_bf16(x[i]));
        if (in->fmts & FMT_X32)
            in->x32ok[r] = (uint8_t)b->k.prep_x32(x, n, in->x32q + r * 4 * n, in->x32sc + r * ns, in->x32corr + r * ns);
    }
}

static void in_alloc(cpu_in *in, size_t rows, size_t n, unsigned fmts) {
    const size_t ns = n / TD_CPU_XSUM_GROUP + 1, fs = sizeof(float);
    in->n = (int64_t)n;
    in->fmts = fmts;
    in->x = td_xcalloc(rows * n, fs);
    in->xs = td_xcalloc(rows * ns, fs);
    for (int f = 0; f < 2; f++)
        if (fmts & (f ? FMT_Q8_K : FMT_Q8_0)) {
            cpu_q8 *c = &in->q8[f];
            c->q = td_xcalloc(rows * n, 1);
            c->d = td_xcalloc(rows * ns, fs);
            c->d16 = td_xcalloc(2 * rows * ns, fs);
            c->d32 = td_xcalloc(rows * ns, fs);
            c->xd = td_xcalloc(rows * n, fs);
            c->xds = td_xcalloc(rows * ns, fs);
        }
    for (int f = 0; f < 2; f++)
        if (fmts & (f ? FMT_BF16 : FMT_F16)) in->xh[f] = td_xcalloc(rows * n, fs);
    if (fmts & FMT_X32) {
        in->x32q = td_xcalloc(rows * 4 * n, 1);
        in->x32sc = td_xcalloc(rows * ns, sizeof(double));
        in->x32corr = td_xcalloc(rows * ns, sizeof(double));
        in->x32ok = td_xcalloc(rows, 1);
    }
}

static void in_free(cpu_in *in) {
    free(in->x), free(in->xs), free(in->xh[0]), free(in->xh[1]);
    free(in->x32q), free(in->x32sc), free(in->x32corr), free(in->x32ok);
    for (int f = 0; f < 2; f++) {
        cpu_q8 *c = &in->q8[f];
        free(c->q), free(c->d), free(c->d16), free(c->d32), free(c->xd), free(c->xds);
    }
    memset(in, 0, sizeof *in);
}

/* out (rows, n) = RMSNorm of each row of x with w (n) (primitives §1). The
 * sum of squares is accumulated in double: cheap, and it keeps this step's
 * error far below the matmuls'. out may alias x. */
static void rmsnorm_rows(float *out, const float *x, const float *w, float eps, int64_t rows, int64_t n) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        float *o = out + r * n;
        double ss = 0;
        for (int64_t i = 0; i < n; i++) ss += (double)xr[i] * xr[i];
        const float inv = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
        for (int64_t i = 0; i < n; i++) o[i] = w[i] * (xr[i] * inv);
    }
}

static void softmax_f32(float *out, const float *x, int64_t n) {
    float max = x[0];
    for (int64_t i = 1; i < n; i++)
        if (x[i] > max) max = x[i];
    float sum = 0;
    for (int64_t i = 0; i < n; i++) {
        out[i] = expf(x[i] - max);
        sum += out[i];
    }
    const float inv = 1.0f / sum;
    for (int64_t i = 0; i < n; i++) out[i] *= inv;
}

static float silu(float g) {
    return g / (1.0f + expf(-g));
}

/* Row-wise steps (norms, activation preparation, SwiGLU) of a prefill run
 * in parallel over blocks of rows; every row is computed by the same code
 * whoever runs it. Small jobs (decode) stay on the calling thread. */
typedef enum row_op { ROW_RMSNORM, ROW_PREPARE, ROW_SWIGLU, ROW_SILU } row_op;

typedef struct row_job {
    cpu_backend *b;
    row_op op;
    int64_t rows, n, chunk;
    float *out;              // RMSNORM (rows, n); SWIGLU/SILU (rows, n)
    const float *x, *w;      // RMSNORM input (rows, n), weight (n)
    float eps;
    const float *gate, *up;  // SWIGLU/SILU (rows, n)
    cpu_in *in;              // PREPARE: rows r0 .. r0+rows-1 of in
    int64_t r0;
} row_job;

static void row_task(void *ctx, int64_t task, int th) {
    (void)th;
    const row_job *j = ctx;
    const int64_t a = task * j->chunk, e = a + j->chunk < j->rows ? a + j->chunk : j->rows, n = j->n;
    switch (j->op) {
    case ROW_RMSNORM:
        if (j->b->fault == TD_FAULT_RMSNORM_EPS)
            td_cpu_fault_rmsnorm_rows(j->out + a * n, j->x + a * n, j->w, j->eps, e - a, n);
        else
            rmsnorm_rows(j->out + a * n, j->x + a * n, j->w, j->eps, e - a, n);
        break;
    case ROW_PREPARE: in_prepare_rows(j->b, j->in, j->r0 + a, e - a); break;
    case ROW_SWIGLU:
        for (int64_t i = a * n; i < e * n; i++) j->out[i] = silu(j->gate[i]) * j->up[i];
        break;
    case ROW_SILU: // llama MoE without gate tensors
        for (int64_t i = a * n; i < e * n; i++) j->out[i] = silu(j->up[i]);
        break;
    }
}

static void run_rows(cpu_backend *b, row_job *j) {
    if (j->rows <= 0) return;
    const int64_t want = 4 * (int64_t)b->n_threads;
    j->b = b;
    j->chunk = j->rows < 2 || j->rows * j->n < 32768 ? j->rows : (j->rows + want - 1) / want;
    td_cpu_pool_run(b->pool, (j->rows + j->chunk - 1) / j->chunk, row_task, j);
}

static void par_rmsnorm(cpu_backend *b, float *out, const float *x, const float *w, int64_t rows, int64_t n) {
    row_job j = {.op = ROW_RMSNORM, .rows = rows, .n = n, .out = out, .x = x, .w = w, .eps = b->hp.rms_eps};
    run_rows(b, &j);
}

static void par_act(cpu_backend *b, float *out, const float *gate, const float *up, int64_t rows, int64_t n) {
    row_job j = {.op = gate ? ROW_SWIGLU : ROW_SILU, .rows = rows, .n = n, .out = out, .gate = gate, .up = up};
    run_rows(b, &j);
}

/* Rows [r0, r0+rows) of in->x were written: derive the other forms. */
static void in_prepare(cpu_backend *b, cpu_in *in, int64_t r0, int64_t rows) {
    row_job j = {.op = ROW_PREPARE, .rows = rows, .n = in->n, .in = in, .r0 = r0};
    run_rows(b, &j);
}

/* rope_c/rope_s (T, R/2) = m*cos(theta), m*sin(theta) of each token's
 * angles, in double then rounded once (primitives §2, §2.3) */
/* R: the rotated dims (all D under rope_partial_all_dims) */
static int64_t rope_span(const cpu_backend *b) {
    return b->fault == TD_FAULT_ROPE_PARTIAL_ALL ? (int64_t)b->hp.head_dim : (int64_t)b->hp.rope_dims;
}

static void rope_tables(cpu_backend *b, int64_t T, int64_t pos0) {
    td_fwd_rope_tables(&b->hp, rope_span(b), b->rope_ff, T, pos0, b->a.rope_c, b->a.rope_s);
}

/* rotates x (T, n_heads*D) in place with the tables */
static void rope_apply(cpu_backend *b, float *x, int64_t T, int64_t n_heads) {
    const td_hparams *hp = &b->hp;
    const int64_t D = hp->head_dim, half = rope_span(b) / 2;
    const int norm = (hp->rope_type == TD_ROPE_NORM) ^ (b->fault == TD_FAULT_ROPE_PAIRING);
    for (int64_t t = 0; t < T; t++) {
        const float *c = b->a.rope_c + t * half, *s = b->a.rope_s + t * half;
        for (int64_t h = 0; h < n_heads; h++) {
            float *xh = x + (t * n_heads + h) * D;
            for (int64_t i = 0; i < half; i++) {
                // NORM pairs adjacent values; NEOX the two halves of the rotated span
                const int64_t ia = norm ? 2 * i : i, ib = norm ? 2 * i + 1 : i + half;
                const float u = xh[ia], v = xh[ib];
                xh[ia] = u * c[i] - v * s[i];
                xh[ib] = u * s[i] + v * c[i];
            }
        }
    }
}

/* ===================================================================== */
/* Attention: one task per (token, head)                                  */
/* ===================================================================== */

typedef struct attn_job {
    cpu_backend *b;
    int l;
    int64_t T, pos0;
} attn_job;

static void attn_task(void *ctx, int64_t task, int th) {
    const attn_job *j = ctx;
    cpu_backend *b = j->b;
    const int64_t H = b->hp.n_head, Hkv = b->hp.n_head_kv, D = b->hp.head_dim;
    const int64_t t = task / H, h = task % H;
    // consecutive query heads share a KV head
    const int64_t g = b->fault == TD_FAULT_GQA_MAP_MOD ? h % Hkv : h / (H / Hkv);
    const int64_t n = j->pos0 + t + 1; // causal: positions 0..pos, the token itself included
    const float *q = b->a.q + (t * H + h) * D;
    const float *kc = b->s->k_cache[j->l] + g * D, *vc = b->s->v_cache[j->l] + g * D;
    const float scale = (float)(b->fault == TD_FAULT_ATTN_SCALE ? 1.0 / (double)D : 1.0 / sqrt((double)D));
    // thread_race: every thread's scores in one row; the yield only widens
    // the window in which another thread overwrites them
    const int race = b->fault == TD_FAULT_THREAD_RACE;
    float *att = b->att[race ? 0 : th];
    for (int64_t s = 0; s < n; s++) att[s] = scale * b->k.dot_f32(q, kc + s * Hkv * D, D);
    if (race) sched_yield();
    softmax_f32(att, att, n);
    float *o = b->a.ctx.x + (t * H + h) * D;
    memset(o, 0, (size_t)D * sizeof *o);
    for (int64_t s = 0; s < n; s++) b->k.axpy_f32(o, att[s], vc + s * Hkv * D, D);
}

/* ===================================================================== */
/* The forward                                                            */
/* ===================================================================== */

static void tap2(td_tap_sink *s, int layer, const char *name, const float *data, int64_t d0, int64_t d1) {
    const int64_t shape[2] = {d0, d1};
    TD_TAP(s, layer, name, TD_DT_F32, data, 2, shape);
}

/* a->x (T, E) -> a->proj (T, E) = attn_out of layer l */
static void attention_block(cpu_backend *b, int l, int64_t T, int64_t pos0, td_tap_sink *sink) {
    const td_hparams *hp = &b->hp;
    const td_layer *L = &b->m->layers[l];
    const cpu_layer *CL = &b->layers[l];
    cpu_acts *a = &b->a;
    const int64_t E = hp->n_embd, H = hp->n_head, Hkv = hp->n_head_kv, D = hp->head_dim;
    const int64_t HD = H * D, KD = Hkv * D;

    par_rmsnorm(b, a->xn.x, a->x, CL->attn_norm, T, E);
    tap2(sink, l, "attn_norm", a->xn.x, T, E);
    in_prepare(b, &a->xn, 0, T);

    int n = 0;
    if (L->attn.wqkv) { // fused: output rows are [Q; K; V]
        seg_add(b, &n, L->attn.wqkv, 0, HD, &a->xn, 0, T, a->q, HD, CL->bq, 1);
        seg_add(b, &n, L->attn.wqkv, HD, KD, &a->xn, 0, T, a->k, KD, CL->bk, 1);
        seg_add(b, &n, L->attn.wqkv, HD + KD, KD, &a->xn, 0, T, a->v, KD, CL->bv, 1);
    } else if (L->attn.q_gated) { // qwen3next: per head [q; gate]
        seg_add(b, &n, L->attn.wq, 0, 2 * HD, &a->xn, 0, T, a->qg, 2 * HD, NULL, 1);
        seg_add(b, &n, L->attn.wk, 0, KD, &a->xn, 0, T, a->k, KD, NULL, 1);
        seg_add(b, &n, L->attn.wv, 0, KD, &a->xn, 0, T, a->v, KD, NULL, 1);
    } else {
        seg_add(b, &n, L->attn.wq, 0, HD, &a->xn, 0, T, a->q, HD, CL->bq, 1);
        seg_add(b, &n, L->attn.wk, 0, KD, &a->xn, 0, T, a->k, KD, CL->bk, 1);
        seg_add(b, &n, L->attn.wv, 0, KD, &a->xn, 0, T, a->v, KD, CL->bv, 1);
    }
    mm_run(b, n);
    if (L->attn.q_gated)
        for (int64_t th = 0; th < T * H; th++) {
            memcpy(a->q + th * D, a->qg + th * 2 * D, (size_t)D * sizeof(float));
            memcpy(a->agate + th * D, a->qg + th * 2 * D + D, (size_t)D * sizeof(float));
        }
    tap2(sink, l, "attn_q", a->q, T, HD);
    tap2(sink, l, "attn_k", a->k, T, KD);
    tap2(sink, l, "attn_v", a->v, T, KD);
    if (L->attn.q_gated) tap2(sink, l, "attn_gate", a->agate, T, HD);

    if (CL->q_norm) { // qwen3 family: per-head RMSNorm before RoPE
        par_rmsnorm(b, a->q, a->q, CL->q_norm, T * H, D);
        tap2(sink, l, "attn_q_norm", a->q, T, HD);
    }
    if (CL->k_norm) {
        par_rmsnorm(b, a->k, a->k, CL->k_norm, T * Hkv, D);
        tap2(sink, l, "attn_k_norm", a->k, T, KD);
    }
    rope_apply(b, a->q, T, H);
    rope_apply(b, a->k, T, Hkv);
    tap2(sink, l, "attn_q_rope", a->q, T, HD);
    tap2(sink, l, "attn_k_rope", a->k, T, KD);

    // kv_pos_off_by_one: a decode step writes (and attends up to) position p-1;
    // rollback_stale_kv: rows a rollback should have dropped still precede
    const int64_t kv0 = pos0 + (b->s->n_kv - b->s->n_past) - (b->fault == TD_FAULT_KV_POS && pos0 > 0);
    memcpy(b->s->k_cache[l] + kv0 * KD, a->k, (size_t)(T * KD) * sizeof(float));
    memcpy(b->s->v_cache[l] + kv0 * KD, a->v, (size_t)(T * KD) * sizeof(float));
    attn_job aj = {b, l, T, kv0};
    td_cpu_pool_run(b->pool, T * H, attn_task, &aj);
    tap2(sink, l, "attn_ctx", a->ctx.x, T, HD);
    if (L->attn.q_gated) {
        for (int64_t i = 0; i < T * HD; i++) a->ctx.x[i] *= 1.0f / (1.0f + expf(-a->agate[i]));
        tap2(sink, l, "attn_gated", a->ctx.x, T, HD);
    }

    in_prepare(b, &a->ctx, 0, T);
    matmul(b, a->proj, &a->ctx, L->attn.wo, 0, E, T, CL->bo);
    tap2(sink, l, "attn_out", a->proj, T, E);
}

/* dense SwiGLU: a->xn (T, E) -> a->proj (T, E) */
static void ffn_dense(cpu_backend *b, int l, int64_t T, td_tap_sink *sink) {
    const td_layer *L = &b->m->layers[l];
    cpu_acts *a = &b->a;
    const int64_t E = b->hp.n_embd, F = b->hp.n_ff;
    int n = 0;
    seg_add(b, &n, L->ffn.gate, 0, F, &a->xn, 0, T, a->gate, F, NULL, 1);
    seg_add(b, &n, L->ffn.up, 0, F, &a->xn, 0, T, a->up, F, NULL, 1);
    mm_run(b, n);
    tap2(sink, l, "ffn_gate", a->gate, T, F);
    tap2(sink, l, "ffn_up", a->up, T, F);
    par_act(b, a->act.x, a->gate, a->up, T, F);
    tap2(sink, l, "ffn_act", a->act.x, T, F);
    in_prepare(b, &a->act, 0, T);
    matmul(b, a->proj, &a->act, L->ffn.down, 0, E, T, NULL);
}

/* softmax-routed MoE: a->xn (T, E) -> a->proj (T, E). The (token, slot)
 * pairs are grouped by expert, so each active expert is one segment over
 * its tokens; all gate/up segments run as one job, all down segments as
 * another. */
static void ffn_moe(cpu_backend *b, int l, int64_t T, td_tap_sink *sink) {
    const td_layer *L = &b->m->layers[l];
    cpu_acts *a = &b->a;
    const int64_t E = b->hp.n_embd, F = b->hp.n_ff, X = b->hp.n_expert, K = b->hp.n_expert_used;

    // the router always takes the dot path: identical router rows then give
    // bitwise identical logits, so planted ties stay ties
    int n = 0;
    seg_add(b, &n, L->ffn.gate_inp, 0, X, &a->xn, 0, T, a->moe_logits, X, NULL, 0);
    mm_run(b, n);
    tap2(sink, l, "moe_logits", a->moe_logits, T, X);
    for (int64_t t = 0; t < T; t++) softmax_f32(a->moe_probs + t * X, a->moe_logits + t * X, X);
    tap2(sink, l, "moe_probs", a->moe_probs, T, X);
    const unsigned route = (b->fault == TD_FAULT_ROUTER_TIEBREAK ? TD_ROUTE_TIE_HIGH : 0u) |
                           (b->fault == TD_FAULT_MOE_NO_RENORM ? TD_ROUTE_NO_RENORM : 0u);
    for (int64_t t = 0; t < T; t++)
        td_moe_route_f32(a->moe_topk + t * K, a->moe_w + t * K, a->moe_probs + t * X, X, K, route);
    const int64_t shape_tk[2] = {T, K};
    TD_TAP(sink, l, "moe_topk", TD_DT_I32, a->moe_topk, 2, shape_tk);
    tap2(sink, l, "moe_weights", a->moe_w, T, K);

    // rows [estart[e], estart[e] + ecount[e]) of xs are expert e's tokens, in token order
    int64_t rows = 0;
    n = 0;
    for (int64_t e = 0; e < X; e++) {
        a->estart[e] = rows;
        for (int64_t t = 0; t < T; t++)
            for (int64_t j = 0; j < K; j++)
                if (a->moe_topk[t * K + j] == e) {
                    memcpy(a->xs.x + rows * E, a->xn.x + t * E, (size_t)E * sizeof(float));
                    a->route_t[rows] = (int32_t)t, a->route_j[rows] = (int32_t)j;
                    rows++;
                }
        const int64_t r0 = a->estart[e], ne = a->ecount[e] = rows - r0;
        if (!ne) continue;
        in_prepare(b, &a->xs, r0, ne);
        // expert e = rows e*F .. e*F+F-1 of gate/up
        seg_add(b, &n, L->ffn.up_exps, e * F, F, &a->xs, r0, ne, a->up + r0 * F, F, NULL, 1);
        if (L->ffn.gate_exps) seg_add(b, &n, L->ffn.gate_exps, e * F, F, &a->xs, r0, ne, a->gate + r0 * F, F, NULL, 1);
    }
    mm_run(b, n);
    // llama MoE without gate tensors: W_down . silu(W_up x)
    par_act(b, a->act.x, L->ffn.gate_exps ? a->gate : NULL, a->up, rows, F);
    in_prepare(b, &a->act, 0, rows);

    // expert e = rows e*E .. e*E+E-1 of ffn_down_exps
    n = 0;
    for (int64_t e = 0; e < X; e++) {
        const int64_t r0 = a->estart[e];
        if (a->ecount[e])
            seg_add(b, &n, L->ffn.down_exps, e * E, E, &a->act, r0, a->ecount[e], a->ys + r0 * E, E, NULL, 1);
    }
    mm_run(b, n);

    // sum per token in rank order (largest probability first)
    memset(a->proj, 0, (size_t)(T * E) * sizeof(float));
    for (int64_t j = 0; j < K; j++)
        for (int64_t r = 0; r < rows; r++) {
            if (a->route_j[r] != j) continue;
            const int64_t t = a->route_t[r];
            const float w = a->moe_w[t * K + j];
            float *out = a->proj + t * E;
            const float *y = a->ys + r * E;
            for (int64_t i = 0; i < E; i++) out[i] += w * y[i];
        }
}

/* ===================================================================== */
/* Gated DeltaNet (arch-qwen3next.md §4.2)                                */
/* ===================================================================== */

static float dotf(const float *a, const float *b, int64_t n) {
    double s = 0; // the state's dot products are short: double keeps them far below the matmuls' error
    for (int64_t i = 0; i < n; i++) s += (double)a[i] * b[i];
    return (float)s;
}

static void l2norm_f32(float *x, int64_t n, float eps, int eps_outside) {
    double ss = 0;
    for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    // eps inside the root, on the sum (primitives §1.1); gdn_l2_eps_outside adds it to the inverse
    const float inv = (float)(eps_outside ? 1.0 / sqrt(ss) + (double)eps : 1.0 / sqrt(ss + (double)eps));
    for (int64_t i = 0; i < n; i++) x[i] *= inv;
}

/* What differs between the two architectures' GDN (arch-qwen4exp.md §4.3
 * against arch-qwen3next.md §4.2). Everything else, the fault hooks
 * included, is one code for both: a bug planted there shows on either. */
typedef struct cpu_gdn_form {
    int tiled;        // value head h reads key head h mod Hk (qwen4exp's converter reorders value heads, §2),
                      // else h / (Hv/Hk) (grouped)
    int ba_fused;     // one ssm_ba projection, rows grouped per key head: [beta (Hv/Hk) ; alpha (Hv/Hk)];
                      // else separate ssm_beta and ssm_alpha projections
    int gate_sigmoid; // output gate sigmoid(z) (qwen4exp), else silu(z)
} cpu_gdn_form;

static const cpu_gdn_form *gdn_form(const cpu_backend *b) {
    static const cpu_gdn_form qwen3next = {.tiled = 0, .ba_fused = 1, .gate_sigmoid = 0};
    static const cpu_gdn_form qwen4exp = {.tiled = 1, .ba_fused = 0, .gate_sigmoid = 1};
    return b->hp.arch == TD_ARCH_QWEN4EXP ? &qwen4exp : &qwen3next;
}

/* The key head value head h reads. */
static int64_t gdn_key_head(const cpu_backend *b, int64_t h) {
    const int64_t Hk = b->hp.ssm_n_group, Hv = b->hp.ssm_dt_rank;
    return gdn_form(b)->tiled ? h % Hk : h / (Hv / Hk);
}

/* Decode: the delta rule token by token for value head h (the definition). */
static void gdn_sequential(cpu_backend *b, float *S, int64_t h, int64_t T) {
    const td_hparams *hp = &b->hp;
    cpu_acts *a = &b->a;
    const int64_t Hk = hp->ssm_n_group, Hv = hp->ssm_dt_rank, dk = hp->ssm_d_state, g = gdn_key_head(b, h);
    const float qscale = (float)(1.0 / sqrt((double)dk));
    for (int64_t t = 0; t < T; t++) {
        const float *q = a->qn + (t * Hk + g) * dk, *k = a->kn + (t * Hk + g) * dk, *v = a->cv + (t * Hv + h) * dk;
        const float decay = expf(a->gam[t * Hv + h]), beta = a->beta[t * Hv + h];
        float *o = a->core + (t * Hv + h) * dk;
        if (b->fault == TD_FAULT_GDN_DECAY_AFTER) { // the bug: update the undecayed state, then decay
            for (int64_t j = 0; j < dk; j++) {
                float *Sj = S + j * dk;
                const float delta = beta * (v[j] - dotf(Sj, k, dk));
                for (int64_t i = 0; i < dk; i++) Sj[i] += k[i] * delta;
            }
            for (int64_t i = 0; i < dk * dk; i++) S[i] *= decay;
            for (int64_t j = 0; j < dk; j++) o[j] = qscale * dotf(S + j * dk, q, dk);
            continue;
        }
        for (int64_t i = 0; i < dk * dk; i++) S[i] *= decay;
        for (int64_t j = 0; j < dk; j++) {
            float *Sj = S + j * dk;
            const float delta = beta * (v[j] - dotf(Sj, k, dk));
            for (int64_t i = 0; i < dk; i++) Sj[i] += k[i] * delta;
            o[j] = qscale * dotf(Sj, q, dk);
        }
    }
}

/* Prefill: the chunked form (§4.2.1) for value head h, chunks of GDN_CHUNK
 * tokens. Within a chunk (local index tau, state S entering it):
 *   Gamma = cumsum(gamma); A[t][s] = beta_t (k_t.k_s) e^{Gamma_t - Gamma_s} (s < t);
 *   U = (I + A)^-1 beta v and W = (I + A)^-1 beta e^Gamma k by forward substitution;
 *   V' = U - S^T W; O_t = e^{Gamma_t} S^T q_t + sum_{s<=t} (q_t.k_s) e^{Gamma_t - Gamma_s} V'_s;
 *   S <- e^{Gamma_last} S + sum_s e^{Gamma_last - Gamma_s} k_s V'_s^T. */
static void gdn_chunked(cpu_backend *b, float *S, int64_t h, int64_t T) {
    const td_hparams *hp = &b->hp;
    cpu_acts *a = &b->a;
    const int64_t Hk = hp->ssm_n_group, Hv = hp->ssm_dt_rank, dk = hp->ssm_d_state, g = gdn_key_head(b, h);
    const float qscale = (float)(1.0 / sqrt((double)dk));
    float *A = a->ck_buf, *U = A + GDN_CHUNK * GDN_CHUNK, *W = U + GDN_CHUNK * dk, *Vp = W + GDN_CHUNK * dk;
    float *G = Vp + GDN_CHUNK * dk;
    double carried = 0; // gdn_chunk_boundary: the log-decay sum a chunk wrongly starts from
    for (int64_t c0 = 0; c0 < T; c0 += GDN_CHUNK) {
        const int64_t L = T - c0 < GDN_CHUNK ? T - c0 : GDN_CHUNK;
#define KK(s) (a->kn + ((c0 + (s)) * Hk + g) * dk)
#define QQ(s) (a->qn + ((c0 + (s)) * Hk + g) * dk)
#define VV(s) (a->cv + ((c0 + (s)) * Hv + h) * dk)
        double acc = b->fault == TD_FAULT_GDN_CHUNK ? carried : 0;
        for (int64_t t = 0; t < L; t++) G[t] = (float)(acc += a->gam[(c0 + t) * Hv + h]);
        carried = acc;
        for (int64_t t = 0; t < L; t++) {
            const float bt = a->beta[(c0 + t) * Hv + h], et = expf(G[t]);
            for (int64_t s2 = 0; s2 < t; s2++) A[t * GDN_CHUNK + s2] = bt * dotf(KK(t), KK(s2), dk) * expf(G[t] - G[s2]);
            for (int64_t i = 0; i < dk; i++) {
                double u = (double)bt * VV(t)[i], w = (double)bt * et * KK(t)[i];
                for (int64_t s2 = 0; s2 < t; s2++) {
                    u -= (double)A[t * GDN_CHUNK + s2] * U[s2 * dk + i];
                    w -= (double)A[t * GDN_CHUNK + s2] * W[s2 * dk + i];
                }
                U[t * dk + i] = (float)u, W[t * dk + i] = (float)w;
            }
            for (int64_t j = 0; j < dk; j++) Vp[t * dk + j] = U[t * dk + j] - dotf(S + j * dk, W + t * dk, dk);
        }
        for (int64_t t = 0; t < L; t++) {
            float *o = a->core + ((c0 + t) * Hv + h) * dk;
            const float et = expf(G[t]);
            for (int64_t j = 0; j < dk; j++) o[j] = et * qscale * dotf(S + j * dk, QQ(t), dk);
            for (int64_t s2 = 0; s2 <= t; s2++) {
                const float p = qscale * dotf(QQ(t), KK(s2), dk) * expf(G[t] - G[s2]);
                for (int64_t j = 0; j < dk; j++) o[j] += p * Vp[s2 * dk + j];
            }
        }
        const float eL = expf(G[L - 1]);
        for (int64_t i = 0; i < dk * dk; i++) S[i] *= eL;
        for (int64_t s2 = 0; s2 < L; s2++) {
            const float w = expf(G[L - 1] - G[s2]);
            for (int64_t j = 0; j < dk; j++) {
                const float vj = w * Vp[s2 * dk + j];
                for (int64_t i = 0; i < dk; i++) S[j * dk + i] += KK(s2)[i] * vj;
            }
        }
#undef KK
#undef QQ
#undef VV
    }
}

/* The GDN mixer of layer l (either architecture): its prepared input a->xn
 * (T, E) -> a->proj (T, E). Taps ssm_qkv .. ssm_out. */
static void gdn_mixer(cpu_backend *b, int l, int64_t T, td_tap_sink *sink) {
    const td_hparams *hp = &b->hp;
    const cpu_gdn_form *f = gdn_form(b);
    const td_gdn_parts *Gp = &b->m->layers[l].gdn;
    const cpu_layer *CL = &b->layers[l];
    cpu_acts *a = &b->a;
    const int64_t E = hp->n_embd, Hk = hp->ssm_n_group, Hv = hp->ssm_dt_rank, dk = hp->ssm_d_state;
    const int64_t KDk = Hk * dk, VD = Hv * dk, C = 2 * KDk + VD, Kc = hp->ssm_conv, rr = Hv / Hk;

    int n = 0;
    seg_add(b, &n, Gp->wqkv, 0, C, &a->xn, 0, T, a->m, C, NULL, 1);
    seg_add(b, &n, Gp->wgate, 0, VD, &a->xn, 0, T, a->z, VD, NULL, 1);
    if (f->ba_fused) {
        seg_add(b, &n, Gp->wba, 0, 2 * Hv, &a->xn, 0, T, a->ba, 2 * Hv, NULL, 1);
    } else { // a->ba rows: [beta logits (Hv); alpha logits (Hv)]
        seg_add(b, &n, Gp->wbeta, 0, Hv, &a->xn, 0, T, a->ba, 2 * Hv, NULL, 1);
        seg_add(b, &n, Gp->walpha, 0, Hv, &a->xn, 0, T, a->ba + Hv, 2 * Hv, NULL, 1);
    }
    mm_run(b, n);
    tap2(sink, l, "ssm_qkv", a->m, T, C);
    tap2(sink, l, "ssm_z", a->z, T, VD);
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < Hv; h++) {
            // head h's beta and alpha logits in its ba row
            const int64_t ib = f->ba_fused ? h / rr * 2 * rr + h % rr : h, ia = ib + (f->ba_fused ? rr : Hv);
            const float bt = a->ba[t * 2 * Hv + ib], z = a->ba[t * 2 * Hv + ia] + CL->ssm_dt[h];
            a->beta[t * Hv + h] = 1.0f / (1.0f + expf(-bt));
            a->gam[t * Hv + h] = CL->ssm_a[h] * (z > 20 ? z : log1pf(expf(z)));
        }
    tap2(sink, l, "ssm_beta", a->beta, T, Hv);
    tap2(sink, l, "ssm_gate", a->gam, T, Hv);

    float *cs = b->s->rs + b->rs_conv[l];
    for (int64_t ch = 0; ch < C; ch++) {
        const float *w = CL->conv + ch * Kc;
        float *st = cs + ch * (Kc - 1);
        for (int64_t t = 0; t < T; t++) {
            const float u = a->m[t * C + ch];
            float y = w[Kc - 1] * u;
            for (int64_t k = 0; k < Kc - 1; k++) y += w[k] * st[k];
            if (!(b->fault == TD_FAULT_CONV_SHIFT && T == 1))
                for (int64_t k = 0; k + 1 < Kc - 1; k++) st[k] = st[k + 1];
            if (Kc > 1) st[Kc - 2] = u;
            y = silu(y);
            if (ch < KDk) a->cq[t * KDk + ch] = y;
            else if (ch < 2 * KDk) a->ck[t * KDk + ch - KDk] = y;
            else a->cv[t * VD + ch - 2 * KDk] = y;
        }
    }
    tap2(sink, l, "ssm_q", a->cq, T, KDk);
    tap2(sink, l, "ssm_k", a->ck, T, KDk);
    tap2(sink, l, "ssm_v", a->cv, T, VD);
    tap2(sink, l, "ssm_conv_state", cs, C, Kc - 1);

    memcpy(a->qn, a->cq, (size_t)(T * KDk) * sizeof(float));
    memcpy(a->kn, a->ck, (size_t)(T * KDk) * sizeof(float));
    for (int64_t i = 0; i < T * Hk; i++) {
        l2norm_f32(a->qn + i * dk, dk, hp->rms_eps, b->fault == TD_FAULT_GDN_L2_EPS);
        l2norm_f32(a->kn + i * dk, dk, hp->rms_eps, b->fault == TD_FAULT_GDN_L2_EPS);
    }
    float *S = b->s->rs + b->rs_ssm[l];
    for (int64_t h = 0; h < Hv; h++) {
        if (T > 1 && b->fault != TD_FAULT_GDN_DECAY_AFTER) gdn_chunked(b, S + h * dk * dk, h, T);
        else gdn_sequential(b, S + h * dk * dk, h, T);
    }
    tap2(sink, l, "ssm_core", a->core, T, VD);
    {
        const int64_t shape[3] = {Hv, dk, dk};
        TD_TAP(sink, l, "ssm_state", TD_DT_F32, S, 3, shape);
    }
    rmsnorm_rows(a->gated.x, a->core, CL->ssm_norm, hp->rms_eps, T * Hv, dk);
    if (f->gate_sigmoid)
        for (int64_t i = 0; i < T * VD; i++) a->gated.x[i] *= 1.0f / (1.0f + expf(-a->z[i]));
    else
        for (int64_t i = 0; i < T * VD; i++) a->gated.x[i] *= silu(a->z[i]);
    tap2(sink, l, "ssm_gated", a->gated.x, T, VD);
    in_prepare(b, &a->gated, 0, T);
    matmul(b, a->proj, &a->gated, Gp->wout, 0, E, T, NULL);
    tap2(sink, l, "ssm_out", a->proj, T, E);
}

/* a->x (T, E) -> a->proj (T, E) = the GDN block of layer l (qwen3next: the
 * pre-norm, then the mixer) */
static void gdn_block(cpu_backend *b, int l, int64_t T, td_tap_sink *sink) {
    cpu_acts *a = &b->a;
    const int64_t E = b->hp.n_embd;
    par_rmsnorm(b, a->xn.x, a->x, b->layers[l].attn_norm, T, E);
    tap2(sink, l, "attn_norm", a->xn.x, T, E);
    in_prepare(b, &a->xn, 0, T);
    gdn_mixer(b, l, T, sink);
}

/* the sigmoid-gated shared expert, added to the MoE output in a->proj */
static void ffn_shared_expert(cpu_backend *b, int l, int64_t T, td_tap_sink *sink) {
    const td_ffn_parts *f = &b->m->layers[l].ffn;
    cpu_acts *a = &b->a;
    const int64_t E = b->hp.n_embd, Fs = b->hp.n_ff_shexp;
    int n = 0;
    seg_add(b, &n, f->gate_shexp, 0, Fs, &a->xn, 0, T, a->sh_g, Fs, NULL, 1);
    seg_add(b, &n, f->up_shexp, 0, Fs, &a->xn, 0, T, a->sh_u, Fs, NULL, 1);
    mm_run(b, n);
    par_act(b, a->sh_act.x, a->sh_g, a->sh_u, T, Fs);
    in_prepare(b, &a->sh_act, 0, T);
    matmul(b, a->sh_y, &a->sh_act, f->down_shexp, 0, E, T, NULL);
    tap2(sink, l, "ffn_shexp", a->sh_y, T, E);
    for (int64_t t = 0; t < T; t++) {
        const float z = dotf(b->layers[l].shexp_gate, a->xn.x + t * E, E);
        a->sh_s[t] = b->fault == TD_FAULT_SHEXP_NO_SIGMOID ? z : 1.0f / (1.0f + expf(-z));
    }
    {
        const int64_t shape[1] = {T};
        TD_TAP(sink, l, "ffn_shexp_gate", TD_DT_F32, a->sh_s, 1, shape);
    }
    for (int64_t t = 0; t < T; t++)
        for (int64_t i = 0; i < E; i++) a->proj[t * E + i] += a->sh_s[t] * a->sh_y[t * E + i];
}

static void layer_forward(cpu_backend *b, int l, int64_t T, int64_t pos0, td_tap_sink *sink) {
    const td_layer *L = &b->m->layers[l];
    cpu_acts *a = &b->a;
    const int64_t E = b->hp.n_embd;

    // the mixer of this block's kind (open refused kinds not listed in layer_kinds)
    switch (L->kind) {
    case TD_LAYER_ATTENTION: attention_block(b, l, T, pos0, sink); break;
    case TD_LAYER_GDN: gdn_block(b, l, T, sink); break;
    case TD_LAYER_HC_GDN: // qwen4exp: refused at open (layer_kinds)
    case TD_LAYER_HC_QSA:
    case TD_LAYER_KIND_COUNT: TD_ASSERT(0 && "layer kind refused at open");
    }
    if (b->fault == TD_FAULT_RESIDUAL_SKIP &&
        l == (b->hp.n_layer > TD_FAULT_RESIDUAL_LAYER ? TD_FAULT_RESIDUAL_LAYER : 0))
        memcpy(a->x, a->proj, (size_t)(T * E) * sizeof(float));
    else
        for (int64_t i = 0; i < T * E; i++) a->x[i] += a->proj[i];
    tap2(sink, l, "ffn_inp", a->x, T, E);

    par_rmsnorm(b, a->xn.x, a->x, b->layers[l].ffn_norm, T, E);
    tap2(sink, l, "ffn_norm", a->xn.x, T, E);
    in_prepare(b, &a->xn, 0, T);
    if (L->ffn.gate_inp) ffn_moe(b, l, T, sink); // the router is bound: a MoE FFN
    else ffn_dense(b, l, T, sink);
    if (L->ffn.gate_inp_shexp) ffn_shared_expert(b, l, T, sink);
    tap2(sink, l, "ffn_out", a->proj, T, E);

    for (int64_t i = 0; i < T * E; i++) a->x[i] += a->proj[i];
    tap2(sink, l, "out", a->x, T, E);
}

static void acts_free(cpu_acts *a) {
    free(a->x), free(a->q), free(a->k), free(a->v);
    in_free(&a->xn), in_free(&a->ctx), in_free(&a->act), in_free(&a->xs);
    free(a->proj), free(a->gate), free(a->up), free(a->logits);
    free(a->moe_logits), free(a->moe_probs), free(a->moe_topk), free(a->moe_w);
    free(a->ys), free(a->route_t), free(a->route_j), free(a->rope_c), free(a->rope_s);
    free(a->pos32), free(a->estart), free(a->ecount);
    free(a->qg), free(a->agate), free(a->m), free(a->z), free(a->ba), free(a->beta), free(a->gam);
    free(a->cq), free(a->ck), free(a->cv), free(a->qn), free(a->kn), free(a->core), free(a->ck_buf);
    in_free(&a->gated), in_free(&a->sh_act);
    free(a->sh_g), free(a->sh_u), free(a->sh_y), free(a->sh_s);
    memset(a, 0, sizeof *a);
}

static void acts_ensure(cpu_backend *b, int64_t T) {
    cpu_acts *a = &b->a;
    if (T <= a->cap_T) return;
    acts_free(a);
    const td_hparams *hp = &b->hp;
    const size_t E = hp->n_embd, HD = (size_t)hp->n_head * hp->head_dim, KD = (size_t)hp->n_head_kv * hp->head_dim;
    const size_t F = hp->n_ff, X = hp->n_expert, K = hp->n_expert_used, V = hp->n_vocab, n = (size_t)T;
    const size_t rows = X ? n * K : n; // FFN rows: (token, slot) pairs for MoE
    const size_t fs = sizeof(float);
    a->cap_T = T;
    a->x = td_xcalloc(n * E, fs);
    in_alloc(&a->xn, n, E, b->fmts_xn);
    a->q = td_xcalloc(n * HD, fs);
    a->k = td_xcalloc(n * KD, fs);
    a->v = td_xcalloc(n * KD, fs);
    in_alloc(&a->ctx, n, HD, b->fmts_ctx);
    a->proj = td_xcalloc(n * E, fs);
    a->gate = td_xcalloc(rows * F, fs);
    a->up = td_xcalloc(rows * F, fs);
    in_alloc(&a->act, rows, F, b->fmts_act);
    a->logits = td_xcalloc(n * V, fs);
    a->rope_c = td_xcalloc(n * (hp->head_dim / 2) + 1, fs); // D/2 >= R/2: rope_partial_all_dims rotates all D
    a->rope_s = td_xcalloc(n * (hp->head_dim / 2) + 1, fs);
    a->pos32 = td_xcalloc(n, sizeof(int32_t));
    if (X) {
        a->moe_logits = td_xcalloc(n * X, fs);
        a->moe_probs = td_xcalloc(n * X, fs);
        a->moe_topk = td_xcalloc(n * K, sizeof(int32_t));
        a->moe_w = td_xcalloc(n * K, fs);
        in_alloc(&a->xs, rows, E, b->fmts_xs);
        a->ys = td_xcalloc(rows * E, fs);
        a->route_t = td_xcalloc(rows, sizeof(int32_t));
        a->route_j = td_xcalloc(rows, sizeof(int32_t));
        a->estart = td_xcalloc(X, sizeof(int64_t));
        a->ecount = td_xcalloc(X, sizeof(int64_t));
    }
    if (hp->arch == TD_ARCH_QWEN3NEXT || hp->arch == TD_ARCH_QWEN4EXP) {
        const size_t KDk = (size_t)hp->ssm_n_group * hp->ssm_d_state, VD = hp->ssm_d_inner, C = 2 * KDk + VD;
        const size_t Hv = hp->ssm_dt_rank, Fs = hp->n_ff_shexp, dk = hp->ssm_d_state;
        a->qg = td_xcalloc(n * 2 * HD, fs);
        a->agate = td_xcalloc(n * HD, fs);
        a->m = td_xcalloc(n * C, fs);
        a->z = td_xcalloc(n * VD, fs);
        a->ba = td_xcalloc(n * 2 * Hv, fs);
        a->beta = td_xcalloc(n * Hv, fs);
        a->gam = td_xcalloc(n * Hv, fs);
        a->cq = td_xcalloc(n * KDk, fs);
        a->ck = td_xcalloc(n * KDk, fs);
        a->cv = td_xcalloc(n * VD, fs);
        a->qn = td_xcalloc(n * KDk, fs);
        a->kn = td_xcalloc(n * KDk, fs);
        a->core = td_xcalloc(n * VD, fs);
        in_alloc(&a->gated, n, VD, b->fmts_gated);
        a->sh_g = td_xcalloc(n * Fs, fs);
        a->sh_u = td_xcalloc(n * Fs, fs);
        in_alloc(&a->sh_act, n, Fs, b->fmts_shact);
        a->sh_y = td_xcalloc(n * E, fs);
        a->sh_s = td_xcalloc(n, fs);
        // chunk scratch: A (L, L), U and W (L, dk), Gamma (L)
        a->ck_buf = td_xcalloc((size_t)(GDN_CHUNK * GDN_CHUNK + 3 * GDN_CHUNK * dk + GDN_CHUNK), fs);
    }
}

/* Grows sequence s's KV cache and the per-thread score rows to `need` rows. */
static void kv_ensure(cpu_backend *b, cpu_seq *s, int64_t need) {
    if (need <= s->kv_cap) return;
    int64_t cap = s->kv_cap ? 2 * s->kv_cap : 64;
    if (cap > b->n_ctx) cap = b->n_ctx;
    if (cap < need) cap = need; // only a state fault's stale rows go past n_ctx
    const size_t row = (size_t)b->hp.n_head_kv * b->hp.head_dim * sizeof(float);
    if (!s->k_cache) {
        s->k_cache = td_xcalloc(b->hp.n_layer ? b->hp.n_layer : 1, sizeof(float *));
        s->v_cache = td_xcalloc(b->hp.n_layer ? b->hp.n_layer : 1, sizeof(float *));
    }
    for (uint32_t l = 0; l < b->hp.n_layer; l++) {
        s->k_cache[l] = td_xrealloc(s->k_cache[l], (size_t)cap * row);
        s->v_cache[l] = td_xrealloc(s->v_cache[l], (size_t)cap * row);
    }
    s->kv_cap = cap;
    if (cap > b->att_cap) {
        for (int t = 0; t < b->n_threads; t++) b->att[t] = td_xrealloc(b->att[t], (size_t)cap * sizeof(float));
        b->att_cap = cap;
    }
}

/* The sequence's recurrent state, allocated (zero) on first use. */
static void rs_ensure(const cpu_backend *b, cpu_seq *s) {
    if (s->rs) return;
    s->rs = td_xcalloc((size_t)b->rs_n, sizeof(float));
    s->snap = td_xmalloc((size_t)(CPU_SNAPS * b->rs_n) * sizeof(float));
    for (int i = 0; i < CPU_SNAPS; i++) s->snap_pos[i] = -1;
}

/* Before a forward from pos0: keep the state a rollback to pos0 restores. */
static void rs_snapshot(const cpu_backend *b, cpu_seq *s, int64_t pos0) {
    // a single sequence that no state operation touched never rolls back:
    // a copy of the whole state per forward would be pure cost
    if (!b->rs_n) return;
    rs_ensure(b, s);
    if (!b->state_ops) return;
    const int i = (int)(pos0 % CPU_SNAPS);
    memcpy(s->snap + i * b->rs_n, s->rs, (size_t)b->rs_n * sizeof(float));
    s->snap_pos[i] = pos0;
}

static int cpu_forward(td_backend *base, const int32_t *tokens, int64_t T, int64_t pos0, td_tap_sink *sink,
                       double *logits, td_err *err) {
    cpu_backend *b = (cpu_backend *)base;
    const td_hparams *hp = &b->hp;
    const int64_t E = hp->n_embd, V = hp->n_vocab;

    int rc = td_fwd_check_step(NAME, tokens, T, pos0, b->s->n_past, b->n_ctx, V, err);
    if (rc) return rc;

    int32_t stale[1] = {0}; // stale_token: this decode step consumes token 0
    if (b->fault == TD_FAULT_STALE_TOKEN && b->n_fwd == TD_FAULT_STALE_STEP && T == 1) tokens = stale;
    b->n_fwd++;
    acts_ensure(b, T);
    kv_ensure(b, b->s, b->s->n_kv + T);
    rs_snapshot(b, b->s, pos0);
    cpu_acts *a = &b->a;
    td_fwd_tap_inputs(sink, tokens, T, pos0, a->pos32);

    const td_tensor *emb = b->m->tok_embd;
    for (int64_t t = 0; t < T; t++)
        b->k.type[emb->type].to_f32(emb->type, td_tensor_row(emb, (uint64_t)tokens[t]), a->x + t * E, E);
    tap2(sink, -1, "inp.embd", a->x, T, E);

    // rows r0.. of the output: all of them, or the last when only it is read
    const int64_t r0 = b->logits_last && !sink ? T - 1 : 0, nr = T - r0;
    if (b->q4) { // qwen4exp: the streams, and the final HC mixer as the output norm
        q4_body(b, tokens, T, pos0, sink);
    } else {
        rope_tables(b, T, pos0);
        for (uint32_t l = 0; l < hp->n_layer; l++) layer_forward(b, (int)l, T, pos0, sink);
        par_rmsnorm(b, a->xn.x + r0 * E, a->x + r0 * E, b->out_norm, nr, E);
        tap2(sink, -1, "out.norm", a->xn.x, T, E);
    }
    in_prepare(b, &a->xn, r0, nr);
    // output.weight, or token_embd.weight when tied (the model binds either)
    int n_segs = 0;
    seg_add(b, &n_segs, b->m->output, 0, V, &a->xn, r0, nr, a->logits + r0 * V, V, NULL, 1);
    mm_run(b, n_segs);
    tap2(sink, -1, "out.logits", a->logits, T, V);
    for (int64_t i = r0 * V; i < T * V; i++) logits[i] = (double)a->logits[i];

    b->s->n_past = pos0 + T;
    b->s->n_kv += T;
    td_hist_push(&b->s->hist, tokens, T);
    td_hist_tap(&b->s->hist, sink);
    return TD_OK;
}

/* ===================================================================== */
/* Open / close                                                           */
/* ===================================================================== */

/* An empty sequence's recurrent state: zero, no snapshots. */
static void rs_clear(const cpu_backend *b, cpu_seq *s) {
    if (!s->rs) return;
    memset(s->rs, 0, (size_t)b->rs_n * sizeof(float));
    for (int i = 0; i < CPU_SNAPS; i++) s->snap_pos[i] = -1;
}

static void cpu_reset(td_backend *base) {
    cpu_backend *b = (cpu_backend *)base;
    for (int i = 0; i < TD_SEQ_MAX; i++) {
        b->seqs[i].n_past = b->seqs[i].n_kv = 0;
        td_hist_reset(&b->seqs[i].hist);
        rs_clear(b, &b->seqs[i]);
    }
    b->s = &b->seqs[0];
    b->n_fwd = 0;
}

static int seq_check(int seq, td_err *err) {
    if (seq < 0 || seq >= TD_SEQ_MAX)
        return td_err_set(err, TD_EINPUT, NAME ": sequence %d out of range (0..%d)", seq, TD_SEQ_MAX - 1);
    return TD_OK;
}

static int cpu_seq_use(td_backend *base, int seq, td_err *err) {
    cpu_backend *b = (cpu_backend *)base;
    int rc = seq_check(seq, err);
    if (!rc) b->s = &b->seqs[seq];
    return rc;
}

static int cpu_seq_rm(td_backend *base, int seq, int64_t p0, td_err *err) {
    cpu_backend *b = (cpu_backend *)base;
    int rc = seq_check(seq, err);
    if (rc) return rc;
    if (p0 < 0) return td_err_set(err, TD_EINPUT, NAME ": rollback to position %lld", (long long)p0);
    cpu_seq *s = &b->seqs[seq];
    b->state_ops = 1;
    if (p0 >= s->n_past) return TD_OK;
    // recurrent state: zero for p0 = 0, else a snapshot taken at p0 (refused, with nothing changed, without one)
    const int slot = (int)(p0 % CPU_SNAPS);
    if (b->rs_n && p0 > 0 && (!s->snap || s->snap_pos[slot] != p0))
        return td_err_set(err, TD_SKIP,
                          NAME ": sequence %d: rollback from %lld to position %lld needs the recurrent (GDN) state "
                          "there, and this arm keeps it only where one of the last %d positions' forwards started "
                          "(not inside a multi-token forward; from the first state operation on when opened for "
                          "one sequence)",
                          seq, (long long)s->n_past, (long long)p0, CPU_SNAPS);
    if (s->rs && b->fault != TD_FAULT_GDN_ROLLBACK_STALE) {
        if (p0 == 0) memset(s->rs, 0, (size_t)b->rs_n * sizeof(float));
        else memcpy(s->rs, s->snap + slot * b->rs_n, (size_t)b->rs_n * sizeof(float));
    }
    // snapshots past p0 are of dropped positions
    for (int i = 0; s->snap && i < CPU_SNAPS; i++)
        if (s->snap_pos[i] > p0) s->snap_pos[i] = -1;
    const int64_t dropped = s->n_past - p0;
    // the history keeps what it still holds of the earlier positions
    const int64_t keep = s->hist.n > dropped ? s->hist.n - dropped : 0;
    s->hist.n = keep;
    s->n_past = p0;
    if (b->fault != TD_FAULT_ROLLBACK_STALE_KV) s->n_kv = p0;
    return TD_OK;
}

static int cpu_seq_cp(td_backend *base, int src, int dst, td_err *err) {
    cpu_backend *b = (cpu_backend *)base;
    int rc = seq_check(src, err);
    if (!rc) rc = seq_check(dst, err);
    if (rc || src == dst) return rc;
    b->state_ops = 1;
    cpu_seq *s = &b->seqs[src], *d = &b->seqs[dst];
    if (s->n_kv) kv_ensure(b, d, s->n_kv);
    const size_t row = (size_t)b->hp.n_head_kv * b->hp.head_dim;
    // seq_copy_short: the copy misses the source's last row, which it leaves empty
    const int64_t rows = s->n_kv - (b->fault == TD_FAULT_SEQ_COPY_SHORT && s->n_kv > 0);
    for (uint32_t l = 0; s->n_kv && l < b->hp.n_layer; l++) {
        memcpy(d->k_cache[l], s->k_cache[l], (size_t)rows * row * sizeof(float));
        memcpy(d->v_cache[l], s->v_cache[l], (size_t)rows * row * sizeof(float));
        if (rows < s->n_kv) {
            memset(d->k_cache[l] + rows * row, 0, row * sizeof(float));
            memset(d->v_cache[l] + rows * row, 0, row * sizeof(float));
        }
    }
    d->n_past = s->n_past;
    d->n_kv = s->n_kv;
    d->hist = s->hist;
    if (b->q4) q4_seq_cp(b, src, dst, s->n_kv);
    // the recurrent state, and its snapshots so that the copy rolls back as its source would
    if (b->rs_n) {
        rs_ensure(b, d);
        if (s->rs) {
            memcpy(d->rs, s->rs, (size_t)b->rs_n * sizeof(float));
            memcpy(d->snap, s->snap, (size_t)(CPU_SNAPS * b->rs_n) * sizeof(float));
            memcpy(d->snap_pos, s->snap_pos, sizeof d->snap_pos);
        } else {
            rs_clear(b, d);
        }
    }
    return TD_OK;
}

static void free_layer(cpu_layer *l) {
    free(l->attn_norm), free(l->ffn_norm), free(l->q_norm), free(l->k_norm);
    free(l->bq), free(l->bk), free(l->bv), free(l->bo);
    free(l->ssm_a), free(l->ssm_dt), free(l->ssm_norm), free(l->conv), free(l->shexp_gate);
}

static void cpu_close(td_backend *base) {
    cpu_backend *b = (cpu_backend *)base;
    if (!b) return;
    td_cpu_pool_free(b->pool);
    for (int i = 0; i < TD_SEQ_MAX; i++) {
        cpu_seq *s = &b->seqs[i];
        for (uint32_t l = 0; s->k_cache && l < b->hp.n_layer; l++) free(s->k_cache[l]), free(s->v_cache[l]);
        free(s->k_cache), free(s->v_cache);
        free(s->rs), free(s->snap);
    }
    for (uint32_t l = 0; b->layers && l < b->hp.n_layer; l++) free_layer(&b->layers[l]);
    free(b->rs_conv), free(b->rs_ssm);
    for (int t = 0; t < b->n_threads; t++) {
        if (b->tile) free(b->tile[t]);
        if (b->rowbuf) free(b->rowbuf[t]);
        if (b->att) free(b->att[t]);
    }
    free(b->layers), free(b->out_norm), free(b->rope_ff);
    free(b->tile), free(b->rowbuf), free(b->att), free(b->segs);
    for (int i = 0; i < b->n_pack_chunks; i++) free(b->pack_chunks[i]);
    free(b->pack_chunks);
    free(b->packs);
    acts_free(&b->a);
    q4_free(b);
    free(b);
}

static const char *cpu_version(const td_backend *base) {
    return ((const cpu_backend *)base)->version;
}

/* A matrix the forward reads: present, rows of n_in values, >= n_rows rows,
 * and a type the kernels can read. */
static int check_matrix(const td_cpu_kernels *k, const td_tensor *t, const char *what, int l, int64_t n_in,
                        int64_t n_rows, td_err *err) {
    int rc = td_fwd_check_matrix(NAME, t, what, l, n_in, n_rows, err);
    if (rc) return rc;
    if (t->type < 0 || t->type >= TD_TYPE_COUNT || !k->type[t->type].to_f32)
        return td_err_set(err, TD_EINPUT, NAME ": tensor %s: type %s has no decoder (expected a ggml weight type)",
                          t->cname, td_type_name(t->type));
    return TD_OK;
}

/* A 1-D vector (norm weight, bias) decoded to f32: elements [off, off+n). */
static int load_vec(const td_cpu_kernels *k, float **out, const td_tensor *t, const char *what, int l, int64_t off,
                    int64_t n, td_err *err) {
    *out = NULL;
    if (!t) return TD_OK;
    int rc = check_matrix(k, t, what, l, t->ne[0], 1, err);
    if (rc) return rc;
    if (t->ne[0] < off + n)
        return td_err_set(err, TD_EINPUT, NAME ": tensor %s: expected at least %lld values, found %lld", t->cname,
                          (long long)(off + n), (long long)t->ne[0]);
    float *row = td_xmalloc((size_t)t->ne[0] * sizeof(float));
    k->type[t->type].to_f32(t->type, td_tensor_row(t, 0), row, t->ne[0]);
    *out = td_xmalloc((size_t)n * sizeof(float));
    memcpy(*out, row + off, (size_t)n * sizeof(float));
    free(row);
    return TD_OK;
}

/* A GDN layer's weights in the model's form (gdn_form): checked, its small
 * vectors and conv taps decoded once. */
static int gdn_open_layer(cpu_backend *b, int l, td_err *err) {
    const td_hparams *hp = &b->hp;
    const td_cpu_kernels *k = &b->k;
    const td_gdn_parts *G = &b->m->layers[l].gdn;
    cpu_layer *C = &b->layers[l];
    const int64_t E = hp->n_embd, Hk = hp->ssm_n_group, Hv = hp->ssm_dt_rank, dk = hp->ssm_d_state, Kc = hp->ssm_conv;
    const int64_t VD = Hv * dk, Cc = 2 * Hk * dk + VD;
    int rc;
    if (Hk < 1 || Hv % Hk || hp->ssm_d_inner != VD || Kc < 1)
        return td_err_set(err, TD_EINPUT, NAME ": layer %d is a GDN layer with inconsistent ssm sizes", l);
    if ((rc = check_matrix(k, G->wqkv, "attn_qkv", l, E, Cc, err))) return rc;
    if ((rc = check_matrix(k, G->wgate, "attn_gate", l, E, VD, err))) return rc;
    if (gdn_form(b)->ba_fused) {
        if ((rc = check_matrix(k, G->wba, "ssm_ba", l, E, 2 * Hv, err))) return rc;
    } else {
        if ((rc = check_matrix(k, G->wbeta, "ssm_beta", l, E, Hv, err))) return rc;
        if ((rc = check_matrix(k, G->walpha, "ssm_alpha", l, E, Hv, err))) return rc;
    }
    if ((rc = check_matrix(k, G->wout, "ssm_out", l, VD, E, err))) return rc;
    if ((rc = check_matrix(k, G->conv, "ssm_conv1d", l, Kc, Cc, err))) return rc;
    if ((rc = load_vec(k, &C->ssm_a, G->a, "ssm_a", l, 0, Hv, err))) return rc;
    if ((rc = load_vec(k, &C->ssm_dt, G->dt_bias, "ssm_dt.bias", l, 0, Hv, err))) return rc;
    if ((rc = load_vec(k, &C->ssm_norm, G->ssm_norm, "ssm_norm", l, 0, dk, err))) return rc;
    if (!C->ssm_a || !C->ssm_dt || !C->ssm_norm)
        return td_err_set(err, TD_EINPUT, NAME ": layer %d lacks ssm_a, ssm_dt.bias or ssm_norm", l);
    C->conv = td_xmalloc((size_t)(Cc * Kc) * sizeof(float));
    for (int64_t ch = 0; ch < Cc; ch++)
        k->type[G->conv->type].to_f32(G->conv->type, td_tensor_row(G->conv, (uint64_t)ch), C->conv + ch * Kc, Kc);
    return TD_OK;
}

/* Layer l's routed experts (router, up, gate where present or need_gate,
 * down), checked; load_model and q4_load share it. */
static int check_moe(const td_cpu_kernels *k, const td_layer *L, int l, int64_t E, int64_t X, int64_t F, int need_gate,
                     td_err *err) {
    int rc;
    if ((rc = check_matrix(k, L->ffn.gate_inp, "ffn_gate_inp", l, E, X, err))) return rc;
    if ((rc = check_matrix(k, L->ffn.up_exps, "ffn_up_exps", l, E, X * F, err))) return rc;
    if ((need_gate || L->ffn.gate_exps) &&
        (rc = check_matrix(k, L->ffn.gate_exps, "ffn_gate_exps", l, E, X * F, err)))
        return rc;
    return check_matrix(k, L->ffn.down_exps, "ffn_down_exps", l, F, X * E, err);
}

/* Layer l's shared expert: its gate vector decoded, its three matrices checked. */
static int load_shexp(const td_cpu_kernels *k, cpu_layer *C, const td_layer *L, int l, int64_t E, int64_t Fs,
                      td_err *err) {
    int rc;
    if ((rc = load_vec(k, &C->shexp_gate, L->ffn.gate_inp_shexp, "ffn_gate_inp_shexp", l, 0, E, err))) return rc;
    if ((rc = check_matrix(k, L->ffn.gate_shexp, "ffn_gate_shexp", l, E, Fs, err))) return rc;
    if ((rc = check_matrix(k, L->ffn.up_shexp, "ffn_up_shexp", l, E, Fs, err))) return rc;
    return check_matrix(k, L->ffn.down_shexp, "ffn_down_shexp", l, Fs, E, err);
}

#include "cpu_hc.c"

static int load_model(cpu_backend *b, td_err *err) {
    const td_model *m = b->m;
    const td_hparams *hp = &b->hp;
    const td_cpu_kernels *k = &b->k;
    const int64_t E = hp->n_embd, H = hp->n_head, Hkv = hp->n_head_kv, D = hp->head_dim, F = hp->n_ff;
    const int64_t X = hp->n_expert, V = hp->n_vocab, HD = H * D, KD = Hkv * D;
    int rc;
    if ((rc = td_fwd_check_model(NAME, td_cpu_backend.layer_kinds, m, err))) return rc;
    if ((rc = check_matrix(k, m->tok_embd, "token_embd", -1, E, V, err))) return rc;
    if ((rc = check_matrix(k, m->output, "output", -1, E, V, err))) return rc;
    if (hp->arch == TD_ARCH_QWEN4EXP) return q4_load(b, err);
    if ((rc = load_vec(k, &b->out_norm, m->output_norm, "output_norm", -1, 0, E, err))) return rc;
    if (!b->out_norm) return td_err_set(err, TD_EINPUT, NAME ": the model has no output_norm tensor");
    if ((rc = load_vec(k, &b->rope_ff, m->rope_freqs, "rope_freqs", -1, 0, hp->rope_dims / 2, err))) return rc;

    b->layers = td_xcalloc(hp->n_layer ? hp->n_layer : 1, sizeof *b->layers);
    for (uint32_t i = 0; i < hp->n_layer; i++) {
        const td_layer *L = &m->layers[i];
        cpu_layer *C = &b->layers[i];
        const int l = (int)i;
        if ((rc = load_vec(k, &C->attn_norm, L->kind == TD_LAYER_GDN ? L->gdn.norm : L->attn.norm, "attn_norm", l, 0,
                           E, err)))
            return rc;
        if ((rc = load_vec(k, &C->ffn_norm, L->ffn.norm, "ffn_norm", l, 0, E, err))) return rc;
        if (!C->attn_norm || !C->ffn_norm)
            return td_err_set(err, TD_EINPUT, NAME ": layer %d lacks %s", l, C->attn_norm ? "ffn_norm" : "attn_norm");
        if ((rc = load_vec(k, &C->q_norm, L->attn.q_norm, "attn_q_norm", l, 0, D, err))) return rc;
        if ((rc = load_vec(k, &C->k_norm, L->attn.k_norm, "attn_k_norm", l, 0, D, err))) return rc;
        if (L->ffn.gate_inp_shexp && (rc = load_shexp(k, C, L, l, E, hp->n_ff_shexp, err))) return rc;
        if (L->kind == TD_LAYER_GDN) {
            if ((rc = gdn_open_layer(b, l, err))) return rc;
        } else if (L->attn.q_gated) {
            if ((rc = check_matrix(k, L->attn.wq, "attn_q", l, E, 2 * HD, err))) return rc;
            if ((rc = check_matrix(k, L->attn.wk, "attn_k", l, E, KD, err))) return rc;
            if ((rc = check_matrix(k, L->attn.wv, "attn_v", l, E, KD, err))) return rc;
        } else if (L->attn.wqkv) {
            if ((rc = check_matrix(k, L->attn.wqkv, "attn_qkv", l, E, HD + 2 * KD, err))) return rc;
            if ((rc = load_vec(k, &C->bq, L->attn.bqkv, "attn_qkv.bias", l, 0, HD, err))) return rc;
            if ((rc = load_vec(k, &C->bk, L->attn.bqkv, "attn_qkv.bias", l, HD, KD, err))) return rc;
            if ((rc = load_vec(k, &C->bv, L->attn.bqkv, "attn_qkv.bias", l, HD + KD, KD, err))) return rc;
        } else {
            if ((rc = check_matrix(k, L->attn.wq, "attn_q", l, E, HD, err))) return rc;
            if ((rc = check_matrix(k, L->attn.wk, "attn_k", l, E, KD, err))) return rc;
            if ((rc = check_matrix(k, L->attn.wv, "attn_v", l, E, KD, err))) return rc;
            if ((rc = load_vec(k, &C->bq, L->attn.bq, "attn_q.bias", l, 0, HD, err))) return rc;
            if ((rc = load_vec(k, &C->bk, L->attn.bk, "attn_k.bias", l, 0, KD, err))) return rc;
            if ((rc = load_vec(k, &C->bv, L->attn.bv, "attn_v.bias", l, 0, KD, err))) return rc;
        }
        if (L->kind != TD_LAYER_GDN && (rc = check_matrix(k, L->attn.wo, "attn_output", l, HD, E, err))) return rc;
        if ((rc = load_vec(k, &C->bo, L->attn.bo, "attn_output.bias", l, 0, E, err))) return rc;
        if (L->ffn.gate_inp) {
            if (X < 1) return td_err_set(err, TD_EINPUT, NAME ": layer %d has a router but expert_count is 0", l);
            if ((rc = check_moe(k, L, l, E, X, F, 0, err))) return rc;
        } else {
            if ((rc = check_matrix(k, L->ffn.gate, "ffn_gate", l, E, F, err))) return rc;
            if ((rc = check_matrix(k, L->ffn.up, "ffn_up", l, E, F, err))) return rc;
            if ((rc = check_matrix(k, L->ffn.down, "ffn_down", l, F, E, err))) return rc;
        }
    }
    return TD_OK;
}

/* The formats each input must be prepared in, from the types of the
 * weights it feeds (act_fmt). */
static void plan_formats(cpu_backend *b) {
    const td_model *m = b->m;
#define FMT(t) ((t) ? act_fmt(b, (t)->type) : 0u)
    b->fmts_xn = FMT(m->output);
    for (uint32_t i = 0; i < b->hp.n_layer; i++) {
        const td_layer *L = &m->layers[i];
        b->fmts_xn |= FMT(L->attn.wq) | FMT(L->attn.wk) | FMT(L->attn.wv) | FMT(L->attn.wqkv) | FMT(L->ffn.gate) | FMT(L->ffn.up) |
                      FMT(L->ffn.gate_inp);
        b->fmts_ctx |= FMT(L->attn.wo);
        b->fmts_act |= FMT(L->ffn.down) | FMT(L->ffn.down_exps);
        b->fmts_xs |= FMT(L->ffn.up_exps) | FMT(L->ffn.gate_exps);
        b->fmts_xn |= FMT(L->gdn.wqkv) | FMT(L->gdn.wgate) | FMT(L->gdn.wba) | FMT(L->ffn.gate_shexp) |
                      FMT(L->ffn.up_shexp);
        b->fmts_gated |= FMT(L->gdn.wout);
        b->fmts_shact |= FMT(L->ffn.down_shexp);
    }
#undef FMT
    q4_plan_formats(b);
}

#ifdef TD_HAVE_OPENBLAS
// sgemm runs inside our tasks: one OpenBLAS thread, so a tile's result never
// depends on how OpenBLAS would split it. The threaded build (Debian's
// default) started a server thread at load that polls for work with
// sched_yield for ~0.1 s of CPU, on the core a worker of ours would use, and
// no sgemm here ever hands it any. Its own shutdown, exported for its fork
// handler, ends it where the build has one (a later multi-threaded call
// would start it again).
static void openblas_one_thread(void) {
    openblas_set_num_threads(1);
    void *sym = dlsym(RTLD_DEFAULT, "blas_thread_shutdown_");
    if (sym) {
        int (*shutdown_fn)(void);
        memcpy(&shutdown_fn, &sym, sizeof sym);
        shutdown_fn();
    }
}

// Also at load (shared libraries' constructors, OpenBLAS's among them, run
// before this program's): every verb of a program with this backend linked
// in pays the polling otherwise, not only those that open the backend.
__attribute__((constructor)) static void openblas_quiet_at_load(void) { openblas_one_thread(); }
#endif

static int cpu_open(td_backend **out, const td_model *m, const td_backend_params *p, td_err *err);

const td_backend_vt td_cpu_backend = {
    .name = NAME,
    .precision = "f32",
    .open = cpu_open,
    .forward = cpu_forward,
    .reset = cpu_reset,
    .close = cpu_close,
    .version = cpu_version,
    .layer_kinds = TD_KINDS(TD_LAYER_ATTENTION) | TD_KINDS(TD_LAYER_GDN) | TD_KINDS(TD_LAYER_HC_GDN) |
                   TD_KINDS(TD_LAYER_HC_QSA),
    .faults = TD_FAULT_BIT(TD_FAULT_ROPE_PAIRING) | TD_FAULT_BIT(TD_FAULT_STALE_TOKEN) |
              TD_FAULT_BIT(TD_FAULT_RMSNORM_EPS) | TD_FAULT_BIT(TD_FAULT_ROUTER_TIEBREAK) |
              TD_FAULT_BIT(TD_FAULT_MOE_NO_RENORM) | TD_FAULT_BIT(TD_FAULT_KQUANT_SCALE_BIT) |
              TD_FAULT_BIT(TD_FAULT_KV_POS) | TD_FAULT_BIT(TD_FAULT_GQA_MAP_MOD) | TD_FAULT_BIT(TD_FAULT_ATTN_SCALE) |
              TD_FAULT_BIT(TD_FAULT_RESIDUAL_SKIP) | TD_FAULT_BIT(TD_FAULT_IQ_SIGN_BIT) |
              TD_FAULT_BIT(TD_FAULT_ROLLBACK_STALE_KV) | TD_FAULT_BIT(TD_FAULT_SEQ_COPY_SHORT) |
              TD_FAULT_BIT(TD_FAULT_THREAD_RACE) | TD_FAULT_BIT(TD_FAULT_SIMD_TAIL) |
              TD_FAULT_BIT(TD_FAULT_ODDBLOCK_Q8_0) |
              TD_FAULT_BIT(TD_FAULT_GDN_L2_EPS) | TD_FAULT_BIT(TD_FAULT_GDN_CHUNK) | TD_FAULT_BIT(TD_FAULT_CONV_SHIFT) |
              TD_FAULT_BIT(TD_FAULT_GDN_DECAY_AFTER) | TD_FAULT_BIT(TD_FAULT_SHEXP_NO_SIGMOID) |
              TD_FAULT_BIT(TD_FAULT_ROPE_PARTIAL_ALL) | TD_FAULT_BIT(TD_FAULT_GDN_ROLLBACK_STALE) |
              TD_FAULT_BIT(TD_FAULT_QSA_TOPK_SKIP) | TD_FAULT_BIT(TD_FAULT_PLE_HASH32) |
              TD_FAULT_BIT(TD_FAULT_HC_INJECT_STREAM) | TD_FAULT_BIT(TD_FAULT_QSA_COPY_NO_IKEY),
    .seq_rm = cpu_seq_rm,
    .seq_cp = cpu_seq_cp,
    .seq_use = cpu_seq_use,
};

static int cpu_open(td_backend **out, const td_model *m, const td_backend_params *p, td_err *err) {
    *out = NULL;
    td_fault fault;
    if (td_fault_parse(NAME, p ? p->inject : NULL, &fault, err)) return TD_EINPUT;
    const char *profile = p && p->profile && p->profile[0] ? p->profile : "native";
    if (strcmp(profile, "native") && strcmp(profile, "act-q8"))
        return td_err_set(err, TD_EINPUT,
                          NAME ": arithmetic profile '%s' is not supported (expected native: f32 activations, or "
                               "act-q8: matmul inputs rounded as llama.cpp's CPU path does)",
                          profile);
    if (p && p->threads < 0) return td_err_set(err, TD_EINPUT, NAME ": threads must be >= 0, got %d", p->threads);

    // TD_CPU_ISA caps the kernel level (the tests run every level this CPU has)
    int max_isa = TD_CPU_ISA_COUNT - 1;
    const char *isa_env = getenv("TD_CPU_ISA");
    if (isa_env && *isa_env && (max_isa = td_cpu_isa_parse(isa_env)) < 0)
        return td_err_set(err, TD_EINPUT, NAME ": TD_CPU_ISA='%.40s' is not a kernel level (c, avx2, avx512vnni)",
                          isa_env);
    cpu_backend *b = td_xcalloc(1, sizeof *b);
    b->base.vt = &td_cpu_backend;
    b->m = m;
    b->hp = m->hp;
    b->act_q8 = !strcmp(profile, "act-q8");
    b->logits_last = p && p->logits_last;
    td_cpu_kernels_init(&b->k, (td_cpu_isa)max_isa);
    b->fault = fault;
    td_cpu_fault_patch_kernels(&b->k, fault);
    int rc = load_model(b, err);
    if (rc) {
        cpu_close(&b->base);
        return rc;
    }
    plan_formats(b);
    const td_hparams *hp = &b->hp;

    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    b->n_threads = p && p->threads > 0 ? p->threads : ncpu > 0 ? (int)ncpu : 1;
    b->state_ops = p && p->n_seq > 1;
    b->pool = td_cpu_pool_new(b->n_threads);
    if (!b->pool) {
        cpu_close(&b->base);
        return td_err_set(err, TD_EINTERNAL, NAME ": could not start %d threads", b->n_threads);
    }
    b->gemm_min_t = TD_CPU_GEMM_MIN_T;
    const char *env = getenv("TD_CPU_GEMM_MIN_T");
    if (env && atoll(env) > 0) b->gemm_min_t = atoll(env);
#ifdef TD_HAVE_OPENBLAS
    openblas_one_thread();
#endif

    b->n_ctx = p && p->n_ctx ? p->n_ctx : hp->n_ctx_train;
    if (b->n_ctx < 1) b->n_ctx = 4096;
    const int64_t E = hp->n_embd, HD = (int64_t)hp->n_head * hp->head_dim, F = hp->n_ff;
    b->max_in = E > HD ? E : HD;
    if (F > b->max_in) b->max_in = F;
    if ((int64_t)hp->n_ff_shexp > b->max_in) b->max_in = hp->n_ff_shexp;
    if ((int64_t)hp->ssm_d_inner > b->max_in) b->max_in = hp->ssm_d_inner;
    q4_open(b);
    // tile_rows(n) * n <= TILE_BYTES/4 floats, except the row minimum for n > TILE_BYTES/(4*TILE_MIN_ROWS)
    b->tile_cap = TILE_BYTES / 4 > TILE_MIN_ROWS * b->max_in ? TILE_BYTES / 4 : TILE_MIN_ROWS * b->max_in;
    b->tile = td_xcalloc((size_t)b->n_threads, sizeof(float *));
    b->rowbuf = td_xcalloc((size_t)b->n_threads, sizeof(float *));
    b->att = td_xcalloc((size_t)b->n_threads, sizeof(float *));
    for (int t = 0; t < b->n_threads; t++) {
#ifdef TD_HAVE_OPENBLAS
        b->tile[t] = td_xmalloc((size_t)b->tile_cap * sizeof(float));
#endif
        b->rowbuf[t] = td_xmalloc((size_t)b->max_in * sizeof(float));
    }
    b->max_segs = 2 * (int)hp->n_expert + 4;
    if (b->max_segs < 8) b->max_segs = 8;
    b->segs = td_xcalloc((size_t)b->max_segs, sizeof *b->segs);
    b->s = &b->seqs[0];
    b->rs_conv = td_xcalloc(hp->n_layer ? hp->n_layer : 1, sizeof(int64_t));
    b->rs_ssm = td_xcalloc(hp->n_layer ? hp->n_layer : 1, sizeof(int64_t));
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        b->rs_conv[l] = b->rs_ssm[l] = -1;
        if (m->layers[l].kind != TD_LAYER_GDN && m->layers[l].kind != TD_LAYER_HC_GDN) continue;
        const int64_t C = 2 * (int64_t)hp->ssm_n_group * hp->ssm_d_state + hp->ssm_d_inner;
        b->rs_conv[l] = b->rs_n;
        b->rs_n += C * (hp->ssm_conv - 1) + 1; // +1: a kernel of one tap keeps no inputs
        b->rs_ssm[l] = b->rs_n;
        b->rs_n += (int64_t)hp->ssm_dt_rank * hp->ssm_d_state * hp->ssm_d_state;
    }

    snprintf(b->version, sizeof b->version,
             "tapdiff " TD_VERSION " (" TD_GIT_REV ") cpu: profile %s, f32 KV cache, kernels %s, %d threads, "
             "prefill %s",
             b->act_q8           ? "act-q8 (matmul inputs rounded as llama.cpp's CPU path: Q8_0, Q8_K, f16, bf16)"
             : b->k.prep_x32 && b->k.type[TD_TYPE_Q8_0].gemv_x32
                 ? "native (f32 activations; Q8_0 and Q4_K products on integers, exact per block)"
                 : "native (f32 activations)",
             td_cpu_isa_name(b->k.isa), b->n_threads,
#ifdef TD_HAVE_OPENBLAS
             b->gemm_min_t > 1 ? "openblas sgemm for T >= gemm_min_t" : "openblas sgemm"
#else
             "dot kernels (built without OpenBLAS)"
#endif
    );
#ifdef TD_HAVE_OPENBLAS
    {
        size_t len = strlen(b->version);
        snprintf(b->version + len, sizeof b->version - len, " (gemm_min_t = %lld)", (long long)b->gemm_min_t);
    }
#endif
    if (fault) { // a run with a deliberate bug must say so wherever its version is recorded
        size_t len = strlen(b->version);
        snprintf(b->version + len, sizeof b->version - len, " FAULT INJECTED: %s", td_fault_get(fault)->name);
    }
    *out = &b->base;
    return TD_OK;
}
