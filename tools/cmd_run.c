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
    const char *selector; /* selector registry name */
    const char *workload; /* workload registry name */
    int stage;            /* GPU stage id, 0 = choose */
    int json;
    int skip_dense;
} run_cfg;

static void run_usage(FILE *f)
{
    fprintf(f,
            "usage: sparseattn run [flags]\n"
            CLI_SHAPE_FLAGS_HELP
            "  --topk K          blocks of 128 keys per query tile (default 16)\n"
            "  --seed S          RNG seed for inputs and random lists (default 1)\n"
            "  --selector NAME   a registered selector (default: random)\n"
            "  --workload NAME   input structure (default: gaussian; see select-eval)\n"
            "  --stage ID        GPU sparse stage for --device cuda (default: the registry's\n"
            "                    default tile-list stage where it accepts the shape, else the\n"
            "                    first sparse stage that does)\n"
            "  --device cpu|cuda (default cpu)\n"
            "  --no-dense        skip the dense comparison (on the GPU: the default dense stage)\n"
            "  --json            one machine-readable line instead of the table\n"
            "selectors:");
    for (int i = 0; i < sa_selector_count(); i++)
        fprintf(f, " %s", sa_selector_at(i)->name);
    fprintf(f, "\nsparse stages:");
    cli_print_stages(f, SA_ROLE_SPARSE, 0);
    fputc('\n', f);
}

static void parse(int argc, char **argv, run_cfg *c)
{
    const long big = 1 << 24;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            run_usage(stdout);
            exit(0);
        } else if (cli_shape_flag(argc, argv, &i, &c->s))
            continue;
        else if (!strcmp(a, "--topk"))
            c->topk = (int)cli_int_arg(argc, argv, &i, 1, big);
        else if (!strcmp(a, "--seed"))
            c->seed = cli_u64_arg(argc, argv, &i);
        else if (!strcmp(a, "--selector"))
            c->selector = cli_str_arg(argc, argv, &i);
        else if (!strcmp(a, "--workload"))
            c->workload = cli_str_arg(argc, argv, &i);
        else if (!strcmp(a, "--stage"))
            c->stage = (int)cli_int_arg(argc, argv, &i, 1, 99);
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
    if (!sa_workload_by_name(c->workload))
        cli_usage_error("run: unknown workload '%s' (sparseattn select-eval --help lists them)",
                        c->workload);
    if (c->stage && !sa_stage_by_id(c->stage))
        cli_usage_error("run: --stage %d is not a registered GPU stage in this build", c->stage);
    if (!sa_selector_by_name(c->selector))
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

#ifdef SA_HAVE_CUDA
#include "sa_gpu_bench.h"
#include "sel_cuda.h"

/* The GPU stage for tile lists: --stage, else the registry's default tile-list stage where its
 * check accepts the shape, else the first sparse stage whose check does (cli_tile_stage). */
static const sa_stage *pick_stage(const run_cfg *c, const sa_gpu_attn *a)
{
    return c->stage ? sa_stage_by_id(c->stage) : cli_tile_stage(a);
}

static void die_gpu(const char *what, int err)
{
    fprintf(stderr, "sparseattn: run: %s failed: %s (%s)\n", what, sa_strerror(err),
            sa_gb_last_error());
    exit(1);
}

/* Times `st` on the set (median of a few launches after warm-up) and downloads O and LSE. */
static double gpu_attend(sa_gb *g, const sa_stage *st, sa_gb_set *set, uint16_t *o, float *lse)
{
    sa_gb_timing t;
    int err = sa_gb_time_stage(g, st, set, 1, 1, 2, 5, &t);
    if (err)
        die_gpu(st->name, err);
    const sa_shape *s = &set->a.shape;
    if ((err = sa_gb_download(o, set->a.o, sa_q_elems(s) * 2)) ||
        (err = sa_gb_download(lse, set->a.lse, sa_lse_elems(s) * sizeof(float))))
        die_gpu("download", err);
    return t.median_ms * 1e-3;
}
#endif

int cmd_run(int argc, char **argv)
{
    run_cfg c = {{1, 16, 1, 4096, 16384, 128}, 16, 1, "cpu", "random", "gaussian", 0, 0, 0};
    parse(argc, argv, &c);
    const sa_shape *s = &c.s;
    const int cuda = !strcmp(c.device, "cuda");
    const sa_selector *sel = sa_selector_by_name(c.selector);
    const int per_query = sel->per_query;
    if (cuda) {
#ifndef SA_HAVE_CUDA
        fprintf(stderr, "sparseattn: run: --device cuda: %s\n", sa_strerror(SA_ERR_NOT_BUILT));
        return 1;
#else
        if (!sa_gpu_available()) {
            fprintf(stderr, "sparseattn: run: --device cuda: %s\n", sa_strerror(SA_ERR_NO_DEVICE));
            return 1;
        }
        if (per_query)
            cli_usage_error("run: selector '%s' writes per-query lists, which the GPU stages do "
                            "not read; use --device cpu",
                            c.selector);
#endif
    }

    size_t nq = sa_q_elems(s), nkv = sa_kv_elems(s), nl = sa_lse_elems(s);
    uint16_t *q = malloc(nq * 2), *k = malloc(nkv * 2), *v = malloc(nkv * 2), *o = malloc(nq * 2);
    uint16_t *dense_o = c.skip_dense ? NULL : malloc(nq * 2);
    float *of = malloc(nq * sizeof(float)), *lse = malloc(nl * sizeof(float));
    size_t rows = per_query ? sa_query_rows(s) : (size_t)s->batch * s->heads_kv * sa_q_tiles(s);
    int32_t *idx = malloc(rows * c.topk * sizeof *idx);
    if (!q || !k || !v || !o || !of || !lse || !idx || (!c.skip_dense && !dense_o))
        die_status("allocation", SA_ERR_NOMEM);

    cli_progress("run: generating inputs (%s, seed %llu)", c.workload, (unsigned long long)c.seed);
    int err = sa_workload_generate(c.workload, s, c.seed, SA_STRENGTH_DEFAULT, q, k, v);
    if (err)
        die_status("input generation", err);

    cli_progress("run: choosing blocks (%s)", c.selector);
    sa_select_params p;
    sa_select_params_default(&p);
    p.k = c.topk;
    p.seed = c.seed; /* the "random" selector draws its lists from the run's seed */
    double t_select;
    const char *select_where = "cpu";
#ifdef SA_HAVE_CUDA
    if (cuda && sel->cuda) {
        /* The first call also loads the module: time the second. */
        double ms = 0;
        err = sel_cuda_run_host(sel, s, q, k, &p, idx, NULL, &ms);
        if (!err)
            err = sel_cuda_run_host(sel, s, q, k, &p, idx, NULL, &ms);
        t_select = ms * 1e-3;
        select_where = "cuda";
    } else
#endif
    {
        double t0 = cli_now();
        err = sel->cpu(s, q, k, &p, idx, NULL);
        t_select = cli_now() - t0;
    }
    if (err)
        die_status("block selection", err);

    double keys = per_query ? selected_keys_queries(s, idx, c.topk)
                            : selected_keys_tiles(s, idx, c.topk);
    double useful_flops = 4.0 * keys * s->head_dim;
    double dense_flops = 4.0 * s->batch * s->heads_q * (double)s->len_q * s->len_kv * s->head_dim;
    double t_attn = 0, t_dense = 0, err_dense = NAN, err_ref = NAN;
    const char *stage_name = "reference";
    const char *dense_skipped = NULL; /* why the GPU dense comparison did not run */
    const char *dense_name = NULL;    /* the GPU dense stage it was meant for */
    sa_outputs out = {o, of, lse};

    if (!cuda) {
        cli_progress("run: block-sparse attention");
        double t0 = cli_now();
        if (per_query) {
            sa_query_lists l = {idx, NULL, c.topk};
            err = sa_ref_query_sparse(s, q, k, v, &l, NULL, &out);
        } else {
            sa_tile_lists l = {idx, NULL, s->heads_kv, c.topk};
            err = sa_ref_tile_sparse(s, q, k, v, &l, NULL, &out);
        }
        t_attn = cli_now() - t0;
        if (err)
            die_status("block-sparse attention", err);
        if (!c.skip_dense) {
            cli_progress("run: dense attention for comparison");
            float *dense_f = malloc(nq * sizeof(float));
            sa_outputs dout = {dense_o, dense_f, NULL};
            t0 = cli_now();
            err = dense_f ? sa_ref_dense(s, q, k, v, &dout) : SA_ERR_NOMEM;
            t_dense = cli_now() - t0;
            if (err)
                die_status("dense attention", err);
            err_dense = rel_l2(of, dense_f, nq);
            free(dense_f);
        }
    }
#ifdef SA_HAVE_CUDA
    else {
        cli_progress("run: block-sparse attention on the GPU");
        sa_gb *g;
        sa_gb_set set;
        if ((err = sa_gb_open(&g, NULL)) || (err = sa_gb_set_create(g, s, c.seed, &set)))
            die_gpu("GPU setup", err);
        if ((err = sa_gb_upload((void *)set.a.q, q, nq * 2)) ||
            (err = sa_gb_upload((void *)set.a.k, k, nkv * 2)) ||
            (err = sa_gb_upload((void *)set.a.v, v, nkv * 2)) ||
            (err = sa_gb_set_lists(&set, idx, NULL, s->heads_kv, c.topk)))
            die_gpu("upload", err);
        const sa_stage *st = pick_stage(&c, &set.a);
        if (!cli_stage_sparse(st) || (err = st->check(&set.a))) {
            const int why = cli_stage_sparse(st) ? err : SA_ERR_ARG;
            fprintf(stderr, "sparseattn: run: no sparse GPU stage runs this shape%s%s\n",
                    st ? ": " : "", st ? sa_strerror(why) : "");
            return 1;
        }
        stage_name = st->name;
        t_attn = gpu_attend(g, st, &set, o, lse);
        sa_bf16_to_f32_array(of, o, nq);

        /* The GPU output against the CPU reference on the same lists: the pipeline is correct. */
        cli_progress("run: CPU reference on the same lists");
        uint16_t *ro = malloc(nq * 2);
        float *rof = malloc(nq * sizeof(float));
        sa_tile_lists l = {idx, NULL, s->heads_kv, c.topk};
        sa_outputs rout = {ro, rof, NULL};
        err = ro && rof ? sa_ref_tile_sparse(s, q, k, v, &l, NULL, &rout) : SA_ERR_NOMEM;
        if (err)
            die_status("CPU reference", err);
        err_ref = rel_l2(of, rof, nq);
        free(ro);
        free(rof);

        const sa_stage *dense = sa_stage_with(SA_ROLE_DEFAULT_DENSE);
        if (!c.skip_dense && dense && dense->check(&set.a) == SA_OK) {
            cli_progress("run: dense attention on the GPU for comparison");
            t_dense = gpu_attend(g, dense, &set, dense_o, lse);
            float *dense_f = malloc(nq * sizeof(float));
            if (!dense_f)
                die_status("allocation", SA_ERR_NOMEM);
            sa_bf16_to_f32_array(dense_f, dense_o, nq);
            err_dense = rel_l2(of, dense_f, nq);
            free(dense_f);
        } else if (!c.skip_dense) {
            c.skip_dense = 1;
            dense_skipped = dense ? sa_strerror(dense->check(&set.a))
                                  : "no default dense stage in the registry";
            dense_name = dense ? dense->name : "-";
        }
        sa_gb_set_destroy(&set);
        sa_gb_close(g);
    }
#endif
    cli_progress_done();

    if (c.json) {
        printf("{\"command\":\"run\",\"device\":\"%s\",\"selector\":\"%s\",\"select_on\":\"%s\","
               "\"workload\":\"%s\",\"attention\":\"%s\",\"batch\":%d,\"heads_q\":%d,"
               "\"heads_kv\":%d,\"len_q\":%d,\"len_kv\":%d,\"head_dim\":%d,\"topk\":%d,"
               "\"seed\":%llu,\"select_s\":%.6f,\"attention_s\":%.6f,\"useful_gflops\":%.3f,"
               "\"dense_s\":%.6f,\"dense_gflops\":%.3f,\"rel_err_vs_dense\":%.6g,"
               "\"rel_err_vs_reference\":%.6g}\n",
               c.device, c.selector, select_where, c.workload, stage_name, s->batch, s->heads_q,
               s->heads_kv, s->len_q, s->len_kv, s->head_dim, c.topk,
               (unsigned long long)c.seed, t_select, t_attn, useful_flops / t_attn * 1e-9, t_dense,
               c.skip_dense ? 0.0 : dense_flops / t_dense * 1e-9, err_dense, err_ref);
    } else {
        printf("shape B=%d Hq=%d Hkv=%d Sq=%d Skv=%d D=%d, top-%d of %d blocks, workload %s, "
               "selector %s, seed %llu, device %s\n",
               s->batch, s->heads_q, s->heads_kv, s->len_q, s->len_kv, s->head_dim, c.topk,
               sa_kv_blocks(s), c.workload, c.selector, (unsigned long long)c.seed, c.device);
        printf("%-34s %12s %14s\n", "step", "time (ms)", "GFLOP/s");
        char what[64];
        snprintf(what, sizeof what, "select blocks (%s)", select_where);
        printf("%-34s %12.3f %14s\n", what, t_select * 1e3, "-");
        snprintf(what, sizeof what, "block-sparse attention (%s)", stage_name);
        printf("%-34s %12.3f %14.1f   (useful: QK and PV of selected pairs)\n", what,
               t_attn * 1e3, useful_flops / t_attn * 1e-9);
        if (!c.skip_dense)
            printf("%-34s %12.3f %14.1f\n", "dense attention", t_dense * 1e3,
                   dense_flops / t_dense * 1e-9);
        else if (dense_skipped)
            printf("dense attention: skipped, the dense stage (%s) cannot run this shape (%s)\n",
                   dense_name, dense_skipped);
        if (cuda)
            printf("relative L2 error of the GPU output against the CPU reference: %.3g\n",
                   err_ref);
        if (!c.skip_dense)
            printf("relative L2 error of the sparse output against dense: %.4g\n", err_dense);
    }
    free(q), free(k), free(v), free(o), free(of), free(lse), free(dense_o), free(idx);
    return 0;
}
