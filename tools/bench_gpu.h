/* Pieces shared by the GPU benchmarks (bench_dense.c, bench_sparse.c, bench_selectors.c,
 * bench_kvcentric.c, bench_longctx*.c): their common flags, the measured copy-bandwidth ceiling,
 * the floors and JSON output, over the program's GPU bench harness (bench_harness.h). Their
 * shapes and tolerances come from bench/shapes.h, which bench/peers.py reads too. Header-only so
 * that each benchmark stays one file in tools/meson.build. */
#ifndef SA_BENCH_GPU_H
#define SA_BENCH_GPU_H

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* bf16 dense GEMM rate used for the FLOP floor when none is given: 8192^3 torch.matmul on
 * random data on the H200 (bench/peers.py measures and prints it; pass its number with
 * --gemm-tflops to use this run's). */
#define BENCH_GEMM_TFLOPS_DEFAULT 790.0
/* Bytes per D2D copy for the copy-bandwidth ceiling (read + written counted: 2 GiB moved). */
#define BENCH_COPY_BYTES ((size_t)1 << 30)
#define BENCH_COPY_REPS 10
/* At most this many input sets to rotate among (each set is Q, K, V, O, LSE). */
#define BENCH_MAX_SETS 8

typedef struct bench_flags {
    int stage_id; /* -1: every stage of the right kind */
    int reps, warmup;
    int json;
    int no_validate;
    double gemm_tflops;
    uint64_t seed;
} bench_flags;

/* If argv[*i] is one of the timing flags (--reps --warmup --gemm-tflops --seed --json), parse its
 * value into *f, advance *i and return 1; else return 0. bench_parse and bench kvcentric take
 * them alike, and bench longctx beside flags of its own. */
static inline int bench_timing_flag(int argc, char **argv, int *i, bench_flags *f)
{
    const char *a = argv[*i];
    if (!strcmp(a, "--reps"))
        f->reps = (int)cli_int_arg(argc, argv, i, 1, 100000);
    else if (!strcmp(a, "--warmup"))
        f->warmup = (int)cli_int_arg(argc, argv, i, 0, 100000);
    else if (!strcmp(a, "--gemm-tflops"))
        f->gemm_tflops = cli_double_arg(argc, argv, i, 1.0, 1e5);
    else if (!strcmp(a, "--seed"))
        f->seed = cli_u64_arg(argc, argv, i);
    else if (!strcmp(a, "--json"))
        f->json = 1;
    else
        return 0;
    return 1;
}

/* Parses the flags both benchmarks take; `sparse` enables --no-validate. Exits on --help. */
static inline void bench_parse(int argc, char **argv, const char *name, int sparse,
                               void (*usage)(FILE *), bench_flags *f)
{
    f->stage_id = -1;
    f->reps = 30;
    f->warmup = 5;
    f->json = 0;
    f->no_validate = 0;
    f->gemm_tflops = BENCH_GEMM_TFLOPS_DEFAULT;
    f->seed = 2026;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            exit(0);
        } else if (!strcmp(a, "--stage"))
            f->stage_id = (int)cli_int_arg(argc, argv, &i, CLI_STAGE_ID_MIN, CLI_STAGE_ID_MAX);
        else if (bench_timing_flag(argc, argv, &i, f))
            continue;
        else if (sparse && !strcmp(a, "--no-validate"))
            f->no_validate = 1;
        else
            cli_usage_error("bench %s: unknown flag '%s' (sparseattn bench %s --help)", name, a,
                            name);
    }
    /* With CUDA the id must name a stage of the bench's kind (bench dense also takes the default
     * tile-list stage, run with every block listed); without CUDA the registry is empty, so any id
     * in range passes and the bench says "built without CUDA" (bench_not_built). */
    if (f->stage_id >= 0) {
        char cmd[32];
        snprintf(cmd, sizeof cmd, "bench %s", name);
        cli_stage_judge(cmd, f->stage_id, sparse ? CLI_STAGE_SPARSE : CLI_STAGE_DENSE_OR_TILE);
    }
}

/* Milliseconds for `flops` at `tflops`, and for `bytes` at `bytes_per_s`. */
static inline double bench_flop_ms(double flops, double tflops) { return flops / (tflops * 1e9); }
static inline double bench_byte_ms(double bytes, double bps) { return bytes / bps * 1e3; }
static inline double bench_tflops(double flops, double ms) { return flops / (ms * 1e9); }
/* qsort's comparator of doubles, ascending (medians of rounds and of timeline stamps). */
static inline int bench_cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
/* QK^T and PV over every (query, key) pair: 2 GEMMs of 2*D FLOPs per pair. */
static inline double bench_dense_flops(const sa_shape *s)
{
    return 4.0 * s->batch * s->heads_q * (double)s->len_q * s->len_kv * s->head_dim;
}

#ifdef SA_HAVE_CUDA
#include "bench_harness.h"

typedef struct bench_env {
    bh_gpu *g;
    bh_device dev;
    double copy_bps; /* bytes read + written per second, measured in this run */
} bench_env;

/* Opens the device, prints it and measures the copy ceiling. On failure prints why and returns
 * the process exit code (1); 0 on success. */
static inline int bench_open(const char *name, const bench_flags *f, bench_env *e)
{
    int rc = bh_open(&e->g, &e->dev);
    if (rc) {
        fprintf(stderr, "sparseattn: bench %s: %s\n", name,
                rc == SA_ERR_CUDA ? bh_last_error() : sa_strerror(rc));
        return 1;
    }
    rc = bh_copy_bandwidth(e->g, BENCH_COPY_BYTES, BENCH_COPY_REPS, &e->copy_bps);
    if (rc) {
        fprintf(stderr, "sparseattn: bench %s: copy bandwidth: %s\n", name, bh_last_error());
        bh_close(e->g);
        return 1;
    }
    if (f->json) {
        printf("{\"bench\":\"%s\",\"kind\":\"device\",\"device\":", name);
        cli_json_str(e->dev.name);
        printf(",\"cc\":\"%d.%d\",\"sms\":%d,\"l2_bytes\":%zu,\"mem_total\":%zu,"
               "\"copy_bytes_per_s\":%.6g,\"copy_bytes\":%zu,\"gemm_tflops\":%.6g,"
               "\"gemm_tflops_source\":\"%s\",\"seed\":%llu,\"reps\":%d,\"warmup\":%d}\n",
               e->dev.cc_major, e->dev.cc_minor, e->dev.sms, e->dev.l2_bytes,
               e->dev.mem_total, e->copy_bps, BENCH_COPY_BYTES, f->gemm_tflops,
               f->gemm_tflops == BENCH_GEMM_TFLOPS_DEFAULT ? "default" : "flag",
               (unsigned long long)f->seed, f->reps, f->warmup);
    } else {
        printf("device: %s (cc %d.%d, %d SMs, L2 %.0f MB, %.1f GiB)\n", e->dev.name,
               e->dev.cc_major, e->dev.cc_minor, e->dev.sms, e->dev.l2_bytes / 1e6,
               e->dev.mem_total / 1073741824.0);
        printf("copy bandwidth (cudaMemcpy D2D %.0f GiB, read+written): %.2f TB/s, measured now\n",
               BENCH_COPY_BYTES / 1073741824.0, e->copy_bps / 1e12);
        printf("bf16 GEMM rate for the FLOP floor: %.0f TFLOP/s (%s)\n", f->gemm_tflops,
               f->gemm_tflops == BENCH_GEMM_TFLOPS_DEFAULT
                   ? "default: 8192^3 torch.matmul, see bench/peers.py; set --gemm-tflops"
                   : "--gemm-tflops");
        printf("timing: CUDA events, %d warm-up launches (at least one per input set), median of "
               "%d; seed %llu\n",
               f->warmup, f->reps, (unsigned long long)f->seed);
    }
    fflush(stdout);
    return 0;
}

/* Creates up to BENCH_MAX_SETS input sets for shape s (enough to rotate through twice the L2).
 * Returns the count, or a negative sa_status with the reason printed. */
static inline int bench_sets(const char *name, bench_env *e, const sa_shape *s, uint64_t seed,
                             bh_set *sets)
{
    int rc = bh_set_create(e->g, s, seed, &sets[0]);
    if (rc) {
        fprintf(stderr, "sparseattn: bench %s: inputs: %s\n", name,
                rc == SA_ERR_CUDA || rc == SA_ERR_NOMEM ? bh_last_error() : sa_strerror(rc));
        return rc;
    }
    int n = bh_sets_needed(&e->dev, sets[0].bytes, BENCH_MAX_SETS);
    for (int i = 1; i < n; i++) {
        rc = bh_set_create(e->g, s, seed + (uint64_t)i * 7919, &sets[i]);
        if (rc) {
            fprintf(stderr, "sparseattn: bench %s: inputs: %s\n", name, bh_last_error());
            for (int j = 0; j < i; j++)
                bh_set_destroy(&sets[j]);
            return rc;
        }
    }
    return n;
}

static inline void bench_sets_free(bh_set *sets, int n)
{
    for (int i = 0; i < n; i++)
        bh_set_destroy(&sets[i]);
}

/* Why a call failed, in words: CUDA/allocation failures carry detail from the harness. */
static inline const char *bench_why(int rc)
{
    return rc == SA_ERR_CUDA || rc == SA_ERR_NOMEM ? bh_last_error() : sa_strerror(rc);
}
#else
/* What every GPU bench answers in a build without CUDA, once its flags have parsed (so a usage
 * error still exits 2 there): the message, then exit status 1. */
static inline int bench_not_built(const char *name)
{
    fprintf(stderr, "sparseattn: bench %s: built without CUDA (configure with -Dcuda=enabled)\n",
            name);
    return 1;
}
#endif /* SA_HAVE_CUDA */

#endif
