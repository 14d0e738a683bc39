/* tapdiff: GGUF v2/v3 reader. The file is mmapped read-only; metadata values
 * and tensor data are views into the mapping, never copies. td_gguf_open
 * validates the whole container (header, every key/value, every tensor info,
 * offsets, bounds) before returning, so later code can trust every view.
 * Format: ../shared/spec/gguf.md. */
#ifndef TD_GGUF_H
#define TD_GGUF_H

#include "types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Metadata value type tags (gguf_type); values fixed by the file format. */
typedef enum td_gguf_vtype {
    TD_GGUF_UINT8 = 0,
    TD_GGUF_INT8 = 1,
    TD_GGUF_UINT16 = 2,
    TD_GGUF_INT16 = 3,
    TD_GGUF_UINT32 = 4,
    TD_GGUF_INT32 = 5,
    TD_GGUF_FLOAT32 = 6,
    TD_GGUF_BOOL = 7,
    TD_GGUF_STRING = 8,
    TD_GGUF_ARRAY = 9,
    TD_GGUF_UINT64 = 10,
    TD_GGUF_INT64 = 11,
    TD_GGUF_FLOAT64 = 12,
    TD_GGUF_VTYPE_COUNT = 13,
} td_gguf_vtype;

/* A string view into the mapping: not NUL-terminated. */
typedef struct td_str {
    const char *ptr;
    uint64_t len;
} td_str;

typedef struct td_gguf_kv {
    td_str key;
    td_gguf_vtype type;
    /* scalars (type != STRING/ARRAY): widened copies of the stored value */
    union {
        uint64_t u;  /* UINT8..UINT64, BOOL */
        int64_t i;   /* INT8..INT64 */
        double f;    /* FLOAT32, FLOAT64 */
    } v;
    td_str str;                  /* type == STRING */
    td_gguf_vtype arr_type;      /* type == ARRAY: element type */
    uint64_t arr_n;              /* type == ARRAY: element count */
    const uint8_t *arr_data;     /* type == ARRAY: first element in the mapping */
    const td_str *arr_str;       /* type == ARRAY of STRING: arr_n views (owned by td_gguf) */
} td_gguf_kv;

#define TD_MAX_DIMS 4

typedef struct td_tensor {
    td_str name;                 /* view; also NUL-terminated copy in cname */
    char cname[64];
    int type;                    /* td_type id */
    uint32_t n_dims;
    int64_t ne[TD_MAX_DIMS];     /* missing trailing dims are 1 */
    uint64_t offset;             /* relative to data_start */
    uint64_t n_elements;
    uint64_t n_rows;             /* ne[1]*ne[2]*ne[3] */
    size_t row_bytes;            /* bytes of one ne[0]-row */
    size_t nbytes;
    const uint8_t *data;         /* into the mapping */
} td_tensor;

typedef struct td_gguf {
    char *path;
    const uint8_t *map;
    size_t size;
    uint32_t version;
    uint32_t alignment;
    size_t data_start;
    uint64_t n_kv;
    td_gguf_kv *kv;
    uint64_t n_tensors;
    td_tensor *tensors;
} td_gguf;

/* Opens, maps and validates. On failure *out is NULL and err names the file,
 * the key or tensor, what was expected and what was found. */
int td_gguf_open(td_gguf **out, const char *path, td_err *err);
/* Same, over a caller-owned buffer that must outlive the handle (tests). */
int td_gguf_open_mem(td_gguf **out, const void *buf, size_t size, const char *label, td_err *err);
void td_gguf_close(td_gguf *g);

const td_gguf_kv *td_gguf_find(const td_gguf *g, const char *key);
const td_tensor *td_gguf_tensor(const td_gguf *g, const char *name);
const char *td_gguf_vtype_name(int vtype);

/* Typed getters. Absent key: *out = def, returns TD_OK (or TD_EINPUT when
 * `required`). Present with the wrong type: TD_EINPUT naming key, expected
 * and found type. Integer getters accept any integer type whose value fits
 * (llama.cpp is strict; files in the wild are not always); float getters
 * accept FLOAT32/FLOAT64. */
int td_gguf_get_u32(const td_gguf *g, const char *key, int required, uint32_t def, uint32_t *out, td_err *err);
int td_gguf_get_u64(const td_gguf *g, const char *key, int required, uint64_t def, uint64_t *out, td_err *err);
int td_gguf_get_f32(const td_gguf *g, const char *key, int required, float def, float *out, td_err *err);
int td_gguf_get_bool(const td_gguf *g, const char *key, int required, int def, int *out, td_err *err);
/* String: a NUL-terminated copy into buf (truncation is an error). */
int td_gguf_get_str(const td_gguf *g, const char *key, int required, const char *def, char *buf, size_t bufsz, td_err *err);
/* "Key or array": a scalar, or an integer array of exactly n entries whose
 * entries must all be equal to be read as one value here (per-layer values
 * are not used by the architectures tapdiff supports); *out gets entry 0. */
int td_gguf_get_u32_or_arr(const td_gguf *g, const char *key, int required, uint32_t def, uint64_t n, uint32_t *out, td_err *err);

/* Element i of an integer/float array as double / int64 (no bounds check
 * beyond TD_ASSERT). */
double td_gguf_arr_f64(const td_gguf_kv *kv, uint64_t i);
int64_t td_gguf_arr_i64(const td_gguf_kv *kv, uint64_t i);

/* Pointer to row r (0 <= r < n_rows) of a tensor. For 3-D expert tensors
 * {n_in, n_out, n_expert}, row r = e*n_out + o. */
static inline const uint8_t *td_tensor_row(const td_tensor *t, uint64_t r) {
    return t->data + r * t->row_bytes;
}
int td_tensor_decode_row_f64(const td_tensor *t, uint64_t r, double *dst, td_err *err);
int td_tensor_decode_row_f32(const td_tensor *t, uint64_t r, float *dst, td_err *err);
/* The same in a mode (td_row_mode). */
int td_tensor_decode_row_as_f64(const td_tensor *t, uint64_t r, double *dst, td_row_mode mode, td_err *err);
int td_tensor_decode_row_as_f32(const td_tensor *t, uint64_t r, float *dst, td_row_mode mode, td_err *err);

#ifdef __cplusplus
}
#endif
#endif
