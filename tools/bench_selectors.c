/* "sparseattn bench selectors": the GPU selectors alone, and the selector -> attention pipeline.
 *
 * Shape of the original study: batch 2, 16 query heads on 1 KV head, D 128, 4096 queries,
 * 4K / 8K / 16K keys, 16 blocks per row. Everything goes through the registries: every selector
 * with a GPU function, and the registry's default tile-list stage (SA_ROLE_DEFAULT_TILE) where it
 * accepts the shape, else the first sparse stage that does, or the stage --stage N names.
 *   1. Each selector alone (gaussian inputs): median time next to its floor, the bytes it must
 *      read once (Q and K in BF16) over the copy bandwidth measured in this run (and for the
 *      nvfp4 scorers also its FLOPs over the bf16 GEMM rate), and next to a kernel that only
 *      reads Q and K once, timed the same way ("x read"). The GPU NVFP4 quantizer of Q alone.
 *   2. Per workload (sa_workload_generate: gaussian and the structured ones) and tile selector:
 *      the pipeline (selector then attention, lists passed on the device) and the attention alone
 *      on the same lists; useful TFLOP/s = 4 * D * (query, selected key) pairs / time, and the
 *      pipeline's share of the attention-only rate.
 * Timing: the harness's (sa_gpu_bench.h) CUDA events around each launch, warm-up, median, input
 * sets rotated to stay out of L2. The stage runs with validate = 0 (the lists come from a
 * selector in the same run); --validate turns the GPU list check on in both columns. */
#include <stdlib.h>
#include <string.h>

#include "bench_gpu.h"
#include "cli.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: sparseattn bench selectors [--reps N] [--warmup N] [--stage ID] [--seed S]\n"
            "                                  [--gemm-tflops T] [--validate] [--json]\n"
            "                                  [--len-kv N] [--no-pipeline]\n\n"
            "GPU selectors alone (median time vs the memory floor), then the selector ->\n"
            "attention pipeline's useful TFLOP/s against the attention alone, at batch 2,\n"
            "16 query heads on 1 KV head, D 128, 4096 queries, 4K/8K/16K keys, top-16.\n"
            "--len-kv N runs that key length alone; --no-pipeline times the selectors only.\n");
}

#define BENCH_K 16

#ifndef SA_HAVE_CUDA
int bench_selectors(int argc, char **argv)
{
    bench_flags f;
    bench_parse(argc, argv, "selectors", 1, usage, &f);
    fprintf(stderr, "sparseattn: bench selectors: built without CUDA (%s)\n",
            sa_strerror(SA_ERR_NOT_BUILT));
    return 1;
}
#else
#include "sel_cuda.h"

static const int bench_lens[] = {4096, 8192, 16384};
#define NLENS (int)(sizeof bench_lens / sizeof bench_lens[0])

/* What the pseudo-stages below run: the harness times any sa_stage, so a selector (and the
 * selector followed by the attention stage) is wrapped as one. */
static struct {
    const sa_selector *sel;
    const sa_stage *attn;
    int32_t *idx, *cnt; /* selector-only output, sized for per-query lists */
    uint8_t *qv, *qs;   /* quantizer output */
    void *qwork;        /* quantizer scalars: tensor scale, bad flag, amax (3 words) */
} bx;

static int check_ok(const sa_gpu_attn *a)
{
    (void)a;
    return SA_OK;
}

static void params_for(const sa_gpu_attn *a, sa_select_params *p)
{
    sa_select_params_default(p);
    p->k = BENCH_K;
    p->stream = a->stream;
}

static int launch_selector(const sa_gpu_attn *a)
{
    sa_select_params p;
    params_for(a, &p);
    return bx.sel->cuda(&a->shape, a->q, a->k, &p, bx.idx, bx.cnt);
}

static int launch_pipeline(const sa_gpu_attn *a)
{
    sa_select_params p;
    params_for(a, &p);
    /* The set's device lists are the selector's output and the stage's input. */
    int rc = bx.sel->cuda(&a->shape, a->q, a->k, &p, (int32_t *)a->lists.indices,
                          (int32_t *)a->lists.counts);
    return rc ? rc : bx.attn->launch(a);
}

/* Reads Q and K once and does nothing else: the measured floor the selectors are also shown
 * against, timed the same way as they are. */
static int launch_read(const sa_gpu_attn *a)
{
    return sa_gb_read_once(a->q, sa_q_elems(&a->shape) * 2, a->k, sa_kv_elems(&a->shape) * 2,
                           a->stream);
}

static int launch_quantizer(const sa_gpu_attn *a)
{
    sa_nvfp4 z = {bx.qv, bx.qs, 0.0f, 0};
    return sa_nvfp4_quantize_bf16_cuda(a->q, sa_q_elems(&a->shape), &z, a->stream);
}

static int launch_quantizer_async(const sa_gpu_attn *a)
{
    float *ts = bx.qwork;
    return sel_nvfp4_quantize_async(a->q, sa_q_elems(&a->shape), bx.qv, bx.qs, ts,
                                    (int *)(ts + 1), (unsigned *)(ts + 2), a->stream);
}

/* The attention stage on `a` (a set with valid lists): --stage, else cli_tile_stage. */
static const sa_stage *attention_stage(const bench_flags *f, const sa_gpu_attn *a)
{
    if (f->stage_id >= 0)
        return sa_stage_by_id(f->stage_id); /* bench_parse checked it exists and is sparse */
    return cli_tile_stage(a);
}

/* (query, selected key) pairs of tile lists (B, Hkv, q_tiles, k) on the host, every query head
 * of the group counted. */
static double selected_pairs(const sa_shape *s, const int32_t *idx, int k)
{
    const int qt = sa_q_tiles(s), group = s->heads_q / s->heads_kv;
    double pairs = 0;
    for (int r = 0; r < s->batch * s->heads_kv * qt; r++) {
        int t = r % qt;
        int queries = s->len_q - t * SA_TILE < SA_TILE ? s->len_q - t * SA_TILE : SA_TILE;
        long keys = 0;
        for (int j = 0; j < k; j++)
            keys += sa_block_len(s, idx[(size_t)r * k + j]);
        pairs += (double)queries * group * keys;
    }
    return pairs;
}

static void print_timing_json(const char *part, const sa_shape *s, const char *sel,
                              const char *workload, const sa_gb_timing *t)
{
    printf("{\"bench\":\"selectors\",\"kind\":\"%s\",\"len_kv\":%d,\"selector\":", part,
           s->len_kv);
    bench_json_str(sel);
    if (workload) {
        printf(",\"workload\":");
        bench_json_str(workload);
    }
    printf(",\"median_ms\":%.6g,\"min_ms\":%.6g,\"max_ms\":%.6g,\"reps\":%d", t->median_ms,
           t->min_ms, t->max_ms, t->reps);
}

/* Part 1 at one length: every GPU selector alone, and the quantizer. */
static int selectors_alone(bench_env *e, const bench_flags *f, const sa_shape *s, sa_gb_set *sets,
                           int nsets)
{
    const double qk_bytes = 2.0 * ((double)sa_q_elems(s) + (double)sa_kv_elems(s));
    const double floor_ms = bench_byte_ms(qk_bytes, e->copy_bps);
    /* First a kernel that only reads Q and K once: what the memory floor costs in practice under
     * this timing (one launch, its ramp-up and tail, the events around it). */
    sa_stage rd = {.id = -1, .name = "read Q+K", .summary = "read once", .roles = SA_ROLE_SPARSE,
                   .check = check_ok, .launch = launch_read};
    sa_gb_timing tr;
    int rc0 = sa_gb_time_stage(e->g, &rd, sets, nsets, 0, f->warmup, f->reps, &tr);
    if (rc0) {
        fprintf(stderr, "sparseattn: bench selectors: read floor: %s\n", bench_why(rc0));
        return rc0;
    }
    if (f->json) {
        print_timing_json("read_floor", s, "read Q+K", NULL, &tr);
        printf(",\"bytes\":%.6g,\"mem_floor_ms\":%.6g,\"x_floor\":%.4g}\n", qk_bytes, floor_ms,
               tr.median_ms / floor_ms);
    } else {
        printf("\n%-12s %8s %7s %10s %10s %8s %6s %7s  (len_kv %d, selectors alone, gaussian; "
               "ms)\n",
               "selector", "median", "min", "mem floor", "FLOP floor", "x floor", "goal", "x read",
               s->len_kv);
        printf("%-12s %8.4f %7.4f %10.4f %10s %8.2f %6s %7s  (a kernel that only reads Q and K "
               "once)\n",
               "read Q+K", tr.median_ms, tr.min_ms, floor_ms, "-", tr.median_ms / floor_ms, "-",
               "1.00");
    }
    for (int i = 0; i < sa_selector_count(); i++) {
        const sa_selector *sel = sa_selector_at(i);
        if (!sel->cuda)
            continue;
        bx.sel = sel;
        sa_stage st = {.id = -1, .name = sel->name, .summary = "selector alone",
                       .roles = SA_ROLE_SPARSE, .check = check_ok, .launch = launch_selector};
        sa_gb_timing t;
        int rc = sa_gb_time_stage(e->g, &st, sets, nsets, 0, f->warmup, f->reps, &t);
        if (rc) {
            fprintf(stderr, "sparseattn: bench selectors: %s: %s\n", sel->name, bench_why(rc));
            return rc;
        }
        /* The nvfp4 scorers do every (query, key) dot product: 2 * D FLOPs each. */
        double flop_ms = !strncmp(sel->name, "nvfp4", 5)
                             ? bench_flop_ms(2.0 * s->batch * s->heads_q * (double)s->len_q *
                                                 s->len_kv * s->head_dim,
                                             f->gemm_tflops)
                             : 0.0;
        double fl = flop_ms > floor_ms ? flop_ms : floor_ms;
        if (f->json) {
            print_timing_json("selector", s, sel->name, NULL, &t);
            printf(",\"bytes\":%.6g,\"mem_floor_ms\":%.6g,\"flop_floor_ms\":%.6g,"
                   "\"x_floor\":%.4g,\"read_floor_ms\":%.6g,\"x_read\":%.4g}\n",
                   qk_bytes, floor_ms, flop_ms, t.median_ms / fl, tr.median_ms,
                   t.median_ms / tr.median_ms);
        } else {
            /* The goals on the H200: r1 within 1.5x of its floor, r4 within 2x. */
            const char *goal = !strcmp(sel->name, "r1")   ? "<=1.5"
                               : !strcmp(sel->name, "r4") ? "<=2"
                                                          : "-";
            printf("%-12s %8.4f %7.4f %10.4f %10.4f %8.2f %6s %7.2f\n", sel->name, t.median_ms,
                   t.min_ms, floor_ms, flop_ms, t.median_ms / fl, goal,
                   t.median_ms / tr.median_ms);
        }
        fflush(stdout);
    }
    /* The quantizer (of Q) alone: the API function, which synchronises once per call to return
     * the tensor scale, and its kernels alone (the asynchronous form). */
    const double qbytes = (double)sa_q_elems(s) * (2.0 + 0.5 + 1.0 / 16.0);
    const double qfloor = bench_byte_ms(qbytes, e->copy_bps);
    for (int async = 0; async < 2; async++) {
        sa_stage st = {.id = -1, .name = "nvfp4_quantize", .summary = "quantizer alone",
                       .roles = SA_ROLE_SPARSE, .check = check_ok,
                       .launch = async ? launch_quantizer_async : launch_quantizer};
        const char *name = async ? "quantize(Q) kernels" : "quantize(Q)";
        sa_gb_timing t;
        int rc = sa_gb_time_stage(e->g, &st, sets, nsets, 0, f->warmup, f->reps, &t);
        if (rc) {
            fprintf(stderr, "sparseattn: bench selectors: %s: %s\n", name, bench_why(rc));
            return rc;
        }
        if (f->json) {
            print_timing_json("quantizer", s, name, NULL, &t);
            printf(",\"bytes\":%.6g,\"mem_floor_ms\":%.6g,\"x_floor\":%.4g}\n", qbytes, qfloor,
                   t.median_ms / qfloor);
        } else {
            printf("%-12s %8.4f %7.4f %10.4f %10s %8.2f %6s %7s  (NVFP4 quantizer of Q%s)\n",
                   async ? "quantQ async" : "quantize(Q)", t.median_ms, t.min_ms, qfloor, "-",
                   t.median_ms / qfloor, "-", "-",
                   async ? ": memsets + 2 kernels, no sync" : ", API call incl. one host sync");
        }
        fflush(stdout);
    }
    return SA_OK;
}

/* Part 2 at one length: pipeline vs attention alone, per workload and tile selector. */
static int pipelines(bench_env *e, const bench_flags *f, const sa_shape *s, sa_gb_set *sets,
                     int nsets, const sa_stage *attn)
{
    const size_t nq = sa_q_elems(s), nk = sa_kv_elems(s);
    const size_t rows = (size_t)s->batch * s->heads_kv * sa_q_tiles(s);
    uint16_t *q = malloc(nq * 2), *k = malloc(nk * 2), *v = malloc(nk * 2);
    int32_t *idx = malloc(rows * BENCH_K * sizeof *idx);
    int rc = q && k && v && idx ? SA_OK : SA_ERR_NOMEM;
    if (!f->json && !rc)
        printf("\n%-10s %-8s %9s %9s %9s %9s %8s  (len_kv %d, stage %d %s, useful TFLOP/s;"
               " share = pipe TF / attn TF, goal >= 85%% at 16K)\n",
               "workload", "selector", "pipe ms", "attn ms", "pipe TF", "attn TF", "share",
               s->len_kv, attn->id, attn->name);
    for (int w = 0; !rc && w < sa_workload_count(); w++) {
        const sa_workload *wl = sa_workload_at(w);
        rc = sa_workload_generate(wl->name, s, f->seed + (uint64_t)w, SA_STRENGTH_DEFAULT, q, k, v);
        for (int i = 0; !rc && i < nsets; i++) {
            rc = sa_gb_upload((void *)sets[i].a.q, q, nq * 2);
            if (!rc)
                rc = sa_gb_upload((void *)sets[i].a.k, k, nk * 2);
            if (!rc)
                rc = sa_gb_upload((void *)sets[i].a.v, v, nk * 2);
        }
        for (int i = 0; !rc && i < sa_selector_count(); i++) {
            const sa_selector *sel = sa_selector_at(i);
            if (!sel->cuda || sel->per_query)
                continue;
            bx.sel = sel;
            bx.attn = attn;
            sa_stage pipe = {.id = -1, .name = sel->name, .summary = "selector + attention",
                             .roles = SA_ROLE_SPARSE, .check = check_ok,
                             .launch = launch_pipeline};
            size_t bad = 0;
            sa_gb_timing tp, ta;
            rc = sa_gb_smoke(e->g, &pipe, &sets[0], &bad);
            if (!rc && bad)
                fprintf(stderr, "sparseattn: bench selectors: %s -> stage %d left %zu outputs "
                                "NaN/inf\n", sel->name, attn->id, bad);
            if (!rc)
                rc = sa_gb_time_stage(e->g, &pipe, sets, nsets, !f->no_validate, f->warmup,
                                      f->reps, &tp);
            /* The attention alone, on the lists the selector just left in every set. */
            if (!rc)
                rc = sa_gb_time_stage(e->g, attn, sets, nsets, !f->no_validate, f->warmup, f->reps,
                                      &ta);
            if (!rc)
                rc = sa_gb_download(idx, sets[0].a.lists.indices, rows * BENCH_K * sizeof *idx);
            if (rc) {
                fprintf(stderr, "sparseattn: bench selectors: %s pipeline: %s\n", sel->name,
                        bench_why(rc));
                break;
            }
            const double flops = 4.0 * s->head_dim * selected_pairs(s, idx, BENCH_K);
            const double tf_p = bench_tflops(flops, tp.median_ms);
            const double tf_a = bench_tflops(flops, ta.median_ms);
            if (f->json) {
                print_timing_json("pipeline", s, sel->name, wl->name, &tp);
                printf(",\"stage\":%d,\"attn_median_ms\":%.6g,\"useful_flops\":%.6g,"
                       "\"pipeline_tflops\":%.6g,\"attn_tflops\":%.6g,\"share\":%.4g}\n",
                       attn->id, ta.median_ms, flops, tf_p, tf_a, tf_p / tf_a);
            } else {
                printf("%-10s %-8s %9.4f %9.4f %9.1f %9.1f %7.1f%%\n", wl->name, sel->name,
                       tp.median_ms, ta.median_ms, tf_p, tf_a, 100.0 * tf_p / tf_a);
            }
            fflush(stdout);
        }
    }
    if (rc == SA_ERR_NOMEM)
        fprintf(stderr, "sparseattn: bench selectors: out of host memory\n");
    free(q), free(k), free(v), free(idx);
    return rc;
}

int bench_selectors(int argc, char **argv)
{
    bench_flags f;
    /* --validate, --len-kv and --no-pipeline are ours; the shared parser knows the rest. */
    int validate = 0, only_len = 0, no_pipeline = 0;
    for (int i = 1; i < argc; i++) {
        int used = 0;
        if (!strcmp(argv[i], "--validate"))
            validate = used = 1;
        else if (!strcmp(argv[i], "--no-pipeline"))
            no_pipeline = used = 1;
        else if (!strcmp(argv[i], "--len-kv")) {
            int j = i;
            only_len = (int)cli_int_arg(argc, argv, &j, 1, 1 << 30);
            used = 2;
        }
        if (used) {
            for (int j = i; j + used < argc; j++)
                argv[j] = argv[j + used];
            argc -= used;
            i--;
        }
    }
    bench_parse(argc, argv, "selectors", 1, usage, &f);
    f.no_validate = !validate;
    bench_env e;
    if (bench_open("selectors", &f, &e))
        return 1;
    int status = 0;
    for (int li = 0; li < (only_len ? 1 : NLENS) && !status; li++) {
        sa_shape s = {2, 16, 1, 4096, only_len ? only_len : bench_lens[li], 128};
        const size_t rows_q = (size_t)s.batch * s.heads_kv * s.len_q;
        const size_t rows_t = (size_t)s.batch * s.heads_kv * sa_q_tiles(&s);
        sa_gb_set sets[BENCH_MAX_SETS];
        int nsets = bench_sets("selectors", &e, &s, f.seed + (uint64_t)li, sets);
        if (nsets < 0) {
            status = 1;
            break;
        }
        /* Valid placeholder lists (blocks 0..15) so every set owns device lists and counts. */
        int32_t *hl = malloc(rows_t * BENCH_K * sizeof *hl), *hc = malloc(rows_t * sizeof *hc);
        int rc = hl && hc ? SA_OK : SA_ERR_NOMEM;
        for (size_t r = 0; !rc && r < rows_t; r++) {
            hc[r] = BENCH_K;
            for (int j = 0; j < BENCH_K; j++)
                hl[r * BENCH_K + j] = j;
        }
        for (int i = 0; !rc && i < nsets; i++) {
            rc = sa_gb_set_lists(&sets[i], hl, hc, s.heads_kv, BENCH_K);
            sets[i].a.validate = validate;
        }
        free(hl), free(hc);
        if (!rc)
            rc = sa_gb_alloc((void **)&bx.idx, rows_q * BENCH_K * sizeof(int32_t));
        if (!rc)
            rc = sa_gb_alloc((void **)&bx.cnt, rows_q * sizeof(int32_t));
        if (!rc)
            rc = sa_gb_alloc((void **)&bx.qv, sa_q_elems(&s) / 2);
        if (!rc)
            rc = sa_gb_alloc((void **)&bx.qs, sa_q_elems(&s) / 16);
        if (!rc)
            rc = sa_gb_alloc(&bx.qwork, 3 * sizeof(float));
        if (rc)
            fprintf(stderr, "sparseattn: bench selectors: %s\n", bench_why(rc));
        if (!rc)
            rc = selectors_alone(&e, &f, &s, sets, nsets);
        const sa_stage *attn = rc || no_pipeline ? NULL : attention_stage(&f, &sets[0].a);
        if (!rc && !no_pipeline && !attn)
            printf("no sparse attention stage in the registry runs len_kv %d: the pipeline part "
                   "is skipped\n", s.len_kv);
        if (!rc && attn)
            rc = pipelines(&e, &f, &s, sets, nsets, attn);
        sa_gb_free(bx.idx), sa_gb_free(bx.cnt), sa_gb_free(bx.qv), sa_gb_free(bx.qs);
        sa_gb_free(bx.qwork);
        bx.idx = bx.cnt = NULL;
        bx.qv = bx.qs = NULL;
        bx.qwork = NULL;
        bench_sets_free(sets, nsets);
        if (rc)
            status = 1;
    }
    sa_gb_close(e.g);
    return status;
}
#endif
