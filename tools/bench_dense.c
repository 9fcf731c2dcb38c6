/* "sparseattn bench dense": every dense stage of the registry (or the one --stage names) on the
 * three dense shapes of the original lineage, in TFLOP/s next to the floors:
 *   FLOP floor = 4*B*H*Sq*Skv*D / GEMM rate (--gemm-tflops, default measured through PyTorch),
 *   byte floor = (Q + K + V + O + LSE bytes) / copy bandwidth measured in this run.
 * After the dense stages, the registry's default tile-list stage with every KV block listed for
 * every Q tile ("all blocks": dense attention through the sparse kernel, validated as by
 * default), which issue #13 compares with the dense peers.
 * One line per (stage, shape); --json gives one JSON object per line instead. */
#include "bench_gpu.h"
#include "shapes.h" /* bench/shapes.h: the shapes, shared with bench/peers.py */

/* (B, H, S, D): Hq = Hkv = H, len_q = len_kv = S; the shapes of the B200 lineage's dense
 * benchmark. */
static const int dense_bhsd[][4] = SA_BENCH_DENSE_SHAPES;
#define NSHAPES (int)(sizeof dense_bhsd / sizeof dense_bhsd[0])

static void usage(FILE *f)
{
    fprintf(f,
            "usage: sparseattn bench dense [flags]\n"
            "  --stage ID        only this stage: a dense stage, or the default tile-list\n"
            "                    stage, run with every block listed (both listed below; default:\n"
            "                    every dense stage registered, then the tile-list stage)\n"
            "  --reps N          timed launches per (stage, shape), median reported (default 30)\n"
            "  --warmup N        untimed launches first (default 5, at least one per input set)\n"
            "  --gemm-tflops X   bf16 GEMM rate for the FLOP floor (default %.0f: 8192^3\n"
            "                    torch.matmul on the H200; bench/peers.py measures it)\n"
            "  --seed S          seed of the random inputs (default 2026)\n"
            "  --json            one JSON object per line\n"
            "shapes (B, H, S, D):",
            BENCH_GEMM_TFLOPS_DEFAULT);
    for (int i = 0; i < NSHAPES; i++)
        fprintf(f, " (%d,%d,%d,%d)", dense_bhsd[i][0], dense_bhsd[i][1], dense_bhsd[i][2],
                dense_bhsd[i][3]);
    fprintf(f, "\ndense stages:");
    cli_print_stages(f, 0, SA_ROLE_SPARSE);
    fprintf(f, "\ndefault tile-list stage (every block listed):");
    cli_print_stages(f, SA_ROLE_SPARSE | SA_ROLE_DEFAULT_TILE, 0);
    fputc('\n', f);
}

#ifndef SA_HAVE_CUDA
int bench_dense(int argc, char **argv)
{
    bench_flags f;
    bench_parse(argc, argv, "dense", 0, usage, &f);
    return bench_not_built("dense");
}
#else

static sa_shape dense_shape(int i)
{
    const int *d = dense_bhsd[i];
    const sa_shape s = {d[0], d[1], d[1], d[2], d[2], d[3]};
    return s;
}

/* all_blocks: a tile-list stage with every block listed (the line says so). */
static void print_head(const bench_flags *f, const sa_stage *st, const sa_shape *s, int all_blocks)
{
    if (f->json) {
        printf("{\"bench\":\"dense\",\"kind\":\"%s\",\"stage_id\":%d,\"stage\":",
               all_blocks ? "all_blocks" : "stage", st->id);
        cli_json_str(st->name);
        printf(",\"B\":%d,\"Hq\":%d,\"Hkv\":%d,\"Sq\":%d,\"Skv\":%d,\"D\":%d", s->batch,
               s->heads_q, s->heads_kv, s->len_q, s->len_kv, s->head_dim);
    } else {
        char name[64];
        snprintf(name, sizeof name, "%s%s", st->name, all_blocks ? " all blocks" : "");
        printf("stage %2d %-20s B=%d H=%d S=%-5d D=%d  ", st->id, name, s->batch, s->heads_q,
               s->len_q, s->head_dim);
    }
}

/* A (stage, shape) that did not run: skipped (check rejects) or failed (launch or outputs). */
static void print_not_run(const bench_flags *f, const sa_stage *st, const sa_shape *s,
                          int all_blocks, const char *status, const char *why)
{
    print_head(f, st, s, all_blocks);
    if (f->json) {
        printf(",\"status\":\"%s\",\"reason\":", status);
        cli_json_str(why);
        printf("}\n");
    } else {
        printf("%s: %s\n", status, why);
    }
    fflush(stdout);
}

/* Times one stage on the shape's sets; returns 1 if it failed (not if skipped). */
static int run_one(const bench_flags *f, bench_env *e, const sa_stage *st, bh_set *sets,
                   int nsets, int all_blocks)
{
    const sa_shape *s = &sets[0].a.shape;
    char why[600];
    int rc = st->check ? st->check(&sets[0].a) : SA_OK;
    if (rc) {
        print_not_run(f, st, s, all_blocks, "skipped", sa_strerror(rc));
        return 0;
    }
    size_t bad = 0;
    rc = bh_smoke_stage(e->g, st, &sets[0], &bad);
    if (rc || bad) {
        if (rc)
            snprintf(why, sizeof why, "%s", bh_last_error());
        else
            snprintf(why, sizeof why, "%zu outputs (O, LSE) NaN/inf after one launch on poisoned "
                     "buffers; not timed", bad);
        print_not_run(f, st, s, all_blocks, "failed", why);
        return 1;
    }
    bh_timing t;
    rc = bh_time_stage(e->g, st, sets, nsets, 1, f->warmup, f->reps, &t);
    if (rc) {
        print_not_run(f, st, s, all_blocks, "failed", bh_last_error());
        return 1;
    }
    const double flops = bench_dense_flops(s);
    const double tf = bench_tflops(flops, t.median_ms);
    const double flop_ms = bench_flop_ms(flops, f->gemm_tflops);
    const double byte_ms = bench_byte_ms((double)sets[0].bytes, e->copy_bps);
    const double floor_ms = flop_ms > byte_ms ? flop_ms : byte_ms;
    print_head(f, st, s, all_blocks);
    if (f->json) {
        printf(",\"status\":\"ok\",\"flops\":%.6g,\"bytes\":%zu,\"median_ms\":%.6g,\"min_ms\":%.6g,"
               "\"max_ms\":%.6g,\"reps\":%d,\"host_us_per_call\":%.6g,\"input_sets\":%d,"
               "\"tflops\":%.6g,\"flop_floor_ms\":%.6g,\"byte_floor_ms\":%.6g,\"floor_ms\":%.6g,"
               "\"gemm_tflops\":%.6g,\"copy_bytes_per_s\":%.6g}\n",
               flops, sets[0].bytes, t.median_ms, t.min_ms, t.max_ms, t.reps, t.host_us, nsets, tf,
               flop_ms, byte_ms, floor_ms, f->gemm_tflops, e->copy_bps);
    } else {
        printf("%8.3f ms (min %.3f, max %.3f)  %6.1f TFLOP/s | floor %.3f ms (FLOP %.3f, bytes "
               "%.3f): %4.1f%% of floor speed\n",
               t.median_ms, t.min_ms, t.max_ms, tf, floor_ms, flop_ms, byte_ms,
               100.0 * floor_ms / t.median_ms);
    }
    fflush(stdout);
    return 0;
}

/* Lists with every KV block for every Q tile, one list head per KV head, on each set. */
static int all_block_lists(bh_set *sets, int nsets)
{
    const sa_shape *s = &sets[0].a.shape;
    const int nb = sa_kv_blocks(s);
    const size_t rows = (size_t)s->batch * s->heads_kv * sa_q_tiles(s);
    int32_t *idx = malloc(rows * nb * sizeof *idx);
    if (!idx)
        return SA_ERR_NOMEM;
    for (size_t r = 0; r < rows; r++)
        for (int j = 0; j < nb; j++)
            idx[r * nb + j] = j;
    int rc = SA_OK;
    for (int i = 0; i < nsets && !rc; i++)
        rc = bh_set_lists(&sets[i], idx, NULL, s->heads_kv, nb);
    free(idx);
    return rc;
}

int bench_dense(int argc, char **argv)
{
    bench_flags f;
    bench_parse(argc, argv, "dense", 0, usage, &f);
    int ndense = 0;
    for (int i = 0; i < sa_stage_count(); i++)
        ndense += !cli_stage_sparse(sa_stage_at(i));
    if (!sa_gpu_available()) {
        fprintf(stderr, "sparseattn: bench dense: no usable CUDA device (the stages need compute "
                        "capability 9.0)\n");
        return 1;
    }
    if (!ndense) {
        fprintf(stderr, "sparseattn: bench dense: no dense stage in the registry\n");
        return 1;
    }
    bench_env e;
    if (bench_open("dense", &f, &e))
        return 1;
    int failed = 0;
    for (int si = 0; si < NSHAPES; si++) {
        const sa_shape shape = dense_shape(si), *s = &shape;
        bh_set sets[BENCH_MAX_SETS];
        int nsets = bench_sets("dense", &e, s, f.seed + (uint64_t)si * 1000003, sets);
        if (nsets < 0) {
            failed = 1;
            continue;
        }
        for (int i = 0; i < sa_stage_count(); i++) {
            const sa_stage *st = sa_stage_at(i);
            if (cli_stage_sparse(st) || (f.stage_id >= 0 && st->id != f.stage_id))
                continue;
            cli_progress("stage %d on (%d,%d,%d,%d)...", st->id, s->batch, s->heads_q, s->len_q,
                         s->head_dim);
            failed |= run_one(&f, &e, st, sets, nsets, 0);
            cli_progress_done();
        }
        const sa_stage *tile = sa_stage_with(SA_ROLE_DEFAULT_TILE);
        if (tile && (f.stage_id < 0 || f.stage_id == tile->id)) {
            cli_progress("stage %d, every block listed, on (%d,%d,%d,%d)...", tile->id, s->batch,
                         s->heads_q, s->len_q, s->head_dim);
            const int rc = all_block_lists(sets, nsets);
            if (rc) {
                print_not_run(&f, tile, s, 1, "failed", sa_strerror(rc));
                failed = 1;
            } else {
                failed |= run_one(&f, &e, tile, sets, nsets, 1);
            }
            cli_progress_done();
        }
        bench_sets_free(sets, nsets);
    }
    bh_close(e.g);
    return failed;
}
#endif
