/* tapdiff tokenize: a text through the model's tokenizer (model/tokenizer.h),
 * printed as ids and pieces, for checking what --prompt will feed a model. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "cli.h"
#include "gguf.h"
#include "prompt.h"
#include "tokenizer.h"

#define CMD "tokenize"

static const char *const tokenize_help =
    "usage: tapdiff tokenize MODEL.gguf (TEXT | --file F) [--no-special] [--json]\n"
    "\n"
    "Tokenizes TEXT (or the bytes of file F) with the tokenizer the GGUF carries, as\n"
    "--prompt does: BOS/EOS as the file's flags say, control tokens written in the text\n"
    "(\"<|im_start|>\") parsed as those tokens. Prints one line per token: the id and its\n"
    "piece (the bytes it stands for; bytes that are not printable UTF-8 as \\xNN), then a\n"
    "summary line.\n"
    "\n"
    "  --file F       the text is the content of F, byte for byte\n"
    "  --no-special   add no BOS/EOS and do not parse control-token text\n"
    "  --json         one JSON object: tokenizer, pre-tokenizer, ids, pieces, text\n"
    "\n"
    "exit: 0 ok, 2 usage, 3 a model without a supported tokenizer or an unreadable file,\n"
    "      99 internal error\n";

/* The piece as printable text: valid UTF-8 (and no control byte) as is, the rest \xNN. */
static void escape_piece(const char *p, size_t n, char *out, size_t cap) {
    size_t o = 0;
    for (size_t i = 0; i < n && o + 8 < cap;) {
        unsigned char c = (unsigned char)p[i];
        size_t l = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 1;
        int ok = c >= 0x20 && c != 0x7F && c != '\\' && (c < 0x80 || l > 1) && i + l <= n;
        for (size_t k = 1; ok && k < l; k++) ok = ((unsigned char)p[i + k] & 0xC0) == 0x80;
        /* the first continuation byte's narrower ranges (Unicode Table 3-7) */
        if (ok && l > 1) {
            unsigned char d = (unsigned char)p[i + 1];
            if ((c == 0xE0 && d < 0xA0) || (c == 0xED && d > 0x9F) || (c == 0xF0 && d < 0x90) || (c == 0xF4 && d > 0x8F))
                ok = 0;
        }
        if (ok) {
            memcpy(out + o, p + i, l);
            o += l;
            i += l;
        } else {
            o += (size_t)snprintf(out + o, cap - o, c == '\\' ? "\\\\" : c == '\n' ? "\\n" : c == '\t' ? "\\t" : "\\x%02X", c);
            i++;
        }
    }
    out[o] = '\0';
}

int td_cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *text_arg = NULL, *file = NULL;
    int json = 0, special = 1;
    td_args p;
    td_args_init(&p, CMD, tokenize_help, argc, argv);
    for (int k; (k = td_args_next(&p)) != TD_ARG_END;) {
        if (k == TD_ARG_ERROR) return TD_EUSAGE;
        if (k == TD_ARG_HELP) {
            fputs(tokenize_help, stdout);
            return TD_OK;
        }
        if (k == TD_ARG_POS) {
            if (!model) model = p.arg;
            else if (!text_arg) text_arg = p.arg;
            else return td_cli_failf(CMD, TD_EUSAGE, "unexpected argument '%s' (see tapdiff tokenize --help)", p.arg);
            continue;
        }
        if (td_args_is(&p, "--json")) json = 1;
        else if (td_args_is(&p, "--no-special")) special = 0;
        else if (td_args_is(&p, "--file")) {
            if (!(file = td_args_value(&p))) return TD_EUSAGE;
        } else
            return td_args_unknown(&p);
    }
    if (!model) return td_cli_failf(CMD, TD_EUSAGE, "MODEL is required (see tapdiff tokenize --help)");
    if (!!text_arg == !!file) return td_cli_failf(CMD, TD_EUSAGE, "give the text as an argument or --file F, one of them");

    td_err err = {{0}};
    char *text = NULL;
    size_t len = 0;
    int rc;
    if (file) {
        if ((rc = td_prompt_read_file(file, &text, &len, &err))) return td_cli_fail(CMD, rc, &err);
    } else {
        text = td_xstrdup(text_arg);
        len = strlen(text);
    }
    td_gguf *g = NULL;
    td_tokenizer *t = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    char *back = NULL;
    size_t bl = 0;
    if ((rc = td_gguf_open(&g, model, &err)) || (rc = td_tokenizer_open(&t, g, &err)) ||
        (rc = td_tokenize(t, text, len, special, special, &ids, &n, &err)) ||
        (rc = td_detokenize(t, ids, n, 1, &back, &bl, &err)))
        goto out;

    char piece[1024], esc[4200];
    if (json) {
        cJSON *o = cJSON_CreateObject(), *ja = cJSON_CreateArray(), *pa = cJSON_CreateArray();
        cJSON_AddStringToObject(o, "model", model);
        cJSON_AddStringToObject(o, "tokenizer", td_tokenizer_model(t));
        cJSON_AddStringToObject(o, "pre", td_tokenizer_pre(t));
        cJSON_AddNumberToObject(o, "n_tokens", (double)n);
        for (size_t i = 0; i < n; i++) {
            long pl = td_token_piece(t, ids[i], 1, piece, sizeof piece);
            escape_piece(piece, pl < 0 ? 0 : (size_t)(pl > (long)sizeof piece ? (long)sizeof piece : pl), esc, sizeof esc);
            cJSON_AddItemToArray(ja, cJSON_CreateNumber(ids[i]));
            cJSON_AddItemToArray(pa, cJSON_CreateString(esc));
        }
        cJSON_AddItemToObject(o, "ids", ja);
        cJSON_AddItemToObject(o, "pieces", pa);
        char *tx = td_xmalloc(4 * bl + 8);
        escape_piece(back, bl, tx, 4 * bl + 8);
        cJSON_AddStringToObject(o, "text", tx);
        free(tx);
        char *s = cJSON_Print(o);
        puts(s);
        free(s);
        cJSON_Delete(o);
    } else {
        for (size_t i = 0; i < n; i++) {
            long pl = td_token_piece(t, ids[i], 1, piece, sizeof piece);
            escape_piece(piece, pl < 0 ? 0 : (size_t)(pl > (long)sizeof piece ? (long)sizeof piece : pl), esc, sizeof esc);
            printf("%d\t%s\n", ids[i], esc);
        }
        printf("tokenize: %zu tokens, tokenizer %s%s%s, %zu bytes of text\n", n, td_tokenizer_model(t),
               td_tokenizer_pre(t)[0] ? " pre " : "", td_tokenizer_pre(t), len);
    }
out:
    free(back);
    free(ids);
    td_tokenizer_free(t);
    td_gguf_close(g);
    free(text);
    if (rc) return td_cli_fail(CMD, rc, &err);
    return TD_OK;
}
