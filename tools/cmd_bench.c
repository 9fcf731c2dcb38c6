/* "sparseattn bench NAME": one table of benchmarks, each in its own file. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} benches[] = {
    {"reference", bench_reference, "CPU reference GFLOP/s against OpenBLAS sgemm"},
    {"dense", bench_dense, "every dense GPU stage of the registry (TFLOP/s)"},
    {"sparse", bench_sparse, "every block-sparse GPU stage of the registry (useful TFLOP/s)"},
    {"selectors", bench_selectors, "GPU selectors and the selector -> attention pipeline"},
    {"kvcentric", bench_kvcentric, "KV-centric attention for per-query lists"},
    {"longctx", bench_longctx, "schedules for per-query lists at long context (16K-128K)"},
};
#define NBENCH (int)(sizeof benches / sizeof benches[0])

int cmd_bench(int argc, char **argv)
{
    /* --help, -h and help, as at the top level (sparseattn.c). */
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") ||
        !strcmp(argv[1], "help")) {
        FILE *f = argc < 2 ? stderr : stdout;
        fprintf(f, "usage: sparseattn bench NAME [flags]   (sparseattn bench NAME --help for its "
                   "flags)\n\n");
        for (int i = 0; i < NBENCH; i++)
            fprintf(f, "  %-10s %s\n", benches[i].name, benches[i].help);
        return argc < 2 ? SA_EXIT_USAGE : 0;
    }
    for (int i = 0; i < NBENCH; i++)
        if (!strcmp(argv[1], benches[i].name))
            return benches[i].fn(argc - 1, argv + 1);
    cli_usage_error("unknown benchmark '%s' (sparseattn bench --help lists them)", argv[1]);
}
