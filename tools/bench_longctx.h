/* "sparseattn bench longctx" (issue 17, point 3): schedules for per-query block lists at long
 * context. Shared by its three files:
 *   bench_longctx.c       flags, the contender table, the sweep over lengths and structures;
 *   bench_longctx_run.c   one cell: every contender set up, checked, timed, printed;
 *   bench_longctx_host.c  the list structures, the per-tile union, the work counts and an exact
 *                         per-row CPU reference in double (no GPU needed).
 * A contender is one row of the table in bench_longctx.c: {name, what its output must equal,
 * workspace, setup, run, done, work}. docs/benchmarks.md ("bench longctx") describes the bench. */
#ifndef SA_BENCH_LONGCTX_H
#define SA_BENCH_LONGCTX_H

#include <stddef.h>
#include <stdint.h>

#include "sparseattn.h"

#define LC_TOPK 16       /* blocks of SA_TILE keys per query */
#define LC_LOCAL (-1)    /* structure code of "local"; 0..LC_TOPK is "overlap r" */
#define LC_LOCAL_JITTER 2 /* local: a query's window start moves by -2..+2 blocks */

/* ---------------------------------------------------------------- host half */

/* Per-query lists (B, Hkv, Sq, LC_TOPK) of one structure, each row sorted, distinct, in
 * [0, kv_blocks). structure r in 0..LC_TOPK: "overlap r"; LC_LOCAL: "local" (the definitions are
 * at lc_make_lists in bench_longctx_host.c and in docs/benchmarks.md). Needs kv_blocks >=
 * LC_TOPK. SA_OK, SA_ERR_ARG or SA_ERR_NOMEM. */
int lc_make_lists(const sa_shape *s, int structure, uint64_t seed, int32_t *idx);

/* Per (b, hkv, q tile) the union of its queries' lists, sorted: tile lists with list_heads =
 * heads_kv. Pass tidx NULL to size: *max_count gets the largest union. With tidx, rows have
 * stride max_count (the value the sizing call returned; entries past a row's count are 0).
 * *mean the mean union size; *exact 1 when every query's list equals its tile's union (then
 * attention on the union is each query's attention over its own list). */
int lc_tile_union(const sa_shape *s, const int32_t *qidx, int k, int32_t *tidx, int32_t *tcnt,
                  int *max_count, double *mean, int *exact);

/* FLOPs of QK^T and PV over the pairs each computes: 4 * D * sum over (b, hq, query) of its keys
 * (a partial last block counts its real length), as bench_kvcentric.c and bench_sparse.c count.
 * Per-query lists (the useful FLOPs), and tile lists (each query of a tile does its union). */
double lc_query_flops(const sa_shape *s, const int32_t *qidx, int k);
double lc_tile_flops(const sa_shape *s, const int32_t *tidx, const int32_t *tcnt, int stride);

/* Sampled output rows and what the reference needs on the host: the sampled rows of Q and all of
 * K and V, as float (exact copies of the BF16 inputs). Row 0 is (b 0, head 0, query 0), row 1 the
 * last (b, head, query); the rest drawn from the seed. */
typedef struct lc_rows {
    int n;
    int *b, *h, *q;     /* n each */
    float *qv;          /* n x D */
    float *k, *v;       /* B x Hkv x Skv x D */
    double *dense_o;    /* n x D, attention over every key */
    double *dense_lse;  /* n */
} lc_rows;
/* Allocates the row tables and draws the rows (qv, k, v allocated, filled by the caller). */
int lc_rows_init(lc_rows *r, const sa_shape *s, int n, uint64_t seed);
void lc_rows_free(lc_rows *r);
/* Exact attention of sampled row i over keys of the listed blocks (nblk < 0: every key), in
 * double: o (D) and lse (natural log). 1/sqrt(D) scale, no mask. */
void lc_ref_row(const sa_shape *s, const lc_rows *r, int i, const int32_t *blocks, int nblk,
                double *o, double *lse);
/* lc_ref_row for every row: dense (qidx NULL) or over each row's own list in qidx. OpenMP. */
void lc_ref_rows(const sa_shape *s, const lc_rows *r, const int32_t *qidx, int k, double *o,
                 double *lse);

/* A GPU result on the sampled rows against a reference, with the tolerances of bench/shapes.h,
 * the GPU tests' (tests/common): rel L2 <= SA_BENCH_REL_L2_TOL (1e-2), max abs <=
 * SA_BENCH_MAX_ABS_TOL * max |ref| + SA_BENCH_MAX_ABS_FLOOR (3e-2, 1e-3), everything finite; LSE
 * within SA_BENCH_LSE_TOL (1e-2) absolute. */
typedef struct lc_err {
    double rel_l2, max_abs, ref_max, lse_max_abs;
    size_t nonfinite;
    int pass;
} lc_err;
lc_err lc_compare(const lc_rows *r, int head_dim, const uint16_t *o, const float *lse,
                  const double *ref_o, const double *ref_lse);

/* ---------------------------------------------------------------- contenders */

/* What a contender's output must equal on a cell. */
enum {
    LC_EXACT_DENSE = 0,  /* attention over every key: checked against the dense reference */
    LC_EXACT_LISTS = 1,  /* each query over its own list: checked against that reference */
    LC_APPROX_LISTS = 2, /* not exact on this cell: its error against each query's own list is
                            printed, with no pass or fail */
};

struct bh_gpu; /* the GPU bench harness (tools/bench_harness.h) */

/* One (S, structure) cell, as every contender sees it. Device pointers in `a` and `lists`. */
typedef struct lc_cell {
    sa_shape s;
    const char *structure; /* "overlap8", "local" */
    struct bh_gpu *g;
    void *stream;          /* cudaStream_t every run goes to */
    sa_gpu_attn a;         /* q, k, v, o, lse, stream; lists empty, validate 0 */
    sa_query_lists lists;  /* the per-query lists on the device, counts included */
    const int32_t *h_qidx; /* the same on the host: (B, Hkv, Sq, LC_TOPK) */
    const int32_t *h_tidx, *h_tcnt; /* per-tile unions on the host (stride tile_max) */
    int tile_max;
    double mean_union;
    int union_exact;       /* every query's list equals its tile's union */
    double useful_flops, union_flops, dense_flops;
    int hybrid_share;      /* sa_kv_params.hybrid_share of the "hybrid" contender (--share) */
} lc_cell;

typedef struct lc_contender {
    const char *name;
    int (*exact)(const lc_cell *c); /* LC_EXACT_DENSE, LC_EXACT_LISTS or LC_APPROX_LISTS */
    /* Device bytes it allocates beyond the cell's inputs (workspace, partials, its own lists). */
    int (*workspace)(const lc_cell *c, size_t *bytes);
    /* Allocates (once per cell) and prepares; an error skips the contender with its reason. */
    int (*setup)(const lc_cell *c, void **state);
    /* Queues one run on c->stream writing c->a.o and c->a.lse; never synchronizes. */
    int (*run)(const lc_cell *c, void *state);
    void (*done)(void *state);
    double (*work)(const lc_cell *c); /* FLOPs it computes; NULL: the useful FLOPs */
} lc_contender;

/* ---------------------------------------------------------------- one cell, bench_longctx_run.c */
#define LC_MAX_ROUNDS 64
typedef struct lc_run_opts {
    int reps;    /* timed runs per round */
    int warmup;  /* untimed runs before the first round */
    int rounds;  /* 1 .. LC_MAX_ROUNDS */
    int json;
    int samples; /* rows of r, printed */
    double gemm_tflops; /* the bf16 GEMM rate the % GEMM column divides by */
} lc_run_opts;
/* Every contender of ct[0 .. n) on cell c: sets all up (a failure skips that one), runs each once
 * on poisoned outputs and compares the sampled rows r against the dense reference (r->dense_o)
 * or each row's own list (LC_EXACT_DENSE or not), then times them in interleaved rounds
 * (bh_time of its run, one round = every contender once), prints one line or JSON object each and
 * frees them. The speed-up divides by the first LC_EXACT_DENSE contender that ran. Returns 1 when
 * one failed (a run error, unwritten outputs, or an exact one outside the tolerance). CUDA only. */
int lc_run_cell(const lc_run_opts *o, struct bh_gpu *g, const lc_contender *ct, int n,
                const lc_cell *c, const lc_rows *r);

#endif
