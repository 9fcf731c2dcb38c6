/* Fuzz target: the command line's argument parsers (tools/cli.c): the shape flags, the integer,
 * unsigned and string values and the comma-list splitter (cli_list), as `sparseattn run` and the
 * benchmarks use them, then the shape check on what was parsed. The input is argv: arguments separated by NUL bytes. A usage
 * error must come back through cli_usage_error (here a longjmp instead of exit); whatever is
 * accepted must lie in its flag's range. */
#include <errno.h>
#include <setjmp.h>

#include "cli.h"
#include "fuzz_util.h"

extern jmp_buf *cli_usage_jump; /* tools/cli.c */

#define MAX_ARGS 64

/* cli_list's entries, put back together: they must rebuild the list exactly. */
typedef struct {
    char joined[4096];
    size_t len;
    int n;
} list_back;

static void list_entry(const char *flag, const char *entry, void *ctx)
{
    list_back *lb = ctx;
    const size_t n = strlen(entry);
    FUZZ_REQUIRE(n >= 1 && n <= CLI_LIST_ENTRY_MAX && !strchr(entry, ','), "%s: entry '%s'",
                 flag, entry);
    if (lb->len + n + 1 < sizeof lb->joined) {
        if (lb->n)
            lb->joined[lb->len++] = ',';
        memcpy(lb->joined + lb->len, entry, n + 1);
        lb->len += n;
    }
    lb->n++;
}

static void parse(int argc, char **argv, sa_shape *s)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (cli_shape_flag(argc, argv, &i, s)) {
            continue;
        } else if (!strcmp(a, "--topk")) {
            long v = cli_int_arg(argc, argv, &i, 1, 1 << 24);
            FUZZ_REQUIRE(v >= 1 && v <= (1 << 24), "--topk %ld", v);
        } else if (!strcmp(a, "--stage")) {
            long v = cli_int_arg(argc, argv, &i, 1, 99);
            FUZZ_REQUIRE(v >= 1 && v <= 99, "--stage %ld", v);
        } else if (!strcmp(a, "--min-max")) { /* the whole long range */
            (void)cli_int_arg(argc, argv, &i, -2147483647L - 1, 2147483647L);
        } else if (!strcmp(a, "--seed")) {
            const char *text = argv[i + 1 < argc ? i + 1 : i];
            uint64_t v = cli_u64_arg(argc, argv, &i);
            FUZZ_REQUIRE(text[0] != '-', "negative --seed '%s' accepted as %llu", text,
                         (unsigned long long)v);
        } else if (!strcmp(a, "--list")) { /* every comma-separated flag's splitter */
            const char *v = cli_str_arg(argc, argv, &i);
            static list_back lb;
            lb.len = 0, lb.n = 0, lb.joined[0] = 0;
            const int n = cli_list(a, v, list_entry, &lb);
            size_t commas = 0;
            for (const char *c = v; *c; c++)
                commas += *c == ',';
            FUZZ_REQUIRE(n == lb.n && (size_t)n == commas + 1, "--list '%s': %d entries", v, n);
            FUZZ_REQUIRE(strlen(v) >= sizeof lb.joined || !strcmp(lb.joined, v),
                         "--list '%s' came back as '%s'", v, lb.joined);
        } else if (!strcmp(a, "--selector") || !strcmp(a, "--workload") ||
                   !strcmp(a, "--device")) {
            const char *v = cli_str_arg(argc, argv, &i);
            FUZZ_REQUIRE(v == argv[i], "string value");
        } else {
            cli_usage_error("unknown flag '%s'", a);
        }
        FUZZ_REQUIRE(i < argc, "index %d past argc %d", i, argc);
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    /* The parsers' messages go to stdio's stderr: send them nowhere (sanitizer and libFuzzer
     * reports do not go through this FILE). */
    FILE *null = fopen("/dev/null", "w");
    if (null)
        stderr = null;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* argv[0] is the command, then the input's NUL-separated pieces, each its own allocation
     * (exactly sized, so ASan sees a read past any of them). */
    char *argv[MAX_ARGS + 1];
    int argc = 0;
    argv[argc++] = strdup("run");
    size_t start = 0;
    for (size_t i = 0; i <= size && argc < MAX_ARGS; i++) {
        if (i == size || data[i] == 0) {
            if (i == size && i == start)
                break;
            char *arg = malloc(i - start + 1);
            memcpy(arg, data + start, i - start);
            arg[i - start] = 0;
            argv[argc++] = arg;
            start = i + 1;
        }
    }
    argv[argc] = NULL;

    sa_shape s = {1, 8, 8, 1024, 1024, 128};
    jmp_buf jb;
    volatile int failed = 0;
    cli_usage_jump = &jb;
    if (setjmp(jb) == 0)
        parse(argc, argv, &s);
    else
        failed = 1;
    cli_usage_jump = NULL;
    if (!failed) {
        /* Every shape flag lands in [1, its max]; the shape check decides the rest. */
        FUZZ_REQUIRE(s.batch >= 1 && s.heads_q >= 1 && s.heads_kv >= 1 && s.len_q >= 1 &&
                         s.len_kv >= 1 && s.head_dim >= 1,
                     "a shape flag accepted a value below 1");
        int code = sa_shape_check(&s);
        FUZZ_REQUIRE(code == fuzz_expected_shape_code(&s), "shape check %d", code);
        if (code == SA_OK)
            FUZZ_REQUIRE(sa_q_elems(&s) > 0 && sa_kv_elems(&s) > 0, "element counts");
    }
    for (int i = 0; i < argc; i++)
        free(argv[i]);
    return 0;
}
