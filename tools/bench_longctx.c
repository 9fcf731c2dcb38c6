/* "sparseattn bench longctx" (issue 17, point 3): schedules for per-query block lists at long
 * context. B 1, 16 query heads on 1 KV head, D 128, len_q = len_kv = S, every query 16 blocks of
 * 128, S in {16K, 32K, 64K, 128K} x structure in {overlap 0, 8, 14, 16, local}
 * (bench_longctx_host.c, lc_make_lists, defines them). Contenders, one table below: the
 * registry's default dense stage, the default tile-list stage on the per-tile union of the
 * queries' lists, and sa_kvcentric_attention with BF16 partials. Each is checked on sampled
 * rows against an exact CPU reference, then timed with CUDA events in interleaved rounds
 * (bh_time; the median of the rounds' medians). docs/benchmarks.md, "bench longctx". */
#include <stddef.h>

#include "bench_gpu.h"
#include "bench_longctx.h"

#define LC_HEADS_Q 16
#define LC_HEAD_DIM 128
#define LC_MIN_LEN (LC_TOPK * SA_TILE)
#define LC_MAX_LEN (1 << 20)
#define LC_MAX_LIST 16   /* entries of --lens, --structures and --contenders */

typedef struct lc_flags {
    bench_flags b; /* reps (per round), warmup, json, seed */
    int rounds, samples;
    int nlens, lens[LC_MAX_LIST];
    int nstruct, structs[LC_MAX_LIST];
    int ncont, conts[LC_MAX_LIST]; /* indices into the contender table; 0: every one */
    int share;                     /* --share: the hybrid contender's hybrid_share */
} lc_flags;

static int one_contender(const char *flag, const char *t);

static void usage(FILE *f)
{
    fprintf(f,
            "usage: sparseattn bench longctx [flags]\n"
            "  --lens L,L,...      len_q = len_kv values (default 16384,32768,65536,131072;\n"
            "                      each in [%d, %d])\n"
            "  --structures S,...  overlapR (R in 0..%d) and/or local (default\n"
            "                      overlap0,overlap8,overlap14,overlap16,local)\n"
            "  --reps N            timed runs per round, median of each round (default 10)\n"
            "  --rounds N          interleaved rounds, median of their medians (default 3,\n"
            "                      at most %d)\n"
            "  --warmup N          untimed runs before the first round (default 2)\n"
            "  --samples N         (head, query) rows checked against the CPU reference\n"
            "                      (default 64, at least 2: the first and the last row)\n"
            "  --seed S            seed of the inputs, lists and sampled rows (default 2026)\n"
            "  --gemm-tflops X     bf16 GEMM rate that the %% GEMM column divides by (default\n"
            "                      %.0f; measure it: bench/peers.py prints it)\n"
            "  --contenders C,...  run only these (default: every one below)\n"
            "  --share N           hybrid_share of the hybrid contender, 1..%d (default %d)\n"
            "  --json              one JSON object per line\n"
            "--lens, --structures and --contenders take at most %d entries each.\n"
            "shape: B=1 Hq=%d Hkv=1 D=%d, every query %d blocks of %d keys\n"
            "contenders: dense (default dense stage), qcentric-union (default tile stage on\n"
            "  each tile's union: exact only where the queries agree), kvcentric-bf16\n"
            "  (sa_kvcentric_attention, BF16 partials, wgmma part 2), kvcentric-bf16-mma (the\n"
            "  same, mma.sync part 2), hybrid (SA_KV_SCHEDULE_HYBRID: per tile the blocks that\n"
            "  --share / 128 of its queries list Q-centric with row masks, the rest KV-centric),\n"
            "  hybrid-all (the same with share 128: only blocks every query lists),\n"
            "  qcentric-masked (the same with share 1: each tile's whole union with row masks,\n"
            "  exact)\n",
            LC_MIN_LEN, LC_MAX_LEN, LC_TOPK, LC_MAX_ROUNDS, BENCH_GEMM_TFLOPS_DEFAULT, SA_TILE,
            SA_KV_HYBRID_SHARE_DEFAULT,
            LC_MAX_LIST, LC_HEADS_Q, LC_HEAD_DIM, LC_TOPK, SA_TILE);
}

/* Comma-separated values of one flag, split by cli_list (an empty entry is a usage error); each
 * entry through `one`, which exits on a bad one. */
typedef struct lc_list {
    int *out, n;
    int (*one)(const char *flag, const char *tok);
} lc_list;

static void lc_entry(const char *flag, const char *entry, void *ctx)
{
    lc_list *l = ctx;
    if (l->n == LC_MAX_LIST)
        cli_usage_error("bench longctx: %s: more than %d values", flag, LC_MAX_LIST);
    l->out[l->n++] = l->one(flag, entry);
}

static int parse_list(int argc, char **argv, int *i, int *out, int (*one)(const char *flag,
                                                                             const char *tok))
{
    const char *flag = argv[*i];
    lc_list l = {out, 0, one};
    cli_list(flag, cli_str_arg(argc, argv, i), lc_entry, &l);
    return l.n;
}

static int one_len(const char *flag, const char *t)
{
    char *end;
    errno = 0;
    long v = strtol(t, &end, 10);
    if (errno || end == t || *end || v < LC_MIN_LEN || v > LC_MAX_LEN)
        cli_usage_error("bench longctx: %s: '%s' is not a length in [%d, %d]", flag, t,
                        LC_MIN_LEN, LC_MAX_LEN);
    return (int)v;
}

static int one_struct(const char *flag, const char *t)
{
    if (!strcmp(t, "local"))
        return LC_LOCAL;
    char *end;
    long r = -1;
    if (!strncmp(t, "overlap", 7) && t[7]) {
        errno = 0;
        r = strtol(t + 7, &end, 10);
        if (errno || *end || t[7] == '-' || t[7] == '+')
            r = -1;
    }
    if (r < 0 || r > LC_TOPK)
        cli_usage_error("bench longctx: %s: '%s' is not overlapR (R in 0..%d) or local", flag, t,
                        LC_TOPK);
    return (int)r;
}

static void parse(int argc, char **argv, lc_flags *f)
{
    static const int lens[] = {16384, 32768, 65536, 131072};
    static const int structs[] = {0, 8, 14, 16, LC_LOCAL};
    memset(f, 0, sizeof *f);
    f->b.stage_id = -1;
    f->b.reps = 10;
    f->b.warmup = 2;
    f->b.gemm_tflops = BENCH_GEMM_TFLOPS_DEFAULT;
    f->b.seed = 2026;
    f->rounds = 3;
    f->samples = 64;
    f->nlens = (int)(sizeof lens / sizeof lens[0]);
    memcpy(f->lens, lens, sizeof lens);
    f->nstruct = (int)(sizeof structs / sizeof structs[0]);
    memcpy(f->structs, structs, sizeof structs);
    f->share = SA_KV_HYBRID_SHARE_DEFAULT;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            exit(0);
        } else if (bench_timing_flag(argc, argv, &i, &f->b))
            continue; /* --reps --warmup --gemm-tflops --seed --json, as the other benches */
        else if (!strcmp(a, "--rounds"))
            f->rounds = (int)cli_int_arg(argc, argv, &i, 1, LC_MAX_ROUNDS);
        else if (!strcmp(a, "--samples"))
            f->samples = (int)cli_int_arg(argc, argv, &i, 2, 100000);
        else if (!strcmp(a, "--lens"))
            f->nlens = parse_list(argc, argv, &i, f->lens, one_len);
        else if (!strcmp(a, "--structures"))
            f->nstruct = parse_list(argc, argv, &i, f->structs, one_struct);
        else if (!strcmp(a, "--contenders"))
            f->ncont = parse_list(argc, argv, &i, f->conts, one_contender);
        else if (!strcmp(a, "--share"))
            f->share = (int)cli_int_arg(argc, argv, &i, 1, SA_TILE);
        else
            cli_usage_error("bench longctx: unknown flag '%s' (sparseattn bench longctx --help)",
                            a);
    }
}

#ifdef SA_HAVE_CUDA
static void struct_name(int st, char *buf, size_t n)
{
    if (st == LC_LOCAL)
        snprintf(buf, n, "local");
    else
        snprintf(buf, n, "overlap%d", st);
}

/* ---------------------------------------------------------------- the contenders */
static int exact_dense(const lc_cell *c) { return (void)c, LC_EXACT_DENSE; }
static int exact_lists(const lc_cell *c) { return (void)c, LC_EXACT_LISTS; }
static int no_memory(const lc_cell *c, size_t *bytes) { return (void)c, *bytes = 0, SA_OK; }
static void no_done(void *state) { (void)state; }

/* dense: the registry's SA_ROLE_DEFAULT_DENSE stage on every key. */
static int dense_setup(const lc_cell *c, void **state)
{
    const sa_stage *st = sa_stage_with(SA_ROLE_DEFAULT_DENSE);
    int rc = st ? st->check(&c->a) : SA_ERR_UNKNOWN;
    *state = (void *)st;
    return rc;
}
static int dense_run(const lc_cell *c, void *state)
{
    return ((const sa_stage *)state)->launch(&c->a);
}
static double dense_work(const lc_cell *c) { return c->dense_flops; }

/* qcentric-union: the default tile-list stage (cli_tile_stage) on each tile's union. */
typedef struct union_state {
    const sa_stage *st;
    sa_gpu_attn a;
    void *d_idx, *d_cnt;
} union_state;
static size_t union_rows(const lc_cell *c)
{
    return (size_t)c->s.batch * c->s.heads_kv * sa_q_tiles(&c->s);
}
static int exact_union(const lc_cell *c)
{
    return c->union_exact ? LC_EXACT_LISTS : LC_APPROX_LISTS;
}
static int union_memory(const lc_cell *c, size_t *bytes)
{
    *bytes = union_rows(c) * ((size_t)c->tile_max + 1) * sizeof(int32_t);
    return SA_OK;
}
static void union_done(void *state)
{
    union_state *u = state;
    if (u) {
        bh_free(u->d_idx);
        bh_free(u->d_cnt);
        free(u);
    }
}
static int union_setup(const lc_cell *c, void **state)
{
    union_state *u = calloc(1, sizeof *u);
    if (!u)
        return SA_ERR_NOMEM;
    const size_t rows = union_rows(c), ib = rows * (size_t)c->tile_max * 4;
    const sa_tile_lists hl = {c->h_tidx, c->h_tcnt, c->s.heads_kv, c->tile_max};
    int rc = sa_tile_lists_check(&c->s, &hl, 0);
    if (!rc)
        rc = bh_alloc(&u->d_idx, ib);
    if (!rc)
        rc = bh_upload(u->d_idx, c->h_tidx, ib);
    if (!rc)
        rc = bh_alloc(&u->d_cnt, rows * 4);
    if (!rc)
        rc = bh_upload(u->d_cnt, c->h_tcnt, rows * 4);
    if (!rc) {
        u->a = c->a;
        u->a.lists = (sa_tile_lists){u->d_idx, u->d_cnt, c->s.heads_kv, c->tile_max};
        u->st = cli_tile_stage(&u->a);
        rc = u->st ? SA_OK : SA_ERR_UNSUPPORTED;
    }
    if (rc) {
        union_done(u);
        return rc;
    }
    *state = u;
    return SA_OK;
}
static int union_run(const lc_cell *c, void *state)
{
    union_state *u = state;
    return (void)c, u->st->launch(&u->a);
}
static double union_work(const lc_cell *c) { return c->union_flops; }

/* kvcentric-bf16: sa_kvcentric_attention, BF16 partials, validation off, workspace once. */
static void kv_params(const lc_cell *c, sa_kv_params *p)
{
    sa_kv_params_default(p);
    p->shape = c->s;
    p->q = c->a.q, p->k = c->a.k, p->v = c->a.v;
    p->o = c->a.o;
    p->lse = c->a.lse;
    p->lists = c->lists;
    p->partial_format = SA_KV_PARTIAL_BF16;
    p->validate = 0;
    p->stream = c->stream;
}
static int kv_memory(const lc_cell *c, size_t *bytes)
{
    sa_kv_params p;
    kv_params(c, &p);
    return sa_kv_workspace_size(&p, bytes);
}
static void kv_done(void *state)
{
    if (state)
        bh_free(((sa_kv_params *)state)->workspace);
    free(state);
}
/* A KV-centric contender's state: the parameters `params` sets and a workspace allocated once. */
static int kv_setup_with(const lc_cell *c, void **state,
                         void (*params)(const lc_cell *, sa_kv_params *))
{
    sa_kv_params *p = calloc(1, sizeof *p);
    if (!p)
        return SA_ERR_NOMEM;
    params(c, p);
    int rc = sa_kv_workspace_size(p, &p->workspace_bytes);
    if (!rc)
        rc = bh_alloc(&p->workspace, p->workspace_bytes);
    if (rc) {
        kv_done(p);
        return rc;
    }
    *state = p;
    return SA_OK;
}
static int kv_setup(const lc_cell *c, void **state) { return kv_setup_with(c, state, kv_params); }
static int kv_run(const lc_cell *c, void *state)
{
    return (void)c, sa_kvcentric_attention(state);
}
/* hybrid: sa_kvcentric_attention with SA_KV_SCHEDULE_HYBRID (per tile the blocks all its queries
 * list run Q-centric, the rest KV-centric; planned on the GPU, exact). */
static void hybrid_params(const lc_cell *c, sa_kv_params *p)
{
    kv_params(c, p);
    p->schedule = SA_KV_SCHEDULE_HYBRID;
    p->hybrid_share = c->hybrid_share;
}
static int hybrid_memory(const lc_cell *c, size_t *bytes)
{
    sa_kv_params p;
    hybrid_params(c, &p);
    return sa_kv_workspace_size(&p, bytes);
}
static int hybrid_setup(const lc_cell *c, void **state)
{
    return kv_setup_with(c, state, hybrid_params);
}
/* hybrid-all: share 128, only the blocks every query of a tile lists (no row masks). */
static void hybrid_all_params(const lc_cell *c, sa_kv_params *p)
{
    hybrid_params(c, p);
    p->hybrid_share = SA_TILE;
}
static int hybrid_all_setup(const lc_cell *c, void **state)
{
    return kv_setup_with(c, state, hybrid_all_params);
}
/* qcentric-masked: share 1, each tile's whole union Q-centric with row masks: the exact
 * Q-centric schedule (nothing is left to the KV-centric part). */
static void masked_params(const lc_cell *c, sa_kv_params *p)
{
    hybrid_params(c, p);
    p->hybrid_share = 1;
}
static int masked_setup(const lc_cell *c, void **state)
{
    return kv_setup_with(c, state, masked_params);
}

/* kvcentric-bf16-mma: the same with the earlier mma.sync part-2 kernel (sa_kv_params.attend). */
static void kv_mma_params(const lc_cell *c, sa_kv_params *p)
{
    kv_params(c, p);
    p->attend = SA_KV_ATTEND_MMA_SYNC;
}
static int kv_mma_setup(const lc_cell *c, void **state)
{
    return kv_setup_with(c, state, kv_mma_params);
}

#endif

/* Both builds hold the table, so that parse() judges --contenders alike in both (a usage error
 * comes before "built without CUDA"); without CUDA a row keeps only its name. */
#ifdef SA_HAVE_CUDA
#define LC_CONTENDER(n, ...) {n, __VA_ARGS__}
#else
#define LC_CONTENDER(n, ...) {.name = n}
#endif
static const lc_contender contenders[] = {
    /* name, exact, workspace, setup, run, done, work */
    LC_CONTENDER("dense", exact_dense, no_memory, dense_setup, dense_run, no_done, dense_work),
    LC_CONTENDER("qcentric-union", exact_union, union_memory, union_setup, union_run, union_done,
                 union_work),
    LC_CONTENDER("kvcentric-bf16", exact_lists, kv_memory, kv_setup, kv_run, kv_done, NULL),
    LC_CONTENDER("kvcentric-bf16-mma", exact_lists, kv_memory, kv_mma_setup, kv_run, kv_done,
                 NULL),
    LC_CONTENDER("hybrid", exact_lists, hybrid_memory, hybrid_setup, kv_run, kv_done, NULL),
    LC_CONTENDER("hybrid-all", exact_lists, hybrid_memory, hybrid_all_setup, kv_run, kv_done,
                 NULL),
    LC_CONTENDER("qcentric-masked", exact_lists, hybrid_memory, masked_setup, kv_run, kv_done,
                 NULL),
    /* ---- MORE CONTENDERS HERE, one LC_CONTENDER each:
     * write their functions beside the ones above, inside SA_HAVE_CUDA (or in a file of their
     * own, declared in bench_longctx.h and added to tools/meson.build); the lc_cell has
     * everything a run needs.
     * The speed-up column divides by the first LC_EXACT_DENSE contender that ran; usage() names
     * the contenders. ---- */
};
#define NCONT (int)(sizeof contenders / sizeof contenders[0])

static int one_contender(const char *flag, const char *t)
{
    char names[256] = "";
    for (int i = 0; i < NCONT; i++) {
        if (!strcmp(contenders[i].name, t))
            return i;
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "",
                 contenders[i].name);
    }
    cli_usage_error("bench longctx: %s: no contender '%s' (contenders: %s)", flag, t, names);
}

#ifndef SA_HAVE_CUDA
int bench_longctx(int argc, char **argv)
{
    lc_flags f;
    parse(argc, argv, &f);
    return bench_not_built("longctx");
}
#else

/* ---------------------------------------------------------------- the sweep */

static void print_memory(const lc_flags *f, const sa_shape *s, size_t list_bytes,
                         const bench_env *e)
{
    const size_t qb = sa_q_elems(s) * 2, kb = sa_kv_elems(s) * 2, lb = sa_lse_elems(s) * 4;
    if (f->b.json)
        printf("{\"bench\":\"longctx\",\"kind\":\"memory\",\"Sq\":%d,\"Skv\":%d,\"q_bytes\":%zu,"
               "\"k_bytes\":%zu,\"v_bytes\":%zu,\"o_bytes\":%zu,\"lse_bytes\":%zu,"
               "\"list_bytes\":%zu,\"mem_total\":%zu,\"mem_free_at_start\":%zu}\n",
               s->len_q, s->len_kv, qb, kb, kb, qb, lb, list_bytes, e->dev.mem_total,
               e->dev.mem_free);
    else
        printf("\nS %d: Q %.1f MiB, K %.1f MiB, V %.1f MiB, O %.1f MiB, LSE %.1f MiB, per-query "
               "lists %.1f MiB (%.2f GiB in all; each contender's own memory is its 'extra MiB')"
               "\n",
               s->len_q, qb / 1048576.0, kb / 1048576.0, kb / 1048576.0, qb / 1048576.0,
               lb / 1048576.0, list_bytes / 1048576.0,
               (2.0 * qb + 2.0 * kb + lb + list_bytes) / 1073741824.0);
    fflush(stdout);
}

/* Q, K, V as the reference needs them: all of K and V, the sampled rows of Q. */
static int download_rows(const bh_set *set, lc_rows *r)
{
    const sa_shape *s = &set->a.shape;
    const size_t d = (size_t)s->head_dim, nkv = sa_kv_elems(s);
    uint16_t *tmp = malloc(nkv * 2);
    int rc = tmp ? SA_OK : SA_ERR_NOMEM;
    if (!rc && !(rc = bh_download(tmp, set->a.k, nkv * 2)))
        sa_bf16_to_f32_array(r->k, tmp, nkv);
    if (!rc && !(rc = bh_download(tmp, set->a.v, nkv * 2)))
        sa_bf16_to_f32_array(r->v, tmp, nkv);
    for (int i = 0; !rc && i < r->n; i++) {
        const size_t row = ((size_t)r->b[i] * s->heads_q + r->h[i]) * s->len_q + r->q[i];
        if (!(rc = bh_download(tmp, set->a.q + row * d, d * 2)))
            sa_bf16_to_f32_array(r->qv + i * d, tmp, d);
    }
    free(tmp);
    return rc;
}

/* One length: inputs, the sampled rows and their dense reference, then every structure. */
static int run_len(const lc_flags *f, bench_env *e, int len, int *cell, int cells, double t0)
{
    const sa_shape s = {1, LC_HEADS_Q, 1, len, len, LC_HEAD_DIM};
    const size_t rows = sa_query_rows(&s), tiles = (size_t)s.batch * s.heads_kv * sa_q_tiles(&s);
    const size_t list_bytes = rows * (LC_TOPK + 1) * sizeof(int32_t);
    print_memory(f, &s, list_bytes, e);
    bh_set set;
    memset(&set, 0, sizeof set);
    lc_rows r;
    memset(&r, 0, sizeof r);
    int32_t *qidx = malloc(rows * LC_TOPK * sizeof *qidx), *qcnt = malloc(rows * sizeof *qcnt);
    int32_t *tcnt = malloc(tiles * sizeof *tcnt), *tidx = NULL;
    void *d_idx = NULL, *d_cnt = NULL;
    int rc = qidx && qcnt && tcnt ? SA_OK : SA_ERR_NOMEM, failed = 0;
    if (!rc)
        rc = lc_rows_init(&r, &s, f->samples, f->b.seed ^ 0x5a5a5a5aull);
    const int host_oom = rc != SA_OK;
    int have_set = !rc && !(rc = bh_set_create(e->g, &s, f->b.seed + (uint64_t)len, &set));
    if (!rc)
        rc = bh_alloc(&d_idx, rows * LC_TOPK * sizeof *qidx);
    if (!rc)
        rc = bh_alloc(&d_cnt, rows * sizeof *qcnt);
    if (!rc)
        rc = download_rows(&set, &r);
    if (rc) {
        const char *why = host_oom ? "out of host memory" : bench_why(rc);
        if (f->b.json) {
            printf("{\"bench\":\"longctx\",\"kind\":\"length\",\"Sq\":%d,\"status\":\"skipped\","
                   "\"reason\":",
                   len);
            cli_json_str(why);
            printf("}\n");
        } else {
            printf("S %d skipped: inputs: %s\n", len, why);
        }
        *cell += f->nstruct;
    } else {
        if (!f->b.json)
            printf("checking: %d sampled (head, query) rows, first and last query included, "
                   "against an exact CPU reference in double\n",
                   r.n);
        lc_ref_rows(&s, &r, NULL, 0, r.dense_o, r.dense_lse);
        for (size_t i = 0; i < rows; i++)
            qcnt[i] = LC_TOPK;
    }
    for (int si = 0; !rc && si < f->nstruct; si++) {
        char name[32];
        struct_name(f->structs[si], name, sizeof name);
        fprintf(stderr, "bench longctx: cell %d of %d: S %d, %s (%.0f s so far)\n", ++*cell,
                cells, len, name, cli_now() - t0);
        lc_cell c = {.s = s, .structure = name, .g = e->g, .stream = bh_stream(e->g),
                     .a = set.a, .lists = {d_idx, d_cnt, LC_TOPK}, .h_qidx = qidx};
        c.a.validate = 0;
        c.a.stream = c.stream;
        /* From the seed, the length and the structure: a subset of --lens or --structures, in any
         * order, draws the same lists. */
        const uint64_t lseed =
            f->b.seed * 1000003u + (uint64_t)len * 31u + (uint64_t)(f->structs[si] - LC_LOCAL);
        const sa_query_lists hl = {qidx, qcnt, LC_TOPK};
        int r2 = lc_make_lists(&s, f->structs[si], lseed, qidx);
        if (!r2)
            r2 = sa_query_lists_check(&s, &hl, 0);
        if (!r2)
            r2 = bh_upload(d_idx, qidx, rows * LC_TOPK * sizeof *qidx);
        if (!r2)
            r2 = bh_upload(d_cnt, qcnt, rows * sizeof *qcnt);
        if (!r2)
            r2 = lc_tile_union(&s, qidx, LC_TOPK, NULL, NULL, &c.tile_max, NULL, NULL);
        free(tidx);
        tidx = r2 ? NULL : malloc(tiles * (size_t)c.tile_max * sizeof *tidx);
        if (!r2 && !tidx)
            r2 = SA_ERR_NOMEM;
        if (!r2)
            r2 = lc_tile_union(&s, qidx, LC_TOPK, tidx, tcnt, &c.tile_max, &c.mean_union,
                               &c.union_exact);
        if (r2) {
            fprintf(stderr, "sparseattn: bench longctx: S %d, %s: lists: %s\n", len, name,
                    bench_why(r2));
            failed = 1;
            continue;
        }
        c.h_tidx = tidx;
        c.h_tcnt = tcnt;
        c.useful_flops = lc_query_flops(&s, qidx, LC_TOPK);
        c.union_flops = lc_tile_flops(&s, tidx, tcnt, c.tile_max);
        c.dense_flops = bench_dense_flops(&s);
        if (!f->b.json)
            printf("S %d, %s: %d blocks of %d per query, useful %.3g TFLOP; per-tile union %.1f "
                   "blocks on average (largest %d)%s\n",
                   len, name, LC_TOPK, sa_kv_blocks(&s), c.useful_flops / 1e12, c.mean_union,
                   c.tile_max, c.union_exact ? ", equal to every query's list" : "");
        const lc_run_opts o = {f->b.reps, f->b.warmup, f->rounds, f->b.json, f->samples,
                               f->b.gemm_tflops};
        c.hybrid_share = f->share;
        lc_contender chosen[NCONT];
        int nchosen = 0;
        for (int i = 0; i < (f->ncont ? f->ncont : NCONT); i++)
            chosen[nchosen++] = contenders[f->ncont ? f->conts[i] : i];
        failed |= lc_run_cell(&o, e->g, chosen, nchosen, &c, &r);
    }
    free(qidx), free(qcnt), free(tidx), free(tcnt);
    lc_rows_free(&r);
    bh_free(d_idx);
    bh_free(d_cnt);
    if (have_set)
        bh_set_destroy(&set);
    return failed;
}

int bench_longctx(int argc, char **argv)
{
    lc_flags f;
    parse(argc, argv, &f);
    if (!sa_gpu_available()) {
        fprintf(stderr, "sparseattn: bench longctx: no usable CUDA device (sm_90 needed)\n");
        return 1;
    }
    bench_env e;
    if (bench_open("longctx", &f.b, &e))
        return 1;
    const sa_stage *dense = sa_stage_with(SA_ROLE_DEFAULT_DENSE), *tile = cli_tile_stage(NULL);
    if (f.b.json) {
        printf("{\"bench\":\"longctx\",\"kind\":\"config\",\"rounds\":%d,\"samples\":%d,"
               "\"dense_stage_id\":%d,\"tile_stage_id\":%d,\"lens\":[",
               f.rounds, f.samples, dense ? dense->id : -1, tile ? tile->id : -1);
        for (int i = 0; i < f.nlens; i++)
            printf("%s%d", i ? "," : "", f.lens[i]);
        printf("],\"structures\":[");
        for (int i = 0; i < f.nstruct; i++) {
            char name[32];
            struct_name(f.structs[i], name, sizeof name);
            printf("%s\"%s\"", i ? "," : "", name);
        }
        printf("]}\n");
    } else {
        printf("rounds: %d interleaved rounds of %d timed runs per contender (the warm-up before "
               "the first, at least one untimed run before each), median of the rounds' medians\n",
               f.rounds, f.b.reps);
        printf("shape: B=1 Hq=%d Hkv=1 D=%d, len_q = len_kv = S, %d blocks of %d keys per query; "
               "dense: stage %d (%s); qcentric-union: stage %d (%s) unless it rejects a cell\n",
               LC_HEADS_Q, LC_HEAD_DIM, LC_TOPK, SA_TILE, dense ? dense->id : -1,
               dense ? dense->name : "none", tile ? tile->id : -1, tile ? tile->name : "none");
    }
    fflush(stdout);
    int failed = 0, cell = 0;
    const double t0 = cli_now();
    for (int li = 0; li < f.nlens; li++)
        failed |= run_len(&f, &e, f.lens[li], &cell, f.nlens * f.nstruct, t0);
    bh_close(e.g);
    return failed;
}
#endif
