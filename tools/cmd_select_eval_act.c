/* "sparseattn select-eval --activations FILE": selection quality on a real model's captured Q, K,
 * V (docs/activations.md). Per stored layer: the exact block mass and dense attention, causal as
 * the file says, once; per budget k and registered selector: its lists, their recall of the mass
 * (mean and 5th percentile over queries, overall and per query head), the output error of
 * attention over the lists against dense (relative L2 of the FP32 outputs), and the selector's
 * time. Beside them two bounds: the oracle selector (per tile: the top-k blocks of the tile's
 * summed mass) and "oracle_query" (per query: the top-k blocks of the query's own mass, summed
 * over its GQA group, the diagonal kept under causal), the bound for per-query lists. With
 * --head-lists every tile selector also runs in the head-list modes it takes (one list per query
 * head, or the group's budget pooled across its heads: sa_select_params.head_lists), named
 * NAME/ph and NAME/pool. Layers with a sliding window shorter than the text are skipped: the
 * reference has no window. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "sa_activations.h"

#define ACT_MAX_BUDGETS 16
#define ACT_MAX_LAYERS 1024 /* --layers entries */
#define ACT_PERCENTILE 0.05
#define ACT_MODES 3 /* SA_HEAD_LISTS_GROUP, _PER_HEAD, _POOLED */

/* The head_lists modes by name (the flag's values and the JSON's "head_lists") and the suffix
 * of a selector's name in the tables. */
static const char *const mode_name[ACT_MODES] = {"group", "per_head", "pooled"};
static const char *const mode_suffix[ACT_MODES] = {"", "/ph", "/pool"};

typedef struct act_cfg {
    const char *path, *selector, *layers;
    int budgets[ACT_MAX_BUDGETS], nbudgets;
    int json, per_head, keep_sink;
    int modes[ACT_MODES]; /* modes[m]: run head_lists mode m */
} act_cfg;

static void act_usage(FILE *f)
{
    fprintf(f,
            "usage: sparseattn select-eval --activations FILE [flags]\n"
            "  --activations FILE  an activation file (tools/capture_activations.py,\n"
            "                      docs/activations.md); causal as its metadata says\n"
            "  --layers LIST       model layer indices, e.g. 0,5-7 (default every stored layer;\n"
            "                      at most %d layers in all, a range counting each of its\n"
            "                      layers)\n"
            "  --budgets LIST      blocks per row (default 8,16,32,64; at most %d entries, a\n"
            "                      range counting each of its values; past the layer's blocks:\n"
            "                      n/a)\n"
            "  --selector NAME     only this selector (the two oracle bounds still run)\n"
            "  --keep-sink         every registered selector keeps block 0 (the attention sink)\n"
            "  --per-head          also one line per query head\n"
            "  --head-lists LIST   head_lists modes, of group, per_head, pooled (default group);\n"
            "                      each selector runs in the modes it takes: NAME/ph, NAME/pool\n"
            "  --json              one JSON object per line instead of the tables\n",
            ACT_MAX_LAYERS, ACT_MAX_BUDGETS);
}

static void *act_xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "sparseattn: select-eval: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

/* A list of integers in [lo, hi] being read into out (at most cap values). */
typedef struct int_list {
    int lo, hi, cap, n;
    int *out;
} int_list;

/* One entry of an integer list, split by cli_list: "a" or a range "a-b". */
static void one_range(const char *flag, const char *t, void *ctx)
{
    int_list *l = ctx;
    char *end;
    long a = strtol(t, &end, 10), b = a;
    int ok = end != t;
    if (ok && *end == '-') {
        const char *p = end + 1;
        b = strtol(p, &end, 10);
        ok = end != p;
    }
    if (!ok || *end)
        cli_usage_error("select-eval: %s: '%s' is not a number or a range a-b", flag, t);
    if (a < l->lo || b > l->hi || a > b)
        cli_usage_error("select-eval: %s: %ld-%ld outside [%d, %d]", flag, a, b, l->lo, l->hi);
    for (long x = a; x <= b; x++) {
        if (l->n == l->cap)
            cli_usage_error("select-eval: %s: more than %d entries", flag, l->cap);
        l->out[l->n++] = (int)x;
    }
}

/* "a,b-c,..." of integers in [lo, hi] into out (at most cap); returns the count. */
static int parse_list(const char *flag, const char *v, int lo, int hi, int *out, int cap)
{
    int_list l = {lo, hi, cap, 0, out};
    cli_list(flag, v, one_range, &l);
    return l.n;
}

/* One entry of --head-lists, split by cli_list: a mode's name. */
static void one_mode(const char *flag, const char *t, void *ctx)
{
    int *modes = ctx, m = 0;
    while (m < ACT_MODES && strcmp(t, mode_name[m]))
        m++;
    if (m == ACT_MODES)
        cli_usage_error("select-eval: %s: '%s' is not one of group, per_head, pooled", flag, t);
    modes[m] = 1;
}

/* "group,pooled" -> modes[0] = modes[2] = 1. */
static void parse_modes(const char *v, int *modes)
{
    for (int m = 0; m < ACT_MODES; m++)
        modes[m] = 0;
    cli_list("--head-lists", v, one_mode, modes);
}

static void act_parse(int argc, char **argv, act_cfg *c)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            act_usage(stdout);
            exit(0);
        } else if (!strcmp(a, "--activations"))
            c->path = cli_str_arg(argc, argv, &i);
        else if (!strcmp(a, "--layers"))
            c->layers = cli_str_arg(argc, argv, &i);
        else if (!strcmp(a, "--budgets"))
            c->nbudgets = parse_list(a, cli_str_arg(argc, argv, &i), 1, 1 << 20, c->budgets,
                                     ACT_MAX_BUDGETS);
        else if (!strcmp(a, "--selector"))
            c->selector = cli_str_arg(argc, argv, &i);
        else if (!strcmp(a, "--per-head"))
            c->per_head = 1;
        else if (!strcmp(a, "--head-lists"))
            parse_modes(cli_str_arg(argc, argv, &i), c->modes);
        else if (!strcmp(a, "--keep-sink"))
            c->keep_sink = 1;
        else if (!strcmp(a, "--json"))
            c->json = 1;
        else
            cli_usage_error("select-eval: unknown flag '%s' with --activations (see "
                            "select-eval --activations x --help)", a);
    }
    if (c->selector && !sa_selector_by_name(c->selector))
        cli_usage_error("select-eval: unknown selector '%s'", c->selector);
}

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

typedef struct stats {
    double mean, p5, err;
} stats;

/* Recall mean and 5th percentile over the queries of head h (h < 0: all heads) that see a key. */
static stats recall_stats(const sa_shape *s, const float *recall, int causal, int h, float *tmp)
{
    size_t n = 0;
    double acc = 0;
    for (int b = 0; b < s->batch; b++)
        for (int hq = 0; hq < s->heads_q; hq++) {
            if (h >= 0 && hq != h)
                continue;
            const float *r = recall + ((size_t)b * s->heads_q + hq) * s->len_q;
            for (int i = 0; i < s->len_q; i++)
                if (!causal || sa_causal_last_key(s, i) >= 0) {
                    tmp[n++] = r[i];
                    acc += r[i];
                }
        }
    stats st = {NAN, NAN, NAN};
    if (n) {
        qsort(tmp, n, sizeof *tmp, cmp_float);
        st.mean = acc / (double)n;
        st.p5 = tmp[(size_t)(ACT_PERCENTILE * (double)(n - 1))];
    }
    return st;
}

/* Relative L2 of x against ref over query head h (h < 0: all). */
static double out_err(const sa_shape *s, const float *x, const float *ref, int h)
{
    const size_t per_head = (size_t)s->len_q * s->head_dim;
    double num = 0, den = 0;
    for (int b = 0; b < s->batch; b++)
        for (int hq = 0; hq < s->heads_q; hq++) {
            if (h >= 0 && hq != h)
                continue;
            const size_t o = ((size_t)b * s->heads_q + hq) * per_head;
            for (size_t i = 0; i < per_head; i++) {
                double d = (double)x[o + i] - ref[o + i];
                num += d * d;
                den += (double)ref[o + i] * ref[o + i];
            }
        }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* The per-query bound: for each (b, hkv, query) the top-k blocks of the group's summed mass
 * among the visible ones, the diagonal (last visible) block kept under causal; counts min(k,
 * visible), -1 past them, rows sorted by block index. */
static void oracle_query_lists(const sa_shape *s, const float *mass, int k, int causal,
                               int32_t *idx, int32_t *cnt)
{
    const int n = sa_kv_blocks(s), group = s->heads_q / s->heads_kv;
    double *score = act_xmalloc((size_t)n * sizeof *score);
    unsigned char *take = act_xmalloc((size_t)n);
    for (int b = 0; b < s->batch; b++)
        for (int hk = 0; hk < s->heads_kv; hk++)
            for (int i = 0; i < s->len_q; i++) {
                const size_t row = ((size_t)b * s->heads_kv + hk) * s->len_q + i;
                const int vis = causal ? sa_causal_query_blocks(s, i) : n;
                const int c = k < vis ? k : vis;
                for (int blk = 0; blk < vis; blk++) {
                    double acc = 0;
                    for (int g = 0; g < group; g++)
                        acc += mass[(((size_t)b * s->heads_q + hk * group + g) * s->len_q + i) *
                                        n + blk];
                    score[blk] = acc;
                    take[blk] = 0;
                }
                int got = 0;
                if (causal && c > 0) {
                    take[vis - 1] = 1;
                    got = 1;
                }
                for (; got < c; got++) { /* the best not taken; ties to the lower index */
                    int best = -1;
                    for (int blk = 0; blk < vis; blk++)
                        if (!take[blk] && (best < 0 || score[blk] > score[best]))
                            best = blk;
                    if (best < 0) /* not reached: c <= vis (a guard the compiler can see) */
                        break;
                    take[best] = 1;
                }
                int j = 0;
                for (int blk = 0; blk < vis; blk++)
                    if (take[blk])
                        idx[row * k + j++] = blk;
                for (; j < k; j++)
                    idx[row * k + j] = -1;
                cnt[row] = c;
            }
    free(score);
    free(take);
}

/* Mean over the layers evaluated, per (budget, selector): recall mean, recall p5, output error. */
typedef struct total {
    double recall, p5, err;
    int layers;
} total;

static void die_act(const char *what, int err)
{
    cli_progress_done();
    fprintf(stderr, "sparseattn: select-eval --activations: %s: %s\n", what, sa_strerror(err));
    exit(1);
}

int cmd_select_eval_activations(int argc, char **argv)
{
    act_cfg c = {.budgets = {8, 16, 32, 64}, .nbudgets = 4, .modes = {1, 0, 0}};
    act_parse(argc, argv, &c);
    if (!c.path)
        cli_usage_error("select-eval: --activations needs a FILE");
    /* --layers is judged before the file is opened, as the other flags are; whether the file
     * holds those layers, after. */
    int *want = NULL, nwant = 0;
    if (c.layers) {
        want = act_xmalloc(ACT_MAX_LAYERS * sizeof *want);
        nwant = parse_list("--layers", c.layers, 0, 999999, want, ACT_MAX_LAYERS);
    }
    char msg[512];
    sa_act_file *f;
    int err = sa_act_open(c.path, &f, msg, sizeof msg);
    if (err) {
        fprintf(stderr, "sparseattn: select-eval: %s\n", msg);
        free(want);
        return 1;
    }
    const int nlayers = sa_act_layer_count(f);
    if (c.layers) {
        for (int j = 0; j < nwant; j++)
            if (sa_act_find_layer(f, want[j]) < 0)
                cli_usage_error("select-eval: layer %d is not in %s", want[j], c.path);
    }
    const char *model = sa_act_meta(f, "model");
    /* Rows of the totals: (selector, mode) with the selectors and then oracle_query. */
    const int nsel = (sa_selector_count() + 1) * ACT_MODES;
    total *tot = calloc((size_t)c.nbudgets * nsel, sizeof *tot);
    if (!tot)
        die_act("totals", SA_ERR_NOMEM);
    if (!c.json)
        printf("activations %s: %s, %s tokens, %d layers stored%s\n", c.path,
               model ? model : "(no model named)", sa_act_meta(f, "tokens") ?
               sa_act_meta(f, "tokens") : "?", nlayers,
               c.keep_sink ? "; the selectors keep block 0" : "");

    for (int li = 0; li < nlayers; li++) {
        sa_act_layer L;
        sa_act_layer_info(f, li, &L);
        int chosen = !want;
        for (int j = 0; j < nwant; j++)
            chosen |= want[j] == L.layer;
        if (!chosen)
            continue;
        const sa_shape *s = &L.shape;
        const char *type = sa_act_layer_meta(f, li, "layer_type");
        if (L.sliding_window > 0 && L.sliding_window < s->len_kv) {
            if (!c.json)
                printf("\nlayer %d (%s): skipped, sliding window %d < %d keys (the reference has "
                       "no window)\n", L.layer, type ? type : "?", L.sliding_window, s->len_kv);
            continue;
        }
        if ((err = sa_shape_check(s))) {
            if (!c.json)
                printf("\nlayer %d: skipped: %s\n", L.layer, sa_strerror(err));
            continue;
        }
        const size_t nq = sa_q_elems(s), nkv = sa_kv_elems(s), queries = sa_lse_elems(s);
        const int n = sa_kv_blocks(s);
        uint16_t *q = act_xmalloc(nq * 2), *k = act_xmalloc(nkv * 2), *v = act_xmalloc(nkv * 2);
        if ((err = sa_act_read(f, li, q, k, v)))
            die_act("read", err);
        /* The library's scale is 1/sqrt(D): a model scale other than that goes into Q. */
        const double fold = L.scale * sqrt((double)s->head_dim);
        if (fabs(fold - 1) > 1e-12)
            for (size_t i = 0; i < nq; i++)
                q[i] = sa_bf16_from_f32((float)(sa_bf16_to_f32(q[i]) * fold));
        sa_attn_opts ao;
        sa_attn_opts_default(&ao);
        ao.causal = L.causal;
        float *mass = act_xmalloc(queries * n * sizeof *mass);
        float *o_dense = act_xmalloc(nq * 4), *o_sparse = act_xmalloc(nq * 4);
        float *recall = act_xmalloc(queries * 4), *tmp = act_xmalloc(queries * 4);
        uint16_t *o16 = act_xmalloc(nq * 2);
        cli_progress("select-eval: layer %d: block mass and dense attention", L.layer);
        if ((err = sa_block_mass_opts(s, q, k, &ao, mass)))
            die_act("block mass", err);
        if ((err = sa_ref_dense_opts(s, q, k, v, &ao, &(sa_outputs){.o = o16, .o_f32 = o_dense})))
            die_act("dense attention", err);
        if (!c.json)
            printf("\nlayer %d (%s): B%d Hq%d Hkv%d S%d D%d, %s, %d blocks, scale %g%s\n"
                   "%-18s %5s %8s %8s %9s %9s\n",
                   L.layer, type ? type : "?", s->batch, s->heads_q, s->heads_kv, s->len_q,
                   s->head_dim, L.causal ? "causal" : "not causal", n, L.scale,
                   fabs(fold - 1) > 1e-12 ? " (folded into Q)" : "", "selector", "k",
                   "recall", "p5", "out_err", "select_ms");
        for (int bi = 0; bi < c.nbudgets; bi++) {
            const int kb = c.budgets[bi];
            if (kb > n) {
                if (!c.json)
                    printf("%-18s %5d  n/a: more than the layer's %d blocks\n", "*", kb, n);
                continue;
            }
            /* Per-query lists, or tile lists of Hq heads and up to 2 kb blocks (pooled). */
            const size_t q_rows = (size_t)s->batch * s->heads_kv * s->len_q;
            const size_t t_rows = (size_t)s->batch * s->heads_q * sa_q_tiles(s);
            const size_t max_rows = q_rows > t_rows ? q_rows : t_rows;
            int32_t *idx = act_xmalloc(max_rows * 2 * kb * 4), *cnt = act_xmalloc(max_rows * 4);
            for (int si = 0; si < nsel; si++) {
                const int mode = si % ACT_MODES;
                const sa_selector *sel = si / ACT_MODES < sa_selector_count()
                                             ? sa_selector_at(si / ACT_MODES) : NULL;
                const int per_query = sel ? sel->per_query : 1;
                if (!c.modes[mode] || (!sel && mode != SA_HEAD_LISTS_GROUP))
                    continue;
                if (c.selector && sel && strcmp(sel->name, c.selector) &&
                    strcmp(sel->name, "oracle"))
                    continue;
                sa_select_params p;
                sa_select_params_default(&p);
                p.k = kb;
                p.seed = 1;
                p.causal = L.causal;
                p.head_lists = mode;
                /* keep_sink with causal needs room for the diagonal and the sink. */
                p.keep_sink = c.keep_sink && (kb >= 2 || n == 1);
                int list_heads = s->heads_kv, rows, width = kb;
                if (sel && sa_select_layout(sel, s, &p, &list_heads, &rows, &width))
                    continue; /* a mode this selector does not take */
                char name[64];
                snprintf(name, sizeof name, "%s%s", sel ? sel->name : "oracle_query",
                         mode_suffix[mode]);
                cli_progress("select-eval: layer %d: k %d: %s", L.layer, kb, name);
                double t0 = cli_now();
                if (sel) {
                    if ((err = sel->cpu(s, q, k, &p, idx, cnt)))
                        die_act(name, err);
                } else
                    oracle_query_lists(s, mass, kb, L.causal, idx, cnt);
                const double ms = (cli_now() - t0) * 1e3;
                const sa_tile_lists tl = {idx, cnt, list_heads, width};
                if (per_query)
                    err = sa_lists_recall_counts(s, mass, per_query, idx, cnt, kb, recall);
                else
                    err = sa_tile_lists_recall(s, mass, &tl, recall);
                if (err)
                    die_act("recall", err);
                if (per_query) {
                    sa_query_lists l = {idx, cnt, kb};
                    err = sa_ref_query_sparse(s, q, k, v, &l, &ao,
                                              &(sa_outputs){.o = o16, .o_f32 = o_sparse});
                } else {
                    err = sa_ref_tile_sparse(s, q, k, v, &tl, &ao,
                                             &(sa_outputs){.o = o16, .o_f32 = o_sparse});
                }
                if (err)
                    die_act("sparse attention", err);
                stats all = recall_stats(s, recall, L.causal, -1, tmp);
                all.err = out_err(s, o_sparse, o_dense, -1);
                total *t = &tot[bi * nsel + si];
                t->recall += all.mean;
                t->p5 += all.p5;
                t->err += all.err;
                t->layers++;
                cli_progress_done();
                if (c.json) {
                    /* The file's name and its model, as the plots group runs (plot_quality.py). */
                    printf("{\"file\":");
                    cli_json_str(c.path);
                    printf(",\"model\":");
                    cli_json_str(model ? model : "");
                    printf(",\"layer\":%d,\"layer_type\":", L.layer);
                    cli_json_str(type ? type : ""); /* from the file: escaped */
                    printf(",\"len\":%d,"
                           "\"heads_q\":%d,\"heads_kv\":%d,\"head_dim\":%d,\"causal\":%d,"
                           "\"selector\":\"%s\",\"head_lists\":\"%s\",\"per_query\":%d,"
                           "\"keep_sink\":%d,\"k\":%d,\"recall_mean\":%.6f,"
                           "\"recall_p5\":%.6f,\"out_rel_l2\":%.6g,\"select_ms\":%.3f,"
                           "\"per_head\":[",
                           s->len_q, s->heads_q, s->heads_kv,
                           s->head_dim, L.causal, sel ? sel->name : name, mode_name[mode],
                           per_query, sel ? c.keep_sink : 0, kb,
                           all.mean, all.p5, all.err, ms);
                    for (int h = 0; h < s->heads_q; h++) {
                        stats hs = recall_stats(s, recall, L.causal, h, tmp);
                        printf("%s{\"recall_mean\":%.6f,\"recall_p5\":%.6f,\"out_rel_l2\":%.6g}",
                               h ? "," : "", hs.mean, hs.p5, out_err(s, o_sparse, o_dense, h));
                    }
                    printf("]}\n");
                } else {
                    printf("%-18s %5d %8.4f %8.4f %9.3e %9.1f\n", name, kb, all.mean, all.p5,
                           all.err, ms);
                    for (int h = 0; c.per_head && h < s->heads_q; h++) {
                        stats hs = recall_stats(s, recall, L.causal, h, tmp);
                        printf("  head %-5d %5d %8.4f %8.4f %9.3e\n", h, kb, hs.mean, hs.p5,
                               out_err(s, o_sparse, o_dense, h));
                    }
                }
            }
            free(idx);
            free(cnt);
        }
        free(q);
        free(k);
        free(v);
        free(mass);
        free(o_dense);
        free(o_sparse);
        free(recall);
        free(tmp);
        free(o16);
    }
    if (!c.json) {
        printf("\nmean over the layers evaluated (recall mean, recall p5, out_err):\n%-18s",
               "selector");
        for (int bi = 0; bi < c.nbudgets; bi++) {
            char head[32];
            snprintf(head, sizeof head, "k=%d", c.budgets[bi]);
            printf("  %-23s", head);
        }
        printf("\n");
        for (int si = 0; si < nsel; si++) {
            const sa_selector *sel = si / ACT_MODES < sa_selector_count()
                                         ? sa_selector_at(si / ACT_MODES) : NULL;
            int any = 0;
            for (int bi = 0; bi < c.nbudgets; bi++)
                any |= tot[bi * nsel + si].layers > 0;
            if (!any)
                continue;
            char name[64];
            snprintf(name, sizeof name, "%s%s", sel ? sel->name : "oracle_query",
                     mode_suffix[si % ACT_MODES]);
            printf("%-18s", name);
            for (int bi = 0; bi < c.nbudgets; bi++) {
                const total *t = &tot[bi * nsel + si];
                if (t->layers)
                    printf("  %6.4f %6.4f %9.3e", t->recall / t->layers, t->p5 / t->layers,
                           t->err / t->layers);
                else
                    printf("  %-23s", "n/a");
            }
            printf("\n");
        }
    }
    free(tot);
    free(want);
    sa_act_close(f);
    return 0;
}
