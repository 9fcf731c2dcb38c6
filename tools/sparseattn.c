/* sparseattn: the command-line program. Subcommands live in cmd_*.c and bench_*.c. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} commands[] = {
    {"run", cmd_run, "run the block-sparse pipeline on generated inputs (default shape suits a 2-core CPU)"},
    {"bench", cmd_bench, "benchmarks: reference | dense | sparse | selectors | kvcentric | longctx"},
    {"select-eval", cmd_select_eval, "selection quality of every registered selector on every workload"},
};
#define NCOMMANDS (int)(sizeof commands / sizeof commands[0])

static void usage(FILE *f)
{
    fprintf(f, "usage: sparseattn COMMAND [flags]   (sparseattn COMMAND --help for its flags)\n\n");
    for (int i = 0; i < NCOMMANDS; i++)
        fprintf(f, "  %-12s %s\n", commands[i].name, commands[i].help);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return SA_EXIT_USAGE;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    for (int i = 0; i < NCOMMANDS; i++)
        if (!strcmp(argv[1], commands[i].name))
            return commands[i].fn(argc - 1, argv + 1);
    cli_usage_error("unknown command '%s' (sparseattn --help lists them)", argv[1]);
}
