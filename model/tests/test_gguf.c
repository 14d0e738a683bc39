/* tapdiff: tests of the GGUF container reader (model/gguf.c).
 *
 * Every file here is assembled byte by byte by the tiny builder below, from
 * the layout in ../shared/spec/gguf.md, so the expectations (offsets, sizes,
 * values) come from the spec and hand arithmetic, not from the reader.
 *   - a valid v3 (and v2) file with every value type, checked field by field;
 *   - a table of malformed files, each with the error text it must produce,
 *     in-process and through `tapdiff inspect` (exit status 3);
 *   - every truncated prefix of the valid file, every header byte flipped, and
 *     a seeded random mutation run: nothing may crash (ASan/UBSan build). */
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gguf.h"

extern char **environ;

/* ------------------------------------------------------------------------ */
/* Byte builder                                                               */

typedef struct bb {
    uint8_t *p;
    size_t n, cap;
} bb;

static void put(bb *b, const void *d, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        cr_assert(b->p);
    }
    if (n) memcpy(b->p + b->n, d, n);
    b->n += n;
}
static void w_u8(bb *b, uint8_t v) { put(b, &v, 1); }
static void w_u16(bb *b, uint16_t v) { put(b, &v, 2); }
static void w_u32(bb *b, uint32_t v) { put(b, &v, 4); }
static void w_u64(bb *b, uint64_t v) { put(b, &v, 8); }
static void w_i64(bb *b, int64_t v) { put(b, &v, 8); }
static void w_f32(bb *b, float v) { put(b, &v, 4); }
static void w_f64(bb *b, double v) { put(b, &v, 8); }
static void w_str(bb *b, const char *s) {
    w_u64(b, strlen(s));
    put(b, s, strlen(s));
}
static void zeros(bb *b, size_t n) {
    for (size_t i = 0; i < n; i++) w_u8(b, 0);
}
static void pad_to(bb *b, size_t a) {
    while (b->n % a) w_u8(b, 0);
}
static void hdr(bb *b, uint32_t version, int64_t n_tensors, int64_t n_kv) {
    put(b, "GGUF", 4);
    w_u32(b, version);
    w_i64(b, n_tensors);
    w_i64(b, n_kv);
}
/* key string + value type tag; the caller writes the value */
static void key(bb *b, const char *k, uint32_t type) {
    w_str(b, k);
    w_u32(b, type);
}
static void arr(bb *b, const char *k, uint32_t elem, uint64_t n) {
    key(b, k, TD_GGUF_ARRAY);
    w_u32(b, elem);
    w_u64(b, n);
}
static void tinfo(bb *b, const char *name, uint32_t n_dims, const int64_t *ne, uint32_t type, uint64_t off) {
    w_str(b, name);
    w_u32(b, n_dims);
    for (uint32_t d = 0; d < n_dims; d++) w_i64(b, ne[d]);
    w_u32(b, type);
    w_u64(b, off);
}

/* ------------------------------------------------------------------------ */
/* The valid file                                                             */

/* F16 bit patterns worked by hand: sign | exponent (bias 15) | 10-bit mantissa */
static const uint16_t k_f16_bits[8] = {0x3C00, 0xC000, 0x3800, 0x0000, 0x7BFF, 0x0001, 0x4200, 0xBC00};
static const double k_f16_vals[8] = {1.0, -2.0, 0.5, 0.0, 65504.0, 0x1p-24, 3.0, -1.0};

typedef struct valid_file {
    bb b;
    size_t data_start; /* as the builder laid it out */
} valid_file;

#define N_VALID_KV 27

/* Tensors: w.f32 F32 {8,3} = 96 bytes (padded to 128), w.f16 F16 {16} = 32
 * bytes (padded to 64), w.q8 Q8_0 {64,2} = 2 rows x 2 blocks x 34 = 136 bytes.
 * Offsets: 0, 128, 128 + 64 = 192. The last tensor is not padded unless
 * trailing_pad, so that every proper prefix of the file is short of data. */
static valid_file build_valid(uint32_t version, int trailing_pad) {
    valid_file v = {0};
    bb *b = &v.b;
    hdr(b, version, 3, N_VALID_KV);
    key(b, "general.architecture", TD_GGUF_STRING); w_str(b, "llama");
    key(b, "general.alignment", TD_GGUF_UINT32); w_u32(b, 64);
    key(b, "t.u8", TD_GGUF_UINT8); w_u8(b, 200);
    key(b, "t.i8", TD_GGUF_INT8); w_u8(b, (uint8_t)(int8_t)-100);
    key(b, "t.u16", TD_GGUF_UINT16); w_u16(b, 60000);
    key(b, "t.i16", TD_GGUF_INT16); w_u16(b, (uint16_t)(int16_t)-30000);
    key(b, "t.u32", TD_GGUF_UINT32); w_u32(b, 4000000000u);
    key(b, "t.i32", TD_GGUF_INT32); w_u32(b, (uint32_t)(int32_t)-2000000000);
    key(b, "t.f32", TD_GGUF_FLOAT32); w_f32(b, 1.5f);
    key(b, "t.bool", TD_GGUF_BOOL); w_u8(b, 1);
    key(b, "t.bool7", TD_GGUF_BOOL); w_u8(b, 7);
    key(b, "t.bool0", TD_GGUF_BOOL); w_u8(b, 0);
    key(b, "t.str", TD_GGUF_STRING); w_str(b, "h\xc3\xa9llo");
    key(b, "t.empty", TD_GGUF_STRING); w_str(b, "");
    key(b, "t.u64", TD_GGUF_UINT64); w_u64(b, (1ull << 40) + 3);
    key(b, "t.i64", TD_GGUF_INT64); w_i64(b, -5);
    key(b, "t.f64", TD_GGUF_FLOAT64); w_f64(b, -2.25);
    key(b, "t.small", TD_GGUF_UINT16); w_u16(b, 12);
    arr(b, "t.arr_i32", TD_GGUF_INT32, 3); w_u32(b, 1); w_u32(b, (uint32_t)-2); w_u32(b, 3);
    arr(b, "t.arr_f32", TD_GGUF_FLOAT32, 2); w_f32(b, 0.5f); w_f32(b, -1.25f);
    arr(b, "t.arr_bool", TD_GGUF_BOOL, 3); w_u8(b, 1); w_u8(b, 0); w_u8(b, 1);
    arr(b, "t.arr_str", TD_GGUF_STRING, 3); w_str(b, "a"); w_str(b, ""); w_str(b, "xyz");
    arr(b, "t.layers", TD_GGUF_UINT32, 4); for (int i = 0; i < 4; i++) w_u32(b, 7);
    arr(b, "t.layers_diff", TD_GGUF_INT32, 4); w_u32(b, 7); w_u32(b, 8); w_u32(b, 7); w_u32(b, 7);
    arr(b, "t.layers_neg", TD_GGUF_INT32, 4); for (int i = 0; i < 4; i++) w_u32(b, (uint32_t)-1);
    arr(b, "t.arr_u64", TD_GGUF_UINT64, 2); w_u64(b, (1ull << 63) + 1); w_u64(b, 9);
    arr(b, "t.arr_empty", TD_GGUF_UINT8, 0);

    tinfo(b, "w.f32", 2, (int64_t[]){8, 3}, TD_TYPE_F32, 0);
    tinfo(b, "w.f16", 1, (int64_t[]){16}, TD_TYPE_F16, 128);
    tinfo(b, "w.q8", 2, (int64_t[]){64, 2}, TD_TYPE_Q8_0, 192);
    pad_to(b, 64);
    v.data_start = b->n;

    for (int i = 0; i < 24; i++) w_f32(b, 0.5f * (float)i - 3.0f);
    zeros(b, 128 - 96);
    for (int i = 0; i < 16; i++) w_u16(b, k_f16_bits[i % 8]);
    zeros(b, 64 - 32);
    for (int blk = 0; blk < 4; blk++) {
        w_u16(b, blk % 2 ? 0x4000 : 0x3800); /* d = 2.0 or 0.5 */
        for (int j = 0; j < 32; j++) w_u8(b, (uint8_t)(int8_t)(j - 16 + blk));
    }
    if (trailing_pad) pad_to(b, 64);
    return v;
}

/* The Q8_0 value at row r, column c of w.q8, from the spec: y = d * qs */
static double q8_expect(int r, int c) {
    int blk = r * 2 + c / 32;
    double d = blk % 2 ? 2.0 : 0.5;
    return d * (double)((c % 32) - 16 + blk);
}

static td_gguf *open_ok(const bb *b) {
    td_gguf *g = NULL;
    td_err err = {{0}};
    int st = td_gguf_open_mem(&g, b->p, b->n, "valid.gguf", &err);
    cr_assert_eq(st, TD_OK, "open failed: %s", err.msg);
    cr_assert_not_null(g);
    return g;
}

static const td_gguf_kv *kv_of(const td_gguf *g, const char *k, td_gguf_vtype type) {
    const td_gguf_kv *kv = td_gguf_find(g, k);
    cr_assert_not_null(kv, "key %s not found", k);
    cr_assert_eq(kv->key.len, strlen(k));
    cr_assert(memcmp(kv->key.ptr, k, kv->key.len) == 0);
    cr_assert_eq(kv->type, type, "key %s: type %d, expected %d", k, kv->type, type);
    return kv;
}

static void check_tensor(const td_gguf *g, const valid_file *v, const char *name, int type, uint32_t n_dims,
                         const int64_t ne[4], uint64_t offset, size_t row_bytes, uint64_t n_rows) {
    const td_tensor *t = td_gguf_tensor(g, name);
    cr_assert_not_null(t, "tensor %s not found", name);
    cr_assert_str_eq(t->cname, name);
    cr_assert_eq(t->name.len, strlen(name));
    cr_assert_eq(t->type, type);
    cr_assert_eq(t->n_dims, n_dims);
    for (int d = 0; d < 4; d++) cr_assert_eq(t->ne[d], ne[d], "%s ne[%d] = %lld", name, d, (long long)t->ne[d]);
    cr_assert_eq(t->offset, offset);
    cr_assert_eq(t->n_elements, (uint64_t)(ne[0] * ne[1] * ne[2] * ne[3]));
    cr_assert_eq(t->n_rows, n_rows);
    cr_assert_eq(t->row_bytes, row_bytes);
    cr_assert_eq(t->nbytes, row_bytes * n_rows);
    cr_assert_eq(t->data, v->b.p + v->data_start + offset, "%s data pointer", name);
    cr_assert_eq((uintptr_t)(t->data - v->b.p) % 64, 0, "%s not 64-aligned in the file", name);
}

static void check_valid(uint32_t version, int trailing_pad) {
    valid_file v = build_valid(version, trailing_pad);
    td_gguf *g = open_ok(&v.b);
    cr_assert_eq(g->version, version);
    cr_assert_eq(g->alignment, 64);
    cr_assert_eq(g->n_kv, N_VALID_KV);
    cr_assert_eq(g->n_tensors, 3);
    cr_assert_eq(g->data_start, v.data_start);
    cr_assert_eq(g->data_start % 64, 0);
    cr_assert_eq(g->map, v.b.p);
    cr_assert_eq(g->size, v.b.n);
    cr_assert_str_eq(g->path, "valid.gguf");

    /* records in file order */
    cr_assert_eq(g->kv[0].key.len, 20);
    cr_assert(memcmp(g->kv[0].key.ptr, "general.architecture", 20) == 0);
    cr_assert_eq(g->kv[N_VALID_KV - 1].key.len, strlen("t.arr_empty"));

    const td_gguf_kv *kv = kv_of(g, "general.architecture", TD_GGUF_STRING);
    cr_assert_eq(kv->str.len, 5);
    cr_assert(memcmp(kv->str.ptr, "llama", 5) == 0);
    cr_assert_eq(kv_of(g, "general.alignment", TD_GGUF_UINT32)->v.u, 64);
    cr_assert_eq(kv_of(g, "t.u8", TD_GGUF_UINT8)->v.u, 200);
    cr_assert_eq(kv_of(g, "t.i8", TD_GGUF_INT8)->v.i, -100);
    cr_assert_eq(kv_of(g, "t.u16", TD_GGUF_UINT16)->v.u, 60000);
    cr_assert_eq(kv_of(g, "t.i16", TD_GGUF_INT16)->v.i, -30000);
    cr_assert_eq(kv_of(g, "t.u32", TD_GGUF_UINT32)->v.u, 4000000000u);
    cr_assert_eq(kv_of(g, "t.i32", TD_GGUF_INT32)->v.i, -2000000000);
    cr_assert_eq(kv_of(g, "t.f32", TD_GGUF_FLOAT32)->v.f, 1.5);
    cr_assert_eq(kv_of(g, "t.bool", TD_GGUF_BOOL)->v.u, 1);
    cr_assert_eq(kv_of(g, "t.bool7", TD_GGUF_BOOL)->v.u, 1, "non-zero bool is true");
    cr_assert_eq(kv_of(g, "t.bool0", TD_GGUF_BOOL)->v.u, 0);
    kv = kv_of(g, "t.str", TD_GGUF_STRING);
    cr_assert_eq(kv->str.len, 6);
    cr_assert(memcmp(kv->str.ptr, "h\xc3\xa9llo", 6) == 0);
    cr_assert(kv->str.ptr > (const char *)v.b.p && kv->str.ptr < (const char *)v.b.p + v.b.n, "a view, not a copy");
    cr_assert_eq(kv_of(g, "t.empty", TD_GGUF_STRING)->str.len, 0);
    cr_assert_eq(kv_of(g, "t.u64", TD_GGUF_UINT64)->v.u, (1ull << 40) + 3);
    cr_assert_eq(kv_of(g, "t.i64", TD_GGUF_INT64)->v.i, -5);
    cr_assert_eq(kv_of(g, "t.f64", TD_GGUF_FLOAT64)->v.f, -2.25);

    kv = kv_of(g, "t.arr_i32", TD_GGUF_ARRAY);
    cr_assert_eq(kv->arr_type, TD_GGUF_INT32);
    cr_assert_eq(kv->arr_n, 3);
    int32_t i3[3];
    memcpy(i3, kv->arr_data, sizeof i3);
    cr_assert(i3[0] == 1 && i3[1] == -2 && i3[2] == 3);
    cr_assert_eq(td_gguf_arr_i64(kv, 1), -2);
    cr_assert_eq(td_gguf_arr_f64(kv, 2), 3.0);
    cr_assert_null(kv->arr_str);

    kv = kv_of(g, "t.arr_f32", TD_GGUF_ARRAY);
    cr_assert_eq(kv->arr_type, TD_GGUF_FLOAT32);
    cr_assert_eq(kv->arr_n, 2);
    cr_assert_eq(td_gguf_arr_f64(kv, 0), 0.5);
    cr_assert_eq(td_gguf_arr_f64(kv, 1), -1.25);
    cr_assert_eq(td_gguf_arr_i64(kv, 1), -1, "float -> int64 truncates toward zero");

    kv = kv_of(g, "t.arr_bool", TD_GGUF_ARRAY);
    cr_assert_eq(kv->arr_type, TD_GGUF_BOOL);
    cr_assert_eq(kv->arr_n, 3);
    cr_assert(kv->arr_data[0] == 1 && kv->arr_data[1] == 0 && kv->arr_data[2] == 1);
    cr_assert_eq(td_gguf_arr_i64(kv, 0), 1);
    cr_assert_eq(td_gguf_arr_i64(kv, 1), 0);

    kv = kv_of(g, "t.arr_str", TD_GGUF_ARRAY);
    cr_assert_eq(kv->arr_type, TD_GGUF_STRING);
    cr_assert_eq(kv->arr_n, 3);
    cr_assert_not_null(kv->arr_str);
    cr_assert_eq(kv->arr_str[0].len, 1);
    cr_assert_eq(kv->arr_str[0].ptr[0], 'a');
    cr_assert_eq(kv->arr_str[1].len, 0);
    cr_assert_eq(kv->arr_str[2].len, 3);
    cr_assert(memcmp(kv->arr_str[2].ptr, "xyz", 3) == 0);
    uint64_t first_len;
    memcpy(&first_len, kv->arr_data, 8);
    cr_assert_eq(first_len, 1, "arr_data points at the first element's length");

    kv = kv_of(g, "t.arr_u64", TD_GGUF_ARRAY);
    cr_assert_eq(td_gguf_arr_i64(kv, 0), INT64_MIN + 1, "UINT64 keeps its bit pattern");
    cr_assert_eq(td_gguf_arr_i64(kv, 1), 9);
    cr_assert_eq(td_gguf_arr_f64(kv, 0), 9223372036854775808.0);
    kv = kv_of(g, "t.arr_empty", TD_GGUF_ARRAY);
    cr_assert_eq(kv->arr_type, TD_GGUF_UINT8);
    cr_assert_eq(kv->arr_n, 0);

    cr_assert_null(td_gguf_find(g, "t.missing"));
    cr_assert_null(td_gguf_find(g, "t.u"), "prefix of a key is not the key");
    cr_assert_null(td_gguf_tensor(g, "w.f3"));

    check_tensor(g, &v, "w.f32", TD_TYPE_F32, 2, (int64_t[]){8, 3, 1, 1}, 0, 8 * 4, 3);
    check_tensor(g, &v, "w.f16", TD_TYPE_F16, 1, (int64_t[]){16, 1, 1, 1}, 128, 16 * 2, 1);
    check_tensor(g, &v, "w.q8", TD_TYPE_Q8_0, 2, (int64_t[]){64, 2, 1, 1}, 192, 64 / 32 * 34, 2);
    cr_assert_eq(&g->tensors[0], td_gguf_tensor(g, "w.f32"), "tensors in info order");
    cr_assert_eq(&g->tensors[2], td_gguf_tensor(g, "w.q8"));

    td_err err = {{0}};
    double d[64];
    float f[64];
    const td_tensor *t = td_gguf_tensor(g, "w.f32");
    cr_assert_eq(td_tensor_decode_row_f64(t, 1, d, &err), TD_OK, "%s", err.msg);
    for (int i = 0; i < 8; i++) cr_assert_eq(d[i], 0.5 * (8 + i) - 3.0, "w.f32 row 1 [%d] = %g", i, d[i]);
    t = td_gguf_tensor(g, "w.f16");
    cr_assert_eq(td_tensor_decode_row_f64(t, 0, d, &err), TD_OK, "%s", err.msg);
    for (int i = 0; i < 16; i++) cr_assert_eq(d[i], k_f16_vals[i % 8], "w.f16 [%d] = %g", i, d[i]);
    t = td_gguf_tensor(g, "w.q8");
    for (int r = 0; r < 2; r++) {
        cr_assert_eq(td_tensor_decode_row_f64(t, (uint64_t)r, d, &err), TD_OK, "%s", err.msg);
        cr_assert_eq(td_tensor_decode_row_f32(t, (uint64_t)r, f, &err), TD_OK, "%s", err.msg);
        for (int c = 0; c < 64; c++) {
            cr_assert_eq(d[c], q8_expect(r, c), "w.q8 [%d][%d] = %g", r, c, d[c]);
            cr_assert_eq(f[c], (float)q8_expect(r, c));
        }
    }
    td_gguf_close(g);
    free(v.b.p);
}

Test(gguf, valid_v3) { check_valid(3, 0); }
Test(gguf, valid_v2) { check_valid(2, 0); }
Test(gguf, valid_with_trailing_padding) { check_valid(3, 1); }

/* ------------------------------------------------------------------------ */
/* Getters                                                                    */

static void expect_err(int st, const td_err *err, const char *substr) {
    cr_assert_eq(st, TD_EINPUT, "expected TD_EINPUT, got %d (%s)", st, err->msg);
    cr_assert(strstr(err->msg, substr), "message \"%s\" lacks \"%s\"", err->msg, substr);
}

Test(gguf, getters) {
    valid_file v = build_valid(3, 0);
    td_gguf *g = open_ok(&v.b);
    td_err err = {{0}};
    uint32_t u32 = 0;
    uint64_t u64 = 0;
    float f = 0;
    int bl = -1;
    char s[16];

    cr_assert_eq(td_gguf_get_u32(g, "t.u32", 1, 0, &u32, &err), TD_OK);
    cr_assert_eq(u32, 4000000000u);
    cr_assert_eq(td_gguf_get_u32(g, "t.u8", 1, 0, &u32, &err), TD_OK);
    cr_assert_eq(u32, 200);
    cr_assert_eq(td_gguf_get_u32(g, "t.small", 1, 0, &u32, &err), TD_OK);
    cr_assert_eq(u32, 12);
    cr_assert_eq(td_gguf_get_u32(g, "t.absent", 0, 42, &u32, &err), TD_OK);
    cr_assert_eq(u32, 42, "absent key gives the default");
    expect_err(td_gguf_get_u32(g, "t.absent", 1, 42, &u32, &err), &err, "valid.gguf: required key 't.absent' is missing");
    expect_err(td_gguf_get_u32(g, "t.str", 0, 0, &u32, &err), &err, "valid.gguf: key 't.str': expected UINT32, found STRING");
    expect_err(td_gguf_get_u32(g, "t.f32", 0, 0, &u32, &err), &err, "key 't.f32': expected UINT32, found FLOAT32");
    expect_err(td_gguf_get_u32(g, "t.bool", 0, 0, &u32, &err), &err, "expected UINT32, found BOOL");
    expect_err(td_gguf_get_u32(g, "t.arr_i32", 0, 0, &u32, &err), &err, "expected UINT32, found ARRAY of INT32");
    expect_err(td_gguf_get_u32(g, "t.i32", 0, 0, &u32, &err), &err, "key 't.i32': expected a UINT32 value, found -2000000000 (INT32)");
    expect_err(td_gguf_get_u32(g, "t.i8", 0, 0, &u32, &err), &err, "found -100 (INT8)");
    expect_err(td_gguf_get_u32(g, "t.u64", 0, 0, &u32, &err), &err, "found 1099511627779 (UINT64)");

    cr_assert_eq(td_gguf_get_u64(g, "t.u64", 1, 0, &u64, &err), TD_OK);
    cr_assert_eq(u64, (1ull << 40) + 3);
    cr_assert_eq(td_gguf_get_u64(g, "t.u16", 1, 0, &u64, &err), TD_OK);
    cr_assert_eq(u64, 60000);
    cr_assert_eq(td_gguf_get_u64(g, "t.absent", 0, 1ull << 50, &u64, &err), TD_OK);
    cr_assert_eq(u64, 1ull << 50);
    expect_err(td_gguf_get_u64(g, "t.i64", 0, 0, &u64, &err), &err, "key 't.i64': expected a UINT64 value, found -5 (INT64)");
    expect_err(td_gguf_get_u64(g, "t.f64", 0, 0, &u64, &err), &err, "expected UINT64, found FLOAT64");

    cr_assert_eq(td_gguf_get_f32(g, "t.f32", 1, 0, &f, &err), TD_OK);
    cr_assert_eq(f, 1.5f);
    cr_assert_eq(td_gguf_get_f32(g, "t.f64", 1, 0, &f, &err), TD_OK);
    cr_assert_eq(f, -2.25f);
    cr_assert_eq(td_gguf_get_f32(g, "t.absent", 0, 1e-6f, &f, &err), TD_OK);
    cr_assert_eq(f, 1e-6f);
    expect_err(td_gguf_get_f32(g, "t.u32", 0, 0, &f, &err), &err, "key 't.u32': expected FLOAT32, found UINT32");
    expect_err(td_gguf_get_f32(g, "t.absent", 1, 0, &f, &err), &err, "required key 't.absent' is missing (expected FLOAT32)");

    cr_assert_eq(td_gguf_get_bool(g, "t.bool", 1, 0, &bl, &err), TD_OK);
    cr_assert_eq(bl, 1);
    cr_assert_eq(td_gguf_get_bool(g, "t.bool7", 1, 0, &bl, &err), TD_OK);
    cr_assert_eq(bl, 1);
    cr_assert_eq(td_gguf_get_bool(g, "t.bool0", 1, 1, &bl, &err), TD_OK);
    cr_assert_eq(bl, 0);
    cr_assert_eq(td_gguf_get_bool(g, "t.absent", 0, 1, &bl, &err), TD_OK);
    cr_assert_eq(bl, 1);
    expect_err(td_gguf_get_bool(g, "t.u8", 0, 0, &bl, &err), &err, "key 't.u8': expected BOOL, found UINT8");

    cr_assert_eq(td_gguf_get_str(g, "general.architecture", 1, NULL, s, sizeof s, &err), TD_OK);
    cr_assert_str_eq(s, "llama");
    cr_assert_eq(td_gguf_get_str(g, "t.empty", 1, "x", s, sizeof s, &err), TD_OK);
    cr_assert_str_eq(s, "");
    cr_assert_eq(td_gguf_get_str(g, "t.absent", 0, "dflt", s, sizeof s, &err), TD_OK);
    cr_assert_str_eq(s, "dflt");
    cr_assert_eq(td_gguf_get_str(g, "general.architecture", 1, NULL, s, 6, &err), TD_OK, "5 bytes + NUL fit in 6");
    expect_err(td_gguf_get_str(g, "general.architecture", 1, NULL, s, 5, &err), &err,
               "expected a string of at most 4 bytes, found 5 bytes");
    expect_err(td_gguf_get_str(g, "t.u32", 1, NULL, s, sizeof s, &err), &err, "key 't.u32': expected STRING, found UINT32");
    expect_err(td_gguf_get_str(g, "t.absent", 1, NULL, s, sizeof s, &err), &err, "required key 't.absent' is missing (expected STRING)");

    /* key or array */
    cr_assert_eq(td_gguf_get_u32_or_arr(g, "t.small", 1, 0, 4, &u32, &err), TD_OK, "%s", err.msg);
    cr_assert_eq(u32, 12);
    u32 = 0;
    cr_assert_eq(td_gguf_get_u32_or_arr(g, "t.layers", 1, 0, 4, &u32, &err), TD_OK, "%s", err.msg);
    cr_assert_eq(u32, 7);
    cr_assert_eq(td_gguf_get_u32_or_arr(g, "t.absent", 0, 5, 4, &u32, &err), TD_OK);
    cr_assert_eq(u32, 5);
    expect_err(td_gguf_get_u32_or_arr(g, "t.absent", 1, 5, 4, &u32, &err), &err, "required key 't.absent' is missing");
    expect_err(td_gguf_get_u32_or_arr(g, "t.layers", 1, 0, 3, &u32, &err), &err,
               "key 't.layers': expected an array of 3 entries (one per layer), found 4");
    expect_err(td_gguf_get_u32_or_arr(g, "t.layers_diff", 1, 0, 4, &u32, &err), &err,
               "found 7 in entry 0 and 8 in entry 1");
    expect_err(td_gguf_get_u32_or_arr(g, "t.layers_neg", 1, 0, 4, &u32, &err), &err,
               "key 't.layers_neg': entry 0: expected a UINT32 value, found -1 (INT32)");
    expect_err(td_gguf_get_u32_or_arr(g, "t.arr_f32", 1, 0, 2, &u32, &err), &err, "found ARRAY of FLOAT32");
    expect_err(td_gguf_get_u32_or_arr(g, "t.arr_str", 1, 0, 3, &u32, &err), &err, "found ARRAY of STRING");
    expect_err(td_gguf_get_u32_or_arr(g, "t.arr_bool", 1, 0, 3, &u32, &err), &err, "found 1 in entry 0 and 0 in entry 1");
    expect_err(td_gguf_get_u32_or_arr(g, "t.arr_u64", 1, 0, 2, &u32, &err), &err, "found 9223372036854775809 (UINT64)");
    expect_err(td_gguf_get_u32_or_arr(g, "t.arr_empty", 1, 0, 0, &u32, &err), &err, "expected an array of 0 entries");
    expect_err(td_gguf_get_u32_or_arr(g, "t.str", 1, 0, 4, &u32, &err), &err, "expected UINT32, found STRING");

    cr_assert_str_eq(td_gguf_vtype_name(TD_GGUF_STRING), "STRING");
    cr_assert_str_eq(td_gguf_vtype_name(TD_GGUF_FLOAT64), "FLOAT64");
    cr_assert_str_eq(td_gguf_vtype_name(13), "INVALID");
    cr_assert_str_eq(td_gguf_vtype_name(-1), "INVALID");
    td_gguf_close(g);
    free(v.b.p);
}

Test(gguf, string_with_nul_is_refused_by_get_str) {
    bb b = {0};
    hdr(&b, 3, 0, 1);
    key(&b, "k", TD_GGUF_STRING);
    w_u64(&b, 3);
    put(&b, "a\0b", 3);
    td_gguf *g = open_ok(&b);
    td_err err = {{0}};
    char s[8];
    expect_err(td_gguf_get_str(g, "k", 1, NULL, s, sizeof s, &err), &err, "key 'k': expected a string without NUL bytes");
    td_gguf_close(g);
    free(b.p);
}

/* No tensors: no padding needed after the metadata; a key-less file is fine too. */
Test(gguf, no_tensors) {
    bb b = {0};
    hdr(&b, 3, 0, 1);
    key(&b, "general.alignment", TD_GGUF_UINT32);
    w_u32(&b, 256);
    td_gguf *g = open_ok(&b);
    cr_assert_eq(g->alignment, 256);
    cr_assert_eq(g->n_tensors, 0);
    cr_assert_leq(g->data_start, b.n);
    td_gguf_close(g);
    b.n = 0;
    hdr(&b, 2, 0, 0);
    g = open_ok(&b);
    cr_assert_eq(g->alignment, 32, "default alignment");
    cr_assert_eq(g->n_kv, 0);
    td_gguf_close(g);
    free(b.p);
}

/* Default alignment 32, empty tensors, 4-D shapes, a Q4_K row. Q4_K {512,1,2,3}:
 * row = 2 blocks x 144 = 288 bytes, 6 rows = 1728 bytes (= 54 x 32); then an
 * empty F32 {0, 5} (0 bytes) at 1728, and I32 {4} at 1728. */
Test(gguf, default_alignment_shapes_and_empty_tensor) {
    bb b = {0};
    hdr(&b, 3, 3, 0);
    tinfo(&b, "q4k", 4, (int64_t[]){512, 1, 2, 3}, TD_TYPE_Q4_K, 0);
    tinfo(&b, "empty", 2, (int64_t[]){0, 5}, TD_TYPE_F32, 1728);
    tinfo(&b, "ints", 1, (int64_t[]){4}, TD_TYPE_I32, 1728);
    pad_to(&b, 32);
    size_t ds = b.n;
    zeros(&b, 1728);
    for (int i = 0; i < 4; i++) w_u32(&b, (uint32_t)i);
    td_gguf *g = open_ok(&b);
    cr_assert_eq(g->alignment, 32);
    cr_assert_eq(g->data_start, ds);
    const td_tensor *t = td_gguf_tensor(g, "q4k");
    cr_assert_eq(t->n_dims, 4);
    cr_assert_eq(t->ne[3], 3);
    cr_assert_eq(t->row_bytes, 288);
    cr_assert_eq(t->n_rows, 6);
    cr_assert_eq(t->n_elements, 512 * 6);
    cr_assert_eq(t->nbytes, 1728);
    t = td_gguf_tensor(g, "empty");
    cr_assert_eq(t->n_elements, 0);
    cr_assert_eq(t->nbytes, 0);
    cr_assert_eq(t->n_rows, 5);
    t = td_gguf_tensor(g, "ints");
    cr_assert_eq(t->data, b.p + ds + 1728);
    /* I32 has no row decoder: the error names the tensor */
    td_err err = {{0}};
    double d[4];
    expect_err(td_tensor_decode_row_f64(t, 0, d, &err), &err, "tensor 'ints': ");
    td_gguf_close(g);
    free(b.p);
}

/* ------------------------------------------------------------------------ */
/* Opening from a path                                                        */

static char *write_temp(const char *dir, const char *name, const bb *b) {
    char *path = NULL;
    cr_assert(asprintf(&path, "%s/%s", dir, name) > 0);
    FILE *fp = fopen(path, "wb");
    cr_assert_not_null(fp, "cannot write %s: %s", path, strerror(errno));
    if (b->n) cr_assert_eq(fwrite(b->p, 1, b->n, fp), b->n);
    cr_assert_eq(fclose(fp), 0);
    return path;
}

static char *make_temp_dir(void) {
    char tmpl[] = "/tmp/td_gguf_XXXXXX";
    cr_assert_not_null(mkdtemp(tmpl));
    return strdup(tmpl);
}

static void remove_dir(char *dir, char **files, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unlink(files[i]);
        free(files[i]);
    }
    rmdir(dir);
    free(dir);
}

Test(gguf, open_path) {
    char *dir = make_temp_dir();
    valid_file v = build_valid(3, 1);
    char *files[3];
    files[0] = write_temp(dir, "ok.gguf", &v.b);
    td_gguf *g = NULL;
    td_err err = {{0}};
    cr_assert_eq(td_gguf_open(&g, files[0], &err), TD_OK, "%s", err.msg);
    cr_assert_str_eq(g->path, files[0]);
    cr_assert_eq(g->size, v.b.n);
    cr_assert_neq(g->map, v.b.p);
    const td_tensor *t = td_gguf_tensor(g, "w.q8");
    cr_assert_eq(t->data, g->map + v.data_start + 192);
    cr_assert(memcmp(t->data, v.b.p + v.data_start + 192, 136) == 0);
    td_gguf_close(g);

    bb empty = {0};
    files[1] = write_temp(dir, "empty.gguf", &empty);
    g = (td_gguf *)1;
    expect_err(td_gguf_open(&g, files[1], &err), &err, "truncated file: header: magic");
    cr_assert_null(g);
    cr_assert(strstr(err.msg, files[1]), "message names the file: %s", err.msg);

    cr_assert(asprintf(&files[2], "%s/missing.gguf", dir) > 0);
    expect_err(td_gguf_open(&g, files[2], &err), &err, "cannot open");
    expect_err(td_gguf_open(&g, dir, &err), &err, "expected a regular file");
    free(v.b.p);
    remove_dir(dir, files, 3);
}

/* ------------------------------------------------------------------------ */
/* The malformed-file corpus                                                  */

/* A file with one key k of the given type; the caller writes the value. */
static void one_kv(bb *b, const char *k, uint32_t type) {
    hdr(b, 3, 0, 1);
    key(b, k, type);
}

/* One tensor "w" and its data (alignment 32). */
static void one_tensor(bb *b, uint32_t n_dims, const int64_t *ne, uint32_t type, uint64_t off, size_t data) {
    hdr(b, 3, 1, 0);
    tinfo(b, "w", n_dims, ne, type, off);
    pad_to(b, 32);
    zeros(b, data);
}

/* Two F32 {3} tensors "a", "b" (12 bytes each, padded to 32); b at `off_b`. */
static void two_tensors(bb *b, uint64_t off_b, size_t data) {
    hdr(b, 3, 2, 0);
    tinfo(b, "a", 1, (int64_t[]){3}, TD_TYPE_F32, 0);
    tinfo(b, "b", 1, (int64_t[]){3}, TD_TYPE_F32, off_b);
    pad_to(b, 32);
    zeros(b, data);
}

static void c_bad_magic(bb *b, long a) { (void)a; hdr(b, 3, 0, 0); memcpy(b->p, "GGML", 4); }
static void c_version(bb *b, long a) { hdr(b, (uint32_t)a, 0, 0); }
static void c_big_endian(bb *b, long a) {
    (void)a;
    put(b, "GGUF", 4);
    put(b, "\0\0\0\3", 4);                      /* version 3 stored big-endian */
    put(b, "\0\0\0\0\0\0\0\0", 8);
    put(b, "\0\0\0\0\0\0\0\0", 8);
}
static void c_neg_tensors(bb *b, long a) { (void)a; hdr(b, 3, -1, 0); }
static void c_neg_kv(bb *b, long a) { (void)a; hdr(b, 3, 0, -7); }
static void c_trunc_magic(bb *b, long a) { (void)a; put(b, "GG", 2); }
static void c_trunc_header(bb *b, long a) { (void)a; hdr(b, 3, 0, 0); b->n = 12; }
static void c_huge_kv(bb *b, long a) { (void)a; hdr(b, 3, 0, 1ll << 60); zeros(b, 64); }
static void c_huge_tensors(bb *b, long a) { (void)a; hdr(b, 3, 1ll << 60, 0); zeros(b, 64); }
static void c_trunc_key(bb *b, long a) { (void)a; hdr(b, 3, 0, 1); w_u64(b, 20); put(b, "abcde", 5); zeros(b, 1); }
static void c_key_too_long(bb *b, long a) { (void)a; hdr(b, 3, 0, 1); w_u64(b, (1ull << 30) + 1); zeros(b, 32); }
static void c_empty_key(bb *b, long a) {
    (void)a;
    hdr(b, 3, 0, 2);
    key(b, "ok", TD_GGUF_UINT8); w_u8(b, 1);
    key(b, "", TD_GGUF_UINT8); w_u8(b, 1);
}
static void c_dup_key(bb *b, long a) {
    (void)a;
    hdr(b, 3, 0, 3);
    key(b, "a.b", TD_GGUF_UINT8); w_u8(b, 1);
    key(b, "a.c", TD_GGUF_UINT8); w_u8(b, 1);
    key(b, "a.b", TD_GGUF_STRING); w_str(b, "x");
}
static void c_vtype(bb *b, long a) { one_kv(b, "k", (uint32_t)a); zeros(b, 16); }
static void c_trunc_vtype(bb *b, long a) { (void)a; hdr(b, 3, 0, 1); w_str(b, "kkkkkk"); w_u16(b, 4); }
static void c_trunc_u64(bb *b, long a) { (void)a; one_kv(b, "k", TD_GGUF_UINT64); zeros(b, 3); }
static void c_str_len(bb *b, long a) { one_kv(b, "k", TD_GGUF_STRING); w_u64(b, (uint64_t)a); zeros(b, 10); }
static void c_nested(bb *b, long a) {
    (void)a;
    one_kv(b, "k", TD_GGUF_ARRAY);
    w_u32(b, TD_GGUF_ARRAY); /* an array of one array of one UINT8 */
    w_u64(b, 1);
    w_u32(b, TD_GGUF_UINT8);
    w_u64(b, 1);
    w_u8(b, 0);
}
static void c_arr_elem_type(bb *b, long a) { (void)a; one_kv(b, "k", TD_GGUF_ARRAY); w_u32(b, 13); w_u64(b, 1); zeros(b, 8); }
static void c_arr_count(bb *b, long a) { one_kv(b, "k", TD_GGUF_ARRAY); w_u32(b, TD_GGUF_UINT8); w_u64(b, (uint64_t)a); zeros(b, 64); }
static void c_trunc_arr_count(bb *b, long a) { (void)a; one_kv(b, "k", TD_GGUF_ARRAY); w_u32(b, TD_GGUF_UINT8); w_u32(b, 5); }
static void c_arr_past_end(bb *b, long a) {
    (void)a;
    one_kv(b, "k", TD_GGUF_ARRAY); w_u32(b, TD_GGUF_UINT32); w_u64(b, 10);
    w_u32(b, 1); w_u32(b, 2);
}
static void c_arr_str_count(bb *b, long a) { (void)a; one_kv(b, "k", TD_GGUF_ARRAY); w_u32(b, TD_GGUF_STRING); w_u64(b, 1u << 20); w_str(b, "ab"); w_str(b, "c"); }
static void c_arr_str_elem(bb *b, long a) {
    (void)a;
    one_kv(b, "k", TD_GGUF_ARRAY); w_u32(b, TD_GGUF_STRING); w_u64(b, 3);
    w_str(b, "ab"); w_u64(b, 50); put(b, "cdef", 4); zeros(b, 8);
}
static void c_arr_str_long(bb *b, long a) {
    (void)a;
    one_kv(b, "k", TD_GGUF_ARRAY); w_u32(b, TD_GGUF_STRING); w_u64(b, 2);
    w_u64(b, (1ull << 30) + 1); zeros(b, 16);
}
static void c_align_type(bb *b, long a) { (void)a; one_kv(b, "general.alignment", TD_GGUF_INT32); w_u32(b, 64); }
static void c_align_val(bb *b, long a) { one_kv(b, "general.alignment", TD_GGUF_UINT32); w_u32(b, (uint32_t)a); }
static void c_tname_empty(bb *b, long a) { (void)a; hdr(b, 3, 1, 0); tinfo(b, "", 1, (int64_t[]){4}, TD_TYPE_F32, 0); pad_to(b, 32); zeros(b, 16); }
static void c_tname_64(bb *b, long a) {
    (void)a;
    char name[65];
    memset(name, 'n', 64);
    name[64] = '\0';
    hdr(b, 3, 1, 0);
    tinfo(b, name, 1, (int64_t[]){4}, TD_TYPE_F32, 0);
    pad_to(b, 32);
    zeros(b, 16);
}
static void c_tname_nul(bb *b, long a) {
    (void)a;
    hdr(b, 3, 1, 0);
    w_u64(b, 3);
    put(b, "a\0b", 3);
    w_u32(b, 1); w_i64(b, 4); w_u32(b, TD_TYPE_F32); w_u64(b, 0);
    pad_to(b, 32);
    zeros(b, 16);
}
static void c_tdup(bb *b, long a) {
    (void)a;
    hdr(b, 3, 2, 0);
    tinfo(b, "w", 1, (int64_t[]){8}, TD_TYPE_F32, 0);
    tinfo(b, "w", 1, (int64_t[]){8}, TD_TYPE_F32, 32);
    pad_to(b, 32);
    zeros(b, 64);
}
static void c_ndims(bb *b, long a) { one_tensor(b, (uint32_t)a, (int64_t[]){1, 1, 1, 1, 1}, TD_TYPE_F32, 0, 64); }
static void c_neg_ne(bb *b, long a) { (void)a; one_tensor(b, 2, (int64_t[]){4, -2}, TD_TYPE_F32, 0, 64); }
static void c_elem_overflow(bb *b, long a) { (void)a; one_tensor(b, 3, (int64_t[]){1ll << 32, 1ll << 32, 1ll << 32}, TD_TYPE_F32, 0, 64); }
static void c_elem_overflow2(bb *b, long a) { one_tensor(b, 2, (int64_t[]){1ll << 33, 1ll << a}, TD_TYPE_F32, 0, 64); }
static void c_byte_overflow(bb *b, long a) { (void)a; one_tensor(b, 1, (int64_t[]){1ll << 62}, TD_TYPE_F32, 0, 64); }
static void c_type(bb *b, long a) { one_tensor(b, 1, (int64_t[]){256}, (uint32_t)a, 0, 1024); }
/* a grid type (or NVFP4) tensor one block short of a row: ne[0] = half the block */
static void c_block_half(bb *b, long a) {
    const td_type_info *t = td_type_get((int)a);
    one_tensor(b, 2, (int64_t[]){t->block_size / 2, 2}, (uint32_t)a, 0, 1024);
}
static void c_block(bb *b, long a) { one_tensor(b, 2, (int64_t[]){a, 2}, a == 33 ? TD_TYPE_Q8_0 : TD_TYPE_Q4_K, 0, 1024); }
static void c_first_offset(bb *b, long a) { (void)a; one_tensor(b, 1, (int64_t[]){4}, TD_TYPE_F32, 32, 64); }
static void c_offset_b(bb *b, long a) { two_tensors(b, (uint64_t)a, 128); }
/* The first tensor info is long (40-byte name, 4 dims: 96 bytes) so that the
 * up-front count check (33 bytes per info at least) passes and the reader
 * gets to the cut inside the second info. */
#define LONG_NAME "first_tensor_with_a_long_name_for_slack_"
#define LONG_INFO_BYTES (8 + 40 + 4 + 32 + 4 + 8)
static void c_trunc_tinfo(bb *b, long a) {
    /* a = bytes of the second info kept: 8+1 name, 4 n_dims, 16 ne, 4 type, 8 offset */
    hdr(b, 3, 2, 0);
    tinfo(b, LONG_NAME, 4, (int64_t[]){4, 1, 1, 1}, TD_TYPE_F32, 0);
    cr_assert_eq(b->n, 24 + LONG_INFO_BYTES);
    tinfo(b, "w", 2, (int64_t[]){4, 4}, TD_TYPE_F32, 32);
    b->n = 24 + LONG_INFO_BYTES + (size_t)a;
}
static void c_missing_tinfo(bb *b, long a) {
    (void)a;
    hdr(b, 3, 2, 0);
    tinfo(b, LONG_NAME, 4, (int64_t[]){4, 1, 1, 1}, TD_TYPE_F32, 0);
}
static void c_trunc_data(bb *b, long a) { (void)a; one_tensor(b, 1, (int64_t[]){3}, TD_TYPE_F32, 0, 10); }
static void c_trunc_data_b(bb *b, long a) { two_tensors(b, 32, (size_t)a); }
static void c_data_huge(bb *b, long a) { (void)a; one_tensor(b, 1, (int64_t[]){1ll << 40}, TD_TYPE_F32, 0, 64); }
static void c_no_data(bb *b, long a) { (void)a; hdr(b, 3, 1, 0); tinfo(b, "w", 1, (int64_t[]){4}, TD_TYPE_F32, 0); }

typedef struct bad_case {
    const char *name;
    void (*build)(bb *, long);
    long arg;
    const char *expect; /* substring of the one-line message */
} bad_case;

static const bad_case k_bad[] = {
    {"bad_magic", c_bad_magic, 0, "bad magic: expected \"GGUF\" (47 47 55 46), found 47 47 4d 4c"},
    {"version_0", c_version, 0, "invalid GGUF version 0"},
    {"version_1", c_version, 1, "GGUFv1 is no longer supported"},
    {"version_4", c_version, 4, "unsupported GGUF version 4: expected 2 or 3"},
    {"version_huge", c_version, 0x7fffffff, "unsupported GGUF version 2147483647"},
    {"big_endian", c_big_endian, 0, "GGUF version 0x03000000 looks byte-swapped: big-endian"},
    {"n_tensors_negative", c_neg_tensors, 0, "header: n_tensors: expected >= 0, found -1"},
    {"n_kv_negative", c_neg_kv, 0, "header: n_kv: expected >= 0, found -7"},
    {"trunc_magic", c_trunc_magic, 0, "truncated file: header: magic"},
    {"trunc_header", c_trunc_header, 0, "truncated file: header: n_tensors"},
    {"n_kv_huge", c_huge_kv, 0, "n_kv: expected at most 4 records in the 64 bytes left, found 1152921504606846976"},
    {"n_tensors_huge", c_huge_tensors, 0, "n_tensors: expected at most 1 tensor infos in the 64 bytes left, found 1152921504606846976"},
    {"trunc_key", c_trunc_key, 0, "truncated file: key #0: key string: expected 20 bytes at offset 32, found 6"},
    {"key_too_long", c_key_too_long, 0, "key #0: key length: expected at most 2^30, found 1073741825"},
    {"empty_key", c_empty_key, 0, "key #1: empty key"},
    {"duplicate_key", c_dup_key, 0, "key 'a.b': duplicate key (records #0 and #2)"},
    {"unknown_vtype_13", c_vtype, 13, "key 'k': unknown value type 13"},
    {"unknown_vtype_max", c_vtype, 0xffffffffl, "key 'k': unknown value type 4294967295"},
    {"trunc_value_type", c_trunc_vtype, 0, "truncated file: key 'kkkkkk': value type"},
    {"trunc_value", c_trunc_u64, 0, "truncated file: key 'k': UINT64 value: expected 8 bytes"},
    {"string_too_long", c_str_len, (1l << 30) + 1, "key 'k': string length: expected at most 2^30, found 1073741825"},
    {"string_len_2^62", c_str_len, 1l << 62, "key 'k': string length: expected at most 2^30, found 4611686018427387904"},
    {"string_past_end", c_str_len, 100, "truncated file: key 'k': STRING value: expected 100 bytes"},
    {"nested_array", c_nested, 0, "key 'k': nested array (array of ARRAY)"},
    {"array_elem_type", c_arr_elem_type, 0, "key 'k': unknown value type 13 for array elements"},
    {"array_count_2^30+1", c_arr_count, (1l << 30) + 1, "key 'k': array count: expected at most 2^30, found 1073741825"},
    {"array_count_2^60", c_arr_count, 1l << 60, "array count: expected at most 2^30, found 1152921504606846976"},
    {"array_count_past_end", c_arr_count, 1l << 30, "truncated file: key 'k': array of 1073741824 UINT8"},
    {"trunc_array_count", c_trunc_arr_count, 0, "truncated file: key 'k': array count"},
    {"array_past_end", c_arr_past_end, 0, "truncated file: key 'k': array of 10 UINT32: expected 40 bytes"},
    {"array_str_past_end", c_arr_str_count, 0, "truncated file: key 'k': array of 1048576 STRING"},
    {"array_str_elem_past_end", c_arr_str_elem, 0, "truncated file: key 'k': array element #1 of 3 (STRING): expected 50 bytes"},
    {"array_str_elem_too_long", c_arr_str_long, 0, "key 'k': array element #0: string length: expected at most 2^30"},
    {"alignment_int32", c_align_type, 0, "key 'general.alignment': expected UINT32, found INT32"},
    {"alignment_zero", c_align_val, 0, "key 'general.alignment': expected a non-zero power of two, found 0"},
    {"alignment_48", c_align_val, 48, "expected a non-zero power of two, found 48"},
    {"alignment_2^31+1", c_align_val, (1l << 31) + 1, "expected a non-zero power of two, found 2147483649"},
    {"tensor_name_empty", c_tname_empty, 0, "tensor #0: empty tensor name"},
    {"tensor_name_64", c_tname_64, 0, "tensor #0: name length: expected < 64 bytes, found 64"},
    {"tensor_name_nul", c_tname_nul, 0, "tensor #0: name 'a\\x00b': expected no NUL bytes, found one"},
    {"tensor_duplicate", c_tdup, 0, "tensor 'w': duplicate tensor name (tensor infos #0 and #1)"},
    {"n_dims_0", c_ndims, 0, "tensor 'w': n_dims: expected 1..4, found 0"},
    {"n_dims_5", c_ndims, 5, "tensor 'w': n_dims: expected 1..4, found 5"},
    {"ne_negative", c_neg_ne, 0, "tensor 'w': ne[1]: expected >= 0, found -2"},
    {"element_count_overflow", c_elem_overflow, 0,
     "tensor 'w': element count of ne = {4294967296, 4294967296, 4294967296} overflows 64 bits"},
    {"element_count_2^64", c_elem_overflow2, 31, "tensor 'w': element count of ne = {8589934592, 2147483648} overflows"},
    {"element_count_2^63", c_elem_overflow2, 30, "tensor 'w': element count of ne = {8589934592, 1073741824} overflows"},
    {"byte_size_overflow", c_byte_overflow, 0, "tensor 'w': byte size of F32 ne = {4611686018427387904} overflows 64 bits"},
    {"type_4_removed", c_type, 4, "tensor 'w': unknown or removed type id 4"},
    {"type_5_removed", c_type, 5, "unknown or removed type id 5"},
    {"type_31_removed", c_type, 31, "unknown or removed type id 31"},
    {"type_32_removed", c_type, 32, "unknown or removed type id 32"},
    {"type_33_removed", c_type, 33, "unknown or removed type id 33"},
    {"type_36_removed", c_type, 36, "unknown or removed type id 36"},
    {"type_37_removed", c_type, 37, "unknown or removed type id 37"},
    {"type_38_removed", c_type, 38, "unknown or removed type id 38"},
    {"type_43_unknown", c_type, 43, "unknown or removed type id 43"},
    {"type_max_unknown", c_type, 0xffffffffl, "unknown or removed type id 4294967295"},
    {"block_size_q8_0", c_block, 33, "tensor 'w': ne[0] = 33 is not a multiple of the block size 32 of Q8_0"},
    {"block_size_q4_k", c_block, 128, "ne[0] = 128 is not a multiple of the block size 256 of Q4_K"},
    {"block_size_iq2_xxs", c_block_half, TD_TYPE_IQ2_XXS, "ne[0] = 128 is not a multiple of the block size 256 of IQ2_XXS"},
    {"block_size_iq2_xs", c_block_half, TD_TYPE_IQ2_XS, "ne[0] = 128 is not a multiple of the block size 256 of IQ2_XS"},
    {"block_size_iq2_s", c_block_half, TD_TYPE_IQ2_S, "ne[0] = 128 is not a multiple of the block size 256 of IQ2_S"},
    {"block_size_iq3_xxs", c_block_half, TD_TYPE_IQ3_XXS, "ne[0] = 128 is not a multiple of the block size 256 of IQ3_XXS"},
    {"block_size_iq3_s", c_block_half, TD_TYPE_IQ3_S, "ne[0] = 128 is not a multiple of the block size 256 of IQ3_S"},
    {"block_size_iq1_s", c_block_half, TD_TYPE_IQ1_S, "ne[0] = 128 is not a multiple of the block size 256 of IQ1_S"},
    {"block_size_iq1_m", c_block_half, TD_TYPE_IQ1_M, "ne[0] = 128 is not a multiple of the block size 256 of IQ1_M"},
    {"block_size_nvfp4", c_block_half, TD_TYPE_NVFP4, "ne[0] = 32 is not a multiple of the block size 64 of NVFP4"},
    {"offset_first_nonzero", c_first_offset, 0, "tensor 'w': expected offset 0, found 32"},
    {"offset_unaligned", c_offset_b, 12, "tensor 'b': expected offset 32, found 12"},
    {"offset_overlap", c_offset_b, 0, "tensor 'b': expected offset 32, found 0"},
    {"offset_gap", c_offset_b, 64, "tensor 'b': expected offset 32, found 64"},
    {"trunc_tinfo_name", c_trunc_tinfo, 5, "truncated file: tensor #1: name"},
    {"trunc_tinfo_n_dims", c_trunc_tinfo, 11, "truncated file: tensor 'w': n_dims"},
    {"trunc_tinfo_ne", c_trunc_tinfo, 21, "truncated file: tensor 'w': ne[1]"},
    {"trunc_tinfo_type", c_trunc_tinfo, 30, "truncated file: tensor 'w': type"},
    {"trunc_tinfo_offset", c_trunc_tinfo, 40, "truncated file: tensor 'w': offset"},
    {"missing_tinfo", c_missing_tinfo, 0, "truncated file: tensor #1: name"},
    {"trunc_data", c_trunc_data, 0, "tensor 'w': truncated tensor data: expected 12 bytes at file offset 64"},
    {"trunc_data_second", c_trunc_data_b, 40, "tensor 'b': truncated tensor data: expected 12 bytes at file offset 128"},
    {"data_past_end_huge", c_data_huge, 0, "tensor 'w': truncated tensor data: expected 4398046511104 bytes"},
    {"no_data_at_all", c_no_data, 0, "tensor 'w': truncated tensor data"},
};
#define N_BAD (sizeof k_bad / sizeof k_bad[0])

static bb build_case(const bad_case *c) {
    bb b = {0};
    c->build(&b, c->arg);
    return b;
}

/* An exact-size heap copy, so ASan sees any read past the end. */
static int open_exact(const uint8_t *p, size_t n, const char *label, td_gguf **g, td_err *err) {
    uint8_t *copy = malloc(n ? n : 1);
    cr_assert(copy);
    if (n) memcpy(copy, p, n);
    int st = td_gguf_open_mem(g, n ? copy : NULL, n, label, err);
    if (st == TD_OK) {
        /* touch every view while the buffer is alive */
        unsigned sum = 0;
        for (uint64_t i = 0; i < (*g)->n_kv; i++) {
            const td_gguf_kv *kv = &(*g)->kv[i];
            for (uint64_t j = 0; j < kv->key.len; j++) sum += (unsigned char)kv->key.ptr[j];
            for (uint64_t j = 0; j < kv->str.len; j++) sum += (unsigned char)kv->str.ptr[j];
            if (kv->arr_str)
                for (uint64_t k = 0; k < kv->arr_n; k++)
                    for (uint64_t j = 0; j < kv->arr_str[k].len; j++) sum += (unsigned char)kv->arr_str[k].ptr[j];
        }
        for (uint64_t i = 0; i < (*g)->n_tensors; i++) {
            const td_tensor *t = &(*g)->tensors[i];
            cr_assert(t->data >= copy && t->data + t->nbytes <= copy + n, "tensor %s outside the buffer", t->cname);
            if (t->nbytes) sum += t->data[0] + t->data[t->nbytes - 1];
        }
        (void)sum;
        td_gguf_close(*g);
        *g = NULL;
    }
    free(copy);
    return st;
}

static void write_corpus_file(const char *name, const bb *b) {
    const char *dir = getenv("TD_CORPUS_DIR");
    if (!dir || !*dir) return;
    mkdir(dir, 0777);
    char *path = NULL;
    cr_assert(asprintf(&path, "%s/%s.gguf", dir, name) > 0);
    FILE *fp = fopen(path, "wb");
    cr_assert_not_null(fp, "cannot write %s", path);
    if (b->n) cr_assert_eq(fwrite(b->p, 1, b->n, fp), b->n);
    fclose(fp);
    free(path);
}

Test(gguf, malformed_corpus) {
    cr_assert_geq(N_BAD, 25);
    for (size_t i = 0; i < N_BAD; i++) {
        const bad_case *c = &k_bad[i];
        bb b = build_case(c);
        write_corpus_file(c->name, &b);
        td_gguf *g = (td_gguf *)&b; /* must be reset to NULL */
        td_err err = {{0}};
        char label[96];
        snprintf(label, sizeof label, "%s.gguf", c->name);
        int st = open_exact(b.p, b.n, label, &g, &err);
        cr_assert_eq(st, TD_EINPUT, "case %s: status %d (%s)", c->name, st, err.msg);
        cr_assert_null(g, "case %s: handle not NULL on failure", c->name);
        cr_assert(strncmp(err.msg, label, strlen(label)) == 0 && err.msg[strlen(label)] == ':',
                  "case %s: message does not start with the file name: %s", c->name, err.msg);
        cr_assert(strstr(err.msg, c->expect), "case %s:\n  message: %s\n  lacks:   %s", c->name, err.msg, c->expect);
        cr_assert_null(strchr(err.msg, '\n'), "case %s: message is not one line", c->name);
        free(b.p);
    }
}

/* Runs argv with stdout and stderr captured into files; returns the wait
 * status (a 20 s watchdog kills a hung child). */
static int spawn_capture(char *const argv[], const char *out_path, const char *err_path) {
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 2, err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    pid_t pid;
    int rc = posix_spawn(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    cr_assert_eq(rc, 0, "cannot spawn %s: %s", argv[0], strerror(rc));
    int status = 0;
    for (int ms = 0;; ms += 10) {
        pid_t w = waitpid(pid, &status, WNOHANG);
        cr_assert_neq(w, -1, "waitpid: %s", strerror(errno));
        if (w == pid) return status;
        if (ms > 20000) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            cr_assert_fail("%s %s hung", argv[0], argv[2]);
        }
        nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
    }
}

static char *slurp(const char *path) {
    FILE *fp = fopen(path, "rb");
    cr_assert_not_null(fp);
    char *s = calloc(1, 65537);
    size_t n = fread(s, 1, 65536, fp);
    s[n] = '\0';
    fclose(fp);
    return s;
}

Test(gguf, malformed_corpus_cli) {
    const char *exe = getenv("TD_TAPDIFF");
    if (!exe || access(exe, X_OK) != 0) cr_skip_test("TD_TAPDIFF not set or not executable");
    char *dir = make_temp_dir();
    char *out_path, *err_path;
    cr_assert(asprintf(&out_path, "%s/stdout", dir) > 0);
    cr_assert(asprintf(&err_path, "%s/stderr", dir) > 0);
    for (size_t i = 0; i < N_BAD; i++) {
        const bad_case *c = &k_bad[i];
        bb b = build_case(c);
        char fname[96];
        snprintf(fname, sizeof fname, "%s.gguf", c->name);
        char *path = write_temp(dir, fname, &b);
        char *argv[] = {(char *)exe, "inspect", path, NULL};
        int status = spawn_capture(argv, out_path, err_path);
        char *err_text = slurp(err_path);
        cr_assert(!WIFSIGNALED(status), "case %s: tapdiff inspect killed by signal %d", c->name, WTERMSIG(status));
        cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 3, "case %s: tapdiff inspect exit %d, expected 3; stderr: %s",
                  c->name, WEXITSTATUS(status), err_text);
        cr_assert(strstr(err_text, c->expect), "case %s: stderr lacks \"%s\": %s", c->name, c->expect, err_text);
        free(err_text);
        unlink(path);
        free(path);
        free(b.p);
    }
    unlink(out_path);
    unlink(err_path);
    free(out_path);
    free(err_path);
    rmdir(dir);
    free(dir);
}

/* ------------------------------------------------------------------------ */
/* Truncation, byte flips, random mutations                                   */

Test(gguf, every_prefix_fails) {
    valid_file v = build_valid(3, 0);
    td_gguf *g = NULL;
    td_err err = {{0}};
    cr_assert_eq(open_exact(v.b.p, v.b.n, "full.gguf", &g, &err), TD_OK, "%s", err.msg);
    for (size_t n = 0; n < v.b.n; n++) {
        err.msg[0] = '\0';
        int st = open_exact(v.b.p, n, "prefix.gguf", &g, &err);
        cr_assert_eq(st, TD_EINPUT, "prefix %zu of %zu: status %d", n, v.b.n, st);
        cr_assert(strstr(err.msg, "truncated"), "prefix %zu: %s", n, err.msg);
    }
    free(v.b.p);
}

Test(gguf, every_header_byte_flipped) {
    valid_file v = build_valid(3, 0);
    uint8_t *m = malloc(v.b.n);
    int n_ok = 0, n_bad = 0;
    for (size_t i = 0; i < v.data_start; i++) {
        memcpy(m, v.b.p, v.b.n);
        m[i] ^= 0xFF;
        td_gguf *g = NULL;
        td_err err = {{0}};
        int st = open_exact(m, v.b.n, "flip.gguf", &g, &err);
        cr_assert(st == TD_OK || st == TD_EINPUT, "flip at %zu: status %d", i, st);
        if (st == TD_OK) n_ok++;
        else {
            n_bad++;
            cr_assert(err.msg[0] && !strchr(err.msg, '\n'), "flip at %zu: empty or multi-line message", i);
        }
    }
    /* flips inside value bytes are harmless, flips in lengths and tags are not */
    cr_assert_gt(n_ok, 0);
    cr_assert_gt(n_bad, 0);
    free(m);
    free(v.b.p);
}

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

Test(gguf, random_mutations) {
    valid_file v = build_valid(3, 1);
    uint8_t *m = malloc(v.b.n);
    uint64_t s = 0x9e3779b97f4a7c15ull;
    static const uint8_t k_vals[] = {0x00, 0x01, 0x3f, 0x40, 0x7f, 0x80, 0xfe, 0xff};
    for (int it = 0; it < 4000; it++) {
        memcpy(m, v.b.p, v.b.n);
        int k = 1 + (int)(rng_next(&s) % 4);
        for (int j = 0; j < k; j++) {
            size_t at = (size_t)(rng_next(&s) % v.data_start);
            uint64_t r = rng_next(&s);
            m[at] = r & 1 ? k_vals[(r >> 1) % 8] : (uint8_t)(r >> 8);
        }
        size_t n = rng_next(&s) % 4 ? v.b.n : (size_t)(rng_next(&s) % v.b.n);
        td_gguf *g = NULL;
        td_err err = {{0}};
        int st = open_exact(m, n, "fuzz.gguf", &g, &err);
        cr_assert(st == TD_OK || st == TD_EINPUT, "iteration %d: status %d", it, st);
    }
    free(m);
    free(v.b.p);
}

/* ------------------------------------------------------------------------ */
/* A real llama.cpp-written file                                              */

/* Facts from ../shared/models/README.md: llama, n_embd 64, n_ff 172, 5 blocks,
 * 8 heads / 4 KV heads, 512 tokens, all F32; 3 global tensors + 9 per block. */
Test(gguf, stories260k) {
    const char *shared = getenv("TD_SHARED");
    char *path = NULL;
    cr_assert(asprintf(&path, "%s/models/stories260K.gguf", shared ? shared : "") > 0);
    if (!shared || access(path, R_OK) != 0) {
        free(path);
        cr_skip_test("../shared/models/stories260K.gguf not available (TD_SHARED unset or file absent)");
    }
    td_gguf *g = NULL;
    td_err err = {{0}};
    cr_assert_eq(td_gguf_open(&g, path, &err), TD_OK, "%s", err.msg);
    cr_assert_eq(g->size, 1185376);
    cr_assert_eq(g->n_tensors, 3 + 5 * 9);
    char arch[16];
    uint32_t v;
    cr_assert_eq(td_gguf_get_str(g, "general.architecture", 1, NULL, arch, sizeof arch, &err), TD_OK);
    cr_assert_str_eq(arch, "llama");
    cr_assert_eq(td_gguf_get_u32(g, "llama.embedding_length", 1, 0, &v, &err), TD_OK);
    cr_assert_eq(v, 64);
    cr_assert_eq(td_gguf_get_u32(g, "llama.feed_forward_length", 1, 0, &v, &err), TD_OK);
    cr_assert_eq(v, 172);
    cr_assert_eq(td_gguf_get_u32_or_arr(g, "llama.attention.head_count_kv", 1, 0, 5, &v, &err), TD_OK);
    cr_assert_eq(v, 4);
    const td_gguf_kv *tok = td_gguf_find(g, "tokenizer.ggml.tokens");
    cr_assert_not_null(tok);
    cr_assert_eq(tok->arr_type, TD_GGUF_STRING);
    cr_assert_eq(tok->arr_n, 512);
    cr_assert_eq(tok->arr_str[1].len, 3);
    cr_assert(memcmp(tok->arr_str[1].ptr, "<s>", 3) == 0, "BOS is token 1");
    const td_tensor *t = td_gguf_tensor(g, "token_embd.weight");
    cr_assert_not_null(t);
    cr_assert_eq(t->type, TD_TYPE_F32);
    cr_assert(t->ne[0] == 64 && t->ne[1] == 512);
    cr_assert_eq(t->nbytes, 64 * 512 * 4);
    cr_assert_not_null(td_gguf_tensor(g, "blk.4.ffn_down.weight"));
    const td_tensor *last = &g->tensors[g->n_tensors - 1];
    cr_assert_leq(last->data + last->nbytes, g->map + g->size);
    td_gguf_close(g);
    free(path);
}
