/* "sparseattn bench sparse": every sparse stage of the registry on the original study's shape
 * (batch 2, 16 query heads on 1 KV head, D 128, len_q 4096, len_kv 4K/8K/16K, 16 blocks of 128
 * per Q tile, one list per GQA group) with two list patterns (independent, pairwise identical).
 *   useful TFLOP/s = 4 * D * sum over (b, hq, query) of its selected keys / time
 * Each stage is timed with GPU list validation on (the default) and off; the dense stages are
 * timed in the same run at the same len_kv, and the line gives useful / dense. Floors: useful
 * FLOPs / GEMM rate, and (Q + O + LSE + every selected K/V block once + lists) / copy bandwidth. */
#include "bench_gpu.h"
#include "shapes.h" /* bench/shapes.h: the shape, shared with bench/peers.py */

/* SA_BENCH_SPARSE_K: the selected KV blocks per (Q tile, GQA group). */
static const int sparse_len_kv[] = SA_BENCH_SPARSE_LEN_KV;
#define NLEN (int)(sizeof sparse_len_kv / sizeof sparse_len_kv[0])

static void usage(FILE *f)
{
    fprintf(f,
            "usage: sparseattn bench sparse [flags]\n"
            "  --stage ID        only this sparse stage (default: every sparse stage registered)\n"
            "  --reps N          timed launches per measurement, median reported (default 30)\n"
            "  --warmup N        untimed launches first (default 5, at least one per input set)\n"
            "  --no-validate     time only with GPU list validation off\n"
            "  --gemm-tflops X   bf16 GEMM rate for the FLOP floor (default %.0f: 8192^3\n"
            "                    torch.matmul on the H200; bench/peers.py measures it)\n"
            "  --seed S          seed of the random inputs and lists (default 2026)\n"
            "  --json            one JSON object per line\n"
            "shape: B=%d Hq=%d Hkv=%d D=%d len_q=%d len_kv=",
            BENCH_GEMM_TFLOPS_DEFAULT, SA_BENCH_SPARSE_B, SA_BENCH_SPARSE_HQ,
            SA_BENCH_SPARSE_HKV, SA_BENCH_SPARSE_D, SA_BENCH_SPARSE_SQ);
    for (int i = 0; i < NLEN; i++)
        fprintf(f, "%s%d", i ? "," : "", sparse_len_kv[i]);
    fprintf(f,
            ", %d blocks of %d per\n"
            "  Q tile, lists shared by the GQA group; patterns: independent, paired\n"
            "stages:",
            SA_BENCH_SPARSE_K, SA_TILE);
    for (int i = 0; i < sa_stage_count(); i++)
        fprintf(f, " %d (%s, %s)", sa_stage_at(i)->id, sa_stage_at(i)->name,
                cli_stage_sparse(sa_stage_at(i)) ? "sparse" : "dense baseline");
    fprintf(f, "%s\n", sa_stage_count() ? "" : " none registered in this build");
}

#ifndef SA_HAVE_CUDA
int bench_sparse(int argc, char **argv)
{
    bench_flags f;
    bench_parse(argc, argv, "sparse", 1, usage, &f);
    return bench_not_built("sparse");
}
#else

static const struct {
    int id;
    const char *name;
} patterns[] = {{SA_LISTS_INDEPENDENT, "independent"}, {SA_LISTS_PAIRED, "paired"}};
#define NPAT (int)(sizeof patterns / sizeof patterns[0])

/* Useful FLOPs and the fewest bytes of one launch on host lists (counts NULL: max_blocks each). */
static void list_work(const sa_shape *s, const int32_t *idx, int list_heads, int k, double *flops,
                      double *bytes)
{
    const int tiles = sa_q_tiles(s), nblk = sa_kv_blocks(s);
    const int group = s->heads_q / list_heads;
    const int kv_per_list = list_heads == s->heads_kv ? 1 : 0; /* else list head -> kv head */
    unsigned char *used = calloc((size_t)s->batch * s->heads_kv * nblk, 1);
    double keys_x_queries = 0;
    for (int b = 0; b < s->batch; b++)
        for (int lh = 0; lh < list_heads; lh++) {
            const int kvh = kv_per_list ? lh : lh / (s->heads_q / s->heads_kv);
            for (int t = 0; t < tiles; t++) {
                const int32_t *row = idx + (((size_t)b * list_heads + lh) * tiles + t) * k;
                const int left = s->len_q - t * SA_TILE;
                const int rows_q = left < SA_TILE ? left : SA_TILE;
                long keys = 0;
                for (int j = 0; j < k; j++) {
                    keys += sa_block_len(s, row[j]);
                    if (used)
                        used[((size_t)b * s->heads_kv + kvh) * nblk + row[j]] = 1;
                }
                keys_x_queries += (double)keys * rows_q * group;
            }
        }
    *flops = 4.0 * s->head_dim * keys_x_queries;
    double kv = 0;
    for (int b = 0; b < s->batch; b++)
        for (int h = 0; h < s->heads_kv; h++)
            for (int blk = 0; blk < nblk; blk++)
                if (!used || used[((size_t)b * s->heads_kv + h) * nblk + blk])
                    kv += 2.0 * 2.0 * sa_block_len(s, blk) * s->head_dim; /* K and V, BF16 */
    free(used);
    const double rows = (double)s->batch * list_heads * tiles;
    *bytes = 2.0 * 2.0 * (double)sa_q_elems(s) + 4.0 * (double)sa_lse_elems(s) + kv + rows * k * 4;
}

typedef struct dense_ref {
    int found;
    int id;
    const char *name;
    double tflops;
    int mha; /* 1: timed with Hkv = Hq because the stage rejects Hkv = 1 */
} dense_ref;

static void json_shape(const sa_shape *s)
{
    printf(",\"B\":%d,\"Hq\":%d,\"Hkv\":%d,\"Sq\":%d,\"Skv\":%d,\"D\":%d", s->batch, s->heads_q,
           s->heads_kv, s->len_q, s->len_kv, s->head_dim);
}

static void print_dense_line(const bench_flags *f, const sa_stage *st, const sa_shape *s,
                             const char *status, const char *why, const bh_timing *t,
                             double tf)
{
    if (f->json) {
        printf("{\"bench\":\"sparse\",\"kind\":\"dense_baseline\",\"stage_id\":%d,\"stage\":",
               st->id);
        cli_json_str(st->name);
        json_shape(s);
        printf(",\"status\":\"%s\"", status);
        if (why) {
            printf(",\"reason\":");
            cli_json_str(why);
        }
        if (t)
            printf(",\"median_ms\":%.6g,\"min_ms\":%.6g,\"max_ms\":%.6g,\"reps\":%d,"
                   "\"tflops\":%.6g", t->median_ms, t->min_ms, t->max_ms, t->reps, tf);
        printf("}\n");
    } else if (t) {
        printf("len_kv %-5d dense    stage %2d %-20s %8.3f ms  %6.1f TFLOP/s%s\n", s->len_kv,
               st->id, st->name, t->median_ms, tf,
               s->heads_kv == s->heads_q ? "  (Hkv = Hq: the stage rejects Hkv = 1)" : "");
    } else {
        printf("len_kv %-5d dense    stage %2d %-20s %s: %s\n", s->len_kv, st->id, st->name,
               status, why);
    }
    fflush(stdout);
}

/* Times one dense stage on `s` (sets already made) and, if it rejects Hkv = 1, on the MHA shape
 * with the same FLOPs. Returns 1 on failure. */
static int dense_baseline(const bench_flags *f, bench_env *e, const sa_stage *st, bh_set *sets,
                          int nsets, dense_ref *best)
{
    sa_shape s = sets[0].a.shape;
    int rc = st->check ? st->check(&sets[0].a) : SA_OK;
    bh_set mha[BENCH_MAX_SETS];
    int nmha = 0;
    if (rc) {
        const char *gqa_why = sa_strerror(rc);
        sa_shape m = s;
        m.heads_kv = m.heads_q;
        nmha = bench_sets("sparse", e, &m, f->seed ^ 0xd5e, mha);
        if (nmha < 0) {
            print_dense_line(f, st, &s, "failed", "could not allocate MHA inputs", NULL, 0);
            return 1;
        }
        rc = st->check ? st->check(&mha[0].a) : SA_OK;
        if (rc) {
            char why[300];
            snprintf(why, sizeof why, "Hkv=1: %s; Hkv=Hq: %s", gqa_why, sa_strerror(rc));
            print_dense_line(f, st, &s, "skipped", why, NULL, 0);
            bench_sets_free(mha, nmha);
            return 0;
        }
        sets = mha;
        nsets = nmha;
        s = m;
    }
    size_t bad = 0;
    int failed = 0;
    bh_timing t;
    rc = bh_smoke_stage(e->g, st, &sets[0], &bad);
    if (rc || bad) {
        char why[600];
        if (rc)
            snprintf(why, sizeof why, "%s", bh_last_error());
        else
            snprintf(why, sizeof why, "%zu outputs NaN/inf after one launch; not timed", bad);
        print_dense_line(f, st, &s, "failed", why, NULL, 0);
        failed = 1;
    } else if ((rc = bh_time_stage(e->g, st, sets, nsets, 1, f->warmup, f->reps, &t))) {
        print_dense_line(f, st, &s, "failed", bh_last_error(), NULL, 0);
        failed = 1;
    } else {
        const double tf = bench_tflops(bench_dense_flops(&s), t.median_ms);
        print_dense_line(f, st, &s, "ok", NULL, &t, tf);
        if (!best->found || tf > best->tflops) {
            best->found = 1;
            best->id = st->id;
            best->name = st->name;
            best->tflops = tf;
            best->mha = s.heads_kv == s.heads_q && s.heads_q != 1;
        }
    }
    if (nmha > 0)
        bench_sets_free(mha, nmha);
    return failed;
}

typedef struct sparse_case {
    const sa_shape *s;
    const char *pattern;
    double flops, bytes;
} sparse_case;

static void print_sparse_head(const bench_flags *f, const sa_stage *st, const sparse_case *c)
{
    if (f->json) {
        printf("{\"bench\":\"sparse\",\"kind\":\"stage\",\"stage_id\":%d,\"stage\":", st->id);
        cli_json_str(st->name);
        json_shape(c->s);
        printf(",\"pattern\":\"%s\",\"topk\":%d,\"list_heads\":%d", c->pattern,
               SA_BENCH_SPARSE_K, c->s->heads_kv);
    } else {
        printf("len_kv %-5d %-11s stage %2d %-20s ", c->s->len_kv, c->pattern, st->id, st->name);
    }
}

static int sparse_one(const bench_flags *f, bench_env *e, const sa_stage *st, bh_set *sets,
                      int nsets, const sparse_case *c, const dense_ref *dense)
{
    int rc = st->check ? st->check(&sets[0].a) : SA_OK;
    const char *status = "ok";
    char why[600] = "";
    size_t bad = 0;
    bh_timing tv = {0}, tn = {0}, ts = {0};
    if (rc) {
        status = "skipped";
        snprintf(why, sizeof why, "%s", sa_strerror(rc));
    } else if ((rc = bh_smoke_stage(e->g, st, &sets[0], &bad)) || bad) {
        status = "failed";
        if (rc)
            snprintf(why, sizeof why, "%s", bh_last_error());
        else
            snprintf(why, sizeof why, "%zu outputs NaN/inf after one launch; not timed", bad);
    } else if ((!f->no_validate &&
                ((rc = bh_time_stage(e->g, st, sets, nsets, 1, f->warmup, f->reps, &tv)) ||
                 (rc = bh_time_stage(e->g, st, sets, nsets, BH_SYNC_ONLY, f->warmup,
                                     f->reps, &ts)))) ||
               (rc = bh_time_stage(e->g, st, sets, nsets, 0, f->warmup, f->reps, &tn))) {
        status = "failed";
        snprintf(why, sizeof why, "%s", bh_last_error());
    }
    print_sparse_head(f, st, c);
    if (*why) {
        if (f->json) {
            printf(",\"status\":\"%s\",\"reason\":", status);
            cli_json_str(why);
            printf("}\n");
        } else {
            printf("%s: %s\n", status, why);
        }
        fflush(stdout);
        return strcmp(status, "failed") == 0;
    }
    /* The headline time is the default mode: validation on, unless --no-validate. */
    const bh_timing *th = f->no_validate ? &tn : &tv;
    const double tf = bench_tflops(c->flops, th->median_ms);
    const double tf_nv = bench_tflops(c->flops, tn.median_ms);
    const double flop_ms = bench_flop_ms(c->flops, f->gemm_tflops);
    const double byte_ms = bench_byte_ms(c->bytes, e->copy_bps);
    const double floor_ms = flop_ms > byte_ms ? flop_ms : byte_ms;
    if (f->json) {
        printf(",\"status\":\"ok\",\"useful_flops\":%.6g,\"min_bytes\":%.6g,\"input_sets\":%d,"
               "\"reps\":%d,\"host_us_per_call\":%.6g,\"novalidate_host_us_per_call\":%.6g",
               c->flops, c->bytes, nsets, tn.reps, th->host_us, tn.host_us);
        if (!f->no_validate)
            printf(",\"median_ms\":%.6g,\"min_ms\":%.6g,\"max_ms\":%.6g,\"tflops\":%.6g,"
                   "\"validation_ms\":%.6g,\"sync_only_median_ms\":%.6g",
                   tv.median_ms, tv.min_ms, tv.max_ms, tf, tv.median_ms - tn.median_ms,
                   ts.median_ms);
        printf(",\"novalidate_median_ms\":%.6g,\"novalidate_min_ms\":%.6g,"
               "\"novalidate_max_ms\":%.6g,\"novalidate_tflops\":%.6g",
               tn.median_ms, tn.min_ms, tn.max_ms, tf_nv);
        if (dense->found) {
            printf(",\"dense_stage_id\":%d,\"dense_tflops\":%.6g,\"dense_mha\":%d,"
                   "\"useful_over_dense\":%.6g,\"novalidate_useful_over_dense\":%.6g",
                   dense->id, dense->tflops, dense->mha, tf / dense->tflops,
                   tf_nv / dense->tflops);
        }
        printf(",\"flop_floor_ms\":%.6g,\"byte_floor_ms\":%.6g,\"floor_ms\":%.6g,"
               "\"gemm_tflops\":%.6g,\"copy_bytes_per_s\":%.6g}\n",
               flop_ms, byte_ms, floor_ms, f->gemm_tflops, e->copy_bps);
    } else {
        printf("%8.3f ms  useful %6.1f TFLOP/s", th->median_ms, tf);
        if (!f->no_validate)
            printf(" | no validation %.3f ms %.1f TFLOP/s, validation costs %.3f ms (%.1f%%; "
                   "%.3f ms of it the synchronization alone)",
                   tn.median_ms, tf_nv, tv.median_ms - tn.median_ms,
                   100.0 * (tv.median_ms - tn.median_ms) / tv.median_ms,
                   ts.median_ms - tn.median_ms);
        if (dense->found)
            printf(" | useful/dense %.2f (stage %d %.1f TFLOP/s)", tf / dense->tflops, dense->id,
                   dense->tflops);
        else
            printf(" | useful/dense n/a (no dense stage timed)");
        printf(" | floor %.3f ms (FLOP %.3f, bytes %.3f): %.1f%% of floor speed\n", floor_ms,
               flop_ms, byte_ms, 100.0 * floor_ms / th->median_ms);
    }
    fflush(stdout);
    return 0;
}

int bench_sparse(int argc, char **argv)
{
    bench_flags f;
    bench_parse(argc, argv, "sparse", 1, usage, &f);
    if (!sa_gpu_available()) {
        fprintf(stderr, "sparseattn: bench sparse: no usable CUDA device (the stages need compute "
                        "capability 9.0)\n");
        return 1;
    }
    int nsparse = 0, ndense = 0;
    for (int i = 0; i < sa_stage_count(); i++) {
        nsparse += cli_stage_sparse(sa_stage_at(i));
        ndense += !cli_stage_sparse(sa_stage_at(i));
    }
    if (!nsparse && !ndense) {
        fprintf(stderr, "sparseattn: bench sparse: the stage registry is empty\n");
        return 1;
    }
    bench_env e;
    if (bench_open("sparse", &f, &e))
        return 1;
    if (!nsparse && !f.json)
        printf("no sparse stage in the registry: only the dense baseline is timed\n");
    int failed = 0;
    for (int li = 0; li < NLEN; li++) {
        const sa_shape s = {SA_BENCH_SPARSE_B, SA_BENCH_SPARSE_HQ, SA_BENCH_SPARSE_HKV,
                            SA_BENCH_SPARSE_SQ, sparse_len_kv[li], SA_BENCH_SPARSE_D};
        bh_set sets[BENCH_MAX_SETS];
        int nsets = bench_sets("sparse", &e, &s, f.seed + (uint64_t)li * 1000003, sets);
        if (nsets < 0) {
            failed = 1;
            continue;
        }
        dense_ref dense = {0};
        for (int i = 0; i < sa_stage_count(); i++)
            if (!cli_stage_sparse(sa_stage_at(i))) {
                cli_progress("dense stage %d at len_kv %d...", sa_stage_at(i)->id, s.len_kv);
                failed |= dense_baseline(&f, &e, sa_stage_at(i), sets, nsets, &dense);
                cli_progress_done();
            }
        const int list_heads = s.heads_kv;
        const size_t list_len = (size_t)s.batch * list_heads * sa_q_tiles(&s) * SA_BENCH_SPARSE_K;
        int32_t *idx = malloc(list_len * sizeof *idx);
        if (!idx) {
            fprintf(stderr, "sparseattn: bench sparse: out of host memory\n");
            bench_sets_free(sets, nsets);
            failed = 1;
            break;
        }
        for (int p = 0; p < NPAT && nsparse; p++) {
            sparse_case c = {&s, patterns[p].name, 0, 0};
            int rc = 0;
            for (int i = 0; i < nsets && !rc; i++) {
                double fl, by;
                uint64_t lseed = f.seed * 31 + (uint64_t)li * 101 + (uint64_t)p * 7 + (uint64_t)i;
                rc = sa_random_tile_lists(&s, list_heads, SA_BENCH_SPARSE_K, patterns[p].id, lseed,
                                          idx);
                if (!rc)
                    rc = bh_set_lists(&sets[i], idx, NULL, list_heads, SA_BENCH_SPARSE_K);
                list_work(&s, idx, list_heads, SA_BENCH_SPARSE_K, &fl, &by);
                c.flops += fl / nsets;
                c.bytes += by / nsets;
            }
            if (rc) {
                fprintf(stderr, "sparseattn: bench sparse: lists: %s\n", bench_why(rc));
                failed = 1;
                continue;
            }
            for (int i = 0; i < sa_stage_count(); i++) {
                const sa_stage *st = sa_stage_at(i);
                if (!cli_stage_sparse(st) || (f.stage_id >= 0 && st->id != f.stage_id))
                    continue;
                cli_progress("stage %d, len_kv %d, %s...", st->id, s.len_kv, c.pattern);
                failed |= sparse_one(&f, &e, st, sets, nsets, &c, &dense);
                cli_progress_done();
            }
        }
        free(idx);
        bench_sets_free(sets, nsets);
    }
    bh_close(e.g);
    return failed;
}
#endif
