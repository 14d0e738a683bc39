/* The option parser shared by every verb (args.h). */
#include "args.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

void td_args_init(td_args *p, const char *cmd, const char *usage, int argc, char **argv) {
    memset(p, 0, sizeof *p);
    p->argc = argc;
    p->argv = argv;
    p->i = 0;
    p->cmd = cmd;
    p->usage = usage;
    p->value_taken = 1;
}

int td_args_next(td_args *p) {
    if (p->inline_v && !p->value_taken) {
        td_cli_failf(p->cmd, TD_EUSAGE, "%s takes no value (got '%s=%s')", p->arg, p->arg, p->inline_v);
        p->inline_v = NULL;
        return TD_ARG_ERROR;
    }
    p->inline_v = NULL;
    p->value_taken = 1;
    if (++p->i >= p->argc) return TD_ARG_END;
    const char *a = p->argv[p->i];
    p->arg = a;
    if (p->no_more_opts || a[0] != '-' || !a[1]) return TD_ARG_POS;
    if (!strcmp(a, "--")) {
        p->no_more_opts = 1;
        return td_args_next(p);
    }
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) return TD_ARG_HELP;
    const char *eq = a[1] == '-' ? strchr(a, '=') : NULL;
    if (eq) {
        size_t n = (size_t)(eq - a);
        if (n >= sizeof p->name) {
            td_cli_failf(p->cmd, TD_EUSAGE, "option name too long: '%.40s...'", a);
            return TD_ARG_ERROR;
        }
        memcpy(p->name, a, n);
        p->name[n] = '\0';
        p->arg = p->name;
        p->inline_v = eq + 1;
        p->value_taken = 0;
        if (!strcmp(p->name, "--help")) {
            td_cli_failf(p->cmd, TD_EUSAGE, "--help takes no value");
            return TD_ARG_ERROR;
        }
    }
    return TD_ARG_OPT;
}

int td_args_is(const td_args *p, const char *name) { return p->arg && !strcmp(p->arg, name); }

const char *td_args_value(td_args *p) {
    if (p->inline_v) {
        p->value_taken = 1;
        return p->inline_v;
    }
    if (p->i + 1 >= p->argc) {
        td_cli_failf(p->cmd, TD_EUSAGE, "%s needs a value", p->arg);
        return NULL;
    }
    return p->argv[++p->i];
}

int td_args_long(td_args *p, long long lo, long long hi, long long *out) {
    const char *v = td_args_value(p);
    if (!v) return TD_EUSAGE;
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (end == v || *end || errno || x < lo || x > hi)
        return td_cli_failf(p->cmd, TD_EUSAGE, "%s wants an integer in %lld..%lld, got '%s'", p->arg, lo, hi, v);
    *out = x;
    return TD_OK;
}

int td_args_int(td_args *p, int lo, int hi, int *out) {
    long long x;
    int rc = td_args_long(p, lo, hi, &x);
    if (!rc) *out = (int)x;
    return rc;
}

int td_args_double(td_args *p, double lo, double hi, double *out) {
    const char *v = td_args_value(p);
    if (!v) return TD_EUSAGE;
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (end == v || *end || errno || !isfinite(x) || x < lo || x > hi)
        return td_cli_failf(p->cmd, TD_EUSAGE, "%s wants a finite number in [%g, %g], got '%s'", p->arg, lo, hi, v);
    *out = x;
    return TD_OK;
}

int td_args_unknown(const td_args *p) {
    td_cli_failf(p->cmd, TD_EUSAGE, "unknown option '%s'", p->arg);
    if (p->usage) fputs(p->usage, stderr);
    else if (p->usage_fn) p->usage_fn(stderr);
    return TD_EUSAGE;
}
