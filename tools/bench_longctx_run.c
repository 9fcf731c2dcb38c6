/* One cell of "sparseattn bench longctx" (bench_longctx.h, lc_run_cell): every contender set up,
 * checked once on poisoned outputs against the exact reference of the sampled rows, timed in
 * interleaved rounds through the GPU bench harness, printed. */
#include <stddef.h>

#include "bench_gpu.h"
#include "bench_longctx.h"

#ifdef SA_HAVE_CUDA
/* A contender in one cell, and the context of its harness callback (slot_call). */
typedef struct lc_slot {
    const lc_contender *ct;
    const lc_cell *c;
    void *state;
    size_t ws;
    const char *status; /* "ok", "skipped", "failed" */
    char why[320];
    int exact;
    lc_err err;
    size_t unwritten;
    double round_ms[LC_MAX_ROUNDS], median_ms, min_ms, max_ms, host_us;
} lc_slot;

/* One run of the slot's contender; it queues on c->stream, the harness's stream. */
static int slot_call(void *ctx, void *stream)
{
    const lc_slot *sl = ctx;
    (void)stream;
    return sl->ct->run(sl->c, sl->state);
}

static void slot_fail(lc_slot *sl, const char *status, int rc)
{
    sl->status = status;
    snprintf(sl->why, sizeof sl->why, "%s", bench_why(rc));
}

/* One run on poisoned outputs: every output written, and the sampled rows against `ref`. */
static int slot_check(lc_slot *sl, struct bh_gpu *g, const lc_rows *r, uint16_t *o, float *lse,
                      const double *ref_o, const double *ref_lse)
{
    const lc_cell *c = sl->c;
    const sa_shape *s = &c->s;
    const size_t d = (size_t)s->head_dim;
    size_t bad_o = 0, bad_l = 0;
    int rc = bh_poison(g, c->a.o, sa_q_elems(s) * 2);
    if (!rc)
        rc = bh_poison(g, c->a.lse, sa_lse_elems(s) * 4);
    if (!rc && (rc = sl->ct->run(c, sl->state))) { /* its own code: no harness detail */
        sl->status = "failed";
        snprintf(sl->why, sizeof sl->why, "run: %s", sa_strerror(rc));
        return 1;
    }
    if (!rc) /* synchronizes the stream */
        rc = bh_count_bad(g, c->a.o, sa_q_elems(s), c->a.lse, sa_lse_elems(s), &bad_o, &bad_l);
    for (int i = 0; !rc && i < r->n; i++) {
        const size_t row = ((size_t)r->b[i] * s->heads_q + r->h[i]) * s->len_q + r->q[i];
        rc = bh_download(o + i * d, c->a.o + row * d, d * 2);
        if (!rc)
            rc = bh_download(lse + i, c->a.lse + row, 4);
    }
    if (rc)
        return slot_fail(sl, "failed", rc), 1;
    sl->unwritten = bad_o + bad_l;
    sl->err = lc_compare(r, s->head_dim, o, lse, ref_o, ref_lse);
    if (sl->unwritten) {
        sl->status = "failed";
        snprintf(sl->why, sizeof sl->why, "%zu outputs NaN/inf after one run; not timed",
                 sl->unwritten);
        return 1;
    }
    return sl->exact != LC_APPROX_LISTS && !sl->err.pass;
}

static void print_slot(const lc_run_opts *opt, const lc_cell *c, const lc_slot *sl,
                       double dense_ms)
{
    const double ms = sl->median_ms;
    const double work = sl->ct->work ? sl->ct->work(c) : c->useful_flops;
    const double own_tf = bench_tflops(work, ms);
    const int ok = !strcmp(sl->status, "ok");
    const char *check = sl->exact == LC_APPROX_LISTS ? "inexact" : sl->err.pass ? "pass" : "FAIL";
    if (opt->json) {
        printf("{\"bench\":\"longctx\",\"kind\":\"contender\",\"B\":%d,\"Hq\":%d,\"Hkv\":%d,"
               "\"Sq\":%d,\"Skv\":%d,\"D\":%d,\"topk\":%d,\"structure\":\"%s\",\"contender\":",
               c->s.batch, c->s.heads_q, c->s.heads_kv, c->s.len_q, c->s.len_kv, c->s.head_dim,
               LC_TOPK, c->structure);
        cli_json_str(sl->ct->name);
        printf(",\"status\":\"%s\",\"workspace_bytes\":%zu", sl->status, sl->ws);
        if (*sl->why) {
            printf(",\"reason\":");
            cli_json_str(sl->why);
        }
        if (ok) {
            printf(",\"median_ms\":%.6g,\"min_ms\":%.6g,\"max_ms\":%.6g,\"host_us_per_call\":%.6g,"
                   "\"rounds\":%d,\"reps\":%d,\"round_ms\":[",
                   ms, sl->min_ms, sl->max_ms, sl->host_us, opt->rounds, opt->reps);
            for (int i = 0; i < opt->rounds; i++)
                printf("%s%.6g", i ? "," : "", sl->round_ms[i]);
            printf("],\"useful_flops\":%.6g,\"useful_tflops\":%.6g,\"work_flops\":%.6g,"
                   "\"work_tflops\":%.6g,\"gemm_tflops\":%.6g,\"work_fraction_of_gemm\":%.6g,"
                   "\"speedup_vs_dense\":",
                   c->useful_flops, bench_tflops(c->useful_flops, ms), work, own_tf,
                   opt->gemm_tflops, own_tf / opt->gemm_tflops);
            if (dense_ms > 0)
                printf("%.6g", dense_ms / ms);
            else
                printf("null");
        }
        if (ok)
            printf(",\"exact\":%s,\"check\":\"%s\",\"check_rows\":%d,\"rel_l2\":%.6g,"
                   "\"max_abs\":%.6g,\"ref_max\":%.6g,\"lse_max_abs\":%.6g,\"nonfinite\":%zu",
                   sl->exact == LC_APPROX_LISTS ? "false" : "true", check, opt->samples,
                   sl->err.rel_l2, sl->err.max_abs, sl->err.ref_max, sl->err.lse_max_abs,
                   sl->err.nonfinite);
        printf(",\"mean_union\":%.6g,\"union_exact\":%d}\n", c->mean_union, c->union_exact);
    } else if (!ok) {
        printf("  %-16s %s (its own memory %.1f MiB): %s\n", sl->ct->name, sl->status,
               sl->ws / 1048576.0, sl->why);
    } else {
        char vs[16] = "     n/a";
        if (dense_ms > 0)
            snprintf(vs, sizeof vs, "%7.2fx", dense_ms / ms);
        printf("  %-16s %10.3f %9.1f %9.1f %6.1f%% %s %10.1f  %-5s %8.2e %8.2e %8.2e  %s\n",
               sl->ct->name, ms, bench_tflops(c->useful_flops, ms), own_tf,
               100.0 * own_tf / opt->gemm_tflops, vs,
               sl->ws / 1048576.0, sl->exact == LC_APPROX_LISTS ? "no" : "yes", sl->err.rel_l2,
               sl->err.max_abs, sl->err.lse_max_abs, check);
    }
    fflush(stdout);
}

int lc_run_cell(const lc_run_opts *opt, struct bh_gpu *g, const lc_contender *ct, int n,
                const lc_cell *c, const lc_rows *r)
{
    const size_t d = (size_t)c->s.head_dim;
    double *qref_o = malloc((size_t)r->n * d * sizeof *qref_o);
    double *qref_lse = malloc((size_t)r->n * sizeof *qref_lse);
    uint16_t *o = malloc((size_t)r->n * d * sizeof *o);
    float *lse = malloc((size_t)r->n * sizeof *lse);
    lc_slot *sl = calloc(n, sizeof *sl);
    if (!qref_o || !qref_lse || !o || !lse || !sl) {
        fprintf(stderr, "sparseattn: bench longctx: out of host memory\n");
        free(qref_o), free(qref_lse), free(o), free(lse), free(sl);
        return 1;
    }
    lc_ref_rows(&c->s, r, c->h_qidx, LC_TOPK, qref_o, qref_lse);
    int failed = 0;
    for (int i = 0; i < n; i++) {
        lc_slot *x = &sl[i];
        x->ct = &ct[i];
        x->c = c;
        x->status = "ok";
        x->exact = x->ct->exact(c);
        int rc = x->ct->workspace(c, &x->ws);
        if (!rc)
            rc = x->ct->setup(c, &x->state);
        if (rc) { /* skipped, not failed: an allocation or a shape it does not take */
            slot_fail(x, "skipped", rc);
            x->ct = NULL;
            continue;
        }
        const int dense = x->exact == LC_EXACT_DENSE;
        failed |= slot_check(x, g, r, o, lse, dense ? r->dense_o : qref_o,
                             dense ? r->dense_lse : qref_lse);
    }
    for (int round = 0; round < opt->rounds; round++)
        for (int i = 0; i < n; i++) {
            if (!sl[i].ct || strcmp(sl[i].status, "ok"))
                continue;
            bh_timing t;
            void *ctx = &sl[i];
            int rc = bh_time(g, sl[i].ct->name, slot_call, &ctx, 1, 0, round ? 0 : opt->warmup,
                             opt->reps, &t);
            if (rc) {
                slot_fail(&sl[i], "failed", rc);
                failed = 1;
                continue;
            }
            sl[i].round_ms[round] = t.median_ms;
            sl[i].host_us += t.host_us / opt->rounds; /* the mean over the rounds */
            sl[i].min_ms = round && sl[i].min_ms < t.min_ms ? sl[i].min_ms : t.min_ms;
            sl[i].max_ms = round && sl[i].max_ms > t.max_ms ? sl[i].max_ms : t.max_ms;
        }
    double dense_ms = 0;
    for (int i = 0; i < n; i++) {
        if (!strcmp(sl[i].status, "ok")) {
            double m[LC_MAX_ROUNDS];
            memcpy(m, sl[i].round_ms, sizeof m);
            qsort(m, (size_t)opt->rounds, sizeof *m, bench_cmp_double);
            const int h = opt->rounds / 2;
            sl[i].median_ms = opt->rounds % 2 ? m[h] : 0.5 * (m[h - 1] + m[h]);
            if (dense_ms == 0 && sl[i].exact == LC_EXACT_DENSE)
                dense_ms = sl[i].median_ms;
        }
    }
    if (!opt->json)
        printf("  %-16s %10s %9s %9s %7s %8s %10s  %-5s %8s %8s %8s  %s\n", "contender",
               "median ms", "useful TF", "own TF", "% GEMM", "vs dense", "extra MiB", "exact",
               "rel L2", "max abs", "LSE err", "check");
    for (int i = 0; i < n; i++) {
        lc_slot tmp = sl[i];
        tmp.ct = &ct[i];
        print_slot(opt, c, &tmp, dense_ms);
        if (sl[i].ct)
            sl[i].ct->done(sl[i].state);
    }
    free(qref_o), free(qref_lse), free(o), free(lse), free(sl);
    return failed;
}
#endif
