/* "sparseattn bench kvcentric": the KV-centric path on the original study's shape (batch 8, 16
 * query heads on 1 KV head, len_q = len_kv = 4096, D 128, each query 16 random blocks of 32).
 * Times its three parts apart (reverse index, attention, combine) and whole, with FP32 and BF16
 * partials, CUDA events, warm-up, median. Floors beside them: the partials' bytes (written by the
 * attention, read by the combine) over the copy bandwidth measured in this run, and the useful
 * FLOPs over the GEMM rate. In the same run: the registry's default dense stage at this shape
 * and every sparse stage of the registry on the per-tile union of the queries' lists. */
#include "bench_gpu.h"

#define KV_BATCH 8
#define KV_HEADS_Q 16
#define KV_HEADS_KV 1
#define KV_LEN 4096
#define KV_HEAD_DIM 128
#define KV_TOPK 16 /* selected blocks per query, of 32 */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: sparseattn bench kvcentric [flags]\n"
            "  --reps N          timed runs per measurement, median reported (default 20)\n"
            "  --warmup N        untimed runs first (default 3)\n"
            "  --gemm-tflops X   bf16 GEMM rate for the FLOP floor (default %.0f)\n"
            "  --seed S          seed of the inputs and lists (default 2026)\n"
            "  --json            one JSON object per line\n"
            "shape: B=%d Hq=%d Hkv=%d len_q=len_kv=%d D=%d, %d random blocks of %d per query\n",
            BENCH_GEMM_TFLOPS_DEFAULT, KV_BATCH, KV_HEADS_Q, KV_HEADS_KV, KV_LEN, KV_HEAD_DIM,
            KV_TOPK, KV_LEN / SA_TILE);
}

static void parse(int argc, char **argv, bench_flags *f)
{
    memset(f, 0, sizeof *f);
    f->stage_id = -1;
    f->reps = 20;
    f->warmup = 3;
    f->gemm_tflops = BENCH_GEMM_TFLOPS_DEFAULT;
    f->seed = 2026;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            exit(0);
        } else if (!bench_timing_flag(argc, argv, &i, f))
            cli_usage_error("bench kvcentric: unknown flag '%s' (sparseattn bench kvcentric "
                            "--help)",
                            a);
    }
}

#ifndef SA_HAVE_CUDA
int bench_kvcentric(int argc, char **argv)
{
    bench_flags f;
    parse(argc, argv, &f);
    return bench_not_built("kvcentric");
}
#else
#define CK_SA(x)                                                                                  \
    do {                                                                                          \
        int r_ = (x);                                                                             \
        if (r_ != SA_OK) {                                                                        \
            fprintf(stderr, "sparseattn: bench kvcentric: %s: %s\n", #x, sa_strerror(r_));       \
            return 1;                                                                             \
        }                                                                                         \
    } while (0)

/* The three parts of sa_kvcentric_attention (sa_kvcentric.h), each a harness callback on the
 * sa_kv_params it is handed, and the whole entry point. */
static int kv_part_index(void *ctx, void *stream)
{
    sa_kv_params *p = ctx;
    p->stream = stream;
    return sa_kv_build_index(p);
}
static int kv_part_attend(void *ctx, void *stream)
{
    sa_kv_params *p = ctx;
    p->stream = stream;
    return sa_kv_attend(p);
}
static int kv_part_combine(void *ctx, void *stream)
{
    sa_kv_params *p = ctx;
    p->stream = stream;
    return sa_kv_combine(p);
}
static int kv_whole(void *ctx, void *stream)
{
    sa_kv_params *p = ctx;
    p->stream = stream;
    return sa_kvcentric_attention(p);
}

/* Medians over reps, in ms, after `warmup` untimed whole runs (validation off). index / attend /
 * combine / total: the three parts with validation off, each between its own events (total from
 * the first to the last), the host waiting for each rep's last event (bh_time_parts). validated:
 * the whole entry point with validation on, which synchronizes once inside (included).
 * p->validate is restored. */
typedef struct kv_times {
    double index, attend, combine, total, validated;
} kv_times;

static int kv_time_parts(bh_gpu *g, sa_kv_params *p, int warmup, int reps, kv_times *t)
{
    static const bh_fn parts[3] = {kv_part_index, kv_part_attend, kv_part_combine};
    static const bh_fn whole[1] = {kv_whole};
    bh_timing tp[4], tw[2];
    const int keep = p->validate;
    int rc = SA_OK;
    p->validate = 0;
    for (int w = 0; w < warmup && !rc; w++)
        rc = sa_kvcentric_attention(p);
    if (!rc)
        rc = bh_time_parts(g, "KV-centric parts", parts, 3, p, reps, tp);
    p->validate = 1;
    if (!rc)
        rc = bh_time_parts(g, "KV-centric, validated", whole, 1, p, reps, tw);
    p->validate = keep;
    if (rc)
        return rc;
    t->index = tp[0].median_ms;
    t->attend = tp[1].median_ms;
    t->combine = tp[2].median_ms;
    t->total = tp[3].median_ms;
    t->validated = tw[1].median_ms;
    return SA_OK;
}

/* Per (b, hkv, tile) the union of its queries' lists: what a Q-centric stage must visit. */
static double tile_union(const sa_shape *s, const int32_t *qidx, int k, int32_t *tidx,
                         int32_t *tcnt)
{
    int nb = sa_kv_blocks(s), tiles = sa_q_tiles(s);
    double sum = 0;
    for (int h = 0; h < s->batch * s->heads_kv; h++)
        for (int t = 0; t < tiles; t++) {
            unsigned char mark[4096] = {0};
            for (int q = t * SA_TILE; q < s->len_q && q < (t + 1) * SA_TILE; q++)
                for (int j = 0; j < k; j++)
                    mark[qidx[((size_t)h * s->len_q + q) * k + j]] = 1;
            size_t row = (size_t)h * tiles + t;
            int c = 0;
            for (int b = 0; b < nb; b++)
                if (mark[b])
                    tidx[row * nb + c++] = b;
            tcnt[row] = c;
            sum += c;
        }
    return sum / ((double)s->batch * s->heads_kv * tiles);
}

static void print_row(const bench_flags *f, const char *what, double ms, double floor_ms,
                      const char *floor_what, double ratio_dense)
{
    if (f->json) {
        printf("{\"bench\":\"kvcentric\",\"kind\":\"time\",\"what\":");
        cli_json_str(what);
        printf(",\"median_ms\":%.6g,\"floor_ms\":%.6g,\"floor\":", ms, floor_ms);
        cli_json_str(floor_what);
        printf(",\"vs_dense\":%.6g}\n", ratio_dense);
    } else {
        printf("  %-34s %8.3f ms", what, ms);
        if (floor_ms > 0)
            printf("   floor %7.3f ms (%s, %3.0f%% of it)", floor_ms, floor_what,
                   100 * floor_ms / ms);
        if (ratio_dense > 0)
            printf("   %.2fx dense", ratio_dense);
        printf("\n");
    }
}

int bench_kvcentric(int argc, char **argv)
{
    bench_flags f;
    parse(argc, argv, &f);
    if (!sa_gpu_available()) {
        fprintf(stderr, "sparseattn: bench kvcentric: no usable CUDA device (sm_90 needed)\n");
        return 1;
    }
    bench_env e;
    if (bench_open("kvcentric", &f, &e))
        return 1;
    sa_shape s = {.batch = KV_BATCH, .heads_q = KV_HEADS_Q, .heads_kv = KV_HEADS_KV,
                  .len_q = KV_LEN, .len_kv = KV_LEN, .head_dim = KV_HEAD_DIM};
    size_t rows = sa_query_rows(&s), nq = sa_q_elems(&s);
    int32_t *qidx = malloc(rows * KV_TOPK * sizeof *qidx);
    if (!qidx)
        return 1;
    CK_SA(sa_random_query_lists(&s, KV_TOPK, f.seed, qidx));

    /* Inputs: the dense set of the harness gives Q, K, V, O and LSE; the lists are ours. */
    bh_set set;
    if (bh_set_create(e.g, &s, f.seed, &set)) {
        fprintf(stderr, "sparseattn: bench kvcentric: inputs: %s\n", bh_last_error());
        return 1;
    }
    int32_t *d_idx = NULL;
    CK_SA(bh_alloc((void **)&d_idx, rows * KV_TOPK * sizeof *d_idx));
    CK_SA(bh_upload(d_idx, qidx, rows * KV_TOPK * sizeof *d_idx));

    sa_kv_params p;
    sa_kv_params_default(&p);
    p.shape = s;
    p.q = set.a.q;
    p.k = set.a.k;
    p.v = set.a.v;
    p.o = set.a.o;
    p.lse = set.a.lse;
    p.lists = (sa_query_lists){d_idx, NULL, KV_TOPK};
    p.stream = bh_stream(e.g);
    size_t ws = 0;
    CK_SA(sa_kv_workspace_size(&p, &ws)); /* FP32 partials: the larger */
    CK_SA(bh_alloc(&p.workspace, ws));
    p.workspace_bytes = ws;

    /* Work and floors. Useful FLOPs: QK and PV over the selected keys of every (query, head). */
    double sel_keys = (double)KV_TOPK * SA_TILE;
    double flops = 4.0 * KV_HEAD_DIM * sel_keys * (double)s.batch * s.heads_q * s.len_q;
    double prow = (double)s.batch * s.heads_q * s.len_q * KV_TOPK; /* partial rows */
    double out_bytes = (double)nq * 2 + (double)sa_lse_elems(&s) * 4;

    const sa_stage *dense = sa_stage_with(SA_ROLE_DEFAULT_DENSE);
    double dense_ms = 0;
    if (dense) {
        bh_timing t;
        size_t bad = 0;
        if (bh_smoke_stage(e.g, dense, &set, &bad) == SA_OK && bad == 0 &&
            bh_time_stage(e.g, dense, &set, 1, 1, f.warmup, f.reps, &t) == SA_OK)
            dense_ms = t.median_ms;
        else
            fprintf(stderr, "stage %d %s did not run cleanly (%zu bad outputs): %s\n", dense->id,
                    dense->name, bad, bh_last_error());
    }

    if (!f.json)
        printf("shape: B=%d Hq=%d Hkv=%d len_q=len_kv=%d D=%d, %d random blocks of %d per query; "
               "useful %.3g TFLOP; workspace %.2f GiB\n",
               s.batch, s.heads_q, s.heads_kv, s.len_q, s.head_dim, KV_TOPK, sa_kv_blocks(&s),
               flops / 1e12, ws / 1073741824.0);
    double kv_bf16_total = 0;
    /* Both partial formats on both part-2 kernels (sa_kv_params.attend). */
    for (int run = 0; run < 4; run++) {
        const int fmt = run % 2 ? SA_KV_PARTIAL_BF16 : SA_KV_PARTIAL_F32;
        const int attend = run / 2 ? SA_KV_ATTEND_MMA_SYNC : SA_KV_ATTEND_WGMMA;
        p.partial_format = fmt;
        p.attend = attend;
        kv_times t;
        CK_SA(kv_time_parts(e.g, &p, f.warmup, f.reps, &t));
        /* Smoke: O and LSE fully written after a run on poisoned outputs. */
        size_t bad_o = 0, bad_l = 0;
        CK_SA(bh_poison(e.g, set.a.o, nq * 2));
        CK_SA(bh_poison(e.g, set.a.lse, sa_lse_elems(&s) * 4));
        CK_SA(sa_kvcentric_attention(&p));
        CK_SA(bh_count_bad(e.g, set.a.o, nq, set.a.lse, sa_lse_elems(&s), &bad_o, &bad_l));
        double elem = fmt == SA_KV_PARTIAL_F32 ? 4 : 2;
        double part_bytes = prow * (KV_HEAD_DIM * elem + 4); /* O and LSE partials */
        double attend_floor = bench_byte_ms(part_bytes, e.copy_bps);
        double attend_flop_floor = bench_flop_ms(flops, f.gemm_tflops);
        double combine_floor = bench_byte_ms(part_bytes + out_bytes, e.copy_bps);
        const char *name = run == 0   ? "FP32 wgmma"
                           : run == 1 ? "BF16 wgmma"
                           : run == 2 ? "FP32 mma.sync"
                                      : "BF16 mma.sync";
        char what[96], fw[96];
        if (!f.json)
            printf("partials %s (%.2f GB written, read back once)%s\n", name, part_bytes / 1e9,
                   bad_o + bad_l ? "  OUTPUT NOT FULLY WRITTEN" : "");
        snprintf(what, sizeof what, "%s reverse index", name);
        print_row(&f, what, t.index, 0, "", 0);
        snprintf(what, sizeof what, "%s attention", name);
        int bytes_bound = attend_floor > attend_flop_floor;
        snprintf(fw, sizeof fw, "%s", bytes_bound ? "partials written / copy bw"
                                                  : "useful FLOP / GEMM rate");
        print_row(&f, what, t.attend, bytes_bound ? attend_floor : attend_flop_floor, fw, 0);
        snprintf(what, sizeof what, "%s combine", name);
        print_row(&f, what, t.combine, combine_floor, "partials read + O / copy bw", 0);
        snprintf(what, sizeof what, "%s total (no validation)", name);
        double tot_floor = attend_floor + combine_floor;
        print_row(&f, what, t.total, tot_floor, "partials both ways / copy bw",
                  dense_ms > 0 ? t.total / dense_ms : 0);
        snprintf(what, sizeof what, "%s total (validated, 1 sync)", name);
        print_row(&f, what, t.validated, 0, "", dense_ms > 0 ? t.validated / dense_ms : 0);
        if (!f.json)
            printf("  combine moves %.2f TB/s = %.0f%% of the copy bandwidth; attention %.0f "
                   "useful TFLOP/s, the whole op %.0f; outputs NaN after a run: %zu O, %zu LSE\n",
                   (part_bytes + out_bytes) / (t.combine * 1e9), 100 * combine_floor / t.combine,
                   bench_tflops(flops, t.attend), bench_tflops(flops, t.total), bad_o, bad_l);
        if (run == 1)
            kv_bf16_total = t.total;
    }

    /* Peers in the same run. */
    if (!f.json)
        printf("peers, same inputs:\n");
    if (dense_ms > 0) {
        char what[96];
        snprintf(what, sizeof what, "stage %d %s (all %d blocks)", dense->id, dense->name,
                 sa_kv_blocks(&s));
        print_row(&f, what, dense_ms, bench_flop_ms(bench_dense_flops(&s), f.gemm_tflops),
                  "dense FLOP / GEMM rate", 1.0);
    } else {
        printf("  dense: no default dense stage in the registry of this build, or it failed: no "
               "dense ratio\n");
    }
    int tiles = sa_q_tiles(&s), nb = sa_kv_blocks(&s);
    size_t trows = (size_t)s.batch * s.heads_kv * tiles;
    int32_t *tidx = malloc(trows * nb * sizeof *tidx), *tcnt = malloc(trows * sizeof *tcnt);
    if (!tidx || !tcnt)
        return 1;
    double avg = tile_union(&s, qidx, KV_TOPK, tidx, tcnt);
    int peers = 0;
    for (int i = 0; i < sa_stage_count(); i++) {
        const sa_stage *st = sa_stage_at(i);
        if (!cli_stage_sparse(st))
            continue;
        peers++;
        bh_timing t;
        char what[96];
        if (bh_set_lists(&set, tidx, tcnt, s.heads_kv, nb) != SA_OK ||
            bh_time_stage(e.g, st, &set, 1, 1, f.warmup, f.reps, &t) != SA_OK) {
            printf("  stage %d (%s) on the tile union: failed: %s\n", st->id, st->name,
                   bh_last_error());
            continue;
        }
        snprintf(what, sizeof what, "stage %d %s, tile union", st->id, st->name);
        print_row(&f, what, t.median_ms, 0, "", dense_ms > 0 ? t.median_ms / dense_ms : 0);
    }
    if (!f.json) {
        printf("  per-tile union of the queries' lists: %.2f of %d blocks on average%s\n", avg,
               nb, peers ? "" : " (no sparse stage in this build's registry: not timed)");
        if (dense_ms > 0)
            printf("goal: KV-centric with BF16 partials <= 0.75x the dense stage (%d %s): %.2fx "
                   "(%s)\n",
                   dense->id, dense->name, kv_bf16_total / dense_ms,
                   kv_bf16_total <= 0.75 * dense_ms ? "met" : "missed");
    }
    free(tidx);
    free(tcnt);
    free(qidx);
    bh_free(p.workspace);
    bh_free(d_idx);
    bh_set_destroy(&set);
    bh_close(e.g);
    return 0;
}
#endif
