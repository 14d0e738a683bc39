/* placeholder: being written */
#include "cli.h"
int td_cmd_fixture(int argc, char **argv) {
    (void)argc;
    (void)argv;
    return td_cli_failf("fixture", TD_EINTERNAL, "not built yet");
}
