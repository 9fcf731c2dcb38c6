#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

void cli_usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("sparseattn: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
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
    if (*s == '-')
        cli_usage_error("%s: '%s' must not be negative", flag, s);
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || end == s || *end)
        cli_usage_error("%s: '%s' is not an unsigned integer", flag, s);
    return (uint64_t)v;
}

const char *cli_str_arg(int argc, char **argv, int *i) { return value_of(argc, argv, i); }

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
