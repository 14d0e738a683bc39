/* tapdiff CLI: one entry point per subcommand and the helpers they share.
 * Each td_cmd_* takes argv starting at the subcommand name and returns an
 * exit code of DESIGN.md: 0 conformant/ok, 1 divergent, 2 usage, 3 bad input,
 * 77 skipped, 99 internal error. Results go to stdout, progress and errors to
 * stderr. */
#ifndef TD_CLI_H
#define TD_CLI_H

#include <stdint.h>
#include <stdio.h>

#include "td_common.h"

int td_cmd_inspect(int argc, char **argv);
int td_cmd_fixture(int argc, char **argv);
int td_cmd_run(int argc, char **argv);
int td_cmd_compare(int argc, char **argv);
int td_cmd_bisect(int argc, char **argv);
int td_cmd_gate(int argc, char **argv);
int td_cmd_golden(int argc, char **argv);
int td_cmd_bench(int argc, char **argv);
int td_cmd_audit(int argc, char **argv);
int td_cmd_tokenize(int argc, char **argv);
int td_cmd_determinism(int argc, char **argv);
int td_cmd_taps(int argc, char **argv);
int td_cmd_backends(int argc, char **argv);
int td_cmd_stateops(int argc, char **argv);

/* The exact command line, for provenance attributes (set by main). */
extern const char *td_cli_command_line;

/* Prints "tapdiff <cmd>: <msg>" to stderr and returns status. */
int td_cli_fail(const char *cmd, int status, const td_err *err);
/* "tapdiff <cmd>: " + printf, to stderr; returns status. */
int td_cli_failf(const char *cmd, int status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* --prompt TEXT / --prompt-file F (prompt.h): with either given, *text gets
 * the prompt (malloc'd, *len bytes) and *ids its tokens under the model's
 * tokenizer; with neither, *text is NULL and nothing else is touched. */
int td_cli_prompt(const char *model, const char *text_opt, const char *file_opt, char **text, size_t *len,
                  int32_t **ids, int64_t *n, td_err *err);

/* Progress bar on stderr, shown only when stderr is a terminal or
 * TD_PROGRESS=1, and only once a task has run for more than a second. */
typedef struct td_progress td_progress;
td_progress *td_progress_begin(const char *label, long total);
void td_progress_update(td_progress *p, long done);
void td_progress_end(td_progress *p);

#endif
