/* Placeholder until this benchmark lands. */
#include "cli.h"
int cmd_select_eval(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "sparseattn: %s is not available in this build yet\n", "cmd_select_eval");
    return 1;
}
