/* The one option parser of every verb. Options are `--name VALUE` or
 * `--name=VALUE` (flags take no value: `--json=1` is refused); `--` ends the
 * options; `-h`/`--help` is reported as TD_ARG_HELP; a lone `-` is a
 * positional argument (stdin by convention). Messages name the verb:
 * "tapdiff <verb>: <what>", and an unknown option also prints the verb's
 * usage, so every verb reports the same way.
 *
 *   td_args p;
 *   td_args_init(&p, "compare", usage_text, argc, argv);
 *   for (int k; (k = td_args_next(&p)) != TD_ARG_END;) {
 *       if (k == TD_ARG_HELP) { fputs(usage_text, stdout); return TD_OK; }
 *       if (k == TD_ARG_ERROR) return TD_EUSAGE;
 *       if (k == TD_ARG_POS) { ... p.arg ...; continue; }
 *       if (td_args_is(&p, "--json")) json = 1;
 *       else if (td_args_is(&p, "--out")) { if (!(out = td_args_value(&p))) return TD_EUSAGE; }
 *       else return td_args_unknown(&p);
 *   }
 */
#ifndef TD_CLI_ARGS_H
#define TD_CLI_ARGS_H

#include <stdint.h>
#include <stdio.h>

enum { TD_ARG_END = 0, TD_ARG_OPT, TD_ARG_POS, TD_ARG_HELP, TD_ARG_ERROR };

typedef struct td_args {
    int argc;
    char **argv;
    int i;                /* index of the current item */
    const char *cmd;      /* the verb, for messages */
    const char *usage;    /* printed to stderr after an unknown option */
    void (*usage_fn)(FILE *); /* or this prints it */
    const char *arg;      /* TD_ARG_OPT: the option name ("--out"); TD_ARG_POS: the argument */
    const char *inline_v; /* the text after '=' in --name=VALUE, NULL when none */
    int value_taken;      /* the current option's value was consumed */
    int no_more_opts;     /* after "--" */
    char name[128];       /* storage for the name part of --name=VALUE */
} td_args;

void td_args_init(td_args *p, const char *cmd, const char *usage, int argc, char **argv);
/* Next item (argv[0], the verb, is skipped). A flag given a value (`--json=x`)
 * and an over-long option name are TD_ARG_ERROR after a message. */
int td_args_next(td_args *p);
/* The current option is `name`. */
int td_args_is(const td_args *p, const char *name);
/* The current option's value (inline or the next argument); NULL after the
 * message "<opt> needs a value" when there is none. */
const char *td_args_value(td_args *p);
/* Typed values; TD_OK or TD_EUSAGE after a message naming the option and the
 * range. */
int td_args_long(td_args *p, long long lo, long long hi, long long *out);
int td_args_int(td_args *p, int lo, int hi, int *out);
int td_args_double(td_args *p, double lo, double hi, double *out);
/* "unknown option '--x'" plus the usage on stderr; returns TD_EUSAGE. */
int td_args_unknown(const td_args *p);

#endif
