/* "sparseattn bench reference": the CPU reference's useful GFLOP/s on block-sparse attention,
 * against OpenBLAS sgemm on a large square product with the same threads, measured in the same
 * run. The reference's floor is that sgemm rate: its two GEMMs per tile are all its FLOPs. */
#include <cblas.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* Side of the sgemm peer: 2048 (17 GFLOP) reaches OpenBLAS's steady rate on a few cores; with
 * more threads each gets too little of it, so above GEMM_WIDE_THREADS the side doubles. */
#define GEMM_N 2048
#define GEMM_WIDE_THREADS 4
/* Flag defaults and limits (usage() prints them). */
#define REF_TOPK 16
#define REF_SEED 1
#define REF_REPS 5
#define REF_MAX_REPS 1000

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *t, int n)
{
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: sparseattn bench reference [--batch N] [--heads-q N] [--heads-kv N]\n"
               "         [--len-q N] [--len-kv N] [--head-dim 64|128|256] [--topk K] [--seed S]\n"
               "         [--reps N] [--per-query] [--json]\n"
               "Default: batch 1, 16 query heads sharing 1 KV head, head dim 128, 4096 queries,\n"
               "16384 keys, 16 of 128 blocks per query tile (random, one list per KV head).\n"
               "Reports useful GFLOP/s (4 * B * Hq * Sq * selected keys * D, median of --reps after\n"
               "one warm-up) next to OpenBLAS sgemm (%d^3; %d^3 above %d threads) with the same\n"
               "threads, the two alternating rep by rep.\n"
               "--topk K: blocks per row, at most len-kv's blocks of 128 (default %d).\n"
               "--seed S: seed of the inputs and lists (default %d).\n"
               "--reps N: timed reps, %d..%d (default %d).\n"
               "--per-query times sa_ref_query_sparse on random per-query lists (topk per query)\n"
               "instead of sa_ref_tile_sparse.\n", GEMM_N, 2 * GEMM_N, GEMM_WIDE_THREADS,
            REF_TOPK, REF_SEED, 1, REF_MAX_REPS, REF_REPS);
}

/* Useful FLOPs: 4 D per (query, selected key), the final block counting only its valid keys. */
static double tile_flops(const sa_shape *s, const sa_tile_lists *l)
{
    const int tiles = sa_q_tiles(s), hpl = s->heads_q / l->list_heads;
    double keys = 0;
    for (int b = 0; b < s->batch; b++)
        for (int h = 0; h < l->list_heads; h++)
            for (int t = 0; t < tiles; t++) {
                size_t row = ((size_t)b * l->list_heads + h) * tiles + t;
                int rows_q = s->len_q - t * SA_TILE < SA_TILE ? s->len_q - t * SA_TILE : SA_TILE;
                for (int j = 0; j < l->max_blocks; j++)
                    keys += (double)rows_q * hpl *
                            sa_block_len(s, l->indices[row * l->max_blocks + j]);
            }
    return 4.0 * keys * s->head_dim;
}

static double query_flops(const sa_shape *s, const sa_query_lists *l)
{
    const int group = s->heads_q / s->heads_kv;
    double keys = 0;
    for (size_t row = 0; row < sa_query_rows(s); row++)
        for (int j = 0; j < l->max_blocks; j++)
            keys += (double)group * sa_block_len(s, l->indices[row * l->max_blocks + j]);
    return 4.0 * keys * s->head_dim;
}

/* The sgemm peer: square products on random FP32 operands. */
typedef struct gemm_peer {
    int n;
    float *a, *b, *c;
} gemm_peer;

static int gemm_init(gemm_peer *g, int side)
{
    g->n = side;
    size_t n = (size_t)side * side;
    g->a = malloc(n * sizeof *g->a);
    g->b = malloc(n * sizeof *g->b);
    g->c = malloc(n * sizeof *g->c);
    if (!g->a || !g->b || !g->c)
        return SA_ERR_NOMEM;
    sa_rng r;
    sa_rng_seed(&r, 7);
    for (size_t i = 0; i < n; i++) {
        g->a[i] = (float)sa_rng_normal(&r);
        g->b[i] = (float)sa_rng_normal(&r);
    }
    return SA_OK;
}

static double gemm_seconds(const gemm_peer *g, int threads)
{
    openblas_set_num_threads(threads);
    double t0 = cli_now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, g->n, g->n, g->n, 1.0f, g->a, g->n,
                g->b, g->n, 0.0f, g->c, g->n);
    return cli_now() - t0;
}

static void gemm_free(gemm_peer *g)
{
    free(g->a);
    free(g->b);
    free(g->c);
}

int bench_reference(int argc, char **argv)
{
    sa_shape s = {.batch = 1, .heads_q = 16, .heads_kv = 1, .len_q = 4096, .len_kv = 16384,
                  .head_dim = 128};
    int topk = REF_TOPK, reps = REF_REPS, json = 0, per_query = 0;
    uint64_t seed = REF_SEED;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            usage(stdout);
            return 0;
        } else if (cli_shape_flag(argc, argv, &i, &s))
            continue;
        else if (!strcmp(f, "--topk"))
            topk = (int)cli_int_arg(argc, argv, &i, 1, 1 << 20);
        else if (!strcmp(f, "--seed"))
            seed = cli_u64_arg(argc, argv, &i);
        else if (!strcmp(f, "--reps"))
            reps = (int)cli_int_arg(argc, argv, &i, 1, REF_MAX_REPS);
        else if (!strcmp(f, "--json"))
            json = 1;
        else if (!strcmp(f, "--per-query"))
            per_query = 1;
        else
            cli_usage_error("bench reference: unknown flag '%s' (--help lists them)", f);
    }
    int err = sa_shape_check(&s);
    if (err)
        cli_usage_error("bench reference: %s", sa_strerror(err));
    if (topk > sa_kv_blocks(&s))
        cli_usage_error("bench reference: --topk %d exceeds the %d KV blocks", topk,
                        sa_kv_blocks(&s));

    sa_rng r;
    sa_rng_seed(&r, seed);
    size_t nq = sa_q_elems(&s), nkv = sa_kv_elems(&s);
    sa_tile_lists l = {.list_heads = s.heads_kv, .max_blocks = topk};
    sa_query_lists ql = {.max_blocks = topk};
    size_t rows = per_query ? sa_query_rows(&s) : sa_tile_rows(&s, &l);
    uint16_t *q = malloc(nq * 2), *k = malloc(nkv * 2), *v = malloc(nkv * 2), *o = malloc(nq * 2);
    float *lse = malloc(sa_lse_elems(&s) * sizeof *lse);
    int32_t *idx = malloc(rows * topk * sizeof *idx);
    double *t = malloc((size_t)reps * sizeof *t);
    if (!q || !k || !v || !o || !lse || !idx || !t) {
        fprintf(stderr, "sparseattn: bench reference: out of memory\n");
        return 1;
    }
    sa_rng_fill_bf16(&r, q, nq, 1.0f);
    sa_rng_fill_bf16(&r, k, nkv, 1.0f);
    sa_rng_fill_bf16(&r, v, nkv, 1.0f);
    err = per_query ? sa_random_query_lists(&s, topk, seed, idx)
                    : sa_random_tile_lists(&s, l.list_heads, topk, SA_LISTS_INDEPENDENT, seed, idx);
    if (err) {
        fprintf(stderr, "sparseattn: bench reference: %s\n", sa_strerror(err));
        return 1;
    }
    l.indices = ql.indices = idx;
    sa_outputs out = {.o = o, .lse = lse};
    const double flops = per_query ? query_flops(&s, &ql) : tile_flops(&s, &l);
    const char *path = per_query ? "per-query" : "tile-sparse";
    const int threads = omp_get_max_threads();

    /* Reference and sgemm alternate rep by rep, so load from elsewhere hits both alike. */
    gemm_peer g;
    double *tg = malloc((size_t)reps * sizeof *tg);
    if (!tg || gemm_init(&g, threads > GEMM_WIDE_THREADS ? 2 * GEMM_N : GEMM_N)) {
        fprintf(stderr, "sparseattn: bench reference: out of memory\n");
        return 1;
    }
    for (int i = -1; i < reps; i++) {
        cli_progress("reference and sgemm: rep %d/%d (%.1f GFLOP each)", i + 1, reps, flops * 1e-9);
        double t0 = cli_now();
        err = per_query ? sa_ref_query_sparse(&s, q, k, v, &ql, NULL, &out)
                        : sa_ref_tile_sparse(&s, q, k, v, &l, NULL, &out);
        double t1 = cli_now();
        if (err) {
            cli_progress_done();
            fprintf(stderr, "sparseattn: bench reference: %s\n", sa_strerror(err));
            return 1;
        }
        double tgemm = gemm_seconds(&g, threads);
        if (i >= 0) {
            t[i] = t1 - t0;
            tg[i] = tgemm;
        }
    }
    cli_progress_done();
    double sec = median(t, reps), ref_rate = flops / sec * 1e-9;
    double gemm = 2.0 * g.n * g.n * (double)g.n / median(tg, reps) * 1e-9;
    const int gemm_n = g.n;
    gemm_free(&g);
    free(tg);

    if (json)
        printf("{\"bench\":\"reference\",\"path\":\"%s\",\"openblas_core\":\"%s\","
               "\"batch\":%d,\"heads_q\":%d,\"heads_kv\":%d,\"len_q\":%d,\"len_kv\":%d,"
               "\"head_dim\":%d,\"topk\":%d,\"seed\":%llu,\"reps\":%d,\"threads\":%d,"
               "\"useful_gflop\":%.3f,\"ref_seconds\":%.6f,\"ref_gflops\":%.2f,"
               "\"sgemm_n\":%d,\"sgemm_gflops\":%.2f,\"ratio\":%.4f}\n",
               path, openblas_get_corename(), s.batch, s.heads_q, s.heads_kv, s.len_q, s.len_kv,
               s.head_dim, topk, (unsigned long long)seed, reps, threads, flops * 1e-9, sec,
               ref_rate, gemm_n, gemm, gemm > 0 ? ref_rate / gemm : 0.0);
    else {
        printf("CPU reference, %s: B=%d Hq=%d Hkv=%d D=%d Sq=%d Skv=%d, %d of %d blocks per %s, "
               "%d threads\n",
               path, s.batch, s.heads_q, s.heads_kv, s.head_dim, s.len_q, s.len_kv, topk,
               sa_kv_blocks(&s), per_query ? "query" : "tile", threads);
        printf("  reference      %8.2f GFLOP/s useful (%.1f GFLOP in %.3f s, median of %d)\n",
               ref_rate, flops * 1e-9, sec, reps);
        printf("  OpenBLAS sgemm %8.2f GFLOP/s (%d^3, same threads, core %s)\n", gemm, gemm_n,
               openblas_get_corename());
        printf("  ratio          %8.2f%% of sgemm\n", gemm > 0 ? 100.0 * ref_rate / gemm : 0.0);
    }
    free(q);
    free(k);
    free(v);
    free(o);
    free(lse);
    free(idx);
    free(t);
    return 0;
}
