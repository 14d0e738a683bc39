/* tapdiff: prompt.h. */
#include "prompt.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "tokenizer.h"

int td_prompt_read_file(const char *path, char **text, size_t *len, td_err *err) {
    *text = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return td_err_set(err, TD_EINPUT, "%s: cannot open the prompt file: %s", path, strerror(errno));
    size_t cap = 4096, n = 0;
    char *buf = td_xmalloc(cap);
    for (size_t r; (r = fread(buf + n, 1, cap - n - 1, f)) > 0;) {
        n += r;
        if (cap - n - 1 == 0) buf = td_xrealloc(buf, cap *= 2);
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        return td_err_set(err, TD_EINPUT, "%s: cannot read the prompt file", path);
    }
    buf[n] = '\0';
    if (memchr(buf, '\0', n)) {
        size_t at = (size_t)((char *)memchr(buf, '\0', n) - buf);
        free(buf);
        return td_err_set(err, TD_EINPUT, "%s: byte %zu is NUL: expected text (the prompt is recorded as a string)",
                          path, at);
    }
    *text = buf;
    *len = n;
    return TD_OK;
}

int td_prompt_tokenize(const char *model_path, const char *text, size_t len, int32_t **ids, int64_t *n, td_err *err) {
    *ids = NULL;
    *n = 0;
    td_gguf *g = NULL;
    int rc = td_gguf_open(&g, model_path, err);
    if (rc) return rc;
    td_tokenizer *t = NULL;
    if ((rc = td_tokenizer_open(&t, g, err))) {
        td_gguf_close(g);
        return rc;
    }
    int32_t *v = NULL;
    size_t k = 0;
    rc = td_tokenize(t, text, len, 1, 1, &v, &k, err);
    td_tokenizer_free(t);
    td_gguf_close(g);
    if (rc) return rc;
    if (k == 0) {
        free(v);
        return td_err_set(err, TD_EINPUT, "%s: the prompt gives no token (empty text, and the model adds no BOS)",
                          model_path);
    }
    *ids = v;
    *n = (int64_t)k;
    return TD_OK;
}
