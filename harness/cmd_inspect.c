/* placeholder: being written */
#include "cli.h"
int td_cmd_inspect(int argc, char **argv) {
    (void)argc;
    (void)argv;
    return td_cli_failf("inspect", TD_EINTERNAL, "not built yet");
}
