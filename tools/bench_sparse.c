/* Placeholder until this benchmark lands. */
#include "cli.h"
int bench_sparse(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "sparseattn: %s is not available in this build yet\n", "bench_sparse");
    return 1;
}
