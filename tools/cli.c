#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

/* Where a usage error goes after its message: exit(SA_EXIT_USAGE), unless a caller that must not
 * exit (the argument fuzzer, fuzz/fuzz_cli.c, which declares it) points this at a jmp_buf; the
 * error then longjmps there. The program never sets it. */
jmp_buf *cli_usage_jump;

void cli_usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("sparseattn: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    if (cli_usage_jump)
        longjmp(*cli_usage_jump, 1);
    exit(SA_EXIT_USAGE);
}

static const char *value_of(int argc, char **argv, int *i)
{
    if (*i + 1 >= argc)
        cli_usage_error("flag %s needs a value", argv[*i]);
    return argv[++*i];
}

long cli_int_arg(int argc, char **argv, int *i, long min, long max)
{
    const char *flag = argv[*i];
    const char *s = value_of(argc, argv, i);
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end)
        cli_usage_error("%s: '%s' is not an integer", flag, s);
    if (v < min || v > max)
        cli_usage_error("%s: %ld is outside [%ld, %ld]", flag, v, min, max);
    return v;
}

uint64_t cli_u64_arg(int argc, char **argv, int *i)
{
    const char *flag = argv[*i];
    const char *s = value_of(argc, argv, i);
    char *end;
    errno = 0;
    /* Digits only, in base 10: strtoull would skip a space before a '-' and read 010 as 8. */
    if (*s < '0' || *s > '9')
        cli_usage_error("%s: '%s' is not an unsigned integer", flag, s);
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end)
        cli_usage_error("%s: '%s' is not an unsigned integer", flag, s);
    return (uint64_t)v;
}

double cli_double_arg(int argc, char **argv, int *i, double min, double max)
{
    const char *flag = argv[*i];
    const char *s = value_of(argc, argv, i);
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v))
        cli_usage_error("%s: '%s' is not a finite number", flag, s);
    if (v < min || v > max)
        cli_usage_error("%s: %g is outside [%g, %g]", flag, v, min, max);
    return v;
}

const char *cli_str_arg(int argc, char **argv, int *i) { return value_of(argc, argv, i); }

int cli_list(const char *flag, const char *list, cli_list_fn one, void *ctx)
{
    if (!*list)
        cli_usage_error("%s: empty list", flag);
    int n = 0;
    for (const char *e = list;; n++) {
        const size_t len = strcspn(e, ",");
        if (!len)
            cli_usage_error("%s: '%s' has an empty entry (a leading, trailing or doubled comma)",
                            flag, list);
        if (len > CLI_LIST_ENTRY_MAX)
            cli_usage_error("%s: an entry of '%.40s...' is longer than %d characters", flag, list,
                            CLI_LIST_ENTRY_MAX);
        char entry[CLI_LIST_ENTRY_MAX + 1];
        memcpy(entry, e, len);
        entry[len] = 0;
        one(flag, entry, ctx);
        if (!e[len])
            return n + 1;
        e += len + 1;
    }
}

int cli_shape_flag(int argc, char **argv, int *i, sa_shape *s)
{
    static const struct {
        const char *flag;
        size_t offset;
        long max;
    } fields[] = {
        {"--batch", offsetof(sa_shape, batch), 1 << 16},
        {"--heads-q", offsetof(sa_shape, heads_q), 1 << 16},
        {"--heads-kv", offsetof(sa_shape, heads_kv), 1 << 16},
        {"--len-q", offsetof(sa_shape, len_q), 1 << 24},
        {"--len-kv", offsetof(sa_shape, len_kv), 1 << 24},
        {"--head-dim", offsetof(sa_shape, head_dim), 1 << 12},
    };
    for (size_t f = 0; f < sizeof fields / sizeof fields[0]; f++)
        if (!strcmp(argv[*i], fields[f].flag)) {
            int v = (int)cli_int_arg(argc, argv, i, 1, fields[f].max);
            memcpy((char *)s + fields[f].offset, &v, sizeof v);
            return 1;
        }
    return 0;
}

void cli_shape_topk_check(const char *cmd, const sa_shape *s, int topk)
{
    int err = sa_shape_check(s);
    if (err)
        cli_usage_error("%s: %s", cmd, sa_strerror(err));
    if (topk > sa_kv_blocks(s))
        cli_usage_error("%s: --topk %d is larger than the %d KV blocks of len-kv %d", cmd, topk,
                        sa_kv_blocks(s), s->len_kv);
}

double cli_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int progress_open;

void cli_progress(const char *fmt, ...)
{
    if (!isatty(STDERR_FILENO) && !getenv("SA_PROGRESS"))
        return;
    va_list ap;
    va_start(ap, fmt);
    fputs("\r\033[K", stderr);
    vfprintf(stderr, fmt, ap);
    fflush(stderr);
    va_end(ap);
    progress_open = 1;
}

void cli_progress_done(void)
{
    if (progress_open)
        fputs("\r\033[K", stderr);
    progress_open = 0;
}
