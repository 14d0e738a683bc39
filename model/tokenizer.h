/* tapdiff: text <-> token ids from the tokenizer a GGUF file carries.
 *
 * Two vocab types, the ones our architectures use:
 *  - `llama`: SentencePiece-style (scores, bigram merges by score, "▁" for a
 *    space, a leading space when add_space_prefix, byte fallback <0xXX>);
 *  - `gpt2`: byte-level BPE (GPT-2's byte-to-unicode mapping, merges by rank)
 *    with the pre-tokenizers `qwen2`, `llama-bpe` (llama3) and `default`; the
 *    regexes run through PCRE2 on code points.
 * Control, unknown and user-defined tokens are matched whole before the text
 * is split (control/unknown only when parse_special), and BOS/EOS are added
 * per tokenizer.ggml.add_bos_token / add_eos_token with llama.cpp's defaults
 * when a flag is absent. The goal is the ids llama.cpp's llama_tokenize gives
 * for the same file and flags; the peer test checks that on a corpus.
 *
 * It is not: a chat-template engine, a normalizer for other vocab types
 * (bert, t5, rwkv: refused with TD_EINPUT), or a trainer. */
#ifndef TD_TOKENIZER_H
#define TD_TOKENIZER_H

#include "gguf.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct td_tokenizer td_tokenizer;

/* Builds the tokenizer from g's tokenizer.ggml.* keys (copies what it needs:
 * g may be closed afterwards). TD_EINPUT naming the key for a missing or
 * malformed vocabulary, an unsupported model or pre-tokenizer. */
int td_tokenizer_open(td_tokenizer **out, const td_gguf *g, td_err *err);
void td_tokenizer_free(td_tokenizer *t);

uint32_t td_tokenizer_n_vocab(const td_tokenizer *t);
/* "llama" or "gpt2" / the pre-tokenizer name ("" for llama) */
const char *td_tokenizer_model(const td_tokenizer *t);
const char *td_tokenizer_pre(const td_tokenizer *t);
int32_t td_tokenizer_bos(const td_tokenizer *t); /* -1 when none */
int32_t td_tokenizer_eos(const td_tokenizer *t);

/* Tokenizes text[0..len) (any bytes; invalid UTF-8 is tokenized as llama.cpp
 * does). add_special: BOS/EOS per the file's flags; parse_special: control
 * tokens written in the text ("<|im_start|>") become those tokens. *ids is
 * allocated (free()), *n its count. TD_EINPUT when the vocab cannot represent
 * a byte of the text (no byte-fallback token). */
int td_tokenize(const td_tokenizer *t, const char *text, size_t len, int add_special, int parse_special,
                int32_t **ids, size_t *n, td_err *err);

/* The bytes a token stands for (llama.cpp's token_to_piece): "▁" -> ' ',
 * <0xXX> -> that byte, gpt2 byte-level characters -> their bytes. Control and
 * unknown tokens give their text only when `special`, else nothing. Returns
 * the byte count (possibly > cap: then only cap bytes were written), or -1
 * for an id out of range. The bytes may be part of a UTF-8 sequence: feed
 * them through a td_utf8_stream before printing. */
long td_token_piece(const td_tokenizer *t, int32_t id, int special, char *buf, size_t cap);

/* Detokenizes ids into a NUL-terminated malloc'd string (*len bytes, raw:
 * what the pieces concatenate to). */
int td_detokenize(const td_tokenizer *t, const int32_t *ids, size_t n, int special, char **text, size_t *len,
                  td_err *err);

/* A streaming UTF-8 decoder for printing generated text token by token: a
 * sequence split across tokens is held back until it is complete, so a valid
 * character is never printed as U+FFFD; bytes that cannot start or continue
 * a valid sequence become U+FFFD (EF BF BD). */
typedef struct td_utf8_stream {
    unsigned char pend[4];
    int n;    /* bytes held */
    int need; /* total length of the held sequence */
} td_utf8_stream;

#define TD_UTF8_STREAM_INIT {{0}, 0, 0}
/* Writes at most 3*(n+4) bytes to out; returns the count written. */
size_t td_utf8_stream_feed(td_utf8_stream *s, const char *in, size_t n, char *out);
/* The end of the text: a held incomplete sequence becomes U+FFFD (<= 3 bytes). */
size_t td_utf8_stream_flush(td_utf8_stream *s, char *out);

#ifdef __cplusplus
}
#endif
#endif
