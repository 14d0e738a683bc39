/* tapdiff tests: the tokenizer corpus, shared by the peer test
 * (backends/llamacpp/tests/test_tokenize_peer.c, ours vs llama_tokenize) and
 * the reduced check against the committed expected ids
 * (model/tests/data/tokenizer_expected.txt). Deterministic: the seed strings
 * below, then TOK_CORPUS_N - n_seeds strings joined from 1 to 4 seeds (or
 * slices of them) with separators drawn by a fixed xorshift, so string i is
 * the same on every machine. Covers ASCII prose, leading/trailing/multiple
 * spaces, newlines and tabs, digits and long numbers, punctuation runs, code,
 * accented Latin, CJK, emoji and other multi-byte sequences, contractions,
 * special-token texts, and invalid UTF-8. Header-only (static). */
#ifndef TD_TOK_CORPUS_H
#define TD_TOK_CORPUS_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define TOK_CORPUS_N 600

typedef struct tok_str {
    char s[512];
    size_t n;
    int valid_utf8; /* 1 when s is well-formed UTF-8 */
} tok_str;

static const char *const tok_seeds[] = {
    /* ASCII prose */
    "Once upon a time",
    "Once upon a time, there was a little girl named Lily.",
    "She loved to play outside in the park with her friends.",
    "The quick brown fox jumps over the lazy dog.",
    "Hello world",
    "hello",
    "a",
    "I",
    "THE END",
    "Tim and Sue went to the store to buy some milk and eggs.",
    /* spaces */
    " ",
    "  ",
    "   leading",
    "trailing   ",
    "multiple   spaces   between   words",
    " a b c ",
    "x  y",
    "\t",
    "\n",
    "\n\n",
    "line one\nline two\n",
    "tabs\tbetween\twords",
    "\r\n windows line\r\n",
    "  \n  \n  ",
    " \t \n mixed \n\t whitespace",
    /* digits and numbers */
    "0",
    "7",
    "42",
    "123",
    "1234",
    "12345678901234567890",
    "3.14159265358979",
    "1,000,000",
    "-273.15",
    "2024-12-01 15:30:00",
    "0x1F 0b1010 1e-9",
    "version 1.2.3",
    "call 555-0123 now",
    /* punctuation runs */
    "!!!",
    "???",
    "...",
    "?!?!",
    "---",
    "***",
    "$$$ %%% ^^^",
    "<<>>",
    "((()))",
    "\"quoted\"",
    "'single'",
    "a, b; c: d.",
    "@#&*()_+=[]{}|\\/~`",
    /* contractions */
    "it's",
    "IT'S",
    "they're here",
    "we've done it",
    "I'm sure you'll see what I'd do",
    "Don't STOP",
    "'s 't 're 've 'm 'll 'd",
    /* code */
    "int main(void) { return 0; }",
    "for (int i = 0; i < n; i++) {\n    x += i;\n}",
    "def f(x):\n\treturn x * 2",
    "if (a == b && c != d) print(\"yes\")",
    "    indented = True",
    "#include <stdio.h>",
    "std::vector<int> v{1, 2, 3};",
    "SELECT * FROM t WHERE id = 10;",
    "<div class=\"x\">text</div>",
    "x=>x**2 // arrow",
    /* accented Latin and other scripts */
    "Caf\xC3\xA9",
    "cr\xC3\xA8me br\xC3\xBBl\xC3\xA9" "e",
    "na\xC3\xAFve fa\xC3\xA7" "ade",
    "\xC3\xBC" "ber Stra\xC3\x9F" "e",
    "Espa\xC3\xB1" "a",
    "\xC3\x80 la fran\xC3\xA7" "aise",
    "e\xCC\x81 (combining acute)",
    "\xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82 \xD0\xBC\xD0\xB8\xD1\x80",
    "\xCE\xB3\xCE\xB5\xCE\xB9\xCE\xB1 \xCF\x83\xCE\xBF\xCF\x85",
    "\xD7\xA9\xD7\x9C\xD7\x95\xD7\x9D",
    "\xD8\xA7\xD9\x84\xD8\xB9\xD8\xA7\xD9\x84\xD9\x85",
    "\xE0\xA4\xA8\xE0\xA4\xAE\xE0\xA4\xB8\xE0\xA5\x8D\xE0\xA4\xA4\xE0\xA5\x87",
    /* CJK */
    "\xE4\xBD\xA0\xE5\xA5\xBD",
    "\xE4\xBD\xA0\xE5\xA5\xBD\xE4\xB8\x96\xE7\x95\x8C\xEF\xBC\x8C\xE4\xBD\xA0\xE5\xA5\xBD\xE3\x80\x82",
    "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x81\xAE\xE3\x83\x86\xE3\x82\xAD\xE3\x82\xB9\xE3\x83\x88",
    "\xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4 \xED\x85\x8D\xEC\x8A\xA4\xED\x8A\xB8",
    "\xE4\xB8\x80\xE4\xBA\x8C\xE4\xB8\x89 123 abc",
    "\xEF\xBC\x91\xEF\xBC\x92\xEF\xBC\x93 fullwidth",
    /* emoji and other multi-byte */
    "\xF0\x9F\x98\x80",
    "\xF0\x9F\x98\x80\xF0\x9F\x98\x80\xF0\x9F\x98\x80",
    "thumbs \xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD up",
    "\xE2\x9C\xA8 sparkle \xE2\x9D\xA4\xEF\xB8\x8F",
    "flag \xF0\x9F\x87\xAB\xF0\x9F\x87\xB7",
    "family \xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7",
    "\xE2\x82\xAC" "100 \xC2\xA3" "50 \xC2\xA5" "30",
    "em\xE2\x80\x94" "dash \xE2\x80\x9Cquotes\xE2\x80\x9D \xE2\x80\xA6",
    "math \xE2\x88\x91 \xE2\x88\x9A \xCF\x80 \xE2\x88\x9E",
    "\xC2\xA0non-breaking\xC2\xA0space",
    "ideographic\xE3\x80\x80space",
    "\xF0\x90\x8D\x88 gothic",
    /* special-token texts (matched whole only with parse_special) */
    "<|endoftext|>",
    "<|im_start|>user\nhi<|im_end|>",
    "a<|im_end|>b",
    "tapdiff is a tool",
    "<s>",
    "</s> end",
    "<unk>",
    /* invalid UTF-8 */
    "\x80",
    "\xFF",
    "bad \xC3 byte",
    "trunc \xE4\xBD",
    "\xE4\xBD",
    "\xF0\x9F\x98",
    "lone \xBF\xBF continuation",
    "over\xC0\xAFlong",
    "\xFE\xFF mark",
    "mix \xE2\x82\xAC\x80\xE2\x82",
};

static inline size_t tok_n_seeds(void) { return sizeof tok_seeds / sizeof tok_seeds[0]; }

static inline int tok_utf8_valid(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t l = c < 0x80 ? 1 : (c >= 0xC2 && c <= 0xDF) ? 2 : (c >= 0xE0 && c <= 0xEF) ? 3 : (c >= 0xF0 && c <= 0xF4) ? 4 : 0;
        if (!l || i + l > n) return 0;
        for (size_t k = 1; k < l; k++) {
            unsigned d = s[i + k];
            unsigned lo = 0x80, hi = 0xBF;
            if (k == 1 && c == 0xE0) lo = 0xA0;
            if (k == 1 && c == 0xED) hi = 0x9F;
            if (k == 1 && c == 0xF0) lo = 0x90;
            if (k == 1 && c == 0xF4) hi = 0x8F;
            if (d < lo || d > hi) return 0;
        }
        i += l;
    }
    return 1;
}

static inline uint64_t tok_rng(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* String i of the corpus (0 <= i < TOK_CORPUS_N). */
static inline void tok_corpus(size_t i, tok_str *out) {
    static const char *const seps[] = {" ", "", "  ", "\n", "\t", ", ", ". ", "\n\n", " \n", "   "};
    const size_t ns = tok_n_seeds();
    out->n = 0;
    if (i < ns) {
        out->n = strlen(tok_seeds[i]);
        memcpy(out->s, tok_seeds[i], out->n);
    } else {
        uint64_t st = 0x9E3779B97F4A7C15ull ^ (uint64_t)i * 0x100000001B3ull;
        int parts = 1 + (int)(tok_rng(&st) % 4);
        for (int p = 0; p < parts; p++) {
            const char *a = tok_seeds[tok_rng(&st) % ns];
            size_t al = strlen(a), from = 0, to = al;
            if (al > 3 && tok_rng(&st) % 3 == 0) { /* a slice: may cut a multi-byte character */
                from = (size_t)(tok_rng(&st) % (al / 2));
                to = from + 1 + (size_t)(tok_rng(&st) % (al - from));
            }
            if (p) {
                const char *sp = seps[tok_rng(&st) % (sizeof seps / sizeof seps[0])];
                size_t sl = strlen(sp);
                if (out->n + sl < sizeof out->s) memcpy(out->s + out->n, sp, sl), out->n += sl;
            }
            if (out->n + (to - from) < sizeof out->s) memcpy(out->s + out->n, a + from, to - from), out->n += to - from;
        }
    }
    out->s[out->n] = '\0';
    out->valid_utf8 = tok_utf8_valid((const unsigned char *)out->s, out->n);
}

#endif
