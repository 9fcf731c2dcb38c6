/* "sparseattn run": the main job. Generate inputs from a seed, choose blocks, run block-sparse
 * attention, and compare against dense attention. The default shape suits a 2-core CPU. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

typedef struct run_cfg {
    sa_shape s;
    int topk;
    uint64_t seed;
    const char *device;   /* "cpu" or "cuda" */
    const char *selector; /* registry name, or "random" lists */
    int json;
    int skip_dense;
} run_cfg;

static void run_usage(FILE *f)
{
    fprintf(f,
            "usage: sparseattn run [flags]\n"
            "  --batch N --heads-q N --heads-kv N --len-q N --len-kv N --head-dim 64|128\n"
            "  --topk K          blocks of 128 keys per query tile (default 16)\n"
            "  --seed S          RNG seed for inputs and random lists (default 1)\n"
            "  --selector NAME   a registered selector, or 'random' (default)\n"
            "  --device cpu|cuda (default cpu)\n"
            "  --no-dense        skip the dense comparison\n"
            "  --json            one machine-readable line instead of the table\n"
            "selectors:");
    for (int i = 0; i < sa_selector_count(); i++)
        fprintf(f, " %s", sa_selector_at(i)->name);
    fprintf(f, " random\n");
}

static void parse(int argc, char **argv, run_cfg *c)
{
    const long big = 1 << 24;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            run_usage(stdout);
            exit(0);
        } else if (!strcmp(a, "--batch"))
            c->s.batch = (int)cli_int_arg(argc, argv, &i, 1, 4096);
        else if (!strcmp(a, "--heads-q"))
            c->s.heads_q = (int)cli_int_arg(argc, argv, &i, 1, 1024);
        else if (!strcmp(a, "--heads-kv"))
            c->s.heads_kv = (int)cli_int_arg(argc, argv, &i, 1, 1024);
        else if (!strcmp(a, "--len-q"))
            c->s.len_q = (int)cli_int_arg(argc, argv, &i, 1, big);
        else if (!strcmp(a, "--len-kv"))
            c->s.len_kv = (int)cli_int_arg(argc, argv, &i, 1, big);
        else if (!strcmp(a, "--head-dim"))
            c->s.head_dim = (int)cli_int_arg(argc, argv, &i, 1, 1024);
        else if (!strcmp(a, "--topk"))
            c->topk = (int)cli_int_arg(argc, argv, &i, 1, big);
        else if (!strcmp(a, "--seed"))
            c->seed = cli_u64_arg(argc, argv, &i);
        else if (!strcmp(a, "--selector"))
            c->selector = cli_str_arg(argc, argv, &i);
        else if (!strcmp(a, "--device"))
            c->device = cli_str_arg(argc, argv, &i);
        else if (!strcmp(a, "--json"))
            c->json = 1;
        else if (!strcmp(a, "--no-dense"))
            c->skip_dense = 1;
        else
            cli_usage_error("run: unknown flag '%s' (sparseattn run --help)", a);
    }
    int err = sa_shape_check(&c->s);
    if (err)
        cli_usage_error("run: %s", sa_strerror(err));
    if (c->topk > sa_kv_blocks(&c->s))
        cli_usage_error("run: --topk %d is larger than the %d KV blocks of len-kv %d", c->topk,
                        sa_kv_blocks(&c->s), c->s.len_kv);
    if (strcmp(c->device, "cpu") && strcmp(c->device, "cuda"))
        cli_usage_error("run: --device must be cpu or cuda, not '%s'", c->device);
    if (strcmp(c->selector, "random") && !sa_selector_by_name(c->selector))
        cli_usage_error("run: unknown selector '%s' (sparseattn run --help lists them)",
                        c->selector);
}

/* Keys attended by all query rows: sum over rows of the valid keys of their selected blocks,
 * times the heads that read each row. */
static double selected_keys_tiles(const sa_shape *s, const int32_t *idx, int k)
{
    double keys = 0;
    size_t rows = (size_t)s->batch * s->heads_kv * sa_q_tiles(s);
    int group = s->heads_q / s->heads_kv;
    for (size_t r = 0; r < rows; r++) {
        int tile = (int)(r % (size_t)sa_q_tiles(s));
        int queries = s->len_q - tile * SA_TILE < SA_TILE ? s->len_q - tile * SA_TILE : SA_TILE;
        for (int j = 0; j < k; j++)
            keys += (double)queries * group * sa_block_len(s, idx[r * k + j]);
    }
    return keys;
}

static double selected_keys_queries(const sa_shape *s, const int32_t *idx, int k)
{
    double keys = 0;
    size_t rows = sa_query_rows(s);
    int group = s->heads_q / s->heads_kv;
    for (size_t r = 0; r < rows; r++)
        for (int j = 0; j < k; j++)
            keys += (double)group * sa_block_len(s, idx[r * k + j]);
    return keys;
}

static double rel_l2(const float *x, const float *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)x[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void die_status(const char *what, int err)
{
    fprintf(stderr, "sparseattn: run: %s failed: %s\n", what, sa_strerror(err));
    exit(1);
}

int cmd_run(int argc, char **argv)
{
    run_cfg c = {{1, 16, 1, 4096, 16384, 128}, 16, 1, "cpu", "random", 0, 0};
    parse(argc, argv, &c);
    const sa_shape *s = &c.s;
    if (!strcmp(c.device, "cuda")) {
        fprintf(stderr, "sparseattn: run: --device cuda: %s\n",
                sa_gpu_available() ? "the GPU pipeline is not wired into run yet"
                                   : sa_strerror(sa_stage_count() ? SA_ERR_NO_DEVICE
                                                                  : SA_ERR_NOT_BUILT));
        return 1;
    }

    size_t nq = sa_q_elems(s), nkv = sa_kv_elems(s), nl = sa_lse_elems(s);
    uint16_t *q = malloc(nq * 2), *k = malloc(nkv * 2), *v = malloc(nkv * 2), *o = malloc(nq * 2);
    float *of = malloc(nq * sizeof(float)), *lse = malloc(nl * sizeof(float));
    float *dense_o = c.skip_dense ? NULL : malloc(nq * sizeof(float));
    if (!q || !k || !v || !o || !of || !lse || (!c.skip_dense && !dense_o))
        die_status("allocation", SA_ERR_NOMEM);

    cli_progress("run: generating inputs (seed %llu)", (unsigned long long)c.seed);
    sa_rng r;
    sa_rng_seed(&r, c.seed);
    sa_rng_fill_bf16(&r, q, nq, 1.0f);
    sa_rng_fill_bf16(&r, k, nkv, 1.0f);
    sa_rng_fill_bf16(&r, v, nkv, 1.0f);

    const sa_selector *sel = sa_selector_by_name(c.selector);
    int per_query = sel && sel->per_query;
    size_t rows = per_query ? sa_query_rows(s) : (size_t)s->batch * s->heads_kv * sa_q_tiles(s);
    int32_t *idx = malloc(rows * c.topk * sizeof *idx);
    if (!idx)
        die_status("allocation", SA_ERR_NOMEM);

    cli_progress("run: choosing blocks (%s)", c.selector);
    double t0 = cli_now();
    int err;
    if (sel) {
        sa_select_params p;
        sa_select_params_default(&p);
        p.k = c.topk;
        err = sel->cpu(s, q, k, &p, idx, NULL);
    } else {
        err = sa_random_tile_lists(s, s->heads_kv, c.topk, SA_LISTS_INDEPENDENT, c.seed ^ 0x5eed,
                                   idx);
    }
    double t_select = cli_now() - t0;
    if (err)
        die_status("block selection", err);

    cli_progress("run: block-sparse attention");
    sa_outputs out = {o, of, lse};
    t0 = cli_now();
    if (per_query) {
        sa_query_lists l = {idx, NULL, c.topk};
        err = sa_ref_query_sparse(s, q, k, v, &l, NULL, &out);
    } else {
        sa_tile_lists l = {idx, NULL, s->heads_kv, c.topk};
        err = sa_ref_tile_sparse(s, q, k, v, &l, NULL, &out);
    }
    double t_attn = cli_now() - t0;
    if (err)
        die_status("block-sparse attention", err);
    double keys = per_query ? selected_keys_queries(s, idx, c.topk)
                            : selected_keys_tiles(s, idx, c.topk);
    double useful_flops = 4.0 * keys * s->head_dim;

    double t_dense = 0, err_dense = NAN;
    if (!c.skip_dense) {
        cli_progress("run: dense attention for comparison");
        sa_outputs dout = {o, dense_o, NULL};
        t0 = cli_now();
        err = sa_ref_dense(s, q, k, v, &dout);
        t_dense = cli_now() - t0;
        if (err)
            die_status("dense attention", err);
        err_dense = rel_l2(of, dense_o, nq);
    }
    cli_progress_done();

    double dense_flops = 4.0 * s->batch * s->heads_q * (double)s->len_q * s->len_kv * s->head_dim;
    if (c.json) {
        printf("{\"command\":\"run\",\"device\":\"%s\",\"selector\":\"%s\",\"batch\":%d,"
               "\"heads_q\":%d,\"heads_kv\":%d,\"len_q\":%d,\"len_kv\":%d,\"head_dim\":%d,"
               "\"topk\":%d,\"seed\":%llu,\"select_s\":%.6f,\"attention_s\":%.6f,"
               "\"useful_gflops\":%.3f,\"dense_s\":%.6f,\"dense_gflops\":%.3f,"
               "\"rel_err_vs_dense\":%.6g}\n",
               c.device, c.selector, s->batch, s->heads_q, s->heads_kv, s->len_q, s->len_kv,
               s->head_dim, c.topk, (unsigned long long)c.seed, t_select, t_attn,
               useful_flops / t_attn * 1e-9, t_dense,
               c.skip_dense ? 0.0 : dense_flops / t_dense * 1e-9, err_dense);
    } else {
        printf("shape B=%d Hq=%d Hkv=%d Sq=%d Skv=%d D=%d, top-%d of %d blocks, selector %s, "
               "seed %llu, device %s\n",
               s->batch, s->heads_q, s->heads_kv, s->len_q, s->len_kv, s->head_dim, c.topk,
               sa_kv_blocks(s), c.selector, (unsigned long long)c.seed, c.device);
        printf("%-24s %12s %14s\n", "step", "time (ms)", "GFLOP/s");
        printf("%-24s %12.2f %14s\n", "select blocks", t_select * 1e3, "-");
        printf("%-24s %12.2f %14.1f   (useful: QK and PV of selected pairs)\n",
               "block-sparse attention", t_attn * 1e3, useful_flops / t_attn * 1e-9);
        if (!c.skip_dense) {
            printf("%-24s %12.2f %14.1f\n", "dense attention", t_dense * 1e3,
                   dense_flops / t_dense * 1e-9);
            printf("relative L2 error of the sparse output against dense: %.4g\n", err_dense);
        }
    }
    free(q), free(k), free(v), free(o), free(of), free(lse), free(dense_o), free(idx);
    return 0;
}
