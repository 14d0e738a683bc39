/* placeholder: being written */
#include "cli.h"
int td_cmd_run(int argc, char **argv) {
    (void)argc;
    (void)argv;
    return td_cli_failf("run", TD_EINTERNAL, "not built yet");
}
