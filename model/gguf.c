/* tapdiff: the GGUF v2/v3 container reader (../shared/spec/gguf.md).
 *
 * The file is mapped read-only (or a caller buffer is borrowed) and walked
 * once by a bounds-checked cursor that validates everything llama.cpp's reader
 * refuses, plus its strict sequential offset rule, before a single view is
 * handed out. Whatever the bytes, the result is TD_OK or TD_EINPUT with one
 * line naming the file, the key or tensor, what was expected and what was
 * found: every length and count is compared with the bytes that remain before
 * it sizes an allocation or a loop, all size arithmetic is overflow-checked,
 * and multi-byte fields are read through memcpy (the mapping has no alignment
 * guarantee for anything but tensor data). */
#include "gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Fields are copied byte-for-byte, which yields the file's little-endian
 * values only on a little-endian host. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "tapdiff assumes a little-endian host");
_Static_assert(sizeof(size_t) == 8, "tapdiff assumes a 64-bit size_t");

#define MAX_STR_LEN (1ull << 30)  /* llama.cpp's limit on any string length */
#define MAX_ARR_N (1ull << 30)    /* ... and on any array count */
#define MAX_NAME_LEN 63           /* tensor names are < 64 bytes (GGML_MAX_NAME) */
#define DEFAULT_ALIGNMENT 32
/* The smallest possible records. A count is refused when even records this
 * small could not fit in what is left, so a corrupt count of 2^60 is reported
 * at once instead of sizing anything. */
#define MIN_KV_BYTES 14u  /* u64 key length, 1 key byte, u32 type, 1 value byte */
#define MIN_TI_BYTES 33u  /* u64 name length, 1 name byte, u32 n_dims, 1 i64 ne, u32 type, u64 offset */

/* What td_gguf_open hands out is the first member of this, so a td_gguf*
 * converts back on close. */
typedef struct gguf_impl {
    td_gguf pub;
    int mapped;          /* pub.map came from mmap and is unmapped on close */
    size_t *kv_slot;     /* open-addressing index over key names: 0 = empty, else kv index + 1 */
    size_t kv_cap;       /* power of two, 0 while empty */
    size_t *t_slot;      /* the same over tensor names */
    size_t t_cap;
} gguf_impl;

/* ------------------------------------------------------------------------ */
/* Value type names and sizes                                                 */

static const char *const k_vtype_names[TD_GGUF_VTYPE_COUNT] = {
    "UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "FLOAT32",
    "BOOL", "STRING", "ARRAY", "UINT64", "INT64", "FLOAT64",
};

const char *td_gguf_vtype_name(int vtype) {
    if (vtype < 0 || vtype >= TD_GGUF_VTYPE_COUNT) return "INVALID";
    return k_vtype_names[vtype];
}

/* Bytes of one stored value of a fixed-size type; 0 for STRING and ARRAY. */
static size_t vtype_size(int t) {
    switch (t) {
    case TD_GGUF_UINT8: case TD_GGUF_INT8: case TD_GGUF_BOOL: return 1;
    case TD_GGUF_UINT16: case TD_GGUF_INT16: return 2;
    case TD_GGUF_UINT32: case TD_GGUF_INT32: case TD_GGUF_FLOAT32: return 4;
    case TD_GGUF_UINT64: case TD_GGUF_INT64: case TD_GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

static int vtype_is_int(int t) {
    switch (t) {
    case TD_GGUF_UINT8: case TD_GGUF_INT8: case TD_GGUF_UINT16: case TD_GGUF_INT16:
    case TD_GGUF_UINT32: case TD_GGUF_INT32: case TD_GGUF_UINT64: case TD_GGUF_INT64: return 1;
    default: return 0;
    }
}

static int vtype_is_signed(int t) {
    return t == TD_GGUF_INT8 || t == TD_GGUF_INT16 || t == TD_GGUF_INT32 || t == TD_GGUF_INT64;
}

/* One stored scalar of type t at p, widened the way td_gguf_kv.v holds it. */
static void widen(int t, const uint8_t *p, td_gguf_kv *kv) {
    switch (t) {
    case TD_GGUF_UINT8: kv->v.u = p[0]; break;
    case TD_GGUF_INT8: { int8_t x; memcpy(&x, p, 1); kv->v.i = x; } break;
    case TD_GGUF_BOOL: kv->v.u = p[0] != 0; break;
    case TD_GGUF_UINT16: { uint16_t x; memcpy(&x, p, 2); kv->v.u = x; } break;
    case TD_GGUF_INT16: { int16_t x; memcpy(&x, p, 2); kv->v.i = x; } break;
    case TD_GGUF_UINT32: { uint32_t x; memcpy(&x, p, 4); kv->v.u = x; } break;
    case TD_GGUF_INT32: { int32_t x; memcpy(&x, p, 4); kv->v.i = x; } break;
    case TD_GGUF_FLOAT32: { float x; memcpy(&x, p, 4); kv->v.f = x; } break;
    case TD_GGUF_UINT64: memcpy(&kv->v.u, p, 8); break;
    case TD_GGUF_INT64: memcpy(&kv->v.i, p, 8); break;
    case TD_GGUF_FLOAT64: memcpy(&kv->v.f, p, 8); break;
    default: TD_ASSERT(!"widen: not a fixed-size type");
    }
}

/* ------------------------------------------------------------------------ */
/* Names in messages                                                          */

/* A key or tensor name made fit for a one-line message: control bytes,
 * quotes and backslashes escaped, long names cut with "...". */
typedef struct shown { char s[112]; } shown;

static shown show(const char *p, uint64_t n) {
    shown o;
    size_t k = 0;
    for (uint64_t i = 0; i < n; i++) {
        if (k + 8 > sizeof o.s) {
            memcpy(o.s + k, "...", 4);
            return o;
        }
        unsigned char c = (unsigned char)p[i];
        if (c < 0x20 || c == 0x7f || c == '\'' || c == '\\')
            k += (size_t)snprintf(o.s + k, sizeof o.s - k, "\\x%02x", c);
        else
            o.s[k++] = (char)c;
    }
    o.s[k] = '\0';
    return o;
}

static shown show_str(td_str s) { return show(s.ptr, s.len); }

/* ------------------------------------------------------------------------ */
/* The cursor                                                                 */

typedef struct parser {
    const char *label;
    const uint8_t *buf;  /* NULL when size == 0 */
    size_t size;
    size_t pos;          /* always <= size */
    uint64_t want;       /* bytes the last failed read needed */
    td_err *err;
} parser;

static size_t left(const parser *p) { return p->size - p->pos; }

/* True when n more bytes exist; otherwise remembers n for the message. */
static int have(parser *p, uint64_t n) {
    if (n > left(p)) {
        p->want = n;
        return 0;
    }
    return 1;
}

static int rd(parser *p, void *dst, size_t n) {
    if (!have(p, n)) return 0;
    memcpy(dst, p->buf + p->pos, n);
    p->pos += n;
    return 1;
}

static int rd_u32(parser *p, uint32_t *v) { return rd(p, v, 4); }
static int rd_u64(parser *p, uint64_t *v) { return rd(p, v, 8); }
static int rd_i64(parser *p, int64_t *v) { return rd(p, v, 8); }

enum { STR_OK, STR_TRUNC, STR_LONG };

/* A u64-length string as a view; *len gets the stored length even when it is
 * refused, for the message. */
static int rd_str(parser *p, td_str *out, uint64_t max_len, uint64_t *len) {
    *len = 0;
    if (!rd_u64(p, len)) return STR_TRUNC;
    if (*len > max_len) return STR_LONG;
    if (!have(p, *len)) return STR_TRUNC;
    out->ptr = (const char *)p->buf + p->pos;
    out->len = *len;
    p->pos += (size_t)*len;
    return STR_OK;
}

static int fail(parser *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(parser *p, const char *fmt, ...) {
    char what[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return td_err_set(p->err, TD_EINPUT, "%s: %s", p->label, what);
}

/* The message for a read that ran past the end; `fmt` says what was read. */
static int fail_trunc(parser *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail_trunc(parser *p, const char *fmt, ...) {
    char what[640];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return td_err_set(p->err, TD_EINPUT,
                      "%s: truncated file: %s: expected %llu bytes at offset %zu, found %zu (file size %zu)",
                      p->label, what, (unsigned long long)p->want, p->pos, left(p), p->size);
}

/* ------------------------------------------------------------------------ */
/* Name indexes (keys, tensors)                                               */

static uint64_t hash_name(const void *s, size_t n) {
    const unsigned char *c = s;
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ c[i]) * 1099511628211ull;
    return h;
}

static const td_str *entry_name(const td_gguf *g, int tensors, size_t i) {
    return tensors ? &g->tensors[i].name : &g->kv[i].key;
}

/* The slot holding `name`, or the empty slot where it would go. */
static size_t *slot_find(const gguf_impl *im, int tensors, const char *name, size_t n) {
    size_t *slot = tensors ? im->t_slot : im->kv_slot;
    size_t cap = tensors ? im->t_cap : im->kv_cap;
    if (!cap) return NULL;
    size_t mask = cap - 1;
    for (size_t i = (size_t)hash_name(name, n) & mask;; i = (i + 1) & mask) {
        if (!slot[i]) return &slot[i];
        const td_str *e = entry_name(&im->pub, tensors, slot[i] - 1);
        if (e->len == n && (n == 0 || memcmp(e->ptr, name, n) == 0)) return &slot[i];
    }
}

/* Index entry `idx` (whose name must be new), growing the table to stay at
 * most half full so probes stay short and always end. */
static void slot_add(gguf_impl *im, int tensors, size_t idx) {
    size_t **slot = tensors ? &im->t_slot : &im->kv_slot;
    size_t *cap = tensors ? &im->t_cap : &im->kv_cap;
    if (2 * (idx + 1) > *cap) {
        size_t old_cap = *cap, *old = *slot;
        *cap = old_cap ? 2 * old_cap : 16;
        *slot = td_xcalloc(*cap, sizeof **slot);
        for (size_t i = 0; i < old_cap; i++) {
            if (!old[i]) continue;
            const td_str *e = entry_name(&im->pub, tensors, old[i] - 1);
            *slot_find(im, tensors, e->ptr, e->len) = old[i];
        }
        free(old);
    }
    const td_str *e = entry_name(&im->pub, tensors, idx);
    size_t *s = slot_find(im, tensors, e->ptr, e->len);
    TD_ASSERT(*s == 0);
    *s = idx + 1;
}

/* ------------------------------------------------------------------------ */
/* Metadata                                                                   */

static int parse_value(parser *p, td_gguf_kv *kv) {
    shown key = show_str(kv->key);
    uint32_t t = kv->type;
    if (t == TD_GGUF_STRING) {
        uint64_t len;
        int r = rd_str(p, &kv->str, MAX_STR_LEN, &len);
        if (r == STR_LONG)
            return fail(p, "key '%s': string length: expected at most 2^30, found %llu", key.s,
                        (unsigned long long)len);
        if (r == STR_TRUNC) return fail_trunc(p, "key '%s': STRING value", key.s);
        return TD_OK;
    }
    if (t != TD_GGUF_ARRAY) {
        size_t n = vtype_size((int)t);
        if (!have(p, n)) return fail_trunc(p, "key '%s': %s value", key.s, td_gguf_vtype_name((int)t));
        widen((int)t, p->buf + p->pos, kv);
        p->pos += n;
        return TD_OK;
    }

    uint32_t et;
    uint64_t n;
    if (!rd_u32(p, &et)) return fail_trunc(p, "key '%s': array element type", key.s);
    if (et == TD_GGUF_ARRAY)
        return fail(p, "key '%s': nested array (array of ARRAY): expected an array of scalars or strings", key.s);
    if (et >= TD_GGUF_VTYPE_COUNT)
        return fail(p, "key '%s': unknown value type %u for array elements (expected 0..12)", key.s, et);
    if (!rd_u64(p, &n)) return fail_trunc(p, "key '%s': array count", key.s);
    if (n > MAX_ARR_N)
        return fail(p, "key '%s': array count: expected at most 2^30, found %llu", key.s, (unsigned long long)n);
    kv->arr_type = (td_gguf_vtype)et;
    kv->arr_n = n;
    if (et != TD_GGUF_STRING) {
        uint64_t bytes = n * vtype_size((int)et); /* n <= 2^30, size <= 8: no overflow */
        if (!have(p, bytes))
            return fail_trunc(p, "key '%s': array of %llu %s", key.s, (unsigned long long)n, td_gguf_vtype_name((int)et));
        kv->arr_data = p->buf + p->pos;
        p->pos += (size_t)bytes;
        return TD_OK;
    }

    /* Strings: every element needs at least its u64 length, which bounds n
     * by the bytes left. Validate them all first, then size the view table by
     * what the file really holds. */
    if (!have(p, n * 8))
        return fail_trunc(p, "key '%s': array of %llu STRING", key.s, (unsigned long long)n);
    size_t start = p->pos;
    kv->arr_data = p->buf + start;
    for (uint64_t i = 0; i < n; i++) {
        td_str s;
        uint64_t len;
        int r = rd_str(p, &s, MAX_STR_LEN, &len);
        if (r == STR_LONG)
            return fail(p, "key '%s': array element #%llu: string length: expected at most 2^30, found %llu", key.s,
                        (unsigned long long)i, (unsigned long long)len);
        if (r == STR_TRUNC)
            return fail_trunc(p, "key '%s': array element #%llu of %llu (STRING)", key.s, (unsigned long long)i,
                              (unsigned long long)n);
    }
    td_str *views = td_xcalloc(n ? (size_t)n : 1, sizeof *views);
    size_t end = p->pos;
    p->pos = start;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t len;
        int r = rd_str(p, &views[i], MAX_STR_LEN, &len);
        TD_ASSERT(r == STR_OK); /* the first pass checked every element */
    }
    TD_ASSERT(p->pos == end);
    kv->arr_str = views;
    return TD_OK;
}

static int check_alignment(parser *p, const td_gguf_kv *kv, uint32_t *alignment) {
    if (kv->type != TD_GGUF_UINT32)
        return fail(p, "key 'general.alignment': expected UINT32, found %s", td_gguf_vtype_name((int)kv->type));
    uint64_t a = kv->v.u;
    if (a == 0 || (a & (a - 1)) != 0)
        return fail(p, "key 'general.alignment': expected a non-zero power of two, found %llu", (unsigned long long)a);
    *alignment = (uint32_t)a;
    return TD_OK;
}

static int parse_kvs(parser *p, gguf_impl *im, uint64_t n_kv) {
    td_gguf *g = &im->pub;
    if (n_kv > left(p) / MIN_KV_BYTES)
        return fail(p, "truncated file or corrupt header: n_kv: expected at most %zu records in the %zu bytes left, found %llu",
                    left(p) / MIN_KV_BYTES, left(p), (unsigned long long)n_kv);
    size_t cap = 0;
    for (uint64_t i = 0; i < n_kv; i++) {
        if (g->n_kv == cap) {
            cap = cap ? 2 * cap : 16;
            g->kv = td_xrealloc(g->kv, cap * sizeof *g->kv);
        }
        td_gguf_kv *kv = &g->kv[g->n_kv];
        memset(kv, 0, sizeof *kv);
        uint64_t len;
        int r = rd_str(p, &kv->key, MAX_STR_LEN, &len);
        if (r == STR_LONG)
            return fail(p, "key #%llu: key length: expected at most 2^30, found %llu", (unsigned long long)i,
                        (unsigned long long)len);
        if (r == STR_TRUNC) return fail_trunc(p, "key #%llu: key string", (unsigned long long)i);
        if (kv->key.len == 0) return fail(p, "key #%llu: empty key: expected a non-empty name", (unsigned long long)i);
        shown key = show_str(kv->key);
        size_t *dup = slot_find(im, 0, kv->key.ptr, kv->key.len);
        if (dup && *dup)
            return fail(p, "key '%s': duplicate key (records #%zu and #%llu)", key.s, *dup - 1, (unsigned long long)i);
        uint32_t t;
        if (!rd_u32(p, &t)) return fail_trunc(p, "key '%s': value type", key.s);
        if (t >= TD_GGUF_VTYPE_COUNT) return fail(p, "key '%s': unknown value type %u (expected 0..12)", key.s, t);
        kv->type = (td_gguf_vtype)t;
        g->n_kv++; /* counted before the value so close() frees a half-built string table */
        int st = parse_value(p, kv);
        if (st != TD_OK) return st;
        slot_add(im, 0, g->n_kv - 1);
        if (kv->key.len == 17 && memcmp(kv->key.ptr, "general.alignment", 17) == 0) {
            st = check_alignment(p, kv, &g->alignment);
            if (st != TD_OK) return st;
        }
    }
    return TD_OK;
}

/* ------------------------------------------------------------------------ */
/* Tensor infos                                                               */

static void fmt_ne(char *buf, size_t n, const td_tensor *t) {
    size_t k = (size_t)snprintf(buf, n, "{");
    for (uint32_t d = 0; d < t->n_dims && k < n; d++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", d ? ", " : "", (long long)t->ne[d]);
    if (k < n) snprintf(buf + k, n - k, "}");
}

static int parse_tensor(parser *p, gguf_impl *im, uint64_t i, uint64_t *running) {
    td_gguf *g = &im->pub;
    td_tensor *t = &g->tensors[i];
    memset(t, 0, sizeof *t);
    uint64_t len;
    int r = rd_str(p, &t->name, MAX_NAME_LEN, &len);
    if (r == STR_LONG)
        return fail(p, "tensor #%llu: name length: expected < 64 bytes, found %llu", (unsigned long long)i,
                    (unsigned long long)len);
    if (r == STR_TRUNC) return fail_trunc(p, "tensor #%llu: name", (unsigned long long)i);
    if (t->name.len == 0) return fail(p, "tensor #%llu: empty tensor name: expected a non-empty name", (unsigned long long)i);
    /* names are C strings to every consumer (ggml too): a NUL inside would
     * make two distinct names look alike and hide the tensor from lookups */
    if (memchr(t->name.ptr, '\0', (size_t)t->name.len))
        return fail(p, "tensor #%llu: name '%s': expected no NUL bytes, found one", (unsigned long long)i,
                    show_str(t->name).s);
    memcpy(t->cname, t->name.ptr, t->name.len);
    t->cname[t->name.len] = '\0';
    shown nm = show_str(t->name);
    size_t *dup = slot_find(im, 1, t->name.ptr, t->name.len);
    if (dup && *dup)
        return fail(p, "tensor '%s': duplicate tensor name (tensor infos #%zu and #%llu)", nm.s, *dup - 1,
                    (unsigned long long)i);

    if (!rd_u32(p, &t->n_dims)) return fail_trunc(p, "tensor '%s': n_dims", nm.s);
    if (t->n_dims == 0 || t->n_dims > TD_MAX_DIMS)
        return fail(p, "tensor '%s': n_dims: expected 1..4, found %u", nm.s, t->n_dims);
    for (int d = 0; d < TD_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        if (!rd_i64(p, &t->ne[d])) return fail_trunc(p, "tensor '%s': ne[%u]", nm.s, d);
        if (t->ne[d] < 0)
            return fail(p, "tensor '%s': ne[%u]: expected >= 0, found %lld", nm.s, d, (long long)t->ne[d]);
    }
    uint32_t type;
    if (!rd_u32(p, &type)) return fail_trunc(p, "tensor '%s': type", nm.s);
    const td_type_info *ti = type < TD_TYPE_COUNT ? td_type_get((int)type) : NULL;
    if (!ti)
        return fail(p, "tensor '%s': unknown or removed type id %u (expected a valid ggml type < %d)", nm.s, type,
                    (int)TD_TYPE_COUNT);
    t->type = (int)type;
    if (!rd_u64(p, &t->offset)) return fail_trunc(p, "tensor '%s': offset", nm.s);

    char ne_s[128];
    fmt_ne(ne_s, sizeof ne_s, t);
    if (ti->block_size <= 0 || ti->block_bytes <= 0) return fail(p, "tensor '%s': type %s has no block geometry", nm.s, ti->name);
    if (t->ne[0] % ti->block_size != 0)
        return fail(p, "tensor '%s': ne[0] = %lld is not a multiple of the block size %lld of %s", nm.s,
                    (long long)t->ne[0], (long long)ti->block_size, ti->name);

    /* rows and row_bytes must be representable even for an empty tensor (they
     * are fields of td_tensor); the element count and byte size are the true
     * products, so a zero dimension makes them 0 whatever the others are. */
    uint64_t rows, row_bytes, elems = 0, nbytes = 0;
    uint64_t blocks = (uint64_t)(t->ne[0] / ti->block_size);
    if (__builtin_mul_overflow((uint64_t)t->ne[1], (uint64_t)t->ne[2], &rows) ||
        __builtin_mul_overflow(rows, (uint64_t)t->ne[3], &rows) ||
        (t->ne[0] != 0 && (__builtin_mul_overflow(rows, (uint64_t)t->ne[0], &elems) || elems > (uint64_t)INT64_MAX)))
        return fail(p, "tensor '%s': element count of ne = %s overflows 64 bits", nm.s, ne_s);
    if (__builtin_mul_overflow(blocks, (uint64_t)ti->block_bytes, &row_bytes) ||
        __builtin_mul_overflow(row_bytes, rows, &nbytes) || nbytes > (uint64_t)INT64_MAX)
        return fail(p, "tensor '%s': byte size of %s ne = %s overflows 64 bits", nm.s, ti->name, ne_s);
    t->n_elements = elems;
    t->n_rows = rows;
    t->row_bytes = (size_t)row_bytes;
    t->nbytes = (size_t)nbytes;

    /* llama.cpp's strict rule: each tensor starts where the previous one's
     * padded bytes end; this also rules out overlap and misalignment. */
    if (t->offset != *running)
        return fail(p, "tensor '%s': expected offset %llu, found %llu (tensors must follow each other in info order, each padded to %u bytes)",
                    nm.s, (unsigned long long)*running, (unsigned long long)t->offset, g->alignment);
    uint64_t padded;
    if (__builtin_add_overflow(nbytes, (uint64_t)g->alignment - 1, &padded) ||
        __builtin_add_overflow(*running, padded - padded % g->alignment, running))
        return fail(p, "tensor '%s': data offsets overflow 64 bits", nm.s);
    slot_add(im, 1, (size_t)i);
    return TD_OK;
}

static int parse_tensors(parser *p, gguf_impl *im, uint64_t n_tensors) {
    td_gguf *g = &im->pub;
    if (n_tensors > left(p) / MIN_TI_BYTES)
        return fail(p, "truncated file or corrupt header: n_tensors: expected at most %zu tensor infos in the %zu bytes left, found %llu",
                    left(p) / MIN_TI_BYTES, left(p), (unsigned long long)n_tensors);
    g->tensors = td_xcalloc(n_tensors ? (size_t)n_tensors : 1, sizeof *g->tensors);
    uint64_t running = 0;
    for (uint64_t i = 0; i < n_tensors; i++) {
        int st = parse_tensor(p, im, i, &running);
        if (st != TD_OK) return st;
        g->n_tensors = i + 1;
    }

    uint64_t a = g->alignment;
    uint64_t ds = (uint64_t)p->pos + a - 1; /* pos <= size < 2^63: no overflow */
    ds -= ds % a;
    if (n_tensors == 0) {
        /* no data follows, so the padding is not required to exist */
        g->data_start = ds <= p->size ? (size_t)ds : p->size;
        return TD_OK;
    }
    g->data_start = (size_t)ds;
    for (uint64_t i = 0; i < n_tensors; i++) {
        td_tensor *t = &g->tensors[i];
        uint64_t begin, end;
        if (__builtin_add_overflow(ds, t->offset, &begin) || __builtin_add_overflow(begin, (uint64_t)t->nbytes, &end) ||
            end > p->size) {
            shown nm = show_str(t->name);
            return td_err_set(p->err, TD_EINPUT,
                              "%s: tensor '%s': truncated tensor data: expected %zu bytes at file offset %llu "
                              "(data_start %zu + offset %llu), found a file of %zu bytes",
                              p->label, nm.s, t->nbytes, (unsigned long long)ds + t->offset, g->data_start,
                              (unsigned long long)t->offset, p->size);
        }
        t->data = p->buf + begin;
    }
    return TD_OK;
}

/* ------------------------------------------------------------------------ */
/* Open / close                                                               */

static void gguf_free(gguf_impl *im) {
    if (!im) return;
    td_gguf *g = &im->pub;
    for (uint64_t i = 0; i < g->n_kv; i++) free((void *)g->kv[i].arr_str);
    free(g->kv);
    free(g->tensors);
    free(im->kv_slot);
    free(im->t_slot);
    if (im->mapped && g->map) munmap((void *)g->map, g->size);
    free(g->path);
    free(im);
}

void td_gguf_close(td_gguf *g) { gguf_free((gguf_impl *)g); }

static int parse(gguf_impl *im, td_err *err) {
    td_gguf *g = &im->pub;
    parser p = {.label = g->path, .buf = g->map, .size = g->size, .err = err};
    g->alignment = DEFAULT_ALIGNMENT;

    uint8_t magic[4];
    if (!rd(&p, magic, 4)) return fail_trunc(&p, "header: magic");
    if (memcmp(magic, "GGUF", 4) != 0)
        return fail(&p, "bad magic: expected \"GGUF\" (47 47 55 46), found %02x %02x %02x %02x", magic[0], magic[1],
                    magic[2], magic[3]);
    if (!rd_u32(&p, &g->version)) return fail_trunc(&p, "header: version");
    uint32_t v = g->version;
    if (v == 0) return fail(&p, "invalid GGUF version 0: expected 2 or 3");
    if ((v & 0xffffu) == 0)
        return fail(&p, "GGUF version 0x%08x looks byte-swapped: big-endian files are not supported (expected 2 or 3)", v);
    if (v == 1) return fail(&p, "GGUFv1 is no longer supported: expected version 2 or 3, found 1");
    if (v > 3) return fail(&p, "unsupported GGUF version %u: expected 2 or 3", v);

    int64_t n_tensors, n_kv;
    if (!rd_i64(&p, &n_tensors)) return fail_trunc(&p, "header: n_tensors");
    if (!rd_i64(&p, &n_kv)) return fail_trunc(&p, "header: n_kv");
    if (n_tensors < 0) return fail(&p, "header: n_tensors: expected >= 0, found %lld", (long long)n_tensors);
    if (n_kv < 0) return fail(&p, "header: n_kv: expected >= 0, found %lld", (long long)n_kv);

    int st = parse_kvs(&p, im, (uint64_t)n_kv);
    if (st != TD_OK) return st;
    return parse_tensors(&p, im, (uint64_t)n_tensors);
}

static int open_common(td_gguf **out, const uint8_t *map, size_t size, int mapped, const char *label, td_err *err) {
    gguf_impl *im = td_xcalloc(1, sizeof *im);
    im->mapped = mapped;
    im->pub.map = map;
    im->pub.size = size;
    im->pub.path = td_xstrdup(label);
    int st = parse(im, err);
    if (st != TD_OK) {
        gguf_free(im);
        return st;
    }
    *out = &im->pub;
    return TD_OK;
}

int td_gguf_open_mem(td_gguf **out, const void *buf, size_t size, const char *label, td_err *err) {
    TD_ASSERT(out && (buf || size == 0));
    *out = NULL;
    return open_common(out, buf, size, 0, label ? label : "<memory>", err);
}

int td_gguf_open(td_gguf **out, const char *path, td_err *err) {
    TD_ASSERT(out && path);
    *out = NULL;
    // O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused
    // below like any other non-regular file.
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return td_err_set(err, TD_EINPUT, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return td_err_set(err, TD_EINPUT, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return td_err_set(err, TD_EINPUT, "%s: expected a regular file, found another kind of file", path);
    }
    size_t size = (size_t)st.st_size;
    const uint8_t *map = NULL;
    if (size > 0) {
        void *m = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            int e = errno;
            close(fd);
            return td_err_set(err, TD_EINTERNAL, "%s: cannot map %zu bytes: %s", path, size, strerror(e));
        }
        map = m;
    }
    close(fd); /* the mapping keeps the file */
    return open_common(out, map, size, map != NULL, path, err);
}

/* ------------------------------------------------------------------------ */
/* Lookup                                                                     */

const td_gguf_kv *td_gguf_find(const td_gguf *g, const char *key) {
    TD_ASSERT(g && key);
    const size_t *s = slot_find((const gguf_impl *)g, 0, key, strlen(key));
    return s && *s ? &g->kv[*s - 1] : NULL;
}

const td_tensor *td_gguf_tensor(const td_gguf *g, const char *name) {
    TD_ASSERT(g && name);
    const size_t *s = slot_find((const gguf_impl *)g, 1, name, strlen(name));
    return s && *s ? &g->tensors[*s - 1] : NULL;
}

/* ------------------------------------------------------------------------ */
/* Typed getters                                                              */

/* "UINT32", or "ARRAY of UINT32" */
static const char *found_type(const td_gguf_kv *kv, char *buf, size_t n) {
    if (kv->type != TD_GGUF_ARRAY) return td_gguf_vtype_name((int)kv->type);
    snprintf(buf, n, "ARRAY of %s", td_gguf_vtype_name((int)kv->arr_type));
    return buf;
}

/* Looks the key up; absent: TD_OK with *kv NULL, or the "missing" error. */
static int lookup(const td_gguf *g, const char *key, int required, const char *expect, const td_gguf_kv **kv,
                  td_err *err) {
    *kv = td_gguf_find(g, key);
    if (!*kv && required)
        return td_err_set(err, TD_EINPUT, "%s: required key '%s' is missing (expected %s)", g->path, key, expect);
    return TD_OK;
}

static int wrong_type(const td_gguf *g, const char *key, const char *expect, const td_gguf_kv *kv, td_err *err) {
    char b[48];
    return td_err_set(err, TD_EINPUT, "%s: key '%s': expected %s, found %s", g->path, key, expect,
                      found_type(kv, b, sizeof b));
}

/* An integer value (type t, widened like td_gguf_kv.v) as an unsigned value
 * no larger than max; 0 when it is negative or larger. */
static int int_fits(int t, uint64_t u, int64_t i, uint64_t max, uint64_t *out) {
    if (vtype_is_signed(t)) {
        if (i < 0 || (uint64_t)i > max) return 0;
        *out = (uint64_t)i;
        return 1;
    }
    if (u > max) return 0;
    *out = u;
    return 1;
}

static int fmt_int(char *buf, size_t n, int t, uint64_t u, int64_t i) {
    if (vtype_is_signed(t)) return snprintf(buf, n, "%lld", (long long)i);
    return snprintf(buf, n, "%llu", (unsigned long long)u);
}

static int get_uint(const td_gguf *g, const char *key, int required, uint64_t def, uint64_t max, const char *tname,
                    uint64_t *out, td_err *err) {
    const td_gguf_kv *kv;
    int st = lookup(g, key, required, tname, &kv, err);
    if (st != TD_OK) return st;
    if (!kv) {
        *out = def;
        return TD_OK;
    }
    if (!vtype_is_int((int)kv->type)) return wrong_type(g, key, tname, kv, err);
    if (!int_fits((int)kv->type, kv->v.u, kv->v.i, max, out)) {
        char v[32];
        fmt_int(v, sizeof v, (int)kv->type, kv->v.u, kv->v.i);
        return td_err_set(err, TD_EINPUT, "%s: key '%s': expected a %s value, found %s (%s)", g->path, key, tname, v,
                          td_gguf_vtype_name((int)kv->type));
    }
    return TD_OK;
}

int td_gguf_get_u32(const td_gguf *g, const char *key, int required, uint32_t def, uint32_t *out, td_err *err) {
    TD_ASSERT(g && key && out);
    uint64_t v;
    int st = get_uint(g, key, required, def, UINT32_MAX, "UINT32", &v, err);
    if (st == TD_OK) *out = (uint32_t)v;
    return st;
}

int td_gguf_get_u64(const td_gguf *g, const char *key, int required, uint64_t def, uint64_t *out, td_err *err) {
    TD_ASSERT(g && key && out);
    return get_uint(g, key, required, def, UINT64_MAX, "UINT64", out, err);
}

int td_gguf_get_f32(const td_gguf *g, const char *key, int required, float def, float *out, td_err *err) {
    TD_ASSERT(g && key && out);
    const td_gguf_kv *kv;
    int st = lookup(g, key, required, "FLOAT32", &kv, err);
    if (st != TD_OK) return st;
    if (!kv) {
        *out = def;
        return TD_OK;
    }
    if (kv->type != TD_GGUF_FLOAT32 && kv->type != TD_GGUF_FLOAT64) return wrong_type(g, key, "FLOAT32", kv, err);
    *out = (float)kv->v.f;
    return TD_OK;
}

int td_gguf_get_bool(const td_gguf *g, const char *key, int required, int def, int *out, td_err *err) {
    TD_ASSERT(g && key && out);
    const td_gguf_kv *kv;
    int st = lookup(g, key, required, "BOOL", &kv, err);
    if (st != TD_OK) return st;
    if (!kv) {
        *out = def;
        return TD_OK;
    }
    if (kv->type != TD_GGUF_BOOL) return wrong_type(g, key, "BOOL", kv, err);
    *out = kv->v.u != 0;
    return TD_OK;
}

int td_gguf_get_str(const td_gguf *g, const char *key, int required, const char *def, char *buf, size_t bufsz,
                    td_err *err) {
    TD_ASSERT(g && key && buf && bufsz > 0);
    const td_gguf_kv *kv;
    int st = lookup(g, key, required, "STRING", &kv, err);
    if (st != TD_OK) return st;
    if (!kv) {
        const char *d = def ? def : "";
        TD_ASSERT(strlen(d) < bufsz); /* a default that does not fit is a caller bug */
        memcpy(buf, d, strlen(d) + 1);
        return TD_OK;
    }
    if (kv->type != TD_GGUF_STRING) return wrong_type(g, key, "STRING", kv, err);
    if (kv->str.len >= bufsz)
        return td_err_set(err, TD_EINPUT, "%s: key '%s': expected a string of at most %zu bytes, found %llu bytes",
                          g->path, key, bufsz - 1, (unsigned long long)kv->str.len);
    /* a NUL inside would silently shorten the value as a C string */
    if (kv->str.len && memchr(kv->str.ptr, '\0', (size_t)kv->str.len))
        return td_err_set(err, TD_EINPUT, "%s: key '%s': expected a string without NUL bytes, found one", g->path, key);
    memcpy(buf, kv->str.ptr, (size_t)kv->str.len);
    buf[kv->str.len] = '\0';
    return TD_OK;
}

/* Element i of an integer or BOOL array, widened like td_gguf_kv.v. */
static void arr_elem(const td_gguf_kv *kv, uint64_t i, td_gguf_kv *e) {
    size_t sz = vtype_size((int)kv->arr_type);
    TD_ASSERT(kv->type == TD_GGUF_ARRAY && sz > 0 && i < kv->arr_n);
    widen((int)kv->arr_type, kv->arr_data + i * sz, e);
}

int td_gguf_get_u32_or_arr(const td_gguf *g, const char *key, int required, uint32_t def, uint64_t n, uint32_t *out,
                           td_err *err) {
    TD_ASSERT(g && key && out);
    const td_gguf_kv *kv = td_gguf_find(g, key);
    if (!kv || kv->type != TD_GGUF_ARRAY) return td_gguf_get_u32(g, key, required, def, out, err);
    int et = (int)kv->arr_type;
    if (!vtype_is_int(et) && et != TD_GGUF_BOOL) return wrong_type(g, key, "UINT32 or an integer array", kv, err);
    if (kv->arr_n != n || n == 0)
        return td_err_set(err, TD_EINPUT, "%s: key '%s': expected an array of %llu entries (one per layer), found %llu",
                          g->path, key, (unsigned long long)n, (unsigned long long)kv->arr_n);
    uint64_t first = 0;
    for (uint64_t i = 0; i < n; i++) {
        td_gguf_kv e;
        arr_elem(kv, i, &e);
        uint64_t v;
        if (!int_fits(et, e.v.u, e.v.i, UINT32_MAX, &v)) {
            char s[32];
            fmt_int(s, sizeof s, et, e.v.u, e.v.i);
            return td_err_set(err, TD_EINPUT, "%s: key '%s': entry %llu: expected a UINT32 value, found %s (%s)",
                              g->path, key, (unsigned long long)i, s, td_gguf_vtype_name(et));
        }
        if (i == 0) first = v;
        else if (v != first)
            return td_err_set(err, TD_EINPUT,
                              "%s: key '%s': expected the same value in every entry, found %llu in entry 0 and %llu "
                              "in entry %llu (per-layer values are not supported)",
                              g->path, key, (unsigned long long)first, (unsigned long long)v, (unsigned long long)i);
    }
    *out = (uint32_t)first;
    return TD_OK;
}

double td_gguf_arr_f64(const td_gguf_kv *kv, uint64_t i) {
    td_gguf_kv e;
    arr_elem(kv, i, &e);
    int t = (int)kv->arr_type;
    if (t == TD_GGUF_FLOAT32 || t == TD_GGUF_FLOAT64) return e.v.f;
    if (vtype_is_signed(t)) return (double)e.v.i;
    return (double)e.v.u;
}

int64_t td_gguf_arr_i64(const td_gguf_kv *kv, uint64_t i) {
    td_gguf_kv e;
    arr_elem(kv, i, &e);
    int t = (int)kv->arr_type;
    if (t == TD_GGUF_FLOAT32 || t == TD_GGUF_FLOAT64) {
        /* out-of-range float -> int conversion is undefined: saturate */
        double f = e.v.f;
        if (isnan(f)) return 0;
        if (f >= 9223372036854775808.0) return INT64_MAX;
        if (f < -9223372036854775808.0) return INT64_MIN;
        return (int64_t)f;
    }
    if (vtype_is_signed(t)) return e.v.i;
    return (int64_t)e.v.u; /* UINT64 above INT64_MAX wraps: the bit pattern, as 64-bit constant tables expect */
}

/* ------------------------------------------------------------------------ */
/* Rows                                                                       */

int td_tensor_decode_row_f64(const td_tensor *t, uint64_t r, double *dst, td_err *err) {
    return td_tensor_decode_row_as_f64(t, r, dst, TD_ROW_EXACT, err);
}

int td_tensor_decode_row_f32(const td_tensor *t, uint64_t r, float *dst, td_err *err) {
    return td_tensor_decode_row_as_f32(t, r, dst, TD_ROW_EXACT, err);
}

int td_tensor_decode_row_as_f64(const td_tensor *t, uint64_t r, double *dst, td_row_mode mode, td_err *err) {
    TD_ASSERT(t && dst && r < t->n_rows);
    td_err e; /* not zeroed: 1 KiB per row is a cost the hot loops of the reference feel */
    e.msg[0] = '\0';
    int st = td_decode_row_as_f64(t->type, td_tensor_row(t, r), dst, t->ne[0], mode, &e);
    if (st != TD_OK) return td_err_set(err, st, "tensor '%s': %s", t->cname, e.msg);
    return TD_OK;
}

int td_tensor_decode_row_as_f32(const td_tensor *t, uint64_t r, float *dst, td_row_mode mode, td_err *err) {
    TD_ASSERT(t && dst && r < t->n_rows);
    td_err e; /* not zeroed: 1 KiB per row is a cost the hot loops of the reference feel */
    e.msg[0] = '\0';
    int st = td_decode_row_as_f32(t->type, td_tensor_row(t, r), dst, t->ne[0], mode, &e);
    if (st != TD_OK) return td_err_set(err, st, "tensor '%s': %s", t->cname, e.msg);
    return TD_OK;
}
