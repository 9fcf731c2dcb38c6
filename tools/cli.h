/* Shared pieces of the sparseattn command-line program. */
#ifndef SA_CLI_H
#define SA_CLI_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "sparseattn.h"

/* Exit code for bad usage (unknown flag, bad number). */
#define SA_EXIT_USAGE 2

/* Print "sparseattn: <msg>" to stderr and exit(SA_EXIT_USAGE). */
void cli_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

/* Parse argv[*i + 1] as the value of flag argv[*i]; advances *i. Errors exit with code 2. */
long cli_int_arg(int argc, char **argv, int *i, long min, long max);
uint64_t cli_u64_arg(int argc, char **argv, int *i);
/* A finite number in [min, max] (max may be INFINITY), else a usage error naming the flag. */
double cli_double_arg(int argc, char **argv, int *i, double min, double max);
const char *cli_str_arg(int argc, char **argv, int *i);

/* The entries of a comma-separated list, the value of flag `flag` ("16384,32768"): each, in
 * order, through one(flag, entry, ctx) as a string of its own; returns their count. An empty
 * list or an empty entry (a leading, trailing or doubled comma, which strtok would skip without
 * a word) is a usage error naming the flag, as is an entry longer than CLI_LIST_ENTRY_MAX. Every
 * comma-separated flag of every command splits its value here; `one` judges the entry and
 * exits through cli_usage_error on a bad one. */
#define CLI_LIST_ENTRY_MAX 255
typedef void (*cli_list_fn)(const char *flag, const char *entry, void *ctx);
int cli_list(const char *flag, const char *list, cli_list_fn one, void *ctx);

/* If argv[*i] is one of the shape flags (--batch --heads-q --heads-kv --len-q --len-kv
 * --head-dim), parse its value into *s, advance *i and return 1; else return 0. Whether the
 * shape as a whole is valid is left to sa_shape_check. */
int cli_shape_flag(int argc, char **argv, int *i, sa_shape *s);
/* The shape passes sa_shape_check and `topk` blocks fit its KV blocks, else a usage error that
 * starts with `cmd` ("run: ..."). The commands that take the shape flags with --topk judge them
 * here, so that they refuse a job in the same words. */
void cli_shape_topk_check(const char *cmd, const sa_shape *s, int topk);
#define CLI_SHAPE_FLAGS_HELP \
    "  --batch N --heads-q N --heads-kv N --len-q N --len-kv N\n" \
    "  --head-dim 64|128|256 (the GPU stages: 128 only)\n"

double cli_now(void); /* monotonic seconds */

/* Prints `s` as a JSON string (quotes, backslashes and control characters escaped). */
static inline void cli_json_str(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c < 0x20)
            printf("\\u%04x", c);
        else
            putchar(c);
    }
    putchar('"');
}

/* Whether the program was built with CUDA. A flag parser judges what only a CUDA build can know
 * (the stage registry, which selectors have a GPU function) through this constant, so that one
 * parser serves both builds: without CUDA it accepts every value the CUDA build might, and the
 * command says "built without CUDA" after parsing. */
#ifdef SA_HAVE_CUDA
#define CLI_CUDA_BUILT 1
#else
#define CLI_CUDA_BUILT 0
#endif

/* The values `--stage ID` parses to (every command that takes it): registered ids lie inside. */
#define CLI_STAGE_ID_MIN 1
#define CLI_STAGE_ID_MAX 99

/* GPU stages by role, never by id: the registry (cuda/stages.c) is the only list of ids. */
static inline int cli_stage_sparse(const sa_stage *st)
{
    return st && (st->roles & SA_ROLE_SPARSE);
}

/* The tile-list stage the tools run on `a`: the registry's SA_ROLE_DEFAULT_TILE stage where its
 * check accepts `a`, else the first SA_ROLE_SPARSE stage whose check does; NULL when none does.
 * With a == NULL (no shape yet): the default tile stage, else the first sparse stage. */
static inline const sa_stage *cli_tile_stage(const sa_gpu_attn *a)
{
    const sa_stage *st = sa_stage_with(SA_ROLE_SPARSE | SA_ROLE_DEFAULT_TILE);
    if (st && (!a || st->check(a) == SA_OK))
        return st;
    for (int i = 0; i < sa_stage_count(); i++) {
        st = sa_stage_at(i);
        if (cli_stage_sparse(st) && (!a || st->check(a) == SA_OK))
            return st;
    }
    return NULL;
}

/* What a --stage ID of command `cmd` ("run", "bench sparse") must name: CLI_STAGE_SPARSE a stage
 * with SA_ROLE_SPARSE; CLI_STAGE_DENSE_OR_TILE a stage without it or the default tile-list stage
 * (bench dense runs that one with every block listed). With CUDA built, an id the registry lacks
 * or a stage of the other kind is a usage error naming the stages of the right kind; the stage is
 * returned. Without CUDA the registry is empty and every id passes (NULL is returned). */
enum { CLI_STAGE_SPARSE, CLI_STAGE_DENSE_OR_TILE };
static inline int cli_stage_of_kind(const sa_stage *st, int kind)
{
    return kind == CLI_STAGE_SPARSE ? cli_stage_sparse(st)
                                    : !cli_stage_sparse(st) || (st->roles & SA_ROLE_DEFAULT_TILE);
}
static inline const sa_stage *cli_stage_judge(const char *cmd, int id, int kind)
{
    if (!CLI_CUDA_BUILT)
        return NULL; /* the registry is empty: any id in range passes, the command says why not */
    const sa_stage *st = sa_stage_by_id(id);
    if (st && cli_stage_of_kind(st, kind))
        return st;
    char have[512] = "";
    size_t n = 0;
    for (int i = 0; i < sa_stage_count() && n < sizeof have - 48; i++)
        if (cli_stage_of_kind(sa_stage_at(i), kind))
            n += (size_t)snprintf(have + n, sizeof have - n, " %d (%s)", sa_stage_at(i)->id,
                                  sa_stage_at(i)->name);
    const char *what = kind == CLI_STAGE_SPARSE ? "sparse stages" : "dense or tile-list stages";
    if (!st)
        cli_usage_error("%s: --stage %d: no such stage in the registry (%s:%s)", cmd, id, what,
                        n ? have : " none");
    cli_usage_error("%s: --stage %d (%s) is a %s stage (%s:%s)", cmd, id, st->name,
                    cli_stage_sparse(st) ? "sparse" : "dense", what, n ? have : " none");
}

/* The width of a column of selector names: the longest name in the selector registry, at least
 * `min` (the header's, or another row's such as "dense"). */
static inline int cli_selector_width(int min)
{
    int w = min;
    for (int i = 0; i < sa_selector_count(); i++) {
        const int n = (int)strlen(sa_selector_at(i)->name);
        w = n > w ? n : w;
    }
    return w;
}

/* Prints "selectors: NAME..." and, on the next line, "workloads: NAME..." (no newline after):
 * the registries a job's --selector and --workload pick from, as the help texts list them. */
static inline void cli_print_registries(FILE *f)
{
    fputs("selectors:", f);
    for (int i = 0; i < sa_selector_count(); i++)
        fprintf(f, " %s", sa_selector_at(i)->name);
    fputs("\nworkloads:", f);
    for (int i = 0; i < sa_workload_count(); i++)
        fprintf(f, " %s", sa_workload_at(i)->name);
}

/* Prints " ID (name)" for every registered stage that has all of `with` and none of `without`,
 * or " none registered in this build". Help text names stages only through this. */
static inline void cli_print_stages(FILE *f, unsigned with, unsigned without)
{
    int any = 0;
    for (int i = 0; i < sa_stage_count(); i++) {
        const sa_stage *st = sa_stage_at(i);
        if ((st->roles & with) == with && !(st->roles & without)) {
            fprintf(f, " %d (%s)", st->id, st->name);
            any = 1;
        }
    }
    fputs(any ? "" : " none registered in this build", f);
}

/* A progress line on stderr, overwritten in place; cli_progress_done ends it. Silent when stderr
 * is not a terminal unless forced. */
void cli_progress(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void cli_progress_done(void);

/* Subcommands: each returns the process exit code. */
int cmd_run(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_select_eval(int argc, char **argv);
int cmd_select_eval_activations(int argc, char **argv); /* select-eval --activations FILE */

/* Benchmarks (argv starts after "bench <name>"). */
int bench_reference(int argc, char **argv);
int bench_dense(int argc, char **argv);
int bench_sparse(int argc, char **argv);
int bench_selectors(int argc, char **argv);
int bench_kvcentric(int argc, char **argv);
int bench_longctx(int argc, char **argv);

#endif
