/* "sparseattn bench selectors", shared by its two files:
 *   bench_selectors.c        flags, part 1 (the selectors alone), part 2 (tile selector -> stage
 *                            pipelines) and the loop over workloads both pipeline parts share;
 *   bench_selectors_query.c  part 3: per-query selector -> KV-centric attention pipelines.
 * docs/benchmarks.md ("bench selectors") describes the bench. Only built with CUDA. */
#ifndef SA_BENCH_SELECTORS_H
#define SA_BENCH_SELECTORS_H

#include "bench_gpu.h"
#include "shapes.h" /* bench/shapes.h: the sparse shape, shared with bench/peers.py */

#define BENCH_K SA_BENCH_SPARSE_K /* blocks per list row */

#ifdef SA_HAVE_CUDA

/* Index vectors of every set for the nvfp4/iN rows: (B, heads, len, D) each. */
typedef struct index_sets {
    int heads; /* 0: none */
    uint16_t *q[BENCH_MAX_SETS], *k[BENCH_MAX_SETS];
} index_sets;

/* Whether --selectors / --workloads `list` (comma-separated names; NULL: everything) wants
 * `name` (a selector or workload) or its row `row` (a full row name such as "nvfp4_query/i1").
 * An entry equal to `name` wants every row of it; one equal to `row` that row; with row NULL,
 * an entry "name/..." also counts (some row of `name` is wanted). */
int bs_wanted(const char *list, const char *name, const char *row);

/* Part 3 over one shape: per-set device lists, one KV-centric workspace, a verdict; its rows are
 * the per-query GPU selectors that `selectors` (--selectors, NULL: all) wants. */
typedef struct bs_query bs_query;
int bs_query_open(const sa_shape *s, const bh_set *sets, int nsets, const char *selectors,
                  bs_query **q);
/* Part 3's table header (nothing with --json). */
void bs_query_header(const bench_flags *f, const bs_query *q);
/* Part 3 on the workload now in the sets (and its index vectors in ix): every wanted per-query
 * GPU selector (and its /iN row) then sa_kvcentric_attention with each schedule, against the
 * attention alone on the same lists. Prints its table (or JSON lines). */
int bs_query_run(bench_env *e, const bench_flags *f, bs_query *q, const char *workload,
                 bh_set *sets, int nsets, const index_sets *ix);
void bs_query_close(bs_query *q);
#endif
#endif
