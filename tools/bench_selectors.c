/* "sparseattn bench selectors": the GPU selectors alone, and the selector -> attention pipeline.
 *
 * Shape of the original study (bench/shapes.h, SA_BENCH_SPARSE_*): batch 2, 16 query heads on 1
 * KV head, D 128, 4096 queries, 4K / 8K / 16K keys, 16 blocks per row. Everything goes through
 * the registries: every selector with a GPU function, and the registry's default tile-list stage
 * (SA_ROLE_DEFAULT_TILE) where it accepts the shape, else the first sparse stage that does, or
 * the stage --stage N names.
 *   1. Each selector alone (gaussian inputs): median time next to its floor, the bytes it must
 *      read once (Q and K in BF16) over the copy bandwidth measured in this run (and for the
 *      nvfp4 scorers also its FLOPs over the bf16 GEMM rate, and the TFLOP/s it reaches as a
 *      share of that rate), and next to a kernel that only reads Q and K once, timed the same
 *      way ("x read"). The nvfp4 scorers once more on index vectors of their own with
 *      --index-heads heads (default heads_kv, one per KV group as MiniMax's MSA; 0: none) and
 *      index_dim = D ("nvfp4/iN" rows). A selector whose GPU function takes per-head and pooled
 *      lists (sa_selector.cuda_head_lists: nvfp4_mass) once more with each ("/ph", "/pool").
 *      nvfp4_mass's FLOPs count its two passes over QK^T. The GPU NVFP4 quantizer of Q alone.
 *   2. Per workload (sa_workload_generate: gaussian and the structured ones) and tile selector:
 *      the pipeline (selector then attention, lists passed on the device) and the attention alone
 *      on the same lists; useful TFLOP/s = 4 * D * (query, selected key) pairs / time, and the
 *      pipeline's share of the attention-only rate. The selectors get a verdict
 *      (sa_select_params.verdict), so the nvfp4 scorers queue the attention without a host
 *      synchronization, as a pipeline would call them. The nvfp4 row once more with index heads
 *      ("nvfp4/iN"): sa_index_generate("qk") of the workload's Q and K.
 *   3. Per workload and per-query GPU selector (nvfp4_query, and /iN): the selector then the
 *      KV-centric attention (sa_kvcentric_attention, schedules kv and hybrid), against the
 *      attention alone on the same lists (bench_selectors_query.c). Issue 18's long-context
 *      goal is this share at len_q = len_kv = 32K and 64K, batch 1.
 * --selectors and --workloads narrow every part to the rows named.
 * Timing: the harness's (bench_harness.h) CUDA events around each call, warm-up, median, input
 * sets rotated to stay out of L2; each thing timed is a harness callback whose context is one
 * input set and what it runs (sel_call). The stage runs with validate = 0 (the lists come from a
 * selector in the same run); --validate turns the GPU list check on in both columns of the tile
 * pipelines (the per-query pipeline, bench_selectors_query.c, always runs unvalidated). */
#include <stdlib.h>
#include <string.h>

#include "bench_selectors.h"
#include "cli.h"
#include "sel_cuda.h"     /* SEL_CUDA_MAX_BLOCKS; the GPU functions with CUDA */
#include "sel_internal.h" /* sel_index_heads: the index-head rule the selectors apply */
#include "sa_timeline.h"  /* --timeline: the kernels' stamps (a -Dtimeline=true build) */

static const int bench_lens[] = SA_BENCH_SPARSE_LEN_KV;
#define NLENS (int)(sizeof bench_lens / sizeof bench_lens[0])
/* --len-kv: at least BENCH_K blocks (the lists, and the placeholder lists 0..BENCH_K-1 every set
 * starts with), at most the GPU selectors' top-k limit. */
#define BS_MIN_LEN_KV ((BENCH_K - 1) * SA_TILE + 1)
#define BS_MAX_LEN_KV (SEL_CUDA_MAX_BLOCKS * SA_TILE)
#define BS_TIMELINE_MAX 200     /* --timeline's most calls per row */
#define BS_TIMELINE_SPIN_US 300 /* the spin ahead of each: longer than the host's launches */
/* The quantizer takes whole blocks of 16 values (sa_q_elems / 2 and / 16 bytes) and the read-once
 * kernel whole 16-byte chunks of Q and K: both hold for every shape of this bench while D does. */
_Static_assert(SA_BENCH_SPARSE_D % 16 == 0, "bench selectors needs D a multiple of 16");

static void usage(FILE *f)
{
    fprintf(f,
            "usage: sparseattn bench selectors [flags]\n"
            "GPU selectors alone (median time vs the memory floor), then the selector ->\n"
            "attention pipeline's useful TFLOP/s against the attention alone, at batch %d,\n"
            "%d query heads on %d KV head, D %d, %d queries, ",
            SA_BENCH_SPARSE_B, SA_BENCH_SPARSE_HQ, SA_BENCH_SPARSE_HKV, SA_BENCH_SPARSE_D,
            SA_BENCH_SPARSE_SQ);
    for (int i = 0; i < NLENS; i++)
        fprintf(f, bench_lens[i] % 1024 ? "%s%d" : "%s%dK", i ? "/" : "",
                bench_lens[i] % 1024 ? bench_lens[i] : bench_lens[i] / 1024);
    fprintf(f,
            " keys, top-%d.\n"
            "Per-query selectors (nvfp4_query) then feed the KV-centric attention\n"
            "(schedules kv and hybrid): the per-query pipeline part.\n"
            "  --len-kv N        only this key length (default: each above in turn), in\n"
            "                    %d..%d: at least %d blocks of %d keys for the lists, at\n"
            "                    most the %d blocks the GPU selectors' top-k takes\n"
            "  --len-q N         queries (default %d)\n"
            "  --batch N         batch (default %d); the shape must pass sa_shape_check\n"
            "  --index-heads N   also time the nvfp4 scorers on index vectors with N heads of\n"
            "                    dimension D (default %d; 0: none; N divides %d)\n"
            "  --no-pipeline     time the selectors only\n"
            "  --selectors LIST  comma-separated: keep only those selectors or rows (nvfp4_query,\n"
            "                    nvfp4_query/i1; \"scorer\": the scorer-kernel and quantizer rows)\n"
            "  --workloads LIST  comma-separated: only those workloads in the pipeline parts\n"
            "  --stage ID        the sparse stage of the tile pipelines (default: the registry's\n"
            "                    default tile-list stage where it takes the shape, else the\n"
            "                    first sparse stage that does)\n"
            "  --validate        turn the GPU list check on in the tile pipelines and the\n"
            "                    attention column (default off: the lists come from a selector\n"
            "                    in the same run; the per-query pipeline always runs without)\n"
            "  --reps N          timed calls per row, median reported (default 30)\n"
            "  --warmup N        untimed calls first (default 5, at least one per input set)\n"
            "  --gemm-tflops X   bf16 GEMM rate for the FLOP floor (default %.0f: 8192^3\n"
            "                    torch.matmul on the H200; bench/peers.py measures it)\n"
            "  --seed S          seed of the inputs, workloads and index vectors (default 2026)\n"
            "  --json            one JSON object per line\n"
            "  --timeline N      after each tile pipeline row, N more calls one at a time, each\n"
            "                    queued behind a spinning kernel: when each stamped kernel (the\n"
            "                    nvfp4 quantizer, scorer, top-k, stage 17) started, passed its\n"
            "                    dependent-launch wait and ended, medians in us; needs a build\n"
            "                    configured with -Dtimeline=true (N 1..%d)\n"
            "Long context, one index head:\n"
            "  --batch 1 --len-q 32768 --len-kv 32768 --selectors nvfp4_query/i1\n"
            "GPU selectors:",
            BENCH_K, BS_MIN_LEN_KV, BS_MAX_LEN_KV, BENCH_K, SA_TILE, SEL_CUDA_MAX_BLOCKS,
            SA_BENCH_SPARSE_SQ, SA_BENCH_SPARSE_B, SA_BENCH_SPARSE_HKV, SA_BENCH_SPARSE_HQ,
            BENCH_GEMM_TFLOPS_DEFAULT, BS_TIMELINE_MAX);
    int any = 0;
    for (int i = 0; i < sa_selector_count(); i++)
        if (sa_selector_at(i)->cuda) {
            fprintf(f, " %s", sa_selector_at(i)->name);
            any = 1;
        }
    fprintf(f, "%s\nsparse stages:", any ? "" : " none in this build");
    cli_print_stages(f, SA_ROLE_SPARSE, 0);
    fputc('\n', f);
}

/* --selectors and --workloads (NULL: every one). */
static const char *want_selectors, *want_workloads;
static int want_timeline; /* --timeline N: N single pipeline calls per tile selector row */

/* One entry of --selectors (*ctx 1) or --workloads (*ctx 0), split by cli_list: a usage error
 * unless it names a workload, or "scorer", or a selector (a row "name/..." too) that has a GPU
 * function. Which selectors have one is known only with CUDA built (.cuda is NULL without): there
 * any registered selector passes, so a command line is judged alike in both builds. */
static void check_name(const char *flag, const char *entry, void *ctx)
{
    const int selectors = *(const int *)ctx;
    char name[CLI_LIST_ENTRY_MAX + 1];
    snprintf(name, sizeof name, "%s", entry);
    if (selectors)
        name[strcspn(name, "/")] = 0;
    const sa_selector *sel = selectors ? sa_selector_by_name(name) : NULL;
    const int ok = selectors ? (sel && (sel->cuda || !CLI_CUDA_BUILT)) || !strcmp(name, "scorer")
                             : sa_workload_by_name(name) != NULL;
    if (ok)
        return;
    char names[256] = "";
    for (int i = 0; i < (selectors ? sa_selector_count() : sa_workload_count()); i++) {
        const char *n = selectors ? (sa_selector_at(i)->cuda || !CLI_CUDA_BUILT
                                         ? sa_selector_at(i)->name
                                         : NULL)
                                  : sa_workload_at(i)->name;
        if (n)
            snprintf(names + strlen(names), sizeof names - strlen(names), " %s", n);
    }
    if (sel)
        cli_usage_error("%s: selector '%s' has no GPU function (GPU selectors:%s, and scorer)",
                        flag, name, names);
    cli_usage_error("%s: '%s' is not one of:%s%s", flag, name, names,
                    selectors ? " scorer (a name/row such as nvfp4_query/i1 too)" : "");
}

/* This bench's flags, and the shared ones (bench_parse); the same in a build without CUDA, so a
 * bad flag is a usage error (exit 2) there too. */
typedef struct sel_flags {
    bench_flags f;
    int validate, only_len, no_pipeline, index_heads, len_q, batch, timeline;
} sel_flags;

/* What the bench relies on about its sizes, judged after parsing and before any GPU work (in both
 * builds): every shape it runs passes sa_shape_check, len-kv gives the lists their BENCH_K blocks
 * and stays within the GPU selectors' top-k (SEL_CUDA_MAX_BLOCKS), and the index heads follow
 * the selectors' own rule (sel_index_heads). */
static void check_sizes(const sel_flags *o)
{
    for (int li = 0; li < (o->only_len ? 1 : NLENS); li++) {
        const sa_shape s = {o->batch, SA_BENCH_SPARSE_HQ, SA_BENCH_SPARSE_HKV, o->len_q,
                            o->only_len ? o->only_len : bench_lens[li], SA_BENCH_SPARSE_D};
        const int err = sa_shape_check(&s);
        if (err)
            cli_usage_error("bench selectors: batch %d, len-q %d, len-kv %d (%d query heads, %d "
                            "KV head, D %d): %s",
                            s.batch, s.len_q, s.len_kv, s.heads_q, s.heads_kv, s.head_dim,
                            sa_strerror(err));
        const int blocks = sa_kv_blocks(&s);
        if (blocks < BENCH_K || blocks > SEL_CUDA_MAX_BLOCKS)
            cli_usage_error("bench selectors: --len-kv %d gives %d blocks of %d keys: the lists "
                            "need at least %d and the GPU selectors take at most %d "
                            "(len-kv %d..%d)",
                            s.len_kv, blocks, SA_TILE, BENCH_K, SEL_CUDA_MAX_BLOCKS,
                            BS_MIN_LEN_KV, BS_MAX_LEN_KV);
    }
    const sa_shape s = {1, SA_BENCH_SPARSE_HQ, SA_BENCH_SPARSE_HKV, 1, 1, SA_BENCH_SPARSE_D};
    int qh, kh;
    if (sel_index_heads(&s, o->index_heads, &qh, &kh))
        cli_usage_error("bench selectors: --index-heads %d must divide the %d query heads and "
                        "divide or be a multiple of the %d KV head%s (0: none)",
                        o->index_heads, s.heads_q, s.heads_kv, s.heads_kv == 1 ? "" : "s");
}

static void parse_flags(int argc, char **argv, sel_flags *o)
{
    o->validate = 0, o->only_len = 0, o->no_pipeline = 0, o->timeline = 0;
    o->index_heads = SA_BENCH_SPARSE_HKV, o->len_q = SA_BENCH_SPARSE_SQ;
    o->batch = SA_BENCH_SPARSE_B;
    for (int i = 1; i < argc; i++) {
        int used = 0;
        if (!strcmp(argv[i], "--validate"))
            o->validate = used = 1;
        else if (!strcmp(argv[i], "--no-validate")) /* the shared parser would take and drop it */
            cli_usage_error("bench selectors: unknown flag '--no-validate' (the pipelines run "
                            "unvalidated unless --validate)");
        else if (!strcmp(argv[i], "--no-pipeline"))
            o->no_pipeline = used = 1;
        else if (!strcmp(argv[i], "--len-kv")) {
            int j = i;
            o->only_len = (int)cli_int_arg(argc, argv, &j, 1, 1 << 30);
            used = 2;
        } else if (!strcmp(argv[i], "--len-q")) {
            int j = i;
            o->len_q = (int)cli_int_arg(argc, argv, &j, 1, 1 << 30);
            used = 2;
        } else if (!strcmp(argv[i], "--batch")) {
            int j = i;
            o->batch = (int)cli_int_arg(argc, argv, &j, 1, 1 << 16);
            used = 2;
        } else if (!strcmp(argv[i], "--timeline")) {
            int j = i;
            o->timeline = (int)cli_int_arg(argc, argv, &j, 1, BS_TIMELINE_MAX);
#ifndef SA_TIMELINE
            cli_usage_error("bench selectors: --timeline needs a build configured with "
                            "-Dtimeline=true (meson configure BUILD -Dtimeline=true), whose "
                            "kernels stamp the GPU timer");
#endif
            used = 2;
        } else if (!strcmp(argv[i], "--index-heads")) {
            int j = i;
            o->index_heads = (int)cli_int_arg(argc, argv, &j, 0, SA_BENCH_SPARSE_HQ);
            used = 2;
        } else if (!strcmp(argv[i], "--selectors") || !strcmp(argv[i], "--workloads")) {
            int j = i;
            const char *list = cli_str_arg(argc, argv, &j);
            int selectors = argv[i][2] == 's';
            cli_list(argv[i], list, check_name, &selectors);
            *(argv[i][2] == 's' ? &want_selectors : &want_workloads) = list;
            used = 2;
        }
        if (used) {
            for (int j = i; j + used < argc; j++)
                argv[j] = argv[j + used];
            argc -= used;
            i--;
        }
    }
    bench_parse(argc, argv, "selectors", 1, usage, &o->f);
    o->f.no_validate = !o->validate;
    want_timeline = o->timeline;
    check_sizes(o);
}

#ifndef SA_HAVE_CUDA
int bench_selectors(int argc, char **argv)
{
    sel_flags o;
    parse_flags(argc, argv, &o);
    return bench_not_built("selectors");
}
#else
/* Device buffers the selectors and the quantizer write when timed alone (one of each, shared by
 * every input set). */
typedef struct sel_bufs {
    int32_t *idx, *cnt; /* selector-only output, sized for per-query lists */
    uint8_t *qv, *qs;   /* quantizer output */
    void *qwork;        /* quantizer: tensor scale, bad flag, then its work buffer (from 16) */
    unsigned *keys;     /* the scorer kernel's block-score rows (per query) */
    float *ts;          /* tensor scales 1, 1 for the scorer kernel alone */
} sel_bufs;

/* The context of one timed call: an input set (Q, K; for the pipeline also V, O, LSE and the
 * set's device lists) and what runs on it. */
typedef struct sel_call {
    const sa_selector *sel;
    const sa_stage *attn;
    const sel_bufs *buf;
    sa_gpu_attn *a;
    const uint16_t *qi, *ki; /* the set's index vectors (index_dim = D), or NULL */
    int index_heads;
    int head_lists; /* sa_select_params.head_lists */
} sel_call;

int bs_wanted(const char *list, const char *name, const char *row)
{
    if (!list)
        return 1;
    const size_t nl = strlen(name), rl = row ? strlen(row) : 0;
    for (const char *e = list; *e;) {
        const size_t len = strcspn(e, ",");
        if ((len == nl && !strncmp(e, name, nl)) || (row && len == rl && !strncmp(e, row, rl)) ||
            (!row && len > nl && !strncmp(e, name, nl) && e[nl] == '/'))
            return 1;
        e += len + (e[len] == ',');
    }
    return 0;
}

/* The pipeline's selectors record bad input here instead of synchronizing (the nvfp4 scorers'
 * sa_select_params.verdict); read after each pipeline's timing. */
static sa_gpu_verdict *pipe_verdict;

static void params_for(const sel_call *c, void *stream, sa_select_params *p)
{
    sa_select_params_default(p);
    p->k = BENCH_K;
    p->stream = stream;
    p->head_lists = c->head_lists;
    if (c->attn)
        p->verdict = pipe_verdict;
    if (c->qi) {
        p->q_index = c->qi, p->k_index = c->ki;
        p->index_dim = c->a->shape.head_dim;
        p->index_heads = c->index_heads;
    }
}

static int call_selector(void *ctx, void *stream)
{
    const sel_call *c = ctx;
    sa_select_params p;
    params_for(c, stream, &p);
    return c->sel->cuda(&c->a->shape, c->a->q, c->a->k, &p, c->buf->idx, c->buf->cnt);
}

static int call_pipeline(void *ctx, void *stream)
{
    const sel_call *c = ctx;
    sa_select_params p;
    params_for(c, stream, &p);
    c->a->stream = stream;
    /* The set's device lists are the selector's output and the stage's input. */
    int rc = c->sel->cuda(&c->a->shape, c->a->q, c->a->k, &p, (int32_t *)c->a->lists.indices,
                          (int32_t *)c->a->lists.counts);
    return rc ? rc : c->attn->launch(c->a);
}

/* Reads Q and K once and does nothing else: the measured floor the selectors are also shown
 * against, timed the same way as they are. */
static int call_read(void *ctx, void *stream)
{
    const sa_gpu_attn *a = ((const sel_call *)ctx)->a;
    return bh_read_once(a->q, sa_q_elems(&a->shape) * 2, a->k, sa_kv_elems(&a->shape) * 2,
                        stream);
}

/* The nvfp4 scorer's kernel alone on the set's Q/K (or index vectors) as dequantized values;
 * per_query rides in the selector slot (NULL: tile rows). */
static int call_score_only(void *ctx, void *stream)
{
    const sel_call *c = ctx;
    const sa_shape *s = &c->a->shape;
    const int qh = c->qi ? c->index_heads : s->heads_q, kh = c->qi ? c->index_heads : s->heads_kv;
    return sel_nvfp4_score_only(c->qi ? c->qi : c->a->q, c->qi ? c->ki : c->a->k, c->buf->ts,
                                s->batch, qh, kh, s->heads_kv, s->len_q, s->len_kv, s->head_dim,
                                c->sel != NULL, 0, c->buf->keys, stream);
}

static int call_quantizer(void *ctx, void *stream)
{
    const sel_call *c = ctx;
    sa_nvfp4 z = {c->buf->qv, c->buf->qs, 0.0f, 0};
    return sa_nvfp4_quantize_bf16_cuda(c->a->q, sa_q_elems(&c->a->shape), &z, stream);
}

static int call_quantizer_async(void *ctx, void *stream)
{
    const sel_call *c = ctx;
    float *ts = c->buf->qwork;
    return sel_nvfp4_quantize_async(c->a->q, sa_q_elems(&c->a->shape), c->buf->qv, c->buf->qs, ts,
                                    (int *)(ts + 1), ts + 4, NULL, stream);
}

/* Times fn on the sets in rotation (call i on sets[i % nsets]), its context sel / attn / buf and
 * the set; a selector writes the lists of head_lists mode `mode`. */
static int time_call_mode(bench_env *e, const bench_flags *f, const char *name, bh_fn fn,
                          const sa_selector *sel, const sa_stage *attn, const sel_bufs *buf,
                          const index_sets *ix, bh_set *sets, int nsets, int mode, bh_timing *t)
{
    sel_call calls[BENCH_MAX_SETS];
    void *ctx[BENCH_MAX_SETS];
    for (int i = 0; i < nsets; i++) {
        calls[i] = (sel_call){sel, attn, buf, &sets[i].a, NULL, NULL, 0, mode};
        if (ix && ix->heads)
            calls[i].qi = ix->q[i], calls[i].ki = ix->k[i], calls[i].index_heads = ix->heads;
        ctx[i] = &calls[i];
    }
    return bh_time(e->g, name, fn, ctx, nsets, 0, f->warmup, f->reps, t);
}

/* time_call_mode with the group's lists. */
static int time_call(bench_env *e, const bench_flags *f, const char *name, bh_fn fn,
                     const sa_selector *sel, const sa_stage *attn, const sel_bufs *buf,
                     const index_sets *ix, bh_set *sets, int nsets, bh_timing *t)
{
    return time_call_mode(e, f, name, fn, sel, attn, buf, ix, sets, nsets, SA_HEAD_LISTS_GROUP,
                          t);
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
                              const char *workload, const bh_timing *t)
{
    printf("{\"bench\":\"selectors\",\"kind\":\"%s\",\"len_kv\":%d,\"selector\":", part,
           s->len_kv);
    cli_json_str(sel);
    if (workload) {
        printf(",\"workload\":");
        cli_json_str(workload);
    }
    printf(",\"median_ms\":%.6g,\"min_ms\":%.6g,\"max_ms\":%.6g,\"reps\":%d,"
           "\"host_us_per_call\":%.6g",
           t->median_ms, t->min_ms, t->max_ms, t->reps, t->host_us);
}

/* Part 1 at one length: every GPU selector alone, and the quantizer. */
static int selectors_alone(bench_env *e, const bench_flags *f, const sa_shape *s, bh_set *sets,
                           int nsets, const sel_bufs *buf, const index_sets *ix)
{
    const double qk_bytes = 2.0 * ((double)sa_q_elems(s) + (double)sa_kv_elems(s));
    const double floor_ms = bench_byte_ms(qk_bytes, e->copy_bps);
    /* First a kernel that only reads Q and K once: what the memory floor costs in practice under
     * this timing (one launch, its ramp-up and tail, the events around it). */
    bh_timing tr;
    int rc0 = time_call(e, f, "read Q+K", call_read, NULL, NULL, buf, NULL, sets, nsets, &tr);
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
        if (!sel->cuda || !bs_wanted(want_selectors, sel->name, NULL))
            continue;
        const int nvfp4 = !strncmp(sel->name, "nvfp4", 5);
        /* nvfp4_mass runs the scorer's GEMMs twice (the log-sum-exp, then the mass). */
        const double gemms = !strcmp(sel->name, "nvfp4_mass") ? 2.0 : 1.0;
        /* pass 1: the nvfp4 scorers on index vectors of their own (ix->heads heads); passes 2
         * and 3: per-head and pooled lists, where the GPU function takes them. */
        for (int pass = 0; pass < 4; pass++) {
            const int mode = pass < 2 ? SA_HEAD_LISTS_GROUP : pass - 1;
            if ((pass == 1 && !(nvfp4 && ix->heads)) ||
                (pass >= 2 && !(sel->cuda_head_lists & SA_HEAD_LISTS_BIT(mode))))
                continue;
            char name[40];
            snprintf(name, sizeof name, pass == 1 ? "%s/i%d" : pass == 2 ? "%s/ph" : pass == 3
                     ? "%s/pool" : "%s", sel->name, ix->heads);
            if (!bs_wanted(want_selectors, sel->name, name))
                continue;
            bh_timing t;
            int rc = time_call_mode(e, f, name, call_selector, sel, NULL, buf,
                                    pass == 1 ? ix : NULL, sets, nsets, mode, &t);
            if (rc) {
                fprintf(stderr, "sparseattn: bench selectors: %s: %s\n", name, bench_why(rc));
                return rc;
            }
            /* The nvfp4 scorers do every (query, key) dot product of their scored heads: 2 * D
             * FLOPs each. */
            const int heads = pass == 1 ? ix->heads : s->heads_q;
            const double bytes = pass == 1 ? 2.0 * s->batch * ix->heads * s->head_dim *
                                            ((double)s->len_q + s->len_kv)
                                      : qk_bytes;
            const double mem_ms = bench_byte_ms(bytes, e->copy_bps);
            const double flops = nvfp4 ? gemms * 2.0 * s->batch * heads * (double)s->len_q *
                                             s->len_kv * s->head_dim
                                       : 0;
            const double flop_ms = bench_flop_ms(flops, f->gemm_tflops);
            const double fl = flop_ms > mem_ms ? flop_ms : mem_ms;
            const double tf = nvfp4 ? bench_tflops(flops, t.median_ms) : 0;
            if (f->json) {
                print_timing_json("selector", s, name, NULL, &t);
                printf(",\"bytes\":%.6g,\"mem_floor_ms\":%.6g,\"flop_floor_ms\":%.6g,"
                       "\"x_floor\":%.4g,\"read_floor_ms\":%.6g,\"x_read\":%.4g,"
                       "\"index_heads\":%d,\"tflops\":%.6g,\"gemm_share\":%.4g}\n",
                       bytes, mem_ms, flop_ms, t.median_ms / fl, tr.median_ms,
                       t.median_ms / tr.median_ms, pass == 1 ? ix->heads : 0, tf,
                       tf / f->gemm_tflops);
            } else {
                /* The issues' goals on the H200: r1 within 1.5x of its floor, r4 within 2x; the
                 * nvfp4 scorers at >= 60% of the BF16 GEMM rate (issue #18). */
                const char *goal = !strcmp(sel->name, "r1")   ? "<=1.5"
                                   : !strcmp(sel->name, "r4") ? "<=2"
                                                              : "-";
                printf("%-12s %8.4f %7.4f %10.4f %10.4f %8.2f %6s %7.2f", name, t.median_ms,
                       t.min_ms, mem_ms, flop_ms, t.median_ms / fl, goal,
                       t.median_ms / tr.median_ms);
                if (nvfp4)
                    printf("  (%.0f TFLOP/s, %.0f%% of the GEMM rate; goal >= 60%%)", tf,
                           100.0 * tf / f->gemm_tflops);
                printf("\n");
            }
            fflush(stdout);
        }
    }
    /* The scorer's kernel alone (no quantizer, top-k or host synchronisation), tile and
     * per-query rows, with the attention's heads and with the index heads; then the quantizer.
     * With --selectors, only where the list names "scorer". */
    if (!bs_wanted(want_selectors, "scorer", NULL))
        return SA_OK;
    for (int pass = 0; pass < (ix->heads ? 2 : 1); pass++)
        for (int per_query = 0; per_query < 2; per_query++) {
            char name[40];
            snprintf(name, sizeof name, "%s%s", per_query ? "score_q" : "score",
                     pass ? (ix->heads == 1 ? "/i1" : "/iN") : "");
            bh_timing t;
            int rc = time_call(e, f, name, call_score_only,
                               per_query ? sa_selector_by_name("nvfp4_query") : NULL, NULL, buf,
                               pass ? ix : NULL, sets, nsets, &t);
            if (rc) {
                fprintf(stderr, "sparseattn: bench selectors: %s: %s\n", name, bench_why(rc));
                return rc;
            }
            const int heads = pass ? ix->heads : s->heads_q;
            const double flops =
                2.0 * s->batch * heads * (double)s->len_q * s->len_kv * s->head_dim;
            const double flop_ms = bench_flop_ms(flops, f->gemm_tflops);
            const double tf = bench_tflops(flops, t.median_ms);
            if (f->json) {
                print_timing_json("scorer_kernel", s, name, NULL, &t);
                printf(",\"per_query\":%d,\"index_heads\":%d,\"flop_floor_ms\":%.6g,"
                       "\"tflops\":%.6g,\"gemm_share\":%.4g}\n",
                       per_query, pass ? ix->heads : 0, flop_ms, tf, tf / f->gemm_tflops);
            } else {
                printf("%-12s %8.4f %7.4f %10s %10.4f %8.2f %6s %7s  (scorer kernel alone: %.0f "
                       "TFLOP/s, %.0f%% of the GEMM rate)\n",
                       name, t.median_ms, t.min_ms, "-", flop_ms, t.median_ms / flop_ms, "-", "-",
                       tf, 100.0 * tf / f->gemm_tflops);
            }
            fflush(stdout);
        }
    /* The quantizer (of Q) alone: the API function, which synchronises once per call to return
     * the tensor scale, and its kernels alone (the asynchronous form). */
    const double qbytes = (double)sa_q_elems(s) * (2.0 + 0.5 + 1.0 / 16.0);
    const double qfloor = bench_byte_ms(qbytes, e->copy_bps);
    for (int async = 0; async < 2; async++) {
        const char *name = async ? "quantize(Q) kernels" : "quantize(Q)";
        bh_timing t;
        int rc = time_call(e, f, name, async ? call_quantizer_async : call_quantizer, NULL, NULL,
                           buf, NULL, sets, nsets, &t);
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

/* A workload's inputs on the host, uploaded into every set: Q, K, V and the index vectors. */
typedef struct wl_host {
    uint16_t *q, *k, *v, *qi, *ki;
} wl_host;

static void wl_host_free(wl_host *h)
{
    free(h->q), free(h->k), free(h->v), free(h->qi), free(h->ki);
}

static int wl_host_alloc(const sa_shape *s, const index_sets *ix, wl_host *h)
{
    const size_t nqi = (size_t)s->batch * ix->heads * s->len_q * s->head_dim;
    const size_t nki = (size_t)s->batch * ix->heads * s->len_kv * s->head_dim;
    *h = (wl_host){malloc(sa_q_elems(s) * 2), malloc(sa_kv_elems(s) * 2),
                   malloc(sa_kv_elems(s) * 2), ix->heads ? malloc(nqi * 2) : NULL,
                   ix->heads ? malloc(nki * 2) : NULL};
    if (h->q && h->k && h->v && (!ix->heads || (h->qi && h->ki)))
        return SA_OK;
    wl_host_free(h);
    return SA_ERR_NOMEM;
}

/* Q elements from which the host's workload generation gets a progress line (32K queries of
 * 16 heads and 128 dims and up). */
#define BS_WORKLOAD_NOTE_ELEMS ((size_t)1 << 26)

/* Workload w into every set, and its index vectors (sa_index_generate("qk"): the Q and K means
 * per index head) into ix. */
static int wl_load(const bench_flags *f, const sa_shape *s, int w, wl_host *h, bh_set *sets,
                   int nsets, const index_sets *ix)
{
    const size_t nq = sa_q_elems(s), nk = sa_kv_elems(s);
    const size_t nqi = (size_t)s->batch * ix->heads * s->len_q * s->head_dim;
    const size_t nki = (size_t)s->batch * ix->heads * s->len_kv * s->head_dim;
    if (nq >= BS_WORKLOAD_NOTE_ELEMS) /* the host generates it single-threaded: seconds at 64K */
        fprintf(stderr, "sparseattn: bench selectors: generating workload %s (%.0fM values)\n",
                sa_workload_at(w)->name, (double)(nq + 2 * nk) / 1e6);
    int rc = sa_workload_generate(sa_workload_at(w)->name, s, f->seed + (uint64_t)w,
                                  SA_STRENGTH_DEFAULT, h->q, h->k, h->v);
    for (int i = 0; !rc && i < nsets; i++) {
        rc = bh_upload((void *)sets[i].a.q, h->q, nq * 2);
        if (!rc)
            rc = bh_upload((void *)sets[i].a.k, h->k, nk * 2);
        if (!rc)
            rc = bh_upload((void *)sets[i].a.v, h->v, nk * 2);
    }
    if (!rc && ix->heads)
        rc = sa_index_generate("qk", s, h->q, h->k, ix->heads, s->head_dim, f->seed, h->qi,
                               h->ki);
    for (int i = 0; !rc && ix->heads && i < nsets; i++) {
        rc = bh_upload(ix->q[i], h->qi, nqi * 2);
        if (!rc)
            rc = bh_upload(ix->k[i], h->ki, nki * 2);
    }
    if (rc)
        fprintf(stderr, "sparseattn: bench selectors: workload %s: %s\n",
                sa_workload_at(w)->name, bench_why(rc));
    return rc;
}

#ifdef SA_TIMELINE
/* --timeline: want_timeline single calls of the pipeline c, each queued behind a spinning
 * kernel (so the host's launches leave no gap inside it) and synchronized, the stamps read and
 * cleared around it (cuda/sa_timeline.cuh); prints the median of each stamp, in us from the
 * first stamped kernel's start, for the kernels that ran. The caller turns the stage's
 * validation off: with --validate it would be synchronous, a host wait inside the call. */
static int timeline(bench_env *e, sel_call c, bh_set *sets, int nsets, const char *name)
{
    enum { NK = 5, NS = SA_TIMELINE_STAMPS };
    static const char *const label[NK] = {"amax", "quantize", "score_wgmma", "top-k",
                                          "stage 17"};
    int (*const read[4])(unsigned long long *, int) = {sa_timeline_nvfp4, sa_timeline_score,
                                                       sa_timeline_topk, sa_timeline_s17};
    const int n = want_timeline;
    double *v = malloc(sizeof(double) * NK * 3 * (size_t)n);
    int ran[NK] = {0};
    if (!v)
        return SA_ERR_NOMEM;
    int rc = SA_OK;
    for (int r = 0; !rc && r < n; r++) {
        unsigned long long t[4][NS];
        for (int i = 0; !rc && i < 4; i++)
            rc = read[i](NULL, 1);
        if (!rc)
            rc = bh_spin_us(e->g, BS_TIMELINE_SPIN_US);
        c.a = &sets[r % nsets].a;
        if (!rc)
            rc = call_pipeline(&c, bh_stream(e->g));
        if (!rc)
            rc = bh_sync(e->g);
        for (int i = 0; !rc && i < 4; i++)
            rc = read[i](t[i], 0);
        if (rc)
            break;
        /* Kernel k's three stamps: amax and quantize are slots 0 and 1 of the nvfp4 unit. */
        const unsigned long long *k[NK] = {t[0], t[0] + 3, t[1], t[2], t[3]};
        unsigned long long t0 = ~0ull;
        for (int i = 0; i < NK; i++)
            if (k[i][0] < t0)
                t0 = k[i][0];
        for (int i = 0; i < NK; i++) {
            ran[i] |= k[i][0] != ~0ull;
            for (int j = 0; j < 3; j++)
                v[((size_t)i * 3 + j) * n + r] = ((double)k[i][j] - (double)t0) / 1000.0;
        }
    }
    if (!rc) {
        printf("timeline %s: medians of %d calls, us from the first stamped kernel's start (the "
               "stamped kernels only: nvfp4's quantizer and scorer, the top-k, stage 17)\n",
               name, n);
        printf("timeline %-12s %8s %8s %8s\n", "kernel", "start", "waited", "end");
        for (int i = 0; i < NK; i++) {
            if (!ran[i])
                continue;
            double m[3];
            for (int j = 0; j < 3; j++) {
                double *x = v + ((size_t)i * 3 + j) * n;
                qsort(x, (size_t)n, sizeof *x, bench_cmp_double);
                m[j] = x[n / 2];
            }
            printf("timeline %-12s %8.2f %8.2f %8.2f\n", label[i], m[0], m[1], m[2]);
        }
        fflush(stdout);
    }
    free(v);
    return rc;
}
#endif

/* Part 2 on the workload in the sets: per tile selector, the pipeline vs the attention alone.
 * idx: host room for one set's tile lists. */
static int tile_pipelines(bench_env *e, const bench_flags *f, const sa_shape *s, bh_set *sets,
                          int nsets, const sa_stage *attn, const sel_bufs *buf,
                          const index_sets *ix, const sa_workload *wl, int32_t *idx)
{
    const size_t rows = (size_t)s->batch * s->heads_kv * sa_q_tiles(s);
    int rc = SA_OK;
    for (int i = 0; !rc && i < sa_selector_count() * 2; i++) {
        /* Odd i: the nvfp4 scorers again with index heads. */
        const sa_selector *sel = sa_selector_at(i / 2);
        const int pass = i % 2;
        if (!sel->cuda || sel->per_query ||
            (pass && (strncmp(sel->name, "nvfp4", 5) || !ix->heads)))
            continue;
        char name[40];
        snprintf(name, sizeof name, pass ? "%s/i%d" : "%s", sel->name, ix->heads);
        if (!bs_wanted(want_selectors, sel->name, name))
            continue;
        size_t bad = 0;
        bh_timing tp, ta;
        /* One call on poisoned outputs with the stage's validation on (the default path). */
        sel_call smoke = {sel, attn, buf, &sets[0].a, pass ? ix->q[0] : NULL,
                          pass ? ix->k[0] : NULL, pass ? ix->heads : 0, SA_HEAD_LISTS_GROUP};
        sets[0].a.validate = 1;
        sets[0].a.verdict = NULL;
        rc = bh_smoke(e->g, name, call_pipeline, &smoke, &sets[0].a, &bad);
        if (!rc && bad)
            fprintf(stderr, "sparseattn: bench selectors: %s -> stage %d left %zu outputs "
                            "NaN/inf\n", name, attn->id, bad);
        /* The pipeline's stage validates synchronously when --validate is on (no verdict). */
        for (int j = 0; !rc && j < nsets; j++) {
            sets[j].a.validate = !f->no_validate;
            sets[j].a.verdict = NULL;
        }
        if (!rc)
            rc = time_call(e, f, name, call_pipeline, sel, attn, buf, pass ? ix : NULL, sets,
                           nsets, &tp);
        if (!rc)
            rc = sa_gpu_verdict_read(pipe_verdict, NULL);
#ifdef SA_TIMELINE
        if (!rc && want_timeline) {
            for (int j = 0; j < nsets; j++)
                sets[j].a.validate = 0;
            rc = timeline(e, smoke, sets, nsets, name);
            for (int j = 0; j < nsets; j++)
                sets[j].a.validate = !f->no_validate;
        }
#endif
        /* The attention alone, on the lists the selector just left in every set. */
        if (!rc)
            rc = bh_time_stage(e->g, attn, sets, nsets, !f->no_validate, f->warmup, f->reps,
                               &ta);
        if (!rc)
            rc = bh_download(idx, sets[0].a.lists.indices, rows * BENCH_K * sizeof *idx);
        if (rc) {
            fprintf(stderr, "sparseattn: bench selectors: %s pipeline: %s\n", name,
                    bench_why(rc));
            break;
        }
        const double flops = 4.0 * s->head_dim * selected_pairs(s, idx, BENCH_K);
        const double tf_p = bench_tflops(flops, tp.median_ms);
        const double tf_a = bench_tflops(flops, ta.median_ms);
        if (f->json) {
            print_timing_json("pipeline", s, name, wl->name, &tp);
            printf(",\"stage\":%d,\"attn_median_ms\":%.6g,\"useful_flops\":%.6g,"
                   "\"pipeline_tflops\":%.6g,\"attn_tflops\":%.6g,\"share\":%.4g}\n",
                   attn->id, ta.median_ms, flops, tf_p, tf_a, tf_p / tf_a);
        } else {
            printf("%-10s %-8s %9.4f %9.4f %9.1f %9.1f %7.1f%%\n", wl->name, name,
                   tp.median_ms, ta.median_ms, tf_p, tf_a, 100.0 * tf_p / tf_a);
        }
        fflush(stdout);
    }
    return rc;
}

/* Whether --selectors leaves a row to the pipelines of tile (per_query 0, part 2) or per-query
 * (1, part 3) selectors: a GPU selector of that kind, or its /iN row (index_heads heads). */
static int pipeline_wanted(int per_query, int index_heads)
{
    for (int i = 0; i < sa_selector_count(); i++) {
        const sa_selector *sel = sa_selector_at(i);
        char row[40];
        snprintf(row, sizeof row, "%s/i%d", sel->name, index_heads);
        if (sel->cuda && sel->per_query == per_query &&
            (bs_wanted(want_selectors, sel->name, sel->name) ||
             (index_heads && bs_wanted(want_selectors, sel->name, row))))
            return 1;
    }
    return 0;
}

/* Parts 2 (attn: the tile stage; NULL: skipped) and 3 (qp; NULL: skipped) at one length, each
 * over the wanted workloads. */
static int pipelines(bench_env *e, const bench_flags *f, const sa_shape *s, bh_set *sets,
                     int nsets, const sa_stage *attn, const sel_bufs *buf, const index_sets *ix,
                     bs_query *qp)
{
    const size_t rows = (size_t)s->batch * s->heads_kv * sa_q_tiles(s);
    wl_host h;
    int rc = wl_host_alloc(s, ix, &h);
    int32_t *idx = rc ? NULL : malloc(rows * BENCH_K * sizeof *idx);
    if (!rc && !idx)
        rc = SA_ERR_NOMEM;
    if (rc) {
        fprintf(stderr, "sparseattn: bench selectors: out of host memory\n");
        wl_host_free(&h);
        return rc;
    }
    if (!f->json && attn)
        printf("\n%-10s %-8s %9s %9s %9s %9s %8s  (len_kv %d, stage %d %s, useful TFLOP/s;"
               " share = pipe TF / attn TF, goal >= 85%% at 16K)\n",
               "workload", "selector", "pipe ms", "attn ms", "pipe TF", "attn TF", "share",
               s->len_kv, attn->id, attn->name);
    for (int w = 0; !rc && attn && w < sa_workload_count(); w++) {
        if (!bs_wanted(want_workloads, sa_workload_at(w)->name, NULL))
            continue;
        rc = wl_load(f, s, w, &h, sets, nsets, ix);
        if (!rc)
            rc = tile_pipelines(e, f, s, sets, nsets, attn, buf, ix, sa_workload_at(w), idx);
    }
    if (!rc && qp)
        bs_query_header(f, qp);
    for (int w = 0; !rc && qp && w < sa_workload_count(); w++) {
        if (!bs_wanted(want_workloads, sa_workload_at(w)->name, NULL))
            continue;
        rc = wl_load(f, s, w, &h, sets, nsets, ix);
        if (!rc)
            rc = bs_query_run(e, f, qp, sa_workload_at(w)->name, sets, nsets, ix);
    }
    wl_host_free(&h);
    free(idx);
    return rc;
}

int bench_selectors(int argc, char **argv)
{
    sel_flags o;
    parse_flags(argc, argv, &o);
    bench_flags f = o.f;
    const int validate = o.validate, only_len = o.only_len, no_pipeline = o.no_pipeline;
    const int index_heads = o.index_heads, len_q = o.len_q, batch = o.batch;
    bench_env e;
    if (bench_open("selectors", &f, &e))
        return 1;
    int vrc = sa_gpu_verdict_create(&pipe_verdict);
    if (vrc) {
        fprintf(stderr, "sparseattn: bench selectors: verdict: %s\n", sa_strerror(vrc));
        bh_close(e.g);
        return 1;
    }
    int status = 0;
    for (int li = 0; li < (only_len ? 1 : NLENS) && !status; li++) {
        sa_shape s = {batch, SA_BENCH_SPARSE_HQ, SA_BENCH_SPARSE_HKV, len_q,
                      only_len ? only_len : bench_lens[li], SA_BENCH_SPARSE_D};
        const size_t rows_q = (size_t)s.batch * s.heads_kv * s.len_q;
        const size_t rows_t = (size_t)s.batch * s.heads_kv * sa_q_tiles(&s);
        bh_set sets[BENCH_MAX_SETS];
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
            rc = bh_set_lists(&sets[i], hl, hc, s.heads_kv, BENCH_K);
            sets[i].a.validate = validate;
        }
        free(hl), free(hc);
        sel_bufs buf = {0};
        if (!rc)
            rc = bh_alloc((void **)&buf.idx, rows_q * BENCH_K * sizeof(int32_t));
        if (!rc)
            rc = bh_alloc((void **)&buf.cnt, rows_q * sizeof(int32_t));
        if (!rc)
            rc = bh_alloc((void **)&buf.qv, sa_q_elems(&s) / 2);
        if (!rc)
            rc = bh_alloc((void **)&buf.qs, sa_q_elems(&s) / 16);
        if (!rc)
            rc = bh_alloc(&buf.qwork, 16 + SEL_NVFP4_QUANT_WORK_BYTES);
        const size_t key_words = (size_t)s.batch * s.heads_kv * s.len_q * sa_kv_blocks(&s);
        if (!rc)
            rc = bh_alloc((void **)&buf.keys, key_words * sizeof(unsigned));
        if (!rc)
            rc = bh_alloc((void **)&buf.ts, 2 * sizeof(float));
        if (!rc) {
            const float one[2] = {1.0f, 1.0f};
            rc = bh_upload(buf.ts, one, sizeof one);
        }
        /* Gaussian index vectors for part 1 (part 2 writes its workloads' over them). */
        index_sets ix = {index_heads, {0}, {0}};
        const size_t nqi = (size_t)s.batch * index_heads * s.len_q * s.head_dim;
        const size_t nki = (size_t)s.batch * index_heads * s.len_kv * s.head_dim;
        uint16_t *hqi = index_heads ? malloc(nqi * 2) : NULL;
        uint16_t *hki = index_heads ? malloc(nki * 2) : NULL;
        if (!rc && index_heads && !(hqi && hki))
            rc = SA_ERR_NOMEM;
        if (!rc && index_heads) {
            sa_rng r;
            sa_rng_seed(&r, f.seed ^ 0x1dea);
            sa_rng_fill_bf16(&r, hqi, nqi, 1.0f);
            sa_rng_fill_bf16(&r, hki, nki, 1.0f);
        }
        for (int i = 0; !rc && index_heads && i < nsets; i++) {
            rc = bh_alloc((void **)&ix.q[i], nqi * 2);
            if (!rc)
                rc = bh_alloc((void **)&ix.k[i], nki * 2);
            if (!rc)
                rc = bh_upload(ix.q[i], hqi, nqi * 2);
            if (!rc)
                rc = bh_upload(ix.k[i], hki, nki * 2);
        }
        free(hqi), free(hki);
        if (rc)
            fprintf(stderr, "sparseattn: bench selectors: %s\n", bench_why(rc));
        if (!rc)
            rc = selectors_alone(&e, &f, &s, sets, nsets, &buf, &ix);
        const int tiles = !rc && !no_pipeline && pipeline_wanted(0, ix.heads);
        const sa_stage *attn = tiles ? attention_stage(&f, &sets[0].a) : NULL;
        if (tiles && !attn)
            printf("no sparse attention stage in the registry runs len_kv %d: the pipeline part "
                   "is skipped\n", s.len_kv);
        /* Part 3 where a per-query GPU selector is wanted. */
        bs_query *qp = NULL;
        if (!rc && !no_pipeline && pipeline_wanted(1, ix.heads)) {
            rc = bs_query_open(&s, sets, nsets, want_selectors, &qp);
            if (rc)
                fprintf(stderr, "sparseattn: bench selectors: per-query pipelines: %s\n",
                        bench_why(rc));
        }
        if (!rc && (attn || qp))
            rc = pipelines(&e, &f, &s, sets, nsets, attn, &buf, &ix, qp);
        bs_query_close(qp);
        bh_free(buf.idx), bh_free(buf.cnt), bh_free(buf.qv), bh_free(buf.qs);
        bh_free(buf.qwork), bh_free(buf.keys), bh_free(buf.ts);
        for (int i = 0; i < BENCH_MAX_SETS; i++)
            bh_free(ix.q[i]), bh_free(ix.k[i]);
        bench_sets_free(sets, nsets);
        if (rc)
            status = 1;
    }
    sa_gpu_verdict_destroy(pipe_verdict);
    bh_close(e.g);
    return status;
}
#endif
