/* A stand-in external arm for the failure-mode tests of `bisect --b
 * exec:PROGRAM` (test_extarm.c): it follows the external-arm contract, or
 * breaks it the one way argv[1] names. It writes only the inp.* and
 * hist.tokens taps: every mode but "ok" must be refused before compare. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tap.h"

static int parse(const char *s, int32_t *ids, int cap) {
    int n = 0;
    for (char *end; *s && n < cap; s = end) {
        while (*s == ',' || *s == ' ' || *s == '\n') s++;
        if (!*s) break;
        ids[n++] = (int32_t)strtol(s, &end, 10);
        if (end == s) break;
    }
    return n;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "ok";
    if (!strcmp(mode, "exit5")) return 5;
    if (!strcmp(mode, "exit77")) return 77;
    if (!strcmp(mode, "crash")) kill(getpid(), SIGKILL); // a sanitizer runtime cannot turn it into an exit
    if (!strcmp(mode, "nofile")) return 0;
    int32_t prompt[256], pinned[256];
    int np = parse(getenv("TAPDIFF_PROMPT"), prompt, 256), steps = atoi(getenv("TAPDIFF_STEPS"));
    char text[4096] = "";
    FILE *f = fopen(getenv("TAPDIFF_PINNED"), "r");
    if (!f || !fgets(text, sizeof text, f)) return 9;
    fclose(f);
    parse(text, pinned, 256);
    td_err err;
    td_tap_sink *s = NULL;
    if (td_tap_sink_open_env(&s, NULL, &err)) return 8;
    if (strcmp(mode, "nosha"))
        td_tap_sink_provenance(s, !strcmp(mode, "othermodel") ? argv[0] : getenv("TAPDIFF_MODEL"), "llama", "fake",
                               NULL, "f32", &err);
    if (!strcmp(mode, "prompt")) prompt[np - 1]++;
    td_tap_step_begin_tokens(s, prompt, NULL, np, &err);
    td_tap_step_end(s, &err);
    if (!strcmp(mode, "fewer")) steps--;
    for (int i = 0; i < steps; i++) {
        int32_t t = pinned[i] + (!strcmp(mode, "othertokens") && i == 1);
        td_tap_step_begin_tokens(s, &t, NULL, 1, &err);
        td_tap_step_end(s, &err);
    }
    return td_tap_sink_close(s, &err) ? 7 : 0;
}
