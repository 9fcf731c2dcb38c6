/* Part 3 of "sparseattn bench selectors" (issue 18, point 3): per-query lists from a GPU selector
 * (nvfp4_query, and its /iN row on index vectors) straight into the KV-centric attention
 * (sa_kvcentric_attention), both queued on one stream without a host synchronization, against
 * the attention alone on the same lists. Each schedule of the KV-centric entry point is a row:
 * "kv" (every pair KV-centric) and "hybrid" (shared blocks Q-centric per tile), both with BF16
 * partials and validation off, as bench longctx runs them; the selector's bad input goes to a
 * device verdict read after the timed calls. One call per row first runs on poisoned outputs
 * with the KV-centric list check on. */
#include <stdlib.h>
#include <string.h>

#include "bench_selectors.h"
#include "cli.h"

#ifdef SA_HAVE_CUDA

enum { QP_KV, QP_HYBRID, QP_SCHEDULES };
static const char *const qp_schedule_names[QP_SCHEDULES] = {"kv", "hybrid"};

struct bs_query {
    sa_shape s;
    const char *selectors;
    int32_t *idx[BENCH_MAX_SETS], *cnt[BENCH_MAX_SETS]; /* (B, Hkv, Sq, k) per set */
    int32_t *h_idx, *h_cnt;                             /* set 0's, for the FLOP count */
    void *workspace;                                    /* the larger of both schedules' */
    size_t workspace_bytes;
    sa_gpu_verdict *verdict;
};

/* One timed call: on one set, the selector (NULL: the attention alone) then the attention. */
typedef struct qp_call {
    const sa_selector *sel;
    const uint16_t *qi, *ki; /* index vectors, or NULL: the attention's Q and K */
    int index_heads;
    sa_gpu_verdict *verdict;
    sa_kv_params p;
} qp_call;

static void kv_params_for(const bs_query *q, const bh_set *set, int i, int schedule,
                          int validate, sa_kv_params *p)
{
    sa_kv_params_default(p);
    p->shape = q->s;
    p->q = set->a.q, p->k = set->a.k, p->v = set->a.v;
    p->o = set->a.o;
    p->lse = set->a.lse;
    p->lists = (sa_query_lists){q->idx[i], q->cnt[i], BENCH_K};
    p->partial_format = SA_KV_PARTIAL_BF16;
    p->validate = validate;
    p->schedule = schedule == QP_HYBRID ? SA_KV_SCHEDULE_HYBRID : SA_KV_SCHEDULE_KV;
    p->workspace = q->workspace;
    p->workspace_bytes = q->workspace_bytes;
}

static int qp_fn(void *ctx, void *stream)
{
    qp_call *c = ctx;
    c->p.stream = stream;
    if (c->sel) {
        sa_select_params sp;
        sa_select_params_default(&sp);
        sp.k = BENCH_K;
        sp.stream = stream;
        sp.verdict = c->verdict;
        if (c->qi) {
            sp.q_index = c->qi, sp.k_index = c->ki;
            sp.index_dim = c->p.shape.head_dim;
            sp.index_heads = c->index_heads;
        }
        int rc = c->sel->cuda(&c->p.shape, c->p.q, c->p.k, &sp, (int32_t *)c->p.lists.indices,
                              (int32_t *)c->p.lists.counts);
        if (rc)
            return rc;
    }
    return sa_kvcentric_attention(&c->p);
}

void bs_query_close(bs_query *q)
{
    if (!q)
        return;
    for (int i = 0; i < BENCH_MAX_SETS; i++)
        bh_free(q->idx[i]), bh_free(q->cnt[i]);
    bh_free(q->workspace);
    sa_gpu_verdict_destroy(q->verdict);
    free(q->h_idx), free(q->h_cnt);
    free(q);
}

int bs_query_open(const sa_shape *s, const bh_set *sets, int nsets, const char *selectors,
                  bs_query **out)
{
    *out = NULL;
    bs_query *q = calloc(1, sizeof *q);
    if (!q)
        return SA_ERR_NOMEM;
    q->s = *s;
    q->selectors = selectors;
    const size_t rows = sa_query_rows(s);
    q->h_idx = malloc(rows * BENCH_K * sizeof *q->h_idx);
    q->h_cnt = malloc(rows * sizeof *q->h_cnt);
    int rc = q->h_idx && q->h_cnt ? SA_OK : SA_ERR_NOMEM;
    for (int i = 0; !rc && i < nsets; i++) {
        rc = bh_alloc((void **)&q->idx[i], rows * BENCH_K * sizeof(int32_t));
        if (!rc)
            rc = bh_alloc((void **)&q->cnt[i], rows * sizeof(int32_t));
    }
    for (int sch = 0; !rc && sch < QP_SCHEDULES; sch++) {
        sa_kv_params p;
        size_t bytes = 0;
        kv_params_for(q, &sets[0], 0, sch, 0, &p);
        rc = sa_kv_workspace_size(&p, &bytes);
        if (bytes > q->workspace_bytes)
            q->workspace_bytes = bytes;
    }
    if (!rc)
        rc = bh_alloc(&q->workspace, q->workspace_bytes);
    if (!rc)
        rc = sa_gpu_verdict_create(&q->verdict);
    if (rc) {
        bs_query_close(q);
        return rc;
    }
    *out = q;
    return SA_OK;
}

/* Useful FLOPs of set 0's lists: 4 * D per (query head, query, listed key). */
static int list_flops(bs_query *q, double *flops)
{
    const sa_shape *s = &q->s;
    const size_t rows = sa_query_rows(s);
    int rc = bh_download(q->h_idx, q->idx[0], rows * BENCH_K * sizeof *q->h_idx);
    if (!rc)
        rc = bh_download(q->h_cnt, q->cnt[0], rows * sizeof *q->h_cnt);
    if (rc)
        return rc;
    double keys = 0;
    for (size_t r = 0; r < rows; r++)
        for (int j = 0; j < q->h_cnt[r] && j < BENCH_K; j++)
            keys += sa_block_len(s, q->h_idx[r * BENCH_K + j]);
    *flops = 4.0 * s->head_dim * (double)(s->heads_q / s->heads_kv) * keys;
    return SA_OK;
}

/* One row: the pipeline and the attention alone for one selector row and schedule. */
static int qp_row(bench_env *e, const bench_flags *f, bs_query *q, const char *workload,
                  const sa_selector *sel, const char *name, int schedule, bh_set *sets,
                  int nsets, const index_sets *ix)
{
    qp_call calls[BENCH_MAX_SETS];
    void *ctx[BENCH_MAX_SETS];
    for (int i = 0; i < nsets; i++) {
        memset(&calls[i], 0, sizeof calls[i]);
        calls[i].sel = sel;
        calls[i].verdict = q->verdict;
        if (ix)
            calls[i].qi = ix->q[i], calls[i].ki = ix->k[i], calls[i].index_heads = ix->heads;
        kv_params_for(q, &sets[i], i, schedule, 0, &calls[i].p);
        ctx[i] = &calls[i];
    }
    char label[64];
    snprintf(label, sizeof label, "%s -> %s", name, qp_schedule_names[schedule]);
    /* One call on poisoned outputs, the lists checked by the attention (synchronously). */
    qp_call smoke = calls[0];
    smoke.p.validate = 1;
    size_t bad = 0;
    int rc = bh_smoke(e->g, label, qp_fn, &smoke, &sets[0].a, &bad);
    if (!rc && bad)
        fprintf(stderr, "sparseattn: bench selectors: %s left %zu outputs NaN/inf\n", label, bad);
    bh_timing tp, ta;
    if (!rc)
        rc = bh_time(e->g, label, qp_fn, ctx, nsets, 0, f->warmup, f->reps, &tp);
    if (!rc)
        rc = sa_gpu_verdict_read(q->verdict, NULL);
    /* The attention alone on the lists the pipeline left in every set. */
    for (int i = 0; i < nsets; i++)
        calls[i].sel = NULL;
    if (!rc)
        rc = bh_time(e->g, label, qp_fn, ctx, nsets, 0, f->warmup, f->reps, &ta);
    double flops = 0;
    if (!rc)
        rc = list_flops(q, &flops);
    if (rc) {
        fprintf(stderr, "sparseattn: bench selectors: %s: %s\n", label, bench_why(rc));
        return rc;
    }
    const double share = ta.median_ms / tp.median_ms;
    if (f->json) {
        printf("{\"bench\":\"selectors\",\"kind\":\"query_pipeline\",\"len_q\":%d,\"len_kv\":%d,"
               "\"selector\":",
               q->s.len_q, q->s.len_kv);
        cli_json_str(name);
        printf(",\"workload\":");
        cli_json_str(workload);
        printf(",\"schedule\":\"%s\",\"median_ms\":%.6g,\"min_ms\":%.6g,\"max_ms\":%.6g,"
               "\"reps\":%d,\"host_us_per_call\":%.6g,\"attn_median_ms\":%.6g,"
               "\"attn_host_us_per_call\":%.6g,\"useful_flops\":%.6g,\"pipeline_tflops\":%.6g,"
               "\"attn_tflops\":%.6g,\"share\":%.4g,\"bad_outputs\":%zu}\n",
               qp_schedule_names[schedule], tp.median_ms, tp.min_ms, tp.max_ms, tp.reps,
               tp.host_us, ta.median_ms, ta.host_us, flops, bench_tflops(flops, tp.median_ms),
               bench_tflops(flops, ta.median_ms), share, bad);
    } else {
        printf("%-10s %-16s %-7s %9.4f %9.4f %9.1f %9.1f %7.1f%% %8.1f\n", workload, name,
               qp_schedule_names[schedule], tp.median_ms, ta.median_ms,
               bench_tflops(flops, tp.median_ms), bench_tflops(flops, ta.median_ms),
               100.0 * share, tp.host_us);
    }
    fflush(stdout);
    return SA_OK;
}

void bs_query_header(const bench_flags *f, const bs_query *q)
{
    if (!f->json)
        printf("\n%-10s %-16s %-7s %9s %9s %9s %9s %8s %8s  (len_q %d, len_kv %d, per-query "
               "lists -> KV-centric, BF16 partials, useful TFLOP/s; share = pipe TF / attn TF, "
               "goal >= 70%% at 32K, >= 60%% at 64K)\n",
               "workload", "selector", "sched", "pipe ms", "attn ms", "pipe TF", "attn TF",
               "share", "host us", q->s.len_q, q->s.len_kv);
}

int bs_query_run(bench_env *e, const bench_flags *f, bs_query *q, const char *workload,
                 bh_set *sets, int nsets, const index_sets *ix)
{
    for (int i = 0; i < sa_selector_count(); i++) {
        const sa_selector *sel = sa_selector_at(i);
        if (!sel->cuda || !sel->per_query)
            continue;
        /* pass 1: the scorer on index vectors of its own (ix->heads heads). */
        for (int pass = 0; pass < 2; pass++) {
            if (pass && (strncmp(sel->name, "nvfp4", 5) || !ix->heads))
                continue;
            char name[40];
            snprintf(name, sizeof name, pass ? "%s/i%d" : "%s", sel->name, ix->heads);
            if (!bs_wanted(q->selectors, sel->name, name))
                continue;
            for (int sch = 0; sch < QP_SCHEDULES; sch++) {
                int rc = qp_row(e, f, q, workload, sel, name, sch, sets, nsets,
                                pass ? ix : NULL);
                if (rc)
                    return rc;
            }
        }
    }
    return SA_OK;
}
#endif
