/* Placeholder until this benchmark lands. */
#include "cli.h"
int bench_reference(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "sparseattn: %s is not available in this build yet\n", "bench_reference");
    return 1;
}
