/* Shared pieces of the sparseattn command-line program. */
#ifndef SA_CLI_H
#define SA_CLI_H

#include <stdint.h>
#include <stdio.h>

#include "sparseattn.h"

/* Exit code for bad usage (unknown flag, bad number). */
#define SA_EXIT_USAGE 2

/* Print "sparseattn: <msg>" to stderr and exit(SA_EXIT_USAGE). */
void cli_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

/* Parse argv[*i + 1] as the value of flag argv[*i]; advances *i. Errors exit with code 2. */
long cli_int_arg(int argc, char **argv, int *i, long min, long max);
uint64_t cli_u64_arg(int argc, char **argv, int *i);
const char *cli_str_arg(int argc, char **argv, int *i);

/* If argv[*i] is one of the shape flags (--batch --heads-q --heads-kv --len-q --len-kv
 * --head-dim), parse its value into *s, advance *i and return 1; else return 0. Whether the
 * shape as a whole is valid is left to sa_shape_check. */
int cli_shape_flag(int argc, char **argv, int *i, sa_shape *s);
#define CLI_SHAPE_FLAGS_HELP \
    "  --batch N --heads-q N --heads-kv N --len-q N --len-kv N --head-dim 64|128\n"

double cli_now(void); /* monotonic seconds */

/* A progress line on stderr, overwritten in place; cli_progress_done ends it. Silent when stderr
 * is not a terminal unless forced. */
void cli_progress(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void cli_progress_done(void);

/* Subcommands: each returns the process exit code. */
int cmd_run(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_select_eval(int argc, char **argv);

/* Benchmarks (argv starts after "bench <name>"). */
int bench_reference(int argc, char **argv);
int bench_dense(int argc, char **argv);
int bench_sparse(int argc, char **argv);
int bench_selectors(int argc, char **argv);
int bench_kvcentric(int argc, char **argv);

#endif
