/* "sparseattn select-eval": selection quality of every registered selector on every workload.
 * Per workload: the exact per-block softmax mass (sa_block_mass) and dense attention (sa_ref_dense)
 * once; per selector: its lists, their recall of the mass, the output error of attention over
 * the lists against dense, the overlap with the oracle's lists (the library's quality functions,
 * sa_selectors.h: sa_lists_recall_stats, sa_lists_output_error, sa_lists_overlap), and the
 * selector's time.
 * --causal makes every piece causal (docs/api.md, "Causal attention"): the mass and the dense
 * output are those of causal attention, the selectors pick among visible blocks only (rows may
 * hold fewer than k), and queries that see no key are left out of the recall statistics.
 * --index runs the selectors that score index vectors once per index choice: the attention's own
 * Q/K, or index vectors in the index-head layout from sa_index_generate ("qk", "proj"). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#ifdef SA_HAVE_CUDA
#include "bench_harness.h"
#endif

#define RECALL_PERCENTILE 0.05 /* recall_p5 */
#define MAX_CHOICES 16          /* --index entries */

/* One --index choice: the attention's own Q/K (method NULL), or sa_index_generate's method at
 * dim with the run's index heads. */
typedef struct index_choice {
    char label[24]; /* "own", "qk", "proj:64" */
    const char *method;
    int dim;
} index_choice;

typedef struct eval_cfg {
    sa_shape s;
    int topk;
    uint64_t seed;
    double strength; /* negative: each workload's default */
    const char *workload, *selector, *device;
    int json, keep_sink, keep_diagonal, causal, keep_local;
    index_choice choice[MAX_CHOICES];
    int choices;     /* 0: no --index (the table as before) */
    int index_heads; /* of the qk / proj choices; 0 until parsed: heads_kv */
    int name_width;  /* the selector column: cli_selector_width, set once the flags are parsed */
} eval_cfg;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: sparseattn select-eval [flags]\n"
            CLI_SHAPE_FLAGS_HELP
            "                    (default 1, 4, 1, 4096, 4096, 128)\n"
            "  --topk K          blocks per row, at most len-kv's blocks of 128 (default 8)\n"
            "  --seed S          workload seed; the random selector uses it too (default 1)\n"
            "  --workload NAME   only this workload (default all)\n"
            "  --strength X      the workloads' knob (default: each workload's own)\n"
            "  --selector NAME   only this selector (the oracle still runs for the overlap)\n"
            "  --keep-sink       keep block 0, the attention sink (default off)\n"
            "  --keep-diagonal   keep each row's diagonal block (needs len-q = len-kv; with\n"
            "                    --keep-sink it needs topk >= 2; default off)\n"
            "  --keep-local      keep the block holding each row's own position (bottom-right\n"
            "                    aligned; needs len-q <= len-kv; with --keep-sink it needs\n"
            "                    topk >= 2 unless len-kv is one block; default off)\n"
            "  --index LIST      score index vectors: comma-separated choices among own (the\n"
            "                    attention's Q/K, all heads), qk (Q/K averaged per index head),\n"
            "                    proj:D (a Gaussian projection of those means to D dims, D a\n"
            "                    multiple of 16 up to 1024), or all (own,qk,proj:64,proj:128).\n"
            "                    The selectors that read index vectors run once per choice and\n"
            "                    the table gains an index column (default: own only, no column)\n"
            "  --index-heads N   index heads of the qk / proj choices (default heads-kv: one\n"
            "                    per KV group); N divides heads-q and divides or is a multiple\n"
            "                    of heads-kv. Only with --index naming qk or proj:D\n"
            "  --causal          causal attention, bottom-right aligned (len-q < len-kv is a\n"
            "                    chunk of prefill): causal mass, causal dense output, lists of\n"
            "                    visible blocks with the diagonal kept; with --keep-sink it needs\n"
            "                    topk >= 2 unless len-kv is one block (default off)\n"
            "  --device cpu|cuda (default cpu; cuda runs the selectors that have a GPU function\n"
            "                    on the GPU and reports how many rows equal the CPU lists)\n"
            "  --json            one JSON object per line instead of the table\n"
            "  --activations FILE  a real model's Q/K/V instead of workloads (docs/activations.md;\n"
            "                    its flags: select-eval --activations FILE --help)\n");
    cli_print_registries(f);
    fputc('\n', f);
}

/* One entry of --index, split by cli_list: own, qk or proj:D ("all" stands alone). */
static void one_choice(const char *flag, const char *t, void *ctx)
{
    eval_cfg *c = ctx;
    if (!strcmp(t, "all"))
        cli_usage_error("select-eval: %s: 'all' stands alone (it means own,qk,proj:64,proj:128)",
                        flag);
    if (c->choices == MAX_CHOICES)
        cli_usage_error("select-eval: %s: at most %d choices", flag, MAX_CHOICES);
    index_choice *x = &c->choice[c->choices++];
    x->method = NULL;
    x->dim = 0;
    if (!strcmp(t, "qk")) {
        x->method = "qk";
    } else if (!strncmp(t, "proj:", 5)) {
        char *end;
        long d = strtol(t + 5, &end, 10);
        if (end == t + 5 || *end || d <= 0 || d % 16 || d > SA_MAX_INDEX_DIM)
            cli_usage_error("select-eval: %s: '%s': proj:D needs D a multiple of 16 in [16, %d]",
                            flag, t, SA_MAX_INDEX_DIM);
        x->method = "proj";
        x->dim = (int)d;
    } else if (strcmp(t, "own")) {
        cli_usage_error("select-eval: %s: unknown choice '%s' (own, qk, proj:D, all)", flag, t);
    }
    snprintf(x->label, sizeof x->label, "%s", t);
}

/* --index LIST: own, qk, proj:D, all. */
static void parse_choices(const char *list, eval_cfg *c)
{
    c->choices = 0;
    cli_list("--index", strcmp(list, "all") ? list : "own,qk,proj:64,proj:128", one_choice, c);
}

static void parse(int argc, char **argv, eval_cfg *c)
{
    const long big = 1 << 24;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            exit(0);
        } else if (cli_shape_flag(argc, argv, &i, &c->s))
            continue;
        else if (!strcmp(a, "--topk"))
            c->topk = (int)cli_int_arg(argc, argv, &i, 1, big);
        else if (!strcmp(a, "--seed"))
            c->seed = cli_u64_arg(argc, argv, &i);
        else if (!strcmp(a, "--strength"))
            c->strength = cli_double_arg(argc, argv, &i, 0.0, INFINITY);
        else if (!strcmp(a, "--workload"))
            c->workload = cli_str_arg(argc, argv, &i);
        else if (!strcmp(a, "--selector"))
            c->selector = cli_str_arg(argc, argv, &i);
        else if (!strcmp(a, "--device"))
            c->device = cli_str_arg(argc, argv, &i);
        else if (!strcmp(a, "--keep-sink"))
            c->keep_sink = 1;
        else if (!strcmp(a, "--keep-diagonal"))
            c->keep_diagonal = 1;
        else if (!strcmp(a, "--causal"))
            c->causal = 1;
        else if (!strcmp(a, "--keep-local"))
            c->keep_local = 1;
        else if (!strcmp(a, "--index"))
            parse_choices(cli_str_arg(argc, argv, &i), c);
        else if (!strcmp(a, "--index-heads"))
            c->index_heads = (int)cli_int_arg(argc, argv, &i, 1, 1 << 20);
        else if (!strcmp(a, "--json"))
            c->json = 1;
        else
            cli_usage_error("select-eval: unknown flag '%s' (sparseattn select-eval --help)", a);
    }
    cli_shape_topk_check("select-eval", &c->s, c->topk);
    if (c->keep_diagonal && c->s.len_q != c->s.len_kv)
        cli_usage_error("select-eval: --keep-diagonal needs len-q == len-kv");
    if (c->keep_diagonal && c->keep_sink && c->topk < 2)
        cli_usage_error("select-eval: --keep-diagonal with --keep-sink needs --topk >= 2");
    if (c->keep_local && c->s.len_q > c->s.len_kv)
        cli_usage_error("select-eval: --keep-local needs len-q <= len-kv");
    if (c->keep_local && c->keep_sink && c->topk < 2 && sa_kv_blocks(&c->s) > 1)
        cli_usage_error("select-eval: --keep-local with --keep-sink needs --topk >= 2");
    /* --index-heads shapes the qk / proj index vectors alone: without such a choice it would
     * change nothing. */
    int any_method = 0;
    for (int j = 0; j < c->choices; j++)
        any_method |= c->choice[j].method != NULL;
    if (c->index_heads && !any_method)
        cli_usage_error("select-eval: --index-heads %d has no effect without --index naming qk "
                        "or proj:D (the index vectors it shapes)", c->index_heads);
    if (!c->index_heads)
        c->index_heads = c->s.heads_kv;
    const int hi = c->index_heads;
    if (c->s.heads_q % hi || (c->s.heads_kv % hi && hi % c->s.heads_kv))
        cli_usage_error("select-eval: --index-heads %d must divide heads-q %d and divide or be "
                        "a multiple of heads-kv %d", hi, c->s.heads_q, c->s.heads_kv);
    if (c->causal && c->keep_sink && c->topk < 2 && sa_kv_blocks(&c->s) > 1)
        cli_usage_error("select-eval: --causal keeps the diagonal block: with --keep-sink it "
                        "needs --topk >= 2");
    if (strcmp(c->device, "cpu") && strcmp(c->device, "cuda"))
        cli_usage_error("select-eval: --device must be cpu or cuda, not '%s'", c->device);
    if (c->workload && !sa_workload_by_name(c->workload))
        cli_usage_error("select-eval: unknown workload '%s' (select-eval --help lists them)",
                        c->workload);
    if (c->selector && !sa_selector_by_name(c->selector))
        cli_usage_error("select-eval: unknown selector '%s' (select-eval --help lists them)",
                        c->selector);
}

static void die(const char *what, int err)
{
    cli_progress_done();
    fprintf(stderr, "sparseattn: select-eval: %s: %s\n", what, sa_strerror(err));
    exit(1);
}

typedef struct buffers {
    uint16_t *q, *k, *v, *o;
    float *o_dense, *mass;
    int32_t *idx, *idx_cpu, *oracle;
    int32_t *cnt, *cnt_cpu, *oracle_cnt; /* the rows' counts (k each unless causal) */
} buffers;

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        die("allocation", SA_ERR_NOMEM);
    return p;
}

/* ix: the row's index choice with --index (NULL: a selector that reads no index vectors), and
 * unused without it. */
static void print_row(const eval_cfg *c, const char *wl, double strength, const char *sel,
                      const index_choice *ix, const char *dev, double match, double rmean,
                      double rp5, double oerr, double overlap, double ms)
{
    const int cuda = !strcmp(c->device, "cuda");
    if (c->json) {
        printf("{\"workload\":\"%s\",\"strength\":%g,\"selector\":\"%s\",\"batch\":%d,"
               "\"heads_q\":%d,\"heads_kv\":%d,\"len_q\":%d,\"len_kv\":%d,\"head_dim\":%d,"
               "\"topk\":%d,\"causal\":%d,\"seed\":%llu,",
               wl, strength, sel, c->s.batch, c->s.heads_q, c->s.heads_kv, c->s.len_q,
               c->s.len_kv, c->s.head_dim, c->topk, c->causal, (unsigned long long)c->seed);
        if (c->keep_local)
            printf("\"keep_local\":1,");
        if (c->choices && ix && ix->method)
            printf("\"index\":\"%s\",\"index_heads\":%d,\"index_dim\":%d,", ix->label,
                   c->index_heads, ix->dim);
        else if (c->choices)
            printf("\"index\":%s,\"index_heads\":null,\"index_dim\":null,",
                   ix ? "\"own\"" : "null");
        /* NaN (causal: no query or no row left to average) is null. */
        if (isfinite(rmean))
            printf("\"recall_mean\":%.6f,\"recall_p5\":%.6f,", rmean, rp5);
        else
            printf("\"recall_mean\":null,\"recall_p5\":null,");
        if (isfinite(oerr))
            printf("\"out_rel_err\":%.6g,", oerr);
        else
            printf("\"out_rel_err\":null,");
        if (isfinite(overlap))
            printf("\"oracle_overlap\":%.6f,", overlap);
        else
            printf("\"oracle_overlap\":null,");
        printf("\"select_ms\":%.3f,\"device\":\"%s\"", ms, dev);
        if (cuda && isfinite(match))
            printf(",\"cpu_match\":%.6f", match);
        printf("}\n");
    } else {
        char e[32];
        if (isfinite(oerr))
            snprintf(e, sizeof e, "%.4f", oerr);
        else
            snprintf(e, sizeof e, "n/a");
        printf("%-10s %-*s", wl, c->name_width, sel);
        if (c->choices)
            printf(" %-9s", ix ? ix->label : "-");
        printf(" %11.4f %9.4f %11s %8.3f %10.2f", rmean, rp5, e, overlap, ms);
        if (cuda)
            printf(" %4s %9s", dev, isfinite(match) ? (snprintf(e, sizeof e, "%.4f", match), e) : "-");
        printf("\n");
    }
    fflush(stdout);
}

int cmd_select_eval(int argc, char **argv)
{
    /* --activations FILE: a real model's captured layers instead (cmd_select_eval_act.c). */
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--activations"))
            return cmd_select_eval_activations(argc, argv);
    eval_cfg c = {.s = {1, 4, 1, 4096, 4096, 128}, .topk = 8, .seed = 1, .strength = -1,
                  .device = "cpu"};
    parse(argc, argv, &c);
    c.name_width = cli_selector_width(12);
    const int cuda = !strcmp(c.device, "cuda");
#ifndef SA_HAVE_CUDA
    if (cuda) {
        fprintf(stderr, "sparseattn: select-eval: this build has no CUDA (GPU selectors are not "
                        "built)\n");
        return 1;
    }
#endif
    const sa_shape *s = &c.s;
    const size_t nq = sa_q_elems(s), nkv = sa_kv_elems(s), queries = sa_lse_elems(s);
    const int n = sa_kv_blocks(s);
    const sa_selector *oracle = sa_selector_by_name("oracle");
    if (!oracle)
        die("the registry has no oracle selector", SA_ERR_UNKNOWN);
    size_t max_list = 0;
    for (int i = 0; i < sa_selector_count(); i++) {
        size_t len = sa_selector_list_len(sa_selector_at(i), s, c.topk);
        max_list = len > max_list ? len : max_list;
    }
    /* Each choice's index vectors, (B, Hi, Sq, D) and (B, Hi, Skv, D), made once per workload
     * when a selector that reads them runs. */
    uint16_t *qi[MAX_CHOICES] = {0}, *ki[MAX_CHOICES] = {0};
    int need_index = 0;
    for (int i = 0; i < sa_selector_count(); i++)
        need_index |= !sa_selector_at(i)->ignores_index &&
                      (!c.selector || !strcmp(c.selector, sa_selector_at(i)->name));
    for (int j = 0; j < c.choices; j++) {
        if (!c.choice[j].method)
            continue;
        if (!strcmp(c.choice[j].method, "qk"))
            c.choice[j].dim = s->head_dim;
        qi[j] = xmalloc((size_t)s->batch * c.index_heads * s->len_q * c.choice[j].dim * 2);
        ki[j] = xmalloc((size_t)s->batch * c.index_heads * s->len_kv * c.choice[j].dim * 2);
    }
    buffers b = {
        .q = xmalloc(nq * 2), .k = xmalloc(nkv * 2), .v = xmalloc(nkv * 2), .o = xmalloc(nq * 2),
        .o_dense = xmalloc(nq * 4), .mass = xmalloc(queries * n * sizeof(float)),
        .idx = xmalloc(max_list * 4), .idx_cpu = xmalloc(max_list * 4), .oracle = xmalloc(sa_selector_list_len(oracle, s, c.topk) * 4),
        .cnt = xmalloc(max_list / c.topk * 4), .cnt_cpu = xmalloc(max_list / c.topk * 4),
        .oracle_cnt = xmalloc(sa_selector_list_len(oracle, s, c.topk) / c.topk * 4),
    };
    /* Causal options of the reference calls; the lists must hold visible blocks only. */
    sa_attn_opts ao;
    sa_attn_opts_default(&ao);
    ao.causal = c.causal;
    sa_select_params p;
    sa_select_params_default(&p);
    p.k = c.topk;
    p.seed = c.seed;
    p.keep_sink = c.keep_sink;
    p.keep_diagonal = c.keep_diagonal;
    p.causal = c.causal;
    p.keep_local = c.keep_local;

#ifdef SA_HAVE_CUDA
    bh_gpu *g = NULL;
    uint16_t *dq = NULL, *dk = NULL;
    uint16_t *dqi[MAX_CHOICES] = {0}, *dki[MAX_CHOICES] = {0}; /* device copies of qi, ki */
    int32_t *didx = NULL, *dcnt = NULL; /* dcnt: the GPU selectors' counts (causal) */
    if (cuda) {
        int err = bh_open(&g, NULL);
        for (int j = 0; j < c.choices && need_index && !err; j++) {
            if (!c.choice[j].method)
                continue;
            err = bh_alloc((void **)&dqi[j],
                           (size_t)s->batch * c.index_heads * s->len_q * c.choice[j].dim * 2);
            if (!err)
                err = bh_alloc((void **)&dki[j],
                               (size_t)s->batch * c.index_heads * s->len_kv * c.choice[j].dim * 2);
        }
        if (!err)
            err = bh_alloc((void **)&dq, nq * 2);
        if (!err)
            err = bh_alloc((void **)&dk, nkv * 2);
        if (!err)
            err = bh_alloc((void **)&didx, max_list * 4);
        if (!err && c.causal)
            err = bh_alloc((void **)&dcnt, max_list / c.topk * 4);
        if (err) {
            fprintf(stderr, "sparseattn: select-eval: GPU: %s (%s)\n", sa_strerror(err),
                    bh_last_error());
            return 1;
        }
    }
#endif
    if (!c.json) {
        char extra[64] = "";
        if (c.choices)
            snprintf(extra, sizeof extra, ", index heads %d", c.index_heads);
        printf("select-eval: batch %d, heads %d/%d, len %d/%d, head_dim %d, topk %d of %d blocks,"
               " seed %llu%s%s%s%s%s\n",
               s->batch, s->heads_q, s->heads_kv, s->len_q, s->len_kv, s->head_dim, c.topk, n,
               (unsigned long long)c.seed, c.keep_sink ? ", keep_sink" : "",
               c.keep_diagonal ? ", keep_diagonal" : "", c.keep_local ? ", keep_local" : "",
               extra, c.causal ? ", causal (rows hold up to topk visible blocks)" : "");
        printf("%-10s %-*s%s %11s %9s %11s %8s %10s%s\n", "workload", c.name_width,
               "selector",
               c.choices ? " index    " : "", "recall_mean", "recall_p5", "out_rel_err",
               "overlap", "select_ms", cuda ? "  dev cpu_match" : "");
    }
    int warned = 0;
    /* The GPU functions take neither index heads nor a local block off the diagonal. */
    const int local_off_diag = c.keep_local && s->len_q != s->len_kv;
    int any_index = 0;
    for (int j = 0; j < c.choices; j++)
        any_index |= c.choice[j].method != NULL;
    if (cuda && (local_off_diag || any_index))
        fprintf(stderr, "sparseattn: select-eval: %s (SA_ERR_UNSUPPORTED): %s on the CPU\n",
                local_off_diag ? "the GPU selectors do not take --keep-local with len-q < len-kv"
                               : "r1 and r4 on the GPU do not take index heads",
                local_off_diag ? "every selector runs" : "their qk and proj choices run");
    /* Without --index one pass with the attention's Q/K, printed as before. */
    const index_choice own = {"own", NULL, 0};
    for (int w = 0; w < sa_workload_count(); w++) {
        const sa_workload *wl = sa_workload_at(w);
        if (c.workload && strcmp(c.workload, wl->name))
            continue;
        double strength = c.strength < 0 ? wl->default_strength : c.strength;
        cli_progress("select-eval: %s: generating inputs", wl->name);
        int err = sa_workload_generate(wl->name, s, c.seed, strength, b.q, b.k, b.v);
        if (err)
            die("workload", err);
#ifdef SA_HAVE_CUDA
        if (cuda && ((err = bh_upload(dq, b.q, nq * 2)) || (err = bh_upload(dk, b.k, nkv * 2))))
            die(bh_last_error(), err);
#endif
        cli_progress("select-eval: %s: exact block mass", wl->name);
        if ((err = sa_block_mass_opts(s, b.q, b.k, &ao, b.mass)))
            die("block mass", err);
        cli_progress("select-eval: %s: dense attention", wl->name);
        sa_outputs dense = {b.o, b.o_dense, NULL};
        int have_dense = sa_ref_dense_opts(s, b.q, b.k, b.v, &ao, &dense) == SA_OK;
        if (!have_dense && !warned) {
            fprintf(stderr, "sparseattn: select-eval: the CPU reference is unavailable: "
                            "out_rel_err is n/a\n");
            warned = 1;
        }
        for (int j = 0; j < c.choices && need_index; j++) {
            const index_choice *x = &c.choice[j];
            if (!x->method)
                continue;
            /* From this workload's Q/K; the projection drawn from the run's seed. */
            cli_progress("select-eval: %s: index vectors %s", wl->name, x->label);
            if ((err = sa_index_generate(x->method, s, b.q, b.k, c.index_heads, x->dim, c.seed,
                                         qi[j], ki[j])))
                die("index vectors", err);
#ifdef SA_HAVE_CUDA
            if (cuda &&
                ((err = bh_upload(dqi[j], qi[j], (size_t)s->batch * c.index_heads * s->len_q *
                                                     x->dim * 2)) ||
                 (err = bh_upload(dki[j], ki[j], (size_t)s->batch * c.index_heads * s->len_kv *
                                                     x->dim * 2))))
                die(bh_last_error(), err);
#endif
        }
        cli_progress("select-eval: %s: oracle", wl->name);
        double t_oracle = cli_now();
        if ((err = oracle->cpu(s, b.q, b.k, &p, b.oracle, b.oracle_cnt)))
            die("oracle", err);
        t_oracle = (cli_now() - t_oracle) * 1e3;
        for (int i = 0; i < sa_selector_count(); i++) {
            const sa_selector *sel = sa_selector_at(i);
            if (c.selector && strcmp(c.selector, sel->name))
                continue;
            const int passes = c.choices && !sel->ignores_index ? c.choices : 1;
            for (int j = 0; j < passes; j++) {
                const index_choice *ix = !c.choices           ? &own
                                         : !sel->ignores_index ? &c.choice[j]
                                                               : NULL;
                sa_select_params ps = p;
                if (ix && ix->method) {
                    ps.q_index = qi[j];
                    ps.k_index = ki[j];
                    ps.index_dim = ix->dim;
                    ps.index_heads = c.index_heads;
                }
                cli_progress("select-eval: %s: %s%s%s", wl->name, sel->name, c.choices ? " " : "",
                             c.choices && ix ? ix->label : "");
                double ms = t_oracle, match = NAN;
                const char *dev = "cpu";
                if (sel == oracle) { /* already run above: reuse its lists and time */
                    size_t len = sa_selector_list_len(oracle, s, c.topk);
                    memcpy(b.idx, b.oracle, len * 4);
                    memcpy(b.cnt, b.oracle_cnt, len / c.topk * 4);
                    err = SA_OK;
                } else {
                    double t0 = cli_now();
                    err = sel->cpu(s, b.q, b.k, &ps, b.idx, b.cnt);
                    ms = (cli_now() - t0) * 1e3;
                }
                if (err)
                    die(sel->name, err);
#ifdef SA_HAVE_CUDA
                if (cuda && sel->cuda && !local_off_diag) {
                    /* One warm-up call, then one timed call; the time includes the list download
                     * (it synchronizes). The CPU lists stay for the comparison. Causal rows come
                     * with counts, downloaded too. */
                    size_t len = sa_selector_list_len(sel, s, c.topk), rows = len / c.topk;
                    memcpy(b.idx_cpu, b.idx, len * 4);
                    memcpy(b.cnt_cpu, b.cnt, rows * 4);
                    sa_select_params pg = ps;
                    pg.stream = bh_stream(g);
                    if (ix && ix->method)
                        pg.q_index = dqi[j], pg.k_index = dki[j];
                    err = sel->cuda(s, dq, dk, &pg, didx, dcnt);
                    if (err == SA_ERR_UNSUPPORTED && ps.index_heads)
                        goto cpu_row; /* r1 / r4 with index heads: the CPU row (notice above) */
                    double t0 = cli_now();
                    if (!err)
                        err = sel->cuda(s, dq, dk, &pg, didx, dcnt);
                    if (!err)
                        err = bh_download(b.idx, didx, len * 4);
                    if (!err && dcnt)
                        err = bh_download(b.cnt, dcnt, rows * 4);
                    if (err) {
                        cli_progress_done();
                        fprintf(stderr, "sparseattn: select-eval: %s on the GPU: %s (%s)\n",
                                sel->name, sa_strerror(err), bh_last_error());
                        continue;
                    }
                    ms = (cli_now() - t0) * 1e3;
                    dev = "cuda";
                    /* A row matches when its count and its first count entries do. */
                    size_t same = 0;
                    for (size_t r = 0; r < rows; r++) {
                        const int n = dcnt ? b.cnt[r] : c.topk;
                        same += (!dcnt || b.cnt[r] == b.cnt_cpu[r]) && n >= 0 && n <= c.topk &&
                                !memcmp(b.idx + r * c.topk, b.idx_cpu + r * c.topk, (size_t)n * 4);
                    }
                    match = (double)same / rows;
                }
            cpu_row:;
#endif
                /* Also rejects out-of-range indices (GPU lists). Non-causal GPU lists come with
                 * no counts: every row holds topk. Causal: the queries that see nothing (recall 0
                 * of 0) are left out of the statistics. */
                const int32_t *cnt = !strcmp(dev, "cuda") && !c.causal ? NULL : b.cnt;
                double rmean, rp5;
                if ((err = sa_lists_recall_stats(s, b.mass, sel->per_query, b.idx, cnt, c.topk, &ao,
                                                 RECALL_PERCENTILE, &rmean, &rp5, NULL)))
                    die("recall", err);
                double oerr = NAN;
                if (have_dense) {
                    cli_progress("select-eval: %s: %s: sparse attention", wl->name, sel->name);
                    if ((err = sa_lists_output_error(s, b.q, b.k, b.v, sel->per_query, b.idx, cnt,
                                                     c.topk, &ao, b.o_dense, &oerr)))
                        die("sparse attention", err);
                }
                double ov;
                if ((err = sa_lists_overlap(s, sel->per_query, b.idx, cnt, c.topk, b.oracle,
                                            b.oracle_cnt, c.topk, &ov)))
                    die("overlap", err);
                cli_progress_done();
                print_row(&c, wl->name, strength, sel->name, ix, dev, match, rmean, rp5, oerr, ov,
                          ms);
            }
        }
    }
    cli_progress_done();
#ifdef SA_HAVE_CUDA
    bh_free(dq);
    bh_free(dk);
    for (int j = 0; j < MAX_CHOICES; j++)
        bh_free(dqi[j]), bh_free(dki[j]);
    bh_free(didx);
    bh_free(dcnt);
    if (g)
        bh_close(g);
#endif
    for (int j = 0; j < c.choices; j++) {
        free(qi[j]);
        free(ki[j]);
    }
    free(b.q);
    free(b.k);
    free(b.v);
    free(b.o);
    free(b.o_dense);
    free(b.mass);
    free(b.idx);
    free(b.idx_cpu);
    free(b.oracle);
    free(b.cnt);
    free(b.cnt_cpu);
    free(b.oracle_cnt);
    return 0;
}
