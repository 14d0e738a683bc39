/* tapdiff: a text prompt -> the model's token ids, for the verbs that take
 * --prompt TEXT / --prompt-file F beside --tokens. The tokenizer is the
 * model's own (model/tokenizer.h): BOS/EOS as the GGUF's flags say, control
 * tokens written in the text ("<|im_start|>") parsed as those tokens, as
 * llama.cpp's completion does. */
#ifndef TD_PROMPT_H
#define TD_PROMPT_H

#include <stddef.h>
#include <stdint.h>

#include "td_common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The whole file, byte for byte (a trailing newline is part of the prompt);
 * NUL-terminated. TD_EINPUT for an unreadable file or one holding a NUL byte
 * (the prompt is recorded as a string attribute). */
int td_prompt_read_file(const char *path, char **text, size_t *len, td_err *err);

/* Tokenizes text[0..len) with the tokenizer of the GGUF at model_path.
 * TD_EINPUT when the file has no supported tokenizer or the text gives no
 * token (an empty prompt without BOS). */
int td_prompt_tokenize(const char *model_path, const char *text, size_t len, int32_t **ids, int64_t *n, td_err *err);

#ifdef __cplusplus
}
#endif
#endif
