/* "sparseattn run": the main job. Generate a structured workload, choose blocks with a real
 * selector, run block-sparse attention over them, and set the result beside what bounds it: the
 * oracle's lists (the most exact attention mass per tile), random lists of the same size and
 * dense attention. Each row gets its recall of the exact softmax mass, its output error against
 * dense and its time (the library's quality functions, sa_selectors.h). On the GPU (--device
 * auto finds one) the selector and the attention run there; the default shape is smaller on the
 * CPU, where the dense reference and the oracle must finish in seconds on two cores. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* The default job: a workload whose attention mass sits in a few blocks, and a selector that
 * finds them. "local" at strength 8 puts about 92% of a query's mass in the 16 of 128 blocks the
 * oracle picks (select-eval --workload local --strength 8 --len-kv 16384 --topk 16). */
#define RUN_WORKLOAD "local"
#define RUN_STRENGTH 8.0
#define RUN_SELECTOR "r1"
#define RUN_TOPK 16
#define RUN_PERCENTILE 0.05 /* recall_p5 */

/* The default shape: the GPU's, and the CPU's (4x fewer query heads, 2x fewer queries; the same
 * keys, blocks and top-k, so the same sparsity). */
static const sa_shape gpu_shape = {1, 16, 1, 4096, 16384, 128};
static const sa_shape cpu_shape = {1, 4, 1, 2048, 16384, 128};

typedef struct run_cfg {
    sa_shape s; /* 0 in a field: not given (filled from the device's default shape) */
    int topk;
    uint64_t seed;
    double strength;      /* negative: RUN_STRENGTH for the default workload, else its own */
    const char *device;   /* "auto", "cpu" or "cuda" as given */
    const char *selector; /* selector registry name */
    const char *workload; /* workload registry name */
    int stage;            /* GPU stage id, 0 = choose */
    int json;
    int skip_dense;
    int causal; /* --causal: the selectors, the mass and every attention row causal */
    /* resolved */
    int cuda;           /* runs on the GPU */
    int reduced; /* shape fields that took the CPU's default where the GPU's differs: 1 heads_q,
                  * 2 len_q (4 any other, none today) */
    const char *why_cpu; /* --device auto chose the CPU: why */
} run_cfg;

static void run_usage(FILE *f)
{
    fprintf(f,
            "usage: sparseattn run [flags]\n"
            "Block-sparse attention on a structured workload: the selector's lists beside the\n"
            "oracle's (the bound), random lists and dense attention; recall of the exact\n"
            "attention mass, output error against dense, and time for each.\n"
            CLI_SHAPE_FLAGS_HELP
            "                    (default 1, 16, 1, 4096, 16384, 128 on the GPU; on the CPU\n"
            "                    1, 4, 1, 2048, 16384, 128 for the fields not given)\n"
            "  --topk K          blocks of 128 keys per query tile (default %d)\n"
            "  --seed S          RNG seed for inputs and random lists (default 1)\n"
            "  --selector NAME   a registered selector (default: %s)\n"
            "  --workload NAME   input structure (default: %s; see select-eval --help)\n"
            "  --strength X      the workload's knob (default: %g for %s, else the\n"
            "                    workload's own default)\n"
            "  --stage ID        the sparse GPU stage of the attention rows (listed below;\n"
            "                    default: the registry's default tile-list stage where it\n"
            "                    accepts the shape, else the first sparse stage that does). A\n"
            "                    dense stage is a usage error, and so is --stage with --device\n"
            "                    cpu; when --device auto picks the CPU a notice says it is unused\n"
            "  --device auto|cpu|cuda (default auto: cuda when a GPU is present and the\n"
            "                    selector writes tile lists, else cpu)\n"
            "  --no-dense        skip everything that needs the dense scores: dense attention,\n"
            "                    the recall, and the oracle and random rows\n"
            "  --causal          causal attention, bottom-right aligned (query i sees key j when\n"
            "                    j <= i + len_kv - len_q): the selectors, the recall's exact mass\n"
            "                    and every attention row (on the GPU: the tile stage in use,\n"
            "                    --stage else the default, and for the dense row that stage\n"
            "                    over every visible block)\n"
            "  --json            one machine-readable line instead of the table\n",
            RUN_TOPK, RUN_SELECTOR, RUN_WORKLOAD, RUN_STRENGTH, RUN_WORKLOAD);
    cli_print_registries(f);
    fprintf(f, "\nsparse stages:");
    cli_print_stages(f, SA_ROLE_SPARSE, 0);
    fputc('\n', f);
}

/* --device auto: the GPU when one is present and can read the selector's lists. */
static void resolve_device(run_cfg *c)
{
    const sa_selector *sel = sa_selector_by_name(c->selector);
    if (!strcmp(c->device, "cuda"))
        c->cuda = 1;
    else if (!strcmp(c->device, "auto")) {
        if (!sa_gpu_available())
            c->why_cpu = CLI_CUDA_BUILT ? "no GPU found" : "built without CUDA";
        else if (sel->per_query)
            c->why_cpu = "the selector writes per-query lists, which the GPU stages do not read";
        else
            c->cuda = 1;
    }
}

/* Fields not given take the device's default shape. */
static void fill_shape(run_cfg *c)
{
    const sa_shape *d = c->cuda ? &gpu_shape : &cpu_shape;
#define FILL(f, bit)                                 \
    if (!c->s.f) {                                   \
        c->s.f = d->f;                               \
        c->reduced |= d->f != gpu_shape.f ? bit : 0; \
    }
    FILL(batch, 4)
    FILL(heads_q, 1)
    FILL(heads_kv, 4)
    FILL(len_q, 2)
    FILL(len_kv, 4)
    FILL(head_dim, 4)
#undef FILL
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
        else if (!strcmp(a, "--strength"))
            c->strength = cli_double_arg(argc, argv, &i, 0.0, INFINITY);
        else if (!strcmp(a, "--stage"))
            c->stage = (int)cli_int_arg(argc, argv, &i, CLI_STAGE_ID_MIN, CLI_STAGE_ID_MAX);
        else if (!strcmp(a, "--device"))
            c->device = cli_str_arg(argc, argv, &i);
        else if (!strcmp(a, "--json"))
            c->json = 1;
        else if (!strcmp(a, "--no-dense"))
            c->skip_dense = 1;
        else if (!strcmp(a, "--causal"))
            c->causal = 1;
        else
            cli_usage_error("run: unknown flag '%s' (sparseattn run --help)", a);
    }
    if (strcmp(c->device, "auto") && strcmp(c->device, "cpu") && strcmp(c->device, "cuda"))
        cli_usage_error("run: --device must be auto, cpu or cuda, not '%s'", c->device);
    if (!sa_workload_by_name(c->workload))
        cli_usage_error("run: unknown workload '%s' (sparseattn select-eval --help lists them)",
                        c->workload);
    /* A sparse stage of the registry (with CUDA built; without, any id in range passes and
     * the run takes the CPU, or says "built without CUDA" for --device cuda). */
    if (c->stage)
        cli_stage_judge("run", c->stage, CLI_STAGE_SPARSE);
    if (c->stage && !strcmp(c->device, "cpu"))
        cli_usage_error("run: --stage %d names a GPU stage, and --device cpu runs the CPU "
                        "reference: drop one", c->stage);
    if (!sa_selector_by_name(c->selector))
        cli_usage_error("run: unknown selector '%s' (sparseattn run --help lists them)",
                        c->selector);
    if (c->strength < 0)
        c->strength = !strcmp(c->workload, RUN_WORKLOAD)
                          ? RUN_STRENGTH
                          : sa_workload_by_name(c->workload)->default_strength;
    resolve_device(c);
    fill_shape(c);
    cli_shape_topk_check("run", &c->s, c->topk);
}

/* The keys of block b that query i attends: its valid keys, causally only those up to the
 * query's last visible key (sa_causal_last_key). */
static int visible_keys(const sa_shape *s, int causal, int i, int b)
{
    int len = sa_block_len(s, b);
    if (!causal)
        return len;
    long long n = (long long)sa_causal_last_key(s, i) - (long long)b * SA_TILE + 1;
    return n < 0 ? 0 : (n > len ? len : (int)n);
}

/* Keys attended by all query rows: sum over rows of the keys of their selected blocks that
 * they attend, times the heads that read each row. */
static double selected_keys_tiles(const sa_shape *s, int causal, const int32_t *idx,
                                  const int32_t *cnt, int k)
{
    double keys = 0;
    size_t rows = (size_t)s->batch * s->heads_kv * sa_q_tiles(s);
    int group = s->heads_q / s->heads_kv;
    for (size_t r = 0; r < rows; r++) {
        int tile = (int)(r % (size_t)sa_q_tiles(s));
        int queries = s->len_q - tile * SA_TILE < SA_TILE ? s->len_q - tile * SA_TILE : SA_TILE;
        for (int j = 0; j < (cnt ? cnt[r] : k); j++)
            for (int i = 0; i < queries; i++)
                keys += (double)group * visible_keys(s, causal, tile * SA_TILE + i, idx[r * k + j]);
    }
    return keys;
}

static double selected_keys_queries(const sa_shape *s, int causal, const int32_t *idx,
                                    const int32_t *cnt, int k)
{
    double keys = 0;
    size_t rows = sa_query_rows(s);
    int group = s->heads_q / s->heads_kv;
    for (size_t r = 0; r < rows; r++)
        for (int j = 0; j < (cnt ? cnt[r] : k); j++)
            keys += (double)group *
                    visible_keys(s, causal, (int)(r % (size_t)s->len_q), idx[r * k + j]);
    return keys;
}

/* Keys of dense attention over all query rows and heads. */
static double dense_keys(const sa_shape *s, int causal)
{
    double keys = 0;
    for (int i = 0; i < s->len_q; i++) {
        long long n = causal ? (long long)sa_causal_last_key(s, i) + 1 : s->len_kv;
        keys += n < 0 ? 0 : (double)n;
    }
    return keys * s->batch * s->heads_q;
}

static void die_status(const char *what, int err)
{
    cli_progress_done();
    fprintf(stderr, "sparseattn: run: %s failed: %s\n", what, sa_strerror(err));
    exit(1);
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        die_status("allocation", SA_ERR_NOMEM);
    return p;
}

/* One row of the table: a set of lists and what they give. NaN: not measured. */
typedef struct run_row {
    const char *name;      /* the selector's name, or "dense" */
    const char *select_on; /* "cpu", "cuda", or "-" */
    int per_query;
    int32_t *idx;          /* NULL for dense */
    int32_t *cnt;          /* per-row counts (causal selectors), else NULL: every row holds k */
    double select_s, attn_s, useful_flops;
    double recall_mean, recall_p5, err_dense;
} run_row;

static void row_init(run_row *r, const char *name, const char *select_on)
{
    *r = (run_row){name, select_on, 0, NULL, NULL, NAN, NAN, NAN, NAN, NAN, NAN};
}

/* The lists of `sel` into r->idx, on the CPU, timed. */
static void select_cpu(const sa_selector *sel, const sa_shape *s, const uint16_t *q,
                       const uint16_t *k, const sa_select_params *p, run_row *r)
{
    r->per_query = sel->per_query;
    const size_t len = sa_selector_list_len(sel, s, p->k);
    r->idx = xmalloc(len * sizeof *r->idx);
    /* Causally a row lists only the blocks it can see: the selector writes counts. */
    r->cnt = p->causal ? xmalloc(len / (size_t)p->k * sizeof *r->cnt) : NULL;
    double t0 = cli_now();
    int err = sel->cpu(s, q, k, p, r->idx, r->cnt);
    r->select_s = cli_now() - t0;
    if (err)
        die_status(sel->name, err);
}

/* Block-sparse attention on the CPU reference over r's lists, timed; FP32 output into of. */
static void attend_cpu(const sa_shape *s, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                       int topk, const sa_attn_opts *opts, run_row *r, uint16_t *o, float *of)
{
    sa_outputs out = {o, of, NULL};
    double t0 = cli_now();
    int err;
    if (r->per_query) {
        sa_query_lists l = {r->idx, r->cnt, topk};
        err = sa_ref_query_sparse(s, q, k, v, &l, opts, &out);
    } else {
        sa_tile_lists l = {r->idx, r->cnt, s->heads_kv, topk};
        err = sa_ref_tile_sparse(s, q, k, v, &l, opts, &out);
    }
    r->attn_s = cli_now() - t0;
    if (err)
        die_status("block-sparse attention", err);
}

#ifdef SA_HAVE_CUDA
#include "bench_harness.h"
#include "sel_cuda.h"

static void die_gpu(const char *what, int err)
{
    cli_progress_done();
    fprintf(stderr, "sparseattn: run: %s failed: %s (%s)\n", what, sa_strerror(err),
            bh_last_error());
    exit(1);
}

/* Times `st` on the set (median of a few launches after warm-up) and downloads O. */
static double gpu_attend(bh_gpu *g, const sa_stage *st, bh_set *set, uint16_t *o, float *lse)
{
    bh_timing t;
    int err = bh_time_stage(g, st, set, 1, 1, 2, 5, &t);
    if (err)
        die_gpu(st->name, err);
    const sa_shape *s = &set->a.shape;
    if ((err = bh_download(o, set->a.o, sa_q_elems(s) * 2)) ||
        (err = bh_download(lse, set->a.lse, sa_lse_elems(s) * sizeof(float))))
        die_gpu("download", err);
    return t.median_ms * 1e-3;
}

/* The GPU side of a run: one input set whose lists each row replaces. */
typedef struct run_gpu {
    bh_gpu *g;
    bh_set set;
    bh_device dev;
    const sa_stage *st;
} run_gpu;

static void gpu_open(run_gpu *G, const run_cfg *c, const uint16_t *q, const uint16_t *k,
                     const uint16_t *v, const run_row *r)
{
    const sa_shape *s = &c->s;
    int err;
    if ((err = bh_open(&G->g, &G->dev)) || (err = bh_set_create(G->g, s, c->seed, &G->set)))
        die_gpu("GPU setup", err);
    if ((err = bh_upload((void *)G->set.a.q, q, sa_q_elems(s) * 2)) ||
        (err = bh_upload((void *)G->set.a.k, k, sa_kv_elems(s) * 2)) ||
        (err = bh_upload((void *)G->set.a.v, v, sa_kv_elems(s) * 2)) ||
        (err = bh_set_lists(&G->set, r->idx, r->cnt, s->heads_kv, c->topk)))
        die_gpu("upload", err);
    G->set.a.causal = c->causal; /* before the stage is chosen: not every stage is causal */
    /* --stage, else the registry's default tile-list stage where its check accepts the shape,
     * else the first sparse stage whose check does (cli_tile_stage). */
    G->st = c->stage ? sa_stage_by_id(c->stage) : cli_tile_stage(&G->set.a);
    if (!G->st || (err = G->st->check(&G->set.a))) {
        cli_progress_done();
        if (c->stage) /* parse() checked that it is a registered sparse stage */
            fprintf(stderr, "sparseattn: run: stage %d (%s) does not run this shape: %s "
                            "(--device cpu runs the CPU reference)\n",
                    G->st->id, G->st->name, sa_strerror(err));
        else
            fprintf(stderr, "sparseattn: run: no sparse GPU stage runs this shape%s%s "
                            "(--device cpu runs the CPU reference)\n",
                    G->st ? ": " : "", G->st ? sa_strerror(err) : "");
        exit(1);
    }
}

/* Block-sparse attention on the GPU over r's tile lists; BF16 output into o, FP32 into of. */
static void attend_gpu(run_gpu *G, const run_cfg *c, run_row *r, uint16_t *o, float *of,
                       float *lse)
{
    int err = bh_set_lists(&G->set, r->idx, r->cnt, c->s.heads_kv, c->topk);
    if (err)
        die_gpu("upload", err);
    r->attn_s = gpu_attend(G->g, G->st, &G->set, o, lse);
    sa_bf16_to_f32_array(of, o, sa_q_elems(&c->s));
}

/* Causal dense attention on the GPU: the dense stage is non-causal, so the tile stage runs over
 * every block each Q tile can see (its count; the rest of the row is padding). */
static double dense_causal_gpu(run_gpu *G, const run_cfg *c, uint16_t *o, float *lse)
{
    const sa_shape *s = &c->s;
    const int tiles = sa_q_tiles(s), nb = sa_kv_blocks(s);
    const size_t rows = (size_t)s->batch * s->heads_kv * tiles;
    int32_t *idx = xmalloc(rows * nb * sizeof(int32_t)), *cnt = xmalloc(rows * sizeof(int32_t));
    for (size_t r = 0; r < rows; r++) {
        cnt[r] = sa_causal_tile_blocks(s, (int)(r % (size_t)tiles));
        for (int j = 0; j < nb; j++)
            idx[r * nb + j] = j < cnt[r] ? j : 0;
    }
    int err = bh_set_lists(&G->set, idx, cnt, s->heads_kv, nb);
    free(idx);
    free(cnt);
    if (err)
        die_gpu("upload", err);
    return gpu_attend(G->g, G->st, &G->set, o, lse);
}
#endif

static void json_num(const char *key, double x, const char *fmt)
{
    printf(",\"%s\":", key);
    if (isfinite(x))
        printf(fmt, x);
    else
        printf("null");
}

static void fmt_cell(char *buf, size_t n, const char *fmt, double x)
{
    if (isfinite(x))
        snprintf(buf, n, fmt, x);
    else
        snprintf(buf, n, "-");
}

/* Prints text wrapped at 96 columns, continuation lines indented by `indent` spaces. */
static void wrap(const char *text, int first_indent, int indent)
{
    const int width = 96;
    int col = printf("%*s", first_indent, ""), at_start = 1;
    for (const char *w = text; *w;) {
        while (*w == ' ')
            w++;
        const char *e = w;
        while (*e && *e != ' ')
            e++;
        const int len = (int)(e - w);
        if (!len)
            break;
        if (!at_start && col + 1 + len > width)
            col = printf("\n%*s", indent, "") - 1;
        else if (!at_start)
            col += printf(" ");
        col += printf("%.*s", len, w);
        at_start = 0;
        w = e;
    }
    putchar('\n');
}

static void print_table(const run_cfg *c, const run_row *rows, int nrows, const char *attn_on,
                        const char *device_line, double err_ref)
{
    const sa_shape *s = &c->s;
    const int n = sa_kv_blocks(s);
    const sa_workload *wl = sa_workload_by_name(c->workload);
    char line[1024];
    snprintf(line, sizeof line,
             "sparseattn run: block-sparse attention over the top %d of %d key blocks per "
             "128-query tile (%.1f%% of the keys), chosen by %s",
             c->topk, n, 100.0 * c->topk / n, c->selector);
    wrap(line, 0, 2);
    /* Name the fields that took the CPU's smaller default. */
    char mine[64] = "", gpus[64] = "";
    int nred = 0;
    double work = 1;
    if (s->heads_q != gpu_shape.heads_q && c->reduced & 1) {
        snprintf(mine, sizeof mine, "Hq=%d", s->heads_q);
        snprintf(gpus, sizeof gpus, "Hq=%d", gpu_shape.heads_q);
        work *= (double)gpu_shape.heads_q / s->heads_q;
        nred++;
    }
    if (s->len_q != gpu_shape.len_q && c->reduced & 2) {
        size_t m = strlen(mine), g = strlen(gpus);
        snprintf(mine + m, sizeof mine - m, "%sSq=%d", m ? " " : "", s->len_q);
        snprintf(gpus + g, sizeof gpus - g, "%sSq=%d", g ? " " : "", gpu_shape.len_q);
        work *= (double)gpu_shape.len_q / s->len_q;
        nred++;
    }
    char note[512] = "";
    if (nred)
        snprintf(note, sizeof note,
                 ": %s %s the CPU's default%s, for the dense reference and the oracle to finish "
                 "in seconds (the GPU's: %s, %g times the work); the shape flags change %s",
                 mine, nred > 1 ? "are" : "is", nred > 1 ? "s" : "", gpus, work,
                 nred > 1 ? "them" : "it");
    snprintf(line, sizeof line, "shape B=%d Hq=%d Hkv=%d Sq=%d Skv=%d D=%d%s, seed %llu%s",
             s->batch, s->heads_q, s->heads_kv, s->len_q, s->len_kv, s->head_dim,
             c->causal ? ", causal (bottom-right aligned)" : "", (unsigned long long)c->seed,
             note);
    wrap(line, 2, 4);
    snprintf(line, sizeof line, "workload %s, strength %g: %s", wl->name, c->strength,
             wl->description);
    wrap(line, 2, 4);
    wrap(device_line, 2, 4);
    /* The lists column fits the longest registered selector name ("dense" too). */
    const int w = cli_selector_width(12);
    printf("\n%-*s %6s %8s %9s %12s %10s %10s %9s\n", w, "lists", "select", "recall",
           "recall_p5", "err_vs_dense", "select_ms", "attn_ms", "GFLOP/s");
    int any_oracle = 0, any_random = 0;
    for (int i = 0; i < nrows; i++) {
        const run_row *r = &rows[i];
        char rm[32], rp[32], e[32], sm[32], am[32], gf[32];
        fmt_cell(rm, sizeof rm, "%.4f", r->recall_mean);
        fmt_cell(rp, sizeof rp, "%.4f", r->recall_p5);
        fmt_cell(e, sizeof e, "%.4f", r->err_dense);
        fmt_cell(sm, sizeof sm, "%.2f", r->select_s * 1e3);
        fmt_cell(am, sizeof am, "%.2f", r->attn_s * 1e3);
        fmt_cell(gf, sizeof gf, "%.1f", r->useful_flops / r->attn_s * 1e-9);
        printf("%-*s %6s %8s %9s %12s %10s %10s %9s\n", w, r->name, r->select_on, rm, rp, e,
               sm, am, gf);
        any_oracle |= r->idx && !strcmp(r->name, "oracle");
        any_random |= r->idx && !strcmp(r->name, "random");
    }
    putchar('\n');
    if (c->skip_dense)
        snprintf(line, sizeof line, "--no-dense: no recall, no error, no oracle, random or dense "
                                    "row. Attention on %s; GFLOP/s: the QK and PV work of the "
                                    "attended (query, key) pairs per second.",
                 attn_on);
    else
        snprintf(line, sizeof line,
                 "recall: the share of each query's exact softmax mass inside its list's blocks "
                 "(mean, and recall_p5 the 5th percentile over queries); err_vs_dense: "
                 "||O - O_dense|| / ||O_dense||. Attention on %s; GFLOP/s: the QK and PV work "
                 "of the attended (query, key) pairs per second.",
                 attn_on);
    wrap(line, 0, 0);
    if (any_oracle || any_random) {
        char o[256] = "", r[128] = "";
        if (any_oracle)
            snprintf(o, sizeof o,
                     "oracle: per tile the %d blocks holding the most exact mass; it needs the "
                     "dense scores, so it is the bound for a tile selector at this top-k, not a "
                     "practical selector. ",
                     c->topk);
        if (any_random)
            snprintf(r, sizeof r, "random: %d blocks per tile drawn uniformly, what a selector "
                                  "must beat.",
                     c->topk);
        snprintf(line, sizeof line, "%s%s", o, r);
        wrap(line, 0, 0);
    }
    if (c->cuda && isfinite(err_ref)) {
        snprintf(line, sizeof line, "The GPU output on %s's lists against the CPU reference on "
                                    "the same lists: relative L2 error %.3g.",
                 c->selector, err_ref);
        wrap(line, 0, 0);
    }
}

int cmd_run(int argc, char **argv)
{
    run_cfg c = {.topk = RUN_TOPK, .seed = 1, .strength = -1, .device = "auto",
                 .selector = RUN_SELECTOR, .workload = RUN_WORKLOAD};
    parse(argc, argv, &c);
    const sa_shape *s = &c.s;
    const sa_selector *sel = sa_selector_by_name(c.selector);
    if (!c.cuda && c.stage) /* --device auto chose the CPU (--device cpu with --stage: usage) */
        fprintf(stderr, "sparseattn: run: --stage %d is not used: the run is on the CPU (%s)\n",
                c.stage, c.why_cpu);
    if (c.cuda) {
#ifndef SA_HAVE_CUDA
        fprintf(stderr, "sparseattn: run: --device cuda: %s\n", sa_strerror(SA_ERR_NOT_BUILT));
        return 1;
#else
        if (!sa_gpu_available()) {
            fprintf(stderr, "sparseattn: run: --device cuda: %s\n", sa_strerror(SA_ERR_NO_DEVICE));
            return 1;
        }
        if (sel->per_query)
            cli_usage_error("run: selector '%s' writes per-query lists, which the GPU stages do "
                            "not read; use --device cpu",
                            c.selector);
#endif
    }

    const size_t nq = sa_q_elems(s), nkv = sa_kv_elems(s), nl = sa_lse_elems(s);
    uint16_t *q = xmalloc(nq * 2), *k = xmalloc(nkv * 2), *v = xmalloc(nkv * 2),
             *o = xmalloc(nq * 2);
    float *of = xmalloc(nq * sizeof(float)), *lse = xmalloc(nl * sizeof(float));
    float *dense_f = c.skip_dense ? NULL : xmalloc(nq * sizeof(float));

    cli_progress("run: generating inputs (%s, seed %llu)", c.workload, (unsigned long long)c.seed);
    int err = sa_workload_generate(c.workload, s, c.seed, c.strength, q, k, v);
    if (err)
        die_status("input generation", err);

    sa_select_params p;
    sa_select_params_default(&p);
    p.k = c.topk;
    p.seed = c.seed; /* the "random" selector draws its lists from the run's seed */
    p.causal = c.causal;
    sa_attn_opts opts; /* of the CPU reference rows and the mass */
    sa_attn_opts_default(&opts);
    opts.causal = c.causal;

    /* Rows: the selector, then (unless --no-dense) the oracle and random where the selector is
     * neither, then dense. */
    run_row rows[4];
    int nrows = 0;
    const sa_selector *others[2] = {sa_selector_by_name("oracle"), sa_selector_by_name("random")};

    cli_progress("run: choosing blocks (%s)", c.selector);
    run_row *main_row = &rows[nrows++];
    row_init(main_row, c.selector, "cpu");
#ifdef SA_HAVE_CUDA
    if (c.cuda && sel->cuda) {
        /* The first call also loads the module: time the second. */
        main_row->per_query = 0;
        const size_t len = sa_selector_list_len(sel, s, c.topk);
        main_row->idx = xmalloc(len * sizeof(int32_t));
        main_row->cnt = c.causal ? xmalloc(len / (size_t)c.topk * sizeof(int32_t)) : NULL;
        double ms = 0;
        err = sel_cuda_run_host(sel, s, q, k, &p, main_row->idx, main_row->cnt, &ms);
        if (!err)
            err = sel_cuda_run_host(sel, s, q, k, &p, main_row->idx, main_row->cnt, &ms);
        if (err)
            die_status("block selection", err);
        main_row->select_s = ms * 1e-3;
        main_row->select_on = "cuda";
    } else
#endif
        select_cpu(sel, s, q, k, &p, main_row);

    if (!c.skip_dense)
        for (int i = 0; i < 2; i++)
            if (others[i] && others[i] != sel) {
                cli_progress("run: choosing blocks (%s)", others[i]->name);
                run_row *r = &rows[nrows++];
                row_init(r, others[i]->name, "cpu");
                select_cpu(others[i], s, q, k, &p, r);
            }
    for (int i = 0; i < nrows; i++)
        rows[i].useful_flops =
            4.0 * s->head_dim *
            (rows[i].per_query
                 ? selected_keys_queries(s, c.causal, rows[i].idx, rows[i].cnt, c.topk)
                 : selected_keys_tiles(s, c.causal, rows[i].idx, rows[i].cnt, c.topk));

    /* Recall of the exact mass (CPU, either device). */
    if (!c.skip_dense) {
        cli_progress("run: exact attention mass per block");
        float *mass = xmalloc(nl * (size_t)sa_kv_blocks(s) * sizeof(float));
        if ((err = sa_block_mass_opts(s, q, k, &opts, mass)))
            die_status("block mass", err);
        for (int i = 0; i < nrows; i++)
            if ((err = sa_lists_recall_stats(s, mass, rows[i].per_query, rows[i].idx, rows[i].cnt,
                                             c.topk, &opts, RUN_PERCENTILE, &rows[i].recall_mean,
                                             &rows[i].recall_p5, NULL)))
                die_status("recall", err);
        free(mass);
    }

    run_row dense_row;
    row_init(&dense_row, "dense", "-");
    dense_row.recall_mean = dense_row.recall_p5 = c.skip_dense ? NAN : 1.0;
    dense_row.err_dense = c.skip_dense ? NAN : 0.0;
    dense_row.useful_flops = 4.0 * s->head_dim * dense_keys(s, c.causal);
    const char *attn_on = "the CPU reference (OpenMP + OpenBLAS)", *stage_name = "reference";
    char device_line[512];
    double err_ref = NAN;
    int have_dense = !c.skip_dense;

    if (!c.cuda) {
        if (!strcmp(c.device, "auto"))
            snprintf(device_line, sizeof device_line, "device cpu (--device auto: %s)",
                     c.why_cpu);
        else
            snprintf(device_line, sizeof device_line, "device cpu");
        if (have_dense) {
            cli_progress("run: dense attention");
            sa_outputs dout = {o, dense_f, NULL};
            double t0 = cli_now();
            err = sa_ref_dense_opts(s, q, k, v, &opts, &dout);
            dense_row.attn_s = cli_now() - t0;
            if (err)
                die_status("dense attention", err);
        }
        for (int i = 0; i < nrows; i++) {
            cli_progress("run: block-sparse attention (%s)", rows[i].name);
            attend_cpu(s, q, k, v, c.topk, &opts, &rows[i], o, of);
            if (have_dense)
                rows[i].err_dense = sa_rel_l2(of, dense_f, nq);
        }
    }
#ifdef SA_HAVE_CUDA
    else {
        run_gpu G;
        cli_progress("run: GPU setup");
        gpu_open(&G, &c, q, k, v, main_row);
        stage_name = G.st->name;
        static char on[128];
        snprintf(on, sizeof on, "the GPU (stage %d, %s)", G.st->id, G.st->name);
        attn_on = on;
        snprintf(device_line, sizeof device_line, "device cuda: %s; selector %s on the %s",
                 G.dev.name, c.selector, strcmp(main_row->select_on, "cuda") ? "CPU" : "GPU");
        const sa_stage *dense = sa_stage_with(SA_ROLE_DEFAULT_DENSE);
        if (have_dense && c.causal) {
            cli_progress("run: causal dense attention on the GPU (every visible block)");
            dense_row.attn_s = dense_causal_gpu(&G, &c, o, lse);
            sa_bf16_to_f32_array(dense_f, o, nq);
        } else if (have_dense && dense && dense->check(&G.set.a) == SA_OK) {
            cli_progress("run: dense attention on the GPU");
            dense_row.attn_s = gpu_attend(G.g, dense, &G.set, o, lse);
            sa_bf16_to_f32_array(dense_f, o, nq);
        } else if (have_dense) {
            cli_progress_done();
            fprintf(stderr, "sparseattn: run: dense attention skipped, the dense stage (%s) "
                            "cannot run this shape (%s): no err_vs_dense\n",
                    dense ? dense->name : "-",
                    dense ? sa_strerror(dense->check(&G.set.a))
                          : "no default dense stage in the registry");
            have_dense = 0;
        }
        for (int i = 0; i < nrows; i++) {
            cli_progress("run: block-sparse attention on the GPU (%s)", rows[i].name);
            attend_gpu(&G, &c, &rows[i], o, of, lse);
            if (have_dense)
                rows[i].err_dense = sa_rel_l2(of, dense_f, nq);
            if (i == 0) {
                /* The GPU output against the CPU reference on the same lists: the pipeline is
                 * correct. */
                cli_progress("run: CPU reference on the same lists");
                uint16_t *ro = xmalloc(nq * 2);
                float *rof = xmalloc(nq * sizeof(float));
                sa_tile_lists l = {rows[i].idx, rows[i].cnt, s->heads_kv, c.topk};
                sa_outputs rout = {ro, rof, NULL};
                if ((err = sa_ref_tile_sparse(s, q, k, v, &l, &opts, &rout)))
                    die_status("CPU reference", err);
                err_ref = sa_rel_l2(of, rof, nq);
                free(ro);
                free(rof);
            }
        }
        bh_set_destroy(&G.set);
        bh_close(G.g);
    }
#endif
    if (!have_dense) {
        dense_row.err_dense = NAN;
        dense_row.attn_s = NAN;
    }
    cli_progress_done();

    const run_row *m = main_row;
    if (c.json) {
        const run_row *orc = NULL, *rnd = NULL;
        for (int i = 0; i < nrows; i++) {
            orc = !strcmp(rows[i].name, "oracle") ? &rows[i] : orc;
            rnd = !strcmp(rows[i].name, "random") ? &rows[i] : rnd;
        }
        printf("{\"command\":\"run\",\"device\":\"%s\",\"device_flag\":\"%s\",\"selector\":\"%s\","
               "\"select_on\":\"%s\",\"workload\":\"%s\",\"strength\":%g,\"attention\":\"%s\","
               "\"batch\":%d,\"heads_q\":%d,\"heads_kv\":%d,\"len_q\":%d,\"len_kv\":%d,"
               "\"head_dim\":%d,\"topk\":%d,\"seed\":%llu,\"cpu_default_shape\":%s,\"causal\":%s",
               c.cuda ? "cuda" : "cpu", c.device, c.selector, m->select_on, c.workload,
               c.strength, stage_name, s->batch, s->heads_q, s->heads_kv, s->len_q, s->len_kv,
               s->head_dim, c.topk, (unsigned long long)c.seed, c.reduced ? "true" : "false",
               c.causal ? "true" : "false");
        json_num("select_s", m->select_s, "%.6f");
        json_num("attention_s", m->attn_s, "%.6f");
        json_num("useful_gflops", m->useful_flops / m->attn_s * 1e-9, "%.3f");
        json_num("recall_mean", m->recall_mean, "%.6f");
        json_num("recall_p5", m->recall_p5, "%.6f");
        json_num("rel_err_vs_dense", m->err_dense, "%.6g");
        json_num("rel_err_vs_reference", err_ref, "%.6g");
        json_num("dense_s", dense_row.attn_s, "%.6f");
        json_num("dense_gflops", dense_row.useful_flops / dense_row.attn_s * 1e-9, "%.3f");
        const run_row *extra[2] = {orc, rnd};
        const char *pre[2] = {"oracle", "random"};
        for (int i = 0; i < 2; i++) {
            if (!extra[i])
                continue;
            char key[64];
            snprintf(key, sizeof key, "%s_select_s", pre[i]);
            json_num(key, extra[i]->select_s, "%.6f");
            snprintf(key, sizeof key, "%s_attention_s", pre[i]);
            json_num(key, extra[i]->attn_s, "%.6f");
            snprintf(key, sizeof key, "%s_recall_mean", pre[i]);
            json_num(key, extra[i]->recall_mean, "%.6f");
            snprintf(key, sizeof key, "%s_recall_p5", pre[i]);
            json_num(key, extra[i]->recall_p5, "%.6f");
            snprintf(key, sizeof key, "%s_rel_err_vs_dense", pre[i]);
            json_num(key, extra[i]->err_dense, "%.6g");
        }
        printf("}\n");
    } else {
        run_row all[5];
        memcpy(all, rows, (size_t)nrows * sizeof *rows);
        all[nrows] = dense_row;
        print_table(&c, all, nrows + (c.skip_dense ? 0 : 1), attn_on, device_line, err_ref);
    }
    for (int i = 0; i < nrows; i++)
        free(rows[i].idx), free(rows[i].cnt);
    free(q), free(k), free(v), free(o), free(of), free(lse), free(dense_f);
    return 0;
}
